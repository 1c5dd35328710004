// Chapter 5: pipeline parallelism.
//
// The layers are cut into pp stages, one per rank of the pp axis: stage s
// owns a contiguous range of layers, the first stage also the embedding, the
// last the final LayerNorm and the LM head. A batch goes through the stages
// like cars through a car wash: each rank's share of the batch is cut into
// --microbatches m pieces, and while stage 1 runs microbatch 0, stage 0
// already runs microbatch 1. Activations travel forward between neighbouring
// stages and their gradients travel back, point to point.
//
//   mpirun -np 4 build/chapter-5 --pp 4 --model tiny6 --microbatches 8 --schedule 1f1b
//
// The order in which each stage runs its forwards and backwards is the
// schedule, and a schedule is data (05_pipeline/schedule.c): a list of
// actions per rank, F(mb, chunk), B(mb, chunk), W(mb, chunk), built by one
// small function per schedule:
//   gpipe        every forward, then every backward (m microbatches held)
//   1f1b         warm-up, then one forward one backward, then cool-down
//                (stage s holds at most pp - s microbatches)
//   interleaved  --virtual v chunks per rank, the bubble shrinks by v
//   zb           ZB-H1: backward split into the input gradient (B, on the
//                critical path) and the weight gradient (W, into the bubble)
// (--schedule-file FILE runs lists written by hand instead.) This file is
// the executor that runs any list, and the training step around it: the
// tied embedding's two gradients summed, the dp all-reduce, the norm over
// the stages, AdamW on what each rank owns. --recompute keeps less of each
// layer per microbatch in flight and recomputes it in backward.
//
// The layer split: virtual stage k of S = pp * v owns L / S layers, the first
// L % S stages one more (an uneven split when pp does not divide L, printed
// at start-up). With v > 1 the chunks must be equal: v must divide L / pp.
// A stage with no layer is refused (pp * v > L).
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "args.h"
#include "ckpt.h"
#include "comm.h"
#include "errors.h"
#include "exercise.h"  // exercise_not_done, in a homework tree
#include "memory.h"
#include "mesh.h"
#include "model.h"
#include "rank.h"
#include "report.h"
#include "runtime.h"
#include "trace.h"
#include "train.h"

#include "init.h"
#include "model_file.h"
#include "schedule.h"

// ---------------------------------------------------------------- what a rank owns
// A piece is a range of the flat layer-major layout held by this rank, at
// local offset `local` of its own buffers. The pieces of rank r, in order:
// [wte wpe] if r holds stage 0; each chunk's blocks; [lnfw lnfb] if r holds
// the last stage; and there, if r is not also the first, a copy of wte for
// the LM head (the tied embedding lives on both ends).
typedef struct {
    size_t global, count, local;
    int tied_copy;  // the last stage's copy of wte: counted once in the norm, not saved
} Piece;

#define MAX_PIECES 72  // 64 chunks + 3

typedef struct {
    int first, count;  // layers of one virtual stage
} LayerRange;

// The layers of virtual stage k of S: L / S each, the first L % S one more.
static LayerRange stage_layers(int L, int S, int k) {
    // EXERCISE 1: the layer split: the first layer and the layer count of virtual stage k of S, L / S each and the first L % S one more
    int base = L / S, extra = L % S;
    LayerRange r = {k * base + (k < extra ? k : extra), base + (k < extra ? 1 : 0)};
    return r;
    // END EXERCISE 1
}

static int rank_pieces(const GPTConfig* cfg, int pp, int v, int r, Piece* p) {
    int n = 0, S = pp * v;
    size_t local = 0, C = (size_t)cfg->channels, wte = param_tensor_numel(cfg, P_WTE);
#define ADD(g, c, t) (p[n] = (Piece){(g), (c), local, (t)}, local += (c), n++)
    if (r == 0) ADD(0, wte + param_tensor_numel(cfg, P_WPE), 0);
    for (int c = 0; c < v; c++) {
        LayerRange lr = stage_layers(cfg->num_layers, S, c * pp + r);
        ADD(gpt_block_offset(cfg, lr.first), (size_t)lr.count * gpt_block_numel(cfg->channels), 0);
    }
    if (r == pp - 1) ADD(gpt_tensor_offset(cfg, P_LNFW, 0), 2 * C, 0);
    if (r == pp - 1 && r != 0) ADD(0, wte, 1);
#undef ADD
    return n;
}

// ---------------------------------------------------------------- activations of one microbatch
// A slot holds what one (microbatch, chunk) keeps from its forward until its
// last backward action: the chunk's input, its layers' activations, the
// head's on the last stage, the gradient flowing down, and with a split
// backward the stash each weight half needs. A rank takes a slot at F and
// gives it back after B (or W); slots are allocated only when every slot is
// busy, so the allocator's peak is exactly (peak slots in flight) x (slot),
// plus the backward scratch and (--recompute) the transient, one of each.
typedef struct {
    int mb, busy;
    float* x;      // (b,T,C) the chunk's input: the embedding's output on stage 0, else received
    float* acts;   // layers x block_store_numel: what --recompute keeps of each layer
    float* head;   // head_acts_numel, on the last virtual stage
    float* dres;   // (b,T,C) d loss / d the residual stream, received or from the head
    float* stash;  // layers x block_stash_numel, with a split backward
    float* dlnf;   // (b,T,C) the head's stash, split backward on the last stage
    int* inputs;   // (b,T) token ids, stage 0
    int* targets;  // (b,T) next tokens, the last stage
} Slot;

// The slots of one chunk. Each slot is allocated on its own and never moves:
// an action holds a pointer to its slot while a receive may add another.
typedef struct {
    Slot** s;
    int n;
} SlotPool;

// A send leaves from a buffer of its own, so the slot it came from can be
// reused before the peer has received it. The pool never moves (the CUDA
// backend keeps pointers to the requests).
typedef struct {
    float* buf;
    CommRequest req;
} SendBuf;

// A message between stages: the activation for F or the gradient for B of
// (mb, chunk of the receiver).
typedef struct {
    int grad, mb, chunk;
} Message;

typedef struct {
    int peer, n, next;  // messages from peer, in the order the peer sends them
    Message* msg;
} Incoming;

