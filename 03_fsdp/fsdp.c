// fsdp.c: the FSDP engine (fsdp.h): shards, gather slots, reduce-scatter,
// the sharded AdamW step.
#include "fsdp.h"

#include <stdlib.h>
#include <string.h>

#include "errors.h"
#include "exercise.h"  // exercise_not_done, in a homework tree
#include "memory.h"
#include "device_clock.h"
#include "runtime.h"
#include "sharding.h"

// ---------------------------------------------------------------- units and shards

static void units_make(FSDP* f, const FsdpSpec* spec, int N) {
    // EXERCISE 1: the shard layout: f->n and its per-unit arrays (allocated here), each unit's shard S = ceil(n / N), where each rank's shard and each padded unit start, the totals
    f->n = spec->n_units;
    f->numel = xmalloc(sizeof(size_t) * f->n);
    f->shard = xmalloc(sizeof(size_t) * f->n);
    f->shard_off = xmalloc(sizeof(size_t) * f->n);
    f->padded_off = xmalloc(sizeof(size_t) * f->n);
    f->shard_total = f->padded_total = f->max_padded = 0;
    for (int i = 0; i < f->n; i++) {
        f->numel[i] = spec->numel[i];
        f->shard[i] = (f->numel[i] + N - 1) / N;
        f->shard_off[i] = f->shard_total;
        f->padded_off[i] = f->padded_total;
        f->shard_total += f->shard[i];
        f->padded_total += f->shard[i] * N;
        if (f->shard[i] * N > f->max_padded) f->max_padded = f->shard[i] * N;
    }
    // END EXERCISE 1
}

// The part of rank r's shard of unit i that is real (not padding): [lo, hi)
// as offsets inside the unit.
static void shard_range(const FSDP* f, int i, int r, size_t* lo, size_t* hi) {
    // EXERCISE 2: the shard range: the part [lo, hi) of rank r's shard of unit i that is real, not padding
    *lo = (size_t)r * f->shard[i];
    *hi = *lo + f->shard[i];
    if (*lo > f->numel[i]) *lo = f->numel[i];
    if (*hi > f->numel[i]) *hi = f->numel[i];
    // END EXERCISE 2
}

// ---------------------------------------------------------------- set-up

void fsdp_create(FSDP* f, const Comm* dp, const FsdpSpec* spec, int zero, int prefetch, int reshard) {
    memset(f, 0, sizeof(*f));
    f->dp = dp;
    f->zero = zero;
    f->prefetch = prefetch;
    f->reshard = reshard;
    int N = dp->size, r = dp->rank;
    units_make(f, spec, N);
    // this rank's shard of the initial parameters, on the host
    float* shard_host = xcalloc(f->shard_total, sizeof(float));
    char msg[ERROR_MAX];
    const char* bad = NULL;
    for (int i = 0; i < f->n && !bad; i++) {
        size_t lo, hi;
        shard_range(f, i, r, &lo, &hi);
        bad = spec->fill(spec->fill_ctx, i, lo, hi - lo, shard_host + f->shard_off[i], msg, sizeof(msg));
    }
    fail_if_any(bad != NULL, bad);
    if (zero == 3) {
        f->shard_params = mem_alloc_floats(f->shard_total, MEM_PARAMS);
        mem_to_device(f->shard_params, shard_host, f->shard_total * sizeof(float));
        f->n_slots = reshard ? 2 : f->n;
        f->slot_buf = xmalloc(sizeof(float*) * f->n_slots);
        f->slot_req = xcalloc((size_t)f->n_slots, sizeof(CommRequest));
        f->unit_in_slot = xmalloc(sizeof(int) * f->n_slots);
        f->slot_prefetched = xcalloc((size_t)f->n_slots, sizeof(int));
        f->slot_clock = xcalloc((size_t)f->n_slots, sizeof(DeviceClock));  // zeroed: reset
        for (int s = 0; s < f->n_slots; s++) {
            // resharding: two slots, each big enough for any unit; keeping:
            // slot i holds unit i, so together they hold the padded model
            size_t size = reshard ? f->max_padded : f->shard[s] * N;
            f->slot_buf[s] = mem_alloc_floats(size, MEM_PARAMS);
            f->unit_in_slot[s] = -1;
        }
    } else {
        // full parameters, assembled once from the shards
        f->full_params = mem_alloc_floats(f->padded_total, MEM_PARAMS);
        for (int i = 0; i < f->n; i++) {
            float* full = f->full_params + f->padded_off[i];
            mem_to_device(full + (size_t)r * f->shard[i], shard_host + f->shard_off[i], f->shard[i] * sizeof(float));
            comm_allgather(dp, full + (size_t)r * f->shard[i], full, f->shard[i]);
        }
    }
    free(shard_host);
    f->slot_of_unit = xmalloc(sizeof(int) * f->n);
    for (int i = 0; i < f->n; i++) f->slot_of_unit[i] = -1;
    f->shard_grads = mem_alloc_floats(f->shard_total, MEM_GRADS);
    f->own_grads = xcalloc((size_t)f->n, sizeof(float*));
    if (zero == 1) {
        f->full_grads = mem_alloc_floats(f->padded_total, MEM_GRADS);
    } else {
        f->unit_grads = mem_alloc_floats(f->max_padded, MEM_GRADS);
        for (int i = 0; i < f->n; i++)
            if (spec->own_grads && spec->own_grads[i]) f->own_grads[i] = mem_alloc_floats(f->shard[i] * N, MEM_GRADS);
    }
    f->m = mem_alloc_floats(f->shard_total, MEM_OPTIMIZER);
    f->v = mem_alloc_floats(f->shard_total, MEM_OPTIMIZER);
}

