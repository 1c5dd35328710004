// Chapter 6, part 1: Megatron sequence parallelism (--tp N --sp) on chapter 4's
// tensor parallelism.
//
// In chapter 4 every tp rank runs the parts of the model that tensor
// parallelism does not split -- the LayerNorms, the residual adds, the
// embedding's output, the final LayerNorm -- on all N = B*T tokens of its dp
// group's batch, and keeps their (B,T,C) activations: tp identical copies.
// Sequence parallelism (Korthikanti et al., 2022) splits those parts by
// tokens: tp rank r runs them on rows [r*N/tp, (r+1)*N/tp) of the flattened
// (B*T) token axis only, and keeps 1/tp of their activations.
//
// The split is over the flattened token axis, not over T inside each
// sequence: the (B,T,C) tensors are row-major, so rank r's rows are one
// contiguous block, and the tp blocks concatenated in rank order (what an
// all-gather writes) are the (B,T,C) tensor itself, with no permutation.
// LayerNorm and the residual add work token by token, so any split of the
// tokens is as good as any other for them; attention, which mixes the tokens
// of a sequence, only ever sees the all-gathered whole.
//
// Chapter 4's f and g change (Megatron-LM's mappings.py names them):
//   gather_from_sequence_parallel_region    replaces f before qkv and fc:
//       forward all-gather over tp (the column-parallel matmul reads every
//       token), backward reduce-scatter (each rank's partial input gradient
//       summed, and each rank keeps its own tokens' rows).
//   reduce_scatter_to_sequence_parallel_region  replaces g after attproj and
//       fcproj (and after the vocabulary-parallel embedding): forward
//       reduce-scatter (the partial sums are added, and each rank keeps its
//       tokens), backward all-gather of the output gradient.
// An all-reduce is a reduce-scatter followed by an all-gather, and in a ring
// each half moves (tp-1)/tp of the tensor per rank: the swap moves the same
// bus bytes as chapter 4. What sequence parallelism adds: a column-parallel
// matmul's weight gradient needs its input of every token, which is not kept
// (that is the saving), so backward all-gathers it again, overlapped with the
// input gradient's matmul, as Megatron does; and the LayerNorm weight
// gradients, each rank's over its own tokens, are summed over tp.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt.h"
#include "comm.h"
#include "errors.h"
#include "memory.h"
#include "model.h"
#include "model_tp.h"
#include "rank.h"
#include "report.h"
#include "run.h"
#include "train.h"
#include "train_eval.h"
#include "train_loop.h"

#include "sequence.h"
#include "trace.h"
#include "tp.h"

// ---------------------------------------------------------------- what a layer keeps

// A layer's activations under sequence parallelism live in three places, so
// the allocator counts each: the layer's token shard (the parts tensor
// parallelism does not split, on Nl = N/tp tokens), the layer's
// tensor-parallel slices (on every token, 1/tp of the width, as in chapter
// 4), and one transient buffer every layer shares for what --recompute does
// not keep (docs/recompute.md). With --recompute none:
//   shard   ln1 (Nl,C) ln1_mean ln1_rstd (Nl) attproj res2 ln2 (Nl,C)
//           ln2_mean ln2_rstd (Nl) fcproj res3 (Nl,C):   Nl*(6C + 4) floats
//   slices  qkv (N,3C/tp) atty (N,C/tp) lse (N,NH/tp) fch fch_gelu
//           (N,4C/tp):                                   N*(12C + NH)/tp floats
// together Nl*(18C + NH + 4): exactly 1/tp of a layer of chapter 0.
// selective moves attproj, fcproj and fch_gelu to the transient (a layer
// keeps Nl*(4C + 4) + N*(8C + NH)/tp); full keeps only res3 (Nl*C), the
// next layer's input, and moves the rest there.
enum { IN_SHARD, IN_SLICES, IN_TRANSIENT };

static float* place(float* const base[3], size_t at[3], int where, size_t n) {
    float* p = base[where] ? base[where] + at[where] : NULL;
    at[where] += n;
    return p;
}

