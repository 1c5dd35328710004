// test_cuda_queue.c: the CUDA comm layer's queueing rules, modelled on the
// CPU, against every pipeline schedule, the ring, the MoE exchange, chapter
// 1's harness and the capstone's pipeline with its all-to-alls.
//
// No GPU is needed: the program replays what each rank's host calls
// (comm_isend, comm_recv, comm_test, comm_wait, collectives) under the rules
// common/cuda/comm.c follows, and what NCCL and CUDA then do with the queued
// operations:
//   - a group (ncclGroupStart/End) is one operation, posted on every stream
//     it uses; it starts when it is at the head of all of them (a stream is
//     FIFO) and ends when every operation in it has completed;
//   - a receive completes once its send has started (data flows); a send
//     completes once its receive has started when the message is larger
//     than NCCL's buffer (NCCL_BUFFSIZE, 4 MiB by default), else as soon as
//     it starts; sends and receives match in order per (communicator, from,
//     to);
//   - a collective completes once every member has started it;
//   - the code now is stream-ordered: an operation waits (an event) for the
//     compute queued before it (a held one: before its comm_isend/irecv), and
//     a blocking call or comm_wait makes the compute stream wait for the
//     operation's end; the host goes on. The compute stream is modelled as
//     its waits only (kernels always end); the host waits for it in
//     mem_to_host and device_synchronize (before the loss's MPI_Bcast, at
//     the end, H_SYNC);
//   - the code before (the held rules) waited on the host instead: on a
//     stream (every operation queued on it has ended) or on one request's
//     event (its own operation has ended).
// And NCCL's two rules (with the code's rule sets, nccl_rules below):
//   - lazy connection. NCCL connects a point-to-point pair at its first use:
//     the first ncclSend/ncclRecv to a peer marks its connections
//     (p2pTaskAppend in NCCL's src/enqueue.cc, "Mark channels that need
//     pre-connect"), ncclGroupEnd sets them up before it launches anything
//     and waits (groupLaunch -> ncclP2PPreconnectFunc in src/group.cc), and
//     the set-up trades addresses with the peer over the bootstrap network,
//     a send to it then a receive from it (ncclTransportP2pSetup in
//     src/transport.cc). So a pair's first call blocks the host until the
//     peer's host makes its own first call on that pair. Collectives connect
//     at their first call too (NCCL_RUNTIME_CONNECT, default 1 since 2.22,
//     docs/userguide/source/env.rst; ncclCollPreconnect in src/group.cc):
//     the first collective of a communicator blocks the host until every
//     member's host has made its first one.
//   - implicit launch order. With NCCL_LAUNCH_ORDER_IMPLICIT=1 (since 2.26,
//     env.rst; "Using multiple NCCL communicators concurrently" in
//     docs/userguide/source/usage/communicators.rst) every NCCL kernel on a
//     device starts only after the one its host issued before it, on any
//     communicator, has started: the launch stream waits for the device's
//     launchOrder stream, which holds the previous launch's completion event
//     (ncclLaunchPrepare and ncclLaunchFinish in src/enqueue.cc, with CUDA
//     12.3's launch completion events; getImplicitOrder there).
// A state in which no host can go on and no group or compute wait can end,
// with work left (on a host or a stream), is a deadlock.
//
// Rule sets:
//   held     the code before the channels: comm_isend/irecv are held and
//            queued as one group at the next comm_* call (comm_test and
//            comm_wait flush them; a blocking send/recv takes them into its
//            own group); every operation of a communicator runs on its one
//            stream; blocking calls wait on the host for the whole stream.
//            Modelled without NCCL's two rules, as the code of the time
//            was reviewed (history).
//   channels the code now (docs/cuda.md): point-to-point with a ring
//            neighbour goes on a channel of its own, one NCCL communicator
//            and stream per direction (this rank to the next, the next to
//            this rank, ...); a channel carries one direction only, so its
//            sends and receives meet in the same order; a blocking receive
//            waits for its own message only; collectives keep the
//            communicator's stream; stream-ordered; both NCCL rules. With
//            the mitigations of issue 45 (fix below, all on by default):
//            FIX_EAGER   every channel connected when it is made;
//            FIX_ONE     one operation in flight per channel: a later one
//                        waits on the host, in the order of the calls, and
//                        is issued once its channel's previous operation has
//                        ended, at a comm_* call or in a polling wait; any
//                        other call that issues NCCL work waits on the host
//                        until every waiting operation is issued (so NCCL's
//                        launch order stays the order of the calls), a
//                        blocking send or receive also for its channel to be
//                        free, comm_wait for its request to be issued;
//            FIX_PAIR    a group of two ranks has two channels per
//                        direction, its messages to the peer alternating
//                        between them (both sides count the same way);
//            FIX_SENDRECV comm_sendrecv is one group over its two channels.
//            Switched off, the model must find today's deadlocks (the
//            self-test): the code before issue 45 is channels with fix 0.
//            Each mitigation is shown needed by a case that deadlocks
//            without it, and issuing a waiting operation out of the calls'
//            order (any_order) by one too.
//   shared   the held rules on one stream for every communicator, as the
//            code runs them with NCCL_LAUNCH_ORDER_IMPLICIT=0 or an NCCL
//            before 2.26 (stream-ordered; lazy connection, no launch order).
// Host timing is modelled twice: hosts run ahead of the GPU (comm_test sees
// "not done", the usual case), and the GPU keeps up (comm_test sees "done").
//   build/tests/test_cuda_queue [--show SCHEDULE PP M V | --harness N FIX]   (QUEUE_DEBUG=1: the stuck state)
//
// modules: 05_pipeline/schedule
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "schedule.h"
#include "test.h"

#define MAX_RANKS 8
#define NCOMM 12           // communicators (see the layout of a pp x ep mesh below)
#define MAX_SEQ 1024       // operations per (communicator, from, to)
#define MAX_POOL 2         // channels per direction at most (FIX_PAIR)
#define NSTREAM (NCOMM + NCOMM * MAX_RANKS * MAX_RANKS * MAX_POOL)
#define MAX_DEFER 1024

// RULES_HELD_QUIET_TEST: the held rules without the flush in comm_test
// (the issue's "removing the flush alone does not fix it")
// RULES_SHARED: the held rules on one stream for every communicator (an
// NCCL before 2.26, or NCCL_LAUNCH_ORDER_IMPLICIT=0)
typedef enum { RULES_HELD, RULES_CHANNELS, RULES_HELD_QUIET_TEST, RULES_SHARED } Rules;
#define HELD(S) ((S)->rules != RULES_CHANNELS)
typedef enum { HOST_AHEAD, GPU_KEEPS_UP } Timing;
enum { FIX_EAGER = 1, FIX_ONE = 2, FIX_SENDRECV = 4, FIX_PAIR = 8, FIX_ALL = 15 };

// ---------------------------------------------------------------- host programs
typedef enum {
    H_RECV, H_SEND,     // blocking comm_recv / comm_send
    H_ISEND, H_IRECV,   // comm_isend / comm_irecv into request req
    H_WAIT,             // comm_wait(req)
    H_PIPE_SEND,        // chapter 5's send(): comm_test on its send slots, then comm_isend
    H_PIPE_SENDS_WAIT,  // chapter 5's sends_wait(): comm_wait on every slot
    H_ALLREDUCE,        // any blocking collective
    H_ALLTOALLV,        // comm_alltoallv (or scatter, gather) with the peers in send / recv masks
    H_HOST_BCAST,       // mem_to_host, then an MPI call on the host (modelled as a barrier)
    H_SENDRECV,         // comm_sendrecv: send to peer, receive from peer2
    H_ICOLL,            // a non-blocking collective into request req
    H_IA2A,             // comm_ialltoallv into request req, peers in the masks
    H_SYNC,             // mem_to_host / device_synchronize: the host waits for the compute stream
    H_BARRIER,          // comm_barrier
} HostKind;

typedef struct {
    HostKind kind;
    int comm, peer, req;
    unsigned send_mask, recv_mask;
    int peer2;
} HostOp;

typedef struct {
    HostOp* op;
    int n, cap;
} Program;

static void emit(Program* p, HostOp o) {
    if (p->n == p->cap) {
        p->cap = p->cap ? 2 * p->cap : 64;
        p->op = realloc(p->op, (size_t)p->cap * sizeof(HostOp));
    }
    p->op[p->n++] = o;
}

// ---------------------------------------------------------------- the machine
typedef enum { G_SEND, G_RECV, G_COLL } GKind;
typedef struct {
    GKind kind;
    int rank, comm, peer, seq, group, chan;
} GOp;
typedef struct {
    int op0, nops, rank, done, started;
    int conn_wait;  // NCCL still connects it (the host is inside ncclGroupEnd): nothing launched yet
    int cdep;       // it starts once rank's compute stream has passed this many entries (ordered rules)
    int streams[MAX_RANKS * 2 + 2], nstreams;
} Group;
typedef struct {
    int* q;
    int head, tail;
} Stream;
typedef struct {
    int state;  // 0 inactive, 1 held, 2 queued, 3 waiting for its channel (FIX_ONE)
    int group;
} Req;
typedef struct {
    int kind, comm, peer, req;
    int cdep;    // the compute queued before comm_isend/irecv (its event)
    int stream;  // FIX_ONE: its channel
    int lane;
} Held;
typedef struct {
    int key, from, to;  // a point-to-point pair (from >= 0) or a communicator's collectives (key = comm)
} ConnWait;

