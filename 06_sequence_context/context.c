// context.c: context parallelism's model on a rank (context.h).
#include "context.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "errors.h"
#include "exercise.h"  // exercise_not_done, in a homework tree
#include "init.h"
#include "rank.h"
#include "memory.h"
#include "device_clock.h"
#include "mesh.h"
#include "trace.h"
#include "run.h"
#include "train_eval.h"
#include "train_loop.h"
#include "report.h"
#include "sharding.h"

const char* const cp_mode_names[2] = {"ring", "ulysses"};
const char* const cp_balance_names[2] = {"none", "zigzag"};

// ---------------------------------------------------------------- what a layer keeps (--recompute)
// A layer's fields sit in its store (kept for backward) or in the one
// transient every layer shares (dropped, recomputed in backward), as chapter
// 0's block_acts_kept splits them (docs/recompute.md):
//   none       everything in the store
//   selective  attproj, fcproj (backward never reads them) and fch_gelu go to
//              the transient; neither attention keeps probabilities (lse is
//              its whole softmax state), so it has nothing to recompute
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
    (void)T;  // nothing a layer keeps grows with the sequence but per token
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
    la.lse = place(base, at, K, (size_t)N * NH);
    if (mode == CP_ULYSSES) {
        la.qkv_h = place(base, at, K, 3 * NC);
        la.y_h = place(base, at, K, NC);
    }
    if (numel) numel[0] = at[0], numel[1] = at[1];
    return la;
}

LayerActs cp_layer_at(const CPModel* m, int l) {
    return cp_layout(m->mode, m->recompute, m->layers + (size_t)l * m->layer_numel, m->transient, m->N,
                     m->cfg.channels, m->cfg.num_heads, m->sh.T, NULL);
}

LayerActs cp_layer_in_transient(const CPModel* m) {
    return cp_layout(m->mode, RECOMPUTE_NONE, m->transient, NULL, m->N, m->cfg.channels, m->cfg.num_heads, m->sh.T,
                     NULL);
}

// Floats per layer (store) and of the transient. With none a layer keeps
// the block's 18C + 4 per token and NH (lse; Ulysses': B*T*(NH/cp) = N*NH),
// plus for ulysses 4C: my heads' qkv and output for whole sequences
// (B*T*4C/cp = N*4C). Full's transient holds a whole layer (its res3 too:
// the recompute writes its own copy and leaves the kept one alone).
void cp_layer_numels(CPMode mode, RecomputeMode r, int N, int C, int NH, int T, size_t* store,
                     size_t* transient) {
    size_t numel[2], whole[2];
    cp_layout(mode, r, NULL, NULL, N, C, NH, T, numel);
    cp_layout(mode, RECOMPUTE_NONE, NULL, NULL, N, C, NH, T, whole);
    *store = numel[KEPT];
    *transient = r == RECOMPUTE_FULL ? whole[KEPT] : numel[DROPPED];
}

// ---------------------------------------------------------------- set-up

void cp_parse_flags(const char* mode_name, const char* balance_name, int overlap, CPMode* mode, CPBalance* balance) {
    int found_mode = 0, found_balance = 0;
    for (int i = 0; i < 2; i++) {
        if (!strcmp(mode_name, cp_mode_names[i])) *mode = (CPMode)i, found_mode = 1;
        if (!strcmp(balance_name, cp_balance_names[i])) *balance = (CPBalance)i, found_balance = 1;
    }
    if (!found_mode) fail_all("--cp-mode %s is not one of ring, ulysses", mode_name);
    if (!found_balance) fail_all("--cp-balance %s is not one of none, zigzag", balance_name);
    if (overlap != 0 && overlap != 1) fail_all("--cp-overlap %d is not 0 or 1", overlap);
}

