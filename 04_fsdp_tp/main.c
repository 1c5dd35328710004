// Chapter 4: tensor parallelism inside every block, data parallelism across.
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
//              (vocab_rows); a token looks itself up on the rank that holds it (zero
//              elsewhere) and one all-reduce sums.
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
// The dp axis (outer, ranks tp apart) splits the batch as chapter 2 does: each
// tp shard is replicated over dp and its gradient averaged with one all-reduce.
//
//   mpirun -np 4 build/chapter-4 --dp 2 --tp 2
#include <math.h>
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
    size_t numel;            // floats of the shard
    size_t wpe_off, block0_off, block_numel, lnf_off;
    float *params, *grads, *m, *v;  // (numel) each
    float* norm_buf;         // (1)
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

static BlockParams tp_block(const TP* m, float* base, int l) {
    return block_params_at_tp(base + m->block0_off + (size_t)l * m->block_numel, m->cfg.channels, m->ntp);
}

static BlockActs tp_acts(const TP* m, int l) {
    const GPTConfig* c = &m->cfg;
    size_t n = block_acts_numel_tp(m->B, m->T, c->channels, c->num_heads, m->ntp);
    return block_acts_at_tp(m->blocks + (size_t)l * n, m->B, m->T, c->channels, c->num_heads, m->ntp);
}

// ---------------------------------------------------------------- the block, split over tp

static void block_forward_tp(const TP* m, const BlockParams* p, BlockActs* a, const float* x) {
    int B = m->B, T = m->T, N = B * T, C = m->cfg.channels, tp = m->ntp;
    int Cl = C / tp, Fl = 4 * C / tp, NHl = m->cfg.num_heads / tp;
    size_t NC = (size_t)N * C;
    // attention: res2 = x + attproj(attention(qkv(ln1(x)))). The LayerNorm
    // is replicated: every tp rank normalises the same x.
    layernorm_forward(a->ln1, a->ln1_mean, a->ln1_rstd, x, p->ln1w, p->ln1b, N, C);
    // f (forward: identity) -- column-parallel qkv: this rank's heads only
    matmul_forward(a->qkv, a->ln1, p->qkvw, p->qkvb, N, C, 3 * Cl);          // (N, 3C/tp)
    attention_forward(a->atty, a->att, a->qkv, B, T, Cl, NHl);               // (N, C/tp)
    // row-parallel projection: a partial sum of the output; the bias is
    // added by one rank, so the sum holds it once
    matmul_forward(a->attproj, a->atty, p->attprojw, m->rtp == 0 ? p->attprojb : NULL, N, Cl, C);
    // g (forward: all-reduce): the partial sums become the output
    comm_allreduce(m->tp, a->attproj, NC, COMM_SUM);                         // (N, C)
    residual_forward(a->res2, x, a->attproj, NC);
    // MLP: res3 = res2 + fcproj(gelu(fc(ln2(res2))))
    layernorm_forward(a->ln2, a->ln2_mean, a->ln2_rstd, a->res2, p->ln2w, p->ln2b, N, C);
    // f (forward: identity) -- column-parallel fc: this rank's hidden units
    matmul_forward(a->fch, a->ln2, p->fcw, p->fcb, N, C, Fl);                // (N, 4C/tp)
    gelu_forward(a->fch_gelu, a->fch, (size_t)N * Fl);
    matmul_forward(a->fcproj, a->fch_gelu, p->fcprojw, m->rtp == 0 ? p->fcprojb : NULL, N, Fl, C);
    // g (forward: all-reduce)
    comm_allreduce(m->tp, a->fcproj, NC, COMM_SUM);
    residual_forward(a->res3, a->res2, a->fcproj, NC);
}

