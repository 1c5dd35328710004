// train.c: model, batch and data set-up shared by every chapter.
#include "train.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt.h"
#include "errors.h"
#include "matmul_peak.h"
#include "memory.h"
#include "device.h"
#include "model_file.h"
#include "optime.h"
#include "paths.h"
#include "watchdog.h"
#include "rank.h"
#include "runtime.h"
#include "sharding.h"
#include "trace.h"

TrainConfigReader train_config_reader = NULL;

void train_setup(TrainSetup* s, const TrainArgs* a) {
    memset(s, 0, sizeof(*s));
    char msg[1024];
    // before anything is opened for writing: no output may be an input, and
    // --save must be writable now, not found unwritable after training
    PathArg inputs[] = {{"--model", a->model}, {"--data", a->data}, {"--val", a->val}};
    PathArg outputs[] = {{"--log", a->log}, {"--save", a->save}, {"--trace", a->trace}};
    int n_in = sizeof(inputs) / sizeof(inputs[0]), n_out = sizeof(outputs) / sizeof(outputs[0]);
    const char* bad = paths_check_distinct(inputs, n_in, outputs, n_out, msg, sizeof(msg));
    for (int o = 0; o < n_out && !bad; o++) bad = paths_check_writable(&outputs[o], msg, sizeof(msg));
    // training-state checkpoints (ckpt.h): a directory to write, one to read
    PathArg ckpt_dir = {"--ckpt-dir", a->ckpt_dir}, resume = {"--resume", a->resume};
    PathArg ckpt_local = {"--ckpt-local", a->ckpt_local};
    if (!bad) bad = paths_check_dir(&ckpt_dir, 1, msg, sizeof(msg));
    if (!bad) bad = paths_check_dir(&ckpt_local, 1, msg, sizeof(msg));
    if (!bad) bad = paths_check_dir(&resume, 0, msg, sizeof(msg));
    fail_if_any(bad != NULL, bad);
    s->model_name = a->model;
    // the model: a preset by name, else a checkpoint file by path
    if (!gpt_preset(a->model, &s->cfg)) {
        s->checkpoint = a->model;
        bad = train_config_reader ? train_config_reader(a->model, &s->cfg, msg, sizeof(msg))
                                  : checkpoint_read_config(a->model, &s->cfg, msg, sizeof(msg));
    }
    fail_if_any(bad != NULL, bad);
    // batch defaults: DESIGN.md's presets; 4 x min(64, maxT) for a file
    int small = strcmp(a->model, "small") == 0;
    s->B = a->batch ? a->batch : (small ? 8 : 4);
    s->T = a->seq ? a->seq : (small ? 256 : (s->cfg.max_seq_len < 64 ? s->cfg.max_seq_len : 64));
    if (s->T > s->cfg.max_seq_len) {
        snprintf(msg, sizeof(msg), "--seq %d is longer than the model's %d positions: use --seq %d or less",
                 s->T, s->cfg.max_seq_len, s->cfg.max_seq_len);
        bad = msg;
    }
    fail_if_any(bad != NULL, bad);
    // the data: every rank opens it (each reads only its own sequences later)
    bad = data_open(a->data, &s->train, &s->val, msg, sizeof(msg));
    fail_if_any(bad != NULL, bad);
    if (a->val) {
        data_close(&s->val);
        bad = data_open_tokens(a->val, &s->val, msg, sizeof(msg));
        fail_if_any(bad != NULL, bad);
    }
    const char* name = a->data ? a->data : "the default corpus";
    if (s->train.max_token >= s->cfg.vocab_size) {
        snprintf(msg, sizeof(msg), "%s holds token id %d but the model's vocabulary has %d: use a model with a larger vocabulary (a GPT-2 checkpoint for GPT-2 tokens)",
                 name, s->train.max_token, s->cfg.vocab_size);
        bad = msg;
    } else if (s->val.count > 0 && s->val.max_token >= s->cfg.vocab_size) {
        snprintf(msg, sizeof(msg), "validation data holds token id %d but the model's vocabulary has %d",
                 s->val.max_token, s->cfg.vocab_size);
        bad = msg;
    } else if (data_batches_per_epoch(&s->train, s->B, s->T) == 0) {
        snprintf(msg, sizeof(msg), "%s has %zu training tokens, fewer than one batch needs (%d x %d + 1): use more data or a smaller --batch/--seq",
                 name, s->train.count, s->B, s->T);
        bad = msg;
    } else if (a->val && data_batches_per_epoch(&s->val, s->B, s->T) == 0) {
        snprintf(msg, sizeof(msg), "validation file '%s' has %zu tokens, fewer than one batch needs (%d x %d + 1): give a longer --val or a smaller --batch/--seq",
                 a->val, s->val.count, s->B, s->T);
        bad = msg;
    }
    fail_if_any(bad != NULL, bad);
    // the last 10% of a text file may be too short to validate on: say so
    // rather than silently logging no validation loss
    if (!a->val && s->val.count > 0 && data_batches_per_epoch(&s->val, s->B, s->T) == 0)
        print0("note: the validation split of %s (%zu tokens) is shorter than one batch (%d x %d + 1): no validation loss\n",
               name, s->val.count, s->B, s->T);
}

