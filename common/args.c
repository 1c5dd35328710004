// args.c: command-line parsing shared by every chapter.
#include "args.h"

#include <errno.h>
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model.h"
#include "rank.h"
#include "watchdog.h"

typedef struct {
    const char* name;
    ArgType type;
    const char* help;
} SharedFlag;

static const SharedFlag shared_flags[] = {
    {"model", ARG_STRING, "tiny | tiny6 | small | FILE.bin (llm.c GPT-2 checkpoint)  [tiny]"},
    {"data", ARG_STRING, "text file or llm.c token file  [the fortunes corpus]"},
    {"val", ARG_STRING, "validation token file  [last 10% of a text --data]"},
    {"steps", ARG_INT, "training steps  [50]"},
    {"batch", ARG_INT, "global batch, sequences per step  [tiny 4, small 8, file 4]"},
    {"seq", ARG_INT, "tokens per sequence  [tiny 64, small 256, file min(64, maxT)]"},
    {"lr", ARG_FLOAT, "AdamW learning rate  [1e-3]"},
    {"wd", ARG_FLOAT, "AdamW weight decay  [0]"},
    {"clip", ARG_FLOAT, "clip the global gradient norm to this, 0 = off  [1.0]"},
    {"seed", ARG_INT, "init and sampling seed  [1337]"},
    {"log", ARG_STRING, "write JSONL records (steps, summary) to FILE"},
    {"sample", ARG_INT, "after training, print N generated characters  [0]"},
    {"save", ARG_STRING, "after training, write the model to FILE.bin (llm.c format)"},
    {"ckpt-dir", ARG_STRING, "write training-state checkpoints under DIR (at the end, and every --save-every)"},
    {"save-every", ARG_INT, "with --ckpt-dir, a checkpoint every N steps too  [0: at the end only]"},
    {"keep", ARG_INT, "keep the N newest checkpoints in --ckpt-dir (--ckpt-local: on each node), 0 = all  [3]"},
    {"async-save", ARG_FLAG, "write checkpoints from a background thread while training goes on"},
    {"resume", ARG_STRING, "resume from the latest complete checkpoint in DIR (any chapter, any mesh)"},
    {"ckpt-local", ARG_STRING, "level 1: node-local checkpoints under DIR/node-K (e.g. /dev/shm/run)"},
    {"local-every", ARG_INT, "with --ckpt-local, a level-1 checkpoint every N steps too  [0: at the end only]"},
    {"ranks-per-node", ARG_INT, "simulate nodes of R ranks for --ckpt-local  [0: the MPI shared-memory split]"},
    {"incremental", ARG_INT, "with --ckpt-dir, every K-th save full, xor deltas (zstd) between  [0: all full]"},
    {"ckpt-redundancy", ARG_STRING, "none | partner | xor: level 2, level-1 files kept across nodes  [none]"},
    {"val-every", ARG_INT, "validation loss every N steps, 0 = at the end only  [0]"},
    {"val-batches", ARG_INT, "batches per validation loss, at most what the data holds  [4]"},
    {"threads", ARG_INT, "threads per rank  [OMP_NUM_THREADS, else cores / ranks on the node]"},
    {"peak-gflops", ARG_FLOAT, "one rank's matmul peak for MFU in GFLOP/s (MFU divides by the ranks' sum)  [measured at start-up]"},
    {"timeout", ARG_FLOAT, "end every rank when one waits this many seconds on a rank that stopped (0: never)  [300]"},
    {"recompute", ARG_STRING, "none | selective | full: activations kept for backward  [none]"},
    {"trace", ARG_STRING, "write every rank's timeline to FILE.json (Chrome trace events)"},
    {"tf32", ARG_FLAG, "CUDA: cuBLAS matmuls on TF32 tensor cores (10-bit mantissa inputs); CPU: no effect  [off]"},
    {"show-sharding", ARG_FLAG, "print each tensor's placement over the mesh and the bytes per rank (--steps 0: only that)"},
};
#define NUM_SHARED (int)(sizeof(shared_flags) / sizeof(shared_flags[0]))