typedef struct {
    const GPTConfig* cfg;
    const TrainSetup* setup;
    const Comm *pp, *dp;
    int s, npp, v, S, m, b, T;  // stage, stages, chunks, virtual stages, microbatches, microbatch size
    Schedule sched;
    LayerRange layers[64];  // of each chunk
    Piece piece[MAX_PIECES];
    int n_pieces;
    size_t n_local;
    float *params, *grads, *mom, *vel;
    size_t chunk_off[64];             // local offset of each chunk's first block
    float *wte, *wpe, *lnfw, *lnfb;   // stage 0's embedding, the last stage's LayerNorm
    float *head_wte, *dhead_wte;      // the LM head's wte and its gradient (the copy, or wte itself)
    float *dwte, *dwpe, *dlnfw, *dlnfb;
    float* scratch;                   // one BlockScratch, shared by every backward
    RecomputeMode recompute;          // --recompute: what a slot keeps of each layer
    float* transient;                 // the dropped fields of one layer, shared by every layer and slot
    SlotPool pool[64];
    SendBuf* sends;
    int n_sends, max_sends;
    Incoming in[2];
    int n_in;
    int *in_host, *tg_host;
    float* loss_host;
    double loss_sum;
    int peak_slots;
    int early;       // messages received before the one an action waited for (receive)
    double t_start;  // when the running action started computing (after its receive)
} Pipe;

static size_t slot_floats(const Pipe* P, int c, int* n_ints) {
    const GPTConfig* g = P->cfg;
    int C = g->channels, NH = g->num_heads, n = P->layers[c].count, k = c * P->npp + P->s;
    size_t BT = (size_t)P->b * P->T, f = 2 * BT * C + (size_t)n * block_store_numel(P->b, P->T, C, NH, P->recompute);
    if (k == P->S - 1) f += head_acts_numel(P->b, P->T, C, g->padded_vocab_size);
    if (P->sched.split_backward) f += (size_t)n * block_stash_numel(P->b, P->T, C) + (k == P->S - 1 ? BT * C : 0);
    *n_ints = (k == 0 ? (int)BT : 0) + (k == P->S - 1 ? (int)BT : 0);
    return f;
}

// The slot of (mb, chunk c): the one already taken, else a free one, else a new one.
static Slot* slot_get(Pipe* P, int c, int mb) {
    SlotPool* pool = &P->pool[c];
    Slot* free_slot = NULL;
    for (int i = 0; i < pool->n; i++) {
        if (pool->s[i]->busy && pool->s[i]->mb == mb) return pool->s[i];
        if (!pool->s[i]->busy && !free_slot) free_slot = pool->s[i];
    }
    if (!free_slot) {
        Slot** grown = realloc(pool->s, (size_t)(pool->n + 1) * sizeof(Slot*));
        if (!grown) FATAL("out of host memory for activation slots");
        pool->s = grown;
        free_slot = pool->s[pool->n++] = xmalloc(sizeof(Slot));
        const GPTConfig* g = P->cfg;
        int C = g->channels, NH = g->num_heads, n = P->layers[c].count, k = c * P->npp + P->s, ints;
        size_t BT = (size_t)P->b * P->T, total = slot_floats(P, c, &ints);
        // ints are 4 bytes like floats: one allocation per slot
        float* base = mem_alloc_floats(total + (size_t)ints, MEM_ACTIVATIONS);
        memset(free_slot, 0, sizeof(*free_slot));
        free_slot->x = base;                 base += BT * C;
        free_slot->dres = base;              base += BT * C;
        free_slot->acts = base;              base += (size_t)n * block_store_numel(P->b, P->T, C, NH, P->recompute);
        if (k == P->S - 1) {
            free_slot->head = base;          base += head_acts_numel(P->b, P->T, C, g->padded_vocab_size);
        }
        if (P->sched.split_backward) {
            free_slot->stash = base;         base += (size_t)n * block_stash_numel(P->b, P->T, C);
            if (k == P->S - 1) {
                free_slot->dlnf = base;      base += BT * C;
            }
        }
        int* ib = (int*)base;
        if (k == 0) free_slot->inputs = ib, ib += BT;
        if (k == P->S - 1) free_slot->targets = ib;
        int in_use = 0;
        for (int cc = 0; cc < P->v; cc++) in_use += P->pool[cc].n;
        if (in_use > P->peak_slots) P->peak_slots = in_use;
    }
    free_slot->busy = 1;
    free_slot->mb = mb;
    return free_slot;
}

static Slot* slot_find(Pipe* P, int c, int mb) {
    for (int i = 0; i < P->pool[c].n; i++)
        if (P->pool[c].s[i]->busy && P->pool[c].s[i]->mb == mb) return P->pool[c].s[i];
    FATAL("stage %d: no activations of microbatch %d chunk %d (a backward before its forward?)", P->s, mb, c);
}

// Layer j's activations as its forward writes them: the kept fields in the
// slot, the ones --recompute drops in the rank's one transient buffer.
static float* slot_store(const Pipe* P, const Slot* sl, int j) {
    return sl->acts + (size_t)j * block_store_numel(P->b, P->T, P->cfg->channels, P->cfg->num_heads, P->recompute);
}

static BlockActs slot_block(const Pipe* P, const Slot* sl, int j) {
    return block_acts_kept(slot_store(P, sl, j), P->transient, P->b, P->T, P->cfg->channels, P->cfg->num_heads,
                           P->recompute);
}

static BlockStash slot_stash(const Pipe* P, const Slot* sl, int j) {
    return block_stash_at(sl->stash + (size_t)j * block_stash_numel(P->b, P->T, P->cfg->channels), P->b, P->T,
                          P->cfg->channels);
}

// The input of layer j of the chunk: the previous layer's output, or the chunk's input.
static const float* layer_input(const Pipe* P, const Slot* sl, int j) {
    return j > 0 ? slot_block(P, sl, j - 1).res3 : sl->x;
}

// Before layer j's backward: what --recompute dropped, recomputed into the
// transient from the layer's kept fields and input (full: its whole forward
// again). With a split backward this runs before the input half (B), and
// the weight half (W, later, after other layers used the transient) redoes
// what it reads: the GELU (selective) or the whole forward (full). Keeping
// those from B to W instead would hold what the mode meant to drop for every
// microbatch between its B and its W.
// layer: the model's layer number, for the trace's span (docs/tracing.md).
static BlockActs slot_recompute(const Pipe* P, const Slot* sl, int j, int layer, const BlockParams* p,
                                int weights_only) {
    const GPTConfig* g = P->cfg;
    double t0 = trace_start();
    BlockActs a = weights_only
                      ? block_acts_recompute_weights(p, slot_store(P, sl, j), P->transient, layer_input(P, sl, j),
                                                     P->b, P->T, g->channels, g->num_heads, P->recompute)
                      : block_acts_recompute(p, slot_store(P, sl, j), P->transient, layer_input(P, sl, j), P->b,
                                             P->T, g->channels, g->num_heads, P->recompute);
    if (P->recompute != RECOMPUTE_NONE) trace_compute(t0, "block %d recompute", layer);
    return a;
}

