// test_model.c: the whole GPT: gradients, loss at init, learning, init slices,
// checkpoint files, memory accounting.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data.h"
#include "memory.h"
#include "model.h"
#include "test.h"

static uint64_t rng_state = 42;
static double uniform(void) {  // xorshift64*, in [0, 1)
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return (double)((rng_state * 2685821657736338717ull) >> 11) / 9007199254740992.0;
}

static void random_tokens(int* x, int n, int V) {
    for (int i = 0; i < n; i++) x[i] = (int)(uniform() * V);
}

// A model small enough for finite differences, with vocabulary padding
// (V = 29 real tokens, Vp = 32 rows) so the padding rules are exercised too.
static const GPTConfig small_cfg = {.max_seq_len = 8, .vocab_size = 29, .padded_vocab_size = 32,
                                    .num_layers = 2, .num_heads = 2, .channels = 8};

// ---------------------------------------------------------------- gradients

// (loss(p + h d) - loss(p - h d)) / 2h, moving only the n parameters at off.
static double directional_fd(GPT* m, const float* p0, size_t off, size_t n, const double* d,
                             double h, const int* inputs, const int* targets) {
    for (size_t i = 0; i < n; i++) m->params[off + i] = (float)(p0[off + i] + h * d[i]);
    double lp = gpt_forward(m, inputs, targets);
    for (size_t i = 0; i < n; i++) m->params[off + i] = (float)(p0[off + i] - h * d[i]);
    double lm = gpt_forward(m, inputs, targets);
    memcpy(m->params + off, p0 + off, n * sizeof(float));
    return (lp - lm) / (2 * h);
}

// For each of the 16 tensors: the directional derivative of the loss along a
// random direction d inside that tensor, by central finite differences,
// against the analytic gradient's dot product g.d. The direction mixes the
// gradient itself (so the change in loss is large against fp32 rounding) and
// random noise (so an error in any component shows).
static void test_whole_model_gradient(void) {
    const GPTConfig* cfg = &small_cfg;
    int B = 2, T = 6;
    GPT m;
    gpt_create(&m, cfg, B, T, 7);
    int inputs[12], targets[12];
    random_tokens(inputs, B * T, cfg->vocab_size);
    random_tokens(targets, B * T, cfg->vocab_size);
    // At init the weights are so small that every op works near its linear
    // regime (GELU near x/2, attention near uniform), where some wrong
    // gradients look right; LayerNorm weights of exactly 1 and biases of 0 hide
    // others. So move every parameter well away from init (padded wte rows stay 0).
    size_t P = m.num_params;
    for (size_t i = 0; i < P; i++) m.params[i] += (float)(uniform() - 0.5);
    size_t pad0 = (size_t)cfg->vocab_size * cfg->channels;
    for (size_t i = pad0; i < param_tensor_numel(cfg, P_WTE); i++) m.params[i] = 0.0f;

    gpt_forward(&m, inputs, targets);
    gpt_zero_grad(&m);
    gpt_backward(&m);
    float* g = malloc(P * sizeof(float));
    memcpy(g, m.grads, P * sizeof(float));
    float* p0 = malloc(P * sizeof(float));
    memcpy(p0, m.params, P * sizeof(float));

    double worst = 0.0;
    const char* worst_name = "";
    for (ParamTensor t = 0; t < NUM_PARAM_TENSORS; t++) {
        int layers = param_tensor_is_block(t) ? cfg->num_layers : 1;
        for (int l = 0; l < layers; l++) {
            size_t off = gpt_tensor_offset(cfg, t, l), n = param_tensor_numel(cfg, t);
            double gnorm = 0.0;
            for (size_t i = 0; i < n; i++) gnorm += (double)g[off + i] * g[off + i];
            gnorm = sqrt(gnorm / n) + 1e-4;
            double* d = malloc(n * sizeof(double));
            double gd = 0.0, dnorm = 0.0;
            for (size_t i = 0; i < n; i++) {
                d[i] = g[off + i] + gnorm * (uniform() - 0.5);
                dnorm += d[i] * d[i];
            }
            dnorm = sqrt(dnorm);
            for (size_t i = 0; i < n; i++) {
                d[i] /= dnorm;
                gd += d[i] * g[off + i];
            }
            // central differences at h and h/2, combined (Richardson) so the
            // h^2 truncation term cancels and the curvature of the loss along
            // d does not count as error
            const double h = 1e-2;
            double fd_h = directional_fd(&m, p0, off, n, d, h, inputs, targets);
            double fd_h2 = directional_fd(&m, p0, off, n, d, h / 2, inputs, targets);
            double fd = (4.0 * fd_h2 - fd_h) / 3.0;
            // relative to the gradient along d, with a floor of 1e-2: the fp32
            // loss is only good to ~1e-7, so below |g.d| ~ 1e-2 the finite
            // difference itself carries ~1e-5 of absolute noise
            double err = fabs(fd - gd) / (fabs(gd) + 1e-2);
            if (getenv("FD_VERBOSE")) printf("  %-9s l%d gd %+.6e fd %+.6e rel %.2e\n", param_tensor_name(t), l, gd, fd, err);
            if (err > worst) {
                worst = err;
                worst_name = param_tensor_name(t);
            }
            free(d);
        }
    }
    // Measured worst here is ~3e-4; a wrong gradient (GELU's derivative taken
    // at its output, a matmul backward fed the wrong input: both tried) is
    // off by 0.3 to 0.9.
    check(worst < 3e-3, "model: directional derivative of every tensor matches finite differences",
          "worst relative error %.3e in %s", worst, worst_name);

    // padded vocabulary rows never receive gradient
    double pad_grad = 0.0;
    for (size_t i = pad0; i < param_tensor_numel(cfg, P_WTE); i++) pad_grad += fabs(g[i]);
    check(pad_grad == 0.0, "model: padded wte rows get zero gradient", "sum |g| = %g", pad_grad);
    free(g);
    free(p0);
    gpt_free(&m);
}

