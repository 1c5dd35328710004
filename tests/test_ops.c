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

#include "device.h"
#include "memory.h"
#include "device_clock.h"
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
    for (size_t i = 0; i < n; i++) m = err_max(m, fabs(x[i]));
    return m;
}

// max |a - b|; a NaN anywhere makes the result NaN, which fails every bound
// (fmax would silently drop it).
static double max_abs_diff(const float* a, const double* b, size_t n) {
    double m = 0.0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        if (isnan(d)) return NAN;
        m = err_max(m, d);
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
        m = err_max(m, d);
        s = err_max(s, fabs((double)b[i]));
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
        m = err_max(m, d);
        s = err_max(s, fabs(want));
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

// ---------------------------------------------------------------- buffers
// Every buffer a test allocates, on the device (host memory on the CPU
// backend, category "other") or on the host, is kept here and freed at the
// test's end by case_end().
#define MAX_BUFS 384
static struct {
    void* p;
    int on_device;
} bufs[MAX_BUFS];
static int num_bufs = 0;

static void* keep(void* p, int on_device) {
    if (num_bufs == MAX_BUFS) {
        fprintf(stderr, "test_ops: more than %d buffers in one test\n", MAX_BUFS);
        exit(1);
    }
    bufs[num_bufs].p = p;
    bufs[num_bufs].on_device = on_device;
    num_bufs++;
    return p;
}

// Zeroed device memory, and zeroed host memory.
static void* dev_alloc(size_t bytes) { return keep(mem_alloc(bytes, MEM_OTHER), 1); }
static void* host_alloc(size_t bytes) { return keep(xcalloc(1, bytes), 0); }

static void case_end(void) {
    for (int i = 0; i < num_bufs; i++) {
        if (bufs[i].on_device) mem_free(bufs[i].p);
        else free(bufs[i].p);
    }
    num_bufs = 0;
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


// ---------------------------------------------------------------- the case helper
// Every case of an op makes the same moves: random inputs on the host, their
// double copies for the reference and their device copies for the op; the
// op's outputs come back to the host and meet the reference; each gradient
// of a backward meets central differences of the reference; a second backward
// onto prefilled gradient buffers must add to them. A Buf is one tensor on
// all three sides; case_end() frees it with the test's other buffers.
typedef struct {
    size_t n;
    float* h;      // (n) fp32 on the host: an input's values, an output's once fetched
    double* d;     // (n) the reference's: an input's copy, which finite differences
                   // perturb, or the reference's output
    float* dev;    // (n) on the device
    float* first;  // a gradient's result before buf_prefill
    float* pre;    // what buf_prefill filled the gradient buffer with
} Buf;

// n zeros on all three sides: an output, or a gradient for a backward to
// accumulate into.
static Buf buf_zeros(size_t n) {
    Buf b = {n, host_alloc(n * sizeof(float)), host_alloc(n * sizeof(double)), dev_zeros(n), NULL, NULL};
    return b;
}

// After the caller wrote b->h: the double copy and the device copy follow.
static void buf_upload(Buf* b) {
    to_double(b->d, b->h, b->n);
    to_device(b->dev, b->h, b->n);
}

// n values uniform in [-scale, scale), on all three sides.
static Buf buf_random(size_t n, double scale) {
    Buf b = buf_zeros(n);
    fill(b.h, n, scale);
    buf_upload(&b);
    return b;
}

// The device values into b->h, which it returns.
static float* buf_fetch(Buf* b) {
    to_host(b->h, b->dev, b->n);
    return b->h;
}

// A forward's output (fetched) against the reference's, which the caller
// wrote into out->d.
static void check_forward(const char* name, Buf* out) {
    check_err(name, rel_err(buf_fetch(out), out->d, out->n), FWD_TOL);
}

// A backward's gradient (fetched) against central differences of f with
// respect to every element of wrt's double copy.
static void check_backward(const char* name, Buf* grad, objective_fn f, void* ctx, Buf* wrt) {
    if (grad->n != wrt->n) {
        fprintf(stderr, "test_ops: %s: a gradient of %zu values for an input of %zu\n", name, grad->n, wrt->n);
        exit(1);
    }
    double* g = host_alloc(wrt->n * sizeof(double));
    fd_gradient(f, ctx, wrt->d, wrt->n, g);
    check_err(name, rel_err(buf_fetch(grad), g, grad->n), BWD_TOL);
}

// Before a second backward onto the same gradient buffer: keeps its result
// G and fills it with random values P. The second backward must leave P + G
// (buf_accum_err).
static void buf_prefill(Buf* g) {
    g->first = host_alloc(g->n * sizeof(float));
    g->pre = host_alloc(g->n * sizeof(float));
    to_host(g->first, g->dev, g->n);
    fill(g->pre, g->n, 1.0);
    to_device(g->dev, g->pre, g->n);
}

// A new Buf holding src's device values.
static Buf buf_copy_of(Buf* src) {
    Buf b = buf_zeros(src->n);
    memcpy(b.h, buf_fetch(src), src->n * sizeof(float));
    buf_upload(&b);
    return b;
}

static double buf_accum_err(Buf* g) { return accum_err(buf_fetch(g), g->pre, g->first, g->n); }

static void check_accumulates(const char* name, Buf* g) { check_err(name, buf_accum_err(g), ACC_TOL); }


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
    Buf wte = buf_random(V * C, 1.0), wpe = buf_random(TMAX * C, 1.0), r = buf_random(N * C, 1.0);
    Buf out = buf_zeros(N * C);
    int* tokens_dev = dev_copy_int(tokens, N);

    // A chunk starting at position 0, then one starting at OFF (context
    // parallelism passes wpe + t0*C).
    for (int off = 0; off <= OFF; off += OFF) {
        char name[128];
        encoder_forward(out.dev, tokens_dev, wte.dev, wpe.dev + off * C, B, T, C);
        encoder_ref(out.d, tokens, wte.d, wpe.d + off * C, B, T, C);
        snprintf(name, sizeof name, "encoder_forward out (wpe offset %d)", off);
        check_forward(name, &out);

        // The whole dwpe buffer is compared, so rows outside the chunk must
        // stay zero (their FD gradient is exactly 0).
        Buf dwte = buf_zeros(V * C), dwpe = buf_zeros(TMAX * C);
        encoder_backward(dwte.dev, dwpe.dev + off * C, r.dev, tokens_dev, B, T, C);
        encoder_ctx ctx = {tokens, wte.d, wpe.d + off * C, r.d, out.d, B, T, C};
        snprintf(name, sizeof name, "encoder_backward dwte vs FD (wpe offset %d)", off);
        check_backward(name, &dwte, encoder_objective, &ctx, &wte);
        snprintf(name, sizeof name, "encoder_backward dwpe vs FD (wpe offset %d)", off);
        check_backward(name, &dwpe, encoder_objective, &ctx, &wpe);

        // Accumulate: prefilled buffers get the same gradient added.
        buf_prefill(&dwte);
        buf_prefill(&dwpe);
        encoder_backward(dwte.dev, dwpe.dev + off * C, r.dev, tokens_dev, B, T, C);
        snprintf(name, sizeof name, "encoder_backward accumulates (wpe offset %d)", off);
        check_err(name, err_max(buf_accum_err(&dwte), buf_accum_err(&dwpe)), ACC_TOL);
    }
    case_end();
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
    Buf wte = buf_random(V * C, 1.0), wpe = buf_random(T * C, 1.0), r = buf_random(N * C, 1.0);
    int* tokens_dev = dev_copy_int(tokens, N);
    // the full op
    Buf full = buf_zeros(N * C), dwte = buf_zeros(V * C), dwpe = buf_zeros(T * C);
    encoder_forward(full.dev, tokens_dev, wte.dev, wpe.dev, B, T, C);
    encoder_backward(dwte.dev, dwpe.dev, r.dev, tokens_dev, B, T, C);
    buf_fetch(&full);
    buf_fetch(&dwte);
    buf_fetch(&dwpe);
    // the shards: forward outputs summed with ops_add (the all-reduce's sum)
    Buf sum = buf_zeros(N * C), part = buf_zeros(N * C), shard_dwte = buf_zeros(V * C);
    int zero_rows_ok = 1;
    double dwpe_err = 0.0;
    for (int k = 0; k < S; k++) {
        encoder_forward_vocab(part.dev, tokens_dev, wte.dev + v0s[k] * C, k == 0 ? wpe.dev : NULL, B, T, C,
                              v0s[k], rows[k]);
        buf_fetch(&part);
        // a token this shard does not hold contributes exactly zero (shards
        // other than the first add no wpe)
        for (int n = 0; n < N; n++) {
            int held = tokens[n] >= v0s[k] && tokens[n] < v0s[k] + rows[k];
            for (int c = 0; c < C && k > 0; c++)
                zero_rows_ok &= held ? part.h[n * C + c] == wte.h[tokens[n] * C + c] : part.h[n * C + c] == 0.0f;
        }
        ops_add(sum.dev, part.dev, N * C);
        Buf dw = buf_zeros(rows[k] * C), dp = buf_zeros(T * C);
        encoder_backward_vocab(dw.dev, dp.dev, r.dev, tokens_dev, B, T, C, v0s[k], rows[k]);
        memcpy(shard_dwte.h + v0s[k] * C, buf_fetch(&dw), rows[k] * C * sizeof(float));
        dwpe_err = err_max(dwpe_err, rel_err_ff(buf_fetch(&dp), dwpe.h, T * C));
    }
    check(zero_rows_ok, "encoder_forward_vocab: held tokens give their row, others exactly 0",
          "a shard wrote a row it does not hold");
    check_err("encoder_forward_vocab summed over 3 uneven shards equals encoder_forward",
              rel_err_ff(buf_fetch(&sum), full.h, N * C), FWD_TOL);
    check_err("encoder_backward_vocab shards' dwte equal encoder_backward's rows",
              rel_err_ff(shard_dwte.h, dwte.h, V * C), FWD_TOL);
    check_err("encoder_backward_vocab dwpe on every shard equals encoder_backward's", dwpe_err, FWD_TOL);
    // accumulates (onto random values, the shard of rows 3..5), and a NULL
    // gradient is skipped
    Buf acc = buf_zeros(3 * C);
    buf_prefill(&acc);
    encoder_backward_vocab(acc.dev, NULL, r.dev, tokens_dev, B, T, C, 3, 3);
    check_err("encoder_backward_vocab accumulates (dwpe NULL)",
              accum_err(buf_fetch(&acc), acc.pre, shard_dwte.h + 3 * C, 3 * C), ACC_TOL);
    case_end();
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
    Buf inp = buf_random(N * C, 1.0);
    // Give rows different means and spreads so mean and rstd both matter.
    for (int n = 0; n < N; n++)
        for (int c = 0; c < C; c++) inp.h[n * C + c] = inp.h[n * C + c] * (float)(0.5 + n) + 0.3f * (float)n;
    buf_upload(&inp);
    Buf w = buf_random(C, 1.0), b = buf_random(C, 1.0), r = buf_random(N * C, 1.0);
    Buf out = buf_zeros(N * C), mean = buf_zeros(N), rstd = buf_zeros(N);

    layernorm_forward(out.dev, mean.dev, rstd.dev, inp.dev, w.dev, b.dev, N, C);
    layernorm_ref(out.d, mean.d, rstd.d, inp.d, w.d, b.d, N, C);
    check_forward("layernorm_forward out", &out);
    // mean is compared against the scale of the inputs (a row mean can be ~0).
    check_err("layernorm_forward mean", max_abs_diff(buf_fetch(&mean), mean.d, N) / max_abs(inp.d, N * C),
              FWD_TOL);
    check_forward("layernorm_forward rstd", &rstd);

    Buf dinp = buf_zeros(N * C), dw = buf_zeros(C), db = buf_zeros(C);
    layernorm_backward(dinp.dev, dw.dev, db.dev, r.dev, inp.dev, w.dev, mean.dev, rstd.dev, N, C);
    layernorm_ctx ctx = {inp.d, w.d, b.d, r.d, out.d, N, C};
    check_backward("layernorm_backward dinp vs FD", &dinp, layernorm_objective, &ctx, &inp);
    check_backward("layernorm_backward dw vs FD", &dw, layernorm_objective, &ctx, &w);
    check_backward("layernorm_backward db vs FD", &db, layernorm_objective, &ctx, &b);

    // Accumulate into all three prefilled buffers.
    buf_prefill(&dinp);
    buf_prefill(&dw);
    buf_prefill(&db);
    layernorm_backward(dinp.dev, dw.dev, db.dev, r.dev, inp.dev, w.dev, mean.dev, rstd.dev, N, C);
    check_accumulates("layernorm_backward dinp accumulates", &dinp);
    check_accumulates("layernorm_backward dw accumulates", &dw);
    check_accumulates("layernorm_backward db accumulates", &db);
    case_end();
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
    Buf inp = buf_random(N * C, 1.0), w = buf_random(OC * C, 1.0), bias = buf_random(OC, 1.0),
        r = buf_random(N * OC, 1.0), out = buf_zeros(N * OC);

    matmul_forward(out.dev, inp.dev, w.dev, bias.dev, N, C, OC);
    matmul_ref(out.d, inp.d, w.d, bias.d, N, C, OC);
    check_forward("matmul_forward out (bias)", &out);
    // Prefill out with garbage: forward writes, and a NULL bias adds nothing.
    for (int i = 0; i < N * OC; i++) out.h[i] = 99.0f;
    to_device(out.dev, out.h, N * OC);
    matmul_forward(out.dev, inp.dev, w.dev, NULL, N, C, OC);
    matmul_ref(out.d, inp.d, w.d, NULL, N, C, OC);
    check_forward("matmul_forward out (bias NULL)", &out);

    // The backward does not depend on whether the forward had a bias; dbias is
    // the gradient w.r.t. a bias, so the FD runs with one.
    Buf dinp = buf_zeros(N * C), dw = buf_zeros(OC * C), dbias = buf_zeros(OC);
    matmul_backward(dinp.dev, dw.dev, dbias.dev, r.dev, inp.dev, w.dev, N, C, OC);
    matmul_ctx ctx = {inp.d, w.d, bias.d, r.d, out.d, N, C, OC};
    check_backward("matmul_backward dinp vs FD", &dinp, matmul_objective, &ctx, &inp);
    check_backward("matmul_backward dw vs FD", &dw, matmul_objective, &ctx, &w);
    check_backward("matmul_backward dbias vs FD", &dbias, matmul_objective, &ctx, &bias);

    // Accumulate into prefilled buffers.
    buf_prefill(&dinp);
    buf_prefill(&dw);
    buf_prefill(&dbias);
    matmul_backward(dinp.dev, dw.dev, dbias.dev, r.dev, inp.dev, w.dev, N, C, OC);
    check_accumulates("matmul_backward dinp accumulates", &dinp);
    check_accumulates("matmul_backward dw accumulates", &dw);
    check_accumulates("matmul_backward dbias accumulates", &dbias);

    // NULL dinp and dbias (the first layer needs no dinp; a bias-free layer
    // has no dbias): dw is still right and nothing crashes.
    Buf dw2 = buf_zeros(OC * C);
    matmul_backward(NULL, dw2.dev, NULL, r.dev, inp.dev, w.dev, N, C, OC);
    check_backward("matmul_backward dinp=NULL dbias=NULL, dw vs FD", &dw2, matmul_objective, &ctx, &w);
    Buf dinp3 = buf_zeros(N * C), dw3 = buf_zeros(OC * C);
    matmul_backward(dinp3.dev, dw3.dev, NULL, r.dev, inp.dev, w.dev, N, C, OC);
    double* g_inp = host_alloc(N * C * sizeof(double));
    double* g_w = host_alloc(OC * C * sizeof(double));
    fd_gradient(matmul_objective, &ctx, inp.d, N * C, g_inp);
    fd_gradient(matmul_objective, &ctx, w.d, OC * C, g_w);
    check_err("matmul_backward dbias=NULL, dinp and dw vs FD",
              err_max(rel_err(buf_fetch(&dinp3), g_inp, N * C), rel_err(buf_fetch(&dw3), g_w, OC * C)), BWD_TOL);
    case_end();
}

// The row-by-row matmul (ops.h): the same math as matmul_forward and
// matmul_backward's dinp, against the same reference, on sizes that leave
// edge tiles in both directions (5 rows of 4, 19 and 3 columns of 16).
static void test_matmul_rowwise(void) {
    enum { N = 5, C = 19, OC = 3 };
    Buf inp = buf_random(N * C, 1.0), w = buf_random(OC * C, 1.0), bias = buf_random(OC, 1.0),
        r = buf_random(N * OC, 1.0), out = buf_zeros(N * OC);
    for (int i = 0; i < N * OC; i++) out.h[i] = 99.0f;  // forward writes
    to_device(out.dev, out.h, N * OC);
    matmul_forward_rowwise(out.dev, inp.dev, w.dev, bias.dev, N, C, OC);
    matmul_ref(out.d, inp.d, w.d, bias.d, N, C, OC);
    check_forward("matmul_forward_rowwise out (bias)", &out);
    matmul_forward_rowwise(out.dev, inp.dev, w.dev, NULL, N, C, OC);
    matmul_ref(out.d, inp.d, w.d, NULL, N, C, OC);
    check_forward("matmul_forward_rowwise out (bias NULL)", &out);
    Buf dinp = buf_zeros(N * C);
    matmul_backward_input_rowwise(dinp.dev, r.dev, w.dev, N, C, OC);
    matmul_ctx ctx = {inp.d, w.d, bias.d, r.d, out.d, N, C, OC};
    check_backward("matmul_backward_input_rowwise dinp vs FD", &dinp, matmul_objective, &ctx, &inp);
    buf_prefill(&dinp);
    matmul_backward_input_rowwise(dinp.dev, r.dev, w.dev, N, C, OC);
    check_accumulates("matmul_backward_input_rowwise dinp accumulates", &dinp);
    case_end();
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
                    mx = err_max(mx, a[t2]);
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
    // Scale 1.5 makes the softmax clearly non-uniform.
    Buf qkv = buf_random(QKV, 1.5), r = buf_random(B * T * C, 1.0);
    Buf out = buf_zeros(B * T * C), att = buf_zeros(ATT);

    attention_forward(out.dev, att.dev, qkv.dev, B, T, C, NH);
    attention_ref(out.d, att.d, qkv.d, B, T, C, NH);
    check_forward("attention_forward out", &out);
    // Only the causal part (t2 <= t) of att is defined; probabilities are <= 1.
    buf_fetch(&att);
    double e = 0.0;
    for (int bh = 0; bh < B * NH; bh++)
        for (int t = 0; t < T; t++)
            e = err_max(e, max_abs_diff(att.h + (bh * T + t) * T, att.d + (bh * T + t) * T, (size_t)t + 1));
    check_err("attention_forward att (causal part)", e, FWD_TOL);

    Buf dqkv = buf_zeros(QKV), datt = buf_zeros(ATT);
    attention_backward(dqkv.dev, datt.dev, r.dev, qkv.dev, att.dev, B, T, C, NH);
    attention_ctx ctx = {qkv.d, r.d, out.d, att.d, B, T, C, NH};
    check_backward("attention_backward dqkv vs FD", &dqkv, attention_objective, &ctx, &qkv);

    // Accumulate into a prefilled dqkv.
    buf_prefill(&dqkv);
    mem_zero(datt.dev, ATT * sizeof(float));
    attention_backward(dqkv.dev, datt.dev, r.dev, qkv.dev, att.dev, B, T, C, NH);
    check_accumulates("attention_backward dqkv accumulates", &dqkv);

    // datt is scratch: whatever it holds on entry must not change dqkv.
    Buf d2 = buf_zeros(QKV);
    for (int i = 0; i < ATT; i++) datt.h[i] = 7.0f;
    to_device(datt.dev, datt.h, ATT);
    attention_backward(d2.dev, datt.dev, r.dev, qkv.dev, att.dev, B, T, C, NH);
    check_err("attention_backward ignores datt contents (scratch)", rel_err_ff(buf_fetch(&d2), dqkv.first, QKV),
              ACC_TOL);
    case_end();
}

// ================================================================ attention in O(T) memory
// attention_flash_forward and _backward against a float64 evaluation of the
// same math: per (b, head, query t) the scaled scores s_j = q.k_j / sqrt(hs)
// over keys j <= t, lse = log sum_j e^(s_j), p_j = e^(s_j - lse),
// out = sum_j p_j v_j; backward from the definition, with D = dout . out,
// dv_j += p_j dout, ds_j = p_j (dout . v_j - D), dq += ds_j k_j / sqrt(hs),
// dk_j += ds_j q / sqrt(hs). Sizes cross the kernel's blocks of 64 keys
// and 64 queries (63, 64, 65, 130, 200 positions), the smallest sequence
// (T = 1), heads of 4 to 64 values (64: the CPU's vector tiles; smaller:
// its edge tiles), several B and NH.
//
// Bounds. out, lse: max|fp32 - double| / max|double| <= FWD_TOL (1e-5). The
// fp32 kernel adds at most 200 products of size ~1 per score and 200
// weighted values per output; the rounding of such sums is a few units of
// 6e-8 times sqrt(terms), and exp_lanes adds 1.4 units (measured on the CPU
// backend: <= 2.3e-7 for out at scale 1.5). The gradients (dq, dk, dv each
// on its own scale) use the same bound: each is one more chain of such sums
// (measured: <= 5.3e-7). The large-score case (inputs of scale 6, scores up
// to ~40) is the tightest: a score's rounding, ~|s| 6e-8, becomes a relative
// error of that size in e^s (measured: 3.2e-6 for out, 3.6e-6 for dq, a
// margin of 3). A block's key or query left out, a mask one key off or a
// wrong rescale is off by 1e-2 or more. Against attention_forward/_backward
// (fp32 against fp32, two roundings): 2 x FWD_TOL.
static void attention_lse_ref(double* lse, const double* qkv, int B, int T, int C, int NH) {
    int hs = C / NH;
    double scale = 1.0 / sqrt((double)hs);
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int h = 0; h < NH; h++) {
                const double* q = qkv + ((size_t)b * T + t) * 3 * C + h * hs;
                double mx = -INFINITY, s[1024];
                for (int j = 0; j <= t; j++) {
                    const double* k = qkv + ((size_t)b * T + j) * 3 * C + C + h * hs;
                    s[j] = dot_d(q, k, (size_t)hs) * scale;
                    mx = err_max(mx, s[j]);
                }
                double sum = 0.0;
                for (int j = 0; j <= t; j++) sum += exp(s[j] - mx);
                lse[((size_t)b * T + t) * NH + h] = mx + log(sum);
            }
}

