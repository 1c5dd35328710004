// composed_pipe.c: the step around main.c's actions F, B, W on a rank's
// chunks: their slots, tokens and statistics, the gradients accumulated over
// the microbatches; the summary's fields (composed_pipe.h).
#include "composed_pipe.h"

#include <string.h>

#include "errors.h"
#include "run.h"
#include "train_eval.h"
#include "train_loop.h"
#include "report.h"

// ---------------------------------------------------------------- slots

// As chapter 5's slot_get: the one taken, else a free one, else a new one.
// A slot is made only when every one of the chunk's is busy and never freed
// until the end, so a chunk's slots made are its peak in flight
// (expert_pipe_report sums them).
ExpertSlot* expert_pipe_slot(ExpertModel* m, int mb) {
    ExpertSlot* sl = slot_pool_take(&m->pool, mb);
    if (sl) return sl;
    sl = expert_slot_create(m, m->pool.n ? m->pool.s[0] : NULL);
    slot_pool_add(&m->pool, sl, mb);
    return sl;
}

// ---------------------------------------------------------------- the step's statistics and gradients

void expert_pipe_stats_begin(ExpertPipe* P) {
    P->loss_sum = P->aux = 0.0, P->dropped = 0;
    memset(P->routed, 0, (size_t)moe_num_moe_layers(&P->cfg) * P->cfg.experts * sizeof(long));
}

// Chapter 7's MoeParallel holds one forward's statistics (routed: written,
// not added, by each MoE layer), so each forward's are added here.
void expert_pipe_tally(ExpertPipe* P, const ExpertModel* m) {
    P->aux += m->moe.aux, P->dropped += m->moe.dropped;
    int E = P->cfg.experts;
    for (int i = 0; i < moe_num_moe_layers(&m->cfg) * E; i++) P->routed[(size_t)m->moe0 * E + i] += m->moe.routed[i];
}

// Each microbatch's backward gave the gradient of its own mean; the step's
// objective is their mean: x 1/m. Then the tied wte's halves summed
// between the first and the last stage (chapter 5's embedding group).
void expert_pipe_accumulated(ExpertPipe* P) {
    for (int c = 0; c < P->v && P->M > 1; c++)  // each buffer (--zero 1 too: the gradients are whole)
        for (ZeroBuffer* z = P->chunk[c].z; z < P->chunk[c].z + P->chunk[c].nz; z++)
            ops_scale(z->grads, z->n, 1.0f / (float)P->M);
    // the first stage's chunk 0 holds the lookup's half, the last's last chunk the head's
    ExpertModel* end = &P->chunk[P->stage == 0 ? 0 : P->v - 1];
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
        moe_step_record(&P->chunk[c].moe, loop, step, NULL);
        routing += moe_step_routing(&P->chunk[c].moe);
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

// ---------------------------------------------------------------- the summary

void expert_pipe_report(ExpertPipe* P, const ExpertFlags* fl, const TrainLoop* loop, JsonBuf* summary) {
    ExpertModel* m0 = &P->chunk[0];
    // the whole model's drops, over the stages; the exchanges' clocks of
    // every chunk of mine (a2a_hidden_share is rank 0's, as in chapter 7)
    MoeParallel mine = m0->moe;
    mine.dropped_total = P->dropped_total;
    for (int c = 1; c < P->v; c++) {
        mine.a2a_blocked_timed += P->chunk[c].moe.a2a_blocked_timed;
        mine.a2a_inflight_timed += P->chunk[c].moe.a2a_inflight_timed;
    }
    // chapter 7's summary fields: the MoE's shape, dropped_total, a2a_hidden_share, and the
    // traffic as the mean over every rank (each stage sends its own layers' exchanges)
    moe_model_report(&P->cfg, &fl->moe, m0->zero, &mine, m0->world, loop, summary);
    json_add_string(summary, "schedule", P->sched_name);
    json_add_int(summary, "microbatches", P->M);
    json_add_int(summary, "virtual", P->v);
    // every rank's layers, slots and early receives, as chapter 5's summary (trace_check.py --pipeline reads them)
    // each chunk's slots made (its pool's peak in flight: made only when all were busy, never freed), summed:
    // the slots allocated, above the rank's peak in flight when its chunks peak at different times (--virtual > 1)
    int slots = 0;
    for (int c = 0; c < P->v; c++) slots += P->chunk[c].pool.n;
    pipe_summary_ranks(P->v * (P->cfg.gpt.num_layers / P->S), slots, &P->link, summary);
}