// ---------------------------------------------------------------- loss and learning

static void test_loss_at_init_and_overfit(void) {
    GPTConfig cfg;
    gpt_preset("tiny", &cfg);
    int B = 4, T = 32;
    GPT m;
    gpt_create(&m, &cfg, B, T, 1337);
    gpt_create_optimizer(&m);
    int inputs[128], targets[128];
    random_tokens(inputs, B * T, cfg.vocab_size);
    random_tokens(targets, B * T, cfg.vocab_size);
    float loss0 = gpt_forward(&m, inputs, targets);
    // near-zero logits at init: every token equally likely, loss = ln V
    check(fabs(loss0 - log(cfg.vocab_size)) < 0.05, "model: loss at init is close to ln(V)",
          "loss %.4f, ln V = %.4f", loss0, log(cfg.vocab_size));

    // one batch, many steps: a working model memorises it
    AdamWConfig opt = {.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 0.0f};
    float loss = loss0;
    for (int step = 0; step < 150; step++) {
        loss = gpt_forward(&m, inputs, targets);
        gpt_zero_grad(&m);
        gpt_backward(&m);
        double norm = sqrt(grad_sumsq(m.grads, m.num_params));
        adamw_update(m.params, m.grads, m.m, m.v, m.num_params, opt, step + 1, grad_clip_scale(norm, 1.0f));
    }
    check(loss < 0.5f, "model: the tiny model overfits one batch of random tokens",
          "loss after 150 steps %.4f (from %.4f)", loss, loss0);
    gpt_free(&m);
}

// ---------------------------------------------------------------- init

static void test_init_slices(void) {
    GPTConfig cfg;
    gpt_preset("tiny", &cfg);
    cfg.vocab_size = 250;  // 6 padded rows
    size_t P = gpt_num_params(&cfg);
    float* full = malloc(P * sizeof(float));
    gpt_init_range(full, 0, P, &cfg, 99);
    // slices: odd starts and lengths, across tensor and layer boundaries, and
    // the shards of an N-way split with padding, as FSDP will cut them
    int ok = 1;
    size_t bad_at = 0;
    for (int trial = 0; trial < 200 && ok; trial++) {
        size_t start = (size_t)(uniform() * P), count = (size_t)(uniform() * (P - start)) + 1;
        if (start + count > P) count = P - start;
        float* part = malloc(count * sizeof(float));
        gpt_init_range(part, start, count, &cfg, 99);
        for (size_t i = 0; i < count; i++)
            if (part[i] != full[start + i]) { ok = 0; bad_at = start + i; break; }
        free(part);
    }
    for (int n = 1; n <= 7 && ok; n++) {
        size_t shard = (P + n - 1) / n;
        for (int r = 0; r < n && ok; r++) {
            size_t start = r * shard, count = start < P ? (P - start < shard ? P - start : shard) : 0;
            float* part = malloc((count ? count : 1) * sizeof(float));
            gpt_init_range(part, start, count, &cfg, 99);
            for (size_t i = 0; i < count; i++)
                if (part[i] != full[start + i]) { ok = 0; bad_at = start + i; break; }
            free(part);
        }
    }
    check(ok, "init: every slice initialised alone equals that slice of the full init",
          "first difference at flat index %zu", bad_at);

    // the rule itself: value depends on (seed, tensor, layer, index) only
    check(full[gpt_tensor_offset(&cfg, P_QKVW, 1) + 5] == gpt_init_value(&cfg, 99, P_QKVW, 1, 5),
          "init: a value is the counter-based value of its (tensor, layer, index)", "mismatch");
    double pad = 0.0;
    for (size_t i = (size_t)cfg.vocab_size * cfg.channels; i < param_tensor_numel(&cfg, P_WTE); i++)
        pad += fabs(full[i]);
    check(pad == 0.0, "init: padded wte rows are zero", "sum |w| = %g", pad);
    int ln_ok = full[gpt_tensor_offset(&cfg, P_LN2W, 1)] == 1.0f && full[gpt_tensor_offset(&cfg, P_LNFW, 0)] == 1.0f &&
                full[gpt_tensor_offset(&cfg, P_QKVB, 0) + 3] == 0.0f;
    check(ln_ok, "init: LayerNorm weights are 1 and biases 0", "wrong constant init");
    // standard deviations: 0.02, and 0.02/sqrt(2L) for the residual projections
    double s1 = 0.0, s2 = 0.0;
    size_t n1 = param_tensor_numel(&cfg, P_FCW), n2 = param_tensor_numel(&cfg, P_FCPROJW);
    const float* fcw = full + gpt_tensor_offset(&cfg, P_FCW, 0);
    const float* fcprojw = full + gpt_tensor_offset(&cfg, P_FCPROJW, 0);
    for (size_t i = 0; i < n1; i++) s1 += (double)fcw[i] * fcw[i];
    for (size_t i = 0; i < n2; i++) s2 += (double)fcprojw[i] * fcprojw[i];
    s1 = sqrt(s1 / n1);
    s2 = sqrt(s2 / n2);
    double want2 = 0.02 / sqrt(2.0 * cfg.num_layers);
    check(fabs(s1 - 0.02) < 0.02 * 0.03 && fabs(s2 - want2) < want2 * 0.03,
          "init: weight std is 0.02, residual projections 0.02/sqrt(2L)", "fcw %.5f, fcprojw %.5f (want %.5f)", s1, s2, want2);
    // a different seed gives different weights, the same seed the same
    float other[16], again[16];
    gpt_init_range(other, gpt_tensor_offset(&cfg, P_WPE, 0), 16, &cfg, 100);
    gpt_init_range(again, gpt_tensor_offset(&cfg, P_WPE, 0), 16, &cfg, 99);
    check(memcmp(other, full + gpt_tensor_offset(&cfg, P_WPE, 0), sizeof(other)) != 0 &&
              memcmp(again, full + gpt_tensor_offset(&cfg, P_WPE, 0), sizeof(again)) == 0,
          "init: the seed changes the weights, and only the seed", "seed has no effect or is not repeatable");
    free(full);
}

