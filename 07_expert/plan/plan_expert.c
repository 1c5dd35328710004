// plan_expert.c: chapter 7's planner (plan.h): mixture of experts over dp x
// cp x ep, every dp x ep rank its own B / (dp ep) sequences (T/cp positions
// of each on a cp rank), E / ep experts of each MoE layer, the replicated
// parameters reduced over dp x cp x ep and the experts over dp x cp
// (07_expert/expert_model.c's and expert_cp.c's buffers, 07_expert/main.c's
// step; with --cp, chapter 6's ring or Ulysses traffic in every layer; with
// --tp, expert_tp.c's sequence-parallel attention: B / (dp ep tp) sequences
// a rank, 1/tp of qkvw, qkvb, attprojw reduced over dp x cp x ep).
//
// Exact: parameters, gradients, AdamW, activations and the exchange buffers
// (sized for the most rows a rank's experts can receive, R = N ep min(k,
// E/ep), whatever the routing), the all-reduces and the number of
// all-to-alls. Data-dependent: the all-to-all bytes. A rank's dispatch sends
// its N k token-slots (all of them when dropless, at most that under
// --capacity-factor) and its combine sends back the rows its experts
// received, which depends on the routing. The plan gives each rank's most
// (N k C + R C floats per exchange pair), and, dropless, the exact sum over
// the ranks: every slot is sent once by dispatch and once back by combine.
#include <stdio.h>
#include <string.h>

#include "comm_groups.h"
#include "comm_stats.h"
#include "args.h"
#include "moe.h"
#include "plan.h"

static MoeConfig moe_of(const PlanArgs* a) {
    MoeConfig c = {.gpt = a->cfg, .experts = a->experts, .top_k = a->top_k, .moe_every = a->moe_every};
    c.hidden = a->expert_hidden == ARG_NOT_GIVEN ? 4 * a->cfg.channels : a->expert_hidden;
    return c;
}

// dropless: no --capacity-factor, or one of E / k or more (expert_model.c)
static int dropless(const PlanArgs* a) { return !(a->capacity > 0) || a->capacity >= (double)a->experts / a->top_k; }

const char* plan_check_expert(const PlanArgs* a, PlanInfo* info, char* msg, size_t len) {
    int ndp = a->mesh[AXIS_DP], nep = a->mesh[AXIS_EP], ncp = a->mesh[AXIS_CP], ntp = a->mesh[AXIS_TP];
    if (a->ranks != ndp * ncp * nep * ntp) return "--ranks: chapter 7 has the dp, tp, cp and ep axes only";
    if (ntp > 1) {  // expert_config's checks
        if (a->cfg.num_heads % ntp) return "--tp: tp must divide the model's heads";
        if (a->B % (ndp * nep * ntp)) return "--batch: each tp rank takes whole sequences of its dp x ep share";
        if (a->recompute != RECOMPUTE_NONE && a->moe_every > 1)
            return "--tp: chapter 7 composes it with --recompute in MoE layers only (--moe-every 1)";
    }
    if (ncp > 1) {  // expert_config's checks
        int ring = !strcmp(a->cp_mode, "ring"), zigzag = !strcmp(a->cp_balance, "zigzag");
        if (!ring && strcmp(a->cp_mode, "ulysses"))
            return snprintf(msg, len, "--cp-mode %s is not one of ring, ulysses", a->cp_mode), msg;
        if (!zigzag && strcmp(a->cp_balance, "none"))
            return snprintf(msg, len, "--cp-balance %s is not one of none, zigzag", a->cp_balance), msg;
        if (a->T % ncp) return "--seq: the sequence must split over cp";
        if (zigzag && a->T % (2 * ncp)) return "--seq: zigzag needs a sequence divisible by 2 x cp";
        if (!ring && (a->cfg.num_heads / ntp) % ncp) return "--cp-mode ulysses: cp must divide the model's heads (a tp rank's)";
    }
    MoeConfig c = moe_of(a);
    const char* bad = moe_config_problem(&c);
    if (bad) return snprintf(msg, len, "%s", bad), msg;
    if (a->experts % nep) return "--ep: the experts must split over ep";
    if (a->capacity < 0) return "--capacity-factor must be >= 0";
    if (a->B % (ndp * nep)) return "--batch: the batch must split over dp x ep";
    long tokens = (long)(a->B / (ndp * nep * ntp)) * (a->T / ncp);
    if (a->ep_overlap < 1 || a->ep_overlap > tokens)
        return snprintf(msg, len, "--ep-overlap %d: must be between 1 and a rank's %ld tokens", a->ep_overlap, tokens), msg;
    // the all-to-all's bytes depend on the routing: each rank's a bound;
    // dropless, their sum over the ranks is exact (every slot goes out once
    // and comes back once per exchange pair)
    info->comm_bound[COLL_ALLTOALL][AXIS_EP] = 1;
    if (dropless(a)) {
        double N = (double)a->B / (ndp * nep * ntp) * (a->T / ncp), pairs = (a->recompute == RECOMPUTE_FULL ? 3 : 2) * (double)moe_num_moe_layers(&c);
        info->comm_sum[COLL_ALLTOALL][AXIS_EP] = a->steps * a->ranks * pairs * 2 * N * a->top_k * a->cfg.channels * sizeof(float);
    }
    return NULL;
}

