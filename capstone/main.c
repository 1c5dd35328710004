// The capstone: chapter 7's mixture-of-experts GPT trained on every axis at once.
//
// Chapter 7's program before it became the MoE lesson alone (issue 42): chapter 7's model
// and MoE layer (07_expert/moe.h), dp and ep as there, with chapter 6's context parallelism,
// tensor parallelism and chapter 5's pipeline composed around them. It trains chapter 7's
// model, so its summaries and checkpoints say chapter 7: a checkpoint of chapter 0 or 7
// resumes here on any mesh, and the capstone's there, wherever the model is the same.
//
//   mpirun -np 16 build/capstone --dp 2 --tp 2 --cp 2 --ep 2 --experts 4 --top-k 2
//
// --cp N: chapter 6's context parallelism; a share's cp ranks hold T/cp positions of its
// sequences, attention meets the others' keys and values (composed_cp.c); the rest is per
// token. --tp N: tensor parallelism with sequence parallelism: a tp rank holds B/tp of a
// share's sequences, attention is split by heads (composed_tp.c). --pp N: chapter 5's stages
// run this forward and backward, tp, cp, ep and dp inside; main's one loop runs every
// mesh, the schedule's actions executed by composed_pipe.c.
//
// One MoE layer, forward, in the order of moe_layer_forward below:
//   1. route      router logits -> softmax -> top-k experts and gates
//   2. count      how many of my token rows go to each expert (so to each
//                 ep rank), and exchange the counts (all-to-all of ints)
//   3. dispatch   gather my rows in destination order, all-to-all-v them
//   4. experts    the received rows, grouped by expert, through each expert
//   5. combine    all-to-all-v the outputs back, sum them weighted by the gates
// 3-5 go in chunks of the tokens (--ep-overlap), pipelined; backward runs
// the two exchanges in reverse (moe_layer_backward). Gradients go to three
// groups (reduce_gradients; --zero 1 shards the AdamW moments over each, 2
// the gradients too, 3 the parameters: composed_zero.h). Flags: composed_model.c.
#include <stdlib.h>

#include "memory.h"
#include "errors.h"
#include "exercise.h"  // exercise_not_done, in a homework tree
#include "trace.h"

#include "composed_stage.h"  // composed_model.h (run.h, train_loop.h), the chunks, the schedule
#include "train_step.h"

// ---------------------------------------------------------------- 1-2. route and count

// The load-balancing loss (Switch / GShard) of one MoE layer, over the
// GLOBAL batch so that every mesh trains the same objective: f_e = share of
// the token-slots routed to e, P_e = mean router prob of e,
// aux = E sum_e f_e P_e (1 when balanced). Writes d (aux_coef aux) / d each
// prob into L->aux_dprobs (one value per expert) and, in a training step,
// adds aux to m->aux and writes this step's slots per expert to m->routed[layer_index].
static void balance_loss(ExpertModel* m, MoeLayer* L, int layer_index) {
    // COPY OF CHAPTER 7 EXERCISE 1: chapter 7's load-balancing loss: stubbed in every tree that stubs that exercise
    int N = m->N, k = m->cfg.top_k, E = m->cfg.experts;
    long* cnt = xmalloc((size_t)E * sizeof(long));
    double* psum = xmalloc((size_t)E * sizeof(double));
    float* probs = m->probs_host;     // (N, E) staging buffers (memory.h), copied every step
    float* aux_host = m->aux_host;    // (E)
    mem_to_host(probs, L->probs, (size_t)N * E * sizeof(float));
    for (int e = 0; e < E; e++) cnt[e] = 0, psum[e] = 0.0;
    for (int i = 0; i < N * k; i++) cnt[L->idx_host[i]]++;
    for (int t = 0; t < N; t++)
        for (int e = 0; e < E; e++) psum[e] += probs[(size_t)t * E + e];
    // both sums over every token of the batch: over dp x cp x ep (host data: plain MPI)
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, cnt, E, MPI_LONG, MPI_SUM, m->batch.mpi));
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, psum, E, MPI_DOUBLE, MPI_SUM, m->batch.mpi));
    double n_global = (double)N * m->batch.size, aux = 0.0;
    for (int e = 0; e < E; e++) {
        double f = (double)cnt[e] / (n_global * k), P = psum[e] / n_global;
        aux += E * f * P;
        // d (coef * aux) / d prob[t, e] = coef E f_e / N_global for every
        // token; this rank's gradient is averaged over dp x cp x ep later
        // (x 1 / (dp cp ep)), so it carries dp cp ep x that: coef E f_e / N
        aux_host[e] = (float)(m->aux_coef * E * f / N);
        if (m->record) m->routed[(size_t)layer_index * E + e] = cnt[e];
    }
    mem_to_device(L->aux_dprobs, aux_host, (size_t)E * sizeof(float));
    if (m->record) m->aux += aux;
    free(psum), free(cnt);
    // END COPY OF CHAPTER 7 EXERCISE 1
}

