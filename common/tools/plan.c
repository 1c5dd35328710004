// plan: see the sharding, predict the run. Given a chapter, a rank count and
// the chapter's own flags, prints what each rank will allocate per memory
// category at peak and what it will send per collective and axis per step,
// without running anything.
//
//   build/plan --chapter 3 --ranks 4 --dp 4 --zero 3
//   build/plan --chapter 2 --ranks 2 --dp 2 --dp-mode ps --steps 10 --json
//   build/plan --search --ranks 4 --model small --memory-per-rank 2e8
//
// --json prints one record with the "peak_bytes" and "comm" objects of the
// chapter's own summary (--log FILE.jsonl), which counts --steps steps of
// communication: tests/plan.sh checks that they are equal, integer for
// integer. The sizes come from the course's own functions (model_layout.h,
// model.h's activation sizes, comm_stats.h's counters fed with the calls the
// chapter makes), so a change of layout moves the plan with it.
//
// Exact so far: chapter 0 (one rank), chapter 2 (every --dp-mode,
// --grad-accum, --bucket-kb) and chapter 3 (every --zero, --prefetch,
// --reshard), every category and every collective, with --recompute.
// Other chapters: an error line says they are not planned yet (chapter 5's
// send buffers are a pool that grows when a send is still in flight, so its
// "comm" peak depends on timing). --search plans every layout of --ranks in
// the planned chapters and lists those that fit --memory-per-rank, fewest
// bus bytes per step first. No step time: that needs a machine profile.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "args.h"
#include "comm.h"
#include "comm_stats.h"
#include "memory.h"
#include "mesh.h"
#include "model.h"
#include "model_file.h"
#include "model_layout.h"
#include "model_tp.h"
#include "plan_time.h"

// ---------------------------------------------------------------- the question

typedef struct {
    int chapter, ranks, steps, json;
    GPTConfig cfg;
    const char* model_name;
    int B, T;                 // global batch, sequence length
    int mesh[NUM_AXES];
    RecomputeMode recompute;
    const char* dp_mode;      // chapter 2
    int bucket_kb, accum;     // chapter 2
    int zero, prefetch, reshard;  // chapter 3
} PlanArgs;

// What one rank allocates at peak (bytes per category) and what it sends:
// the comm layer's own counters (comm_stats.h), fed the calls the chapter
// makes on a group of the right size.
typedef struct {
    double peak[MEM_NUM_CATEGORIES];
    CommCount comm[NUM_COLLECTIVES][COMM_NUM_AXES];
} RankPlan;

static void die(const char* fmt, const char* what) {
    fprintf(stderr, "error: ");
    fprintf(stderr, fmt, what);
    fprintf(stderr, "\n");
    exit(1);
}

// A group of `size` ranks on one axis, as the counters see it: no MPI.
static Comm plan_group(int axis, int size, int rank) {
    Comm c;
    memset(&c, 0, sizeof(c));
    c.axis = axis;
    c.size = size;
    c.rank = rank;
    return c;
}

// ---------------------------------------------------------------- sizes

