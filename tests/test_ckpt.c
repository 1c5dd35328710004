// test_ckpt.c: the checkpoint engine (common/ckpt.h) on layouts no chapter
// uses yet: tensor-parallel tiles (column slices, row ranges per layer,
// strided runs) saved and loaded against ZeRO-style flat ranges of uneven
// sizes, and the whole state on every rank; a whole model in memory copied
// into tiles and gathered from them. An MPI program, any rank count:
//   mpirun -np 3 build/tests/test_ckpt
// Every value is a function of (kind, tensor, global index), so a slice read
// from the wrong place, or not at all, shows.
//
// run by: tests/checkpoints.sh (on MPI ranks)
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt.h"
#include "ckpt_files.h"
#include "errors.h"
#include "memory.h"
#include "runtime.h"
#include "test.h"
#include "train.h"

static int R, rank;
static GPTConfig cfg;

// The value of element i of tensor t of kind k: exact in a float.
static float truth(int k, int t, size_t i) { return (float)((k * 16 + t) * 65536 + (int)(i % 65536)); }

// The checksum (ckpt_checksum, XXH3-64) must see every corruption a disk,
// a copy or a mixed-up file produces: one flipped bit at any position of a
// 64-bit word, two flips that a word-wise XOR hash would cancel (the same
// bit of two words; the top bit of two words), two words swapped, and two
// blocks swapped. Counts the changes it misses; 0 passes.
static long checksum_tried, checksum_missed;

// One corruption in place: counts it, and whether the checksum missed it.
static void tally(const uint64_t* data, size_t words, unsigned long long base) {
    checksum_tried++;
    checksum_missed += ckpt_checksum(data, words * sizeof(uint64_t)) == base;
}

static void swap_words(uint64_t* data, int a, int b, int n) {
    for (int i = 0; i < n; i++) {
        uint64_t t = data[a + i];
        data[a + i] = data[b + i];
        data[b + i] = t;
    }
}

static void check_checksum(void) {
    enum { WORDS = 1024 };
    uint64_t* data = xmalloc(WORDS * sizeof(uint64_t));
    uint64_t x = 0x9e3779b97f4a7c15ull;
    for (int i = 0; i < WORDS; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;  // xorshift: any fixed pattern
        data[i] = x;
    }
    const unsigned long long base = ckpt_checksum(data, WORDS * sizeof(uint64_t));
    const int words[] = {0, 1, 17, 511, WORDS - 1};
    for (int wi = 0; wi < 5; wi++)
        for (int b = 0; b < 64; b++) {
            uint64_t bit = 1ull << b;
            int w = words[wi];
            data[w] ^= bit;  // one flip at every bit position
            tally(data, WORDS, base);
            for (int wj = wi + 1; wj < 5; wj++) {  // and the same bit of a second word
                data[words[wj]] ^= bit;
                tally(data, WORDS, base);
                data[words[wj]] ^= bit;
            }
            data[w] ^= bit;
        }
    for (int b1 = 0; b1 < 64; b1++)  // two bits of one word
        for (int b2 = b1 + 1; b2 < 64; b2 += 7) {
            uint64_t bits = (1ull << b1) | (1ull << b2);
            data[3] ^= bits;
            tally(data, WORDS, base);
            data[3] ^= bits;
        }
    for (int i = 0; i < 64; i++) {  // two words swapped
        swap_words(data, i, WORDS - 1 - 3 * i, 1);
        tally(data, WORDS, base);
        swap_words(data, i, WORDS - 1 - 3 * i, 1);
    }
    for (int k = 1; k < WORDS / 64; k++) {  // two 512-byte blocks swapped
        swap_words(data, 0, 64 * k, 64);
        tally(data, WORDS, base);
        swap_words(data, 0, 64 * k, 64);
    }
    check(checksum_missed == 0 && checksum_tried > 1000,
          "the checkpoint checksum sees single, paired and swapped changes",
          "%ld of %ld changes leave the checksum unchanged", checksum_missed, checksum_tried);
    free(data);
}

static int all_ranks(int ok) {
    int all = 0;
    MPI_CHECK(MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD));
    return all;
}

// A tensor seen as (rows, cols): cols its last dimension.
static size_t cols_of(ParamTensor t) {
    switch (t) {
        case P_FCPROJW: return 4 * (size_t)cfg.channels;
        case P_QKVB: return 3 * (size_t)cfg.channels;
        case P_FCB: return 4 * (size_t)cfg.channels;
        default: return (size_t)cfg.channels;
    }
}
static size_t numel_of(ParamTensor t) {
    return (param_tensor_is_block(t) ? (size_t)cfg.num_layers : 1) * param_tensor_numel(&cfg, t);
}

