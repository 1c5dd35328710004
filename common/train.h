// train.h: what every chapter does before and around its training loop:
// resolve the model and batch from the flags, open and check the data, check
// the mesh against the model, and the glue every training loop repeats (the
// AdamW settings, the loss and gradient norm over ranks, validation, the
// end-of-run sample and save).
#ifndef TRAIN_H
#define TRAIN_H

#include "args.h"
#include "comm.h"
#include "data.h"
#include "mesh.h"
#include "model.h"
#include "ops.h"
#include "report.h"
#include "sharding.h"  // --show-sharding: a chapter shows its table before its loop

typedef struct TrainSetup {  // named: ckpt.h takes a pointer to one
    GPTConfig cfg;
    const char* model_name;  // "tiny", "small" or the checkpoint's path
    const char* checkpoint;  // the path when --model is a file, else NULL
    int B, T;                // global batch (sequences) and sequence length
    TokenSet train, val;     // val.count == 0: no validation data
} TrainSetup;

// Every rank calls it. Resolves the model (a preset, or a checkpoint's header),
// the batch and sequence defaults, opens the data and checks that everything
// fits together (sequence <= the model's positions, tokens < vocabulary, one
// batch fits the data). On any problem, every rank exits non-zero after one
// clear message: it never returns half set up.
void train_setup(TrainSetup* s, const TrainArgs* a);
// A chapter whose checkpoint file is not llm.c's (chapter 7's MoE file) sets
// this before run_start: train_setup then reads --model FILE's config with
// it instead of checkpoint_read_config (NULL or a message, as that one).
typedef const char* (*TrainConfigReader)(const char* path, GPTConfig* cfg, char* msg, size_t msg_len);
extern TrainConfigReader train_config_reader;
void train_setup_free(TrainSetup* s);

// Loads the checkpoint's parameters (flat layout, host memory) on every rank,
// exiting every rank with a message if the file cannot be read.
void train_load_checkpoint(const TrainSetup* s, float* params_host);

// Mean loss over the first n_batches global batches (s->B x s->T) of the
// validation set, run through m in pieces of m->B sequences, so every chapter
// validates on the same tokens; -1 if there is no validation data.
float train_val_loss(GPT* m, const TrainSetup* s, int n_batches);

// ---------------------------------------------------------------- a training run
// What every training chapter starts with, in this order: MPI, the flags
// (shared and the chapter's own), the mesh, threads, the device, one
// communicator per axis, the model and data set-up, the matmul peak for MFU.
typedef struct {
    TrainArgs args;
    Mesh mesh;
    Comm world, axes[NUM_AXES];
    const char* device;
    TrainSetup setup;
    double peak_gflops;
} Run;

// Returns 1 to go on; 0 when --help was printed (main returns 0). Any bad
// input ends every rank with one message.
int run_start(Run* r, int argc, char** argv, const char* program, const char* summary,
              const ArgSpec* extra, int n_extra, unsigned axes);
void run_finish(Run* r);

// Shared flags a chapter does not implement yet: it names them here, right
// after run_start, and a run that sets one ends with a message instead of
// silently ignoring it. Collective (every rank sees the same flags).
#define RUN_NO_CHECKPOINTS 1u  // --ckpt-dir, --resume, --save-every, --async-save
#define RUN_NO_RECOMPUTE 2u    // --recompute other than none
void run_refuse_flags(const Run* r, unsigned missing, const char* chapter);

// ---------------------------------------------------------------- what a mesh needs of the model
// What a chapter splits along each axis, beyond what every chapter splits
// (the global batch over dp). Zero fields need nothing.
typedef struct {
    int microbatches;  // a dp rank's share of the batch runs in this many pieces (0: 1)
    int experts;       // MoE experts, split over ep (0: no experts)
} MeshNeeds;

// One check for every chapter, one message style: the batch over dp x
// microbatches, the heads and the padded vocabulary over tp, the layers over
// pp, the sequence over cp, the experts over ep. On a mismatch every rank
// exits after rank 0 prints "X does not split over axis=N: use ...".
// needs may be NULL.
void train_check_mesh(const Mesh* mesh, const TrainSetup* s, const MeshNeeds* needs);