// The bytes gpt_acts_create_recompute allocates (model.c): the embedding's
// output, L blocks' stores, the recompute transient, the head, the scratch,
// the residual gradient, inputs and targets.
static double acts_bytes(const GPTConfig* cfg, int B, int T, RecomputeMode mode) {
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

static void plan_chapter_0(const PlanArgs* a, RankPlan* p, int r) {
    (void)r;
    double P = (double)gpt_num_params(&a->cfg);
    p->peak[MEM_PARAMS] = 4 * P;
    p->peak[MEM_GRADS] = 4 * P;
    p->peak[MEM_OPTIMIZER] = 8 * P;  // AdamW's m and v
    p->peak[MEM_ACTIVATIONS] = acts_bytes(&a->cfg, a->B, a->T, a->recompute);
}

// ---------------------------------------------------------------- chapter 2: data parallel

static void plan_chapter_2(const PlanArgs* a, RankPlan* p, int r) {
    int N = a->mesh[AXIS_DP];
    size_t P = gpt_num_params(&a->cfg);
    int ps = !strcmp(a->dp_mode, "ps");
    p->peak[MEM_PARAMS] = 4.0 * P;  // a full replica
    p->peak[MEM_GRADS] = 4.0 * P;
    p->peak[MEM_OPTIMIZER] = ps && r != 0 ? 0 : 8.0 * P;  // ps: rank 0 alone steps
    p->peak[MEM_COMM] = ps && r == 0 ? 4.0 * P : 0;       // ps: the summed gradients
    p->peak[MEM_ACTIVATIONS] = acts_bytes(&a->cfg, a->B / N / a->accum, a->T, a->recompute);
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
        // buckets of --bucket-kb cut from the end of the flat buffer
        size_t bucket = (size_t)a->bucket_kb * 1024 / sizeof(float);
        for (size_t hi = P; hi > 0;) {
            size_t lo = hi > bucket ? hi - bucket : 0;
            comm_tally(&dp, COLL_ALLREDUCE, (hi - lo) * sizeof(float), 2.0 * comm_ring_factor(&dp));
            hi = lo;
        }
    }
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
static void plan_fsdp(const PlanArgs* a, RankPlan* p, const Comm* dp, const size_t* numel, int n,
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

// The norm: one all-reduce of a float per group over which the gradient is
// spread (train_global_norm), through a one-float buffer.
static void plan_norm(RankPlan* p, const Comm* const* groups, int n) {
    p->peak[MEM_OTHER] = sizeof(float);
    for (int i = 0; i < n; i++) comm_tally(groups[i], COLL_ALLREDUCE, sizeof(float), 2.0 * comm_ring_factor(groups[i]));
}

static void plan_chapter_3(const PlanArgs* a, RankPlan* p, int r) {
    int N = a->mesh[AXIS_DP];
    size_t numel[2 + 4096];
    int n = units(&a->cfg, numel);
    Comm dp = plan_group(AXIS_DP, N, r);
    p->peak[MEM_ACTIVATIONS] = acts_bytes(&a->cfg, a->B / N, a->T, a->recompute);
    // the order of 03_fsdp/main.c's step: forward and backward (gathers,
    // reduce-scatters), the norm, the ZeRO-1/2 gathers of the updated shards
    plan_fsdp(a, p, &dp, numel, n, 0);
    const Comm* groups[] = {&dp};
    plan_norm(p, groups, 1);
}

// ---------------------------------------------------------------- chapter 4: FSDP x TP

// tp rank r's rows of the padded vocabulary: ceil(Vp/tp), the last fewer
// (04_fsdp_tp/tp.c's tp_vocab_rows)
static int vocab_rows(const GPTConfig* cfg, int tp, int r) {
    int per = (cfg->padded_vocab_size + tp - 1) / tp, left = cfg->padded_vocab_size - r * per;
    return left < per ? left : per;
}

static void plan_chapter_4(const PlanArgs* a, RankPlan* p, int r) {
    const GPTConfig* c = &a->cfg;
    Mesh mesh;
    memset(&mesh, 0, sizeof(mesh));
    for (int x = 0; x < NUM_AXES; x++) mesh.size[x] = a->mesh[x];
    int coord[NUM_AXES];
    mesh_coord_of(&mesh, r, coord);
    int ndp = a->mesh[AXIS_DP], ntp = a->mesh[AXIS_TP], L = c->num_layers, C = c->channels, NH = c->num_heads;
    Comm dp = plan_group(AXIS_DP, ndp, coord[AXIS_DP]), tp = plan_group(AXIS_TP, ntp, coord[AXIS_TP]);
    int B = a->B / ndp, T = a->T, Vl = vocab_rows(c, ntp, coord[AXIS_TP]);
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

// ---------------------------------------------------------------- output

static const char* category_name(int c) { return c < MEM_NUM_CATEGORIES ? mem_category_name(c) : "total"; }

static double plan_total(const RankPlan* p) {
    double t = 0;
    for (int c = 0; c < MEM_NUM_CATEGORIES; c++) t += p->peak[c];
    return t;
}

// The summary's "peak_bytes" and "comm" objects (common/report.c's format),
// communication over --steps steps.
static void print_json(const PlanArgs* a, const RankPlan* plans) {
    int n = a->ranks;
    printf("{\"type\":\"plan\",\"chapter\":%d,\"world_size\":%d,\"steps\":%d,\"peak_bytes\":{", a->chapter, n,
           a->steps);
    for (int c = 0; c <= MEM_NUM_CATEGORIES; c++) {
        printf("%s\"%s\":[", c ? "," : "", category_name(c));
        for (int r = 0; r < n; r++)
            printf("%s%.0f", r ? "," : "", c < MEM_NUM_CATEGORIES ? plans[r].peak[c] : plan_total(&plans[r]));
        printf("]");
    }
    printf("},\"comm\":{");
    int first_coll = 1;
    for (int c = 0; c < NUM_COLLECTIVES; c++) {
        int first_axis = 1;
        for (int x = 0; x < COMM_NUM_AXES; x++) {
            double used = 0;
            for (int r = 0; r < n; r++) used += plans[r].comm[c][x].calls;
            if (used == 0) continue;
            if (first_axis) printf("%s\"%s\":{", first_coll ? "" : ",", collective_name((Collective)c));
            printf("%s\"%s\":{", first_axis ? "" : ",", comm_axis_name(x));
            for (int k = 0; k < 3; k++) {
                static const char* fields[3] = {"calls", "bytes", "bus_bytes"};
                printf("%s\"%s\":[", k ? "," : "", fields[k]);
                for (int r = 0; r < n; r++) {
                    const CommCount* q = &plans[r].comm[c][x];
                    printf("%s%.0f", r ? "," : "", k == 0 ? q->calls : k == 1 ? q->bytes : q->bus_bytes);
                }
                printf("]");
            }
            printf("}");
            first_axis = 0;
            first_coll = 0;
        }
        if (!first_axis) printf("}");
    }
    printf("}}\n");
}

// The human table: peak bytes per rank and category, then each rank's
// communication per step (ranks with the same figures share a line).
static void print_table(const PlanArgs* a, const RankPlan* plans) {
    printf("plan: chapter %d on %d rank%s, mesh", a->chapter, a->ranks, a->ranks == 1 ? "" : "s");
    for (int x = 0; x < NUM_AXES; x++)
        if (a->mesh[x] > 1) printf(" %s %d", mesh_axis_name((MeshAxis)x), a->mesh[x]);
    printf(", model %s (L=%d C=%d NH=%d Vp=%d), %zu parameters, batch %d x %d\n", a->model_name,
           a->cfg.num_layers, a->cfg.channels, a->cfg.num_heads, a->cfg.padded_vocab_size, gpt_num_params(&a->cfg),
           a->B, a->T);
    printf("peak bytes per rank:\n  %-6s", "rank");
    for (int c = 0; c <= MEM_NUM_CATEGORIES; c++) printf(" %13s", category_name(c));
    printf("\n");
    for (int r = 0; r < a->ranks; r++) {
        printf("  %-6d", r);
        for (int c = 0; c <= MEM_NUM_CATEGORIES; c++)
            printf(" %13.0f", c < MEM_NUM_CATEGORIES ? plans[r].peak[c] : plan_total(&plans[r]));
        printf("\n");
    }
    printf("communication per step (over %d step%s: the summary's \"comm\" divided by it):\n", a->steps,
           a->steps == 1 ? "" : "s");
    int any = 0;
    for (int r = 0; r < a->ranks; r++)
        for (int c = 0; c < NUM_COLLECTIVES; c++)
            for (int x = 0; x < COMM_NUM_AXES; x++) {
                const CommCount* q = &plans[r].comm[c][x];
                if (q->calls == 0) continue;
                printf("  rank %-3d %-15s %-3s %8g calls %14.0f bytes %14.0f bus bytes\n", r,
                       collective_name((Collective)c), comm_axis_name(x), q->calls / a->steps, q->bytes / a->steps,
                       q->bus_bytes / a->steps);
                any = 1;
            }
    if (!any) printf("  none\n");
}

// ---------------------------------------------------------------- main

typedef void (*PlanFn)(const PlanArgs*, RankPlan*, int);

// The chapter's planner for these flags, or NULL and msg saying what does
// not fit (the checks the chapter itself makes of its mesh and flags).
static PlanFn plan_pick(const PlanArgs* a, char* msg, size_t len) {
    int N = a->mesh[AXIS_DP], world = a->ranks;
    const char* bad = NULL;
    PlanFn plan = NULL;
    switch (a->chapter) {
        case 0:
            if (world != 1) bad = "--ranks: chapter 0 trains on one rank";
            plan = plan_chapter_0;
            break;
        case 2:
            if (world != N) bad = "--ranks: chapter 2 has the dp axis only";
            else if (strcmp(a->dp_mode, "naive") && strcmp(a->dp_mode, "bucketed") &&
                     strcmp(a->dp_mode, "overlapped") && strcmp(a->dp_mode, "ps"))
                bad = "--dp-mode: not one of naive, bucketed, overlapped, ps";
            else if (a->accum < 1 || a->bucket_kb < 1 || a->B % (N * a->accum))
                bad = "--grad-accum: --batch must split into dp x --grad-accum micro-batches";
            plan = plan_chapter_2;
            break;
        case 3:
        case 4:
            if (a->chapter == 3 && world != N) bad = "--ranks: chapter 3 has the dp axis only";
            else if (a->chapter == 4 && world != N * a->mesh[AXIS_TP])
                bad = "--ranks: chapter 4 has the dp and tp axes only";
            else if (a->chapter == 4 && a->cfg.num_heads % a->mesh[AXIS_TP])
                bad = "--tp: the model's heads must split over tp";
            else if (a->zero < 1 || a->zero > 3) bad = "--zero: the ZeRO stages are 1, 2 and 3";
            else if ((a->prefetch != 0 && a->prefetch != 1) || (a->reshard != 0 && a->reshard != 1))
                bad = "--prefetch and --reshard take 0 or 1";
            else if (a->B % N) bad = "--batch: the batch must split over dp";
            plan = a->chapter == 3 ? plan_chapter_3 : plan_chapter_4;
            break;
        default:
            snprintf(msg, len, "--chapter %d is not planned yet (the planner knows chapters 0, 2, 3 and 4)",
                     a->chapter);
            return NULL;
    }
    if (bad) {
        snprintf(msg, len, "%s", bad);
        return NULL;
    }
    return plan;
}

// Every rank's plan over a->steps steps.
static RankPlan* plan_run(const PlanArgs* a, PlanFn plan) {
    RankPlan* plans = calloc((size_t)a->ranks, sizeof(RankPlan));
    if (!plans) die("%s", "out of memory");
    for (int r = 0; r < a->ranks; r++) {
        comm_counts_reset();
        for (int s = 0; s < a->steps; s++) plan(a, &plans[r], r);
        for (int c = 0; c < NUM_COLLECTIVES; c++)
            for (int x = 0; x < COMM_NUM_AXES; x++) plans[r].comm[c][x] = comm_count((Collective)c, x);
    }
    return plans;
}

// --search: every layout of --ranks the planned chapters offer (chapter 2's
// modes, chapter 3's stages, chapter 4's dp x tp with each stage), those
// whose largest rank fits --memory-per-rank, fewest bus bytes per step first.
typedef struct {
    char what[96];
    double peak, bus;
} Candidate;

static int by_bus(const void* x, const void* y) {
    const Candidate *a = x, *b = y;
    return a->bus < b->bus ? -1 : a->bus > b->bus ? 1 : (a->peak > b->peak) - (a->peak < b->peak);
}

static void search(const PlanArgs* base, double memory) {
    Candidate found[512];
    int n = 0, tried = 0;
    static const char* modes[] = {"naive", "bucketed", "overlapped", "ps"};
    for (int ch = 0; ch <= 4; ch++)
        for (int tp = 1; tp <= base->ranks; tp++) {
            if (base->ranks % tp || (ch != 4 && tp > 1)) continue;
            for (int k = 0; k < 8; k++) {
                PlanArgs a = *base;
                a.chapter = ch;
                a.steps = 1;
                for (int x = 0; x < NUM_AXES; x++) a.mesh[x] = 1;
                a.mesh[AXIS_DP] = base->ranks / tp;
                a.mesh[AXIS_TP] = tp;
                char what[96];
                if (ch == 2) {
                    if (k >= 4) continue;
                    a.dp_mode = modes[k];
                    snprintf(what, sizeof(what), "chapter 2 --dp %d --dp-mode %s", a.mesh[AXIS_DP], modes[k]);
                } else if (ch == 3 || ch == 4) {
                    if (k >= 4) continue;  // ZeRO-1, 2, 3 resharding, 3 keeping
                    a.zero = k < 3 ? k + 1 : 3;
                    a.reshard = k < 3;
                    if (ch == 3)
                        snprintf(what, sizeof(what), "chapter 3 --dp %d --zero %d%s", a.mesh[AXIS_DP], a.zero,
                                 k == 3 ? " --reshard 0" : "");
                    else
                        snprintf(what, sizeof(what), "chapter 4 --dp %d --tp %d --zero %d%s", a.mesh[AXIS_DP], tp,
                                 a.zero, k == 3 ? " --reshard 0" : "");
                } else {
                    if (k > 0 || ch == 1) continue;
                    snprintf(what, sizeof(what), "chapter 0");
                }
                char msg[256];
                PlanFn fn = plan_pick(&a, msg, sizeof(msg));
                if (!fn) continue;
                tried++;
                RankPlan* plans = plan_run(&a, fn);
                double peak = 0, bus = 0;
                for (int r = 0; r < a.ranks; r++) {
                    if (plan_total(&plans[r]) > peak) peak = plan_total(&plans[r]);
                    double mine = 0;
                    for (int c = 0; c < NUM_COLLECTIVES; c++)
                        for (int x = 0; x < COMM_NUM_AXES; x++) mine += plans[r].comm[c][x].bus_bytes;
                    if (mine > bus) bus = mine;
                }
                free(plans);
                if (peak <= memory && n < (int)(sizeof(found) / sizeof(found[0]))) {
                    snprintf(found[n].what, sizeof(found[n].what), "%s", what);
                    found[n].peak = peak;
                    found[n].bus = bus;
                    n++;
                }
            }
        }
    qsort(found, (size_t)n, sizeof(Candidate), by_bus);
    printf("search: %d of %d layouts of %d rank%s fit %.0f bytes per rank (peak of the fullest rank), fewest bus bytes "
           "per step (the busiest rank) first\n", n, tried, base->ranks, base->ranks == 1 ? "" : "s", memory);
    for (int i = 0; i < n; i++)
        printf("  %-48s peak %12.0f bytes  bus %12.0f bytes per step\n", found[i].what, found[i].peak, found[i].bus);
}

static int parse_int_or(int v, int dflt) { return v == ARG_NOT_GIVEN ? dflt : v; }

int main(int argc, char** argv) {
    PlanArgs a;
    memset(&a, 0, sizeof(a));
    const char* model = "tiny";
    const char* recompute = "none";
    int layers = ARG_NOT_GIVEN, channels = ARG_NOT_GIVEN, heads = ARG_NOT_GIVEN, vocab = ARG_NOT_GIVEN;
    int max_seq = ARG_NOT_GIVEN, batch = 0, seq = 0, help = 0, do_search = 0;
    const char* memory_arg = NULL;
    const char* profile_path = NULL;  // the step-time model's machine (plan_time.h)
    int measure_attention = 0;
    int mesh[NUM_AXES];
    for (int x = 0; x < NUM_AXES; x++) mesh[x] = 1;
    a.chapter = -1;
    a.ranks = 1;
    a.steps = 1;
    a.dp_mode = "overlapped";
    a.bucket_kb = 1024;
    a.accum = 1;
    a.zero = 3;
    a.prefetch = 1;
    a.reshard = 1;
    ArgSpec flags[] = {
        {"chapter", ARG_INT, &a.chapter, "the chapter to plan (0, 2, 3, 4)"},
        {"ranks", ARG_INT, &a.ranks, "world size  [1]"},
        {"steps", ARG_INT, &a.steps, "steps the --json communication counts (as the summary)  [1]"},
        {"json", ARG_FLAG, &a.json, "one JSON record: the summary's peak_bytes and comm objects"},
        {"model", ARG_STRING, &model,
         "tiny | small | tiny6 | FILE.bin, or planner-only gpt2-124m | gpt2-350m | gpt2-1.5b | llama3-8b-like  [tiny]"},
        {"layers", ARG_INT, &layers, "L, overriding the model's"},
        {"channels", ARG_INT, &channels, "C"},
        {"heads", ARG_INT, &heads, "NH"},
        {"vocab", ARG_INT, &vocab, "V (padded to a multiple of 128 as llm.c does)"},
        {"max-seq", ARG_INT, &max_seq, "maxT, the rows of wpe"},
        {"batch", ARG_INT, &batch, "global sequences per step  [the chapter's default]"},
        {"seq", ARG_INT, &seq, "tokens per sequence  [the chapter's default]"},
        {"dp", ARG_INT, &mesh[AXIS_DP], "mesh axes, as the chapter's flags  [1]"},
        {"tp", ARG_INT, &mesh[AXIS_TP], ""},
        {"pp", ARG_INT, &mesh[AXIS_PP], ""},
        {"cp", ARG_INT, &mesh[AXIS_CP], ""},
        {"ep", ARG_INT, &mesh[AXIS_EP], ""},
        {"recompute", ARG_STRING, &recompute, "none | selective | full  [none]"},
        {"dp-mode", ARG_STRING, &a.dp_mode, "(chapter 2) naive | bucketed | overlapped | ps  [overlapped]"},
        {"bucket-kb", ARG_INT, &a.bucket_kb, "(chapter 2)  [1024]"},
        {"grad-accum", ARG_INT, &a.accum, "(chapter 2)  [1]"},
        {"zero", ARG_INT, &a.zero, "(chapters 3, 4) 1 | 2 | 3  [3]"},
        {"prefetch", ARG_INT, &a.prefetch, "(chapter 3) 0 | 1  [1]"},
        {"reshard", ARG_INT, &a.reshard, "(chapter 3) 0 | 1  [1]"},
        {"search", ARG_FLAG, &do_search, "every layout of --ranks in chapters 0, 2, 3, 4 that fits --memory-per-rank"},
        {"memory-per-rank", ARG_STRING, &memory_arg, "bytes a rank may hold (--search), e.g. 8e6"},
        {"profile", ARG_STRING, &profile_path, "a machine profile: also predict ms/step (plan_time.h)"},
        {"measure-attention", ARG_FLAG, &measure_attention, "time attention at --batch --seq and the model's C, NH"},
        {"help", ARG_FLAG, &help, "this text"},
    };
    int n_flags = sizeof(flags) / sizeof(flags[0]);
    char msg[1024];
    const char* bad = args_parse_only(argc, argv, flags, n_flags, msg, sizeof(msg));
    if (bad && !strcmp(bad, "help")) help = 1, bad = NULL;
    if (bad) die("%s", bad);
    if (help) {
        args_usage("build/plan",
                   "Predicts a chapter's run: peak bytes per rank and category, bytes per collective and axis\n"
                   "per step (--json: the summary's peak_bytes and comm objects over --steps steps).",
                   flags, n_flags, ARGS_NO_SHARED);
        return 0;
    }
    // the model: a preset, or a checkpoint's header; then explicit sizes
    a.model_name = model;
    if (!gpt_preset(model, &a.cfg) && !plan_time_preset(model, &a.cfg)) {
        bad = checkpoint_read_config(model, &a.cfg, msg, sizeof(msg));
        if (bad) die("%s", bad);
    }
    a.cfg.num_layers = parse_int_or(layers, a.cfg.num_layers);
    a.cfg.channels = parse_int_or(channels, a.cfg.channels);
    a.cfg.num_heads = parse_int_or(heads, a.cfg.num_heads);
    a.cfg.max_seq_len = parse_int_or(max_seq, a.cfg.max_seq_len);
    if (vocab != ARG_NOT_GIVEN) {
        a.cfg.vocab_size = vocab;
        a.cfg.padded_vocab_size = vocab <= 0 ? vocab : (vocab + 127) / 128 * 128;
    }
    bad = gpt_config_problem(&a.cfg);
    if (bad) die("%s", bad);
    // train_setup's defaults (common/train.c)
    int small = !strcmp(model, "small");
    a.B = batch ? batch : (small ? 8 : 4);
    a.T = seq ? seq : (small ? 256 : (a.cfg.max_seq_len < 64 ? a.cfg.max_seq_len : 64));
    if (a.B < 1 || a.T < 1 || a.T > a.cfg.max_seq_len) die("%s: needs 1 <= --seq <= maxT and --batch >= 1", "--batch/--seq");
    if (measure_attention) return plan_time_measure_attention(a.B, a.T, a.cfg.channels, a.cfg.num_heads);
    MachineProfile profile;
    if (profile_path && (bad = plan_profile_read(profile_path, &profile, msg, sizeof(msg)))) die("%s", bad);
    int found = 0;
    for (int m = 0; m < NUM_RECOMPUTE_MODES; m++)
        if (!strcmp(recompute, recompute_name((RecomputeMode)m))) a.recompute = (RecomputeMode)m, found = 1;
    if (!found) die("--recompute %s is not one of none, selective, full", recompute);
    long world = 1;
    for (int x = 0; x < NUM_AXES; x++) {
        if (mesh[x] < 1) die("--%s must be >= 1", mesh_axis_name((MeshAxis)x));
        world *= mesh[x];
        a.mesh[x] = mesh[x];
    }
    if (a.ranks < 1 || (world != a.ranks && !do_search))
        die("%s: the product of the mesh axes must equal --ranks", "--ranks");
    if (a.steps < 1) die("%s must be >= 1", "--steps");
    if (do_search) {
        char* end = NULL;
        double memory = memory_arg ? strtod(memory_arg, &end) : 0.0;
        if (!memory_arg || *end || !(memory > 0)) die("%s: give the bytes a rank may hold, e.g. --memory-per-rank 4000000", "--search");
        search(&a, memory);
        return 0;
    }
    PlanFn plan = plan_pick(&a, msg, sizeof(msg));
    if (!plan) die("%s", msg);
    RankPlan* plans = plan_run(&a, plan);
    StepTime* times = NULL;
    if (profile_path) {  // the step time (plan_time.h): every rank from its plan, the slowest sets the step
        PtChapter ch = {.chapter = a.chapter, .dp = a.mesh[AXIS_DP], .tp = a.mesh[AXIS_TP], .B = a.B, .T = a.T,
                        .recompute = a.recompute, .dp_mode = a.dp_mode, .zero = a.zero, .prefetch = a.prefetch};
        times = calloc((size_t)a.ranks, sizeof(StepTime));
        if (!times) die("%s", "out of memory");
        for (int r = 0; r < a.ranks; r++) {
            plan_time_rank(&profile, &a.cfg, &ch, a.mesh, a.ranks, r, plans[r].peak,
                           (const CommCount(*)[COMM_NUM_AXES])plans[r].comm, a.steps, &times[r]);
            if (times[r].missing) {  // before any output: a profile short of a figure plans nothing
                snprintf(msg, sizeof(msg), "the profile '%s' has no %s", profile.name, times[r].missing);
                die("%s", msg);
            }
        }
    }
    if (a.json) print_json(&a, plans);
    else print_table(&a, plans);
    if (times) plan_time_print(&profile, times, a.ranks, (double)a.B * a.T, a.json);
    free(times);
    free(plans);
    return 0;
}
