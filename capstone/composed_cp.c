// composed_cp.c: context parallelism in chapter 7's attention (composed_model.h).
// Chapter 6's two algorithms, from chapter 6's modules: ring.c's layout
// (CPShard) and ring attention's compute with one K/V block in hand, and
// context.c's loops around them (the ring's sends and receives forward and
// backward, Ulysses' all-to-alls: cp_ring_forward, cp_ring_backward,
// cp_seq_to_heads, cp_heads_to_seq), called on this model's buffers
// without chapter 6's --cp-overlap 0 and attention clock, which the
// capstone does not measure. What stays here: which layer's state each
// call reads and writes (--recompute), the attention between Ulysses'
// exchanges, and the buffers.
#include <string.h>

#include "composed_model.h"
#include "memory.h"
#include "trace.h"

// The attention's rows, channels and heads: with --tp the tp group's rows
// (m->tp.sh, its B tp sequences) and this rank's NH/tp heads; at tp = 1 my
// rows and every head.
static void attn_dims(const ExpertModel* m, int* N, int* C, int* NH) {
    *N = m->N * m->tp.tp, *C = m->cfg.gpt.channels / m->tp.tp, *NH = m->cfg.gpt.num_heads / m->tp.tp;
}

// What chapter 6's ring and Ulysses exchanges work on (context.h): the cp
// group, the attention's rows (m->tp.sh), this model's buffers; every
// transfer overlapped, nothing timed.
static CPAttention over_cp(ExpertModel* m) {
    ExpertCP* cp = &m->cp;
    CPAttention a = {.cpc = cp->cpc, .sh = &m->tp.sh, .kv = {cp->kv[0], cp->kv[1]}, .dkv = {cp->dkv[0], cp->dkv[1]},
                     .dkv_in = cp->dkv_in, .ring = &cp->ring, .send = cp->send, .recv = cp->recv, .overlap = 1};
    attn_dims(m, &a.N, &a.C, &a.NH);
    return a;
}

// ---------------------------------------------------------------- the attention half

// Layer l's kept ring / Ulysses state: each layer's own, or one for every
// layer where --recompute full makes the whole layer's forward again before
// its backward (so the lse, and Ulysses' head-shard q|k|v and output too).
// Neither keeps probabilities: selective has nothing of attention to redo.
static size_t kept_layer(const ExpertModel* m, int l) { return m->recompute == RECOMPUTE_FULL ? 0 : (size_t)l; }
static float* layer_lse(ExpertModel* m, int l) { return m->cp.lse + kept_layer(m, l) * m->N * m->cfg.gpt.num_heads; }
static float* layer_qkv_h(ExpertModel* m, int l) {
    return m->cp.qkv_h + kept_layer(m, l) * m->N * 3 * m->cfg.gpt.channels;
}
static float* layer_y_h(ExpertModel* m, int l) { return m->cp.y_h + kept_layer(m, l) * m->N * m->cfg.gpt.channels; }

void expert_attention_core_forward(ExpertModel* m, int l, BlockActs* a) {
    int N, C, NH;
    attn_dims(m, &N, &C, &NH);
    const int n = m->cp.sh.cp;
    const CPShard* sh = &m->tp.sh;
    if (n == 1) {
        attention_flash_forward(a->atty, a->lse, a->qkv, sh->B, sh->T, C, NH);
    } else if (m->cp.mode == CP_RING) {
        CPAttention at = over_cp(m);
        cp_ring_forward(&at, a->qkv, a->atty, layer_lse(m, l));
    } else {
        // whole sequences, NH/cp heads: chapter 0's attention on C/cp channels
        CPAttention at = over_cp(m);
        cp_seq_to_heads(&at, layer_qkv_h(m, l), a->qkv, 3);
        attention_flash_forward(layer_y_h(m, l), layer_lse(m, l), layer_qkv_h(m, l), sh->B, sh->T, C / n, NH / n);
        cp_heads_to_seq(&at, a->atty, layer_y_h(m, l), 1);
    }
}

