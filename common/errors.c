// errors.c: how a rank reports what went wrong (errors.h).
#include "errors.h"

#include <mpi.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "rank.h"
#include "watchdog.h"

void fatal_at(const char* file, int line, const char* fmt, ...) {
    // the whole line in one write, so lines of several ranks do not interleave
    char text[ERROR_MAX];
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

// "error: MESSAGE\n" in one write after the rank's buffered output: mpirun
// forwards stdout and stderr apart, and a line longer than its 4 KiB pieces
// came out with the stdout flushed at exit in its middle.
static void write_error_line(const char* message) {
    static char line[ERROR_MAX + 64];
    int n = snprintf(line, sizeof(line), "error: %s\n", message);
    size_t len = n < 0 ? 0 : (size_t)n < sizeof(line) ? (size_t)n : sizeof(line) - 1;
    if (len && line[len - 1] != '\n') line[len - 1] = '\n';  // cut: still one line
    fflush(stdout);
    for (size_t done = 0; done < len;) {
        ssize_t w = write(STDERR_FILENO, line + done, len - done);
        if (w <= 0) break;  // nothing left to report a failed write of an error to
        done += (size_t)w;
    }
}

static void (*refusal_cleanup)(void) = NULL;

void errors_on_refusal(void (*cleanup)(void)) { refusal_cleanup = cleanup; }

void fail_all(const char* fmt, ...) {
    if (world_rank() == 0) {
        static char message[ERROR_MAX];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(message, sizeof(message), fmt, ap);
        va_end(ap);
        write_error_line(message);
    }
    if (refusal_cleanup) refusal_cleanup();
    int initialized = 0, finalized = 0;
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    if (initialized && !finalized) {
        watchdog_stop();
        MPI_Finalize();
    }
    exit(1);
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
    if (rank == first) write_error_line(message ? message : "(no message)");
    if (refusal_cleanup) refusal_cleanup();
    watchdog_stop();
    MPI_Finalize();
    exit(1);
}
