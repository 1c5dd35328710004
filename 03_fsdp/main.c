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
//
// The engine, 03_fsdp/fsdp.c (fsdp.h), keeps the shards, the gather buffers
// and the sharded AdamW step; later chapters link it. This file is the
// lesson: the model cut into units, and the forward and backward traversal
// that says where each unit is gathered, prefetched and reduce-scattered.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "args.h"
#include "ckpt.h"
#include "comm.h"
#include "errors.h"
#include "memory.h"
#include "mesh.h"
#include "model.h"
#include "rank.h"
#include "report.h"
#include "runtime.h"
#include "trace.h"
#include "run.h"
#include "train.h"
#include "train_eval.h"
#include "train_loop.h"
#include "train_step.h"

#include "fsdp.h"
#include "init.h"
#include "model_file.h"

// ---------------------------------------------------------------- the model as units

// The units of the flat layout: their sizes and where each starts.
static void gpt_units(const GPTConfig* cfg, size_t* off, size_t* numel) {
    int L = cfg->num_layers;
    off[0] = 0;
    numel[0] = param_tensor_numel(cfg, P_WTE) + param_tensor_numel(cfg, P_WPE);
    for (int l = 0; l < L; l++) {
        off[1 + l] = gpt_block_offset(cfg, l);
        numel[1 + l] = gpt_block_numel(cfg->channels);
    }
    off[L + 1] = gpt_tensor_offset(cfg, P_LNFW, 0);
    numel[L + 1] = 2 * (size_t)cfg->channels;
}

// The engine's fill callback: a range of a unit is a range of the flat
// layout, initialised from the seed or read from the checkpoint, so each rank
// builds only its own shard.
typedef struct {
    const GPTConfig* cfg;
    const char* checkpoint;  // NULL: initialise
    uint64_t seed;
    const size_t* off;       // (units) flat offset of each unit
} UnitSource;

static const char* fill_unit(void* ctx, int unit, size_t lo, size_t n, float* dst, char* msg, size_t msg_len) {
    const UnitSource* src = ctx;
    size_t at = src->off[unit] + lo;
    if (src->checkpoint) return checkpoint_read_range(src->checkpoint, src->cfg, dst, at, n, msg, msg_len);
    gpt_init_range(dst, at, n, src->cfg, src->seed);
    return NULL;
}

// The sharded model: the engine's state, and this rank's activations for its
// B/N sequences.
typedef struct {
    FSDP f;
    GPTConfig cfg;
    GPTActs acts;
} ShardedGPT;

// The model as units, each rank filling only its own shard of them;
// activations for micro sequences.
static void sharded_gpt_create(ShardedGPT* g, const Comm* dp, const TrainSetup* setup, const TrainArgs* args,
                               int zero, int prefetch, int reshard, int micro) {
    memset(g, 0, sizeof(*g));
    g->cfg = setup->cfg;
    int n_units = g->cfg.num_layers + 2;
    size_t* off = xmalloc(sizeof(size_t) * n_units);
    size_t* numel = xmalloc(sizeof(size_t) * n_units);
    int* own_grads = xcalloc((size_t)n_units, sizeof(int));
    gpt_units(&g->cfg, off, numel);
    own_grads[0] = 1;  // the tied embedding: used by the head first, by the embedding last
    UnitSource source = {.cfg = &g->cfg, .checkpoint = setup->checkpoint, .seed = (uint64_t)args->seed, .off = off};
    FsdpSpec spec = {.n_units = n_units, .numel = numel, .own_grads = own_grads, .fill = fill_unit,
                     .fill_ctx = &source};
    fsdp_create(&g->f, dp, &spec, zero, prefetch, reshard);
    free(off);
    free(numel);
    free(own_grads);
    gpt_acts_create_recompute(&g->acts, &g->cfg, micro, setup->T, (RecomputeMode)args->recompute);
}

// ---------------------------------------------------------------- checkpoints

