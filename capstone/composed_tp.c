// composed_tp.c: tensor parallelism with sequence parallelism in chapter 7
// (--tp N, composed_model.h's ExpertTP), chapter 6's Megatron sequence
// parallelism (06_sequence_context/sequence.c) on chapter 7's model.
//
// Outside attention and a dense MLP every op works token by token, so a tp
// rank runs the embedding, the LayerNorms, the residuals, the router, the
// MoE layer and the head on its own N rows (B/tp whole sequences of its
// share). Attention mixes the tokens of a sequence and is split by heads: the
// group's rows are all-gathered (chapter 6's "gather from the
// sequence-parallel region"), qkv is column-parallel (this rank's NH/tp
// heads), attproj row-parallel (a partial sum for every row), and a
// reduce-scatter adds the partial sums and hands each rank its rows back.
// Backward mirrors it, and all-gathers ln1's output again for qkvw's
// gradient (it is not kept: that is the saving). A dense layer's MLP is
// chapter 6's own (sp_mlp_forward, composed_attention.c): fc on my 4C/tp
// hidden units. The experts stay whole on every tp rank (docs/07_expert.md
// says why). Every collective of tp's attention is in this file, in step
// order, the MLP's in 06_sequence_context/sequence.c.
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
// (composed_zero.h): with --zero 3 the gathered copies.
BlockParams expert_block_params(ExpertModel* m, int l) {
    BlockParams p = moe_block_params_in(&m->cfg, expert_zero_params(&m->z[ZERO_SHARED], 1 + l), l);
    return with_slices(m, l, p, m->tp.tp > 1 ? expert_zero_params(&m->z[ZERO_TP], l) : NULL);
}

BlockParams expert_block_grads(ExpertModel* m, int l) {
    BlockParams g = moe_block_params_in(&m->cfg, expert_zero_grads(&m->z[ZERO_SHARED], 1 + l), l);
    return with_slices(m, l, g, m->tp.tp > 1 ? expert_zero_grads(&m->z[ZERO_TP], l) : NULL);
}

float* expert_router(ExpertModel* m, int l) {
    return moe_router_in(&m->cfg, expert_zero_params(&m->z[ZERO_SHARED], 1 + l));
}

float* expert_router_grad(ExpertModel* m, int l) {
    return moe_router_in(&m->cfg, expert_zero_grads(&m->z[ZERO_SHARED], 1 + l));
}

// ---------------------------------------------------------------- the tp group's rows

// With --cp-balance zigzag a rank's rows are part-major over its own
// sequences, (part, b', i), so an all-gather lays them out (r, part, b', i);
// attention over the group wants (part, r B/tp + b', i), chapter 6's layout
// of the group's B tp sequences. to_group: the first into the second, else
// back. A copy of blocks of B/tp x T/(2 cp) rows; plain cut: nothing moves.
static void reorder(const ExpertModel* m, float* dst, const float* src, int to_group) {
    const CPShard* sh = &m->cp.sh;  // my rows
    const int tp = m->tp.tp;
    const size_t C = (size_t)m->cfg.gpt.channels, blk = (size_t)sh->B * sh->len * C;
    for (int r = 0; r < tp; r++)
        for (int p = 0; p < sh->parts; p++) {
            size_t mine = ((size_t)r * sh->parts + p) * blk, group = ((size_t)p * tp + r) * blk;
            ops_copy(dst + (to_group ? group : mine), src + (to_group ? mine : group), blk);
        }
}

// All-gather over tp: my rows (N, C) into every row of the group (N tp, C),
// in the group's order (scratch: (N tp, C) for zigzag's reordering).
static void tp_allgather(ExpertModel* m, const float* mine, float* all, float* scratch) {
    const size_t NC = (size_t)m->N * m->cfg.gpt.channels;
    if (m->cp.sh.parts == 1) {
        comm_allgather(m->tp.tpc, mine, all, NC);  // rank order is the group's order
        return;
    }
    comm_allgather(m->tp.tpc, mine, scratch, NC);
    reorder(m, all, scratch, 1);
}

// Reduce-scatter over tp: the partial sums of every row (N tp, C) added, my
// rows (N, C) kept.
static void tp_reduce_scatter(ExpertModel* m, const float* all, float* mine, float* scratch) {
    const size_t NC = (size_t)m->N * m->cfg.gpt.channels;
    if (m->cp.sh.parts == 2) {
        reorder(m, scratch, all, 0);
        all = scratch;
    }
    comm_reduce_scatter(m->tp.tpc, all, mine, NC, COMM_SUM);
}

// ---------------------------------------------------------------- the attention half

