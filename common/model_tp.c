// model_tp.c: tensor-parallel layouts and tiles (model_tp.h).
#include "model_tp.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "common.h"

// ---------------------------------------------------------------- one block's shard

size_t gpt_block_numel_tp(int C, int tp) {
    size_t c = (size_t)C, cl = c / (size_t)tp;  // cl: this rank's share of C
    // weights 3C*C/tp + C*C/tp + 4C*C/tp + 4C*C/tp, split biases 3C/tp + 4C/tp,
    // whole vectors ln1w ln1b attprojb ln2w ln2b fcprojb
    return 12 * cl * c + 7 * cl + 6 * c;
}

BlockParams block_params_at_tp(float* base, int C, int tp) {
    size_t c = (size_t)C, cl = c / (size_t)tp;
    BlockParams p;
    p.ln1w = base;             base += c;
    p.ln1b = base;             base += c;
    p.qkvw = base;             base += 3 * cl * c;
    p.qkvb = base;             base += 3 * cl;
    p.attprojw = base;         base += c * cl;
    p.attprojb = base;         base += c;
    p.ln2w = base;             base += c;
    p.ln2b = base;             base += c;
    p.fcw = base;              base += 4 * cl * c;
    p.fcb = base;              base += 4 * cl;
    p.fcprojw = base;          base += c * 4 * cl;
    p.fcprojb = base;
    return p;
}

size_t block_acts_numel_tp(int B, int T, int C, int NH, int tp) {
    size_t BT = (size_t)B * T, c = (size_t)C, cl = c / (size_t)tp, nhl = (size_t)NH / (size_t)tp;
    return BT * (6 * c + 12 * cl + nhl * (size_t)T + 4);
}

BlockActs block_acts_at_tp(float* base, int B, int T, int C, int NH, int tp) {
    size_t BT = (size_t)B * T, c = (size_t)C, cl = c / (size_t)tp, nhl = (size_t)NH / (size_t)tp;
    BlockActs a;
    a.ln1 = base;        base += BT * c;
    a.ln1_mean = base;   base += BT;
    a.ln1_rstd = base;   base += BT;
    a.qkv = base;        base += BT * 3 * cl;
    a.atty = base;       base += BT * cl;
    a.att = base;        base += BT * nhl * T;
    a.attproj = base;    base += BT * c;
    a.res2 = base;       base += BT * c;
    a.ln2 = base;        base += BT * c;
    a.ln2_mean = base;   base += BT;
    a.ln2_rstd = base;   base += BT;
    a.fch = base;        base += BT * 4 * cl;
    a.fch_gelu = base;   base += BT * 4 * cl;
    a.fcproj = base;     base += BT * c;
    a.res3 = base;
    return a;
}

size_t block_store_numel_tp(int B, int T, int C, int NH, int tp, RecomputeMode mode) {
    size_t BT = (size_t)B * T, c = (size_t)C, cl = c / (size_t)tp;
    switch (mode) {
        case RECOMPUTE_SELECTIVE: return BT * (4 * c + 8 * cl + 4);
        case RECOMPUTE_FULL: return BT * c;
        default: return block_acts_numel_tp(B, T, C, NH, tp);
    }
}

size_t block_transient_numel_tp(int B, int T, int C, int NH, int tp, RecomputeMode mode) {
    size_t BT = (size_t)B * T, c = (size_t)C, cl = c / (size_t)tp, nhl = (size_t)NH / (size_t)tp;
    switch (mode) {
        case RECOMPUTE_SELECTIVE: return BT * (2 * c + 4 * cl + nhl * (size_t)T);
        case RECOMPUTE_FULL: return block_acts_numel_tp(B, T, C, NH, tp);
        default: return 0;
    }
}

BlockActs block_acts_stored_tp(float* store, float* transient, int B, int T, int C, int NH, int tp,
                               RecomputeMode mode) {
    size_t BT = (size_t)B * T, c = (size_t)C, cl = c / (size_t)tp, nhl = (size_t)NH / (size_t)tp;
    if (mode == RECOMPUTE_FULL) {
        // everything in the one-layer transient but the output, which the
        // next block (and this block's recompute) reads
        BlockActs a = block_acts_at_tp(transient, B, T, C, NH, tp);
        a.res3 = store;
        return a;
    }
    if (mode != RECOMPUTE_SELECTIVE) return block_acts_at_tp(store, B, T, C, NH, tp);
    BlockActs a;
    a.ln1 = store;        store += BT * c;
    a.ln1_mean = store;   store += BT;
    a.ln1_rstd = store;   store += BT;
    a.qkv = store;        store += BT * 3 * cl;
    a.atty = store;       store += BT * cl;
    a.res2 = store;       store += BT * c;
    a.ln2 = store;        store += BT * c;
    a.ln2_mean = store;   store += BT;
    a.ln2_rstd = store;   store += BT;
    a.fch = store;        store += BT * 4 * cl;
    a.res3 = store;
    a.att = transient;       transient += BT * nhl * T;
    a.fch_gelu = transient;  transient += BT * 4 * cl;
    a.attproj = transient;   transient += BT * c;
    a.fcproj = transient;
    return a;
}

size_t block_scratch_numel_tp(int B, int T, int C, int NH, int tp) {
    size_t BT = (size_t)B * T, c = (size_t)C, cl = c / (size_t)tp, nhl = (size_t)NH / (size_t)tp;
    return BT * (c + 12 * cl + nhl * (size_t)T);
}

BlockScratch block_scratch_at_tp(float* base, int B, int T, int C, int NH, int tp) {
    size_t BT = (size_t)B * T, c = (size_t)C, cl = c / (size_t)tp, nhl = (size_t)NH / (size_t)tp;
    BlockScratch s;
    s.dln = base;        base += BT * c;
    s.dqkv = base;       base += BT * 3 * cl;
    s.datty = base;      base += BT * cl;
    s.datt = base;       base += BT * nhl * T;
    s.dfch = base;       base += BT * 4 * cl;
    s.dfch_gelu = base;
    return s;
}

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
    }
    fclose(f);
    return NULL;
}

void gpt_place_tile(float* params, const GPTConfig* cfg, const float* tile, ParamTensor t, int layer,
                    size_t row0, size_t nrows, size_t col0, size_t ncols) {
    size_t rows, cols;
    param_tensor_shape(cfg, t, &rows, &cols);
    CHECK(row0 + nrows <= rows && col0 + ncols <= cols, "tile outside tensor %s", param_tensor_name(t));
    float* dst = params + gpt_tensor_offset(cfg, t, layer);
    for (size_t i = 0; i < nrows; i++)
        memcpy(dst + (row0 + i) * cols + col0, tile + i * ncols, ncols * sizeof(float));
}
