// comm.c: the communication layer on MPI (the CPU backend). See comm.h.
#include "comm.h"
#include "comm_groups.h"
#include "comm_stats.h"
#include "comm_trace.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "errors.h"
#include "ops.h"
#include "memory.h"
#include "runtime.h"
#include "watchdog.h"

// ---------------------------------------------------------------- --comm hand
// With COMM_IMPL_HAND the collectives below call chapter 1's algorithms
// (01_collectives/collectives.c, registered through comm_register_hand)
// instead of MPI's. Their messages use a tag of their own, so they never
// match a point-to-point message of the caller's in flight on the same
// communicator.
#define TAG_USER 0
#define TAG_HAND 1
static CommImpl impl = COMM_IMPL_LIBRARY;
static int p2p_tag = TAG_USER;
static const CommHandAlgorithms* algo = NULL;  // NULL: chapter 1's module is not linked

void comm_register_hand(const CommHandAlgorithms* algorithms) { algo = algorithms; }

const char* comm_set_impl(CommImpl which) {
    if (which == COMM_IMPL_HAND && !algo)
        return "--comm hand runs chapter 1's hand-written collectives, which this program does not link "
               "(its NN_name/modules file does not name 01_collectives/collectives)";
    impl = which;
    return NULL;
}
const char* comm_impl_name(void) { return impl == COMM_IMPL_HAND ? "hand" : "library"; }

static int hand(void) { return impl == COMM_IMPL_HAND; }
// Around every hand collective: its inner calls are not counted on their own.
static void hand_begin(void) {
    comm_count_quiet(1);
    p2p_tag = TAG_HAND;
}
static void hand_end(void) {
    p2p_tag = TAG_USER;
    comm_count_quiet(0);
}

static void hand_allreduce(const Comm* c, float* buf, size_t n) {
    hand_begin();
    float* tmp = mem_alloc_floats(n / (size_t)c->size + 1, MEM_COMM);  // one chunk
    algo->allreduce_ring(c, buf, n, tmp);
    mem_free(tmp);
    hand_end();
}

// send (p * n) -> recv (n): the ring works in place on a copy; chunk r of
// p * n floats is exactly [r * n, (r + 1) * n).
static void hand_reduce_scatter(const Comm* c, const float* send, float* recv, size_t n) {
    hand_begin();
    size_t total = n * (size_t)c->size;
    float* work = mem_alloc_floats(total ? total : 1, MEM_COMM);
    float* tmp = mem_alloc_floats(n + 1, MEM_COMM);
    ops_copy(work, send, total);
    algo->reduce_scatter_ring(c, work, total, tmp);
    ops_copy(recv, work + (size_t)c->rank * n, n);
    mem_free(work);
    mem_free(tmp);
    hand_end();
}

// counts/displs may leave gaps or reorder blocks: pack, ring, unpack.
static void hand_allgatherv(const Comm* c, const float* send, float* recv, const size_t* counts,
                            const size_t* displs) {
    hand_begin();
    int p = c->size;
    size_t* starts = xmalloc(sizeof(size_t) * (p + 1));
    starts[0] = 0;
    for (int i = 0; i < p; i++) starts[i + 1] = starts[i] + counts[i];
    float* work = mem_alloc_floats(starts[p] ? starts[p] : 1, MEM_COMM);
    ops_copy(work + starts[c->rank], send, counts[c->rank]);
    algo->allgather_ring(c, work, starts);
    for (int i = 0; i < p; i++) ops_copy(recv + displs[i], work + starts[i], counts[i]);
    mem_free(work);
    free(starts);
    hand_end();
}

static void hand_allgather(const Comm* c, const float* send, float* recv, size_t n) {
    int p = c->size;
    size_t* counts = xmalloc(sizeof(size_t) * 2 * p);
    for (int i = 0; i < p; i++) counts[i] = n, counts[p + i] = (size_t)i * n;
    hand_allgatherv(c, send, recv, counts, counts + p);
    free(counts);
}

static void hand_reduce(const Comm* c, const float* send, float* recv, size_t n, int root) {
    hand_begin();
    float* work = mem_alloc_floats(n ? n : 1, MEM_COMM);
    float* tmp = mem_alloc_floats(n ? n : 1, MEM_COMM);
    ops_copy(work, send, n);
    algo->reduce_tree(c, work, n, root, tmp);
    if (c->rank == root) ops_copy(recv, work, n);
    mem_free(work);
    mem_free(tmp);
    hand_end();
}


