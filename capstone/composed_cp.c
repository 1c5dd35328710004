// composed_cp.c: context parallelism in chapter 7's attention (composed_model.h).
// Chapter 6's two algorithms, on chapter 6's modules: ring.c's layout
// (CPShard) and ring attention's compute with one K/V block in hand; the
// sends, receives and all-to-alls around them follow 06_sequence_context/
// main.c's (without its --cp-overlap 0 and its attention clock, which
// chapter 7 does not measure). Every loop here is over ranks, parts and
// sequences, never over tensor data: the data moves in ops.h's copies.
#include <string.h>

#include "composed_model.h"
#include "exercise.h"
#include "memory.h"
#include "trace.h"

// The attention's rows, channels and heads: with --tp the tp group's rows
// (m->tp.sh, its B tp sequences) and this rank's NH/tp heads; at tp = 1 my
// rows and every head.
static void attn_dims(const ExpertModel* m, int* N, int* C, int* NH) {
    *N = m->N * m->tp.tp, *C = m->cfg.gpt.channels / m->tp.tp, *NH = m->cfg.gpt.num_heads / m->tp.tp;
}

// ---------------------------------------------------------------- ring attention
// At step s the block in hand is the K/V of cp rank src = r - s: it goes on
// to the right while I compute with it, and the next arrives from the left.
static void ring_forward(ExpertModel* m, const float* qkv, float* atty, float* lse) {
    ExpertCP* cp = &m->cp;
    int N, C, NH;
    attn_dims(m, &N, &C, &NH);
    const int n = cp->cpc->size, r = cp->cpc->rank, right = (r + 1) % n, left = (r - 1 + n) % n;
    const size_t kv_count = (size_t)N * 2 * C;
    ops_copy_2d(cp->kv[0], 2 * C, qkv + C, 3 * C, N, 2 * C);  // only K and V travel
    ring_forward_begin(&cp->ring);
    for (int s = 0; s < n; s++) {
        const float* kv = cp->kv[s % 2];
        CommRequest to_right = {0}, from_left = {0};
        if (s < n - 1) {
            comm_irecv(cp->cpc, cp->kv[(s + 1) % 2], kv_count, left, &from_left);
            comm_isend(cp->cpc, kv, kv_count, right, &to_right);
        }
        ring_forward_block(&m->tp.sh, &cp->ring, qkv, kv, (r - s + n) % n, atty, lse, C, NH);
        comm_wait(&from_left);
        comm_wait(&to_right);
    }
    ring_forward_finish(&m->tp.sh, &cp->ring, atty, lse, C, NH);
}

// The K/V blocks go around again; each rank adds its queries' share of
// dK|dV into the partial sum that arrived with the block and passes it on;
// after cp hops it is home (chapter 6's ring_attention_backward).
static void ring_backward(ExpertModel* m, const float* qkv, const float* atty, const float* lse, const float* datty,
                          float* dqkv) {
    // COPY OF CHAPTER 6 EXERCISE 3: chapter 6's ring backward on chapter 7's buffers: stubbed in every tree that stubs that exercise
    ExpertCP* cp = &m->cp;
    int N, C, NH;
    attn_dims(m, &N, &C, &NH);
    const int n = cp->cpc->size, r = cp->cpc->rank, right = (r + 1) % n, left = (r - 1 + n) % n;
    const size_t kv_count = (size_t)N * 2 * C;
    ops_copy_2d(cp->kv[0], 2 * C, qkv + C, 3 * C, N, 2 * C);
    CommRequest d_to_right = {0}, d_from_left = {0};
    for (int s = 0; s < n; s++) {
        const float* kv = cp->kv[s % 2];
        float* dkv = cp->dkv[s % 2];  // the other one may still be on its way right
        CommRequest to_right = {0}, from_left = {0};
        if (s < n - 1) {
            comm_irecv(cp->cpc, cp->kv[(s + 1) % 2], kv_count, left, &from_left);
            comm_isend(cp->cpc, kv, kv_count, right, &to_right);
        }
        ops_zero(dkv, kv_count);
        ring_backward_block(&m->tp.sh, qkv, atty, lse, datty, kv, (r - s + n) % n, dqkv, dkv, C, NH);
        if (s > 0) {  // what the ranks before me added for src's keys
            comm_wait(&d_from_left);
            comm_wait(&d_to_right);
            ops_add(dkv, cp->dkv_in, kv_count);
        }
        comm_irecv(cp->cpc, cp->dkv_in, kv_count, left, &d_from_left);
        comm_isend(cp->cpc, dkv, kv_count, right, &d_to_right);
        comm_wait(&from_left);
        comm_wait(&to_right);
    }
    comm_wait(&d_from_left);
    comm_wait(&d_to_right);
    ops_copy_2d(dqkv + C, 3 * C, cp->dkv_in, 2 * C, N, 2 * C);  // d of my keys and values, home
    // END COPY OF CHAPTER 6 EXERCISE 3
}