// Capacity mode: each expert keeps at most floor(f k N_global / E) slots, the
// first in the global batch's order (sequence, position, slot, as on one
// rank); the rest pass through the residual (f = 0: dropless). L->pos_host[i]
// = 0 keeps slot i (token i / k, its (i % k)-th choice), -1 drops it;
// L->cnt_send[e] = my kept slots of e. Returns the slots dropped, globally.
static long plan_capacity(ExpertModel* m, MoeLayer* L) {
    // COPY OF CHAPTER 7 EXERCISE 2: chapter 7's capacity scan: stubbed in every tree that stubs that exercise
    const CPShard* sh = &m->cp.sh;
    int N = m->N, k = m->cfg.top_k, E = m->cfg.experts;
    long cap = m->capacity_factor > 0 ? (long)(m->capacity_factor * k * (double)N * m->batch.size / E) : -1, dropped = 0;
    // the batch in blocks, a run of len positions of one sequence held by one
    // rank (ring.h): nb per sequence, B sequences per share (dp x ep). Mine:
    int nb = sh->T / sh->len, n_blocks = m->batch.size / sh->cp * sh->B * nb, *blk = xmalloc((size_t)N * sizeof(int));
    for (int row = 0; row < N; row++)  // part-major rows (ring.h)
        blk[row] = (m->share * sh->B + row / sh->len % sh->B) * nb +
                   cp_shard_pos(sh, sh->rank, row / (sh->B * sh->len)) / sh->len;
    // every block's slots per expert (mine, the rest 0) summed over dp x cp x ep,
    // then an exclusive scan in batch order: the slots to e before each block
    long* cnt = xcalloc((size_t)n_blocks * E, sizeof(long));
    for (int i = 0; i < N * k; i++) cnt[(size_t)blk[i / k] * E + L->idx_host[i]]++;
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, cnt, n_blocks * E, MPI_LONG, MPI_SUM, m->batch.mpi));
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
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &dropped, 1, MPI_LONG, MPI_SUM, m->batch.mpi));
    free(cnt), free(blk);
    return dropped;
    // END COPY OF CHAPTER 7 EXERCISE 2
}

