// test_moe.c: chapter 7's mixture-of-experts model on one rank, its gradient
// against central finite differences of its own objective
//   J = mean LM loss + aux_coef * aux,   aux = sum over MoE layers of E sum_e f_e P_e
// through the router, the top-k gates (k = 1 and k = 2), the capacity drop
// and the load-balancing loss with its coefficient; and aux itself against
// a count made here; and the host's waits for the device in each MoE
// layer (device_host_waits): one a forward, none a backward; and the FLOPs
// and parameters a token meets (top-k experts, not all) against hand counts.
//
// It links the chapter's modules (07_expert/moe_layer.c: balance_loss,
// plan_capacity, the layer's forward and backward; moe.c; moe_model.c), so
// what is checked is the code the chapter and the capstone run, not a copy:
// a gradient that is wrong the same way on every mesh (the load-balancing
// gradient taking the mean router probability P_e where the token fraction
// f_e belongs, say) passes every comparison of one mesh with another, and
// fails here. The model is composed from them below as 07_expert/main.c
// composes it (model_forward, model_backward), on one rank: the whole
// batch, every expert; the gradient groups are the identity there.
//
// Routing is piecewise constant: top-k and the capacity drop choose experts,
// and a finite difference that crosses a choice measures a jump, not a
// gradient. Every difference below is taken where the routing (each token's
// experts, each slot kept or dropped) is the same at all four points; a
// direction that changes it is replaced by another.
//
// modules: 07_expert/moe 07_expert/moe_layer 07_expert/moe_model
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "device.h"
#include "errors.h"
#include "init.h"  // counter_hash
#include "memory.h"
#include "mesh.h"
#include "moe_model.h"
#include "run.h"
#include "runtime.h"
#include "test.h"

// ---------------------------------------------------------------- the model, composed from the modules

// The host's waits for the device (device_host_waits: on the CPU the same
// calls are counted, though they wait for nothing) in each MoE layer's
// forward and backward, fewest and most over the calls since the last
// reset: one a forward (the exchange's sizes reach the host; every other
// copy is queued), none a backward (the forward's plan serves it).
typedef struct {
    long fwd_min, fwd_max, bwd_min, bwd_max, n_fwd, n_bwd;
} WaitTally;
static WaitTally waits;
static void wait_tally(long w, long* lo, long* hi, long* n) {
    if (*n == 0 || w < *lo) *lo = w;
    if (*n == 0 || w > *hi) *hi = w;
    (*n)++;
}

static float model_forward(MoeModel* m, const int* inputs, const int* targets) {
    const GPTConfig* g = &m->cfg.gpt;
    int C = g->channels, NH = g->num_heads;
    if (m->moe.record) moe_step_begin(&m->moe);
    moe_model_embed_forward(m, inputs, targets);
    for (int l = 0; l < g->num_layers; l++) {
        BlockParams p = moe_model_block(m, m->shared, l);
        if (!moe_is_moe_layer(&m->cfg, l)) {
            gpt_block_forward(&m->acts, g, l, &p, m->B, m->T);
            continue;
        }
        BlockActs a = moe_model_block_acts(m, l);
        moe_attention_forward(&p, &a, gpt_acts_block_input(&m->acts, g, l, m->B, m->T), m->B, m->T, C, NH);
        long w0 = device_host_waits();
        moe_layer_forward(&m->moe, moe_model_layer(&m->moe, m->layers, l), l, a.ln2,
                          moe_model_router(m, m->shared, l), moe_model_experts(m, m->experts, l), a.fcproj);
        wait_tally(device_host_waits() - w0, &waits.fwd_min, &waits.fwd_max, &waits.n_fwd);
        residual_forward(a.res3, a.res2, a.fcproj, (size_t)m->N * C);
    }
    return moe_model_head_forward(m);
}

