// expert_zero.h: --zero 1 in chapter 7, ZeRO over the data-parallel groups.
//
// Each of chapter 7's parameter buffers has a group of ranks that hold
// identical copies of it: the replicated buffer its batch group (dp x cp x
// ep x tp), the experts their expert-data-parallel group (dp x cp x tp, as
// DeepSpeed-MoE shards experts), the tp slices dp x cp x ep. ZeRO-1 shards
// the AdamW moments of each buffer over that group: rank r of N keeps and
// steps floats [r S, (r + 1) S) of it, S = ceil(n / N); the buffer and its
// gradient are padded to N S floats (the tail starts at zero and stays
// zero) so that the reduce-scatter and the all-gather split evenly. The
// collectives themselves are the step's, in 07_expert/main.c.
//
// --zero 2 (the gradients too) needs backward to hand each layer's gradient
// to a reduce-scatter as soon as it is made, into a unit buffer as chapter 3
// does, and --zero 3 the parameters gathered per layer: issue #35's
// remaining work; both are refused. With --pp each chunk's buffers are
// sharded over their groups (the last stage's tied wte as any other floats).
#ifndef EXPERT_ZERO_H
#define EXPERT_ZERO_H

#include <stddef.h>

#include "ckpt.h"
#include "comm.h"

typedef struct {
    const Comm* g;   // the ranks that hold identical copies of the buffer
    size_t n;        // the buffer's floats
    size_t S;        // each rank's shard: ceil(n / N) (n without --zero)
    size_t full;     // floats of the parameters and gradient: N S (n without --zero)
    size_t lo, len;  // my shard of the n floats: [lo, lo + len), len <= S
    size_t off;      // where what I step starts in params: r S (0 without --zero)
    float *params, *grads, *m, *v;  // the buffer's (expert_zero_alloc's)
    float* dshard;   // (S) the reduced gradient I step: my shard (--zero 1), or grads itself
    size_t tied;     // the first floats are a copy of another stage's (the pipeline's last stage's wte): out of the norm
} ZeroBuf;
enum { ZERO_EXPERTS, ZERO_SHARED, ZERO_TP };  // chapter 7's buffers, in ExpertModel.z

// One buffer of n floats held by the group g: its parameters, gradient and
// AdamW moments allocated and counted (memory.h). zero 0: n floats each, as
// every rank keeps all; zero 1: the parameters and gradient padded to N S,
// the moments and a gradient shard S each.
void expert_zero_alloc(ZeroBuf* z, int zero, const Comm* g, size_t n, float** params, float** grads, float** m,
                       float** v);
void expert_zero_free(ZeroBuf* z);

// Adds the squares of the gradient I step (dshard: my shard with --zero 1,
// else the whole buffer) to *mine, the tied copy left out.
void expert_zero_sumsq(double* mine, const ZeroBuf* z);

// --zero: 0 or 1 (2 and 3 refused with issue #35). Every rank exits on a
// bad value, with one message.
void expert_zero_check(int zero);

// The checkpoint's lines of my moment shards (m, v: S floats each, the
// shard [lo, lo + len) of a buffer): `full` lists the whole buffer's
// parameters as slices of the global tensors (data pointing into params);
// the part of each that falls in my shard is added to `out` as kinds
// CKPT_M and CKPT_V. Each rank of the group writes and reads its own shard.
void expert_zero_ckpt_add(CkptList* out, const CkptList* full, const float* params, const ZeroBuf* z, float* m,
                          float* v);

#endif
