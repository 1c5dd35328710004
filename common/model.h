// model.h: the GPT-2 model: a block's parameters, activations and passes,
// and the whole model's forward and backward, composed from the ops of
// ops.h (model.c). The config and the flat parameter layout: model_layout.h;
// init: init.h; llm.c's model file: model_file.h.
#ifndef MODEL_H
#define MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "model_layout.h"
#include "ops.h"

// One block's parameters (or gradients), pointing into a contiguous range of
// gpt_block_numel(C) floats wherever it lives: the full model, an FSDP gather
// buffer, a pipeline stage's own layers. (A tensor-parallel rank's shard of
// the block, model_tp.h, is the same layout with narrower matrices.)
typedef struct {
    float *ln1w, *ln1b;          // (C), (C)
    float *qkvw, *qkvb;          // (3C, C), (3C)
    float *attprojw, *attprojb;  // (C, C), (C)
    float *ln2w, *ln2b;          // (C), (C)
    float *fcw, *fcb;            // (4C, C), (4C)
    float *fcprojw, *fcprojb;    // (C, 4C), (C)
} BlockParams;
BlockParams block_params_at(float* base, int C);

// ---------------------------------------------------------------- activations
// What one block saves in forward for backward. Sizes for B sequences of T tokens.
typedef struct {
    float *ln1, *ln1_mean, *ln1_rstd;  // (B,T,C), (B,T), (B,T)
    float* qkv;                        // (B,T,3C)
    float* atty;                       // (B,T,C) attention output, heads side by side
    float* lse;                        // (B,T,NH) log-sum-exp of each (token, head)'s softmax:
                                       // with atty, all backward needs (ops.h's flash op)
    float* attproj;                    // (B,T,C)
    float* res2;                       // (B,T,C) x + attproj
    float *ln2, *ln2_mean, *ln2_rstd;  // (B,T,C), (B,T), (B,T)
    float* fch;                        // (B,T,4C)
    float* fch_gelu;                   // (B,T,4C)
    float* fcproj;                     // (B,T,C)
    float* res3;                       // (B,T,C) the block's output
} BlockActs;
size_t block_acts_numel(int B, int T, int C, int NH);  // B*T*(18C + NH + 4)
BlockActs block_acts_at(float* base, int B, int T, int C, int NH);

// Gradient buffers a block's backward needs, reused by every layer
// (block_backward lays its stash over them; the input half alone uses only
// dfch_gelu and datty; head_backward takes dln).
typedef struct {
    float* dln;       // (B,T,C)  d of a LayerNorm output
    float* dqkv;      // (B,T,3C)
    float* datty;     // (B,T,C)
    float* dfch;      // (B,T,4C)
    float* dfch_gelu; // (B,T,4C)
} BlockScratch;
size_t block_scratch_numel(int B, int T, int C, int NH);  // B*T*13C
BlockScratch block_scratch_at(float* base, int B, int T, int C, int NH);

// The block: x (B,T,C) -> a->res3 (B,T,C).
void block_forward(const BlockParams* p, BlockActs* a, const float* x,
                   int B, int T, int C, int NH);
// dres (B,T,C): on entry d loss / d block output; on return d loss / d x.
// Parameter gradients are accumulated into g. This is the two halves below
// called in a row, with the stash laid over the scratch s.
void block_backward(const BlockParams* p, BlockParams* g, const BlockActs* a,
                    const BlockScratch* s, const float* x, float* dres,
                    int B, int T, int C, int NH);