static HeadActs slot_head(const Pipe* P, const Slot* sl) {
    return head_acts_at(sl->head, P->b, P->T, P->cfg->channels, P->cfg->padded_vocab_size);
}

// ---------------------------------------------------------------- point to point
// Why no schedule can deadlock here. Every send is non-blocking (a rank never
// waits for its peer to take a message), and every receive blocks until the
// message is there. A rank therefore waits only at the start of an action,
// for an input that another rank produces at the end of one of its actions.
// Such waits form a cycle only if the lists themselves do, and the validator
// (schedule_validate) runs the lists under exactly these rules and refuses
// any list in which every rank would end up waiting. Every rank builds and
// checks every rank's list before training.
//
// Messages carry no tag: between two ranks they arrive in the order they were
// sent (MPI's rule for one tag, NCCL's for one stream). With pp = 2 and
// interleaving, one peer is both neighbours and sends activations and
// gradients on the same channel, in an order that need not be the order in
// which this rank needs them. So a rank knows, from its peers' lists, the
// order in which each peer sends to it, and when it needs a message it
// receives everything that peer sent before it first, each into the slot
// where it belongs (an early activation takes its slot early), and the
// action that needs it later finds it already there. The built-in schedules
// never need this (their channels carry one kind of message, or run in
// lockstep); a schedule of your own (--schedule-file) may, and the summary
// counts such messages per rank ("early_receives").
static void incoming_build(Pipe* P) {
    int pp = P->npp;
    if (pp == 1) return;
    int peers[2] = {(P->s + pp - 1) % pp, (P->s + 1) % pp};
    P->n_in = peers[0] == peers[1] ? 1 : 2;
    for (int i = 0; i < P->n_in; i++) {
        int p = peers[i];
        Incoming* in = &P->in[i];
        in->peer = p;
        in->msg = xcalloc((size_t)P->sched.n[p] + 1, sizeof(Message));
        for (int a = 0; a < P->sched.n[p]; a++) {
            Action act = P->sched.list[p][a];
            int k = act.chunk * pp + p;
            if (act.type == ACT_F && k < P->S - 1 && (k + 1) % pp == P->s)
                in->msg[in->n++] = (Message){0, act.mb, (k + 1) / pp};
            if (act.type == ACT_B && k > 0 && (k - 1) % pp == P->s)
                in->msg[in->n++] = (Message){1, act.mb, (k - 1) / pp};
        }
    }
}

static void receive(Pipe* P, int grad, int mb, int c) {
    // EXERCISE 3: receive the input of an action from its peer: the messages that peer sent before it first, each into its own slot; one that came early is already there
    int pp = P->npp, peer = grad ? (P->s + 1) % pp : (P->s + pp - 1) % pp;
    Incoming* in = P->in[0].peer == peer ? &P->in[0] : &P->in[1];
    size_t BTC = (size_t)P->b * P->T * P->cfg->channels;
    // already here: it came early, before the one another action waited for
    for (int i = 0; i < in->next; i++)
        if (in->msg[i].grad == grad && in->msg[i].mb == mb && in->msg[i].chunk == c) return;
    while (in->next < in->n) {
        Message msg = in->msg[in->next++];
        Slot* sl = msg.grad ? slot_find(P, msg.chunk, msg.mb) : slot_get(P, msg.chunk, msg.mb);
        comm_recv(P->pp, msg.grad ? sl->dres : sl->x, BTC, peer);
        if (msg.grad == grad && msg.mb == mb && msg.chunk == c) {
            // the time spent waiting for the input is bubble, not work
            P->t_start = now_seconds();
            return;
        }
        P->early++;  // another action's input, kept in its slot until that action runs
    }
    FATAL("stage %d: rank %d never sends the %s of microbatch %d", P->s, peer, grad ? "gradient" : "activation", mb);
    // END EXERCISE 3
}

static void send(Pipe* P, const float* src, int peer) {
    size_t BTC = (size_t)P->b * P->T * P->cfg->channels;
    SendBuf* sb = NULL;
    for (int i = 0; i < P->n_sends && !sb; i++)
        if (comm_test(&P->sends[i].req)) sb = &P->sends[i];
    if (!sb) {
        if (P->n_sends == P->max_sends) FATAL("more sends in flight than the schedule has");
        sb = &P->sends[P->n_sends++];
        sb->buf = mem_alloc_floats(BTC, MEM_COMM);
    }
    ops_copy(sb->buf, src, BTC);
    comm_isend(P->pp, sb->buf, BTC, peer, &sb->req);
}

// Every send of the step completed. On the CUDA backend a comm_isend is held
// until this rank's next comm_* call (common/comm.h), so the step pairs each
// send with its receive (the waits here) before any collective is started.
static void sends_wait(Pipe* P) {
    for (int i = 0; i < P->n_sends; i++) comm_wait(&P->sends[i].req);
}

// ---------------------------------------------------------------- the three actions

// The microbatch's tokens: stage 0 needs the inputs, the last stage the targets.
static void load_tokens(Pipe* P, Slot* sl, long step, int mb, const TokenSet* set) {
    int per = P->setup->B / P->dp->size, b0 = P->dp->rank * per + mb * P->b;
    data_batch(set, step, P->setup->B, P->T, b0, P->b, P->in_host, P->tg_host);
    size_t BT = (size_t)P->b * P->T;
    if (sl->inputs) mem_to_device(sl->inputs, P->in_host, BT * sizeof(int));
    if (sl->targets) mem_to_device(sl->targets, P->tg_host, BT * sizeof(int));
}

static void forward(Pipe* P, int mb, int c, long step, const TokenSet* set) {
    const GPTConfig* g = P->cfg;
    int C = g->channels, NH = g->num_heads, k = c * P->npp + P->s, b = P->b, T = P->T;
    Slot* sl = slot_get(P, c, mb);
    if (k == 0 || k == P->S - 1) load_tokens(P, sl, step, mb, set);
    if (k == 0) encoder_forward(sl->x, sl->inputs, P->wte, P->wpe, b, T, C);
    else receive(P, 0, mb, c);
    const float* x = sl->x;
    for (int j = 0; j < P->layers[c].count; j++) {
        BlockParams p = block_params_at(P->params + P->chunk_off[c] + (size_t)j * gpt_block_numel(C), C);
        BlockActs a = slot_block(P, sl, j);
        double t0 = trace_start();
        block_forward(&p, &a, x, b, T, C, NH);
        trace_compute(t0, "block %d forward", P->layers[c].first + j);
        x = a.res3;
    }
    if (k == P->S - 1) {
        HeadActs h = slot_head(P, sl);
        head_forward(g, P->head_wte, P->lnfw, P->lnfb, &h, x, sl->targets, b, T);
        size_t BT = (size_t)b * T;
        mem_to_host(P->loss_host, h.losses, BT * sizeof(float));
        double sum = 0.0;
        for (size_t i = 0; i < BT; i++) sum += P->loss_host[i];
        P->loss_sum += sum / (double)BT;
    } else {
        send(P, x, (P->s + 1) % P->npp);
    }
}

