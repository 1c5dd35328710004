// comm_stats.c: calls, bytes and bus bytes per collective and counter slot,
// and the seconds spent waiting, for whichever backend runs the calls
// (comm_stats.h).
#include "comm_stats.h"

#include <string.h>

#include "comm_trace.h"
#include "errors.h"
#include "device_clock.h"

static CommCount counts[NUM_COLLECTIVES][COMM_MAX_SLOTS];
static double wait_seconds = 0.0;
static double progress_seconds = 0.0;
static double (*device_waits)(void) = NULL;  // comm_stats_device_waits
// the clocks between comm_wait_clock_begin and _end
static DeviceClock* wait_clocks[COMM_WAIT_CLOCKS];
static int num_wait_clocks = 0;
// > 0 inside a hand-written collective (--comm hand): its sends, receives
// and waits are part of the one collective already counted, not calls of
// their own
static int quiet = 0;
// collectives run by chapter 1's hand-written code since the last reset
static long hand_collectives = 0;

CommCount comm_count(Collective coll, int axis) { return counts[coll][axis]; }

void comm_counts_reset(void) {
    if (device_waits) (void)device_waits();  // the waits so far, dropped with the rest
    memset(counts, 0, sizeof(counts));
    wait_seconds = 0.0;
    progress_seconds = 0.0;
    hand_collectives = 0;
}

void comm_stats_device_waits(double (*read)(void)) { device_waits = read; }

double comm_wait_seconds(void) {
    if (device_waits) wait_seconds += device_waits();
    return wait_seconds;
}
double comm_progress_seconds(void) { return progress_seconds; }

void comm_tally(const Comm* c, Collective coll, size_t bytes, double factor) {
    comm_tally_bytes(c, coll, (double)bytes, (double)bytes * factor);
}

void comm_tally_bytes(const Comm* c, Collective coll, double bytes, double bus_bytes) {
    if (quiet) return;  // inside a hand collective: counted once, as a whole
    comm_trace_operation(coll, c->axis, bytes);
    comm_tally_calls(c, coll, 1.0, bytes, bus_bytes);
}

void comm_tally_calls(const Comm* c, Collective coll, double calls, double bytes, double bus_bytes) {
    if (quiet || calls <= 0) return;
    CommCount* k = &counts[coll][c->axis];
    k->calls += calls;
    k->bytes += calls * bytes;
    k->bus_bytes += calls * bus_bytes;
}

double comm_ring_factor(const Comm* c) { return c->size > 1 ? (double)(c->size - 1) / c->size : 0.0; }

void comm_add_wait(double seconds) {
    if (quiet) return;
    wait_seconds += seconds;
    // a DeviceClock's total (on the CPU the host clock's spans add up there)
    for (int i = 0; i < num_wait_clocks; i++) wait_clocks[i]->seconds += seconds;
    comm_trace_wait(seconds);
}

void comm_add_progress(double seconds) {
    if (quiet) return;
    progress_seconds += seconds;
    comm_trace_progress(seconds);
}

void comm_wait_clock_begin(DeviceClock* clock) {
    CHECK(num_wait_clocks < COMM_WAIT_CLOCKS, "more than %d comm wait clocks at once", COMM_WAIT_CLOCKS);
    wait_clocks[num_wait_clocks++] = clock;
}

void comm_wait_clock_end(DeviceClock* clock) {
    for (int i = 0; i < num_wait_clocks; i++)
        if (wait_clocks[i] == clock) {
            wait_clocks[i] = wait_clocks[--num_wait_clocks];
            return;
        }
}

void comm_wait_clocks_each(void (*fn)(DeviceClock*)) {
    for (int i = 0; i < num_wait_clocks; i++) fn(wait_clocks[i]);
}

void comm_count_quiet(int on) {
    if (on && quiet == 0) hand_collectives++;  // the outermost hand collective
    quiet += on ? 1 : -1;
}

long comm_hand_collectives(void) { return hand_collectives; }
