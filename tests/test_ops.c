// test_ops.c: every op in ops.h against a plain double-precision reference.
//
// For each op the test
//   1. runs the fp32 forward and compares it with a reference forward written
//      from the math in double, with simple loops;
//   2. compares every fp32 backward gradient with central finite differences of
//      the double reference forward, for the scalar objective L = sum(out * R)
//      with R a fixed random tensor (so dout = R);
//   3. checks the conventions of ops.h: backward ops accumulate (+=), NULL
//      gradient pointers are accepted, crossentropy_backward writes (not
//      accumulates), works in place and works on vocabulary shards.
//
// The same file tests either backend (build/tests/test_ops on the CPU,
// build/cuda/tests/test_ops on a GPU): every buffer an op touches is device
// memory from the tracking allocator, inputs are copied in from host arrays
// and results copied back out, and all checking is done on the host copies.
//
// Run with -v to print the measured error of every numeric check.
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "memory.h"
#include "ops.h"
#include "runtime.h"
#include "test.h"

// ---------------------------------------------------------------- bounds
// Forward: max|fp32 - double| / max|double|. The fp32 ops sum at most a few
// dozen terms of size ~1, so a correct implementation is off by a few units of
// fp32 rounding (6e-8), i.e. ~1e-6 at worst (measured on the CPU backend:
// <= 1e-7); a real bug (a wrong index, a missing term, layernorm's eps at 1e-6
// instead of 1e-5) is off by 5e-5 or more.
#define FWD_TOL 1e-5
// Backward: max|fp32 analytic - double FD| / (max|FD| + 1e-6). The central
// difference in double with eps = 1e-6 is accurate to ~1e-8 relative
// (truncation eps^2 ~ 1e-12, cancellation 1e-16 * |L| / eps ~ 1e-9), so the
// error measured is the fp32 rounding of the analytic gradient: a few 1e-7
// for these sizes, somewhat more where layernorm's rstd or attention's softmax
// chain amplifies it (measured on the CPU backend: <= 2.5e-7, gelu's being the
// largest). 1e-5 leaves a 40x margin for that, yet is tight enough to catch
// gelu's constant 0.044715 written as 0.0447 (1.3e-5); a missing term or a
// transposed index is off by 1e-2 or more.
#define BWD_TOL 1e-5
// Accumulate: a backward called on a buffer prefilled with P must give
// P + G, where G is what it gives on a zeroed buffer. Only rounding of the
// final add differs (a few fp32 ulps, ~1e-7 relative); an op that overwrites
// is off by |P| ~ 1.
#define ACC_TOL 1e-6
// Step size of the central finite differences (in double).
#define FD_EPS 1e-6

static int verbose = 0;

// ---------------------------------------------------------------- helpers
// xorshift64: deterministic inputs, the same on every machine.
static uint64_t rng_state = 0x9E3779B97F4A7C15ull;

// Uniform in [-1, 1).
static double rng_uniform(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (double)(rng_state >> 11) * (2.0 / 9007199254740992.0) - 1.0;
}

static void fill(float* x, size_t n, double scale) {
    for (size_t i = 0; i < n; i++) x[i] = (float)(scale * rng_uniform());
}

// The reference sees exactly the values the fp32 op sees.
static void to_double(double* d, const float* f, size_t n) {
    for (size_t i = 0; i < n; i++) d[i] = (double)f[i];
}

static double dot_d(const double* a, const double* b, size_t n) {
    double s = 0.0;
    for (size_t i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

static double max_abs(const double* x, size_t n) {
    double m = 0.0;
    for (size_t i = 0; i < n; i++) m = fmax(m, fabs(x[i]));
    return m;
}

// max |a - b|; a NaN anywhere makes the result NaN, which fails every bound
// (fmax would silently drop it).
static double max_abs_diff(const float* a, const double* b, size_t n) {
    double m = 0.0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        if (isnan(d)) return NAN;
        if (d > m) m = d;
    }
    return m;
}

// Error relative to the scale of the reference.
static double rel_err(const float* a, const double* b, size_t n) {
    return max_abs_diff(a, b, n) / (max_abs(b, n) + 1e-6);
}

// Same, between two fp32 results.
static double rel_err_ff(const float* a, const float* b, size_t n) {
    double m = 0.0, s = 0.0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (isnan(d)) return NAN;
        if (d > m) m = d;
        s = fmax(s, fabs((double)b[i]));
    }
    return m / (s + 1e-6);
}

// got must equal base + delta up to the rounding of one fp32 add.
static double accum_err(const float* got, const float* base, const float* delta, size_t n) {
    double m = 0.0, s = 0.0;
    for (size_t i = 0; i < n; i++) {
        double want = (double)base[i] + (double)delta[i];
        double d = fabs((double)got[i] - want);
        if (isnan(d)) return NAN;
        if (d > m) m = d;
        s = fmax(s, fabs(want));
    }
    return m / (s + 1e-6);
}

static void check_err(const char* name, double err, double bound) {
    if (verbose) printf("# %-60s err %.3g (bound %.3g)\n", name, err, bound);
    check(err <= bound, name, "error %.3g exceeds bound %.3g", err, bound);
}

// Central differences of a scalar objective w.r.t. each element of x, which
// the objective reads through its context.
typedef double (*objective_fn)(void* ctx);

static void fd_gradient(objective_fn f, void* ctx, double* x, size_t n, double* grad) {
    for (size_t i = 0; i < n; i++) {
        double saved = x[i];
        x[i] = saved + FD_EPS;
        double lp = f(ctx);
        x[i] = saved - FD_EPS;
        double lm = f(ctx);
        x[i] = saved;
        grad[i] = (lp - lm) / (2.0 * FD_EPS);
    }
}

// ---------------------------------------------------------------- device buffers
// Buffers on the device (host memory on the CPU backend), category "other".
// A test frees all of its buffers at its end with dev_free_all().
#define MAX_DEV 128
static void* dev_bufs[MAX_DEV];
static int num_dev = 0;

static void* dev_alloc(size_t bytes) {
    if (num_dev == MAX_DEV) {
        fprintf(stderr, "test_ops: more than %d device buffers in one test\n", MAX_DEV);
        exit(1);
    }
    void* p = mem_alloc(bytes, MEM_OTHER);  // zero-filled
    dev_bufs[num_dev++] = p;
    return p;
}

// n device floats, all zero.
static float* dev_zeros(size_t n) { return (float*)dev_alloc(n * sizeof(float)); }

// A device copy of n host floats (ints).
static float* dev_copy(const float* host, size_t n) {
    float* d = dev_zeros(n);
    mem_to_device(d, host, n * sizeof(float));
    return d;
}

static int* dev_copy_int(const int* host, size_t n) {
    int* d = (int*)dev_alloc(n * sizeof(int));
    mem_to_device(d, host, n * sizeof(int));
    return d;
}

// Host floats into an existing device buffer, and device floats back out.
static void to_device(float* dev, const float* host, size_t n) { mem_to_device(dev, host, n * sizeof(float)); }
static void to_host(float* host, const float* dev, size_t n) { mem_to_host(host, dev, n * sizeof(float)); }

static void dev_free_all(void) {
    for (int i = 0; i < num_dev; i++) mem_free(dev_bufs[i]);
    num_dev = 0;
}

// ================================================================ encoder
static void encoder_ref(double* out, const int* tokens, const double* wte, const double* wpe,
                        int B, int T, int C) {
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int c = 0; c < C; c++)
                out[(b * T + t) * C + c] = wte[tokens[b * T + t] * C + c] + wpe[t * C + c];
}

typedef struct {
    const int* tokens;
    const double *wte, *wpe, *r;
    double* out;
    int B, T, C;
} encoder_ctx;

static double encoder_objective(void* p) {
    encoder_ctx* e = p;
    encoder_ref(e->out, e->tokens, e->wte, e->wpe, e->B, e->T, e->C);
    return dot_d(e->out, e->r, (size_t)e->B * e->T * e->C);
}

static void test_encoder(void) {
    enum { B = 2, T = 3, C = 5, V = 7, OFF = 2, TMAX = T + OFF, N = B * T };
    // Token 3 appears three times, so dwte must sum over rows.
    const int tokens[N] = {3, 1, 3, 6, 0, 3};
    float wte[V * C], wpe[TMAX * C], out[N * C], r[N * C];
    double wte_d[V * C], wpe_d[TMAX * C], out_d[N * C], r_d[N * C];
    fill(wte, V * C, 1.0);
    fill(wpe, TMAX * C, 1.0);
    fill(r, N * C, 1.0);
    to_double(wte_d, wte, V * C);
    to_double(wpe_d, wpe, TMAX * C);
    to_double(r_d, r, N * C);
    int* tokens_dev = dev_copy_int(tokens, N);
    float* wte_dev = dev_copy(wte, V * C);
    float* wpe_dev = dev_copy(wpe, TMAX * C);
    float* r_dev = dev_copy(r, N * C);
    float* out_dev = dev_zeros(N * C);

    // A chunk starting at position 0, then one starting at OFF (context
    // parallelism passes wpe + t0*C).
    for (int off = 0; off <= OFF; off += OFF) {
        char name[128];
        encoder_forward(out_dev, tokens_dev, wte_dev, wpe_dev + off * C, B, T, C);
        to_host(out, out_dev, N * C);
        encoder_ref(out_d, tokens, wte_d, wpe_d + off * C, B, T, C);
        snprintf(name, sizeof name, "encoder_forward out (wpe offset %d)", off);
        check_err(name, rel_err(out, out_d, N * C), FWD_TOL);

        // The whole dwpe buffer is compared, so rows outside the chunk must
        // stay zero (their FD gradient is exactly 0).
        float dwte[V * C], dwpe[TMAX * C];
        float* dwte_dev = dev_zeros(V * C);
        float* dwpe_dev = dev_zeros(TMAX * C);
        encoder_backward(dwte_dev, dwpe_dev + off * C, r_dev, tokens_dev, B, T, C);
        to_host(dwte, dwte_dev, V * C);
        to_host(dwpe, dwpe_dev, TMAX * C);
        encoder_ctx ctx = {tokens, wte_d, wpe_d + off * C, r_d, out_d, B, T, C};
        double g[V * C > TMAX * C ? V * C : TMAX * C];
        fd_gradient(encoder_objective, &ctx, wte_d, V * C, g);
        snprintf(name, sizeof name, "encoder_backward dwte vs FD (wpe offset %d)", off);
        check_err(name, rel_err(dwte, g, V * C), BWD_TOL);
        fd_gradient(encoder_objective, &ctx, wpe_d, TMAX * C, g);
        snprintf(name, sizeof name, "encoder_backward dwpe vs FD (wpe offset %d)", off);
        check_err(name, rel_err(dwpe, g, TMAX * C), BWD_TOL);

        // Accumulate: prefilled buffers get the same gradient added.
        float pte[V * C], ppe[TMAX * C], ate[V * C], ape[TMAX * C];
        fill(pte, V * C, 1.0);
        fill(ppe, TMAX * C, 1.0);
        float* ate_dev = dev_copy(pte, V * C);
        float* ape_dev = dev_copy(ppe, TMAX * C);
        encoder_backward(ate_dev, ape_dev + off * C, r_dev, tokens_dev, B, T, C);
        to_host(ate, ate_dev, V * C);
        to_host(ape, ape_dev, TMAX * C);
        snprintf(name, sizeof name, "encoder_backward accumulates (wpe offset %d)", off);
        double e = fmax(accum_err(ate, pte, dwte, V * C), accum_err(ape, ppe, dwpe, TMAX * C));
        check_err(name, e, ACC_TOL);
    }
    dev_free_all();
}

// ================================================================ vocabulary-parallel encoder
// The embedding split over vocabulary rows (tensor parallelism): each shard
// looks up only the tokens it holds, one shard adds wpe, and the sum over the
// shards must be encoder_forward's output; the shards' backward must be the
// matching rows of encoder_backward's dwte, and every shard's dwpe the whole
// dwpe. Shards of 3, 3 and 1 rows (uneven, as a vocabulary tp does not divide).
static void test_encoder_vocab(void) {
    enum { B = 2, T = 3, C = 5, V = 7, N = B * T, S = 3 };
    const int v0s[S] = {0, 3, 6}, rows[S] = {3, 3, 1};
    const int tokens[N] = {3, 1, 3, 6, 0, 5};
    float wte[V * C], wpe[T * C], r[N * C];
    fill(wte, V * C, 1.0);
    fill(wpe, T * C, 1.0);
    fill(r, N * C, 1.0);
    int* tokens_dev = dev_copy_int(tokens, N);
    float* wte_dev = dev_copy(wte, V * C);
    float* wpe_dev = dev_copy(wpe, T * C);
    float* r_dev = dev_copy(r, N * C);
    // the full op
    float full[N * C], dwte[V * C], dwpe[T * C];
    float* full_dev = dev_zeros(N * C);
    float* dwte_dev = dev_zeros(V * C);
    float* dwpe_dev = dev_zeros(T * C);
    encoder_forward(full_dev, tokens_dev, wte_dev, wpe_dev, B, T, C);
    encoder_backward(dwte_dev, dwpe_dev, r_dev, tokens_dev, B, T, C);
    to_host(full, full_dev, N * C);
    to_host(dwte, dwte_dev, V * C);
    to_host(dwpe, dwpe_dev, T * C);
    // the shards: forward outputs summed with ops_add (the all-reduce's sum)
    float sum[N * C], shard_dwte[V * C], part[N * C], dwpe_s[T * C];
    float* sum_dev = dev_zeros(N * C);
    float* part_dev = dev_zeros(N * C);
    int zero_rows_ok = 1;
    double dwpe_err = 0.0;
    for (int k = 0; k < S; k++) {
        encoder_forward_vocab(part_dev, tokens_dev, wte_dev + v0s[k] * C, k == 0 ? wpe_dev : NULL, B, T, C,
                              v0s[k], rows[k]);
        to_host(part, part_dev, N * C);
        // a token this shard does not hold contributes exactly zero (shards
        // other than the first add no wpe)
        for (int n = 0; n < N; n++) {
            int held = tokens[n] >= v0s[k] && tokens[n] < v0s[k] + rows[k];
            for (int c = 0; c < C && k > 0; c++)
                zero_rows_ok &= held ? part[n * C + c] == wte[tokens[n] * C + c] : part[n * C + c] == 0.0f;
        }
        ops_add(sum_dev, part_dev, N * C);
        float* dw_dev = dev_zeros(rows[k] * C);
        float* dp_dev = dev_zeros(T * C);
        encoder_backward_vocab(dw_dev, dp_dev, r_dev, tokens_dev, B, T, C, v0s[k], rows[k]);
        to_host(shard_dwte + v0s[k] * C, dw_dev, rows[k] * C);
        to_host(dwpe_s, dp_dev, T * C);
        dwpe_err = fmax(dwpe_err, rel_err_ff(dwpe_s, dwpe, T * C));
    }
    to_host(sum, sum_dev, N * C);
    check(zero_rows_ok, "encoder_forward_vocab: held tokens give their row, others exactly 0",
          "a shard wrote a row it does not hold");
    check_err("encoder_forward_vocab summed over 3 uneven shards equals encoder_forward",
              rel_err_ff(sum, full, N * C), FWD_TOL);
    check_err("encoder_backward_vocab shards' dwte equal encoder_backward's rows",
              rel_err_ff(shard_dwte, dwte, V * C), FWD_TOL);
    check_err("encoder_backward_vocab dwpe on every shard equals encoder_backward's", dwpe_err, FWD_TOL);
    // accumulates, and a NULL gradient is skipped
    float pre[3 * C], got[3 * C];
    fill(pre, 3 * C, 1.0);
    float* acc_dev = dev_copy(pre, 3 * C);
    encoder_backward_vocab(acc_dev, NULL, r_dev, tokens_dev, B, T, C, 3, 3);
    to_host(got, acc_dev, 3 * C);
    check_err("encoder_backward_vocab accumulates (dwpe NULL)", accum_err(got, pre, shard_dwte + 3 * C, 3 * C),
              ACC_TOL);
    dev_free_all();
}

