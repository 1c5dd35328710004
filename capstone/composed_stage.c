// composed_stage.c: what a rank of the capstone's pipeline owns
// (composed_pipe.h), with or without the pipeline (one chunk): set up,
// checkpointed, freed.
#include "composed_pipe.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "errors.h"
#include "memory.h"
#include "mesh.h"
#include "rank.h"
#include "sharding.h"
#include "run.h"

// ---------------------------------------------------------------- the chunks and the links

// A chunk's config: its layers, and the embedding's tables only where it
// uses them (wte on the first and the last, wpe on the first).
static MoeConfig pipe_chunk_config(const MoeConfig* whole, int first, int layers, int embeds, int head) {
    MoeConfig local = *whole;
    local.gpt.num_layers = layers;
    local.first_layer = first;  // MoE or dense as the whole model's layers (moe.h), wherever the chunk starts
    if (!embeds) local.gpt.max_seq_len = 0;
    if (!embeds && !head) local.gpt.vocab_size = local.gpt.padded_vocab_size = 0;
    return local;
}

// A chunk's pieces of the whole model's replicated buffer (chapter 5's
// Piece): [wte wpe] on the first, the blocks, [lnfw lnfb] and the tied copy
// of wte on the last. lnf's slot off the last chunk is no piece (unread).
static int chunk_pieces(Piece* piece, const MoeConfig* whole, const MoeConfig* local, int first, int embeds, int head) {
    size_t blk_l = moe_block_offset(local, 0), blk_n = moe_lnf_offset(local) - blk_l;
    size_t wte_n = param_tensor_numel(&whole->gpt, P_WTE);
    int n = 0;  // in the order of the local buffer
    if (embeds) piece[n++] = (Piece){.count = blk_l};
    else if (head) piece[n++] = (Piece){.count = wte_n, .tied_copy = 1};
    piece[n++] = (Piece){.global = moe_block_offset(whole, first), .count = blk_n, .local = blk_l};
    if (head)
        piece[n++] = (Piece){.global = moe_lnf_offset(whole), .count = 2 * (size_t)whole->gpt.channels,
                             .local = moe_lnf_offset(local)};
    return n;
}

// Chunk c: virtual stage c pp + stage, an ExpertModel of its layers,
// its pieces and its pool of slots. Its values counter-based, each from its
// place in the whole model: only what this rank holds.
static void chunk_create(ExpertPipe* P, int c, const ExpertFlags* fl) {
    ExpertModel* m = &P->chunk[c];
    int vstage = c * P->pp + P->stage, embeds = vstage == 0, head = vstage == P->S - 1;
    LayerRange lr = stage_layers(P->cfg.gpt.num_layers, P->S, vstage);  // chapter 5's split (even here)
    MoeConfig local = pipe_chunk_config(&P->cfg, lr.first, lr.count, embeds, head);
    expert_model_create(m, &local, fl, &P->run_mb, embeds, head);
    for (int l = 0; l < lr.first; l++) m->moe0 += moe_is_moe_layer(&P->cfg, l);  // after create's memset
    m->n_pieces = chunk_pieces(m->piece, &P->cfg, &m->cfg, lr.first, embeds, head);
    uint64_t seed = (uint64_t)P->run_mb.args.seed;
    float* host = xcalloc(m->n_shared > m->n_experts ? m->n_shared : m->n_experts, sizeof(float));
    for (int i = 0; i < m->n_pieces; i++)
        moe_init_shared(host + m->piece[i].local, &P->cfg, m->piece[i].global, m->piece[i].count, seed);
    zero_buffer_put(&m->z[ZERO_SHARED], host);
    if (m->tp.tp > 1) expert_tp_init(m, &P->cfg.gpt, seed);
    moe_init_experts(host, &P->cfg, lr.first, lr.count, m->e0, m->E_local, seed);
    zero_buffer_put(&m->z[ZERO_EXPERTS], host);
    free(host);
    expert_model_units(m);  // --zero: the engines take the values
    m->split = P->sched.split_backward;  // zb: B and W (composed_wgrad.c)
    slot_pool_create(&m->pool, P->M);  // at most every microbatch in flight (composed_pipe.c makes them)
    // the last stage's copy of wte: its gradient is stage 0's, counted there in the norm
    if (head && !embeds) m->z[ZERO_SHARED].tied = param_tensor_numel(&P->cfg.gpt, P_WTE);
}

