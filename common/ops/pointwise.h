// ops/pointwise.h: GELU and the residual add (common/ops.h says the conventions). CPU:
// common/cpu/ops_*.c; CUDA: common/cuda/ops_*.cu.
#ifndef OPS_POINTWISE_H
#define OPS_POINTWISE_H

#include <stddef.h>

// ---------------------------------------------------------------- pointwise
// GELU, tanh approximation, over n values.
void gelu_forward(float* out, const float* inp, size_t n);
void gelu_backward(float* dinp, const float* inp, const float* dout, size_t n);
// out = a + b over n values; backward: da += dout, db += dout.
void residual_forward(float* out, const float* a, const float* b, size_t n);
void residual_backward(float* da, float* db, const float* dout, size_t n);

#endif
