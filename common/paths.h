// paths.h: checks on the files a run reads and writes, made before anything
// is opened for writing, so that an output can never destroy an input.
#ifndef PATHS_H
#define PATHS_H

#include <stddef.h>

// A file named by a flag: "--data", "corpus.txt".
typedef struct {
    const char* flag;
    const char* path;  // NULL: not given
} PathArg;

// Refuses an output that is the same file as an input (same device and inode,
// whatever the names: links and ../ tricks included), and two outputs that
// are one file (or, not yet made, one name in one directory): the second
// written would replace the first. Returns NULL or a message naming both flags.
const char* paths_check_distinct(const PathArg* inputs, int n_in, const PathArg* outputs, int n_out,
                                 char* msg, size_t msg_len);

// An output file must be creatable: its name is not empty and does not end
// in '/', it is not a directory, and its directory exists and takes a new
// file now (one is made and removed: root passes access() on /proc), whose
// name fits with the ".tmp.PID" it is first written as. An output opened
// where it is (in_place: --log), not written beside it and renamed, needs
// no new file in its directory when it exists (--log /dev/stdout): its open
// at start-up says what fails. Returns NULL or a message naming the target.
const char* paths_check_writable(const PathArg* output, int in_place, char* msg, size_t msg_len);

// A directory named by a flag. An output directory (--ckpt-dir) must be a
// writable directory or creatable in a writable one, never a file; an input
// directory (--resume) must exist. Returns NULL or a message naming it.
const char* paths_check_dir(const PathArg* dir, int output, char* msg, size_t msg_len);

// A file a loader reads to its end (a schedule, a machine profile) must be
// a regular file: a device (/dev/zero) or a FIFO never ends, and reading one
// would spin where no --timeout sees it. Returns NULL (a regular file, or no
// file at all: opening it says so) or a message naming the flag, the path,
// what it is, and `want`.
const char* paths_check_regular(const char* flag, const char* path, const char* want, char* msg, size_t msg_len);

// The column (from 1) of the first byte of line[0..n) that is not text
// (printable ASCII or a tab, CR or LF; a NUL included), or 0: a loader
// refuses such a line by its position instead of quoting bytes a terminal
// would misread.
size_t paths_not_text(const char* line, size_t n);

#endif
