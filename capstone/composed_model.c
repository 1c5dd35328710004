// composed_model.c: chapter 7's model on a rank: a layer's units (--zero 2,
// 3), the per-token ends of the step, the flags and the config.
#include "composed_model.h"
#include "composed_rules.h"

#include <stdlib.h>
#include <string.h>

#include "errors.h"
#include "mesh.h"
#include "run.h"
#include "train_loop.h"

BlockActs expert_block_acts(ExpertModel* m, int l) { return gpt_acts_block(&m->slot->acts, &m->cfg.gpt, l, m->B, m->T); }

// ---------------------------------------------------------------- --zero 2, 3: the units of a layer

// Layer l's (buffer, unit)s (composed_model.h): its piece of the replicated
// buffer, its experts, its tp slices. Returns how many.
static int layer_units(const ExpertModel* m, int l, int u[3][2]) {
    int L = m->cfg.gpt.num_layers, n = 0;
    u[n][0] = ZERO_SHARED, u[n++][1] = 1 + l;
    if (l == L) u[n][0] = ZERO_SHARED, u[n++][1] = 0;
    if (l < 0 || l == L) return n;
    if (moe_is_moe_layer(&m->cfg, l)) u[n][0] = ZERO_EXPERTS, u[n++][1] = moe_layer_index(&m->cfg, l);
    if (m->nz > 2) u[n][0] = ZERO_TP, u[n++][1] = l;
    return n;
}

void expert_units_gather(ExpertModel* m, int l) {
    int u[3][2], n = layer_units(m, l, u);
    if (m->zero < 3) return;
    if (l < 0)  // a new forward: what was gathered before the step is stale
        for (int b = 0; b < m->nz; b++) zero_buffer_drop(&m->z[b]);
    for (int i = 0; i < n; i++) zero_buffer_params(&m->z[u[i][0]], u[i][1]);
}

void expert_units_open(ExpertModel* m, int l) {
    int u[3][2], n = layer_units(m, l, u);
    if (m->zero < 2) return;
    expert_units_gather(m, l);
    for (int i = 0; i < n; i++) zero_buffer_grads_begin(&m->z[u[i][0]], u[i][1]);
}

void expert_units_reduce(ExpertModel* m, int l) {
    int u[3][2], n = layer_units(m, l, u) - (l == m->cfg.gpt.num_layers);  // wte's stays open
    if (m->zero < 2) return;
    for (int i = 0; i < n; i++) zero_buffer_reduce(&m->z[u[i][0]], u[i][1]);
}

// ---------------------------------------------------------------- the per-token parts of the step

// My rows of the B sequences (host (B, T) tokens): at cp > 1 my positions,
// part-major (ring.h), each part's rows taking wpe from its first position.
void expert_embed_forward(ExpertModel* m, const int* inputs, const int* targets) {
    const CPShard* sh = &m->cp.sh;
    int N = m->N;
    int* rows = m->rows_host;
    cp_shard_tokens(sh, rows, inputs);
    cp_shard_tokens(sh, rows + N, targets);
    gpt_acts_load(&m->slot->acts, rows, rows + N);
    if (!m->embeds) return;  // a later pipeline stage: its input arrived in acts.encoded
    float* u = zero_buffer_params(&m->z[ZERO_SHARED], 0);  // unit 0: [wte wpe]
    cp_shard_encoder_forward(sh, m->slot->acts.encoded, m->slot->acts.inputs, u + moe_wte_offset(&m->cfg),
                             u + moe_wpe_offset(&m->cfg), m->cfg.gpt.channels);  // chapter 6's (ring.c)
}

// The GPT's head (model.h) on wte (unit 0) and [lnfw lnfb] (the last unit,
// asked for first: --zero 3 gathers a unit when asked).
float expert_head_forward(ExpertModel* m) {
    if (!m->has_head) return 0.0f;
    float* lnf = zero_buffer_params(&m->z[ZERO_SHARED], m->cfg.gpt.num_layers + 1);
    float* wte = zero_buffer_params(&m->z[ZERO_SHARED], 0) + moe_wte_offset(&m->cfg);
    return gpt_acts_head_forward(&m->slot->acts, &m->cfg.gpt, wte, lnf);
}

void expert_head_backward(ExpertModel* m) {
    if (!m->has_head) return;  // acts.dres arrived from the stage after
    ZeroBuffer* z = &m->z[ZERO_SHARED];
    size_t wte = moe_wte_offset(&m->cfg);
    int L = m->cfg.gpt.num_layers;
    float *P = zero_buffer_params(z, 0), *G = zero_buffer_grads(z, 0), *lnf = zero_buffer_params(z, L + 1);
    gpt_acts_head_backward(&m->slot->acts, &m->cfg.gpt, P + wte, lnf, G + wte, zero_buffer_grads(z, L + 1));
}