// ---------------------------------------------------------------- Ulysses attention
// Sequence shards to head shards: src (N, w*C), w tensors of C channels per
// token for my tokens and every head; dst (B, T, w*C/cp) the same w tensors
// for every token of the B sequences and my head group's C/cp channels.
static void seq_to_heads(ExpertModel* m, float* dst, const float* src, int w) {
    // COPY OF CHAPTER 6 EXERCISE 4: chapter 6's Ulysses exchange on chapter 7's buffers: stubbed in every tree that stubs that exercise
    const ExpertCP* cp = &m->cp;
    const CPShard* sh = &m->tp.sh;
    int N, C, NH;
    attn_dims(m, &N, &C, &NH);
    const int n = sh->cp, c = C / n, wc = w * c;
    const size_t block = (size_t)N * wc;
    for (int j = 0; j < n; j++)
        for (int t = 0; t < w; t++) ops_copy_2d(cp->send + j * block + t * c, wc, src + t * C + j * c, w * C, N, c);
    comm_alltoall(cp->cpc, cp->send, cp->recv, block);
    for (int s = 0; s < n; s++)
        for (int p = 0; p < sh->parts; p++)
            for (int b = 0; b < sh->B; b++)
                ops_copy(dst + ((size_t)b * sh->T + cp_shard_pos(sh, s, p)) * wc,
                         cp->recv + s * block + ((size_t)p * sh->B + b) * sh->len * wc, (size_t)sh->len * wc);
    // END COPY OF CHAPTER 6 EXERCISE 4
}

// Head shards back to sequence shards: the inverse of seq_to_heads.
static void heads_to_seq(ExpertModel* m, float* dst, const float* src, int w) {
    const ExpertCP* cp = &m->cp;
    const CPShard* sh = &m->tp.sh;
    int N, C, NH;
    attn_dims(m, &N, &C, &NH);
    const int n = sh->cp, c = C / n, wc = w * c;
    const size_t block = (size_t)N * wc;
    for (int s = 0; s < n; s++)
        for (int p = 0; p < sh->parts; p++)
            for (int b = 0; b < sh->B; b++)
                ops_copy(cp->send + s * block + ((size_t)p * sh->B + b) * sh->len * wc,
                         src + ((size_t)b * sh->T + cp_shard_pos(sh, s, p)) * wc, (size_t)sh->len * wc);
    comm_alltoall(cp->cpc, cp->send, cp->recv, block);
    for (int j = 0; j < n; j++)
        for (int t = 0; t < w; t++) ops_copy_2d(dst + t * C + j * c, w * C, cp->recv + j * block + t * c, wc, N, c);
}

// ---------------------------------------------------------------- the attention half

// Layer l's kept ring / Ulysses state: each layer's own, or one for every
// layer where --recompute makes it again before the layer's backward (full:
// the whole layer's forward, so the lse and the head-shard q|k|v too;
// selective and full: the Ulysses probabilities).
static float* layer_lse(ExpertModel* m, int l) {
    return m->cp.lse + (size_t)(m->recompute == RECOMPUTE_FULL ? 0 : l) * m->N * m->cfg.gpt.num_heads;
}
static float* layer_qkv_h(ExpertModel* m, int l) {
    return m->cp.qkv_h + (size_t)(m->recompute == RECOMPUTE_FULL ? 0 : l) * m->N * 3 * m->cfg.gpt.channels;
}
static float* layer_att_h(ExpertModel* m, int l) {
    return m->cp.att_h + (size_t)(m->recompute == RECOMPUTE_NONE ? l : 0) * m->N * m->cfg.gpt.num_heads * m->cp.sh.T;
}

void expert_attention_core_forward(ExpertModel* m, int l, BlockActs* a) {
    int N, C, NH;
    attn_dims(m, &N, &C, &NH);
    const int n = m->cp.sh.cp;
    const CPShard* sh = &m->tp.sh;
    if (n == 1) {
        attention_forward(a->atty, a->att, a->qkv, sh->B, sh->T, C, NH);
    } else if (m->cp.mode == CP_RING) {
        ring_forward(m, a->qkv, a->atty, layer_lse(m, l));
    } else {
        // whole sequences, NH/cp heads: chapter 0's attention on C/cp channels
        seq_to_heads(m, layer_qkv_h(m, l), a->qkv, 3);
        attention_forward(m->cp.y_h, layer_att_h(m, l), layer_qkv_h(m, l), sh->B, sh->T, C / n, NH / n);
        heads_to_seq(m, a->atty, m->cp.y_h, 1);
    }
}

