// context.h: context parallelism's model on one rank of the dp x cp mesh
// (chapter 6): the replica of the weights, where each layer's activations
// live under --recompute, the buffers of the ring and of Ulysses, and what
// the chapter measures of attention (its work and time per cp rank, the
// ring's waits). Attention over the cp group too: the ring's loop, forward
// and backward, and Ulysses' exchange between sequence and head shards
// (cp_ring_forward, cp_ring_backward, cp_seq_to_heads, cp_heads_to_seq),
// on the buffers a CPAttention names, so that the capstone runs them on
// its own model's. The step -- where the ring and the all-to-alls run, the
// blocks, the gradient all-reduce -- is the chapter's, in
// 06_sequence_context/main.c; ring attention's compute with one K/V block in
// hand is ring.c's.
#ifndef CONTEXT_H
#define CONTEXT_H

#include "ckpt.h"
#include "comm.h"
#include "memory.h"  // DeviceClock
#include "model.h"
#include "report.h"
#include "ring.h"
#include "run.h"
#include "train.h"
#include "train_loop.h"
#include "device_clock.h"

// Who holds which tokens (ring.h's CPShard):
//
//   balance none, cp = 4, T = 16        balance zigzag, cp = 4, T = 16
//   positions 0-3  4-7  8-11 12-15      0-1 2-3 4-5 6-7 8-9 10-11 12-13 14-15
//   rank      0    1    2    3          0   1   2   3   3   2     1     0
typedef enum { CP_RING, CP_ULYSSES } CPMode;
typedef enum { BALANCE_NONE, BALANCE_ZIGZAG } CPBalance;
extern const char* const cp_mode_names[2];     // "ring", "ulysses"
extern const char* const cp_balance_names[2];  // "none", "zigzag"

// The buffers attention over the cp group works in, for N rows of C
// channels and NH heads, the mode's only (the rest NULL). Ring: packed
// [k | v] rows (N, 2C), the block in hand and the next; dK|dV partial sums
// (N, 2C) two deep (one may still be sending) and the one arriving; the
// partials of one (query part, key part) pair and the running sumexp.
// Ulysses: the all-to-all's send and receive (N, 3C); the gradient of my
// heads' attention output (B, T, C/cp) and dqkv (B, T, 3C/cp).
typedef struct {
    float *kv[2], *dkv[2], *dkv_in;
    RingForward ring;  // the running partials of my queries (ring.h)
    float *send, *recv, *dy_h, *dqkv_h;
} CPBuffers;
// Allocated and counted (memory.h: comm buffers, activations); freed.
void cp_buffers_create(CPBuffers* b, CPMode mode, int N, int C, int NH);
void cp_buffers_free(CPBuffers* b);

// One layer's activations on my N token rows.
typedef struct {
    BlockActs a;   // the block's activations on my N tokens (a.lse unused: lse below)
    float* lse;    // (N, NH) log-sum-exp of each (token, head): all backward needs of the softmax
                   // (ring: my tokens, every head; ulysses: (B, T, NH/cp), my heads' whole sequences)
    float* qkv_h;  // ulysses: (B, T, 3C/cp) my heads' q, k, v for the whole sequences
    float* y_h;    // ulysses: (B, T, C/cp) their attention output, as the flash op's backward reads it
} LayerActs;

// The balance figures: the attention work and time of this rank. Only a
// training step's forward and backward count: validation and the recompute
// of --recompute full pause the clock and put the counts back (cp_work_pause,
// cp_work_restore).
typedef struct {
    long attn_scores;     // unmasked scores computed in forward (ulysses; the ring's are ring.scores)
    long ring_scores, ring_skipped;  // ring.scores and ring.skipped (ring.h)
    int attn_timed;       // whether attention was being timed
} CPWork;

