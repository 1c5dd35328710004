// trace.c: per-rank span buffers, gathered by rank 0 into a Chrome trace
// event file. See trace.h.
#include "trace.h"

#include <errno.h>
#include <math.h>
#include <mpi.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "atomic_file.h"
#include "errors.h"
#include "memory.h"
#include "device.h"
#include "rank.h"
#include "runtime.h"

// One span as it travels to rank 0 (plain bytes: every rank runs the same
// binary). Times are integer nanoseconds after t0, so that nesting and sums
// are exact integer arithmetic once written (ts = ns / 1000 with 3 decimals).
typedef struct {
    int64_t t0_ns, t1_ns;
    int32_t kind, tid, step, timed;
    int64_t bytes;  // a comm layer span's operation: the bytes it counted; -1: none
    char name[48];
} Span;

static const char* path_ = NULL;
static double t0_ = 0.0;
static Span* spans = NULL;
static size_t n_spans = 0, cap_spans = 0;
// the comm layer may record from a progress thread: appends are locked
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

const char* trace_kind_name(TraceKind k) {
    static const char* names[TRACE_NUM_KINDS] = {"compute", "comm", "wait", "inflight", "step", "validation"};
    return k >= 0 && k < TRACE_NUM_KINDS ? names[k] : "?";
}

void trace_open(const char* path) {
    path_ = path;
    n_spans = 0;
    if (!path) return;
    // a common t0: every rank leaves the barrier at (nearly) the same moment
    MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
    t0_ = now_seconds();
}

int trace_enabled(void) { return path_ != NULL; }

double trace_start(void) { return path_ ? now_seconds() : 0.0; }

static int64_t to_ns(double t) { return (int64_t)llround((t - t0_) * 1e9); }

static void add_span(TraceKind kind, double t0, double t1, int tid, int step, int timed, const char* name,
                     int64_t bytes) {
    Span s;
    memset(&s, 0, sizeof(s));
    s.t0_ns = to_ns(t0);
    s.t1_ns = to_ns(t1);
    s.kind = kind;
    s.tid = tid;
    s.step = step;
    s.timed = timed;
    s.bytes = bytes;
    snprintf(s.name, sizeof(s.name), "%s", name);
    pthread_mutex_lock(&lock);
    if (n_spans == cap_spans) {
        cap_spans = cap_spans ? 2 * cap_spans : 4096;
        Span* grown = realloc(spans, cap_spans * sizeof(Span));
        CHECK(grown != NULL, "out of host memory for %zu trace spans", cap_spans);
        spans = grown;
    }
    spans[n_spans++] = s;
    pthread_mutex_unlock(&lock);
}

void trace_span(TraceKind kind, double t0, double t1, int tid, int step, int timed, const char* name) {
    if (!path_) return;
    add_span(kind, t0, t1, tid, step, timed, name, -1);
}

void trace_span_bytes(TraceKind kind, double t0, double t1, int tid, const char* name, double bytes) {
    if (!path_) return;
    add_span(kind, t0, t1, tid, -1, 0, name, bytes >= 0 ? (int64_t)llround(bytes) : -1);
}

void trace_compute(double t0, const char* fmt, ...) {
    if (!path_) return;
    // the GPU runs behind the host: the span ends when its kernels have
    device_synchronize();
    double t1 = now_seconds();
    char name[48];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof(name), fmt, ap);
    va_end(ap);
    trace_span(TRACE_COMPUTE, t0, t1, 0, -1, 0, name);
}

// In-flight spans overlap each other: each goes on the first row (tid 1, 2,
// ...) whose last span ended before it started, in order of start.
static int by_start(const void* a, const void* b) {
    const Span *x = a, *y = b;
    return x->t0_ns < y->t0_ns ? -1 : x->t0_ns > y->t0_ns;
}

static void assign_rows(void) {
    qsort(spans, n_spans, sizeof(Span), by_start);
    int64_t row_end[64];
    int rows = 0;
    for (size_t i = 0; i < n_spans; i++) {
        if (spans[i].kind != TRACE_INFLIGHT) continue;
        int r = 0;
        while (r < rows && row_end[r] > spans[i].t0_ns) r++;
        if (r == rows) {
            if (rows == 64) r = 63;  // more than 63 at once: the last row overlaps
            else rows++;
        }
        row_end[r] = spans[i].t1_ns;
        spans[i].tid = 1 + r;
    }
}

