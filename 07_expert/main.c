// Chapter 7: mixture of experts with expert parallelism.
//
// In an MoE layer (common/moe.h) each token's MLP is k of E experts, chosen
// by a router. The experts are sharded over the ep ranks (E / ep each); the
// rest of the model is replicated on every rank, and every rank of the
// dp x ep mesh takes its own share of the global batch. So a token lives on
// one rank and its experts on others: each MoE layer moves the token rows to
// their experts and the outputs back.
//
//   mpirun -np 4 build/chapter-7 --dp 2 --ep 2 --experts 4 --top-k 2
//
// One MoE layer, forward, in the order of moe_layer_forward below:
//   1. route      router logits -> softmax -> top-k experts and gates
//   2. count      how many of my token rows go to each expert (so to each
//                 ep rank), and exchange the counts (all-to-all of ints)
//   3. dispatch   gather my rows in destination order, all-to-all-v them
//   4. experts    the received rows, grouped by expert, through each expert
//   5. combine    all-to-all-v the outputs back, sum them weighted by the gates
// Backward runs the two exchanges in reverse (moe_layer_backward).
//
// Gradients go to two groups (reduce_gradients): the replicated parameters
// over dp x ep, the experts over dp only.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "args.h"
#include "ckpt.h"
#include "comm.h"
#include "errors.h"
#include "exercise.h"  // exercise_not_done, in a homework tree
#include "memory.h"
#include "mesh.h"
#include "moe.h"
#include "rank.h"
#include "report.h"
#include "runtime.h"
#include "trace.h"
#include "train.h"

// ---------------------------------------------------------------- one MoE layer's state

// What forward keeps of one MoE layer for backward: the routing, the plan of
// the two exchanges, and the rows on both sides.
typedef struct {
    float *logits, *probs, *gates;  // (N, E), (N, E), (N, k)
    int *idx, *pos;                 // (N, k) chosen experts; row of (t, j) in send (-1: dropped)
    int* send_src;                  // (N*k) token of each send row
    int *perm, *inv_perm;           // (R) expert-major row <- received row, and back
    float *send, *back;             // (N*k, C) my rows out, the expert outputs back
    float *exp_in, *fch, *fch_gelu; // (R, C), (R, H), (R, H) on the expert side
    float* aux_dprobs;              // (E) d objective / d each prob (load-balancing loss)
    // the plan, on the host: counts are integers, and the comm layer's
    // collectives are float-only, so they travel by plain MPI
    int *idx_host, *pos_host, *src_host, *perm_host;
    int* cnt_send;                  // (E) my rows to each expert
    int* cnt_recv;                  // (ep, E/ep) rows from source s for my expert le
    int* expert_off;                // (E/ep + 1) each of my experts' rows in exp_in
    size_t *sc, *sd, *rc, *rd;      // (ep) floats sent to / received from each ep rank
    int n_send, n_recv;
} MoeLayer;

typedef struct {
    MoeConfig cfg;
    int B, T, N;           // this rank's sequences, their length, B*T token rows
    int ep, E_local, e0;   // ep ranks; my experts are [e0, e0 + E_local)
    int R;                 // most rows my experts can receive in one layer
    Comm dpep;             // every rank that holds the replicated parameters: dp x ep
    const Comm *world, *dp, *epc;  // world: rank 0 writes the file
    float aux_coef, capacity_factor;  // capacity_factor 0: dropless
    // parameters: the replicated ones and my experts (moe.h's two buffers)
    size_t n_shared, n_experts;
    float *shared, *dshared, *m_s, *v_s;
    float *experts, *dexperts, *m_e, *v_e;
    // activations: the GPT's (embedding, the blocks' attention halves and
    // dense MLPs as --recompute keeps them, head, scratch, dres, token ids)
    // and each MoE layer's own
    GPTActs acts;
    RecomputeMode recompute;
    MoeLayer* moe;  // one per MoE layer (--recompute full: one for all)
    float *send_shared, *gelu_shared;  // --recompute selective: every layer's send and fch_gelu
    // scratch shared by the layers
    float *recv, *xbuf, *ybuf, *dfch, *dfch_gelu, *dsend, *dgates, *dlogits, *dln2;
    // statistics of the last forward, summed over the MoE layers (global)
    double aux;      // the load-balancing loss (without aux_coef)
    long dropped;    // token-slots dropped by capacity
    long* routed;    // (L_moe, E) token-slots routed to each expert
    int record;      // 1: this forward is a training step's (statistics kept)
} ExpertModel;

static MoeLayer* layer_of(ExpertModel* m, int l) {
    return &m->moe[m->recompute == RECOMPUTE_FULL ? 0 : moe_layer_index(&m->cfg, l)];
}

// Where layer l's forward writes its attention half (and a dense layer its
// MLP): the kept fields in the layer's store, the dropped ones in the
// transient (model.h, --recompute)
static BlockActs acts_of(ExpertModel* m, int l) { return gpt_acts_block(&m->acts, &m->cfg.gpt, l, m->B, m->T); }

// ---------------------------------------------------------------- 1-2. route and count

