// test_cuda_twins.c: the index logic of ops.cu's embedding backward, column
// sums and MoE gate gradient, run on the CPU.
//
// No GPU runs here. common/cuda/ops_twin.h holds what each thread of those
// kernels computes as plain functions that nvcc compiles into the kernels
// and the C compiler into this program; the program calls them for every
// thread of the grid, in loops, and spells out the rest of each kernel (the
// sort, the trees in shared memory and over warp shuffles) in C:
//   - the sort: the kernel sorts distinct keys with CUB's radix sort, so its
//     output is the sorted array, which qsort gives too;
//   - the lanes' tree in shared memory (column_lanes_sum): at half = 8, 4,
//     2, 1, lane y < half adds lane y + half;
//   - the warp tree (__shfl_down_sync, offsets 16 ... 1): lane l gets lane
//     l + offset's value added; lane 0's result reads only lanes below
//     2 * offset at each step, whose values the loop below has right.
// The threads of one kernel run in any order on a GPU: the emulation runs
// them forwards and backwards, and the results must agree.
//
// Checks, per kernel:
//   - the embedding backward adds in the CPU op's order: its dwte equals
//     encoder_backward's and encoder_backward_vocab's bit for bit, with
//     repeated tokens, one token everywhere, and more than 16,384 rows (the
//     old kernel's limit);
//   - the column sums add in another order than the CPU's (chunks, lanes,
//     a tree). With integer-valued data every partial sum is exact, so any
//     order gives the same bits: there they equal the CPU ops' (every row
//     counted once, in every chunk shape); with random data they stay within
//     the bound of any order of n additions, (n - 1) u sum |x| (u = 2^-24);
//   - the gate gradient likewise (integer data: the CPU's bits; random:
//     the bound), a row's bits the same whatever slice of tokens a call
//     holds, and dropped slots (pos < 0) untouched.
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/ops_twin.h"
#include "device.h"
#include "ops.h"
#include "test.h"

static uint64_t rng = 88172645463325252ULL;
static uint32_t next_u32(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 11);
}
static float rand_float(void) { return (float)(next_u32() % 2000001) / 1000000.0f - 1.0f; }
// small integers over 4: every sum of a few thousand of them is exact
static float rand_int4(void) { return (float)((int)(next_u32() % 17) - 8) / 4.0f; }

static float* randoms(size_t n, int integer) {
    float* x = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) x[i] = integer ? rand_int4() : rand_float();
    return x;
}
static float* copy_of(const float* x, size_t n) {
    float* y = malloc(n * sizeof(float));
    memcpy(y, x, n * sizeof(float));
    return y;
}

// ---------------------------------------------------------------- embedding backward

static int cmp_u64(const void* a, const void* b) {
    unsigned long long x = *(const unsigned long long*)a, y = *(const unsigned long long*)b;
    return x < y ? -1 : x > y;
}

// The GPU's dwte: keys, the sort, then every thread (i, c) of
// enc_dwte_kernel, forwards or backwards.
static void twin_encoder_dwte(float* dwte, const float* dout, const int* tokens, int N, int C, int v0,
                              int nrows, int backwards) {
    int bits = enc_row_bits(N);
    unsigned long long* keys = malloc((size_t)N * sizeof(*keys));
    for (int n = 0; n < N; n++) keys[n] = enc_key(tokens[n], n, bits);
    qsort(keys, (size_t)N, sizeof(*keys), cmp_u64);
    size_t total = (size_t)N * C;
    for (size_t t = 0; t < total; t++) {
        size_t i = backwards ? total - 1 - t : t;
        enc_dwte_thread(dwte, dout, keys, N, C, bits, v0, nrows, (int)(i / C), (int)(i % C));
    }
    free(keys);
}

