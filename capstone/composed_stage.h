// composed_stage.h: what a rank of the capstone's pipeline owns: its chunks
// (chunk c of pp rank r is virtual stage c pp + r of S = pp x v, an
// ExpertModel of its L / S layers, so main.c's forward and backward run on
// it unchanged), the schedule (chapter 5's) and chapter 5's links, built by
// composed_stage.c; main.c runs the schedule on them. Without the
// pipeline: one chunk, F then B.
#ifndef COMPOSED_STAGE_H
#define COMPOSED_STAGE_H

#include "composed_model.h"
#include "composed_rules.h"
#include "pipeline.h"  // chapter 5's Piece, PipeLink, SlotPool, pipe_schedule_make
#include "schedule.h"

typedef struct {
    ExpertModel m;   // the chunk's layers as a model (cfg.gpt.num_layers = L / S)
    int vstage, first, moe0, n_moe;  // its virtual stage, first layer, first MoE layer, MoE layers
    Piece piece[4];  // chapter 5's: its ranges of the whole model's replicated buffer (chunk_pieces)
    int n_pieces;
    SlotPool pool;   // chapter 5's: which ExpertSlot holds which microbatch, made as the list needs them
} XpChunk;

typedef struct {
    size_t total;  // the whole model's parameters
    Run run_mb;    // the run as one microbatch sees it: setup.B = B / m
    MoeConfig cfg; // the whole model's
    Schedule sched;
    const char* sched_name;
    int pp, stage, v, S, M, B, b, T, Tr, per_rank, share;  // Tr: a rank's positions of a sequence, T / cp
    PipeLink link;  // chapter 5's: the stages (link.pp), what each neighbour sends this rank, the send buffers
    Comm embed;     // stage 0 and stage pp-1 of this (dp, tp, cp, ep) coordinate
    XpChunk chunk[PIPE_MAX_CHUNKS];  // chapter 5's bound on pp x virtual (schedule.h)
    int *inputs, *targets;  // host (m, b, T): this step's tokens of each microbatch on this rank
    double loss_sum, aux;   // the step's: losses (last stage), routing statistics of my layers
    long dropped, dropped_total;
    long* routed;  // (L_moe, E) of the whole model
    int peak_slots;
} ExpertPipe;

static inline size_t act_floats(const ExpertPipe* P) { return (size_t)P->b * P->Tr * P->cfg.gpt.channels; }

// Every rank builds and checks every rank's list (chapter 5's), makes its
// chunks, the embedding group and its links. Collective.
void expert_stage_create(ExpertPipe* P, Run* run, ExpertFlags* flags, const MoeConfig* cfg);
void expert_stage_free(ExpertPipe* P);
// This rank's slices of the training state, in the whole model's tensors.
void expert_stage_ckpt(Ckpt* ck, ExpertPipe* P);
// --model FILE (save 0) or --save FILE (save 1): chapter 7's, through this
// rank's checkpoint slices. Collective.
void expert_stage_file(ExpertPipe* P, const char* path, int save);
// --show-sharding: each chunk's buffers. Collective when show is set.
void expert_stage_show_sharding(const ExpertPipe* P, int show);

#endif
