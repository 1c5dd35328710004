// Chapter 4: tensor parallelism inside every block, FSDP across.
//
// Chapters 2 and 3 cut the batch: every rank still runs whole matmuls. Tensor
// parallelism (Megatron-LM) cuts the matmuls themselves. The tp ranks of a
// group share one batch; each holds a slice of every weight matrix:
//
//   attention  qkvw is column-parallel by heads: rank r computes the q, k and
//              v of its NH/tp heads, runs attention on them alone, and the
//              output projection attprojw is row-parallel (rank r holds the
//              columns that read its heads): each rank has a partial sum of
//              the output, and one all-reduce over tp adds them.
//   MLP        fcw column-parallel (4C/tp hidden units each), GELU local,
//              fcprojw row-parallel, one all-reduce.
//   embedding  vocabulary-parallel: rank r holds about Vp/tp rows of wte
//              (vocab_rows); a token looks itself up on the rank that holds
//              it (zero elsewhere) and one all-reduce sums.
//   LM head    the same wte rows give each rank the logits of its vocabulary
//              slice; the cross-entropy combines per-rank (max, sum of
//              exponentials, target logit), never a full (B,T,Vp) tensor.
//
// Megatron names the two halves of each split f and g:
//   f: forward identity (every rank already holds the whole input),
//      backward all-reduce (each rank holds a partial input gradient);
//   g: forward all-reduce (each rank holds a partial output),
//      backward identity.
// Every collective of the step is written below, where it happens.
//
// The dp axis (outer, ranks tp apart) is chapter 3's FSDP, linked from
// 03_fsdp/fsdp.c: each tp rank's shard of the model is cut into units
// ([wte rows, wpe], one block's tp shard per block, [lnfw lnfb]) and those
// are sharded again over the dp ranks that hold the same tp slice (ZeRO-3 by
// default: gathered just before use, with prefetch). A tp rank never sees
// another tp rank's slice; a dp rank never holds more than 1/dp of its own.
//
//   mpirun -np 4 build/chapter-4 --dp 2 --tp 2
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "args.h"
#include "comm.h"
#include "common.h"
#include "memory.h"
#include "mesh.h"
#include "model.h"
#include "model_tp.h"
#include "report.h"
#include "runtime.h"
#include "train.h"

#include "fsdp.h"

// ---------------------------------------------------------------- which rank holds what

// One piece of one tensor that a tp rank holds: rows [row0, row0 + nrows) and
// columns [col0, col0 + ncols) of layer `layer`'s copy of tensor t (stored
// (out, in), a vector as (n, 1)), at offset off of the rank's flat shard.
typedef struct {
    ParamTensor t;
    int layer;
    size_t row0, nrows, col0, ncols;
    size_t off;
    int replicated;  // the whole tensor: every tp rank holds the same copy
} Tile;

// The vocabulary rows [v0, v0 + rows) of tp rank r: ceil(Vp/tp) each, the
// last rank fewer when tp does not divide Vp (small's 256 rows over tp = 3
// are 86, 86, 84). Only the sizes of the wte slices differ between ranks.
static void vocab_rows(const GPTConfig* cfg, int tp, int r, int* v0, int* rows) {
    int per = (cfg->padded_vocab_size + tp - 1) / tp;
    *v0 = r * per;
    int left = cfg->padded_vocab_size - *v0;
    *rows = left < per ? left : per;
}

// The shard layout of a tp rank, in the order its flat buffer holds it:
//   [wte rows of rank r] [wpe] [block 0's shard] ... [block L-1's shard] [lnfw lnfb]
// where a block's shard is model_tp.h's. Writes the tiles (if out is given)
// and returns their number. This function is the whole answer to "which rank
// holds which slice of every weight".
static int shard_tiles(const GPTConfig* cfg, int tp, int r, Tile* out) {
    size_t C = (size_t)cfg->channels, Cl = C / tp, Fl = 4 * C / tp;
    int v0, Vl;
    vocab_rows(cfg, tp, r, &v0, &Vl);
    size_t off = 0;
    int n = 0;
#define TILE(T_, L_, R0, NR, C0, NC)                                                              \
    do {                                                                                          \
        size_t rows_, cols_;                                                                      \
        param_tensor_shape(cfg, T_, &rows_, &cols_);                                              \
        if (out) out[n] = (Tile){T_, L_, R0, NR, C0, NC, off, (NR) == rows_ && (NC) == cols_};    \
        off += (size_t)(NR) * (NC);                                                               \
        n++;                                                                                      \
    } while (0)
    TILE(P_WTE, 0, (size_t)v0, (size_t)Vl, 0, C);          // vocabulary rows
    TILE(P_WPE, 0, 0, (size_t)cfg->max_seq_len, 0, C);     // replicated
    for (int l = 0; l < cfg->num_layers; l++) {
        TILE(P_LN1W, l, 0, C, 0, 1);
        TILE(P_LN1B, l, 0, C, 0, 1);
        // qkvw is [q; k; v] stacked, each C rows, head h at rows h*hs..: the
        // heads of rank r are rows [r*Cl, (r+1)*Cl) of each of the three, so
        // the shard is three row ranges, and its qkv output is [q k v] of
        // those heads, the layout attention_forward reads
        for (int k = 0; k < 3; k++) TILE(P_QKVW, l, k * C + r * Cl, Cl, 0, C);
        for (int k = 0; k < 3; k++) TILE(P_QKVB, l, k * C + r * Cl, Cl, 0, 1);
        TILE(P_ATTPROJW, l, 0, C, r * Cl, Cl);             // the columns that read rank r's heads
        TILE(P_ATTPROJB, l, 0, C, 0, 1);                   // replicated, added once
        TILE(P_LN2W, l, 0, C, 0, 1);
        TILE(P_LN2B, l, 0, C, 0, 1);
        TILE(P_FCW, l, r * Fl, Fl, 0, C);                  // rank r's hidden units
        TILE(P_FCB, l, r * Fl, Fl, 0, 1);
        TILE(P_FCPROJW, l, 0, C, r * Fl, Fl);              // the columns that read them
        TILE(P_FCPROJB, l, 0, C, 0, 1);                    // replicated, added once
    }
    TILE(P_LNFW, 0, 0, C, 0, 1);
    TILE(P_LNFB, 0, 0, C, 0, 1);
#undef TILE
    return n;
}

