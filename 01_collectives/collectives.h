// collectives.h: chapter 1's collectives, written by hand over send and
// receive (collectives.c). Chapter 1's main.c traces, checks and times them;
// the CPU comm layer runs them instead of MPI's under --comm hand
// (common/cpu/comm.c, through the table collectives.c registers), so the
// algorithms a student writes train the GPT of chapters 2 and later.
//
// Notation: p ranks in the group, r this rank, n floats. A buffer of n floats
// is cut into p chunks; chunk i is [start(i), start(i+1)) with
// start(i) = floor(n*i/p), so sizes differ by at most one and n need not
// divide by p.
#ifndef COLLECTIVES_H
#define COLLECTIVES_H

#include <stddef.h>

#include "comm.h"

static inline size_t chunk_start(size_t n, int p, int i) { return n * (size_t)i / (size_t)p; }
static inline size_t chunk_size(size_t n, int p, int i) { return chunk_start(n, p, i + 1) - chunk_start(n, p, i); }

// In place on buf (n): chunk r on rank r becomes the sum of every rank's chunk r.
// tmp: one chunk (n / p + 1 floats).
void hand_reduce_scatter_ring(const Comm* c, float* buf, size_t n, float* tmp);
// In place on buf: block i is [starts[i], starts[i+1]) (p + 1 entries, any
// sizes); rank r holds block r on entry, every block on return.
void hand_allgather_ring(const Comm* c, float* buf, const size_t* starts);
// In place on buf (n): the sum over the group on every rank. tmp: one chunk.
void hand_allreduce_ring(const Comm* c, float* buf, size_t n, float* tmp);
// The same by recursive doubling (any p). tmp: n floats.
void hand_allreduce_doubling(const Comm* c, float* buf, size_t n, float* tmp);
// buf (n) of root to every rank, binomial tree.
void hand_broadcast_tree(const Comm* c, float* buf, size_t n, int root);
// The sum of buf (n) over the group lands in buf on root (partial sums
// elsewhere), binomial tree. tmp: n floats.
void hand_reduce_tree(const Comm* c, float* buf, size_t n, int root, float* tmp);
// root's send (p * n): block r to rank r's recv (n).
void hand_scatter(const Comm* c, const float* send, float* recv, size_t n, int root);
// every rank's send (n) to block r of root's recv (p * n).
void hand_gather(const Comm* c, const float* send, float* recv, size_t n, int root);
// block j (n) of rank i's send lands at block i of rank j's recv (p * n each).
void hand_alltoall_pairwise(const Comm* c, const float* send, float* recv, size_t n);
// Uneven all-to-all, the same pairwise steps: rank r sends send_counts[j]
// floats at send + send_displs[j] to rank j, receives recv_counts[i] at
// recv + recv_displs[i] from rank i.
void hand_alltoallv_pairwise(const Comm* c, const float* send, const size_t* send_counts,
                             const size_t* send_displs, float* recv, const size_t* recv_counts,
                             const size_t* recv_displs);

// --trace: while on, every message of the algorithms above is recorded as one
// line "SSSS|  step S: rank R ..." (SSSS: the step, for sorting) in a buffer
// of HAND_TRACE_BYTES; chapter 1 gathers and prints it.
#define HAND_TRACE_BYTES 16384
void hand_trace_enable(int on);
char* hand_trace_buffer(void);
void hand_trace_clear(void);

#endif