// The load-balancing loss (Switch / GShard) of one MoE layer, over the
// GLOBAL batch so that every mesh trains the same objective: f_e = share of
// the token-slots routed to e, P_e = mean router prob of e,
// aux = E sum_e f_e P_e (1 when balanced). Writes d (aux_coef aux) / d each
// prob into L->aux_dprobs (one value per expert) and, in a training step,
// adds aux to m->aux and the slots per expert to m->routed.
static void balance_loss(ExpertModel* m, MoeLayer* L, int layer_index) {
    // EXERCISE 1: the load-balancing loss over the global batch (the sums over dp x ep) and its gradient per prob, scaled for the mean over dp x ep
    int N = m->N, k = m->cfg.top_k, E = m->cfg.experts;
    long* cnt = xmalloc((size_t)E * sizeof(long));
    double* psum = xmalloc((size_t)E * sizeof(double));
    float* probs = xmalloc((size_t)N * E * sizeof(float));
    float* aux_host = xmalloc((size_t)E * sizeof(float));
    mem_to_host(probs, L->probs, (size_t)N * E * sizeof(float));
    for (int e = 0; e < E; e++) cnt[e] = 0, psum[e] = 0.0;
    for (int i = 0; i < N * k; i++) cnt[L->idx_host[i]]++;
    for (int t = 0; t < N; t++)
        for (int e = 0; e < E; e++) psum[e] += probs[(size_t)t * E + e];
    // both sums over every token of the batch: all-reduced over dp x ep
    // (host data: plain MPI)
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, cnt, E, MPI_LONG, MPI_SUM, m->dpep.mpi));
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, psum, E, MPI_DOUBLE, MPI_SUM, m->dpep.mpi));
    double n_global = (double)N * m->dpep.size, aux = 0.0;
    for (int e = 0; e < E; e++) {
        double f = (double)cnt[e] / (n_global * k), P = psum[e] / n_global;
        aux += E * f * P;
        // d (coef * aux) / d prob[t, e] = coef E f_e / N_global for every
        // token; this rank's gradient is averaged over dp x ep later
        // (x 1 / (dp ep)), so it carries dp ep x that: coef E f_e / N
        aux_host[e] = (float)(m->aux_coef * E * f / N);
        if (m->record) m->routed[(size_t)layer_index * E + e] = cnt[e];
    }
    mem_to_device(L->aux_dprobs, aux_host, (size_t)E * sizeof(float));
    if (m->record) m->aux += aux;
    free(aux_host);
    free(probs);
    free(psum);
    free(cnt);
    // END EXERCISE 1
}

// Capacity mode: at most floor(f k N_global / E) slots per expert over the
// global batch, kept in batch order (token, then slot); the rest are dropped
// and pass through the residual. f = 0: dropless. Sets L->pos_host[i] to 0
// for a kept slot i (token i / k, its (i % k)-th choice), -1 for a dropped
// one, and L->cnt_send[e] to my kept slots of expert e. Returns the slots
// dropped over the global batch.
static long plan_capacity(ExpertModel* m, MoeLayer* L) {
    // EXERCISE 2: capacity: keep the first slots of each expert in the order of the global batch, drop the rest, count them
    int N = m->N, k = m->cfg.top_k, E = m->cfg.experts;
    long cap = m->capacity_factor > 0 ? (long)(m->capacity_factor * k * (double)N * m->dpep.size / E) : -1;
    long* cnt = xmalloc((size_t)E * sizeof(long));
    long* before = xmalloc((size_t)E * sizeof(long));  // slots to e on the ranks before me
    for (int e = 0; e < E; e++) cnt[e] = 0, before[e] = 0, L->cnt_send[e] = 0;
    for (int i = 0; i < N * k; i++) cnt[L->idx_host[i]]++;
    // the group's rank order (world order) = the order of the batch's
    // shares (share = dp * ep + ep coordinate), so an exclusive scan counts
    // the slots of the tokens before mine
    MPI_CHECK(MPI_Exscan(cnt, before, E, MPI_LONG, MPI_SUM, m->dpep.mpi));
    if (m->dpep.rank == 0)
        for (int e = 0; e < E; e++) before[e] = 0;  // Exscan leaves rank 0's undefined
    long dropped = 0;
    for (int i = 0; i < N * k; i++) {
        int e = L->idx_host[i];
        if (cap >= 0 && before[e]++ >= cap) {
            L->pos_host[i] = -1;
            dropped++;
        } else {
            L->pos_host[i] = 0;
            L->cnt_send[e]++;
        }
    }
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &dropped, 1, MPI_LONG, MPI_SUM, m->dpep.mpi));
    free(before);
    free(cnt);
    return dropped;
    // END EXERCISE 2
}

// The exchanges' plan from my kept slots per expert (L->cnt_send, in expert
// order, so in destination order: rank r holds experts [r E/ep, (r+1) E/ep)):
// exchange the counts, then the floats sent to and received from each ep
// rank and where they sit (sc, sd, rc, rd), L->n_recv, and the order the
// experts take the received rows in (perm, expert_off).
static void plan_exchange(ExpertModel* m, MoeLayer* L) {
    // EXERCISE 3: the exchange plan: the counts' all-to-all, the all-to-all-v counts and offsets, the received rows grouped by expert
    int El = m->E_local, ep = m->ep, C = m->cfg.gpt.channels;
    // rank s learns how many rows of each of my experts it will receive
    // from me (an all-to-all of E/ep ints per pair; integers: plain MPI)
    MPI_CHECK(MPI_Alltoall(L->cnt_send, El, MPI_INT, L->cnt_recv, El, MPI_INT, m->epc->mpi));
    size_t so = 0, ro = 0;
    for (int r = 0; r < ep; r++) {
        size_t s_rows = 0, r_rows = 0;
        for (int le = 0; le < El; le++) {
            s_rows += (size_t)L->cnt_send[r * El + le];
            r_rows += (size_t)L->cnt_recv[r * El + le];
        }
        L->sc[r] = s_rows * C, L->sd[r] = so, so += s_rows * C;
        L->rc[r] = r_rows * C, L->rd[r] = ro, ro += r_rows * C;
    }
    L->n_recv = (int)(ro / C);
    // received rows come source-major (then expert); the experts want them
    // expert-major (then source): perm[i] = the received row of expert row i
    int* src_off = xmalloc((size_t)ep * El * sizeof(int));
    for (int s = 0, off = 0; s < ep; s++)
        for (int le = 0; le < El; le++) src_off[s * El + le] = off, off += L->cnt_recv[s * El + le];
    int row = 0;
    for (int le = 0; le < El; le++) {
        L->expert_off[le] = row;
        for (int s = 0; s < ep; s++)
            for (int i = 0; i < L->cnt_recv[s * El + le]; i++) L->perm_host[row++] = src_off[s * El + le] + i;
    }
    L->expert_off[El] = row;
    free(src_off);
    // END EXERCISE 3
}

