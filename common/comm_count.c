// comm_count.c: calls, bytes and bus bytes per collective and axis, and the
// seconds spent waiting, for whichever backend runs the calls.
#include "comm_count.h"

#include <string.h>

static CommCount counts[NUM_COLLECTIVES][COMM_NUM_AXES];
static double wait_seconds = 0.0;
static double progress_seconds = 0.0;
// > 0 inside a hand-written collective (--comm hand): its sends, receives
// and waits are part of the one collective already counted, not calls of
// their own
static int quiet = 0;

const char* collective_name(Collective c) {
    static const char* names[NUM_COLLECTIVES] = {
        "allreduce", "reduce_scatter", "allgather", "broadcast", "reduce", "scatter",
        "gather", "alltoall", "send", "recv", "barrier"};
    return names[c];
}

const char* comm_axis_name(int axis) {
    return axis == COMM_WORLD_AXIS ? "world" : mesh_axis_name((MeshAxis)axis);
}

CommCount comm_count(Collective coll, int axis) { return counts[coll][axis]; }

void comm_counts_reset(void) {
    memset(counts, 0, sizeof(counts));
    wait_seconds = 0.0;
    progress_seconds = 0.0;
}

double comm_wait_seconds(void) { return wait_seconds; }
double comm_progress_seconds(void) { return progress_seconds; }

void comm_tally(const Comm* c, Collective coll, size_t bytes, double factor) {
    comm_tally_bytes(c, coll, (double)bytes, (double)bytes * factor);
}

void comm_tally_bytes(const Comm* c, Collective coll, double bytes, double bus_bytes) {
    if (quiet) return;
    CommCount* k = &counts[coll][c->axis];
    k->calls += 1;
    k->bytes += bytes;
    k->bus_bytes += bus_bytes;
}

double comm_ring_factor(const Comm* c) { return c->size > 1 ? (double)(c->size - 1) / c->size : 0.0; }

void comm_add_wait(double seconds) {
    if (!quiet) wait_seconds += seconds;
}
void comm_add_progress(double seconds) {
    if (!quiet) progress_seconds += seconds;
}
void comm_count_quiet(int on) { quiet += on ? 1 : -1; }
