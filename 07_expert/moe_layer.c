// moe_layer.c: the MoE layer over ep ranks (moe_layer.h), in the order a
// step runs it: the routing's global statistics, the capacity, the plan of
// the exchanges, the experts on their rows, the layer forward and backward
// with every all-to-all in sight; then the set-up and the step's figures.
#include "moe_layer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "errors.h"
#include "exercise.h"  // exercise_not_done, in a homework tree
#include "init.h"      // counter_hash: the routing signature
#include "memory.h"
#include "ops.h"
#include "rank.h"
#include "runtime.h"
#include "trace.h"

// ---------------------------------------------------------------- 2. count: over the global batch

// The load-balancing loss (Switch / GShard) of one MoE layer, over the
// GLOBAL batch so that every mesh trains the same objective: f_e = share of
// the token-slots routed to e, P_e = mean router prob of e,
// aux = E sum_e f_e P_e (1 when balanced). Writes d (aux_coef aux) / d each
// prob into L->aux_dprobs (one value per expert) and, in a training step,
// adds aux to X->aux and writes this step's slots per expert to X->routed[mi].
static void balance_loss(MoeParallel* X, MoeLayer* L, int mi) {
    // EXERCISE 1: the load-balancing loss over the global batch (the sums over the batch group) and its gradient per prob, scaled for the mean over the group
    int N = X->N, k = X->cfg.top_k, E = X->cfg.experts;
    long* cnt = xmalloc((size_t)E * sizeof(long));
    double* psum = xmalloc((size_t)E * sizeof(double));
    float* aux_host = X->aux_host;  // (E) a staging buffer (memory.h), as probs_host (N, E), which plan_dispatch fills
    for (int e = 0; e < E; e++) cnt[e] = 0, psum[e] = 0.0;
    for (int i = 0; i < N * k; i++) cnt[L->idx_host[i]]++;
    for (int t = 0; t < N; t++)
        for (int e = 0; e < E; e++) psum[e] += X->probs_host[(size_t)t * E + e];
    // both sums over every token of the batch: over the batch group (host data: plain MPI)
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, cnt, E, MPI_LONG, MPI_SUM, X->batch->mpi));
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, psum, E, MPI_DOUBLE, MPI_SUM, X->batch->mpi));
    double n_global = (double)N * X->batch->size, aux = 0.0;
    for (int e = 0; e < E; e++) {
        double f = (double)cnt[e] / (n_global * k), P = psum[e] / n_global;
        aux += E * f * P;
        // d (coef * aux) / d prob[t, e] = coef E f_e / N_global for every
        // token; this rank's gradient is averaged over the batch group later
        // (x 1 / its size), so it carries size x that: coef E f_e / N
        aux_host[e] = (float)(X->aux_coef * E * f / N);
        if (X->record) X->routed[(size_t)mi * E + e] = cnt[e];
    }
    mem_to_device_queued(L->aux_dprobs, aux_host, (size_t)E * sizeof(float));  // no wait: plan_dispatch says why
    if (X->record) X->aux += aux;
    free(psum), free(cnt);
    // END EXERCISE 1
}

// Capacity mode: each expert keeps at most floor(f k N_global / E) slots, the
// first in the global batch's order (block, position, slot, as on one rank);
// the rest add nothing, the other gates kept (f = 0: dropless). L->pos_host[i] = 0
// keeps slot i (token i / k, its (i % k)-th choice), -1 drops it;
// L->cnt_send[e] = my kept slots of e. Returns the slots dropped, globally.
static long plan_capacity(MoeParallel* X, MoeLayer* L) {
    // EXERCISE 2: capacity: keep the first slots of each expert in the order of the global batch, drop the rest, count them
    int N = X->N, k = X->cfg.top_k, E = X->cfg.experts, n_blocks = X->n_blocks;
    const int* blk = X->row_block;  // my rows' blocks of the batch, in the batch's order
    long cap = X->capacity_factor > 0 ? (long)(X->capacity_factor * k * (double)N * X->batch->size / E) : -1;
    long dropped = 0;
    // every block's slots per expert (mine, the rest 0) summed over the batch
    // group, then an exclusive scan in batch order: the slots to e before each block
    long* cnt = xcalloc((size_t)n_blocks * E, sizeof(long));
    for (int i = 0; i < N * k; i++) cnt[(size_t)blk[i / k] * E + L->idx_host[i]]++;
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, cnt, n_blocks * E, MPI_LONG, MPI_SUM, X->batch->mpi));
    for (int e = 0; e < E; e++)
        for (long g = 0, before = 0, c; g < n_blocks; g++) c = cnt[g * E + e], cnt[g * E + e] = before, before += c;
    for (int e = 0; e < E; e++) L->cnt_send[e] = 0;
    for (int i = 0; i < N * k; i++) {
        int e = L->idx_host[i];
        if (cap >= 0 && cnt[(size_t)blk[i / k] * E + e]++ >= cap) {
            L->pos_host[i] = -1;
            dropped++;
        } else {
            L->pos_host[i] = 0;
            L->cnt_send[e]++;
        }
    }
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &dropped, 1, MPI_LONG, MPI_SUM, X->batch->mpi));
    free(cnt);
    return dropped;
    // END EXERCISE 2
}