// ---------------------------------------------------------------- backward in two halves
// Backward is two jobs: the input gradient (d x, which the layer below waits
// for) and the weight gradients (which nobody waits for until the optimizer
// step). A zero-bubble pipeline runs the first at once and the second later,
// possibly several microbatches later, with other layers' backward in
// between. The input half leaves in a stash what the weight half needs that
// is neither a parameter nor a forward activation: the gradient at the output
// of each of the block's four matmuls and two LayerNorms. Each weight
// gradient is one reduction over the tokens of (that gradient) x (a forward
// activation), so nothing smaller than these d-outputs can stand in for them
// without recomputing a matmul.
//   stash: 11C floats per token, i.e. B*T*11C per layer per microbatch
//   (beside the block's activations, B*T*(18C + NH + 4)).
typedef struct {
    float* dfcproj;   // (B,T,C)  d fcproj output = d res3 (dres on entry)
    float* dfch;      // (B,T,4C) d fc output (d of the GELU input)
    float* dln2;      // (B,T,C)  d ln2 output
    float* dattproj;  // (B,T,C)  d attproj output = d res2
    float* dqkv;      // (B,T,3C) d qkv output
    float* dln1;      // (B,T,C)  d ln1 output
} BlockStash;
size_t block_stash_numel(int B, int T, int C);  // B*T*11C
BlockStash block_stash_at(float* base, int B, int T, int C);

// Input half: dres (B,T,C) from d block output to d x, exactly as
// block_backward; writes every field of st and no parameter gradient. Reads
// p, x and, of a, qkv, atty, lse, res2, fch and the four LayerNorm statistics
// (the weight gradients' own inputs it leaves alone). Uses only
// s->dfch_gelu and s->datty of the scratch (5C per token),
// which may be shared by every layer; the stash must be this (layer,
// microbatch)'s own until its weight half has run. (It is done with
// s->dfch_gelu before it writes dfcproj, dln2, dattproj or dln1, so those
// four may lie inside s->dfch_gelu: block_backward relies on this.)
void block_backward_input(const BlockParams* p, const BlockActs* a, const BlockScratch* s,
                          BlockStash* st, const float* x, float* dres,
                          int B, int T, int C, int NH);
// Weight half: accumulates all 12 parameter gradients of the block into g,
// bit-identical to block_backward's, from the stash and, of the forward, x
// and a's ln1, ln1_mean, ln1_rstd, atty, res2, ln2, ln2_mean, ln2_rstd,
// fch_gelu (9C + 4 floats per token, which must still hold this
// microbatch's forward). Needs no parameter: an FSDP rank runs it without
// gathering the block.
void block_backward_weights(BlockParams* g, const BlockActs* a, const BlockStash* st,
                            const float* x, int B, int T, int C);

// One matmul's weight gradient, dw (OC, C) += dout^T inp and db (OC) += the
// rows' sum of dout, handed to fn instead of computed at once: the
// capstone's zero-bubble W queues it with a copy of the rows. Chapter 6's
// Megatron MLP and chapter 7's MoE layer take one (NULL or fn NULL: at once).
typedef struct {
    void (*fn)(void* ctx, int layer, float* dw, float* db, const float* dout, const float* inp, int N, int C, int OC);
    void* ctx;
    int layer;
} WeightGradHook;
// dout (N, OC), inp (N, C): at once (matmul_backward's weight half) or to h.
void weight_grad(const WeightGradHook* h, float* dw, float* db, const float* dout, const float* inp, int N, int C,
                 int OC);

// The MLP half on N rows, as block_forward runs it: a->fcproj (N, C) =
// fcproj(gelu(fc(a->ln2))) through a->fch, a->fch_gelu (N, 4C). Backward:
// from dout (N, C), d fcproj's output, WRITES d ln2 into dln (N, C); the
// weight gradients at once or handed to wg (above); dfch_gelu, dfch (N, 4C)
// scratch. The capstone's dense layers around its composed attention.
void mlp_forward(const BlockParams* p, BlockActs* a, int N, int C);
void mlp_backward(const BlockParams* p, BlockParams* g, const BlockActs* a, float* dln, const float* dout,
                  float* dfch_gelu, float* dfch, int N, int C, const WeightGradHook* wg);