// The view of one layer (any base may be NULL: then only numel, the floats
// of each of the three places, is of use).
static BlockActs sp_layout(float* shard, float* slices, float* transient, int B, int T, int C, int NH, int tp,
                           RecomputeMode r, size_t numel[3]) {
    size_t N = (size_t)B * T, Nl = N / tp, Cl = (size_t)C / tp, Fl = 4 * (size_t)C / tp;
    float* const base[3] = {shard, slices, transient};
    size_t at[3] = {0, 0, 0};
    int S = r == RECOMPUTE_FULL ? IN_TRANSIENT : IN_SHARD;       // the token shard's fields
    int P = r == RECOMPUTE_FULL ? IN_TRANSIENT : IN_SLICES;      // the tensor-parallel slices
    int dropS = r == RECOMPUTE_SELECTIVE ? IN_TRANSIENT : S;     // what selective drops
    int dropP = r == RECOMPUTE_SELECTIVE ? IN_TRANSIENT : P;
    BlockActs a;
    a.ln1 = place(base, at, S, Nl * C);
    a.ln1_mean = place(base, at, S, Nl);
    a.ln1_rstd = place(base, at, S, Nl);
    a.attproj = place(base, at, dropS, Nl * C);
    a.res2 = place(base, at, S, Nl * C);
    a.ln2 = place(base, at, S, Nl * C);
    a.ln2_mean = place(base, at, S, Nl);
    a.ln2_rstd = place(base, at, S, Nl);
    a.fcproj = place(base, at, dropS, Nl * C);
    a.res3 = place(base, at, IN_SHARD, Nl * C);  // always kept
    a.qkv = place(base, at, P, N * 3 * Cl);
    a.atty = place(base, at, P, N * Cl);
    a.lse = place(base, at, P, N * (size_t)(NH / tp));
    a.fch = place(base, at, P, N * Fl);
    a.fch_gelu = place(base, at, dropP, N * Fl);
    if (numel) memcpy(numel, at, sizeof(at));
    return a;
}


static BlockActs sp_acts(const SP* s, int l) {
    const GPTConfig* c = &s->m.cfg;
    return sp_layout(s->shards + (size_t)l * s->numel[IN_SHARD],
                     s->slices ? s->slices + (size_t)l * s->numel[IN_SLICES] : NULL, s->transient, s->m.B, s->m.T,
                     c->channels, c->num_heads, s->m.ntp, s->recompute, NULL);
}

// ---------------------------------------------------------------- the block

// The tp group's rows in rank order, chapter 0's attention, gradients at once.
static SpAttention sp_attention_of(const SP* s) {
    const TPModel* m = &s->m;
    return (SpAttention){m->tp, s->Nl, m->T, m->cfg.channels, m->cfg.num_heads, s->full, s->dfull, NULL, NULL, NULL};
}

// x (Nl,C): this rank's tokens of the block's input; a->res3 (Nl,C) the same
// tokens of its output. Every collective of the block is in its two halves.
static void block_forward_sp(const SP* s, const BlockParams* p, BlockActs* a, const float* x) {
    int Nl = s->Nl, C = s->m.cfg.channels;
    // attention (sp_attention_forward, below): ln1 on this rank's tokens,
    // all-gather, my heads on every token, reduce-scatter; the residual
    SpAttention v = sp_attention_of(s);
    sp_attention_forward(&v, p, a, x);                                                // a->res2 (Nl, C)
    // MLP: the same pattern (sp_mlp_forward, below)
    layernorm_forward(a->ln2, a->ln2_mean, a->ln2_rstd, a->res2, p->ln2w, p->ln2b, Nl, C);
    sp_mlp_forward(s->m.tp, p, a, s->full, Nl, C);                                    // (Nl, C)
    residual_forward(a->res3, a->res2, a->fcproj, (size_t)Nl * C);
}

// The group's rows of my rows' tensor (Nl, C), all-gathered over tp: the
// tp blocks of rows in rank order are the (B,T,C) tensor; under zigzag
// (v->order) they are regrouped into attention's order, through scratch.
static int regrouped(const SpAttention* v) { return v->order && v->order->parts > 1; }

static void group_allgather(const SpAttention* v, const float* mine, float* all, float* scratch) {
    comm_allgather(v->tp, mine, regrouped(v) ? scratch : all, (size_t)v->Nl * v->C);
    if (regrouped(v)) cp_shard_regroup(v->order, v->tp->size, all, scratch, v->C, 1);
}

// Every row's partial sums (Nl tp, C) added over tp, my rows kept (Nl, C).
static void group_reduce_scatter(const SpAttention* v, const float* all, float* mine, float* scratch) {
    if (regrouped(v)) cp_shard_regroup(v->order, v->tp->size, scratch, all, v->C, 0);
    comm_reduce_scatter(v->tp, regrouped(v) ? scratch : all, mine, (size_t)v->Nl * v->C, COMM_SUM);
}

