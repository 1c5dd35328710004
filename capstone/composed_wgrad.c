// composed_wgrad.c: the split backward (--schedule zb). B makes the input
// gradients the stage before waits for, through every exchange; the big
// matmuls' weight gradients (attention's, a dense MLP's, the router's, the
// experts') go with copies of their rows to the slot's queue
// (wgrad_queue.h), which W runs. The LayerNorms', the embeddings' and the
// tied head's stay in B.
#include "composed_model.h"
#include "memory.h"

// Every deferred matmul's inp and dout rows, per layer: attention's qkv and
// proj on Ng = N tp rows of my C/tp channels (--tp: the proj bias on my N
// rows); an MoE layer's router and at most R expert rows through fc and
// proj; a dense layer's fc and proj (on Ng rows with --tp, and the bias).
static size_t wgrad_floats(const ExpertModel* m) {
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
    // at most 3 matmuls of attention, and the router and 2 per expert or a dense MLP's 3
    int per_layer = 3 + (1 + 2 * m->E_local > 3 ? 1 + 2 * m->E_local : 3);
    wgrad_queue_create(q, wgrad_floats(m), m->cfg.gpt.num_layers * per_layer);
}

static void wgrad_hook(void* ctx, int layer, float* dw, float* db, const float* dout, const float* inp, int N, int C,
                       int OC) {
    ExpertModel* m = ctx;
    if (N == 0) return;  // an expert that received no row
    WeightGradHook h = {m->split ? wgrad_queue_push : NULL, &m->slot->wq, layer};  // not split: at once
    weight_grad(&h, dw, db, dout, inp, N, C, OC);
}

// layer: the chunk's; the hook (and W's span) names the model's
WeightGradHook expert_wgrad(ExpertModel* m, int layer) {
    return (WeightGradHook){wgrad_hook, m, m->cfg.first_layer + layer};
}
