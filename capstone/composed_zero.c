// composed_zero.c: --zero's buffers, units, flag and checkpoint lines
// (composed_zero.h). The step's collectives are in capstone/main.c, the
// units' gathers and reduce-scatters in its layer loop.
#include "composed_zero.h"

#include <stdlib.h>
#include <string.h>

#include "errors.h"
#include "memory.h"
#include "ops.h"

void expert_zero_alloc(ZeroBuf* z, int zero, const Comm* g, size_t n, float** params, float** grads, float** m,
                       float** v) {
    *z = (ZeroBuf){.g = g, .n = n, .S = n, .full = n, .len = n};
    if (zero) {  // the values on the host until expert_zero_shard hands each rank's shards to chapter 3's engine
        z->staging = xcalloc(n ? n : 1, sizeof(float));
        *params = *grads = *m = *v = NULL;
        return;
    }
    z->params = *params = mem_alloc_floats(n, MEM_PARAMS);
    z->grads = z->dshard = *grads = mem_alloc_floats(n, MEM_GRADS);
    z->m = *m = mem_alloc_floats(n, MEM_OPTIMIZER);
    z->v = *v = mem_alloc_floats(n, MEM_OPTIMIZER);
}

void expert_zero_free(ZeroBuf* z) {
    if (z->zero) fsdp_free(&z->f);
    else mem_free(z->params), mem_free(z->grads), mem_free(z->m), mem_free(z->v);
    z->params = z->grads = z->m = z->v = z->dshard = NULL;
    free(z->unit_off);
    z->unit_off = NULL;
}

void expert_zero_units(ZeroBuf* z, int units, const size_t* numel) {
    z->units = units;
    z->unit_off = xmalloc(sizeof(size_t) * (size_t)(units + 1));
    z->unit_off[0] = 0;
    for (int i = 0; i < units; i++) z->unit_off[i + 1] = z->unit_off[i] + numel[i];
    CHECK(z->unit_off[units] == z->n, "the units cover %zu of the buffer's %zu floats", z->unit_off[units], z->n);
}

void expert_zero_put(ZeroBuf* z, const float* host) {
    if (z->staging) memcpy(z->staging, host, z->n * sizeof(float));
    else mem_to_device(z->params, host, z->n * sizeof(float));
}

// The engine's fill: floats [lo, lo + n) of unit i, from the staging.
static const char* fill_from(void* ctx, int unit, size_t lo, size_t n, float* dst, char* msg, size_t len) {
    const ZeroBuf* z = ctx;
    (void)msg, (void)len;
    memcpy(dst, z->staging + z->unit_off[unit] + lo, n * sizeof(float));
    return NULL;
}

void expert_zero_shard(ZeroBuf* z, int zero, const int* own_grads) {
    if (!zero) return;
    // --zero 1: the whole buffer one unit, as the step reduce-scatters and
    // all-gathers it; 2, 3: a unit per layer
    int units = zero == 1 ? 1 : z->units;
    size_t* numel = xmalloc(sizeof(size_t) * (size_t)units);
    for (int i = 0; i < units; i++) numel[i] = zero == 1 ? z->n : z->unit_off[i + 1] - z->unit_off[i];
    FsdpSpec spec = {.n_units = units, .numel = numel, .own_grads = zero == 1 ? NULL : own_grads, .fill = fill_from,
                     .fill_ctx = z};
    fsdp_create(&z->f, z->g, &spec, zero, 0, 1);  // no prefetch; two gather slots (reshard)
    free(z->staging);
    z->staging = NULL;
    free(numel);
    z->zero = zero;
    // zero 1: every rank's full parameters and gradient (padded to N S), its
    // shard [lo, lo + len) of the n floats; 2, 3: the engine's units only
    z->params = zero == 1 ? z->f.full_params : NULL, z->grads = zero == 1 ? z->f.full_grads : NULL;
    z->m = z->f.m, z->v = z->f.v, z->dshard = z->f.shard_grads, z->S = z->f.shard_total;
    z->full = zero == 1 ? z->f.padded_total : 0;
    z->off = zero == 1 ? (size_t)z->g->rank * z->S : 0;
    z->lo = z->off < z->n ? z->off : z->n;
    z->len = z->n - z->lo < z->S ? z->n - z->lo : z->S;
}

