// args.h: the command line every chapter shares, plus a chapter's own flags.
#ifndef ARGS_H
#define ARGS_H

#include <stddef.h>
#include <stdint.h>

#include "mesh.h"

typedef struct {
    const char* model;     // --model tiny|small|FILE.bin
    const char* data;      // --data FILE (text or token file); NULL: default corpus
    const char* val;       // --val FILE (token file); NULL: the split of --data
    int steps;             // --steps
    int batch;             // --batch: global sequences per step (0: the model's default)
    int seq;               // --seq: tokens per sequence (0: the model's default)
    float lr, wd, clip;    // --lr, --wd, --clip (0: no clipping)
    int seed;              // --seed
    const char* log;       // --log FILE.jsonl
    int sample;            // --sample N characters after training (at most ARGS_MAX_SAMPLE)
    const char* save;      // --save FILE.bin: checkpoint after training
    const char* ckpt_dir;  // --ckpt-dir DIR: training-state checkpoints (ckpt.h)
    int save_every;        // --save-every N steps (0: only at the end, with --ckpt-dir)
    int keep;              // --keep K newest checkpoints (0: all)
    int async_save;        // --async-save: a thread writes while training goes on
    int show_sharding;     // --show-sharding: print who holds what (sharding.h)
    const char* resume;    // --resume DIR: the latest complete checkpoint in DIR
    const char* ckpt_local;  // --ckpt-local DIR: level-1 checkpoints, DIR/node-K/step-N (ckpt.h)
    int local_every;         // --local-every N steps (0: only at the end, with --ckpt-local)
    int ranks_per_node;      // --ranks-per-node R: simulated nodes (0: MPI's shared-memory split)
    int incremental;         // --incremental K: every K-th level-3 save full, deltas between (0, 1: all full)
    int redundancy;          // --ckpt-redundancy: 0 none, 1 partner, 2 xor (args_redundancy_name)
    int val_every;         // --val-every N steps (0: only at the end)
    int val_batches;       // --val-batches
    int threads;           // --threads per rank (0: cores / ranks on the node)
    float peak_gflops;     // --peak-gflops (0: measure at start-up)
    int mesh[NUM_AXES];    // --dp --tp --pp --cp --ep
    int recompute;         // --recompute none|selective|full: a RecomputeMode (model.h)
    const char* trace;     // --trace FILE.json: per-rank timelines (trace.h)
    const char* comm;      // --comm library|hand (chapters 2+: run_start adds the flag)
    float timeout;         // --timeout SECONDS: the watchdog's limit on one wait (watchdog.h; 0: off)
    int tf32;              // --tf32: TF32 tensor cores for cuBLAS's matmuls (CUDA; no effect on the CPU: device.h)
    const char *input_flag, *input;  // a chapter's ARG_INPUT flag and its file as given (NULL: none)
} TrainArgs;

#define ARGS_MAX_SAMPLE 100000
#define ARGS_MAX_THREADS 1024       // --threads: more is a typo, not a machine
#define ARGS_MAX_VAL_BATCHES 100000  // --val-batches: each is a forward pass
// A string flag's value at most: a path (--ckpt-dir, --log, ...) leaves room
// for the names a run adds under it (node-K/step-N/rank-N.delta) in the
// 4096 bytes a path may have, so no path the run makes is cut
#define ARGS_MAX_STRING 3840
// An int flag that was not given (so a chapter can tell 0 from "default").
#define ARG_NOT_GIVEN (-2147483647 - 1)

// ARG_FLAG takes no value and sets its int to 1. ARG_INPUT is a string that
// names a file the run reads (chapter 5's --schedule-file): train_setup
// refuses an output (--log, --save, --trace) on it, as on --model and --data.
// One such flag a program.
typedef enum { ARG_INT, ARG_FLOAT, ARG_STRING, ARG_FLAG, ARG_INPUT } ArgType;

// A chapter's own flag: --name VALUE stored in *dest.
typedef struct {
    const char* name;  // without the leading dashes
    ArgType type;      // dest is int* (ARG_INT, ARG_FLAG), float* or const char**
    void* dest;
    const char* help;
} ArgSpec;

// Sets the defaults, then parses argv. axes is a bit mask (1 << AXIS_DP | ...)
// of the mesh flags the chapter accepts. Returns NULL, "help" when --help was
// given, or a message naming the bad flag and the fix.
const char* args_parse(int argc, char** argv, TrainArgs* a, const ArgSpec* extra, int n_extra,
                       unsigned axes, char* msg, size_t msg_len);
// For a program that is not a trainer (chapter 1): only its own flags.
// Returns NULL, "help", or a message.
const char* args_parse_only(int argc, char** argv, const ArgSpec* flags, int n_flags, char* msg,
                            size_t msg_len);

// Rank 0 notes a flag given on the command line that this run does not use
// (unused: the mode or the axis it belongs to is off), with why: said, not
// ignored, so a sweep may pass one set of flags to every mode.
void args_note_unused(int argc, char** argv, const char* name, int unused, const char* why);

// "none", "partner", "xor" for TrainArgs.redundancy
const char* args_redundancy_name(int redundancy);

// Prints the usage to stdout (rank 0 calls it). a NULL summary prints nothing
// above the flags; shared flags are listed unless axes is ARGS_NO_SHARED.
#define ARGS_NO_SHARED 0xFFFFFFFFu
void args_usage(const char* program, const char* summary, const ArgSpec* extra, int n_extra,
                unsigned axes);

// A tool's integer flag (build/roofline, build/attention_bench): the value of
// flag in text, from lo to hi; anything else prints one error line naming
// the flag and exits 1 (the tools run on one process).
int args_int_in(const char* flag, const char* text, int lo, int hi);

#endif
