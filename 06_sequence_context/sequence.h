// sequence.h: Megatron sequence parallelism (--tp N --sp), chapter 6's
// first strategy, on chapter 4's tensor-parallel engine (04_fsdp_tp/tp.h).
//
// Chapter 4 splits the matmuls over tp but leaves every rank a whole copy of
// the residual stream: the LayerNorms, the residual adds and the embedding
// output run on all B*T tokens on every tp rank, and keep (B,T,C) tensors
// that are the same on every rank. Sequence parallelism (Korthikanti et
// al., "Reducing Activation Recomputation in Large Transformer Models",
// 2022) cuts those parts by tokens instead: tp rank r holds rows
// [r*N/tp, (r+1)*N/tp) of the flattened N = B*T tokens, and chapter 4's
// all-reduces become an all-gather before each column-parallel matmul and a
// reduce-scatter after each row-parallel one. The code is 06_sequence_context/
// sequence.c, with every collective written where it happens.
#ifndef SEQUENCE_H
#define SEQUENCE_H

#include "train.h"

// Trains with sequence parallelism on the run's dp x tp mesh (tp inner) and
// returns the exit code of the program (0, or 1 when the end-of-run check
// finds the tp ranks' replicated tensors or LayerNorm gradients differ).
// FSDP over dp as in chapter 4: ZeRO stage `zero`, prefetch and reshard as
// chapter 3. Bad input (B*T not divisible by tp, a mesh the model cannot
// split) ends every rank with one message.
int sp_train(Run* run, int zero, int prefetch, int reshard);

#endif
