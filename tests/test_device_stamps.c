// test_device_stamps.c: memory.h's DeviceStamps on the CPU backend, the
// host-clock twin of the CUDA events (tests/test_ops.c runs its ordering
// check on a GPU too).
//
// What can go wrong: a read that returns another slot's time, or a stale one
// from the step before; a stamp taken again that does not replace the first;
// the lists not growing (or growing wrong) when a later step has more stamps;
// a bad index or a read of a stamp never taken accepted silently. So every
// stamp is bracketed by host-clock reads (now_seconds, the clock the stamps
// use) with a sleep between stamps: the brackets are disjoint, and a wrong
// slot, a stale time or a missed replacement falls outside its bracket. The
// refusals run in a child (fatal_at exits without MPI), whose exit status
// and message are checked. No MPI: one process, as unit.sh runs it.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "memory.h"
#include "device_clock.h"
#include "runtime.h"
#include "test.h"

static void pause_ms(int ms) {
    struct timespec ts = {0, (long)ms * 1000000L};
    nanosleep(&ts, NULL);
}

// Stamps slot i, bracketed by the host clock: lo[i] <= its time <= hi[i].
static void stamp_bracketed(DeviceStamps* s, int i, double* lo, double* hi) {
    pause_ms(1);
    lo[i] = now_seconds();
    device_stamp(s, i);
    hi[i] = now_seconds();
}

// Every out[i] inside [lo[i], hi[i]], and the brackets of the slots taken
// in order disjoint and increasing: the stamps increase.
static int within(const double* out, const double* lo, const double* hi, int n, char* why, size_t len) {
    for (int i = 0; i < n; i++)
        if (!(out[i] >= lo[i] && out[i] <= hi[i])) {
            snprintf(why, len, "stamp %d read %.9f, taken within [%.9f, %.9f]", i, out[i], lo[i], hi[i]);
            return 0;
        }
    return 1;
}

// A step of n stamps taken in order: the read gives each one's time.
static int one_step(DeviceStamps* s, int n, double* out, char* why, size_t len) {
    double lo[16], hi[16];
    double before = now_seconds();
    device_stamps_begin(s, n);
    for (int i = 0; i < n; i++) stamp_bracketed(s, i, lo, hi);
    device_stamps_read(s, out);
    if (!(s->anchor >= before && s->anchor <= lo[0])) {
        snprintf(why, len, "anchor %.9f outside [%.9f, %.9f]", s->anchor, before, lo[0]);
        return 0;
    }
    for (int i = 1; i < n; i++)
        if (!(out[i] > out[i - 1])) {
            snprintf(why, len, "stamp %d (%.9f) not after stamp %d (%.9f)", i, out[i], i - 1, out[i - 1]);
            return 0;
        }
    return within(out, lo, hi, n, why, len);
}

static void test_steps(void) {
    DeviceStamps s = {0};
    double a[16], b[16], c[16];
    char why[256] = "";
    int ok = one_step(&s, 4, a, why, sizeof(why));
    check(ok, "device stamps: 4 stamps in order increase, each read as taken, the anchor before the first", "%s", why);
    // the next step reuses the object and has more stamps: the lists grow
    ok = one_step(&s, 8, b, why, sizeof(why));
    check(ok && b[0] > a[3] && s.cap >= 8, "device stamps: a second step of 8 (the lists grow) reads its own times, after the first step's",
          "%s; b[0] %.9f, a[3] %.9f, cap %d", why, b[0], a[3], s.cap);
    // and then fewer: the room stays, the old stamps do not leak into the read
    ok = one_step(&s, 3, c, why, sizeof(why));
    check(ok && c[0] > b[7] && s.cap == 8, "device stamps: a third step of 3 reuses the room and reads only its own times",
          "%s; c[0] %.9f, b[7] %.9f, cap %d", why, c[0], b[7], s.cap);

    // any order, and a stamp taken again replaces the first
    double lo[4], hi[4], out[4];
    device_stamps_begin(&s, 4);
    for (int i = 3; i >= 0; i--) stamp_bracketed(&s, i, lo, hi);
    stamp_bracketed(&s, 2, lo, hi);  // again: the latest of all
    device_stamps_read(&s, out);
    ok = within(out, lo, hi, 4, why, sizeof(why));
    check(ok && out[3] < out[1] && out[1] < out[0] && out[0] < out[2],
          "device stamps: taken 3, 2, 1, 0 then 2 again: read in that order, the second stamp 2 replacing the first",
          "%s; %.9f %.9f %.9f %.9f", why, out[0], out[1], out[2], out[3]);
    // read twice: the same times (a read changes nothing)
    double again[4];
    device_stamps_read(&s, again);
    check(memcmp(out, again, sizeof(out)) == 0, "device stamps: a second read of the same step gives the same times", "differ");
    // a step of none
    device_stamps_begin(&s, 0);
    device_stamps_read(&s, NULL);
    check(s.n == 0, "device stamps: a step of 0 stamps reads nothing", "n %d", s.n);
    device_stamps_free(&s);
    check(s.t == NULL && s.done == NULL && s.cap == 0 && !s.begun, "device stamps: free zeroes the object", "cap %d", s.cap);
    ok = one_step(&s, 2, a, why, sizeof(why));  // ready for use again
    check(ok, "device stamps: a freed object is ready for use again", "%s", why);
    device_stamps_free(&s);
}

