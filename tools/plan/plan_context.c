// plan_context.c: chapter 6's planner (plan.h). Context parallelism (dp x
// cp): a whole replica per rank, T/cp tokens of each sequence, what a layer
// keeps from 06_sequence_context/context.c's own layout (cp_layer_numels),
// the ring's K/V passes or Ulysses' all-to-alls per layer, one gradient
// all-reduce over dp x cp. Sequence parallelism (--sp, dp x tp): chapter
// 4's tp shard under FSDP over dp (ZeRO-3), the block's activations in
// sequence.c's layout, the tp all-gathers and reduce-scatters of
// sequence.c. Every figure is exact.
#include <stdio.h>
#include <string.h>

#include "comm_groups.h"
#include "comm_stats.h"
#include "context.h"
#include "model_layout.h"
#include "model_tp.h"
#include "plan.h"
#include "tp.h"
#include "sequence.h"

const char* plan_check_context(const PlanArgs* a, PlanInfo* info, char* msg, size_t len) {
    (void)info;
    int ndp = a->mesh[AXIS_DP], ncp = a->mesh[AXIS_CP], ntp = a->mesh[AXIS_TP], T = a->T;
    int ring = !strcmp(a->cp_mode, "ring"), zigzag = !strcmp(a->cp_balance, "zigzag");
    if (a->ranks != ndp * ncp * ntp) return "--ranks: chapter 6 has the dp, tp and cp axes only";
    if (!ring && strcmp(a->cp_mode, "ulysses"))
        return snprintf(msg, len, "--cp-mode %s is not one of ring, ulysses", a->cp_mode), msg;
    if (!zigzag && strcmp(a->cp_balance, "none"))
        return snprintf(msg, len, "--cp-balance %s is not one of none, zigzag", a->cp_balance), msg;
    if (a->sp) return sp_mesh_problem(&a->cfg, a->B, T, ndp, ntp, ncp, msg, len);  // sp_create's check
    if (ntp > 1) return "--tp without --sp: tensor parallelism is chapter 4's";
    // the batch over dp and the sequence over cp: plan.c's
    // train_mesh_problem, then cp_create's own rules (cp_mesh_problem), in
    // the chapter's order
    return NULL;
}