// ================================================================ layernorm
// GPT-2 / llm.c layernorm: biased variance, eps = 1e-5 inside the sqrt.
static void layernorm_ref(double* out, double* mean, double* rstd, const double* inp,
                          const double* w, const double* b, int N, int C) {
    for (int n = 0; n < N; n++) {
        const double* x = inp + n * C;
        double m = 0.0;
        for (int c = 0; c < C; c++) m += x[c];
        m /= C;
        double var = 0.0;
        for (int c = 0; c < C; c++) var += (x[c] - m) * (x[c] - m);
        var /= C;
        double s = 1.0 / sqrt(var + 1e-5);
        for (int c = 0; c < C; c++) out[n * C + c] = (x[c] - m) * s * w[c] + b[c];
        if (mean) mean[n] = m;
        if (rstd) rstd[n] = s;
    }
}

typedef struct {
    const double *inp, *w, *b, *r;
    double* out;
    int N, C;
} layernorm_ctx;

static double layernorm_objective(void* p) {
    layernorm_ctx* l = p;
    layernorm_ref(l->out, NULL, NULL, l->inp, l->w, l->b, l->N, l->C);
    return dot_d(l->out, l->r, (size_t)l->N * l->C);
}

static void test_layernorm(void) {
    enum { N = 4, C = 7 };
    float inp[N * C], w[C], b[C], out[N * C], mean[N], rstd[N], r[N * C];
    double inp_d[N * C], w_d[C], b_d[C], out_d[N * C], mean_d[N], rstd_d[N], r_d[N * C];
    fill(inp, N * C, 1.0);
    // Give rows different means and spreads so mean and rstd both matter.
    for (int n = 0; n < N; n++)
        for (int c = 0; c < C; c++) inp[n * C + c] = inp[n * C + c] * (float)(0.5 + n) + 0.3f * (float)n;
    fill(w, C, 1.0);
    fill(b, C, 1.0);
    fill(r, N * C, 1.0);
    to_double(inp_d, inp, N * C);
    to_double(w_d, w, C);
    to_double(b_d, b, C);
    to_double(r_d, r, N * C);
    float* inp_dev = dev_copy(inp, N * C);
    float* w_dev = dev_copy(w, C);
    float* b_dev = dev_copy(b, C);
    float* r_dev = dev_copy(r, N * C);
    float* out_dev = dev_zeros(N * C);
    float* mean_dev = dev_zeros(N);
    float* rstd_dev = dev_zeros(N);

    layernorm_forward(out_dev, mean_dev, rstd_dev, inp_dev, w_dev, b_dev, N, C);
    to_host(out, out_dev, N * C);
    to_host(mean, mean_dev, N);
    to_host(rstd, rstd_dev, N);
    layernorm_ref(out_d, mean_d, rstd_d, inp_d, w_d, b_d, N, C);
    check_err("layernorm_forward out", rel_err(out, out_d, N * C), FWD_TOL);
    // mean is compared against the scale of the inputs (a row mean can be ~0).
    check_err("layernorm_forward mean", max_abs_diff(mean, mean_d, N) / max_abs(inp_d, N * C),
              FWD_TOL);
    check_err("layernorm_forward rstd", rel_err(rstd, rstd_d, N), FWD_TOL);

    float dinp[N * C], dw[C], db[C];
    float* dinp_dev = dev_zeros(N * C);
    float* dw_dev = dev_zeros(C);
    float* db_dev = dev_zeros(C);
    layernorm_backward(dinp_dev, dw_dev, db_dev, r_dev, inp_dev, w_dev, mean_dev, rstd_dev, N, C);
    to_host(dinp, dinp_dev, N * C);
    to_host(dw, dw_dev, C);
    to_host(db, db_dev, C);
    layernorm_ctx ctx = {inp_d, w_d, b_d, r_d, out_d, N, C};
    double g[N * C];
    fd_gradient(layernorm_objective, &ctx, inp_d, N * C, g);
    check_err("layernorm_backward dinp vs FD", rel_err(dinp, g, N * C), BWD_TOL);
    fd_gradient(layernorm_objective, &ctx, w_d, C, g);
    check_err("layernorm_backward dw vs FD", rel_err(dw, g, C), BWD_TOL);
    fd_gradient(layernorm_objective, &ctx, b_d, C, g);
    check_err("layernorm_backward db vs FD", rel_err(db, g, C), BWD_TOL);

    // Accumulate into all three prefilled buffers.
    float pi[N * C], pw[C], pb[C], ai[N * C], aw[C], ab[C];
    fill(pi, N * C, 1.0);
    fill(pw, C, 1.0);
    fill(pb, C, 1.0);
    float* ai_dev = dev_copy(pi, N * C);
    float* aw_dev = dev_copy(pw, C);
    float* ab_dev = dev_copy(pb, C);
    layernorm_backward(ai_dev, aw_dev, ab_dev, r_dev, inp_dev, w_dev, mean_dev, rstd_dev, N, C);
    to_host(ai, ai_dev, N * C);
    to_host(aw, aw_dev, C);
    to_host(ab, ab_dev, C);
    check_err("layernorm_backward dinp accumulates", accum_err(ai, pi, dinp, N * C), ACC_TOL);
    check_err("layernorm_backward dw accumulates", accum_err(aw, pw, dw, C), ACC_TOL);
    check_err("layernorm_backward db accumulates", accum_err(ab, pb, db, C), ACC_TOL);
    dev_free_all();
}

// ================================================================ matmul
static void matmul_ref(double* out, const double* inp, const double* w, const double* bias,
                       int N, int C, int OC) {
    for (int n = 0; n < N; n++)
        for (int o = 0; o < OC; o++) {
            double s = bias ? bias[o] : 0.0;
            for (int c = 0; c < C; c++) s += inp[n * C + c] * w[o * C + c];
            out[n * OC + o] = s;
        }
}

typedef struct {
    const double *inp, *w, *bias, *r;
    double* out;
    int N, C, OC;
} matmul_ctx;

static double matmul_objective(void* p) {
    matmul_ctx* m = p;
    matmul_ref(m->out, m->inp, m->w, m->bias, m->N, m->C, m->OC);
    return dot_d(m->out, m->r, (size_t)m->N * m->OC);
}

static void test_matmul(void) {
    // Odd sizes, so no blocking or vector width divides them.
    enum { N = 5, C = 7, OC = 3 };
    float inp[N * C], w[OC * C], bias[OC], out[N * OC], r[N * OC];
    double inp_d[N * C], w_d[OC * C], bias_d[OC], out_d[N * OC], r_d[N * OC];
    fill(inp, N * C, 1.0);
    fill(w, OC * C, 1.0);
    fill(bias, OC, 1.0);
    fill(r, N * OC, 1.0);
    to_double(inp_d, inp, N * C);
    to_double(w_d, w, OC * C);
    to_double(bias_d, bias, OC);
    to_double(r_d, r, N * OC);
    float* inp_dev = dev_copy(inp, N * C);
    float* w_dev = dev_copy(w, OC * C);
    float* bias_dev = dev_copy(bias, OC);
    float* r_dev = dev_copy(r, N * OC);
    float* out_dev = dev_zeros(N * OC);

    matmul_forward(out_dev, inp_dev, w_dev, bias_dev, N, C, OC);
    to_host(out, out_dev, N * OC);
    matmul_ref(out_d, inp_d, w_d, bias_d, N, C, OC);
    check_err("matmul_forward out (bias)", rel_err(out, out_d, N * OC), FWD_TOL);
    // Prefill out with garbage: forward writes, and a NULL bias adds nothing.
    for (int i = 0; i < N * OC; i++) out[i] = 99.0f;
    to_device(out_dev, out, N * OC);
    matmul_forward(out_dev, inp_dev, w_dev, NULL, N, C, OC);
    to_host(out, out_dev, N * OC);
    matmul_ref(out_d, inp_d, w_d, NULL, N, C, OC);
    check_err("matmul_forward out (bias NULL)", rel_err(out, out_d, N * OC), FWD_TOL);

    // The backward does not depend on whether the forward had a bias; dbias is
    // the gradient w.r.t. a bias, so the FD runs with one.
    float dinp[N * C], dw[OC * C], dbias[OC];
    float* dinp_dev = dev_zeros(N * C);
    float* dw_dev = dev_zeros(OC * C);
    float* dbias_dev = dev_zeros(OC);
    matmul_backward(dinp_dev, dw_dev, dbias_dev, r_dev, inp_dev, w_dev, N, C, OC);
    to_host(dinp, dinp_dev, N * C);
    to_host(dw, dw_dev, OC * C);
    to_host(dbias, dbias_dev, OC);
    matmul_ctx ctx = {inp_d, w_d, bias_d, r_d, out_d, N, C, OC};
    double g_inp[N * C], g_w[OC * C], g_b[OC];
    fd_gradient(matmul_objective, &ctx, inp_d, N * C, g_inp);
    fd_gradient(matmul_objective, &ctx, w_d, OC * C, g_w);
    fd_gradient(matmul_objective, &ctx, bias_d, OC, g_b);
    check_err("matmul_backward dinp vs FD", rel_err(dinp, g_inp, N * C), BWD_TOL);
    check_err("matmul_backward dw vs FD", rel_err(dw, g_w, OC * C), BWD_TOL);
    check_err("matmul_backward dbias vs FD", rel_err(dbias, g_b, OC), BWD_TOL);

    // Accumulate into prefilled buffers.
    float pi[N * C], pw[OC * C], pb[OC], ai[N * C], aw[OC * C], ab[OC];
    fill(pi, N * C, 1.0);
    fill(pw, OC * C, 1.0);
    fill(pb, OC, 1.0);
    float* ai_dev = dev_copy(pi, N * C);
    float* aw_dev = dev_copy(pw, OC * C);
    float* ab_dev = dev_copy(pb, OC);
    matmul_backward(ai_dev, aw_dev, ab_dev, r_dev, inp_dev, w_dev, N, C, OC);
    to_host(ai, ai_dev, N * C);
    to_host(aw, aw_dev, OC * C);
    to_host(ab, ab_dev, OC);
    check_err("matmul_backward dinp accumulates", accum_err(ai, pi, dinp, N * C), ACC_TOL);
    check_err("matmul_backward dw accumulates", accum_err(aw, pw, dw, OC * C), ACC_TOL);
    check_err("matmul_backward dbias accumulates", accum_err(ab, pb, dbias, OC), ACC_TOL);

    // NULL dinp and dbias (the first layer needs no dinp; a bias-free layer
    // has no dbias): dw is still right and nothing crashes.
    float dw2[OC * C];
    float* dw2_dev = dev_zeros(OC * C);
    matmul_backward(NULL, dw2_dev, NULL, r_dev, inp_dev, w_dev, N, C, OC);
    to_host(dw2, dw2_dev, OC * C);
    check_err("matmul_backward dinp=NULL dbias=NULL, dw vs FD", rel_err(dw2, g_w, OC * C), BWD_TOL);
    float dinp3[N * C], dw3[OC * C];
    float* dinp3_dev = dev_zeros(N * C);
    float* dw3_dev = dev_zeros(OC * C);
    matmul_backward(dinp3_dev, dw3_dev, NULL, r_dev, inp_dev, w_dev, N, C, OC);
    to_host(dinp3, dinp3_dev, N * C);
    to_host(dw3, dw3_dev, OC * C);
    check_err("matmul_backward dbias=NULL, dinp and dw vs FD",
              fmax(rel_err(dinp3, g_inp, N * C), rel_err(dw3, g_w, OC * C)), BWD_TOL);
    dev_free_all();
}

