// comm.c: the communication layer on NCCL (the CUDA backend). See comm.h.
//
// The twin of common/cpu/comm.c: the same functions in the same order, the
// same counting (calls, bytes, bus bytes per collective and axis, seconds
// waited). Where the CPU calls MPI_Allreduce, this file calls ncclAllReduce;
// MPI only hands out the NCCL unique ids and runs the barrier.
//
// Streams and order. Compute runs on the compute stream (device.cu); every
// group (axis, world, comm_create_group*) has its own NCCL communicator and
// its own communication stream, so a tp all-reduce does not queue behind a
// dp prefetch. Before an operation is queued, its group's stream waits (an
// event) for all compute queued so far, so the operation sees the results
// of the kernels that came before it in the program. Everything is
// stream-ordered, as NCCL's own calls are; the host waits in comm_barrier,
// when a group is freed, and for the channels' turns and drains below:
//   - blocking calls record an event behind the operation and make the
//     compute stream wait for it (cudaStreamWaitEvent): when they return,
//     the result is in place for every later kernel, copy and operation
//     (those queue behind that wait), and the host sees it through
//     mem_to_host or device_synchronize (device.cu), which wait for the
//     compute stream through wait_checked below (NCCL's errors, the
//     watchdog), so a dead peer ends the job at the next of those;
//   - non-blocking calls record an event after the operation
//     (CommRequest.device_event); comm_wait makes the compute stream wait for
//     it, so later compute sees the result, as after MPI_Wait.
// The time the compute stream stands still in those waits is the comm
// wait: spans of wait_clock, a DeviceClock (memory.h), from the compute
// stream reaching the call to its release, read into comm_wait_seconds at
// step boundaries (comm_device_wait_seconds; docs/cuda.md says what exactly
// is measured).
// Several communicators on one GPU: before NCCL 2.26, all their operations
// had to be serialised into one order every rank shares, or they could
// deadlock. From 2.26, NCCL_LAUNCH_ORDER_IMPLICIT=1 makes NCCL order them by
// the order the host issues them ("Using multiple NCCL communicators
// concurrently" in NCCL's user guide). So: with NCCL >= 2.26 this file sets
// NCCL_LAUNCH_ORDER_IMPLICIT=1 (unless the user set it) and gives each group
// its own stream; with an older NCCL, or NCCL_LAUNCH_ORDER_IMPLICIT=0, every
// group shares one stream, the serial order of before. Either way all ranks
// must start their operations in the same order, as the chapters do.
//
// Progress: NCCL's kernels and proxy thread move the data by themselves, so
// comm_progress (the CPU backend's, called by its ops) is a no-op here.
//
// Point-to-point: channels. NCCL runs the operations of one stream in
// order, and a large ncclSend ends only when its ncclRecv runs, so one
// stream for all of a group's sends and receives would make a receive wait
// behind this rank's earlier sends, and a send behind earlier receives:
// chapter 5's interleaved schedule deadlocks that way (tests/test_cuda_queue.c
// replays every schedule under these rules). So the world and the pp and cp
// groups (those that send and receive), when of size >= 2, have, for each ring neighbour
// (rank +- 1), a channel per direction: an NCCL communicator of two ranks,
// made by ncclCommSplit, with its own stream, that carries the messages of
// one direction only. Its sends (on one rank) and receives (on the other)
// then come in the same order, and a transfer waits for nothing but its own
// peer. In a group of two ranks the one neighbour is both the next and the
// previous rank: it gets both channels of each direction, and the messages
// to it alternate between them (channel_to). Two NCCL rules shape how the
// channels are used:
//   - NCCL connects a pair at its first use, blocking the host until the
//     peer's host makes its own first call there: every channel is
//     connected when it is made (connect_channels);
//   - with NCCL_LAUNCH_ORDER_IMPLICIT=1 every NCCL kernel on the device
//     starts after the one issued before it: a channel holds one operation
//     in flight, a later one waits on the host for its turn, and the
//     operations are issued in the order of the calls (channel_post).
// comm_isend and comm_irecv issue their operation on its channel at once
// when the channel is free and nothing waits, else at the first comm_* call
// or polling wait after the operations before it were issued and its
// channel's previous one ended; either way it runs after the compute queued
// before the call (an event recorded at the call). Any other call that
// issues NCCL work first waits on the host until nothing waits. comm_recv
// and comm_send wait on the host for their channel to be free, then make the
// compute stream wait for it only; comm_sendrecv is one group on its two
// channels; comm_wait makes the compute stream wait for its request (on the
// host first until the request is issued).
// These are the CPU layer's semantics: an isend progresses by itself, a
// receive waits for its own message only, an operation waits only for the
// compute before it. docs/cuda.md explains the rules.
//   Channels need other communicators' kernels to run concurrently with
// them: NCCL >= 2.26 with NCCL_LAUNCH_ORDER_IMPLICIT=1 and CUDA >= 12.3
// (the CUDA NCCL was built with and the driver, as NCCL decides: it then
// orders launches by launch completion, not by kernel completion;
// decide_streams). Elsewhere (the shared stream, an older CUDA), and
// for a peer that is not a neighbour or a group made by comm_create_group*,
// the operations are held as before: queued together in one
// ncclGroupStart/End at the next comm_* call (comm_test and comm_wait
// included; a blocking send, recv or sendrecv takes them into its own
// group). That path keeps the old limit: a large message can deadlock
// chapter 5's interleaved schedule (see the test).
//
// AVG is a sum followed by ops_scale(1/size) on the compute stream, as on
// the CPU (not ncclAvg), so both backends round the same way.
#include "comm.h"
#include "comm_groups.h"
#include "comm_stats.h"
#include "comm_trace.h"

#include <dlfcn.h>  // dladdr (-D_GNU_SOURCE)
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_common.h"
#include "memory.h"
#include "device_clock.h"
#include "ops.h"
#include "runtime.h"
#include "watchdog.h"


// ---------------------------------------------------------------- NCCL state

// One group's NCCL side (Comm.backend): its communicator, made from the MPI
// communicator of the same group, and the stream its operations run on.
// A channel (see the top) is an NcclGroup too: its communicator of two
// ranks (the sender is rank 0, the receiver rank 1) and its stream.
typedef struct NcclGroup {
    ncclComm_t nccl;
    cudaStream_t stream;      // its own, or shared_stream
    struct NcclGroup* next;   // every live group and channel, for comm_barrier
    // channels to and from the ring neighbours: [0] the next rank (+1),
    // [1] the previous (-1); NULL without channels. With two ranks the one
    // neighbour is both, and its messages alternate between the two
    // channels of each direction (see channel_to).
    struct NcclGroup* to[2];
    struct NcclGroup* from[2];
    long sent, received;  // two ranks: messages to and from the peer so far
} NcclGroup;

static NcclGroup* live_groups = NULL;
static int own_streams = -1;               // decided at the first group
static int use_channels = 0;               // own streams, and CUDA launch-completion ordering
static cudaStream_t shared_stream = NULL;  // every group's, when not own_streams
static cudaEvent_t compute_ready = NULL;   // "compute queued so far", for the communication streams
static cudaEvent_t comm_done = NULL;       // "a blocking call's operation ended", for the compute stream
// The compute stream's waits for communication: a span from the compute
// stream reaching a blocking call or comm_wait to the end of the operation
// it waits for (see comm_device_wait_seconds).
static DeviceClock wait_clock;
// The channels' operations waiting for their turn, in the order of the
// calls (see channel_post).
typedef struct ChannelOp {
    NcclGroup* ch;
    int is_send;
    float* buf;
    size_t n;
    CommRequest* req;
} ChannelOp;