static void model_backward(MoeModel* m) {
    const GPTConfig* g = &m->cfg.gpt;
    int C = g->channels, NH = g->num_heads;
    moe_model_head_backward(m);
    for (int l = g->num_layers - 1; l >= 0; l--) {
        const float* x = gpt_acts_block_input(&m->acts, g, l, m->B, m->T);
        BlockParams p = moe_model_block(m, m->shared, l), gp = moe_model_block(m, m->dshared, l);
        if (!moe_is_moe_layer(&m->cfg, l)) {
            gpt_block_backward(&m->acts, g, l, &p, &gp, m->B, m->T);
            continue;
        }
        BlockActs a = moe_model_block_acts(m, l);
        BlockScratch s = gpt_acts_scratch(&m->acts, g);
        long w0 = device_host_waits();
        moe_layer_backward(&m->moe, moe_model_layer(&m->moe, m->layers, l), l, m->acts.dres, a.ln2,
                           moe_model_router(m, m->shared, l), moe_model_router(m, m->dshared, l),
                           moe_model_experts(m, m->experts, l), moe_model_experts(m, m->dexperts, l), m->dln2);
        wait_tally(device_host_waits() - w0, &waits.bwd_min, &waits.bwd_max, &waits.n_bwd);
        moe_attention_backward(&p, &gp, &a, &s, x, m->dln2, m->acts.dres, m->B, m->T, C, NH);
    }
    moe_model_embed_backward(m);
}

static uint64_t rng_state = 7;
static double uniform(void) {  // xorshift64*, in [0, 1)
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return (double)((rng_state * 2685821657736338717ull) >> 11) / 9007199254740992.0;
}

// Small enough for finite differences, with vocabulary padding (V = 29
// real tokens, Vp = 32 rows), as test_model.c's.
static const GPTConfig small_cfg = {.max_seq_len = 8, .vocab_size = 29, .padded_vocab_size = 32,
                                    .num_layers = 2, .num_heads = 2, .channels = 8};
enum { B = 2, T = 8, N = B * T, H = 12 };

typedef struct {
    const char* name;
    int E, k, moe_every;
    float capacity, aux_coef;
} MoeCase;

// One tensor of one of the two parameter buffers.
typedef struct {
    char name[48];
    int experts;  // 0: the replicated buffer, 1: the experts buffer
    size_t off, n;
} Piece;

typedef struct {
    MoeModel m;
    int inputs[N], targets[N];
    float *p_s, *p_e;  // host copies of the parameters at the point checked
    uint64_t* route0;  // the routing there (routing())
} Fixture;

static Run run;

static int n_moe(const Fixture* f) { return moe_num_moe_layers(&f->m.cfg); }

// The routing of the last forward, per MoE layer and token: the set of its
// experts (bits 0..E-1) and of those that kept its slot (bits 32..): the
// order of a token's k choices does not change the objective, the sets do.
static void routing(const Fixture* f, uint64_t* out) {
    int k = f->m.cfg.top_k;
    for (int i = 0; i < n_moe(f); i++)
        for (int t = 0; t < N; t++) {
            uint64_t s = 0;
            for (int j = 0; j < k; j++) {
                int e = f->m.layers[i].idx_host[t * k + j];
                s |= 1ull << e;
                if (f->m.layers[i].pos_host[t * k + j] >= 0) s |= 1ull << (32 + e);
            }
            out[i * N + t] = s;
        }
}

// J at the parameters now on the device; *same &= the routing is the base's.
static double objective(Fixture* f, int* same) {
    MoeModel* m = &f->m;
    double J = model_forward(m, f->inputs, f->targets) + (double)m->moe.aux_coef * m->moe.aux;
    uint64_t* r = xmalloc((size_t)n_moe(f) * N * sizeof(uint64_t));
    routing(f, r);
    *same &= !memcmp(r, f->route0, (size_t)n_moe(f) * N * sizeof(uint64_t));
    free(r);
    return J;
}

// The smallest gap, over MoE layers and tokens, between the k-th and the
// (k+1)-th largest router logit of the last forward: how far the routing
// is from a tie of top-k (E > k).
static double routing_margin(const Fixture* f) {
    int E = f->m.cfg.experts, k = f->m.cfg.top_k;
    double margin = INFINITY;
    float* logits = xmalloc((size_t)N * E * sizeof(float));
    for (int i = 0; i < n_moe(f); i++) {
        mem_to_host(logits, f->m.layers[i].logits, (size_t)N * E * sizeof(float));
        for (int t = 0; t < N; t++) {
            // the k-th largest is the smallest chosen one; the (k+1)-th the
            // largest of the others
            double kth = INFINITY, next = -INFINITY;
            uint64_t chosen = 0;
            for (int j = 0; j < k; j++) chosen |= 1ull << f->m.layers[i].idx_host[t * k + j];
            for (int e = 0; e < E; e++) {
                double x = logits[(size_t)t * E + e];
                if (chosen >> e & 1) kth = fmin(kth, x);
                else next = err_max(next, x);
            }
            margin = fmin(margin, kth - next);
        }
    }
    free(logits);
    return margin;
}

