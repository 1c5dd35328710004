// collectives.c: chapter 1's collectives by hand over point-to-point
// messages (collectives.h). Each one is written with nothing but send and
// receive (comm_send, comm_recv, comm_sendrecv), so a student sees which
// chunk moves where at each step. Chapter 1's main.c checks them against the
// library and times them; with --comm hand the CPU comm layer runs them for
// chapters 2 and later, which link this module through their NN_name/modules
// file (the table at the end registers it).
#include "collectives.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "exercise.h"  // exercise_not_done, in a homework tree
#include "memory.h"
#include "ops.h"
#include "rank.h"

// ---------------------------------------------------------------- tracing
// With --trace each algorithm records one line per message; chapter 1 prints
// the lines by rank 0, step by step, after the algorithm ends.

static int trace_on = 0;
static int trace_first_step = 0;  // where a composed algorithm's second phase starts
static char trace_text[HAND_TRACE_BYTES];
static size_t trace_used = 0;

void hand_trace_enable(int on) { trace_on = on; }
char* hand_trace_buffer(void) { return trace_text; }
void hand_trace_clear(void) {
    memset(trace_text, 0, sizeof(trace_text));
    trace_used = 0;
}

static void trace(int step, const char* fmt, ...) {
    if (!trace_on) return;
    char line[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof(line), fmt, ap);
    va_end(ap);
    int w = snprintf(trace_text + trace_used, sizeof(trace_text) - trace_used, "%04d|  step %d: rank %d %s\n",
                     trace_first_step + step, trace_first_step + step, world_rank(), line);
    if (w > 0 && trace_used + (size_t)w < sizeof(trace_text)) trace_used += (size_t)w;
}

// ---------------------------------------------------------------- chunks

static int mod(int a, int p) { return ((a % p) + p) % p; }

// ---------------------------------------------------------------- ring reduce-scatter
// In place: afterwards chunk r of buf on rank r holds the sum over all ranks
// of their chunk r; the other chunks hold partial sums. tmp holds one chunk.
//
// The ring: every rank sends to r+1 and receives from r-1, all at once. At
// step k (k = 0 .. p-2) rank r sends its running sum of chunk (r-1-k) and
// receives the running sum of chunk (r-2-k) from its left neighbour, adding
// it to its own. Each chunk travels once around the ring collecting one
// contribution per hop, and the chunk that arrives last at rank r is chunk r.
//
//   p = 3, step 0: rank 0 sends chunk 2, rank 1 chunk 0, rank 2 chunk 1
//          step 1: rank 0 sends chunk 1 (now 2 terms), rank 1 chunk 2, rank 2 chunk 0
//          done:   rank 0 holds sum of chunk 0, rank 1 of chunk 1, rank 2 of chunk 2
//
// Each rank sends (p-1) chunks of n/p: (p-1)/p * n floats, the minimum.
void hand_reduce_scatter_ring(const Comm* c, float* buf, size_t n, float* tmp) {
    // EXERCISE 2: ring reduce-scatter: p-1 steps, rank r ends with the sum of chunk r (any n, any p)
    int p = c->size, r = c->rank;
    int right = mod(r + 1, p), left = mod(r - 1, p);
    for (int k = 0; k < p - 1; k++) {
        int send_chunk = mod(r - 1 - k, p), recv_chunk = mod(r - 2 - k, p);
        trace(k, "sends chunk %d to rank %d, adds chunk %d from rank %d", send_chunk, right, recv_chunk, left);
        comm_sendrecv(c, buf + chunk_start(n, p, send_chunk), chunk_size(n, p, send_chunk), right,
                      tmp, chunk_size(n, p, recv_chunk), left);
        ops_add(buf + chunk_start(n, p, recv_chunk), tmp, chunk_size(n, p, recv_chunk));
    }
    // END EXERCISE 2
}

// ---------------------------------------------------------------- ring all-gather
// In place: on entry rank r holds block r of buf (block i is [starts[i],
// starts[i+1]), any sizes: the uneven all-gather); afterwards every rank holds
// every block. At step k rank r forwards block (r-k), which it received at
// step k-1 (or owns, at step 0), and receives block (r-1-k). (p-1) steps.
void hand_allgather_ring(const Comm* c, float* buf, const size_t* starts) {
    // EXERCISE 3: ring all-gather: p-1 steps, every rank ends with every block (blocks of any size)
    int p = c->size, r = c->rank;
    int right = mod(r + 1, p), left = mod(r - 1, p);
    for (int k = 0; k < p - 1; k++) {
        int send_block = mod(r - k, p), recv_block = mod(r - 1 - k, p);
        trace(k, "sends block %d to rank %d, receives block %d from rank %d", send_block, right, recv_block, left);
        comm_sendrecv(c, buf + starts[send_block], starts[send_block + 1] - starts[send_block], right,
                      buf + starts[recv_block], starts[recv_block + 1] - starts[recv_block], left);
    }
    // END EXERCISE 3
}

