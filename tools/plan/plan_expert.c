// plan_expert.c: chapter 7's planner (plan.h): mixture of experts over dp x
// cp x ep, every dp x ep rank its own B / (dp ep) sequences (T/cp positions
// of each on a cp rank), E / ep experts of each MoE layer, the replicated
// parameters reduced over dp x cp x ep and the experts over dp x cp
// (capstone/composed_model.c's and composed_attention.c's buffers, capstone/main.c's
// step: build/capstone trains this model on every axis, chapter 7 on dp x ep
// alone; with --cp, chapter 6's ring or Ulysses traffic in every layer; with
// --tp, composed_attention.c's sequence-parallel attention and a dense layer's MLP
// (chapter 6's): B / (dp ep tp) sequences a rank, 1/tp of qkvw, qkvb,
// attprojw and of a dense layer's fcw, fcb, fcprojw reduced over dp x cp x ep).
//
// Exact: parameters, gradients, AdamW, activations and the exchange buffers
// (sized for the most rows a rank's experts can receive, R = N ep min(k,
// E/ep), whatever the routing), the all-reduces and the number of
// all-to-alls. Data-dependent: the all-to-all bytes. A rank's dispatch sends
// its N k token-slots (all of them when dropless, at most that under
// --capacity-factor) and its combine sends back the rows its experts
// received, which depends on the routing. The plan gives each rank's most
// (N k C + R C floats per exchange pair), and, dropless, the exact sum over
// the ranks: every slot is sent once by dispatch and once back by combine.
//
// With --pp (or --microbatches: capstone/main.c and composed_stage.c)
// each pp rank holds v chunks, each a model of L / (pp v) layers with the
// embedding's tables where it uses them, one microbatch's activations per
// slot and the slots a chunk's list holds at once; the send buffers are
// chapter 5's range (plan_pipeline.c).
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "comm_groups.h"
#include "comm_stats.h"
#include "args.h"
#include "model_layout.h"
#include "moe.h"
#include "plan.h"
#include "composed_rules.h"  // the capstone's refusals

static MoeConfig moe_of(const PlanArgs* a) {
    MoeConfig c = {.gpt = a->cfg, .experts = a->experts, .top_k = a->top_k, .moe_every = a->moe_every};
    // as chapter 7: not given or 0, 4C
    c.hidden = a->expert_hidden == ARG_NOT_GIVEN || a->expert_hidden == 0 ? 4 * a->cfg.channels : a->expert_hidden;
    return c;
}

// dropless: no --capacity-factor, or one of E / k or more (composed_model.c)
static int dropless(const PlanArgs* a) { return !(a->capacity > 0) || a->capacity >= (double)a->experts / a->top_k; }

// Of a token's FLOPs in c's layers, those of ops.h's row-by-row products
// (moe.c's moe_expert_forward and _backward_input): in each MoE layer its k
// experts' two forward products and their two input gradients, 2 k H C
// each (the weight gradients are BLAS's); --recompute full runs the two
// forward ones again. The rest of the matmuls run on BLAS.
static double rowwise_flops_per_token(const MoeConfig* c, RecomputeMode mode) {
    double product = 2.0 * c->top_k * c->hidden * c->gpt.channels;
    return moe_num_moe_layers(c) * product * (mode == RECOMPUTE_FULL ? 6.0 : 4.0);
}

// The layout as the capstone sees it (composed_rules.h), without cp's
// names (layout_problem parses them).
static ComposedLayout layout_of(const PlanArgs* a) {
    ComposedLayout c = {.B = a->B, .T = a->T, .num_layers = a->cfg.num_layers, .num_heads = a->cfg.num_heads,
                        .zero = a->zero, .microbatches = a->microbatches,
                        .virtual_chunks = a->virt, .schedule = a->schedule, .ep_overlap = a->ep_overlap};
    for (int x = 0; x < NUM_AXES; x++) c.mesh[x] = a->mesh[x];
    return c;
}

// The pipeline's step, as the capstone decides: --pp > 1, --microbatches or --virtual given.
static int pipelined(const PlanArgs* a) {
    ComposedLayout c = layout_of(a);
    return composed_pipelined(&c);
}

// The layout's problem, as the capstone's; cp's names parsed here, as
// chapter 6's cp_parse_flags does there.
static const char* layout_problem(const PlanArgs* a, char* msg, size_t len) {
    ComposedLayout c = layout_of(a);
    if (!strcmp(a->cp_mode, "ring")) c.cp_mode = CP_RING;
    else if (!strcmp(a->cp_mode, "ulysses")) c.cp_mode = CP_ULYSSES;
    else return snprintf(msg, len, "--cp-mode %s is not one of ring, ulysses", a->cp_mode), msg;
    if (!strcmp(a->cp_balance, "none")) c.cp_balance = BALANCE_NONE;
    else if (!strcmp(a->cp_balance, "zigzag")) c.cp_balance = BALANCE_ZIGZAG;
    else return snprintf(msg, len, "--cp-balance %s is not one of none, zigzag", a->cp_balance), msg;
    return composed_layout_problem(&c, msg, len);
}