void fsdp_check_flags(int zero, int prefetch, int reshard) {
    if (zero < 1 || zero > 3) fail_all("--zero %d: the stages are 1, 2 and 3", zero);
    if ((prefetch != 0 && prefetch != 1) || (reshard != 0 && reshard != 1))
        fail_all("--prefetch and --reshard take 0 or 1");
    // ZeRO-1/2 keep the full parameters all the time: nothing is freed after
    // forward, so there is nothing to keep instead (--prefetch 0 is allowed
    // there and does nothing, as main.c notes: no unit is gathered in forward)
    if (reshard == 0 && zero != 3)
        fail_all("--reshard 0 applies to --zero 3 only: ZeRO-%d never frees parameters; drop --reshard or use --zero 3",
                 zero);
}

void fsdp_free(FSDP* f) {
    mem_free(f->shard_params);
    mem_free(f->full_params);
    mem_free(f->shard_grads);
    mem_free(f->full_grads);
    mem_free(f->unit_grads);
    for (int i = 0; i < f->n; i++) mem_free(f->own_grads[i]);
    free(f->own_grads);
    mem_free(f->m);
    mem_free(f->v);
    for (int s = 0; s < f->n_slots; s++) mem_free(f->slot_buf[s]);
    free(f->slot_buf);
    free(f->slot_req);
    for (int s = 0; s < f->n_slots; s++) device_clock_free(&f->slot_clock[s]);
    free(f->slot_clock);
    device_clock_free(&f->allgather_clock);
    device_clock_free(&f->blocked_clock);
    free(f->slot_prefetched);
    free(f->unit_in_slot);
    free(f->slot_of_unit);
    free(f->numel);
    free(f->shard);
    free(f->shard_off);
    free(f->padded_off);
}

// ---------------------------------------------------------------- gathering a unit (zero 3)

// Starts gathering unit i into a free slot: every rank contributes its shard,
// every rank receives the whole (padded) unit. Returns 0 when there was
// nothing to start.
static int request_unit(FSDP* f, int i) {
    if (f->slot_of_unit[i] >= 0) return 0;  // already here (or on its way)
    int s = f->reshard ? f->next_slot : i;
    f->next_slot ^= 1;
    if (f->unit_in_slot[s] >= 0) f->slot_of_unit[f->unit_in_slot[s]] = -1;  // evict
    f->unit_in_slot[s] = i;
    f->slot_of_unit[i] = s;
    f->slot_prefetched[s] = 0;  // fsdp_prefetch marks its own
    // EXERCISE 4: the ZeRO-3 gather: all-gather unit i from every rank's shard into slot s (non-blocking when prefetching)
    const float* mine = f->shard_params + f->shard_off[i];
    if (f->prefetch) {
        comm_iallgather(f->dp, mine, f->slot_buf[s], f->shard[i], &f->slot_req[s]);
    } else {
        comm_allgather(f->dp, mine, f->slot_buf[s], f->shard[i]);
    }
    return 1;
    // END EXERCISE 4
}

// The time blocked here (a blocking gather, or the wait on a gather still in
// flight) is the all-gather wait that prefetching tries to remove. Both are
// the comm layer's waits, counted in the engine's clocks as they happen
// (comm_wait_clock_begin): on CUDA a wait is timed on the GPU, and reading
// comm_wait_seconds around it would make the host wait for the GPU here.
float* fsdp_unit_params(FSDP* f, int i) {
    if (f->zero < 3) return f->full_params + f->padded_off[i];
    comm_wait_clock_begin(&f->allgather_clock);
    request_unit(f, i);  // nothing when a prefetch brought it
    int s = f->slot_of_unit[i];
    int prefetched = f->slot_req[s].active && f->slot_prefetched[s];
    if (prefetched) comm_wait_clock_begin(&f->blocked_clock);
    comm_wait(&f->slot_req[s]);
    if (prefetched) {
        comm_wait_clock_end(&f->blocked_clock);
        device_clock_stop(&f->slot_clock[s]);  // in flight: from its start to here
        f->slot_prefetched[s] = 0;
    }
    comm_wait_clock_end(&f->allgather_clock);
    return f->slot_buf[s];
}

