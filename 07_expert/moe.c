// moe.c: the mixture-of-experts GPT's layout, init, block pieces and file
// (moe.h). The communication of expert parallelism is not here: it is the
// chapter's (07_expert/main.c).
#include "moe.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "atomic_file.h"
#include "init.h"
#include "model_file.h"  // model_file_open
#include "ops.h"

const char* moe_config_problem(const MoeConfig* c) {
    if (c->experts < 1 || c->experts > MOE_MAX_EXPERTS) return "--experts must be between 1 and 256";
    if (c->top_k < 1 || c->top_k > c->experts) return "--top-k must be between 1 and --experts";
    if (c->hidden < 1) return "--expert-hidden must be >= 1";
    if (c->moe_every < 1) return "--moe-every must be >= 1";
    if (moe_num_moe_layers(c) == 0) return "--moe-every is larger than the number of layers: no layer has experts";
    // in doubles: a crafted header must not wrap moe_num_params to a file size (gpt_config_problem's limit)
    if ((double)moe_num_moe_layers(c) * c->experts * (2.0 * c->hidden + 1.0) * (c->gpt.channels + 1.0) > 0x1p40)
        return "the model is too large: its experts' parameter count exceeds 2^40 (--experts x --expert-hidden)";
    return NULL;
}

const char* moe_overlap_problem(int ep_overlap, long tokens, char* msg, size_t len) {
    if (ep_overlap >= 1 && ep_overlap <= tokens) return NULL;
    snprintf(msg, len, "--ep-overlap %d: each MoE layer's exchanges are cut into that many chunks of a rank's %ld "
             "tokens, so it must be between 1 and %ld", ep_overlap, tokens, tokens);
    return msg;
}

// Local layer l is global layer first_layer + l (a pipeline chunk's); the
// MoE layers before global layer g are g / moe_every of them.
int moe_is_moe_layer(const MoeConfig* c, int l) { return (c->first_layer + l + 1) % c->moe_every == 0; }
int moe_num_moe_layers(const MoeConfig* c) {
    return (c->first_layer + c->gpt.num_layers) / c->moe_every - c->first_layer / c->moe_every;
}
int moe_layer_index(const MoeConfig* c, int l) {
    return (c->first_layer + l + 1) / c->moe_every - 1 - c->first_layer / c->moe_every;
}

// ---------------------------------------------------------------- shared parameters

size_t moe_attn_numel(int C) { return 4 * (size_t)C * C + 8 * (size_t)C; }

// What tp splits of a layer: attention's qkvw, qkvb, attprojw (4C^2 + 3C)
// and a dense layer's fcw, fcb, fcprojw (8C^2 + 4C); fcprojb stays whole.
static size_t split_attn(size_t C) { return 4 * C * C + 3 * C; }
static size_t split_mlp(size_t C) { return 8 * C * C + 4 * C; }

size_t moe_tp_numel(const MoeConfig* c, int l, int tp) {
    size_t C = (size_t)c->gpt.channels;
    return (split_attn(C) + (moe_is_moe_layer(c, l) ? 0 : split_mlp(C))) / (size_t)tp;
}

BlockParams moe_tp_params(const MoeConfig* c, BlockParams p, float* w, int l, int tp) {
    size_t C = (size_t)c->gpt.channels, Cl = C / (size_t)tp, Fl = 4 * Cl;
    p.qkvw = w;                           // (3C/tp, C): my heads' q, k, v rows
    p.qkvb = w + 3 * Cl * C;              // (3C/tp)
    p.attprojw = p.qkvb + 3 * Cl;         // (C, C/tp): my heads' columns
    if (moe_is_moe_layer(c, l)) return p;
    p.fcw = p.attprojw + C * Cl;          // (4C/tp, C): my hidden units' rows
    p.fcb = p.fcw + Fl * C;               // (4C/tp)
    p.fcprojw = p.fcb + Fl;               // (C, 4C/tp): my hidden units' columns
    return p;
}

