// model.c: the GPT's blocks, activations, and forward and backward passes
// (model.h).
#include "model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "init.h"
#include "memory.h"
#include "model_tp.h"
#include "trace.h"

// One block's 12 tensors at base, in the file's order. Each layout here is
// written once, for a block cut over tp tensor-parallel ranks (chapter 4,
// model_tp.h): a rank holds 1/tp of each matrix's output rows (qkvw, fcw) or
// input columns (attprojw, fcprojw), the biases that go with them, and every
// other vector whole. Every other chapter runs the whole block: read tp as 1
// and C/tp as C. One function for both, so the two cannot drift apart.
BlockParams block_params_at(float* base, int C) { return block_params_at_tp(base, C, 1); }

BlockParams block_params_at_tp(float* base, int C, int tp) {
    size_t c = (size_t)C, cl = c / (size_t)tp;  // cl: this rank's share of C
    BlockParams p;
    p.ln1w = base;             base += c;           // (C)
    p.ln1b = base;             base += c;           // (C)
    p.qkvw = base;             base += 3 * cl * c;  // (3C/tp, C)
    p.qkvb = base;             base += 3 * cl;      // (3C/tp)
    p.attprojw = base;         base += c * cl;      // (C, C/tp)
    p.attprojb = base;         base += c;           // (C)
    p.ln2w = base;             base += c;           // (C)
    p.ln2b = base;             base += c;           // (C)
    p.fcw = base;              base += 4 * cl * c;  // (4C/tp, C)
    p.fcb = base;              base += 4 * cl;      // (4C/tp)
    p.fcprojw = base;          base += c * 4 * cl;  // (C, 4C/tp)
    p.fcprojb = base;                               // (C)
    return p;
}

size_t gpt_block_numel_tp(int C, int tp) {
    size_t c = (size_t)C, cl = c / (size_t)tp;
    // weights 3C*C/tp + C*C/tp + 4C*C/tp + 4C*C/tp, split biases 3C/tp + 4C/tp,
    // whole vectors ln1w ln1b attprojb ln2w ln2b fcprojb
    return 12 * cl * c + 7 * cl + 6 * c;
}

// ---------------------------------------------------------------- activations
// As the parameters: written once for tp ranks (NH/tp heads, C/tp of the
// attention and 4C/tp of the MLP's hidden width each); tp = 1 is the block.

size_t block_acts_numel(int B, int T, int C, int NH) { return block_acts_numel_tp(B, T, C, NH, 1); }

size_t block_acts_numel_tp(int B, int T, int C, int NH, int tp) {
    size_t BT = (size_t)B * T, c = (size_t)C, cl = c / (size_t)tp, nhl = (size_t)NH / (size_t)tp;
    return BT * (6 * c + 12 * cl + nhl + 4);  // tp = 1: B*T*(18C + NH + 4)
}

BlockActs block_acts_at(float* base, int B, int T, int C, int NH) {
    return block_acts_at_tp(base, B, T, C, NH, 1);
}

BlockActs block_acts_at_tp(float* base, int B, int T, int C, int NH, int tp) {
    size_t BT = (size_t)B * T, c = (size_t)C, cl = c / (size_t)tp, nhl = (size_t)NH / (size_t)tp;
    BlockActs a;
    a.ln1 = base;        base += BT * c;        // (B,T,C)
    a.ln1_mean = base;   base += BT;            // (B,T)
    a.ln1_rstd = base;   base += BT;            // (B,T)
    a.qkv = base;        base += BT * 3 * cl;   // (B,T,3C/tp)
    a.atty = base;       base += BT * cl;       // (B,T,C/tp)
    a.lse = base;        base += BT * nhl;      // (B,T,NH/tp)
    a.attproj = base;    base += BT * c;        // (B,T,C)
    a.res2 = base;       base += BT * c;        // (B,T,C)
    a.ln2 = base;        base += BT * c;        // (B,T,C)
    a.ln2_mean = base;   base += BT;            // (B,T)
    a.ln2_rstd = base;   base += BT;            // (B,T)
    a.fch = base;        base += BT * 4 * cl;   // (B,T,4C/tp)
    a.fch_gelu = base;   base += BT * 4 * cl;   // (B,T,4C/tp)
    a.fcproj = base;     base += BT * c;        // (B,T,C)
    a.res3 = base;                              // (B,T,C)
    return a;
}

// ---------------------------------------------------------------- recomputation: what a layer keeps

const char* recompute_name(RecomputeMode mode) {
    static const char* names[NUM_RECOMPUTE_MODES] = {"none", "selective", "full"};
    return mode >= 0 && mode < NUM_RECOMPUTE_MODES ? names[mode] : "?";
}

size_t block_store_numel(int B, int T, int C, int NH, RecomputeMode mode) {
    return block_store_numel_tp(B, T, C, NH, 1, mode);
}