void cp_note_unused(int argc, char** argv, int ncp, CPMode mode) {
    const char* off = "context parallelism is off (--cp N turns it on)";
    args_note_unused(argc, argv, "cp-mode", ncp == 1, off);
    args_note_unused(argc, argv, "cp-balance", ncp == 1, off);
    args_note_unused(argc, argv, "cp-overlap", ncp == 1 || mode == CP_ULYSSES,
                     "only the ring (--cp N, --cp-mode ring) has a K/V block in flight to overlap");
}

const char* cp_mesh_problem(CPMode mode, CPBalance balance, int T, int num_heads, int ncp, char* msg, size_t len) {
    if (balance == BALANCE_ZIGZAG && T % (2 * ncp) != 0)
        snprintf(msg, len, "--seq %d does not split into 2 x cp = %d zigzag half-chunks: use a sequence length divisible by "
                 "%d, or --cp-balance none", T, 2 * ncp, 2 * ncp);
    else if (mode == CP_ULYSSES && num_heads % ncp != 0)
        snprintf(msg, len, "--cp-mode ulysses splits the model's %d heads over cp=%d ranks: use a cp that divides %d, or "
                 "--cp-mode ring", num_heads, ncp, num_heads);
    else
        return NULL;
    return msg;
}

void cp_create(CPModel* m, const Run* run, CPMode mode, CPBalance balance, int overlap, int B, int b0) {
    const TrainSetup* setup = &run->setup;
    int ncp = run->mesh.size[AXIS_CP];
    char msg[512];
    const char* bad = cp_mesh_problem(mode, balance, setup->T, setup->cfg.num_heads, ncp, msg, sizeof(msg));
    if (bad) fail_all("%s", bad);
    memset(m, 0, sizeof(*m));
    m->balance = balance;
    m->b0 = b0;
    m->overlap = overlap;
    m->attn_timed = 1;
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
    cp_layer_numels(mode, m->recompute, N, C, NH, T, &m->layer_numel, &m->transient_numel);
    m->encoded = mem_alloc_floats(NC, MEM_ACTIVATIONS);
    m->layers = mem_alloc_floats((size_t)L * m->layer_numel, MEM_ACTIVATIONS);
    if (m->transient_numel) m->transient = mem_alloc_floats(m->transient_numel, MEM_ACTIVATIONS);
    m->head = mem_alloc_floats(head_acts_numel(1, N, C, m->cfg.padded_vocab_size), MEM_ACTIVATIONS);
    m->inputs = mem_alloc((size_t)N * sizeof(int), MEM_ACTIVATIONS);
    m->targets = mem_alloc((size_t)N * sizeof(int), MEM_ACTIVATIONS);
    m->losses_host = mem_alloc_host((size_t)N * sizeof(float));  // staging buffers (memory.h)
    m->rows_host = mem_alloc_host((size_t)N * 2 * sizeof(int));
    m->dres = mem_alloc_floats(NC, MEM_ACTIVATIONS);
    m->dln = mem_alloc_floats(NC, MEM_ACTIVATIONS);
    m->stash = mem_alloc_floats(block_stash_numel(1, N, C), MEM_ACTIVATIONS);
    m->dfch_gelu = mem_alloc_floats(4 * NC, MEM_ACTIVATIONS);
    m->datty = mem_alloc_floats(NC, MEM_ACTIVATIONS);
    cp_buffers_create(&m->buf, mode, N, C, NH);
    if (setup->checkpoint) {  // --model FILE: every replica reads it whole
        host = xmalloc(m->P * sizeof(float));
        train_load_checkpoint(setup, host);
        mem_to_device(m->params, host, m->P * sizeof(float));
        free(host);
    }
}

void cp_free(CPModel* m) {
    float* bufs[] = {m->params, m->grads, m->m, m->v, m->encoded, m->layers, m->transient, m->head, m->dres, m->dln,
                     m->stash, m->dfch_gelu, m->datty};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) mem_free(bufs[i]);
    cp_buffers_free(&m->buf);
    mem_free(m->inputs);
    mem_free(m->targets);
    mem_free_host(m->losses_host);
    mem_free_host(m->rows_host);
    device_clock_free(&m->attn_clock);
    device_clock_free(&m->ring_wait_clock);
    comm_destroy_group(&m->dpcp);
}


