// moe_model.c: chapter 7's model on a rank of the dp x ep mesh (moe_model.h).
#include "moe_model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "data.h"
#include "errors.h"
#include "memory.h"
#include "mesh.h"
#include "rank.h"
#include "report.h"
#include "sharding.h"
#include "train.h"

// ---------------------------------------------------------------- the flags and the config

// The reader run_start uses for --model FILE: the GPT part of an MoE file's
// header (a dense llm.c file is refused: it has no router and no experts).
static const char* read_gpt_config(const char* path, GPTConfig* cfg, char* msg, size_t len) {
    MoeConfig c;
    const char* bad = moe_checkpoint_read_config(path, &c, msg, len);
    if (!bad) *cfg = c.gpt;
    return bad;
}

void moe_flags_specs(MoeFlags* fl, ArgSpec out[MOE_NUM_FLAGS]) {
    *fl = (MoeFlags){.experts = 4, .top_k = 2, .hidden = 0, .moe_every = 1, .ep_overlap = 1, .aux_coef = 0.01f,
                     .capacity = 0.0f};
    ArgSpec specs[MOE_NUM_FLAGS] = {
        {"experts", ARG_INT, &fl->experts, "experts per MoE layer, E  [4]"},
        {"top-k", ARG_INT, &fl->top_k, "experts per token, k  [2]"},
        {"expert-hidden", ARG_INT, &fl->hidden, "each expert's MLP width, H  [4C]"},
        {"moe-every", ARG_INT, &fl->moe_every, "every k-th layer is an MoE layer (layers k-1, 2k-1, ...)  [1]"},
        {"aux-coef", ARG_FLOAT, &fl->aux_coef, "weight of the load-balancing loss in the objective  [0.01]"},
        {"capacity-factor", ARG_FLOAT, &fl->capacity,
         "f > 0: each expert takes at most floor(f k tokens / E) slots per step, the rest are dropped  [0: dropless]"},
        {"ep-overlap", ARG_INT, &fl->ep_overlap,
         "n: each MoE layer's exchanges in n chunks of its tokens, chunk c's experts running while chunk c+1 "
         "travels  [1]"},
    };
    memcpy(out, specs, sizeof(specs));
    train_config_reader = read_gpt_config;  // --model FILE is an MoE file (moe.h)
}

int moe_model_run_start(Run* run, MoeFlags* fl, int argc, char** argv) {
    ArgSpec extra[MOE_NUM_FLAGS];
    moe_flags_specs(fl, extra);
    return run_start(run, argc, argv, "build/chapter-7",
                     "Chapter 7: mixture of experts, experts sharded over ep: route, count, all-to-all-v\n"
                     "dispatch, experts, all-to-all-v combine; the replicated gradients averaged over dp x ep,\n"
                     "the experts' summed over dp. Every axis at once (tp, pp, cp, ZeRO): build/capstone.",
                     extra, MOE_NUM_FLAGS, (1u << AXIS_DP) | (1u << AXIS_EP));
}