// ---------------------------------------------------------------- checkpoint

static void test_checkpoint(void) {
    GPTConfig cfg = small_cfg;
    size_t P = gpt_num_params(&cfg);
    float* params = malloc(P * sizeof(float));
    for (size_t i = 0; i < P; i++) params[i] = (float)(uniform() - 0.5);
    char msg[1024];
    const char* path = tmp_path("test_model_ckpt.bin");
    const char* bad = checkpoint_write(path, &cfg, params, msg, sizeof(msg));
    check(bad == NULL, "checkpoint: write succeeds", "%s", bad ? bad : "");

    GPTConfig back;
    float* loaded = calloc(P, sizeof(float));
    bad = checkpoint_read_config(path, &back, msg, sizeof(msg));
    if (!bad) bad = checkpoint_read_params(path, &back, loaded, msg, sizeof(msg));
    check(bad == NULL && memcmp(&back, &cfg, sizeof(cfg)) == 0 && memcmp(loaded, params, P * sizeof(float)) == 0,
          "checkpoint: round trip gives the same config and parameters bit for bit", "%s", bad ? bad : "data differs");

    // the file is llm.c's: header fields, then tensor-major order
    FILE* f = fopen(path, "rb");
    int header[256];
    size_t got = fread(header, sizeof(int), 256, f);
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    check(got == 256 && header[0] == 20240326 && header[1] == 3 && header[2] == cfg.max_seq_len &&
              header[3] == cfg.vocab_size && header[4] == cfg.num_layers && header[5] == cfg.num_heads &&
              header[6] == cfg.channels && header[7] == cfg.padded_vocab_size && size == 1024 + 4 * (long)P,
          "checkpoint: llm.c header and size", "header or size wrong (size %ld)", size);
    // in the file, ln1w of layer 1 directly follows ln1w of layer 0
    size_t C = cfg.channels;
    long file_off = 1024 + 4 * (long)(param_tensor_numel(&cfg, P_WTE) + param_tensor_numel(&cfg, P_WPE) + C);
    float row[8];
    fseek(f, file_off, SEEK_SET);
    got = fread(row, sizeof(float), C, f);
    fclose(f);
    check(got == C && memcmp(row, params + gpt_tensor_offset(&cfg, P_LN1W, 1), C * sizeof(float)) == 0,
          "checkpoint: file is tensor-major (all layers of a tensor together)", "ln1w of layer 1 not where llm.c puts it");

    // broken files: each gives a message that names the problem
    size_t full_size = 1024 + 4 * P;
    unsigned char* bytes = malloc(full_size);
    f = fopen(path, "rb");
    got = fread(bytes, 1, full_size, f);
    fclose(f);
    const char* broken = tmp_path("test_model_broken.bin");
    struct { const char* name; int field; int value; size_t len; const char* expect; } cases[] = {
        {"wrong magic", 0, 12345, full_size, "magic"},
        {"bf16 version", 1, 5, full_size, "bf16"},
        {"unknown version", 1, 7, full_size, "version"},
        {"truncated", -1, 0, full_size - 4, "truncated"},
        {"header only part", -1, 0, 100, "too short"},
        {"heads do not divide channels", 5, 3, full_size, "divisible"},
    };
    for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
        int saved = 0;
        if (cases[k].field >= 0) {
            memcpy(&saved, bytes + 4 * cases[k].field, 4);
            memcpy(bytes + 4 * cases[k].field, &cases[k].value, 4);
        }
        write_bytes(broken, bytes, cases[k].len);
        if (cases[k].field >= 0) memcpy(bytes + 4 * cases[k].field, &saved, 4);
        GPTConfig c2;
        bad = checkpoint_read_config(broken, &c2, msg, sizeof(msg));
        char name[128];
        snprintf(name, sizeof(name), "checkpoint: %s is refused with a message", cases[k].name);
        check(bad != NULL && strstr(bad, cases[k].expect) != NULL, name, "got: %s", bad ? bad : "(accepted)");
    }
    // a crafted header whose 64-bit parameter count wraps around to exactly 0
    // (C = 2^30, L = 1321528368, maxT = 142, V = Vp = 256): a header-only
    // file would match the size it promises if the count were not checked
    int crafted[256] = {20240326, 3, 142, 256, 1321528368, 1, 1 << 30, 256};
    write_bytes(broken, crafted, sizeof(crafted));
    bad = checkpoint_read_config(broken, &back, msg, sizeof(msg));
    check(bad != NULL && strstr(bad, "too large") != NULL,
          "checkpoint: a header whose parameter count overflows 64 bits is refused", "got: %s", bad ? bad : "(accepted)");
    bad = checkpoint_read_config(tmp_path("no_such_checkpoint.bin"), &back, msg, sizeof(msg));
    check(bad && strstr(bad, "cannot open"), "checkpoint: a missing file is refused with a message", "got: %s", bad ? bad : "(accepted)");
    // writing into a directory that does not exist fails cleanly, leaving no file
    bad = checkpoint_write("/nonexistent-dir/x.bin", &cfg, params, msg, sizeof(msg));
    check(bad != NULL, "checkpoint: an unwritable path is refused with a message", "write claimed success");
    remove(path);
    remove(broken);
    free(bytes);
    free(params);
    free(loaded);
}