typedef struct {
    int nranks, big;
    Rules rules;
    Timing timing;
    int ordered;     // blocking calls and comm_wait make the compute stream wait, not the host
    int lazy, order; // NCCL's rules in force (set by sim_reset from rules)
    unsigned fix;    // the mitigations (channels rules), FIX_ALL unless a test says otherwise
    int any_order;   // FIX_ONE without the host's order (a waiting operation issued past later ones): shown wrong
    int calls[MAX_RANKS][NCOMM][MAX_RANKS][2];  // a rank's point-to-point calls per (comm, peer, send/recv)

    unsigned members[NCOMM];
    Program prog[MAX_RANKS];
    // hosts
    int pc[MAX_RANKS], issued[MAX_RANKS], sub[MAX_RANKS];
    int wait_stream[MAX_RANKS], wait_group[MAX_RANKS], wait_req[MAX_RANKS];
    int wait_bar_comm[MAX_RANKS], wait_bar_seq[MAX_RANKS];
    Req req[MAX_RANKS][256];
    int slot_req[MAX_RANKS][256], n_slots[MAX_RANKS];  // chapter 5's send slots
    Held held[MAX_RANKS][1024];
    int n_held[MAX_RANKS];
    Held defer[MAX_RANKS][MAX_DEFER];  // FIX_ONE: operations waiting for their channel, in call order
    int n_defer[MAX_RANKS];
    int bar_seq[MAX_RANKS][NCOMM], bar_arrived[NCOMM][MAX_SEQ];
    int sendrecv_send[MAX_RANKS];  // a sendrecv of two calls: its send's group
    int wait_compute[MAX_RANKS];  // the host waits for its compute stream (mem_to_host) first
    // lazy connection: per pair (key, from, to) bit 1 the sender's host
    // made its first call, bit 2 the receiver's; 3 connected. Per
    // communicator, the members whose host made its first collective.
    unsigned char conn[NSTREAM][MAX_RANKS][MAX_RANKS];
    unsigned coll_conn[NCOMM];
    ConnWait wait_conn[MAX_RANKS][4 * MAX_RANKS + 4];
    int n_wait_conn[MAX_RANKS], conn_group[MAX_RANKS];
    // the compute stream (ordered rules): entries "wait for group g", in order
    int* cq[MAX_RANKS];
    int chead[MAX_RANKS], ctail[MAX_RANKS];
    // GPU
    GOp* op;
    int n_op, cap_op;
    Group* group;
    int n_group, cap_group;
    Stream stream[MAX_RANKS][NSTREAM];
    unsigned char used[MAX_RANKS][NSTREAM];
    int used_list[MAX_RANKS][NSTREAM], n_used[MAX_RANKS];
    int* issue_order[MAX_RANKS];  // each rank's groups in the order its host issued them
    int n_issued[MAX_RANKS], cap_issued[MAX_RANKS], next_start[MAX_RANKS];
    int seq_send[NCOMM][MAX_RANKS][MAX_RANKS], seq_recv[NCOMM][MAX_RANKS][MAX_RANKS], seq_coll[MAX_RANKS][NCOMM];
    int* send_at;  // [comm][from][to][seq] -> op index + 1
    int* recv_at;
    int* coll_at;  // [comm][seq][rank] -> op index + 1
} Sim;

#define P2P_AT(S, tab, c, f, t, s) (S)->tab[((((size_t)(c) * MAX_RANKS + (f)) * MAX_RANKS + (t)) * MAX_SEQ) + (s)]
#define COLL_AT(S, c, s, r) (S)->coll_at[(((size_t)(c) * MAX_SEQ + (s)) * MAX_RANKS) + (r)]

static Sim* sim_new(int nranks) {
    Sim* S = calloc(1, sizeof(Sim));
    S->nranks = nranks;
    S->fix = FIX_ALL;
    size_t p2p = (size_t)NCOMM * MAX_RANKS * MAX_RANKS * MAX_SEQ;
    S->send_at = calloc(p2p, sizeof(int));
    S->recv_at = calloc(p2p, sizeof(int));
    S->coll_at = calloc((size_t)NCOMM * MAX_SEQ * MAX_RANKS, sizeof(int));
    return S;
}

static void sim_free(Sim* S) {
    for (int r = 0; r < MAX_RANKS; r++) {
        free(S->prog[r].op);
        for (int s = 0; s < NSTREAM; s++) free(S->stream[r][s].q);
        free(S->cq[r]);
        free(S->issue_order[r]);
    }
    free(S->op), free(S->group), free(S->send_at), free(S->recv_at), free(S->coll_at);
    free(S);
}

// Clears the run state (the programs stay) for another run under other rules.
static void sim_reset(Sim* S, Rules rules, Timing timing, int big) {
    S->rules = rules, S->timing = timing, S->big = big;
    S->ordered = rules == RULES_CHANNELS || rules == RULES_SHARED;  // the code now; held: the code before
    S->lazy = rules == RULES_CHANNELS || rules == RULES_SHARED;
    S->order = rules == RULES_CHANNELS;  // the shared stream runs with NCCL_LAUNCH_ORDER_IMPLICIT=0 (or before 2.26)
    memset(S->chead, 0, sizeof(S->chead)), memset(S->ctail, 0, sizeof(S->ctail));
    memset(S->wait_compute, 0, sizeof(S->wait_compute));
    memset(S->pc, 0, sizeof(S->pc)), memset(S->issued, 0, sizeof(S->issued)), memset(S->sub, 0, sizeof(S->sub));
    memset(S->req, 0, sizeof(S->req)), memset(S->n_slots, 0, sizeof(S->n_slots));
    memset(S->n_held, 0, sizeof(S->n_held)), memset(S->n_defer, 0, sizeof(S->n_defer));
    memset(S->bar_seq, 0, sizeof(S->bar_seq));
    memset(S->bar_arrived, 0, sizeof(S->bar_arrived));
    memset(S->conn, 0, sizeof(S->conn)), memset(S->coll_conn, 0, sizeof(S->coll_conn));
    memset(S->n_wait_conn, 0, sizeof(S->n_wait_conn));
    memset(S->calls, 0, sizeof(S->calls));
    if (rules == RULES_CHANNELS && (S->fix & FIX_EAGER))  // connect_channels in comm.c
        memset(S->conn[NCOMM], 3, sizeof(S->conn) - sizeof(S->conn[0]) * NCOMM);
    for (int c = 0; c < NCOMM; c++)
        for (int f = 0; f < MAX_RANKS; f++)
            for (int t = 0; t < MAX_RANKS; t++) {
                for (int s = 0; s < S->seq_send[c][f][t]; s++) P2P_AT(S, send_at, c, f, t, s) = 0;
                for (int s = 0; s < S->seq_recv[c][f][t]; s++) P2P_AT(S, recv_at, c, f, t, s) = 0;
            }
    for (int r = 0; r < MAX_RANKS; r++)
        for (int c = 0; c < NCOMM; c++)
            for (int s = 0; s < S->seq_coll[r][c]; s++) COLL_AT(S, c, s, r) = 0;
    memset(S->seq_send, 0, sizeof(S->seq_send)), memset(S->seq_recv, 0, sizeof(S->seq_recv));
    memset(S->seq_coll, 0, sizeof(S->seq_coll));
    for (int r = 0; r < MAX_RANKS; r++) {
        for (int i = 0; i < S->n_used[r]; i++) {
            int s = S->used_list[r][i];
            S->stream[r][s].head = S->stream[r][s].tail = 0;
            S->used[r][s] = 0;
        }
        S->n_used[r] = 0;
        S->n_issued[r] = S->next_start[r] = 0;
    }
    S->n_op = S->n_group = 0;
}

// The stream an operation of rank r runs on: its communicator's, or (rules
// channels, point to point) the channel of its direction.
// p2p > 0: a channel, lane p2p - 1 of the direction's pool.
static int stream_of(const Sim* S, int comm, int from, int to, int p2p) {
    if (S->rules == RULES_SHARED) return 0;
    if (S->rules == RULES_CHANNELS && p2p)
        return NCOMM + ((comm * MAX_RANKS + from) * MAX_RANKS + to) * MAX_POOL + (p2p - 1);
    return comm;
}

// The channel (1 + lane) of rank r's next point-to-point call with peer:
// the pair's i-th message goes on lane i % pool on both sides.
static int popcount(unsigned x) {
    int n = 0;
    for (; x; x &= x - 1) n++;
    return n;
}
static int peek_lane(const Sim* S, int r, int is_send, int comm, int peer) {
    if (S->rules != RULES_CHANNELS) return 1;
    int pool = (S->fix & FIX_PAIR) && popcount(S->members[comm]) == 2 ? 2 : 1;
    return 1 + S->calls[r][comm][peer][is_send] % pool;
}
static int next_lane(Sim* S, int r, int is_send, int comm, int peer) {
    int lane = peek_lane(S, r, is_send, comm, peer);
    if (S->rules == RULES_CHANNELS) S->calls[r][comm][peer][is_send]++;
    return lane;
}

// The NCCL communicator a point-to-point pair belongs to: the channel's, or
// the group's own (where NCCL connects it).
static int conn_key(const Sim* S, int comm, int from, int to, int p2p) {
    return S->rules == RULES_CHANNELS && p2p ? stream_of(S, comm, from, to, p2p) : comm;
}

static void push_stream(Sim* S, int r, int s, int g) {
    Stream* st = &S->stream[r][s];
    if (!st->q) st->q = malloc(65536 * sizeof(int));
    if (st->tail == 65536) {
        fprintf(stderr, "test_cuda_queue: stream overflow\n");
        exit(2);
    }
    if (!S->used[r][s]) S->used[r][s] = 1, S->used_list[r][S->n_used[r]++] = s;
    st->q[st->tail++] = g;
}

// The compute stream of rank r waits for group g (ordered rules: the end of
// a blocking call or comm_wait).
static void compute_waits(Sim* S, int r, int g) {
    if (!S->cq[r]) S->cq[r] = malloc(65536 * sizeof(int));
    if (S->ctail[r] == 65536) {
        fprintf(stderr, "test_cuda_queue: compute stream overflow\n");
        exit(2);
    }
    S->cq[r][S->ctail[r]++] = g;
}

// Group g waits for the compute queued so far (after_compute in comm.c).
static void after_compute(Sim* S, int g) {
    Group* G = &S->group[g];
    if (G->cdep < S->ctail[G->rank]) G->cdep = S->ctail[G->rank];
}

static int group_begin(Sim* S, int r) {
    if (S->n_group == S->cap_group) {
        S->cap_group = S->cap_group ? 2 * S->cap_group : 256;
        S->group = realloc(S->group, (size_t)S->cap_group * sizeof(Group));
    }
    Group* g = &S->group[S->n_group];
    memset(g, 0, sizeof(*g));
    g->op0 = S->n_op, g->rank = r;
    return S->n_group++;
}

