// composed_model.h: the map of capstone/. The model on one rank of the
// dp x tp x pp x cp x ep mesh (or one pipeline chunk of it): its buffers
// (replicated parameters, my experts, my tp slices, as chapter 3's
// ZeroBuffers), its slots (what a microbatch keeps from forward to
// backward), and file by file what builds and runs them. The layers are the
// chapters': chapter 7's MoE model and layer (moe.h, moe_layer.h), chapter
// 6's Megatron halves, ring and Ulysses (sequence.h, context.h). A rank's
// chunks, the schedule and the step around its actions are composed_pipe.h's
// (set up, checkpointed and freed by composed_stage.c), the refused layouts
// composed_rules.h's; the step, in run order, the schedule's actions
// included, main.c.
#ifndef COMPOSED_MODEL_H
#define COMPOSED_MODEL_H

#include "ckpt.h"
#include "comm.h"
#include "context.h"  // chapter 6's CPMode, CPBalance, cp_parse_flags, and its ring and Ulysses loops (CPAttention)
#include "moe.h"
#include "moe_layer.h"   // chapter 7's MoE layer over ep: MoeParallel, MoeLayer
#include "moe_model.h"  // chapter 7's flags, config checks, checkpoint tensors, --save's gather
#include "pipeline.h"   // chapter 5's Piece, SlotPool
#include "ring.h"       // chapter 6's CPShard
#include "run.h"
#include "train_eval.h"
#include "train_loop.h"
#include "wgrad_queue.h"  // --schedule zb: WGradQueue
#include "zero_buffer.h"  // chapter 3's ZeroBuffer: --zero

// --cp N: a rank holds T/cp positions of each of its B sequences (sh,
// ring.h); attention meets the cp group by chapter 6's ring or Ulysses, in
// its exchange buffers. cp = 1: sh is every position, nothing allocated.
typedef struct {
    CPMode mode;
    CPShard sh;
    const Comm* cpc;                 // the ring / all-to-all group
    CPBuffers buf;                   // chapter 6's: the ring's K/V blocks or the all-to-all's (context.h)
} ExpertCP;

// What one (microbatch, chunk) keeps from its forward to its backward (zb:
// to its W): the GPT's activations as --recompute keeps them (the input in
// acts.encoded, the output's gradient in acts.dres), each MoE layer's
// routing and rows, with --cp each layer's log-sum-exp (Ulysses: its head
// shard's q, k, v, output too), with zb the queue B fills for W.
// --recompute full remakes each layer just before its backward, so one
// layer's MoE and cp state, the first slot's, serves every slot.
// expert_slot_create's first: that slot (NULL: this is the first).
typedef struct {
    GPTActs acts;
    MoeLayer* layers;          // (Lm, or full 1) chapter 7's, as moe_model_layer indexes them
    float* lse;                // (L or 1, N, NH) each layer's (ulysses: its head shard's, (B, T, NH/cp))
    float *qkv_h, *y_h;        // ulysses: (L or 1, B, T, 3C/cp), (L or 1, B, T, C/cp)
    WGradQueue wq;             // zb: the weight gradients its B queued (composed_wgrad.c)
    int borrowed;              // full: layers, lse, qkv_h, y_h are the first slot's
} ExpertSlot;

// --tp N with sequence parallelism: a rank holds B/tp whole sequences of its
// share through the per-token parts and meets its tp group in attention and
// a dense MLP, split by heads and hidden units (composed_attention.c; the
// slices composed_tp.c). tp = 1: nothing allocated, sh is cp.sh.
typedef struct {
    int tp, rank;
    const Comm* tpc;         // the all-gather / reduce-scatter group
    const Comm* dpcpep;      // the copies of my slices: dp x cp x ep
    Comm dpcpep_own;
    CPShard sh;              // attention's layout: the tp group's B tp sequences (cp.sh: my B)
    size_t n;                // floats of my slices: moe_tp_offset(L), (4C^2 + 3C) / tp a layer, + (8C^2 + 4C) / tp dense
    float* dw;               // z[ZERO_TP]'s gradient; per layer qkvw (3C/tp, C) qkvb (3C/tp) attprojw (C, C/tp) [fcw (4C/tp, C) fcb fcprojw (C, 4C/tp)]
    float *full, *dfull;     // (N tp, C) every row of the group: a gathered LayerNorm output, a partial sum
} ExpertTP;

