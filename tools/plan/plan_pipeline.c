// plan_pipeline.c: chapter 5's planner (plan.h): pipeline parallelism over
// pp, dp replicas of each stage. The schedule is the chapter's own lists
// (05_pipeline/schedule.c), and what a rank owns its own split
// (05_pipeline/pipeline.c's stage_layers and rank_pieces), so the plan
// follows any change to either.
//
// Exact: parameters, gradients, AdamW (the rank's pieces), activations (the
// slots each chunk holds at once when its list runs: a slot is taken at F
// and freed after B, or W with a split backward, then the backward scratch
// and the --recompute transient, one of each), every collective and
// message. Timing-dependent: the send buffers ("comm"). A send leaves from a
// buffer of its own, and a new buffer is made only when every earlier one is
// still in flight: how many are depends on how fast the peers take them.
// The plan gives the least (one buffer, if the rank sends) and the most:
// at each send, the earlier sends of the step whose receive need not have
// happened before it (no chain of messages from that receive back to this
// rank), found by running the lists with vector clocks.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm_stats.h"
#include "comm_groups.h"
#include "model_layout.h"
#include "pipeline.h"
#include "plan.h"
#include "schedule.h"

// What the whole plan shares: the lists, and per stage its figures.
static struct {
    Schedule sched;
    int built, m, v, S;
    int busy[64][PIPE_MAX_CHUNKS];  // per stage and chunk: slots held at once
    int sends_most[64];             // per stage: send buffers in flight at once, at most
} pl;

// The virtual stage a message of action x on stage s goes to, or -1: F of
// k < S-1 sends its output on, B of k > 0 its input gradient back.
static int sends_to(const Action* x, int s, int pp, int S) {
    int k = x->chunk * pp + s;
    if (x->type == ACT_F && k < S - 1) return k + 1;
    if (x->type == ACT_B && k > 0) return k - 1;
    return -1;
}

// The virtual stage action x on stage s receives from, or -1.
static int receives_from(const Action* x, int s, int pp, int S) {
    int k = x->chunk * pp + s;
    if (x->type == ACT_F && k > 0) return k - 1;
    if (x->type == ACT_B && k < S - 1) return k + 1;
    return -1;
}

// The lists run against each other as the executor runs them (blocking
// receives that take a peer's messages in the order it sent them, sends
// that never wait), each action stamped with a vector clock: clock[q][i][p]
// is the last action of stage p that happened before action i of stage q
// ended. Then, at each send of stage r, an earlier send is surely complete
// only if its receive happened before: the rest may be in flight.
static void sends_bound(const Schedule* s, int S) {
    int pp = s->pp, most = 0;
    for (int q = 0; q < pp; q++) most = s->n[q] > most ? s->n[q] : most;
    int* clock = calloc((size_t)pp * most * pp, sizeof(int));     // (pp, most, pp)
    int* got_at = malloc((size_t)pp * most * sizeof(int));        // the action that took each send
    int* done = calloc((size_t)pp, sizeof(int));
    if (!clock || !got_at || !done) { fprintf(stderr, "error: out of memory\n"); exit(1); }
    for (int i = 0; i < pp * most; i++) got_at[i] = -1;
#define CLOCK(q, i) (clock + ((size_t)(q) * most + (i)) * pp)
    for (int progress = 1; progress;) {
        progress = 0;
        for (int q = 0; q < pp; q++) {
            if (done[q] == s->n[q]) continue;
            const Action* x = &s->list[q][done[q]];
            int from = receives_from(x, q, pp, S), peer = from < 0 ? -1 : from % pp;
            int need = -1;  // the index in peer's list of the action that sends what x needs
            if (from >= 0) {
                for (int j = 0; j < s->n[peer] && need < 0; j++) {
                    const Action* y = &s->list[peer][j];
                    int to = sends_to(y, peer, pp, S);
                    if (to >= 0 && to % pp == q && y->mb == x->mb && to / pp == x->chunk &&
                        (y->type == ACT_F) == (x->type == ACT_F))
                        need = j;
                }
                if (need < 0 || done[peer] <= need) continue;  // not sent yet: wait
            }
            int* c = CLOCK(q, done[q]);
            if (done[q] > 0) memcpy(c, CLOCK(q, done[q] - 1), (size_t)pp * sizeof(int));
            else for (int p = 0; p < pp; p++) c[p] = -1;
            c[q] = done[q];
            if (from >= 0) {
                // take every message peer sent to q up to the one needed, in order
                for (int j = 0; j <= need; j++) {
                    int to = sends_to(&s->list[peer][j], peer, pp, S);
                    if (to < 0 || to % pp != q || got_at[peer * most + j] >= 0) continue;
                    got_at[peer * most + j] = done[q];
                    const int* sc = CLOCK(peer, j);
                    for (int p = 0; p < pp; p++) c[p] = sc[p] > c[p] ? sc[p] : c[p];
                }
            }
            done[q]++;
            progress = 1;
        }
    }
    for (int r = 0; r < pp; r++) {
        int best = 0;
        for (int i = 0; i < s->n[r]; i++) {
            int to = sends_to(&s->list[r][i], r, pp, S);
            if (to < 0) continue;
            int in_flight = 1;  // this send's own buffer
            for (int j = 0; j < i; j++) {
                int t = sends_to(&s->list[r][j], r, pp, S);
                if (t < 0) continue;
                int q = t % pp, at = got_at[r * most + j];
                if (at < 0 || CLOCK(r, i)[q] < at) in_flight++;
            }
            best = in_flight > best ? in_flight : best;
        }
        pl.sends_most[r] = best;
    }
#undef CLOCK
    free(clock);
    free(got_at);
    free(done);
}

