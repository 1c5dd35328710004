// composed_build.c: a rank's (or a chunk's) model and its slots, built and
// freed: the one place that puts every axis's buffers together.
#include "composed_model.h"

#include <stdlib.h>
#include <string.h>

#include "memory.h"
#include "mesh.h"
#include "run.h"

// ---------------------------------------------------------------- set-up
// Each buffer's units (composed_model.h).
void expert_model_units(ExpertModel* m) {
    const MoeConfig* c = &m->cfg;
    int L = c->gpt.num_layers, Lm = moe_num_moe_layers(c);
    size_t* numel = xmalloc(sizeof(size_t) * (size_t)(L + 2));
    int* own = xcalloc((size_t)(L + 2), sizeof(int));
    own[0] = 1;  // wte: the head's gradient and the embedding's, one open buffer between them
    numel[0] = moe_block_offset(c, 0);
    for (int l = 0; l < L; l++) numel[1 + l] = moe_block_numel(c, l);
    numel[L + 1] = 2 * (size_t)c->gpt.channels;
    zero_buffer_units(&m->z[ZERO_SHARED], L + 2, numel, own);
    for (int i = 0; i < Lm; i++) numel[i] = (size_t)m->E_local * moe_expert_numel(c);
    zero_buffer_units(&m->z[ZERO_EXPERTS], Lm, numel, NULL);
    for (int l = 0; m->nz > 2 && l < L; l++) numel[l] = moe_tp_numel(c, l, m->tp.tp);
    if (m->nz > 2) zero_buffer_units(&m->z[ZERO_TP], L, numel, NULL);
    free(numel);
    free(own);
    m->dshared = m->z[ZERO_SHARED].grads, m->dexperts = m->z[ZERO_EXPERTS].grads, m->tp.dw = m->z[ZERO_TP].grads;
}

void expert_model_create(ExpertModel* m, const MoeConfig* cfg, const ExpertFlags* flags, const Run* run, int embeds,
                         int has_head) {
    const Mesh* mesh = &run->mesh;
    int ncp = mesh->size[AXIS_CP], ntp = mesh->size[AXIS_TP], T = run->setup.T;
    int B = run->setup.B / (mesh->size[AXIS_DP] * mesh->size[AXIS_EP] * ntp);  // my sequences, T/cp positions of each
    memset(m, 0, sizeof(*m));
    m->embeds = embeds, m->has_head = has_head, m->recompute = (RecomputeMode)run->args.recompute;
    m->cfg = *cfg;
    m->cfg.tp = ntp;  // with --tp the shared buffer leaves out the split tensors (moe.h)
    m->B = B, m->T = T / ncp, m->N = B * (T / ncp);
    m->world = &run->world, m->dp = &run->axes[AXIS_DP], m->epc = &run->axes[AXIS_EP];
    // the group's name in the summary is its axes ("dp+ep"; "dp+tp+cp+ep" with --tp, --cp)
    unsigned tpa = ntp > 1 ? 1u << AXIS_TP : 0u;
    comm_create_group(&m->batch, mesh, (1u << AXIS_DP) | (ncp > 1 ? 1u << AXIS_CP : 0u) | (1u << AXIS_EP) | tpa);
    m->dpcp = m->dp;
    if (ncp > 1 || ntp > 1) {  // with --tp the experts' copies are over dp x cp x tp
        comm_create_group(&m->dpcp_own, mesh, (1u << AXIS_DP) | (ncp > 1 ? 1u << AXIS_CP : 0u) | tpa);
        m->dpcp = &m->dpcp_own;
    }
    m->cp = (ExpertCP){.mode = flags->cp_mode, .cpc = &run->axes[AXIS_CP]};
    int zig = ncp > 1 && flags->cp_balance == BALANCE_ZIGZAG;
    m->cp.sh = (CPShard){.cp = ncp, .rank = mesh->coord[AXIS_CP], .parts = zig ? 2 : 1, .len = zig ? T / (2 * ncp) : T / ncp,
                         .B = B, .T = T};
    m->ep = mesh->size[AXIS_EP];
    // shares follow the world rank order (dp, then ep, then tp; the cp ranks
    // of a share hold its positions)
    m->share = (mesh->coord[AXIS_DP] * m->ep + mesh->coord[AXIS_EP]) * ntp + mesh->coord[AXIS_TP];
    m->E_local = cfg->experts / m->ep;
    m->e0 = m->epc->rank * m->E_local;
    int N = m->N, C = cfg->gpt.channels;
    int Lm = moe_num_moe_layers(cfg);
    m->n_shared = moe_num_shared(&m->cfg);
    m->n_experts = (size_t)Lm * m->E_local * moe_expert_numel(cfg);
    // parameters, gradients, moments; --zero 1: the moments sharded over the copies
    m->zero = flags->zero;
    zero_buffer_alloc(&m->z[ZERO_SHARED], m->zero, &m->batch, m->n_shared);
    zero_buffer_alloc(&m->z[ZERO_EXPERTS], m->zero, m->dpcp, m->n_experts);
    expert_tp_create(m, run);  // --tp: my slices of the split tensors, the all-gather buffers
    m->nz = ntp > 1 ? 3 : 2;
    // --cp: chapter 6's ring or all-to-all buffers, one layer's scratch
    if (ncp > 1) cp_buffers_create(&m->cp.buf, m->cp.mode, N, C, cfg->gpt.num_heads);
    // the MoE layers: chapter 7's engine over ep. Capacity keeps the first
    // rows in the global batch's order, in blocks: a run of len positions
    // of one sequence on one cp rank, nb per sequence (ring.h)
    const CPShard* sh = &m->cp.sh;
    int nb = sh->T / sh->len;
    int* row_block = xmalloc((size_t)N * sizeof(int));
    for (int row = 0; row < N; row++)
        row_block[row] = (m->share * sh->B + row / sh->len % sh->B) * nb +
                         cp_shard_pos(sh, sh->rank, row / (sh->B * sh->len)) / sh->len;
    MoeSpec spec = {.cfg = m->cfg, .N = N, .epc = m->epc, .batch = &m->batch, .chunks = flags->moe.ep_overlap,
                    .aux_coef = flags->moe.aux_coef, .capacity_factor = flags->moe.capacity,
                    .n_blocks = m->batch.size / sh->cp * sh->B * nb, .block_len = sh->len, .row_block = row_block,
                    .recompute = m->recompute};
    moe_parallel_create(&m->moe, &spec);
    free(row_block);
    m->moe.wgrad = expert_wgrad(m, 0);  // the router's and experts' (zb: queued); moe_layer.c sets the layer
    m->dln2 = mem_alloc_floats((size_t)N * C, MEM_ACTIVATIONS);
    m->rows_host = mem_alloc_host((size_t)N * 2 * sizeof(int));
}

