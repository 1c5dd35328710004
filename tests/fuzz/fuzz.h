// fuzz.h: what the fuzz targets share. Each target is a libFuzzer entry point
// that hands the fuzzer's bytes to one of the loaders a user feeds files to;
// the loaders take paths, so the bytes go through a file first.
#ifndef FUZZ_H
#define FUZZ_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

// Writes the input to this process's scratch file and returns its path.
static const char* fuzz_write(const uint8_t* data, size_t size) {
    static char path[256];
    if (!path[0]) {
        const char* dir = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
        snprintf(path, sizeof(path), "%s/fuzz_input.%d", dir, (int)getpid());
    }
    FILE* f = fopen(path, "wb");
    if (!f || fwrite(data, 1, size, f) != size || fclose(f) != 0) abort();
    return path;
}

#endif
