// plan_time.h: the planner's step-time model (build/plan --profile FILE).
//
// The plan (plan.c) counts what a step does exactly: the bytes of every
// collective per rank and axis. This module turns counts into time with a
// machine profile (a text file of measured or datasheet figures) and a
// roofline model, stated in full in docs/planner.md:
//
//   r        = ranks sharing one device: the ranks on the node when the
//              profile says compute_shared = 1 (CPU: every rank's threads
//              share the node's cores and memory bus), else 1 (a GPU each)
//   s        = element_bytes / 4 (the course moves 4-byte floats; a bf16
//              run moves 2)
//   matmul   = (matmul_flops - rowwise_flops) * r / matmul_gflops
//              + rowwise_flops * r / rowwise_gflops (chapter 7's experts'
//              row-by-row products, ops.h; a profile without the figure
//              prices them at matmul_gflops)
//   attention= attention_flops * r / attention_gflops
//   other    = memory_bytes * s * r / memory_gbps        (memory-bound ops)
//   comm(c,p)= calls * alpha(c,p) + bus_bytes * s / busbw(c,p)
//              alpha and busbw: chapter 1's fit for collective c on p ranks
//              when the profile has it (the nearest p otherwise); else the
//              link model (plan_time_link_seconds): the group's p ranks on
//              n nodes, priced as NCCL prices its algorithms (ring, and for
//              an all-reduce across nodes the tree when it is faster)
//              a point-to-point message: one send (its receive costs
//              nothing more); without a fit or a link figure, the
//              all-to-all's fit on 2 ranks (one message each way)
//   exposed  = comm - min(overlap * hideable, matmul + attention)
//   bubble   = (compute + other) * b / (1 - b)
//   step     = matmul + attention + other + exposed + bubble
//
// hideable is the time of the collectives a chapter starts without waiting
// (chapter 2's overlapped buckets but those the embedding's hook starts at
// backward's end, chapter 3 and 4's (and --sp's) prefetched
// ZeRO-3 gathers but the first); overlap (0..1) is the profile's figure for
// how much of that the machine can run under compute (0 on a CPU, where the
// same cores copy the bytes and MPI progresses only inside its calls).
#ifndef PLAN_TIME_H
#define PLAN_TIME_H

#include <stddef.h>

#include "comm.h"
#include "model.h"

#define PT_MAX_GROUP 64  // largest group size a profile can hold a fit for

// ---------------------------------------------------------------- the machine

// A figure not in the file, or given as "unknown", is PT_UNKNOWN.
#define PT_UNKNOWN (-1.0)

typedef struct {
    char name[128];
    double compute_shared;       // 1: all ranks of a node share one device (CPU); 0: one device per rank
    double ranks_per_node;       // ranks one node holds (the link model: which link a group uses)
    double matmul_gflops;        // the matmul rate the model divides by (per device)
    double rowwise_gflops;       // ops.h's row-by-row products (chapter 7's experts); unknown: matmul_gflops
    double attention_gflops;     // attention, counted as gpt_flops_per_token counts it
    double memory_gbps;          // bytes read plus written per second (copy bandwidth)
    double overlap;              // 0..1: how much hideable communication runs under compute
    double element_bytes;        // bytes per element moved: 4 (fp32, the course) or 2 (bf16)
    double intra_gbps, intra_latency_us;  // the link between ranks of one node, per direction
    double inter_gbps, inter_latency_us;  // between nodes, per rank
    double base_latency_us;               // a collective call's fixed cost (link.base_latency_us)
    double memory_gb;                     // the device's memory, 1e9 bytes (memory_gb): every plan is compared with it
    // chapter 1's alpha-beta fit, per collective and group size
    double alpha_us[NUM_COLLECTIVES][PT_MAX_GROUP + 1];
    double busbw_gbps[NUM_COLLECTIVES][PT_MAX_GROUP + 1];
} MachineProfile;

// Reads a profile file: lines "key = value  # source", value a number or
// "unknown"; blank lines and lines starting with # are skipped. Returns NULL,
// or a message "FILE:LINE: what is wrong" (the caller prints it after
// "error: "). Unknown keys, a line without "=", a value that is not a number
// and a figure out of range are errors; a missing figure is PT_UNKNOWN.
const char* plan_profile_read(const char* path, MachineProfile* p, char* msg, size_t len);

// ---------------------------------------------------------------- the work of a step

// What one rank does in one step. The collectives are the plan's counts
// (comm_stats.h's calls, bytes and bus bytes), each with its group size and
// the share of its calls the chapter starts without waiting.
typedef struct {
    Collective coll;
    int group;
    int nodes;  // the nodes the group's ranks sit on (1 when the profile has no ranks_per_node)
    double calls, bus_bytes;
    double hideable;  // 0..1
} PtColl;

