// optime.h: where a step's time goes, per kind of op. The CPU ops
// (common/cpu/ops_*.c) read the clock at their start and end and add the
// difference to their kind's counter: two clock reads (tens of nanoseconds)
// per op call, a few hundred calls a step, so it is always on. The step
// clock (train_loop.c) snapshots the counters around each timed step, so the
// figures cover exactly the steps the summary's ms per step covers; the
// summary record writes them ("op_ms_per_step", per rank), and
// common/tools/op_breakdown.py prints them next to the step time.
//
// Not counted: ops_add (the hand-written collectives add inside their own
// communication time) and the chunk-attention ops; time they take, like any
// code outside the ops, shows as "other". The CUDA ops do not time
// themselves (a kernel launch returns before the kernel ends): there every
// op kind reads 0 and the whole step is "other".
#ifndef OPTIME_H
#define OPTIME_H

#include <time.h>

typedef enum {
    OPK_ENCODER,
    OPK_LAYERNORM,
    OPK_MATMUL,
    OPK_ATTENTION,
    OPK_GELU,
    OPK_RESIDUAL,
    OPK_CROSSENTROPY,
    OPK_MOE,
    OPK_OPTIMIZER,  // AdamW and the gradient norm's sum of squares
    OPK_MEMORY,     // ops_zero, ops_copy, ops_scale
    NUM_OP_KINDS
} OpKind;

// Forward and backward of a kind are counted apart (the optimizer and the
// memory ops count as forward).
typedef enum { OP_FWD, OP_BWD, NUM_OP_PASSES } OpPass;

const char* optime_kind_name(OpKind k);

// t0 = optime_start(); ... optime_stop(k, pass, t0);
static inline double optime_start(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
void optime_stop(OpKind k, OpPass pass, double t0);

// The step clock's hooks: a step's counters are kept when it is timed.
void optime_step_begin(void);
void optime_step_end(int timed);
// Milliseconds per timed step of (k, pass); 0 before any timed step.
double optime_ms_per_step(OpKind k, OpPass pass);
// The same for communication, from comm.h's clocks: blocked in it (wait) and
// driving it while it is in flight (progress). comm_progress runs before an
// op's clock starts, so no second is counted twice.
double optime_comm_wait_ms_per_step(void);
double optime_comm_progress_ms_per_step(void);
// This rank's own milliseconds per timed step, between the same two hooks
// (ranks start a step at different moments: the summary's ms per step is
// rank 0's), so its op times add up to no more than this.
double optime_step_ms(void);

#endif