enum { ZERO_EXPERTS, ZERO_SHARED, ZERO_TP };  // the model's buffers, in ExpertModel.z
typedef struct {
    MoeConfig cfg;
    int B, T, N;           // this rank's sequences (B/tp of its share's), its positions of each (T/cp), B*T token rows
    int share;             // my sequences of the global batch: [share B, (share + 1) B)
    int ep, E_local, e0;   // ep ranks; my experts are [e0, e0 + E_local)
    Comm batch;            // every rank that holds the replicated parameters: dp x cp x ep (x tp),
                           // each with its own tokens of the global batch
    const Comm *world, *dp, *epc;  // world: rank 0 writes the file
    const Comm* dpcp;      // the copies of my experts: dp x cp x tp (= dp when cp = tp = 1)
    Comm dpcp_own;         // that group, made when cp > 1 or tp > 1
    ExpertCP cp;
    ExpertTP tp;
    // the whole gradients the step's groups reduce (NULL under --zero 2, 3)
    size_t n_shared, n_experts;
    float *dshared, *dexperts;
    // each buffer a ZeroBuffer (chapter 3's) over the ranks holding copies
    // of it (DeepSpeed-MoE's layout for the experts), in units of a layer:
    // [wte wpe], each block's piece, [lnfw lnfb]; each MoE layer's experts;
    // each layer's tp slices. A layer finds its parameters by unit
    // (expert_block_params)
    int zero, nz;     // nz: the buffers, 2, or 3 with --tp
    ZeroBuffer z[3];  // [ZERO_EXPERTS], [ZERO_SHARED], [ZERO_TP]
    ExpertSlot* slot;  // the slot of the microbatch it runs on (main.c's F and B point it there)
    RecomputeMode recompute;
    MoeParallel moe;  // chapter 7's MoE engine over ep
    float* dln2;      // (N, C) an MoE layer's d ln2
    int* rows_host;   // (2, N) host: my rows' inputs, then targets
    int embeds, has_head;  // --pp: only the first chunk embeds, only the last has the head
    int moe0;              // --pp: the whole model's MoE layers before this chunk's first
    Piece piece[3];        // chapter 5's: the chunk's ranges of the whole model's replicated
    int n_pieces;          // buffer (chunk_pieces, composed_stage.c)
    SlotPool pool;         // chapter 5's: which ExpertSlot holds which microbatch, made as the list needs them
    int split;  // --schedule zb: B queues the big weight gradients for W (composed_wgrad.c)
} ExpertModel;

// The capstone's flags, as parsed: chapter 7's (07_expert/moe_model.h) and the composition's.
typedef struct {
    MoeFlags moe;  // --experts, --top-k, --expert-hidden, --moe-every, --aux-coef, --capacity-factor, --ep-overlap
    const char *cp_mode_name, *cp_balance_name;  // --cp-mode, --cp-balance as given
    CPMode cp_mode;                              // parsed by expert_config
    CPBalance cp_balance;
    const char* schedule;              // chapter 5's
    int microbatches, virtual_chunks;  // microbatches ARG_NOT_GIVEN: pp
    int zero;  // --zero: 0, 1 the AdamW moments sharded, 2 the gradients, 3 the parameters (zero_buffer.h)
} ExpertFlags;

