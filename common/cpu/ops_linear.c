// ops_linear.c: the linear layer: CBLAS's matmuls, and the row-by-row form whose rows
// do not depend on their neighbours, on the CPU (shapes and semantics:
// common/ops/linear.h).
#include "ops_cpu.h"

// ---------------------------------------------------------------- linear

void matmul_forward(float* out, const float* inp, const float* w, const float* bias,
                    int N, int C, int OC) {
    progress();
    double t0 = optime_start();
    // out (N, OC) = inp (N, C) @ w^T, w stored (OC, C)
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, OC, C,
                1.0f, inp, C, w, C, 0.0f, out, OC);
    if (bias) {
        #pragma omp parallel for
        for (int n = 0; n < N; n++) {
            float* o = out + (size_t)n * OC;
            for (int k = 0; k < OC; k++) o[k] += bias[k];
        }
    }
    optime_stop(OPK_MATMUL, OP_FWD, t0);
}

void matmul_backward(float* dinp, float* dw, float* dbias, const float* dout,
                     const float* inp, const float* w, int N, int C, int OC) {
    progress();
    double t0 = optime_start();
    // dinp (N, C) += dout (N, OC) @ w (OC, C)
    if (dinp)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, C, OC,
                    1.0f, dout, OC, w, C, 1.0f, dinp, C);
    // dw (OC, C) += dout^T (OC, N) @ inp (N, C)
    if (dw)
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, C, N,
                    1.0f, dout, OC, inp, C, 1.0f, dw, C);
    // dbias (OC) += sum over rows of dout: each thread takes a block of
    // columns and walks the rows in order, so it reads dout row by row
    // (contiguous, vectorised over the block) where a column at a time would
    // stride OC floats per add; each column still sums its rows 0..N-1 in
    // order, so the bits are those of the one-column loop.
    if (dbias) {
        #pragma omp parallel for
        for (int k0 = 0; k0 < OC; k0 += OPS_COL_BLOCK) {
            int nk = OC - k0 < OPS_COL_BLOCK ? OC - k0 : OPS_COL_BLOCK;
            float s[OPS_COL_BLOCK] = {0};
            for (int n = 0; n < N; n++) {
                const float* d = dout + (size_t)n * OC + k0;
                for (int k = 0; k < nk; k++) s[k] += d[k];
            }
            for (int k = 0; k < nk; k++) dbias[k0 + k] += s[k];
        }
    }
    optime_stop(OPK_MATMUL, OP_BWD, t0);
}

// ---------------------------------------------------------------- linear, row by row
// out (R, J) = a (R, K) @ b (K, J), each element summed over k in order, a
// multiply then an add (C11 without fp-contract: no fused multiply-add),
// then written (+ bias) or added into out. A tile of RW_MR rows by RW_NR
// columns keeps its sums in registers as vectors of 8 columns (gcc's vector
// extension: 8 lanes whatever the instruction set, two SSE registers or one
// AVX register each): the lanes run across the tile's columns, so no sum is
// ever split across lanes, and the edge tiles, in plain C, add each element
// in the same order as the full ones.
// The tile fits the register file: 8 x 32 floats in 32 AVX registers (or
// in 16, where gcc's spills to L1 cost little: 2/3 of OpenBLAS's speed at
// 384 x 1536, measured), 4 x 8 in 8 pairs of SSE registers. A row's bits do
// not depend on it: each element adds the same products in the same order.
#ifdef __AVX__
#define RW_MR 8
#define RW_NR 32
#else
#define RW_MR 4
#define RW_NR 8
#endif
typedef float Lanes8 __attribute__((vector_size(8 * sizeof(float))));
// the same 8 floats read where a float may sit (4-byte aligned, and allowed
// to alias the float buffers it reads)
typedef float Lanes8Load __attribute__((vector_size(8 * sizeof(float)), aligned(4), may_alias));

