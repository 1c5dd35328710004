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
// Every collective a block issues is written below, where it happens, and
// so are the f and g that join the embedding and the head to the blocks. The
// plumbing (who holds what, init, the vocabulary-parallel embedding and head
// with the cross-entropy's one all-gather, the step) is 04_fsdp_tp/tp.c.
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
#include "ckpt.h"
#include "comm.h"
#include "exercise.h"  // exercise_not_done, in a homework tree
#include "memory.h"
#include "mesh.h"
#include "model.h"
#include "model_tp.h"
#include "rank.h"
#include "report.h"
#include "runtime.h"
#include "trace.h"
#include "run.h"
#include "train.h"
#include "train_eval.h"
#include "train_loop.h"
#include "train_step.h"

#include "fsdp.h"
#include "tp.h"

// Which rank holds which slice of every weight (tp_shard_tiles), the tp
// rank's state (TPModel: its shard as FSDP units over dp, its activations),
// the vocabulary-parallel embedding and head, and the optimizer step live in
// the module 04_fsdp_tp/tp.c (tp.h); chapter 6 reuses them. What TP does
// inside a block, and every collective joining the pieces, is below.

// ---------------------------------------------------------------- Megatron's f and g

// f sits where a column-parallel layer reads a whole input that every tp rank
// holds: forward nothing (each rank already has it), backward the ranks'
// partial input gradients are summed. g sits after a row-parallel layer:
// forward the ranks' partial outputs are summed, backward nothing (every
// rank needs the whole output gradient, and has it). Each is one all-reduce
// over tp of a (B,T,C) tensor, in place.
static void f_backward(const TPModel* m, float* dx, size_t n) { comm_allreduce(m->tp, dx, n, COMM_SUM); }
static void g_forward(const TPModel* m, float* y, size_t n) { comm_allreduce(m->tp, y, n, COMM_SUM); }

// ---------------------------------------------------------------- the block, split over tp

