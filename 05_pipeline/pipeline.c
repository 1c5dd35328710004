// pipeline.c: chapter 5's engine (pipeline.h): the layer split, what a rank
// owns, its activation slots, set-up, and what runs around the step.
#include "pipeline.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device.h"
#include "errors.h"
#include "init.h"
#include "model_file.h"
#include "exercise.h"  // exercise_not_done, in a homework tree
#include "rank.h"
#include "memory.h"
#include "device_clock.h"
#include "mesh.h"
#include "trace.h"
#include "run.h"
#include "train_eval.h"
#include "train_step.h"
#include "report.h"
#include "sharding.h"

// ---------------------------------------------------------------- what a rank owns

LayerRange stage_layers(int L, int S, int k) {
    // EXERCISE 1: the layer split: the first layer and the layer count of virtual stage k of S, L / S each and the first L % S one more
    int base = L / S, extra = L % S;
    LayerRange r = {k * base + (k < extra ? k : extra), base + (k < extra ? 1 : 0)};
    return r;
    // END EXERCISE 1
}

int rank_pieces(const GPTConfig* cfg, int n_stages, int n_virtual, int r, Piece* p) {
    int n = 0, S = n_stages * n_virtual;
    size_t local = 0, C = (size_t)cfg->channels, wte = param_tensor_numel(cfg, P_WTE);
#define ADD(g, c, t) (p[n] = (Piece){(g), (c), local, (t)}, local += (c), n++)
    if (r == 0) ADD(0, wte + param_tensor_numel(cfg, P_WPE), 0);
    for (int c = 0; c < n_virtual; c++) {
        LayerRange lr = stage_layers(cfg->num_layers, S, c * n_stages + r);
        ADD(gpt_block_offset(cfg, lr.first), (size_t)lr.count * gpt_block_numel(cfg->channels), 0);
    }
    if (r == n_stages - 1) ADD(gpt_tensor_offset(cfg, P_LNFW, 0), 2 * C, 0);
    if (r == n_stages - 1 && r != 0) ADD(0, wte, 1);
#undef ADD
    return n;
}

BlockParams pipe_block_params(const Pipeline* P, int c, int j) {
    return block_params_at(P->params + P->chunk_off[c] + (size_t)j * gpt_block_numel(P->cfg->channels),
                           P->cfg->channels);
}

BlockParams pipe_block_grads(const Pipeline* P, int c, int j) {
    return block_params_at(P->grads + P->chunk_off[c] + (size_t)j * gpt_block_numel(P->cfg->channels),
                           P->cfg->channels);
}

// ---------------------------------------------------------------- slots

// Floats (and ints, n_ints) of one slot of chunk c.
static size_t slot_floats(const Pipeline* P, int c, int* n_ints) {
    const GPTConfig* g = P->cfg;
    int C = g->channels, NH = g->num_heads, n = P->layers[c].count, k = pipe_vstage(P, c), b = P->micro_batch;
    int last = k == P->n_vstages - 1;
    size_t BT = (size_t)b * P->seq, f = 2 * BT * C + (size_t)n * block_store_numel(b, P->seq, C, NH, P->recompute);
    if (last) f += head_acts_numel(b, P->seq, C, g->padded_vocab_size);
    if (P->sched.split_backward) f += (size_t)n * block_stash_numel(b, P->seq, C) + (last ? BT * C : 0);
    *n_ints = (k == 0 ? (int)BT : 0) + (last ? (int)BT : 0);
    return f;
}

void slot_pool_create(SlotPool* p, int max) {
    *p = (SlotPool){.s = xcalloc((size_t)max, sizeof(void*)), .mb = xcalloc((size_t)max, sizeof(int)),
                    .busy = xcalloc((size_t)max, sizeof(int)), .max = max};
}

void slot_pool_free(SlotPool* p) {
    free(p->s), free(p->mb), free(p->busy);
}

void* slot_pool_take(SlotPool* p, int mb) {
    int free_one = -1;
    for (int i = 0; i < p->n; i++) {
        if (p->busy[i] && p->mb[i] == mb) return p->s[i];
        if (!p->busy[i] && free_one < 0) free_one = i;
    }
    if (free_one < 0) return NULL;
    p->busy[free_one] = 1, p->mb[free_one] = mb;
    return p->s[free_one];
}

