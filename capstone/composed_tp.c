// composed_tp.c: --tp's parameters: a rank's slices of every layer's qkvw,
// qkvb, attprojw (and a dense layer's fcw, fcb, fcprojw) as chapter 4's
// tiles (tp.h), made counter-based and named to the checkpoint; a layer's
// parameters with them. What runs on them is composed_attention.c's.
#include <stdlib.h>
#include <string.h>

#include "errors.h"
#include "composed_model.h"
#include "memory.h"
#include "mesh.h"
#include "run.h"
#include "tp.h"  // chapter 4's tiles

// ---------------------------------------------------------------- the parameters of a layer

// w: layer l's slices (its unit of the tp buffer; moe.h's layout).
static BlockParams with_slices(const ExpertModel* m, int l, BlockParams p, float* w) {
    return m->tp.tp == 1 ? p : moe_tp_params(&m->cfg, p, w, l, m->tp.tp);
}

// Layer l is unit 1 + l of the replicated buffer and unit l of the tp slices
// (zero_buffer.h): with --zero 3 the gathered copies.
BlockParams expert_block_params(ExpertModel* m, int l) {
    BlockParams p = moe_block_params_in(&m->cfg, zero_buffer_params(&m->z[ZERO_SHARED], 1 + l), l);
    return with_slices(m, l, p, m->tp.tp > 1 ? zero_buffer_params(&m->z[ZERO_TP], l) : NULL);
}

BlockParams expert_block_grads(ExpertModel* m, int l) {
    BlockParams g = moe_block_params_in(&m->cfg, zero_buffer_grads(&m->z[ZERO_SHARED], 1 + l), l);
    return with_slices(m, l, g, m->tp.tp > 1 ? zero_buffer_grads(&m->z[ZERO_TP], l) : NULL);
}

float* expert_router(ExpertModel* m, int l) {
    return moe_router_in(&m->cfg, zero_buffer_params(&m->z[ZERO_SHARED], 1 + l));
}

float* expert_router_grad(ExpertModel* m, int l) {
    return moe_router_in(&m->cfg, zero_buffer_grads(&m->z[ZERO_SHARED], 1 + l));
}

// ---------------------------------------------------------------- the whole model and my slices

// Tp rank `rank`'s slices as chapter 4's tiles: each layer's split tiles in
// chapter 4's order, packed (moe_tp_params's layout; an MoE layer's MLP is
// its experts: no tiles). Returns their number; *tiles to free.
static int slice_tiles(const ExpertModel* m, int rank, Tile** tiles) {
    const GPTConfig* g = &m->cfg.gpt;
    int per = tp_block_tiles(g, m->tp.tp, rank, 0, NULL), n = 0;
    Tile* block = xmalloc(sizeof(Tile) * (size_t)per);
    *tiles = xmalloc(sizeof(Tile) * (size_t)per * (size_t)g->num_layers);
    size_t off = 0;
    for (int l = 0; l < g->num_layers; l++) {
        tp_block_tiles(g, m->tp.tp, rank, l, block);
        for (int i = 0; i < per; i++) {
            Tile t = block[i];
            int mlp = t.t == P_FCW || t.t == P_FCB || t.t == P_FCPROJW;
            if (t.replicated || (mlp && moe_is_moe_layer(&m->cfg, l))) continue;
            t.off = off;
            off += t.nrows * t.ncols;
            (*tiles)[n++] = t;
        }
    }
    free(block);
    CHECK(off == m->tp.n, "the tp slices' tiles and layout disagree");
    return n;
}

void expert_tp_init(ExpertModel* m, const GPTConfig* whole, uint64_t seed) {
    Tile* tiles;
    int n = slice_tiles(m, m->tp.rank, &tiles);
    for (int i = 0; i < n; i++) tiles[i].layer += m->cfg.first_layer;  // a chunk's layers in the whole model
    float* w = xmalloc(m->tp.n * sizeof(float));
    tp_tiles_fill(whole, tiles, n, 0, m->tp.n, NULL, seed, w, NULL, 0);  // chapter 4's
    zero_buffer_put(&m->z[ZERO_TP], w);
    free(w);
    free(tiles);
}

// Chapter 4's tp_tiles_ckpt_add, once each tile names the layer moe.h's
// tensors index: a dense layer's MLP among the dense layers (in the dense
// form by its layer).
void expert_tp_ckpt_add(CkptList* out, const ExpertModel* m, CkptKind kind, int l0, int n, float* data) {
    const MoeConfig* c = &m->cfg;
    Tile* tiles;
    int nt = slice_tiles(m, m->tp.rank, &tiles);
    for (int i = 0; i < nt; i++) {
        int layer = c->first_layer + tiles[i].layer;
        tiles[i].layer = tiles[i].t >= P_FCW && !moe_ckpt_dense(c) ? layer - layer / c->moe_every : layer;
    }
    tp_tiles_ckpt_add(out, &c->gpt, tiles, nt, kind, moe_tp_offset(c, l0, m->tp.tp), moe_tp_offset(c, l0 + n, m->tp.tp),
                      data, 0);
    free(tiles);
}

// ---------------------------------------------------------------- buffers

void expert_tp_create(ExpertModel* m, const Run* run) {
    ExpertTP* t = &m->tp;
    const Mesh* mesh = &run->mesh;
    t->tp = mesh->size[AXIS_TP], t->rank = mesh->coord[AXIS_TP], t->tpc = &run->axes[AXIS_TP];
    t->sh = m->cp.sh;
    t->sh.B = m->B * t->tp;  // attention sees the group's sequences
    if (t->tp == 1) return;
    // named by its axes in the summary, cp only with --cp (as the batch group)
    unsigned cp = mesh->size[AXIS_CP] > 1 ? 1u << AXIS_CP : 0u;
    comm_create_group(&t->dpcpep_own, mesh, (1u << AXIS_DP) | cp | (1u << AXIS_EP));
    t->dpcpep = &t->dpcpep_own;
    const int C = m->cfg.gpt.channels;
    t->n = moe_tp_offset(&m->cfg, m->cfg.gpt.num_layers, t->tp);
    zero_buffer_alloc(&m->z[ZERO_TP], m->zero, t->dpcpep, t->n);  // --zero: zero_buffer.h
    t->full = mem_alloc_floats((size_t)m->N * t->tp * C, MEM_ACTIVATIONS);
    t->dfull = mem_alloc_floats((size_t)m->N * t->tp * C, MEM_ACTIVATIONS);
}

void expert_tp_free(ExpertModel* m) {
    ExpertTP* t = &m->tp;
    if (t->tp == 1) return;
    mem_free(t->full), mem_free(t->dfull);  // the slices' buffers are z[ZERO_TP]'s
    comm_destroy_group(&t->dpcpep_own);
}
