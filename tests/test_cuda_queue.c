// test_cuda_queue.c: the CUDA comm layer's queueing rules, modelled on the
// CPU, against every pipeline schedule, the ring and the MoE exchange.
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
//     its waits only (kernels always end); the host waits for it before the
//     loss's MPI_Bcast (mem_to_host) and at the end (device_synchronize);
//   - the code before (the held rules) waited on the host instead: on a
//     stream (every operation queued on it has ended) or on one request's
//     event (its own operation has ended).
// A state in which no host can go on and no group or compute wait can end,
// with work left (on a host or a stream), is a deadlock.
//
// Two rule sets:
//   held     the code before the fix: comm_isend/irecv are held and queued
//            as one group at the next comm_* call (comm_test and comm_wait
//            flush them; a blocking send/recv takes them into its own
//            group); every operation of a communicator runs on its one
//            stream; blocking calls wait on the host for the whole stream.
//   channels the code now (docs/cuda.md): point-to-point with a ring
//            neighbour goes on a channel of its own, one NCCL communicator
//            and stream per direction (this rank to the next, the next to
//            this rank, ...), queued at once; a channel carries one
//            direction only, so its sends and receives meet in the same
//            order; a blocking receive waits for its own message only;
//            collectives keep the communicator's stream; stream-ordered.
//   shared   the held rules on one stream for every communicator, as the
//            code runs them now (stream-ordered).
// Host timing is modelled twice: hosts run ahead of the GPU (comm_test sees
// "not done", the usual case), and the GPU keeps up (comm_test sees "done").
//   build/tests/test_cuda_queue [--show SCHEDULE PP M V]
//
// modules: 05_pipeline/schedule
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "schedule.h"
#include "test.h"

#define MAX_RANKS 8
#define NCOMM 2            // 0: pp / cp / ep; 1: the second group (embedding, dp+cp)
#define MAX_SEQ 4096       // operations per (communicator, from, to)
#define NSTREAM (NCOMM + NCOMM * MAX_RANKS * MAX_RANKS)

// RULES_HELD_QUIET_TEST: the held rules without the flush in comm_test
// (the issue's "removing the flush alone does not fix it")
// RULES_SHARED: the held rules on one stream for every communicator (an
// NCCL before 2.26, or NCCL_LAUNCH_ORDER_IMPLICIT=0)
typedef enum { RULES_HELD, RULES_CHANNELS, RULES_HELD_QUIET_TEST, RULES_SHARED } Rules;
#define HELD(S) ((S)->rules != RULES_CHANNELS)
typedef enum { HOST_AHEAD, GPU_KEEPS_UP } Timing;

// ---------------------------------------------------------------- host programs
typedef enum {
    H_RECV, H_SEND,     // blocking comm_recv / comm_send
    H_ISEND, H_IRECV,   // comm_isend / comm_irecv into request req
    H_WAIT,             // comm_wait(req)
    H_PIPE_SEND,        // chapter 5's send(): comm_test on its send slots, then comm_isend
    H_PIPE_SENDS_WAIT,  // chapter 5's sends_wait(): comm_wait on every slot
    H_ALLREDUCE,        // any blocking collective
    H_ALLTOALLV,        // comm_alltoallv with the peers in send / recv masks
    H_HOST_BCAST,       // MPI_Bcast on the host (modelled as a barrier)
} HostKind;

typedef struct {
    HostKind kind;
    int comm, peer, req;
    unsigned send_mask, recv_mask;
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
    int rank, comm, peer, seq, group;
} GOp;
typedef struct {
    int op0, nops, rank, done;
    int cdep;  // it starts once rank's compute stream has passed this many entries (ordered rules)
    int streams[MAX_RANKS * 2 + 2], nstreams;
} Group;
typedef struct {
    int* q;
    int head, tail;
} Stream;
typedef struct {
    int state;  // 0 inactive, 1 held, 2 queued
    int group;
} Req;
typedef struct {
    int kind, comm, peer, req;
    int cdep;  // the compute queued before comm_isend/irecv (its event)
} Held;

