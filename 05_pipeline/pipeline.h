// pipeline.h: chapter 5's engine, what a pipeline rank owns and keeps.
//
// The model's layers are cut into stages, one per rank of the pp axis; with
// --virtual v each rank holds v chunks, and chunk c of stage s is virtual
// stage c * n_stages + s of n_vstages = n_stages * v. This module holds what
// a rank needs to run its schedule and nothing of the schedule itself:
//   - the layer split and the pieces of the flat parameter layout a rank owns
//     (stage_layers, rank_pieces), set up and freed by pipe_create/pipe_free;
//   - the activation slots: what one (microbatch, chunk) keeps from its
//     forward to its last backward action;
//   - the order in which each neighbour sends to this rank (its lists), the
//     send buffers, and the figures the summary reports;
//   - the whole model gathered for --sample and --save, the pieces registered
//     with the training-state checkpoint, validation through the stages, and
//     the timelines of each step (the bubble).
// Part of it does not care what a stage computes, and the capstone's
// pipeline (capstone/main.c's actions) runs its MoE chunks on that part too:
// the schedule made and checked (pipe_schedule_make), the links between the
// stages (PipeLink: receiving an action's input in the order its peer sends,
// pipe_receive, exercise 3; pipe_send and pipe_sends_wait), which slot holds
// which microbatch (SlotPool) and the tied embedding's sum
// (pipe_sum_tied_embedding, exercise 4). An executor of its own is three
// actions F, B, W over (microbatch, chunk) that call these where they send,
// receive, take and give back a slot, and the loop over its rank's list.
// Chapter 5's actions, that loop and the step live in 05_pipeline/main.c.
#ifndef PIPELINE_H
#define PIPELINE_H

#include <stddef.h>

#include "ckpt.h"
#include "comm.h"
#include "memory.h"
#include "device_clock.h"
#include "model.h"
#include "report.h"
#include "schedule.h"
#include "run.h"
#include "train.h"

#define PIPE_MAX_PIECES (PIPE_MAX_CHUNKS + 3)  // every chunk, [wte wpe], [lnfw lnfb], the tied copy

// ---------------------------------------------------------------- what a rank owns
// Virtual stage k of S holds L / S layers, the first L % S one more.
typedef struct {
    int first, count;  // the layers of one virtual stage
} LayerRange;
LayerRange stage_layers(int L, int S, int k);

// A piece is a range of the flat layer-major layout held by a rank, at local
// offset `local` of its own buffers. The pieces of stage r, in order:
// [wte wpe] if r is the first stage; each chunk's blocks; [lnfw lnfb] if r is
// the last; and there, if r is not also the first, a copy of wte for the LM
// head (the tied embedding lives on both ends).
typedef struct {
    size_t global, count, local;
    int tied_copy;  // the last stage's copy of wte: counted once in the norm, not saved
} Piece;
// The pieces of stage r of n_stages with n_virtual chunks each; returns how many.
int rank_pieces(const GPTConfig* cfg, int n_stages, int n_virtual, int r, Piece* p);

// ---------------------------------------------------------------- activations of one microbatch
// A slot holds what one (microbatch, chunk) keeps from its forward until its
// last backward action: the chunk's input, its layers' activations, the
// head's on the last stage, the gradient flowing down, and with a split
// backward the stash each weight half needs. A rank takes a slot at F and
// gives it back after B (or W); slots are allocated only when every slot is
// busy, so the allocator's peak is exactly (peak slots in flight) x (slot),
// plus the backward scratch and (--recompute) the transient, one of each.
typedef struct {
    float* x;      // (b,T,C) the chunk's input: the embedding's output on stage 0, else received
    float* acts;   // layers x block_store_numel: what --recompute keeps of each layer
    float* head;   // head_acts_numel, on the last virtual stage
    float* dres;   // (b,T,C) d loss / d the residual stream, received or from the head
    float* stash;  // layers x block_stash_numel, with a split backward
    float* dlnf;   // (b,T,C) the head's stash, split backward on the last stage
    int* inputs;   // (b,T) token ids, stage 0
    int* targets;  // (b,T) next tokens, the last stage
} Slot;

