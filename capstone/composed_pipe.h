// composed_pipe.h: the capstone's pipeline executor (composed_pipe.c) on a
// rank's chunks (composed_stage.h): chapter 5's schedule run for main.c's
// one training loop; every ep rank of a stage runs the same list, so the
// MoE exchanges meet in order.
#ifndef COMPOSED_PIPE_H
#define COMPOSED_PIPE_H

#include "composed_stage.h"

// The chunks, the schedule, the set-up's lines, --show-sharding, the
// checkpoint (opened, resumed). Collective.
void expert_pipe_create(ExpertPipe* P, Run* run, ExpertFlags* flags, const MoeConfig* cfg, ExpertForward forward,
                        ExpertBackward backward, Ckpt* ck);
// Step `step`'s tokens of every microbatch of this rank.
void expert_pipe_load(ExpertPipe* P, const TokenSet* d, long step);
// The gradients zeroed, then this stage's actions in order: F, B (zb: W) of
// each (microbatch, chunk), activations and gradients sent between stages.
void expert_pipe_run(ExpertPipe* P);
// The accumulated gradients as the step's (composed_pipe.c says how).
void expert_pipe_accumulated(ExpertPipe* P);
// The step record's fields; returns the step's LM loss (the microbatches'
// mean, from the last stage).
double expert_pipe_record(ExpertPipe* P, TrainLoop* loop, int step);
// TrainLoopSpec.val_loss (ctx: the ExpertPipe).
float expert_pipe_val_loss(void* ctx, const TrainSetup* setup, int n_batches);
// The summary's fields (the traffic, a2a_hidden_share, the schedule's).
void expert_pipe_report(ExpertPipe* P, const ExpertFlags* flags, const TrainLoop* loop, JsonBuf* summary);
// --sample, --save, and everything freed. Collective.
void expert_pipe_finish(ExpertPipe* P, const TrainArgs* args);

#endif
