// model_tp.c: tiles of the parameter tensors (model_tp.h).
#include "model_tp.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "errors.h"
#include "init.h"
#include "model_file.h"  // model_file_nonfinite_tensor

// One block's shard (gpt_block_numel_tp, block_params_at_tp and the
// activation layouts) is in model.c, written once for every tp: tp = 1 is
// model.h's full block.

// ---------------------------------------------------------------- tiles

void param_tensor_shape(const GPTConfig* cfg, ParamTensor t, size_t* rows, size_t* cols) {
    size_t C = (size_t)cfg->channels;
    switch (t) {
        case P_WTE: *rows = (size_t)cfg->padded_vocab_size; *cols = C; return;
        case P_WPE: *rows = (size_t)cfg->max_seq_len; *cols = C; return;
        case P_QKVW: *rows = 3 * C; *cols = C; return;
        case P_ATTPROJW: *rows = C; *cols = C; return;
        case P_FCW: *rows = 4 * C; *cols = C; return;
        case P_FCPROJW: *rows = C; *cols = 4 * C; return;
        default: *rows = param_tensor_numel(cfg, t); *cols = 1; return;
    }
}

void gpt_init_tile(float* out, const GPTConfig* cfg, uint64_t seed, ParamTensor t, int layer,
                   size_t row0, size_t nrows, size_t col0, size_t ncols) {
    size_t rows, cols;
    param_tensor_shape(cfg, t, &rows, &cols);
    CHECK(row0 + nrows <= rows && col0 + ncols <= cols, "tile outside tensor %s", param_tensor_name(t));
    for (size_t i = 0; i < nrows; i++)
        for (size_t j = 0; j < ncols; j++)
            out[i * ncols + j] = gpt_init_value(cfg, seed, t, layer, (row0 + i) * cols + col0 + j);
}

// Where tensor t of layer l starts in the file: the tensors in order, each with
// all its layers (llm.c's tensor-major order).
static long file_offset(const GPTConfig* cfg, ParamTensor t, int layer) {
    long pos = 1024;
    for (ParamTensor u = 0; u < t; u++)
        pos += (long)(param_tensor_numel(cfg, u) * sizeof(float)) * (param_tensor_is_block(u) ? cfg->num_layers : 1);
    return pos + (long)(param_tensor_numel(cfg, t) * sizeof(float)) * layer;
}

const char* checkpoint_read_tile(const char* path, const GPTConfig* cfg, float* out, ParamTensor t,
                                 int layer, size_t row0, size_t nrows, size_t col0, size_t ncols,
                                 char* msg, size_t msg_len) {
    size_t rows, cols;
    param_tensor_shape(cfg, t, &rows, &cols);
    CHECK(row0 + nrows <= rows && col0 + ncols <= cols, "tile outside tensor %s", param_tensor_name(t));
    FILE* f = fopen(path, "rb");
    if (!f) {
        snprintf(msg, msg_len, "cannot open checkpoint '%s': %s", path, strerror(errno));
        return msg;
    }
    long base = file_offset(cfg, t, layer);
    // whole rows are contiguous in the file: one read; a column slice: one per row
    int whole = col0 == 0 && ncols == cols;
    size_t reads = whole ? 1 : nrows, per_read = whole ? nrows * cols : ncols;
    for (size_t i = 0; i < reads; i++) {
        long pos = base + (long)(((row0 + i) * cols + col0) * sizeof(float));
        if (fseek(f, pos, SEEK_SET) != 0 || fread(out + i * per_read, sizeof(float), per_read, f) != per_read) {
            fclose(f);
            snprintf(msg, msg_len, "checkpoint '%s' ended inside tensor %s", path, param_tensor_name(t));
            return msg;
        }
        if (model_file_nonfinite_tensor(path, t, layer, out + i * per_read, per_read, (row0 + i) * cols + col0, msg,
                                        msg_len)) {
            fclose(f);
            return msg;
        }
    }
    fclose(f);
    return NULL;
}

void gpt_place_tile(float* params, const GPTConfig* cfg, const float* tile, ParamTensor t, int layer,
                    size_t row0, size_t nrows, size_t col0, size_t ncols) {
    gpt_copy_tile(cfg, t, params + gpt_tensor_offset(cfg, t, layer), (float*)tile, row0, nrows, col0, ncols, 1);
}

void gpt_copy_tile(const GPTConfig* cfg, ParamTensor t, float* tensor, float* tile, size_t row0, size_t nrows,
                   size_t col0, size_t ncols, int to_tensor) {
    size_t rows, cols;
    param_tensor_shape(cfg, t, &rows, &cols);
    CHECK(row0 + nrows <= rows && col0 + ncols <= cols, "tile outside tensor %s", param_tensor_name(t));
    for (size_t i = 0; i < nrows; i++) {
        float* whole = tensor + (row0 + i) * cols + col0;
        float* mine = tile + i * ncols;
        memcpy(to_tensor ? whole : mine, to_tensor ? mine : whole, ncols * sizeof(float));
    }
}
