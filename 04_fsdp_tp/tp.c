// tp.c: chapter 4's tensor-parallel engine (tp.h): the tiles, the tp rank's
// state over chapter 3's FSDP engine, sharded init, the vocabulary-parallel
// embedding and head, the step, the end-of-run checks.
#include "tp.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "errors.h"
#include "exercise.h"  // exercise_not_done, in a homework tree
#include "memory.h"
#include "runtime.h"
#include "run.h"
#include "train.h"
#include "train_eval.h"
#include "train_step.h"
#include "sharding.h"

// ---------------------------------------------------------------- which rank holds what

// The vocabulary rows [v0, v0 + rows) of tp rank r: ceil(Vp/tp) each, the
// last rank fewer when tp does not divide Vp (small's 256 rows over tp = 3
// are 86, 86, 84). Only the sizes of the wte slices differ between ranks.
void tp_vocab_rows(const GPTConfig* cfg, int tp, int r, int* v0, int* rows) {
    int per = (cfg->padded_vocab_size + tp - 1) / tp;
    *v0 = r * per;
    int left = cfg->padded_vocab_size - *v0;
    *rows = left < per ? left : per;
}

// Tiles laid one after another: each at the offset where the last ended.
typedef struct {
    const GPTConfig* cfg;
    Tile* out;   // NULL: only counted
    int n;
    size_t off;
} TileList;

static void add_tile(TileList* s, ParamTensor t, int layer, size_t row0, size_t nrows, size_t col0, size_t ncols) {
    size_t rows, cols;
    param_tensor_shape(s->cfg, t, &rows, &cols);
    if (s->out) s->out[s->n] = (Tile){t, layer, row0, nrows, col0, ncols, s->off, nrows == rows && ncols == cols};
    s->off += nrows * ncols;
    s->n++;
}

// Block l's shard on tp rank r (model_tp.h's layout), appended to s.
static void block_tiles(TileList* s, int tp, int r, int l) {
    size_t C = (size_t)s->cfg->channels, Cl = C / tp, Fl = 4 * C / tp;
    add_tile(s, P_LN1W, l, 0, C, 0, 1);
    add_tile(s, P_LN1B, l, 0, C, 0, 1);
    // qkvw is [q; k; v] stacked, each C rows, head h at rows h*hs..: the
    // heads of rank r are rows [r*Cl, (r+1)*Cl) of each of the three, so
    // the shard is three row ranges, and its qkv output is [q k v] of those
    // heads, the layout the attention op reads
    // EXERCISE 1: the QKV column split by heads: rank r's rows of qkvw and qkvb, its heads' q, k and v
    for (int k = 0; k < 3; k++) add_tile(s, P_QKVW, l, k * C + r * Cl, Cl, 0, C);
    for (int k = 0; k < 3; k++) add_tile(s, P_QKVB, l, k * C + r * Cl, Cl, 0, 1);
    // END EXERCISE 1
    add_tile(s, P_ATTPROJW, l, 0, C, r * Cl, Cl);  // the columns that read rank r's heads
    add_tile(s, P_ATTPROJB, l, 0, C, 0, 1);        // replicated, added once
    add_tile(s, P_LN2W, l, 0, C, 0, 1);
    add_tile(s, P_LN2B, l, 0, C, 0, 1);
    add_tile(s, P_FCW, l, r * Fl, Fl, 0, C);       // rank r's hidden units
    add_tile(s, P_FCB, l, r * Fl, Fl, 0, 1);
    add_tile(s, P_FCPROJW, l, 0, C, r * Fl, Fl);   // the columns that read them
    add_tile(s, P_FCPROJB, l, 0, C, 0, 1);         // replicated, added once
}

int tp_block_tiles(const GPTConfig* cfg, int tp, int r, int l, Tile* out) {
    TileList s = {.cfg = cfg, .out = out};
    block_tiles(&s, tp, r, l);
    return s.n;
}

