// The capstone: chapter 7's mixture-of-experts GPT trained on every axis at once
// (dp, tp with sequence parallelism, pp, cp, ep, ZeRO) by the chapters' own modules;
// this file is its step, in the order it runs (the map of capstone/: composed_model.h;
// the lesson: docs/capstone.md; the flags: --help). It trains chapter 7's model, so its
// summaries and checkpoints say chapter 7: a checkpoint of chapter 0 or 7 resumes here
// on any mesh, and the capstone's there, wherever the model is the same.
//
//   mpirun -np 16 build/capstone --dp 2 --tp 2 --cp 2 --ep 2 --experts 4 --top-k 2
#include <stdlib.h>
#include <string.h>

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
    trace_compute(t0, "block %d recompute", m->cfg.first_layer + l);
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
    trace_compute(t0, "block %d backward", m->cfg.first_layer + l);
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
        trace_compute(t0, "block %d forward", m->cfg.first_layer + l);
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

// ---------------------------------------------------------------- the schedule's three actions
// A rank's chunks (composed_pipe.h) are its pipeline stages' layers, each an ExpertModel
// that model_forward and model_backward run on as they are; without --pp one chunk, the
// whole model. The sends and receives are chapter 5's (05_pipeline/pipeline.h): a send
// non-blocking from a buffer of its own, a receive taking every message its peer sent
// before the one needed, each into the slot where it belongs. Where a message goes: an
// activation into the slot of (mb, chunk c), taken now if it came before its F; a
// gradient into the slot its F took.
static float* slot_buffer(void* ctx, int grad, int mb, int c) {
    ExpertPipe* P = ctx;
    ExpertModel* m = &P->chunk[c];
    ExpertSlot* sl = grad ? slot_pool_find(&m->pool, mb) : expert_pipe_slot(m, mb);
    return grad ? sl->acts.dres : sl->acts.encoded;
}

// F: the chunk's input (embedded, or the stage before's output), model_forward, then
// the loss (the last virtual stage) or the output on. Microbatch -1 is validation's or
// --sample's, outside the step's lists: its input comes by a blocking receive, its
// routing is not counted.
static float forward(ExpertPipe* P, int mb, int c, const int* inputs, const int* targets) {
    ExpertModel* m = &P->chunk[c];
    ExpertSlot* sl = expert_pipe_slot(m, mb);
    if (!m->embeds && mb >= 0) pipe_receive(&P->link, 0, mb, c, slot_buffer, P);
    if (!m->embeds && mb < 0) comm_recv(P->link.pp, sl->acts.encoded, act_floats(P), pipe_prev(&P->link));
    m->slot = sl;  // the model works on the slot
    m->moe.record = mb >= 0;
    m->moe.token0 = mb >= 0 ? (size_t)mb * (P->B / P->M) * P->T : 0;  // the routing signature's token numbers
    m->moe.aux = 0.0, m->moe.dropped = 0;  // this forward's (the clocks run over the step)
    float loss = model_forward(m, inputs, targets);
    m->moe.record = 1;
    if (mb >= 0) expert_pipe_tally(P, m);  // its routing statistics of my MoE layers
    const GPTConfig* g = &m->cfg.gpt;
    if (!m->has_head)
        pipe_send(&P->link, gpt_acts_block_output(&sl->acts, g, g->num_layers - 1, P->b, P->Tr), pipe_next(&P->link));
    else if (mb >= 0)
        P->loss_sum += loss;
    return loss;
}

// B: the output's gradient (from the head or the stage after), model_backward, d input
// back to the stage before. zb: the weight gradients wait in the slot's queue for W.
static void backward(ExpertPipe* P, int mb, int c) {
    ExpertModel* m = &P->chunk[c];
    ExpertSlot* sl = slot_pool_find(&m->pool, mb);
    if (!m->has_head) pipe_receive(&P->link, 1, mb, c, slot_buffer, P);
    m->slot = sl;
    model_backward(m);
    if (!m->embeds) pipe_send(&P->link, sl->acts.dres, pipe_prev(&P->link));
    if (!m->split) slot_pool_give(&m->pool, mb);
}

// W (--schedule zb): the queued weight gradients (composed_wgrad.c), no communication;
// then the slot is free. (Chapter 5's W reads the stash of plain GPT blocks, which MoE
// layers split over ep and attention split over tp and cp are not.)
static void weights(ExpertPipe* P, int mb, int c) {
    ExpertSlot* sl = slot_pool_find(&P->chunk[c].pool, mb);
    wgrad_queue_run(&sl->wq);
    slot_pool_give(&P->chunk[c].pool, mb);
}

