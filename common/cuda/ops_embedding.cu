// ops_embedding.cu: the token and position embedding, whole and by vocabulary shard, on
// the GPU: the twin of common/cpu/ops_embedding.c (shapes and semantics:
// common/ops/embedding.h).
#include "ops_cuda.cuh"

#include <cub/device/device_radix_sort.cuh>

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
