// Fuzz target: the training-state MANIFEST parser (common/ckpt.c). Any bytes
// as DIR/MANIFEST must give either a manifest that fits the tiny model or a
// message, never a crash, a hang or a huge allocation. The seeds are real
// manifests of chapters 0 and 4 (tiny model), and chapter 3's of a level-1
// save with xor parity and of an incremental save (their node, parity and
// delta lines). A mutated manifest almost
// never keeps its checksum right, so the first byte chooses: odd, the rest
// is written as it is; even, the target appends the right "end" line, so
// the fuzzer reaches the line parser behind the checksum.
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "ckpt.h"
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    static char dir[256];
    if (!dir[0]) {
        const char* tmp = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
        snprintf(dir, sizeof(dir), "%s/fuzz_manifest.%d", tmp, (int)getpid());
        mkdir(dir, 0755);
    }
    char path[300];
    snprintf(path, sizeof(path), "%s/MANIFEST", dir);
    if (size == 0) return 0;
    int fix_checksum = !(data[0] & 1);
    data++, size--;
    char end[32] = "";
    if (fix_checksum) snprintf(end, sizeof(end), "end %016llx\n", ckpt_checksum(data, size));
    FILE* f = fopen(path, "wb");
    if (!f || fwrite(data, 1, size, f) != size || fputs(end, f) < 0 || fclose(f) != 0) abort();
    Ckpt c;
    memset(&c, 0, sizeof(c));
    gpt_preset("tiny", &c.cfg);
    c.lock_fd = -1;
    char msg[1024];
    ckpt_check_manifest(&c, dir, msg, sizeof(msg));
    return 0;
}