// Context parallelism: context.c's cp_create and main.c's step.
static void plan_cp(const PlanArgs* a, RankPlan* p, int r) {
    const GPTConfig* g = &a->cfg;
    int coord[NUM_AXES];
    plan_coords(a, r, coord);
    int ndp = a->mesh[AXIS_DP], n = a->mesh[AXIS_CP], T = a->T, B = a->B / ndp;
    int C = g->channels, NH = g->num_heads, L = g->num_layers, ring = !strcmp(a->cp_mode, "ring");
    size_t N = (size_t)B * (T / n), NC = N * C;
    double P = (double)gpt_num_params(g), f = sizeof(float);
    p->peak[MEM_PARAMS] = f * P;
    p->peak[MEM_GRADS] = f * P;
    p->peak[MEM_OPTIMIZER] = 2 * f * P;
    size_t store, transient;
    cp_layer_numels(ring ? CP_RING : CP_ULYSSES, a->recompute, (int)N, C, NH, T, &store, &transient);
    // encoded, the layers, the transient, the head, inputs and targets,
    // dres, dln, the stash, d gelu, d atty; the ring's partials or
    // Ulysses' head-shard gradients (d output, dq|dk|dv)
    double acts = NC + (double)L * store + transient + head_acts_numel(1, (int)N, C, g->padded_vocab_size) + 2.0 * N +
                  2.0 * NC + block_stash_numel(1, (int)N, C) + 4.0 * NC + NC;
    acts += ring ? NC + 3.0 * N * NH : NC + 3.0 * NC;
    p->peak[MEM_ACTIVATIONS] = f * acts;
    p->peak[MEM_COMM] = f * (ring ? 5 * 2.0 * NC : 2 * 3.0 * NC);
    // every block's attention meets the other cp ranks: forward, backward,
    // and forward again under --recompute full
    Comm cp = plan_group(AXIS_CP, n, coord[AXIS_CP]);
    int forwards = a->recompute == RECOMPUTE_FULL ? 2 : 1;
    for (int l = 0; l < L; l++) {
        if (ring) {
            // K/V one hop per block but the last, forward and backward; the
            // dK/dV partial sums cp hops in backward (none on one rank)
            int kv = (n - 1) * (forwards + 1), dkv = n > 1 ? n : 0;
            double block = 2.0 * NC * sizeof(float);  // a K/V block (counted at once: cp hops a layer)
            comm_tally_calls(&cp, COLL_RECV, kv + dkv, block, 0.0);
            comm_tally_calls(&cp, COLL_SEND, kv + dkv, block, block);
        } else {
            // q|k|v to head shards and the output back, each forward; the
            // output's gradient to head shards and dq|dk|dv back
            for (int i = 0; i < forwards + 1; i++) {
                comm_tally(&cp, COLL_ALLTOALL, 3 * NC * sizeof(float), comm_ring_factor(&cp));
                comm_tally(&cp, COLL_ALLTOALL, NC * sizeof(float), comm_ring_factor(&cp));
            }
        }
    }
    // the gradient group: every rank with the same weights
    char name[32];
    Mesh mesh;
    memset(&mesh, 0, sizeof(mesh));
    for (int x = 0; x < NUM_AXES; x++) mesh.size[x] = a->mesh[x];
    comm_group_slot_name(&mesh, (1u << AXIS_DP) | (1u << AXIS_CP), name, sizeof(name));
    Comm dpcp = plan_group(comm_slot_for(name), ndp * n, coord[AXIS_DP] * n + coord[AXIS_CP]);
    comm_tally(&dpcp, COLL_ALLREDUCE, (size_t)P * sizeof(float), 2.0 * comm_ring_factor(&dpcp));
    plan_norm_scalars(p);  // the whole gradient on every rank: its norm needs no all-reduce
    // the FLOPs of this rank's tokens: each query against the whole
    // sequence's keys, counted over the T x T square as chapter 0 counts
    p->flops = plan_flops(g, (double)B / n, T, L, g->padded_vocab_size, 1, a->recompute);
}