size_t moe_tp_offset(const MoeConfig* c, int l, int tp) {
    size_t off = 0;
    for (int i = 0; i < l; i++) off += moe_tp_numel(c, i, tp);
    return off;
}

// The attention half's floats in the shared buffer: with tp > 1, without
// the qkvw, qkvb and attprojw that tp splits.
static size_t attn_numel(const MoeConfig* c) {
    int C = c->gpt.channels;
    return moe_attn_numel(C) - (c->tp > 1 ? split_attn((size_t)C) : 0);
}

size_t moe_block_numel(const MoeConfig* c, int l) {
    int C = c->gpt.channels;
    size_t dense = gpt_block_numel(C) - moe_attn_numel(C) - (c->tp > 1 ? split_mlp((size_t)C) : 0);
    return attn_numel(c) + (moe_is_moe_layer(c, l) ? (size_t)c->experts * C : dense);
}

// Tensor t is in the shared buffer (not split over tp)
static int in_shared(const MoeConfig* c, ParamTensor t) {
    return c->tp <= 1 || !(t == P_QKVW || t == P_QKVB || t == P_ATTPROJW || t == P_FCW || t == P_FCB || t == P_FCPROJW);
}

size_t moe_wte_offset(const MoeConfig* c) { (void)c; return 0; }
size_t moe_wpe_offset(const MoeConfig* c) { return (size_t)c->gpt.padded_vocab_size * c->gpt.channels; }

size_t moe_block_offset(const MoeConfig* c, int l) {
    size_t off = moe_wpe_offset(c) + (size_t)c->gpt.max_seq_len * c->gpt.channels;
    for (int i = 0; i < l; i++) off += moe_block_numel(c, i);
    return off;
}

size_t moe_lnf_offset(const MoeConfig* c) { return moe_block_offset(c, c->gpt.num_layers); }
size_t moe_num_shared(const MoeConfig* c) { return moe_lnf_offset(c) + 2 * (size_t)c->gpt.channels; }
size_t moe_num_params(const MoeConfig* c) {
    return moe_num_shared(c) + (size_t)moe_num_moe_layers(c) * c->experts * moe_expert_numel(c);
}

BlockParams moe_block_params(const MoeConfig* c, float* shared, int l) {
    return moe_block_params_in(c, shared + moe_block_offset(c, l), l);
}

BlockParams moe_block_params_in(const MoeConfig* c, float* base, int l) {
    int C = c->gpt.channels;
    // the first 8 tensors are laid out as in a dense block: block_params_at
    // places them; an MoE block has no fc* (its router follows ln2b)
    BlockParams p = block_params_at(base, C);
    if (c->tp > 1) {
        // the same order without qkvw, qkvb, attprojw, fcw, fcb, fcprojw (a
        // tp rank's slices of them live elsewhere): ln1w ln1b attprojb ln2w
        // ln2b, then a dense layer's fcprojb
        p.qkvw = p.qkvb = p.attprojw = p.fcw = p.fcb = p.fcprojw = NULL;
        p.attprojb = base + 2 * C, p.ln2w = base + 3 * C, p.ln2b = base + 4 * C, p.fcprojb = base + 5 * C;
    }
    if (moe_is_moe_layer(c, l)) p.fcw = p.fcb = p.fcprojw = p.fcprojb = NULL;
    return p;
}

float* moe_router_at(const MoeConfig* c, float* shared, int l) {
    return moe_router_in(c, shared + moe_block_offset(c, l));
}

float* moe_router_in(const MoeConfig* c, float* block) { return block + attn_numel(c); }

// ---------------------------------------------------------------- expert parameters

size_t moe_expert_numel(const MoeConfig* c) {
    size_t H = (size_t)c->hidden, C = (size_t)c->gpt.channels;
    return 2 * H * C + H + C;
}

