// ops_util.cu: the progress hook, zero, scale, copy, add, the strided copy, on the GPU:
// the twin of common/cpu/ops_util.c (shapes and semantics: common/ops/util.h).
#include "ops_cuda.cuh"

// ---------------------------------------------------------------- progress
// NCCL and the GPU move their operations by themselves: the hook is unused.
extern "C" void ops_set_progress_hook(void (*hook)(void)) { (void)hook; }

// ---------------------------------------------------------------- utilities

extern "C" void ops_zero(float* x, size_t n) {
    if (n == 0) return;
    CUDA_CHECK(cudaMemsetAsync(x, 0, n * sizeof(float), cuda_compute_stream));
}

__global__ void scale_kernel(float* x, size_t n, float s) {
    FOR_EACH_INDEX(i, n) x[i] *= s;
}

extern "C" void ops_scale(float* x, size_t n, float s) {
    if (n == 0) return;
    scale_kernel<<<grid_for(n), THREADS, 0, cuda_compute_stream>>>(x, n, s);
    KERNEL_CHECK();
}

extern "C" void ops_copy(float* dst, const float* src, size_t n) {
    if (n == 0 || dst == src) return;
    CUDA_CHECK(cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyDeviceToDevice,
                               cuda_compute_stream));
}

__global__ void add_kernel(float* y, const float* x, size_t n) {
    FOR_EACH_INDEX(i, n) y[i] += x[i];
}

extern "C" void ops_add(float* y, const float* x, size_t n) {
    if (n == 0) return;
    add_kernel<<<grid_for(n), THREADS, 0, cuda_compute_stream>>>(y, x, n);
    KERNEL_CHECK();
}

// cudaMemcpy2DAsync is the strided copy itself (pitches in bytes): one call,
// the driver's own kernel.
__global__ void double_to_float_kernel(float* dst, const double* src, size_t n) {
    FOR_EACH_INDEX(i, n) dst[i] = (float)src[i];  // round to nearest, as the C cast on the CPU
}

extern "C" void ops_double_to_float(float* dst, const double* src, size_t n) {
    if (n == 0) return;
    double_to_float_kernel<<<grid_for(n), THREADS, 0, cuda_compute_stream>>>(dst, src, n);
    KERNEL_CHECK();
}

extern "C" void ops_copy_2d(float* dst, int dst_stride, const float* src, int src_stride,
                            int rows, int cols) {
    if (rows <= 0 || cols <= 0) return;
    CUDA_CHECK(cudaMemcpy2DAsync(dst, (size_t)dst_stride * sizeof(float), src,
                                 (size_t)src_stride * sizeof(float), (size_t)cols * sizeof(float),
                                 (size_t)rows, cudaMemcpyDeviceToDevice, cuda_compute_stream));
}
