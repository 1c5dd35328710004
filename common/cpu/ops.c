// ops.c: the GPT ops on the CPU, in C11 with OpenMP; matmuls through CBLAS.
// Shapes and semantics are documented in common/ops.h.
//
// Threading: loops use OpenMP; OpenBLAS is the OpenMP build, so a cblas call
// made outside a parallel region uses the same thread team, and one made inside
// a parallel region (attention, one head per thread) runs single-threaded.
//
// Progress: the long ops (matmuls, attention) start with progress(), the
// hook the comm layer sets to comm_progress, so non-blocking MPI operations
// in flight move while the rank computes (MPI moves them only inside MPI
// calls; see common/comm.h). A no-op when none is.
#include "ops.h"

#include <cblas.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "memory.h"  // xmalloc
#include "optime.h"

static void (*progress_hook)(void) = NULL;
void ops_set_progress_hook(void (*hook)(void)) { progress_hook = hook; }
static inline void progress(void) {
    if (progress_hook) progress_hook();
}

// Column sums over rows (a bias's or a LayerNorm weight's gradient) run over
// blocks of this many columns, one block per thread at a time.
#define OPS_COL_BLOCK 64

// Below this many floats ops_add, ops_scale and grad_sumsq run a plain loop. An OpenMP
// "parallel for if (small)" is not free: even when the if-clause is false the
// runtime still sets up a (one-thread) parallel region on every call, which
// costs more than adding a few floats (chapter 1's 8-byte all-reduce showed
// it). An explicit branch keeps small calls to a bare loop.
#define OPS_PARALLEL_MIN 16384

// expf in a form a loop can vectorise: a call to libm's expf keeps a loop
// scalar (one value at a time), while plain arithmetic lets gcc run 8 values
// per AVX instruction. e^x = 2^n e^r with n = round(x / ln 2) and
// r = x - n ln 2 (ln 2 in two parts, Cody-Waite, so r keeps its bits), e^r
// by Cephes' degree-6 polynomial on |r| <= ln 2 / 2, 2^n built in the
// exponent bits. Within 1.4 units of float rounding of the exact e^x on
// [-87, 88] (libm's expf: 1), measured; gelu and the attention softmax use
// it, and tests/test_ops.c holds both to the float64 reference. x is clamped
// to [-87, 88], where e^x stays a normal float; a NaN stays NaN (p is NaN,
// whatever 2^n its conversion gives), so a diverging run still shows it.
static inline float exp_lanes(float x) {
    x = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
    float n = floorf(x * 1.44269504088896341f + 0.5f);
    float r = x - n * 0.693359375f;   // ln 2 = 0.693359375 - 2.12194440e-4
    r = r + n * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    union { int32_t i; float f; } two_n = {.i = ((int32_t)n + 127) << 23};
    return p * two_n.f;
}

