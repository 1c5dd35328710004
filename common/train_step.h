// train_step.h: what every step does across ranks, the same in every
// chapter: the AdamW settings, the mean of the loss, the gradient's global
// norm.
#ifndef TRAIN_STEP_H
#define TRAIN_STEP_H

#include "args.h"
#include "comm.h"
#include "ops.h"

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
// Frees the run's norm scalars (run_finish calls it).
void train_sumsq_free(void);

#endif