// dres (N, C), the same on every tp rank: on entry d loss / d block output,
// on return d loss / d x. Parameter gradients accumulate into g.
static void block_backward_tp(const TP* m, const BlockParams* p, BlockParams* g, const BlockActs* a,
                              const BlockScratch* s, const float* x, float* dres) {
    int B = m->B, T = m->T, N = B * T, C = m->cfg.channels, tp = m->ntp;
    int Cl = C / tp, Fl = 4 * C / tp, NHl = m->cfg.num_heads / tp;
    size_t NC = (size_t)N * C;
    // MLP, backwards. g (backward: identity): dres is already whole on every
    // rank. The row-parallel bias's gradient (sum of dres) is computed by
    // every rank alike, so the replicated bias stays the same everywhere.
    ops_zero(s->dfch_gelu, (size_t)N * Fl);
    matmul_backward(s->dfch_gelu, g->fcprojw, g->fcprojb, dres, a->fch_gelu, p->fcprojw, N, Fl, C);
    ops_zero(s->dfch, (size_t)N * Fl);
    gelu_backward(s->dfch, a->fch, s->dfch_gelu, (size_t)N * Fl);
    ops_zero(s->dln, NC);
    matmul_backward(s->dln, g->fcw, g->fcb, s->dfch, a->ln2, p->fcw, N, C, Fl);
    // f (backward: all-reduce): each rank's dln is the share of its hidden
    // units; the LayerNorm's input gradient needs all of them
    comm_allreduce(m->tp, s->dln, NC, COMM_SUM);
    layernorm_backward(dres, g->ln2w, g->ln2b, s->dln, a->res2, p->ln2w, a->ln2_mean, a->ln2_rstd, N, C);
    // attention, backwards: the same pattern
    ops_zero(s->datty, (size_t)N * Cl);
    matmul_backward(s->datty, g->attprojw, g->attprojb, dres, a->atty, p->attprojw, N, Cl, C);
    ops_zero(s->dqkv, (size_t)N * 3 * Cl);
    attention_backward(s->dqkv, s->datt, s->datty, a->qkv, a->att, B, T, Cl, NHl);
    ops_zero(s->dln, NC);
    matmul_backward(s->dln, g->qkvw, g->qkvb, s->dqkv, a->ln1, p->qkvw, N, C, 3 * Cl);
    // f (backward: all-reduce)
    comm_allreduce(m->tp, s->dln, NC, COMM_SUM);
    layernorm_backward(dres, g->ln1w, g->ln1b, s->dln, x, p->ln1w, a->ln1_mean, a->ln1_rstd, N, C);
}

// ---------------------------------------------------------------- forward and backward

static float forward(TP* m, const int* inputs, const int* targets) {
    const GPTConfig* c = &m->cfg;
    int B = m->B, T = m->T, N = B * T, C = c->channels, L = c->num_layers;
    size_t NC = (size_t)N * C;
    float* P = m->params;
    mem_to_device(m->inputs, inputs, (size_t)N * sizeof(int));
    mem_to_device(m->targets, targets, (size_t)N * sizeof(int));
    // vocabulary-parallel embedding: a token's row on the rank that holds it,
    // zero on the others; wpe added by tp rank 0 only. g (all-reduce) sums.
    encoder_forward_vocab(m->encoded, m->inputs, P, m->rtp == 0 ? P + m->wpe_off : NULL, B, T, C, m->v0, m->Vl);
    comm_allreduce(m->tp, m->encoded, NC, COMM_SUM);
    const float* x = m->encoded;
    for (int l = 0; l < L; l++) {
        BlockParams p = tp_block(m, P, l);
        BlockActs a = tp_acts(m, l);
        block_forward_tp(m, &p, &a, x);
        x = a.res3;
    }
    // the head: final LayerNorm (replicated), then f (identity) and this
    // rank's slice of the logits, (N, Vl): the LM head is the wte rows it holds
    HeadActs h = head_acts_at(m->head, B, T, C, m->Vl);
    layernorm_forward(h.lnf, h.lnf_mean, h.lnf_rstd, x, P + m->lnf_off, P + m->lnf_off + C, N, C);
    matmul_forward(h.logits, h.lnf, P, NULL, N, C, m->Vl);
    // vocabulary-parallel cross-entropy: per row, this slice's max, sum of
    // exponentials and target logit (0 if another rank holds the target) ...
    crossentropy_partials(h.rowmax, h.sumexp, h.tlogit, h.logits, m->targets, N, m->Vl, m->nvalid, m->v0);
    // ... all-gathered (3 floats per token per rank: rowmax, sumexp, tlogit
    // sit side by side in HeadActs) and merged in rank order, so every tp rank
    // gets the same statistics of the whole vocabulary, bit for bit
    comm_allgather(m->tp, h.rowmax, m->gathered, 3 * (size_t)N);
    ops_copy(h.rowmax, m->gathered, 3 * (size_t)N);
    for (int r = 1; r < m->ntp; r++) {
        const float* g = m->gathered + (size_t)r * 3 * N;
        crossentropy_merge(h.rowmax, h.sumexp, h.tlogit, g, g + N, g + 2 * N, N);
    }
    crossentropy_loss(h.losses, h.rowmax, h.sumexp, h.tlogit, N);
    mem_to_host(m->losses_host, h.losses, (size_t)N * sizeof(float));
    double sum = 0.0;
    for (int n = 0; n < N; n++) sum += m->losses_host[n];
    return (float)(sum / N);
}