// B: the whole backward, or with a split backward only the input gradient
// (the weight halves wait for W, their stash in the slot).
static void backward(Pipe* P, int mb, int c) {
    const GPTConfig* g = P->cfg;
    int C = g->channels, NH = g->num_heads, k = c * P->npp + P->s, b = P->b, T = P->T, n = P->layers[c].count;
    int split = P->sched.split_backward;
    Slot* sl = slot_find(P, c, mb);
    BlockScratch scr = block_scratch_at(P->scratch, b, T, C, NH);
    if (k == P->S - 1) {
        // each microbatch's share of the mean loss of this rank's sequences
        float dloss = 1.0f / ((float)b * T * P->m);
        HeadActs h = slot_head(P, sl);
        const float* last = layer_input(P, sl, n);
        if (split)
            head_backward_input(g, P->head_wte, P->lnfw, &h, last, sl->targets, dloss, sl->dlnf, sl->dres, b, T);
        else
            head_backward(g, P->head_wte, P->lnfw, P->dhead_wte, P->dlnfw, P->dlnfb, &h, last, sl->targets, dloss,
                          scr.dln, sl->dres, b, T);
    } else {
        receive(P, 1, mb, c);
    }
    for (int j = n - 1; j >= 0; j--) {
        size_t off = P->chunk_off[c] + (size_t)j * gpt_block_numel(C);
        BlockParams p = block_params_at(P->params + off, C);
        // with a split backward the span is B, the input half
        double t0 = trace_start();
        BlockActs a = slot_recompute(P, sl, j, P->layers[c].first + j, &p, 0);
        if (split) {
            BlockStash st = slot_stash(P, sl, j);
            block_backward_input(&p, &a, &scr, &st, layer_input(P, sl, j), sl->dres, b, T, C, NH);
        } else {
            BlockParams gr = block_params_at(P->grads + off, C);
            block_backward(&p, &gr, &a, &scr, layer_input(P, sl, j), sl->dres, b, T, C, NH);
        }
        trace_compute(t0, "block %d backward", P->layers[c].first + j);
    }
    if (k > 0) send(P, sl->dres, (P->s + P->npp - 1) % P->npp);
    if (!split) {
        if (k == 0) encoder_backward(P->dwte, P->dwpe, sl->dres, sl->inputs, b, T, C);
        sl->busy = 0;
    }
}

// W: the weight gradients the input half left in the stash.
static void weights(Pipe* P, int mb, int c) {
    // EXERCISE 5: the W action of a split backward: the head's and every layer's weight halves from the stash (recomputing what they read), the embedding's gradient on stage 0, then free the slot
    const GPTConfig* g = P->cfg;
    int C = g->channels, k = c * P->npp + P->s, b = P->b, T = P->T, n = P->layers[c].count;
    Slot* sl = slot_find(P, c, mb);
    if (k == P->S - 1) {
        HeadActs h = slot_head(P, sl);
        head_backward_weights(g, P->dhead_wte, P->dlnfw, P->dlnfb, &h, layer_input(P, sl, n), sl->dlnf, b, T);
    }
    for (int j = n - 1; j >= 0; j--) {
        size_t off = P->chunk_off[c] + (size_t)j * gpt_block_numel(C);
        BlockParams p = block_params_at(P->params + off, C), gr = block_params_at(P->grads + off, C);
        double t0 = trace_start();
        BlockActs a = slot_recompute(P, sl, j, P->layers[c].first + j, &p, 1);
        BlockStash st = slot_stash(P, sl, j);
        block_backward_weights(&gr, &a, &st, layer_input(P, sl, j), b, T, C);
        trace_compute(t0, "block %d backward weights", P->layers[c].first + j);
    }
    // the embedding's gradient is a weight gradient too: d encoded sits in dres
    if (k == 0) encoder_backward(P->dwte, P->dwpe, sl->dres, sl->inputs, b, T, C);
    sl->busy = 0;
    // END EXERCISE 5
}

// ---------------------------------------------------------------- the step

// Each action's start and end (host clock, seconds), for the timelines. The
// start is when the action's input is there: a wait in its receive is idle
// time, the bubble, and not part of the action.
typedef struct {
    double* t;  // (n actions, 2)
    int n;
} Timeline;

// Runs this rank's list once: one training step's forwards and backwards.
static void run_schedule(Pipe* P, long step, Timeline* tl) {
    int r = P->s;
    P->loss_sum = 0.0;
    for (int i = 0; i < P->n_in; i++) P->in[i].next = 0;  // each step's messages from the start
    for (int i = 0; i < P->sched.n[r]; i++) {
        Action a = P->sched.list[r][i];
        P->t_start = now_seconds();
        switch (a.type) {
            case ACT_F: forward(P, a.mb, a.chunk, step, &P->setup->train); break;
            case ACT_B: backward(P, a.mb, a.chunk); break;
            case ACT_W: weights(P, a.mb, a.chunk); break;
        }
        device_synchronize();  // the action's end on the device, for its timeline
        tl->t[2 * i] = P->t_start;
        tl->t[2 * i + 1] = now_seconds();
    }
    sends_wait(P);
}

// The tied embedding: stage 0 holds wte for the lookup and accumulated the
// lookup's gradient; the last stage holds a copy for the LM head and
// accumulated the head's. The model's gradient is their sum, so the two ends
// all-reduce it in their group of two (a + b = b + a, bit for bit): both hold
// the same sum, take the same AdamW step and stay equal. Megatron-LM does the
// same in its "embedding group" of the first and last stage.
static void sum_tied_embedding(Pipe* P, const Comm* embed) {
    // EXERCISE 4: the tied embedding: the first and the last stage sum their two wte gradients in their group of two
    if (P->npp == 1 || (P->s != 0 && P->s != P->npp - 1)) return;
    float* mine = P->s == 0 ? P->dwte : P->dhead_wte;
    comm_allreduce(embed, mine, param_tensor_numel(P->cfg, P_WTE), COMM_SUM);
    // END EXERCISE 4
}

