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
// whatever the names: links and ../ tricks included). Returns NULL or a
// message naming both flags.
const char* paths_check_distinct(const PathArg* inputs, int n_in, const PathArg* outputs, int n_out,
                                 char* msg, size_t msg_len);

// An output file must be creatable: its directory exists and is writable, and
// the path is not a directory. Returns NULL or a message naming the target.
const char* paths_check_writable(const PathArg* output, char* msg, size_t msg_len);

#endif