typedef struct {
    GPTConfig cfg;
    CPMode mode;
    CPBalance balance;
    CPShard sh;
    const Comm* cpc;    // the ring / all-to-all group
    Comm dpcp;          // every rank holding the same weights: the gradient group
    int N;              // my token rows: B * T / cp
    int b0;             // my dp group's first sequence of the global batch (sh.B of them)
    size_t P;
    float *params, *grads, *m, *v;  // full replica, flat layout (model.h)
    // activations
    float* encoded;  // (N, C)
    RecomputeMode recompute;
    float* layers;     // L x layer_numel: what each layer keeps
    size_t layer_numel;
    float* transient;  // transient_numel: what --recompute drops, one layer at a time (NULL for none)
    size_t transient_numel;
    float* head;     // head_acts_numel(1, N, C, Vp)
    int *inputs, *targets;  // (N) on the device, my rows
    float* losses_host;     // (N)
    int* rows_host;         // (2, N) my rows' inputs, then targets, on their way to the device
    // backward
    float *dres, *dln, *stash, *dfch_gelu, *datty;
    CPBuffers buf;  // the ring's or Ulysses' buffers (below)
    // what the chapter measures
    int overlap;          // --cp-overlap: 1 computes while a block travels, 0 waits for it first
    double ring_wait_seconds;  // inside the ring's waits: the communication the attention did not hide
    DeviceClock ring_wait_clock;  // the ring's waits (comm_wait_clock_begin), added in by cp_work_settle
    // attention compute (not waiting), this rank: spans on the device's clock
    // (memory.h: events on a GPU, where the host only queues the kernels),
    // added into attn_seconds once per step (cp_work_settle)
    DeviceClock attn_clock;
    int attn_timed;       // 0 while paused (validation, recompute)
    double attn_seconds;
    long attn_scores;     // unmasked scores computed in forward, this rank (ulysses; the ring's in ring)
} CPModel;

// --cp-mode, --cp-balance and --cp-overlap checked and parsed; a bad value
// ends every rank with one message.
void cp_parse_flags(const char* mode_name, const char* balance_name, int overlap, CPMode* mode, CPBalance* balance);
// What cp_create refuses of the mesh (zigzag's 2 x cp half-chunks, Ulysses'
// heads over cp): NULL, or the message in msg. The planner calls it too.
// Rank 0's notes for the cp flags given that this run does not use
// (args_note_unused): --cp-mode, --cp-balance without --cp N; --cp-overlap
// without the ring.
void cp_note_unused(int argc, char** argv, int ncp, CPMode mode);
const char* cp_mesh_problem(CPMode mode, CPBalance balance, int T, int num_heads, int ncp, char* msg, size_t len);

// This rank's model: B sequences of T tokens per step from sequence b0 of
// the global batch, T/cp of each on this cp rank; every buffer allocated and
// counted, the replica initialised (counter-based) or read from --model
// FILE. Checks that the sequence splits as the mode and balance need
// (every rank exits with one message if not).
void cp_create(CPModel* m, const Run* run, CPMode mode, CPBalance balance, int overlap, int B, int b0);
void cp_free(CPModel* m);
// After training: --sample and --save from world rank 0's replica. Collective.
void cp_finish_params(const CPModel* m, const TrainArgs* args);
// The start-up lines: the mesh, who holds which tokens, what a layer keeps.
void cp_print_setup(const CPModel* m, const Run* run);

// Floats one layer keeps (store) and of the one transient every layer
// shares, for N token rows (build/plan sizes a run with it too).
void cp_layer_numels(CPMode mode, RecomputeMode r, int N, int C, int NH, int T, size_t* store, size_t* transient);
// Layer l as forward writes it.
LayerActs cp_layer_at(const CPModel* m, int l);
// A whole layer (--recompute none's fields) laid out in the transient: what
// --recompute full runs a block's forward into again before its backward.
LayerActs cp_layer_in_transient(const CPModel* m);

// The parts of the step that work token by token, on my N rows.
// cp_embed_forward: my rows of the B sequences (host (B, T) token arrays),
// to the device, and their embeddings into m->encoded (each part's rows
// take wpe from its first position on). cp_head_forward: the final
// LayerNorm, LM head and loss of x (N, C); returns my tokens' mean loss.
// cp_head_backward: into m->dres, d loss / d x. cp_embed_backward: m->dres
// into wte's and wpe's gradients.
void cp_embed_forward(CPModel* m, const int* inputs, const int* targets);
float cp_head_forward(CPModel* m, const float* x);
void cp_head_backward(CPModel* m);
void cp_embed_backward(CPModel* m);

CPWork cp_work_pause(CPModel* m);
void cp_work_restore(CPModel* m, const CPWork* w);
// After a training step: its attention spans into attn_seconds, its ring
// waits into ring_wait_seconds. On CUDA this
// waits for the step's work (once per step, after the norm's read has waited
// for it anyway).
void cp_work_settle(CPModel* m);
// Attention's compute on the device's clock (memory.h): on a GPU the host
// only queues the kernels, so a host clock around them would read about 0.
// Paused (validation, recompute) while m->attn_timed is 0.
void cp_attn_clock_start(CPModel* m);
void cp_attn_clock_stop(CPModel* m);
// Validation: every cp rank runs its rows of the same sequences through
// forward; the balance figures and the ring's waits count training only,
// so validation's are put back.
float cp_val_loss_with(CPModel* m, const TrainSetup* setup, int n_batches,
                       float (*forward)(void* ctx, const int* inputs, const int* targets));