// The exchanges' plan, chunk by chunk (composed_model.h names the orders),
// from my kept slots per chunk and expert (L->cnt_chunk; experts in
// destination order: rank r holds experts [r E/ep, (r+1) E/ep)): exchange
// the counts, then the floats sent to and received from each ep rank in each
// chunk and where they sit (sc, sd, rc, rd), L->n_recv, and where each block
// (chunk, source, my expert) sits in the receive order and the experts'.
static void plan_exchange(ExpertModel* m, MoeLayer* L) {
    // COPY OF CHAPTER 7 EXERCISE 3: chapter 7's exchange plan: stubbed in every tree that stubs that exercise
    int El = m->E_local, ep = m->ep, C = m->cfg.gpt.channels, E = m->cfg.experts, nc = m->chunks;
    // rank s learns how many rows of each of my experts it will receive
    // from me in each chunk (an all-to-all of n E/ep ints per pair; integers:
    // plain MPI), so my counts go out destination-major
    int* out = xmalloc((size_t)nc * E * sizeof(int));
    for (int r = 0; r < ep; r++)
        for (int c = 0; c < nc; c++)
            for (int le = 0; le < El; le++) out[(r * nc + c) * El + le] = L->cnt_chunk[c * E + r * El + le];
    MPI_CHECK(MPI_Alltoall(out, nc * El, MPI_INT, L->cnt_recv, nc * El, MPI_INT, m->epc->mpi));
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
    // END COPY OF CHAPTER 7 EXERCISE 3
}

// From the router's choices, the plan of the exchanges. Integer data:
// counts and indices go through the host by plain MPI, never through the
// float collectives of the comm layer.
static void plan_dispatch(ExpertModel* m, MoeLayer* L, int layer_index) {
    int N = m->N, k = m->cfg.top_k;
    mem_to_host(L->idx_host, L->idx, (size_t)N * k * sizeof(int));
    balance_loss(m, L, layer_index);
    long dropped = plan_capacity(m, L);
    if (m->record) m->dropped += dropped;
    // kept slots sorted by chunk, then expert (so destination rank), stable
    // in token order; per chunk and expert, how many (L->cnt_chunk)
    expert_plan_send_order(m, L);
    plan_exchange(m, L);
    mem_to_device(L->pos, L->pos_host, (size_t)N * k * sizeof(int));
    mem_to_device(L->send_src, L->src_host, (size_t)L->n_send * sizeof(int));
}

// ---------------------------------------------------------------- 3-5. the MoE layer, in chunks
// --ep-overlap n cuts each exchange into n chunks of the layer's tokens, so
// that the experts work on one chunk while the next one travels:
//
//   in flight  dispatch 0 | dispatch 1 | dispatch 2, combine 0 | ... | combine n-1
//   experts               | chunk 0    | chunk 1               | ... |
//
// The first dispatch and the last combine have nothing to hide behind (docs/07_expert.md). Every
// row meets the same ops whatever n and the experts keep their rows in n = 1's order: the same bits.

// Chunk c's rows of the dispatch: my rows to every ep rank, then the start.
static void dispatch_start(ExpertModel* m, MoeLayer* L, const float* ln2, int c) {
    int C = m->cfg.gpt.channels, r0 = L->send_row[c], ep = m->ep;
    moe_gather_forward(L->send + (size_t)r0 * C, ln2, L->send_src + r0, L->send_row[c + 1] - r0, C);
    expert_a2a_start(m, c, L->send, L->sc + c * ep, L->sd + c * ep, m->recv, L->rc + c * ep, L->rd + c * ep);
}