// --batch and --seq left out mean the model's default (0 after parsing);
// given, they must be positive, so "--batch 0" is an error, not the default.

static void set_defaults(TrainArgs* a) {
    memset(a, 0, sizeof(*a));
    a->batch = ARG_NOT_GIVEN;
    a->seq = ARG_NOT_GIVEN;
    a->model = "tiny";
    a->steps = 50;
    a->lr = 1e-3f;
    a->wd = 0.0f;
    a->clip = 1.0f;
    a->seed = 1337;
    a->timeout = WATCHDOG_DEFAULT_SECONDS;
    a->val_batches = 4;
    a->keep = ARG_NOT_GIVEN;  // 3 unless given (given, it needs a checkpoint directory)
    a->comm = "library";
    for (int i = 0; i < NUM_AXES; i++) a->mesh[i] = 1;
}

// Parses value into dest by type; returns 0 if it is not a number, -1 if it
// is a non-zero number too small for a float (it would become 0), -2 if it is
// a number too large for its type.
static int parse_value(const char* value, ArgType type, void* dest) {
    char* end = NULL;
    errno = 0;
    if (type == ARG_INT) {
        long v = strtol(value, &end, 10);
        if (end == value || *end) return 0;
        if (errno == ERANGE || v < -2147483647L || v > 2147483647L) return -2;
        *(int*)dest = (int)v;
    } else if (type == ARG_FLOAT) {
        double v = strtod(value, &end);
        if (end == value || *end) return 0;
        if ((errno == ERANGE && fabs(v) < 1.0) || (v != 0.0 && (float)v == 0.0f)) return -1;  // 1e-400, 1e-50
        // "inf" and "nan" parse as numbers, but no flag of the course means them
        if (errno == 0 && !isfinite(v)) return 0;
        if (!isfinite((float)v)) return -2;  // 1e39: past the largest float
        *(float*)dest = (float)v;
    } else {
        *(const char**)dest = value;
    }
    return 1;
}

// --recompute's word, turned into TrainArgs.recompute after parsing
static const char* recompute_arg = NULL;
// --ckpt-redundancy's word, turned into TrainArgs.redundancy
static const char* redundancy_arg = NULL;
static const char* redundancy_names[] = {"none", "partner", "xor"};

const char* args_redundancy_name(int r) { return r >= 0 && r < 3 ? redundancy_names[r] : "?"; }

static void* shared_dest(TrainArgs* a, const char* name) {
    if (!strcmp(name, "model")) return &a->model;
    if (!strcmp(name, "data")) return &a->data;
    if (!strcmp(name, "val")) return &a->val;
    if (!strcmp(name, "steps")) return &a->steps;
    if (!strcmp(name, "batch")) return &a->batch;
    if (!strcmp(name, "seq")) return &a->seq;
    if (!strcmp(name, "lr")) return &a->lr;
    if (!strcmp(name, "wd")) return &a->wd;
    if (!strcmp(name, "clip")) return &a->clip;
    if (!strcmp(name, "seed")) return &a->seed;
    if (!strcmp(name, "log")) return &a->log;
    if (!strcmp(name, "sample")) return &a->sample;
    if (!strcmp(name, "save")) return &a->save;
    if (!strcmp(name, "ckpt-dir")) return &a->ckpt_dir;
    if (!strcmp(name, "save-every")) return &a->save_every;
    if (!strcmp(name, "keep")) return &a->keep;
    if (!strcmp(name, "async-save")) return &a->async_save;
    if (!strcmp(name, "resume")) return &a->resume;
    if (!strcmp(name, "ckpt-local")) return &a->ckpt_local;
    if (!strcmp(name, "local-every")) return &a->local_every;
    if (!strcmp(name, "ranks-per-node")) return &a->ranks_per_node;
    if (!strcmp(name, "ckpt-redundancy")) return &redundancy_arg;
    if (!strcmp(name, "incremental")) return &a->incremental;
    if (!strcmp(name, "val-every")) return &a->val_every;
    if (!strcmp(name, "val-batches")) return &a->val_batches;
    if (!strcmp(name, "threads")) return &a->threads;
    if (!strcmp(name, "peak-gflops")) return &a->peak_gflops;
    if (!strcmp(name, "timeout")) return &a->timeout;
    if (!strcmp(name, "recompute")) return &recompute_arg;
    if (!strcmp(name, "trace")) return &a->trace;
    if (!strcmp(name, "show-sharding")) return &a->show_sharding;
    if (!strcmp(name, "tf32")) return &a->tf32;
    return NULL;
}

