// sequence.h: Megatron sequence parallelism (--tp N --sp), chapter 6's
// first strategy, on chapter 4's tensor-parallel engine (04_fsdp_tp/tp.h).
//
// Chapter 4 splits the matmuls over tp but leaves every rank a whole copy of
// the residual stream: the LayerNorms, the residual adds and the embedding
// output run on all B*T tokens on every tp rank, and keep (B,T,C) tensors
// that are the same on every rank. Sequence parallelism (Korthikanti et
// al., "Reducing Activation Recomputation in Large Transformer Models",
// 2022) cuts those parts by tokens instead: tp rank r holds rows
// [r*N/tp, (r+1)*N/tp) of the flattened N = B*T tokens, and chapter 4's
// all-reduces become an all-gather before each column-parallel matmul and a
// reduce-scatter after each row-parallel one. The code is 06_sequence_context/
// sequence.c, with every collective written where it happens; the chapter's
// main.c drives its step (sp_forward, sp_backward, sp_optimizer_step) from
// the same training loop as context parallelism's.
#ifndef SEQUENCE_H
#define SEQUENCE_H

#include "ckpt.h"
#include "report.h"
#include "ring.h"  // CPShard: a tp group's rows under context parallelism
#include "tp.h"
#include "run.h"
#include "train.h"

typedef struct {
    TPModel m;        // chapter 4's engine: shard layout, FSDP over dp, embedding, head, step
    int N, Nl, n0;    // tokens of the dp group's batch; this rank's are rows [n0, n0 + Nl)
    int zero, prefetch, reshard;  // FSDP over dp, as chapter 3's flags
    RecomputeMode recompute;
    size_t numel[3];  // floats of a layer's shard, of its slices, and of the transient
    float* shards;    // L * numel[IN_SHARD]: what each layer keeps of its own tokens
    float* slices;    // L * numel[IN_SLICES]: each layer's tensor-parallel slices (NULL if none)
    float* transient; // numel[IN_TRANSIENT], shared by every layer (NULL for --recompute none)
    float* x0;        // (Nl,C) the embedding's output, this rank's tokens
    float* dres;      // (Nl,C) the residual stream's gradient, this rank's tokens
    float* dln;       // (Nl,C) a LayerNorm output's gradient, this rank's tokens
    // two (N,C) buffers of every token, chapter 4's m.encoded and m.dres
    // (no layer keeps them):
    float* full;      // forward: an all-gathered LayerNorm output, then a
                      // row-parallel matmul's partial output before its reduce-scatter
    float* dfull;     // backward: an all-gathered output gradient, then a
                      // LayerNorm output all-gathered again for a weight gradient
    // what the allocator counted, in bytes: chapter 4's block activations
    // (tp_create's) and this chapter's two parts of them
    size_t ch4_block_bytes, shard_bytes, slice_bytes;
} SP;

// The rank's state on the run's dp x tp mesh (tp inner), B/dp sequences of
// the global batch per dp rank (its tp group shares them). FSDP over dp as in chapter 4: ZeRO stage
// `zero`, prefetch and reshard as chapter 3. Bad input (a cp axis, B*T not
// divisible by tp, a mesh the model cannot split) ends every rank with one
// message: sp_mesh_problem's, which the planner asks too (NULL, or the
// message in msg).
void sp_create(SP* s, const Run* run, int zero, int prefetch, int reshard);
const char* sp_mesh_problem(const GPTConfig* cfg, int B, int T, int dp, int tp, int cp, char* msg, size_t len);
void sp_free(SP* s);
// The start-up lines: the mesh, what a layer keeps against chapter 4.
void sp_print_setup(const SP* s, const Run* run);

// One step, in three calls. Forward returns the loss of this rank's dp
// group's batch (the same on every tp rank); backward leaves the gradients
// reduced over tp and, with ZeRO > 1, reduce-scattered over dp;
// sp_optimizer_step (step from 0) finishes the reduction, clips and takes
// the AdamW step, and returns the global gradient norm.
float sp_forward(SP* s, const int* inputs, const int* targets);
void sp_backward(SP* s);
float sp_optimizer_step(SP* s, const TrainArgs* args, int step);

// 1 on every rank iff, after this backward's reductions, every tp rank holds
// bit-identical LayerNorm weight gradients. Plain MPI, uncounted.
int sp_layernorm_grads_agree(const SP* s);
// A TrainValLoss (train_loop.h): ctx is the SP.
float sp_val_loss(void* ctx, const TrainSetup* setup, int n_batches);
// The training-state checkpoint's lists: chapter 4's (the same tiles over
// the same FSDP), so any chapter's mesh resumes them.
void sp_ckpt(Ckpt* ck, SP* s);
// The summary's fields of sequence parallelism.
void sp_summary(const SP* s, JsonBuf* extra);
// After training: checks that every tp rank holds the same replicated
// tensors, prints it and ln_agree (every step's sp_layernorm_grads_agree),
// then --sample / --save from the whole model assembled on rank 0. Returns
// the exit code: 0, or 1 when a check failed.
int sp_finish(SP* s, const TrainArgs* args, int ln_agree);