size_t block_store_numel_tp(int B, int T, int C, int NH, int tp, RecomputeMode mode) {
    size_t BT = (size_t)B * T, c = (size_t)C, cl = c / (size_t)tp, nhl = (size_t)NH / (size_t)tp;
    switch (mode) {
        case RECOMPUTE_SELECTIVE: return BT * (4 * c + 8 * cl + nhl + 4);  // tp = 1: 12C + NH + 4
        case RECOMPUTE_FULL: return BT * c;
        default: return block_acts_numel_tp(B, T, C, NH, tp);
    }
}

size_t block_transient_numel(int B, int T, int C, int NH, RecomputeMode mode) {
    return block_transient_numel_tp(B, T, C, NH, 1, mode);
}

size_t block_transient_numel_tp(int B, int T, int C, int NH, int tp, RecomputeMode mode) {
    size_t BT = (size_t)B * T, c = (size_t)C, cl = c / (size_t)tp;
    switch (mode) {
        case RECOMPUTE_SELECTIVE: return BT * (2 * c + 4 * cl);  // tp = 1: 6C
        case RECOMPUTE_FULL: return block_acts_numel_tp(B, T, C, NH, tp);
        default: return 0;
    }
}

BlockActs block_acts_kept(float* store, float* transient, int B, int T, int C, int NH, RecomputeMode mode) {
    return block_acts_stored_tp(store, transient, B, T, C, NH, 1, mode);
}

BlockActs block_acts_stored_tp(float* store, float* transient, int B, int T, int C, int NH, int tp,
                               RecomputeMode mode) {
    size_t BT = (size_t)B * T, c = (size_t)C, cl = c / (size_t)tp, nhl = (size_t)NH / (size_t)tp;
    if (mode == RECOMPUTE_FULL) {
        // everything in the one-layer transient but the output, which the
        // next block (and this block's recompute) reads
        BlockActs a = block_acts_at_tp(transient, B, T, C, NH, tp);
        a.res3 = store;
        return a;
    }
    if (mode != RECOMPUTE_SELECTIVE) return block_acts_at_tp(store, B, T, C, NH, tp);
    // Selective: the kept fields packed in the layer's store (ln1 + stats,
    // qkv, atty, lse, res2, ln2 + stats, fch, res3: 4C + 8C/tp + NH/tp + 4
    // per token), the dropped ones (fch_gelu, attproj, fcproj: 2C + 4C/tp)
    // in the transient.
    BlockActs a;
    a.ln1 = store;        store += BT * c;
    a.ln1_mean = store;   store += BT;
    a.ln1_rstd = store;   store += BT;
    a.qkv = store;        store += BT * 3 * cl;
    a.atty = store;       store += BT * cl;
    a.lse = store;        store += BT * nhl;
    a.res2 = store;       store += BT * c;
    a.ln2 = store;        store += BT * c;
    a.ln2_mean = store;   store += BT;
    a.ln2_rstd = store;   store += BT;
    a.fch = store;        store += BT * 4 * cl;
    a.res3 = store;
    a.fch_gelu = transient;  transient += BT * 4 * cl;
    a.attproj = transient;   transient += BT * c;
    a.fcproj = transient;
    return a;
}

size_t block_scratch_numel(int B, int T, int C, int NH) { return block_scratch_numel_tp(B, T, C, NH, 1); }

size_t block_scratch_numel_tp(int B, int T, int C, int NH, int tp) {
    (void)NH;  // attention's backward needs no scratch of its own (ops.h)
    size_t BT = (size_t)B * T, c = (size_t)C, cl = c / (size_t)tp;
    return BT * (c + 12 * cl);  // tp = 1: B*T*13C
}

BlockScratch block_scratch_at(float* base, int B, int T, int C, int NH) {
    return block_scratch_at_tp(base, B, T, C, NH, 1);
}

BlockScratch block_scratch_at_tp(float* base, int B, int T, int C, int NH, int tp) {
    (void)NH;
    size_t BT = (size_t)B * T, c = (size_t)C, cl = c / (size_t)tp;
    BlockScratch s;
    s.dln = base;        base += BT * c;        // (B,T,C)
    s.dqkv = base;       base += BT * 3 * cl;   // (B,T,3C/tp)
    s.datty = base;      base += BT * cl;       // (B,T,C/tp)
    s.dfch = base;       base += BT * 4 * cl;   // (B,T,4C/tp)
    s.dfch_gelu = base;                         // (B,T,4C/tp)
    return s;
}

size_t block_stash_numel(int B, int T, int C) { return (size_t)B * T * 11 * (size_t)C; }

