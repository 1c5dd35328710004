// ops_cuda.cuh: what the GPU ops (common/cuda/ops_*.cu, one file per op
// family, each the twin of common/cpu/ops_*.c of the same name: the same
// functions in the same order, the same formulas, the same conventions:
// backward ops accumulate, NULL gradients are skipped, crossentropy_backward
// writes and may run in place; shapes and semantics in common/ops/*.h) share:
// the launch sizes, the block reductions and the row-major sgemm on cuBLAS.
// Private to them. The helpers are `inline`, defined once per program.
//
// How the CPU's loops become kernels:
//   - a loop over independent elements: one thread per element (grid-stride
//     loops, so any n fits in a bounded grid);
//   - a loop over rows with a reduction inside (LayerNorm, softmax,
//     cross-entropy): one block per row, the reduction a tree in shared memory;
//   - a sum over rows per column (dw, db, dbias of LayerNorm and matmul): a
//     block per tile of 32 columns and chunk of rows, rows split over 16
//     lanes (coalesced reads), a tree over the lanes in shared memory, then
//     the chunks' sums in order;
//   - the embedding scatter, where two rows may add into the same row of dwte:
//     the rows sorted by token, one thread per (token, channel) walking that
//     token's rows in order, as the CPU does.
// Every reduction adds in a fixed order, so two runs give identical bits.
//
// All work goes, in order, to the compute stream (cuda_common.h), and every
// kernel launch is followed by KERNEL_CHECK(). Nothing here synchronizes
// with the host (grad_sumsq leaves its sum on the device).
#ifndef OPS_CUDA_CUH
#define OPS_CUDA_CUH

#include "cuda_common.h"
#include "ops_twin.h"

#include <climits>

#include <math.h>

extern "C" {
#include "memory.h"
#include "ops.h"
}

// Threads per block. A power of two: the tree reductions halve it.
#define THREADS 256

// Blocks for a grid-stride loop over n elements: enough to fill any GPU
// (65535: more only adds blocks that find no work), and at least one (a
// launch of 0 blocks is an error, cudaErrorInvalidConfiguration; the loop
// runs no turn for n = 0, as the CPU twin's).
inline unsigned grid_for(size_t n) {
    size_t blocks = (n + THREADS - 1) / THREADS;
    if (blocks == 0) blocks = 1;
    return (unsigned)(blocks < 65535 ? blocks : 65535);
}

// The grid-stride loop: thread i handles elements i, i + (all threads), ...
#define FOR_EACH_INDEX(i, n)                                                  \
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);   \
         i += (size_t)gridDim.x * blockDim.x)

// ---------------------------------------------------------------- block reductions
// Every thread of the block passes one value; every thread gets back the sum
// (or max) over the block. A tree in shared memory: at each level the first
// half of the threads combines its value with the second half's. Needs
// blockDim.x == THREADS, and every thread of the block must call it.

__device__ inline float block_sum(float v) {
    __shared__ float buf[THREADS];
    buf[threadIdx.x] = v;
    __syncthreads();
    for (int half = THREADS / 2; half > 0; half /= 2) {
        if ((int)threadIdx.x < half) buf[threadIdx.x] += buf[threadIdx.x + half];
        __syncthreads();
    }
    float total = buf[0];
    __syncthreads();  // all have read buf[0] before a next call overwrites buf
    return total;
}

__device__ inline float block_max(float v) {
    __shared__ float buf[THREADS];
    buf[threadIdx.x] = v;
    __syncthreads();
    for (int half = THREADS / 2; half > 0; half /= 2) {
        if ((int)threadIdx.x < half) buf[threadIdx.x] = fmaxf(buf[threadIdx.x], buf[threadIdx.x + half]);
        __syncthreads();
    }
    float m = buf[0];
    __syncthreads();
    return m;
}

__device__ inline double block_sum_double(double v) {
    __shared__ double buf[THREADS];
    buf[threadIdx.x] = v;
    __syncthreads();
    for (int half = THREADS / 2; half > 0; half /= 2) {
        if ((int)threadIdx.x < half) buf[threadIdx.x] += buf[threadIdx.x + half];
        __syncthreads();
    }
    double total = buf[0];
    __syncthreads();
    return total;
}

// ---------------------------------------------------------------- row-major sgemm on cuBLAS
// cuBLAS is column-major; every matrix here is row-major. The bridge:
//
//   A row-major matrix X (r x c, leading dimension ld) lies in memory exactly
//   as the column-major matrix X^T (c x r, same ld).
//
// The CPU computes, row-major,  C (M x N) = alpha * op(A) (M x K) @ op(B) (K x N) + beta * C
// with cblas_sgemm(CblasRowMajor, opA, opB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc).
// Read column-major, the memory of C is C^T (N x M), and
//
//   C^T = alpha * op(B)^T @ op(A)^T + beta * C^T.
//
// So cuBLAS gets B as its first operand and A as its second, with M and N
// swapped and K, the leading dimensions and alpha/beta unchanged. The
// transpose flags carry over unchanged too:
//   opB = N: B is stored K x N row-major, i.e. column-major B^T (N x K),
//            which is op(B)^T itself: cuBLAS flag N.
//   opB = T: B is stored N x K row-major, i.e. column-major B_stored^T
//            (K x N); op(B)^T = B_stored, its transpose: cuBLAS flag T.
// (the same argument for A). Hence, with the row-major arguments:
//
//   cublasSgemm(h, opB, opA, N, M, K, &alpha, B, ldb, A, lda, &beta, C, ldc)
//
// sgemm_rm takes exactly the CPU's cblas arguments (ta/tb: 1 = transposed), so
// each call reads like its twin in common/cpu/ops_*.c.

inline cublasOperation_t cublas_op(int transposed) { return transposed ? CUBLAS_OP_T : CUBLAS_OP_N; }

inline void sgemm_rm(int ta, int tb, int M, int N, int K, float alpha, const float* A, int lda,
                       const float* B, int ldb, float beta, float* C, int ldc) {
    if (M <= 0 || N <= 0) return;
    CUBLAS_CHECK(cublasSgemm(cuda_cublas, cublas_op(tb), cublas_op(ta), N, M, K, &alpha, B, ldb, A, lda, &beta,
                             C, ldc));
}

// The same for `count` independent products: product i uses A + i*strideA,
// B + i*strideB, C + i*strideC (cublasSgemmStridedBatched, operands swapped
// as above, each with its own stride).
inline void sgemm_rm_batched(int ta, int tb, int M, int N, int K, float alpha, const float* A,
                             int lda, long long strideA, const float* B, int ldb,
                             long long strideB, float beta, float* C, int ldc,
                             long long strideC, int count) {
    if (M <= 0 || N <= 0 || count <= 0) return;
    CUBLAS_CHECK(cublasSgemmStridedBatched(cuda_cublas, cublas_op(tb), cublas_op(ta), N, M, K, &alpha, B, ldb,
                                           strideB, A, lda, strideA, &beta, C, ldc, strideC,
                                           count));
}

#endif
