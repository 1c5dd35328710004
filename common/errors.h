// errors.h: how a rank reports what went wrong.
//
// Two kinds of failure:
//   - a bug or a broken system call on one rank (malloc fails, an MPI call
//     returns an error): FATAL / MPI_CHECK print file and line, then abort the
//     whole MPI job, so no rank is left waiting in a collective.
//   - bad input that every rank sees the same way (a flag, a mesh, a file):
//     the caller builds a message and calls fail_all() on every rank; rank 0
//     prints it once and every rank exits non-zero.
#ifndef ERRORS_H
#define ERRORS_H

// The buffer a message is built in: room for three paths of the system's
// 4096 bytes (a flag's value is at most ARGS_MAX_STRING, args.h) and the
// words around them, so an error naming a long path keeps its reason.
#define ERROR_MAX (3 * 4096 + 1024)

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

// For a check that may fail on some ranks only (a file one node cannot read):
// every rank passes whether it failed and its message; if any rank failed, the
// lowest failing rank prints its message and every rank exits with status 1.
// Returns normally when no rank failed. Collective over MPI_COMM_WORLD.
void fail_if_any(int failed, const char* message);

// What every rank does before a refusal above ends it (after the message,
// before MPI_Finalize): a checkpoint lets go of its directories' locks and
// removes its scratch files (ckpt.c), so a refused or diverged run leaves
// nothing the next run would call stale. One function at a time; NULL: none.
void errors_on_refusal(void (*cleanup)(void));

#endif
