// wgrad_queue.c: deferred weight gradients (wgrad_queue.h).
#include "wgrad_queue.h"

#include <stdlib.h>

#include "errors.h"
#include "memory.h"
#include "ops.h"
#include "trace.h"

void wgrad_queue_create(WGradQueue* q, size_t cap, int max) {
    *q = (WGradQueue){.cap = cap, .max = max};
    q->arena = mem_alloc_floats(cap, MEM_ACTIVATIONS);
    q->e = xcalloc((size_t)max, sizeof(WGradEntry));
}

void wgrad_queue_free(WGradQueue* q) {
    if (q->arena) mem_free(q->arena);
    free(q->e);
    *q = (WGradQueue){0};
}

void wgrad_queue_push(void* ctx, int layer, float* dw, float* db, const float* dout, const float* inp, int N, int C,
                      int OC) {
    WGradQueue* q = ctx;
    size_t nd = (size_t)N * OC, ni = dw ? (size_t)N * C : 0;
    if (q->n == q->max || q->used + nd + ni > q->cap)
        FATAL("the weight-gradient queue is full (%d of %d matmuls, %zu of %zu floats)", q->n, q->max, q->used, q->cap);
    WGradEntry* e = &q->e[q->n++];
    *e = (WGradEntry){.dw = dw, .db = db, .dout = q->arena + q->used, .inp = dw ? q->arena + q->used + nd : NULL,
                      .N = N, .C = C, .OC = OC, .layer = layer};
    ops_copy(e->dout, dout, nd);
    if (dw) ops_copy(e->inp, inp, ni);
    q->used += nd + ni;
}

void wgrad_queue_run(WGradQueue* q) {
    for (int i = 0; i < q->n;) {
        double t0 = trace_start();
        int l = q->e[i].layer;
        for (; i < q->n && q->e[i].layer == l; i++) {  // one layer's, in the order B queued them
            WGradEntry* e = &q->e[i];
            matmul_backward(NULL, e->dw, e->db, e->dout, e->inp, NULL, e->N, e->C, e->OC);
        }
        trace_compute(t0, "block %d backward weights", l);
    }
    q->n = 0, q->used = 0;
}
