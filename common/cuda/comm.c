// comm.c: the communication layer on NCCL (the CUDA backend). See comm.h.
//
// The twin of common/cpu/comm.c: the same functions in the same order, the
// same counting (calls, bytes, bus bytes per collective and axis, seconds
// waited). Where the CPU calls MPI_Allreduce, this file calls ncclAllReduce;
// MPI only hands out the NCCL unique ids and runs the barrier.
//
// Streams and order. Compute runs on the compute stream (device.cu); every
// NCCL operation runs on one communication stream, in program order. Before
// an operation is queued, the communication stream waits (an event) for all
// compute queued so far, so the operation sees the results of the kernels
// that came before it in the program.
//   - blocking calls then wait for the communication stream: when they
//     return, the result is in place for the host and for any later kernel;
//   - non-blocking calls record an event after the operation instead
//     (CommRequest.device_event); comm_wait makes the compute stream wait for
//     it and waits for it on the host, as MPI_Wait returns after completion.
// One stream for every communicator keeps all NCCL operations in one order
// that every rank shares (NCCL's rule for several communicators); so all
// ranks must start their operations in the same order, as the chapters do.
//
// Point-to-point. An ncclSend and its ncclRecv must run at the same time,
// and an ncclRecv queued alone blocks the stream behind it. So comm_isend and
// comm_irecv do not queue at once: they are held, and the held operations are
// queued together in one ncclGroupStart/End at the next comm_* call (the
// comm_wait of one of them at the latest; a blocking send, recv or sendrecv
// takes them into its own group). "irecv from left, isend to right, compute,
// wait" then runs as one group on every rank: no rank's receive waits behind
// its own send. Each held operation still waits only for the compute queued
// before its own start, so the compute between start and wait overlaps with
// it on the GPU.
//
// AVG is a sum followed by ops_scale(1/size) on the compute stream, as on
// the CPU (not ncclAvg), so both backends round the same way.
#include "comm.h"
#include "comm_count.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_common.h"
#include "ops.h"
#include "runtime.h"


// ---------------------------------------------------------------- NCCL state

// This rank's NCCL communicator on each axis (index: Comm.axis), made from
// the MPI communicator of the same group.
static ncclComm_t nccl_comms[COMM_NUM_AXES];
static cudaStream_t comm_stream = NULL;
static cudaEvent_t compute_ready = NULL;  // "compute queued so far", for blocking calls

static ncclComm_t nccl_of(const Comm* c) {
    CHECK(nccl_comms[c->axis] != NULL, "the %s communicator has no NCCL communicator: call comm_create first",
          comm_axis_name(c->axis));
    return nccl_comms[c->axis];
}

// The group's rank 0 makes a unique id, MPI carries it to the rest of the
// group, and every rank of the group joins the NCCL communicator with it.
static void make_comm(Comm* c, MPI_Comm mpi, int axis) {
    c->mpi = mpi;
    c->axis = axis;
    MPI_CHECK(MPI_Comm_size(mpi, &c->size));
    MPI_CHECK(MPI_Comm_rank(mpi, &c->rank));
    CHECK(nccl_comms[axis] == NULL, "comm_create called twice for the %s axis without comm_destroy",
          comm_axis_name(axis));
    ncclUniqueId id;
    memset(&id, 0, sizeof(id));
    if (c->rank == 0) NCCL_CHECK(ncclGetUniqueId(&id));
    MPI_CHECK(MPI_Bcast(&id, (int)sizeof(id), MPI_BYTE, 0, mpi));
    NCCL_CHECK(ncclCommInitRank(&nccl_comms[axis], c->size, id, c->rank));
}

