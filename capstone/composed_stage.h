// composed_stage.h: what a rank of chapter 7's pipeline owns and keeps (as
// chapter 5's pipeline.h for the GPT): its chunks, each an ExpertModel of
// its layers, their pieces of the whole model, the activation slots, the
// schedule's lists and who sends this rank what; their set-up and release,
// the training-state checkpoint's slices, --save and --show-sharding
// (composed_stage.c). The step is main.c's, its lists run by composed_pipe.c;
// without the pipeline a rank has one chunk (expert_stage_create_one).
#ifndef COMPOSED_STAGE_H
#define COMPOSED_STAGE_H

#include "composed_pipe.h"
#include "pipeline.h"  // chapter 5's Incoming, pipe_incoming_build, pipe_receive, SendPool
#include "schedule.h"
#include "composed_rules.h"

#define XP_MAX_CHUNKS COMPOSED_MAX_CHUNKS  // virtual stages, as chapter 5 (composed_rules.h)

// What one (microbatch, chunk) keeps from its F to its B (zb: its W): the chunk's
// activations (its input in acts.encoded, its layers', the head's), its MoE
// layers' routing, plan and rows, and with --cp its layers' attention state.
// The chunk's ExpertModel works on a slot by pointing m->acts, m->layers and
// m->cp's kept buffers at it (slot_use).
typedef struct {
    GPTActs acts;
    MoeLayer* layers;
    float *lse, *qkv_h, *y_h;  // --cp: what each layer's attention keeps (composed_model.h's ExpertCP)
    WGradQueue wq;               // zb: the weight gradients its B queued for its W (composed_wgrad.c)
    int mb, busy;
} XpSlot;

typedef struct {
    ExpertModel m;   // the chunk's layers as a model (cfg.gpt.num_layers = L / S)
    int vstage, first, moe0, n_moe;  // its virtual stage, first layer, first MoE layer, MoE layers
    Piece piece[4];  // chapter 5's: its ranges of the whole model's replicated buffer (chunk_pieces)
    int n_pieces;
    XpSlot** slot;
    int n_slots;
} XpChunk;

struct ExpertPipe {
    int plain;    // pp = 1 without the pipeline's flags: one chunk, chapter 7's model of the rank's share
    size_t total;  // the whole model's parameters
    Run run_mb;   // the run as one microbatch sees it: setup.B = B / m (the chunks' models point into it)
    MoeConfig cfg;  // the whole model's
    ExpertForward forward;
    ExpertBackward backward;
    Schedule sched;
    const char* sched_name;
    int pp, stage, v, S, M, B, b, T, Tr, per_rank, share;  // Tr: a rank's positions of a sequence, T / cp
    const Comm* ppc;
    Comm embed;  // stage 0 and stage pp-1 of this (dp, cp, ep) coordinate
    XpChunk chunk[XP_MAX_CHUNKS];
    Incoming in[2];  // chapter 5's lists: what each neighbour sends this rank, in its order
    int n_in;
    int early;       // messages that came before their action asked (pipe_receive counts; not reported)
    SendPool sends;  // chapter 5's: each send from a buffer of its own
    int *inputs, *targets;  // host (m, b, T): this step's tokens of each microbatch on this rank
    // the step's figures: losses (last stage), routing statistics of my layers
    double loss_sum, aux;
    long dropped, dropped_total;
    long* routed;  // (L_moe, E) of the whole model
    int peak_slots;
};

static inline int next_rank(const ExpertPipe* P) { return (P->stage + 1) % P->pp; }
static inline int prev_rank(const ExpertPipe* P) { return (P->stage + P->pp - 1) % P->pp; }
static inline size_t act_floats(const ExpertPipe* P) { return (size_t)P->b * P->Tr * P->cfg.gpt.channels; }

// A chunk's model works on a slot: its activations, MoE layer state and
// (--cp) kept attention buffers are the slot's.
static inline void slot_use(XpChunk* ch, XpSlot* sl) {
    ch->m.acts = sl->acts;
    ch->m.layers = sl->layers;
    ch->m.cp.lse = sl->lse, ch->m.cp.qkv_h = sl->qkv_h, ch->m.cp.y_h = sl->y_h;
}

// Every rank builds and validates every rank's list, makes its chunks (their
// parameters from the whole model's init or --model FILE, piece by piece),
// the embedding group and its incoming messages (chapter 5's
// pipe_incoming_build). Refuses bad flags on every rank with one message.
// Collective over the world.
void expert_stage_create(ExpertPipe* P, Run* run, ExpertFlags* flags, const MoeConfig* cfg);
// Without the pipeline (pp = 1, no --microbatches, --virtual): one chunk,
// chapter 7's model of the rank's whole share (expert_model_create), and
// the schedule of one microbatch: its F, then its B.
void expert_stage_create_one(ExpertPipe* P, Run* run, ExpertFlags* flags, const MoeConfig* cfg);
void expert_stage_free(ExpertPipe* P);
// This rank's slices of the training state, in the whole model's tensors
// (--ckpt-dir, --resume), its chunks' (without the pipeline, its one chunk's).
void expert_stage_ckpt(Ckpt* ck, ExpertPipe* P);
// --save FILE: the whole model gathered over pp, written by world rank 0. Collective.
void expert_stage_save(ExpertPipe* P, const char* path);
// --show-sharding: each chunk's buffers. Collective when show is set.
void expert_stage_show_sharding(const ExpertPipe* P, int show);

#endif