// The flag loop: shared flags and mesh axes only when a is not NULL.
static const char* parse_flags(int argc, char** argv, TrainArgs* a, const ArgSpec* extra,
                               int n_extra, unsigned axes, char* msg, size_t msg_len) {
    for (int i = 1; i < argc; i++) {
        const char* flag = argv[i];
        if (!strcmp(flag, "--help") || !strcmp(flag, "-h")) return "help";
        if (strncmp(flag, "--", 2) != 0) {
            snprintf(msg, msg_len, "unexpected argument '%s': flags start with -- (see --help)", flag);
            return msg;
        }
        const char* name = flag + 2;
        ArgType type = ARG_STRING;
        void* dest = NULL;
        // mesh axes
        for (int ax = 0; a && ax < NUM_AXES && !dest; ax++) {
            if (strcmp(name, mesh_axis_name(ax)) != 0) continue;
            if (!(axes & (1u << ax))) {
                snprintf(msg, msg_len, "this chapter has no %s axis: drop %s (see --help)", name, flag);
                return msg;
            }
            dest = &a->mesh[ax];
            type = ARG_INT;
        }
        // shared flags
        for (int k = 0; a && k < NUM_SHARED && !dest; k++) {
            if (strcmp(name, shared_flags[k].name) != 0) continue;
            dest = shared_dest(a, name);
            type = shared_flags[k].type;
        }
        // the chapter's flags
        for (int k = 0; k < n_extra && !dest; k++) {
            if (strcmp(name, extra[k].name) != 0) continue;
            dest = extra[k].dest;
            type = extra[k].type;
        }
        if (!dest) {
            snprintf(msg, msg_len, "unknown flag %s (see --help for the flags of this %s)", flag, a ? "chapter" : "program");
            return msg;
        }
        if (type == ARG_FLAG) {
            *(int*)dest = 1;
            continue;
        }
        if (i + 1 >= argc) {
            snprintf(msg, msg_len, "flag %s needs a value (see --help)", flag);
            return msg;
        }
        const char* value = argv[++i];
        // "--save --tf32" would write the model to a file named --tf32 and
        // never set --tf32: a value that looks like a flag is the flag
        if (!strncmp(value, "--", 2)) {
            snprintf(msg, msg_len, "flag %s needs a value, got the flag %s (a file of that name: ./%s)", flag, value, value);
            return msg;
        }
        int parsed = parse_value(value, type, dest);
        if (parsed == -1) {
            snprintf(msg, msg_len, "flag %s: %s is too small for a float (it would be 0; the smallest positive float is about 1.4e-45)",
                     flag, value);
            return msg;
        }
        if (parsed == -2) {
            snprintf(msg, msg_len, "flag %s: %s is out of range for %s", flag, value,
                     type == ARG_INT ? "an integer (-2147483647 to 2147483647)" : "a float (at most about 3.4e38 in size)");
            return msg;
        }
        if (!parsed) {
            snprintf(msg, msg_len, "flag %s needs %s, got '%s'", flag,
                     type == ARG_INT ? "an integer" : "a number", value);
            return msg;
        }
        if (type == ARG_INPUT && a) a->input_flag = flag, a->input = value;  // train_setup checks it against the outputs
        if ((type == ARG_STRING || type == ARG_INPUT) && strlen(value) > ARGS_MAX_STRING) {
            snprintf(msg, msg_len, "flag %s: its value is %zu characters long, more than the %d a path may have here (the "
                     "files a run makes under it need the rest of the system's 4096): use a shorter path", flag,
                     strlen(value), ARGS_MAX_STRING);
            return msg;
        }
        // a checkpoint directory's trailing '/'s go, in place ("x/" saves
        // x/step-N, not x//step-N; "/" stays "/")
        if (a && (dest == (void*)&a->ckpt_dir || dest == (void*)&a->resume || dest == (void*)&a->ckpt_local))
            for (size_t n = strlen(argv[i]); n > 1 && argv[i][n - 1] == '/'; n--) argv[i][n - 1] = '\0';
    }
    return NULL;
}

