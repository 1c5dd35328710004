// comm_count.h: the counters both communication backends keep (comm.h
// reads them out). Only common/cpu/comm.c and common/cuda/comm.c call these.
#ifndef COMM_COUNT_H
#define COMM_COUNT_H

#include "comm.h"

// The counter slot named `name`: an axis's, the world's, or a group's,
// registered at its first use (groups are created collectively, so every
// rank numbers the slots alike).
int comm_slot_for(const char* name);
// "dp+cp": the name of a group over `axes` (axes in enum order).
void comm_group_slot_name(const Mesh* mesh, unsigned axes, char* out, size_t len);
// The MPI_Comm_split colour of this rank's group over `axes`: the world rank
// of its member with coordinate 0 on every grouped axis.
int comm_group_color(const Mesh* mesh, unsigned axes);
// NULL if ranks[0..n) is a valid list of distinct world ranks, else msg.
const char* comm_check_rank_list(const int* ranks, int n, int world_size, char* msg, size_t len);
// The MPI side of a group, the same on both backends (each then makes its
// own Comm from it). Over a set of mesh axes: every rank is in one group;
// *slot gets the group's counter slot. Over listed ranks: a bad list ends
// every rank with a message; every rank registers the slot (the summary's
// slots agree), and a rank not listed gets MPI_COMM_NULL.
MPI_Comm comm_group_split_axes(const Mesh* mesh, unsigned axes, int* slot);
MPI_Comm comm_group_split_ranks(const int* ranks, int n, const char* name, int* slot);

// Counts one call on c's axis: bytes is the size it works on per rank
// (nccl-tests' "size"), factor nccl-tests' bus factor for it.
void comm_tally(const Comm* c, Collective coll, size_t bytes, double factor);
// Counts bytes sent and bus bytes separately (all-to-all-v: what leaves the rank).
void comm_tally_bytes(const Comm* c, Collective coll, double bytes, double bus_bytes);
// (p - 1) / p for a group of p ranks, 0 for one rank.
double comm_ring_factor(const Comm* c);
// Adds seconds spent blocked in communication (and, with --trace, a wait
// span of exactly that length, ending now, named after the last comm_tally
// or comm_request_current).
void comm_add_wait(double seconds);
// Adds seconds spent inside a non-blocking start or comm_test (a comm span).
void comm_add_progress(double seconds);
// The trace's view of a request: tagged with the operation just tallied
// when it starts (call after the request is cleared), named by the wait or
// test working on it, and drawn in flight from its start to its completion.
void comm_request_started(CommRequest* req);
void comm_request_current(const CommRequest* req);
void comm_request_done(const CommRequest* req);
// The next progress seconds are comm_progress's polling ("progress" spans).
void comm_note_progress(void);
// on = 1 while a collective made of other comm_* calls runs (--comm hand),
// 0 after it: the calls inside it are not counted, nor their seconds.
void comm_count_quiet(int on);
// How many collectives chapter 1's hand-written code ran on this rank since
// comm_counts_reset (0 under --comm library): the summary's
// "hand_collectives", so a test can tell that --comm hand took effect.
long comm_hand_collectives(void);

#endif
