// schedule.c: the pipeline schedules as lists of actions, their validator
// and their ASCII timeline. See schedule.h.
#include "schedule.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "errors.h"
#include "exercise.h"  // exercise_not_done, in a homework tree
#include "memory.h"
#include "paths.h"

static const char* names[NUM_SCHEDULES + 1] = {"gpipe", "1f1b", "interleaved", "zb", "file"};

const char* schedule_name(ScheduleKind k) { return names[k]; }

int schedule_parse(const char* s) {
    for (int k = 0; k < NUM_SCHEDULES; k++)
        if (!strcmp(s, names[k])) return k;
    return -1;
}

// ---------------------------------------------------------------- builders
// Each builder appends one rank's actions with push(); the lists are sized
// for the most any schedule needs (3 actions per microbatch-chunk).

static void push(Schedule* s, int r, ActionType t, int mb, int chunk) {
    s->list[r][s->n[r]++] = (Action){t, mb, chunk};
}

// GPipe: every forward, then every backward. Stage r holds all m
// microbatches' activations at the turn.
static void build_gpipe(Schedule* s, int r) {
    for (int i = 0; i < s->m; i++) push(s, r, ACT_F, i, 0);
    for (int i = 0; i < s->m; i++) push(s, r, ACT_B, i, 0);
}

// 1F1B (PipeDream-Flush): a warm-up of pp-r-1 forwards (enough to fill the
// stages after this one), then one forward and one backward in turn, then a
// cool-down of the backwards left. Stage r never holds more than pp-r
// microbatches: each backward frees one before the next forward takes one.
// ZB-H1 is the same with the backward split: the input half (B) runs where
// 1F1B's backward was, and the weight half (W) of stage r trails its B by r
// microbatches, so the later stages, which would idle at the end of 1F1B
// waiting for the gradient to reach stage 0, spend that time on their
// deferred W's. Stage r then holds at most pp microbatches (pp-r + r).
static void build_1f1b(Schedule* s, int r, int split) {
    // EXERCISE 2: the 1F1B list of rank r (warm-up of pp - r - 1 forwards, one forward one backward, cool-down); with split, a W after each B once r of them wait, and the rest at the end
    int m = s->m, warmup = s->pp - r - 1 < m ? s->pp - r - 1 : m, next_f = 0, next_w = 0;
    for (; next_f < warmup; next_f++) push(s, r, ACT_F, next_f, 0);
    for (int i = 0; i < m; i++) {
        if (next_f < m) push(s, r, ACT_F, next_f++, 0);
        push(s, r, ACT_B, i, 0);
        // at most r weight halves wait
        if (split && i + 1 - next_w > r) push(s, r, ACT_W, next_w++, 0);
    }
    while (split && next_w < m) push(s, r, ACT_W, next_w++, 0);
    // END EXERCISE 2
}

// Interleaved 1F1B (Megatron-LM): each rank holds v chunks, and the
// microbatches go through them in groups of pp: forward of chunk 0 for
// microbatches g..g+pp-1, then chunk 1 for the same, ...; backward in the
// reverse chunk order. The warm-up is longer, (pp-r-1)*2 + (v-1)*pp
// forwards (all of them when m == pp), then 1F1B over the (mb, chunk) pairs.
// Each stage's work comes in v times smaller pieces, so the fill and drain
// take 1/v as long: the bubble shrinks by v, for v times as many messages.
static void order_of(const Schedule* s, int idx, int backward, int* mb, int* chunk) {
    int pp = s->pp, v = s->v, g0 = idx / (pp * v) * pp;
    int size = s->m - g0 < pp ? s->m - g0 : pp;  // the last group may be short
    int within = idx - g0 * v;
    int c = within / size;
    *chunk = backward ? v - 1 - c : c;
    *mb = g0 + within % size;
}

