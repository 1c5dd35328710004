// composed_pipe.h: chapter 7's pipeline (--pp, --schedule, --microbatches,
// --virtual): chapter 5's stages and schedules around chapter 7's MoE model.
//
// The layers are cut into S = pp x v virtual stages of L / S layers each
// (chapter 5's split, even here); chunk c of pp rank r is virtual stage
// k = c pp + r. Each chunk is an ExpertModel of its own layers (a model
// whose config has L / S layers), so chapter 7's forward and backward run
// unchanged on it: the MoE layers' all-to-all over ep happens inside F and
// B, and every ep rank of a stage runs the same list of actions, so their
// exchanges meet in the same order. With --schedule zb, B is the input half
// (every exchange still in it) and W the weight gradients B queued, without
// communication (composed_wgrad.c). Stage 0's chunk 0 embeds the tokens; the
// last virtual stage runs the final LayerNorm and the head with a tied copy
// of wte whose gradient is summed with stage 0's (chapter 5's embedding
// group).
//
// The microbatches: a step's batch runs in m microbatches, each a slice of
// the global batch split over the dp x ep ranks (with --cp, T/cp positions
// of each sequence on a cp rank), and the gradients accumulate over them.
// One MoE layer call sees one microbatch: its load-balancing loss and its
// capacity are over that microbatch's tokens on the dp x cp x ep ranks of
// the stage. So the objective is the mean over the microbatches of (LM loss
// + aux_coef aux), which depends on m but not on the mesh: chapter 7 on one
// rank with the same --microbatches (this same code at pp = 1) is the
// reference.
#ifndef COMPOSED_PIPE_H
#define COMPOSED_PIPE_H

#include "composed_model.h"

// Chapter 7's whole-model forward (returns this rank's mean loss, 0 off the
// last stage) and backward on one ExpertModel: main.c's model_forward and
// model_backward, which a pipeline chunk runs as they are.
typedef float (*ExpertForward)(ExpertModel* m, const int* inputs, const int* targets);
typedef void (*ExpertBackward)(ExpertModel* m);

// 1 when the run is a pipeline: --pp > 1, or --microbatches or --virtual given.
int expert_pipe_wanted(const Run* run, const ExpertFlags* flags);

// main.c's step, on this rank's chunks (composed_stage.h's ExpertPipe; one
// chunk, chapter 7's model of the rank's share, without the pipeline):
typedef struct ExpertPipe ExpertPipe;
// The chunks, the schedule's lists, --show-sharding, the set-up's lines and
// the checkpoint (opened, resumed). Collective.
void expert_pipe_create(ExpertPipe* P, Run* run, ExpertFlags* flags, const MoeConfig* cfg, ExpertForward forward,
                        ExpertBackward backward, Ckpt* ck);
// Step `step`'s tokens of every microbatch of this rank (composed_pipe.c says which).
void expert_pipe_load(ExpertPipe* P, const TokenSet* d, long step);
// The gradients zeroed, then the schedule's actions of this stage in order:
// F and B of each (microbatch, chunk), forward and backward on the chunk's
// model, with the activations and their gradients sent between the stages.
void expert_pipe_run(ExpertPipe* P);
// x 1/m over the microbatches; with pp > 1 the tied wte's halves summed
// between the first and the last stage.
void expert_pipe_accumulated(ExpertPipe* P);
// The step's LM loss of this pipeline (the microbatches' mean, told by the
// last stage) and the routing statistics over the stages.
double expert_pipe_loss(ExpertPipe* P);
// The step record's aux_loss, dropped, expert_tokens.
void expert_pipe_record(ExpertPipe* P, TrainLoop* loop, int step);
// TrainLoopSpec.val_loss (ctx: the ExpertPipe).
float expert_pipe_val_loss(void* ctx, const TrainSetup* setup, int n_batches);
// The summary's fields (the traffic, a2a_hidden_share; the schedule's with the pipeline).
void expert_pipe_report(ExpertPipe* P, const ExpertFlags* flags, const TrainLoop* loop, JsonBuf* summary);
// --sample, --save, and everything freed. Collective.
void expert_pipe_finish(ExpertPipe* P, const TrainArgs* args);

#endif
