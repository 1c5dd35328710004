// Chapter 5: pipeline parallelism.
//
// The layers are cut into pp stages, one per rank of the pp axis: stage s
// owns a contiguous range of layers, the first stage also the embedding, the
// last the final LayerNorm and the LM head. A batch goes through the stages
// like cars through a car wash: each rank's share of the batch is cut into
// --microbatches m pieces, and while stage 1 runs microbatch 0, stage 0
// already runs microbatch 1. Activations travel forward between neighbouring
// stages and their gradients travel back, point to point.
//
//   mpirun -np 4 build/chapter-5 --pp 4 --model tiny6 --microbatches 8 --schedule 1f1b
//
// The order in which each stage runs its forwards and backwards is the
// schedule, and a schedule is data (05_pipeline/schedule.c): a list of
// actions per rank, F(mb, chunk), B(mb, chunk), W(mb, chunk), built by one
// small function per schedule:
//   gpipe        every forward, then every backward (m microbatches held)
//   1f1b         warm-up, then one forward one backward, then cool-down
//                (stage s holds at most pp - s microbatches)
//   interleaved  --virtual v chunks per rank, the bubble shrinks by v
//   zb           ZB-H1: backward split into the input gradient (B, on the
//                critical path) and the weight gradient (W, into the bubble)
// (--schedule-file FILE runs lists written by hand instead.) This file is
// the executor that runs any list, in the order a step runs: the three
// actions with their sends and receives, then the step around them: the
// tied embedding's two gradients summed, the dp all-reduce, the norm over
// the stages, AdamW on what each rank owns; then the training loop. What a
// rank owns and keeps (its layers and parameter pieces, its activation
// slots, set-up, validation, checkpoints, timelines) is the engine in
// 05_pipeline/pipeline.c. --recompute keeps less of each layer per
// microbatch in flight and recomputes it in backward.
//
// The layer split: virtual stage k of S = pp * v owns L / S layers, the first
// L % S stages one more (an uneven split when pp does not divide L, printed
// at start-up). With v > 1 the chunks must be equal: v must divide L / pp.
// A stage with no layer is refused (pp * v > L).
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "errors.h"
#include "exercise.h"  // exercise_not_done, in a homework tree
#include "memory.h"
#include "device_clock.h"
#include "rank.h"
#include "runtime.h"
#include "trace.h"

#include "pipeline.h"
#include "run.h"
#include "train_eval.h"
#include "train_loop.h"
#include "train_step.h"
#include "report.h"

// ---------------------------------------------------------------- point to point
// Why no schedule can deadlock here. Every send is non-blocking (a rank never
// waits for its peer to take a message), and every receive blocks until the
// message is there. A rank therefore waits only at the start of an action,
// for an input that another rank produces at the end of one of its actions.
// Such waits form a cycle only if the lists themselves do, and the validator
// (schedule_validate) runs the lists under exactly these rules and refuses
// any list in which every rank would end up waiting. Every rank builds and
// checks every rank's list before training.
//
// Messages carry no tag: between two ranks they arrive in the order they were
// sent (MPI's rule for one tag, NCCL's for one stream). With pp = 2 and
// interleaving, one peer is both neighbours and sends activations and
// gradients on the same channel, in an order that need not be the order in
// which this rank needs them. So a rank knows, from its peers' lists, the
// order in which each peer sends to it (P->link.in, built by pipe_create), and
// when it needs a message it receives everything that peer sent before it
// first, each into the slot where it belongs (an early activation takes its
// slot early), and the action that needs it later finds it already there.
// The built-in schedules never need this (their channels carry one kind of
// message, or run in lockstep); a schedule of your own (--schedule-file) may,
// and the summary counts such messages per rank ("early_receives").
// The receive itself is pipe_receive (05_pipeline/pipeline.c), which the
// capstone's pipeline calls too; this rank tells it where each message goes.

// Where a message goes: an activation into the slot of (mb, chunk c), taken
// now if it came before its F; a gradient into the slot its F took.
static float* slot_buffer(void* pipeline, int grad, int mb, int c) {
    Pipeline* P = pipeline;
    Slot* sl = grad ? slot_find(P, c, mb) : slot_get(P, c, mb);
    return grad ? sl->dres : sl->x;
}