ExpertParams moe_expert_at(const MoeConfig* c, float* experts, int m, int le, int n_local) {
    size_t H = (size_t)c->hidden, C = (size_t)c->gpt.channels;
    float* base = experts + ((size_t)m * n_local + le) * moe_expert_numel(c);
    ExpertParams p;
    p.fcw = base;
    p.fcb = base + H * C;
    p.fcprojw = p.fcb + H;
    p.fcprojb = p.fcprojw + C * H;
    return p;
}

// ---------------------------------------------------------------- init

// the router's tensor id for init_normal_at: past the GPT's 16
#define ROUTER_TENSOR_ID NUM_PARAM_TENSORS

// Floats [o, o + n) of the layout hold tensor t of layer l (the router:
// ROUTER_TENSOR_ID); the ones in [lo, hi) go to out[. - lo].
static void init_run(float* out, size_t lo, size_t hi, size_t o, size_t n, const GPTConfig* g, uint64_t seed, int t,
                     int l) {
    for (size_t i = o < lo ? lo - o : 0; i < n && o + i < hi; i++)
        out[o + i - lo] = t == ROUTER_TENSOR_ID ? (float)(0.02 * init_normal_at(seed, t, l, i))
                                                : gpt_init_value(g, seed, (ParamTensor)t, l, i);
}

void moe_init_shared(float* out, const MoeConfig* c, size_t lo, size_t n, uint64_t seed) {
    const GPTConfig* g = &c->gpt;
    int C = g->channels, L = g->num_layers;
    size_t hi = lo + n;
    init_run(out, lo, hi, moe_wte_offset(c), param_tensor_numel(g, P_WTE), g, seed, P_WTE, 0);
    init_run(out, lo, hi, moe_wpe_offset(c), param_tensor_numel(g, P_WPE), g, seed, P_WPE, 0);
    for (int l = 0; l < L; l++) {
        size_t o = moe_block_offset(c, l);
        // the dense block's tensors in their order, the 8 of the attention
        // half alone in an MoE block
        ParamTensor last = moe_is_moe_layer(c, l) ? P_LN2B : P_FCPROJB;
        for (ParamTensor t = P_LN1W; t <= last; t++) {
            if (!in_shared(c, t)) continue;  // a tp rank's slices
            init_run(out, lo, hi, o, param_tensor_numel(g, t), g, seed, t, l);
            o += param_tensor_numel(g, t);
        }
        if (moe_is_moe_layer(c, l)) init_run(out, lo, hi, o, (size_t)c->experts * C, g, seed, ROUTER_TENSOR_ID, l);
    }
    init_run(out, lo, hi, moe_lnf_offset(c), (size_t)C, g, seed, P_LNFW, 0);
    init_run(out, lo, hi, moe_lnf_offset(c) + C, (size_t)C, g, seed, P_LNFB, 0);
}

void moe_init_experts(float* out, const MoeConfig* c, int l0, int n_layers, int e0, int n_local, uint64_t seed) {
    const GPTConfig* g = &c->gpt;
    size_t H = (size_t)c->hidden, C = (size_t)g->channels;
    for (int l = l0, m = 0; l < l0 + n_layers; l++) {
        if (!moe_is_moe_layer(c, l)) continue;
        for (int le = 0; le < n_local; le++) {
            // expert e takes the dense MLP's init of "layer" l + e*L: expert
            // 0 is the dense model's MLP, the others differ
            int layer = l + (e0 + le) * g->num_layers;
            ExpertParams p = moe_expert_at(c, out, m, le, n_local);
            for (size_t i = 0; i < H * C; i++) p.fcw[i] = gpt_init_value(g, seed, P_FCW, layer, i);
            for (size_t i = 0; i < H; i++) p.fcb[i] = gpt_init_value(g, seed, P_FCB, layer, i);
            for (size_t i = 0; i < C * H; i++) p.fcprojw[i] = gpt_init_value(g, seed, P_FCPROJW, layer, i);
            for (size_t i = 0; i < C; i++) p.fcprojb[i] = gpt_init_value(g, seed, P_FCPROJB, layer, i);
        }
        m++;
    }
}