void expert_embed_backward(ExpertModel* m) {
    if (!m->embeds) return;
    float* G = zero_buffer_grads(&m->z[ZERO_SHARED], 0);  // unit 0's: the head's dwte is in it
    cp_shard_encoder_backward(&m->cp.sh, G + moe_wte_offset(&m->cfg), G + moe_wpe_offset(&m->cfg), m->slot->acts.dres,
                              m->slot->acts.inputs, m->cfg.gpt.channels);
}

// ---------------------------------------------------------------- the flags

int expert_run_start(Run* run, ExpertFlags* fl, int argc, char** argv) {
    ArgSpec extra[MOE_NUM_FLAGS + 6];
    moe_flags_specs(&fl->moe, extra);  // chapter 7's seven, with their defaults; --model FILE: an MoE file
    fl->cp_mode_name = "ring", fl->cp_balance_name = "none", fl->schedule = "1f1b";
    fl->microbatches = ARG_NOT_GIVEN, fl->virtual_chunks = 1, fl->zero = 0;
    ArgSpec composition[] = {
        {"cp-mode", ARG_STRING, &fl->cp_mode_name, "ring | ulysses: how attention meets the other cp ranks' tokens (chapter 6)  [ring]"},
        {"cp-balance", ARG_STRING, &fl->cp_balance_name, "none | zigzag: which positions each cp rank holds (chapter 6)  [none]"},
        {"schedule", ARG_STRING, &fl->schedule, "with --pp: gpipe | 1f1b | interleaved | zb (chapter 5)  [1f1b]"},
        {"microbatches", ARG_INT, &fl->microbatches,
         "a rank's share of the batch in m microbatches, gradients accumulated (the pipeline's; also at pp 1)  [pp]"},
        {"virtual", ARG_INT, &fl->virtual_chunks, "chunks (virtual stages) per pp rank, --schedule interleaved only  [1]"},
        {"zero", ARG_INT, &fl->zero,
         "ZeRO stage over each buffer's copies: 0 none, 1 the AdamW moments sharded, 2 the gradients too, 3 the "
         "parameters too (03_fsdp/zero_buffer.h; 2 and 3 not with the pipeline)  [0]"},
    };
    memcpy(extra + MOE_NUM_FLAGS, composition, sizeof(composition));
    int go = run_start(run, argc, argv, "build/capstone",
                     "The capstone: chapter 7's mixture of experts on every axis at once: experts sharded over ep\n"
                     "(route, count, all-to-all-v dispatch, experts, all-to-all-v combine); with --cp, chapter 6's\n"
                     "context parallelism in attention; with --tp, tensor parallelism with sequence parallelism\n"
                     "(attention split by heads, the rest by tokens); with --pp, chapter 5's pipeline stages and\n"
                     "schedules; with --zero, ZeRO over each buffer's copies.",
                     extra, sizeof(extra) / sizeof(extra[0]),
                     (1u << AXIS_DP) | (1u << AXIS_TP) | (1u << AXIS_PP) | (1u << AXIS_CP) | (1u << AXIS_EP));
    if (!go) return 0;
    // a flag of an axis that is off: said, not ignored (no --cp-overlap here: the mode does not matter)
    cp_note_unused(argc, argv, run->mesh.size[AXIS_CP], CP_RING);
    args_note_unused(argc, argv, "schedule",
                     run->mesh.size[AXIS_PP] == 1 && fl->microbatches == ARG_NOT_GIVEN && fl->virtual_chunks == 1,
                     "one stage of one microbatch runs one F, then one B (--pp N or --microbatches M pipelines)");
    return 1;
}

// ---------------------------------------------------------------- the config

MoeConfig expert_config(const Run* run, ExpertFlags* f) {
    const TrainSetup* setup = &run->setup;
    // chapter 7's checks of the MoE flags and the file; the capacity is a microbatch's (m: pp when not given)
    int m = f->microbatches != ARG_NOT_GIVEN ? f->microbatches : run->mesh.size[AXIS_PP];
    MoeConfig cfg = moe_config_checked(run, &f->moe, m);
    // the layout: one function the planner calls too (composed_rules.h)
    cp_parse_flags(f->cp_mode_name, f->cp_balance_name, 1, &f->cp_mode, &f->cp_balance);
    ComposedLayout lay = {.B = setup->B, .T = setup->T, .num_layers = cfg.gpt.num_layers, .num_heads = cfg.gpt.num_heads,
                          .zero = f->zero, .microbatches = f->microbatches, .virtual_chunks = f->virtual_chunks,
                          .schedule = f->schedule, .cp_mode = f->cp_mode, .cp_balance = f->cp_balance,
                          .ep_overlap = f->moe.ep_overlap};
    for (int x = 0; x < NUM_AXES; x++) lay.mesh[x] = run->mesh.size[x];
    char msg[ERROR_MAX];
    if (composed_layout_problem(&lay, msg, sizeof(msg))) fail_all("%s", msg);
    if (!composed_pipelined(&lay)) f->schedule = "1f1b";  // one stage, one microbatch: one F, then one B
    return cfg;
}