// The head: final LayerNorm, LM head tied to wte, softmax cross-entropy.
typedef struct {
    float *lnf, *lnf_mean, *lnf_rstd;    // (B,T,C), (B,T), (B,T)
    float* logits;                       // (B,T,Vp); backward overwrites it with dlogits
    float *rowmax, *sumexp, *tlogit;     // (B,T) cross-entropy partials
    float* losses;                       // (B,T)
} HeadActs;
size_t head_acts_numel(int B, int T, int C, int Vp);  // B*T*(C + Vp + 6)
HeadActs head_acts_at(float* base, int B, int T, int C, int Vp);

// x (B,T,C) is the last block's output; losses land in h->losses.
void head_forward(const GPTConfig* cfg, const float* wte, const float* lnfw, const float* lnfb,
                  HeadActs* h, const float* x, const int* targets, int B, int T);
// dloss: d objective / d each token's loss (1/(B*T) for the batch mean).
// Writes dres (B,T,C) = d objective / d x; accumulates dwte, dlnfw, dlnfb.
// dln (B,T,C) is scratch. This is the two halves below called in a row.
void head_backward(const GPTConfig* cfg, const float* wte, const float* lnfw, float* dwte,
                   float* dlnfw, float* dlnfb, HeadActs* h, const float* x, const int* targets,
                   float dloss, float* dln, float* dres, int B, int T);
// The head in two halves, as the block. The input half writes dres, the
// dlogits (into h->logits, in place) and dlnf (B,T,C), the d of the final
// LayerNorm's output; those two are the head's stash (Vp + C floats per
// token, the Vp already inside HeadActs), so h and dlnf must be this
// microbatch's own until the weight half has run. The weight half
// accumulates dwte (the tied LM head's share), dlnfw and dlnfb from them and
// x, h->lnf, h->lnf_mean, h->lnf_rstd; it reads no parameter. dwte also
// takes encoder_backward's share: the fused order (head first) is needed
// for bit-identical sums. Traced as "head backward" and "head backward
// weights" (head_backward: one "head backward").
void head_backward_input(const GPTConfig* cfg, const float* wte, const float* lnfw, HeadActs* h,
                         const float* x, const int* targets, float dloss, float* dlnf,
                         float* dres, int B, int T);
void head_backward_weights(const GPTConfig* cfg, float* dwte, float* dlnfw, float* dlnfb,
                           const HeadActs* h, const float* x, const float* dlnf, int B, int T);

// ---------------------------------------------------------------- activation recomputation
// What each layer keeps from forward for backward (--recompute):
//   none       every BlockActs field: B*T*(18C + NH + 4) per layer
//   selective  drops what is cheap to recompute and large: fch_gelu (4C,
//              gelu of the kept fch), and attproj and fcproj (C each), which
//              backward never reads: B*T*(12C + NH + 4) per layer; the matmul
//              outputs stay (Korthikanti et al., 2022). Their selective mode
//              also dropped attention's (B,NH,T,T) probabilities; the flash
//              op keeps none, only lse (NH per token), so there is no
//              attention left to recompute (docs/recompute.md)
//   full       keeps only the block's output res3 (C per token), the next
//              block's input; backward reruns the block's forward from its
//              input into a one-layer buffer first: B*T*C per layer
// The dropped fields live in ONE buffer shared by every layer, the
// transient: selective B*T*6C, full a whole BlockActs. Recomputing
// repeats the same ops on the same inputs, so gradients and losses are the
// same bits as with none.
typedef enum { RECOMPUTE_NONE, RECOMPUTE_SELECTIVE, RECOMPUTE_FULL, NUM_RECOMPUTE_MODES } RecomputeMode;
const char* recompute_name(RecomputeMode mode);  // "none", "selective", "full"
// Floats one layer keeps, and floats of the one transient buffer.
size_t block_store_numel(int B, int T, int C, int NH, RecomputeMode mode);
size_t block_transient_numel(int B, int T, int C, int NH, RecomputeMode mode);
// The same split for activations a chapter keeps its own way (a pipeline
// stage's slots): the view of one layer whose kept fields sit at `store`
// (block_store_numel floats) and dropped ones in `transient`, as
// gpt_acts_block returns it (block_forward writes through it).
BlockActs block_acts_kept(float* store, float* transient, int B, int T, int C, int NH, RecomputeMode mode);
// Recomputes into the transient what `mode` dropped, from the kept fields and
// the block's input x (full reruns the whole block: p its parameters), and
// returns the view block_backward or block_backward_input reads.
BlockActs block_acts_recompute(const BlockParams* p, float* store, float* transient, const float* x, int B, int T,
                               int C, int NH, RecomputeMode mode);
