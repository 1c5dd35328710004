// moe.h: the mixture-of-experts GPT (chapter 7): its config, the layout of
// its parameters, init, and the pieces of an MoE block that are not
// communication (the attention half, the router, one expert's MLP).
//
// In an MoE layer the block's MLP becomes E experts, each a GPT MLP of
// hidden width H (fc (H, C), GELU, fcproj (C, H)), and a router, a linear
// C -> E without bias. Layer l is an MoE layer when (l + 1) % moe_every == 0
// (every layer for 1, the odd ones for 2, as GShard); the others keep the
// dense MLP of width 4C.
//
// Parameters live in TWO flat buffers, because they are reduced over two
// different groups (07_expert/main.c says why):
//   shared  (replicated on every rank), layer-major like the GPT's:
//     [wte wpe] [block 0] ... [block L-1] [lnfw lnfb], where a dense block is
//     the GPT's 12 tensors (model.h) and an MoE block is
//     ln1w ln1b qkvw qkvb attprojw attprojb ln2w ln2b router(E, C)
//   experts (one rank's own experts): for each MoE layer in order, for each
//     of this rank's experts in order, fcw(H, C) fcb(H) fcprojw(C, H) fcprojb(C)
// Init is counter-based as the GPT's: expert e of layer l takes the values
// model.h's init gives the dense MLP tensors of "layer" l + e*L, so expert 0
// equals the dense model's MLP and E = 1, k = 1 is chapter 0's model.
#ifndef MOE_H
#define MOE_H

#include <stddef.h>
#include <stdint.h>

#include "ckpt.h"
#include "model.h"

typedef struct {
    GPTConfig gpt;
    int experts;    // E
    int top_k;      // k <= E experts per token
    int hidden;     // H, each expert's MLP width (default 4C)
    int moe_every;  // layer l is MoE iff (l + 1) % moe_every == 0
    // the capstone's --tp: with tp > 1 the shared buffer leaves out the split
    // tensors (qkvw, qkvb, attprojw; a dense layer's fcw, fcb, fcprojw), which
    // a tp rank holds in a buffer of their own; 0 or 1: the whole model
    int tp;
    // the global index of local layer 0: a pipeline chunk's first layer (the
    // capstone's), so local layer j is MoE or dense as global layer
    // first_layer + j. The init and the file functions take first_layer 0.
    int first_layer;
} MoeConfig;

// NULL if the config is usable, else a message.
const char* moe_config_problem(const MoeConfig* c);
// --ep-overlap against a rank's tokens per MoE layer: NULL, or why not (in msg).
const char* moe_overlap_problem(int ep_overlap, long tokens, char* msg, size_t len);
// l is a local layer (global first_layer + l); the MoE layers counted and
// indexed are the config's own (a chunk's from its first MoE layer).
int moe_is_moe_layer(const MoeConfig* c, int l);
int moe_num_moe_layers(const MoeConfig* c);
// The index of MoE layer l among the MoE layers (l must be one).
int moe_layer_index(const MoeConfig* c, int l);

// ---------------------------------------------------------------- shared parameters
size_t moe_attn_numel(int C);  // 4C^2 + 8C: ln1w .. ln2b
size_t moe_block_numel(const MoeConfig* c, int l);
size_t moe_block_offset(const MoeConfig* c, int l);
size_t moe_num_shared(const MoeConfig* c);
size_t moe_num_params(const MoeConfig* c);  // all: the replicated ones and every MoE layer's experts
size_t moe_wte_offset(const MoeConfig* c);   // 0
size_t moe_wpe_offset(const MoeConfig* c);
size_t moe_lnf_offset(const MoeConfig* c);   // lnfw, then lnfb
// Layer l's parameters in a shared buffer; an MoE layer's fc* are NULL, and
// with c->tp > 1 qkvw, qkvb, attprojw, fcw, fcb, fcprojw are NULL too (not in the buffer).
BlockParams moe_block_params(const MoeConfig* c, float* shared, int l);
float* moe_router_at(const MoeConfig* c, float* shared, int l);  // (E, C)
// The same from the block's own first float (a unit of --zero 2, 3 holds
// one block alone, 03_fsdp/zero_buffer.h).
BlockParams moe_block_params_in(const MoeConfig* c, float* block, int l);
float* moe_router_in(const MoeConfig* c, float* block);

