// comm.h: the communication layer every chapter calls.
//
// One Comm per mesh axis and one for the world, and groups over several axes
// or over listed ranks (comm_create_group*). Buffers are device buffers of
// floats (host memory on the CPU backend). The CPU backend runs every call on
// MPI; the CUDA backend runs them on NCCL behind this same header.
//
// Every call is counted per collective and per counter slot: one slot per
// axis, one for the world, one per kind of group ("dp+cp", or the name given
// to a group of listed ranks). Counted are calls, bytes (the size of the data
// the call works on, per rank: nccl-tests' "size") and bus bytes (what a
// bandwidth-optimal algorithm makes each rank send: size times nccl-tests'
// bus factor, 2(n-1)/n for all-reduce, (n-1)/n for all-gather, reduce-scatter
// and all-to-all, 1 for broadcast, reduce, send). The counts go into the JSONL
// summary.
//
// Overlap. A non-blocking operation (comm_i*) moves while the rank computes:
// on NCCL the GPU runs it by itself; on MPI comm_progress, which the CPU ops
// call, drives it (MPI moves a non-blocking collective only inside MPI
// calls, and a chapter computing between start and wait makes none). See
// docs/design.md.
#ifndef COMM_H
#define COMM_H

#include <mpi.h>
#include <stddef.h>

#include "memory.h"  // DeviceClock
#include "mesh.h"
#include "device_clock.h"

// the world is counted as one more "axis" after the mesh's; groups over
// several axes or listed ranks get slots after that, up to COMM_MAX_SLOTS
#define COMM_WORLD_AXIS NUM_AXES
#define COMM_NUM_AXES (NUM_AXES + 1)
#define COMM_MAX_SLOTS (COMM_NUM_AXES + 40)  // every combination of axes (26) and some more

typedef struct {
    MPI_Comm mpi;    // MPI_COMM_NULL on a rank outside a group of listed ranks
    int axis;        // counter slot: AXIS_DP ... AXIS_EP, COMM_WORLD_AXIS, or a group's
    int size, rank;  // of this group, and this rank's index in it (size 0: not a member)
    unsigned axes;   // the mesh axes a group spans (1u << AXIS_DP | ...); 0 otherwise
    int owns_mpi;    // the group made mpi itself (comm_destroy_group frees it)
    void* backend;   // CUDA backend: this group's NCCL communicator and stream
} Comm;

typedef enum { COMM_SUM, COMM_AVG } CommOp;

typedef enum {
    COLL_ALLREDUCE, COLL_REDUCE_SCATTER, COLL_ALLGATHER, COLL_BROADCAST, COLL_REDUCE,
    COLL_SCATTER, COLL_GATHER, COLL_ALLTOALL, COLL_SEND, COLL_RECV, COLL_BARRIER,
    NUM_COLLECTIVES
} Collective;

// An operation in flight (non-blocking forms). comm_wait completes it.
typedef struct {
    MPI_Request mpi;
    int active;
    // for COMM_AVG the division happens on completion
    float* scale_buf;
    size_t scale_count;
    float scale;
    void* device_event;  // CUDA backend: the event recorded after the operation
    int* mpi_counts;     // CPU backend: comm_ialltoallv's int counts and displacements,
                         // which MPI reads until completion (freed then)
    const Comm* recv_comm;  // CPU backend: a comm_irecv's group and count,
    size_t recv_floats;     // checked against the message on completion
    int coll, axis;      // what it is, its bytes and when it started, for the trace (trace.h)
    double bytes, t_start;
} CommRequest;

// Who runs the collectives: the library (MPI on the CPU backend, NCCL on the
// CUDA one), or chapter 1's hand-written algorithms over send and receive
// (01_collectives/collectives.c: ring all-reduce, reduce-scatter and
// all-gather, binomial-tree broadcast and reduce, pairwise all-to-all),
// `--comm hand`. The counters count a hand collective as the library's
// (one call, the same bytes), not the messages inside it; its non-blocking
// forms run to completion at their start (nothing overlaps). Point-to-point
// calls and the barrier are the library's either way.
typedef enum { COMM_IMPL_LIBRARY, COMM_IMPL_HAND } CommImpl;
// Returns NULL, or a message when this program cannot run impl: hand on the
// CUDA backend, or hand in a program that does not link chapter 1's module.
const char* comm_set_impl(CommImpl impl);
const char* comm_impl_name(void);  // "library" or "hand"

