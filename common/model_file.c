// model_file.c: llm.c's GPT-2 model file, read and written (model_file.h).
//
// File: 256 int32 header, then the 16 tensors in order, each with all layers
// contiguous (tensor-major). Memory is layer-major (model_layout.h), so reading and
// writing walk tensor by tensor, layer by layer, and place each piece.
#include "model_file.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "atomic_file.h"
#include "paths.h"

#define CKPT_MAGIC 20240326
#define CKPT_VERSION_FP32 3
#define CKPT_VERSION_BF16 5

FILE* model_file_open(const char* path, char* msg, size_t msg_len) {
    const char* want = "give a preset, --model tiny|small, or a model file in llm.c's format";
    if (paths_check_regular("checkpoint", path, want, msg, msg_len)) return NULL;
    FILE* f = fopen(path, "rb");
    if (!f) snprintf(msg, msg_len, "cannot open checkpoint '%s': %s (%s)", path, strerror(errno), want);
    return f;
}

const char* checkpoint_read_config(const char* path, GPTConfig* cfg, char* msg, size_t msg_len) {
    FILE* f = model_file_open(path, msg, msg_len);
    if (!f) return msg;
    int header[256];
    size_t got = fread(header, sizeof(int), 256, f);
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fclose(f);
    if (got != 256) {
        snprintf(msg, msg_len, "checkpoint '%s' is too short for its 1024-byte header (%ld bytes)", path, size);
        return msg;
    }
    if (header[0] != CKPT_MAGIC) {
        snprintf(msg, msg_len, "'%s' is not an llm.c GPT-2 checkpoint: magic %d, expected %d%s", path, header[0], CKPT_MAGIC,
                 header[0] == 20240520 /* data.c's token files */ ? " (it is a token file: give it with --data or --val)"
                                       : " (give a preset, --model tiny|small, or a file written by --save)");
        return msg;
    }
    if (header[1] == CKPT_VERSION_BF16) {
        snprintf(msg, msg_len, "checkpoint '%s' is bf16 (version %d); this course reads fp32 files (version %d): export fp32 from llm.c", path, header[1], CKPT_VERSION_FP32);
        return msg;
    }
    if (header[1] != CKPT_VERSION_FP32) {
        snprintf(msg, msg_len, "checkpoint '%s' has version %d, expected %d (fp32)", path, header[1], CKPT_VERSION_FP32);
        return msg;
    }
    cfg->max_seq_len = header[2];
    cfg->vocab_size = header[3];
    cfg->num_layers = header[4];
    cfg->num_heads = header[5];
    cfg->channels = header[6];
    cfg->padded_vocab_size = header[7];
    const char* bad = gpt_config_problem(cfg);
    if (bad) {
        snprintf(msg, msg_len, "checkpoint '%s' has an invalid header: %s", path, bad);
        return msg;
    }
    long expected = 1024 + (long)gpt_num_params(cfg) * 4;
    if (size != expected) {
        snprintf(msg, msg_len, "checkpoint '%s' has %ld bytes, but its header needs %ld: the file is truncated or corrupt", path, size, expected);
        return msg;
    }
    return NULL;
}

const char* model_file_nonfinite(const char* path, const char* what, const float* x, size_t n, size_t first,
                                 char* msg, size_t msg_len) {
    for (size_t i = 0; i < n; i++)
        if (!isfinite(x[i])) {
            snprintf(msg, msg_len, "checkpoint '%s' holds a weight that is not a number (%s) at element %zu of %s: the file is corrupt or was saved from a diverged run; give a model file whose weights are all finite",
                     path, isnan(x[i]) ? "NaN" : "Inf", first + i, what);
            return msg;
        }
    return NULL;
}

const char* model_file_nonfinite_tensor(const char* path, ParamTensor t, int l, const float* x, size_t n,
                                        size_t first, char* msg, size_t msg_len) {
    char what[96];
    if (param_tensor_is_block(t)) snprintf(what, sizeof(what), "tensor %s of layer %d", param_tensor_name(t), l);
    else snprintf(what, sizeof(what), "tensor %s", param_tensor_name(t));
    return model_file_nonfinite(path, what, x, n, first, msg, msg_len);
}

