// Chapter 0: the device mesh, and the single-device reference trainer.
//
// Part 1, the mesh. Every later chapter arranges its ranks in a grid with named
// axes (dp, tp, pp, cp, ep) and talks along one axis at a time. This program
// builds that grid from the flags, draws it, and proves that every axis
// communicator holds exactly the ranks the picture says: a sum along each axis
// must equal the sum the coordinates predict.
//
//   mpirun -np 4 build/chapter-0 --dp 2 --tp 2
//
// Part 2, the reference. On one rank it trains the GPT the plain way: forward,
// backward, clip, AdamW. Every other chapter must reproduce these losses step
// for step; this is the yardstick.
//
//   mpirun -np 1 build/chapter-0 --steps 20
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "args.h"
#include "ckpt.h"
#include "errors.h"
#include "matmul_peak.h"
#include "memory.h"
#include "device.h"
#include "mesh.h"
#include "model.h"
#include "rank.h"
#include "report.h"
#include "runtime.h"
#include "trace.h"
#include "run.h"
#include "train.h"
#include "train_eval.h"
#include "train_loop.h"
#include "train_step.h"
#include "watchdog.h"
#include "sharding.h"

// ---------------------------------------------------------------- part 1: the mesh

// Along each axis, every rank adds up the world ranks of its group with one
// MPI_Allreduce on that axis's communicator, and compares the sum with the one
// its own coordinates predict. A wrong split (a rank in the wrong group, groups
// in the wrong order) changes some sum.
static void mesh_check(const Mesh* mesh) {
    char msg[256] = "";
    int failed = 0;
    for (int a = 0; a < NUM_AXES; a++) {
        int group_size = 0, group_rank = 0;
        MPI_CHECK(MPI_Comm_size(mesh->axis_comm[a], &group_size));
        MPI_CHECK(MPI_Comm_rank(mesh->axis_comm[a], &group_rank));
        long mine = mesh->rank, sum = 0, expected = 0;
        MPI_CHECK(MPI_Allreduce(&mine, &sum, 1, MPI_LONG, MPI_SUM, mesh->axis_comm[a]));
        int coord[NUM_AXES];
        for (int k = 0; k < NUM_AXES; k++) coord[k] = mesh->coord[k];
        for (int k = 0; k < mesh->size[a]; k++) {
            coord[a] = k;
            expected += mesh_rank_at(mesh, coord);
        }
        if (group_size != mesh->size[a] || group_rank != mesh->coord[a] || sum != expected) {
            failed = 1;
            snprintf(msg, sizeof(msg), "rank %d: %s group has size %d, my index %d, rank sum %ld; expected %d, %d, %ld",
                     mesh->rank, mesh_axis_name(a), group_size, group_rank, sum, mesh->size[a],
                     mesh->coord[a], expected);
        }
    }
    fail_if_any(failed, msg);
    print0("mesh check: the sum of ranks along every axis matches the picture\n");
}

// ---------------------------------------------------------------- part 2: the reference

// One training step of the reference, on the whole model and the whole batch.
// Returns the loss; *norm gets the gradient norm before clipping.
// frozen: the first `frozen` parameters of the flat layout are not updated
// (--freeze embeddings: wte and wpe, 0 otherwise).
static float train_step(GPT* model, const TrainArgs* args, int step, const int* inputs,
                        const int* targets, float* norm, size_t frozen) {
    // forward: embed, every block, final LayerNorm, LM head, cross-entropy
    float loss = gpt_forward(model, inputs, targets);
    // backward: the same in reverse; gradients accumulate, so zero them first
    gpt_zero_grad(model);
    gpt_backward(model);
    // clip by the global norm: here "global" is one rank (no groups to sum
    // over); sharded chapters pass the groups their shards are spread over.
    // The sum of squares stays on the device until train_global_norm reads it.
    double* sumsq = train_sumsq_begin();
    grad_sumsq(sumsq, model->grads, model->num_params);
    *norm = (float)train_global_norm(sumsq, NULL, 0);
    float scale = grad_clip_scale(*norm, args->clip);
    // AdamW on the whole flat buffer: parameters, gradients and both moments
    // share the layout, so one call updates everything (past a frozen head)
    double t0 = trace_start();
    adamw_update(model->params + frozen, model->grads + frozen, model->m + frozen, model->v + frozen,
                 model->num_params - frozen, train_adamw(args), step + 1, scale);
    trace_compute(t0, "optimizer");
    return loss;
}