// Which slot of a chunk holds which microbatch, whatever a slot holds
// (chapter 5's Slot; the capstone's chunks keep their MoE layers' state).
// Each slot is the caller's, allocated on its own, and never moves: an
// action holds a pointer to its slot while a receive may add another.
typedef struct {
    void** s;
    int *mb, *busy;  // (max) the microbatch each slot holds, and whether it does
    int n, max;      // slots made, at most (every microbatch of a step in flight)
} SlotPool;
void slot_pool_create(SlotPool* p, int max);
void slot_pool_free(SlotPool* p);  // the pool; the slots are the caller's to free
// The slot holding mb, else the first free one (mb's now), else NULL: then
// the caller makes one and adds it, mb's (slot_pool_add).
void* slot_pool_take(SlotPool* p, int mb);
void slot_pool_add(SlotPool* p, void* slot, int mb);
// The slot holding mb (none: a backward before its forward, a fatal error).
void* slot_pool_find(const SlotPool* p, int mb);
// mb's slot given back (after the microbatch's last backward action).
void slot_pool_give(SlotPool* p, int mb);

// A send leaves from a buffer of its own, so the slot it came from can be
// reused before the peer has received it. The pool never moves (the CUDA
// backend keeps pointers to the requests).
typedef struct {
    float* buf;
    CommRequest req;
} SendBuf;
typedef struct {
    SendBuf* b;
    int n, max;    // buffers allocated, at most (a step's sends can need no more)
    size_t count;  // floats of each: one activation (b,T,C)
} SendPool;
void send_pool_create(SendPool* s, int max, size_t count);
void send_pool_free(SendPool* s);
// A free buffer of the pool (one whose send completed, else a new one)
// holding a copy of src (count floats), for a comm_isend.
SendBuf* send_pool_take(SendPool* s, const float* src);

// A message between stages: the activation for F or the gradient for B of
// (mb, chunk of the receiver).
typedef struct {
    int grad, mb, chunk;
} Message;

// The messages one neighbour sends to this rank in a step, in the order it
// sends them (read from its list), and how many of them arrived so far.
typedef struct {
    int peer, n, next;
    Message* msg;
} Incoming;

// From every rank's lists (s: pp ranks, v chunks each), the messages the
// neighbours of `stage` send it in a step, each neighbour's in the order it
// sends them, into in[] (freed by pipe_incoming_free). Returns how many
// neighbours send: 0 with one stage, 1 when the stage before is the stage
// after (pp = 2), else 2.
int pipe_incoming_build(const Schedule* s, int stage, Incoming in[2]);
void pipe_incoming_free(Incoming in[2], int n);

// The schedule a pipeline runs: given (lists read from --schedule-file,
// taken over), or kind's lists for pp stages, m microbatches and v chunks.
// Every rank builds and checks every rank's list, so a list that could
// deadlock never runs; a bad one is refused by every rank with one message.
// Chapter 5's pipe_create and the capstone's stages call it.
void pipe_schedule_make(Schedule* s, ScheduleKind kind, int pp, int m, int v, Schedule* given);

// ---------------------------------------------------------------- the links between the stages
// What an executor needs to move its messages, whatever its chunks hold
// (chapter 5's GPT blocks here, the capstone's MoE chunks there): the lists
// of what each neighbour sends this rank, in its order, and the send buffers.
typedef struct {
    const Comm* pp;   // the stages of this pipeline (this rank's stage is its rank)
    Incoming in[2];   // from the stage before and the stage after (one if they are the same rank)
    int n_in;
    SendPool sends;   // each of count floats: one activation or its gradient
    int early;        // messages received before the one an action waited for
} PipeLink;
// The lists from every rank's (pipe_incoming_build), sends of count floats.
void pipe_link_create(PipeLink* l, const Schedule* s, const Comm* pp, size_t count);
void pipe_link_free(PipeLink* l);
// A step's messages from the start: each neighbour's list read from its first.
void pipe_link_begin(PipeLink* l);
// Where a message's payload goes on this rank: the buffer of the activation
// (grad 0, the input of F(mb, chunk)) or of the gradient (grad 1, the input
// of B(mb, chunk)), in the slot that (mb, chunk) holds or takes now.
typedef float* (*PipeSlotBuffer)(void* ctx, int grad, int mb, int chunk);
// The input of an action (05_pipeline/main.c says why in this order): the
// activation of F(mb, chunk) from the stage before (grad 0) or the gradient
// of B(mb, chunk) from the stage after (grad 1): the link's count floats.
// The messages that peer sent before it (in its list's order: l->in) come
// first, each into slot_buffer(ctx, ...), counted in l->early; one that
// came early is already in its buffer. Returns 1 when this call received
// the input (the action waited for it), 0 when it had come early.
int pipe_receive(PipeLink* l, int grad, int mb, int chunk, PipeSlotBuffer slot_buffer, void* ctx);
// Non-blocking, from a buffer of its own (the slot it came from may be
// reused before the peer has received it): count floats to stage peer.
void pipe_send(PipeLink* l, const float* src, int peer);
// Every send of the step completed. On the CUDA backend a comm_isend may be
// issued only at this rank's next comm_* call (common/comm.h), so a step
// pairs each send with its receive (the waits here) before any collective.
void pipe_sends_wait(PipeLink* l);