// Non-zero when another rank of this node drives the same GPU as this rank.
// GPUs are told apart by PCI bus id, not by index: a launcher that gives each
// rank its own GPU through CUDA_VISIBLE_DEVICES shows every rank "GPU 0".
static int gpu_shared_on_node(void) {
    int dev = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    char mine[32] = {0};
    CUDA_CHECK(cudaDeviceGetPCIBusId(mine, (int)sizeof(mine), dev));
    MPI_Comm node;
    MPI_CHECK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node));
    int n = 1, me = 0;
    MPI_CHECK(MPI_Comm_size(node, &n));
    MPI_CHECK(MPI_Comm_rank(node, &me));
    char* all = (char*)xmalloc((size_t)n * sizeof(mine));
    MPI_CHECK(MPI_Allgather(mine, (int)sizeof(mine), MPI_CHAR, all, (int)sizeof(mine), MPI_CHAR, node));
    MPI_CHECK(MPI_Comm_free(&node));
    int shared = 0;
    for (int r = 0; r < n; r++)
        if (r != me && strncmp(all + r * sizeof(mine), mine, sizeof(mine)) == 0) shared = 1;
    free(all);
    return shared;
}

void comm_create(Comm* world, Comm axes[NUM_AXES], const Mesh* mesh) {
    // NCCL needs one GPU per rank of a communicator; say so instead of hanging
    int gpus = 0;
    CUDA_CHECK(cudaGetDeviceCount(&gpus));
    char msg[256];
    snprintf(msg, sizeof(msg), "%d ranks run on one node and some of them share a GPU (this rank sees %d): "
             "NCCL needs one GPU per rank; start at most one rank per GPU on each node",
             runtime_local_size(), gpus);
    fail_if_any(gpu_shared_on_node(), msg);
    if (!comm_stream) {
        CUDA_CHECK(cudaStreamCreateWithFlags(&comm_stream, cudaStreamNonBlocking));
        CUDA_CHECK(cudaEventCreateWithFlags(&compute_ready, cudaEventDisableTiming));
    }
    make_comm(world, MPI_COMM_WORLD, COMM_WORLD_AXIS);
    if (!mesh || !axes) return;
    for (int a = 0; a < NUM_AXES; a++) make_comm(&axes[a], mesh->axis_comm[a], a);
}

// --comm hand runs chapter 1's algorithms over MPI on host buffers: the
// CPU backend's. Here the library (NCCL) runs every collective.
const char* comm_set_impl(CommImpl which) {
    if (which == COMM_IMPL_HAND)
        return "--comm hand runs chapter 1's hand-written collectives on the CPU backend only; "
               "use --comm library here, or build with BACKEND=cpu";
    return NULL;
}
const char* comm_impl_name(void) { return "library"; }

static void flush_p2p(void);

void comm_destroy(Comm* world, Comm axes[NUM_AXES]) {
    // the MPI communicators belong to the mesh, which frees them; the NCCL
    // ones are ours
    flush_p2p();
    if (comm_stream) CUDA_CHECK(cudaStreamSynchronize(comm_stream));
    for (int a = 0; a < COMM_NUM_AXES; a++) {
        if (nccl_comms[a]) NCCL_CHECK(ncclCommDestroy(nccl_comms[a]));
        nccl_comms[a] = NULL;
    }
    if (comm_stream) {
        CUDA_CHECK(cudaEventDestroy(compute_ready));
        CUDA_CHECK(cudaStreamDestroy(comm_stream));
        compute_ready = NULL;
        comm_stream = NULL;
    }
    memset(world, 0, sizeof(*world));
    if (axes) memset(axes, 0, sizeof(Comm) * NUM_AXES);
}

// ---------------------------------------------------------------- held point-to-point

// A request owns one event, created here and destroyed when it completes.
static void start(CommRequest* req) {
    memset(req, 0, sizeof(*req));
    req->active = 1;
    cudaEvent_t ev;
    CUDA_CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    req->device_event = (void*)ev;
}

// comm_isend and comm_irecv (see the top of the file) are held here until
// the next comm_* call queues them. Each remembers its request, whose event
// first marks the compute queued before the start (recorded on the compute
// stream) and, once the operation is queued, its end (recorded again, on the
// communication stream).
typedef struct {
    int is_send;
    float* buf;
    size_t count;
    int peer;
    ncclComm_t comm;
    CommRequest* req;
} HeldP2P;

