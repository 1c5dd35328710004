// expert_pipe.c: chapter 7's pipeline (expert_pipe.h). In the order of a
// step: the actions F and B with their sends and receives, the step (the
// schedule, the tied embedding, the gradient groups, the norm over the
// stages, AdamW), then the set-up, validation, checkpoints, --save and the
// loop.
#include "expert_pipe.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "errors.h"
#include "memory.h"
#include "mesh.h"
#include "rank.h"
#include "schedule.h"
#include "sharding.h"
#include "trace.h"

#define XP_MAX_CHUNKS 64  // virtual stages, as chapter 5

// What one (microbatch, chunk) keeps from its F to its B: the chunk's
// activations (its input in acts.encoded, its layers', the head's), its MoE
// layers' routing, plan and rows, and with --cp its layers' attention state.
// The chunk's ExpertModel works on a slot by pointing m->acts, m->moe and
// m->cp's kept buffers at it (slot_use).
typedef struct {
    GPTActs acts;
    MoeLayer* moe;
    float *lse, *qkv_h, *att_h;  // --cp: what each layer's attention keeps (expert_model.h's ExpertCP)
    int mb, busy;
} XpSlot;

// A range of a chunk's replicated buffer that belongs to the model: global
// offset in the whole model's shared layout (moe.h), local offset, count.
// A chunk's buffer is laid out as a model of its own layers
// (pipe_chunk_config); only lnf's slot off the last chunk is not a piece
// (it stays zero-gradient and unread).
typedef struct {
    size_t global, local, count;
    int tied_copy;  // the last stage's copy of wte: not in the norm, not written
} XpPiece;

typedef struct {
    ExpertModel m;   // the chunk's layers as a model (cfg.gpt.num_layers = L / S)
    int vstage, first, moe0, n_moe;  // its virtual stage, first layer, first MoE layer, MoE layers
    XpPiece piece[4];
    int n_pieces;
    XpSlot** slot;
    int n_slots;
} XpChunk;

typedef struct {
    int grad, mb, chunk;
} XpMessage;

typedef struct {
    int peer, n, next;
    XpMessage* msg;
} XpIncoming;

typedef struct {
    float* buf;
    CommRequest req;
} XpSend;

typedef struct {
    Run run_mb;   // the run as one microbatch sees it: setup.B = B / m (the chunks' models point into it)
    MoeConfig cfg;  // the whole model's
    ExpertForward forward;
    ExpertBackward backward;
    Schedule sched;
    const char* sched_name;
    int pp, stage, v, S, M, B, b, T, Tr, per_rank, share;  // Tr: a rank's positions of a sequence, T / cp
    const Comm* ppc;
    Comm embed;  // stage 0 and stage pp-1 of this (dp, cp, ep) coordinate
    XpChunk chunk[XP_MAX_CHUNKS];
    XpIncoming in[2];
    int n_in;
    XpSend* sends;
    int n_sends, max_sends;
    int *inputs, *targets;  // host (m, b, T): this step's tokens of each microbatch on this rank
    // the step's figures: losses (last stage), routing statistics of my layers
    double loss_sum, aux;
    long dropped, dropped_total;
    long* routed;  // (L_moe, E) of the whole model
    int peak_slots;
} ExpertPipe;

static int next_rank(const ExpertPipe* P) { return (P->stage + 1) % P->pp; }
static int prev_rank(const ExpertPipe* P) { return (P->stage + P->pp - 1) % P->pp; }
static size_t act_floats(const ExpertPipe* P) { return (size_t)P->b * P->Tr * P->cfg.gpt.channels; }

// ---------------------------------------------------------------- slots

static void slot_use(XpChunk* ch, XpSlot* sl) {
    ch->m.acts = sl->acts;
    ch->m.moe = sl->moe;
    ch->m.cp.lse = sl->lse, ch->m.cp.qkv_h = sl->qkv_h, ch->m.cp.att_h = sl->att_h;
}

// --cp: a slot's own copy of what each layer's attention keeps for its
// backward (ring: the log-sum-exp; Ulysses: the head shard's q|k|v and
// probabilities), as expert_cp_create sizes the model's; the rest of the
// cp buffers is scratch of one layer, the chunk's model's.
static void slot_cp_create(const XpChunk* ch, XpSlot* sl) {
    const ExpertModel* m = &ch->m;
    if (m->cp.sh.cp == 1) return;
    size_t L = (size_t)m->cfg.gpt.num_layers, N = (size_t)m->N, C = (size_t)m->cfg.gpt.channels;
    size_t NH = (size_t)m->cfg.gpt.num_heads;
    if (m->cp.mode == CP_RING) {
        sl->lse = mem_alloc_floats(L * N * NH, MEM_ACTIVATIONS);
    } else {
        sl->qkv_h = mem_alloc_floats(L * 3 * N * C, MEM_ACTIVATIONS);
        sl->att_h = mem_alloc_floats(L * N * NH * (size_t)m->cp.sh.T, MEM_ACTIVATIONS);
    }
}

