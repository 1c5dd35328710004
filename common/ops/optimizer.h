// ops/optimizer.h: AdamW and the gradient norm (common/ops.h says the conventions).
// CPU: common/cpu/ops_*.c; CUDA: common/cuda/ops_*.cu.
#ifndef OPS_OPTIMIZER_H
#define OPS_OPTIMIZER_H

#include <stddef.h>

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
// root, so clipping sees the global norm (train_global_norm, train_step.h).
void grad_sumsq(double* sumsq, const float* grads, size_t n);
// The clip factor for a global norm: clip / norm if norm > clip, else 1
// (clip <= 0 disables clipping).
float grad_clip_scale(double norm, float clip);

#endif