static void test_encoder_case(const char* name, int N, int T, int C, int V, int spread) {
    int* tokens = malloc((size_t)N * sizeof(int));
    for (int n = 0; n < N; n++) tokens[n] = spread ? (int)(next_u32() % (unsigned)V) : V / 2;
    float* dout = randoms((size_t)N * C, 0);
    float* dwte0 = randoms((size_t)V * C, 0);  // backward accumulates: start from non-zero
    float* ref = copy_of(dwte0, (size_t)V * C);
    encoder_backward(ref, NULL, dout, tokens, N / T, T, C);
    char what[200];
    for (int backwards = 0; backwards < 2; backwards++) {
        float* got = copy_of(dwte0, (size_t)V * C);
        twin_encoder_dwte(got, dout, tokens, N, C, 0, 2147483647, backwards);
        snprintf(what, sizeof(what), "embedding backward twin (%s, N %d, C %d, V %d, threads %s) = encoder_backward bit for bit",
                 name, N, C, V, backwards ? "backwards" : "forwards");
        check(!memcmp(got, ref, (size_t)V * C * sizeof(float)), what, "dwte differs");
        free(got);
    }
    // the vocabulary-parallel op: shards of the table, the union the whole
    int shard = (V + 2) / 3;
    for (int v0 = 0; v0 < V; v0 += shard) {
        int nrows = V - v0 < shard ? V - v0 : shard;
        float* rv = copy_of(dwte0 + (size_t)v0 * C, (size_t)nrows * C);
        float* gv = copy_of(rv, (size_t)nrows * C);
        encoder_backward_vocab(rv, NULL, dout, tokens, N / T, T, C, v0, nrows);
        twin_encoder_dwte(gv, dout, tokens, N, C, v0, nrows, 0);
        snprintf(what, sizeof(what), "embedding backward twin (%s, N %d, shard rows %d..%d) = encoder_backward_vocab bit for bit",
                 name, N, v0, v0 + nrows - 1);
        check(!memcmp(gv, rv, (size_t)nrows * C * sizeof(float)), what, "dwte_shard differs");
        check(!memcmp(rv, ref + (size_t)v0 * C, (size_t)nrows * C * sizeof(float)),
              "  (and the shard equals those rows of the whole table's gradient)", "differs");
        free(rv), free(gv);
    }
    free(tokens), free(dout), free(dwte0), free(ref);
}

static void test_encoder(void) {
    // the keys: round trip at the sizes around a power of two
    int bad = 0;
    int sizes[] = {1, 2, 3, 4, 5, 255, 256, 257, 16384, 16385, 1 << 20, (1 << 20) + 1};
    for (size_t s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++) {
        int N = sizes[s], bits = enc_row_bits(N);
        int rows[] = {0, N / 2, N - 1};
        int toks[] = {0, 1, 50256, 2147483647};
        if ((1L << bits) < N || (bits > 0 && (1L << (bits - 1)) >= N)) bad++;
        for (int a = 0; a < 3; a++)
            for (int b = 0; b < 4; b++) {
                unsigned long long k = enc_key(toks[b], rows[a], bits);
                if (enc_key_token(k, bits) != toks[b] || enc_key_row(k, bits) != rows[a]) bad++;
                if (bits + 32 > 64) bad++;  // the sort's end bit
            }
    }
    check(!bad, "embedding keys: (token << bits) | row gives back token and row; bits the fewest that hold N - 1",
          "%d mismatches", bad);
    test_encoder_case("repeated tokens", 4 * 64, 64, 13, 7, 1);
    test_encoder_case("a larger vocabulary", 8 * 32, 32, 33, 300, 1);
    test_encoder_case("one token everywhere", 2 * 16, 16, 5, 9, 0);
    test_encoder_case("one row", 1, 1, 3, 4, 1);
    test_encoder_case("more than 16,384 rows", 5 * 4000, 4000, 3, 257, 1);
}

// ---------------------------------------------------------------- column sums

// COL_LANES values summed as column_lanes_sum's tree in shared memory does.
static float lanes_tree(float* v) {
    for (int half = COL_LANES / 2; half > 0; half /= 2)
        for (int y = 0; y < half; y++) v[y] += v[y + half];
    return v[0];
}