static int write_events(FILE* f, const Span* all, const int* counts, int world) {
    int ok = fprintf(f, "{\"traceEvents\":[\n") > 0;
    size_t k = 0;
    for (int r = 0; r < world && ok; r++) {
        ok = fprintf(f, "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%d,\"args\":{\"name\":\"rank %d\"}},\n"
                        "{\"name\":\"process_sort_index\",\"ph\":\"M\",\"pid\":%d,\"args\":{\"sort_index\":%d}},\n"
                        "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":0,\"args\":{\"name\":\"host\"}},\n",
                     r, r, r, r, r) > 0;
        int max_tid = 0;
        for (int i = 0; i < counts[r]; i++)
            if (all[k + i].tid > max_tid) max_tid = all[k + i].tid;
        for (int t = 1; t <= max_tid && ok; t++)
            ok = fprintf(f, "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":%d,\"args\":{\"name\":\"in flight %d\"}},\n",
                         r, t, t) > 0;
        for (int i = 0; i < counts[r] && ok; i++, k++) {
            const Span* s = &all[k];
            int64_t d = s->t1_ns - s->t0_ns;
            ok = fprintf(f, "{\"name\":\"%s\",\"cat\":\"%s\",\"ph\":\"X\",\"ts\":%lld.%03lld,\"dur\":%lld.%03lld,"
                            "\"pid\":%d,\"tid\":%d",
                         s->name, trace_kind_name((TraceKind)s->kind), (long long)(s->t0_ns / 1000),
                         (long long)(s->t0_ns % 1000), (long long)(d / 1000), (long long)(d % 1000), r, s->tid) > 0;
            if (ok && s->step >= 0) ok = fprintf(f, ",\"args\":{\"step\":%d,\"timed\":%d}", s->step, s->timed) > 0;
            else if (ok && s->bytes >= 0) ok = fprintf(f, ",\"args\":{\"bytes\":%lld}", (long long)s->bytes) > 0;
            if (ok) ok = fprintf(f, "},\n") > 0;
        }
    }
    // a last event closes the list without a trailing comma
    if (ok) ok = fprintf(f, "{\"name\":\"trace_end\",\"ph\":\"M\",\"pid\":0,\"args\":{}}\n],\"displayTimeUnit\":\"ms\"}\n") > 0;
    return ok;
}

void trace_finish(void) {
    if (!path_) return;
    int rank = 0, world = 1;
    MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
    MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &world));
    assign_rows();
    // sorted by start (assign_rows), so each rank's events read top-down
    CHECK(n_spans * sizeof(Span) <= (size_t)2147483647, "too many trace spans (%zu) to gather", n_spans);
    int mine = (int)(n_spans * sizeof(Span));
    int* counts = rank == 0 ? xmalloc(sizeof(int) * world) : NULL;
    int* displs = rank == 0 ? xmalloc(sizeof(int) * world) : NULL;
    MPI_CHECK(MPI_Gather(&mine, 1, MPI_INT, counts, 1, MPI_INT, 0, MPI_COMM_WORLD));
    Span* all = NULL;
    if (rank == 0) {
        size_t total = 0;
        for (int r = 0; r < world; r++) {
            CHECK(total + counts[r] <= (size_t)2147483647, "the trace is too large to gather (over 2 GiB)");
            displs[r] = (int)total;
            total += counts[r];
        }
        all = xmalloc(total ? total : 1);
    }
    MPI_CHECK(MPI_Gatherv(spans, mine, MPI_BYTE, all, counts, displs, MPI_BYTE, 0, MPI_COMM_WORLD));
    char msg[ERROR_MAX] = "";
    int failed = 0;
    if (rank == 0) {
        for (int r = 0; r < world; r++) counts[r] /= (int)sizeof(Span);
        // write next to the target, then rename: never a half file
        AtomicFile out;
        int err = atomic_open(&out, path_);
        if (!err) err = atomic_close(&out, write_events(out.f, all, counts, world));
        if (err) {
            snprintf(msg, sizeof(msg), "cannot write the trace '%s': %s", path_, strerror(err));
            failed = 1;
        }
    }
    free(all);
    free(counts);
    free(displs);
    fail_if_any(failed, msg);
    unsigned long long total_spans = 0, n = n_spans;
    MPI_CHECK(MPI_Reduce(&n, &total_spans, 1, MPI_UNSIGNED_LONG_LONG, MPI_SUM, 0, MPI_COMM_WORLD));
    print0("trace: %llu spans of %d rank%s in %s (chrome://tracing, ui.perfetto.dev, make timeline TRACE=%s)\n",
           total_spans, world, world == 1 ? "" : "s", path_, path_);
    free(spans);
    spans = NULL;
    n_spans = cap_spans = 0;
    path_ = NULL;
}
