// harness.c: the bench around chapter 1's collectives (harness.h).
#include "harness.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "collectives.h"
#include "errors.h"
#include "rank.h"
#include "memory.h"
#include "device.h"
#include "ops.h"
#include "runtime.h"
#include "report.h"

const char* const alg_names[NUM_ALGS] = {
    "allreduce_ring", "allreduce_doubling", "reduce_scatter", "allgather",
    "broadcast", "reduce", "scatter", "gather", "alltoall"};

int alg_rooted(Algorithm a) { return a == ALG_BROADCAST || a == ALG_REDUCE || a == ALG_SCATTER || a == ALG_GATHER; }

static int mod(int a, int p) { return ((a % p) + p) % p; }

// ---------------------------------------------------------------- buffers and data

static float value_at(int random, int rank, size_t i) {
    if (!random) return (float)((int)((i * 7 + (size_t)rank * 13) % 17) - 8 + rank);
    uint64_t z = (uint64_t)i * 0x9E3779B97F4A7C15ull + (uint64_t)(rank + 1) * 0xD1B54A32D192ED03ull;
    z = (z ^ (z >> 31)) * 0xBF58476D1CE4E5B9ull;
    z ^= z >> 29;
    return (float)((double)(z >> 40) / 8388608.0 - 1.0);
}

static void fill(float* x, size_t n, int rank, int random) {
    for (size_t i = 0; i < n; i++) x[i] = value_at(random, rank, i);
}

// The exact result at output index i of algorithm a on rank r, in double, and
// the sum of magnitudes that bounds its rounding error.
static double expected_at(Algorithm a, int p, int r, int root, size_t n, size_t i, int random, double* magnitude) {
    size_t per = n / p;
    double sum = 0.0, mag = 0.0;
    switch (a) {
        case ALG_ALLREDUCE_RING: case ALG_ALLREDUCE_DOUBLING: case ALG_REDUCE_SCATTER: case ALG_REDUCE:
            for (int q = 0; q < p; q++) {
                sum += value_at(random, q, i);
                mag += fabs(value_at(random, q, i));
            }
            break;
        case ALG_ALLGATHER: {  // index i lies in the chunk of its owner
            int owner = 0;
            while (chunk_start(n, p, owner + 1) <= i) owner++;
            sum = value_at(random, owner, i);
            break;
        }
        case ALG_BROADCAST: sum = value_at(random, root, i); break;
        case ALG_SCATTER: sum = value_at(random, root, (size_t)r * per + i); break;
        case ALG_GATHER: sum = value_at(random, (int)(i / per), i % per); break;
        case ALG_ALLTOALL: sum = value_at(random, (int)(i / per), (size_t)r * per + i % per); break;
        default: break;
    }
    *magnitude = mag;
    return sum;
}

void buffers_alloc(Buffers* b, size_t n) {
    size_t m = n ? n : 1;
    b->n = n;
    b->send = mem_alloc_floats(m, MEM_COMM);
    b->recv = mem_alloc_floats(m, MEM_COMM);
    b->tmp = mem_alloc_floats(m, MEM_COMM);
    b->lib = mem_alloc_floats(m, MEM_COMM);
}

void buffers_free(Buffers* b) {
    mem_free(b->send);
    mem_free(b->recv);
    mem_free(b->tmp);
    mem_free(b->lib);
}

void buffers_fill(Buffers* b, int rank, int random) {
    b->random = random;
    float* host = xmalloc(sizeof(float) * (b->n ? b->n : 1));
    fill(host, b->n, rank, random);
    mem_to_device(b->send, host, sizeof(float) * b->n);
    free(host);
    mem_zero(b->recv, sizeof(float) * b->n);
    mem_zero(b->lib, sizeof(float) * b->n);
}

// The range of the output that is defined on this rank: [*lo, *hi).
static void defined_range(const Comm* c, Algorithm a, size_t n, int root, size_t* lo, size_t* hi) {
    int p = c->size;
    *lo = 0;
    *hi = n;
    if (a == ALG_REDUCE_SCATTER) {
        *lo = chunk_start(n, p, c->rank);
        *hi = chunk_start(n, p, c->rank + 1);
    } else if (a == ALG_REDUCE || a == ALG_GATHER) {
        if (c->rank != root) *hi = 0;
        else if (a == ALG_GATHER) *hi = (n / p) * p;
    } else if (a == ALG_SCATTER) {
        *hi = n / p;
    } else if (a == ALG_ALLTOALL) {
        *hi = (n / p) * p;
    }
}

