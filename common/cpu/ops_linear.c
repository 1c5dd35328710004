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
// multiply then an add, then written (+ bias) or added into out. The product
// is a statement of its own: a compiler may fuse a*b+c written as one
// expression into a fused multiply-add (clang does, gcc in -std=c11 does
// not), never across two statements, so every compiler adds these bits.
// That order is the whole contract; what follows only decides how fast the
// machine walks it.
// - A tile of RW_MR rows by RW_NR columns keeps its sums in registers as
//   vectors of 8 columns (gcc's vector extension: 8 lanes whatever the
//   instruction set, two SSE registers or one AVX register each): the lanes
//   run across the tile's columns, so no sum is ever split across lanes, and
//   a tile of fewer rows (a call's last R % RW_MR) runs the same vector loop
//   over its rows, and the columns past the last full panel, in plain C, add
//   each element in the same order. The tile fills the register file but
//   for the two vectors of b and the product in flight: 6 x 16 floats in 12
//   of the 16 AVX registers (AVX-512's 32 would take a larger tile, not timed
//   here), 4 x 8 in 8 pairs of SSE registers.
// - b is first copied into panels of RW_NR columns (panel p: columns
//   [p NR, p NR + nr) of every k, contiguous), so a tile reads one stream as
//   it walks k instead of a row of b every J floats.
// - The rows go in blocks of RW_RB tiles: a block's rows of a stay in cache
//   while they meet every panel.
// A row's bits depend on none of it: each element adds the same products in
// the same order. build/roofline times these products beside the BLAS call
// (docs/notes/07_expert.md: what the tile, the panels and the blocks gave
// together).
#if defined(__AVX__)
#define RW_MR 6
#define RW_NR 16
#else
#define RW_MR 4
#define RW_NR 8
#endif
#define RW_RB 4
typedef float Lanes8 __attribute__((vector_size(8 * sizeof(float))));
// the same 8 floats read where a float may sit (4-byte aligned, and allowed
// to alias the float buffers it reads)
typedef float Lanes8Load __attribute__((vector_size(8 * sizeof(float)), aligned(4), may_alias));

// mr (1 to RW_MR) rows of a times b, the tile's panel, (K, RW_NR)
// contiguous. Inlined into the two callers below, so that the full tile's
// mr is the constant RW_MR and its sums stay in registers.
static inline __attribute__((always_inline)) void rows_times_panel(float* out, int ldo, const float* a, int lda,
                                                                   const float* b, int mr, int K, const float* bias,
                                                                   int accumulate) {
    Lanes8 acc[RW_MR][RW_NR / 8];
    for (int r = 0; r < mr; r++)
        for (int v = 0; v < RW_NR / 8; v++) acc[r][v] = (Lanes8){0};
    for (int k = 0; k < K; k++) {
        const Lanes8Load* bk = (const Lanes8Load*)(b + (size_t)k * RW_NR);
        for (int r = 0; r < mr; r++) {
            float x = a[(size_t)r * lda + k];
            for (int v = 0; v < RW_NR / 8; v++) {
                Lanes8 product = x * bk[v];
                acc[r][v] += product;
            }
        }
    }
    for (int r = 0; r < mr; r++) {
        float* o = out + (size_t)r * ldo;
        for (int j = 0; j < RW_NR; j++) {
            float sum = acc[r][j / 8][j % 8];
            o[j] = accumulate ? o[j] + sum : (bias ? sum + bias[j] : sum);
        }
    }
}

static void rows_times_tile(float* out, int ldo, const float* a, int lda, const float* b, int K, const float* bias,
                            int accumulate) {
    rows_times_panel(out, ldo, a, lda, b, RW_MR, K, bias, accumulate);
}

// a call's last R % RW_MR rows, through the same vector loop
static void rows_times_short(float* out, int ldo, const float* a, int lda, const float* b, int mr, int K,
                             const float* bias, int accumulate) {
    rows_times_panel(out, ldo, a, lda, b, mr, K, bias, accumulate);
}

