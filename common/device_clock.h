// device_clock.h: clocks of the device's work, for timings that mean the
// same on both backends: a clock that totals spans of queued work, and
// timestamps of points of a step (chapter 5's timeline). Implemented by the
// backend's device_clock.c (CPU: the host clock, since an op has finished
// when it returns) and device_clock.cu (CUDA: events on the compute stream).
#ifndef DEVICE_CLOCK_H
#define DEVICE_CLOCK_H

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