static ChannelOp* waiting = NULL;  // in the order of the calls
static int n_waiting = 0, cap_waiting = 0;

// ---------------------------------------------------------------- waiting, with NCCL's errors

// NCCL reports a failure found while an operation runs (a dead peer, a broken
// transport) only through ncclCommGetAsyncError, and the operation's kernel
// may then never finish: a plain cudaStreamSynchronize would wait forever.
// So every wait here polls, and on each turn asks every communicator for its
// asynchronous error; on one, it aborts every communicator (their kernels
// end) and stops the job with a message.
static void check_async_errors(void) {
    for (NcclGroup* g = live_groups; g; g = g->next) {
        ncclResult_t state = ncclSuccess;
        NCCL_CHECK(ncclCommGetAsyncError(g->nccl, &state));
        if (state == ncclSuccess || state == ncclInProgress) continue;
        for (NcclGroup* a = live_groups; a; a = a->next) ncclCommAbort(a->nccl);
        FATAL("NCCL failed while communicating: %s (a peer died, or the network failed); every communicator was "
              "aborted", ncclGetErrorString(state));
    }
}

static void channels_pump(void);
static void comm_streams_wait(void);

// Waits for a stream (event NULL) or an event, as above.
// The watchdog (watchdog.h) watches every such wait: a peer that stopped
// leaves an NCCL kernel waiting forever, and no error is ever reported.
// While it waits, the channels' next operations are issued as the ones
// before them end (channels_pump): what it waits for may need them.
static void wait_checked(cudaStream_t stream, cudaEvent_t event) {
    watchdog_enter(event ? "wait for an NCCL operation" : "wait for a stream", "device", -1);
    for (;;) {
        cudaError_t q = event ? cudaEventQuery(event) : cudaStreamQuery(stream);
        if (q == cudaSuccess) break;
        if (q != cudaErrorNotReady) CUDA_CHECK(q);
        if (cudaPeekAtLastError() == cudaErrorNotReady) (void)cudaGetLastError();  // not an error: see comm_test
        check_async_errors();
        channels_pump();
        sched_yield();
    }
    watchdog_leave();
}

// device_synchronize (device.cu) waits for the compute stream, which may wait
// for communication: it polls through this too.
static void device_wait_checked(void) { wait_checked(cuda_compute_stream, NULL); }

static NcclGroup* group_of(const Comm* c) {
    CHECK(c->backend != NULL, "the %s communicator has no NCCL communicator: call comm_create (or this rank is "
          "not in the group)", comm_axis_name(c->axis));
    return (NcclGroup*)c->backend;
}
static ncclComm_t nccl_of(const Comm* c) { return group_of(c)->nccl; }
static cudaStream_t stream_of(const Comm* c) { return group_of(c)->stream; }

// The CUDA version NCCL was built with (1000 major + 10 minor), read from
// the version string NCCL keeps in its library for `strings` to find
// ("NCCL version 2.28.9+cuda13.0": VERSION_STRING in NCCL's src/init.cc).
// NCCL's API does not report it, and NCCL's launch ordering depends on it
// (see decide_streams). 0 when the string is not found.
static int nccl_build_cuda_version(void) {
    Dl_info info;
    const char* path = "/proc/self/exe";  // NCCL linked statically
    if (dladdr((void*)ncclGetVersion, &info) && info.dli_fname && info.dli_fname[0]) path = info.dli_fname;
    FILE* f = fopen(path, "rb");
    if (!f) return 0;
    enum { CHUNK = 1 << 20, KEEP = 64, LIMIT = 64 << 20 };  // the string sits in .rodata, near the start
    char* buf = (char*)xmalloc(CHUNK + KEEP + 1);
    size_t have = 0, read_total = 0;
    int version = 0;
    static const char key[] = "NCCL version ";
    while (!version && read_total < LIMIT) {
        size_t got = fread(buf + have, 1, CHUNK, f);
        if (got == 0) break;
        read_total += got;
        have += got;
        buf[have] = 0;  // sscanf below stops there
        for (char* at = buf; (at = (char*)memmem(at, have - (size_t)(at - buf), key, sizeof(key) - 1)) != NULL; at++) {
            char* plus = (char*)memchr(at, '+', (size_t)(buf + have - at) < KEEP ? (size_t)(buf + have - at) : KEEP);
            int major = 0, minor = 0;
            if (plus && sscanf(plus, "+cuda%d.%d", &major, &minor) == 2) {
                version = major * 1000 + minor * 10;
                break;
            }
        }
        size_t keep = have < KEEP ? have : KEEP;  // a string cut by the chunk's end is found in the next
        memmove(buf, buf + have - keep, keep);
        have = keep;
    }
    free(buf);
    fclose(f);
    return version;
}

// Own streams need NCCL >= 2.26 with implicit launch order (see the top).
// Runs before any other NCCL call, so NCCL reads the variable we set.
// Channels need NCCL to order launches by launch completion, which NCCL
// does when min(the CUDA it was built with, the driver) >= 12.3
// (getImplicitOrder in NCCL's src/enqueue.cc); below that every NCCL kernel
// waits for the one before it to end, and a receive would block the
// channels behind it. So the decision uses what NCCL reports (ncclGetVersion)
// and the versions NCCL itself compares, not this program's CUDA runtime.
static void decide_streams(void) {
    if (own_streams >= 0) return;
    int version = 0;
    NCCL_CHECK(ncclGetVersion(&version));
    const char* env = getenv("NCCL_LAUNCH_ORDER_IMPLICIT");
    own_streams = version >= 22600 && !(env && strcmp(env, "0") == 0);
    int driver = 0, built = own_streams ? nccl_build_cuda_version() : 0;
    CUDA_CHECK(cudaDriverGetVersion(&driver));  // what NCCL's ncclCudaDriverVersion reads (cuDriverGetVersion)
    if (own_streams && built == 0) {
        // not found: this program's runtime is the best guess left, said once
        CUDA_CHECK(cudaRuntimeGetVersion(&built));
        int rank = 0;
        MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
        if (rank == 0)
            fprintf(stderr, "note: the CUDA version NCCL was built with is not in its library; taking this "
                            "program's (%d) to decide NCCL's launch ordering\n", built);
    }
    use_channels = own_streams && (driver < built ? driver : built) >= 12030;
    // Three settings make a launch wait for a posted receive, and the
    // channels would deadlock: NCCL_COMM_SPLIT_SHARE_RESOURCES=1 gives each
    // split-off channel its parent's one internal stream (NCCL's init.cc),
    // CUDA_LAUNCH_BLOCKING=1 returns from a receive's launch only when it has
    // ended, before the host could issue the send that feeds the peer's, and
    // lazy module loading (a CUDA_MODULE_LOADING other than the EAGER that
    // device_environment sets) may hold a kernel's first launch until the
    // device's work, the receive included, has ended. The held path groups a
    // send with its receive: it takes over.
    // each variable, and its one value (besides unset) under which the channels are safe
    static const struct {
        const char *name, *safe;
    } waits[3] = {{"NCCL_COMM_SPLIT_SHARE_RESOURCES", "0"}, {"CUDA_LAUNCH_BLOCKING", "0"},
                  {"CUDA_MODULE_LOADING", "EAGER"}};
    for (int i = 0; i < 3 && use_channels; i++) {
        const char* set = getenv(waits[i].name);
        if (set && strcmp(set, waits[i].safe) != 0) {
            use_channels = 0;
            int rank = 0;
            MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
            if (rank == 0)
                fprintf(stderr, "note: %s=%s can make a launch wait for a posted receive: point-to-point messages "
                                "are held and grouped, without channels (docs/notes/cuda.md)\n", waits[i].name, set);
        }
    }
    // every rank the same decision, the least capable rank's: channels are
    // made by ncclCommSplit, collective over the world, and a message must
    // meet its match on the same communicator. Nodes may differ in their
    // driver, a rank in its environment.
    int mine[2] = {own_streams, use_channels}, all[2];
    MPI_CHECK(MPI_Allreduce(mine, all, 2, MPI_INT, MPI_MIN, MPI_COMM_WORLD));
    own_streams = all[0], use_channels = all[1];
    if (own_streams) setenv("NCCL_LAUNCH_ORDER_IMPLICIT", "1", 0);
}

