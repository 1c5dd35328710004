// ops/layernorm.h: LayerNorm (common/ops.h says the conventions). CPU:
// common/cpu/ops_*.c; CUDA: common/cuda/ops_*.cu.
#ifndef OPS_LAYERNORM_H
#define OPS_LAYERNORM_H

#include <stddef.h>

// ---------------------------------------------------------------- layernorm
// out = (inp - mean) * rstd * w + b per row; mean, rstd (N) are saved for backward.
void layernorm_forward(float* out, float* mean, float* rstd, const float* inp,
                       const float* w, const float* b, int N, int C);
// backward reads w only for dinp; with dw and db both NULL it does no
// weight-gradient work at all, with all three NULL nothing.
void layernorm_backward(float* dinp, float* dw, float* db, const float* dout,
                        const float* inp, const float* w, const float* mean,
                        const float* rstd, int N, int C);

#endif
