// fsdp.h: the FSDP engine, chapter 3's strategy as a module later chapters link.
//
// The engine knows nothing of the GPT: it shards a list of "units" over one
// data-parallel group. A unit is what is gathered at once, a contiguous run
// of floats; the caller describes the units by their sizes and a fill
// callback that writes any range of a unit (initialisation or checkpoint
// reading), so each rank builds only its own shard. Chapter 3 passes the
// whole GPT's units ([wte wpe], block 0 .. L-1, [lnfw lnfb]); chapter 4 passes
// one tensor-parallel rank's slice of them and shards that over dp.
//
// Rank r owns floats [r*S, (r+1)*S) of each unit of n floats, S = ceil(n / N)
// on N ranks; the last ranks' tails past n are padding that starts at zero
// and stays zero (its gradient is zero, so AdamW never moves it).
//
//   --zero 1  the AdamW moments are sharded: full parameters and a full
//             gradient on every rank; each rank steps its shard.
//   --zero 2  the gradients too: a unit's gradient is reduce-scattered as
//             soon as backward has produced it, and its buffer reused.
//   --zero 3  the parameters too: a unit exists in full only in a gather
//             buffer, all-gathered (and prefetched) just before it runs.
//
// The engine owns the buffers and the bookkeeping; the caller's traversal
// decides WHEN each unit is gathered (fsdp_unit_params, fsdp_prefetch) and
// WHEN its gradient is reduce-scattered (fsdp_reduce_grads): those calls stay
// in the chapter, where the lesson is.
#ifndef FSDP_H
#define FSDP_H

#include <stddef.h>

#include "ckpt.h"
#include "comm.h"
#include "memory.h"  // DeviceClock
#include "ops.h"
#include "sharding.h"
#include "device_clock.h"

// Writes floats [lo, lo + n) of unit `unit` into dst (host memory). Returns
// NULL, or a message (written into msg) when the values cannot be had (a
// checkpoint that cannot be read); every rank then exits with it.
typedef const char* (*FsdpFill)(void* ctx, int unit, size_t lo, size_t n, float* dst, char* msg,
                                size_t msg_len);

typedef struct {
    int n_units;
    const size_t* numel;  // (n_units) floats in each unit
    // (n_units) or NULL: 1 for a unit whose gradient stays open while other
    // units run backward (a tied weight, used first and last): under ZeRO-2
    // and 3 it gets a gradient buffer of its own; every other unit shares one.
    const int* own_grads;
    FsdpFill fill;
    void* fill_ctx;
} FsdpSpec;

typedef struct {
    const Comm* dp;
    int zero, prefetch, reshard;
    // the units and this rank's shards of them
    int n;               // number of units
    size_t* numel;       // (n) floats in unit u
    size_t* shard;       // (n) S_u = ceil(numel_u / N), floats each rank owns of unit u
    size_t* shard_off;   // (n) where unit u's shard starts in this rank's shard buffers
    size_t* padded_off;  // (n) where unit u starts in a padded full layout (N*S_u per unit)
    size_t shard_total;  // sum of S_u: this rank's floats of each kind of state
    size_t padded_total; // N * shard_total: all units with padding
    size_t max_padded;   // max N*S_u: one gather buffer
    // zero 3: this rank's parameter shard; zero 1, 2: full parameters in the
    // padded layout (each rank updates its shard of them in place)
    float* shard_params;   // (shard_total)           zero 3
    float* full_params;    // (padded_total)          zero 1, 2
    float* shard_grads;    // (shard_total) the reduced gradient of this rank's shard
    float* full_grads;     // (padded_total)          zero 1: backward writes here
    float* unit_grads;     // (max_padded)            zero 2, 3: the shared unit gradient
    float** own_grads;     // (n) NULL, or (N*S_u)     zero 2, 3: own_grads units' gradients
    float* m;              // (shard_total) AdamW moments of this rank's shard
    float* v;
    // zero 3: gather buffers. With resharding, two slots that alternate: one
    // unit computes while the next arrives. Without, one slot per unit.
    int n_slots, next_slot;
    float** slot_buf;      // (n_slots) x (max_padded), or slot i x (N*S_i)
    int* slot_of_unit;     // (n) the slot holding unit u, or -1
    int* unit_in_slot;     // (n_slots)
    CommRequest* slot_req; // the gather in flight into each slot
    // what the prefetch does, for the summary: unit gathers started ahead of
    // need (compute runs between their start and their wait), and the time
    // blocked on parameter all-gathers (the comm layer's waits, counted in
    // this clock too by comm_wait_clock_begin: the all-gather part of
    // comm_wait_seconds; read by fsdp_allgather_wait_s)
    long gathers_prefetched;
    DeviceClock allgather_clock;
    // how much of the prefetched gathers' time in flight compute hid: each
    // slot's clock (memory.h's DeviceClock: events on the compute stream on
    // a GPU, where the host only queues the work) spans a prefetched gather
    // from its start to the end of its wait (in flight, read by
    // fsdp_prefetch_inflight_s); blocked_clock counts the wait itself (the
    // comm layer's wait, as allgather_clock; read by fsdp_prefetch_blocked_s)
    int* slot_prefetched;      // (n_slots) 1: the gather in flight into the slot was prefetched
    DeviceClock* slot_clock;   // (n_slots) a span per prefetched gather
    DeviceClock blocked_clock;
} FSDP;