#define MAX_HELD 1024
static HeldP2P held[MAX_HELD];
static int num_held = 0;

static void hold_p2p(const Comm* c, int is_send, float* buf, size_t n, int peer, CommRequest* req) {
    CHECK(num_held < MAX_HELD, "more than %d comm_isend/comm_irecv started and not waited for", MAX_HELD);
    start(req);
    CUDA_CHECK(cudaEventRecord((cudaEvent_t)req->device_event, cuda_compute_stream));
    held[num_held++] = (HeldP2P){is_send, buf, n, peer, nccl_of(c), req};
}

// The held operations' waits for their compute; then, inside the caller's
// ncclGroupStart/End, the operations themselves.
static void held_wait_for_compute(void) {
    for (int i = 0; i < num_held; i++)
        CUDA_CHECK(cudaStreamWaitEvent(comm_stream, (cudaEvent_t)held[i].req->device_event, 0));
}

static void queue_held_in_group(void) {
    for (int i = 0; i < num_held; i++) {
        HeldP2P* h = &held[i];
        if (h->count == 0) continue;
        if (h->is_send) NCCL_CHECK(ncclSend(h->buf, h->count, ncclFloat, h->peer, h->comm, comm_stream));
        else NCCL_CHECK(ncclRecv(h->buf, h->count, ncclFloat, h->peer, h->comm, comm_stream));
    }
}

// After the group: each held request's event now marks its end.
static void held_done(void) {
    for (int i = 0; i < num_held; i++)
        CUDA_CHECK(cudaEventRecord((cudaEvent_t)held[i].req->device_event, comm_stream));
    num_held = 0;
}

// Queues the held operations as one group of their own.
static void flush_p2p(void) {
    if (num_held == 0) return;
    held_wait_for_compute();
    NCCL_CHECK(ncclGroupStart());
    queue_held_in_group();
    NCCL_CHECK(ncclGroupEnd());
    held_done();
}

// ---------------------------------------------------------------- ordering helpers

// The communication stream waits for all compute queued so far.
static void after_compute(void) {
    CUDA_CHECK(cudaEventRecord(compute_ready, cuda_compute_stream));
    CUDA_CHECK(cudaStreamWaitEvent(comm_stream, compute_ready, 0));
}

// Every blocking call: held point-to-point operations go first, then the
// communication stream waits for compute. The host waits for that compute
// too, outside the timer, so comm_wait_seconds counts communication only.
static double begin_blocking(void) {
    flush_p2p();
    after_compute();
    CUDA_CHECK(cudaEventSynchronize(compute_ready));
    return now_seconds();
}

// ... and waits for the communication stream: the result is in place.
static void end_blocking(double t0) {
    CUDA_CHECK(cudaStreamSynchronize(comm_stream));
    comm_add_wait(now_seconds() - t0);
}

// Blocking send, recv and sendrecv take the held operations into their own
// group instead: "irecv from a peer, then a blocking send to it" on both
// ranks is one group per rank, in which receive and send progress together
// (two groups in a row would leave each receive waiting for a send queued
// behind it).
static double begin_blocking_p2p(void) {
    held_wait_for_compute();
    after_compute();
    CUDA_CHECK(cudaEventSynchronize(compute_ready));
    double t0 = now_seconds();
    NCCL_CHECK(ncclGroupStart());
    queue_held_in_group();
    return t0;
}

static void end_blocking_p2p(double t0) {
    NCCL_CHECK(ncclGroupEnd());
    held_done();
    end_blocking(t0);
}

static void scale_for_avg(const Comm* c, float* buf, size_t n, CommOp op) {
    if (op == COMM_AVG && c->size > 1) ops_scale(buf, n, 1.0f / (float)c->size);
}

