// test.h: the smallest test harness that can fail.
// Each CHECK prints one line, "PASS name" or "FAIL name: why", which the runner
// (run_program in tests/lib.sh) counts; a test program exits non-zero when any
// check failed.
#ifndef TEST_H
#define TEST_H

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

static int test_failures = 0;
static int test_checks = 0;

// Reports one check. name says what was checked; on failure the printf-style
// message says what was seen.
static void check(int ok, const char* name, const char* fmt, ...) {
    test_checks++;
    if (ok) {
        printf("PASS %s\n", name);
    } else {
        test_failures++;
        printf("FAIL %s: ", name);
        va_list ap;
        va_start(ap, fmt);
        vprintf(fmt, ap);
        va_end(ap);
        printf("\n");
    }
    fflush(stdout);
}

// The larger of two errors, and NaN when either is: fmax and "if (d > worst)"
// drop a NaN, so an op that wrote NaN would pass every bound; a NaN kept
// fails every check (NaN < tol is false).
static inline double err_max(double a, double b) { return isnan(a) || isnan(b) ? NAN : a > b ? a : b; }

static int test_exit_code(void) { return test_failures == 0 ? 0 : 1; }

// A path in the runner's scratch directory (TEST_TMPDIR), or /tmp.
static inline const char* tmp_path(const char* name) {
    static char buf[4][256];
    static int k = 0;
    k = (k + 1) % 4;
    const char* dir = getenv("TEST_TMPDIR") ? getenv("TEST_TMPDIR") : "/tmp";
    snprintf(buf[k], sizeof(buf[k]), "%s/%s", dir, name);
    return buf[k];
}

// Writes n bytes to path (a fixture: a broken file, a small corpus).
static inline void write_bytes(const char* path, const void* data, size_t n) {
    FILE* f = fopen(path, "wb");
    fwrite(data, 1, n, f);
    fclose(f);
}

#endif