void train_setup_free(TrainSetup* s) {
    data_close(&s->train);
    data_close(&s->val);
}

void train_load_checkpoint(const TrainSetup* s, float* params_host) {
    char msg[1024];
    const char* bad = checkpoint_read_params(s->checkpoint, &s->cfg, params_host, msg, sizeof(msg));
    fail_if_any(bad != NULL, bad);
}

// gpt_forward as a TrainForward
static float forward_gpt(void* ctx, const int* inputs, const int* targets) {
    return gpt_forward((GPT*)ctx, inputs, targets);
}

float train_val_loss_gpt(void* gpt, const TrainSetup* s, int n_batches) { return train_val_loss(gpt, s, n_batches); }

float train_val_loss(GPT* m, const TrainSetup* s, int n_batches) {
    // the same tokens whatever the model's batch: n_batches global batches of
    // s->B sequences, run m->B sequences at a time
    if (s->B % m->B != 0 || m->T != s->T) return -1.0f;
    return train_val_loss_with(s, n_batches, forward_gpt, m, 0, s->B, m->B, NULL);
}

float train_val_loss_with(const TrainSetup* s, int n_batches, TrainForward forward, void* ctx, int b0,
                          int count, int micro, const Comm* group) {
    size_t per_epoch = data_batches_per_epoch(&s->val, s->B, s->T);
    if (per_epoch == 0) return -1.0f;
    if ((size_t)n_batches > per_epoch) n_batches = (int)per_epoch;
    size_t BT = (size_t)micro * s->T;
    // every piece's tokens go to the device from these; pageable, not
    // pinned: a validation runs every --val-every steps, and pinning a block
    // for it would cost more than its copies save (memory.h)
    int* inputs = xmalloc(BT * sizeof(int));
    int* targets = xmalloc(BT * sizeof(int));
    double sum = 0.0;
    int pieces = 0;
    for (int i = 0; i < n_batches; i++) {
        for (int b = b0; b < b0 + count; b += micro) {
            data_batch(&s->val, i, s->B, s->T, b, micro, inputs, targets);
            sum += forward(ctx, inputs, targets);
            pieces++;
        }
    }
    free(inputs);
    free(targets);
    if (group) {
        // every rank runs as many pieces: the mean over all of them
        double total = 0.0;
        MPI_CHECK(MPI_Allreduce(&sum, &total, 1, MPI_DOUBLE, MPI_SUM, group->mpi));
        return (float)(total / ((double)group->size * pieces));
    }
    return (float)(sum / pieces);
}