// The send order from the kept slots (L->pos_host >= 0) and their experts
// (L->idx_host): per chunk and expert the slots kept (cnt_chunk), each
// chunk's first send row (send_row, n_send), every kept slot's row
// (pos_host) and every row's token (src_host).
static void plan_send_order(MoeParallel* X, MoeLayer* L) {
    int k = X->cfg.top_k, E = X->cfg.experts, nc = X->chunks;
    // send row i is token src_host[i]; slot j of token t goes to row
    // pos_host[t k + j] (kept slots only: pos_host < 0 is a dropped one)
    memset(L->cnt_chunk, 0, (size_t)nc * E * sizeof(int));
    for (int c = 0; c < nc; c++)
        for (int i = moe_chunk_start(X, c) * k; i < moe_chunk_start(X, c + 1) * k; i++)
            if (L->pos_host[i] >= 0) L->cnt_chunk[c * E + L->idx_host[i]]++;
    int* fill = xmalloc((size_t)nc * E * sizeof(int));
    for (int i = 0, row = 0; i < nc * E; i++) {
        if (i % E == 0) L->send_row[i / E] = row;
        fill[i] = row, row += L->cnt_chunk[i];
    }
    L->n_send = L->send_row[nc] = fill[nc * E - 1] + L->cnt_chunk[nc * E - 1];
    for (int c = 0; c < nc; c++)
        for (int i = moe_chunk_start(X, c) * k; i < moe_chunk_start(X, c + 1) * k; i++) {
            if (L->pos_host[i] < 0) continue;
            int row = fill[c * E + L->idx_host[i]]++;
            L->pos_host[i] = row;
            L->src_host[row] = i / k;
        }
    free(fill);
}

// The exchanges' plan, chunk by chunk (moe_layer.h names the orders), from
// my kept slots per chunk and expert (L->cnt_chunk; experts in destination
// order: rank r holds experts [r E/ep, (r+1) E/ep)): exchange the counts,
// then the floats sent to and received from each ep rank in each chunk and
// where they sit (sc, sd, rc, rd), L->n_recv, and where each block (chunk,
// source, my expert) sits in the receive order and the experts'.
static void plan_exchange(MoeParallel* X, MoeLayer* L) {
    // EXERCISE 3: the exchange plan: the counts' all-to-all, the all-to-all-v counts and offsets, the received rows grouped by expert
    int El = X->E_local, ep = X->ep, C = X->cfg.gpt.channels, E = X->cfg.experts, nc = X->chunks;
    // rank s learns how many rows of each of my experts it will receive
    // from me in each chunk (an all-to-all of n E/ep ints per pair; integers:
    // plain MPI), so my counts go out destination-major
    int* out = xmalloc((size_t)nc * E * sizeof(int));
    for (int r = 0; r < ep; r++)
        for (int c = 0; c < nc; c++)
            for (int le = 0; le < El; le++) out[(r * nc + c) * El + le] = L->cnt_chunk[c * E + r * El + le];
    MPI_CHECK(MPI_Alltoall(out, nc * El, MPI_INT, L->cnt_recv, nc * El, MPI_INT, X->epc->mpi));
    free(out);
    size_t so = 0, ro = 0;
    for (int c = 0; c < nc; c++)
        for (int r = 0, i = c * ep; r < ep; r++, i++) {
            size_t s_rows = 0, r_rows = 0;
            for (int le = 0; le < El; le++) {
                s_rows += (size_t)L->cnt_chunk[c * E + r * El + le];
                r_rows += (size_t)L->cnt_recv[(r * nc + c) * El + le];
            }
            L->sc[i] = s_rows * C, L->sd[i] = so, so += s_rows * C;
            L->rc[i] = r_rows * C, L->rd[i] = ro, ro += r_rows * C;
        }
    L->n_recv = (int)(ro / C);
    // received rows come by (chunk, source, expert); the experts want them
    // by (expert, source, chunk): each block's first row in both orders
    for (int c = 0, row = 0; c < nc; c++)
        for (int s = 0; s < ep; s++)
            for (int le = 0; le < El; le++) L->blk_recv[(c * ep + s) * El + le] = row, row += L->cnt_recv[(s * nc + c) * El + le];
    int row = 0;
    for (int le = 0; le < El; le++) {
        L->expert_off[le] = row;
        for (int s = 0; s < ep; s++)
            for (int c = 0; c < nc; c++) L->blk_row[(c * ep + s) * El + le] = row, row += L->cnt_recv[(s * nc + c) * El + le];
    }
    L->expert_off[El] = row;
    // END EXERCISE 3
}

