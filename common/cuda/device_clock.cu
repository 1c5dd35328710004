// device_clock.cu: the CUDA backend's clocks of the device's work
// (device_clock.h), the twin of common/cpu/device_clock.c: events recorded
// on the compute stream (device.cu's), read after the work is done.
#include "cuda_common.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

extern "C" {
#include "device.h"
#include "device_clock.h"
}

// ---------------------------------------------------------------- device clock
// A span is a start and a stop event recorded on the compute stream. The
// events are made at a span's first use and kept: reading the clock sums
// the spans recorded since the last read and frees their slots, so each step
// reuses the events of the one before.
static cudaEvent_t clock_event(DeviceClock* c, int i) {
    if (!c->ev[i]) {
        cudaEvent_t e;
        CUDA_CHECK(cudaEventCreate(&e));  // with timing (no cudaEventDisableTiming)
        c->ev[i] = (void*)e;
    }
    return (cudaEvent_t)c->ev[i];
}

// The recorded spans' slots free again; an open span's start event moves to
// the first slot, where its stop will pair with it.
static void clock_drop_read(DeviceClock* c) {
    if (c->open && c->n > 0) {
        void* e = c->ev[0];
        c->ev[0] = c->ev[2 * c->n], c->ev[2 * c->n] = e;
    }
    c->n = 0;
}

extern "C" void device_clock_start(DeviceClock* c) {
    // a clock nobody reads (the FSDP engine's in chapters 4 and 6) must not
    // grow without end: past DEVICE_CLOCK_UNREAD spans it reads itself, one
    // wait for the device per that many spans
    if (c->n >= DEVICE_CLOCK_UNREAD) device_clock_seconds(c);
    if (c->n == c->cap) {  // room for twice the spans; the new slots hold no event yet
        int cap = c->cap ? 2 * c->cap : 64;
        // calloc, not memory.c's xcalloc: memory.c calls this file
        void** ev = (void**)calloc(2 * (size_t)cap, sizeof(void*));
        if (!ev) FATAL("out of host memory for %d device clock spans", cap);
        if (c->n) memcpy(ev, c->ev, 2 * (size_t)c->n * sizeof(void*));
        free(c->ev);
        c->ev = ev, c->cap = cap;
    }
    CUDA_CHECK(cudaEventRecord(clock_event(c, 2 * c->n), cuda_compute_stream));
    c->open = 1;
}

extern "C" void device_clock_stop(DeviceClock* c) {
    if (!c->open) return;  // no start to measure from
    CUDA_CHECK(cudaEventRecord(clock_event(c, 2 * c->n + 1), cuda_compute_stream));
    c->n++;
    c->open = 0;
}

// Waits for the compute stream (device_synchronize polls through the comm
// layer's error checks: the stream may wait for communication), so for the
// last stop, then adds the spans' times on the GPU's clock to the total.
extern "C" double device_clock_seconds(DeviceClock* c) {
    if (c->n == 0) return c->seconds;
    device_synchronize();
    for (int i = 0; i < c->n; i++) {
        float ms = 0.0f;
        CUDA_CHECK(cudaEventElapsedTime(&ms, (cudaEvent_t)c->ev[2 * i], (cudaEvent_t)c->ev[2 * i + 1]));
        c->seconds += ms / 1e3;
    }
    clock_drop_read(c);
    return c->seconds;
}

// Spans not read yet are dropped with the total (their events stay for
// reuse); an open span stays open.
extern "C" void device_clock_reset(DeviceClock* c) {
    clock_drop_read(c);
    c->seconds = 0.0;
}

extern "C" void device_clock_free(DeviceClock* c) {
    for (int i = 0; i < 2 * c->cap; i++)
        if (c->ev[i]) CUDA_CHECK(cudaEventDestroy((cudaEvent_t)c->ev[i]));
    free(c->ev);
    memset(c, 0, sizeof(*c));
}