// Prints --sample N tokens, out (a->sample of them).
static void print_sample(const int* out, const TrainArgs* a, int V) {
    printf("\nsample (%d tokens):\n", a->sample);
    for (int i = 0; i < a->sample; i++) {
        if (V <= 256) putchar(out[i]);
        else printf("%d ", out[i]);  // GPT-2 tokens: ids (decoding needs llm.c's tokenizer)
    }
    printf("\n");
    fflush(stdout);
}

// Prints --sample N tokens generated by m, on whichever rank calls it.
static void sample_print(GPT* m, const TrainArgs* a) {
    // prompt: a newline, as if a new line of text began
    int prompt = '\n';
    int* out = xmalloc((size_t)a->sample * sizeof(int));
    gpt_sample(m, &prompt, 1, out, a->sample, (uint64_t)a->seed);
    print_sample(out, a, m->cfg.vocab_size);
    free(out);
}

void train_sample_with(const TrainArgs* a, const GPTConfig* cfg, int T, GptNextLogits next, void* ctx) {
    if (a->sample <= 0) return;
    int prompt = '\n';
    int* out = xmalloc((size_t)a->sample * sizeof(int));
    gpt_sample_with(next, ctx, T, cfg->vocab_size, cfg->padded_vocab_size, &prompt, 1, out, a->sample,
                    (uint64_t)a->seed);
    if (world_rank() == 0) print_sample(out, a, cfg->vocab_size);
    free(out);
}

void train_sample(GPT* m, const TrainArgs* a) {
    if (a->sample <= 0 || world_rank() != 0) return;
    sample_print(m, a);
}

void train_save(const TrainArgs* a, const GPTConfig* cfg, const float* params_host, int writer) {
    if (!a->save) return;
    char msg[1024];
    const char* bad = writer ? checkpoint_write(a->save, cfg, params_host, msg, sizeof(msg)) : NULL;
    fail_if_any(bad != NULL, bad);
    print0("saved %s\n", a->save);
}

int train_wants_params(const TrainArgs* a) { return a->save != NULL || a->sample > 0; }

void train_finish_params(const TrainArgs* a, const GPTConfig* cfg, int T, const float* params_host) {
    int holder = params_host != NULL;
    if (a->sample > 0 && holder) {
        // a model of batch 1 on the holder, only to sample from
        GPT m;
        gpt_create(&m, cfg, 1, T, 0);
        mem_to_device(m.params, params_host, m.num_params * sizeof(float));
        sample_print(&m, a);
        gpt_free(&m);
    }
    train_save(a, cfg, params_host, holder);
}

// ---------------------------------------------------------------- the mesh against the model

void train_check_mesh(const Mesh* mesh, const TrainSetup* s, const MeshNeeds* needs) {
    const GPTConfig* c = &s->cfg;
    int dp = mesh->size[AXIS_DP], tp = mesh->size[AXIS_TP], pp = mesh->size[AXIS_PP];
    int cp = mesh->size[AXIS_CP], ep = mesh->size[AXIS_EP];
    int micro = needs && needs->microbatches > 1 ? needs->microbatches : 1;
    int experts = needs ? needs->experts : 0;
    // every check in one style: what, its value, the axis, the fix
#define RANKS(n) (n), (n) == 1 ? "" : "s"
    if (s->B % (dp * micro) != 0) {
        if (micro == 1)
            fail_all("--batch %d does not split over dp=%d rank%s: use a batch divisible by %d", s->B, RANKS(dp), dp);
        fail_all("--batch %d does not split over dp=%d rank%s x %d micro-batches: use a batch divisible by %d",
                 s->B, RANKS(dp), micro, dp * micro);
    }
    if (c->num_heads % tp != 0)
        fail_all("the model's %d heads do not split over tp=%d rank%s: use a tp that divides %d", c->num_heads,
                 RANKS(tp), c->num_heads);
    if (c->padded_vocab_size % tp != 0)
        fail_all("the model's padded vocabulary of %d does not split over tp=%d rank%s: use a tp that divides %d",
                 c->padded_vocab_size, RANKS(tp), c->padded_vocab_size);
    if (c->num_layers % pp != 0)
        fail_all("the model's %d layers do not split over pp=%d rank%s: use a pp that divides %d", c->num_layers,
                 RANKS(pp), c->num_layers);
    if (s->T % cp != 0)
        fail_all("--seq %d does not split over cp=%d rank%s: use a sequence length divisible by %d", s->T,
                 RANKS(cp), cp);
    if (ep > 1 && experts <= 0)
        fail_all("the model has no experts to split over ep=%d ranks: use --ep 1, or a model with experts", ep);
    if (ep > 1 && experts % ep != 0)
        fail_all("the model's %d experts do not split over ep=%d rank%s: use an ep that divides %d", experts,
                 RANKS(ep), experts);
#undef RANKS
}

