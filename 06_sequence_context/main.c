// Chapter 6: sequence and context parallelism.
//
// Long sequences: a block's activations grow with T and attention's work with
// T^2, so one rank runs out of memory (and time) long before the model does.
// This chapter cuts the SEQUENCE over ranks.
//
// Context parallelism (--cp N): the weights are replicated over the cp axis
// (as over dp); each cp rank holds T/cp tokens of every sequence of its dp
// group's share and runs the whole model on them: embedding, LayerNorms,
// matmuls, GELU, residuals, head and loss are all per token, so they need
// nothing from the other ranks. Attention alone does: a query must see the
// keys and values of every earlier position, and those live on other ranks.
//
//   --cp-mode ring      each rank keeps its queries; the K/V blocks travel
//                       around the ring of cp ranks, one hop per step, sent
//                       non-blocking while the rank computes attention with
//                       the block in hand; the partial softmaxes are merged
//                       by the online-softmax rule (ops.h). Backward sends
//                       K/V around again, and dK/dV travel with them, home.
//   --cp-mode ulysses   one all-to-all turns "my T/cp tokens, all heads" into
//                       "all T tokens, my NH/cp heads"; attention runs whole
//                       on those heads; one all-to-all turns it back.
//   --cp-balance zigzag with causal attention a plain cut leaves the last
//                       rank with most of the work (its queries see every
//                       key); zigzag gives rank r the half-chunks r and
//                       2cp-1-r, one early and one late, so all do the same.
//
// The gradient of a replicated weight is the sum of every token's share, and
// the tokens of the global batch are spread over dp x cp: one all-reduce over
// that group (mean over ranks of each rank's mean = the global mean).
//
//   mpirun -np 4 build/chapter-6 --cp 4 --cp-mode ring --cp-balance zigzag
//
// Sequence parallelism (--tp N --sp, Megatron) is sequence.c's; main() picks.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "args.h"
#include "ckpt.h"
#include "comm.h"
#include "common.h"
#include "memory.h"
#include "mesh.h"
#include "model.h"
#include "report.h"
#include "runtime.h"
#include "trace.h"
#include "train.h"

#include "ring.h"
#include "sequence.h"

typedef enum { CP_RING, CP_ULYSSES } CPMode;
static const char* cp_mode_names[] = {"ring", "ulysses"};
typedef enum { BALANCE_NONE, BALANCE_ZIGZAG } CPBalance;
static const char* balance_names[] = {"none", "zigzag"};

// ---------------------------------------------------------------- who holds which tokens
// The layout (CPShard) and the compute of ring attention with one K/V block
// in hand live in ring.c beside this file (tests/test_ring.c runs them over
// a simulated ring); the communication is here.
//
//   balance none, cp = 4, T = 16        balance zigzag, cp = 4, T = 16
//   positions 0-3  4-7  8-11 12-15      0-1 2-3 4-5 6-7 8-9 10-11 12-13 14-15
//   rank      0    1    2    3          0   1   2   3   3   2     1     0

// ---------------------------------------------------------------- the model on a cp rank
typedef struct {
    BlockActs a;   // the block's activations on my N tokens (a.att unused)
    float* lse;    // ring: (N, NH) log-sum-exp of each (token, head): all backward needs of the softmax
    float* qkv_h;  // ulysses: (B, T, 3C/cp) my heads' q, k, v for the whole sequences
    float* att_h;  // ulysses: (B, NH/cp, T, T) their softmax probabilities
} LayerActs;

typedef struct {
    GPTConfig cfg;
    CPMode mode;
    CPShard sh;
    const Comm* cpc;    // the ring / all-to-all group
    Comm dpcp;          // every rank holding the same weights: the gradient group
    int N;              // my token rows: B * T / cp
    size_t P;
    float *params, *grads, *m, *v;  // full replica, flat layout (model.h)
    // activations
    float* encoded;  // (N, C)
    RecomputeMode recompute;
    float* layers;     // L x layer_numel: what each layer keeps
    size_t layer_numel;
    float* transient;  // transient_numel: what --recompute drops, one layer at a time (NULL for none)
    size_t transient_numel;
    float* head;     // head_acts_numel(1, N, C, Vp)
    int *inputs, *targets;  // (N) on the device, my rows
    float* losses_host;     // (N)
    // backward
    float *dres, *dln, *stash, *dfch_gelu, *datty;
    // ring buffers: packed [k | v] rows (N, 2C), the block in hand and the
    // next; dK|dV partial sums (N, 2C) two deep (one may still be sending)
    // and the one arriving; the partials of one pair and the running sumexp
    float *kv[2], *dkv[2], *dkv_in;
    RingForward ring;  // the running partials of my queries (ring.h)
    // ulysses buffers: all-to-all send and receive (N, 3C); my heads'
    // attention output or its gradient (B, T, C/cp), dqkv (B, T, 3C/cp),
    // datt (B, NH/cp, T, T)
    float *send, *recv, *y_h, *dqkv_h, *datt_h;
    // what the chapter measures
    int overlap;          // --cp-overlap: 1 computes while a block travels, 0 waits for it first
    double ring_wait_seconds;  // inside the ring's waits: the communication the attention did not hide
    double attn_seconds;  // attention compute (not waiting), this rank
    long attn_scores;     // unmasked scores computed in forward, this rank (ulysses; the ring's in ring)
} CPModel;

// ---------------------------------------------------------------- what a layer keeps (--recompute)
// A layer's fields sit in its store (kept for backward) or in the one
// transient every layer shares (dropped, recomputed in backward), as chapter
// 0's block_acts_kept splits them (docs/recompute.md):
//   none       everything in the store
//   selective  attproj, fcproj (backward never reads them) and fch_gelu go to
//              the transient, and Ulysses' probabilities att_h; the ring
//              keeps no probabilities at all (lse is its whole softmax
//              state), so its attention has nothing to recompute
//   full       only res3, the block's output, stays; backward reruns the
//              whole block, its ring passes or all-to-alls included
enum { KEPT, DROPPED };

