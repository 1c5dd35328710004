// Chapter 2: data parallelism.
//
// Every rank holds a full replica of the model and takes its own share of the
// global batch. After backward each rank has the gradient of ITS sequences;
// averaging the gradients over the dp ranks gives exactly the gradient of the
// whole batch, so every replica takes the same AdamW step and stays identical
// to the others, and to the single-device reference.
//
//   mpirun -np 4 build/chapter-2 --dp 4 --dp-mode overlapped
//
// --dp-mode picks how the gradients are averaged, in the order the chapter
// builds them up:
//   naive       one blocking all-reduce per parameter tensor, after backward
//   bucketed    gradients in flat buckets of --bucket-kb, one all-reduce each
//   overlapped  each bucket's all-reduce starts, non-blocking, at the first
//               block boundary of backward after which all its gradients are
//               final; the step waits for all
//   ps          a parameter server, for contrast: rank 0 collects the mean
//               gradient, steps alone, and broadcasts the new parameters
//
// --grad-accum K splits each rank's share into K micro-batches and
// communicates only after the last one.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "args.h"
#include "ckpt.h"
#include "comm.h"
#include "errors.h"
#include "exercise.h"  // exercise_not_done, in a homework tree
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
#include "sharding.h"

typedef enum { MODE_NAIVE, MODE_BUCKETED, MODE_OVERLAPPED, MODE_PS } DPMode;
static const char* mode_names[] = {"naive", "bucketed", "overlapped", "ps"};

// ---------------------------------------------------------------- buckets
// A bucket is a flat range [lo, hi) of the gradient buffer. Buckets are cut
// from the END of the buffer, because backward produces gradients from the
// last layer to the first: bucket 0 is the final LayerNorm and the last
// block, the last bucket holds the embeddings.
typedef struct {
    size_t lo, hi;
    CommRequest req;
    int started;
} Bucket;

typedef struct {
    Bucket* b;
    int n;
    const Comm* dp;  // the data-parallel group
    float* grads;
    int communicate;  // 0 on all but the last micro-batch
    long started_early;  // buckets started before the embedding's hook, over the run
} Buckets;

static void buckets_make(Buckets* bs, size_t num_params, size_t bucket_floats) {
    bs->n = (int)((num_params + bucket_floats - 1) / bucket_floats);
    bs->b = xcalloc((size_t)bs->n, sizeof(Bucket));
    size_t hi = num_params;
    for (int i = 0; i < bs->n; i++) {
        size_t lo = hi > bucket_floats ? hi - bucket_floats : 0;
        bs->b[i].lo = lo;
        bs->b[i].hi = hi;
        hi = lo;
    }
}

// The backward hook of the overlapped mode: every gradient at offset >=
// boundary is final, so every bucket that lies above the boundary starts its
// all-reduce now, while backward goes on with the layers below.
static void start_ready_buckets(void* ctx, size_t boundary) {
    // EXERCISE 3: the bucket boundary hook: start (non-blocking) every bucket whose gradients are all final, and only on the last micro-batch
    Buckets* bs = ctx;
    if (!bs->communicate) return;
    for (int i = 0; i < bs->n; i++) {
        Bucket* b = &bs->b[i];
        if (b->started || b->lo < boundary) continue;
        comm_iallreduce(bs->dp, bs->grads + b->lo, b->hi - b->lo, COMM_AVG, &b->req);
        b->started = 1;
        // boundary 0 is the embedding's hook, the end of backward: a bucket
        // started there has no compute left to hide behind. Count the others,
        // so the summary shows that the overlap really happened.
        if (boundary > 0) bs->started_early++;
    }
    // MPI moves a non-blocking collective forward only inside MPI calls:
    // poke the ones in flight so they progress while we compute
    for (int i = 0; i < bs->n; i++)
        if (bs->b[i].started) comm_test(&bs->b[i].req);
    // END EXERCISE 3
}

// ---------------------------------------------------------------- averaging the gradients

// naive: one all-reduce per parameter tensor (per layer for block tensors),
// each waiting for the one before: many small messages, nothing overlapped.
static void average_naive(const Comm* dp, GPT* m) {
    // EXERCISE 1: naive averaging: one blocking all-reduce per parameter tensor (per layer for block tensors), the mean over dp
    const GPTConfig* cfg = &m->cfg;
    for (ParamTensor t = 0; t < NUM_PARAM_TENSORS; t++) {
        int layers = param_tensor_is_block(t) ? cfg->num_layers : 1;
        for (int l = 0; l < layers; l++)
            comm_allreduce(dp, m->grads + gpt_tensor_offset(cfg, t, l), param_tensor_numel(cfg, t), COMM_AVG);
    }
    // END EXERCISE 1
}