const char* plan_check_expert(const PlanArgs* a, PlanInfo* info, char* msg, size_t len) {
    int ndp = a->mesh[AXIS_DP], nep = a->mesh[AXIS_EP], ncp = a->mesh[AXIS_CP], ntp = a->mesh[AXIS_TP];
    int npp = a->mesh[AXIS_PP];
    if (a->ranks != ndp * ntp * npp * ncp * nep) return "--ranks: chapter 7's mesh is dp x tp x pp x cp x ep";
    // in the capstone's order, with its lines: chapter 7's checks of the
    // model (moe_config_checked), the mesh's (common/train.c), then the
    // composition's (composed_rules.h)
    MoeConfig c = moe_of(a);
    const char* bad = moe_config_problem(&c);
    if (bad) return snprintf(msg, len, "%s", bad), msg;
    if (a->capacity < 0) return "--capacity-factor must be >= 0 (0: dropless)";
    MeshNeeds needs = {.experts = a->experts, .whole_vocab = 1};  // moe_config_checked's
    bad = train_mesh_problem(a->mesh, &a->cfg, a->B, a->T, &needs, msg, len);
    if (bad) return bad;
    bad = layout_problem(a, msg, len);  // the capstone's own refusals and --ep-overlap's, their lines
    if (bad) return bad;
    // the all-to-all's bytes depend on the routing: each rank's a bound;
    // dropless, their sum over the ranks is exact (every slot goes out once
    // and comes back once per exchange pair)
    info->comm_bound[COLL_ALLTOALL][AXIS_EP] = 1;
    if (dropless(a)) {
        // (with --pp each (dp, ep) coordinate's stages hold every MoE layer once)
        double N = (double)a->B / (ndp * nep * ntp) * (a->T / ncp), pairs = (a->recompute == RECOMPUTE_FULL ? 3 : 2) * (double)moe_num_moe_layers(&c);
        info->comm_sum[COLL_ALLTOALL][AXIS_EP] = a->steps * (a->ranks / npp) * pairs * 2 * N * a->top_k * a->cfg.channels * sizeof(float);
    }
    // the lists: chapter 5's build and validation, as composed_stage.c's
    return pipelined(a) ? plan_pipeline_lists(a, a->microbatches == ARG_NOT_GIVEN ? npp : a->microbatches, info, msg, len) : NULL;
}

// The three gradient groups expert_model_create makes, as the plan counts
// them (cp and tp in their names only with --cp, --tp): the replicated
// buffer's dp x cp x ep x tp, the experts' dp x cp x tp and the tp slices'
// dp x cp x ep (expert_tp_create; with tp = 1 the same group as the first).
typedef struct {
    Comm batch, experts, slices;
} GradGroups;

static GradGroups grad_groups(const PlanArgs* a, const int coord[NUM_AXES]) {
    int ndp = a->mesh[AXIS_DP], nep = a->mesh[AXIS_EP], ncp = a->mesh[AXIS_CP], ntp = a->mesh[AXIS_TP];
    char name[32];
    Mesh mesh;
    memset(&mesh, 0, sizeof(mesh));
    for (int x = 0; x < NUM_AXES; x++) mesh.size[x] = a->mesh[x];
    unsigned with_cp = ncp > 1 ? 1u << AXIS_CP : 0u, with_tp = ntp > 1 ? 1u << AXIS_TP : 0u;
    GradGroups g;
    comm_group_slot_name(&mesh, (1u << AXIS_DP) | with_cp | (1u << AXIS_EP) | with_tp, name, sizeof(name));
    g.batch = plan_group(comm_slot_for(name), ndp * ncp * nep * ntp,
                         ((coord[AXIS_DP] * nep + coord[AXIS_EP]) * ncp + coord[AXIS_CP]) * ntp + coord[AXIS_TP]);
    g.experts = plan_group(AXIS_DP, ndp, coord[AXIS_DP]);
    if (ncp > 1 || ntp > 1) {
        comm_group_slot_name(&mesh, (1u << AXIS_DP) | with_cp | with_tp, name, sizeof(name));
        g.experts = plan_group(comm_slot_for(name), ndp * ncp * ntp, (coord[AXIS_DP] * ncp + coord[AXIS_CP]) * ntp + coord[AXIS_TP]);
    }
    comm_group_slot_name(&mesh, (1u << AXIS_DP) | with_cp | (1u << AXIS_EP), name, sizeof(name));
    g.slices = plan_group(comm_slot_for(name), ndp * ncp * nep, (coord[AXIS_DP] * nep + coord[AXIS_EP]) * ncp + coord[AXIS_CP]);
    return g;
}