static float* place(float* const base[2], size_t at[2], int where, size_t n) {
    float* p = base[where] ? base[where] + at[where] : NULL;
    at[where] += n;
    return p;
}

// The view of one layer (either base may be NULL: then only numel, the
// floats of the store and of the transient, is of use).
static LayerActs cp_layout(CPMode mode, RecomputeMode r, float* store, float* transient, int N, int C, int NH,
                           int T, size_t numel[2]) {
    float* const base[2] = {store, transient};
    size_t at[2] = {0, 0}, NC = (size_t)N * C;
    int K = r == RECOMPUTE_FULL ? DROPPED : KEPT;     // the matmul outputs and LayerNorms
    int D = r == RECOMPUTE_NONE ? KEPT : DROPPED;     // what selective drops too
    LayerActs la = {0};
    BlockActs* a = &la.a;
    a->ln1 = place(base, at, K, NC);
    a->ln1_mean = place(base, at, K, N);
    a->ln1_rstd = place(base, at, K, N);
    a->qkv = place(base, at, K, 3 * NC);
    a->atty = place(base, at, K, NC);
    a->attproj = place(base, at, D, NC);
    a->res2 = place(base, at, K, NC);
    a->ln2 = place(base, at, K, NC);
    a->ln2_mean = place(base, at, K, N);
    a->ln2_rstd = place(base, at, K, N);
    a->fch = place(base, at, K, 4 * NC);
    a->fch_gelu = place(base, at, D, 4 * NC);
    a->fcproj = place(base, at, D, NC);
    a->res3 = place(base, at, KEPT, NC);  // always kept: the next block's input
    if (mode == CP_RING) {
        la.lse = place(base, at, K, (size_t)N * NH);
    } else {
        la.qkv_h = place(base, at, K, 3 * NC);
        la.att_h = place(base, at, D, (size_t)N * NH * T);
    }
    if (numel) numel[0] = at[0], numel[1] = at[1];
    return la;
}

// Layer l as forward writes it.
static LayerActs layer_at(const CPModel* m, int l) {
    return cp_layout(m->mode, m->recompute, m->layers + (size_t)l * m->layer_numel, m->transient, m->N,
                     m->cfg.channels, m->cfg.num_heads, m->sh.T, NULL);
}

// Floats per layer (store) and of the transient. With none a layer keeps
// the block's 18C + 4 per token, plus ring: NH (lse); ulysses: 3C (my heads'
// qkv for whole sequences: B*T*3C/cp = N*3C) and NH*T (their probabilities:
// B*(NH/cp)*T*T = N*NH*T). Full's transient holds a whole layer (its res3
// too: the recompute writes its own copy and leaves the kept one alone).
static void layer_numels(CPMode mode, RecomputeMode r, int N, int C, int NH, int T, size_t* store,
                         size_t* transient) {
    size_t numel[2], whole[2];
    cp_layout(mode, r, NULL, NULL, N, C, NH, T, numel);
    cp_layout(mode, RECOMPUTE_NONE, NULL, NULL, N, C, NH, T, whole);
    *store = numel[KEPT];
    *transient = r == RECOMPUTE_FULL ? whole[KEPT] : numel[DROPPED];
}

// ---------------------------------------------------------------- ring attention
// A ring transfer completed, the time spent waiting for it counted: the part
// of the ring's communication the attention in hand did not hide. With
// --cp-overlap 0 each transfer is waited for as soon as it is posted, before
// the compute it would overlap: then every wait is the whole transfer.
static void ring_wait(CPModel* m, CommRequest* r) {
    double w0 = comm_wait_seconds();  // the wait alone (CUDA's comm_wait drains queued compute first)
    comm_wait(r);
    m->ring_wait_seconds += comm_wait_seconds() - w0;
}

// Forward. qkv (N, 3C) holds my tokens' queries, keys and values; atty
// (N, C) gets my queries' attention output, lse (N, NH) its statistics.
// At step s the block in hand is the K/V of cp rank src = r - s: it goes on
// to the right while I compute with it, and the next arrives from the left.
//
//   step 0: r holds K/V of r      step 1: of r-1      ...   step cp-1: of r+1
static void ring_attention_forward(CPModel* m, const float* qkv, float* atty, float* lse) {
    const int C = m->cfg.channels, NH = m->cfg.num_heads, N = m->N;
    const int n = m->cpc->size, r = m->cpc->rank, right = (r + 1) % n, left = (r - 1 + n) % n;
    const size_t kv_count = (size_t)N * 2 * C;
    // pack my K and V out of qkv: only they travel (2C of the 3C per token)
    ops_copy_2d(m->kv[0], 2 * C, qkv + C, 3 * C, N, 2 * C);
    ring_forward_begin(&m->ring);
    for (int s = 0; s < n; s++) {
        const int src = (r - s + n) % n;
        const float* kv = m->kv[s % 2];
        CommRequest to_right = {0}, from_left = {0};
        if (s < n - 1) {  // pass the block on while computing with it
            comm_irecv(m->cpc, m->kv[(s + 1) % 2], kv_count, left, &from_left);
            comm_isend(m->cpc, kv, kv_count, right, &to_right);
        }
        if (!m->overlap) ring_wait(m, &from_left), ring_wait(m, &to_right);
        double t0 = now_seconds();
        ring_forward_block(&m->sh, &m->ring, qkv, kv, src, atty, lse, C, NH);
        m->attn_seconds += now_seconds() - t0;
        ring_wait(m, &from_left);
        ring_wait(m, &to_right);
    }
    // out / sumexp, and lse = rowmax + log(sumexp) in place of rowmax
    ring_forward_finish(&m->sh, &m->ring, atty, lse, C, NH);
}

