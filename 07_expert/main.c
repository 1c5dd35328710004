// Chapter 7: mixture of experts with expert parallelism.
//
// In an MoE layer (moe.h) each token's MLP is k of E experts, chosen by a router. The
// experts are sharded over the ep ranks (E / ep each); the rest of the model is replicated
// on every rank, and every rank of the dp x ep mesh takes its own share of the global batch.
// So a token lives on one rank and its experts on others: each MoE layer moves the token
// rows to their experts and the outputs back.
//
//   mpirun -np 4 build/chapter-7 --dp 2 --ep 2 --experts 4 --top-k 2
//
// One MoE layer, forward (moe_layer_forward, 07_expert/moe_layer.c):
//   1. route      router logits -> softmax -> top-k experts and gates
//   2. count      the load-balancing loss and the capacity over the global batch; how
//                 many of my token rows go to each expert (so to each ep rank), and the
//                 counts' exchange (all-to-all of ints)
//   3. dispatch   gather my rows in destination order, all-to-all-v them
//   4. experts    the received rows, grouped by expert, through each expert
//   5. combine    all-to-all-v the outputs back, sum them weighted by the gates
// 3-5 go in chunks of the tokens (--ep-overlap), pipelined; backward runs the two
// exchanges in reverse (moe_layer_backward). Gradients go to two groups
// (reduce_gradients). Every axis at once, this layer inside: the capstone (capstone/).
#include <stdlib.h>

#include "errors.h"
#include "exercise.h"  // exercise_not_done, in a homework tree
#include "memory.h"
#include "trace.h"
#include "train_step.h"

#include "moe_model.h"  // moe.h (the model), moe_layer.h (the layer over ep), run.h, train_loop.h

// ---------------------------------------------------------------- one MoE block

// The GPT block with its MLP replaced by the MoE layer: the attention half
// as chapter 0's block computes it, then the experts. a: where the layer's
// activations go (the kept ones, or the transient when --recompute full
// runs the layer again in backward).
static void moe_block_forward(MoeModel* m, int l, BlockActs* a, const float* x) {
    const GPTConfig* g = &m->cfg.gpt;
    BlockParams p = moe_model_block(m, m->shared, l);
    moe_attention_forward(&p, a, x, m->B, m->T, g->channels, g->num_heads);  // res2, ln2 (moe.h)
    // 1-5: route, count, dispatch, experts, combine; a->fcproj holds the gated sum
    moe_layer_forward(&m->moe, moe_model_layer(&m->moe, m->layers, l), l, a->ln2,
                      moe_model_router(m, m->shared, l), moe_model_experts(m, m->experts, l), a->fcproj);
    residual_forward(a->res3, a->res2, a->fcproj, (size_t)m->N * g->channels);
}

// --recompute: what layer l's forward did not keep, again, before its
// backward (docs/recompute.md). Returns the activations backward reads.
//   selective  keeps the router's choices, the plan and every row that
//              crossed the network: no exchange is repeated. Recomputed:
//              gelu(fch) of the experts' rows (attention kept its lse).
//   full       keeps only the layer's output; the whole layer runs again,
//              the router included: the same ops on the same input choose
//              the same experts, but the dispatch and combine all-to-all-v
//              are issued again, 2 more per MoE layer per step (counted in
//              the summary's alltoall bytes), as are the plan's exchanges.
static BlockActs moe_block_recompute(MoeModel* m, int l, const float* x) {
    const GPTConfig* g = &m->cfg.gpt;
    BlockActs a = moe_model_block_acts(m, l);
    double t0 = trace_start();
    if (m->recompute == RECOMPUTE_SELECTIVE) {
        moe_layer_recompute(&m->moe, moe_model_layer(&m->moe, m->layers, l));
    } else if (m->recompute == RECOMPUTE_FULL) {
        // everything into the transient (its res3 too: the kept one stays);
        // the step's statistics were counted by the first forward
        a = block_acts_at(m->acts.transient, m->B, m->T, g->channels, g->num_heads);
        int record = m->moe.record;
        m->moe.record = 0;
        moe_block_forward(m, l, &a, x);
        m->moe.record = record;
    }
    if (m->recompute != RECOMPUTE_NONE) trace_compute(t0, "block %d recompute", l);
    return a;
}

