// Chapter 3: fully sharded data parallelism (ZeRO stages 1, 2 and 3).
//
// Data parallelism (chapter 2) keeps N full copies of everything: parameters,
// gradients and the two AdamW moments, 16 bytes per parameter on every rank.
// ZeRO removes the copies, one kind of state at a time:
//   --zero 1  the AdamW moments are sharded: rank r keeps and updates only
//             its 1/N; gradients are reduce-scattered (each rank needs only
//             the sum of its shard) and the updated shards all-gathered.
//   --zero 2  the gradients too: each unit's gradient is reduce-scattered as
//             soon as backward has produced it, and its full buffer reused.
//   --zero 3  the parameters too: a unit's parameters exist in full only in a
//             gather buffer, all-gathered just before the unit runs.
//
//   mpirun -np 4 build/chapter-3 --dp 4 --zero 3
//
// A "unit" is what is gathered at once, one contiguous range of the flat
// layer-major layout: unit 0 = [wte wpe], unit 1+l = block l, unit L+1 =
// [lnfw lnfb]. Rank r owns floats [r*S, (r+1)*S) of each unit of n floats,
// S = ceil(n / N); the last ranks' tails past n are padding that starts at
// zero and stays zero (its gradient is zero, so AdamW never moves it).
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "args.h"
#include "comm.h"
#include "common.h"
#include "memory.h"
#include "mesh.h"
#include "model.h"
#include "report.h"
#include "runtime.h"
#include "train.h"

// ---------------------------------------------------------------- units and shards

typedef struct {
    int n;               // number of units: L + 2
    size_t* off;         // flat offset of unit u in the model's layout
    size_t* numel;       // floats in unit u
    size_t* shard;       // S_u = ceil(numel_u / N), floats each rank owns of unit u
    size_t* shard_off;   // where unit u's shard starts in this rank's shard buffers
    size_t* padded_off;  // where unit u starts in a padded full layout (N*S_u per unit)
    size_t shard_total;  // sum of S_u: this rank's floats of each kind of state
    size_t padded_total; // N * shard_total: the full model with padding
    size_t max_padded;   // max N*S_u: one gather buffer
} Units;

static void units_make(Units* u, const GPTConfig* cfg, int N) {
    int L = cfg->num_layers;
    u->n = L + 2;
    u->off = xmalloc(sizeof(size_t) * u->n);
    u->numel = xmalloc(sizeof(size_t) * u->n);
    u->shard = xmalloc(sizeof(size_t) * u->n);
    u->shard_off = xmalloc(sizeof(size_t) * u->n);
    u->padded_off = xmalloc(sizeof(size_t) * u->n);
    u->off[0] = 0;
    u->numel[0] = param_tensor_numel(cfg, P_WTE) + param_tensor_numel(cfg, P_WPE);
    for (int l = 0; l < L; l++) {
        u->off[1 + l] = gpt_block_offset(cfg, l);
        u->numel[1 + l] = gpt_block_numel(cfg->channels);
    }
    u->off[L + 1] = gpt_tensor_offset(cfg, P_LNFW, 0);
    u->numel[L + 1] = 2 * (size_t)cfg->channels;
    u->shard_total = u->padded_total = u->max_padded = 0;
    for (int i = 0; i < u->n; i++) {
        u->shard[i] = (u->numel[i] + N - 1) / N;
        u->shard_off[i] = u->shard_total;
        u->padded_off[i] = u->padded_total;
        u->shard_total += u->shard[i];
        u->padded_total += u->shard[i] * N;
        if (u->shard[i] * N > u->max_padded) u->max_padded = u->shard[i] * N;
    }
}

// The part of rank r's shard of unit i that is real (not padding): [lo, hi)
// as offsets inside the unit.
static void shard_range(const Units* u, int i, int r, size_t* lo, size_t* hi) {
    *lo = (size_t)r * u->shard[i];
    *hi = *lo + u->shard[i];
    if (*lo > u->numel[i]) *lo = u->numel[i];
    if (*hi > u->numel[i]) *hi = u->numel[i];
}

