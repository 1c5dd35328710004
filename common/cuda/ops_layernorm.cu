// ops_layernorm.cu: LayerNorm forward and backward, on the GPU: the twin of
// common/cpu/ops_layernorm.c (shapes and semantics: common/ops/layernorm.h).
#include "ops_columns.cuh"

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
// partials, db's COL_MAX_PARTIALS floats on.
__global__ void __launch_bounds__(COL_THREADS)
    layernorm_backward_dwdb_kernel(float* dw, float* db, float* partials, const float* dout, const float* inp,
                                   const float* mean, const float* rstd, int N, int C) {
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
        partials[(size_t)r * C + c] = sw;
        partials[COL_MAX_PARTIALS + (size_t)r * C + c] = sb;
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
        float* partials = column_partials();
        layernorm_backward_dwdb_kernel<<<grid, column_block(), 0, cuda_compute_stream>>>(dw, db, partials, dout,
                                                                                       inp, mean, rstd, N, C);
        KERNEL_CHECK();
        if (grid.y > 1) {
            if (dw) column_partials_add(dw, partials, (int)grid.y, C);
            if (db) column_partials_add(db, partials + COL_MAX_PARTIALS, (int)grid.y, C);
        }
    }
}