// ---------------------------------------------------------------- memory accounting

// The formula of docs/00_mesh.md, written out independently of model.c.
static void test_memory_formula(void) {
    GPTConfig cfg = small_cfg;
    int B = 3, T = 7;
    double P = (double)cfg.padded_vocab_size * cfg.channels + (double)cfg.max_seq_len * cfg.channels +
               cfg.num_layers * (12.0 * cfg.channels * cfg.channels + 13.0 * cfg.channels) + 2.0 * cfg.channels;
    double C = cfg.channels, L = cfg.num_layers, NH = cfg.num_heads, Vp = cfg.padded_vocab_size;
    // per token: embedding output C; per layer 18C + NH*T + 4; head C + Vp + 6;
    // backward scratch 13C + NH*T; residual gradient C; input and target ids 2
    double acts = 4.0 * B * T * (C + L * (18 * C + NH * T + 4) + (C + Vp + 6) + (13 * C + NH * T) + C + 2);
    mem_reset_peaks();
    size_t before[MEM_NUM_CATEGORIES];
    for (int c = 0; c < MEM_NUM_CATEGORIES; c++) before[c] = mem_current(c);
    GPT m;
    gpt_create(&m, &cfg, B, T, 1);
    gpt_create_optimizer(&m);
    int inputs[21] = {0}, targets[21] = {0};
    gpt_forward(&m, inputs, targets);
    gpt_backward(&m);
    int ok = mem_peak(MEM_PARAMS) - before[MEM_PARAMS] == 4 * P &&
             mem_peak(MEM_GRADS) - before[MEM_GRADS] == 4 * P &&
             mem_peak(MEM_OPTIMIZER) - before[MEM_OPTIMIZER] == 8 * P &&
             mem_peak(MEM_ACTIVATIONS) - before[MEM_ACTIVATIONS] == acts;
    check(ok, "memory: measured peaks equal the formula (4P params, 4P grads, 8P AdamW, activations)",
          "params %zu (want %.0f), grads %zu, optimizer %zu (want %.0f), activations %zu (want %.0f)",
          mem_peak(MEM_PARAMS), 4 * P, mem_peak(MEM_GRADS), mem_peak(MEM_OPTIMIZER), 8 * P,
          mem_peak(MEM_ACTIVATIONS), acts);
    gpt_free(&m);
    check(mem_current(MEM_PARAMS) == before[MEM_PARAMS] && mem_current(MEM_ACTIVATIONS) == before[MEM_ACTIVATIONS],
          "memory: gpt_free returns every byte", "params %zu, activations %zu still allocated",
          mem_current(MEM_PARAMS), mem_current(MEM_ACTIVATIONS));
}