// dqkv (B, T, 3C) = the gradient of sum(out * dout), from the definition
// (written, not accumulated). out from attention_ref.
static void attention_grad_ref(double* dqkv, const double* dout, const double* qkv, const double* out,
                               int B, int T, int C, int NH) {
    int hs = C / NH;
    double scale = 1.0 / sqrt((double)hs);
    memset(dqkv, 0, (size_t)B * T * 3 * C * sizeof(double));
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int h = 0; h < NH; h++) {
                size_t row = ((size_t)b * T + t);
                const double* q = qkv + row * 3 * C + h * hs;
                const double* d = dout + row * C + h * hs;
                double D = dot_d(d, out + row * C + h * hs, (size_t)hs);
                double mx = -INFINITY, p[1024];
                for (int j = 0; j <= t; j++) {
                    p[j] = dot_d(q, qkv + ((size_t)b * T + j) * 3 * C + C + h * hs, (size_t)hs) * scale;
                    mx = err_max(mx, p[j]);
                }
                double sum = 0.0;
                for (int j = 0; j <= t; j++) sum += (p[j] = exp(p[j] - mx));
                for (int j = 0; j <= t; j++) {
                    size_t krow = ((size_t)b * T + j) * 3 * C;
                    const double* k = qkv + krow + C + h * hs;
                    const double* v = qkv + krow + 2 * C + h * hs;
                    double pj = p[j] / sum;
                    double ds = pj * (dot_d(d, v, (size_t)hs) - D);
                    for (int c = 0; c < hs; c++) {
                        dqkv[row * 3 * C + h * hs + c] += ds * k[c] * scale;
                        dqkv[krow + C + h * hs + c] += ds * q[c] * scale;
                        dqkv[krow + 2 * C + h * hs + c] += pj * d[c];
                    }
                }
            }
}