// Sequence parallelism: sequence.c's sp_create (chapter 4's model, ZeRO-3
// with prefetch and two gather slots, its block activations swapped for
// sequence.c's layout) and its step.
static void plan_sp(const PlanArgs* args, RankPlan* p, int r) {
    PlanArgs a = *args;
    a.zero = 3, a.prefetch = 1, a.reshard = 1;  // sp_create(&s, &run, 3, 1, 1)
    const GPTConfig* c = &a.cfg;
    int coord[NUM_AXES];
    plan_coords(&a, r, coord);
    int ndp = a.mesh[AXIS_DP], ntp = a.mesh[AXIS_TP], L = c->num_layers, C = c->channels, NH = c->num_heads;
    int B = a.B / ndp, T = a.T, Vl = plan_vocab_rows(c, ntp, coord[AXIS_TP]);
    size_t N = (size_t)B * T, Nl = N / ntp, NC = N * C, Cl = (size_t)C / ntp;
    // what a layer keeps: its token shard and tp slices; the one transient
    // (sequence.c's sp_layout)
    size_t shard, slices, transient;
    size_t ln = 3 * Nl * C + 4 * Nl;                           // ln1 (+mean, rstd), res2, ln2 (+mean, rstd)
    size_t proj = 2 * Nl * C;                                  // attproj, fcproj
    size_t res3 = Nl * C;
    size_t kept_slices = N * 3 * Cl + N * Cl + N * (NH / ntp) + N * 4 * Cl;  // qkv, atty, lse, fch
    size_t drop_slices = N * 4 * Cl;                                       // fch_gelu
    if (a.recompute == RECOMPUTE_NONE)
        shard = ln + proj + res3, slices = kept_slices + drop_slices, transient = 0;
    else if (a.recompute == RECOMPUTE_SELECTIVE)
        shard = ln + res3, slices = kept_slices, transient = proj + drop_slices;
    else
        shard = res3, slices = 0, transient = ln + proj + kept_slices + drop_slices;
    // tp_create's activations but the blocks': the embedding's output, the
    // head's (this rank's vocabulary rows), the gathered cross-entropy
    // statistics, the scratch, dres, the token ids; then sequence.c's x0,
    // dres, dln on this rank's tokens
    double floats = NC + (double)L * (shard + slices) + transient + head_acts_numel(B, T, C, Vl) + 3.0 * N * ntp +
                    block_scratch_numel_tp(B, T, C, NH, ntp) + NC + 3.0 * Nl * C;
    p->peak[MEM_ACTIVATIONS] = floats * sizeof(float) + 2.0 * N * sizeof(int);
    p->flops = plan_flops(c, B, T, L, Vl, ntp, a.recompute);
    // the tp collectives of a step (sequence.c), each on a (N, C) tensor:
    // all-gathers of the token shards, reduce-scatters of partial sums
    Comm tp = plan_group(AXIS_TP, ntp, coord[AXIS_TP]);
    double ring = comm_ring_factor(&tp);
    size_t full = NC * sizeof(float);
    int fwd = a.recompute == RECOMPUTE_FULL ? 2 : 1;
    comm_tally(&tp, COLL_REDUCE_SCATTER, full, ring);  // the embedding's partial sums
    for (int l = 0; l < L; l++)
        for (int k = 0; k < 2; k++) {  // attention and MLP: gather before, reduce-scatter after
            comm_tally(&tp, COLL_ALLGATHER, full, ring);
            comm_tally(&tp, COLL_REDUCE_SCATTER, full, ring);
        }
    comm_tally(&tp, COLL_ALLGATHER, full, ring);                               // the final LayerNorm's output
    comm_tally(&tp, COLL_ALLGATHER, 3 * N * ntp * sizeof(float), ring);        // cross-entropy's statistics
    comm_tally(&tp, COLL_REDUCE_SCATTER, full, ring);                          // the head's d lnf
    comm_tally(&tp, COLL_ALLREDUCE, 2 * (size_t)C * sizeof(float), 2 * ring);  // [lnfw lnfb]
    for (int l = 0; l < L; l++) {
        for (int k = 0; k < 2 * (fwd - 1); k++) {  // --recompute full: the forward's again
            comm_tally(&tp, COLL_ALLGATHER, full, ring);
            comm_tally(&tp, COLL_REDUCE_SCATTER, full, ring);
        }
        for (int k = 0; k < 2; k++) {
            // the output gradient gathered; the column-parallel input
            // gathered again and its partial gradients reduce-scattered
            comm_tally(&tp, COLL_ALLGATHER, full, ring);
            comm_tally(&tp, COLL_ALLGATHER, full, ring);
            comm_tally(&tp, COLL_REDUCE_SCATTER, full, ring);
            comm_tally(&tp, COLL_ALLREDUCE, 2 * (size_t)C * sizeof(float), 2 * ring);  // a LayerNorm's [w b]
        }
    }
    comm_tally(&tp, COLL_ALLGATHER, full, ring);  // the embedding's gradient of every token
    // FSDP over dp of this tp rank's shard, as chapter 4: [wte rows, wpe],
    // each block's shard, [lnfw lnfb]
    size_t numel[2 + 4096];
    numel[0] = (size_t)Vl * C + (size_t)c->max_seq_len * C;
    for (int l = 0; l < L; l++) numel[1 + l] = gpt_block_numel_tp(C, ntp);
    numel[L + 1] = 2 * (size_t)C;
    Comm dp = plan_group(AXIS_DP, ndp, coord[AXIS_DP]);
    plan_fsdp(&a, p, &dp, numel, L + 2, 1);
    const Comm* groups[] = {&dp, &tp};
    plan_norm(p, groups, 2);
}

void plan_chapter_6(const PlanArgs* a, RankPlan* p, int r) {
    if (a->sp) plan_sp(a, p, r);
    else plan_cp(a, p, r);
}