long count_wrong(const Comm* c, Algorithm a, const Buffers* b, const float* out, int root) {
    size_t lo, hi, n = b->n;
    defined_range(c, a, n, root, &lo, &hi);
    float* host = xmalloc(sizeof(float) * (n ? n : 1));
    mem_to_host(host, out, sizeof(float) * n);
    float mine = 0.0f;
    for (size_t i = lo; i < hi; i++) {
        double mag;
        double want = expected_at(a, c->size, c->rank, root, n, i, b->random, &mag);
        double bound = b->random ? c->size * 1.1920929e-7 * mag : 0.0;
        // written so that a NaN (every comparison false) counts as wrong
        if (!(fabs((double)host[i] - want) <= bound)) mine += 1.0f;
    }
    free(host);
    // bookkeeping on the host, so through MPI itself, not the device comm layer
    float total = 0.0f;
    MPI_CHECK(MPI_Allreduce(&mine, &total, 1, MPI_FLOAT, MPI_SUM, c->mpi));
    return (long)total;
}

// The floats rank r lacks of algorithm a's result (n as in Buffers): any
// algorithm made of messages receives at least that much, since every one
// of them depends on data only other ranks hold (a partial sum may carry
// many ranks' terms, but still one float per element it covers).
static double floats_lacked(Algorithm a, size_t n, int p, int r, int root) {
    if (p == 1) return 0.0;
    switch (a) {
        case ALG_ALLREDUCE_RING:
        case ALG_ALLREDUCE_DOUBLING: return (double)n;
        case ALG_REDUCE_SCATTER: return (double)chunk_size(n, p, r);
        case ALG_ALLGATHER: return (double)(n - chunk_size(n, p, r));
        case ALG_BROADCAST: return r == root ? 0.0 : (double)n;
        case ALG_REDUCE: return r == root ? (double)n : 0.0;
        case ALG_SCATTER: return r == root ? 0.0 : (double)(n / p);
        case ALG_GATHER: return r == root ? (double)(n - n / p) : 0.0;
        case ALG_ALLTOALL: return (double)(n - n / p);
        default: return 0.0;
    }
}

// The floats rank r receives at most in the exercises' algorithms, whose
// step counts are the lesson's (-1: no bound checked): a ring of p-1 steps
// receives p-1 chunks (whichever way it turns, so at most n less the
// smallest chunk, n / p rounded down), twice for the all-reduce; the
// all-gather ring and the pairwise all-to-all every block but their own
// once; the tree broadcast the buffer once. One step too many still leaves
// the right result, so only this count sees it.
static double floats_most(Algorithm a, size_t n, int p, int r, int root) {
    if (p == 1) return 0.0;
    double ring = (double)(n - n / (size_t)p);
    switch (a) {
        case ALG_REDUCE_SCATTER: return ring;
        case ALG_ALLREDUCE_RING: return 2.0 * ring;
        case ALG_ALLGATHER:
        case ALG_ALLTOALL:
        case ALG_BROADCAST: return floats_lacked(a, n, p, r, root);
        default: return -1.0;
    }
}

// Which algorithm ran, where results alone cannot tell (-1: nothing checked).
// A binomial-tree broadcast takes ceil(log2 p) rounds of at most one send a
// rank: a linear one (the root sends p-1 times) ends right too. Recursive
// doubling moves, over all ranks, rem = p - 2^m buffers folded in, 2^m
// swapped in each of its m steps and rem handed back: a tree reduce and
// broadcast moves 2(p-1) n instead.
static double sent_most(Algorithm a, size_t n, int p) {
    int rounds = 0;
    while ((1 << rounds) < p) rounds++;
    return a == ALG_BROADCAST ? (double)rounds * (double)n : -1.0;
}
static double received_in_all(Algorithm a, size_t n, int p) {
    int pow2 = 1, m = 0;
    while (pow2 * 2 <= p) pow2 *= 2, m++;
    return a == ALG_ALLREDUCE_DOUBLING ? (double)(2 * (p - pow2) + pow2 * m) * (double)n : -1.0;
}

// Why a rank's run was not the exercise's, most telling first (NONE: it was).
typedef enum { MSG_NONE, MSG_COLLECTIVE, MSG_LACKED, MSG_TOO_MANY, MSG_SENT, MSG_IN_ALL } MessageFault;