const char* plan_check_pipeline(const PlanArgs* a, PlanInfo* info, char* msg, size_t len) {
    int pp = a->mesh[AXIS_PP], ndp = a->mesh[AXIS_DP], m = a->microbatches == ARG_NOT_GIVEN ? pp : a->microbatches;
    if (a->ranks != ndp * pp) return "--ranks: chapter 5 has the dp and pp axes only";
    // chapter 5's own rules and lines (05_pipeline/schedule.c); the batch over
    // dp x microbatches is train_mesh_problem's, after this (plan.c)
    PipeLayout layout = {a->schedule, 0, pp, m, a->virt, a->cfg.num_layers, a->B, a->B / ndp, 0,
                         a->microbatches != ARG_NOT_GIVEN};
    if (pipe_layout_problem(&layout, msg, len)) return msg;
    return plan_pipeline_lists(a, m, info, msg, len);
}

const char* plan_pipeline_lists(const PlanArgs* a, int m, PlanInfo* info, char* msg, size_t len) {
    int pp = a->mesh[AXIS_PP], v = a->virt, kind = schedule_parse(a->schedule);
    if (kind < 0) return snprintf(msg, len, "--schedule %s is not one of gpipe, 1f1b, interleaved, zb", a->schedule), msg;
    if (pl.built) schedule_free(&pl.sched);
    pl.built = 0;
    const char* bad = schedule_build(&pl.sched, (ScheduleKind)kind, pp, m, v, msg, len);
    if (bad) return bad;
    pl.built = 1;
    ScheduleSim sim;
    bad = schedule_validate(&pl.sched, &sim, msg, len);
    if (bad) return bad;
    pl.m = m, pl.v = v, pl.S = pp * v;
    // each chunk's slots held at once: taken at F, given back at the last
    // backward action of that (microbatch, chunk)
    for (int r = 0; r < pp; r++) {
        int now[PIPE_MAX_CHUNKS] = {0};
        for (int c = 0; c < v; c++) pl.busy[r][c] = 0;
        for (int i = 0; i < pl.sched.n[r]; i++) {
            Action x = pl.sched.list[r][i];
            if (x.type == ACT_F && ++now[x.chunk] > pl.busy[r][x.chunk]) pl.busy[r][x.chunk] = now[x.chunk];
            if (x.type == (pl.sched.split_backward ? ACT_W : ACT_B)) now[x.chunk]--;
        }
    }
    sends_bound(&pl.sched, pl.S);
    // the bubble of the lists with F one unit, a whole B two (the chapter's
    // "bubble_simulated"), next to the closed form
    info->bubble = sim.bubble;
    static char how[160];
    snprintf(how, sizeof(how), "the lists run with F = 1 unit, a whole B 2 (split: B = W = 1); closed form %.4f",
             schedule_bubble_formula((ScheduleKind)kind, pp, m, v));
    info->bubble_how = how;
    return NULL;
}

const Schedule* plan_pipeline_schedule(void) { return &pl.sched; }
int plan_pipeline_sends_most(int stage) { return pl.sends_most[stage]; }

double plan_pipeline_next_share(int s) {
    int pp = pl.sched.pp, next = 0, all = 0;
    for (int i = 0; pl.built && i < pl.sched.n[s]; i++) {
        int to = sends_to(&pl.sched.list[s][i], s, pp, pl.S);
        if (to < 0) continue;
        all++;
        next += to > pl.sched.list[s][i].chunk * pp + s;
    }
    return all ? (double)next / all : 0.0;
}

