// paths.c: input and output files checked before a run starts (see paths.h).
#include "paths.h"

#include <errno.h>
#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

// The directory part of path made absolute (realpath) in out, and where its
// last name starts in path; NULL when the directory does not exist.
static const char* place_of(const char* path, char out[PATH_MAX], const char** name) {
    const char* slash = strrchr(path, '/');
    *name = slash ? slash + 1 : path;
    char dir[PATH_MAX];
    if (!slash) snprintf(dir, sizeof(dir), ".");
    else if (slash == path) snprintf(dir, sizeof(dir), "/");
    else if ((size_t)(slash - path) < sizeof(dir)) snprintf(dir, sizeof(dir), "%.*s", (int)(slash - path), path);
    else return NULL;
    return realpath(dir, out);
}

// 1 when two outputs would be one file: the same inode if both exist, else
// the same name in the same directory.
static int same_output(const char* a, const char* b) {
    struct stat sa, sb;
    int has_a = stat(a, &sa) == 0, has_b = stat(b, &sb) == 0;
    if (has_a && has_b) return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
    if (has_a || has_b) return 0;
    char da[PATH_MAX], db[PATH_MAX];
    const char *na, *nb;
    if (!place_of(a, da, &na) || !place_of(b, db, &nb)) return strcmp(a, b) == 0;
    return strcmp(da, db) == 0 && strcmp(na, nb) == 0;
}

const char* paths_check_distinct(const PathArg* inputs, int n_in, const PathArg* outputs, int n_out,
                                 char* msg, size_t msg_len) {
    for (int o = 0; o < n_out; o++)
        for (int p = o + 1; p < n_out && outputs[o].path; p++)
            if (outputs[p].path && same_output(outputs[o].path, outputs[p].path)) {
                snprintf(msg, msg_len, "%s '%s' and %s '%s' are the same file: one would replace the other; give each its own path",
                         outputs[o].flag, outputs[o].path, outputs[p].flag, outputs[p].path);
                return msg;
            }
    for (int o = 0; o < n_out; o++) {
        struct stat out;
        // an output that does not exist yet cannot be an input
        if (!outputs[o].path || stat(outputs[o].path, &out) != 0) continue;
        for (int i = 0; i < n_in; i++) {
            struct stat in;
            if (!inputs[i].path || stat(inputs[i].path, &in) != 0) continue;
            if (in.st_dev == out.st_dev && in.st_ino == out.st_ino) {
                snprintf(msg, msg_len, "%s '%s' is the same file as %s '%s': writing it would destroy the input; give %s another path",
                         outputs[o].flag, outputs[o].path, inputs[i].flag, inputs[i].path, outputs[o].flag);
                return msg;
            }
        }
    }
    return NULL;
}

// 0 if a new file can be made in dir, else errno: one is made and removed.
// access(W_OK) is not enough: root passes it on /proc and on a read-only
// mount, where the file could still not be created after training.
static int try_create_in(const char* dir) {
    size_t n = strlen(dir) + sizeof("/.write-test-XXXXXX");
    char* name = malloc(n);
    if (!name) return ENOMEM;
    snprintf(name, n, "%s/.write-test-XXXXXX", dir);
    int fd = mkstemp(name), err = fd < 0 ? errno : 0;
    if (fd >= 0) {
        close(fd);
        unlink(name);
    }
    free(name);
    return err;
}

