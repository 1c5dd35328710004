// The capstone: chapter 7's mixture-of-experts GPT trained on every axis at once
// (dp, tp with sequence parallelism, pp, cp, ep, ZeRO) by the chapters' own modules;
// this file is its step, in the order it runs (the map of capstone/: composed_model.h;
// the lesson: docs/capstone.md; the flags: --help). It trains chapter 7's model, so its
// summaries and checkpoints say chapter 7: a checkpoint of chapter 0 or 7 resumes here
// on any mesh, and the capstone's there, wherever the model is the same.
//
//   mpirun -np 16 build/capstone --dp 2 --tp 2 --cp 2 --ep 2 --experts 4 --top-k 2
#include <stdlib.h>

#include "memory.h"
#include "errors.h"
#include "exercise.h"  // exercise_not_done, in a homework tree
#include "trace.h"

#include "composed_pipe.h"  // composed_model.h (run.h, train_loop.h), the chunks, the schedule
#include "train_step.h"

// ---------------------------------------------------------------- one block

// A layer: the attention half, the composition's (composed_attention.c: with --cp over
// the cp group, with --tp split by heads), then its MLP: in an MoE layer chapter 7's
// MoE layer (route, count, dispatch, experts, combine over ep, in --ep-overlap chunks),
// in a dense layer (--moe-every > 1) the GPT's (with --tp, chapter 6's). a: where the
// activations go (the kept ones, or the transient when --recompute full runs the layer again).
static void layer_forward(ExpertModel* m, int l, BlockActs* a, const float* x) {
    BlockParams p = expert_block_params(m, l);  // with --tp, my slices of the split matrices
    expert_attention_forward(m, l, &p, a, x);
    if (moe_is_moe_layer(&m->cfg, l))  // --zero 3: the layer's experts are its gathered unit
        moe_layer_forward(&m->moe, moe_model_layer(&m->moe, m->slot->layers, l), l, a->ln2, expert_router(m, l),
                          zero_buffer_params(&m->z[ZERO_EXPERTS], moe_layer_index(&m->cfg, l)), a->fcproj);
    else
        expert_mlp_forward(m, &p, a);
    residual_forward(a->res3, a->res2, a->fcproj, (size_t)m->N * m->cfg.gpt.channels);
}

// --recompute, as chapter 7's (07_expert/main.c) and model.h's dense blocks: selective
// remakes gelu(fch) (an MoE layer's of its experts' rows) and repeats no exchange; full
// runs the whole layer again, its all-to-alls (and --cp's, --tp's exchanges) too.
// Returns the activations backward reads.
static BlockActs layer_recompute(ExpertModel* m, int l, const float* x) {
    const MoeConfig* c = &m->cfg;
    BlockActs a = expert_block_acts(m, l);
    if (m->recompute == RECOMPUTE_NONE) return a;
    double t0 = trace_start();  // the same span as model.c's dense blocks (docs/tracing.md)
    if (m->recompute == RECOMPUTE_SELECTIVE && moe_is_moe_layer(c, l)) {
        moe_layer_recompute(&m->moe, moe_model_layer(&m->moe, m->slot->layers, l));
    } else if (m->recompute == RECOMPUTE_SELECTIVE) {
        gelu_forward(a.fch_gelu, a.fch, (size_t)m->N * 4 * c->gpt.channels);
    } else {
        // everything into the transient (its res3 too: the kept one stays);
        // the step's statistics were counted by the first forward
        a = block_acts_at(m->slot->acts.transient, m->B, m->T, c->gpt.channels, c->gpt.num_heads);
        int record = m->moe.record;
        m->moe.record = 0;
        layer_forward(m, l, &a, x);
        m->moe.record = record;
    }
    trace_compute(t0, "block %d recompute", l);
    return a;
}

// m->slot->acts.dres: d res3 on entry, d x on return: the MLP's backward (an MoE
// layer's two exchanges reversed, in the same --ep-overlap chunks), then the attention half's.
static void layer_backward(ExpertModel* m, int l, const float* x) {
    double t0 = trace_start();
    BlockActs a = layer_recompute(m, l, x);
    BlockParams p = expert_block_params(m, l), g = expert_block_grads(m, l);
    BlockScratch s = gpt_acts_scratch(&m->slot->acts, &m->cfg.gpt);
    int mi = moe_layer_index(&m->cfg, l);
    if (moe_is_moe_layer(&m->cfg, l))
        moe_layer_backward(&m->moe, moe_model_layer(&m->moe, m->slot->layers, l), l, m->slot->acts.dres, a.ln2,
                           expert_router(m, l), expert_router_grad(m, l), zero_buffer_params(&m->z[ZERO_EXPERTS], mi),
                           zero_buffer_grads(&m->z[ZERO_EXPERTS], mi), m->dln2);
    else
        expert_mlp_backward(m, l, &p, &g, &a, &s);  // d ln2 into m->dln2
    expert_attention_backward(m, l, &p, &g, &a, &s, x, m->dln2, m->slot->acts.dres);
    trace_compute(t0, "block %d backward", l);
}