static void rows_times_tile(float* out, int ldo, const float* a, int lda, const float* b, int ldb,
                            int K, const float* bias, int accumulate) {
    Lanes8 acc[RW_MR][RW_NR / 8];
    for (int r = 0; r < RW_MR; r++)
        for (int v = 0; v < RW_NR / 8; v++) acc[r][v] = (Lanes8){0};
    for (int k = 0; k < K; k++) {
        const Lanes8Load* bk = (const Lanes8Load*)(b + (size_t)k * ldb);
        for (int r = 0; r < RW_MR; r++) {
            float x = a[(size_t)r * lda + k];
            for (int v = 0; v < RW_NR / 8; v++) acc[r][v] += x * bk[v];
        }
    }
    for (int r = 0; r < RW_MR; r++) {
        float* o = out + (size_t)r * ldo;
        for (int j = 0; j < RW_NR; j++) {
            float sum = acc[r][j / 8][j % 8];
            o[j] = accumulate ? o[j] + sum : (bias ? sum + bias[j] : sum);
        }
    }
}

static void rows_times_edge(float* out, int ldo, const float* a, int lda, const float* b, int ldb, int mr,
                            int nr, int K, const float* bias, int accumulate) {
    for (int r = 0; r < mr; r++)
        for (int j = 0; j < nr; j++) {
            float sum = 0.0f;
            for (int k = 0; k < K; k++) sum += a[(size_t)r * lda + k] * b[(size_t)k * ldb + j];
            float* o = out + (size_t)r * ldo + j;
            *o = accumulate ? *o + sum : (bias ? sum + bias[j] : sum);
        }
}

static void rows_times_matrix(float* out, int ldo, const float* a, int lda, const float* b, int ldb,
                              int R, int K, int J, const float* bias, int accumulate) {
    #pragma omp parallel for collapse(2) schedule(static)
    for (int j0 = 0; j0 < J; j0 += RW_NR) {
        for (int r0 = 0; r0 < R; r0 += RW_MR) {
            int mr = R - r0 < RW_MR ? R - r0 : RW_MR, nr = J - j0 < RW_NR ? J - j0 : RW_NR;
            float* o = out + (size_t)r0 * ldo + j0;
            const float* ar = a + (size_t)r0 * lda;
            const float* bias_j = bias ? bias + j0 : NULL;
            if (mr == RW_MR && nr == RW_NR)
                rows_times_tile(o, ldo, ar, lda, b + j0, ldb, K, bias_j, accumulate);
            else
                rows_times_edge(o, ldo, ar, lda, b + j0, ldb, mr, nr, K, bias_j, accumulate);
        }
    }
}

void matmul_forward_rowwise(float* out, const float* inp, const float* w, const float* bias,
                            int N, int C, int OC) {
    if (N <= 0 || OC <= 0) return;
    progress();
    double t0 = optime_start();
    // w^T (C, OC), so that one input channel's weights for every output are
    // contiguous: a working buffer of the call (C x OC floats, as attention's
    // tiles: host memory, not counted), its cost C*OC against N*C*OC
    float* wt = xmalloc((size_t)C * OC * sizeof(float));
    #pragma omp parallel for
    for (int c = 0; c < C; c++)
        for (int o = 0; o < OC; o++) wt[(size_t)c * OC + o] = w[(size_t)o * C + c];
    rows_times_matrix(out, OC, inp, C, wt, OC, N, C, OC, bias, 0);
    free(wt);
    optime_stop(OPK_MATMUL, OP_FWD, t0);
}

void matmul_backward_input_rowwise(float* dinp, const float* dout, const float* w, int N, int C,
                                   int OC) {
    if (N <= 0 || C <= 0) return;
    progress();
    double t0 = optime_start();
    // w (OC, C) already holds one output's weights for every channel contiguously
    rows_times_matrix(dinp, C, dout, OC, w, C, N, OC, C, NULL, 1);
    optime_stop(OPK_MATMUL, OP_BWD, t0);
}