int check_point_to_point(const Comm* c, Algorithm a, size_t n, int root) {
    double received = comm_count(COLL_RECV, c->axis).bytes / sizeof(float);
    double sent = comm_count(COLL_SEND, c->axis).bytes / sizeof(float);
    double lacked = floats_lacked(a, n, c->size, c->rank, root), most = floats_most(a, n, c->size, c->rank, root);
    double collectives = 0.0, in_all = 0.0, want_in_all = received_in_all(a, n, c->size);
    for (int k = 0; k < NUM_COLLECTIVES; k++)
        if (k != COLL_SEND && k != COLL_RECV && k != COLL_BARRIER) collectives += comm_count((Collective)k, c->axis).calls;
    // bookkeeping through MPI itself, as count_wrong
    MPI_CHECK(MPI_Allreduce(&received, &in_all, 1, MPI_DOUBLE, MPI_SUM, c->mpi));
    double sent_bound = sent_most(a, n, c->size);
    MessageFault fault = MSG_NONE;
    if (collectives > 0) fault = MSG_COLLECTIVE;
    else if (received < lacked) fault = MSG_LACKED;
    else if (most >= 0 && received > most) fault = MSG_TOO_MANY;
    else if (sent_bound >= 0 && sent > sent_bound) fault = MSG_SENT;
    else if (want_in_all >= 0 && in_all != want_in_all) fault = MSG_IN_ALL;
    // the lowest failing rank's figures to rank 0
    int me = fault != MSG_NONE ? c->rank : c->size, first = c->size;
    MPI_CHECK(MPI_Allreduce(&me, &first, 1, MPI_INT, MPI_MIN, c->mpi));
    if (first == c->size) return 1;
    double f[6] = {(double)fault, received, lacked, collectives, most, sent};
    MPI_CHECK(MPI_Bcast(f, 6, MPI_DOUBLE, first, c->mpi));
    print0("  FAIL %s n=%zu", alg_names[a], n);
    if (alg_rooted(a)) print0(" root=%d", root);
    print0(": ");
    switch ((MessageFault)f[0]) {
        case MSG_COLLECTIVE:
            print0("rank %d called %.0f collectives of the comm layer: build it of comm_send, comm_recv and "
                   "comm_sendrecv alone (the library is what it is checked against, not the exercise)\n", first, f[3]);
            break;
        case MSG_LACKED:
            print0("rank %d received %.0f of the %.0f floats of the result it lacks by comm_send, comm_recv and "
                   "comm_sendrecv: a message missing or sent to the wrong rank (or moved by MPI itself, which is "
                   "not the exercise)\n", first, f[1], f[2]);
            break;
        case MSG_TOO_MANY:
            print0("rank %d received %.0f floats, more than the %.0f of the lesson's steps (a step too many? the ring "
                   "takes p-1)\n", first, f[1], f[4]);
            break;
        case MSG_SENT:
            print0("rank %d sent %.0f floats, more than the %.0f of ceil(log2 p) tree rounds with one send each (the "
                   "root sending to every rank?)\n", first, f[5], sent_bound);
            break;
        default:
            print0("the ranks received %.0f floats in all, where recursive doubling moves %.0f: the p - 2^m extra "
                   "ranks' buffers folded in, 2^m ranks swapping theirs at each of m steps, the results handed back "
                   "(a reduce, then a broadcast?)\n", in_all, want_in_all);
    }
    return 0;
}

// ---------------------------------------------------------------- checks of the library's own forms

// All-to-all-v: every pair of ranks has its own count, 0 included. The
// library's (comm_alltoallv) and the hand-written pairwise one
// (hand_alltoallv_pairwise, what --comm hand runs) are each compared with
// the exact result, which every rank can compute: element k of
// what rank i sends to rank j is 1000 i + 10 j + (k mod 10), an integer, so a
// block from the wrong sender, for the wrong receiver or at the wrong offset
// changes some element. The blocks sit in the buffers out of rank order with
// gaps between them (displacements are not prefix sums of the counts), and
// the gaps of the receive buffer must come back untouched.
static size_t a2av_count(int pattern, int i, int j, int p) {
    switch (pattern) {
        case 0: return (size_t)((i + 2 * j) % 4);                    // 0 to 3
        case 1: return i == j ? 0 : (size_t)((i * p + j) * 7 % 13);   // nothing to itself
        case 2: return i == 0 ? 0 : (size_t)(4099 + i + 3 * j);       // rank 0 sends nothing
        case 3: return 0;                                             // nobody sends anything
        default: return (size_t)(65537 + (i + 5 * j) % 7);            // large (ops run threaded)
    }
}
#define A2AV_GAP_VALUE 1e6f

static float a2av_value(int from, int to, size_t k) { return (float)(1000 * from + 10 * to + (int)(k % 10)); }

