// ops_optimizer.cu: AdamW and the gradient norm, on the GPU: the twin of
// common/cpu/ops_optimizer.c (shapes and semantics: common/ops/optimizer.h).
#include "ops_cuda.cuh"

// ---------------------------------------------------------------- optimizer

__global__ void adamw_kernel(float* params, const float* grads, float* m, float* v, size_t n,
                             AdamWConfig cfg, float bc1, float bc2, float grad_scale) {
    FOR_EACH_INDEX(i, n) {
        float g = grads[i] * grad_scale;
        float mi = cfg.beta1 * m[i] + (1.0f - cfg.beta1) * g;
        float vi = cfg.beta2 * v[i] + (1.0f - cfg.beta2) * g * g;
        float mhat = mi / bc1;
        float vhat = vi / bc2;
        m[i] = mi;
        v[i] = vi;
        params[i] -= cfg.lr * (mhat / (sqrtf(vhat) + cfg.eps) + cfg.weight_decay * params[i]);
    }
}

extern "C" void adamw_update(float* params, const float* grads, float* m, float* v, size_t n,
                             AdamWConfig cfg, int t, float grad_scale) {
    if (n == 0) return;
    // the bias corrections, on the host as on the CPU
    float bc1 = 1.0f - powf(cfg.beta1, (float)t);
    float bc2 = 1.0f - powf(cfg.beta2, (float)t);
    adamw_kernel<<<grid_for(n), THREADS, 0, cuda_compute_stream>>>(params, grads, m, v, n, cfg,
                                                                   bc1, bc2, grad_scale);
    KERNEL_CHECK();
}

// grad_sumsq in two passes, in a fixed order: SUMSQ_BLOCKS blocks each sum a
// grid-stride share of the squares into one double, then one block sums those
// partials and adds the total into the caller's device double. The partials
// live in static device memory (no allocation: nothing for the tracking
// allocator to count). Nothing comes back to the host: the caller reads the
// step's total once (train_global_norm), so a step of many slices does not
// wait for the GPU per slice. The two kernels run in stream order, so the
// partials of one call are summed before the next call overwrites them.
#define SUMSQ_BLOCKS THREADS  // the final pass gives each partial one thread
__device__ double sumsq_partials[SUMSQ_BLOCKS];

__global__ void sumsq_partials_kernel(const float* grads, size_t n) {
    double part = 0.0;
    FOR_EACH_INDEX(i, n) part += (double)grads[i] * grads[i];
    part = block_sum_double(part);
    if (threadIdx.x == 0) sumsq_partials[blockIdx.x] = part;
}

__global__ void sumsq_final_kernel(double* sumsq) {
    double total = block_sum_double(sumsq_partials[threadIdx.x]);
    if (threadIdx.x == 0) *sumsq += total;
}

extern "C" void grad_sumsq(double* sumsq, const float* grads, size_t n) {
    if (n == 0) return;
    sumsq_partials_kernel<<<SUMSQ_BLOCKS, THREADS, 0, cuda_compute_stream>>>(grads, n);
    KERNEL_CHECK();
    sumsq_final_kernel<<<1, THREADS, 0, cuda_compute_stream>>>(sumsq);
    KERNEL_CHECK();
}

extern "C" float grad_clip_scale(double norm, float clip) {
    if (clip <= 0.0f || norm <= clip) return 1.0f;
    return (float)(clip / norm);
}
