// runtime.h: process start-up and shutdown, threads and clocks.
#ifndef RUNTIME_H
#define RUNTIME_H

// MPI_Init; MPI errors are returned to the caller (MPI_CHECK reports them).
void runtime_init(int* argc, char*** argv);
void runtime_finalize(void);

// Ranks of MPI_COMM_WORLD on this node, and this rank's index among them.
int runtime_local_size(void);
int runtime_local_rank(void);

// Threads per rank: requested if > 0, else OMP_NUM_THREADS if set, else
// (cores on the node / ranks on the node), capped by the cores this rank is bound to, at least 1, so
// oversubscribed ranks never spin threads against each other. Sets OpenMP's
// and OpenBLAS's thread counts; returns the count.
int runtime_set_threads(int requested);
// The cores this process may run on (its CPU affinity).
int runtime_cores_allowed(void);

// Seconds on a monotonic clock.
double now_seconds(void);

#endif