// The embedding group of each pipeline (one per dp rank): world ranks of
// stage 0 and stage pp-1 with this dp coordinate. Every rank takes part in
// making every group (collective over the world) and keeps its own.
static void embedding_group(Comm* embed, const Mesh* mesh) {
    memset(embed, 0, sizeof(*embed));
    int pp = mesh->size[AXIS_PP];
    if (pp == 1) return;
    for (int d = 0; d < mesh->size[AXIS_DP]; d++) {
        int coord[NUM_AXES] = {0}, ends[2];
        coord[AXIS_DP] = d;
        ends[0] = mesh_rank_at(mesh, coord);
        coord[AXIS_PP] = pp - 1;
        ends[1] = mesh_rank_at(mesh, coord);
        Comm g;
        comm_create_group_ranks(&g, ends, 2, "embedding");
        if (g.size > 0) *embed = g;
    }
}

typedef struct {
    Pipe* P;
    const TrainArgs* args;
    Comm embed;  // the first and last stage of this pipeline (size 0 elsewhere)
} Trainer;

static float train_step(Trainer* tr, long step, Timeline* tl, float* norm) {
    Pipe* P = tr->P;
    mem_zero(P->grads, P->n_local * sizeof(float));
    run_schedule(P, step, tl);
    sum_tied_embedding(P, &tr->embed);
    // data parallel: each stage's gradients averaged over its dp replicas
    if (P->dp->size > 1) comm_allreduce(P->dp, P->grads, P->n_local, COMM_AVG);
    // the norm: each parameter once (the tied copy left out), summed over
    // the stages; dp replicas hold the same gradients after the average
    double mine = 0.0;
    for (int i = 0; i < P->n_pieces; i++)
        if (!P->piece[i].tied_copy) mine += grad_sumsq(P->grads + P->piece[i].local, P->piece[i].count);
    const Comm* groups[1] = {P->pp};
    *norm = (float)train_global_norm(mine, groups, 1);
    double t0 = trace_start();
    adamw_update(P->params, P->grads, P->mom, P->vel, P->n_local, train_adamw(tr->args), (int)step + 1,
                 grad_clip_scale(*norm, tr->args->clip));
    trace_compute(t0, "optimizer");
    // only the last stage saw the loss: it tells its pipeline, then the dp mean
    double loss = P->s == P->npp - 1 ? P->loss_sum / P->m : 0.0;
    MPI_CHECK(MPI_Bcast(&loss, 1, MPI_DOUBLE, P->npp - 1, P->pp->mpi));
    return (float)train_mean(P->dp, loss);
}

// Validation: the same pieces as every chapter (train_val_loss_with), each
// sent forward through the stages (blocking sends: forward only, one
// direction, no cycle) on a free slot.
static float val_forward(void* ctx, const int* inputs, const int* targets) {
    Pipe* P = ctx;
    const GPTConfig* g = P->cfg;
    int C = g->channels, NH = g->num_heads, b = P->b, T = P->T, pp = P->npp;
    size_t BT = (size_t)b * T, BTC = BT * C;
    float loss = 0.0f;
    for (int c = 0; c < P->v; c++) {
        int k = c * pp + P->s;
        Slot* sl = slot_get(P, c, -1);
        if (k == 0) {
            mem_to_device(sl->inputs, inputs, BT * sizeof(int));
            encoder_forward(sl->x, sl->inputs, P->wte, P->wpe, b, T, C);
        } else {
            comm_recv(P->pp, sl->x, BTC, (P->s + pp - 1) % pp);
        }
        const float* x = sl->x;
        for (int j = 0; j < P->layers[c].count; j++) {
            BlockParams p = block_params_at(P->params + P->chunk_off[c] + (size_t)j * gpt_block_numel(C), C);
            BlockActs a = slot_block(P, sl, j);
            block_forward(&p, &a, x, b, T, C, NH);
            x = a.res3;
        }
        if (k == P->S - 1) {
            mem_to_device(sl->targets, targets, BT * sizeof(int));
            HeadActs h = slot_head(P, sl);
            head_forward(g, P->head_wte, P->lnfw, P->lnfb, &h, x, sl->targets, b, T);
            mem_to_host(P->loss_host, h.losses, BT * sizeof(float));
            double sum = 0.0;
            for (size_t i = 0; i < BT; i++) sum += P->loss_host[i];
            loss = (float)(sum / (double)BT);
        } else {
            comm_send(P->pp, x, BTC, (P->s + 1) % pp);
        }
        sl->busy = 0;
    }
    return loss;
}

static float val_loss(Pipe* P, int n_batches) {
    int per = P->setup->B / P->dp->size;
    // every rank runs the same pieces; the last stage's mean is the loss
    double mine = train_val_loss_with(P->setup, n_batches, val_forward, P, P->dp->rank * per, per, P->b, NULL);
    if (mine < 0) return -1.0f;  // no validation data (every rank alike)
    MPI_CHECK(MPI_Bcast(&mine, 1, MPI_DOUBLE, P->npp - 1, P->pp->mpi));
    return (float)train_mean(P->dp, mine);
}

// ---------------------------------------------------------------- set-up