// Backward. datty (N, C) is d atty; dqkv (N, 3C), zero on entry, gets d of
// my queries (from every block) and of my keys and values (from every rank's
// queries). The K/V blocks go around as in forward; each rank adds its
// queries' share of dK|dV into the partial sum that arrived with the block
// and passes it on; after cp hops (one more than K/V makes) it is home.
static void ring_attention_backward(CPModel* m, const float* qkv, const float* atty, const float* lse,
                                    const float* datty, float* dqkv) {
    // EXERCISE 3: ring backward: K/V go around again; each rank adds its queries' dK/dV share to the partial sum that arrived and sends it on; after cp hops it is home in dqkv
    const int C = m->cfg.channels, NH = m->cfg.num_heads, N = m->N;
    const int n = m->cpc->size, r = m->cpc->rank, right = (r + 1) % n, left = (r - 1 + n) % n;
    const size_t kv_count = (size_t)N * 2 * C;
    ops_copy_2d(m->kv[0], 2 * C, qkv + C, 3 * C, N, 2 * C);
    CommRequest d_to_right = {0}, d_from_left = {0};
    for (int s = 0; s < n; s++) {
        const int src = (r - s + n) % n;
        const float* kv = m->kv[s % 2];
        float* dkv = m->dkv[s % 2];  // the other one may still be on its way right
        CommRequest to_right = {0}, from_left = {0};
        if (s < n - 1) {
            comm_irecv(m->cpc, m->kv[(s + 1) % 2], kv_count, left, &from_left);
            comm_isend(m->cpc, kv, kv_count, right, &to_right);
        }
        if (!m->overlap) ring_wait(m, &from_left), ring_wait(m, &to_right);
        double t0 = now_seconds();
        ops_zero(dkv, kv_count);
        ring_backward_block(&m->sh, qkv, atty, lse, datty, kv, src, dqkv, dkv, C, NH);
        m->attn_seconds += now_seconds() - t0;
        if (s > 0) {  // what the ranks before me added for src's keys
            ring_wait(m, &d_from_left);
            ring_wait(m, &d_to_right);
            ops_add(dkv, m->dkv_in, kv_count);
        }
        if (n > 1) {
            comm_irecv(m->cpc, m->dkv_in, kv_count, left, &d_from_left);
            comm_isend(m->cpc, dkv, kv_count, right, &d_to_right);
            if (!m->overlap) ring_wait(m, &d_from_left), ring_wait(m, &d_to_right);
        }
        ring_wait(m, &from_left);
        ring_wait(m, &to_right);
    }
    ring_wait(m, &d_from_left);
    ring_wait(m, &d_to_right);
    // home: d of my keys and values from every query of the sequence (on
    // one rank it never left)
    ops_copy_2d(dqkv + C, 3 * C, n > 1 ? m->dkv_in : m->dkv[0], 2 * C, N, 2 * C);
    // END EXERCISE 3
}

// ---------------------------------------------------------------- Ulysses attention
// Sequence shards to head shards: src (N, w*C) holds w tensors of C
// channels per token (w = 3: q|k|v; w = 1: an attention output) for my
// tokens and every head; dst (B, T, w*C/cp) gets the same w tensors for
// every token of the B sequences and my head group's C/cp channels. Pack
// block j of the send buffer with head group j's columns of my tokens,
// exchange, and lay each rank's tokens at their positions.
static void seq_to_heads(CPModel* m, float* dst, const float* src, int w) {
    // EXERCISE 4: Ulysses: pack head group j's columns of my tokens into block j, all-to-all over cp, lay each rank's tokens at their positions in whole sequences
    const CPShard* sh = &m->sh;
    const int n = m->cpc->size, C = m->cfg.channels, c = C / n, wc = w * c, N = m->N;
    const size_t block = (size_t)N * wc;
    for (int j = 0; j < n; j++)
        for (int t = 0; t < w; t++)
            ops_copy_2d(m->send + j * block + t * c, wc, src + t * C + j * c, w * C, N, c);
    comm_alltoall(m->cpc, m->send, m->recv, block);
    for (int s = 0; s < n; s++)
        for (int p = 0; p < sh->parts; p++)
            for (int b = 0; b < sh->B; b++)
                ops_copy(dst + ((size_t)b * sh->T + cp_shard_pos(sh, s, p)) * wc,
                         m->recv + s * block + ((size_t)p * sh->B + b) * sh->len * wc, (size_t)sh->len * wc);
    // END EXERCISE 4
}

// Head shards back to sequence shards: the inverse of seq_to_heads.
static void heads_to_seq(CPModel* m, float* dst, const float* src, int w) {
    const CPShard* sh = &m->sh;
    const int n = m->cpc->size, C = m->cfg.channels, c = C / n, wc = w * c, N = m->N;
    const size_t block = (size_t)N * wc;
    for (int s = 0; s < n; s++)
        for (int p = 0; p < sh->parts; p++)
            for (int b = 0; b < sh->B; b++)
                ops_copy(m->send + s * block + ((size_t)p * sh->B + b) * sh->len * wc,
                         src + ((size_t)b * sh->T + cp_shard_pos(sh, s, p)) * wc, (size_t)sh->len * wc);
    comm_alltoall(m->cpc, m->send, m->recv, block);
    for (int j = 0; j < n; j++)
        for (int t = 0; t < w; t++)
            ops_copy_2d(dst + t * C + j * c, w * C, m->recv + j * block + t * c, wc, N, c);
}

static void ulysses_attention_forward(CPModel* m, LayerActs* la) {
    const int n = m->cpc->size, C = m->cfg.channels, NH = m->cfg.num_heads;
    seq_to_heads(m, la->qkv_h, la->a.qkv, 3);
    double t0 = now_seconds();
    // whole sequences, NH/cp heads: chapter 0's attention on C/cp channels
    attention_forward(m->y_h, la->att_h, la->qkv_h, m->sh.B, m->sh.T, C / n, NH / n);
    m->attn_seconds += now_seconds() - t0;
    m->attn_scores += (long)m->sh.B * (NH / n) * ((long)m->sh.T * (m->sh.T + 1) / 2);
    heads_to_seq(m, la->a.atty, m->y_h, 1);
}

