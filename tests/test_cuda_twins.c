// test_cuda_twins.c: the index logic of the CUDA ops' embedding backward, column
// sums, MoE gate gradient and attention in O(T) memory, run on the CPU.
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
//     holds, and dropped slots (pos < 0) untouched;
//   - the flash kernels (attention_flash_* and the chunk ops, one set of
//     kernels): each (query chunk, kv chunk) pair's partials and gradients
//     against a float64 evaluation and the CPU ops, at offsets, strides and
//     sizes that are not multiples of the tile, a chunk in the future (all
//     rows empty) and an empty one; a ring of chunks merged and finished
//     against the whole sequence; the chunk path on the whole sequence the
//     flash path's bits; merge and finish the CPU's bits.
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

// ---------------------------------------------------------------- attention in O(T) memory
// The kernels' grids emulated: every block (tile, h, b) in either order,
// and in a block each phase for every thread before the next phase (the
// __syncthreads() between them), threads in either order. Shared memory is
// poisoned with NaN at each block's start, so a value read before it is
// loaded shows in the results.

static float* poisoned_smem(int kind, int hs) {
    size_t n = flash_smem_floats(kind, hs);
    float* sm = malloc(n * sizeof(float));
    for (size_t x = 0; x < n; x++) sm[x] = NAN;
    return sm;
}

// block number s of n, x-major as CUDA's (tile, h, b), in the order asked
static void flash_block(int s, int n, int tiles, int NH, int backwards, int* x, int* h, int* b) {
    int blk = backwards ? n - 1 - s : s;
    *x = blk % tiles, *h = (blk / tiles) % NH, *b = blk / (tiles * NH);
}
#define FOR_THREADS(r, backwards) \
    for (int r_ = 0, r = (backwards) ? FLASH_TILE - 1 : 0; r_ < FLASH_TILE; r_++, r = (backwards) ? FLASH_TILE - 1 - r_ : r_)

static void twin_flash_forward(const FlashArgs* a, int B, int backwards) {
    const int hs = flash_hs(a), tiles = (a->Tq + FLASH_TILE - 1) / FLASH_TILE, n = tiles * a->NH * B;
    for (int s = 0; s < n; s++) {
        int x, h, b;
        flash_block(s, n, tiles, a->NH, backwards, &x, &h, &b);
        float* sm = poisoned_smem(FLASH_FWD, hs);
        FlashTiles t = flash_tiles(sm, FLASH_FWD, hs);
        const int i0 = x * FLASH_TILE;
        float m[FLASH_TILE], l[FLASH_TILE];
        FOR_THREADS(r, backwards) {
            flash_fwd_begin(a, t, b, h, i0, r);
            m[r] = -INFINITY, l[r] = 0.0f;
        }
        for (int j0 = 0; j0 < flash_key_end(a, i0); j0 += FLASH_TILE) {
            FOR_THREADS(r, backwards) flash_load_kv(a, t, b, h, j0, hs, r);
            FOR_THREADS(r, backwards) flash_fwd_step(a, t, i0, j0, r, &m[r], &l[r]);
        }
        FOR_THREADS(r, backwards) flash_fwd_end(a, t, b, h, i0, r, m[r], l[r]);
        free(sm);
    }
}

