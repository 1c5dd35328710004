// ops.cu: the GPT ops on the GPU, in CUDA; matmuls through cuBLAS.
// Shapes and semantics are documented in common/ops.h. This file is the twin
// of common/cpu/ops.c: the same functions in the same order, the same
// formulas, the same conventions (backward ops accumulate, NULL gradients are
// skipped, crossentropy_backward writes and may run in place).
//
// How the CPU's loops become kernels:
//   - a loop over independent elements: one thread per element (grid-stride
//     loops, so any n fits in a bounded grid);
//   - a loop over rows with a reduction inside (LayerNorm, softmax,
//     cross-entropy): one block per row, the reduction a tree in shared memory;
//   - a sum over rows per column (dw, db, dbias of LayerNorm and matmul): a
//     block per tile of 32 columns, rows split over 16 lanes (coalesced
//     reads), then a tree over the lanes in shared memory;
//   - the embedding scatter, where two rows may add into the same row of dwte:
//     one thread per channel walking the rows in order, as the CPU does.
// Every reduction adds in a fixed order, so two runs give identical bits.
//
// All work goes, in order, to the compute stream (cuda_common.h), and every
// kernel launch is followed by KERNEL_CHECK(). Nothing here synchronizes
// with the host (grad_sumsq leaves its sum on the device).
#include "cuda_common.h"

#include <climits>

#include <math.h>

extern "C" {
#include "memory.h"
#include "ops.h"
}

// Threads per block. A power of two: the tree reductions halve it.
#define THREADS 256