// ---------------------------------------------------------------- device stamps
// What this relies on, from the CUDA runtime API's Event Management
// reference (docs.nvidia.com/cuda/cuda-runtime-api, group__CUDART__EVENT):
//   - cudaEventRecord captures in the event the work queued on the stream at
//     the call; the event completes when the stream has run that work. It
//     "can be called multiple times on the same event and will overwrite the
//     previously captured state": a stamp taken again replaces the one
//     before, and each step reuses the events of the step before.
//   - cudaEventElapsedTime gives milliseconds between two events "with a
//     resolution of around 0.5 microseconds"; it returns cudaErrorNotReady
//     unless both events have completed, and an invalid-handle error for an
//     event made with cudaEventDisableTiming (so these are made without it)
//     or never recorded (so a read refuses a stamp not taken this step).
//   - cudaEventSynchronize "waits until the completion of all work currently
//     captured in" the event. Not used here: the compute stream may wait
//     for a receive from a peer, and a plain wait would hang on a dead peer;
//     device_synchronize waits for the whole stream, the last stamp with it,
//     polling NCCL's errors under the watchdog (comm.c), and costs nothing
//     more when the step already waited for the device (chapter 5 reads
//     after the step's norm did).
// The anchor: begin waits for the stream, reads the host clock and records
// the first event, which completes as soon as the GPU reaches it (the
// stream is empty), a few microseconds after the clock was read: stamps
// are that late, the same few microseconds for every stamp of the step.
static double stamp_clock(void) {  // now_seconds's clock (runtime.c)
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static cudaEvent_t stamp_event(DeviceStamps* s, int slot) {  // slot 0: the first event; 1 + i: stamp i
    if (!s->ev[slot]) {
        cudaEvent_t e;
        CUDA_CHECK(cudaEventCreate(&e));  // with timing (no cudaEventDisableTiming)
        s->ev[slot] = (void*)e;
    }
    return (cudaEvent_t)s->ev[slot];
}

extern "C" void device_stamps_begin(DeviceStamps* s, int n) {
    if (n < 0) FATAL("device_stamps_begin: %d stamps (a step has 0 or more)", n);
    if (n > s->cap || !s->ev) {  // room for n stamps; the new slots hold no event yet
        // calloc, not memory.c's xcalloc: memory.c calls this file
        void** ev = (void**)calloc((size_t)n + 1, sizeof(void*));
        unsigned char* done = (unsigned char*)calloc((size_t)n + 1, 1);
        if (!ev || !done) FATAL("out of host memory for %d device stamps", n);
        if (s->ev) memcpy(ev, s->ev, ((size_t)s->cap + 1) * sizeof(void*));
        free(s->ev), free(s->done);
        s->ev = ev, s->done = done, s->cap = n;
    }
    if (n) memset(s->done, 0, (size_t)n);
    s->n = n, s->begun = 1;
    device_synchronize();  // once a step: the anchor is where the stream is empty
    s->anchor = stamp_clock();
    CUDA_CHECK(cudaEventRecord(stamp_event(s, 0), cuda_compute_stream));
}

extern "C" void device_stamp(DeviceStamps* s, int i) {
    if (!s->begun) FATAL("device_stamp %d without device_stamps_begin", i);
    if (i < 0 || i >= s->n) FATAL("device_stamp %d: out of the step's %d stamps [0, %d)", i, s->n, s->n);
    CUDA_CHECK(cudaEventRecord(stamp_event(s, 1 + i), cuda_compute_stream));
    s->done[i] = 1;
}

extern "C" void device_stamps_read(DeviceStamps* s, double* out) {
    if (!s->begun) FATAL("device_stamps_read without device_stamps_begin");
    for (int i = 0; i < s->n; i++)
        if (!s->done[i]) FATAL("device_stamps_read: stamp %d of %d was not taken since device_stamps_begin", i, s->n);
    device_synchronize();  // every stamp completed (see above)
    for (int i = 0; i < s->n; i++) {
        float ms = 0.0f;
        CUDA_CHECK(cudaEventElapsedTime(&ms, (cudaEvent_t)s->ev[0], (cudaEvent_t)s->ev[1 + i]));
        out[i] = s->anchor + ms / 1e3;
    }
}

extern "C" void device_stamps_free(DeviceStamps* s) {
    if (s->ev)
        for (int i = 0; i <= s->cap; i++)
            if (s->ev[i]) CUDA_CHECK(cudaEventDestroy((cudaEvent_t)s->ev[i]));
    free(s->ev), free(s->done);
    memset(s, 0, sizeof(*s));
}
