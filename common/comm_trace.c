// comm_trace.c: the communication layer's spans on the --trace timeline
// (comm_trace.h).
#include "comm_trace.h"

#include <stdio.h>

#include "runtime.h"
#include "trace.h"

// The operation the next wait or progress seconds belong to, for the
// trace's span names: a blocking call, a non-blocking start, or a wait or
// test on a request (per thread: a progress thread has its own).
typedef enum { PHASE_BLOCKING, PHASE_START, PHASE_REQUEST, PHASE_PROGRESS } Phase;
static _Thread_local int cur_coll = 0, cur_axis = 0;
static _Thread_local double cur_bytes = -1.0;  // as counted: the span's "bytes"
static _Thread_local Phase cur_phase = PHASE_BLOCKING;

void comm_trace_operation(Collective coll, int slot, double bytes) {
    cur_coll = coll;
    cur_axis = slot;
    cur_bytes = bytes;
    cur_phase = PHASE_BLOCKING;
}

// A span of exactly `seconds` ending now (a clock read just after the
// caller's), so the trace's spans add up to the counters.
static void trace_comm(TraceKind kind, double seconds, const char* what) {
    if (!trace_enabled()) return;
    double t1 = now_seconds();
    char name[48];
    snprintf(name, sizeof(name), "%s%s (%s)", what, collective_name((Collective)cur_coll), comm_axis_name(cur_axis));
    trace_span_bytes(kind, t1 - seconds, t1, 0, name, cur_bytes);
}

void comm_trace_wait(double seconds) { trace_comm(TRACE_WAIT, seconds, cur_phase == PHASE_REQUEST ? "wait " : ""); }

void comm_trace_progress(double seconds) {
    if (cur_phase == PHASE_PROGRESS) {
        // polling every operation in flight from inside an op: no one name
        cur_phase = PHASE_BLOCKING;
        if (trace_enabled()) {
            double t1 = now_seconds();
            trace_span(TRACE_COMM, t1 - seconds, t1, 0, -1, 0, "progress");
        }
        return;
    }
    trace_comm(TRACE_COMM, seconds, cur_phase == PHASE_START ? "start " : "test ");
}

void comm_note_progress(void) { cur_phase = PHASE_PROGRESS; }

void comm_request_started(CommRequest* req) {
    req->coll = cur_coll;
    req->axis = cur_axis;
    req->bytes = cur_bytes;
    req->t_start = trace_start();
    cur_phase = PHASE_START;
}

void comm_request_current(const CommRequest* req) {
    cur_coll = req->coll;
    cur_axis = req->axis;
    cur_bytes = req->bytes;
    cur_phase = PHASE_REQUEST;
}

void comm_request_done(const CommRequest* req) {
    if (!trace_enabled()) return;
    char name[48];
    snprintf(name, sizeof(name), "%s (%s)", collective_name((Collective)req->coll), comm_axis_name(req->axis));
    trace_span_bytes(TRACE_INFLIGHT, req->t_start, now_seconds(), 1, name, req->bytes);
}