// ================================================================ attention
// Causal attention written from the definition: per (b, t, head), scores of
// the query against keys 0..t, softmax, weighted sum of the values.
static void attention_ref(double* out, double* att, const double* qkv, int B, int T, int C, int NH) {
    int hs = C / NH;
    double scale = 1.0 / sqrt((double)hs);
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int h = 0; h < NH; h++) {
                const double* q = qkv + (b * T + t) * 3 * C + h * hs;
                double* a = att + ((b * NH + h) * T + t) * T;
                double mx = -INFINITY;
                for (int t2 = 0; t2 <= t; t2++) {
                    const double* k = qkv + (b * T + t2) * 3 * C + C + h * hs;
                    double s = 0.0;
                    for (int i = 0; i < hs; i++) s += q[i] * k[i];
                    a[t2] = s * scale;
                    mx = fmax(mx, a[t2]);
                }
                double sum = 0.0;
                for (int t2 = 0; t2 <= t; t2++) {
                    a[t2] = exp(a[t2] - mx);
                    sum += a[t2];
                }
                for (int t2 = 0; t2 <= t; t2++) a[t2] /= sum;
                for (int t2 = t + 1; t2 < T; t2++) a[t2] = 0.0;
                double* o = out + (b * T + t) * C + h * hs;
                for (int i = 0; i < hs; i++) {
                    double s = 0.0;
                    for (int t2 = 0; t2 <= t; t2++)
                        s += a[t2] * qkv[(b * T + t2) * 3 * C + 2 * C + h * hs + i];
                    o[i] = s;
                }
            }
}

typedef struct {
    const double *qkv, *r;
    double *out, *att;
    int B, T, C, NH;
} attention_ctx;

static double attention_objective(void* p) {
    attention_ctx* a = p;
    attention_ref(a->out, a->att, a->qkv, a->B, a->T, a->C, a->NH);
    return dot_d(a->out, a->r, (size_t)a->B * a->T * a->C);
}

static void test_attention(void) {
    enum { B = 2, T = 5, C = 8, NH = 2, QKV = B * T * 3 * C, ATT = B * NH * T * T };
    float qkv[QKV], out[B * T * C], att[ATT], r[B * T * C];
    double qkv_d[QKV], out_d[B * T * C], att_d[ATT], r_d[B * T * C];
    // Scale 1.5 makes the softmax clearly non-uniform.
    fill(qkv, QKV, 1.5);
    fill(r, B * T * C, 1.0);
    to_double(qkv_d, qkv, QKV);
    to_double(r_d, r, B * T * C);
    float* qkv_dev = dev_copy(qkv, QKV);
    float* r_dev = dev_copy(r, B * T * C);
    float* out_dev = dev_zeros(B * T * C);
    float* att_dev = dev_zeros(ATT);

    attention_forward(out_dev, att_dev, qkv_dev, B, T, C, NH);
    to_host(out, out_dev, B * T * C);
    to_host(att, att_dev, ATT);
    attention_ref(out_d, att_d, qkv_d, B, T, C, NH);
    check_err("attention_forward out", rel_err(out, out_d, B * T * C), FWD_TOL);
    // Only the causal part (t2 <= t) of att is defined; probabilities are <= 1.
    double e = 0.0;
    for (int bh = 0; bh < B * NH; bh++)
        for (int t = 0; t < T; t++)
            e = fmax(e, max_abs_diff(att + (bh * T + t) * T, att_d + (bh * T + t) * T, (size_t)t + 1));
    check_err("attention_forward att (causal part)", e, FWD_TOL);

    float dqkv[QKV];
    float* dqkv_dev = dev_zeros(QKV);
    float* datt_dev = dev_zeros(ATT);
    attention_backward(dqkv_dev, datt_dev, r_dev, qkv_dev, att_dev, B, T, C, NH);
    to_host(dqkv, dqkv_dev, QKV);
    attention_ctx ctx = {qkv_d, r_d, out_d, att_d, B, T, C, NH};
    double g[QKV];
    fd_gradient(attention_objective, &ctx, qkv_d, QKV, g);
    check_err("attention_backward dqkv vs FD", rel_err(dqkv, g, QKV), BWD_TOL);

    // Accumulate into a prefilled dqkv.
    float p[QKV], a[QKV];
    fill(p, QKV, 1.0);
    float* a_dev = dev_copy(p, QKV);
    mem_zero(datt_dev, ATT * sizeof(float));
    attention_backward(a_dev, datt_dev, r_dev, qkv_dev, att_dev, B, T, C, NH);
    to_host(a, a_dev, QKV);
    check_err("attention_backward dqkv accumulates", accum_err(a, p, dqkv, QKV), ACC_TOL);

    // datt is scratch: whatever it holds on entry must not change dqkv.
    float d2[QKV], datt[ATT];
    float* d2_dev = dev_zeros(QKV);
    for (int i = 0; i < ATT; i++) datt[i] = 7.0f;
    to_device(datt_dev, datt, ATT);
    attention_backward(d2_dev, datt_dev, r_dev, qkv_dev, att_dev, B, T, C, NH);
    to_host(d2, d2_dev, QKV);
    check_err("attention_backward ignores datt contents (scratch)", rel_err_ff(d2, dqkv, QKV),
              ACC_TOL);
    dev_free_all();
}

// ================================================================ pointwise
static double gelu_ref(double x) {
    const double pi = 3.14159265358979323846;
    return 0.5 * x * (1.0 + tanh(sqrt(2.0 / pi) * (x + 0.044715 * x * x * x)));
}

typedef struct {
    const double *inp, *r;
    size_t n;
} gelu_ctx;

static double gelu_objective(void* p) {
    gelu_ctx* g = p;
    double s = 0.0;
    for (size_t i = 0; i < g->n; i++) s += gelu_ref(g->inp[i]) * g->r[i];
    return s;
}

static void test_gelu(void) {
    enum { N = 41 };
    float inp[N], out[N], r[N];
    double inp_d[N], out_d[N], r_d[N];
    // [-4, 4] covers the linear, curved and saturated parts.
    fill(inp, N, 4.0);
    fill(r, N, 1.0);
    to_double(inp_d, inp, N);
    to_double(r_d, r, N);
    float* inp_dev = dev_copy(inp, N);
    float* r_dev = dev_copy(r, N);
    float* out_dev = dev_zeros(N);
    gelu_forward(out_dev, inp_dev, N);
    to_host(out, out_dev, N);
    for (int i = 0; i < N; i++) out_d[i] = gelu_ref(inp_d[i]);
    check_err("gelu_forward out", rel_err(out, out_d, N), FWD_TOL);

    float dinp[N];
    float* dinp_dev = dev_zeros(N);
    gelu_backward(dinp_dev, inp_dev, r_dev, N);
    to_host(dinp, dinp_dev, N);
    gelu_ctx ctx = {inp_d, r_d, N};
    double g[N];
    fd_gradient(gelu_objective, &ctx, inp_d, N, g);
    check_err("gelu_backward dinp vs FD", rel_err(dinp, g, N), BWD_TOL);

    float p[N], a[N];
    fill(p, N, 1.0);
    float* a_dev = dev_copy(p, N);
    gelu_backward(a_dev, inp_dev, r_dev, N);
    to_host(a, a_dev, N);
    check_err("gelu_backward accumulates", accum_err(a, p, dinp, N), ACC_TOL);
    dev_free_all();
}

typedef struct {
    const double *a, *b, *r;
    size_t n;
} residual_ctx;

static double residual_objective(void* p) {
    residual_ctx* c = p;
    double s = 0.0;
    for (size_t i = 0; i < c->n; i++) s += (c->a[i] + c->b[i]) * c->r[i];
    return s;
}

static void test_residual(void) {
    enum { N = 13 };
    float a[N], b[N], out[N], r[N];
    double a_d[N], b_d[N], out_d[N], r_d[N];
    fill(a, N, 1.0);
    fill(b, N, 1.0);
    fill(r, N, 1.0);
    to_double(a_d, a, N);
    to_double(b_d, b, N);
    to_double(r_d, r, N);
    float* a_dev = dev_copy(a, N);
    float* b_dev = dev_copy(b, N);
    float* r_dev = dev_copy(r, N);
    float* out_dev = dev_zeros(N);
    residual_forward(out_dev, a_dev, b_dev, N);
    to_host(out, out_dev, N);
    for (int i = 0; i < N; i++) out_d[i] = a_d[i] + b_d[i];
    check_err("residual_forward out", rel_err(out, out_d, N), FWD_TOL);

    float da[N], db[N];
    float* da_dev = dev_zeros(N);
    float* db_dev = dev_zeros(N);
    residual_backward(da_dev, db_dev, r_dev, N);
    to_host(da, da_dev, N);
    to_host(db, db_dev, N);
    residual_ctx ctx = {a_d, b_d, r_d, N};
    double g[N];
    fd_gradient(residual_objective, &ctx, a_d, N, g);
    check_err("residual_backward da vs FD", rel_err(da, g, N), BWD_TOL);
    fd_gradient(residual_objective, &ctx, b_d, N, g);
    check_err("residual_backward db vs FD", rel_err(db, g, N), BWD_TOL);

    float pa[N], pb[N], aa[N], ab[N];
    fill(pa, N, 1.0);
    fill(pb, N, 1.0);
    float* aa_dev = dev_copy(pa, N);
    float* ab_dev = dev_copy(pb, N);
    residual_backward(aa_dev, ab_dev, r_dev, N);
    to_host(aa, aa_dev, N);
    to_host(ab, ab_dev, N);
    check_err("residual_backward accumulates",
              fmax(accum_err(aa, pa, da, N), accum_err(ab, pb, db, N)), ACC_TOL);
    dev_free_all();
}

// ================================================================ cross-entropy
// Reference partials and losses from the definition: softmax over the first
// nvalid columns (ids v0 ..), the target's logit if it is one of them.
static void crossentropy_ref(double* losses, double* rowmax, double* sumexp, double* tlogit,
                             const double* logits, const int* targets, int N, int width,
                             int nvalid, int v0) {
    for (int n = 0; n < N; n++) {
        const double* l = logits + n * width;
        double mx = -INFINITY;
        for (int i = 0; i < nvalid; i++) mx = fmax(mx, l[i]);
        double s = 0.0;
        for (int i = 0; i < nvalid; i++) s += exp(l[i] - mx);
        int k = targets[n] - v0;
        double tl = (k >= 0 && k < nvalid) ? l[k] : 0.0;
        if (rowmax) rowmax[n] = mx;
        if (sumexp) sumexp[n] = s;
        if (tlogit) tlogit[n] = tl;
        if (losses) losses[n] = log(s) + mx - tl;
    }
}

typedef struct {
    const double* logits;
    const int* targets;
    double* losses;
    int N, width, nvalid, v0;
    double dloss;
} crossentropy_ctx;

// dloss * sum of the losses: its gradient is what crossentropy_backward writes.
static double crossentropy_objective(void* p) {
    crossentropy_ctx* c = p;
    crossentropy_ref(c->losses, NULL, NULL, NULL, c->logits, c->targets, c->N, c->width,
                     c->nvalid, c->v0);
    double s = 0.0;
    for (int n = 0; n < c->N; n++) s += c->losses[n];
    return c->dloss * s;
}

static void test_crossentropy(void) {
    enum { N = 4, W = 6, NV = 5 };
    const float dloss = 0.25f;
    const int targets[N] = {0, 4, 2, 3};
    float logits[N * W];
    double logits_d[N * W];
    fill(logits, N * W, 3.0);
    // The padding column holds a huge logit: if it entered the softmax it would
    // dominate rowmax, sumexp and the loss.
    for (int n = 0; n < N; n++) logits[n * W + NV] = 50.0f;
    to_double(logits_d, logits, N * W);
    float* logits_dev = dev_copy(logits, N * W);
    int* targets_dev = dev_copy_int(targets, N);

    float rowmax[N], sumexp[N], tlogit[N], losses[N];
    double rowmax_d[N], sumexp_d[N], tlogit_d[N], losses_d[N];
    float* rowmax_dev = dev_zeros(N);
    float* sumexp_dev = dev_zeros(N);
    float* tlogit_dev = dev_zeros(N);
    float* losses_dev = dev_zeros(N);
    crossentropy_partials(rowmax_dev, sumexp_dev, tlogit_dev, logits_dev, targets_dev, N, W, NV, 0);
    crossentropy_loss(losses_dev, rowmax_dev, sumexp_dev, tlogit_dev, N);
    to_host(rowmax, rowmax_dev, N);
    to_host(sumexp, sumexp_dev, N);
    to_host(tlogit, tlogit_dev, N);
    to_host(losses, losses_dev, N);
    crossentropy_ref(losses_d, rowmax_d, sumexp_d, tlogit_d, logits_d, targets, N, W, NV, 0);
    check_err("crossentropy_partials rowmax", rel_err(rowmax, rowmax_d, N), FWD_TOL);
    check_err("crossentropy_partials sumexp", rel_err(sumexp, sumexp_d, N), FWD_TOL);
    check_err("crossentropy_partials tlogit", rel_err(tlogit, tlogit_d, N), FWD_TOL);
    check_err("crossentropy_loss vs double log-softmax", rel_err(losses, losses_d, N), FWD_TOL);

    // Backward into a buffer full of garbage: it must be written, not added to.
    float dlogits[N * W];
    for (int i = 0; i < N * W; i++) dlogits[i] = 123.0f;
    float* dlogits_dev = dev_copy(dlogits, N * W);
    crossentropy_backward(dlogits_dev, logits_dev, targets_dev, rowmax_dev, sumexp_dev, dloss, N, W,
                          NV, 0);
    to_host(dlogits, dlogits_dev, N * W);
    crossentropy_ctx ctx = {logits_d, targets, losses_d, N, W, NV, 0, (double)dloss};
    double g[N * W];
    // FD over every column; padding columns do not enter the loss, so their FD is 0.
    fd_gradient(crossentropy_objective, &ctx, logits_d, N * W, g);
    check_err("crossentropy_backward dlogits vs FD (written over garbage)",
              rel_err(dlogits, g, N * W), BWD_TOL);
    int pad_zero = 1;
    for (int n = 0; n < N; n++) pad_zero &= dlogits[n * W + NV] == 0.0f;
    check(pad_zero, "crossentropy_backward padding dlogits exactly 0",
          "a padding column got a nonzero gradient");

    // In place: dlogits == logits gives the same result.
    float inplace[N * W];
    float* inplace_dev = dev_copy(logits, N * W);
    crossentropy_backward(inplace_dev, inplace_dev, targets_dev, rowmax_dev, sumexp_dev, dloss, N, W,
                          NV, 0);
    to_host(inplace, inplace_dev, N * W);
    check_err("crossentropy_backward in place (dlogits == logits)",
              rel_err_ff(inplace, dlogits, N * W), ACC_TOL);
    dev_free_all();
}