// The hook of gpt_backward_hooked reports boundaries from the top of the
// layout down to 0, and every gradient above a reported boundary is final
// then: nothing written later lands above it.
typedef struct {
    GPT* m;
    size_t boundaries[16];
    int n;
    float* snapshot;  // the gradients when each boundary was reported
    int ok;
} HookLog;

static void record_boundary(void* ctx, size_t boundary) {
    HookLog* h = ctx;
    if (h->n > 0 && boundary >= h->boundaries[h->n - 1]) h->ok = 0;
    h->boundaries[h->n++] = boundary;
    memcpy(h->snapshot + (size_t)(h->n - 1) * h->m->num_params, h->m->grads, h->m->num_params * sizeof(float));
}

static void test_backward_hook_and_loss_scale(void) {
    const GPTConfig* cfg = &small_cfg;
    GPT m;
    gpt_create(&m, cfg, 2, 5, 3);
    int inputs[10], targets[10];
    random_tokens(inputs, 10, cfg->vocab_size);
    random_tokens(targets, 10, cfg->vocab_size);
    HookLog h = {.m = &m, .n = 0, .ok = 1};
    h.snapshot = malloc(sizeof(float) * m.num_params * (cfg->num_layers + 2));
    gpt_forward(&m, inputs, targets);
    gpt_zero_grad(&m);
    gpt_backward_hooked(&m, record_boundary, &h);
    int final_ok = h.n == cfg->num_layers + 2 && h.boundaries[h.n - 1] == 0;
    for (int k = 0; k < h.n && final_ok; k++)
        for (size_t i = h.boundaries[k]; i < m.num_params; i++)
            if (h.snapshot[(size_t)k * m.num_params + i] != m.grads[i]) { final_ok = 0; break; }
    check(h.ok && final_ok, "model: backward hook reports falling boundaries, gradients above each are final",
          "%d boundaries, order ok %d, final ok %d", h.n, h.ok, final_ok);
    // loss_scale scales every gradient
    float* g1 = malloc(m.num_params * sizeof(float));
    memcpy(g1, m.grads, m.num_params * sizeof(float));
    m.loss_scale = 0.25f;
    gpt_forward(&m, inputs, targets);
    gpt_zero_grad(&m);
    gpt_backward(&m);
    double worst = 0.0;
    for (size_t i = 0; i < m.num_params; i++) {
        double d = fabs(m.grads[i] - 0.25 * g1[i]);
        if (d > worst) worst = d;
    }
    check(worst < 1e-7, "model: loss_scale multiplies the gradients", "max |g - 0.25 g1| = %g", worst);
    free(g1);
    free(h.snapshot);
    gpt_free(&m);
}

// ---------------------------------------------------------------- backward in two halves

// Three layers, so that the input halves of other layers run between a
// layer's two halves, and vocabulary padding (V = 61, Vp = 64).
static const GPTConfig split_cfg = {.max_seq_len = 16, .vocab_size = 61, .padded_vocab_size = 64,
                                    .num_layers = 3, .num_heads = 4, .channels = 32};

static int same_floats(const float* a, const float* b, size_t n) {
    return memcmp(a, b, n * sizeof(float)) == 0;
}

// A model moved well away from init (LayerNorm weights of 1 and zero biases
// would leave some paths untested), with a forward done on random tokens.
static void split_model(GPT* m, int B, int T, int* inputs, int* targets) {
    gpt_create(m, &split_cfg, B, T, 11);
    for (size_t i = 0; i < m->num_params; i++) m->params[i] += (float)(uniform() - 0.5);
    size_t pad0 = (size_t)split_cfg.vocab_size * split_cfg.channels;
    for (size_t i = pad0; i < param_tensor_numel(&split_cfg, P_WTE); i++) m->params[i] = 0.0f;
    random_tokens(inputs, B * T, split_cfg.vocab_size);
    random_tokens(targets, B * T, split_cfg.vocab_size);
    gpt_forward(m, inputs, targets);
}