// ---------------------------------------------------------------- glue of the training loop

AdamWConfig train_adamw(const TrainArgs* a) {
    AdamWConfig opt = {.lr = a->lr, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = a->wd};
    return opt;
}

double train_mean(const Comm* group, double mine) {
    double total = 0.0;
    MPI_CHECK(MPI_Allreduce(&mine, &total, 1, MPI_DOUBLE, MPI_SUM, group->mpi));
    return total / group->size;
}

// The run's norm scalars, allocated once: the step's sum of squares (a
// double) and, behind it, the float the all-reduce carries; norm_host is
// their staging buffer on the host (memory.h), read every step.
static double* norm_buf = NULL;
static double* norm_host = NULL;

static double* norm_scalars(void) {
    if (!norm_buf) norm_buf = mem_alloc(2 * sizeof(double), MEM_OTHER);
    if (!norm_host) norm_host = mem_alloc_host(2 * sizeof(double));
    return norm_buf;
}

double* train_sumsq_begin(void) {
    mem_zero(norm_scalars(), sizeof(double));
    return norm_buf;
}

static void train_sumsq_free(void) {
    mem_free(norm_buf);
    mem_free_host(norm_host);
    norm_buf = NULL;
    norm_host = NULL;
}

double train_global_norm(const double* sumsq, const Comm* const* groups, int n_groups) {
    if (n_groups == 0) {
        norm_scalars();
        mem_to_host(norm_host, sumsq, sizeof(double));
        return sqrt(norm_host[0]);
    }
    // the sum of squares travels as a float on the device, like any gradient
    // traffic, so the comm layer counts it (one all-reduce of 4 bytes per group)
    float* wire = (float*)(norm_scalars() + 1);
    ops_double_to_float(wire, sumsq, 1);
    for (int i = 0; i < n_groups; i++) comm_allreduce(groups[i], wire, 1, COMM_SUM);
    float* total = (float*)(norm_host + 1);
    mem_to_host(total, wire, sizeof(float));
    return sqrt((double)*total);
}

int run_start(Run* r, int argc, char** argv, const char* program, const char* summary,
              const ArgSpec* extra, int n_extra, unsigned axes) {
    memset(r, 0, sizeof(*r));
    runtime_init(&argc, &argv);
    char msg[1024];
    // every trainer from chapter 2 on takes --comm: the chapter's flags, then it
    ArgSpec* flags = xmalloc(sizeof(ArgSpec) * (size_t)(n_extra + 1));
    if (n_extra) memcpy(flags, extra, sizeof(ArgSpec) * (size_t)n_extra);
    flags[n_extra] = (ArgSpec){"comm", ARG_STRING, &r->args.comm,
                               "library | hand: MPI's collectives, or chapter 1's by hand (CPU only)  [library]"};
    const char* bad = args_parse(argc, argv, &r->args, flags, n_extra + 1, axes, msg, sizeof(msg));
    if (bad && !strcmp(bad, "help")) {
        if (world_rank() == 0) args_usage(program, summary, flags, n_extra + 1, axes);
        free(flags);
        runtime_finalize();
        return 0;
    }
    free(flags);
    if (bad) fail_all("%s", bad);
    if (strcmp(r->args.comm, "library") != 0 && strcmp(r->args.comm, "hand") != 0)
        fail_all("--comm %s is not one of library, hand", r->args.comm);
    bad = comm_set_impl(!strcmp(r->args.comm, "hand") ? COMM_IMPL_HAND : COMM_IMPL_LIBRARY);
    if (bad) fail_all("%s", bad);
    bad = mesh_create(&r->mesh, r->args.mesh, msg, sizeof(msg));
    if (bad) fail_all("%s", bad);
    runtime_set_threads(r->args.threads);
    watchdog_start(r->args.timeout);  // from here on, a rank that stops ends the job (watchdog.h)
    r->device = device_init(runtime_local_rank());
    comm_create(&r->world, r->axes, &r->mesh);
    train_setup(&r->setup, &r->args);
    r->peak_gflops = report_matmul_peak(r->args.peak_gflops);
    comm_counts_reset();
    trace_open(r->args.trace);
    return 1;
}

