// test_ring.c: chapter 6's ring attention (06_sequence_context/ring.h) over
// a simulated ring, no MPI: every cp rank's rows are cut out of one random
// batch, and each rank meets the K/V blocks in the ring's order (its own,
// then r-1, r-2, ...), exactly the calls main.c makes between its sends.
// The dK/dV sums go around as on the ring (rank src first, then src+1, ...,
// each adding its share to what arrived). Forward and backward must equal
// whole-sequence attention (attention_forward / attention_backward) on the
// same batch, for several (T, cp) and both balances; and the work per rank
// (unmasked scores) must be equal under zigzag.
//   build/tests/test_ring
//
// modules: 06_sequence_context/ring
// run by: tests/chapter_6.sh
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "memory.h"
#include "device.h"
#include "ops.h"
#include "ring.h"
#include "runtime.h"
#include "test.h"

// The op tests' bound for a forward against a reference (tests/test_ops.c):
// max|a - b| / max|b|.
#define TOL 1e-5

static uint64_t rng_state = 0x2545F4914F6CDD1Dull;
static float rng_uniform(void) {  // [-1, 1)
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (float)((double)(rng_state >> 11) * (2.0 / 9007199254740992.0) - 1.0);
}

static double rel_err(const float* a, const float* b, size_t n) {
    double m = 0.0, s = 0.0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (isnan(d)) return NAN;
        m = fmax(m, d);
        s = fmax(s, fabs((double)b[i]));
    }
    return m / (s + 1e-6);
}

// Row i of rank sh's layout <-> row of the (B, T, width) batch.
static size_t global_row(const CPShard* sh, size_t i) {
    size_t part_rows = (size_t)sh->B * sh->len;
    int p = (int)(i / part_rows), b = (int)(i % part_rows / sh->len), t = (int)(i % sh->len);
    return (size_t)b * sh->T + cp_shard_pos(sh, sh->rank, p) + t;
}
static void gather_rows(const CPShard* sh, float* dst, const float* src, int width) {
    for (size_t i = 0; i < (size_t)sh->B * sh->T / sh->cp; i++)
        memcpy(dst + i * width, src + global_row(sh, i) * width, (size_t)width * sizeof(float));
}
static void scatter_rows(const CPShard* sh, float* dst, const float* src, int width) {
    for (size_t i = 0; i < (size_t)sh->B * sh->T / sh->cp; i++)
        memcpy(dst + global_row(sh, i) * width, src + i * width, (size_t)width * sizeof(float));
}