// Every rank builds and checks every rank's list (chapter 5's), makes its
// chunks, the embedding group and its links. Collective.
static void stage_create(ExpertPipe* P, Run* run, ExpertFlags* fl, const MoeConfig* cfg) {
    const Mesh* mesh = &run->mesh;
    P->cfg = *cfg;
    P->cfg.tp = mesh->size[AXIS_TP];  // the whole model's shared layout as the chunks hold it (moe.h: without the tp slices)
    P->pp = mesh->size[AXIS_PP], P->stage = mesh->coord[AXIS_PP];
    P->B = run->setup.B, P->T = run->setup.T, P->Tr = P->T / mesh->size[AXIS_CP];
    // the schedule's lists (chapter 5's, built and checked by every rank;
    // expert_config refused every bad layout already)
    int kind = schedule_parse(fl->schedule);  // without the pipeline 1f1b (expert_config): one F, one B
    P->sched_name = schedule_name((ScheduleKind)kind);
    P->M = fl->microbatches == ARG_NOT_GIVEN ? P->pp : fl->microbatches;
    P->v = fl->virtual_chunks, P->S = P->pp * P->v;
    pipe_schedule_make(&P->sched, (ScheduleKind)kind, P->pp, P->M, P->v, NULL);
    P->run_mb = *run;
    P->run_mb.setup.B = run->setup.B / P->M;  // a chunk's model holds one microbatch
    for (int c = 0; c < P->v; c++) chunk_create(P, c, fl);
    // my sequences of a microbatch, and my share's place in the batch (expert_model_create's)
    P->b = P->chunk[0].B, P->share = P->chunk[0].share, P->per_rank = P->b * P->M;
    P->total = moe_num_params(cfg);
    // what a rank shares with its neighbours and keeps for a step (chapter 5's)
    pipe_embedding_group(&P->embed, mesh);
    pipe_link_create(&P->link, &P->sched, &run->axes[AXIS_PP], act_floats(P));  // from every rank's lists
    P->routed = xcalloc((size_t)moe_num_moe_layers(cfg) * cfg->experts, sizeof(long));
    P->inputs = xmalloc((size_t)P->per_rank * P->T * sizeof(int));
    P->targets = xmalloc((size_t)P->per_rank * P->T * sizeof(int));
}

// ---------------------------------------------------------------- checkpoints and --save

// This rank's slices of the training state in the MoE model's global
// tensors (moe.h), so that nothing is written twice and every rank reads
// what it holds: each of a chunk's buffers through chapter 3's
// zero_buffer_ckpt, which spreads the writing over the buffer's copies
// (under --zero: the engine's shards). A chunk's buffers are its pieces of
// the replicated floats (the tied wte read, not written), its MoE layers'
// experts, its layers' tp slices. So any mesh resumes any other; E = 1,
// H = 4C is the dense GPT's checkpoint (chapter 0 resumes it).
typedef struct {
    const ExpertPipe* P;
    const ExpertModel* m;  // the chunk
    int b;
} ChunkBuffer;

// Units [u0, u0 + nu) of buffer b (zero_buffer.h's ZeroBufferSlices): a
// range of the replicated floats cut by the chunk's pieces, MoE layers of
// experts, layers of tp slices.
static void unit_slices(void* ctx, CkptList* out, int write, CkptKind kind, int u0, int nu, float* data) {
    const ChunkBuffer* cb = ctx;
    const ExpertModel* m = cb->m;
    const MoeConfig* cfg = &cb->P->cfg;
    if (cb->b == ZERO_SHARED) {  // the floats [a, e) of the chunk's buffer, piece by piece
        size_t a = m->z[cb->b].unit_off[u0], e = m->z[cb->b].unit_off[u0 + nu];
        for (int k = 0; k < m->n_pieces; k++) {
            Piece pc = m->piece[k];
            size_t lo = pc.local > a ? pc.local : a, hi = pc.local + pc.count < e ? pc.local + pc.count : e;
            if (lo < hi && !(write && pc.tied_copy))
                moe_ckpt_add_shared(out, cfg, kind, pc.global + (lo - pc.local), hi - lo, data + (lo - a));
        }
    }
    if (cb->b == ZERO_EXPERTS) moe_ckpt_add_expert_layers(out, cfg, kind, m->moe0 + u0, nu, m->e0, m->E_local, data);
    if (cb->b == ZERO_TP) expert_tp_ckpt_add(out, m, kind, u0, nu, data);
}

