// ops_flash.cu: causal self-attention in O(T) memory, and the same kernels on sequence
// chunks with offsets (ring and zigzag attention), on the GPU: the twin of
// common/cpu/ops_flash.c (shapes and semantics: common/ops/attention.h).
#include "ops_cuda.cuh"

// ---------------------------------------------------------------- attention in O(T) memory
// FlashAttention (Dao et al. 2022; Dao 2023) on the online softmax of
// Milakov & Gimelshein 2018, the twin of the CPU's attention_flash_*: the
// same per-row recurrence (common/cpu/ops_flash.c states it), in tiles of shared memory.
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

// Dynamic shared memory past 48 KiB must be asked for per kernel (large hs),
// up to the device's opt-in limit (cudaDevAttrMaxSharedMemoryPerBlockOptin:
// 163 KiB on an A100, 227 KiB on an H100). Past it the kernels cannot run:
// the run ends naming the head size, not with cudaFuncSetAttribute's
// "invalid argument" (the CPU twin has no such limit).
static void flash_smem_limit(const void* kernel, size_t bytes, int hs) {
    if (bytes <= 48 * 1024) return;
    int device = 0, optin = 0;
    CUDA_CHECK(cudaGetDevice(&device));
    CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
    if (bytes > (size_t)optin)
        fatal_at(__FILE__, __LINE__,
                 "flash attention at head size %d (channels / heads) needs %zu bytes of shared memory a block; "
                 "this GPU gives a block at most %d: a model with more heads (a smaller head size) runs here",
                 hs, bytes, optin);
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
    flash_smem_limit((const void*)attention_flash_forward_kernel, smem, flash_hs(a));
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
    flash_smem_limit((const void*)attention_flash_dkdv_kernel, smem_kv, hs);
    attention_flash_dkdv_kernel<<<flash_grid(a->Tk, a->NH, B), FLASH_TILE, smem_kv, cuda_compute_stream>>>(*a);
    KERNEL_CHECK();
    const size_t smem_q = flash_smem_floats(FLASH_DQ, hs) * sizeof(float);
    flash_smem_limit((const void*)attention_flash_dq_kernel, smem_q, hs);
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