// ---------------------------------------------------------------- the whole model

// The embedding and the head work token by token on this rank's own
// sequences (composed_model.c); the MoE layers meet the other ep ranks.
static float model_forward(ExpertModel* m, const int* inputs, const int* targets) {
    const GPTConfig* g = &m->cfg.gpt;
    expert_units_gather(m, -1);  // --zero 3: each unit all-gathered over its buffer's group just before it runs
    expert_embed_forward(m, inputs, targets);
    for (int l = 0; l < g->num_layers; l++) {
        expert_units_gather(m, l);  // layer l's: its block's piece, its experts, its tp slices
        BlockActs a = expert_block_acts(m, l);
        double t0 = trace_start();
        layer_forward(m, l, &a, gpt_acts_block_input(&m->slot->acts, g, l, m->B, m->T));
        trace_compute(t0, "block %d forward", l);
    }
    expert_units_gather(m, g->num_layers);  // [lnfw lnfb] and wte
    return expert_head_forward(m);
}

static void model_backward(ExpertModel* m) {
    const GPTConfig* g = &m->cfg.gpt;
    expert_units_open(m, g->num_layers);  // --zero 2, 3: the units' gradients zeroed (3: the units gathered),
    expert_head_backward(m);  // m->slot->acts.dres: d loss / d the last layer's output
    expert_units_reduce(m, g->num_layers);  // reduce-scattered as soon as made (wte's open until the embedding's)
    for (int l = g->num_layers - 1; l >= 0; l--) {
        expert_units_open(m, l);
        layer_backward(m, l, gpt_acts_block_input(&m->slot->acts, g, l, m->B, m->T));
        expert_units_reduce(m, l);
    }
    expert_embed_backward(m);
    expert_units_reduce(m, -1);  // [wte wpe]
}

// ---------------------------------------------------------------- the three gradient groups

// Every rank's gradient is of ITS tokens' mean loss. The replicated
// parameters saw every token: the mean over dp x cp x ep x tp. An expert saw
// its ep group's tokens routed to it (summed by backward), its copies on the
// dp, cp, tp ranks the others: the sum over dp x cp x tp. A tp slice saw its
// tp group's tokens: the sum over dp x cp x ep. Sums scale by 1/(dp cp ep tp).
static void reduce_chunk(ExpertModel* m) {
    for (ZeroBuffer* z = m->z; m->zero && z < m->z + m->nz; z++) {  // --zero 1: each rank receives its shard only
        if (m->zero == 1) comm_reduce_scatter(z->g, z->grads, z->dshard, z->S, COMM_SUM);  // 2, 3: in backward, the mean
        ops_scale(z->dshard, z->S, (m->zero > 1 ? (float)z->g->size : 1.0f) / (float)m->batch.size);
    }
    if (m->zero) return;
    // COPY OF CHAPTER 7 EXERCISE 4: chapter 7's two gradient groups: stubbed in every tree that stubs that exercise
    comm_allreduce(&m->batch, m->dshared, m->n_shared, COMM_AVG);
    comm_allreduce(m->dpcp, m->dexperts, m->n_experts, COMM_SUM);
    ops_scale(m->dexperts, m->n_experts, 1.0f / (float)m->batch.size);
    // END COPY OF CHAPTER 7 EXERCISE 4
    if (m->tp.tp > 1) {  // --tp: the slices, the third group
        comm_allreduce(m->tp.dpcpep, m->tp.dw, m->tp.n, COMM_SUM);
        ops_scale(m->tp.dw, m->tp.n, 1.0f / (float)m->batch.size);
    }
}

// The step's gradients: accumulated over the microbatches, then each chunk
// (a pipeline stage's layers; the whole model without --pp) over its groups.
static void reduce_gradients(ExpertPipe* P) {
    expert_pipe_accumulated(P);  // x 1/m over the microbatches; --pp: the tied wte's halves summed
    for (int c = 0; c < P->v; c++) reduce_chunk(&P->chunk[c].m);
}