static void ulysses_attention_backward(CPModel* m, const LayerActs* la, const float* datty, float* dqkv) {
    const int n = m->cpc->size, C = m->cfg.channels, NH = m->cfg.num_heads;
    const CPShard* sh = &m->sh;
    seq_to_heads(m, m->y_h, datty, 1);
    double t0 = now_seconds();
    ops_zero(m->dqkv_h, (size_t)m->N * 3 * C);
    attention_backward(m->dqkv_h, m->datt_h, m->y_h, la->qkv_h, la->att_h, sh->B, sh->T, C / n, NH / n);
    m->attn_seconds += now_seconds() - t0;
    heads_to_seq(m, dqkv, m->dqkv_h, 3);
}

// ---------------------------------------------------------------- the block
// model.c's block_forward with its attention line replaced: everything else
// is per token.
static void cp_block_forward(CPModel* m, const BlockParams* p, LayerActs* la, const float* x) {
    const int N = m->N, C = m->cfg.channels;
    BlockActs* a = &la->a;
    layernorm_forward(a->ln1, a->ln1_mean, a->ln1_rstd, x, p->ln1w, p->ln1b, N, C);
    matmul_forward(a->qkv, a->ln1, p->qkvw, p->qkvb, N, C, 3 * C);
    if (m->mode == CP_RING)
        ring_attention_forward(m, a->qkv, a->atty, la->lse);
    else
        ulysses_attention_forward(m, la);
    matmul_forward(a->attproj, a->atty, p->attprojw, p->attprojb, N, C, C);
    residual_forward(a->res2, x, a->attproj, (size_t)N * C);
    layernorm_forward(a->ln2, a->ln2_mean, a->ln2_rstd, a->res2, p->ln2w, p->ln2b, N, C);
    matmul_forward(a->fch, a->ln2, p->fcw, p->fcb, N, C, 4 * C);
    gelu_forward(a->fch_gelu, a->fch, (size_t)N * 4 * C);
    matmul_forward(a->fcproj, a->fch_gelu, p->fcprojw, p->fcprojb, N, 4 * C, C);
    residual_forward(a->res3, a->res2, a->fcproj, (size_t)N * C);
}

// model.c's block_backward_input with its attention line replaced, then its
// weight half as it is (the weight gradients are per-token sums).
static void cp_block_backward(CPModel* m, const BlockParams* p, BlockParams* g, LayerActs* la, const float* x) {
    const int N = m->N, C = m->cfg.channels;
    const size_t NC = (size_t)N * C;
    const BlockActs* a = &la->a;
    BlockStash st = block_stash_at(m->stash, 1, N, C);
    float* dres = m->dres;
    ops_zero(m->dfch_gelu, 4 * NC);
    matmul_backward(m->dfch_gelu, NULL, NULL, dres, NULL, p->fcprojw, N, 4 * C, C);
    ops_zero(st.dfch, 4 * NC);
    gelu_backward(st.dfch, a->fch, m->dfch_gelu, 4 * NC);
    ops_copy(st.dfcproj, dres, NC);
    ops_zero(st.dln2, NC);
    matmul_backward(st.dln2, NULL, NULL, st.dfch, NULL, p->fcw, N, C, 4 * C);
    layernorm_backward(dres, NULL, NULL, st.dln2, a->res2, p->ln2w, a->ln2_mean, a->ln2_rstd, N, C);
    ops_copy(st.dattproj, dres, NC);
    ops_zero(m->datty, NC);
    matmul_backward(m->datty, NULL, NULL, dres, NULL, p->attprojw, N, C, C);
    ops_zero(st.dqkv, 3 * NC);
    if (m->mode == CP_RING)
        ring_attention_backward(m, a->qkv, a->atty, la->lse, m->datty, st.dqkv);
    else
        ulysses_attention_backward(m, la, m->datty, st.dqkv);
    ops_zero(st.dln1, NC);
    matmul_backward(st.dln1, NULL, NULL, st.dqkv, NULL, p->qkvw, N, C, 3 * C);
    layernorm_backward(dres, NULL, NULL, st.dln1, x, p->ln1w, a->ln1_mean, a->ln1_rstd, N, C);
    block_backward_weights(g, a, &st, x, 1, N, C);
}

// ---------------------------------------------------------------- the model
#define WTE(m, base) ((base) + gpt_tensor_offset(&(m)->cfg, P_WTE, 0))
#define WPE(m, base) ((base) + gpt_tensor_offset(&(m)->cfg, P_WPE, 0))
#define LNFW(m, base) ((base) + gpt_tensor_offset(&(m)->cfg, P_LNFW, 0))
#define LNFB(m, base) ((base) + gpt_tensor_offset(&(m)->cfg, P_LNFB, 0))

static const float* last_output(const CPModel* m) {
    int L = m->cfg.num_layers;
    return L > 0 ? layer_at(m, L - 1).a.res3 : m->encoded;
}

// Forward on my rows of the B sequences (host (B, T) token arrays); returns
// the mean loss of my N tokens.
static float model_forward(CPModel* m, const int* inputs, const int* targets) {
    const GPTConfig* c = &m->cfg;
    const CPShard* sh = &m->sh;
    const int C = c->channels, N = m->N;
    int* rows = xmalloc((size_t)N * 2 * sizeof(int));
    cp_shard_tokens(sh, rows, inputs);
    cp_shard_tokens(sh, rows + N, targets);
    mem_to_device(m->inputs, rows, (size_t)N * sizeof(int));
    mem_to_device(m->targets, rows + N, (size_t)N * sizeof(int));
    free(rows);
    double t0 = trace_start();
    // positions follow the tokens: part p's rows take wpe from its first position on
    for (int p = 0; p < sh->parts; p++) {
        size_t r0 = (size_t)p * sh->B * sh->len;
        encoder_forward(m->encoded + r0 * C, m->inputs + r0, WTE(m, m->params),
                        WPE(m, m->params) + (size_t)cp_shard_pos(sh, sh->rank, p) * C, sh->B, sh->len, C);
    }
    trace_compute(t0, "embedding forward");
    const float* x = m->encoded;
    for (int l = 0; l < c->num_layers; l++) {
        t0 = trace_start();
        BlockParams p = block_params_at(m->params + gpt_block_offset(c, l), C);
        LayerActs la = layer_at(m, l);
        cp_block_forward(m, &p, &la, x);
        x = la.a.res3;
        trace_compute(t0, "block %d forward", l);
    }
    HeadActs h = head_acts_at(m->head, 1, N, C, c->padded_vocab_size);
    head_forward(c, WTE(m, m->params), LNFW(m, m->params), LNFB(m, m->params), &h, x, m->targets, 1, N);
    mem_to_host(m->losses_host, h.losses, (size_t)N * sizeof(float));
    double sum = 0.0;
    for (int i = 0; i < N; i++) sum += m->losses_host[i];
    return (float)(sum / N);
}

