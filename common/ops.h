// ops.h: the GPT's building blocks, forward and backward, on device memory.
//
// Every op takes the shapes its caller passes and never assumes it sees the
// whole model: later chapters call these same ops on a subset of heads, a slice
// of the MLP, a slice of the vocabulary, a chunk of the sequence or a
// sub-batch. Pointers are device pointers (host memory on the CPU backend).
//
// Conventions (as in llm.c):
//   - N is a count of token rows (N = B*T when a caller passes a batch).
//   - weights are stored (out, in): a linear layer computes out = inp @ w^T + b.
//   - backward ops ACCUMULATE (+=) into every gradient they write, parameter
//     and activation gradients alike, so callers zero what must start at zero.
//     A gradient pointer may be NULL when the caller does not need it.
#ifndef OPS_H
#define OPS_H

// One header per op family, as llm.c's llmc/:
#include "ops/util.h"
#include "ops/embedding.h"
#include "ops/layernorm.h"
#include "ops/linear.h"
#include "ops/attention.h"
#include "ops/pointwise.h"
#include "ops/loss.h"
#include "ops/experts.h"
#include "ops/optimizer.h"

#endif