BlockStash block_stash_at(float* base, int B, int T, int C) {
    size_t BT = (size_t)B * T, c = (size_t)C;
    BlockStash st;
    st.dfcproj = base;   base += BT * c;
    st.dfch = base;      base += BT * 4 * c;
    st.dln2 = base;      base += BT * c;
    st.dattproj = base;  base += BT * c;
    st.dqkv = base;      base += BT * 3 * c;
    st.dln1 = base;
    return st;
}

size_t head_acts_numel(int B, int T, int C, int Vp) {
    return (size_t)B * T * ((size_t)C + (size_t)Vp + 6);
}

HeadActs head_acts_at(float* base, int B, int T, int C, int Vp) {
    size_t BT = (size_t)B * T;
    HeadActs h;
    h.lnf = base;        base += BT * C;
    h.lnf_mean = base;   base += BT;
    h.lnf_rstd = base;   base += BT;
    h.logits = base;     base += BT * Vp;
    h.rowmax = base;     base += BT;
    h.sumexp = base;     base += BT;
    h.tlogit = base;     base += BT;
    h.losses = base;
    return h;
}

// ---------------------------------------------------------------- the block

void block_forward(const BlockParams* p, BlockActs* a, const float* x,
                   int B, int T, int C, int NH) {
    int N = B * T;
    // attention half: res2 = x + attproj(attention(qkv(ln1(x))))
    layernorm_forward(a->ln1, a->ln1_mean, a->ln1_rstd, x, p->ln1w, p->ln1b, N, C);
    matmul_forward(a->qkv, a->ln1, p->qkvw, p->qkvb, N, C, 3 * C);
    attention_flash_forward(a->atty, a->lse, a->qkv, B, T, C, NH);  // keeps lse, not (T, T)
    matmul_forward(a->attproj, a->atty, p->attprojw, p->attprojb, N, C, C);
    residual_forward(a->res2, x, a->attproj, (size_t)N * C);
    // MLP half: res3 = res2 + fcproj(gelu(fc(ln2(res2))))
    layernorm_forward(a->ln2, a->ln2_mean, a->ln2_rstd, a->res2, p->ln2w, p->ln2b, N, C);
    matmul_forward(a->fch, a->ln2, p->fcw, p->fcb, N, C, 4 * C);
    gelu_forward(a->fch_gelu, a->fch, (size_t)N * 4 * C);
    matmul_forward(a->fcproj, a->fch_gelu, p->fcprojw, p->fcprojb, N, 4 * C, C);
    residual_forward(a->res3, a->res2, a->fcproj, (size_t)N * C);
}

void block_backward(const BlockParams* p, BlockParams* g, const BlockActs* a,
                    const BlockScratch* s, const float* x, float* dres,
                    int B, int T, int C, int NH) {
    size_t NC = (size_t)B * T * C;
    // The stash of one block that runs its two halves back to back lives in
    // the scratch, so the fused form needs no memory of its own: dfch and
    // dqkv are where they always were, and the four C-wide slots fill
    // dfch_gelu, which the input half is done with before it writes them.
    // (s->dln is left unused.)
    BlockStash st = {.dfcproj = s->dfch_gelu, .dfch = s->dfch, .dln2 = s->dfch_gelu + NC,
                     .dattproj = s->dfch_gelu + 2 * NC, .dqkv = s->dqkv,
                     .dln1 = s->dfch_gelu + 3 * NC};
    block_backward_input(p, a, s, &st, x, dres, B, T, C, NH);
    block_backward_weights(g, a, &st, x, B, T, C);
}

void block_backward_input(const BlockParams* p, const BlockActs* a, const BlockScratch* s,
                          BlockStash* st, const float* x, float* dres,
                          int B, int T, int C, int NH) {
    int N = B * T;
    size_t NC = (size_t)N * C;
    // The residual adds pass their gradient through unchanged, so dres is
    // updated in place: it holds d res3, then d res2, then d x. The weight
    // half needs d res3 and d res2 (the d-outputs of fcproj and attproj), so
    // they are copied out before each is overwritten.
    // MLP half, backwards
    ops_zero(s->dfch_gelu, 4 * NC);
    matmul_backward(s->dfch_gelu, NULL, NULL, dres, NULL, p->fcprojw, N, 4 * C, C);
    ops_zero(st->dfch, 4 * NC);
    gelu_backward(st->dfch, a->fch, s->dfch_gelu, 4 * NC);
    // s->dfch_gelu is dead from here on
    ops_copy(st->dfcproj, dres, NC);
    ops_zero(st->dln2, NC);
    matmul_backward(st->dln2, NULL, NULL, st->dfch, NULL, p->fcw, N, C, 4 * C);
    layernorm_backward(dres, NULL, NULL, st->dln2, a->res2, p->ln2w, a->ln2_mean, a->ln2_rstd, N, C);
    ops_copy(st->dattproj, dres, NC);
    // attention half, backwards
    ops_zero(s->datty, NC);
    matmul_backward(s->datty, NULL, NULL, dres, NULL, p->attprojw, N, C, C);
    ops_zero(st->dqkv, 3 * NC);
    attention_flash_backward(st->dqkv, s->datty, a->qkv, a->atty, a->lse, B, T, C, NH);
    ops_zero(st->dln1, NC);
    matmul_backward(st->dln1, NULL, NULL, st->dqkv, NULL, p->qkvw, N, C, 3 * C);
    layernorm_backward(dres, NULL, NULL, st->dln1, x, p->ln1w, a->ln1_mean, a->ln1_rstd, N, C);
}