// The in-flight span starts where the gather does: on CUDA its event sits
// in the compute stream at the point the gather's stream waits for (the
// compute queued before the gather), and its stop after the wait, where the
// compute stream has the gathered unit.
void fsdp_prefetch(FSDP* f, int i) {
    if (f->zero == 3 && f->prefetch && request_unit(f, i)) {
        int s = f->slot_of_unit[i];
        f->gathers_prefetched++;
        f->slot_prefetched[s] = 1;
        device_clock_start(&f->slot_clock[s]);
    }
}

double fsdp_prefetch_inflight_s(FSDP* f) {
    double s = 0.0;
    for (int k = 0; k < f->n_slots; k++) s += device_clock_seconds(&f->slot_clock[k]);
    return s;
}

double fsdp_allgather_wait_s(FSDP* f) { return device_clock_seconds(&f->allgather_clock); }
double fsdp_prefetch_blocked_s(FSDP* f) { return device_clock_seconds(&f->blocked_clock); }

void fsdp_drop_gathered(FSDP* f) {
    for (int i = 0; i < f->n; i++) f->slot_of_unit[i] = -1;
    for (int s = 0; s < f->n_slots; s++) f->unit_in_slot[s] = -1;
}

// ---------------------------------------------------------------- gradients

float* fsdp_grads_begin(FSDP* f, int i) {
    float* g;
    if (f->zero == 1) g = f->full_grads + f->padded_off[i];
    else g = f->own_grads[i] ? f->own_grads[i] : f->unit_grads;
    ops_zero(g, f->shard[i] * f->dp->size);
    return g;
}

void fsdp_reduce_grads(FSDP* f, int i) {
    // EXERCISE 3: the reduce-scatter of a unit: rank r keeps the mean over ranks of its shard of the unit's gradient
    const float* g;
    if (f->zero == 1) g = f->full_grads + f->padded_off[i];
    else g = f->own_grads[i] ? f->own_grads[i] : f->unit_grads;
    comm_reduce_scatter(f->dp, g, f->shard_grads + f->shard_off[i], f->shard[i], COMM_AVG);
    // END EXERCISE 3
}

void fsdp_grad_sumsq(const FSDP* f, double* sumsq) { grad_sumsq(sumsq, f->shard_grads, f->shard_total); }

void fsdp_grad_sumsq_range(const FSDP* f, int i, size_t lo, size_t n, double* sumsq) {
    // the overlap of [lo, lo + n) with this rank's shard of unit i
    size_t s_lo, s_hi, hi = lo + n;
    shard_range(f, i, f->dp->rank, &s_lo, &s_hi);
    if (lo < s_lo) lo = s_lo;
    if (hi > s_hi) hi = s_hi;
    if (lo >= hi) return;
    grad_sumsq(sumsq, f->shard_grads + f->shard_off[i] + (lo - s_lo), hi - lo);
}

// Padding is every float of a shard past its unit's end (the last ranks'
// tails): it starts at zero and, its gradient being zero, AdamW never moves
// it. A nonzero one means a shard range overran its unit somewhere.
size_t fsdp_padding_nonzero(const FSDP* f) {
    int r = f->dp->rank, N = f->dp->size;
    size_t bad = 0;
    const float* shard_bufs[4] = {f->zero == 3 ? f->shard_params : NULL, f->shard_grads, f->m, f->v};
    float* host = xmalloc((f->zero == 3 ? f->shard_total : f->padded_total) * sizeof(float));
    for (int k = 0; k < 4; k++) {
        if (!shard_bufs[k]) continue;
        mem_to_host(host, shard_bufs[k], f->shard_total * sizeof(float));
        for (int i = 0; i < f->n; i++) {
            // worked out here, not by shard_range, so that a wrong range
            // cannot hide its own overrun: rank r's real floats of unit i
            size_t start = (size_t)r * f->shard[i];
            size_t real = start >= f->numel[i] ? 0 : f->numel[i] - start;
            if (real > f->shard[i]) real = f->shard[i];
            for (size_t j = real; j < f->shard[i]; j++) bad += host[f->shard_off[i] + j] != 0.0f;
        }
    }
    if (f->zero < 3) {
        // every rank holds the full padded parameters
        mem_to_host(host, f->full_params, f->padded_total * sizeof(float));
        for (int i = 0; i < f->n; i++)
            for (size_t j = f->numel[i]; j < f->shard[i] * (size_t)N; j++) bad += host[f->padded_off[i] + j] != 0.0f;
    }
    free(host);
    return bad;
}