// given: lists read from --schedule-file (taken over), or NULL to build kind's
static void pipe_create(Pipe* P, const Run* run, ScheduleKind kind, int m, int v, Schedule* given) {
    memset(P, 0, sizeof(*P));
    const TrainSetup* setup = &run->setup;
    const GPTConfig* cfg = &setup->cfg;
    P->cfg = cfg;
    P->setup = setup;
    P->pp = &run->axes[AXIS_PP];
    P->dp = &run->axes[AXIS_DP];
    P->npp = P->pp->size;
    P->s = P->pp->rank;
    P->v = v;
    P->S = P->npp * v;
    P->m = m;
    P->T = setup->T;
    P->b = setup->B / P->dp->size / m;
    char msg[512];
    const char* bad = NULL;
    if (given) P->sched = *given;
    else bad = schedule_build(&P->sched, kind, P->npp, m, v, msg, sizeof(msg));
    if (bad) fail_all("%s", bad);
    // every rank checks every rank's list: a list that could deadlock never runs
    bad = schedule_validate(&P->sched, NULL, msg, sizeof(msg));
    if (bad) fail_all("schedule %s is not valid: %s", schedule_name(kind), bad);
    for (int c = 0; c < v; c++) P->layers[c] = stage_layers(cfg->num_layers, P->S, c * P->npp + P->s);
    P->n_pieces = rank_pieces(cfg, P->npp, v, P->s, P->piece);
    P->n_local = P->piece[P->n_pieces - 1].local + P->piece[P->n_pieces - 1].count;
    P->params = mem_alloc_floats(P->n_local, MEM_PARAMS);
    P->grads = mem_alloc_floats(P->n_local, MEM_GRADS);
    P->mom = mem_alloc_floats(P->n_local, MEM_OPTIMIZER);
    P->vel = mem_alloc_floats(P->n_local, MEM_OPTIMIZER);
    // where things sit in the local buffers
    int i = 0;
    size_t wte_n = param_tensor_numel(cfg, P_WTE);
    if (P->s == 0) {
        P->wte = P->params;
        P->wpe = P->params + wte_n;
        P->dwte = P->grads;
        P->dwpe = P->grads + wte_n;
        i++;
    }
    for (int c = 0; c < v; c++, i++) P->chunk_off[c] = P->piece[i].local;
    if (P->s == P->npp - 1) {
        P->lnfw = P->params + P->piece[i].local;
        P->lnfb = P->lnfw + cfg->channels;
        P->dlnfw = P->grads + P->piece[i].local;
        P->dlnfb = P->dlnfw + cfg->channels;
        i++;
        P->head_wte = P->s == 0 ? P->wte : P->params + P->piece[i].local;
        P->dhead_wte = P->s == 0 ? P->dwte : P->grads + P->piece[i].local;
    }
    // the parameters: counter-based init (or the checkpoint) of each piece
    // alone, so this rank never builds the whole model
    size_t most = 0;
    for (int k = 0; k < P->n_pieces; k++) most = P->piece[k].count > most ? P->piece[k].count : most;
    float* host = xmalloc(most * sizeof(float));
    for (int k = 0; k < P->n_pieces; k++) {
        Piece* pc = &P->piece[k];
        if (setup->checkpoint) {
            bad = checkpoint_read_range(setup->checkpoint, cfg, host, pc->global, pc->count, msg, sizeof(msg));
            fail_if_any(bad != NULL, bad);
        } else {
            gpt_init_range(host, pc->global, pc->count, cfg, (uint64_t)run->args.seed);
        }
        mem_to_device(P->params + pc->local, host, pc->count * sizeof(float));
    }
    free(host);
    P->scratch = mem_alloc_floats(block_scratch_numel(P->b, P->T, cfg->channels, cfg->num_heads), MEM_ACTIVATIONS);
    P->recompute = (RecomputeMode)run->args.recompute;
    if (P->recompute != RECOMPUTE_NONE)
        P->transient = mem_alloc_floats(block_transient_numel(P->b, P->T, cfg->channels, cfg->num_heads, P->recompute),
                                        MEM_ACTIVATIONS);
    P->max_sends = 2 * m * v + 1;
    P->sends = xcalloc((size_t)P->max_sends, sizeof(SendBuf));
    incoming_build(P);
    size_t BT = (size_t)P->b * P->T;
    P->in_host = xmalloc(BT * sizeof(int));
    P->tg_host = xmalloc(BT * sizeof(int));
    P->loss_host = xmalloc(BT * sizeof(float));
}

static void pipe_free(Pipe* P) {
    for (int c = 0; c < P->v; c++) {
        for (int i = 0; i < P->pool[c].n; i++) {
            mem_free(P->pool[c].s[i]->x);
            free(P->pool[c].s[i]);
        }
        free(P->pool[c].s);
    }
    for (int i = 0; i < P->n_sends; i++) mem_free(P->sends[i].buf);
    free(P->sends);
    for (int i = 0; i < P->n_in; i++) free(P->in[i].msg);
    mem_free(P->params);
    mem_free(P->grads);
    mem_free(P->mom);
    mem_free(P->vel);
    mem_free(P->scratch);
    mem_free(P->transient);
    free(P->in_host);
    free(P->tg_host);
    free(P->loss_host);
    schedule_free(&P->sched);
}

// The whole model on world rank 0 (host, flat layout) for --sample and
// --save: the dp-0 replica of every stage sends its pieces (the tied copy
// left out). A check-and-output step, not the strategy: plain MPI on host
// copies, not counted.
static float* gather_params(Pipe* P) {
    const GPTConfig* cfg = P->cfg;
    float* full = NULL;
    if (P->dp->rank != 0) return NULL;
    if (P->s == 0) full = xmalloc(gpt_num_params(cfg) * sizeof(float));
    for (int r = 0; r < P->npp; r++) {
        Piece pieces[MAX_PIECES];
        int n = rank_pieces(cfg, P->npp, P->v, r, pieces);
        for (int k = 0; k < n; k++) {
            if (pieces[k].tied_copy) continue;
            for (size_t off = 0; off < pieces[k].count; off += (size_t)1 << 28) {
                size_t cnt = pieces[k].count - off < ((size_t)1 << 28) ? pieces[k].count - off : (size_t)1 << 28;
                if (r == 0 && P->s == 0) {
                    mem_to_host(full + pieces[k].global + off, P->params + pieces[k].local + off, cnt * sizeof(float));
                } else if (P->s == 0) {
                    MPI_CHECK(MPI_Recv(full + pieces[k].global + off, (int)cnt, MPI_FLOAT, r, 0, P->pp->mpi,
                                       MPI_STATUS_IGNORE));
                } else if (P->s == r) {
                    float* h = xmalloc(cnt * sizeof(float));
                    mem_to_host(h, P->params + pieces[k].local + off, cnt * sizeof(float));
                    MPI_CHECK(MPI_Send(h, (int)cnt, MPI_FLOAT, 0, 0, P->pp->mpi));
                    free(h);
                }
            }
        }
    }
    return full;
}

// ---------------------------------------------------------------- checkpoints
// What this rank writes and reads of the training state (ckpt.h): its
// pieces are ranges of the flat layout, so ckpt_add_state cuts each into the
// llm.c tensors it overlaps. The dp replicas of a stage are identical, so
// dp rank 0 of each stage writes its pieces, and wte once: the first stage's
// (the last stage's copy is the same parameters and, taking the same summed
// gradient through the same AdamW step, the same moments). Every rank reads
// all of its pieces, the copy too, whatever chapter and mesh saved them.
static void pipe_ckpt(Ckpt* ck, const Pipe* P) {
    for (int i = 0; i < P->n_pieces; i++) {
        const Piece* pc = &P->piece[i];
        float *p = P->params + pc->local, *m = P->mom + pc->local, *v = P->vel + pc->local;
        if (P->dp->rank == 0 && !pc->tied_copy) ckpt_add_state(&ck->own, P->cfg, pc->global, pc->count, p, m, v);
        ckpt_add_state(&ck->need, P->cfg, pc->global, pc->count, p, m, v);
    }
}

