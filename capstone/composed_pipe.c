// composed_pipe.c: the step around main.c's actions F, B, W on a rank's
// chunks: their slots, tokens and statistics, the gradients accumulated over
// the microbatches; the set-up and the end (composed_pipe.h).
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

// As chapter 5's slot_get: the one taken, else a free one, else a new one,
// so the slots made are the peak in flight.
ExpertSlot* expert_pipe_slot(ExpertPipe* P, XpChunk* ch, int mb) {
    ExpertSlot* sl = slot_pool_take(&ch->pool, mb);
    if (sl) return sl;
    sl = expert_slot_create(&ch->m, ch->pool.n ? ch->pool.s[0] : NULL);
    slot_pool_add(&ch->pool, sl, mb);
    int total = 0;
    for (int c = 0; c < P->v; c++) total += P->chunk[c].pool.n;
    if (total > P->peak_slots) P->peak_slots = total;
    return sl;
}

// ---------------------------------------------------------------- the step's statistics and gradients

void expert_pipe_stats_begin(ExpertPipe* P) {
    P->loss_sum = P->aux = 0.0, P->dropped = 0;
    memset(P->routed, 0, (size_t)moe_num_moe_layers(&P->cfg) * P->cfg.experts * sizeof(long));
}

void expert_pipe_tally(ExpertPipe* P, const XpChunk* ch) {
    P->aux += ch->m.moe.aux, P->dropped += ch->m.moe.dropped;
    int E = P->cfg.experts;
    for (int i = 0; i < ch->n_moe * E; i++) P->routed[(size_t)ch->moe0 * E + i] += ch->m.moe.routed[i];
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
// chapter 7's moe_step_record; the summary's a2a_hidden_share sums them.
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

void expert_pipe_create(ExpertPipe* P, Run* run, ExpertFlags* fl, const MoeConfig* cfg, Ckpt* ck) {
    memset(P, 0, sizeof(*P));
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
    // the whole model's drops, over the stages; the exchanges' clocks of
    // every chunk of mine (a2a_hidden_share is rank 0's, as in chapter 7)
    MoeParallel mine = m0->moe;
    mine.dropped_total = P->dropped_total;
    for (int c = 1; c < P->v; c++) {
        mine.a2a_blocked_timed += P->chunk[c].m.moe.a2a_blocked_timed;
        mine.a2a_inflight_timed += P->chunk[c].m.moe.a2a_inflight_timed;
    }
    // chapter 7's summary fields: the MoE's shape, dropped_total, a2a_hidden_share, and the
    // traffic as the mean over every rank (each stage sends its own layers' exchanges)
    moe_model_report(&P->cfg, &fl->moe, m0->zero, &mine, m0->world, loop, summary);
    json_add_string(summary, "schedule", P->sched_name);
    json_add_int(summary, "microbatches", P->M);
    json_add_int(summary, "virtual", P->v);
    // every rank's layers, slots and early receives, as chapter 5's summary (trace_check.py --pipeline reads them)
    pipe_summary_ranks(P->v * (P->cfg.gpt.num_layers / P->S), P->peak_slots, &P->link, summary);
}

void expert_pipe_finish(ExpertPipe* P, const TrainArgs* args) {
    if (args->save) expert_stage_file(P, args->save, 1);
    expert_stage_free(P);
    free(P);
}
