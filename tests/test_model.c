// test_model.c: the whole GPT: gradients, loss at init, learning, init slices,
// checkpoint files, memory accounting.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/wait.h>
#include <sys/stat.h>
#include <sys/resource.h>
#include <dirent.h>

#include "data.h"
#include "init.h"
#include "memory.h"
#include "model.h"
#include "model_file.h"
#include "model_tp.h"
#include "ops.h"
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
            if (isnan(err) || err > worst) {  // a NaN kept (err_max's reason)
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
    double* sumsq_dev = mem_alloc(sizeof(double), MEM_OTHER);  // grad_sumsq adds into it
    for (int step = 0; step < 150; step++) {
        loss = gpt_forward(&m, inputs, targets);
        gpt_zero_grad(&m);
        gpt_backward(&m);
        double sumsq = 0.0;
        mem_zero(sumsq_dev, sizeof(double));
        grad_sumsq(sumsq_dev, m.grads, m.num_params);
        mem_to_host(&sumsq, sumsq_dev, sizeof(double));
        double norm = sqrt(sumsq);
        adamw_update(m.params, m.grads, m.m, m.v, m.num_params, opt, step + 1, grad_clip_scale(norm, 1.0f));
    }
    check(loss < 0.5f, "model: the tiny model overfits one batch of random tokens",
          "loss after 150 steps %.4f (from %.4f)", loss, loss0);
    mem_free(sumsq_dev);
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
    // bit for bit by construction: a file round trip copies bytes (no arithmetic)
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
    // a write that fails half way (past a file-size limit of half the file,
    // in a directory it can write) leaves neither the target nor its temporary
    // file, and says why; in a child, so the limit stays there
    char dir[256];
    snprintf(dir, sizeof(dir), "%s", tmp_path("test_model_partial"));
    mkdir(dir, 0755);
    char target[300];
    snprintf(target, sizeof(target), "%s/x.bin", dir);
    remove(target);  // left by an earlier run, if any
    int pipefd[2];
    if (pipe(pipefd) != 0) abort();
    pid_t pid = fork();
    if (pid == 0) {
        rlim_t half = (rlim_t)(1024 + 4 * P) / 2;
        struct rlimit lim = {half, half};
        setrlimit(RLIMIT_FSIZE, &lim);
        char cmsg[1024];
        const char* cbad = checkpoint_write(target, &cfg, params, cmsg, sizeof(cmsg));
        if (write(pipefd[1], cbad ? cbad : "", cbad ? strlen(cbad) : 0) < 0) _exit(2);
        _exit(cbad ? 0 : 1);
    }
    close(pipefd[1]);
    char child_msg[1024] = "";
    ssize_t got_msg = read(pipefd[0], child_msg, sizeof(child_msg) - 1);
    if (got_msg > 0) child_msg[got_msg] = 0;
    close(pipefd[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    DIR* d = opendir(dir);
    int entries = 0;
    for (struct dirent* e; d && (e = readdir(d));) entries += e->d_name[0] != '.';
    if (d) closedir(d);
    check(WIFEXITED(status) && WEXITSTATUS(status) == 0 && strstr(child_msg, "File too large") && strstr(child_msg, target) &&
              entries == 0,
          "checkpoint: a write that fails half way (file-size limit) leaves no file and no temporary file, naming the target",
          "exit status %d, %d files left, message '%s'", status, entries, child_msg);
    rmdir(dir);
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
    // per token: embedding output C; per layer 18C + NH + 4 (attention keeps
    // one lse per head, nothing T x T); head C + Vp + 6; backward scratch
    // 13C; residual gradient C; input and target ids 2
    double acts = 4.0 * B * T * (C + L * (18 * C + NH + 4) + (C + Vp + 6) + 13 * C + C + 2);
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
        worst = err_max(worst, d);
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
    // bitwise by construction: the halves issue the fused backward's calls on the same rows
    check(input_same && untouched == 0.0,
          "split backward: input halves of 3 layers give block_backward's d x bitwise, writing no parameter gradient",
          "d x same %d, |parameter gradients| after the input halves %g", input_same, untouched);
    size_t first_diff = G;
    for (size_t i = 0; i < G && first_diff == G; i++)
        if (memcmp(&g_split[i], &g_fused[i], sizeof(float)) != 0) first_diff = i;
    // bitwise by construction: the same calls on the same rows; a layer's gradients never mix with another's
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
    // bitwise by construction: the halves issue the fused backward's calls on the same rows
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
    // bitwise by construction: the same calls on the same rows, each gradient summed in the fused order
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

// ---------------------------------------------------------------- tensor-parallel layouts and tiles

// With tp = 1 the tp layouts are model.h's; with tp > 1 every view lies inside
// the size the _numel function states, and the pieces have the split sizes.
static void test_tp_layouts(void) {
    int B = 3, T = 5, C = 24, NH = 6;
    float* base = (float*)64;  // pointer arithmetic only, never dereferenced
    BlockParams a = block_params_at(base, C), b = block_params_at_tp(base, C, 1);
    BlockActs x = block_acts_at(base, B, T, C, NH), y = block_acts_at_tp(base, B, T, C, NH, 1);
    BlockScratch u = block_scratch_at(base, B, T, C, NH), v = block_scratch_at_tp(base, B, T, C, NH, 1);
    int same = gpt_block_numel_tp(C, 1) == gpt_block_numel(C) &&
               block_acts_numel_tp(B, T, C, NH, 1) == block_acts_numel(B, T, C, NH) &&
               block_scratch_numel_tp(B, T, C, NH, 1) == block_scratch_numel(B, T, C, NH) &&
               memcmp(&a, &b, sizeof(a)) == 0 && memcmp(&x, &y, sizeof(x)) == 0 && memcmp(&u, &v, sizeof(u)) == 0;
    check(same, "tp layouts: tp = 1 gives model.h's block, activation and scratch layouts", "they differ");
    int ok = 1;
    for (int tp = 2; tp <= 6; tp *= 3) {  // 2 and 6 divide NH = 6
        size_t cl = (size_t)C / tp;
        BlockParams p = block_params_at_tp(base, C, tp);
        ok &= gpt_block_numel_tp(C, tp) == 12 * cl * C + 7 * cl + 6 * (size_t)C;
        ok &= (size_t)(p.fcprojb + C - base) == gpt_block_numel_tp(C, tp);
        ok &= (size_t)(p.qkvb - p.qkvw) == 3 * cl * C && (size_t)(p.fcb - p.fcw) == 4 * cl * C &&
              (size_t)(p.attprojb - p.attprojw) == C * cl && (size_t)(p.fcprojb - p.fcprojw) == 4 * cl * C;
        BlockActs q = block_acts_at_tp(base, B, T, C, NH, tp);
        ok &= (size_t)(q.res3 + (size_t)B * T * C - base) == block_acts_numel_tp(B, T, C, NH, tp);
        ok &= (size_t)(q.atty - q.qkv) == (size_t)B * T * 3 * cl && (size_t)(q.attproj - q.lse) == (size_t)B * T * (NH / tp);
        BlockScratch w = block_scratch_at_tp(base, B, T, C, NH, tp);
        ok &= (size_t)(w.dfch_gelu + (size_t)B * T * 4 * cl - base) == block_scratch_numel_tp(B, T, C, NH, tp);
    }
    check(ok, "tp layouts: tp = 2, 6 split qkvw, attprojw, fcw, fcprojw, the activations and scratch by tp",
          "a view or a size is wrong");
    // --recompute on a tp rank: tp = 1 keeps what model.h keeps; on tp = 2,
    // 6 the selective views fill the store and the transient exactly, and
    // full keeps res3 alone
    int rc = 1;
    for (int mode = 0; mode < NUM_RECOMPUTE_MODES; mode++) {
        RecomputeMode md = (RecomputeMode)mode;
        rc &= block_store_numel_tp(B, T, C, NH, 1, md) == block_store_numel(B, T, C, NH, md) &&
              block_transient_numel_tp(B, T, C, NH, 1, md) == block_transient_numel(B, T, C, NH, md);
    }
    size_t BT = (size_t)B * T;
    for (int tp = 1; tp <= 6; tp++) {
        if (NH % tp || C % tp) continue;
        size_t store = block_store_numel_tp(B, T, C, NH, tp, RECOMPUTE_SELECTIVE);
        float* tr = base + store;
        BlockActs q = block_acts_stored_tp(base, tr, B, T, C, NH, tp, RECOMPUTE_SELECTIVE);
        rc &= (size_t)(q.res3 + BT * C - base) == store && q.fch + BT * 4 * C / tp == q.res3;
        rc &= (size_t)(q.fcproj + BT * C - tr) == block_transient_numel_tp(B, T, C, NH, tp, RECOMPUTE_SELECTIVE);
        rc &= q.fch_gelu == tr && q.lse == q.atty + BT * C / tp && q.res2 == q.lse + BT * (NH / tp);
        BlockActs f = block_acts_stored_tp(base, tr, B, T, C, NH, tp, RECOMPUTE_FULL);
        BlockActs n = block_acts_stored_tp(base, tr, B, T, C, NH, tp, RECOMPUTE_NONE);
        rc &= f.res3 == base && f.ln1 == tr && block_store_numel_tp(B, T, C, NH, tp, RECOMPUTE_FULL) == BT * C &&
              block_transient_numel_tp(B, T, C, NH, tp, RECOMPUTE_FULL) == block_acts_numel_tp(B, T, C, NH, tp);
        rc &= n.ln1 == base && n.res3 == block_acts_at_tp(base, B, T, C, NH, tp).res3;
    }
    check(rc, "tp layouts: --recompute's stores and transients (tp = 1 as model.h; tp = 2, 3, 6 packed exactly)",
          "a recompute view or size is wrong");
}

// A tile initialised alone, or read from a checkpoint, equals the same rows
// and columns of the full model; placing the tiles of every tp rank's shard
// (three row ranges of qkvw, a column slice of attprojw and fcprojw, ...)
// rebuilds the full model.
static void test_tiles(void) {
    GPTConfig cfg = small_cfg;  // C = 8, NH = 2, Vp = 32
    size_t P = gpt_num_params(&cfg);
    float* full = malloc(P * sizeof(float));
    gpt_init_range(full, 0, P, &cfg, 7);
    for (size_t i = 0; i < P; i++) full[i] += (float)(0.01 * (uniform() - 0.5));  // biases nonzero too
    const char* path = tmp_path("tiles.bin");
    char msg[256];
    check(checkpoint_write(path, &cfg, full, msg, sizeof msg) == NULL, "tiles: checkpoint written", "%s", msg);
    float* init_full = malloc(P * sizeof(float));
    gpt_init_range(init_full, 0, P, &cfg, 7);
    float* rebuilt = calloc(P, sizeof(float));
    float tile[4 * 8 * 8], want[4 * 8 * 8];
    int init_ok = 1, read_ok = 1;
    int tp = 2;
    size_t C = 8, Cl = C / tp, Fl = 4 * C / tp;
    for (int r = 0; r < tp; r++) {
        for (int l = 0; l < cfg.num_layers; l++) {
            // (tensor, row0, nrows, col0, ncols) of rank r, as chapter 4 cuts them
            struct { ParamTensor t; size_t r0, nr, c0, nc; } ts[] = {
                {P_QKVW, 0 * C + r * Cl, Cl, 0, C}, {P_QKVW, 1 * C + r * Cl, Cl, 0, C}, {P_QKVW, 2 * C + r * Cl, Cl, 0, C},
                {P_QKVB, 0 * C + r * Cl, Cl, 0, 1}, {P_QKVB, 1 * C + r * Cl, Cl, 0, 1}, {P_QKVB, 2 * C + r * Cl, Cl, 0, 1},
                {P_ATTPROJW, 0, C, r * Cl, Cl}, {P_FCW, r * Fl, Fl, 0, C}, {P_FCB, r * Fl, Fl, 0, 1},
                {P_FCPROJW, 0, C, r * Fl, Fl}, {P_LN1W, 0, C, 0, 1}, {P_LN1B, 0, C, 0, 1}, {P_ATTPROJB, 0, C, 0, 1},
                {P_LN2W, 0, C, 0, 1}, {P_LN2B, 0, C, 0, 1}, {P_FCPROJB, 0, C, 0, 1}};
            for (size_t k = 0; k < sizeof(ts) / sizeof(ts[0]); k++) {
                size_t rows, cols, n = ts[k].nr * ts[k].nc;
                param_tensor_shape(&cfg, ts[k].t, &rows, &cols);
                const float* src = init_full + gpt_tensor_offset(&cfg, ts[k].t, l);
                gpt_init_tile(tile, &cfg, 7, ts[k].t, l, ts[k].r0, ts[k].nr, ts[k].c0, ts[k].nc);
                for (size_t i = 0; i < ts[k].nr; i++)
                    for (size_t j = 0; j < ts[k].nc; j++)
                        init_ok &= tile[i * ts[k].nc + j] == src[(ts[k].r0 + i) * cols + ts[k].c0 + j];
                src = full + gpt_tensor_offset(&cfg, ts[k].t, l);
                read_ok &= checkpoint_read_tile(path, &cfg, tile, ts[k].t, l, ts[k].r0, ts[k].nr, ts[k].c0, ts[k].nc,
                                                msg, sizeof msg) == NULL;
                for (size_t i = 0; i < ts[k].nr; i++)
                    for (size_t j = 0; j < ts[k].nc; j++) want[i * ts[k].nc + j] = src[(ts[k].r0 + i) * cols + ts[k].c0 + j];
                read_ok &= memcmp(tile, want, n * sizeof(float)) == 0;
                gpt_place_tile(rebuilt, &cfg, tile, ts[k].t, l, ts[k].r0, ts[k].nr, ts[k].c0, ts[k].nc);
            }
        }
        // the vocabulary rows and the unsplit tensors
        size_t Vl = (size_t)cfg.padded_vocab_size / tp;
        float* wte = malloc(Vl * C * sizeof(float));
        read_ok &= checkpoint_read_tile(path, &cfg, wte, P_WTE, 0, r * Vl, Vl, 0, C, msg, sizeof msg) == NULL;
        read_ok &= memcmp(wte, full + r * Vl * C, Vl * C * sizeof(float)) == 0;
        gpt_place_tile(rebuilt, &cfg, wte, P_WTE, 0, r * Vl, Vl, 0, C);
        free(wte);
    }
    ParamTensor whole[] = {P_WPE, P_LNFW, P_LNFB};
    for (int k = 0; k < 3; k++) {
        size_t rows, cols;
        param_tensor_shape(&cfg, whole[k], &rows, &cols);
        float* t = malloc(rows * cols * sizeof(float));
        read_ok &= checkpoint_read_tile(path, &cfg, t, whole[k], 0, 0, rows, 0, cols, msg, sizeof msg) == NULL;
        gpt_place_tile(rebuilt, &cfg, t, whole[k], 0, 0, rows, 0, cols);
        free(t);
    }
    check(init_ok, "tiles: gpt_init_tile of qkvw's row ranges, attprojw's and fcprojw's column slices equals the full init",
          "a tile differs");
    check(read_ok, "tiles: checkpoint_read_tile of every tp=2 tile equals the same rows and columns of the file",
          "a tile differs or a read failed");
    check(memcmp(rebuilt, full, P * sizeof(float)) == 0, "tiles: gpt_place_tile of both ranks' tiles rebuilds the model",
          "the rebuilt model differs");
    free(full);
    free(init_full);
    free(rebuilt);
}

// One block split over tp = 2 ranks, run rank after rank on one process with
// the all-reduces as sums (ops_add), against block_forward and block_backward
// of the whole block: column-parallel qkv and fc, attention on each rank's
// heads, row-parallel projections with the bias added once, and the f / g
// all-reduces. Outputs and every gradient (the split tensors' slices, the
// replicated tensors' copies on each rank) must agree.
static void test_tp_block(void) {
    enum { B = 2, T = 4, C = 8, NH = 2, TP = 2, N = B * T };
    const size_t NC = (size_t)N * C, Cl = C / TP, Fl = 4 * C / TP;
    size_t nb = gpt_block_numel(C), nbt = gpt_block_numel_tp(C, TP);
    float* w = mem_alloc_floats(nb, MEM_OTHER);
    float* g = mem_alloc_floats(nb, MEM_OTHER);
    for (size_t i = 0; i < nb; i++) w[i] = (float)(0.4 * (uniform() - 0.5));
    BlockParams pw = block_params_at(w, C), pg = block_params_at(g, C);
    for (int c = 0; c < C; c++) pw.ln1w[c] += 1.0f, pw.ln2w[c] += 1.0f;
    float* x = mem_alloc_floats(NC, MEM_OTHER);
    float* dout = mem_alloc_floats(NC, MEM_OTHER);
    for (size_t i = 0; i < NC; i++) x[i] = (float)(uniform() - 0.5), dout[i] = (float)(uniform() - 0.5);
    float* acts = mem_alloc_floats(block_acts_numel(B, T, C, NH), MEM_OTHER);
    float* scr = mem_alloc_floats(block_scratch_numel(B, T, C, NH), MEM_OTHER);
    float* dres = mem_alloc_floats(NC, MEM_OTHER);
    BlockActs a = block_acts_at(acts, B, T, C, NH);
    BlockScratch s = block_scratch_at(scr, B, T, C, NH);
    block_forward(&pw, &a, x, B, T, C, NH);
    ops_copy(dres, dout, NC);
    block_backward(&pw, &pg, &a, &s, x, dres, B, T, C, NH);

    // the shards: tiles copied out of the whole block, layout block_params_at_tp
    float *sp[TP], *sg[TP], *sa[TP], *ss[TP];
    BlockParams P[TP], G[TP];
    BlockActs A[TP];
    BlockScratch S[TP];
    for (int r = 0; r < TP; r++) {
        sp[r] = mem_alloc_floats(nbt, MEM_OTHER);
        sg[r] = mem_alloc_floats(nbt, MEM_OTHER);
        sa[r] = mem_alloc_floats(block_acts_numel_tp(B, T, C, NH, TP), MEM_OTHER);
        ss[r] = mem_alloc_floats(block_scratch_numel_tp(B, T, C, NH, TP), MEM_OTHER);
        P[r] = block_params_at_tp(sp[r], C, TP);
        G[r] = block_params_at_tp(sg[r], C, TP);
        A[r] = block_acts_at_tp(sa[r], B, T, C, NH, TP);
        S[r] = block_scratch_at_tp(ss[r], B, T, C, NH, TP);
        for (int k = 0; k < 3; k++) {
            memcpy(P[r].qkvw + k * Cl * C, pw.qkvw + (k * C + r * Cl) * C, Cl * C * sizeof(float));
            memcpy(P[r].qkvb + k * Cl, pw.qkvb + k * C + r * Cl, Cl * sizeof(float));
        }
        for (size_t i = 0; i < C; i++) {
            memcpy(P[r].attprojw + i * Cl, pw.attprojw + i * C + r * Cl, Cl * sizeof(float));
            memcpy(P[r].fcprojw + i * Fl, pw.fcprojw + i * 4 * C + r * Fl, Fl * sizeof(float));
        }
        memcpy(P[r].fcw, pw.fcw + r * Fl * C, Fl * C * sizeof(float));
        memcpy(P[r].fcb, pw.fcb + r * Fl, Fl * sizeof(float));
        float* rep_src[] = {pw.ln1w, pw.ln1b, pw.attprojb, pw.ln2w, pw.ln2b, pw.fcprojb};
        float* rep_dst[] = {P[r].ln1w, P[r].ln1b, P[r].attprojb, P[r].ln2w, P[r].ln2b, P[r].fcprojb};
        for (int k = 0; k < 6; k++) memcpy(rep_dst[k], rep_src[k], C * sizeof(float));
    }
    float* sum = mem_alloc_floats(NC, MEM_OTHER);
    // forward, attention half
    for (int r = 0; r < TP; r++) {
        layernorm_forward(A[r].ln1, A[r].ln1_mean, A[r].ln1_rstd, x, P[r].ln1w, P[r].ln1b, N, C);
        matmul_forward(A[r].qkv, A[r].ln1, P[r].qkvw, P[r].qkvb, N, C, 3 * Cl);
        attention_flash_forward(A[r].atty, A[r].lse, A[r].qkv, B, T, Cl, NH / TP);
        matmul_forward(A[r].attproj, A[r].atty, P[r].attprojw, r == 0 ? P[r].attprojb : NULL, N, Cl, C);
    }
    ops_zero(sum, NC);
    for (int r = 0; r < TP; r++) ops_add(sum, A[r].attproj, NC);  // g: all-reduce
    for (int r = 0; r < TP; r++) {
        ops_copy(A[r].attproj, sum, NC);
        residual_forward(A[r].res2, x, A[r].attproj, NC);
        layernorm_forward(A[r].ln2, A[r].ln2_mean, A[r].ln2_rstd, A[r].res2, P[r].ln2w, P[r].ln2b, N, C);
        matmul_forward(A[r].fch, A[r].ln2, P[r].fcw, P[r].fcb, N, C, Fl);
        gelu_forward(A[r].fch_gelu, A[r].fch, N * Fl);
        matmul_forward(A[r].fcproj, A[r].fch_gelu, P[r].fcprojw, r == 0 ? P[r].fcprojb : NULL, N, Fl, C);
    }
    ops_zero(sum, NC);
    for (int r = 0; r < TP; r++) ops_add(sum, A[r].fcproj, NC);  // g: all-reduce
    double fwd = 0.0;
    for (int r = 0; r < TP; r++) {
        ops_copy(A[r].fcproj, sum, NC);
        residual_forward(A[r].res3, A[r].res2, A[r].fcproj, NC);
        for (size_t i = 0; i < NC; i++) fwd = err_max(fwd, fabs(A[r].res3[i] - a.res3[i]));
    }
    check(fwd < 1e-5, "tp block: forward on 2 ranks (column/row-parallel, g all-reduces) equals block_forward",
          "max |diff| %g", fwd);
    // backward
    float* dr[TP];
    for (int r = 0; r < TP; r++) {
        dr[r] = mem_alloc_floats(NC, MEM_OTHER);
        ops_copy(dr[r], dout, NC);
        ops_zero(S[r].dfch_gelu, N * Fl);
        matmul_backward(S[r].dfch_gelu, G[r].fcprojw, G[r].fcprojb, dr[r], A[r].fch_gelu, P[r].fcprojw, N, Fl, C);
        ops_zero(S[r].dfch, N * Fl);
        gelu_backward(S[r].dfch, A[r].fch, S[r].dfch_gelu, N * Fl);
        ops_zero(S[r].dln, NC);
        matmul_backward(S[r].dln, G[r].fcw, G[r].fcb, S[r].dfch, A[r].ln2, P[r].fcw, N, C, Fl);
    }
    ops_zero(sum, NC);
    for (int r = 0; r < TP; r++) ops_add(sum, S[r].dln, NC);  // f backward: all-reduce
    for (int r = 0; r < TP; r++) {
        ops_copy(S[r].dln, sum, NC);
        layernorm_backward(dr[r], G[r].ln2w, G[r].ln2b, S[r].dln, A[r].res2, P[r].ln2w, A[r].ln2_mean, A[r].ln2_rstd, N, C);
        ops_zero(S[r].datty, N * Cl);
        matmul_backward(S[r].datty, G[r].attprojw, G[r].attprojb, dr[r], A[r].atty, P[r].attprojw, N, Cl, C);
        ops_zero(S[r].dqkv, N * 3 * Cl);
        attention_flash_backward(S[r].dqkv, S[r].datty, A[r].qkv, A[r].atty, A[r].lse, B, T, Cl, NH / TP);
        ops_zero(S[r].dln, NC);
        matmul_backward(S[r].dln, G[r].qkvw, G[r].qkvb, S[r].dqkv, A[r].ln1, P[r].qkvw, N, C, 3 * Cl);
    }
    ops_zero(sum, NC);
    for (int r = 0; r < TP; r++) ops_add(sum, S[r].dln, NC);  // f backward: all-reduce
    double bwd = 0.0;
    for (int r = 0; r < TP; r++) {
        ops_copy(S[r].dln, sum, NC);
        layernorm_backward(dr[r], G[r].ln1w, G[r].ln1b, S[r].dln, x, P[r].ln1w, A[r].ln1_mean, A[r].ln1_rstd, N, C);
        for (size_t i = 0; i < NC; i++) bwd = err_max(bwd, fabs(dr[r][i] - dres[i]));
        // every gradient against the same tile of the whole block's
        for (int k = 0; k < 3; k++) {
            for (size_t i = 0; i < Cl * C; i++) bwd = err_max(bwd, fabs(G[r].qkvw[k * Cl * C + i] - pg.qkvw[(k * C + r * Cl) * C + i]));
            for (size_t i = 0; i < Cl; i++) bwd = err_max(bwd, fabs(G[r].qkvb[k * Cl + i] - pg.qkvb[k * C + r * Cl + i]));
        }
        for (size_t i = 0; i < C; i++) {
            for (size_t j = 0; j < Cl; j++) bwd = err_max(bwd, fabs(G[r].attprojw[i * Cl + j] - pg.attprojw[i * C + r * Cl + j]));
            for (size_t j = 0; j < Fl; j++) bwd = err_max(bwd, fabs(G[r].fcprojw[i * Fl + j] - pg.fcprojw[i * 4 * C + r * Fl + j]));
        }
        for (size_t i = 0; i < Fl * C; i++) bwd = err_max(bwd, fabs(G[r].fcw[i] - pg.fcw[r * Fl * C + i]));
        for (size_t i = 0; i < Fl; i++) bwd = err_max(bwd, fabs(G[r].fcb[i] - pg.fcb[r * Fl + i]));
        float* rs[] = {G[r].ln1w, G[r].ln1b, G[r].attprojb, G[r].ln2w, G[r].ln2b, G[r].fcprojb};
        float* rw[] = {pg.ln1w, pg.ln1b, pg.attprojb, pg.ln2w, pg.ln2b, pg.fcprojb};
        for (int k = 0; k < 6; k++)
            for (size_t i = 0; i < C; i++) bwd = err_max(bwd, fabs(rs[k][i] - rw[k][i]));
    }
    check(bwd < 1e-5, "tp block: backward on 2 ranks (f all-reduces) gives block_backward's dx and every gradient's slice",
          "max |diff| %g", bwd);
    int agree = 1;
    float* r0[] = {G[0].ln1w, G[0].ln1b, G[0].attprojb, G[0].ln2w, G[0].ln2b, G[0].fcprojb};
    float* r1[] = {G[1].ln1w, G[1].ln1b, G[1].attprojb, G[1].ln2w, G[1].ln2b, G[1].fcprojb};
    for (int k = 0; k < 6; k++) agree &= memcmp(r0[k], r1[k], C * sizeof(float)) == 0;
    // bit-identical by construction: both ranks run the same ops on the same summed bytes
    check(agree, "tp block: the replicated tensors' gradients are bit-identical on both ranks", "they differ");
    float* all[] = {w, g, x, dout, acts, scr, dres, sum, sp[0], sp[1], sg[0], sg[1], sa[0], sa[1], ss[0], ss[1], dr[0], dr[1]};
    for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++) mem_free(all[i]);
}

// The LM head and loss split over the vocabulary as chapter 4 splits them:
// rows [v0, v0 + Vl) of wte on each of 3 shards (uneven: 11, 11, 10 of Vp =
// 32, the last shard holding the 3 padded rows), per-shard logits and
// cross-entropy partials merged in shard order, per-shard dlogits from the
// merged statistics, dlnf summed over shards (the f all-reduce). Losses,
// dres, dlnf's parameter gradients and every shard's dwte rows must equal
// head_forward / head_backward on the whole vocabulary.
static void test_tp_head(void) {
    GPTConfig cfg = small_cfg;  // V = 29, Vp = 32, C = 8
    enum { B = 2, T = 3, N = B * T, S = 3 };
    int C = cfg.channels, Vp = cfg.padded_vocab_size, V = cfg.vocab_size;
    const int v0s[S] = {0, 11, 22}, rows[S] = {11, 11, 10};
    size_t P = gpt_num_params(&cfg);
    float* host = malloc(P * sizeof(float));
    gpt_init_range(host, 0, P, &cfg, 3);
    int targets_h[N];
    random_tokens(targets_h, N, V);
    float* wte = mem_alloc_floats((size_t)Vp * C, MEM_OTHER);
    float* lnf = mem_alloc_floats(2 * (size_t)C, MEM_OTHER);
    mem_to_device(wte, host, (size_t)Vp * C * sizeof(float));
    mem_to_device(lnf, host + gpt_tensor_offset(&cfg, P_LNFW, 0), 2 * (size_t)C * sizeof(float));
    float* x = mem_alloc_floats((size_t)N * C, MEM_OTHER);
    for (int i = 0; i < N * C; i++) x[i] = (float)(uniform() - 0.5);
    int* targets = mem_alloc(N * sizeof(int), MEM_OTHER);
    mem_to_device(targets, targets_h, sizeof(targets_h));
    // the whole head
    float* hbuf = mem_alloc_floats(head_acts_numel(B, T, C, Vp), MEM_OTHER);
    HeadActs h = head_acts_at(hbuf, B, T, C, Vp);
    float* dwte = mem_alloc_floats((size_t)Vp * C, MEM_OTHER);
    float* dlnf = mem_alloc_floats(2 * (size_t)C, MEM_OTHER);
    float* dln = mem_alloc_floats((size_t)N * C, MEM_OTHER);
    float* dres = mem_alloc_floats((size_t)N * C, MEM_OTHER);
    head_forward(&cfg, wte, lnf, lnf + C, &h, x, targets, B, T);
    head_backward(&cfg, wte, lnf, dwte, dlnf, dlnf + C, &h, x, targets, 1.0f / N, dln, dres, B, T);
    // the shards
    float *sbuf[S], *sdw[S];
    HeadActs sh[S];
    float* partials = mem_alloc_floats(3 * (size_t)N, MEM_OTHER);
    for (int k = 0; k < S; k++) {
        sbuf[k] = mem_alloc_floats(head_acts_numel(B, T, C, rows[k]), MEM_OTHER);
        sdw[k] = mem_alloc_floats((size_t)rows[k] * C, MEM_OTHER);
        sh[k] = head_acts_at(sbuf[k], B, T, C, rows[k]);
        int nvalid = V - v0s[k] < rows[k] ? V - v0s[k] : rows[k];
        layernorm_forward(sh[k].lnf, sh[k].lnf_mean, sh[k].lnf_rstd, x, lnf, lnf + C, N, C);
        matmul_forward(sh[k].logits, sh[k].lnf, wte + (size_t)v0s[k] * C, NULL, N, C, rows[k]);
        crossentropy_partials(sh[k].rowmax, sh[k].sumexp, sh[k].tlogit, sh[k].logits, targets, N, rows[k], nvalid,
                              v0s[k]);
    }
    // the all-gather and the merge in shard order, as every tp rank does
    ops_copy(partials, sh[0].rowmax, 3 * (size_t)N);
    for (int k = 1; k < S; k++)
        crossentropy_merge(partials, partials + N, partials + 2 * N, sh[k].rowmax, sh[k].sumexp, sh[k].tlogit, N);
    float* losses = mem_alloc_floats(N, MEM_OTHER);
    crossentropy_loss(losses, partials, partials + N, partials + 2 * N, N);
    double fwd = 0.0;
    for (int n = 0; n < N; n++) fwd = err_max(fwd, fabs(losses[n] - h.losses[n]));
    check(fwd < 1e-5, "tp head: losses from 3 uneven vocabulary shards (partials merged) equal head_forward's",
          "max |diff| %g", fwd);
    float* dln_sum = mem_alloc_floats((size_t)N * C, MEM_OTHER);
    float* dln_k = mem_alloc_floats((size_t)N * C, MEM_OTHER);
    for (int k = 0; k < S; k++) {
        int nvalid = V - v0s[k] < rows[k] ? V - v0s[k] : rows[k];
        crossentropy_backward(sh[k].logits, sh[k].logits, targets, partials, partials + N, 1.0f / N, N, rows[k],
                              nvalid, v0s[k]);
        ops_zero(dln_k, (size_t)N * C);
        matmul_backward(dln_k, sdw[k], NULL, sh[k].logits, sh[k].lnf, wte + (size_t)v0s[k] * C, N, C, rows[k]);
        ops_add(dln_sum, dln_k, (size_t)N * C);  // f backward: the all-reduce's sum
    }
    float* dres_tp = mem_alloc_floats((size_t)N * C, MEM_OTHER);
    float* dlnf_tp = mem_alloc_floats(2 * (size_t)C, MEM_OTHER);
    layernorm_backward(dres_tp, dlnf_tp, dlnf_tp + C, dln_sum, x, lnf, sh[0].lnf_mean, sh[0].lnf_rstd, N, C);
    double bwd = 0.0;
    for (int i = 0; i < N * C; i++) bwd = err_max(bwd, fabs(dres_tp[i] - dres[i]));
    for (int i = 0; i < 2 * C; i++) bwd = err_max(bwd, fabs(dlnf_tp[i] - dlnf[i]));
    for (int k = 0; k < S; k++)
        for (int i = 0; i < rows[k] * C; i++) bwd = err_max(bwd, fabs(sdw[k][i] - dwte[(size_t)v0s[k] * C + i]));
    check(bwd < 1e-6, "tp head: dres, dlnfw, dlnfb and every shard's dwte rows equal head_backward's",
          "max |diff| %g", bwd);
    float* all[] = {wte, lnf, x, hbuf, dwte, dlnf, dln, dres, partials, losses, dln_sum, dln_k, dres_tp, dlnf_tp,
                    sbuf[0], sbuf[1], sbuf[2], sdw[0], sdw[1], sdw[2]};
    for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++) mem_free(all[i]);
    mem_free(targets);
    free(host);
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
        size_t per_layer = mode == RECOMPUTE_NONE ? 18 * (size_t)C + (size_t)NH + 4
                           : mode == RECOMPUTE_SELECTIVE ? 12 * (size_t)C + (size_t)NH + 4 : (size_t)C;
        size_t transient = mode == RECOMPUTE_NONE ? 0
                           : mode == RECOMPUTE_SELECTIVE ? 6 * (size_t)C
                                                         : 18 * (size_t)C + (size_t)NH + 4;
        size_t want = 4 * (size_t)B * T * (C + L * per_layer + transient + (C + Vp + 6) + 13 * C + C + 2);
        char what[160];
        snprintf(what, sizeof(what), "recompute %s: activation bytes = 4BT[C + L*%zu + %zu + (C+Vp+6) + 13C + C + 2] = %zu",
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
            // bitwise by construction: the same calls on the same rows, recomputed
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
    test_tp_layouts();
    test_tiles();
    test_tp_block();
    test_tp_head();
    test_recompute();
    return test_exit_code();
}
