// composed_pipe.c: the capstone's pipeline executor: the actions F, B, W of
// (microbatch, chunk) on chapter 5's links and slot pools, in step order.
#include "composed_pipe.h"

#include <stdlib.h>
#include <string.h>

#include "errors.h"
#include "memory.h"
#include "rank.h"
#include "run.h"
#include "train_eval.h"
#include "train_loop.h"
#include "report.h"

// ---------------------------------------------------------------- slots

// The slot of (mb, chunk), as chapter 5's slot_get: the one taken, else a
// free one, else a new one, so the slots made are the peak in flight.
static ExpertSlot* chunk_slot_get(ExpertPipe* P, XpChunk* ch, int mb) {
    ExpertSlot* sl = slot_pool_take(&ch->pool, mb);
    if (sl) return sl;
    sl = expert_slot_create(&ch->m, ch->pool.n ? ch->pool.s[0] : NULL);
    slot_pool_add(&ch->pool, sl, mb);
    int total = 0;
    for (int c = 0; c < P->v; c++) total += P->chunk[c].pool.n;
    if (total > P->peak_slots) P->peak_slots = total;
    return sl;
}

// ---------------------------------------------------------------- point to point
// Chapter 5's pipe_send and pipe_receive. Where a message goes: an
// activation into the slot of (mb, chunk c), taken now if it came before its
// F; a gradient into the slot its F took.
static float* slot_buffer(void* ctx, int grad, int mb, int c) {
    ExpertPipe* P = ctx;
    XpChunk* ch = &P->chunk[c];
    ExpertSlot* sl = grad ? slot_pool_find(&ch->pool, mb) : chunk_slot_get(P, ch, mb);
    return grad ? sl->acts.dres : sl->acts.encoded;
}

// ---------------------------------------------------------------- the actions

// F: the chunk's input (embedded, or the stage before's output), the
// forward of its layers, then the loss (the last virtual stage) or the
// output on.
// Microbatch -1 is validation's or --sample's, outside the step's lists: its
// input comes by a blocking receive, its routing is not counted.
static float forward(ExpertPipe* P, int mb, int c, const int* inputs, const int* targets) {
    XpChunk* ch = &P->chunk[c];
    ExpertSlot* sl = chunk_slot_get(P, ch, mb);
    if (ch->vstage > 0 && mb >= 0) pipe_receive(&P->link, 0, mb, c, slot_buffer, P);
    if (ch->vstage > 0 && mb < 0) comm_recv(P->link.pp, sl->acts.encoded, act_floats(P), pipe_prev(&P->link));
    ch->m.slot = sl;  // the model works on the slot
    ch->m.moe.record = mb >= 0;
    ch->m.moe.token0 = mb >= 0 ? (size_t)mb * (P->B / P->M) * P->T : 0;  // the routing signature's token numbers
    ch->m.moe.aux = 0.0, ch->m.moe.dropped = 0;  // this forward's (the clocks run over the step: expert_pipe_run)
    float loss = P->forward(&ch->m, inputs, targets);
    ch->m.moe.record = 1;
    if (mb >= 0) {  // its routing statistics of my MoE layers
        P->aux += ch->m.moe.aux, P->dropped += ch->m.moe.dropped;
        int E = P->cfg.experts;
        for (int i = 0; i < ch->n_moe * E; i++) P->routed[(size_t)ch->moe0 * E + i] += ch->m.moe.routed[i];
    }
    const GPTConfig* g = &ch->m.cfg.gpt;
    if (ch->vstage < P->S - 1)
        pipe_send(&P->link, gpt_acts_block_output(&sl->acts, g, g->num_layers - 1, P->b, P->Tr), pipe_next(&P->link));
    else if (mb >= 0)
        P->loss_sum += loss;
    return loss;
}

