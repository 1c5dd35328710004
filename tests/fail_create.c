// fail_create.c: a full disk for the files a test names. Preloaded into a
// run's ranks, it makes open() with O_CREAT, and fopen() for writing, fail
// with ENOSPC for every path that matches the shell pattern in
// TEST_FAIL_CREATE (fnmatch, so '*' also matches '/'); every other open is
// the C library's. tests/ckpt_levels.sh uses it for the files a level-1
// resume writes into its scratch directory, tests/hardening.sh for
// build/tokenize's second file: no permission stops a root user, and a
// file-size limit (ulimit -f, as lv_full uses) small enough stops Open
// MPI's own start-up files first.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <fnmatch.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int (*OpenFn)(const char*, int, ...);
typedef FILE* (*FopenFn)(const char*, const char*);

static int refused(const char* path) {
    const char* pattern = getenv("TEST_FAIL_CREATE");
    return pattern && pattern[0] && fnmatch(pattern, path, 0) == 0;
}

int open(const char* path, int flags, ...) {
    mode_t mode = 0;
    if (flags & (O_CREAT | O_TMPFILE)) {
        va_list ap;
        va_start(ap, flags);
        mode = (mode_t)va_arg(ap, int);
        va_end(ap);
    }
    if ((flags & O_CREAT) && refused(path)) {
        errno = ENOSPC;
        return -1;
    }
    OpenFn next = (OpenFn)dlsym(RTLD_NEXT, "open");
    return next(path, flags, mode);
}

// the same function under the name a build with 64-bit file offsets calls
// (on x86-64 and arm64 the C library's two are one)
int open64(const char* path, int flags, ...) __attribute__((alias("open")));

// fopen's "w" and "a" create: the C library's fopen opens the file itself,
// not through the open above
FILE* fopen(const char* path, const char* mode) {
    if ((strchr(mode, 'w') || strchr(mode, 'a')) && refused(path)) {
        errno = ENOSPC;
        return NULL;
    }
    FopenFn next = (FopenFn)dlsym(RTLD_NEXT, "fopen");
    return next(path, mode);
}
FILE* fopen64(const char* path, const char* mode) __attribute__((alias("fopen")));