// ---------------------------------------------------------------- timelines in the log
// Rank 0 gathers every rank's action times of the step. The bubble of the
// step: 1 - (time spent in actions, summed over ranks) / (ranks x the span
// from the first action's start to the last one's end on any rank).
static double timeline_step(const Pipe* P, const Timeline* tl, JsonLog* log, int step, int write) {
    int world = 0, me = 0;
    MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &world));
    MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &me));
    int n2 = 2 * tl->n, *counts = NULL, *displs = NULL;
    double* all = NULL;
    if (me == 0) counts = xmalloc((size_t)world * sizeof(int)), displs = xmalloc((size_t)world * sizeof(int));
    MPI_CHECK(MPI_Gather(&n2, 1, MPI_INT, counts, 1, MPI_INT, 0, MPI_COMM_WORLD));
    int total = 0;
    if (me == 0) {
        for (int r = 0; r < world; r++) displs[r] = total, total += counts[r];
        all = xmalloc((size_t)total * sizeof(double));
    }
    MPI_CHECK(MPI_Gatherv(tl->t, n2, MPI_DOUBLE, all, counts, displs, MPI_DOUBLE, 0, MPI_COMM_WORLD));
    double bubble = 0.0;
    if (me == 0) {
        double t_min = 1e300, t_max = -1e300, busy = 0.0;
        for (int i = 0; i < total; i += 2) {
            t_min = all[i] < t_min ? all[i] : t_min;
            t_max = all[i + 1] > t_max ? all[i + 1] : t_max;
            busy += all[i + 1] - all[i];
        }
        bubble = t_max > t_min ? 1.0 - busy / (world * (t_max - t_min)) : 0.0;
        if (write && log->f) {
            // ranks of the mesh: dp varies fastest, then pp (mesh.h)
            for (int r = 0; r < world; r++) {
                int stage = r / P->dp->size, n = counts[r] / 2;
                fprintf(log->f, "{\"type\":\"timeline\",\"step\":%d,\"rank\":%d,\"stage\":%d,\"dp\":%d,\"schedule\":\"%s\",\"actions\":[",
                        step, r, stage, r % P->dp->size, schedule_name(P->sched.kind));
                for (int i = 0; i < n; i++) {
                    Action a = P->sched.list[stage][i];
                    fprintf(log->f, "%s[\"%c\",%d,%d,%.6f,%.6f]", i ? "," : "", "FBW"[a.type], a.mb, a.chunk,
                            all[displs[r] + 2 * i] - t_min, all[displs[r] + 2 * i + 1] - t_min);
                }
                if (fprintf(log->f, "]}\n") < 0 || fflush(log->f) != 0)
                    FATAL("writing the log file '%s' failed: %s", log->path, strerror(errno));
            }
        }
        free(all);
        free(counts);
        free(displs);
    }
    return bubble;
}

// ---------------------------------------------------------------- main

