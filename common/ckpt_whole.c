// ckpt_whole.c: a slice list's values to and from a model held whole in
// memory (ckpt.h): a model file's values into what a rank holds
// (ckpt_copy: --model FILE), every rank's slices onto one rank, which
// writes the file (ckpt_gather: --save). Both are the resume's slice
// intersection (ckpt_intersect) on slices in memory instead of in files, so
// a program that lists its checkpoint slices reads and writes a whole model
// file on any mesh with no code of its own for the mesh.
#include <limits.h>
#include <mpi.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt.h"
#include "errors.h"
#include "memory.h"

typedef struct {
    float* to;
    const float* from;
    int to_device;
} Copy;

// ckpt_intersect's fn: n floats of from's values, from byte `offset` on, to to + dst.
static void copy_piece(void* ctx, size_t dst, size_t offset, size_t n) {
    const Copy* c = ctx;
    const float* src = c->from + offset / sizeof(float);
    if (c->to_device) mem_to_device(c->to + dst, src, n * sizeof(float));
    else memcpy(c->to + dst, src, n * sizeof(float));
}

// Every overlap of a slice of `to` with a slice of `from` of the same kind
// and tensor, copied from from's values (host) to to's. Returns the floats.
static size_t copy_overlaps(const CkptList* to, const CkptList* from, int to_device) {
    size_t found = 0;
    for (int i = 0; i < to->n; i++)
        for (int j = 0; j < from->n; j++) {
            const CkptSlice *a = &to->s[i], *b = &from->s[j];
            if (a->kind != b->kind || a->tensor != b->tensor) continue;
            Copy c = {a->data, b->data, to_device};
            found += ckpt_intersect(a, b, 0, copy_piece, &c);
        }
    return found;
}

size_t ckpt_copy(const CkptList* to, const CkptList* from) { return copy_overlaps(to, from, 1); }

size_t ckpt_gather(const CkptList* own, CkptKind kind, MPI_Comm comm, const CkptList* whole) {
    int rank, size;
    MPI_CHECK(MPI_Comm_rank(comm, &rank));
    MPI_CHECK(MPI_Comm_size(comm, &size));
    // my slices of the kind: six numbers of shape each, and their values on the host
    int n = 0;
    size_t floats = 0;
    for (int i = 0; i < own->n; i++)
        if (own->s[i].kind == (int)kind) n++, floats += own->s[i].len * own->s[i].count;
    CHECK(6 * (size_t)n <= INT_MAX && floats <= INT_MAX, "ckpt_gather: %zu floats in %d slices exceed one MPI message",
          floats, n);
    uint64_t* shape = xmalloc(6 * (size_t)n * sizeof(uint64_t) + 1);
    float* values = xmalloc(floats * sizeof(float) + 1);
    size_t at = 0;
    for (int i = 0, k = 0; i < own->n; i++) {
        const CkptSlice* s = &own->s[i];
        if (s->kind != (int)kind) continue;
        uint64_t row[6] = {(uint64_t)s->kind, (uint64_t)s->tensor, s->start, s->len, s->stride, s->count};
        memcpy(shape + 6 * k++, row, sizeof(row));
        mem_to_host(values + at, s->data, s->len * s->count * sizeof(float));
        at += s->len * s->count;
    }
    // rank 0 receives every rank's (host data: plain MPI): the two counts of
    // each rank, then the shapes and the values, rank after rank
    int mine[2] = {6 * n, (int)floats};
    int* counts = rank == 0 ? xmalloc(4 * (size_t)size * sizeof(int)) : NULL;  // (size, 2) gathered, then n_shape, n_vals
    MPI_CHECK(MPI_Gather(mine, 2, MPI_INT, counts, 2, MPI_INT, 0, comm));
    int *n_shape = NULL, *n_vals = NULL, *off_shape = NULL, *off_vals = NULL;
    size_t all_shapes = 0, all_values = 0;
    if (rank == 0) {
        n_shape = counts + 2 * size, n_vals = n_shape + size;
        off_shape = xmalloc(2 * (size_t)size * sizeof(int)), off_vals = off_shape + size;
        for (int r = 0; r < size; r++) {
            n_shape[r] = counts[2 * r], n_vals[r] = counts[2 * r + 1];
            CHECK(all_shapes + n_shape[r] <= INT_MAX && all_values + n_vals[r] <= INT_MAX,
                  "ckpt_gather: the whole model exceeds one MPI message");
            off_shape[r] = (int)all_shapes, off_vals[r] = (int)all_values;
            all_shapes += (size_t)n_shape[r], all_values += (size_t)n_vals[r];
        }
    }
    uint64_t* shapes = rank == 0 ? xmalloc(all_shapes * sizeof(uint64_t) + 1) : NULL;
    float* vals = rank == 0 ? xmalloc(all_values * sizeof(float) + 1) : NULL;
    MPI_CHECK(MPI_Gatherv(shape, mine[0], MPI_UINT64_T, shapes, n_shape, off_shape, MPI_UINT64_T, 0, comm));
    MPI_CHECK(MPI_Gatherv(values, mine[1], MPI_FLOAT, vals, n_vals, off_vals, MPI_FLOAT, 0, comm));
    size_t found = 0;
    if (rank == 0) {  // every rank's slices, their values in vals one after another, cut against whole's
        CkptList from = {0};
        size_t v = 0;
        for (size_t i = 0; i < all_shapes / 6; i++) {
            const uint64_t* r = shapes + 6 * i;
            CkptSlice s = {(int)r[0], (int)r[1], r[2], r[3], r[4], r[5], vals + v};
            v += s.len * s.count;
            ckpt_add(&from, s);
        }
        found = copy_overlaps(whole, &from, 0);
        ckpt_list_free(&from);
    }
    free(shape), free(values), free(counts), free(off_shape), free(shapes), free(vals);
    return found;
}