static int as_int(size_t n) {
    CHECK(n <= INT_MAX, "a message of %zu floats is too large for one MPI call", n);
    return (int)n;
}

static void make_comm(Comm* c, MPI_Comm mpi, int axis) {
    memset(c, 0, sizeof(*c));
    c->mpi = mpi;
    c->axis = axis;
    MPI_CHECK(MPI_Comm_size(mpi, &c->size));
    MPI_CHECK(MPI_Comm_rank(mpi, &c->rank));
}


void comm_create(Comm* world, Comm axes[NUM_AXES], const Mesh* mesh) {
    make_comm(world, MPI_COMM_WORLD, COMM_WORLD_AXIS);
    if (!mesh || !axes) return;
    for (int a = 0; a < NUM_AXES; a++) make_comm(&axes[a], mesh->axis_comm[a], a);
}

void comm_destroy(Comm* world, Comm axes[NUM_AXES]) {
    // the MPI communicators belong to the mesh, which frees them
    memset(world, 0, sizeof(*world));
    if (axes) for (int a = 0; a < NUM_AXES; a++) memset(&axes[a], 0, sizeof(Comm));
}

void comm_create_group(Comm* g, const Mesh* mesh, unsigned axes) {
    int slot;
    MPI_Comm mpi = comm_group_split_axes(mesh, axes, &slot);
    make_comm(g, mpi, slot);
    g->axes = axes;
    g->owns_mpi = 1;
}

void comm_create_group_ranks(Comm* g, const int* ranks, int n, const char* name) {
    int slot;
    MPI_Comm mpi = comm_group_split_ranks(ranks, n, name, &slot);
    if (mpi == MPI_COMM_NULL) {  // not a member
        memset(g, 0, sizeof(*g));
        g->mpi = MPI_COMM_NULL;
        g->axis = slot;
        g->rank = -1;
        return;
    }
    make_comm(g, mpi, slot);
    g->owns_mpi = 1;
}

void comm_destroy_group(Comm* g) {
    if (g->owns_mpi && g->mpi != MPI_COMM_NULL) MPI_CHECK(MPI_Comm_free(&g->mpi));
    memset(g, 0, sizeof(*g));
    g->mpi = MPI_COMM_NULL;
}

static void scale_for_avg(const Comm* c, float* buf, size_t n, CommOp op) {
    if (op == COMM_AVG && c->size > 1) ops_scale(buf, n, 1.0f / (float)c->size);
}

// ---------------------------------------------------------------- blocking

// Every blocking call is a wait on other ranks: its time is counted (the
// step's comm wait) and the watchdog watches it (watchdog.h), named by the
// collective, the group and, for a message, the peer.
static double wait_begin(const Comm* c, Collective what, int peer) {
    watchdog_enter(collective_name(what), comm_axis_name(c->axis), peer);
    return now_seconds();
}

static void wait_end(double t0) {
    comm_add_wait(now_seconds() - t0);
    watchdog_leave();
}

void comm_allreduce(const Comm* c, float* buf, size_t n, CommOp op) {
    comm_tally(c, COLL_ALLREDUCE, n * sizeof(float), 2.0 * comm_ring_factor(c));
    double t0 = wait_begin(c, COLL_ALLREDUCE, -1);
    if (hand()) hand_allreduce(c, buf, n);
    else MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, buf, as_int(n), MPI_FLOAT, MPI_SUM, c->mpi));
    wait_end(t0);
    scale_for_avg(c, buf, n, op);
}

void comm_reduce_scatter(const Comm* c, const float* send, float* recv, size_t n, CommOp op) {
    comm_tally(c, COLL_REDUCE_SCATTER, n * c->size * sizeof(float), comm_ring_factor(c));
    double t0 = wait_begin(c, COLL_REDUCE_SCATTER, -1);
    if (hand()) hand_reduce_scatter(c, send, recv, n);
    else MPI_CHECK(MPI_Reduce_scatter_block(send, recv, as_int(n), MPI_FLOAT, MPI_SUM, c->mpi));
    wait_end(t0);
    scale_for_avg(c, recv, n, op);
}