// Sums along a row in an order fixed by the index alone: lane l of
// SUM_LANES adds the elements l, l + SUM_LANES, l + 2 SUM_LANES, ... in
// turn, and the lanes are added as a fixed tree. A `#pragma omp simd
// reduction` would let the compiler pick the split: its vector width (4,
// 8 or 16 lanes with -march=native), an alignment peel that depends on the
// row's address, a scalar remainder that depends on the row's length; the
// same row then sums to other bits in another buffer or on another CPU.
// Here the lanes are explicit, so every build adds alike; gcc still runs
// them as one vector.
#define SUM_LANES 8
static inline float sum_of_lanes(const float acc[SUM_LANES]) {
    return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

// row[j] = e^(row[j] - mx) for j < n, in place; returns their sum.
static inline float exp_and_sum(float* row, int n, float mx) {
    float acc[SUM_LANES] = {0};
    int j = 0;
    for (; j + SUM_LANES <= n; j += SUM_LANES)
        for (int l = 0; l < SUM_LANES; l++) {
            row[j + l] = exp_lanes(row[j + l] - mx);
            acc[l] += row[j + l];
        }
    for (int l = 0; j + l < n; l++) {
        row[j + l] = exp_lanes(row[j + l] - mx);
        acc[l] += row[j + l];
    }
    return sum_of_lanes(acc);
}

// sum over j < n of a[j] b[j]
static inline float dot_lanes(const float* a, const float* b, int n) {
    float acc[SUM_LANES] = {0};
    int j = 0;
    for (; j + SUM_LANES <= n; j += SUM_LANES)
        for (int l = 0; l < SUM_LANES; l++) acc[l] += a[j + l] * b[j + l];
    for (int l = 0; j + l < n; l++) acc[l] += a[j + l] * b[j + l];
    return sum_of_lanes(acc);
}

// ---------------------------------------------------------------- embedding

void encoder_forward(float* out, const int* tokens, const float* wte, const float* wpe,
                     int B, int T, int C) {
    double t0 = optime_start();
    #pragma omp parallel for
    for (int n = 0; n < B * T; n++) {
        const float* wt = wte + (size_t)tokens[n] * C;
        const float* wp = wpe + (size_t)(n % T) * C;
        float* o = out + (size_t)n * C;
        for (int c = 0; c < C; c++) o[c] = wt[c] + wp[c];
    }
    optime_stop(OPK_ENCODER, OP_FWD, t0);
}

void encoder_backward(float* dwte, float* dwpe, const float* dout, const int* tokens,
                      int B, int T, int C) {
    double t0 = optime_start();
    // Two rows of dout may add into the same row of dwte (a repeated token), so
    // the scatter runs over channels in parallel, never over tokens.
    #pragma omp parallel for
    for (int c = 0; c < C; c++) {
        for (int n = 0; n < B * T; n++) {
            float d = dout[(size_t)n * C + c];
            if (dwte) dwte[(size_t)tokens[n] * C + c] += d;
            if (dwpe) dwpe[(size_t)(n % T) * C + c] += d;
        }
    }
    optime_stop(OPK_ENCODER, OP_BWD, t0);
}

void encoder_forward_vocab(float* out, const int* tokens, const float* wte_shard,
                           const float* wpe, int B, int T, int C, int v0, int nrows) {
    double t0 = optime_start();
    #pragma omp parallel for
    for (int n = 0; n < B * T; n++) {
        int row = tokens[n] - v0;
        const float* wt = row >= 0 && row < nrows ? wte_shard + (size_t)row * C : NULL;
        const float* wp = wpe ? wpe + (size_t)(n % T) * C : NULL;
        float* o = out + (size_t)n * C;
        for (int c = 0; c < C; c++) o[c] = (wt ? wt[c] : 0.0f) + (wp ? wp[c] : 0.0f);
    }
    optime_stop(OPK_ENCODER, OP_FWD, t0);
}

void encoder_backward_vocab(float* dwte_shard, float* dwpe, const float* dout,
                            const int* tokens, int B, int T, int C, int v0, int nrows) {
    double t0 = optime_start();
    // as encoder_backward: parallel over channels, so a repeated token never races
    #pragma omp parallel for
    for (int c = 0; c < C; c++) {
        for (int n = 0; n < B * T; n++) {
            float d = dout[(size_t)n * C + c];
            int row = tokens[n] - v0;
            if (dwte_shard && row >= 0 && row < nrows) dwte_shard[(size_t)row * C + c] += d;
            if (dwpe) dwpe[(size_t)(n % T) * C + c] += d;
        }
    }
    optime_stop(OPK_ENCODER, OP_BWD, t0);
}

// ---------------------------------------------------------------- layernorm

void layernorm_forward(float* out, float* mean, float* rstd, const float* inp,
                       const float* w, const float* b, int N, int C) {
    double t0 = optime_start();
    const float eps = 1e-5f;
    #pragma omp parallel for
    for (int n = 0; n < N; n++) {
        const float* x = inp + (size_t)n * C;
        float m = 0.0f;
        for (int c = 0; c < C; c++) m += x[c];
        m /= C;
        float var = 0.0f;
        for (int c = 0; c < C; c++) var += (x[c] - m) * (x[c] - m);
        var /= C;
        float s = 1.0f / sqrtf(var + eps);
        float* o = out + (size_t)n * C;
        for (int c = 0; c < C; c++) o[c] = (x[c] - m) * s * w[c] + b[c];
        mean[n] = m;
        rstd[n] = s;
    }
    optime_stop(OPK_LAYERNORM, OP_FWD, t0);
}

void layernorm_backward(float* dinp, float* dw, float* db, const float* dout,
                        const float* inp, const float* w, const float* mean,
                        const float* rstd, int N, int C) {
    double t0 = optime_start();
    // dinp: rows are independent, parallel over rows.
    if (dinp) {
        #pragma omp parallel for
        for (int n = 0; n < N; n++) {
            const float* x = inp + (size_t)n * C;
            const float* d = dout + (size_t)n * C;
            float m = mean[n], s = rstd[n];
            // the two means that the normalisation couples every channel through
            float dnorm_mean = 0.0f, dnorm_norm_mean = 0.0f;
            for (int c = 0; c < C; c++) {
                float norm = (x[c] - m) * s;
                float dnorm = w[c] * d[c];
                dnorm_mean += dnorm;
                dnorm_norm_mean += dnorm * norm;
            }
            dnorm_mean /= C;
            dnorm_norm_mean /= C;
            float* di = dinp + (size_t)n * C;
            for (int c = 0; c < C; c++) {
                float norm = (x[c] - m) * s;
                float dnorm = w[c] * d[c];
                di[c] += (dnorm - dnorm_mean - norm * dnorm_norm_mean) * s;
            }
        }
    }
    // dw, db: sums over rows, parallel over channels; skipped when neither is
    // wanted (the input half of a split backward), as on the GPU.
    if (!dw && !db) {
        optime_stop(OPK_LAYERNORM, OP_BWD, t0);
        return;
    }
    // A block of channels per thread, rows in order (as matmul_backward's
    // dbias): contiguous reads, and each channel's sums keep their order.
    #pragma omp parallel for
    for (int c0 = 0; c0 < C; c0 += OPS_COL_BLOCK) {
        int nc = C - c0 < OPS_COL_BLOCK ? C - c0 : OPS_COL_BLOCK;
        float sw[OPS_COL_BLOCK] = {0}, sb[OPS_COL_BLOCK] = {0};
        for (int n = 0; n < N; n++) {
            const float* x = inp + (size_t)n * C + c0;
            const float* d = dout + (size_t)n * C + c0;
            float m = mean[n], r = rstd[n];
            for (int c = 0; c < nc; c++) {
                float norm = (x[c] - m) * r;
                sw[c] += norm * d[c];
                sb[c] += d[c];
            }
        }
        for (int c = 0; c < nc; c++) {
            if (dw) dw[c0 + c] += sw[c];
            if (db) db[c0 + c] += sb[c];
        }
    }
    optime_stop(OPK_LAYERNORM, OP_BWD, t0);
}

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

// ---------------------------------------------------------------- attention
// Rows of the score matrix per causal block (see attention_forward).
#define ATT_ROW_BLOCK 64

// One (batch, head) pair is a (T, hs) slice of q, k and v with row stride 3C,
// so each pair is a few small matmuls; pairs run in parallel, one per thread.

void attention_forward(float* out, float* att, const float* qkv, int B, int T, int C, int NH) {
    progress();
    double t0 = optime_start();
    const int hs = C / NH;
    const float scale = 1.0f / sqrtf((float)hs);
    const int ld = 3 * C;
    #pragma omp parallel for collapse(2)
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
            const float* q = qkv + (size_t)b * T * ld + h * hs;
            const float* k = q + C;
            const float* v = q + 2 * C;
            float* a = att + ((size_t)b * NH + h) * T * T;     // (T, T)
            float* o = out + (size_t)b * T * C + h * hs;       // (T, hs), row stride C
            // Causal blocks: rows i0..i1-1 see keys 0..i1-1 at most, so each
            // block of rows multiplies only that many keys; the masked
            // upper-right blocks (nearly half of a full T x T) are never
            // computed. Every score is the same dot of hs terms as in a full
            // product, and att @ v only leaves out terms that are exact zeros.
            for (int i0 = 0; i0 < T; i0 += ATT_ROW_BLOCK) {
                int i1 = i0 + ATT_ROW_BLOCK < T ? i0 + ATT_ROW_BLOCK : T;
                float* ab = a + (size_t)i0 * T;
                // scores (i1-i0, i1) = q[i0:i1] k[0:i1]^T * scale
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, i1 - i0, i1, hs,
                            scale, q + (size_t)i0 * ld, ld, k, ld, 0.0f, ab, T);
                // causal softmax: row t sees keys 0..t; future keys get probability 0
                for (int t = i0; t < i1; t++) {
                    float* row = a + (size_t)t * T;
                    float mx = row[0];
                    // a max is exact in any order, so it may run in lanes
                    #pragma omp simd reduction(max : mx)
                    for (int s = 1; s <= t; s++) mx = row[s] > mx ? row[s] : mx;
                    float sum = exp_and_sum(row, t + 1, mx);
                    float inv = 1.0f / sum;
                    for (int s = 0; s <= t; s++) row[s] *= inv;
                    // att @ v below reads this block's columns up to i1, so
                    // the future keys inside them must be zeros; the columns
                    // past i1 are never read (by backward either), and are
                    // left as they are (ops.h: only the causal part is defined)
                    for (int s = t + 1; s < i1; s++) row[s] = 0.0f;
                }
                // out[i0:i1] (i1-i0, hs) = att[i0:i1, 0:i1] @ v[0:i1]
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, i1 - i0, hs, i1,
                            1.0f, ab, T, v, ld, 0.0f, o + (size_t)i0 * C, C);
            }
        }
    }
    optime_stop(OPK_ATTENTION, OP_FWD, t0);
}