// The input halves of every layer (l = L-1..0, sharing one scratch as a
// pipeline stage would, each leaving its own stash) and the weight halves
// afterwards in another order (0..L-1) give the bits of block_backward for
// l = L-1..0: every parameter gradient and the input gradient. The stash is
// what carries the weight gradients' inputs across the other layers' input
// halves: with the stash laid over the shared scratch (as block_backward lays
// it) this fails (tried).
static void test_split_block_backward(void) {
    const GPTConfig* c = &split_cfg;
    int B = 2, T = 8, C = c->channels, NH = c->num_heads, L = c->num_layers;
    int inputs[16], targets[16];
    GPT m;
    split_model(&m, B, T, inputs, targets);
    size_t NC = (size_t)B * T * C, G = (size_t)L * gpt_block_numel(C);
    float* dtop = malloc(NC * sizeof(float));  // d loss / d last block's output: random
    for (size_t i = 0; i < NC; i++) dtop[i] = (float)(uniform() - 0.5);
    float* g_fused = calloc(G, sizeof(float));
    float* g_split = calloc(G, sizeof(float));
    float* d_fused = malloc(NC * sizeof(float));
    float* d_split = malloc(NC * sizeof(float));
    float* stash = malloc((size_t)L * block_stash_numel(B, T, C) * sizeof(float));
    BlockScratch s = gpt_acts_scratch(&m.acts, c);
    float* block0 = m.params + gpt_block_offset(c, 0);

    memcpy(d_fused, dtop, NC * sizeof(float));
    for (int l = L - 1; l >= 0; l--) {
        BlockParams p = block_params_at(block0 + (size_t)l * gpt_block_numel(C), C);
        BlockParams g = block_params_at(g_fused + (size_t)l * gpt_block_numel(C), C);
        BlockActs a = gpt_acts_block(&m.acts, c, l, B, T);
        const float* x = l > 0 ? gpt_acts_block(&m.acts, c, l - 1, B, T).res3 : m.acts.encoded;
        block_backward(&p, &g, &a, &s, x, d_fused, B, T, C, NH);
    }

    memcpy(d_split, dtop, NC * sizeof(float));
    for (int l = L - 1; l >= 0; l--) {
        BlockParams p = block_params_at(block0 + (size_t)l * gpt_block_numel(C), C);
        BlockActs a = gpt_acts_block(&m.acts, c, l, B, T);
        const float* x = l > 0 ? gpt_acts_block(&m.acts, c, l - 1, B, T).res3 : m.acts.encoded;
        BlockStash st = block_stash_at(stash + (size_t)l * block_stash_numel(B, T, C), B, T, C);
        block_backward_input(&p, &a, &s, &st, x, d_split, B, T, C, NH);
    }
    // d x of block 0 is final before any weight gradient exists
    int input_same = same_floats(d_split, d_fused, NC);
    double untouched = 0.0;
    for (size_t i = 0; i < G; i++) untouched += fabs(g_split[i]);
    for (int l = 0; l < L; l++) {
        BlockParams g = block_params_at(g_split + (size_t)l * gpt_block_numel(C), C);
        BlockActs a = gpt_acts_block(&m.acts, c, l, B, T);
        const float* x = l > 0 ? gpt_acts_block(&m.acts, c, l - 1, B, T).res3 : m.acts.encoded;
        BlockStash st = block_stash_at(stash + (size_t)l * block_stash_numel(B, T, C), B, T, C);
        block_backward_weights(&g, &a, &st, x, B, T, C);
    }
    check(input_same && untouched == 0.0,
          "split backward: input halves of 3 layers give block_backward's d x bitwise, writing no parameter gradient",
          "d x same %d, |parameter gradients| after the input halves %g", input_same, untouched);
    size_t first_diff = G;
    for (size_t i = 0; i < G && first_diff == G; i++)
        if (memcmp(&g_split[i], &g_fused[i], sizeof(float)) != 0) first_diff = i;
    check(first_diff == G,
          "split backward: weight halves run later, in another layer order, give block_backward's gradients bitwise",
          "first difference at block-gradient index %zu (layer %zu): %.9g vs %.9g", first_diff,
          first_diff / gpt_block_numel(C), first_diff < G ? g_split[first_diff] : 0.0,
          first_diff < G ? g_fused[first_diff] : 0.0);
    free(dtop); free(g_fused); free(g_split); free(d_fused); free(d_split); free(stash);
    gpt_free(&m);
}

// The head, the same way: head_backward against its input half, then a
// block's input half on the shared scratch (clobbering it), then its weight
// half. head_backward overwrites the logits with dlogits, so each runs after
// its own forward (the same bits: forward is deterministic).
static void test_split_head_backward(void) {
    const GPTConfig* c = &split_cfg;
    int B = 2, T = 8, C = c->channels, NH = c->num_heads, L = c->num_layers;
    int inputs[16], targets[16];
    GPT m;
    split_model(&m, B, T, inputs, targets);
    size_t NC = (size_t)B * T * C, Vp = (size_t)c->padded_vocab_size;
    size_t nhead = Vp * C + 2 * (size_t)C;  // dwte, dlnfw, dlnfb
    float* g_fused = calloc(nhead, sizeof(float));
    float* g_split = calloc(nhead, sizeof(float));
    float* d_fused = malloc(NC * sizeof(float));
    float* dlnf = malloc(NC * sizeof(float));
    float* stash = malloc(block_stash_numel(B, T, C) * sizeof(float));
    const float* wte = m.params + gpt_tensor_offset(c, P_WTE, 0);
    const float* lnfw = m.params + gpt_tensor_offset(c, P_LNFW, 0);
    const float* last = gpt_acts_block(&m.acts, c, L - 1, B, T).res3;
    HeadActs h = gpt_acts_head(&m.acts, c, B, T);
    BlockScratch s = gpt_acts_scratch(&m.acts, c);
    float dloss = 1.0f / (float)(B * T);
    head_backward(c, wte, lnfw, g_fused, g_fused + Vp * C, g_fused + Vp * C + C, &h, last,
                  m.acts.targets, dloss, s.dln, d_fused, B, T);

    gpt_forward(&m, inputs, targets);
    head_backward_input(c, wte, lnfw, &h, last, m.acts.targets, dloss, dlnf, m.acts.dres, B, T);
    int input_same = same_floats(m.acts.dres, d_fused, NC);
    // the block below runs its input half, on the shared scratch, in between
    BlockParams p = block_params_at(m.params + gpt_block_offset(c, L - 1), C);
    BlockActs a = gpt_acts_block(&m.acts, c, L - 1, B, T);
    BlockStash st = block_stash_at(stash, B, T, C);
    block_backward_input(&p, &a, &s, &st, gpt_acts_block(&m.acts, c, L - 2, B, T).res3, m.acts.dres, B, T, C, NH);
    head_backward_weights(c, g_split, g_split + Vp * C, g_split + Vp * C + C, &h, last, dlnf, B, T);
    check(input_same, "split backward: the head's input half gives head_backward's d x bitwise", "differs");
    check(same_floats(g_split, g_fused, nhead),
          "split backward: the head's weight half, run after a block's input half, gives dwte, dlnfw, dlnfb bitwise",
          "differs");
    free(g_fused); free(g_split); free(d_fused); free(dlnf); free(stash);
    gpt_free(&m);
}