const char* checkpoint_read_params(const char* path, const GPTConfig* cfg, float* params,
                                   char* msg, size_t msg_len) {
    FILE* f = fopen(path, "rb");
    if (!f) {
        snprintf(msg, msg_len, "cannot open checkpoint '%s': %s", path, strerror(errno));
        return msg;
    }
    fseek(f, 1024, SEEK_SET);
    for (ParamTensor t = 0; t < NUM_PARAM_TENSORS; t++) {
        int layers = param_tensor_is_block(t) ? cfg->num_layers : 1;
        size_t n = param_tensor_numel(cfg, t);
        for (int l = 0; l < layers; l++) {
            float* x = params + gpt_tensor_offset(cfg, t, l);
            if (fread(x, sizeof(float), n, f) != n) {
                fclose(f);
                snprintf(msg, msg_len, "checkpoint '%s' ended inside tensor %s", path, param_tensor_name(t));
                return msg;
            }
            if (model_file_nonfinite_tensor(path, t, l, x, n, 0, msg, msg_len)) {
                fclose(f);
                return msg;
            }
        }
    }
    fclose(f);
    return NULL;
}

const char* checkpoint_read_range(const char* path, const GPTConfig* cfg, float* out, size_t start,
                                  size_t count, char* msg, size_t msg_len) {
    FILE* f = fopen(path, "rb");
    if (!f) {
        snprintf(msg, msg_len, "cannot open checkpoint '%s': %s", path, strerror(errno));
        return msg;
    }
    size_t end = start + count;
    long file_pos = 1024;  // where tensor t of layer l starts in the file
    for (ParamTensor t = 0; t < NUM_PARAM_TENSORS; t++) {
        int layers = param_tensor_is_block(t) ? cfg->num_layers : 1;
        size_t n = param_tensor_numel(cfg, t);
        for (int l = 0; l < layers; l++, file_pos += (long)(n * sizeof(float))) {
            size_t off = gpt_tensor_offset(cfg, t, l);
            size_t lo = off > start ? off : start, hi = off + n < end ? off + n : end;
            if (lo >= hi) continue;
            if (fseek(f, file_pos + (long)((lo - off) * sizeof(float)), SEEK_SET) != 0 ||
                fread(out + (lo - start), sizeof(float), hi - lo, f) != hi - lo) {
                fclose(f);
                snprintf(msg, msg_len, "checkpoint '%s' ended inside tensor %s", path, param_tensor_name(t));
                return msg;
            }
            if (model_file_nonfinite_tensor(path, t, l, out + (lo - start), hi - lo, lo - off, msg, msg_len)) {
                fclose(f);
                return msg;
            }
        }
    }
    fclose(f);
    return NULL;
}

const char* checkpoint_write(const char* path, const GPTConfig* cfg, const float* params,
                             char* msg, size_t msg_len) {
    // write next to the target, then rename: a reader never sees half a file
    AtomicFile out;
    int err = atomic_open(&out, path);
    if (err) {
        snprintf(msg, msg_len, "cannot write checkpoint '%s' (through a temporary file next to it): %s", path,
                 strerror(err));
        return msg;
    }
    FILE* f = out.f;
    int header[256] = {0};
    header[0] = CKPT_MAGIC;
    header[1] = CKPT_VERSION_FP32;
    header[2] = cfg->max_seq_len;
    header[3] = cfg->vocab_size;
    header[4] = cfg->num_layers;
    header[5] = cfg->num_heads;
    header[6] = cfg->channels;
    header[7] = cfg->padded_vocab_size;
    int ok = fwrite(header, sizeof(int), 256, f) == 256;
    for (ParamTensor t = 0; ok && t < NUM_PARAM_TENSORS; t++) {
        int layers = param_tensor_is_block(t) ? cfg->num_layers : 1;
        size_t n = param_tensor_numel(cfg, t);
        for (int l = 0; ok && l < layers; l++)
            ok = fwrite(params + gpt_tensor_offset(cfg, t, l), sizeof(float), n, f) == n;
    }
    err = atomic_close(&out, ok);
    if (err) {
        snprintf(msg, msg_len, "writing checkpoint '%s' failed: %s", path, strerror(err));
        return msg;
    }
    return NULL;
}