// From the router's choices, the plan of the exchanges. Integer data:
// counts and indices go through the host by plain MPI, never through the
// float collectives of the comm layer. One wait for the device (docs/cuda.md):
// the all-to-all-v's sizes must reach the host. The probs ride along, the plan
// goes back queued (staging written again only after the next layer's wait here).
static void plan_dispatch(MoeParallel* X, MoeLayer* L) {
    int N = X->N, k = X->cfg.top_k;
    mem_to_host_queued(X->probs_host, L->probs, (size_t)N * X->cfg.experts * sizeof(float));
    mem_to_host(L->idx_host, L->idx, (size_t)N * k * sizeof(int));
    long dropped = plan_capacity(X, L);
    if (X->record) X->dropped += dropped;
    // kept slots sorted by chunk, then expert (so destination rank), stable
    // in token order; per chunk and expert, how many (L->cnt_chunk)
    plan_send_order(X, L);
    plan_exchange(X, L);
    mem_to_device_queued(L->pos, L->pos_host, (size_t)N * k * sizeof(int));
    mem_to_device_queued(L->send_src, L->src_host, (size_t)L->n_send * sizeof(int));
}

// Layer l's (of the whole model) token-slots into X->routing, kept or not.
static void routing_signature(MoeParallel* X, const MoeLayer* L, int l) {
    int k = X->cfg.top_k, len = X->block_len;
    for (int i = 0; i < X->N * k; i++) {
        int t = i / k;
        size_t token = X->token0 + (size_t)X->row_block[t] * len + t % len;
        X->routing += counter_hash(0, 2 * L->idx_host[i] + (L->pos_host[i] >= 0), l, token);  // init.h's
    }
}

// ---------------------------------------------------------------- the exchanges and the experts

// A non-blocking all-to-all-v over ep (request i), and its wait. Blocked:
// the wait itself. In flight: from the start to the end of the wait, as
// chapter 3 times its prefetched gathers; the share of that time the rank
// computed instead of waiting is what the overlap hid. Both are spans on
// the device's clock (MoeParallel says why).
static void a2a_start(MoeParallel* X, int i, const float* send, const size_t* sc, const size_t* sd, float* recv,
                      const size_t* rc, const size_t* rd) {
    device_clock_start(&X->a2a_flight[i]);
    comm_ialltoallv(X->epc, send, sc, sd, recv, rc, rd, &X->a2a[i]);
}

static void a2a_wait(MoeParallel* X, int i) {
    comm_wait_clock_begin(&X->a2a_blocked_clock);
    comm_wait(&X->a2a[i]);
    comm_wait_clock_end(&X->a2a_blocked_clock);
    device_clock_stop(&X->a2a_flight[i]);
}

// Block (chunk c, source s, expert le): n rows, at q in the receive order
// and r in the experts' order.
typedef struct {
    int n;
    size_t q, r;
} Block;

static Block block_of(const MoeParallel* X, const MoeLayer* L, int c, int s, int le) {
    int b = (c * X->ep + s) * X->E_local + le;
    return (Block){L->cnt_recv[(s * X->chunks + c) * X->E_local + le], (size_t)L->blk_recv[b], (size_t)L->blk_row[b]};
}

