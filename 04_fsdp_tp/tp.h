// tp.h: chapter 4's tensor-parallel engine, the plumbing around the TP block
// as a module later chapters link (06_sequence_context lists 04_fsdp_tp/tp).
//
// What is here: which tp rank holds which slice of every tensor (the tiles),
// the tp rank's state (its shard as chapter 3's FSDP units over dp, its
// activations), sharded init and checkpoint reading, the vocabulary-parallel
// embedding and LM head with their cross-entropy, the optimizer step with the
// global norm, and the end-of-run checks (replicas agree, the whole model).
//
// What is NOT here, and stays in the chapter that teaches it: the block
// (block_forward_tp / block_backward_tp in 04_fsdp_tp/main.c, with Megatron's
// f and g; chapter 6's sequence-parallel block with its all-gathers and
// reduce-scatters), the loop over layers with its FSDP gathers, and the tp
// collectives that join the embedding and the head to the blocks. The
// module's halves stop just before those collectives and start just after:
//
//   forward   x = tp_embed_forward(m, in, tg)     this rank's partial embedding
//             <chapter: sum x over tp (ch4 g) or reduce-scatter (ch6)>
//             <chapter: the blocks>
//             tp_final_layernorm_forward(m, x)    h.lnf from the whole (N,C) x
//             loss = tp_head_forward(m)           sharded logits, vocab-parallel CE
//   backward  tp_head_backward(m, dlnf)           partial dlnf, dwte of this slice
//             <chapter: sum dlnf over tp (ch4 f backward)>
//             tp_final_layernorm_backward(m, dlnf, x, dres)
//             <chapter: the blocks, last to first>
//             tp_embed_backward(m, dres)          dwte rows, dwpe; the dp reductions
//             norm = tp_step(m, args, t)
//
// A chapter whose final LayerNorm runs on its own tokens (sequence
// parallelism) writes h.lnf itself (tp_head_acts) instead of calling
// tp_final_layernorm_*, and uses the rest as is.
#ifndef TP_H
#define TP_H

#include <stddef.h>
#include <stdint.h>

#include "ckpt.h"
#include "comm.h"
#include "model.h"
#include "model_tp.h"
#include "ops.h"
#include "run.h"
#include "train.h"
#include "train_eval.h"

#include "fsdp.h"

// ---------------------------------------------------------------- which rank holds what

// One piece of one tensor that a tp rank holds: rows [row0, row0 + nrows) and
// columns [col0, col0 + ncols) of layer `layer`'s copy of tensor t (stored
// (out, in), a vector as (n, 1)), at offset off of the rank's flat shard.
typedef struct {
    ParamTensor t;
    int layer;
    size_t row0, nrows, col0, ncols;
    size_t off;
    int replicated;  // the whole tensor: every tp rank holds the same copy
} Tile;

// The vocabulary rows [v0, v0 + rows) of tp rank r: ceil(Vp/tp) each, the
// last rank fewer when tp does not divide Vp; rows <= 0 when tp is so large
// that the last rank gets none (tp_check_mesh refuses that).
void tp_vocab_rows(const GPTConfig* cfg, int tp, int r, int* v0, int* rows);

// The shard layout of tp rank r, in the order its flat buffer holds it:
//   [wte rows of rank r] [wpe] [block 0's shard] ... [block L-1's shard] [lnfw lnfb]
// where a block's shard is model_tp.h's. Writes the tiles (if out is given)
// and returns their number.
int tp_shard_tiles(const GPTConfig* cfg, int tp, int r, Tile* out);
// Block l's tiles alone (the same as in the shard, off counted from the
// block's first float); a later program that splits blocks as chapter 4 does
// (the capstone) takes its slices from them.
int tp_block_tiles(const GPTConfig* cfg, int tp, int r, int l, Tile* out);