const char* paths_check_writable(const PathArg* output, int in_place, char* msg, size_t msg_len) {
    if (!output->path) return NULL;
    size_t n = strlen(output->path);
    if (n == 0 || output->path[n - 1] == '/') {
        snprintf(msg, msg_len, "cannot write %s '%s': %s; give a file name", output->flag, output->path,
                 n == 0 ? "the name is empty" : "it names a directory (it ends in '/')");
        return msg;
    }
    struct stat st;
    if (stat(output->path, &st) == 0 && S_ISDIR(st.st_mode)) {
        snprintf(msg, msg_len, "cannot write %s '%s': it is a directory; give a file name", output->flag, output->path);
        return msg;
    }
    if (in_place && stat(output->path, &st) == 0) return NULL;
    char* copy = strdup(output->path);
    const char* dir = dirname(copy);  // "." for a bare name
    const char* bad = NULL;
    const char* slash = strrchr(output->path, '/');
    size_t name = strlen(slash ? slash + 1 : output->path);
    // written as NAME.tmp.PID beside its place first (atomic_file.c)
    size_t extra = in_place ? 0 : strlen(".tmp.") + 10;
    int found = stat(dir, &st) == 0, err = errno;
    long name_max = found ? pathconf(dir, _PC_NAME_MAX) : -1;
    if (!found || !S_ISDIR(st.st_mode)) {
        // a file where the path needs a directory: the file named, or one above it (ENOTDIR)
        const char* why = found ? "is a file, not a directory"
                        : err == ENOTDIR ? "does not exist: a file stands on its path"
                        : err == ENOENT ? "does not exist" : strerror(err);
        snprintf(msg, msg_len, "cannot write %s '%s': its directory '%s' %s", output->flag, output->path, dir, why);
        bad = msg;
    } else if (name_max > 0 && name + extra > (size_t)name_max) {
        snprintf(msg, msg_len, "cannot write %s '%s': its name is %zu bytes%s, and its directory's file system takes "
                 "names of %ld at most: give a shorter name", output->flag, output->path, name,
                 extra ? " (written first beside it as NAME.tmp.PID, 15 more)" : "", name_max);
        bad = msg;
    } else if ((err = try_create_in(dir)) != 0) {
        snprintf(msg, msg_len, "cannot write %s '%s': its directory '%s' takes no new file (%s)", output->flag,
                 output->path, dir, strerror(err));
        bad = msg;
    }
    free(copy);
    return bad;
}

const char* paths_check_dir(const PathArg* dir, int output, char* msg, size_t msg_len) {
    if (!dir->path) return NULL;
    if (!dir->path[0]) {
        snprintf(msg, msg_len, "%s '': the name is empty; give a directory", dir->flag);
        return msg;
    }
    struct stat st;
    if (stat(dir->path, &st) == 0) {
        if (!S_ISDIR(st.st_mode)) {
            snprintf(msg, msg_len, "%s '%s' is a file, not a directory: give a directory", dir->flag, dir->path);
            return msg;
        }
        int err = output ? try_create_in(dir->path) : 0;
        if (err) {
            snprintf(msg, msg_len, "%s '%s' takes no new file (%s)", dir->flag, dir->path, strerror(err));
            return msg;
        }
        return NULL;
    }
    if (!output) {
        snprintf(msg, msg_len, "%s '%s' does not exist: give a directory of checkpoints (--ckpt-dir of an earlier run)",
                 dir->flag, dir->path);
        return msg;
    }
    // a new directory: its parent must exist and be writable (it is made at
    // the first save); "ckpt/" names the directory "ckpt"
    char* name = strdup(dir->path);
    for (size_t n = strlen(name); n > 1 && name[n - 1] == '/'; n--) name[n - 1] = '\0';
    PathArg as_file = {dir->flag, name};
    const char* bad = paths_check_writable(&as_file, 1, msg, msg_len);  // made by mkdir, no .tmp name
    free(name);
    return bad;
}

const char* paths_check_regular(const char* flag, const char* path, const char* want, char* msg, size_t msg_len) {
    struct stat st;
    if (stat(path, &st) != 0 || S_ISREG(st.st_mode)) return NULL;
    const char* what = S_ISDIR(st.st_mode)    ? "a directory"
                       : S_ISCHR(st.st_mode)  ? "a character device"
                       : S_ISBLK(st.st_mode)  ? "a block device"
                       : S_ISFIFO(st.st_mode) ? "a pipe"
                       : S_ISSOCK(st.st_mode) ? "a socket"
                                              : "not a regular file";
    snprintf(msg, msg_len, "%s '%s' is %s: %s", flag, path, what, want);
    return msg;
}

size_t paths_not_text(const char* line, size_t n) {
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)line[i];
        if ((c < 0x20 && c != '\t' && c != '\r' && c != '\n') || c > 0x7e) return i + 1;
    }
    return 0;
}