void attention_backward(float* dqkv, float* datt, const float* dout, const float* qkv,
                        const float* att, int B, int T, int C, int NH) {
    progress();
    double t0 = optime_start();
    const int hs = C / NH;
    const float scale = 1.0f / sqrtf((float)hs);
    const int ld = 3 * C;
    #pragma omp parallel for collapse(2)
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
            size_t off = (size_t)b * T * ld + h * hs;
            const float* q = qkv + off;
            const float* k = q + C;
            const float* v = q + 2 * C;
            float* dq = dqkv + off;
            float* dk = dq + C;
            float* dv = dq + 2 * C;
            const float* a = att + ((size_t)b * NH + h) * T * T;
            float* da = datt + ((size_t)b * NH + h) * T * T;
            const float* d = dout + (size_t)b * T * C + h * hs;
            // The causal blocks of attention_forward again. A block of query
            // rows i0..i1-1 meets keys 0..i1-1; a block of key columns
            // j0..j1-1 is met by queries j0..T-1. Each product leaves out only
            // terms that are exact zeros, in the order the full product adds.
            for (int i0 = 0; i0 < T; i0 += ATT_ROW_BLOCK) {
                int i1 = i0 + ATT_ROW_BLOCK < T ? i0 + ATT_ROW_BLOCK : T;
                // datt[i0:i1, 0:i1] = dout[i0:i1] @ v[0:i1]^T
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, i1 - i0, i1, hs,
                            1.0f, d + (size_t)i0 * C, C, v, ld, 0.0f, da + (size_t)i0 * T, T);
                // softmax backward, in place: dscore = att * (datt - sum(att * datt))
                for (int t = i0; t < i1; t++) {
                    const float* arow = a + (size_t)t * T;
                    float* drow = da + (size_t)t * T;
                    float dot = dot_lanes(arow, drow, t + 1);
                    for (int s = 0; s <= t; s++) drow[s] = arow[s] * (drow[s] - dot);
                    // zeros up to the block's edge i1, which the dk product
                    // below reads; it never reads past it
                    for (int s = t + 1; s < i1; s++) drow[s] = 0.0f;
                }
                // dq[i0:i1] += dscore[i0:i1, 0:i1] @ k[0:i1] * scale
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, i1 - i0, hs, i1,
                            scale, da + (size_t)i0 * T, T, k, ld, 1.0f, dq + (size_t)i0 * ld, ld);
            }
            // by key columns, now that every row of dscore is done
            for (int j0 = 0; j0 < T; j0 += ATT_ROW_BLOCK) {
                int j1 = j0 + ATT_ROW_BLOCK < T ? j0 + ATT_ROW_BLOCK : T;
                const float* ab = a + (size_t)j0 * T + j0;   // att[j0:T, j0:j1]
                const float* db = da + (size_t)j0 * T + j0;  // dscore[j0:T, j0:j1]
                // dv[j0:j1] += att[j0:T, j0:j1]^T @ dout[j0:T]
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, j1 - j0, hs, T - j0,
                            1.0f, ab, T, d + (size_t)j0 * C, C, 1.0f, dv + (size_t)j0 * ld, ld);
                // dk[j0:j1] += dscore[j0:T, j0:j1]^T @ q[j0:T] * scale
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, j1 - j0, hs, T - j0,
                            scale, db, T, q + (size_t)j0 * ld, ld, 1.0f, dk + (size_t)j0 * ld, ld);
            }
        }
    }
    optime_stop(OPK_ATTENTION, OP_BWD, t0);
}

// ---------------------------------------------------------------- attention in O(T) memory
// FlashAttention's algorithm (Dao et al. 2022, "FlashAttention: Fast and
// Memory-Efficient Exact Attention with IO-Awareness"; the loop order of its
// backward from Dao 2023, "FlashAttention-2"), on the online softmax of
// Milakov & Gimelshein 2018 ("Online normalizer calculation for softmax"):
// the scores of a tile of queries against one block of FLASH_BK keys live
// in a tile of the thread's own, are folded into each row's
// running (max m, sum l, unnormalised output o) and forgotten. Per row:
//   m' = max(m, max_j s_j),  l' = l e^(m - m') + sum_j e^(s_j - m'),
//   o' = o e^(m - m') + sum_j e^(s_j - m') v_j,
// and after the last block out = o / l, lse = m + log l. That is
// attention_chunk_merge's identity with a block of keys for a chunk: the
// ring of chapter 6 is this loop with the blocks on other ranks.
// Backward recomputes each tile's probabilities p = e^(s - lse) from q and k.
//
// Bits: every product runs through flash_mm (each element one chain over
// its sum's index, in order, no fused multiply-add), every row's sums and
// maxima run over the keys it sees, blocks at fixed key positions
// (multiples of FLASH_BK from the chunk's first key), and a row takes part
// in a block only if it sees a key of it. So a row's out and lse are a
// function of its query and the keys and values it sees, whatever B, the
// other rows, the tile it falls in and the thread count; dq likewise, and
// dk, dv of a key are one fixed chain over the queries that see it.

// How many keys of the chunk query i sees: keys 0 .. q0 + i - k0, within 0..Tk.
static inline int chunk_keys_visible(int i, int q0, int k0, int Tk) {
    int n = q0 + i - k0 + 1;
    return n < 0 ? 0 : (n > Tk ? Tk : n);
}

#define FLASH_BQ 64  // query rows per tile (backward)
#define FLASH_BK 64  // keys per block
// Forward's tiles are taller: a tile transposes each block of keys it
// meets once, so twice the rows halve those copies (2.5% of forward +
// backward at the small preset's T = 256, measured). Its scores, 128 x 64
// floats, and the block, 64 x hs, still fit the L2 cache.
#define FLASH_BQ_FWD 128

// The products of the attention tiles: out (R, J) = a (R, K) @ b (K, J),
// written or added into out, each element one chain over k in order, a
// multiply then an add, as rows_times_matrix. Its own register tile, sized
// for the attention's shapes (J = 64 keys or hs, K = hs or up to 64 keys):
// FL_MR rows by FL_NR columns of accumulators that stay in registers (the
// 8 x 32 tile of rows_times_tile needs 32 registers for its sums alone and
// spills on these short products). Rows past the last full tile and
// columns past the last full vector take narrower paths that add the same
// products in the same order, so an element's bits never depend on where
// its row or column falls.
#if defined(__AVX512F__)
#define FL_W 16   // 32 registers of 16 floats: 8 sums, 1 of b, 1 broadcast
#define FL_MR 8
#define FL_NR 16
#elif defined(__AVX__)
#define FL_W 8    // 16 registers of 8 floats: 8 sums, 2 of b, 1 broadcast
#define FL_MR 4
#define FL_NR 16
#else
#define FL_W 8    // 16 registers of 4 floats, a vector of 8 in two: 8 sums, 2 of b, 1 broadcast
#define FL_MR 4
#define FL_NR 8
#endif
#define FL_NV (FL_NR / FL_W)
typedef float FlVec __attribute__((vector_size(FL_W * sizeof(float))));
typedef float FlVecLoad __attribute__((vector_size(FL_W * sizeof(float)), aligned(4), may_alias));

static inline void flash_mm_tile(float* out, int ldo, const float* a, int ars, int aks, const float* b,
                                 int ldb, int K, int accumulate) {
    FlVec acc[FL_MR][FL_NV];
    for (int r = 0; r < FL_MR; r++)
        for (int v = 0; v < FL_NV; v++) acc[r][v] = (FlVec){0};
    for (int k = 0; k < K; k++) {
        const FlVecLoad* bk = (const FlVecLoad*)(b + (size_t)k * ldb);
        FlVec bv[FL_NV];
        for (int v = 0; v < FL_NV; v++) bv[v] = bk[v];
        for (int r = 0; r < FL_MR; r++) {
            float x = a[(size_t)r * ars + (size_t)k * aks];
            for (int v = 0; v < FL_NV; v++) acc[r][v] += x * bv[v];
        }
    }
    for (int r = 0; r < FL_MR; r++) {
        FlVecLoad* o = (FlVecLoad*)(out + (size_t)r * ldo);
        for (int v = 0; v < FL_NV; v++) {
            if (accumulate) o[v] += acc[r][v];
            else o[v] = acc[r][v];
        }
    }
}

