// comm_count.c: calls, bytes and bus bytes per collective and axis, and the
// seconds spent waiting, for whichever backend runs the calls.
#include "comm_count.h"

#include <stdio.h>
#include <string.h>

#include "errors.h"
#include "rank.h"
#include "runtime.h"
#include "trace.h"

static CommCount counts[NUM_COLLECTIVES][COMM_MAX_SLOTS];
// the slots after the axes' and the world's: one per kind of group
#define SLOT_NAME_LEN 48
static char group_slot_names[COMM_MAX_SLOTS - COMM_NUM_AXES][SLOT_NAME_LEN];
static int num_group_slots = 0;
static double wait_seconds = 0.0;
static double progress_seconds = 0.0;
// > 0 inside a hand-written collective (--comm hand): its sends, receives
// and waits are part of the one collective already counted, not calls of
// their own
static int quiet = 0;
// collectives run by chapter 1's hand-written code since the last reset
static long hand_collectives = 0;

const char* collective_name(Collective c) {
    static const char* names[NUM_COLLECTIVES] = {
        "allreduce", "reduce_scatter", "allgather", "broadcast", "reduce", "scatter",
        "gather", "alltoall", "send", "recv", "barrier"};
    return names[c];
}

const char* comm_axis_name(int axis) {
    if (axis >= COMM_NUM_AXES) return group_slot_names[axis - COMM_NUM_AXES];
    return axis == COMM_WORLD_AXIS ? "world" : mesh_axis_name((MeshAxis)axis);
}

int comm_num_slots(void) { return COMM_NUM_AXES + num_group_slots; }

int comm_slot_for(const char* name) {
    for (int a = 0; a < comm_num_slots(); a++)
        if (strcmp(comm_axis_name(a), name) == 0) return a;
    CHECK(num_group_slots < COMM_MAX_SLOTS - COMM_NUM_AXES,
          "more than %d kinds of communication group: raise COMM_MAX_SLOTS in comm.h",
          COMM_MAX_SLOTS - COMM_NUM_AXES);
    CHECK(strlen(name) < SLOT_NAME_LEN, "group name '%s' is longer than %d characters", name, SLOT_NAME_LEN - 1);
    strcpy(group_slot_names[num_group_slots], name);
    return COMM_NUM_AXES + num_group_slots++;
}

void comm_group_slot_name(const Mesh* mesh, unsigned axes, char* out, size_t len) {
    (void)mesh;
    size_t used = 0;
    out[0] = '\0';
    for (int a = 0; a < NUM_AXES; a++)
        if (axes & (1u << a))
            used += snprintf(out + used, used < len ? len - used : 0, "%s%s", used ? "+" : "",
                             mesh_axis_name((MeshAxis)a));
}

int comm_group_color(const Mesh* mesh, unsigned axes) {
    // the group's member with coordinate 0 on every grouped axis names it
    int base[NUM_AXES];
    for (int a = 0; a < NUM_AXES; a++) base[a] = (axes & (1u << a)) ? 0 : mesh->coord[a];
    return mesh_rank_at(mesh, base);
}

const char* comm_check_rank_list(const int* ranks, int n, int world_size, char* msg, size_t len) {
    if (n < 1 || !ranks) {
        snprintf(msg, len, "comm_create_group_ranks: the list of ranks is empty");
        return msg;
    }
    for (int i = 0; i < n; i++) {
        if (ranks[i] < 0 || ranks[i] >= world_size) {
            snprintf(msg, len, "comm_create_group_ranks: rank %d is not in a world of %d ranks", ranks[i], world_size);
            return msg;
        }
        for (int j = 0; j < i; j++)
            if (ranks[j] == ranks[i]) {
                snprintf(msg, len, "comm_create_group_ranks: rank %d is listed twice", ranks[i]);
                return msg;
            }
    }
    return NULL;
}

CommCount comm_count(Collective coll, int axis) { return counts[coll][axis]; }

void comm_counts_reset(void) {
    memset(counts, 0, sizeof(counts));
    wait_seconds = 0.0;
    progress_seconds = 0.0;
    hand_collectives = 0;
}

double comm_wait_seconds(void) { return wait_seconds; }
double comm_progress_seconds(void) { return progress_seconds; }

void comm_tally(const Comm* c, Collective coll, size_t bytes, double factor) {
    comm_tally_bytes(c, coll, (double)bytes, (double)bytes * factor);
}

