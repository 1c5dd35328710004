// model_layout.c: the config's presets and checks, and the flat parameter
// layout (model_layout.h).
#include "model_layout.h"

#include <string.h>

// ---------------------------------------------------------------- tensors

const char* param_tensor_name(ParamTensor t) {
    static const char* names[NUM_PARAM_TENSORS] = {
        "wte", "wpe", "ln1w", "ln1b", "qkvw", "qkvb", "attprojw", "attprojb",
        "ln2w", "ln2b", "fcw", "fcb", "fcprojw", "fcprojb", "lnfw", "lnfb"};
    return names[t];
}

int param_tensor_is_block(ParamTensor t) { return t >= P_LN1W && t <= P_FCPROJB; }

size_t param_tensor_numel(const GPTConfig* cfg, ParamTensor t) {
    size_t C = (size_t)cfg->channels;
    switch (t) {
        case P_WTE: return (size_t)cfg->padded_vocab_size * C;
        case P_WPE: return (size_t)cfg->max_seq_len * C;
        case P_LN1W: case P_LN1B: case P_ATTPROJB: case P_LN2W: case P_LN2B:
        case P_FCPROJB: case P_LNFW: case P_LNFB: return C;
        case P_QKVW: return 3 * C * C;
        case P_QKVB: return 3 * C;
        case P_ATTPROJW: return C * C;
        case P_FCW: return 4 * C * C;
        case P_FCB: return 4 * C;
        case P_FCPROJW: return 4 * C * C;
        default: return 0;
    }
}

// ---------------------------------------------------------------- presets

int gpt_preset(const char* name, GPTConfig* cfg) {
    if (strcmp(name, "tiny") == 0) {
        *cfg = (GPTConfig){.max_seq_len = 64, .vocab_size = 256, .padded_vocab_size = 256,
                           .num_layers = 2, .num_heads = 4, .channels = 64};
        return 1;
    }
    // tiny with 6 layers: deep enough to cut into 2, 3 or 4 pipeline stages
    // (and 4 unevenly); everything else as tiny
    if (strcmp(name, "tiny6") == 0) {
        gpt_preset("tiny", cfg);
        cfg->num_layers = 6;
        return 1;
    }
    if (strcmp(name, "small") == 0) {
        *cfg = (GPTConfig){.max_seq_len = 256, .vocab_size = 256, .padded_vocab_size = 256,
                           .num_layers = 6, .num_heads = 6, .channels = 384};
        return 1;
    }
    return 0;
}

const char* gpt_config_problem(const GPTConfig* cfg) {
    if (cfg->max_seq_len <= 0 || cfg->vocab_size <= 0 || cfg->num_layers <= 0 ||
        cfg->num_heads <= 0 || cfg->channels <= 0)
        return "every model size (maxT, V, L, NH, C) must be positive";
    if (cfg->padded_vocab_size < cfg->vocab_size)
        return "the padded vocabulary is smaller than the vocabulary";
    if (cfg->channels % cfg->num_heads != 0)
        return "channels must be divisible by the number of heads";
    // The parameter count, in 64 bits with every product checked: a crafted
    // header must not wrap it around to a small number that passes the
    // file-size check. 2^40 floats (4 TiB) is far beyond any model here.
    const uint64_t limit = (uint64_t)1 << 40;
    uint64_t C = (uint64_t)cfg->channels, wte, wpe, block, blocks, total;
    if (__builtin_mul_overflow((uint64_t)cfg->padded_vocab_size, C, &wte) ||
        __builtin_mul_overflow((uint64_t)cfg->max_seq_len, C, &wpe) ||
        __builtin_mul_overflow(C, 12 * C + 13, &block) ||
        __builtin_mul_overflow((uint64_t)cfg->num_layers, block, &blocks) ||
        __builtin_add_overflow(wte + wpe, blocks, &total) || wte > limit || wpe > limit || total > limit)
        return "the model is too large: its parameter count exceeds 2^40";
    return NULL;
}

// ---------------------------------------------------------------- layout

size_t gpt_block_numel(int C) { return 12 * (size_t)C * C + 13 * (size_t)C; }

size_t gpt_num_params(const GPTConfig* cfg) {
    size_t C = (size_t)cfg->channels;
    return param_tensor_numel(cfg, P_WTE) + param_tensor_numel(cfg, P_WPE) +
           (size_t)cfg->num_layers * gpt_block_numel(cfg->channels) + 2 * C;
}

size_t gpt_block_offset(const GPTConfig* cfg, int layer) {
    return param_tensor_numel(cfg, P_WTE) + param_tensor_numel(cfg, P_WPE) +
           (size_t)layer * gpt_block_numel(cfg->channels);
}

size_t gpt_tensor_offset(const GPTConfig* cfg, ParamTensor t, int layer) {
    if (t == P_WTE) return 0;
    if (t == P_WPE) return param_tensor_numel(cfg, P_WTE);
    if (t == P_LNFW) return gpt_block_offset(cfg, cfg->num_layers);
    if (t == P_LNFB) return gpt_block_offset(cfg, cfg->num_layers) + (size_t)cfg->channels;
    size_t off = gpt_block_offset(cfg, layer);
    for (ParamTensor u = P_LN1W; u < t; u++) off += param_tensor_numel(cfg, u);
    return off;
}