int check_alltoallv(const Comm* c, int pattern) {
    int p = c->size, r = c->rank;
    size_t* sc = xmalloc(sizeof(size_t) * 4 * p);
    size_t *sd = sc + p, *rc = sc + 2 * p, *rd = sc + 3 * p;
    // send blocks in reverse rank order, one float apart; receive blocks in
    // rank order, two floats apart
    size_t send_len = 0, recv_len = 0;
    for (int j = p - 1; j >= 0; j--) {
        sc[j] = a2av_count(pattern, r, j, p);
        sd[j] = send_len;
        send_len += sc[j] + 1;
    }
    for (int i = 0; i < p; i++) {
        rc[i] = a2av_count(pattern, i, r, p);
        rd[i] = recv_len;
        recv_len += rc[i] + 2;
    }
    float* hsend = xmalloc(sizeof(float) * send_len);
    float* hrecv = xmalloc(sizeof(float) * recv_len);
    for (size_t k = 0; k < send_len; k++) hsend[k] = -A2AV_GAP_VALUE;  // must never arrive anywhere
    for (int j = 0; j < p; j++)
        for (size_t k = 0; k < sc[j]; k++) hsend[sd[j] + k] = a2av_value(r, j, k);
    for (size_t k = 0; k < recv_len; k++) hrecv[k] = A2AV_GAP_VALUE;
    float* send = mem_alloc_floats(send_len, MEM_COMM);
    float* recv = mem_alloc_floats(recv_len, MEM_COMM);
    mem_to_device(send, hsend, sizeof(float) * send_len);
    mem_to_device(recv, hrecv, sizeof(float) * recv_len);

    // the library's, then the hand-written pairwise one (collectives.c, what
    // --comm hand runs), each against the expected blocks and untouched gaps
    long wrong = 0;
    for (int hand = 0; hand < 2; hand++) {
        if (hand) {
            for (size_t k = 0; k < recv_len; k++) hrecv[k] = A2AV_GAP_VALUE;
            mem_to_device(recv, hrecv, sizeof(float) * recv_len);
            hand_alltoallv_pairwise(c, send, sc, sd, recv, rc, rd);
        } else {
            comm_alltoallv(c, send, sc, sd, recv, rc, rd);
        }
        mem_to_host(hrecv, recv, sizeof(float) * recv_len);
        size_t at = 0;
        for (int i = 0; i < p; i++) {
            for (size_t k = 0; k < rc[i]; k++, at++)
                if (hrecv[at] != a2av_value(i, r, k)) wrong++;
            for (int g = 0; g < 2; g++, at++)
                if (hrecv[at] != A2AV_GAP_VALUE) wrong++;
        }
    }
    mem_free(send);
    mem_free(recv);
    free(hsend);
    free(hrecv);
    free(sc);
    long total = 0;
    MPI_CHECK(MPI_Allreduce(&wrong, &total, 1, MPI_LONG, MPI_SUM, c->mpi));
    if (total) print0("  FAIL alltoallv count pattern %d: %ld elements wrong\n", pattern, total);
    return total == 0;
}

// COMM_AVG (the mean, which chapter 2 uses for gradients) against the exact
// mean of integer data. The sum S is exact; the layer then multiplies by
// fl(1/p). When p is a power of two, 1/p and S/p are exact: the result must be
// bit-exact. Otherwise two roundings (of 1/p, then of the product) bound the
// error by (2u + u^2) |S/p|, u = FLT_EPSILON/2, and that is the bound used.
static const char* avg_names[NUM_AVG] = {"allreduce", "reduce_scatter", "reduce", "iallreduce", "ireduce_scatter"};

int check_average(const Comm* c, AvgForm form, size_t n) {
    int p = c->size, r = c->rank, root = p - 1;
    int pow2 = (p & (p - 1)) == 0;
    const double u = 1.1920928955078125e-7 / 2;
    // reduce-scatter forms: n per rank, p*n in; the others: n in, n out
    int scatter = form == AVG_REDUCE_SCATTER || form == AVG_IREDUCE_SCATTER;
    size_t in_n = scatter ? (size_t)p * n : n;
    float* host = xmalloc(sizeof(float) * (in_n ? in_n : 1));
    fill(host, in_n, r, 0);  // integer data: the sum is exact
    float* in = mem_alloc_floats(in_n ? in_n : 1, MEM_COMM);
    float* out = mem_alloc_floats(n ? n : 1, MEM_COMM);
    mem_to_device(in, host, sizeof(float) * in_n);
    mem_zero(out, sizeof(float) * n);
    CommRequest req;
    float* result = out;
    switch (form) {
        case AVG_ALLREDUCE: comm_allreduce(c, in, n, COMM_AVG); result = in; break;
        case AVG_REDUCE_SCATTER: comm_reduce_scatter(c, in, out, n, COMM_AVG); break;
        case AVG_REDUCE: comm_reduce(c, in, out, n, root, COMM_AVG); break;
        case AVG_IALLREDUCE:
            comm_iallreduce(c, in, n, COMM_AVG, &req);
            comm_wait(&req);
            result = in;
            break;
        default:
            comm_ireduce_scatter(c, in, out, n, COMM_AVG, &req);
            comm_wait(&req);
            break;
    }
    mem_to_host(host, result, sizeof(float) * n);
    long wrong = 0;
    // the element of the global buffer that output i stands for
    size_t first = scatter ? (size_t)r * n : 0;
    if (form != AVG_REDUCE || r == root) {
        for (size_t i = 0; i < n; i++) {
            double sum = 0.0;
            for (int q = 0; q < p; q++) sum += value_at(0, q, first + i);
            double want = sum / p;
            double bound = pow2 ? 0.0 : (2 * u + u * u) * fabs(want);
            if (!(fabs((double)host[i] - want) <= bound)) wrong++;
        }
    }
    mem_free(in);
    mem_free(out);
    free(host);
    long total = 0;
    MPI_CHECK(MPI_Allreduce(&wrong, &total, 1, MPI_LONG, MPI_SUM, c->mpi));
    if (total) print0("  FAIL COMM_AVG %s n=%zu: %ld elements differ from sum/p\n", avg_names[form], n, total);
    return total == 0;
}

