// ops_loss.cu: the softmax cross-entropy in two phases, on the GPU: the twin of
// common/cpu/ops_loss.c (shapes and semantics: common/ops/loss.h).
#include "ops_cuda.cuh"

// ---------------------------------------------------------------- loss

// One block per row n.
__global__ void crossentropy_partials_kernel(float* rowmax, float* sumexp, float* tlogit,
                                             const float* logits, const int* targets, int width,
                                             int nvalid, int v0) {
    int n = blockIdx.x;
    const float* row = logits + (size_t)n * width;
    float mx = -INFINITY;
    for (int j = threadIdx.x; j < nvalid; j += THREADS) mx = fmaxf(mx, row[j]);
    mx = block_max(mx);
    float part = 0.0f;
    for (int j = threadIdx.x; j < nvalid; j += THREADS) part += expf(row[j] - mx);
    float sum = block_sum(part);
    if (threadIdx.x == 0) {
        int local = targets[n] - v0;
        rowmax[n] = mx;
        sumexp[n] = sum;
        tlogit[n] = (local >= 0 && local < nvalid) ? row[local] : 0.0f;
    }
}

extern "C" void crossentropy_partials(float* rowmax, float* sumexp, float* tlogit,
                                      const float* logits, const int* targets, int N, int width,
                                      int nvalid, int v0) {
    if (N <= 0) return;
    crossentropy_partials_kernel<<<N, THREADS, 0, cuda_compute_stream>>>(
        rowmax, sumexp, tlogit, logits, targets, width, nvalid, v0);
    KERNEL_CHECK();
}

// One thread per row.
__global__ void crossentropy_merge_kernel(float* rowmax, float* sumexp, float* tlogit,
                                          const float* max2, const float* sum2,
                                          const float* tlog2, int N) {
    FOR_EACH_INDEX(n, (size_t)N) {
        // rescale both sums to the larger of the two maxima
        float m = rowmax[n] > max2[n] ? rowmax[n] : max2[n];
        float s = 0.0f;
        if (sumexp[n] > 0.0f) s += sumexp[n] * expf(rowmax[n] - m);
        if (sum2[n] > 0.0f) s += sum2[n] * expf(max2[n] - m);
        rowmax[n] = m;
        sumexp[n] = s;
        tlogit[n] += tlog2[n];
    }
}

extern "C" void crossentropy_merge(float* rowmax, float* sumexp, float* tlogit, const float* max2,
                                   const float* sum2, const float* tlog2, int N) {
    if (N <= 0) return;
    crossentropy_merge_kernel<<<grid_for((size_t)N), THREADS, 0, cuda_compute_stream>>>(
        rowmax, sumexp, tlogit, max2, sum2, tlog2, N);
    KERNEL_CHECK();
}

__global__ void crossentropy_loss_kernel(float* losses, const float* rowmax, const float* sumexp,
                                         const float* tlogit, int N) {
    FOR_EACH_INDEX(n, (size_t)N) losses[n] = logf(sumexp[n]) + rowmax[n] - tlogit[n];
}

extern "C" void crossentropy_loss(float* losses, const float* rowmax, const float* sumexp,
                                  const float* tlogit, int N) {
    if (N <= 0) return;
    crossentropy_loss_kernel<<<grid_for((size_t)N), THREADS, 0, cuda_compute_stream>>>(
        losses, rowmax, sumexp, tlogit, N);
    KERNEL_CHECK();
}

// One block per row n. In place is safe: each element is read, then written,
// by the same thread.
__global__ void crossentropy_backward_kernel(float* dlogits, const float* logits,
                                             const int* targets, const float* rowmax,
                                             const float* sumexp, float dloss, int width,
                                             int nvalid, int v0) {
    int n = blockIdx.x;
    const float* row = logits + (size_t)n * width;
    float* drow = dlogits + (size_t)n * width;
    float inv = 1.0f / sumexp[n];
    float mx = rowmax[n];
    int local = targets[n] - v0;
    for (int j = threadIdx.x; j < nvalid; j += THREADS) {
        float p = expf(row[j] - mx) * inv;
        drow[j] = (p - (j == local ? 1.0f : 0.0f)) * dloss;
    }
    for (int j = nvalid + threadIdx.x; j < width; j += THREADS) drow[j] = 0.0f;
}

extern "C" void crossentropy_backward(float* dlogits, const float* logits, const int* targets,
                                      const float* rowmax, const float* sumexp, float dloss,
                                      int N, int width, int nvalid, int v0) {
    if (N <= 0) return;
    crossentropy_backward_kernel<<<N, THREADS, 0, cuda_compute_stream>>>(
        dlogits, logits, targets, rowmax, sumexp, dloss, width, nvalid, v0);
    KERNEL_CHECK();
}
