// comm_count.c: calls, bytes and bus bytes per collective and axis, and the
// seconds spent waiting, for whichever backend runs the calls.
#include "comm_count.h"

#include <stdio.h>
#include <string.h>

#include "runtime.h"
#include "trace.h"

static CommCount counts[NUM_COLLECTIVES][COMM_NUM_AXES];
static double wait_seconds = 0.0;
static double progress_seconds = 0.0;

const char* collective_name(Collective c) {
    static const char* names[NUM_COLLECTIVES] = {
        "allreduce", "reduce_scatter", "allgather", "broadcast", "reduce", "scatter",
        "gather", "alltoall", "send", "recv", "barrier"};
    return names[c];
}

const char* comm_axis_name(int axis) {
    return axis == COMM_WORLD_AXIS ? "world" : mesh_axis_name((MeshAxis)axis);
}

CommCount comm_count(Collective coll, int axis) { return counts[coll][axis]; }

void comm_counts_reset(void) {
    memset(counts, 0, sizeof(counts));
    wait_seconds = 0.0;
    progress_seconds = 0.0;
}

double comm_wait_seconds(void) { return wait_seconds; }
double comm_progress_seconds(void) { return progress_seconds; }

void comm_tally(const Comm* c, Collective coll, size_t bytes, double factor) {
    comm_tally_bytes(c, coll, (double)bytes, (double)bytes * factor);
}

// The operation the next wait or progress seconds belong to, for the
// trace's span names: a blocking call, a non-blocking start, or a wait or
// test on a request (per thread: a progress thread has its own).
typedef enum { PHASE_BLOCKING, PHASE_START, PHASE_REQUEST } Phase;
static _Thread_local int cur_coll = 0, cur_axis = 0;
static _Thread_local Phase cur_phase = PHASE_BLOCKING;

void comm_tally_bytes(const Comm* c, Collective coll, double bytes, double bus_bytes) {
    cur_coll = coll;
    cur_axis = c->axis;
    cur_phase = PHASE_BLOCKING;
    CommCount* k = &counts[coll][c->axis];
    k->calls += 1;
    k->bytes += bytes;
    k->bus_bytes += bus_bytes;
}

double comm_ring_factor(const Comm* c) { return c->size > 1 ? (double)(c->size - 1) / c->size : 0.0; }

// A span of exactly `seconds` ending now (a clock read just after the
// caller's), so the trace's spans add up to the counters.
static void trace_comm(TraceKind kind, double seconds, const char* what) {
    if (!trace_enabled()) return;
    double t1 = now_seconds();
    char name[48];
    snprintf(name, sizeof(name), "%s%s (%s)", what, collective_name((Collective)cur_coll), comm_axis_name(cur_axis));
    trace_span(kind, t1 - seconds, t1, 0, -1, 0, name);
}

void comm_add_wait(double seconds) {
    wait_seconds += seconds;
    trace_comm(TRACE_WAIT, seconds, cur_phase == PHASE_REQUEST ? "wait " : "");
}

void comm_add_progress(double seconds) {
    progress_seconds += seconds;
    trace_comm(TRACE_COMM, seconds, cur_phase == PHASE_START ? "start " : "test ");
}

void comm_request_started(CommRequest* req) {
    req->coll = cur_coll;
    req->axis = cur_axis;
    req->t_start = trace_start();
    cur_phase = PHASE_START;
}

void comm_request_current(const CommRequest* req) {
    cur_coll = req->coll;
    cur_axis = req->axis;
    cur_phase = PHASE_REQUEST;
}

void comm_request_done(const CommRequest* req) {
    if (!trace_enabled()) return;
    char name[48];
    snprintf(name, sizeof(name), "%s (%s)", collective_name((Collective)req->coll), comm_axis_name(req->axis));
    trace_span(TRACE_INFLIGHT, req->t_start, now_seconds(), 1, -1, 0, name);
}