// From the router's choices, the plan of the exchanges. Integer data:
// counts and indices go through the host by plain MPI, never through the
// float collectives of the comm layer.
static void plan_dispatch(ExpertModel* m, MoeLayer* L, int layer_index) {
    int N = m->N, k = m->cfg.top_k, E = m->cfg.experts;
    mem_to_host(L->idx_host, L->idx, (size_t)N * k * sizeof(int));
    balance_loss(m, L, layer_index);
    long dropped = plan_capacity(m, L);
    if (m->record) m->dropped += dropped;
    // kept slots sorted by expert (so by destination rank), stable in token
    // order: send row i is token src_host[i], slot j of token t goes to row
    // pos_host[t k + j]
    int* fill = xmalloc((size_t)E * sizeof(int));
    fill[0] = 0;
    for (int e = 1; e < E; e++) fill[e] = fill[e - 1] + L->cnt_send[e - 1];
    L->n_send = fill[E - 1] + L->cnt_send[E - 1];
    for (int i = 0; i < N * k; i++) {
        if (L->pos_host[i] < 0) continue;
        int row = fill[L->idx_host[i]]++;
        L->pos_host[i] = row;
        L->src_host[row] = i / k;
    }
    free(fill);
    plan_exchange(m, L);
    mem_to_device(L->pos, L->pos_host, (size_t)N * k * sizeof(int));
    mem_to_device(L->send_src, L->src_host, (size_t)L->n_send * sizeof(int));
    mem_to_device(L->perm, L->perm_host, (size_t)L->n_recv * sizeof(int));
    int* inv = xmalloc((size_t)(L->n_recv > 0 ? L->n_recv : 1) * sizeof(int));
    for (int i = 0; i < L->n_recv; i++) inv[L->perm_host[i]] = i;
    mem_to_device(L->inv_perm, inv, (size_t)L->n_recv * sizeof(int));
    free(inv);
}

// ---------------------------------------------------------------- the MoE layer

// a: where the attention half and the layer's output go (acts_of, or the
// transient when --recompute full runs the layer again in backward).
static void moe_layer_forward(ExpertModel* m, int l, BlockActs* a, const float* x) {
    const MoeConfig* c = &m->cfg;
    int N = m->N, C = c->gpt.channels, H = c->hidden, E = c->experts, k = c->top_k;
    MoeLayer* L = layer_of(m, l);
    BlockParams p = moe_block_params(c, m->shared, l);
    moe_attention_forward(&p, a, x, m->B, m->T, C, c->gpt.num_heads);
    // 1. route: logits (N, E) = ln2 @ router^T, softmax, top-k, gates
    matmul_forward(L->logits, a->ln2, moe_router_at(c, m->shared, l), NULL, N, C, E);
    moe_router_forward(L->probs, L->idx, L->gates, L->logits, N, E, k);
    // 2. count and exchange the counts
    plan_dispatch(m, L, moe_layer_index(c, l));
    // 3. dispatch: my rows in destination order, then the all-to-all-v
    moe_gather_forward(L->send, a->ln2, L->send_src, L->n_send, C);
    comm_alltoallv(m->epc, L->send, L->sc, L->sd, m->recv, L->rc, L->rd);
    // 4. experts: the received rows grouped by expert, one expert at a time
    moe_gather_forward(L->exp_in, m->recv, L->perm, L->n_recv, C);
    for (int le = 0; le < m->E_local; le++) {
        ExpertParams ep = moe_expert_at(c, m->experts, moe_layer_index(c, l), le, m->E_local);
        size_t r0 = (size_t)L->expert_off[le];
        moe_expert_forward(&ep, m->xbuf + r0 * C, L->fch + r0 * H, L->fch_gelu + r0 * H, L->exp_in + r0 * C,
                           L->expert_off[le + 1] - L->expert_off[le], C, H);
    }
    // 5. combine: back to source-major order, the reverse all-to-all-v, and
    // each token's k outputs summed with its gates (a->fcproj holds the sum)
    moe_gather_forward(m->recv, m->xbuf, L->inv_perm, L->n_recv, C);
    comm_alltoallv(m->epc, m->recv, L->rc, L->rd, L->back, L->sc, L->sd);
    moe_combine_forward(a->fcproj, L->back, L->gates, L->pos, N, k, C);
    residual_forward(a->res3, a->res2, a->fcproj, (size_t)N * C);
}

// --recompute: what layer l's forward did not keep, again, before its
// backward (docs/recompute.md). Returns the activations backward reads.
//   selective  keeps the router's choices, the plan and every row that
//              crossed the network (exp_in, fch, back): no exchange is
//              repeated. Recomputed: the attention probabilities from qkv,
//              and gelu(fch) of the experts' rows.
//   full       keeps only the layer's output; the whole layer runs again,
//              the router included: the same ops on the same input choose
//              the same experts, but the dispatch and combine all-to-all-v
//              are issued again, 2 more exchanges per MoE layer per step
//              (counted in the summary's alltoall bytes), and so are the
//              plan's small host exchanges (the counts, the scan, the sums).
static BlockActs moe_layer_recompute(ExpertModel* m, int l, const float* x) {
    const MoeConfig* c = &m->cfg;
    int C = c->gpt.channels, NH = c->gpt.num_heads;
    BlockActs a = acts_of(m, l);
    MoeLayer* L = layer_of(m, l);
    // the same span as model.c's dense blocks (docs/tracing.md)
    double t0 = trace_start();
    if (m->recompute == RECOMPUTE_SELECTIVE) {
        // as model.c: attention_forward rewrites atty (kept, the same bits)
        // into attproj's slot, which backward never reads
        attention_forward(a.attproj, a.att, a.qkv, m->B, m->T, C, NH);
        gelu_forward(L->fch_gelu, L->fch, (size_t)L->n_recv * c->hidden);
    } else if (m->recompute == RECOMPUTE_FULL) {
        // everything into the transient (its res3 too: the kept one stays);
        // the step's statistics were counted by the first forward
        a = block_acts_at(m->acts.transient, m->B, m->T, C, NH);
        int record = m->record;
        m->record = 0;
        moe_layer_forward(m, l, &a, x);
        m->record = record;
    }
    if (m->recompute != RECOMPUTE_NONE) trace_compute(t0, "block %d recompute", l);
    return a;
}