// The compute stream's waits read on the GPU's clock since the last call:
// comm_wait_seconds (comm_stats.c) adds them. Reading waits for the last
// span's end (device_clock_seconds), so it is read at step boundaries, where
// clock_end has synchronised already.
static double comm_device_wait_seconds(void) {
    double s = device_clock_seconds(&wait_clock);
    device_clock_reset(&wait_clock);
    return s;
}

static void shared_resources_create(void) {
    if (compute_ready) return;
    CUDA_CHECK(cudaEventCreateWithFlags(&compute_ready, cudaEventDisableTiming));
    CUDA_CHECK(cudaEventCreateWithFlags(&comm_done, cudaEventDisableTiming));
    cuda_compute_wait = device_wait_checked;
    cuda_comm_wait = comm_streams_wait;
    comm_stats_device_waits(comm_device_wait_seconds);
    if (!own_streams) CUDA_CHECK(cudaStreamCreateWithFlags(&shared_stream, cudaStreamNonBlocking));
}

// A live entry (a group or a channel) for a communicator: its stream, in
// the list that comm_barrier and the error checks walk.
static NcclGroup* live_add(ncclComm_t nccl) {
    NcclGroup* g = (NcclGroup*)xcalloc(1, sizeof(NcclGroup));
    g->nccl = nccl;
    if (own_streams) CUDA_CHECK(cudaStreamCreateWithFlags(&g->stream, cudaStreamNonBlocking));
    else g->stream = shared_stream;
    g->next = live_groups;
    live_groups = g;
    return g;
}

// Waits for the entry's operations, then frees its communicator and stream.
static void live_free(NcclGroup* g) {
    wait_checked(g->stream, NULL);
    NCCL_CHECK(ncclCommDestroy(g->nccl));
    if (own_streams) CUDA_CHECK(cudaStreamDestroy(g->stream));
    for (NcclGroup** p = &live_groups; *p; p = &(*p)->next)
        if (*p == g) {
            *p = g->next;
            break;
        }
    free(g);
}

// The channels of one direction (dir +1: rank i to i+1; -1: i to i-1) of a
// group of n >= 2 ranks, split off its communicator. Pair i is the channel
// of rank i's messages. A rank sits in two pairs of a direction (sending in
// one, receiving in the other) and ncclCommSplit gives it one communicator
// per call, so the pairs are made in phases where no rank is in two: even i,
// odd i, and with n odd the last pair alone. Every rank of the group calls
// every phase (ncclCommSplit is collective), in the same order.
static void make_channels(NcclGroup* g, int n, int me, int dir) {
    int phases = n % 2 ? 3 : 2;
    for (int ph = 0; ph < phases; ph++) {
        int color = NCCL_SPLIT_NOCOLOR, key = 0;
        for (int role = 0; role < 2; role++) {  // 0: the pair I send in, 1: the one I receive in
            int i = role == 0 ? me : ((me - dir) % n + n) % n;
            int phase = (n % 2 && i == n - 1) ? 2 : i % 2;
            if (phase == ph) color = i, key = role;  // the sender is rank 0 of the channel
        }
        ncclComm_t nc = NULL;
        NCCL_CHECK(ncclCommSplit(g->nccl, color, key, &nc, NULL));
        if (color == NCCL_SPLIT_NOCOLOR) continue;
        NcclGroup* ch = live_add(nc);
        // to[0]/from[0]: the next rank; to[1]/from[1]: the previous one
        if (key == 0) g->to[dir == 1 ? 0 : 1] = ch;
        else g->from[dir == 1 ? 1 : 0] = ch;
    }
}

// NCCL connects a point-to-point pair at its first use, not when the
// communicator is made: the first ncclSend or ncclRecv to a peer marks the
// connections to set up (p2pTaskAppend in NCCL's src/enqueue.cc, "Mark
// channels that need pre-connect"), and ncclGroupEnd then sets them up and
// waits (groupLaunch, ncclP2PPreconnectFunc in src/group.cc), exchanging
// addresses with the peer over the bootstrap network: a send to it, then a
// receive from it (ncclTransportP2pSetup in src/transport.cc). So the first
// call on a channel blocks the host until the peer's host makes its own
// first call on that channel. In a ring where every rank first posts its
// receive from the left, every host would block there for good. So every
// channel is connected here, while all ranks make the group together: one
// group over all the group's channels, a one-element message on each in the
// direction it carries (rank 0 sends, rank 1 receives; NCCL connects all of
// a peer's channels whatever the size), then a wait. Inside ncclGroupEnd
// NCCL connects the communicators of a group each in its own thread
// (asyncJobLaunch in src/group.cc), so the order of the channels here does
// not matter. Later operations find the channels connected and never block
// the host.
static void connect_channels(NcclGroup* g) {
    NcclGroup* ch[4] = {g->to[0], g->to[1], g->from[0], g->from[1]};
    float* scratch = cuda_handshake_floats();  // not one of the model's categories: 16 bytes at start-up
    for (int i = 0; i < 4; i++)
        if (ch[i]) CUDA_CHECK(cudaMemsetAsync(scratch + i, 0, sizeof(float), ch[i]->stream));
    NCCL_CHECK(ncclGroupStart());
    for (int i = 0; i < 4; i++) {
        if (!ch[i]) continue;
        if (i < 2) NCCL_CHECK(ncclSend(scratch + i, 1, ncclFloat, 1, ch[i]->nccl, ch[i]->stream));
        else NCCL_CHECK(ncclRecv(scratch + i, 1, ncclFloat, 0, ch[i]->nccl, ch[i]->stream));
    }
    NCCL_CHECK(ncclGroupEnd());
    for (int i = 0; i < 4; i++)
        if (ch[i]) wait_checked(ch[i]->stream, NULL);
}

// The group's rank 0 makes a unique id, MPI carries it to the rest of the
// group, and every rank of the group joins the NCCL communicator with it.
// With channels (the world, pp and cp: the groups that send and receive),
// the channels to and from the ring neighbours too.
static void make_comm(Comm* c, MPI_Comm mpi, int axis, int channels) {
    decide_streams();  // decided already when the world's group came first; else every rank is here
    shared_resources_create();
    memset(c, 0, sizeof(*c));
    c->mpi = mpi;
    c->axis = axis;
    MPI_CHECK(MPI_Comm_size(mpi, &c->size));
    MPI_CHECK(MPI_Comm_rank(mpi, &c->rank));
    ncclUniqueId id;
    memset(&id, 0, sizeof(id));
    if (c->rank == 0) NCCL_CHECK(ncclGetUniqueId(&id));
    MPI_CHECK(MPI_Bcast(&id, (int)sizeof(id), MPI_BYTE, 0, mpi));
    ncclComm_t nccl;
    NCCL_CHECK(ncclCommInitRank(&nccl, c->size, id, c->rank));
    NcclGroup* g = live_add(nccl);
    if (channels && use_channels && c->size >= 2) {
        // both directions, with two ranks too: then each way to the one
        // peer has two channels (see channel_to)
        make_channels(g, c->size, c->rank, 1);
        make_channels(g, c->size, c->rank, -1);
        connect_channels(g);
    }
    c->backend = g;
}