static void build_interleaved(Schedule* s, int r) {
    int total = s->m * s->v;
    int warmup = s->m == s->pp ? total : (s->pp - r - 1) * 2 + (s->v - 1) * s->pp;
    if (warmup > total) warmup = total;
    int mb, c, f = 0;
    for (; f < warmup; f++) {
        order_of(s, f, 0, &mb, &c);
        push(s, r, ACT_F, mb, c);
    }
    for (int b = 0; b < total; b++) {
        if (f < total) {
            order_of(s, f++, 0, &mb, &c);
            push(s, r, ACT_F, mb, c);
        }
        order_of(s, b, 1, &mb, &c);
        push(s, r, ACT_B, mb, c);
    }
}

const char* schedule_build(Schedule* s, ScheduleKind kind, int pp, int m, int v, char* msg, size_t len) {
    memset(s, 0, sizeof(*s));
    if (pp < 1 || pp > 64) snprintf(msg, len, "pp=%d: the schedules take 1 to 64 stages", pp);
    else if (m < 1) snprintf(msg, len, "--microbatches must be >= 1");
    else if (v < 1) snprintf(msg, len, "--virtual must be >= 1");
    else if (v > 1 && kind != SCHED_INTERLEAVED)
        snprintf(msg, len, "--virtual %d needs --schedule interleaved (%s runs one chunk per rank)", v, names[kind]);
    else if (kind == SCHED_INTERLEAVED && m > pp && m % pp != 0)
        snprintf(msg, len, "interleaved runs the microbatches in groups of pp=%d: use --microbatches %d or fewer, or a multiple of %d",
                 pp, pp, pp);
    else msg = NULL;
    if (msg) return msg;
    s->kind = kind;
    s->pp = pp;
    s->m = m;
    s->v = v;
    s->split_backward = kind == SCHED_ZB;
    s->n = xcalloc((size_t)pp, sizeof(int));
    s->list = xcalloc((size_t)pp, sizeof(Action*));
    for (int r = 0; r < pp; r++) {
        s->list[r] = xcalloc((size_t)3 * m * v, sizeof(Action));
        switch (kind) {
            case SCHED_GPIPE: build_gpipe(s, r); break;
            case SCHED_1F1B: build_1f1b(s, r, 0); break;
            case SCHED_INTERLEAVED: build_interleaved(s, r); break;
            case SCHED_ZB: build_1f1b(s, r, 1); break;
            default: break;
        }
    }
    return NULL;
}

// ---------------------------------------------------------------- from a file

// "F3" or "F3.1" (microbatch 3, chunk 1); 0 if tok is not one
static int parse_action(const char* tok, Action* a) {
    const char* types = "FBW";
    if (!tok[0] || !strchr(types, tok[0])) return 0;
    char* end;
    a->type = (ActionType)(strchr(types, tok[0]) - types);
    a->mb = (int)strtol(tok + 1, &end, 10);
    a->chunk = 0;
    if (end == tok + 1 || a->mb < 0 || a->mb > 1 << 20) return 0;
    if (*end == '.') {
        const char* c = end + 1;
        a->chunk = (int)strtol(c, &end, 10);
        if (end == c || a->chunk < 0 || a->chunk >= 64) return 0;
    }
    return *end == 0;
}