// The whole model both ways: gpt_backward against every input half first
// (head, blocks L-1..0, the embedding needs only d x), then every weight half
// (blocks 0..L-1, the head), then the embedding. All gradients, bitwise. The
// head's weight half goes before encoder_backward: both add into dwte, and
// that is the fused order.
static void test_split_model_backward(void) {
    const GPTConfig* c = &split_cfg;
    int B = 2, T = 8, C = c->channels, NH = c->num_heads, L = c->num_layers;
    int inputs[16], targets[16];
    GPT m;
    split_model(&m, B, T, inputs, targets);
    size_t P = m.num_params, NC = (size_t)B * T * C;
    gpt_zero_grad(&m);
    gpt_backward(&m);
    float* g_fused = malloc(P * sizeof(float));
    memcpy(g_fused, m.grads, P * sizeof(float));

    gpt_forward(&m, inputs, targets);
    gpt_zero_grad(&m);
    float *Pm = m.params, *G = m.grads;
    float* dlnf = malloc(NC * sizeof(float));
    float* stash = malloc((size_t)L * block_stash_numel(B, T, C) * sizeof(float));
    HeadActs h = gpt_acts_head(&m.acts, c, B, T);
    BlockScratch s = gpt_acts_scratch(&m.acts, c);
    const float* last = gpt_acts_block(&m.acts, c, L - 1, B, T).res3;
    head_backward_input(c, Pm + gpt_tensor_offset(c, P_WTE, 0), Pm + gpt_tensor_offset(c, P_LNFW, 0), &h,
                        last, m.acts.targets, 1.0f / (float)(B * T), dlnf, m.acts.dres, B, T);
    for (int l = L - 1; l >= 0; l--) {
        BlockParams p = block_params_at(Pm + gpt_block_offset(c, l), C);
        BlockActs a = gpt_acts_block(&m.acts, c, l, B, T);
        const float* x = l > 0 ? gpt_acts_block(&m.acts, c, l - 1, B, T).res3 : m.acts.encoded;
        BlockStash st = block_stash_at(stash + (size_t)l * block_stash_numel(B, T, C), B, T, C);
        block_backward_input(&p, &a, &s, &st, x, m.acts.dres, B, T, C, NH);
    }
    for (int l = 0; l < L; l++) {
        BlockParams g = block_params_at(G + gpt_block_offset(c, l), C);
        BlockActs a = gpt_acts_block(&m.acts, c, l, B, T);
        const float* x = l > 0 ? gpt_acts_block(&m.acts, c, l - 1, B, T).res3 : m.acts.encoded;
        BlockStash st = block_stash_at(stash + (size_t)l * block_stash_numel(B, T, C), B, T, C);
        block_backward_weights(&g, &a, &st, x, B, T, C);
    }
    head_backward_weights(c, G + gpt_tensor_offset(c, P_WTE, 0), G + gpt_tensor_offset(c, P_LNFW, 0),
                          G + gpt_tensor_offset(c, P_LNFB, 0), &h, last, dlnf, B, T);
    encoder_backward(G + gpt_tensor_offset(c, P_WTE, 0), G + gpt_tensor_offset(c, P_WPE, 0), m.acts.dres,
                     m.acts.inputs, B, T, C);
    size_t first_diff = P;
    for (size_t i = 0; i < P && first_diff == P; i++)
        if (memcmp(&G[i], &g_fused[i], sizeof(float)) != 0) first_diff = i;
    check(first_diff == P, "split backward: the whole model, all input halves then all weight halves, gives gpt_backward's gradients bitwise",
          "first difference at flat offset %zu of %zu", first_diff, P);
    free(g_fused); free(dlnf); free(stash);
    gpt_free(&m);
}