void slot_pool_add(SlotPool* p, void* slot, int mb) {
    if (p->n == p->max) FATAL("more microbatches in flight than the step has");
    p->s[p->n] = slot, p->busy[p->n] = 1, p->mb[p->n] = mb;
    p->n++;
}

void* slot_pool_find(const SlotPool* p, int mb) {
    for (int i = 0; i < p->n; i++)
        if (p->busy[i] && p->mb[i] == mb) return p->s[i];
    FATAL("no activations kept for microbatch %d (a backward before its forward?)", mb);
}

void slot_pool_give(SlotPool* p, int mb) {
    for (int i = 0; i < p->n; i++)
        if (p->busy[i] && p->mb[i] == mb) p->busy[i] = 0;
}

Slot* slot_get(Pipeline* P, int c, int mb) {
    Slot* sl = slot_pool_take(&P->pool[c], mb);
    if (sl) return sl;
    sl = xcalloc(1, sizeof(Slot));
    const GPTConfig* g = P->cfg;
    int C = g->channels, NH = g->num_heads, n = P->layers[c].count, k = pipe_vstage(P, c), ints;
    int b = P->micro_batch, T = P->seq, last = k == P->n_vstages - 1;
    size_t BT = (size_t)b * T, total = slot_floats(P, c, &ints);
    // ints are 4 bytes like floats: one allocation per slot
    float* base = mem_alloc_floats(total + (size_t)ints, MEM_ACTIVATIONS);
    sl->x = base;                 base += BT * C;
    sl->dres = base;              base += BT * C;
    sl->acts = base;              base += (size_t)n * block_store_numel(b, T, C, NH, P->recompute);
    if (last) {
        sl->head = base;          base += head_acts_numel(b, T, C, g->padded_vocab_size);
    }
    if (P->sched.split_backward) {
        sl->stash = base;         base += (size_t)n * block_stash_numel(b, T, C);
        if (last) {
            sl->dlnf = base;      base += BT * C;
        }
    }
    int* ib = (int*)base;
    if (k == 0) sl->inputs = ib, ib += BT;
    if (last) sl->targets = ib;
    slot_pool_add(&P->pool[c], sl, mb);
    int in_use = 0;
    for (int cc = 0; cc < P->n_virtual; cc++) in_use += P->pool[cc].n;
    if (in_use > P->peak_slots) P->peak_slots = in_use;
    return sl;
}

Slot* slot_find(Pipeline* P, int c, int mb) { return slot_pool_find(&P->pool[c], mb); }

static float* slot_store(const Pipeline* P, const Slot* sl, int j) {
    return sl->acts +
           (size_t)j * block_store_numel(P->micro_batch, P->seq, P->cfg->channels, P->cfg->num_heads, P->recompute);
}

BlockActs slot_block(const Pipeline* P, const Slot* sl, int j) {
    return block_acts_kept(slot_store(P, sl, j), P->transient, P->micro_batch, P->seq, P->cfg->channels,
                           P->cfg->num_heads, P->recompute);
}

BlockStash slot_stash(const Pipeline* P, const Slot* sl, int j) {
    return block_stash_at(sl->stash + (size_t)j * block_stash_numel(P->micro_batch, P->seq, P->cfg->channels),
                          P->micro_batch, P->seq, P->cfg->channels);
}