static void twin_flash_backward(const FlashArgs* a, int B, int backwards) {
    const int hs = flash_hs(a);
    int tiles = (a->Tk + FLASH_TILE - 1) / FLASH_TILE, n = tiles * a->NH * B;
    for (int s = 0; s < n; s++) {  // attention_flash_dkdv_kernel
        int x, h, b;
        flash_block(s, n, tiles, a->NH, backwards, &x, &h, &b);
        float* sm = poisoned_smem(FLASH_DKDV, hs);
        FlashTiles t = flash_tiles(sm, FLASH_DKDV, hs);
        const int j0 = x * FLASH_TILE;
        FOR_THREADS(r, backwards) flash_dkdv_begin(a, t, b, h, j0, r);
        for (int i0 = flash_first_query(a, j0); i0 < a->Tq; i0 += FLASH_TILE) {
            FOR_THREADS(r, backwards) flash_load_queries(a, t, b, h, i0, r);
            FOR_THREADS(r, backwards) flash_dkdv_step(a, t, i0, j0, r);
        }
        FOR_THREADS(r, backwards) flash_dkdv_end(a, t, b, h, j0, r);
        free(sm);
    }
    tiles = (a->Tq + FLASH_TILE - 1) / FLASH_TILE, n = tiles * a->NH * B;
    for (int s = 0; s < n; s++) {  // attention_flash_dq_kernel
        int x, h, b;
        flash_block(s, n, tiles, a->NH, backwards, &x, &h, &b);
        float* sm = poisoned_smem(FLASH_DQ, hs);
        FlashTiles t = flash_tiles(sm, FLASH_DQ, hs);
        const int i0 = x * FLASH_TILE;
        FOR_THREADS(r, backwards) flash_dq_begin(a, t, b, h, i0, r);
        for (int j0 = 0; j0 < flash_key_end(a, i0); j0 += FLASH_TILE) {
            FOR_THREADS(r, backwards) flash_load_kv(a, t, b, h, j0, hs, r);
            FOR_THREADS(r, backwards) flash_dq_step(a, t, i0, j0, r);
        }
        FOR_THREADS(r, backwards) flash_dq_end(a, t, b, h, i0, r);
        free(sm);
    }
}

// The arguments ops_flash.cu builds for a pair (flash_pair there).
static FlashArgs pair_args(const float* q, int q_stride, const float* k, const float* v, int kv_stride, int Tq, int Tk,
                           int q0, int k0, int C, int NH) {
    FlashArgs a;
    memset(&a, 0, sizeof(a));
    a.q = q, a.k = k, a.v = v, a.q_stride = q_stride, a.kv_stride = kv_stride;
    a.Tq = Tq, a.Tk = Tk, a.q0 = q0, a.k0 = k0, a.C = C, a.NH = NH;
    a.scale = 1.0f / sqrtf((float)(C / NH));
    return a;
}

// A pair in float64, straight from the definitions in common/ops.h:
// forward partials (m, l, o unnormalised; -inf, 0, 0 for an empty row) and
// the backward's dq, dk, dv (added to what they hold) from out, lse, dout.
static void ref_pair(double* o, double* m, double* l, double* dq, double* dk, double* dv, const FlashArgs* a,
                     const float* out, const float* lse, const float* dout, int B) {
    const int hs = flash_hs(a), NH = a->NH, C = a->C;
    const double scale = 1.0 / sqrt((double)hs);
    double* s = malloc((size_t)(a->Tk > 0 ? a->Tk : 1) * sizeof(double));
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int i = 0; i < a->Tq; i++) {
                const float* qi = a->q + ((size_t)b * a->Tq + i) * a->q_stride + h * hs;
                const size_t st = ((size_t)b * a->Tq + i) * NH + h, oo = ((size_t)b * a->Tq + i) * C + h * hs;
                int nv = a->q0 + i - a->k0 + 1;
                nv = nv < 0 ? 0 : (nv > a->Tk ? a->Tk : nv);
                double mx = -INFINITY, sum = 0.0, D = 0.0;
                for (int j = 0; j < nv; j++) {
                    const float* kj = a->k + ((size_t)b * a->Tk + j) * a->kv_stride + h * hs;
                    s[j] = 0.0;
                    for (int c = 0; c < hs; c++) s[j] += (double)qi[c] * kj[c];
                    s[j] *= scale;
                    mx = s[j] > mx ? s[j] : mx;
                }
                for (int c = 0; c < hs; c++) o[oo + c] = 0.0;
                for (int j = 0; j < nv; j++) {
                    const float* vj = a->v + ((size_t)b * a->Tk + j) * a->kv_stride + h * hs;
                    double e = exp(s[j] - mx);
                    sum += e;
                    for (int c = 0; c < hs; c++) o[oo + c] += e * vj[c];
                }
                m[st] = mx, l[st] = sum;
                if (!dq) continue;
                for (int c = 0; c < hs; c++) D += (double)dout[oo + c] * out[oo + c];
                for (int j = 0; j < nv; j++) {
                    const size_t kv = ((size_t)b * a->Tk + j) * a->kv_stride + h * hs;
                    const float* kj = a->k + kv;
                    const float* vj = a->v + kv;
                    double p = exp(s[j] - (double)lse[st]), dp = 0.0;
                    for (int c = 0; c < hs; c++) dp += (double)dout[oo + c] * vj[c];
                    double ds = p * (dp - D) * scale;
                    for (int c = 0; c < hs; c++) {
                        dq[((size_t)b * a->Tq + i) * a->q_stride + h * hs + c] += ds * kj[c];
                        dk[kv + c] += ds * qi[c];
                        dv[kv + c] += p * dout[oo + c];
                    }
                }
            }
    free(s);
}