// The attention half (sequence.h): ln1's rows of every token, qkv
// column-parallel (my heads), attention, attproj row-parallel, the sums of
// my rows, the residual.
void sp_attention_forward(const SpAttention* v, const BlockParams* p, BlockActs* a, const float* x) {
    int Nl = v->Nl, tp = v->tp->size, N = Nl * tp, C = v->C, Cl = C / tp, NHl = v->NH / tp;
    // the LayerNorm on this rank's tokens only
    layernorm_forward(a->ln1, a->ln1_mean, a->ln1_rstd, x, p->ln1w, p->ln1b, Nl, C);  // (Nl, C)
    // gather_from_sequence_parallel_region, forward: all-gather over tp
    group_allgather(v, a->ln1, v->full, v->dfull);                                   // (N, C)
    // column-parallel qkv on every token: this rank's heads
    matmul_forward(a->qkv, v->full, p->qkvw, p->qkvb, N, C, 3 * Cl);                  // (N, 3C/tp)
    if (v->core) v->core->forward(v->core->ctx, v->core->layer, a);                  // (N, C/tp)
    else attention_flash_forward(a->atty, a->lse, a->qkv, N / v->T, v->T, Cl, NHl);
    // row-parallel projection: a partial sum for every token (the bias added
    // by one rank, so the sum holds it once)
    matmul_forward(v->full, a->atty, p->attprojw, v->tp->rank == 0 ? p->attprojb : NULL, N, Cl, C);
    // reduce_scatter_to_sequence_parallel_region, forward: reduce-scatter
    // over tp: the partial sums added, this rank keeping its own tokens
    group_reduce_scatter(v, v->full, a->attproj, v->dfull);                          // (Nl, C)
    residual_forward(a->res2, x, a->attproj, (size_t)Nl * C);
}

// The MLP half (sequence.h): ln2's rows of every token, fc column-parallel
// (my 4C/tp hidden units), GELU, fcproj row-parallel, the sums of my rows.
void sp_mlp_forward(const Comm* tp, const BlockParams* p, BlockActs* a, float* full, int Nl, int C) {
    int N = Nl * tp->size, Fl = 4 * C / tp->size;
    size_t NlC = (size_t)Nl * C;
    // gather_from_sequence_parallel_region, forward: all-gather
    comm_allgather(tp, a->ln2, full, NlC);                                            // (N, C)
    matmul_forward(a->fch, full, p->fcw, p->fcb, N, C, Fl);                           // (N, 4C/tp)
    gelu_forward(a->fch_gelu, a->fch, (size_t)N * Fl);
    matmul_forward(full, a->fch_gelu, p->fcprojw, tp->rank == 0 ? p->fcprojb : NULL, N, Fl, C);
    // reduce_scatter_to_sequence_parallel_region, forward: reduce-scatter
    comm_reduce_scatter(tp, full, a->fcproj, NlC, COMM_SUM);                          // (Nl, C)
}

// The backward of one column-parallel matmul out (N, OC) = in (N, C) @ w^T + b
// whose input is the all-gather of the kept token shard in_shard (Nl, C),
// from dout (N, OC): accumulates dw and db, and WRITES this rank's tokens of
// the input gradient into dshard (Nl, C). Two collectives, each overlapped
// with a matmul, as Megatron overlaps them:
//   the input of every token is all-gathered again (it was not kept: that is
//   the saving) while the input gradient's matmul runs, which needs only w;
//   gather_from_sequence_parallel_region's backward, the reduce-scatter of
//   the partial input gradients, runs while the weight gradient's matmul does
//   (or, with wg, while wg takes it: the capstone queues it for later).
void sp_column_parallel_backward(const Comm* tp, float* dw, float* db, float* dshard, const float* dout,
                                 const float* in_shard, const float* w, float* dpartial, float* gathered, int Nl, int C,
                                 int OC, const WeightGradHook* wg) {
    int N = Nl * tp->size;
    size_t NlC = (size_t)Nl * C;
    CommRequest gather, scatter;
    comm_iallgather(tp, in_shard, gathered, NlC, &gather);                     // (N, C) in flight
    ops_zero(dpartial, (size_t)N * C);
    matmul_backward(dpartial, NULL, NULL, dout, NULL, w, N, C, OC);           // partial d in (N, C)
    comm_wait(&gather);
    comm_ireduce_scatter(tp, dpartial, dshard, NlC, COMM_SUM, &scatter);      // (Nl, C) in flight
    weight_grad(wg, dw, db, dout, gathered, N, C, OC);                        // dw, db from every token
    comm_wait(&scatter);
}

