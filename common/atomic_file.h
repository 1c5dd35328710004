// atomic_file.h: files written whole or not at all. A write goes to a
// temporary file renamed over the target, so a reader never sees half a
// file, whatever stops the writer.
#ifndef ATOMIC_FILE_H
#define ATOMIC_FILE_H

#include <stdio.h>

// Between begin and end, SIGINT and SIGTERM remove the temporary file
// tmp_path before the process dies, and SIGXFSZ (a file-size limit) is
// ignored so the write fails with an error instead. After kill -9 the
// temporary file (NAME.tmp.PID) remains; the target is never half written.
void tmpfile_guard_begin(const char* tmp_path);
void tmpfile_guard_end(void);

// One atomic file write, with the guard above: atomic_open creates
// PATH.tmp.PID and returns 0 or the errno (EINVAL when PATH names a device,
// a pipe or a directory: the rename would replace it; the callers check
// first, paths_check_regular); the caller writes to a->f and
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

#endif