static void flush_p2p(void);
static void channels_drain(void);

// Waits for the group's operations, then frees its channels, communicator and stream.
static void free_nccl_group(Comm* c) {
    NcclGroup* g = (NcclGroup*)c->backend;
    if (!g) return;
    flush_p2p();
    channels_drain();
    for (int i = 0; i < 2; i++) {
        if (g->to[i]) live_free(g->to[i]);
        if (g->from[i]) live_free(g->from[i]);
    }
    live_free(g);
    c->backend = NULL;
}

// The event (and the shared stream) go with the last group.
static void shared_resources_release_if_unused(void) {
    if (live_groups || !compute_ready) return;
    double last = comm_device_wait_seconds();  // the last spans, before their events go
    if (last > 0) comm_add_wait(last);
    comm_stats_device_waits(NULL);
    device_clock_free(&wait_clock);
    CUDA_CHECK(cudaEventDestroy(compute_ready));
    CUDA_CHECK(cudaEventDestroy(comm_done));
    compute_ready = comm_done = NULL;
    if (shared_stream) CUDA_CHECK(cudaStreamDestroy(shared_stream));
    shared_stream = NULL;
    free(waiting);
    waiting = NULL;
    cap_waiting = 0;
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
    decide_streams();  // collective over the world (every rank calls comm_create)
    // NCCL needs one GPU per rank of a communicator; say so instead of hanging
    int gpus = 0;
    CUDA_CHECK(cudaGetDeviceCount(&gpus));
    char msg[256];
    snprintf(msg, sizeof(msg), "%d ranks run on one node and some of them share a GPU (this rank sees %d): "
             "NCCL needs one GPU per rank; start at most one rank per GPU on each node",
             runtime_local_size(), gpus);
    fail_if_any(gpu_shared_on_node(), msg);
    make_comm(world, MPI_COMM_WORLD, COMM_WORLD_AXIS, 1);
    if (!mesh || !axes) return;
    for (int a = 0; a < NUM_AXES; a++) make_comm(&axes[a], mesh->axis_comm[a], a, a == AXIS_PP || a == AXIS_CP);
}

// --comm hand runs chapter 1's algorithms over MPI on host buffers: the
// CPU backend's. Here the library (NCCL) runs every collective.
void comm_register_hand(const CommHandAlgorithms* algorithms) { (void)algorithms; }
const char* comm_set_impl(CommImpl which) {
    if (which == COMM_IMPL_HAND)
        return "--comm hand runs chapter 1's hand-written collectives on the CPU backend only; "
               "use --comm library here, or build with BACKEND=cpu";
    return NULL;
}
const char* comm_impl_name(void) { return "library"; }

void comm_destroy(Comm* world, Comm axes[NUM_AXES]) {
    // the MPI communicators belong to the mesh, which frees them; the NCCL
    // ones are ours
    free_nccl_group(world);
    memset(world, 0, sizeof(*world));
    if (axes)
        for (int a = 0; a < NUM_AXES; a++) {
            free_nccl_group(&axes[a]);
            memset(&axes[a], 0, sizeof(Comm));
        }
    shared_resources_release_if_unused();
}

void comm_create_group(Comm* g, const Mesh* mesh, unsigned axes) {
    int slot;
    MPI_Comm mpi = comm_group_split_axes(mesh, axes, &slot);
    make_comm(g, mpi, slot, 0);
    g->axes = axes;
    g->owns_mpi = 1;
}

void comm_create_group_ranks(Comm* g, const int* ranks, int n, const char* name) {
    decide_streams();  // here too, before the non-members return: collective over the world
    int slot;
    MPI_Comm mpi = comm_group_split_ranks(ranks, n, name, &slot);
    if (mpi == MPI_COMM_NULL) {  // not a member
        memset(g, 0, sizeof(*g));
        g->mpi = MPI_COMM_NULL;
        g->axis = slot;
        g->rank = -1;
        return;
    }
    make_comm(g, mpi, slot, 0);  // the NCCL communicator: the members only
    g->owns_mpi = 1;
}

void comm_destroy_group(Comm* g) {
    free_nccl_group(g);
    if (g->owns_mpi && g->mpi != MPI_COMM_NULL) MPI_CHECK(MPI_Comm_free(&g->mpi));
    memset(g, 0, sizeof(*g));
    g->mpi = MPI_COMM_NULL;
    shared_resources_release_if_unused();
}

// NCCL progresses by itself (see the top of the file): nothing to drive.
int comm_progress_on(void) { return 0; }
void comm_progress(void) {}

// ---------------------------------------------------------------- held point-to-point

// A request owns one event, created here and destroyed when it completes.
static void start(CommRequest* req) {
    memset(req, 0, sizeof(*req));
    req->active = 1;
    comm_request_started(req);
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
    NcclGroup* group;
    CommRequest* req;
} HeldP2P;

#define MAX_HELD 1024
static HeldP2P held[MAX_HELD];
static int num_held = 0;

static void hold_p2p(const Comm* c, int is_send, float* buf, size_t n, int peer, CommRequest* req) {
    CHECK(num_held < MAX_HELD, "more than %d comm_isend/comm_irecv started and not waited for", MAX_HELD);
    start(req);
    CUDA_CHECK(cudaEventRecord((cudaEvent_t)req->device_event, cuda_compute_stream));
    held[num_held++] = (HeldP2P){is_send, buf, n, peer, group_of(c), req};
}

// The held operations' waits for their compute; then, inside the caller's
// ncclGroupStart/End, the operations themselves.
static void held_wait_for_compute(void) {
    for (int i = 0; i < num_held; i++)
        CUDA_CHECK(cudaStreamWaitEvent(held[i].group->stream, (cudaEvent_t)held[i].req->device_event, 0));
}

static void queue_held_in_group(void) {
    for (int i = 0; i < num_held; i++) {
        HeldP2P* h = &held[i];
        if (h->count == 0) continue;
        // a group over several streams makes them all wait for each other
        // (NCCL: "Mixing multiple streams within the same group")
        if (h->is_send) NCCL_CHECK(ncclSend(h->buf, h->count, ncclFloat, h->peer, h->group->nccl, h->group->stream));
        else NCCL_CHECK(ncclRecv(h->buf, h->count, ncclFloat, h->peer, h->group->nccl, h->group->stream));
    }
}

// After the group: each held request's event now marks its end.
static void held_done(void) {
    for (int i = 0; i < num_held; i++)
        CUDA_CHECK(cudaEventRecord((cudaEvent_t)held[i].req->device_event, held[i].group->stream));
    num_held = 0;
}

// Queues the held operations as one group of their own. Every comm_* call
// passes here first (or through channels_pump itself), so it also issues
// the channels' operations whose turn has come.
static void flush_p2p(void) {
    channels_pump();
    if (num_held == 0) return;
    channels_drain();
    held_wait_for_compute();
    NCCL_CHECK(ncclGroupStart());
    queue_held_in_group();
    NCCL_CHECK(ncclGroupEnd());
    held_done();
}