// dres: d res3 on entry, d x on return. The exchanges of forward, reversed.
static void moe_layer_backward(ExpertModel* m, int l, const float* x) {
    const MoeConfig* c = &m->cfg;
    int N = m->N, C = c->gpt.channels, H = c->hidden, E = c->experts, k = c->top_k;
    double t0 = trace_start();
    BlockActs a = moe_layer_recompute(m, l, x);
    MoeLayer* L = layer_of(m, l);
    BlockParams p = moe_block_params(c, m->shared, l);
    BlockParams g = moe_block_params(c, m->dshared, l);
    BlockScratch s = gpt_acts_scratch(&m->acts, &c->gpt);
    float* dres = m->acts.dres;
    // combine, backwards: d of each returned row, and of each gate
    ops_zero(m->dsend, (size_t)N * k * C);
    ops_zero(m->dgates, (size_t)N * k);
    moe_combine_backward(m->dsend, m->dgates, dres, L->back, L->gates, L->pos, N, k, C);
    // the combine's all-to-all-v reversed: the gradients go to the experts
    comm_alltoallv(m->epc, m->dsend, L->sc, L->sd, m->recv, L->rc, L->rd);
    moe_gather_forward(m->xbuf, m->recv, L->perm, L->n_recv, C);
    // experts, backwards: their gradients accumulate into my expert buffer
    ops_zero(m->ybuf, (size_t)L->n_recv * C);
    for (int le = 0; le < m->E_local; le++) {
        int mi = moe_layer_index(c, l);
        ExpertParams ep = moe_expert_at(c, m->experts, mi, le, m->E_local);
        ExpertParams eg = moe_expert_at(c, m->dexperts, mi, le, m->E_local);
        size_t r0 = (size_t)L->expert_off[le];
        moe_expert_backward(&ep, &eg, m->ybuf + r0 * C, m->xbuf + r0 * C, L->exp_in + r0 * C, L->fch + r0 * H,
                            L->fch_gelu + r0 * H, m->dfch, m->dfch_gelu, L->expert_off[le + 1] - L->expert_off[le], C, H);
    }
    // the dispatch's all-to-all-v reversed: d of my rows comes home
    moe_gather_forward(m->recv, m->ybuf, L->inv_perm, L->n_recv, C);
    comm_alltoallv(m->epc, m->recv, L->rc, L->rd, m->dsend, L->sc, L->sd);
    ops_zero(m->dln2, (size_t)N * C);
    moe_gather_backward(m->dln2, m->dsend, L->pos, N, k, C);
    // the router, backwards: through the gates and the load-balancing loss
    ops_zero(m->dlogits, (size_t)N * E);
    moe_router_backward(m->dlogits, m->dgates, L->aux_dprobs, L->probs, L->idx, L->gates, N, E, k);
    matmul_backward(m->dln2, moe_router_at(c, m->dshared, l), NULL, m->dlogits, a.ln2,
                    moe_router_at(c, m->shared, l), N, C, E);
    moe_attention_backward(&p, &g, &a, &s, x, m->dln2, dres, m->B, m->T, C, c->gpt.num_heads);
    trace_compute(t0, "block %d backward", l);
}

// ---------------------------------------------------------------- the whole model

static float model_forward(ExpertModel* m, const int* inputs, const int* targets) {
    const GPTConfig* g = &m->cfg.gpt;
    int B = m->B, T = m->T, C = g->channels;
    gpt_acts_load(&m->acts, inputs, targets);
    if (m->record) m->aux = 0.0, m->dropped = 0;
    encoder_forward(m->acts.encoded, m->acts.inputs, m->shared + moe_wte_offset(&m->cfg),
                    m->shared + moe_wpe_offset(&m->cfg), B, T, C);
    for (int l = 0; l < g->num_layers; l++) {
        if (moe_is_moe_layer(&m->cfg, l)) {
            BlockActs a = acts_of(m, l);
            double t0 = trace_start();
            moe_layer_forward(m, l, &a, gpt_acts_block_input(&m->acts, g, l, B, T));
            trace_compute(t0, "block %d forward", l);
        } else {
            BlockParams p = moe_block_params(&m->cfg, m->shared, l);
            gpt_block_forward(&m->acts, g, l, &p, B, T);
        }
    }
    HeadActs h = gpt_acts_head(&m->acts, g, B, T);
    float* lnf = m->shared + moe_lnf_offset(&m->cfg);
    head_forward(g, m->shared + moe_wte_offset(&m->cfg), lnf, lnf + C, &h,
                 gpt_acts_block_output(&m->acts, g, g->num_layers - 1, B, T), m->acts.targets, B, T);
    return gpt_acts_mean_loss(&m->acts, g);
}

static void model_backward(ExpertModel* m) {
    const GPTConfig* g = &m->cfg.gpt;
    int B = m->B, T = m->T, C = g->channels, L = g->num_layers;
    HeadActs h = gpt_acts_head(&m->acts, g, B, T);
    BlockScratch s = gpt_acts_scratch(&m->acts, g);
    float *P = m->shared, *G = m->dshared;
    size_t lnf = moe_lnf_offset(&m->cfg), wte = moe_wte_offset(&m->cfg);
    head_backward(g, P + wte, P + lnf, G + wte, G + lnf, G + lnf + C, &h, gpt_acts_block_output(&m->acts, g, L - 1, B, T),
                  m->acts.targets, 1.0f / (float)(B * T), s.dln, m->acts.dres, B, T);
    for (int l = L - 1; l >= 0; l--) {
        if (moe_is_moe_layer(&m->cfg, l)) {
            moe_layer_backward(m, l, gpt_acts_block_input(&m->acts, g, l, B, T));
        } else {
            // a dense layer: the GPT's block, recomputed as model.h says
            BlockParams p = moe_block_params(&m->cfg, P, l), gp = moe_block_params(&m->cfg, G, l);
            gpt_block_backward(&m->acts, g, l, &p, &gp, B, T);
        }
    }
    encoder_backward(G + wte, G + moe_wpe_offset(&m->cfg), m->acts.dres, m->acts.inputs, B, T, C);
}

// ---------------------------------------------------------------- the two gradient groups

// Every rank's gradient is of ITS tokens' mean loss. The replicated
// parameters saw every token of the batch, one share per rank: their
// gradient is the mean over the dp x ep group. An expert saw only the
// tokens routed to it, from the ep ranks of
// its own dp replica (the all-to-all brought them to it), already summed
// over those ranks by backward; its copies on the other dp replicas saw the
// other replicas' tokens. So its gradient is the sum over dp (the expert-
// data-parallel group), and over ep there is nothing to reduce: every ep
// rank holds different experts. Scaled by 1 / (dp ep), as each rank's
// share counts 1 / (dp ep) of the global mean.
static void reduce_gradients(ExpertModel* m) {
    // EXERCISE 4: the two gradient groups: the replicated parameters' mean over dp x ep, the experts' over dp only, scaled for the global mean
    comm_allreduce(&m->dpep, m->dshared, m->n_shared, COMM_AVG);
    comm_allreduce(m->dp, m->dexperts, m->n_experts, COMM_SUM);
    ops_scale(m->dexperts, m->n_experts, 1.0f / (float)m->dpep.size);
    // END EXERCISE 4
}

