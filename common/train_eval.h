// train_eval.h: what a run evaluates besides its steps, the same in every
// chapter: the validation loss over the same tokens whatever the layout,
// the --sample text and the --save file.
#ifndef TRAIN_EVAL_H
#define TRAIN_EVAL_H

#include "comm.h"
#include "train.h"

// Mean loss over the first n_batches global batches (s->B x s->T) of the
// validation set, run through m in pieces of m->B sequences, so every chapter
// validates on the same tokens; -1 if there is no validation data.
float train_val_loss(GPT* m, const TrainSetup* s, int n_batches);

// loss. ctx is the caller's.
typedef float (*TrainForward)(void* ctx, const int* inputs, const int* targets);

// Mean loss over the first n_batches global batches (s->B x s->T) of the
// validation set, so every chapter validates on the same tokens: this rank
// runs sequences [b0, b0 + count) of each batch through forward, micro at a
// time; the losses are summed over `group` (NULL: this rank alone) and
// averaged over every piece run. Collective over group. -1 if there is no
// validation data.
float train_val_loss_with(const TrainSetup* s, int n_batches, TrainForward forward, void* ctx, int b0,
                          int count, int micro, const Comm* group);
// The same with the pieces spread over the batch: piece j of each batch is
// sequences [b0 + j stride, b0 + j stride + micro), j < pieces (a pipeline's
// microbatches, each a slice of the whole batch: capstone/main.c).
float train_val_loss_pieces(const TrainSetup* s, int n_batches, TrainForward forward, void* ctx, int b0, int pieces,
                            int stride, int micro, const Comm* group);

// The end of a run: --sample N characters generated and --save FILE written
// from params_host, the full parameters in the flat layout on the one rank
// that holds them (NULL on every other rank). Sampling builds a model of
// sequence length T there. Collective: every rank calls it; a write error
// ends every rank. Whether a chapter needs to assemble params_host at all:
// train_wants_params.
void train_finish_params(const TrainArgs* a, const GPTConfig* cfg, int T, const float* params_host);
int train_wants_params(const TrainArgs* a);

// A TrainValLoss for a full replica, ctx a GPT* (train_val_loss).
float train_val_loss_gpt(void* gpt, const TrainSetup* s, int n_batches);

// After training: prints --sample N generated characters (rank 0), and writes
// --save FILE from the given host copy of the full parameters. Collective:
// every rank calls it; writer says which rank holds the parameters to write.
void train_sample(GPT* m, const TrainArgs* a);
// --sample N from a model no GPT holds (chapter 7's experts live on every ep
// rank): every rank calls it and next (gpt_sample_with) the same number of
// times; rank 0's window and logits are the ones sampled and printed, the
// other ranks run their part of each forward. Collective.
void train_sample_with(const TrainArgs* a, const GPTConfig* cfg, int T, GptNextLogits next, void* ctx);
void train_save(const TrainArgs* a, const GPTConfig* cfg, const float* params_host, int writer);

#endif