// ---------------------------------------------------------------- the sharded state

typedef struct {
    const Comm* dp;
    int zero, prefetch, reshard;
    GPTConfig cfg;
    Units u;
    // zero 3: this rank's parameter shard; zero 1, 2: full parameters in the
    // padded layout (each rank updates its shard of them in place)
    float* shard_params;   // (shard_total)           zero 3
    float* full_params;    // (padded_total)          zero 1, 2
    float* shard_grads;    // (shard_total) the reduced gradient of this rank's shard
    float* full_grads;     // (padded_total)          zero 1: backward writes here
    float* unit_grads;     // (max_padded)            zero 2, 3: one unit's gradient
    float* unit0_grads;    // (N*S_0)                 zero 2, 3: the tied embedding's
    float* m;              // (shard_total) AdamW moments of this rank's shard
    float* v;
    // zero 3: gather buffers. With resharding, two slots that alternate: one
    // unit computes while the next arrives. Without, one slot per unit.
    int n_slots, next_slot;
    float** slot_buf;      // (n_slots) x (max_padded), or slot i x (N*S_i)
    int* slot_of_unit;     // (units) the slot holding unit u, or -1
    int* unit_in_slot;     // (n_slots)
    CommRequest* slot_req; // the gather in flight into each slot
    float* norm_buf;       // (1) the sum of squares to all-reduce
    GPTActs acts;
    // what the prefetch does, for the summary: unit gathers started ahead of
    // need (compute runs between their start and their wait), and the seconds
    // blocked on parameter all-gathers (the comm layer's wait clock, so it is
    // the all-gather part of comm_wait_seconds)
    long gathers_prefetched;
    double allgather_wait_s;
    // how much of the prefetched gathers' time in flight compute hid: each
    // slot remembers when its prefetched gather started; unit_params adds
    // the seconds from that start to the end of its wait (in flight) and
    // the seconds of the wait itself (blocked)
    double* slot_started;  // (n_slots) now_seconds() at the start, < 0: not prefetched
    double prefetch_inflight_s, prefetch_blocked_s;
} FSDP;

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
    const float* mine = f->shard_params + f->u.shard_off[i];
    if (f->prefetch) {
        comm_iallgather(f->dp, mine, f->slot_buf[s], f->u.shard[i], &f->slot_req[s]);
    } else {
        comm_allgather(f->dp, mine, f->slot_buf[s], f->u.shard[i]);
    }
    return 1;
}

// Unit i's full parameters, waiting for its gather if it is still in flight.
// The time blocked here (a blocking gather, or the wait on a gather still in
// flight) is the all-gather wait that prefetching tries to remove.
static float* unit_params(FSDP* f, int i) {
    if (f->zero < 3) return f->full_params + f->u.padded_off[i];
    double w0 = comm_wait_seconds();
    request_unit(f, i);
    int s = f->slot_of_unit[i];
    double t0 = now_seconds();
    int prefetched = f->slot_req[s].active && f->slot_started[s] >= 0;
    comm_wait(&f->slot_req[s]);
    if (prefetched) {
        double t1 = now_seconds();
        f->prefetch_inflight_s += t1 - f->slot_started[s];
        f->prefetch_blocked_s += t1 - t0;
        f->slot_started[s] = -1;
    }
    f->allgather_wait_s += comm_wait_seconds() - w0;
    return f->slot_buf[s];
}

// With --prefetch, the next unit's all-gather starts before the current unit
// computes, so the transfer hides behind the compute; without, it is gathered
// (blocking) when needed.
static void prefetch_unit(FSDP* f, int i) {
    if (f->zero == 3 && f->prefetch && request_unit(f, i)) {
        f->gathers_prefetched++;
        f->slot_started[f->slot_of_unit[i]] = now_seconds();
    }
}