void args_note_unused(int argc, char** argv, const char* name, int unused, const char* why) {
    if (!unused) return;
    // exact tokens: args_parse refuses a value that starts with "--"
    for (int i = 1; i < argc; i++)
        if (!strncmp(argv[i], "--", 2) && !strcmp(argv[i] + 2, name)) {
            print0("note: --%s does nothing here: %s\n", name, why);
            return;
        }
}

const char* args_parse_only(int argc, char** argv, const ArgSpec* flags, int n_flags, char* msg,
                            size_t msg_len) {
    return parse_flags(argc, argv, NULL, flags, n_flags, 0, msg, msg_len);
}

const char* args_parse(int argc, char** argv, TrainArgs* a, const ArgSpec* extra, int n_extra,
                       unsigned axes, char* msg, size_t msg_len) {
    set_defaults(a);
    recompute_arg = NULL;
    redundancy_arg = NULL;
    const char* bad = parse_flags(argc, argv, a, extra, n_extra, axes, msg, msg_len);
    if (bad) return bad;
    a->recompute = RECOMPUTE_NONE;
    if (recompute_arg) {
        int found = 0;
        for (int m = 0; m < NUM_RECOMPUTE_MODES; m++)
            if (!strcmp(recompute_arg, recompute_name((RecomputeMode)m))) a->recompute = m, found = 1;
        if (!found) {
            snprintf(msg, msg_len, "--recompute %s is not one of none, selective, full", recompute_arg);
            return msg;
        }
    }
    a->redundancy = 0;
    if (redundancy_arg) {
        int found = 0;
        for (int m = 0; m < 3; m++)
            if (!strcmp(redundancy_arg, redundancy_names[m])) a->redundancy = m, found = 1;
        if (!found) {
            snprintf(msg, msg_len, "--ckpt-redundancy %s is not one of none, partner, xor", redundancy_arg);
            return msg;
        }
    }
    // values that can never work, whatever the model
    bad = NULL;
    if (a->steps < 0) bad = "--steps must be >= 0";
    else if (a->batch != ARG_NOT_GIVEN && a->batch <= 0) bad = "--batch must be positive (leave it out for the model's default)";
    else if (a->seq != ARG_NOT_GIVEN && a->seq <= 0) bad = "--seq must be positive (leave it out for the model's default)";
    else if (!(a->lr > 0.0f)) bad = "--lr must be positive";
    else if (a->wd < 0.0f) bad = "--wd must be >= 0";
    else if (a->clip < 0.0f) bad = "--clip must be >= 0 (0 turns clipping off)";
    else if (a->sample < 0 || a->sample > ARGS_MAX_SAMPLE)
        bad = "--sample must be between 0 and 100000 (characters generated one forward pass each)";
    else if (a->save_every < 0) bad = "--save-every must be >= 0";
    else if (a->keep != ARG_NOT_GIVEN && a->keep < 0) bad = "--keep must be >= 0 (0 keeps every checkpoint)";
    else if (a->keep != ARG_NOT_GIVEN && !a->ckpt_dir && !a->ckpt_local)
        bad = "--keep needs --ckpt-dir or --ckpt-local DIR (it prunes their checkpoints)";
    else if ((a->save_every > 0 || a->async_save) && !a->ckpt_dir)
        bad = "--save-every and --async-save need --ckpt-dir DIR (where the checkpoints go)";
    else if (a->local_every < 0) bad = "--local-every must be >= 0";
    else if (a->local_every > 0 && !a->ckpt_local)
        bad = "--local-every needs --ckpt-local DIR (where the level-1 checkpoints go)";
    else if (a->ranks_per_node < 0) bad = "--ranks-per-node must be >= 0 (0: the ranks that share memory are a node)";
    else if ((a->ranks_per_node > 0 || a->redundancy) && !a->ckpt_local)
        bad = "--ranks-per-node and --ckpt-redundancy need --ckpt-local DIR (they describe its level-1 copies)";
    else if (a->incremental < 0) bad = "--incremental must be >= 0 (0 and 1: every save full)";
    else if (a->incremental > 1 && !a->ckpt_dir)
        bad = "--incremental needs --ckpt-dir DIR (its deltas are level-3 saves)";
    else if (a->val_every < 0) bad = "--val-every must be >= 0";
    else if (a->val_batches < 1 || a->val_batches > ARGS_MAX_VAL_BATCHES)
        bad = "--val-batches must be between 1 and 100000 (each is a forward pass over a batch)";
    else if (a->threads < 0 || a->threads > ARGS_MAX_THREADS) bad = "--threads must be between 0 (cores / ranks) and 1024";
    // a positive peak below 0.1 GFLOP/s is no machine's, and printed as 0.0
    else if (a->peak_gflops < 0 || (a->peak_gflops > 0 && a->peak_gflops < 0.1f))
        bad = "--peak-gflops must be 0 (measure it) or at least 0.1 GFLOP/s";
    else if (!(a->timeout == 0 || (a->timeout >= WATCHDOG_MIN_SECONDS && a->timeout <= 1e6)))
        bad = "--timeout must be 0 (no watchdog) or a number of seconds from 1 to 1000000 (shorter, a collective still running looks like a deadlock)";
    for (int ax = 0; ax < NUM_AXES && !bad; ax++)
        if (a->mesh[ax] < 1) bad = "mesh axis sizes (--dp, --tp, ...) must be >= 1";
    if (bad) {
        snprintf(msg, msg_len, "%s", bad);
        return msg;
    }
    if (a->keep == ARG_NOT_GIVEN) a->keep = 3;
    if (a->batch == ARG_NOT_GIVEN) a->batch = 0;
    if (a->seq == ARG_NOT_GIVEN) a->seq = 0;
    return NULL;
}

