// yield_sleep.c: the test runner's sched_yield, a 50 us sleep (tests/lib.sh
// preloads it into every rank of every test run; nothing else uses it).
//
// Why: the tests run 2 jobs of 2 to 16 ranks at a time on 2 cores. A rank
// that waits for a message polls Open MPI's progress loop, and with
// mpi_yield_when_idle (tests/lib.sh) each idle poll calls sched_yield. With
// more runnable ranks than cores that hands the core over, but a rank whose
// peers are waiting too gets it straight back: the waiting ranks take turns
// at the core in a loop of system calls (sys was 45% of `make test`'s CPU
// time) while the one rank with work to do waits for its turn. A short sleep
// takes the waiting rank off the run queue instead, so the core goes to the
// rank that computes. The messages and the numbers are the same; a wait ends
// at most one sleep (plus the kernel's timer slack) after its message came.
// README.md ("What keeps `make test` short") gives the measured effect.
//
// The sleep is 50 us: against 20 us and 200 us in the same runs, the CPU
// time was the same within noise, and 50 us keeps the added latency per
// message far below a test step's milliseconds.
#define _GNU_SOURCE
#include <sched.h>
#include <time.h>

int sched_yield(void) {
    struct timespec pause = {0, 50 * 1000};
    nanosleep(&pause, NULL);
    return 0;
}