// One operation into the open group g (the last one), on its stream
// (channel 0: the communicator's own stream even for a send or receive).
static void group_add(Sim* S, int g, GKind kind, int comm, int peer, int channel) {
    Group* G = &S->group[g];
    int r = G->rank;
    if (S->n_op == S->cap_op) {
        S->cap_op = S->cap_op ? 2 * S->cap_op : 1024;
        S->op = realloc(S->op, (size_t)S->cap_op * sizeof(GOp));
    }
    int seq = 0, s;
    if (kind == G_SEND) {
        seq = S->seq_send[comm][r][peer]++;
        P2P_AT(S, send_at, comm, r, peer, seq) = S->n_op + 1;
        s = stream_of(S, comm, r, peer, channel);
    } else if (kind == G_RECV) {
        seq = S->seq_recv[comm][peer][r]++;
        P2P_AT(S, recv_at, comm, peer, r, seq) = S->n_op + 1;
        s = stream_of(S, comm, peer, r, channel);
    } else {
        seq = S->seq_coll[r][comm]++;
        COLL_AT(S, comm, seq, r) = S->n_op + 1;
        s = stream_of(S, comm, r, r, 0);
    }
    if (seq >= MAX_SEQ - 1) {
        fprintf(stderr, "test_cuda_queue: too many operations\n");
        exit(2);
    }
    S->op[S->n_op++] = (GOp){kind, r, comm, peer, seq, g, channel};
    G->nops++;
    int have = 0;
    for (int i = 0; i < G->nstreams; i++) have |= G->streams[i] == s;
    if (!have) G->streams[G->nstreams++] = s;
}

// Lazy connection: the pairs (and the communicator's collectives) that g
// uses first on this rank; the host waits in ncclGroupEnd until each peer's
// host has come to the same pair.
static void connect_on_first_use(Sim* S, int g) {
    Group* G = &S->group[g];
    int r = G->rank;
    for (int i = 0; i < G->nops; i++) {
        const GOp* o = &S->op[G->op0 + i];
        if (o->kind == G_COLL) {
            if ((S->coll_conn[o->comm] & S->members[o->comm]) == S->members[o->comm]) continue;
            S->coll_conn[o->comm] |= 1u << r;
            S->wait_conn[r][S->n_wait_conn[r]++] = (ConnWait){o->comm, -1, -1};
            continue;
        }
        int from = o->kind == G_SEND ? r : o->peer, to = o->kind == G_SEND ? o->peer : r;
        int key = conn_key(S, o->comm, from, to, o->chan);
        unsigned char* cell = &S->conn[key][from][to];
        if (*cell == 3) continue;
        *cell |= o->kind == G_SEND ? 1 : 2;
        S->wait_conn[r][S->n_wait_conn[r]++] = (ConnWait){key, from, to};
    }
    if (S->n_wait_conn[r]) G->conn_wait = 1, S->conn_group[r] = g;
}

// ncclGroupEnd: the group goes to the tail of every stream it uses, in the
// rank's launch order; with lazy connection, the host may stop here.
static void group_end(Sim* S, int g) {
    Group* G = &S->group[g];
    int r = G->rank;
    for (int i = 0; i < G->nstreams; i++) push_stream(S, r, G->streams[i], g);
    if (G->nops == 0) {
        G->done = G->started = 1;
        return;
    }
    if (S->n_issued[r] == S->cap_issued[r]) {
        S->cap_issued[r] = S->cap_issued[r] ? 2 * S->cap_issued[r] : 256;
        S->issue_order[r] = realloc(S->issue_order[r], (size_t)S->cap_issued[r] * sizeof(int));
    }
    S->issue_order[r][S->n_issued[r]++] = g;
    if (S->lazy) connect_on_first_use(S, g);
}

static int can_start(const Sim* S, int g) {
    const Group* G = &S->group[g];
    if (G->done || G->started || G->conn_wait || S->chead[G->rank] < G->cdep) return 0;
    for (int i = 0; i < G->nstreams; i++) {
        const Stream* st = &S->stream[G->rank][G->streams[i]];
        if (st->head == st->tail || st->q[st->head] != g) return 0;
    }
    return 1;
}
static int started(const Sim* S, int op1) { return op1 && S->group[S->op[op1 - 1].group].started; }

static int op_can_complete(const Sim* S, const GOp* o) {
    if (o->kind == G_SEND) return !S->big || started(S, P2P_AT(S, recv_at, o->comm, o->rank, o->peer, o->seq));
    if (o->kind == G_RECV) return started(S, P2P_AT(S, send_at, o->comm, o->peer, o->rank, o->seq));
    for (int r = 0; r < S->nranks; r++)
        if ((S->members[o->comm] >> r & 1) && !started(S, COLL_AT(S, o->comm, o->seq, r))) return 0;
    return 1;
}

// Starts what can start (launch order: only in the order the host issued
// them), ends every running group that can end; returns how many moved.
static int gpu_step(Sim* S) {
    int n = 0;
    for (int r = 0; r < S->nranks; r++)  // compute streams pass the waits whose group ended
        while (S->chead[r] < S->ctail[r] && S->group[S->cq[r][S->chead[r]]].done) S->chead[r]++, n++;
    for (int r = 0; r < S->nranks; r++) {
        if (S->order) {
            while (S->next_start[r] < S->n_issued[r]) {
                int g = S->issue_order[r][S->next_start[r]];
                if (!S->group[g].started) {
                    if (!can_start(S, g)) break;
                    S->group[g].started = 1, n++;
                }
                S->next_start[r]++;
            }
        } else {
            for (int i = 0; i < S->n_used[r]; i++) {
                Stream* st = &S->stream[r][S->used_list[r][i]];
                if (st->head < st->tail && can_start(S, st->q[st->head])) S->group[st->q[st->head]].started = 1, n++;
            }
        }
    }
    for (int r = 0; r < S->nranks; r++)
        for (int i = 0; i < S->n_used[r]; i++) {
            Stream* st = &S->stream[r][S->used_list[r][i]];
            if (st->head == st->tail) continue;
            int g = st->q[st->head];
            Group* G = &S->group[g];
            if (!G->started || G->done) continue;
            int ok = 1;
            for (int k = 0; k < G->nops && ok; k++) ok = op_can_complete(S, &S->op[G->op0 + k]);
            if (!ok) continue;
            G->done = 1;
            for (int k = 0; k < G->nstreams; k++) S->stream[r][G->streams[k]].head++;
            n++;
        }
    return n;
}

static int stream_empty(const Sim* S, int r, int s) { return S->stream[r][s].head == S->stream[r][s].tail; }
static int req_done(const Sim* S, int r, int q) {
    const Req* R = &S->req[r][q];
    return R->state == 0 || (R->state == 2 && S->group[R->group].done);
}

// ---------------------------------------------------------------- the rules
// held: the held operations as one group of their own (flush_p2p), or into
// the open group g.
static void held_into(Sim* S, int r, int g) {
    for (int i = 0; i < S->n_held[r]; i++) {
        Held* h = &S->held[r][i];
        group_add(S, g, h->kind == H_ISEND ? G_SEND : G_RECV, h->comm, h->peer, 1);
        if (S->group[g].cdep < h->cdep) S->group[g].cdep = h->cdep;  // held_wait_for_compute
        S->req[r][h->req] = (Req){2, g};
    }
    S->n_held[r] = 0;
}
static void flush(Sim* S, int r) {
    if (!HELD(S) || S->n_held[r] == 0) return;
    int g = group_begin(S, r);
    held_into(S, r, g);
    group_end(S, g);
}

static int one_in_flight(const Sim* S) { return S->rules == RULES_CHANNELS && (S->fix & FIX_ONE); }

static int deferred_on(const Sim* S, int r, int s) {
    for (int i = 0; i < S->n_defer[r]; i++)
        if (S->defer[r][i].stream == s) return 1;
    return 0;
}
static int channel_free(const Sim* S, int r, int s) { return stream_empty(S, r, s) && !deferred_on(S, r, s); }

// channels_pump: each channel's oldest waiting operation is issued once the
// channel's stream is empty; it waits for the compute before its call.
static int pump(Sim* S, int r) {
    if (!one_in_flight(S) || S->n_wait_conn[r]) return 0;
    int n = 0;
    static unsigned char seen[NSTREAM];
    memset(seen, 0, sizeof(seen));
    for (int i = 0; i < S->n_defer[r]; i++) {
        Held d = S->defer[r][i];
        if (seen[d.stream]) continue;
        seen[d.stream] = 1;
        if (!stream_empty(S, r, d.stream)) {
            if (!S->any_order) break;  // in the order of the calls
            continue;
        }
        int g = group_begin(S, r);
        S->group[g].cdep = d.cdep;
        group_add(S, g, d.kind == H_ISEND ? G_SEND : G_RECV, d.comm, d.peer, d.lane);
        group_end(S, g);
        S->req[r][d.req] = (Req){2, g};
        memmove(&S->defer[r][i], &S->defer[r][i + 1], (size_t)(S->n_defer[r] - i - 1) * sizeof(Held));
        S->n_defer[r]--, i--, n++;
        if (S->n_wait_conn[r]) break;  // the host is inside ncclGroupEnd, connecting
    }
    return n;
}

// comm_isend / comm_irecv
static void post(Sim* S, int r, HostKind kind, int comm, int peer, int q) {
    if (HELD(S)) {
        S->held[r][S->n_held[r]++] = (Held){kind, comm, peer, q, S->ctail[r], 0, 1};
        S->req[r][q] = (Req){1, -1};
        return;
    }
    int lane = next_lane(S, r, kind == H_ISEND, comm, peer);
    int s = kind == H_ISEND ? stream_of(S, comm, r, peer, lane) : stream_of(S, comm, peer, r, lane);
    if (one_in_flight(S) && (!channel_free(S, r, s) || (!S->any_order && S->n_defer[r]))) {  // channel_post: waits for its turn
        if (S->n_defer[r] == MAX_DEFER) {
            fprintf(stderr, "test_cuda_queue: too many waiting operations\n");
            exit(2);
        }
        S->defer[r][S->n_defer[r]++] = (Held){kind, comm, peer, q, S->ctail[r], s, lane};
        S->req[r][q] = (Req){3, -1};
        return;
    }
    int g = group_begin(S, r);
    after_compute(S, g);
    group_add(S, g, kind == H_ISEND ? G_SEND : G_RECV, comm, peer, lane);
    group_end(S, g);
    S->req[r][q] = (Req){2, g};
}

// comm_test: held flushes first; then "done?" (the request stays active
// until a test or wait sees it done; one still waiting for its channel is not)
static int test_req(Sim* S, int r, int q) {
    if (S->req[r][q].state == 0) return 1;
    if (S->rules != RULES_HELD_QUIET_TEST) flush(S, r);
    if (S->timing == HOST_AHEAD || !req_done(S, r, q)) return 0;
    S->req[r][q].state = 0;
    return 1;
}

