// composed_wgrad.c: the split backward of chapter 7's chunks (--schedule zb;
// composed_model.h says what B and W do). The zero-bubble authors' own
// Megatron code defers each linear layer's weight-gradient GEMM the same
// way; here the queue belongs to one (microbatch, chunk) slot
// (composed_pipe.c), filled by its B and run by its W.
#include "composed_model.h"

#include <stdlib.h>

#include "errors.h"
#include "memory.h"
#include "trace.h"

void expert_wgrad_enable(ExpertModel* m) {
    m->split = 1;
    // a dense layer's MLP gradients: expert_cp_create made them at cp > 1 or tp > 1
    size_t N4C = (size_t)m->N * 4 * m->cfg.gpt.channels;
    if (m->cfg.moe_every > 1 && !m->cp.dfch) {
        m->cp.dfch_gelu = mem_alloc_floats(N4C, MEM_ACTIVATIONS);
        m->cp.dfch = mem_alloc_floats(N4C, MEM_ACTIVATIONS);
    }
}

// Per layer of the chunk, every deferred matmul's dout and inp rows:
// attention on the attention's rows Ng = N tp (my heads' C/tp channels),
// qkv (ln1 and d qkv) and proj (atty and d res2), with --tp the proj bias
// on my N rows of d res2; an MoE layer's router (ln2 and d logits) and at
// most R expert rows through fc (exp_in, d fch) and proj (fch_gelu, d out);
// a dense layer's fc (ln2, d fch) and proj (fch_gelu, d res3): on the Ng
// rows with --tp (N 4C floats of fch either way), and the proj bias on my N.
size_t expert_wgrad_floats(const ExpertModel* m) {
    const MoeConfig* c = &m->cfg;
    size_t N = (size_t)m->N, C = (size_t)c->gpt.channels, tp = (size_t)(m->tp.tp > 1 ? m->tp.tp : 1);
    size_t Ng = N * tp, Cl = C / tp, H = (size_t)c->hidden, E = (size_t)c->experts, R = (size_t)m->moe.R, f = 0;
    for (int l = 0; l < c->gpt.num_layers; l++) {
        f += Ng * (C + 3 * Cl) + Ng * (Cl + C) + (tp > 1 ? N * C : 0);
        if (moe_is_moe_layer(c, l))
            f += N * (C + E) + R * (C + H) + R * (H + C);
        else
            f += (Ng * C + N * 4 * C) * 2 + (tp > 1 ? N * C : 0);
    }
    return f;
}

void expert_wgrad_create(WGradQueue* q, const ExpertModel* m) {
    q->cap = expert_wgrad_floats(m), q->used = 0, q->n = 0;
    q->arena = mem_alloc_floats(q->cap, MEM_ACTIVATIONS);
    // at most 3 matmuls of attention, and the router and 2 per expert or a dense MLP's 3
    q->max = m->cfg.gpt.num_layers * (3 + (1 + 2 * m->E_local > 3 ? 1 + 2 * m->E_local : 3));
    q->e = xcalloc((size_t)q->max, sizeof(WGradEntry));
}

void expert_wgrad_free(WGradQueue* q) {
    if (q->arena) mem_free(q->arena);
    free(q->e);
    *q = (WGradQueue){0};
}

void expert_wgrad(ExpertModel* m, int layer, float* dw, float* db, const float* dout, const float* inp, int N, int C,
                  int OC) {
    if (N == 0) return;  // an expert that received no row
    WGradQueue* q = m->wq;
    if (!q) {
        matmul_backward(NULL, dw, db, dout, inp, NULL, N, C, OC);
        return;
    }
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

void expert_wgrad_hook(void* ctx, int layer, float* dw, float* db, const float* dout, const float* inp, int N, int C,
                       int OC) {
    expert_wgrad(ctx, layer, dw, db, dout, inp, N, C, OC);
}

void expert_wgrad_run(WGradQueue* q) {
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