// Non-blocking forms: start, compute (a matmul) while the operation is in
// flight, wait, and compare with the blocking result.
int check_nonblocking(const Comm* c) {
    int p = c->size, ok = 1;
    size_t n = (size_t)p * 1000;
    float* a = mem_alloc_floats(n, MEM_COMM);
    float* b = mem_alloc_floats(n, MEM_COMM);
    float* out = mem_alloc_floats(n, MEM_COMM);
    float* ref = mem_alloc_floats(n, MEM_COMM);
    float* host = xmalloc(sizeof(float) * n);
    float* host2 = xmalloc(sizeof(float) * n);
    const int m = 128;
    float* x = mem_alloc_floats((size_t)m * m, MEM_OTHER);
    float* y = mem_alloc_floats((size_t)m * m, MEM_OTHER);
    // the matmul is only there to keep the rank busy, but it must not read
    // uninitialised memory (NaNs and denormals would change its speed too)
    mem_zero(x, sizeof(float) * m * m);
    CommRequest req;
    for (int kind = 0; kind < 5; kind++) {
        fill(host, n, c->rank, 0);
        mem_to_device(a, host, sizeof(float) * n);
        mem_to_device(b, host, sizeof(float) * n);
        mem_zero(out, sizeof(float) * n);
        mem_zero(ref, sizeof(float) * n);
        size_t cmp = n;
        if (kind == 0) {
            comm_iallreduce(c, a, n, COMM_AVG, &req);
            matmul_forward(y, x, x, NULL, m, m, m);  // compute while it flies
            comm_wait(&req);
            comm_allreduce(c, b, n, COMM_AVG);
            mem_to_host(host, a, sizeof(float) * n);
            mem_to_host(host2, b, sizeof(float) * n);
        } else if (kind == 1) {
            comm_ireduce_scatter(c, a, out, n / p, COMM_SUM, &req);
            matmul_forward(y, x, x, NULL, m, m, m);
            comm_wait(&req);
            comm_reduce_scatter(c, b, ref, n / p, COMM_SUM);
            cmp = n / p;
            mem_to_host(host, out, sizeof(float) * cmp);
            mem_to_host(host2, ref, sizeof(float) * cmp);
        } else if (kind == 2) {
            comm_iallgather(c, a, out, n / p, &req);
            matmul_forward(y, x, x, NULL, m, m, m);
            comm_wait(&req);
            comm_allgather(c, b, ref, n / p);
            mem_to_host(host, out, sizeof(float) * n);
            mem_to_host(host2, ref, sizeof(float) * n);
        } else if (kind == 3) {
            comm_ibroadcast(c, a, n, p - 1, &req);
            matmul_forward(y, x, x, NULL, m, m, m);
            comm_wait(&req);
            comm_broadcast(c, b, n, p - 1);
            mem_to_host(host, a, sizeof(float) * n);
            mem_to_host(host2, b, sizeof(float) * n);
        } else {
            // a ring shift with isend/irecv: receive the left neighbour's data
            CommRequest send_req;
            int right = mod(c->rank + 1, p), left = mod(c->rank - 1, p);
            comm_irecv(c, out, n, left, &req);
            comm_isend(c, a, n, right, &send_req);
            matmul_forward(y, x, x, NULL, m, m, m);
            comm_wait(&req);
            comm_wait(&send_req);
            fill(host2, n, left, 0);
            mem_to_host(host, out, sizeof(float) * n);
        }
        if (memcmp(host, host2, sizeof(float) * cmp) != 0) {
            ok = 0;
            printf("  FAIL non-blocking form %d on rank %d differs from the blocking one\n", kind, c->rank);
        }
    }
    mem_free(a);
    mem_free(b);
    mem_free(out);
    mem_free(ref);
    mem_free(x);
    mem_free(y);
    free(host);
    free(host2);
    int bad = !ok, any_bad = 0;
    MPI_CHECK(MPI_Allreduce(&bad, &any_bad, 1, MPI_INT, MPI_MAX, c->mpi));
    return !any_bad;
}