// The global norm: the replicated gradients enter once (on ep rank 0; they
// are equal on every rank), each rank's experts once per dp replica (dp
// rank 0), summed over ep and dp.
static float clip_and_step(ExpertModel* m, const TrainArgs* args, int step) {
    double mine = m->dp->rank == 0 ? grad_sumsq(m->dexperts, m->n_experts) : 0.0;
    if (m->epc->rank == 0 && m->dp->rank == 0) mine += grad_sumsq(m->dshared, m->n_shared);
    const Comm* groups[] = {m->epc, m->dp};
    double norm = train_global_norm(mine, groups, 2);
    float scale = grad_clip_scale(norm, args->clip);
    AdamWConfig ac = train_adamw(args);
    double t0 = trace_start();
    adamw_update(m->shared, m->dshared, m->m_s, m->v_s, m->n_shared, ac, step + 1, scale);
    adamw_update(m->experts, m->dexperts, m->m_e, m->v_e, m->n_experts, ac, step + 1, scale);
    trace_compute(t0, "optimizer");
    return (float)norm;
}

// ---------------------------------------------------------------- set-up

static void model_create(ExpertModel* m, const MoeConfig* cfg, int B, int T, const Mesh* mesh, const Run* run,
                         uint64_t seed, RecomputeMode recompute) {
    memset(m, 0, sizeof(*m));
    m->recompute = recompute;
    m->cfg = *cfg;
    m->B = B, m->T = T, m->N = B * T;
    m->world = &run->world, m->dp = &run->axes[AXIS_DP], m->epc = &run->axes[AXIS_EP];
    comm_create_group(&m->dpep, mesh, (1u << AXIS_DP) | (1u << AXIS_EP));
    m->ep = mesh->size[AXIS_EP];
    m->E_local = cfg->experts / m->ep;
    m->e0 = m->epc->rank * m->E_local;
    int N = m->N, C = cfg->gpt.channels, H = cfg->hidden, E = cfg->experts, k = cfg->top_k;
    int Lm = moe_num_moe_layers(cfg);
    // dropless: my experts may receive every slot of every token of my ep
    // group that can choose them (a token picks an expert at most once)
    m->R = N * m->ep * (k < m->E_local ? k : m->E_local);
    m->n_shared = moe_num_shared(cfg);
    m->n_experts = (size_t)Lm * m->E_local * moe_expert_numel(cfg);
    m->shared = mem_alloc_floats(m->n_shared, MEM_PARAMS);
    m->experts = mem_alloc_floats(m->n_experts, MEM_PARAMS);
    m->dshared = mem_alloc_floats(m->n_shared, MEM_GRADS);
    m->dexperts = mem_alloc_floats(m->n_experts, MEM_GRADS);
    m->m_s = mem_alloc_floats(m->n_shared, MEM_OPTIMIZER);
    m->v_s = mem_alloc_floats(m->n_shared, MEM_OPTIMIZER);
    m->m_e = mem_alloc_floats(m->n_experts, MEM_OPTIMIZER);
    m->v_e = mem_alloc_floats(m->n_experts, MEM_OPTIMIZER);
    float* host = xmalloc((m->n_shared > m->n_experts ? m->n_shared : m->n_experts) * sizeof(float));
    moe_init_shared(host, cfg, seed);
    mem_to_device(m->shared, host, m->n_shared * sizeof(float));
    moe_init_experts(host, cfg, m->e0, m->E_local, seed);
    mem_to_device(m->experts, host, m->n_experts * sizeof(float));
    free(host);
    gpt_acts_create_recompute(&m->acts, &cfg->gpt, B, T, recompute);
    size_t R = (size_t)m->R, Nk = (size_t)N * k;
    // --recompute full: one MoE layer's state, reused by every layer (each
    // layer's forward runs again before its backward); selective: each
    // layer's own, but send (read by no backward) and fch_gelu (recomputed)
    // in one buffer each
    int n_moe = recompute == RECOMPUTE_FULL ? 1 : Lm;
    if (recompute == RECOMPUTE_SELECTIVE) {
        m->send_shared = mem_alloc_floats(Nk * C, MEM_COMM);
        m->gelu_shared = mem_alloc_floats(R * H, MEM_ACTIVATIONS);
    }
    m->moe = xcalloc((size_t)n_moe, sizeof(MoeLayer));
    for (int i = 0; i < n_moe; i++) {
        MoeLayer* q = &m->moe[i];
        q->logits = mem_alloc_floats((size_t)N * E, MEM_ACTIVATIONS);
        q->probs = mem_alloc_floats((size_t)N * E, MEM_ACTIVATIONS);
        q->gates = mem_alloc_floats(Nk, MEM_ACTIVATIONS);
        q->idx = mem_alloc(Nk * sizeof(int), MEM_ACTIVATIONS);
        q->pos = mem_alloc(Nk * sizeof(int), MEM_ACTIVATIONS);
        q->send_src = mem_alloc(Nk * sizeof(int), MEM_ACTIVATIONS);
        q->perm = mem_alloc(R * sizeof(int), MEM_ACTIVATIONS);
        q->inv_perm = mem_alloc(R * sizeof(int), MEM_ACTIVATIONS);
        q->send = m->send_shared ? m->send_shared : mem_alloc_floats(Nk * C, MEM_COMM);
        q->back = mem_alloc_floats(Nk * C, MEM_COMM);
        q->exp_in = mem_alloc_floats(R * C, MEM_ACTIVATIONS);
        q->fch = mem_alloc_floats(R * H, MEM_ACTIVATIONS);
        q->fch_gelu = m->gelu_shared ? m->gelu_shared : mem_alloc_floats(R * H, MEM_ACTIVATIONS);
        q->aux_dprobs = mem_alloc_floats((size_t)E, MEM_ACTIVATIONS);
        q->idx_host = xmalloc(Nk * sizeof(int));
        q->pos_host = xmalloc(Nk * sizeof(int));
        q->src_host = xmalloc(Nk * sizeof(int));
        q->perm_host = xmalloc(R * sizeof(int));
        q->cnt_send = xmalloc((size_t)E * sizeof(int));
        q->cnt_recv = xmalloc((size_t)E * sizeof(int));  // ep x E/ep
        q->expert_off = xmalloc((size_t)(m->E_local + 1) * sizeof(int));
        q->sc = xmalloc((size_t)m->ep * sizeof(size_t));
        q->sd = xmalloc((size_t)m->ep * sizeof(size_t));
        q->rc = xmalloc((size_t)m->ep * sizeof(size_t));
        q->rd = xmalloc((size_t)m->ep * sizeof(size_t));
    }
    m->recv = mem_alloc_floats(R * C, MEM_COMM);
    m->xbuf = mem_alloc_floats(R * C, MEM_ACTIVATIONS);
    m->ybuf = mem_alloc_floats(R * C, MEM_ACTIVATIONS);
    m->dfch = mem_alloc_floats(R * H, MEM_ACTIVATIONS);
    m->dfch_gelu = mem_alloc_floats(R * H, MEM_ACTIVATIONS);
    m->dsend = mem_alloc_floats(Nk * C, MEM_COMM);
    m->dgates = mem_alloc_floats(Nk, MEM_ACTIVATIONS);
    m->dlogits = mem_alloc_floats((size_t)N * E, MEM_ACTIVATIONS);
    m->dln2 = mem_alloc_floats((size_t)N * C, MEM_ACTIVATIONS);
    m->routed = xcalloc((size_t)Lm * E, sizeof(long));
}