// max |got - ref| / (max |ref| + 1e-6) over n values, -inf only where the
// other has it too (else 1e30)
static double rel_err_fd(const float* got, const double* ref, size_t n) {
    double d = 0.0, scale = 0.0;
    for (size_t x = 0; x < n; x++) {
        if (isinf(ref[x]) || isinf(got[x])) {
            if (!(isinf(ref[x]) && isinf(got[x]) && ref[x] < 0 && got[x] < 0)) return 1e30;
            continue;
        }
        double e = fabs((double)got[x] - ref[x]);
        if (isnan(e)) return 1e30;
        d = e > d ? e : d;
        scale = fabs(ref[x]) > scale ? fabs(ref[x]) : scale;
    }
    return d / (scale + 1e-6);
}
static double rel_err_f32(const float* got, const float* ref, size_t n) {
    double* r = malloc(n * sizeof(double));
    for (size_t x = 0; x < n; x++) r[x] = ref[x];
    double e = rel_err_fd(got, r, n);
    free(r);
    return e;
}
static double* to_double(const float* x, size_t n) {
    double* d = malloc(n * sizeof(double));
    for (size_t i = 0; i < n; i++) d[i] = x[i];
    return d;
}

// As tests/test_ops.c: fp32 sums of a few dozen terms are off by ~1e-7 of
// their scale; a wrong index or a missing term, by 1e-3 or more.
#define FLASH_TOL 1e-5

