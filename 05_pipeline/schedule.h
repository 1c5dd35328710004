// schedule.h: pipeline schedules as data.
//
// A schedule is, for every pipeline rank, the list of actions it runs in one
// training step, in order:
//   F(mb, chunk)  forward of microbatch mb through the rank's chunk
//   B(mb, chunk)  backward: with a split backward (zb) only the input
//                 gradient, which the stage before waits for; else the whole
//                 backward (input and weight gradients)
//   W(mb, chunk)  the weight gradients of a split backward, deferred
// A rank holds v chunks (virtual stages); chunk c of rank r is virtual stage
// k = c * pp + r of S = pp * v, so the model runs ranks 0, 1, ..., pp-1, 0,
// 1, ... (Megatron's interleaving). With v = 1, chunk 0 is the whole stage.
//
// One small builder per schedule fills the lists; the validator simulates
// them (without training) and the executor in main.c runs any list that
// passes. A student writes a new schedule as one more builder.
#ifndef SCHEDULE_H
#define SCHEDULE_H

#include <stddef.h>

typedef enum { ACT_F, ACT_B, ACT_W } ActionType;

typedef struct {
    ActionType type;
    int mb, chunk;
} Action;

// SCHED_FILE: lists read from a file (schedule_read), not built
typedef enum { SCHED_GPIPE, SCHED_1F1B, SCHED_INTERLEAVED, SCHED_ZB, NUM_SCHEDULES, SCHED_FILE = NUM_SCHEDULES } ScheduleKind;

typedef struct {
    ScheduleKind kind;
    int pp, m, v;        // ranks, microbatches per step, chunks per rank
    int split_backward;  // 1: B is the input half and W the weight half (zb)
    int* n;              // (pp) actions of each rank
    Action** list;       // (pp) each rank's actions, in order
} Schedule;

const char* schedule_name(ScheduleKind k);  // "gpipe", "1f1b", "interleaved", "zb", "file"
// The kind named s; returns -1 if none.
int schedule_parse(const char* s);
// NULL when s names a schedule, else its refusal in msg (a run with one
// stage refuses a name it would not use too: the capstone's)
const char* schedule_name_problem(const char* s, char* msg, size_t len);

// Builds the lists for pp ranks, m microbatches and v chunks per rank (v > 1
// only for interleaved). Returns NULL, or a message when (pp, m, v) does not
// suit the schedule; the lists are then not built.
const char* schedule_build(Schedule* s, ScheduleKind kind, int pp, int m, int v, char* msg, size_t len);
// Reads the lists of pp ranks from a text file (--schedule-file), a schedule
// of your own without writing a builder: one line per rank,
//     rank 0: F0 F1 B0 B1
//     rank 1: F0 B0 F1 B1
// F3.1 is microbatch 3 of chunk 1 (chunk 0 when left out); a W anywhere
// makes the backward split (B the input half, W the weight half); '#'
// starts a comment. m and v are the largest microbatch and chunk plus one.
// Returns NULL, or a message naming the file, line and problem; the lists
// are then not built. The validator still has to accept the lists.
const char* schedule_read(Schedule* s, const char* path, int pp, char* msg, size_t len);
void schedule_free(Schedule* s);

// What a simulation of the lists finds, with F, W and the input half of B
// taking one time unit each and a whole B two (the zero-bubble paper's
// model, where F = B = W).
typedef struct {
    int makespan;         // time units from the first action to the last
    int busy;             // time units of work summed over the ranks
    int peak_in_flight[64];  // per rank (pp <= 64): microbatch-chunks whose
                             // activations are held at once (from F to the
                             // last backward action of that microbatch-chunk)
    double bubble;        // 1 - busy / (pp * makespan)
} ScheduleSim;

// Checks every list: each (mb, chunk) of the rank has exactly one F, one B
// and (split backward) one W, in that order, and nothing else; then runs the
// lists against each other with blocking receives and non-blocking sends,
// as the executor does: F of virtual stage k > 0 waits for F of k - 1 (its
// activation), B of k < S - 1 waits for B of k + 1 (its gradient). A list
// that stops with every rank waiting is a deadlock. Every message sent is
// received exactly once. Returns NULL, or a message naming the first
// problem; fills sim (if not NULL) when valid.
const char* schedule_validate(const Schedule* s, ScheduleSim* sim, char* msg, size_t len);

// The closed-form bubble fraction of the schedule with F = B = W:
// (pp-1)/(m+pp-1) for gpipe and 1f1b, (pp-1)/(v*m+pp-1) interleaved,
// (pp-1)/(3m+pp-1) for zb (ZB-H1: the bubble shrinks from (pp-1)(F+B+W) to
// (pp-1)(F+B-W)).
double schedule_bubble_formula(ScheduleKind kind, int pp, int m, int v);

// Prints the ASCII timeline of the simulation to stdout: one row per rank,
// one 4-character cell (5 with chunks) per time unit ("F3" forward of microbatch 3, "B3",
// "W3", ".2" suffix for chunk 2 when v > 1, "." idle).
void schedule_print(const Schedule* s);

// ---------------------------------------------------------------- the layouts a run refuses
#define PIPE_MAX_CHUNKS 64  // virtual stages a run may have (pp x virtual)

// A pipeline's layout as a run asks for it. Chapter 5, the capstone and the
// planner check it with one function, so they refuse the same layouts with
// the same line.
typedef struct {
    const char* schedule;  // --schedule's name (NULL: not given, 1f1b)
    int from_file;         // 1: --schedule-file's lists run instead (its own m and v, any v)
    int pp, m, v;          // ranks, microbatches per step of a share, chunks per rank
    int layers;            // the model's L
    int batch, share;      // the global batch, and the sequences of one dp rank's share
    int equal_stages;      // 1: every stage the same layers, even at v = 1 (the capstone)
    int m_given;           // 1: m is --microbatches (0: pp's default, or the file's); the lines name what was given
} PipeLayout;

// NULL when the pipeline can run the layout, else the message (in msg) that
// rank 0 prints. It refuses, in this order: a schedule that is not one; m < 1
// or m > share; v < 1; v > 1 without interleaving (or a file) or on pp = 1;
// more than PIPE_MAX_CHUNKS stages (bounded before pp x v is formed); more
// stages than L layers (a stage without layers); unequal chunks when v > 1,
// and with equal_stages unequal stages. The batch over dp x m is
// common/train.c's train_mesh_problem, which every chapter calls after it.
const char* pipe_layout_problem(const PipeLayout* l, char* msg, size_t len);

#endif
