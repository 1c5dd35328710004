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
// model.h's activation sizes, the chapters' own layouts and schedules,
// comm_stats.h's counters fed with the calls the chapter makes), so a
// change of layout moves the plan with it. The chapters' planners live in
// plan_dense.c (0, 2, 3, 4), plan_pipeline.c (5), plan_context.c (6) and
// plan_expert.c (7); plan.h is what they share.
//
// Exact: every chapter, every category and collective, with --recompute,
// but two figures that depend on timing or on the data, which the plan
// bounds and says so: chapter 5's send buffers (a pool that grows when a
// send is still in flight: "peak_bytes_low" holds the least, so the run
// lies between it and "peak_bytes") and chapter 7's all-to-all bytes (the
// rows a rank's experts receive depend on the routing: "comm_bounds" lists
// them, each rank's at most the plan's, their sum over ranks exact when
// dropless). The plan also prints each rank's matmul and attention FLOPs
// per step and chapter 5's bubble. --search plans every layout of --ranks
// in chapters 0 and 2 to 6 (with --chapter 7: every dp x tp x pp x cp x ep
// mesh of chapter 7's model) and lists those that fit --memory-per-rank,
// fewest bus bytes per step first, or with --profile (plan_time.h) the
// shortest predicted step first.
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "args.h"
#include "comm.h"
#include "comm_stats.h"
#include "memory.h"
#include "mesh.h"
#include "model.h"
#include "model_file.h"
#include "moe.h"  // chapter 7's MoE file (--model FILE with --chapter 7)
#include "model_layout.h"
#include "model_tp.h"
#include "plan_time.h"
#include "context.h"  // cp_mesh_problem: chapter 6's
#include "tp.h"  // tp_mesh_problem: chapter 4's mesh check
#include "train.h"  // train_mesh_problem: the chapters' mesh check

#include "plan.h"
#include "errors.h"

static void die(const char* fmt, const char* what) {
    fprintf(stderr, "error: ");
    fprintf(stderr, fmt, what);
    fprintf(stderr, "\n");
    exit(1);
}

// ---------------------------------------------------------------- output

static const char* category_name(int c) { return c < MEM_NUM_CATEGORIES ? mem_category_name(c) : "total"; }

static double plan_total(const RankPlan* p, int low) {
    double t = 0;
    for (int c = 0; c < MEM_NUM_CATEGORIES; c++) t += low && p->ranged[c] ? p->low[c] : p->peak[c];
    return t;
}

static int plan_ranged(const RankPlan* p) {
    for (int c = 0; c < MEM_NUM_CATEGORIES; c++)
        if (p->ranged[c]) return 1;
    return 0;
}

// peak bytes of category c (MEM_NUM_CATEGORIES: the total), the least the
// run can reach when low is set
static double plan_bytes(const RankPlan* p, int c, int low) {
    if (c == MEM_NUM_CATEGORIES) return plan_total(p, low);
    return low && p->ranged[c] ? p->low[c] : p->peak[c];
}

