// composed_attention.c: a layer's attention half as the mesh composes it,
// and a dense layer's MLP (--moe-every > 1).
//
// --tp (ExpertTP): attention mixes a sequence's tokens and is split by
// heads: chapter 6's Megatron half (sp_attention_forward: the all-gather,
// my NH/tp heads, the reduce-scatter), handed attention's core (below) and
// the zb queue. A dense MLP is chapter 6's too (my 4C/tp hidden units); the
// experts stay whole (docs/notes/07_composition.md says why). --cp: the
// core is chapter 6's ring or Ulysses over the cp group (without its
// --cp-overlap 0 and attention clock, which the capstone does not measure);
// this file says which of the slot's layer states it keeps. Neither:
// chapter 7's own (moe.h).
#include "composed_model.h"
#include "memory.h"
#include "sequence.h"  // chapter 6's Megatron attention and MLP halves: --tp

// ---------------------------------------------------------------- attention itself

// The attention's rows as chapter 6 sees them: the tp group's (tp.sh) and
// my NH/tp heads (tp = 1: my rows, every head).
static CPAttention over_cp(ExpertModel* m) {
    const int tp = m->tp.tp;
    return cp_attention_on(m->cp.cpc, &m->tp.sh, m->N * tp, m->cfg.gpt.channels / tp, m->cfg.gpt.num_heads / tp,
                           &m->cp.buf);
}

// Layer l's kept ring / Ulysses state in chapter 6's LayerActs (its a
// unused): each layer's own, or under --recompute full one for all.
static LayerActs kept(const ExpertModel* m, int l) {
    const ExpertSlot* s = m->slot;
    size_t i = m->recompute == RECOMPUTE_FULL ? 0 : (size_t)l, NC = (size_t)m->N * m->cfg.gpt.channels;
    LayerActs k = {.lse = s->lse + i * m->N * m->cfg.gpt.num_heads};
    if (s->qkv_h) k.qkv_h = s->qkv_h + i * 3 * NC, k.y_h = s->y_h + i * NC;
    return k;
}

// Chapter 6's AttentionCore (ctx: the model): a->qkv to a->atty, at cp = 1
// chapter 0's op, else the ring or Ulysses; backward datty to dqkv.
static void core_forward(void* ctx, int l, BlockActs* a) {
    ExpertModel* m = ctx;
    CPAttention at = over_cp(m);
    if (at.sh->cp == 1) {
        attention_flash_forward(a->atty, a->lse, a->qkv, at.sh->B, at.sh->T, at.C, at.NH);
        return;
    }
    LayerActs k = kept(m, l);
    if (m->cp.mode == CP_RING) cp_ring_forward(&at, a->qkv, a->atty, k.lse);
    else cp_ulysses_forward(&at, a->qkv, a->atty, k.lse, k.qkv_h, k.y_h);
}

static void core_backward(void* ctx, int l, const BlockActs* a, const float* datty, float* dqkv) {
    ExpertModel* m = ctx;
    CPAttention at = over_cp(m);
    if (at.sh->cp == 1) {
        attention_flash_backward(dqkv, datty, a->qkv, a->atty, a->lse, at.sh->B, at.sh->T, at.C, at.NH);
        return;
    }
    LayerActs k = kept(m, l);
    if (m->cp.mode == CP_RING) cp_ring_backward(&at, a->qkv, a->atty, k.lse, datty, dqkv);
    else cp_ulysses_backward(&at, k.qkv_h, k.y_h, k.lse, datty, dqkv);
}

// ---------------------------------------------------------------- the attention half: who runs it

// With --tp, chapter 6's attention half over the tp group, my rows in cp.sh's
// layout. a->qkv (N tp, 3C/tp) and a->atty (N tp, C/tp): the group's rows for
// my heads (the same floats as the GPT's N rows of 3C and C).
static SpAttention over_tp(ExpertModel* m, const AttentionCore* core, const WeightGradHook* wg) {
    const GPTConfig* c = &m->cfg.gpt;
    return (SpAttention){m->tp.tpc, m->N, m->tp.sh.T, c->channels, c->num_heads, m->tp.full, m->tp.dfull,
                         &m->cp.sh, core, wg};
}