// ---------------------------------------------------------------- the tp rank's state

typedef struct {
    GPTConfig cfg;
    const Comm *tp, *dp, *world;
    int ntp, rtp;            // tp group size, this rank's index in it
    int Vl, v0, nvalid;      // vocabulary rows held [v0, v0 + Vl), nvalid of them real tokens
    Tile* tiles;
    int ntiles;
    size_t numel;            // floats of the tp shard
    size_t wpe_off, block0_off, block_numel, lnf_off;  // where things sit in the tp shard
    // the tp shard as FSDP units over dp: unit 0 = [wte rows, wpe], unit 1+l =
    // block l's tp shard, unit L+1 = [lnfw lnfb]
    FSDP f;
    size_t* unit_off;        // (L+2) where each unit starts in the tp shard
    // activations of B sequences (this dp rank's share) of T tokens
    int B, T;
    float* encoded;          // (B,T,C)
    float* blocks;           // L * block_acts_numel_tp
    float* head;             // head_acts_numel(B, T, C, Vl): lnf, logits (B,T,Vl), partials, losses
    float* gathered;         // (tp, 3, B*T): every tp rank's cross-entropy partials
    float* scratch;          // block_scratch_numel_tp
    float* dres;             // (B,T,C)
    int *inputs, *targets;   // (B,T)
    float* losses_host;
} TP;

// The unit a tile of the tp shard lies in (no tile straddles two).
static int tile_unit(const TP* m, const Tile* tl) {
    if (tl->off < m->block0_off) return 0;
    if (tl->off >= m->lnf_off) return m->cfg.num_layers + 1;
    return 1 + (int)((tl->off - m->block0_off) / m->block_numel);
}

static BlockActs tp_acts(const TP* m, int l) {
    const GPTConfig* c = &m->cfg;
    size_t n = block_acts_numel_tp(m->B, m->T, c->channels, c->num_heads, m->ntp);
    return block_acts_at_tp(m->blocks + (size_t)l * n, m->B, m->T, c->channels, c->num_heads, m->ntp);
}

// ---------------------------------------------------------------- Megatron's f and g

// f sits where a column-parallel layer reads a whole input that every tp rank
// holds: forward nothing (each rank already has it), backward the ranks'
// partial input gradients are summed. g sits after a row-parallel layer:
// forward the ranks' partial outputs are summed, backward nothing (every
// rank needs the whole output gradient, and has it). Each is one all-reduce
// over tp of a (B,T,C) tensor, in place.
static void f_backward(const TP* m, float* dx, size_t n) { comm_allreduce(m->tp, dx, n, COMM_SUM); }
static void g_forward(const TP* m, float* y, size_t n) { comm_allreduce(m->tp, y, n, COMM_SUM); }

// ---------------------------------------------------------------- the block, split over tp