static void backward(TP* m) {
    const GPTConfig* c = &m->cfg;
    int B = m->B, T = m->T, N = B * T, C = c->channels, NH = c->num_heads, L = c->num_layers;
    size_t NC = (size_t)N * C;
    float *P = m->params, *G = m->grads;
    HeadActs h = head_acts_at(m->head, B, T, C, m->Vl);
    BlockScratch s = block_scratch_at_tp(m->scratch, B, T, C, NH, m->ntp);
    // the head: dlogits of this rank's slice from the merged statistics (in
    // place of the logits), then the partial dlnf and this slice's dwte
    crossentropy_backward(h.logits, h.logits, m->targets, h.rowmax, h.sumexp, 1.0f / (float)N, N, m->Vl,
                          m->nvalid, m->v0);
    ops_zero(s.dln, NC);
    matmul_backward(s.dln, G, NULL, h.logits, h.lnf, P, N, C, m->Vl);
    // f (backward: all-reduce): every vocabulary slice adds to dlnf
    comm_allreduce(m->tp, s.dln, NC, COMM_SUM);
    ops_zero(m->dres, NC);
    const float* last = tp_acts(m, L - 1).res3;
    layernorm_backward(m->dres, G + m->lnf_off, G + m->lnf_off + C, s.dln, last, P + m->lnf_off, h.lnf_mean,
                       h.lnf_rstd, N, C);
    for (int l = L - 1; l >= 0; l--) {
        BlockParams p = tp_block(m, P, l), g = tp_block(m, G, l);
        BlockActs a = tp_acts(m, l);
        const float* x = l > 0 ? tp_acts(m, l - 1).res3 : m->encoded;
        block_backward_tp(m, &p, &g, &a, &s, x, m->dres);
    }
    // the embedding: dres is whole on every rank (g backward: identity). The
    // token rows this rank holds add into its wte slice, which already holds
    // the LM head's share: the tied gradient collects both uses. Every rank
    // computes the whole dwpe (wpe is replicated).
    encoder_backward_vocab(G, G + m->wpe_off, m->dres, m->inputs, B, T, C, m->v0, m->Vl);
}

// ---------------------------------------------------------------- the optimizer step