// The chapter's step without the optimizer: forward, backward, the gradient
// reduction (the identity on one rank, run as the chapter runs it).
static void gradient(Fixture* f, double* g_s, double* g_e) {
    MoeModel* m = &f->m;
    model_forward(m, f->inputs, f->targets);
    mem_zero(m->dshared, m->n_shared * sizeof(float));
    mem_zero(m->dexperts, m->n_experts * sizeof(float));
    model_backward(m);
    float* tmp = xmalloc((m->n_shared > m->n_experts ? m->n_shared : m->n_experts) * sizeof(float));
    mem_to_host(tmp, m->dshared, m->n_shared * sizeof(float));
    for (size_t i = 0; i < m->n_shared; i++) g_s[i] = tmp[i];
    mem_to_host(tmp, m->dexperts, m->n_experts * sizeof(float));
    for (size_t i = 0; i < m->n_experts; i++) g_e[i] = tmp[i];
    free(tmp);
}

// Every tensor of the model: the replicated ones layer by layer (an MoE
// layer's attention half and router, a dense layer's 12), then each MoE
// layer's experts. Returns the count.
static int pieces_of(const MoeConfig* c, Piece* out) {
    const GPTConfig* g = &c->gpt;
    int n = 0;
    out[n++] = (Piece){"wte", 0, moe_wte_offset(c), param_tensor_numel(g, P_WTE)};
    out[n++] = (Piece){"wpe", 0, moe_wpe_offset(c), param_tensor_numel(g, P_WPE)};
    for (int l = 0; l < g->num_layers; l++) {
        size_t off = moe_block_offset(c, l);
        ParamTensor last = moe_is_moe_layer(c, l) ? P_LN2B : P_FCPROJB;
        for (ParamTensor t = P_LN1W; t <= last; t++) {
            Piece* p = &out[n++];
            snprintf(p->name, sizeof(p->name), "layer %d %s", l, param_tensor_name(t));
            p->experts = 0, p->off = off, p->n = param_tensor_numel(g, t);
            off += p->n;
        }
        if (moe_is_moe_layer(c, l)) {
            Piece* p = &out[n++];
            snprintf(p->name, sizeof(p->name), "layer %d router", l);
            p->experts = 0, p->off = off, p->n = (size_t)c->experts * g->channels;
        }
    }
    out[n++] = (Piece){"lnfw", 0, moe_lnf_offset(c), (size_t)g->channels};
    out[n++] = (Piece){"lnfb", 0, moe_lnf_offset(c) + g->channels, (size_t)g->channels};
    const char* names[4] = {"fcw", "fcb", "fcprojw", "fcprojb"};
    size_t C = (size_t)g->channels, Hs = (size_t)c->hidden, numel[4] = {Hs * C, Hs, C * Hs, C};
    for (int mi = 0; mi < moe_num_moe_layers(c); mi++)
        for (int e = 0; e < c->experts; e++) {
            size_t off = ((size_t)mi * c->experts + e) * moe_expert_numel(c);
            for (int t = 0; t < 4; t++) {
                Piece* p = &out[n++];
                snprintf(p->name, sizeof(p->name), "moe layer %d expert %d %s", mi, e, names[t]);
                p->experts = 1, p->off = off, p->n = numel[t];
                off += numel[t];
            }
        }
    return n;
}

// Moves piece p to p0 + h d (on the device), or back to p0 for h = 0.
static void place(Fixture* f, const Piece* p, const double* d, double h) {
    const float* p0 = (p->experts ? f->p_e : f->p_s) + p->off;
    float* dev = (p->experts ? f->m.experts : f->m.shared) + p->off;
    float* x = xmalloc(p->n * sizeof(float));
    for (size_t i = 0; i < p->n; i++) x[i] = (float)(p0[i] + h * d[i]);
    mem_to_device(dev, x, p->n * sizeof(float));
    free(x);
}

