// plan_dense.c: the planners of chapters 0, 2, 3 and 4 (plan.h): one
// replica per rank, data parallel with its modes, FSDP's ZeRO stages, and
// FSDP over dp of each tp rank's shard.
#include <stdio.h>
#include <string.h>

#include "comm_stats.h"
#include "model_layout.h"
#include "model_tp.h"
#include "plan.h"

// A group of `size` ranks on one axis, as the counters see it: no MPI.
Comm plan_group(int axis, int size, int rank) {
    Comm c;
    memset(&c, 0, sizeof(c));
    c.axis = axis;
    c.size = size;
    c.rank = rank;
    return c;
}

void plan_coords(const PlanArgs* a, int r, int coord[NUM_AXES]) {
    Mesh mesh;
    memset(&mesh, 0, sizeof(mesh));
    for (int x = 0; x < NUM_AXES; x++) mesh.size[x] = a->mesh[x];
    mesh_coord_of(&mesh, r, coord);
}

double plan_flops(const GPTConfig* cfg, double B, int T, int layers, int head_rows, int split, RecomputeMode mode) {
    // per token: 2 FLOPs per weight of a matmul forward, 4 backward (the
    // input's and the weight's gradients); a block's matmuls hold 12 C^2
    // weights; causal attention's QK^T and AV: 2 x 2 T C forward per token
    // counted over the whole T x T square, as gpt_flops_per_token does
    double C = cfg->channels, tokens = B * T;
    double block_fwd = 2.0 * 12.0 * C * C / split + 2.0 * 2.0 * T * C / split;
    double head_fwd = 2.0 * (double)head_rows * C;
    double f = tokens * layers * 3.0 * block_fwd;
    if (mode == RECOMPUTE_FULL) f += tokens * layers * block_fwd;
    f += tokens * 3.0 * head_fwd;
    return f;
}

// ---------------------------------------------------------------- sizes

// ---------------------------------------------------------------- sizes

// The bytes gpt_acts_create_recompute allocates (model.c): the embedding's
// output, L blocks' stores, the recompute transient, the head, the scratch,
// the residual gradient, inputs and targets.
double plan_acts_bytes(const GPTConfig* cfg, int B, int T, RecomputeMode mode) {
    int C = cfg->channels, NH = cfg->num_heads, L = cfg->num_layers, Vp = cfg->padded_vocab_size;
    size_t BT = (size_t)B * T;
    size_t floats = BT * C + (size_t)L * block_store_numel(B, T, C, NH, mode) +
                    block_transient_numel(B, T, C, NH, mode) + head_acts_numel(B, T, C, Vp) +
                    block_scratch_numel(B, T, C, NH) + BT * C;
    return (double)(floats * sizeof(float) + 2 * BT * sizeof(int));
}

// Chapter 3's units: the embeddings [wte wpe], each block, [lnfw lnfb].
static int units(const GPTConfig* cfg, size_t* numel) {
    int L = cfg->num_layers;
    numel[0] = param_tensor_numel(cfg, P_WTE) + param_tensor_numel(cfg, P_WPE);
    for (int l = 0; l < L; l++) numel[1 + l] = gpt_block_numel(cfg->channels);
    numel[L + 1] = param_tensor_numel(cfg, P_LNFW) + param_tensor_numel(cfg, P_LNFB);
    return L + 2;
}

// ---------------------------------------------------------------- chapter 0: the reference

void plan_chapter_0(const PlanArgs* a, RankPlan* p, int r) {
    (void)r;
    double P = (double)gpt_num_params(&a->cfg);
    p->peak[MEM_PARAMS] = 4 * P;
    p->peak[MEM_GRADS] = 4 * P;
    p->peak[MEM_OPTIMIZER] = 8 * P;  // AdamW's m and v
    p->peak[MEM_ACTIVATIONS] = plan_acts_bytes(&a->cfg, a->B, a->T, a->recompute);
    p->flops = plan_flops(&a->cfg, a->B, a->T, a->cfg.num_layers, a->cfg.padded_vocab_size, 1, a->recompute);
    plan_norm_scalars(p);  // the norm of one rank: no all-reduce
}