// A local block copy that is part of a collective (scatter, gather, ...),
// queued on the communication stream with the NCCL operations.
static void copy_on_comm_stream(float* dst, const float* src, size_t n) {
    if (n == 0 || dst == src) return;
    CUDA_CHECK(cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyDeviceToDevice, comm_stream));
}

// ---------------------------------------------------------------- blocking
// A count of 0 moves nothing: it is counted, and NCCL is not called.

void comm_allreduce(const Comm* c, float* buf, size_t n, CommOp op) {
    comm_tally(c, COLL_ALLREDUCE, n * sizeof(float), 2.0 * comm_ring_factor(c));
    if (n == 0) return;
    double t0 = begin_blocking();
    NCCL_CHECK(ncclAllReduce(buf, buf, n, ncclFloat, ncclSum, nccl_of(c), comm_stream));
    end_blocking(t0);
    scale_for_avg(c, buf, n, op);
}

void comm_reduce_scatter(const Comm* c, const float* send, float* recv, size_t n, CommOp op) {
    comm_tally(c, COLL_REDUCE_SCATTER, n * c->size * sizeof(float), comm_ring_factor(c));
    if (n == 0) return;
    double t0 = begin_blocking();
    NCCL_CHECK(ncclReduceScatter(send, recv, n, ncclFloat, ncclSum, nccl_of(c), comm_stream));
    end_blocking(t0);
    scale_for_avg(c, recv, n, op);
}

void comm_allgather(const Comm* c, const float* send, float* recv, size_t n) {
    comm_tally(c, COLL_ALLGATHER, n * c->size * sizeof(float), comm_ring_factor(c));
    if (n == 0) return;
    double t0 = begin_blocking();
    NCCL_CHECK(ncclAllGather(send, recv, n, ncclFloat, nccl_of(c), comm_stream));
    end_blocking(t0);
}

// Uneven blocks: every rank sends its block to every other rank and receives
// theirs, all in one group; its own block is a local copy.
void comm_allgatherv(const Comm* c, const float* send, float* recv, const size_t* counts_in,
                     const size_t* displs_in) {
    size_t total = 0;
    for (int r = 0; r < c->size; r++) total += counts_in[r];
    comm_tally(c, COLL_ALLGATHER, total * sizeof(float), comm_ring_factor(c));
    double t0 = begin_blocking();
    size_t mine = counts_in[c->rank];
    copy_on_comm_stream(recv + displs_in[c->rank], send, mine);
    NCCL_CHECK(ncclGroupStart());
    for (int r = 0; r < c->size; r++) {
        if (r == c->rank) continue;
        if (mine) NCCL_CHECK(ncclSend(send, mine, ncclFloat, r, nccl_of(c), comm_stream));
        if (counts_in[r])
            NCCL_CHECK(ncclRecv(recv + displs_in[r], counts_in[r], ncclFloat, r, nccl_of(c), comm_stream));
    }
    NCCL_CHECK(ncclGroupEnd());
    end_blocking(t0);
}

void comm_broadcast(const Comm* c, float* buf, size_t n, int root) {
    comm_tally(c, COLL_BROADCAST, n * sizeof(float), c->size > 1 ? 1.0 : 0.0);
    if (n == 0) return;
    double t0 = begin_blocking();
    NCCL_CHECK(ncclBroadcast(buf, buf, n, ncclFloat, root, nccl_of(c), comm_stream));
    end_blocking(t0);
}

void comm_reduce(const Comm* c, const float* send, float* recv, size_t n, int root, CommOp op) {
    comm_tally(c, COLL_REDUCE, n * sizeof(float), c->size > 1 ? 1.0 : 0.0);
    if (n == 0) return;
    double t0 = begin_blocking();
    NCCL_CHECK(ncclReduce(send, recv, n, ncclFloat, ncclSum, root, nccl_of(c), comm_stream));
    end_blocking(t0);
    if (c->rank == root) scale_for_avg(c, recv, n, op);
}