// The MLP half's backward (sequence.h). reduce_scatter_to_sequence_parallel_
// region, backward: all-gather the output gradient, every rank then has
// every token's; fc with gather_from_sequence_parallel_region's backward.
void sp_mlp_backward(const Comm* tp, const BlockParams* p, BlockParams* g, const BlockActs* a, float* dln,
                     const float* dout, float* dfch_gelu, float* dfch, float* dpartial, float* dfull, int Nl, int C,
                     const WeightGradHook* wg) {
    int N = Nl * tp->size, Fl = 4 * C / tp->size;
    comm_allgather(tp, dout, dfull, (size_t)Nl * C);                                  // (N, C)
    // the row-parallel bias's gradient (the sum over every token) comes out
    // the same on every rank: the replicated bias stays the same everywhere
    ops_zero(dfch_gelu, (size_t)N * Fl);
    matmul_backward(dfch_gelu, NULL, NULL, dfull, NULL, p->fcprojw, N, Fl, C);
    weight_grad(wg, g->fcprojw, g->fcprojb, dfull, a->fch_gelu, N, Fl, C);
    ops_zero(dfch, (size_t)N * Fl);
    gelu_backward(dfch, a->fch, dfch_gelu, (size_t)N * Fl);
    sp_column_parallel_backward(tp, g->fcw, g->fcb, dln, dfch, a->ln2, p->fcw, dpartial, dfull, Nl, C, Fl, wg);
}

// The attention half's backward (sequence.h): the forward's collectives
// mirrored, and ln1's output all-gathered again for qkvw's gradient.
void sp_attention_backward(const SpAttention* v, const BlockParams* p, BlockParams* g, const BlockActs* a,
                           const BlockScratch* sc, const float* x, float* dres, float* dln) {
    int Nl = v->Nl, tp = v->tp->size, N = Nl * tp, C = v->C, Cl = C / tp, NHl = v->NH / tp;
    // reduce_scatter_to_sequence_parallel_region, backward: all-gather d attproj
    group_allgather(v, dres, v->dfull, v->full);                                     // (N, C)
    ops_zero(sc->datty, (size_t)N * Cl);
    matmul_backward(sc->datty, NULL, NULL, v->dfull, NULL, p->attprojw, N, Cl, C);
    // the row-parallel bias's gradient, the sum over every token, comes out
    // the same on every rank (g->attprojb NULL: the caller takes it)
    weight_grad(v->wg, g->attprojw, g->attprojb, v->dfull, a->atty, N, Cl, C);
    ops_zero(sc->dqkv, (size_t)N * 3 * Cl);
    if (v->core) v->core->backward(v->core->ctx, v->core->layer, a, sc->datty, sc->dqkv);
    else attention_flash_backward(sc->dqkv, sc->datty, a->qkv, a->atty, a->lse, N / v->T, v->T, Cl, NHl);
    if (!regrouped(v)) {
        // gather_from_sequence_parallel_region, backward, with ln1 gathered again
        sp_column_parallel_backward(v->tp, g->qkvw, g->qkvb, dln, sc->dqkv, a->ln1, p->qkvw, v->dfull, v->full, Nl, C,
                                    3 * Cl, v->wg);
    } else {
        // the same, one after another: the regrouping needs the second buffer
        group_allgather(v, a->ln1, v->full, v->dfull);                               // (N, C)
        ops_zero(v->dfull, (size_t)N * C);
        matmul_backward(v->dfull, NULL, NULL, sc->dqkv, NULL, p->qkvw, N, C, 3 * Cl);
        weight_grad(v->wg, g->qkvw, g->qkvb, sc->dqkv, v->full, N, C, 3 * Cl);
        group_reduce_scatter(v, v->dfull, dln, v->full);                             // (Nl, C)
    }
    layernorm_backward(dres, g->ln1w, g->ln1b, dln, x, p->ln1w, a->ln1_mean, a->ln1_rstd, Nl, C);
}