// The GPU's dbias: every block (tile, chunk) of bias_backward_kernel, then
// column_partials_kernel when there is more than one chunk.
static void twin_bias_backward(float* dbias, const float* dout, int N, int OC, int backwards) {
    int chunks = col_chunks(N, OC), tiles = (OC + COL_TILE - 1) / COL_TILE;
    float* partials = calloc((size_t)chunks * OC, sizeof(float));
    for (int b = 0; b < tiles * chunks; b++) {
        int blk = backwards ? tiles * chunks - 1 - b : b;
        int tile = blk % tiles, r = blk / tiles;
        for (int x = 0; x < COL_TILE; x++) {
            int k = tile * COL_TILE + x;
            if (k >= OC) continue;
            float lanes[COL_LANES];
            for (int y = 0; y < COL_LANES; y++) lanes[y] = col_lane_sum(dout, N, OC, k, r, y);
            float s = lanes_tree(lanes);
            if (chunks == 1) dbias[k] += s;
            else partials[(size_t)r * OC + k] = s;
        }
    }
    if (chunks > 1)
        for (int k = 0; k < OC; k++) dbias[k] += col_partials_sum(partials, chunks, OC, k);
    free(partials);
}

// LayerNorm's dw and db: layernorm_backward_dwdb_kernel's blocks, then the
// second pass for each.
static void twin_layernorm_dwdb(float* dw, float* db, const float* dout, const float* inp, const float* mean,
                                const float* rstd, int N, int C) {
    int chunks = col_chunks(N, C), tiles = (C + COL_TILE - 1) / COL_TILE;
    float* pw = calloc((size_t)chunks * C, sizeof(float));
    float* pb = calloc((size_t)chunks * C, sizeof(float));
    for (int r = 0; r < chunks; r++)
        for (int tile = 0; tile < tiles; tile++)
            for (int x = 0; x < COL_TILE; x++) {
                int c = tile * COL_TILE + x;
                if (c >= C) continue;
                float lw[COL_LANES], lb[COL_LANES];
                for (int y = 0; y < COL_LANES; y++)
                    col_lane_sum_ln(&lw[y], &lb[y], dout, inp, mean, rstd, N, C, c, r, y);
                float sw = lanes_tree(lw), sb = lanes_tree(lb);
                if (chunks == 1) {
                    dw[c] += sw;
                    db[c] += sb;
                } else {
                    pw[(size_t)r * C + c] = sw;
                    pb[(size_t)r * C + c] = sb;
                }
            }
    if (chunks > 1)
        for (int c = 0; c < C; c++) {
            dw[c] += col_partials_sum(pw, chunks, C, c);
            db[c] += col_partials_sum(pb, chunks, C, c);
        }
    free(pw), free(pb);
}

// |got - exact| <= (n - 1) u sum |x_i| + u |exact|: any order of n float
// additions (Higham, Accuracy and Stability, eq. 4.4), plus the final
// rounding into the gradient. exact and sum_abs in double.
static int within_sum_bound(float got, double exact, double sum_abs, long n) {
    double u = ldexp(1.0, -24);
    return fabs((double)got - exact) <= (double)(n > 1 ? n - 1 : 1) * u * sum_abs + u * fabs(exact) + 1e-30;
}