MoeConfig moe_config_checked(const Run* run, MoeFlags* f, int microbatches) {
    const TrainSetup* setup = &run->setup;
    MoeConfig cfg = {.gpt = setup->cfg, .experts = f->experts, .top_k = f->top_k,
                     .hidden = f->hidden > 0 ? f->hidden : 4 * setup->cfg.channels, .moe_every = f->moe_every};
    char msg[ERROR_MAX];
    if (setup->checkpoint) {
        // the file's experts, router and widths win over the flags (run_start
        // read this header already, with read_gpt_config)
        const char* bad = moe_checkpoint_read_config(setup->checkpoint, &cfg, msg, sizeof(msg));
        fail_if_any(bad != NULL, bad);
        print0("--model %s: E=%d, top-%d, H=%d, every %d layer%s MoE (from the file, over any --experts, --top-k, "
               "--expert-hidden, --moe-every)\n", setup->checkpoint, cfg.experts, cfg.top_k, cfg.hidden, cfg.moe_every,
               cfg.moe_every == 1 ? "" : "s");
        f->experts = cfg.experts, f->top_k = cfg.top_k, f->moe_every = cfg.moe_every;
    }
    const char* bad = moe_config_problem(&cfg);
    if (bad) fail_all("%s", bad);
    if (f->hidden < 0) fail_all("--expert-hidden must be >= 1 (or 0 for 4C)");
    // the experts a rank holds, their gradients and both AdamW moments must
    // fit this machine's memory (computed in doubles: no product overflows)
    int ep = run->mesh.size[AXIS_EP];
    double expert_bytes = 4.0 * sizeof(float) * moe_num_moe_layers(&cfg) * ((double)cfg.experts / ep) *
                          (2.0 * cfg.hidden * cfg.gpt.channels + cfg.hidden + cfg.gpt.channels);
    double machine = (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE);
    if (expert_bytes > machine)
        fail_all("--expert-hidden %d: a rank's experts need %.1f GiB (parameters, gradients, AdamW moments), more than this machine's %.1f GiB: use a smaller --expert-hidden or more ep ranks",
                 cfg.hidden, expert_bytes / (1 << 30), machine / (1 << 30));
    if (f->capacity < 0 || !isfinite(f->capacity)) fail_all("--capacity-factor must be >= 0 (0: dropless)");
    // capacity = factor x k x tokens / E slots per expert: at factor >= E / k
    // every token's every slot fits whatever the routing, so it is dropless
    // (and the slot count cannot overflow a long)
    if (f->capacity >= (double)cfg.experts / cfg.top_k) {
        print0("note: --capacity-factor %g >= E / k = %g keeps every slot whatever the routing: dropless\n", f->capacity,
               (double)cfg.experts / cfg.top_k);
        f->capacity = 0;
    }
    double tokens = (double)(setup->B / (microbatches >= 1 ? microbatches : 1)) * setup->T;  // a forward's, a bad m refused later
    double slots = (double)f->capacity * cfg.top_k * tokens / cfg.experts;
    if (f->capacity > 0 && slots < 1)
        print0("warning: --capacity-factor %g gives each expert %.2f slots of a forward's %.0f tokens, so 0: every token's MoE output is dropped (use a factor of at least %g)\n",
               f->capacity, slots, tokens, (double)cfg.experts / ((double)cfg.top_k * tokens));
    if (!(f->aux_coef >= 0) || !isfinite(f->aux_coef)) fail_all("--aux-coef must be >= 0");
    MeshNeeds needs = {.experts = cfg.experts, .whole_vocab = 1};  // the capstone's tp splits no vocabulary
    train_check_mesh(&run->mesh, setup, &needs);
    return cfg;
}

MoeConfig moe_model_config(const Run* run, MoeFlags* f) {
    MoeConfig cfg = moe_config_checked(run, f, 1);
    const TrainSetup* setup = &run->setup;
    int world = run->mesh.size[AXIS_DP] * run->mesh.size[AXIS_EP];
    if (setup->B % world != 0)
        fail_all("the batch of %d sequences does not split over dp x ep = %d ranks (every rank takes its own "
                 "sequences): use a --batch that is a multiple of %d", setup->B, world, world);
    char msg[256];  // a rank's tokens per MoE layer against --ep-overlap
    if (moe_overlap_problem(f->ep_overlap, (long)(setup->B / world) * setup->T, msg, sizeof(msg))) fail_all("%s", msg);
    return cfg;
}

// ---------------------------------------------------------------- set-up

void moe_print_setup(const MoeConfig* c, int ndp, int nep, int E_local, float capacity_factor, size_t total,
                     int per_rank, const Run* run) {
    int E = c->experts;
    size_t experts = (size_t)moe_num_moe_layers(c) * E * moe_expert_numel(c);
    print0("chapter 7: experts, dp=%d x ep=%d, %d expert%s (%d per rank), top-%d, H=%d, %d of %d layers MoE, %s, device %s\n",
           ndp, nep, E, E == 1 ? "" : "s", E_local, c->top_k, c->hidden, moe_num_moe_layers(c), c->gpt.num_layers,
           capacity_factor > 0 ? "capacity mode" : "dropless", run->device);
    print0("model %s: %zu parameters (%zu replicated, %zu in experts), %zu active per token; global batch %d x %d, %d per rank\n",
           run->setup.model_name, total, total - experts, experts, moe_active_params(c), run->setup.B, run->setup.T,
           per_rank);
}