// ---------------------------------------------------------------- reducing a unit's gradient

// The gradient buffer backward writes unit i's gradient into.
static float* unit_grad_buffer(FSDP* f, int i) {
    if (f->zero == 1) return f->full_grads + f->u.padded_off[i];
    return i == 0 ? f->unit0_grads : f->unit_grads;
}

// Reduce-scatter: rank r receives the sum over ranks of its shard of unit
// i's gradient, averaged (every rank's gradient is the mean over its own
// sequences; the average of those is the mean over the global batch).
static void reduce_unit_grads(FSDP* f, int i) {
    comm_reduce_scatter(f->dp, unit_grad_buffer(f, i), f->shard_grads + f->u.shard_off[i], f->u.shard[i],
                        COMM_AVG);
}

// ---------------------------------------------------------------- forward and backward

// After the optimizer step every gathered copy is stale: forget them all.
static void drop_gathered_units(FSDP* f) {
    for (int i = 0; i < f->u.n; i++) f->slot_of_unit[i] = -1;
    for (int s = 0; s < f->n_slots; s++) f->unit_in_slot[s] = -1;
}

// The order units are used in forward: the embedding, the blocks, the final
// LayerNorm, and the embedding again for the tied LM head. Each prefetch sits
// where the next unit's gather can run behind compute.
static float forward(FSDP* f, const int* inputs, const int* targets) {
    const GPTConfig* c = &f->cfg;
    int B = f->acts.B, T = f->acts.T, C = c->channels, NH = c->num_heads, L = c->num_layers;
    drop_gathered_units(f);
    gpt_acts_load(&f->acts, inputs, targets);
    float* emb = unit_params(f, 0);
    prefetch_unit(f, 1);
    encoder_forward(f->acts.encoded, f->acts.inputs, emb, emb + param_tensor_numel(c, P_WTE), B, T, C);
    const float* x = f->acts.encoded;
    for (int l = 0; l < L; l++) {
        BlockParams p = block_params_at(unit_params(f, 1 + l), C);
        prefetch_unit(f, l + 2);  // the next block, or [lnfw lnfb] after the last
        BlockActs a = gpt_acts_block(&f->acts, c, l, B, T);
        block_forward(&p, &a, x, B, T, C, NH);
        x = a.res3;
    }
    float* lnf = unit_params(f, L + 1);
    // the LM head is the token embedding: unit 0 is needed again (with
    // resharding it was freed after the embedding and is gathered anew). No
    // prefetch can hide this gather: until now both slots were busy (the
    // last block computing, [lnfw lnfb] arriving), and the head needs both.
    float* wte = unit_params(f, 0);
    HeadActs h = gpt_acts_head(&f->acts, c, B, T);
    head_forward(c, wte, lnf, lnf + C, &h, x, f->acts.targets, B, T);
    return gpt_acts_mean_loss(&f->acts, c);
}