// --zero 2, 3 (03_fsdp/zero_buffer.h): chapter 3's engine on each buffer, its units
// over the buffer's group (03_fsdp/fsdp.c's sizes: S = ceil(n / N) per unit,
// padded to N S). Adds the engine's bytes to *params, *grads, *opt (the
// shards, --zero 3's two gather slots, the unit gradient buffer and the tied
// wte's own) and tallies one step: --zero 3's gathers in the order main.c's
// layer loop asks for the units (req, n_req: forward then backward; the
// two slots alternate, a unit still in one is not gathered again), every
// unit's reduce-scatter, --zero 2's all-gather of the updated shards.
static void plan_zero_units(const PlanArgs* a, const Comm* g, const size_t* numel, int n, int own0, const int* req,
                            int n_req, double* params, double* grads, double* opt) {
    int N = g->size, slot_of[4096 + 2], in_slot[2] = {-1, -1}, next = 0;
    size_t padded[4096 + 2], shard = 0, max_padded = 0, total = 0;
    for (int i = 0; i < n; i++) {
        padded[i] = (numel[i] + N - 1) / N * N;
        shard += padded[i] / N, total += padded[i], slot_of[i] = -1;
        if (padded[i] > max_padded) max_padded = padded[i];
    }
    *params += (double)(a->zero == 3 ? shard + 2 * max_padded : total);
    *grads += (double)(shard + max_padded + (own0 ? padded[0] : 0));
    *opt += 2.0 * (double)shard;
    for (int k = 0; a->zero == 3 && k < n_req; k++) {
        int i = req[k];
        if (i < 0) {  // a forward's start: fsdp_drop_gathered
            for (int j = 0; j < n; j++) slot_of[j] = -1;
            in_slot[0] = in_slot[1] = -1;
            continue;
        }
        if (slot_of[i] >= 0) continue;
        if (in_slot[next] >= 0) slot_of[in_slot[next]] = -1;
        in_slot[next] = i, slot_of[i] = next, next ^= 1;
        comm_tally(g, COLL_ALLGATHER, padded[i] * sizeof(float), comm_ring_factor(g));
    }
    for (int i = 0; i < n; i++) comm_tally(g, COLL_REDUCE_SCATTER, padded[i] * sizeof(float), comm_ring_factor(g));
    for (int i = 0; a->zero == 2 && i < n; i++) comm_tally(g, COLL_ALLGATHER, padded[i] * sizeof(float), comm_ring_factor(g));
}

// The units' requests of one step (main.c's model_forward, model_backward):
// the replicated buffer's [wte wpe], blocks, [lnfw lnfb] then wte; backward
// [lnfw lnfb], wte, the blocks from the last. The experts' and the slices'
// (one unit per MoE layer, per layer): forward in order, backward reversed.
static void plan_zero(const PlanArgs* a, const MoeConfig* c, const Comm* const zg[3], const double nbuf[3],
                      RankPlan* p) {
    int L = c->gpt.num_layers, Lm = moe_num_moe_layers(c), req[3 * 4096 + 8], n;
    size_t numel[4096 + 2];
    double params = 0, grads = 0, opt = 0, f = sizeof(float);
    MoeConfig ct = *c;
    ct.tp = a->mesh[AXIS_TP];
    numel[0] = moe_block_offset(&ct, 0);
    for (int l = 0; l < L; l++) numel[1 + l] = moe_block_numel(&ct, l);
    numel[L + 1] = 2 * (size_t)c->gpt.channels;
    n = 0, req[n++] = -1, req[n++] = 0;
    for (int l = 0; l < L; l++) req[n++] = 1 + l;
    req[n++] = L + 1, req[n++] = 0, req[n++] = L + 1, req[n++] = 0;
    for (int l = L - 1; l >= 0; l--) req[n++] = 1 + l;
    plan_zero_units(a, zg[0], numel, L + 2, 1, req, n, &params, &grads, &opt);
    for (int b = 1; b < 3; b++) {
        if (!zg[b]) continue;
        int units = b == 1 ? Lm : L;  // the slices: a dense layer's hold its MLP's too
        for (int i = 0; i < units; i++) numel[i] = b == 1 ? (size_t)(nbuf[b] / units) : moe_tp_numel(c, i, ct.tp);
        n = 0, req[n++] = -1;
        for (int i = 0; i < units; i++) req[n++] = i;
        for (int i = units - 1; i >= 0; i--) req[n++] = i;
        plan_zero_units(a, zg[b], numel, units, 0, req, n, &params, &grads, &opt);
    }
    p->peak[MEM_PARAMS] = f * params, p->peak[MEM_GRADS] = f * grads, p->peak[MEM_OPTIMIZER] = f * opt;
}