// one row, columns [0, nr) with nr <= FL_NR: whole vectors, then single columns
static inline void flash_mm_row(float* out, const float* a, int aks, const float* b, int ldb, int nr,
                                int K, int accumulate) {
    int nv = nr / FL_W;
    FlVec acc[FL_NV];
    float tail[FL_W] = {0};
    for (int v = 0; v < FL_NV; v++) acc[v] = (FlVec){0};
    for (int k = 0; k < K; k++) {
        const float* bk = b + (size_t)k * ldb;
        float x = a[(size_t)k * aks];
        for (int v = 0; v < nv; v++) acc[v] += x * ((const FlVecLoad*)bk)[v];
        for (int j = nv * FL_W; j < nr; j++) tail[j - nv * FL_W] += x * bk[j];
    }
    for (int j = 0; j < nr; j++) {
        float s = j < nv * FL_W ? acc[j / FL_W][j % FL_W] : tail[j - nv * FL_W];
        out[j] = accumulate ? out[j] + s : s;
    }
}

// a (R, K) is read as a[r * ars + k * aks]: a row-major matrix with row
// stride lda is (ars, aks) = (lda, 1), and the transpose of a (K, R) one,
// without copying it, (1, lda).
static void flash_mm(float* out, int ldo, const float* a, int ars, int aks, const float* b, int ldb,
                     int R, int K, int J, int accumulate) {
    int R4 = R - R % FL_MR, J4 = J - J % FL_NR;
    for (int r0 = 0; r0 < R4; r0 += FL_MR)
        for (int j0 = 0; j0 < J4; j0 += FL_NR)
            flash_mm_tile(out + (size_t)r0 * ldo + j0, ldo, a + (size_t)r0 * ars, ars, aks, b + j0, ldb,
                          K, accumulate);
    for (int r = 0; r < R; r++) {
        if (r < R4 && J4 == J) continue;
        for (int j0 = r < R4 ? J4 : 0; j0 < J; j0 += FL_NR) {
            int nr = J - j0 < FL_NR ? J - j0 : FL_NR;
            flash_mm_row(out + (size_t)r * ldo + j0, a + (size_t)r * ars, aks, b + j0, ldb, nr, K,
                         accumulate);
        }
    }
}


// dst (cols, rows) = src (rows, cols)^T; src rows every src_stride floats,
// dst rows every dst_stride.
static void transpose_block(float* dst, int dst_stride, const float* src, int src_stride, int rows,
                            int cols) {
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++) dst[(size_t)c * dst_stride + r] = src[(size_t)r * src_stride + c];
}

// A tile's rows go through a block of keys in groups of FLASH_SUB, at fixed
// positions (i0, i0 + FLASH_SUB, ...): a group meets only the keys of the
// block its last row sees, rounded up to whole vectors (the rest would be
// masked anyway), so a block on the causal diagonal costs about 5/8 of a
// full one. Where a row's group ends depends on the row's position alone
// (and on i1, the end of the rows), and the keys a group leaves out are
// zeros at the end of each sum it would have entered, so a row's bits are
// the same whichever group it falls in.
#define FLASH_SUB 16
static inline int flash_group_end(int ra, int i0, int i1) {
    int rb = i0 + ((ra - i0) / FLASH_SUB + 1) * FLASH_SUB;
    return rb < i1 ? rb : i1;
}
// the keys of block j0 (nb of them) the rows before rb see, in whole vectors
static inline int flash_group_keys(int rb, int j0, int nb, int q0, int k0, int Tk) {
    int nc = chunk_keys_visible(rb - 1, q0, k0, Tk) - j0;
    nc = (nc + FL_NR - 1) / FL_NR * FL_NR;
    return nc < nb ? nc : nb;
}

// The forward of query rows i0..i1-1 of one (batch, head) against keys
// 0..Tk-1 of one kv chunk (positions as in attention_chunk_forward): o rows
// (one every o_stride floats) get the unnormalised sum, m and l (i1-i0) the
// row's max and sum of exponentials, as attention_chunk_forward defines
// them (-INFINITY, 0 and a zero row for a query that sees no key).
// Scratch: s (i1 - i0, FLASH_BK), kt (hs, FLASH_BK).
static void flash_forward_tile(float* o, int o_stride, float* m, float* l, const float* q,
                               int q_stride, const float* k, const float* v, int kv_stride, int i0,
                               int i1, int Tk, int q0, int k0, int hs, float scale, float* s,
                               float* kt) {
    for (int i = i0; i < i1; i++) {
        m[i - i0] = -INFINITY;
        l[i - i0] = 0.0f;
        for (int c = 0; c < hs; c++) o[(size_t)i * o_stride + c] = 0.0f;
    }
    const int nk = chunk_keys_visible(i1 - 1, q0, k0, Tk);  // the last row sees the most keys
    for (int j0 = 0; j0 < nk; j0 += FLASH_BK) {
        const int nb = nk - j0 < FLASH_BK ? nk - j0 : FLASH_BK;
        // the rows that see key j0, and so this block: i >= j0 + k0 - q0
        const int ia = j0 + k0 - q0 > i0 ? j0 + k0 - q0 : i0;
        transpose_block(kt, FLASH_BK, k + (size_t)j0 * kv_stride, kv_stride, nb, hs);
        for (int ra = ia, rb; ra < i1; ra = rb) {
            rb = flash_group_end(ra, i0, i1);
            const int nc = flash_group_keys(rb, j0, nb, q0, k0, Tk);
            float* sg = s + (size_t)(ra - ia) * FLASH_BK;
            // s (rb-ra, nc) = q[ra:rb] k[j0:j0+nc]^T, scaled below
            flash_mm(sg, FLASH_BK, q + (size_t)ra * q_stride, q_stride, 1, kt, FLASH_BK, rb - ra, hs, nc, 0);
            for (int i = ra; i < rb; i++) {
                float* row = sg + (size_t)(i - ra) * FLASH_BK;
                int nvis = chunk_keys_visible(i, q0, k0, Tk) - j0;
                if (nvis > nc) nvis = nc;
                float mx = -INFINITY;
                // a max is exact in any order, so it may run in lanes
                #pragma omp simd reduction(max : mx)
                for (int j = 0; j < nvis; j++) {
                    row[j] *= scale;
                    mx = row[j] > mx ? row[j] : mx;
                }
                float m_old = m[i - i0];
                float m_new = m_old > mx ? m_old : mx;
                float sum = exp_and_sum(row, nvis, m_new);
                for (int j = nvis; j < nc; j++) row[j] = 0.0f;  // future keys weigh 0 below
                // the rescale of what the earlier blocks gave (none: alpha 0)
                float alpha = m_old == -INFINITY ? 0.0f : expf(m_old - m_new);
                l[i - i0] = l[i - i0] * alpha + sum;
                m[i - i0] = m_new;
                if (alpha != 1.0f) {
                    float* oi = o + (size_t)i * o_stride;
                    for (int c = 0; c < hs; c++) oi[c] *= alpha;
                }
            }
            // o[ra:rb] += p (rb-ra, nc) @ v[j0:j0+nc]
            flash_mm(o + (size_t)ra * o_stride, o_stride, sg, FLASH_BK, 1, v + (size_t)j0 * kv_stride,
                     kv_stride, rb - ra, nc, hs, 1);
        }
    }
}