// ---------------------------------------------------------------- ordering helpers

// The group's communication stream waits for all compute queued so far.
static void after_compute(cudaStream_t stream) {
    CUDA_CHECK(cudaEventRecord(compute_ready, cuda_compute_stream));
    CUDA_CHECK(cudaStreamWaitEvent(stream, compute_ready, 0));
}

// The compute stream reaches a wait for communication: the wait's span
// starts (comm_device_wait_seconds).
static void wait_span_begin(void) {
    device_clock_start(&wait_clock);
    comm_wait_clocks_each(device_clock_start);  // a chapter's share (comm_wait_clock_begin)
}

// The compute stream waits for everything queued so far on stream (the
// operation just queued): later compute, and every operation queued after
// it (after_compute), sees its result. The host does not wait.
static void compute_after(cudaStream_t stream) {
    CUDA_CHECK(cudaEventRecord(comm_done, stream));
    CUDA_CHECK(cudaStreamWaitEvent(cuda_compute_stream, comm_done, 0));
}

// The compute stream passes the wait: the span ends.
static void wait_span_end(void) {
    device_clock_stop(&wait_clock);
    comm_wait_clocks_each(device_clock_stop);
}

// Every blocking call: held point-to-point operations go first, then the
// communication stream waits for compute (an event, not the host).
static void begin_blocking(const Comm* c) {
    flush_p2p();
    channels_drain();
    wait_span_begin();
    after_compute(stream_of(c));
}

// ... and the compute stream waits for the operation: its result is in
// place for every later kernel, copy and operation; the host sees it through
// mem_to_host or device_synchronize, which wait for the compute stream.
static void end_blocking(const Comm* c) {
    compute_after(stream_of(c));
    wait_span_end();
}

// Blocking send, recv and sendrecv take the held operations into their own
// group instead: "irecv from a peer, then a blocking send to it" on both
// ranks is one group per rank, in which receive and send progress together
// (two groups in a row would leave each receive waiting for a send queued
// behind it).
static void begin_blocking_p2p(const Comm* c) {
    channels_drain();
    held_wait_for_compute();
    wait_span_begin();
    after_compute(stream_of(c));
    NCCL_CHECK(ncclGroupStart());
    queue_held_in_group();
}

static void end_blocking_p2p(const Comm* c) {
    NCCL_CHECK(ncclGroupEnd());
    held_done();
    end_blocking(c);
}

// ---------------------------------------------------------------- channels

// The channel of a send to / a receive from peer (a ring neighbour), or
// NULL: no channels here, or not a neighbour (the held path). With two
// ranks, where activations and gradients go to the same peer, the
// messages alternate between the peer's two channels of each direction
// (the +1 and the -1 one): the i-th message to the peer goes on to[i % 2]
// and the peer takes its i-th message from it from from[1 - i % 2], the
// same communicator. With one channel per direction at pp = 2 and NCCL's
// launch order, a gradient sent behind an activation still in flight holds
// back everything after it: chapter 5's interleaved schedule deadlocks
// (tests/test_cuda_queue.c, FIX_PAIR). take: the message is sent now (a
// blocking or non-blocking call with a count), so the next one alternates.
static NcclGroup* channel_to(const Comm* c, int peer, int take) {
    NcclGroup* g = group_of(c);
    int n = c->size;
    if (n < 2) return NULL;
    if (n == 2 && peer == 1 - c->rank) {
        NcclGroup* ch = g->to[g->sent % 2];
        if (ch && take) g->sent++;
        return ch;
    }
    if (peer == (c->rank + 1) % n) return g->to[0];
    if (peer == (c->rank + n - 1) % n) return g->to[1];
    return NULL;
}
static NcclGroup* channel_from(const Comm* c, int peer, int take) {
    NcclGroup* g = group_of(c);
    int n = c->size;
    if (n < 2) return NULL;
    if (n == 2 && peer == 1 - c->rank) {
        NcclGroup* ch = g->from[1 - g->received % 2];
        if (ch && take) g->received++;
        return ch;
    }
    if (peer == (c->rank + n - 1) % n) return g->from[1];
    if (peer == (c->rank + 1) % n) return g->from[0];
    return NULL;
}

// Queues a send (to rank 1 of the channel) or a receive (from rank 0) on
// its channel, after the compute queued so far; ev, if given, then marks
// its end.
static void queue_on_channel(NcclGroup* ch, int is_send, float* buf, size_t n, cudaEvent_t ev) {
    after_compute(ch->stream);
    if (n && is_send) NCCL_CHECK(ncclSend(buf, n, ncclFloat, 1, ch->nccl, ch->stream));
    if (n && !is_send) NCCL_CHECK(ncclRecv(buf, n, ncclFloat, 0, ch->nccl, ch->stream));
    if (ev) CUDA_CHECK(cudaEventRecord(ev, ch->stream));
}

// One operation in flight per channel, in the order of the calls. With
// NCCL_LAUNCH_ORDER_IMPLICIT=1, NCCL makes every NCCL kernel on a device
// start after the one the host issued before it has started (the launch
// stream waits for the device's launchOrder stream: ncclLaunchPrepare and
// ncclLaunchFinish in NCCL's src/enqueue.cc; "Using multiple NCCL
// communicators concurrently" in its user guide). A channel's second
// operation cannot start before its first has ended (one stream), and the
// first of a send ends only when the peer's receive runs: queued at once,
// it would hold back every operation issued after it, on any channel or
// communicator, until that receive. So a channel's stream holds one
// operation at most, and a later one waits on the host (ChannelOp) in one
// queue, in the order of the calls; it is issued once its channel's
// previous operation has ended, at the next comm_* call or in any polling
// wait (channels_pump). Every other call that issues NCCL work first waits
// on the host until the queue is empty (channels_drain): issued past a
// waiting operation, a collective whose compute waits for a message could
// hold back, in NCCL's launch order, the operation that message needs (the
// test finds such cycles: any_order). comm_wait on a waiting request waits
// on the host until it is issued (the compute stream can only wait for an
// operation already issued). Issued late, an operation still waits on the
// device for the compute queued before its call (its request's event,
// recorded then).
// (ChannelOp and the queue `waiting` are declared at the top of the file.)

// Non-zero when the stream has nothing left to run.
static int stream_idle(cudaStream_t stream) {
    cudaError_t q = cudaStreamQuery(stream);
    if (q == cudaSuccess) return 1;
    if (q != cudaErrorNotReady) CUDA_CHECK(q);
    if (cudaPeekAtLastError() == cudaErrorNotReady) (void)cudaGetLastError();  // not an error: see comm_test
    return 0;
}

static int channel_free(const NcclGroup* ch) { return n_waiting == 0 && stream_idle(ch->stream); }

// Issues the waiting operations, oldest first, while the oldest one's
// channel has ended its previous operation.
static void channels_pump(void) {
    int done = 0;
    while (done < n_waiting && stream_idle(waiting[done].ch->stream)) {
        ChannelOp op = waiting[done++];
        cudaEvent_t ev = (cudaEvent_t)op.req->device_event;
        CUDA_CHECK(cudaStreamWaitEvent(op.ch->stream, ev, 0));  // the compute before the call
        if (op.is_send) NCCL_CHECK(ncclSend(op.buf, op.n, ncclFloat, 1, op.ch->nccl, op.ch->stream));
        else NCCL_CHECK(ncclRecv(op.buf, op.n, ncclFloat, 0, op.ch->nccl, op.ch->stream));
        CUDA_CHECK(cudaEventRecord(ev, op.ch->stream));  // now its end
    }
    if (done == 0) return;
    n_waiting -= done;
    memmove(waiting, waiting + done, (size_t)n_waiting * sizeof(ChannelOp));
}

