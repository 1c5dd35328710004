// ops_linear.cu: the linear layer: cuBLAS's matmuls, and the row-by-row form, on the
// GPU: the twin of common/cpu/ops_linear.c (shapes and semantics: common/ops/linear.h).
#include "ops_columns.cuh"

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
__global__ void __launch_bounds__(COL_THREADS) bias_backward_kernel(float* dbias, float* partials, const float* dout, int N,
                                                                    int OC) {
    int k = blockIdx.x * COL_TILE + threadIdx.x, r = blockIdx.y;
    float s = k < OC ? col_lane_sum(dout, N, OC, k, r, threadIdx.y) : 0.0f;
    s = column_lanes_sum(s);
    if (threadIdx.y != 0 || k >= OC) return;
    if (gridDim.y == 1) dbias[k] += s;
    else partials[(size_t)r * OC + k] = s;
}

extern "C" void matmul_backward(float* dinp, float* dw, float* dbias, const float* dout,
                                const float* inp, const float* w, int N, int C, int OC) {
    if (N <= 0 || OC <= 0) return;
    // dinp (N, C) += dout (N, OC) @ w (OC, C); C = 0: nothing, but dbias
    // is still added, as on the CPU
    if (dinp && C > 0) sgemm_rm(0, 0, N, C, OC, 1.0f, dout, OC, w, C, 1.0f, dinp, C);
    // dw (OC, C) += dout^T (OC, N) @ inp (N, C)
    if (dw && C > 0) sgemm_rm(1, 0, OC, C, N, 1.0f, dout, OC, inp, C, 1.0f, dw, C);
    if (dbias) {
        dim3 grid = column_grid(N, OC);
        float* partials = column_partials();
        bias_backward_kernel<<<grid, column_block(), 0, cuda_compute_stream>>>(dbias, partials, dout, N, OC);
        KERNEL_CHECK();
        if (grid.y > 1) column_partials_add(dbias, partials, (int)grid.y, OC);
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