// The experts on chunk c, block by block (source, expert): each block's
// received rows (X->recv, receive order) copied into exp_in in the experts'
// order, its fch and fch_gelu kept there, its outputs into X->xbuf in the
// receive order (what the combine sends back). Rows are independent (the
// row-by-row products of ops.h): chunk by chunk is the same bits as at once.
static void experts_forward(MoeParallel* X, MoeLayer* L, int l, int c, float* experts) {
    int C = X->cfg.gpt.channels, H = X->cfg.hidden;
    double t0 = trace_start();
    for (int le = 0; le < X->E_local; le++) {
        ExpertParams p = moe_expert_at(&X->cfg, experts, 0, le, X->E_local);
        for (int s = 0; s < X->ep; s++) {
            Block b = block_of(X, L, c, s, le);
            ops_copy(L->exp_in + b.r * C, X->recv + b.q * C, (size_t)b.n * C);
            moe_expert_forward(&p, X->xbuf + b.q * C, L->fch + b.r * H, L->fch_gelu + b.r * H, L->exp_in + b.r * C,
                               b.n, C, H);
        }
    }
    trace_compute(t0, "block %d experts chunk %d", X->cfg.first_layer + l, c);
}

// Backward's input half on chunk c: the row gradients (X->recv) copied into
// X->xbuf in the experts' order (kept for the weights), d of the inputs into
// X->ybuf in the receive order, dfch kept in X->dfch.
static void experts_backward_input(MoeParallel* X, MoeLayer* L, int l, int c, float* experts) {
    int C = X->cfg.gpt.channels, H = X->cfg.hidden;
    double t0 = trace_start();
    for (int le = 0; le < X->E_local; le++) {
        ExpertParams p = moe_expert_at(&X->cfg, experts, 0, le, X->E_local);
        for (int s = 0; s < X->ep; s++) {
            Block b = block_of(X, L, c, s, le);
            ops_copy(X->xbuf + b.r * C, X->recv + b.q * C, (size_t)b.n * C);
            ops_zero(X->ybuf + b.q * C, (size_t)b.n * C);
            moe_expert_backward_input(&p, X->ybuf + b.q * C, X->xbuf + b.r * C, L->fch + b.r * H, X->dfch + b.r * H,
                                      X->dfch_gelu + b.r * H, b.n, C, H);
        }
    }
    trace_compute(t0, "block %d experts chunk %d backward", X->cfg.first_layer + l, c);
}

// Layer l's weight gradient: at once, or handed to X->wgrad (model.h's
// weight_grad; the capstone's zero-bubble W).
static void layer_weight_grad(MoeParallel* X, int l, float* dw, float* db, const float* dout, const float* inp, int N,
                              int C, int OC) {
    if (N == 0) return;  // an expert that received no row
    WeightGradHook h = X->wgrad;
    h.layer = X->cfg.first_layer + l;  // the model's layer: the W span's name
    weight_grad(&h, dw, db, dout, inp, N, C, OC);
}

// The weight half: each expert over all its rows, in the experts' order
// (the order n = 1 gives for any n: the same bits).
static void experts_backward_weights(MoeParallel* X, MoeLayer* L, int l, float* dexperts) {
    int C = X->cfg.gpt.channels, H = X->cfg.hidden;
    double t0 = trace_start();
    for (int le = 0; le < X->E_local; le++) {
        ExpertParams g = moe_expert_at(&X->cfg, dexperts, 0, le, X->E_local);
        size_t r0 = (size_t)L->expert_off[le];
        int n = L->expert_off[le + 1] - L->expert_off[le];
        layer_weight_grad(X, l, g.fcprojw, g.fcprojb, X->xbuf + r0 * C, L->fch_gelu + r0 * H, n, H, C);
        layer_weight_grad(X, l, g.fcw, g.fcb, X->dfch + r0 * H, L->exp_in + r0 * C, n, C, H);
    }
    trace_compute(t0, "block %d experts weights", X->cfg.first_layer + l);
}

// ---------------------------------------------------------------- the layer, in chunks
// --ep-overlap n cuts each exchange into n chunks of the layer's tokens, so
// that the experts work on one chunk while the next one travels:
//
//   in flight  dispatch 0 | dispatch 1 | dispatch 2, combine 0 | ... | combine n-1
//   experts               | chunk 0    | chunk 1               | ... |
//
// The first dispatch and the last combine have nothing to hide behind. Every
// row meets the same ops whatever n and the experts keep their rows in n =
// 1's order: the same bits.

