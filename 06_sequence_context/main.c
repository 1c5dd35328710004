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
// Sequence parallelism (--tp N --sp, Megatron) is sequence.c's. main() at
// the end builds one of the two and drives its step from one training loop.
// Who holds which tokens (CPShard) and ring attention's compute with one
// K/V block in hand are ring.c's (tests/test_ring.c runs them over a
// simulated ring); the model's buffers, and the loops that move the ring's
// blocks and make Ulysses' all-to-alls (the capstone runs them too), are
// context.c's; the step, and where in it each of those runs, is here.
#include <stdlib.h>

#include "memory.h"
#include "errors.h"
#include "runtime.h"
#include "trace.h"

#include "context.h"
#include "sequence.h"
#include "run.h"
#include "train_loop.h"
#include "train_step.h"
#include "report.h"

// ---------------------------------------------------------------- ring attention
// Each rank keeps its queries; the K/V blocks travel around the ring of cp
// ranks, one hop per step. At step s the block in hand is the K/V of cp
// rank src = r - s: it goes on to the right while I compute with it, and
// the next arrives from the left.
//
//   step 0: r holds K/V of r      step 1: of r-1      ...   step cp-1: of r+1
//
// The loops that move the blocks are context.c's (cp_ring_forward,
// cp_ring_backward: the capstone runs them too); what a rank computes with
// the block in hand is ring.c's.

// Forward. qkv (N, 3C) holds my tokens' queries, keys and values; atty
// (N, C) gets my queries' attention output, lse (N, NH) its statistics.
// My K and V are packed out of qkv (only they travel), then cp steps: post
// the receive of the next block and the send of this one, compute with this
// one, wait. With --cp-overlap 0 each transfer is waited for as soon as it
// is posted, before the compute it would hide.
static void ring_attention_forward(CPModel* m, const float* qkv, float* atty, float* lse) {
    CPAttention a = cp_attention(m);      // the cp group, my rows, the ring's buffers, the clocks
    cp_ring_forward(&a, qkv, atty, lse);  // cp - 1 hops: the block in hand sent right, the next received from the left
}

// Backward. datty (N, C) is d atty; dqkv (N, 3C), zero on entry, gets d of
// my queries (from every block) and of my keys and values (from every rank's
// queries). The K/V blocks go around as in forward; each rank adds its
// queries' share of dK|dV into the partial sum that arrived with the block
// and passes it on; after cp hops (one more than K/V makes) it is home.
static void ring_attention_backward(CPModel* m, const float* qkv, const float* atty, const float* lse,
                                    const float* datty, float* dqkv) {
    CPAttention a = cp_attention(m);
    cp_ring_backward(&a, qkv, atty, lse, datty, dqkv);  // cp - 1 K/V sends, cp dK|dV sends
}

// ---------------------------------------------------------------- Ulysses attention
// One all-to-all over cp turns "my tokens, every head" into "every token of
// my B sequences, my NH/cp heads" (cp_seq_to_heads, context.c: block j of
// the send buffer holds head group j's columns of my tokens; what arrives
// is laid at its positions in whole sequences); attention runs whole on
// those heads; one all-to-all turns it back (cp_heads_to_seq). Both, with
// the attention between them, are context.c's cp_ulysses_forward (the
// capstone runs it too).
static void ulysses_attention_forward(CPModel* m, LayerActs* la) {
    const int n = m->cpc->size, NH = m->cfg.num_heads;
    CPAttention a = cp_attention(m);  // the cp group, my rows, the all-to-all's buffers, the clock
    // all-to-all, chapter 0's attention on whole sequences of NH/cp heads (C/cp channels), all-to-all back
    cp_ulysses_forward(&a, la->a.qkv, la->a.atty, la->lse, la->qkv_h, la->y_h);
    m->attn_scores += (long)m->sh.B * (NH / n) * ((long)m->sh.T * (m->sh.T + 1) / 2);
}