// The reference on the one rank of `run` (its mesh, flags and data).
static void train_reference(const Run* run, int freeze) {
    const TrainArgs* args = &run->args;
    const TrainSetup* setup = &run->setup;
    const GPTConfig* cfg = &setup->cfg;
    int B = setup->B, T = setup->T;
    train_check_mesh(&run->mesh, setup, NULL);  // one rank: every split is whole

    GPT model;
    // --recompute: how much of each block's forward is kept for backward
    gpt_create_recompute(&model, cfg, B, T, (uint64_t)args->seed, (RecomputeMode)args->recompute);
    gpt_create_optimizer(&model);
    sharding_show_replicated(cfg, 1, args->show_sharding, "chapter 0, one rank");  // --show-sharding
    if (setup->checkpoint) {
        float* host = xmalloc(model.num_params * sizeof(float));
        train_load_checkpoint(setup, host);
        mem_to_device(model.params, host, model.num_params * sizeof(float));
        free(host);
    }
    // training-state checkpoints: one rank holds the whole state, so it
    // writes all of it and reads all of it (--resume: from any chapter's)
    Ckpt ck;
    ckpt_init(&ck, args, setup, &run->mesh, 0);
    ckpt_add_state(&ck.own, cfg, 0, model.num_params, model.params, model.m, model.v);
    ckpt_add_state(&ck.need, cfg, 0, model.num_params, model.params, model.m, model.v);
    if (freeze) ckpt_add_identity(&ck, "freeze embeddings");  // another model trains: another run
    ckpt_resume(&ck);
    print0("model %s: L=%d C=%d NH=%d V=%d (padded %d) maxT=%d, %zu parameters\n",
           setup->model_name, cfg->num_layers, cfg->channels, cfg->num_heads, cfg->vocab_size,
           cfg->padded_vocab_size, cfg->max_seq_len, model.num_params);
    print0("batch %d x %d tokens, %zu training tokens, %zu validation tokens\n", B, T,
           setup->train.count, setup->val.count);
    train_print_recompute((RecomputeMode)args->recompute, NULL);
    // --freeze embeddings: wte (tied: the LM head too) and wpe stay as
    // initialised or loaded, the rest trains; what an incremental
    // checkpoint's delta can skip (docs/checkpoints.md)
    size_t frozen = freeze ? gpt_tensor_offset(cfg, P_WPE, 0) + param_tensor_numel(cfg, P_WPE) : 0;
    if (frozen) print0("frozen: wte and wpe, %zu of %zu parameters\n", frozen, model.num_params);

    // the loop: each step reads batch `step` and trains on it; the loop
    // object times it, reports it, validates and checkpoints (train_loop.h)
    TrainLoop loop;
    train_loop_begin(&loop, run, &(TrainLoopSpec){
        .chapter = 0, .num_params = model.num_params, .flops_per_token = gpt_flops_per_token(cfg, T),
        .rows = B, .val_loss = train_val_loss_gpt, .ctx = &model, .ckpt = &ck});
    for (int step = loop.start; step < loop.steps; step++) {
        data_batch(&setup->train, step, B, T, 0, B, loop.inputs, loop.targets);  // (B, T) tokens
        float norm;
        float loss = train_step(&model, args, step, loop.inputs, loop.targets, &norm, frozen);
        train_loop_step(&loop, step, loss, norm);
    }
    train_loop_end(&loop, NULL);  // the final validation and the summary

    if (train_wants_params(args)) {  // --sample, --save
        float* host = xmalloc(model.num_params * sizeof(float));
        mem_to_host(host, model.params, model.num_params * sizeof(float));
        train_finish_params(args, cfg, T, host);
        free(host);
    }
    gpt_free(&model);
}