// B: the output's gradient (from the head or the stage after), backward of
// the layers, d input back to the stage before. zb: the weight gradients
// wait in the slot's queue for W.
static void backward(ExpertPipe* P, int mb, int c) {
    XpChunk* ch = &P->chunk[c];
    ExpertSlot* sl = slot_pool_find(&ch->pool, mb);
    if (ch->vstage < P->S - 1) pipe_receive(&P->link, 1, mb, c, slot_buffer, P);
    ch->m.slot = sl;
    P->backward(&ch->m);
    if (ch->vstage > 0) pipe_send(&P->link, sl->acts.dres, pipe_prev(&P->link));
    if (!ch->m.split) slot_pool_give(&ch->pool, mb);
}

// W (zb): the queued weight gradients, no communication; then the slot is free.
static void weights(ExpertPipe* P, int mb, int c) {
    ExpertSlot* sl = slot_pool_find(&P->chunk[c].pool, mb);
    wgrad_queue_run(&sl->wq);
    slot_pool_give(&P->chunk[c].pool, mb);
}

// ---------------------------------------------------------------- the step

void expert_pipe_run(ExpertPipe* P) {
    int E = P->cfg.experts, Lm = moe_num_moe_layers(&P->cfg);
    for (int c = 0; c < P->v; c++) {
        ExpertModel* m = &P->chunk[c].m;
        moe_step_begin(&m->moe);  // chapter 7's: the exchanges' clocks from here (validation's dropped)
        // gradients accumulate from zero (--zero 2, 3: one microbatch, zeroed as backward opens a unit)
        for (ZeroBuffer* z = m->z; m->zero < 2 && z < m->z + m->nz; z++) mem_zero(z->grads, z->n * sizeof(float));
    }
    P->loss_sum = P->aux = 0.0, P->dropped = 0;
    memset(P->routed, 0, (size_t)Lm * E * sizeof(long));
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

// Each microbatch's backward gave the gradient of its own mean; the step's
// objective is their mean: x 1/m. Then the tied wte's halves summed
// between the first and the last stage (chapter 5's embedding group).
void expert_pipe_accumulated(ExpertPipe* P) {
    for (int c = 0; c < P->v && P->M > 1; c++)  // each buffer (--zero 1 too: the gradients are whole)
        for (ZeroBuffer* z = P->chunk[c].m.z; z < P->chunk[c].m.z + P->chunk[c].m.nz; z++)
            ops_scale(z->grads, z->n, 1.0f / (float)P->M);
    // the first stage's chunk 0 holds the lookup's half, the last's last chunk the head's
    ExpertModel* end = &P->chunk[P->stage == 0 ? 0 : P->v - 1].m;
    if (P->pp > 1)  // (--zero 2, 3 refused with the pipeline: dshared is the buffer's)
        pipe_sum_tied_embedding(&P->embed, P->link.pp, end->dshared + moe_wte_offset(&end->cfg),
                                param_tensor_numel(&P->cfg.gpt, P_WTE));
}

// The step's statistics, summed over pp (host values: plain MPI): each
// stage holds its own MoE layers', only the last saw the loss. At m = 1 and
// one chunk, chapter 7's record's bits. Each chunk's exchange clocks go to
// chapter 7's moe_step_record; the summary's a2a_hidden_share is chunk 0's.
double expert_pipe_record(ExpertPipe* P, TrainLoop* loop, int step) {
    int E = P->cfg.experts, Lm = moe_num_moe_layers(&P->cfg);
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &P->aux, 1, MPI_DOUBLE, MPI_SUM, P->link.pp->mpi));
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &P->dropped, 1, MPI_LONG, MPI_SUM, P->link.pp->mpi));
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, P->routed, Lm * E, MPI_LONG, MPI_SUM, P->link.pp->mpi));
    double loss = P->stage == P->pp - 1 ? P->loss_sum / P->M : 0.0;
    MPI_CHECK(MPI_Bcast(&loss, 1, MPI_DOUBLE, P->pp - 1, P->link.pp->mpi));
    uint64_t routing = 0;  // each chunk's over its batch group, then the stages' (wrapping sums)
    for (int c = 0; c < P->v; c++) {
        moe_step_record(&P->chunk[c].m.moe, loop, step, NULL);
        routing += moe_step_routing(&P->chunk[c].m.moe);
    }
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &routing, 1, MPI_UINT64_T, MPI_SUM, P->link.pp->mpi));
    JsonBuf* fields = &loop->step_extra;
    P->dropped_total += P->dropped;
    json_add_double(fields, "aux_loss", P->aux / P->M, "%.7f");  // the mean over the microbatches
    json_add_int(fields, "dropped", P->dropped);
    json_add_long_matrix(fields, "expert_tokens", P->routed, Lm, E);
    json_add_hex64(fields, "routing", routing);
    return loss;
}