void attention_flash_forward(float* out, float* lse, const float* qkv, int B, int T, int C, int NH) {
    progress();
    double t0 = optime_start();
    const int hs = C / NH;
    const float scale = 1.0f / sqrtf((float)hs);
    const int ld = 3 * C;
    #pragma omp parallel
    {
        // a tile of scores and a block of keys, transposed: 48 KiB at hs 64
        float* s = xmalloc(((size_t)FLASH_BQ_FWD * FLASH_BK + (size_t)hs * FLASH_BK) * sizeof(float));
        float* kt = s + (size_t)FLASH_BQ_FWD * FLASH_BK;
        float m[FLASH_BQ_FWD], l[FLASH_BQ_FWD];
        #pragma omp for collapse(2)
        for (int b = 0; b < B; b++) {
            for (int h = 0; h < NH; h++) {
                const float* q = qkv + (size_t)b * T * ld + h * hs;
                float* o = out + (size_t)b * T * C + h * hs;  // (T, hs), row stride C
                float* lse_bh = lse + (size_t)b * T * NH + h;  // row i at lse_bh[i * NH]
                for (int i0 = 0; i0 < T; i0 += FLASH_BQ_FWD) {
                    int i1 = i0 + FLASH_BQ_FWD < T ? i0 + FLASH_BQ_FWD : T;
                    flash_forward_tile(o, C, m, l, q, ld, q + C, q + 2 * C, ld, i0, i1, T, 0, 0, hs,
                                       scale, s, kt);
                    // every row sees key 0, so l >= 1 (its max term is e^0)
                    for (int i = i0; i < i1; i++) {
                        float inv = 1.0f / l[i - i0];
                        float* oi = o + (size_t)i * C;
                        for (int c = 0; c < hs; c++) oi[c] *= inv;
                        lse_bh[(size_t)i * NH] = m[i - i0] + logf(l[i - i0]);
                    }
                }
            }
        }
        free(s);
    }
    optime_stop(OPK_ATTENTION, OP_FWD, t0);
}

// The backward of one (batch, head) over query rows 0..Tq-1 and keys
// 0..Tk-1 of a kv chunk (positions as in attention_chunk_backward), in
// FlashAttention-2's order: each block of keys meets every tile of queries
// that sees it, so dk and dv of the block build up in dk_acc, dv_acc and
// are added once; dq is added to block by block. dout and out rows every
// o_stride floats, lse every lse_stride.
typedef struct {
    float *kt, *vt;       // (hs, FLASH_BK): the block's keys and values, transposed
    float *p, *ds;        // (FLASH_BQ, FLASH_BK): probabilities, their score gradients
    float *dk_acc, *dv_acc;  // (FLASH_BK, hs)
} FlashBackScratch;

static float* flash_back_scratch(FlashBackScratch* w, int hs) {
    size_t kv = (size_t)hs * FLASH_BK, tile = (size_t)FLASH_BQ * FLASH_BK;
    float* base = xmalloc((4 * kv + 2 * tile) * sizeof(float));
    w->kt = base, w->vt = w->kt + kv, w->dk_acc = w->vt + kv, w->dv_acc = w->dk_acc + kv;
    w->p = w->dv_acc + kv, w->ds = w->p + tile;
    return base;
}

static void flash_backward_head(float* dq, float* dk, float* dv, const float* dout,
                                const float* out, int o_stride, const float* lse, int lse_stride,
                                const float* q, int q_stride, const float* k, const float* v,
                                int kv_stride, int Tq, int Tk, int q0, int k0, int hs, float scale,
                                const FlashBackScratch* w) {
    for (int j0 = 0; j0 < Tk; j0 += FLASH_BK) {
        // the first query that sees key j0; none: no later block is seen either
        const int first = j0 + k0 - q0 > 0 ? j0 + k0 - q0 : 0;
        if (first >= Tq) break;
        const int nb = Tk - j0 < FLASH_BK ? Tk - j0 : FLASH_BK;
        transpose_block(w->kt, FLASH_BK, k + (size_t)j0 * kv_stride, kv_stride, nb, hs);
        transpose_block(w->vt, FLASH_BK, v + (size_t)j0 * kv_stride, kv_stride, nb, hs);
        memset(w->dk_acc, 0, (size_t)nb * hs * sizeof(float));
        memset(w->dv_acc, 0, (size_t)nb * hs * sizeof(float));
        for (int i0 = first - first % FLASH_BQ; i0 < Tq; i0 += FLASH_BQ) {
            const int i1 = i0 + FLASH_BQ < Tq ? i0 + FLASH_BQ : Tq;
            const int ia = first > i0 ? first : i0;
            // the keys of the block the tile's last row sees
            int nbk = chunk_keys_visible(i1 - 1, q0, k0, Tk) - j0;
            if (nbk > nb) nbk = nb;
            for (int ra = ia, rb; ra < i1; ra = rb) {
                rb = flash_group_end(ra, i0, i1);
                const int nc = flash_group_keys(rb, j0, nb, q0, k0, Tk);
                float* pg = w->p + (size_t)(ra - ia) * FLASH_BK;
                float* dg = w->ds + (size_t)(ra - ia) * FLASH_BK;
                // p (rb-ra, nc) = q k^T, exponentiated below; ds = dout v^T
                flash_mm(pg, FLASH_BK, q + (size_t)ra * q_stride, q_stride, 1, w->kt, FLASH_BK, rb - ra,
                         hs, nc, 0);
                flash_mm(dg, FLASH_BK, dout + (size_t)ra * o_stride, o_stride, 1, w->vt, FLASH_BK,
                         rb - ra, hs, nc, 0);
                for (int i = ra; i < rb; i++) {
                    float* prow = pg + (size_t)(i - ra) * FLASH_BK;
                    float* drow = dg + (size_t)(i - ra) * FLASH_BK;
                    int nvis = chunk_keys_visible(i, q0, k0, Tk) - j0;
                    if (nvis > nc) nvis = nc;
                    // D_i = dout_i . out_i = sum over ALL keys of p_ij (dout_i . v_j),
                    // the softmax's coupling term, from the finished out alone
                    const float D =
                        dot_lanes(dout + (size_t)i * o_stride, out + (size_t)i * o_stride, hs);
                    const float L = lse[(size_t)i * lse_stride];
                    #pragma omp simd
                    for (int j = 0; j < nvis; j++) {
                        prow[j] = exp_lanes(prow[j] * scale - L);
                        // the score's gradient, with the score's scale folded in
                        drow[j] = prow[j] * (drow[j] - D) * scale;
                    }
                    // future keys: zeros as far as the dq, dk and dv products
                    // below read
                    for (int j = nvis; j < (nc > nbk ? nc : nbk); j++) prow[j] = drow[j] = 0.0f;
                }
                // dq[ra:rb] += ds (rb-ra, nc) @ k[j0:j0+nc]
                flash_mm(dq + (size_t)ra * q_stride, q_stride, dg, FLASH_BK, 1,
                         k + (size_t)j0 * kv_stride, kv_stride, rb - ra, nc, hs, 1);
            }
            // dk_acc += ds^T @ q, dv_acc += p^T @ dout, by groups of FLASH_SUB
            // keys, each over the queries from the first that sees its first key
            for (int ka = 0; ka < nbk; ka += FLASH_SUB) {
                const int kb = ka + FLASH_SUB < nbk ? ka + FLASH_SUB : nbk;
                const int qa = j0 + ka + k0 - q0 > ia ? j0 + ka + k0 - q0 : ia;
                const float* dsg = w->ds + (size_t)(qa - ia) * FLASH_BK + ka;
                const float* pg = w->p + (size_t)(qa - ia) * FLASH_BK + ka;
                flash_mm(w->dk_acc + (size_t)ka * hs, hs, dsg, 1, FLASH_BK, q + (size_t)qa * q_stride,
                         q_stride, kb - ka, i1 - qa, hs, 1);
                flash_mm(w->dv_acc + (size_t)ka * hs, hs, pg, 1, FLASH_BK, dout + (size_t)qa * o_stride,
                         o_stride, kb - ka, i1 - qa, hs, 1);
            }
        }
        for (int j = 0; j < nb; j++) {
            float* dkj = dk + (size_t)(j0 + j) * kv_stride;
            float* dvj = dv + (size_t)(j0 + j) * kv_stride;
            for (int c = 0; c < hs; c++) {
                dkj[c] += w->dk_acc[(size_t)j * hs + c];
                dvj[c] += w->dv_acc[(size_t)j * hs + c];
            }
        }
    }
}