const float* layer_input(const Pipeline* P, const Slot* sl, int j) {
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
BlockActs slot_recompute(const Pipeline* P, const Slot* sl, int j, int layer, const BlockParams* p,
                         int weights_only) {
    const GPTConfig* g = P->cfg;
    int b = P->micro_batch, T = P->seq;
    double t0 = trace_start();
    BlockActs a = weights_only
                      ? block_acts_recompute_weights(p, slot_store(P, sl, j), P->transient, layer_input(P, sl, j), b,
                                                     T, g->channels, g->num_heads, P->recompute)
                      : block_acts_recompute(p, slot_store(P, sl, j), P->transient, layer_input(P, sl, j), b, T,
                                             g->channels, g->num_heads, P->recompute);
    if (P->recompute != RECOMPUTE_NONE) trace_compute(t0, "block %d recompute", layer);
    return a;
}

HeadActs slot_head(const Pipeline* P, const Slot* sl) {
    return head_acts_at(sl->head, P->micro_batch, P->seq, P->cfg->channels, P->cfg->padded_vocab_size);
}

// Each microbatch has its own part of the staging buffers, so no copy still
// queued reads a part the host is filling: the host writes a part once per
// step, and the step ends with a wait for the device (the norm's read).
void slot_load_tokens(Pipeline* P, Slot* sl, long step, int mb) {
    int per = P->setup->B / P->dp->size, b0 = P->dp->rank * per + mb * P->micro_batch;
    size_t BT = (size_t)P->micro_batch * P->seq;
    int *in = P->in_host + (size_t)mb * BT, *tg = P->tg_host + (size_t)mb * BT;
    data_batch(&P->setup->train, step, P->setup->B, P->seq, b0, P->micro_batch, in, tg);
    if (sl->inputs) mem_to_device_queued(sl->inputs, in, BT * sizeof(int));
    if (sl->targets) mem_to_device_queued(sl->targets, tg, BT * sizeof(int));
}

static double mean_of(const float* losses, size_t BT) {
    double sum = 0.0;
    for (size_t i = 0; i < BT; i++) sum += losses[i];
    return sum / (double)BT;
}

double slot_mean_loss(Pipeline* P, const Slot* sl) {
    size_t BT = (size_t)P->micro_batch * P->seq;
    mem_to_host(P->loss_host, slot_head(P, sl).losses, BT * sizeof(float));
    return mean_of(P->loss_host, BT);
}

void slot_queue_losses(Pipeline* P, const Slot* sl, int mb) {
    size_t BT = (size_t)P->micro_batch * P->seq;
    mem_to_host_queued(P->loss_host + (size_t)mb * BT, slot_head(P, sl).losses, BT * sizeof(float));
    P->loss_order[P->n_losses++] = mb;
}

double pipe_step_loss_sum(Pipeline* P) {
    size_t BT = (size_t)P->micro_batch * P->seq;
    device_synchronize();  // the queued copies have run
    double sum = 0.0;
    for (int i = 0; i < P->n_losses; i++) sum += mean_of(P->loss_host + (size_t)P->loss_order[i] * BT, BT);
    return sum;
}

void send_pool_create(SendPool* s, int max, size_t count) {
    *s = (SendPool){.b = xcalloc((size_t)max, sizeof(SendBuf)), .max = max, .count = count};
}

void send_pool_free(SendPool* s) {
    for (int i = 0; i < s->n; i++) mem_free(s->b[i].buf);
    free(s->b);
}

SendBuf* send_pool_take(SendPool* s, const float* src) {
    SendBuf* sb = NULL;
    for (int i = 0; i < s->n && !sb; i++)
        if (comm_test(&s->b[i].req)) sb = &s->b[i];
    if (!sb) {
        if (s->n == s->max) FATAL("more sends in flight than the schedule has");
        sb = &s->b[s->n++];
        sb->buf = mem_alloc_floats(s->count, MEM_COMM);
    }
    ops_copy(sb->buf, src, s->count);
    return sb;
}

// ---------------------------------------------------------------- point to point
// The executor's receive: 05_pipeline/main.c says why no list the validator
// accepts can deadlock and why a rank takes its peer's messages in the order
// they were sent; the capstone's pipeline (capstone/main.c) receives
// through the same two functions into its own slots.

int pipe_incoming_build(const Schedule* s, int stage, Incoming in[2]) {
    int pp = s->pp, S = pp * s->v;
    if (pp == 1) return 0;
    int peers[2] = {(stage + pp - 1) % pp, (stage + 1) % pp};
    int n_in = peers[0] == peers[1] ? 1 : 2;
    for (int i = 0; i < n_in; i++) {
        int p = peers[i];
        in[i] = (Incoming){.peer = p, .msg = xcalloc((size_t)s->n[p] + 1, sizeof(Message))};
        for (int a = 0; a < s->n[p]; a++) {
            Action act = s->list[p][a];
            int k = act.chunk * pp + p;  // the sender's virtual stage
            if (act.type == ACT_F && k < S - 1 && (k + 1) % pp == stage)
                in[i].msg[in[i].n++] = (Message){0, act.mb, (k + 1) / pp};
            if (act.type == ACT_B && k > 0 && (k - 1) % pp == stage)
                in[i].msg[in[i].n++] = (Message){1, act.mb, (k - 1) / pp};
        }
    }
    return n_in;
}

void pipe_incoming_free(Incoming in[2], int n) {
    for (int i = 0; i < n; i++) free(in[i].msg);
}

int pipe_receive(PipeLink* l, int grad, int mb, int c, PipeSlotBuffer slot_buffer, void* ctx) {
    // EXERCISE 3: receive the input of an action from its peer: the messages that peer sent before it first, each into its own slot; one that came early is already there
    int stage = l->pp->rank, n = l->pp->size, peer = grad ? (stage + 1) % n : (stage + n - 1) % n;
    Incoming* in = l->in[0].peer == peer ? &l->in[0] : &l->in[1];
    // already here: it came early, before the one another action waited for
    for (int i = 0; i < in->next; i++)
        if (in->msg[i].grad == grad && in->msg[i].mb == mb && in->msg[i].chunk == c) return 0;
    while (in->next < in->n) {
        Message msg = in->msg[in->next++];
        comm_recv(l->pp, slot_buffer(ctx, msg.grad, msg.mb, msg.chunk), l->sends.count, peer);
        if (msg.grad == grad && msg.mb == mb && msg.chunk == c) return 1;  // the one the action waits for
        l->early++;  // another action's input, kept in its slot until that action runs
    }
    FATAL("stage %d: rank %d never sends the %s of microbatch %d", stage, peer, grad ? "gradient" : "activation", mb);
    // END EXERCISE 3
}

void pipe_link_create(PipeLink* l, const Schedule* s, const Comm* pp, size_t count) {
    memset(l, 0, sizeof(*l));
    l->pp = pp;
    l->n_in = pipe_incoming_build(s, pp->rank, l->in);
    send_pool_create(&l->sends, s->n[pp->rank] + s->v + 1, count);  // a send per action at most, and validation's
}

void pipe_link_free(PipeLink* l) {
    send_pool_free(&l->sends);
    pipe_incoming_free(l->in, l->n_in);
}

void pipe_link_begin(PipeLink* l) {
    for (int i = 0; i < l->n_in; i++) l->in[i].next = 0;
}

void pipe_send(PipeLink* l, const float* src, int peer) {
    SendBuf* sb = send_pool_take(&l->sends, src);
    comm_isend(l->pp, sb->buf, l->sends.count, peer, &sb->req);
}

void pipe_sends_wait(PipeLink* l) {
    for (int i = 0; i < l->sends.n; i++) comm_wait(&l->sends.b[i].req);
}

// ---------------------------------------------------------------- the tied embedding
// (05_pipeline/main.c's sum_tied_embedding says why the two ends sum.)

void pipe_sum_tied_embedding(const Comm* embed, const Comm* pp, float* mine, size_t n) {
    // EXERCISE 4: the tied embedding: the first and the last stage sum their two wte gradients in their group of two
    if (pp->size == 1 || (pp->rank != 0 && pp->rank != pp->size - 1)) return;
    comm_allreduce(embed, mine, n, COMM_SUM);
    // END EXERCISE 4
}

// ---------------------------------------------------------------- set-up

// One group per pipeline (here one per dp rank; in the capstone one per
// coordinate of dp, tp, cp and ep): every rank of stage 0, in world order,
// names its pipeline's two ends. Every rank takes part in making every group
// and keeps its own.
void pipe_embedding_group(Comm* embed, const Mesh* mesh) {
    memset(embed, 0, sizeof(*embed));
    int pp = mesh->size[AXIS_PP];
    if (pp == 1) return;
    for (int r = 0; r < mesh->world_size; r++) {
        int coord[NUM_AXES], ends[2];
        mesh_coord_of(mesh, r, coord);
        if (coord[AXIS_PP] != 0) continue;
        ends[0] = r;
        coord[AXIS_PP] = pp - 1;
        ends[1] = mesh_rank_at(mesh, coord);
        Comm g;
        comm_create_group_ranks(&g, ends, 2, "embedding");
        if (g.size > 0) *embed = g;
    }
}

void pipe_schedule_make(Schedule* s, ScheduleKind kind, int pp, int m, int v, Schedule* given) {
    char msg[512];
    const char* bad = NULL;
    if (given) *s = *given;
    else bad = schedule_build(s, kind, pp, m, v, msg, sizeof(msg));
    if (bad) fail_all("%s", bad);
    // every rank checks every rank's list: a list that could deadlock never runs
    bad = schedule_validate(s, NULL, msg, sizeof(msg));
    if (bad) fail_all("schedule %s is not valid: %s", schedule_name(kind), bad);
}

// The parameters: counter-based init (or the checkpoint) of each piece
// alone, so this rank never builds the whole model. Stages hold different
// numbers of pieces, so a failed read is remembered and every rank learns of
// it once, after the loop (a collective inside it would wait forever on the
// ranks that hold fewer pieces).
static void load_pieces(Pipeline* P, uint64_t seed) {
    const TrainSetup* setup = P->setup;
    char msg[ERROR_MAX];  // may name --model's path
    const char* bad = NULL;
    size_t most = 0;
    for (int k = 0; k < P->n_pieces; k++) most = P->piece[k].count > most ? P->piece[k].count : most;
    float* host = xmalloc(most * sizeof(float));
    for (int k = 0; k < P->n_pieces && !bad; k++) {
        Piece* pc = &P->piece[k];
        if (setup->checkpoint)
            bad = checkpoint_read_range(setup->checkpoint, P->cfg, host, pc->global, pc->count, msg, sizeof(msg));
        else
            gpt_init_range(host, pc->global, pc->count, P->cfg, seed);
        if (!bad) mem_to_device(P->params + pc->local, host, pc->count * sizeof(float));
    }
    free(host);
    fail_if_any(bad != NULL, bad);
}

void pipe_create(Pipeline* P, const Run* run, ScheduleKind kind, int n_micro, int n_virtual, Schedule* given) {
    memset(P, 0, sizeof(*P));
    const TrainSetup* setup = &run->setup;
    const GPTConfig* cfg = &setup->cfg;
    P->cfg = cfg;
    P->setup = setup;
    P->pp = &run->axes[AXIS_PP];
    P->dp = &run->axes[AXIS_DP];
    P->n_stages = P->pp->size;
    P->stage = P->pp->rank;
    P->n_virtual = n_virtual;
    P->n_vstages = P->n_stages * n_virtual;
    P->n_micro = n_micro;
    P->seq = setup->T;
    P->micro_batch = setup->B / P->dp->size / n_micro;
    pipe_schedule_make(&P->sched, kind, P->n_stages, n_micro, n_virtual, given);
    for (int c = 0; c < n_virtual; c++) P->layers[c] = stage_layers(cfg->num_layers, P->n_vstages, pipe_vstage(P, c));
    P->n_pieces = rank_pieces(cfg, P->n_stages, n_virtual, P->stage, P->piece);
    P->n_local = P->piece[P->n_pieces - 1].local + P->piece[P->n_pieces - 1].count;
    P->params = mem_alloc_floats(P->n_local, MEM_PARAMS);
    P->grads = mem_alloc_floats(P->n_local, MEM_GRADS);
    P->mom = mem_alloc_floats(P->n_local, MEM_OPTIMIZER);
    P->vel = mem_alloc_floats(P->n_local, MEM_OPTIMIZER);
    // where things sit in the local buffers
    int i = 0;
    size_t wte_n = param_tensor_numel(cfg, P_WTE);
    if (P->stage == 0) {
        P->wte = P->params;
        P->wpe = P->params + wte_n;
        P->dwte = P->grads;
        P->dwpe = P->grads + wte_n;
        i++;
    }
    for (int c = 0; c < n_virtual; c++, i++) P->chunk_off[c] = P->piece[i].local;
    if (P->stage == P->n_stages - 1) {
        P->lnfw = P->params + P->piece[i].local;
        P->lnfb = P->lnfw + cfg->channels;
        P->dlnfw = P->grads + P->piece[i].local;
        P->dlnfb = P->dlnfw + cfg->channels;
        i++;
        P->head_wte = P->stage == 0 ? P->wte : P->params + P->piece[i].local;
        P->dhead_wte = P->stage == 0 ? P->dwte : P->grads + P->piece[i].local;
    }
    load_pieces(P, (uint64_t)run->args.seed);
    pipe_embedding_group(&P->embed, &run->mesh);
    int b = P->micro_batch, T = P->seq;
    P->scratch = mem_alloc_floats(block_scratch_numel(b, T, cfg->channels, cfg->num_heads), MEM_ACTIVATIONS);
    P->recompute = (RecomputeMode)run->args.recompute;
    if (P->recompute != RECOMPUTE_NONE)
        P->transient =
            mem_alloc_floats(block_transient_numel(b, T, cfg->channels, cfg->num_heads, P->recompute), MEM_ACTIVATIONS);
    pipe_link_create(&P->link, &P->sched, P->pp, (size_t)b * T * cfg->channels);
    for (int c = 0; c < n_virtual; c++) slot_pool_create(&P->pool[c], n_micro);  // at most every microbatch in flight
    size_t BT = (size_t)b * T;
    // staging buffers (memory.h): the step's tokens and losses, a part per
    // microbatch (slot_load_tokens says why)
    P->in_host = mem_alloc_host((size_t)n_micro * BT * sizeof(int));
    P->tg_host = mem_alloc_host((size_t)n_micro * BT * sizeof(int));
    P->loss_host = mem_alloc_host((size_t)n_micro * BT * sizeof(float));
    P->loss_order = xcalloc((size_t)n_micro, sizeof(int));
    P->times = xcalloc((size_t)2 * P->sched.n[P->stage] + 2, sizeof(double));
}

void pipe_free(Pipeline* P) {
    for (int c = 0; c < P->n_virtual; c++) {
        for (int i = 0; i < P->pool[c].n; i++) {
            mem_free(((Slot*)P->pool[c].s[i])->x);
            free(P->pool[c].s[i]);
        }
        slot_pool_free(&P->pool[c]);
    }
    pipe_link_free(&P->link);
    if (P->embed.size > 0) comm_destroy_group(&P->embed);
    mem_free(P->params);
    mem_free(P->grads);
    mem_free(P->mom);
    mem_free(P->vel);
    mem_free(P->scratch);
    mem_free(P->transient);
    mem_free_host(P->in_host);
    mem_free_host(P->tg_host);
    mem_free_host(P->loss_host);
    free(P->loss_order);
    free(P->times);
    device_stamps_free(&P->stamps);
    schedule_free(&P->sched);
}

void pipe_print_layout(const Pipeline* P) {
    int pp = P->n_stages, v = P->n_virtual, S = P->n_vstages, L = P->cfg->num_layers;
    for (int r = 0; r < pp; r++) {
        char line[512];
        int n = snprintf(line, sizeof(line), "stage %d: layers", r);
        for (int c = 0; c < v; c++) {
            LayerRange lr = stage_layers(L, S, c * pp + r);
            n += snprintf(line + n, sizeof(line) - (size_t)n, "%s %d-%d", c ? "," : "", lr.first, lr.first + lr.count - 1);
        }
        print0("%s%s%s\n", line, r == 0 ? " + embedding" : "", r == pp - 1 ? " + final LayerNorm and head (tied wte copy)" : "");
    }
    if (L % S != 0) print0("uneven split: %d layers over %d stages, the first %d hold one more\n", L, S, L % S);
}

// ---------------------------------------------------------------- validation
// The same pieces as every chapter (train_val_loss_with), each sent forward
// through the stages (blocking sends: forward only, one direction, no cycle)
// on a free slot.
static float val_forward(void* ctx, const int* inputs, const int* targets) {
    Pipeline* P = ctx;
    const GPTConfig* g = P->cfg;
    int C = g->channels, NH = g->num_heads, b = P->micro_batch, T = P->seq;
    size_t BT = (size_t)b * T, BTC = BT * C;
    float loss = 0.0f;
    for (int c = 0; c < P->n_virtual; c++) {
        int k = pipe_vstage(P, c);
        Slot* sl = slot_get(P, c, -1);
        if (k == 0) {
            mem_to_device(sl->inputs, inputs, BT * sizeof(int));
            encoder_forward(sl->x, sl->inputs, P->wte, P->wpe, b, T, C);
        } else {
            comm_recv(P->pp, sl->x, BTC, pipe_prev(&P->link));
        }
        const float* x = sl->x;
        for (int j = 0; j < P->layers[c].count; j++) {
            BlockParams p = pipe_block_params(P, c, j);
            BlockActs a = slot_block(P, sl, j);
            block_forward(&p, &a, x, b, T, C, NH);
            x = a.res3;
        }
        if (k == P->n_vstages - 1) {
            mem_to_device(sl->targets, targets, BT * sizeof(int));
            HeadActs h = slot_head(P, sl);
            head_forward(g, P->head_wte, P->lnfw, P->lnfb, &h, x, sl->targets, b, T);
            loss = (float)slot_mean_loss(P, sl);
        } else {
            comm_send(P->pp, x, BTC, pipe_next(&P->link));
        }
        slot_pool_give(&P->pool[c], -1);
    }
    return loss;
}

float pipe_val_loss(void* pipeline, const TrainSetup* setup, int n_batches) {
    Pipeline* P = pipeline;
    int per = setup->B / P->dp->size;
    // every rank runs the same pieces; the last stage's mean is the loss
    double mine = train_val_loss_with(setup, n_batches, val_forward, P, P->dp->rank * per, per, P->micro_batch, NULL);
    if (mine < 0) return -1.0f;  // no validation data (every rank alike)
    MPI_CHECK(MPI_Bcast(&mine, 1, MPI_DOUBLE, P->n_stages - 1, P->pp->mpi));
    return (float)train_mean(P->dp, mine);
}

// ---------------------------------------------------------------- the model, the checkpoint

void pipe_pieces_to_host(float* whole, const float* mine, const Piece* p, int n) {
    for (int k = 0; k < n; k++)
        if (!p[k].tied_copy) mem_to_host(whole + p[k].global, mine + p[k].local, p[k].count * sizeof(float));
}

// The stages' pieces are disjoint and every other float is zero bits, so
// an OR of the floats' bits over the stages is each float's one owner's
// value exactly (a sum would too, but for -0, which + 0 makes +0). A
// check-and-output step, not the strategy: plain MPI on host copies, not
// counted.
void pipe_pieces_merge(const Comm* pp, float* whole, size_t n) {
    const size_t chunk = (size_t)1 << 28;  // floats per call (an int count)
    for (size_t off = 0; off < n; off += chunk) {
        int cnt = (int)(n - off < chunk ? n - off : chunk);
        void* in = pp->rank == 0 ? MPI_IN_PLACE : (void*)(whole + off);
        MPI_CHECK(MPI_Reduce(in, whole + off, cnt, MPI_UINT32_T, MPI_BOR, 0, pp->mpi));
    }
}

// dp rank 0 of every stage: its pieces, merged on stage 0.
float* pipe_gather_params(Pipeline* P) {
    if (P->dp->rank != 0) return NULL;
    size_t n = gpt_num_params(P->cfg);
    float* full = xcalloc(n, sizeof(float));
    pipe_pieces_to_host(full, P->params, P->piece, P->n_pieces);
    pipe_pieces_merge(P->pp, full, n);
    if (P->stage == 0) return full;
    free(full);
    return NULL;
}

// What this rank writes and reads of the training state (ckpt.h): its
// pieces are ranges of the flat layout, so ckpt_add_state cuts each into the
// llm.c tensors it overlaps. The dp replicas of a stage are identical, so
// dp rank 0 of each stage writes its pieces, and wte once: the first stage's
// (the last stage's copy is the same parameters and, taking the same summed
// gradient through the same AdamW step, the same moments). Every rank reads
// all of its pieces, the copy too, whatever chapter and mesh saved them.
void pipe_ckpt(Ckpt* ck, const Pipeline* P) {
    for (int i = 0; i < P->n_pieces; i++) {
        const Piece* pc = &P->piece[i];
        float *p = P->params + pc->local, *m = P->mom + pc->local, *v = P->vel + pc->local;
        if (P->dp->rank == 0 && !pc->tied_copy) ckpt_add_state(&ck->own, P->cfg, pc->global, pc->count, p, m, v);
        ckpt_add_state(&ck->need, P->cfg, pc->global, pc->count, p, m, v);
    }
}

// ---------------------------------------------------------------- timelines and the summary
// The bubble of the step: 1 - (time spent in actions, summed over ranks) /
// (ranks x the span from the first action's start to the last one's end on
// any rank).
double pipe_timeline(Pipeline* P, JsonLog* log, int step, int warmup) {
    int world = 0, me = 0;
    MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &world));
    MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &me));
    device_stamps_read(&P->stamps, P->times);  // run_schedule's stamps, as host times
    int n2 = 2 * P->sched.n[P->stage], *counts = NULL, *displs = NULL;
    double* all = NULL;
    if (me == 0) counts = xmalloc((size_t)world * sizeof(int)), displs = xmalloc((size_t)world * sizeof(int));
    MPI_CHECK(MPI_Gather(&n2, 1, MPI_INT, counts, 1, MPI_INT, 0, MPI_COMM_WORLD));
    int total = 0;
    if (me == 0) {
        for (int r = 0; r < world; r++) displs[r] = total, total += counts[r];
        all = xmalloc((size_t)total * sizeof(double));
    }
    MPI_CHECK(MPI_Gatherv(P->times, n2, MPI_DOUBLE, all, counts, displs, MPI_DOUBLE, 0, MPI_COMM_WORLD));
    double bubble = 0.0;
    if (me == 0) {
        double t_min = 1e300, t_max = -1e300, busy = 0.0;
        for (int i = 0; i < total; i += 2) {
            t_min = all[i] < t_min ? all[i] : t_min;
            t_max = all[i + 1] > t_max ? all[i + 1] : t_max;
            busy += all[i + 1] - all[i];
        }
        bubble = t_max > t_min ? 1.0 - busy / (world * (t_max - t_min)) : 0.0;
        if (log->f) {
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
    if (!warmup) P->bubble_sum += bubble, P->bubble_n++;
    return bubble;
}

double pipe_bubble(const Pipeline* P) { return P->bubble_n ? P->bubble_sum / P->bubble_n : 0.0; }

void pipe_summary_fields(const Pipeline* P, const char* sched_name, double simulated, double formula, JsonBuf* out) {
    json_add_string(out, "schedule", sched_name);
    json_add_int(out, "microbatches", P->n_micro);
    json_add_int(out, "virtual", P->n_virtual);
    json_add_double(out, "bubble_measured", pipe_bubble(P), "%.4f");
    json_add_double(out, "bubble_simulated", simulated, "%.4f");
    json_add_double(out, "bubble_formula", formula, "%.4f");
    int layers = 0;
    for (int c = 0; c < P->n_virtual; c++) layers += P->layers[c].count;
    pipe_summary_ranks(layers, P->peak_slots, &P->link, out);
}

void pipe_summary_ranks(int layers, int peak_slots, const PipeLink* link, JsonBuf* out) {
    // every rank's figures, (world, 3)
    int world = 0;
    MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &world));
    int mine[3] = {layers, peak_slots, link->early}, *all = xcalloc((size_t)world * 3, sizeof(int));
    MPI_CHECK(MPI_Gather(mine, 3, MPI_INT, all, 3, MPI_INT, 0, MPI_COMM_WORLD));
    static const char* keys[3] = {"layers", "activation_slots", "early_receives"};
    int* column = xmalloc((size_t)world * sizeof(int));
    for (int f = 0; f < 3; f++) {
        for (int r = 0; r < world; r++) column[r] = all[3 * r + f];
        json_add_int_array(out, keys[f], column, world);
    }
    free(column);
    free(all);
}

// ---------------------------------------------------------------- --show-sharding

void pipe_show_sharding(const Pipeline* P, int show) {
    if (!show) return;
    size_t global[PIPE_MAX_PIECES], count[PIPE_MAX_PIECES];
    int copy[PIPE_MAX_PIECES];
    for (int i = 0; i < P->n_pieces; i++) {
        global[i] = P->piece[i].global;
        count[i] = P->piece[i].count;
        copy[i] = P->piece[i].tied_copy;
    }
    ShardTable* t = xcalloc(1, sizeof(ShardTable));
    sharding_add_ranges(t, P->cfg, global, count, copy, P->n_pieces, "(L/pp)");
    char title[64];
    snprintf(title, sizeof(title), "chapter 5, pp=%d x %d chunks, dp=%d", P->n_stages, P->n_virtual, P->dp->size);
    shard_table_show(t, show, title);
    free(t);
}
