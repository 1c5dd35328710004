// plan.h: the planner's question and answer, shared by build/plan's main
// (tools/plan/plan.c) and the chapter planners: plan_dense.c (chapters 0,
// 2, 3, 4), plan_pipeline.c (5), plan_context.c (6), plan_expert.c (7).
// A planner fills one rank's RankPlan for one step; plan.c runs it for every
// rank and --steps steps, feeding the comm layer's own counters.
#ifndef PLAN_H
#define PLAN_H

#include <stddef.h>

#include "comm.h"
#include "memory.h"
#include "mesh.h"
#include "model.h"
#include "schedule.h"  // chapter 5's lists (chapters 5 and 7 plan them)

// ---------------------------------------------------------------- the question

typedef struct {
    int chapter, ranks, steps, json;
    int capstone;             // --chapter capstone: chapter 7's model on every axis (build/capstone), named so
    GPTConfig cfg;
    const char* model_name;
    int B, T;                 // global batch, sequence length
    int mesh[NUM_AXES];
    RecomputeMode recompute;
    const char* dp_mode;      // chapter 2
    int bucket_kb, accum;     // chapter 2
    int zero, prefetch, reshard;  // chapters 3, 4 (and 6's --sp, ZeRO-3 over dp)
    const char* schedule;     // chapter 5: gpipe | 1f1b | interleaved | zb
    int microbatches, virt;   // chapter 5: --microbatches (ARG_NOT_GIVEN: pp), --virtual
    int sp;                   // chapter 6: --sp (sequence parallelism on tp)
    const char* cp_mode;      // chapter 6: ring | ulysses
    const char* cp_balance;   // chapter 6: none | zigzag
    int experts, top_k;       // chapter 7
    int expert_hidden, moe_every;  // chapter 7 (expert_hidden ARG_NOT_GIVEN: 4C)
    double capacity;          // chapter 7: --capacity-factor (0: the chapter's default)
    int ep_overlap;           // chapter 7: --ep-overlap, chunks per exchange
} PlanArgs;

// What one rank allocates at peak (bytes per category) and what it sends:
// the comm layer's own counters (comm_stats.h), fed the calls the chapter
// makes on a group of the right size. Where the run's figure depends on
// timing or on the data (ranged[c] set), peak[c] is the most the run can
// reach and low[c] the least; elsewhere the run's figure equals peak[c].
// flops: the matmul and attention FLOPs of one step on this rank (forward,
// backward, and the forward again that --recompute full runs).
typedef struct {
    double peak[MEM_NUM_CATEGORIES];
    double low[MEM_NUM_CATEGORIES];
    int ranged[MEM_NUM_CATEGORIES];
    CommCount comm[NUM_COLLECTIVES][COMM_MAX_SLOTS];
    double flops;
    double rowwise_flops;  // of flops: ops.h's row-by-row products (chapter 7's experts, plan_expert.c)
} RankPlan;

// What a whole plan shares: the pipeline's bubble fraction (chapter 5; 0
// elsewhere), and which communication figures are bounds (chapter 7's
// all-to-all bytes depend on the routing): comm_bound set, each rank's
// bytes and bus bytes are at most the plan's (its calls equal), and where
// comm_sum is not 0 the bytes summed over ranks and --steps equal it.
typedef struct {
    double bubble;
    const char* bubble_how;  // how it was found, for the table
    int comm_bound[NUM_COLLECTIVES][COMM_MAX_SLOTS];
    double comm_sum[NUM_COLLECTIVES][COMM_MAX_SLOTS];
} PlanInfo;

typedef void (*PlanFn)(const PlanArgs*, RankPlan*, int);

// A group of `size` ranks on counter slot `axis` (an axis, or a named
// group's slot from comm_slot_for), as the counters see it: no MPI.
Comm plan_group(int axis, int size, int rank);
// Chapter 2's buckets of bucket_kb KiB (cut from the buffer's end) that lie
// wholly above block 0, so a block's hook starts them before backward ends
// (its summary's early_buckets_per_step): the others hold wte or wpe.
double plan_early_buckets(const GPTConfig* cfg, int bucket_kb);
// This rank's coordinate on every axis of the mesh a->mesh.
void plan_coords(const PlanArgs* a, int r, int coord[NUM_AXES]);
// The bytes gpt_acts_create_recompute allocates (model.c) for B x T tokens.
double plan_acts_bytes(const GPTConfig* cfg, int B, int T, RecomputeMode mode);
// The matmul and attention FLOPs of forward + backward of `layers` blocks
// and an LM head of head_rows vocabulary rows (0: none) over B sequences of
// T tokens, each block's matmuls and heads split `split` ways (tp); --recompute
// full adds the blocks' forward again. With every layer, Vp rows and no
// split it is B T gpt_flops_per_token (model.c).
double plan_flops(const GPTConfig* cfg, double B, int T, int layers, int head_rows, int split, RecomputeMode mode);
// Chapter 3's engine (03_fsdp/fsdp.c) on n units of numel[i] floats over
// the dp group: its parameter, gradient and AdamW bytes, and one step's
// gathers and reduce-scatters. head_first: chapter 4's backward order.
void plan_fsdp(const PlanArgs* a, RankPlan* p, const Comm* dp, const size_t* numel, int n, int head_first);
// The norm's device scalars, kept for the run (16 bytes of "other").
void plan_norm_scalars(RankPlan* p);
// The norm: its scalars, and one all-reduce of a float per group.
void plan_norm(RankPlan* p, const Comm* const* groups, int n);
// tp rank r's rows of the padded vocabulary (04_fsdp_tp/tp.c's tp_vocab_rows).
int plan_vocab_rows(const GPTConfig* cfg, int tp, int r);

// The chapters' planners: rank r's plan of one step.
void plan_chapter_0(const PlanArgs* a, RankPlan* p, int r);
void plan_chapter_2(const PlanArgs* a, RankPlan* p, int r);
void plan_chapter_3(const PlanArgs* a, RankPlan* p, int r);
void plan_chapter_4(const PlanArgs* a, RankPlan* p, int r);
void plan_chapter_5(const PlanArgs* a, RankPlan* p, int r);
void plan_chapter_6(const PlanArgs* a, RankPlan* p, int r);
void plan_chapter_7(const PlanArgs* a, RankPlan* p, int r);
// Chapter 7's and the capstone's model: every parameter, the experts' too.
size_t plan_expert_params(const PlanArgs* a);

// The checks each chapter makes of its flags and mesh: NULL, or the
// problem in msg. Fill info (the bubble, the bounded figures).
const char* plan_check_pipeline(const PlanArgs* a, PlanInfo* info, char* msg, size_t len);
const char* plan_check_context(const PlanArgs* a, PlanInfo* info, char* msg, size_t len);
const char* plan_check_expert(const PlanArgs* a, PlanInfo* info, char* msg, size_t len);

// The pipeline's lists (chapter 5's schedules, used by chapters 5 and 7):
// built and validated for a->mesh's pp, m microbatches, a->virt chunks and
// a->schedule, with the bubble into info; then the lists, the most send
// buffers stage s holds at once, and stage s's messages of one step (each
// `floats` long) tallied on the pp axis; the share of them that go to the
// next stage (F's outputs; the rest, B's input gradients, to the stage
// before), for the time model's links (0 when the stage sends nothing).
const char* plan_pipeline_lists(const PlanArgs* a, int m, PlanInfo* info, char* msg, size_t len);
const Schedule* plan_pipeline_schedule(void);
int plan_pipeline_sends_most(int stage);
void plan_pipeline_messages(int pp, int s, size_t floats);
double plan_pipeline_next_share(int stage);

#endif