void cp_finish_params(const CPModel* m, const TrainArgs* args) {
    if (!train_wants_params(args)) return;
    float* host = NULL;
    if (world_rank() == 0) {
        host = xmalloc(m->P * sizeof(float));
        mem_to_host(host, m->params, m->P * sizeof(float));
    }
    train_finish_params(args, &m->cfg, m->sh.T, host);
    free(host);
}

void cp_print_setup(const CPModel* m, const Run* run) {
    const TrainSetup* setup = &run->setup;
    int ndp = run->mesh.size[AXIS_DP], ncp = run->mesh.size[AXIS_CP], B = setup->B, T = setup->T, per_dp = m->sh.B;
    print0("chapter 6: context parallel, dp=%d x cp=%d, %s attention, balance %s, device %s\n", ndp, ncp,
           cp_mode_names[m->mode], cp_balance_names[m->balance], run->device);
    print0("model %s: %zu parameters, global batch %d x %d; each rank holds %d token%s of each of %d sequence%s "
           "(%d part%s of %d)\n", setup->model_name, m->P, B, T, T / ncp, T / ncp == 1 ? "" : "s", per_dp,
           per_dp == 1 ? "" : "s", m->sh.parts, m->sh.parts == 1 ? "" : "s", m->sh.len);
    print0("activations kept per layer: %zu bytes; transient %zu bytes (--recompute %s)\n",
           m->layer_numel * sizeof(float), m->transient_numel * sizeof(float), recompute_name(m->recompute));
    if (m->recompute == RECOMPUTE_FULL)
        print0("recompute full: backward reruns each block's forward, %s\n",
               m->mode == CP_RING ? "the ring's K/V passes again (cp-1 more sends per layer)"
                                  : "its 2 all-to-alls again (2 more per layer)");
    // --show-sharding: every rank holds the whole model (cp splits the sequence, not the weights)
    sharding_show_replicated(&m->cfg, 1, run->args.show_sharding, "chapter 6, context parallel");
}

// ---------------------------------------------------------------- the per-token parts of the step
#define WTE(m, base) ((base) + gpt_tensor_offset(&(m)->cfg, P_WTE, 0))
#define WPE(m, base) ((base) + gpt_tensor_offset(&(m)->cfg, P_WPE, 0))
#define LNFW(m, base) ((base) + gpt_tensor_offset(&(m)->cfg, P_LNFW, 0))
#define LNFB(m, base) ((base) + gpt_tensor_offset(&(m)->cfg, P_LNFB, 0))

static const float* last_output(const CPModel* m) {
    int L = m->cfg.num_layers;
    return L > 0 ? cp_layer_at(m, L - 1).a.res3 : m->encoded;
}

void cp_embed_forward(CPModel* m, const int* inputs, const int* targets) {
    const CPShard* sh = &m->sh;
    const int C = m->cfg.channels, N = m->N;
    int* rows = m->rows_host;
    cp_shard_tokens(sh, rows, inputs);
    cp_shard_tokens(sh, rows + N, targets);
    mem_to_device(m->inputs, rows, (size_t)N * sizeof(int));
    mem_to_device(m->targets, rows + N, (size_t)N * sizeof(int));
    double t0 = trace_start();
    // positions follow the tokens: part p's rows take wpe from its first position on
    cp_shard_encoder_forward(sh, m->encoded, m->inputs, WTE(m, m->params), WPE(m, m->params), C);
    trace_compute(t0, "embedding forward");
}

float cp_head_forward(CPModel* m, const float* x) {
    const GPTConfig* c = &m->cfg;
    const int C = c->channels, N = m->N;
    HeadActs h = head_acts_at(m->head, 1, N, C, c->padded_vocab_size);
    head_forward(c, WTE(m, m->params), LNFW(m, m->params), LNFB(m, m->params), &h, x, m->targets, 1, N);
    mem_to_host(m->losses_host, h.losses, (size_t)N * sizeof(float));
    double sum = 0.0;
    for (int i = 0; i < N; i++) sum += m->losses_host[i];
    return (float)(sum / N);
}