// comm_wait under the ordered rules: held operations flush, the compute
// stream waits for the request's group, the request is free again.
static void wait_ordered(Sim* S, int r, int q) {
    flush(S, r);
    if (S->req[r][q].state == 2) compute_waits(S, r, S->req[r][q].group);
    S->req[r][q].state = 0;
}

// A blocking send or receive (or both in one group): a group of its own
// with the held operations (held rules), after the compute so far.
static int blocking_group(Sim* S, int r, int with_held) {
    int g = group_begin(S, r);
    if (HELD(S) && with_held) held_into(S, r, g);
    after_compute(S, g);
    return g;
}

static int is_channel_rank(const Sim* S, const HostOp* o) { return S->rules == RULES_CHANNELS && o->peer >= 0; }

// Whether the host can make call o now (FIX_ONE: its channels are free, its
// request issued; comm_barrier: everything issued and ended). Until then it
// polls, issuing channel operations as their turn comes.
static int ready(const Sim* S, int r, const HostOp* o) {
    if (o->kind == H_BARRIER) {
        if (S->n_defer[r] || S->n_held[r] || S->chead[r] < S->ctail[r]) return 0;
        for (int i = 0; i < S->n_used[r]; i++)
            if (!stream_empty(S, r, S->used_list[r][i])) return 0;
        return 1;
    }
    if (!one_in_flight(S)) return 1;
    if (!S->any_order && S->n_defer[r] && o->kind != H_ISEND && o->kind != H_IRECV && o->kind != H_PIPE_SEND &&
        o->kind != H_WAIT && o->kind != H_PIPE_SENDS_WAIT && o->kind != H_SYNC && o->kind != H_HOST_BCAST)
        return 0;
    switch (o->kind) {
        case H_SEND:
            return !is_channel_rank(S, o) ||
                   channel_free(S, r, stream_of(S, o->comm, r, o->peer, peek_lane(S, r, 1, o->comm, o->peer)));
        case H_RECV:
            return !is_channel_rank(S, o) ||
                   channel_free(S, r, stream_of(S, o->comm, o->peer, r, peek_lane(S, r, 0, o->comm, o->peer)));
        case H_SENDRECV:
            return channel_free(S, r, stream_of(S, o->comm, r, o->peer, peek_lane(S, r, 1, o->comm, o->peer))) &&
                   channel_free(S, r, stream_of(S, o->comm, o->peer2, r, peek_lane(S, r, 0, o->comm, o->peer2)));
        case H_WAIT: return S->req[r][o->req].state != 3;
        default: return 1;
    }
}

// Issues host op o of rank r (its side effects) and says what it waits for.
static void issue(Sim* S, int r, const HostOp* o) {
    S->wait_stream[r] = S->wait_group[r] = S->wait_req[r] = S->wait_bar_comm[r] = -1;
    switch (o->kind) {
        case H_RECV:
        case H_SEND: {
            int g = blocking_group(S, r, 1);
            group_add(S, g, o->kind == H_SEND ? G_SEND : G_RECV, o->comm, o->peer,
                      next_lane(S, r, o->kind == H_SEND, o->comm, o->peer));
            group_end(S, g);
            // end_blocking / end_channels: an event behind g on its stream (a
            // stream is FIFO: g's end is the end of all before it)
            if (S->ordered) compute_waits(S, r, g);
            else if (HELD(S)) S->wait_stream[r] = stream_of(S, o->comm, r, r, 0);  // the whole stream
            else S->wait_group[r] = g;                                           // its own message
            break;
        }
        case H_SENDRECV: {
            // one group (held rules: with the held operations; channels with
            // FIX_SENDRECV: over both channels); before it, two calls in a
            // row, the receive issued once the send's call returned (sub)
            int g = blocking_group(S, r, 1);
            group_add(S, g, G_SEND, o->comm, o->peer, next_lane(S, r, 1, o->comm, o->peer));
            int one = HELD(S) || (S->fix & FIX_SENDRECV);
            if (one) group_add(S, g, G_RECV, o->comm, o->peer2, next_lane(S, r, 0, o->comm, o->peer2));
            group_end(S, g);
            if (one) compute_waits(S, r, g);  // else after the receive's call too (end_channels)
            S->sub[r] = one ? 0 : 1;
            S->sendrecv_send[r] = g;
            break;
        }
        case H_ISEND:
        case H_IRECV: post(S, r, o->kind, o->comm, o->peer, o->req); break;
        case H_WAIT:
            if (S->ordered) wait_ordered(S, r, o->req);
            else flush(S, r), S->wait_req[r] = o->req;
            break;
        case H_PIPE_SEND: {
            int slot = -1;
            for (int i = 0; i < S->n_slots[r] && slot < 0; i++)
                if (test_req(S, r, S->slot_req[r][i])) slot = i;
            if (slot < 0) {
                slot = S->n_slots[r]++;
                S->slot_req[r][slot] = 100 + slot;
            }
            post(S, r, H_ISEND, o->comm, o->peer, S->slot_req[r][slot]);
            break;
        }
        case H_PIPE_SENDS_WAIT: break;  // host_step walks the slots
        case H_ALLREDUCE:
        case H_ALLTOALLV:
        case H_ICOLL:
        case H_IA2A: {
            flush(S, r);
            int g = group_begin(S, r);
            after_compute(S, g);
            if (o->kind == H_ALLREDUCE || o->kind == H_ICOLL) group_add(S, g, G_COLL, o->comm, 0, 0);
            // the alltoallv's sends and receives are NCCL calls of its own
            // communicator in both rule sets: its stream, not a channel
            for (int p = 0; p < S->nranks; p++) {
                if (o->send_mask >> p & 1) group_add(S, g, G_SEND, o->comm, p, 0);
                if (o->recv_mask >> p & 1) group_add(S, g, G_RECV, o->comm, p, 0);
            }
            group_end(S, g);
            if (o->kind == H_ICOLL || o->kind == H_IA2A) S->req[r][o->req] = (Req){2, g};
            else if (S->ordered) compute_waits(S, r, g);
            else S->wait_stream[r] = stream_of(S, o->comm, r, r, 0);
            break;
        }
        case H_SYNC: S->wait_compute[r] = S->ordered; break;
        case H_HOST_BCAST:
        case H_BARRIER:
            // the loss it sends came to the host by mem_to_host: a wait for
            // the compute stream first (device_synchronize, polled);
            // comm_barrier waited for everything already (ready)
            S->wait_compute[r] = S->ordered && o->kind == H_HOST_BCAST;
            S->wait_bar_comm[r] = o->comm;
            S->wait_bar_seq[r] = S->bar_seq[r][o->comm]++;
            S->bar_arrived[o->comm][S->wait_bar_seq[r]]++;
            break;
    }
}

// The host inside ncclGroupEnd, connecting: done once every pair's peer came.
static int connected(const Sim* S, int r) {
    for (int i = 0; i < S->n_wait_conn[r]; i++) {
        const ConnWait* w = &S->wait_conn[r][i];
        if (w->from < 0 ? (S->coll_conn[w->key] & S->members[w->key]) != S->members[w->key]
                        : S->conn[w->key][w->from][w->to] != 3)
            return 0;
    }
    return 1;
}

// One step of rank r's host: issue its next operation or finish a wait.
static int host_step(Sim* S, int r) {
    if (S->n_wait_conn[r]) {
        if (!connected(S, r)) return 0;
        S->n_wait_conn[r] = 0;
        S->group[S->conn_group[r]].conn_wait = 0;
        return 1;
    }
    Program* p = &S->prog[r];
    if (S->pc[r] >= p->n) return 0;
    const HostOp* o = &p->op[S->pc[r]];
    if (!S->issued[r]) {
        // every comm_* call (and any polling) issues the channel operations
        // whose turn has come; MPI and mem_to_host's own waits below
        int pumped = o->kind == H_HOST_BCAST || o->kind == H_SYNC ? 0 : pump(S, r);
        if (!ready(S, r, o)) return pumped > 0;
        issue(S, r, o);
        S->issued[r] = 1;
        if (o->kind != H_SENDRECV) S->sub[r] = 0;
        return 1;
    }
    if (o->kind == H_SENDRECV && S->sub[r] == 1) {  // the second call of a sendrecv of two
        int g = blocking_group(S, r, 0);
        group_add(S, g, G_RECV, o->comm, o->peer2, next_lane(S, r, 0, o->comm, o->peer2));
        group_end(S, g);
        compute_waits(S, r, S->sendrecv_send[r]);
        compute_waits(S, r, g);
        S->sub[r] = 2;
        return 1;
    }
    if (S->wait_compute[r]) {
        int pumped = pump(S, r);  // wait_checked polls
        if (S->chead[r] < S->ctail[r]) return pumped > 0;
        S->wait_compute[r] = 0;
        return 1;
    }
    if (o->kind == H_PIPE_SENDS_WAIT) {
        while (S->sub[r] < S->n_slots[r]) {
            int q = S->slot_req[r][S->sub[r]];
            if (S->ordered) {
                int pumped = pump(S, r);
                if (S->n_wait_conn[r]) return 1;
                if (S->req[r][q].state == 3) return pumped > 0;  // comm_wait polls until it is issued
                wait_ordered(S, r, q);
                S->sub[r]++;
                if (S->n_wait_conn[r]) return 1;
                continue;
            }
            flush(S, r);
            if (!req_done(S, r, q)) return 0;
            S->req[r][q].state = 0;
            S->sub[r]++;
        }
    } else if (S->wait_stream[r] >= 0) {
        if (!stream_empty(S, r, S->wait_stream[r])) return 0;
    } else if (S->wait_group[r] >= 0) {
        if (!S->group[S->wait_group[r]].done) return 0;
    } else if (S->wait_req[r] >= 0) {
        if (!req_done(S, r, S->wait_req[r])) return 0;
        S->req[r][S->wait_req[r]].state = 0;
    } else if (S->wait_bar_comm[r] >= 0) {
        if (S->bar_arrived[S->wait_bar_comm[r]][S->wait_bar_seq[r]] < popcount(S->members[S->wait_bar_comm[r]]))
            return 0;
    }
    S->pc[r]++;
    S->issued[r] = 0;
    return 1;
}