const char* schedule_read(Schedule* s, const char* path, int pp, char* msg, size_t len) {
    memset(s, 0, sizeof(*s));
    if (paths_check_regular("--schedule-file", path, "give a text file with one 'rank R: ACTIONS' line per rank", msg, len))
        return msg;
    FILE* f = fopen(path, "r");
    if (!f) {
        snprintf(msg, len, "cannot read --schedule-file '%s': %s", path, strerror(errno));
        return msg;
    }
    s->kind = SCHED_FILE;
    s->pp = pp;
    s->n = xcalloc((size_t)pp, sizeof(int));
    s->list = xcalloc((size_t)pp, sizeof(Action*));
    int* cap = xcalloc((size_t)pp, sizeof(int));
    int* seen = xcalloc((size_t)pp, sizeof(int));
    char* line = NULL;
    size_t line_cap = 0;
    ssize_t got;
    const char* bad = NULL;
    for (int ln = 1; !bad && (got = getline(&line, &line_cap, f)) >= 0; ln++) {
        char* hash = memchr(line, '#', (size_t)got);
        size_t col = paths_not_text(line, hash ? (size_t)(hash - line) : (size_t)got);
        if (col) {  // binary, not a schedule: say where, quote nothing
            snprintf(msg, len, "--schedule-file %s line %d: byte %zu is not text: want 'rank R: ACTIONS' lines", path, ln, col);
            bad = msg;
            break;
        }
        if (hash) *hash = 0;
        char* tok = strtok(line, " \t\r\n");
        if (!tok) continue;  // blank or comment
        int r = -1, used = 0;
        char* rest = strtok(NULL, " \t\r\n");
        if (strcmp(tok, "rank") || !rest || sscanf(rest, "%d:%n", &r, &used) != 1 || rest[used] || r < 0 ||
            r >= pp || seen[r]) {
            snprintf(msg, len, "--schedule-file %s line %d: want 'rank R: ACTIONS' with R a new rank of 0..%d", path, ln,
                     pp - 1);
            bad = msg;
            break;
        }
        seen[r] = 1;
        while ((tok = strtok(NULL, " \t\r\n")) && !bad) {
            Action a;
            if (!parse_action(tok, &a)) {
                snprintf(msg, len, "--schedule-file %s line %d: '%s' is not an action (F3, B3, W3, F3.1 for chunk 1)",
                         path, ln, tok);
                bad = msg;
                break;
            }
            if (a.type == ACT_W) s->split_backward = 1;
            if (a.mb + 1 > s->m) s->m = a.mb + 1;
            if (a.chunk + 1 > s->v) s->v = a.chunk + 1;
            if (s->n[r] == cap[r]) {
                cap[r] = cap[r] ? 2 * cap[r] : 16;
                Action* grown = realloc(s->list[r], (size_t)cap[r] * sizeof(Action));
                if (!grown) FATAL("out of host memory for a schedule");
                s->list[r] = grown;
            }
            s->list[r][s->n[r]++] = a;
        }
    }
    free(line);
    fclose(f);
    for (int r = 0; r < pp && !bad; r++)
        if (!seen[r]) {
            snprintf(msg, len, "--schedule-file %s has no line for rank %d (it needs one per rank of pp=%d)", path, r, pp);
            bad = msg;
        } else if (s->n[r] == 0) {  // else the microbatch count would be 0, and blamed on --microbatches
            snprintf(msg, len, "--schedule-file %s: rank %d's line has no action: every rank runs an F and a B of each "
                     "microbatch (F0 B0 ...)", path, r);
            bad = msg;
        }
    free(cap);
    free(seen);
    if (bad) schedule_free(s);
    return bad;
}

void schedule_free(Schedule* s) {
    for (int r = 0; s->list && r < s->pp; r++) free(s->list[r]);
    free(s->list);
    free(s->n);
    memset(s, 0, sizeof(*s));
}

// ---------------------------------------------------------------- validation

static int duration(const Schedule* s, ActionType t) {
    return t == ACT_B && !s->split_backward ? 2 : 1;
}

static const char* type_name(ActionType t) { return t == ACT_F ? "F" : t == ACT_B ? "B" : "W"; }

