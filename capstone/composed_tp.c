// composed_tp.c: tensor parallelism's parameters in chapter 7's model (--tp
// N, composed_model.h's ExpertTP): a tp rank's slices of every layer's qkvw,
// qkvb and attprojw (and of a dense layer's fcw, fcb, fcprojw) in moe.h's
// layout, their counter-based init, the whole model cut into them (--model
// FILE) and put together again (--save), and the group's buffers. The
// attention half that runs on them, with every collective of tp's
// attention, is composed_attention.c's.
#include <stdlib.h>
#include <string.h>

#include "errors.h"
#include "composed_model.h"
#include "init.h"
#include "memory.h"
#include "mesh.h"
#include "run.h"

// ---------------------------------------------------------------- the parameters of a layer

// w: layer l's slices (its unit of the tp buffer; moe.h's layout).
static BlockParams with_slices(const ExpertModel* m, int l, BlockParams p, float* w) {
    return m->tp.tp == 1 ? p : moe_tp_params(&m->cfg, p, w, l, m->tp.tp);
}

// Layer l is unit 1 + l of the replicated buffer and unit l of the tp slices
// (zero_buffer.h): with --zero 3 the gathered copies.
BlockParams expert_block_params(ExpertModel* m, int l) {
    BlockParams p = moe_block_params_in(&m->cfg, zero_buffer_params(&m->z[ZERO_SHARED], 1 + l), l);
    return with_slices(m, l, p, m->tp.tp > 1 ? zero_buffer_params(&m->z[ZERO_TP], l) : NULL);
}

BlockParams expert_block_grads(ExpertModel* m, int l) {
    BlockParams g = moe_block_params_in(&m->cfg, zero_buffer_grads(&m->z[ZERO_SHARED], 1 + l), l);
    return with_slices(m, l, g, m->tp.tp > 1 ? zero_buffer_grads(&m->z[ZERO_TP], l) : NULL);
}

float* expert_router(ExpertModel* m, int l) {
    return moe_router_in(&m->cfg, zero_buffer_params(&m->z[ZERO_SHARED], 1 + l));
}

float* expert_router_grad(ExpertModel* m, int l) {
    return moe_router_in(&m->cfg, zero_buffer_grads(&m->z[ZERO_SHARED], 1 + l));
}

// ---------------------------------------------------------------- the whole model and my slices

// Between the whole model's shared buffer (moe.h's layout at tp = 1, host)
// and a tp rank's two: the shared buffer without the split tensors, and the
// rank's slices. dir TO_MINE (--model FILE), TO_WHOLE (--save), or INIT: my
// slices' counter-based values alone, each from its index in the whole
// tensor, so my slices are the whole model's without making it.
enum { TO_MINE, TO_WHOLE, INIT };
static void relayout(const ExpertModel* m, float* whole, float* shared, float* slices, int rank, int dir, uint64_t seed) {
    MoeConfig wc = m->cfg;
    wc.tp = 1;
    const MoeConfig* c = &m->cfg;
    const GPTConfig* g = &c->gpt;
    size_t C = (size_t)g->channels, tp = (size_t)m->tp.tp, Cl = C / tp, Fl = 4 * Cl, r = (size_t)rank;
#define MOVE(w, s, n) (dir == TO_WHOLE ? memcpy((w), (s), (n) * sizeof(float)) : memcpy((s), (w), (n) * sizeof(float)))
    // rows runs of n floats of tensor t from index i0 of the whole's (rows
    // ws apart) to mine (n apart), or INIT's values of them
#define ROWS(t, w, i0, ws, s, n, rows)                                                          \
    for (size_t i_ = 0; i_ < (rows); i_++)                                                        \
        if (dir == INIT)                                                                          \
            for (size_t k_ = 0; k_ < (n); k_++) (s)[i_ * (n) + k_] = gpt_init_value(g, seed, t, l, (i0) + i_ * (ws) + k_); \
        else MOVE((w) + (i0) + i_ * (ws), (s) + i_ * (n), (n))
    if (dir != INIT) MOVE(whole, shared, moe_block_offset(c, 0));  // wte, wpe
    for (int l = 0; l < g->num_layers; l++) {
        BlockParams pw = {0}, ps = dir == INIT ? pw : moe_block_params(c, shared, l);
        BlockParams pt = with_slices(m, l, ps, slices + moe_tp_offset(c, l, (int)tp));
        if (dir != INIT) {
            pw = moe_block_params(&wc, whole, l);
            float* wv[] = {pw.ln1w, pw.ln1b, pw.attprojb, pw.ln2w, pw.ln2b, pw.fcprojb};
            float* sv[] = {ps.ln1w, ps.ln1b, ps.attprojb, ps.ln2w, ps.ln2b, ps.fcprojb};
            for (int i = 0; i < 5 + !!ps.fcprojb; i++) MOVE(wv[i], sv[i], C);  // a dense layer's fcprojb whole
            if (moe_is_moe_layer(c, l)) MOVE(moe_router_at(&wc, whole, l), moe_router_at(c, shared, l), (size_t)c->experts * C);
        }
        // q, k, v: rows [j C + r Cl, j C + (r + 1) Cl); attprojw: columns
        // [r Cl, (r + 1) Cl) of every row
        ROWS(P_QKVW, pw.qkvw, r * Cl * C, C * C, pt.qkvw, Cl * C, 3);
        ROWS(P_QKVB, pw.qkvb, r * Cl, C, pt.qkvb, Cl, 3);
        ROWS(P_ATTPROJW, pw.attprojw, r * Cl, C, pt.attprojw, Cl, C);
        if (moe_is_moe_layer(c, l)) continue;
        // fcw, fcb: my hidden units' rows; fcprojw: their columns
        ROWS(P_FCW, pw.fcw, r * Fl * C, 0, pt.fcw, Fl * C, 1);
        ROWS(P_FCB, pw.fcb, r * Fl, 0, pt.fcb, Fl, 1);
        ROWS(P_FCPROJW, pw.fcprojw, r * Fl, 4 * C, pt.fcprojw, Fl, C);
    }
    if (dir != INIT) MOVE(whole + moe_lnf_offset(&wc), shared + moe_lnf_offset(c), 2 * C);
#undef ROWS
#undef MOVE
}