// bucketed: after backward, one blocking all-reduce per bucket: fewer, larger
// messages (latency paid once per bucket), still nothing overlapped.
static void average_bucketed(Buckets* bs) {
    for (int i = 0; i < bs->n; i++)
        comm_allreduce(bs->dp, bs->grads + bs->b[i].lo, bs->b[i].hi - bs->b[i].lo, COMM_AVG);
}

// overlapped: the all-reduces were started during backward; wait for them.
static void wait_buckets(Buckets* bs) {
    // EXERCISE 4: the overlapped wait: complete every bucket's all-reduce and make the buckets ready for the next step
    for (int i = 0; i < bs->n; i++) {
        comm_wait(&bs->b[i].req);
        bs->b[i].started = 0;
    }
    // END EXERCISE 4
}

// ---------------------------------------------------------------- the step

typedef struct {
    const Comm* dp;
    DPMode mode;
    int accum;          // micro-batches per step
    Buckets buckets;
    float* ps_grads;    // rank 0's buffer for the summed gradients (ps mode)
} DataParallel;

// The clipped AdamW step on a full replica (every mode but ps).
static float clip_and_step(GPT* m, const TrainArgs* args, int step) {
    // after the all-reduce every replica holds the global gradient, so the
    // norm each rank computes alone is already the global norm (no groups)
    double* sumsq = train_sumsq_begin();
    grad_sumsq(sumsq, m->grads, m->num_params);
    double norm = train_global_norm(sumsq, NULL, 0);
    double t0 = trace_start();
    adamw_update(m->params, m->grads, m->m, m->v, m->num_params, train_adamw(args), step + 1,
                 grad_clip_scale(norm, args->clip));
    trace_compute(t0, "optimizer");
    return (float)norm;
}

// One training step. Rank r owns sequences [r*B/dp, (r+1)*B/dp) of the
// global batch, cut into `accum` micro-batches. Returns the global mean loss.
static float train_step(DataParallel* dp, GPT* m, const TrainSetup* setup, const TrainArgs* args,
                        int step, int* inputs, int* targets, float* norm) {
    int B = setup->B, T = setup->T, per_rank = B / dp->dp->size, micro = per_rank / dp->accum;
    // each micro-batch's backward differentiates its mean loss / accum, so the
    // accumulated gradient is the mean over this rank's sequences
    m->loss_scale = 1.0f / (float)dp->accum;
    gpt_zero_grad(m);
    double loss_sum = 0.0;
    for (int k = 0; k < dp->accum; k++) {
        int b0 = dp->dp->rank * per_rank + k * micro;
        data_batch(&setup->train, step, B, T, b0, micro, inputs, targets);
        loss_sum += gpt_forward(m, inputs, targets);
        int last = k == dp->accum - 1;
        if (dp->mode == MODE_OVERLAPPED) {
            // communicate while backward runs, but only on the last micro-batch
            dp->buckets.communicate = last;
            gpt_backward_hooked(m, start_ready_buckets, &dp->buckets);
        } else {
            gpt_backward(m);
        }
    }
    // the average of the gradients over the dp group = the gradient of the
    // global batch
    switch (dp->mode) {
        case MODE_NAIVE: average_naive(dp->dp, m); break;
        case MODE_BUCKETED: average_bucketed(&dp->buckets); break;
        case MODE_OVERLAPPED: wait_buckets(&dp->buckets); break;
        case MODE_PS: break;
    }
    if (dp->mode != MODE_PS) {
        *norm = clip_and_step(m, args, step);
    } else {
        // EXERCISE 2: the parameter server: the mean gradient to rank 0, rank 0 steps alone, the new parameters back to every rank
        // parameter server: the sum of all gradients travels to rank 0 (every
        // byte of every rank into one rank's link), rank 0 steps, and the new
        // parameters travel back out of that one link
        comm_reduce(dp->dp, m->grads, dp->ps_grads, m->num_params, 0, COMM_AVG);
        float nrm = 0.0f;
        if (dp->dp->rank == 0) {
            ops_copy(m->grads, dp->ps_grads, m->num_params);
            nrm = clip_and_step(m, args, step);
        }
        comm_broadcast(dp->dp, m->params, m->num_params, 0);
        // the norm is a host scalar: plain MPI, for the log line
        MPI_CHECK(MPI_Bcast(&nrm, 1, MPI_FLOAT, 0, dp->dp->mpi));
        *norm = nrm;
        // END EXERCISE 2
    }
    // the loss of the global batch: mean over ranks of each rank's mean
    // (a host scalar for the log line: plain MPI, not the gradient path)
    return (float)train_mean(dp->dp, loss_sum / dp->accum);
}