// ---------------------------------------------------------------- chapter 2: data parallel

void plan_chapter_2(const PlanArgs* a, RankPlan* p, int r) {
    int N = a->mesh[AXIS_DP];
    size_t P = gpt_num_params(&a->cfg);
    int ps = !strcmp(a->dp_mode, "ps");
    p->peak[MEM_PARAMS] = 4.0 * P;  // a full replica
    p->peak[MEM_GRADS] = 4.0 * P;
    p->peak[MEM_OPTIMIZER] = ps && r != 0 ? 0 : 8.0 * P;  // ps: rank 0 alone steps
    p->peak[MEM_COMM] = ps && r == 0 ? 4.0 * P : 0;       // ps: the summed gradients
    if (!ps || r == 0) plan_norm_scalars(p);               // each replica's own norm (ps: rank 0's)
    p->peak[MEM_ACTIVATIONS] = plan_acts_bytes(&a->cfg, a->B / N / a->accum, a->T, a->recompute);
    p->flops = plan_flops(&a->cfg, a->B / N, a->T, a->cfg.num_layers, a->cfg.padded_vocab_size, 1, a->recompute);
    Comm dp = plan_group(AXIS_DP, N, r);
    if (!strcmp(a->dp_mode, "naive")) {
        // one all-reduce per tensor, per layer for the block tensors
        for (ParamTensor t = 0; t < NUM_PARAM_TENSORS; t++) {
            int layers = param_tensor_is_block(t) ? a->cfg.num_layers : 1;
            for (int l = 0; l < layers; l++)
                comm_tally(&dp, COLL_ALLREDUCE, param_tensor_numel(&a->cfg, t) * sizeof(float),
                           2.0 * comm_ring_factor(&dp));
        }
    } else if (ps) {
        comm_tally(&dp, COLL_REDUCE, P * sizeof(float), N > 1 ? 1.0 : 0.0);
        comm_tally(&dp, COLL_BROADCAST, P * sizeof(float), N > 1 ? 1.0 : 0.0);
    } else {
        // buckets of --bucket-kb cut from the end of the flat buffer: P /
        // bucket whole ones, counted at once (a 70B model in 1 KiB buckets
        // is 2.7e8 of them), then the rest at the start, if any
        size_t bucket = (size_t)a->bucket_kb * 1024 / sizeof(float), whole = P / bucket, rest = P % bucket;
        double bytes = (double)bucket * sizeof(float), factor = 2.0 * comm_ring_factor(&dp);
        comm_tally_calls(&dp, COLL_ALLREDUCE, (double)whole, bytes, bytes * factor);
        if (rest) comm_tally(&dp, COLL_ALLREDUCE, rest * sizeof(float), factor);
    }
}

double plan_early_buckets(const GPTConfig* cfg, int bucket_kb) {
    size_t bucket = (size_t)bucket_kb * 1024 / sizeof(float);
    return (double)((gpt_num_params(cfg) - gpt_block_offset(cfg, 0)) / bucket);
}

// ---------------------------------------------------------------- chapter 3: FSDP

// The ZeRO-3 gathers of one step: the order fsdp_unit_params and
// fsdp_prefetch are called in 03_fsdp/main.c's forward and backward, on the
// engine's slots (03_fsdp/fsdp.c: two alternating slots when resharding, one
// per unit otherwise). A unit already in a slot is not gathered again.
typedef struct {
    int n, reshard, next_slot;
    int slot_of_unit[2 + 4096], unit_in_slot[2];
    const size_t* padded;  // bytes of each unit's gather
    const Comm* dp;
} Slots;

static void slots_request(Slots* s, int i) {
    if (s->slot_of_unit[i] >= 0) return;
    if (s->reshard) {
        int k = s->next_slot;
        s->next_slot ^= 1;
        if (s->unit_in_slot[k] >= 0) s->slot_of_unit[s->unit_in_slot[k]] = -1;
        s->unit_in_slot[k] = i;
        s->slot_of_unit[i] = k;
    } else {
        s->slot_of_unit[i] = i;
    }
    comm_tally(s->dp, COLL_ALLGATHER, s->padded[i], comm_ring_factor(s->dp));
}