// A slice's values, from the truth, into device memory.
static float* slice_values(CkptSlice s) {
    float* host = xmalloc(s.len * s.count * sizeof(float));
    for (size_t k = 0; k < s.count; k++)
        for (size_t j = 0; j < s.len; j++) host[k * s.len + j] = truth(s.kind, s.tensor, s.start + k * s.stride + j);
    float* dev = mem_alloc_floats(s.len * s.count, MEM_OTHER);
    mem_to_device(dev, host, s.len * s.count * sizeof(float));
    free(host);
    return dev;
}

// Every slice of l holds the truth.
static int slices_hold_truth(const CkptList* l) {
    int ok = 1;
    for (int i = 0; i < l->n && ok; i++) {
        const CkptSlice* s = &l->s[i];
        float* host = xmalloc(s->len * s->count * sizeof(float));
        mem_to_host(host, s->data, s->len * s->count * sizeof(float));
        for (size_t k = 0; k < s->count && ok; k++)
            for (size_t j = 0; j < s->len && ok; j++)
                ok = host[k * s->len + j] == truth(s->kind, s->tensor, s->start + k * s->stride + j);
        free(host);
    }
    return ok;
}

static void free_data(CkptList* l) {
    for (int i = 0; i < l->n; i++) mem_free(l->s[i].data);
}

// This rank's column tile of every tensor: columns [c0, c1) of every row,
// one strided slice (count = rows).
static void add_column_tiles(CkptList* l) {
    for (int k = 0; k < CKPT_NUM_KINDS; k++)
        for (ParamTensor t = 0; t < NUM_PARAM_TENSORS; t++) {
            size_t cols = cols_of(t), c0 = (size_t)rank * cols / R, c1 = (size_t)(rank + 1) * cols / R;
            CkptSlice s = {.kind = k, .tensor = t, .start = c0, .len = c1 - c0, .stride = cols,
                           .count = numel_of(t) / cols};
            if (s.len == 0) continue;
            s.data = slice_values(s);
            ckpt_add(l, s);
        }
}

// This rank's rows [r0, r1) of every layer of every tensor (uneven over R,
// the other way round: rank 0 gets the last piece): count = layers.
static void add_row_tiles(CkptList* l) {
    int piece = R - 1 - rank;
    for (int k = 0; k < CKPT_NUM_KINDS; k++)
        for (ParamTensor t = 0; t < NUM_PARAM_TENSORS; t++) {
            size_t cols = cols_of(t), layers = param_tensor_is_block(t) ? (size_t)cfg.num_layers : 1;
            size_t rows = numel_of(t) / cols / layers;
            size_t r0 = (size_t)piece * rows / R, r1 = (size_t)(piece + 1) * rows / R;
            CkptSlice s = {.kind = k, .tensor = t, .start = r0 * cols, .len = (r1 - r0) * cols,
                           .stride = rows * cols, .count = layers};
            if (s.len == 0) continue;
            s.data = slice_values(s);
            ckpt_add(l, s);
        }
}

// Flat layer-major ranges cut unevenly (ZeRO shards with an offset): each
// rank's range cut by ckpt_add_flat, each piece with its own buffer.
static void add_flat(CkptList* l, int shift) {
    size_t P = gpt_num_params(&cfg);
    size_t lo = (size_t)rank * P / R + (rank ? (size_t)shift : 0);
    size_t hi = rank == R - 1 ? P : (size_t)(rank + 1) * P / R + (size_t)shift;
    CkptList cut = {0};
    for (int k = 0; k < CKPT_NUM_KINDS; k++) ckpt_add_flat(&cut, &cfg, (CkptKind)k, lo, hi - lo, NULL);
    for (int i = 0; i < cut.n; i++) {
        CkptSlice s = cut.s[i];
        s.data = slice_values(s);
        ckpt_add(l, s);
    }
    ckpt_list_free(&cut);
}
static void add_flat_shift3(CkptList* l) { add_flat(l, 3); }

