// ops_experts.cu: the router and the token traffic of a mixture-of-experts layer, on
// the GPU: the twin of common/cpu/ops_experts.c (shapes and semantics:
// common/ops/experts.h).
#include "ops_cuda.cuh"

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
