// train.c: model, batch and data set-up shared by every chapter.
#include "train.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "memory.h"
#include "paths.h"
#include "runtime.h"

void train_setup(TrainSetup* s, const TrainArgs* a) {
    memset(s, 0, sizeof(*s));
    char msg[1024];
    // before anything is opened for writing: no output may be an input, and
    // --save must be writable now, not found unwritable after training
    PathArg inputs[] = {{"--model", a->model}, {"--data", a->data}, {"--val", a->val}};
    PathArg outputs[] = {{"--log", a->log}, {"--save", a->save}};
    int n_in = sizeof(inputs) / sizeof(inputs[0]), n_out = sizeof(outputs) / sizeof(outputs[0]);
    const char* bad = paths_check_distinct(inputs, n_in, outputs, n_out, msg, sizeof(msg));
    for (int o = 0; o < n_out && !bad; o++) bad = paths_check_writable(&outputs[o], msg, sizeof(msg));
    fail_if_any(bad != NULL, bad);
    s->model_name = a->model;
    // the model: a preset by name, else a checkpoint file by path
    if (!gpt_preset(a->model, &s->cfg)) {
        s->checkpoint = a->model;
        bad = checkpoint_read_config(a->model, &s->cfg, msg, sizeof(msg));
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

float train_val_loss(GPT* m, const TrainSetup* s, int n_batches) {
    // the same tokens whatever the model's batch: n_batches global batches of
    // s->B sequences, run m->B sequences at a time
    size_t per_epoch = data_batches_per_epoch(&s->val, s->B, s->T);
    if (per_epoch == 0 || s->B % m->B != 0 || m->T != s->T) return -1.0f;
    if ((size_t)n_batches > per_epoch) n_batches = (int)per_epoch;
    size_t BT = (size_t)m->B * m->T;
    int* inputs = xmalloc(BT * sizeof(int));
    int* targets = xmalloc(BT * sizeof(int));
    double sum = 0.0;
    int pieces = 0;
    for (int i = 0; i < n_batches; i++) {
        for (int b0 = 0; b0 < s->B; b0 += m->B) {
            data_batch(&s->val, i, s->B, s->T, b0, m->B, inputs, targets);
            sum += gpt_forward(m, inputs, targets);
            pieces++;
        }
    }
    free(inputs);
    free(targets);
    return (float)(sum / pieces);
}

void train_sample(GPT* m, const TrainArgs* a) {
    if (a->sample <= 0 || world_rank() != 0) return;
    // prompt: a newline, as if a new line of text began
    int prompt = '\n';
    int* out = xmalloc((size_t)a->sample * sizeof(int));
    gpt_sample(m, &prompt, 1, out, a->sample, (uint64_t)a->seed);
    printf("\nsample (%d tokens):\n", a->sample);
    for (int i = 0; i < a->sample; i++) {
        if (m->cfg.vocab_size <= 256) putchar(out[i]);
        else printf("%d ", out[i]);  // GPT-2 tokens: ids (decoding needs llm.c's tokenizer)
    }
    printf("\n");
    fflush(stdout);
    free(out);
}

void train_save(const TrainArgs* a, const GPTConfig* cfg, const float* params_host, int writer) {
    if (!a->save) return;
    char msg[1024];
    const char* bad = writer ? checkpoint_write(a->save, cfg, params_host, msg, sizeof(msg)) : NULL;
    fail_if_any(bad != NULL, bad);
    print0("saved %s\n", a->save);
}

int run_start(Run* r, int argc, char** argv, const char* program, const char* summary,
              const ArgSpec* extra, int n_extra, unsigned axes) {
    memset(r, 0, sizeof(*r));
    runtime_init(&argc, &argv);
    char msg[1024];
    const char* bad = args_parse(argc, argv, &r->args, extra, n_extra, axes, msg, sizeof(msg));
    if (bad && !strcmp(bad, "help")) {
        if (world_rank() == 0) args_usage(program, summary, extra, n_extra, axes);
        runtime_finalize();
        return 0;
    }
    if (bad) fail_all("%s", bad);
    bad = mesh_create(&r->mesh, r->args.mesh, msg, sizeof(msg));
    if (bad) fail_all("%s", bad);
    runtime_set_threads(r->args.threads);
    r->device = device_init(runtime_local_rank());
    comm_create(&r->world, r->axes, &r->mesh);
    train_setup(&r->setup, &r->args);
    r->peak_gflops = r->args.peak_gflops > 0 ? r->args.peak_gflops : measure_matmul_gflops();
    comm_counts_reset();
    return 1;
}

void run_finish(Run* r) {
    train_setup_free(&r->setup);
    comm_destroy(&r->world, r->axes);
    mesh_destroy(&r->mesh);
    runtime_finalize();
}

void clock_begin(StepClock* c) {
    c->t0 = now_seconds();
    c->w0 = comm_wait_seconds();
    c->p0 = comm_progress_seconds();
}

double clock_end(StepClock* c, int step, int steps) {
    device_synchronize();
    double dt = now_seconds() - c->t0;
    if (step > 0 || steps == 1) {
        c->seconds += dt;
        c->wait += comm_wait_seconds() - c->w0;
        c->progress += comm_progress_seconds() - c->p0;
        c->timed++;
    }
    return dt;
}

double clock_ms_per_step(const StepClock* c) { return c->timed ? 1e3 * c->seconds / c->timed : 0.0; }
double clock_wait_ms_per_step(const StepClock* c) { return c->timed ? 1e3 * c->wait / c->timed : 0.0; }
double clock_progress_ms_per_step(const StepClock* c) { return c->timed ? 1e3 * c->progress / c->timed : 0.0; }
