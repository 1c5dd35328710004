// composed_rules.h: what the capstone refuses of a layout, one function that
// build/capstone (expert_config, composed_model.c) and the planner
// (tools/plan/plan_expert.c) both call, so a layout the planner refuses is
// refused by the run with the same line, and the reverse.
#ifndef COMPOSED_RULES_H
#define COMPOSED_RULES_H

#include <stddef.h>

#include "context.h"  // chapter 6's CPMode, CPBalance, cp_mesh_problem
#include "mesh.h"
#include "schedule.h"  // chapter 5's PIPE_MAX_CHUNKS, pipe_layout_problem

// A layout of the capstone: the mesh, the batch and the model's sizes, and
// the composition's flags (microbatches ARG_NOT_GIVEN when not given).
typedef struct {
    int mesh[NUM_AXES];
    int B, T, num_layers, num_heads;
    int zero, microbatches, virtual_chunks;
    const char* schedule;
    CPMode cp_mode;
    CPBalance cp_balance;
    int ep_overlap;
} ComposedLayout;

// 1 when the step runs chapter 5's pipeline: --pp > 1, --microbatches given,
// or --virtual other than 1 (a pipeline of one stage accumulates microbatches).
int composed_pipelined(const ComposedLayout* c);

// NULL when the capstone trains this layout, else what does not fit (in
// msg), in the order the capstone checks: the batch over dp x ep, then over
// tp, chapter 6's cp rules, the ZeRO stage's range, the schedule's name
// (chapter 5's, refused unknown with or without --pp), ZeRO 2 and 3 with the
// pipeline, and with the pipeline chapter 5's rules (pipe_layout_problem: the schedule, the microbatches, the
// chunks, the layers, with equal stages), then the composition's own: a
// microbatch's whole sequences per tp rank; last chapter 7's --ep-overlap
// rule (moe_overlap_problem) on the tokens of one forward.
const char* composed_layout_problem(const ComposedLayout* c, char* msg, size_t len);

#endif