static void block_forward_tp(const TP* m, const BlockParams* p, BlockActs* a, const float* x) {
    int B = m->B, T = m->T, N = B * T, C = m->cfg.channels, tp = m->ntp;
    int Cl = C / tp, Fl = 4 * C / tp, NHl = m->cfg.num_heads / tp;
    size_t NC = (size_t)N * C;
    // attention: res2 = x + attproj(attention(qkv(ln1(x)))). The LayerNorm
    // is replicated: every tp rank normalises the same x.
    layernorm_forward(a->ln1, a->ln1_mean, a->ln1_rstd, x, p->ln1w, p->ln1b, N, C);
    // f forward (identity) -- column-parallel qkv: this rank's heads only
    matmul_forward(a->qkv, a->ln1, p->qkvw, p->qkvb, N, C, 3 * Cl);          // (N, 3C/tp)
    attention_forward(a->atty, a->att, a->qkv, B, T, Cl, NHl);               // (N, C/tp)
    // row-parallel projection: a partial sum of the output; the bias is
    // added by one rank, so the sum holds it once
    matmul_forward(a->attproj, a->atty, p->attprojw, m->rtp == 0 ? p->attprojb : NULL, N, Cl, C);
    // g forward (all-reduce): the partial sums become the output
    g_forward(m, a->attproj, NC);                                            // (N, C)
    residual_forward(a->res2, x, a->attproj, NC);
    // MLP: res3 = res2 + fcproj(gelu(fc(ln2(res2))))
    layernorm_forward(a->ln2, a->ln2_mean, a->ln2_rstd, a->res2, p->ln2w, p->ln2b, N, C);
    // f forward (identity) -- column-parallel fc: this rank's hidden units
    matmul_forward(a->fch, a->ln2, p->fcw, p->fcb, N, C, Fl);                // (N, 4C/tp)
    gelu_forward(a->fch_gelu, a->fch, (size_t)N * Fl);
    matmul_forward(a->fcproj, a->fch_gelu, p->fcprojw, m->rtp == 0 ? p->fcprojb : NULL, N, Fl, C);
    // g forward (all-reduce)
    g_forward(m, a->fcproj, NC);
    residual_forward(a->res3, a->res2, a->fcproj, NC);
}

// dres (N, C), the same on every tp rank: on entry d loss / d block output,
// on return d loss / d x. Parameter gradients accumulate into g.
static void block_backward_tp(const TP* m, const BlockParams* p, BlockParams* g, const BlockActs* a,
                              const BlockScratch* s, const float* x, float* dres) {
    int B = m->B, T = m->T, N = B * T, C = m->cfg.channels, tp = m->ntp;
    int Cl = C / tp, Fl = 4 * C / tp, NHl = m->cfg.num_heads / tp;
    size_t NC = (size_t)N * C;
    // MLP, backwards. g backward (identity): dres is already whole on every
    // rank. The row-parallel bias's gradient (sum of dres) is computed by
    // every rank alike, so the replicated bias stays the same everywhere.
    ops_zero(s->dfch_gelu, (size_t)N * Fl);
    matmul_backward(s->dfch_gelu, g->fcprojw, g->fcprojb, dres, a->fch_gelu, p->fcprojw, N, Fl, C);
    ops_zero(s->dfch, (size_t)N * Fl);
    gelu_backward(s->dfch, a->fch, s->dfch_gelu, (size_t)N * Fl);
    ops_zero(s->dln, NC);
    matmul_backward(s->dln, g->fcw, g->fcb, s->dfch, a->ln2, p->fcw, N, C, Fl);
    // f backward (all-reduce): each rank's dln is the share of its hidden
    // units; the LayerNorm's input gradient needs all of them
    f_backward(m, s->dln, NC);
    layernorm_backward(dres, g->ln2w, g->ln2b, s->dln, a->res2, p->ln2w, a->ln2_mean, a->ln2_rstd, N, C);
    // attention, backwards: the same pattern
    ops_zero(s->datty, (size_t)N * Cl);
    matmul_backward(s->datty, g->attprojw, g->attprojb, dres, a->atty, p->attprojw, N, Cl, C);
    ops_zero(s->dqkv, (size_t)N * 3 * Cl);
    attention_backward(s->dqkv, s->datt, s->datty, a->qkv, a->att, B, T, Cl, NHl);
    ops_zero(s->dln, NC);
    matmul_backward(s->dln, g->qkvw, g->qkvb, s->dqkv, a->ln1, p->qkvw, N, C, 3 * Cl);
    // f backward (all-reduce)
    f_backward(m, s->dln, NC);
    layernorm_backward(dres, g->ln1w, g->ln1b, s->dln, x, p->ln1w, a->ln1_mean, a->ln1_rstd, N, C);
}

// ---------------------------------------------------------------- forward and backward