// The summary's "peak_bytes" and "comm" objects (common/report.c's format),
// communication over --steps steps; then the plan's own fields: the least
// bytes of the categories that depend on timing ("peak_bytes_low": the run
// lies between it and "peak_bytes"), the collectives whose bytes are bounds
// ("comm_bounds": the run's bytes and bus bytes are at most the plan's), the
// pipeline's bubble and each rank's FLOPs per step.
static void print_json(const PlanArgs* a, const PlanInfo* info, const RankPlan* plans) {
    int n = a->ranks;
    printf("{\"type\":\"plan\",\"chapter\":%d,\"world_size\":%d,\"steps\":%d,\"peak_bytes\":{", a->chapter, n,
           a->steps);
    for (int c = 0; c <= MEM_NUM_CATEGORIES; c++) {
        printf("%s\"%s\":[", c ? "," : "", category_name(c));
        for (int r = 0; r < n; r++) printf("%s%.0f", r ? "," : "", plan_bytes(&plans[r], c, 0));
        printf("]");
    }
    printf("},\"comm\":{");
    int first_coll = 1, any_bound = 0;
    for (int c = 0; c < NUM_COLLECTIVES; c++) {
        int first_axis = 1;
        for (int x = 0; x < comm_num_slots(); x++) {
            double used = 0;
            for (int r = 0; r < n; r++) used += plans[r].comm[c][x].calls;
            if (used == 0) continue;
            any_bound |= info->comm_bound[c][x];
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
    printf("}");
    int ranged = 0;
    for (int r = 0; r < n; r++) ranged |= plan_ranged(&plans[r]);
    if (ranged) {
        printf(",\"peak_bytes_low\":{");
        int first = 1;
        for (int c = 0; c <= MEM_NUM_CATEGORIES; c++) {
            int any = c == MEM_NUM_CATEGORIES;
            for (int r = 0; r < n && !any; r++) any = plans[r].ranged[c];
            if (!any) continue;
            printf("%s\"%s\":[", first ? "" : ",", category_name(c));
            for (int r = 0; r < n; r++) printf("%s%.0f", r ? "," : "", plan_bytes(&plans[r], c, 1));
            printf("]");
            first = 0;
        }
        printf("}");
    }
    if (any_bound) {
        printf(",\"comm_bounds\":[");
        int first = 1;
        for (int c = 0; c < NUM_COLLECTIVES; c++)
            for (int x = 0; x < comm_num_slots(); x++)
                if (info->comm_bound[c][x]) {
                    printf("%s[\"%s\",\"%s\",%.0f]", first ? "" : ",", collective_name((Collective)c), comm_axis_name(x),
                           info->comm_sum[c][x]);
                    first = 0;
                }
        printf("]");
    }
    printf(",\"bubble\":%.9f,\"flops_per_step\":[", info->bubble);
    for (int r = 0; r < n; r++) printf("%s%.0f", r ? "," : "", plans[r].flops);
    printf("]}\n");
}

// A plan of more than this many ranks prints a row once for a run of
// consecutive ranks that have the same figures ("0-4095"): a 4096-rank
// data-parallel plan is a few lines, not 16,000.
#define PLAN_GROUP_ABOVE 16

// The last rank of the run that starts at r whose rows are the same:
// same(a, x, y) says whether ranks x and y print the same figures.
static int same_run_end(const PlanArgs* a, const RankPlan* plans, int r,
                        int (*same)(const RankPlan*, const RankPlan*, const void*), const void* ctx) {
    int last = r;
    if (a->ranks <= PLAN_GROUP_ABOVE) return r;
    while (last + 1 < a->ranks && same(&plans[r], &plans[last + 1], ctx)) last++;
    return last;
}

static void rank_label(char* out, size_t len, int first, int last) {
    if (first == last) snprintf(out, len, "%d", first);
    else snprintf(out, len, "%d-%d", first, last);
}

static int same_bytes(const RankPlan* x, const RankPlan* y, const void* ctx) {
    (void)ctx;
    for (int c = 0; c <= MEM_NUM_CATEGORIES; c++)
        for (int low = 0; low < 2; low++)
            if (plan_bytes(x, c, low) != plan_bytes(y, c, low)) return 0;
    return plan_ranged(x) == plan_ranged(y);
}

static int same_comm(const RankPlan* x, const RankPlan* y, const void* ctx) {
    (void)ctx;
    return !memcmp(x->comm, y->comm, sizeof(x->comm));
}

static int same_flops(const RankPlan* x, const RankPlan* y, const void* ctx) {
    (void)ctx;
    return x->flops == y->flops;
}

// The human table: peak bytes per rank and category, then each rank's
// communication per step, its FLOPs per step and (chapter 5) the bubble.
static void print_table(const PlanArgs* a, const PlanInfo* info, const RankPlan* plans) {
    if (a->capstone) printf("plan: the capstone (chapter 7's model) on %d rank%s, mesh", a->ranks, a->ranks == 1 ? "" : "s");
    else printf("plan: chapter %d on %d rank%s, mesh", a->chapter, a->ranks, a->ranks == 1 ? "" : "s");
    for (int x = 0; x < NUM_AXES; x++)
        if (a->mesh[x] > 1) printf(" %s %d", mesh_axis_name((MeshAxis)x), a->mesh[x]);
    printf(", model %s (L=%d C=%d NH=%d Vp=%d), %zu parameters, batch %d x %d\n", a->model_name,
           a->cfg.num_layers, a->cfg.channels, a->cfg.num_heads, a->cfg.padded_vocab_size,
           a->chapter == 7 ? plan_expert_params(a) : gpt_num_params(&a->cfg),
           a->B, a->T);
    printf("peak bytes per rank:\n  %-6s", "rank");
    for (int c = 0; c <= MEM_NUM_CATEGORIES; c++) printf(" %13s", category_name(c));
    printf("\n");
    for (int r = 0, last; r < a->ranks; r = last + 1) {
        last = same_run_end(a, plans, r, same_bytes, NULL);
        char who[32];
        rank_label(who, sizeof(who), r, last);
        printf("  %-6s", who);
        for (int c = 0; c <= MEM_NUM_CATEGORIES; c++) printf(" %13.0f", plan_bytes(&plans[r], c, 0));
        printf("\n");
        if (!plan_ranged(&plans[r])) continue;
        printf("  %-6s", "least");
        for (int c = 0; c <= MEM_NUM_CATEGORIES; c++) printf(" %13.0f", plan_bytes(&plans[r], c, 1));
        printf("\n");
    }
    printf("communication per step (over %d step%s: the summary's \"comm\" divided by it):\n", a->steps,
           a->steps == 1 ? "" : "s");
    int any = 0;
    for (int r = 0, last; r < a->ranks; r = last + 1) {
        last = same_run_end(a, plans, r, same_comm, NULL);
        char who[32];
        rank_label(who, sizeof(who), r, last);
        for (int c = 0; c < NUM_COLLECTIVES; c++)
            for (int x = 0; x < comm_num_slots(); x++) {
                const CommCount* q = &plans[r].comm[c][x];
                if (q->calls == 0) continue;
                printf("  %s %-3s %-15s %-9s %8g calls %14.0f bytes %14.0f bus bytes%s\n", last > r ? "ranks" : "rank", who,
                       collective_name((Collective)c), comm_axis_name(x), q->calls / a->steps, q->bytes / a->steps,
                       q->bus_bytes / a->steps, info->comm_bound[c][x] ? " (at most)" : "");
                any = 1;
            }
    }
    if (!any) printf("  none\n");
    printf("FLOPs per step (matmuls and attention, forward and backward):");
    for (int r = 0, last; r < a->ranks; r = last + 1) {
        last = same_run_end(a, plans, r, same_flops, NULL);
        if (last > r) printf(" %.4g (ranks %d-%d)", plans[r].flops, r, last);
        else printf(" %.4g", plans[r].flops);
    }
    printf("\n");
    if (a->chapter == 5) printf("bubble: %.4f of the ranks' time idle (%s)\n", info->bubble, info->bubble_how);
    for (int r = 0; r < a->ranks; r++)
        if (plan_ranged(&plans[r])) {
            printf("least: where the run's peak depends on timing or data, the least it can be (the run lies between)\n");
            break;
        }
}

// ---------------------------------------------------------------- main

// --ranks x --steps the planner plans one by one (plan_run): a bound on
// its time, about a second.
#define PLAN_MAX_RANK_STEPS 1e6

// The flag of the first axis above 1 that the chapter has not (allowed: a
// bit per axis), as given ("--tp 2"), for the refusal to name.
static const char* extra_axis(const PlanArgs* a, unsigned allowed, char* buf, size_t len) {
    for (int x = 0; x < NUM_AXES; x++)
        if (a->mesh[x] > 1 && !(allowed & (1u << x))) {
            snprintf(buf, len, "--%s %d", mesh_axis_name((MeshAxis)x), a->mesh[x]);
            return buf;
        }
    return "--ranks";
}

// The chapter's planner for these flags, or NULL and msg saying what does
// not fit (the checks the chapter itself makes of its mesh and flags); info
// gets what the whole plan shares.
static PlanFn plan_pick(const PlanArgs* a, PlanInfo* info, char* msg, size_t len) {
    memset(info, 0, sizeof(*info));
    info->bubble_how = "";
    int N = a->mesh[AXIS_DP], world = a->ranks;
    const char* bad = NULL;
    char axis[32];
    PlanFn plan = NULL;
    switch (a->chapter) {
        case 0:
            if (world != 1) snprintf(msg, len, "%s: chapter 0 trains on one rank: drop it", extra_axis(a, 0, axis, sizeof(axis))), bad = msg;
            plan = plan_chapter_0;
            break;
        case 2:
            if (world != N) snprintf(msg, len, "%s: chapter 2 has the dp axis only: drop it", extra_axis(a, 1u << AXIS_DP, axis, sizeof(axis))), bad = msg;
            else if (strcmp(a->dp_mode, "naive") && strcmp(a->dp_mode, "bucketed") &&
                     strcmp(a->dp_mode, "overlapped") && strcmp(a->dp_mode, "ps"))
                bad = "--dp-mode: not one of naive, bucketed, overlapped, ps";
            else if (a->bucket_kb < 1) bad = "--bucket-kb must be >= 1";
            else if (a->accum < 1) bad = "--grad-accum must be >= 1";  // the batch's split: train_mesh_problem below
            else if (!strcmp(a->dp_mode, "overlapped") &&
                     (size_t)a->bucket_kb < comm_min_piece_kb(gpt_num_params(&a->cfg) * sizeof(float))) {
                // the chapter's own refusal (02_data_parallel/main.c): every bucket in flight at once
                snprintf(msg, len, "--bucket-kb %d: more than %d buckets in flight at once in --dp-mode overlapped; chapter 2 refuses it: use --bucket-kb %zu or more",
                         a->bucket_kb, COMM_MAX_IN_FLIGHT, comm_min_piece_kb(gpt_num_params(&a->cfg) * sizeof(float)));
                bad = msg;
            }
            plan = plan_chapter_2;
            break;
        case 3:
        case 4:
            if (a->chapter == 3 && world != N)
                snprintf(msg, len, "%s: chapter 3 has the dp axis only: drop it", extra_axis(a, 1u << AXIS_DP, axis, sizeof(axis))), bad = msg;
            else if (a->chapter == 4 && world != N * a->mesh[AXIS_TP])
                snprintf(msg, len, "%s: chapter 4 has the dp and tp axes only: drop it",
                         extra_axis(a, (1u << AXIS_DP) | (1u << AXIS_TP), axis, sizeof(axis))), bad = msg;
            else if (a->zero < 1 || a->zero > 3) bad = "--zero: the ZeRO stages are 1, 2 and 3";
            else if ((a->prefetch != 0 && a->prefetch != 1) || (a->reshard != 0 && a->reshard != 1))
                bad = "--prefetch and --reshard take 0 or 1";
            else if (a->B % N) bad = "--batch: the batch must split over dp";
            else if (a->chapter == 4) bad = tp_mesh_problem(&a->cfg, a->B, N, a->mesh[AXIS_TP], msg, len);  // chapter 4's own
            plan = a->chapter == 3 ? plan_chapter_3 : plan_chapter_4;
            break;
        case 5:
            bad = plan_check_pipeline(a, info, msg, len);
            plan = plan_chapter_5;
            break;
        case 6:
            bad = plan_check_context(a, info, msg, len);
            plan = plan_chapter_6;
            break;
        case 7:
            bad = plan_check_expert(a, info, msg, len);
            plan = plan_chapter_7;
            break;
        default:
            if (a->chapter == -1)
                snprintf(msg, len, "--chapter is needed: the chapter to plan (0, 2 to 7, or capstone), or --search over them");
            else
                snprintf(msg, len, "--chapter %d is not planned (the planner knows chapters 0, 2, 3, 4, 5, 6 and 7, and the capstone)",
                         a->chapter);
            return NULL;
    }
    if (!bad && a->chapter != 4 && !(a->chapter == 6 && a->sp)) {
        // the mesh check every chapter but 4 (and 6's --sp) makes
        // (common/train.c): the same function, so the same refusals.
        // Chapter 5 splits the layers itself (uneven allowed): pp = 1 there
        int size[NUM_AXES];
        memcpy(size, a->mesh, sizeof(size));
        MeshNeeds needs = {0};
        if (a->chapter == 2) needs.microbatches = a->accum;
        if (a->chapter == 5) size[AXIS_PP] = 1, needs.microbatches = a->microbatches == ARG_NOT_GIVEN ? a->mesh[AXIS_PP] : a->microbatches;
        if (a->chapter == 7) needs.experts = a->experts, needs.whole_vocab = 1;
        bad = train_mesh_problem(size, &a->cfg, a->B, a->T, &needs, msg, len);
        if (!bad && a->chapter == 6)  // then cp_create's own (06_sequence_context/context.c)
            bad = cp_mesh_problem(strcmp(a->cp_mode, "ring") ? CP_ULYSSES : CP_RING,
                                  strcmp(a->cp_balance, "zigzag") ? BALANCE_NONE : BALANCE_ZIGZAG, a->T,
                                  a->cfg.num_heads, a->mesh[AXIS_CP], msg, len);
    }
    if (bad) {
        if (bad != msg) snprintf(msg, len, "%s", bad);
        return NULL;
    }
    return plan;
}

// --search plans one representative of the data-parallel replicas: ranks
// that differ only in their dp coordinate hold the same shapes and make the
// same calls in every chapter (the batch splits evenly over dp, ZeRO's
// shards are equal and padded), except chapter 2's parameter server, whose
// dp rank 0 serves the others. So dp coordinates 0, 1 and the last stand
// for all: the fullest and busiest rank is among them. Not the slowest: a
// step's time also depends on the nodes a rank's groups span, which its
// place in the world decides (dp 8 x tp 3 on nodes of 8: a middle replica's
// tp group straddles two), so every rank is timed, on its representative's
// plan (predict_times). tests/plan.sh checks each listed layout against its
// own full plan.
static int plan_wanted(const PlanArgs* a, int r, int replicas_once) {
    if (!replicas_once || a->mesh[AXIS_DP] <= 3) return 1;
    int coord[NUM_AXES];
    plan_coords(a, r, coord);
    return coord[AXIS_DP] <= 1 || coord[AXIS_DP] == a->mesh[AXIS_DP] - 1;
}

// The planned rank that stands for rank r (plan_wanted's): r itself, or
// the rank at dp coordinate 1 with r's other coordinates.
static int plan_representative(const PlanArgs* a, int r, int replicas_once) {
    if (plan_wanted(a, r, replicas_once)) return r;
    Mesh mesh;
    memset(&mesh, 0, sizeof(mesh));
    for (int x = 0; x < NUM_AXES; x++) mesh.size[x] = a->mesh[x];
    int coord[NUM_AXES];
    mesh_coord_of(&mesh, r, coord);
    coord[AXIS_DP] = 1;
    return mesh_rank_at(&mesh, coord);
}

// Every rank's plan over a->steps steps (replicas_once: the representatives
// above only, the others left zero).
static RankPlan* plan_run(const PlanArgs* a, PlanFn plan, int replicas_once) {
    RankPlan* plans = malloc((size_t)a->ranks * sizeof(RankPlan));
    if (!plans) die("%s", "out of memory");
    for (int r = 0; r < a->ranks; r++) {
        // only the ranks planned are written (and read: plan_wanted), so a
        // --search of thousands of ranks touches a few pages a layout
        if (!plan_wanted(a, r, replicas_once)) continue;
        memset(&plans[r], 0, sizeof(plans[r]));
        comm_counts_reset();
        for (int s = 0; s < a->steps; s++) plan(a, &plans[r], r);
        for (int c = 0; c < NUM_COLLECTIVES; c++)
            for (int x = 0; x < comm_num_slots(); x++) plans[r].comm[c][x] = comm_count((Collective)c, x);
    }
    return plans;
}

// The step time of every rank from its plan (plan_time.h; replicas_once:
// its representative's) and the nodes its groups span, into times[];
// returns NULL, or the figure the profile lacks.
static const char* predict_times(const MachineProfile* prof, const PlanArgs* a, const PlanInfo* info,
                                 const RankPlan* plans, StepTime* times, int replicas_once) {
    PtChapter ch = {.chapter = a->chapter, .dp = a->mesh[AXIS_DP], .tp = a->mesh[AXIS_TP], .B = a->B, .T = a->T,
                    .recompute = a->recompute, .dp_mode = a->dp_mode, .zero = a->zero, .prefetch = a->prefetch, .sp = a->sp,
                    .pp = a->mesh[AXIS_PP], .cp = a->mesh[AXIS_CP], .ep = a->mesh[AXIS_EP], .bubble = info->bubble,
                    .early_buckets = a->chapter == 2 ? plan_early_buckets(&a->cfg, a->bucket_kb) : 0};
    PtNodes nodes;  // the nodes each group spans, listed once for the layout
    plan_time_nodes_init(&nodes, prof, a->mesh, a->ranks);
    const char* missing = NULL;
    for (int r = 0; r < a->ranks && !missing; r++) {
        const RankPlan* p = &plans[plan_representative(a, r, replicas_once)];
        ch.plan_flops = p->flops;
        ch.plan_rowwise_flops = p->rowwise_flops;
        if ((a->chapter == 5 || a->chapter == 7) && a->mesh[AXIS_PP] > 1) {
            int coord[NUM_AXES];
            plan_coords(a, r, coord);
            ch.pp_next_share = plan_pipeline_next_share(coord[AXIS_PP]);
        }
        plan_time_rank(prof, &a->cfg, &ch, &nodes, r, p->peak, (const CommCount(*)[COMM_MAX_SLOTS])p->comm, a->steps,
                       &times[r]);
        missing = times[r].missing;
    }
    plan_time_nodes_free(&nodes);
    return missing;
}

// --search: every layout of --ranks the planned chapters offer (chapter 2's
// modes, chapter 3's stages, chapter 4's dp x tp with each stage, chapter
// 5's dp x pp with each schedule, chapter 6's dp x cp ring and Ulysses;
// chapter 7 trains another model, so it is searched on its own: --search
// --chapter 7), those whose largest rank fits --memory-per-rank, fewest bus
// bytes per step first or, with --profile, the shortest predicted step first.
typedef struct {
    char what[160];
    double peak, bus, ms;
} Candidate;

// What a search met beside the layouts that fit: those planned, the time
// model's notes, the refusals (none planned: the most common, and a layout
// it refused) and the smallest peak (none fits: how far).
#define SEARCH_REASONS 16
typedef struct {
    int tried, refused;
    StepTime notes;
    struct {
        char msg[ERROR_MAX], what[160];
        int count;
    } reason[SEARCH_REASONS];
    int n_reasons;
    Candidate least;
} SearchTally;

static void tally_refusal(SearchTally* t, const char* what, const char* msg) {
    t->refused++;
    for (int i = 0; i < t->n_reasons; i++)
        if (!strcmp(t->reason[i].msg, msg)) {
            t->reason[i].count++;
            return;
        }
    if (t->n_reasons == SEARCH_REASONS) return;  // the common ones are met early
    snprintf(t->reason[t->n_reasons].msg, sizeof(t->reason[0].msg), "%s", msg);
    snprintf(t->reason[t->n_reasons].what, sizeof(t->reason[0].what), "%s", what);
    t->reason[t->n_reasons++].count = 1;
}

static int by_time(const void* x, const void* y) {
    const Candidate *a = x, *b = y;
    return a->ms < b->ms ? -1 : a->ms > b->ms ? 1 : (a->peak > b->peak) - (a->peak < b->peak);
}

static int by_bus(const void* x, const void* y) {
    const Candidate *a = x, *b = y;
    return a->bus < b->bus ? -1 : a->bus > b->bus ? 1 : (a->peak > b->peak) - (a->peak < b->peak);
}

// Plans one layout; adds it to found[] if its fullest rank fits memory, and
// the time model's notes its ranks needed to *notes (plan_time_print_notes).
static void consider(const PlanArgs* a, const char* what, double memory, const MachineProfile* prof,
                     Candidate* found, int* n, int cap, SearchTally* tally) {
    char msg[ERROR_MAX];
    PlanInfo info;
    PlanFn fn = plan_pick(a, &info, msg, sizeof(msg));
    if (!fn) {  // a layout the model or the mesh does not allow
        tally_refusal(tally, what, msg);
        return;
    }
    tally->tried++;
    RankPlan* plans = plan_run(a, fn, 1);
    double peak = 0, bus = 0, ms = 0;
    for (int r = 0; r < a->ranks; r++) {
        if (!plan_wanted(a, r, 1)) continue;
        if (plan_total(&plans[r], 0) > peak) peak = plan_total(&plans[r], 0);
        double mine = 0;
        for (int c = 0; c < NUM_COLLECTIVES; c++)
            for (int x = 0; x < comm_num_slots(); x++) mine += plans[r].comm[c][x].bus_bytes;
        if (mine > bus) bus = mine;
    }
    if (prof) {
        StepTime* times = calloc((size_t)a->ranks, sizeof(StepTime));
        if (!times) die("%s", "out of memory");
        const char* missing = predict_times(prof, a, &info, plans, times, 1);
        if (missing) die("--profile: the profile has no %s", missing);
        for (int r = 0; r < a->ranks; r++)
            if (times[r].total_ms > ms) ms = times[r].total_ms;
        if (peak <= memory) plan_time_add_notes(&tally->notes, times, a->ranks);
        free(times);
    }
    free(plans);
    if (tally->tried == 1 || peak < tally->least.peak) {
        snprintf(tally->least.what, sizeof(tally->least.what), "%s", what);
        tally->least.peak = peak;
    }
    if (peak <= memory && *n == cap) die("%s: more layouts fit than it can list; give fewer --ranks", "--search");
    if (peak <= memory) {
        snprintf(found[*n].what, sizeof(found[*n].what), "%s", what);
        found[*n].peak = peak;
        found[*n].bus = bus;
        found[*n].ms = ms;
        (*n)++;
    }
}

// The found layouts in the key's order, one line each; the time model's notes.
static void search_print(const PlanArgs* base, double memory, const MachineProfile* prof, Candidate* found, int n,
                         const SearchTally* tally) {
    qsort(found, (size_t)n, sizeof(Candidate), prof ? by_time : by_bus);
    printf("search: %d of %d layouts of %d rank%s fit %.0f bytes per rank (peak of the fullest rank), %s first\n", n,
           tally->tried, base->ranks, base->ranks == 1 ? "" : "s", memory,
           prof ? "the shortest predicted step (the slowest rank's)" : "fewest bus bytes per step (the busiest rank)");
    if (tally->tried == 0 && tally->refused) {
        int top = 0;
        for (int i = 1; i < tally->n_reasons; i++)
            if (tally->reason[i].count > tally->reason[top].count) top = i;
        printf("  none planned: each of the %d layouts was refused; the most common refusal (%d), of %s: %s\n",
               tally->refused, tally->reason[top].count, tally->reason[top].what, tally->reason[top].msg);
    }
    else if (n == 0 && tally->tried)
        printf("  none fits: the smallest peak is %.0f bytes (%s)\n", tally->least.peak, tally->least.what);
    int width = 48;
    for (int i = 0; i < n; i++)
        if ((int)strlen(found[i].what) > width) width = (int)strlen(found[i].what);
    for (int i = 0; i < n; i++) {
        printf("  %-*s peak %12.0f bytes  bus %12.0f bytes per step", width, found[i].what, found[i].peak, found[i].bus);
        if (prof) printf("  %11.4g ms", found[i].ms);
        printf("\n");
    }
    plan_time_print_notes(&tally->notes);
}

// --search --chapter 7: every dp x tp x pp x cp x ep of --ranks, with pp
// each of chapter 5's schedules (gpipe, 1f1b, zb, one chunk a rank, and
// interleaved with the fewest chunks that cut the layers evenly;
// --microbatches as given, else pp), with cp the ring and Ulysses; the model's
// flags (--experts, --top-k, --capacity-factor, --recompute, --ep-overlap,
// --cp-balance, --microbatches at pp 1 too, where they accumulate ...) as
// given. A layout the capstone refuses (plan_check_expert: heads, layers,
// experts, the batch's and a microbatch's splits, --zero 2 and 3 with
// microbatches) is left out of the count.
static void search_expert(const PlanArgs* base, double memory, const MachineProfile* prof) {
    static Candidate found[4096];
    SearchTally tally = {0};
    int n = 0, cap = (int)(sizeof(found) / sizeof(found[0])), R = base->ranks;
    static const char* schedules[] = {"gpipe", "1f1b", "zb", "interleaved"};
    static const char* cp_modes[] = {"ring", "ulysses"};
    for (int dp = 1; dp <= R; dp++)
        for (int tp = 1; tp <= R / dp; tp++)
            for (int pp = 1; pp <= R / (dp * tp); pp++)
                for (int cp = 1; cp <= R / (dp * tp * pp); cp++) {
                    int ep = R / (dp * tp * pp * cp);
                    if (dp * tp * pp * cp * ep != R) continue;
                    // the capstone's compositions: each schedule (interleaved
                    // with the fewest chunks that cut the layers evenly), each
                    // cp mode, and ZeRO over the copies (1 with a pipeline;
                    // 2 and 3 without, as the capstone refuses them there)
                    int n_sched = pp > 1 ? 4 : 1, n_cp = cp > 1 ? 2 : 1, n_zero = pp > 1 ? 2 : 4;
                    for (int k = 0; k < n_sched * n_cp * n_zero; k++) {
                        int ks = k % n_sched, kc = k / n_sched % n_cp, zero = k / (n_sched * n_cp);
                        PlanArgs a = *base;
                        a.steps = 1;
                        int sizes[NUM_AXES] = {0};
                        sizes[AXIS_DP] = dp, sizes[AXIS_TP] = tp, sizes[AXIS_PP] = pp, sizes[AXIS_CP] = cp;
                        sizes[AXIS_EP] = ep;
                        for (int x = 0; x < NUM_AXES; x++) a.mesh[x] = sizes[x];
                        a.virt = 1;
                        a.zero = zero;
                        char what[160];
                        // chapter 7 trains dp x ep; the other axes and ZeRO compose the same
                        // model in the capstone, named so: the line is a command to run
                        int composed = tp > 1 || pp > 1 || cp > 1 || zero > 0;
                        int len = snprintf(what, sizeof(what), base->capstone || composed ? "capstone" : "chapter 7");
                        static const MeshAxis order[] = {AXIS_DP, AXIS_TP, AXIS_PP, AXIS_CP, AXIS_EP};
                        for (int i = 0; i < 5; i++)
                            if (sizes[order[i]] > 1)
                                len += snprintf(what + len, sizeof(what) - len, " --%s %d", mesh_axis_name(order[i]),
                                                sizes[order[i]]);
                        if (pp > 1) {
                            a.schedule = schedules[ks];
                            len += snprintf(what + len, sizeof(what) - len, " --schedule %s", a.schedule);
                            if (ks == 3) {
                                int L = a.cfg.num_layers;
                                for (a.virt = 2; a.virt * pp <= L && L % (a.virt * pp); a.virt++) {}
                                if (a.virt * pp > L) continue;
                                len += snprintf(what + len, sizeof(what) - len, " --virtual %d", a.virt);
                            }
                        }
                        if (cp > 1) {
                            a.cp_mode = cp_modes[kc];
                            len += snprintf(what + len, sizeof(what) - len, " --cp-mode %s", a.cp_mode);
                        }
                        if (zero) snprintf(what + len, sizeof(what) - len, " --zero %d", zero);
                        consider(&a, what, memory, prof, found, &n, cap, &tally);
                    }
                }
    search_print(base, memory, prof, found, n, &tally);
}

static void search(const PlanArgs* base, double memory, const MachineProfile* prof) {
    if (base->chapter == 7) {
        search_expert(base, memory, prof);
        return;
    }
    Candidate found[512];
    SearchTally tally = {0};
    int n = 0, cap = (int)(sizeof(found) / sizeof(found[0]));
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
                consider(&a, what, memory, prof, found, &n, cap, &tally);
            }
        }
    // chapter 5: dp x pp with each schedule (microbatches: the chapter's
    // default; interleaved with the fewest chunks a rank that cut the layers
    // evenly); chapter 6:
    // dp x cp, the ring and Ulysses, and dp x tp with sequence parallelism
    static const char* schedules[] = {"gpipe", "1f1b", "zb", "interleaved"};
    static const char* cp_modes[] = {"ring", "ulysses"};
    for (int split = 2; split <= base->ranks; split++) {
        if (base->ranks % split) continue;
        for (int k = 0; k < 7; k++) {
            int ch = k < 4 ? 5 : 6, axis = ch == 5 ? AXIS_PP : k < 6 ? AXIS_CP : AXIS_TP;
            PlanArgs a = *base;
            a.chapter = ch;
            a.steps = 1;
            for (int x = 0; x < NUM_AXES; x++) a.mesh[x] = 1;
            a.mesh[AXIS_DP] = base->ranks / split;
            a.mesh[axis] = split;
            char what[96];
            if (ch == 5) {
                a.schedule = schedules[k];
                a.virt = 1;
                if (k == 3) {  // interleaved: the fewest chunks a rank (2 or more) that cut the layers evenly
                    int L = a.cfg.num_layers;
                    for (a.virt = 2; a.virt * split <= L && L % (a.virt * split); a.virt++) {}
                    if (a.virt * split > L) continue;
                }
                char chunks[24] = "";
                if (a.virt > 1) snprintf(chunks, sizeof(chunks), " --virtual %d", a.virt);
                snprintf(what, sizeof(what), "chapter 5 --dp %d --pp %d --schedule %s%s", a.mesh[AXIS_DP], split,
                         a.schedule, chunks);
            } else if (axis == AXIS_CP) {
                a.cp_mode = cp_modes[k - 4];
                snprintf(what, sizeof(what), "chapter 6 --dp %d --cp %d --cp-mode %s", a.mesh[AXIS_DP], split,
                         a.cp_mode);
            } else {
                a.sp = 1;
                snprintf(what, sizeof(what), "chapter 6 --dp %d --tp %d --sp", a.mesh[AXIS_DP], split);
            }
            consider(&a, what, memory, prof, found, &n, cap, &tally);
        }
    }
    search_print(base, memory, prof, found, n, &tally);
}