static void model_free(ExpertModel* m) {
    float* dev[] = {m->shared, m->dshared, m->m_s, m->v_s, m->experts, m->dexperts, m->m_e, m->v_e,
                    m->recv, m->xbuf, m->ybuf, m->dfch, m->dfch_gelu, m->dsend, m->dgates, m->dlogits, m->dln2,
                    m->send_shared, m->gelu_shared};
    for (size_t i = 0; i < sizeof(dev) / sizeof(dev[0]); i++) mem_free(dev[i]);
    gpt_acts_free(&m->acts);
    int n_moe = m->recompute == RECOMPUTE_FULL ? 1 : moe_num_moe_layers(&m->cfg);
    for (int i = 0; i < n_moe; i++) {
        MoeLayer* q = &m->moe[i];
        float* f[] = {q->logits, q->probs, q->gates, m->send_shared ? NULL : q->send, q->back, q->exp_in, q->fch,
                      m->gelu_shared ? NULL : q->fch_gelu, q->aux_dprobs};
        for (size_t j = 0; j < sizeof(f) / sizeof(f[0]); j++) mem_free(f[j]);
        int* d[] = {q->idx, q->pos, q->send_src, q->perm, q->inv_perm};
        for (size_t j = 0; j < sizeof(d) / sizeof(d[0]); j++) mem_free(d[j]);
        void* h[] = {q->idx_host, q->pos_host, q->src_host, q->perm_host, q->cnt_send, q->cnt_recv,
                     q->expert_off, q->sc, q->sd, q->rc, q->rd};
        for (size_t j = 0; j < sizeof(h) / sizeof(h[0]); j++) free(h[j]);
    }
    free(m->moe);
    free(m->routed);
    comm_destroy_group(&m->dpep);
}

static float forward_for_val(void* ctx, const int* inputs, const int* targets) {
    ExpertModel* m = ctx;
    m->record = 0;
    float loss = model_forward(m, inputs, targets);
    m->record = 1;
    return loss;
}

// ---------------------------------------------------------------- the MoE file

// --model FILE: chapter 7 reads its own file (moe.h); a dense llm.c file
// is refused there, with the reason.
static MoeConfig file_cfg;
static const char* read_moe_config(const char* path, GPTConfig* cfg, char* msg, size_t len) {
    const char* bad = moe_checkpoint_read_config(path, &file_cfg, msg, len);
    if (!bad) *cfg = file_cfg.gpt;
    return bad;
}

// --save FILE: rank 0 writes the replicated parameters and every expert,
// gathered over ep (dp rank 0's ep group; every dp replica holds the same
// experts). A host-side copy for the file, not part of training.
static void save_model(ExpertModel* m, const char* path) {
    int Lm = moe_num_moe_layers(&m->cfg), E = m->cfg.experts, El = m->E_local;
    size_t ne = moe_expert_numel(&m->cfg);
    float* all = NULL;
    if (m->dp->rank == 0) {
        // all ep ranks' buffers, rank after rank, then reordered to
        // [layer][expert] (each rank holds [layer][its experts])
        float* gathered = m->epc->rank == 0 ? mem_alloc_floats(m->n_experts * m->ep, MEM_OTHER) : NULL;
        comm_gather(m->epc, m->experts, gathered, m->n_experts, 0);
        if (m->epc->rank == 0) {
            float* host = xmalloc(m->n_experts * m->ep * sizeof(float));
            mem_to_host(host, gathered, m->n_experts * m->ep * sizeof(float));
            all = xmalloc((size_t)Lm * E * ne * sizeof(float));
            for (int r = 0; r < m->ep; r++)
                for (int l = 0; l < Lm; l++)
                    memcpy(all + ((size_t)l * E + (size_t)r * El) * ne, host + (size_t)r * m->n_experts + (size_t)l * El * ne,
                           (size_t)El * ne * sizeof(float));
            free(host);
        }
        mem_free(gathered);
    }
    char msg[1024];
    const char* bad = NULL;
    if (m->world->rank == 0) {
        float* shared = xmalloc(m->n_shared * sizeof(float));
        mem_to_host(shared, m->shared, m->n_shared * sizeof(float));
        bad = moe_checkpoint_write(path, &m->cfg, shared, all, msg, sizeof(msg));
        free(shared);
        if (!bad) printf("saved %s (mixture of experts, version %d)\n", path, MOE_CHECKPOINT_VERSION);
    }
    free(all);
    fail_if_any(bad != NULL, bad);
}

// ---------------------------------------------------------------- training-state checkpoints