// --show-sharding: the GPT and the routers on every rank, my E/ep experts of every MoE layer.
static void show_sharding(const MoeModel* m, int show) {
    if (!show) return;
    ShardTable* t = xcalloc(1, sizeof(ShardTable));
    double f = sizeof(float), shared = (double)m->n_shared, experts = (double)m->n_experts;
    char slice[40];
    shard_table_add(t, "GPT + routers", "", "(-, -)", "(-, -)", "(-, -)", "all", f * shared, f * shared, 2 * f * shared);
    snprintf(slice, sizeof(slice), "experts %d..%d of %d", m->e0, m->e0 + m->E_local - 1, m->cfg.experts);
    shard_table_add(t, "experts", "(Lm, E, ...)", "(-, ep, -)", "(-, ep, -)", "(-, ep, -)", slice, f * experts,
                    f * experts, 2 * f * experts);
    char title[64];
    snprintf(title, sizeof(title), "chapter 7, ep=%d, dp=%d", m->ep, m->dp->size);
    shard_table_show(t, show, title);
    free(t);
}

void moe_model_create(MoeModel* m, const MoeConfig* cfg, const MoeFlags* flags, const Run* run) {
    const Mesh* mesh = &run->mesh;
    memset(m, 0, sizeof(*m));
    m->cfg = *cfg;
    m->world = &run->world, m->dp = &run->axes[AXIS_DP], m->epc = &run->axes[AXIS_EP];
    m->ep = mesh->size[AXIS_EP];
    m->B = run->setup.B / (mesh->size[AXIS_DP] * m->ep), m->T = run->setup.T, m->N = m->B * m->T;
    // shares follow the world rank order (dp, then ep)
    m->share = mesh->coord[AXIS_DP] * m->ep + mesh->coord[AXIS_EP];
    m->E_local = cfg->experts / m->ep;
    m->e0 = m->epc->rank * m->E_local;
    comm_create_group(&m->batch, mesh, (1u << AXIS_DP) | (1u << AXIS_EP));  // "dp+ep" in the summary
    m->recompute = (RecomputeMode)run->args.recompute;
    uint64_t seed = (uint64_t)run->args.seed;
    int Lm = moe_num_moe_layers(cfg), C = cfg->gpt.channels;
    // parameters, gradients, AdamW moments: moe.h's two buffers
    m->n_shared = moe_num_shared(cfg);
    m->n_experts = (size_t)Lm * m->E_local * moe_expert_numel(cfg);
    float** bufs[] = {&m->shared, &m->dshared, &m->m_s, &m->v_s};
    for (int i = 0; i < 4; i++) *bufs[i] = mem_alloc_floats(m->n_shared, i == 0 ? MEM_PARAMS : i == 1 ? MEM_GRADS : MEM_OPTIMIZER);
    float** ebufs[] = {&m->experts, &m->dexperts, &m->m_e, &m->v_e};
    for (int i = 0; i < 4; i++)
        *ebufs[i] = mem_alloc_floats(m->n_experts, i == 0 ? MEM_PARAMS : i == 1 ? MEM_GRADS : MEM_OPTIMIZER);
    ops_zero(m->m_s, m->n_shared), ops_zero(m->v_s, m->n_shared);
    ops_zero(m->m_e, m->n_experts), ops_zero(m->v_e, m->n_experts);
    float* shared = xmalloc(m->n_shared * sizeof(float));
    float* mine = xmalloc((m->n_experts ? m->n_experts : 1) * sizeof(float));
    if (run->setup.checkpoint) {  // --model FILE: the replicated parameters and my experts
        char msg[ERROR_MAX];
        const char* bad = moe_checkpoint_read(run->setup.checkpoint, cfg, shared, mine, m->e0, m->E_local, msg, sizeof(msg));
        fail_if_any(bad != NULL, bad);
    } else {
        moe_init_shared(shared, cfg, 0, m->n_shared, seed);
        moe_init_experts(mine, cfg, 0, cfg->gpt.num_layers, m->e0, m->E_local, seed);
    }
    mem_to_device(m->shared, shared, m->n_shared * sizeof(float));
    mem_to_device(m->experts, mine, m->n_experts * sizeof(float));
    free(shared), free(mine);
    gpt_acts_create_recompute(&m->acts, &cfg->gpt, m->B, m->T, m->recompute);
    // the MoE layers: capacity keeps the first slots in the batch's order,
    // and a block of that order is a sequence (mine: [share B, share B + B))
    int* row_block = xmalloc((size_t)m->N * sizeof(int));
    for (int r = 0; r < m->N; r++) row_block[r] = m->share * m->B + r / m->T;
    MoeSpec spec = {.cfg = *cfg, .N = m->N, .epc = m->epc, .batch = &m->batch, .chunks = flags->ep_overlap,
                    .aux_coef = flags->aux_coef, .capacity_factor = flags->capacity, .n_blocks = run->setup.B,
                    .block_len = m->T, .row_block = row_block, .recompute = m->recompute};
    moe_parallel_create(&m->moe, &spec);
    free(row_block);
    // --recompute full: one MoE layer's state for all (each layer's forward runs again before its backward)
    m->layers = moe_layers_create(&m->moe, m->recompute == RECOMPUTE_FULL ? 1 : Lm);
    m->dln2 = mem_alloc_floats((size_t)m->N * C, MEM_ACTIVATIONS);
    m->rows_host = mem_alloc_host((size_t)m->N * 2 * sizeof(int));
    moe_print_setup(&m->cfg, m->dp->size, m->ep, m->E_local, m->moe.capacity_factor, moe_num_params(&m->cfg), m->B,
                    run);
    show_sharding(m, run->args.show_sharding);
}

