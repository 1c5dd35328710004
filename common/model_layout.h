// model_layout.h: the GPT-2 model's config and where each parameter sits
// (model_layout.c).
//
// Parameters live in ONE flat buffer, layer-major:
//   [wte wpe] [block 0: ln1w ln1b qkvw qkvb attprojw attprojb ln2w ln2b fcw fcb
//   fcprojw fcprojb] ... [block L-1] [lnfw lnfb]
// so one block is one contiguous range. Gradients and AdamW state use the same
// layout. The checkpoint file keeps llm.c's tensor-major order; load and save
// convert (model_file.h).
#ifndef MODEL_LAYOUT_H
#define MODEL_LAYOUT_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    int max_seq_len;        // maxT: rows of wpe
    int vocab_size;         // V: real tokens, the softmax runs over these
    int padded_vocab_size;  // Vp >= V: rows of wte (llm.c pads to a multiple of 128)
    int num_layers;         // L
    int num_heads;          // NH
    int channels;           // C
} GPTConfig;

// The 16 tensors, in the checkpoint file's order (llm.c's).
typedef enum {
    P_WTE, P_WPE, P_LN1W, P_LN1B, P_QKVW, P_QKVB, P_ATTPROJW, P_ATTPROJB,
    P_LN2W, P_LN2B, P_FCW, P_FCB, P_FCPROJW, P_FCPROJB, P_LNFW, P_LNFB,
    NUM_PARAM_TENSORS
} ParamTensor;

const char* param_tensor_name(ParamTensor t);
// 1 for the 12 per-layer tensors, 0 for wte, wpe, lnfw, lnfb.
int param_tensor_is_block(ParamTensor t);
// Elements of one layer's copy of tensor t (of the whole tensor for non-block ones).
size_t param_tensor_numel(const GPTConfig* cfg, ParamTensor t);

// ---------------------------------------------------------------- presets
// "tiny" (tests), "tiny6" (tiny with 6 layers: pipeline tests) and "small"
// (demos, plots); returns 0 if name is not a preset.
int gpt_preset(const char* name, GPTConfig* cfg);
// A config a chapter can run: every size positive, C divisible by NH, V <= Vp.
// Returns NULL if valid, else a message saying what is wrong.
const char* gpt_config_problem(const GPTConfig* cfg);

// ---------------------------------------------------------------- layout
size_t gpt_block_numel(int C);                 // 12C^2 + 13C
size_t gpt_num_params(const GPTConfig* cfg);
size_t gpt_block_offset(const GPTConfig* cfg, int layer);  // start of block `layer`
// Offset of tensor t (of `layer`, for block tensors) in the flat buffer.
size_t gpt_tensor_offset(const GPTConfig* cfg, ParamTensor t, int layer);

#endif