// Runs the lists against each other. start (if not NULL) gets each action's
// start time: start[r][i].
static const char* simulate(const Schedule* s, ScheduleSim* sim, int** start, char* msg, size_t len) {
    int pp = s->pp, m = s->m, v = s->v, S = pp * v;
    // local checks: one F, one B, (split) one W per (mb, chunk), in order
    int* seen = xmalloc((size_t)m * v * sizeof(int));
    const char* bad = NULL;
    for (int r = 0; r < pp && !bad; r++) {
        memset(seen, 0, (size_t)m * v * sizeof(int));
        for (int i = 0; i < s->n[r] && !bad; i++) {
            Action a = s->list[r][i];
            if (a.mb < 0 || a.mb >= m || a.chunk < 0 || a.chunk >= v) {
                snprintf(msg, len, "rank %d action %d: %s(%d, chunk %d) is out of range", r, i, type_name(a.type),
                         a.mb, a.chunk);
                bad = msg;
                break;
            }
            int* st = &seen[a.mb * v + a.chunk];
            int want = a.type == ACT_F ? 0 : a.type == ACT_B ? 1 : 2;
            if (a.type == ACT_W && !s->split_backward) {
                snprintf(msg, len, "rank %d action %d: W(%d) in a schedule whose backward is whole", r, i, a.mb);
                bad = msg;
            } else if (*st != want) {
                snprintf(msg, len, "rank %d action %d: %s(%d, chunk %d) %s", r, i, type_name(a.type), a.mb, a.chunk,
                         *st > want ? "comes twice" : a.type == ACT_B ? "comes before its F" : "comes before its B");
                bad = msg;
            }
            (*st)++;
        }
        for (int k = 0; k < m * v && !bad; k++)
            if (seen[k] != (s->split_backward ? 3 : 2)) {
                snprintf(msg, len, "rank %d: microbatch %d chunk %d is missing its %s", r, k / v, k % v,
                         seen[k] == 0 ? "F" : seen[k] == 1 ? "B" : "W");
                bad = msg;
            }
    }
    free(seen);
    if (bad) return bad;
    // the run: fdone[k*m + mb] = end time of F(mb) at virtual stage k, -1 not yet
    int* fdone = xmalloc((size_t)S * m * sizeof(int));
    int* bdone = xmalloc((size_t)S * m * sizeof(int));
    for (int i = 0; i < S * m; i++) fdone[i] = bdone[i] = -1;
    int *pc = xcalloc((size_t)pp, sizeof(int)), *free_at = xcalloc((size_t)pp, sizeof(int));
    int remaining = 0, makespan = 0, busy = 0;
    for (int r = 0; r < pp; r++) remaining += s->n[r];
    while (remaining > 0) {
        int progressed = 0;
        for (int r = 0; r < pp; r++) {
            while (pc[r] < s->n[r]) {
                Action a = s->list[r][pc[r]];
                int k = a.chunk * pp + r, ready = 0;
                // a blocking receive: the action starts when the message is there
                if (a.type == ACT_F && k > 0) {
                    if (fdone[(k - 1) * m + a.mb] < 0) break;
                    ready = fdone[(k - 1) * m + a.mb];
                } else if (a.type == ACT_B && k < S - 1) {
                    if (bdone[(k + 1) * m + a.mb] < 0) break;
                    ready = bdone[(k + 1) * m + a.mb];
                }
                int t0 = free_at[r] > ready ? free_at[r] : ready, d = duration(s, a.type);
                if (start) start[r][pc[r]] = t0;
                free_at[r] = t0 + d;
                busy += d;
                if (t0 + d > makespan) makespan = t0 + d;
                // a non-blocking send: the message is there when the action ends
                if (a.type == ACT_F) fdone[k * m + a.mb] = t0 + d;
                if (a.type == ACT_B) bdone[k * m + a.mb] = t0 + d;
                pc[r]++;
                remaining--;
                progressed = 1;
            }
        }
        if (!progressed) {
            int n = snprintf(msg, len, "deadlock: every rank waits:");
            for (int r = 0; r < pp && n < (int)len; r++) {
                if (pc[r] >= s->n[r]) continue;
                Action a = s->list[r][pc[r]];
                n += snprintf(msg + n, len - (size_t)n, " rank %d at %s(%d, chunk %d) for the %s;", r,
                              type_name(a.type), a.mb, a.chunk, a.type == ACT_F ? "activation" : "gradient");
            }
            bad = msg;
            break;
        }
    }
    if (!bad && sim) {
        memset(sim, 0, sizeof(*sim));
        sim->makespan = makespan;
        sim->busy = busy;
        sim->bubble = makespan > 0 ? 1.0 - (double)busy / ((double)pp * makespan) : 0.0;
        // in flight: from F to the last backward action of that (mb, chunk)
        for (int r = 0; r < pp; r++) {
            int now = 0, peak = 0;
            for (int i = 0; i < s->n[r]; i++) {
                ActionType t = s->list[r][i].type;
                if (t == ACT_F) now++;
                else if (t == (s->split_backward ? ACT_W : ACT_B)) now--;
                if (now > peak) peak = now;
            }
            sim->peak_in_flight[r] = peak;
        }
    }
    free(fdone);
    free(bdone);
    free(pc);
    free(free_at);
    return bad;
}