// ---------------------------------------------------------------- expert parameters
size_t moe_expert_numel(const MoeConfig* c);  // 2HC + H + C
typedef struct {
    float *fcw, *fcb;          // (H, C), (H)
    float *fcprojw, *fcprojb;  // (C, H), (C)
} ExpertParams;
// Local expert le of MoE layer m in a buffer of n_local experts per layer.
ExpertParams moe_expert_at(const MoeConfig* c, float* experts, int m, int le, int n_local);

// ---------------------------------------------------------------- init
// Counter-based, so a rank makes only what it holds: floats [lo, lo + n) of
// the shared buffer (host memory; with c->tp > 1 without the split
// tensors), and experts [e0, e0 + n_local) of the MoE layers among layers
// [l0, l0 + n_layers) (host memory, the layout above, from the first).
void moe_init_shared(float* out, const MoeConfig* c, size_t lo, size_t n, uint64_t seed);
void moe_init_experts(float* out, const MoeConfig* c, int l0, int n_layers, int e0, int n_local, uint64_t seed);

// ---------------------------------------------------------------- the block's pieces
// The attention half and ln2, as block_forward computes them (same ops, same
// order): a->res2 = x + attproj(attention(qkv(ln1(x)))), a->ln2 = ln2(res2).
void moe_attention_forward(const BlockParams* p, BlockActs* a, const float* x, int B, int T,
                           int C, int NH);
// Backward of the above given dln2 (d of ln2's output): dres holds d res2
// minus what ln2 adds (on entry: d res3, which the residual passes through);
// on return d x. Parameter gradients accumulate into g (ln2, attention).
// Mirrors block_backward_input then block_backward_weights.
void moe_attention_backward(const BlockParams* p, BlockParams* g, const BlockActs* a,
                            const BlockScratch* s, const float* x, const float* dln2, float* dres,
                            int B, int T, int C, int NH);
// The two halves around attention itself, on N token rows (the capstone
// puts cp's attention between them): _in writes ln1 and qkv; _out, from
// atty, attproj, res2 and ln2. Backward: _backward_out leaves d atty in
// s->datty, zeroes s->dqkv and keeps d res2 in s->dfch_gelu's first N C
// floats; _backward_in takes s->dqkv down to d x and the gradients (the
// two matmuls' at once or handed to wg, model.h).
void moe_attention_in(const BlockParams* p, BlockActs* a, const float* x, int N, int C);
void moe_attention_out(const BlockParams* p, BlockActs* a, const float* x, int N, int C);
void moe_attention_backward_out(const BlockParams* p, const BlockActs* a, const BlockScratch* s,
                                const float* dln2, float* dres, int N, int C);
void moe_attention_backward_in(const BlockParams* p, BlockParams* g, const BlockActs* a,
                               const BlockScratch* s, const float* x, const float* dln2, float* dres,
                               int N, int C, const WeightGradHook* wg);
// One expert on its n rows: out (n, C) = fcproj(gelu(fc(in (n, C)))); fch,
// fch_gelu (n, H) are kept for backward.
void moe_expert_forward(const ExpertParams* p, float* out, float* fch, float* fch_gelu,
                        const float* in, int n, int C, int H);
// Backward in two halves, so that the rows can go in chunks and the weight
// gradients see every row at once (in one order: the same bits whatever
// the chunks). The input half, row by row: din (n, C) += d in, and dfch
// (n, H) = d fch kept for the weight half (moe_layer.c's
// experts_backward_weights); dfch_gelu (n, H) is scratch.
void moe_expert_backward_input(const ExpertParams* p, float* din, const float* dout, const float* fch,
                               float* dfch, float* dfch_gelu, int n, int C, int H);

// FLOPs per token of a forward and backward (6 x the weights a token meets:
// k experts in an MoE layer), plus attention as gpt_flops_per_token.
double moe_flops_per_token(const MoeConfig* c, int T);
// Parameters a token meets (the "active" ones): the shared ones and k experts.
size_t moe_active_params(const MoeConfig* c);

