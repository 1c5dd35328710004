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
#include "cuda_common.h"
#include "ops_twin.h"

#include <climits>

#include <cub/device/device_radix_sort.cuh>

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
// shape, one lane.)
// One block per tile alone would be ceil(C / 32) blocks (24 at C = 768),
// fewer than a large GPU's SMs, each walking every row. So the rows are cut
// into chunks of about COL_CHUNK_ROWS too (ops_twin.h, col_chunks): the grid
// is tiles x chunks (768 blocks at C = 768, N = 8192), each block writes its
// chunk's sums to a static partials buffer, and a second kernel adds each
// column's chunks in order. The chunking depends on N and C only, so the
// bits do too (tests/test_cuda_twins.c runs this index logic on the CPU).
// COL_TILE, COL_LANES, COL_CHUNK_ROWS, COL_MAX_PARTIALS: ops_twin.h.
__device__ float col_partials[2 * COL_MAX_PARTIALS];

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

// The grid of a column sum: x the tiles of columns, y the chunks of rows.
static dim3 column_grid(int N, int C) {
    return dim3((unsigned)((C + COL_TILE - 1) / COL_TILE), (unsigned)col_chunks(N, C));
}
static dim3 column_block(void) { return dim3(COL_TILE, COL_LANES); }

// The second pass, one thread per column: out[c] += the chunks' sums of
// column c in chunk order (partials (chunks, C)).
__global__ void column_partials_kernel(float* out, const float* partials, int chunks, int C) {
    FOR_EACH_INDEX(c, (size_t)C) out[c] += col_partials_sum(partials, chunks, C, (int)c);
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
static void enc_sort_reserve(int N);  // the backward's sort buffer, grown by the forward (below)

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
    enc_sort_reserve(B * T);
}

// The backward of the embedding, parallel over rows and channels, adding in
// the CPU twin's order (row by row), so no two threads add into one value:
//   dwpe: thread (t, c) adds rows t, t + T, t + 2T, ... (position t's rows);
//   dwte: the rows are sorted by (token, row) (ops_twin.h: each row's key is
//   token << bits | row, all distinct, so the sorted order is fixed; CUB's
//   radix sort, O(N) passes over 8-byte keys), then thread (i, c) of the
//   first sorted row of each token walks that token's rows in row order
//   (enc_dwte_thread). O(N log N + N C) work for any N; a token that fills
//   many rows is one thread's walk per channel, the price of the fixed order.
// The keys and CUB's working memory live in a buffer this file keeps and
// grows when a batch needs more (mem_alloc, counted as activations; the old
// buffer's cudaFree waits for the kernels that still use it). The forward
// grows it for its rows (enc_sort_reserve): an allocation waits for the
// device, and at the forward the compute stream waits on no transfer that
// another rank's host has yet to issue, where in the middle of a backward
// (a pipeline stage's, with sends and receives queued) it might.
static void* enc_sort_buf = NULL;
static size_t enc_sort_bytes = 0;

// The buffer's layout for N rows: keys, sorted keys (each rounded up to
// 256 bytes), CUB's working memory (its size from CUB's query, which
// computes it on the host and queues nothing).
static size_t enc_keys_bytes(int N) { return ((size_t)N * sizeof(unsigned long long) + 255) / 256 * 256; }
static size_t enc_temp_bytes(int N) {
    size_t temp_bytes = 0;
    CUDA_CHECK(cub::DeviceRadixSort::SortKeys(NULL, temp_bytes, (const unsigned long long*)NULL,
                                              (unsigned long long*)NULL, N, 0, enc_row_bits(N) + 32,
                                              cuda_compute_stream));
    return temp_bytes;
}

static void enc_sort_reserve(int N) {
    size_t need = 2 * enc_keys_bytes(N) + enc_temp_bytes(N);
    if (need > enc_sort_bytes) {
        if (enc_sort_buf) mem_free(enc_sort_buf);
        enc_sort_buf = mem_alloc(need, MEM_ACTIVATIONS);
        enc_sort_bytes = need;
    }
}

__global__ void enc_keys_kernel(unsigned long long* keys, const int* tokens, int N, int bits) {
    FOR_EACH_INDEX(n, (size_t)N) keys[n] = enc_key(tokens[n], (int)n, bits);
}