const char* schedule_validate(const Schedule* s, ScheduleSim* sim, char* msg, size_t len) {
    // every message is received exactly once: a stage k < S-1 sends one
    // activation per microbatch, received by the F of stage k+1 (which
    // exists once per microbatch, checked above), and likewise each
    // gradient; the run then checks that every receive finds its send.
    return simulate(s, sim, NULL, msg, len);
}

double schedule_bubble_formula(ScheduleKind kind, int pp, int m, int v) {
    double p1 = pp - 1;
    switch (kind) {
        case SCHED_INTERLEAVED: return p1 / ((double)v * m + p1);
        // a file's lists: the formula of its closest kind
        case SCHED_FILE: return v > 1 ? p1 / ((double)v * m + p1) : p1 / ((double)m + p1);
        case SCHED_ZB: return p1 / (3.0 * m + p1);
        default: return p1 / ((double)m + p1);
    }
}

void schedule_print(const Schedule* s) {
    char msg[512];
    ScheduleSim sim;
    int** start = xcalloc((size_t)s->pp, sizeof(int*));
    for (int r = 0; r < s->pp; r++) start[r] = xcalloc((size_t)s->n[r] + 1, sizeof(int));
    const char* bad = simulate(s, &sim, start, msg, sizeof(msg));
    if (bad) {
        printf("schedule %s: %s\n", names[s->kind], bad);
    } else {
        printf("schedule %s, pp=%d, %d microbatch%s%s", names[s->kind], s->pp, s->m, s->m == 1 ? "" : "es",
               s->v > 1 ? "" : "\n");
        if (s->v > 1) printf(", %d chunks per rank (F3.1: microbatch 3, chunk 1)\n", s->v);
        printf("one cell = one time unit, F = %s = 1%s\n", s->split_backward ? "B = W" : "B/2",
               s->split_backward ? " (B: input gradient, W: weight gradient)" : " (B: whole backward, 2 units)");
        int w = s->v > 1 ? 5 : 4;  // cell width: "F3" or "F3.1"
        char* row = xmalloc((size_t)sim.makespan * w + 1);
        for (int r = 0; r < s->pp; r++) {
            memset(row, ' ', (size_t)sim.makespan * w);
            for (int t = 0; t < sim.makespan; t++) row[w * t] = '.';
            for (int i = 0; i < s->n[r]; i++) {
                Action a = s->list[r][i];
                char cell[16];
                if (s->v > 1) snprintf(cell, sizeof(cell), "%s%d.%d", type_name(a.type), a.mb, a.chunk);
                else snprintf(cell, sizeof(cell), "%s%d", type_name(a.type), a.mb);
                for (int d = 0; d < duration(s, a.type); d++) {
                    char* at = row + w * (start[r][i] + d);
                    size_t n = strlen(cell) < (size_t)w - 1 ? strlen(cell) : (size_t)w - 1;
                    memcpy(at, cell, n);
                    for (size_t j = n; j < (size_t)w; j++) at[j] = ' ';
                }
            }
            row[sim.makespan * w] = 0;
            // trailing blanks off
            for (int e = sim.makespan * w - 1; e >= 0 && row[e] == ' '; e--) row[e] = 0;
            printf("rank %d | %s\n", r, row);
        }
        free(row);
        printf("bubble: %.3f of %d rank x %d units idle (formula %.3f)\n", sim.bubble, s->pp, sim.makespan,
               schedule_bubble_formula(s->kind, s->pp, s->m, s->v));
        printf("peak microbatches in flight per rank:");
        for (int r = 0; r < s->pp; r++) printf(" %d", sim.peak_in_flight[r]);
        printf("\n");
    }
    for (int r = 0; r < s->pp; r++) free(start[r]);
    free(start);
    fflush(stdout);
}