// The root sends block r to rank r, every other rank receives one block.
void comm_scatter(const Comm* c, const float* send, float* recv, size_t n, int root) {
    comm_tally(c, COLL_SCATTER, n * c->size * sizeof(float), comm_ring_factor(c));
    if (n == 0) return;
    double t0 = begin_blocking();
    if (c->rank == root) copy_on_comm_stream(recv, send + (size_t)root * n, n);
    NCCL_CHECK(ncclGroupStart());
    if (c->rank == root) {
        for (int r = 0; r < c->size; r++)
            if (r != root) NCCL_CHECK(ncclSend(send + (size_t)r * n, n, ncclFloat, r, nccl_of(c), comm_stream));
    } else {
        NCCL_CHECK(ncclRecv(recv, n, ncclFloat, root, nccl_of(c), comm_stream));
    }
    NCCL_CHECK(ncclGroupEnd());
    end_blocking(t0);
}

// Every rank sends its block to the root, which receives block r from rank r.
void comm_gather(const Comm* c, const float* send, float* recv, size_t n, int root) {
    comm_tally(c, COLL_GATHER, n * c->size * sizeof(float), comm_ring_factor(c));
    if (n == 0) return;
    double t0 = begin_blocking();
    if (c->rank == root) copy_on_comm_stream(recv + (size_t)root * n, send, n);
    NCCL_CHECK(ncclGroupStart());
    if (c->rank == root) {
        for (int r = 0; r < c->size; r++)
            if (r != root) NCCL_CHECK(ncclRecv(recv + (size_t)r * n, n, ncclFloat, r, nccl_of(c), comm_stream));
    } else {
        NCCL_CHECK(ncclSend(send, n, ncclFloat, root, nccl_of(c), comm_stream));
    }
    NCCL_CHECK(ncclGroupEnd());
    end_blocking(t0);
}

// Block j goes to rank j, block i arrives from rank i: p-1 sends and p-1
// receives in one group, the own block a local copy.
void comm_alltoall(const Comm* c, const float* send, float* recv, size_t n) {
    comm_tally(c, COLL_ALLTOALL, n * c->size * sizeof(float), comm_ring_factor(c));
    if (n == 0) return;
    double t0 = begin_blocking();
    copy_on_comm_stream(recv + (size_t)c->rank * n, send + (size_t)c->rank * n, n);
    NCCL_CHECK(ncclGroupStart());
    for (int r = 0; r < c->size; r++) {
        if (r == c->rank) continue;
        NCCL_CHECK(ncclSend(send + (size_t)r * n, n, ncclFloat, r, nccl_of(c), comm_stream));
        NCCL_CHECK(ncclRecv(recv + (size_t)r * n, n, ncclFloat, r, nccl_of(c), comm_stream));
    }
    NCCL_CHECK(ncclGroupEnd());
    end_blocking(t0);
}

void comm_alltoallv(const Comm* c, const float* send, const size_t* send_counts,
                    const size_t* send_displs, float* recv, const size_t* recv_counts,
                    const size_t* recv_displs) {
    int p = c->size, me = c->rank;
    size_t sent = 0;
    for (int r = 0; r < p; r++) sent += send_counts[r];
    // bytes: what this rank sends; bus bytes: of that, what leaves the rank
    comm_tally_bytes(c, COLL_ALLTOALL, (double)sent * sizeof(float),
                     (double)(sent - send_counts[me]) * sizeof(float));
    CHECK(send_counts[me] == recv_counts[me], "comm_alltoallv: this rank sends itself %zu floats but expects %zu",
          send_counts[me], recv_counts[me]);
    double t0 = begin_blocking();
    copy_on_comm_stream(recv + recv_displs[me], send + send_displs[me], send_counts[me]);
    NCCL_CHECK(ncclGroupStart());
    for (int r = 0; r < p; r++) {
        if (r == me) continue;
        if (send_counts[r])
            NCCL_CHECK(ncclSend(send + send_displs[r], send_counts[r], ncclFloat, r, nccl_of(c), comm_stream));
        if (recv_counts[r])
            NCCL_CHECK(ncclRecv(recv + recv_displs[r], recv_counts[r], ncclFloat, r, nccl_of(c), comm_stream));
    }
    NCCL_CHECK(ncclGroupEnd());
    end_blocking(t0);
}

