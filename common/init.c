// init.c: counter-based initialisation (init.h).
//
// Element i of tensor t of layer l gets a value computed from (seed, t, l, i)
// alone, by hashing the four numbers into two uniform variates and turning
// them into a normal one (Box-Muller). No random stream is consumed in order,
// so any slice of any tensor can be initialised by itself, on any rank, and
// equals the same slice of the full model.
#include <math.h>

#include "init.h"

// splitmix64's finaliser: a bijective mix of 64 bits
static uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

uint64_t counter_hash(uint64_t seed, int t, int layer, size_t index) {
    uint64_t h = mix64(seed + 0x9E3779B97F4A7C15ull);
    h = mix64(h ^ ((uint64_t)t + 1) * 0x9E3779B97F4A7C15ull);
    h = mix64(h ^ ((uint64_t)layer + 1) * 0xD1B54A32D192ED03ull);
    return mix64(h ^ (uint64_t)index);
}

double init_normal_at(uint64_t seed, int t, int layer, size_t index) {
    uint64_t h = counter_hash(seed, t, layer, index);
    // two 26-bit uniforms; u1 in (0, 1] so the log is finite
    double u1 = ((double)(h >> 38) + 1.0) / 67108864.0;
    double u2 = (double)((h >> 6) & 0x3FFFFFFull) / 67108864.0;
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

float gpt_init_value(const GPTConfig* cfg, uint64_t seed, ParamTensor t, int layer, size_t index) {
    const double std = 0.02;
    switch (t) {
        case P_WTE:
            // padded vocabulary rows start (and stay) at zero
            if (index / (size_t)cfg->channels >= (size_t)cfg->vocab_size) return 0.0f;
            return (float)(std * init_normal_at(seed, t, layer, index));
        case P_WPE: case P_QKVW: case P_FCW:
            return (float)(std * init_normal_at(seed, t, layer, index));
        case P_ATTPROJW: case P_FCPROJW:
            // GPT-2: residual projections scaled by 1/sqrt(2L), one per residual add
            return (float)(std / sqrt(2.0 * cfg->num_layers) * init_normal_at(seed, t, layer, index));
        case P_LN1W: case P_LN2W: case P_LNFW:
            return 1.0f;
        default:
            return 0.0f;  // biases
    }
}

void gpt_init_range(float* out, size_t start, size_t count, const GPTConfig* cfg, uint64_t seed) {
    size_t end = start + count;
    // walk the flat layout tensor by tensor and fill where it meets [start, end)
    for (ParamTensor t = 0; t < NUM_PARAM_TENSORS; t++) {
        int layers = param_tensor_is_block(t) ? cfg->num_layers : 1;
        size_t n = param_tensor_numel(cfg, t);
        for (int l = 0; l < layers; l++) {
            size_t off = gpt_tensor_offset(cfg, t, l);
            size_t lo = off > start ? off : start;
            size_t hi = off + n < end ? off + n : end;
            for (size_t i = lo; i < hi; i++) out[i - start] = gpt_init_value(cfg, seed, t, l, i - off);
        }
    }
}
