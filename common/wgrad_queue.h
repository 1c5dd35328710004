// wgrad_queue.h: deferred weight gradients, the W of a zero-bubble schedule.
//
// A split backward's B computes the input gradients (what the stage before
// waits for) and hands each big matmul's weight gradient to a
// WeightGradHook (model.h) instead of computing it; this queue is such a
// hook. It copies the matmul's output-gradient rows and input rows into an
// arena and keeps the entry; W runs the entries later, in the order B
// queued them, with no communication and nothing recomputed. Copies, not
// pointers: most of those rows sit in buffers the next layer reuses (the
// scratch, a tp group's gathered rows, what --recompute makes again). The
// zero-bubble authors' Megatron code defers each linear layer's
// weight-gradient GEMM the same way.
#ifndef WGRAD_QUEUE_H
#define WGRAD_QUEUE_H

#include <stddef.h>

#include "model.h"  // WeightGradHook

typedef struct {
    float *dw, *db;     // the gradients it accumulates into (either may be NULL)
    float *dout, *inp;  // (N, OC), (N, C): the copies in the arena (inp NULL when dw is)
    int N, C, OC, layer;
} WGradEntry;

typedef struct {
    float* arena;  // (cap) the copies of the deferred matmuls
    size_t cap, used;
    WGradEntry* e;
    int n, max;
} WGradQueue;

// A queue for at most max matmuls whose copies take at most cap floats
// (device memory, counted as activations); its release.
void wgrad_queue_create(WGradQueue* q, size_t cap, int max);
void wgrad_queue_free(WGradQueue* q);
// The hook's fn (ctx: the WGradQueue): dw (OC, C) += dout^T inp, db (OC) +=
// the rows' sum of dout, deferred: dout (N, OC) and inp (N, C, not read when
// dw is NULL) copied into the arena. A full queue ends the run with a message.
void wgrad_queue_push(void* ctx, int layer, float* dw, float* db, const float* dout, const float* inp, int N, int C,
                      int OC);
// Every queued matmul's weight gradient in the order they were queued (a
// "block l backward weights" span per layer); the queue is then empty.
void wgrad_queue_run(WGradQueue* q);

#endif