void comm_allgather(const Comm* c, const float* send, float* recv, size_t n) {
    comm_tally(c, COLL_ALLGATHER, n * c->size * sizeof(float), comm_ring_factor(c));
    double t0 = wait_begin(c, COLL_ALLGATHER, -1);
    const void* src = send == recv + (size_t)c->rank * n ? MPI_IN_PLACE : (const void*)send;
    if (hand()) hand_allgather(c, send, recv, n);
    else MPI_CHECK(MPI_Allgather(src, as_int(n), MPI_FLOAT, recv, as_int(n), MPI_FLOAT, c->mpi));
    wait_end(t0);
}

void comm_allgatherv(const Comm* c, const float* send, float* recv, const size_t* counts_in,
                     const size_t* displs_in) {
    int* cnt = xmalloc(sizeof(int) * c->size);
    int* dsp = xmalloc(sizeof(int) * c->size);
    size_t total = 0;
    for (int r = 0; r < c->size; r++) {
        cnt[r] = as_int(counts_in[r]);
        dsp[r] = as_int(displs_in[r]);
        total += counts_in[r];
    }
    comm_tally(c, COLL_ALLGATHER, total * sizeof(float), comm_ring_factor(c));
    double t0 = wait_begin(c, COLL_ALLGATHER, -1);
    if (hand()) hand_allgatherv(c, send, recv, counts_in, displs_in);
    else MPI_CHECK(MPI_Allgatherv(send, cnt[c->rank], MPI_FLOAT, recv, cnt, dsp, MPI_FLOAT, c->mpi));
    wait_end(t0);
    free(cnt);
    free(dsp);
}

void comm_broadcast(const Comm* c, float* buf, size_t n, int root) {
    comm_tally(c, COLL_BROADCAST, n * sizeof(float), c->size > 1 ? 1.0 : 0.0);
    double t0 = wait_begin(c, COLL_BROADCAST, -1);
    if (hand()) {
        hand_begin();
        algo->broadcast_tree(c, buf, n, root);
        hand_end();
    } else {
        MPI_CHECK(MPI_Bcast(buf, as_int(n), MPI_FLOAT, root, c->mpi));
    }
    wait_end(t0);
}

void comm_reduce(const Comm* c, const float* send, float* recv, size_t n, int root, CommOp op) {
    comm_tally(c, COLL_REDUCE, n * sizeof(float), c->size > 1 ? 1.0 : 0.0);
    double t0 = wait_begin(c, COLL_REDUCE, -1);
    if (hand()) hand_reduce(c, send, recv, n, root);
    else MPI_CHECK(MPI_Reduce(send, recv, as_int(n), MPI_FLOAT, MPI_SUM, root, c->mpi));
    wait_end(t0);
    if (c->rank == root) scale_for_avg(c, recv, n, op);
}

void comm_scatter(const Comm* c, const float* send, float* recv, size_t n, int root) {
    comm_tally(c, COLL_SCATTER, n * c->size * sizeof(float), comm_ring_factor(c));
    double t0 = wait_begin(c, COLL_SCATTER, -1);
    if (hand()) {
        hand_begin();
        algo->scatter(c, send, recv, n, root);
        hand_end();
    } else {
        MPI_CHECK(MPI_Scatter(send, as_int(n), MPI_FLOAT, recv, as_int(n), MPI_FLOAT, root, c->mpi));
    }
    wait_end(t0);
}

void comm_gather(const Comm* c, const float* send, float* recv, size_t n, int root) {
    comm_tally(c, COLL_GATHER, n * c->size * sizeof(float), comm_ring_factor(c));
    double t0 = wait_begin(c, COLL_GATHER, -1);
    if (hand()) {
        hand_begin();
        algo->gather(c, send, recv, n, root);
        hand_end();
    } else {
        MPI_CHECK(MPI_Gather(send, as_int(n), MPI_FLOAT, recv, as_int(n), MPI_FLOAT, root, c->mpi));
    }
    wait_end(t0);
}

void comm_alltoall(const Comm* c, const float* send, float* recv, size_t n) {
    comm_tally(c, COLL_ALLTOALL, n * c->size * sizeof(float), comm_ring_factor(c));
    double t0 = wait_begin(c, COLL_ALLTOALL, -1);
    if (hand()) {
        hand_begin();
        algo->alltoall_pairwise(c, send, recv, n);
        hand_end();
    } else {
        MPI_CHECK(MPI_Alltoall(send, as_int(n), MPI_FLOAT, recv, as_int(n), MPI_FLOAT, c->mpi));
    }
    wait_end(t0);
}

