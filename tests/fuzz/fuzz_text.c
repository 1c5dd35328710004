// Fuzz target: --data FILE, which takes a token file or a text file (split
// into train and validation) and refuses anything else.
#include <stdlib.h>

#include "data.h"
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const char* path = fuzz_write(data, size);
    TokenSet train, val;
    char msg[1024];
    if (data_open(path, &train, &val, msg, sizeof(msg)) != NULL) return 0;
    data_close(&train);
    data_close(&val);
    return 0;
}
