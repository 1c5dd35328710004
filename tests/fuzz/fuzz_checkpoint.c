// Fuzz target: the llm.c checkpoint reader. Any bytes must give either a
// config and parameters or a message, never a crash, a hang or a huge
// allocation.
#include <stdlib.h>

#include "fuzz.h"
#include "model.h"
#include "model_file.h"

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const char* path = fuzz_write(data, size);
    GPTConfig cfg;
    char msg[1024];
    if (checkpoint_read_config(path, &cfg, msg, sizeof(msg)) != NULL) return 0;
    // the header passed, so the file holds exactly its parameters: read them
    // whole and by a range, as the sharded chapters do
    size_t P = gpt_num_params(&cfg);
    float* params = malloc(P * sizeof(float));
    if (!params) abort();
    checkpoint_read_params(path, &cfg, params, msg, sizeof(msg));
    checkpoint_read_range(path, &cfg, params, P / 3, P - P / 3, msg, sizeof(msg));
    free(params);
    return 0;
}