// FLOPs per token (docs/00_mesh.md, section 6.1): 6 * (12*L*C^2 + Vp*C) +
// 12*L*T*C, worked out by hand for the two presets.
static void test_flops_per_token(void) {
    GPTConfig tiny, small;
    check(gpt_preset("tiny", &tiny) && gpt_preset("small", &small), "presets tiny and small exist", "missing");
    // tiny: 6 * (12*2*64^2 + 256*64) + 12*2*64*64 = 6 * 114688 + 98304
    double t = gpt_flops_per_token(&tiny, 64), s = gpt_flops_per_token(&small, 256);
    check(t == 786432.0, "flops per token, tiny at T=64: 786,432", "got %.0f", t);
    // small: 6 * (12*6*384^2 + 256*384) + 12*6*256*384 = 6 * 10715136 + 7077888
    check(s == 71368704.0, "flops per token, small at T=256: 71,368,704", "got %.0f", s);
}

// --recompute (model.h): selective and full recompute what they dropped by
// repeating the same ops on the same inputs, so the loss and every gradient
// are the same bits as with none; what each mode allocates for activations
// is its formula to the byte (docs/recompute.md); sampling (a smaller batch
// through the same buffers) gives the same tokens.
static void test_recompute(void) {
    const GPTConfig* c = &small_cfg;
    int B = 3, T = 8, C = c->channels, NH = c->num_heads, L = c->num_layers, Vp = c->padded_vocab_size;
    int inputs[24], targets[24];
    random_tokens(inputs, B * T, c->vocab_size);
    random_tokens(targets, B * T, c->vocab_size);
    float* ref = NULL;
    float ref_loss = 0.0f;
    int ref_sample[12];
    for (int mode = RECOMPUTE_NONE; mode < NUM_RECOMPUTE_MODES; mode++) {
        const char* name = recompute_name((RecomputeMode)mode);
        size_t before = mem_current(MEM_ACTIVATIONS);
        GPT m;
        gpt_create_recompute(&m, c, B, T, 7, (RecomputeMode)mode);
        gpt_create_optimizer(&m);
        size_t got = mem_current(MEM_ACTIVATIONS) - before;
        size_t per_layer = mode == RECOMPUTE_NONE ? 18 * (size_t)C + (size_t)NH * T + 4
                           : mode == RECOMPUTE_SELECTIVE ? 12 * (size_t)C + 4 : (size_t)C;
        size_t transient = mode == RECOMPUTE_NONE ? 0
                           : mode == RECOMPUTE_SELECTIVE ? 6 * (size_t)C + (size_t)NH * T
                                                         : 18 * (size_t)C + (size_t)NH * T + 4;
        size_t want = 4 * (size_t)B * T * (C + L * per_layer + transient + (C + Vp + 6) + (13 * C + NH * T) + C + 2);
        char what[160];
        snprintf(what, sizeof(what), "recompute %s: activation bytes = 4BT[C + L*%zu + %zu + (C+Vp+6) + (13C+NH*T) + C + 2] = %zu",
                 name, per_layer, transient, want);
        check(got == want, what, "allocated %zu", got);
        // two steps, so the second runs on parameters the first changed
        float loss = 0.0f;
        for (int step = 0; step < 2; step++) {
            loss = gpt_forward(&m, inputs, targets);
            gpt_zero_grad(&m);
            gpt_backward(&m);
            if (step == 0)
                adamw_update(m.params, m.grads, m.m, m.v, m.num_params,
                             (AdamWConfig){.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f}, 1, 1.0f);
        }
        int sample[12];
        gpt_sample(&m, inputs, 3, sample, 12, 5);
        if (mode == RECOMPUTE_NONE) {
            ref = malloc(m.num_params * sizeof(float));
            memcpy(ref, m.grads, m.num_params * sizeof(float));
            ref_loss = loss;
            memcpy(ref_sample, sample, sizeof(sample));
        } else {
            size_t first = m.num_params;
            for (size_t i = 0; i < m.num_params && first == m.num_params; i++)
                if (memcmp(&m.grads[i], &ref[i], sizeof(float)) != 0) first = i;
            snprintf(what, sizeof(what), "recompute %s: the loss and every gradient of a second step are none's bitwise, and sampling gives the same tokens", name);
            check(first == m.num_params && memcmp(&loss, &ref_loss, sizeof(float)) == 0 &&
                      memcmp(sample, ref_sample, sizeof(sample)) == 0,
                  what, "loss %.9g vs %.9g, first gradient difference at %zu of %zu", loss, ref_loss, first,
                  m.num_params);
        }
        gpt_free(&m);
    }
    free(ref);
}

int main(void) {
    test_whole_model_gradient();
    test_loss_at_init_and_overfit();
    test_init_slices();
    test_checkpoint();
    test_memory_formula();
    test_backward_hook_and_loss_scale();
    test_flops_per_token();
    test_split_block_backward();
    test_split_head_backward();
    test_split_model_backward();
    test_recompute();
    return test_exit_code();
}