// The derivative of J (aux_only: of aux_coef aux alone) along d inside
// piece p: central differences at h and h/2 combined (Richardson), so the
// curvature along d does not count as error. 0 in *same if any of the four
// points routes differently from the base.
static double directional_fd(Fixture* f, const Piece* p, const double* d, int aux_only, int* same) {
    const double h = 1e-2, hs[4] = {h, -h, h / 2, -h / 2};
    double J[4];
    for (int i = 0; i < 4; i++) {
        place(f, p, d, hs[i]);
        J[i] = objective(f, same);
        if (aux_only) J[i] = (double)f->m.moe.aux_coef * f->m.moe.aux;
    }
    place(f, p, d, 0.0);
    double fd_h = (J[0] - J[1]) / (2 * h), fd_h2 = (J[2] - J[3]) / h;
    return (4.0 * fd_h2 - fd_h) / 3.0;
}

// For every piece: the directional derivative along a random direction
// (mixed with the gradient itself, so the change in J is large against
// fp32 rounding) by finite differences against g.d. Returns the worst
// relative error; names its piece in worst_name.
static double check_pieces(Fixture* f, const Piece* pieces, int n_pieces, const double* g_s, const double* g_e,
                           int aux_only, double floor_abs, char* worst_name, size_t len, int* flips) {
    double worst = 0.0;
    for (int pi = 0; pi < n_pieces; pi++) {
        const Piece* p = &pieces[pi];
        const double* g = (p->experts ? g_e : g_s) + p->off;
        double gnorm = 0.0;
        for (size_t i = 0; i < p->n; i++) gnorm += g[i] * g[i];
        gnorm = sqrt(gnorm / p->n) + 1e-4;
        double* d = xmalloc(p->n * sizeof(double));
        int same = 0;
        double gd = 0.0, fd = 0.0;
        // a direction that changes the routing is replaced (a handful of
        // tries: each moves the logits by about h)
        for (int tries = 0; tries < 8 && !same; tries++) {
            double dnorm = 0.0;
            for (size_t i = 0; i < p->n; i++) {
                d[i] = g[i] + gnorm * (uniform() - 0.5);
                dnorm += d[i] * d[i];
            }
            dnorm = sqrt(dnorm);
            gd = 0.0;
            for (size_t i = 0; i < p->n; i++) {
                d[i] /= dnorm;
                gd += d[i] * g[i];
            }
            same = 1;
            fd = directional_fd(f, p, d, aux_only, &same);
            if (!same) (*flips)++;
        }
        free(d);
        double err = same ? fabs(fd - gd) / (fabs(gd) + floor_abs) : INFINITY;
        if (getenv("FD_VERBOSE"))
            printf("  %-28s gd %+.6e fd %+.6e rel %.2e%s\n", p->name, gd, fd, err, same ? "" : " (routing changed)");
        if (isnan(err) || err > worst || !same) {  // a NaN kept (err_max's reason)
            worst = err;
            snprintf(worst_name, len, "%s%s", p->name, same ? "" : " (every direction tried changed the routing)");
        }
    }
    return worst;
}

// aux from the forward's own routing and probabilities, counted here:
// f_e = the share of the token-slots routed to e (dropped ones included),
// P_e = the mean router probability of e, E sum_e f_e P_e per MoE layer.
static double aux_by_hand(Fixture* f) {
    const MoeConfig* c = &f->m.cfg;
    int E = c->experts, k = c->top_k;
    double aux = 0.0;
    float* probs = xmalloc((size_t)N * E * sizeof(float));
    for (int i = 0; i < n_moe(f); i++) {
        mem_to_host(probs, f->m.layers[i].probs, (size_t)N * E * sizeof(float));
        for (int e = 0; e < E; e++) {
            double fe = 0.0, Pe = 0.0;
            for (int s = 0; s < N * k; s++) fe += f->m.layers[i].idx_host[s] == e;
            for (int t = 0; t < N; t++) Pe += probs[(size_t)t * E + e];
            aux += E * (fe / (N * k)) * (Pe / N);
        }
    }
    free(probs);
    return aux;
}

