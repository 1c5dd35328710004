// ops/linear.h: the linear layer (common/ops.h says the conventions). CPU:
// common/cpu/ops_*.c; CUDA: common/cuda/ops_*.cu.
#ifndef OPS_LINEAR_H
#define OPS_LINEAR_H

#include <stddef.h>

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

#endif