// comm_isend / comm_irecv on a channel: issued now if nothing waits and the
// channel is free, else queued (the event marks the compute before the call).
static void channel_post(NcclGroup* ch, int is_send, float* buf, size_t n, CommRequest* req) {
    channels_pump();
    cudaEvent_t ev = (cudaEvent_t)req->device_event;
    if (n == 0 || channel_free(ch)) {  // a count of 0 issues nothing
        queue_on_channel(ch, is_send, buf, n, ev);
        return;
    }
    CUDA_CHECK(cudaEventRecord(ev, cuda_compute_stream));
    if (n_waiting == cap_waiting) {
        cap_waiting = cap_waiting ? 2 * cap_waiting : 16;
        waiting = (ChannelOp*)realloc(waiting, (size_t)cap_waiting * sizeof(ChannelOp));
        CHECK(waiting != NULL, "out of host memory for the channels' waiting operations");
    }
    waiting[n_waiting++] = (ChannelOp){ch, is_send, buf, n, req};
}

// Polls until done(arg) holds, issuing waiting operations as their turn
// comes, with NCCL's errors and the watchdog watching, as wait_checked.
static void poll_until(int (*done)(const void*), const void* arg, const char* what) {
    watchdog_enter(what, "device", -1);
    for (;;) {
        channels_pump();
        if (done(arg)) break;
        check_async_errors();
        sched_yield();
    }
    watchdog_leave();
}

static int is_channel_free(const void* ch) { return channel_free((const NcclGroup*)ch); }
static int request_issued(const void* req) {
    for (int i = 0; i < n_waiting; i++)
        if (waiting[i].req == req) return 0;
    return 1;
}
static int nothing_waits(const void* unused) {
    (void)unused;
    return n_waiting == 0;
}

// A blocking call's channel: nothing waits and its earlier operations
// ended, so the operation is issued now, in the order of the calls.
static void channel_wait_free(NcclGroup* ch) {
    if (ch && !channel_free(ch)) poll_until(is_channel_free, ch, "wait for a point-to-point channel");
}

// Every waiting operation issued: before any other call issues NCCL work.
static void channels_drain(void) {
    if (n_waiting) poll_until(nothing_waits, NULL, "wait for the channels' waiting operations");
}

// device.cu's cuda_comm_wait, before a cudaFree (which synchronises the
// whole device, unpolled): every waiting operation issued and every
// communicator's and channel's stream idle, polled and watched.
static int all_streams_idle(const void* unused) {
    (void)unused;
    if (n_waiting) return 0;
    for (NcclGroup* g = live_groups; g; g = g->next)
        if (!stream_idle(g->stream)) return 0;
    return 1;
}
static void comm_streams_wait(void) { poll_until(all_streams_idle, NULL, "wait for the communication streams"); }

// A blocking send or receive on channels: queued as begin_blocking does
// (queue_on_channel orders it after the compute), then the compute stream
// waits for the channels only, which hold this direction's transfers and
// nothing else.
static void begin_channels(void) {
    flush_p2p();
    wait_span_begin();
}
static void end_channels(NcclGroup* a, NcclGroup* b) {
    if (a) compute_after(a->stream);
    if (b) compute_after(b->stream);
    wait_span_end();
}

static void scale_for_avg(const Comm* c, float* buf, size_t n, CommOp op) {
    if (op == COMM_AVG && c->size > 1) ops_scale(buf, n, 1.0f / (float)c->size);
}

// A local block copy that is part of a collective (scatter, gather, ...),
// queued on the group's stream with the NCCL operations.
static void copy_on_comm_stream(const Comm* c, float* dst, const float* src, size_t n) {
    if (n == 0 || dst == src) return;
    CUDA_CHECK(cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyDeviceToDevice, stream_of(c)));
}

// ---------------------------------------------------------------- blocking
// A count of 0 moves nothing: it is counted, and NCCL is not called.

void comm_allreduce(const Comm* c, float* buf, size_t n, CommOp op) {
    comm_tally(c, COLL_ALLREDUCE, n * sizeof(float), 2.0 * comm_ring_factor(c));
    if (n == 0) return;
    begin_blocking(c);
    NCCL_CHECK(ncclAllReduce(buf, buf, n, ncclFloat, ncclSum, nccl_of(c), stream_of(c)));
    end_blocking(c);
    scale_for_avg(c, buf, n, op);
}

void comm_reduce_scatter(const Comm* c, const float* send, float* recv, size_t n, CommOp op) {
    comm_tally(c, COLL_REDUCE_SCATTER, n * c->size * sizeof(float), comm_ring_factor(c));
    if (n == 0) return;
    begin_blocking(c);
    NCCL_CHECK(ncclReduceScatter(send, recv, n, ncclFloat, ncclSum, nccl_of(c), stream_of(c)));
    end_blocking(c);
    scale_for_avg(c, recv, n, op);
}

void comm_allgather(const Comm* c, const float* send, float* recv, size_t n) {
    comm_tally(c, COLL_ALLGATHER, n * c->size * sizeof(float), comm_ring_factor(c));
    if (n == 0) return;
    begin_blocking(c);
    NCCL_CHECK(ncclAllGather(send, recv, n, ncclFloat, nccl_of(c), stream_of(c)));
    end_blocking(c);
}

// Uneven blocks: every rank sends its block to every other rank and receives
// theirs, all in one group; its own block is a local copy.
void comm_allgatherv(const Comm* c, const float* send, float* recv, const size_t* counts_in,
                     const size_t* displs_in) {
    size_t total = 0;
    for (int r = 0; r < c->size; r++) total += counts_in[r];
    comm_tally(c, COLL_ALLGATHER, total * sizeof(float), comm_ring_factor(c));
    begin_blocking(c);
    size_t mine = counts_in[c->rank];
    copy_on_comm_stream(c, recv + displs_in[c->rank], send, mine);
    NCCL_CHECK(ncclGroupStart());
    for (int r = 0; r < c->size; r++) {
        if (r == c->rank) continue;
        if (mine) NCCL_CHECK(ncclSend(send, mine, ncclFloat, r, nccl_of(c), stream_of(c)));
        if (counts_in[r])
            NCCL_CHECK(ncclRecv(recv + displs_in[r], counts_in[r], ncclFloat, r, nccl_of(c), stream_of(c)));
    }
    NCCL_CHECK(ncclGroupEnd());
    end_blocking(c);
}

void comm_broadcast(const Comm* c, float* buf, size_t n, int root) {
    comm_tally(c, COLL_BROADCAST, n * sizeof(float), c->size > 1 ? 1.0 : 0.0);
    if (n == 0) return;
    begin_blocking(c);
    NCCL_CHECK(ncclBroadcast(buf, buf, n, ncclFloat, root, nccl_of(c), stream_of(c)));
    end_blocking(c);
}