// The slot of (mb, chunk): the one taken, else a free one, else a new one
// (so the peak of slots allocated is the peak in flight).
static XpSlot* slot_get(ExpertPipe* P, XpChunk* ch, int mb) {
    XpSlot* free_one = NULL;
    for (int i = 0; i < ch->n_slots; i++) {
        if (ch->slot[i]->busy && ch->slot[i]->mb == mb) return ch->slot[i];
        if (!ch->slot[i]->busy && !free_one) free_one = ch->slot[i];
    }
    if (!free_one) {
        free_one = xcalloc(1, sizeof(XpSlot));
        // --recompute: the GPT's activations as the mode keeps them; selective
        // keeps each MoE layer's routing, plan and rows (their send and
        // fch_gelu buffers the model's one each), full none: every layer runs
        // again before its backward in the model's one MoE layer state
        GPTConfig g = ch->m.cfg.gpt;  // as expert_model_create_part: no logits without the head
        if (!ch->m.has_head) g.vocab_size = g.padded_vocab_size = 0;
        gpt_acts_create_recompute(&free_one->acts, &g, P->b, P->Tr, ch->m.recompute);
        slot_cp_create(ch, free_one);
        free_one->moe = ch->m.recompute == RECOMPUTE_FULL ? ch->slot[0]->moe : expert_moe_layers_create(&ch->m, ch->n_moe);
        if (ch->n_slots == P->M) FATAL("more microbatches in flight than the step has");
        ch->slot[ch->n_slots++] = free_one;
        int total = 0;
        for (int c = 0; c < P->v; c++) total += P->chunk[c].n_slots;
        if (total > P->peak_slots) P->peak_slots = total;
    }
    free_one->busy = 1, free_one->mb = mb;
    return free_one;
}

static XpSlot* slot_find(XpChunk* ch, int mb) {
    for (int i = 0; i < ch->n_slots; i++)
        if (ch->slot[i]->busy && ch->slot[i]->mb == mb) return ch->slot[i];
    FATAL("no activations kept for microbatch %d", mb);
}

// ---------------------------------------------------------------- point to point
// As chapter 5 (05_pipeline/main.c says why no list that the validator
// accepts can deadlock): non-blocking sends from buffers of their own,
// blocking receives, and a peer's messages taken in the order it sends them
// (P->in, from its list), each into the slot where it belongs.
static void receive(ExpertPipe* P, int grad, int mb, int c) {
    int peer = grad ? next_rank(P) : prev_rank(P);
    XpIncoming* in = P->in[0].peer == peer ? &P->in[0] : &P->in[1];
    for (int i = 0; i < in->next; i++)  // it came early, already in its slot
        if (in->msg[i].grad == grad && in->msg[i].mb == mb && in->msg[i].chunk == c) return;
    while (in->next < in->n) {
        XpMessage msg = in->msg[in->next++];
        XpChunk* ch = &P->chunk[msg.chunk];
        XpSlot* sl = msg.grad ? slot_find(ch, msg.mb) : slot_get(P, ch, msg.mb);
        comm_recv(P->ppc, msg.grad ? sl->acts.dres : sl->acts.encoded, act_floats(P), peer);
        if (msg.grad == grad && msg.mb == mb && msg.chunk == c) return;
    }
    FATAL("stage %d: rank %d never sends the %s of microbatch %d", P->stage, peer, grad ? "gradient" : "activation", mb);
}

static void send(ExpertPipe* P, const float* src, int peer) {
    XpSend* sb = NULL;
    for (int i = 0; i < P->n_sends && !sb; i++)
        if (comm_test(&P->sends[i].req)) sb = &P->sends[i];
    if (!sb) {
        if (P->n_sends == P->max_sends) FATAL("more sends in flight than the schedule has");
        sb = &P->sends[P->n_sends++];
        sb->buf = mem_alloc_floats(act_floats(P), MEM_COMM);
    }
    ops_copy(sb->buf, src, act_floats(P));
    comm_isend(P->ppc, sb->buf, act_floats(P), peer, &sb->req);
}

// ---------------------------------------------------------------- the actions

// F: the chunk's input (the tokens' embedding on virtual stage 0, else the
// stage before's output), chapter 7's forward of the chunk's layers (each
// MoE layer's all-to-all over ep inside), then the loss (the last virtual
// stage) or the output on to the next stage.
static void forward(ExpertPipe* P, int mb, int c) {
    XpChunk* ch = &P->chunk[c];
    XpSlot* sl = slot_get(P, ch, mb);
    if (ch->vstage > 0) receive(P, 0, mb, c);
    slot_use(ch, sl);
    size_t t0 = (size_t)mb * P->b * P->T;
    float loss = P->forward(&ch->m, P->inputs + t0, P->targets + t0);
    // this microbatch's routing statistics of my MoE layers (global over dp x cp x ep)
    P->aux += ch->m.aux, P->dropped += ch->m.dropped;
    int E = P->cfg.experts;
    for (int i = 0; i < ch->n_moe * E; i++) P->routed[(size_t)ch->moe0 * E + i] += ch->m.routed[i];
    const GPTConfig* g = &ch->m.cfg.gpt;
    if (ch->vstage == P->S - 1) P->loss_sum += loss;
    else send(P, gpt_acts_block_output(&sl->acts, g, g->num_layers - 1, P->b, P->Tr), next_rank(P));
}

// B: the gradient of the chunk's output (from the head, or from the stage
// after), chapter 7's backward of its layers (the exchanges reversed), d of
// the input back to the stage before. The MoE layers' weight halves are not
// split out: with zb, B does the whole backward and W has nothing left.
static void backward(ExpertPipe* P, int mb, int c) {
    XpChunk* ch = &P->chunk[c];
    XpSlot* sl = slot_find(ch, mb);
    if (ch->vstage < P->S - 1) receive(P, 1, mb, c);
    slot_use(ch, sl);
    P->backward(&ch->m);
    if (ch->vstage > 0) send(P, sl->acts.dres, prev_rank(P));
    sl->busy = 0;
}

// ---------------------------------------------------------------- the step