static void ring_case(int B, int T, int C, int NH, int n, int zigzag) {
    const size_t BT = (size_t)B * T, N = BT / n;
    float* qkv = xmalloc(BT * 3 * C * sizeof(float));
    float* dout = xmalloc(BT * C * sizeof(float));
    for (size_t i = 0; i < BT * 3 * C; i++) qkv[i] = 1.5f * rng_uniform();  // a clearly non-uniform softmax
    for (size_t i = 0; i < BT * C; i++) dout[i] = rng_uniform();
    // the whole sequence
    float* out = xcalloc(BT * C, sizeof(float));
    float* att = xcalloc(BT * NH * T, sizeof(float));
    float* datt = xcalloc(BT * NH * T, sizeof(float));
    float* dqkv = xcalloc(BT * 3 * C, sizeof(float));
    attention_forward(out, att, qkv, B, T, C, NH);
    attention_backward(dqkv, datt, dout, qkv, att, B, T, C, NH);
    // the ring: every rank's rows, its packed K/V, its forward state
    CPShard sh[8];
    float *q_r[8], *do_r[8], *kv_r[8], *y_r[8], *lse_r[8], *dq_r[8], *acc[8];
    RingForward f[8];
    long work[8];
    for (int r = 0; r < n; r++) {
        sh[r] = (CPShard){.cp = n, .rank = r, .parts = zigzag ? 2 : 1, .len = zigzag ? T / (2 * n) : T / n,
                          .B = B, .T = T};
        q_r[r] = xmalloc(N * 3 * C * sizeof(float));
        do_r[r] = xmalloc(N * C * sizeof(float));
        kv_r[r] = xmalloc(N * 2 * C * sizeof(float));
        y_r[r] = xmalloc(N * C * sizeof(float));
        lse_r[r] = xmalloc(N * NH * sizeof(float));
        dq_r[r] = xcalloc(N * 3 * C, sizeof(float));
        acc[r] = xcalloc(N * 2 * C, sizeof(float));
        f[r] = (RingForward){.o2 = xmalloc(N * C * sizeof(float)), .m2 = xmalloc(N * NH * sizeof(float)),
                             .l2 = xmalloc(N * NH * sizeof(float)), .sumexp = xmalloc(N * NH * sizeof(float))};
        gather_rows(&sh[r], q_r[r], qkv, 3 * C);
        gather_rows(&sh[r], do_r[r], dout, C);
        ops_copy_2d(kv_r[r], 2 * C, q_r[r] + C, 3 * C, (int)N, 2 * C);
    }
    // forward: rank r meets the blocks of r, r-1, ..., r+1
    for (int r = 0; r < n; r++) {
        ring_forward_begin(&f[r]);
        for (int s = 0; s < n; s++) {
            int src = (r - s + n) % n;
            ring_forward_block(&sh[r], &f[r], q_r[r], kv_r[src], src, y_r[r], lse_r[r], C, NH);
        }
        ring_forward_finish(&sh[r], &f[r], y_r[r], lse_r[r], C, NH);
        work[r] = f[r].scores;
    }
    // backward: src's dK|dV partial sum visits ranks src, src+1, ..., src-1,
    // each adding its queries' share to what arrived, then goes home
    float* part = xmalloc(N * 2 * C * sizeof(float));
    for (int src = 0; src < n; src++) {
        memset(acc[src], 0, N * 2 * C * sizeof(float));
        for (int j = 0; j < n; j++) {
            int r = (src + j) % n;
            memset(part, 0, N * 2 * C * sizeof(float));
            ring_backward_block(&sh[r], q_r[r], y_r[r], lse_r[r], do_r[r], kv_r[src], src, dq_r[r], part, C, NH);
            ops_add(part, acc[src], N * 2 * C);
            memcpy(acc[src], part, N * 2 * C * sizeof(float));
        }
    }
    float* out_ring = xcalloc(BT * C, sizeof(float));
    float* dqkv_ring = xcalloc(BT * 3 * C, sizeof(float));
    for (int r = 0; r < n; r++) {
        ops_copy_2d(dq_r[r] + C, 3 * C, acc[r], 2 * C, (int)N, 2 * C);  // dK|dV home
        scatter_rows(&sh[r], out_ring, y_r[r], C);
        scatter_rows(&sh[r], dqkv_ring, dq_r[r], 3 * C);
    }
    char name[160];
    const char* bal = zigzag ? "zigzag" : "none";
    snprintf(name, sizeof name, "ring forward = whole-sequence attention, T=%d cp=%d %s", T, n, bal);
    double e = rel_err(out_ring, out, BT * C);
    check(e <= TOL, name, "error %.3g exceeds %.3g", e, TOL);
    snprintf(name, sizeof name, "ring backward (dQ, and dK/dV home) = whole-sequence attention_backward, T=%d cp=%d %s",
             T, n, bal);
    e = rel_err(dqkv_ring, dqkv, BT * 3 * C);
    check(e <= TOL, name, "error %.3g exceeds %.3g", e, TOL);
    // the work: the causal triangle per (sequence, head) is T(T+1)/2 in all;
    // zigzag cuts it into equal shares
    long total = 0, lo = work[0], hi = work[0];
    for (int r = 0; r < n; r++) total += work[r], lo = work[r] < lo ? work[r] : lo, hi = work[r] > hi ? work[r] : hi;
    snprintf(name, sizeof name, "ring scores sum to T(T+1)/2 = %ld%s, T=%d cp=%d %s", (long)T * (T + 1) / 2,
             zigzag ? ", equal on every rank" : "", T, n, bal);
    check(total == (long)T * (T + 1) / 2 && (!zigzag || lo == hi), name, "total %ld, per rank %ld..%ld", total, lo, hi);
    for (int r = 0; r < n; r++) {
        free(q_r[r]), free(do_r[r]), free(kv_r[r]), free(y_r[r]), free(lse_r[r]), free(dq_r[r]), free(acc[r]);
        free(f[r].o2), free(f[r].m2), free(f[r].l2), free(f[r].sumexp);
    }
    free(part), free(qkv), free(dout), free(out), free(att), free(datt), free(dqkv), free(out_ring), free(dqkv_ring);
}

