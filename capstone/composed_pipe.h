// composed_pipe.h: the step around the schedule's actions (main.c's F, B, W
// on a rank's chunks, composed_stage.h): the slot of a (microbatch, chunk),
// the tokens, the statistics, the gradients accumulated; the set-up and the
// end (composed_pipe.c).
#ifndef COMPOSED_PIPE_H
#define COMPOSED_PIPE_H

#include "composed_stage.h"

// The chunks, the schedule, the set-up's lines, --show-sharding, the
// checkpoint (opened, resumed). Collective.
void expert_pipe_create(ExpertPipe* P, Run* run, ExpertFlags* flags, const MoeConfig* cfg, Ckpt* ck);
// Step `step`'s tokens of every microbatch of this rank.
void expert_pipe_load(ExpertPipe* P, const TokenSet* d, long step);
// The slot of (mb, chunk ch): the one mb took, else a free one, else a new one.
ExpertSlot* expert_pipe_slot(ExpertPipe* P, XpChunk* ch, int mb);
// The step's loss and routing statistics: from zero; a forward's (ch's) added.
void expert_pipe_stats_begin(ExpertPipe* P);
void expert_pipe_tally(ExpertPipe* P, const XpChunk* ch);
// The accumulated gradients as the step's (composed_pipe.c says how).
void expert_pipe_accumulated(ExpertPipe* P);
// The step record's fields; returns the step's LM loss (the microbatches'
// mean, from the last stage).
double expert_pipe_record(ExpertPipe* P, TrainLoop* loop, int step);
// The summary's fields (the traffic, a2a_hidden_share, the schedule's).
void expert_pipe_report(ExpertPipe* P, const ExpertFlags* flags, const TrainLoop* loop, JsonBuf* summary);
// --save, and everything freed (P too: main.c allocates it). Collective.
void expert_pipe_finish(ExpertPipe* P, const TrainArgs* args);

#endif