// One pair: queries from a (B, Tq, 3C) qkv (stride 3C), keys and values
// from a packed (B, Tk, 2C) [k | v] buffer (stride 2C), as the ring passes
// them. Forward partials, then backward with out and lse finished from this
// pair alone (the pair as a whole sequence of its own, which the backward's
// formulas do not care about).
static void test_flash_pair(const char* name, int B, int Tq, int Tk, int q0, int k0, int C, int NH) {
    const size_t QKV = (size_t)B * Tq * 3 * C, KV = (size_t)B * Tk * 2 * C + 1, OUT = (size_t)B * Tq * C,
                 ST = (size_t)B * Tq * NH;
    float* qkv = randoms(QKV, 0);
    float* kv = randoms(KV, 0);
    for (size_t x = 0; x < QKV; x++) qkv[x] *= 1.5f;
    float* dout = randoms(OUT, 0);
    FlashArgs a = pair_args(qkv, 3 * C, kv, kv + C, 2 * C, Tq, Tk, q0, k0, C, NH);
    float *out = malloc(OUT * sizeof(float)), *m = malloc(ST * sizeof(float)), *l = malloc(ST * sizeof(float));
    for (size_t x = 0; x < OUT; x++) out[x] = NAN;  // every row must be written
    for (size_t x = 0; x < ST; x++) m[x] = l[x] = NAN;
    a.out = out, a.stat_m = m, a.stat_l = l, a.finish = 0;
    twin_flash_forward(&a, B, 0);
    double *ro = malloc(OUT * sizeof(double)), *rm = malloc(ST * sizeof(double)), *rl = malloc(ST * sizeof(double));
    ref_pair(ro, rm, rl, NULL, NULL, NULL, &a, NULL, NULL, NULL, B);
    double e = fmax(rel_err_fd(out, ro, OUT), fmax(rel_err_fd(m, rm, ST), rel_err_fd(l, rl, ST)));
    char what[240];
    int empty = 0;
    for (size_t x = 0; x < ST; x++) empty += rl[x] == 0.0;
    snprintf(what, sizeof(what), "flash forward twin, %s (B %d, Tq %d at %d, Tk %d at %d, hs %d; %d of %zu rows empty): partials vs float64",
             name, B, Tq, q0, Tk, k0, C / NH, empty, ST);
    check(e <= FLASH_TOL, what, "relative error %.3g", e);
    // the CPU op
    float *cout = malloc(OUT * sizeof(float)), *cm = malloc(ST * sizeof(float)), *cl = malloc(ST * sizeof(float));
    attention_chunk_forward(cout, cm, cl, qkv, 3 * C, kv, kv + C, 2 * C, B, Tq, Tk, q0, k0, C, NH);
    e = fmax(rel_err_f32(out, cout, OUT), fmax(rel_err_f32(m, cm, ST), rel_err_f32(l, cl, ST)));
    check(e <= FLASH_TOL, "  (and vs the CPU's attention_chunk_forward, empty rows alike)", "relative error %.3g", e);
    // blocks and threads in the other order: the same bits
    float *out2 = malloc(OUT * sizeof(float)), *m2 = malloc(ST * sizeof(float)), *l2 = malloc(ST * sizeof(float));
    a.out = out2, a.stat_m = m2, a.stat_l = l2;
    twin_flash_forward(&a, B, 1);
    check(!memcmp(out, out2, OUT * sizeof(float)) && !memcmp(m, m2, ST * sizeof(float)) &&
              !memcmp(l, l2, ST * sizeof(float)),
          "  (blocks and threads backwards: the same bits)", "differs");

    // backward on the finished pair, accumulating onto random gradients
    if (Tk > 0) {
        attention_chunk_finish(cout, cm, cm, cl, B, Tq, C, NH);  // cout, lse = cm
        float* g0q = randoms(QKV, 0);
        float* g0kv = randoms(KV, 0);
        float *gq = copy_of(g0q, QKV), *gkv = copy_of(g0kv, KV);
        a.out = cout, a.lse = cm, a.dout = dout, a.dq = gq, a.dk = gkv, a.dv = gkv + C;
        twin_flash_backward(&a, B, 0);
        double *rq = to_double(g0q, QKV), *rkv = to_double(g0kv, KV);
        ref_pair(ro, rm, rl, rq, rkv, rkv + C, &a, cout, cm, dout, B);
        e = fmax(rel_err_fd(gq, rq, QKV), rel_err_fd(gkv, rkv, KV));
        snprintf(what, sizeof(what), "flash backward twin, %s: dq, dk, dv added to what they held vs float64", name);
        check(e <= FLASH_TOL, what, "relative error %.3g", e);
        float *cq = copy_of(g0q, QKV), *ckv = copy_of(g0kv, KV);
        attention_chunk_backward(cq, ckv, ckv + C, dout, cout, cm, qkv, 3 * C, kv, kv + C, 2 * C, B, Tq, Tk, q0, k0,
                                 C, NH);
        e = fmax(rel_err_f32(gq, cq, QKV), rel_err_f32(gkv, ckv, KV));
        check(e <= FLASH_TOL, "  (and vs the CPU's attention_chunk_backward)", "relative error %.3g", e);
        float *bq = copy_of(g0q, QKV), *bkv = copy_of(g0kv, KV);
        a.dq = bq, a.dk = bkv, a.dv = bkv + C;
        twin_flash_backward(&a, B, 1);
        check(!memcmp(gq, bq, QKV * sizeof(float)) && !memcmp(gkv, bkv, KV * sizeof(float)),
              "  (blocks and threads backwards: the same bits)", "differs");
        free(g0q), free(g0kv), free(gq), free(gkv), free(rq), free(rkv), free(cq), free(ckv), free(bq), free(bkv);
    }
    free(qkv), free(kv), free(dout), free(out), free(m), free(l), free(ro), free(rm), free(rl);
    free(cout), free(cm), free(cl), free(out2), free(m2), free(l2);
}