// What this rank writes and reads of the training state (ckpt.h), in the
// MoE model's own tensors (moe.h: the router and the experts have global
// shapes of their own). Who writes what, so that nothing is written twice:
//   - the experts, with their AdamW moments, exist once per dp replica, on
//     the ep rank that holds them: dp replica 0 writes them, each ep rank
//     its own E/ep experts;
//   - the replicated parameters and moments are the same on all dp x ep
//     ranks: dp replica 0's ep ranks write 1/ep of the flat buffer each, so
//     the write is spread over as many ranks (and files) as the experts';
//     the other replicas write nothing.
// Every rank reads all the replicated state and its own experts. The slices
// are global (experts [e0, e0 + E/ep) of every MoE layer), so a checkpoint
// saved on one dp x ep mesh resumes on any other.
static CkptTensor ckpt_table[MOE_CKPT_TENSORS];

static void model_ckpt(Ckpt* ck, ExpertModel* m) {
    char variant[256];
    moe_ckpt_tensors(&m->cfg, ckpt_table);
    moe_ckpt_variant(&m->cfg, variant, sizeof(variant));
    ckpt_set_model(ck, ckpt_table, MOE_CKPT_TENSORS, variant);
    float* shared[CKPT_NUM_KINDS] = {m->shared, m->m_s, m->v_s};
    float* experts[CKPT_NUM_KINDS] = {m->experts, m->m_e, m->v_e};
    size_t per = (m->n_shared + m->ep - 1) / m->ep, lo = (size_t)m->epc->rank * per;
    if (lo > m->n_shared) lo = m->n_shared;
    size_t n = m->n_shared - lo < per ? m->n_shared - lo : per;
    for (int k = 0; k < CKPT_NUM_KINDS; k++) {
        if (m->dp->rank == 0) {
            moe_ckpt_add_shared(&ck->own, &m->cfg, (CkptKind)k, lo, n, shared[k] + lo);
            moe_ckpt_add_experts(&ck->own, &m->cfg, (CkptKind)k, m->e0, m->E_local, experts[k]);
        }
        moe_ckpt_add_shared(&ck->need, &m->cfg, (CkptKind)k, 0, m->n_shared, shared[k]);
        moe_ckpt_add_experts(&ck->need, &m->cfg, (CkptKind)k, m->e0, m->E_local, experts[k]);
    }
}

// ---------------------------------------------------------------- main