void run_refuse_flags(const Run* r, unsigned missing, const char* chapter) {
    const TrainArgs* a = &r->args;
    if ((missing & RUN_NO_CHECKPOINTS) && (a->ckpt_dir || a->resume || a->save_every || a->async_save || a->ckpt_local))
        fail_all("%s does not save or resume training state yet: drop --ckpt-dir, --ckpt-local, --resume, --save-every and "
                 "--async-save (--save FILE.bin writes the weights)", chapter);
    if ((missing & RUN_NO_RECOMPUTE) && a->recompute != RECOMPUTE_NONE)
        fail_all("%s keeps its activations its own way and does not recompute them yet: drop --recompute", chapter);
}

void run_finish(Run* r) {
    train_sumsq_free();
    trace_finish();
    train_setup_free(&r->setup);
    comm_destroy(&r->world, r->axes);
    mesh_destroy(&r->mesh);
    runtime_finalize();
}

void train_loop_open(JsonLog* log, int** inputs, int** targets, const TrainArgs* a, int rows, int T) {
    char msg[1024];
    const char* bad = jsonl_open(log, a->log, msg, sizeof(msg));
    fail_if_any(bad != NULL, bad);
    // staging buffers (memory.h): the step's tokens go to the device from them
    *inputs = mem_alloc_host((size_t)rows * T * sizeof(int));
    *targets = mem_alloc_host((size_t)rows * T * sizeof(int));
}

void train_loop_close(JsonLog* log, int* inputs, int* targets) {
    jsonl_close(log);
    mem_free_host(inputs);
    mem_free_host(targets);
}

void train_print_recompute(RecomputeMode mode, const char* note) {
    if (mode == RECOMPUTE_NONE) return;
    print0("recompute %s: backward recomputes what the blocks did not keep (docs/recompute.md)%s\n",
           recompute_name(mode), note ? note : "");
}

void clock_begin(StepClock* c) {
    c->t0 = now_seconds();
    c->w0 = comm_wait_seconds();
    c->p0 = comm_progress_seconds();
    optime_step_begin();
}

double clock_end(StepClock* c, int step, int steps) {
    device_synchronize();
    double t1 = now_seconds(), dt = t1 - c->t0;
    int timed = step > 0 || steps == 1;
    char name[32];
    snprintf(name, sizeof(name), "step %d", step);
    // the same two clock reads as the step's time: the trace's timed step
    // spans add up to the summary's ms per step
    trace_span(TRACE_STEP, c->t0, t1, 0, step, timed, name);
    if (timed) {
        c->seconds += dt;
        c->wait += comm_wait_seconds() - c->w0;
        c->progress += comm_progress_seconds() - c->p0;
        c->timed++;
    }
    optime_step_end(timed);
    return dt;
}

double clock_ms_per_step(const StepClock* c) { return c->timed ? 1e3 * c->seconds / c->timed : 0.0; }
double clock_wait_ms_per_step(const StepClock* c) { return c->timed ? 1e3 * c->wait / c->timed : 0.0; }
double clock_progress_ms_per_step(const StepClock* c) { return c->timed ? 1e3 * c->progress / c->timed : 0.0; }