void plan_pipeline_messages(int pp, int s, size_t floats) {
    Comm ppc = plan_group(AXIS_PP, pp, s);
    for (int i = 0; i < pl.sched.n[s]; i++) {
        const Action* x = &pl.sched.list[s][i];
        if (receives_from(x, s, pp, pl.S) >= 0) comm_tally(&ppc, COLL_RECV, floats * sizeof(float), 0.0);
        if (sends_to(x, s, pp, pl.S) >= 0) comm_tally(&ppc, COLL_SEND, floats * sizeof(float), 1.0);
    }
}

void plan_chapter_5(const PlanArgs* a, RankPlan* p, int r) {
    const GPTConfig* g = &a->cfg;
    int coord[NUM_AXES];
    plan_coords(a, r, coord);
    int pp = a->mesh[AXIS_PP], ndp = a->mesh[AXIS_DP], s = coord[AXIS_PP], v = pl.v, S = pl.S;
    int C = g->channels, NH = g->num_heads, T = a->T, b = a->B / ndp / pl.m, split = pl.sched.split_backward;
    size_t BT = (size_t)b * T, BTC = BT * C;
    // what the rank owns: its pieces of the flat layout
    Piece pieces[PIPE_MAX_PIECES];
    int n = rank_pieces(g, pp, v, s, pieces);
    double local = (double)(pieces[n - 1].local + pieces[n - 1].count), f = sizeof(float);
    p->peak[MEM_PARAMS] = f * local;
    p->peak[MEM_GRADS] = f * local;
    p->peak[MEM_OPTIMIZER] = 2 * f * local;
    // activations: each chunk's slots (pipeline.c's slot_floats), the scratch, the transient
    double acts = (double)block_scratch_numel(b, T, C, NH) + (double)block_transient_numel(b, T, C, NH, a->recompute);
    int layers = 0;
    for (int c = 0; c < v; c++) {
        int k = c * pp + s, last = k == S - 1, count = stage_layers(g->num_layers, S, k).count;
        size_t slot = 2 * BTC + (size_t)count * block_store_numel(b, T, C, NH, a->recompute);
        if (last) slot += head_acts_numel(b, T, C, g->padded_vocab_size);
        if (split) slot += (size_t)count * block_stash_numel(b, T, C) + (last ? BTC : 0);
        slot += (k == 0 ? BT : 0) + (last ? BT : 0);  // the token ids, 4 bytes each
        acts += (double)pl.busy[s][c] * (double)slot;
        layers += count;
    }
    p->peak[MEM_ACTIVATIONS] = f * acts;
    // the send buffers: between one (if the rank sends) and the most in flight
    p->peak[MEM_COMM] = f * (double)BTC * pl.sends_most[s];
    p->low[MEM_COMM] = pl.sends_most[s] > 0 ? f * (double)BTC : 0.0;
    p->ranged[MEM_COMM] = p->low[MEM_COMM] != p->peak[MEM_COMM];
    // FLOPs: the rank's layers over its dp share, the head on the last stage;
    // a split backward with --recompute full runs the forward again in W
    int last_stage = s == pp - 1;
    p->flops = plan_flops(g, (double)a->B / ndp, T, layers, last_stage ? g->padded_vocab_size : 0, 1, a->recompute);
    if (split && a->recompute == RECOMPUTE_FULL)
        p->flops += plan_flops(g, (double)a->B / ndp, T, layers, 0, 1, RECOMPUTE_NONE) / 3.0;
    // the step's messages: main.c's forward and backward
    Comm ppc = plan_group(AXIS_PP, pp, s);
    plan_pipeline_messages(pp, s, BTC);
    // the tied embedding's two gradients summed by the two ends
    if (pp > 1 && (s == 0 || s == pp - 1)) {
        Comm embed = plan_group(comm_slot_for("embedding"), 2, s == 0 ? 0 : 1);
        comm_tally(&embed, COLL_ALLREDUCE, param_tensor_numel(g, P_WTE) * sizeof(float), 2.0 * comm_ring_factor(&embed));
    }
    Comm dp = plan_group(AXIS_DP, ndp, coord[AXIS_DP]);
    if (ndp > 1) comm_tally(&dp, COLL_ALLREDUCE, (size_t)local * sizeof(float), 2.0 * comm_ring_factor(&dp));
    const Comm* groups[] = {&ppc};
    plan_norm(p, groups, 1);
}
