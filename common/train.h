// train.h: what every chapter does before and around its training loop:
// resolve the model and batch from the flags, open and check the data, and
// compute a validation loss.
#ifndef TRAIN_H
#define TRAIN_H

#include "args.h"
#include "comm.h"
#include "data.h"
#include "mesh.h"
#include "model.h"

typedef struct {
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

// After training: prints --sample N generated characters (rank 0), and writes
// --save FILE from the given host copy of the full parameters. Collective:
// every rank calls it; writer says which rank holds the parameters to write.
void train_sample(GPT* m, const TrainArgs* a);
void train_save(const TrainArgs* a, const GPTConfig* cfg, const float* params_host, int writer);

#endif