static void run_schedule(ExpertPipe* P) {
    for (int i = 0; i < P->n_in; i++) P->in[i].next = 0;
    for (int i = 0; i < P->sched.n[P->stage]; i++) {
        Action a = P->sched.list[P->stage][i];
        if (a.type == ACT_F) forward(P, a.mb, a.chunk);
        else if (a.type == ACT_B) backward(P, a.mb, a.chunk);
    }
    for (int i = 0; i < P->n_sends; i++) comm_wait(&P->sends[i].req);
}

// The gradients of one step. Each microbatch's backward gave the gradient of
// its own mean (LM loss + aux_coef aux); the step's objective is their mean
// over the m microbatches: x 1/m. Then, per chunk: the tied wte's two
// halves summed between the first and the last stage (chapter 5), the
// stage's replicated pieces averaged over dp x cp x ep, its experts summed
// over dp x cp and scaled for the global mean (chapter 7's two groups).
static void reduce_gradients(ExpertPipe* P) {
    for (int c = 0; c < P->v; c++) {
        ExpertModel* m = &P->chunk[c].m;
        if (P->M > 1) {
            ops_scale(m->dshared, m->n_shared, 1.0f / (float)P->M);
            ops_scale(m->dexperts, m->n_experts, 1.0f / (float)P->M);
        }
    }
    if (P->pp > 1 && (P->stage == 0 || P->stage == P->pp - 1)) {
        ExpertModel* end = &P->chunk[P->stage == 0 ? 0 : P->v - 1].m;
        comm_allreduce(&P->embed, end->dshared + moe_wte_offset(&end->cfg), param_tensor_numel(&P->cfg.gpt, P_WTE),
                       COMM_SUM);
    }
    for (int c = 0; c < P->v; c++) {
        XpChunk* ch = &P->chunk[c];
        for (int i = 0; i < ch->n_pieces;) {  // pieces that touch in the buffer in one call
            size_t lo = ch->piece[i].local, n = ch->piece[i].count;
            for (i++; i < ch->n_pieces && ch->piece[i].local == lo + n; i++) n += ch->piece[i].count;
            comm_allreduce(&ch->m.batch, ch->m.dshared + lo, n, COMM_AVG);
        }
        comm_allreduce(ch->m.dpcp, ch->m.dexperts, ch->m.n_experts, COMM_SUM);
        ops_scale(ch->m.dexperts, ch->m.n_experts, 1.0f / (float)ch->m.batch.size);
    }
}

// The norm: each parameter once (the tied copy left out; the replicated
// pieces on ep rank 0 of dp x cp rank 0, the experts on dp x cp rank 0),
// summed over ep, dp x cp and the stages.
static float clip_and_step(ExpertPipe* P, const TrainArgs* args, int step) {
    double* mine = train_sumsq_begin();
    for (int c = 0; c < P->v; c++) {
        XpChunk* ch = &P->chunk[c];
        if (ch->m.dpcp->rank != 0) continue;
        grad_sumsq(mine, ch->m.dexperts, ch->m.n_experts);
        for (int i = 0; i < ch->n_pieces && ch->m.epc->rank == 0; i++)
            if (!ch->piece[i].tied_copy) grad_sumsq(mine, ch->m.dshared + ch->piece[i].local, ch->piece[i].count);
    }
    const Comm* groups[] = {P->chunk[0].m.epc, P->chunk[0].m.dpcp, P->ppc};
    double norm = train_global_norm(mine, groups, 3);
    float scale = grad_clip_scale(norm, args->clip);
    AdamWConfig ac = train_adamw(args);
    double t0 = trace_start();
    for (int c = 0; c < P->v; c++) {
        ExpertModel* m = &P->chunk[c].m;
        adamw_update(m->shared, m->dshared, m->m_s, m->v_s, m->n_shared, ac, step + 1, scale);
        adamw_update(m->experts, m->dexperts, m->m_e, m->v_e, m->n_experts, ac, step + 1, scale);
    }
    trace_compute(t0, "optimizer");
    return (float)norm;
}

static float train_step(ExpertPipe* P, const TrainArgs* args, int step, float* norm) {
    int E = P->cfg.experts, Lm = moe_num_moe_layers(&P->cfg);
    for (int c = 0; c < P->v; c++) {
        mem_zero(P->chunk[c].m.dshared, P->chunk[c].m.n_shared * sizeof(float));
        mem_zero(P->chunk[c].m.dexperts, P->chunk[c].m.n_experts * sizeof(float));
    }
    P->loss_sum = P->aux = 0.0, P->dropped = 0;
    memset(P->routed, 0, (size_t)Lm * E * sizeof(long));
    run_schedule(P);  // every F and B of the step, in this stage's order
    reduce_gradients(P);
    *norm = clip_and_step(P, args, step);
    // the routing statistics of every MoE layer: each stage holds its own
    // layers' (host integers and doubles: plain MPI over pp)
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &P->aux, 1, MPI_DOUBLE, MPI_SUM, P->ppc->mpi));
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &P->dropped, 1, MPI_LONG, MPI_SUM, P->ppc->mpi));
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, P->routed, Lm * E, MPI_LONG, MPI_SUM, P->ppc->mpi));
    // only the last stage saw the loss: it tells its pipeline, then the dp x cp x ep mean
    double loss = P->stage == P->pp - 1 ? P->loss_sum / P->M : 0.0;
    MPI_CHECK(MPI_Bcast(&loss, 1, MPI_DOUBLE, P->pp - 1, P->ppc->mpi));
    return (float)train_mean(&P->chunk[0].m.batch, loss);
}

static void step_record(ExpertPipe* P, TrainLoop* loop) {
    JsonBuf* fields = &loop->step_extra;
    P->dropped_total += P->dropped;
    json_add_double(fields, "aux_loss", P->aux / P->M, "%.7f");  // the mean over the microbatches
    json_add_int(fields, "dropped", P->dropped);
    json_add_long_matrix(fields, "expert_tokens", P->routed, moe_num_moe_layers(&P->cfg), P->cfg.experts);
}