static void test_column_sums(void) {
    // the chunking: covers the rows, fits the partials and the grid
    int bad = 0;
    for (int N = 1; N < 300000; N = N * 3 / 2 + 1)
        for (int C = 1; C < 200000; C = C * 5 + 3) {
            int chunks = col_chunks(N, C), rows = col_chunk_rows(N, C);
            if (chunks < 1 || chunks > 65535 || (long)chunks * rows < N) bad++;
            if (chunks > 1 && (long)chunks * C > COL_MAX_PARTIALS) bad++;
            if ((long)N <= COL_CHUNK_ROWS && chunks != 1) bad++;
        }
    check(!bad, "column sums: the chunks cover every row, at most COL_MAX_PARTIALS partials, at most 65535 chunks",
          "%d bad shapes", bad);
    check(col_chunks(8192, 768) == 32, "column sums: N 8192, C 768 runs 24 tiles x 32 chunks (768 blocks, not 24)",
          "%d chunks", col_chunks(8192, 768));

    int shapes[][2] = {{1, 5}, {15, 33}, {16, 32}, {17, 70}, {256, 45}, {257, 45}, {1000, 67}, {5000, 96}, {70000, 3}};
    for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++) {
        int N = shapes[s][0], C = shapes[s][1];
        char what[200];
        // integer-valued: exact in any order, so the CPU's bits
        float* dout = randoms((size_t)N * C, 1);
        float* d0 = randoms((size_t)C, 1);
        float* ref = copy_of(d0, (size_t)C);
        matmul_backward(NULL, NULL, ref, dout, NULL, NULL, N, 1, C);
        for (int backwards = 0; backwards < 2; backwards++) {
            float* got = copy_of(d0, (size_t)C);
            twin_bias_backward(got, dout, N, C, backwards);
            snprintf(what, sizeof(what), "dbias twin (N %d, C %d, %d chunk%s, blocks %s), integer data: the CPU op's bits",
                     N, C, col_chunks(N, C), col_chunks(N, C) == 1 ? "" : "s", backwards ? "backwards" : "forwards");
            check(!memcmp(got, ref, (size_t)C * sizeof(float)), what, "dbias differs");
            free(got);
        }
        float* inp = randoms((size_t)N * C, 1);
        float* mean = malloc((size_t)N * sizeof(float));
        float* rstd = malloc((size_t)N * sizeof(float));
        for (int n = 0; n < N; n++) mean[n] = (float)((int)(next_u32() % 5) - 2), rstd[n] = n % 2 ? 1.0f : 0.5f;
        float *rw = copy_of(d0, (size_t)C), *rb = copy_of(d0, (size_t)C);
        float *gw = copy_of(d0, (size_t)C), *gb = copy_of(d0, (size_t)C);
        layernorm_backward(NULL, rw, rb, dout, inp, NULL, mean, rstd, N, C);
        twin_layernorm_dwdb(gw, gb, dout, inp, mean, rstd, N, C);
        snprintf(what, sizeof(what), "LayerNorm dw, db twin (N %d, C %d), integer data: the CPU op's bits", N, C);
        check(!memcmp(gw, rw, (size_t)C * sizeof(float)) && !memcmp(gb, rb, (size_t)C * sizeof(float)), what,
              "dw or db differs");
        free(rw), free(rb), free(gw), free(gb);
        free(dout), free(ref);
        // random: within the bound of any order
        dout = randoms((size_t)N * C, 0);
        float* got = copy_of(d0, (size_t)C);
        twin_bias_backward(got, dout, N, C, 0);
        int bad_cols = 0;
        for (int k = 0; k < C; k++) {
            double exact = d0[k], sum_abs = fabs(d0[k]);
            for (int n = 0; n < N; n++) exact += dout[(size_t)n * C + k], sum_abs += fabs(dout[(size_t)n * C + k]);
            if (!within_sum_bound(got[k], exact, sum_abs, N + 1)) bad_cols++;
        }
        snprintf(what, sizeof(what), "dbias twin (N %d, C %d), random data: within (n - 1) u sum |x| of the exact sum", N, C);
        check(!bad_cols, what, "%d columns outside", bad_cols);
        free(got), free(dout), free(inp), free(mean), free(rstd), free(d0);
    }
}

// ---------------------------------------------------------------- MoE gate gradient

// The GPU's dgates: a warp per (t, j); lanes, then the shuffle tree.
static void twin_dgates(float* dgates, const float* dout, const float* rows, const int* pos, int N, int k, int C,
                        int backwards) {
    size_t total = (size_t)N * k;
    for (size_t s = 0; s < total; s++) {
        size_t tj = backwards ? total - 1 - s : s;
        int r = pos[tj];
        if (r < 0) continue;
        float v[GATE_LANES];
        for (int l = 0; l < GATE_LANES; l++)
            v[l] = dgate_lane_sum(dout + (tj / k) * C, rows + (size_t)r * C, C, l);
        for (int offset = GATE_LANES / 2; offset > 0; offset /= 2)
            for (int l = 0; l < offset; l++) v[l] += v[l + offset];
        dgates[tj] += v[0];
    }
}