// a: where the attention half and the layer's output go (acts_of, or the
// transient when --recompute full runs the layer again in backward).
static void moe_layer_forward(ExpertModel* m, int l, BlockActs* a, const float* x) {
    const MoeConfig* c = &m->cfg;
    int N = m->N, C = c->gpt.channels, E = c->experts, k = c->top_k, nc = m->chunks, ep = m->ep;
    int mi = moe_layer_index(c, l);
    MoeLayer* L = expert_layer(m, l);
    BlockParams p = expert_block_params(m, l);  // with --tp, my slices of the attention's matrices
    expert_attention_forward(m, l, &p, a, x);  // with --cp, over the cp group
    // 1. route: logits (N, E) = ln2 @ router^T, softmax, top-k, gates
    matmul_forward(L->logits, a->ln2, expert_router(m, l), NULL, N, C, E);
    moe_router_forward(L->probs, L->idx, L->gates, L->logits, N, E, k);
    // 2. count and exchange the counts
    plan_dispatch(m, L, mi);
    // 3-5, chunk by chunk: while chunk i's experts run, chunk i+1's rows
    // travel to their experts and chunk i-1's outputs travel home
    dispatch_start(m, L, a->ln2, 0);
    for (int i = 0; i < nc; i++) {
        expert_a2a_wait(m, i);  // 3. dispatch: chunk i's rows are here
        if (i + 1 < nc) dispatch_start(m, L, a->ln2, i + 1);
        expert_blocks_forward(m, L, l, i);  // 4. experts (composed_model.c)
        // 5. combine: the outputs back, the reverse all-to-all-v
        expert_a2a_start(m, nc + i, m->xbuf, L->rc + i * ep, L->rd + i * ep, L->back, L->sc + i * ep, L->sd + i * ep);
        if (i > 0) expert_a2a_wait(m, nc + i - 1);
    }
    expert_a2a_wait(m, 2 * nc - 1);
    // each token's k outputs summed with its gates (a->fcproj holds the sum)
    moe_combine_forward(a->fcproj, L->back, L->gates, L->pos, N, k, C);
    residual_forward(a->res3, a->res2, a->fcproj, (size_t)N * C);
}

// --recompute: what layer l's forward did not keep, again, before its
// backward (docs/recompute.md). Returns the activations backward reads.
//   selective  keeps the router's choices, the plan and every row that
//              crossed the network (exp_in, fch, back): no exchange is
//              repeated. Recomputed: the probabilities from qkv (--cp: if
//              Ulysses), and gelu(fch) of the experts' rows.
//   full       keeps only the layer's output; the whole layer runs again,
//              the router included: the same ops on the same input choose
//              the same experts, but the dispatch and combine all-to-all-v
//              are issued again, 2 more per MoE layer per step (counted in
//              the summary's alltoall bytes), as are the plan's small host
//              exchanges and --cp's attention exchanges.
static BlockActs moe_layer_recompute(ExpertModel* m, int l, const float* x) {
    const MoeConfig* c = &m->cfg;
    BlockActs a = expert_block_acts(m, l);
    MoeLayer* L = expert_layer(m, l);
    // the same span as model.c's dense blocks (docs/tracing.md)
    double t0 = trace_start();
    if (m->recompute == RECOMPUTE_SELECTIVE) {
        expert_attention_recompute(m, l, &a);  // the probabilities, from the kept q, k, v (with --cp too)
        gelu_forward(L->fch_gelu, L->fch, (size_t)L->n_recv * c->hidden);
    } else if (m->recompute == RECOMPUTE_FULL) {
        // everything into the transient (its res3 too: the kept one stays);
        // the step's statistics were counted by the first forward
        a = block_acts_at(m->acts.transient, m->B, m->T, c->gpt.channels, c->gpt.num_heads);
        int record = m->record;
        m->record = 0;
        moe_layer_forward(m, l, &a, x);
        m->record = record;
    }
    if (m->recompute != RECOMPUTE_NONE) trace_compute(t0, "block %d recompute", l);
    return a;
}