// The counters: one call of every collective (and a second pass with the
// non-blocking forms), each compared with nccl-tests' conventions written out
// here: bytes = the size per rank (count for all-reduce, broadcast and reduce,
// count * p for the others), bus bytes = bytes * 2(p-1)/p for all-reduce,
// (p-1)/p for reduce-scatter, all-gather, scatter, gather and all-to-all, 1 for
// broadcast, reduce and send, 0 for recv and barrier. allgatherv and
// alltoallv are counted as allgather and alltoall; alltoallv counts what this
// rank sends, and as bus bytes what of that leaves the rank. Every counter not
// named must stay 0, on every axis.
typedef struct {
    double calls, bytes, bus;
} Want;

static int counters_match(const Comm* c, const Want want[NUM_COLLECTIVES], const char* pass) {
    int ok = 1;
    for (int axis = 0; axis < COMM_NUM_AXES; axis++) {
        for (int k = 0; k < NUM_COLLECTIVES; k++) {
            CommCount got = comm_count((Collective)k, axis);
            Want w = axis == c->axis ? want[k] : (Want){0, 0, 0};
            // bus bytes go through a floating-point factor: allow its rounding
            if (got.calls != w.calls || got.bytes != w.bytes || !(fabs(got.bus_bytes - w.bus) <= 1e-9 * (1.0 + w.bus))) {
                printf("  FAIL counters (%s) on rank %d, %s on axis %s: calls %.0f bytes %.0f bus %.1f, want %.0f %.0f %.1f\n",
                       pass, c->rank, collective_name((Collective)k), comm_axis_name(axis), got.calls, got.bytes,
                       got.bus_bytes, w.calls, w.bytes, w.bus);
                ok = 0;
            }
        }
    }
    return ok;
}

int check_counters(const Comm* c) {
    int p = c->size, r = c->rank;
    int right = mod(r + 1, p), left = mod(r - 1, p);
    double ring = p > 1 ? (double)(p - 1) / p : 0.0, one = p > 1 ? 1.0 : 0.0;
    const size_t n = 1000, m = 250;  // n floats for the whole-buffer forms, m per rank for the others
    double B = 4.0 * n, M = 4.0 * m * p;
    size_t big = m * (size_t)p;
    float* buf = mem_alloc_floats(n, MEM_COMM);
    float* buf2 = mem_alloc_floats(n, MEM_COMM);
    float* x = mem_alloc_floats(big, MEM_COMM);
    float* y = mem_alloc_floats(big, MEM_COMM);
    mem_zero(buf, sizeof(float) * n);
    mem_zero(x, sizeof(float) * big);
    // uneven counts: allgatherv, rank i brings i+1 floats; alltoallv, rank i
    // sends (i + j) mod 3 floats to rank j (0 included)
    size_t* v = xmalloc(sizeof(size_t) * 6 * p);
    size_t *gc = v, *gd = v + p, *sc = v + 2 * p, *sd = v + 3 * p, *rc = v + 4 * p, *rd = v + 5 * p;
    size_t gtotal = 0, sent = 0, so = 0, ro = 0;
    for (int i = 0; i < p; i++) {
        gc[i] = (size_t)i + 1;
        gd[i] = gtotal;
        gtotal += gc[i];
        sc[i] = (size_t)((r + i) % 3);
        sd[i] = so;
        so += sc[i];
        rc[i] = (size_t)((i + r) % 3);
        rd[i] = ro;
        ro += rc[i];
        sent += sc[i];
    }

    // pass 1: one call of every blocking collective
    Want want[NUM_COLLECTIVES] = {{0, 0, 0}};
    comm_counts_reset();
    comm_allreduce(c, buf, n, COMM_SUM);
    want[COLL_ALLREDUCE] = (Want){1, B, B * 2 * ring};
    comm_reduce_scatter(c, x, y, m, COMM_SUM);
    want[COLL_REDUCE_SCATTER] = (Want){1, M, M * ring};
    comm_allgather(c, y, x, m);
    comm_allgatherv(c, y, x, gc, gd);
    want[COLL_ALLGATHER] = (Want){2, M + 4.0 * gtotal, (M + 4.0 * gtotal) * ring};
    comm_broadcast(c, buf, n, 0);
    want[COLL_BROADCAST] = (Want){1, B, B * one};
    comm_reduce(c, buf, buf2, n, p - 1, COMM_SUM);
    want[COLL_REDUCE] = (Want){1, B, B * one};
    comm_scatter(c, x, y, m, 0);
    want[COLL_SCATTER] = (Want){1, M, M * ring};
    comm_gather(c, y, x, m, p - 1);
    want[COLL_GATHER] = (Want){1, M, M * ring};
    comm_alltoall(c, x, y, m);
    comm_alltoallv(c, x, sc, sd, y, rc, rd);
    want[COLL_ALLTOALL] = (Want){2, M + 4.0 * sent, M * ring + 4.0 * (sent - sc[r])};
    comm_sendrecv(c, buf, n, right, buf2, n, left);
    want[COLL_SEND] = (Want){1, B, B};
    want[COLL_RECV] = (Want){1, B, 0};
    comm_barrier(c);
    want[COLL_BARRIER] = (Want){1, 0, 0};
    int ok = counters_match(c, want, "blocking");

    // pass 2: the non-blocking forms count as their blocking twins
    Want want2[NUM_COLLECTIVES] = {{0, 0, 0}};
    CommRequest req, req2;
    comm_counts_reset();
    comm_iallreduce(c, buf, n, COMM_SUM, &req);
    comm_wait(&req);
    want2[COLL_ALLREDUCE] = want[COLL_ALLREDUCE];
    comm_ireduce_scatter(c, x, y, m, COMM_SUM, &req);
    comm_wait(&req);
    want2[COLL_REDUCE_SCATTER] = want[COLL_REDUCE_SCATTER];
    comm_iallgather(c, y, x, m, &req);
    comm_wait(&req);
    want2[COLL_ALLGATHER] = (Want){1, M, M * ring};
    comm_ibroadcast(c, buf, n, 0, &req);
    comm_wait(&req);
    want2[COLL_BROADCAST] = want[COLL_BROADCAST];
    comm_irecv(c, buf2, n, left, &req);
    comm_isend(c, buf, n, right, &req2);
    comm_wait(&req);
    comm_wait(&req2);
    want2[COLL_SEND] = want[COLL_SEND];
    want2[COLL_RECV] = want[COLL_RECV];
    ok = counters_match(c, want2, "non-blocking") && ok;

    comm_counts_reset();
    free(v);
    mem_free(buf);
    mem_free(buf2);
    mem_free(x);
    mem_free(y);
    int bad = !ok, any_bad = 0;
    MPI_CHECK(MPI_Allreduce(&bad, &any_bad, 1, MPI_INT, MPI_MAX, c->mpi));
    return !any_bad;
}