// head_first: chapter 4's backward asks for the tied embedding before the
// final LayerNorm; chapter 3's the other way round
static void slots_zero3_step(Slots* s, int L, int prefetch, int head_first) {
    for (int i = 0; i < s->n; i++) s->slot_of_unit[i] = -1;  // fsdp_drop_gathered
    s->unit_in_slot[0] = s->unit_in_slot[1] = -1;
    // forward: embedding, blocks (each prefetching the next), lnf, the head's wte
    slots_request(s, 0);
    if (prefetch) slots_request(s, 1);
    for (int l = 0; l < L; l++) {
        slots_request(s, 1 + l);
        if (prefetch) slots_request(s, l + 2);
    }
    slots_request(s, L + 1);
    slots_request(s, 0);
    // backward: lnf and wte for the head, then the blocks from the last
    slots_request(s, head_first ? 0 : L + 1);
    slots_request(s, head_first ? L + 1 : 0);
    for (int l = L - 1; l >= 0; l--) {
        slots_request(s, 1 + l);
        if (l > 0 && prefetch) slots_request(s, l);
    }
}

// Chapter 3's engine (03_fsdp/fsdp.c) on n units of numel[i] floats over a
// dp group: its parameter, gradient and AdamW buffers, and one step's
// gathers and reduce-scatters (not the norm's all-reduce).
void plan_fsdp(const PlanArgs* a, RankPlan* p, const Comm* dp, const size_t* numel, int n,
                      int head_first) {
    int N = dp->size;
    size_t padded[2 + 4096];
    size_t shard_total = 0, padded_total = 0, max_padded = 0;
    for (int i = 0; i < n; i++) {
        size_t shard = (numel[i] + N - 1) / N;  // fsdp.c's units_make
        padded[i] = shard * N * sizeof(float);
        shard_total += shard;
        padded_total += shard * N;
        if (shard * N > max_padded) max_padded = shard * N;
    }
    double f = sizeof(float);
    if (a->zero == 3)
        p->peak[MEM_PARAMS] = f * (shard_total + (a->reshard ? 2 * max_padded : padded_total));
    else
        p->peak[MEM_PARAMS] = f * padded_total;
    // the shard of the gradient, and where backward writes the full one:
    // ZeRO-1 a full gradient, ZeRO-2/3 one unit's buffer plus the tied
    // embedding's own
    p->peak[MEM_GRADS] = f * (shard_total + (a->zero == 1 ? padded_total : max_padded + padded[0] / f));
    p->peak[MEM_OPTIMIZER] = 2 * f * shard_total;
    if (a->zero == 3) {
        Slots s = {.n = n, .reshard = a->reshard, .padded = padded, .dp = dp};
        slots_zero3_step(&s, n - 2, a->prefetch, head_first);
    }
    for (int i = 0; i < n; i++)  // every unit's gradient reduce-scattered once
        comm_tally(dp, COLL_REDUCE_SCATTER, padded[i], comm_ring_factor(dp));
    if (a->zero < 3)  // the updated shards back to every rank
        for (int i = 0; i < n; i++) comm_tally(dp, COLL_ALLGATHER, padded[i], comm_ring_factor(dp));
}

// The norm's device scalars (train_sumsq_begin: the step's double sum of
// squares and the float the all-reduce carries, kept for the run), on every
// rank that computes a norm.
void plan_norm_scalars(RankPlan* p) { p->peak[MEM_OTHER] = 2 * sizeof(double); }

// The norm: one all-reduce of a float per group over which the gradient is
// spread (train_global_norm).
void plan_norm(RankPlan* p, const Comm* const* groups, int n) {
    plan_norm_scalars(p);
    for (int i = 0; i < n; i++) comm_tally(groups[i], COLL_ALLREDUCE, sizeof(float), 2.0 * comm_ring_factor(groups[i]));
}