// Two vocabulary shards [0, 6) and [6, 10) of one 10-logit vocabulary: the
// merged partials must give the unsharded loss, and each shard's backward with
// the merged (global) rowmax/sumexp the unsharded dlogits of its columns.
static void test_crossentropy_shards(void) {
    enum { N = 4, V = 10, WA = 6, WB = 4 };
    const float dloss = 0.25f;
    // Targets in shard A (2, and 5 at its last column) and in shard B (7, and
    // 6 at its first column).
    const int targets[N] = {2, 7, 5, 6};
    float logits[N * V], la[N * WA], lb[N * WB];
    double logits_d[N * V];
    fill(logits, N * V, 3.0);
    // Row 0's max lies in shard A, row 1's in shard B, so the merge has to
    // rescale each side's sumexp at least once.
    logits[0 * V + 1] = 5.0f;
    logits[1 * V + 8] = 5.0f;
    for (int n = 0; n < N; n++) {
        memcpy(la + n * WA, logits + n * V, WA * sizeof(float));
        memcpy(lb + n * WB, logits + n * V + WA, WB * sizeof(float));
    }
    to_double(logits_d, logits, N * V);
    float* logits_dev = dev_copy(logits, N * V);
    float* la_dev = dev_copy(la, N * WA);
    float* lb_dev = dev_copy(lb, N * WB);
    int* targets_dev = dev_copy_int(targets, N);

    // Unsharded.
    float m[N], s[N], t[N], loss[N], dl[N * V];
    double loss_d[N];
    float* m_dev = dev_zeros(N);
    float* s_dev = dev_zeros(N);
    float* t_dev = dev_zeros(N);
    float* loss_dev = dev_zeros(N);
    float* dl_dev = dev_zeros(N * V);
    crossentropy_partials(m_dev, s_dev, t_dev, logits_dev, targets_dev, N, V, V, 0);
    crossentropy_loss(loss_dev, m_dev, s_dev, t_dev, N);
    to_host(m, m_dev, N);
    to_host(s, s_dev, N);
    to_host(t, t_dev, N);
    to_host(loss, loss_dev, N);
    crossentropy_ref(loss_d, NULL, NULL, NULL, logits_d, targets, N, V, V, 0);
    check_err("crossentropy unsharded loss (width 10) vs double", rel_err(loss, loss_d, N),
              FWD_TOL);
    crossentropy_backward(dl_dev, logits_dev, targets_dev, m_dev, s_dev, dloss, N, V, V, 0);
    to_host(dl, dl_dev, N * V);
    crossentropy_ctx ctx = {logits_d, targets, loss_d, N, V, V, 0, (double)dloss};
    double g[N * V];
    fd_gradient(crossentropy_objective, &ctx, logits_d, N * V, g);
    check_err("crossentropy unsharded dlogits (width 10) vs FD", rel_err(dl, g, N * V), BWD_TOL);

    // Per shard.
    float ma[N], sa[N], ta[N], mb[N], sb[N], tb[N];
    float* ma_dev = dev_zeros(N);
    float* sa_dev = dev_zeros(N);
    float* ta_dev = dev_zeros(N);
    float* mb_dev = dev_zeros(N);
    float* sb_dev = dev_zeros(N);
    float* tb_dev = dev_zeros(N);
    crossentropy_partials(ma_dev, sa_dev, ta_dev, la_dev, targets_dev, N, WA, WA, 0);
    crossentropy_partials(mb_dev, sb_dev, tb_dev, lb_dev, targets_dev, N, WB, WB, WA);
    to_host(ma, ma_dev, N);
    to_host(sa, sa_dev, N);
    to_host(ta, ta_dev, N);
    to_host(mb, mb_dev, N);
    to_host(sb, sb_dev, N);
    to_host(tb, tb_dev, N);
    int zero_ok = 1;
    for (int n = 0; n < N; n++) {
        if (targets[n] < WA) zero_ok &= tb[n] == 0.0f && ta[n] == logits[n * V + targets[n]];
        else zero_ok &= ta[n] == 0.0f && tb[n] == logits[n * V + targets[n]];
    }
    check(zero_ok, "crossentropy_partials tlogit per shard (target logit or exactly 0)",
          "a shard reported a wrong tlogit");

    // Merge B into A, and A into B: both orders must give the same stats.
    float m1[N], s1[N], t1[N], m2[N], s2[N], t2[N], loss1[N], loss2[N];
    float* m1_dev = dev_copy(ma, N);
    float* s1_dev = dev_copy(sa, N);
    float* t1_dev = dev_copy(ta, N);
    crossentropy_merge(m1_dev, s1_dev, t1_dev, mb_dev, sb_dev, tb_dev, N);
    float* m2_dev = dev_copy(mb, N);
    float* s2_dev = dev_copy(sb, N);
    float* t2_dev = dev_copy(tb, N);
    crossentropy_merge(m2_dev, s2_dev, t2_dev, ma_dev, sa_dev, ta_dev, N);
    to_host(m1, m1_dev, N);
    to_host(s1, s1_dev, N);
    to_host(t1, t1_dev, N);
    to_host(m2, m2_dev, N);
    to_host(s2, s2_dev, N);
    to_host(t2, t2_dev, N);
    int max_ok = 1;
    for (int n = 0; n < N; n++) max_ok &= m1[n] == m[n] && m2[n] == m[n];
    check(max_ok, "crossentropy_merge rowmax equals unsharded rowmax", "merged max differs");
    check_err("crossentropy_merge sumexp equals unsharded sumexp",
              fmax(rel_err_ff(s1, s, N), rel_err_ff(s2, s, N)), FWD_TOL);
    float* loss1_dev = dev_zeros(N);
    float* loss2_dev = dev_zeros(N);
    crossentropy_loss(loss1_dev, m1_dev, s1_dev, t1_dev, N);
    crossentropy_loss(loss2_dev, m2_dev, s2_dev, t2_dev, N);
    to_host(loss1, loss1_dev, N);
    to_host(loss2, loss2_dev, N);
    check_err("crossentropy merged loss equals unsharded loss",
              fmax(rel_err_ff(loss1, loss, N), rel_err_ff(loss2, loss, N)), FWD_TOL);
    check_err("crossentropy merged loss vs double", rel_err(loss1, loss_d, N), FWD_TOL);

    // Backward per shard with the global statistics.
    float da[N * WA], db[N * WB], want_a[N * WA], want_b[N * WB];
    float* da_dev = dev_zeros(N * WA);
    float* db_dev = dev_zeros(N * WB);
    crossentropy_backward(da_dev, la_dev, targets_dev, m1_dev, s1_dev, dloss, N, WA, WA, 0);
    crossentropy_backward(db_dev, lb_dev, targets_dev, m1_dev, s1_dev, dloss, N, WB, WB, WA);
    to_host(da, da_dev, N * WA);
    to_host(db, db_dev, N * WB);
    for (int n = 0; n < N; n++) {
        memcpy(want_a + n * WA, dl + n * V, WA * sizeof(float));
        memcpy(want_b + n * WB, dl + n * V + WA, WB * sizeof(float));
    }
    check_err("crossentropy_backward shard [0,6) equals unsharded columns",
              rel_err_ff(da, want_a, N * WA), FWD_TOL);
    check_err("crossentropy_backward shard [6,10) equals unsharded columns",
              rel_err_ff(db, want_b, N * WB), FWD_TOL);
    dev_free_all();
}

// ================================================================ optimizer
static void test_adamw(void) {
    enum { N = 23, STEPS = 3 };
    // eps = 1e-3 (larger than usual) so that putting eps inside the sqrt, a
    // common slip, changes the step by ~1e-3 of its size and is caught.
    const AdamWConfig cfg = {0.05f, 0.9f, 0.95f, 1e-3f, 0.1f};
    const float grad_scale = 0.5f;
    float p[N], m[N], v[N], grads[N];
    double p_d[N], m_d[N] = {0}, v_d[N] = {0};
    fill(p, N, 1.0);
    to_double(p_d, p, N);
    float* p_dev = dev_copy(p, N);
    float* m_dev = dev_zeros(N);
    float* v_dev = dev_zeros(N);
    float* grads_dev = dev_zeros(N);
    // The reference uses the fp32 hyperparameters promoted to double, so both
    // sides start from the same numbers.
    const double lr = cfg.lr, b1 = cfg.beta1, b2 = cfg.beta2, eps = cfg.eps,
                 wd = cfg.weight_decay, gs = grad_scale;
    double ep = 0.0, em = 0.0, ev = 0.0;
    for (int t = 1; t <= STEPS; t++) {
        fill(grads, N, 1.0);
        to_device(grads_dev, grads, N);
        adamw_update(p_dev, grads_dev, m_dev, v_dev, N, cfg, t, grad_scale);
        to_host(p, p_dev, N);
        to_host(m, m_dev, N);
        to_host(v, v_dev, N);
        for (int i = 0; i < N; i++) {
            double g = gs * (double)grads[i];
            m_d[i] = b1 * m_d[i] + (1.0 - b1) * g;
            v_d[i] = b2 * v_d[i] + (1.0 - b2) * g * g;
            double mhat = m_d[i] / (1.0 - pow(b1, t));
            double vhat = v_d[i] / (1.0 - pow(b2, t));
            p_d[i] -= lr * (mhat / (sqrt(vhat) + eps) + wd * p_d[i]);
        }
        // The parameter error is measured in units of the step size lr: a
        // correct fp32 update is off by a few ulps of p (~1e-7 / 0.05 ~ 1e-5
        // of a step after 3 steps); a wrong formula by 1e-3 of a step or more.
        ep = fmax(ep, max_abs_diff(p, p_d, N) / lr);
        em = fmax(em, rel_err(m, m_d, N));
        ev = fmax(ev, rel_err(v, v_d, N));
    }
    check_err("adamw_update params over 3 steps (error / lr)", ep, 1e-4);
    check_err("adamw_update m over 3 steps", em, FWD_TOL);
    check_err("adamw_update v over 3 steps", ev, FWD_TOL);
    dev_free_all();
}

static void test_grad_norm(void) {
    // Large enough that a float accumulator loses ~1e-5 relative and fails the
    // bound; fp32 products summed in double stay near 1e-10.
    enum { N = 100003 };
    float* g = malloc(N * sizeof(float));
    if (!g) {
        check(0, "grad_sumsq", "out of memory");
        return;
    }
    fill(g, N, 1.0);
    double want = 0.0;
    for (int i = 0; i < N; i++) want += (double)g[i] * (double)g[i];
    float* g_dev = dev_copy(g, N);
    double got = grad_sumsq(g_dev, N);
    check_err("grad_sumsq vs double sum", fabs(got - want) / want, 1e-9);
    free(g);
    dev_free_all();

    float s;
    s = grad_clip_scale(0.5, 1.0f);
    check(s == 1.0f, "grad_clip_scale norm below clip -> 1", "got %g", (double)s);
    s = grad_clip_scale(1.0, 1.0f);
    check(s == 1.0f, "grad_clip_scale norm equal to clip -> 1", "got %g", (double)s);
    s = grad_clip_scale(3.0, 1.0f);
    check(fabs((double)s - 1.0 / 3.0) <= 1e-7, "grad_clip_scale norm above clip -> clip/norm",
          "got %.9g, want %.9g", (double)s, 1.0 / 3.0);
    s = grad_clip_scale(8.0, 2.0f);
    check(s == 0.25f, "grad_clip_scale norm 8 clip 2 -> 0.25", "got %g", (double)s);
    s = grad_clip_scale(5.0, 0.0f);
    check(s == 1.0f, "grad_clip_scale clip 0 disables -> 1", "got %g", (double)s);
    s = grad_clip_scale(5.0, -1.0f);
    check(s == 1.0f, "grad_clip_scale clip < 0 disables -> 1", "got %g", (double)s);
}

// ================================================================ utilities
static void test_utilities(void) {
    enum { N = 17 };
    float x[N], y[N], z[N];
    fill(x, N, 1.0);
    float* x_dev = dev_copy(x, N);
    float* y_dev = dev_copy(x, N);
    ops_scale(y_dev, N, -2.5f);
    to_host(y, y_dev, N);
    int ok = 1;
    // A single fp32 multiply is exactly reproducible.
    for (int i = 0; i < N; i++) ok &= y[i] == x[i] * -2.5f;
    check(ok, "ops_scale", "a value differs from x * s");
    for (int i = 0; i < N; i++) z[i] = 42.0f;
    float* z_dev = dev_copy(z, N);
    ops_copy(z_dev, x_dev, N);
    to_host(z, z_dev, N);
    check(memcmp(z, x, sizeof z) == 0, "ops_copy", "copy differs");
    ops_zero(z_dev, N - 1);
    to_host(z, z_dev, N);
    ok = z[N - 1] == x[N - 1];
    for (int i = 0; i < N - 1; i++) ok &= z[i] == 0.0f;
    check(ok, "ops_zero (exactly n values)", "not zeroed, or wrote past n");
    // ops_add over N - 1 values: a single fp32 add is exactly reproducible,
    // and the last value stays as it was. (No fill: the random stream of the
    // later tests stays as it was.)
    float w[N], sum[N];
    for (int i = 0; i < N; i++) w[i] = 0.25f * (float)i - 2.0f;
    float* w_dev = dev_copy(w, N);
    ops_add(w_dev, x_dev, N - 1);
    to_host(sum, w_dev, N);
    ok = sum[N - 1] == w[N - 1];
    for (int i = 0; i < N - 1; i++) ok &= sum[i] == w[i] + x[i];
    check(ok, "ops_add (exactly n values)", "a value differs from y + x, or wrote past n");
    dev_free_all();

    // ops_copy_2d: 5 rows of 3 floats from a stride of 7 (starting at column 2)
    // into a stride of 4 (starting at column 1); every other value of dst stays.
    {
        enum { R = 5, COLS = 3, SS = 7, DS = 4 };
        float src[R * SS], dst[R * DS], want[R * DS];
        for (int i = 0; i < R * SS; i++) src[i] = (float)i;
        for (int i = 0; i < R * DS; i++) want[i] = dst[i] = -1.0f - (float)i;
        for (int r = 0; r < R; r++)
            for (int c = 0; c < COLS; c++) want[r * DS + 1 + c] = src[r * SS + 2 + c];
        float* s_dev = dev_copy(src, R * SS);
        float* d_dev = dev_copy(dst, R * DS);
        ops_copy_2d(d_dev + 1, DS, s_dev + 2, SS, R, COLS);
        to_host(dst, d_dev, R * DS);
        check(memcmp(dst, want, sizeof dst) == 0, "ops_copy_2d (rows x cols, both strides)",
              "a value differs, or a value outside the rows' columns was written");
        dev_free_all();
    }
}