// A range of a unit is a range of the flat layout for the checkpoint too:
// ckpt_add_flat cuts it into the llm.c tensors it overlaps.
static void unit_slices(void* ctx, CkptList* out, int unit, size_t lo, size_t n, CkptKind kind, float* data) {
    const UnitSource* src = ctx;
    ckpt_add_flat(out, src->cfg, kind, src->off[unit] + lo, n, data);
}

// What this rank writes and reads of the training state (ckpt.h), unit by
// unit: its shard (fsdp_ckpt_shard; the padding past a unit's end is no
// part of the model: neither written nor read, it stays zero).
static void sharded_gpt_ckpt(Ckpt* ck, const FSDP* f, const GPTConfig* cfg) {
    size_t* off = xmalloc(sizeof(size_t) * f->n);
    size_t* numel = xmalloc(sizeof(size_t) * f->n);
    gpt_units(cfg, off, numel);
    UnitSource units = {.cfg = cfg, .off = off};
    for (int i = 0; i < f->n; i++) {
        // the moments sharded under every stage, ZeRO-3's parameters too:
        // each rank writes and reads its own shard
        fsdp_ckpt_shard(f, i, &ck->own, f->zero == 3, unit_slices, &units);
        fsdp_ckpt_shard(f, i, &ck->need, f->zero == 3, unit_slices, &units);
        if (f->zero < 3) {
            // ZeRO-1/2: the parameters replicated in full: dp rank 0
            // writes them, every rank reads them whole
            float* full = f->full_params + f->padded_off[i];
            if (f->dp->rank == 0) ckpt_add_flat(&ck->own, cfg, CKPT_PARAMS, off[i], numel[i], full);
            ckpt_add_flat(&ck->need, cfg, CKPT_PARAMS, off[i], numel[i], full);
        }
    }
    free(off);
    free(numel);
}

// ---------------------------------------------------------------- forward and backward

// The order units are used in forward: the embedding, the blocks, the final
// LayerNorm, and the embedding again for the tied LM head. Each prefetch sits
// where the next unit's gather can run behind compute.
//   fsdp_unit_params(f, i)  unit i in full: under ZeRO-3 it waits for the
//                           unit's all-gather (started there if no prefetch
//                           did); under ZeRO-1 and 2 it is always there
//   fsdp_prefetch(f, i)     (ZeRO-3) starts unit i's all-gather now, so it
//                           arrives behind the compute that follows
static float forward(ShardedGPT* g, const int* inputs, const int* targets) {
    FSDP* f = &g->f;
    const GPTConfig* c = &g->cfg;
    int B = g->acts.B, T = g->acts.T, C = c->channels, L = c->num_layers;
    // after the optimizer step every gathered copy is stale: forget them all
    fsdp_drop_gathered(f);
    gpt_acts_load(&g->acts, inputs, targets);
    float* emb = fsdp_unit_params(f, 0);
    fsdp_prefetch(f, 1);
    double t0 = trace_start();
    encoder_forward(g->acts.encoded, g->acts.inputs, emb, emb + param_tensor_numel(c, P_WTE), B, T, C);
    trace_compute(t0, "embedding forward");
    for (int l = 0; l < L; l++) {
        BlockParams p = block_params_at(fsdp_unit_params(f, 1 + l), C);
        fsdp_prefetch(f, l + 2);  // the next block, or [lnfw lnfb] after the last
        gpt_block_forward(&g->acts, c, l, &p, B, T);
    }
    const float* x = gpt_acts_block_output(&g->acts, c, L - 1, B, T);
    float* lnf = fsdp_unit_params(f, L + 1);
    // the LM head is the token embedding: unit 0 is needed again (with
    // resharding it was freed after the embedding and is gathered anew). No
    // prefetch can hide this gather: until now both slots were busy (the
    // last block computing, [lnfw lnfb] arriving), and the head needs both.
    float* wte = fsdp_unit_params(f, 0);
    HeadActs h = gpt_acts_head(&g->acts, c, B, T);
    head_forward(c, wte, lnf, lnf + C, &h, x, g->acts.targets, B, T);
    return gpt_acts_mean_loss(&g->acts, c);
}