// ---------------------------------------------------------------- composed_model.c
// The flags and run_start; 0: end at once (--help).
int expert_run_start(Run* run, ExpertFlags* flags, int argc, char** argv);
// The config: the flags, or --model FILE's (they win), checked against the
// mesh (composed_rules.h) on every rank.
MoeConfig expert_config(const Run* run, ExpertFlags* flags);
// Where layer l's forward writes, in the slot it runs on.
BlockActs expert_block_acts(ExpertModel* m, int l);
// The per-token ends on my rows: the tokens to the device and (the first
// chunk) their embeddings; the final LayerNorm, LM head and mean loss (no
// head: 0); their backwards, from and into acts.dres.
void expert_embed_forward(ExpertModel* m, const int* inputs, const int* targets);
float expert_head_forward(ExpertModel* m);
void expert_head_backward(ExpertModel* m);
void expert_embed_backward(ExpertModel* m);
// --zero 2, 3: layer l's units in the three buffers (l = -1 [wte wpe], l = L
// [lnfw lnfb] and wte): gather (3) before its forward, open (gathered,
// gradients zeroed) before its backward, reduce-scatter after it.
void expert_units_gather(ExpertModel* m, int l);
void expert_units_open(ExpertModel* m, int l);
void expert_units_reduce(ExpertModel* m, int l);

// ---------------------------------------------------------------- composed_build.c
// A chunk's model (cfg its layers; run its microbatch's): its B/(m dp ep tp)
// sequences (T/cp positions of each), the experts [e0, e0 + E/ep), every
// buffer allocated and counted. Its values go in next (chunk_create), then
// expert_model_units: each buffer's units (--zero: the engines take the values).
void expert_model_create(ExpertModel* m, const MoeConfig* cfg, const ExpertFlags* flags, const Run* run, int embeds,
                         int has_head);
void expert_model_units(ExpertModel* m);
void expert_model_free(ExpertModel* m);
// A slot of the model, counted (first: see ExpertSlot).
ExpertSlot* expert_slot_create(const ExpertModel* m, const ExpertSlot* first);
void expert_slot_free(const ExpertModel* m, ExpertSlot* s);

// ---------------------------------------------------------------- composed_attention.c
// Layer l's attention half (ln1 to ln2, moe.h) on my N rows: chapter 7's,
// with --tp chapter 6's over the tp group's heads, with --cp its ring or
// Ulysses inside; backward's dln2 and dres as moe_attention_backward's.
void expert_attention_forward(ExpertModel* m, int l, const BlockParams* p, BlockActs* a, const float* x);
void expert_attention_backward(ExpertModel* m, int l, const BlockParams* p, BlockParams* g, const BlockActs* a,
                               const BlockScratch* s, const float* x, const float* dln2, float* dres);
// A dense layer's MLP (--moe-every > 1), with --tp chapter 6's: ln2 to
// fcproj; backward acts.dres (d res3) to m->dln2.
void expert_mlp_forward(ExpertModel* m, const BlockParams* p, BlockActs* a);
void expert_mlp_backward(ExpertModel* m, int l, const BlockParams* p, BlockParams* g, const BlockActs* a,
                         const BlockScratch* s);

// ---------------------------------------------------------------- composed_tp.c
// Layer l's parameters (gradients), under --tp with my slices; its router (E, C).
BlockParams expert_block_params(ExpertModel* m, int l);
BlockParams expert_block_grads(ExpertModel* m, int l);
float* expert_router(ExpertModel* m, int l);
float* expert_router_grad(ExpertModel* m, int l);
// --tp: the slices' buffers; their counter-based values, each of chapter
// 4's tiles at its place in the whole model (whole: its config).
void expert_tp_create(ExpertModel* m, const Run* run);
void expert_tp_init(ExpertModel* m, const GPTConfig* whole, uint64_t seed);
// Local layers [l0, l0 + n) of my slices (at data) as slices of the
// checkpoint's global tensors: any tp resumes them.
void expert_tp_ckpt_add(CkptList* out, const ExpertModel* m, CkptKind kind, int l0, int n, float* data);
void expert_tp_free(ExpertModel* m);

// ---------------------------------------------------------------- composed_wgrad.c
// --schedule zb (m->split): a slot's queue, sized for every deferred
// matmul; layer l's WeightGradHook (model.h), at once or queued for W.
void expert_wgrad_create(WGradQueue* q, const ExpertModel* m);
WeightGradHook expert_wgrad(ExpertModel* m, int layer);

#endif