// The shard layout of a tp rank, in the order its flat buffer holds it:
//   [wte rows of rank r] [wpe] [block 0's shard] ... [block L-1's shard] [lnfw lnfb]
// where a block's shard is model_tp.h's. Writes the tiles (if out is given)
// and returns their number. This function (with block_tiles) is the whole
// answer to "which rank holds which slice of every weight".
int tp_shard_tiles(const GPTConfig* cfg, int tp, int r, Tile* out) {
    size_t C = (size_t)cfg->channels;
    int v0, Vl;
    tp_vocab_rows(cfg, tp, r, &v0, &Vl);
    TileList s = {.cfg = cfg, .out = out};
    add_tile(&s, P_WTE, 0, (size_t)v0, (size_t)Vl, 0, C);       // vocabulary rows
    add_tile(&s, P_WPE, 0, 0, (size_t)cfg->max_seq_len, 0, C);  // replicated
    for (int l = 0; l < cfg->num_layers; l++) block_tiles(&s, tp, r, l);
    add_tile(&s, P_LNFW, 0, 0, C, 0, 1);
    add_tile(&s, P_LNFB, 0, 0, C, 0, 1);
    return s.n;
}

const char* tp_mesh_problem(const GPTConfig* cfg, int B, int dp, int tp, char* msg, size_t len) {
    // Not train_mesh_problem: it asks tp to divide the padded vocabulary,
    // which small (256) on tp = 3 does not need (the vocabulary may split
    // unevenly)
    int v0_last, rows_last;
    tp_vocab_rows(cfg, tp, tp - 1, &v0_last, &rows_last);
    if (B % dp != 0)
        snprintf(msg, len, "--batch %d does not split over dp=%d ranks: use a batch divisible by %d", B, dp, dp);
    else if (cfg->num_heads % tp != 0)
        snprintf(msg, len, "the model's %d heads do not split over tp=%d ranks: use a tp that divides %d",
                 cfg->num_heads, tp, cfg->num_heads);
    else if ((4 * cfg->channels) % tp != 0)
        snprintf(msg, len, "the MLP's %d hidden units (4C) do not split over tp=%d ranks: use a tp that divides %d",
                 4 * cfg->channels, tp, 4 * cfg->channels);
    else if (rows_last <= 0) {  // every rank from `first` on is past the last piece
        int per = (cfg->padded_vocab_size + tp - 1) / tp, first = (cfg->padded_vocab_size + per - 1) / per;
        char ranks[64];
        if (first == tp - 1) snprintf(ranks, sizeof(ranks), "rank %d", first);
        else snprintf(ranks, sizeof(ranks), "ranks %d to %d", first, tp - 1);
        snprintf(msg, len, "the model's padded vocabulary of %d rows, %d a rank, leaves %s of tp=%d none: use a smaller tp",
                 cfg->padded_vocab_size, per, ranks, tp);
    }
    else
        return NULL;
    return msg;
}

void tp_check_mesh(const GPTConfig* cfg, int B, int dp, int tp) {
    char msg[512];
    const char* bad = tp_mesh_problem(cfg, B, dp, tp, msg, sizeof(msg));
    if (bad) fail_all("%s", bad);
}

// ---------------------------------------------------------------- a buffer laid out by tiles

// A piece of a tile: its rows [row, row + nrows) and columns [col, col +
// ncols), counted in the tile, whose first float is float q of the buffer.
typedef struct {
    size_t row, nrows, col, ncols, q;
} TilePiece;

// The pieces of tile tl that the floats [q0, q1) of the buffer cover: at
// most a partial first row, whole rows and a partial last row, so a rank
// reaches only its part of a tile (an FSDP unit's shard ends mid-row).
static int tile_pieces(const Tile* tl, size_t q0, size_t q1, TilePiece* p) {
    size_t size = tl->nrows * tl->ncols, w = tl->ncols, n = 0;
    if (q1 <= tl->off || q0 >= tl->off + size) return 0;
    size_t a = q0 > tl->off ? q0 - tl->off : 0, b = q1 - tl->off < size ? q1 - tl->off : size;
    while (a < b) {  // [a, b) of the tile's row-major storage
        size_t col = a % w, len = col > 0 || b - a < w ? (w - col < b - a ? w - col : b - a) : w;
        size_t rows = len == w ? (b - a) / w : 1;
        p[n++] = (TilePiece){a / w, rows, col, len, tl->off + a};
        a += rows * len;
    }
    return (int)n;
}

const char* tp_tiles_fill(const GPTConfig* cfg, const Tile* tiles, int n, size_t q0, size_t q1,
                          const char* checkpoint, uint64_t seed, float* dst, char* msg, size_t msg_len) {
    for (int i = 0; i < n; i++) {
        const Tile* tl = &tiles[i];
        TilePiece p[3];
        for (int k = 0, np = tile_pieces(tl, q0, q1, p); k < np; k++) {
            size_t row = tl->row0 + p[k].row, col = tl->col0 + p[k].col;
            float* out = dst + (p[k].q - q0);
            if (!checkpoint)
                gpt_init_tile(out, cfg, seed, tl->t, tl->layer, row, p[k].nrows, col, p[k].ncols);
            else if (checkpoint_read_tile(checkpoint, cfg, out, tl->t, tl->layer, row, p[k].nrows, col, p[k].ncols,
                                          msg, msg_len))
                return msg;  // checkpoint_read_tile's message
        }
    }
    return NULL;
}