// A pp rank's chunks (composed_stage.c): each an ExpertModel of its layers
// (moe.h's buffers of a model of L / S layers) on b = B / (dp ep tp m)
// sequences, as many activation slots as its list holds microbatches at
// once; its all-reduces (each buffer whole, main.c's reduce_chunk; --zero
// 1 a reduce-scatter and an all-gather of each, padded), the tied wte
// between the two ends, the norm over ep, dp (x cp x tp) and pp; its
// messages. With --tp each chunk holds its layers' tp slices, the (N tp, C)
// gather buffers, and runs tp's all-gathers and reduce-scatters in every
// layer of every microbatch; the slices are reduced over dp x cp x ep.
static void plan_pipe(const PlanArgs* a, RankPlan* p, int r) {
    MoeConfig c = moe_of(a);
    const GPTConfig* g = &a->cfg;
    int coord[NUM_AXES];
    plan_coords(a, r, coord);
    int ndp = a->mesh[AXIS_DP], nep = a->mesh[AXIS_EP], pp = a->mesh[AXIS_PP], s = coord[AXIS_PP], v = a->virt;
    int ncp = a->mesh[AXIS_CP], ntp = a->mesh[AXIS_TP], S = pp * v, M = a->microbatches == ARG_NOT_GIVEN ? pp : a->microbatches, T = a->T;
    int b = a->B / (ndp * nep * ntp) / M;
    int C = g->channels, E = c.experts, k = c.top_k, H = c.hidden, El = E / nep, Lc = g->num_layers / S, NH = g->num_heads;
    // a microbatch's rows on a rank: T/cp positions of its b sequences
    double N = (double)b * (T / ncp), Nk = N * k, R = N * nep * (k < El ? k : El), f = sizeof(float), out = nep > 1 ? 1.0 : 0.0;
    double NC = N * C;
    int ring = !strcmp(a->cp_mode, "ring");
    const Schedule* sc = plan_pipeline_schedule();
    GradGroups gg = grad_groups(a, coord);
    Comm batch = gg.batch, dp = gg.experts, same = gg.slices, ep = plan_group(AXIS_EP, nep, coord[AXIS_EP]);
    Comm ppc = plan_group(AXIS_PP, pp, s), cpg = plan_group(AXIS_CP, ncp, coord[AXIS_CP]);
    Comm tpg = plan_group(AXIS_TP, ntp, coord[AXIS_TP]);
    double full = 0, shard = 0, acts = 0, comm = 0;
    // --zero 1 (03_fsdp/zero_buffer.h): each chunk's buffers of n floats over their N
    // copies (batch, dp x cp (x tp), dp x cp x ep): the moments S = ceil(n / N),
    // the parameters and gradient padded to N S, a gradient shard S
    int ndup[3] = {a->zero ? batch.size : 1, a->zero ? dp.size : 1, a->zero ? same.size : 1};
    Comm* zg[3] = {&batch, &dp, ntp > 1 ? &same : NULL};
    double nbuf[64][3];  // --virtual: at most 64 chunks (composed_rules.h)
    p->flops = p->rowwise_flops = 0;
    for (int ch = 0; ch < v; ch++) {
        MoeConfig lc = c;  // the chunk's layers (its FLOPs), and as composed_stage.c holds them
        lc.gpt.num_layers = Lc;
        int kv = ch * pp + s;
        lc.first_layer = kv * Lc;  // MoE or dense as the whole model's layers, wherever the chunk starts
        int n_moe = moe_num_moe_layers(&lc), embeds = kv == 0, head = kv == S - 1, busy = 0;
        MoeConfig held = lc;
        held.tp = ntp;  // the shared buffer without the tp slices (moe.h)
        if (!embeds) held.gpt.max_seq_len = 0;
        if (!embeds && !head) held.gpt.vocab_size = held.gpt.padded_vocab_size = 0;
        double shared = (double)moe_num_shared(&held), experts = (double)n_moe * El * moe_expert_numel(&lc);
        double slices = ntp > 1 ? (double)moe_tp_offset(&lc, Lc, ntp) : 0.0;
        nbuf[ch][0] = shared, nbuf[ch][1] = experts, nbuf[ch][2] = slices;
        for (int q = 0; q < 3; q++) {
            double S1 = ceil(nbuf[ch][q] / ndup[q]);
            full += ndup[q] * S1, shard += S1;
        }
        int split = sc->split_backward;  // zb: B and W (composed_wgrad.c)
        for (int i = 0, now = 0; i < sc->n[s]; i++) {  // a slot taken at F, given back at B (zb: at W)
            Action x = sc->list[s][i];
            if (x.chunk == ch && x.type == ACT_F && ++now > busy) busy = now;
            if (x.chunk == ch && x.type == (split ? ACT_W : ACT_B)) now--;
        }
        if (split) {
            // per slot the queue's copies of what W reads (composed_wgrad.c's wgrad_floats):
            // per layer attention's qkv and proj on the tp group's N tp rows
            // (tp: the proj bias on my N), an MoE layer's router and at most R
            // expert rows through fc and proj, a dense layer's fc and proj
            double Ng = N * ntp, Cl = (double)C / ntp, q = 0;
            for (int l = 0; l < Lc; l++) {
                q += Ng * (C + 3 * Cl) + Ng * (Cl + C) + (ntp > 1 ? NC : 0);
                q += moe_is_moe_layer(&lc, l) ? N * (C + E) + 2 * R * (C + H) : 2 * (Ng * C + 4 * NC) + (ntp > 1 ? NC : 0);
            }
            acts += busy * q;
        }
        // per slot the GPT's activations as --recompute keeps them and each
        // MoE layer's (expert_slot_create: selective without send and
        // fch_gelu, the model's one each; full none, the first slot's one layer);
        // per chunk the scratch every MoE layer shares (expert_model_create)
        double layer = 2 * N * E + 4 * Nk + R * C + R * H + E;  // without fch_gelu
        GPTConfig acts_cfg = held.gpt;  // no logits without the head
        if (!head) acts_cfg.vocab_size = acts_cfg.padded_vocab_size = 0;
        acts += busy * plan_acts_bytes(&acts_cfg, b, T / ncp, a->recompute) / f + 2 * R * C + 2 * R * H + Nk + N * E + N * C;
        if (ncp > 1) {
            // --cp: per slot what each layer's attention keeps (expert_slot_create;
            // --recompute full one layer's, shared by the chunk's slots), per
            // chunk the model's scratch and exchange buffers (expert_model_create)
            double kept = a->recompute == RECOMPUTE_FULL ? 1 : busy * Lc;
            acts += kept * (ring ? N * NH : N * NH + 3 * NC + NC);
            acts += ring ? NC + 3 * N * NH : NC + 3 * NC;
            comm += ring ? 10 * NC : 6 * NC;
            // every layer of every microbatch, forward and backward (the
            // forward's exchanges again under --recompute full)
            int passes = a->recompute == RECOMPUTE_FULL ? 3 : 2;
            for (int l = 0; l < M * Lc; l++) {
                if (ring) {  // (hops counted at once: cp of them a layer, for every rank of a search)
                    double hops = passes * (ncp - 1) + ncp, kv = 2.0 * NC * sizeof(float);
                    comm_tally_calls(&cpg, COLL_RECV, hops, kv, 0.0);
                    comm_tally_calls(&cpg, COLL_SEND, hops, kv, kv);
                } else {
                    for (int i = 0; i < passes; i++) {
                        comm_tally(&cpg, COLL_ALLTOALL, 3 * (size_t)NC * sizeof(float), comm_ring_factor(&cpg));
                        comm_tally(&cpg, COLL_ALLTOALL, (size_t)NC * sizeof(float), comm_ring_factor(&cpg));
                    }
                }
            }
        }
        if (ntp > 1) {
            // --tp (composed_tp.c): the (N tp, C) gathered rows and partial
            // sums; per layer of every microbatch an all-gather and a
            // reduce-scatter forward (twice under --recompute full), two
            // all-gathers and a reduce-scatter backward; a dense layer's MLP
            // (chapter 6's) the same again
            size_t full = (size_t)(NC * ntp) * sizeof(float);
            int fwd = a->recompute == RECOMPUTE_FULL ? 2 : 1;
            acts += 2 * NC * ntp;
            for (int l = 0; l < M * (2 * Lc - n_moe); l++) {
                for (int i = 0; i < 2 + fwd; i++) comm_tally(&tpg, COLL_ALLGATHER, full, comm_ring_factor(&tpg));
                for (int i = 0; i < 1 + fwd; i++) comm_tally(&tpg, COLL_REDUCE_SCATTER, full, comm_ring_factor(&tpg));
            }
        }
        comm += R * C + Nk * C;  // recv, dsend
        if (a->recompute == RECOMPUTE_NONE) acts += busy * n_moe * (layer + R * H), comm += busy * n_moe * 2 * Nk * C;
        if (a->recompute == RECOMPUTE_SELECTIVE) acts += busy * n_moe * layer + R * H, comm += busy * n_moe * Nk * C + Nk * C;
        if (a->recompute == RECOMPUTE_FULL) acts += layer + R * H, comm += 2 * Nk * C;
        // main.c's reduce_chunk: the replicated buffer whole (lnf's unused
        // slot off the last chunk too), the experts over dp; --zero 1 a
        // reduce-scatter of each padded buffer instead (after the loop, as
        // the step runs them after every chunk's backward)
        if (!a->zero) {
            comm_tally(&batch, COLL_ALLREDUCE, (size_t)shared * sizeof(float), 2.0 * comm_ring_factor(&batch));
            comm_tally(&dp, COLL_ALLREDUCE, (size_t)experts * sizeof(float), 2.0 * comm_ring_factor(&dp));
            if (ntp > 1) comm_tally(&same, COLL_ALLREDUCE, (size_t)slices * sizeof(float), 2.0 * comm_ring_factor(&same));
        }
        // per microbatch and MoE layer: dispatch and combine, both again in
        // backward (and in the forward --recompute full runs again)
        int nc = a->ep_overlap;
        long ntok = (long)N;
        for (int l = 0; l < M * n_moe * (a->recompute == RECOMPUTE_FULL ? 3 : 2); l++)
            for (int q = 0; q < nc; q++) {
                double nt = (double)((long)(q + 1) * ntok / nc - (long)q * ntok / nc);
                double rows = nt * nep * (k < El ? k : El);
                comm_tally_bytes(&ep, COLL_ALLTOALL, f * nt * k * C, out * f * nt * k * C);
                comm_tally_bytes(&ep, COLL_ALLTOALL, f * rows * C, out * f * rows * C);
            }
        // FLOPs: the chunk's layers on the rank's tokens, the head on the last
        p->flops += N * M * (moe_flops_per_token(&lc, T) - (head ? 0.0 : 6.0 * g->padded_vocab_size * C));
        if (a->recompute == RECOMPUTE_FULL)  // the blocks' forward again, not the head's
            p->flops += N * M * (moe_flops_per_token(&lc, T) / 3.0 - 2.0 * g->padded_vocab_size * C);
        p->rowwise_flops += N * M * rowwise_flops_per_token(&lc, a->recompute);
    }
    for (int ch = 0; a->zero && ch < v; ch++)
        for (int q = 0; q < 3; q++)
            if (zg[q]) comm_tally(zg[q], COLL_REDUCE_SCATTER, (size_t)(ndup[q] * ceil(nbuf[ch][q] / ndup[q])) * sizeof(float),
                                  comm_ring_factor(zg[q]));
    p->peak[MEM_PARAMS] = f * full;
    p->peak[MEM_GRADS] = f * (full + (a->zero ? shard : 0));
    p->peak[MEM_OPTIMIZER] = 2 * f * shard;
    p->peak[MEM_ACTIVATIONS] = f * acts;
    // the send buffers: between one (if the rank sends) and the most in flight
    double BTC = N * C;
    int most = plan_pipeline_sends_most(s);
    p->peak[MEM_COMM] = f * (comm + BTC * most);
    p->low[MEM_COMM] = f * (comm + (most > 0 ? BTC : 0.0));
    p->ranged[MEM_COMM] = p->low[MEM_COMM] != p->peak[MEM_COMM];
    plan_pipeline_messages(pp, s, (size_t)BTC);
    if (pp > 1 && (s == 0 || s == pp - 1)) {
        Comm embed = plan_group(comm_slot_for("embedding"), 2, s == 0 ? 0 : 1);
        comm_tally(&embed, COLL_ALLREDUCE, param_tensor_numel(g, P_WTE) * sizeof(float), 2.0 * comm_ring_factor(&embed));
    }
    const Comm* groups[] = {&ep, &dp, &ppc};
    plan_norm(p, groups, pp > 1 ? 3 : 2);  // (main.c's clip_and_step: the stages' group with pp > 1)
    for (int ch = 0; a->zero && ch < v; ch++)  // --zero 1: the updated shards to every copy
        for (int q = 0; q < 3; q++)
            if (zg[q]) comm_tally(zg[q], COLL_ALLGATHER, (size_t)(ndup[q] * ceil(nbuf[ch][q] / ndup[q])) * sizeof(float),
                                  comm_ring_factor(zg[q]));
}