// Every whole tensor of the kinds [k0, k1), on the host: the truth, or zeros.
static void add_whole_host(CkptList* l, int k0, int k1, int truthful) {
    for (int k = k0; k < k1; k++)
        for (ParamTensor t = 0; t < NUM_PARAM_TENSORS; t++) {
            CkptSlice s = {.kind = k, .tensor = t, .start = 0, .len = numel_of(t), .count = 1};
            s.data = xcalloc(s.len, sizeof(float));
            for (size_t i = 0; truthful && i < s.len; i++) s.data[i] = truth(k, t, i);
            ckpt_add(l, s);
        }
}

// Every host slice of l holds the truth.
static int host_slices_hold_truth(const CkptList* l) {
    for (int i = 0; i < l->n; i++)
        for (size_t j = 0; j < l->s[i].len; j++)
            if (l->s[i].data[j] != truth(l->s[i].kind, l->s[i].tensor, l->s[i].start + j)) return 0;
    return 1;
}

static void free_host_data(CkptList* l) {
    for (int i = 0; i < l->n; i++) free(l->s[i].data);
    ckpt_list_free(l);
}

static void zero_slices(CkptList* l) {
    for (int i = 0; i < l->n; i++) ops_zero(l->s[i].data, l->s[i].len * l->s[i].count);
}

static Ckpt ckpt_for(const char* save_dir, const char* resume_dir) {
    TrainArgs a;
    memset(&a, 0, sizeof(a));
    a.ckpt_dir = save_dir;
    a.resume = resume_dir;
    a.save_every = 1;
    a.steps = 1;
    a.keep = 2;
    a.lr = 1e-3f;
    a.clip = 1.0f;
    a.seed = 1337;
    TrainSetup s;
    memset(&s, 0, sizeof(s));
    s.cfg = cfg;
    s.B = 4;
    s.T = 64;
    Ckpt c;
    ckpt_init(&c, &a, &s, NULL, 99);
    return c;
}

// Saves `own` as step 1 under dir; returns after the commit.
static void save_as(const char* dir, void (*own)(CkptList*), int async) {
    Ckpt c = ckpt_for(dir, NULL);
    c.async = async;
    own(&c.own);
    ckpt_after_step(&c, 0);
    free_data(&c.own);
    ckpt_finish(&c, NULL);
}

// ---------------------------------------------------------------- the slice intersection, brute force
// Random slices of one tensor of n elements, flat (count 1) or strided
// (count runs of len <= stride), single-element runs and runs that touch
// the tensor's ends included: n is small, so the ends are hit often.
static unsigned long long rng_state = 0x9E3779B97F4A7C15ull;
static size_t rnd(size_t n) {  // uniform in [0, n), n >= 1 (xorshift64*)
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return (size_t)((rng_state * 2685821657736338717ull) >> 33) % n;
}
static CkptSlice random_slice(size_t n) {
    CkptSlice s = {0};
    if (rnd(3) == 0) {  // flat: [start, start + len)
        s.start = rnd(n);
        s.len = 1 + rnd(n - s.start);
        s.count = 1;
        s.stride = s.len;
        return s;
    }
    s.stride = 1 + rnd(n);
    s.len = rnd(4) == 0 ? 1 : 1 + rnd(s.stride);  // a quarter single-element runs
    s.start = rnd(n - s.len + 1);
    s.count = 1 + rnd((n - s.start - s.len) / s.stride + 1);  // the last run ends by n
    if (s.count == 1) s.stride = s.len;  // as ckpt_add sets it
    return s;
}
// What ckpt_intersect reported: for each float of the need slice's data,
// how often it was covered and the file byte it came from
typedef struct {
    size_t total;  // floats in the need slice
    int* hits;
    size_t* from;
    int bad_piece;  // a piece outside the need slice, or empty
} Covered;
static void cover(void* ctx, size_t dst, size_t file_offset, size_t n) {
    Covered* c = ctx;
    if (n == 0 || dst + n > c->total) {
        c->bad_piece = 1;
        return;
    }
    for (size_t i = 0; i < n; i++) c->hits[dst + i]++, c->from[dst + i] = file_offset + i * sizeof(float);
}
// trials of random (need, saved) pairs; returns the first mismatch's
// description in why (empty when every element agreed)
static void brute_force_intersections(int trials, char* why, size_t why_len, long* pairs, long* overlaps) {
    why[0] = 0;
    *pairs = *overlaps = 0;
    for (int t = 0; t < trials && !why[0]; t++) {
        size_t n = 1 + rnd(t % 2 ? 12 : 64);
        CkptSlice s = random_slice(n), v = random_slice(n);
        size_t offset = 4 * rnd(1000), total = s.len * s.count, expect = 0;
        Covered c = {.total = total, .hits = xcalloc(total, sizeof(int)), .from = xcalloc(total, sizeof(size_t))};
        size_t found = ckpt_intersect(&s, &v, offset, cover, &c);
        // element by element: global index g of need float i, and where
        // the saved slice holds it (run k, position r), if it does
        for (size_t i = 0; i < total && !why[0]; i++) {
            size_t g = s.start + (i / s.len) * s.stride + i % s.len;
            int held = 0;
            size_t at = 0;
            if (g >= v.start) {
                size_t k = (g - v.start) / v.stride, r = (g - v.start) % v.stride;
                if (k < v.count && r < v.len) held = 1, at = offset + (k * v.len + r) * sizeof(float);
            }
            expect += (size_t)held;
            if (c.hits[i] != held || (held && c.from[i] != at))
                snprintf(why, why_len, "need {start %zu len %zu stride %zu count %zu}, saved {start %zu len %zu stride %zu count %zu}, n %zu: element %zu (global %zu) covered %d time(s) from byte %zu, want %d from byte %zu",
                         s.start, s.len, s.stride, s.count, v.start, v.len, v.stride, v.count, n, i, g, c.hits[i],
                         c.from[i], held, at);
        }
        if (!why[0] && (c.bad_piece || found != expect))
            snprintf(why, why_len, "need {start %zu len %zu stride %zu count %zu}, saved {start %zu len %zu stride %zu count %zu}: %s, found %zu, want %zu",
                     s.start, s.len, s.stride, s.count, v.start, v.len, v.stride, v.count,
                     c.bad_piece ? "a piece outside the slice" : "pieces fine", found, expect);
        *pairs += 1;
        *overlaps += expect > 0;
        free(c.hits);
        free(c.from);
    }
}