// ---------------------------------------------------------------- the pipeline of one rank
typedef struct {
    const GPTConfig* cfg;
    const TrainSetup* setup;
    const Comm *pp, *dp;  // the stages of this pipeline; the replicas of this stage
    int stage;            // this rank's stage, 0 .. n_stages-1 (its pp rank)
    int n_stages;         // pp
    int n_virtual;        // chunks per rank (--virtual)
    int n_vstages;        // virtual stages in all, n_stages x n_virtual
    int n_micro;          // microbatches per step of each dp rank's share (--microbatches)
    int micro_batch, seq; // sequences per microbatch, tokens per sequence
    Schedule sched;       // every rank's list of actions
    LayerRange layers[PIPE_MAX_CHUNKS];  // the layers of each chunk of this rank
    size_t chunk_off[PIPE_MAX_CHUNKS];   // local offset of each chunk's first block
    Piece piece[PIPE_MAX_PIECES];
    int n_pieces;
    size_t n_local;                   // floats this rank holds of each kind of state
    float *params, *grads, *mom, *vel;
    float *wte, *wpe, *lnfw, *lnfb;   // the first stage's embedding, the last stage's LayerNorm
    float *head_wte, *dhead_wte;      // the LM head's wte and its gradient (the copy, or wte itself)
    float *dwte, *dwpe, *dlnfw, *dlnfb;
    Comm embed;                       // the first and the last stage of this pipeline (size 0 elsewhere)
    float* scratch;                   // one BlockScratch, shared by every backward
    RecomputeMode recompute;          // --recompute: what a slot keeps of each layer
    float* transient;                 // the dropped fields of one layer, shared by every layer and slot
    SlotPool pool[PIPE_MAX_CHUNKS];
    PipeLink link;   // the messages between the stages
    int *in_host, *tg_host;  // (m, b, T) staging: the step's tokens, each microbatch's at mb b T
    float* loss_host;        // (m, b, T) staging: the step's per-token losses (the last stage)
    int* loss_order;         // (m) the microbatches in the order their losses were queued
    int n_losses;
    int peak_slots;   // slots allocated at once, at most
    DeviceStamps stamps;  // (actions of this rank, 2): each action's start and end, on the device
    int action;           // the running action's index in this rank's list
    double* times;        // (actions of this rank, 2): the stamps, read after the step (pipe_timeline)
    double bubble_sum;
    int bubble_n;
} Pipeline;

// Collective over the world. given: lists read from --schedule-file (taken
// over), or NULL to build kind's lists for n_micro microbatches and
// n_virtual chunks. Every rank builds and validates every rank's list, then
// initialises (or reads from --model FILE) only its own pieces.
void pipe_create(Pipeline* P, const Run* run, ScheduleKind kind, int n_micro, int n_virtual, Schedule* given);
void pipe_free(Pipeline* P);
// Prints (rank 0) each stage's layers and what else it holds.
void pipe_print_layout(const Pipeline* P);

// The virtual stage of chunk c of this rank, and this rank's neighbours on
// the pp axis (a link's stages: this chapter's and the capstone's).
static inline int pipe_vstage(const Pipeline* P, int c) { return c * P->n_stages + P->stage; }
static inline int pipe_next(const PipeLink* l) { return (l->pp->rank + 1) % l->pp->size; }
static inline int pipe_prev(const PipeLink* l) { return (l->pp->rank + l->pp->size - 1) % l->pp->size; }
// Parameters and gradients of layer j of chunk c.
BlockParams pipe_block_params(const Pipeline* P, int c, int j);
BlockParams pipe_block_grads(const Pipeline* P, int c, int j);

// ---------------------------------------------------------------- slots
// The slot of (mb, chunk c): the one already taken, else a free one, else a new one.
Slot* slot_get(Pipeline* P, int c, int mb);
// The slot (mb, chunk c) took at its forward.
Slot* slot_find(Pipeline* P, int c, int mb);
// Layer j's activations as its forward writes them: the kept fields in the
// slot, the ones --recompute drops in the rank's one transient buffer.
BlockActs slot_block(const Pipeline* P, const Slot* sl, int j);
BlockStash slot_stash(const Pipeline* P, const Slot* sl, int j);
HeadActs slot_head(const Pipeline* P, const Slot* sl);
// The input of layer j of the chunk: the previous layer's output, or the chunk's input.
const float* layer_input(const Pipeline* P, const Slot* sl, int j);
// Before layer j's backward: what --recompute dropped, rebuilt (see pipeline.c).
BlockActs slot_recompute(const Pipeline* P, const Slot* sl, int j, int layer, const BlockParams* p,
                         int weights_only);