// Chapter 1's algorithms as the comm layer calls them (collectives.h says
// what each does). The comm layer sits below the chapters and includes none
// of their headers: chapter 1's module fills this table and registers it
// when a program links it, which a chapter asks for by naming
// 01_collectives/collectives in its NN_name/modules file. The table is kept
// by pointer (it must outlive the run).
typedef struct {
    void (*reduce_scatter_ring)(const Comm* c, float* buf, size_t n, float* tmp);
    void (*allgather_ring)(const Comm* c, float* buf, const size_t* starts);
    void (*allreduce_ring)(const Comm* c, float* buf, size_t n, float* tmp);
    void (*broadcast_tree)(const Comm* c, float* buf, size_t n, int root);
    void (*reduce_tree)(const Comm* c, float* buf, size_t n, int root, float* tmp);
    void (*scatter)(const Comm* c, const float* send, float* recv, size_t n, int root);
    void (*gather)(const Comm* c, const float* send, float* recv, size_t n, int root);
    void (*alltoall_pairwise)(const Comm* c, const float* send, float* recv, size_t n);
    void (*alltoallv_pairwise)(const Comm* c, const float* send, const size_t* send_counts,
                               const size_t* send_displs, float* recv, const size_t* recv_counts,
                               const size_t* recv_displs);
} CommHandAlgorithms;
void comm_register_hand(const CommHandAlgorithms* algorithms);

// The world communicator and one per mesh axis (the mesh's own MPI groups).
// mesh and axes may be NULL: the world alone.
void comm_create(Comm* world, Comm axes[NUM_AXES], const Mesh* mesh);
void comm_destroy(Comm* world, Comm axes[NUM_AXES]);

// One group over several mesh axes: this rank and every rank that shares its
// coordinates on the axes outside `axes` (a set of bits 1u << AXIS_DP | 1u <<
// AXIS_CP). Group ranks follow world-rank order. The dp x cp group reduces
// gradients over every rank that holds the same parameters. A single axis
// gives that axis's group again (counted under its name); several are counted
// together in one slot named by the axes in enum order ("dp+cp"), whatever
// their sizes, so a chapter's log keys do not depend on the mesh.
// Collective over the world: every rank calls it with the same axes.
void comm_create_group(Comm* g, const Mesh* mesh, unsigned axes);
// A group of the listed world ranks, in list order (the first and last
// pipeline stages, which share the tied embedding), counted under `name`.
// Collective over the world, every rank with the same list; a rank not in it
// gets g->size == 0 and must not use g. A bad list (empty, a rank out of
// range or twice) ends every rank with one message.
void comm_create_group_ranks(Comm* g, const int* ranks, int n, const char* name);
// Frees what comm_create_group* made (not collective on the CPU; on NCCL it
// waits for the group's operations).
void comm_destroy_group(Comm* g);

// "allreduce", "reduce_scatter", ...: a collective's name in logs and traces.
static inline const char* collective_name(Collective c) {
    static const char* const names[NUM_COLLECTIVES] = {
        "allreduce", "reduce_scatter", "allgather", "broadcast", "reduce", "scatter",
        "gather", "alltoall", "send", "recv", "barrier"};
    return names[c];
}
// The name of a counter slot: "dp" ... "ep", "world", "dp+cp", a group's name.
const char* comm_axis_name(int axis);
// Counter slots in use (COMM_NUM_AXES plus one per kind of group created),
// the same on every rank since groups are created collectively.
int comm_num_slots(void);