// the last panel, nr < RW_NR columns: b (K, nr) contiguous
static void rows_times_edge(float* out, int ldo, const float* a, int lda, const float* b, int mr, int nr,
                            int K, const float* bias, int accumulate) {
    for (int r = 0; r < mr; r++)
        for (int j = 0; j < nr; j++) {
            float sum = 0.0f;
            for (int k = 0; k < K; k++) {
                float product = a[(size_t)r * lda + k] * b[(size_t)k * nr + j];
                sum += product;
            }
            float* o = out + (size_t)r * ldo + j;
            *o = accumulate ? *o + sum : (bias ? sum + bias[j] : sum);
        }
}

// b (K, J) in panels of RW_NR columns (the last one nr wide), from w: its
// element (k, j) is w[j K + k] when w_is_transposed (a weight (OC, C) read
// as (C, OC)), else w[k J + j]. A working buffer of the call (K x J floats,
// as attention's tiles: host memory, not counted), its cost K J against R K J.
static float* pack_panels(const float* w, int K, int J, int w_is_transposed) {
    float* panels = xmalloc((size_t)K * J * sizeof(float));
    #pragma omp parallel for schedule(static)
    for (int j0 = 0; j0 < J; j0 += RW_NR) {
        int nr = J - j0 < RW_NR ? J - j0 : RW_NR;
        float* p = panels + (size_t)j0 * K;
        for (int k = 0; k < K; k++)
            for (int j = 0; j < nr; j++)
                p[(size_t)k * nr + j] = w_is_transposed ? w[(size_t)(j0 + j) * K + k] : w[(size_t)k * J + j0 + j];
    }
    return panels;
}

static void rows_times_matrix(float* out, int ldo, const float* a, int lda, const float* panels, int R, int K,
                              int J, const float* bias, int accumulate) {
    const int block = RW_MR * RW_RB;
    #pragma omp parallel for collapse(2) schedule(static)
    for (int rb = 0; rb < R; rb += block) {
        for (int j0 = 0; j0 < J; j0 += RW_NR) {
            int nr = J - j0 < RW_NR ? J - j0 : RW_NR;
            const float* b = panels + (size_t)j0 * K;
            const float* bias_j = bias ? bias + j0 : NULL;
            for (int r0 = rb; r0 < R && r0 < rb + block; r0 += RW_MR) {
                int mr = R - r0 < RW_MR ? R - r0 : RW_MR;
                float* o = out + (size_t)r0 * ldo + j0;
                const float* ar = a + (size_t)r0 * lda;
                if (mr == RW_MR && nr == RW_NR)
                    rows_times_tile(o, ldo, ar, lda, b, K, bias_j, accumulate);
                else if (nr == RW_NR)
                    rows_times_short(o, ldo, ar, lda, b, mr, K, bias_j, accumulate);
                else
                    rows_times_edge(o, ldo, ar, lda, b, mr, nr, K, bias_j, accumulate);
            }
        }
    }
}

void matmul_forward_rowwise(float* out, const float* inp, const float* w, const float* bias,
                            int N, int C, int OC) {
    if (N <= 0 || OC <= 0) return;
    progress();
    double t0 = optime_start();
    float* panels = pack_panels(w, C, OC, 1);  // b = w^T (C, OC): one channel's weights for every output
    rows_times_matrix(out, OC, inp, C, panels, N, C, OC, bias, 0);
    free(panels);
    optime_stop(OPK_MATMUL, OP_FWD, t0);
}

void matmul_backward_input_rowwise(float* dinp, const float* dout, const float* w, int N, int C,
                                   int OC) {
    if (N <= 0 || C <= 0) return;
    progress();
    double t0 = optime_start();
    float* panels = pack_panels(w, OC, C, 0);  // b = w (OC, C): one output's weights for every channel
    rows_times_matrix(dinp, C, dout, OC, panels, N, OC, C, NULL, 1);
    free(panels);
    optime_stop(OPK_MATMUL, OP_BWD, t0);
}
