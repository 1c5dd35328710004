// test_schedule.c: chapter 5's schedules (05_pipeline/schedule.h) on a grid
// of (pp, m, v), without training: every list is valid (one F, B and, for zb,
// W per microbatch-chunk, in order; no deadlock; every message received),
// the peak microbatches in flight match the memory formulas (GPipe: m on
// every stage; 1F1B: min(pp - s, m) on stage s; ZB-H1: min(pp, m);
// interleaved: its warm-up 2(pp - s - 1) + (v - 1) pp plus one, at most m v),
// and the simulated bubble of GPipe and 1F1B is (pp-1)/(m+pp-1), ZB-H1's
// (pp-1)/(3m+pp-1) once m >= pp. Then the validator must catch broken lists.
//   build/tests/test_schedule [--show SCHEDULE PP M V]
//
// modules: 05_pipeline/schedule
// run by: tests/chapter_5.sh
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "schedule.h"
#include "test.h"

static int grid(ScheduleKind kind) {
    int cases = 0, bad = 0;
    char msg[512], first[600] = "";
    for (int pp = 1; pp <= 8; pp++)
        for (int m = 1; m <= 3 * pp; m++)
            for (int v = 1; v <= (kind == SCHED_INTERLEAVED ? 4 : 1); v++) {
                Schedule s;
                if (schedule_build(&s, kind, pp, m, v, msg, sizeof(msg))) {
                    // interleaved refuses m > pp that is not a multiple of pp
                    if (kind == SCHED_INTERLEAVED && m > pp && m % pp) continue;
                    bad++;
                    if (!first[0]) snprintf(first, sizeof(first), "pp=%d m=%d v=%d: build: %s", pp, m, v, msg);
                    continue;
                }
                cases++;
                ScheduleSim sim;
                const char* why = schedule_validate(&s, &sim, msg, sizeof(msg));
                char detail[256] = "";
                if (!why) {
                    for (int r = 0; r < pp && !detail[0]; r++) {
                        int p = sim.peak_in_flight[r], want = -1;
                        if (kind == SCHED_GPIPE) want = m;
                        if (kind == SCHED_1F1B) want = pp - r < m ? pp - r : m;
                        if (kind == SCHED_ZB) want = pp < m ? pp : m;
                        if (kind == SCHED_INTERLEAVED) {  // Megatron's warm-up, then one more F before the first B
                            int warmup = m == pp ? m * v : (pp - r - 1) * 2 + (v - 1) * pp;
                            want = warmup + 1 < m * v ? warmup + 1 : m * v;
                        }
                        if (want >= 0 && p != want)
                            snprintf(detail, sizeof(detail), "rank %d holds %d microbatches at peak, want %d", r, p, want);
                    }
                    double f = schedule_bubble_formula(kind, pp, m, v);
                    // exact: GPipe's and 1F1B's at every m, ZB-H1's once m >= pp (the paper's (pp-1)/(3m+pp-1))
                    int exact = kind == SCHED_GPIPE || kind == SCHED_1F1B || (kind == SCHED_ZB && m >= pp);
                    if (exact && fabs(sim.bubble - f) > 1e-12)
                        snprintf(detail, sizeof(detail), "simulated bubble %.4f, formula %.4f", sim.bubble, f);
                    // the split backward never makes the bubble worse than 1F1B's
                    if (kind == SCHED_ZB && sim.bubble > schedule_bubble_formula(SCHED_1F1B, pp, m, 1) + 1e-12)
                        snprintf(detail, sizeof(detail), "zb bubble %.4f above 1f1b's %.4f", sim.bubble,
                                 schedule_bubble_formula(SCHED_1F1B, pp, m, 1));
                    if (kind == SCHED_INTERLEAVED && v > 1 && m % pp == 0 && sim.bubble > f + 1e-12)
                        snprintf(detail, sizeof(detail), "interleaved bubble %.4f above the formula %.4f", sim.bubble, f);
                    why = detail[0] ? detail : NULL;
                }
                if (why) {
                    bad++;
                    if (!first[0]) snprintf(first, sizeof(first), "pp=%d m=%d v=%d: %s", pp, m, v, why);
                }
                schedule_free(&s);
            }
    check(bad == 0 && cases > 0, schedule_name(kind), "%d of %d cases wrong, first: %s", bad, cases, first);
    return bad;
}