int moe_chunk_start(const MoeParallel* X, int c) { return (int)((long)c * X->N / X->chunks); }

// Chunk c's rows of the dispatch: my rows to every ep rank, then the start.
static void dispatch_start(MoeParallel* X, MoeLayer* L, const float* ln2, int c) {
    int C = X->cfg.gpt.channels, r0 = L->send_row[c], ep = X->ep;
    moe_gather_forward(L->send + (size_t)r0 * C, ln2, L->send_src + r0, L->send_row[c + 1] - r0, C);
    a2a_start(X, c, L->send, L->sc + c * ep, L->sd + c * ep, X->recv, L->rc + c * ep, L->rd + c * ep);
}

void moe_layer_forward(MoeParallel* X, MoeLayer* L, int l, const float* ln2, const float* router, float* experts,
                       float* out) {
    int N = X->N, C = X->cfg.gpt.channels, E = X->cfg.experts, k = X->cfg.top_k, nc = X->chunks, ep = X->ep;
    // 1. route: logits (N, E) = ln2 @ router^T, softmax, top-k, gates
    matmul_forward(L->logits, ln2, router, NULL, N, C, E);
    moe_router_forward(L->probs, L->idx, L->gates, L->logits, N, E, k);
    // 2. count and exchange the counts
    plan_dispatch(X, L);
    if (X->record) routing_signature(X, L, X->cfg.first_layer + l);
    // 3-5, chunk by chunk: while chunk i's experts run, chunk i+1's rows
    // travel to their experts and chunk i-1's outputs travel home
    dispatch_start(X, L, ln2, 0);
    balance_loss(X, L, moe_layer_index(&X->cfg, l));  // while chunk 0 travels: backward is the first to use it
    for (int i = 0; i < nc; i++) {
        a2a_wait(X, i);  // 3. dispatch: chunk i's rows are here
        if (i + 1 < nc) dispatch_start(X, L, ln2, i + 1);
        experts_forward(X, L, l, i, experts);  // 4. experts
        // 5. combine: the outputs back, the reverse all-to-all-v
        a2a_start(X, nc + i, X->xbuf, L->rc + i * ep, L->rd + i * ep, L->back, L->sc + i * ep, L->sd + i * ep);
        if (i > 0) a2a_wait(X, nc + i - 1);
    }
    a2a_wait(X, 2 * nc - 1);
    // each token's k outputs summed with its gates
    moe_combine_forward(out, L->back, L->gates, L->pos, N, k, C);
}

void moe_layer_recompute(MoeParallel* X, MoeLayer* L) {
    gelu_forward(L->fch_gelu, L->fch, (size_t)L->n_recv * X->cfg.hidden);
}

void moe_layer_backward(MoeParallel* X, MoeLayer* L, int l, const float* dout, const float* ln2, const float* router,
                        float* drouter, float* experts, float* dexperts, float* dln2) {
    int N = X->N, C = X->cfg.gpt.channels, E = X->cfg.experts, k = X->cfg.top_k, nc = X->chunks, ep = X->ep;
    // combine, backwards: d of each returned row, and of each gate
    ops_zero(X->dsend, (size_t)N * k * C);
    ops_zero(X->dgates, (size_t)N * k);
    moe_combine_backward(X->dsend, X->dgates, dout, L->back, L->gates, L->pos, N, k, C);
    // the combine's exchange reversed: the rows' gradients go to the experts
    a2a_start(X, 0, X->dsend, L->sc, L->sd, X->recv, L->rc, L->rd);
    // meanwhile the router, backwards (through the gates and the
    // load-balancing loss), and its weight gradient
    ops_zero(X->dlogits, (size_t)N * E);
    moe_router_backward(X->dlogits, X->dgates, L->aux_dprobs, L->probs, L->idx, L->gates, N, E, k);
    layer_weight_grad(X, l, drouter, NULL, X->dlogits, ln2, N, C, E);
    for (int i = 0; i < nc; i++) {
        a2a_wait(X, i);
        if (i + 1 < nc)
            a2a_start(X, i + 1, X->dsend, L->sc + (i + 1) * ep, L->sd + (i + 1) * ep, X->recv, L->rc + (i + 1) * ep,
                      L->rd + (i + 1) * ep);
        experts_backward_input(X, L, l, i, experts);
        // the dispatch's exchange reversed: d of my rows comes home
        a2a_start(X, nc + i, X->ybuf, L->rc + i * ep, L->rd + i * ep, X->dsend, L->sc + i * ep, L->sd + i * ep);
        if (i > 0) a2a_wait(X, nc + i - 1);
    }
    // the experts' weight gradients, over all their rows in the experts'
    // order (one order whatever n: the same bits), while the last chunk
    // travels home
    experts_backward_weights(X, L, l, dexperts);
    a2a_wait(X, 2 * nc - 1);
    ops_zero(dln2, (size_t)N * C);
    moe_gather_backward(dln2, X->dsend, L->pos, N, k, C);
    matmul_backward(dln2, NULL, NULL, X->dlogits, NULL, router, N, C, E);
}