// rows [t0, t0 + n) of each batch row of a (B, T, w) tensor, as a (B, n, w) one
static float* rows_of(const float* x, int B, int T, int w, int t0, int n) {
    float* y = malloc(((size_t)B * n * w + 1) * sizeof(float));
    for (int b = 0; b < B; b++)
        memcpy(y + (size_t)b * n * w, x + ((size_t)b * T + t0) * w, (size_t)n * w * sizeof(float));
    return y;
}

// A ring: the sequence cut into chunks (sizes sz), each query chunk meeting
// every kv chunk in order, partials merged and finished (flash_merge_row and
// flash_finish_row, the kernels' bodies), then every pair's backward. The
// result against the CPU's attention_flash_* on the whole sequence.
static void test_flash_ring(int B, const int* sz, int n, int C, int NH) {
    int T = 0;
    for (int c = 0; c < n; c++) T += sz[c];
    const int hs = C / NH;
    const size_t QKV = (size_t)B * T * 3 * C, OUT = (size_t)B * T * C, ST = (size_t)B * T * NH;
    float* qkv = randoms(QKV, 0);
    for (size_t x = 0; x < QKV; x++) qkv[x] *= 1.5f;
    float* dout = randoms(OUT, 0);
    float *out = malloc(OUT * sizeof(float)), *lse = malloc(ST * sizeof(float));
    float* dqkv = calloc(QKV, sizeof(float));
    attention_flash_forward(out, lse, qkv, B, T, C, NH);
    attention_flash_backward(dqkv, dout, qkv, out, lse, B, T, C, NH);
    float *rout = calloc(OUT, sizeof(float)), *rlse = calloc(ST, sizeof(float)), *rdqkv = calloc(QKV, sizeof(float));
    for (int qc = 0, q0 = 0; qc < n; q0 += sz[qc++]) {
        const int Tq = sz[qc];
        float* q = rows_of(qkv, B, T, 3 * C, q0, Tq);
        float* dq = calloc((size_t)B * Tq * 3 * C, sizeof(float));
        float *o = malloc((size_t)B * Tq * C * sizeof(float)), *m = malloc((size_t)B * Tq * NH * sizeof(float));
        float *l = malloc((size_t)B * Tq * NH * sizeof(float)), *o2 = malloc((size_t)B * Tq * C * sizeof(float));
        float *m2 = malloc((size_t)B * Tq * NH * sizeof(float)), *l2 = malloc((size_t)B * Tq * NH * sizeof(float));
        for (int pass = 0; pass < 2; pass++) {  // forward over all kv chunks, then backward
            for (int kc = 0, k0 = 0; kc < n; k0 += sz[kc++]) {
                const int Tk = sz[kc];
                float* kvall = rows_of(qkv, B, T, 3 * C, k0, Tk);  // its k and v columns, stride 3C
                float* dkv = calloc((size_t)B * Tk * 3 * C, sizeof(float));
                FlashArgs a = pair_args(q, 3 * C, kvall + C, kvall + 2 * C, 3 * C, Tq, Tk, q0, k0, C, NH);
                if (pass == 0) {
                    a.out = kc == 0 ? o : o2, a.stat_m = kc == 0 ? m : m2, a.stat_l = kc == 0 ? l : l2;
                    twin_flash_forward(&a, B, 0);
                    if (kc > 0)
                        for (size_t r = 0; r < (size_t)B * Tq * NH; r++) flash_merge_row(o, m, l, o2, m2, l2, r, hs);
                } else {
                    a.out = o, a.lse = m, a.dout = rows_of(dout, B, T, C, q0, Tq);
                    a.dq = dq, a.dk = dkv + C, a.dv = dkv + 2 * C;
                    twin_flash_backward(&a, B, 0);
                    free((float*)a.dout);
                    for (int b = 0; b < B; b++)
                        for (size_t x = 0; x < (size_t)Tk * 3 * C; x++)
                            if (x % (3 * C) >= (size_t)C) rdqkv[((size_t)b * T + k0) * 3 * C + x] += dkv[(size_t)b * Tk * 3 * C + x];
                }
                free(kvall), free(dkv);
            }
            if (pass == 0) {
                for (size_t r = 0; r < (size_t)B * Tq * NH; r++) flash_finish_row(o, m, m, l, r, hs);
                for (int b = 0; b < B; b++) {
                    memcpy(rout + ((size_t)b * T + q0) * C, o + (size_t)b * Tq * C, (size_t)Tq * C * sizeof(float));
                    memcpy(rlse + ((size_t)b * T + q0) * NH, m + (size_t)b * Tq * NH, (size_t)Tq * NH * sizeof(float));
                }
            }
        }
        for (int b = 0; b < B; b++)
            for (size_t x = 0; x < (size_t)Tq * 3 * C; x++)
                if (x % (3 * C) < (size_t)C) rdqkv[((size_t)b * T + q0) * 3 * C + x] += dq[(size_t)b * Tq * 3 * C + x];
        free(q), free(dq), free(o), free(m), free(l), free(o2), free(m2), free(l2);
    }
    char what[240], cuts[64] = "";
    for (int c = 0; c < n; c++) snprintf(cuts + strlen(cuts), sizeof(cuts) - strlen(cuts), "%s%d", c ? "+" : "", sz[c]);
    double e = fmax(rel_err_f32(rout, out, OUT), rel_err_f32(rlse, lse, ST));
    snprintf(what, sizeof(what), "flash twin as a ring (B %d, T %s, hs %d): pairs merged and finished = the CPU's attention_flash_forward",
             B, cuts, hs);
    check(e <= FLASH_TOL, what, "relative error %.3g", e);
    e = rel_err_f32(rdqkv, dqkv, QKV);
    check(e <= FLASH_TOL, "  (and the pairs' backward summed = attention_flash_backward's dqkv)", "relative error %.3g", e);
    free(qkv), free(dout), free(out), free(lse), free(dqkv), free(rout), free(rlse), free(rdqkv);
}