// ---------------------------------------------------------------- the tokens

// Microbatch mb of a step is the global batch's sequences [mb B/m, (mb+1) B/m),
// split over the dp x ep ranks (b = B / (m dp ep) each, in share order; a
// share's cp ranks hold the same sequences), so that one MoE layer call sees
// the same tokens on every mesh: its balance statistics and capacity are over
// the microbatch, and chapter 7 on one rank with the same m is the reference.
static void load_microbatches(ExpertPipe* P, const TokenSet* d, long step) {
    int B = P->B, T = P->T;
    for (int mb = 0; mb < P->M; mb++) {
        size_t t0 = (size_t)mb * P->b * T;
        data_batch(d, step, B, T, mb * (B / P->M) + P->share * P->b, P->b, P->inputs + t0, P->targets + t0);
    }
}

// ---------------------------------------------------------------- validation

// One microbatch through the stages, forward only: chunk after chunk, each
// receiving its input from the stage before; the loss goes from the last
// stage to its pipeline. *last (if not NULL): the last chunk's slot, whose
// head holds the logits.
static float forward_only(ExpertPipe* P, const int* inputs, const int* targets, XpSlot** last) {
    float loss = 0.0f;
    for (int c = 0; c < P->v; c++) {
        XpChunk* ch = &P->chunk[c];
        XpSlot* sl = slot_get(P, ch, -1);
        if (last) *last = sl;
        if (ch->vstage > 0) comm_recv(P->ppc, sl->acts.encoded, act_floats(P), prev_rank(P));
        slot_use(ch, sl);
        ch->m.record = 0;
        loss = P->forward(&ch->m, inputs, targets);
        ch->m.record = 1;
        if (ch->vstage < P->S - 1) {
            const GPTConfig* g = &ch->m.cfg.gpt;
            send(P, gpt_acts_block_output(&sl->acts, g, g->num_layers - 1, P->b, P->Tr), next_rank(P));
        }
        sl->busy = 0;
    }
    for (int i = 0; i < P->n_sends; i++) comm_wait(&P->sends[i].req);
    double l = loss;
    MPI_CHECK(MPI_Bcast(&l, 1, MPI_DOUBLE, P->pp - 1, P->ppc->mpi));
    return (float)l;
}

static float val_forward(void* ctx, const int* inputs, const int* targets) {
    return forward_only(ctx, inputs, targets, NULL);
}

// --sample: every rank runs each forward through the stages, share 0's first
// sequence holding the window (as chapter 7's next_logits); the last stage's
// row of position t-1 goes to stage 0 of its pipeline, where world rank 0
// samples (host floats: plain MPI).
static void next_logits(void* ctx, const int* window, int t, float* row) {
    ExpertPipe* P = ctx;
    int Vp = P->cfg.gpt.padded_vocab_size;
    size_t BT = (size_t)P->b * P->T;
    int* tokens = xcalloc(2 * BT, sizeof(int));  // inputs, then targets (unused: zeros)
    if (P->share == 0) memcpy(tokens, window, (size_t)t * sizeof(int));
    XpSlot* last = NULL;
    forward_only(P, tokens, tokens + BT, &last);
    // with --cp, position t-1 lives on one cp rank (ring.h's layout): it
    // tells its cp group, as chapter 7's own next_logits does
    const ExpertModel* m = &P->chunk[P->v - 1].m;
    const CPShard* sh = &m->cp.sh;
    int owner = 0;
    size_t r = 0;
    for (int c = 0; c < sh->cp; c++)
        for (int p = 0; p < sh->parts; p++) {
            int pos0 = cp_shard_pos(sh, c, p);
            if (pos0 <= t - 1 && t - 1 < pos0 + sh->len) owner = c, r = (size_t)p * sh->B * sh->len + (size_t)(t - 1 - pos0);
        }
    if (P->stage == P->pp - 1) {
        HeadActs h = gpt_acts_head(&last->acts, &m->cfg.gpt, P->b, P->Tr);
        if (sh->rank == owner) mem_to_host(row, h.logits + r * Vp, (size_t)Vp * sizeof(float));
        if (sh->cp > 1) MPI_CHECK(MPI_Bcast(row, Vp, MPI_FLOAT, owner, m->cp.cpc->mpi));
    }
    MPI_CHECK(MPI_Bcast(row, Vp, MPI_FLOAT, P->pp - 1, P->ppc->mpi));
    free(tokens);
}

static float val_loss(void* ctx, const TrainSetup* setup, int n_batches) {
    ExpertPipe* P = ctx;
    size_t per_epoch = data_batches_per_epoch(&setup->val, setup->B, setup->T);
    if (per_epoch == 0) return -1.0f;
    if ((size_t)n_batches > per_epoch) n_batches = (int)per_epoch;
    double sum = 0.0;
    for (int i = 0; i < n_batches; i++) {
        load_microbatches(P, &setup->val, i);
        for (int mb = 0; mb < P->M; mb++) {
            size_t t0 = (size_t)mb * P->b * P->T;
            sum += val_forward(P, P->inputs + t0, P->targets + t0);
        }
    }
    // every rank of dp x cp x ep ran as many microbatches of the same size: the mean
    return (float)(train_mean(&P->chunk[0].m.batch, sum) / ((double)n_batches * P->M));
}

// ---------------------------------------------------------------- set-up