static void backward(FSDP* f) {
    const GPTConfig* c = &f->cfg;
    int B = f->acts.B, T = f->acts.T, C = c->channels, NH = c->num_heads, L = c->num_layers;
    HeadActs h = gpt_acts_head(&f->acts, c, B, T);
    BlockScratch s = gpt_acts_scratch(&f->acts, c);
    // the head: the final LayerNorm's and the tied embedding's gradients. The
    // embedding's stays in its own buffer until the embedding backward at the
    // very end has added the token lookups' share.
    float* g_emb = unit_grad_buffer(f, 0);
    float* g_lnf = unit_grad_buffer(f, L + 1);
    if (f->zero > 1) {
        ops_zero(g_emb, f->u.shard[0] * f->dp->size);
        ops_zero(g_lnf, f->u.shard[L + 1] * f->dp->size);
    }
    float* lnf = unit_params(f, L + 1);
    float* wte = unit_params(f, 0);
    const float* last = gpt_acts_block(&f->acts, c, L - 1, B, T).res3;
    head_backward(c, wte, lnf, g_emb, g_lnf, g_lnf + C, &h, last, f->acts.targets, 1.0f / (float)(B * T), s.dln,
                  f->acts.dres, B, T);
    if (f->zero > 1) reduce_unit_grads(f, L + 1);
    // the blocks, last to first: gather, backward, reduce-scatter. The last
    // block's gather cannot be prefetched (the head's backward needed both
    // slots); each block's backward hides the gather of the block before it.
    for (int l = L - 1; l >= 0; l--) {
        BlockParams p = block_params_at(unit_params(f, 1 + l), C);
        if (l > 0) prefetch_unit(f, l);
        float* g_unit = unit_grad_buffer(f, 1 + l);
        if (f->zero > 1) ops_zero(g_unit, f->u.shard[1 + l] * f->dp->size);
        BlockParams g = block_params_at(g_unit, C);
        BlockActs a = gpt_acts_block(&f->acts, c, l, B, T);
        const float* x = l > 0 ? gpt_acts_block(&f->acts, c, l - 1, B, T).res3 : f->acts.encoded;
        block_backward(&p, &g, &a, &s, x, f->acts.dres, B, T, C, NH);
        if (f->zero > 1) reduce_unit_grads(f, 1 + l);
    }
    // the embedding: token lookups add into the tied wte's gradient
    encoder_backward(g_emb, g_emb + param_tensor_numel(c, P_WTE), f->acts.dres, f->acts.inputs, B, T, C);
    if (f->zero > 1) {
        reduce_unit_grads(f, 0);
    } else {
        // zero 1: backward filled the full gradient; now every unit at once
        for (int i = 0; i < f->u.n; i++) reduce_unit_grads(f, i);
    }
}

// ---------------------------------------------------------------- validation

// Mean loss over the first n_batches global batches of the validation set,
// the same tokens as train_val_loss in every other chapter: each rank runs
// its B/N sequences of every batch through the same sharded forward (same
// gathers) as training, and the means are averaged over ranks and batches.
// -1 when there is no validation data.
static float val_loss(FSDP* f, const TrainSetup* s, int n_batches, int* inputs, int* targets) {
    size_t per_epoch = data_batches_per_epoch(&s->val, s->B, s->T);
    if (per_epoch == 0) return -1.0f;
    if ((size_t)n_batches > per_epoch) n_batches = (int)per_epoch;
    int micro = f->acts.B;
    double mine = 0.0;
    for (int i = 0; i < n_batches; i++) {
        data_batch(&s->val, i, s->B, s->T, f->dp->rank * micro, micro, inputs, targets);
        mine += forward(f, inputs, targets);
    }
    // a host scalar for the log, plain MPI like the training loss
    double total = 0.0;
    MPI_CHECK(MPI_Allreduce(&mine, &total, 1, MPI_DOUBLE, MPI_SUM, f->dp->mpi));
    return (float)(total / ((double)f->dp->size * n_batches));
}

// ---------------------------------------------------------------- the optimizer step on the shard