// ---------------------------------------------------------------- --trace

void hand_trace_print(const Comm* world, const char* title) {
    // every rank's lines to rank 0, which sorts them by step (the 4-digit
    // prefix) and prints them without the prefix
    int p = world->size;
    char* all = world->rank == 0 ? xmalloc((size_t)HAND_TRACE_BYTES * p) : NULL;
    MPI_CHECK(MPI_Gather(hand_trace_buffer(), HAND_TRACE_BYTES, MPI_CHAR, all, HAND_TRACE_BYTES, MPI_CHAR, 0, world->mpi));
    if (world->rank == 0) {
        printf("\n%s\n", title);
        int lines = 0;
        char* line_ptr[4096];
        for (int r = 0; r < p; r++) {
            char* text = all + (size_t)HAND_TRACE_BYTES * r;
            text[HAND_TRACE_BYTES - 1] = '\0';
            for (char* s = strtok(text, "\n"); s && lines < 4096; s = strtok(NULL, "\n")) line_ptr[lines++] = s;
        }
        // stable insertion sort by step: ranks stay in order within a step
        for (int i = 1; i < lines; i++) {
            char* x = line_ptr[i];
            int j = i - 1;
            while (j >= 0 && strncmp(line_ptr[j], x, 4) > 0) {
                line_ptr[j + 1] = line_ptr[j];
                j--;
            }
            line_ptr[j + 1] = x;
        }
        for (int i = 0; i < lines; i++) printf("%s\n", line_ptr[i] + 5);
        fflush(stdout);
        free(all);
    }
    hand_trace_clear();
}

// ---------------------------------------------------------------- --bench

// nccl-tests' bus-bandwidth factors and "size" conventions
double bench_bus_factor(Algorithm a, int p) {
    if (p == 1) return 0.0;
    switch (a) {
        case ALG_ALLREDUCE_RING: case ALG_ALLREDUCE_DOUBLING: return 2.0 * (p - 1) / p;
        case ALG_BROADCAST: case ALG_REDUCE: return 1.0;
        default: return (double)(p - 1) / p;
    }
}

