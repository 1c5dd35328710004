// ops/attention.h: causal self-attention: the O(T) op every chapter calls, its chunked
// form for context parallelism, and the (T, T) reference (common/ops.h says the
// conventions). CPU: common/cpu/ops_*.c; CUDA: common/cuda/ops_*.cu.
#ifndef OPS_ATTENTION_H
#define OPS_ATTENTION_H

#include <stddef.h>

// ---------------------------------------------------------------- attention
// Causal multi-head self-attention over NH heads of size hs = C / NH.
// qkv (B, T, 3C) holds, per token, the queries of all NH heads (C values), then
// the keys (C), then the values (C); a caller that owns a subset of heads
// passes that subset's qkv and its own C and NH.
// out (B, T, C) = softmax(q k^T / sqrt(hs), causal) v, heads side by side.
// att (B, NH, T, T) keeps the softmax probabilities for backward. The
// chapters run attention_flash_* below instead; this op stays as the
// reference the tests and build/attention_bench compare it with.
void attention_forward(float* out, float* att, const float* qkv, int B, int T, int C, int NH);
// datt (B, NH, T, T) is scratch; dqkv (B, T, 3C) is accumulated.
void attention_backward(float* dqkv, float* datt, const float* dout, const float* qkv,
                        const float* att, int B, int T, int C, int NH);

// ---------------------------------------------------------------- attention in O(T) memory
// The same causal attention without the (B, NH, T, T) probabilities:
// FlashAttention's algorithm (Dao et al. 2022; Dao 2023), blocks of keys
// folded into each query row by the online softmax (Milakov & Gimelshein
// 2018), the identity attention_chunk_merge below applies to whole chunks.
// Forward keeps only out (B, T, C), as attention_forward's, and
// lse (B, T, NH) = log of the row's softmax denominator in the units of the
// scaled scores (max + log sum e^(score - max)), heads side by side as the
// chunk ops' statistics. Backward recomputes each block's probabilities
// p = exp(score - lse) and, with D = dout . out per row, ACCUMULATES
//   dv_j += p_ij dout_i,  ds_ij = p_ij (dout_i . v_j - D_i),
//   dq_i += ds_ij k_j / sqrt(hs),  dk_j += ds_ij q_i / sqrt(hs)
// into dqkv (B, T, 3C). Each call takes its own working memory, a few tiles
// that do not grow with T: on the CPU per thread (host memory, as the chunk
// ops' tiles: up to 128 x 64 floats and 64 keys by hs), on the GPU in a
// block's shared memory (tiles of 32 rows by hs + 1 floats, FLASH_TILE).
// A row's out, lse and dq are a function of that row's query, the keys and
// values it sees and (backward) its dout, out and lse, whatever B, T past
// the row, the other rows and the thread count (tests/test_rows.c); dk and
// dv of a key add the queries that see it in one fixed order.
void attention_flash_forward(float* out, float* lse, const float* qkv, int B, int T, int C, int NH);
void attention_flash_backward(float* dqkv, const float* dout, const float* qkv, const float* out,
                              const float* lse, int B, int T, int C, int NH);

// ---------------------------------------------------------------- attention on sequence chunks
// The same attention, cut by sequence chunks (context parallelism: a rank holds
// one chunk of queries and meets the keys and values of the other chunks one
// chunk at a time). The softmax over all keys is assembled from per-chunk
// partials, the online-softmax (flash-attention) identity: for one query row
// and two disjoint sets of keys with partials (m1, l1, o1) and (m2, l2, o2),
//   m = max(m1, m2),  l = l1 e^(m1-m) + l2 e^(m2-m),  o = o1 e^(m1-m) + o2 e^(m2-m),
// and the attention output of the row is o / l.
//
// Queries and keys/values come through separate pointers and row strides, so
// a caller passes them wherever they live: q (B*Tq rows, one every q_stride
// floats) holds each query token's C values, heads side by side; k and v
// (B*Tk rows, one every kv_stride floats) the keys and values of the kv
// chunk. Out of a (B, T, 3C) qkv buffer: q = qkv, k = qkv + C, v = qkv + 2C,
// both strides 3C. Out of a packed (B, Tk, 2C) [k | v] buffer (what a ring
// sends, so only K and V travel): k = kv, v = kv + C, kv_stride 2C. Query i
// sits at global position q0 + i, key j at k0 + j, and key j is visible to
// query i iff k0 + j <= q0 + i (causal). Scores are q.k / sqrt(hs), as in
// attention_forward. The per-row statistics rowmax, sumexp, lse are
// (B, Tq, NH): one value per (token, head), heads side by side as in out.
// Both backends run a pair on attention_flash_*'s own kernel, with the
// chunks' positions: the same tiles and blocks of keys (a kv chunk is one
// more level of blocks), so no call stores a pair's Tq x Tk scores, and one
// chunk of the whole sequence (q0 = k0 = 0), finished, gives
// attention_flash_*'s bits. Working memory as theirs: a few small tiles
// per thread on the CPU, shared memory per block on the GPU.
//
// Forward WRITES (overwrites) the partials of one (query chunk, kv chunk) pair:
// rowmax = max visible score, sumexp = sum of exp(score - rowmax) over the
// visible keys, out (B, Tq, C) = the same sum of exp(score - rowmax) * v,
// NOT normalised. A row that sees no key of this chunk gets rowmax = -INFINITY,
// sumexp = 0, out = 0.
void attention_chunk_forward(float* out, float* rowmax, float* sumexp, const float* q,
                             int q_stride, const float* k, const float* v, int kv_stride, int B,
                             int Tq, int Tk, int q0, int k0, int C, int NH);
// Folds the partials of another kv chunk (out2, rowmax2, sumexp2) into
// (out, rowmax, sumexp), in place, by the identity above. A row empty on one
// side (sumexp 0, rowmax -INFINITY) takes the other side's partials; empty on
// both, it stays empty (no NaN).
void attention_chunk_merge(float* out, float* rowmax, float* sumexp, const float* out2,
                           const float* rowmax2, const float* sumexp2, int B, int Tq, int C,
                           int NH);
// After the last merge: out /= sumexp in place (a row with sumexp 0 gives 0),
// and WRITES lse (B, Tq, NH) = rowmax + log(sumexp), the log of the softmax
// denominator, which is all of the forward statistics backward needs
// (-INFINITY for an empty row). lse may be the rowmax buffer (in place).
void attention_chunk_finish(float* out, float* lse, const float* rowmax, const float* sumexp,
                            int B, int Tq, int C, int NH);
// Backward of one (query chunk, kv chunk) pair. out (B, Tq, C) and lse are the
// finished forward of the query chunk over ALL its kv chunks, dout (B, Tq, C)
// the gradient of out. With p = exp(score - lse) for each visible pair and
// D = dout . out per row, it ACCUMULATES this pair's share
//   dv_j += p_ij dout_i,  ds_ij = p_ij (dout_i . v_j - D_i),
//   dq_i += ds_ij k_j / sqrt(hs),  dk_j += ds_ij q_i / sqrt(hs)
// into dq (row stride q_stride, like q) and dk, dv (row stride kv_stride, like
// k and v). Nothing else is written, so dq, dk, dv may be the three parts of
// one dqkv buffer (the diagonal pair). Summed over all kv chunks of every query
// chunk this is attention_backward's dqkv.
void attention_chunk_backward(float* dq, float* dk, float* dv, const float* dout,
                              const float* out, const float* lse, const float* q, int q_stride,
                              const float* k, const float* v, int kv_stride, int B, int Tq, int Tk,
                              int q0, int k0, int C, int NH);

#endif