// The global gradient norm. The tp shards of a split tensor are disjoint
// pieces, summed over tp; a replicated tensor (LayerNorms, the row-parallel
// biases, wpe, lnf) has the same gradient on every tp rank, so only tp rank 0
// counts it, and dp replicas count once (dp rank 0). One all-reduce over the
// world.
static float step(TP* m, const TrainArgs* args, int t) {
    double local = 0.0;
    if (m->dp->rank == 0)
        for (int i = 0; i < m->ntiles; i++) {
            const Tile* tl = &m->tiles[i];
            if (tl->replicated && m->rtp != 0) continue;
            local += grad_sumsq(m->grads + tl->off, tl->nrows * tl->ncols);
        }
    float sumsq = (float)local;
    mem_to_device(m->norm_buf, &sumsq, sizeof(float));
    comm_allreduce(m->world, m->norm_buf, 1, COMM_SUM);
    mem_to_host(&sumsq, m->norm_buf, sizeof(float));
    double norm = sqrt((double)sumsq);
    float scale = grad_clip_scale(norm, args->clip);
    AdamWConfig opt = {.lr = args->lr, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = args->wd};
    // every rank updates its own shard; replicated tensors get the same
    // gradient and so the same update on every tp rank
    adamw_update(m->params, m->grads, m->m, m->v, m->numel, opt, t, scale);
    return (float)norm;
}

// ---------------------------------------------------------------- set-up

static void tp_create(TP* m, const Run* run, int B) {
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

    // this rank's tiles only: initialised from the counter-based rule, or read from the file
    float* host = xcalloc(m->numel, sizeof(float));
    char msg[1024];
    const char* bad = NULL;
    for (int i = 0; i < m->ntiles && !bad; i++) {
        const Tile* tl = &m->tiles[i];
        if (setup->checkpoint)
            bad = checkpoint_read_tile(setup->checkpoint, c, host + tl->off, tl->t, tl->layer, tl->row0, tl->nrows,
                                       tl->col0, tl->ncols, msg, sizeof(msg));
        else
            gpt_init_tile(host + tl->off, c, (uint64_t)run->args.seed, tl->t, tl->layer, tl->row0, tl->nrows,
                          tl->col0, tl->ncols);
    }
    fail_if_any(bad != NULL, bad);
    m->params = mem_alloc_floats(m->numel, MEM_PARAMS);
    mem_to_device(m->params, host, m->numel * sizeof(float));
    free(host);
    m->grads = mem_alloc_floats(m->numel, MEM_GRADS);
    m->m = mem_alloc_floats(m->numel, MEM_OPTIMIZER);
    m->v = mem_alloc_floats(m->numel, MEM_OPTIMIZER);
    m->norm_buf = mem_alloc_floats(1, MEM_OTHER);

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
    float* bufs[] = {m->params, m->grads, m->m, m->v, m->norm_buf, m->encoded, m->blocks,
                     m->head, m->gathered, m->scratch, m->dres};
    for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++) mem_free(bufs[i]);
    mem_free(m->inputs);
    mem_free(m->targets);
    free(m->losses_host);
    free(m->tiles);
}

// ---------------------------------------------------------------- validation, checks, saving

// The same validation tokens as every chapter: each dp rank runs its share
// of every global batch through the tensor-parallel forward.
static float val_loss(TP* m, const TrainSetup* s, int n_batches, int* inputs, int* targets) {
    size_t per_epoch = data_batches_per_epoch(&s->val, s->B, s->T);
    if (per_epoch == 0) return -1.0f;
    if ((size_t)n_batches > per_epoch) n_batches = (int)per_epoch;
    double mine = 0.0;
    for (int i = 0; i < n_batches; i++) {
        data_batch(&s->val, i, s->B, s->T, m->dp->rank * m->B, m->B, inputs, targets);
        mine += forward(m, inputs, targets);
    }
    double total = 0.0;  // a host scalar for the log: plain MPI
    MPI_CHECK(MPI_Allreduce(&mine, &total, 1, MPI_DOUBLE, MPI_SUM, m->dp->mpi));
    return (float)(total / ((double)m->dp->size * n_batches));
}

