// ops_pointwise.cu: GELU and the residual add, on the GPU: the twin of
// common/cpu/ops_pointwise.c (shapes and semantics: common/ops/pointwise.h).
#include "ops_cuda.cuh"

// ---------------------------------------------------------------- pointwise

#define GELU_SCALE 0.7978845608028654f  // sqrt(2 / pi)

// tanh(u) = 1 - 2 / (exp(2u) + 1), the CPU's formula, so both backends round alike.
__device__ float tanh_via_exp(float u) { return 1.0f - 2.0f / (expf(2.0f * u) + 1.0f); }

__global__ void gelu_forward_kernel(float* out, const float* inp, size_t n) {
    FOR_EACH_INDEX(i, n) {
        float x = inp[i];
        float u = GELU_SCALE * (x + 0.044715f * x * x * x);
        out[i] = 0.5f * x * (1.0f + tanh_via_exp(u));
    }
}

extern "C" void gelu_forward(float* out, const float* inp, size_t n) {
    if (n == 0) return;
    gelu_forward_kernel<<<grid_for(n), THREADS, 0, cuda_compute_stream>>>(out, inp, n);
    KERNEL_CHECK();
}

__global__ void gelu_backward_kernel(float* dinp, const float* inp, const float* dout, size_t n) {
    FOR_EACH_INDEX(i, n) {
        float x = inp[i];
        float u = GELU_SCALE * (x + 0.044715f * x * x * x);
        float th = tanh_via_exp(u);
        float sech2 = 1.0f - th * th;
        float local = 0.5f * (1.0f + th) +
                      0.5f * x * sech2 * GELU_SCALE * (1.0f + 3.0f * 0.044715f * x * x);
        dinp[i] += local * dout[i];
    }
}

extern "C" void gelu_backward(float* dinp, const float* inp, const float* dout, size_t n) {
    if (n == 0) return;
    gelu_backward_kernel<<<grid_for(n), THREADS, 0, cuda_compute_stream>>>(dinp, inp, dout, n);
    KERNEL_CHECK();
}

__global__ void residual_forward_kernel(float* out, const float* a, const float* b, size_t n) {
    FOR_EACH_INDEX(i, n) out[i] = a[i] + b[i];
}

extern "C" void residual_forward(float* out, const float* a, const float* b, size_t n) {
    if (n == 0) return;
    residual_forward_kernel<<<grid_for(n), THREADS, 0, cuda_compute_stream>>>(out, a, b, n);
    KERNEL_CHECK();
}

__global__ void residual_backward_kernel(float* da, float* db, const float* dout, size_t n) {
    FOR_EACH_INDEX(i, n) {
        if (da) da[i] += dout[i];
        if (db) db[i] += dout[i];
    }
}

extern "C" void residual_backward(float* da, float* db, const float* dout, size_t n) {
    if (n == 0 || (!da && !db)) return;
    residual_backward_kernel<<<grid_for(n), THREADS, 0, cuda_compute_stream>>>(da, db, dout, n);
    KERNEL_CHECK();
}