// A blocking send returns when the data has arrived: like an MPI_Send that
// waits for its receive (the hand-written collectives never rely on buffering).
void comm_send(const Comm* c, const float* buf, size_t n, int peer) {
    comm_tally(c, COLL_SEND, n * sizeof(float), 1.0);
    if (n == 0) return;
    double t0 = begin_blocking_p2p();
    NCCL_CHECK(ncclSend(buf, n, ncclFloat, peer, nccl_of(c), comm_stream));
    end_blocking_p2p(t0);
}

void comm_recv(const Comm* c, float* buf, size_t n, int peer) {
    comm_tally(c, COLL_RECV, n * sizeof(float), 0.0);
    if (n == 0) return;
    double t0 = begin_blocking_p2p();
    NCCL_CHECK(ncclRecv(buf, n, ncclFloat, peer, nccl_of(c), comm_stream));
    end_blocking_p2p(t0);
}

// The send and the receive in one group, so they progress together: a ring
// step where every rank sends right and receives from the left cannot deadlock.
void comm_sendrecv(const Comm* c, const float* send, size_t send_n, int dest, float* recv,
                   size_t recv_n, int source) {
    comm_tally(c, COLL_SEND, send_n * sizeof(float), 1.0);
    comm_tally(c, COLL_RECV, recv_n * sizeof(float), 0.0);
    if (send_n == 0 && recv_n == 0) return;
    double t0 = begin_blocking_p2p();
    if (send_n) NCCL_CHECK(ncclSend(send, send_n, ncclFloat, dest, nccl_of(c), comm_stream));
    if (recv_n) NCCL_CHECK(ncclRecv(recv, recv_n, ncclFloat, source, nccl_of(c), comm_stream));
    end_blocking_p2p(t0);
}

// Every rank's queued work is done, then the ranks meet.
void comm_barrier(const Comm* c) {
    comm_tally(c, COLL_BARRIER, 0, 0.0);
    flush_p2p();
    CUDA_CHECK(cudaStreamSynchronize(cuda_compute_stream));
    double t0 = now_seconds();
    CUDA_CHECK(cudaStreamSynchronize(comm_stream));
    MPI_CHECK(MPI_Barrier(c->mpi));
    comm_add_wait(now_seconds() - t0);
}

// ---------------------------------------------------------------- non-blocking

// A non-blocking collective: queued at once (after held point-to-point
// operations and the compute queued so far), the request's event recorded
// behind it.
// The seconds spent queueing count as progress (comm_progress_seconds).
static double begin_nonblocking(void) {
    double t0 = now_seconds();
    flush_p2p();
    after_compute();
    return t0;
}

static void end_nonblocking(CommRequest* req, double t0) {
    CUDA_CHECK(cudaEventRecord((cudaEvent_t)req->device_event, comm_stream));
    comm_add_progress(now_seconds() - t0);
}

void comm_iallreduce(const Comm* c, float* buf, size_t n, CommOp op, CommRequest* req) {
    comm_tally(c, COLL_ALLREDUCE, n * sizeof(float), 2.0 * comm_ring_factor(c));
    start(req);
    if (op == COMM_AVG && c->size > 1) {
        req->scale_buf = buf;
        req->scale_count = n;
        req->scale = 1.0f / (float)c->size;
    }
    double t0 = begin_nonblocking();
    if (n) NCCL_CHECK(ncclAllReduce(buf, buf, n, ncclFloat, ncclSum, nccl_of(c), comm_stream));
    end_nonblocking(req, t0);
}