static int parse_int_or(int v, int dflt) { return v == ARG_NOT_GIVEN ? dflt : v; }

// The chapters (bit c; 7: chapter 7 and the capstone, one planner: --chapter
// 7 plans the capstone's compositions too) whose programs take
// each chapter's own flag. One given for a chapter that has no such flag is
// said, not planned over in silence (its program would refuse it).
static const struct {
    const char* name;
    unsigned chapters;
} chapter_flags[] = {
    {"dp-mode", 1u << 2}, {"bucket-kb", 1u << 2}, {"grad-accum", 1u << 2},
    {"zero", 1u << 3 | 1u << 4 | 1u << 7}, {"prefetch", 1u << 3 | 1u << 4}, {"reshard", 1u << 3 | 1u << 4},
    {"schedule", 1u << 5 | 1u << 7}, {"microbatches", 1u << 5 | 1u << 7}, {"virtual", 1u << 5 | 1u << 7},
    {"sp", 1u << 6}, {"cp-mode", 1u << 6 | 1u << 7}, {"cp-balance", 1u << 6 | 1u << 7},
    {"experts", 1u << 7}, {"top-k", 1u << 7}, {"expert-hidden", 1u << 7}, {"moe-every", 1u << 7},
    {"capacity-factor", 1u << 7}, {"ep-overlap", 1u << 7},
};

