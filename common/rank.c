// rank.c: this process's rank and rank 0's output (rank.h).
#include "rank.h"

#include <mpi.h>
#include <stdarg.h>
#include <stdio.h>

int world_rank(void) {
    int initialized = 0, finalized = 0, rank = 0;
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    if (initialized && !finalized) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    return rank;
}

void print0(const char* fmt, ...) {
    if (world_rank() != 0) return;
    va_list ap;
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    fflush(stdout);
}