// dwte rows [v0, v0 + nrows) (the whole table: v0 = 0, nrows = INT_MAX)
__global__ void enc_dwte_kernel(float* dwte, const float* dout, const unsigned long long* sorted, int N, int C,
                                int bits, int v0, int nrows) {
    FOR_EACH_INDEX(i, (size_t)N * C) enc_dwte_thread(dwte, dout, sorted, N, C, bits, v0, nrows, (int)(i / C),
                                                     (int)(i % C));
}

__global__ void enc_dwpe_kernel(float* dwpe, const float* dout, int N, int T, int C) {
    FOR_EACH_INDEX(i, (size_t)T * C) {
        int t = (int)(i / C), c = (int)(i % C);
        float acc = dwpe[i];
        for (int n = t; n < N; n += T) acc += dout[(size_t)n * C + c];
        dwpe[i] = acc;
    }
}

// Sorts the N rows' keys; returns the sorted keys (device memory).
static const unsigned long long* enc_sorted_keys(const int* tokens, int N, int bits) {
    enc_sort_reserve(N);  // grown already by the forward of these rows, unless called alone
    size_t keys_bytes = enc_keys_bytes(N), temp_bytes = enc_temp_bytes(N);
    unsigned long long* keys = (unsigned long long*)enc_sort_buf;
    unsigned long long* sorted = (unsigned long long*)((char*)enc_sort_buf + keys_bytes);
    void* temp = (char*)enc_sort_buf + 2 * keys_bytes;
    enc_keys_kernel<<<grid_for((size_t)N), THREADS, 0, cuda_compute_stream>>>(keys, tokens, N, bits);
    KERNEL_CHECK();
    CUDA_CHECK(cub::DeviceRadixSort::SortKeys(temp, temp_bytes, (const unsigned long long*)keys, sorted, N, 0,
                                              bits + 32, cuda_compute_stream));
    return sorted;
}

