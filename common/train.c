// train.c: model, batch and data set-up shared by every chapter.
#include "train.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

void train_setup(TrainSetup* s, const TrainArgs* a) {
    memset(s, 0, sizeof(*s));
    char msg[1024];
    const char* bad = NULL;
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
    }
    fail_if_any(bad != NULL, bad);
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
    size_t per_epoch = data_batches_per_epoch(&s->val, m->B, m->T);
    if (per_epoch == 0) return -1.0f;
    if ((size_t)n_batches > per_epoch) n_batches = (int)per_epoch;
    size_t BT = (size_t)m->B * m->T;
    int* inputs = xmalloc(BT * sizeof(int));
    int* targets = xmalloc(BT * sizeof(int));
    double sum = 0.0;
    for (int i = 0; i < n_batches; i++) {
        data_batch(&s->val, i, m->B, m->T, 0, m->B, inputs, targets);
        sum += gpt_forward(m, inputs, targets);
    }
    free(inputs);
    free(targets);
    return (float)(sum / n_batches);
}