// dres: d res3 on entry, d x on return. The exchanges of forward, reversed,
// in the same chunks.
static void moe_layer_backward(ExpertModel* m, int l, const float* x) {
    const MoeConfig* c = &m->cfg;
    int N = m->N, C = c->gpt.channels, E = c->experts, k = c->top_k, nc = m->chunks, ep = m->ep;
    double t0 = trace_start();
    BlockActs a = moe_layer_recompute(m, l, x);
    MoeLayer* L = expert_layer(m, l);
    BlockParams p = expert_block_params(m, l), g = expert_block_grads(m, l);
    BlockScratch s = gpt_acts_scratch(&m->acts, &c->gpt);
    float* dres = m->acts.dres;
    // combine, backwards: d of each returned row, and of each gate
    ops_zero(m->dsend, (size_t)N * k * C);
    ops_zero(m->dgates, (size_t)N * k);
    moe_combine_backward(m->dsend, m->dgates, dres, L->back, L->gates, L->pos, N, k, C);
    // the combine's exchange reversed: the rows' gradients go to the experts
    expert_a2a_start(m, 0, m->dsend, L->sc, L->sd, m->recv, L->rc, L->rd);
    // meanwhile the router, backwards (through the gates and the
    // load-balancing loss), and its weight gradient (zb: queued for W)
    ops_zero(m->dlogits, (size_t)N * E);
    moe_router_backward(m->dlogits, m->dgates, L->aux_dprobs, L->probs, L->idx, L->gates, N, E, k);
    expert_wgrad(m, l, expert_router_grad(m, l), NULL, m->dlogits, a.ln2, N, C, E);
    for (int i = 0; i < nc; i++) {
        expert_a2a_wait(m, i);
        if (i + 1 < nc)
            expert_a2a_start(m, i + 1, m->dsend, L->sc + (i + 1) * ep, L->sd + (i + 1) * ep, m->recv,
                             L->rc + (i + 1) * ep, L->rd + (i + 1) * ep);
        expert_blocks_backward_input(m, L, l, i);
        // the dispatch's exchange reversed: d of my rows comes home
        expert_a2a_start(m, nc + i, m->ybuf, L->rc + i * ep, L->rd + i * ep, m->dsend, L->sc + i * ep, L->sd + i * ep);
        if (i > 0) expert_a2a_wait(m, nc + i - 1);
    }
    // the experts' weight gradients, over all their rows in the experts'
    // order (one order whatever n: the same bits), while the last chunk
    // travels home
    expert_blocks_backward_weights(m, L, l);
    expert_a2a_wait(m, 2 * nc - 1);
    ops_zero(m->dln2, (size_t)N * C);
    moe_gather_backward(m->dln2, m->dsend, L->pos, N, k, C);
    matmul_backward(m->dln2, NULL, NULL, m->dlogits, NULL, expert_router(m, l), N, C, E);
    expert_attention_backward(m, l, &p, &g, &a, &s, x, m->dln2, dres);
    trace_compute(t0, "block %d backward", l);
}

// ---------------------------------------------------------------- the whole model

// The embedding and the head work token by token on this rank's own
// sequences (composed_model.c); the MoE layers meet the other ep ranks.
static float model_forward(ExpertModel* m, const int* inputs, const int* targets) {
    const GPTConfig* g = &m->cfg.gpt;
    int B = m->B, T = m->T;
    if (m->record) m->aux = 0.0, m->dropped = 0, m->a2a_blocked_s = 0.0, m->a2a_inflight_s = 0.0;
    expert_units_gather(m, -1);  // --zero 3: each unit all-gathered over its buffer's group just before it runs
    expert_embed_forward(m, inputs, targets);
    for (int l = 0; l < g->num_layers; l++) {
        expert_units_gather(m, l);  // layer l's: its block's piece, its experts, its tp slices
        if (moe_is_moe_layer(&m->cfg, l)) {
            BlockActs a = expert_block_acts(m, l);
            double t0 = trace_start();
            moe_layer_forward(m, l, &a, gpt_acts_block_input(&m->acts, g, l, B, T));
            trace_compute(t0, "block %d forward", l);
        } else {  // a dense layer: the GPT's block (with --cp, its attention over cp)
            BlockParams p = expert_block_params(m, l);
            expert_dense_forward(m, l, &p);
        }
    }
    expert_units_gather(m, g->num_layers);  // [lnfw lnfb] and wte
    return expert_head_forward(m);
}