// ---------------------------------------------------------------- the block's pieces

void moe_attention_in(const BlockParams* p, BlockActs* a, const float* x, int N, int C) {
    layernorm_forward(a->ln1, a->ln1_mean, a->ln1_rstd, x, p->ln1w, p->ln1b, N, C);
    matmul_forward(a->qkv, a->ln1, p->qkvw, p->qkvb, N, C, 3 * C);
}

void moe_attention_out(const BlockParams* p, BlockActs* a, const float* x, int N, int C) {
    matmul_forward(a->attproj, a->atty, p->attprojw, p->attprojb, N, C, C);
    residual_forward(a->res2, x, a->attproj, (size_t)N * C);
    layernorm_forward(a->ln2, a->ln2_mean, a->ln2_rstd, a->res2, p->ln2w, p->ln2b, N, C);
}

void moe_attention_forward(const BlockParams* p, BlockActs* a, const float* x, int B, int T,
                           int C, int NH) {
    // block_forward's attention half, line for line
    moe_attention_in(p, a, x, B * T, C);
    attention_flash_forward(a->atty, a->lse, a->qkv, B, T, C, NH);
    moe_attention_out(p, a, x, B * T, C);
}

void moe_attention_backward_out(const BlockParams* p, const BlockActs* a, const BlockScratch* s,
                                const float* dln2, float* dres, int N, int C) {
    size_t NC = (size_t)N * C;
    // block_backward_input from ln2 down to d atty
    layernorm_backward(dres, NULL, NULL, dln2, a->res2, p->ln2w, a->ln2_mean, a->ln2_rstd, N, C);
    // d res2 is attproj's d-output: kept for its weight gradient
    float* dattproj = s->dfch_gelu;  // (N, C) of the (N, 4C) scratch
    ops_copy(dattproj, dres, NC);
    ops_zero(s->datty, NC);
    matmul_backward(s->datty, NULL, NULL, dres, NULL, p->attprojw, N, C, C);
    ops_zero(s->dqkv, 3 * NC);
}

void moe_attention_backward_in(const BlockParams* p, BlockParams* g, const BlockActs* a,
                               const BlockScratch* s, const float* x, const float* dln2, float* dres,
                               int N, int C, const WeightGradHook* wg) {
    size_t NC = (size_t)N * C;
    float* dattproj = s->dfch_gelu;
    float* dln1 = s->dfch_gelu + NC;
    ops_zero(dln1, NC);
    matmul_backward(dln1, NULL, NULL, s->dqkv, NULL, p->qkvw, N, C, 3 * C);
    layernorm_backward(dres, NULL, NULL, dln1, x, p->ln1w, a->ln1_mean, a->ln1_rstd, N, C);
    // then the weight half's five gradients of these tensors, in
    // block_backward's order
    layernorm_backward(NULL, g->ln2w, g->ln2b, dln2, a->res2, NULL, a->ln2_mean, a->ln2_rstd, N, C);
    weight_grad(wg, g->attprojw, g->attprojb, dattproj, a->atty, N, C, C);
    weight_grad(wg, g->qkvw, g->qkvb, s->dqkv, a->ln1, N, C, 3 * C);
    layernorm_backward(NULL, g->ln1w, g->ln1b, dln1, x, NULL, a->ln1_mean, a->ln1_rstd, N, C);
}

void moe_attention_backward(const BlockParams* p, BlockParams* g, const BlockActs* a,
                            const BlockScratch* s, const float* x, const float* dln2, float* dres,
                            int B, int T, int C, int NH) {
    moe_attention_backward_out(p, a, s, dln2, dres, B * T, C);
    attention_flash_backward(s->dqkv, s->datty, a->qkv, a->atty, a->lse, B, T, C, NH);
    moe_attention_backward_in(p, g, a, s, x, dln2, dres, B * T, C, NULL);
}