void expert_tp_init(ExpertModel* m, uint64_t seed) {
    float* w = xmalloc(m->tp.n * sizeof(float));
    relayout(m, NULL, NULL, w, m->tp.rank, INIT, seed);
    zero_buffer_put(&m->z[ZERO_TP], w);
    free(w);
}

void expert_tp_load(ExpertModel* m, const float* whole) {
    float* shared = xmalloc(m->n_shared * sizeof(float));
    float* slices = xmalloc(m->tp.n * sizeof(float));
    relayout(m, (float*)whole, shared, slices, m->tp.rank, TO_MINE, 0);
    zero_buffer_put(&m->z[ZERO_SHARED], shared);
    zero_buffer_put(&m->z[ZERO_TP], slices);
    free(shared);
    free(slices);
}

float* expert_tp_gather_whole(ExpertModel* m) {
    ExpertTP* t = &m->tp;
    float* all = t->rank == 0 ? mem_alloc_floats(t->n * t->tp, MEM_OTHER) : NULL;
    comm_gather(t->tpc, t->w, all, t->n, 0);
    float* whole = NULL;
    if (t->rank == 0) {
        MoeConfig wc = m->cfg;
        wc.tp = 1;
        whole = xmalloc(moe_num_shared(&wc) * sizeof(float));
        float* shared = xmalloc(m->n_shared * sizeof(float));
        float* slices = xmalloc(t->n * t->tp * sizeof(float));
        mem_to_host(shared, m->shared, m->n_shared * sizeof(float));
        mem_to_host(slices, all, t->n * t->tp * sizeof(float));
        for (int r = 0; r < t->tp; r++) relayout(m, whole, shared, slices + (size_t)r * t->n, r, TO_WHOLE, 0);
        free(shared);
        free(slices);
    }
    mem_free(all);
    return whole;
}

// ---------------------------------------------------------------- buffers

void expert_tp_create(ExpertModel* m, const Run* run) {
    ExpertTP* t = &m->tp;
    const Mesh* mesh = &run->mesh;
    t->tp = mesh->size[AXIS_TP], t->rank = mesh->coord[AXIS_TP], t->tpc = &run->axes[AXIS_TP];
    t->sh = m->cp.sh;
    t->sh.B = m->B * t->tp;  // attention sees the group's sequences
    if (t->tp == 1) return;
    // named by its axes in the summary, cp only with --cp (as the batch group)
    unsigned cp = mesh->size[AXIS_CP] > 1 ? 1u << AXIS_CP : 0u;
    comm_create_group(&t->dpcpep_own, mesh, (1u << AXIS_DP) | cp | (1u << AXIS_EP));
    t->dpcpep = &t->dpcpep_own;
    const int C = m->cfg.gpt.channels;
    t->n = moe_tp_offset(&m->cfg, m->cfg.gpt.num_layers, t->tp);
    zero_buffer_alloc(&m->z[ZERO_TP], m->zero, t->dpcpep, t->n, &t->w, &t->dw, &t->m, &t->v);  // --zero: zero_buffer.h
    t->full = mem_alloc_floats((size_t)m->N * t->tp * C, MEM_ACTIVATIONS);
    t->dfull = mem_alloc_floats((size_t)m->N * t->tp * C, MEM_ACTIVATIONS);
}

void expert_tp_free(ExpertModel* m) {
    ExpertTP* t = &m->tp;
    if (t->tp == 1) return;
    mem_free(t->full), mem_free(t->dfull);  // the slices' buffers are z[ZERO_TP]'s
    comm_destroy_group(&t->dpcpep_own);
}
