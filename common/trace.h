// trace.h: per-rank timelines (--trace FILE.json).
//
// Every rank records spans (a name, a kind, a start and an end on the host's
// monotonic clock, relative to a t0 every rank takes right after a barrier)
// into a buffer of its own. At the end rank 0 gathers them and writes one
// Chrome trace event file: a JSON object {"traceEvents":[...]} of complete
// events ("ph":"X", "ts" and "dur" in microseconds) with the rank as "pid",
// which chrome://tracing and https://ui.perfetto.dev open, and which
// `make timeline TRACE=FILE.json` draws as a Gantt chart.
//
// Who records what (one place each, so every chapter gets them):
//   compute   the model code: "embedding forward", "block l forward",
//             "block l recompute" (inside its backward), "block l backward",
//             "head forward", "head backward"; chapters: "optimizer"
//   comm      the comm layer: host time inside a non-blocking start
//             ("start allreduce (dp)") or comm_test ("test ...") = the
//             comm layer's progress seconds
//   wait      the comm layer: a blocking call ("allreduce (dp)") or a
//             comm_wait ("wait allreduce (dp)") = its wait seconds
//   inflight  a non-blocking operation from its start to the wait or test
//             that completed it, on its own row (tid 1, 2, ...: several may
//             be in flight at once); pipeline sends and receives are these
//   step      the StepClock's step, from clock_begin to clock_end: the same
//             clock reads, so the spans add up to the summary's figures;
//             named by the run's step number (a resumed run's continue)
//   validation  the validation loss's forwards between steps (the loop:
//             "validation after step s"), outside every step
// The host rows (tid 0) nest: a span either holds another or misses it.
// On the CUDA backend a compute span ends with a device synchronize when
// tracing, so it covers the kernels, not only their launch.
#ifndef TRACE_H
#define TRACE_H

typedef enum {
    TRACE_COMPUTE, TRACE_COMM, TRACE_WAIT, TRACE_INFLIGHT, TRACE_STEP, TRACE_VALIDATION, TRACE_NUM_KINDS
} TraceKind;

// "compute", "comm", "wait", "inflight", "step", "validation": the events' "cat"
const char* trace_kind_name(TraceKind k);

// Collective over MPI_COMM_WORLD: path NULL turns tracing off; else every
// rank meets at a barrier and takes its t0.
void trace_open(const char* path);
int trace_enabled(void);
// now_seconds() when tracing, else 0 (cheap: no clock read).
double trace_start(void);
// A compute span from t0 (trace_start) to now, on the host row.
void trace_compute(double t0, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
// Any span [t0, t1] (now_seconds() clock) on row tid; step >= 0 tags a step
// span with its number and whether the StepClock timed it.
void trace_span(TraceKind kind, double t0, double t1, int tid, int step, int timed, const char* name);
// Collective over MPI_COMM_WORLD: rank 0 gathers every rank's spans and
// writes the file atomically; a failed write ends every rank with a message.
// Does nothing when tracing is off.
void trace_finish(void);
// The comm layer's span of one operation, tagged with the bytes its counters
// counted for it ("args":{"bytes":N}; bytes < 0: none).
void trace_span_bytes(TraceKind kind, double t0, double t1, int tid, const char* name, double bytes);

#endif