void block_backward_weights(BlockParams* g, const BlockActs* a, const BlockStash* st,
                            const float* x, int B, int T, int C) {
    int N = B * T;
    // Each parameter gradient is one reduction over the tokens of a stashed
    // d-output against a forward activation; the five are independent, so
    // their order does not change a bit.
    matmul_backward(NULL, g->fcprojw, g->fcprojb, st->dfcproj, a->fch_gelu, NULL, N, 4 * C, C);
    matmul_backward(NULL, g->fcw, g->fcb, st->dfch, a->ln2, NULL, N, C, 4 * C);
    layernorm_backward(NULL, g->ln2w, g->ln2b, st->dln2, a->res2, NULL, a->ln2_mean, a->ln2_rstd, N, C);
    matmul_backward(NULL, g->attprojw, g->attprojb, st->dattproj, a->atty, NULL, N, C, C);
    matmul_backward(NULL, g->qkvw, g->qkvb, st->dqkv, a->ln1, NULL, N, C, 3 * C);
    layernorm_backward(NULL, g->ln1w, g->ln1b, st->dln1, x, NULL, a->ln1_mean, a->ln1_rstd, N, C);
}

void weight_grad(const WeightGradHook* h, float* dw, float* db, const float* dout, const float* inp, int N, int C,
                 int OC) {
    if (h && h->fn)
        h->fn(h->ctx, h->layer, dw, db, dout, inp, N, C, OC);
    else
        matmul_backward(NULL, dw, db, dout, inp, NULL, N, C, OC);
}

// ---------------------------------------------------------------- the head

void head_forward(const GPTConfig* cfg, const float* wte, const float* lnfw, const float* lnfb,
                  HeadActs* h, const float* x, const int* targets, int B, int T) {
    int N = B * T, C = cfg->channels, Vp = cfg->padded_vocab_size;
    double t0 = trace_start();
    layernorm_forward(h->lnf, h->lnf_mean, h->lnf_rstd, x, lnfw, lnfb, N, C);
    // logits (N, Vp) = lnf @ wte^T: the LM head is the token embedding, tied
    matmul_forward(h->logits, h->lnf, wte, NULL, N, C, Vp);
    crossentropy_partials(h->rowmax, h->sumexp, h->tlogit, h->logits, targets, N, Vp,
                          cfg->vocab_size, 0);
    crossentropy_loss(h->losses, h->rowmax, h->sumexp, h->tlogit, N);
    trace_compute(t0, "head forward");
}

// The two halves, untimed: head_backward runs both in one span, a split
// backward (chapter 5's zb) each in its own.
static void head_input_grad(const GPTConfig* cfg, const float* wte, const float* lnfw, HeadActs* h,
                            const float* x, const int* targets, float dloss, float* dlnf, float* dres,
                            int B, int T) {
    int N = B * T, C = cfg->channels, Vp = cfg->padded_vocab_size;
    // dlogits overwrite the logits: the fused softmax cross-entropy never
    // stores the probabilities
    crossentropy_backward(h->logits, h->logits, targets, h->rowmax, h->sumexp, dloss, N, Vp,
                          cfg->vocab_size, 0);
    ops_zero(dlnf, (size_t)N * C);
    matmul_backward(dlnf, NULL, NULL, h->logits, NULL, wte, N, C, Vp);
    ops_zero(dres, (size_t)N * C);
    layernorm_backward(dres, NULL, NULL, dlnf, x, lnfw, h->lnf_mean, h->lnf_rstd, N, C);
}

static void head_weight_grad(const GPTConfig* cfg, float* dwte, float* dlnfw, float* dlnfb,
                             const HeadActs* h, const float* x, const float* dlnf, int B, int T) {
    int N = B * T, C = cfg->channels, Vp = cfg->padded_vocab_size;
    // dwte (Vp, C) += dlogits^T @ lnf: the LM head's share of the tied embedding
    matmul_backward(NULL, dwte, NULL, h->logits, h->lnf, NULL, N, C, Vp);
    layernorm_backward(NULL, dlnfw, dlnfb, dlnf, x, NULL, h->lnf_mean, h->lnf_rstd, N, C);
}