static float step(FSDP* f, const TrainArgs* args, int t) {
    // global norm: each rank's shards hold disjoint pieces of the gradient, so
    // the sum of squares is summed over ranks before the square root
    double local = grad_sumsq(f->shard_grads, f->u.shard_total);
    float sumsq = (float)local;
    mem_to_device(f->norm_buf, &sumsq, sizeof(float));
    comm_allreduce(f->dp, f->norm_buf, 1, COMM_SUM);
    mem_to_host(&sumsq, f->norm_buf, sizeof(float));
    double norm = sqrt((double)sumsq);
    float scale = grad_clip_scale(norm, args->clip);
    AdamWConfig opt = {.lr = args->lr, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = args->wd};
    int r = f->dp->rank;
    if (f->zero == 3) {
        // the shard is the only copy of the parameters: update it, done
        adamw_update(f->shard_params, f->shard_grads, f->m, f->v, f->u.shard_total, opt, t, scale);
    } else {
        // zero 1, 2: update this rank's shard of the full parameters in
        // place, then all-gather so every rank has every updated shard
        for (int i = 0; i < f->u.n; i++) {
            float* full = f->full_params + f->u.padded_off[i];
            size_t S = f->u.shard[i], so = f->u.shard_off[i];
            adamw_update(full + (size_t)r * S, f->shard_grads + so, f->m + so, f->v + so, S, opt, t, scale);
        }
        double w0 = comm_wait_seconds();
        for (int i = 0; i < f->u.n; i++) {
            float* full = f->full_params + f->u.padded_off[i];
            comm_allgather(f->dp, full + (size_t)r * f->u.shard[i], full, f->u.shard[i]);
        }
        f->allgather_wait_s += comm_wait_seconds() - w0;
    }
    return (float)norm;
}

// ---------------------------------------------------------------- set-up

// Each rank initialises (or reads) only its own shard of every unit.
static void fsdp_create(FSDP* f, const Comm* dp, const TrainSetup* setup, const TrainArgs* args, int zero,
                        int prefetch, int reshard, int micro) {
    memset(f, 0, sizeof(*f));
    f->dp = dp;
    f->zero = zero;
    f->prefetch = prefetch;
    f->reshard = reshard;
    f->cfg = setup->cfg;
    int N = dp->size, r = dp->rank;
    units_make(&f->u, &f->cfg, N);
    Units* u = &f->u;
    // this rank's shard of the initial parameters, on the host
    float* shard_host = xcalloc(u->shard_total, sizeof(float));
    char msg[1024];
    const char* bad = NULL;
    for (int i = 0; i < u->n && !bad; i++) {
        size_t lo, hi;
        shard_range(u, i, r, &lo, &hi);
        float* dst = shard_host + u->shard_off[i];
        if (setup->checkpoint)
            bad = checkpoint_read_range(setup->checkpoint, &f->cfg, dst, u->off[i] + lo, hi - lo, msg, sizeof(msg));
        else
            gpt_init_range(dst, u->off[i] + lo, hi - lo, &f->cfg, (uint64_t)args->seed);
    }
    fail_if_any(bad != NULL, bad);
    if (zero == 3) {
        f->shard_params = mem_alloc_floats(u->shard_total, MEM_PARAMS);
        mem_to_device(f->shard_params, shard_host, u->shard_total * sizeof(float));
        f->n_slots = reshard ? 2 : u->n;
        f->slot_buf = xmalloc(sizeof(float*) * f->n_slots);
        f->slot_req = xcalloc((size_t)f->n_slots, sizeof(CommRequest));
        f->unit_in_slot = xmalloc(sizeof(int) * f->n_slots);
        f->slot_started = xmalloc(sizeof(double) * f->n_slots);
        for (int s = 0; s < f->n_slots; s++) {
            f->slot_started[s] = -1;
            // resharding: two slots, each big enough for any unit; keeping:
            // slot i holds unit i, so together they hold the padded model
            size_t size = reshard ? u->max_padded : u->shard[s] * N;
            f->slot_buf[s] = mem_alloc_floats(size, MEM_PARAMS);
            f->unit_in_slot[s] = -1;
        }
    } else {
        // full parameters, assembled once from the shards
        f->full_params = mem_alloc_floats(u->padded_total, MEM_PARAMS);
        for (int i = 0; i < u->n; i++) {
            float* full = f->full_params + u->padded_off[i];
            mem_to_device(full + (size_t)r * u->shard[i], shard_host + u->shard_off[i], u->shard[i] * sizeof(float));
            comm_allgather(dp, full + (size_t)r * u->shard[i], full, u->shard[i]);
        }
    }
    free(shard_host);
    f->slot_of_unit = xmalloc(sizeof(int) * u->n);
    for (int i = 0; i < u->n; i++) f->slot_of_unit[i] = -1;
    f->shard_grads = mem_alloc_floats(u->shard_total, MEM_GRADS);
    if (zero == 1) {
        f->full_grads = mem_alloc_floats(u->padded_total, MEM_GRADS);
    } else {
        f->unit_grads = mem_alloc_floats(u->max_padded, MEM_GRADS);
        f->unit0_grads = mem_alloc_floats(u->shard[0] * N, MEM_GRADS);
    }
    f->m = mem_alloc_floats(u->shard_total, MEM_OPTIMIZER);
    f->v = mem_alloc_floats(u->shard_total, MEM_OPTIMIZER);
    f->norm_buf = mem_alloc_floats(1, MEM_OTHER);
    gpt_acts_create(&f->acts, &f->cfg, micro, setup->T);
}

