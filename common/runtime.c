// runtime.c: start-up, threads, clocks (runtime.h).
#include "runtime.h"

#include <mpi.h>
#include <sched.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "args.h"  // ARGS_MAX_THREADS
#include "device.h"
#include "memory.h"
#include "ops.h"
#include "watchdog.h"
#include "errors.h"
#include "rank.h"

static int local_size = 1, local_rank = 0;

void runtime_init(int* argc, char*** argv) {
    // the watchdog's thread asks other ranks over MPI while the main thread
    // waits in a collective (watchdog.h): that needs MPI_THREAD_MULTIPLE,
    // which Open MPI gives; with less the watchdog stays off
    int provided = MPI_THREAD_SINGLE;
    device_environment();  // before MPI: a CUDA-aware MPI may start CUDA
    MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    // ranks that share memory are the ranks of one node
    MPI_Comm node;
    MPI_CHECK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node));
    MPI_CHECK(MPI_Comm_size(node, &local_size));
    MPI_CHECK(MPI_Comm_rank(node, &local_rank));
    MPI_Comm_free(&node);
}

void runtime_finalize(void) {
    watchdog_stop();
    MPI_Finalize();
}

int runtime_local_size(void) { return local_size; }
int runtime_local_rank(void) { return local_rank; }

int runtime_cores_allowed(void) {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof(set), &set) != 0) return (int)sysconf(_SC_NPROCESSORS_ONLN);
    return CPU_COUNT(&set);
}

int runtime_set_threads(int requested) {
    int n = requested;
    // OMP_NUM_THREADS, the OpenMP user's own setting, stands for --threads
    // when that is not given (tests/lib.sh sets 1: its scripts run two at a time)
    const char* env = getenv("OMP_NUM_THREADS");
    int from_env = env ? atoi(env) : 0;  // 0 when unset or not a number
    if (n <= 0 && from_env > 0) n = from_env < ARGS_MAX_THREADS ? from_env : ARGS_MAX_THREADS;
    if (n <= 0) {
        // a fair share of the node's cores, but never more than the cores this
        // rank may run on (mpirun binds ranks to cores unless --bind-to none)
        int share = (int)(sysconf(_SC_NPROCESSORS_ONLN) / local_size);
        int allowed = runtime_cores_allowed();
        n = share < allowed ? share : allowed;
        if (n < 1) n = 1;
        // Open MPI binds each rank to one core when it starts 2 ranks or
        // fewer: say so, or a student's first run is silently half as fast
        if (allowed < share)
            print0("note: mpirun bound each rank to %d core(s) of its share of %d: %d thread(s) per rank; "
                   "run mpirun with --bind-to none (tests/mpirun.sh does) to use them all\n",
                   allowed, share, n);
    }
    device_set_threads(n);
    return n;
}

double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
