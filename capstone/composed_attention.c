// composed_attention.c: the attention half of a layer as the mesh composes
// it (composed_model.h), and a dense layer (--moe-every > 1) around it: with
// --tp the tp group's attention (composed_tp.c), at cp > 1 the ring or
// Ulysses over cp (composed_cp.c), else chapter 7's own (moe.h). It picks;
// the files below it never call back.
#include "composed_model.h"
#include "sequence.h"  // chapter 6's Megatron MLP: a dense layer under --tp
#include "trace.h"

void expert_attention_forward(ExpertModel* m, int l, const BlockParams* p, BlockActs* a, const float* x) {
    const int C = m->cfg.gpt.channels, NH = m->cfg.gpt.num_heads, n = m->cp.sh.cp;
    if (m->tp.tp > 1) {
        expert_tp_attention_forward(m, l, p, a, x);  // composed_tp.c
        return;
    }
    if (n == 1) {
        moe_attention_forward(p, a, x, m->B, m->T, C, NH);
        return;
    }
    moe_attention_in(p, a, x, m->N, C);
    expert_attention_core_forward(m, l, a);  // the ring or Ulysses over cp
    moe_attention_out(p, a, x, m->N, C);
}

void expert_attention_backward(ExpertModel* m, int l, const BlockParams* p, BlockParams* g, const BlockActs* a,
                               const BlockScratch* s, const float* x, const float* dln2, float* dres) {
    const int C = m->cfg.gpt.channels, NH = m->cfg.gpt.num_heads, n = m->cp.sh.cp;
    if (m->tp.tp > 1) {
        expert_tp_attention_backward(m, l, p, g, a, s, x, dln2, dres);
        return;
    }
    const int N = m->N;
    moe_attention_backward_out(p, a, s, dln2, dres, N, C);  // s->datty; s->dqkv zeroed; d res2 kept
    if (n == 1)  // moe_attention_backward's own order
        attention_flash_backward(s->dqkv, s->datty, a->qkv, a->atty, a->lse, m->B, m->T, C, NH);
    else
        expert_attention_core_backward(m, l, a, s);  // the ring or Ulysses over cp
    // the input half and the LayerNorms' weights; the two matmuls' weights
    // at once or (zb) queued for W (composed_wgrad.c)
    BlockParams gi = *g;
    gi.attprojw = gi.attprojb = gi.qkvw = gi.qkvb = NULL;
    moe_attention_backward_in(p, &gi, a, s, x, dln2, dres, N, C);
    expert_wgrad(m, l, g->attprojw, g->attprojb, s->dfch_gelu, a->atty, N, C, C);
    expert_wgrad(m, l, g->qkvw, g->qkvb, s->dqkv, a->ln1, N, C, 3 * C);
}

// ---------------------------------------------------------------- a dense layer (--moe-every > 1)
// model.h's block at cp = tp = 1; else the same attention half as an MoE
// layer's (above), then the dense MLP into a: on my rows, or with --tp
// chapter 6's (sequence.h: my 4C/tp hidden units of the group's N tp rows,
// in a->fch, the same floats as N rows of 4C).
static void dense_forward(ExpertModel* m, int l, const BlockParams* p, BlockActs* a) {
    const int N = m->N, C = m->cfg.gpt.channels;
    expert_attention_forward(m, l, p, a, gpt_acts_block_input(&m->acts, &m->cfg.gpt, l, m->B, m->T));
    if (m->tp.tp > 1) sp_mlp_forward(m->tp.tpc, p, a, m->tp.full, N, C);  // (N, C) my rows
    else {
        matmul_forward(a->fch, a->ln2, p->fcw, p->fcb, N, C, 4 * C);
        gelu_forward(a->fch_gelu, a->fch, (size_t)N * 4 * C);
        matmul_forward(a->fcproj, a->fch_gelu, p->fcprojw, p->fcprojb, N, 4 * C, C);
    }
    residual_forward(a->res3, a->res2, a->fcproj, (size_t)N * C);
}