#define PT_MAX_COLLS 64

typedef struct {
    double matmul_flops, attention_flops;  // per rank per step
    double rowwise_flops;                  // of matmul_flops: ops.h's row-by-row products, at rowwise_gflops
    double memory_bytes;                   // of the memory-bound ops, 4-byte elements
    int ranks_on_node;                     // ranks sharing one device when compute_shared
    double bubble;                         // pipeline bubble fraction (0 without a pipeline)
    int n_coll;
    PtColl coll[PT_MAX_COLLS];
} StepWork;

// The chapter facts the FLOPs and the overlap depend on (plain values, so
// this module needs nothing of plan.c's own types).
typedef struct {
    int chapter;           // 0, 2 to 7
    int dp, tp, tp_rank;   // the rank's mesh
    int pp, cp, ep, pp_rank;  // chapters 5 to 7
    double plan_flops;     // chapters 5 to 7: the plan's FLOPs of this rank per step (plan.h's RankPlan)
    double plan_rowwise_flops;  // chapter 7: of those, its experts' row-by-row products (RankPlan.rowwise_flops)
    double bubble;         // chapters 5 and 7: the schedule's bubble fraction (plan.h's PlanInfo)
    double pp_next_share;  // chapters 5 and 7: the share of the rank's pp messages to the next stage (plan_time_rank)
    int B, T;              // global batch, sequence length
    RecomputeMode recompute;
    const char* dp_mode;   // chapter 2
    int zero, prefetch;    // chapters 3 and 4
    int sp;                // chapter 6 --sp: chapter 4's model (ZeRO-3 with prefetch, the vocabulary over tp)
    double early_buckets;  // chapter 2 overlapped: the buckets started before backward ends (plan_early_buckets)
} PtChapter;

// FLOPs and memory-bound bytes of one rank's step (chapters 0, 2, 3, 4):
//   tokens n   = B / dp * T
//   matmul     = 6 n (12 L C^2 / tp + Vl C)       Vl: the rank's vocabulary rows
//   attention  = 12 n L T C / tp                   (gpt_flops_per_token's count)
//   recompute  full: + 2 n 12 L C^2 / tp + 4 n L T C / tp; selective: nothing
//              counted (a GELU again: flash attention keeps its lse)
//   memory     = 4 [n (L (18 C + 20 C / tp) + 4 Vl) + 7 P_opt + P_grad] bytes
// opt_params and grad_params are the floats the rank's AdamW steps and its
// gradient buffer holds (the plan's optimizer bytes / 8, grads bytes / 4).
// Chapters 5 to 7 take the plan's own FLOPs per rank (the schedules, the
// cp split and the experts are the plan's to count) and split them:
//   n tokens   = B / dp * T (5: every stage sees them all), B / (dp cp) * T (6),
//                B / (dp cp ep tp) * T (7: its tp is sequence-parallel
//                attention, a rank's own sequences, so tp = 1 below);
//                Lr layers = L / pp (5, and 7 with --pp), else L
//   attention  = 12 n Lr T C / tp (x 4/3 under full recompute; tp: chapter
//                6's), matmul = the plan's FLOPs - that, and of it
//                rowwise = the plan's row-by-row FLOPs (7: each MoE layer's
//                experts' two forward products and their two input
//                gradients, 8 k H C a token; 12 under full recompute)
//   memory     = as above with n and Lr; Vl = Vp on the rank holding the head
//                (with --pp: the last pp rank), 0 elsewhere
//   bubble     = the plan's (chapter 5, chapter 7 with --pp); no collective
//                of 5 to 7 but --sp's ZeRO-3 gathers (chapter 4's engine)
//                counts as hideable (the model's time is an upper bound
//                there); the tied wte's all-reduce is a group of 2; --sp's
//                Vl its vocabulary rows, as chapter 4's, and its LayerNorms
//                and residual adds on its n / tp tokens (18 C / tp)
// Returns 0 and leaves w alone for a chapter it does not know.
int plan_time_work(const GPTConfig* cfg, const PtChapter* ch, double opt_params, double grad_params,
                   StepWork* w);

// Adds a collective of the plan (calls and bus bytes per step) on a group of
// `group` ranks on `nodes` nodes (on_dp: the data-parallel axis, whose
// collectives alone can be hideable); its hideable share follows the
// chapter (see above).
void plan_time_add_coll(StepWork* w, const PtChapter* ch, Collective coll, int on_dp, int group, int nodes,
                        double calls, double bus_bytes);