// One algorithm at two scales, in the kernels: the chunk ops' arguments for
// the whole sequence (one chunk at 0, finished by merge's sibling
// flash_finish_row) and attention_flash_*'s (finished in the kernel) give
// the same bits.
static void test_flash_whole(int B, int T, int C, int NH) {
    const size_t QKV = (size_t)B * T * 3 * C, OUT = (size_t)B * T * C, ST = (size_t)B * T * NH;
    float* qkv = randoms(QKV, 0);
    float* dout = randoms(OUT, 0);
    float *o1 = malloc(OUT * sizeof(float)), *lse1 = malloc(ST * sizeof(float));
    float *o2 = malloc(OUT * sizeof(float)), *m2 = malloc(ST * sizeof(float)), *l2 = malloc(ST * sizeof(float));
    FlashArgs a = pair_args(qkv, 3 * C, qkv + C, qkv + 2 * C, 3 * C, T, T, 0, 0, C, NH);  // ops_flash.cu's flash_whole
    a.out = o1, a.stat_m = lse1, a.finish = 1;
    twin_flash_forward(&a, B, 0);
    FlashArgs c = a;
    c.out = o2, c.stat_m = m2, c.stat_l = l2, c.finish = 0;
    twin_flash_forward(&c, B, 0);
    for (size_t r = 0; r < ST; r++) flash_finish_row(o2, m2, m2, l2, r, C / NH);
    char what[200];
    snprintf(what, sizeof(what), "flash twin (B %d, T %d, hs %d): the chunk path on one chunk of the whole sequence = the flash path, bit for bit",
             B, T, C / NH);
    check(!memcmp(o1, o2, OUT * sizeof(float)) && !memcmp(lse1, m2, ST * sizeof(float)), what, "out or lse differ");
    float *cout = malloc(OUT * sizeof(float)), *clse = malloc(ST * sizeof(float));
    attention_flash_forward(cout, clse, qkv, B, T, C, NH);
    double e = fmax(rel_err_f32(o1, cout, OUT), rel_err_f32(lse1, clse, ST));
    check(e <= FLASH_TOL, "  (and within 1e-5 of the CPU's attention_flash_forward)", "relative error %.3g", e);
    float* g = calloc(QKV, sizeof(float));
    float* cg = calloc(QKV, sizeof(float));
    a.lse = lse1, a.dout = dout, a.dq = g, a.dk = g + C, a.dv = g + 2 * C;
    twin_flash_backward(&a, B, 0);
    attention_flash_backward(cg, dout, qkv, o1, lse1, B, T, C, NH);
    e = rel_err_f32(g, cg, QKV);
    check(e <= FLASH_TOL, "  (backward into one dqkv buffer within 1e-5 of the CPU's attention_flash_backward)",
          "relative error %.3g", e);
    free(qkv), free(dout), free(o1), free(lse1), free(o2), free(m2), free(l2), free(cout), free(clse), free(g), free(cg);
}