void cp_head_backward(CPModel* m) {
    const GPTConfig* c = &m->cfg;
    const int C = c->channels, N = m->N;
    HeadActs h = head_acts_at(m->head, 1, N, C, c->padded_vocab_size);
    head_backward(c, WTE(m, m->params), LNFW(m, m->params), WTE(m, m->grads), LNFW(m, m->grads), LNFB(m, m->grads),
                  &h, last_output(m), m->targets, 1.0f / (float)N, m->dln, m->dres, 1, N);
}

void cp_embed_backward(CPModel* m) {
    double t0 = trace_start();
    cp_shard_encoder_backward(&m->sh, WTE(m, m->grads), WPE(m, m->grads), m->dres, m->inputs, m->cfg.channels);
    trace_compute(t0, "embedding backward");
}

// ---------------------------------------------------------------- what the chapter measures

CPWork cp_work_pause(CPModel* m) {
    CPWork w = {.attn_scores = m->attn_scores, .ring_scores = m->buf.ring.scores, .ring_skipped = m->buf.ring.skipped,
                .attn_timed = m->attn_timed};
    m->attn_timed = 0;
    return w;
}

void cp_work_restore(CPModel* m, const CPWork* w) {
    m->attn_scores = w->attn_scores;
    m->buf.ring.scores = w->ring_scores, m->buf.ring.skipped = w->ring_skipped;
    m->attn_timed = w->attn_timed;
}

void cp_work_settle(CPModel* m) {
    m->attn_seconds += device_clock_seconds(&m->attn_clock);
    device_clock_reset(&m->attn_clock);
    m->ring_wait_seconds += device_clock_seconds(&m->ring_wait_clock);
    device_clock_reset(&m->ring_wait_clock);
}

void cp_attn_clock_start(CPModel* m) {
    if (m->attn_timed) device_clock_start(&m->attn_clock);
}

void cp_attn_clock_stop(CPModel* m) {
    if (m->attn_timed) device_clock_stop(&m->attn_clock);
}

float cp_val_loss_with(CPModel* m, const TrainSetup* setup, int n_batches,
                       float (*forward)(void* ctx, const int* inputs, const int* targets)) {
    CPWork kept = cp_work_pause(m);
    cp_work_settle(m);  // the waits so far; validation's are dropped below
    double wait = m->ring_wait_seconds;
    float v = train_val_loss_with(setup, n_batches, forward, m, m->b0, m->sh.B, m->sh.B, &m->dpcp);
    cp_work_restore(m, &kept);
    device_clock_seconds(&m->ring_wait_clock);
    device_clock_reset(&m->ring_wait_clock);
    m->ring_wait_seconds = wait;
    return v;
}

void cp_ckpt(Ckpt* ck, CPModel* m, int world_rank) {
    if (world_rank == 0) ckpt_add_state(&ck->own, &m->cfg, 0, m->P, m->params, m->m, m->v);
    ckpt_add_state(&ck->need, &m->cfg, 0, m->P, m->params, m->m, m->v);
}

// The balance: the attention work and time per cp rank, gathered from every
// cp rank (host figures: plain MPI), with their max/min ratio.
static double per_rank(const CPModel* m, double mine, double* all) {
    int n = m->cpc->size;
    MPI_CHECK(MPI_Allgather(&mine, 1, MPI_DOUBLE, all, 1, MPI_DOUBLE, m->cpc->mpi));
    double lo = all[0], hi = all[0];
    for (int i = 1; i < n; i++) lo = fmin(lo, all[i]), hi = fmax(hi, all[i]);
    return lo > 0 ? hi / lo : 0.0;
}

