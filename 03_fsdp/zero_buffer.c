// zero_buffer.c: a buffer under a ZeRO stage over its group of copies
// (zero_buffer.h): its units, its engine, its checkpoint lines and its
// --show-sharding rows. The step's collectives are the caller's
// (capstone/main.c), and so are the units' gathers and reduce-scatters, in
// its layer loop.
#include "zero_buffer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "errors.h"
#include "memory.h"
#include "ops.h"

void zero_buffer_alloc(ZeroBuffer* z, int zero, const Comm* g, size_t n) {
    *z = (ZeroBuffer){.g = g, .n = n, .S = n, .full = n, .zero = zero};
    if (zero) {  // the values on the host until zero_buffer_units hands each rank's shards to chapter 3's engine
        z->staging = xcalloc(n, sizeof(float));
        return;
    }
    z->params = mem_alloc_floats(n, MEM_PARAMS);
    z->grads = z->dshard = mem_alloc_floats(n, MEM_GRADS);
    z->m = mem_alloc_floats(n, MEM_OPTIMIZER);
    z->v = mem_alloc_floats(n, MEM_OPTIMIZER);
}

void zero_buffer_free(ZeroBuffer* z) {
    if (z->zero) fsdp_free(&z->f);
    else mem_free(z->params), mem_free(z->grads), mem_free(z->m), mem_free(z->v);
    z->params = z->grads = z->m = z->v = z->dshard = NULL;
    free(z->unit_off);
    z->unit_off = NULL;
}

void zero_buffer_put(ZeroBuffer* z, const float* host) {
    if (z->staging) memcpy(z->staging, host, z->n * sizeof(float));
    else mem_to_device(z->params, host, z->n * sizeof(float));
}

// The engine's fill: floats [lo, lo + n) of unit i, from the staging.
static const char* fill_from(void* ctx, int unit, size_t lo, size_t n, float* dst, char* msg, size_t len) {
    const ZeroBuffer* z = ctx;
    (void)msg, (void)len;
    memcpy(dst, z->staging + z->unit_off[unit] + lo, n * sizeof(float));
    return NULL;
}

// --zero: the engine over g from the staging (freed), each rank keeping its
// shards; the buffer's pointers are the engine's.
static void shard(ZeroBuffer* z, const int* own_grads) {
    int zero = z->zero;
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
    // zero 1: every rank's full parameters and gradient (padded to N S), its
    // shard from r S on; 2, 3: the engine's units only
    z->params = zero == 1 ? z->f.full_params : NULL, z->grads = zero == 1 ? z->f.full_grads : NULL;
    z->m = z->f.m, z->v = z->f.v, z->dshard = z->f.shard_grads, z->S = z->f.shard_total;
    z->full = zero == 1 ? z->f.padded_total : 0;
    z->off = zero == 1 ? (size_t)z->g->rank * z->S : 0;
}

void zero_buffer_units(ZeroBuffer* z, int units, const size_t* numel, const int* own_grads) {
    z->units = units;
    z->unit_off = xmalloc(sizeof(size_t) * (size_t)(units + 1));
    z->unit_off[0] = 0;
    for (int i = 0; i < units; i++) z->unit_off[i + 1] = z->unit_off[i] + numel[i];
    CHECK(z->unit_off[units] == z->n, "the units cover %zu of the buffer's %zu floats", z->unit_off[units], z->n);
    if (z->zero) shard(z, own_grads);
}

float* zero_buffer_params(ZeroBuffer* z, int i) {
    return z->zero > 1 ? fsdp_unit_params(&z->f, i) : z->params + z->unit_off[i];
}

float* zero_buffer_grads(ZeroBuffer* z, int i) {
    if (z->zero < 2) return z->grads + z->unit_off[i];
    return z->f.own_grads[i] ? z->f.own_grads[i] : z->f.unit_grads;
}

void zero_buffer_grads_begin(ZeroBuffer* z, int i) {
    if (z->zero > 1) fsdp_grads_begin(&z->f, i);
}

void zero_buffer_reduce(ZeroBuffer* z, int i) {
    if (z->zero > 1) fsdp_reduce_grads(&z->f, i);
}

void zero_buffer_drop(ZeroBuffer* z) {
    if (z->zero > 1) fsdp_drop_gathered(&z->f);
}

void zero_buffer_sumsq(double* mine, const ZeroBuffer* z) {
    size_t skip = z->tied > z->off ? z->tied - z->off : 0;  // the tied copy's floats in what I step
    if (skip < z->S) grad_sumsq(mine, z->dshard + skip, z->S - skip);
}

// fsdp_ckpt_shard's map: the part of each slice of `full` (data from
// origin) that falls in the unit's floats [lo, lo + n), added to out as
// `kind` with data at base (the values of float lo).
typedef struct {
    const CkptList* full;
    const float* origin;
} UnitCut;