void moe_model_free(MoeModel* m) {
    float* dev[] = {m->shared, m->dshared, m->m_s, m->v_s, m->experts, m->dexperts, m->m_e, m->v_e, m->dln2};
    for (size_t i = 0; i < sizeof(dev) / sizeof(dev[0]); i++) mem_free(dev[i]);
    moe_layers_free(&m->moe, m->layers, m->recompute == RECOMPUTE_FULL ? 1 : moe_num_moe_layers(&m->cfg));
    moe_parallel_free(&m->moe);
    gpt_acts_free(&m->acts);
    mem_free_host(m->rows_host);
    comm_destroy_group(&m->batch);
}

// ---------------------------------------------------------------- where things are

BlockParams moe_model_block(MoeModel* m, float* buffer, int l) { return moe_block_params(&m->cfg, buffer, l); }
float* moe_model_router(MoeModel* m, float* buffer, int l) { return moe_router_at(&m->cfg, buffer, l); }
float* moe_model_experts(MoeModel* m, float* buffer, int l) {
    return moe_expert_at(&m->cfg, buffer, moe_layer_index(&m->cfg, l), 0, m->E_local).fcw;
}
MoeLayer* moe_model_layer(const MoeParallel* moe, MoeLayer* layers, int l) {
    return &layers[moe->recompute == RECOMPUTE_FULL ? 0 : moe_layer_index(&moe->cfg, l)];
}
BlockActs moe_model_block_acts(MoeModel* m, int l) { return gpt_acts_block(&m->acts, &m->cfg.gpt, l, m->B, m->T); }

// ---------------------------------------------------------------- embedding and head

void moe_model_embed_forward(MoeModel* m, const int* inputs, const int* targets) {
    int N = m->N;
    memcpy(m->rows_host, inputs, (size_t)N * sizeof(int));
    memcpy(m->rows_host + N, targets, (size_t)N * sizeof(int));
    gpt_acts_load(&m->acts, m->rows_host, m->rows_host + N);
    encoder_forward(m->acts.encoded, m->acts.inputs, m->shared + moe_wte_offset(&m->cfg),
                    m->shared + moe_wpe_offset(&m->cfg), m->B, m->T, m->cfg.gpt.channels);
}

// The GPT's head (model.h) on wte and [lnfw lnfb] where moe.h's layout puts them.
float moe_model_head_forward(MoeModel* m) {
    const MoeConfig* c = &m->cfg;
    return gpt_acts_head_forward(&m->acts, &c->gpt, m->shared + moe_wte_offset(c), m->shared + moe_lnf_offset(c));
}

void moe_model_head_backward(MoeModel* m) {
    const MoeConfig* c = &m->cfg;
    gpt_acts_head_backward(&m->acts, &c->gpt, m->shared + moe_wte_offset(c), m->shared + moe_lnf_offset(c),
                           m->dshared + moe_wte_offset(c), m->dshared + moe_lnf_offset(c));
}

void moe_model_embed_backward(MoeModel* m) {
    encoder_backward(m->dshared + moe_wte_offset(&m->cfg), m->dshared + moe_wpe_offset(&m->cfg), m->acts.dres,
                     m->acts.inputs, m->B, m->T, m->cfg.gpt.channels);
}

// ---------------------------------------------------------------- data, validation, --sample, --save

void moe_model_load(const MoeModel* m, const TokenSet* d, long step, int* inputs, int* targets) {
    data_batch(d, step, m->B * m->batch.size, m->T, m->share * m->B, m->B, inputs, targets);
}

typedef struct {
    MoeModel* m;
    MoeForward forward;
} Forward;