void expert_attention_core_backward(ExpertModel* m, int l, const BlockActs* a, const BlockScratch* s) {
    int N, C, NH;
    attn_dims(m, &N, &C, &NH);
    const int n = m->cp.sh.cp;
    const CPShard* sh = &m->tp.sh;
    ExpertCP* cp = &m->cp;
    if (n == 1) {
        attention_backward(s->dqkv, s->datt, s->datty, a->qkv, a->att, sh->B, sh->T, C, NH);
    } else if (m->cp.mode == CP_RING) {
        ring_backward(m, a->qkv, a->atty, layer_lse(m, l), s->datty, s->dqkv);
    } else {
        seq_to_heads(m, cp->y_h, s->datty, 1);
        ops_zero(cp->dqkv_h, (size_t)N * 3 * C);
        attention_backward(cp->dqkv_h, cp->datt_h, cp->y_h, layer_qkv_h(m, l), layer_att_h(m, l), sh->B, sh->T, C / n,
                           NH / n);
        heads_to_seq(m, s->dqkv, cp->dqkv_h, 3);
    }
}

void expert_attention_core_recompute(ExpertModel* m, int l, BlockActs* a) {
    int N, C, NH;
    attn_dims(m, &N, &C, &NH);  // with --tp: my heads over the tp group's rows
    const int n = m->cp.sh.cp;
    const CPShard* sh = &m->tp.sh;
    if (n == 1) {
        // as model.c: attention_forward rewrites atty (kept, the same bits)
        // into attproj's slot, which backward never reads
        attention_forward(a->attproj, a->att, a->qkv, sh->B, sh->T, C, NH);
    } else if (m->cp.mode == CP_ULYSSES) {
        // my head shard's probabilities from its kept q, k, v; the output
        // again into the scratch y_h
        attention_forward(m->cp.y_h, layer_att_h(m, l), layer_qkv_h(m, l), sh->B, sh->T, C / n, NH / n);
    }
    // ring: its backward reads q, k, v, the output and the lse, all kept
}

// ---------------------------------------------------------------- buffers

void expert_cp_create(ExpertModel* m) {
    ExpertCP* cp = &m->cp;
    const int C = m->cfg.gpt.channels, NH = m->cfg.gpt.num_heads, L = m->cfg.gpt.num_layers, T = cp->sh.T;
    const size_t NC = (size_t)m->N * C;
    if ((cp->sh.cp > 1 || m->tp.tp > 1) && m->cfg.moe_every > 1) {  // a dense layer's MLP gradients (N, 4C)
        cp->dfch_gelu = mem_alloc_floats(4 * NC, MEM_ACTIVATIONS);
        cp->dfch = mem_alloc_floats(4 * NC, MEM_ACTIVATIONS);
    }
    if (cp->sh.cp == 1) return;
    // with --tp the attention's N tp rows of 1/tp of the channels and heads:
    // the same floats as my N rows of all of them. Each layer's state, or
    // one layer's where --recompute makes it again (the layer_ functions above)
    const size_t Lf = m->recompute == RECOMPUTE_FULL ? 1 : (size_t)L, Lp = m->recompute == RECOMPUTE_NONE ? (size_t)L : 1;
    if (cp->mode == CP_RING) {
        cp->lse = mem_alloc_floats(Lf * m->N * NH, MEM_ACTIVATIONS);
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
        // (B, NH/cp, T, T) = N NH T floats of probabilities per layer
        cp->qkv_h = mem_alloc_floats(Lf * 3 * NC, MEM_ACTIVATIONS);
        cp->att_h = mem_alloc_floats(Lp * m->N * NH * T, MEM_ACTIVATIONS);
        cp->send = mem_alloc_floats(3 * NC, MEM_COMM);
        cp->recv = mem_alloc_floats(3 * NC, MEM_COMM);
        cp->y_h = mem_alloc_floats(NC, MEM_ACTIVATIONS);
        cp->dqkv_h = mem_alloc_floats(3 * NC, MEM_ACTIVATIONS);
        cp->datt_h = mem_alloc_floats((size_t)m->N * NH * T, MEM_ACTIVATIONS);
    }
}

void expert_cp_free(ExpertModel* m) {
    ExpertCP* cp = &m->cp;
    float* bufs[] = {cp->lse, cp->kv[0], cp->kv[1], cp->dkv[0], cp->dkv[1], cp->dkv_in, cp->ring.o2, cp->ring.m2,
                     cp->ring.l2, cp->ring.sumexp, cp->qkv_h, cp->att_h, cp->send, cp->recv, cp->y_h, cp->dqkv_h,
                     cp->datt_h, cp->dfch_gelu, cp->dfch};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++)
        if (bufs[i]) mem_free(bufs[i]);
}