// acts.dres: d res3 on entry (the residual passes it to both branches), d x
// on return. The exchanges of forward, reversed, in the same chunks.
static void moe_block_backward(MoeModel* m, int l, const float* x) {
    const GPTConfig* g = &m->cfg.gpt;
    double t0 = trace_start();
    BlockActs a = moe_block_recompute(m, l, x);
    BlockParams p = moe_model_block(m, m->shared, l), gp = moe_model_block(m, m->dshared, l);
    BlockScratch s = gpt_acts_scratch(&m->acts, g);
    moe_layer_backward(&m->moe, moe_model_layer(&m->moe, m->layers, l), l, m->acts.dres, a.ln2,
                       moe_model_router(m, m->shared, l), moe_model_router(m, m->dshared, l),
                       moe_model_experts(m, m->experts, l), moe_model_experts(m, m->dexperts, l), m->dln2);
    moe_attention_backward(&p, &gp, &a, &s, x, m->dln2, m->acts.dres, m->B, m->T, g->channels, g->num_heads);
    trace_compute(t0, "block %d backward", l);
}

// ---------------------------------------------------------------- the whole model

// The embedding and the head work token by token on this rank's own
// sequences; the MoE layers meet the other ep ranks. A dense layer
// (--moe-every > 1) is chapter 0's block.
static float model_forward(MoeModel* m, const int* inputs, const int* targets) {
    const GPTConfig* g = &m->cfg.gpt;
    if (m->moe.record) moe_step_begin(&m->moe);
    moe_model_embed_forward(m, inputs, targets);
    for (int l = 0; l < g->num_layers; l++) {
        if (moe_is_moe_layer(&m->cfg, l)) {
            BlockActs a = moe_model_block_acts(m, l);
            double t0 = trace_start();
            moe_block_forward(m, l, &a, gpt_acts_block_input(&m->acts, g, l, m->B, m->T));
            trace_compute(t0, "block %d forward", l);
        } else {
            BlockParams p = moe_model_block(m, m->shared, l);
            gpt_block_forward(&m->acts, g, l, &p, m->B, m->T);
        }
    }
    return moe_model_head_forward(m);
}

static void model_backward(MoeModel* m) {
    const GPTConfig* g = &m->cfg.gpt;
    ops_zero(m->dshared, m->n_shared);  // gradients accumulate: from zero each step
    ops_zero(m->dexperts, m->n_experts);
    moe_model_head_backward(m);  // acts.dres: d loss / d the last layer's output
    for (int l = g->num_layers - 1; l >= 0; l--) {
        if (moe_is_moe_layer(&m->cfg, l)) {
            moe_block_backward(m, l, gpt_acts_block_input(&m->acts, g, l, m->B, m->T));
        } else {
            BlockParams p = moe_model_block(m, m->shared, l), gp = moe_model_block(m, m->dshared, l);
            gpt_block_backward(&m->acts, g, l, &p, &gp, m->B, m->T);
        }
    }
    moe_model_embed_backward(m);
}

// ---------------------------------------------------------------- the two gradient groups

// Every rank's gradient is of ITS tokens' mean loss. The replicated
// parameters saw every token: the mean over dp x ep. An expert saw its ep
// group's tokens routed to it (summed by backward; the combine brought their
// gradients home), its copies on the other dp ranks the others: the sum
// over dp, scaled by 1 / (dp ep) for the global mean.
static void reduce_gradients(MoeModel* m) {
    // EXERCISE 4: the two gradient groups: the replicated parameters' mean over dp x ep, the experts' over dp only, scaled for the global mean
    comm_allreduce(&m->batch, m->dshared, m->n_shared, COMM_AVG);
    comm_allreduce(m->dp, m->dexperts, m->n_experts, COMM_SUM);
    ops_scale(m->dexperts, m->n_experts, 1.0f / (float)m->batch.size);
    // END EXERCISE 4
}

