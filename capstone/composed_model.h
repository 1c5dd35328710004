// composed_model.h: the capstone's model on one rank of the dp x tp x pp x
// cp x ep mesh (or one pipeline chunk of it), the map of capstone/: the
// buffers (the replicated parameters, this rank's experts, its tp slices,
// their gradients and AdamW moments), the slots (what a microbatch keeps
// from its forward to its backward: ExpertSlot) and, file by file,
// what builds and runs them. The layers are the chapters': chapter 7's
// model layout, init and MoE layer (07_expert/moe.h, moe_layer.h), chapter
// 6's sequence-parallel MLP, ring and Ulysses (sequence.h, context.h),
// chapter 3's ZeRO buffers under --zero (zero_buffer.h); the pipeline's chunks
// and their checkpoint slices are composed_stage.h's, the schedule's F, B
// and W on them composed_pipe.h's, the layouts refused composed_rules.h's.
// The step that calls them, in the order it runs them, is capstone/main.c.
#ifndef COMPOSED_MODEL_H
#define COMPOSED_MODEL_H

#include "ckpt.h"
#include "comm.h"
#include "context.h"  // chapter 6's CPMode, CPBalance, cp_parse_flags, and its ring and Ulysses loops (CPAttention)
#include "moe.h"
#include "moe_layer.h"   // chapter 7's MoE layer over ep: MoeParallel, MoeLayer
#include "moe_model.h"  // chapter 7's flags, config checks, checkpoint tensors, --save's gather
#include "ring.h"       // chapter 6's CPShard
#include "run.h"
#include "train_eval.h"
#include "train_loop.h"
#include "wgrad_queue.h"  // --schedule zb: WGradQueue
#include "zero_buffer.h"  // chapter 3's ZeroBuffer: --zero

// Context parallelism (--cp N): chapter 6's token layout and attention over
// the cp group, in every layer's attention half. A cp rank holds T/cp
// positions of each of its B sequences (sh, ring.h: part-major rows); the
// rest of the layer is per token. What each layer's attention keeps for its
// backward is the slot's (ExpertSlot); here chapter 6's exchange buffers.
// cp = 1: sh is every position, nothing else is allocated.
typedef struct {
    CPMode mode;
    CPShard sh;
    const Comm* cpc;                 // the ring / all-to-all group
    CPBuffers buf;                   // chapter 6's: the ring's K/V blocks or the all-to-all's (context.h)
} ExpertCP;

// What one (microbatch, chunk) keeps from its forward to its backward (zb:
// to its W), one type for every slot (expert_slot_create): the GPT's
// activations as --recompute keeps them (the chunk's input in acts.encoded,
// the output's gradient in acts.dres), each MoE layer's routing, plan and
// rows, with --cp each layer's log-sum-exp (the attention's backward needs
// nothing else of the softmax; Ulysses' its head shard's q, k, v and output
// too), with zb the queue its B fills for W. --recompute full keeps only the
// block inputs and makes each layer again just before its backward: one
// layer's MoE and cp state then, the first slot's, shared by every slot.
typedef struct {
    GPTActs acts;
    MoeLayer* layers;          // (Lm, or full 1) chapter 7's, as moe_model_layer indexes them
    float* lse;                // (L or 1, N, NH) each layer's (ulysses: its head shard's, (B, T, NH/cp))
    float *qkv_h, *y_h;        // ulysses: (L or 1, B, T, 3C/cp), (L or 1, B, T, C/cp)
    WGradQueue wq;             // zb: the weight gradients its B queued (composed_wgrad.c)
    int borrowed;              // full: layers, lse, qkv_h, y_h are the first slot's
} ExpertSlot;

