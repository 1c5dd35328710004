// ops/experts.h: a mixture-of-experts layer's router and token traffic (common/ops.h
// says the conventions). CPU: common/cpu/ops_*.c; CUDA: common/cuda/ops_*.cu.
#ifndef OPS_EXPERTS_H
#define OPS_EXPERTS_H

#include <stddef.h>

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

#endif