// Backward: the same two exchanges on the gradients. The op's backward
// reads the output in the head layout too: the layer kept it (y_h).
static void ulysses_attention_backward(CPModel* m, const LayerActs* la, const float* datty, float* dqkv) {
    CPAttention a = cp_attention(m);
    cp_ulysses_backward(&a, la->qkv_h, la->y_h, la->lse, datty, dqkv);
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
// Forward on my rows of the B sequences (host (B, T) token arrays); returns
// the mean loss of my N tokens. The embedding and the head work token by
// token (context.c); the blocks' attention meets the other cp ranks.
static float model_forward(CPModel* m, const int* inputs, const int* targets) {
    const GPTConfig* c = &m->cfg;
    cp_embed_forward(m, inputs, targets);
    const float* x = m->encoded;
    for (int l = 0; l < c->num_layers; l++) {
        double t0 = trace_start();
        BlockParams p = block_params_at(m->params + gpt_block_offset(c, l), c->channels);
        LayerActs la = cp_layer_at(m, l);
        cp_block_forward(m, &p, &la, x);
        x = la.a.res3;
        trace_compute(t0, "block %d forward", l);
    }
    return cp_head_forward(m, x);
}

// Layer l as its backward reads it: with --recompute, what forward dropped
// is computed again into the transient (the "block l recompute" span).
// Selective: gelu(fch) alone (no attention keeps probabilities to rebuild:
// each kept its lse; no communication). Full:
// the whole block from its kept input x, its attention with it: the ring's
// K/V go around again (cp-1 more sends per layer), Ulysses' two forward
// all-to-alls run again. The same ops on the same inputs: the same bits.
// The balance figures (attention scores and time) count forward and
// backward, not the recompute: its counters are put back.
static LayerActs layer_for_backward(CPModel* m, const BlockParams* p, int l, const float* x) {
    LayerActs la = cp_layer_at(m, l);
    if (m->recompute == RECOMPUTE_NONE) return la;
    const int C = m->cfg.channels, N = m->N;
    double t0 = trace_start();
    if (m->recompute == RECOMPUTE_SELECTIVE) {
        gelu_forward(la.a.fch_gelu, la.a.fch, (size_t)N * 4 * C);
    } else {
        CPWork kept = cp_work_pause(m);
        la = cp_layer_in_transient(m);
        cp_block_forward(m, p, &la, x);
        cp_work_restore(m, &kept);
    }
    trace_compute(t0, "block %d recompute", l);
    return la;
}

// Backward of my tokens' mean loss; accumulates into m->grads.
static void model_backward(CPModel* m) {
    const GPTConfig* c = &m->cfg;
    cp_head_backward(m);  // m->dres: d loss / d the last block's output
    for (int l = c->num_layers - 1; l >= 0; l--) {
        double t0 = trace_start();
        BlockParams p = block_params_at(m->params + gpt_block_offset(c, l), c->channels);
        BlockParams g = block_params_at(m->grads + gpt_block_offset(c, l), c->channels);
        const float* x = l > 0 ? cp_layer_at(m, l - 1).a.res3 : m->encoded;
        LayerActs la = layer_for_backward(m, &p, l, x);
        cp_block_backward(m, &p, &g, &la, x);
        trace_compute(t0, "block %d backward", l);
    }
    cp_embed_backward(m);
}

// The weights are replicated over dp x cp and each rank's gradient is that
// of its tokens' mean loss: the mean over the group is the gradient of the
// global batch's mean loss. Then every replica takes the same AdamW step.
static float reduce_and_step(CPModel* m, const TrainArgs* args, int step) {
    comm_allreduce(&m->dpcp, m->grads, m->P, COMM_AVG);
    double* sumsq = train_sumsq_begin();
    grad_sumsq(sumsq, m->grads, m->P);
    double norm = train_global_norm(sumsq, NULL, 0);
    double t0 = trace_start();
    adamw_update(m->params, m->grads, m->m, m->v, m->P, train_adamw(args), step + 1, grad_clip_scale(norm, args->clip));
    trace_compute(t0, "optimizer");
    return (float)norm;
}

// ---------------------------------------------------------------- validation
// Every cp rank runs its rows of the same sequences. The balance figures
// and the ring's waits count training only: validation's are put back.
static float forward_for_val(void* ctx, const int* inputs, const int* targets) {
    return model_forward((CPModel*)ctx, inputs, targets);
}

static float cp_val_loss(void* ctx, const TrainSetup* setup, int n_batches) {
    return cp_val_loss_with(ctx, setup, n_batches, forward_for_val);
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
    CPMode mode = CP_RING;
    CPBalance balance = BALANCE_NONE;
    cp_parse_flags(mode_name, balance_name, overlap, &mode, &balance);
    cp_note_unused(argc, argv, run.mesh.size[AXIS_CP], mode);  // a flag of an axis or mode that is off: said
    if (run.mesh.size[AXIS_CP] == 1) mode = CP_RING, balance = BALANCE_NONE;  // and off: one rank's plain attention
    if (!sp && run.mesh.size[AXIS_TP] > 1)
        fail_all("--tp %d without --sp: tensor parallelism is chapter 4's; here it comes with sequence "
                 "parallelism, --tp N --sp", run.mesh.size[AXIS_TP]);
    const TrainArgs* args = &run.args;
    const TrainSetup* setup = &run.setup;
    int B = setup->B, T = setup->T, ndp = run.mesh.size[AXIS_DP];
    // a dp group reads its B/dp sequences of every step; its cp (or tp)
    // ranks all read the same ones and keep their own rows of them
    int per_dp = B / ndp, b0 = run.mesh.coord[AXIS_DP] * per_dp;

    // one of the two strategies: sequence parallelism (sequence.c: tp x dp,
    // chapter 4's FSDP over dp, ZeRO-3) or context parallelism (dp x cp)
    SP s;
    CPModel cp;
    if (sp) {
        sp_create(&s, &run, 3, 1, 1);
    } else {
        train_check_mesh(&run.mesh, setup, NULL);
        cp_create(&cp, &run, mode, balance, overlap, per_dp, b0);
    }
    // training-state checkpoints (--ckpt-dir, --resume), opened once the
    // mesh is accepted: a refused one leaves no lock behind
    Ckpt ck;
    ckpt_init(&ck, args, setup, &run.mesh, 6);
    if (sp) {
        sp_ckpt(&ck, &s);
        sp_print_setup(&s, &run);
    } else {
        cp_ckpt(&ck, &cp, run.mesh.rank);
        cp_print_setup(&cp, &run);
    }
    ckpt_resume(&ck);

    TrainLoop loop;
    train_loop_begin(&loop, &run, &(TrainLoopSpec){
        .chapter = 6, .num_params = gpt_num_params(&setup->cfg), .flops_per_token = gpt_flops_per_token(&setup->cfg, T),
        .rows = per_dp, .val_loss = sp ? sp_val_loss : cp_val_loss, .ctx = sp ? (void*)&s : (void*)&cp, .ckpt = &ck});
    int ln_agree = 1;             // sp: the LayerNorm gradients the same on every tp rank, every step
    double ring_wait_timed = 0.0;  // cp: the ring's waits in the steps the clock times
    for (int step = loop.start; step < loop.steps; step++) {
        data_batch(&setup->train, step, B, T, b0, per_dp, loop.inputs, loop.targets);
        float my_loss, norm;
        const Comm* loss_group;  // the ranks of different tokens (a host scalar: plain MPI)
        if (sp) {
            // the tp all-gathers and reduce-scatters of each block (sequence.c)
            my_loss = sp_forward(&s, loop.inputs, loop.targets);
            sp_backward(&s);
            norm = sp_optimizer_step(&s, args, step);
            loss_group = s.m.dp;  // every tp rank has its dp group's loss
        } else {
            // per layer: the ring's K/V passes or Ulysses' all-to-alls (above)
            double wait0 = cp.ring_wait_seconds;
            my_loss = model_forward(&cp, loop.inputs, loop.targets);
            mem_zero(cp.grads, cp.P * sizeof(float));
            model_backward(&cp);
            norm = reduce_and_step(&cp, args, step);
            cp_work_settle(&cp);  // the step's attention time, off the device clock
            if (train_loop_timed(&loop, step)) ring_wait_timed += cp.ring_wait_seconds - wait0;
            // every rank has the same number of tokens: the mean of the
            // ranks' means is the mean over the global batch
            loss_group = &cp.dpcp;
        }
        float loss = (float)train_mean(loss_group, my_loss);
        train_loop_step(&loop, step, loss, norm);
        if (sp) ln_agree &= sp_layernorm_grads_agree(&s);  // outside the step's clock
    }
    JsonBuf summary = {0};
    if (sp) sp_summary(&s, &summary);
    else cp_report(&cp, loop.steps - loop.start, ring_wait_timed, &loop.clock, &summary);
    train_loop_end(&loop, &summary);  // the final validation and the summary
    json_free(&summary);

    int rc = 0;
    if (sp) {
        rc = sp_finish(&s, args, ln_agree);
        sp_free(&s);
    } else {
        cp_finish_params(&cp, args);  // --sample, --save: from rank 0's replica
        cp_free(&cp);
    }
    run_finish(&run);
    return rc;
}
