// expert_zero.c: --zero 1's buffers, flag and checkpoint lines (expert_zero.h).
// The step's collectives are in 07_expert/main.c.
#include "expert_zero.h"

#include "errors.h"
#include "memory.h"
#include "ops.h"

void expert_zero_alloc(ZeroBuf* z, int zero, const Comm* g, size_t n, float** params, float** grads, float** m,
                       float** v) {
    int N = zero ? g->size : 1, r = zero ? g->rank : 0;
    *z = (ZeroBuf){.g = g, .n = n, .S = (n + N - 1) / N};
    z->lo = (size_t)r * z->S < n ? (size_t)r * z->S : n;
    z->len = n - z->lo < z->S ? n - z->lo : z->S;
    z->full = (size_t)N * z->S;  // n, or padded to N S
    *params = mem_alloc_floats(z->full, MEM_PARAMS);
    *grads = mem_alloc_floats(z->full, MEM_GRADS);
    *m = mem_alloc_floats(z->S, MEM_OPTIMIZER);
    *v = mem_alloc_floats(z->S, MEM_OPTIMIZER);
    z->off = (size_t)r * z->S;
    z->dshard = zero ? mem_alloc_floats(z->S, MEM_GRADS) : *grads;
    z->params = *params, z->grads = *grads, z->m = *m, z->v = *v;
}

void expert_zero_free(ZeroBuf* z) {
    if (z->dshard != z->grads) mem_free(z->dshard);
    z->dshard = NULL;
}

void expert_zero_sumsq(double* mine, const ZeroBuf* z) {
    size_t skip = z->tied > z->off ? z->tied - z->off : 0;  // the tied copy's floats in what I step
    if (skip < z->S) grad_sumsq(mine, z->dshard + skip, z->S - skip);
}

void expert_zero_check(int zero) {
    if (zero == 2 || zero == 3)
        fail_all("--zero %d: chapter 7 shards the AdamW moments (--zero 1) but not yet the gradients or the "
                 "parameters, which need backward to hand each layer's gradient to its reduce-scatter as chapter 3 "
                 "does (issue #35): use --zero 1", zero);
    if (zero != 0 && zero != 1) fail_all("--zero %d: the stages here are 0 (none) and 1 (the AdamW moments)", zero);
}

void expert_zero_ckpt_add(CkptList* out, const CkptList* full, const float* params, const ZeroBuf* z, float* m,
                          float* v) {
    size_t lo = z->lo, hi = z->lo + z->len;
    for (int i = 0; i < full->n; i++) {
        const CkptSlice* s = &full->s[i];
        size_t at = (size_t)(s->data - params);  // the slice's runs sit one after another in the buffer
        for (size_t j = 0; j < s->count; j++, at += s->len) {
            size_t a = at > lo ? at : lo, b = at + s->len < hi ? at + s->len : hi;
            if (a >= b) continue;
            CkptSlice p = {.tensor = s->tensor, .start = s->start + j * s->stride + (a - at), .len = b - a, .count = 1};
            p.kind = CKPT_M, p.data = m + (a - lo);
            ckpt_add(out, p);
            p.kind = CKPT_V, p.data = v + (a - lo);
            ckpt_add(out, p);
        }
    }
}