// ---------------------------------------------------------------- refusals
// Each case runs in a child: it must exit non-zero with a message naming
// the problem (fatal_at: "file:line: message", then exit(1) without MPI).
enum { BAD_STAMP_PAST_END, BAD_STAMP_NEGATIVE, BAD_STAMP_NO_BEGIN, BAD_READ_NO_BEGIN, BAD_READ_MISSING,
       BAD_READ_LAST_STEPS, BAD_BEGIN_NEGATIVE, BAD_AFTER_FREE };

static void bad_case(int which) {
    DeviceStamps s = {0};
    double out[4];
    switch (which) {
        case BAD_STAMP_PAST_END: device_stamps_begin(&s, 4), device_stamp(&s, 4); break;
        case BAD_STAMP_NEGATIVE: device_stamps_begin(&s, 4), device_stamp(&s, -1); break;
        case BAD_STAMP_NO_BEGIN: device_stamp(&s, 0); break;
        case BAD_READ_NO_BEGIN: device_stamps_read(&s, out); break;
        case BAD_READ_MISSING:
            device_stamps_begin(&s, 3);
            device_stamp(&s, 0), device_stamp(&s, 2);
            device_stamps_read(&s, out);
            break;
        case BAD_READ_LAST_STEPS:  // every stamp taken in the step before; one in this
            device_stamps_begin(&s, 2);
            device_stamp(&s, 0), device_stamp(&s, 1);
            device_stamps_read(&s, out);
            device_stamps_begin(&s, 2);
            device_stamp(&s, 0);
            device_stamps_read(&s, out);
            break;
        case BAD_BEGIN_NEGATIVE: device_stamps_begin(&s, -2); break;
        case BAD_AFTER_FREE:
            device_stamps_begin(&s, 2);
            device_stamps_free(&s);
            device_stamp(&s, 0);
            break;
    }
}

static void refused(int which, const char* phrase, const char* name) {
    int pipefd[2];
    if (pipe(pipefd) != 0) abort();
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        dup2(pipefd[1], STDERR_FILENO);
        close(pipefd[0]);
        bad_case(which);
        _exit(0);  // accepted: the parent sees exit 0
    }
    close(pipefd[1]);
    char msg[1024] = "";
    size_t got = 0;
    for (ssize_t r; got < sizeof(msg) - 1 && (r = read(pipefd[0], msg + got, sizeof(msg) - 1 - got)) > 0;) got += (size_t)r;
    msg[got] = 0;
    close(pipefd[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    char* nl = strchr(msg, '\n');
    if (nl) *nl = 0;
    check(WIFEXITED(status) && WEXITSTATUS(status) != 0 && strstr(msg, phrase) != NULL, name,
          "exit status %d, message '%s' (expected one containing '%s')", status, msg, phrase);
}

static void test_refusals(void) {
    refused(BAD_STAMP_PAST_END, "device_stamp 4: out of the step's 4 stamps [0, 4)",
            "device stamps: a stamp past the step's count is refused, naming the index and the count");
    refused(BAD_STAMP_NEGATIVE, "device_stamp -1: out of the step's 4 stamps",
            "device stamps: a negative stamp index is refused");
    refused(BAD_STAMP_NO_BEGIN, "device_stamp 0 without device_stamps_begin",
            "device stamps: a stamp before any begin is refused");
    refused(BAD_READ_NO_BEGIN, "device_stamps_read without device_stamps_begin",
            "device stamps: a read before any begin is refused");
    refused(BAD_READ_MISSING, "stamp 1 of 3 was not taken since device_stamps_begin",
            "device stamps: a read of a step with a stamp never taken is refused, naming it");
    refused(BAD_READ_LAST_STEPS, "stamp 1 of 2 was not taken since device_stamps_begin",
            "device stamps: a stamp taken in the step before does not count for this one");
    refused(BAD_BEGIN_NEGATIVE, "device_stamps_begin: -2 stamps",
            "device stamps: a begin of a negative count is refused");
    refused(BAD_AFTER_FREE, "device_stamp 0 without device_stamps_begin",
            "device stamps: a stamp after free (no begin since) is refused");
}

int main(void) {
    test_steps();
    test_refusals();
    return test_exit_code();
}