// A list edited by hand must be refused with the given phrase.
static void broken(const char* name, ScheduleKind kind, int pp, int m, void (*edit)(Schedule*), const char* phrase) {
    Schedule s;
    char msg[512];
    schedule_build(&s, kind, pp, m, 1, msg, sizeof(msg));
    edit(&s);
    const char* why = schedule_validate(&s, NULL, msg, sizeof(msg));
    check(why && strstr(why, phrase), name, "validator said: %s", why ? why : "(valid)");
    schedule_free(&s);
}

// rank 1's first backward moved before its forward
static void swap_first_fb(Schedule* s) {
    Action t = s->list[1][0];
    s->list[1][0] = s->list[1][s->n[1] - 1];
    s->list[1][s->n[1] - 1] = t;
}
// rank 0 waits for the gradient of microbatch 1 before sending microbatch 1
// forward: GPipe's lists with rank 0's B(0) and F(1) swapped on 2 microbatches
static void deadlock_edit(Schedule* s) {
    // rank 0: F0 F1 B0 B1 -> F0 B0 F1 B1; rank 1: F0 F1 B0 B1 -> F0 F1 B1 B0,
    // so rank 1's first backward (of 1) waits for nothing but rank 0's F1
    // waits behind B0, whose gradient rank 1 sends only after B1: a cycle
    Action t = s->list[0][1];
    s->list[0][1] = s->list[0][2];
    s->list[0][2] = t;
    t = s->list[1][2];
    s->list[1][2] = s->list[1][3];
    s->list[1][3] = t;
}
static void drop_last(Schedule* s) { s->n[0]--; }
static void duplicate(Schedule* s) { s->list[0][1] = s->list[0][0]; }

int main(int argc, char** argv) {
    if (argc == 6 && !strcmp(argv[1], "--show")) {
        Schedule s;
        char msg[512];
        int k = schedule_parse(argv[2]);
        if (k < 0 || schedule_build(&s, k, atoi(argv[3]), atoi(argv[4]), atoi(argv[5]), msg, sizeof(msg))) {
            fprintf(stderr, "bad schedule\n");
            return 1;
        }
        schedule_print(&s);
        schedule_free(&s);
        return 0;
    }
    for (int k = 0; k < NUM_SCHEDULES; k++) grid(k);
    broken("validator: a backward before its forward", SCHED_1F1B, 2, 2, swap_first_fb, "before its F");
    broken("validator: a cycle of waits is a deadlock", SCHED_GPIPE, 2, 2, deadlock_edit, "deadlock");
    broken("validator: a missing weight half", SCHED_ZB, 2, 2, drop_last, "missing its W");
    broken("validator: an action twice", SCHED_GPIPE, 2, 3, duplicate, "twice");
    // the zero-bubble schedule's bubble is below 1F1B's where there is one
    Schedule a, b;
    char msg[256];
    ScheduleSim sa, sb;
    schedule_build(&a, SCHED_1F1B, 4, 8, 1, msg, sizeof(msg));
    schedule_build(&b, SCHED_ZB, 4, 8, 1, msg, sizeof(msg));
    schedule_validate(&a, &sa, msg, sizeof(msg));
    schedule_validate(&b, &sb, msg, sizeof(msg));
    check(sb.bubble < sa.bubble, "zb: pp=4, m=8 bubble below 1f1b's", "zb %.3f, 1f1b %.3f", sb.bubble, sa.bubble);
    schedule_free(&a);
    schedule_free(&b);
    schedule_build(&a, SCHED_INTERLEAVED, 4, 8, 2, msg, sizeof(msg));
    schedule_validate(&a, &sb, msg, sizeof(msg));
    check(sb.bubble < sa.bubble, "interleaved: pp=4, m=8, v=2 bubble below 1f1b's", "interleaved %.3f, 1f1b %.3f",
          sb.bubble, sa.bubble);
    schedule_free(&a);
    return test_exit_code();
}