static void print_per_rank(const char* what, const double* all, int n, const char* fmt, double ratio) {
    char line[512] = "";
    for (int i = 0; i < n; i++) {
        size_t k = strlen(line);
        if (i && k + 1 < sizeof line) line[k++] = ' ', line[k] = '\0';
        snprintf(line + k, sizeof line - k, fmt, all[i]);
    }
    print0("%s: %s (max/min %.2f)\n", what, line, ratio);
}

void cp_report(const CPModel* m, int steps_run, double ring_wait_timed, const StepClock* clock, JsonBuf* extra) {
    int ring = m->mode == CP_RING, n = m->cpc->size;
    double ring_wait_ms = clock->timed > 0 ? 1e3 * ring_wait_timed / clock->timed : 0.0;
    double per_step = steps_run > 0 ? 1.0 / steps_run : 0.0;
    // the cp axis's traffic of training: the ring's sends, or Ulysses'
    // all-to-alls, per step
    CommCount cp_send = comm_count(ring ? COLL_SEND : COLL_ALLTOALL, AXIS_CP);
    double cp_calls = cp_send.calls * per_step, cp_bytes = cp_send.bytes * per_step;
    print0("cp traffic per rank per step: %.0f %s, %.0f bytes\n", cp_calls, ring ? "sends" : "all-to-alls", cp_bytes);
    // (the ring counts scores per sequence and head: x B x NH)
    long scores = ring ? m->buf.ring.scores * m->sh.B * m->cfg.num_heads : m->attn_scores;
    double* all_scores = xmalloc((size_t)n * sizeof(double));
    double* all_ms = xmalloc((size_t)n * sizeof(double));
    double scores_ratio = per_rank(m, (double)scores * per_step, all_scores);
    double ms_ratio = per_rank(m, 1e3 * m->attn_seconds * per_step, all_ms);
    print_per_rank("attention scores per cp rank per step (forward)", all_scores, n, "%.0f", scores_ratio);
    print_per_rank("attention compute per cp rank, ms per step", all_ms, n, "%.2f", ms_ratio);
    if (ring) {
        print0("ring: fully masked (query part, key part) pairs skipped per step, forward, cp rank 0: %ld\n",
               steps_run > 0 ? m->buf.ring.skipped / steps_run : 0);
        // the ring's waits (forward, recompute, backward) per timed step: a
        // part of the communication the summary reports blocked
        print0("ring waits: %.2f ms per step for K/V and dK/dV blocks (rank 0, overlap %s)\n", ring_wait_ms,
               m->overlap ? "on" : "off");
    }
    print0("communication: %.2f ms per step blocked (rank 0), of %.2f ms per step\n", clock_wait_ms_per_step(clock),
           clock_ms_per_step(clock));
    json_add_string(extra, "cp_mode", cp_mode_names[m->mode]);
    json_add_string(extra, "cp_balance", cp_balance_names[m->balance]);
    json_add_double_array(extra, "attention_scores_per_rank", all_scores, n, "%.0f");
    json_add_double_array(extra, "attention_ms_per_rank", all_ms, n, "%.3f");
    json_add_double(extra, "cp_calls_per_step", cp_calls, "%.0f");
    json_add_double(extra, "cp_bytes_per_step", cp_bytes, "%.0f");
    json_add_int(extra, "cp_overlap", m->overlap);
    json_add_double(extra, "ring_wait_ms_per_step", ring_wait_ms, "%.3f");
    json_add_string(extra, "recompute", recompute_name(m->recompute));
    json_add_int(extra, "layer_acts_bytes", (long long)(m->layer_numel * sizeof(float)));
    json_add_int(extra, "transient_bytes", (long long)(m->transient_numel * sizeof(float)));
    free(all_scores);
    free(all_ms);
}

// ---------------------------------------------------------------- attention over the cp group