static void print_flag(const char* name, ArgType type, const char* help) {
    const char* v = type == ARG_INT ? "N" : type == ARG_FLOAT ? "X" : type == ARG_FLAG ? "" : "S";
    char left[64];
    snprintf(left, sizeof(left), "--%s %s", name, v);
    printf("  %-22s %s\n", left, help);
}

void args_usage(const char* program, const char* summary, const ArgSpec* extra, int n_extra,
                unsigned axes) {
    // a program that started MPI runs under mpirun; a tool that did not (the planner) on its own
    int mpi = 0;
    MPI_Initialized(&mpi);
    printf("usage: %s%s [flags]\n%s\n", mpi ? "mpirun -np N " : "", program, summary ? summary : "");
    if (axes != ARGS_NO_SHARED) {
        printf("\nflags:\n");
        for (int k = 0; k < NUM_SHARED; k++)
            print_flag(shared_flags[k].name, shared_flags[k].type, shared_flags[k].help);
    }
    if (axes && axes != ARGS_NO_SHARED) {
        printf("\nmesh (the product of the sizes must equal -np):\n");
        for (int ax = 0; ax < NUM_AXES; ax++) {
            if (!(axes & (1u << ax))) continue;
            char help[64];
            snprintf(help, sizeof(help), "size of the %s axis  [1]", mesh_axis_name(ax));
            print_flag(mesh_axis_name(ax), ARG_INT, help);
        }
    }
    if (n_extra) {
        printf("\n%s:\n", axes == ARGS_NO_SHARED ? "flags" : "this chapter");  // a tool (chapter 1 too) has no others
        for (int k = 0; k < n_extra; k++) print_flag(extra[k].name, extra[k].type, extra[k].help);
    }
    fflush(stdout);
}

int args_int_in(const char* flag, const char* text, int lo, int hi) {
    char* end = NULL;
    long v = strtol(text ? text : "", &end, 10);
    if (!text || !*text || *end || v < lo || v > hi) {
        fprintf(stderr, "error: %s takes an integer from %d to %d, got '%s'\n", flag, lo, hi, text ? text : "");
        exit(1);
    }
    return (int)v;
}