// A bitwise fingerprint of the replicated tensors (parameters and the last
// step's gradients): equal on every tp rank iff their copies agree exactly.
// Returns 1 when they do, on every rank.
static int replicas_agree(const TP* m) {
    float* host = xmalloc(m->numel * sizeof(float));
    unsigned long long h[2] = {0, 0};
    const float* bufs[2] = {m->params, m->grads};
    for (int b = 0; b < 2; b++) {
        mem_to_host(host, bufs[b], m->numel * sizeof(float));
        for (int i = 0; i < m->ntiles; i++) {
            const Tile* tl = &m->tiles[i];
            if (!tl->replicated) continue;
            for (size_t k = 0; k < tl->nrows * tl->ncols; k++) {
                unsigned int bits;
                memcpy(&bits, host + tl->off + k, sizeof(bits));
                h[b] = h[b] * 1099511628211ull + bits + 1;
            }
        }
    }
    free(host);
    unsigned long long lo[2], hi[2];
    MPI_CHECK(MPI_Allreduce(h, lo, 2, MPI_UNSIGNED_LONG_LONG, MPI_MIN, m->tp->mpi));
    MPI_CHECK(MPI_Allreduce(h, hi, 2, MPI_UNSIGNED_LONG_LONG, MPI_MAX, m->tp->mpi));
    int mine = lo[0] == hi[0] && lo[1] == hi[1], all = 0;
    MPI_CHECK(MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_MIN, m->world->mpi));
    return all;
}