// Every position of a sequence maps back to the rank and row that hold it:
// cp_shard_owner inverts cp_shard_pos (the capstone's --sample finds its row
// of logits by it; no training path does, so only --sample's runs saw a
// boundary off by one there, a planted bug's review found).
static void owner_case(int B, int T, int n, int zigzag) {
    int len = zigzag ? T / (2 * n) : T / n, parts = zigzag ? 2 : 1, wrong = 0, first = -1;
    for (int r = 0; r < n; r++) {
        CPShard s = {.cp = n, .rank = r, .parts = parts, .len = len, .B = B, .T = T};
        for (int p = 0; p < parts; p++)
            for (int t = 0; t < len; t++) {
                int pos = cp_shard_pos(&s, r, p) + t;
                size_t row = 0;
                int owner = cp_shard_owner(&s, pos, &row);
                if (owner != r || row != (size_t)p * B * len + (size_t)t) wrong++, first = first < 0 ? pos : first;
            }
    }
    char name[160];
    snprintf(name, sizeof name, "cp_shard_owner inverts cp_shard_pos on every position, T=%d cp=%d B=%d %s", T, n, B,
             zigzag ? "zigzag" : "none");
    check(wrong == 0, name, "%d positions map elsewhere, the first %d", wrong, first);
}

// Every (query part, key part) pair of every two ranks: cp_pair_scores
// counts its unmasked scores (k <= q, counted one by one here), and
// cp_pair_visible skips exactly the pairs with none (a pair skipped with
// scores would lose them; one computed without any wastes a block and
// miscounts the summary's skipped pairs). The scores add up to a causal
// sequence's T(T+1)/2.
static void pairs_case(int T, int n, int zigzag) {
    int len = zigzag ? T / (2 * n) : T / n, parts = zigzag ? 2 : 1, wrong = 0;
    long total = 0;
    char first[160] = "";
    for (int r = 0; r < n; r++)
        for (int src = 0; src < n; src++)
            for (int qp = 0; qp < parts; qp++)
                for (int kp = 0; kp < parts; kp++) {
                    CPShard s = {.cp = n, .rank = r, .parts = parts, .len = len, .B = 1, .T = T};
                    int q0 = cp_shard_pos(&s, r, qp), k0 = cp_shard_pos(&s, src, kp);
                    long seen = 0;
                    for (int i = 0; i < len; i++)
                        for (int j = 0; j < len; j++) seen += k0 + j <= q0 + i;
                    total += seen;
                    if (cp_pair_scores(&s, q0, k0) != seen || cp_pair_visible(&s, q0, k0) != (seen > 0)) {
                        if (!wrong)
                            snprintf(first, sizeof first, "queries at %d, keys at %d: cp_pair_scores %ld, counted %ld, visible %d",
                                     q0, k0, cp_pair_scores(&s, q0, k0), seen, cp_pair_visible(&s, q0, k0));
                        wrong++;
                    }
                }
    char name[160];
    snprintf(name, sizeof name, "cp_pair_scores and cp_pair_visible on every pair of parts, T=%d cp=%d %s", T, n,
             zigzag ? "zigzag" : "none");
    check(wrong == 0 && total == (long)T * (T + 1) / 2, name, "%d pairs wrong (first: %s), %ld scores in all, want %ld",
          wrong, first, total, (long)T * (T + 1) / 2);
}

int main(int argc, char** argv) {
    runtime_init(&argc, &argv);
    device_init(0);
    for (int n = 1; n <= 4; n++)
        for (int zz = 0; zz < 2; zz++) owner_case(2, 24, n, zz), pairs_case(24, n, zz);
    // (B, T, C, NH, cp): cp = 1 (the ring of one), 2, 3 (odd), 4; T with
    // parts of one position (T = 8, cp = 4, zigzag) up to 12 positions
    const int cases[][5] = {{2, 8, 16, 2, 1}, {2, 8, 16, 2, 2}, {1, 12, 8, 2, 3}, {2, 8, 16, 4, 4},
                            {2, 24, 16, 2, 2}, {1, 24, 8, 1, 3}, {2, 32, 16, 2, 4}};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
        for (int zz = 0; zz < 2; zz++) {
            const int* c = cases[i];
            if (zz && c[1] % (2 * c[4])) continue;
            ring_case(c[0], c[1], c[2], c[3], c[4], zz);
        }
    int rc = test_exit_code();
    runtime_finalize();
    return rc;
}