// What the pipeline does not compose with yet, the flags against the mesh
// and the layers, and the schedule's lists (built and validated by every
// rank). Every refusal is one message from rank 0 and an exit of every rank.
static void check_and_schedule(ExpertPipe* P, const Run* run, const ExpertFlags* fl) {
    const TrainSetup* s = &run->setup;
    const Mesh* mesh = &run->mesh;
    int L = P->cfg.gpt.num_layers, kind = schedule_parse(fl->schedule);
    if (kind < 0) fail_all("--schedule %s is not one of gpipe, 1f1b, interleaved, zb", fl->schedule);
    P->sched_name = schedule_name((ScheduleKind)kind);
    P->M = fl->microbatches == ARG_NOT_GIVEN ? P->pp : fl->microbatches;
    P->v = fl->virtual_chunks;
    if (P->M < 1) fail_all("--microbatches must be positive (leave it out for pp = %d)", P->pp);
    if (P->per_rank % P->M != 0)
        fail_all("--microbatches %d does not divide a rank's %d sequences (the batch of %d over dp x ep = %d ranks): "
                 "use a divisor of %d", P->M, P->per_rank, s->B, mesh->size[AXIS_DP] * mesh->size[AXIS_EP], P->per_rank);
    if (P->v < 1 || P->v > XP_MAX_CHUNKS / P->pp)
        fail_all("--virtual %d: use 1 to %d chunks per rank", P->v, XP_MAX_CHUNKS / P->pp);
    if (P->v > 1 && kind != SCHED_INTERLEAVED) fail_all("--virtual %d needs --schedule interleaved", P->v);
    if (P->v > 1 && P->pp == 1) fail_all("--virtual %d interleaves chunks over pp ranks: use --pp 2 or more", P->v);
    P->S = P->pp * P->v;
    if (L % P->S != 0)
        fail_all("the model's %d layers do not cut into pp=%d x %d chunk%s = %d equal stages: use pp x virtual dividing %d",
                 L, P->pp, P->v, P->v == 1 ? "" : "s", P->S, L);
    if ((L / P->S) % P->cfg.moe_every != 0)
        fail_all("--moe-every %d with %d layers per stage: a stage must start at a multiple of %d (issue #35: "
                 "stages of whole MoE periods)", P->cfg.moe_every, L / P->S, P->cfg.moe_every);
    P->b = P->per_rank / P->M;
    if (fl->ep_overlap > P->b * P->Tr)
        fail_all("--ep-overlap %d: a microbatch has %d tokens per rank: use at most %d", fl->ep_overlap, P->b * P->Tr,
                 P->b * P->Tr);
    char msg[1024];
    const char* bad = schedule_build(&P->sched, (ScheduleKind)kind, P->pp, P->M, P->v, msg, sizeof(msg));
    if (!bad) bad = schedule_validate(&P->sched, NULL, msg, sizeof(msg));
    if (bad) fail_all("%s", bad);
}

// From each neighbour's list, the messages it sends this rank, in order.
static void incoming_build(ExpertPipe* P) {
    if (P->pp == 1) return;
    int peers[2] = {prev_rank(P), next_rank(P)};
    P->n_in = peers[0] == peers[1] ? 1 : 2;
    for (int i = 0; i < P->n_in; i++) {
        int p = peers[i];
        XpIncoming* in = &P->in[i];
        in->peer = p;
        in->msg = xcalloc((size_t)P->sched.n[p] + 1, sizeof(XpMessage));
        for (int a = 0; a < P->sched.n[p]; a++) {
            Action act = P->sched.list[p][a];
            int k = act.chunk * P->pp + p;
            if (act.type == ACT_F && k < P->S - 1 && (k + 1) % P->pp == P->stage)
                in->msg[in->n++] = (XpMessage){0, act.mb, (k + 1) / P->pp};
            if (act.type == ACT_B && k > 0 && (k - 1) % P->pp == P->stage)
                in->msg[in->n++] = (XpMessage){1, act.mb, (k - 1) / P->pp};
        }
    }
}

// The embedding group of every (dp, ep) coordinate: its stage 0 and stage
// pp-1 (collective over the world; each rank keeps its own).
static void embedding_group(Comm* embed, const Mesh* mesh) {
    memset(embed, 0, sizeof(*embed));
    int pp = mesh->size[AXIS_PP];
    if (pp == 1) return;
    for (int r = 0; r < mesh->world_size; r++) {
        int coord[NUM_AXES], ends[2];
        mesh_coord_of(mesh, r, coord);
        if (coord[AXIS_PP] != 0) continue;
        ends[0] = r;
        coord[AXIS_PP] = pp - 1;
        ends[1] = mesh_rank_at(mesh, coord);
        Comm g;
        comm_create_group_ranks(&g, ends, 2, "embedding");
        if (g.size > 0) *embed = g;
    }
}

// The config of a chunk's model: L / S layers, and the embedding's tables
// only where the chunk uses them (wte on the first and the last, wpe on the
// first). lnf's 2C floats stay on every chunk; a chunk without the head
// keeps no logits in its slots (expert_model_create_part).
static MoeConfig pipe_chunk_config(const MoeConfig* whole, int layers, int embeds, int head) {
    MoeConfig local = *whole;
    local.gpt.num_layers = layers;
    if (!embeds) local.gpt.max_seq_len = 0;
    if (!embeds && !head) local.gpt.vocab_size = local.gpt.padded_vocab_size = 0;
    return local;
}