// The routing signature (moe_step_routing: the step records' "routing") of
// the forward's own routing, counted here: each token-slot's counter_hash
// of (its expert and whether it was kept, its layer, its token), summed.
// One rank: token t is row t.
static uint64_t routing_by_hand(const Fixture* f) {
    const MoeConfig* c = &f->m.cfg;
    int k = c->top_k;
    uint64_t sum = 0;
    for (int l = 0, i = 0; l < c->gpt.num_layers; l++) {
        if (!moe_is_moe_layer(c, l)) continue;
        for (int s = 0; s < N * k; s++)
            sum += counter_hash(0, 2 * f->m.layers[i].idx_host[s] + (f->m.layers[i].pos_host[s] >= 0), l, (size_t)(s / k));
        i++;
    }
    return sum;
}

// The capacity's choice, counted here: each expert keeps the first
// floor(capacity k N / E) of its token-slots in the batch's order (token by
// token, a token's k choices in order), the rest dropped (no capacity: every
// slot kept). One rank: the batch is my rows. Returns the slots whose kept
// or dropped differs from the forward's (pos_host).
static int capacity_wrong_by_hand(const Fixture* f, float capacity) {
    const MoeConfig* c = &f->m.cfg;
    int k = c->top_k, E = c->experts, wrong = 0;
    long cap = capacity > 0 ? (long)(capacity * k * (double)N / E) : -1;
    for (int i = 0; i < n_moe(f); i++) {
        long seen[64] = {0};
        for (int s = 0; s < N * k; s++) {
            int e = f->m.layers[i].idx_host[s], keep = cap < 0 || seen[e]++ < cap;
            wrong += keep != (f->m.layers[i].pos_host[s] >= 0);
        }
    }
    return wrong;
}

