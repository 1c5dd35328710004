// ops.h: the GPT's building blocks, forward and backward, on device memory.
//
// Every op takes the shapes its caller passes and never assumes it sees the
// whole model: later chapters call these same ops on a subset of heads, a slice
// of the MLP, a slice of the vocabulary, a chunk of the sequence or a
// sub-batch. Pointers are device pointers (host memory on the CPU backend).
//
// Conventions (as in llm.c):
//   - N is a count of token rows (N = B*T when a caller passes a batch).
//   - weights are stored (out, in): a linear layer computes out = inp @ w^T + b.
//   - backward ops ACCUMULATE (+=) into every gradient they write, parameter
//     and activation gradients alike, so callers zero what must start at zero.
//     A gradient pointer may be NULL when the caller does not need it.
#ifndef OPS_H
#define OPS_H

#include <stddef.h>

// ---------------------------------------------------------------- progress
// The long ops (matmuls, attention) call this hook at their start, so the
// comm layer can move its non-blocking operations while the rank computes
// (MPI moves them only inside MPI calls: comm.h's comm_progress, which the
// CPU comm layer hooks in here when an operation goes in flight). NULL: no
// hook. The ops sit below the comm layer and never call it by name.
void ops_set_progress_hook(void (*hook)(void));

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

// ---------------------------------------------------------------- layernorm
// out = (inp - mean) * rstd * w + b per row; mean, rstd (N) are saved for backward.
void layernorm_forward(float* out, float* mean, float* rstd, const float* inp,
                       const float* w, const float* b, int N, int C);
// backward reads w only for dinp; with dw and db both NULL it does no
// weight-gradient work at all, with all three NULL nothing.
void layernorm_backward(float* dinp, float* dw, float* db, const float* dout,
                        const float* inp, const float* w, const float* mean,
                        const float* rstd, int N, int C);

// ---------------------------------------------------------------- linear
// out (N, OC) = inp (N, C) @ w (OC, C)^T + bias (OC); bias may be NULL.
void matmul_forward(float* out, const float* inp, const float* w, const float* bias,
                    int N, int C, int OC);
// dinp (N, C) += dout @ w; dw (OC, C) += dout^T @ inp; dbias (OC) += sum_n dout.
// Each is skipped when its pointer is NULL; w is read only for dinp and inp
// only for dw (so either may be NULL then): the two halves of a split
// backward call it with dinp alone, then with dw and dbias alone, and get
// the same bits as one call with all three.
void matmul_backward(float* dinp, float* dw, float* dbias, const float* dout,
                     const float* inp, const float* w, int N, int C, int OC);
// The forward and the input half of the backward with each row computed in
// one fixed order, for callers that cut the same rows into calls of other
// sizes and promise the same bits (chapter 7's --ep-overlap chunks of an
// expert's rows):
//   out[n, o]   = (inp[n, 0] w[o, 0] + inp[n, 1] w[o, 1] + ..., channels in order) + bias[o]
//   dinp[n, c] += (dout[n, 0] w[0, c] + dout[n, 1] w[1, c] + ..., outputs in order)
// A row's result is then a function of that row alone, whatever N, the row's
// offset, the thread count and the vector width (vectors run across outputs,
// never along a sum), and both backends add in this order. A BLAS gemm
// promises none of that: its kernels choose their blocking, and with it the
// order of each sum, from the call's shape (tests/test_rows.c: OpenBLAS's
// Haswell kernels give a row other bits in a call of 7 rows than alone).
// Slower than the BLAS calls above, which every other caller uses.
void matmul_forward_rowwise(float* out, const float* inp, const float* w, const float* bias,
                            int N, int C, int OC);
void matmul_backward_input_rowwise(float* dinp, const float* dout, const float* w, int N, int C,
                                   int OC);

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
// of up to 128 x 64 floats and of 64 keys by hs: on the CPU per thread (host
// memory, as the chunk ops' tiles), on the GPU in shared memory; nothing
// grows with T.
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

// ---------------------------------------------------------------- strided copy
// A 2-D copy: rows rows of cols floats, row r from src + r*src_stride to
// dst + r*dst_stride (strides in floats, >= cols; the two regions do not
// overlap). Packs K and V out of a qkv buffer, and one head group's columns
// out of (or back into) a (N, C) tensor for Ulysses' all-to-all.
void ops_copy_2d(float* dst, int dst_stride, const float* src, int src_stride, int rows, int cols);

// ---------------------------------------------------------------- pointwise
// GELU, tanh approximation, over n values.
void gelu_forward(float* out, const float* inp, size_t n);
void gelu_backward(float* dinp, const float* inp, const float* dout, size_t n);
// out = a + b over n values; backward: da += dout, db += dout.
void residual_forward(float* out, const float* a, const float* b, size_t n);
void residual_backward(float* da, float* db, const float* dout, size_t n);

// ---------------------------------------------------------------- loss
// Softmax cross-entropy, fused, in two phases so that a chapter can combine the
// partials across vocabulary shards before the loss and the gradient.
//
// logits (N, width): each row holds the logits of vocabulary ids
// [v0, v0 + width); only the first nvalid columns are real tokens (the rest is
// llm.c's vocabulary padding and never enters the softmax).
// targets (N) are global vocabulary ids.
//
// Phase 1, per row: rowmax = max of the valid logits, sumexp = sum of
// exp(logit - rowmax), tlogit = logit of the target if this shard holds it, else 0.
void crossentropy_partials(float* rowmax, float* sumexp, float* tlogit, const float* logits,
                           const int* targets, int N, int width, int nvalid, int v0);