// ---------------------------------------------------------------- set-up

void moe_parallel_create(MoeParallel* X, const MoeSpec* s) {
    const MoeConfig* cfg = &s->cfg;
    memset(X, 0, sizeof(*X));
    X->cfg = *cfg;
    X->N = s->N, X->epc = s->epc, X->batch = s->batch, X->chunks = s->chunks;
    X->aux_coef = s->aux_coef, X->capacity_factor = s->capacity_factor, X->recompute = s->recompute;
    X->ep = s->epc->size;
    X->E_local = cfg->experts / X->ep;
    X->e0 = s->epc->rank * X->E_local;
    X->n_blocks = s->n_blocks, X->block_len = s->block_len;
    X->row_block = xmalloc((size_t)(s->N > 0 ? s->N : 1) * sizeof(int));
    memcpy(X->row_block, s->row_block, (size_t)s->N * sizeof(int));
    for (int t = 0; t < s->N; t++)  // MoeSpec: runs of block_len rows, one block each
        CHECK(s->block_len > 0 && s->N % s->block_len == 0 && s->row_block[t] == s->row_block[t - t % s->block_len],
              "row_block is not in runs of block_len rows");
    int N = X->N, C = cfg->gpt.channels, H = cfg->hidden, E = cfg->experts, k = cfg->top_k, nc = X->chunks;
    // dropless: my experts may receive every slot of every token of my ep
    // group that can choose them (a token picks an expert at most once)
    X->R = N * X->ep * (k < X->E_local ? k : X->E_local);
    size_t R = (size_t)X->R, Nk = (size_t)N * k;
    if (X->recompute == RECOMPUTE_SELECTIVE) {  // send (read by no backward) and fch_gelu (recomputed): one each
        X->send_shared = mem_alloc_floats(Nk * C, MEM_COMM);
        X->gelu_shared = mem_alloc_floats(R * H, MEM_ACTIVATIONS);
    }
    X->a2a = xcalloc((size_t)2 * nc, sizeof(CommRequest));
    X->a2a_flight = xcalloc((size_t)2 * nc, sizeof(DeviceClock));
    X->recv = mem_alloc_floats(R * C, MEM_COMM);
    X->xbuf = mem_alloc_floats(R * C, MEM_ACTIVATIONS);
    X->ybuf = mem_alloc_floats(R * C, MEM_ACTIVATIONS);
    X->dfch = mem_alloc_floats(R * H, MEM_ACTIVATIONS);
    X->dfch_gelu = mem_alloc_floats(R * H, MEM_ACTIVATIONS);
    X->dsend = mem_alloc_floats(Nk * C, MEM_COMM);
    X->dgates = mem_alloc_floats(Nk, MEM_ACTIVATIONS);
    X->dlogits = mem_alloc_floats((size_t)N * E, MEM_ACTIVATIONS);
    X->routed = xcalloc((size_t)moe_num_moe_layers(cfg) * E + 1, sizeof(long));
    X->probs_host = mem_alloc_host((size_t)N * E * sizeof(float));
    X->aux_host = mem_alloc_host((size_t)E * sizeof(float));
    X->record = 1;
}