// Chunk c: virtual stage k = c pp + stage, layers [k L/S, (k+1) L/S), an
// ExpertModel of them (so of B/(dp ep m) sequences), its pieces of the
// whole model, its parameters from the whole model's init or --model FILE.
static void chunk_create(ExpertPipe* P, int c, const ExpertFlags* fl, const float* all_shared, const float* all_experts) {
    XpChunk* ch = &P->chunk[c];
    int L = P->cfg.gpt.num_layers, Lc = L / P->S, C = P->cfg.gpt.channels;
    ch->vstage = c * P->pp + P->stage, ch->first = ch->vstage * Lc;
    int embeds = ch->vstage == 0, head = ch->vstage == P->S - 1;
    MoeConfig local = pipe_chunk_config(&P->cfg, Lc, embeds, head);
    ch->moe0 = 0;
    for (int l = 0; l < ch->first; l++) ch->moe0 += moe_is_moe_layer(&P->cfg, l);
    ch->n_moe = moe_num_moe_layers(&local);
    expert_model_create_part(&ch->m, &local, fl, &P->run_mb, embeds, head);
    // the pieces: [wte wpe] on the first, the blocks, [lnfw lnfb] and the
    // tied copy of wte on the last
    size_t blk_l = moe_block_offset(&local, 0), blk_n = moe_lnf_offset(&local) - blk_l;
    size_t wte_n = param_tensor_numel(&P->cfg.gpt, P_WTE);
    ch->n_pieces = 0;  // in the order of the local buffer
    if (ch->m.embeds) ch->piece[ch->n_pieces++] = (XpPiece){0, 0, blk_l, 0};
    else if (ch->m.has_head) ch->piece[ch->n_pieces++] = (XpPiece){0, 0, wte_n, 1};
    ch->piece[ch->n_pieces++] = (XpPiece){moe_block_offset(&P->cfg, ch->first), blk_l, blk_n, 0};
    if (ch->m.has_head)
        ch->piece[ch->n_pieces++] = (XpPiece){moe_lnf_offset(&P->cfg), moe_lnf_offset(&local), 2 * (size_t)C, 0};
    // the values: the whole model's, piece by piece (the rest zero)
    float* host = xcalloc(ch->m.n_shared, sizeof(float));
    for (int i = 0; i < ch->n_pieces; i++)
        memcpy(host + ch->piece[i].local, all_shared + ch->piece[i].global, ch->piece[i].count * sizeof(float));
    mem_to_device(ch->m.shared, host, ch->m.n_shared * sizeof(float));
    free(host);
    size_t per_layer = (size_t)ch->m.E_local * moe_expert_numel(&P->cfg);
    mem_to_device(ch->m.experts, all_experts + (size_t)ch->moe0 * per_layer, ch->m.n_experts * sizeof(float));
    // the model's own activations are the first slot
    ch->slot = xcalloc((size_t)P->M, sizeof(XpSlot*));  // at most every microbatch in flight
    ch->slot[0] = xcalloc(1, sizeof(XpSlot));
    *ch->slot[0] = (XpSlot){.acts = ch->m.acts, .moe = ch->m.moe, .lse = ch->m.cp.lse, .qkv_h = ch->m.cp.qkv_h,
                            .att_h = ch->m.cp.att_h, .mb = -1, .busy = 0};
    ch->n_slots = 1;
}

static void pipe_create(ExpertPipe* P, Run* run, ExpertFlags* fl, const MoeConfig* cfg) {
    const Mesh* mesh = &run->mesh;
    P->cfg = *cfg;
    P->pp = mesh->size[AXIS_PP], P->stage = mesh->coord[AXIS_PP], P->ppc = &run->axes[AXIS_PP];
    P->B = run->setup.B, P->T = run->setup.T, P->Tr = P->T / mesh->size[AXIS_CP];
    P->per_rank = run->setup.B / (mesh->size[AXIS_DP] * mesh->size[AXIS_EP]);
    P->share = mesh->coord[AXIS_DP] * mesh->size[AXIS_EP] + mesh->coord[AXIS_EP];
    check_and_schedule(P, run, fl);
    P->run_mb = *run;
    P->run_mb.setup.B = run->setup.B / P->M;  // a chunk's model holds one microbatch
    P->run_mb.setup.checkpoint = NULL;        // the parameters come from below
    // the whole model's parameters on the host, then each chunk's pieces
    int ep = mesh->size[AXIS_EP], El = cfg->experts / ep, e0 = mesh->coord[AXIS_EP] * El;
    size_t n_shared = moe_num_shared(cfg), n_exp = (size_t)moe_num_moe_layers(cfg) * El * moe_expert_numel(cfg);
    float* all_shared = xmalloc(n_shared * sizeof(float));
    float* all_experts = xmalloc((n_exp ? n_exp : 1) * sizeof(float));
    if (run->setup.checkpoint) {
        char msg[1024];
        const char* bad = moe_checkpoint_read(run->setup.checkpoint, cfg, all_shared, all_experts, e0, El, msg, sizeof(msg));
        fail_if_any(bad != NULL, bad);
    } else {
        moe_init_shared(all_shared, cfg, (uint64_t)run->args.seed);
        moe_init_experts(all_experts, cfg, e0, El, (uint64_t)run->args.seed);
    }
    for (int c = 0; c < P->v; c++) chunk_create(P, c, fl, all_shared, all_experts);
    free(all_shared);
    free(all_experts);
    embedding_group(&P->embed, mesh);
    incoming_build(P);
    P->max_sends = P->sched.n[P->stage] + P->v + 1;
    P->sends = xcalloc((size_t)P->max_sends, sizeof(XpSend));
    P->routed = xcalloc((size_t)moe_num_moe_layers(cfg) * cfg->experts, sizeof(long));
    P->inputs = xmalloc((size_t)P->per_rank * P->T * sizeof(int));
    P->targets = xmalloc((size_t)P->per_rank * P->T * sizeof(int));
}

