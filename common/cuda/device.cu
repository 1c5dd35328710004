// device.cu: the CUDA backend's device: one GPU per rank, memory from
// cudaMalloc. The twin of common/cpu/device.c (device.h and the device part
// of memory.h).
//
// Every copy, memset and kernel runs on one compute stream, created here
// together with the cuBLAS handle that runs the matmuls on it. The stream is
// a non-blocking one: it never waits on CUDA's legacy default stream, so the
// only orderings are the ones written down (this stream's own order, and the
// events of the communication layer in comm.c).
#include "cuda_common.h"

#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

extern "C" {
#include "device.h"
#include "memory.h"
}

cudaStream_t cuda_compute_stream = NULL;
void (*cuda_compute_wait)(void) = NULL;
cublasHandle_t cuda_cublas = NULL;

// ---------------------------------------------------------------- device.h

// Plain device memory (never managed memory: a rank's data lives on its GPU
// and moves only through mem_to_device, mem_to_host and the comm layer),
// zero-filled before it is handed out. Sizes round up to cudaMalloc's 256-byte
// granule, and a request for 0 bytes still gets a block, as on the CPU.
extern "C" void* device_raw_alloc(size_t bytes) {
    size_t rounded = (bytes + 255) / 256 * 256;
    if (rounded == 0) rounded = 256;
    void* p = NULL;
    cudaError_t rc = cudaMalloc(&p, rounded);
    if (rc == cudaErrorMemoryAllocation) {
        (void)cudaGetLastError();  // clear it; mem_alloc reports the failure with the category
        return NULL;
    }
    CUDA_CHECK(rc);
    CUDA_CHECK(cudaMemsetAsync(p, 0, rounded, cuda_compute_stream));
    device_synchronize();  // zero before anyone sees it (polled: the stream may wait for NCCL)
    return p;
}

// Queued work (a collective the host did not wait for) may still use the
// block, and cudaFree only "may perform implicit synchronization" (its
// documentation), unpolled: a collective stuck on a dead peer would hold it
// forever. So device_synchronize first (polled, watched): the block is
// free of queued work, and a dead peer ends the job with a message.
extern "C" void device_raw_free(void* ptr) {
    device_synchronize();
    CUDA_CHECK(cudaFree(ptr));
}

extern "C" const char* device_memory_name(void) { return "GPU memory"; }

// The host threads left to a GPU rank: OpenMP's, for whatever host loops run.
extern "C" void device_set_threads(int n) { omp_set_num_threads(n); }

// ---------------------------------------------------------------- memory.h
// Copies go on the compute stream, so they come after the kernels queued
// before them, and wait for completion, so the host buffer can be reused (or
// read) as soon as the call returns, as with memcpy on the CPU. The wait is
// device_synchronize's: the compute stream may wait for communication
// (comm.c queues collectives stream-ordered), and a peer that died would
// leave a plain cudaStreamSynchronize waiting forever; device_synchronize
// polls for NCCL's errors under the watchdog.

extern "C" void mem_to_device(void* dst_device, const void* src_host, size_t bytes) {
    if (bytes == 0) return;
    CUDA_CHECK(cudaMemcpyAsync(dst_device, src_host, bytes, cudaMemcpyHostToDevice,
                               cuda_compute_stream));
    device_synchronize();
}

extern "C" void mem_to_host(void* dst_host, const void* src_device, size_t bytes) {
    if (bytes == 0) return;
    CUDA_CHECK(cudaMemcpyAsync(dst_host, src_device, bytes, cudaMemcpyDeviceToHost,
                               cuda_compute_stream));
    device_synchronize();
}

// Staging buffers (memory.h), page-locked. A copy from pinned memory is a
// DMA straight from the block; from pageable memory the driver first
// stages it into pinned memory of its own ("API synchronization behavior"
// in the CUDA Runtime API). With pinned memory cudaMemcpyAsync may return
// before the copy is done: the device_synchronize in mem_to_device and
// mem_to_host is what lets a caller reuse the buffer at once. Freed after
// a polled device_synchronize, as device_raw_free does: no queued work
// reads the block after it (every copy waits anyway), and cudaFreeHost
// cannot hang on a collective stuck on a dead peer.
extern "C" void* mem_alloc_host(size_t bytes) {
    if (!cuda_compute_stream)
        FATAL("mem_alloc_host(%zu bytes) before device_init: a pinned block would belong to GPU 0's context", bytes);
    void* p = NULL;
    CUDA_CHECK(cudaMallocHost(&p, bytes ? bytes : 1));
    return p;
}

extern "C" void mem_free_host(void* ptr) {
    if (!ptr) return;
    device_synchronize();
    CUDA_CHECK(cudaFreeHost(ptr));
}

// Queued like a kernel: later work on the stream sees zeros.
extern "C" void mem_zero(void* device_ptr, size_t bytes) {
    if (bytes == 0) return;
    CUDA_CHECK(cudaMemsetAsync(device_ptr, 0, bytes, cuda_compute_stream));
}

// Every rank calls this. Without a usable GPU every rank stops with one
// message (fail_if_any is collective over MPI_COMM_WORLD); else this rank
// takes GPU (local_rank mod count) of its node: one rank per GPU when mpirun
// starts as many ranks per node as the node has GPUs.
extern "C" const char* device_init(int local_rank) {
    static char name[512];
    char msg[512] = "";
    int count = 0;
    cudaError_t rc = cudaGetDeviceCount(&count);
    if (rc != cudaSuccess) {
        snprintf(msg, sizeof(msg),
                 "no CUDA GPU found (cudaGetDeviceCount: %s): this binary was built with "
                 "BACKEND=cuda; build with `make BACKEND=cpu` to run on the CPU",
                 cudaGetErrorString(rc));
        (void)cudaGetLastError();
    } else if (count == 0) {
        snprintf(msg, sizeof(msg),
                 "no CUDA GPU found (cudaGetDeviceCount: 0 devices): this binary was built with "
                 "BACKEND=cuda; build with `make BACKEND=cpu` to run on the CPU");
    }
    fail_if_any(rc != cudaSuccess || count == 0, msg);

    int dev = local_rank % count;
    CUDA_CHECK(cudaSetDevice(dev));
    CUDA_CHECK(cudaStreamCreateWithFlags(&cuda_compute_stream, cudaStreamNonBlocking));
    CUBLAS_CHECK(cublasCreate(&cuda_cublas));
    CUBLAS_CHECK(cublasSetStream(cuda_cublas, cuda_compute_stream));
    // full fp32 matmuls (no TF32), so the GPU trains the model the CPU trains
    CUBLAS_CHECK(cublasSetMathMode(cuda_cublas, CUBLAS_DEFAULT_MATH));
    cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
    snprintf(name, sizeof(name), "%s (GPU %d of %d on this node)", prop.name, dev, count);
    return name;
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

// Waits for everything queued on the compute stream (which includes waiting
// for the communication that comm_wait made it depend on).
extern "C" void device_synchronize(void) {
    if (cuda_compute_wait) cuda_compute_wait();
    else CUDA_CHECK(cudaStreamSynchronize(cuda_compute_stream));
}
