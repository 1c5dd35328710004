// common.c: error handling and small helpers (see common.h).
#include "common.h"

#include <errno.h>
#include <mpi.h>
#include <stdarg.h>
#include <stdio.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "watchdog.h"

int world_rank(void) {
    int initialized = 0, finalized = 0, rank = 0;
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    if (initialized && !finalized) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    return rank;
}

void fatal_at(const char* file, int line, const char* fmt, ...) {
    // the whole line in one write, so lines of several ranks do not interleave
    char text[2048];
    int n = snprintf(text, sizeof(text), "[rank %d] %s:%d: ", world_rank(), file, line);
    va_list ap;
    va_start(ap, fmt);
    if (n >= 0 && (size_t)n < sizeof(text)) vsnprintf(text + n, sizeof(text) - (size_t)n, fmt, ap);
    va_end(ap);
    size_t len = strlen(text);
    if (len == sizeof(text) - 1) len--;  // truncated: keep room for the newline
    text[len++] = '\n';
    ssize_t wrote = write(STDERR_FILENO, text, len);
    (void)wrote;  // nothing left to report a failed write of an error to
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
    if (initialized && !finalized) {
        watchdog_stop();
        MPI_Finalize();
    }
    exit(1);
}

void exercise_not_done(int chapter, int n) {
    int rank = world_rank();
    if (rank != 0) sleep(2);
    fprintf(stderr, "error: exercise %d of chapter %d is not done (rank %d reached its stub; see HOMEWORK.md)\n", n,
            chapter, rank);
    fflush(stderr);
    int initialized = 0, finalized = 0;
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    if (initialized && !finalized) MPI_Abort(MPI_COMM_WORLD, 3);
    exit(3);
}

void fail_if_any(int failed, const char* message) {
    int rank = world_rank(), size = 1;
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    // the lowest failing rank speaks; size means "nobody failed"
    int mine = failed ? rank : size, first = size;
    watchdog_enter("allreduce (fail_if_any)", "world", -1);
    MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    watchdog_leave();
    if (first == size) return;
    if (rank == first) {
        fprintf(stderr, "error: %s\n", message ? message : "(no message)");
        fflush(stderr);
    }
    watchdog_stop();
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

// ---------------------------------------------------------------- temporary files

// The one temporary file being written now (writes are atomic: a temporary
// file renamed over the target), removed if SIGINT or SIGTERM stops us.
static char guard_path[4096];
static struct sigaction guard_old_int, guard_old_term, guard_old_xfsz;

static void guard_on_signal(int sig) {
    if (guard_path[0]) unlink(guard_path);  // async-signal-safe
    signal(sig, SIG_DFL);
    raise(sig);
}

void tmpfile_guard_begin(const char* tmp_path) {
    snprintf(guard_path, sizeof(guard_path), "%s", tmp_path);
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = guard_on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &guard_old_int);
    sigaction(SIGTERM, &sa, &guard_old_term);
    // past a file-size limit, a write should fail (EFBIG) and be reported,
    // not kill the process with the temporary file left behind
    sa.sa_handler = SIG_IGN;
    sigaction(SIGXFSZ, &sa, &guard_old_xfsz);
}

void tmpfile_guard_end(void) {
    sigaction(SIGINT, &guard_old_int, NULL);
    sigaction(SIGTERM, &guard_old_term, NULL);
    sigaction(SIGXFSZ, &guard_old_xfsz, NULL);
    guard_path[0] = 0;
}

int atomic_open(AtomicFile* a, const char* path) {
    size_t len = strlen(path) + 32;
    a->path = path;
    a->tmp = xmalloc(len);
    snprintf(a->tmp, len, "%s.tmp.%d", path, (int)getpid());
    tmpfile_guard_begin(a->tmp);
    a->f = fopen(a->tmp, "wb");
    if (a->f) return 0;
    int err = errno;
    tmpfile_guard_end();
    free(a->tmp);
    a->tmp = NULL;
    return err;
}

int atomic_close(AtomicFile* a, int ok) {
    int err = ok ? 0 : (errno ? errno : EIO);  // what made a write fail
    if (fclose(a->f) != 0 && !err) err = errno;
    if (!err && rename(a->tmp, a->path) != 0) err = errno;
    if (err) remove(a->tmp);
    tmpfile_guard_end();
    free(a->tmp);
    a->tmp = NULL;
    a->f = NULL;
    return err;
}
