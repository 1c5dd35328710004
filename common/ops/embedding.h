// ops/embedding.h: the token and position embedding (common/ops.h says the
// conventions). CPU: common/cpu/ops_*.c; CUDA: common/cuda/ops_*.cu.
#ifndef OPS_EMBEDDING_H
#define OPS_EMBEDDING_H

#include <stddef.h>

// ---------------------------------------------------------------- embedding
// out[n, :] = wte[tokens[n], :] + wpe[n % T, :]     out (N, C), N = B*T
// wpe points at the row of the first position the caller's sequence chunk
// starts at (a context-parallel chunk passes wpe + t0*C).
void encoder_forward(float* out, const int* tokens, const float* wte, const float* wpe,
                     int B, int T, int C);
void encoder_backward(float* dwte, float* dwpe, const float* dout, const int* tokens,
                      int B, int T, int C);
// Vocabulary-parallel embedding (tensor parallelism): wte_shard (nrows, C)
// holds rows [v0, v0 + nrows) of wte. A token outside that range gives a zero
// row; wpe may be NULL (not added), so that exactly one rank adds it and the
// sum over ranks is encoder_forward's out.
//   out[n, :] = (v0 <= tokens[n] < v0 + nrows ? wte_shard[tokens[n] - v0, :] : 0)
//             + (wpe ? wpe[n % T, :] : 0)
void encoder_forward_vocab(float* out, const int* tokens, const float* wte_shard,
                           const float* wpe, int B, int T, int C, int v0, int nrows);
// Its backward: rows of tokens outside [v0, v0 + nrows) add nothing to
// dwte_shard; dwpe (may be NULL) gets every row.
void encoder_backward_vocab(float* dwte_shard, float* dwpe, const float* dout,
                            const int* tokens, int B, int T, int C, int v0, int nrows);

#endif