// The input of F (grad 0) or B (grad 1) of (mb, chunk c), from the peer.
static void receive(Pipeline* P, int grad, int mb, int c) {
    // received now, not early: the time spent waiting for it is bubble, not
    // work, so the action's start is stamped again (run_schedule)
    if (pipe_receive(&P->link, grad, mb, c, slot_buffer, P)) device_stamp(&P->stamps, 2 * P->action);
}
// A send is pipe_send (non-blocking, from a buffer of its own: the slot may
// be reused before the peer has received it); the step ends with
// pipe_sends_wait, every send completed.

// ---------------------------------------------------------------- the three actions
// Chunk c of this rank is virtual stage k = pipe_vstage(P, c) of S =
// P->n_vstages: k = 0 embeds the tokens, k = S - 1 runs the head and the loss.

// F: take a slot, embed (stage 0) or receive the activation, run the chunk's
// layers, then the loss (the last stage) or send the output on.
static void forward(Pipeline* P, int mb, int c, long step) {
    const GPTConfig* g = P->cfg;
    int C = g->channels, NH = g->num_heads, k = pipe_vstage(P, c), b = P->micro_batch, T = P->seq;
    Slot* sl = slot_get(P, c, mb);
    if (k == 0 || k == P->n_vstages - 1) slot_load_tokens(P, sl, step, mb);
    if (k == 0) encoder_forward(sl->x, sl->inputs, P->wte, P->wpe, b, T, C);
    else receive(P, 0, mb, c);
    const float* x = sl->x;
    for (int j = 0; j < P->layers[c].count; j++) {
        BlockParams p = pipe_block_params(P, c, j);
        BlockActs a = slot_block(P, sl, j);
        double t0 = trace_start();
        block_forward(&p, &a, x, b, T, C, NH);
        trace_compute(t0, "block %d forward", P->layers[c].first + j);
        x = a.res3;
    }
    if (k == P->n_vstages - 1) {
        HeadActs h = slot_head(P, sl);
        head_forward(g, P->head_wte, P->lnfw, P->lnfb, &h, x, sl->targets, b, T);
        slot_queue_losses(P, sl, mb);  // added up once the step is done (pipe_step_loss_sum)
    } else {
        pipe_send(&P->link, x, pipe_next(&P->link));
    }
}

// B: the whole backward, or with a split backward only the input gradient
// (the weight halves wait for W, their stash in the slot).
static void backward(Pipeline* P, int mb, int c) {
    const GPTConfig* g = P->cfg;
    int C = g->channels, NH = g->num_heads, k = pipe_vstage(P, c), b = P->micro_batch, T = P->seq;
    int n = P->layers[c].count, split = P->sched.split_backward;
    Slot* sl = slot_find(P, c, mb);
    BlockScratch scr = block_scratch_at(P->scratch, b, T, C, NH);
    if (k == P->n_vstages - 1) {
        // each microbatch's share of the mean loss of this rank's sequences
        float dloss = 1.0f / ((float)b * T * P->n_micro);
        HeadActs h = slot_head(P, sl);
        const float* last = layer_input(P, sl, n);
        if (split)
            head_backward_input(g, P->head_wte, P->lnfw, &h, last, sl->targets, dloss, sl->dlnf, sl->dres, b, T);
        else
            head_backward(g, P->head_wte, P->lnfw, P->dhead_wte, P->dlnfw, P->dlnfb, &h, last, sl->targets, dloss,
                          scr.dln, sl->dres, b, T);
    } else {
        receive(P, 1, mb, c);
    }
    for (int j = n - 1; j >= 0; j--) {
        BlockParams p = pipe_block_params(P, c, j);
        // with a split backward the span is B, the input half
        double t0 = trace_start();
        BlockActs a = slot_recompute(P, sl, j, P->layers[c].first + j, &p, 0);
        if (split) {
            BlockStash st = slot_stash(P, sl, j);
            block_backward_input(&p, &a, &scr, &st, layer_input(P, sl, j), sl->dres, b, T, C, NH);
        } else {
            BlockParams gr = pipe_block_grads(P, c, j);
            block_backward(&p, &gr, &a, &scr, layer_input(P, sl, j), sl->dres, b, T, C, NH);
        }
        trace_compute(t0, "block %d backward", P->layers[c].first + j);
    }
    if (k > 0) pipe_send(&P->link, sl->dres, pipe_prev(&P->link));
    if (!split) {
        if (k == 0) encoder_backward(P->dwte, P->dwpe, sl->dres, sl->inputs, b, T, C);
        slot_pool_give(&P->pool[c], mb);
    }
}