// A flat buffer laid out by n tiles (each row-major at its off: a tp shard,
// the capstone's slices), its floats [q0, q1) at dst (float q at dst[q - q0]):
// counter-based from seed, or read from the llm.c file checkpoint if given
// (NULL or the message); as checkpoint slices of layer tile.layer's copy of
// each tile.t, replicated tiles left out when skip_replicated.
const char* tp_tiles_fill(const GPTConfig* cfg, const Tile* tiles, int n, size_t q0, size_t q1,
                          const char* checkpoint, uint64_t seed, float* dst, char* msg, size_t msg_len);
void tp_tiles_ckpt_add(CkptList* l, const GPTConfig* cfg, const Tile* tiles, int n, CkptKind kind, size_t q0,
                       size_t q1, float* data, int skip_replicated);

// Every split must be exact: whole sequences per dp rank, whole heads and
// hidden units per tp rank, vocabulary rows for every tp rank. Collective:
// one clear message from rank 0 and every rank exits when one does not.
void tp_check_mesh(const GPTConfig* cfg, int B, int dp, int tp);
// The same checks without MPI: NULL, or the message in msg (the planner,
// tools/plan, refuses with it).
const char* tp_mesh_problem(const GPTConfig* cfg, int B, int dp, int tp, char* msg, size_t len);

// ---------------------------------------------------------------- the tp rank's state

typedef struct {
    GPTConfig cfg;
    const Comm *tp, *dp, *world;
    int ntp, rtp;            // tp group size, this rank's index in it
    int Vl, v0, nvalid;      // vocabulary rows held [v0, v0 + Vl), nvalid of them real tokens
    Tile* tiles;
    int ntiles;
    size_t numel;            // floats of the tp shard
    size_t wpe_off, block0_off, block_numel, lnf_off;  // where things sit in the tp shard
    // the tp shard as FSDP units over dp: unit 0 = [wte rows, wpe], unit 1+l =
    // block l's tp shard, unit L+1 = [lnfw lnfb]
    FSDP f;
    size_t* unit_off;        // (L+2) where each unit starts in the tp shard
    // activations of B sequences (this dp rank's share) of T tokens
    int B, T;
    float* encoded;          // (B,T,C)
    RecomputeMode recompute; // --recompute: what each layer keeps (model_tp.h)
    float* blocks;           // L * block_store_numel_tp: what each layer keeps
    float* transient;        // block_transient_numel_tp, shared by every layer (NULL for none)
    float* head;             // head_acts_numel(B, T, C, Vl): lnf, logits (B,T,Vl), partials, losses
    float* gathered;         // (tp, 3, B*T): every tp rank's cross-entropy partials
    float* scratch;          // block_scratch_numel_tp
    float* dres;             // (B,T,C)
    float* g_emb;            // unit 0's gradient during a backward (the tied wte: open from head to embedding)
    int *inputs, *targets;   // (B,T)
    float* losses_host;
} TPModel;

// The FSDP unit a tile of the tp shard lies in (no tile straddles two).
int tp_tile_unit(const TPModel* m, const Tile* tl);

// Builds this rank's state for B sequences per dp rank (collective over the
// world): the tiles, the FSDP engine over dp (ZeRO stage, prefetch, reshard
// as chapter 3) filled tile by tile from the seed or run->setup.checkpoint,
// and the activations of chapter 4's block: per layer what --recompute keeps
// (block_store_numel_tp), plus the one transient buffer the layers share.
void tp_create(TPModel* m, const Run* run, int B, int zero, int prefetch, int reshard);
void tp_free(TPModel* m);

// Layer l's activations: where its forward writes (the kept fields in its
// store, the dropped ones in the shared transient), and the head's.
BlockActs tp_acts(const TPModel* m, int l);
// --recompute full: a whole block's activations in the transient, for the
// chapter's block forward to run again before the layer's backward.
BlockActs tp_acts_transient(const TPModel* m);
// --recompute selective: gelu(fch) of the layer whose view is a, recomputed
// from its kept fch (no collective; attention kept its lse).
void tp_recompute_selective(const TPModel* m, BlockActs* a);
HeadActs tp_head_acts(const TPModel* m);
// Block l's parameters: unit 1+l gathered over dp (fsdp_unit_params), seen
// through model_tp.h's block layout. The caller prefetches the next unit.
BlockParams tp_block_params(TPModel* m, int l);
BlockParams tp_block_grads_begin(TPModel* m, int l);