// Only what block_backward_weights reads (a weight half run later than its
// input half, after the transient served other layers): selective recomputes
// the GELU alone, full the whole block again.
BlockActs block_acts_recompute_weights(const BlockParams* p, float* store, float* transient, const float* x, int B,
                                       int T, int C, int NH, RecomputeMode mode);

// ---------------------------------------------------------------- the whole model
// The activations of a (B, T) batch through the whole model, wherever the
// parameters live (a replica, an FSDP gather buffer, ...).
typedef struct {
    int B, T;
    RecomputeMode recompute;
    float* encoded;       // (B,T,C) embedding output, the input of block 0
    float* blocks;        // L * block_store_numel(mode)
    float* transient;     // block_transient_numel(mode), shared by every layer (NULL for none)
    float* head;          // head_acts_numel
    float* scratch;       // block_scratch_numel, reused by every block's backward
    float* dres;          // (B,T,C) the gradient flowing down the residual stream
    int* inputs;          // (B,T) token ids on the device
    int* targets;         // (B,T)
    float* losses_host;   // (B,T)
} GPTActs;

void gpt_acts_create(GPTActs* a, const GPTConfig* cfg, int B, int T);  // recompute none
void gpt_acts_create_recompute(GPTActs* a, const GPTConfig* cfg, int B, int T, RecomputeMode mode);
void gpt_acts_free(GPTActs* a);
// Views for a batch of (B, T) <= the batch a was made for (same strides, so
// a smaller batch, as in sampling, reuses the same buffers).
// Where block `layer`'s forward writes: the kept fields in the layer's own
// store, the dropped ones (recompute selective, full) in the transient.
BlockActs gpt_acts_block(const GPTActs* a, const GPTConfig* cfg, int layer, int B, int T);
// Block `layer`'s input (the embedding output or block layer-1's res3) and
// output (its res3): kept in every mode.
const float* gpt_acts_block_input(const GPTActs* a, const GPTConfig* cfg, int layer, int B, int T);
const float* gpt_acts_block_output(const GPTActs* a, const GPTConfig* cfg, int layer, int B, int T);
// Block `layer`'s forward from its input, into the activations (traced as
// "block l forward").
void gpt_block_forward(const GPTActs* a, const GPTConfig* cfg, int layer, const BlockParams* p, int B, int T);
// Block `layer`'s backward (traced as "block l backward"): first recomputes
// what the mode dropped (p must be the block's parameters, gathered if they
// are sharded), then block_backward with a->dres and the scratch. With
// recompute on, the recomputed tensors live in the shared transient: run a
// layer's backward (both halves) before another layer's recompute.
void gpt_block_backward(const GPTActs* a, const GPTConfig* cfg, int layer, const BlockParams* p, BlockParams* g,
                        int B, int T);
// The activations backward reads for block `layer`: for selective and full,
// recomputed into the transient from the kept ones (the "recompute" span).
BlockActs gpt_acts_block_recompute(const GPTActs* a, const GPTConfig* cfg, int layer, const BlockParams* p,
                                   int B, int T);