int main(int argc, char** argv) {
    const char* sched_name = "1f1b";
    const char* sched_file = NULL;
    int m = 0, v = 1, show = 0;
    ArgSpec extra[] = {
        {"schedule", ARG_STRING, &sched_name, "gpipe | 1f1b | interleaved | zb  [1f1b]"},
        {"microbatches", ARG_INT, &m, "microbatches per step of each dp rank's share  [pp]"},
        {"virtual", ARG_INT, &v, "chunks (virtual stages) per rank, interleaved only  [1]"},
        {"schedule-file", ARG_STRING, &sched_file,
         "FILE: every rank's actions from a text file, a schedule of your own (05_pipeline/schedule.h); instead of --schedule"},
        {"show-schedule", ARG_FLAG, &show, "print every rank's actions as an ASCII timeline before training"},
    };
    Run run;
    if (!run_start(&run, argc, argv, "build/chapter-5",
                   "Chapter 5: pipeline parallelism: stages, microbatches, GPipe, 1F1B, interleaved and zero-bubble schedules.",
                   extra, sizeof(extra) / sizeof(extra[0]), (1u << AXIS_DP) | (1u << AXIS_PP)))
        return 0;
    const TrainArgs* args = &run.args;
    const TrainSetup* setup = &run.setup;
    const GPTConfig* cfg = &setup->cfg;
    int kind = schedule_parse(sched_name);
    if (kind < 0) fail_all("--schedule %s is not one of gpipe, 1f1b, interleaved, zb", sched_name);
    int pp = run.mesh.size[AXIS_PP], ndp = run.mesh.size[AXIS_DP], L = cfg->num_layers;
    // a schedule of one's own: m and v are the file's
    Schedule from_file;
    if (sched_file) {
        char why[512];
        const char* bad = schedule_read(&from_file, sched_file, pp, why, sizeof(why));
        if (bad) fail_all("%s", bad);
        if ((m && m != from_file.m) || (v != 1 && v != from_file.v))
            fail_all("--schedule-file %s runs %d microbatch%s of %d chunk%s: drop --microbatches and --virtual", sched_file,
                     from_file.m, from_file.m == 1 ? "" : "es", from_file.v, from_file.v == 1 ? "" : "s");
        kind = SCHED_FILE, sched_name = schedule_name(SCHED_FILE), m = from_file.m, v = from_file.v;
    }
    if (m == 0) m = pp;
    if (m < 1) fail_all("--microbatches must be >= 1");
    if (v < 1) fail_all("--virtual must be >= 1");
    if (v > 1 && kind != SCHED_INTERLEAVED && kind != SCHED_FILE) fail_all("--virtual %d needs --schedule interleaved", v);
    if (v > 1 && pp == 1) fail_all("--virtual %d interleaves chunks over pp ranks: use --pp 2 or more", v);
    if (pp * v > 64) fail_all("pp x virtual = %d: at most 64 virtual stages", pp * v);
    // the layers over the stages: every stage needs one; chunks must be equal
    if (pp * v > L)
        fail_all("the model's %d layers cannot fill pp=%d x %d chunk%s = %d stages (a stage without layers): use pp x virtual <= %d",
                 L, pp, v, v == 1 ? "" : "s", pp * v, L);
    if (v > 1 && L % (pp * v) != 0)
        fail_all("--virtual %d: the model's %d layers do not cut into pp=%d x %d equal chunks: use pp x virtual dividing %d",
                 v, L, pp, v, L);
    // the batch over dp x microbatches (train_check_mesh); the layers over pp
    // are this chapter's own rule (uneven splits allowed), so the shared
    // check sees pp = 1
    Mesh flat = run.mesh;
    flat.size[AXIS_PP] = 1;
    MeshNeeds needs = {.microbatches = m};
    train_check_mesh(&flat, setup, &needs);

    Pipe P;
    pipe_create(&P, &run, (ScheduleKind)kind, m, v, sched_file ? &from_file : NULL);
    int B = setup->B, T = setup->T;
    print0("chapter 5: pipeline, pp=%d dp=%d, schedule %s, %d microbatch%s of %d sequence%s per dp rank, device %s\n",
           pp, ndp, sched_name, m, m == 1 ? "" : "es", P.b, P.b == 1 ? "" : "s", run.device);
    if (sched_file) print0("schedule from %s\n", sched_file);
    if (v > 1) print0("%d chunks per rank, %d virtual stages\n", v, pp * v);
    if (P.recompute != RECOMPUTE_NONE)
        print0("recompute %s: a slot keeps %zu of %zu floats a token of each layer, the rest recomputed in backward\n",
               recompute_name(P.recompute), block_store_numel(1, 1, cfg->channels, cfg->num_heads, P.recompute),
               block_acts_numel(1, 1, cfg->channels, cfg->num_heads));
    print0("model %s: %zu parameters, %d layers, global batch %d x %d\n", setup->model_name, gpt_num_params(cfg), L, B, T);
    for (int r = 0; r < pp; r++) {
        char line[512];
        int n = snprintf(line, sizeof(line), "stage %d: layers", r);
        for (int c = 0; c < v; c++) {
            LayerRange lr = stage_layers(L, pp * v, c * pp + r);
            n += snprintf(line + n, sizeof(line) - (size_t)n, "%s %d-%d", c ? "," : "", lr.first, lr.first + lr.count - 1);
        }
        print0("%s%s%s\n", line, r == 0 ? " + embedding" : "", r == pp - 1 ? " + final LayerNorm and head (tied wte copy)" : "");
    }
    if (L % (pp * v) != 0) print0("uneven split: %d layers over %d stages, the first %d hold one more\n", L, pp * v, L % (pp * v));
    if (m < pp) print0("note: %d microbatch%s for %d stages: some stages always idle (bubble %.2f)\n", m, m == 1 ? "" : "es", pp,
                       schedule_bubble_formula(kind, pp, m, v));
    ScheduleSim sim;
    char msg[1024];
    schedule_validate(&P.sched, &sim, msg, sizeof(msg));
    if (show && world_rank() == 0) schedule_print(&P.sched);

    JsonLog log;
    const char* bad = jsonl_open(&log, args->log, msg, sizeof(msg));
    fail_if_any(bad != NULL, bad);
    Trainer tr = {.P = &P, .args = args};
    embedding_group(&tr.embed, &run.mesh);
    Timeline tl = {.t = xcalloc((size_t)2 * P.sched.n[P.s] + 2, sizeof(double)), .n = P.sched.n[P.s]};
    StepClock clock = {0};
    float loss = 0.0f, vl = -1.0f;
    double bubble_sum = 0.0;
    int bubble_n = 0;
    // training-state checkpoints: --ckpt-dir, --save-every, --resume
    Ckpt ck;
    ckpt_init(&ck, args, setup, &run.mesh, 5);
    pipe_ckpt(&ck, &P);
    int start = ckpt_resume(&ck);  // --resume: this rank's pieces, from whatever mesh saved them
    comm_counts_reset();
    MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));  // the timelines start together
    for (int step = start; step < args->steps; step++) {
        clock_begin(&clock);
        float norm;
        loss = train_step(&tr, step, &tl, &norm);
        double dt = clock_end(&clock, step - start, args->steps - start);
        double bubble = timeline_step(&P, &tl, &log, step, 1);
        if (step > start || args->steps - start == 1) bubble_sum += bubble, bubble_n++;
        report_step(&log, step, args->steps, loss, norm, 1e3 * dt, (double)B * T / dt);
        ckpt_after_step(&ck, step);  // --save-every, --ckpt-dir
        if (args->val_every > 0 && (step + 1) % args->val_every == 0 && step + 1 < args->steps) {
            vl = val_loss(&P, args->val_batches);
            if (vl >= 0) report_val(&log, step, vl);
        }
    }
    vl = val_loss(&P, args->val_batches);
    if (vl >= 0) report_val(&log, args->steps - 1, vl);

    // every rank's figures for the summary: layers, peak slots, early receives
    int world = run.mesh.world_size;
    int mine[3] = {0, P.peak_slots, P.early}, *all = xmalloc((size_t)world * 3 * sizeof(int));
    for (int c = 0; c < v; c++) mine[0] += P.layers[c].count;
    MPI_CHECK(MPI_Gather(mine, 3, MPI_INT, all, 3, MPI_INT, 0, MPI_COMM_WORLD));
    double ms = clock_ms_per_step(&clock), bubble = bubble_n ? bubble_sum / bubble_n : 0.0;
    double formula = schedule_bubble_formula(kind, pp, m, v);
    print0("bubble: measured %.3f of the ranks' time idle in the schedule, simulated %.3f, formula %.3f\n", bubble,
           sim.bubble, formula);
    char extra_json[2048];
    int n = snprintf(extra_json, sizeof(extra_json),
                     "\"schedule\":\"%s\",\"microbatches\":%d,\"virtual\":%d,\"bubble_measured\":%.4f,\"bubble_simulated\":%.4f,"
                     "\"bubble_formula\":%.4f,\"layers\":[", sched_name, m, v, bubble, sim.bubble, formula);
    for (int r = 0; r < world && n < (int)sizeof(extra_json) - 64; r++) n += snprintf(extra_json + n, sizeof(extra_json) - (size_t)n, "%s%d", r ? "," : "", all[3 * r]);
    n += snprintf(extra_json + n, sizeof(extra_json) - (size_t)n, "],\"activation_slots\":[");
    for (int r = 0; r < world && n < (int)sizeof(extra_json) - 64; r++) n += snprintf(extra_json + n, sizeof(extra_json) - (size_t)n, "%s%d", r ? "," : "", all[3 * r + 1]);
    n += snprintf(extra_json + n, sizeof(extra_json) - (size_t)n, "],\"early_receives\":[");
    for (int r = 0; r < world && n < (int)sizeof(extra_json) - 8; r++) n += snprintf(extra_json + n, sizeof(extra_json) - (size_t)n, "%s%d", r ? "," : "", all[3 * r + 2]);
    snprintf(extra_json + n, sizeof(extra_json) - (size_t)n, "]");
    free(all);
    RunSummary summary = {
        .chapter = 5, .model = setup->model_name, .num_params = gpt_num_params(cfg), .batch = B, .seq = T,
        .steps = args->steps, .ms_per_step = ms, .tokens_per_s = ms > 0 ? (double)B * T / (ms / 1e3) : 0.0,
        .flops_per_token = gpt_flops_per_token(cfg, T), .peak_gflops = run.peak_gflops,
        .final_loss = loss, .val_loss = vl, .extra_json = extra_json};
    ckpt_finish(&ck, &log);  // an async save still in flight is joined here
    report_summary(&log, &run.mesh, &summary);
    jsonl_close(&log);
    if (train_wants_params(args)) {
        float* host = gather_params(&P);
        train_finish_params(args, cfg, T, host);
        free(host);
    }
    free(tl.t);
    if (tr.embed.size > 0) comm_destroy_group(&tr.embed);
    pipe_free(&P);
    run_finish(&run);
    return 0;
}