// MPI's int counts and displacements of an all-to-all-v (4p ints: sc, sd,
// rc, rd), after counting the call: bytes are what this rank sends, bus
// bytes what of that leaves the rank.
static int* alltoallv_counts(const Comm* c, const size_t* send_counts, const size_t* send_displs,
                             const size_t* recv_counts, const size_t* recv_displs) {
    int p = c->size;
    int* sc = xmalloc(sizeof(int) * 4 * p);
    size_t sent = 0;
    for (int r = 0; r < p; r++) {
        sc[r] = as_int(send_counts[r]);
        sc[p + r] = as_int(send_displs[r]);
        sc[2 * p + r] = as_int(recv_counts[r]);
        sc[3 * p + r] = as_int(recv_displs[r]);
        sent += send_counts[r];
    }
    comm_tally_bytes(c, COLL_ALLTOALL, (double)sent * sizeof(float),
                     (double)(sent - send_counts[c->rank]) * sizeof(float));
    return sc;
}

void comm_alltoallv(const Comm* c, const float* send, const size_t* send_counts,
                    const size_t* send_displs, float* recv, const size_t* recv_counts,
                    const size_t* recv_displs) {
    int p = c->size;
    int* sc = alltoallv_counts(c, send_counts, send_displs, recv_counts, recv_displs);
    double t0 = wait_begin(c, COLL_ALLTOALL, -1);
    if (hand()) {
        hand_begin();
        algo->alltoallv_pairwise(c, send, send_counts, send_displs, recv, recv_counts, recv_displs);
        hand_end();
    } else {
        MPI_CHECK(MPI_Alltoallv(send, sc, sc + p, MPI_FLOAT, recv, sc + 2 * p, sc + 3 * p, MPI_FLOAT, c->mpi));
    }
    wait_end(t0);
    free(sc);
}

void comm_send(const Comm* c, const float* buf, size_t n, int peer) {
    comm_tally(c, COLL_SEND, n * sizeof(float), 1.0);
    double t0 = wait_begin(c, COLL_SEND, peer);
    MPI_CHECK(MPI_Send(buf, as_int(n), MPI_FLOAT, peer, p2p_tag, c->mpi));
    wait_end(t0);
}

// A message must be as long as the receive posted for it. MPI accepts a
// shorter one; NCCL does not (an ncclRecv's count is its ncclSend's), so on
// the CUDA backend the same code would hang or corrupt: caught here, on the
// CPU, with both ranks named.
static void check_received(const Comm* c, const MPI_Status* st, size_t posted) {
    int got = 0;
    MPI_CHECK(MPI_Get_count(st, MPI_FLOAT, &got));
    if ((size_t)got != posted)
        FATAL("rank %d of group %s received %d floats from its rank %d where the receive posted %zu: a send and its "
              "receive must have the same count (NCCL's rule)", c->rank, comm_axis_name(c->axis), got, st->MPI_SOURCE,
              posted);
}

void comm_recv(const Comm* c, float* buf, size_t n, int peer) {
    comm_tally(c, COLL_RECV, n * sizeof(float), 0.0);
    double t0 = wait_begin(c, COLL_RECV, peer);
    MPI_Status st;
    MPI_CHECK(MPI_Recv(buf, as_int(n), MPI_FLOAT, peer, p2p_tag, c->mpi, &st));
    check_received(c, &st, n);
    wait_end(t0);
}

void comm_sendrecv(const Comm* c, const float* send, size_t send_n, int dest, float* recv,
                   size_t recv_n, int source) {
    comm_tally(c, COLL_SEND, send_n * sizeof(float), 1.0);
    comm_tally(c, COLL_RECV, recv_n * sizeof(float), 0.0);
    double t0 = wait_begin(c, COLL_RECV, source);
    MPI_Status st;
    MPI_CHECK(MPI_Sendrecv(send, as_int(send_n), MPI_FLOAT, dest, p2p_tag, recv, as_int(recv_n),
                           MPI_FLOAT, source, p2p_tag, c->mpi, &st));
    check_received(c, &st, recv_n);
    wait_end(t0);
}

void comm_barrier(const Comm* c) {
    comm_tally(c, COLL_BARRIER, 0, 0.0);
    double t0 = wait_begin(c, COLL_BARRIER, -1);
    MPI_CHECK(MPI_Barrier(c->mpi));
    wait_end(t0);
}

// ---------------------------------------------------------------- progress