// ---------------------------------------------------------------- checkpoint
// llm.c's 256-int32 header with our own version MOE_CHECKPOINT_VERSION in
// [1] (so llm.c refuses it instead of misreading it) and [8] = E, [9] = k,
// [10] = H, [11] = moe_every; then the shared buffer as laid out above, then
// every expert of every MoE layer in the experts layout (all E per layer).
#define MOE_CHECKPOINT_VERSION 7001
// Reads the header; NULL or a message (a dense llm.c file is refused: it has
// no router and no experts).
const char* moe_checkpoint_read_config(const char* path, MoeConfig* c, char* msg, size_t len);
// Reads the shared buffer and experts [e0, e0 + n_local) of each MoE layer.
const char* moe_checkpoint_read(const char* path, const MoeConfig* c, float* shared, float* experts,
                                int e0, int n_local, char* msg, size_t len);
// Writes atomically from host copies of the shared buffer and ALL experts.
const char* moe_checkpoint_write(const char* path, const MoeConfig* c, const float* shared,
                                 const float* experts, char* msg, size_t len);

// ---------------------------------------------------------------- training-state checkpoint (ckpt.h)
// The model's tensors in a training-state checkpoint, each in its own
// global index space (ckpt_set_model): the GPT's names and ids (ParamTensor)
// where the GPT has the tensor, the dense MLP's four over the dense layers, plus
//   router          (L_moe, E, C)
//   expert_fcw      (L_moe, E, H, C)   expert_fcb      (L_moe, E, H)
//   expert_fcprojw  (L_moe, E, C, H)   expert_fcprojb  (L_moe, E, C)
// so a slice of experts [e0, e0 + n) is the same elements whatever mesh
// wrote it, and a checkpoint reshards over ep like any other.
#define MOE_CKPT_TENSORS 21
void moe_ckpt_tensors(const MoeConfig* c, CkptTensor out[MOE_CKPT_TENSORS]);
// The manifest's variant line: E, k, H and moe_every (k and moe_every
// change the model without changing every shape).
void moe_ckpt_variant(const MoeConfig* c, char* out, size_t len);
// 1: the model is the dense GPT's (E = 1, so k = 1, and H = 4C: the router's
// softmax over one expert is exactly 1, so it never changes a loss). Its
// checkpoint is then the dense form, the GPT's 16 tensors: the expert's are
// the MLP's, and the router is neither saved nor read (it keeps its init).
// Chapter 0 resumes it, and it resumes any dense chapter's. The caller sets
// the GPT's table (ckpt_set_model with no table).
int moe_ckpt_dense(const MoeConfig* c);
// The flat range [lo, lo + n) of the shared buffer (a replica or a piece of
// it), values at data: one slice per (tensor, layer) piece it overlaps.
void moe_ckpt_add_shared(CkptList* l, const MoeConfig* c, CkptKind kind, size_t lo, size_t n, float* data);
// A rank's experts buffer (experts [e0, e0 + n_local) of every MoE layer):
// one slice per (layer, expert, tensor).
void moe_ckpt_add_experts(CkptList* l, const MoeConfig* c, CkptKind kind, int e0, int n_local, float* data);
// The same for a buffer of n_layers MoE layers only, the model's MoE layers
// [m0, m0 + n_layers) (a pipeline stage's).
void moe_ckpt_add_expert_layers(CkptList* l, const MoeConfig* c, CkptKind kind, int m0, int n_layers, int e0,
                                int n_local, float* data);

// ---------------------------------------------------------------- tp slices
// A tp rank's slices (the capstone's --tp: chapter 4's tiles that split a
// tensor), per layer qkvw (3C/tp, C) qkvb (3C/tp) attprojw (C, C/tp), a dense
// layer's fcw (4C/tp, C) fcb (4C/tp) fcprojw (C, 4C/tp): layer l's floats,
// and where they start.
size_t moe_tp_numel(const MoeConfig* c, int l, int tp);
size_t moe_tp_offset(const MoeConfig* c, int l, int tp);
// p with layer l's split tensors pointing into its tp slices at w.
BlockParams moe_tp_params(const MoeConfig* c, BlockParams p, float* w, int l, int tp);

#endif