void tp_tiles_ckpt_add(CkptList* l, const GPTConfig* cfg, const Tile* tiles, int n, CkptKind kind, size_t q0,
                       size_t q1, float* data, int skip_replicated) {
    for (int i = 0; data && i < n; i++) {
        const Tile* tl = &tiles[i];
        TilePiece p[3];
        size_t R, Cg;  // the tensor's per-layer global shape (rows, columns)
        param_tensor_shape(cfg, tl->t, &R, &Cg);
        for (int k = 0, np = skip_replicated && tl->replicated ? 0 : tile_pieces(tl, q0, q1, p); k < np; k++) {
            size_t start = ((size_t)tl->layer * R + tl->row0 + p[k].row) * Cg + tl->col0 + p[k].col;
            float* at = data + (p[k].q - q0);
            if (p[k].ncols == Cg)  // whole global rows: one run
                ckpt_add(l, (CkptSlice){kind, tl->t, start, p[k].nrows * Cg, 0, 1, at});
            else
                ckpt_add(l, (CkptSlice){kind, tl->t, start, p[k].ncols, Cg, p[k].nrows, at});
        }
    }
}

// ---------------------------------------------------------------- the tp rank's state

// The unit a tile of the tp shard lies in (no tile straddles two).
int tp_tile_unit(const TPModel* m, const Tile* tl) {
    if (tl->off < m->block0_off) return 0;
    if (tl->off >= m->lnf_off) return m->cfg.num_layers + 1;
    return 1 + (int)((tl->off - m->block0_off) / m->block_numel);
}

BlockActs tp_acts(const TPModel* m, int l) {
    const GPTConfig* c = &m->cfg;
    size_t n = block_store_numel_tp(m->B, m->T, c->channels, c->num_heads, m->ntp, m->recompute);
    return block_acts_stored_tp(m->blocks + (size_t)l * n, m->transient, m->B, m->T, c->channels, c->num_heads,
                                m->ntp, m->recompute);
}

BlockActs tp_acts_transient(const TPModel* m) {
    return block_acts_at_tp(m->transient, m->B, m->T, m->cfg.channels, m->cfg.num_heads, m->ntp);
}

void tp_recompute_selective(const TPModel* m, BlockActs* a) {
    int N = m->B * m->T, Cl = m->cfg.channels / m->ntp;
    // the same op as the forward on the same kept input: the same bits
    // (attention kept its output and lse, all its backward reads)
    gelu_forward(a->fch_gelu, a->fch, (size_t)N * 4 * Cl);
}

HeadActs tp_head_acts(const TPModel* m) { return head_acts_at(m->head, m->B, m->T, m->cfg.channels, m->Vl); }

BlockParams tp_block_params(TPModel* m, int l) {
    return block_params_at_tp(fsdp_unit_params(&m->f, 1 + l), m->cfg.channels, m->ntp);
}

BlockParams tp_block_grads_begin(TPModel* m, int l) {
    return block_params_at_tp(fsdp_grads_begin(&m->f, 1 + l), m->cfg.channels, m->ntp);
}

// The engine's fill callback: floats [lo, lo + n) of a unit are a range of
// this tp rank's shard, so a rank builds or reads only its slices of it.
typedef struct {
    const TPModel* m;
    const char* checkpoint;  // NULL: initialise from the seed
    uint64_t seed;
} TileSource;

static const char* fill_unit(void* ctx, int unit, size_t lo, size_t n, float* dst, char* msg, size_t msg_len) {
    const TileSource* src = ctx;
    const TPModel* m = src->m;
    size_t q0 = m->unit_off[unit] + lo;
    return tp_tiles_fill(&m->cfg, m->tiles, m->ntiles, q0, q0 + n, src->checkpoint, src->seed, dst, msg, msg_len);
}