// What this rank writes (own) and reads (need) of the training state: each of its chunks' buffers.
static void stage_slices(const ExpertPipe* P, CkptList* own, CkptList* need) {
    for (int c = 0; c < P->v; c++)
        for (int b = 0; b < P->chunk[c].nz; b++) {
            ChunkBuffer cb = {P, &P->chunk[c], b};
            zero_buffer_ckpt(own, need, &P->chunk[c].z[b], unit_slices, &cb);
        }
}

// --model FILE (save 0) or --save FILE (save 1): chapter 7's, through this
// rank's checkpoint slices: the whole model's file at tp = 1, whatever the
// mesh (moe_model.h). Collective.
static void stage_file(ExpertPipe* P, const char* path, int save) {
    MoeConfig whole = P->cfg;
    whole.tp = 1;  // the file's layout
    const ExpertModel* m = &P->chunk[0];
    CkptList own = {0}, need = {0};
    stage_slices(P, &own, &need);
    if (save) moe_model_save_slices(path, &whole, m->world, &own, (uint64_t)P->run_mb.args.seed);
    else moe_model_read_slices(path, &whole, m->e0, m->E_local, &need);
    ckpt_list_free(&own), ckpt_list_free(&need);
}

// --show-sharding: each chunk's buffers, a row each (chapter 3's
// zero_buffer_sharding), then the ZeRO engine's rows.
static void show_sharding(const ExpertPipe* P, int show) {
    if (!show) return;
    ShardTable* t = xcalloc(1, sizeof(ShardTable));
    const ExpertModel* m0 = &P->chunk[0];
    int pp = P->pp > 1;  // an axis of one rank keeps the dimension whole: "-"
    char name[96], slice[96], chunk[24];  // fit any int
    for (int c = 0; c < P->v; c++) {
        const ExpertModel* m = &P->chunk[c];
        int first = m->cfg.first_layer, last = first + m->cfg.gpt.num_layers - 1, NH = m->cfg.gpt.num_heads;
        snprintf(chunk, sizeof(chunk), "chunk %d: ", c);
        if (P->v == 1) chunk[0] = '\0';  // a chunk named when a rank has several
        snprintf(name, sizeof(name), "%sGPT + routers", chunk);
        snprintf(slice, sizeof(slice), "layers %d..%d%s%s", first, last, m->embeds ? ", embedding" : "",
                 m->has_head ? ", head" : "");
        zero_buffer_sharding(t, &m->z[ZERO_SHARED], name, "", pp ? "(pp, -)" : "(-, -)", "batch", slice);
        snprintf(name, sizeof(name), "%sexperts", chunk);
        snprintf(slice, sizeof(slice), "experts %d..%d of %d", m->e0, m->e0 + m->E_local - 1, m->cfg.experts);
        zero_buffer_sharding(t, &m->z[ZERO_EXPERTS], name, "(Lm, E, ...)", pp ? "(pp, ep, -)" : "(-, ep, -)", "dpcp",
                             slice);
        if (m->tp.tp > 1) {  // qkvw, qkvb by rows (my heads' q, k, v), attprojw by columns; a dense fc likewise
            int h0 = m->tp.rank * NH / m->tp.tp, h1 = (m->tp.rank + 1) * NH / m->tp.tp - 1;
            snprintf(name, sizeof(name), "%sqkv, attproj%s", chunk, m->cfg.moe_every > 1 ? ", fc, fcproj" : "");
            snprintf(slice, sizeof(slice), "layers %d..%d, heads %d..%d", first, last, h0, h1);
            zero_buffer_sharding(t, &m->z[ZERO_TP], name, "(L, ...)", pp ? "(pp, tp, -)" : "(-, tp, -)", "dpcpep",
                                 slice);
        }
    }
    for (int c = 0; c < P->v; c++)
        for (int b = 0; b < P->chunk[c].nz; b++) zero_buffer_sharding_engine(t, &P->chunk[c].z[b]);
    char title[80];
    snprintf(title, sizeof(title), "chapter 7, pp=%d x %d chunk%s, ep=%d, dp=%d, tp=%d", P->pp, P->v, P->v == 1 ? "" : "s",
             m0->ep, m0->dp->size, m0->tp.tp);
    shard_table_show(t, show, title);
    free(t);
}

// ---------------------------------------------------------------- set-up and the end