// W: the weight gradients the input half left in the stash.
static void weights(Pipeline* P, int mb, int c) {
    // EXERCISE 5: the W action of a split backward: the head's and every layer's weight halves from the stash (recomputing what they read), the embedding's gradient on stage 0, then free the slot
    const GPTConfig* g = P->cfg;
    int C = g->channels, k = pipe_vstage(P, c), b = P->micro_batch, T = P->seq, n = P->layers[c].count;
    Slot* sl = slot_find(P, c, mb);
    if (k == P->n_vstages - 1) {
        HeadActs h = slot_head(P, sl);
        head_backward_weights(g, P->dhead_wte, P->dlnfw, P->dlnfb, &h, layer_input(P, sl, n), sl->dlnf, b, T);
    }
    for (int j = n - 1; j >= 0; j--) {
        BlockParams p = pipe_block_params(P, c, j), gr = pipe_block_grads(P, c, j);
        double t0 = trace_start();
        BlockActs a = slot_recompute(P, sl, j, P->layers[c].first + j, &p, 1);
        BlockStash st = slot_stash(P, sl, j);
        block_backward_weights(&gr, &a, &st, layer_input(P, sl, j), b, T, C);
        trace_compute(t0, "block %d backward weights", P->layers[c].first + j);
    }
    // the embedding's gradient is a weight gradient too: d encoded sits in dres
    if (k == 0) encoder_backward(P->dwte, P->dwpe, sl->dres, sl->inputs, b, T, C);
    slot_pool_give(&P->pool[c], mb);
    // END EXERCISE 5
}

// ---------------------------------------------------------------- the step

// Runs this rank's list once: one training step's forwards and backwards.
// Each action's start and end are stamps on the device (memory.h), for the
// timelines, read after the step (pipe_timeline): no wait for the device
// per action, so on a GPU the host queues the next action's kernels while
// the GPU runs this one. The start is when the action's input is there: a
// receive stamps it again (receive), so a wait for the input is idle time,
// the bubble, and not part of the action. On the CPU a stamp is the host
// clock: comm_recv blocks the host until the message is in, so the start is
// the message's arrival. On CUDA comm_recv returns at once and the compute
// stream waits for the message (common/cuda/comm.c); a stamp is an event on
// that stream, so the start is when the stream passed that wait: the
// message in and the previous action's kernels done. The end is when the
// stream has run the action's kernels (on the CPU: when they returned).
static void run_schedule(Pipeline* P, long step) {
    int r = P->stage;
    P->n_losses = 0;
    pipe_link_begin(&P->link);  // each step's messages from the start
    device_stamps_begin(&P->stamps, 2 * P->sched.n[r]);  // on CUDA a wait for the device, once a step
    for (int i = 0; i < P->sched.n[r]; i++) {
        Action a = P->sched.list[r][i];
        P->action = i;
        device_stamp(&P->stamps, 2 * i);  // its start, unless a receive moves it
        switch (a.type) {
            case ACT_F: forward(P, a.mb, a.chunk, step); break;
            case ACT_B: backward(P, a.mb, a.chunk); break;
            case ACT_W: weights(P, a.mb, a.chunk); break;
        }
        device_stamp(&P->stamps, 2 * i + 1);  // its end
    }
    pipe_sends_wait(&P->link);
}

// The tied embedding: stage 0 holds wte for the lookup and accumulated the
// lookup's gradient; the last stage holds a copy for the LM head and
// accumulated the head's. The model's gradient is their sum, so the two ends
// all-reduce it in their group of two (a + b = b + a, bit for bit): both hold
// the same sum, take the same AdamW step and stay equal. Megatron-LM does the
// same in its "embedding group" of the first and last stage (P->embed, one
// per pipeline). The sum is pipe_sum_tied_embedding (05_pipeline/pipeline.c),
// which the capstone's pipeline calls too.
static void sum_tied_embedding(Pipeline* P) {
    float* mine = P->stage == 0 ? P->dwte : P->dhead_wte;  // the lookup's half, or the head's
    pipe_sum_tied_embedding(&P->embed, P->pp, mine, param_tensor_numel(P->cfg, P_WTE));
}