// Tensor parallelism with sequence parallelism (--tp N): a tp rank holds
// B/tp whole sequences of its share (its N rows) through every per-token
// part, and meets its tp group in attention and a dense layer's MLP, split
// by heads and hidden units (composed_attention.c; the slices composed_tp.c).
// tp = 1: nothing here is allocated and sh is cp.sh.
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
    // parameters: the replicated ones and my experts (moe.h's two buffers,
    // z[ZERO_SHARED] and z[ZERO_EXPERTS] below); their whole gradients, which
    // the step's groups reduce (NULL under --zero 2, 3: the engine's shards)
    size_t n_shared, n_experts;
    float *dshared, *dexperts;
    // each buffer a ZeroBuffer (chapter 3's, zero_buffer.h) over the ranks
    // holding identical copies of it (DeepSpeed-MoE's layout for the
    // experts), in units of a layer: [wte wpe], each block's piece, [lnfw
    // lnfb]; each MoE layer's experts; each layer's tp slices. --zero 2, 3:
    // the engine holds the buffer, the flat pointers above are NULL and a
    // layer finds its parameters by unit (expert_block_params); refused with
    // the pipeline (composed_rules.c)
    int zero, nz;     // nz: the buffers, 2, or 3 with --tp
    ZeroBuffer z[3];  // [ZERO_EXPERTS], [ZERO_SHARED], [ZERO_TP]
    // what a microbatch keeps: the slot it runs on (composed_pipe.c chooses it)
    ExpertSlot* slot;
    RecomputeMode recompute;
    MoeParallel moe;  // chapter 7's MoE engine over ep
    float* dln2;      // (N, C) an MoE layer's d ln2
    // (2, N) host staging: my rows' inputs, then targets, on their way to the device
    int* rows_host;
    // --pp: a chunk's model; only the first embeds, only the last runs the head
    int embeds, has_head;
    // --schedule zb (composed_wgrad.c): B defers the big matmuls' weight
    // gradients to the slot's queue, which W runs (0: at once)
    int split;
} ExpertModel;

// The capstone's flags, as parsed: chapter 7's (07_expert/moe_model.h) and the composition's.
typedef struct {
    MoeFlags moe;  // --experts, --top-k, --expert-hidden, --moe-every, --aux-coef, --capacity-factor, --ep-overlap
    const char *cp_mode_name, *cp_balance_name;  // --cp-mode, --cp-balance as given
    CPMode cp_mode;                              // parsed by expert_config
    CPBalance cp_balance;
    // --pp with chapter 5's schedules (composed_pipe.h); microbatches
    // ARG_NOT_GIVEN: pp (and no pipeline at pp = 1)
    const char* schedule;
    int microbatches, virtual_chunks;
    int zero;  // --zero: 0, 1 the AdamW moments sharded, 2 the gradients, 3 the parameters (zero_buffer.h)
} ExpertFlags;

// ---------------------------------------------------------------- composed_model.c
// The flags (chapter 7's and the composition's) and run_start; returns 0
// when the program should end at once (--help).
int expert_run_start(Run* run, ExpertFlags* flags, int argc, char** argv);
// The config: the flags, or --model FILE's experts and widths (they win;
// *flags follows), checked against the mesh (composed_rules.h) on every rank.
MoeConfig expert_config(const Run* run, ExpertFlags* flags);
// Where layer l's forward writes (model.h's store and transient, the
// slot's); its MoE layer's state is chapter 7's
// moe_model_layer(&m->moe, m->slot->layers, l).
BlockActs expert_block_acts(ExpertModel* m, int l);
// The parts that work token by token on my rows: the tokens to the device
// and their embeddings (a later pipeline chunk: the tokens only); the final
// LayerNorm, LM head and mean loss (no head: 0); their backwards, into and
// from acts.dres (each nothing where the chunk has no head, no embedding).
void expert_embed_forward(ExpertModel* m, const int* inputs, const int* targets);
float expert_head_forward(ExpertModel* m);
void expert_head_backward(ExpertModel* m);
void expert_embed_backward(ExpertModel* m);
// --zero 2, 3: layer l's units in the three buffers (l = -1 the embedding's
// [wte wpe], l = L the head's [lnfw lnfb] and wte): gather (--zero 3) before
// its forward, open (gathered, gradients zeroed) before its backward,
// reduce (reduce-scattered) after it. Nothing at lower stages.
void expert_units_gather(ExpertModel* m, int l);
void expert_units_open(ExpertModel* m, int l);
void expert_units_reduce(ExpertModel* m, int l);