// ---------------------------------------------------------------- the step

void fsdp_step(FSDP* f, AdamWConfig opt, int t, float scale) {
    if (f->zero == 3) {
        // the shard is the only copy of the parameters: update it, done
        adamw_update(f->shard_params, f->shard_grads, f->m, f->v, f->shard_total, opt, t, scale);
        return;
    }
    // zero 1, 2: update this rank's shard of the full parameters in place,
    // then all-gather so every rank has every updated shard (their waits
    // timed in allgather_clock)
    comm_wait_clock_begin(&f->allgather_clock);
    // EXERCISE 5: the ZeRO-1/2 step: AdamW on this rank's shard of each unit, then every rank gets every updated shard
    int r = f->dp->rank;
    for (int i = 0; i < f->n; i++) {
        float* full = f->full_params + f->padded_off[i];
        size_t S = f->shard[i], so = f->shard_off[i];
        adamw_update(full + (size_t)r * S, f->shard_grads + so, f->m + so, f->v + so, S, opt, t, scale);
    }
    for (int i = 0; i < f->n; i++) {
        float* full = f->full_params + f->padded_off[i];
        comm_allgather(f->dp, full + (size_t)r * f->shard[i], full, f->shard[i]);
    }
    // END EXERCISE 5
    comm_wait_clock_end(&f->allgather_clock);
}

// ---------------------------------------------------------------- checkpoints

void fsdp_ckpt_shard(const FSDP* f, int i, CkptList* out, int params, FsdpSlices slices, void* ctx) {
    size_t lo, hi, so = f->shard_off[i];
    shard_range(f, i, f->dp->rank, &lo, &hi);
    if (params)
        slices(ctx, out, i, lo, hi - lo, CKPT_PARAMS,
               f->zero == 3 ? f->shard_params + so : f->full_params + f->padded_off[i] + lo);
    slices(ctx, out, i, lo, hi - lo, CKPT_M, f->m + so);
    slices(ctx, out, i, lo, hi - lo, CKPT_V, f->v + so);
}

// ---------------------------------------------------------------- the whole

float* fsdp_gather_host(FSDP* f) {
    size_t total = 0;
    for (int i = 0; i < f->n; i++) total += f->numel[i];
    float* host = f->dp->rank == 0 ? xmalloc(total * sizeof(float)) : NULL;
    float* buf = mem_alloc_floats(f->max_padded, MEM_OTHER);
    size_t off = 0;
    for (int i = 0; i < f->n; i++) {
        const float* unit;
        if (f->zero == 3) {
            comm_allgather(f->dp, f->shard_params + f->shard_off[i], buf, f->shard[i]);
            unit = buf;
        } else {
            unit = f->full_params + f->padded_off[i];
        }
        if (host) mem_to_host(host + off, unit, f->numel[i] * sizeof(float));
        off += f->numel[i];
    }
    mem_free(buf);
    return host;
}

// ---------------------------------------------------------------- --show-sharding

void fsdp_show_sharding(const FSDP* f, const ShardTensor* tensors, int n, const GPTConfig* cfg, int show,
                        const char* title) {
    if (!show) return;
    ShardTensor* own = NULL;
    if (!tensors) {
        own = xmalloc(sizeof(ShardTensor) * (4 + 12 * (size_t)cfg->num_layers));
        n = sharding_gpt_tensors(cfg, own);
        tensors = own;
    }
    int N = f->dp->size;
    ShardTable* t = xcalloc(1, sizeof(ShardTable));
    sharding_add_flat(t, tensors, n, f->numel, f->shard, f->n, N, f->dp->rank, f->zero);
    double b = sizeof(float);
    if (f->zero == 3)  // the units gathered whole: two alternating slots, or one per unit
        shard_table_add(t, "gather slots", "", "gathered", "", "", f->reshard ? "2 x the largest unit" : "every unit",
                        b * (double)(f->reshard ? 2 * f->max_padded : f->padded_total), 0, 0);
    if (f->zero == 1) {
        shard_table_add(t, "full gradient", "", "", "(-)", "", "every unit", 0, b * (double)f->padded_total, 0);
    } else {
        shard_table_add(t, "unit gradient", "", "", "(-)", "", "the largest unit", 0, b * (double)f->max_padded, 0);
        for (int i = 0; i < f->n; i++)
            if (f->own_grads[i])
                shard_table_add(t, "tied gradient", "", "", "(-)", "", "unit 0 whole", 0,
                                b * (double)(f->shard[i] * N), 0);
    }
    shard_table_show(t, show, title);
    free(t);
    free(own);
}