static void test_case(const MoeCase* mc) {
    MoeConfig cfg = {.gpt = small_cfg, .experts = mc->E, .top_k = mc->k, .hidden = H, .moe_every = mc->moe_every};
    Fixture f;
    MoeModel* m = &f.m;
    // the chapter's run on one rank: B sequences of T tokens, seed 11, no
    // recompute, parameters from init (no --model file)
    run.setup.B = B, run.setup.T = T, run.setup.checkpoint = NULL, run.setup.model_name = "test";
    run.args.seed = 11, run.args.recompute = RECOMPUTE_NONE;
    MoeFlags flags = {.experts = mc->E, .top_k = mc->k, .hidden = H, .moe_every = mc->moe_every,
                         .ep_overlap = 1, .aux_coef = mc->aux_coef, .capacity = mc->capacity};
    moe_model_create(m, &cfg, &flags, &run);
    memset(&waits, 0, sizeof(waits));
    // At init the weights are small: every op near its linear regime, the
    // router's probabilities near 1/E (where P_e and f_e are hard to tell
    // apart), LayerNorm weights exactly 1. Every parameter moves well away
    // from init; the router's twice as far, for uneven loads (padded wte
    // rows stay 0).
    f.p_s = xmalloc(m->n_shared * sizeof(float));
    f.p_e = xmalloc(m->n_experts * sizeof(float));
    mem_to_host(f.p_s, m->shared, m->n_shared * sizeof(float));
    mem_to_host(f.p_e, m->experts, m->n_experts * sizeof(float));
    for (size_t i = 0; i < m->n_shared; i++) f.p_s[i] += (float)(uniform() - 0.5);
    for (size_t i = 0; i < m->n_experts; i++) f.p_e[i] += (float)(uniform() - 0.5);
    for (int l = 0; l < cfg.gpt.num_layers; l++)
        if (moe_is_moe_layer(&cfg, l)) {
            float* r = f.p_s + (moe_router_at(&cfg, m->shared, l) - m->shared);
            for (int i = 0; i < cfg.experts * cfg.gpt.channels; i++) r[i] *= 2.0f;
        }
    for (size_t i = (size_t)cfg.gpt.vocab_size * cfg.gpt.channels; i < param_tensor_numel(&cfg.gpt, P_WTE); i++)
        f.p_s[i] = 0.0f;
    mem_to_device(m->shared, f.p_s, m->n_shared * sizeof(float));
    mem_to_device(m->experts, f.p_e, m->n_experts * sizeof(float));
    // a batch whose routing is clear of ties: the k-th and (k+1)-th router
    // logits of every token at least MARGIN apart, so the differences below
    // (each moves the logits by about h) keep the routing. Drawn until
    // found; the best of the draws if none is (the routing check below
    // still guards every difference).
    const double MARGIN = 0.05;
    int best_in[N] = {0}, best_tg[N] = {0};
    double best = -1.0;
    for (int draw = 0; draw < 200 && best < MARGIN; draw++) {
        for (int i = 0; i < N; i++) {
            f.inputs[i] = (int)(uniform() * small_cfg.vocab_size);
            f.targets[i] = (int)(uniform() * small_cfg.vocab_size);
        }
        model_forward(m, f.inputs, f.targets);
        double margin = routing_margin(&f);
        if (margin > best) {
            best = margin;
            memcpy(best_in, f.inputs, sizeof(best_in));
            memcpy(best_tg, f.targets, sizeof(best_tg));
        }
    }
    memcpy(f.inputs, best_in, sizeof(best_in));
    memcpy(f.targets, best_tg, sizeof(best_tg));
    if (getenv("FD_VERBOSE")) printf("  %s: routing margin %.3f\n", mc->name, best);

    double* g_s = xmalloc(m->n_shared * sizeof(double));
    double* g_e = xmalloc(m->n_experts * sizeof(double));
    double* g0_s = xmalloc(m->n_shared * sizeof(double));
    double* g0_e = xmalloc(m->n_experts * sizeof(double));
    f.route0 = xmalloc((size_t)n_moe(&f) * N * sizeof(uint64_t));
    gradient(&f, g_s, g_e);
    routing(&f, f.route0);
    long dropped = m->moe.dropped;
    double aux = m->moe.aux, aux_ref = aux_by_hand(&f);
    uint64_t routing_sig = moe_step_routing(&m->moe), routing_ref = routing_by_hand(&f);
    int capacity_wrong = capacity_wrong_by_hand(&f, mc->capacity);
    char name[256];

    // --ep-overlap 3: the layer's exchanges in 3 chunks of the 16 tokens
    // (6, 5, 5), each chunk's experts and backward on its own rows, the
    // weight gradients over all of them: the same gradient, bit for bit
    {
        Fixture f3;
        flags.ep_overlap = 3;
        moe_model_create(&f3.m, &cfg, &flags, &run);
        mem_to_device(f3.m.shared, f.p_s, m->n_shared * sizeof(float));
        mem_to_device(f3.m.experts, f.p_e, m->n_experts * sizeof(float));
        memcpy(f3.inputs, f.inputs, sizeof(f.inputs));
        memcpy(f3.targets, f.targets, sizeof(f.targets));
        double* g3_s = xmalloc(m->n_shared * sizeof(double));
        double* g3_e = xmalloc(m->n_experts * sizeof(double));
        gradient(&f3, g3_s, g3_e);
        size_t diff = 0;
        for (size_t i = 0; i < m->n_shared; i++) diff += g3_s[i] != g_s[i];
        for (size_t i = 0; i < m->n_experts; i++) diff += g3_e[i] != g_e[i];
        // bit for bit by construction: every op a chunk runs is row-stable (tests/test_rows.c), the weight gradients one call
        snprintf(name, sizeof(name), "moe %s: in 3 chunks (--ep-overlap 3) the same aux, drops and gradient, bit for bit",
                 mc->name);
        check(diff == 0 && f3.m.moe.aux == aux && f3.m.moe.dropped == dropped, name,
              "%zu gradient values differ; aux %.9f against %.9f, dropped %ld against %ld", diff, f3.m.moe.aux, aux,
              f3.m.moe.dropped, dropped);
        free(g3_s);
        free(g3_e);
        moe_model_free(&f3.m);
    }

    // the forward's statistics: aux as counted here; slots dropped exactly
    // when a capacity is set (the cases are chosen so that some are)
    snprintf(name, sizeof(name), "moe %s: aux = sum over MoE layers of E sum_e f_e P_e (counted by hand)", mc->name);
    check(fabs(aux - aux_ref) <= 1e-6 * fabs(aux_ref), name, "chapter %.9f, by hand %.9f", aux, aux_ref);
    snprintf(name, sizeof(name), "moe %s: the routing signature sums each token-slot's hash (counted by hand)", mc->name);
    check(routing_sig == routing_ref, name, "chapter %016llx, by hand %016llx", (unsigned long long)routing_sig,
          (unsigned long long)routing_ref);
    snprintf(name, sizeof(name), "moe %s: %s", mc->name,
             mc->capacity > 0 ? "the capacity drops some token-slots" : "dropless: no token-slot dropped");
    check(mc->capacity > 0 ? dropped > 0 : dropped == 0, name, "%ld slots dropped", dropped);
    snprintf(name, sizeof(name), "moe %s: each expert keeps its first slots in the batch's order, token by token "
             "(counted by hand)", mc->name);
    check(capacity_wrong == 0, name, "%d of the slots kept or dropped otherwise", capacity_wrong);

    // the host's waits for the device: a regression that adds one (a copy
    // that waits where a queued one would do) fails here, on the CPU
    snprintf(name, sizeof(name), "moe %s: each MoE layer's forward waits for the device once, its backward never "
             "(%ld forwards, %ld backwards, --ep-overlap 1 and 3)", mc->name, waits.n_fwd, waits.n_bwd);
    check(waits.n_fwd > 0 && waits.n_bwd > 0 && waits.fwd_min == 1 && waits.fwd_max == 1 && waits.bwd_max == 0, name,
          "forward %ld to %ld waits, backward %ld to %ld", waits.fwd_min, waits.fwd_max, waits.bwd_min, waits.bwd_max);

    // the whole objective, every tensor
    Piece* pieces = xmalloc(sizeof(Piece) * (size_t)(64 + 4 * 4 * cfg.experts * cfg.gpt.num_layers));
    int n_pieces = pieces_of(&cfg, pieces), flips = 0;
    char worst_name[128] = "";
    // fp32 J (about 4) is good to ~1e-6: the combined differences carry a
    // few 1e-5 of noise, hence the absolute floor of 1e-2 (test_model.c's)
    double worst = check_pieces(&f, pieces, n_pieces, g_s, g_e, 0, 1e-2, worst_name, sizeof(worst_name), &flips);
    if (getenv("FD_VERBOSE")) printf("  worst %.3e in %s\n", worst, worst_name);
    snprintf(name, sizeof(name),
             "moe %s: d(loss + %g aux) along every tensor (router, experts, attention) matches finite differences",
             mc->name, mc->aux_coef);
    check(worst < 3e-3, name, "worst relative error %.3e in %s", worst, worst_name);

    // the load-balancing loss alone: its gradient is what the coefficient
    // adds, g(aux_coef) - g(0), on the same routing. It reaches the router
    // and what is below it (ln2, attention, embeddings, and the experts of
    // the MoE layers below an MoE layer)
    float coef = m->moe.aux_coef;
    m->moe.aux_coef = 0.0f;
    gradient(&f, g0_s, g0_e);
    m->moe.aux_coef = coef;
    if (cfg.top_k == 1) {
        // k = 1: the one gate is p / p = 1 whatever the router says, so the
        // LM loss gives the router no gradient; only the aux loss trains it
        double router = 0.0;
        for (int l = 0; l < cfg.gpt.num_layers; l++)
            if (moe_is_moe_layer(&cfg, l)) {
                size_t off = moe_router_at(&cfg, m->shared, l) - m->shared;
                for (int i = 0; i < cfg.experts * cfg.gpt.channels; i++) router = err_max(router, fabs(g0_s[off + i]));
            }
        snprintf(name, sizeof(name), "moe %s: k = 1, the LM loss gives the router no gradient (the gate is p / p = 1)", mc->name);
        check(router == 0.0, name, "the router's gradient at aux-coef 0 reaches %.3e", router);
    }
    for (size_t i = 0; i < m->n_shared; i++) g0_s[i] = g_s[i] - g0_s[i];
    for (size_t i = 0; i < m->n_experts; i++) g0_e[i] = g_e[i] - g0_e[i];
    worst = check_pieces(&f, pieces, n_pieces, g0_s, g0_e, 1, 1e-5, worst_name, sizeof(worst_name), &flips);
    if (getenv("FD_VERBOSE")) printf("  worst %.3e in %s\n", worst, worst_name);
    snprintf(name, sizeof(name), "moe %s: d(%g aux) alone matches finite differences (every tensor)", mc->name,
             mc->aux_coef);
    check(worst < 3e-3, name, "worst relative error %.3e in %s", worst, worst_name);
    if (getenv("FD_VERBOSE")) printf("  %d directions replaced (the routing changed)\n", flips);
    // the capacity's order on 32 more batches (one draw rarely puts a
    // token's second choice and a later token's first on an expert at its
    // limit), from a generator of their own: the cases after this one draw
    // as before
    if (mc->capacity > 0) {
        uint64_t saved = rng_state;
        rng_state = 0x9e3779b97f4a7c15ull;
        int wrong = 0;
        for (int b = 0; b < 32; b++) {
            for (int i = 0; i < N; i++) f.inputs[i] = (int)(uniform() * small_cfg.vocab_size);
            model_forward(m, f.inputs, f.targets);
            wrong += capacity_wrong_by_hand(&f, mc->capacity);
        }
        rng_state = saved;
        snprintf(name, sizeof(name), "moe %s: 32 more batches: each expert keeps its first slots in the batch's order "
                 "(counted by hand)", mc->name);
        check(wrong == 0, name, "%d of the slots kept or dropped otherwise", wrong);
    }
    free(pieces);
    free(f.route0);
    free(g_s);
    free(g_e);
    free(g0_s);
    free(g0_e);
    free(f.p_s);
    free(f.p_e);
    moe_model_free(m);
}

