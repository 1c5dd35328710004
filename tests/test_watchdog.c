// test_watchdog.c: a rank that stops while its peer sits in a plain MPI call
// (not one of comm.c's marked waits) still ends the job (watch_mpi.c).
// Two ranks, one blocking call named on the command line:
//   mpirun -np 2 build/tests/test_watchdog allreduce|bcast|recv|gather|barrier|comm_split|comm_dup
// Both start the watchdog with a 1 s timeout; rank 1 then stops itself with
// SIGSTOP (alive to the kernel, dead to its peer) and rank 0 makes the call.
// The job must end by MPI_Abort with the watchdog's message naming rank 1;
// before watch_mpi.c it hung until the runner's timeout.
//
//   mpirun -np 2 build/tests/test_watchdog brief
// The opposite: no stall. Rank 0 waits in MPI_Recv for at least 4 timeouts
// while rank 1 makes 20 brief marked waits (0.2 s each, as comm.c marks a
// wait on a peer that answers soon) back to back, then sends. Every census
// rank 0 takes finds rank 1 inside a wait, but one shorter than the
// timeout: rank 1 is moving, and the run must end normally (exit 0). A
// census that counted "inside a wait" as stuck, or a wait clock not restarted
// at each wait, calls it a deadlock. Checked: with watchdog.c's census test
// `states[r].waited < timeout_s` removed (only `!states[r].waiting` left),
// this mode ended with "error: watchdog: every rank has waited more than
// 1 s ... (a deadlock)" and exit 3, and tests/watchdog.sh failed.
//
// run by: tests/watchdog.sh (on 2 MPI ranks)
#include <mpi.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "runtime.h"
#include "watchdog.h"

int main(int argc, char** argv) {
    runtime_init(&argc, &argv);
    int rank = 0, size = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    const char* call = argc > 1 ? argv[1] : "";
    if (size != 2 || (strcmp(call, "allreduce") && strcmp(call, "bcast") && strcmp(call, "recv") &&
                      strcmp(call, "gather") && strcmp(call, "barrier") && strcmp(call, "comm_split") &&
                      strcmp(call, "comm_dup") && strcmp(call, "brief"))) {
        if (rank == 0)
            fprintf(stderr,
                    "usage: mpirun -np 2 test_watchdog allreduce|bcast|recv|gather|barrier|comm_split|comm_dup|brief\n");
        MPI_Finalize();
        return 2;
    }
    watchdog_start(1.0);
    MPI_Barrier(MPI_COMM_WORLD);
    if (!strcmp(call, "brief")) {
        int waits = 0;
        if (rank == 1) {
            // 20 waits of 0.2 s (a fifth of the timeout) back to back: at least 4 s
            // inside a wait nearly all the time, none of them long. A count, not a
            // clock, so that a loaded machine changes how long it takes, not what
            // the test prints
            struct timespec pause = {0, 200000000};
            for (; waits < 20; waits++) {
                watchdog_enter("brief", "world", 0);
                nanosleep(&pause, NULL);
                watchdog_leave();
            }
            MPI_Send(&waits, 1, MPI_INT, 0, 0, MPI_COMM_WORLD);
        } else {
            MPI_Recv(&waits, 1, MPI_INT, 1, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);  // at least 4 s: longer than the timeout
            printf("rank 0 waited in MPI_Recv while rank 1 made %d brief waits: no watchdog\n", waits);
        }
        runtime_finalize();
        return 0;
    }
    if (rank == 1) {
        raise(SIGSTOP);  // never returns in a passing run: the job is ended
        fprintf(stderr, "rank 1 was continued: the test was interrupted\n");
        return 1;
    }
    double x = 1.0, y = 0.0, both[2];
    printf("rank 0 enters MPI_%s while rank 1 is stopped\n", call);
    fflush(stdout);
    if (!strcmp(call, "allreduce")) MPI_Allreduce(&x, &y, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    if (!strcmp(call, "bcast")) MPI_Bcast(&x, 1, MPI_DOUBLE, 1, MPI_COMM_WORLD);
    if (!strcmp(call, "recv")) MPI_Recv(&x, 1, MPI_DOUBLE, 1, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    if (!strcmp(call, "gather")) MPI_Gather(&x, 1, MPI_DOUBLE, both, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    if (!strcmp(call, "barrier")) MPI_Barrier(MPI_COMM_WORLD);
    MPI_Comm made = MPI_COMM_NULL;  // a new group needs every member (the capstone makes its groups mid-set-up)
    if (!strcmp(call, "comm_split")) MPI_Comm_split(MPI_COMM_WORLD, 0, rank, &made);
    if (!strcmp(call, "comm_dup")) MPI_Comm_dup(MPI_COMM_WORLD, &made);
    // reached only if rank 1's stop went unnoticed and the call returned
    fprintf(stderr, "MPI_%s returned with rank 1 stopped\n", call);
    return 1;
}