void comm_reduce(const Comm* c, const float* send, float* recv, size_t n, int root, CommOp op) {
    comm_tally(c, COLL_REDUCE, n * sizeof(float), c->size > 1 ? 1.0 : 0.0);
    if (n == 0) return;
    begin_blocking(c);
    NCCL_CHECK(ncclReduce(send, recv, n, ncclFloat, ncclSum, root, nccl_of(c), stream_of(c)));
    end_blocking(c);
    if (c->rank == root) scale_for_avg(c, recv, n, op);
}

// The root sends block r to rank r, every other rank receives one block.
void comm_scatter(const Comm* c, const float* send, float* recv, size_t n, int root) {
    comm_tally(c, COLL_SCATTER, n * c->size * sizeof(float), comm_ring_factor(c));
    if (n == 0) return;
    begin_blocking(c);
    if (c->rank == root) copy_on_comm_stream(c, recv, send + (size_t)root * n, n);
    NCCL_CHECK(ncclGroupStart());
    if (c->rank == root) {
        for (int r = 0; r < c->size; r++)
            if (r != root) NCCL_CHECK(ncclSend(send + (size_t)r * n, n, ncclFloat, r, nccl_of(c), stream_of(c)));
    } else {
        NCCL_CHECK(ncclRecv(recv, n, ncclFloat, root, nccl_of(c), stream_of(c)));
    }
    NCCL_CHECK(ncclGroupEnd());
    end_blocking(c);
}

// Every rank sends its block to the root, which receives block r from rank r.
void comm_gather(const Comm* c, const float* send, float* recv, size_t n, int root) {
    comm_tally(c, COLL_GATHER, n * c->size * sizeof(float), comm_ring_factor(c));
    if (n == 0) return;
    begin_blocking(c);
    if (c->rank == root) copy_on_comm_stream(c, recv + (size_t)root * n, send, n);
    NCCL_CHECK(ncclGroupStart());
    if (c->rank == root) {
        for (int r = 0; r < c->size; r++)
            if (r != root) NCCL_CHECK(ncclRecv(recv + (size_t)r * n, n, ncclFloat, r, nccl_of(c), stream_of(c)));
    } else {
        NCCL_CHECK(ncclSend(send, n, ncclFloat, root, nccl_of(c), stream_of(c)));
    }
    NCCL_CHECK(ncclGroupEnd());
    end_blocking(c);
}

// Block j goes to rank j, block i arrives from rank i: p-1 sends and p-1
// receives in one group, the own block a local copy.
void comm_alltoall(const Comm* c, const float* send, float* recv, size_t n) {
    comm_tally(c, COLL_ALLTOALL, n * c->size * sizeof(float), comm_ring_factor(c));
    if (n == 0) return;
    begin_blocking(c);
    copy_on_comm_stream(c, recv + (size_t)c->rank * n, send + (size_t)c->rank * n, n);
    NCCL_CHECK(ncclGroupStart());
    for (int r = 0; r < c->size; r++) {
        if (r == c->rank) continue;
        NCCL_CHECK(ncclSend(send + (size_t)r * n, n, ncclFloat, r, nccl_of(c), stream_of(c)));
        NCCL_CHECK(ncclRecv(recv + (size_t)r * n, n, ncclFloat, r, nccl_of(c), stream_of(c)));
    }
    NCCL_CHECK(ncclGroupEnd());
    end_blocking(c);
}

// The sends and receives of an all-to-all-v, queued on c's stream (the
// block to itself a copy there), after counting the call.
static void queue_alltoallv(const Comm* c, const float* send, const size_t* send_counts,
                            const size_t* send_displs, float* recv, const size_t* recv_counts,
                            const size_t* recv_displs) {
    int p = c->size, me = c->rank;
    copy_on_comm_stream(c, recv + recv_displs[me], send + send_displs[me], send_counts[me]);
    NCCL_CHECK(ncclGroupStart());
    for (int r = 0; r < p; r++) {
        if (r == me) continue;
        if (send_counts[r])
            NCCL_CHECK(ncclSend(send + send_displs[r], send_counts[r], ncclFloat, r, nccl_of(c), stream_of(c)));
        if (recv_counts[r])
            NCCL_CHECK(ncclRecv(recv + recv_displs[r], recv_counts[r], ncclFloat, r, nccl_of(c), stream_of(c)));
    }
    NCCL_CHECK(ncclGroupEnd());
}

// bytes: what this rank sends; bus bytes: of that, what leaves the rank
static void tally_alltoallv(const Comm* c, const size_t* send_counts, const size_t* recv_counts) {
    int p = c->size, me = c->rank;
    size_t sent = 0;
    for (int r = 0; r < p; r++) sent += send_counts[r];
    comm_tally_bytes(c, COLL_ALLTOALL, (double)sent * sizeof(float),
                     (double)(sent - send_counts[me]) * sizeof(float));
    CHECK(send_counts[me] == recv_counts[me], "comm_alltoallv: this rank sends itself %zu floats but expects %zu",
          send_counts[me], recv_counts[me]);
}

void comm_alltoallv(const Comm* c, const float* send, const size_t* send_counts,
                    const size_t* send_displs, float* recv, const size_t* recv_counts,
                    const size_t* recv_displs) {
    tally_alltoallv(c, send_counts, recv_counts);
    begin_blocking(c);
    queue_alltoallv(c, send, send_counts, send_displs, recv, recv_counts, recv_displs);
    end_blocking(c);
}

// A blocking send returns when the data has arrived: like an MPI_Send that
// waits for its receive (the hand-written collectives never rely on buffering).
void comm_send(const Comm* c, const float* buf, size_t n, int peer) {
    comm_tally(c, COLL_SEND, n * sizeof(float), 1.0);
    if (n == 0) return;
    NcclGroup* ch = channel_to(c, peer, 1);
    if (ch) {
        channel_wait_free(ch);
        begin_channels();
        queue_on_channel(ch, 1, (float*)buf, n, NULL);
        end_channels(ch, NULL);
        return;
    }
    begin_blocking_p2p(c);
    NCCL_CHECK(ncclSend(buf, n, ncclFloat, peer, nccl_of(c), stream_of(c)));
    end_blocking_p2p(c);
}

void comm_recv(const Comm* c, float* buf, size_t n, int peer) {
    comm_tally(c, COLL_RECV, n * sizeof(float), 0.0);
    if (n == 0) return;
    NcclGroup* ch = channel_from(c, peer, 1);
    if (ch) {  // waits for its own message only
        channel_wait_free(ch);
        begin_channels();
        queue_on_channel(ch, 0, buf, n, NULL);
        end_channels(ch, NULL);
        return;
    }
    begin_blocking_p2p(c);
    NCCL_CHECK(ncclRecv(buf, n, ncclFloat, peer, nccl_of(c), stream_of(c)));
    end_blocking_p2p(c);
}

