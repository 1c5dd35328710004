// comm_stats.h: the counters both communication backends keep (comm.h's
// comm_count, comm_wait_seconds and comm_progress_seconds read them out).
// Only common/cpu/comm.c and common/cuda/comm.c count; the summary reads
// comm_hand_collectives.
#ifndef COMM_STATS_H
#define COMM_STATS_H

#include <stddef.h>

#include "comm.h"
#include "device_clock.h"

// Counts one call on c's axis: bytes is the size it works on per rank
// (nccl-tests' "size"), factor nccl-tests' bus factor for it.
void comm_tally(const Comm* c, Collective coll, size_t bytes, double factor);
// Counts bytes sent and bus bytes separately (all-to-all-v: what leaves the rank).
void comm_tally_bytes(const Comm* c, Collective coll, double bytes, double bus_bytes);
// Counts `calls` identical calls at once, each of bytes and bus bytes
// (not traced): the planner's equal buckets (tools/plan/plan_dense.c),
// whose number grows with the model where one by one would take minutes.
void comm_tally_calls(const Comm* c, Collective coll, double calls, double bytes, double bus_bytes);
// (p - 1) / p for a group of p ranks, 0 for one rank.
double comm_ring_factor(const Comm* c);
// Adds seconds spent blocked in communication (and, with --trace, a wait
// span of exactly that length, ending now, named after the last comm_tally
// or comm_request_current: comm_trace.h).
void comm_add_wait(double seconds);
// The CUDA backend's waits are the compute stream's, timed on the GPU: it
// registers here a function returning the seconds waited since its last
// call (NULL: none), which comm_wait_seconds adds before it answers and
// comm_counts_reset drops. The CPU backend never calls this.
void comm_stats_device_waits(double (*read)(void));
// Runs fn (device_clock_start or device_clock_stop) on every clock attached
// by comm_wait_clock_begin: the CUDA backend's wait spans go into them too.
// (The CPU's waits reach them through comm_add_wait.)
void comm_wait_clocks_each(void (*fn)(DeviceClock*));
// Adds seconds spent inside a non-blocking start or comm_test (a comm span).
void comm_add_progress(double seconds);
// on = 1 while a collective made of other comm_* calls runs (--comm hand),
// 0 after it: the calls inside it are not counted, nor their seconds.
void comm_count_quiet(int on);
// How many collectives chapter 1's hand-written code ran on this rank since
// comm_counts_reset (0 under --comm library): the summary's
// "hand_collectives", so a test can tell that --comm hand took effect.
long comm_hand_collectives(void);

#endif