void moe_expert_forward(const ExpertParams* p, float* out, float* fch, float* fch_gelu,
                        const float* in, int n, int C, int H) {
    if (n == 0) return;
    // the dense block's MLP half, on this expert's rows. --ep-overlap cuts
    // these rows into chunks, so the products are the row-by-row ones
    // (ops.h): each row's bits do not depend on how many rows a call holds,
    // which BLAS does not promise, and every n gives the same bits
    matmul_forward_rowwise(fch, in, p->fcw, p->fcb, n, C, H);
    gelu_forward(fch_gelu, fch, (size_t)n * H);
    matmul_forward_rowwise(out, fch_gelu, p->fcprojw, p->fcprojb, n, H, C);
}

void moe_expert_backward_input(const ExpertParams* p, float* din, const float* dout, const float* fch,
                               float* dfch, float* dfch_gelu, int n, int C, int H) {
    if (n == 0) return;
    size_t nH = (size_t)n * H;
    ops_zero(dfch_gelu, nH);
    matmul_backward_input_rowwise(dfch_gelu, dout, p->fcprojw, n, H, C);  // row by row, as forward
    ops_zero(dfch, nH);
    gelu_backward(dfch, fch, dfch_gelu, nH);
    matmul_backward_input_rowwise(din, dfch, p->fcw, n, C, H);
}

double moe_flops_per_token(const MoeConfig* c, int T) {
    const GPTConfig* g = &c->gpt;
    double C = g->channels, L = g->num_layers, weights = (double)g->padded_vocab_size * C;
    for (int l = 0; l < g->num_layers; l++) {
        weights += 4.0 * C * C;  // qkv, attproj
        if (moe_is_moe_layer(c, l)) weights += (double)c->experts * C + c->top_k * 2.0 * c->hidden * C;
        else weights += 8.0 * C * C;
    }
    return 6.0 * weights + 12.0 * L * T * C;
}

size_t moe_active_params(const MoeConfig* c) {
    MoeConfig whole = *c;  // the whole model's, tp split or not
    whole.tp = 1;
    return moe_num_shared(&whole) + (size_t)moe_num_moe_layers(c) * c->top_k * moe_expert_numel(c);
}

// ---------------------------------------------------------------- checkpoint

#define CKPT_MAGIC 20240326

const char* moe_checkpoint_read_config(const char* path, MoeConfig* c, char* msg, size_t len) {
    FILE* f = model_file_open(path, msg, len);  // a directory or a pipe refused
    if (!f) return msg;
    int h[256];
    size_t got = fread(h, sizeof(int), 256, f);
    fclose(f);
    if (got != 256 || h[0] != CKPT_MAGIC) {
        snprintf(msg, len, "'%s' is not a checkpoint (no llm.c header)", path);
        return msg;
    }
    if (h[1] != MOE_CHECKPOINT_VERSION) {
        snprintf(msg, len, "'%s' is not a mixture-of-experts checkpoint (version %d, ours is %d): a dense llm.c "
                 "file has no router and no experts to load; start from a preset (--model tiny) with --experts E",
                 path, h[1], MOE_CHECKPOINT_VERSION);
        return msg;
    }
    memset(c, 0, sizeof(*c));
    c->gpt.max_seq_len = h[2];
    c->gpt.vocab_size = h[3];
    c->gpt.num_layers = h[4];
    c->gpt.num_heads = h[5];
    c->gpt.channels = h[6];
    c->gpt.padded_vocab_size = h[7];
    c->experts = h[8];
    c->top_k = h[9];
    c->hidden = h[10];
    c->moe_every = h[11];
    const char* bad = gpt_config_problem(&c->gpt);
    if (!bad) bad = moe_config_problem(c);
    if (bad) {
        snprintf(msg, len, "checkpoint '%s' has an unusable config: %s", path, bad);
        return msg;
    }
    f = fopen(path, "rb");
    long size = f && fseek(f, 0, SEEK_END) == 0 ? ftell(f) : -1;
    if (f) fclose(f);
    long want = (long)(256 * sizeof(int) + (moe_num_shared(c) + (size_t)moe_num_moe_layers(c) * c->experts *
                                            moe_expert_numel(c)) * sizeof(float));
    if (size != want) {
        snprintf(msg, len, "checkpoint '%s' has %ld bytes, but its header needs %ld: the file is truncated or corrupt",
                 path, size, want);
        return msg;
    }
    return NULL;
}

