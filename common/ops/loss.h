// ops/loss.h: the softmax cross-entropy, in two phases (common/ops.h says the
// conventions). CPU: common/cpu/ops_*.c; CUDA: common/cuda/ops_*.cu.
#ifndef OPS_LOSS_H
#define OPS_LOSS_H

#include <stddef.h>

// ---------------------------------------------------------------- loss
// Softmax cross-entropy, fused, in two phases so that a chapter can combine the
// partials across vocabulary shards before the loss and the gradient.
//
// logits (N, width): each row holds the logits of vocabulary ids
// [v0, v0 + width); only the first nvalid columns are real tokens (the rest is
// llm.c's vocabulary padding and never enters the softmax).
// targets (N) are global vocabulary ids.
//
// Phase 1, per row: rowmax = max of the valid logits, sumexp = sum of
// exp(logit - rowmax), tlogit = logit of the target if this shard holds it, else 0.
void crossentropy_partials(float* rowmax, float* sumexp, float* tlogit, const float* logits,
                           const int* targets, int N, int width, int nvalid, int v0);
// Merge the partials of another shard (max2, sum2, tlog2) into (rowmax, sumexp, tlogit).
void crossentropy_merge(float* rowmax, float* sumexp, float* tlogit, const float* max2,
                        const float* sum2, const float* tlog2, int N);
// losses (N) = log(sumexp) + rowmax - tlogit, from the partials of the whole vocabulary.
void crossentropy_loss(float* losses, const float* rowmax, const float* sumexp,
                       const float* tlogit, int N);
// Phase 2: dlogits = (softmax - onehot(target)) * dloss on valid columns, 0 on
// padding. Written, not accumulated; dlogits may equal logits (in place).
void crossentropy_backward(float* dlogits, const float* logits, const int* targets,
                           const float* rowmax, const float* sumexp, float dloss,
                           int N, int width, int nvalid, int v0);

#endif