typedef struct {
    int nranks, big;
    Rules rules;
    Timing timing;
    int ordered;  // blocking calls and comm_wait make the compute stream wait, not the host

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
    int bar_seq[MAX_RANKS][NCOMM], bar_arrived[NCOMM][MAX_SEQ];
    int wait_compute[MAX_RANKS];  // the host waits for its compute stream (mem_to_host) first
    // the compute stream (ordered rules): entries "wait for group g", in order
    int* cq[MAX_RANKS];
    int chead[MAX_RANKS], ctail[MAX_RANKS];
    // GPU
    GOp* op;
    int n_op, cap_op;
    Group* group;
    int n_group, cap_group;
    Stream stream[MAX_RANKS][NSTREAM];
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
    }
    free(S->op), free(S->group), free(S->send_at), free(S->recv_at), free(S->coll_at);
    free(S);
}

// Clears the run state (the programs stay) for another run under other rules.
static void sim_reset(Sim* S, Rules rules, Timing timing, int big) {
    S->rules = rules, S->timing = timing, S->big = big;
    S->ordered = rules == RULES_CHANNELS || rules == RULES_SHARED;  // the code now; held: the code before
    memset(S->chead, 0, sizeof(S->chead)), memset(S->ctail, 0, sizeof(S->ctail));
    memset(S->wait_compute, 0, sizeof(S->wait_compute));
    memset(S->pc, 0, sizeof(S->pc)), memset(S->issued, 0, sizeof(S->issued)), memset(S->sub, 0, sizeof(S->sub));
    memset(S->req, 0, sizeof(S->req)), memset(S->n_slots, 0, sizeof(S->n_slots));
    memset(S->n_held, 0, sizeof(S->n_held)), memset(S->bar_seq, 0, sizeof(S->bar_seq));
    memset(S->bar_arrived, 0, sizeof(S->bar_arrived));
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
    for (int r = 0; r < MAX_RANKS; r++)
        for (int s = 0; s < NSTREAM; s++) S->stream[r][s].head = S->stream[r][s].tail = 0;
    S->n_op = S->n_group = 0;
}

// The stream an operation of rank r runs on: its communicator's, or (rules
// channels, point to point) the channel of its direction.
static int stream_of(const Sim* S, int comm, int from, int to, int p2p) {
    if (S->rules == RULES_SHARED) return 0;
    if (S->rules == RULES_CHANNELS && p2p) return NCOMM + (comm * MAX_RANKS + from) * MAX_RANKS + to;
    return comm;
}

static void push_stream(Sim* S, int r, int s, int g) {
    Stream* st = &S->stream[r][s];
    if (!st->q) st->q = malloc(65536 * sizeof(int));
    if (st->tail == 65536) {
        fprintf(stderr, "test_cuda_queue: stream overflow\n");
        exit(2);
    }
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
    S->op[S->n_op++] = (GOp){kind, r, comm, peer, seq, g};
    G->nops++;
    int have = 0;
    for (int i = 0; i < G->nstreams; i++) have |= G->streams[i] == s;
    if (!have) G->streams[G->nstreams++] = s;
}

// ncclGroupEnd: the group goes to the tail of every stream it uses.
static void group_end(Sim* S, int g) {
    Group* G = &S->group[g];
    for (int i = 0; i < G->nstreams; i++) push_stream(S, G->rank, G->streams[i], g);
    if (G->nops == 0) G->done = 1;
}

static int group_running(const Sim* S, int g) {
    const Group* G = &S->group[g];
    if (G->done || S->chead[G->rank] < G->cdep) return 0;
    for (int i = 0; i < G->nstreams; i++) {
        const Stream* st = &S->stream[G->rank][G->streams[i]];
        if (st->head == st->tail || st->q[st->head] != g) return 0;
    }
    return 1;
}
static int started(const Sim* S, int op1) { return op1 && (S->group[S->op[op1 - 1].group].done || group_running(S, S->op[op1 - 1].group)); }

