// composed_pipe.h: what a rank of the capstone's pipeline owns and the step
// around the schedule's actions. It owns its chunks (chunk c of pp rank r is
// virtual stage c pp + r of S = pp x v, an ExpertModel of its L / S layers,
// so main.c's model_forward and model_backward run on it unchanged), the
// schedule and the links (chapter 5's), set up, checkpointed and freed by
// composed_stage.c. Around main.c's F, B, W, composed_pipe.c takes or makes
// the slot of a (microbatch, chunk) from the chunk's pool, loads the tokens,
// adds up the statistics, scales the gradients accumulated over the
// microbatches, and fills the step record and the summary. Without the
// pipeline: one chunk, F then B.
#ifndef COMPOSED_PIPE_H
#define COMPOSED_PIPE_H

#include "composed_model.h"
#include "composed_rules.h"
#include "pipeline.h"  // chapter 5's PipeLink, pipe_schedule_make
#include "schedule.h"

typedef struct {
    size_t total;  // the whole model's parameters
    Run run_mb;    // the run as one microbatch sees it: setup.B = B / m
    MoeConfig cfg; // the whole model's
    Schedule sched;
    const char* sched_name;
    int pp, stage, v, S, M, B, b, T, Tr, per_rank, share;  // Tr: a rank's positions of a sequence, T / cp
    PipeLink link;  // chapter 5's: the stages (link.pp), what each neighbour sends this rank, the send buffers
    Comm embed;     // stage 0 and stage pp-1 of this (dp, tp, cp, ep) coordinate
    ExpertModel chunk[PIPE_MAX_CHUNKS];  // chunk c is virtual stage c pp + stage (chapter 5's bound on pp x v)
    int *inputs, *targets;  // host (m, b, T): this step's tokens of each microbatch on this rank
    double loss_sum, aux;   // the step's: losses (last stage), routing statistics of my layers
    long dropped, dropped_total;
    long* routed;  // (L_moe, E) of the whole model
} ExpertPipe;

static inline size_t act_floats(const ExpertPipe* P) { return (size_t)P->b * P->Tr * P->cfg.gpt.channels; }

// ---------------------------------------------------------------- composed_stage.c
// Every rank builds and checks every rank's list (chapter 5's); then the
// chunks, the embedding group, the links, --model FILE, the set-up's lines,
// --show-sharding, the checkpoint (opened, resumed). Collective.
void expert_pipe_create(ExpertPipe* P, Run* run, ExpertFlags* flags, const MoeConfig* cfg, Ckpt* ck);
// --save, and everything freed (P too: main.c allocates it). Collective.
void expert_pipe_finish(ExpertPipe* P, const TrainArgs* args);

// ---------------------------------------------------------------- composed_pipe.c
// Step `step`'s tokens of every microbatch of this rank.
void expert_pipe_load(ExpertPipe* P, const TokenSet* d, long step);
// The slot of microbatch mb in chunk m: the one mb took, else a free one, else a new one.
ExpertSlot* expert_pipe_slot(ExpertModel* m, int mb);
// The step's loss and routing statistics: from zero; a forward's (chunk m's) added.
void expert_pipe_stats_begin(ExpertPipe* P);
void expert_pipe_tally(ExpertPipe* P, const ExpertModel* m);
// The accumulated gradients as the step's (composed_pipe.c says how).
void expert_pipe_accumulated(ExpertPipe* P);
// The step record's fields; returns the step's LM loss (the microbatches'
// mean, from the last stage).
double expert_pipe_record(ExpertPipe* P, TrainLoop* loop, int step);
// The summary's fields (the traffic, a2a_hidden_share, the schedule's).
void expert_pipe_report(ExpertPipe* P, const ExpertFlags* flags, const TrainLoop* loop, JsonBuf* summary);

#endif