static void fsdp_free(FSDP* f) {
    mem_free(f->shard_params);
    mem_free(f->full_params);
    mem_free(f->shard_grads);
    mem_free(f->full_grads);
    mem_free(f->unit_grads);
    mem_free(f->unit0_grads);
    mem_free(f->m);
    mem_free(f->v);
    mem_free(f->norm_buf);
    for (int s = 0; s < f->n_slots; s++) mem_free(f->slot_buf[s]);
    free(f->slot_buf);
    free(f->slot_req);
    free(f->unit_in_slot);
    free(f->slot_started);
    free(f->slot_of_unit);
    free(f->u.off);
    free(f->u.numel);
    free(f->u.shard);
    free(f->u.shard_off);
    free(f->u.padded_off);
    gpt_acts_free(&f->acts);
}

// The full model in the flat layout, on the host of rank 0, for --save and
// sampling: every unit gathered once (the only time it exists whole).
static float* gather_full_model(FSDP* f) {
    size_t P = gpt_num_params(&f->cfg);
    float* host = f->dp->rank == 0 ? xmalloc(P * sizeof(float)) : NULL;
    float* buf = mem_alloc_floats(f->u.max_padded, MEM_OTHER);
    for (int i = 0; i < f->u.n; i++) {
        const float* unit;
        if (f->zero == 3) {
            comm_allgather(f->dp, f->shard_params + f->u.shard_off[i], buf, f->u.shard[i]);
            unit = buf;
        } else {
            unit = f->full_params + f->u.padded_off[i];
        }
        if (host) mem_to_host(host + f->u.off[i], unit, f->u.numel[i] * sizeof(float));
    }
    mem_free(buf);
    return host;
}

// ---------------------------------------------------------------- main

