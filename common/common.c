// common.c: error handling and small helpers (see common.h).
#include "common.h"

#include <mpi.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

int world_rank(void) {
    int initialized = 0, finalized = 0, rank = 0;
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    if (initialized && !finalized) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    return rank;
}

void fatal_at(const char* file, int line, const char* fmt, ...) {
    fprintf(stderr, "[rank %d] %s:%d: ", world_rank(), file, line);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n");
    fflush(stderr);
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (initialized) MPI_Abort(MPI_COMM_WORLD, 1);
    exit(1);
}

void fail_all(const char* fmt, ...) {
    if (world_rank() == 0) {
        fprintf(stderr, "error: ");
        va_list ap;
        va_start(ap, fmt);
        vfprintf(stderr, fmt, ap);
        va_end(ap);
        fprintf(stderr, "\n");
        fflush(stderr);
    }
    int initialized = 0, finalized = 0;
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    if (initialized && !finalized) MPI_Finalize();
    exit(1);
}

void fail_if_any(int failed, const char* message) {
    int rank = world_rank(), size = 1;
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    // the lowest failing rank speaks; size means "nobody failed"
    int mine = failed ? rank : size, first = size;
    MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (first == size) return;
    if (rank == first) {
        fprintf(stderr, "error: %s\n", message ? message : "(no message)");
        fflush(stderr);
    }
    MPI_Finalize();
    exit(1);
}

void* xmalloc(size_t bytes) {
    void* p = malloc(bytes ? bytes : 1);
    CHECK(p != NULL, "out of host memory allocating %zu bytes", bytes);
    return p;
}

void* xcalloc(size_t count, size_t size) {
    void* p = calloc(count ? count : 1, size ? size : 1);
    CHECK(p != NULL, "out of host memory allocating %zu x %zu bytes", count, size);
    return p;
}

void print0(const char* fmt, ...) {
    if (world_rank() != 0) return;
    va_list ap;
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    fflush(stdout);
}