// Layer l as its backward reads it: with --recompute, what forward dropped
// is computed again into the transient (the "block l recompute" span).
// Selective: gelu(fch), and Ulysses' probabilities from its kept head-shard
// qkv (no communication); the ring has no probabilities to rebuild. Full:
// the whole block from its kept input x, its attention with it: the ring's
// K/V go around again (cp-1 more sends per layer), Ulysses' two forward
// all-to-alls run again. The same ops on the same inputs: the same bits.
// The balance figures (attention scores and time) count forward and
// backward, not the recompute: its counters are put back.
static LayerActs layer_for_backward(CPModel* m, const BlockParams* p, int l, const float* x) {
    LayerActs la = layer_at(m, l);
    if (m->recompute == RECOMPUTE_NONE) return la;
    const int C = m->cfg.channels, NH = m->cfg.num_heads, N = m->N, n = m->cpc->size;
    double t0 = trace_start();
    if (m->recompute == RECOMPUTE_SELECTIVE) {
        gelu_forward(la.a.fch_gelu, la.a.fch, (size_t)N * 4 * C);
        if (m->mode == CP_ULYSSES)  // its output goes to scratch: atty was kept
            attention_forward(m->y_h, la.att_h, la.qkv_h, m->sh.B, m->sh.T, C / n, NH / n);
    } else {
        const CPModel kept = *m;
        la = cp_layout(m->mode, RECOMPUTE_NONE, m->transient, NULL, N, C, NH, m->sh.T, NULL);
        cp_block_forward(m, p, &la, x);
        m->attn_seconds = kept.attn_seconds, m->attn_scores = kept.attn_scores;
        m->ring.scores = kept.ring.scores, m->ring.skipped = kept.ring.skipped;
    }
    trace_compute(t0, "block %d recompute", l);
    return la;
}

// Backward of my tokens' mean loss; accumulates into m->grads.
static void model_backward(CPModel* m) {
    const GPTConfig* c = &m->cfg;
    const CPShard* sh = &m->sh;
    const int C = c->channels, N = m->N;
    HeadActs h = head_acts_at(m->head, 1, N, C, c->padded_vocab_size);
    head_backward(c, WTE(m, m->params), LNFW(m, m->params), WTE(m, m->grads), LNFW(m, m->grads), LNFB(m, m->grads),
                  &h, last_output(m), m->targets, 1.0f / (float)N, m->dln, m->dres, 1, N);
    for (int l = c->num_layers - 1; l >= 0; l--) {
        double t0 = trace_start();
        BlockParams p = block_params_at(m->params + gpt_block_offset(c, l), C);
        BlockParams g = block_params_at(m->grads + gpt_block_offset(c, l), C);
        const float* x = l > 0 ? layer_at(m, l - 1).a.res3 : m->encoded;
        LayerActs la = layer_for_backward(m, &p, l, x);
        cp_block_backward(m, &p, &g, &la, x);
        trace_compute(t0, "block %d backward", l);
    }
    double t0 = trace_start();
    for (int p = 0; p < sh->parts; p++) {
        size_t r0 = (size_t)p * sh->B * sh->len;
        encoder_backward(WTE(m, m->grads), WPE(m, m->grads) + (size_t)cp_shard_pos(sh, sh->rank, p) * C,
                         m->dres + r0 * C, m->inputs + r0, sh->B, sh->len, C);
    }
    trace_compute(t0, "embedding backward");
}

// The weights are replicated over dp x cp and each rank's gradient is that
// of its tokens' mean loss: the mean over the group is the gradient of the
// global batch's mean loss. Then every replica takes the same AdamW step.
static float reduce_and_step(CPModel* m, const TrainArgs* args, int step) {
    comm_allreduce(&m->dpcp, m->grads, m->P, COMM_AVG);
    double norm = train_global_norm(grad_sumsq(m->grads, m->P), NULL, 0);
    double t0 = trace_start();
    adamw_update(m->params, m->grads, m->m, m->v, m->P, train_adamw(args), step + 1, grad_clip_scale(norm, args->clip));
    trace_compute(t0, "optimizer");
    return (float)norm;
}