// QUEUE_DEBUG=1: each rank's host position and its issued groups not
// ended ([group, started, compute entries it waits for, S/R/C peer.seq]).
static void dump(const Sim* S) {
    for (int r = 0; r < S->nranks; r++) {
        fprintf(stderr, "rank %d pc %d compute %d/%d waiting %d:", r, S->pc[r], S->chead[r], S->ctail[r],
                S->n_defer[r]);
        for (int i = 0; i < S->n_issued[r]; i++) {
            const Group* G = &S->group[S->issue_order[r][i]];
            if (G->done) continue;
            fprintf(stderr, " [g%d %s cdep %d", S->issue_order[r][i], G->started ? "started" : "queued", G->cdep);
            for (int k = 0; k < G->nops; k++) {
                const GOp* o = &S->op[G->op0 + k];
                fprintf(stderr, " %c%d.%d", "SRC"[o->kind], o->peer, o->seq);
            }
            fprintf(stderr, "]");
        }
        fprintf(stderr, "\n");
    }
}

// Runs the programs to the end or to a deadlock. Returns NULL, or what each
// rank waits for.
static const char* sim_run(Sim* S, Rules rules, Timing timing, int big, char* why, size_t len) {
    sim_reset(S, rules, timing, big);
    for (;;) {
        int moved = 0;
        if (timing == GPU_KEEPS_UP)
            while (gpu_step(S)) moved = 1;
        for (int r = 0; r < S->nranks; r++)
            while (host_step(S, r)) moved = 1;
        if (!moved) moved = gpu_step(S) > 0;
        if (!moved) break;
    }
    // the program's end is a wait for the device (the step's
    // device_synchronize): work left on a stream is stuck too
    int stuck = 0;
    for (int r = 0; r < S->nranks; r++) {
        stuck |= S->pc[r] < S->prog[r].n || S->chead[r] < S->ctail[r] || S->n_defer[r] || S->n_wait_conn[r];
        for (int i = 0; i < S->n_used[r]; i++) stuck |= !stream_empty(S, r, S->used_list[r][i]);
    }
    if (!stuck) return NULL;
    if (getenv("QUEUE_DEBUG")) dump(S);
    static const char* names[] = {"comm_recv", "comm_send", "comm_isend", "comm_irecv", "comm_wait",
                                  "send", "sends_wait", "collective", "comm_alltoallv", "MPI",
                                  "comm_sendrecv", "a non-blocking collective", "comm_ialltoallv", "mem_to_host",
                                  "comm_barrier"};
    size_t at = (size_t)snprintf(why, len, "deadlock:");
    for (int r = 0; r < S->nranks && at < len; r++) {
        if (S->pc[r] >= S->prog[r].n) {
            at += (size_t)snprintf(why + at, len - at, " rank %d %s;", r,
                                   S->n_wait_conn[r]           ? "issued all, connecting"
                                   : S->chead[r] < S->ctail[r] ? "issued all, its compute stream waits"
                                                               : "done");
            continue;
        }
        const HostOp* o = &S->prog[r].op[S->pc[r]];
        at += (size_t)snprintf(why + at, len - at, " rank %d in %s%s (peer %d, host op %d of %d);", r,
                               names[o->kind], S->n_wait_conn[r] ? ", connecting" : "", o->peer, S->pc[r],
                               S->prog[r].n);
    }
    return why;
}

// The host op of rank r at which a deadlocked run stopped (after sim_run).
static int stopped_at(const Sim* S, int r) { return S->pc[r]; }

// ---------------------------------------------------------------- chapter 5 and the capstone
// A pp x ep mesh (rank = stage * ep + e) has these communicators: the pp
// group of each e (channels), the embedding group of each e (first and last
// stage), the ep group of each stage and the world. Chapter 5 is ep = 1:
// communicator 0 is its pp group (the world) and 1 its embedding group.
#define C_PP(e) (e)
#define C_EMB(ep, e) ((ep) + (e))
#define C_EP(ep, s) (2 * (ep) + (s))
#define C_WORLD(ep, pp) (2 * (ep) + (pp))

typedef struct {
    int grad, mb, chunk;
} Msg;

// Chapter 7's MoE layer on stage s (07_expert/moe_layer.c): forward routes,
// copies the routing to the host (mem_to_host) and trades the counts by
// MPI_Alltoall over ep; then, in nc chunks (--ep-overlap), each chunk's
// dispatch all-to-all-v is waited for while the next one starts and its
// combine goes out (dispatch_start, a2a_start, a2a_wait). Backward runs the
// two exchanges reversed in the same chunks.
static void moe_layer_program(Program* p, int ep, int s, int e, int nc, int forward) {
    unsigned peers = 0;
    for (int j = 0; j < ep; j++)
        if (j != e) peers |= 1u << (s * ep + j);
    int c = C_EP(ep, s);
    if (forward) emit(p, (HostOp){H_HOST_BCAST, c, -1, 0, 0, 0, 0});
#define A2A(q) emit(p, (HostOp){H_IA2A, c, -1, 200 + (q), peers, peers, 0})
#define W(q) emit(p, (HostOp){H_WAIT, 0, -1, 200 + (q), 0, 0, 0})
    A2A(0);
    for (int i = 0; i < nc; i++) {
        W(i);
        if (i + 1 < nc) A2A(i + 1);
        A2A(nc + i);
        if (i > 0) W(nc + i - 1);
    }
    W(2 * nc - 1);
#undef A2A
#undef W
}

// What 05_pipeline/main.c calls, per rank and step: each action's receive
// (the messages its peer sent before the one it needs, each a comm_recv:
// pipeline.c's PipeLink and pipe_receive), its send (pipe_send:
// comm_test on the send buffers, then comm_isend), pipe_sends_wait at the
// end of the lists, the tied embedding's all-reduce (first and last stage), the norm's
// all-reduce and the loss's MPI_Bcast; after two steps a validation forward
// (blocking sends). With ep > 1, the capstone's pipeline
// (capstone/main.c's actions): the same, with moe MoE layers in each F and B
// (moe_layer_program) and the gradient all-reduces over ep and the world.
static void pipe_programs(Sim* S, const Schedule* sc, int ep, int moe, int nc) {
    int pp = sc->pp, NS = pp * sc->v;
    for (int e = 0; e < ep; e++) {
        S->members[C_PP(e)] = S->members[C_EMB(ep, e)] = 0;
        for (int s = 0; s < pp; s++) S->members[C_PP(e)] |= 1u << (s * ep + e);
        if (pp > 1) S->members[C_EMB(ep, e)] = (1u << e) | (1u << ((pp - 1) * ep + e));
    }
    for (int s = 0; s < pp && ep > 1; s++) {
        S->members[C_EP(ep, s)] = 0;
        for (int e = 0; e < ep; e++) S->members[C_EP(ep, s)] |= 1u << (s * ep + e);
    }
    S->members[C_WORLD(ep, pp)] = (1u << (pp * ep)) - 1;
    for (int e = 0; e < ep; e++)
        for (int s = 0; s < pp; s++) {
            Program* p = &S->prog[s * ep + e];
            int cpp = C_PP(e);
#define RANK(stage) ((stage) * ep + e)
            // the messages each peer sends to s, in its order
            int peers[2] = {(s + pp - 1) % pp, (s + 1) % pp}, n_in = peers[0] == peers[1] ? 1 : 2;
            Msg* in[2];
            int n[2] = {0, 0};
            for (int i = 0; i < n_in; i++) {
                int q = peers[i];
                in[i] = calloc((size_t)sc->n[q] + 1, sizeof(Msg));
                for (int a = 0; a < sc->n[q]; a++) {
                    Action act = sc->list[q][a];
                    int k = act.chunk * pp + q;
                    if (act.type == ACT_F && k < NS - 1 && (k + 1) % pp == s)
                        in[i][n[i]++] = (Msg){0, act.mb, (k + 1) / pp};
                    if (act.type == ACT_B && k > 0 && (k - 1) % pp == s) in[i][n[i]++] = (Msg){1, act.mb, (k - 1) / pp};
                }
            }
            for (int step = 0; step < 2; step++) {
                int next[2] = {0, 0};
                for (int a = 0; a < sc->n[s]; a++) {
                    Action act = sc->list[s][a];
                    int k = act.chunk * pp + s, need = -1, to = -1;
                    if (act.type == ACT_F && k > 0) need = 0;
                    if (act.type == ACT_B && k < NS - 1) need = 1;
                    if (act.type == ACT_F && k < NS - 1) to = (s + 1) % pp;
                    if (act.type == ACT_B && k > 0) to = (s + pp - 1) % pp;
                    if (need >= 0 && pp > 1) {
                        int peer = need ? (s + 1) % pp : (s + pp - 1) % pp, i = peers[0] == peer ? 0 : 1, have = 0;
                        for (int j = 0; j < next[i]; j++)
                            have |= in[i][j].grad == need && in[i][j].mb == act.mb && in[i][j].chunk == act.chunk;
                        while (!have && next[i] < n[i]) {
                            Msg m = in[i][next[i]++];
                            emit(p, (HostOp){H_RECV, cpp, RANK(peer), 0, 0, 0, 0});
                            have = m.grad == need && m.mb == act.mb && m.chunk == act.chunk;
                        }
                    }
                    if (act.type != ACT_W)
                        for (int l = 0; l < moe; l++) moe_layer_program(p, ep, s, e, nc, act.type == ACT_F);
                    if (to >= 0 && pp > 1) emit(p, (HostOp){H_PIPE_SEND, cpp, RANK(to), 0, 0, 0, 0});
                }
                emit(p, (HostOp){H_PIPE_SENDS_WAIT, cpp, -1, 0, 0, 0, 0});
                if (pp > 1 && (s == 0 || s == pp - 1)) emit(p, (HostOp){H_ALLREDUCE, C_EMB(ep, e), -1, 0, 0, 0, 0});
                if (ep > 1) {
                    emit(p, (HostOp){H_ALLREDUCE, C_EP(ep, s), -1, 0, 0, 0, 0});
                    emit(p, (HostOp){H_ALLREDUCE, C_WORLD(ep, pp), -1, 0, 0, 0, 0});
                    emit(p, (HostOp){H_HOST_BCAST, C_WORLD(ep, pp), -1, 0, 0, 0, 0});
                } else {
                    emit(p, (HostOp){H_ALLREDUCE, cpp, -1, 0, 0, 0, 0});
                    emit(p, (HostOp){H_HOST_BCAST, cpp, -1, 0, 0, 0, 0});
                }
            }
            for (int c = 0; c < sc->v && pp > 1 && ep == 1; c++) {  // val_forward
                int k = c * pp + s;
                if (k > 0) emit(p, (HostOp){H_RECV, cpp, RANK((s + pp - 1) % pp), 0, 0, 0, 0});
                if (k < NS - 1) emit(p, (HostOp){H_SEND, cpp, RANK((s + 1) % pp), 0, 0, 0, 0});
            }
            emit(p, (HostOp){H_SYNC, 0, -1, 0, 0, 0, 0});
            for (int i = 0; i < n_in; i++) free(in[i]);
#undef RANK
        }
}
static void pipeline_programs(Sim* S, const Schedule* sc) { pipe_programs(S, sc, 1, 0, 1); }

