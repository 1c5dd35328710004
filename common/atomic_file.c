// atomic_file.c: files written whole or not at all (atomic_file.h).
#include "atomic_file.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "memory.h"

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
    // the rename replaces whatever the path names: never a device or a pipe
    // (as root, a --save of /dev/null would replace /dev/null with a file)
    struct stat st;
    if (stat(path, &st) == 0 && !S_ISREG(st.st_mode)) return EINVAL;
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

// The directory that holds path, synced so that a rename in it is on disk
// (a file system that cannot sync a directory, EINVAL, has nothing to do).
static int sync_parent(const char* path) {
    const char* slash = strrchr(path, '/');
    char dir[4096];
    if (!slash) snprintf(dir, sizeof(dir), ".");
    else snprintf(dir, sizeof(dir), "%.*s", slash == path ? 1 : (int)(slash - path), path);
    int fd = open(dir, O_RDONLY), err = 0;
    if (fd < 0) return errno;
    if (fsync(fd) != 0 && errno != EINVAL) err = errno;
    close(fd);
    return err;
}

int atomic_close(AtomicFile* a, int ok) {
    int err = ok ? 0 : (errno ? errno : EIO);  // what made a write fail
    // the bytes on disk before the name: a rename that reaches the disk
    // first leaves an empty or short file under the target's name after a
    // power cut (delayed allocation); the directory after it
    if (!err && fflush(a->f) != 0) err = errno;
    if (!err && fsync(fileno(a->f)) != 0 && errno != EINVAL) err = errno;
    if (fclose(a->f) != 0 && !err) err = errno;
    if (!err && rename(a->tmp, a->path) != 0) err = errno;
    if (!err) err = sync_parent(a->path);
    if (err) remove(a->tmp);
    tmpfile_guard_end();
    free(a->tmp);
    a->tmp = NULL;
    a->f = NULL;
    return err;
}