static float train_step(Pipeline* P, const TrainArgs* args, long step, float* norm) {
    mem_zero(P->grads, P->n_local * sizeof(float));
    run_schedule(P, step);
    sum_tied_embedding(P);
    // data parallel: each stage's gradients averaged over its dp replicas
    if (P->dp->size > 1) comm_allreduce(P->dp, P->grads, P->n_local, COMM_AVG);
    // the norm: each parameter once (the tied copy left out), summed over
    // the stages; dp replicas hold the same gradients after the average
    double* mine = train_sumsq_begin();  // on the device, read once below
    for (int i = 0; i < P->n_pieces; i++)
        if (!P->piece[i].tied_copy) grad_sumsq(mine, P->grads + P->piece[i].local, P->piece[i].count);
    const Comm* groups[1] = {P->pp};
    *norm = (float)train_global_norm(mine, groups, 1);
    double t0 = trace_start();
    adamw_update(P->params, P->grads, P->mom, P->vel, P->n_local, train_adamw(args), (int)step + 1,
                 grad_clip_scale(*norm, args->clip));
    trace_compute(t0, "optimizer");
    // only the last stage saw the loss: it tells its pipeline, then the dp mean
    double loss = P->stage == P->n_stages - 1 ? pipe_step_loss_sum(P) / P->n_micro : 0.0;
    MPI_CHECK(MPI_Bcast(&loss, 1, MPI_DOUBLE, P->n_stages - 1, P->pp->mpi));
    return (float)train_mean(P->dp, loss);
}

// ---------------------------------------------------------------- main

