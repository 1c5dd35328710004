// train_loop.h: the bookkeeping of every chapter's training loop: the step
// clock, the step report, validation's cadence, the checkpoint after a
// step, the summary.
#ifndef TRAIN_LOOP_H
#define TRAIN_LOOP_H

#include "report.h"
#include "run.h"
#include "sharding.h"  // --show-sharding: a chapter shows its table before its loop

// Step timing: the first step (caches, thread pools) is left out of the
// averages unless it is the only one.
typedef struct {
    double t0, w0, p0;              // when the step started; comm wait and progress seconds then
    double seconds, wait, progress; // summed over the timed steps
    int timed;
} StepClock;
void clock_begin(StepClock* c);
// Ends step `step` of the run's [first, steps) (first: a resumed run's
// first step, else 0), the trace's span named by it; returns its seconds.
double clock_end(StepClock* c, int step, int first, int steps);
double clock_ms_per_step(const StepClock* c);
double clock_wait_ms_per_step(const StepClock* c);      // blocked in communication
double clock_progress_ms_per_step(const StepClock* c);  // in non-blocking starts and tests

// ---------------------------------------------------------------- the training loop
// Every chapter's training loop, its bookkeeping in one place. The chapter's
// main keeps the loop and writes its own step inside it; the loop object does
// the rest, the same in every chapter:
//
//   Ckpt ck;  ckpt_init(&ck, ...); ckpt_add_...(&ck.own / &ck.need, ...);
//   ckpt_resume(&ck);                            // --resume: ck.start_step
//   TrainLoop loop;
//   train_loop_begin(&loop, &run, &(TrainLoopSpec){
//       .chapter = 3, .num_params = P, .flops_per_token = gpt_flops_per_token(cfg, T),
//       .rows = micro, .val_loss = my_val_loss, .ctx = &model, .ckpt = &ck});
//   for (int step = loop.start; step < loop.steps; step++) {
//       data_batch(&run.setup.train, step, B, T, b0, micro, loop.inputs, loop.targets);
//       ... forward, backward, the collectives, the optimizer: the chapter's step ...
//       train_loop_step(&loop, step, loss, norm);
//   }
//   JsonBuf summary = {0};                       // the chapter's own summary fields
//   json_add_int(&summary, "zero", zero);  ...
//   train_loop_end(&loop, &summary);             // NULL: no fields of its own
//   json_free(&summary);
//
// What it does, and so what no chapter does itself:
// - begin: opens --log (a file that cannot be opened ends every rank with one
//   message), allocates loop.inputs and loop.targets of rows x T tokens (the
//   sequences this rank reads per step or micro-step), resets the
//   communication counters (the summary counts the training, not the
//   start-up) and starts the clock of the first step.
// - step: the clock of a step runs from the end of the previous
//   train_loop_step (or begin) to this call, so everything in the loop body
//   is timed; the first step is left out of the averages (caches, threads)
//   unless it is the only one (train_loop_timed). Then, in this order: the
//   step line and record (report_step; a non-finite loss or norm ends the run
//   before anything of it is logged or saved), with the fields in
//   loop.step_extra appended and then cleared; validation after step s when
//   --val-every N > 0, (s + 1) % N == 0 and s + 1 < steps (the last step's
//   validation is the final one); ckpt_after_step (--ckpt-dir,
//   --save-every).
// - end: ckpt_finish (an async save in flight is joined), the summary's
//   figures read on every rank (memory peaks, communication counts, op
//   times: the training's and its --val-every validations', read before
//   the final validation), the final
//   validation (after step steps - 1; "before training" with --steps 0),
//   the summary printed and written once ({"type":"summary",...}, with
//   final_loss, val_loss, comm_wait_ms_per_step and comm_progress_ms_per_step
//   already in it: a chapter adds only its own fields), the log closed and
//   the batch freed.
// --sample and --save stay with the chapter, after train_loop_end: it knows
// where its parameters live (train_finish_params).
//
// Every call is collective over the world: every rank makes the same calls
// with the same step, loss and norm (the loss of the global batch: the
// chapter averages it first, train_mean).

// The validation loss of the chapter's model over the first n_batches
// global batches of s->val, or -1 when there is no validation data.
// Collective; every rank returns the same value. A chapter whose own
// per-step figures a forward would move (attention counters) puts them
// back inside its hook.
typedef float (*TrainValLoss)(void* ctx, const TrainSetup* s, int n_batches);

struct Ckpt;  // ckpt.h
typedef struct {
    int chapter;
    size_t num_params;       // the whole model's, for the summary
    double flops_per_token;  // for MFU (gpt_flops_per_token, or the chapter's)
    int rows;                // sequences per loop.inputs / loop.targets
    TrainValLoss val_loss;   // NULL: the chapter has no validation
    void* ctx;               // val_loss's
    struct Ckpt* ckpt;       // NULL: no training-state checkpoints
} TrainLoopSpec;

typedef struct {
    int start, steps;       // the loop runs steps [start, steps): start is the resumed step (ckpt)
    int *inputs, *targets;  // (rows, T) each: this rank's tokens, filled by the chapter
    JsonLog log;            // --log, for a chapter's own records
    StepClock clock;        // the timed steps (clock_ms_per_step, ...)
    JsonBuf step_extra;     // the chapter's own fields of the next step record
    float loss, val_loss;   // the last step's loss; the last validation loss (-1: none yet)
    // set by train_loop_begin
    const TrainArgs* args;
    const TrainSetup* setup;
    const Mesh* mesh;
    double peak_gflops;
    TrainLoopSpec spec;
} TrainLoop;

void train_loop_begin(TrainLoop* L, const Run* run, const TrainLoopSpec* spec);
void train_loop_step(TrainLoop* L, int step, float loss, float norm);
// 1 when step `step` counts in the averages (the clock's rule), for a
// chapter's own per-step figures.
int train_loop_timed(const TrainLoop* L, int step);
// extra: the chapter's summary fields (NULL: none).
void train_loop_end(TrainLoop* L, const JsonBuf* extra);

// The plumbing around every chapter's training loop, the same in each: opens
// --log (rank 0 writes it; a file that cannot be opened ends every rank with
// one message) and allocates this rank's batch on the host, *inputs and
// *targets of rows x T tokens each (rows: the sequences this rank reads per
// step or micro-step). Collective.
void train_loop_open(JsonLog* log, int** inputs, int** targets, const TrainArgs* a, int rows, int T);
// After the loop's last record: closes the log and frees the batch.
void train_loop_close(JsonLog* log, int* inputs, int* targets);
// The start-up line of --recompute selective or full (nothing for none),
// with a chapter's own note appended ("" or NULL for none).
void train_print_recompute(RecomputeMode mode, const char* note);

#endif