// x (N, C): my rows of the layer's input; a->res2, a->ln2 (N, C) my rows.
// a->qkv (N tp, 3C/tp) and a->atty (N tp, C/tp) hold every row of the group
// for my heads (the same floats as N rows of 3C and C: the GPT's buffers).
void expert_tp_attention_forward(ExpertModel* m, int l, const BlockParams* p, BlockActs* a, const float* x) {
    ExpertTP* t = &m->tp;
    const int N = m->N, C = m->cfg.gpt.channels, Cl = C / t->tp, Ng = N * t->tp;
    const size_t NC = (size_t)N * C;
    layernorm_forward(a->ln1, a->ln1_mean, a->ln1_rstd, x, p->ln1w, p->ln1b, N, C);  // (N, C) my rows
    // all-gather over tp: every row of the group, its B tp sequences
    tp_allgather(m, a->ln1, t->full, t->dfull);                                      // (N tp, C)
    matmul_forward(a->qkv, t->full, p->qkvw, p->qkvb, Ng, C, 3 * Cl);                // (N tp, 3C/tp)
    expert_attention_core_forward(m, l, a);                                          // (N tp, C/tp)
    // row-parallel: every row's partial sum over my heads, the bias added
    // by tp rank 0 alone so that the sum holds it once
    matmul_forward(t->full, a->atty, p->attprojw, t->rank == 0 ? p->attprojb : NULL, Ng, Cl, C);
    // reduce-scatter over tp: the partial sums added, my rows kept
    tp_reduce_scatter(m, t->full, a->attproj, t->dfull);                             // (N, C)
    residual_forward(a->res2, x, a->attproj, NC);
    layernorm_forward(a->ln2, a->ln2_mean, a->ln2_rstd, a->res2, p->ln2w, p->ln2b, N, C);
}

// dres: d res3 on entry (my rows), d x on return; dln2 (N, C) d ln2's output.
void expert_tp_attention_backward(ExpertModel* m, int l, const BlockParams* p, BlockParams* g, const BlockActs* a,
                                  const BlockScratch* s, const float* x, const float* dln2, float* dres) {
    ExpertTP* t = &m->tp;
    const int N = m->N, C = m->cfg.gpt.channels, Cl = C / t->tp, Ng = N * t->tp;
    layernorm_backward(dres, NULL, NULL, dln2, a->res2, p->ln2w, a->ln2_mean, a->ln2_rstd, N, C);  // d res2
    // the reduce-scatter's backward: all-gather d attproj of every row
    tp_allgather(m, dres, t->dfull, t->full);                                         // (N tp, C)
    ops_zero(s->datty, (size_t)Ng * Cl);
    matmul_backward(s->datty, NULL, NULL, t->dfull, NULL, p->attprojw, Ng, Cl, C);
    // the weight gradients at once or (zb) queued for W (composed_wgrad.c).
    // The bias, added once per row: its gradient over my rows (the tp mean
    // of the replicated gradients adds the other ranks' rows)
    expert_wgrad(m, l, g->attprojw, NULL, t->dfull, a->atty, Ng, Cl, C);
    expert_wgrad(m, l, NULL, g->attprojb, dres, NULL, N, Cl, C);
    ops_zero(s->dqkv, (size_t)Ng * 3 * Cl);
    expert_attention_core_backward(m, l, a, s);                                       // s->dqkv (N tp, 3C/tp)
    // ln1's output of every row again, for qkvw's gradient (a collective:
    // in B even when the gradient waits for W)
    tp_allgather(m, a->ln1, t->full, t->dfull);
    ops_zero(t->dfull, (size_t)Ng * C);
    matmul_backward(t->dfull, NULL, NULL, s->dqkv, NULL, p->qkvw, Ng, C, 3 * Cl);
    expert_wgrad(m, l, g->qkvw, g->qkvb, s->dqkv, t->full, Ng, C, 3 * Cl);
    // the all-gather's backward: reduce-scatter d ln1, each rank its rows
    tp_reduce_scatter(m, t->dfull, s->dln, t->full);                                 // (N, C)
    layernorm_backward(dres, g->ln1w, g->ln1b, s->dln, x, p->ln1w, a->ln1_mean, a->ln1_rstd, N, C);
    layernorm_backward(NULL, g->ln2w, g->ln2b, dln2, a->res2, NULL, a->ln2_mean, a->ln2_rstd, N, C);
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
    expert_zero_put(&m->z[ZERO_TP], w);
    free(w);
}

void expert_tp_load(ExpertModel* m, const float* whole) {
    float* shared = xmalloc(m->n_shared * sizeof(float));
    float* slices = xmalloc(m->tp.n * sizeof(float));
    relayout(m, (float*)whole, shared, slices, m->tp.rank, TO_MINE, 0);
    expert_zero_put(&m->z[ZERO_SHARED], shared);
    expert_zero_put(&m->z[ZERO_TP], slices);
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
    expert_zero_alloc(&m->z[ZERO_TP], m->zero, t->dpcpep, t->n, &t->w, &t->dw, &t->m, &t->v);  // --zero: composed_zero.h
    t->full = mem_alloc_floats((size_t)m->N * t->tp * C, MEM_ACTIVATIONS);
    t->dfull = mem_alloc_floats((size_t)m->N * t->tp * C, MEM_ACTIVATIONS);
}

void expert_tp_free(ExpertModel* m) {
    ExpertTP* t = &m->tp;
    if (t->tp == 1) return;
    mem_free(t->full), mem_free(t->dfull);  // the slices' buffers are z[ZERO_TP]'s
    comm_destroy_group(&t->dpcpep_own);
}