// After training, every replica must hold bit-identical parameters: rank 0
// sends its copy to everyone, every rank compares. A check, not part of the
// strategy, so it runs on host copies through plain MPI (and is not counted).
static int replicas_identical(const Comm* dp, const GPT* m) {
    float* mine = xmalloc(m->num_params * sizeof(float));
    float* first = xmalloc(m->num_params * sizeof(float));
    mem_to_host(mine, m->params, m->num_params * sizeof(float));
    memcpy(first, mine, m->num_params * sizeof(float));
    for (size_t off = 0; off < m->num_params; off += 1 << 28) {
        size_t n = m->num_params - off < (1u << 28) ? m->num_params - off : (1u << 28);
        MPI_CHECK(MPI_Bcast(first + off, (int)n, MPI_FLOAT, 0, dp->mpi));
    }
    int same = memcmp(mine, first, m->num_params * sizeof(float)) == 0, all = 0;
    MPI_CHECK(MPI_Allreduce(&same, &all, 1, MPI_INT, MPI_MIN, dp->mpi));
    free(mine);
    free(first);
    return all;
}

// ---------------------------------------------------------------- main

int main(int argc, char** argv) {
    const char* mode_name = "overlapped";
    int accum = 1, bucket_kb = 1024;
    ArgSpec extra[] = {
        {"dp-mode", ARG_STRING, &mode_name, "naive | bucketed | overlapped | ps  [overlapped]"},
        {"bucket-kb", ARG_INT, &bucket_kb, "gradient bucket size in KiB (bucketed, overlapped)  [1024]"},
        {"grad-accum", ARG_INT, &accum, "micro-batches per step; communicate after the last  [1]"},
    };
    Run run;
    if (!run_start(&run, argc, argv, "build/chapter-2",
                   "Chapter 2: data parallelism: replicas, gradient all-reduce, buckets, overlap.", extra,
                   sizeof(extra) / sizeof(extra[0]), 1u << AXIS_DP))
        return 0;
    DPMode mode = MODE_NAIVE;
    int found = 0;
    for (int i = 0; i < (int)(sizeof mode_names / sizeof *mode_names); i++)
        if (!strcmp(mode_name, mode_names[i])) mode = (DPMode)i, found = 1;
    if (!found) fail_all("--dp-mode %s is not one of naive, bucketed, overlapped, ps", mode_name);
    if (accum < 1) fail_all("--grad-accum must be >= 1");
    if (bucket_kb < 1) fail_all("--bucket-kb must be >= 1");
    int bucketed = mode == MODE_BUCKETED || mode == MODE_OVERLAPPED;
    args_note_unused(argc, argv, "bucket-kb", !bucketed, "only --dp-mode bucketed and overlapped cut the gradients into buckets");
    const TrainArgs* args = &run.args;
    const TrainSetup* setup = &run.setup;
    const Comm* dpc = &run.axes[AXIS_DP];
    int B = setup->B, T = setup->T, ndp = dpc->size;
    MeshNeeds needs = {.microbatches = accum};
    train_check_mesh(&run.mesh, setup, &needs);
    int micro = B / ndp / accum;
    // overlapped: every bucket's all-reduce is started before any is waited
    // for, and the comm layer holds COMM_MAX_IN_FLIGHT: refuse more buckets now
    size_t grad_bytes = gpt_num_params(&setup->cfg) * sizeof(float), min_kb = comm_min_piece_kb(grad_bytes);
    if (mode == MODE_OVERLAPPED && (size_t)bucket_kb < min_kb)
        fail_all("--bucket-kb %d cuts the %zu bytes of gradients into more than %d buckets, all in flight at once in --dp-mode overlapped: use --bucket-kb %zu or more",
                 bucket_kb, grad_bytes, COMM_MAX_IN_FLIGHT, min_kb);

    // a full replica on every rank, activations for one micro-batch
    GPT model;
    gpt_create_recompute(&model, &setup->cfg, micro, T, (uint64_t)args->seed, (RecomputeMode)args->recompute);
    if (setup->checkpoint) {
        float* host = xmalloc(model.num_params * sizeof(float));
        train_load_checkpoint(setup, host);
        mem_to_device(model.params, host, model.num_params * sizeof(float));
        free(host);
    }
    // every replica starts from rank 0's parameters (counter-based init makes
    // them equal already; the broadcast is what makes any start equal)
    comm_broadcast(dpc, model.params, model.num_params, 0);
    DataParallel dp = {.dp = dpc, .mode = mode, .accum = accum};
    if (mode != MODE_PS || dpc->rank == 0) gpt_create_optimizer(&model);  // ps: only rank 0 steps
    if (mode == MODE_PS && dpc->rank == 0) dp.ps_grads = mem_alloc_floats(model.num_params, MEM_COMM);
    // training-state checkpoints: the replicas are identical, so dp rank 0
    // alone writes the state; every rank reads the parameters and the AdamW
    // moments it keeps (ps mode: rank 0 alone keeps them)
    Ckpt ck;
    ckpt_init(&ck, args, setup, &run.mesh, 2);
    if (dpc->rank == 0) ckpt_add_state(&ck.own, &setup->cfg, 0, model.num_params, model.params, model.m, model.v);
    ckpt_add_state(&ck.need, &setup->cfg, 0, model.num_params, model.params, model.m, model.v);
    ckpt_resume(&ck);  // --resume: ck.start_step
    buckets_make(&dp.buckets, model.num_params, (size_t)bucket_kb * 1024 / sizeof(float));
    dp.buckets.dp = dpc;
    dp.buckets.grads = model.grads;
    sharding_show_replicated(&setup->cfg, mode != MODE_PS || dpc->rank == 0, args->show_sharding, "chapter 2");

    char buckets[64] = "";  // naive and ps send none
    if (bucketed) snprintf(buckets, sizeof(buckets), "%d bucket%s of %d KiB, ", dp.buckets.n, dp.buckets.n == 1 ? "" : "s", bucket_kb);
    print0("chapter 2: data parallel, dp=%d, mode %s, %s%d micro-batch%s of %d sequence%s per rank, device %s\n", ndp,
           mode_names[mode], buckets, accum, accum == 1 ? "" : "es", micro, micro == 1 ? "" : "s", run.device);
    train_print_recompute((RecomputeMode)args->recompute, NULL);
    print0("model %s: %zu parameters, global batch %d x %d\n", setup->model_name, model.num_params, B, T);
    // every replica holds the same model: each validates on its own copy
    TrainLoop loop;
    train_loop_begin(&loop, &run, &(TrainLoopSpec){
        .chapter = 2, .num_params = model.num_params, .flops_per_token = gpt_flops_per_token(&setup->cfg, T),
        .rows = micro, .val_loss = train_val_loss_gpt, .ctx = &model, .ckpt = &ck});
    for (int step = loop.start; step < loop.steps; step++) {
        float norm;
        float loss = train_step(&dp, &model, setup, args, step, loop.inputs, loop.targets, &norm);
        train_loop_step(&loop, step, loss, norm);
    }
    int same = replicas_identical(dpc, &model);
    print0("replicas after %d steps: %s\n", args->steps, same ? "bit-identical on every rank" : "DIFFERENT");

    double ms = clock_ms_per_step(&loop.clock), wait_ms = clock_wait_ms_per_step(&loop.clock);
    double progress_ms = clock_progress_ms_per_step(&loop.clock);
    // what a rank is blocked in: the all-reduces (or, overlapped, the wait
    // for them); the parameter server's reduce to rank 0 and broadcast back
    const char* blocked = mode == MODE_PS ? "the reduce to rank 0 and the broadcast from it" : "all-reduce or wait";
    print0("communication: %.2f ms per step blocked in %s, %.2f in non-blocking starts and "
           "tests (rank 0), of %.2f ms per step\n", wait_ms, blocked, progress_ms, ms);
    // every rank starts the same buckets at the same hooks: rank 0's count is everyone's
    int trained = loop.steps - loop.start;
    double early = trained > 0 ? (double)dp.buckets.started_early / trained : 0.0;
    if (mode == MODE_OVERLAPPED)
        print0("overlap: %g of %d buckets per step started before backward finished\n", early, dp.buckets.n);
    JsonBuf summary = {0};  // the chapter's own summary fields
    json_add_string(&summary, "dp_mode", mode_names[mode]);
    json_add_int(&summary, "bucket_kb", bucket_kb);
    json_add_int(&summary, "grad_accum", accum);
    json_add_int(&summary, "buckets", bucketed ? dp.buckets.n : 0);  // naive and ps send none
    json_add_bool(&summary, "replicas_identical", same);
    json_add_double(&summary, "early_buckets_per_step", early, "%g");
    train_loop_end(&loop, &summary);  // the final validation and the summary
    json_free(&summary);
    if (train_wants_params(args)) {  // --sample, --save: from rank 0's replica
        float* host = NULL;
        if (dpc->rank == 0) {
            host = xmalloc(model.num_params * sizeof(float));
            mem_to_host(host, model.params, model.num_params * sizeof(float));
        }
        train_finish_params(args, &setup->cfg, T, host);
        free(host);
    }

    free(dp.buckets.b);
    mem_free(dp.ps_grads);
    gpt_free(&model);
    run_finish(&run);
    return same ? 0 : 1;
}