// Collective over dp. Each rank fills (through spec->fill) only its own shard
// of every unit; ZeRO-1 and 2 then all-gather the full parameters once. A
// fill error on any rank ends every rank with its message.
void fsdp_create(FSDP* f, const Comm* dp, const FsdpSpec* spec, int zero, int prefetch, int reshard);
void fsdp_free(FSDP* f);
// Chapter 3's flags, checked alike by every chapter that runs this engine:
// --zero 1, 2 or 3; --prefetch and --reshard 0 or 1; --reshard 0 with ZeRO-3
// only. A bad value ends every rank with one message. Collective.
void fsdp_check_flags(int zero, int prefetch, int reshard);

// ---------------------------------------------------------------- parameters
// Unit i's full parameters (N*S_i floats, the padding last): under ZeRO-3
// gathers it (blocking) unless a prefetch brought it, then waits for it.
float* fsdp_unit_params(FSDP* f, int i);
// ZeRO-3 with --prefetch: starts unit i's all-gather now, so that it arrives
// behind the compute the caller does next. Does nothing otherwise.
// fsdp_prefetch_inflight_s: the seconds the prefetched gathers spent in
// flight so far (each from its start to the end of its wait), on the device
// clock; on CUDA it waits for the device, so read it between steps.
// fsdp_allgather_wait_s: the seconds blocked on parameter all-gathers so
// far; fsdp_prefetch_blocked_s: the part of it spent waiting for prefetched
// gathers. Device clocks too: read them between steps.
void fsdp_prefetch(FSDP* f, int i);
double fsdp_prefetch_inflight_s(FSDP* f);
double fsdp_allgather_wait_s(FSDP* f);
double fsdp_prefetch_blocked_s(FSDP* f);
// Forgets every gathered unit (they are stale after an optimizer step): the
// next fsdp_unit_params gathers again. Call at the start of a forward.
void fsdp_drop_gathered(FSDP* f);

// ---------------------------------------------------------------- gradients
// The buffer (N*S_i floats) backward accumulates unit i's gradient into,
// zeroed: call it once per unit per backward, before the unit's backward.
float* fsdp_grads_begin(FSDP* f, int i);
// Reduce-scatter of unit i's gradient: rank r receives the mean over the
// group of its shard (every rank's gradient is the mean over its own
// sequences; the mean of those is the mean over the global batch).
void fsdp_reduce_grads(FSDP* f, int i);
// This rank's part of the global sum of squares of the reduced gradient,
// added into *sumsq (a device double, ops.h's grad_sumsq: nothing waits for
// the device): over its whole shard, or over floats [lo, lo + n) of unit i
// only (for a caller that counts some ranges once across another axis).
void fsdp_grad_sumsq(const FSDP* f, double* sumsq);
void fsdp_grad_sumsq_range(const FSDP* f, int i, size_t lo, size_t n, double* sumsq);

// How many floats of this rank's padding (parameters, gradient shard, AdamW
// moments) are not zero: 0 unless a shard range overran its unit.
size_t fsdp_padding_nonzero(const FSDP* f);

// ---------------------------------------------------------------- the step
// AdamW on this rank's shard (step t >= 1, gradients scaled by `scale` for
// clipping). ZeRO-1 and 2 then all-gather the updated shards into every
// rank's full parameters (timed in allgather_clock).
void fsdp_step(FSDP* f, AdamWConfig opt, int t, float scale);

// ---------------------------------------------------------------- checkpoints
// Adds floats [lo, lo + n) of unit `unit` to out as checkpoint slices of the
// global tensors (ckpt.h), kind `kind`, their values at data: the caller's
// map from its units to the model's tensors (chapter 3: a range of the flat
// layout, ckpt_add_flat; chapter 4: of its tiles).
typedef void (*FsdpSlices)(void* ctx, CkptList* out, int unit, size_t lo, size_t n, CkptKind kind, float* data);
// This rank's shard of unit i, its real floats (the padding is no part of
// the model: never written nor read), as checkpoint slices into out: the
// AdamW moments, and with `params` the parameters (ZeRO-3: the shard; 1
// and 2: the same floats of the full parameters).
void fsdp_ckpt_shard(const FSDP* f, int i, CkptList* out, int params, FsdpSlices slices, void* ctx);

// ---------------------------------------------------------------- the whole
// Every unit gathered once, concatenated in unit order without padding, in
// host memory on dp rank 0 (NULL elsewhere; free it). Collective over dp.
float* fsdp_gather_host(FSDP* f);

// --show-sharding: the table of what this rank holds (sharding.h): each
// tensor's share of the shards, the padding, and the engine's own buffers
// (ZeRO-3's gather slots, ZeRO-1's full gradient, the unit gradient buffers).
// tensors NULL: the GPT's flat layout in chapter 3's units, from cfg.
// Collective over the world when show is set; nothing otherwise.
void fsdp_show_sharding(const FSDP* f, const ShardTensor* tensors, int n, const GPTConfig* cfg, int show,
                        const char* title);

#endif