// fsdp_unit_params(f, i) returns unit i of this tp rank's shard, whole (under
// ZeRO-3 all-gathered over dp, or waited for if a prefetch started it);
// fsdp_prefetch(f, i) starts unit i's gather to arrive behind the compute
// that follows, as in chapter 3. The tp collectives are the new part.
static float forward(TP* m, const int* inputs, const int* targets) {
    FSDP* f = &m->f;
    const GPTConfig* c = &m->cfg;
    int B = m->B, T = m->T, N = B * T, C = c->channels, L = c->num_layers, tp = m->ntp;
    size_t NC = (size_t)N * C;
    fsdp_drop_gathered(f);  // stale after the optimizer step
    mem_to_device(m->inputs, inputs, (size_t)N * sizeof(int));
    mem_to_device(m->targets, targets, (size_t)N * sizeof(int));
    float* emb = fsdp_unit_params(f, 0);  // [wte rows (Vl, C), wpe (maxT, C)]
    fsdp_prefetch(f, 1);
    // vocabulary-parallel embedding: a token's row on the rank that holds it,
    // zero on the others; wpe added by tp rank 0 only. g forward sums them.
    encoder_forward_vocab(m->encoded, m->inputs, emb, m->rtp == 0 ? emb + m->wpe_off : NULL, B, T, C, m->v0, m->Vl);
    g_forward(m, m->encoded, NC);
    const float* x = m->encoded;
    for (int l = 0; l < L; l++) {
        BlockParams p = block_params_at_tp(fsdp_unit_params(f, 1 + l), C, tp);
        fsdp_prefetch(f, l + 2);  // the next block, or [lnfw lnfb] after the last
        BlockActs a = tp_acts(m, l);
        block_forward_tp(m, &p, &a, x);
        x = a.res3;
    }
    float* lnf = fsdp_unit_params(f, L + 1);
    float* wte = fsdp_unit_params(f, 0);  // the tied LM head: this rank's wte rows again
    // the head: final LayerNorm (replicated), then f forward (identity) and this
    // rank's slice of the logits, (N, Vl): never the whole (N, Vp)
    HeadActs h = head_acts_at(m->head, B, T, C, m->Vl);
    layernorm_forward(h.lnf, h.lnf_mean, h.lnf_rstd, x, lnf, lnf + C, N, C);
    matmul_forward(h.logits, h.lnf, wte, NULL, N, C, m->Vl);
    // vocabulary-parallel cross-entropy: per row, this slice's max, sum of
    // exponentials and target logit (0 if another rank holds the target) ...
    crossentropy_partials(h.rowmax, h.sumexp, h.tlogit, h.logits, m->targets, N, m->Vl, m->nvalid, m->v0);
    // ... all-gathered (3 floats per token per rank: rowmax, sumexp, tlogit
    // sit side by side in HeadActs) and merged in rank order, so every tp rank
    // gets the same statistics of the whole vocabulary, bit for bit
    comm_allgather(m->tp, h.rowmax, m->gathered, 3 * (size_t)N);
    ops_copy(h.rowmax, m->gathered, 3 * (size_t)N);
    for (int r = 1; r < tp; r++) {
        const float* g = m->gathered + (size_t)r * 3 * N;
        crossentropy_merge(h.rowmax, h.sumexp, h.tlogit, g, g + N, g + 2 * N, N);
    }
    crossentropy_loss(h.losses, h.rowmax, h.sumexp, h.tlogit, N);
    mem_to_host(m->losses_host, h.losses, (size_t)N * sizeof(float));
    double sum = 0.0;
    for (int n = 0; n < N; n++) sum += m->losses_host[n];
    return (float)(sum / N);
}

// fsdp_grads_begin(f, i) gives the zeroed buffer unit i's gradient
// accumulates in; fsdp_reduce_grads(f, i) reduce-scatters it over dp (the
// mean over the dp ranks, each rank keeping its shard), as in chapter 3.
static void backward(TP* m) {
    FSDP* f = &m->f;
    const GPTConfig* c = &m->cfg;
    int B = m->B, T = m->T, N = B * T, C = c->channels, NH = c->num_heads, L = c->num_layers, tp = m->ntp;
    size_t NC = (size_t)N * C;
    HeadActs h = head_acts_at(m->head, B, T, C, m->Vl);
    BlockScratch s = block_scratch_at_tp(m->scratch, B, T, C, NH, tp);
    float* g_emb = fsdp_grads_begin(f, 0);
    float* g_lnf = fsdp_grads_begin(f, L + 1);
    float* lnf = fsdp_unit_params(f, L + 1);
    float* wte = fsdp_unit_params(f, 0);
    // the head: dlogits of this rank's slice from the merged statistics (in
    // place of the logits), then the partial dlnf and this slice's dwte
    crossentropy_backward(h.logits, h.logits, m->targets, h.rowmax, h.sumexp, 1.0f / (float)N, N, m->Vl,
                          m->nvalid, m->v0);
    ops_zero(s.dln, NC);
    matmul_backward(s.dln, g_emb, NULL, h.logits, h.lnf, wte, N, C, m->Vl);
    // f backward (all-reduce): every vocabulary slice adds to dlnf
    f_backward(m, s.dln, NC);
    ops_zero(m->dres, NC);
    const float* last = tp_acts(m, L - 1).res3;
    layernorm_backward(m->dres, g_lnf, g_lnf + C, s.dln, last, lnf, h.lnf_mean, h.lnf_rstd, N, C);
    if (f->zero > 1) fsdp_reduce_grads(f, L + 1);
    // the blocks, last to first: gather (prefetching the one before),
    // backward with its tp all-reduces, reduce-scatter over dp
    for (int l = L - 1; l >= 0; l--) {
        BlockParams p = block_params_at_tp(fsdp_unit_params(f, 1 + l), C, tp);
        if (l > 0) fsdp_prefetch(f, l);
        BlockParams g = block_params_at_tp(fsdp_grads_begin(f, 1 + l), C, tp);
        BlockActs a = tp_acts(m, l);
        const float* x = l > 0 ? tp_acts(m, l - 1).res3 : m->encoded;
        block_backward_tp(m, &p, &g, &a, &s, x, m->dres);
        if (f->zero > 1) fsdp_reduce_grads(f, 1 + l);
    }
    // the embedding: dres is whole on every rank (g backward: identity). The
    // token rows this rank holds add into its wte slice, which already holds
    // the LM head's share: the tied gradient collects both uses. Every rank
    // computes the whole dwpe (wpe is replicated).
    encoder_backward_vocab(g_emb, g_emb + m->wpe_off, m->dres, m->inputs, B, T, C, m->v0, m->Vl);
    if (f->zero > 1) {
        fsdp_reduce_grads(f, 0);
    } else {
        for (int i = 0; i < f->n; i++) fsdp_reduce_grads(f, i);  // ZeRO-1: every unit now
    }
}