float* expert_zero_params(ZeroBuf* z, int i) {
    return z->zero > 1 ? fsdp_unit_params(&z->f, i) : z->params + z->unit_off[i];
}

float* expert_zero_grads(ZeroBuf* z, int i) {
    if (z->zero < 2) return z->grads + z->unit_off[i];
    return z->f.own_grads[i] ? z->f.own_grads[i] : z->f.unit_grads;
}

void expert_zero_grads_begin(ZeroBuf* z, int i) {
    if (z->zero > 1) fsdp_grads_begin(&z->f, i);
}

void expert_zero_reduce(ZeroBuf* z, int i) {
    if (z->zero > 1) fsdp_reduce_grads(&z->f, i);
}

void expert_zero_drop(ZeroBuf* z) {
    if (z->zero > 1) fsdp_drop_gathered(&z->f);
}

float* expert_zero_whole(ZeroBuf* z) {
    float* whole = mem_alloc_floats(z->n ? z->n : 1, MEM_OTHER);
    float* unit = mem_alloc_floats(z->f.max_padded ? z->f.max_padded : 1, MEM_OTHER);
    for (int i = 0; i < z->units; i++) {
        comm_allgather(z->g, z->f.zero == 3 ? z->f.shard_params + z->f.shard_off[i]
                                            : z->f.full_params + z->f.padded_off[i] + (size_t)z->g->rank * z->f.shard[i],
                       unit, z->f.shard[i]);
        ops_copy(whole + z->unit_off[i], unit, z->unit_off[i + 1] - z->unit_off[i]);
    }
    mem_free(unit);
    return whole;
}

void expert_zero_sumsq(double* mine, const ZeroBuf* z) {
    size_t skip = z->tied > z->off ? z->tied - z->off : 0;  // the tied copy's floats in what I step
    if (skip < z->S) grad_sumsq(mine, z->dshard + skip, z->S - skip);
}

// The part of each slice of `full` (data from origin) that falls in the
// buffer's floats [lo, hi), added to out as `kind` with data at base (the
// values of float lo).
static void add_range(CkptList* out, const CkptList* full, const float* origin, size_t lo, size_t hi, int kind,
                      float* base) {
    for (int i = 0; i < full->n; i++) {
        const CkptSlice* s = &full->s[i];
        size_t at = (size_t)(s->data - origin);  // the slice's runs sit one after another in the buffer
        for (size_t j = 0; j < s->count; j++, at += s->len) {
            size_t a = at > lo ? at : lo, b = at + s->len < hi ? at + s->len : hi;
            if (a >= b) continue;
            ckpt_add(out, (CkptSlice){.tensor = s->tensor, .start = s->start + j * s->stride + (a - at), .len = b - a,
                                      .count = 1, .kind = kind, .data = base + (a - lo)});
        }
    }
}

void expert_zero_ckpt_add(CkptList* out, const CkptList* full, const float* params, const ZeroBuf* z, float* m,
                          float* v) {
    add_range(out, full, params, z->lo, z->lo + z->len, CKPT_M, m);
    add_range(out, full, params, z->lo, z->lo + z->len, CKPT_V, v);
}

void expert_zero_ckpt_unit(CkptList* own, CkptList* need, const CkptList* full, const float* origin, ZeroBuf* z,
                           int i) {
    const FSDP* f = &z->f;
    size_t n = z->unit_off[i + 1] - z->unit_off[i], S = f->shard[i], r = (size_t)z->g->rank;
    size_t lo = r * S < n ? r * S : n, hi = lo + S < n ? lo + S : n;  // my real floats of the unit
    float* p = f->zero == 3 ? f->shard_params + f->shard_off[i] : f->full_params + f->padded_off[i] + lo;
    float *m = f->m + f->shard_off[i], *v = f->v + f->shard_off[i];
    for (int k = 0; k < 2; k++) {
        CkptList* out = k ? need : own;
        if (!k || f->zero == 3) add_range(out, full, origin, lo, hi, CKPT_PARAMS, p);
        add_range(out, full, origin, lo, hi, CKPT_M, m);
        add_range(out, full, origin, lo, hi, CKPT_V, v);
    }
}