// MPI moves a non-blocking operation only while the rank is inside an MPI
// call: Open MPI's libnbc runs a collective as a schedule of sends and
// receives, and starts each round, and each rendezvous of a large message,
// from its progress engine. A rank that computes between start and wait
// makes no MPI call, so without help the whole transfer happens inside
// comm_wait. comm_progress makes those calls: the CPU ops call it at their
// start (common/cpu/ops_*.c), and it asks MPI about each request in flight
// (MPI_Request_get_status runs the progress engine and leaves the request
// as it is). A start adds its request to the list; comm_wait and comm_test
// take it out before they complete it.
static CommRequest* in_flight[COMM_MAX_IN_FLIGHT];  // the bound comm.h states
static int n_in_flight = 0;
static int progress_enabled = -1;  // COMM_PROGRESS=0 turns comm_progress off

int comm_progress_on(void) {
    if (progress_enabled < 0) {
        const char* env = getenv("COMM_PROGRESS");
        progress_enabled = !(env && strcmp(env, "0") == 0);
    }
    return progress_enabled;
}

void comm_progress(void) {
    if (n_in_flight == 0 || !comm_progress_on()) return;
    double t0 = now_seconds();
    for (int i = 0; i < n_in_flight; i++) {
        int done = 0;
        MPI_CHECK(MPI_Request_get_status(in_flight[i]->mpi, &done, MPI_STATUS_IGNORE));
    }
    comm_note_progress();
    comm_add_progress(now_seconds() - t0);
}

static void track(CommRequest* req) {
    CHECK(n_in_flight < COMM_MAX_IN_FLIGHT, "more than %d non-blocking operations in flight", COMM_MAX_IN_FLIGHT);
    ops_set_progress_hook(comm_progress);  // the ops drive it from now on
    in_flight[n_in_flight++] = req;
}

static void untrack(CommRequest* req) {
    for (int i = 0; i < n_in_flight; i++)
        if (in_flight[i] == req) {
            in_flight[i] = in_flight[--n_in_flight];
            return;
        }
}

// ---------------------------------------------------------------- non-blocking

// Every start returns the time it began: the seconds until the MPI call
// returns are the host's progress work on the operation (comm_progress_seconds).
static double start(CommRequest* req) {
    memset(req, 0, sizeof(*req));
    req->active = 1;
    comm_request_started(req);
    return now_seconds();
}

// --comm hand: chapter 1's algorithms are blocking, so a non-blocking
// collective runs whole at its start (counted as a blocking call's wait) and
// leaves a request that is already complete.
static void done_at_start(CommRequest* req) { memset(req, 0, sizeof(*req)); }

void comm_iallreduce(const Comm* c, float* buf, size_t n, CommOp op, CommRequest* req) {
    if (hand()) {
        done_at_start(req);
        comm_allreduce(c, buf, n, op);
        return;
    }
    comm_tally(c, COLL_ALLREDUCE, n * sizeof(float), 2.0 * comm_ring_factor(c));
    double t0 = start(req);
    if (op == COMM_AVG && c->size > 1) {
        req->scale_buf = buf;
        req->scale_count = n;
        req->scale = 1.0f / (float)c->size;
    }
    MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, buf, as_int(n), MPI_FLOAT, MPI_SUM, c->mpi, &req->mpi));
    track(req);
    comm_add_progress(now_seconds() - t0);
}

void comm_ireduce_scatter(const Comm* c, const float* send, float* recv, size_t n, CommOp op,
                          CommRequest* req) {
    if (hand()) {
        done_at_start(req);
        comm_reduce_scatter(c, send, recv, n, op);
        return;
    }
    comm_tally(c, COLL_REDUCE_SCATTER, n * c->size * sizeof(float), comm_ring_factor(c));
    double t0 = start(req);
    if (op == COMM_AVG && c->size > 1) {
        req->scale_buf = recv;
        req->scale_count = n;
        req->scale = 1.0f / (float)c->size;
    }
    MPI_CHECK(MPI_Ireduce_scatter_block(send, recv, as_int(n), MPI_FLOAT, MPI_SUM, c->mpi, &req->mpi));
    track(req);
    comm_add_progress(now_seconds() - t0);
}

