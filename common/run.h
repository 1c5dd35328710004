// run.h: a training program's start and end, the same in every chapter.
#ifndef RUN_H
#define RUN_H

#include "args.h"
#include "comm.h"
#include "mesh.h"
#include "train.h"

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

#endif
