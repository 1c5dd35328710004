// optime.c: the per-op-kind timers (optime.h).
#include "optime.h"

#include "comm.h"

static const char* const kind_names[NUM_OP_KINDS] = {
    "encoder", "layernorm", "matmul",    "attention", "gelu",
    "residual", "crossentropy", "moe", "optimizer", "memory"};

// seconds so far, at the start of the current step, and summed over timed steps
static double total[NUM_OP_KINDS][NUM_OP_PASSES], at_begin[NUM_OP_KINDS][NUM_OP_PASSES],
    timed_sum[NUM_OP_KINDS][NUM_OP_PASSES];
static double comm_at_begin[2], comm_timed[2];  // wait, progress
static double step_begin, step_timed;           // this rank's own step clock
static int timed_steps;

const char* optime_kind_name(OpKind k) { return k >= 0 && k < NUM_OP_KINDS ? kind_names[k] : "?"; }

void optime_stop(OpKind k, OpPass pass, double t0) { total[k][pass] += optime_start() - t0; }

void optime_step_begin(void) {
    for (int k = 0; k < NUM_OP_KINDS; k++)
        for (int p = 0; p < NUM_OP_PASSES; p++) at_begin[k][p] = total[k][p];
    comm_at_begin[0] = comm_wait_seconds();
    comm_at_begin[1] = comm_progress_seconds();
    step_begin = optime_start();
}

void optime_step_end(int timed) {
    if (!timed) return;
    for (int k = 0; k < NUM_OP_KINDS; k++)
        for (int p = 0; p < NUM_OP_PASSES; p++) timed_sum[k][p] += total[k][p] - at_begin[k][p];
    comm_timed[0] += comm_wait_seconds() - comm_at_begin[0];
    comm_timed[1] += comm_progress_seconds() - comm_at_begin[1];
    step_timed += optime_start() - step_begin;
    timed_steps++;
}

double optime_ms_per_step(OpKind k, OpPass pass) {
    return timed_steps ? 1e3 * timed_sum[k][pass] / timed_steps : 0.0;
}

double optime_comm_wait_ms_per_step(void) { return timed_steps ? 1e3 * comm_timed[0] / timed_steps : 0.0; }
double optime_comm_progress_ms_per_step(void) {
    return timed_steps ? 1e3 * comm_timed[1] / timed_steps : 0.0;
}

double optime_step_ms(void) { return timed_steps ? 1e3 * step_timed / timed_steps : 0.0; }
