// composed_zero.h: --zero 1, 2 and 3 in chapter 7, ZeRO over the data-parallel groups.
//
// Each of chapter 7's parameter buffers has a group of ranks that hold
// identical copies of it: the replicated buffer its batch group (dp x cp x
// ep x tp), the experts their expert-data-parallel group (dp x cp x tp, as
// DeepSpeed-MoE shards experts), the tp slices dp x cp x ep. Each stage
// shards more of a buffer over that group, with chapter 3's engine
// (03_fsdp/fsdp.h), one per buffer over its group:
//   --zero 1  the AdamW moments: the whole buffer is the engine's one unit;
//             rank r of N keeps and steps floats [r S, (r + 1) S) of it,
//             S = ceil(n / N); the buffer and its gradient are padded to N S
//             floats (the tail starts at zero and stays zero) so that the
//             step's reduce-scatter (capstone/main.c) and the engine's
//             all-gather after AdamW split evenly.
//   --zero 2  the gradients too, and --zero 3 the parameters too: the buffer
//             is cut into units, one per layer ([wte wpe], each block's
//             piece, [lnfw lnfb] of the replicated buffer; each MoE layer's
//             E/ep experts; each layer's tp slices), and the engine shards
//             each unit: a unit's gradient is reduce-scattered as soon as its
//             backward made it, from one unit gradient buffer (the tied wte's
//             its own: the head opens it, the embedding closes it); --zero 3
//             all-gathers a unit just before its forward and its backward
//             (two alternating slots, no prefetch). main.c's layer loop says
//             when (expert_units_gather, _open, _reduce in composed_model.h).
// --zero 2 and 3 are refused with the pipeline (--pp, --microbatches): the
// gradients accumulate over the microbatches, so a sharded gradient would
// cost a reduce-scatter per unit per microbatch (DeepSpeed's pipeline engine
// refuses them for that reason). With --pp, --zero 1 shards each chunk's
// buffers over their groups (the last stage's tied wte as any other floats).
#ifndef COMPOSED_ZERO_H
#define COMPOSED_ZERO_H

#include <stddef.h>

#include "ckpt.h"
#include "comm.h"
#include "fsdp.h"  // chapter 3's engine: --zero 2, 3

typedef struct {
    const Comm* g;   // the ranks that hold identical copies of the buffer
    size_t n;        // the buffer's floats
    size_t S;        // each rank's shard: ceil(n / N) (n without --zero; --zero 2, 3: the sum over the units)
    size_t full;     // floats of the parameters and gradient: N S (n without --zero)
    size_t lo, len;  // my shard of the n floats: [lo, lo + len), len <= S
    size_t off;      // where what I step starts in params: r S (0 without --zero)
    float *params, *grads, *m, *v;  // the buffer's, owned here (--zero: the engine's; 2, 3: params, grads NULL)
    float* dshard;   // (S) the reduced gradient I step: my shard (--zero 1, 2, 3), or grads itself
    size_t tied;     // the first floats are a copy of another stage's (the pipeline's last stage's wte): out of the norm
    // the buffer as units, each a contiguous run of it (every stage has them:
    // the layers find their parameters by unit); --zero 2, 3: the engine f
    // holds them as its units (m, v, dshard, S are f's shards)
    int units;
    size_t* unit_off;  // (units + 1) unit i is floats [unit_off[i], unit_off[i + 1])
    int zero;          // the stage once f holds the buffer (expert_zero_shard), else 0
    float* staging;    // --zero until expert_zero_shard: the n values, on the host
    FSDP f;
} ZeroBuf;
enum { ZERO_EXPERTS, ZERO_SHARED, ZERO_TP };  // chapter 7's buffers, in ExpertModel.z

// One buffer of n floats held by the group g. zero 0: its parameters,
// gradient and AdamW moments allocated and counted (memory.h), n floats
// each, as every rank keeps all; --zero: nothing on the device yet (*params
// etc. NULL), the values staged on the host (expert_zero_put) until
// expert_zero_shard hands them to the engine (so with --zero 3 no rank ever
// holds the whole buffer on the device). Freed by expert_zero_free.
void expert_zero_alloc(ZeroBuf* z, int zero, const Comm* g, size_t n, float** params, float** grads, float** m,
                       float** v);
void expert_zero_free(ZeroBuf* z);
// The buffer's values (host, n floats): into its parameters, or (--zero,
// before expert_zero_shard) into the staging.
void expert_zero_put(ZeroBuf* z, const float* host);
// The buffer's units: units runs of numel[i] floats, in order, covering it.
void expert_zero_units(ZeroBuf* z, int units, const size_t* numel);
// --zero: the engine over g from the staging (freed), each rank keeping its
// shards, params, grads, m, v, dshard and S pointing at the engine's (--zero
// 1: the full parameters and gradient; 2, 3: params and grads NULL);
// own_grads as FsdpSpec's (NULL: none). Collective.
void expert_zero_shard(ZeroBuf* z, int zero, const int* own_grads);
// Unit i's parameters (--zero 3: all-gathered unless they are here) and the
// buffer its gradient accumulates in (--zero 2, 3: the unit gradient buffer).
float* expert_zero_params(ZeroBuf* z, int i);
float* expert_zero_grads(ZeroBuf* z, int i);
// --zero 2, 3 (nothing otherwise): unit i's gradient buffer zeroed; its
// reduce-scatter over g (the mean over g: the caller rescales); --zero 3:
// every gathered unit forgotten (stale after a step).
void expert_zero_grads_begin(ZeroBuf* z, int i);
void expert_zero_reduce(ZeroBuf* z, int i);
void expert_zero_drop(ZeroBuf* z);
// The whole buffer (n floats, device, MEM_OTHER) on every rank of g, unit
// by unit (--save's copy, not training's); free it. Collective over g.
float* expert_zero_whole(ZeroBuf* z);

// Adds the squares of the gradient I step (dshard: my shard with --zero 1,
// else the whole buffer) to *mine, the tied copy left out.
void expert_zero_sumsq(double* mine, const ZeroBuf* z);

// The checkpoint's lines of my moment shards (m, v: S floats each, the
// shard [lo, lo + len) of a buffer): `full` lists the whole buffer's
// parameters as slices of the global tensors (data pointing into params);
// the part of each that falls in my shard is added to `out` as kinds
// CKPT_M and CKPT_V. Each rank of the group writes and reads its own shard.
void expert_zero_ckpt_add(CkptList* out, const CkptList* full, const float* params, const ZeroBuf* z, float* m,
                          float* v);
// --zero 2, 3: the same for unit i of the engine's buffer, all three kinds:
// `full` lists the unit's parameters with data from `origin` (the unit's
// first float: only offsets are read). Each rank writes its shard of the
// parameters and moments into `own` and reads them from `need`, except that
// --zero 2 reads the parameters whole (the caller lists them).
void expert_zero_ckpt_unit(CkptList* own, CkptList* need, const CkptList* full, const float* origin, ZeroBuf* z,
                           int i);

#endif