void attention_flash_backward(float* dqkv, const float* dout, const float* qkv, const float* out,
                              const float* lse, int B, int T, int C, int NH) {
    progress();
    double t0 = optime_start();
    const int hs = C / NH;
    const float scale = 1.0f / sqrtf((float)hs);
    const int ld = 3 * C;
    #pragma omp parallel
    {
        FlashBackScratch w;
        float* base = flash_back_scratch(&w, hs);
        #pragma omp for collapse(2)
        for (int b = 0; b < B; b++) {
            for (int h = 0; h < NH; h++) {
                size_t off = (size_t)b * T * ld + h * hs;
                const float* q = qkv + off;
                float* dq = dqkv + off;
                size_t ooff = (size_t)b * T * C + h * hs;
                flash_backward_head(dq, dq + C, dq + 2 * C, dout + ooff, out + ooff, C,
                                    lse + (size_t)b * T * NH + h, NH, q, ld, q + C, q + 2 * C, ld, T,
                                    T, 0, 0, hs, scale, &w);
            }
        }
        free(base);
    }
    optime_stop(OPK_ATTENTION, OP_BWD, t0);
}

// ---------------------------------------------------------------- attention on sequence chunks
// A (query chunk, kv chunk) pair is a rectangle of the score matrix, cut by the
// causal diagonal where the two chunks overlap in position: the keys a query
// sees are a prefix of the kv chunk, growing with the query. That is the
// memory-efficient attention's loop above with the chunk's positions (q0,
// k0): the same tiles of queries, the same blocks of keys (from the kv
// chunk's first key), the same online softmax. A ring of chapter 6 is one
// more level of the same recurrence: a kv chunk is a block of keys that
// lives on another rank, folded in by attention_chunk_merge. As above, one
// (batch, head) pair per thread: it owns that head's slice of every row it
// writes, queries and keys alike, so nothing races; its tiles, 64 or 128
// by 64 floats, are its own, plain host memory (not an activation, not
// counted by the tracking allocator, memory.h).

void attention_chunk_forward(float* out, float* rowmax, float* sumexp, const float* q_all,
                             int q_stride, const float* k_all, const float* v_all, int kv_stride,
                             int B, int Tq, int Tk, int q0, int k0, int C, int NH) {
    progress();  // a ring's K/V block moves while this runs (chapter 6)
    double t0 = optime_start();
    const int hs = C / NH;
    const float scale = 1.0f / sqrtf((float)hs);
    #pragma omp parallel
    {
        float* s = xmalloc(((size_t)FLASH_BQ_FWD * FLASH_BK + (size_t)hs * FLASH_BK) * sizeof(float));
        float* kt = s + (size_t)FLASH_BQ_FWD * FLASH_BK;
        float m[FLASH_BQ_FWD], l[FLASH_BQ_FWD];
        #pragma omp for collapse(2)
        for (int b = 0; b < B; b++) {
            for (int h = 0; h < NH; h++) {
                const float* q = q_all + (size_t)b * Tq * q_stride + h * hs;
                const size_t kv = (size_t)b * Tk * kv_stride + h * hs;
                float* o = out + (size_t)b * Tq * C + h * hs;  // (Tq, hs), row stride C
                const size_t r0 = (size_t)b * Tq * NH + h;     // stats row of query i: r0 + i*NH
                for (int i0 = 0; i0 < Tq; i0 += FLASH_BQ_FWD) {
                    int i1 = i0 + FLASH_BQ_FWD < Tq ? i0 + FLASH_BQ_FWD : Tq;
                    // the partials, not normalised: what attention_flash_forward
                    // finishes at once, the ring merges with the other chunks' first
                    flash_forward_tile(o, C, m, l, q, q_stride, k_all + kv, v_all + kv, kv_stride, i0, i1,
                                       Tk, q0, k0, hs, scale, s, kt);
                    for (int i = i0; i < i1; i++) {
                        rowmax[r0 + (size_t)i * NH] = m[i - i0];
                        sumexp[r0 + (size_t)i * NH] = l[i - i0];
                    }
                }
            }
        }
        free(s);
    }
    optime_stop(OPK_ATTENTION, OP_FWD, t0);
}