void expert_attention_core_backward(ExpertModel* m, int l, const BlockActs* a, const BlockScratch* s) {
    int N, C, NH;
    attn_dims(m, &N, &C, &NH);
    const int n = m->cp.sh.cp;
    const CPShard* sh = &m->tp.sh;
    ExpertCP* cp = &m->cp;
    if (n == 1) {
        attention_flash_backward(s->dqkv, s->datty, a->qkv, a->atty, a->lse, sh->B, sh->T, C, NH);
    } else if (m->cp.mode == CP_RING) {
        CPAttention at = over_cp(m);
        cp_ring_backward(&at, a->qkv, a->atty, layer_lse(m, l), s->datty, s->dqkv);
    } else {
        CPAttention at = over_cp(m);
        cp_seq_to_heads(&at, cp->dy_h, s->datty, 1);
        ops_zero(cp->dqkv_h, (size_t)N * 3 * C);
        attention_flash_backward(cp->dqkv_h, cp->dy_h, layer_qkv_h(m, l), layer_y_h(m, l), layer_lse(m, l), sh->B,
                                 sh->T, C / n, NH / n);
        cp_heads_to_seq(&at, s->dqkv, cp->dqkv_h, 3);
    }
}

// ---------------------------------------------------------------- buffers

void expert_cp_create(ExpertModel* m) {
    ExpertCP* cp = &m->cp;
    const int C = m->cfg.gpt.channels, NH = m->cfg.gpt.num_heads, L = m->cfg.gpt.num_layers;
    const size_t NC = (size_t)m->N * C;
    if ((cp->sh.cp > 1 || m->tp.tp > 1) && m->cfg.moe_every > 1) {  // a dense layer's MLP gradients (N, 4C)
        cp->dfch_gelu = mem_alloc_floats(4 * NC, MEM_ACTIVATIONS);
        cp->dfch = mem_alloc_floats(4 * NC, MEM_ACTIVATIONS);
    }
    if (cp->sh.cp == 1) return;
    // with --tp the attention's N tp rows of 1/tp of the channels and heads:
    // the same floats as my N rows of all of them. Each layer's state, or
    // one layer's where --recompute full makes it again (kept_layer above)
    const size_t Lf = m->recompute == RECOMPUTE_FULL ? 1 : (size_t)L;
    cp->lse = mem_alloc_floats(Lf * m->N * NH, MEM_ACTIVATIONS);
    if (cp->mode == CP_RING) {
        for (int i = 0; i < 2; i++) {
            cp->kv[i] = mem_alloc_floats(2 * NC, MEM_COMM);
            cp->dkv[i] = mem_alloc_floats(2 * NC, MEM_COMM);
        }
        cp->dkv_in = mem_alloc_floats(2 * NC, MEM_COMM);
        // one (query part, key part) pair's partials: at most my N rows
        cp->ring.o2 = mem_alloc_floats(NC, MEM_ACTIVATIONS);
        cp->ring.m2 = mem_alloc_floats((size_t)m->N * NH, MEM_ACTIVATIONS);
        cp->ring.l2 = mem_alloc_floats((size_t)m->N * NH, MEM_ACTIVATIONS);
        cp->ring.sumexp = mem_alloc_floats((size_t)m->N * NH, MEM_ACTIVATIONS);
    } else {
        // the head shard's q|k|v and output over whole sequences, per layer:
        // (B, T, 4C/cp) = 4 N C floats
        cp->qkv_h = mem_alloc_floats(Lf * 3 * NC, MEM_ACTIVATIONS);
        cp->y_h = mem_alloc_floats(Lf * NC, MEM_ACTIVATIONS);
        cp->send = mem_alloc_floats(3 * NC, MEM_COMM);
        cp->recv = mem_alloc_floats(3 * NC, MEM_COMM);
        cp->dy_h = mem_alloc_floats(NC, MEM_ACTIVATIONS);
        cp->dqkv_h = mem_alloc_floats(3 * NC, MEM_ACTIVATIONS);
    }
}

void expert_cp_free(ExpertModel* m) {
    ExpertCP* cp = &m->cp;
    float* bufs[] = {cp->lse, cp->kv[0], cp->kv[1], cp->dkv[0], cp->dkv[1], cp->dkv_in, cp->ring.o2, cp->ring.m2,
                     cp->ring.l2, cp->ring.sumexp, cp->qkv_h, cp->y_h, cp->send, cp->recv, cp->dy_h, cp->dqkv_h,
                     cp->dfch_gelu, cp->dfch};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++)
        if (bufs[i]) mem_free(bufs[i]);
}