const char* moe_checkpoint_read(const char* path, const MoeConfig* c, float* shared, float* experts,
                                int e0, int n_local, char* msg, size_t len) {
    FILE* f = model_file_open(path, msg, len);
    if (!f) return msg;
    size_t ns = moe_num_shared(c), ne = moe_expert_numel(c);
    int ok = fseek(f, 256 * sizeof(int), SEEK_SET) == 0 && fread(shared, sizeof(float), ns, f) == ns;
    const char* bad = ok ? model_file_nonfinite(path, "the parameters beside the experts", shared, ns, 0, msg, len) : NULL;
    for (int m = 0; ok && !bad && m < moe_num_moe_layers(c); m++) {
        // experts [e0, e0 + n_local) of layer m sit together: one seek, one read
        long off = (long)(256 * sizeof(int) + (ns + ((size_t)m * c->experts + e0) * ne) * sizeof(float));
        ok = fseek(f, off, SEEK_SET) == 0 &&
             fread(experts + (size_t)m * n_local * ne, sizeof(float), n_local * ne, f) == n_local * ne;
        if (ok) bad = model_file_nonfinite(path, "an MoE layer's experts", experts + (size_t)m * n_local * ne,
                                           n_local * ne, e0 * ne, msg, len);
    }
    fclose(f);
    if (bad) return bad;
    if (!ok) {
        snprintf(msg, len, "checkpoint '%s' is shorter than its header says", path);
        return msg;
    }
    return NULL;
}

const char* moe_checkpoint_write(const char* path, const MoeConfig* c, const float* shared,
                                 const float* experts, char* msg, size_t len) {
    AtomicFile out;  // a temporary file renamed over the target when complete
    int err = atomic_open(&out, path);
    if (!err) {
        int h[256] = {0};
        h[0] = CKPT_MAGIC;
        h[1] = MOE_CHECKPOINT_VERSION;
        h[2] = c->gpt.max_seq_len;
        h[3] = c->gpt.vocab_size;
        h[4] = c->gpt.num_layers;
        h[5] = c->gpt.num_heads;
        h[6] = c->gpt.channels;
        h[7] = c->gpt.padded_vocab_size;
        h[8] = c->experts;
        h[9] = c->top_k;
        h[10] = c->hidden;
        h[11] = c->moe_every;
        size_t ns = moe_num_shared(c), ne = (size_t)moe_num_moe_layers(c) * c->experts * moe_expert_numel(c);
        int ok = fwrite(h, sizeof(int), 256, out.f) == 256 && fwrite(shared, sizeof(float), ns, out.f) == ns &&
                 fwrite(experts, sizeof(float), ne, out.f) == ne;
        err = atomic_close(&out, ok);
    }
    if (err) {
        snprintf(msg, len, "writing checkpoint '%s' failed: %s", path, strerror(err));
        return msg;
    }
    return NULL;
}

// ---------------------------------------------------------------- training-state checkpoint

// The table's order: the tensor ids of moe_ckpt_add_shared and _experts.
enum {
    T_WTE, T_WPE, T_LN1W, T_LN2B = T_LN1W + 7, T_FCW, T_FCPROJB = T_FCW + 3, T_ROUTER, T_EFCW, T_EFCB, T_EFCPROJW,
    T_EFCPROJB, T_LNFW, T_LNFB
};
_Static_assert(T_LNFB + 1 == MOE_CKPT_TENSORS, "the MoE checkpoint table");