size_t plan_expert_params(const PlanArgs* a) {
    MoeConfig c = moe_of(a);
    return moe_num_params(&c);
}

void plan_chapter_7(const PlanArgs* a, RankPlan* p, int r) {
    if (pipelined(a)) {
        plan_pipe(a, p, r);
        return;
    }
    MoeConfig c = moe_of(a);
    const GPTConfig* g = &a->cfg;
    int coord[NUM_AXES];
    plan_coords(a, r, coord);
    int ndp = a->mesh[AXIS_DP], nep = a->mesh[AXIS_EP], ncp = a->mesh[AXIS_CP], ntp = a->mesh[AXIS_TP];
    int B = a->B / (ndp * nep * ntp), T = a->T;  // --tp: a rank's B/tp of its share's sequences
    int C = g->channels, E = c.experts, k = c.top_k, H = c.hidden, El = E / nep, Lm = moe_num_moe_layers(&c);
    // --cp: a rank's N rows are T/cp positions of its B sequences
    double N = (double)B * (T / ncp), Nk = N * k, R = N * nep * (k < El ? k : El), f = sizeof(float);
    // --tp: the shared buffer without qkvw, qkvb, attprojw (and a dense
    // layer's fcw, fcb, fcprojw), and my slices of them
    MoeConfig ct = c;
    ct.tp = ntp;
    double shared = (double)moe_num_shared(&ct), experts = (double)Lm * El * moe_expert_numel(&c);
    double slices = ntp > 1 ? (double)moe_tp_offset(&c, g->num_layers, ntp) : 0.0;
    // --zero 1 (03_fsdp/zero_buffer.h): each buffer of n floats over its N copies:
    // S = ceil(n / N) of the moments, the parameters and gradient padded to
    // N S, and a gradient shard of S
    int ndup[3] = {a->zero ? ndp * ncp * nep * ntp : 1, a->zero ? ndp * ncp * ntp : 1, a->zero ? ndp * ncp * nep : 1};
    double nbuf[3] = {shared, experts, slices}, full = 0, shard = 0;
    for (int b = 0; b < 3; b++) {
        double S = ceil(nbuf[b] / ndup[b]);
        full += ndup[b] * S, shard += S;
    }
    p->peak[MEM_PARAMS] = f * full;
    p->peak[MEM_GRADS] = f * (full + (a->zero ? shard : 0));
    p->peak[MEM_OPTIMIZER] = 2 * f * shard;  // --zero 2, 3: plan_zero's, below
    // the GPT's activations, then each MoE layer's own (one for --recompute
    // full: every layer runs again before its backward), the fch_gelu and
    // send buffers selective shares, and what every MoE layer shares
    int n = a->recompute == RECOMPUTE_FULL ? 1 : Lm;
    double gelu = a->recompute == RECOMPUTE_NONE ? Lm * R * H : R * H;
    double send = a->recompute == RECOMPUTE_NONE ? Lm * Nk * C : Nk * C;
    double moe = n * (2 * N * E + 4 * Nk + R * C + R * H + E) + gelu + 2 * R * C + 2 * R * H + Nk + N * E + N * C;
    p->peak[MEM_ACTIVATIONS] = plan_acts_bytes(g, B, T / ncp, a->recompute) + f * moe;
    p->peak[MEM_COMM] = f * (send + n * Nk * C + R * C + Nk * C);  // send, back, recv, dsend
    // --cp (expert_slot_create, expert_model_create): the per-layer lse; the ring's one pair's
    // partials, its K/V and dK/dV buffers; or Ulysses' per-layer head-shard
    // q|k|v and output, its scratch and all-to-all buffers. One layer's
    // under --recompute full, which makes them again (Lf)
    int ring = !strcmp(a->cp_mode, "ring"), L = g->num_layers, NH = g->num_heads;
    double NC = N * C, Lf = a->recompute == RECOMPUTE_FULL ? 1 : L;
    // the attention's forward exchanges again under --recompute full
    int passes = a->recompute == RECOMPUTE_FULL ? 3 : 2;
    Comm cpg = plan_group(AXIS_CP, ncp, coord[AXIS_CP]);
    if (ncp > 1) {
        p->peak[MEM_ACTIVATIONS] += f * (ring ? Lf * N * NH + NC + 3 * N * NH
                                              : Lf * N * NH + Lf * 3 * NC + Lf * NC + NC + 3 * NC);
        p->peak[MEM_COMM] += f * (ring ? 10 * NC : 6 * NC);
        for (int l = 0; l < L; l++) {
            if (ring) {
                // K/V one hop per block but the last, forward (twice under
                // full) and backward; the dK/dV partial sums cp hops in
                // backward (counted at once: a search plans thousands of hops)
                double hops = passes * (ncp - 1) + ncp, kv = 2.0 * NC * sizeof(float);
                comm_tally_calls(&cpg, COLL_RECV, hops, kv, 0.0);
                comm_tally_calls(&cpg, COLL_SEND, hops, kv, kv);
            } else {
                for (int i = 0; i < passes; i++) {
                    comm_tally(&cpg, COLL_ALLTOALL, 3 * (size_t)NC * sizeof(float), comm_ring_factor(&cpg));
                    comm_tally(&cpg, COLL_ALLTOALL, (size_t)NC * sizeof(float), comm_ring_factor(&cpg));
                }
            }
        }
    }
    // --tp (composed_tp.c): the group's rows gathered and a partial sum, (N tp,
    // C) each; per layer forward an all-gather and a reduce-scatter (twice
    // under --recompute full), backward two all-gathers (d attproj, ln1
    // again) and a reduce-scatter (d ln1); a dense layer's MLP (chapter 6's
    // sp_mlp_forward, sp_mlp_backward) the same again (d fcproj, ln2 again, d ln2)
    Comm tpg = plan_group(AXIS_TP, ntp, coord[AXIS_TP]);
    if (ntp > 1) {
        size_t full = (size_t)(NC * ntp) * sizeof(float);
        p->peak[MEM_ACTIVATIONS] += f * 2 * NC * ntp;
        for (int l = 0; l < 2 * L - Lm; l++) {
            int fwd = a->recompute == RECOMPUTE_FULL ? 2 : 1;
            for (int i = 0; i < 2 + fwd; i++) comm_tally(&tpg, COLL_ALLGATHER, full, comm_ring_factor(&tpg));
            for (int i = 0; i < 1 + fwd; i++) comm_tally(&tpg, COLL_REDUCE_SCATTER, full, comm_ring_factor(&tpg));
        }
    }
    // per MoE layer dispatch and combine forward, both again in backward,
    // and once more under --recompute full: calls exact, bytes at most all
    // slots out and R rows back
    Comm ep = plan_group(AXIS_EP, nep, coord[AXIS_EP]);
    int exchanges = a->recompute == RECOMPUTE_FULL ? 3 : 2;
    // (bus bytes: what leaves the rank, none on one ep rank)
    double out = nep > 1 ? 1.0 : 0.0;
    // --ep-overlap: each exchange in chunks of the rank's tokens, cut as
    // expert_chunk_start cuts them; a chunk's rows are bounded like the whole
    int nc = a->ep_overlap;
    long ntok = (long)N;
    for (int l = 0; l < Lm * exchanges; l++)
        for (int ch = 0; ch < nc; ch++) {
            double nt = (double)((long)(ch + 1) * ntok / nc - (long)ch * ntok / nc);
            double rows = nt * nep * (k < El ? k : El);
            comm_tally_bytes(&ep, COLL_ALLTOALL, f * nt * k * C, out * f * nt * k * C);
            comm_tally_bytes(&ep, COLL_ALLTOALL, f * rows * C, out * f * rows * C);
        }
    // the three gradient groups (grad_groups), then the norm over ep and
    // dp x cp x tp. --zero 1: a reduce-scatter of each padded buffer instead
    // of the all-reduce, and after the step an all-gather of the updated shards
    GradGroups gg = grad_groups(a, coord);
    Comm batch = gg.batch, dpcp = gg.experts, same = gg.slices;
    Comm* zg[3] = {&batch, &dpcp, ntp > 1 ? &same : NULL};
    if (a->zero > 1) {  // --zero 2, 3: the engines' bytes and collectives
        const Comm* zz[3] = {&batch, &dpcp, ntp > 1 ? &same : NULL};
        plan_zero(a, &c, zz, nbuf, p);
    }
    if (!a->zero) {
        comm_tally(&batch, COLL_ALLREDUCE, (size_t)shared * sizeof(float), 2.0 * comm_ring_factor(&batch));
        comm_tally(&dpcp, COLL_ALLREDUCE, (size_t)experts * sizeof(float), 2.0 * comm_ring_factor(&dpcp));
        if (ntp > 1) comm_tally(&same, COLL_ALLREDUCE, (size_t)slices * sizeof(float), 2.0 * comm_ring_factor(&same));
    }
    for (int b = 0; a->zero == 1 && b < 3; b++)
        if (zg[b]) {
            size_t bytes = (size_t)(ndup[b] * ceil(nbuf[b] / ndup[b])) * sizeof(float);
            comm_tally(zg[b], COLL_REDUCE_SCATTER, bytes, comm_ring_factor(zg[b]));
        }
    const Comm* groups[] = {&ep, &dpcp};
    plan_norm(p, groups, 2);
    for (int b = 0; a->zero == 1 && b < 3; b++)
        if (zg[b]) {
            size_t bytes = (size_t)(ndup[b] * ceil(nbuf[b] / ndup[b])) * sizeof(float);
            comm_tally(zg[b], COLL_ALLGATHER, bytes, comm_ring_factor(zg[b]));
        }
    // FLOPs: this rank's tokens through the model, k experts each (what its
    // experts compute depends on the routing: this is the mean rank's)
    p->flops = N * moe_flops_per_token(&c, T);
    if (a->recompute == RECOMPUTE_FULL)  // the blocks' forward again, not the head's
        p->flops += N * (moe_flops_per_token(&c, T) / 3.0 - 2.0 * g->padded_vocab_size * C);
    p->rowwise_flops = N * rowwise_flops_per_token(&c, a->recompute);
}