void head_backward(const GPTConfig* cfg, const float* wte, const float* lnfw, float* dwte,
                   float* dlnfw, float* dlnfb, HeadActs* h, const float* x, const int* targets,
                   float dloss, float* dln, float* dres, int B, int T) {
    double t0 = trace_start();
    head_input_grad(cfg, wte, lnfw, h, x, targets, dloss, dln, dres, B, T);
    head_weight_grad(cfg, dwte, dlnfw, dlnfb, h, x, dln, B, T);
    trace_compute(t0, "head backward");
}

void head_backward_input(const GPTConfig* cfg, const float* wte, const float* lnfw, HeadActs* h,
                         const float* x, const int* targets, float dloss, float* dlnf,
                         float* dres, int B, int T) {
    double t0 = trace_start();
    head_input_grad(cfg, wte, lnfw, h, x, targets, dloss, dlnf, dres, B, T);
    trace_compute(t0, "head backward");
}

void head_backward_weights(const GPTConfig* cfg, float* dwte, float* dlnfw, float* dlnfb,
                           const HeadActs* h, const float* x, const float* dlnf, int B, int T) {
    double t0 = trace_start();
    head_weight_grad(cfg, dwte, dlnfw, dlnfb, h, x, dlnf, B, T);
    trace_compute(t0, "head backward weights");
}

// ---------------------------------------------------------------- activations of the whole model

void gpt_acts_create(GPTActs* a, const GPTConfig* cfg, int B, int T) {
    gpt_acts_create_recompute(a, cfg, B, T, RECOMPUTE_NONE);
}

void gpt_acts_create_recompute(GPTActs* a, const GPTConfig* cfg, int B, int T, RecomputeMode mode) {
    memset(a, 0, sizeof(*a));
    a->B = B;
    a->T = T;
    a->recompute = mode;
    int C = cfg->channels, NH = cfg->num_heads, L = cfg->num_layers, Vp = cfg->padded_vocab_size;
    size_t BT = (size_t)B * T;
    a->encoded = mem_alloc_floats(BT * C, MEM_ACTIVATIONS);
    a->blocks = mem_alloc_floats((size_t)L * block_store_numel(B, T, C, NH, mode), MEM_ACTIVATIONS);
    if (mode != RECOMPUTE_NONE)
        a->transient = mem_alloc_floats(block_transient_numel(B, T, C, NH, mode), MEM_ACTIVATIONS);
    a->head = mem_alloc_floats(head_acts_numel(B, T, C, Vp), MEM_ACTIVATIONS);
    a->scratch = mem_alloc_floats(block_scratch_numel(B, T, C, NH), MEM_ACTIVATIONS);
    a->dres = mem_alloc_floats(BT * C, MEM_ACTIVATIONS);
    a->inputs = (int*)mem_alloc(BT * sizeof(int), MEM_ACTIVATIONS);
    a->targets = (int*)mem_alloc(BT * sizeof(int), MEM_ACTIVATIONS);
    a->losses_host = mem_alloc_host(BT * sizeof(float));  // read every step (memory.h)
}

void gpt_acts_free(GPTActs* a) {
    mem_free(a->encoded);
    mem_free(a->blocks);
    mem_free(a->transient);
    mem_free(a->head);
    mem_free(a->scratch);
    mem_free(a->dres);
    mem_free(a->inputs);
    mem_free(a->targets);
    mem_free_host(a->losses_host);
    memset(a, 0, sizeof(*a));
}

// ---------------------------------------------------------------- recomputation: one layer's views

BlockActs block_acts_recompute(const BlockParams* p, float* store, float* transient, const float* x, int B, int T,
                               int C, int NH, RecomputeMode mode) {
    BlockActs v = block_acts_kept(store, transient, B, T, C, NH, mode);
    if (mode == RECOMPUTE_SELECTIVE) {
        // the same op as block_forward on the same kept input: the same bits
        // (attention kept atty and lse, all its backward reads)
        gelu_forward(v.fch_gelu, v.fch, (size_t)B * T * 4 * C);
    } else if (mode == RECOMPUTE_FULL) {
        // the whole block again from its kept input, every output in the
        // transient (its res3 too: the kept one stays as it was)
        v = block_acts_at(transient, B, T, C, NH);
        block_forward(p, &v, x, B, T, C, NH);
    }
    return v;
}

BlockActs block_acts_recompute_weights(const BlockParams* p, float* store, float* transient, const float* x, int B,
                                       int T, int C, int NH, RecomputeMode mode) {
    // of the dropped fields, the weight half reads fch_gelu only: what
    // selective recomputes anyway
    return block_acts_recompute(p, store, transient, x, B, T, C, NH, mode);
}