// The error of one part (q, k or v: part 0, 1, 2) of a (B*T, 3C) gradient,
// relative to the larger of that part's own scale and the whole gradient's.
// (At T = 1 a row's only probability is 1 and dq, dk are 0 in exact
// arithmetic: dout . v - D cancels two equal terms, and the fp32 result is
// their rounding, a few 1e-8 against a dv of size 1.)
static double qkv_part_err(const float* got, const double* want, size_t rows, int C, int part) {
    double m = 0.0, s = 0.0;
    for (size_t r = 0; r < rows; r++)
        for (int c = 0; c < C; c++) {
            size_t i = r * 3 * C + (size_t)part * C + c;
            double d = fabs((double)got[i] - want[i]);
            if (isnan(d)) return NAN;
            m = err_max(m, d);
            s = err_max(s, fabs(want[i]));
        }
    return m / (err_max(s, max_abs(want, rows * 3 * C)) + 1e-6);
}

static void flash_case(int B, int T, int C, int NH, double scale, int with_fd) {
    const size_t QKV = (size_t)B * T * 3 * C, OUT = (size_t)B * T * C, LSE = (size_t)B * T * NH;
    char what[96], name[200];
    snprintf(what, sizeof(what), "B %d, T %d, C %d, NH %d (hs %d)%s", B, T, C, NH, C / NH,
             scale > 2.0 ? ", large scores" : "");
    Buf qkv = buf_random(QKV, scale), r = buf_random(OUT, 1.0);
    Buf out = buf_zeros(OUT), lse = buf_zeros(LSE);
    double* att_d = host_alloc((size_t)B * NH * T * T * sizeof(double));
    attention_flash_forward(out.dev, lse.dev, qkv.dev, B, T, C, NH);
    attention_ref(out.d, att_d, qkv.d, B, T, C, NH);
    attention_lse_ref(lse.d, qkv.d, B, T, C, NH);
    snprintf(name, sizeof(name), "attention_flash_forward out vs float64, %s", what);
    check_forward(name, &out);
    snprintf(name, sizeof(name), "attention_flash_forward lse vs float64, %s", what);
    check_forward(name, &lse);

    Buf dqkv = buf_zeros(QKV);
    attention_flash_backward(dqkv.dev, r.dev, qkv.dev, out.dev, lse.dev, B, T, C, NH);
    attention_grad_ref(dqkv.d, r.d, qkv.d, out.d, B, T, C, NH);
    buf_fetch(&dqkv);
    static const char* parts[3] = {"dq", "dk", "dv"};
    for (int p = 0; p < 3; p++) {
        snprintf(name, sizeof(name), "attention_flash_backward %s vs float64, %s", parts[p], what);
        check_err(name, qkv_part_err(dqkv.h, dqkv.d, (size_t)B * T, C, p), FWD_TOL);
    }
    if (with_fd) {
        attention_ctx ctx = {qkv.d, r.d, out.d, att_d, B, T, C, NH};
        snprintf(name, sizeof(name), "attention_flash_backward dqkv vs FD, %s", what);
        check_backward(name, &dqkv, attention_objective, &ctx, &qkv);
    }

    // against today's attention_forward / _backward, fp32 against fp32
    Buf out2 = buf_zeros(OUT), att = buf_zeros((size_t)B * NH * T * T), datt = buf_zeros((size_t)B * NH * T * T);
    Buf dqkv2 = buf_zeros(QKV);
    attention_forward(out2.dev, att.dev, qkv.dev, B, T, C, NH);
    attention_backward(dqkv2.dev, datt.dev, r.dev, qkv.dev, att.dev, B, T, C, NH);
    snprintf(name, sizeof(name), "attention_flash_forward out vs attention_forward, %s", what);
    check_err(name, rel_err_ff(buf_fetch(&out), buf_fetch(&out2), OUT), 2 * FWD_TOL);
    snprintf(name, sizeof(name), "attention_flash_backward dqkv vs attention_backward, %s", what);
    check_err(name, rel_err_ff(dqkv.h, buf_fetch(&dqkv2), QKV), 2 * FWD_TOL);

    // backward accumulates into what dqkv holds
    buf_prefill(&dqkv);
    attention_flash_backward(dqkv.dev, r.dev, qkv.dev, out.dev, lse.dev, B, T, C, NH);
    snprintf(name, sizeof(name), "attention_flash_backward dqkv accumulates, %s", what);
    check_accumulates(name, &dqkv);
    case_end();
}

// Causal masking at a block's edges: keys and values from position t0 on
// are replaced by other values; every row before t0 must keep its out and
// lse bit for bit (it never sees them), and the rows from t0 on must move.
static void flash_mask_case(int T, int t0, int C, int NH) {
    const size_t QKV = (size_t)T * 3 * C, OUT = (size_t)T * C, LSE = (size_t)T * NH;
    Buf qkv = buf_random(QKV, 1.5);
    Buf out = buf_zeros(OUT), lse = buf_zeros(LSE), out2 = buf_zeros(OUT), lse2 = buf_zeros(LSE);
    attention_flash_forward(out.dev, lse.dev, qkv.dev, 1, T, C, NH);
    for (int t = t0; t < T; t++)
        for (int c = C; c < 3 * C; c++) qkv.h[(size_t)t * 3 * C + c] = (float)(3.0 * rng_uniform());
    buf_upload(&qkv);
    attention_flash_forward(out2.dev, lse2.dev, qkv.dev, 1, T, C, NH);
    buf_fetch(&out), buf_fetch(&lse), buf_fetch(&out2), buf_fetch(&lse2);
    int kept = !memcmp(out.h, out2.h, (size_t)t0 * C * sizeof(float)) &&
               !memcmp(lse.h, lse2.h, (size_t)t0 * NH * sizeof(float));
    int moved = memcmp(out.h + (size_t)t0 * C, out2.h + (size_t)t0 * C, (size_t)C * sizeof(float)) != 0;
    char name[200];
    snprintf(name, sizeof(name), "attention_flash_forward is causal at a block edge: keys from %d on changed, rows 0..%d the same bits, row %d moves (T %d)",
             t0, t0 - 1, t0, T);
    check(kept && moved, name, "rows before %d %s, row %d %s", t0, kept ? "kept" : "changed", t0,
          moved ? "moved" : "did not move");
    case_end();
}

// One algorithm at two scales: the chunk ops of context parallelism, given
// the whole sequence as one query chunk and one kv chunk, then finished, are
// the memory-efficient attention. Both backends run the two on one kernel
// (common/cpu/ops_flash.c's tile loop; ops_flash.cu's kernels, which take the chunks'
// positions), so the bits are the same on either.
static void flash_chunk_case(int B, int T, int C, int NH) {
    const size_t QKV = (size_t)B * T * 3 * C, OUT = (size_t)B * T * C, LSE = (size_t)B * T * NH;
    Buf qkv = buf_random(QKV, 1.5), r = buf_random(OUT, 1.0);
    Buf out = buf_zeros(OUT), lse = buf_zeros(LSE), dqkv = buf_zeros(QKV);
    Buf out2 = buf_zeros(OUT), mx = buf_zeros(LSE), se = buf_zeros(LSE), dqkv2 = buf_zeros(QKV);
    attention_flash_forward(out.dev, lse.dev, qkv.dev, B, T, C, NH);
    attention_flash_backward(dqkv.dev, r.dev, qkv.dev, out.dev, lse.dev, B, T, C, NH);
    attention_chunk_forward(out2.dev, mx.dev, se.dev, qkv.dev, 3 * C, qkv.dev + C, qkv.dev + 2 * C, 3 * C, B, T,
                            T, 0, 0, C, NH);
    attention_chunk_finish(out2.dev, mx.dev, mx.dev, se.dev, B, T, C, NH);
    attention_chunk_backward(dqkv2.dev, dqkv2.dev + C, dqkv2.dev + 2 * C, r.dev, out2.dev, mx.dev, qkv.dev, 3 * C,
                             qkv.dev + C, qkv.dev + 2 * C, 3 * C, B, T, T, 0, 0, C, NH);
    buf_fetch(&out), buf_fetch(&lse), buf_fetch(&dqkv), buf_fetch(&out2), buf_fetch(&mx), buf_fetch(&dqkv2);
    char name[200];
    snprintf(name, sizeof(name), "attention_chunk_* on one chunk of the whole sequence = attention_flash_*, the same bits (one kernel), B %d, T %d, C %d, NH %d",
             B, T, C, NH);
    int same = !memcmp(out.h, out2.h, OUT * sizeof(float)) && !memcmp(lse.h, mx.h, LSE * sizeof(float)) &&
               !memcmp(dqkv.h, dqkv2.h, QKV * sizeof(float));
    check(same, name, "out, lse or dqkv differ");
    case_end();
}