// ================================================================ NULL gradients
// ops.h: "A gradient pointer may be NULL when the caller does not need it."
// Beyond matmul's dinp/dbias (tested above), these run last so that a crash
// cannot hide the results of the other checks.
static void test_null_gradients(void) {
    enum { N = 3, C = 4, OC = 2, V = 5 };
    float inp[N * C], w[OC * C], r[N * OC], dinp[N * C], dinp_ref[N * C], dout[N * C];
    fill(inp, N * C, 1.0);
    fill(w, OC * C, 1.0);
    fill(r, N * OC, 1.0);
    fill(dout, N * C, 1.0);
    float* inp_dev = dev_copy(inp, N * C);
    float* w_dev = dev_copy(w, OC * C);
    float* r_dev = dev_copy(r, N * OC);
    float* dout_dev = dev_copy(dout, N * C);
    float* dinp_dev = dev_zeros(N * C);
    float* dinp_ref_dev = dev_zeros(N * C);
    float* dw_ref_dev = dev_zeros(OC * C);
    float* dummy_b_dev = dev_zeros(OC);
    matmul_backward(dinp_ref_dev, dw_ref_dev, dummy_b_dev, r_dev, inp_dev, w_dev, N, C, OC);
    matmul_backward(dinp_dev, NULL, NULL, r_dev, inp_dev, w_dev, N, C, OC);
    to_host(dinp, dinp_dev, N * C);
    to_host(dinp_ref, dinp_ref_dev, N * C);
    check_err("matmul_backward dw=NULL dbias=NULL, dinp unchanged", rel_err_ff(dinp, dinp_ref, N * C),
              ACC_TOL);

    // Encoder with only dwte.
    const int tokens[N] = {1, 4, 1};
    float dwte[V * C], dwte2[V * C];
    int* tokens_dev = dev_copy_int(tokens, N);
    float* dwte_dev = dev_zeros(V * C);
    float* dwte2_dev = dev_zeros(V * C);
    float* dwpe_dev = dev_zeros(N * C);
    encoder_backward(dwte_dev, dwpe_dev, dout_dev, tokens_dev, 1, N, C);
    encoder_backward(dwte2_dev, NULL, dout_dev, tokens_dev, 1, N, C);
    to_host(dwte, dwte_dev, V * C);
    to_host(dwte2, dwte2_dev, V * C);
    check_err("encoder_backward dwpe=NULL", rel_err_ff(dwte2, dwte, V * C), ACC_TOL);

    // Residual with one side only.
    float da[N * C], db3[N * C];
    float* da_dev = dev_zeros(N * C);
    float* db3_dev = dev_zeros(N * C);
    residual_backward(da_dev, NULL, dout_dev, N * C);
    residual_backward(NULL, db3_dev, dout_dev, N * C);
    to_host(da, da_dev, N * C);
    to_host(db3, db3_dev, N * C);
    check_err("residual_backward one side NULL",
              fmax(rel_err_ff(da, dout, N * C), rel_err_ff(db3, dout, N * C)), ACC_TOL);

    // Layernorm last: with only dinp, then only dw/db.
    float lw[C], lb[C];
    float di[N * C], dw[C], db[C], di2[N * C], dw2[C], db2[C];
    fill(lw, C, 1.0);
    fill(lb, C, 1.0);
    float* lw_dev = dev_copy(lw, C);
    float* lb_dev = dev_copy(lb, C);
    float* out_dev = dev_zeros(N * C);
    float* mean_dev = dev_zeros(N);
    float* rstd_dev = dev_zeros(N);
    float* di_dev = dev_zeros(N * C);
    float* dw_dev = dev_zeros(C);
    float* db_dev = dev_zeros(C);
    float* di2_dev = dev_zeros(N * C);
    float* dw2_dev = dev_zeros(C);
    float* db2_dev = dev_zeros(C);
    layernorm_forward(out_dev, mean_dev, rstd_dev, inp_dev, lw_dev, lb_dev, N, C);
    layernorm_backward(di_dev, dw_dev, db_dev, dout_dev, inp_dev, lw_dev, mean_dev, rstd_dev, N, C);
    layernorm_backward(di2_dev, NULL, NULL, dout_dev, inp_dev, lw_dev, mean_dev, rstd_dev, N, C);
    layernorm_backward(NULL, dw2_dev, db2_dev, dout_dev, inp_dev, lw_dev, mean_dev, rstd_dev, N, C);
    to_host(di, di_dev, N * C);
    to_host(dw, dw_dev, C);
    to_host(db, db_dev, C);
    to_host(di2, di2_dev, N * C);
    to_host(dw2, dw2_dev, C);
    to_host(db2, db2_dev, C);
    check_err("layernorm_backward with NULL gradients",
              fmax(rel_err_ff(di2, di, N * C), fmax(rel_err_ff(dw2, dw, C), rel_err_ff(db2, db, C))),
              ACC_TOL);
    dev_free_all();
}

// ================================================================ wide rows
// The sizes above fit in one CUDA block of 256 threads, so a GPU kernel's
// "i += blockDim" loops would run one pass only. Here every row (a LayerNorm
// row, an attention row, a vocabulary row, a bias sum, an encoder channel
// range) is wider than 256, so a striding bug in any of them shows up. On the
// CPU the same checks run as one more size. Backward is checked against
// finite differences on a fixed sample of entries where the full FD would be
// slow (attention: every entry costs a whole forward).
#define WIDE 600

// FD of the objective at k entries of x (every stride-th one), into grad (k),
// and the matching entries of the fp32 gradient into got (k).
static void fd_sample(objective_fn f, void* ctx, double* x, size_t n, size_t stride,
                      const float* analytic, double* grad, float* got, size_t* k) {
    *k = 0;
    for (size_t i = 0; i < n; i += stride) {
        double saved = x[i];
        x[i] = saved + FD_EPS;
        double lp = f(ctx);
        x[i] = saved - FD_EPS;
        double lm = f(ctx);
        x[i] = saved;
        grad[*k] = (lp - lm) / (2.0 * FD_EPS);
        got[*k] = analytic[i];
        (*k)++;
    }
}

static void test_wide_rows(void) {
    // LayerNorm: rows of C = 600
    {
        enum { N = 3, C = WIDE };
        float *inp = xmalloc(N * C * sizeof(float)), *w = xmalloc(C * sizeof(float)),
              *b = xmalloc(C * sizeof(float)), *r = xmalloc(N * C * sizeof(float)),
              *out = xmalloc(N * C * sizeof(float)), *dinp = xmalloc(N * C * sizeof(float)),
              *dw = xmalloc(C * sizeof(float));
        double *inp_d = xmalloc(N * C * sizeof(double)), *w_d = xmalloc(C * sizeof(double)),
               *b_d = xmalloc(C * sizeof(double)), *r_d = xmalloc(N * C * sizeof(double)),
               *out_d = xmalloc(N * C * sizeof(double)), mean_d[N], rstd_d[N],
               *g = xmalloc(N * C * sizeof(double));
        fill(inp, N * C, 2.0);
        fill(w, C, 1.0);
        fill(b, C, 1.0);
        fill(r, N * C, 1.0);
        to_double(inp_d, inp, N * C);
        to_double(w_d, w, C);
        to_double(b_d, b, C);
        to_double(r_d, r, N * C);
        float* inp_dev = dev_copy(inp, N * C);
        float* w_dev = dev_copy(w, C);
        float* b_dev = dev_copy(b, C);
        float* r_dev = dev_copy(r, N * C);
        float* out_dev = dev_zeros(N * C);
        float* mean_dev = dev_zeros(N);
        float* rstd_dev = dev_zeros(N);
        layernorm_forward(out_dev, mean_dev, rstd_dev, inp_dev, w_dev, b_dev, N, C);
        to_host(out, out_dev, N * C);
        layernorm_ref(out_d, mean_d, rstd_d, inp_d, w_d, b_d, N, C);
        check_err("layernorm_forward out, C = 600", rel_err(out, out_d, N * C), FWD_TOL);
        float* dinp_dev = dev_zeros(N * C);
        float* dw_dev = dev_zeros(C);
        layernorm_backward(dinp_dev, dw_dev, NULL, r_dev, inp_dev, w_dev, mean_dev, rstd_dev, N, C);
        to_host(dinp, dinp_dev, N * C);
        to_host(dw, dw_dev, C);
        layernorm_ctx ctx = {inp_d, w_d, b_d, r_d, out_d, N, C};
        fd_gradient(layernorm_objective, &ctx, inp_d, N * C, g);
        check_err("layernorm_backward dinp vs FD, C = 600", rel_err(dinp, g, N * C), BWD_TOL);
        fd_gradient(layernorm_objective, &ctx, w_d, C, g);
        check_err("layernorm_backward dw vs FD, C = 600", rel_err(dw, g, C), BWD_TOL);
        free(inp); free(w); free(b); free(r); free(out); free(dinp); free(dw);
        free(inp_d); free(w_d); free(b_d); free(r_d); free(out_d); free(g);
        dev_free_all();
    }
    // Attention: rows of T = 300 keys (one head of size 8)
    {
        enum { B = 1, T = WIDE / 2, C = 8, NH = 1, QKV = B * T * 3 * C, ATT = B * NH * T * T };
        float *qkv = xmalloc(QKV * sizeof(float)), *r = xmalloc(B * T * C * sizeof(float)),
              *out = xmalloc(B * T * C * sizeof(float)), *dqkv = xmalloc(QKV * sizeof(float));
        double *qkv_d = xmalloc(QKV * sizeof(double)), *r_d = xmalloc(B * T * C * sizeof(double)),
               *out_d = xmalloc(B * T * C * sizeof(double)), *att_d = xmalloc(ATT * sizeof(double));
        fill(qkv, QKV, 1.5);
        fill(r, B * T * C, 1.0);
        to_double(qkv_d, qkv, QKV);
        to_double(r_d, r, B * T * C);
        float* qkv_dev = dev_copy(qkv, QKV);
        float* r_dev = dev_copy(r, B * T * C);
        float* out_dev = dev_zeros(B * T * C);
        float* att_dev = dev_zeros(ATT);
        attention_forward(out_dev, att_dev, qkv_dev, B, T, C, NH);
        to_host(out, out_dev, B * T * C);
        attention_ref(out_d, att_d, qkv_d, B, T, C, NH);
        check_err("attention_forward out, T = 300", rel_err(out, out_d, B * T * C), FWD_TOL);
        float* dqkv_dev = dev_zeros(QKV);
        float* datt_dev = dev_zeros(ATT);
        attention_backward(dqkv_dev, datt_dev, r_dev, qkv_dev, att_dev, B, T, C, NH);
        to_host(dqkv, dqkv_dev, QKV);
        attention_ctx ctx = {qkv_d, r_d, out_d, att_d, B, T, C, NH};
        double g[QKV / 97 + 1];
        float got[QKV / 97 + 1];
        size_t k = 0;
        fd_sample(attention_objective, &ctx, qkv_d, QKV, 97, dqkv, g, got, &k);
        check_err("attention_backward dqkv vs FD, T = 300 (every 97th entry)", rel_err(got, g, k), BWD_TOL);
        free(qkv); free(r); free(out); free(dqkv);
        free(qkv_d); free(r_d); free(out_d); free(att_d);
        dev_free_all();
    }
    // Cross-entropy: rows of 600 logits, the first 550 real
    {
        enum { N = 3, W = WIDE, NV = 550 };
        const int targets[N] = {0, 549, 300};
        const float dloss = 0.5f;
        float *logits = xmalloc(N * W * sizeof(float)), *dlogits = xmalloc(N * W * sizeof(float));
        double *logits_d = xmalloc(N * W * sizeof(double)), losses_d[N], rowmax_d[N], sumexp_d[N],
               tlogit_d[N], *g = xmalloc(N * W * sizeof(double));
        float losses[N];
        fill(logits, N * W, 3.0);
        for (int n = 0; n < N; n++)
            for (int v = NV; v < W; v++) logits[n * W + v] = 50.0f;  // padding must not count
        to_double(logits_d, logits, N * W);
        float* logits_dev = dev_copy(logits, N * W);
        int* targets_dev = dev_copy_int(targets, N);
        float* rowmax_dev = dev_zeros(N);
        float* sumexp_dev = dev_zeros(N);
        float* tlogit_dev = dev_zeros(N);
        float* losses_dev = dev_zeros(N);
        crossentropy_partials(rowmax_dev, sumexp_dev, tlogit_dev, logits_dev, targets_dev, N, W, NV, 0);
        crossentropy_loss(losses_dev, rowmax_dev, sumexp_dev, tlogit_dev, N);
        to_host(losses, losses_dev, N);
        crossentropy_ref(losses_d, rowmax_d, sumexp_d, tlogit_d, logits_d, targets, N, W, NV, 0);
        check_err("crossentropy_loss, 600-wide rows (550 real)", rel_err(losses, losses_d, N), FWD_TOL);
        float* dlogits_dev = dev_zeros(N * W);
        crossentropy_backward(dlogits_dev, logits_dev, targets_dev, rowmax_dev, sumexp_dev, dloss, N, W, NV, 0);
        to_host(dlogits, dlogits_dev, N * W);
        crossentropy_ctx ctx = {logits_d, targets, losses_d, N, W, NV, 0, (double)dloss};
        fd_gradient(crossentropy_objective, &ctx, logits_d, N * W, g);
        check_err("crossentropy_backward dlogits vs FD, 600-wide rows", rel_err(dlogits, g, N * W), BWD_TOL);
        free(logits); free(dlogits); free(logits_d); free(g);
        dev_free_all();
    }
    // Bias gradient: a sum over N = 600 rows
    {
        enum { N = WIDE, C = 2, OC = 3 };
        float inp[N * C], w[OC * C], bias[OC], r[N * OC], dbias[OC];
        double inp_d[N * C], w_d[OC * C], bias_d[OC], r_d[N * OC], out_d[N * OC], g[OC];
        fill(inp, N * C, 1.0);
        fill(w, OC * C, 1.0);
        fill(bias, OC, 1.0);
        fill(r, N * OC, 1.0);
        to_double(inp_d, inp, N * C);
        to_double(w_d, w, OC * C);
        to_double(bias_d, bias, OC);
        to_double(r_d, r, N * OC);
        float* inp_dev = dev_copy(inp, N * C);
        float* w_dev = dev_copy(w, OC * C);
        float* r_dev = dev_copy(r, N * OC);
        float* dw_dev = dev_zeros(OC * C);
        float* dbias_dev = dev_zeros(OC);
        matmul_backward(NULL, dw_dev, dbias_dev, r_dev, inp_dev, w_dev, N, C, OC);
        to_host(dbias, dbias_dev, OC);
        matmul_ctx ctx = {inp_d, w_d, bias_d, r_d, out_d, N, C, OC};
        fd_gradient(matmul_objective, &ctx, bias_d, OC, g);
        check_err("matmul_backward dbias vs FD, a sum over 600 rows", rel_err(dbias, g, OC), BWD_TOL);
        dev_free_all();
    }
    // Encoder: C = 600 channels (more than one block of channels)
    {
        enum { B = 1, T = 2, C = WIDE, V = 3 };
        const int tokens[B * T] = {2, 2};
        float *wte = xmalloc(V * C * sizeof(float)), *wpe = xmalloc(T * C * sizeof(float)),
              *r = xmalloc(B * T * C * sizeof(float)), *dwte = xmalloc(V * C * sizeof(float));
        double *wte_d = xmalloc(V * C * sizeof(double)), *wpe_d = xmalloc(T * C * sizeof(double)),
               *r_d = xmalloc(B * T * C * sizeof(double)), *out_d = xmalloc(B * T * C * sizeof(double)),
               *g = xmalloc(V * C * sizeof(double));
        fill(wte, V * C, 1.0);
        fill(wpe, T * C, 1.0);
        fill(r, B * T * C, 1.0);
        to_double(wte_d, wte, V * C);
        to_double(wpe_d, wpe, T * C);
        to_double(r_d, r, B * T * C);
        int* tokens_dev = dev_copy_int(tokens, B * T);
        float* r_dev = dev_copy(r, B * T * C);
        float* dwte_dev = dev_zeros(V * C);
        float* dwpe_dev = dev_zeros(T * C);
        encoder_backward(dwte_dev, dwpe_dev, r_dev, tokens_dev, B, T, C);
        to_host(dwte, dwte_dev, V * C);
        encoder_ctx ctx = {tokens, wte_d, wpe_d, r_d, out_d, B, T, C};
        fd_gradient(encoder_objective, &ctx, wte_d, V * C, g);
        check_err("encoder_backward dwte vs FD, C = 600, one token twice", rel_err(dwte, g, V * C), BWD_TOL);
        free(wte); free(wpe); free(r); free(dwte);
        free(wte_d); free(wpe_d); free(r_d); free(out_d); free(g);
        dev_free_all();
    }
}