void comm_iallgather(const Comm* c, const float* send, float* recv, size_t n, CommRequest* req) {
    if (hand()) {
        done_at_start(req);
        comm_allgather(c, send, recv, n);
        return;
    }
    comm_tally(c, COLL_ALLGATHER, n * c->size * sizeof(float), comm_ring_factor(c));
    double t0 = start(req);
    const void* src = send == recv + (size_t)c->rank * n ? MPI_IN_PLACE : (const void*)send;
    MPI_CHECK(MPI_Iallgather(src, as_int(n), MPI_FLOAT, recv, as_int(n), MPI_FLOAT, c->mpi, &req->mpi));
    track(req);
    comm_add_progress(now_seconds() - t0);
}

void comm_ibroadcast(const Comm* c, float* buf, size_t n, int root, CommRequest* req) {
    if (hand()) {
        done_at_start(req);
        comm_broadcast(c, buf, n, root);
        return;
    }
    comm_tally(c, COLL_BROADCAST, n * sizeof(float), c->size > 1 ? 1.0 : 0.0);
    double t0 = start(req);
    MPI_CHECK(MPI_Ibcast(buf, as_int(n), MPI_FLOAT, root, c->mpi, &req->mpi));
    track(req);
    comm_add_progress(now_seconds() - t0);
}

void comm_ialltoallv(const Comm* c, const float* send, const size_t* send_counts,
                     const size_t* send_displs, float* recv, const size_t* recv_counts,
                     const size_t* recv_displs, CommRequest* req) {
    if (hand()) {
        done_at_start(req);
        comm_alltoallv(c, send, send_counts, send_displs, recv, recv_counts, recv_displs);
        return;
    }
    int p = c->size;
    int* sc = alltoallv_counts(c, send_counts, send_displs, recv_counts, recv_displs);
    double t0 = start(req);
    req->mpi_counts = sc;  // MPI reads them until the operation completes
    MPI_CHECK(MPI_Ialltoallv(send, sc, sc + p, MPI_FLOAT, recv, sc + 2 * p, sc + 3 * p, MPI_FLOAT, c->mpi,
                             &req->mpi));
    track(req);
    comm_add_progress(now_seconds() - t0);
}

void comm_isend(const Comm* c, const float* buf, size_t n, int peer, CommRequest* req) {
    comm_tally(c, COLL_SEND, n * sizeof(float), 1.0);
    double t0 = start(req);
    MPI_CHECK(MPI_Isend(buf, as_int(n), MPI_FLOAT, peer, p2p_tag, c->mpi, &req->mpi));
    track(req);
    comm_add_progress(now_seconds() - t0);
}

void comm_irecv(const Comm* c, float* buf, size_t n, int peer, CommRequest* req) {
    comm_tally(c, COLL_RECV, n * sizeof(float), 0.0);
    double t0 = start(req);
    MPI_CHECK(MPI_Irecv(buf, as_int(n), MPI_FLOAT, peer, p2p_tag, c->mpi, &req->mpi));
    req->recv_floats = n;
    req->recv_comm = c;
    track(req);
    comm_add_progress(now_seconds() - t0);
}

void comm_wait(CommRequest* req) {
    if (!req->active) return;
    comm_request_current(req);
    untrack(req);
    watchdog_enter(collective_name((Collective)req->coll), comm_axis_name(req->axis), -1);
    double t0 = now_seconds();
    MPI_Status st;
    MPI_CHECK(MPI_Wait(&req->mpi, &st));
    if (req->recv_comm) check_received(req->recv_comm, &st, req->recv_floats);
    comm_add_wait(now_seconds() - t0);
    watchdog_leave();
    comm_request_done(req);
    if (req->scale_buf) ops_scale(req->scale_buf, req->scale_count, req->scale);
    free(req->mpi_counts);
    req->mpi_counts = NULL;
    req->active = 0;
}

int comm_test(CommRequest* req) {
    if (!req->active) return 1;
    int done = 0;
    comm_request_current(req);
    double t0 = now_seconds();
    untrack(req);
    MPI_Status st;
    MPI_CHECK(MPI_Test(&req->mpi, &done, &st));
    if (done) {
        if (req->recv_comm) check_received(req->recv_comm, &st, req->recv_floats);
        comm_request_done(req);
        if (req->scale_buf) ops_scale(req->scale_buf, req->scale_count, req->scale);
        free(req->mpi_counts);
        req->mpi_counts = NULL;
        req->active = 0;
    } else {
        track(req);
    }
    comm_add_progress(now_seconds() - t0);
    return done;
}