static void pipe_free(ExpertPipe* P) {
    for (int c = 0; c < P->v; c++) {
        XpChunk* ch = &P->chunk[c];
        for (int i = 1; i < ch->n_slots; i++) {  // slot 0 is the model's own
            gpt_acts_free(&ch->slot[i]->acts);
            if (ch->m.recompute != RECOMPUTE_FULL) expert_moe_layers_free(&ch->m, ch->slot[i]->moe, ch->n_moe);
            float* cp[] = {ch->slot[i]->lse, ch->slot[i]->qkv_h, ch->slot[i]->att_h};
            for (int j = 0; j < 3; j++)
                if (cp[j]) mem_free(cp[j]);
        }
        slot_use(ch, ch->slot[0]);
        for (int i = 0; i < ch->n_slots; i++) free(ch->slot[i]);
        free(ch->slot);
        expert_model_free(&ch->m);
    }
    for (int i = 0; i < P->n_sends; i++) mem_free(P->sends[i].buf);
    free(P->sends);
    for (int i = 0; i < P->n_in; i++) free(P->in[i].msg);
    if (P->embed.size > 0) comm_destroy_group(&P->embed);
    free(P->routed);
    free(P->inputs);
    free(P->targets);
    schedule_free(&P->sched);
}

// ---------------------------------------------------------------- checkpoints and --save

// This rank's slices of the training state, in the whole model's tensors:
// dp replica 0 writes its stage's pieces (the replicated ones spread over the
// ep ranks, 1/ep each) and its experts; every rank reads its pieces (the tied
// copy of wte too) and its experts. So pp2 resumes on pp1 and back.
static void pipe_ckpt(Ckpt* ck, ExpertPipe* P) {
    static CkptTensor table[MOE_CKPT_TENSORS];
    char variant[256];
    moe_ckpt_tensors(&P->cfg, table);
    moe_ckpt_variant(&P->cfg, variant, sizeof(variant));
    ckpt_set_model(ck, table, MOE_CKPT_TENSORS, variant);
    for (int c = 0; c < P->v; c++) {
        ExpertModel* m = &P->chunk[c].m;
        float* shared[CKPT_NUM_KINDS] = {m->shared, m->m_s, m->v_s};
        float* experts[CKPT_NUM_KINDS] = {m->experts, m->m_e, m->v_e};
        for (int k = 0; k < CKPT_NUM_KINDS; k++) {
            for (int i = 0; i < P->chunk[c].n_pieces; i++) {
                XpPiece pc = P->chunk[c].piece[i];
                size_t per = (pc.count + m->ep - 1) / m->ep, lo = (size_t)m->epc->rank * per;
                if (lo > pc.count) lo = pc.count;
                size_t n = pc.count - lo < per ? pc.count - lo : per;
                if (m->dpcp->rank == 0 && !pc.tied_copy && n > 0)
                    moe_ckpt_add_shared(&ck->own, &P->cfg, (CkptKind)k, pc.global + lo, n, shared[k] + pc.local + lo);
                moe_ckpt_add_shared(&ck->need, &P->cfg, (CkptKind)k, pc.global, pc.count, shared[k] + pc.local);
            }
            if (m->dpcp->rank == 0)
                moe_ckpt_add_expert_layers(&ck->own, &P->cfg, (CkptKind)k, P->chunk[c].moe0, P->chunk[c].n_moe, m->e0,
                                           m->E_local, experts[k]);
            moe_ckpt_add_expert_layers(&ck->need, &P->cfg, (CkptKind)k, P->chunk[c].moe0, P->chunk[c].n_moe, m->e0,
                                       m->E_local, experts[k]);
        }
    }
}

// --save FILE: the whole model, each stage's pieces summed over pp into
// zeros (disjoint pieces: exact), then chapter 7's writer on a model of the
// whole (world rank 0 is stage 0: it writes). Collective.
static void pipe_save(ExpertPipe* P, const char* path) {
    const MoeConfig* cfg = &P->cfg;
    ExpertModel* m0 = &P->chunk[0].m;
    size_t n_shared = moe_num_shared(cfg), per_layer = (size_t)m0->E_local * moe_expert_numel(cfg);
    size_t n_exp = (size_t)moe_num_moe_layers(cfg) * per_layer;
    float* shared = xcalloc(n_shared, sizeof(float));
    float* experts = xcalloc(n_exp ? n_exp : 1, sizeof(float));
    for (int c = 0; c < P->v; c++) {
        XpChunk* ch = &P->chunk[c];
        float* host = xmalloc(ch->m.n_shared * sizeof(float));
        mem_to_host(host, ch->m.shared, ch->m.n_shared * sizeof(float));
        for (int i = 0; i < ch->n_pieces; i++)
            if (!ch->piece[i].tied_copy)
                memcpy(shared + ch->piece[i].global, host + ch->piece[i].local, ch->piece[i].count * sizeof(float));
        free(host);
        mem_to_host(experts + (size_t)ch->moe0 * per_layer, ch->m.experts, ch->m.n_experts * sizeof(float));
    }
    // host floats for the file, not training: plain MPI
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, shared, (int)n_shared, MPI_FLOAT, MPI_SUM, P->ppc->mpi));
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, experts, (int)n_exp, MPI_FLOAT, MPI_SUM, P->ppc->mpi));
    ExpertModel whole = *m0;
    whole.cfg = *cfg;
    whole.n_shared = n_shared, whole.n_experts = n_exp;
    whole.shared = mem_alloc_floats(n_shared, MEM_OTHER);
    whole.experts = mem_alloc_floats(n_exp ? n_exp : 1, MEM_OTHER);
    mem_to_device(whole.shared, shared, n_shared * sizeof(float));
    mem_to_device(whole.experts, experts, n_exp * sizeof(float));
    expert_model_save(&whole, path);
    mem_free(whole.shared);
    mem_free(whole.experts);
    free(shared);
    free(experts);
}