static void encoder_backward_rows(float* dwte, float* dwpe, const float* dout, const int* tokens, int N, int T,
                                  int C, int v0, int nrows) {
    if ((!dwte && !dwpe) || N == 0 || C == 0) return;
    if (dwte) {
        int bits = enc_row_bits(N);
        const unsigned long long* sorted = enc_sorted_keys(tokens, N, bits);
        enc_dwte_kernel<<<grid_for((size_t)N * C), THREADS, 0, cuda_compute_stream>>>(dwte, dout, sorted, N, C,
                                                                                      bits, v0, nrows);
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
    enc_sort_reserve(B * T);
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

// dw, db: sums over the rows, a block per (tile of channels, chunk of rows)
// (coalesced; see column_lanes_sum and col_chunks). Threads past the last
// channel add nothing but still take part in the tree. One chunk: the block
// adds its sums into dw, db; more: into the partials, dw's at
// col_partials, db's COL_MAX_PARTIALS floats on.
__global__ void __launch_bounds__(COL_THREADS)
    layernorm_backward_dwdb_kernel(float* dw, float* db, const float* dout, const float* inp, const float* mean,
                                   const float* rstd, int N, int C) {
    int c = blockIdx.x * COL_TILE + threadIdx.x, r = blockIdx.y;
    float sw = 0.0f, sb = 0.0f;
    if (c < C) col_lane_sum_ln(&sw, &sb, dout, inp, mean, rstd, N, C, c, r, threadIdx.y);
    sw = column_lanes_sum(sw);
    sb = column_lanes_sum(sb);
    if (threadIdx.y != 0 || c >= C) return;
    if (gridDim.y == 1) {
        if (dw) dw[c] += sw;
        if (db) db[c] += sb;
    } else {
        col_partials[(size_t)r * C + c] = sw;
        col_partials[COL_MAX_PARTIALS + (size_t)r * C + c] = sb;
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
        dim3 grid = column_grid(N, C);
        layernorm_backward_dwdb_kernel<<<grid, column_block(), 0, cuda_compute_stream>>>(dw, db, dout, inp,
                                                                                       mean, rstd, N, C);
        KERNEL_CHECK();
        if (grid.y > 1) {
            float* partials = NULL;
            CUDA_CHECK(cudaGetSymbolAddress((void**)&partials, col_partials));
            if (dw) {
                column_partials_kernel<<<grid_for((size_t)C), THREADS, 0, cuda_compute_stream>>>(
                    dw, partials, (int)grid.y, C);
                KERNEL_CHECK();
            }
            if (db) {
                column_partials_kernel<<<grid_for((size_t)C), THREADS, 0, cuda_compute_stream>>>(
                    db, partials + COL_MAX_PARTIALS, (int)grid.y, C);
                KERNEL_CHECK();
            }
        }
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

// dbias: sums of dout over the rows, a block per (tile of output columns,
// chunk of rows), as LayerNorm's dw/db (column_lanes_sum, col_chunks). A
// cuBLAS gemv of dout^T with a vector of ones would read coalesced too, but
// needs that vector in device memory (N floats, growing with the batch), and
// LayerNorm's dw (a sum of products formed on the fly) would still need this
// kernel: one kernel serves both.
__global__ void __launch_bounds__(COL_THREADS) bias_backward_kernel(float* dbias, const float* dout, int N, int OC) {
    int k = blockIdx.x * COL_TILE + threadIdx.x, r = blockIdx.y;
    float s = k < OC ? col_lane_sum(dout, N, OC, k, r, threadIdx.y) : 0.0f;
    s = column_lanes_sum(s);
    if (threadIdx.y != 0 || k >= OC) return;
    if (gridDim.y == 1) dbias[k] += s;
    else col_partials[(size_t)r * OC + k] = s;
}

extern "C" void matmul_backward(float* dinp, float* dw, float* dbias, const float* dout,
                                const float* inp, const float* w, int N, int C, int OC) {
    if (N <= 0 || C <= 0 || OC <= 0) return;
    // dinp (N, C) += dout (N, OC) @ w (OC, C)
    if (dinp) sgemm_rm(0, 0, N, C, OC, 1.0f, dout, OC, w, C, 1.0f, dinp, C);
    // dw (OC, C) += dout^T (OC, N) @ inp (N, C)
    if (dw) sgemm_rm(1, 0, OC, C, N, 1.0f, dout, OC, inp, C, 1.0f, dw, C);
    if (dbias) {
        dim3 grid = column_grid(N, OC);
        bias_backward_kernel<<<grid, column_block(), 0, cuda_compute_stream>>>(dbias, dout, N, OC);
        KERNEL_CHECK();
        if (grid.y > 1) {
            float* partials = NULL;
            CUDA_CHECK(cudaGetSymbolAddress((void**)&partials, col_partials));
            column_partials_kernel<<<grid_for((size_t)OC), THREADS, 0, cuda_compute_stream>>>(dbias, partials,
                                                                                           (int)grid.y, OC);
            KERNEL_CHECK();
        }
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

// ---------------------------------------------------------------- attention in O(T) memory
// FlashAttention (Dao et al. 2022; Dao 2023) on the online softmax of
// Milakov & Gimelshein 2018, the twin of the CPU's attention_flash_*: the
// same per-row recurrence (ops.c states it), in tiles of shared memory.
// One set of three kernels serves the whole sequence (attention_flash_*)
// and a (query chunk, kv chunk) pair of context parallelism (the chunk ops
// below): a FlashArgs (ops_twin.h) says where the queries and keys sit, and
// a ring step is one more block of keys at its own offset.
// A simple kernel, written to be read rather than to be fast: one thread per
// query row (forward, dq) or per key row (dk, dv), so each row's sums run
// in one fixed order on one thread (no atomics, the same bits every run, a
// row's bits its own whatever B and T), and the tiles of keys, values and
// queries a block's threads share are loaded once into shared memory by all
// of them. A block is one (query tile or key tile, head, batch row):
// grid (tiles, NH, B). What each thread does between two __syncthreads()
// is a function in ops_twin.h, which tests/test_cuda_twins.c runs for every
// thread on the CPU. FlashAttention's production kernels split a row over
// a warp and run the products on tensor cores; this one keeps the algorithm
// in plain sight.

// The kernels take their FlashArgs as a __grid_constant__ parameter, so
// the phases read it where it lies (&a points into the parameter space,
// no copy per thread). Every __syncthreads() sits in a loop whose bounds
// are the block's (its tile and the arguments), never a thread's, so all
// threads of a block reach each one, as CUDA requires; a thread with no
// row of its own (past Tq or Tk) still loads and waits, and its step does
// nothing.

// Dynamic shared memory past 48 KiB must be asked for per kernel (large hs).
static void flash_smem_limit(const void* kernel, size_t bytes) {
    if (bytes > 48 * 1024)
        CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
}

// Forward: block (query tile, h, b); thread r owns query row i0 + r, its
// running max m and sum l in registers, its q and o rows in shared memory.
__global__ void attention_flash_forward_kernel(__grid_constant__ const FlashArgs a) {
    extern __shared__ float sm[];
    const FlashTiles t = flash_tiles(sm, FLASH_FWD, flash_hs(&a));
    const int i0 = blockIdx.x * FLASH_TILE, h = blockIdx.y, b = blockIdx.z, r = threadIdx.x;
    flash_fwd_begin(&a, t, b, h, i0, r);
    float m = -INFINITY, l = 0.0f;
    const int end = flash_key_end(&a, i0);
    for (int j0 = 0; j0 < end; j0 += FLASH_TILE) {
        __syncthreads();  // everyone is done with the previous tile (and the queries are in)
        flash_load_kv(&a, t, b, h, j0, flash_hs(&a), r);
        __syncthreads();
        flash_fwd_step(&a, t, i0, j0, r, &m, &l);
    }
    flash_fwd_end(&a, t, b, h, i0, r, m, l);
}

// dk, dv: block (key tile, h, b); thread r owns key row j0 + r and adds up,
// over every query that sees it in order (the query tiles in turn),
//   p = e^(q_i.k_j scale - lse_i), ds = p (dout_i.v_j - D_i) scale,
//   dk_j += ds q_i, dv_j += p dout_i.
__global__ void attention_flash_dkdv_kernel(__grid_constant__ const FlashArgs a) {
    extern __shared__ float sm[];
    const FlashTiles t = flash_tiles(sm, FLASH_DKDV, flash_hs(&a));
    const int j0 = blockIdx.x * FLASH_TILE, h = blockIdx.y, b = blockIdx.z, r = threadIdx.x;
    flash_dkdv_begin(&a, t, b, h, j0, r);
    for (int i0 = flash_first_query(&a, j0); i0 < a.Tq; i0 += FLASH_TILE) {
        __syncthreads();
        flash_load_queries(&a, t, b, h, i0, r);
        __syncthreads();
        flash_dkdv_step(&a, t, i0, j0, r);
    }
    flash_dkdv_end(&a, t, b, h, j0, r);
}

// dq: block (query tile, h, b); thread r owns query row i0 + r and adds up,
// over every key it sees in order, dq_i += ds k_j.
__global__ void attention_flash_dq_kernel(__grid_constant__ const FlashArgs a) {
    extern __shared__ float sm[];
    const FlashTiles t = flash_tiles(sm, FLASH_DQ, flash_hs(&a));
    const int i0 = blockIdx.x * FLASH_TILE, h = blockIdx.y, b = blockIdx.z, r = threadIdx.x;
    flash_dq_begin(&a, t, b, h, i0, r);
    const int end = flash_key_end(&a, i0);
    for (int j0 = 0; j0 < end; j0 += FLASH_TILE) {
        __syncthreads();
        flash_load_kv(&a, t, b, h, j0, flash_hs(&a), r);
        __syncthreads();
        flash_dq_step(&a, t, i0, j0, r);
    }
    flash_dq_end(&a, t, b, h, i0, r);
}

static dim3 flash_grid(int rows, int NH, int B) {
    return dim3((unsigned)((rows + FLASH_TILE - 1) / FLASH_TILE), (unsigned)NH, (unsigned)B);
}

// The forward of B batch rows: a's out and statistics, finished or partials.
static void flash_forward(const FlashArgs* a, int B) {
    const size_t smem = flash_smem_floats(FLASH_FWD, flash_hs(a)) * sizeof(float);
    flash_smem_limit((const void*)attention_flash_forward_kernel, smem);
    attention_flash_forward_kernel<<<flash_grid(a->Tq, a->NH, B), FLASH_TILE, smem, cuda_compute_stream>>>(*a);
    KERNEL_CHECK();
}

// The backward: two kernels, each over the pairs it needs, so that every
// gradient row is one thread's sum (no atomics): the probabilities are
// recomputed in both. They run one after the other on the stream and write
// disjoint rows or columns, so dq, dk, dv may be parts of one buffer.
static void flash_backward(const FlashArgs* a, int B) {
    const int hs = flash_hs(a);
    const size_t smem_kv = flash_smem_floats(FLASH_DKDV, hs) * sizeof(float);
    flash_smem_limit((const void*)attention_flash_dkdv_kernel, smem_kv);
    attention_flash_dkdv_kernel<<<flash_grid(a->Tk, a->NH, B), FLASH_TILE, smem_kv, cuda_compute_stream>>>(*a);
    KERNEL_CHECK();
    const size_t smem_q = flash_smem_floats(FLASH_DQ, hs) * sizeof(float);
    flash_smem_limit((const void*)attention_flash_dq_kernel, smem_q);
    attention_flash_dq_kernel<<<flash_grid(a->Tq, a->NH, B), FLASH_TILE, smem_q, cuda_compute_stream>>>(*a);
    KERNEL_CHECK();
}

// The whole sequence of a (B, T, 3C) qkv: one query chunk, one kv chunk,
// both at position 0.
static FlashArgs flash_whole(const float* qkv, int T, int C, int NH) {
    FlashArgs a = {};  // every field zero: NULL pointers, q0 = k0 = 0
    a.q = qkv, a.k = qkv + C, a.v = qkv + 2 * C;
    a.q_stride = a.kv_stride = 3 * C;
    a.Tq = a.Tk = T;
    a.C = C, a.NH = NH;
    a.scale = 1.0f / sqrtf((float)(C / NH));
    return a;
}

extern "C" void attention_flash_forward(float* out, float* lse, const float* qkv, int B, int T, int C,
                                        int NH) {
    if (B <= 0 || T <= 0 || NH <= 0) return;
    FlashArgs a = flash_whole(qkv, T, C, NH);
    a.out = out, a.stat_m = lse, a.finish = 1;
    flash_forward(&a, B);
}

extern "C" void attention_flash_backward(float* dqkv, const float* dout, const float* qkv,
                                         const float* out, const float* lse, int B, int T, int C,
                                         int NH) {
    if (B <= 0 || T <= 0 || NH <= 0) return;
    FlashArgs a = flash_whole(qkv, T, C, NH);
    a.out = (float*)out;  // read only in backward
    a.dout = dout, a.lse = lse;
    a.dq = dqkv, a.dk = dqkv + C, a.dv = dqkv + 2 * C;
    flash_backward(&a, B);
}

// ---------------------------------------------------------------- attention on sequence chunks
// A (query chunk, kv chunk) pair is a rectangle of the score matrix, cut by
// the causal diagonal where the two chunks overlap in position: the kernels
// above with the chunks' positions (q0, k0) and row strides. Nothing is
// stored per pair but its partials (B, Tq, C) + 2 (B, Tq, NH), as on the
// CPU: a ring of chapter 6 is one more level of the same recurrence, a kv
// chunk a block of keys that lives on another rank, folded in by
// attention_chunk_merge.

static FlashArgs flash_pair(const float* q, int q_stride, const float* k, const float* v, int kv_stride,
                            int Tq, int Tk, int q0, int k0, int C, int NH) {
    FlashArgs a = {};  // every field zero: NULL pointers, q0 = k0 = 0
    a.q = q, a.k = k, a.v = v;
    a.q_stride = q_stride, a.kv_stride = kv_stride;
    a.Tq = Tq, a.Tk = Tk > 0 ? Tk : 0, a.q0 = q0, a.k0 = k0;
    a.C = C, a.NH = NH;
    a.scale = 1.0f / sqrtf((float)(C / NH));
    return a;
}

extern "C" void attention_chunk_forward(float* out, float* rowmax, float* sumexp, const float* q,
                                        int q_stride, const float* k, const float* v,
                                        int kv_stride, int B, int Tq, int Tk, int q0, int k0,
                                        int C, int NH) {
    if (B <= 0 || Tq <= 0 || NH <= 0) return;
    // Tk = 0, or a chunk wholly in the future, still runs: every row is
    // written as empty (no key tile to meet)
    FlashArgs a = flash_pair(q, q_stride, k, v, kv_stride, Tq, Tk, q0, k0, C, NH);
    a.out = out, a.stat_m = rowmax, a.stat_l = sumexp, a.finish = 0;
    flash_forward(&a, B);
}

// One thread per (token, head) row: the CPU's loop body (ops_twin.h).
__global__ void attention_chunk_merge_kernel(float* out, float* rowmax, float* sumexp,
                                             const float* out2, const float* rowmax2,
                                             const float* sumexp2, size_t rows, int hs) {
    FOR_EACH_INDEX(r, rows) flash_merge_row(out, rowmax, sumexp, out2, rowmax2, sumexp2, r, hs);
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

// One thread per (token, head) row, as merge.
__global__ void attention_chunk_finish_kernel(float* out, float* lse, const float* rowmax,
                                              const float* sumexp, size_t rows, int hs) {
    FOR_EACH_INDEX(r, rows) flash_finish_row(out, lse, rowmax, sumexp, r, hs);
}

extern "C" void attention_chunk_finish(float* out, float* lse, const float* rowmax,
                                       const float* sumexp, int B, int Tq, int C, int NH) {
    if (B <= 0 || Tq <= 0 || NH <= 0) return;
    size_t rows = (size_t)B * Tq * NH;
    attention_chunk_finish_kernel<<<grid_for(rows), THREADS, 0, cuda_compute_stream>>>(
        out, lse, rowmax, sumexp, rows, C / NH);
    KERNEL_CHECK();
}

extern "C" void attention_chunk_backward(float* dq, float* dk, float* dv, const float* dout,
                                         const float* out, const float* lse, const float* q,
                                         int q_stride, const float* k, const float* v,
                                         int kv_stride, int B, int Tq, int Tk, int q0, int k0,
                                         int C, int NH) {
    if (B <= 0 || Tq <= 0 || Tk <= 0 || NH <= 0) return;
    FlashArgs a = flash_pair(q, q_stride, k, v, kv_stride, Tq, Tk, q0, k0, C, NH);
    a.out = (float*)out;  // read only in backward
    a.dout = dout, a.lse = lse;
    a.dq = dq, a.dk = dk, a.dv = dv;
    flash_backward(&a, B);
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
// element for the row copies and sums, a warp per (token, slot) for the
// gate gradient's dot product (32 lanes over the C terms, then a tree; not
// the CPU's order, so those bits may differ from the CPU's in the last place).

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

// The gate gradient: a warp per (token, slot) (ops_twin.h, dgate_lane_sum):
// lane l sums channels l, l + 32, ... in order, so each of the warp's loads
// reads 32 consecutive floats of each row (a thread per slot reading its own
// row would touch 32 segments per load), then the lanes add up in a tree of
// shuffles. The bits depend on the two rows and C only.
__global__ void moe_combine_dgates_kernel(float* dgates, const float* dout, const float* rows,
                                          const int* pos, int N, int k, int C) {
    size_t total = (size_t)N * k;
    size_t warps = (size_t)gridDim.x * (blockDim.x / GATE_LANES);
    int lane = (int)(threadIdx.x % GATE_LANES);
    // the loop's bound is the same for every lane of a warp, so all 32 reach
    // each shuffle together
    for (size_t tj = (size_t)blockIdx.x * (blockDim.x / GATE_LANES) + threadIdx.x / GATE_LANES; tj < total;
         tj += warps) {
        int r = pos[tj];
        if (r < 0) continue;
        float dot = dgate_lane_sum(dout + (tj / k) * C, rows + (size_t)r * C, C, lane);
        for (int offset = GATE_LANES / 2; offset > 0; offset /= 2)
            dot += __shfl_down_sync(0xffffffffu, dot, offset);
        if (lane == 0) dgates[tj] += dot;
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
        size_t warps = (size_t)N * k;  // a warp per (token, slot)
        moe_combine_dgates_kernel<<<grid_for(warps * GATE_LANES), THREADS, 0, cuda_compute_stream>>>(
            dgates, dout, rows, pos, N, k, C);
        KERNEL_CHECK();
    }
}
