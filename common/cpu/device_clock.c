// device_clock.c: the CPU backend's clocks of the device's work
// (device_clock.h). An op has finished when it returns, so both are the
// host clock at the calls.
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "device_clock.h"
#include "errors.h"

// Each op has finished when it returns: the host clock is the device's
// (OpenMP's wall clock: runtime.c calls this file, so not its now_seconds)
void device_clock_start(DeviceClock* c) { c->t0 = omp_get_wtime(), c->open = 1; }
void device_clock_stop(DeviceClock* c) {
    if (c->open) c->seconds += omp_get_wtime() - c->t0;
    c->open = 0;
}
double device_clock_seconds(DeviceClock* c) { return c->seconds; }
void device_clock_reset(DeviceClock* c) { c->seconds = 0.0; }
void device_clock_free(DeviceClock* c) { device_clock_reset(c); }

// Device stamps: the host clock at each call, since an op has finished when
// it returns. The clock is now_seconds's (CLOCK_MONOTONIC), read here
// directly (runtime.c calls this file), so stamps compare with host times.
static double stamp_clock(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void device_stamps_begin(DeviceStamps* s, int n) {
    if (n < 0) FATAL("device_stamps_begin: %d stamps (a step has 0 or more)", n);
    if (n > s->cap) {  // calloc, not memory.c's xcalloc: memory.c calls this file
        free(s->t), free(s->done);
        s->t = calloc((size_t)n, sizeof(double)), s->done = calloc((size_t)n, 1);
        if (!s->t || !s->done) FATAL("out of host memory for %d device stamps", n);
        s->cap = n;
    }
    if (n) memset(s->done, 0, (size_t)n);
    s->n = n, s->begun = 1;
    s->anchor = stamp_clock();
}

void device_stamp(DeviceStamps* s, int i) {
    if (!s->begun) FATAL("device_stamp %d without device_stamps_begin", i);
    if (i < 0 || i >= s->n) FATAL("device_stamp %d: out of the step's %d stamps [0, %d)", i, s->n, s->n);
    s->t[i] = stamp_clock();
    s->done[i] = 1;
}

void device_stamps_read(DeviceStamps* s, double* out) {
    if (!s->begun) FATAL("device_stamps_read without device_stamps_begin");
    for (int i = 0; i < s->n; i++) {
        if (!s->done[i]) FATAL("device_stamps_read: stamp %d of %d was not taken since device_stamps_begin", i, s->n);
        out[i] = s->t[i];
    }
}

void device_stamps_free(DeviceStamps* s) {
    free(s->t), free(s->done);
    memset(s, 0, sizeof(*s));
}