void expert_attention_forward(ExpertModel* m, int l, const BlockParams* p, BlockActs* a, const float* x) {
    const int N = m->N, C = m->cfg.gpt.channels;
    if (m->tp.tp > 1) {
        AttentionCore core = {core_forward, core_backward, m, l};
        SpAttention v = over_tp(m, &core, NULL);
        sp_attention_forward(&v, p, a, x);  // a->res2 (N, C) my rows
        layernorm_forward(a->ln2, a->ln2_mean, a->ln2_rstd, a->res2, p->ln2w, p->ln2b, N, C);
        return;
    }
    moe_attention_in(p, a, x, N, C);   // moe_attention_forward's halves
    core_forward(m, l, a);             // around chapter 0's op, or the ring or Ulysses over cp
    moe_attention_out(p, a, x, N, C);
}

// dres: d res3 on entry, d x on return; dln2 (N, C) d ln2's output.
void expert_attention_backward(ExpertModel* m, int l, const BlockParams* p, BlockParams* g, const BlockActs* a,
                               const BlockScratch* s, const float* x, const float* dln2, float* dres) {
    const int N = m->N, C = m->cfg.gpt.channels;
    WeightGradHook wg = expert_wgrad(m, l);
    if (m->tp.tp > 1) {
        layernorm_backward(dres, g->ln2w, g->ln2b, dln2, a->res2, p->ln2w, a->ln2_mean, a->ln2_rstd, N, C);
        // attprojb over my rows of d res2 (the batch group's mean adds the
        // other tp ranks'); chapter 6's the rest
        weight_grad(&wg, NULL, g->attprojb, dres, NULL, N, C / m->tp.tp, C);
        BlockParams gs = *g;
        gs.attprojb = NULL;
        AttentionCore core = {core_forward, core_backward, m, l};
        SpAttention v = over_tp(m, &core, &wg);
        sp_attention_backward(&v, p, &gs, a, s, x, dres, s->dln);
        return;
    }
    moe_attention_backward_out(p, a, s, dln2, dres, N, C);  // s->datty; s->dqkv zeroed; d res2 kept
    core_backward(m, l, a, s->datty, s->dqkv);
    moe_attention_backward_in(p, g, a, s, x, dln2, dres, N, C, &wg);
}

// ---------------------------------------------------------------- a dense layer's MLP (--moe-every > 1)
// ln2 to a->fcproj: model.h's (at cp = tp = 1 block_forward's ops in its
// order: the same bits), or with --tp chapter 6's (my 4C/tp hidden units of
// the group's rows).
void expert_mlp_forward(ExpertModel* m, const BlockParams* p, BlockActs* a) {
    if (m->tp.tp > 1) sp_mlp_forward(m->tp.tpc, p, a, m->tp.full, m->N, m->cfg.gpt.channels);  // (N, C) my rows
    else mlp_forward(p, a, m->N, m->cfg.gpt.channels);
}

// acts.dres (d res3, which the residual passes to fcproj) to m->dln2.
void expert_mlp_backward(ExpertModel* m, int l, const BlockParams* p, BlockParams* g, const BlockActs* a,
                         const BlockScratch* s) {
    const int N = m->N, C = m->cfg.gpt.channels;
    const float* dres = m->slot->acts.dres;
    WeightGradHook wg = expert_wgrad(m, l);
    if (m->tp.tp == 1) {
        mlp_backward(p, g, a, m->dln2, dres, s->dfch_gelu, s->dfch, N, C, &wg);
        return;
    }
    // chapter 6's; fcprojb over my rows, as attprojb
    BlockParams gs = *g;
    gs.fcprojb = NULL;
    sp_mlp_backward(m->tp.tpc, p, &gs, a, m->dln2, dres, s->dfch_gelu, s->dfch, m->tp.full, m->tp.dfull, N, C, &wg);
    weight_grad(&wg, NULL, g->fcprojb, dres, NULL, N, C, C);
}