// merge and finish: the kernels' row bodies give the CPU ops' bits, with
// rows empty on one side, the other, and both.
static void test_flash_merge(void) {
    const int B = 2, Tq = 9, C = 12, NH = 3, hs = C / NH;
    const size_t ST = (size_t)B * Tq * NH, OUT = (size_t)B * Tq * C;
    float *o = randoms(OUT, 0), *o2 = randoms(OUT, 0), *m = randoms(ST, 0), *m2 = randoms(ST, 0);
    float *l = malloc(ST * sizeof(float)), *l2 = malloc(ST * sizeof(float));
    for (size_t r = 0; r < ST; r++) {
        l[r] = 1.0f + (float)(r % 5), l2[r] = 2.0f + (float)(r % 3);
        if (r % 4 == 1 || r % 4 == 3) l[r] = 0.0f, m[r] = -INFINITY;    // empty on the left (and both: 3)
        if (r % 4 == 2 || r % 4 == 3) l2[r] = 0.0f, m2[r] = -INFINITY;  // on the right
        for (int c = 0; c < hs; c++) {
            if (l[r] == 0.0f) o[r * hs + c] = 0.0f;
            if (l2[r] == 0.0f) o2[r * hs + c] = 0.0f;
        }
    }
    float *to = copy_of(o, OUT), *tm = copy_of(m, ST), *tl = copy_of(l, ST);
    attention_chunk_merge(o, m, l, o2, m2, l2, B, Tq, C, NH);
    for (size_t r = 0; r < ST; r++) flash_merge_row(to, tm, tl, o2, m2, l2, r, hs);
    int same = !memcmp(o, to, OUT * sizeof(float)) && !memcmp(m, tm, ST * sizeof(float)) &&
               !memcmp(l, tl, ST * sizeof(float));
    int nan = 0;
    for (size_t x = 0; x < OUT; x++) nan += isnan(to[x]);
    check(same && !nan, "flash merge twin = attention_chunk_merge bit for bit, rows empty on either side or both (no NaN)",
          "%s, %d NaN", same ? "same" : "differs", nan);
    float* lse = malloc(ST * sizeof(float));
    attention_chunk_finish(o, lse, m, l, B, Tq, C, NH);
    for (size_t r = 0; r < ST; r++) flash_finish_row(to, tm, tm, tl, r, hs);  // in place, as chapter 6 calls it
    check(!memcmp(o, to, OUT * sizeof(float)) && !memcmp(lse, tm, ST * sizeof(float)),
          "flash finish twin = attention_chunk_finish bit for bit (lse in place of rowmax; -inf for an empty row)",
          "differs");
    free(o), free(o2), free(m), free(m2), free(l), free(l2), free(to), free(tm), free(tl), free(lse);
}