// ---------------------------------------------------------------- glue of the training loop
// The AdamW settings from the flags (DESIGN.md's betas and eps, --lr, --wd).
AdamWConfig train_adamw(const TrainArgs* a);

// The mean of a host scalar (a loss) over a group: every rank gets it. Plain
// MPI on the host, not counted with the strategy's communication.
double train_mean(const Comm* group, double mine);

// The step's gradient sum of squares lives on the device: train_sumsq_begin
// zeroes the run's one device double (allocated at the first call, counted
// as "other", kept until run_finish) and returns it; each grad_sumsq
// (ops.h) of the step adds its slice into it without waiting for the
// device; train_global_norm reads it, once per step.
double* train_sumsq_begin(void);
// The global gradient norm: sqrt of the sum over ranks of each rank's sum of
// squares. *sumsq (device memory) is this rank's share, which the caller
// makes disjoint: a tensor replicated over an axis (a LayerNorm over tp)
// enters on one rank of that axis only, so it counts once, not tp times.
// The sum is all-reduced (as one float, a counted all-reduce on the device)
// over each of the n_groups groups in turn, which together span the ranks
// that hold different parts. With no groups, sqrt(*sumsq). The one host
// read of the step's sum is here.
double train_global_norm(const double* sumsq, const Comm* const* groups, int n_groups);

// A forward on (micro, T) tokens of the caller's model, returning their mean
// loss. ctx is the caller's.
typedef float (*TrainForward)(void* ctx, const int* inputs, const int* targets);

// Mean loss over the first n_batches global batches (s->B x s->T) of the
// validation set, so every chapter validates on the same tokens: this rank
// runs sequences [b0, b0 + count) of each batch through forward, micro at a
// time; the losses are summed over `group` (NULL: this rank alone) and
// averaged over every piece run. Collective over group. -1 if there is no
// validation data.
float train_val_loss_with(const TrainSetup* s, int n_batches, TrainForward forward, void* ctx, int b0,
                          int count, int micro, const Comm* group);

// The end of a run: --sample N characters generated and --save FILE written
// from params_host, the full parameters in the flat layout on the one rank
// that holds them (NULL on every other rank). Sampling builds a model of
// sequence length T there. Collective: every rank calls it; a write error
// ends every rank. Whether a chapter needs to assemble params_host at all:
// train_wants_params.
void train_finish_params(const TrainArgs* a, const GPTConfig* cfg, int T, const float* params_host);
int train_wants_params(const TrainArgs* a);

// Step timing: the first step (caches, thread pools) is left out of the
// averages unless it is the only one.
typedef struct {
    double t0, w0, p0;              // when the step started; comm wait and progress seconds then
    double seconds, wait, progress; // summed over the timed steps
    int timed;
} StepClock;
void clock_begin(StepClock* c);
// Ends step `step` of `steps`; returns its seconds.
double clock_end(StepClock* c, int step, int steps);
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
// A TrainValLoss for a full replica, ctx a GPT* (train_val_loss).
float train_val_loss_gpt(void* gpt, const TrainSetup* s, int n_batches);

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

// After training: prints --sample N generated characters (rank 0), and writes
// --save FILE from the given host copy of the full parameters. Collective:
// every rank calls it; writer says which rank holds the parameters to write.
void train_sample(GPT* m, const TrainArgs* a);
// --sample N from a model no GPT holds (chapter 7's experts live on every ep
// rank): every rank calls it and next (gpt_sample_with) the same number of
// times; rank 0's window and logits are the ones sampled and printed, the
// other ranks run their part of each forward. Collective.
void train_sample_with(const TrainArgs* a, const GPTConfig* cfg, int T, GptNextLogits next, void* ctx);
void train_save(const TrainArgs* a, const GPTConfig* cfg, const float* params_host, int writer);

#endif