void comm_ireduce_scatter(const Comm* c, const float* send, float* recv, size_t n, CommOp op,
                          CommRequest* req) {
    comm_tally(c, COLL_REDUCE_SCATTER, n * c->size * sizeof(float), comm_ring_factor(c));
    start(req);
    if (op == COMM_AVG && c->size > 1) {
        req->scale_buf = recv;
        req->scale_count = n;
        req->scale = 1.0f / (float)c->size;
    }
    double t0 = begin_nonblocking();
    if (n) NCCL_CHECK(ncclReduceScatter(send, recv, n, ncclFloat, ncclSum, nccl_of(c), comm_stream));
    end_nonblocking(req, t0);
}

void comm_iallgather(const Comm* c, const float* send, float* recv, size_t n, CommRequest* req) {
    comm_tally(c, COLL_ALLGATHER, n * c->size * sizeof(float), comm_ring_factor(c));
    start(req);
    double t0 = begin_nonblocking();
    if (n) NCCL_CHECK(ncclAllGather(send, recv, n, ncclFloat, nccl_of(c), comm_stream));
    end_nonblocking(req, t0);
}

void comm_ibroadcast(const Comm* c, float* buf, size_t n, int root, CommRequest* req) {
    comm_tally(c, COLL_BROADCAST, n * sizeof(float), c->size > 1 ? 1.0 : 0.0);
    start(req);
    double t0 = begin_nonblocking();
    if (n) NCCL_CHECK(ncclBroadcast(buf, buf, n, ncclFloat, root, nccl_of(c), comm_stream));
    end_nonblocking(req, t0);
}

void comm_isend(const Comm* c, const float* buf, size_t n, int peer, CommRequest* req) {
    comm_tally(c, COLL_SEND, n * sizeof(float), 1.0);
    hold_p2p(c, 1, (float*)buf, n, peer, req);
}

void comm_irecv(const Comm* c, float* buf, size_t n, int peer, CommRequest* req) {
    comm_tally(c, COLL_RECV, n * sizeof(float), 0.0);
    hold_p2p(c, 0, buf, n, peer, req);
}

// The end of a completed request: later compute is ordered after it, AVG is
// applied (on the compute stream, after that), the event is freed.
static void finish(CommRequest* req) {
    cudaEvent_t ev = (cudaEvent_t)req->device_event;
    CUDA_CHECK(cudaStreamWaitEvent(cuda_compute_stream, ev, 0));
    if (req->scale_buf) ops_scale(req->scale_buf, req->scale_count, req->scale);
    CUDA_CHECK(cudaEventDestroy(ev));
    req->device_event = NULL;
    req->active = 0;
}

void comm_wait(CommRequest* req) {
    if (!req->active) return;
    flush_p2p();
    // The host first waits for the compute queued so far, outside the timer
    // (as the blocking calls do): the request's event sits behind the compute
    // queued before its start, and the host usually runs far ahead of the
    // GPU, so timing the event alone would count compute as waiting.
    CUDA_CHECK(cudaEventRecord(compute_ready, cuda_compute_stream));
    CUDA_CHECK(cudaEventSynchronize(compute_ready));
    double t0 = now_seconds();
    CUDA_CHECK(cudaEventSynchronize((cudaEvent_t)req->device_event));
    comm_add_wait(now_seconds() - t0);
    finish(req);
}

int comm_test(CommRequest* req) {
    if (!req->active) return 1;
    double t0 = now_seconds();
    flush_p2p();
    cudaError_t rc = cudaEventQuery((cudaEvent_t)req->device_event);
    int done = rc != cudaErrorNotReady;
    if (!done) {
        // not an error: still in flight. Clear it in case the runtime kept it
        // as the last error, so the next kernel launch check does not see it.
        if (cudaPeekAtLastError() == cudaErrorNotReady) (void)cudaGetLastError();
    } else {
        CUDA_CHECK(rc);
        finish(req);
    }
    comm_add_progress(now_seconds() - t0);
    return done;
}