// Backward runs the units in reverse, each gathered again under ZeRO-3.
//   fsdp_grads_begin(f, i)   the zeroed buffer unit i's gradient accumulates
//                            in (ZeRO-1: its slice of a full gradient;
//                            ZeRO-2/3: one buffer every unit reuses, but the
//                            tied embedding has its own)
//   fsdp_reduce_grads(f, i)  reduce-scatter: rank r keeps the mean over ranks
//                            of its shard of the gradient
static void backward(ShardedGPT* g) {
    FSDP* f = &g->f;
    const GPTConfig* c = &g->cfg;
    int B = g->acts.B, T = g->acts.T, C = c->channels, L = c->num_layers;
    HeadActs h = gpt_acts_head(&g->acts, c, B, T);
    BlockScratch s = gpt_acts_scratch(&g->acts, c);
    // the head: the final LayerNorm's and the tied embedding's gradients. The
    // embedding's stays in its own buffer until the embedding backward at the
    // very end has added the token lookups' share.
    float* g_emb = fsdp_grads_begin(f, 0);
    float* g_lnf = fsdp_grads_begin(f, L + 1);
    float* lnf = fsdp_unit_params(f, L + 1);
    float* wte = fsdp_unit_params(f, 0);
    const float* last = gpt_acts_block_output(&g->acts, c, L - 1, B, T);
    head_backward(c, wte, lnf, g_emb, g_lnf, g_lnf + C, &h, last, g->acts.targets, 1.0f / (float)(B * T), s.dln,
                  g->acts.dres, B, T);
    if (f->zero > 1) fsdp_reduce_grads(f, L + 1);
    // the blocks, last to first: gather, backward, reduce-scatter. The last
    // block's gather cannot be prefetched (the head's backward needed both
    // slots); each block's backward hides the gather of the block before it.
    // With --recompute the block's forward reruns inside gpt_block_backward,
    // after the gather: under ZeRO-3 the gathered unit serves both.
    for (int l = L - 1; l >= 0; l--) {
        BlockParams p = block_params_at(fsdp_unit_params(f, 1 + l), C);
        if (l > 0) fsdp_prefetch(f, l);
        BlockParams gr = block_params_at(fsdp_grads_begin(f, 1 + l), C);
        gpt_block_backward(&g->acts, c, l, &p, &gr, B, T);
        if (f->zero > 1) fsdp_reduce_grads(f, 1 + l);
    }
    // the embedding: token lookups add into the tied wte's gradient
    double t0 = trace_start();
    encoder_backward(g_emb, g_emb + param_tensor_numel(c, P_WTE), g->acts.dres, g->acts.inputs, B, T, C);
    trace_compute(t0, "embedding backward");
    if (f->zero > 1) {
        fsdp_reduce_grads(f, 0);
    } else {
        // zero 1: backward filled the full gradient; now every unit at once
        for (int i = 0; i < f->n; i++) fsdp_reduce_grads(f, i);
    }
}

// ---------------------------------------------------------------- validation and the step

// Validation runs the same sharded forward (same gathers) as training: each
// rank its B/N sequences of every validation batch (train_val_loss_with).
static float forward_cb(void* ctx, const int* inputs, const int* targets) {
    return forward(ctx, inputs, targets);
}

static float val_loss(void* ctx, const TrainSetup* s, int n_batches) {
    ShardedGPT* g = ctx;
    int micro = g->acts.B;
    return train_val_loss_with(s, n_batches, forward_cb, g, g->f.dp->rank * micro, micro, micro, g->f.dp);
}