// ---------------------------------------------------------------- the link model
// A collective without a fit, priced from the profile's links as NCCL's own
// cost model prices it (NCCL 2.30, src/graph/tuning.cc, ncclTopoTuneModel;
// docs/planner.md derives it). One call moves bus_bytes / calls of the
// plan's bus bytes; p ranks sit on n nodes, k = p / n on each; Li, Le the
// intra- and inter-node latency per step, base the call's fixed cost, bw the
// slowest link a byte crosses (intra on one node, inter across nodes), s the
// element size over 4:
//   ring       base + (steps - inter) Li + inter Le + bus s / bw
//              steps: all-reduce 2(p-1), reduce-scatter and all-gather p-1;
//              inter: the steps that cross nodes, 2(n-1) and n-1
//   tree       all-reduce across nodes only: base + 2 ((k-1) Li + log2(n) Le)
//              + 2 S s / bw, S = bus p / (2(p-1)) the buffer (a chain in
//              each node, a binary tree between them, up then down)
//   broadcast, reduce: base + one latency + bus s / bw (NCCL pipelines them
//              along its ring: the chunks follow each other)
//   all-to-all, send: base + one latency + bus s / bw (the messages of an
//              all-to-all go out at once, one to each peer)
// An all-reduce takes the faster of ring and tree, as NCCL's tuner does.
// *tree (if not NULL) is set to 1 when the tree was the faster.
double plan_time_link_seconds(const MachineProfile* p, Collective c, int group, int nodes, double calls,
                              double bus_bytes, double s, int* tree);

// ---------------------------------------------------------------- the prediction

typedef struct {
    double matmul_ms, attention_ms, other_ms, comm_ms, hidden_ms, exposed_ms, bubble_ms, total_ms;
    int used_link_model;    // some collective had no fit: the link model timed it
    int used_nearest_fit;   // some group size had no fit: the nearest size's was used
    int unknown_latency;    // a latency the link model needed is unknown: taken as 0
    int used_tree;          // the link model priced an all-reduce as a tree (faster than the ring)
    int one_node;           // the link model without ranks_per_node: every group on one node's links
    const char* missing;    // a figure the model needs and the profile lacks, else NULL
} StepTime;

void plan_time_predict(const MachineProfile* p, const StepWork* w, StepTime* t);

// ---------------------------------------------------------------- the planner's hook

// The nodes each counter slot's group spans, per rank, for one mesh (the
// link model's n): filled a slot at a time as the predictions ask, each
// group's members listed once, so a layout of R ranks costs O(R) a slot.
typedef struct {
    int mesh[NUM_AXES], ranks;
    double ranks_per_node;
    int* nodes[COMM_MAX_SLOTS];  // (ranks) or NULL until asked
    int* seen;                   // scratch: one flag a node
} PtNodes;
void plan_time_nodes_init(PtNodes* n, const MachineProfile* p, const int* mesh, int ranks);
void plan_time_nodes_free(PtNodes* n);

// Rank r's prediction from its plan: peak bytes per memory category (the
// AdamW and gradient floats come from them) and its collective counts over
// `steps` steps; nodes holds the mesh (group sizes), the world and the
// nodes each group spans.
void plan_time_rank(const MachineProfile* p, const GPTConfig* cfg, const PtChapter* ch, PtNodes* nodes, int r,
                    const double* peak, const CommCount (*comm)[COMM_MAX_SLOTS], int steps, StepTime* t);

// Prints every rank's prediction (json: one {"type":"plan_time",...}
// record), then the plan's peak (peak bytes on its fullest rank, peak_rank)
// against the device's memory when the profile gives it: a line that says
// whether it fits (json: "device_memory_bytes", "peak_bytes", "fits").
// Returns 1 if the profile lacked a figure the model needed (the error line
// says which).
// The time model's notes that any of n ranks' times needed (the nearest
// size's fit, the link model, an unknown latency, NCCL's tree) into *into;
// and printed, one line each.
void plan_time_add_notes(StepTime* into, const StepTime* t, int n);
void plan_time_print_notes(const StepTime* t);
int plan_time_print(const MachineProfile* p, const StepTime* per_rank, int ranks, double tokens_per_step,
                    double peak, int peak_rank, int json);

// ---------------------------------------------------------------- planner-only presets

// GPT-2 124M, 350M, 1.5B and a Llama-3-8B-like shape in the course's GPT
// architecture; 1 if `name` is one (gpt2-124m, gpt2-350m, gpt2-1.5b,
// llama3-8b-like). Planner-only: the chapters' --model keeps its presets.
int plan_time_preset(const char* name, GPTConfig* cfg);

// build/plan --measure-attention: times attention_flash_forward + backward
// (the chapters' attention) on one device at B x T with C channels over NH
// heads and prints the profile line.
int plan_time_measure_attention(int B, int T, int C, int NH);

#endif