// ---------------------------------------------------------------- the embedding and the head

// Copies the batch to the device, forgets last step's gathered units, gets
// unit 0 (prefetching block 0) and writes this rank's PARTIAL embedding into
// m->encoded (N,C): the token rows it holds (zero for the others), wpe added
// by tp rank 0 only. The caller sums it over tp. Returns m->encoded.
float* tp_embed_forward(TPModel* m, const int* inputs, const int* targets);
// The final LayerNorm (replicated) of the last block's whole output x (N,C)
// into the head's lnf.
void tp_final_layernorm_forward(TPModel* m, const float* x);
// The LM head on this rank's vocabulary slice (logits (N, Vl), never the
// whole (N, Vp)) and the vocabulary-parallel cross-entropy: per token this
// slice's max, sum of exponentials and target logit, all-gathered over tp
// and merged in rank order, so every tp rank gets the same loss bit for bit.
// Returns this rank's mean loss over its N tokens.
float tp_head_forward(TPModel* m);

// Starts this backward's gradients of unit 0 (the final LayerNorm's
// backward starts unit L+1's), turns the logits into this slice's dlogits,
// accumulates this slice's dwte and writes the PARTIAL dlnf (N,C) (this
// slice's share): the caller sums it over tp.
void tp_head_backward(TPModel* m, float* dlnf);
// The final LayerNorm's backward: the whole dlnf (N,C) and its input x give
// dres (N,C, overwritten) and the lnf gradients; under ZeRO-2/3 unit L+1's
// gradient is reduce-scattered over dp.
void tp_final_layernorm_backward(TPModel* m, const float* dlnf, const float* x, float* dres);
// The embedding's backward from the whole dres (N,C): this rank's token rows
// add into its wte slice (which holds the head's share already: the tied
// gradient collects both uses) and the whole dwpe. Then the dp reductions
// that remain (unit 0, or every unit under ZeRO-1).
void tp_embed_backward(TPModel* m, const float* dres);

// ---------------------------------------------------------------- the step

// The global gradient norm (tp slices summed, replicated tensors counted
// once, dp shards disjoint) and AdamW on this rank's shard with clipping.
// Returns the norm.
float tp_step(TPModel* m, const TrainArgs* args, int t);

// ---------------------------------------------------------------- validation, checks, saving

// The validation loss through the chapter's forward (each dp rank runs its
// share of every global batch); < 0 when there is no validation data.
float tp_val_loss(TPModel* m, const TrainSetup* s, int n_batches, TrainForward forward, void* ctx);

// 1 on every rank iff every tp rank holds bit-identical replicated tensors
// (shard: fsdp_gather_host's, on dp rank 0). Plain MPI, uncounted.
int tp_replicas_agree(const TPModel* m, const float* shard);
// --show-sharding: each tensor split over tp by its tiles, then every unit
// of the tp shard flat over dp (fsdp_show_sharding). Collective when show.
void tp_show_sharding(const TPModel* m, int show);

// The full model in the flat layout on world rank 0 (from every tp rank's
// whole shard on dp rank 0, placed tile by tile); NULL on every other rank.
float* tp_gather_full_model(const TPModel* m, const float* shard);

// ---------------------------------------------------------------- checkpoints

// What this rank writes (ck->own) and reads (ck->need) of the training
// state (ckpt.h): its dp shard of each of its tiles, as slices of llm.c's
// global tensors (params, m, v). A replicated tile is written by tp rank 0
// only and read by every tp rank; under ZeRO-1/2 the whole parameters are
// written by dp rank 0. Any mesh resumes from it (slice intersection).
void tp_ckpt_lists(Ckpt* ck, const TPModel* m);

#endif
