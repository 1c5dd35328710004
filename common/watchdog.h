// watchdog.h: ends a job whose ranks stop making progress, as NCCL's and
// PyTorch's watchdogs do, instead of letting it hang forever.
//
// A thread on every rank watches its own main thread. The main thread marks
// every wait on other ranks (a collective, a message, a request's wait):
// watchdog_enter before, watchdog_leave after (comm.c names its waits; every
// other blocking MPI call is marked by watch_mpi.c; rank 0's write of a --log
// record is marked too, by report.c: a pipe whose reader stopped blocks
// there, and its peers wait for it). When one wait has lasted
// --timeout seconds, the thread asks every rank, over a communicator of its
// own, what it is doing (a census). A rank whose process is stopped or
// dead cannot answer: the job ends with one message naming it, the wait,
// its group and the step. A rank that answers "computing" is slow, not
// stuck: nothing happens (a loaded machine is no reason to kill a run). If
// every rank answers that it has waited longer than the timeout, nobody can
// move: a deadlock, and the job ends naming each rank's wait.
//
// The census uses MPI from the watchdog thread, so the runtime asks MPI for
// MPI_THREAD_MULTIPLE; with less, the watchdog stays off (a note says so).
#ifndef WATCHDOG_H
#define WATCHDOG_H

#define WATCHDOG_DEFAULT_SECONDS 300.0
// The shortest --timeout: a deadlock is every rank waiting longer than it,
// and below a second every rank inside one collective that has not yet
// finished (a start-up barrier, a large all-reduce) already looks like one;
// a census's answers may take that long on a loaded machine too.
#define WATCHDOG_MIN_SECONDS 1.0

// Starts the thread (every rank, collective; timeout <= 0: off).
void watchdog_start(double timeout_seconds);
// Stops and joins it (every rank, collective, before MPI_Finalize).
void watchdog_stop(void);

// The main thread's marks around a wait: op names it ("allreduce", "recv"),
// group the communicator's name ("dp", "world"), peer the other rank of a
// message (-1 for a collective); group "" for a wait on no group (a write
// to the --log). Waits nest; the outermost one is reported.
// op and group must outlive the wait (string literals, a Comm's name).
void watchdog_enter(const char* op, const char* group, int peer);
void watchdog_leave(void);
// The same from watch_mpi.c, around every blocking MPI call: marks only if
// the watchdog runs and the caller is the main thread (returns 1 then);
// leave takes what enter returned.
int watchdog_enter_mpi(const char* op, const char* group, int peer);
void watchdog_leave_mpi(int marked);
// The training step the main thread is in, for the message (report_step
// sets it after each step).
void watchdog_set_step(int step);

#endif