// --show-sharding: each chunk's replicated buffer (its layers, with the
// slots of wte, wpe and lnf a model of its own has) and its experts.
static void pipe_show_sharding(const ExpertPipe* P, int show) {
    if (!show) return;
    ShardTable* t = xcalloc(1, sizeof(ShardTable));
    double f = sizeof(float);
    char name[24], slice[40];
    for (int c = 0; c < P->v; c++) {
        const XpChunk* ch = &P->chunk[c];
        double shared = (double)ch->m.n_shared, experts = (double)ch->m.n_experts;
        int last = ch->first + ch->m.cfg.gpt.num_layers - 1;
        snprintf(name, sizeof(name), "chunk %d: GPT+routers", c);
        snprintf(slice, sizeof(slice), "layers %d..%d%s%s", ch->first, last, ch->m.embeds ? ", embedding" : "",
                 ch->m.has_head ? ", head" : "");
        shard_table_add(t, name, "", "(pp, -)", "(pp, -)", "(pp, -)", slice, f * shared, f * shared, 2 * f * shared);
        snprintf(name, sizeof(name), "chunk %d: experts", c);
        snprintf(slice, sizeof(slice), "experts %d..%d of %d", ch->m.e0, ch->m.e0 + ch->m.E_local - 1, P->cfg.experts);
        shard_table_add(t, name, "(Lm, E, ...)", "(pp, ep, -)", "(pp, ep, -)", "(pp, ep, -)", slice, f * experts,
                        f * experts, 2 * f * experts);
    }
    char title[64];
    snprintf(title, sizeof(title), "chapter 7, pp=%d x %d chunk%s, ep=%d, dp=%d", P->pp, P->v, P->v == 1 ? "" : "s",
             P->chunk[0].m.ep, P->chunk[0].m.dp->size);
    shard_table_show(t, show, title);
    free(t);
}

// ---------------------------------------------------------------- the loop

int expert_pipe_wanted(const Run* run, const ExpertFlags* flags) {
    return run->mesh.size[AXIS_PP] > 1 || flags->microbatches != ARG_NOT_GIVEN || flags->virtual_chunks != 1;
}

int expert_pipe_train(Run* run, ExpertFlags* fl, const MoeConfig* cfg, ExpertForward forward, ExpertBackward backward) {
    static ExpertPipe P;  // the chunks' models point into P.run_mb
    memset(&P, 0, sizeof(P));
    P.forward = forward, P.backward = backward;
    const TrainArgs* args = &run->args;
    const TrainSetup* setup = &run->setup;
    pipe_create(&P, run, fl, cfg);
    const Mesh* mesh = &run->mesh;
    ExpertModel* m0 = &P.chunk[0].m;
    print0("chapter 7: experts in a pipeline, dp=%d x ep=%d x pp=%d, schedule %s, %d microbatch%s of %d sequence%s per "
           "rank, %d chunk%s of %d layer%s per pp rank; %d expert%s (%d per rank), top-%d, %s, device %s\n",
           mesh->size[AXIS_DP], mesh->size[AXIS_EP], P.pp, P.sched_name, P.M, P.M == 1 ? "" : "es", P.b,
           P.b == 1 ? "" : "s", P.v, P.v == 1 ? "" : "s", cfg->gpt.num_layers / P.S, cfg->gpt.num_layers / P.S == 1 ? "" : "s",
           cfg->experts, cfg->experts == 1 ? "" : "s", m0->E_local, cfg->top_k,
           m0->capacity_factor > 0 ? "capacity mode per microbatch" : "dropless", run->device);
    size_t total = moe_num_shared(cfg) + (size_t)moe_num_moe_layers(cfg) * cfg->experts * moe_expert_numel(cfg);
    print0("model %s: %zu parameters; global batch %d x %d\n", setup->model_name, total, setup->B, setup->T);
    pipe_show_sharding(&P, args->show_sharding);  // --show-sharding
    Ckpt ck;
    ckpt_init(&ck, args, setup, mesh, 7);
    pipe_ckpt(&ck, &P);
    ckpt_resume(&ck);

    TrainLoop loop;
    train_loop_begin(&loop, run, &(TrainLoopSpec){
        .chapter = 7, .num_params = total, .flops_per_token = moe_flops_per_token(cfg, setup->T),
        .rows = P.per_rank, .val_loss = val_loss, .ctx = &P, .ckpt = &ck});
    for (int step = loop.start; step < loop.steps; step++) {
        load_microbatches(&P, &setup->train, step);
        float norm, loss = train_step(&P, args, step, &norm);
        step_record(&P, &loop);
        train_loop_step(&loop, step, loss, norm);
    }
    JsonBuf summary = {0};
    m0->dropped_total = P.dropped_total;
    expert_report(m0, fl, &loop, &summary);
    json_add_string(&summary, "schedule", P.sched_name);
    json_add_int(&summary, "microbatches", P.M);
    json_add_int(&summary, "virtual", P.v);
    json_add_int(&summary, "peak_slots", P.peak_slots);
    train_loop_end(&loop, &summary);
    json_free(&summary);
    train_sample_with(args, &cfg->gpt, P.T, next_logits, &P);  // --sample: every rank runs each forward
    if (args->save) pipe_save(&P, args->save);
    pipe_free(&P);
    run_finish(run);
    return 0;
}
