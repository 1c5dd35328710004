// Fuzz target: the llm.c token file reader, then a batch from what it read.
#include <stdlib.h>

#include "data.h"
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const char* path = fuzz_write(data, size);
    TokenSet set;
    char msg[1024];
    if (data_open_tokens(path, &set, msg, sizeof(msg)) != NULL) return 0;
    int B = 2, T = 8;
    if (data_batches_per_epoch(&set, B, T) > 0) {
        int inputs[16], targets[16];
        data_batch(&set, 3, B, T, 1, 1, inputs, targets);
    }
    data_close(&set);
    return 0;
}