static void model_create(CPModel* m, const Run* run, CPMode mode, CPBalance balance, int overlap, int B) {
    memset(m, 0, sizeof(*m));
    m->overlap = overlap;
    const TrainSetup* setup = &run->setup;
    m->cfg = setup->cfg;
    m->mode = mode;
    m->cpc = &run->axes[AXIS_CP];
    comm_create_group(&m->dpcp, &run->mesh, (1u << AXIS_DP) | (1u << AXIS_CP));
    int n = m->cpc->size, T = setup->T, C = m->cfg.channels, NH = m->cfg.num_heads, L = m->cfg.num_layers;
    m->sh = (CPShard){.cp = n, .rank = m->cpc->rank, .parts = balance == BALANCE_ZIGZAG ? 2 : 1,
                    .len = balance == BALANCE_ZIGZAG ? T / (2 * n) : T / n, .B = B, .T = T};
    int N = m->N = B * (T / n);
    size_t NC = (size_t)N * C;
    m->P = gpt_num_params(&m->cfg);
    m->params = mem_alloc_floats(m->P, MEM_PARAMS);
    m->grads = mem_alloc_floats(m->P, MEM_GRADS);
    m->m = mem_alloc_floats(m->P, MEM_OPTIMIZER);
    m->v = mem_alloc_floats(m->P, MEM_OPTIMIZER);
    // counter-based init: every replica the same values
    size_t chunk = 1 << 20;
    float* host = xmalloc(chunk * sizeof(float));
    for (size_t start = 0; start < m->P; start += chunk) {
        size_t k = m->P - start < chunk ? m->P - start : chunk;
        gpt_init_range(host, start, k, &m->cfg, (uint64_t)run->args.seed);
        mem_to_device(m->params + start, host, k * sizeof(float));
    }
    free(host);
    m->recompute = (RecomputeMode)run->args.recompute;
    layer_numels(mode, m->recompute, N, C, NH, T, &m->layer_numel, &m->transient_numel);
    m->encoded = mem_alloc_floats(NC, MEM_ACTIVATIONS);
    m->layers = mem_alloc_floats((size_t)L * m->layer_numel, MEM_ACTIVATIONS);
    if (m->transient_numel) m->transient = mem_alloc_floats(m->transient_numel, MEM_ACTIVATIONS);
    m->head = mem_alloc_floats(head_acts_numel(1, N, C, m->cfg.padded_vocab_size), MEM_ACTIVATIONS);
    m->inputs = mem_alloc((size_t)N * sizeof(int), MEM_ACTIVATIONS);
    m->targets = mem_alloc((size_t)N * sizeof(int), MEM_ACTIVATIONS);
    m->losses_host = xmalloc((size_t)N * sizeof(float));
    m->dres = mem_alloc_floats(NC, MEM_ACTIVATIONS);
    m->dln = mem_alloc_floats(NC, MEM_ACTIVATIONS);
    m->stash = mem_alloc_floats(block_stash_numel(1, N, C), MEM_ACTIVATIONS);
    m->dfch_gelu = mem_alloc_floats(4 * NC, MEM_ACTIVATIONS);
    m->datty = mem_alloc_floats(NC, MEM_ACTIVATIONS);
    if (mode == CP_RING) {
        for (int i = 0; i < 2; i++) {
            m->kv[i] = mem_alloc_floats(2 * NC, MEM_COMM);
            m->dkv[i] = mem_alloc_floats(2 * NC, MEM_COMM);
        }
        m->dkv_in = mem_alloc_floats(2 * NC, MEM_COMM);
        // one pair's partials are one part's rows: at most N
        m->ring.o2 = mem_alloc_floats(NC, MEM_ACTIVATIONS);
        m->ring.m2 = mem_alloc_floats((size_t)N * NH, MEM_ACTIVATIONS);
        m->ring.l2 = mem_alloc_floats((size_t)N * NH, MEM_ACTIVATIONS);
        m->ring.sumexp = mem_alloc_floats((size_t)N * NH, MEM_ACTIVATIONS);
    } else {
        m->send = mem_alloc_floats(3 * NC, MEM_COMM);
        m->recv = mem_alloc_floats(3 * NC, MEM_COMM);
        m->y_h = mem_alloc_floats(NC, MEM_ACTIVATIONS);
        m->dqkv_h = mem_alloc_floats(3 * NC, MEM_ACTIVATIONS);
        m->datt_h = mem_alloc_floats((size_t)N * NH * T, MEM_ACTIVATIONS);
    }
}

static void model_free(CPModel* m) {
    float* bufs[] = {m->params, m->grads, m->m, m->v, m->encoded, m->layers, m->transient, m->head, m->dres, m->dln,
                     m->stash, m->dfch_gelu, m->datty, m->kv[0], m->kv[1], m->dkv[0], m->dkv[1], m->dkv_in,
                     m->ring.o2, m->ring.m2, m->ring.l2, m->ring.sumexp, m->send, m->recv, m->y_h, m->dqkv_h, m->datt_h};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) mem_free(bufs[i]);
    mem_free(m->inputs);
    mem_free(m->targets);
    free(m->losses_host);
    comm_destroy_group(&m->dpcp);
}

// Validation: every cp rank runs its rows of the same sequences.
static float forward_for_val(void* ctx, const int* inputs, const int* targets) {
    return model_forward((CPModel*)ctx, inputs, targets);
}