static void note_other_chapters_flags(int argc, char** argv, int chapter, const char* name) {
    for (size_t k = 0; k < sizeof(chapter_flags) / sizeof(chapter_flags[0]); k++) {
        if (chapter_flags[k].chapters & (1u << chapter)) continue;
        for (int i = 1; i < argc; i++)
            if (!strncmp(argv[i], "--", 2) && !strcmp(argv[i] + 2, chapter_flags[k].name)) {
                fprintf(stderr, "note: --%s does nothing for --chapter %s: no such flag in that chapter (see --help)\n",
                        chapter_flags[k].name, name);
                break;
            }
    }
}

int main(int argc, char** argv) {
    PlanArgs a;
    memset(&a, 0, sizeof(a));
    const char* model = "tiny";
    const char* recompute = "none";
    int layers = ARG_NOT_GIVEN, channels = ARG_NOT_GIVEN, heads = ARG_NOT_GIVEN, vocab = ARG_NOT_GIVEN;
    int max_seq = ARG_NOT_GIVEN, batch = ARG_NOT_GIVEN, seq = ARG_NOT_GIVEN, help = 0, do_search = 0;
    const char* memory_arg = NULL;
    const char* chapter_name = NULL;
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
    a.zero = ARG_NOT_GIVEN;  // 3 (chapters 3, 4), 0 (chapter 7)
    a.prefetch = 1;
    a.reshard = 1;
    a.schedule = "1f1b";
    a.microbatches = ARG_NOT_GIVEN;  // pp, as the chapters (0 is refused there, so here)
    a.virt = 1;
    a.cp_mode = "ring";
    a.cp_balance = "none";
    a.experts = 4;
    a.top_k = 2;
    a.capacity = 0;
    a.expert_hidden = ARG_NOT_GIVEN;
    a.moe_every = 1;
    a.ep_overlap = 1;
    float capacity = 0.0f;
    ArgSpec flags[] = {
        {"chapter", ARG_STRING, &chapter_name,
         "the chapter to plan (0, 2, 3, 4, 5, 6, 7), or capstone: chapter 7's model on every axis, as build/capstone runs it"},
        {"ranks", ARG_INT, &a.ranks, "world size  [1]"},
        {"steps", ARG_INT, &a.steps, "steps the --json communication counts (as the summary)  [1]"},
        {"json", ARG_FLAG, &a.json, "one JSON record: the summary's peak_bytes and comm objects"},
        {"model", ARG_STRING, &model,
         "tiny | small | tiny6 | FILE.bin (read as the chapter reads it: chapter 7 an MoE file, the others llm.c's), or planner-only gpt2-124m | gpt2-350m | gpt2-1.5b | llama3-8b-like  [tiny]"},
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
        {"zero", ARG_INT, &a.zero, "(chapters 3, 4) 1 | 2 | 3  [3]; (chapter 7) 0 | 1 | 2 | 3  [0]"},
        {"prefetch", ARG_INT, &a.prefetch, "(chapters 3, 4) 0 | 1  [1]"},
        {"reshard", ARG_INT, &a.reshard, "(chapters 3, 4) 0 | 1  [1]"},
        {"schedule", ARG_STRING, &a.schedule, "(chapters 5, 7) gpipe | 1f1b | interleaved | zb  [1f1b]"},
        {"microbatches", ARG_INT, &a.microbatches, "(chapters 5, 7) microbatches per step of each rank's share  [pp]"},
        {"virtual", ARG_INT, &a.virt, "(chapters 5, 7) chunks per rank, interleaved  [1]"},
        {"sp", ARG_FLAG, &a.sp, "(chapter 6) sequence parallelism on tp"},
        {"cp-mode", ARG_STRING, &a.cp_mode, "(chapters 6, 7) ring | ulysses  [ring]"},
        {"cp-balance", ARG_STRING, &a.cp_balance, "(chapters 6, 7) none | zigzag  [none]"},
        {"experts", ARG_INT, &a.experts, "(chapter 7) experts per MoE layer  [4]"},
        {"top-k", ARG_INT, &a.top_k, "(chapter 7) experts per token  [2]"},
        {"expert-hidden", ARG_INT, &a.expert_hidden, "(chapter 7) each expert's MLP width  [4C]"},
        {"moe-every", ARG_INT, &a.moe_every, "(chapter 7) every k-th layer is an MoE layer  [1]"},
        {"capacity-factor", ARG_FLOAT, &capacity, "(chapter 7) tokens an expert takes, x its fair share  [chapter 7's]"},
        {"ep-overlap", ARG_INT, &a.ep_overlap, "(chapter 7) each exchange in that many chunks of a rank's tokens  [1]"},
        {"search", ARG_FLAG, &do_search,
         "every layout of --ranks in chapters 0, 2 to 6 that fits --memory-per-rank (--chapter 7: chapter 7's meshes)"},
        {"memory-per-rank", ARG_STRING, &memory_arg, "bytes a rank may hold (--search), e.g. 8e6"},
        {"profile", ARG_STRING, &profile_path, "a machine profile: also predict ms/step (plan_time.h)"},
        {"measure-attention", ARG_FLAG, &measure_attention, "time attention at --batch --seq and the model's C, NH"},
        {"help", ARG_FLAG, &help, "this text"},
    };
    int n_flags = sizeof(flags) / sizeof(flags[0]);
    char msg[ERROR_MAX];
    const char* bad = args_parse_only(argc, argv, flags, n_flags, msg, sizeof(msg));
    if (bad && !strcmp(bad, "help")) help = 1, bad = NULL;
    if (bad) die("%s", bad);
    if (chapter_name && !strcmp(chapter_name, "capstone")) {
        a.chapter = 7, a.capstone = 1;  // the capstone trains chapter 7's model: its planner
    } else if (chapter_name) {
        char* end = NULL;
        long c = strtol(chapter_name, &end, 10);
        if (end == chapter_name || *end || c < 0 || c > 7 || c == 1)  // (before the mesh: its error would mislead)
            die("--chapter %s is not planned (the planner knows chapters 0, 2, 3, 4, 5, 6 and 7, and the capstone)", chapter_name);
        a.chapter = (int)c;
    }
    if (a.zero == ARG_NOT_GIVEN) a.zero = a.chapter == 7 ? 0 : 3;
    if (help) {
        args_usage("build/plan",
                   "Predicts a chapter's run: peak bytes per rank and category, bytes per collective and axis\n"
                   "per step, FLOPs per rank per step, chapter 5's bubble (--json: the summary's peak_bytes and\n"
                   "comm objects over --steps steps, and the plan's own fields).",
                   flags, n_flags, ARGS_NO_SHARED);
        return 0;
    }
    // the model: a preset, or a checkpoint's header; then explicit sizes
    a.model_name = model;
    if (!gpt_preset(model, &a.cfg) && !plan_time_preset(model, &a.cfg)) {
        if (access(model, F_OK) != 0) {  // the reader's "cannot open" would name the chapters' presets only
            snprintf(msg, sizeof(msg), "--model %s: no such file, nor a preset of the planner: tiny, tiny6, small, "
                     "gpt2-124m, gpt2-350m, gpt2-1.5b, llama3-8b-like (--layers, --channels, --heads resize one)", model);
            die("%s", msg);
        }
        // a file: the reader the chapter itself uses, so the planner takes
        // what the chapter takes and refuses what it refuses: chapter 7 (and
        // the capstone) read an MoE file, whose experts, router and widths
        // win over the flags as they do there (07_expert/moe_model.c); the
        // others read llm.c's dense file (common/model_file.c)
        if (a.chapter == 7) {
            MoeConfig c;
            bad = moe_checkpoint_read_config(model, &c, msg, sizeof(msg));
            if (bad) die("%s", bad);
            a.cfg = c.gpt;
            a.experts = c.experts, a.top_k = c.top_k, a.expert_hidden = c.hidden, a.moe_every = c.moe_every;
        } else {
            bad = checkpoint_read_config(model, &a.cfg, msg, sizeof(msg));
            if (bad) die("%s", bad);
        }
    }
    a.cfg.num_layers = parse_int_or(layers, a.cfg.num_layers);
    a.cfg.channels = parse_int_or(channels, a.cfg.channels);
    a.cfg.num_heads = parse_int_or(heads, a.cfg.num_heads);
    a.cfg.max_seq_len = parse_int_or(max_seq, a.cfg.max_seq_len);
    static char resized[1024];  // the header says the sizes are not the preset's (or file's) own
    if (layers != ARG_NOT_GIVEN || channels != ARG_NOT_GIVEN || heads != ARG_NOT_GIVEN || max_seq != ARG_NOT_GIVEN ||
        vocab != ARG_NOT_GIVEN) {
        snprintf(resized, sizeof(resized), "%s, resized", model);
        a.model_name = resized;
    }
    if (vocab != ARG_NOT_GIVEN) {
        long padded = vocab <= 0 ? vocab : ((long)vocab + 127) / 128 * 128;  // in a long: near INT_MAX it passes an int
        if (padded > INT_MAX) {
            snprintf(msg, sizeof(msg), "--vocab %d: padded to a multiple of 128 it is %ld, more than an int holds: use --vocab <= %d",
                     vocab, padded, INT_MAX / 128 * 128);
            die("%s", msg);
        }
        a.cfg.vocab_size = vocab;
        a.cfg.padded_vocab_size = (int)padded;
    }
    bad = gpt_config_problem(&a.cfg);
    if (bad) die("%s", bad);
    // train_setup's defaults (common/train.c)
    int small = !strcmp(model, "small");
    a.B = batch != ARG_NOT_GIVEN ? batch : (small ? 8 : 4);  // 0 is given, and refused as the chapters do
    a.T = seq != ARG_NOT_GIVEN ? seq : (small ? 256 : (a.cfg.max_seq_len < 64 ? a.cfg.max_seq_len : 64));
    if (a.B < 1) snprintf(msg, sizeof(msg), "--batch %d: give 1 or more sequences a step", a.B), die("%s", msg);
    if (a.T < 1 || a.T > a.cfg.max_seq_len) {
        snprintf(msg, sizeof(msg), "--seq %d: the model's positions are 1 to %d (its maxT; --max-seq sets it)", a.T,
                 a.cfg.max_seq_len);
        die("%s", msg);
    }
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
    if (a.ranks < 1) snprintf(msg, sizeof(msg), "--ranks %d: give 1 or more ranks", a.ranks), die("%s", msg);
    if (world != a.ranks && !do_search) {
        snprintf(msg, sizeof(msg), "--ranks %d: the mesh axes' product is %ld (dp %d x tp %d x pp %d x cp %d x ep %d): give --ranks %ld or other axes",
                 a.ranks, world, mesh[AXIS_DP], mesh[AXIS_TP], mesh[AXIS_PP], mesh[AXIS_CP], mesh[AXIS_EP], world);
        die("%s", msg);
    }
    if (a.steps < 1) die("%s must be >= 1", "--steps");
    // chapter 7 trains dp x ep: a layout with other axes, ZeRO or a
    // pipeline's flags is build/capstone's (the same model), planned as it
    // and said so (--json: its "chapter" stays 7, the model's)
    if (a.chapter == 7 && !a.capstone && !do_search && !a.json &&
        (a.mesh[AXIS_TP] > 1 || a.mesh[AXIS_PP] > 1 || a.mesh[AXIS_CP] > 1 || a.zero > 0 ||
         a.microbatches != ARG_NOT_GIVEN || a.virt != 1)) {
        fprintf(stderr, "note: chapter 7 trains on dp and ep: this layout is build/capstone's, the same model on "
                        "every axis, and is planned as the capstone\n");
        a.capstone = 1;
    }
    // bounded work: plan_run plans every rank's every step
    if ((double)a.ranks * a.steps > PLAN_MAX_RANK_STEPS) {
        snprintf(msg, sizeof(msg), "--steps %d on %d rank(s): the planner plans at most %.0f rank-steps (--ranks x --steps, one by one): give fewer %s",
                 a.steps, a.ranks, PLAN_MAX_RANK_STEPS, a.steps > 1 ? "--steps" : "--ranks");
        die("%s", msg);
    }
    // bounded arithmetic: the figures are size_t products of the sizes, so
    // sizes whose products could pass 2^64 are refused before any is formed.
    // A step's tokens are at most a token file's (an int32 count); the FLOPs,
    // in doubles, bound the activations' elements (a few per FLOP at most)
    double tokens = (double)a.B * a.T, flops = plan_flops(&a.cfg, a.B, a.T, a.cfg.num_layers,
                                                          a.cfg.padded_vocab_size, 1, RECOMPUTE_FULL);
    double params = (double)gpt_num_params(&a.cfg);
    if (a.chapter == 7) {  // chapter 7's experts too (every layer counted: a bound), forward and backward
        double C = a.cfg.channels, H = a.expert_hidden == ARG_NOT_GIVEN || a.expert_hidden == 0 ? 4.0 * C : a.expert_hidden;
        params += (double)a.experts * a.cfg.num_layers * (2.0 * H * C + H + C);
        flops += 6.0 * tokens * a.top_k * a.cfg.num_layers * 2.0 * H * C;
    }
    if (tokens > 2147483646.0 || 16.0 * params + 4.0 * flops > 0x1p62) {
        snprintf(msg, sizeof(msg), "--batch %d x --seq %d tokens a step of this model: the planner's figures could pass 2^62 bytes (%.3g FLOPs a step); plan at most 2^31 - 2 tokens a step, and fewer with a large model",
                 a.B, a.T, flops);
        die("%s", msg);
    }
    a.capacity = capacity;
    if (do_search) {
        char* end = NULL;
        double memory = memory_arg ? strtod(memory_arg, &end) : 0.0;
        if (!memory_arg && profile_path && profile.memory_gb != PT_UNKNOWN) memory = profile.memory_gb * 1e9, end = "";
        if (!memory_arg && !end)
            die("%s: give the bytes a rank may hold, e.g. --memory-per-rank 4000000 (or a --profile with memory_gb)", "--search");
        if (!memory_arg && !(memory > 0)) die("--profile %s: its memory_gb is 0: give --memory-per-rank", profile_path);
        if ((end && *end) || !(memory > 0) || !isfinite(memory))
            die("--memory-per-rank %s: give a positive number of bytes, e.g. 4000000 or 8e9", memory_arg);
        if (a.chapter != -1 && a.chapter != 7)
            die("%s: without --chapter it searches chapters 0 and 2 to 6; --chapter 7 (or capstone) searches chapter 7's model's meshes", "--search");
        // said, not dropped in silence: the list is text, each layout planned for one step
        if (a.json) fprintf(stderr, "note: --json does nothing with --search: the layouts are listed as text\n");
        if (a.steps != 1) fprintf(stderr, "note: --steps does nothing with --search: each layout is planned for one step\n");
        // what the search sets itself, layout by layout: a value given is not the one planned
        static const char* tried[] = {"dp", "tp", "pp", "cp", "ep", "zero", "reshard", "dp-mode", "schedule", "virtual",
                                      "cp-mode"};
        for (size_t k = 0; k < sizeof(tried) / sizeof(tried[0]); k++)
            for (int i = 1; i < argc; i++)
                if (!strncmp(argv[i], "--", 2) && !strcmp(argv[i] + 2, tried[k])) {
                    fprintf(stderr, "note: --%s does nothing with --search: it tries each value itself\n", tried[k]);
                    break;
                }
        search(&a, memory, profile_path ? &profile : NULL);
        return 0;
    }
    if (memory_arg) fprintf(stderr, "note: --memory-per-rank does nothing without --search: the plan's peaks are printed whole\n");
    PlanInfo info;
    PlanFn plan = plan_pick(&a, &info, msg, sizeof(msg));
    if (!plan) die("%s", msg);
    note_other_chapters_flags(argc, argv, a.chapter, chapter_name);
    RankPlan* plans = plan_run(&a, plan, 0);
    StepTime* times = NULL;
    if (profile_path) {  // the step time (plan_time.h): every rank from its plan, the slowest sets the step
        times = calloc((size_t)a.ranks, sizeof(StepTime));
        if (!times) die("%s", "out of memory");
        const char* missing = predict_times(&profile, &a, &info, plans, times, 0);
        if (missing) {  // before any output: a profile short of a figure plans nothing
            snprintf(msg, sizeof(msg), "the profile '%s' has no %s", profile.name, missing);
            die("%s", msg);
        }
    }
    if (a.json) print_json(&a, &info, plans);
    else print_table(&a, &info, plans);
    if (times) {
        int fullest = 0;  // the rank whose peak the device must hold
        for (int r = 1; r < a.ranks; r++)
            if (plan_total(&plans[r], 0) > plan_total(&plans[fullest], 0)) fullest = r;
        plan_time_print(&profile, times, a.ranks, (double)a.B * a.T, plan_total(&plans[fullest], 0), fullest, a.json);
    }
    free(times);
    free(plans);
    return 0;
}