// Layer `layer`'s store: the same stride whatever (B, T) <= (a->B, a->T).
static float* layer_store(const GPTActs* a, const GPTConfig* cfg, int layer) {
    return a->blocks + (size_t)layer * block_store_numel(a->B, a->T, cfg->channels, cfg->num_heads, a->recompute);
}

BlockActs gpt_acts_block(const GPTActs* a, const GPTConfig* cfg, int layer, int B, int T) {
    return block_acts_kept(layer_store(a, cfg, layer), a->transient, B, T, cfg->channels, cfg->num_heads,
                           a->recompute);
}

const float* gpt_acts_block_output(const GPTActs* a, const GPTConfig* cfg, int layer, int B, int T) {
    return gpt_acts_block(a, cfg, layer, B, T).res3;
}

const float* gpt_acts_block_input(const GPTActs* a, const GPTConfig* cfg, int layer, int B, int T) {
    return layer > 0 ? gpt_acts_block_output(a, cfg, layer - 1, B, T) : a->encoded;
}

void gpt_block_forward(const GPTActs* a, const GPTConfig* cfg, int layer, const BlockParams* p, int B, int T) {
    double t0 = trace_start();
    BlockActs v = gpt_acts_block(a, cfg, layer, B, T);
    block_forward(p, &v, gpt_acts_block_input(a, cfg, layer, B, T), B, T, cfg->channels, cfg->num_heads);
    trace_compute(t0, "block %d forward", layer);
}

BlockActs gpt_acts_block_recompute(const GPTActs* a, const GPTConfig* cfg, int layer, const BlockParams* p,
                                   int B, int T) {
    if (a->recompute == RECOMPUTE_NONE) return gpt_acts_block(a, cfg, layer, B, T);
    double t0 = trace_start();
    BlockActs v = block_acts_recompute(p, layer_store(a, cfg, layer), a->transient,
                                       gpt_acts_block_input(a, cfg, layer, B, T), B, T, cfg->channels,
                                       cfg->num_heads, a->recompute);
    trace_compute(t0, "block %d recompute", layer);
    return v;
}

void gpt_block_backward(const GPTActs* a, const GPTConfig* cfg, int layer, const BlockParams* p, BlockParams* g,
                        int B, int T) {
    double t0 = trace_start();
    BlockActs v = gpt_acts_block_recompute(a, cfg, layer, p, B, T);
    BlockScratch s = gpt_acts_scratch(a, cfg);
    block_backward(p, g, &v, &s, gpt_acts_block_input(a, cfg, layer, B, T), a->dres, B, T, cfg->channels,
                   cfg->num_heads);
    trace_compute(t0, "block %d backward", layer);
}

HeadActs gpt_acts_head(const GPTActs* a, const GPTConfig* cfg, int B, int T) {
    return head_acts_at(a->head, B, T, cfg->channels, cfg->padded_vocab_size);
}

BlockScratch gpt_acts_scratch(const GPTActs* a, const GPTConfig* cfg) {
    return block_scratch_at(a->scratch, a->B, a->T, cfg->channels, cfg->num_heads);
}

void gpt_acts_load(GPTActs* a, const int* inputs, const int* targets) {
    size_t BT = (size_t)a->B * a->T;
    mem_to_device(a->inputs, inputs, BT * sizeof(int));
    mem_to_device(a->targets, targets, BT * sizeof(int));
}

float gpt_acts_mean_loss(GPTActs* a, const GPTConfig* cfg) {
    size_t BT = (size_t)a->B * a->T;
    HeadActs h = gpt_acts_head(a, cfg, a->B, a->T);
    mem_to_host(a->losses_host, h.losses, BT * sizeof(float));
    double sum = 0.0;
    for (size_t i = 0; i < BT; i++) sum += a->losses_host[i];
    return (float)(sum / (double)BT);
}

// ---------------------------------------------------------------- the whole model

void gpt_create(GPT* m, const GPTConfig* cfg, int B, int T, uint64_t seed) {
    gpt_create_recompute(m, cfg, B, T, seed, RECOMPUTE_NONE);
}

void gpt_create_recompute(GPT* m, const GPTConfig* cfg, int B, int T, uint64_t seed, RecomputeMode mode) {
    memset(m, 0, sizeof(*m));
    m->cfg = *cfg;
    m->B = B;
    m->T = T;
    size_t P = gpt_num_params(cfg);
    m->num_params = P;
    m->params = mem_alloc_floats(P, MEM_PARAMS);
    m->grads = mem_alloc_floats(P, MEM_GRADS);
    m->loss_scale = 1.0f;
    gpt_acts_create_recompute(&m->acts, cfg, B, T, mode);
    // init on the host, in chunks, then copy to the device
    size_t chunk = 1 << 20;
    float* host = xmalloc(chunk * sizeof(float));
    for (size_t start = 0; start < P; start += chunk) {
        size_t n = P - start < chunk ? P - start : chunk;
        gpt_init_range(host, start, n, cfg, seed);
        mem_to_device(m->params + start, host, n * sizeof(float));
    }
    free(host);
}