// What a token meets, counted by hand: on tiny (L = 2, C = 64, Vp = 256, 120,576
// parameters dense) with E = 4 experts of H = 4C, one expert a token (k = 1)
// runs the dense MLP's FLOPs and parameters, plus the router's E C a layer;
// k = 2 adds one expert's 2HC + H + C = 33,088 a layer. Absolute figures: the
// planner calls the same functions, so a count of every expert as active
// (E for k) would move both sides of its comparison with the runs.
static void test_active_counts(void) {
    GPTConfig tiny;
    check(gpt_preset("tiny", &tiny), "preset tiny exists", "missing");
    MoeConfig c = {.gpt = tiny, .experts = 4, .top_k = 1, .hidden = 4 * tiny.channels, .moe_every = 1};
    // tiny at T = 64: 786,432 (test_model.c's) + 6 L E C = 3,072
    double f1 = moe_flops_per_token(&c, 64);
    size_t p1 = moe_active_params(&c), all = moe_num_params(&c);
    c.top_k = 2;
    // k = 2: + 6 L 2 H C = 393,216
    double f2 = moe_flops_per_token(&c, 64);
    size_t p2 = moe_active_params(&c);
    check(f1 == 789504.0 && f2 == 1182720.0, "MoE flops per token, tiny E=4 at T=64: 789,504 at k=1, 1,182,720 at k=2",
          "got %.0f and %.0f", f1, f2);
    check(p1 == 121088 && p2 == 187264 && all == 319616,
          "MoE parameters, tiny E=4: active 121,088 at k=1 and 187,264 at k=2, 319,616 in all",
          "got %zu, %zu and %zu", p1, p2, all);
}

int main(int argc, char** argv) {
    runtime_init(&argc, &argv);
    test_active_counts();
    run.device = device_init(runtime_local_rank());
    char msg[256];
    int sizes[NUM_AXES] = {0};  // one rank: every axis of size 1
    const char* bad = mesh_create(&run.mesh, sizes, msg, sizeof(msg));
    if (bad) fail_all("%s", bad);
    comm_create(&run.world, run.axes, &run.mesh);
    // N = 16 tokens, E = 4: capacity 1 keeps floor(k N / E) = 4 k slots per
    // expert, 0.75 keeps 3 k; the loads the moved router gives are uneven
    const MoeCase cases[] = {
        {"E=4 k=2 dropless", 4, 2, 1, 0.0f, 0.1f},
        {"E=4 k=1 dropless", 4, 1, 1, 0.0f, 0.1f},
        {"E=4 k=2 capacity 1", 4, 2, 1, 1.0f, 0.1f},
        {"E=4 k=1 capacity 0.75, a dense layer below", 4, 1, 2, 0.75f, 0.1f},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) test_case(&cases[i]);
    comm_destroy(&run.world, run.axes);
    mesh_destroy(&run.mesh);
    runtime_finalize();
    return test_exit_code();
}