static void test_flash(void) {
    // shared memory: the regions of each kernel tile flash_smem_floats exactly
    int bad = 0;
    for (int hs = 1; hs <= 256; hs++) {
        float* sm = malloc((flash_smem_floats(FLASH_FWD, hs) + flash_smem_floats(FLASH_DKDV, hs) +
                            flash_smem_floats(FLASH_DQ, hs)) * sizeof(float));
        FlashTiles f = flash_tiles(sm, FLASH_FWD, hs), k = flash_tiles(sm, FLASH_DKDV, hs),
                   q = flash_tiles(sm, FLASH_DQ, hs);
        size_t bc = (size_t)FLASH_TILE * hs;
        if ((size_t)(f.vs - sm) + bc != flash_smem_floats(FLASH_FWD, hs)) bad++;
        if ((size_t)(k.Ds - sm) + FLASH_TILE != flash_smem_floats(FLASH_DKDV, hs)) bad++;
        if ((size_t)(q.Ds - sm) + FLASH_TILE != flash_smem_floats(FLASH_DQ, hs)) bad++;
        free(sm);
    }
    check(!bad, "flash shared memory: each kernel's tiles end at flash_smem_floats (hs 1..256)", "%d sizes off", bad);
    // the pairs a ring of chapter 6 meets (zigzag's half-chunks give the
    // partial overlaps), not multiples of the tile of 32
    test_flash_pair("diagonal pair", 2, 37, 37, 37, 37, 24, 2);
    test_flash_pair("diagonal pair, hs 64, three tiles", 1, 70, 70, 70, 70, 128, 2);
    test_flash_pair("past chunk, whole rectangle", 2, 40, 33, 80, 0, 24, 2);
    test_flash_pair("partial overlap (zigzag)", 2, 45, 70, 30, 10, 24, 3);
    test_flash_pair("partial overlap, the first rows empty", 2, 45, 70, 10, 30, 24, 3);
    test_flash_pair("kv chunk longer, ahead of the queries' start", 1, 33, 65, 0, 0, 16, 4);
    test_flash_pair("future chunk: every row empty", 2, 20, 30, 0, 50, 24, 2);
    test_flash_pair("empty kv chunk (Tk 0)", 2, 5, 0, 0, 0, 24, 2);
    test_flash_pair("one query, one key", 1, 1, 1, 7, 7, 8, 2);
    int ring3[] = {30, 33, 37};
    test_flash_ring(2, ring3, 3, 24, 2);
    int zig4[] = {16, 16, 16, 16};  // a zigzag of 2 ranks cuts 4 half-chunks
    test_flash_ring(1, zig4, 4, 32, 2);
    test_flash_whole(2, 65, 24, 2);
    test_flash_whole(1, 100, 128, 2);
    test_flash_merge();
}

int main(void) {
    device_init(0);
    device_set_threads(2);
    test_encoder();
    test_column_sums();
    test_dgates();
    test_flash();
    printf("%d checks, %d failed\n", test_checks, test_failures);
    return test_exit_code();
}