void tp_create(TPModel* m, const Run* run, int B, int zero, int prefetch, int reshard) {
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
    tp_vocab_rows(c, tp, m->rtp, &m->v0, &m->Vl);
    int valid = c->vocab_size - m->v0;
    m->nvalid = valid < 0 ? 0 : (valid > m->Vl ? m->Vl : valid);
    m->ntiles = tp_shard_tiles(c, tp, m->rtp, NULL);
    m->tiles = xmalloc(sizeof(Tile) * (size_t)m->ntiles);
    tp_shard_tiles(c, tp, m->rtp, m->tiles);
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
    m->recompute = (RecomputeMode)run->args.recompute;
    m->blocks = mem_alloc_floats((size_t)L * block_store_numel_tp(B, m->T, C, NH, tp, m->recompute), MEM_ACTIVATIONS);
    size_t tr = block_transient_numel_tp(B, m->T, C, NH, tp, m->recompute);
    m->transient = tr ? mem_alloc_floats(tr, MEM_ACTIVATIONS) : NULL;
    m->head = mem_alloc_floats(head_acts_numel(B, m->T, C, m->Vl), MEM_ACTIVATIONS);
    m->gathered = mem_alloc_floats((size_t)tp * 3 * N, MEM_ACTIVATIONS);
    m->scratch = mem_alloc_floats(block_scratch_numel_tp(B, m->T, C, NH, tp), MEM_ACTIVATIONS);
    m->dres = mem_alloc_floats(N * C, MEM_ACTIVATIONS);
    m->inputs = mem_alloc(N * sizeof(int), MEM_ACTIVATIONS);
    m->targets = mem_alloc(N * sizeof(int), MEM_ACTIVATIONS);
    m->losses_host = mem_alloc_host(N * sizeof(float));  // read every step (memory.h)
}

void tp_free(TPModel* m) {
    float* bufs[] = {m->encoded, m->blocks, m->head, m->gathered, m->scratch, m->dres};
    for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++) mem_free(bufs[i]);
    if (m->transient) mem_free(m->transient);
    mem_free(m->inputs);
    mem_free(m->targets);
    mem_free_host(m->losses_host);
    free(m->tiles);
    free(m->unit_off);
    fsdp_free(&m->f);
}

// ---------------------------------------------------------------- the embedding and the head

float* tp_embed_forward(TPModel* m, const int* inputs, const int* targets) {
    FSDP* f = &m->f;
    int B = m->B, T = m->T, N = B * T, C = m->cfg.channels;
    fsdp_drop_gathered(f);  // stale after the optimizer step
    mem_to_device(m->inputs, inputs, (size_t)N * sizeof(int));
    mem_to_device(m->targets, targets, (size_t)N * sizeof(int));
    float* emb = fsdp_unit_params(f, 0);  // [wte rows (Vl, C), wpe (maxT, C)]
    fsdp_prefetch(f, 1);
    // vocabulary-parallel embedding: a token's row on the rank that holds it,
    // zero on the others; wpe added by tp rank 0 only, so the sum over tp
    // holds it once
    encoder_forward_vocab(m->encoded, m->inputs, emb, m->rtp == 0 ? emb + m->wpe_off : NULL, B, T, C, m->v0, m->Vl);
    return m->encoded;
}

void tp_final_layernorm_forward(TPModel* m, const float* x) {
    int N = m->B * m->T, C = m->cfg.channels;
    float* lnf = fsdp_unit_params(&m->f, m->cfg.num_layers + 1);
    HeadActs h = tp_head_acts(m);
    layernorm_forward(h.lnf, h.lnf_mean, h.lnf_rstd, x, lnf, lnf + C, N, C);
}

float tp_head_forward(TPModel* m) {
    int N = m->B * m->T, C = m->cfg.channels;
    float* wte = fsdp_unit_params(&m->f, 0);  // the tied LM head: this rank's wte rows again
    HeadActs h = tp_head_acts(m);
    // this rank's slice of the logits, (N, Vl): never the whole (N, Vp)
    matmul_forward(h.logits, h.lnf, wte, NULL, N, C, m->Vl);
    // vocabulary-parallel cross-entropy: per row, this slice's max, sum of
    // exponentials and target logit (0 if another rank holds the target) ...
    crossentropy_partials(h.rowmax, h.sumexp, h.tlogit, h.logits, m->targets, N, m->Vl, m->nvalid, m->v0);
    // ... all-gathered (3 floats per token per rank: rowmax, sumexp, tlogit
    // sit side by side in HeadActs) and merged in rank order, so every tp rank
    // gets the same statistics of the whole vocabulary, bit for bit
    // EXERCISE 3: the vocabulary-parallel cross-entropy: every tp rank's (max, sum of exponentials, target logit) per token, merged in rank order
    comm_allgather(m->tp, h.rowmax, m->gathered, 3 * (size_t)N);
    ops_copy(h.rowmax, m->gathered, 3 * (size_t)N);
    for (int r = 1; r < m->ntp; r++) {
        const float* g = m->gathered + (size_t)r * 3 * N;
        crossentropy_merge(h.rowmax, h.sumexp, h.tlogit, g, g + N, g + 2 * N, N);
    }
    // END EXERCISE 3
    crossentropy_loss(h.losses, h.rowmax, h.sumexp, h.tlogit, N);
    mem_to_host(m->losses_host, h.losses, (size_t)N * sizeof(float));
    double sum = 0.0;
    for (int n = 0; n < N; n++) sum += m->losses_host[n];
    return (float)(sum / N);
}