// Training-state checkpoints: the replicas are identical, so world rank 0
// alone writes the state; every rank reads all of it.
void cp_ckpt(Ckpt* ck, CPModel* m, int world_rank);

// After training: prints the cp traffic, the attention work and time per cp
// rank (the balance), the ring's waits and the communication blocked, and
// adds them to the summary's fields. steps_run: the steps this run
// trained; ring_wait_timed: rank 0's seconds in the ring's waits over the
// steps the clock timed. Collective over the cp group.
void cp_report(const CPModel* m, int steps_run, double ring_wait_timed, const StepClock* clock, JsonBuf* extra);

// ---------------------------------------------------------------- attention over the cp group
// What the ring and Ulysses need besides a layer's tensors: the group, the
// layout and size of attention's rows, the buffers, and chapter 6's
// measurements. A view, made for the call: chapter 6 makes it from its
// CPModel (cp_attention), the capstone from its model, whose attention's
// rows are the tp group's with --tp (capstone/composed_attention.c).
typedef struct {
    const Comm* cpc;     // the ring / all-to-all group: sh->cp ranks
    const CPShard* sh;   // who holds which positions of attention's B sequences of T
    int N, C, NH;        // attention's rows on this rank (B*T/cp), its channels and heads
    // ring: packed [k | v] rows (N, 2C), the block in hand and the next;
    // dK|dV partial sums (N, 2C) two deep (one may still be sending) and the
    // one arriving; the running partials of my queries (ring.h)
    float *kv[2], *dkv[2], *dkv_in;
    RingForward* ring;
    // ulysses: the all-to-all's send and receive buffers, (N, 3C) each,
    // and backward's d output (B, T, C/cp) and dqkv (B, T, 3C/cp) of my heads
    float *send, *recv, *dy_h, *dqkv_h;
    // what chapter 6 measures (the capstone: 1, NULL, NULL)
    int overlap;              // 1: compute while the next block travels; 0: wait for it first (--cp-overlap)
    DeviceClock* wait_clock;  // the ring's waits, counted here too (comm_wait_clock_begin); NULL: not
    DeviceClock* attn_clock;  // a span around the compute with each block in hand; NULL: not timed
} CPAttention;

// The view of N rows (C channels, NH heads) laid out as sh over the group
// cpc, in b's buffers: every transfer overlapped, nothing timed.
CPAttention cp_attention_on(const Comm* cpc, const CPShard* sh, int N, int C, int NH, CPBuffers* b);
// Chapter 6's view of its model: the clock of attention only while
// m->attn_timed (not in validation, nor in --recompute full's forward).
CPAttention cp_attention(CPModel* m);

// Ring attention, forward: qkv (N, 3C) holds my rows' queries, keys and
// values; atty (N, C) gets my queries' attention output, lse (N, NH) its
// log-sum-exp. cp - 1 hops of my K/V block around the ring (sends to the
// right, receives from the left).
void cp_ring_forward(const CPAttention* a, const float* qkv, float* atty, float* lse);
// Backward: datty (N, C) is d atty; dqkv (N, 3C), zero on entry, gets d of
// my queries and of my keys and values. The K/V blocks go around again and
// each block's dK|dV sum travels with it, home after cp hops.
void cp_ring_backward(const CPAttention* a, const float* qkv, const float* atty, const float* lse,
                      const float* datty, float* dqkv);
// Ulysses' all-to-all, sequence shards to head shards: src (N, w*C) holds
// w tensors of C channels per row (w = 3: q|k|v; w = 1: an attention
// output or its gradient) for my rows and every head; dst (B, T, w*C/cp)
// gets the same w tensors for every position of the B sequences and my
// head group's C/cp channels. cp_heads_to_seq is its inverse.
void cp_seq_to_heads(const CPAttention* a, float* dst, const float* src, int w);
void cp_heads_to_seq(const CPAttention* a, float* dst, const float* src, int w);
// Ulysses attention, forward: qkv (N, 3C) my rows, every head; one
// all-to-all to my heads' q|k|v of whole sequences (qkv_h (B, T, 3C/cp),
// kept for backward), chapter 0's attention on them into y_h (B, T, C/cp)
// and lse (B, T, NH/cp), one all-to-all back into atty (N, C).
void cp_ulysses_forward(const CPAttention* a, const float* qkv, float* atty, float* lse, float* qkv_h, float* y_h);
// Backward: the same two exchanges on the gradients, from datty (N, C) into
// dqkv (N, 3C); the op's backward reads the kept qkv_h, y_h and lse.
void cp_ulysses_backward(const CPAttention* a, const float* qkv_h, const float* y_h, const float* lse,
                         const float* datty, float* dqkv);

#endif