// The outcome of S's programs under the held and the channel rules, each
// timing and message size: a bit per (rules, timing, big) that deadlocked;
// the first reason in why.
#define BAD(rules, timing, big) (1u << ((rules) * 4 + (timing) * 2 + (big)))
static unsigned replay_sim(Sim* S, char* why, size_t len) {
    unsigned bad = 0;
    why[0] = 0;
    for (int rules = 0; rules < 2; rules++)
        for (int timing = 0; timing < 2; timing++)
            for (int big = 0; big < 2; big++) {
                char w[1024];
                if (sim_run(S, (Rules)rules, (Timing)timing, big, w, sizeof(w))) {
                    bad |= BAD(rules, timing, big);
                    if (!why[0]) snprintf(why, len, "%s", w);
                }
            }
    return bad;
}

// The same for one schedule.
static unsigned replay(const Schedule* sc, char* why, size_t len) {
    Sim* S = sim_new(sc->pp);
    pipeline_programs(S, sc);
    unsigned bad = replay_sim(S, why, len);
    sim_free(S);
    return bad;
}
#define BAD_CHANNELS (0xFu << 4)

// Whether S's programs deadlock under the channel rules with mitigations
// fix, in any timing, with messages above NCCL's buffer (and, with small,
// below it too).
static int channels_deadlock(Sim* S, unsigned fix, int small, char* why, size_t len) {
    S->fix = fix;
    int bad = 0;
    for (int timing = 0; timing < 2 && !bad; timing++)
        for (int big = small ? 0 : 1; big < 2 && !bad; big++)
            bad = sim_run(S, RULES_CHANNELS, (Timing)timing, big, why, len) != NULL;
    S->fix = FIX_ALL;
    return bad;
}

// ---------------------------------------------------------------- chapters 1, 6 and 7
// 06_sequence_context/context.c's ring attention (cp_ring_forward, then
// cp_ring_backward, as chapter 6's main.c and the capstone call them), with
// and without --cp-overlap, then the dp+cp gradient all-reduce.
static void ring_programs(Sim* S, int n, int overlap) {
    S->members[0] = S->members[1] = (1u << n) - 1;
    enum { FROM_LEFT, TO_RIGHT, D_FROM_LEFT, D_TO_RIGHT };
    for (int r = 0; r < n; r++) {
        Program* p = &S->prog[r];
        int right = (r + 1) % n, left = (r + n - 1) % n;
#define W(q) emit(p, (HostOp){H_WAIT, 0, -1, q, 0, 0, 0})
        for (int s = 0; s < n; s++) {
            if (s < n - 1) {
                emit(p, (HostOp){H_IRECV, 0, left, FROM_LEFT, 0, 0, 0});
                emit(p, (HostOp){H_ISEND, 0, right, TO_RIGHT, 0, 0, 0});
            }
            if (!overlap) W(FROM_LEFT), W(TO_RIGHT);
            W(FROM_LEFT), W(TO_RIGHT);
        }
        for (int s = 0; s < n; s++) {
            if (s < n - 1) {
                emit(p, (HostOp){H_IRECV, 0, left, FROM_LEFT, 0, 0, 0});
                emit(p, (HostOp){H_ISEND, 0, right, TO_RIGHT, 0, 0, 0});
            }
            if (!overlap) W(FROM_LEFT), W(TO_RIGHT);
            if (s > 0) W(D_FROM_LEFT), W(D_TO_RIGHT);
            if (n > 1) {
                emit(p, (HostOp){H_IRECV, 0, left, D_FROM_LEFT, 0, 0, 0});
                emit(p, (HostOp){H_ISEND, 0, right, D_TO_RIGHT, 0, 0, 0});
                if (!overlap) W(D_FROM_LEFT), W(D_TO_RIGHT);
            }
            W(FROM_LEFT), W(TO_RIGHT);
        }
        W(D_FROM_LEFT), W(D_TO_RIGHT);
#undef W
        emit(p, (HostOp){H_ALLREDUCE, 1, -1, 0, 0, 0, 0});
        emit(p, (HostOp){H_SYNC, 0, -1, 0, 0, 0, 0});
    }
}

// 01_collectives/harness.c on the CUDA backend (the library's collectives):
// the check of the non-blocking forms (each started, computed behind, waited
// for, then its blocking twin and mem_to_host; last a ring shift by
// irecv/isend), then the counters' pass: every blocking collective
// (scatter, gather and the all-to-alls are sends and receives of the
// world's communicator), comm_sendrecv around the ring, comm_barrier, the
// non-blocking forms again and the ring shift.
static void harness_programs(Sim* S, int n) {
    S->members[0] = (1u << n) - 1;
    unsigned all = (1u << n) - 1;
    for (int r = 0; r < n; r++) {
        Program* p = &S->prog[r];
        int right = (r + 1) % n, left = (r + n - 1) % n;
        unsigned others = all & ~(1u << r), root = r == 0 ? others : 1u, last = 1u << (n - 1);
        for (int kind = 0; kind < 4; kind++) {
            emit(p, (HostOp){H_ICOLL, 0, -1, 0, 0, 0, 0});
            emit(p, (HostOp){H_WAIT, 0, -1, 0, 0, 0, 0});
            emit(p, (HostOp){H_ALLREDUCE, 0, -1, 0, 0, 0, 0});
            emit(p, (HostOp){H_SYNC, 0, -1, 0, 0, 0, 0});
        }
        emit(p, (HostOp){H_IRECV, 0, left, 0, 0, 0, 0});
        emit(p, (HostOp){H_ISEND, 0, right, 1, 0, 0, 0});
        emit(p, (HostOp){H_WAIT, 0, -1, 0, 0, 0, 0});
        emit(p, (HostOp){H_WAIT, 0, -1, 1, 0, 0, 0});
        emit(p, (HostOp){H_SYNC, 0, -1, 0, 0, 0, 0});
        for (int c = 0; c < 5; c++) emit(p, (HostOp){H_ALLREDUCE, 0, -1, 0, 0, 0, 0});
        // scatter from 0, gather to n-1, all-to-all, all-to-all-v
        emit(p, (HostOp){H_ALLTOALLV, 0, -1, 0, r == 0 ? others : 0, r == 0 ? 0 : root, 0});
        emit(p, (HostOp){H_ALLTOALLV, 0, -1, 0, r == n - 1 ? 0 : last, r == n - 1 ? others : 0, 0});
        emit(p, (HostOp){H_ALLTOALLV, 0, -1, 0, others, others, 0});
        emit(p, (HostOp){H_ALLTOALLV, 0, -1, 0, others, others, 0});
        emit(p, (HostOp){H_SENDRECV, 0, right, 0, 0, 0, left});
        emit(p, (HostOp){H_BARRIER, 0, -1, 0, 0, 0, 0});
        for (int c = 0; c < 4; c++) {
            emit(p, (HostOp){H_ICOLL, 0, -1, 0, 0, 0, 0});
            emit(p, (HostOp){H_WAIT, 0, -1, 0, 0, 0, 0});
        }
        emit(p, (HostOp){H_IRECV, 0, left, 0, 0, 0, 0});
        emit(p, (HostOp){H_ISEND, 0, right, 1, 0, 0, 0});
        emit(p, (HostOp){H_WAIT, 0, -1, 0, 0, 0, 0});
        emit(p, (HostOp){H_WAIT, 0, -1, 1, 0, 0, 0});
        emit(p, (HostOp){H_SYNC, 0, -1, 0, 0, 0, 0});
    }
}

// 07_expert/main.c's four exchanges per layer (dispatch, combine and their
// backward) with counts where some pairs send nothing, then the gradient
// all-reduces.
static void moe_programs(Sim* S, int n, unsigned seed) {
    S->members[0] = S->members[1] = (1u << n) - 1;
    for (int layer = 0; layer < 3; layer++) {
        unsigned send[MAX_RANKS] = {0};  // send[i] bit j: i sends to j
        for (int i = 0; i < n; i++)
            for (int j = 0; j < n; j++) {
                seed = seed * 1103515245u + 12345u;
                if (i != j && (seed >> 16) % 3) send[i] |= 1u << j;
            }
        for (int x = 0; x < 4; x++)
            for (int r = 0; r < n; r++) {
                unsigned out = 0, in = 0;  // dispatch and the backward of combine go one way, the others back
                for (int j = 0; j < n; j++) {
                    int ij = send[r] >> j & 1, ji = send[j] >> r & 1;
                    if (x % 2 == 0) out |= (unsigned)ij << j, in |= (unsigned)ji << j;
                    else out |= (unsigned)ji << j, in |= (unsigned)ij << j;
                }
                emit(&S->prog[r], (HostOp){H_ALLTOALLV, 0, -1, 0, out, in, 0});
            }
    }
    for (int r = 0; r < n; r++) {
        emit(&S->prog[r], (HostOp){H_ALLREDUCE, 1, -1, 0, 0, 0, 0});
        emit(&S->prog[r], (HostOp){H_ALLREDUCE, 0, -1, 0, 0, 0, 0});
    }
}

// ---------------------------------------------------------------- the checks
// One check: S's programs complete under every rule set (S is freed).
static void check_completes(Sim* S, const char* name) {
    char why[1024];
    unsigned bad = replay_sim(S, why, sizeof(why));
    check(bad == 0, name, "deadlock bits 0x%02x: %s", bad, why);
    sim_free(S);
}

// tests/chapter_5.sh's --schedule-file examples (the ones the validator accepts)
static const char* file_examples[] = {
    "rank 0: F0 F1 B0 B1\nrank 1: F1 F0 B1 B0\n",
    "# pp=2, 2 microbatches, split backward\nrank 0: F0 F1 B0 W0 B1 W1\nrank 1: F1 F0 B1 W1 B0 W0\n",
};

// Appends " name" to a list while it has room.
static void list_add(char* list, size_t cap, const char* fmt, int a, int b, int c) {
    size_t at = strlen(list);
    if (at < cap - 64) snprintf(list + at, cap - at, fmt, a, b, c);
}