// ================================================================ attention on sequence chunks
// Context parallelism runs attention chunk by chunk: a query chunk meets each
// kv chunk in turn (forward of the pair, merge into the partials so far), then
// finish; backward runs once per (query chunk, kv chunk) pair. These checks cut
// one sequence into chunks, each its own device buffer as on a rank, and
// compare with the whole-sequence ops and with finite differences of a double
// reference of the chunked forward.
#define MAX_CHUNKS 4

// A (B, T, width) tensor in chunks of sz[0..n) positions: chunk c is its own
// (B, sz[c], width) tensor, and the chunks lie one after the other, so chunk c
// starts at B * (positions before c) * width.
static void split_chunks(float* dst, const float* src, int B, int T, int width, const int* sz, int n) {
    for (int c = 0, t0 = 0; c < n; t0 += sz[c], c++)
        for (int b = 0; b < B; b++)
            for (int t = 0; t < sz[c]; t++)
                memcpy(dst + ((size_t)B * t0 + (size_t)b * sz[c] + t) * width,
                       src + ((size_t)b * T + t0 + t) * width, (size_t)width * sizeof(float));
}

// The inverse, adding: dst (B, T, width) += the chunks of src.
static void join_chunks_add(float* dst, const float* src, int B, int T, int width, const int* sz, int n) {
    for (int c = 0, t0 = 0; c < n; t0 += sz[c], c++)
        for (int b = 0; b < B; b++)
            for (int t = 0; t < sz[c]; t++)
                for (int x = 0; x < width; x++)
                    dst[((size_t)b * T + t0 + t) * width + x] +=
                        src[((size_t)B * t0 + (size_t)b * sz[c] + t) * width + x];
}

typedef struct {
    int B, T, C, NH;
    const int* qsz;  // positions of each query chunk
    int nq;
    const int* ksz;  // positions of each kv chunk
    int nk;
    int shared;      // the same cut for both, and chunk c's queries, keys and values in
                     // one buffer with one gradient buffer, as a context-parallel rank holds them
} chunk_setup;

// Host in: q_ch, kv_ch (qkv in the query cut and the kv cut; kv_ch is ignored
// when shared), dout_ch (query cut). Host out: out_ch (query cut, finished),
// dq_ch (query cut, 3C), dkv_ch (kv cut, 3C; zero when shared, where dq_ch
// holds the whole gradient). Query chunk c meets the kv chunks c, c+1, ...
// (mod nk), its own first, as a ring brings them. Leaves its device buffers to
// the caller's dev_free_all.
static void chunk_attention_run(const chunk_setup* s, float* out_ch, float* dq_ch, float* dkv_ch,
                                const float* q_ch, const float* kv_ch, const float* dout_ch) {
    const int B = s->B, C = s->C, NH = s->NH;
    float *q_dev[MAX_CHUNKS], *dq_dev[MAX_CHUNKS], *out_dev[MAX_CHUNKS], *dout_dev[MAX_CHUNKS],
          *m_dev[MAX_CHUNKS], *l_dev[MAX_CHUNKS], *kv_dev[MAX_CHUNKS], *dkv_dev[MAX_CHUNKS];
    int q0[MAX_CHUNKS], k0[MAX_CHUNKS], tmax = 0;
    for (int c = 0; c < s->nq; c++) {
        q0[c] = c ? q0[c - 1] + s->qsz[c - 1] : 0;
        size_t rows = (size_t)B * s->qsz[c];
        q_dev[c] = dev_copy(q_ch + (size_t)B * q0[c] * 3 * C, rows * 3 * C);
        dq_dev[c] = dev_zeros(rows * 3 * C);
        dout_dev[c] = dev_copy(dout_ch + (size_t)B * q0[c] * C, rows * C);
        out_dev[c] = dev_zeros(rows * C);
        m_dev[c] = dev_zeros(rows * NH);
        l_dev[c] = dev_zeros(rows * NH);
        tmax = s->qsz[c] > tmax ? s->qsz[c] : tmax;
    }
    for (int c = 0; c < s->nk; c++) {
        k0[c] = c ? k0[c - 1] + s->ksz[c - 1] : 0;
        if (s->shared) {
            kv_dev[c] = q_dev[c];
            dkv_dev[c] = dq_dev[c];
        } else {
            // packed (B, Tk, 2C) [k | v], as a ring sends it: cut out of the
            // chunk's qkv by the strided copy, so only K and V are held
            size_t rows = (size_t)B * s->ksz[c];
            float* qkv_c = dev_copy(kv_ch + (size_t)B * k0[c] * 3 * C, rows * 3 * C);
            kv_dev[c] = dev_zeros(rows * 2 * C);
            ops_copy_2d(kv_dev[c], 2 * C, qkv_c + C, 3 * C, (int)rows, 2 * C);
            dkv_dev[c] = dev_zeros(rows * 2 * C);
        }
    }
    // The partials of the next pair, reused from pair to pair: forward must
    // overwrite them, so they start as garbage.
    size_t n2 = (size_t)B * tmax * C;
    float* junk = xmalloc(n2 * sizeof(float));
    for (size_t i = 0; i < n2; i++) junk[i] = 7.0f;
    float* o2 = dev_copy(junk, n2);
    float* m2 = dev_copy(junk, (size_t)B * tmax * NH);
    float* l2 = dev_copy(junk, (size_t)B * tmax * NH);
    free(junk);

    for (int c = 0; c < s->nq; c++) {
        const int Tq = s->qsz[c];
        for (int step = 0; step < s->nk; step++) {
            int kc = (c + step) % s->nk;
            // K and V: inside the chunk's qkv (stride 3C) when shared, else packed (stride 2C)
            const int kvs = s->shared ? 3 * C : 2 * C;
            const float* k = kv_dev[kc] + (s->shared ? C : 0);
            if (step == 0) {
                attention_chunk_forward(out_dev[c], m_dev[c], l_dev[c], q_dev[c], 3 * C, k, k + C,
                                        kvs, B, Tq, s->ksz[kc], q0[c], k0[kc], C, NH);
            } else {
                attention_chunk_forward(o2, m2, l2, q_dev[c], 3 * C, k, k + C, kvs, B, Tq,
                                        s->ksz[kc], q0[c], k0[kc], C, NH);
                attention_chunk_merge(out_dev[c], m_dev[c], l_dev[c], o2, m2, l2, B, Tq, C, NH);
            }
        }
        // lse written over rowmax (in place, as ops.h allows): m_dev holds lse from here on
        attention_chunk_finish(out_dev[c], m_dev[c], m_dev[c], l_dev[c], B, Tq, C, NH);
    }
    const int kvs = s->shared ? 3 * C : 2 * C, koff = s->shared ? C : 0;
    for (int c = 0; c < s->nq; c++)
        for (int kc = 0; kc < s->nk; kc++)
            attention_chunk_backward(dq_dev[c], dkv_dev[kc] + koff, dkv_dev[kc] + koff + C,
                                     dout_dev[c], out_dev[c], m_dev[c], q_dev[c], 3 * C,
                                     kv_dev[kc] + koff, kv_dev[kc] + koff + C, kvs, B, s->qsz[c],
                                     s->ksz[kc], q0[c], k0[kc], C, NH);
    for (int c = 0; c < s->nq; c++) {
        size_t rows = (size_t)B * s->qsz[c];
        to_host(out_ch + (size_t)B * q0[c] * C, out_dev[c], rows * C);
        to_host(dq_ch + (size_t)B * q0[c] * 3 * C, dq_dev[c], rows * 3 * C);
    }
    if (s->shared)
        memset(dkv_ch, 0, (size_t)B * s->T * 3 * C * sizeof(float));
    else
        for (int c = 0; c < s->nk; c++) {
            // unpacked back into the qkv layout (query part zero) by the strided copy
            size_t rows = (size_t)B * s->ksz[c];
            float* g3 = dev_zeros(rows * 3 * C);
            ops_copy_2d(g3 + C, 3 * C, dkv_dev[c], 2 * C, (int)rows, 2 * C);
            to_host(dkv_ch + (size_t)B * k0[c] * 3 * C, g3, rows * 3 * C);
        }
}

// The finished output of every query chunk, from the definition in double:
// query i of chunk c against every visible key of every kv chunk, one softmax.
// Inputs and output in the chunk layout of split_chunks.
static void attention_chunks_ref(double* out_ch, const double* q_ch, const double* kv_ch,
                                 const chunk_setup* s) {
    const int B = s->B, C = s->C, NH = s->NH, hs = C / NH, ld = 3 * C;
    const double scale = 1.0 / sqrt((double)hs);
    for (int c = 0, q0 = 0; c < s->nq; q0 += s->qsz[c], c++) {
        const int Tq = s->qsz[c];
        for (int b = 0; b < B; b++)
            for (int i = 0; i < Tq; i++)
                for (int h = 0; h < NH; h++) {
                    const double* q = q_ch + ((size_t)B * q0 + (size_t)b * Tq + i) * ld + h * hs;
                    double* o = out_ch + ((size_t)B * q0 + (size_t)b * Tq + i) * C + h * hs;
                    for (int x = 0; x < hs; x++) o[x] = 0.0;
                    // pass 0: the max over all visible keys; pass 1: the sums
                    double mx = -INFINITY, sum = 0.0;
                    for (int pass = 0; pass < 2; pass++)
                        for (int kc = 0, k0 = 0; kc < s->nk; k0 += s->ksz[kc], kc++)
                            for (int j = 0; j < s->ksz[kc] && k0 + j <= q0 + i; j++) {
                                const double* k = kv_ch + ((size_t)B * k0 + (size_t)b * s->ksz[kc] + j) * ld + C + h * hs;
                                double sc = 0.0;
                                for (int x = 0; x < hs; x++) sc += q[x] * k[x];
                                sc *= scale;
                                if (pass == 0) {
                                    mx = fmax(mx, sc);
                                } else {
                                    double e = exp(sc - mx);
                                    sum += e;
                                    for (int x = 0; x < hs; x++) o[x] += e * k[C + x];
                                }
                            }
                    for (int x = 0; x < hs; x++) o[x] = sum > 0.0 ? o[x] / sum : 0.0;
                }
    }
}

typedef struct {
    const chunk_setup* s;
    const double *q_ch, *kv_ch, *r_ch;
    double* out_ch;
} attention_chunks_ctx;

// L = sum(out * R) over every query chunk's finished output.
static double attention_chunks_objective(void* p) {
    attention_chunks_ctx* a = p;
    attention_chunks_ref(a->out_ch, a->q_ch, a->kv_ch, a->s);
    return dot_d(a->out_ch, a->r_ch, (size_t)a->s->B * a->s->T * a->s->C);
}

// The chunk layout of one case's inputs and gradients (split_chunks), for
// checks beyond check_chunks_vs_whole's; the caller frees them.
typedef struct {
    float *q_ch, *kv_ch, *r_ch, *dq_ch, *dkv_ch;
} chunk_bufs;