void cp_buffers_create(CPBuffers* b, CPMode mode, int N, int C, int NH) {
    const size_t NC = (size_t)N * C;
    memset(b, 0, sizeof(*b));
    if (mode == CP_RING) {
        for (int i = 0; i < 2; i++) {
            b->kv[i] = mem_alloc_floats(2 * NC, MEM_COMM);
            b->dkv[i] = mem_alloc_floats(2 * NC, MEM_COMM);
        }
        b->dkv_in = mem_alloc_floats(2 * NC, MEM_COMM);
        // one pair's partials are one part's rows: at most N
        b->ring.o2 = mem_alloc_floats(NC, MEM_ACTIVATIONS);
        b->ring.m2 = mem_alloc_floats((size_t)N * NH, MEM_ACTIVATIONS);
        b->ring.l2 = mem_alloc_floats((size_t)N * NH, MEM_ACTIVATIONS);
        b->ring.sumexp = mem_alloc_floats((size_t)N * NH, MEM_ACTIVATIONS);
    } else {
        b->send = mem_alloc_floats(3 * NC, MEM_COMM);
        b->recv = mem_alloc_floats(3 * NC, MEM_COMM);
        b->dy_h = mem_alloc_floats(NC, MEM_ACTIVATIONS);
        b->dqkv_h = mem_alloc_floats(3 * NC, MEM_ACTIVATIONS);
    }
}

void cp_buffers_free(CPBuffers* b) {
    float* bufs[] = {b->kv[0], b->kv[1], b->dkv[0], b->dkv[1], b->dkv_in, b->ring.o2, b->ring.m2, b->ring.l2,
                     b->ring.sumexp, b->send, b->recv, b->dy_h, b->dqkv_h};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++)
        if (bufs[i]) mem_free(bufs[i]);
}

CPAttention cp_attention_on(const Comm* cpc, const CPShard* sh, int N, int C, int NH, CPBuffers* b) {
    return (CPAttention){.cpc = cpc, .sh = sh, .N = N, .C = C, .NH = NH, .kv = {b->kv[0], b->kv[1]},
                         .dkv = {b->dkv[0], b->dkv[1]}, .dkv_in = b->dkv_in, .ring = &b->ring, .send = b->send,
                         .recv = b->recv, .dy_h = b->dy_h, .dqkv_h = b->dqkv_h, .overlap = 1};
}

CPAttention cp_attention(CPModel* m) {
    CPAttention a = cp_attention_on(m->cpc, &m->sh, m->N, m->cfg.channels, m->cfg.num_heads, &m->buf);
    a.overlap = m->overlap, a.wait_clock = &m->ring_wait_clock, a.attn_clock = m->attn_timed ? &m->attn_clock : NULL;
    return a;
}

// A ring transfer completed, the time spent waiting for it counted: the part
// of the ring's communication the attention in hand did not hide. With
// --cp-overlap 0 each transfer is waited for as soon as it is posted, before
// the compute it would overlap: then every wait is the whole transfer.
static void ring_wait(const CPAttention* a, CommRequest* r) {
    if (a->wait_clock) comm_wait_clock_begin(a->wait_clock);  // the wait alone, read at the step's end (cp_work_settle)
    comm_wait(r);
    if (a->wait_clock) comm_wait_clock_end(a->wait_clock);
}

// The compute with the block in hand, on the attention clock if it runs.
static void attn_clock_start(const CPAttention* a) {
    if (a->attn_clock) device_clock_start(a->attn_clock);
}

static void attn_clock_stop(const CPAttention* a) {
    if (a->attn_clock) device_clock_stop(a->attn_clock);
}

