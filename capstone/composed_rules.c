// composed_rules.c: the capstone's refusals of a layout (composed_rules.h).
#include "composed_rules.h"

#include <stdio.h>

#include "args.h"      // ARG_NOT_GIVEN
#include "moe.h"       // chapter 7's moe_overlap_problem
#include "schedule.h"  // chapter 5's pipe_layout_problem

int composed_pipelined(const ComposedLayout* c) {
    return c->mesh[AXIS_PP] > 1 || c->microbatches != ARG_NOT_GIVEN || c->virtual_chunks != 1;
}

// The microbatches of a step: --microbatches, else pp (without the pipeline 1).
static int microbatches(const ComposedLayout* c) {
    return c->microbatches == ARG_NOT_GIVEN ? c->mesh[AXIS_PP] : c->microbatches;
}

static const char* pipeline_problem(const ComposedLayout* c, char* msg, size_t len) {
    int pp = c->mesh[AXIS_PP], tp = c->mesh[AXIS_TP];
    int share = c->B / (c->mesh[AXIS_DP] * c->mesh[AXIS_EP]), per_rank = share / tp;
    int m = microbatches(c);
    // chapter 5's rules and lines (05_pipeline/schedule.c), with equal stages
    // even at v = 1: the composition's stages are chunks of one size
    PipeLayout layout = {c->schedule, 0, pp, m, c->virtual_chunks, c->num_layers, c->B, share, 1,
                         c->microbatches != ARG_NOT_GIVEN};
    if (pipe_layout_problem(&layout, msg, len)) return msg;
    if (tp > 1 && share % (m * tp) != 0)  // --tp: each tp rank whole sequences of each microbatch
        snprintf(msg, len, "--microbatches %d --tp %d: a microbatch of a dp x ep share (%d sequences) must split into tp=%d "
                 "ranks' whole sequences, so m x tp must divide %d: use other --microbatches or --batch", m, tp, share, tp, share);
    else if (per_rank % m != 0)
        snprintf(msg, len, "--microbatches %d does not divide a rank's %d sequences (the batch of %d over dp x ep x tp = %d "
                 "ranks): use a divisor of %d", m, per_rank, c->B, c->mesh[AXIS_DP] * c->mesh[AXIS_EP] * tp, per_rank);
    else
        return NULL;
    return msg;
}

const char* composed_layout_problem(const ComposedLayout* c, char* msg, size_t len) {
    int world = c->mesh[AXIS_DP] * c->mesh[AXIS_EP], tp = c->mesh[AXIS_TP], cp = c->mesh[AXIS_CP];
    if (c->B % world != 0)
        snprintf(msg, len, "the batch of %d sequences does not split over dp x ep = %d ranks (every rank takes its own "
                 "sequences): use a --batch that is a multiple of %d", c->B, world, world);
    // --tp: a tp rank holds B/tp whole sequences of its share through the
    // per-token parts (sequence parallelism, composed_tp.c)
    else if ((c->B / world) % tp != 0)
        snprintf(msg, len, "--tp %d: each tp rank takes whole sequences of its share, but the %d sequences per dp x ep "
                 "share do not split over tp=%d: use a --batch that is a multiple of %d", tp, c->B / world, tp, world * tp);
    // chapter 6's layout and algorithms need what they need there (a tp
    // rank's heads are the ones Ulysses splits over cp)
    else if (cp > 1 && cp_mesh_problem(c->cp_mode, c->cp_balance, c->T, c->num_heads / tp, cp, msg, len))
        return msg;
    else if (c->zero < 0 || c->zero > 3)
        snprintf(msg, len, "--zero %d: the stages are 0 (none), 1 (the AdamW moments), 2 (the gradients too) and 3 (the "
                 "parameters too)", c->zero);
    else if (schedule_name_problem(c->schedule, msg, len))  // chapter 5's names, given with --pp or not
        return msg;
    else if (c->zero > 1 && composed_pipelined(c))
        snprintf(msg, len, "--zero %d: not with the pipeline (--pp, --microbatches): the gradients accumulate over the "
                 "microbatches, so sharding them would cost a reduce-scatter per unit per microbatch (ZeRO-2 and 3 "
                 "are incompatible with pipeline parallelism, as DeepSpeed says): use --zero 1", c->zero);
    else if (composed_pipelined(c) && pipeline_problem(c, msg, len))
        return msg;
    else  // chapter 7's rule and line, on the tokens of one forward: a rank's of a microbatch
        return moe_overlap_problem(c->ep_overlap, (long)(c->B / world / tp / microbatches(c)) * (c->T / cp), msg, len);
    return msg;
}