void gpt_create_optimizer(GPT* m) {
    m->m = mem_alloc_floats(m->num_params, MEM_OPTIMIZER);
    m->v = mem_alloc_floats(m->num_params, MEM_OPTIMIZER);
}

void gpt_free(GPT* m) {
    mem_free(m->params);
    mem_free(m->grads);
    mem_free(m->m);
    mem_free(m->v);
    gpt_acts_free(&m->acts);
    memset(m, 0, sizeof(*m));
}

// Forward for B sequences of T tokens already on the device.
static void forward_bt(GPT* m, int B, int T) {
    const GPTConfig* c = &m->cfg;
    int C = c->channels;
    float* P = m->params;
    double t0 = trace_start();
    encoder_forward(m->acts.encoded, m->acts.inputs, P + gpt_tensor_offset(c, P_WTE, 0),
                    P + gpt_tensor_offset(c, P_WPE, 0), B, T, C);
    trace_compute(t0, "embedding forward");
    for (int l = 0; l < c->num_layers; l++) {
        BlockParams p = block_params_at(P + gpt_block_offset(c, l), C);
        gpt_block_forward(&m->acts, c, l, &p, B, T);
    }
    const float* x = gpt_acts_block_input(&m->acts, c, c->num_layers, B, T);
    HeadActs h = gpt_acts_head(&m->acts, c, B, T);
    head_forward(c, P + gpt_tensor_offset(c, P_WTE, 0), P + gpt_tensor_offset(c, P_LNFW, 0),
                 P + gpt_tensor_offset(c, P_LNFB, 0), &h, x, m->acts.targets, B, T);
}

float gpt_forward(GPT* m, const int* inputs, const int* targets) {
    gpt_acts_load(&m->acts, inputs, targets);
    forward_bt(m, m->B, m->T);
    return gpt_acts_mean_loss(&m->acts, &m->cfg);
}

void gpt_zero_grad(GPT* m) { mem_zero(m->grads, m->num_params * sizeof(float)); }

void gpt_backward(GPT* m) { gpt_backward_hooked(m, NULL, NULL); }

void gpt_backward_hooked(GPT* m, void (*ready)(void* ctx, size_t boundary), void* ctx) {
    const GPTConfig* c = &m->cfg;
    int B = m->B, T = m->T, C = c->channels, L = c->num_layers;
    float *P = m->params, *G = m->grads;
    HeadActs h = gpt_acts_head(&m->acts, c, B, T);
    BlockScratch s = gpt_acts_scratch(&m->acts, c);
    const float* last = gpt_acts_block_input(&m->acts, c, L, B, T);
    head_backward(c, P + gpt_tensor_offset(c, P_WTE, 0), P + gpt_tensor_offset(c, P_LNFW, 0),
                  G + gpt_tensor_offset(c, P_WTE, 0), G + gpt_tensor_offset(c, P_LNFW, 0),
                  G + gpt_tensor_offset(c, P_LNFB, 0), &h, last, m->acts.targets,
                  m->loss_scale / (float)(B * T), s.dln, m->acts.dres, B, T);
    if (ready) ready(ctx, gpt_tensor_offset(c, P_LNFW, 0));
    for (int l = L - 1; l >= 0; l--) {
        BlockParams p = block_params_at(P + gpt_block_offset(c, l), C);
        BlockParams g = block_params_at(G + gpt_block_offset(c, l), C);
        gpt_block_backward(&m->acts, c, l, &p, &g, B, T);
        if (ready) ready(ctx, gpt_block_offset(c, l));
    }
    double t0 = trace_start();
    encoder_backward(G + gpt_tensor_offset(c, P_WTE, 0), G + gpt_tensor_offset(c, P_WPE, 0),
                     m->acts.dres, m->acts.inputs, B, T, C);
    trace_compute(t0, "embedding backward");
    if (ready) ready(ctx, 0);
}

double gpt_flops_per_token(const GPTConfig* cfg, int T) {
    double C = cfg->channels, L = cfg->num_layers, Vp = cfg->padded_vocab_size;
    double matmul_weights = L * 12.0 * C * C + Vp * C;
    return 6.0 * matmul_weights + 12.0 * L * (double)T * C;
}

float gpt_acts_head_forward(GPTActs* a, const GPTConfig* cfg, const float* wte, const float* lnf) {
    HeadActs h = gpt_acts_head(a, cfg, a->B, a->T);
    head_forward(cfg, wte, lnf, lnf + cfg->channels, &h,
                 gpt_acts_block_output(a, cfg, cfg->num_layers - 1, a->B, a->T), a->targets, a->B, a->T);
    return gpt_acts_mean_loss(a, cfg);
}