static void test_attention_flash(void) {
    flash_case(2, 5, 8, 2, 1.5, 1);     // small enough for finite differences
    flash_case(1, 1, 8, 2, 1.5, 1);     // T = 1: one key, p = 1
    flash_case(3, 63, 24, 2, 1.5, 0);   // one block less a row
    flash_case(1, 64, 64, 1, 1.5, 0);   // exactly one block, hs 64
    flash_case(2, 65, 48, 3, 1.5, 0);   // one row past a block
    flash_case(1, 130, 128, 2, 1.5, 0); // three blocks, the last of 2 rows, hs 64
    flash_case(2, 200, 16, 4, 1.5, 0);  // hs 4
    flash_case(1, 100, 64, 2, 6.0, 0);  // large scores: the online max moves a lot
    flash_mask_case(130, 64, 128, 2);
    flash_mask_case(130, 65, 128, 2);
    flash_mask_case(70, 63, 24, 2);
    flash_chunk_case(2, 130, 128, 2);
    flash_chunk_case(3, 37, 24, 2);
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
    // [-4, 4] covers the linear, curved and saturated parts.
    Buf inp = buf_random(N, 4.0), r = buf_random(N, 1.0), out = buf_zeros(N);
    gelu_forward(out.dev, inp.dev, N);
    for (int i = 0; i < N; i++) out.d[i] = gelu_ref(inp.d[i]);
    check_forward("gelu_forward out", &out);

    Buf dinp = buf_zeros(N);
    gelu_backward(dinp.dev, inp.dev, r.dev, N);
    gelu_ctx ctx = {inp.d, r.d, N};
    check_backward("gelu_backward dinp vs FD", &dinp, gelu_objective, &ctx, &inp);

    buf_prefill(&dinp);
    gelu_backward(dinp.dev, inp.dev, r.dev, N);
    check_accumulates("gelu_backward accumulates", &dinp);
    case_end();
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
    Buf a = buf_random(N, 1.0), b = buf_random(N, 1.0), r = buf_random(N, 1.0), out = buf_zeros(N);
    residual_forward(out.dev, a.dev, b.dev, N);
    for (int i = 0; i < N; i++) out.d[i] = a.d[i] + b.d[i];
    check_forward("residual_forward out", &out);

    Buf da = buf_zeros(N), db = buf_zeros(N);
    residual_backward(da.dev, db.dev, r.dev, N);
    residual_ctx ctx = {a.d, b.d, r.d, N};
    check_backward("residual_backward da vs FD", &da, residual_objective, &ctx, &a);
    check_backward("residual_backward db vs FD", &db, residual_objective, &ctx, &b);

    buf_prefill(&da);
    buf_prefill(&db);
    residual_backward(da.dev, db.dev, r.dev, N);
    check_err("residual_backward accumulates", err_max(buf_accum_err(&da), buf_accum_err(&db)), ACC_TOL);
    case_end();
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
        for (int i = 0; i < nvalid; i++) mx = err_max(mx, l[i]);
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
    Buf logits = buf_random(N * W, 3.0);
    // The padding column holds a huge logit: if it entered the softmax it would
    // dominate rowmax, sumexp and the loss.
    for (int n = 0; n < N; n++) logits.h[n * W + NV] = 50.0f;
    buf_upload(&logits);
    int* targets_dev = dev_copy_int(targets, N);

    Buf rowmax = buf_zeros(N), sumexp = buf_zeros(N), tlogit = buf_zeros(N), losses = buf_zeros(N);
    crossentropy_partials(rowmax.dev, sumexp.dev, tlogit.dev, logits.dev, targets_dev, N, W, NV, 0);
    crossentropy_loss(losses.dev, rowmax.dev, sumexp.dev, tlogit.dev, N);
    crossentropy_ref(losses.d, rowmax.d, sumexp.d, tlogit.d, logits.d, targets, N, W, NV, 0);
    check_forward("crossentropy_partials rowmax", &rowmax);
    check_forward("crossentropy_partials sumexp", &sumexp);
    check_forward("crossentropy_partials tlogit", &tlogit);
    check_forward("crossentropy_loss vs double log-softmax", &losses);

    // Backward into a buffer full of garbage: it must be written, not added to.
    Buf dlogits = buf_zeros(N * W);
    for (int i = 0; i < N * W; i++) dlogits.h[i] = 123.0f;
    buf_upload(&dlogits);
    crossentropy_backward(dlogits.dev, logits.dev, targets_dev, rowmax.dev, sumexp.dev, dloss, N, W, NV, 0);
    crossentropy_ctx ctx = {logits.d, targets, losses.d, N, W, NV, 0, (double)dloss};
    // FD over every column; padding columns do not enter the loss, so their FD is 0.
    check_backward("crossentropy_backward dlogits vs FD (written over garbage)", &dlogits, crossentropy_objective,
                   &ctx, &logits);
    int pad_zero = 1;
    for (int n = 0; n < N; n++) pad_zero &= dlogits.h[n * W + NV] == 0.0f;
    check(pad_zero, "crossentropy_backward padding dlogits exactly 0",
          "a padding column got a nonzero gradient");

    // In place: dlogits == logits gives the same result.
    Buf inplace = buf_copy_of(&logits);
    crossentropy_backward(inplace.dev, inplace.dev, targets_dev, rowmax.dev, sumexp.dev, dloss, N, W, NV, 0);
    check_err("crossentropy_backward in place (dlogits == logits)", rel_err_ff(buf_fetch(&inplace), dlogits.h, N * W),
              ACC_TOL);
    case_end();
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
    Buf logits = buf_random(N * V, 3.0);
    // Row 0's max lies in shard A, row 1's in shard B, so the merge has to
    // rescale each side's sumexp at least once.
    logits.h[0 * V + 1] = 5.0f;
    logits.h[1 * V + 8] = 5.0f;
    buf_upload(&logits);
    Buf la = buf_zeros(N * WA), lb = buf_zeros(N * WB);
    for (int n = 0; n < N; n++) {
        memcpy(la.h + n * WA, logits.h + n * V, WA * sizeof(float));
        memcpy(lb.h + n * WB, logits.h + n * V + WA, WB * sizeof(float));
    }
    buf_upload(&la);
    buf_upload(&lb);
    int* targets_dev = dev_copy_int(targets, N);

    // Unsharded.
    Buf m = buf_zeros(N), s = buf_zeros(N), t = buf_zeros(N), loss = buf_zeros(N), dl = buf_zeros(N * V);
    crossentropy_partials(m.dev, s.dev, t.dev, logits.dev, targets_dev, N, V, V, 0);
    crossentropy_loss(loss.dev, m.dev, s.dev, t.dev, N);
    crossentropy_ref(loss.d, NULL, NULL, NULL, logits.d, targets, N, V, V, 0);
    check_forward("crossentropy unsharded loss (width 10) vs double", &loss);
    crossentropy_backward(dl.dev, logits.dev, targets_dev, m.dev, s.dev, dloss, N, V, V, 0);
    crossentropy_ctx ctx = {logits.d, targets, loss.d, N, V, V, 0, (double)dloss};
    check_backward("crossentropy unsharded dlogits (width 10) vs FD", &dl, crossentropy_objective, &ctx, &logits);

    // Per shard.
    Buf ma = buf_zeros(N), sa = buf_zeros(N), ta = buf_zeros(N), mb = buf_zeros(N), sb = buf_zeros(N),
        tb = buf_zeros(N);
    crossentropy_partials(ma.dev, sa.dev, ta.dev, la.dev, targets_dev, N, WA, WA, 0);
    crossentropy_partials(mb.dev, sb.dev, tb.dev, lb.dev, targets_dev, N, WB, WB, WA);
    buf_fetch(&ta);
    buf_fetch(&tb);
    int zero_ok = 1;
    for (int n = 0; n < N; n++) {
        if (targets[n] < WA) zero_ok &= tb.h[n] == 0.0f && ta.h[n] == logits.h[n * V + targets[n]];
        else zero_ok &= ta.h[n] == 0.0f && tb.h[n] == logits.h[n * V + targets[n]];
    }
    check(zero_ok, "crossentropy_partials tlogit per shard (target logit or exactly 0)",
          "a shard reported a wrong tlogit");

    // Merge B into A, and A into B: both orders must give the same stats.
    Buf m1 = buf_copy_of(&ma), s1 = buf_copy_of(&sa), t1 = buf_copy_of(&ta);
    crossentropy_merge(m1.dev, s1.dev, t1.dev, mb.dev, sb.dev, tb.dev, N);
    Buf m2 = buf_copy_of(&mb), s2 = buf_copy_of(&sb), t2 = buf_copy_of(&tb);
    crossentropy_merge(m2.dev, s2.dev, t2.dev, ma.dev, sa.dev, ta.dev, N);
    buf_fetch(&m);
    buf_fetch(&s);
    buf_fetch(&m1);
    buf_fetch(&m2);
    int max_ok = 1;
    for (int n = 0; n < N; n++) max_ok &= m1.h[n] == m.h[n] && m2.h[n] == m.h[n];
    check(max_ok, "crossentropy_merge rowmax equals unsharded rowmax", "merged max differs");
    check_err("crossentropy_merge sumexp equals unsharded sumexp",
              err_max(rel_err_ff(buf_fetch(&s1), s.h, N), rel_err_ff(buf_fetch(&s2), s.h, N)), FWD_TOL);
    Buf loss1 = buf_zeros(N), loss2 = buf_zeros(N);
    crossentropy_loss(loss1.dev, m1.dev, s1.dev, t1.dev, N);
    crossentropy_loss(loss2.dev, m2.dev, s2.dev, t2.dev, N);
    check_err("crossentropy merged loss equals unsharded loss",
              err_max(rel_err_ff(buf_fetch(&loss1), loss.h, N), rel_err_ff(buf_fetch(&loss2), loss.h, N)), FWD_TOL);
    check_err("crossentropy merged loss vs double", rel_err(loss1.h, loss.d, N), FWD_TOL);

    // Backward per shard with the global statistics.
    Buf da = buf_zeros(N * WA), db = buf_zeros(N * WB);
    crossentropy_backward(da.dev, la.dev, targets_dev, m1.dev, s1.dev, dloss, N, WA, WA, 0);
    crossentropy_backward(db.dev, lb.dev, targets_dev, m1.dev, s1.dev, dloss, N, WB, WB, WA);
    float want_a[N * WA], want_b[N * WB];
    for (int n = 0; n < N; n++) {
        memcpy(want_a + n * WA, dl.h + n * V, WA * sizeof(float));
        memcpy(want_b + n * WB, dl.h + n * V + WA, WB * sizeof(float));
    }
    check_err("crossentropy_backward shard [0,6) equals unsharded columns", rel_err_ff(buf_fetch(&da), want_a, N * WA),
              FWD_TOL);
    check_err("crossentropy_backward shard [6,10) equals unsharded columns",
              rel_err_ff(buf_fetch(&db), want_b, N * WB), FWD_TOL);
    case_end();
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
        ep = err_max(ep, max_abs_diff(p, p_d, N) / lr);
        em = err_max(em, rel_err(m, m_d, N));
        ev = err_max(ev, rel_err(v, v_d, N));
    }
    check_err("adamw_update params over 3 steps (error / lr)", ep, 1e-4);
    check_err("adamw_update m over 3 steps", em, FWD_TOL);
    check_err("adamw_update v over 3 steps", ev, FWD_TOL);
    case_end();
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
    double want = 0.0, head = 0.0;
    for (int i = 0; i < N; i++) want += (double)g[i] * (double)g[i];
    for (int i = 0; i < N / 3; i++) head += (double)g[i] * (double)g[i];
    float* g_dev = dev_copy(g, N);
    // The contract: grad_sumsq ADDS into a double of device memory and
    // returns nothing, so a step sums its slices on the device and reads the
    // total once. The double starts at 0.75 here, so an op that overwrote it
    // (or summed in float) would miss by far more than the bound.
    double* acc = dev_alloc(sizeof(double));
    const double start = 0.75;
    double got = 0.0;
    mem_to_device(acc, &start, sizeof(double));
    grad_sumsq(acc, g_dev, N);
    mem_to_host(&got, acc, sizeof(double));
    check_err("grad_sumsq adds the slice's squares to *sumsq (in double)", fabs(got - (start + want)) / want, 1e-9);
    // two slices into one sum, an empty slice adding nothing: the whole
    mem_to_device(acc, &(double){0.0}, sizeof(double));
    grad_sumsq(acc, g_dev, N / 3);
    mem_to_host(&got, acc, sizeof(double));
    check_err("grad_sumsq on the first third alone", fabs(got - head) / head, 1e-9);
    grad_sumsq(acc, g_dev + N / 3, 0);
    grad_sumsq(acc, g_dev + N / 3, N - N / 3);
    mem_to_host(&got, acc, sizeof(double));
    check_err("grad_sumsq of three slices (one empty) summed on the device = the whole", fabs(got - want) / want,
              1e-9);
    free(g);
    case_end();

    // the sum travels as a float: rounded as C rounds a double to a float
    // (to nearest; past FLT_MAX to infinity)
    {
        enum { K = 6 };
        const double d[K] = {1.0 / 3.0, -2.5, 0.1, 16777217.0, 1e-40, 1e40};
        float want_f[K], got_f[K];
        for (int i = 0; i < K; i++) want_f[i] = (float)d[i];
        double* d_dev = dev_alloc(K * sizeof(double));
        float* f_dev = dev_zeros(K);
        mem_to_device(d_dev, d, sizeof(d));
        ops_double_to_float(f_dev, d_dev, K);
        to_host(got_f, f_dev, K);
        // bit for bit by construction: one IEEE rounding per value, as the cast
        check(memcmp(got_f, want_f, sizeof(got_f)) == 0, "ops_double_to_float rounds as the C cast (bit for bit)",
              "got %.9g %.9g %.9g %.9g %.9g %.9g", (double)got_f[0], (double)got_f[1], (double)got_f[2],
              (double)got_f[3], (double)got_f[4], (double)got_f[5]);
        case_end();
    }

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
    case_end();

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
        case_end();
    }
}

