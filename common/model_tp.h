// model_tp.h: the model's layouts cut for tensor parallelism, and tiles of
// the parameter tensors (a row range, a column slice) to init, read and place.
//
// A tensor-parallel rank holds 1/tp of every matrix of a block (model.h's
// layouts are the whole block, tp = 1) and the whole of every vector
// that is not split. These functions only size and point: which rows and
// columns go to which rank, and every collective, stay in the chapter
// (04_fsdp_tp/main.c).
//
// A tp shard of one block, in the same order as block_params_at, contiguous:
//   ln1w (C) ln1b (C) qkvw (3C/tp, C) qkvb (3C/tp) attprojw (C, C/tp)
//   attprojb (C) ln2w (C) ln2b (C) fcw (4C/tp, C) fcb (4C/tp)
//   fcprojw (C, 4C/tp) fcprojb (C)
// model.c writes each layout once, with tp; model.h's are its tp = 1 case.
#ifndef MODEL_TP_H
#define MODEL_TP_H

#include <stddef.h>
#include <stdint.h>

#include "model.h"

// ---------------------------------------------------------------- one block's shard
// Floats of one block's tp shard: 12C^2/tp + 7C/tp + 6C. C % tp == 0.
size_t gpt_block_numel_tp(int C, int tp);
// The views of a block's tp shard (parameters or gradients) at base; the
// BlockParams shapes become qkvw (3C/tp, C), attprojw (C, C/tp), fcw (4C/tp, C),
// fcprojw (C, 4C/tp), qkvb (3C/tp), fcb (4C/tp); the rest stay (C).
BlockParams block_params_at_tp(float* base, int C, int tp);

// What a block's forward saves on a tp rank: the full-width rows (ln1, attproj,
// res2, ln2, fcproj, res3 are (B,T,C)) and the rank's slices: qkv (B,T,3C/tp),
// atty (B,T,C/tp), lse (B,T,NH/tp), fch and fch_gelu (B,T,4C/tp).
// B*T*(6C + 12C/tp + NH/tp + 4) floats. NH % tp == 0.
size_t block_acts_numel_tp(int B, int T, int C, int NH, int tp);
BlockActs block_acts_at_tp(float* base, int B, int T, int C, int NH, int tp);
// With --recompute (model.h's modes), what one layer keeps and the one
// transient buffer every layer shares, per token (Cl = C/tp, NHl = NH/tp):
//   none       kept 6C + 12Cl + NHl + 4 (every field), transient 0
//   selective  kept 4C + 8Cl + NHl + 4: ln1 + stats, qkv, atty, lse, res2,
//              ln2 + stats, fch, res3; transient 2C + 4Cl: fch_gelu, attproj,
//              fcproj (GELU recomputed from fch; the projections are never
//              read by backward)
//   full       kept C: res3; transient a whole block_acts_numel_tp
// With tp = 1 these are model.h's block_store_numel and block_transient_numel.
size_t block_store_numel_tp(int B, int T, int C, int NH, int tp, RecomputeMode mode);
size_t block_transient_numel_tp(int B, int T, int C, int NH, int tp, RecomputeMode mode);
// Where a layer's forward writes under `mode`: the kept fields in its store
// (block_store_numel_tp floats), the dropped ones in the transient.
BlockActs block_acts_stored_tp(float* store, float* transient, int B, int T, int C, int NH, int tp,
                               RecomputeMode mode);
// Backward's scratch on a tp rank: dln (B,T,C), dqkv (B,T,3C/tp), datty
// (B,T,C/tp), dfch and dfch_gelu (B,T,4C/tp). B*T*(C + 12C/tp) floats.
size_t block_scratch_numel_tp(int B, int T, int C, int NH, int tp);
BlockScratch block_scratch_at_tp(float* base, int B, int T, int C, int NH, int tp);

// ---------------------------------------------------------------- tiles of a tensor
// Every parameter tensor as a matrix (rows, cols), one layer's copy, as the
// file stores it (out, in): wte (Vp, C), wpe (maxT, C), qkvw (3C, C),
// attprojw (C, C), fcw (4C, C), fcprojw (C, 4C); a vector of n is (n, 1).
void param_tensor_shape(const GPTConfig* cfg, ParamTensor t, size_t* rows, size_t* cols);

// A tile: rows [row0, row0 + nrows) and columns [col0, col0 + ncols) of one
// layer's copy of tensor t, stored row-major (nrows, ncols) in out (host).
// Counter-based like gpt_init_range: equal to the same tile of the full model.
void gpt_init_tile(float* out, const GPTConfig* cfg, uint64_t seed, ParamTensor t, int layer,
                   size_t row0, size_t nrows, size_t col0, size_t ncols);
// The same tile read from an llm.c checkpoint (one seek per row of a column
// slice, one read for a row range). The file must have passed
// checkpoint_read_config. Returns NULL or a message.
const char* checkpoint_read_tile(const char* path, const GPTConfig* cfg, float* out, ParamTensor t,
                                 int layer, size_t row0, size_t nrows, size_t col0, size_t ncols,
                                 char* msg, size_t msg_len);
// The inverse, for saving: copies the tile (nrows, ncols) from tile into its
// place in params, the full model's flat layout (host memory).
void gpt_place_tile(float* params, const GPTConfig* cfg, const float* tile, ParamTensor t, int layer,
                    size_t row0, size_t nrows, size_t col0, size_t ncols);
// The copy under it, for a tensor wherever its layer's copy lives (another
// layout's, the capstone's MoE buffer): between the tile (nrows, ncols) at
// tile and its place in tensor (rows, cols as param_tensor_shape), into the
// tensor when to_tensor, else out of it (host memory).
void gpt_copy_tile(const GPTConfig* cfg, ParamTensor t, float* tensor, float* tile, size_t row0, size_t nrows,
                   size_t col0, size_t ncols, int to_tensor);

#endif