// ---------------------------------------------------------------- ring all-reduce
// = reduce-scatter, then all-gather of the reduced chunks. Every rank sends
// 2(p-1)/p * n floats, independent of p for large p: bandwidth-optimal.
void hand_allreduce_ring(const Comm* c, float* buf, size_t n, float* tmp) {
    hand_reduce_scatter_ring(c, buf, n, tmp);
    int p = c->size;
    size_t* starts = xmalloc(sizeof(size_t) * (p + 1));
    for (int i = 0; i <= p; i++) starts[i] = chunk_start(n, p, i);
    trace_first_step = p - 1;
    hand_allgather_ring(c, buf, starts);
    trace_first_step = 0;
    free(starts);
}

// ---------------------------------------------------------------- recursive doubling all-reduce
// For small messages latency dominates: log2(p) steps beat the ring's 2(p-1).
// At step k rank r swaps its whole buffer with rank r XOR 2^k and both add:
// after step k every rank holds the sum over a group of 2^(k+1) ranks.
//
// When p is not a power of two, the first 2*rem ranks (rem = p - 2^m) pair
// up: each even rank hands its buffer to the odd one above it and sits out;
// the remaining 2^m ranks double; at the end the odd ranks hand the result
// back. tmp holds n floats.
void hand_allreduce_doubling(const Comm* c, float* buf, size_t n, float* tmp) {
    // EXERCISE 5: recursive-doubling all-reduce, for any p (fold the ranks above a power of two in and out)
    int p = c->size, r = c->rank;
    int pow2 = 1;
    while (pow2 * 2 <= p) pow2 *= 2;
    int rem = p - pow2;
    int step = 0;
    // fold the extra ranks in
    int vrank;  // this rank's index among the pow2 that double, or -1
    if (r < 2 * rem) {
        if (r % 2 == 0) {
            trace(step, "sends its buffer to rank %d and sits out", r + 1);
            comm_send(c, buf, n, r + 1);
            vrank = -1;
        } else {
            trace(step, "adds the buffer of rank %d", r - 1);
            comm_recv(c, tmp, n, r - 1);
            ops_add(buf, tmp, n);
            vrank = r / 2;
        }
        step++;
    } else {
        vrank = r - rem;
        if (rem) step++;
    }
    // double among pow2 ranks
    if (vrank >= 0) {
        for (int mask = 1; mask < pow2; mask <<= 1, step++) {
            int vpeer = vrank ^ mask;
            int peer = vpeer < rem ? 2 * vpeer + 1 : vpeer + rem;
            trace(step, "swaps its buffer with rank %d and adds", peer);
            comm_sendrecv(c, buf, n, peer, tmp, n, peer);
            ops_add(buf, tmp, n);
        }
    } else {
        for (int mask = 1; mask < pow2; mask <<= 1) step++;
    }
    // hand the result back to the ranks that sat out
    if (r < 2 * rem) {
        if (r % 2 == 1) {
            trace(step, "sends the result to rank %d", r - 1);
            comm_send(c, buf, n, r - 1);
        } else {
            trace(step, "receives the result from rank %d", r + 1);
            comm_recv(c, buf, n, r + 1);
        }
    }
    // END EXERCISE 5
}

// ---------------------------------------------------------------- binomial-tree broadcast
// Ranks are numbered relative to the root (v = r - root). In round k the 2^k
// ranks that have the data (v < 2^k) each send it to v + 2^k, if that is
// below p. ceil(log2 p) rounds instead of the root's p-1 sends.
void hand_broadcast_tree(const Comm* c, float* buf, size_t n, int root) {
    // EXERCISE 1: binomial-tree broadcast: root's buffer to every rank in ceil(log2 p) rounds
    int p = c->size, v = mod(c->rank - root, p);
    int round = 0;
    for (int mask = 1; mask < p; mask <<= 1, round++) {
        if (v < mask && v + mask < p) {
            int dst = mod(v + mask + root, p);
            trace(round, "sends the buffer to rank %d", dst);
            comm_send(c, buf, n, dst);
        } else if (v >= mask && v < 2 * mask) {
            int src = mod(v - mask + root, p);
            trace(round, "receives the buffer from rank %d", src);
            comm_recv(c, buf, n, src);
        }
    }
    // END EXERCISE 1
}