// The global norm: each gradient once, summed over ep, dp x cp x tp and the
// stages (the first copy's, or with --zero every rank's shard; the last
// stage's tied wte left out). AdamW steps each buffer whole, or (--zero)
// my shard (chapter 3's fsdp_step, which all-gathers the shards to every
// copy but with --zero 3).
static float clip_and_step(ExpertPipe* P, const TrainArgs* args, int step) {
    double* mine = train_sumsq_begin();  // on the device, read once by train_global_norm
    for (int c = 0; c < P->v; c++) {
        ExpertModel* m = &P->chunk[c].m;
        for (ZeroBuffer* z = m->z; z < m->z + m->nz; z++)  // the experts, the replicated buffer, the tp slices
            if (m->zero || z->g->rank == 0) zero_buffer_sumsq(mine, z);
    }
    const Comm* groups[] = {P->chunk[0].m.epc, P->chunk[0].m.dpcp, P->link.pp};
    double norm = train_global_norm(mine, groups, P->pp > 1 ? 3 : 2);  // pp = 1: no call the summary would count
    float scale = grad_clip_scale(norm, args->clip);
    AdamWConfig ac = train_adamw(args);
    double t0 = trace_start();
    for (int c = 0; c < P->v; c++)
        for (ZeroBuffer* z = P->chunk[c].m.z; z < P->chunk[c].m.z + P->chunk[c].m.nz; z++)
            if (z->zero) fsdp_step(&z->f, ac, step + 1, scale);  // --zero: chapter 3's (1, 2: then all-gathered)
            else adamw_update(z->params, z->dshard, z->m, z->v, z->S, ac, step + 1, scale);
    trace_compute(t0, "optimizer");
    return (float)norm;
}

// ---------------------------------------------------------------- main

// One loop for every mesh. Without --pp (and --microbatches) a rank has one
// chunk, the whole model, and the schedule is one F and one B; with --pp a
// rank's chunks are its stages' layers and the schedule (chapter 5's)
// interleaves the microbatches' F and B, composed_pipe.c sending the
// activations and their gradients between the stages.
int main(int argc, char** argv) {
    ExpertFlags fl;  // --experts, --top-k, ..., --ep-overlap (composed_model.c)
    Run run;
    if (!expert_run_start(&run, &fl, argc, argv)) return 0;
    const TrainArgs* args = &run.args;
    MoeConfig cfg = expert_config(&run, &fl);  // the flags or --model FILE's, checked against the mesh
    static ExpertPipe P;  // my chunks (each an ExpertModel: my experts, the replicated rest), the schedule
    Ckpt ck;  // --ckpt-dir, --resume: this rank's slices, from whatever mesh saved them
    expert_pipe_create(&P, &run, &fl, &cfg, model_forward, model_backward, &ck);
    const Comm* batch = &P.chunk[0].m.batch;  // dp x cp x ep x tp: the ranks of one stage that share the batch
    TrainLoop loop;
    train_loop_begin(&loop, &run, &(TrainLoopSpec){
        .chapter = 7, .num_params = P.total, .flops_per_token = moe_flops_per_token(&cfg, run.setup.T),
        .rows = P.per_rank, .val_loss = expert_pipe_val_loss, .ctx = &P, .ckpt = &ck});
    for (int step = loop.start; step < loop.steps; step++) {
        expert_pipe_load(&P, &run.setup.train, step);  // my share of the batch, in m microbatches
        // the schedule's F and B of each (microbatch, chunk): model_forward (per MoE layer route,
        // plan, dispatch, experts, combine), model_backward (the two exchanges of each, reversed)
        expert_pipe_run(&P);
        reduce_gradients(&P);  // the replicated parameters, the experts, the tp slices: three groups
        float norm = clip_and_step(&P, args, step);
        // the record's aux_loss, dropped, expert_tokens; the language-model loss of
        // the global batch (a host scalar: plain MPI), dp x cp x ep x tp: equal token counts
        float loss = (float)train_mean(batch, expert_pipe_record(&P, &loop, step));
        train_loop_step(&loop, step, loss, norm);
    }
    JsonBuf summary = {0};
    expert_pipe_report(&P, &fl, &loop, &summary);  // the traffic, a2a_hidden_share
    train_loop_end(&loop, &summary);  // the final validation and the summary
    json_free(&summary);
    expert_pipe_finish(&P, args);  // --sample (every rank runs each forward), --save
    run_finish(&run);
    return 0;
}
