// harness.h: the bench around chapter 1's collectives. The lesson is in
// collectives.c (the algorithms) and main.c (which of them run, and how each
// is traced, checked and measured); this module is the plumbing those use:
// test data any rank can predict, the exact results to compare with, the
// checks of the library's own forms (all-to-all-v, the mean, the
// non-blocking forms, the counters), the gathered trace and the bench table.
#ifndef HARNESS_H
#define HARNESS_H

#include <stddef.h>

#include "comm.h"
#include "report.h"

// The algorithms of collectives.c, in the order the program runs them.
typedef enum {
    ALG_ALLREDUCE_RING, ALG_ALLREDUCE_DOUBLING, ALG_REDUCE_SCATTER, ALG_ALLGATHER,
    ALG_BROADCAST, ALG_REDUCE, ALG_SCATTER, ALG_GATHER, ALG_ALLTOALL, NUM_ALGS
} Algorithm;
extern const char* const alg_names[NUM_ALGS];
// broadcast, reduce, scatter and gather have a root
int alg_rooted(Algorithm a);

// ---------------------------------------------------------------- buffers and data
// Buffers for one run: n is the floats of the "size" (the whole buffer for
// all-reduce, broadcast and reduce; the total over ranks for the others).
// send is the input; the hand-written algorithm writes recv (tmp is its
// scratch), the library writes lib.
//
// Two kinds of data, both a pure function of (rank, index), so any rank can
// compute what every other rank holds:
//   integer-valued floats (random = 0): sums are exact in any order, results
//   compare bit for bit with the exact answer;
//   random floats in [-1, 1) (random = 1): sums depend on the order of
//   additions, results compare with a rounding bound.
typedef struct {
    float *send, *recv, *tmp, *lib;
    size_t n;
    int random;
} Buffers;
void buffers_alloc(Buffers* b, size_t n);
void buffers_free(Buffers* b);
// send: this rank's data of the given kind; recv and lib zeroed.
void buffers_fill(Buffers* b, int rank, int random);

// Elements of out (b->recv, the hand-written result, or b->lib, the
// library's) that differ from the exact result, summed over the group: none
// may on integer data; on random data an element may be off by
// p * FLT_EPSILON * (sum of |terms|), at least twice the first-order bound
// of p - 1 additions in any order. Collective.
long count_wrong(const Comm* c, Algorithm a, const Buffers* b, const float* out, int root);
// 1 when the hand-written run of a just done (its messages counted since
// comm_counts_reset) moved its data by the comm layer's point-to-point
// calls: no rank ran a collective (comm_*'s; MPI's own moves floats this
// count never sees), each received at least the floats it lacked of the
// result and no more than the lesson's steps move, and where the result
// cannot tell the algorithm (a tree broadcast from a linear one, recursive
// doubling from a tree reduce and broadcast) the traffic can. Else a FAIL
// line from rank 0, why, and 0. Collective.
int check_point_to_point(const Comm* c, Algorithm a, size_t n, int root);

// ---------------------------------------------------------------- checks of the library's own forms
// Each returns 1 when every rank passed (collective), and prints a FAIL line
// for what did not.
#define A2AV_PATTERNS 5
// All-to-all-v with count pattern 0 .. A2AV_PATTERNS-1: the library's and
// the hand-written pairwise one against the exact blocks.
int check_alltoallv(const Comm* c, int pattern);
// COMM_AVG in each form that takes it, against sum / p of integer data.
typedef enum { AVG_ALLREDUCE, AVG_REDUCE_SCATTER, AVG_REDUCE, AVG_IALLREDUCE, AVG_IREDUCE_SCATTER, NUM_AVG } AvgForm;
int check_average(const Comm* c, AvgForm form, size_t n);
// The non-blocking forms with compute in flight, against the blocking ones.
int check_nonblocking(const Comm* c);
// The comm layer's counters after one call of every collective.
int check_counters(const Comm* c);

// ---------------------------------------------------------------- --trace
// Gathers every rank's trace lines (collectives.h) to rank 0, which prints
// them under title in step order; clears the trace.
void hand_trace_print(const Comm* world, const char* title);

// ---------------------------------------------------------------- --bench
// nccl-tests' bus-bandwidth factor of algorithm a on p ranks.
double bench_bus_factor(Algorithm a, int p);
// One rank's memory copy bandwidth in GB/s, every rank copying at once; the
// physical bound of busbw on one machine. Printed and logged.
double bench_copy_gbps(const Comm* world, JsonLog* log);
// The table's head, and the head of algorithm a's rows.
void bench_header(int p);
void bench_alg_header(Algorithm a);
// One row: n floats, the hand-written and the library's seconds per call and
// wrong elements; printed and logged ({"type":"collective",...}).
void bench_row(JsonLog* log, Algorithm a, int p, size_t n, double t_hand, double t_lib, long wrong_hand,
               long wrong_lib);
// A size flag ("8", "64K", "256M", "1G") from 4 bytes to 1 GiB; 0 when it is none.
size_t bench_parse_bytes(const char* s);

#endif