void plan_chapter_7(const PlanArgs* a, RankPlan* p, int r) {
    MoeConfig c = moe_of(a);
    const GPTConfig* g = &a->cfg;
    int coord[NUM_AXES];
    plan_coords(a, r, coord);
    int ndp = a->mesh[AXIS_DP], nep = a->mesh[AXIS_EP], ncp = a->mesh[AXIS_CP], ntp = a->mesh[AXIS_TP];
    int B = a->B / (ndp * nep * ntp), T = a->T;  // --tp: a rank's B/tp of its share's sequences
    int C = g->channels, E = c.experts, k = c.top_k, H = c.hidden, El = E / nep, Lm = moe_num_moe_layers(&c);
    // --cp: a rank's N rows are T/cp positions of its B sequences
    double N = (double)B * (T / ncp), Nk = N * k, R = N * nep * (k < El ? k : El), f = sizeof(float);
    // --tp: the shared buffer without qkvw, qkvb, attprojw, and my slices of them
    MoeConfig ct = c;
    ct.tp = ntp;
    double shared = (double)moe_num_shared(&ct), experts = (double)Lm * El * moe_expert_numel(&c);
    double slices = ntp > 1 ? (double)g->num_layers * moe_attn_tp_numel(C, ntp) : 0.0;
    p->peak[MEM_PARAMS] = f * (shared + experts + slices);
    p->peak[MEM_GRADS] = f * (shared + experts + slices);
    p->peak[MEM_OPTIMIZER] = 2 * f * (shared + experts + slices);
    // the GPT's activations, then each MoE layer's own (one for --recompute
    // full: every layer runs again before its backward), the fch_gelu and
    // send buffers selective shares, and what every MoE layer shares
    int n = a->recompute == RECOMPUTE_FULL ? 1 : Lm;
    double gelu = a->recompute == RECOMPUTE_NONE ? Lm * R * H : R * H;
    double send = a->recompute == RECOMPUTE_NONE ? Lm * Nk * C : Nk * C;
    double moe = n * (2 * N * E + 4 * Nk + R * C + R * H + E) + gelu + 2 * R * C + 2 * R * H + Nk + N * E + N * C;
    p->peak[MEM_ACTIVATIONS] = plan_acts_bytes(g, B, T / ncp, a->recompute) + f * moe;
    p->peak[MEM_COMM] = f * (send + n * Nk * C + R * C + Nk * C);  // send, back, recv, dsend
    // --cp (expert_cp_create): the ring's per-layer lse and one pair's
    // partials, its K/V and dK/dV buffers; or Ulysses' per-layer head-shard
    // q|k|v and probabilities, its scratch and all-to-all buffers. One
    // layer's of what --recompute makes again: full the lse and q|k|v (Lf),
    // selective and full the probabilities (Lp)
    int ring = !strcmp(a->cp_mode, "ring"), L = g->num_layers, NH = g->num_heads;
    double NC = N * C, Lf = a->recompute == RECOMPUTE_FULL ? 1 : L, Lp = a->recompute == RECOMPUTE_NONE ? L : 1;
    // the attention's forward exchanges again under --recompute full
    int passes = a->recompute == RECOMPUTE_FULL ? 3 : 2;
    Comm cpg = plan_group(AXIS_CP, ncp, coord[AXIS_CP]);
    if (ncp > 1) {
        p->peak[MEM_ACTIVATIONS] += f * (ring ? Lf * N * NH + NC + 3 * N * NH
                                              : Lf * 3 * NC + Lp * N * NH * T + NC + 3 * NC + N * NH * T);
        p->peak[MEM_COMM] += f * (ring ? 10 * NC : 6 * NC);
        for (int l = 0; l < L; l++) {
            if (ring) {
                // K/V one hop per block but the last, forward (twice under
                // full) and backward; the dK/dV partial sums cp hops in backward
                for (int i = 0; i < passes * (ncp - 1) + ncp; i++) {
                    comm_tally(&cpg, COLL_RECV, 2 * (size_t)NC * sizeof(float), 0.0);
                    comm_tally(&cpg, COLL_SEND, 2 * (size_t)NC * sizeof(float), 1.0);
                }
            } else {
                for (int i = 0; i < passes; i++) {
                    comm_tally(&cpg, COLL_ALLTOALL, 3 * (size_t)NC * sizeof(float), comm_ring_factor(&cpg));
                    comm_tally(&cpg, COLL_ALLTOALL, (size_t)NC * sizeof(float), comm_ring_factor(&cpg));
                }
            }
        }
    }
    if ((ncp > 1 || ntp > 1) && a->moe_every > 1) p->peak[MEM_ACTIVATIONS] += f * 8 * NC;  // a dense layer's MLP gradients
    // --tp (expert_tp.c): the group's rows gathered and a partial sum, (N tp,
    // C) each; per layer forward an all-gather and a reduce-scatter (twice
    // under --recompute full), backward two all-gathers (d attproj, ln1
    // again) and a reduce-scatter (d ln1)
    Comm tpg = plan_group(AXIS_TP, ntp, coord[AXIS_TP]);
    if (ntp > 1) {
        size_t full = (size_t)(NC * ntp) * sizeof(float);
        p->peak[MEM_ACTIVATIONS] += f * 2 * NC * ntp;
        for (int l = 0; l < L; l++) {
            int fwd = a->recompute == RECOMPUTE_FULL ? 2 : 1;
            for (int i = 0; i < 2 + fwd; i++) comm_tally(&tpg, COLL_ALLGATHER, full, comm_ring_factor(&tpg));
            for (int i = 0; i < 1 + fwd; i++) comm_tally(&tpg, COLL_REDUCE_SCATTER, full, comm_ring_factor(&tpg));
        }
    }
    // per MoE layer dispatch and combine forward, both again in backward,
    // and once more under --recompute full: calls exact, bytes at most all
    // slots out and R rows back
    Comm ep = plan_group(AXIS_EP, nep, coord[AXIS_EP]);
    int exchanges = a->recompute == RECOMPUTE_FULL ? 3 : 2;
    // (bus bytes: what leaves the rank, none on one ep rank)
    double out = nep > 1 ? 1.0 : 0.0;
    // --ep-overlap: each exchange in chunks of the rank's tokens, cut as
    // expert_chunk_start cuts them; a chunk's rows are bounded like the whole
    int nc = a->ep_overlap;
    long ntok = (long)N;
    for (int l = 0; l < Lm * exchanges; l++)
        for (int ch = 0; ch < nc; ch++) {
            double nt = (double)((long)(ch + 1) * ntok / nc - (long)ch * ntok / nc);
            double rows = nt * nep * (k < El ? k : El);
            comm_tally_bytes(&ep, COLL_ALLTOALL, f * nt * k * C, out * f * nt * k * C);
            comm_tally_bytes(&ep, COLL_ALLTOALL, f * rows * C, out * f * rows * C);
        }
    // the two gradient groups (dp x cp x ep and dp x cp; cp in their names
    // only with --cp, as expert_model_create makes them), then the norm over
    // ep and dp x cp
    char name[32];
    Mesh mesh;
    memset(&mesh, 0, sizeof(mesh));
    for (int x = 0; x < NUM_AXES; x++) mesh.size[x] = a->mesh[x];
    unsigned with_cp = ncp > 1 ? 1u << AXIS_CP : 0u, with_tp = ntp > 1 ? 1u << AXIS_TP : 0u;
    comm_group_slot_name(&mesh, (1u << AXIS_DP) | with_cp | (1u << AXIS_EP) | with_tp, name, sizeof(name));
    Comm batch = plan_group(comm_slot_for(name), ndp * ncp * nep * ntp,
                            ((coord[AXIS_DP] * nep + coord[AXIS_EP]) * ncp + coord[AXIS_CP]) * ntp + coord[AXIS_TP]);
    comm_tally(&batch, COLL_ALLREDUCE, (size_t)shared * sizeof(float), 2.0 * comm_ring_factor(&batch));
    Comm dpcp = plan_group(AXIS_DP, ndp, coord[AXIS_DP]);
    if (ncp > 1 || ntp > 1) {
        comm_group_slot_name(&mesh, (1u << AXIS_DP) | with_cp | with_tp, name, sizeof(name));
        dpcp = plan_group(comm_slot_for(name), ndp * ncp * ntp, (coord[AXIS_DP] * ncp + coord[AXIS_CP]) * ntp + coord[AXIS_TP]);
    }
    comm_tally(&dpcp, COLL_ALLREDUCE, (size_t)experts * sizeof(float), 2.0 * comm_ring_factor(&dpcp));
    if (ntp > 1) {  // the tp slices, over the ranks that hold the same one
        comm_group_slot_name(&mesh, (1u << AXIS_DP) | with_cp | (1u << AXIS_EP), name, sizeof(name));
        Comm same = plan_group(comm_slot_for(name), ndp * ncp * nep, (coord[AXIS_DP] * nep + coord[AXIS_EP]) * ncp + coord[AXIS_CP]);
        comm_tally(&same, COLL_ALLREDUCE, (size_t)slices * sizeof(float), 2.0 * comm_ring_factor(&same));
    }
    const Comm* groups[] = {&ep, &dpcp};
    plan_norm(p, groups, 2);
    // FLOPs: this rank's tokens through the model, k experts each (what its
    // experts compute depends on the routing: this is the mean rank's)
    p->flops = N * moe_flops_per_token(&c, T);
    if (a->recompute == RECOMPUTE_FULL)  // the blocks' forward again, not the head's
        p->flops += N * (moe_flops_per_token(&c, T) / 3.0 - 2.0 * g->padded_vocab_size * C);
}