// ---------------------------------------------------------------- the optimizer step

// The global gradient norm. The tp slices of a split tensor are disjoint
// pieces, summed over tp; a replicated tensor (LayerNorms, the row-parallel
// biases, wpe, lnf) has the same gradient on every tp rank, so only tp rank 0
// counts it: it enters the norm once, not tp times. The dp shards are
// disjoint (fsdp_grad_sumsq_range counts this rank's shard only). Then one
// all-reduce over dp and one over tp.
static float step(TP* m, const TrainArgs* args, int t) {
    double mine = 0.0;
    for (int i = 0; i < m->ntiles; i++) {
        const Tile* tl = &m->tiles[i];
        if (tl->replicated && m->rtp != 0) continue;
        int u = tile_unit(m, tl);
        mine += fsdp_grad_sumsq_range(&m->f, u, tl->off - m->unit_off[u], tl->nrows * tl->ncols);
    }
    const Comm* groups[] = {m->dp, m->tp};
    double norm = train_global_norm(mine, groups, 2);
    // AdamW on this rank's shard of its tp slice; replicated tensors get the
    // same gradient and so the same update on every tp rank
    fsdp_step(&m->f, train_adamw(args), t, grad_clip_scale(norm, args->clip));
    return (float)norm;
}

// ---------------------------------------------------------------- set-up

// The engine's fill callback: floats [lo, lo + n) of a unit are a range of
// this tp rank's shard; each tile that meets the range is initialised or read
// for the part that lies inside it (a partial first row, whole rows, a
// partial last row), so a rank builds or reads only its slices of its shard.
typedef struct {
    const TP* m;
    const char* checkpoint;  // NULL: initialise from the seed
    uint64_t seed;
} TileSource;

static const char* fill_piece(const TileSource* src, const Tile* tl, size_t row, size_t nrows, size_t col,
                              size_t ncols, float* dst, char* msg, size_t msg_len) {
    const GPTConfig* c = &src->m->cfg;
    if (src->checkpoint)
        return checkpoint_read_tile(src->checkpoint, c, dst, tl->t, tl->layer, tl->row0 + row, nrows,
                                    tl->col0 + col, ncols, msg, msg_len);
    gpt_init_tile(dst, c, src->seed, tl->t, tl->layer, tl->row0 + row, nrows, tl->col0 + col, ncols);
    return NULL;
}

static const char* fill_unit(void* ctx, int unit, size_t lo, size_t n, float* dst, char* msg, size_t msg_len) {
    const TileSource* src = ctx;
    const TP* m = src->m;
    size_t a0 = m->unit_off[unit] + lo, b0 = a0 + n;  // the range in the tp shard
    for (int i = 0; i < m->ntiles; i++) {
        const Tile* tl = &m->tiles[i];
        size_t size = tl->nrows * tl->ncols;
        size_t a = a0 > tl->off ? a0 - tl->off : 0, b = b0 - tl->off < size ? b0 - tl->off : size;
        if (b0 <= tl->off || a >= b) continue;
        // [a, b) of the tile's row-major storage
        float* out = dst + (tl->off + a - a0);
        size_t w = tl->ncols, r = a / w, col = a % w;
        const char* bad = NULL;
        if (col > 0) {  // the tail of a first, partial row
            size_t k = w - col < b - a ? w - col : b - a;
            bad = fill_piece(src, tl, r, 1, col, k, out, msg, msg_len);
            out += k, a += k, r++;
        }
        if (!bad && b - a >= w) {  // whole rows
            size_t rows = (b - a) / w;
            bad = fill_piece(src, tl, r, rows, 0, w, out, msg, msg_len);
            out += rows * w, a += rows * w, r += rows;
        }
        if (!bad && a < b) bad = fill_piece(src, tl, r, 1, 0, b - a, out, msg, msg_len);  // a last partial row
        if (bad) return bad;
    }
    return NULL;
}