// ---------------------------------------------------------------- context-parallel training
static int train_context_parallel(Run* run, CPMode mode, CPBalance balance, int overlap) {
    const TrainArgs* args = &run->args;
    const TrainSetup* setup = &run->setup;
    train_check_mesh(&run->mesh, setup, NULL);
    int ndp = run->mesh.size[AXIS_DP], ncp = run->mesh.size[AXIS_CP], B = setup->B, T = setup->T;
    if (balance == BALANCE_ZIGZAG && T % (2 * ncp) != 0)
        fail_all("--seq %d does not split into 2 x cp = %d zigzag half-chunks: use a sequence length divisible by "
                 "%d, or --cp-balance none", T, 2 * ncp, 2 * ncp);
    if (mode == CP_ULYSSES && setup->cfg.num_heads % ncp != 0)
        fail_all("--cp-mode ulysses splits the model's %d heads over cp=%d ranks: use a cp that divides %d, or "
                 "--cp-mode ring", setup->cfg.num_heads, ncp, setup->cfg.num_heads);
    int per_dp = B / ndp, b0 = run->mesh.coord[AXIS_DP] * per_dp;

    CPModel model;
    model_create(&model, run, mode, balance, overlap, per_dp);
    if (setup->checkpoint) {
        float* host = xmalloc(model.P * sizeof(float));
        train_load_checkpoint(setup, host);
        mem_to_device(model.params, host, model.P * sizeof(float));
        free(host);
    }
    // training-state checkpoints: the replicas are identical, so world rank 0
    // alone writes the state; every rank reads all of it
    Ckpt ck;
    ckpt_init(&ck, args, setup, &run->mesh, 6);
    if (run->mesh.rank == 0) ckpt_add_state(&ck.own, &setup->cfg, 0, model.P, model.params, model.m, model.v);
    ckpt_add_state(&ck.need, &setup->cfg, 0, model.P, model.params, model.m, model.v);
    int start = ckpt_resume(&ck);

    print0("chapter 6: context parallel, dp=%d x cp=%d, %s attention, balance %s, device %s\n", ndp, ncp,
           cp_mode_names[mode], balance_names[balance], run->device);
    print0("model %s: %zu parameters, global batch %d x %d; each rank holds %d token%s of each of %d sequence%s "
           "(%d part%s of %d)\n", setup->model_name, model.P, B, T, T / ncp, T / ncp == 1 ? "" : "s", per_dp,
           per_dp == 1 ? "" : "s", model.sh.parts, model.sh.parts == 1 ? "" : "s", model.sh.len);
    print0("activations kept per layer: %zu bytes; transient %zu bytes (--recompute %s)\n",
           model.layer_numel * sizeof(float), model.transient_numel * sizeof(float), recompute_name(model.recompute));
    if (model.recompute == RECOMPUTE_FULL)
        print0("recompute full: backward reruns each block's forward, %s\n",
               mode == CP_RING ? "the ring's K/V passes again (cp-1 more sends per layer)"
                               : "its 2 all-to-alls again (2 more per layer)");
    JsonLog log;
    int *inputs, *targets;  // this rank's sequences of a step, (per_dp, T) each
    train_loop_open(&log, &inputs, &targets, args, per_dp, T);
    StepClock clock = {0};
    double ring_wait_timed = 0.0;  // the ring's waits in the steps the clock times
    float loss = 0.0f;
    comm_counts_reset();
    for (int step = start; step < args->steps; step++) {
        clock_begin(&clock);
        double ring_wait0 = model.ring_wait_seconds;
        // every cp rank of a dp group reads the same sequences and keeps its rows
        data_batch(&setup->train, step, B, T, b0, per_dp, inputs, targets);
        float my_loss = model_forward(&model, inputs, targets);
        mem_zero(model.grads, model.P * sizeof(float));
        model_backward(&model);
        float norm = reduce_and_step(&model, args, step);
        // every rank has the same number of tokens: the mean of the ranks'
        // means is the mean over the global batch (a host scalar: plain MPI)
        loss = (float)train_mean(&model.dpcp, my_loss);
        double dt = clock_end(&clock, step - start, args->steps - start);
        if (step - start > 0 || args->steps - start == 1) ring_wait_timed += model.ring_wait_seconds - ring_wait0;
        report_step(&log, step, args->steps, loss, norm, 1e3 * dt, (double)B * T / dt);
        if (args->val_every > 0 && (step + 1) % args->val_every == 0 && step + 1 < args->steps) {
            // the attention figures count training only: validation's forwards are put back
            CPModel kept = model;
            float v = train_val_loss_with(setup, args->val_batches, forward_for_val, &model, b0, per_dp, per_dp,
                                          &model.dpcp);
            model.attn_seconds = kept.attn_seconds, model.attn_scores = kept.attn_scores;
            model.ring_wait_seconds = kept.ring_wait_seconds;
            model.ring.scores = kept.ring.scores, model.ring.skipped = kept.ring.skipped;
            if (v >= 0) report_val(&log, step, v);
        }
        ckpt_after_step(&ck, step);
    }
    int steps_run = args->steps - start;
    // the cp axis's traffic of training alone (validation below adds its
    // own): the ring's sends, or Ulysses' all-to-alls, per step
    CommCount cp_send = comm_count(mode == CP_RING ? COLL_SEND : COLL_ALLTOALL, AXIS_CP);
    double cp_calls = steps_run > 0 ? cp_send.calls / steps_run : 0.0;
    double cp_bytes = steps_run > 0 ? cp_send.bytes / steps_run : 0.0;
    print0("cp traffic per rank per step: %.0f %s, %.0f bytes\n", cp_calls,
           mode == CP_RING ? "sends" : "all-to-alls", cp_bytes);
    // the balance: attention work and time per cp rank (host figures: plain MPI)
    // (scores per sequence and head in the ring's count: x B x NH)
    long my_scores = mode == CP_RING ? model.ring.scores * per_dp * setup->cfg.num_heads : model.attn_scores;
    double attn[2] = {steps_run > 0 ? (double)my_scores / steps_run : 0.0,
                      steps_run > 0 ? 1e3 * model.attn_seconds / steps_run : 0.0};
    double* all = xmalloc((size_t)ncp * 2 * sizeof(double));
    MPI_CHECK(MPI_Allgather(attn, 2, MPI_DOUBLE, all, 2, MPI_DOUBLE, model.cpc->mpi));
    double smin = all[0], smax = all[0], tmin = all[1], tmax = all[1];
    // the same figures for the human line (spaces) and the log (commas)
    char scores[512] = "", times[512] = "", scores_json[512] = "", times_json[512] = "";
    for (int i = 0; i < ncp; i++) {
        smin = fmin(smin, all[2 * i]), smax = fmax(smax, all[2 * i]);
        tmin = fmin(tmin, all[2 * i + 1]), tmax = fmax(tmax, all[2 * i + 1]);
        size_t k = strlen(scores), t = strlen(times);
        snprintf(scores + k, sizeof scores - k, "%s%.0f", i ? " " : "", all[2 * i]);
        snprintf(times + t, sizeof times - t, "%s%.2f", i ? " " : "", all[2 * i + 1]);
        k = strlen(scores_json), t = strlen(times_json);
        snprintf(scores_json + k, sizeof scores_json - k, "%s%.0f", i ? "," : "", all[2 * i]);
        snprintf(times_json + t, sizeof times_json - t, "%s%.3f", i ? "," : "", all[2 * i + 1]);
    }
    free(all);
    print0("attention scores per cp rank per step (forward): %s (max/min %.2f)\n", scores, smin > 0 ? smax / smin : 0.0);
    print0("attention compute per cp rank, ms per step: %s (max/min %.2f)\n", times, tmin > 0 ? tmax / tmin : 0.0);
    if (mode == CP_RING)
        print0("ring: fully masked (query part, key part) pairs skipped per step, forward, cp rank 0: %ld\n",
               steps_run > 0 ? model.ring.skipped / steps_run : 0);
    // the ring's waits (forward, recompute, backward) per step over the
    // steps the clock times: a part of the "communication ... blocked" below
    double ring_wait_ms = clock.timed > 0 ? 1e3 * ring_wait_timed / clock.timed : 0.0;
    if (mode == CP_RING)
        print0("ring waits: %.2f ms per step for K/V and dK/dV blocks (rank 0, overlap %s)\n", ring_wait_ms,
               overlap ? "on" : "off");
    float val_loss = train_val_loss_with(setup, args->val_batches, forward_for_val, &model, b0, per_dp, per_dp,
                                         &model.dpcp);
    if (val_loss >= 0) report_val(&log, args->steps - 1, val_loss);
    double ms = clock_ms_per_step(&clock), wait_ms = clock_wait_ms_per_step(&clock);
    print0("communication: %.2f ms per step blocked (rank 0), of %.2f ms per step\n", wait_ms, ms);
    char extra_json[2048];  // two per-rank lists of up to 512 characters each, and the rest
    snprintf(extra_json, sizeof(extra_json),
             "\"cp_mode\":\"%s\",\"cp_balance\":\"%s\",\"attention_scores_per_rank\":[%s],"
             "\"attention_ms_per_rank\":[%s],\"comm_wait_ms_per_step\":%.3f,\"cp_calls_per_step\":%.0f,"
             "\"cp_bytes_per_step\":%.0f,\"cp_overlap\":%d,\"ring_wait_ms_per_step\":%.3f,\"recompute\":\"%s\",\"layer_acts_bytes\":%zu,\"transient_bytes\":%zu",
             cp_mode_names[mode], balance_names[balance], scores_json, times_json, wait_ms, cp_calls, cp_bytes,
             overlap, ring_wait_ms, recompute_name(model.recompute), model.layer_numel * sizeof(float),
             model.transient_numel * sizeof(float));
    RunSummary summary = {
        .chapter = 6, .model = setup->model_name, .num_params = model.P, .batch = B, .seq = T,
        .steps = args->steps, .ms_per_step = ms, .tokens_per_s = ms > 0 ? (double)B * T / (ms / 1e3) : 0.0,
        .flops_per_token = gpt_flops_per_token(&setup->cfg, T), .peak_gflops = run->peak_gflops,
        .final_loss = loss, .val_loss = val_loss, .extra_json = extra_json};
    ckpt_finish(&ck, &log);
    report_summary(&log, &run->mesh, &summary);
    train_loop_close(&log, inputs, targets);
    if (train_wants_params(args)) {  // --sample, --save: from rank 0's replica
        float* host = NULL;
        if (run->mesh.rank == 0) {
            host = xmalloc(model.P * sizeof(float));
            mem_to_host(host, model.params, model.P * sizeof(float));
        }
        train_finish_params(args, &setup->cfg, T, host);
        free(host);
    }
    model_free(&model);
    return 0;
}