void expert_dense_forward(ExpertModel* m, int l, const BlockParams* p) {
    if (m->cp.sh.cp == 1 && m->tp.tp == 1) {
        gpt_block_forward(&m->acts, &m->cfg.gpt, l, p, m->B, m->T);
        return;
    }
    double t0 = trace_start();
    BlockActs a = expert_block_acts(m, l);
    dense_forward(m, l, p, &a);
    trace_compute(t0, "block %d forward", l);
}

// acts.dres: d res3 on entry, d x on return; the MLP's weight gradients
// first, then the attention half's (expert_attention_backward). A split
// backward (zb) takes this path at cp = tp = 1 too: model.c's block
// computes its weight gradients inside, this one passes them to
// expert_wgrad (queued for W). At cp > 1, with --tp or split,
// --recompute makes what it dropped again first, as model.h's
// blocks do: selective gelu(fch) (attention kept its lse, no
// probabilities), full the whole layer into the transient (its attention's
// exchanges too: the ring or all-to-alls, tp's all-gather and reduce-scatter).
void expert_dense_backward(ExpertModel* m, int l, const BlockParams* p, BlockParams* g) {
    const GPTConfig* cfg = &m->cfg.gpt;
    if (m->cp.sh.cp == 1 && m->tp.tp == 1 && !m->split) {
        gpt_block_backward(&m->acts, cfg, l, p, g, m->B, m->T);
        return;
    }
    const int N = m->N, C = cfg->channels;
    const size_t N4C = (size_t)N * 4 * C;
    double t0 = trace_start();
    BlockActs a = expert_block_acts(m, l);
    if (m->recompute != RECOMPUTE_NONE) {
        double t1 = trace_start();
        if (m->recompute == RECOMPUTE_SELECTIVE) {
            gelu_forward(a.fch_gelu, a.fch, N4C);
        } else {
            a = block_acts_at(m->acts.transient, m->B, m->T, C, cfg->num_heads);
            dense_forward(m, l, p, &a);
        }
        trace_compute(t1, "block %d recompute", l);
    }
    BlockScratch s = gpt_acts_scratch(&m->acts, cfg);
    float* dres = m->acts.dres;
    if (m->tp.tp > 1) {
        // chapter 6's, the weight gradients at once or (zb) queued; fcprojb's
        // over my rows (the batch group's mean adds the rest, as attprojb's)
        BlockParams gs = *g;
        gs.fcprojb = NULL;
        SpWeightGrad wg = {expert_wgrad_hook, m, l};
        sp_mlp_backward(m->tp.tpc, p, &gs, &a, m->dln2, dres, m->cp.dfch_gelu, m->cp.dfch, m->tp.full, m->tp.dfull, N,
                        C, &wg);
        expert_wgrad(m, l, NULL, g->fcprojb, dres, NULL, N, C, C);
    } else {
        ops_zero(m->cp.dfch_gelu, N4C);
        matmul_backward(m->cp.dfch_gelu, NULL, NULL, dres, NULL, p->fcprojw, N, 4 * C, C);
        expert_wgrad(m, l, g->fcprojw, g->fcprojb, dres, a.fch_gelu, N, 4 * C, C);  // zb: queued for W
        ops_zero(m->cp.dfch, N4C);
        gelu_backward(m->cp.dfch, a.fch, m->cp.dfch_gelu, N4C);
        ops_zero(m->dln2, (size_t)N * C);
        matmul_backward(m->dln2, NULL, NULL, m->cp.dfch, NULL, p->fcw, N, C, 4 * C);
        expert_wgrad(m, l, g->fcw, g->fcb, m->cp.dfch, a.ln2, N, C, 4 * C);
    }
    expert_attention_backward(m, l, p, g, &a, &s, gpt_acts_block_input(&m->acts, cfg, l, m->B, m->T), m->dln2, dres);
    trace_compute(t0, "block %d backward", l);
}