// Stats (B, Tq, NH) and out (B, Tq, C) = (B*Tq*NH, hs) list the (token, head)
// rows in the same order, so row r of the stats owns out[r*hs .. r*hs + hs).
void attention_chunk_merge(float* out, float* rowmax, float* sumexp, const float* out2,
                           const float* rowmax2, const float* sumexp2, int B, int Tq, int C,
                           int NH) {
    double t0 = optime_start();
    const int hs = C / NH;
    const size_t rows = (size_t)B * Tq * NH;
    #pragma omp parallel for
    for (size_t r = 0; r < rows; r++) {
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
    optime_stop(OPK_ATTENTION, OP_FWD, t0);
}

void attention_chunk_finish(float* out, float* lse, const float* rowmax, const float* sumexp,
                            int B, int Tq, int C, int NH) {
    double t0 = optime_start();
    const int hs = C / NH;
    const size_t rows = (size_t)B * Tq * NH;
    #pragma omp parallel for
    for (size_t r = 0; r < rows; r++) {
        float l = sumexp[r];
        float inv = l > 0.0f ? 1.0f / l : 0.0f;
        float* o = out + r * hs;
        for (int c = 0; c < hs; c++) o[c] *= inv;
        lse[r] = l > 0.0f ? rowmax[r] + logf(l) : -INFINITY;  // rowmax read first: lse may be rowmax
    }
    optime_stop(OPK_ATTENTION, OP_FWD, t0);
}

// Backward: flash_backward_head on the pair, the same loop as
// attention_flash_backward's with the chunks' positions.
void attention_chunk_backward(float* dq_all, float* dk_all, float* dv_all, const float* dout,
                              const float* out, const float* lse, const float* q_all, int q_stride,
                              const float* k_all, const float* v_all, int kv_stride, int B, int Tq,
                              int Tk, int q0, int k0, int C, int NH) {
    progress();
    double t0 = optime_start();
    const int hs = C / NH;
    const float scale = 1.0f / sqrtf((float)hs);
    #pragma omp parallel
    {
        FlashBackScratch w;
        float* base = flash_back_scratch(&w, hs);
        #pragma omp for collapse(2)
        for (int b = 0; b < B; b++) {
            for (int h = 0; h < NH; h++) {
                const size_t qo = (size_t)b * Tq * q_stride + h * hs;
                const size_t kv = (size_t)b * Tk * kv_stride + h * hs;
                const size_t oo = (size_t)b * Tq * C + h * hs;  // dout, out: (Tq, hs), row stride C
                flash_backward_head(dq_all + qo, dk_all + kv, dv_all + kv, dout + oo, out + oo, C,
                                    lse + (size_t)b * Tq * NH + h, NH, q_all + qo, q_stride, k_all + kv,
                                    v_all + kv, kv_stride, Tq, Tk, q0, k0, hs, scale, &w);
            }
        }
        free(base);
    }
    optime_stop(OPK_ATTENTION, OP_BWD, t0);
}

// ---------------------------------------------------------------- pointwise

#define GELU_SCALE 0.7978845608028654f  // sqrt(2 / pi)

// tanh(u) = 1 - 2 / (e^(2u) + 1): one exponential instead of tanhf; at the
// clamp e^(2u) is 1.6e38 or 1.6e-38, which gives tanh = 1 or -1 exactly.
static inline float tanh_lanes(float u) { return 1.0f - 2.0f / (exp_lanes(2.0f * u) + 1.0f); }

void gelu_forward(float* out, const float* inp, size_t n) {
    double t0 = optime_start();
    #pragma omp parallel for simd
    for (size_t i = 0; i < n; i++) {
        float x = inp[i];
        float u = GELU_SCALE * (x + 0.044715f * x * x * x);
        out[i] = 0.5f * x * (1.0f + tanh_lanes(u));
    }
    optime_stop(OPK_GELU, OP_FWD, t0);
}

void gelu_backward(float* dinp, const float* inp, const float* dout, size_t n) {
    double t0 = optime_start();
    #pragma omp parallel for simd
    for (size_t i = 0; i < n; i++) {
        float x = inp[i];
        float u = GELU_SCALE * (x + 0.044715f * x * x * x);
        float th = tanh_lanes(u);
        float sech2 = 1.0f - th * th;
        float local = 0.5f * (1.0f + th) +
                      0.5f * x * sech2 * GELU_SCALE * (1.0f + 3.0f * 0.044715f * x * x);
        dinp[i] += local * dout[i];
    }
    optime_stop(OPK_GELU, OP_BWD, t0);
}

void residual_forward(float* out, const float* a, const float* b, size_t n) {
    double t0 = optime_start();
    #pragma omp parallel for
    for (size_t i = 0; i < n; i++) out[i] = a[i] + b[i];
    optime_stop(OPK_RESIDUAL, OP_FWD, t0);
}

void residual_backward(float* da, float* db, const float* dout, size_t n) {
    double t0 = optime_start();
    #pragma omp parallel for
    for (size_t i = 0; i < n; i++) {
        if (da) da[i] += dout[i];
        if (db) db[i] += dout[i];
    }
    optime_stop(OPK_RESIDUAL, OP_BWD, t0);
}

// ---------------------------------------------------------------- loss

void crossentropy_partials(float* rowmax, float* sumexp, float* tlogit, const float* logits,
                           const int* targets, int N, int width, int nvalid, int v0) {
    double t0 = optime_start();
    #pragma omp parallel for
    for (int n = 0; n < N; n++) {
        const float* row = logits + (size_t)n * width;
        float mx = -INFINITY;
        for (int j = 0; j < nvalid; j++) mx = row[j] > mx ? row[j] : mx;
        float sum = 0.0f;
        for (int j = 0; j < nvalid; j++) sum += expf(row[j] - mx);
        int local = targets[n] - v0;
        rowmax[n] = mx;
        sumexp[n] = sum;
        tlogit[n] = (local >= 0 && local < nvalid) ? row[local] : 0.0f;
    }
    optime_stop(OPK_CROSSENTROPY, OP_FWD, t0);
}

void crossentropy_merge(float* rowmax, float* sumexp, float* tlogit, const float* max2,
                        const float* sum2, const float* tlog2, int N) {
    double t0 = optime_start();
    for (int n = 0; n < N; n++) {
        // rescale both sums to the larger of the two maxima
        float m = rowmax[n] > max2[n] ? rowmax[n] : max2[n];
        float s = 0.0f;
        if (sumexp[n] > 0.0f) s += sumexp[n] * expf(rowmax[n] - m);
        if (sum2[n] > 0.0f) s += sum2[n] * expf(max2[n] - m);
        rowmax[n] = m;
        sumexp[n] = s;
        tlogit[n] += tlog2[n];
    }
    optime_stop(OPK_CROSSENTROPY, OP_FWD, t0);
}

void crossentropy_loss(float* losses, const float* rowmax, const float* sumexp,
                       const float* tlogit, int N) {
    double t0 = optime_start();
    for (int n = 0; n < N; n++) losses[n] = logf(sumexp[n]) + rowmax[n] - tlogit[n];
    optime_stop(OPK_CROSSENTROPY, OP_FWD, t0);
}

void crossentropy_backward(float* dlogits, const float* logits, const int* targets,
                           const float* rowmax, const float* sumexp, float dloss,
                           int N, int width, int nvalid, int v0) {
    double t0 = optime_start();
    #pragma omp parallel for
    for (int n = 0; n < N; n++) {
        const float* row = logits + (size_t)n * width;
        float* drow = dlogits + (size_t)n * width;
        float inv = 1.0f / sumexp[n];
        int local = targets[n] - v0;
        for (int j = 0; j < nvalid; j++) {
            float p = expf(row[j] - rowmax[n]) * inv;
            drow[j] = (p - (j == local ? 1.0f : 0.0f)) * dloss;
        }
        for (int j = nvalid; j < width; j++) drow[j] = 0.0f;
    }
    optime_stop(OPK_CROSSENTROPY, OP_BWD, t0);
}

// ---------------------------------------------------------------- optimizer

void adamw_update(float* params, const float* grads, float* m, float* v, size_t n,
                  AdamWConfig cfg, int t, float grad_scale) {
    double t0 = optime_start();
    float bc1 = 1.0f - powf(cfg.beta1, (float)t);
    float bc2 = 1.0f - powf(cfg.beta2, (float)t);
    #pragma omp parallel for
    for (size_t i = 0; i < n; i++) {
        float g = grads[i] * grad_scale;
        float mi = cfg.beta1 * m[i] + (1.0f - cfg.beta1) * g;
        float vi = cfg.beta2 * v[i] + (1.0f - cfg.beta2) * g * g;
        float mhat = mi / bc1;
        float vhat = vi / bc2;
        m[i] = mi;
        v[i] = vi;
        params[i] -= cfg.lr * (mhat / (sqrtf(vhat) + cfg.eps) + cfg.weight_decay * params[i]);
    }
    optime_stop(OPK_OPTIMIZER, OP_FWD, t0);
}

// The sum in a fixed order, whatever the thread count: blocks of
// SUMSQ_BLOCK values, each summed in order, then the blocks' sums in order.
// (An OpenMP reduction would add the threads' shares in whatever order they
// finish, split where the thread count says.)
#define SUMSQ_BLOCK 4096
void grad_sumsq(double* sumsq, const float* grads, size_t n) {
    double t0 = optime_start();
    size_t nb = (n + SUMSQ_BLOCK - 1) / SUMSQ_BLOCK;
    double* part = xmalloc((nb ? nb : 1) * sizeof(double));
    #pragma omp parallel for if (n > OPS_PARALLEL_MIN)
    for (size_t b = 0; b < nb; b++) {
        size_t i1 = (b + 1) * SUMSQ_BLOCK < n ? (b + 1) * SUMSQ_BLOCK : n;
        double s = 0.0;
        for (size_t i = b * SUMSQ_BLOCK; i < i1; i++) s += (double)grads[i] * grads[i];
        part[b] = s;
    }
    double s = 0.0;
    for (size_t b = 0; b < nb; b++) s += part[b];
    free(part);
    *sumsq += s;  // the slice's sum, then into the step's (as the CUDA twin adds)
    optime_stop(OPK_OPTIMIZER, OP_FWD, t0);
}

float grad_clip_scale(double norm, float clip) {
    if (clip <= 0.0f || norm <= clip) return 1.0f;
    return (float)(clip / norm);
}

// ---------------------------------------------------------------- utilities

void ops_zero(float* x, size_t n) {
    double t0 = optime_start();
    memset(x, 0, n * sizeof(float));
    optime_stop(OPK_MEMORY, OP_FWD, t0);
}


void ops_scale(float* x, size_t n, float s) {
    double t0 = optime_start();
    if (n <= OPS_PARALLEL_MIN) {
        for (size_t i = 0; i < n; i++) x[i] *= s;
        optime_stop(OPK_MEMORY, OP_FWD, t0);
        return;
    }
    #pragma omp parallel for
    for (size_t i = 0; i < n; i++) x[i] *= s;
    optime_stop(OPK_MEMORY, OP_FWD, t0);
}

void ops_copy(float* dst, const float* src, size_t n) {
    double t0 = optime_start();
    memcpy(dst, src, n * sizeof(float));
    optime_stop(OPK_MEMORY, OP_FWD, t0);
}

void ops_add(float* y, const float* x, size_t n) {
    // small adds (a collective's chunk of a few floats) are not worth waking
    // the thread team for, or even entering a parallel region (see above)
    if (n <= OPS_PARALLEL_MIN) {
        for (size_t i = 0; i < n; i++) y[i] += x[i];
        return;
    }
    #pragma omp parallel for
    for (size_t i = 0; i < n; i++) y[i] += x[i];
}

void ops_double_to_float(float* dst, const double* src, size_t n) {
    for (size_t i = 0; i < n; i++) dst[i] = (float)src[i];
}

void ops_copy_2d(float* dst, int dst_stride, const float* src, int src_stride, int rows, int cols) {
    if (rows <= 0 || cols <= 0) return;
    // a row is one memcpy; the rows are short (a head's channels), so threads
    // pay only for many of them
    #pragma omp parallel for if ((size_t)rows * cols > OPS_PARALLEL_MIN)
    for (int r = 0; r < rows; r++)
        memcpy(dst + (size_t)r * dst_stride, src + (size_t)r * src_stride, (size_t)cols * sizeof(float));
}

// ---------------------------------------------------------------- mixture of experts

void moe_router_forward(float* probs, int* idx, float* gates, const float* logits, int N, int E,
                        int k) {
    double t0 = optime_start();
    #pragma omp parallel for
    for (int n = 0; n < N; n++) {
        const float* l = logits + (size_t)n * E;
        float* p = probs + (size_t)n * E;
        float mx = -INFINITY, sum = 0.0f;
        for (int e = 0; e < E; e++) mx = l[e] > mx ? l[e] : mx;
        for (int e = 0; e < E; e++) {
            p[e] = expf(l[e] - mx);
            sum += p[e];
        }
        for (int e = 0; e < E; e++) p[e] /= sum;
        // top-k by selection: a strict > keeps the lower index on a tie
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
    optime_stop(OPK_MOE, OP_FWD, t0);
}

void moe_router_backward(float* dlogits, const float* dgates, const float* aux_dprobs,
                         const float* probs, const int* idx, const float* gates, int N, int E,
                         int k) {
    double t0 = optime_start();
    #pragma omp parallel for
    for (int n = 0; n < N; n++) {
        const float* p = probs + (size_t)n * E;
        const int* id = idx + (size_t)n * k;
        const float* g = gates + (size_t)n * k;
        const float* dg = dgates ? dgates + (size_t)n * k : NULL;
        float dp[MOE_MAX_EXPERTS];
        for (int e = 0; e < E; e++) dp[e] = aux_dprobs ? aux_dprobs[e] : 0.0f;
        if (dg) {
            // g_m = p_m / S: d g_m / d p_i = (delta_mi - g_m) / S for a chosen i
            float s = 0.0f, dot = 0.0f;
            for (int j = 0; j < k; j++) s += p[id[j]];
            for (int j = 0; j < k; j++) dot += dg[j] * g[j];
            for (int j = 0; j < k; j++) dp[id[j]] += (dg[j] - dot) / s;
        }
        // softmax: dlogit_e = p_e (dp_e - sum_i p_i dp_i)
        float pdp = 0.0f;
        for (int e = 0; e < E; e++) pdp += p[e] * dp[e];
        float* dl = dlogits + (size_t)n * E;
        for (int e = 0; e < E; e++) dl[e] += p[e] * (dp[e] - pdp);
    }
    optime_stop(OPK_MOE, OP_BWD, t0);
}

void moe_gather_forward(float* out, const float* inp, const int* src, int n, int C) {
    double t0 = optime_start();
    #pragma omp parallel for
    for (int i = 0; i < n; i++)
        memcpy(out + (size_t)i * C, inp + (size_t)src[i] * C, (size_t)C * sizeof(float));
    optime_stop(OPK_MOE, OP_FWD, t0);
}

void moe_gather_backward(float* dinp, const float* dout, const int* pos, int N, int k, int C) {
    double t0 = optime_start();
    #pragma omp parallel for
    for (int t = 0; t < N; t++) {
        float* d = dinp + (size_t)t * C;
        for (int j = 0; j < k; j++) {
            int r = pos[(size_t)t * k + j];
            if (r < 0) continue;
            const float* g = dout + (size_t)r * C;
            for (int c = 0; c < C; c++) d[c] += g[c];
        }
    }
    optime_stop(OPK_MOE, OP_BWD, t0);
}

void moe_combine_forward(float* out, const float* rows, const float* gates, const int* pos, int N,
                         int k, int C) {
    double t0 = optime_start();
    #pragma omp parallel for
    for (int t = 0; t < N; t++) {
        float* o = out + (size_t)t * C;
        for (int c = 0; c < C; c++) o[c] = 0.0f;
        for (int j = 0; j < k; j++) {
            int r = pos[(size_t)t * k + j];
            if (r < 0) continue;
            float g = gates[(size_t)t * k + j];
            const float* x = rows + (size_t)r * C;
            for (int c = 0; c < C; c++) o[c] += g * x[c];
        }
    }
    optime_stop(OPK_MOE, OP_FWD, t0);
}

void moe_combine_backward(float* drows, float* dgates, const float* dout, const float* rows,
                          const float* gates, const int* pos, int N, int k, int C) {
    double t0 = optime_start();
    #pragma omp parallel for
    for (int t = 0; t < N; t++) {
        const float* d = dout + (size_t)t * C;
        for (int j = 0; j < k; j++) {
            int r = pos[(size_t)t * k + j];
            if (r < 0) continue;
            if (drows) {
                float g = gates[(size_t)t * k + j];
                float* dr = drows + (size_t)r * C;
                for (int c = 0; c < C; c++) dr[c] += g * d[c];
            }
            if (dgates) {
                const float* x = rows + (size_t)r * C;
                float dot = 0.0f;
                for (int c = 0; c < C; c++) dot += d[c] * x[c];
                dgates[(size_t)t * k + j] += dot;
            }
        }
    }
    optime_stop(OPK_MOE, OP_BWD, t0);
}