// Validation and sampling run the chapter's forward without a training
// step's statistics.
static float quiet_forward(void* ctx, const int* inputs, const int* targets) {
    Forward* f = ctx;
    f->m->moe.record = 0;
    float loss = f->forward(f->m, inputs, targets);
    f->m->moe.record = 1;
    return loss;
}

float moe_model_val_loss(MoeModel* m, MoeForward forward, const TrainSetup* s, int n_batches) {
    Forward f = {m, forward};
    return train_val_loss_with(s, n_batches, quiet_forward, &f, m->share * m->B, m->B, m->B, &m->batch);
}

// The next token's logits: every rank runs the model on its whole batch, so
// that the all-to-alls of each MoE layer meet; share 0's first sequence
// holds the window (the causal attention never looks past it), every other
// row is token 0. Dropless, a token's experts and output depend on that
// token alone; in capacity mode the other rows compete for the slots too.
static void next_logits(void* ctx, const int* window, int t, float* row) {
    Forward* f = ctx;
    MoeModel* m = f->m;
    int Vp = m->cfg.gpt.padded_vocab_size;
    int* tokens = xcalloc((size_t)m->N * 2, sizeof(int));  // inputs, then targets (unused: zeros)
    if (m->share == 0) memcpy(tokens, window, (size_t)t * sizeof(int));
    quiet_forward(f, tokens, tokens + m->N);
    HeadActs h = gpt_acts_head(&m->acts, &m->cfg.gpt, m->B, m->T);
    mem_to_host(row, h.logits + (size_t)(t - 1) * Vp, (size_t)Vp * sizeof(float));
    free(tokens);
}

// ---------------------------------------------------------------- the MoE file through checkpoint slices

// The file's parameters (cfg's layout at tp = 1, host) as checkpoint slices
// (ckpt.h): the replicated floats and experts [e0, e0 + n) of every MoE layer.
static void file_slices(CkptList* out, const MoeConfig* cfg, float* shared, float* experts, int e0, int n) {
    moe_ckpt_add_shared(out, cfg, CKPT_PARAMS, 0, moe_num_shared(cfg), shared);
    moe_ckpt_add_expert_layers(out, cfg, CKPT_PARAMS, 0, moe_num_moe_layers(cfg), e0, n, experts);
}

void moe_model_read_slices(const char* path, const MoeConfig* cfg, int e0, int n, const CkptList* need) {
    size_t ns = moe_num_shared(cfg), ne = (size_t)moe_num_moe_layers(cfg) * n * moe_expert_numel(cfg);
    float *shared = xmalloc(ns * sizeof(float)), *experts = xmalloc(ne * sizeof(float) + 1);
    char msg[ERROR_MAX];
    const char* bad = moe_checkpoint_read(path, cfg, shared, experts, e0, n, msg, sizeof(msg));
    fail_if_any(bad != NULL, bad);
    CkptList file = {0};
    file_slices(&file, cfg, shared, experts, e0, n);
    size_t want = 0;
    for (int i = 0; i < need->n; i++)
        if (need->s[i].kind == CKPT_PARAMS) want += need->s[i].len * need->s[i].count;
    size_t found = ckpt_copy(need, &file);
    CHECK(found == want, "--model %s: %zu of the %zu parameters this rank holds found in the file", path, found, want);
    ckpt_list_free(&file);
    free(shared), free(experts);
}

