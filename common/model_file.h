// model_file.h: llm.c's GPT-2 model file, read and written (model_file.c).
// It is the exchange format for weights (--model FILE.bin, --save); the
// training state (--ckpt-dir, --resume) is ckpt.h's.
#ifndef MODEL_FILE_H
#define MODEL_FILE_H

#include <stddef.h>
#include <stdio.h>

#include "model_layout.h"

// Opens a model file (--model FILE) to read; NULL with a message naming it
// when it is not a regular file (a directory; a pipe, whose fopen would wait
// for a writer forever) or cannot be opened. Chapter 7's reader opens with it too.
FILE* model_file_open(const char* path, char* msg, size_t msg_len);
// A weight that is not a number (NaN, Inf) is the file's fault, not
// training's: every reader blames it at load time, before step 0 would
// report a non-finite loss and advise a lower --lr. NULL when the n floats at
// x, elements first.. of what ("tensor qkvw of layer 2"), are all finite.
const char* model_file_nonfinite(const char* path, const char* what, const float* x, size_t n, size_t first,
                                 char* msg, size_t msg_len);
// The same for elements first.. of tensor t (of layer l when t is a block's).
const char* model_file_nonfinite_tensor(const char* path, ParamTensor t, int l, const float* x, size_t n,
                                        size_t first, char* msg, size_t msg_len);
// llm.c's GPT-2 file: 256 int32 header (magic 20240326, version 3 = fp32,
// maxT, V, L, NH, C, Vp) then the 16 tensors, tensor-major.
// Reads the header only; returns NULL or a message naming the problem.
const char* checkpoint_read_config(const char* path, GPTConfig* cfg, char* msg, size_t msg_len);
// Reads the parameters into params_host (gpt_num_params floats, flat layout).
const char* checkpoint_read_params(const char* path, const GPTConfig* cfg, float* params_host,
                                   char* msg, size_t msg_len);
// Reads the flat-layout range [start, start + count) of the parameters into
// out (host memory), seeking to each tensor piece in the file: a rank loads
// only its shard. The file must have passed checkpoint_read_config.
const char* checkpoint_read_range(const char* path, const GPTConfig* cfg, float* out, size_t start,
                                  size_t count, char* msg, size_t msg_len);
// Writes atomically (a temporary file renamed over the target): never a half file.
const char* checkpoint_write(const char* path, const GPTConfig* cfg, const float* params_host,
                             char* msg, size_t msg_len);

#endif