// ---------------------------------------------------------------- binomial-tree reduce
// The broadcast run backwards: in round k a rank whose bit k is set sends its
// partial sum to v - 2^k and is done; the rank below adds it. After log2(p)
// rounds the root holds the sum. buf is overwritten with partial sums on the
// other ranks. tmp holds n floats.
void hand_reduce_tree(const Comm* c, float* buf, size_t n, int root, float* tmp) {
    int p = c->size, v = mod(c->rank - root, p);
    int round = 0;
    for (int mask = 1; mask < p; mask <<= 1, round++) {
        if (v & mask) {
            int dst = mod(v - mask + root, p);
            trace(round, "sends its partial sum to rank %d", dst);
            comm_send(c, buf, n, dst);
            break;
        }
        if (v + mask < p) {
            int src = mod(v + mask + root, p);
            trace(round, "adds the partial sum of rank %d", src);
            comm_recv(c, tmp, n, src);
            ops_add(buf, tmp, n);
        }
    }
}

// ---------------------------------------------------------------- scatter and gather
// The root talks to every other rank in turn: p-1 messages of n floats. (A
// tree would take log2(p) rounds but sends the same bytes out of the root.)
void hand_scatter(const Comm* c, const float* send, float* recv, size_t n, int root) {
    if (c->rank == root) {
        for (int i = 0; i < c->size; i++) {
            if (i == root) continue;
            trace(mod(i - root, c->size) - 1, "sends block %d to rank %d", i, i);
            comm_send(c, send + (size_t)i * n, n, i);
        }
        ops_copy(recv, send + (size_t)root * n, n);
    } else {
        comm_recv(c, recv, n, root);
    }
}

void hand_gather(const Comm* c, const float* send, float* recv, size_t n, int root) {
    if (c->rank == root) {
        for (int i = 0; i < c->size; i++) {
            if (i == root) continue;
            trace(mod(i - root, c->size) - 1, "receives block %d from rank %d", i, i);
            comm_recv(c, recv + (size_t)i * n, n, i);
        }
        ops_copy(recv + (size_t)root * n, send, n);
    } else {
        comm_send(c, send, n, root);
    }
}

// ---------------------------------------------------------------- pairwise all-to-all
// Block j of rank i goes to rank j. In step k (k = 1 .. p-1) rank r sends
// its block r+k to rank r+k and receives block r of rank r-k: every rank
// sends and receives exactly once per step, no rank is idle or flooded.
void hand_alltoall_pairwise(const Comm* c, const float* send, float* recv, size_t n) {
    // EXERCISE 4: pairwise all-to-all: p-1 steps, one send and one receive per rank per step
    int p = c->size, r = c->rank;
    ops_copy(recv + (size_t)r * n, send + (size_t)r * n, n);
    for (int k = 1; k < p; k++) {
        int dst = mod(r + k, p), src = mod(r - k, p);
        trace(k - 1, "sends its block %d to rank %d, receives block %d of rank %d", dst, dst, r, src);
        comm_sendrecv(c, send + (size_t)dst * n, n, dst, recv + (size_t)src * n, n, src);
    }
    // END EXERCISE 4
}

// ---------------------------------------------------------------- pairwise all-to-all-v
// The uneven all-to-all of chapter 7's tokens, in the same p-1 pairwise
// steps: at step k rank r sends what it has for rank r+k and receives what
// rank r-k has for it. Not traced: the counts make the lines unreadable.
void hand_alltoallv_pairwise(const Comm* c, const float* send, const size_t* send_counts,
                             const size_t* send_displs, float* recv, const size_t* recv_counts,
                             const size_t* recv_displs) {
    int p = c->size, r = c->rank;
    ops_copy(recv + recv_displs[r], send + send_displs[r], send_counts[r]);
    for (int k = 1; k < p; k++) {
        int dst = mod(r + k, p), src = mod(r - k, p);
        comm_sendrecv(c, send + send_displs[dst], send_counts[dst], dst, recv + recv_displs[src], recv_counts[src], src);
    }
}

// ---------------------------------------------------------------- --comm hand
// The comm layer (common/) cannot include a chapter's header, so this module
// hands it the algorithms: a program that links the module registers them
// before main runs (a constructor), and --comm hand then calls them in place
// of the library's collectives (common/cpu/comm.c).
static const CommHandAlgorithms hand_algorithms = {
    .reduce_scatter_ring = hand_reduce_scatter_ring,
    .allgather_ring = hand_allgather_ring,
    .allreduce_ring = hand_allreduce_ring,
    .broadcast_tree = hand_broadcast_tree,
    .reduce_tree = hand_reduce_tree,
    .scatter = hand_scatter,
    .gather = hand_gather,
    .alltoall_pairwise = hand_alltoall_pairwise,
    .alltoallv_pairwise = hand_alltoallv_pairwise,
};

__attribute__((constructor)) static void hand_register(void) { comm_register_hand(&hand_algorithms); }