// ---------------------------------------------------------------- the training loop

void train_loop_begin(TrainLoop* L, const Run* run, const TrainLoopSpec* spec) {
    memset(L, 0, sizeof(*L));
    L->args = &run->args;
    L->setup = &run->setup;
    L->mesh = &run->mesh;
    L->peak_gflops = run->peak_gflops;
    L->spec = *spec;
    L->start = spec->ckpt ? spec->ckpt->start_step : 0;
    L->steps = run->args.steps;
    L->val_loss = -1.0f;
    // --show-sharding: the chapter printed its table before its loop, or it has none yet
    if (run->args.show_sharding && !sharding_shown())
        fail_all("this chapter does not show its sharding yet: drop --show-sharding");
    train_loop_open(&L->log, &L->inputs, &L->targets, L->args, spec->rows, L->setup->T);
    comm_counts_reset();  // the summary counts the training, not the start-up
    clock_begin(&L->clock);
}

int train_loop_timed(const TrainLoop* L, int step) { return step > L->start || L->steps - L->start == 1; }

// The validation loss after step `step` (-1: before any), reported when
// there is validation data.
static void loop_validate(TrainLoop* L, int step) {
    if (!L->spec.val_loss) return;
    float v = L->spec.val_loss(L->spec.ctx, L->setup, L->args->val_batches);
    if (v < 0) return;
    L->val_loss = v;
    report_val(&L->log, step, v);
}

void train_loop_step(TrainLoop* L, int step, float loss, float norm) {
    double dt = clock_end(&L->clock, step - L->start, L->steps - L->start);
    double tokens = (double)L->setup->B * L->setup->T;
    report_step_extra(&L->log, step, L->steps, loss, norm, 1e3 * dt, tokens / dt,
                      L->step_extra.len ? json_fields(&L->step_extra) : NULL);
    json_clear(&L->step_extra);
    L->loss = loss;
    int every = L->args->val_every;
    if (every > 0 && (step + 1) % every == 0 && step + 1 < L->steps) loop_validate(L, step);
    if (L->spec.ckpt) ckpt_after_step(L->spec.ckpt, step);  // --save-every, --ckpt-dir
    // the next step's clock starts here: everything until the next call is that step
    if (step + 1 < L->steps) clock_begin(&L->clock);
}

void train_loop_end(TrainLoop* L, const JsonBuf* extra) {
    if (L->spec.ckpt) ckpt_finish(L->spec.ckpt, &L->log);  // joins an async save still in flight
    // the training's figures, before the final validation adds its own
    RunFigures figures;
    report_gather(&figures, L->mesh, L->peak_gflops);
    // the final model's validation loss (the loaded one's with --steps 0)
    loop_validate(L, L->steps - 1);
    const TrainSetup* s = L->setup;
    double ms = clock_ms_per_step(&L->clock);
    RunSummary summary = {
        .chapter = L->spec.chapter, .model = s->model_name, .num_params = L->spec.num_params,
        .batch = s->B, .seq = s->T, .steps = L->steps, .ms_per_step = ms,
        .tokens_per_s = ms > 0 ? (double)s->B * s->T / (ms / 1e3) : 0.0,
        .flops_per_token = L->spec.flops_per_token, .peak_gflops = L->peak_gflops,
        .final_loss = L->loss, .val_loss = L->val_loss,
        .comm_wait_ms_per_step = clock_wait_ms_per_step(&L->clock),
        .comm_progress_ms_per_step = clock_progress_ms_per_step(&L->clock), .has_comm_ms = 1,
        .extra_json = extra ? json_fields(extra) : NULL};
    report_summary_gathered(&L->log, L->mesh, &summary, &figures);
    train_loop_close(&L->log, L->inputs, L->targets);
    json_free(&L->step_extra);
    L->inputs = L->targets = NULL;
}