// At step s the block in hand is the K/V of cp rank src = r - s: it goes on
// to the right while I compute with it, and the next arrives from the left.
//
//   step 0: r holds K/V of r      step 1: of r-1      ...   step cp-1: of r+1
void cp_ring_forward(const CPAttention* a, const float* qkv, float* atty, float* lse) {
    const int C = a->C, NH = a->NH, N = a->N;
    const int n = a->cpc->size, r = a->cpc->rank, right = (r + 1) % n, left = (r - 1 + n) % n;
    const size_t kv_count = (size_t)N * 2 * C;
    // pack my K and V out of qkv: only they travel (2C of the 3C per token)
    ops_copy_2d(a->kv[0], 2 * C, qkv + C, 3 * C, N, 2 * C);
    ring_forward_begin(a->ring);
    for (int s = 0; s < n; s++) {
        const int src = (r - s + n) % n;
        const float* kv = a->kv[s % 2];
        CommRequest to_right = {0}, from_left = {0};
        if (s < n - 1) {  // pass the block on while computing with it
            comm_irecv(a->cpc, a->kv[(s + 1) % 2], kv_count, left, &from_left);
            comm_isend(a->cpc, kv, kv_count, right, &to_right);
        }
        if (!a->overlap) ring_wait(a, &from_left), ring_wait(a, &to_right);
        attn_clock_start(a);
        ring_forward_block(a->sh, a->ring, qkv, kv, src, atty, lse, C, NH);
        attn_clock_stop(a);
        ring_wait(a, &from_left);
        ring_wait(a, &to_right);
    }
    // out / sumexp, and lse = rowmax + log(sumexp) in place of rowmax
    ring_forward_finish(a->sh, a->ring, atty, lse, C, NH);
}

// The K/V blocks go around as in forward; each rank adds its queries' share
// of dK|dV into the partial sum that arrived with the block and passes it
// on; after cp hops (one more than K/V makes) it is home. Blocks and sums
// both come from the left neighbour, untagged: receives match its sends in
// order (a step's block, then that step's sum).
void cp_ring_backward(const CPAttention* a, const float* qkv, const float* atty, const float* lse,
                      const float* datty, float* dqkv) {
    // EXERCISE 3: ring backward: K/V go around again; each rank adds its queries' dK/dV share to the partial sum that arrived and sends it on; after cp hops it is home in dqkv
    const int C = a->C, NH = a->NH, N = a->N;
    const int n = a->cpc->size, r = a->cpc->rank, right = (r + 1) % n, left = (r - 1 + n) % n;
    const size_t kv_count = (size_t)N * 2 * C;
    ops_copy_2d(a->kv[0], 2 * C, qkv + C, 3 * C, N, 2 * C);
    CommRequest d_to_right = {0}, d_from_left = {0};
    for (int s = 0; s < n; s++) {
        const int src = (r - s + n) % n;
        const float* kv = a->kv[s % 2];
        float* dkv = a->dkv[s % 2];  // the other one may still be on its way right
        CommRequest to_right = {0}, from_left = {0};
        if (s < n - 1) {
            comm_irecv(a->cpc, a->kv[(s + 1) % 2], kv_count, left, &from_left);
            comm_isend(a->cpc, kv, kv_count, right, &to_right);
        }
        if (!a->overlap) ring_wait(a, &from_left), ring_wait(a, &to_right);
        attn_clock_start(a);
        ops_zero(dkv, kv_count);
        ring_backward_block(a->sh, qkv, atty, lse, datty, kv, src, dqkv, dkv, C, NH);
        attn_clock_stop(a);
        if (s > 0) {  // what the ranks before me added for src's keys
            ring_wait(a, &d_from_left);
            ring_wait(a, &d_to_right);
            ops_add(dkv, a->dkv_in, kv_count);
        }
        if (n > 1) {
            comm_irecv(a->cpc, a->dkv_in, kv_count, left, &d_from_left);
            comm_isend(a->cpc, dkv, kv_count, right, &d_to_right);
            if (!a->overlap) ring_wait(a, &d_from_left), ring_wait(a, &d_to_right);
        }
        ring_wait(a, &from_left);
        ring_wait(a, &to_right);
    }
    ring_wait(a, &d_from_left);
    ring_wait(a, &d_to_right);
    // home: d of my keys and values from every query of the sequence (on
    // one rank it never left)
    ops_copy_2d(dqkv + C, 3 * C, n > 1 ? a->dkv_in : a->dkv[0], 2 * C, N, 2 * C);
    // END EXERCISE 3
}