static void model_backward(ExpertModel* m) {
    const GPTConfig* g = &m->cfg.gpt;
    int B = m->B, T = m->T;
    expert_units_open(m, g->num_layers);  // --zero 2, 3: the units' gradients zeroed (3: the units gathered),
    expert_head_backward(m);  // m->acts.dres: d loss / d the last layer's output
    expert_units_reduce(m, g->num_layers);  // reduce-scattered as soon as made (wte's open until the embedding's)
    for (int l = g->num_layers - 1; l >= 0; l--) {
        expert_units_open(m, l);
        if (moe_is_moe_layer(&m->cfg, l)) {
            moe_layer_backward(m, l, gpt_acts_block_input(&m->acts, g, l, B, T));
        } else {  // a dense layer: the GPT's block, recomputed as model.h says
            BlockParams p = expert_block_params(m, l), gp = expert_block_grads(m, l);
            expert_dense_backward(m, l, &p, &gp);
        }
        expert_units_reduce(m, l);
    }
    expert_embed_backward(m);
    expert_units_reduce(m, -1);  // [wte wpe]
}

// ---------------------------------------------------------------- the three gradient groups

// Every rank's gradient is of ITS tokens' mean loss. The replicated
// parameters saw every token: the mean over dp x cp x ep x tp. An expert saw
// its ep group's tokens routed to it (summed by backward), its copies on the
// dp, cp, tp ranks the others: the sum over dp x cp x tp. A tp slice saw its
// tp group's tokens: the sum over dp x cp x ep. Sums scale by 1/(dp cp ep tp).
static void reduce_chunk(ExpertModel* m) {
    for (ZeroBuf* z = m->z; m->zero && z < m->z + m->nz; z++) {  // --zero 1: each rank receives its shard only
        if (m->zero == 1) comm_reduce_scatter(z->g, z->grads, z->dshard, z->S, COMM_SUM);  // 2, 3: in backward, the mean
        ops_scale(z->dshard, z->S, (m->zero > 1 ? (float)z->g->size : 1.0f) / (float)m->batch.size);
    }
    if (m->zero) return;
    // COPY OF CHAPTER 7 EXERCISE 4: chapter 7's two gradient groups: stubbed in every tree that stubs that exercise
    comm_allreduce(&m->batch, m->dshared, m->n_shared, COMM_AVG);
    comm_allreduce(m->dpcp, m->dexperts, m->n_experts, COMM_SUM);
    ops_scale(m->dexperts, m->n_experts, 1.0f / (float)m->batch.size);
    // END COPY OF CHAPTER 7 EXERCISE 4
    if (m->tp.tp > 1) {  // --tp: the slices, the third group
        comm_allreduce(m->tp.dpcpep, m->tp.dw, m->tp.n, COMM_SUM);
        ops_scale(m->tp.dw, m->tp.n, 1.0f / (float)m->batch.size);
    }
}

// The step's gradients: accumulated over the microbatches, then each chunk
// (a pipeline stage's layers; the whole model without --pp) over its groups.
static void reduce_gradients(ExpertPipe* P) {
    expert_pipe_accumulated(P);  // x 1/m over the microbatches; --pp: the tied wte's halves summed
    for (int c = 0; c < P->v; c++) reduce_chunk(&P->chunk[c].m);
}