int main(int argc, char** argv) {
    int zero = 3, prefetch = 1, reshard = 1;
    ArgSpec extra[] = {
        {"zero", ARG_INT, &zero, "ZeRO stage: 1 optimizer state, 2 + gradients, 3 + parameters  [3]"},
        {"prefetch", ARG_INT, &prefetch, "1: all-gather the next unit while this one computes (zero 3)  [1]"},
        {"reshard", ARG_INT, &reshard, "(zero 3) 1: free a unit's parameters after use and gather again in\n"
                                       "                         backward; 0: keep them from forward (memory for communication)  [1]"},
    };
    Run run;
    if (!run_start(&run, argc, argv, "build/chapter-3",
                   "Chapter 3: fully sharded data parallelism, ZeRO stages 1, 2 and 3.", extra,
                   sizeof(extra) / sizeof(extra[0]), 1u << AXIS_DP))
        return 0;
    if (zero < 1 || zero > 3) fail_all("--zero %d: the stages are 1, 2 and 3", zero);
    if ((prefetch != 0 && prefetch != 1) || (reshard != 0 && reshard != 1))
        fail_all("--prefetch and --reshard take 0 or 1");
    // ZeRO-1/2 keep the full parameters all the time: nothing is freed after
    // forward, so there is nothing to keep instead (--prefetch 0 is allowed
    // there and does nothing: no unit is ever gathered in forward)
    if (reshard == 0 && zero != 3)
        fail_all("--reshard 0 applies to --zero 3 only: ZeRO-%d never frees parameters; drop --reshard or use --zero 3",
                 zero);
    const TrainArgs* args = &run.args;
    const TrainSetup* setup = &run.setup;
    const Comm* dpc = &run.axes[AXIS_DP];
    int B = setup->B, T = setup->T, N = dpc->size;
    if (B % N != 0) fail_all("--batch %d does not split over dp=%d ranks: use a batch divisible by %d", B, N, N);
    int micro = B / N;

    FSDP f;
    fsdp_create(&f, dpc, setup, args, zero, prefetch, reshard, micro);
    size_t P = gpt_num_params(&setup->cfg);
    print0("chapter 3: ZeRO-%d over dp=%d, %d units, shard %zu of %zu parameters per rank (%zu padding), "
           "prefetch %s, reshard %s, device %s\n",
           zero, N, f.u.n, f.u.shard_total, P, f.u.padded_total - P, prefetch ? "on" : "off",
           reshard ? "on" : "off", run.device);
    char msg[1024];
    JsonLog log;
    const char* bad = jsonl_open(&log, args->log, msg, sizeof(msg));
    fail_if_any(bad != NULL, bad);

    int* inputs = xmalloc((size_t)micro * T * sizeof(int));
    int* targets = xmalloc((size_t)micro * T * sizeof(int));
    StepClock clock = {0};
    float loss = 0.0f, vloss = -1.0f;
    long prefetched = 0;        // unit gathers started ahead by prefetch_unit, all steps
    double allgather_wait = 0;  // seconds blocked on all-gathers, timed steps (as the clock)
    double pf_inflight = 0, pf_blocked = 0;  // the prefetched gathers, timed steps
    comm_counts_reset();  // count the training only, not the start-up gathers
    for (int s = 0; s < args->steps; s++) {
        long p0 = f.gathers_prefetched;
        double w0 = f.allgather_wait_s, i0 = f.prefetch_inflight_s, b0 = f.prefetch_blocked_s;
        int timed = clock.timed;
        clock_begin(&clock);
        data_batch(&setup->train, s, B, T, dpc->rank * micro, micro, inputs, targets);
        double mine = forward(&f, inputs, targets);
        if (f.zero == 1) mem_zero(f.full_grads, f.u.padded_total * sizeof(float));
        backward(&f);
        float norm = step(&f, args, s + 1);
        double dt = clock_end(&clock, s, args->steps);
        prefetched += f.gathers_prefetched - p0;
        if (clock.timed > timed) {
            allgather_wait += f.allgather_wait_s - w0;
            pf_inflight += f.prefetch_inflight_s - i0;
            pf_blocked += f.prefetch_blocked_s - b0;
        }
        // the global loss for the log line: a host scalar, plain MPI
        double total = 0.0;
        MPI_CHECK(MPI_Allreduce(&mine, &total, 1, MPI_DOUBLE, MPI_SUM, dpc->mpi));
        loss = (float)(total / N);
        report_step(&log, s, args->steps, loss, norm, 1e3 * dt, (double)B * T / dt);
        if (args->val_every > 0 && (s + 1) % args->val_every == 0 && s + 1 < args->steps) {
            // a forward-only pass through the same gathers (counted with the
            // steps' communication: it happens before the summary)
            vloss = val_loss(&f, setup, args->val_batches, inputs, targets);
            if (vloss >= 0) report_val(&log, s, vloss);
        }
    }
    double ms = clock_ms_per_step(&clock), wait_ms = clock_wait_ms_per_step(&clock);
    double progress_ms = clock_progress_ms_per_step(&clock);
    double ag_wait_ms = clock.timed ? 1e3 * allgather_wait / clock.timed : 0.0;
    double prefetched_per_step = args->steps ? (double)prefetched / args->steps : 0.0;
    print0("communication: %.2f ms per step blocked in collectives or waits (rank 0), %.2f of them in all-gathers, "
           "of %.2f ms per step; %.2f unit gathers per step prefetched\n",
           wait_ms, ag_wait_ms, ms, prefetched_per_step);
    // share hidden: of the time the prefetched gathers were in flight (start
    // to the end of their wait), the part the rank computed instead of
    // waiting; -1 when nothing was prefetched
    double hidden = pf_inflight > 0 ? 1.0 - pf_blocked / pf_inflight : -1.0;
    if (hidden >= 0)
        print0("prefetch: %.1f%% of the prefetched gathers' time in flight hidden behind compute (rank 0: %.2f ms "
               "blocked of %.2f ms in flight per step; comm_progress %s)\n",
               100.0 * hidden, clock.timed ? 1e3 * pf_blocked / clock.timed : 0.0,
               clock.timed ? 1e3 * pf_inflight / clock.timed : 0.0, comm_progress_on() ? "on" : "off");
    char extra_json[768];
    snprintf(extra_json, sizeof(extra_json),
             "\"zero\":%d,\"prefetch\":%d,\"reshard\":%d,\"units\":%d,\"shard_params\":%zu,\"padded_params\":%zu,"
             "\"max_unit_padded\":%zu,\"unit0_padded\":%zu,\"comm_wait_ms_per_step\":%.3f,"
             "\"comm_progress_ms_per_step\":%.3f,\"allgather_wait_ms_per_step\":%.3f,\"gathers_prefetched_per_step\":%g,"
             "\"prefetch_hidden_share\":%.4f,\"prefetch_blocked_ms_per_step\":%.3f,\"prefetch_inflight_ms_per_step\":%.3f,"
             "\"comm_progress\":%d",
             zero, prefetch, reshard, f.u.n, f.u.shard_total, f.u.padded_total, f.u.max_padded, f.u.shard[0] * N,
             wait_ms, progress_ms, ag_wait_ms, prefetched_per_step, hidden,
             clock.timed ? 1e3 * pf_blocked / clock.timed : 0.0, clock.timed ? 1e3 * pf_inflight / clock.timed : 0.0,
             comm_progress_on());
    RunSummary summary = {
        .chapter = 3, .model = setup->model_name, .num_params = P, .batch = B, .seq = T, .steps = args->steps,
        .ms_per_step = ms, .tokens_per_s = ms > 0 ? (double)B * T / (ms / 1e3) : 0.0,
        .flops_per_token = gpt_flops_per_token(&setup->cfg, T), .peak_gflops = run.peak_gflops, .final_loss = loss,
        .val_loss = -1.0f, .extra_json = extra_json};
    report_summary(&log, &run.mesh, &summary);
    // The validation loss of the final model (of the loaded one when --steps
    // 0). It runs after the summary has read the counters, so that without
    // --val-every the summary's communication is the training steps' alone
    // (ZeRO-3's validation gathers every unit again); its record follows the
    // summary's in the log.
    vloss = val_loss(&f, setup, args->val_batches, inputs, targets);
    if (vloss >= 0) report_val(&log, args->steps - 1, vloss);
    jsonl_close(&log);

    if (args->save || args->sample > 0) {
        float* host = gather_full_model(&f);
        if (args->sample > 0 && dpc->rank == 0) {
            // sampling runs the whole model on rank 0, from the gathered copy
            GPT m;
            gpt_create(&m, &setup->cfg, 1, T, 0);
            mem_to_device(m.params, host, P * sizeof(float));
            train_sample(&m, args);
            gpt_free(&m);
        }
        train_save(args, &setup->cfg, host, dpc->rank == 0);
        free(host);
    }
    free(inputs);
    free(targets);
    fsdp_free(&f);
    run_finish(&run);
    return 0;
}