static CkptTensor tensor_of(const char* name, int nd, size_t d0, size_t d1, size_t d2, size_t d3) {
    CkptTensor t = {.nd = nd, .dims = {d0, d1, d2, d3}};
    snprintf(t.name, sizeof(t.name), "%s", name);
    return t;
}

void moe_ckpt_tensors(const MoeConfig* c, CkptTensor out[MOE_CKPT_TENSORS]) {
    const GPTConfig* g = &c->gpt;
    size_t C = (size_t)g->channels, L = (size_t)g->num_layers, Lm = (size_t)moe_num_moe_layers(c), Ld = L - Lm;
    size_t E = (size_t)c->experts, H = (size_t)c->hidden;
    out[T_WTE] = tensor_of("wte", 2, (size_t)g->padded_vocab_size, C, 0, 0);
    out[T_WPE] = tensor_of("wpe", 2, (size_t)g->max_seq_len, C, 0, 0);
    // ln1w .. ln2b: every layer has them, as in the GPT: (L, numel)
    for (ParamTensor t = P_LN1W; t <= P_LN2B; t++) {
        size_t n = param_tensor_numel(g, t);
        out[T_LN1W + (t - P_LN1W)] = t == P_QKVW       ? tensor_of("qkvw", 3, L, 3 * C, C, 0)
                                     : t == P_ATTPROJW ? tensor_of("attprojw", 3, L, C, C, 0)
                                                       : tensor_of(param_tensor_name(t), 2, L, n, 0, 0);
    }
    // the dense MLP over the dense layers only
    out[T_FCW] = tensor_of("fcw", 3, Ld, 4 * C, C, 0);
    out[T_FCW + 1] = tensor_of("fcb", 2, Ld, 4 * C, 0, 0);
    out[T_FCW + 2] = tensor_of("fcprojw", 3, Ld, C, 4 * C, 0);
    out[T_FCPROJB] = tensor_of("fcprojb", 2, Ld, C, 0, 0);
    out[T_ROUTER] = tensor_of("router", 3, Lm, E, C, 0);
    out[T_EFCW] = tensor_of("expert_fcw", 4, Lm, E, H, C);
    out[T_EFCB] = tensor_of("expert_fcb", 3, Lm, E, H, 0);
    out[T_EFCPROJW] = tensor_of("expert_fcprojw", 4, Lm, E, C, H);
    out[T_EFCPROJB] = tensor_of("expert_fcprojb", 3, Lm, E, C, 0);
    out[T_LNFW] = tensor_of("lnfw", 1, C, 0, 0, 0);
    out[T_LNFB] = tensor_of("lnfb", 1, C, 0, 0, 0);
}

void moe_ckpt_variant(const MoeConfig* c, char* out, size_t len) {
    snprintf(out, len, "mixture-of-experts experts=%d top_k=%d expert_hidden=%d moe_every=%d", c->experts, c->top_k,
             c->hidden, c->moe_every);
}

int moe_ckpt_dense(const MoeConfig* c) { return c->experts == 1 && c->hidden == 4 * c->gpt.channels; }

// Tensor t of the MoE table as the checkpoint names it: itself, or in the
// dense form the GPT's (ParamTensor: the first 14 are the same ids; the one
// expert's four are the MLP's; no router: -1).
static int ckpt_id(const MoeConfig* c, int t) {
    if (!moe_ckpt_dense(c) || t <= T_FCPROJB) return t;
    if (t == T_ROUTER) return -1;
    return t >= T_LNFW ? P_LNFW + (t - T_LNFW) : P_FCW + (t - T_EFCW);
}

// The part of [lo, hi) of a flat buffer (values from data, which holds
// element lo) that falls on the piece at flat offset `off` of n floats,
// which is elements [gstart, gstart + n) of tensor t.
static void add_piece(CkptList* l, CkptKind kind, int t, size_t off, size_t n, size_t gstart, size_t lo, size_t hi,
                      float* data) {
    size_t a = off > lo ? off : lo, b = off + n < hi ? off + n : hi;
    if (a >= b || t < 0) return;
    CkptSlice s = {.kind = kind, .tensor = t, .start = gstart + (a - off), .len = b - a, .count = 1,
                   .data = data + (a - lo)};
    ckpt_add(l, s);
}

