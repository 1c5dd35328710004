// ops_attention.cu: causal self-attention that stores its (T, T) scores, the reference
// the O(T) op is held to, on the GPU: the twin of common/cpu/ops_attention.c (shapes
// and semantics: common/ops/attention.h).
#include "ops_cuda.cuh"

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