// Merge the partials of another shard (max2, sum2, tlog2) into (rowmax, sumexp, tlogit).
void crossentropy_merge(float* rowmax, float* sumexp, float* tlogit, const float* max2,
                        const float* sum2, const float* tlog2, int N);
// losses (N) = log(sumexp) + rowmax - tlogit, from the partials of the whole vocabulary.
void crossentropy_loss(float* losses, const float* rowmax, const float* sumexp,
                       const float* tlogit, int N);
// Phase 2: dlogits = (softmax - onehot(target)) * dloss on valid columns, 0 on
// padding. Written, not accumulated; dlogits may equal logits (in place).
void crossentropy_backward(float* dlogits, const float* logits, const int* targets,
                           const float* rowmax, const float* sumexp, float dloss,
                           int N, int width, int nvalid, int v0);

// ---------------------------------------------------------------- mixture of experts
// The router and the token traffic of a mixture-of-experts layer (chapter 7).
// Expert indices and row positions are ints on the device: the caller plans
// the dispatch on the host (07_expert/moe.h) and copies the plan over.
//
// Router: probs (N, E) = softmax(logits (N, E)) per row; idx (N, k) = the k
// experts of largest prob, best first, ties broken by the lower expert index;
// gates (N, k) = the chosen probs renormalised to sum to 1 over the k.
// E <= MOE_MAX_EXPERTS (a row's probs sit in registers on the GPU).
#define MOE_MAX_EXPERTS 256
void moe_router_forward(float* probs, int* idx, float* gates, const float* logits, int N, int E,
                        int k);
// dlogits (N, E) += the softmax backward of dprobs, where dprobs[n, e] =
// aux_dprobs[e] (a per-expert constant: the load-balancing loss is linear in
// each prob; NULL for none) plus what dgates (N, k) gives through the
// renormalisation: dprobs[n, idx[n,m]] += (dgates[n,m] - sum_j dgates[n,j]
// gates[n,j]) / S, S the sum of the chosen probs. probs, idx, gates: forward's.
void moe_router_backward(float* dlogits, const float* dgates, const float* aux_dprobs,
                         const float* probs, const int* idx, const float* gates, int N, int E,
                         int k);
// Gather: out[i, :] = inp[src[i], :] for i < n (out (n, C)). The dispatch
// copies token rows into the send buffer with it, and a permutation of rows
// (source-major to expert-major and back) is one gather each way.
void moe_gather_forward(float* out, const float* inp, const int* src, int n, int C);
// The backward of a dispatch gather in which token t went to rows
// pos[t*k + j] (j < k; pos < 0: dropped, no row): dinp (N, C) [t, :] +=
// sum_j dout[pos[t*k + j], :], the k rows added in slot order. Written per
// token, so no two threads add into one row.
void moe_gather_backward(float* dinp, const float* dout, const int* pos, int N, int k, int C);
// Combine, the scatter-add of expert outputs back to their tokens weighted
// by the gates, written per destination row (fixed order, no atomics):
// out (N, C) [t, :] = sum_j gates[t, j] * rows[pos[t*k + j], :] over the j
// with pos >= 0 (WRITES out; a token with every slot dropped gets 0, so the
// residual stream passes it through unchanged).
void moe_combine_forward(float* out, const float* rows, const float* gates, const int* pos, int N,
                         int k, int C);
// drows[pos[t*k+j], :] += gates[t, j] * dout[t, :]; dgates[t, j] +=
// dout[t, :] . rows[pos[t*k+j], :]. Either gradient may be NULL. Each row of
// rows belongs to one (t, j), so no two threads add into one row.
void moe_combine_backward(float* drows, float* dgates, const float* dout, const float* rows,
                          const float* gates, const int* pos, int N, int k, int C);

// ---------------------------------------------------------------- optimizer
typedef struct {
    float lr, beta1, beta2, eps, weight_decay;
} AdamWConfig;

// AdamW (bias-corrected, decoupled weight decay) on any slice of a flat parameter
// buffer. t is the 1-based step. Gradients are multiplied by grad_scale first
// (the global-norm clip factor; 1 for no clipping).
void adamw_update(float* params, const float* grads, float* m, float* v, size_t n,
                  AdamWConfig cfg, int t, float grad_scale);
// *sumsq += the sum of squares of a slice, in double. sumsq is one double of
// device memory: the sum stays on the device, so a step that sums many
// slices (chapter 4: one per tile) never waits for the device per slice and
// reads the total once. The caller zeroes it for the step
// (train_sumsq_begin) and sums it across ranks before taking the square
// root, so clipping sees the global norm (train_global_norm, train.h).
void grad_sumsq(double* sumsq, const float* grads, size_t n);
// The clip factor for a global norm: clip / norm if norm > clip, else 1
// (clip <= 0 disables clipping).
float grad_clip_scale(double norm, float clip);

// ---------------------------------------------------------------- utilities
void ops_zero(float* x, size_t n);
void ops_scale(float* x, size_t n, float s);
void ops_copy(float* dst, const float* src, size_t n);
// y += x over n values (the reduction step of hand-written collectives).
void ops_add(float* y, const float* x, size_t n);
// dst[i] = (float)src[i], rounded as a C cast (the gradient's sum of squares
// is summed in double and all-reduced as a float).
void ops_double_to_float(float* dst, const double* src, size_t n);

#endif