// Blocks for a grid-stride loop over n elements: enough to fill any GPU,
// never more than the x-dimension limit cares about.
static unsigned grid_for(size_t n) {
    size_t blocks = (n + THREADS - 1) / THREADS;
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

__device__ float block_sum(float v) {
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

__device__ float block_max(float v) {
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

__device__ double block_sum_double(double v) {
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

// ---------------------------------------------------------------- sums over rows, per column
// LayerNorm's dw, db and matmul's dbias sum a row-major (N, C) array over its
// rows. A block per column would read with a stride of C: each warp's 32
// loads would touch 32 memory segments. Instead a block takes a tile of
// COL_TILE consecutive columns with COL_LANES row lanes: thread (x, y) sums
// column tile * COL_TILE + x over rows y, y + COL_LANES, ... in order. A warp
// is the 32 threads of one y (x varies fastest), so each of its loads reads
// 32 consecutive floats of one row: one 128-byte segment (two when C is not
// a multiple of 32 and the tile straddles one). Then the lanes of
// each column add up in a tree in shared memory, in a fixed order. (The CPU
// twin walks the rows in order over a block of columns per thread: the same
// shape, one lane.) The parallelism is ceil(C / 32) blocks of 512 threads:
// 24 blocks for C = 768, fewer than a large GPU's SMs; a second pass over row
// chunks would fill it, at the price of a partials buffer.
#define COL_TILE 32
#define COL_LANES 16
#define COL_THREADS (COL_TILE * COL_LANES)

// Every thread of the block passes its lane's partial sum; thread (x, 0)
// gets the total of column x over all lanes. Every thread must call it.
__device__ float column_lanes_sum(float v) {
    __shared__ float buf[COL_LANES][COL_TILE];
    buf[threadIdx.y][threadIdx.x] = v;
    __syncthreads();
    for (int half = COL_LANES / 2; half > 0; half /= 2) {
        if ((int)threadIdx.y < half) buf[threadIdx.y][threadIdx.x] += buf[threadIdx.y + half][threadIdx.x];
        __syncthreads();
    }
    float total = buf[0][threadIdx.x];
    __syncthreads();  // all have read buf before a next call overwrites it
    return total;
}

static dim3 column_tiles(int C) { return dim3((unsigned)((C + COL_TILE - 1) / COL_TILE)); }
static dim3 column_block(void) { return dim3(COL_TILE, COL_LANES); }

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
// each call below reads like its twin in cpu/ops.c.

static cublasOperation_t cublas_op(int transposed) { return transposed ? CUBLAS_OP_T : CUBLAS_OP_N; }

static void sgemm_rm(int ta, int tb, int M, int N, int K, float alpha, const float* A, int lda,
                     const float* B, int ldb, float beta, float* C, int ldc) {
    if (M <= 0 || N <= 0) return;
    CUBLAS_CHECK(cublasSgemm(cuda_cublas, cublas_op(tb), cublas_op(ta), N, M, K, &alpha, B, ldb, A, lda, &beta,
                             C, ldc));
}

// The same for `count` independent products: product i uses A + i*strideA,
// B + i*strideB, C + i*strideC (cublasSgemmStridedBatched, operands swapped
// as above, each with its own stride).
static void sgemm_rm_batched(int ta, int tb, int M, int N, int K, float alpha, const float* A,
                             int lda, long long strideA, const float* B, int ldb,
                             long long strideB, float beta, float* C, int ldc,
                             long long strideC, int count) {
    if (M <= 0 || N <= 0 || count <= 0) return;
    CUBLAS_CHECK(cublasSgemmStridedBatched(cuda_cublas, cublas_op(tb), cublas_op(ta), N, M, K, &alpha, B, ldb,
                                           strideB, A, lda, strideA, &beta, C, ldc, strideC,
                                           count));
}

// ---------------------------------------------------------------- progress
// NCCL and the GPU move their operations by themselves: the hook is unused.
extern "C" void ops_set_progress_hook(void (*hook)(void)) { (void)hook; }

// ---------------------------------------------------------------- embedding

__global__ void encoder_forward_kernel(float* out, const int* tokens, const float* wte,
                                       const float* wpe, int N, int T, int C) {
    FOR_EACH_INDEX(i, (size_t)N * C) {
        int n = (int)(i / C), c = (int)(i % C);
        out[i] = wte[(size_t)tokens[n] * C + c] + wpe[(size_t)(n % T) * C + c];
    }
}

extern "C" void encoder_forward(float* out, const int* tokens, const float* wte, const float* wpe,
                                int B, int T, int C) {
    size_t n = (size_t)B * T * C;
    if (n == 0) return;
    encoder_forward_kernel<<<grid_for(n), THREADS, 0, cuda_compute_stream>>>(out, tokens, wte, wpe,
                                                                            B * T, T, C);
    KERNEL_CHECK();
}

// The backward of the embedding, parallel over rows and channels, adding in
// the CPU twin's order (row by row), so no two threads add into one value:
//   dwpe: thread (t, c) adds rows t, t + T, t + 2T, ... (position t's rows);
//   dwte: the rows of one token are chained (enc_links: each row's next row
//   with the same token, and whether it is the token's first); thread (n, c)
//   of a first row walks its chain. The links live in static device memory
//   (nothing for the tracking allocator to count) for up to ENC_MAX_ROWS
//   rows; a longer batch takes the old kernel, one thread per channel
//   walking every row.
#define ENC_MAX_ROWS 16384
__device__ int enc_next[ENC_MAX_ROWS];
__device__ unsigned char enc_first[ENC_MAX_ROWS];

__global__ void enc_links_kernel(const int* tokens, int N) {
    FOR_EACH_INDEX(i, (size_t)N) {
        int n = (int)i, tok = tokens[n], next = -1, first = 1;
        for (int m = 0; m < n && first; m++) first = tokens[m] != tok;
        for (int m = n + 1; m < N && next < 0; m++)
            if (tokens[m] == tok) next = m;
        enc_next[n] = next;
        enc_first[n] = (unsigned char)first;
    }
}

// dwte rows [v0, v0 + nrows) (the whole table: v0 = 0, nrows = INT_MAX)
__global__ void enc_dwte_kernel(float* dwte, const float* dout, const int* tokens, int N, int C, int v0,
                                int nrows) {
    FOR_EACH_INDEX(i, (size_t)N * C) {
        int n = (int)(i / C), c = (int)(i % C);
        int row = tokens[n] - v0;
        if (!enc_first[n] || row < 0 || row >= nrows) continue;
        float acc = dwte[(size_t)row * C + c];
        for (int m = n; m >= 0; m = enc_next[m]) acc += dout[(size_t)m * C + c];
        dwte[(size_t)row * C + c] = acc;
    }
}

__global__ void enc_dwpe_kernel(float* dwpe, const float* dout, int N, int T, int C) {
    FOR_EACH_INDEX(i, (size_t)T * C) {
        int t = (int)(i / C), c = (int)(i % C);
        float acc = dwpe[i];
        for (int n = t; n < N; n += T) acc += dout[(size_t)n * C + c];
        dwpe[i] = acc;
    }
}

// The old kernel, for batches beyond ENC_MAX_ROWS rows: thread c owns
// channel c of every row and walks the rows in order.
__global__ void encoder_backward_serial_kernel(float* dwte, float* dwpe, const float* dout, const int* tokens,
                                               int N, int T, int C, int v0, int nrows) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    for (int n = 0; n < N; n++) {
        float d = dout[(size_t)n * C + c];
        int row = tokens[n] - v0;
        if (dwte && row >= 0 && row < nrows) dwte[(size_t)row * C + c] += d;
        if (dwpe) dwpe[(size_t)(n % T) * C + c] += d;
    }
}

static void encoder_backward_rows(float* dwte, float* dwpe, const float* dout, const int* tokens, int N, int T,
                                  int C, int v0, int nrows) {
    if ((!dwte && !dwpe) || N == 0 || C == 0) return;
    if (N > ENC_MAX_ROWS) {
        encoder_backward_serial_kernel<<<(C + THREADS - 1) / THREADS, THREADS, 0, cuda_compute_stream>>>(
            dwte, dwpe, dout, tokens, N, T, C, v0, nrows);
        KERNEL_CHECK();
        return;
    }
    if (dwte) {
        enc_links_kernel<<<grid_for((size_t)N), THREADS, 0, cuda_compute_stream>>>(tokens, N);
        KERNEL_CHECK();
        enc_dwte_kernel<<<grid_for((size_t)N * C), THREADS, 0, cuda_compute_stream>>>(dwte, dout, tokens, N, C,
                                                                                      v0, nrows);
        KERNEL_CHECK();
    }
    if (dwpe) {
        enc_dwpe_kernel<<<grid_for((size_t)T * C), THREADS, 0, cuda_compute_stream>>>(dwpe, dout, N, T, C);
        KERNEL_CHECK();
    }
}

extern "C" void encoder_backward(float* dwte, float* dwpe, const float* dout, const int* tokens,
                                 int B, int T, int C) {
    encoder_backward_rows(dwte, dwpe, dout, tokens, B * T, T, C, 0, INT_MAX);
}

// The vocabulary-parallel twins: a token outside [v0, v0 + nrows) reads (and
// writes) no row of the shard; wpe / dwpe may be NULL.
__global__ void encoder_forward_vocab_kernel(float* out, const int* tokens, const float* wte_shard,
                                             const float* wpe, int N, int T, int C, int v0, int nrows) {
    FOR_EACH_INDEX(i, (size_t)N * C) {
        int n = (int)(i / C), c = (int)(i % C);
        int row = tokens[n] - v0;
        float wt = row >= 0 && row < nrows ? wte_shard[(size_t)row * C + c] : 0.0f;
        float wp = wpe ? wpe[(size_t)(n % T) * C + c] : 0.0f;
        out[i] = wt + wp;
    }
}

extern "C" void encoder_forward_vocab(float* out, const int* tokens, const float* wte_shard,
                                      const float* wpe, int B, int T, int C, int v0, int nrows) {
    size_t n = (size_t)B * T * C;
    if (n == 0) return;
    encoder_forward_vocab_kernel<<<grid_for(n), THREADS, 0, cuda_compute_stream>>>(
        out, tokens, wte_shard, wpe, B * T, T, C, v0, nrows);
    KERNEL_CHECK();
}

extern "C" void encoder_backward_vocab(float* dwte_shard, float* dwpe, const float* dout,
                                       const int* tokens, int B, int T, int C, int v0, int nrows) {
    encoder_backward_rows(dwte_shard, dwpe, dout, tokens, B * T, T, C, v0, nrows);
}

// ---------------------------------------------------------------- layernorm

// One block per row n.
__global__ void layernorm_forward_kernel(float* out, float* mean, float* rstd, const float* inp,
                                         const float* w, const float* b, int C) {
    const float eps = 1e-5f;
    int n = blockIdx.x;
    const float* x = inp + (size_t)n * C;
    float part = 0.0f;
    for (int c = threadIdx.x; c < C; c += THREADS) part += x[c];
    float m = block_sum(part) / C;
    part = 0.0f;
    for (int c = threadIdx.x; c < C; c += THREADS) part += (x[c] - m) * (x[c] - m);
    float var = block_sum(part) / C;
    float s = 1.0f / sqrtf(var + eps);
    float* o = out + (size_t)n * C;
    for (int c = threadIdx.x; c < C; c += THREADS) o[c] = (x[c] - m) * s * w[c] + b[c];
    if (threadIdx.x == 0) {
        mean[n] = m;
        rstd[n] = s;
    }
}

extern "C" void layernorm_forward(float* out, float* mean, float* rstd, const float* inp,
                                  const float* w, const float* b, int N, int C) {
    if (N <= 0 || C <= 0) return;
    layernorm_forward_kernel<<<N, THREADS, 0, cuda_compute_stream>>>(out, mean, rstd, inp, w, b, C);
    KERNEL_CHECK();
}

// dinp: one block per row n (the rows are independent).
__global__ void layernorm_backward_dinp_kernel(float* dinp, const float* dout, const float* inp,
                                               const float* w, const float* mean,
                                               const float* rstd, int C) {
    int n = blockIdx.x;
    const float* x = inp + (size_t)n * C;
    const float* d = dout + (size_t)n * C;
    float m = mean[n], s = rstd[n];
    // the two means that the normalisation couples every channel through
    float part_mean = 0.0f, part_norm_mean = 0.0f;
    for (int c = threadIdx.x; c < C; c += THREADS) {
        float norm = (x[c] - m) * s;
        float dnorm = w[c] * d[c];
        part_mean += dnorm;
        part_norm_mean += dnorm * norm;
    }
    float dnorm_mean = block_sum(part_mean) / C;
    float dnorm_norm_mean = block_sum(part_norm_mean) / C;
    float* di = dinp + (size_t)n * C;
    for (int c = threadIdx.x; c < C; c += THREADS) {
        float norm = (x[c] - m) * s;
        float dnorm = w[c] * d[c];
        di[c] += (dnorm - dnorm_mean - norm * dnorm_norm_mean) * s;
    }
}

// dw, db: sums over the rows, a tile of channels per block (coalesced; see
// column_lanes_sum). Threads past the last channel add nothing but still
// take part in the tree.
__global__ void __launch_bounds__(COL_THREADS)
    layernorm_backward_dwdb_kernel(float* dw, float* db, const float* dout, const float* inp, const float* mean,
                                   const float* rstd, int N, int C) {
    int c = blockIdx.x * COL_TILE + threadIdx.x;
    float sw = 0.0f, sb = 0.0f;
    if (c < C)
        for (int n = threadIdx.y; n < N; n += COL_LANES) {
            size_t i = (size_t)n * C + c;
            float norm = (inp[i] - mean[n]) * rstd[n];
            sw += norm * dout[i];
            sb += dout[i];
        }
    sw = column_lanes_sum(sw);
    sb = column_lanes_sum(sb);
    if (threadIdx.y == 0 && c < C) {
        if (dw) dw[c] += sw;
        if (db) db[c] += sb;
    }
}

extern "C" void layernorm_backward(float* dinp, float* dw, float* db, const float* dout,
                                   const float* inp, const float* w, const float* mean,
                                   const float* rstd, int N, int C) {
    if (N <= 0 || C <= 0) return;
    if (dinp) {
        layernorm_backward_dinp_kernel<<<N, THREADS, 0, cuda_compute_stream>>>(dinp, dout, inp, w,
                                                                               mean, rstd, C);
        KERNEL_CHECK();
    }
    if (dw || db) {
        layernorm_backward_dwdb_kernel<<<column_tiles(C), column_block(), 0, cuda_compute_stream>>>(
            dw, db, dout, inp, mean, rstd, N, C);
        KERNEL_CHECK();
    }
}

// ---------------------------------------------------------------- linear

__global__ void add_bias_kernel(float* out, const float* bias, int N, int OC) {
    FOR_EACH_INDEX(i, (size_t)N * OC) out[i] += bias[i % OC];
}

extern "C" void matmul_forward(float* out, const float* inp, const float* w, const float* bias,
                               int N, int C, int OC) {
    if (N <= 0 || OC <= 0) return;
    // out (N, OC) = inp (N, C) @ w^T, w stored (OC, C)
    sgemm_rm(0, 1, N, OC, C, 1.0f, inp, C, w, C, 0.0f, out, OC);
    if (bias) {
        add_bias_kernel<<<grid_for((size_t)N * OC), THREADS, 0, cuda_compute_stream>>>(out, bias, N, OC);
        KERNEL_CHECK();
    }
}

// dbias: sums of dout over the rows, a tile of output columns per block, as
// LayerNorm's dw/db (column_lanes_sum). A cuBLAS gemv of dout^T with a vector
// of ones would read coalesced too, but needs that vector in device memory
// (N floats, growing with the batch), and LayerNorm's dw (a sum of products
// formed on the fly) would still need this kernel: one kernel serves both.
__global__ void __launch_bounds__(COL_THREADS) bias_backward_kernel(float* dbias, const float* dout, int N, int OC) {
    int k = blockIdx.x * COL_TILE + threadIdx.x;
    float s = 0.0f;
    if (k < OC)
        for (int n = threadIdx.y; n < N; n += COL_LANES) s += dout[(size_t)n * OC + k];
    s = column_lanes_sum(s);
    if (threadIdx.y == 0 && k < OC) dbias[k] += s;
}

extern "C" void matmul_backward(float* dinp, float* dw, float* dbias, const float* dout,
                                const float* inp, const float* w, int N, int C, int OC) {
    if (N <= 0 || C <= 0 || OC <= 0) return;
    // dinp (N, C) += dout (N, OC) @ w (OC, C)
    if (dinp) sgemm_rm(0, 0, N, C, OC, 1.0f, dout, OC, w, C, 1.0f, dinp, C);
    // dw (OC, C) += dout^T (OC, N) @ inp (N, C)
    if (dw) sgemm_rm(1, 0, OC, C, N, 1.0f, dout, OC, inp, C, 1.0f, dw, C);
    if (dbias) {
        bias_backward_kernel<<<column_tiles(OC), column_block(), 0, cuda_compute_stream>>>(dbias, dout, N, OC);
        KERNEL_CHECK();
    }
}

// The row-by-row products (ops.h): one thread per output element sums its
// products in order, a multiply then an add each (--fmad=false), as the CPU
// twin's tiles do, so both backends give the same bits, and a row's bits do
// not depend on the call's shape. Simple and slower than cuBLAS: chapter 7's
// experts use it where --ep-overlap cuts their rows into chunks.
__global__ void matmul_forward_rowwise_kernel(float* out, const float* inp, const float* w,
                                              const float* bias, int N, int C, int OC) {
    FOR_EACH_INDEX(i, (size_t)N * OC) {
        size_t n = i / OC;
        int o = (int)(i % OC);
        const float* x = inp + n * C;
        const float* wo = w + (size_t)o * C;
        float acc = 0.0f;
        for (int c = 0; c < C; c++) acc += x[c] * wo[c];
        out[i] = bias ? acc + bias[o] : acc;
    }
}

__global__ void matmul_backward_input_rowwise_kernel(float* dinp, const float* dout, const float* w,
                                                     int N, int C, int OC) {
    FOR_EACH_INDEX(i, (size_t)N * C) {
        size_t n = i / C;
        int c = (int)(i % C);
        const float* d = dout + n * OC;
        float acc = 0.0f;
        for (int o = 0; o < OC; o++) acc += d[o] * w[(size_t)o * C + c];
        dinp[i] += acc;
    }
}

extern "C" void matmul_forward_rowwise(float* out, const float* inp, const float* w, const float* bias,
                                       int N, int C, int OC) {
    if (N <= 0 || OC <= 0) return;
    matmul_forward_rowwise_kernel<<<grid_for((size_t)N * OC), THREADS, 0, cuda_compute_stream>>>(
        out, inp, w, bias, N, C, OC);
    KERNEL_CHECK();
}

extern "C" void matmul_backward_input_rowwise(float* dinp, const float* dout, const float* w, int N,
                                              int C, int OC) {
    if (N <= 0 || C <= 0) return;
    matmul_backward_input_rowwise_kernel<<<grid_for((size_t)N * C), THREADS, 0, cuda_compute_stream>>>(
        dinp, dout, w, N, C, OC);
    KERNEL_CHECK();
}

// ---------------------------------------------------------------- attention
// As on the CPU, one (batch, head) pair is a (T, hs) slice of q, k and v with
// row stride 3C, and each pair is a few small matmuls. Here the heads of one
// batch row go to cuBLAS as one strided batch: head h starts hs floats after
// head h-1 in q, k, v, out (their rows interleave, but the elements each head
// reads and writes are its own), and T*T floats after it in att. The batch
// index b is a plain loop: b and h together do not form one stride.
// The softmax runs between the matmuls, one block per row of att.

// Causal softmax of one row of scores: row t sees keys 0..t; future keys get
// probability 0. Rows are numbered (b, h, t), so t = row % T.
__global__ void causal_softmax_kernel(float* att, int T) {
    int t = blockIdx.x % T;
    float* row = att + (size_t)blockIdx.x * T;
    float mx = -INFINITY;
    for (int s = threadIdx.x; s <= t; s += THREADS) mx = fmaxf(mx, row[s]);
    mx = block_max(mx);
    float part = 0.0f;
    for (int s = threadIdx.x; s <= t; s += THREADS) {
        row[s] = expf(row[s] - mx);
        part += row[s];
    }
    float inv = 1.0f / block_sum(part);
    for (int s = threadIdx.x; s <= t; s += THREADS) row[s] *= inv;
    for (int s = t + 1 + threadIdx.x; s < T; s += THREADS) row[s] = 0.0f;
}

extern "C" void attention_forward(float* out, float* att, const float* qkv, int B, int T, int C,
                                  int NH) {
    if (B <= 0 || T <= 0 || NH <= 0) return;
    const int hs = C / NH;
    const float scale = 1.0f / sqrtf((float)hs);
    const int ld = 3 * C;
    const long long TT = (long long)T * T;
    // scores (T, T) = q k^T * scale, per head; the upper triangle is overwritten below
    for (int b = 0; b < B; b++) {
        const float* q = qkv + (size_t)b * T * ld;
        const float* k = q + C;
        float* a = att + (size_t)b * NH * TT;
        sgemm_rm_batched(0, 1, T, T, hs, scale, q, ld, hs, k, ld, hs, 0.0f, a, T, TT, NH);
    }
    causal_softmax_kernel<<<B * NH * T, THREADS, 0, cuda_compute_stream>>>(att, T);
    KERNEL_CHECK();
    // out (T, hs) = att (T, T) @ v (T, hs), per head, row stride C
    for (int b = 0; b < B; b++) {
        const float* v = qkv + (size_t)b * T * ld + 2 * C;
        const float* a = att + (size_t)b * NH * TT;
        float* o = out + (size_t)b * T * C;
        sgemm_rm_batched(0, 0, T, hs, T, 1.0f, a, T, TT, v, ld, hs, 0.0f, o, C, hs, NH);
    }
}

// Softmax backward of one row, in place: dscore = att * (datt - sum(att * datt))
// over keys 0..t; 0 for future keys.
__global__ void causal_softmax_backward_kernel(float* datt, const float* att, int T) {
    int t = blockIdx.x % T;
    const float* arow = att + (size_t)blockIdx.x * T;
    float* drow = datt + (size_t)blockIdx.x * T;
    float part = 0.0f;
    for (int s = threadIdx.x; s <= t; s += THREADS) part += arow[s] * drow[s];
    float dot = block_sum(part);
    for (int s = threadIdx.x; s <= t; s += THREADS) drow[s] = arow[s] * (drow[s] - dot);
    for (int s = t + 1 + threadIdx.x; s < T; s += THREADS) drow[s] = 0.0f;
}

extern "C" void attention_backward(float* dqkv, float* datt, const float* dout, const float* qkv,
                                   const float* att, int B, int T, int C, int NH) {
    if (B <= 0 || T <= 0 || NH <= 0) return;
    const int hs = C / NH;
    const float scale = 1.0f / sqrtf((float)hs);
    const int ld = 3 * C;
    const long long TT = (long long)T * T;
    for (int b = 0; b < B; b++) {
        size_t off = (size_t)b * T * ld;
        const float* v = qkv + off + 2 * C;
        float* dv = dqkv + off + 2 * C;
        const float* a = att + (size_t)b * NH * TT;
        float* da = datt + (size_t)b * NH * TT;
        const float* d = dout + (size_t)b * T * C;
        // datt (T, T) = dout (T, hs) @ v^T
        sgemm_rm_batched(0, 1, T, T, hs, 1.0f, d, C, hs, v, ld, hs, 0.0f, da, T, TT, NH);
        // dv (T, hs) += att^T (T, T) @ dout (T, hs)
        sgemm_rm_batched(1, 0, T, hs, T, 1.0f, a, T, TT, d, C, hs, 1.0f, dv, ld, hs, NH);
    }
    causal_softmax_backward_kernel<<<B * NH * T, THREADS, 0, cuda_compute_stream>>>(datt, att, T);
    KERNEL_CHECK();
    for (int b = 0; b < B; b++) {
        size_t off = (size_t)b * T * ld;
        const float* q = qkv + off;
        const float* k = q + C;
        float* dq = dqkv + off;
        float* dk = dq + C;
        const float* da = datt + (size_t)b * NH * TT;
        // dq (T, hs) += dscore @ k * scale;  dk (T, hs) += dscore^T @ q * scale
        sgemm_rm_batched(0, 0, T, hs, T, scale, da, T, TT, k, ld, hs, 1.0f, dq, ld, hs, NH);
        sgemm_rm_batched(1, 0, T, hs, T, scale, da, T, TT, q, ld, hs, 1.0f, dk, ld, hs, NH);
    }
}

// ---------------------------------------------------------------- attention on sequence chunks
// As attention_forward above: per batch row, the heads go to cuBLAS as one
// strided batch (head h starts hs floats after head h-1 in q, k, v, out, and
// Tq*Tk floats after it in the scores), and a kernel between the products
// takes each row's online-softmax statistics and zeroes the scores the causal
// cut hides (one block per (head, query) row). The products span the whole
// (Tq, Tk) rectangle of a pair; the hidden part adds exact zeros, as the
// upper triangle does in attention_forward.
//
// The scores of one batch row, (NH, Tq, Tk), and in backward their gradients
// beside them, live in a buffer this file keeps and grows when a call needs
// more (mem_alloc, counted as activations; the old buffer's cudaFree waits
// for the kernels that still use it).
//
// Stats rows are numbered (B, Tq, NH): r = (b*Tq + i)*NH + h, and out
// (B, Tq, C) = (B*Tq*NH, hs) puts that row's slice at out + r*hs.

static float* chunk_scores = NULL;
static size_t chunk_scores_n = 0;

static float* chunk_scores_buffer(size_t n) {
    if (n > chunk_scores_n) {
        if (chunk_scores) mem_free(chunk_scores);
        chunk_scores = mem_alloc_floats(n, MEM_ACTIVATIONS);
        chunk_scores_n = n;
    }
    return chunk_scores;
}

__device__ float row_dot(const float* a, const float* b, int n) {
    float s = 0.0f;
    for (int c = 0; c < n; c++) s += a[c] * b[c];
    return s;
}

// How many keys of the chunk query i sees: keys 0 .. q0 + i - k0, within 0..Tk.
__device__ int chunk_keys_visible(int i, int q0, int k0, int Tk) {
    int n = q0 + i - k0 + 1;
    return n < 0 ? 0 : (n > Tk ? Tk : n);
}

// One block per row (h, i) of batch row b's scores s (NH, Tq, Tk): the max
// and the sum of exp(score - max) over the visible keys, the weights
// exp(score - max) left in place of the scores, 0 for hidden keys. A row that
// sees no key gets rowmax -inf, sumexp 0 and a row of zeros.
__global__ void chunk_softmax_partials_kernel(float* s, float* rowmax, float* sumexp, int b, int Tq,
                                              int Tk, int q0, int k0, int NH) {
    const int h = blockIdx.x / Tq, i = blockIdx.x % Tq;
    float* row = s + (size_t)blockIdx.x * Tk;
    const int nvis = chunk_keys_visible(i, q0, k0, Tk);
    float mx = -INFINITY;
    for (int j = threadIdx.x; j < nvis; j += THREADS) mx = fmaxf(mx, row[j]);
    mx = block_max(mx);
    float part = 0.0f;
    for (int j = threadIdx.x; j < nvis; j += THREADS) {
        row[j] = expf(row[j] - mx);
        part += row[j];
    }
    float sum = block_sum(part);
    for (int j = nvis + threadIdx.x; j < Tk; j += THREADS) row[j] = 0.0f;
    if (threadIdx.x == 0) {
        size_t r = ((size_t)b * Tq + i) * NH + h;
        rowmax[r] = mx;
        sumexp[r] = sum;
    }
}

extern "C" void attention_chunk_forward(float* out, float* rowmax, float* sumexp, const float* q,
                                        int q_stride, const float* k, const float* v,
                                        int kv_stride, int B, int Tq, int Tk, int q0, int k0,
                                        int C, int NH) {
    if (B <= 0 || Tq <= 0 || NH <= 0) return;
    const int hs = C / NH;
    const float scale = 1.0f / sqrtf((float)hs);
    const long long TT = (long long)Tq * Tk;
    // Tk = 0 still runs: every row is written as empty (the kernel's loops do
    // nothing, and out is zeroed here, where no product writes it)
    if (Tk <= 0) CUDA_CHECK(cudaMemsetAsync(out, 0, (size_t)B * Tq * C * sizeof(float), cuda_compute_stream));
    float* s = chunk_scores_buffer((size_t)NH * TT + 1);
    for (int b = 0; b < B; b++) {
        const float* kb = k + (size_t)b * Tk * kv_stride;
        const float* vb = v + (size_t)b * Tk * kv_stride;
        // scores (Tq, Tk) = q k^T * scale, per head
        sgemm_rm_batched(0, 1, Tq, Tk, hs, scale, q + (size_t)b * Tq * q_stride, q_stride, hs, kb,
                         kv_stride, hs, 0.0f, s, Tk, TT, NH);
        chunk_softmax_partials_kernel<<<NH * Tq, THREADS, 0, cuda_compute_stream>>>(s, rowmax, sumexp, b, Tq,
                                                                                     Tk, q0, k0, NH);
        KERNEL_CHECK();
        // out (Tq, hs) = weights (Tq, Tk) @ v (Tk, hs), per head, row stride C, not normalised
        if (Tk > 0)
            sgemm_rm_batched(0, 0, Tq, hs, Tk, 1.0f, s, Tk, TT, vb, kv_stride, hs, 0.0f,
                             out + (size_t)b * Tq * C, C, hs, NH);
    }
}

// One thread per (token, head) row.
__global__ void attention_chunk_merge_kernel(float* out, float* rowmax, float* sumexp,
                                             const float* out2, const float* rowmax2,
                                             const float* sumexp2, size_t rows, int hs) {
    FOR_EACH_INDEX(r, rows) {
        float m = rowmax[r] > rowmax2[r] ? rowmax[r] : rowmax2[r];
        // an empty side (sumexp 0, rowmax -inf) weighs 0: exp(-inf - m) would be
        // NaN when the other side is empty too
        float a1 = sumexp[r] > 0.0f ? expf(rowmax[r] - m) : 0.0f;
        float a2 = sumexp2[r] > 0.0f ? expf(rowmax2[r] - m) : 0.0f;
        float* o = out + r * hs;
        const float* o2 = out2 + r * hs;
        for (int c = 0; c < hs; c++) o[c] = o[c] * a1 + o2[c] * a2;
        sumexp[r] = sumexp[r] * a1 + sumexp2[r] * a2;
        rowmax[r] = m;
    }
}

extern "C" void attention_chunk_merge(float* out, float* rowmax, float* sumexp, const float* out2,
                                      const float* rowmax2, const float* sumexp2, int B, int Tq,
                                      int C, int NH) {
    if (B <= 0 || Tq <= 0 || NH <= 0) return;
    size_t rows = (size_t)B * Tq * NH;
    attention_chunk_merge_kernel<<<grid_for(rows), THREADS, 0, cuda_compute_stream>>>(
        out, rowmax, sumexp, out2, rowmax2, sumexp2, rows, C / NH);
    KERNEL_CHECK();
}

// One thread per (token, head) row.
__global__ void attention_chunk_finish_kernel(float* out, float* lse, const float* rowmax,
                                              const float* sumexp, size_t rows, int hs) {
    FOR_EACH_INDEX(r, rows) {
        float l = sumexp[r];
        float inv = l > 0.0f ? 1.0f / l : 0.0f;
        float* o = out + r * hs;
        for (int c = 0; c < hs; c++) o[c] *= inv;
        lse[r] = l > 0.0f ? rowmax[r] + logf(l) : -INFINITY;  // rowmax read first: lse may be rowmax
    }
}

extern "C" void attention_chunk_finish(float* out, float* lse, const float* rowmax,
                                       const float* sumexp, int B, int Tq, int C, int NH) {
    if (B <= 0 || Tq <= 0 || NH <= 0) return;
    size_t rows = (size_t)B * Tq * NH;
    attention_chunk_finish_kernel<<<grid_for(rows), THREADS, 0, cuda_compute_stream>>>(
        out, lse, rowmax, sumexp, rows, C / NH);
    KERNEL_CHECK();
}

// Backward, per batch row, as on the CPU: p = exp(score - lse) from a product
// of q and k, dp = dout v^T from a second, ds = p (dp - D) in the kernel
// below, then dq += ds k, dk += ds^T q (both * scale) and dv += p^T dout.
// The products add in cuBLAS's own order; each is one call per batch row, so
// no two of them add into the same value at once.

// One block per row (h, i) of batch row b: p (NH, Tq, Tk) holds the scores and
// ds the products dout v^T; both become what their names say, 0 for hidden
// keys. D_i = dout_i . out_i, the softmax's coupling term, is the same
// sequential dot in every thread.
__global__ void chunk_softmax_backward_kernel(float* p, float* ds, const float* dout, const float* out,
                                              const float* lse, int b, int Tq, int Tk, int q0, int k0,
                                              int C, int NH) {
    const int h = blockIdx.x / Tq, i = blockIdx.x % Tq, hs = C / NH;
    float* prow = p + (size_t)blockIdx.x * Tk;
    float* drow = ds + (size_t)blockIdx.x * Tk;
    const int nvis = chunk_keys_visible(i, q0, k0, Tk);
    if (nvis > 0) {
        size_t r = ((size_t)b * Tq + i) * NH + h;
        const float D = row_dot(dout + r * hs, out + r * hs, hs);
        const float L = lse[r];
        for (int j = threadIdx.x; j < nvis; j += THREADS) {
            float pj = expf(prow[j] - L);
            prow[j] = pj;
            drow[j] = pj * (drow[j] - D);
        }
    }
    for (int j = nvis + threadIdx.x; j < Tk; j += THREADS) prow[j] = drow[j] = 0.0f;
}

extern "C" void attention_chunk_backward(float* dq, float* dk, float* dv, const float* dout,
                                         const float* out, const float* lse, const float* q,
                                         int q_stride, const float* k, const float* v,
                                         int kv_stride, int B, int Tq, int Tk, int q0, int k0,
                                         int C, int NH) {
    if (B <= 0 || Tq <= 0 || Tk <= 0 || NH <= 0) return;
    const int hs = C / NH;
    const float scale = 1.0f / sqrtf((float)hs);
    const long long TT = (long long)Tq * Tk;
    float* p = chunk_scores_buffer(2 * (size_t)NH * TT);
    float* ds = p + (size_t)NH * TT;
    for (int b = 0; b < B; b++) {
        const float* qb = q + (size_t)b * Tq * q_stride;
        const float* kb = k + (size_t)b * Tk * kv_stride;
        const float* vb = v + (size_t)b * Tk * kv_stride;
        const float* db = dout + (size_t)b * Tq * C;
        // p (Tq, Tk) = q k^T * scale; ds (Tq, Tk) = dout v^T, per head
        sgemm_rm_batched(0, 1, Tq, Tk, hs, scale, qb, q_stride, hs, kb, kv_stride, hs, 0.0f, p, Tk, TT, NH);
        sgemm_rm_batched(0, 1, Tq, Tk, hs, 1.0f, db, C, hs, vb, kv_stride, hs, 0.0f, ds, Tk, TT, NH);
        chunk_softmax_backward_kernel<<<NH * Tq, THREADS, 0, cuda_compute_stream>>>(p, ds, dout, out, lse, b,
                                                                                     Tq, Tk, q0, k0, C, NH);
        KERNEL_CHECK();
        // dq (Tq, hs) += ds @ k * scale;  dk (Tk, hs) += ds^T @ q * scale;  dv (Tk, hs) += p^T @ dout.
        // dq, dk and dv may be the three parts of one dqkv buffer: the calls run one after another.
        sgemm_rm_batched(0, 0, Tq, hs, Tk, scale, ds, Tk, TT, kb, kv_stride, hs, 1.0f,
                         dq + (size_t)b * Tq * q_stride, q_stride, hs, NH);
        sgemm_rm_batched(1, 0, Tk, hs, Tq, scale, ds, Tk, TT, qb, q_stride, hs, 1.0f,
                         dk + (size_t)b * Tk * kv_stride, kv_stride, hs, NH);
        sgemm_rm_batched(1, 0, Tk, hs, Tq, 1.0f, p, Tk, TT, db, C, hs, 1.0f,
                         dv + (size_t)b * Tk * kv_stride, kv_stride, hs, NH);
    }
}

// ---------------------------------------------------------------- attention in O(T) memory
// FlashAttention (Dao et al. 2022; Dao 2023) on the online softmax of
// Milakov & Gimelshein 2018, the twin of the CPU's attention_flash_*: the
// same per-row recurrence (ops.c states it), in tiles of shared memory.
// A simple kernel, written to be read rather than to be fast: one thread per
// query row (forward, dq) or per key row (dk, dv), so each row's sums run
// in one fixed order on one thread (no atomics, the same bits every run, a
// row's bits its own whatever B and T), and the tiles of keys, values and
// queries a block's threads share are loaded once into shared memory by all
// of them. A block is one (query tile or key tile, head, batch row):
// grid (tiles, NH, B). FlashAttention's production kernels split a row over
// a warp and run the products on tensor cores; this one keeps the algorithm
// in plain sight.
//
// Shared memory holds two kinds of tile: one every thread reads the same
// row of at once (a broadcast), stored (FLASH_TILE, hs); and one each thread
// reads its own row of, stored with rows of hs + 1 floats, so that the 32
// threads of a warp reading element c of their 32 rows hit 32 different
// banks (with rows of hs, a multiple of 32, they would all hit one).
#define FLASH_TILE 32  // query rows and keys per tile, one thread per row

// Dynamic shared memory past 48 KiB must be asked for per kernel (large hs).
static void flash_smem_limit(const void* kernel, size_t bytes) {
    if (bytes > 48 * 1024)
        CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
}

// rows [t0, t0 + FLASH_TILE) of a (T, hs) slice (row stride ld) into dst
// (row stride dst_ld), zeros past T; every thread of the block takes part.
__device__ void flash_load_rows(float* dst, int dst_ld, const float* src, int ld, int t0, int T, int hs) {
    for (int x = threadIdx.x; x < FLASH_TILE * hs; x += FLASH_TILE) {
        int row = x / hs, c = x % hs;
        dst[row * dst_ld + c] = t0 + row < T ? src[(size_t)(t0 + row) * ld + c] : 0.0f;
    }
}

// Forward: block (query tile, h, b); thread r owns query row i = i0 + r.
// Shared: its q row and unnormalised output o (rows of hs + 1), its scores,
// then probabilities, p (rows of FLASH_TILE + 1), and the key and value
// tiles (FLASH_TILE, hs), read by all.
__global__ void attention_flash_forward_kernel(float* out, float* lse, const float* qkv, int T, int C,
                                               int NH, float scale) {
    extern __shared__ float sm[];
    const int hs = C / NH, hp = hs + 1, ld = 3 * C, h = blockIdx.y, b = blockIdx.z;
    const int r = threadIdx.x, i0 = blockIdx.x * FLASH_TILE, i = i0 + r;
    float* qs = sm;                        // (FLASH_TILE, hp)
    float* os = qs + FLASH_TILE * hp;      // (FLASH_TILE, hp)
    float* ps = os + FLASH_TILE * hp;      // (FLASH_TILE, FLASH_TILE + 1)
    float* ks = ps + FLASH_TILE * (FLASH_TILE + 1);  // (FLASH_TILE, hs)
    float* vs = ks + FLASH_TILE * hs;      // (FLASH_TILE, hs)
    const float* q = qkv + (size_t)b * T * ld + h * hs;
    flash_load_rows(qs, hp, q, ld, i0, T, hs);
    for (int c = 0; c < hs; c++) os[r * hp + c] = 0.0f;
    float m = -INFINITY, l = 0.0f;
    const int i_last = min(i0 + FLASH_TILE, T) - 1;  // the tile's last row sees the most keys
    for (int j0 = 0; j0 <= i_last; j0 += FLASH_TILE) {
        __syncthreads();  // everyone is done with the previous tile (and qs is loaded)
        flash_load_rows(ks, hs, q + C, ld, j0, T, hs);
        flash_load_rows(vs, hs, q + 2 * C, ld, j0, T, hs);
        __syncthreads();
        if (i < T && j0 <= i) {
            const int nvis = min(FLASH_TILE, i - j0 + 1);  // keys j0 .. i of the tile
            float* p = ps + r * (FLASH_TILE + 1);
            float mx = -INFINITY;
            for (int j = 0; j < nvis; j++) {
                float s = 0.0f;
                for (int c = 0; c < hs; c++) s += qs[r * hp + c] * ks[j * hs + c];
                p[j] = s * scale;
                mx = fmaxf(mx, p[j]);
            }
            const float m_new = fmaxf(m, mx);
            const float alpha = m == -INFINITY ? 0.0f : expf(m - m_new);  // first block: nothing to rescale
            float sum = 0.0f;
            for (int j = 0; j < nvis; j++) {
                p[j] = expf(p[j] - m_new);
                sum += p[j];
            }
            l = l * alpha + sum;
            m = m_new;
            for (int c = 0; c < hs; c++) {
                float acc = 0.0f;
                for (int j = 0; j < nvis; j++) acc += p[j] * vs[j * hs + c];
                os[r * hp + c] = os[r * hp + c] * alpha + acc;
            }
        }
    }
    if (i < T) {
        // every row sees key 0, so l >= 1
        const float inv = 1.0f / l;
        float* o = out + ((size_t)b * T + i) * C + h * hs;
        for (int c = 0; c < hs; c++) o[c] = os[r * hp + c] * inv;
        lse[((size_t)b * T + i) * NH + h] = m + logf(l);
    }
}

extern "C" void attention_flash_forward(float* out, float* lse, const float* qkv, int B, int T, int C,
                                        int NH) {
    if (B <= 0 || T <= 0 || NH <= 0) return;
    const int hs = C / NH;
    const size_t smem = ((size_t)2 * FLASH_TILE * (hs + 1) + (size_t)FLASH_TILE * (FLASH_TILE + 1) +
                         (size_t)2 * FLASH_TILE * hs) * sizeof(float);
    flash_smem_limit((const void*)attention_flash_forward_kernel, smem);
    dim3 grid((unsigned)((T + FLASH_TILE - 1) / FLASH_TILE), (unsigned)NH, (unsigned)B);
    attention_flash_forward_kernel<<<grid, FLASH_TILE, smem, cuda_compute_stream>>>(
        out, lse, qkv, T, C, NH, 1.0f / sqrtf((float)hs));
    KERNEL_CHECK();
}

// Per query row of a tile, into shared memory: lse and D = dout . out (each
// row's dot by its own thread, in order); 0 past T (never used).
__device__ void flash_load_row_stats(float* lses, float* Ds, const float* dout, const float* out,
                                     const float* lse, int i0, int T, int C, int NH, int hs) {
    const int r = threadIdx.x;
    float D = 0.0f, L = 0.0f;
    if (i0 + r < T) {
        const float* d = dout + (size_t)(i0 + r) * C;
        const float* o = out + (size_t)(i0 + r) * C;
        for (int c = 0; c < hs; c++) D += d[c] * o[c];
        L = lse[(size_t)(i0 + r) * NH];
    }
    Ds[r] = D;
    lses[r] = L;
}

// dk, dv: block (key tile, h, b); thread r owns key row j = j0 + r and adds
// up, over every query i >= j in order (the query tiles in turn),
//   p = e^(q_i.k_j scale - lse_i), ds = p (dout_i.v_j - D_i),
//   dk_j += ds scale q_i, dv_j += p dout_i.
// Its own k_j, v_j and sums sit in shared memory (rows of hs + 1) beside
// the query tile's q and dout (FLASH_TILE, hs), read by all.
__global__ void attention_flash_dkdv_kernel(float* dqkv, const float* dout, const float* qkv,
                                            const float* out, const float* lse, int T, int C, int NH,
                                            float scale) {
    extern __shared__ float sm[];
    const int hs = C / NH, hp = hs + 1, ld = 3 * C, h = blockIdx.y, b = blockIdx.z;
    const int r = threadIdx.x, j0 = blockIdx.x * FLASH_TILE, j = j0 + r;
    float* ks = sm;                     // (FLASH_TILE, hp) each
    float* vs = ks + FLASH_TILE * hp;
    float* dks = vs + FLASH_TILE * hp;
    float* dvs = dks + FLASH_TILE * hp;
    float* qs = dvs + FLASH_TILE * hp;  // (FLASH_TILE, hs) each
    float* dos = qs + FLASH_TILE * hs;
    float* lses = dos + FLASH_TILE * hs;
    float* Ds = lses + FLASH_TILE;
    const size_t row0 = (size_t)b * T;
    const float* q = qkv + row0 * ld + h * hs;
    const float* d = dout + row0 * C + h * hs;
    flash_load_rows(ks, hp, q + C, ld, j0, T, hs);
    flash_load_rows(vs, hp, q + 2 * C, ld, j0, T, hs);
    for (int c = 0; c < hs; c++) dks[r * hp + c] = dvs[r * hp + c] = 0.0f;
    for (int i0 = j0; i0 < T; i0 += FLASH_TILE) {  // the first query that sees key j0 is j0
        __syncthreads();
        flash_load_rows(qs, hs, q, ld, i0, T, hs);
        flash_load_rows(dos, hs, d, C, i0, T, hs);
        flash_load_row_stats(lses, Ds, d, out + row0 * C + h * hs, lse + row0 * NH + h, i0, T, C, NH, hs);
        __syncthreads();
        if (j >= T) continue;
        const int i_end = min(i0 + FLASH_TILE, T);
        for (int i = max(i0, j); i < i_end; i++) {  // the queries of the tile that see key j
            const int qi = i - i0;
            float s = 0.0f, dp = 0.0f;
            for (int c = 0; c < hs; c++) {
                s += qs[qi * hs + c] * ks[r * hp + c];
                dp += dos[qi * hs + c] * vs[r * hp + c];
            }
            const float p = expf(s * scale - lses[qi]);
            const float ds = p * (dp - Ds[qi]) * scale;
            for (int c = 0; c < hs; c++) {
                dks[r * hp + c] += ds * qs[qi * hs + c];
                dvs[r * hp + c] += p * dos[qi * hs + c];
            }
        }
    }
    if (j < T) {
        float* dk = dqkv + (row0 + j) * ld + C + h * hs;
        for (int c = 0; c < hs; c++) {
            dk[c] += dks[r * hp + c];
            dk[C + c] += dvs[r * hp + c];  // dv: C floats further along the row
        }
    }
}

// dq: block (query tile, h, b); thread r owns query row i = i0 + r and adds
// up, over every key j <= i in order, dq_i += ds scale k_j. Its q, dout and
// sum rows (hs + 1) sit beside the key and value tiles (FLASH_TILE, hs).
__global__ void attention_flash_dq_kernel(float* dqkv, const float* dout, const float* qkv,
                                          const float* out, const float* lse, int T, int C, int NH,
                                          float scale) {
    extern __shared__ float sm[];
    const int hs = C / NH, hp = hs + 1, ld = 3 * C, h = blockIdx.y, b = blockIdx.z;
    const int r = threadIdx.x, i0 = blockIdx.x * FLASH_TILE, i = i0 + r;
    float* qs = sm;                      // (FLASH_TILE, hp) each
    float* dos = qs + FLASH_TILE * hp;
    float* dqs = dos + FLASH_TILE * hp;
    float* ks = dqs + FLASH_TILE * hp;   // (FLASH_TILE, hs) each
    float* vs = ks + FLASH_TILE * hs;
    float* lses = vs + FLASH_TILE * hs;
    float* Ds = lses + FLASH_TILE;
    const size_t row0 = (size_t)b * T;
    const float* q = qkv + row0 * ld + h * hs;
    const float* d = dout + row0 * C + h * hs;
    flash_load_rows(qs, hp, q, ld, i0, T, hs);
    flash_load_rows(dos, hp, d, C, i0, T, hs);
    flash_load_row_stats(lses, Ds, d, out + row0 * C + h * hs, lse + row0 * NH + h, i0, T, C, NH, hs);
    for (int c = 0; c < hs; c++) dqs[r * hp + c] = 0.0f;
    const int i_last = min(i0 + FLASH_TILE, T) - 1;
    for (int j0 = 0; j0 <= i_last; j0 += FLASH_TILE) {
        __syncthreads();
        flash_load_rows(ks, hs, q + C, ld, j0, T, hs);
        flash_load_rows(vs, hs, q + 2 * C, ld, j0, T, hs);
        __syncthreads();
        if (i >= T || j0 > i) continue;
        const int nvis = min(FLASH_TILE, i - j0 + 1);
        for (int j = 0; j < nvis; j++) {
            float s = 0.0f, dp = 0.0f;
            for (int c = 0; c < hs; c++) {
                s += qs[r * hp + c] * ks[j * hs + c];
                dp += dos[r * hp + c] * vs[j * hs + c];
            }
            const float p = expf(s * scale - lses[r]);
            const float ds = p * (dp - Ds[r]) * scale;
            for (int c = 0; c < hs; c++) dqs[r * hp + c] += ds * ks[j * hs + c];
        }
    }
    if (i < T) {
        float* dq = dqkv + (row0 + i) * ld + h * hs;
        for (int c = 0; c < hs; c++) dq[c] += dqs[r * hp + c];
    }
}

extern "C" void attention_flash_backward(float* dqkv, const float* dout, const float* qkv,
                                         const float* out, const float* lse, int B, int T, int C,
                                         int NH) {
    if (B <= 0 || T <= 0 || NH <= 0) return;
    const int hs = C / NH;
    const float scale = 1.0f / sqrtf((float)hs);
    dim3 grid((unsigned)((T + FLASH_TILE - 1) / FLASH_TILE), (unsigned)NH, (unsigned)B);
    // two kernels, each over the pairs it needs, so that every gradient row
    // is one thread's sum (no atomics): the probabilities are recomputed in both
    const size_t smem_kv =
        ((size_t)4 * FLASH_TILE * (hs + 1) + (size_t)2 * FLASH_TILE * hs + 2 * FLASH_TILE) * sizeof(float);
    flash_smem_limit((const void*)attention_flash_dkdv_kernel, smem_kv);
    attention_flash_dkdv_kernel<<<grid, FLASH_TILE, smem_kv, cuda_compute_stream>>>(
        dqkv, dout, qkv, out, lse, T, C, NH, scale);
    KERNEL_CHECK();
    const size_t smem_q =
        ((size_t)3 * FLASH_TILE * (hs + 1) + (size_t)2 * FLASH_TILE * hs + 2 * FLASH_TILE) * sizeof(float);
    flash_smem_limit((const void*)attention_flash_dq_kernel, smem_q);
    attention_flash_dq_kernel<<<grid, FLASH_TILE, smem_q, cuda_compute_stream>>>(
        dqkv, dout, qkv, out, lse, T, C, NH, scale);
    KERNEL_CHECK();
}

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

// ---------------------------------------------------------------- mixture of experts
// The twins of the CPU's loops: one thread per token row for the router
// (E <= MOE_MAX_EXPERTS values, walked in the CPU's order), one thread per
// element for the row copies and sums, one thread per (token, slot) for
// the gate gradient's dot product (C terms in the CPU's order).

__global__ void moe_router_forward_kernel(float* probs, int* idx, float* gates,
                                          const float* logits, int N, int E, int k) {
    int n = blockIdx.x * blockDim.x + threadIdx.x;
    if (n >= N) return;
    const float* l = logits + (size_t)n * E;
    float* p = probs + (size_t)n * E;
    float mx = -INFINITY, sum = 0.0f;
    for (int e = 0; e < E; e++) mx = l[e] > mx ? l[e] : mx;
    for (int e = 0; e < E; e++) {
        p[e] = expf(l[e] - mx);
        sum += p[e];
    }
    for (int e = 0; e < E; e++) p[e] /= sum;
    int* id = idx + (size_t)n * k;
    float s = 0.0f;
    for (int j = 0; j < k; j++) {
        int best = -1;
        for (int e = 0; e < E; e++) {
            int taken = 0;
            for (int i = 0; i < j; i++) taken |= id[i] == e;
            if (!taken && (best < 0 || p[e] > p[best])) best = e;
        }
        id[j] = best;
        s += p[best];
    }
    for (int j = 0; j < k; j++) gates[(size_t)n * k + j] = p[id[j]] / s;
}

extern "C" void moe_router_forward(float* probs, int* idx, float* gates, const float* logits,
                                   int N, int E, int k) {
    if (N == 0) return;
    moe_router_forward_kernel<<<(N + THREADS - 1) / THREADS, THREADS, 0, cuda_compute_stream>>>(
        probs, idx, gates, logits, N, E, k);
    KERNEL_CHECK();
}

__global__ void moe_router_backward_kernel(float* dlogits, const float* dgates,
                                           const float* aux_dprobs, const float* probs,
                                           const int* idx, const float* gates, int N, int E,
                                           int k) {
    int n = blockIdx.x * blockDim.x + threadIdx.x;
    if (n >= N) return;
    const float* p = probs + (size_t)n * E;
    const int* id = idx + (size_t)n * k;
    const float* g = gates + (size_t)n * k;
    float dp[MOE_MAX_EXPERTS];
    for (int e = 0; e < E; e++) dp[e] = aux_dprobs ? aux_dprobs[e] : 0.0f;
    if (dgates) {
        const float* dg = dgates + (size_t)n * k;
        float s = 0.0f, dot = 0.0f;
        for (int j = 0; j < k; j++) s += p[id[j]];
        for (int j = 0; j < k; j++) dot += dg[j] * g[j];
        for (int j = 0; j < k; j++) dp[id[j]] += (dg[j] - dot) / s;
    }
    float pdp = 0.0f;
    for (int e = 0; e < E; e++) pdp += p[e] * dp[e];
    float* dl = dlogits + (size_t)n * E;
    for (int e = 0; e < E; e++) dl[e] += p[e] * (dp[e] - pdp);
}

extern "C" void moe_router_backward(float* dlogits, const float* dgates, const float* aux_dprobs,
                                    const float* probs, const int* idx, const float* gates, int N,
                                    int E, int k) {
    if (N == 0) return;
    moe_router_backward_kernel<<<(N + THREADS - 1) / THREADS, THREADS, 0, cuda_compute_stream>>>(
        dlogits, dgates, aux_dprobs, probs, idx, gates, N, E, k);
    KERNEL_CHECK();
}

__global__ void moe_gather_forward_kernel(float* out, const float* inp, const int* src, int n,
                                          int C) {
    size_t total = (size_t)n * C;
    FOR_EACH_INDEX(i, total) {
        size_t r = i / C, c = i % C;
        out[i] = inp[(size_t)src[r] * C + c];
    }
}

extern "C" void moe_gather_forward(float* out, const float* inp, const int* src, int n, int C) {
    if (n == 0) return;
    size_t total = (size_t)n * C;
    moe_gather_forward_kernel<<<grid_for(total), THREADS, 0, cuda_compute_stream>>>(out, inp, src,
                                                                                   n, C);
    KERNEL_CHECK();
}

__global__ void moe_gather_backward_kernel(float* dinp, const float* dout, const int* pos, int N,
                                           int k, int C) {
    size_t total = (size_t)N * C;
    FOR_EACH_INDEX(i, total) {
        size_t t = i / C, c = i % C;
        float d = dinp[i];
        for (int j = 0; j < k; j++) {
            int r = pos[t * k + j];
            if (r >= 0) d += dout[(size_t)r * C + c];
        }
        dinp[i] = d;
    }
}

extern "C" void moe_gather_backward(float* dinp, const float* dout, const int* pos, int N, int k,
                                    int C) {
    if (N == 0) return;
    size_t total = (size_t)N * C;
    moe_gather_backward_kernel<<<grid_for(total), THREADS, 0, cuda_compute_stream>>>(dinp, dout,
                                                                                    pos, N, k, C);
    KERNEL_CHECK();
}

__global__ void moe_combine_forward_kernel(float* out, const float* rows, const float* gates,
                                           const int* pos, int N, int k, int C) {
    size_t total = (size_t)N * C;
    FOR_EACH_INDEX(i, total) {
        size_t t = i / C, c = i % C;
        float o = 0.0f;
        for (int j = 0; j < k; j++) {
            int r = pos[t * k + j];
            if (r >= 0) o += gates[t * k + j] * rows[(size_t)r * C + c];
        }
        out[i] = o;
    }
}

extern "C" void moe_combine_forward(float* out, const float* rows, const float* gates,
                                    const int* pos, int N, int k, int C) {
    if (N == 0) return;
    size_t total = (size_t)N * C;
    moe_combine_forward_kernel<<<grid_for(total), THREADS, 0, cuda_compute_stream>>>(
        out, rows, gates, pos, N, k, C);
    KERNEL_CHECK();
}

__global__ void moe_combine_drows_kernel(float* drows, const float* dout, const float* gates,
                                         const int* pos, int N, int k, int C) {
    size_t total = (size_t)N * k * C;
    FOR_EACH_INDEX(i, total) {
        size_t tj = i / C, c = i % C, t = tj / k;
        int r = pos[tj];
        if (r >= 0) drows[(size_t)r * C + c] += gates[tj] * dout[t * C + c];
    }
}

__global__ void moe_combine_dgates_kernel(float* dgates, const float* dout, const float* rows,
                                          const int* pos, int N, int k, int C) {
    size_t total = (size_t)N * k;
    FOR_EACH_INDEX(tj, total) {
        int r = pos[tj];
        if (r < 0) continue;
        const float* d = dout + (tj / k) * C;
        const float* x = rows + (size_t)r * C;
        float dot = 0.0f;
        for (int c = 0; c < C; c++) dot += d[c] * x[c];
        dgates[tj] += dot;
    }
}

extern "C" void moe_combine_backward(float* drows, float* dgates, const float* dout,
                                     const float* rows, const float* gates, const int* pos, int N,
                                     int k, int C) {
    if (N == 0) return;
    if (drows) {
        size_t total = (size_t)N * k * C;
        moe_combine_drows_kernel<<<grid_for(total), THREADS, 0, cuda_compute_stream>>>(
            drows, dout, gates, pos, N, k, C);
        KERNEL_CHECK();
    }
    if (dgates) {
        size_t total = (size_t)N * k;
        moe_combine_dgates_kernel<<<grid_for(total), THREADS, 0, cuda_compute_stream>>>(
            dgates, dout, rows, pos, N, k, C);
        KERNEL_CHECK();
    }
}
