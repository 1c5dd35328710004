// sharding.h: --show-sharding, the table of who holds what (sharding.c).
//
// One row per tensor class: its shape, where each of the three training
// states lives over the mesh, in PartitionSpec style (docs/00_mesh.md):
//   (-, -)      replicated: every rank holds the whole tensor
//   (tp, -)     the first dimension split over the tp axis, the second whole
//   flat/dp     the flat layout's unit cut into equal shards over dp (FSDP);
//               "(tp, -) flat/dp": split over tp, then that slice flat over dp
// the part rank r holds, and the bytes it holds of each state. Buffers that
// are no tensor's slice (ZeRO-3's gather slots, a full-gradient buffer,
// shard padding) have rows of their own, so the totals per category are the
// bytes the tracking allocator counts: the summary's peak_bytes.
#ifndef SHARDING_H
#define SHARDING_H

#include <stddef.h>

#include "model_layout.h"

enum { SHARD_PARAMS, SHARD_GRADS, SHARD_OPTIMIZER, SHARD_STATES };

typedef struct {
    char name[24];                  // "wte", "qkvw", "gather slots"
    char shape[24];                 // "(Vp, C)", "(L, 3C, C)"
    char spec[SHARD_STATES][24];    // placement of params, grads, AdamW m and v
    char slice[40];                 // what this rank holds of it
    double bytes[SHARD_STATES];     // on this rank
} ShardRow;

typedef struct {
    ShardRow rows[64];
    int n;
} ShardTable;

// Adds bytes to the row called name (made with the other fields the first
// time). A NULL spec leaves that state's placement as it is.
void shard_table_add(ShardTable* t, const char* name, const char* shape, const char* params_spec,
                     const char* grads_spec, const char* optimizer_spec, const char* slice, double params,
                     double grads, double optimizer);

// "(Vp, C)", "(L, 3C, C)", ...: tensor t's shape in the model's symbols.
const char* sharding_shape(ParamTensor t);

// One tensor of a flat layout: its unit and where it starts in it.
typedef struct {
    char name[24], shape[24], split[24];  // split: "(-, -)" or its tp placement, "(tp, -)"
    int unit;
    size_t off, numel;  // in floats, inside the unit
} ShardTensor;

// The GPT's 16 tensors in chapter 3's units ([wte wpe], each block, [lnfw
// lnfb]); a tensor of a block is one entry per layer. Returns the count
// (at most 4 + 12 L entries) and fills out.
int sharding_gpt_tensors(const GPTConfig* cfg, ShardTensor* out);

// The rows of a model whose units are sharded flat over N ranks as chapter
// 3's engine does (shard[i] floats per rank of unit i), on rank r, ZeRO
// stage zero: per tensor the bytes of each state this rank holds, then the
// padding past each unit's end.
void sharding_add_flat(ShardTable* t, const ShardTensor* tensors, int n, const size_t* numel,
                       const size_t* shard, int n_units, int N, int r, int zero);

// A whole replica of the GPT on every rank (chapters 0 and 2): the 16
// tensors, AdamW's moments only where has_optimizer.
void sharding_add_replicated(ShardTable* t, const GPTConfig* cfg, int has_optimizer);

// Prints the table of world rank 0 (its rows and slices) and every rank's
// totals per state, when show is set. Collective over MPI_COMM_WORLD.
void shard_table_show(const ShardTable* t, int show, const char* title);

// 1 once shard_table_show printed a table: train_loop_begin refuses
// --show-sharding in a chapter that has not shown one (no silent no-op).
int sharding_shown(void);

// Ranges [global[i], global[i] + count[i]) of the flat layer-major layout
// held whole (chapter 5's stages): per tensor the floats of each state this
// rank holds; copy[i] set marks a second copy of a tensor (the last stage's
// tied wte), a row of its own. block_spec names where the layers are, e.g.
// "(L/pp)"; the other tensors are "(one stage)".
void sharding_add_ranges(ShardTable* t, const GPTConfig* cfg, const size_t* global, const size_t* count,
                         const int* copy, int n, const char* block_spec);

// The two above for a replica: builds the table and shows it (chapters 0, 2).
void sharding_show_replicated(const GPTConfig* cfg, int has_optimizer, int show, const char* title);

#endif
