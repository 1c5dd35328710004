// composed_stage.c: what a rank of the capstone's pipeline owns
// (composed_stage.h), with or without the pipeline (one chunk).
#include "composed_stage.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "errors.h"
#include "memory.h"
#include "mesh.h"
#include "sharding.h"
#include "run.h"

// ---------------------------------------------------------------- set-up

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

// Chunk c: virtual stage k = c pp + stage, an ExpertModel of its layers,
// its pieces and its pool of slots. Its values counter-based, each from its
// place in the whole model: only what this rank holds.
static void chunk_create(ExpertPipe* P, int c, const ExpertFlags* fl) {
    XpChunk* ch = &P->chunk[c];
    ch->vstage = c * P->pp + P->stage;
    LayerRange lr = stage_layers(P->cfg.gpt.num_layers, P->S, ch->vstage);  // chapter 5's split (even here)
    int embeds = ch->vstage == 0, head = ch->vstage == P->S - 1;
    ch->first = lr.first;
    MoeConfig local = pipe_chunk_config(&P->cfg, ch->first, lr.count, embeds, head);
    for (int l = 0; l < ch->first; l++) ch->moe0 += moe_is_moe_layer(&P->cfg, l);
    ch->n_moe = moe_num_moe_layers(&local);
    expert_model_create(&ch->m, &local, fl, &P->run_mb, embeds, head);
    ExpertModel* m = &ch->m;
    ch->n_pieces = chunk_pieces(ch->piece, &P->cfg, &m->cfg, ch->first, embeds, head);
    uint64_t seed = (uint64_t)P->run_mb.args.seed;
    float* host = xcalloc(m->n_shared > m->n_experts ? m->n_shared : m->n_experts, sizeof(float));
    for (int i = 0; i < ch->n_pieces; i++)
        moe_init_shared(host + ch->piece[i].local, &P->cfg, ch->piece[i].global, ch->piece[i].count, seed);
    zero_buffer_put(&m->z[ZERO_SHARED], host);
    if (m->tp.tp > 1) expert_tp_init(m, &P->cfg.gpt, seed);
    moe_init_experts(host, &P->cfg, ch->first, lr.count, m->e0, m->E_local, seed);
    zero_buffer_put(&m->z[ZERO_EXPERTS], host);
    free(host);
    expert_model_units(m);  // --zero: the engines take the values
    m->split = P->sched.split_backward;  // zb: B and W (composed_wgrad.c)
    slot_pool_create(&ch->pool, P->M);  // at most every microbatch in flight (composed_pipe.c makes them)
    // the last stage's copy of wte: its gradient is stage 0's, counted there in the norm
    if (head && !embeds) ch->m.z[ZERO_SHARED].tied = param_tensor_numel(&P->cfg.gpt, P_WTE);
}

void expert_stage_create(ExpertPipe* P, Run* run, ExpertFlags* fl, const MoeConfig* cfg) {
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
    P->b = P->chunk[0].m.B, P->share = P->chunk[0].m.share, P->per_rank = P->b * P->M;
    P->total = moe_num_params(cfg);
    // what a rank shares with its neighbours and keeps for a step (chapter 5's)
    pipe_embedding_group(&P->embed, mesh);
    pipe_link_create(&P->link, &P->sched, &run->axes[AXIS_PP], act_floats(P));  // from every rank's lists
    P->routed = xcalloc((size_t)moe_num_moe_layers(cfg) * cfg->experts, sizeof(long));
    P->inputs = xmalloc((size_t)P->per_rank * P->T * sizeof(int));
    P->targets = xmalloc((size_t)P->per_rank * P->T * sizeof(int));
}

void expert_stage_free(ExpertPipe* P) {
    for (int c = 0; c < P->v; c++) {
        XpChunk* ch = &P->chunk[c];
        for (int i = 0; i < ch->pool.n; i++) expert_slot_free(&ch->m, ch->pool.s[i]);
        slot_pool_free(&ch->pool);
        expert_model_free(&ch->m);
    }
    pipe_link_free(&P->link);
    if (P->embed.size > 0) comm_destroy_group(&P->embed);
    free(P->routed);
    free(P->inputs);
    free(P->targets);
    schedule_free(&P->sched);
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
    const XpChunk* ch;
    int b;
} ChunkBuffer;

// Units [u0, u0 + nu) of buffer b (zero_buffer.h's ZeroBufferSlices): a
// range of the replicated floats cut by the chunk's pieces, MoE layers of
// experts, layers of tp slices.
static void unit_slices(void* ctx, CkptList* out, int write, CkptKind kind, int u0, int nu, float* data) {
    const ChunkBuffer* cb = ctx;
    const XpChunk* ch = cb->ch;
    const ExpertModel* m = &ch->m;
    const MoeConfig* cfg = &cb->P->cfg;
    if (cb->b == ZERO_SHARED) {  // the floats [a, e) of the chunk's buffer, piece by piece
        size_t a = m->z[cb->b].unit_off[u0], e = m->z[cb->b].unit_off[u0 + nu];
        for (int k = 0; k < ch->n_pieces; k++) {
            Piece pc = ch->piece[k];
            size_t lo = pc.local > a ? pc.local : a, hi = pc.local + pc.count < e ? pc.local + pc.count : e;
            if (lo < hi && !(write && pc.tied_copy))
                moe_ckpt_add_shared(out, cfg, kind, pc.global + (lo - pc.local), hi - lo, data + (lo - a));
        }
    }
    if (cb->b == ZERO_EXPERTS) moe_ckpt_add_expert_layers(out, cfg, kind, ch->moe0 + u0, nu, m->e0, m->E_local, data);
    if (cb->b == ZERO_TP) expert_tp_ckpt_add(out, m, kind, u0, nu, data);
}