// ---------------------------------------------------------------- composed_build.c
// This rank's model: its B/(dp ep tp) sequences of the global batch (T/cp
// positions of each), the experts [e0, e0 + E/ep), every buffer allocated
// and counted; a pipeline chunk's (composed_stage.c: cfg its layers),
// embeds and has_head as the fields say (1 and 1: the whole model). Its
// values go in next (composed_stage.c's chunk_create), then
// expert_model_units: each buffer's units; --zero: the engines take the values.
void expert_model_create(ExpertModel* m, const MoeConfig* cfg, const ExpertFlags* flags, const Run* run, int embeds,
                         int has_head);
void expert_model_units(ExpertModel* m);
void expert_model_free(ExpertModel* m);
// A slot of the model (its rows, layers, --recompute, cp mode, split),
// counted; first: the chunk's first slot, whose layer state a slot shares
// under --recompute full (NULL: this is the first). expert_slot_free frees
// the slot and what it owns.
ExpertSlot* expert_slot_create(const ExpertModel* m, const ExpertSlot* first);
void expert_slot_free(const ExpertModel* m, ExpertSlot* s);

// ---------------------------------------------------------------- composed_attention.c
// The attention half of layer l (ln1 to ln2, moe.h) on my N rows: chapter
// 7's own, with --tp around the tp group's heads, at cp > 1 chapter 6's ring
// or Ulysses inside; backward with dln2 and dres as moe_attention_backward.
void expert_attention_forward(ExpertModel* m, int l, const BlockParams* p, BlockActs* a, const float* x);
void expert_attention_backward(ExpertModel* m, int l, const BlockParams* p, BlockParams* g, const BlockActs* a,
                               const BlockScratch* s, const float* x, const float* dln2, float* dres);
// A dense layer (--moe-every > 1): the attention half above and the dense
// MLP (model.h's, with --tp chapter 6's) on my rows (backward: acts.dres
// from d res3 to d x).
void expert_dense_forward(ExpertModel* m, int l, const BlockParams* p);
void expert_dense_backward(ExpertModel* m, int l, const BlockParams* p, BlockParams* g);

// ---------------------------------------------------------------- composed_tp.c
// Layer l's parameters (gradients) with, under --tp, my slices of its split
// tensors; its router (E, C) and the router's gradient.
BlockParams expert_block_params(ExpertModel* m, int l);
BlockParams expert_block_grads(ExpertModel* m, int l);
float* expert_router(ExpertModel* m, int l);
float* expert_router_grad(ExpertModel* m, int l);
// --tp: the slices' buffers. expert_tp_init: my slices' counter-based
// values alone, each tile at its place in the whole model (whole: its
// config), as chapter 4 makes its tiles.
void expert_tp_create(ExpertModel* m, const Run* run);
void expert_tp_init(ExpertModel* m, const GPTConfig* whole, uint64_t seed);
// Local layers [l0, l0 + n) of my slices (values at data, layer l0's first)
// as slices of the checkpoint's global tensors: any tp resumes them.
void expert_tp_ckpt_add(CkptList* out, const ExpertModel* m, CkptKind kind, int l0, int n, float* data);
void expert_tp_free(ExpertModel* m);

// ---------------------------------------------------------------- composed_wgrad.c
// The split backward (--schedule zb, m->split): the big matmuls' weight
// gradients queued in the slot's WGradQueue for W. expert_wgrad_create: a
// slot's queue, sized for every deferred matmul; expert_wgrad: layer l's
// WeightGradHook (model.h), at once or queued; expert_wgrad_hook its fn.
void expert_wgrad_create(WGradQueue* q, const ExpertModel* m);
WeightGradHook expert_wgrad(ExpertModel* m, int layer);
void expert_wgrad_hook(void* ctx, int layer, float* dw, float* db, const float* dout, const float* inp, int N, int C,
                       int OC);

#endif