// The chunked ops of a setup against attention_forward / attention_backward
// on the whole sequence: the finished outputs, and the gradients summed over
// every pair (and accumulated: a backward that overwrote would keep only the
// last pair of each chunk). Random inputs; heap buffers, so wide rows fit.
// With keep, the chunk buffers go to the caller instead of being freed.
static void check_chunks_vs_whole(const chunk_setup* s, const char* what, chunk_bufs* keep) {
    const int B = s->B, T = s->T, C = s->C, NH = s->NH;
    const size_t QKV = (size_t)B * T * 3 * C, OUT = (size_t)B * T * C, ATT = (size_t)B * NH * T * T;
    float *qkv = xmalloc(QKV * sizeof(float)), *r = xmalloc(OUT * sizeof(float)),
          *out = xmalloc(OUT * sizeof(float)), *dqkv = xmalloc(QKV * sizeof(float)),
          *q_ch = xmalloc(QKV * sizeof(float)), *kv_ch = xmalloc(QKV * sizeof(float)),
          *r_ch = xmalloc(OUT * sizeof(float)), *out_ch = xmalloc(OUT * sizeof(float)),
          *dq_ch = xmalloc(QKV * sizeof(float)), *dkv_ch = xmalloc(QKV * sizeof(float)),
          *out_j = xcalloc(OUT, sizeof(float)), *g_j = xcalloc(QKV, sizeof(float));
    fill(qkv, QKV, 1.5);
    fill(r, OUT, 1.0);
    float* qkv_dev = dev_copy(qkv, QKV);
    float* r_dev = dev_copy(r, OUT);
    float* out_dev = dev_zeros(OUT);
    float* att_dev = dev_zeros(ATT);
    float* dqkv_dev = dev_zeros(QKV);
    float* datt_dev = dev_zeros(ATT);
    attention_forward(out_dev, att_dev, qkv_dev, B, T, C, NH);
    attention_backward(dqkv_dev, datt_dev, r_dev, qkv_dev, att_dev, B, T, C, NH);
    to_host(out, out_dev, OUT);
    to_host(dqkv, dqkv_dev, QKV);
    split_chunks(q_ch, qkv, B, T, 3 * C, s->qsz, s->nq);
    split_chunks(kv_ch, qkv, B, T, 3 * C, s->ksz, s->nk);
    split_chunks(r_ch, r, B, T, C, s->qsz, s->nq);
    chunk_attention_run(s, out_ch, dq_ch, dkv_ch, q_ch, s->shared ? NULL : kv_ch, r_ch);
    join_chunks_add(out_j, out_ch, B, T, C, s->qsz, s->nq);
    join_chunks_add(g_j, dq_ch, B, T, 3 * C, s->qsz, s->nq);
    if (!s->shared) join_chunks_add(g_j, dkv_ch, B, T, 3 * C, s->ksz, s->nk);
    char name[160];
    snprintf(name, sizeof name, "attention_chunk_forward+merge+finish vs attention_forward, %s", what);
    check_err(name, rel_err_ff(out_j, out, OUT), FWD_TOL);
    snprintf(name, sizeof name, "attention_chunk_backward summed vs attention_backward, %s", what);
    check_err(name, rel_err_ff(g_j, dqkv, QKV), BWD_TOL);
    free(qkv); free(r); free(out); free(dqkv); free(out_ch); free(out_j); free(g_j);
    if (keep) {
        *keep = (chunk_bufs){q_ch, kv_ch, r_ch, dq_ch, dkv_ch};
    } else {
        free(q_ch); free(kv_ch); free(r_ch); free(dq_ch); free(dkv_ch);
    }
    dev_free_all();
}

static void test_attention_chunks(void) {
    // B = 2, T = 7, C = 8, NH = 2; query chunks of 3 and 4 positions, kv
    // chunks of 4 and 3, so that the cuts do not line up:
    //   queries 0..2 x keys 0..3: key 3 is in every query's future (a cut inside the pair);
    //   queries 0..2 x keys 4..6: every key in the future, every row empty;
    //   queries 3..6 x keys 4..6: query 3 sees none of them (an empty row in a live pair).
    // In the ring order (own chunk first) queries 0..2 merge the empty pair in
    // second, and queries 3..6 start from the pair whose query-3 row is empty,
    // so the merge meets -inf on either side.
    enum { B = 2, T = 7, C = 8, NH = 2, QKV = B * T * 3 * C, OUT = B * T * C };
    const int qsz[2] = {3, 4}, ksz[2] = {4, 3};
    chunk_setup s = {B, T, C, NH, qsz, 2, ksz, 2, 0};
    chunk_bufs kept;
    check_chunks_vs_whole(&s, "T = 7 (q 3+4, kv 4+3)", &kept);
    const float *q_ch = kept.q_ch, *kv_ch = kept.kv_ch, *r_ch = kept.r_ch, *dq_ch = kept.dq_ch,
                *dkv_ch = kept.dkv_ch;

    // Finite differences of the chunked forward in double, per chunk buffer:
    // dq_ch must hold the queries' gradient and nothing in its key and value
    // parts, dkv_ch the keys' and values' and nothing in its query part.
    double q_d[QKV], kv_d[QKV], r_d[OUT], out_d[OUT], g[QKV];
    to_double(q_d, q_ch, QKV);
    to_double(kv_d, kv_ch, QKV);
    to_double(r_d, r_ch, OUT);
    attention_chunks_ctx ctx = {&s, q_d, kv_d, r_d, out_d};
    fd_gradient(attention_chunks_objective, &ctx, q_d, QKV, g);
    check_err("attention_chunk_backward query chunks' dqkv vs FD of the chunked forward",
              rel_err(dq_ch, g, QKV), BWD_TOL);
    fd_gradient(attention_chunks_objective, &ctx, kv_d, QKV, g);
    check_err("attention_chunk_backward kv chunks' dqkv vs FD of the chunked forward",
              rel_err(dkv_ch, g, QKV), BWD_TOL);

    // A pair with every key in the future (queries 0..2, keys 4..6), twice,
    // merged and finished: empty rows stay empty, with no NaN on the way.
    {
        enum { TQ = 3, TK = 3, R = B * TQ * NH, O = B * TQ * C };
        float o[O], m[R], l[R];
        float* q_dev = dev_copy(q_ch, (size_t)B * TQ * 3 * C);
        float* kv_dev = dev_copy(kv_ch + (size_t)B * 4 * 3 * C, (size_t)B * TK * 3 * C);
        float *o_dev = dev_zeros(O), *m_dev = dev_zeros(R), *l_dev = dev_zeros(R);
        float *o2_dev = dev_zeros(O), *m2_dev = dev_zeros(R), *l2_dev = dev_zeros(R);
        attention_chunk_forward(o_dev, m_dev, l_dev, q_dev, 3 * C, kv_dev + C, kv_dev + 2 * C,
                                3 * C, B, TQ, TK, 0, 4, C, NH);
        to_host(o, o_dev, O);
        to_host(m, m_dev, R);
        to_host(l, l_dev, R);
        int ok = 1;
        for (int i = 0; i < R; i++) ok &= isinf(m[i]) && m[i] < 0 && l[i] == 0.0f;
        for (int i = 0; i < O; i++) ok &= o[i] == 0.0f;
        check(ok, "attention_chunk_forward, every key in the future: rowmax -inf, sumexp 0, out 0",
              "a row is not empty");
        attention_chunk_forward(o2_dev, m2_dev, l2_dev, q_dev, 3 * C, kv_dev + C, kv_dev + 2 * C,
                                3 * C, B, TQ, TK, 0, 4, C, NH);
        attention_chunk_merge(o_dev, m_dev, l_dev, o2_dev, m2_dev, l2_dev, B, TQ, C, NH);
        attention_chunk_finish(o_dev, m_dev, m_dev, l_dev, B, TQ, C, NH);
        to_host(o, o_dev, O);
        to_host(m, m_dev, R);
        ok = 1;
        for (int i = 0; i < R; i++) ok &= isinf(m[i]) && m[i] < 0;
        for (int i = 0; i < O; i++) ok &= o[i] == 0.0f;
        check(ok, "attention_chunk_merge+finish of two empty pairs: out 0, lse -inf (no NaN)",
              "a value is NaN or not empty");
    }
    dev_free_all();
    free(kept.q_ch); free(kept.kv_ch); free(kept.r_ch); free(kept.dq_ch); free(kept.dkv_ch);

    // Rows of 300 keys (more than one CUDA block of threads, so every striding
    // loop of the GPU kernels makes two passes, and more than one causal row
    // block of the CPU's): T = 600 in two chunks of 300, queries, keys and
    // values of a chunk in one buffer with one gradient buffer, as a rank
    // holds them. The whole-sequence ops are checked against FD at this width
    // in test_wide_rows.
    {
        const int sz[2] = {WIDE / 2, WIDE / 2};
        chunk_setup s1 = {1, 2 * (WIDE / 2), 8, 1, sz, 2, sz, 2, 1};
        check_chunks_vs_whole(&s1, "T = 600 (chunks of 300)", NULL);
    }
    // Cuts that fall inside the CPU's causal row blocks (64 rows) with
    // several heads and packed K/V: queries 0..99 and 100..179, keys 0..129
    // and 130..179. Queries 100..179 against keys 0..129: rows 100..128 see a
    // part of the keys, the rest all of them; against keys 130..179: the first
    // row block (queries 100..163) holds 30 empty rows above 34 live ones.
    {
        const int qsz[2] = {100, 80}, ksz[2] = {130, 50};
        chunk_setup s2 = {2, 180, 16, 2, qsz, 2, ksz, 2, 0};
        check_chunks_vs_whole(&s2, "T = 180 (q 100+80, kv 130+50, 2 heads)", NULL);
    }
}

// ================================================================ backward in two halves
// A split backward (common/model.h, block_backward_input / _weights) calls
// matmul_backward and layernorm_backward twice: with dinp alone (and no inp
// for the matmul), then with the weight gradients alone (and no w). The two
// calls must give the very bits of one call with all three, accumulating
// onto the same prefilled buffers (cuBLAS documents bitwise-reproducible
// results for the same call on one GPU with one stream computing). Rows wider
// than 256 so every CUDA kernel loops. The calls that must read nothing come last: a crash there cannot
// hide the other results.
static void test_backward_halves(void) {
    enum { N = 37, C = 300, OC = 260 };
    float* inp = malloc(sizeof(float) * N * C);
    float* w = malloc(sizeof(float) * OC * C);
    float* b = malloc(sizeof(float) * OC);
    float* dout = malloc(sizeof(float) * N * OC);
    float* pre_i = malloc(sizeof(float) * N * C);
    float* pre_w = malloc(sizeof(float) * OC * C);
    float* pre_b = malloc(sizeof(float) * OC);
    fill(inp, N * C, 1.0);
    fill(w, OC * C, 1.0);
    fill(b, OC, 1.0);
    fill(dout, N * OC, 1.0);
    fill(pre_i, N * C, 1.0);
    fill(pre_w, OC * C, 1.0);
    fill(pre_b, OC, 1.0);
    float* inp_dev = dev_copy(inp, N * C);
    float* w_dev = dev_copy(w, OC * C);
    float* dout_dev = dev_copy(dout, N * OC);

    // matmul: one call against the two halves, onto the same prefilled buffers
    float* i1_dev = dev_copy(pre_i, N * C);
    float* w1_dev = dev_copy(pre_w, OC * C);
    float* b1_dev = dev_copy(pre_b, OC);
    float* i2_dev = dev_copy(pre_i, N * C);
    float* w2_dev = dev_copy(pre_w, OC * C);
    float* b2_dev = dev_copy(pre_b, OC);
    matmul_backward(i1_dev, w1_dev, b1_dev, dout_dev, inp_dev, w_dev, N, C, OC);
    matmul_backward(i2_dev, NULL, NULL, dout_dev, NULL, w_dev, N, C, OC);
    matmul_backward(NULL, w2_dev, b2_dev, dout_dev, inp_dev, NULL, N, C, OC);
    float *i1 = malloc(sizeof(float) * N * C), *i2 = malloc(sizeof(float) * N * C);
    float *w1 = malloc(sizeof(float) * OC * C), *w2 = malloc(sizeof(float) * OC * C);
    float b1[OC], b2[OC];
    to_host(i1, i1_dev, N * C);
    to_host(i2, i2_dev, N * C);
    to_host(w1, w1_dev, OC * C);
    to_host(w2, w2_dev, OC * C);
    to_host(b1, b1_dev, OC);
    to_host(b2, b2_dev, OC);
    int same = memcmp(i1, i2, sizeof(float) * N * C) == 0 && memcmp(w1, w2, sizeof(float) * OC * C) == 0 &&
               memcmp(b1, b2, sizeof(b1)) == 0;
    check(same, "matmul_backward in two halves (dinp, no inp; then dw+dbias, no w) == one call, bitwise",
          "a gradient differs from the one-call result");

    // layernorm: the same, in a (N, C) layout
    float* ln_w = malloc(sizeof(float) * C);
    float* ln_b = malloc(sizeof(float) * C);
    float* ln_dout = malloc(sizeof(float) * N * C);
    fill(ln_w, C, 1.0);
    fill(ln_b, C, 1.0);
    fill(ln_dout, N * C, 1.0);
    float* lw_dev = dev_copy(ln_w, C);
    float* lb_dev = dev_copy(ln_b, C);
    float* ldout_dev = dev_copy(ln_dout, N * C);
    float* out_dev = dev_zeros(N * C);
    float* mean_dev = dev_zeros(N);
    float* rstd_dev = dev_zeros(N);
    layernorm_forward(out_dev, mean_dev, rstd_dev, inp_dev, lw_dev, lb_dev, N, C);
    float* li1_dev = dev_copy(pre_i, N * C);
    float* lw1_dev = dev_copy(pre_w, C);
    float* lb1_dev = dev_copy(pre_w + C, C);  // pre_b has only OC < C floats
    float* li2_dev = dev_copy(pre_i, N * C);
    float* lw2_dev = dev_copy(pre_w, C);
    float* lb2_dev = dev_copy(pre_w + C, C);
    layernorm_backward(li1_dev, lw1_dev, lb1_dev, ldout_dev, inp_dev, lw_dev, mean_dev, rstd_dev, N, C);
    layernorm_backward(li2_dev, NULL, NULL, ldout_dev, inp_dev, lw_dev, mean_dev, rstd_dev, N, C);
    layernorm_backward(NULL, lw2_dev, lb2_dev, ldout_dev, inp_dev, NULL, mean_dev, rstd_dev, N, C);
    float lw1[C], lw2[C], lb1[C], lb2[C];
    to_host(i1, li1_dev, N * C);
    to_host(i2, li2_dev, N * C);
    to_host(lw1, lw1_dev, C);
    to_host(lw2, lw2_dev, C);
    to_host(lb1, lb1_dev, C);
    to_host(lb2, lb2_dev, C);
    same = memcmp(i1, i2, sizeof(float) * N * C) == 0 && memcmp(lw1, lw2, sizeof(lw1)) == 0 &&
           memcmp(lb1, lb2, sizeof(lb1)) == 0;
    check(same, "layernorm_backward in two halves (dinp; then dw+db, no w) == one call, bitwise",
          "a gradient differs from the one-call result");

    // With every gradient NULL there is no work, so nothing is read: every
    // input may be NULL. (The CPU layernorm ran its dw/db loop regardless
    // before: this crashed.)
    layernorm_backward(NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, N, C);
    matmul_backward(NULL, NULL, NULL, NULL, NULL, NULL, N, C, OC);
    device_synchronize();
    check(1, "layernorm_backward and matmul_backward with no gradient wanted read nothing", "");
    free(inp); free(w); free(b); free(dout); free(pre_i); free(pre_w); free(pre_b);
    free(i1); free(i2); free(w1); free(w2); free(ln_w); free(ln_b); free(ln_dout);
    dev_free_all();
}