int main(int argc, char** argv) {
    const char* sched_name = NULL;  // --schedule; 1f1b when not given
    const char* sched_file = NULL;
    int m = ARG_NOT_GIVEN, v = 1, show = 0;
    ArgSpec extra[] = {
        {"schedule", ARG_STRING, &sched_name, "gpipe | 1f1b | interleaved | zb  [1f1b]"},
        {"microbatches", ARG_INT, &m, "microbatches per step of each dp rank's share  [pp]"},
        {"virtual", ARG_INT, &v, "chunks (virtual stages) per rank, interleaved only  [1]"},
        {"schedule-file", ARG_INPUT, &sched_file,
         "FILE: every rank's actions from a text file, a schedule of your own (05_pipeline/schedule.h); instead of --schedule"},
        {"show-schedule", ARG_FLAG, &show, "print every rank's actions as an ASCII timeline before training"},
    };
    Run run;
    if (!run_start(&run, argc, argv, "build/chapter-5",
                   "Chapter 5: pipeline parallelism: stages, microbatches, GPipe, 1F1B, interleaved and zero-bubble schedules.",
                   extra, sizeof(extra) / sizeof(extra[0]), (1u << AXIS_DP) | (1u << AXIS_PP)))
        return 0;
    const TrainArgs* args = &run.args;
    const TrainSetup* setup = &run.setup;
    const GPTConfig* cfg = &setup->cfg;
    int kind = schedule_parse(sched_name ? sched_name : "1f1b");  // -1: refused with the layout below
    int pp = run.mesh.size[AXIS_PP], ndp = run.mesh.size[AXIS_DP], L = cfg->num_layers;
    // a schedule of one's own: m and v are the file's
    Schedule from_file;
    char why[ERROR_MAX];  // may name --schedule-file's path
    if (sched_file) {
        const char* bad = schedule_read(&from_file, sched_file, pp, why, sizeof(why));
        if (bad) fail_all("%s", bad);
        if ((m != ARG_NOT_GIVEN && m != from_file.m) || (v != 1 && v != from_file.v))
            fail_all("--schedule-file %s runs %d microbatch%s of %d chunk%s: drop --microbatches and --virtual", sched_file,
                     from_file.m, from_file.m == 1 ? "" : "es", from_file.v, from_file.v == 1 ? "" : "s");
        kind = SCHED_FILE, m = from_file.m, v = from_file.v;
    }
    int m_given = m != ARG_NOT_GIVEN && !sched_file;
    if (m == ARG_NOT_GIVEN) m = pp;
    // what the pipeline cannot run (05_pipeline/schedule.c, one function the
    // capstone and the planner call too): an unknown schedule, m outside 1 to
    // a dp rank's sequences, chunks without interleaving or on one rank, more
    // than 64 stages, a stage without layers, unequal chunks
    PipeLayout layout = {sched_name, sched_file != NULL, pp, m, v, L, setup->B, setup->B / ndp, 0, m_given};
    if (pipe_layout_problem(&layout, why, sizeof(why))) fail_all("%s", why);
    sched_name = schedule_name((ScheduleKind)kind);  // "file", else --schedule's name
    // the batch over dp x microbatches (train_check_mesh); the layers over pp
    // are this chapter's own rule (uneven splits allowed), so the shared
    // check sees pp = 1
    Mesh flat = run.mesh;
    flat.size[AXIS_PP] = 1;
    MeshNeeds needs = {.microbatches = m};
    train_check_mesh(&flat, setup, &needs);
    args_note_unused(argc, argv, "schedule", pp == 1 && m == 1 && kind != SCHED_ZB,
                     "one stage of one microbatch runs F, then B, in every schedule but zb (which adds W)");

    Pipeline P;
    pipe_create(&P, &run, (ScheduleKind)kind, m, v, sched_file ? &from_file : NULL);
    int B = setup->B, T = setup->T;
    print0("chapter 5: pipeline, pp=%d dp=%d, schedule %s, %d microbatch%s of %d sequence%s per dp rank, device %s\n",
           pp, ndp, sched_name, m, m == 1 ? "" : "es", P.micro_batch, P.micro_batch == 1 ? "" : "s", run.device);
    if (sched_file) print0("schedule from %s\n", sched_file);
    if (v > 1) print0("%d chunks per rank, %d virtual stages\n", v, pp * v);
    if (P.recompute != RECOMPUTE_NONE)
        print0("recompute %s: a slot keeps %zu of %zu floats a token of each layer, the rest recomputed in backward\n",
               recompute_name(P.recompute), block_store_numel(1, 1, cfg->channels, cfg->num_heads, P.recompute),
               block_acts_numel(1, 1, cfg->channels, cfg->num_heads));
    print0("model %s: %zu parameters, %d layers, global batch %d x %d\n", setup->model_name, gpt_num_params(cfg), L, B, T);
    pipe_print_layout(&P);
    pipe_show_sharding(&P, args->show_sharding);  // --show-sharding
    ScheduleSim sim;
    char msg[ERROR_MAX];
    schedule_validate(&P.sched, &sim, msg, sizeof(msg));
    if (m < pp)  // the simulated bubble: the formulas of interleaved and ZB-H1 assume m >= pp
        print0("note: %d microbatch%s for %d stages: some stages always idle (bubble %.2f)\n", m, m == 1 ? "" : "es", pp, sim.bubble);
    if (show && world_rank() == 0) schedule_print(&P.sched);

    // training-state checkpoints: --ckpt-dir, --save-every, --resume
    Ckpt ck;
    ckpt_init(&ck, args, setup, &run.mesh, 5);
    pipe_ckpt(&ck, &P);
    ckpt_resume(&ck);  // --resume: this rank's pieces, from whatever mesh saved them

    // the loop: each step runs the schedule and the optimizer; the loop
    // object times it, reports it, validates and checkpoints (train_loop.h)
    MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));  // the timelines start together
    TrainLoop loop;
    train_loop_begin(&loop, &run, &(TrainLoopSpec){
        .chapter = 5, .num_params = gpt_num_params(cfg), .flops_per_token = gpt_flops_per_token(cfg, T),
        .rows = P.micro_batch, .val_loss = pipe_val_loss, .ctx = &P, .ckpt = &ck});
    for (int step = loop.start; step < loop.steps; step++) {
        float norm;
        float loss = train_step(&P, args, step, &norm);
        pipe_timeline(&P, &loop.log, step, !train_loop_timed(&loop, step));  // the bubble of the step
        train_loop_step(&loop, step, loss, norm);
    }
    double formula = schedule_bubble_formula(kind, pp, m, v);
    print0("bubble: measured %.3f of the ranks' time idle in the schedule, simulated %.3f, formula %.3f\n",
           pipe_bubble(&P), sim.bubble, formula);
    JsonBuf fields = {0};  // the schedule, its bubbles, every rank's layers, slots and early receives
    pipe_summary_fields(&P, sched_name, sim.bubble, formula, &fields);
    train_loop_end(&loop, &fields);  // the final validation and the summary
    json_free(&fields);

    if (train_wants_params(args)) {
        float* host = pipe_gather_params(&P);
        train_finish_params(args, cfg, T, host);
        free(host);
    }
    pipe_free(&P);
    run_finish(&run);
    return 0;
}