void tp_head_backward(TPModel* m, float* dlnf) {
    FSDP* f = &m->f;
    int N = m->B * m->T, C = m->cfg.channels;
    HeadActs h = tp_head_acts(m);
    float* g_emb = m->g_emb = fsdp_grads_begin(f, 0);  // open until tp_embed_backward
    float* wte = fsdp_unit_params(f, 0);
    // dlogits of this rank's slice from the merged statistics (in place of
    // the logits), then the partial dlnf and this slice's dwte
    crossentropy_backward(h.logits, h.logits, m->targets, h.rowmax, h.sumexp, 1.0f / (float)N, N, m->Vl,
                          m->nvalid, m->v0);
    ops_zero(dlnf, (size_t)N * C);
    matmul_backward(dlnf, g_emb, NULL, h.logits, h.lnf, wte, N, C, m->Vl);
}

void tp_final_layernorm_backward(TPModel* m, const float* dlnf, const float* x, float* dres) {
    FSDP* f = &m->f;
    int N = m->B * m->T, C = m->cfg.channels, L = m->cfg.num_layers;
    HeadActs h = tp_head_acts(m);
    float* lnf = fsdp_unit_params(f, L + 1);
    float* g_lnf = fsdp_grads_begin(f, L + 1);
    ops_zero(dres, (size_t)N * C);
    layernorm_backward(dres, g_lnf, g_lnf + C, dlnf, x, lnf, h.lnf_mean, h.lnf_rstd, N, C);
    if (f->zero > 1) fsdp_reduce_grads(f, L + 1);
}

void tp_embed_backward(TPModel* m, const float* dres) {
    FSDP* f = &m->f;
    int B = m->B, T = m->T, C = m->cfg.channels;
    float* g_emb = m->g_emb;  // opened by tp_head_backward
    // the token rows this rank holds add into its wte slice, which already
    // holds the LM head's share: the tied gradient collects both uses. Every
    // rank computes the whole dwpe (wpe is replicated).
    encoder_backward_vocab(g_emb, g_emb + m->wpe_off, dres, m->inputs, B, T, C, m->v0, m->Vl);
    if (f->zero > 1) {
        fsdp_reduce_grads(f, 0);
    } else {
        for (int i = 0; i < f->n; i++) fsdp_reduce_grads(f, i);  // ZeRO-1: every unit now
    }
}

// ---------------------------------------------------------------- the step

// The global gradient norm. The tp slices of a split tensor are disjoint
// pieces, summed over tp; a replicated tensor (LayerNorms, the row-parallel
// biases, wpe, lnf) has the same gradient on every tp rank, so only tp rank 0
// counts it: it enters the norm once, not tp times. The dp shards are
// disjoint (fsdp_grad_sumsq_range counts this rank's shard only). Then one
// all-reduce over dp and one over tp.
float tp_step(TPModel* m, const TrainArgs* args, int t) {
    double* mine = train_sumsq_begin();  // summed on the device, tile by tile; read once below
    // EXERCISE 4: the norm's sum of squares: this rank's share, split tensors' slices summed, each replicated tensor counted once over tp
    for (int i = 0; i < m->ntiles; i++) {
        const Tile* tl = &m->tiles[i];
        if (tl->replicated && m->rtp != 0) continue;
        int u = tp_tile_unit(m, tl);
        fsdp_grad_sumsq_range(&m->f, u, tl->off - m->unit_off[u], tl->nrows * tl->ncols, mine);
    }
    // END EXERCISE 4
    const Comm* groups[] = {m->dp, m->tp};
    double norm = train_global_norm(mine, groups, 2);
    // AdamW on this rank's shard of its tp slice; replicated tensors get the
    // same gradient and so the same update on every tp rank
    fsdp_step(&m->f, train_adamw(args), t, grad_clip_scale(norm, args->clip));
    return (float)norm;
}