static void tp_create(TP* m, const Run* run, int B, int zero, int prefetch, int reshard) {
    memset(m, 0, sizeof(*m));
    const TrainSetup* setup = &run->setup;
    m->cfg = setup->cfg;
    const GPTConfig* c = &m->cfg;
    m->tp = &run->axes[AXIS_TP];
    m->dp = &run->axes[AXIS_DP];
    m->world = &run->world;
    m->ntp = m->tp->size;
    m->rtp = m->tp->rank;
    int C = c->channels, L = c->num_layers, NH = c->num_heads, tp = m->ntp;
    vocab_rows(c, tp, m->rtp, &m->v0, &m->Vl);
    int valid = c->vocab_size - m->v0;
    m->nvalid = valid < 0 ? 0 : (valid > m->Vl ? m->Vl : valid);
    m->ntiles = shard_tiles(c, tp, m->rtp, NULL);
    m->tiles = xmalloc(sizeof(Tile) * (size_t)m->ntiles);
    shard_tiles(c, tp, m->rtp, m->tiles);
    m->wpe_off = (size_t)m->Vl * C;
    m->block0_off = m->wpe_off + (size_t)c->max_seq_len * C;
    m->block_numel = gpt_block_numel_tp(C, tp);
    m->lnf_off = m->block0_off + (size_t)L * m->block_numel;
    m->numel = m->lnf_off + 2 * (size_t)C;
    const Tile* lt = &m->tiles[m->ntiles - 1];
    CHECK(lt->off + lt->nrows * lt->ncols == m->numel, "shard tiles and layout disagree");

    // the tp shard as units, sharded over dp by the engine
    int n_units = L + 2;
    m->unit_off = xmalloc(sizeof(size_t) * n_units);
    size_t* numel = xmalloc(sizeof(size_t) * n_units);
    int* own_grads = xcalloc((size_t)n_units, sizeof(int));
    m->unit_off[0] = 0;
    numel[0] = m->block0_off;
    for (int l = 0; l < L; l++) {
        m->unit_off[1 + l] = m->block0_off + (size_t)l * m->block_numel;
        numel[1 + l] = m->block_numel;
    }
    m->unit_off[L + 1] = m->lnf_off;
    numel[L + 1] = 2 * (size_t)C;
    own_grads[0] = 1;  // the tied wte rows: used by the head first, by the embedding last
    TileSource source = {.m = m, .checkpoint = setup->checkpoint, .seed = (uint64_t)run->args.seed};
    FsdpSpec spec = {.n_units = n_units, .numel = numel, .own_grads = own_grads, .fill = fill_unit,
                     .fill_ctx = &source};
    fsdp_create(&m->f, m->dp, &spec, zero, prefetch, reshard);
    free(numel);
    free(own_grads);

    m->B = B;
    m->T = setup->T;
    size_t N = (size_t)B * m->T;
    m->encoded = mem_alloc_floats(N * C, MEM_ACTIVATIONS);
    m->blocks = mem_alloc_floats((size_t)L * block_acts_numel_tp(B, m->T, C, NH, tp), MEM_ACTIVATIONS);
    m->head = mem_alloc_floats(head_acts_numel(B, m->T, C, m->Vl), MEM_ACTIVATIONS);
    m->gathered = mem_alloc_floats((size_t)tp * 3 * N, MEM_ACTIVATIONS);
    m->scratch = mem_alloc_floats(block_scratch_numel_tp(B, m->T, C, NH, tp), MEM_ACTIVATIONS);
    m->dres = mem_alloc_floats(N * C, MEM_ACTIVATIONS);
    m->inputs = mem_alloc(N * sizeof(int), MEM_ACTIVATIONS);
    m->targets = mem_alloc(N * sizeof(int), MEM_ACTIVATIONS);
    m->losses_host = xmalloc(N * sizeof(float));
}

static void tp_free(TP* m) {
    float* bufs[] = {m->encoded, m->blocks, m->head, m->gathered, m->scratch, m->dres};
    for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++) mem_free(bufs[i]);
    mem_free(m->inputs);
    mem_free(m->targets);
    free(m->losses_host);
    free(m->tiles);
    free(m->unit_off);
    fsdp_free(&m->f);
}

// ---------------------------------------------------------------- validation, checks, saving

// The same validation tokens as every chapter: each dp rank runs its share
// of every global batch through the same forward (same gathers and tp
// collectives) as training.
static float forward_cb(void* ctx, const int* inputs, const int* targets) { return forward(ctx, inputs, targets); }

static float val_loss(TP* m, const TrainSetup* s, int n_batches) {
    return train_val_loss_with(s, n_batches, forward_cb, m, m->dp->rank * m->B, m->B, m->B, m->dp);
}

// A bitwise fingerprint of the replicated tensors in this tp rank's whole
// shard (host, on dp rank 0): equal on every tp rank iff their copies agree
// exactly. Returns 1 when they do, on every rank. Plain MPI, uncounted.
static int replicas_agree(const TP* m, const float* shard) {
    int mine = 1, all = 0;
    if (shard) {
        unsigned long long h = 0, lo, hi;
        for (int i = 0; i < m->ntiles; i++) {
            const Tile* tl = &m->tiles[i];
            if (!tl->replicated) continue;
            for (size_t k = 0; k < tl->nrows * tl->ncols; k++) {
                unsigned int bits;
                memcpy(&bits, shard + tl->off + k, sizeof(bits));
                h = h * 1099511628211ull + bits + 1;
            }
        }
        MPI_CHECK(MPI_Allreduce(&h, &lo, 1, MPI_UNSIGNED_LONG_LONG, MPI_MIN, m->tp->mpi));
        MPI_CHECK(MPI_Allreduce(&h, &hi, 1, MPI_UNSIGNED_LONG_LONG, MPI_MAX, m->tp->mpi));
        mine = lo == hi;
    }
    MPI_CHECK(MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_MIN, m->world->mpi));
    return all;
}