// The send and the receive in one group, so they progress together: a ring
// step where every rank sends right and receives from the left cannot
// deadlock. On channels too: a group over two communicators and two streams
// (NCCL: "Mixing multiple streams within the same ncclGroupStart/End()
// group"), issued once both channels are free.
void comm_sendrecv(const Comm* c, const float* send, size_t send_n, int dest, float* recv,
                   size_t recv_n, int source) {
    comm_tally(c, COLL_SEND, send_n * sizeof(float), 1.0);
    comm_tally(c, COLL_RECV, recv_n * sizeof(float), 0.0);
    if (send_n == 0 && recv_n == 0) return;
    NcclGroup* to = send_n ? channel_to(c, dest, 1) : NULL;
    NcclGroup* from = recv_n ? channel_from(c, source, 1) : NULL;
    if ((to || !send_n) && (from || !recv_n)) {
        channel_wait_free(to);
        channel_wait_free(from);
        begin_channels();
        NCCL_CHECK(ncclGroupStart());
        if (to) queue_on_channel(to, 1, (float*)send, send_n, NULL);
        if (from) queue_on_channel(from, 0, recv, recv_n, NULL);
        NCCL_CHECK(ncclGroupEnd());
        end_channels(to, from);
        return;
    }
    // A neighbour on one side only (more than two ranks): each direction
    // where its peer expects it, the neighbour's on their channel, the
    // other's on the group's communicator (the peer's own call makes the
    // same choice for the same pair), in one group; the compute stream
    // waits for both (end_blocking_p2p's, with the channel's wait inside).
    channel_wait_free(to);
    channel_wait_free(from);
    begin_blocking_p2p(c);
    if (to) queue_on_channel(to, 1, (float*)send, send_n, NULL);
    else if (send_n) NCCL_CHECK(ncclSend(send, send_n, ncclFloat, dest, nccl_of(c), stream_of(c)));
    if (from) queue_on_channel(from, 0, recv, recv_n, NULL);
    else if (recv_n) NCCL_CHECK(ncclRecv(recv, recv_n, ncclFloat, source, nccl_of(c), stream_of(c)));
    NCCL_CHECK(ncclGroupEnd());
    held_done();
    if (to) compute_after(to->stream);
    if (from) compute_after(from->stream);
    end_blocking(c);
}

// Every rank's queued work is done, then the ranks meet.
void comm_barrier(const Comm* c) {
    comm_tally(c, COLL_BARRIER, 0, 0.0);
    flush_p2p();
    channels_drain();
    wait_checked(cuda_compute_stream, NULL);
    double t0 = now_seconds();
    for (NcclGroup* g = live_groups; g; g = g->next) wait_checked(g->stream, NULL);
    MPI_CHECK(MPI_Barrier(c->mpi));
    comm_add_wait(now_seconds() - t0);
}

// ---------------------------------------------------------------- non-blocking

// A non-blocking collective: queued at once (after held point-to-point
// operations and the compute queued so far), the request's event recorded
// behind it.
// The seconds spent queueing count as progress (comm_progress_seconds).
static double begin_nonblocking(const Comm* c) {
    double t0 = now_seconds();
    flush_p2p();
    channels_drain();
    after_compute(stream_of(c));
    return t0;
}

static void end_nonblocking(const Comm* c, CommRequest* req, double t0) {
    CUDA_CHECK(cudaEventRecord((cudaEvent_t)req->device_event, stream_of(c)));
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
    double t0 = begin_nonblocking(c);
    if (n) NCCL_CHECK(ncclAllReduce(buf, buf, n, ncclFloat, ncclSum, nccl_of(c), stream_of(c)));
    end_nonblocking(c, req, t0);
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
    double t0 = begin_nonblocking(c);
    if (n) NCCL_CHECK(ncclReduceScatter(send, recv, n, ncclFloat, ncclSum, nccl_of(c), stream_of(c)));
    end_nonblocking(c, req, t0);
}

void comm_iallgather(const Comm* c, const float* send, float* recv, size_t n, CommRequest* req) {
    comm_tally(c, COLL_ALLGATHER, n * c->size * sizeof(float), comm_ring_factor(c));
    start(req);
    double t0 = begin_nonblocking(c);
    if (n) NCCL_CHECK(ncclAllGather(send, recv, n, ncclFloat, nccl_of(c), stream_of(c)));
    end_nonblocking(c, req, t0);
}

void comm_ibroadcast(const Comm* c, float* buf, size_t n, int root, CommRequest* req) {
    comm_tally(c, COLL_BROADCAST, n * sizeof(float), c->size > 1 ? 1.0 : 0.0);
    start(req);
    double t0 = begin_nonblocking(c);
    if (n) NCCL_CHECK(ncclBroadcast(buf, buf, n, ncclFloat, root, nccl_of(c), stream_of(c)));
    end_nonblocking(c, req, t0);
}

void comm_ialltoallv(const Comm* c, const float* send, const size_t* send_counts,
                     const size_t* send_displs, float* recv, const size_t* recv_counts,
                     const size_t* recv_displs, CommRequest* req) {
    tally_alltoallv(c, send_counts, recv_counts);
    start(req);
    double t0 = begin_nonblocking(c);
    queue_alltoallv(c, send, send_counts, send_displs, recv, recv_counts, recv_displs);
    end_nonblocking(c, req, t0);
}

// On a channel: queued at once, after the compute before the call, the
// request's event behind it. Elsewhere held (see the top).
void comm_isend(const Comm* c, const float* buf, size_t n, int peer, CommRequest* req) {
    comm_tally(c, COLL_SEND, n * sizeof(float), 1.0);
    NcclGroup* ch = channel_to(c, peer, n > 0);
    if (!ch) {
        hold_p2p(c, 1, (float*)buf, n, peer, req);
        return;
    }
    start(req);
    double t0 = now_seconds();
    channel_post(ch, 1, (float*)buf, n, req);
    comm_add_progress(now_seconds() - t0);
}

void comm_irecv(const Comm* c, float* buf, size_t n, int peer, CommRequest* req) {
    comm_tally(c, COLL_RECV, n * sizeof(float), 0.0);
    NcclGroup* ch = channel_from(c, peer, n > 0);
    if (!ch) {
        hold_p2p(c, 0, buf, n, peer, req);
        return;
    }
    start(req);
    double t0 = now_seconds();
    channel_post(ch, 0, buf, n, req);
    comm_add_progress(now_seconds() - t0);
}

// The end of a request: later compute is ordered after it (the compute
// stream waits for its event; with span, comm_wait's wait span ends there),
// AVG is applied (on the compute stream, after that), the event is freed
// (CUDA frees it once the pending work on it is done).
static void finish(CommRequest* req, int span) {
    comm_request_done(req);
    cudaEvent_t ev = (cudaEvent_t)req->device_event;
    CUDA_CHECK(cudaStreamWaitEvent(cuda_compute_stream, ev, 0));
    if (span) wait_span_end();
    if (req->scale_buf) ops_scale(req->scale_buf, req->scale_count, req->scale);
    CUDA_CHECK(cudaEventDestroy(ev));
    req->device_event = NULL;
    req->active = 0;
}

void comm_wait(CommRequest* req) {
    if (!req->active) return;
    flush_p2p();
    if (!request_issued(req)) poll_until(request_issued, req, "wait for a channel to issue a request");
    comm_request_current(req);
    // Stream-ordered, as the blocking calls: the compute stream waits for the
    // request's event and the host goes on (see the top of the file)
    wait_span_begin();
    finish(req, 1);
}

int comm_test(CommRequest* req) {
    if (!req->active) return 1;
    double t0 = now_seconds();
    flush_p2p();
    comm_request_current(req);
    // not issued yet (waiting for its channel): its event marks only the compute before it
    cudaError_t rc = request_issued(req) ? cudaEventQuery((cudaEvent_t)req->device_event) : cudaErrorNotReady;
    int done = rc != cudaErrorNotReady;
    if (!done) {
        // not an error: still in flight. Clear it in case the runtime kept it
        // as the last error, so the next kernel launch check does not see it.
        if (cudaPeekAtLastError() == cudaErrorNotReady) (void)cudaGetLastError();
    } else {
        CUDA_CHECK(rc);
        finish(req, 0);
    }
    comm_add_progress(now_seconds() - t0);
    return done;
}