// The operation the next wait or progress seconds belong to, for the
// trace's span names: a blocking call, a non-blocking start, or a wait or
// test on a request (per thread: a progress thread has its own).
typedef enum { PHASE_BLOCKING, PHASE_START, PHASE_REQUEST, PHASE_PROGRESS } Phase;
static _Thread_local int cur_coll = 0, cur_axis = 0;
static _Thread_local Phase cur_phase = PHASE_BLOCKING;

void comm_tally_bytes(const Comm* c, Collective coll, double bytes, double bus_bytes) {
    if (quiet) return;  // inside a hand collective: counted once, as a whole
    cur_coll = coll;
    cur_axis = c->axis;
    cur_phase = PHASE_BLOCKING;
    CommCount* k = &counts[coll][c->axis];
    k->calls += 1;
    k->bytes += bytes;
    k->bus_bytes += bus_bytes;
}

double comm_ring_factor(const Comm* c) { return c->size > 1 ? (double)(c->size - 1) / c->size : 0.0; }

// A span of exactly `seconds` ending now (a clock read just after the
// caller's), so the trace's spans add up to the counters.
static void trace_comm(TraceKind kind, double seconds, const char* what) {
    if (!trace_enabled()) return;
    double t1 = now_seconds();
    char name[48];
    snprintf(name, sizeof(name), "%s%s (%s)", what, collective_name((Collective)cur_coll), comm_axis_name(cur_axis));
    trace_span(kind, t1 - seconds, t1, 0, -1, 0, name);
}

void comm_add_wait(double seconds) {
    if (quiet) return;
    wait_seconds += seconds;
    trace_comm(TRACE_WAIT, seconds, cur_phase == PHASE_REQUEST ? "wait " : "");
}

void comm_add_progress(double seconds) {
    if (quiet) return;
    progress_seconds += seconds;
    if (cur_phase == PHASE_PROGRESS) {
        // polling every operation in flight from inside an op: no one name
        cur_phase = PHASE_BLOCKING;
        if (trace_enabled()) {
            double t1 = now_seconds();
            trace_span(TRACE_COMM, t1 - seconds, t1, 0, -1, 0, "progress");
        }
        return;
    }
    trace_comm(TRACE_COMM, seconds, cur_phase == PHASE_START ? "start " : "test ");
}

void comm_note_progress(void) { cur_phase = PHASE_PROGRESS; }

void comm_request_started(CommRequest* req) {
    req->coll = cur_coll;
    req->axis = cur_axis;
    req->t_start = trace_start();
    cur_phase = PHASE_START;
}

void comm_request_current(const CommRequest* req) {
    cur_coll = req->coll;
    cur_axis = req->axis;
    cur_phase = PHASE_REQUEST;
}

void comm_request_done(const CommRequest* req) {
    if (!trace_enabled()) return;
    char name[48];
    snprintf(name, sizeof(name), "%s (%s)", collective_name((Collective)req->coll), comm_axis_name(req->axis));
    trace_span(TRACE_INFLIGHT, req->t_start, now_seconds(), 1, -1, 0, name);
}

void comm_count_quiet(int on) {
    if (on && quiet == 0) hand_collectives++;  // the outermost hand collective
    quiet += on ? 1 : -1;
}

long comm_hand_collectives(void) { return hand_collectives; }

MPI_Comm comm_group_split_axes(const Mesh* mesh, unsigned axes, int* slot) {
    CHECK(axes != 0 && axes < (1u << NUM_AXES), "comm_create_group: 0x%x is not a set of mesh axes", axes);
    char name[64];
    comm_group_slot_name(mesh, axes, name, sizeof(name));
    *slot = comm_slot_for(name);
    MPI_Comm mpi;
    // key: the world rank, so group ranks follow the mesh's rank order
    MPI_CHECK(MPI_Comm_split(MPI_COMM_WORLD, comm_group_color(mesh, axes), mesh->rank, &mpi));
    return mpi;
}

MPI_Comm comm_group_split_ranks(const int* ranks, int n, const char* name, int* slot) {
    int world_size = 1, me = world_rank();
    MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &world_size));
    char msg[256];
    const char* bad = comm_check_rank_list(ranks, n, world_size, msg, sizeof(msg));
    if (bad) fail_all("%s", bad);  // the same list, so the same verdict, on every rank
    int index = -1;
    for (int i = 0; i < n; i++)
        if (ranks[i] == me) index = i;
    MPI_Comm mpi;
    MPI_CHECK(MPI_Comm_split(MPI_COMM_WORLD, index >= 0 ? 0 : MPI_UNDEFINED, index, &mpi));
    *slot = comm_slot_for(name);
    return mpi;
}
