// test_ckpt.c: the checkpoint engine (common/ckpt.h) on layouts no chapter
// uses yet: tensor-parallel tiles (column slices, row ranges per layer,
// strided runs) saved and loaded against ZeRO-style flat ranges of uneven
// sizes, and the whole state on every rank. An MPI program, any rank count:
//   mpirun -np 3 build/tests/test_ckpt
// Every value is a function of (kind, tensor, global index), so a slice read
// from the wrong place, or not at all, shows.
//
// run by: tests/checkpoints.sh (on MPI ranks)
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt.h"
#include "errors.h"
#include "memory.h"
#include "runtime.h"
#include "test.h"
#include "train.h"

static int R, rank;
static GPTConfig cfg;

// The value of element i of tensor t of kind k: exact in a float.
static float truth(int k, int t, size_t i) { return (float)((k * 16 + t) * 65536 + (int)(i % 65536)); }

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

int main(int argc, char** argv) {
    runtime_init(&argc, &argv);
    MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &R));
    MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
    gpt_preset("tiny", &cfg);
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
    runtime_finalize();
    return test_exit_code();
}
