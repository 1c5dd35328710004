// train.c: a run's set-up, shared by every chapter: the model and the batch
// resolved from the flags, the data opened and checked, the checkpoint's
// parameters read, the mesh checked against the model (train.h).
#include "train.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "errors.h"
#include "memory.h"
#include "model_file.h"
#include "paths.h"
#include "rank.h"

TrainConfigReader train_config_reader = NULL;

void train_setup(TrainSetup* s, const TrainArgs* a) {
    memset(s, 0, sizeof(*s));
    char msg[ERROR_MAX];
    // before anything is opened for writing: no output may be an input, and
    // --save must be writable now, not found unwritable after training
    // (--model a preset's name is no file, even where a file of that name is).
    // Rank 0 alone writes --log, --save and --trace, so it alone checks them
    // (a directory on its node only is fine); every rank writes checkpoints
    int writer = world_rank() == 0;
    GPTConfig preset;
    const char* model_file = gpt_preset(a->model, &preset) ? NULL : a->model;
    PathArg inputs[] = {{"--model", model_file}, {"--data", a->data}, {"--val", a->val}, {a->input_flag, a->input}};
    PathArg outputs[] = {{"--log", a->log}, {"--save", a->save}, {"--trace", a->trace}};  // --log opened in place
    int n_in = sizeof(inputs) / sizeof(inputs[0]), n_out = sizeof(outputs) / sizeof(outputs[0]);
    const char* bad = writer ? paths_check_distinct(inputs, n_in, outputs, n_out, msg, sizeof(msg)) : NULL;
    // nor may a file output be a checkpoint directory (each would break the other)
    const char* ckpt_dirs[][2] = {{"--ckpt-dir", a->ckpt_dir}, {"--ckpt-local", a->ckpt_local}};
    for (int d = 0; d < 2 && !bad && writer; d++)
        for (int o = 0; o < n_out && !bad && ckpt_dirs[d][1]; o++) {
            PathArg pair[] = {outputs[o], {ckpt_dirs[d][0], ckpt_dirs[d][1]}};
            bad = paths_check_distinct(NULL, 0, pair, 2, msg, sizeof(msg));
        }
    for (int o = 0; o < n_out && !bad && writer; o++) bad = paths_check_writable(&outputs[o], o == 0, msg, sizeof(msg));
    // --save and --trace are written beside their place and renamed over it
    // (atomic_file.h): never over a device or a pipe (--log streams: /dev/stdout is fine)
    for (int o = 1; o < n_out && !bad && writer; o++)
        if (outputs[o].path)
            bad = paths_check_regular(outputs[o].flag, outputs[o].path, "give a file name (the file is written whole, "
                                      "then renamed over it)", msg, sizeof(msg));
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
        snprintf(msg, sizeof(msg), "%s%s%s holds token id %d but the model's vocabulary has %d: give validation data "
                 "made with the training data's tokenizer, or a model with a larger vocabulary",
                 a->val ? "validation file '" : "the validation split of ", a->val ? a->val : name, a->val ? "'" : "",
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
    // fewer batches than --val-batches asks: each validation runs them all (train_eval.c)
    size_t val_batches = data_batches_per_epoch(&s->val, s->B, s->T);
    if (val_batches > 0 && val_batches < (size_t)a->val_batches)
        print0("note: the validation data holds %zu batch%s of %d x %d tokens: each validation loss is over %s, "
               "not --val-batches %d\n", val_batches, val_batches == 1 ? "" : "es", s->B, s->T,
               val_batches == 1 ? "that one" : "those", a->val_batches);
}

void train_setup_free(TrainSetup* s) {
    data_close(&s->train);
    data_close(&s->val);
}

void train_load_checkpoint(const TrainSetup* s, float* params_host) {
    char msg[ERROR_MAX];
    const char* bad = checkpoint_read_params(s->checkpoint, &s->cfg, params_host, msg, sizeof(msg));
    fail_if_any(bad != NULL, bad);
}

// ---------------------------------------------------------------- the mesh against the model

const char* train_mesh_problem(const int size[NUM_AXES], const GPTConfig* c, int B, int T, const MeshNeeds* needs,
                               char* msg, size_t len) {
    int dp = size[AXIS_DP], tp = size[AXIS_TP], pp = size[AXIS_PP], cp = size[AXIS_CP], ep = size[AXIS_EP];
    int micro = needs && needs->microbatches > 1 ? needs->microbatches : 1;
    int experts = needs ? needs->experts : 0;
    // every check in one style: what, its value, the axis, the fix
#define RANKS(n) (n), (n) == 1 ? "" : "s"
    long long split = (long long)dp * micro;  // (an int product overflows at --grad-accum 2^30)
    if (micro > 1 && split > B && B >= dp) {
        char batch[64] = "";  // the other fix, while it is a batch an int holds
        if (split <= 2147483647LL) snprintf(batch, sizeof(batch), ", or a batch divisible by %lld", split);
        snprintf(msg, len, "--batch %d over dp=%d rank%s leaves %d sequence%s a rank, too few for %d micro-batches: "
                 "use at most %d micro-batch%s%s", B, RANKS(dp), RANKS(B / dp), micro, B / dp, B / dp == 1 ? "" : "es",
                 batch);
    } else if (B % split != 0) {
        if (micro == 1)
            snprintf(msg, len, "--batch %d does not split over dp=%d rank%s: use a batch divisible by %d", B, RANKS(dp),
                     dp);
        else
            snprintf(msg, len, "--batch %d does not split over dp=%d rank%s x %d micro-batches: use a batch divisible by %lld",
                     B, RANKS(dp), micro, split);
    } else if (c->num_heads % tp != 0)
        snprintf(msg, len, "the model's %d heads do not split over tp=%d rank%s: use a tp that divides %d",
                 c->num_heads, RANKS(tp), c->num_heads);
    else if (!(needs && needs->whole_vocab) && c->padded_vocab_size % tp != 0)
        snprintf(msg, len, "the model's padded vocabulary of %d does not split over tp=%d rank%s: use a tp that divides %d",
                 c->padded_vocab_size, RANKS(tp), c->padded_vocab_size);
    else if (c->num_layers % pp != 0)
        snprintf(msg, len, "the model's %d layers do not split over pp=%d rank%s: use a pp that divides %d",
                 c->num_layers, RANKS(pp), c->num_layers);
    else if (T % cp != 0)
        snprintf(msg, len, "--seq %d does not split over cp=%d rank%s: use a sequence length divisible by %d", T,
                 RANKS(cp), cp);
    else if (ep > 1 && experts <= 0)
        snprintf(msg, len, "the model has no experts to split over ep=%d ranks: use --ep 1, or a model with experts", ep);
    else if (ep > 1 && experts % ep != 0)
        snprintf(msg, len, "the model's %d experts do not split over ep=%d rank%s: use an ep that divides %d", experts,
                 RANKS(ep), experts);
    else
        return NULL;
#undef RANKS
    return msg;
}

void train_check_mesh(const Mesh* mesh, const TrainSetup* s, const MeshNeeds* needs) {
    char msg[512];
    const char* bad = train_mesh_problem(mesh->size, &s->cfg, s->B, s->T, needs, msg, sizeof(msg));
    if (bad) fail_all("%s", bad);
}

void train_note_unused(int argc, char** argv, const TrainSetup* s) {
    // said, not passed over in silence (train_setup notes a split too short to use)
    const char* no_val = "there is no validation data (a token file has no validation split: give --val FILE)";
    args_note_unused(argc, argv, "val-every", s->val.count == 0, no_val);
    args_note_unused(argc, argv, "val-batches", s->val.count == 0, no_val);
}