static void cut_unit(void* ctx, CkptList* out, int unit, size_t lo, size_t n, CkptKind kind, float* base) {
    const UnitCut* c = ctx;
    (void)unit;
    for (int i = 0; i < c->full->n; i++) {
        CkptSlice s = c->full->s[i];
        size_t at = (size_t)(s.data - c->origin);  // the slice's runs sit one after another in the unit
        if (at >= lo && at + s.count * s.len <= lo + n) {  // all of it (a strided slice stays one)
            s.kind = kind, s.data = base + (at - lo);
            ckpt_add(out, s);
            continue;
        }
        for (size_t j = 0; j < s.count; j++, at += s.len) {
            size_t a = at > lo ? at : lo, b = at + s.len < lo + n ? at + s.len : lo + n;
            if (a >= b) continue;
            ckpt_add(out, (CkptSlice){.tensor = s.tensor, .start = s.start + j * s.stride + (a - at), .len = b - a,
                                      .count = 1, .kind = kind, .data = base + (a - lo)});
        }
    }
}

void zero_buffer_ckpt(CkptList* own, CkptList* need, const ZeroBuffer* z, ZeroBufferSlices slices, void* ctx) {
    // whole on every rank: without --zero the three states, --zero 1 the
    // parameters; rank r writes floats [r S, (r + 1) S) of each, as ZeRO-1 cuts
    float* whole[CKPT_NUM_KINDS] = {z->params, z->m, z->v};
    size_t N = (size_t)z->g->size, S = (z->n + N - 1) / N, lo = (size_t)z->g->rank * S;
    if (lo > z->n) lo = z->n;
    for (int k = 0; k < (z->zero == 0 ? CKPT_NUM_KINDS : z->zero == 1 ? 1 : 0); k++) {
        CkptList full = {0};
        slices(ctx, &full, 1, (CkptKind)k, 0, z->units, whole[k]);
        UnitCut cut = {&full, whole[k]};
        cut_unit(&cut, own, 0, lo, z->n - lo < S ? z->n - lo : S, (CkptKind)k, whole[k] + lo);
        ckpt_list_free(&full);
        slices(ctx, need, 0, (CkptKind)k, 0, z->units, whole[k]);
    }
    const FSDP* f = &z->f;
    for (int i = 0; z->zero && i < f->n; i++) {
        // the engine's unit i (--zero 1: the whole buffer) as slices, at
        // offsets from a buffer of its size (nothing is read there): --zero
        // 1 the full parameters, 2, 3 the unit gradient buffer
        int u0 = f->zero == 1 ? 0 : i, nu = f->zero == 1 ? z->units : 1;
        float* origin = f->zero == 1 ? f->full_params : f->unit_grads;
        for (int write = 1; write >= 0; write--) {
            CkptList full = {0};
            slices(ctx, &full, write, CKPT_PARAMS, u0, nu, origin);
            UnitCut cut = {&full, origin};
            fsdp_ckpt_shard(f, i, write ? own : need, f->zero == 3 || (write && f->zero == 2), cut_unit, &cut);
            ckpt_list_free(&full);
        }
        if (f->zero == 2) slices(ctx, need, 0, CKPT_PARAMS, u0, nu, f->full_params + f->padded_off[i]);  // read whole
    }
}

void zero_buffer_sharding(ShardTable* t, const ZeroBuffer* z, const char* name, const char* shape, const char* spec,
                          const char* group, const char* slice) {
    double f = sizeof(float), n = (double)z->n, S = (double)z->S;  // S = n without --zero
    char flat[64];
    snprintf(flat, sizeof(flat), "%s flat/%s", spec, group);
    shard_table_add(t, name, shape, spec, spec, z->zero ? flat : spec, slice, f * (z->zero == 3 ? S : n),
                    z->zero > 1 ? 0 : f * n, 2 * f * S);
}

void zero_buffer_sharding_engine(ShardTable* t, const ZeroBuffer* z) {
    if (!z->zero) return;
    const FSDP* e = &z->f;
    double f = sizeof(float), pad = f * (double)(e->padded_total - z->n), tied = 0;
    if (z->zero < 3)
        shard_table_add(t, "ZeRO padding", "", "tails", z->zero == 1 ? "tails" : NULL, NULL, "", pad,
                        z->zero == 1 ? pad : 0, 0);
    if (z->zero == 3)
        shard_table_add(t, "gather slots", "", "gathered", NULL, NULL, "2 x the largest unit",
                        2 * f * (double)e->max_padded, 0, 0);
    shard_table_add(t, "ZeRO grad shard", "", NULL, z->zero == 1 ? "flat" : "units/group", NULL, "mine", 0,
                    f * (double)z->S, 0);
    if (z->zero == 1) return;  // its full gradient is the buffer's row
    for (int i = 0; i < e->n; i++)
        if (e->own_grads[i]) tied += (double)(e->shard[i] * (size_t)e->dp->size);
    shard_table_add(t, "unit gradient", "", NULL, "(-)", NULL, "the largest unit, wte's", 0,
                    f * ((double)e->max_padded + tied), 0);
}