void moe_ckpt_add_shared(CkptList* l, const MoeConfig* c, CkptKind kind, size_t lo, size_t n, float* data) {
    const GPTConfig* g = &c->gpt;
    size_t hi = lo + n, C = (size_t)g->channels;
    int dense_form = moe_ckpt_dense(c);
    add_piece(l, kind, T_WTE, moe_wte_offset(c), param_tensor_numel(g, P_WTE), 0, lo, hi, data);
    add_piece(l, kind, T_WPE, moe_wpe_offset(c), param_tensor_numel(g, P_WPE), 0, lo, hi, data);
    for (int layer = 0, dense = 0; layer < g->num_layers; layer++) {
        size_t off = moe_block_offset(c, layer);
        // the attention half: the dense block's first 8 tensors, in order
        for (ParamTensor t = P_LN1W; t <= P_LN2B; t++) {
            size_t tn = param_tensor_numel(g, t);
            if (!in_shared(c, t)) continue;  // a tp slice's: the capstone lists them
            add_piece(l, kind, T_LN1W + (t - P_LN1W), off, tn, (size_t)layer * tn, lo, hi, data);
            off += tn;
        }
        if (moe_is_moe_layer(c, layer)) {
            size_t rn = (size_t)c->experts * C;
            add_piece(l, kind, ckpt_id(c, T_ROUTER), off, rn, (size_t)moe_layer_index(c, layer) * rn, lo, hi, data);
        } else {  // the dense form: the GPT's MLP of every layer
            for (ParamTensor t = P_FCW; t <= P_FCPROJB; t++) {
                size_t tn = param_tensor_numel(g, t);
                if (!in_shared(c, t)) continue;  // a tp slice's: the capstone lists them
                add_piece(l, kind, T_FCW + (t - P_FCW), off, tn, (size_t)(dense_form ? layer : dense) * tn, lo, hi, data);
                off += tn;
            }
            dense++;
        }
    }
    add_piece(l, kind, ckpt_id(c, T_LNFW), moe_lnf_offset(c), C, 0, lo, hi, data);
    add_piece(l, kind, ckpt_id(c, T_LNFB), moe_lnf_offset(c) + C, C, 0, lo, hi, data);
}

void moe_ckpt_add_experts(CkptList* l, const MoeConfig* c, CkptKind kind, int e0, int n_local, float* data) {
    moe_ckpt_add_expert_layers(l, c, kind, 0, moe_num_moe_layers(c), e0, n_local, data);
}

void moe_ckpt_add_expert_layers(CkptList* l, const MoeConfig* c, CkptKind kind, int m0, int n_layers, int e0,
                                int n_local, float* data) {
    size_t H = (size_t)c->hidden, C = (size_t)c->gpt.channels, E = (size_t)c->experts;
    size_t numel[4] = {H * C, H, C * H, C};
    for (int m = 0; m < n_layers; m++)
        for (int le = 0; le < n_local; le++) {
            ExpertParams p = moe_expert_at(c, data, m, le, n_local);
            float* at[4] = {p.fcw, p.fcb, p.fcprojw, p.fcprojb};
            // the global (layer, expert); the dense form's: the GPT's layer
            size_t e = moe_ckpt_dense(c) ? (size_t)((m0 + m + 1) * c->moe_every - 1)
                                         : (size_t)(m0 + m) * E + (size_t)(e0 + le);
            for (int t = 0; t < 4; t++) {
                CkptSlice s = {.kind = kind, .tensor = ckpt_id(c, T_EFCW + t), .start = e * numel[t], .len = numel[t],
                               .count = 1, .data = at[t]};
                ckpt_add(l, s);
            }
        }
}