int main(int argc, char** argv) {
    char msg[512], why[1024];
    if (argc == 6 && strcmp(argv[1], "--show") == 0) {
        Schedule sc;
        if (schedule_build(&sc, schedule_parse(argv[2]), atoi(argv[3]), atoi(argv[4]), atoi(argv[5]), msg,
                           sizeof(msg))) {
            fprintf(stderr, "error: %s\n", msg);
            return 2;
        }
        unsigned bad = replay(&sc, why, sizeof(why));
        printf("deadlock bits (held: ahead small, ahead big, keeps-up small, keeps-up big; then channels): 0x%02x\n%s\n",
               bad, why);
        Sim* S = sim_new(sc.pp);
        pipeline_programs(S, &sc);
        int off = channels_deadlock(S, 0, 0, why, sizeof(why));
        printf("channels without issue 45's mitigations: %s\n", off ? why : "completes");
        sim_free(S);
        return 0;
    }
    if (argc == 4 && strcmp(argv[1], "--harness") == 0) {  // chapter 1's harness on N ranks, mitigations FIX
        Sim* S = sim_new(atoi(argv[2]));
        harness_programs(S, atoi(argv[2]));
        S->fix = (unsigned)atoi(argv[3]);
        const char* w = sim_run(S, RULES_CHANNELS, HOST_AHEAD, 1, why, sizeof(why));
        printf("%s\n", w ? w : "completes");
        sim_free(S);
        return 0;
    }
    // every built-in schedule, pp 2-4, m 1-16, v 1-3
    int cases[NUM_SCHEDULES] = {0}, held_bad[NUM_SCHEDULES] = {0}, chan_bad = 0, small_bad = 0;
    char first_chan[1200] = "", first_small[1200] = "", held_list[2000] = "";
    int interleaved_pp2_m4_v2 = 0, interleaved_pp2_m4_v3 = 0;
    for (int kind = 0; kind < NUM_SCHEDULES; kind++)
        for (int pp = 2; pp <= 4; pp++)
            for (int m = 1; m <= 16; m++)
                for (int v = 1; v <= (kind == SCHED_INTERLEAVED ? 3 : 1); v++) {
                    Schedule sc;
                    if (schedule_build(&sc, (ScheduleKind)kind, pp, m, v, msg, sizeof(msg))) continue;
                    if (schedule_validate(&sc, NULL, msg, sizeof(msg))) {
                        schedule_free(&sc);
                        continue;
                    }
                    cases[kind]++;
                    unsigned bad = replay(&sc, why, sizeof(why));
                    if (bad & (BAD(RULES_HELD, HOST_AHEAD, 1) | BAD(RULES_HELD, GPU_KEEPS_UP, 1))) {
                        held_bad[kind]++;
                        size_t at = strlen(held_list);
                        if (at < sizeof(held_list) - 64)
                            snprintf(held_list + at, sizeof(held_list) - at, " %s pp%d m%d v%d", schedule_name(kind),
                                     pp, m, v);
                        if (kind == SCHED_INTERLEAVED && pp == 2 && m == 4 && v == 2) interleaved_pp2_m4_v2 = 1;
                        if (kind == SCHED_INTERLEAVED && pp == 2 && m == 4 && v == 3) interleaved_pp2_m4_v3 = 1;
                    }
                    if (bad & (BAD(RULES_HELD, HOST_AHEAD, 0) | BAD(RULES_HELD, GPU_KEEPS_UP, 0))) {
                        small_bad++;
                        if (!first_small[0])
                            snprintf(first_small, sizeof(first_small), "%s pp=%d m=%d v=%d: %s", schedule_name(kind), pp,
                                     m, v, why);
                    }
                    if (bad & BAD_CHANNELS) {
                        chan_bad++;
                        if (!first_chan[0])
                            snprintf(first_chan, sizeof(first_chan), "%s pp=%d m=%d v=%d: %s", schedule_name(kind), pp, m,
                                     v, why);
                    }
                    schedule_free(&sc);
                }
    int total = 0;
    for (int k = 0; k < NUM_SCHEDULES; k++) total += cases[k];
    printf("# held rules, messages above NCCL's buffer: deadlocks in%s\n", held_list);
    check(interleaved_pp2_m4_v2 && interleaved_pp2_m4_v3, "the model of the held rules finds the interleaved cycle",
          "interleaved pp=2 m=4 v=2: %s, v=3 (tests/chapter_5.sh's case): %s", interleaved_pp2_m4_v2 ? "deadlock" : "completes",
          interleaved_pp2_m4_v3 ? "deadlock" : "completes");
    check(held_bad[SCHED_GPIPE] + held_bad[SCHED_1F1B] + held_bad[SCHED_ZB] == 0,
          "the held rules complete gpipe, 1f1b and zb (their channels carry one kind of message)",
          "%d gpipe, %d 1f1b, %d zb cases deadlock", held_bad[SCHED_GPIPE], held_bad[SCHED_1F1B], held_bad[SCHED_ZB]);
    check(small_bad == 0, "the held rules complete every schedule while messages fit NCCL's buffer (why tiny runs pass)",
          "%d cases deadlock: %s", small_bad, first_small);
    char name[160];
    snprintf(name, sizeof(name),
             "the channel rules with NCCL's two rules complete all %d built-in schedules (pp 2-4, m 1-16, v 1-3)", total);
    check(chan_bad == 0 && total > 0, name, "%d cases deadlock, first: %s", chan_bad, first_chan);

    // pp 5-8 (the capstone and chapter 5 take any pp up to the world)
    int big_cases = 0, big_bad = 0;
    char first_big[1200] = "";
    for (int kind = 0; kind < NUM_SCHEDULES; kind++)
        for (int pp = 5; pp <= MAX_RANKS; pp++)
            for (int m = pp; m <= 2 * pp; m += pp)
                for (int v = 1; v <= (kind == SCHED_INTERLEAVED ? 2 : 1); v++) {
                    Schedule sc;
                    if (schedule_build(&sc, (ScheduleKind)kind, pp, m, v, msg, sizeof(msg))) continue;
                    if (schedule_validate(&sc, NULL, msg, sizeof(msg))) {
                        schedule_free(&sc);
                        continue;
                    }
                    Sim* S = sim_new(pp);
                    pipeline_programs(S, &sc);
                    big_cases++;
                    if (channels_deadlock(S, FIX_ALL, 1, why, sizeof(why))) {
                        big_bad++;
                        if (!first_big[0])
                            snprintf(first_big, sizeof(first_big), "%s pp=%d m=%d v=%d: %s", schedule_name(kind), pp,
                                     m, v, why);
                    }
                    sim_free(S);
                    schedule_free(&sc);
                }
    snprintf(name, sizeof(name), "the channel rules complete all %d schedules at pp 5-8 (m = pp, 2pp; v 1-2)",
             big_cases);
    check(big_bad == 0 && big_cases > 0, name, "%d cases deadlock, first: %s", big_bad, first_big);

    // the self-test: without issue 45's mitigations (the code before it)
    // the model finds its deadlocks; each mitigation is needed
    int il_cases = 0, il_off = 0, il_no_pair = 0, il_all = 0;
    char il_list[2000] = "", il_first_all[1200] = "";
    for (int m = 4; m <= 16; m++)
        for (int v = 2; v <= 3; v++) {
            Schedule sc;
            if (schedule_build(&sc, SCHED_INTERLEAVED, 2, m, v, msg, sizeof(msg))) continue;
            Sim* S = sim_new(2);
            pipeline_programs(S, &sc);
            il_cases++;
            int off = channels_deadlock(S, 0, 0, why, sizeof(why));
            il_off += off;
            if (off) list_add(il_list, sizeof(il_list), " m%d v%d", m, v, 0);
            il_no_pair += channels_deadlock(S, FIX_ALL & ~FIX_PAIR, 0, why, sizeof(why));
            if (channels_deadlock(S, FIX_ALL, 1, why, sizeof(why))) {
                il_all++;
                if (!il_first_all[0]) snprintf(il_first_all, sizeof(il_first_all), "m=%d v=%d: %s", m, v, why);
            }
            sim_free(S);
            schedule_free(&sc);
        }
    printf("# interleaved pp 2, m 4-16, v 2-3 (%d cases), channels without the mitigations: %d deadlock:%s\n",
           il_cases, il_off, il_list);
    printf("# ... with them all but two channels per direction: %d deadlock\n", il_no_pair);
    check(il_off == il_cases,
          "self-test: without the mitigations NCCL's launch order deadlocks every interleaved pp 2 case (m 4-16, v 2-3)",
          "%d of %d cases deadlock", il_off, il_cases);
    check(il_no_pair == il_cases,
          "self-test: one channel per direction at pp 2 (activations and gradients on it) still deadlocks them all",
          "%d of %d cases deadlock", il_no_pair, il_cases);
    check(il_all == 0, "with the mitigations, interleaved pp 2 (m 4-16, v 2-3) completes", "%d of %d cases deadlock, first: %s",
          il_all, il_cases, il_first_all);

    // one in flight per channel, and in the order of the calls
    int one_bad = 0, order_bad = 0, one_cases = 0;
    for (int kind = 0; kind < NUM_SCHEDULES; kind++)
        for (int pp = 2; pp <= 4; pp++)
            for (int m = pp; m <= 4 * pp; m += pp)
                for (int v = 1; v <= (kind == SCHED_INTERLEAVED ? 3 : 1); v++) {
                    Schedule sc;
                    if (schedule_build(&sc, (ScheduleKind)kind, pp, m, v, msg, sizeof(msg))) continue;
                    Sim* S = sim_new(pp);
                    pipeline_programs(S, &sc);
                    one_cases++;
                    one_bad += channels_deadlock(S, FIX_ALL & ~FIX_ONE, 0, why, sizeof(why));
                    S->any_order = 1;
                    order_bad += channels_deadlock(S, FIX_ALL, 0, why, sizeof(why));
                    sim_free(S);
                    schedule_free(&sc);
                }
    printf("# schedules pp 2-4, m = pp..4pp (%d cases): %d deadlock with several operations in flight per channel, %d "
           "with one but issued out of the calls' order\n",
           one_cases, one_bad, order_bad);
    // (no check on one_bad: once a pair has two channels per direction, the
    // model finds no schedule that needs one in flight; comm.c keeps it so
    // a message stuck in flight stops the host under the watchdog, naming
    // the wait, instead of every NCCL kernel behind it on the device)
    check(order_bad > 0, "self-test: a waiting operation issued after later calls' operations deadlocks some schedule",
          "all %d cases complete", one_cases);

    int ring_off = 0, ring_first = 0, ring_all = 0, ring_cases = 0;
    char ring_why[1200] = "";
    for (int n = 2; n <= MAX_RANKS; n++)
        for (int overlap = 0; overlap < 2; overlap++) {
            Sim* S = sim_new(n);
            ring_programs(S, n, overlap);
            ring_cases++;
            S->fix = 0;
            if (sim_run(S, RULES_CHANNELS, HOST_AHEAD, 0, why, sizeof(why))) {
                ring_off++;
                int at_first = 1;
                for (int r = 0; r < n; r++) at_first &= stopped_at(S, r) == 0 && S->n_wait_conn[r] > 0;
                ring_first += at_first;
            }
            S->fix = FIX_ONE | FIX_SENDRECV;  // everything but the eager connection
            int one = sim_run(S, RULES_CHANNELS, HOST_AHEAD, 0, why, sizeof(why)) != NULL;
            S->fix = FIX_ALL;
            if (!one) snprintf(ring_why, sizeof(ring_why), "cp=%d overlap %d completes without eager connection", n,
                               overlap);
            if (channels_deadlock(S, FIX_ALL, 1, why, sizeof(why))) {
                ring_all++;
                snprintf(ring_why, sizeof(ring_why), "cp=%d overlap %d: %s", n, overlap, why);
            }
            sim_free(S);
        }
    printf("# ring attention cp 2-8 with and without overlap: %d of %d deadlock without the mitigations, %d of them "
           "with every host connecting at its first operation\n",
           ring_off, ring_cases, ring_first);
    check(ring_off == ring_cases && ring_first == ring_cases,
          "self-test: without eager connection every ring case (cp 2-8, overlap 0/1) deadlocks at the first host operation",
          "%d of %d deadlock, %d at the first operation", ring_off, ring_cases, ring_first);
    check(ring_all == 0 && !ring_why[0], "with the channels connected at creation every ring case completes",
          "%s", ring_why);

    int h_off = 0, h_all = 0, h_cases = 0;
    char h_why[1200] = "";
    for (int n = 2; n <= MAX_RANKS; n++) {
        Sim* S = sim_new(n);
        harness_programs(S, n);
        h_cases++;
        h_off += channels_deadlock(S, 0, 1, why, sizeof(why));
        if (channels_deadlock(S, FIX_ALL, 1, why, sizeof(why))) {
            h_all++;
            if (!h_why[0]) snprintf(h_why, sizeof(h_why), "%d ranks: %s", n, why);
        }
        if (sim_run(S, RULES_SHARED, HOST_AHEAD, 0, why, sizeof(why)) && !h_why[0])
            snprintf(h_why, sizeof(h_why), "%d ranks, shared stream: %s", n, why);
        sim_free(S);
    }
    check(h_off == h_cases, "self-test: without the mitigations chapter 1's harness deadlocks (2-8 ranks)",
          "%d of %d deadlock", h_off, h_cases);
    check(h_all == 0 && !h_why[0], "chapter 1's harness completes with the mitigations and on the shared stream (2-8 ranks)",
          "%s", h_why);

    // the capstone: chapter 5's schedules over pp with chapter 7's MoE
    // layers over ep inside each F and B (--ep-overlap 1-3 chunks), the
    // all-to-alls in the same launch chain as the pipeline's channels
    int cap_cases = 0, cap_bad = 0, cap_off = 0;
    char cap_first[1200] = "";
    static const int shapes[][2] = {{2, 2}, {2, 3}, {2, 4}, {4, 2}};
    static const ScheduleKind kinds[] = {SCHED_1F1B, SCHED_ZB, SCHED_INTERLEAVED};
    for (size_t sh = 0; sh < sizeof(shapes) / sizeof(*shapes); sh++)
        for (size_t k = 0; k < sizeof(kinds) / sizeof(*kinds); k++)
            for (int nc = 1; nc <= 3; nc++) {
                int pp = shapes[sh][0], ep = shapes[sh][1], m = 2 * pp, v = kinds[k] == SCHED_INTERLEAVED ? 2 : 1;
                Schedule sc;
                if (schedule_build(&sc, kinds[k], pp, m, v, msg, sizeof(msg))) continue;
                Sim* S = sim_new(pp * ep);
                pipe_programs(S, &sc, ep, 2, nc);
                cap_cases++;
                cap_off += channels_deadlock(S, 0, 0, why, sizeof(why));
                if (channels_deadlock(S, FIX_ALL, 1, why, sizeof(why))) {
                    cap_bad++;
                    if (!cap_first[0])
                        snprintf(cap_first, sizeof(cap_first), "%s pp=%d ep=%d ep-overlap %d: %s", schedule_name(kinds[k]),
                                 pp, ep, nc, why);
                }
                sim_free(S);
                schedule_free(&sc);
            }
    printf("# capstone pipeline with MoE all-to-alls: %d of %d cases deadlock without the mitigations\n", cap_off,
           cap_cases);
    snprintf(name, sizeof(name),
             "the capstone's pipeline (1f1b, zb, interleaved; pp x ep 2x2-2x4, 4x2; --ep-overlap 1-3) completes, %d cases",
             cap_cases);
    check(cap_bad == 0 && cap_cases > 0, name, "%d deadlock, first: %s", cap_bad, cap_first);

    // without comm_test's flush the held rules still deadlock: the receive
    // still waits for the whole stream, behind this rank's own sends
    int quiet_bad = 0, quiet_cases = 0;
    for (int pp = 2; pp <= 4; pp++)
        for (int v = 2; v <= 3; v++) {
            Schedule sc;
            if (schedule_build(&sc, SCHED_INTERLEAVED, pp, 2 * pp, v, msg, sizeof(msg))) continue;
            Sim* S = sim_new(pp);
            pipeline_programs(S, &sc);
            quiet_cases++;
            quiet_bad += sim_run(S, RULES_HELD_QUIET_TEST, HOST_AHEAD, 1, why, sizeof(why)) != NULL;
            sim_free(S);
            schedule_free(&sc);
        }
    snprintf(name, sizeof(name), "without comm_test's flush the held rules still deadlock (interleaved, m = 2pp)");
    check(quiet_bad > 0, name, "all %d cases complete", quiet_cases);
    printf("# held rules without comm_test's flush: %d of %d interleaved cases (pp 2-4, m = 2pp, v 2-3) deadlock\n",
           quiet_bad, quiet_cases);

    // the shared stream (held rules, one stream for every communicator,
    // lazy connection): what make gpu-check's NCCL_LAUNCH_ORDER_IMPLICIT=0
    // cases rely on
    int shared_small = 0, shared_big = 0, shared_cases = 0;
    for (int pp = 2; pp <= 4; pp++)
        for (int m = pp; m <= 4 * pp; m += pp)
            for (int kind = 0; kind < NUM_SCHEDULES; kind++)
                for (int v = 1; v <= (kind == SCHED_INTERLEAVED ? 3 : 1); v++) {
                    Schedule sc;
                    if (schedule_build(&sc, (ScheduleKind)kind, pp, m, v, msg, sizeof(msg))) continue;
                    Sim* S = sim_new(pp);
                    pipeline_programs(S, &sc);
                    shared_cases++;
                    for (int t = 0; t < 2; t++) {
                        shared_small += sim_run(S, RULES_SHARED, (Timing)t, 0, why, sizeof(why)) != NULL;
                        shared_big += sim_run(S, RULES_SHARED, (Timing)t, 1, why, sizeof(why)) != NULL;
                    }
                    sim_free(S);
                    schedule_free(&sc);
                }
    printf("# shared stream: %d of %d runs deadlock with messages above the buffer, %d below\n", shared_big,
           2 * shared_cases, shared_small);
    check(shared_small == 0, "the shared stream completes every schedule while messages fit NCCL's buffer",
          "%d of %d runs deadlock", shared_small, 2 * shared_cases);

    // the --schedule-file examples of tests/chapter_5.sh
    for (size_t e = 0; e < sizeof(file_examples) / sizeof(*file_examples); e++) {
        const char* path = tmp_path("test_cuda_queue.sched");
        write_bytes(path, file_examples[e], strlen(file_examples[e]));
        Schedule sc;
        const char* err = schedule_read(&sc, path, 2, msg, sizeof(msg));
        if (!err) err = schedule_validate(&sc, NULL, msg, sizeof(msg));
        unsigned bad = err ? 0 : replay(&sc, why, sizeof(why));
        snprintf(name, sizeof(name), "--schedule-file example %zu completes under the channel rules", e + 1);
        check(!err && !(bad & BAD_CHANNELS), name, "%s", err ? err : why);
        if (!err) schedule_free(&sc);
    }

    // the ring, cp 2-8, with and without overlap
    for (int n = 2; n <= MAX_RANKS; n++)
        for (int overlap = 0; overlap < 2; overlap++) {
            Sim* S = sim_new(n);
            ring_programs(S, n, overlap);
            snprintf(name, sizeof(name), "ring attention cp=%d overlap %d completes under both rule sets", n, overlap);
            check_completes(S, name);
        }
    // the MoE exchanges, ep 2-4, zero-count pairs included
    for (int n = 2; n <= 4; n++)
        for (unsigned seed = 1; seed <= 3; seed++) {
            Sim* S = sim_new(n);
            moe_programs(S, n, seed);
            snprintf(name, sizeof(name), "MoE all-to-all-v ep=%d (seed %u) completes under both rule sets", n, seed);
            check_completes(S, name);
        }
    // the model can fail: a receive posted before the send it waits for, on
    // both ranks, with blocking calls, deadlocks under any rules
    Sim* S = sim_new(2);
    S->members[0] = S->members[1] = 3;
    for (int r = 0; r < 2; r++) {
        emit(&S->prog[r], (HostOp){H_RECV, 0, 1 - r, 0, 0, 0, 0});
        emit(&S->prog[r], (HostOp){H_SEND, 0, 1 - r, 0, 0, 0, 0});
    }
    check(sim_run(S, RULES_CHANNELS, HOST_AHEAD, 1, why, sizeof(why)) != NULL,
          "the model finds a real deadlock (both ranks receive first)", "it completes");
    sim_free(S);
    return test_exit_code();
}