// MPI and the device are started as in the chapters: the CUDA backend's
// device_init needs MPI (every rank must agree that a GPU was found).

// ================================================================ mixture of experts
// Router: softmax, top-k (ties to the lower expert), gates renormalised;
// backward through the gates and a per-expert term (the auxiliary loss's)
// against central differences of the double-precision objective
//   sum_n sum_j r[n,j] gates[n,j] + sum_e w[e] sum_n probs[n,e]
// with the experts chosen by the forward held fixed (top-k is piecewise
// constant). w = E f_e / N makes the second term the load-balancing loss
// E sum_e f_e P_e, so its gradient is checked by the same differences.
typedef struct {
    const double* logits;
    const double *r, *w;
    const int* idx;
    int N, E, k;
} router_ctx;

static void router_ref(double* probs, double* gates, const double* logits, const int* idx, int N, int E, int k) {
    for (int n = 0; n < N; n++) {
        double mx = -INFINITY, sum = 0.0;
        for (int e = 0; e < E; e++) mx = fmax(mx, logits[n * E + e]);
        for (int e = 0; e < E; e++) sum += probs[n * E + e] = exp(logits[n * E + e] - mx);
        for (int e = 0; e < E; e++) probs[n * E + e] /= sum;
        double s = 0.0;
        for (int j = 0; j < k; j++) s += probs[n * E + idx[n * k + j]];
        for (int j = 0; j < k; j++) gates[n * k + j] = probs[n * E + idx[n * k + j]] / s;
    }
}

static double router_objective(void* p) {
    router_ctx* c = p;
    double probs[64 * 8], gates[64 * 8], o = 0.0;
    router_ref(probs, gates, c->logits, c->idx, c->N, c->E, c->k);
    for (int i = 0; i < c->N * c->k; i++) o += c->r[i] * gates[i];
    for (int n = 0; n < c->N; n++)
        for (int e = 0; e < c->E; e++) o += c->w[e] * probs[n * c->E + e];
    return o;
}

static void test_moe_router(void) {
    enum { N = 13, E = 5, K = 2 };
    float logits[N * E], probs[N * E], gates[N * K], r[N * K], w[E];
    int idx[N * K];
    fill(logits, N * E, 2.0);
    // row 0 all equal: every prob ties, the top-2 are experts 0 and 1;
    // row 1 ties experts 3 and 1 for the best: 1 first, then 3
    for (int e = 0; e < E; e++) logits[e] = 0.5f;
    logits[E + 0] = 0.1f, logits[E + 1] = 1.5f, logits[E + 2] = -1.0f, logits[E + 3] = 1.5f, logits[E + 4] = 0.0f;
    fill(r, N * K, 1.0);
    float* l_dev = dev_copy(logits, N * E);
    float* p_dev = dev_zeros(N * E);
    float* g_dev = dev_zeros(N * K);
    int* i_dev = (int*)dev_alloc(N * K * sizeof(int));
    moe_router_forward(p_dev, i_dev, g_dev, l_dev, N, E, K);
    to_host(probs, p_dev, N * E);
    to_host(gates, g_dev, N * K);
    mem_to_host(idx, i_dev, sizeof(idx));
    // the reference top-k: largest first, the lower index on a tie
    int ok = 1;
    double logits_d[N * E], probs_d[N * E], gates_d[N * K];
    to_double(logits_d, logits, N * E);
    for (int n = 0; n < N; n++)
        for (int j = 0; j < K; j++) {
            int best = -1;
            for (int e = 0; e < E; e++) {
                int taken = 0;
                for (int i = 0; i < j; i++) taken |= idx[n * K + i] == e;
                if (!taken && (best < 0 || logits[n * E + e] > logits[n * E + best])) best = e;
            }
            ok &= idx[n * K + j] == best;
        }
    ok &= idx[0] == 0 && idx[1] == 1 && idx[K] == 1 && idx[K + 1] == 3;
    check(ok, "moe_router_forward top-k, ties to the lower expert", "wrong experts chosen");
    router_ref(probs_d, gates_d, logits_d, idx, N, E, K);
    check_err("moe_router_forward probs", rel_err(probs, probs_d, N * E), FWD_TOL);
    check_err("moe_router_forward gates", rel_err(gates, gates_d, N * K), FWD_TOL);
    // the auxiliary loss's weights: E f_e / N from the forward's counts
    double f[E] = {0}, r_d[N * K], w_d[E];
    for (int i = 0; i < N * K; i++) f[idx[i]] += 1.0 / (N * K);
    for (int e = 0; e < E; e++) w[e] = (float)(E * f[e] / N);
    to_double(r_d, r, N * K);
    to_double(w_d, w, E);
    float dl[N * E];
    double g[N * E];
    float* dl_dev = dev_zeros(N * E);
    float* r_dev = dev_copy(r, N * K);
    float* w_dev = dev_copy(w, E);
    // the gates alone
    moe_router_backward(dl_dev, r_dev, NULL, p_dev, i_dev, g_dev, N, E, K);
    to_host(dl, dl_dev, N * E);
    double no_w[E] = {0};
    router_ctx ctx = {logits_d, r_d, no_w, idx, N, E, K};
    fd_gradient(router_objective, &ctx, logits_d, N * E, g);
    check_err("moe_router_backward dlogits (gates) vs FD", rel_err(dl, g, N * E), BWD_TOL);
    // the auxiliary loss alone
    double zr[N * K] = {0};
    ctx.r = zr, ctx.w = w_d;
    fd_gradient(router_objective, &ctx, logits_d, N * E, g);
    float* dl2_dev = dev_zeros(N * E);
    moe_router_backward(dl2_dev, NULL, w_dev, p_dev, i_dev, g_dev, N, E, K);
    to_host(dl, dl2_dev, N * E);
    check_err("moe_router_backward dlogits (auxiliary loss) vs FD", rel_err(dl, g, N * E), BWD_TOL);
    // both, accumulated onto what was there
    float base[N * E], acc[N * E], both[N * E];
    ctx.r = r_d;
    fd_gradient(router_objective, &ctx, logits_d, N * E, g);
    fill(base, N * E, 1.0);
    float* acc_dev = dev_copy(base, N * E);
    moe_router_backward(acc_dev, r_dev, w_dev, p_dev, i_dev, g_dev, N, E, K);
    to_host(acc, acc_dev, N * E);
    for (int i = 0; i < N * E; i++) both[i] = acc[i] - base[i];
    check_err("moe_router_backward dlogits (both) vs FD", rel_err(both, g, N * E), BWD_TOL);
    dev_free_all();
}

// Dispatch and combine: token rows gathered into expert order and back.
// Loads are skewed (most slots to expert 0) and expert 2 of 4 gets nothing.
typedef struct {
    const double *rows, *gates, *r;
    const int* pos;
    int N, k, C;
} combine_ctx;

static double combine_objective(void* p) {
    combine_ctx* c = p;
    double o = 0.0;
    for (int t = 0; t < c->N; t++)
        for (int j = 0; j < c->k; j++) {
            int row = c->pos[t * c->k + j];
            if (row < 0) continue;
            for (int ch = 0; ch < c->C; ch++) o += c->r[t * c->C + ch] * c->gates[t * c->k + j] * c->rows[row * c->C + ch];
        }
    return o;
}

static void test_moe_dispatch_combine(void) {
    enum { N = 11, K = 2, C = 7, E = 4 };
    int idx[N * K], pos[N * K], src[N * K], cnt[E] = {0}, fill_at[E];
    for (int t = 0; t < N; t++) {
        idx[t * K] = 0;                  // every token to expert 0
        idx[t * K + 1] = t % 3 ? 1 : 3;  // then 1 or 3; never 2
    }
    for (int i = 0; i < N * K; i++) cnt[idx[i]]++;
    fill_at[0] = 0;
    for (int e = 1; e < E; e++) fill_at[e] = fill_at[e - 1] + cnt[e - 1];
    for (int i = 0; i < N * K; i++) {
        pos[i] = fill_at[idx[i]]++;
        src[pos[i]] = i / K;
    }
    pos[3 * K + 1] = -1;  // token 3's second slot dropped (capacity)
    float x[N * C], sent[N * K * C], gates[N * K], back[N * C];
    fill(x, N * C, 1.0);
    for (int t = 0; t < N; t++) gates[t * K] = 0.25f, gates[t * K + 1] = 0.75f;
    gates[3 * K] = 1.0f;  // its kept slot carries it whole
    float* x_dev = dev_copy(x, N * C);
    float* s_dev = dev_zeros(N * K * C);
    int* src_dev = dev_copy_int(src, N * K);
    int* pos_dev = dev_copy_int(pos, N * K);
    float* g_dev = dev_copy(gates, N * K);
    moe_gather_forward(s_dev, x_dev, src_dev, N * K, C);
    to_host(sent, s_dev, N * K * C);
    int ok = 1;
    for (int i = 0; i < N * K; i++) ok &= !memcmp(sent + i * C, x + src[i] * C, C * sizeof(float));
    check(ok, "moe_gather_forward copies every token row to its experts' rows", "a row differs");
    ok = cnt[2] == 0 && cnt[0] == N;
    check(ok, "moe dispatch: skewed load, an empty expert", "counts %d %d %d %d", cnt[0], cnt[1], cnt[2], cnt[3]);
    // identity experts: combining the rows with gates that sum to 1 gives every token back
    float* b_dev = dev_zeros(N * C);
    moe_combine_forward(b_dev, s_dev, g_dev, pos_dev, N, K, C);
    to_host(back, b_dev, N * C);
    double x_d[N * C];
    to_double(x_d, x, N * C);
    check_err("moe_combine_forward round trip returns every token", rel_err(back, x_d, N * C), FWD_TOL);
    // the gather's backward: every token gets the sum of its kept rows
    float ones[N * K * C], dx[N * C];
    double want[N * C];
    for (int i = 0; i < N * K * C; i++) ones[i] = 1.0f;
    float* o_dev = dev_copy(ones, N * K * C);
    float* dx_dev = dev_zeros(N * C);
    moe_gather_backward(dx_dev, o_dev, pos_dev, N, K, C);
    to_host(dx, dx_dev, N * C);
    for (int t = 0; t < N; t++)
        for (int ch = 0; ch < C; ch++) want[t * C + ch] = t == 3 ? 1.0 : 2.0;
    check_err("moe_gather_backward sums each token's kept rows", rel_err(dx, want, N * C), FWD_TOL);
    // combine backward against central differences, rows and gates
    float r[N * C], drows[N * K * C], dgates[N * K];
    fill(r, N * C, 1.0);
    double rows_d[N * K * C], gates_d[N * K], r_d[N * C], grow[N * K * C], ggate[N * K];
    to_double(rows_d, sent, N * K * C);
    to_double(gates_d, gates, N * K);
    to_double(r_d, r, N * C);
    combine_ctx cc = {rows_d, gates_d, r_d, pos, N, K, C};
    fd_gradient(combine_objective, &cc, rows_d, N * K * C, grow);
    fd_gradient(combine_objective, &cc, gates_d, N * K, ggate);
    float* r_dev = dev_copy(r, N * C);
    float* dr_dev = dev_zeros(N * K * C);
    float* dg_dev = dev_zeros(N * K);
    moe_combine_backward(dr_dev, dg_dev, r_dev, s_dev, g_dev, pos_dev, N, K, C);
    to_host(drows, dr_dev, N * K * C);
    to_host(dgates, dg_dev, N * K);
    // the dropped slot's gate gets no gradient: FD agrees (it adds nothing)
    check_err("moe_combine_backward drows vs FD", rel_err(drows, grow, N * K * C), BWD_TOL);
    check_err("moe_combine_backward dgates vs FD", rel_err(dgates, ggate, N * K), BWD_TOL);
    dev_free_all();
}

int main(int argc, char** argv) {
    runtime_init(&argc, &argv);
    verbose = argc > 1 && strcmp(argv[1], "-v") == 0;
    const char* device = device_init(0);
    if (verbose) printf("# device: %s\n", device);
    test_encoder();
    test_encoder_vocab();
    test_layernorm();
    test_matmul();
    test_attention();
    test_gelu();
    test_residual();
    test_crossentropy();
    test_crossentropy_shards();
    test_adamw();
    test_grad_norm();
    test_utilities();
    test_null_gradients();
    test_wide_rows();
    test_attention_chunks();
    test_backward_halves();
    test_moe_router();
    test_moe_dispatch_combine();
    int rc = test_exit_code();
    runtime_finalize();
    return rc;
}