// The full model in the flat layout on world rank 0 (dp 0, tp 0): the tp
// ranks of dp rank 0 send it their whole shards (shard: fsdp_gather_host's),
// which it places tile by tile. NULL on every other rank.
static float* gather_full_model(const TP* m, const float* shard) {
    if (m->dp->rank != 0) return NULL;
    // shards differ in size when the vocabulary splits unevenly: each is sent
    // in a block of the largest size
    unsigned long long mine = m->numel, most = 0;
    MPI_CHECK(MPI_Allreduce(&mine, &most, 1, MPI_UNSIGNED_LONG_LONG, MPI_MAX, m->tp->mpi));
    size_t S = (size_t)most;
    float* send = mem_alloc_floats(S, MEM_OTHER);
    mem_to_device(send, shard, m->numel * sizeof(float));
    float* all = mem_alloc_floats(S * (size_t)m->ntp, MEM_OTHER);
    comm_gather(m->tp, send, all, S, 0);
    float* full = NULL;
    if (m->rtp == 0) {
        float* shards = xmalloc(S * (size_t)m->ntp * sizeof(float));
        mem_to_host(shards, all, S * (size_t)m->ntp * sizeof(float));
        full = xmalloc(gpt_num_params(&m->cfg) * sizeof(float));
        Tile* tiles = xmalloc(sizeof(Tile) * (size_t)m->ntiles);
        for (int r = 0; r < m->ntp; r++) {
            shard_tiles(&m->cfg, m->ntp, r, tiles);
            for (int i = 0; i < m->ntiles; i++) {
                const Tile* tl = &tiles[i];
                gpt_place_tile(full, &m->cfg, shards + (size_t)r * S + tl->off, tl->t, tl->layer, tl->row0,
                               tl->nrows, tl->col0, tl->ncols);
            }
        }
        free(tiles);
        free(shards);
    }
    mem_free(all);
    mem_free(send);
    return full;
}

// ---------------------------------------------------------------- main

