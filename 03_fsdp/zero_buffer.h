// zero_buffer.h: one parameter buffer under a ZeRO stage, over the group of
// ranks that hold identical copies of it: chapter 3's engine (fsdp.h) for a
// program with several such buffers, each over its own group (the
// capstone's replicated weights over dp x cp x ep x tp, its experts over dp
// x cp x tp, its tensor-parallel slices over dp x cp x ep).
//
//   zero 0    no ZeRO: parameters, gradient and AdamW moments whole on every
//             rank of the group, n floats each (the caller reduces and steps).
//   --zero 1  the AdamW moments: the whole buffer is the engine's one unit;
//             rank r of N keeps and steps floats [r S, (r + 1) S) of it,
//             S = ceil(n / N); the parameters and gradient are padded to N S
//             floats (the tail starts at zero and stays zero) so that the
//             caller's reduce-scatter and the engine's all-gather after AdamW
//             split evenly.
//   --zero 2  the gradients too, and --zero 3 the parameters too: the buffer
//             is cut into units (the caller's: one per layer), and the engine
//             shards each: a unit's gradient is reduce-scattered as soon as
//             its backward made it, from one unit gradient buffer (a unit
//             with own_grads keeps its own: a tied weight); --zero 3
//             all-gathers a unit just before it runs (two alternating slots,
//             no prefetch). The caller's layer loop says when (params,
//             grads_begin, reduce, drop below), as chapter 3's main.c does.
#ifndef ZERO_BUFFER_H
#define ZERO_BUFFER_H

#include <stddef.h>

#include "ckpt.h"
#include "comm.h"
#include "fsdp.h"
#include "sharding.h"

typedef struct {
    const Comm* g;   // the ranks that hold identical copies of the buffer
    size_t n;        // the buffer's floats
    size_t S;        // each rank's shard: ceil(n / N) (n without --zero; --zero 2, 3: the sum over the units)
    size_t full;     // floats of the parameters and gradient: N S (n without --zero)
    size_t off;      // where what I step starts in params: r S (0 without --zero)
    float *params, *grads, *m, *v;  // the buffer's, owned here (--zero: the engine's; 2, 3: params, grads NULL)
    float* dshard;   // (S) the reduced gradient I step: my shard (--zero 1, 2, 3), or grads itself
    size_t tied;     // the first floats are a copy of a weight another rank holds (and counts): out of the norm
    // the buffer as units, each a contiguous run of it (at every stage: the
    // caller finds its parameters by unit); --zero 2, 3: the engine f holds
    // them as its units (m, v, dshard, S are f's shards)
    int units;
    size_t* unit_off;  // (units + 1) unit i is floats [unit_off[i], unit_off[i + 1])
    int zero;          // the stage (--zero), 0 without
    float* staging;    // --zero until zero_buffer_units: the n values, on the host
    FSDP f;
} ZeroBuffer;

// One buffer of n floats held by the group g. zero 0: its parameters,
// gradient and AdamW moments allocated and counted (memory.h), n floats
// each, as every rank keeps all; --zero: nothing on the device yet (z->params
// etc. NULL), the values staged on the host (zero_buffer_put) until
// zero_buffer_units hands them to the engine (so with --zero 3 no rank ever
// holds the whole buffer on the device). Freed by zero_buffer_free.
void zero_buffer_alloc(ZeroBuffer* z, int zero, const Comm* g, size_t n);
void zero_buffer_free(ZeroBuffer* z);
// The buffer's values (host, n floats): into its parameters, or (--zero,
// before zero_buffer_units) into the staging.
void zero_buffer_put(ZeroBuffer* z, const float* host);
// The buffer's units: units runs of numel[i] floats, in order, covering it.
// --zero: then the engine over g takes the staged values (freed), each rank
// keeping its shards, and params, grads, m, v, dshard and S point at the
// engine's (--zero 1: the full parameters and gradient; 2, 3: params and
// grads NULL); own_grads as FsdpSpec's (NULL: none). Collective with --zero.
void zero_buffer_units(ZeroBuffer* z, int units, const size_t* numel, const int* own_grads);
// Unit i's parameters (--zero 3: all-gathered unless they are here) and the
// buffer its gradient accumulates in (--zero 2, 3: the unit gradient buffer).
float* zero_buffer_params(ZeroBuffer* z, int i);
float* zero_buffer_grads(ZeroBuffer* z, int i);
// --zero 2, 3 (nothing otherwise): unit i's gradient buffer zeroed; its
// reduce-scatter over g (the mean over g: the caller rescales); --zero 3:
// every gathered unit forgotten (stale after a step).
void zero_buffer_grads_begin(ZeroBuffer* z, int i);
void zero_buffer_reduce(ZeroBuffer* z, int i);
void zero_buffer_drop(ZeroBuffer* z);

// Adds the squares of the gradient I step (dshard: my shard with --zero,
// else the whole buffer) to *mine, the tied copy left out.
void zero_buffer_sumsq(double* mine, const ZeroBuffer* z);

// Lists the buffer's units [u0, u0 + nu) as slices of the global tensors
// (ckpt.h), kind `kind`, their values at data; write: the list this rank
// writes, which leaves out what another rank writes (a tied copy). The
// caller's map from its buffer to the model's tensors.
typedef void (*ZeroBufferSlices)(void* ctx, CkptList* out, int write, CkptKind kind, int u0, int nu, float* data);
// What this rank writes (own) and reads (need) of the buffer's training
// state, so that the group writes each float once, spread evenly over it:
// what is whole on every rank of g (without --zero every state; --zero 1
// the parameters) rank r writes as the shard ZeRO-1 gives it, floats
// [r S, (r + 1) S) of the buffer, and reads whole; what the engine shards
// (--zero 1 the moments, the engine's one unit the whole buffer; --zero 2
// and 3 every unit's moments and parameters) each rank writes as its shard
// of each unit (fsdp_ckpt_shard, chapter 3's), --zero 3 reads so too and
// --zero 2 reads the parameters whole (every rank holds them).
void zero_buffer_ckpt(CkptList* own, CkptList* need, const ZeroBuffer* z, ZeroBufferSlices slices, void* ctx);
// --show-sharding (common/sharding.h): the buffer's row, named name: its
// placement spec without ZeRO ("(pp, ep, -)"), under --zero its moments
// "spec flat/group"; the bytes this rank holds of its parameters (--zero 3
// the shard), its gradient (--zero 2, 3: none, the engine's rows hold it)
// and its moments (the shard).
void zero_buffer_sharding(ShardTable* t, const ZeroBuffer* z, const char* name, const char* shape, const char* spec,
                          const char* group, const char* slice);
// --zero: the engine's rows beyond the buffers', each buffer's bytes added
// to the rows of the buffers before it: the padding of the shards' tails
// (--zero 1 in the parameters and gradient, 2 in the parameters); --zero 3
// the two gather slots; the gradient shard; --zero 2, 3 the unit gradient
// buffer and a tied unit's own (the GPT's wte).
void zero_buffer_sharding_engine(ShardTable* t, const ZeroBuffer* z);

#endif