// ---------------------------------------------------------------- pieces another program composes
// Megatron's sequence-parallel attention and MLP halves and column-parallel
// backward, for any program whose tp rank holds Nl token rows of its tp
// group's Nl tp (this chapter's block; the capstone's layers under --tp,
// capstone/composed_attention.c). They take the tp group, explicit buffers
// and row counts; every collective is in them. Group rows are in tp rank
// order (the MLP works row by row, so any order of the group's rows is as
// good; attention's may be regrouped: SpAttention's order).

// Attention itself on the group's rows, between qkv and attproj: forward
// a->qkv (Nl tp, 3C/tp) into a->atty (Nl tp, C/tp); backward datty into
// dqkv (zero on entry). The capstone's is chapter 6's ring or Ulysses over
// a cp group, with each layer's own kept state (hence the layer).
typedef struct {
    void (*forward)(void* ctx, int layer, BlockActs* a);
    void (*backward)(void* ctx, int layer, const BlockActs* a, const float* datty, float* dqkv);
    void* ctx;
    int layer;
} AttentionCore;

// The tp group as the attention half sees it, made for the call.
typedef struct {
    const Comm* tp;
    int Nl, T, C, NH;           // my token rows; the sequences' length; the model's channels and heads
    float *full, *dfull;        // (Nl tp, C) each: scratch
    const CPShard* order;       // my rows' layout under --cp: zigzag's are regrouped for attention
                                // (cp_shard_regroup); NULL or one part: in tp rank order
    const AttentionCore* core;  // NULL: chapter 0's flash attention on the group's Nl tp / T sequences
    const WeightGradHook* wg;   // the weight gradients at once (NULL) or handed on (model.h)
} SpAttention;

// x (Nl, C): my rows of the block's input; into a->res2 (Nl, C) my rows of
// x + attention, through a->ln1, a->attproj (Nl, C) my rows and a->qkv,
// a->atty, a->lse (Nl tp, 3C/tp, C/tp, NH/tp): every row, my NH/tp heads.
// p: my slices qkvw (3C/tp, C), qkvb (3C/tp), attprojw (C, C/tp);
// attprojb, ln1w, ln1b whole.
void sp_attention_forward(const SpAttention* v, const BlockParams* p, BlockActs* a, const float* x);
// dres (Nl, C): my rows of d res2 on entry, of d x on return. Gradients
// accumulate into g (g->attprojb NULL: the caller's); sc->datty, sc->dqkv
// (Nl tp rows) and dln (Nl, C): scratch.
void sp_attention_backward(const SpAttention* v, const BlockParams* p, BlockParams* g, const BlockActs* a,
                           const BlockScratch* sc, const float* x, float* dres, float* dln);

// a->ln2 (Nl, C): my rows of ln2's output; into a->fcproj (Nl, C) my rows of
// the MLP's output (summed over tp, fcprojb added once), through a->fch and
// a->fch_gelu (Nl tp, 4C/tp): every row of the group, my 4C/tp hidden units.
// p: my slices fcw (4C/tp, C), fcb (4C/tp), fcprojw (C, 4C/tp); fcprojb whole.
// full (Nl tp, C): scratch.
void sp_mlp_forward(const Comm* tp, const BlockParams* p, BlockActs* a, float* full, int Nl, int C);
// dout (Nl, C): my rows of d a->fcproj; WRITES my rows of d ln2 into dln
// (Nl, C). Gradients accumulate into g (g->fcprojb NULL: the caller's);
// dfch_gelu, dfch (Nl tp, 4C/tp), dpartial and dfull (Nl tp, C): scratch.
void sp_mlp_backward(const Comm* tp, const BlockParams* p, BlockParams* g, const BlockActs* a, float* dln,
                     const float* dout, float* dfch_gelu, float* dfch, float* dpartial, float* dfull, int Nl, int C,
                     const WeightGradHook* wg);
// The backward of a column-parallel matmul out (Nl tp, OC) = in @ w^T + b
// whose input is the all-gather of my kept rows in_shard (Nl, C): from dout
// (Nl tp, OC) accumulates dw, db and WRITES my rows of d in into dshard
// (Nl, C). dpartial, gathered (Nl tp, C): scratch (gathered: in of every row).
void sp_column_parallel_backward(const Comm* tp, float* dw, float* db, float* dshard, const float* dout,
                                 const float* in_shard, const float* w, float* dpartial, float* gathered, int Nl, int C,
                                 int OC, const WeightGradHook* wg);

#endif
