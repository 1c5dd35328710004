// init.h: the model's initial parameters (init.c).
#ifndef INIT_H
#define INIT_H

#include <stddef.h>
#include <stdint.h>

#include "model_layout.h"

// Counter-based init: the value of element i of tensor t of layer l depends on
// (seed, t, l, i) only, never on where it sits in memory. Fills the flat-layout
// range [start, start + count) into out, so a rank can initialise just its shard
// and get exactly that slice of the full model.
//   weights: N(0, 0.02), the two residual projections N(0, 0.02 / sqrt(2L));
//   LayerNorm weights 1; biases 0; padded rows of wte (ids >= V) 0.
// out is host memory.
void gpt_init_range(float* out, size_t start, size_t count, const GPTConfig* cfg, uint64_t seed);
// A standard normal from (seed, tensor id, layer, index) alone: the counter
// under the rule above (tensor ids >= NUM_PARAM_TENSORS name other models'
// tensors, as the MoE router in 07_expert/moe.c).
double init_normal_at(uint64_t seed, int t, int layer, size_t index);
// The 64 bits that normal is made from: a hash of the four numbers (other
// uses: chapter 7's routing signature, 07_expert/moe_layer.c).
uint64_t counter_hash(uint64_t seed, int t, int layer, size_t index);
// The initial value of one element (the rule above).
float gpt_init_value(const GPTConfig* cfg, uint64_t seed, ParamTensor t, int layer, size_t index);

#endif
