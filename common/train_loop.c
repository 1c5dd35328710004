// train_loop.c: the bookkeeping of every chapter's training loop
// (train_loop.h): the step clock, the step report, validation's cadence, the
// checkpoint after a step, the summary.
#include "train_loop.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt.h"
#include "device.h"
#include "errors.h"
#include "memory.h"
#include "optime.h"
#include "rank.h"
#include "runtime.h"
#include "sharding.h"
#include "trace.h"
#include "run.h"
#include "report.h"

void train_loop_open(JsonLog* log, int** inputs, int** targets, const TrainArgs* a, int rows, int T) {
    char msg[ERROR_MAX];
    const char* bad = jsonl_open(log, a->log, msg, sizeof(msg));
    fail_if_any(bad != NULL, bad);
    // staging buffers (memory.h): the step's tokens go to the device from them
    *inputs = mem_alloc_host((size_t)rows * T * sizeof(int));
    *targets = mem_alloc_host((size_t)rows * T * sizeof(int));
}

void train_loop_close(JsonLog* log, int* inputs, int* targets) {
    jsonl_close(log);
    mem_free_host(inputs);
    mem_free_host(targets);
}

void train_print_recompute(RecomputeMode mode, const char* note) {
    if (mode == RECOMPUTE_NONE) return;
    print0("recompute %s: backward recomputes what the blocks did not keep (docs/recompute.md)%s\n",
           recompute_name(mode), note ? note : "");
}

void clock_begin(StepClock* c) {
    c->t0 = now_seconds();
    c->w0 = comm_wait_seconds();
    c->p0 = comm_progress_seconds();
    optime_step_begin();
}

double clock_end(StepClock* c, int step, int first, int steps) {
    device_synchronize();
    double t1 = now_seconds(), dt = t1 - c->t0;
    int timed = step > first || steps - first == 1;
    char name[32];
    snprintf(name, sizeof(name), "step %d", step);
    // the same two clock reads as the step's time: the trace's timed step
    // spans add up to the summary's ms per step
    trace_span(TRACE_STEP, c->t0, t1, 0, step, timed, name);
    if (timed) {
        c->seconds += dt;
        c->wait += comm_wait_seconds() - c->w0;
        c->progress += comm_progress_seconds() - c->p0;
        c->timed++;
    }
    optime_step_end(timed);
    return dt;
}

double clock_ms_per_step(const StepClock* c) { return c->timed ? 1e3 * c->seconds / c->timed : 0.0; }
double clock_wait_ms_per_step(const StepClock* c) { return c->timed ? 1e3 * c->wait / c->timed : 0.0; }
double clock_progress_ms_per_step(const StepClock* c) { return c->timed ? 1e3 * c->progress / c->timed : 0.0; }


void train_loop_begin(TrainLoop* L, const Run* run, const TrainLoopSpec* spec) {
    memset(L, 0, sizeof(*L));
    L->args = &run->args;
    L->setup = &run->setup;
    L->mesh = &run->mesh;
    L->peak_gflops = run->peak_gflops;
    L->spec = *spec;
    L->start = spec->ckpt ? spec->ckpt->start_step : 0;
    L->steps = run->args.steps;
    L->val_loss = -1.0f;
    // --show-sharding: the chapter printed its table before its loop, or it has none yet
    if (run->args.show_sharding && !sharding_shown())
        fail_all("this chapter does not show its sharding yet: drop --show-sharding");
    train_loop_open(&L->log, &L->inputs, &L->targets, L->args, spec->rows, L->setup->T);
    comm_counts_reset();  // the summary counts the training, not the start-up
    clock_begin(&L->clock);
}

int train_loop_timed(const TrainLoop* L, int step) { return step > L->start || L->steps - L->start == 1; }

// The validation loss after step `step` (-1: before any), reported when
// there is validation data.
static void loop_validate(TrainLoop* L, int step) {
    if (!L->spec.val_loss) return;
    double t0 = trace_start();
    float v = L->spec.val_loss(L->spec.ctx, L->setup, L->args->val_batches);
    if (trace_enabled()) {  // its forwards' spans, held by one of their own
        char name[48];
        snprintf(name, sizeof(name), "validation after step %d", step);
        trace_span(TRACE_VALIDATION, t0, now_seconds(), 0, -1, 0, name);
    }
    if (v < 0) return;
    L->val_loss = v;
    report_val(&L->log, step, v);
}

void train_loop_step(TrainLoop* L, int step, float loss, float norm) {
    double dt = clock_end(&L->clock, step, L->start, L->steps);
    double tokens = (double)L->setup->B * L->setup->T;
    report_step_extra(&L->log, step, L->steps, loss, norm, 1e3 * dt, tokens / dt,
                      L->step_extra.len ? json_fields(&L->step_extra) : NULL);
    json_clear(&L->step_extra);
    L->loss = loss;
    int every = L->args->val_every;
    if (every > 0 && (step + 1) % every == 0 && step + 1 < L->steps) loop_validate(L, step);
    if (L->spec.ckpt) ckpt_after_step(L->spec.ckpt, step);  // --save-every, --ckpt-dir
    // the next step's clock starts here: everything until the next call is that step
    if (step + 1 < L->steps) clock_begin(&L->clock);
}

void train_loop_end(TrainLoop* L, const JsonBuf* extra) {
    if (L->spec.ckpt) ckpt_finish(L->spec.ckpt, &L->log);  // joins an async save still in flight
    // the training's figures, before the final validation adds its own
    RunFigures figures;
    report_gather(&figures, L->mesh, L->peak_gflops);
    // the final model's validation loss, labelled with the steps it has
    // taken: the loaded one's with --steps 0, the checkpoint's when a resume
    // left nothing to train (--resume past --steps)
    int trained = L->steps > L->start;
    loop_validate(L, (trained ? L->steps : L->start) - 1);
    const TrainSetup* s = L->setup;
    double ms = clock_ms_per_step(&L->clock);
    RunSummary summary = {
        .chapter = L->spec.chapter, .model = s->model_name, .num_params = L->spec.num_params,
        .batch = s->B, .seq = s->T, .steps = L->steps, .ms_per_step = ms,
        .tokens_per_s = ms > 0 ? (double)s->B * s->T / (ms / 1e3) : 0.0,
        .flops_per_token = L->spec.flops_per_token, .peak_gflops = L->peak_gflops,
        .final_loss = trained ? L->loss : NAN, .val_loss = L->val_loss,  // NAN: null, no step ran
        .comm_wait_ms_per_step = clock_wait_ms_per_step(&L->clock),
        .comm_progress_ms_per_step = clock_progress_ms_per_step(&L->clock), .has_comm_ms = 1,
        .extra_json = extra ? json_fields(extra) : NULL};
    report_summary_gathered(&L->log, L->mesh, &summary, &figures);
    train_loop_close(&L->log, L->inputs, L->targets);
    json_free(&L->step_extra);
    L->inputs = L->targets = NULL;
}