// The flags a mesh of more than one rank uses: the axes, the threads, the
// watchdog, the device's math; --steps 0 asks for no training.
static int mesh_run_flag(const char* flag, const char* value) {
    const char* used[] = {"--dp", "--tp", "--pp", "--cp", "--ep", "--threads", "--timeout", "--tf32"};
    for (size_t k = 0; k < sizeof(used) / sizeof(used[0]); k++)
        if (!strcmp(flag, used[k])) return 1;
    return !strcmp(flag, "--steps") && !strcmp(value, "0");
}

int main(int argc, char** argv) {
    runtime_init(&argc, &argv);
    TrainArgs args;
    char msg[ERROR_MAX];
    unsigned axes = (1u << AXIS_DP) | (1u << AXIS_TP) | (1u << AXIS_PP) | (1u << AXIS_CP) | (1u << AXIS_EP);
    // chapter 0's own flag: --freeze embeddings keeps wte and wpe fixed
    const char* freeze = "none";
    ArgSpec extra[] = {{"freeze", ARG_STRING, &freeze, "none | embeddings: parameters not updated  [none]"}};
    const char* bad = args_parse(argc, argv, &args, extra, 1, axes, msg, sizeof(msg));
    if (bad && !strcmp(bad, "help")) {
        if (world_rank() == 0)
            args_usage("build/chapter-0",
                       "Chapter 0: builds the device mesh from the axis flags, draws it and checks\n"
                       "every axis communicator; on one rank, trains the single-device reference GPT.",
                       extra, 1, axes);
        runtime_finalize();
        return 0;
    }
    if (bad) fail_all("%s", bad);
    if (strcmp(freeze, "none") && strcmp(freeze, "embeddings")) fail_all("--freeze %s is not one of none, embeddings", freeze);

    Mesh mesh;
    bad = mesh_create(&mesh, args.mesh, msg, sizeof(msg));
    if (bad) fail_all("%s", bad);
    int threads = runtime_set_threads(args.threads);
    watchdog_start(args.timeout);
    const char* device = device_init(runtime_local_rank());
    const char* tf32_note = device_set_tf32(args.tf32);  // --tf32 (device.h)
    if (tf32_note) print0("note: %s\n", tf32_note);

    mesh_print(&mesh);
    mesh_check(&mesh);
    if (mesh.world_size == 1) {
        print0("%d thread%s, device %s\n", threads, threads == 1 ? "" : "s", device);
        // a run of one rank: the flags, the mesh, the model and data, the
        // matmul peak for MFU (run.h's Run, without the communicators the
        // reference does not use)
        Run run = {.args = args, .mesh = mesh, .device = device};
        train_setup(&run.setup, &args);
        train_note_unused(argc, argv, &run.setup);  // --val-every with no validation data, ...
        run.peak_gflops = report_matmul_peak(args.peak_gflops);
        trace_open(args.trace);
        train_reference(&run, !strcmp(freeze, "embeddings"));
        trace_finish();
        train_setup_free(&run.setup);
    } else {
        print0("the reference trains on one rank: mpirun -np 1 build/chapter-0 (later chapters train on the mesh)\n");
        // the flags of a training run do nothing here: said, not ignored
        // (a --save that wrote no file, a --model never opened)
        char ignored[512] = "";
        size_t n = 0;
        for (int i = 1; i < argc && n < sizeof(ignored) - 64; i++)
            if (!strncmp(argv[i], "--", 2) && !mesh_run_flag(argv[i], i + 1 < argc ? argv[i + 1] : ""))
                n += (size_t)snprintf(ignored + n, sizeof(ignored) - n, "%s%s", n ? ", " : "", argv[i]);
        if (n) print0("note: %s do%s nothing on a mesh of %d ranks (nothing is trained, read or written)\n", ignored,
                      strchr(ignored, ',') ? "" : "es", mesh.world_size);
    }
    mesh_destroy(&mesh);
    runtime_finalize();
    return 0;
}