// ================================================================ NULL gradients
// ops.h: "A gradient pointer may be NULL when the caller does not need it."
// Beyond matmul's dinp/dbias (tested above), these run last so that a crash
// cannot hide the results of the other checks.
static void test_null_gradients(void) {
    enum { N = 3, C = 4, OC = 2, V = 5 };
    Buf inp = buf_random(N * C, 1.0), w = buf_random(OC * C, 1.0), r = buf_random(N * OC, 1.0),
        dout = buf_random(N * C, 1.0);
    Buf dinp = buf_zeros(N * C), dinp_ref = buf_zeros(N * C), dw_ref = buf_zeros(OC * C), dummy_b = buf_zeros(OC);
    matmul_backward(dinp_ref.dev, dw_ref.dev, dummy_b.dev, r.dev, inp.dev, w.dev, N, C, OC);
    matmul_backward(dinp.dev, NULL, NULL, r.dev, inp.dev, w.dev, N, C, OC);
    check_err("matmul_backward dw=NULL dbias=NULL, dinp unchanged",
              rel_err_ff(buf_fetch(&dinp), buf_fetch(&dinp_ref), N * C), ACC_TOL);

    // Encoder with only dwte.
    const int tokens[N] = {1, 4, 1};
    int* tokens_dev = dev_copy_int(tokens, N);
    Buf dwte = buf_zeros(V * C), dwte2 = buf_zeros(V * C), dwpe = buf_zeros(N * C);
    encoder_backward(dwte.dev, dwpe.dev, dout.dev, tokens_dev, 1, N, C);
    encoder_backward(dwte2.dev, NULL, dout.dev, tokens_dev, 1, N, C);
    check_err("encoder_backward dwpe=NULL", rel_err_ff(buf_fetch(&dwte2), buf_fetch(&dwte), V * C), ACC_TOL);

    // Residual with one side only.
    Buf da = buf_zeros(N * C), db3 = buf_zeros(N * C);
    residual_backward(da.dev, NULL, dout.dev, N * C);
    residual_backward(NULL, db3.dev, dout.dev, N * C);
    check_err("residual_backward one side NULL",
              err_max(rel_err_ff(buf_fetch(&da), dout.h, N * C), rel_err_ff(buf_fetch(&db3), dout.h, N * C)), ACC_TOL);

    // Layernorm last: with only dinp, then only dw/db.
    Buf lw = buf_random(C, 1.0), lb = buf_random(C, 1.0);
    Buf out = buf_zeros(N * C), mean = buf_zeros(N), rstd = buf_zeros(N);
    Buf di = buf_zeros(N * C), dw = buf_zeros(C), db = buf_zeros(C), di2 = buf_zeros(N * C), dw2 = buf_zeros(C),
        db2 = buf_zeros(C);
    layernorm_forward(out.dev, mean.dev, rstd.dev, inp.dev, lw.dev, lb.dev, N, C);
    layernorm_backward(di.dev, dw.dev, db.dev, dout.dev, inp.dev, lw.dev, mean.dev, rstd.dev, N, C);
    layernorm_backward(di2.dev, NULL, NULL, dout.dev, inp.dev, lw.dev, mean.dev, rstd.dev, N, C);
    layernorm_backward(NULL, dw2.dev, db2.dev, dout.dev, inp.dev, lw.dev, mean.dev, rstd.dev, N, C);
    check_err("layernorm_backward with NULL gradients",
              err_max(rel_err_ff(buf_fetch(&di2), buf_fetch(&di), N * C),
                   err_max(rel_err_ff(buf_fetch(&dw2), buf_fetch(&dw), C), rel_err_ff(buf_fetch(&db2), buf_fetch(&db), C))),
              ACC_TOL);
    case_end();
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
        Buf inp = buf_random(N * C, 2.0), w = buf_random(C, 1.0), b = buf_random(C, 1.0), r = buf_random(N * C, 1.0);
        Buf out = buf_zeros(N * C), mean = buf_zeros(N), rstd = buf_zeros(N);
        layernorm_forward(out.dev, mean.dev, rstd.dev, inp.dev, w.dev, b.dev, N, C);
        layernorm_ref(out.d, mean.d, rstd.d, inp.d, w.d, b.d, N, C);
        check_forward("layernorm_forward out, C = 600", &out);
        Buf dinp = buf_zeros(N * C), dw = buf_zeros(C);
        layernorm_backward(dinp.dev, dw.dev, NULL, r.dev, inp.dev, w.dev, mean.dev, rstd.dev, N, C);
        layernorm_ctx ctx = {inp.d, w.d, b.d, r.d, out.d, N, C};
        check_backward("layernorm_backward dinp vs FD, C = 600", &dinp, layernorm_objective, &ctx, &inp);
        check_backward("layernorm_backward dw vs FD, C = 600", &dw, layernorm_objective, &ctx, &w);
        case_end();
    }
    // Attention: rows of T = 300 keys (one head of size 8)
    {
        enum { B = 1, T = WIDE / 2, C = 8, NH = 1, QKV = B * T * 3 * C, ATT = B * NH * T * T };
        Buf qkv = buf_random(QKV, 1.5), r = buf_random(B * T * C, 1.0);
        Buf out = buf_zeros(B * T * C), att = buf_zeros(ATT);
        attention_forward(out.dev, att.dev, qkv.dev, B, T, C, NH);
        attention_ref(out.d, att.d, qkv.d, B, T, C, NH);
        check_forward("attention_forward out, T = 300", &out);
        Buf dqkv = buf_zeros(QKV), datt = buf_zeros(ATT);
        attention_backward(dqkv.dev, datt.dev, r.dev, qkv.dev, att.dev, B, T, C, NH);
        attention_ctx ctx = {qkv.d, r.d, out.d, att.d, B, T, C, NH};
        double g[QKV / 97 + 1];
        float got[QKV / 97 + 1];
        size_t k = 0;
        fd_sample(attention_objective, &ctx, qkv.d, QKV, 97, buf_fetch(&dqkv), g, got, &k);
        check_err("attention_backward dqkv vs FD, T = 300 (every 97th entry)", rel_err(got, g, k), BWD_TOL);
        case_end();
    }
    // Cross-entropy: rows of 600 logits, the first 550 real
    {
        enum { N = 3, W = WIDE, NV = 550 };
        const int targets[N] = {0, 549, 300};
        const float dloss = 0.5f;
        Buf logits = buf_random(N * W, 3.0);
        for (int n = 0; n < N; n++)
            for (int v = NV; v < W; v++) logits.h[n * W + v] = 50.0f;  // padding must not count
        buf_upload(&logits);
        int* targets_dev = dev_copy_int(targets, N);
        Buf rowmax = buf_zeros(N), sumexp = buf_zeros(N), tlogit = buf_zeros(N), losses = buf_zeros(N);
        crossentropy_partials(rowmax.dev, sumexp.dev, tlogit.dev, logits.dev, targets_dev, N, W, NV, 0);
        crossentropy_loss(losses.dev, rowmax.dev, sumexp.dev, tlogit.dev, N);
        crossentropy_ref(losses.d, rowmax.d, sumexp.d, tlogit.d, logits.d, targets, N, W, NV, 0);
        check_forward("crossentropy_loss, 600-wide rows (550 real)", &losses);
        Buf dlogits = buf_zeros(N * W);
        crossentropy_backward(dlogits.dev, logits.dev, targets_dev, rowmax.dev, sumexp.dev, dloss, N, W, NV, 0);
        crossentropy_ctx ctx = {logits.d, targets, losses.d, N, W, NV, 0, (double)dloss};
        check_backward("crossentropy_backward dlogits vs FD, 600-wide rows", &dlogits, crossentropy_objective, &ctx,
                       &logits);
        case_end();
    }
    // Bias gradient: a sum over N = 600 rows
    {
        enum { N = WIDE, C = 2, OC = 3 };
        Buf inp = buf_random(N * C, 1.0), w = buf_random(OC * C, 1.0), bias = buf_random(OC, 1.0),
            r = buf_random(N * OC, 1.0), out = buf_zeros(N * OC);
        Buf dw = buf_zeros(OC * C), dbias = buf_zeros(OC);
        matmul_backward(NULL, dw.dev, dbias.dev, r.dev, inp.dev, w.dev, N, C, OC);
        matmul_ctx ctx = {inp.d, w.d, bias.d, r.d, out.d, N, C, OC};
        check_backward("matmul_backward dbias vs FD, a sum over 600 rows", &dbias, matmul_objective, &ctx, &bias);
        case_end();
    }
    // Sums over rows per column with a column count that is no multiple of
    // 32: the CUDA kernels take tiles of 32 columns with the rows split over
    // lanes, so C = 45 is a full tile and a part-filled one, and 600 rows
    // (not a multiple of the 16 lanes) give each lane a different count.
    {
        enum { N = WIDE, C = 45 };
        Buf inp = buf_random(N * C, 2.0), w = buf_random(C, 1.0), b = buf_random(C, 1.0), r = buf_random(N * C, 1.0);
        Buf out = buf_zeros(N * C), mean = buf_zeros(N), rstd = buf_zeros(N);
        layernorm_forward(out.dev, mean.dev, rstd.dev, inp.dev, w.dev, b.dev, N, C);
        Buf dw = buf_zeros(C), db = buf_zeros(C);
        layernorm_backward(NULL, dw.dev, db.dev, r.dev, inp.dev, w.dev, mean.dev, rstd.dev, N, C);
        layernorm_ctx ctx = {inp.d, w.d, b.d, r.d, out.d, N, C};
        check_backward("layernorm_backward dw vs FD, 600 rows x 45 channels", &dw, layernorm_objective, &ctx, &w);
        check_backward("layernorm_backward db vs FD, 600 rows x 45 channels", &db, layernorm_objective, &ctx, &b);
        case_end();
    }
    {
        enum { N = WIDE, C = 2, OC = 45 };
        Buf inp = buf_random(N * C, 1.0), w = buf_random(OC * C, 1.0), bias = buf_random(OC, 1.0),
            r = buf_random(N * OC, 1.0), out = buf_zeros(N * OC);
        Buf dbias = buf_zeros(OC);
        matmul_backward(NULL, NULL, dbias.dev, r.dev, inp.dev, w.dev, N, C, OC);
        matmul_ctx ctx = {inp.d, w.d, bias.d, r.d, out.d, N, C, OC};
        check_backward("matmul_backward dbias vs FD, 600 rows x 45 columns", &dbias, matmul_objective, &ctx, &bias);
        case_end();
    }
    // Encoder: C = 600 channels (more than one block of channels)
    {
        enum { B = 1, T = 2, C = WIDE, V = 3 };
        const int tokens[B * T] = {2, 2};
        Buf wte = buf_random(V * C, 1.0), wpe = buf_random(T * C, 1.0), r = buf_random(B * T * C, 1.0),
            out = buf_zeros(B * T * C);
        int* tokens_dev = dev_copy_int(tokens, B * T);
        Buf dwte = buf_zeros(V * C), dwpe = buf_zeros(T * C);
        encoder_backward(dwte.dev, dwpe.dev, r.dev, tokens_dev, B, T, C);
        encoder_ctx ctx = {tokens, wte.d, wpe.d, r.d, out.d, B, T, C};
        check_backward("encoder_backward dwte vs FD, C = 600, one token twice", &dwte, encoder_objective, &ctx, &wte);
        case_end();
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
// the caller's case_end.
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
                                    mx = err_max(mx, sc);
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

// One chunk set-up against the whole-sequence ops: attention_forward and
// attention_backward on all T positions, then the same in chunks through
// chunk_attention_run, joined back; forward and backward compared.
static void check_chunks_vs_whole(const chunk_setup* s, const char* what) {
    const int B = s->B, T = s->T, C = s->C, NH = s->NH;
    const size_t QKV = (size_t)B * T * 3 * C, OUT = (size_t)B * T * C, ATT = (size_t)B * NH * T * T;
    Buf qkv = buf_random(QKV, 1.5), r = buf_random(OUT, 1.0);
    Buf out = buf_zeros(OUT), att = buf_zeros(ATT), dqkv = buf_zeros(QKV), datt = buf_zeros(ATT);
    attention_forward(out.dev, att.dev, qkv.dev, B, T, C, NH);
    attention_backward(dqkv.dev, datt.dev, r.dev, qkv.dev, att.dev, B, T, C, NH);
    // in the chunk layout (host memory, zeroed)
    float *q_ch = host_alloc(QKV * sizeof(float)), *kv_ch = host_alloc(QKV * sizeof(float)),
          *r_ch = host_alloc(OUT * sizeof(float)), *out_ch = host_alloc(OUT * sizeof(float)),
          *dq_ch = host_alloc(QKV * sizeof(float)), *dkv_ch = host_alloc(QKV * sizeof(float)),
          *out_j = host_alloc(OUT * sizeof(float)), *g_j = host_alloc(QKV * sizeof(float));
    split_chunks(q_ch, qkv.h, B, T, 3 * C, s->qsz, s->nq);
    if (!s->shared) split_chunks(kv_ch, qkv.h, B, T, 3 * C, s->ksz, s->nk);
    split_chunks(r_ch, r.h, B, T, C, s->qsz, s->nq);
    chunk_attention_run(s, out_ch, dq_ch, dkv_ch, q_ch, s->shared ? NULL : kv_ch, r_ch);
    join_chunks_add(out_j, out_ch, B, T, C, s->qsz, s->nq);
    join_chunks_add(g_j, dq_ch, B, T, 3 * C, s->qsz, s->nq);
    if (!s->shared) join_chunks_add(g_j, dkv_ch, B, T, 3 * C, s->ksz, s->nk);
    char name[160];
    snprintf(name, sizeof(name), "attention_chunk_forward+merge+finish vs attention_forward, %s", what);
    check_err(name, rel_err_ff(out_j, buf_fetch(&out), OUT), FWD_TOL);
    snprintf(name, sizeof(name), "attention_chunk_backward summed vs attention_backward, %s", what);
    check_err(name, rel_err_ff(g_j, buf_fetch(&dqkv), QKV), BWD_TOL);
    case_end();
}

// The sums whose GPU kernels cut a batch into pieces (common/cuda/ops_twin.h,
// whose index logic tests/test_cuda_twins.c runs on the CPU), at sizes where
// the pieces are many: the embedding backward past the 16,384 rows of the
// kernel before it, with tokens repeated thousands of times, against the
// rows added in row order on the host, bit for bit (both backends add each
// token's and position's rows in row order, and the GPU's kernels are built
// without fused multiply-adds); dbias over 5,000 rows (20 chunks of rows on
// the GPU) and the MoE gate gradient at C = 768 (a warp's lanes make 24
// passes) against the double reference.
static void test_large_batches(void) {
    enum { B = 5, T = 4000, N = B * T, C = 8, V = 50 };
    int* tokens = host_alloc(N * sizeof(int));
    for (int n = 0; n < N; n++) tokens[n] = (int)((rng_uniform() + 1.0) * 0.5 * V) % V;
    int* tokens_dev = dev_copy_int(tokens, N);
    Buf dout = buf_random((size_t)N * C, 1.0), dwte = buf_random(V * C, 1.0), dwpe = buf_random((size_t)T * C, 1.0);
    float* want_te = host_alloc(V * C * sizeof(float));
    float* want_pe = host_alloc((size_t)T * C * sizeof(float));
    memcpy(want_te, dwte.h, V * C * sizeof(float));
    memcpy(want_pe, dwpe.h, (size_t)T * C * sizeof(float));
    for (int n = 0; n < N; n++)
        for (int c = 0; c < C; c++) {
            want_te[tokens[n] * C + c] += dout.h[(size_t)n * C + c];
            want_pe[(size_t)(n % T) * C + c] += dout.h[(size_t)n * C + c];
        }
    encoder_backward(dwte.dev, dwpe.dev, dout.dev, tokens_dev, B, T, C);
    check(!memcmp(buf_fetch(&dwte), want_te, V * C * sizeof(float)) &&
              !memcmp(buf_fetch(&dwpe), want_pe, (size_t)T * C * sizeof(float)),
          "encoder_backward at 20,000 rows, ~400 a token: dwte and dwpe = the rows added in row order, bit for bit",
          "differs");
    case_end();

    enum { NB = 5000, OC = 70 };
    Buf r = buf_random((size_t)NB * OC, 1.0), dbias = buf_zeros(OC);
    for (int k = 0; k < OC; k++) {
        double s = 0.0;
        for (int n = 0; n < NB; n++) s += r.d[(size_t)n * OC + k];
        dbias.d[k] = s;
    }
    matmul_backward(NULL, NULL, dbias.dev, r.dev, NULL, NULL, NB, 1, OC);
    check_forward("matmul_backward dbias over 5,000 rows", &dbias);
    case_end();

    enum { NT = 40, K = 2, CG = 768 };
    int pos[NT * K];
    for (int i = 0; i < NT * K; i++) pos[i] = i % 7 == 3 ? -1 : (i * 37) % (NT * K);
    int* pos_dev = dev_copy_int(pos, NT * K);
    Buf gd = buf_random((size_t)NT * CG, 1.0), rows = buf_random((size_t)NT * K * CG, 1.0), dgates = buf_zeros(NT * K);
    for (int i = 0; i < NT * K; i++)
        dgates.d[i] = pos[i] < 0 ? 0.0 : dot_d(gd.d + (size_t)(i / K) * CG, rows.d + (size_t)pos[i] * CG, CG);
    moe_combine_backward(NULL, dgates.dev, gd.dev, rows.dev, NULL, pos_dev, NT, K, CG);
    check_forward("moe_combine_backward dgates at C = 768", &dgates);
    case_end();
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
    enum { B = 2, T = 7, C = 8, NH = 2, QKV = B * T * 3 * C, OUT = B * T * C, ATT = B * NH * T * T };
    const int qsz[2] = {3, 4}, ksz[2] = {4, 3};
    chunk_setup s = {B, T, C, NH, qsz, 2, ksz, 2, 0};
    Buf qkv = buf_random(QKV, 1.5);  // as test_attention: a clearly non-uniform softmax
    Buf r = buf_random(OUT, 1.0);

    // The whole sequence through attention_forward / attention_backward.
    Buf out = buf_zeros(OUT), att = buf_zeros(ATT), dqkv = buf_zeros(QKV), datt = buf_zeros(ATT);
    attention_forward(out.dev, att.dev, qkv.dev, B, T, C, NH);
    attention_backward(dqkv.dev, datt.dev, r.dev, qkv.dev, att.dev, B, T, C, NH);
    buf_fetch(&out);
    buf_fetch(&dqkv);

    // The same in chunks.
    float q_ch[QKV], kv_ch[QKV], r_ch[OUT], out_ch[OUT], dq_ch[QKV], dkv_ch[QKV];
    split_chunks(q_ch, qkv.h, B, T, 3 * C, qsz, 2);
    split_chunks(kv_ch, qkv.h, B, T, 3 * C, ksz, 2);
    split_chunks(r_ch, r.h, B, T, C, qsz, 2);
    chunk_attention_run(&s, out_ch, dq_ch, dkv_ch, q_ch, kv_ch, r_ch);
    float out_j[OUT] = {0}, g_j[QKV] = {0};
    join_chunks_add(out_j, out_ch, B, T, C, qsz, 2);
    join_chunks_add(g_j, dq_ch, B, T, 3 * C, qsz, 2);
    join_chunks_add(g_j, dkv_ch, B, T, 3 * C, ksz, 2);
    check_err("attention_chunk_forward+merge+finish vs attention_forward, T = 7 (q 3+4, kv 4+3)",
              rel_err_ff(out_j, out.h, OUT), FWD_TOL);
    // Summed over the pairs, and accumulated: a backward that overwrote would
    // keep only the last pair of each chunk.
    check_err("attention_chunk_backward summed over pairs vs attention_backward, T = 7",
              rel_err_ff(g_j, dqkv.h, QKV), BWD_TOL);

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
    case_end();

    // Rows of 300 keys (more than one CUDA block of threads, so every striding
    // loop of the GPU kernels makes two passes, and more than one causal row
    // block of the CPU's): T = 600 in two chunks of 300, queries, keys and
    // values of a chunk in one buffer with one gradient buffer, as a rank
    // holds them. The whole-sequence ops are checked against FD at this width
    // in test_wide_rows.
    const int sz[2] = {WIDE / 2, WIDE / 2};
    chunk_setup s1 = {1, 2 * (WIDE / 2), 8, 1, sz, 2, sz, 2, 1};
    check_chunks_vs_whole(&s1, "T = 600 (chunks of 300)");
    // Cuts that fall inside the CPU's causal row blocks (64 rows) with
    // several heads and packed K/V: queries 0..99 and 100..179, keys 0..129
    // and 130..179. Queries 100..179 against keys 0..129: rows 100..128 see a
    // part of the keys, the rest all of them; against keys 130..179: the first
    // row block (queries 100..163) holds 30 empty rows above 34 live ones.
    const int qsz2[2] = {100, 80}, ksz2[2] = {130, 50};
    chunk_setup s2 = {2, 180, 16, 2, qsz2, 2, ksz2, 2, 0};
    check_chunks_vs_whole(&s2, "T = 180 (q 100+80, kv 130+50, 2 heads)");
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
    Buf inp = buf_random(N * C, 1.0), w = buf_random(OC * C, 1.0), b = buf_random(OC, 1.0),
        dout = buf_random(N * OC, 1.0), pre_i = buf_random(N * C, 1.0), pre_w = buf_random(OC * C, 1.0),
        pre_b = buf_random(OC, 1.0);
    (void)b;  // the backward reads no bias; drawn so the later inputs stay as they were

    // matmul: one call against the two halves, onto the same prefilled buffers
    Buf i1 = buf_copy_of(&pre_i), w1 = buf_copy_of(&pre_w), b1 = buf_copy_of(&pre_b);
    Buf i2 = buf_copy_of(&pre_i), w2 = buf_copy_of(&pre_w), b2 = buf_copy_of(&pre_b);
    matmul_backward(i1.dev, w1.dev, b1.dev, dout.dev, inp.dev, w.dev, N, C, OC);
    matmul_backward(i2.dev, NULL, NULL, dout.dev, NULL, w.dev, N, C, OC);
    matmul_backward(NULL, w2.dev, b2.dev, dout.dev, inp.dev, NULL, N, C, OC);
    int same = memcmp(buf_fetch(&i1), buf_fetch(&i2), sizeof(float) * N * C) == 0 &&
               memcmp(buf_fetch(&w1), buf_fetch(&w2), sizeof(float) * OC * C) == 0 &&
               memcmp(buf_fetch(&b1), buf_fetch(&b2), sizeof(float) * OC) == 0;
    // bitwise by construction: the halves issue the one call's gemms and bias loop on the same shapes
    check(same, "matmul_backward in two halves (dinp, no inp; then dw+dbias, no w) == one call, bitwise",
          "a gradient differs from the one-call result");

    // layernorm: the same, in a (N, C) layout
    Buf ln_w = buf_random(C, 1.0), ln_b = buf_random(C, 1.0), ln_dout = buf_random(N * C, 1.0);
    Buf out = buf_zeros(N * C), mean = buf_zeros(N), rstd = buf_zeros(N);
    layernorm_forward(out.dev, mean.dev, rstd.dev, inp.dev, ln_w.dev, ln_b.dev, N, C);
    // the prefills: pre_i, and C values of pre_w for each of dw and db (pre_b
    // has only OC < C floats)
    Buf li1 = buf_copy_of(&pre_i), lw1 = buf_zeros(C), lb1 = buf_zeros(C);
    Buf li2 = buf_copy_of(&pre_i), lw2 = buf_zeros(C), lb2 = buf_zeros(C);
    memcpy(lw1.h, pre_w.h, C * sizeof(float));
    memcpy(lb1.h, pre_w.h + C, C * sizeof(float));
    memcpy(lw2.h, pre_w.h, C * sizeof(float));
    memcpy(lb2.h, pre_w.h + C, C * sizeof(float));
    buf_upload(&lw1);
    buf_upload(&lb1);
    buf_upload(&lw2);
    buf_upload(&lb2);
    layernorm_backward(li1.dev, lw1.dev, lb1.dev, ln_dout.dev, inp.dev, ln_w.dev, mean.dev, rstd.dev, N, C);
    layernorm_backward(li2.dev, NULL, NULL, ln_dout.dev, inp.dev, ln_w.dev, mean.dev, rstd.dev, N, C);
    layernorm_backward(NULL, lw2.dev, lb2.dev, ln_dout.dev, inp.dev, NULL, mean.dev, rstd.dev, N, C);
    same = memcmp(buf_fetch(&li1), buf_fetch(&li2), sizeof(float) * N * C) == 0 &&
           memcmp(buf_fetch(&lw1), buf_fetch(&lw2), sizeof(float) * C) == 0 &&
           memcmp(buf_fetch(&lb1), buf_fetch(&lb2), sizeof(float) * C) == 0;
    // bitwise by construction: the halves run the one call's loops in the same order
    check(same, "layernorm_backward in two halves (dinp; then dw+db, no w) == one call, bitwise",
          "a gradient differs from the one-call result");

    // With every gradient NULL there is no work, so nothing is read: every
    // input may be NULL. (The CPU layernorm ran its dw/db loop regardless
    // before: this crashed.)
    layernorm_backward(NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, N, C);
    matmul_backward(NULL, NULL, NULL, NULL, NULL, NULL, N, C, OC);
    device_synchronize();
    check(1, "layernorm_backward and matmul_backward with no gradient wanted read nothing", "");
    case_end();
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
        for (int e = 0; e < E; e++) mx = err_max(mx, logits[n * E + e]);
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
    Buf logits = buf_random(N * E, 2.0);
    // row 0 all equal: every prob ties, the top-2 are experts 0 and 1;
    // row 1 ties experts 3 and 1 for the best: 1 first, then 3
    for (int e = 0; e < E; e++) logits.h[e] = 0.5f;
    logits.h[E + 0] = 0.1f, logits.h[E + 1] = 1.5f, logits.h[E + 2] = -1.0f, logits.h[E + 3] = 1.5f,
    logits.h[E + 4] = 0.0f;
    buf_upload(&logits);
    Buf r = buf_random(N * K, 1.0), probs = buf_zeros(N * E), gates = buf_zeros(N * K);
    int idx[N * K];
    int* i_dev = (int*)dev_alloc(N * K * sizeof(int));
    moe_router_forward(probs.dev, i_dev, gates.dev, logits.dev, N, E, K);
    mem_to_host(idx, i_dev, sizeof(idx));
    // the reference top-k: largest first, the lower index on a tie
    int ok = 1;
    for (int n = 0; n < N; n++)
        for (int j = 0; j < K; j++) {
            int best = -1;
            for (int e = 0; e < E; e++) {
                int taken = 0;
                for (int i = 0; i < j; i++) taken |= idx[n * K + i] == e;
                if (!taken && (best < 0 || logits.h[n * E + e] > logits.h[n * E + best])) best = e;
            }
            ok &= idx[n * K + j] == best;
        }
    ok &= idx[0] == 0 && idx[1] == 1 && idx[K] == 1 && idx[K + 1] == 3;
    check(ok, "moe_router_forward top-k, ties to the lower expert", "wrong experts chosen");
    router_ref(probs.d, gates.d, logits.d, idx, N, E, K);
    check_forward("moe_router_forward probs", &probs);
    check_forward("moe_router_forward gates", &gates);
    // the auxiliary loss's weights: E f_e / N from the forward's counts
    double f[E] = {0};
    for (int i = 0; i < N * K; i++) f[idx[i]] += 1.0 / (N * K);
    Buf w = buf_zeros(E);
    for (int e = 0; e < E; e++) w.h[e] = (float)(E * f[e] / N);
    buf_upload(&w);
    // the gates alone
    Buf dl = buf_zeros(N * E);
    moe_router_backward(dl.dev, r.dev, NULL, probs.dev, i_dev, gates.dev, N, E, K);
    double no_w[E] = {0};
    router_ctx ctx = {logits.d, r.d, no_w, idx, N, E, K};
    check_backward("moe_router_backward dlogits (gates) vs FD", &dl, router_objective, &ctx, &logits);
    // the auxiliary loss alone
    double zr[N * K] = {0};
    ctx.r = zr, ctx.w = w.d;
    Buf dl2 = buf_zeros(N * E);
    moe_router_backward(dl2.dev, NULL, w.dev, probs.dev, i_dev, gates.dev, N, E, K);
    check_backward("moe_router_backward dlogits (auxiliary loss) vs FD", &dl2, router_objective, &ctx, &logits);
    // both, accumulated onto what was there (random values)
    ctx.r = r.d;
    double g[N * E];
    fd_gradient(router_objective, &ctx, logits.d, N * E, g);
    Buf acc = buf_zeros(N * E);
    buf_prefill(&acc);
    moe_router_backward(acc.dev, r.dev, w.dev, probs.dev, i_dev, gates.dev, N, E, K);
    float both[N * E];
    buf_fetch(&acc);
    for (int i = 0; i < N * E; i++) both[i] = acc.h[i] - acc.pre[i];
    check_err("moe_router_backward dlogits (both) vs FD", rel_err(both, g, N * E), BWD_TOL);
    case_end();
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
    Buf x = buf_random(N * C, 1.0), gates = buf_zeros(N * K), sent = buf_zeros(N * K * C);
    for (int t = 0; t < N; t++) gates.h[t * K] = 0.25f, gates.h[t * K + 1] = 0.75f;
    gates.h[3 * K] = 1.0f;  // its kept slot carries it whole
    buf_upload(&gates);
    int* src_dev = dev_copy_int(src, N * K);
    int* pos_dev = dev_copy_int(pos, N * K);
    moe_gather_forward(sent.dev, x.dev, src_dev, N * K, C);
    buf_fetch(&sent);
    int ok = 1;
    for (int i = 0; i < N * K; i++) ok &= !memcmp(sent.h + i * C, x.h + src[i] * C, C * sizeof(float));
    check(ok, "moe_gather_forward copies every token row to its experts' rows", "a row differs");
    ok = cnt[2] == 0 && cnt[0] == N;
    check(ok, "moe dispatch: skewed load, an empty expert", "counts %d %d %d %d", cnt[0], cnt[1], cnt[2], cnt[3]);
    // identity experts: combining the rows with gates that sum to 1 gives every token back
    Buf back = buf_zeros(N * C);
    moe_combine_forward(back.dev, sent.dev, gates.dev, pos_dev, N, K, C);
    check_err("moe_combine_forward round trip returns every token", rel_err(buf_fetch(&back), x.d, N * C), FWD_TOL);
    // the gather's backward: every token gets the sum of its kept rows
    Buf ones = buf_zeros(N * K * C), dx = buf_zeros(N * C);
    for (int i = 0; i < N * K * C; i++) ones.h[i] = 1.0f;
    buf_upload(&ones);
    moe_gather_backward(dx.dev, ones.dev, pos_dev, N, K, C);
    for (int t = 0; t < N; t++)
        for (int ch = 0; ch < C; ch++) dx.d[t * C + ch] = t == 3 ? 1.0 : 2.0;
    check_forward("moe_gather_backward sums each token's kept rows", &dx);
    // combine backward against central differences, rows and gates
    Buf r = buf_random(N * C, 1.0);
    to_double(sent.d, sent.h, N * K * C);
    combine_ctx cc = {sent.d, gates.d, r.d, pos, N, K, C};
    Buf drows = buf_zeros(N * K * C), dgates = buf_zeros(N * K);
    moe_combine_backward(drows.dev, dgates.dev, r.dev, sent.dev, gates.dev, pos_dev, N, K, C);
    // the dropped slot's gate gets no gradient: FD agrees (it adds nothing)
    check_backward("moe_combine_backward drows vs FD", &drows, combine_objective, &cc, &sent);
    check_backward("moe_combine_backward dgates vs FD", &dgates, combine_objective, &cc, &gates);
    case_end();
}

// ================================================================ host staging buffers
// memory.h's mem_alloc_host: plain host memory on the CPU, page-locked
// (cudaMallocHost) on CUDA. What can go wrong: the block counted as device
// memory (the planner's exact byte predictions would move), a block too
// small (the pattern's last element), and on CUDA, where a copy from pinned
// memory is truly asynchronous, a mem_to_device that returns before the copy
// is done: the staging buffer is refilled at once after each copy, so a
// device that read it late would hold the second pattern, not the first.
static void test_host_staging(void) {
    enum { N = 1 << 16 };
    size_t before = 0, peak_before = mem_peak_total();
    for (int c = 0; c < MEM_NUM_CATEGORIES; c++) before += mem_current(c);
    float* src = mem_alloc_host(N * sizeof(float));
    float* dst = mem_alloc_host(N * sizeof(float));
    void* empty = mem_alloc_host(0);
    size_t during = 0;
    for (int c = 0; c < MEM_NUM_CATEGORIES; c++) during += mem_current(c);
    check(src && dst && empty, "host staging: mem_alloc_host gives a block, for 0 bytes too", "%p %p %p", (void*)src,
          (void*)dst, empty);
    check(during == before && mem_peak_total() == peak_before,
          "host staging: not counted as device memory (mem_current, mem_peak_total unchanged)",
          "%zu -> %zu bytes in use, peak %zu -> %zu", before, during, peak_before, mem_peak_total());
    float* x = dev_zeros(N);
    for (int i = 0; i < N; i++) src[i] = (float)(i % 1000) + 0.5f;
    mem_to_device(x, src, N * sizeof(float));
    for (int i = 0; i < N; i++) src[i] = -1.0f;  // refilled as soon as the copy returns
    ops_scale(x, N, 2.0f);
    mem_to_host(dst, x, N * sizeof(float));
    int bad = -1;
    for (int i = 0; i < N && bad < 0; i++)
        if (dst[i] != 2.0f * ((float)(i % 1000) + 0.5f)) bad = i;
    check(bad < 0, "host staging: to the device and back through staging buffers, refilled after each copy",
          "element %d: %g, want %g", bad, bad < 0 ? 0.0 : (double)dst[bad],
          bad < 0 ? 0.0 : 2.0 * ((bad % 1000) + 0.5));
    mem_free_host(src);
    mem_free_host(dst);
    mem_free_host(empty);
    mem_free_host(NULL);  // does nothing
}

// ================================================================ the device clock
// memory.h's DeviceClock times device work: the host clock on the CPU,
// events on the compute stream on CUDA. No timed assert: the checks are on
// its bookkeeping, which a wrong event slot breaks on a GPU (an unrecorded
// event is an error, a stale one a total that goes down): totals never
// decrease, a span open at a read counts once stopped, a stop without a
// start adds nothing, a reset is 0, and a clock left unread for more spans
// than DEVICE_CLOCK_UNREAD (it reads itself) still adds up.
static void test_device_clock(void) {
    enum { N = 1 << 16 };
    float* x = dev_zeros(N);
    DeviceClock c = {0};
    double prev = 0.0;
    int monotone = 1;
    for (int i = 0; i < 200; i++) {  // past the first event list (64 spans): it grows
        device_clock_start(&c);
        ops_scale(x, N, 0.5f);
        device_clock_stop(&c);
        if (i % 50 == 49) {
            double t = device_clock_seconds(&c);
            monotone &= t >= prev;
            prev = t;
        }
    }
    check(monotone && prev >= 0.0, "device clock: 200 spans read 4 times, the total never decreases", "last %g",
          prev);
    device_clock_start(&c);  // a span open across a read
    ops_scale(x, N, 0.5f);
    double at_read = device_clock_seconds(&c);
    ops_scale(x, N, 0.5f);
    device_clock_stop(&c);
    double after = device_clock_seconds(&c);
    check(at_read >= prev && after >= at_read, "device clock: a span open at a read counts once stopped",
          "before %g, at the read %g, after the stop %g", prev, at_read, after);
    device_clock_stop(&c);  // no start
    double again = device_clock_seconds(&c);
    check(again == after, "device clock: a stop without a start adds nothing", "%g, then %g", after, again);
    device_clock_reset(&c);
    double zero = device_clock_seconds(&c);
    check(zero == 0.0, "device clock: reset to 0", "%g", zero);
    for (int i = 0; i < DEVICE_CLOCK_UNREAD + 100; i++) {
        device_clock_start(&c);
        ops_zero(x, 1);
        device_clock_stop(&c);
    }
    double many = device_clock_seconds(&c);
    check(many >= 0.0 && many == many, "device clock: DEVICE_CLOCK_UNREAD + 100 spans left unread (it reads itself), then read",
          "%g", many);
    device_clock_free(&c);
    case_end();
}

// ================================================================ device stamps
// memory.h's DeviceStamps: when the device reached each point of a step.
// Here a queued sequence of kernels, a stamp before and after each: on
// both backends the stamps read back in the order the stream ran them
// (never decreasing), none before the anchor, none after the read
// returned, over two steps of the same object (events reused, the second
// step longer so the lists grow). On a GPU also: the stamps do not make the
// host wait. The host finishes queueing the kernels (about 10 us each)
// long before the GPU has run them (each reads and writes 256 MiB), so the
// last stamp reads later than the host's end of queueing; a stamp that
// synchronized (as chapter 5's per-action device_synchronize did) would
// put the host's end after it. tests/test_device_stamps.c checks the
// CPU twin's bookkeeping and refusals.
static void test_device_stamps(void) {
    int gpu = strcmp(device_memory_name(), "GPU memory") == 0;
    size_t N = gpu ? (size_t)1 << 26 : (size_t)1 << 16;
    float* x = dev_zeros(N);
    DeviceStamps s = {0};
    for (int step = 0; step < 2; step++) {
        int K = step == 0 ? 8 : 24;  // kernels; 2 K stamps
        double* out = (double*)host_alloc(2 * (size_t)K * sizeof(double));
        device_stamps_begin(&s, 2 * K);
        for (int k = 0; k < K; k++) {
            device_stamp(&s, 2 * k);
            ops_scale(x, N, 0.5f);
            device_stamp(&s, 2 * k + 1);
        }
        double queued = now_seconds();
        device_stamps_read(&s, out);
        double read = now_seconds();
        int ordered = out[0] >= s.anchor, bad = -1;
        for (int i = 1; i < 2 * K && ordered; i++)
            if (out[i] < out[i - 1]) ordered = 0, bad = i;
        char name[160];
        snprintf(name, sizeof(name), "device stamps: step %d, %d kernels queued with a stamp before and after each: in order, from the anchor to the read", step, K);
        check(ordered && out[2 * K - 1] <= read, name, "anchor %.9f, stamp %d %.9f after %.9f, last %.9f, read at %.9f", s.anchor,
              bad, bad > 0 ? out[bad] : 0.0, bad > 0 ? out[bad - 1] : 0.0, out[2 * K - 1], read);
        if (gpu) {
            snprintf(name, sizeof(name), "device stamps: step %d, the host queued %d kernels before the GPU ran them (no wait per stamp)", step, K);
            check(queued < out[2 * K - 1], name, "host done queueing at %.9f, the last kernel ended at %.9f", queued,
                  out[2 * K - 1]);
        }
    }
    device_stamps_free(&s);
    case_end();
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
    test_matmul_rowwise();
    test_attention();
    test_attention_flash();
    test_gelu();
    test_residual();
    test_crossentropy();
    test_crossentropy_shards();
    test_adamw();
    test_grad_norm();
    test_utilities();
    test_null_gradients();
    test_wide_rows();
    test_large_batches();
    test_attention_chunks();
    test_backward_halves();
    test_moe_router();
    test_moe_dispatch_combine();
    test_host_staging();
    test_device_clock();
    test_device_stamps();
    int rc = test_exit_code();
    runtime_finalize();
    return rc;
}