// One step's forwards and backwards: this stage's list (chapter 5's schedule, built and
// checked by every rank) in order. Every ep rank of a stage runs the same list, so the
// MoE exchanges meet in order.
static void run_schedule(ExpertPipe* P) {
    for (int c = 0; c < P->v; c++) {
        ExpertModel* m = &P->chunk[c];
        moe_step_begin(&m->moe);  // chapter 7's: the exchanges' clocks from here (validation's dropped)
        // gradients accumulate from zero (--zero 2, 3: one microbatch, zeroed as backward opens a unit)
        for (ZeroBuffer* z = m->z; m->zero < 2 && z < m->z + m->nz; z++) mem_zero(z->grads, z->n * sizeof(float));
    }
    expert_pipe_stats_begin(P);  // the step's loss and routing statistics from zero
    pipe_link_begin(&P->link);
    for (int i = 0; i < P->sched.n[P->stage]; i++) {
        Action a = P->sched.list[P->stage][i];
        size_t t0 = (size_t)a.mb * P->b * P->T;  // the microbatch's tokens
        if (a.type == ACT_F) forward(P, a.mb, a.chunk, P->inputs + t0, P->targets + t0);
        else if (a.type == ACT_B) backward(P, a.mb, a.chunk);
        else weights(P, a.mb, a.chunk);
    }
    pipe_sends_wait(&P->link);
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
    for (int c = 0; c < P->v; c++) reduce_chunk(&P->chunk[c]);
}

// The global norm: each gradient once, summed over ep, dp x cp x tp and the
// stages (the first copy's, or with --zero every rank's shard; the last
// stage's tied wte left out). AdamW steps each buffer whole, or (--zero)
// my shard (chapter 3's fsdp_step, which all-gathers the shards to every
// copy but with --zero 3).
static float clip_and_step(ExpertPipe* P, const TrainArgs* args, int step) {
    double* mine = train_sumsq_begin();  // on the device, read once by train_global_norm
    for (int c = 0; c < P->v; c++) {
        ExpertModel* m = &P->chunk[c];
        for (ZeroBuffer* z = m->z; z < m->z + m->nz; z++)  // the experts, the replicated buffer, the tp slices
            if (m->zero || z->g->rank == 0) zero_buffer_sumsq(mine, z);
    }
    const Comm* groups[] = {P->chunk[0].epc, P->chunk[0].dpcp, P->link.pp};
    double norm = train_global_norm(mine, groups, P->pp > 1 ? 3 : 2);  // pp = 1: no call the summary would count
    float scale = grad_clip_scale(norm, args->clip);
    AdamWConfig ac = train_adamw(args);
    double t0 = trace_start();
    for (int c = 0; c < P->v; c++)
        for (ZeroBuffer* z = P->chunk[c].z; z < P->chunk[c].z + P->chunk[c].nz; z++)
            if (z->zero) fsdp_step(&z->f, ac, step + 1, scale);  // --zero: chapter 3's (1, 2: then all-gathered)
            else adamw_update(z->params, z->dshard, z->m, z->v, z->S, ac, step + 1, scale);
    trace_compute(t0, "optimizer");
    return (float)norm;
}

// ---------------------------------------------------------------- validation and --sample

// One microbatch forward through the stages (F of microbatch -1); the loss from the
// last stage to its pipeline.
static float forward_only(void* ctx, const int* inputs, const int* targets) {
    ExpertPipe* P = ctx;
    float loss = 0.0f;
    for (int c = 0; c < P->v; c++) {
        loss = forward(P, -1, c, inputs, targets);
        slot_pool_give(&P->chunk[c].pool, -1);
    }
    pipe_sends_wait(&P->link);
    double l = loss;
    MPI_CHECK(MPI_Bcast(&l, 1, MPI_DOUBLE, P->pp - 1, P->link.pp->mpi));
    return (float)l;
}

// The step's layout (expert_pipe_load); the mean over dp x cp x ep x tp.
static float val_loss(void* ctx, const TrainSetup* setup, int n_batches) {
    ExpertPipe* P = ctx;
    return train_val_loss_pieces(setup, n_batches, forward_only, P, P->share * P->b, P->M, P->B / P->M, P->b,
                                 &P->chunk[0].batch);
}