// ---------------------------------------------------------------- blocking
// buf (count) on every rank becomes the sum (or mean) over the group. In place.
void comm_allreduce(const Comm* c, float* buf, size_t count, CommOp op);
// send (size * count): rank r receives the reduction of block r into recv (count).
void comm_reduce_scatter(const Comm* c, const float* send, float* recv, size_t count, CommOp op);
// send (count) from every rank, concatenated in rank order into recv (size * count).
// In place when send == recv + rank * count (this rank's block already sits there).
void comm_allgather(const Comm* c, const float* send, float* recv, size_t count);
// Uneven: rank r sends counts[r] floats, placed at recv + displs[r].
// Counted as COLL_ALLGATHER (no counter of its own).
void comm_allgatherv(const Comm* c, const float* send, float* recv, const size_t* counts,
                     const size_t* displs);
// buf (count) of root is copied to every rank.
void comm_broadcast(const Comm* c, float* buf, size_t count, int root);
// The reduction of send (count) over the group lands in recv (count) on root.
void comm_reduce(const Comm* c, const float* send, float* recv, size_t count, int root, CommOp op);
// root's send (size * count): block r goes to rank r's recv (count).
void comm_scatter(const Comm* c, const float* send, float* recv, size_t count, int root);
// every rank's send (count) lands at block r of root's recv (size * count).
void comm_gather(const Comm* c, const float* send, float* recv, size_t count, int root);
// block j (count) of rank i's send lands at block i of rank j's recv.
void comm_alltoall(const Comm* c, const float* send, float* recv, size_t count);
// Uneven all-to-all: rank i sends send_counts[j] floats from send + send_displs[j]
// to rank j, which receives recv_counts[i] floats at recv + recv_displs[i].
// Counted as COLL_ALLTOALL: bytes = what this rank sends, bus bytes = what
// leaves the rank (its block to itself excluded).
void comm_alltoallv(const Comm* c, const float* send, const size_t* send_counts,
                    const size_t* send_displs, float* recv, const size_t* recv_counts,
                    const size_t* recv_displs);
// A receive's count must be its send's, as NCCL requires: MPI would take
// a shorter message, the CPU backend ends the job naming both ranks.
void comm_send(const Comm* c, const float* buf, size_t count, int peer);
void comm_recv(const Comm* c, float* buf, size_t count, int peer);
// Sends to one peer while receiving from another (a ring step), without deadlock.
void comm_sendrecv(const Comm* c, const float* send, size_t send_count, int dest, float* recv,
                   size_t recv_count, int source);
// On the CUDA backend it also waits for every communication stream, so no
// rank may call it while a message it posted (comm_irecv, comm_isend) still
// waits for its peer: MPI's barrier would not wait for that message, this
// one would, for ever.
void comm_barrier(const Comm* c);

// ---------------------------------------------------------------- non-blocking
// Start the operation and return at once; the buffers must not be touched
// until comm_wait. Compute placed between start and wait overlaps with it.
// Every rank starts its collectives in the same order (NCCL requires it).
// Point-to-point on the CUDA backend: with a ring neighbour (rank +- 1) of
// the world, pp or cp group, comm_isend and comm_irecv go on a channel of
// their own and behave as on MPI (common/cuda/comm.c, docs/cuda.md), except
// that one whose channel still carries an earlier message is issued only at
// this rank's next comm_* call or polling wait (so (1) below holds there
// too), and that a later call may wait on the host for it to be issued.
// Elsewhere (other peers, other groups, an NCCL or CUDA too old for
// channels) they are held and queued together at this rank's next comm_*
// call. There (1) do not make a host MPI call between comm_isend/irecv and
// the next comm_* call if a peer may be waiting for that transfer, and (2) a
// peer's matching receive must not sit behind a collective that this rank
// starts after its isend: pair sends and receives before the next collective.
void comm_iallreduce(const Comm* c, float* buf, size_t count, CommOp op, CommRequest* req);
void comm_ireduce_scatter(const Comm* c, const float* send, float* recv, size_t count, CommOp op,
                          CommRequest* req);