void gpt_acts_head_backward(GPTActs* a, const GPTConfig* cfg, const float* wte, const float* lnf, float* dwte,
                            float* dlnf) {
    int B = a->B, T = a->T;
    HeadActs h = gpt_acts_head(a, cfg, B, T);
    head_backward(cfg, wte, lnf, dwte, dlnf, dlnf + cfg->channels, &h,
                  gpt_acts_block_output(a, cfg, cfg->num_layers - 1, B, T), a->targets, 1.0f / (float)(B * T),
                  gpt_acts_scratch(a, cfg).dln, a->dres, B, T);
}

// ---------------------------------------------------------------- sampling

// splitmix64: a tiny, well-mixed random number generator for sampling
static uint64_t sample_next(uint64_t* state) {
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

void gpt_sample_with(GptNextLogits next, void* ctx, int T, int V, int Vp, const int* prompt, int len, int* out,
                     int n, uint64_t seed) {
    int total = len + n;
    int* seq = xmalloc((size_t)total * sizeof(int));
    float* row = xmalloc((size_t)Vp * sizeof(float));
    memcpy(seq, prompt, (size_t)len * sizeof(int));
    uint64_t state = seed;
    for (int i = len; i < total; i++) {
        // the model sees at most the last T tokens
        int start = i > T ? i - T : 0, t = i - start;
        next(ctx, seq + start, t, row);
        float mx = row[0];
        for (int v = 1; v < V; v++) mx = row[v] > mx ? row[v] : mx;
        double sum = 0.0;
        for (int v = 0; v < V; v++) sum += exp((double)(row[v] - mx));
        double u = (double)(sample_next(&state) >> 11) / 9007199254740992.0 * sum, acc = 0.0;
        int pick = V - 1;
        for (int v = 0; v < V; v++) {
            acc += exp((double)(row[v] - mx));
            if (u < acc) { pick = v; break; }
        }
        seq[i] = pick;
        out[i - len] = pick;
    }
    free(seq);
    free(row);
}

// The GPT's next-token logits: a forward of batch 1 on the t tokens.
static void gpt_next_logits(void* ctx, const int* window, int t, float* row) {
    GPT* m = ctx;
    const GPTConfig* c = &m->cfg;
    int* zeros = xcalloc((size_t)t, sizeof(int));
    mem_to_device(m->acts.inputs, window, (size_t)t * sizeof(int));
    mem_to_device(m->acts.targets, zeros, (size_t)t * sizeof(int));
    free(zeros);
    forward_bt(m, 1, t);
    HeadActs h = gpt_acts_head(&m->acts, c, 1, t);
    mem_to_host(row, h.logits + (size_t)(t - 1) * c->padded_vocab_size, (size_t)c->padded_vocab_size * sizeof(float));
}

void gpt_sample(GPT* m, const int* prompt, int len, int* out, int n, uint64_t seed) {
    gpt_sample_with(gpt_next_logits, m, m->T, m->cfg.vocab_size, m->cfg.padded_vocab_size, prompt, len, out, n, seed);
}

// ---------------------------------------------------------------- the MLP half alone

// block_forward's MLP lines (chapter 0's lesson reads the block whole)
void mlp_forward(const BlockParams* p, BlockActs* a, int N, int C) {
    matmul_forward(a->fch, a->ln2, p->fcw, p->fcb, N, C, 4 * C);
    gelu_forward(a->fch_gelu, a->fch, (size_t)N * 4 * C);
    matmul_forward(a->fcproj, a->fch_gelu, p->fcprojw, p->fcprojb, N, 4 * C, C);
}

// block_backward_input's MLP lines with each weight gradient beside its
// matmul (the same ops on the same rows: the same bits).
void mlp_backward(const BlockParams* p, BlockParams* g, const BlockActs* a, float* dln, const float* dout,
                  float* dfch_gelu, float* dfch, int N, int C, const WeightGradHook* wg) {
    size_t N4C = (size_t)N * 4 * C;
    ops_zero(dfch_gelu, N4C);
    matmul_backward(dfch_gelu, NULL, NULL, dout, NULL, p->fcprojw, N, 4 * C, C);
    weight_grad(wg, g->fcprojw, g->fcprojb, dout, a->fch_gelu, N, 4 * C, C);
    ops_zero(dfch, N4C);
    gelu_backward(dfch, a->fch, dfch_gelu, N4C);
    ops_zero(dln, (size_t)N * C);
    matmul_backward(dln, NULL, NULL, dfch, NULL, p->fcw, N, C, 4 * C);
    weight_grad(wg, g->fcw, g->fcb, dfch, a->ln2, N, C, 4 * C);
}