// ---------------------------------------------------------------- main
int main(int argc, char** argv) {
    const char* mode_name = "ring";
    const char* balance_name = "none";
    int sp = 0, overlap = 1;
    ArgSpec extra[] = {
        {"cp-mode", ARG_STRING, &mode_name, "ring | ulysses: how attention meets the other ranks' tokens  [ring]"},
        {"cp-balance", ARG_STRING, &balance_name, "none | zigzag: which positions each cp rank holds  [none]"},
        {"cp-overlap", ARG_INT, &overlap, "1 | 0: the ring computes while the next K/V block travels, or waits for it first  [1]"},
        {"sp", ARG_FLAG, &sp, "Megatron sequence parallelism on the tp axis (--tp N --sp)"},
    };
    Run run;
    if (!run_start(&run, argc, argv, "build/chapter-6",
                   "Chapter 6: the sequence over ranks: context parallelism (ring attention, zigzag, Ulysses)\n"
                   "on cp, replicated weights reduced over dp x cp; sequence parallelism with tp (--sp).",
                   extra, sizeof(extra) / sizeof(extra[0]), (1u << AXIS_DP) | (1u << AXIS_TP) | (1u << AXIS_CP)))
        return 0;
    int found_mode = 0, found_balance = 0;
    CPMode mode = CP_RING;
    CPBalance balance = BALANCE_NONE;
    for (int i = 0; i < 2; i++) {
        if (!strcmp(mode_name, cp_mode_names[i])) mode = (CPMode)i, found_mode = 1;
        if (!strcmp(balance_name, balance_names[i])) balance = (CPBalance)i, found_balance = 1;
    }
    if (!found_mode) fail_all("--cp-mode %s is not one of ring, ulysses", mode_name);
    if (!found_balance) fail_all("--cp-balance %s is not one of none, zigzag", balance_name);
    if (overlap != 0 && overlap != 1) fail_all("--cp-overlap %d is not 0 or 1", overlap);
    int rc = 1;
    if (sp) {
        // sequence parallelism (sequence.c), with chapter 4's FSDP over dp: ZeRO-3
        rc = sp_train(&run, 3, 1, 1);
    } else {
        if (run.mesh.size[AXIS_TP] > 1)
            fail_all("--tp %d without --sp: tensor parallelism is chapter 4's; here it comes with sequence "
                     "parallelism, --tp N --sp", run.mesh.size[AXIS_TP]);
        rc = train_context_parallel(&run, mode, balance, overlap);
    }
    run_finish(&run);
    return rc;
}