// dres (Nl,C): on entry this rank's tokens of d loss / d block output, on
// return of d loss / d x. Parameter gradients accumulate into g; the
// LayerNorms' are summed over tp before the block returns.
static void block_backward_sp(const SP* s, const BlockParams* p, BlockParams* g, const BlockActs* a,
                              const BlockScratch* sc, const float* x, float* dres) {
    const TPModel* m = &s->m;
    int Nl = s->Nl, C = m->cfg.channels;
    // MLP, backwards (sp_mlp_backward, above): this rank's tokens of d ln2
    sp_mlp_backward(m->tp, p, g, a, s->dln, dres, sc->dfch_gelu, sc->dfch, sc->dln, s->dfull, Nl, C, NULL);
    layernorm_backward(dres, g->ln2w, g->ln2b, s->dln, a->res2, p->ln2w, a->ln2_mean, a->ln2_rstd, Nl, C);
    // attention, backwards: the same pattern (sp_attention_backward, above)
    SpAttention v = sp_attention_of(s);
    sp_attention_backward(&v, p, g, a, sc, x, dres, s->dln);
    // each rank's LayerNorm weight gradients hold its own tokens' share:
    // summed over tp, every rank holds the whole (and the same bits: the
    // replicated weights take the same AdamW step everywhere). [w b] of
    // each LayerNorm sit side by side in the block's shard (model_tp.h).
    CHECK(g->ln1b == g->ln1w + C && g->ln2b == g->ln2w + C, "a LayerNorm's [w b] must be contiguous");
    comm_allreduce(m->tp, g->ln1w, 2 * (size_t)C, COMM_SUM);
    comm_allreduce(m->tp, g->ln2w, 2 * (size_t)C, COMM_SUM);
}

// ---------------------------------------------------------------- forward and backward

// The loss of this rank's dp group's batch: the same on every tp rank.
float sp_forward(SP* s, const int* inputs, const int* targets) {
    TPModel* m = &s->m;
    FSDP* f = &m->f;
    const GPTConfig* c = &m->cfg;
    int C = c->channels, L = c->num_layers, Nl = s->Nl;
    size_t NlC = (size_t)Nl * C;
    // the vocabulary-parallel embedding (chapter 4's): this rank's partial
    // sum for every token, in s->full ...
    // (--trace: each span holds the collectives it waits for, nested)
    double t0 = trace_start();
    float* partial = tp_embed_forward(m, inputs, targets);                            // (N, C)
    // ... and reduce_scatter_to_sequence_parallel_region where chapter 4
    // all-reduces: the sum, of this rank's tokens only
    comm_reduce_scatter(m->tp, partial, s->x0, NlC, COMM_SUM);                        // (Nl, C)
    trace_compute(t0, "embedding forward");
    const float* x = s->x0;
    for (int l = 0; l < L; l++) {
        BlockParams p = tp_block_params(m, l);
        fsdp_prefetch(f, l + 2);  // the next block, or [lnfw lnfb] after the last
        BlockActs a = sp_acts(s, l);
        t0 = trace_start();
        block_forward_sp(s, &p, &a, x);
        trace_compute(t0, "block %d forward", l);
        x = a.res3;
    }
    // the final LayerNorm on this rank's tokens, written straight into its
    // rows of the head's (N, C) input; gather_from_sequence_parallel_region
    // (in place): the LM head's matmul reads every token
    HeadActs h = tp_head_acts(m);
    float* lnf = fsdp_unit_params(f, L + 1);
    float* mine = h.lnf + (size_t)s->n0 * C;
    t0 = trace_start();
    layernorm_forward(mine, h.lnf_mean + s->n0, h.lnf_rstd + s->n0, x, lnf, lnf + C, Nl, C);
    comm_allgather(m->tp, mine, h.lnf, NlC);                                          // (N, C)
    float loss = tp_head_forward(m);
    trace_compute(t0, "head forward");
    return loss;
}

static float forward_cb(void* ctx, const int* inputs, const int* targets) {
    return sp_forward(ctx, inputs, targets);
}

float sp_val_loss(void* ctx, const TrainSetup* setup, int n_batches) {
    SP* s = ctx;
    return tp_val_loss(&s->m, setup, n_batches, forward_cb, s);
}