// The set-up's lines: chapter 7's, then one per other axis in use.
static void print_setup(const ExpertPipe* P, const Run* run) {
    const MoeConfig* c = &P->cfg;
    const ExpertModel* m = &P->chunk[0];
    int ndp = run->mesh.size[AXIS_DP], nep = run->mesh.size[AXIS_EP], Lc = c->gpt.num_layers / P->S;
    moe_print_setup(c, ndp, nep, m->E_local, m->moe.capacity_factor, P->total, P->per_rank, run);  // chapter 7's two lines
    if (P->S * P->M > 1)
        print0("pipeline: pp=%d, schedule %s, %d microbatch%s of %d sequence%s per rank, %d chunk%s of %d layer%s per pp "
               "rank; routing statistics and capacity per microbatch\n", P->pp, P->sched_name, P->M,
               P->M == 1 ? "" : "es", P->b, P->b == 1 ? "" : "s", P->v, P->v == 1 ? "" : "s", Lc, Lc == 1 ? "" : "s");
    if (m->tp.tp > 1)
        print0("tensor parallelism: tp=%d with sequence parallelism: each rank holds %d of its tp group's %d sequences "
               "and %d of the %d heads (1/%d of qkvw, qkvb, attprojw%s); the experts whole on every tp rank\n",
               m->tp.tp, P->per_rank, P->per_rank * m->tp.tp, c->gpt.num_heads / m->tp.tp, c->gpt.num_heads, m->tp.tp,
               c->moe_every > 1 ? ", and of a dense layer's fcw, fcb, fcprojw" : "");
    static const char* what[] = {"", "the AdamW moments", "the AdamW moments and the gradients (a unit per layer)",
                                 "the AdamW moments, the gradients and the parameters (a unit per layer)"};
    size_t moments = 0;  // every chunk's buffers' shards
    for (int k = 0; k < P->v; k++)
        for (int b = 0; b < P->chunk[k].nz; b++) moments += 2 * P->chunk[k].z[b].S;
    if (m->zero)  // --zero (zero_buffer.h)
        print0("ZeRO-%d: %s sharded over each buffer's copies: the replicated parameters over %d ranks, the experts "
               "over %d%s; %zu floats of moments a rank\n", m->zero, what[m->zero], m->z[ZERO_SHARED].g->size,
               m->z[ZERO_EXPERTS].g->size, m->nz > 2 ? ", the tp slices over the dp x cp x ep ranks" : "", moments);
    const CPShard* sh = &m->cp.sh;
    if (sh->cp > 1)
        print0("context parallelism: cp=%d, %s, balance %s: each rank holds %d of the %d positions of its %d sequences "
               "(dp=%d x cp=%d x ep=%d ranks)\n", sh->cp, cp_mode_names[m->cp.mode], sh->parts == 2 ? "zigzag" : "none",
               m->T, sh->T, P->per_rank, ndp, sh->cp, nep);
}

void expert_pipe_create(ExpertPipe* P, Run* run, ExpertFlags* fl, const MoeConfig* cfg, Ckpt* ck) {
    memset(P, 0, sizeof(*P));
    stage_create(P, run, fl, cfg);
    if (run->setup.checkpoint) stage_file(P, run->setup.checkpoint, 0);  // --model FILE
    print_setup(P, run);
    show_sharding(P, run->args.show_sharding);
    // --ckpt-dir, --resume: this rank's slices, from whatever mesh saved them: the whole
    // model's tensors and routing settings (every chunk routes under the same flags)
    ckpt_init(ck, &run->args, &run->setup, &run->mesh, 7);
    moe_ckpt_model(ck, &P->cfg, P->chunk[0].moe.capacity_factor, P->chunk[0].moe.aux_coef);
    stage_slices(P, &ck->own, &ck->need);
    ckpt_resume(ck);
}

void expert_pipe_finish(ExpertPipe* P, const TrainArgs* args) {
    if (args->save) stage_file(P, args->save, 1);
    for (int c = 0; c < P->v; c++) {
        ExpertModel* m = &P->chunk[c];
        for (int i = 0; i < m->pool.n; i++) expert_slot_free(m, m->pool.s[i]);
        slot_pool_free(&m->pool);
        expert_model_free(m);
    }
    pipe_link_free(&P->link);
    if (P->embed.size > 0) comm_destroy_group(&P->embed);
    free(P->routed);
    free(P->inputs);
    free(P->targets);
    schedule_free(&P->sched);
    free(P);
}