HeadActs gpt_acts_head(const GPTActs* a, const GPTConfig* cfg, int B, int T);
BlockScratch gpt_acts_scratch(const GPTActs* a, const GPTConfig* cfg);
// Copies a host batch of token ids (B,T) to the device.
void gpt_acts_load(GPTActs* a, const int* inputs, const int* targets);
// Copies the per-token losses of the last head_forward to the host; their mean.
float gpt_acts_mean_loss(GPTActs* a, const GPTConfig* cfg);
// The head on the whole (B, T) batch the activations were made for, wherever
// its parameters live: wte (Vp, C) and lnf ([lnfw lnfb], 2C). Forward reads
// the last block's output, returns the mean loss (gpt_acts_mean_loss);
// backward of that mean into dwte and dlnf (accumulated) and a->dres.
float gpt_acts_head_forward(GPTActs* a, const GPTConfig* cfg, const float* wte, const float* lnf);
void gpt_acts_head_backward(GPTActs* a, const GPTConfig* cfg, const float* wte, const float* lnf, float* dwte,
                            float* dlnf);

// The single-device model: every parameter, gradient and AdamW moment, and the
// activations of a (B, T) batch. This is chapter 0's reference; the other
// chapters compose the same steps on their own pieces of it.
typedef struct {
    GPTConfig cfg;
    int B, T;
    size_t num_params;
    float* params;  // (num_params) flat, layer-major
    float* grads;   // (num_params)
    float* m;       // (num_params) AdamW first moment (NULL until gpt_create_optimizer)
    float* v;       // (num_params) AdamW second moment
    float loss_scale;  // backward differentiates loss_scale * mean loss (1 by default)
    GPTActs acts;
} GPT;

// Allocates params (init from seed), grads (zero) and the activations of a
// (B, T) batch. The AdamW moments come separately, since not every rank of
// every chapter keeps them.
void gpt_create(GPT* m, const GPTConfig* cfg, int B, int T, uint64_t seed);
// The same, with activations kept as --recompute says.
void gpt_create_recompute(GPT* m, const GPTConfig* cfg, int B, int T, uint64_t seed, RecomputeMode mode);
// Allocates the AdamW moments m and v (zero).
void gpt_create_optimizer(GPT* m);
void gpt_free(GPT* m);
// Forward over host token arrays (B,T); returns the mean loss.
float gpt_forward(GPT* m, const int* inputs, const int* targets);
void gpt_zero_grad(GPT* m);
// Backward of loss_scale * the mean loss of the last forward; accumulates
// into m->grads.
void gpt_backward(GPT* m);
// The same, calling ready(ctx, boundary) each time backward has finished the
// gradients of every parameter at flat offset >= boundary: after the head
// (boundary = lnfw's offset: the tied wte is not finished there), after each
// block l (its first offset), and after the embedding (0). A data-parallel
// chapter starts the all-reduce of every bucket above the boundary there.
void gpt_backward_hooked(GPT* m, void (*ready)(void* ctx, size_t boundary), void* ctx);
// Model FLOPs per token for a forward and backward pass: 6 * (matmul weights) +
// 12 * L * T * C for attention (PaLM's convention; causal masking not discounted).
double gpt_flops_per_token(const GPTConfig* cfg, int T);

// Samples n tokens after the prompt (host array, len tokens, len >= 1) from the
// model with temperature 1, using forward passes of batch 1. Writes to out.
void gpt_sample(GPT* m, const int* prompt, int len, int* out, int n, uint64_t seed);
// The same rule for any model: next(ctx, window, t, row) runs it on the t
// tokens window[0..t) (t <= T) and writes the logits of the last position
// (Vp floats, host) into row; the draws use the first V of them.
typedef void (*GptNextLogits)(void* ctx, const int* window, int t, float* row);
void gpt_sample_with(GptNextLogits next, void* ctx, int T, int V, int Vp, const int* prompt, int len, int* out,
                     int n, uint64_t seed);

#endif