void sp_backward(SP* s) {
    TPModel* m = &s->m;
    FSDP* f = &m->f;
    const GPTConfig* c = &m->cfg;
    int B = m->B, T = m->T, C = c->channels, NH = c->num_heads, L = c->num_layers, Nl = s->Nl;
    size_t NlC = (size_t)Nl * C;
    HeadActs h = tp_head_acts(m);
    BlockScratch sc = block_scratch_at_tp(m->scratch, B, T, C, NH, m->ntp);
    // the head: this vocabulary slice's share of dlnf for every token ...
    double t0 = trace_start();
    tp_head_backward(m, sc.dln);                                                      // (N, C) partial
    // ... and gather_from_sequence_parallel_region's backward: reduce-scatter
    comm_reduce_scatter(m->tp, sc.dln, s->dln, NlC, COMM_SUM);                        // (Nl, C)
    float* lnf = fsdp_unit_params(f, L + 1);
    float* g_lnf = fsdp_grads_begin(f, L + 1);
    const float* last = sp_acts(s, L - 1).res3;
    ops_zero(s->dres, NlC);
    layernorm_backward(s->dres, g_lnf, g_lnf + C, s->dln, last, lnf, h.lnf_mean + s->n0, h.lnf_rstd + s->n0, Nl,
                       C);
    comm_allreduce(m->tp, g_lnf, 2 * (size_t)C, COMM_SUM);  // [lnfw lnfb] of every token
    trace_compute(t0, "head backward");
    if (f->zero > 1) fsdp_reduce_grads(f, L + 1);
    // the blocks, last to first, as in chapter 4: gather (prefetching the one
    // before), backward, reduce-scatter over dp
    for (int l = L - 1; l >= 0; l--) {
        BlockParams p = tp_block_params(m, l);
        if (l > 0) fsdp_prefetch(f, l);
        BlockParams g = tp_block_grads_begin(m, l);
        BlockActs a = sp_acts(s, l);
        const float* x = l > 0 ? sp_acts(s, l - 1).res3 : s->x0;
        // --recompute: what forward did not keep, again (docs/recompute.md)
        t0 = trace_start();
        if (s->recompute != RECOMPUTE_NONE) {
            double t1 = trace_start();
            if (s->recompute == RECOMPUTE_SELECTIVE)
                tp_recompute_selective(m, &a);  // GELU on this rank's slice: no collective
            else
                block_forward_sp(s, &p, &a, x);  // with its 2 all-gathers and 2 reduce-scatters again
            trace_compute(t1, "block %d recompute", l);
        }
        block_backward_sp(s, &p, &g, &a, &sc, x, s->dres);
        trace_compute(t0, "block %d backward", l);
        if (f->zero > 1) fsdp_reduce_grads(f, 1 + l);
    }
    // the embedding: reduce_scatter_to_sequence_parallel_region's backward
    // (all-gather) gives every token's gradient, which chapter 4's
    // vocabulary-parallel embedding backward takes
    t0 = trace_start();
    comm_allgather(m->tp, s->dres, s->dfull, NlC);                                    // (N, C)
    tp_embed_backward(m, s->dfull);
    trace_compute(t0, "embedding backward");
}

// ---------------------------------------------------------------- checks

// 1 on every rank iff, after this backward's reductions, every tp rank holds
// bit-identical gradients of the LayerNorm weights (each block's ln1, ln2
// and the final lnf): the sums over tp agree. Each rank fingerprints the
// part of those tensors that lies in its dp shard of the reduced gradient;
// tp ranks of the same dp rank hold the same ranges (a block's shard and
// [lnfw lnfb] have the same size on every tp rank). Plain MPI, uncounted.
int sp_layernorm_grads_agree(const SP* s) {
    const TPModel* m = &s->m;
    const FSDP* f = &m->f;
    float* host = xmalloc(f->shard_total * sizeof(float));
    mem_to_host(host, f->shard_grads, f->shard_total * sizeof(float));
    unsigned long long h = 0, lo, hi;
    for (int i = 0; i < m->ntiles; i++) {
        const Tile* tl = &m->tiles[i];
        ParamTensor t = tl->t;
        if (t != P_LN1W && t != P_LN1B && t != P_LN2W && t != P_LN2B && t != P_LNFW && t != P_LNFB) continue;
        int u = tp_tile_unit(m, tl);
        size_t a = tl->off - m->unit_off[u], b = a + tl->nrows * tl->ncols;       // in the unit
        size_t lo_own = (size_t)f->dp->rank * f->shard[u], hi_own = lo_own + f->shard[u];
        for (size_t k = a > lo_own ? a : lo_own; k < (b < hi_own ? b : hi_own); k++) {
            unsigned int bits;
            memcpy(&bits, host + f->shard_off[u] + (k - lo_own), sizeof(bits));
            h = h * 1099511628211ull + bits + 1;
        }
    }
    free(host);
    MPI_CHECK(MPI_Allreduce(&h, &lo, 1, MPI_UNSIGNED_LONG_LONG, MPI_MIN, m->tp->mpi));
    MPI_CHECK(MPI_Allreduce(&h, &hi, 1, MPI_UNSIGNED_LONG_LONG, MPI_MAX, m->tp->mpi));
    int mine = lo == hi, all = 0;
    MPI_CHECK(MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_MIN, m->world->mpi));
    return all;
}