// ---------------------------------------------------------------- validation, checks, saving

// The same validation tokens as every chapter: each dp rank runs its share
// of every global batch through the chapter's forward (same gathers and tp
// collectives) as training.
float tp_val_loss(TPModel* m, const TrainSetup* s, int n_batches, TrainForward forward, void* ctx) {
    return train_val_loss_with(s, n_batches, forward, ctx, m->dp->rank * m->B, m->B, m->B, m->dp);
}

// A bitwise fingerprint of the replicated tensors in this tp rank's whole
// shard (host, on dp rank 0) and of the last forward's per-token losses
// (the merge in rank order gives every tp rank the same ones): equal on
// every tp rank iff they agree exactly. Returns 1 when they do, on every
// rank. Plain MPI, uncounted.
int tp_replicas_agree(const TPModel* m, const float* shard) {
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
        for (int n = 0; n < m->B * m->T; n++) {
            unsigned int bits;
            memcpy(&bits, m->losses_host + n, sizeof(bits));
            h = h * 1099511628211ull + bits + 1;
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
float* tp_gather_full_model(const TPModel* m, const float* shard) {
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
            tp_shard_tiles(&m->cfg, m->ntp, r, tiles);
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

// ---------------------------------------------------------------- checkpoints

// The engine's map for fsdp_ckpt_shard (chapter 3's): floats of a unit are
// floats of this tp rank's shard, cut by its tiles.
typedef struct {
    const TPModel* m;
    int skip_replicated;
} TileSlices;

static void tile_slices(void* ctx, CkptList* out, int unit, size_t lo, size_t n, CkptKind kind, float* data) {
    const TileSlices* t = ctx;
    size_t q0 = t->m->unit_off[unit] + lo;
    tp_tiles_ckpt_add(out, &t->m->cfg, t->m->tiles, t->m->ntiles, kind, q0, q0 + n, data, t->skip_replicated);
}

void tp_ckpt_lists(Ckpt* ck, const TPModel* m) {
    const FSDP* f = &m->f;
    TileSlices own = {m, m->rtp != 0}, need = {m, 0};  // a replicated tile: written by tp rank 0
    for (int u = 0; u < f->n; u++) {
        // the moments are sharded over dp under every stage, ZeRO-3's
        // parameters too: this dp rank's shard of unit u
        fsdp_ckpt_shard(f, u, &ck->own, f->zero == 3, tile_slices, &own);
        fsdp_ckpt_shard(f, u, &ck->need, f->zero == 3, tile_slices, &need);
        if (f->zero < 3) {
            // ZeRO-1/2: the parameters whole on every dp rank: dp rank 0
            // writes them, every rank reads them
            float* full = f->full_params + f->padded_off[u];
            if (f->dp->rank == 0) tile_slices(&own, &ck->own, u, 0, f->numel[u], CKPT_PARAMS, full);
            tile_slices(&need, &ck->need, u, 0, f->numel[u], CKPT_PARAMS, full);
        }
    }
}

// ---------------------------------------------------------------- --show-sharding

void tp_show_sharding(const TPModel* m, int show) {
    if (!show) return;
    ShardTensor* ts = xcalloc((size_t)m->ntiles, sizeof(ShardTensor));
    for (int i = 0; i < m->ntiles; i++) {
        const Tile* tl = &m->tiles[i];
        size_t rows, cols;
        param_tensor_shape(&m->cfg, tl->t, &rows, &cols);
        ShardTensor* s = &ts[i];
        snprintf(s->name, sizeof(s->name), "%s", param_tensor_name(tl->t));
        snprintf(s->shape, sizeof(s->shape), "%s", sharding_shape(tl->t));
        // rows split: column-parallel (and the vocabulary); columns split: row-parallel
        snprintf(s->split, sizeof(s->split), "%s", tl->replicated ? "(-, -)" : tl->nrows < rows ? "(tp, -)" : "(-, tp)");
        s->unit = tp_tile_unit(m, tl);
        s->off = tl->off - m->unit_off[s->unit];
        s->numel = tl->nrows * tl->ncols;
    }
    char title[96];
    snprintf(title, sizeof(title), "tp=%d inside each block, ZeRO-%d over dp=%d", m->ntp, m->f.zero,
             m->dp->size);
    fsdp_show_sharding(&m->f, ts, m->ntiles, &m->cfg, show, title);
    free(ts);
}