// The physical limit on one machine: every byte a collective moves between
// ranks is copied through memory at least once (read + write), so one rank's
// memory copy bandwidth bounds busbw. Measured with every rank copying at once,
// as during a collective.
static double measure_copy_gbps(const Comm* world) {
    size_t n = (size_t)16 << 20;  // 64 MiB of floats
    float* a = mem_alloc_floats(n, MEM_COMM);
    float* b = mem_alloc_floats(n, MEM_COMM);
    double best = 1e30;
    for (int i = 0; i < 5; i++) {
        comm_barrier(world);
        double t0 = now_seconds();
        ops_copy(b, a, n);
        device_synchronize();
        double dt = now_seconds() - t0;
        if (dt < best) best = dt;
    }
    mem_free(a);
    mem_free(b);
    return (double)n * sizeof(float) / best / 1e9;
}

// One JSONL record {"type":TYPE,<fields>} (rank 0, which holds the log).
static void log_record(JsonLog* log, const char* type, const JsonBuf* fields) {
    if (!log->f) return;
    if (fprintf(log->f, "{\"type\":\"%s\",%s}\n", type, json_fields(fields)) < 0 || fflush(log->f) != 0)
        FATAL("writing the log file '%s' failed", log->path);
}

double bench_copy_gbps(const Comm* world, JsonLog* log) {
    double copy = measure_copy_gbps(world);
    print0("\n# memory copy bandwidth per rank, all ranks copying at once: %.2f GB/s (64 MiB memcpy, best of 5)\n", copy);
    JsonBuf rec = {0};
    json_add_int(&rec, "ranks", world->size);
    json_add_double(&rec, "gbps", copy, "%.4f");
    log_record(log, "copy_bandwidth", &rec);
    json_free(&rec);
    return copy;
}

void bench_header(int p) {
    print0("\n# nccl-tests-style table, %d ranks, float sum, times in us, bandwidths in GB/s\n"
           "# algbw = size / time; busbw = algbw * (2(p-1)/p all-reduce, (p-1)/p gather/scatter/all-to-all, 1 broadcast/reduce)\n"
           "# hand/lib = the hand-written busbw over the library's (lib time / hand time: above 1, by hand is faster)\n", p);
}

void bench_alg_header(Algorithm a) {
    print0("\n# %s\n#%12s %12s %6s %6s | %10s %8s %8s %6s | %10s %8s %8s %6s | %9s\n", alg_names[a], "size (B)",
           "count", "type", "redop", "hand (us)", "algbw", "busbw", "#wrong", "lib (us)", "algbw", "busbw", "#wrong",
           "hand/lib");
}

void bench_row(JsonLog* log, Algorithm a, int p, size_t n, double th, double tl, long wrong_hand, long wrong_lib) {
    double size = (double)n * sizeof(float);
    double f = bench_bus_factor(a, p);
    double ah = size / th / 1e9, al = size / tl / 1e9;
    print0(" %12.0f %12zu %6s %6s | %10.1f %8.3f %8.3f %6ld | %10.1f %8.3f %8.3f %6ld | %9.3f\n", size, n,
           "float", "sum", th * 1e6, ah, ah * f, wrong_hand, tl * 1e6, al, al * f, wrong_lib, tl / th);
    JsonBuf rec = {0};
    json_add_string(&rec, "op", alg_names[a]);
    json_add_int(&rec, "ranks", p);
    json_add_double(&rec, "bytes", size, "%.0f");
    json_add_int(&rec, "count", (long long)n);
    json_add_double(&rec, "hand_us", th * 1e6, "%.3f");
    json_add_double(&rec, "hand_algbw", ah, "%.5f");
    json_add_double(&rec, "hand_busbw", ah * f, "%.5f");
    json_add_int(&rec, "hand_wrong", wrong_hand);
    json_add_double(&rec, "lib_us", tl * 1e6, "%.3f");
    json_add_double(&rec, "lib_algbw", al, "%.5f");
    json_add_double(&rec, "lib_busbw", al * f, "%.5f");
    json_add_int(&rec, "lib_wrong", wrong_lib);
    log_record(log, "collective", &rec);
    json_free(&rec);
}

size_t bench_parse_bytes(const char* s) {
    // decimal digits and an optional K, M or G: "64.9" or "0x40" would
    // otherwise pass strtod and be cut or read in hex without a word
    if (*s < '0' || *s > '9') return 0;
    char* end = NULL;
    double v = (double)strtoull(s, &end, 10);
    if (*end == 'K' || *end == 'k') v *= 1024, end++;
    else if (*end == 'M' || *end == 'm') v *= 1024 * 1024, end++;
    else if (*end == 'G' || *end == 'g') v *= 1024.0 * 1024 * 1024, end++;
    if (*end || !(v >= 4 && v <= 1024.0 * 1024 * 1024)) return 0;
    return (size_t)v;
}