void moe_model_save_slices(const char* path, const MoeConfig* cfg, const Comm* world, const CkptList* own,
                           uint64_t seed) {
    size_t n = moe_num_shared(cfg), n_all = (size_t)moe_num_moe_layers(cfg) * cfg->experts * moe_expert_numel(cfg);
    float *host = NULL, *all = NULL;
    CkptList file = {0};
    if (world->rank == 0) {
        host = xmalloc(n * sizeof(float)), all = xcalloc(n_all + 1, sizeof(float));
        moe_init_shared(host, cfg, 0, n, seed);
        file_slices(&file, cfg, host, all, 0, cfg->experts);
    }
    size_t found = ckpt_gather(own, CKPT_PARAMS, world->mpi, &file);
    CHECK(world->rank != 0 || found == file.floats, "--save: %zu of the file's %zu floats found on the ranks", found,
          file.floats);
    ckpt_list_free(&file);
    char msg[ERROR_MAX];
    const char* bad = NULL;
    if (world->rank == 0) {
        bad = moe_checkpoint_write(path, cfg, host, all, msg, sizeof(msg));
        if (!bad) printf("saved %s (mixture of experts, version %d)\n", path, MOE_CHECKPOINT_VERSION);
    }
    free(host), free(all);
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
// saved on one dp x ep mesh resumes on any other, and on the capstone's.
static CkptTensor ckpt_table[MOE_CKPT_TENSORS];

void moe_ckpt_model(Ckpt* ck, const MoeConfig* cfg, float capacity_factor, float aux_coef) {
    char variant[256];
    moe_ckpt_tensors(cfg, ckpt_table);
    moe_ckpt_variant(cfg, variant, sizeof(variant));
    if (moe_ckpt_dense(cfg))  // E = 1, H = 4C: the dense GPT's checkpoint (moe.h)
        ckpt_set_model(ck, NULL, 0, NULL);
    else
        ckpt_set_model(ck, ckpt_table, MOE_CKPT_TENSORS, variant);
    // what routing trains under: other drops or another balance term train
    // another model. One dropless expert is chapter 0's model (its router's
    // softmax is 1 whatever the balance term): the same identity as chapter 0's
    if (moe_ckpt_dense(cfg) && capacity_factor == 0) return;
    char settings[96];
    snprintf(settings, sizeof(settings), "capacity %.9g aux %.9g", capacity_factor, aux_coef);
    ckpt_add_identity(ck, settings);
}

static void model_slices(const MoeModel* m, CkptList* own, CkptList* need) {
    float* shared[CKPT_NUM_KINDS] = {m->shared, m->m_s, m->v_s};
    float* experts[CKPT_NUM_KINDS] = {m->experts, m->m_e, m->v_e};
    size_t per = (m->n_shared + m->ep - 1) / m->ep, lo = (size_t)m->epc->rank * per;
    if (lo > m->n_shared) lo = m->n_shared;
    size_t n = m->n_shared - lo < per ? m->n_shared - lo : per;
    for (int k = 0; k < CKPT_NUM_KINDS; k++) {
        if (m->dp->rank == 0) {
            moe_ckpt_add_shared(own, &m->cfg, (CkptKind)k, lo, n, shared[k] + lo);
            moe_ckpt_add_experts(own, &m->cfg, (CkptKind)k, m->e0, m->E_local, experts[k]);
        }
        moe_ckpt_add_shared(need, &m->cfg, (CkptKind)k, 0, m->n_shared, shared[k]);
        moe_ckpt_add_experts(need, &m->cfg, (CkptKind)k, m->e0, m->E_local, experts[k]);
    }
}

void moe_model_ckpt_open(Ckpt* ck, MoeModel* m, const Run* run) {
    ckpt_init(ck, &run->args, &run->setup, &run->mesh, 7);
    moe_ckpt_model(ck, &m->cfg, m->moe.capacity_factor, m->moe.aux_coef);
    model_slices(m, &ck->own, &ck->need);
    ckpt_resume(ck);
}

// After training. --save: each float from the rank whose checkpoint slice
// holds it, as the capstone saves (moe_model_save_slices).
void moe_model_finish(MoeModel* m, const TrainArgs* args, MoeForward forward) {
    Forward f = {m, forward};
    if (args->sample > 0) train_sample_with(args, &m->cfg.gpt, m->T, next_logits, &f);
    if (!args->save) return;
    CkptList own = {0}, need = {0};
    model_slices(m, &own, &need);
    moe_model_save_slices(args->save, &m->cfg, m->world, &own, (uint64_t)args->seed);
    ckpt_list_free(&own), ckpt_list_free(&need);
}

// ---------------------------------------------------------------- the summary

void moe_model_report(const MoeConfig* cfg, const MoeFlags* fl, int zero, const MoeParallel* moe, const Comm* over,
                      const TrainLoop* loop, JsonBuf* extra) {
    json_add_int(extra, "zero", zero);
    json_add_int(extra, "experts", fl->experts);
    json_add_int(extra, "top_k", fl->top_k);
    json_add_int(extra, "expert_hidden", cfg->hidden);
    json_add_int(extra, "moe_every", fl->moe_every);
    json_add_double(extra, "aux_coef", fl->aux_coef, "%g");
    json_add_double(extra, "capacity_factor", fl->capacity, "%g");
    json_add_int(extra, "active_params", (long long)moe_active_params(cfg));
    moe_report(moe, over, loop, extra);  // the traffic, the drops, the share of the exchanges hidden (moe_layer.c)
}