// --sample: every rank runs each forward, share 0's first sequence holding the window
// (as chapter 7's next_logits); on the last stage the cp rank holding position t-1 tells
// its cp group, then the row goes over pp to world rank 0, which samples.
static void next_logits(void* ctx, const int* window, int t, float* row) {
    ExpertPipe* P = ctx;
    int Vp = P->cfg.gpt.padded_vocab_size;
    size_t BT = (size_t)P->b * P->T;
    int* tokens = xcalloc(2 * BT, sizeof(int));  // inputs, then targets (unused: zeros)
    if (P->share == 0) memcpy(tokens, window, (size_t)t * sizeof(int));
    forward_only(P, tokens, tokens + BT);
    const ExpertModel* m = &P->chunk[P->v - 1];
    const CPShard* sh = &m->cp.sh;
    size_t r = 0;
    int owner = cp_shard_owner(sh, t - 1, &r);  // chapter 6's layout (ring.h)
    if (P->stage == P->pp - 1) {
        HeadActs h = gpt_acts_head(&m->slot->acts, &m->cfg.gpt, P->b, P->Tr);  // the slot it ran on
        if (sh->rank == owner) mem_to_host(row, h.logits + r * Vp, (size_t)Vp * sizeof(float));
        if (sh->cp > 1) MPI_CHECK(MPI_Bcast(row, Vp, MPI_FLOAT, owner, m->cp.cpc->mpi));
    }
    MPI_CHECK(MPI_Bcast(row, Vp, MPI_FLOAT, P->pp - 1, P->link.pp->mpi));
    free(tokens);
}

// ---------------------------------------------------------------- main

// One loop for every mesh. Without --pp (and --microbatches) a rank has one chunk, the
// whole model, and the schedule is one F and one B; with --pp a rank's chunks are its
// stages' layers and the schedule (chapter 5's) interleaves the microbatches' F and B.
int main(int argc, char** argv) {
    ExpertFlags fl;  // --experts, --top-k, ..., --ep-overlap (composed_model.c)
    Run run;
    if (!expert_run_start(&run, &fl, argc, argv)) return 0;
    const TrainArgs* args = &run.args;
    MoeConfig cfg = expert_config(&run, &fl);  // the flags or --model FILE's, checked against the mesh
    ExpertPipe* P = xcalloc(1, sizeof(ExpertPipe));  // my chunks (each an ExpertModel), the schedule, the links
    Ckpt ck;  // --ckpt-dir, --resume: this rank's slices, from whatever mesh saved them
    expert_pipe_create(P, &run, &fl, &cfg, &ck);
    const Comm* batch = &P->chunk[0].batch;  // dp x cp x ep x tp: the ranks of one stage that share the batch
    TrainLoop loop;
    train_loop_begin(&loop, &run, &(TrainLoopSpec){
        .chapter = 7, .num_params = P->total, .flops_per_token = moe_flops_per_token(&cfg, run.setup.T),
        .rows = P->per_rank, .val_loss = val_loss, .ctx = P, .ckpt = &ck});
    for (int step = loop.start; step < loop.steps; step++) {
        expert_pipe_load(P, &run.setup.train, step);  // my share of the batch, in m microbatches
        // the schedule's F and B of each (microbatch, chunk): model_forward (per MoE layer route,
        // plan, dispatch, experts, combine), model_backward (the two exchanges of each, reversed)
        run_schedule(P);
        reduce_gradients(P);  // the replicated parameters, the experts, the tp slices: three groups
        float norm = clip_and_step(P, args, step);
        // the record's aux_loss, dropped, expert_tokens; the language-model loss of
        // the global batch (a host scalar: plain MPI), dp x cp x ep x tp: equal token counts
        float loss = (float)train_mean(batch, expert_pipe_record(P, &loop, step));
        train_loop_step(&loop, step, loss, norm);
    }
    JsonBuf summary = {0};
    expert_pipe_report(P, &fl, &loop, &summary);  // the traffic, a2a_hidden_share
    train_loop_end(&loop, &summary);  // the final validation and the summary
    json_free(&summary);
    train_sample_with(args, &P->cfg.gpt, P->T, next_logits, P);  // --sample: every rank runs each forward
    expert_pipe_finish(P, args);  // --save, and everything freed
    run_finish(&run);
    return 0;
}