// ---------------------------------------------------------------- set-up

const char* sp_mesh_problem(const GPTConfig* cfg, int B, int T, int dp, int tp, int cp, char* msg, size_t len) {
    if (cp > 1)
        return snprintf(msg, len, "--sp runs on a dp x tp mesh and --cp %d asks for context parallelism: use one "
                        "of the two", cp), msg;
    const char* bad = tp_mesh_problem(cfg, B, dp, tp, msg, len);  // chapter 4's
    if (bad) return bad;
    int Bl = B / dp;
    if (((long)Bl * T) % tp != 0)
        return snprintf(msg, len, "--sp splits the %d x %d = %d tokens of a dp rank's batch over tp=%d ranks, which "
                        "does not divide them: use a --batch or --seq that makes (batch/dp) x seq divisible by %d",
                        Bl, T, Bl * T, tp, tp), msg;
    return NULL;
}

void sp_create(SP* s, const Run* run, int zero, int prefetch, int reshard) {
    int tp = run->axes[AXIS_TP].size, dp = run->axes[AXIS_DP].size, T = run->setup.T;
    char msg[ERROR_MAX];
    const char* bad = sp_mesh_problem(&run->setup.cfg, run->setup.B, T, dp, tp, run->axes[AXIS_CP].size, msg, sizeof(msg));
    if (bad) fail_all("%s", bad);
    int B = run->setup.B / dp;
    memset(s, 0, sizeof(*s));
    s->zero = zero, s->prefetch = prefetch, s->reshard = reshard;
    TPModel* m = &s->m;
    tp_create(m, run, B, zero, prefetch, reshard);
    const GPTConfig* c = &m->cfg;
    int C = c->channels, NH = c->num_heads, L = c->num_layers;
    s->N = B * T;
    s->Nl = s->N / tp;
    s->n0 = m->rtp * s->Nl;
    // tp_create sized the layers' activations for chapter 4's block; this
    // block keeps less. Free them (the allocator tells how much chapter 4's
    // layers keep) and allocate what this block keeps, in its places.
    s->recompute = m->recompute;
    sp_layout(NULL, NULL, NULL, B, T, C, NH, tp, s->recompute, s->numel);
    size_t before = mem_current(MEM_ACTIVATIONS);
    mem_free(m->blocks);
    m->blocks = NULL;
    s->ch4_block_bytes = before - mem_current(MEM_ACTIVATIONS);
    mem_free(m->transient);
    m->transient = NULL;
    before = mem_current(MEM_ACTIVATIONS);
    s->shards = mem_alloc_floats((size_t)L * s->numel[IN_SHARD], MEM_ACTIVATIONS);
    s->shard_bytes = mem_current(MEM_ACTIVATIONS) - before;
    before = mem_current(MEM_ACTIVATIONS);
    if (s->numel[IN_SLICES]) s->slices = mem_alloc_floats((size_t)L * s->numel[IN_SLICES], MEM_ACTIVATIONS);
    s->slice_bytes = mem_current(MEM_ACTIVATIONS) - before;
    if (s->numel[IN_TRANSIENT]) s->transient = mem_alloc_floats(s->numel[IN_TRANSIENT], MEM_ACTIVATIONS);
    s->x0 = mem_alloc_floats((size_t)s->Nl * C, MEM_ACTIVATIONS);
    s->dres = mem_alloc_floats((size_t)s->Nl * C, MEM_ACTIVATIONS);
    s->dln = mem_alloc_floats((size_t)s->Nl * C, MEM_ACTIVATIONS);
    s->full = m->encoded;
    s->dfull = m->dres;
    // chapter 4's block activations were set-up's, never training's: the
    // peaks the summary reports start from what training holds
    mem_reset_peaks();
}