// The global norm: each gradient once, summed over ep, dp x cp x tp and the
// stages (the first copy's, or with --zero every rank's shard; the last
// stage's tied wte left out). AdamW steps each buffer whole, or (--zero)
// my shard; an all-gather brings every copy the shards (not --zero 3's).
static float clip_and_step(ExpertPipe* P, const TrainArgs* args, int step) {
    double* mine = train_sumsq_begin();  // on the device, read once by train_global_norm
    for (int c = 0; c < P->v; c++) {
        ExpertModel* m = &P->chunk[c].m;
        for (ZeroBuf* z = m->z; z < m->z + m->nz; z++)  // the experts, the replicated buffer, the tp slices
            if (m->zero || z->g->rank == 0) expert_zero_sumsq(mine, z);
    }
    const Comm* groups[] = {P->chunk[0].m.epc, P->chunk[0].m.dpcp, P->ppc};
    double norm = train_global_norm(mine, groups, P->pp > 1 ? 3 : 2);
    float scale = grad_clip_scale(norm, args->clip);
    AdamWConfig ac = train_adamw(args);
    double t0 = trace_start();
    for (int c = 0; c < P->v; c++)
        for (ZeroBuf* z = P->chunk[c].m.z; z < P->chunk[c].m.z + P->chunk[c].m.nz; z++)
            if (z->sharded) fsdp_step(&z->f, ac, step + 1, scale);  // --zero 2, 3: chapter 3's (2: then all-gathered)
            else adamw_update(z->params + z->off, z->dshard, z->m, z->v, z->S, ac, step + 1, scale);
    trace_compute(t0, "optimizer");
    for (int c = 0; c < P->v; c++)  // --zero 1: the updated shards to every copy, in place
        for (ZeroBuf* z = P->chunk[c].m.z; P->chunk[c].m.zero == 1 && z < P->chunk[c].m.z + P->chunk[c].m.nz; z++)
            comm_allgather(z->g, z->params + z->off, z->params, z->S);
    return (float)norm;
}

// ---------------------------------------------------------------- main

// One loop for every mesh. Without --pp (and --microbatches) a rank has one
// chunk, the whole model, and the schedule is one F and one B; with --pp a
// rank's chunks are its stages' layers and the schedule (chapter 5's)
// interleaves the microbatches' F and B, composed_pipe.c sending the
// activations and their gradients between the stages.
int main(int argc, char** argv) {
    ExpertFlags fl;  // --experts, --top-k, ..., --ep-overlap (composed_model.c)
    Run run;
    if (!expert_run_start(&run, &fl, argc, argv)) return 0;
    const TrainArgs* args = &run.args;
    MoeConfig cfg = expert_config(&run, &fl);  // the flags or --model FILE's, checked against the mesh
    static ExpertPipe P;  // my chunks (each an ExpertModel: my experts, the replicated rest), the schedule
    Ckpt ck;  // --ckpt-dir, --resume: this rank's slices, from whatever mesh saved them
    expert_pipe_create(&P, &run, &fl, &cfg, model_forward, model_backward, &ck);
    const Comm* batch = &P.chunk[0].m.batch;  // dp x cp x ep x tp: the ranks of one stage that share the batch
    TrainLoop loop;
    train_loop_begin(&loop, &run, &(TrainLoopSpec){
        .chapter = 7, .num_params = P.total, .flops_per_token = moe_flops_per_token(&cfg, run.setup.T),
        .rows = P.per_rank, .val_loss = expert_pipe_val_loss, .ctx = &P, .ckpt = &ck});
    for (int step = loop.start; step < loop.steps; step++) {
        expert_pipe_load(&P, &run.setup.train, step);  // my share of the batch, in m microbatches
        // the schedule's F and B of each (microbatch, chunk): model_forward (per MoE layer route,
        // plan, dispatch, experts, combine), model_backward (the two exchanges of each, reversed)
        expert_pipe_run(&P);
        reduce_gradients(&P);  // the replicated parameters, the experts, the tp slices: three groups
        float norm = clip_and_step(&P, args, step);
        // the language-model loss of the global batch (a host scalar: plain MPI)
        float loss = (float)train_mean(batch, expert_pipe_loss(&P));  // dp x cp x ep: equal token counts
        expert_pipe_record(&P, &loop, step);  // the record's aux_loss, dropped, expert_tokens
        train_loop_step(&loop, step, loss, norm);
    }
    JsonBuf summary = {0};
    expert_pipe_report(&P, &fl, &loop, &summary);  // the traffic, a2a_hidden_share
    train_loop_end(&loop, &summary);  // the final validation and the summary
    json_free(&summary);
    expert_pipe_finish(&P, args);  // --sample (every rank runs each forward), --save
    run_finish(&run);
    return 0;
}