MoeLayer* moe_layers_create(const MoeParallel* X, int n) {
    const MoeConfig* cfg = &X->cfg;
    int N = X->N, C = cfg->gpt.channels, H = cfg->hidden, E = cfg->experts, k = cfg->top_k, nc = X->chunks;
    size_t R = (size_t)X->R, Nk = (size_t)N * k;
    MoeLayer* layers = xcalloc((size_t)n, sizeof(MoeLayer));
    for (int i = 0; i < n; i++) {
        MoeLayer* q = &layers[i];
        q->logits = mem_alloc_floats((size_t)N * E, MEM_ACTIVATIONS);
        q->probs = mem_alloc_floats((size_t)N * E, MEM_ACTIVATIONS);
        q->gates = mem_alloc_floats(Nk, MEM_ACTIVATIONS);
        q->idx = mem_alloc(Nk * sizeof(int), MEM_ACTIVATIONS);
        q->pos = mem_alloc(Nk * sizeof(int), MEM_ACTIVATIONS);
        q->send_src = mem_alloc(Nk * sizeof(int), MEM_ACTIVATIONS);
        q->send = X->send_shared ? X->send_shared : mem_alloc_floats(Nk * C, MEM_COMM);
        q->back = mem_alloc_floats(Nk * C, MEM_COMM);
        q->exp_in = mem_alloc_floats(R * C, MEM_ACTIVATIONS);
        q->fch = mem_alloc_floats(R * H, MEM_ACTIVATIONS);
        q->fch_gelu = X->gelu_shared ? X->gelu_shared : mem_alloc_floats(R * H, MEM_ACTIVATIONS);
        q->aux_dprobs = mem_alloc_floats((size_t)E, MEM_ACTIVATIONS);
        q->idx_host = mem_alloc_host(Nk * sizeof(int));
        q->pos_host = mem_alloc_host(Nk * sizeof(int));
        q->src_host = mem_alloc_host(Nk * sizeof(int));
        q->cnt_send = xmalloc((size_t)E * sizeof(int));
        q->cnt_chunk = xmalloc((size_t)nc * E * sizeof(int));
        q->cnt_recv = xmalloc((size_t)nc * E * sizeof(int));  // ep x n x E/ep
        q->send_row = xmalloc((size_t)(nc + 1) * sizeof(int));
        q->blk_recv = xmalloc((size_t)nc * E * sizeof(int));
        q->blk_row = xmalloc((size_t)nc * E * sizeof(int));
        q->expert_off = xmalloc((size_t)(X->E_local + 1) * sizeof(int));
        q->sc = xmalloc((size_t)nc * X->ep * sizeof(size_t));
        q->sd = xmalloc((size_t)nc * X->ep * sizeof(size_t));
        q->rc = xmalloc((size_t)nc * X->ep * sizeof(size_t));
        q->rd = xmalloc((size_t)nc * X->ep * sizeof(size_t));
    }
    return layers;
}

void moe_layers_free(const MoeParallel* X, MoeLayer* layers, int n) {
    for (int i = 0; i < n; i++) {
        MoeLayer* q = &layers[i];
        float* f[] = {q->logits, q->probs, q->gates, X->send_shared ? NULL : q->send, q->back, q->exp_in, q->fch,
                      X->gelu_shared ? NULL : q->fch_gelu, q->aux_dprobs};
        for (size_t j = 0; j < sizeof(f) / sizeof(f[0]); j++) mem_free(f[j]);
        int* d[] = {q->idx, q->pos, q->send_src};
        for (size_t j = 0; j < sizeof(d) / sizeof(d[0]); j++) mem_free(d[j]);
        mem_free_host(q->idx_host), mem_free_host(q->pos_host), mem_free_host(q->src_host);
        void* h[] = {q->cnt_send, q->cnt_chunk, q->cnt_recv, q->send_row,
                     q->blk_recv, q->blk_row, q->expert_off, q->sc, q->sd, q->rc, q->rd};
        for (size_t j = 0; j < sizeof(h) / sizeof(h[0]); j++) free(h[j]);
    }
    free(layers);
}

void moe_parallel_free(MoeParallel* X) {
    float* dev[] = {X->recv, X->xbuf, X->ybuf, X->dfch, X->dfch_gelu, X->dsend, X->dgates, X->dlogits,
                    X->send_shared, X->gelu_shared};
    for (size_t i = 0; i < sizeof(dev) / sizeof(dev[0]); i++) mem_free(dev[i]);
    for (int i = 0; i < 2 * X->chunks; i++) device_clock_free(&X->a2a_flight[i]);
    device_clock_free(&X->a2a_blocked_clock);
    free(X->a2a), free(X->a2a_flight), free(X->routed), free(X->row_block);
    mem_free_host(X->probs_host), mem_free_host(X->aux_host);
}

// ---------------------------------------------------------------- the step's figures