void comm_iallgather(const Comm* c, const float* send, float* recv, size_t count, CommRequest* req);
void comm_ibroadcast(const Comm* c, float* buf, size_t count, int root, CommRequest* req);
// comm_alltoallv, non-blocking (the same counting). The four arrays may be
// reused once the call returns; the buffers only after comm_wait.
void comm_ialltoallv(const Comm* c, const float* send, const size_t* send_counts,
                     const size_t* send_displs, float* recv, const size_t* recv_counts,
                     const size_t* recv_displs, CommRequest* req);
void comm_isend(const Comm* c, const float* buf, size_t count, int peer, CommRequest* req);
void comm_irecv(const Comm* c, float* buf, size_t count, int peer, CommRequest* req);
// The most non-blocking operations one rank may have started and not yet
// completed: the CPU layer keeps them in a fixed table, which progress
// walks. A program that starts one per piece of a buffer and waits for
// them together bounds its pieces by this before it starts (chapter 2's
// --bucket-kb, refused alike by build/plan), never mid-step.
#define COMM_MAX_IN_FLIGHT 1024
// The smallest piece in KiB that cuts `bytes` into at most
// COMM_MAX_IN_FLIGHT pieces.
static inline size_t comm_min_piece_kb(size_t bytes) {
    size_t most = (size_t)1024 * COMM_MAX_IN_FLIGHT;  // the bytes of that many 1-KiB pieces
    return (bytes + most - 1) / most;
}
// Completes req (a no-op on a request that is not active): its result is
// in place for everything after. On CUDA, as every blocking call there, it
// orders later device work after the operation and returns without waiting.
void comm_wait(CommRequest* req);
// Non-zero when req has completed (req stays to be waited on).
int comm_test(CommRequest* req);
// Progress. Drives the non-blocking operations in flight: on MPI it asks
// MPI about each (MPI_Request_get_status runs MPI's progress engine and
// neither completes nor frees the request); nothing in flight, nothing done.
// The CPU ops call it at their start (matmul, attention: common/cpu/ops_*.c),
// so the compute a chapter places between start and wait moves the bytes
// without a line of its own, in every chapter. Results are the same with it
// or without (COMM_PROGRESS=0 turns it off): it only moves bytes sooner. Its
// seconds count as comm_progress_seconds. On NCCL it is a no-op: the GPU and
// NCCL's proxy progress their operations by themselves.
void comm_progress(void);
// 1 when comm_progress drives MPI operations (CPU backend, COMM_PROGRESS not 0).
int comm_progress_on(void);

// ---------------------------------------------------------------- counters
typedef struct {
    double calls, bytes, bus_bytes;
} CommCount;
CommCount comm_count(Collective coll, int axis);
void comm_counts_reset(void);
// Seconds spent inside blocking calls and comm_wait: time a rank waited on
// communication that compute did not hide. On CUDA those calls return at
// once and the compute stream waits (stream-ordered): the seconds are that
// wait, timed on the GPU, and reading them waits for the GPU, so read them
// between steps (docs/cuda.md).
double comm_wait_seconds(void);
// A chapter's share of comm_wait_seconds (the ring's waits, FSDP's gathers):
// between comm_wait_clock_begin(clock) and comm_wait_clock_end(clock), every
// wait the comm layer counts is counted in clock too (a DeviceClock,
// memory.h), read at the step's end. Reading comm_wait_seconds around each
// wait instead would, on CUDA, wait for the GPU there (the waits are timed
// on the GPU: docs/cuda.md). At most COMM_WAIT_CLOCKS clocks at once.
#define COMM_WAIT_CLOCKS 4
void comm_wait_clock_begin(DeviceClock* clock);
void comm_wait_clock_end(DeviceClock* clock);
// Seconds spent inside the non-blocking starts, comm_test and comm_progress:
// the host's own work on communication that is in flight (on MPI the
// library copies and reduces there; on NCCL it is only queueing). Not
// waiting, not computing.
double comm_progress_seconds(void);

#endif