static void block_forward_tp(const TPModel* m, const BlockParams* p, BlockActs* a, const float* x) {
    int B = m->B, T = m->T, N = B * T, C = m->cfg.channels, tp = m->ntp;
    int Cl = C / tp, Fl = 4 * C / tp, NHl = m->cfg.num_heads / tp;
    size_t NC = (size_t)N * C;
    // attention: res2 = x + attproj(attention(qkv(ln1(x)))). The LayerNorm
    // is replicated: every tp rank normalises the same x.
    layernorm_forward(a->ln1, a->ln1_mean, a->ln1_rstd, x, p->ln1w, p->ln1b, N, C);
    // f forward (identity) -- column-parallel qkv: this rank's heads only
    matmul_forward(a->qkv, a->ln1, p->qkvw, p->qkvb, N, C, 3 * Cl);          // (N, 3C/tp)
    attention_flash_forward(a->atty, a->lse, a->qkv, B, T, Cl, NHl);         // (N, C/tp)
    // EXERCISE 2: the row-parallel attention projection: this rank's partial sum, its bias added once over tp, then g
    // row-parallel projection: a partial sum of the output; the bias is
    // added by one rank, so the sum holds it once
    matmul_forward(a->attproj, a->atty, p->attprojw, m->rtp == 0 ? p->attprojb : NULL, N, Cl, C);
    // g forward (all-reduce): the partial sums become the output
    g_forward(m, a->attproj, NC);                                            // (N, C)
    // END EXERCISE 2
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
static void block_backward_tp(const TPModel* m, const BlockParams* p, BlockParams* g, const BlockActs* a,
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
    attention_flash_backward(s->dqkv, s->datty, a->qkv, a->atty, a->lse, B, T, Cl, NHl);
    ops_zero(s->dln, NC);
    matmul_backward(s->dln, g->qkvw, g->qkvb, s->dqkv, a->ln1, p->qkvw, N, C, 3 * Cl);
    // f backward (all-reduce)
    f_backward(m, s->dln, NC);
    layernorm_backward(dres, g->ln1w, g->ln1b, s->dln, x, p->ln1w, a->ln1_mean, a->ln1_rstd, N, C);
}

// ---------------------------------------------------------------- forward and backward

// tp_block_params(m, l) is block l's unit of this tp rank's shard, whole
// (under ZeRO-3 all-gathered over dp, or waited for if a prefetch started
// it); fsdp_prefetch(f, i) starts unit i's gather to arrive behind the
// compute that follows, as in chapter 3. The tp collectives are the new part.
static float forward(TPModel* m, const int* inputs, const int* targets) {
    const GPTConfig* c = &m->cfg;
    int N = m->B * m->T, L = c->num_layers;
    size_t NC = (size_t)N * c->channels;
    // vocabulary-parallel embedding: each rank's token rows (zero for tokens
    // it does not hold), wpe on tp rank 0; g forward sums them
    double t0 = trace_start();
    float* x = tp_embed_forward(m, inputs, targets);
    g_forward(m, x, NC);
    trace_compute(t0, "embedding forward");
    for (int l = 0; l < L; l++) {
        BlockParams p = tp_block_params(m, l);
        fsdp_prefetch(&m->f, l + 2);  // the next block, or [lnfw lnfb] after the last
        BlockActs a = tp_acts(m, l);
        t0 = trace_start();  // the spans of every chapter (docs/tracing.md)
        block_forward_tp(m, &p, &a, x);
        trace_compute(t0, "block %d forward", l);
        x = a.res3;
    }
    // the head: final LayerNorm (replicated), then f forward (identity) and
    // this rank's slice of the logits with the vocabulary-parallel
    // cross-entropy (its all-gather of per-rank max, sum and target logit)
    t0 = trace_start();
    tp_final_layernorm_forward(m, x);
    float loss = tp_head_forward(m);
    trace_compute(t0, "head forward");
    return loss;
}

// tp_block_grads_begin(m, l) gives the zeroed buffer block l's gradient
// accumulates in; fsdp_reduce_grads(f, i) reduce-scatters it over dp (the
// mean over the dp ranks, each rank keeping its shard), as in chapter 3.
static void backward(TPModel* m) {
    FSDP* f = &m->f;
    const GPTConfig* c = &m->cfg;
    int N = m->B * m->T, L = c->num_layers;
    size_t NC = (size_t)N * c->channels;
    BlockScratch s = block_scratch_at_tp(m->scratch, m->B, m->T, c->channels, c->num_heads, m->ntp);
    // the head: this slice's dlogits, its dwte and its share of dlnf ...
    double t0 = trace_start();
    tp_head_backward(m, s.dln);
    // ... f backward (all-reduce): every vocabulary slice adds to dlnf
    f_backward(m, s.dln, NC);
    tp_final_layernorm_backward(m, s.dln, tp_acts(m, L - 1).res3, m->dres);
    trace_compute(t0, "head backward");
    // the blocks, last to first: gather (prefetching the one before),
    // backward with its tp all-reduces, reduce-scatter over dp
    for (int l = L - 1; l >= 0; l--) {
        BlockParams p = tp_block_params(m, l);
        if (l > 0) fsdp_prefetch(f, l);
        BlockParams g = tp_block_grads_begin(m, l);
        BlockActs a = tp_acts(m, l);
        const float* x = l > 0 ? tp_acts(m, l - 1).res3 : m->encoded;
        t0 = trace_start();
        // --recompute: what forward did not keep, again (docs/recompute.md)
        if (m->recompute == RECOMPUTE_SELECTIVE) {
            tp_recompute_selective(m, &a);  // GELU on this rank's slice: no collective
        } else if (m->recompute == RECOMPUTE_FULL) {
            a = tp_acts_transient(m);        // the whole block forward into the one-layer buffer,
            block_forward_tp(m, &p, &a, x);  // its two g all-reduces included
        }
        if (m->recompute != RECOMPUTE_NONE) trace_compute(t0, "block %d recompute", l);
        block_backward_tp(m, &p, &g, &a, &s, x, m->dres);
        trace_compute(t0, "block %d backward", l);
        if (f->zero > 1) fsdp_reduce_grads(f, 1 + l);
    }
    // the embedding: dres is whole on every rank (g backward: identity)
    t0 = trace_start();
    tp_embed_backward(m, m->dres);
    trace_compute(t0, "embedding backward");
}

// The validation loss runs the same forward (same gathers and tp collectives).
static float forward_cb(void* ctx, const int* inputs, const int* targets) { return forward(ctx, inputs, targets); }
static float val_loss(void* m, const TrainSetup* s, int n_batches) { return tp_val_loss(m, s, n_batches, forward_cb, m); }

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
    fsdp_check_flags(zero, prefetch, reshard);  // --zero 1..3, --prefetch and --reshard 0 or 1
    args_note_unused(argc, argv, "prefetch", zero != 3, "ZeRO-1 and 2 gather no parameters in forward (--zero 3 does)");
    args_note_unused(argc, argv, "reshard", zero != 3, "ZeRO-1 and 2 keep the whole parameters (--zero 3 frees them)");
    const TrainArgs* args = &run.args;
    const TrainSetup* setup = &run.setup;
    const GPTConfig* cfg = &setup->cfg;
    int tp = run.axes[AXIS_TP].size, dp = run.axes[AXIS_DP].size;
    int B = setup->B, T = setup->T;
    // every split must be exact: whole sequences per dp rank, whole heads and
    // whole hidden units per tp rank, and vocabulary rows for every tp rank
    tp_check_mesh(cfg, B, dp, tp);
    int micro = B / dp;

    TPModel m;
    tp_create(&m, &run, micro, zero, prefetch, reshard);
    FSDP* f = &m.f;
    tp_show_sharding(&m, args->show_sharding);  // --show-sharding: tp tiles, then FSDP over dp
    size_t P = gpt_num_params(cfg);
    // training-state checkpoints: each rank writes its dp shard of its tiles
    // (a replicated tile once, by tp rank 0) and --resume reads them back
    // from whatever mesh saved them
    Ckpt ck;
    ckpt_init(&ck, args, setup, &run.mesh, 4);
    tp_ckpt_lists(&ck, &m);
    ckpt_resume(&ck);  // --resume: ck.start_step
    char zero3[64] = "";
    if (zero == 3)
        snprintf(zero3, sizeof(zero3), ", prefetch %s, reshard %s", prefetch ? "on" : "off", reshard ? "on" : "off");
    print0("chapter 4: tp=%d x dp=%d; a tp rank holds %zu of %zu parameters (%d heads, %d hidden units, %d "
           "vocabulary rows), ZeRO-%d shards them over dp: %zu per rank%s; %d sequences per dp rank, device %s\n",
           tp, dp, m.numel, P, cfg->num_heads / tp, 4 * cfg->channels / tp, m.Vl, zero, f->shard_total, zero3,
           micro, run.device);
    // (it recomputes after the gather of each block in backward)
    train_print_recompute((RecomputeMode)args->recompute,
                          args->recompute == RECOMPUTE_FULL ? ", with the block's 2 tp all-reduces again" : "");
    TrainLoop loop;
    train_loop_begin(&loop, &run, &(TrainLoopSpec){
        .chapter = 4, .num_params = P, .flops_per_token = gpt_flops_per_token(cfg, T), .rows = micro,
        .val_loss = val_loss, .ctx = &m, .ckpt = &ck});
    long prefetched = 0;
    for (int s = loop.start; s < loop.steps; s++) {
        long p0 = f->gathers_prefetched;
        // the tp ranks of a dp group read the same sequences
        data_batch(&setup->train, s, B, T, m.dp->rank * micro, micro, loop.inputs, loop.targets);
        double mine = forward(&m, loop.inputs, loop.targets);
        backward(&m);
        double t0 = trace_start();  // the norm's all-reduce and AdamW, as chapter 6 (--sp) counts them
        float norm = tp_step(&m, args, s + 1);
        trace_compute(t0, "optimizer");
        prefetched += f->gathers_prefetched - p0;
        train_loop_step(&loop, s, (float)train_mean(m.dp, mine), norm);  // every tp rank has the same loss
    }
    int trained = loop.steps - loop.start;
    JsonBuf summary = {0};  // the chapter's own summary fields
    json_add_int(&summary, "zero", zero);
    json_add_int(&summary, "prefetch", prefetch);
    json_add_int(&summary, "reshard", reshard);
    json_add_int(&summary, "tp_shard_params", (long long)m.numel);
    json_add_int(&summary, "shard_params", (long long)f->shard_total);
    json_add_int(&summary, "padded_params", (long long)f->padded_total);
    json_add_int(&summary, "vocab_rows", m.Vl);
    json_add_double(&summary, "gathers_prefetched_per_step", trained > 0 ? (double)prefetched / trained : 0.0, "%g");
    train_loop_end(&loop, &summary);  // the final validation and the summary
    json_free(&summary);
    // the check that every tp rank holds the same replicated tensors, and
    // --sample / --save from the whole model assembled on rank 0
    float* shard = fsdp_gather_host(f);  // this tp rank's whole shard, on dp rank 0
    int agree = tp_replicas_agree(&m, shard);
    print0("replicated tensors (LayerNorms, row-parallel biases, wpe, lnf) and losses: %s on every tp rank\n",
           agree ? "bit-identical" : "DIFFERENT");
    float* full = train_wants_params(args) ? tp_gather_full_model(&m, shard) : NULL;
    train_finish_params(args, cfg, T, full);
    free(full);
    free(shard);
    tp_free(&m);
    run_finish(&run);
    return agree ? 0 : 1;
}