// The full model in the flat layout on world rank 0 (dp 0, tp 0): the tp
// group of dp rank 0 gathers its shards there, which are placed tile by tile.
static float* gather_full_model(const TP* m) {
    if (m->dp->rank != 0) return NULL;
    // shards differ in size when the vocabulary splits unevenly: each is sent
    // in a block of the largest (tp rank 0's) size
    size_t S = m->numel;
    unsigned long long mine = m->numel, most = 0;
    MPI_CHECK(MPI_Allreduce(&mine, &most, 1, MPI_UNSIGNED_LONG_LONG, MPI_MAX, m->tp->mpi));
    S = (size_t)most;
    float* send = mem_alloc_floats(S, MEM_OTHER);
    ops_copy(send, m->params, m->numel);
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
    Run run;
    if (!run_start(&run, argc, argv, "build/chapter-4",
                   "Chapter 4: tensor parallelism (Megatron) inside every block, on --tp ranks that share a\n"
                   "batch, times data parallelism over --dp groups. tp is the inner axis (neighbouring ranks).",
                   NULL, 0, (1u << AXIS_DP) | (1u << AXIS_TP)))
        return 0;
    const TrainArgs* args = &run.args;
    const TrainSetup* setup = &run.setup;
    const GPTConfig* cfg = &setup->cfg;
    int tp = run.axes[AXIS_TP].size, dp = run.axes[AXIS_DP].size;
    int B = setup->B, T = setup->T;
    // every split must be exact: whole heads, whole hidden units, whole
    // vocabulary rows per tp rank, whole sequences per dp rank
    if (cfg->num_heads % tp != 0)
        fail_all("--tp %d does not divide the model's %d heads: use a tp that divides %d", tp, cfg->num_heads,
                 cfg->num_heads);
    if ((4 * cfg->channels) % tp != 0)
        fail_all("--tp %d does not divide the MLP's %d hidden units (4C): use a tp that divides %d", tp,
                 4 * cfg->channels, 4 * cfg->channels);
    // the vocabulary may split unevenly (vocab_rows), but every rank needs rows
    int v0_last, rows_last;
    vocab_rows(cfg, tp, tp - 1, &v0_last, &rows_last);
    if (rows_last <= 0)
        fail_all("--tp %d leaves the last tp rank no rows of the padded vocabulary (%d rows, %d per rank): use a "
                 "smaller tp", tp, cfg->padded_vocab_size, (cfg->padded_vocab_size + tp - 1) / tp);
    if (B % dp != 0) fail_all("--batch %d does not split over dp=%d ranks: use a batch divisible by %d", B, dp, dp);
    int micro = B / dp;

    TP m;
    tp_create(&m, &run, micro);
    size_t P = gpt_num_params(cfg);
    print0("chapter 4: tp=%d x dp=%d, %zu of %zu parameters per rank (%d heads, %d hidden units, %d vocabulary "
           "rows each), %d sequences per dp rank, device %s\n",
           tp, dp, m.numel, P, cfg->num_heads / tp, 4 * cfg->channels / tp, m.Vl, micro, run.device);
    char msg[1024];
    JsonLog log;
    const char* bad = jsonl_open(&log, args->log, msg, sizeof(msg));
    fail_if_any(bad != NULL, bad);

    int* inputs = xmalloc((size_t)micro * T * sizeof(int));
    int* targets = xmalloc((size_t)micro * T * sizeof(int));
    StepClock clock = {0};
    float loss = 0.0f, vloss = -1.0f;
    comm_counts_reset();  // count the training only
    for (int s = 0; s < args->steps; s++) {
        clock_begin(&clock);
        // the tp ranks of a dp group read the same sequences
        data_batch(&setup->train, s, B, T, m.dp->rank * micro, micro, inputs, targets);
        double mine = forward(&m, inputs, targets);
        mem_zero(m.grads, m.numel * sizeof(float));
        backward(&m);
        // dp: every replica of this tp shard averages its gradient (each is
        // the mean over its own sequences; the average is the global mean)
        if (dp > 1) comm_allreduce(m.dp, m.grads, m.numel, COMM_AVG);
        float norm = step(&m, args, s + 1);
        double dt = clock_end(&clock, s, args->steps);
        double total = 0.0;  // the global loss for the log line: a host scalar, plain MPI
        MPI_CHECK(MPI_Allreduce(&mine, &total, 1, MPI_DOUBLE, MPI_SUM, m.dp->mpi));
        loss = (float)(total / dp);
        report_step(&log, s, args->steps, loss, norm, 1e3 * dt, (double)B * T / dt);
        if (args->val_every > 0 && (s + 1) % args->val_every == 0 && s + 1 < args->steps) {
            vloss = val_loss(&m, setup, args->val_batches, inputs, targets);
            if (vloss >= 0) report_val(&log, s, vloss);
        }
    }
    int agree = replicas_agree(&m);
    print0("replicated tensors (LayerNorms, row-parallel biases, wpe): %s on every tp rank\n",
           agree ? "bit-identical" : "DIFFERENT");
    double ms = clock_ms_per_step(&clock);
    char extra_json[512];
    snprintf(extra_json, sizeof(extra_json),
             "\"shard_params\":%zu,\"vocab_rows\":%d,\"replicas_agree\":%d,"
             "\"comm_wait_ms_per_step\":%.3f,\"comm_progress_ms_per_step\":%.3f",
             m.numel, m.Vl, agree, clock_wait_ms_per_step(&clock), clock_progress_ms_per_step(&clock));
    RunSummary summary = {
        .chapter = 4, .model = setup->model_name, .num_params = P, .batch = B, .seq = T, .steps = args->steps,
        .ms_per_step = ms, .tokens_per_s = ms > 0 ? (double)B * T / (ms / 1e3) : 0.0,
        .flops_per_token = gpt_flops_per_token(cfg, T), .peak_gflops = run.peak_gflops, .final_loss = loss,
        .val_loss = -1.0f, .extra_json = extra_json};
    report_summary(&log, &run.mesh, &summary);
    // the final validation loss, after the summary has read the counters
    vloss = val_loss(&m, setup, args->val_batches, inputs, targets);
    if (vloss >= 0) report_val(&log, args->steps - 1, vloss);
    jsonl_close(&log);

    if (args->save || args->sample > 0) {
        float* host = gather_full_model(&m);
        if (args->sample > 0 && world_rank() == 0) {
            GPT g;
            gpt_create(&g, cfg, 1, T, 0);
            mem_to_device(g.params, host, P * sizeof(float));
            train_sample(&g, args);
            gpt_free(&g);
        }
        train_save(args, cfg, host, world_rank() == 0);
        free(host);
    }
    free(inputs);
    free(targets);
    tp_free(&m);
    run_finish(&run);
    return 0;
}