// Pack block j of the send buffer with head group j's columns of my rows,
// exchange, and lay each rank's rows at their positions in whole sequences.
void cp_seq_to_heads(const CPAttention* a, float* dst, const float* src, int w) {
    // EXERCISE 4: Ulysses: pack head group j's columns of my tokens into block j, all-to-all over cp, lay each rank's tokens at their positions in whole sequences
    const CPShard* sh = a->sh;
    const int n = a->cpc->size, C = a->C, c = C / n, wc = w * c, N = a->N;
    const size_t block = (size_t)N * wc;
    for (int j = 0; j < n; j++)
        for (int t = 0; t < w; t++)
            ops_copy_2d(a->send + j * block + t * c, wc, src + t * C + j * c, w * C, N, c);
    comm_alltoall(a->cpc, a->send, a->recv, block);
    for (int s = 0; s < n; s++)
        for (int p = 0; p < sh->parts; p++)
            for (int b = 0; b < sh->B; b++)
                ops_copy(dst + ((size_t)b * sh->T + cp_shard_pos(sh, s, p)) * wc,
                         a->recv + s * block + ((size_t)p * sh->B + b) * sh->len * wc, (size_t)sh->len * wc);
    // END EXERCISE 4
}

// Head shards back to sequence shards: the inverse of cp_seq_to_heads.
void cp_heads_to_seq(const CPAttention* a, float* dst, const float* src, int w) {
    const CPShard* sh = a->sh;
    const int n = a->cpc->size, C = a->C, c = C / n, wc = w * c, N = a->N;
    const size_t block = (size_t)N * wc;
    for (int s = 0; s < n; s++)
        for (int p = 0; p < sh->parts; p++)
            for (int b = 0; b < sh->B; b++)
                ops_copy(a->send + s * block + ((size_t)p * sh->B + b) * sh->len * wc,
                         src + ((size_t)b * sh->T + cp_shard_pos(sh, s, p)) * wc, (size_t)sh->len * wc);
    comm_alltoall(a->cpc, a->send, a->recv, block);
    for (int j = 0; j < n; j++)
        for (int t = 0; t < w; t++)
            ops_copy_2d(dst + t * C + j * c, w * C, a->recv + j * block + t * c, wc, N, c);
}

// Ulysses: the two all-to-alls around chapter 0's attention on whole
// sequences of my NH/cp heads (C/cp channels).
void cp_ulysses_forward(const CPAttention* a, const float* qkv, float* atty, float* lse, float* qkv_h, float* y_h) {
    const CPShard* sh = a->sh;
    const int n = a->cpc->size;
    cp_seq_to_heads(a, qkv_h, qkv, 3);  // all-to-all: my heads' q|k|v, whole sequences
    attn_clock_start(a);
    attention_flash_forward(y_h, lse, qkv_h, sh->B, sh->T, a->C / n, a->NH / n);
    attn_clock_stop(a);
    cp_heads_to_seq(a, atty, y_h, 1);  // all-to-all: the output back to my tokens
}

void cp_ulysses_backward(const CPAttention* a, const float* qkv_h, const float* y_h, const float* lse,
                         const float* datty, float* dqkv) {
    const CPShard* sh = a->sh;
    const int n = a->cpc->size;
    cp_seq_to_heads(a, a->dy_h, datty, 1);  // all-to-all: d output of my heads, whole sequences
    attn_clock_start(a);
    ops_zero(a->dqkv_h, (size_t)a->N * 3 * a->C);
    attention_flash_backward(a->dqkv_h, a->dy_h, qkv_h, y_h, lse, sh->B, sh->T, a->C / n, a->NH / n);
    attn_clock_stop(a);
    cp_heads_to_seq(a, dqkv, a->dqkv_h, 3);  // all-to-all: dq|dk|dv back to my tokens
}