int main(int argc, char** argv) {
    int experts = 4, top_k = 2, hidden = 0, moe_every = 1;
    float aux_coef = 0.01f, capacity = 0.0f;
    ArgSpec extra[] = {
        {"experts", ARG_INT, &experts, "experts per MoE layer, E  [4]"},
        {"top-k", ARG_INT, &top_k, "experts per token, k  [2]"},
        {"expert-hidden", ARG_INT, &hidden, "each expert's MLP width, H  [4C]"},
        {"moe-every", ARG_INT, &moe_every, "every k-th layer is an MoE layer (layers k-1, 2k-1, ...)  [1]"},
        {"aux-coef", ARG_FLOAT, &aux_coef, "weight of the load-balancing loss in the objective  [0.01]"},
        {"capacity-factor", ARG_FLOAT, &capacity,
         "f > 0: each expert takes at most floor(f k tokens / E) slots per step, the rest are dropped  [0: dropless]"},
    };
    Run run;
    train_config_reader = read_moe_config;
    if (!run_start(&run, argc, argv, "build/chapter-7",
                   "Chapter 7: mixture of experts, experts sharded over ep: route, count, all-to-all-v\n"
                   "dispatch, experts, all-to-all-v combine; replicated gradients over dp x ep, experts over dp.",
                   extra, sizeof(extra) / sizeof(extra[0]), (1u << AXIS_DP) | (1u << AXIS_EP)))
        return 0;
    const TrainArgs* args = &run.args;
    const TrainSetup* setup = &run.setup;
    MoeConfig cfg = {.gpt = setup->cfg, .experts = experts, .top_k = top_k,
                     .hidden = hidden > 0 ? hidden : 4 * setup->cfg.channels, .moe_every = moe_every};
    if (setup->checkpoint) {
        // the file's experts, router and widths win over the flags
        cfg = file_cfg;
        print0("--model %s: E=%d, top-%d, H=%d, every %d layer%s MoE (from the file)\n", setup->checkpoint, cfg.experts,
               cfg.top_k, cfg.hidden, cfg.moe_every, cfg.moe_every == 1 ? "" : "s");
        experts = cfg.experts, top_k = cfg.top_k, moe_every = cfg.moe_every;
    }
    const char* bad = moe_config_problem(&cfg);
    if (bad) fail_all("%s", bad);
    if (hidden < 0) fail_all("--expert-hidden must be >= 1 (or 0 for 4C)");
    if (capacity < 0 || !isfinite(capacity)) fail_all("--capacity-factor must be >= 0 (0: dropless)");
    if (!(aux_coef >= 0) || !isfinite(aux_coef)) fail_all("--aux-coef must be >= 0");
    if (args->sample > 0)
        fail_all("--sample is not available in chapter 7: sampling runs chapter 0's dense model; use --save and your own reader");
    MeshNeeds needs = {.experts = experts};
    train_check_mesh(&run.mesh, setup, &needs);
    int ndp = run.mesh.size[AXIS_DP], nep = run.mesh.size[AXIS_EP], world = ndp * nep;
    int B = setup->B, T = setup->T;
    if (B % world != 0)
        fail_all("the batch of %d sequences does not split over dp x ep = %d ranks (every rank takes its own "
                 "sequences): use a --batch that is a multiple of %d", B, world, world);
    int per_rank = B / world;
    // my share of the batch: shares follow the world rank order (dp, then ep)
    int share = run.mesh.coord[AXIS_DP] * nep + run.mesh.coord[AXIS_EP];

    char msg[1024];
    ExpertModel model;
    model_create(&model, &cfg, per_rank, T, &run.mesh, &run, (uint64_t)args->seed, (RecomputeMode)args->recompute);
    if (setup->checkpoint) {
        float* shared = xmalloc(model.n_shared * sizeof(float));
        float* mine = xmalloc((model.n_experts ? model.n_experts : 1) * sizeof(float));
        bad = moe_checkpoint_read(setup->checkpoint, &cfg, shared, mine, model.e0, model.E_local, msg, sizeof(msg));
        fail_if_any(bad != NULL, bad);
        mem_to_device(model.shared, shared, model.n_shared * sizeof(float));
        mem_to_device(model.experts, mine, model.n_experts * sizeof(float));
        free(shared);
        free(mine);
    }
    model.aux_coef = aux_coef;
    model.capacity_factor = capacity;
    model.record = 1;
    int Lm = moe_num_moe_layers(&cfg);
    size_t total_params = model.n_shared + (size_t)Lm * experts * moe_expert_numel(&cfg);
    print0("chapter 7: experts, dp=%d x ep=%d, %d expert%s (%d per rank), top-%d, H=%d, %d of %d layers MoE, %s, device %s\n",
           ndp, nep, experts, experts == 1 ? "" : "s", model.E_local, top_k, cfg.hidden, Lm, cfg.gpt.num_layers,
           capacity > 0 ? "capacity mode" : "dropless", run.device);
    print0("model %s: %zu parameters (%zu replicated, %zu in experts), %zu active per token; global batch %d x %d, %d per rank\n",
           setup->model_name, total_params, model.n_shared, total_params - model.n_shared, moe_active_params(&cfg), B, T,
           per_rank);
    // --ckpt-dir, --save-every, --resume: this rank's slices, from whatever mesh saved them
    Ckpt ck;
    ckpt_init(&ck, args, setup, &run.mesh, 7);
    model_ckpt(&ck, &model);
    int start = ckpt_resume(&ck);
    JsonLog log;
    int *inputs, *targets;  // this rank's sequences of a step, (per_rank, T) each
    train_loop_open(&log, &inputs, &targets, args, per_rank, T);
    StepClock clock = {0};
    float loss = 0.0f;
    long dropped_total = 0;
    comm_counts_reset();
    size_t ex_len = 64 + (size_t)Lm * experts * 24;
    char* ex = xmalloc(ex_len);
    for (int step = start; step < args->steps; step++) {
        clock_begin(&clock);
        data_batch(&setup->train, step, B, T, share * per_rank, per_rank, inputs, targets);
        float my_loss = model_forward(&model, inputs, targets);
        mem_zero(model.dshared, model.n_shared * sizeof(float));
        mem_zero(model.dexperts, model.n_experts * sizeof(float));
        model_backward(&model);
        reduce_gradients(&model);
        float norm = clip_and_step(&model, args, step);
        // the language-model loss of the global batch (a host scalar: plain MPI)
        loss = (float)train_mean(&model.dpep, my_loss);
        double dt = clock_end(&clock, step - start, args->steps - start);
        dropped_total += model.dropped;
        // the step record: "loss" is the LM loss; the load-balancing loss, the
        // dropped slots and the slots routed to each expert per MoE layer
        // (over the global batch) in their own fields
        int n = snprintf(ex, ex_len, "\"aux_loss\":%.7f,\"dropped\":%ld,\"expert_tokens\":[", model.aux, model.dropped);
        for (int i = 0; i < Lm; i++) {
            n += snprintf(ex + n, ex_len - n, "%s[", i ? "," : "");
            for (int e = 0; e < experts; e++)
                n += snprintf(ex + n, ex_len - n, "%s%ld", e ? "," : "", model.routed[(size_t)i * experts + e]);
            n += snprintf(ex + n, ex_len - n, "]");
        }
        snprintf(ex + n, ex_len - n, "]");
        report_step_extra(&log, step, args->steps, loss, norm, 1e3 * dt, (double)B * T / dt, ex);
        if (args->val_every > 0 && (step + 1) % args->val_every == 0 && step + 1 < args->steps) {
            float v = train_val_loss_with(setup, args->val_batches, forward_for_val, &model, share * per_rank, per_rank,
                                          per_rank, &model.dpep);
            if (v >= 0) report_val(&log, step, v);
        }
        ckpt_after_step(&ck, step);  // --save-every, --ckpt-dir
    }
    ckpt_finish(&ck, &log);  // an async save still in flight is joined here
    free(ex);
    int trained = args->steps - start;  // the steps this run trained
    // the all-to-all traffic of training alone (validation below adds its own)
    // A rank sends its N k token-slots in dispatch and, in combine, what its
    // experts received: this varies by rank, the mean over the ranks is
    // N k C floats per exchange (a host figure for the log: plain MPI)
    CommCount a2a = comm_count(COLL_ALLTOALL, AXIS_EP);
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &a2a.bytes, 1, MPI_DOUBLE, MPI_SUM, model.dpep.mpi));
    a2a.bytes /= model.dpep.size;
    float val_loss = train_val_loss_with(setup, args->val_batches, forward_for_val, &model, share * per_rank, per_rank,
                                         per_rank, &model.dpep);
    if (val_loss >= 0) report_val(&log, args->steps - 1, val_loss);
    double ms = clock_ms_per_step(&clock);
    print0("dispatch and combine: %.0f bytes sent per rank per step in all-to-all-v (mean over ranks), %ld token-slots dropped\n",
           trained > 0 ? a2a.bytes / trained : 0.0, dropped_total);
    char extra_json[512];
    snprintf(extra_json, sizeof(extra_json),
             "\"experts\":%d,\"top_k\":%d,\"expert_hidden\":%d,\"moe_every\":%d,\"aux_coef\":%g,\"capacity_factor\":%g,"
             "\"active_params\":%zu,\"alltoall_bytes_per_step\":%.0f,\"dropped_total\":%ld",
             experts, top_k, cfg.hidden, moe_every, aux_coef, capacity, moe_active_params(&cfg),
             trained > 0 ? a2a.bytes / trained : 0.0, dropped_total);
    RunSummary summary = {
        .chapter = 7, .model = setup->model_name, .num_params = total_params, .batch = B, .seq = T,
        .steps = args->steps, .ms_per_step = ms, .tokens_per_s = ms > 0 ? (double)B * T / (ms / 1e3) : 0.0,
        .flops_per_token = moe_flops_per_token(&cfg, T), .peak_gflops = run.peak_gflops,
        .final_loss = loss, .val_loss = val_loss, .extra_json = extra_json};
    report_summary(&log, &run.mesh, &summary);
    train_loop_close(&log, inputs, targets);
    if (args->save) save_model(&model, args->save);
    model_free(&model);
    run_finish(&run);
    return 0;
}