static float step(ShardedGPT* g, const TrainArgs* args, int t) {
    // global norm: each rank's shards hold disjoint pieces of the gradient, so
    // the sum of squares is summed over ranks (one all-reduce) before the root
    const Comm* groups[] = {g->f.dp};
    double* sumsq = train_sumsq_begin();
    fsdp_grad_sumsq(&g->f, sumsq);
    double norm = train_global_norm(sumsq, groups, 1);
    // AdamW on this rank's shard; ZeRO-1/2 then all-gather the updated shards
    double t0 = trace_start();
    fsdp_step(&g->f, train_adamw(args), t, grad_clip_scale(norm, args->clip));
    trace_compute(t0, "optimizer");
    return (float)norm;
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
    fsdp_check_flags(zero, prefetch, reshard);  // --zero 1..3, --prefetch and --reshard 0 or 1
    args_note_unused(argc, argv, "prefetch", zero != 3, "ZeRO-1 and 2 gather no parameters in forward (--zero 3 does)");
    args_note_unused(argc, argv, "reshard", zero != 3, "ZeRO-1 and 2 keep the whole parameters (--zero 3 frees them)");
    const TrainArgs* args = &run.args;
    const TrainSetup* setup = &run.setup;
    const Comm* dpc = &run.axes[AXIS_DP];
    int B = setup->B, T = setup->T, N = dpc->size;
    train_check_mesh(&run.mesh, setup, NULL);
    int micro = B / N;

    ShardedGPT g;
    sharded_gpt_create(&g, dpc, setup, args, zero, prefetch, reshard, micro);
    FSDP* f = &g.f;
    fsdp_show_sharding(f, NULL, 0, &setup->cfg, args->show_sharding, "chapter 3");  // --show-sharding
    size_t P = gpt_num_params(&setup->cfg);
    Ckpt ck;
    ckpt_init(&ck, args, setup, &run.mesh, 3);
    sharded_gpt_ckpt(&ck, f, &setup->cfg);
    ckpt_resume(&ck);  // --resume: this rank's slices, from whatever mesh saved them
    char zero3[64] = "";
    if (zero == 3)  // prefetch and resharding are about gathering units: ZeRO-3 only
        snprintf(zero3, sizeof(zero3), ", prefetch %s, reshard %s", prefetch ? "on" : "off", reshard ? "on" : "off");
    print0("chapter 3: ZeRO-%d over dp=%d, %d units, shard %zu of %zu parameters per rank (%zu padding)%s, "
           "device %s\n",
           zero, N, f->n, f->shard_total, P, f->padded_total - P, zero3, run.device);
    // (it recomputes after the gather of each block in backward under ZeRO-3)
    train_print_recompute((RecomputeMode)args->recompute, NULL);
    // validation runs the same sharded forward, through the same gathers
    // (counted with the steps' communication when --val-every runs it)
    TrainLoop loop;
    train_loop_begin(&loop, &run, &(TrainLoopSpec){
        .chapter = 3, .num_params = P, .flops_per_token = gpt_flops_per_token(&setup->cfg, T), .rows = micro,
        .val_loss = val_loss, .ctx = &g, .ckpt = &ck});
    long prefetched = 0;        // unit gathers started ahead by fsdp_prefetch, all steps
    double allgather_wait = 0;  // seconds blocked on all-gathers, timed steps (as the clock)
    double pf_inflight = 0, pf_blocked = 0;  // the prefetched gathers, timed steps
    for (int s = loop.start; s < loop.steps; s++) {
        long p0 = f->gathers_prefetched;
        double w0 = fsdp_allgather_wait_s(f), i0 = fsdp_prefetch_inflight_s(f), b0 = fsdp_prefetch_blocked_s(f);
        data_batch(&setup->train, s, B, T, dpc->rank * micro, micro, loop.inputs, loop.targets);
        double mine = forward(&g, loop.inputs, loop.targets);
        backward(&g);
        float norm = step(&g, args, s + 1);
        // the step's prefetch spans, on the device clock (read after the
        // norm has waited for the device; i0 above then reads nothing new
        // unless a validation ran in between)
        double inflight = fsdp_prefetch_inflight_s(f);
        double ag_wait = fsdp_allgather_wait_s(f), blocked = fsdp_prefetch_blocked_s(f);
        prefetched += f->gathers_prefetched - p0;
        if (train_loop_timed(&loop, s)) {
            allgather_wait += ag_wait - w0;
            pf_inflight += inflight - i0;
            pf_blocked += blocked - b0;
        }
        // the global loss for the log line: the mean over ranks of their means
        train_loop_step(&loop, s, (float)train_mean(dpc, mine), norm);
    }
    const StepClock* clock = &loop.clock;
    double ms = clock_ms_per_step(clock), wait_ms = clock_wait_ms_per_step(clock);
    double ag_wait_ms = clock->timed ? 1e3 * allgather_wait / clock->timed : 0.0;
    int trained = loop.steps - loop.start;
    double prefetched_per_step = trained > 0 ? (double)prefetched / trained : 0.0;
    print0("communication: %.2f ms per step blocked in collectives or waits (rank 0), %.2f of them in all-gathers, "
           "of %.2f ms per step; %.2f unit gathers per step prefetched\n",
           wait_ms, ag_wait_ms, ms, prefetched_per_step);
    // share hidden: of the time the prefetched gathers were in flight (start
    // to the end of their wait), the part the rank computed instead of
    // waiting; -1 when nothing was prefetched
    double hidden = pf_inflight > 0 ? 1.0 - pf_blocked / pf_inflight : -1.0;
    double pf_blocked_ms = clock->timed ? 1e3 * pf_blocked / clock->timed : 0.0;
    double pf_inflight_ms = clock->timed ? 1e3 * pf_inflight / clock->timed : 0.0;
    if (hidden >= 0)
        print0("prefetch: %.1f%% of the prefetched gathers' time in flight hidden behind compute (rank 0: %.2f ms "
               "blocked of %.2f ms in flight per step; comm_progress %s)\n",
               100.0 * hidden, pf_blocked_ms, pf_inflight_ms, comm_progress_on() ? "on" : "off");
    // the shards' padding must still be zero after training (a check a
    // student's shard range must pass); a host count, so plain MPI
    long padding_mine = (long)fsdp_padding_nonzero(f), padding_nonzero = 0;
    MPI_CHECK(MPI_Allreduce(&padding_mine, &padding_nonzero, 1, MPI_LONG, MPI_SUM, dpc->mpi));
    JsonBuf summary = {0};  // the chapter's own summary fields
    json_add_int(&summary, "zero", zero);
    json_add_int(&summary, "prefetch", prefetch);
    json_add_int(&summary, "reshard", reshard);
    json_add_int(&summary, "units", f->n);
    json_add_int(&summary, "shard_params", (long long)f->shard_total);
    json_add_int(&summary, "padded_params", (long long)f->padded_total);
    json_add_int(&summary, "max_unit_padded", (long long)f->max_padded);
    json_add_int(&summary, "unit0_padded", (long long)(f->shard[0] * N));
    json_add_double(&summary, "allgather_wait_ms_per_step", ag_wait_ms, "%.3f");
    json_add_double(&summary, "gathers_prefetched_per_step", prefetched_per_step, "%g");
    json_add_double(&summary, "prefetch_hidden_share", hidden, "%.4f");
    json_add_double(&summary, "prefetch_blocked_ms_per_step", pf_blocked_ms, "%.3f");
    json_add_double(&summary, "prefetch_inflight_ms_per_step", pf_inflight_ms, "%.3f");
    json_add_int(&summary, "comm_progress", comm_progress_on());
    json_add_int(&summary, "padding_nonzero", padding_nonzero);
    // the final validation (ZeRO-3 gathers every unit again: the summary's
    // communication is read before it) and the summary
    train_loop_end(&loop, &summary);
    json_free(&summary);

    if (train_wants_params(args)) {
        // every unit gathered once, in the flat layout's order, on rank 0:
        // sampling and --save run on that whole copy
        float* host = fsdp_gather_host(f);
        train_finish_params(args, &setup->cfg, T, host);
        free(host);
    }
    gpt_acts_free(&g.acts);
    fsdp_free(f);
    run_finish(&run);
    return 0;
}