void expert_model_free(ExpertModel* m) {
    mem_free(m->dln2);
    moe_parallel_free(&m->moe);
    mem_free_host(m->rows_host);
    cp_buffers_free(&m->cp.buf);
    expert_tp_free(m);
    zero_buffer_free(&m->z[ZERO_SHARED]), zero_buffer_free(&m->z[ZERO_EXPERTS]), zero_buffer_free(&m->z[ZERO_TP]);
    if (m->dpcp == &m->dpcp_own) comm_destroy_group(&m->dpcp_own);
    comm_destroy_group(&m->batch);
}

// ---------------------------------------------------------------- slots
// No logits without the head.
ExpertSlot* expert_slot_create(const ExpertModel* m, const ExpertSlot* first) {
    const GPTConfig* g = &m->cfg.gpt;
    GPTConfig acts_cfg = *g;
    if (!m->has_head) acts_cfg.vocab_size = acts_cfg.padded_vocab_size = 0;
    ExpertSlot* s = xcalloc(1, sizeof(ExpertSlot));  // chapter 5's SlotPool: a slot never moves
    gpt_acts_create_recompute(&s->acts, &acts_cfg, m->B, m->T, m->recompute);
    if (m->split) expert_wgrad_create(&s->wq, m);
    int full = m->recompute == RECOMPUTE_FULL;
    if (full && first) {
        *s = (ExpertSlot){s->acts, first->layers, first->lse, first->qkv_h, first->y_h, s->wq, 1};
        return s;
    }
    s->layers = moe_layers_create(&m->moe, full ? 1 : moe_num_moe_layers(&m->cfg));
    if (m->cp.sh.cp == 1) return s;
    size_t L = full ? 1 : (size_t)g->num_layers, NC = (size_t)m->N * g->channels;
    s->lse = mem_alloc_floats(L * m->N * g->num_heads, MEM_ACTIVATIONS);
    if (m->cp.mode == CP_ULYSSES) {  // the head shard's q|k|v and output over whole sequences
        s->qkv_h = mem_alloc_floats(L * 3 * NC, MEM_ACTIVATIONS);
        s->y_h = mem_alloc_floats(L * NC, MEM_ACTIVATIONS);
    }
    return s;
}

void expert_slot_free(const ExpertModel* m, ExpertSlot* s) {
    gpt_acts_free(&s->acts);
    wgrad_queue_free(&s->wq);
    if (!s->borrowed) {
        moe_layers_free(&m->moe, s->layers, m->recompute == RECOMPUTE_FULL ? 1 : moe_num_moe_layers(&m->cfg));
        mem_free(s->lse), mem_free(s->qkv_h), mem_free(s->y_h);
    }
    free(s);
}