void plan_chapter_3(const PlanArgs* a, RankPlan* p, int r) {
    int N = a->mesh[AXIS_DP];
    size_t numel[2 + 4096];
    int n = units(&a->cfg, numel);
    Comm dp = plan_group(AXIS_DP, N, r);
    p->peak[MEM_ACTIVATIONS] = plan_acts_bytes(&a->cfg, a->B / N, a->T, a->recompute);
    p->flops = plan_flops(&a->cfg, a->B / N, a->T, a->cfg.num_layers, a->cfg.padded_vocab_size, 1, a->recompute);
    // the order of 03_fsdp/main.c's step: forward and backward (gathers,
    // reduce-scatters), the norm, the ZeRO-1/2 gathers of the updated shards
    plan_fsdp(a, p, &dp, numel, n, 0);
    const Comm* groups[] = {&dp};
    plan_norm(p, groups, 1);
}

// ---------------------------------------------------------------- chapter 4: FSDP x TP

// tp rank r's rows of the padded vocabulary: ceil(Vp/tp), the last fewer
// (04_fsdp_tp/tp.c's tp_vocab_rows)
int plan_vocab_rows(const GPTConfig* cfg, int tp, int r) {
    int per = (cfg->padded_vocab_size + tp - 1) / tp, left = cfg->padded_vocab_size - r * per;
    return left < per ? left : per;
}

void plan_chapter_4(const PlanArgs* a, RankPlan* p, int r) {
    const GPTConfig* c = &a->cfg;
    int coord[NUM_AXES];
    plan_coords(a, r, coord);
    int ndp = a->mesh[AXIS_DP], ntp = a->mesh[AXIS_TP], L = c->num_layers, C = c->channels, NH = c->num_heads;
    Comm dp = plan_group(AXIS_DP, ndp, coord[AXIS_DP]), tp = plan_group(AXIS_TP, ntp, coord[AXIS_TP]);
    int B = a->B / ndp, T = a->T, Vl = plan_vocab_rows(c, ntp, coord[AXIS_TP]);
    size_t BT = (size_t)B * T, NC = BT * C;
    // the tp shard as units: [wte rows, wpe], each block's shard, [lnfw lnfb]
    size_t numel[2 + 4096];
    numel[0] = (size_t)Vl * C + (size_t)c->max_seq_len * C;
    for (int l = 0; l < L; l++) numel[1 + l] = gpt_block_numel_tp(C, ntp);
    numel[L + 1] = 2 * (size_t)C;
    // tp_create's activations: the blocks' tp slices, this rank's logits
    // slice, the gathered cross-entropy statistics (3 floats per token per rank)
    size_t floats = NC + (size_t)L * block_store_numel_tp(B, T, C, NH, ntp, a->recompute) +
                    block_transient_numel_tp(B, T, C, NH, ntp, a->recompute) + head_acts_numel(B, T, C, Vl) +
                    (size_t)ntp * 3 * BT + block_scratch_numel_tp(B, T, C, NH, ntp) + NC;
    p->peak[MEM_ACTIVATIONS] = (double)(floats * sizeof(float) + 2 * BT * sizeof(int));
    p->flops = plan_flops(c, B, T, L, Vl, ntp, a->recompute);
    // forward: g after the embedding, two per block (attention, MLP); the
    // cross-entropy's all-gather; backward: f after the head, two per block,
    // two more per block under full recompute (its forward's g's)
    double ar = 2.0 * comm_ring_factor(&tp);
    comm_tally(&tp, COLL_ALLREDUCE, NC * sizeof(float), ar);
    for (int l = 0; l < 2 * L; l++) comm_tally(&tp, COLL_ALLREDUCE, NC * sizeof(float), ar);
    comm_tally(&tp, COLL_ALLGATHER, 3 * BT * ntp * sizeof(float), comm_ring_factor(&tp));
    comm_tally(&tp, COLL_ALLREDUCE, NC * sizeof(float), ar);
    int per_block = a->recompute == RECOMPUTE_FULL ? 4 : 2;
    for (int l = 0; l < per_block * L; l++) comm_tally(&tp, COLL_ALLREDUCE, NC * sizeof(float), ar);
    plan_fsdp(a, p, &dp, numel, L + 2, 1);
    const Comm* groups[] = {&dp, &tp};
    plan_norm(p, groups, 2);
}

