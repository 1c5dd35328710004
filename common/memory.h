// memory.h: allocation. Device memory (host memory on the CPU backend)
// through the tracking allocator, and host memory for bookkeeping.
//
// Every device allocation of every chapter goes through mem_alloc with a
// category, so that each rank can report its peak bytes per category and the
// docs' memory formulas can be checked against what was really allocated.
#ifndef MEMORY_H
#define MEMORY_H

#include <stddef.h>

typedef enum {
    MEM_PARAMS,
    MEM_GRADS,
    MEM_OPTIMIZER,
    MEM_ACTIVATIONS,
    MEM_COMM,
    MEM_OTHER,
    MEM_NUM_CATEGORIES
} MemCategory;

// "params", "grads", "optimizer", "activations", "comm", "other"
const char* mem_category_name(MemCategory c);

// Device memory, zero-filled. Aborts with a message if the device is full.
void* mem_alloc(size_t bytes, MemCategory category);
float* mem_alloc_floats(size_t count, MemCategory category);
void mem_free(void* ptr);

// Bytes allocated now and at peak, per category and in total.
size_t mem_current(MemCategory c);
size_t mem_peak(MemCategory c);
size_t mem_peak_total(void);
void mem_reset_peaks(void);

// Copies between host memory and device memory, and zeroing on the device.
void mem_to_device(void* dst_device, const void* src_host, size_t bytes);
void mem_to_host(void* dst_host, const void* src_device, size_t bytes);
void mem_zero(void* device_ptr, size_t bytes);

// malloc and calloc for host-side bookkeeping (not device memory), ending
// every rank with a message when the host is out of memory.
void* xmalloc(size_t bytes);
void* xcalloc(size_t count, size_t size);

// Host staging buffers: host memory that mem_to_device or mem_to_host copies
// to or from the device EVERY step (the batch's tokens, the per-token losses,
// the norm's scalar, chapter 7's routing plan), allocated once and reused.
// On CUDA they are page-locked (cudaMallocHost). The CUDA Runtime API's
// cudaMallocHost: the driver tracks such ranges and accelerates cudaMemcpy*
// on them, "much higher bandwidth than pageable memory obtained with
// functions such as malloc()"; its "API synchronization behavior" page: a
// copy from pageable memory is first staged by the driver into pinned
// memory (and may synchronize with the stream to do it). The cudaMallocHost
// page also warns that "allocating excessive amounts" of it "may degrade
// system performance, since it reduces the amount of memory available to
// the system for paging", and advises it sparingly, for staging areas: so
// large one-off buffers (a checkpoint's or a model file's parameters, their
// initialization) stay plain xmalloc. Not counted by mem_current / mem_peak
// (host memory, like xmalloc's). On the CPU backend: malloc and free. On
// CUDA, refused (FATAL) before device_init: cudaMallocHost would start a
// CUDA context on GPU 0 of every rank, and the block would count as pinned
// for that context only (cudaHostAlloc's cudaHostAllocPortable flag is what
// makes a block pinned for all). mem_free_host(NULL) does nothing.
void* mem_alloc_host(size_t bytes);
void mem_free_host(void* ptr);

// Picks and prepares this rank's device (the GPU of its node-local rank on
// CUDA; nothing on the CPU). Returns a printable name.
const char* device_init(int local_rank);
// Waits for all work queued on the device (a no-op on the CPU).
void device_synchronize(void);

// A clock of the device's work, for timings that mean the same on both
// backends. device_clock_start and device_clock_stop bracket work queued on
// the device (a span); device_clock_seconds is the total of the spans since
// the last reset, once that work is done. On the CPU an op has finished when
// it returns, so these are the host clock around the calls. On CUDA the host
// only queues the work: a span is two events on the compute stream, and
// device_clock_seconds waits for the last one, adds the spans' times to the
// total and frees their events for the next spans. Read it once per step,
// after the step (between the spans it would drain the queue): a step's
// spans, any number, reuse the events of the step before. A host clock
// around queued kernels reads about 0 on a GPU. Spans of one clock do not
// nest or overlap: two overlapping spans take two clocks. A span may be
// open when the clock is read (it counts once stopped), and a start with no
// stop is dropped by the next start. A clock left unread for
// DEVICE_CLOCK_UNREAD spans reads itself at the next start (on CUDA a wait
// for the device), so its events stay bounded.
#define DEVICE_CLOCK_UNREAD 4096
typedef struct {
    double seconds, t0;  // the total of the spans read so far; the CPU's open span's start
    void** ev;           // CUDA: each unread span's start and stop events (made at first use, kept)
    int n, cap;          // CUDA: spans recorded and not yet read; spans ev has room for
    int open;            // a span started and not stopped (on CUDA its start is ev[2n])
} DeviceClock;
void device_clock_start(DeviceClock* c);
void device_clock_stop(DeviceClock* c);
double device_clock_seconds(DeviceClock* c);
void device_clock_reset(DeviceClock* c);  // the total to 0 (a zeroed DeviceClock is reset)
void device_clock_free(DeviceClock* c);   // its events (then it is zeroed, ready for use again)

// Timestamps of device work, for timelines (chapter 5's actions): when the
// device reached each of n points of a step, on the host clock (now_seconds's,
// runtime.h), without waiting for the device at each point. A step is
// device_stamps_begin(s, n), device_stamp(s, i) for each point i in
// [0, n), in any order, then device_stamps_read once the step's work is
// done. On the CPU a stamp is the host clock at the call (an op has finished
// when it returns). On CUDA the host only queues the work: begin waits for
// the device once (device_synchronize), reads the host clock (the anchor)
// and records a first event on the compute stream; a stamp records event i
// there (it completes when the stream reaches it: after the work queued
// before it, and after any wait for communication the stream holds at that
// point); read waits for the device and gives stamp i as the anchor plus
// cudaEventElapsedTime(first, event i). A stamp taken again in the same step
// replaces the one before. Refused (FATAL): a stamp out of [0, n), a stamp
// or read without a begin, a read of a stamp not taken since the begin.
// Events are made at first use and kept for the next steps (n of them at
// most: the largest n of any begin).
typedef struct {
    double anchor;        // the host clock at the step's begin (CUDA: the first event's time)
    double* t;            // CPU: stamp i's host time
    void** ev;            // CUDA: the first event, then stamp i's at ev[1 + i]
    unsigned char* done;  // stamp i taken since the begin
    int n, cap;           // this step's stamps; stamps there is room for
    int begun;            // a begin was called (and the object not freed since)
} DeviceStamps;
void device_stamps_begin(DeviceStamps* s, int n);
void device_stamp(DeviceStamps* s, int i);
void device_stamps_read(DeviceStamps* s, double* out);  // out: (n,), once the step's work is queued
void device_stamps_free(DeviceStamps* s);               // its events (then zeroed, ready for use again)

#endif