void sp_free(SP* s) {
    float* bufs[] = {s->shards, s->slices, s->transient, s->x0, s->dres, s->dln};
    for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++) mem_free(bufs[i]);
    tp_free(&s->m);  // m.blocks and m.transient are NULL: mem_free(NULL) does nothing
}

// ---------------------------------------------------------------- the step's rest, and the run's

float sp_optimizer_step(SP* s, const TrainArgs* args, int step) {
    double t0 = trace_start();
    float norm = tp_step(&s->m, args, step + 1);
    trace_compute(t0, "optimizer");
    return norm;
}

void sp_ckpt(Ckpt* ck, SP* s) { tp_ckpt_lists(ck, &s->m); }

void sp_print_setup(const SP* s, const Run* run) {
    const TPModel* m = &s->m;
    int L = m->cfg.num_layers;
    print0("chapter 6, sequence parallelism: tp=%d x dp=%d; a tp rank holds %zu of %zu parameters and runs "
           "the LayerNorms and residuals on %d of its tp group's %d tokens; ZeRO-%d over dp, device %s\n",
           m->ntp, run->axes[AXIS_DP].size, m->numel, gpt_num_params(&m->cfg), s->Nl, s->N, s->zero, run->device);
    // what a layer keeps, from the allocator's counts: chapter 4's block
    // keeps its non-tensor-parallel part on every token, this one on Nl
    size_t ch4_nontp = s->ch4_block_bytes - s->slice_bytes;
    print0("activations kept per layer: %zu bytes (chapter 4: %zu); of them on the token shard (LayerNorms, "
           "residual stream): %zu bytes (chapter 4, on every token: %zu, %.0f times as much)\n",
           (s->shard_bytes + s->slice_bytes) / L, s->ch4_block_bytes / L, s->shard_bytes / L, ch4_nontp / L,
           (double)ch4_nontp / (double)s->shard_bytes);
    // (it recomputes after the gather of each block in backward)
    train_print_recompute(s->recompute,
                          s->recompute == RECOMPUTE_FULL ? ", with the block's 2 tp all-gathers and 2 reduce-scatters again" : "");
    tp_show_sharding(m, run->args.show_sharding);  // --show-sharding: chapter 4's table
}

void sp_summary(const SP* s, JsonBuf* extra) {
    const TPModel* m = &s->m;
    int L = m->cfg.num_layers;
    size_t ch4_nontp = s->ch4_block_bytes - s->slice_bytes;
    json_add_int(extra, "sp", 1);
    json_add_int(extra, "zero", s->zero);
    json_add_int(extra, "prefetch", s->prefetch);
    json_add_int(extra, "reshard", s->reshard);
    json_add_int(extra, "tp_shard_params", (long long)m->numel);
    json_add_int(extra, "shard_params", (long long)m->f.shard_total);
    json_add_int(extra, "tokens_per_tp_rank", s->Nl);
    json_add_int(extra, "layer_acts_bytes", (long long)((s->shard_bytes + s->slice_bytes) / L));
    json_add_int(extra, "layer_acts_bytes_ch4", (long long)(s->ch4_block_bytes / L));
    json_add_int(extra, "layer_token_shard_bytes", (long long)(s->shard_bytes / L));
    json_add_int(extra, "layer_token_shard_bytes_ch4", (long long)(ch4_nontp / L));
    json_add_string(extra, "recompute", recompute_name(s->recompute));
}

int sp_finish(SP* s, const TrainArgs* args, int ln_agree) {
    TPModel* m = &s->m;
    float* shard = fsdp_gather_host(&m->f);
    int agree = tp_replicas_agree(m, shard);
    print0("LayerNorm gradients (summed over tp): %s\n",
           ln_agree ? "bit-identical on every tp rank at every step" : "DIFFERENT between tp ranks");
    print0("replicated tensors (LayerNorms, row-parallel biases, wpe, lnf) and losses: %s on every tp rank\n",
           agree ? "bit-identical" : "DIFFERENT");
    float* full = train_wants_params(args) ? tp_gather_full_model(m, shard) : NULL;
    train_finish_params(args, &m->cfg, m->T, full);  // --sample, --save: the whole model on rank 0
    free(full);
    free(shard);
    return agree && ln_agree ? 0 : 1;
}