// What this rank writes (own) and reads (need) of the training state: each of its chunks' buffers.
static void stage_slices(const ExpertPipe* P, CkptList* own, CkptList* need) {
    for (int c = 0; c < P->v; c++)
        for (int b = 0; b < P->chunk[c].m.nz; b++) {
            ChunkBuffer cb = {P, &P->chunk[c], b};
            zero_buffer_ckpt(own, need, &P->chunk[c].m.z[b], unit_slices, &cb);
        }
}

void expert_stage_ckpt(Ckpt* ck, ExpertPipe* P) {
    // the whole model's tensors and routing settings (every chunk routes under the same flags)
    moe_ckpt_model(ck, &P->cfg, P->chunk[0].m.moe.capacity_factor, P->chunk[0].m.moe.aux_coef);
    stage_slices(P, &ck->own, &ck->need);
}

// The whole model's file at tp = 1, whatever the mesh (moe_model.h).
void expert_stage_file(ExpertPipe* P, const char* path, int save) {
    MoeConfig whole = P->cfg;
    whole.tp = 1;  // the file's layout
    const ExpertModel* m = &P->chunk[0].m;
    CkptList own = {0}, need = {0};
    stage_slices(P, &own, &need);
    if (save) moe_model_save_slices(path, &whole, m->world, &own, (uint64_t)P->run_mb.args.seed);
    else moe_model_read_slices(path, &whole, m->e0, m->E_local, &need);
    ckpt_list_free(&own), ckpt_list_free(&need);
}

// --show-sharding: each chunk's buffers, a row each (chapter 3's
// zero_buffer_sharding), then the ZeRO engine's rows.
void expert_stage_show_sharding(const ExpertPipe* P, int show) {
    if (!show) return;
    ShardTable* t = xcalloc(1, sizeof(ShardTable));
    const ExpertModel* m0 = &P->chunk[0].m;
    int pp = P->pp > 1;  // an axis of one rank keeps the dimension whole: "-"
    char name[96], slice[96], chunk[24];  // fit any int
    for (int c = 0; c < P->v; c++) {
        const XpChunk* ch = &P->chunk[c];
        const ExpertModel* m = &ch->m;
        int last = ch->first + m->cfg.gpt.num_layers - 1, NH = m->cfg.gpt.num_heads;
        snprintf(chunk, sizeof(chunk), "chunk %d: ", c);
        if (P->v == 1) chunk[0] = '\0';  // a chunk named when a rank has several
        snprintf(name, sizeof(name), "%sGPT + routers", chunk);
        snprintf(slice, sizeof(slice), "layers %d..%d%s%s", ch->first, last, m->embeds ? ", embedding" : "",
                 m->has_head ? ", head" : "");
        zero_buffer_sharding(t, &m->z[ZERO_SHARED], name, "", pp ? "(pp, -)" : "(-, -)", "batch", slice);
        snprintf(name, sizeof(name), "%sexperts", chunk);
        snprintf(slice, sizeof(slice), "experts %d..%d of %d", m->e0, m->e0 + m->E_local - 1, m->cfg.experts);
        zero_buffer_sharding(t, &m->z[ZERO_EXPERTS], name, "(Lm, E, ...)", pp ? "(pp, ep, -)" : "(-, ep, -)", "dpcp",
                             slice);
        if (m->tp.tp > 1) {  // qkvw, qkvb by rows (my heads' q, k, v), attprojw by columns; a dense fc likewise
            int h0 = m->tp.rank * NH / m->tp.tp, h1 = (m->tp.rank + 1) * NH / m->tp.tp - 1;
            snprintf(name, sizeof(name), "%sqkv, attproj%s", chunk, m->cfg.moe_every > 1 ? ", fc, fcproj" : "");
            snprintf(slice, sizeof(slice), "layers %d..%d, heads %d..%d", ch->first, last, h0, h1);
            zero_buffer_sharding(t, &m->z[ZERO_TP], name, "(L, ...)", pp ? "(pp, tp, -)" : "(-, tp, -)", "dpcpep",
                                 slice);
        }
    }
    for (int c = 0; c < P->v; c++)
        for (int b = 0; b < P->chunk[c].m.nz; b++) zero_buffer_sharding_engine(t, &P->chunk[c].m.z[b]);
    char title[80];
    snprintf(title, sizeof(title), "chapter 7, pp=%d x %d chunk%s, ep=%d, dp=%d, tp=%d", P->pp, P->v, P->v == 1 ? "" : "s",
             m0->ep, m0->dp->size, m0->tp.tp);
    shard_table_show(t, show, title);
    free(t);
}