static int op_can_complete(const Sim* S, const GOp* o) {
    if (o->kind == G_SEND) return !S->big || started(S, P2P_AT(S, recv_at, o->comm, o->rank, o->peer, o->seq));
    if (o->kind == G_RECV) return started(S, P2P_AT(S, send_at, o->comm, o->peer, o->rank, o->seq));
    for (int r = 0; r < S->nranks; r++)
        if ((S->members[o->comm] >> r & 1) && !started(S, COLL_AT(S, o->comm, o->seq, r))) return 0;
    return 1;
}

// Ends every running group that can end; returns how many did.
static int gpu_step(Sim* S) {
    int n = 0;
    for (int r = 0; r < S->nranks; r++)  // compute streams pass the waits whose group ended
        while (S->chead[r] < S->ctail[r] && S->group[S->cq[r][S->chead[r]]].done) S->chead[r]++, n++;
    for (int r = 0; r < S->nranks; r++)
        for (int s = 0; s < NSTREAM; s++) {
            Stream* st = &S->stream[r][s];
            if (st->head == st->tail) continue;
            int g = st->q[st->head];
            if (!group_running(S, g)) continue;
            Group* G = &S->group[g];
            int ok = 1;
            for (int i = 0; i < G->nops && ok; i++) ok = op_can_complete(S, &S->op[G->op0 + i]);
            if (!ok) continue;
            G->done = 1;
            for (int i = 0; i < G->nstreams; i++) S->stream[r][G->streams[i]].head++;
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

// comm_isend / comm_irecv
static void post(Sim* S, int r, HostKind kind, int comm, int peer, int q) {
    if (HELD(S)) {
        S->held[r][S->n_held[r]++] = (Held){kind, comm, peer, q, S->ctail[r]};
        S->req[r][q] = (Req){1, -1};
        return;
    }
    int g = group_begin(S, r);
    after_compute(S, g);
    group_add(S, g, kind == H_ISEND ? G_SEND : G_RECV, comm, peer, 1);
    group_end(S, g);
    S->req[r][q] = (Req){2, g};
}

// comm_test: held flushes first; then "done?" (the request stays active
// until a test or wait sees it done)
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

// Issues host op o of rank r (its side effects) and says what it waits for.
static void issue(Sim* S, int r, const HostOp* o) {
    S->wait_stream[r] = S->wait_group[r] = S->wait_req[r] = S->wait_bar_comm[r] = -1;
    switch (o->kind) {
        case H_RECV:
        case H_SEND: {
            int g = group_begin(S, r);
            if (HELD(S)) held_into(S, r, g);
            after_compute(S, g);
            group_add(S, g, o->kind == H_SEND ? G_SEND : G_RECV, o->comm, o->peer, 1);
            group_end(S, g);
            // end_blocking / end_channels: an event behind g on its stream (a
            // stream is FIFO: g's end is the end of all before it)
            if (S->ordered) compute_waits(S, r, g);
            else if (HELD(S)) S->wait_stream[r] = stream_of(S, o->comm, r, r, 0);  // the whole stream
            else S->wait_group[r] = g;                                           // its own message
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
        case H_ALLTOALLV: {
            flush(S, r);
            int g = group_begin(S, r);
            after_compute(S, g);
            if (o->kind == H_ALLREDUCE) group_add(S, g, G_COLL, o->comm, 0, 0);
            // the alltoallv's sends and receives are NCCL calls of its own
            // communicator in both rule sets: its stream, not a channel
            for (int p = 0; p < S->nranks; p++) {
                if (o->send_mask >> p & 1) group_add(S, g, G_SEND, o->comm, p, 0);
                if (o->recv_mask >> p & 1) group_add(S, g, G_RECV, o->comm, p, 0);
            }
            group_end(S, g);
            if (S->ordered) compute_waits(S, r, g);
            else S->wait_stream[r] = stream_of(S, o->comm, r, r, 0);
            break;
        }
        case H_HOST_BCAST:
            // the loss it sends came to the host by mem_to_host: a wait for
            // the compute stream first (device_synchronize, polled)
            S->wait_compute[r] = S->ordered;
            S->wait_bar_comm[r] = o->comm;
            S->wait_bar_seq[r] = S->bar_seq[r][o->comm]++;
            S->bar_arrived[o->comm][S->wait_bar_seq[r]]++;
            break;
    }
}

static int popcount(unsigned x) {
    int n = 0;
    for (; x; x &= x - 1) n++;
    return n;
}

// One step of rank r's host: issue its next operation or finish a wait.
static int host_step(Sim* S, int r) {
    Program* p = &S->prog[r];
    if (S->pc[r] >= p->n) return 0;
    const HostOp* o = &p->op[S->pc[r]];
    if (!S->issued[r]) {
        issue(S, r, o);
        S->issued[r] = 1;
        S->sub[r] = 0;
        return 1;
    }
    if (S->wait_compute[r]) {
        if (S->chead[r] < S->ctail[r]) return 0;
        S->wait_compute[r] = 0;
        return 1;
    }
    if (o->kind == H_PIPE_SENDS_WAIT) {
        while (S->sub[r] < S->n_slots[r]) {
            int q = S->slot_req[r][S->sub[r]];
            if (S->ordered) {
                wait_ordered(S, r, q);
                S->sub[r]++;
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
        stuck |= S->pc[r] < S->prog[r].n || S->chead[r] < S->ctail[r];
        for (int s = 0; s < NSTREAM; s++) stuck |= !stream_empty(S, r, s);
    }
    if (!stuck) return NULL;
    static const char* names[] = {"comm_recv", "comm_send", "comm_isend", "comm_irecv", "comm_wait", "send",
                                  "sends_wait", "collective", "comm_alltoallv", "MPI_Bcast"};
    size_t at = (size_t)snprintf(why, len, "deadlock:");
    for (int r = 0; r < S->nranks && at < len; r++) {
        if (S->pc[r] >= S->prog[r].n) {
            at += (size_t)snprintf(why + at, len - at, " rank %d %s;", r,
                                   S->chead[r] < S->ctail[r] ? "issued all, its compute stream waits" : "done");
            continue;
        }
        const HostOp* o = &S->prog[r].op[S->pc[r]];
        at += (size_t)snprintf(why + at, len - at, " rank %d in %s (peer %d, host op %d of %d);", r,
                               names[o->kind], o->peer, S->pc[r], S->prog[r].n);
    }
    return why;
}

// ---------------------------------------------------------------- chapter 5
// What 05_pipeline/main.c calls, per rank and step: each action's receive
// (the messages its peer sent before the one it needs, each a comm_recv:
// pipeline.c's pipe_incoming_build / pipe_receive), its send (send:
// comm_test on the slots, then comm_isend), sends_wait at the end of the
// lists, the tied embedding's all-reduce (first and last stage), the norm's
// all-reduce and the loss's MPI_Bcast; after two steps a validation forward
// (blocking sends).
typedef struct {
    int grad, mb, chunk;
} Msg;

static void pipeline_programs(Sim* S, const Schedule* sc) {
    int pp = sc->pp, NS = pp * sc->v;
    S->members[0] = (1u << pp) - 1;
    S->members[1] = pp > 1 ? (1u << 0) | (1u << (pp - 1)) : 0;
    for (int s = 0; s < pp; s++) {
        Program* p = &S->prog[s];
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
                if (act.type == ACT_F && k < NS - 1 && (k + 1) % pp == s) in[i][n[i]++] = (Msg){0, act.mb, (k + 1) / pp};
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
                        emit(p, (HostOp){H_RECV, 0, peer, 0, 0, 0});
                        have = m.grad == need && m.mb == act.mb && m.chunk == act.chunk;
                    }
                }
                if (to >= 0 && pp > 1) emit(p, (HostOp){H_PIPE_SEND, 0, to, 0, 0, 0});
            }
            emit(p, (HostOp){H_PIPE_SENDS_WAIT, 0, -1, 0, 0, 0});
            if (pp > 1 && (s == 0 || s == pp - 1)) emit(p, (HostOp){H_ALLREDUCE, 1, -1, 0, 0, 0});
            emit(p, (HostOp){H_ALLREDUCE, 0, -1, 0, 0, 0});
            emit(p, (HostOp){H_HOST_BCAST, 0, -1, 0, 0, 0});
        }
        for (int c = 0; c < sc->v && pp > 1; c++) {  // val_forward
            int k = c * pp + s;
            if (k > 0) emit(p, (HostOp){H_RECV, 0, (s + pp - 1) % pp, 0, 0, 0});
            if (k < NS - 1) emit(p, (HostOp){H_SEND, 0, (s + 1) % pp, 0, 0, 0});
        }
        for (int i = 0; i < n_in; i++) free(in[i]);
    }
}

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

// ---------------------------------------------------------------- chapter 6 and 7
// 06_sequence_context/context.c's ring attention (cp_ring_forward, then
// cp_ring_backward, as chapter 6's main.c calls them), with and without
// --cp-overlap, then the dp+cp gradient all-reduce.
static void ring_programs(Sim* S, int n, int overlap) {
    S->members[0] = S->members[1] = (1u << n) - 1;
    enum { FROM_LEFT, TO_RIGHT, D_FROM_LEFT, D_TO_RIGHT };
    for (int r = 0; r < n; r++) {
        Program* p = &S->prog[r];
        int right = (r + 1) % n, left = (r + n - 1) % n;
#define W(q) emit(p, (HostOp){H_WAIT, 0, -1, q, 0, 0})
        for (int s = 0; s < n; s++) {
            if (s < n - 1) {
                emit(p, (HostOp){H_IRECV, 0, left, FROM_LEFT, 0, 0});
                emit(p, (HostOp){H_ISEND, 0, right, TO_RIGHT, 0, 0});
            }
            if (!overlap) W(FROM_LEFT), W(TO_RIGHT);
            W(FROM_LEFT), W(TO_RIGHT);
        }
        for (int s = 0; s < n; s++) {
            if (s < n - 1) {
                emit(p, (HostOp){H_IRECV, 0, left, FROM_LEFT, 0, 0});
                emit(p, (HostOp){H_ISEND, 0, right, TO_RIGHT, 0, 0});
            }
            if (!overlap) W(FROM_LEFT), W(TO_RIGHT);
            if (s > 0) W(D_FROM_LEFT), W(D_TO_RIGHT);
            if (n > 1) {
                emit(p, (HostOp){H_IRECV, 0, left, D_FROM_LEFT, 0, 0});
                emit(p, (HostOp){H_ISEND, 0, right, D_TO_RIGHT, 0, 0});
                if (!overlap) W(D_FROM_LEFT), W(D_TO_RIGHT);
            }
            W(FROM_LEFT), W(TO_RIGHT);
        }
        W(D_FROM_LEFT), W(D_TO_RIGHT);
#undef W
        emit(p, (HostOp){H_ALLREDUCE, 1, -1, 0, 0, 0});
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
                emit(&S->prog[r], (HostOp){H_ALLTOALLV, 0, -1, 0, out, in});
            }
    }
    for (int r = 0; r < n; r++) {
        emit(&S->prog[r], (HostOp){H_ALLREDUCE, 1, -1, 0, 0, 0});
        emit(&S->prog[r], (HostOp){H_ALLREDUCE, 0, -1, 0, 0, 0});
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
    char name[128];
    snprintf(name, sizeof(name), "the channel rules complete all %d built-in schedules (pp 2-4, m 1-16, v 1-3)", total);
    check(chan_bad == 0 && total > 0, name, "%d cases deadlock, first: %s", chan_bad, first_chan);

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

    // the shared stream (held rules, one stream for every communicator):
    // what make gpu-check's NCCL_LAUNCH_ORDER_IMPLICIT=0 cases rely on
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
        emit(&S->prog[r], (HostOp){H_RECV, 0, 1 - r, 0, 0, 0});
        emit(&S->prog[r], (HostOp){H_SEND, 0, 1 - r, 0, 0, 0});
    }
    check(sim_run(S, RULES_CHANNELS, HOST_AHEAD, 1, why, sizeof(why)) != NULL,
          "the model finds a real deadlock (both ranks receive first)", "it completes");
    sim_free(S);
    return test_exit_code();
}
