// watchdog.c: the thread that ends a job whose ranks stopped (watchdog.h).
#include "watchdog.h"

#include <mpi.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>


enum { TAG_ASK = 1, TAG_ANSWER = 2 };

// Its own clock, not runtime.h's now_seconds (runtime.c stops the watchdog,
// and common/ keeps no circle of files calling each other)
static double watchdog_clock(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

// What a rank answers a census: sent as bytes between ranks of one build.
typedef struct {
    int round;      // the census it answers
    int rank, step;
    int waiting;    // inside a marked wait
    int peer;       // the other rank of a message, -1 for a collective
    double waited;  // seconds in the current wait
    char op[24], group[24];
} RankState;

// Written by the main thread, read by the watchdog thread (atomics: the
// thread reads a consistent enough picture; a torn op name is impossible,
// the strings are never written, only pointed at).
static int depth = 0;                 // nesting of marked waits
static double wait_start = 0.0;       // watchdog_clock() at the outermost enter
static const char* wait_op = "";
static const char* wait_group = "";
static int wait_peer = -1;
static int current_step = 0;  // the step being trained (report_step moves it on)

static double timeout_s = 0.0;
static int running = 0, stop_flag = 0;
static pthread_t thread;
static MPI_Comm census_comm = MPI_COMM_NULL;
static int me = 0, world = 1;
static pthread_t main_thread;  // the thread whose waits are marked
static RankState* states;      // (world) a census's answers, one per rank
static char* answered;         // (world)

void watchdog_enter(const char* op, const char* group, int peer) {
    if (!running) return;
    if (__atomic_load_n(&depth, __ATOMIC_RELAXED) == 0) {
        __atomic_store_n(&wait_op, op, __ATOMIC_RELAXED);
        __atomic_store_n(&wait_group, group ? group : "world", __ATOMIC_RELAXED);
        __atomic_store_n(&wait_peer, peer, __ATOMIC_RELAXED);
        double t = watchdog_clock();
        __atomic_store(&wait_start, &t, __ATOMIC_RELAXED);
    }
    __atomic_add_fetch(&depth, 1, __ATOMIC_RELEASE);
}

void watchdog_leave(void) {
    if (!running) return;
    __atomic_sub_fetch(&depth, 1, __ATOMIC_RELEASE);
}

int watchdog_enter_mpi(const char* op, const char* group, int peer) {
    if (!running || !pthread_equal(pthread_self(), main_thread)) return 0;
    watchdog_enter(op, group, peer);
    return 1;
}

void watchdog_leave_mpi(int marked) {
    if (marked) watchdog_leave();
}

void watchdog_set_step(int step) { __atomic_store_n(&current_step, step, __ATOMIC_RELAXED); }

static void my_state(RankState* s, int round) {
    memset(s, 0, sizeof(*s));
    s->round = round;
    s->rank = me;
    s->step = __atomic_load_n(&current_step, __ATOMIC_RELAXED);
    s->waiting = __atomic_load_n(&depth, __ATOMIC_ACQUIRE) > 0;
    if (s->waiting) {
        double t0;
        __atomic_load(&wait_start, &t0, __ATOMIC_RELAXED);
        s->waited = watchdog_clock() - t0;
        s->peer = __atomic_load_n(&wait_peer, __ATOMIC_RELAXED);
        snprintf(s->op, sizeof(s->op), "%s", __atomic_load_n(&wait_op, __ATOMIC_RELAXED));
        snprintf(s->group, sizeof(s->group), "%s", __atomic_load_n(&wait_group, __ATOMIC_RELAXED));
    } else {
        s->peer = -1;
    }
}

// The census talks through MPI's profiling names (PMPI_Send, not MPI_Send):
// watch_mpi.c's wrappers of the MPI_ names report every blocking call to this
// file, and the watchdog's own messages must not pass through what watches
// MPI (no circle between the two files; tests/layers_check.py).

// Answers every question another rank's census has sent this rank.
static void answer_questions(void) {
    for (;;) {
        int pending = 0;
        MPI_Status st;
        PMPI_Iprobe(MPI_ANY_SOURCE, TAG_ASK, census_comm, &pending, &st);
        if (!pending) return;
        int round = 0;
        PMPI_Recv(&round, 1, MPI_INT, st.MPI_SOURCE, TAG_ASK, census_comm, MPI_STATUS_IGNORE);
        RankState s;
        my_state(&s, round);
        PMPI_Send(&s, (int)sizeof(s), MPI_BYTE, st.MPI_SOURCE, TAG_ANSWER, census_comm);
    }
}

static void sleep_seconds(double s) {
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

static void describe(char* out, size_t len, const RankState* s) {
    if (!s->waiting)
        snprintf(out, len, "rank %d computing", s->rank);
    else if (s->peer >= 0)
        snprintf(out, len, "rank %d in %s with rank %d of group %s for %.0f s", s->rank, s->op, s->peer, s->group,
                 s->waited);
    else if (s->group[0])
        snprintf(out, len, "rank %d in %s on group %s for %.0f s", s->rank, s->op, s->group, s->waited);
    else  // a wait on no group: a write to the --log (report.c)
        snprintf(out, len, "rank %d in %s for %.0f s", s->rank, s->op, s->waited);
}

// Asks every other rank what it does; ends the job if one cannot answer or
// if nobody can move. Returns when the job goes on (somebody is computing).
static void census(int round) {
    int n = world;
    memset(answered, 0, (size_t)n);
    my_state(&states[me], round);
    answered[me] = 1;
    int asked = 0;
    for (int r = 0; r < n; r++) {
        if (r == me) continue;
        MPI_Request req;
        PMPI_Isend(&round, 1, MPI_INT, r, TAG_ASK, census_comm, &req);
        PMPI_Request_free(&req);  // a tiny message: sent eagerly, or never if r is gone
        asked++;
    }
    // a live rank answers within its thread's next turn; a loaded machine
    // can delay that by a second or two
    double grace = timeout_s < 2.0 ? 2.0 : timeout_s < 10.0 ? timeout_s : 10.0;
    double t0 = watchdog_clock();
    int got = 0;
    while (got < asked && watchdog_clock() - t0 < grace) {
        answer_questions();  // another rank may be counting at the same time
        int pending = 0;
        MPI_Status st;
        PMPI_Iprobe(MPI_ANY_SOURCE, TAG_ANSWER, census_comm, &pending, &st);
        if (!pending) {
            sleep_seconds(0.01);
            continue;
        }
        RankState s;
        PMPI_Recv(&s, (int)sizeof(s), MPI_BYTE, st.MPI_SOURCE, TAG_ANSWER, census_comm, MPI_STATUS_IGNORE);
        if (s.round != round || s.rank < 0 || s.rank >= n || answered[s.rank]) continue;  // a late answer
        states[s.rank] = s;
        answered[s.rank] = 1;
        got++;
    }
    char mine[160], msg[1024];
    describe(mine, sizeof(mine), &states[me]);
    if (got < asked) {
        char missing[256] = "";
        size_t len = 0;
        for (int r = 0; r < n && len < sizeof(missing) - 16; r++)
            if (!answered[r]) len += (size_t)snprintf(missing + len, sizeof(missing) - len, "%s%d", len ? ", " : "", r);
        snprintf(msg, sizeof(msg),
                 "watchdog: %s at step %d; rank%s %s stopped progressing (no answer within %.0f s): ending every rank (--timeout %g)",
                 mine, states[me].step, asked - got == 1 ? "" : "s", missing, grace, timeout_s);
    } else {
        for (int r = 0; r < n; r++)
            if (!states[r].waiting || states[r].waited < timeout_s) return;  // somebody is still moving
        // every rank's census finds the same: rank 0, alive and waiting
        // past the timeout too, says it (one message, not one per rank)
        if (me != 0) return;
        size_t len = (size_t)snprintf(msg, sizeof(msg),
                                      "watchdog: every rank has waited more than %g s at step %d and none can move (a deadlock):",
                                      timeout_s, states[me].step);
        for (int r = 0; r < n && len < sizeof(msg) - 200; r++) {
            char one[160];
            describe(one, sizeof(one), &states[r]);
            len += (size_t)snprintf(msg + len, sizeof(msg) - len, "%s %s", r ? ";" : "", one);
        }
        snprintf(msg + len, sizeof(msg) - len, ": ending every rank");
    }
    fprintf(stderr, "error: %s\n", msg);
    fflush(stderr);
    fflush(stdout);
    MPI_Abort(MPI_COMM_WORLD, 3);
}

static void* watch(void* arg) {
    (void)arg;
    int round = 0;
    double last_census = 0.0;
    while (!__atomic_load_n(&stop_flag, __ATOMIC_ACQUIRE)) {
        answer_questions();
        if (__atomic_load_n(&depth, __ATOMIC_ACQUIRE) > 0) {
            double t0, now = watchdog_clock();
            __atomic_load(&wait_start, &t0, __ATOMIC_RELAXED);
            // one census per timeout period of one wait: a slow peer that
            // answered "computing" is asked again only a timeout later
            if (now - t0 > timeout_s && now - last_census > timeout_s) {
                census(++round);
                last_census = watchdog_clock();
            }
        }
        sleep_seconds(0.1);
    }
    return NULL;
}

void watchdog_start(double timeout_seconds) {
    if (running || timeout_seconds <= 0) return;
    int provided = MPI_THREAD_SINGLE;
    MPI_Query_thread(&provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    if (world == 1) return;  // nobody to wait for
    if (provided < MPI_THREAD_MULTIPLE) {
        if (me == 0) printf("note: this MPI gives no MPI_THREAD_MULTIPLE: the watchdog (--timeout) is off\n");
        return;
    }
    states = calloc((size_t)world, sizeof(RankState));
    answered = calloc((size_t)world, 1);
    if (!states || !answered) {  // a few bytes a rank: every rank would fail alike, and a job of half-watchdogs hangs
        fprintf(stderr, "error: %s:%d: out of memory for the watchdog's census of %d ranks\n", __FILE__, __LINE__, world);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    PMPI_Comm_dup(MPI_COMM_WORLD, &census_comm);  // not through watch_mpi.c: the watchdog is not yet running
    main_thread = pthread_self();
    timeout_s = timeout_seconds;
    stop_flag = 0;
    running = 1;
    if (pthread_create(&thread, NULL, watch, NULL) != 0) {
        running = 0;
        if (me == 0) printf("note: cannot start the watchdog thread: --timeout is off\n");
    }
}

void watchdog_stop(void) {
    if (!running) return;
    __atomic_store_n(&stop_flag, 1, __ATOMIC_RELEASE);
    pthread_join(thread, NULL);
    running = 0;
    free(states), free(answered);
    states = NULL, answered = NULL;
}