// The global norm: each gradient once. dp replica 0 counts its experts
// (every replica holds the same, each ep rank its own E/ep), one rank of the
// batch the replicated ones; the sum over ep, then over dp. Then AdamW
// steps both buffers on every rank.
static float clip_and_step(MoeModel* m, const TrainArgs* args, int step) {
    double* mine = train_sumsq_begin();  // on the device, read once by train_global_norm
    if (m->dp->rank == 0) grad_sumsq(mine, m->dexperts, m->n_experts);
    if (m->batch.rank == 0) grad_sumsq(mine, m->dshared, m->n_shared);
    const Comm* groups[] = {m->epc, m->dp};
    double norm = train_global_norm(mine, groups, 2);
    float scale = grad_clip_scale(norm, args->clip);
    AdamWConfig ac = train_adamw(args);
    double t0 = trace_start();
    adamw_update(m->experts, m->dexperts, m->m_e, m->v_e, m->n_experts, ac, step + 1, scale);
    adamw_update(m->shared, m->dshared, m->m_s, m->v_s, m->n_shared, ac, step + 1, scale);
    trace_compute(t0, "optimizer");
    return (float)norm;
}

static float val_loss(void* ctx, const TrainSetup* s, int n_batches) {
    return moe_model_val_loss(ctx, model_forward, s, n_batches);
}

// ---------------------------------------------------------------- main

int main(int argc, char** argv) {
    MoeFlags fl;  // --experts, --top-k, ..., --ep-overlap (moe_model.c)
    Run run;
    if (!moe_model_run_start(&run, &fl, argc, argv)) return 0;
    const TrainArgs* args = &run.args;
    MoeConfig cfg = moe_model_config(&run, &fl);  // the flags or --model FILE's, checked against the mesh
    static MoeModel m;  // my experts, the replicated rest, the MoE layers' state
    moe_model_create(&m, &cfg, &fl, &run);
    Ckpt ck;  // --ckpt-dir, --resume: this rank's slices, from whatever mesh saved them
    moe_model_ckpt_open(&ck, &m, &run);
    TrainLoop loop;
    train_loop_begin(&loop, &run, &(TrainLoopSpec){
        .chapter = 7, .num_params = moe_num_params(&m.cfg), .flops_per_token = moe_flops_per_token(&cfg, m.T),
        .rows = m.B, .val_loss = val_loss, .ctx = &m, .ckpt = &ck});
    for (int step = loop.start; step < loop.steps; step++) {
        moe_model_load(&m, &run.setup.train, step, loop.inputs, loop.targets);  // my B of the batch's sequences
        // per MoE layer: route, plan, dispatch, experts, combine; backward the two exchanges reversed
        float mine = model_forward(&m, loop.inputs, loop.targets);
        model_backward(&m);
        reduce_gradients(&m);  // the replicated parameters over dp x ep, the experts over dp
        float norm = clip_and_step(&m, args, step);
        // the language-model loss of the global batch (a host scalar: plain MPI)
        float loss = (float)train_mean(&m.batch, mine);
        moe_step_record(&m.moe, &loop, step, &loop.step_extra);  // the record's aux_loss, dropped, expert_tokens
        train_loop_step(&loop, step, loss, norm);
    }
    JsonBuf summary = {0};
    moe_model_report(&m.cfg, &fl, 0, &m.moe, m.moe.batch, &loop, &summary);  // no ZeRO here; the traffic, a2a_hidden_share
    train_loop_end(&loop, &summary);  // the final validation and the summary
    json_free(&summary);
    moe_model_finish(&m, args, model_forward);  // --sample (every rank runs each forward), --save
    moe_model_free(&m);
    run_finish(&run);
    return 0;
}