int main(int argc, char** argv) {
    runtime_init(&argc, &argv);
    MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &R));
    MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
    gpt_preset("tiny", &cfg);
    if (rank == 0) check_checksum();
    if (rank == 0) {  // a checkpoint's name: "step-" and eight digits, nothing else
        int s = -1, good = ckpt_parse_step_name("step-00000012", &s) && s == 12;
        const char* bad[] = {"step-+0000012", "step-   12345", "step--0000001", "step-0000001", "step-000000012", "step-0000001x"};
        for (int i = 0; i < 6; i++) good &= !ckpt_parse_step_name(bad[i], &s);
        check(good, "ckpt: a step directory's name is step- and eight digits (no sign, no spaces, no other length)", "");
    }
    char name[64], dir_a[256], dir_b[256];
    snprintf(name, sizeof(name), "test_ckpt_cols_%d", R);
    snprintf(dir_a, sizeof(dir_a), "%s", tmp_path(name));
    snprintf(name, sizeof(name), "test_ckpt_flat_%d", R);
    snprintf(dir_b, sizeof(dir_b), "%s", tmp_path(name));

    // column tiles (a tp layout) saved, read back as uneven flat ranges (a
    // ZeRO layout), as row tiles, and whole on every rank
    save_as(dir_a, add_column_tiles, 0);
    char why[128];
    snprintf(why, sizeof(why), "on %d ranks", R);
    {
        Ckpt c = ckpt_for(NULL, dir_a);
        add_flat(&c.need, 7);
        zero_slices(&c.need);
        int step = ckpt_resume(&c);
        int ok = all_ranks(step == 1 && slices_hold_truth(&c.need));
        if (rank == 0) check(ok, "ckpt: column tiles (strided slices) saved, uneven flat ranges loaded", "%s", why);
        free_data(&c.need);
        ckpt_finish(&c, NULL);
    }
    {
        Ckpt c = ckpt_for(NULL, dir_a);
        add_row_tiles(&c.need);
        zero_slices(&c.need);
        ckpt_resume(&c);
        int ok = all_ranks(slices_hold_truth(&c.need));
        if (rank == 0) check(ok, "ckpt: column tiles saved, row tiles of every layer loaded", "%s", why);
        free_data(&c.need);
        ckpt_finish(&c, NULL);
    }
    // flat ranges saved (async), column tiles and whole tensors loaded
    save_as(dir_b, add_flat_shift3, 1);
    {
        Ckpt c = ckpt_for(NULL, dir_b);
        add_column_tiles(&c.need);
        zero_slices(&c.need);
        ckpt_resume(&c);
        int ok = all_ranks(slices_hold_truth(&c.need));
        if (rank == 0) check(ok, "ckpt: uneven flat ranges saved by the async writer, column tiles loaded", "%s", why);
        free_data(&c.need);
        ckpt_finish(&c, NULL);
    }
    {
        Ckpt c = ckpt_for(NULL, dir_b);
        for (int k = 0; k < CKPT_NUM_KINDS; k++)
            for (ParamTensor t = 0; t < NUM_PARAM_TENSORS; t++) {
                CkptSlice s = {.kind = k, .tensor = t, .start = 0, .len = numel_of(t), .count = 1};
                s.data = mem_alloc_floats(s.len, MEM_OTHER);
                ckpt_add(&c.need, s);
            }
        ckpt_resume(&c);
        int ok = all_ranks(slices_hold_truth(&c.need));
        if (rank == 0) check(ok, "ckpt: uneven flat ranges saved, every whole tensor loaded on every rank", "%s", why);
        free_data(&c.need);
        ckpt_finish(&c, NULL);
    }
    // a whole model in memory (ckpt_whole.c): its values into row tiles of
    // every layer (--model FILE's way), and every rank's column tiles of the
    // parameters gathered into rank 0's whole tensors (--save's way)
    {
        CkptList from = {0}, to = {0};
        add_whole_host(&from, 0, CKPT_NUM_KINDS, 1);
        add_row_tiles(&to);
        zero_slices(&to);
        size_t found = ckpt_copy(&to, &from);
        int ok = all_ranks(found == to.floats && slices_hold_truth(&to));
        if (rank == 0) check(ok, "ckpt_copy: whole host tensors into row tiles of every layer", "%s", why);
        free_host_data(&from), free_data(&to), ckpt_list_free(&to);
    }
    {
        CkptList own = {0}, whole = {0};
        add_column_tiles(&own);
        if (rank == 0) add_whole_host(&whole, CKPT_PARAMS, CKPT_M + 1, 0);  // m is not gathered: stays zero
        size_t found = ckpt_gather(&own, CKPT_PARAMS, MPI_COMM_WORLD, &whole);
        if (rank == 0) {
            size_t params = 0;
            for (int i = 0; i < whole.n; i++) params += whole.s[i].kind == CKPT_PARAMS ? whole.s[i].len : 0;
            int zero = 1;
            for (int i = 0; i < whole.n; i++)
                for (size_t j = 0; whole.s[i].kind == CKPT_M && j < whole.s[i].len; j++) zero &= whole.s[i].data[j] == 0.0f;
            whole.n /= 2;  // the parameters' slices: the first half
            check(found == params && host_slices_hold_truth(&whole) && zero,
                  "ckpt_gather: every rank's column tiles of the parameters into rank 0's whole tensors", "%s: %zu of %zu floats",
                  why, found, params);
            whole.n *= 2;
        }
        free_data(&own), ckpt_list_free(&own), free_host_data(&whole);
    }
    // the slice arithmetic: a flat range cut at tensor and layer boundaries
    {
        CkptList l = {0};
        float buf[20];
        size_t qkvw = gpt_tensor_offset(&cfg, P_QKVW, 1);
        ckpt_add_flat(&l, &cfg, CKPT_M, qkvw - 10, 20, buf);
        int ok = l.n == 2 && l.s[0].tensor == P_LN1B && l.s[0].start == 64 + 54 && l.s[0].len == 10 &&
                 l.s[1].tensor == P_QKVW && l.s[1].start == param_tensor_numel(&cfg, P_QKVW) && l.s[1].len == 10 &&
                 l.s[0].data == buf && l.s[1].data == buf + 10 && l.floats == 20;
        if (rank == 0)
            check(ok, "ckpt_add_flat: 20 floats across ln1b and qkvw of layer 1 are two slices of those tensors", "%d slices", l.n);
        ckpt_list_free(&l);
    }
    // the resharding's intersection against a brute-force one, element by
    // element, on random flat and strided slices (every rank the same pairs)
    if (rank == 0) {
        char why[512];
        long pairs, overlaps;
        brute_force_intersections(200000, why, sizeof(why), &pairs, &overlaps);
        check(!why[0], "ckpt_intersect = brute force on random flat and strided slices (single-element runs, tensor ends)",
              "after %ld pairs (%ld overlapping): %s", pairs, overlaps, why);
    }
    runtime_finalize();
    return test_exit_code();
}