// The microbatch's tokens: stage 0 needs the inputs, the last stage the
// targets. Queued (mem_to_device_queued): the host does not wait for the
// device, which runs the copy after the slot's earlier kernels.
void slot_load_tokens(Pipeline* P, Slot* sl, long step, int mb);
// The mean loss of the microbatch whose head forward just ran on sl (host;
// waits for the device: validation).
double slot_mean_loss(Pipeline* P, const Slot* sl);
// Training: microbatch mb's per-token losses, queued to the host
// (mem_to_host_queued); pipe_step_loss_sum adds them up once per step.
void slot_queue_losses(Pipeline* P, const Slot* sl, int mb);
// The step's queued losses (after waiting for the device once): the sum of
// the microbatches' mean losses, in the order they were queued, the same
// arithmetic as adding each slot_mean_loss as it came.
double pipe_step_loss_sum(Pipeline* P);


// ---------------------------------------------------------------- around the step
// The embedding group of each pipeline: the world ranks of its stage 0 and
// its stage pp-1 (the same coordinates on every other axis of the mesh);
// size 0 on every other rank and with one stage. Collective over the world.
void pipe_embedding_group(Comm* embed, const Mesh* mesh);
// The tied embedding's gradient: the first and the last stage of the
// pipeline pp each hold a half of wte's (mine, n floats: the lookup's, the
// head's) and sum them in their embedding group (embed, the two ends); any
// other stage, and a pipeline of one stage, does nothing.
void pipe_sum_tied_embedding(const Comm* embed, const Comm* pp, float* mine, size_t n);
// The validation loss through the stages (forward only), the mean over dp;
// -1 without validation data. Collective over the world. A TrainValLoss
// (train_loop.h), ctx the Pipeline.
float pipe_val_loss(void* pipeline, const TrainSetup* setup, int n_batches);
// A buffer's whole on the host from every stage's pieces of it, for a file
// or a sample (not training): each stage copies its pieces of its device
// buffer `mine` (the tied copy left out) into `whole` (host, zeros
// elsewhere), then pipe_pieces_merge(pp, whole, n) leaves on pp rank 0 the
// whole of n floats (the other stages' `whole` undefined). Collective over pp
// (merge). The capstone's pipeline merges its three buffers so, its experts
// and tp slices as one piece a chunk.
void pipe_pieces_to_host(float* whole, const float* mine, const Piece* p, int n);
void pipe_pieces_merge(const Comm* pp, float* whole, size_t n);
// The whole model on world rank 0 (host, flat layout) for --sample and
// --save; NULL elsewhere. Collective over the pp axis of dp rank 0.
float* pipe_gather_params(Pipeline* P);
// Registers this rank's pieces with the training-state checkpoint.
void pipe_ckpt(Ckpt* ck, const Pipeline* P);
// Reads this rank's action stamps of the step (on CUDA a wait for the
// device, which the step's norm has waited for already), then rank 0
// gathers every rank's action times of the step, writes them as
// timeline records to the log and adds the step's bubble to the mean (unless
// warmup: the first of several timed steps). Returns the step's bubble.
double pipe_timeline(Pipeline* P, JsonLog* log, int step, int warmup);
double pipe_bubble(const Pipeline* P);  // the mean bubble of the counted steps
// The summary's own fields: the schedule, its bubbles, and every rank's
// layers, peak activation slots and early receives (rank 0's out holds them).
// Collective over the world.
void pipe_summary_fields(const Pipeline* P, const char* sched_name, double simulated, double formula, JsonBuf* out);
// Its per-rank part, for any executor on a PipeLink (the capstone's too):
// this rank's layers and peak slots, the link's early receives, gathered to
// rank 0 as "layers", "activation_slots", "early_receives". Collective over
// the world.
void pipe_summary_ranks(int layers, int peak_slots, const PipeLink* link, JsonBuf* out);

// --show-sharding: the layers of this rank's stages, the embedding on the
// first, the final LayerNorm and the tied wte's copy on the last (sharding.h).
// Collective when show is set.
void pipe_show_sharding(const Pipeline* P, int show);

#endif
