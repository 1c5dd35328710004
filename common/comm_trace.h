// comm_trace.h: the communication layer's spans on the --trace timeline
// (trace.h): each span is named after the operation it belongs to ("wait
// allreduce (dp)"), and lasts exactly the seconds comm_stats.c adds to its
// counters, so the timeline and the summary agree. comm_stats.c calls the
// first three; the backends call the request functions.
#ifndef COMM_TRACE_H
#define COMM_TRACE_H

#include "comm.h"

// The operation just counted, and its bytes as counted: the next wait or
// progress seconds belong to it, and its spans carry the bytes (per thread:
// a progress thread has its own).
void comm_trace_operation(Collective coll, int slot, double bytes);
// A span of `seconds` ending now: blocked in communication (a wait span),
// or inside a non-blocking start, test or progress poll (a comm span).
void comm_trace_wait(double seconds);
void comm_trace_progress(double seconds);
// The trace's view of a request: tagged with the operation just tallied
// when it starts (call after the request is cleared), named by the wait or
// test working on it, and drawn in flight from its start to its completion.
void comm_request_started(CommRequest* req);
void comm_request_current(const CommRequest* req);
void comm_request_done(const CommRequest* req);
// The next progress seconds are comm_progress's polling ("progress" spans).
void comm_note_progress(void);

#endif