// The exchanges' seconds blocked and in flight since the last read (the
// clocks' spans; reading waits for the last one's end on CUDA), and the
// clocks emptied.
static void a2a_clocks_read(MoeParallel* X, double* blocked, double* inflight) {
    *blocked = device_clock_seconds(&X->a2a_blocked_clock);
    device_clock_reset(&X->a2a_blocked_clock);
    *inflight = 0.0;
    for (int i = 0; i < 2 * X->chunks; i++) {
        *inflight += device_clock_seconds(&X->a2a_flight[i]);
        device_clock_reset(&X->a2a_flight[i]);
    }
}

// A step starts: the exchanges since the last step's record (validation's) are dropped.
void moe_step_begin(MoeParallel* X) {
    X->aux = 0.0, X->dropped = 0, X->routing = 0;
    a2a_clocks_read(X, &X->a2a_blocked_s, &X->a2a_inflight_s);
    X->a2a_blocked_s = X->a2a_inflight_s = 0.0;
}

void moe_step_record(MoeParallel* X, const TrainLoop* loop, int step, JsonBuf* fields) {
    X->dropped_total += X->dropped;
    a2a_clocks_read(X, &X->a2a_blocked_s, &X->a2a_inflight_s);  // after the step: its spans have ended
    if (train_loop_timed(loop, step)) {
        X->a2a_blocked_timed += X->a2a_blocked_s;
        X->a2a_inflight_timed += X->a2a_inflight_s;
    }
    if (!fields) return;
    json_add_double(fields, "aux_loss", X->aux, "%.7f");
    json_add_int(fields, "dropped", X->dropped);
    json_add_long_matrix(fields, "expert_tokens", X->routed, moe_num_moe_layers(&X->cfg), X->cfg.experts);
    json_add_hex64(fields, "routing", moe_step_routing(X));
}

uint64_t moe_step_routing(const MoeParallel* X) {
    uint64_t sum = X->routing;  // unsigned: the sum wraps mod 2^64 on every rank alike (host data: plain MPI)
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &sum, 1, MPI_UINT64_T, MPI_SUM, X->batch->mpi));
    return sum;
}

void moe_report(const MoeParallel* X, const Comm* over, const TrainLoop* loop, JsonBuf* extra) {
    int trained = loop->steps - loop->start, timed = loop->clock.timed;
    // the all-to-all traffic of training. A rank sends its N k token-slots
    // in dispatch and, in combine, what its experts received: this varies by
    // rank, the mean over the ranks is N k C floats per exchange (a host
    // figure for the log: plain MPI)
    CommCount a2a = comm_count(COLL_ALLTOALL, AXIS_EP);
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &a2a.bytes, 1, MPI_DOUBLE, MPI_SUM, over->mpi));
    double per_step = trained > 0 ? a2a.bytes / over->size / trained : 0.0;
    print0("dispatch and combine: %.0f bytes sent per rank per step in all-to-all-v (mean over ranks), %ld token-slots dropped\n",
           per_step, X->dropped_total);
    json_add_double(extra, "alltoall_bytes_per_step", per_step, "%.0f");
    json_add_int(extra, "dropped_total", X->dropped_total);
    // the share of the exchanges' time in flight that compute hid (rank 0,
    // the timed steps; -1 when nothing was exchanged): 1 - blocked / in flight
    double hidden = X->a2a_inflight_timed > 0 ? 1.0 - X->a2a_blocked_timed / X->a2a_inflight_timed : -1.0;
    double blocked_ms = timed ? 1e3 * X->a2a_blocked_timed / timed : 0.0;
    double inflight_ms = timed ? 1e3 * X->a2a_inflight_timed / timed : 0.0;
    if (hidden >= 0)
        print0("ep overlap: %d chunk%s per MoE layer; %.1f%% of the all-to-alls' time in flight hidden behind compute "
               "(rank 0: %.2f ms blocked of %.2f ms in flight per step; comm_progress %s)\n", X->chunks,
               X->chunks == 1 ? "" : "s", 100.0 * hidden, blocked_ms, inflight_ms, comm_progress_on() ? "on" : "off");
    json_add_int(extra, "ep_overlap", X->chunks);
    json_add_double(extra, "a2a_hidden_share", hidden, "%.4f");
    json_add_double(extra, "a2a_blocked_ms_per_step", blocked_ms, "%.3f");
    json_add_double(extra, "a2a_inflight_ms_per_step", inflight_ms, "%.3f");
}