int main(int argc, char** argv) {
    int zero = 3, prefetch = 1, reshard = 1;
    ArgSpec extra[] = {
        {"zero", ARG_INT, &zero, "ZeRO stage over dp (chapter 3): 1, 2 or 3  [3]"},
        {"prefetch", ARG_INT, &prefetch, "1: all-gather the next unit while this one computes (zero 3)  [1]"},
        {"reshard", ARG_INT, &reshard, "(zero 3) 1: free a unit after use and gather again in backward  [1]"},
    };
    Run run;
    if (!run_start(&run, argc, argv, "build/chapter-4",
                   "Chapter 4: tensor parallelism (Megatron) inside every block on --tp ranks that share a\n"
                   "batch, and FSDP (chapter 3) over --dp groups. tp is the inner axis (neighbouring ranks).",
                   extra, sizeof(extra) / sizeof(extra[0]), (1u << AXIS_DP) | (1u << AXIS_TP)))
        return 0;
    run_refuse_flags(&run, RUN_NO_CHECKPOINTS | RUN_NO_RECOMPUTE, "chapter 4");
    if (zero < 1 || zero > 3) fail_all("--zero %d: the stages are 1, 2 and 3", zero);
    if ((prefetch != 0 && prefetch != 1) || (reshard != 0 && reshard != 1))
        fail_all("--prefetch and --reshard take 0 or 1");
    if (reshard == 0 && zero != 3)
        fail_all("--reshard 0 applies to --zero 3 only: ZeRO-%d never frees parameters; drop --reshard or use --zero 3",
                 zero);
    const TrainArgs* args = &run.args;
    const TrainSetup* setup = &run.setup;
    const GPTConfig* cfg = &setup->cfg;
    int tp = run.axes[AXIS_TP].size, dp = run.axes[AXIS_DP].size;
    int B = setup->B, T = setup->T;
    // every split must be exact: whole sequences per dp rank, whole heads and
    // whole hidden units per tp rank, and vocabulary rows for every tp rank
    // (the vocabulary may split unevenly: vocab_rows). Not train_check_mesh:
    // it asks tp to divide the padded vocabulary, which small (256) on tp = 3
    // does not need.
    if (B % dp != 0) fail_all("--batch %d does not split over dp=%d ranks: use a batch divisible by %d", B, dp, dp);
    if (cfg->num_heads % tp != 0)
        fail_all("the model's %d heads do not split over tp=%d ranks: use a tp that divides %d", cfg->num_heads, tp,
                 cfg->num_heads);
    if ((4 * cfg->channels) % tp != 0)
        fail_all("the MLP's %d hidden units (4C) do not split over tp=%d ranks: use a tp that divides %d",
                 4 * cfg->channels, tp, 4 * cfg->channels);
    int v0_last, rows_last;
    vocab_rows(cfg, tp, tp - 1, &v0_last, &rows_last);
    if (rows_last <= 0)
        fail_all("the model's padded vocabulary of %d rows leaves the last of tp=%d ranks none: use a smaller tp",
                 cfg->padded_vocab_size, tp);
    int micro = B / dp;

    TP m;
    tp_create(&m, &run, micro, zero, prefetch, reshard);
    FSDP* f = &m.f;
    size_t P = gpt_num_params(cfg);
    char zero3[64] = "";
    if (zero == 3)
        snprintf(zero3, sizeof(zero3), ", prefetch %s, reshard %s", prefetch ? "on" : "off", reshard ? "on" : "off");
    print0("chapter 4: tp=%d x dp=%d; a tp rank holds %zu of %zu parameters (%d heads, %d hidden units, %d "
           "vocabulary rows), ZeRO-%d shards them over dp: %zu per rank%s; %d sequences per dp group, device %s\n",
           tp, dp, m.numel, P, cfg->num_heads / tp, 4 * cfg->channels / tp, m.Vl, zero, f->shard_total, zero3,
           micro, run.device);
    char msg[1024];
    JsonLog log;
    const char* bad = jsonl_open(&log, args->log, msg, sizeof(msg));
    fail_if_any(bad != NULL, bad);

    int* inputs = xmalloc((size_t)micro * T * sizeof(int));
    int* targets = xmalloc((size_t)micro * T * sizeof(int));
    StepClock clock = {0};
    float loss = 0.0f, vloss = -1.0f;
    long prefetched = 0;
    comm_counts_reset();  // count the training only, not the start-up
    for (int s = 0; s < args->steps; s++) {
        long p0 = f->gathers_prefetched;
        clock_begin(&clock);
        // the tp ranks of a dp group read the same sequences
        data_batch(&setup->train, s, B, T, m.dp->rank * micro, micro, inputs, targets);
        double mine = forward(&m, inputs, targets);
        backward(&m);
        float norm = step(&m, args, s + 1);
        double dt = clock_end(&clock, s, args->steps);
        prefetched += f->gathers_prefetched - p0;
        loss = (float)train_mean(m.dp, mine);  // every tp rank has the same loss
        report_step(&log, s, args->steps, loss, norm, 1e3 * dt, (double)B * T / dt);
        if (args->val_every > 0 && (s + 1) % args->val_every == 0 && s + 1 < args->steps) {
            vloss = val_loss(&m, setup, args->val_batches);
            if (vloss >= 0) report_val(&log, s, vloss);
        }
    }
    double ms = clock_ms_per_step(&clock);
    double prefetched_per_step = args->steps ? (double)prefetched / args->steps : 0.0;
    char extra_json[512];
    snprintf(extra_json, sizeof(extra_json),
             "\"zero\":%d,\"prefetch\":%d,\"reshard\":%d,\"tp_shard_params\":%zu,\"shard_params\":%zu,"
             "\"padded_params\":%zu,\"vocab_rows\":%d,\"comm_wait_ms_per_step\":%.3f,"
             "\"comm_progress_ms_per_step\":%.3f,\"gathers_prefetched_per_step\":%g",
             zero, prefetch, reshard, m.numel, f->shard_total, f->padded_total, m.Vl,
             clock_wait_ms_per_step(&clock), clock_progress_ms_per_step(&clock), prefetched_per_step);
    RunSummary summary = {
        .chapter = 4, .model = setup->model_name, .num_params = P, .batch = B, .seq = T, .steps = args->steps,
        .ms_per_step = ms, .tokens_per_s = ms > 0 ? (double)B * T / (ms / 1e3) : 0.0,
        .flops_per_token = gpt_flops_per_token(cfg, T), .peak_gflops = run.peak_gflops, .final_loss = loss,
        .val_loss = -1.0f, .extra_json = extra_json};
    report_summary(&log, &run.mesh, &summary);
    // after the summary has read the counters: the final validation loss ...
    vloss = val_loss(&m, setup, args->val_batches);
    if (vloss >= 0) report_val(&log, args->steps - 1, vloss);
    jsonl_close(&log);
    // ... the check that every tp rank holds the same replicated tensors, and
    // --sample / --save from the whole model assembled on rank 0
    float* shard = fsdp_gather_host(f);  // this tp rank's whole shard, on dp rank 0
    int agree = replicas_agree(&m, shard);
    print0("replicated tensors (LayerNorms, row-parallel biases, wpe, lnf): %s on every tp rank\n",
           agree ? "bit-identical" : "DIFFERENT");
    float* full = train_wants_params(args) ? gather_full_model(&m, shard) : NULL;
    train_finish_params(args, cfg, T, full);
    free(full);
    free(shard);
    free(inputs);
    free(targets);
    tp_free(&m);
    run_finish(&run);
    return agree ? 0 : 1;
}