// ---------------------------------------------------------------- the tokens

// Microbatch mb is the global batch's sequences [mb B/m, (mb+1) B/m), split
// over the dp x ep x tp ranks in share order (b each; a share's cp ranks
// hold the same sequences), so that an MoE layer sees the same tokens on
// every mesh (capacity and balance statistics are per microbatch): chapter 7
// on one rank with the same m is the reference.
void expert_pipe_load(ExpertPipe* P, const TokenSet* d, long step) {
    int B = P->B, T = P->T;
    for (int mb = 0; mb < P->M; mb++) {
        size_t t0 = (size_t)mb * P->b * T;
        data_batch(d, step, B, T, mb * (B / P->M) + P->share * P->b, P->b, P->inputs + t0, P->targets + t0);
    }
}

// ---------------------------------------------------------------- validation

// One microbatch forward through the stages (F of microbatch -1); the loss
// from the last stage to its pipeline.
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

// --sample: every rank runs each forward, share 0's first sequence holding
// the window (as chapter 7's next_logits); on the last stage the cp rank
// holding position t-1 tells its cp group, then the row goes over pp to
// world rank 0, which samples.
static void next_logits(void* ctx, const int* window, int t, float* row) {
    ExpertPipe* P = ctx;
    int Vp = P->cfg.gpt.padded_vocab_size;
    size_t BT = (size_t)P->b * P->T;
    int* tokens = xcalloc(2 * BT, sizeof(int));  // inputs, then targets (unused: zeros)
    if (P->share == 0) memcpy(tokens, window, (size_t)t * sizeof(int));
    forward_only(P, tokens, tokens + BT);
    // with --cp, position t-1 lives on one cp rank: it tells its cp group
    const ExpertModel* m = &P->chunk[P->v - 1].m;
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

// The step's layout (expert_pipe_load); the mean over dp x cp x ep x tp.
float expert_pipe_val_loss(void* ctx, const TrainSetup* setup, int n_batches) {
    ExpertPipe* P = ctx;
    return train_val_loss_pieces(setup, n_batches, forward_only, P, P->share * P->b, P->M, P->B / P->M, P->b,
                                 &P->chunk[0].m.batch);
}

// ---------------------------------------------------------------- set-up and the end

// The set-up's lines: chapter 7's, then one per other axis in use.
static void print_setup(const ExpertPipe* P, const Run* run) {
    const MoeConfig* c = &P->cfg;
    const ExpertModel* m = &P->chunk[0].m;
    int ndp = run->mesh.size[AXIS_DP], nep = run->mesh.size[AXIS_EP], Lc = c->gpt.num_layers / P->S;
    moe_print_setup(c, ndp, nep, m->E_local, m->moe.capacity_factor, P->total, P->per_rank, run);  // chapter 7's two lines
    if (P->S * P->M > 1)
        print0("pipeline: pp=%d, schedule %s, %d microbatch%s of %d sequence%s per rank, %d chunk%s of %d layer%s per pp "
               "rank; routing statistics and capacity per microbatch\n", P->pp, P->sched_name, P->M,
               P->M == 1 ? "" : "es", P->b, P->b == 1 ? "" : "s", P->v, P->v == 1 ? "" : "s", Lc, Lc == 1 ? "" : "s");
    if (m->tp.tp > 1)
        print0("tensor parallelism: tp=%d with sequence parallelism: each rank holds %d of its tp group's %d sequences "
               "and %d of the %d heads (1/%d of qkvw, qkvb, attprojw%s); the experts whole on every tp rank\n",
               m->tp.tp, P->per_rank, P->per_rank * m->tp.tp, c->gpt.num_heads / m->tp.tp, c->gpt.num_heads, m->tp.tp,
               c->moe_every > 1 ? ", and of a dense layer's fcw, fcb, fcprojw" : "");
    static const char* what[] = {"", "the AdamW moments", "the AdamW moments and the gradients (a unit per layer)",
                                 "the AdamW moments, the gradients and the parameters (a unit per layer)"};
    size_t moments = 0;  // every chunk's buffers' shards
    for (int k = 0; k < P->v; k++)
        for (int b = 0; b < P->chunk[k].m.nz; b++) moments += 2 * P->chunk[k].m.z[b].S;
    if (m->zero)  // --zero (zero_buffer.h)
        print0("ZeRO-%d: %s sharded over each buffer's copies: the replicated parameters over %d ranks, the experts "
               "over %d%s; %zu floats of moments a rank\n", m->zero, what[m->zero], m->z[ZERO_SHARED].g->size,
               m->z[ZERO_EXPERTS].g->size, m->nz > 2 ? ", the tp slices over the dp x cp x ep ranks" : "", moments);
    const CPShard* sh = &m->cp.sh;
    if (sh->cp > 1)
        print0("context parallelism: cp=%d, %s, balance %s: each rank holds %d of the %d positions of its %d sequences "
               "(dp=%d x cp=%d x ep=%d ranks)\n", sh->cp, cp_mode_names[m->cp.mode], sh->parts == 2 ? "zigzag" : "none",
               m->T, sh->T, P->per_rank, ndp, sh->cp, nep);
}

void expert_pipe_create(ExpertPipe* P, Run* run, ExpertFlags* fl, const MoeConfig* cfg, ExpertForward forward,
                        ExpertBackward backward, Ckpt* ck) {
    memset(P, 0, sizeof(*P));
    P->forward = forward, P->backward = backward;
    expert_stage_create(P, run, fl, cfg);
    if (run->setup.checkpoint) expert_stage_file(P, run->setup.checkpoint, 0);  // --model FILE
    print_setup(P, run);
    expert_stage_show_sharding(P, run->args.show_sharding);
    // --ckpt-dir, --resume: this rank's slices, from whatever mesh saved them
    ckpt_init(ck, &run->args, &run->setup, &run->mesh, 7);
    expert_stage_ckpt(ck, P);
    ckpt_resume(ck);
}

void expert_pipe_report(ExpertPipe* P, const ExpertFlags* fl, const TrainLoop* loop, JsonBuf* summary) {
    ExpertModel* m0 = &P->chunk[0].m;
    m0->moe.dropped_total = P->dropped_total;  // the whole model's, over the stages
    // chapter 7's summary fields: the MoE's shape, the traffic, dropped_total, a2a_hidden_share
    moe_model_report(&P->cfg, &fl->moe, m0->zero, &m0->moe, loop, summary);
    json_add_string(summary, "schedule", P->sched_name);
    json_add_int(summary, "microbatches", P->M);
    json_add_int(summary, "virtual", P->v);
    // every rank's layers, slots and early receives, as chapter 5's summary (trace_check.py --pipeline reads them)
    pipe_summary_ranks(P->v * (P->cfg.gpt.num_layers / P->S), P->peak_slots, &P->link, summary);
}

void expert_pipe_finish(ExpertPipe* P, const TrainArgs* args) {
    train_sample_with(args, &P->cfg.gpt, P->T, next_logits, P);  // --sample: every rank runs each forward
    if (args->save) expert_stage_file(P, args->save, 1);
    expert_stage_free(P);
}