// ---------------------------------------------------------------- the layouts a run refuses

const char* schedule_name_problem(const char* s, char* msg, size_t len) {
    if (schedule_parse(s) >= 0) return NULL;
    snprintf(msg, len, "--schedule %s is not one of gpipe, 1f1b, interleaved, zb", s);
    return msg;
}

// What set the layout's m and v, for a refusal to name: the flag, the
// schedule file, or (m) the default of one microbatch per stage.
static void name_m(const PipeLayout* l, char* out, size_t len) {
    if (l->from_file) snprintf(out, len, "--schedule-file's %d microbatches", l->m);
    else if (l->m_given) snprintf(out, len, "--microbatches %d", l->m);
    else snprintf(out, len, "--pp %d's default of %d microbatches (one per stage)", l->pp, l->m);
}
static void name_v(const PipeLayout* l, char* out, size_t len) {
    snprintf(out, len, l->from_file ? "--schedule-file's %d chunks a rank" : "--virtual %d", l->v);
}

const char* pipe_layout_problem(const PipeLayout* l, char* msg, size_t len) {
    char m_is[128], v_is[128];
    name_m(l, m_is, sizeof(m_is));
    name_v(l, v_is, sizeof(v_is));
    int kind = schedule_parse(l->schedule ? l->schedule : "1f1b"), pp = l->pp, m = l->m, v = l->v, L = l->layers;
    if (l->from_file && l->schedule)  // the file's lists are the whole schedule: --schedule would be dropped
        snprintf(msg, len, "--schedule %s and --schedule-file: give one (the file is the schedule)", l->schedule);
    else if (kind < 0)
        schedule_name_problem(l->schedule, msg, len);
    // a dp rank's share of the batch is the most microbatches it can cut
    else if (m < 1)
        snprintf(msg, len, "--microbatches must be positive (leave it out for pp = %d)", pp);
    else if (m > l->share)
        snprintf(msg, len, "%s: a dp rank holds %d of the batch's %d sequences, at most that many "
                 "microbatches: use %s <= %d", m_is, l->share, l->batch, l->from_file ? "a file's microbatches" : "--microbatches",
                 l->share);
    // chunks only where a schedule goes round the ranks more than once
    else if (v < 1)
        snprintf(msg, len, "--virtual must be >= 1");
    else if (v > 1 && kind != SCHED_INTERLEAVED && !l->from_file)
        snprintf(msg, len, "--virtual %d needs --schedule interleaved", v);
    else if (v > 1 && pp == 1)
        snprintf(msg, len, "--virtual %d interleaves chunks over pp ranks: use --pp 2 or more", v);
    else if (pp > PIPE_MAX_CHUNKS)
        snprintf(msg, len, "--pp %d: a pipeline has at most %d stages: use --pp <= %d", pp, PIPE_MAX_CHUNKS,
                 PIPE_MAX_CHUNKS);
    // bounded before pp x v is formed (--virtual 2147483647 overflowed it)
    else if (v > PIPE_MAX_CHUNKS / pp)
        snprintf(msg, len, "%s: pp x virtual is at most %d virtual stages: use --virtual <= %d", v_is,
                 PIPE_MAX_CHUNKS, PIPE_MAX_CHUNKS / pp);
    // the layers over the stages: every stage needs one; chunks must be equal
    else if (pp * v > L)
        snprintf(msg, len, "the model's %d layers cannot fill pp=%d x %d chunk%s = %d stages (a stage without layers): "
                 "use pp x virtual <= %d", L, pp, v, v == 1 ? "" : "s", pp * v, L);
    else if (v > 1 && L % (pp * v) != 0)
        snprintf(msg, len, "%s: the model's %d layers do not cut into pp=%d x %d equal chunks: use pp x "
                 "virtual dividing %d", v_is, L, pp, v, L);
    else if (l->equal_stages && L % pp != 0)  // common/train.c's line, which such a run prints first
        snprintf(msg, len, "the model's %d layers do not split over pp=%d ranks: use a pp that divides %d", L, pp, L);
    else
        return NULL;
    return msg;
}
