// common.h: error handling shared by every file of the course.
//
// Two kinds of failure:
//   - a bug or a broken system call on one rank (malloc fails, an MPI call
//     returns an error): FATAL / MPI_CHECK print file and line, then abort the
//     whole MPI job, so no rank is left waiting in a collective.
//   - bad input that every rank sees the same way (a flag, a mesh, a file):
//     the caller builds a message and calls fail_all() on every rank; rank 0
//     prints it once and every rank exits non-zero.
#ifndef COMMON_H
#define COMMON_H

#include <stddef.h>
#include <stdio.h>
#include <stdint.h>

// Prints "file:line: message" with the rank, then aborts every rank.
void fatal_at(const char* file, int line, const char* fmt, ...)
    __attribute__((format(printf, 3, 4), noreturn));
#define FATAL(...) fatal_at(__FILE__, __LINE__, __VA_ARGS__)
#define CHECK(cond, ...)                                 \
    do {                                                 \
        if (!(cond)) fatal_at(__FILE__, __LINE__, __VA_ARGS__); \
    } while (0)

// Checks the return code of an MPI call.
#define MPI_CHECK(call)                                                        \
    do {                                                                       \
        int mpi_rc_ = (call);                                                  \
        if (mpi_rc_ != MPI_SUCCESS) fatal_at(__FILE__, __LINE__, "%s failed (MPI error %d)", #call, mpi_rc_); \
    } while (0)

// Every rank calls this with the same message: rank 0 prints "error: ..." to
// stderr, then every rank finalizes MPI and exits with status 1.
void fail_all(const char* fmt, ...) __attribute__((format(printf, 1, 2), noreturn));

// The stub that `make homework` puts in place of exercise n of a chapter:
// "error: exercise n of chapter N is not done", then every rank exits with
// status 3 (MPI_Abort). Rank 0 speaks at once; another rank that reaches a
// stub waits a moment first, so the one message comes from rank 0 whenever
// rank 0 reaches it too, and from that rank when rank 0 never does.
void exercise_not_done(int chapter, int n) __attribute__((noreturn));

// For a check that may fail on some ranks only (a file one node cannot read):
// every rank passes whether it failed and its message; if any rank failed, the
// lowest failing rank prints its message and every rank exits with status 1.
// Returns normally when no rank failed. Collective over MPI_COMM_WORLD.
void fail_if_any(int failed, const char* message);

// malloc for host-side bookkeeping (not device memory: see memory.h).
void* xmalloc(size_t bytes);
void* xcalloc(size_t count, size_t size);

// Atomic writes go to a temporary file renamed over the target. Between
// begin and end, SIGINT and SIGTERM remove that temporary file before the
// process dies, and SIGXFSZ (a file-size limit) is ignored so the write fails
// with an error instead. After kill -9 the temporary file (NAME.tmp.PID)
// remains; the target is never half written.
void tmpfile_guard_begin(const char* tmp_path);
void tmpfile_guard_end(void);

// One atomic file write, with the guard above: atomic_open creates
// PATH.tmp.PID and returns 0 or the errno; the caller writes to a->f and
// passes to atomic_close whether every write succeeded. atomic_close renames
// the temporary file over path, or removes it, and returns 0 or the errno of
// what failed (the first failed write, the close, or the rename).
typedef struct {
    FILE* f;
    char* tmp;
    const char* path;
} AtomicFile;
int atomic_open(AtomicFile* a, const char* path);
int atomic_close(AtomicFile* a, int ok);

// This process's rank in MPI_COMM_WORLD (0 before MPI is initialised).
int world_rank(void);

// printf on rank 0 only, flushed.
void print0(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

#endif