static void test_dgates(void) {
    int shapes[][3] = {{7, 2, 5}, {33, 2, 45}, {64, 1, 64}, {40, 3, 768}};
    for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++) {
        int N = shapes[s][0], k = shapes[s][1], C = shapes[s][2], R = N * k;
        char what[200];
        int* pos = malloc((size_t)N * k * sizeof(int));
        for (int i = 0; i < N * k; i++) pos[i] = next_u32() % 5 == 0 ? -1 : (int)(next_u32() % (unsigned)R);
        for (int integer = 1; integer >= 0; integer--) {
            float* dout = randoms((size_t)N * C, integer);
            float* rows = randoms((size_t)R * C, integer);
            float* g0 = randoms((size_t)N * k, integer);
            float* ref = copy_of(g0, (size_t)N * k);
            moe_combine_backward(NULL, ref, dout, rows, NULL, pos, N, k, C);
            float* got = copy_of(g0, (size_t)N * k);
            twin_dgates(got, dout, rows, pos, N, k, C, 0);
            float* back = copy_of(g0, (size_t)N * k);
            twin_dgates(back, dout, rows, pos, N, k, C, 1);
            int dropped_ok = 1;
            for (int i = 0; i < N * k; i++)
                if (pos[i] < 0 && memcmp(&got[i], &g0[i], sizeof(float))) dropped_ok = 0;
            if (integer) {
                snprintf(what, sizeof(what), "gate gradient twin (N %d, k %d, C %d), integer data: the CPU op's bits", N, k, C);
                check(!memcmp(got, ref, (size_t)N * k * sizeof(float)), what, "dgates differs");
            } else {
                int bad = 0;
                for (int i = 0; i < N * k; i++) {
                    if (pos[i] < 0) continue;
                    const float *d = dout + (size_t)(i / k) * C, *x = rows + (size_t)pos[i] * C;
                    double exact = g0[i], sum_abs = fabs(g0[i]);
                    for (int c = 0; c < C; c++) exact += (double)d[c] * x[c], sum_abs += fabs((double)d[c] * x[c]);
                    // C products (each rounded once: u |d x|) and C additions
                    if (!within_sum_bound(got[i], exact, 2 * sum_abs, C + 1)) bad++;
                }
                snprintf(what, sizeof(what), "gate gradient twin (N %d, k %d, C %d), random data: within C u sum |d x| of the exact dot",
                         N, k, C);
                check(!bad, what, "%d slots outside", bad);
                // a row's bits whatever slice of tokens the call holds
                int t0 = N / 3, n = N - t0;
                float* part = copy_of(g0 + (size_t)t0 * k, (size_t)n * k);
                twin_dgates(part, dout + (size_t)t0 * C, rows, pos + (size_t)t0 * k, n, k, C, 0);
                snprintf(what, sizeof(what), "gate gradient twin (N %d, k %d, C %d): tokens %d.. alone give the full call's bits",
                         N, k, C, t0);
                check(!memcmp(part, got + (size_t)t0 * k, (size_t)n * k * sizeof(float)), what, "differs");
                free(part);
            }
            check(!memcmp(got, back, (size_t)N * k * sizeof(float)) && dropped_ok,
                  "  (warps in either order: the same bits; dropped slots untouched)", "differs");
            free(dout), free(rows), free(g0), free(ref), free(got), free(back);
        }
        free(pos);
    }
}

int main(void) {
    device_init(0);
    device_set_threads(2);
    test_encoder();
    test_column_sums();
    test_dgates();
    printf("%d checks, %d failed\n", test_checks, test_failures);
    return test_exit_code();
}
