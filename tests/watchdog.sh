#!/bin/bash
# The watchdog (common/watchdog.h, --timeout): a rank stopped with SIGSTOP
# (alive to the kernel, dead to its peers) ends the whole job with one
# message naming it, the wait and the step, in a collective (chapter 2) and
# in a pipeline message (chapter 5); a run much slower than its timeout but
# alive is left alone, and so is a rank making many brief waits while its
# peer waits longer than the timeout; a bad --timeout is refused; rank 0
# blocked writing to a --log pipe whose reader stopped ends the job too. A plain MPI call outside
# the comm layer is watched too (tests/test_watchdog.c).
# A topic script of tests/run.sh (make test CHAPTER=watchdog runs it alone).
. "$(dirname "$0")/lib.sh"
echo "== watchdog: stopped ranks, slow ranks"

# wd_stop NAME NP WORLD-RANK PROGRAM FLAGS...: starts the run with
# --timeout 2, waits for its step 2, stops one rank with SIGSTOP and expects
# every rank to end (exit 3 from MPI_Abort) within the limit, with one
# error line naming the stopped rank
wd_stop() {
    local name=$1 np=$2 victim=$3 bin=$4 out=$TEST_TMPDIR/wd_$1.out pid vpid rc i t0 t1
    shift 4
    timeout 120 $MPIRUN -np "$np" "$BUILD/$bin" "$@" --steps 100000 --peak-gflops 10 --timeout 2 >"$out" 2>&1 &
    pid=$!
    for i in $(seq 1 600); do grep -q '^step *2/' "$out" 2>/dev/null && break; sleep 0.1; done
    # the victim: rank $victim of this job, found under its mpirun by pid
    vpid=$(own_rank_pid $pid "$victim")
    t0=$(date +%s)
    if [ -n "$vpid" ]; then kill -STOP "$vpid"; else own_kill $pid; fi  # no rank found: end the run now
    wait $pid
    rc=$?
    t1=$(date +%s)
    [ -n "$vpid" ] && is_own "$vpid" && kill -9 "$vpid" 2>/dev/null  # if mpirun left it stopped
    if [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ "$(grep -c '^error: watchdog' "$out")" = 1 ] &&
        grep -q "^error: watchdog: rank [0-9]* in .* at step [0-9]*; rank $victim stopped progressing (no answer within 2 s): ending every rank (--timeout 2)" "$out"; then
        pass "watchdog: $name: rank $victim stopped, every rank ended in $((t1 - t0)) s with one message naming it"
    else
        fail "watchdog: $name" "exit $rc after $((t1 - t0)) s; $(grep -E '^error' "$out" | head -2)"
    fi
}
# another checkout's ranks on a shared machine: processes whose command
# lines look like this test's programs. The tests signal only what they
# started, by pid: these must come through untouched (not killed, not stopped)
( exec -a "$BUILD/chapter-2 --dp 2 --timeout 2 $BUILD/tests/test_watchdog" sleep 600 ) &
decoy2=$!
( exec -a "$BUILD/chapter-5 --pp 2 --timeout 2" sleep 600 ) &
decoy5=$!
wd_stop "a collective (chapter 2, dp 2)" 2 1 chapter-2 --dp 2
wd_stop "a pipeline message (chapter 5, pp 2)" 2 0 chapter-5 --pp 2 --microbatches 4

# a --log pipe whose reader stopped: rank 0 blocks in its write of a step
# record while rank 1 waits in the next all-reduce. The write is a marked
# wait (common/report.c), so the watchdog ends the job naming it; unmarked,
# rank 0 answered "computing" and the job hung
stalled_pipe "$TEST_TMPDIR/wd_log.fifo"
t0=$(date +%s)
out=$(timeout -k 5 60 $MPIRUN -np 2 "$BUILD/chapter-2" --dp 2 --steps 100000 --peak-gflops 10 --timeout 2 \
    --log "$TEST_TMPDIR/wd_log.fifo" 2>&1)
rc=$? t1=$(date +%s)
kill $FILLER_PID 2>/dev/null
wait $FILLER_PID 2>/dev/null
if [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ "$(echo "$out" | grep -c '^error: watchdog')" = 1 ] &&
    echo "$out" | grep -q "^error: watchdog: every rank has waited more than 2 s at step [0-9]* and none can move (a deadlock): rank 0 in write to --log for [0-9]* s; rank 1 in allreduce on group dp for [0-9]* s: ending every rank$"; then
    pass "watchdog: a --log pipe whose reader stopped: rank 0 in its write, every rank ended in $((t1 - t0)) s with one message naming it"
else
    fail "watchdog: a --log pipe whose reader stopped" "exit $rc (124 = hang) after $((t1 - t0)) s; $(echo "$out" | grep -E '^error' | head -2)"
fi

# a plain MPI call (a loss's mean, a stage's loss broadcast, a checkpoint's
# "every writer done?", a new group), not one of comm.c's marked waits: watch_mpi.c
# marks it too, so a peer stopped there ends the job as well (tests/test_watchdog.c)
for call in allreduce bcast recv gather barrier comm_split comm_dup; do
    t0=$(date +%s)
    # -k: whatever is left of this run is killed with it (its own processes only)
    out=$(timeout -k 5 60 $MPIRUN -np 2 "$BUILD/tests/test_watchdog" $call 2>&1)
    rc=$? t1=$(date +%s)
    if [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ "$(echo "$out" | grep -c '^error: watchdog')" = 1 ] &&
        echo "$out" | grep -q "^error: watchdog: rank 0 in MPI_${call^} .* rank 1 stopped progressing"; then
        pass "watchdog: rank 0 in a plain MPI_${call^}, rank 1 stopped: every rank ended in $((t1 - t0)) s"
    else
        fail "watchdog: a plain MPI_${call^}" "exit $rc (124 = hang) after $((t1 - t0)) s; $(echo "$out" | grep -E 'error|returned' | head -2)"
    fi
done

# no stall: rank 0 waits about 4 s in MPI_Recv (longer than the 1 s timeout)
# while rank 1 makes ~20 brief marked waits back to back and then sends. The
# censuses find rank 1 inside a wait each time, a short one: it is moving,
# so nothing is ended (test_watchdog.c says how this was seen to fail with
# a census that counts a brief wait as a stall)
out=$(timeout -k 5 60 $MPIRUN -np 2 "$BUILD/tests/test_watchdog" brief 2>&1)
rc=$?
if [ $rc -eq 0 ] && ! echo "$out" | grep -q watchdog: && echo "$out" | grep -q '^rank 0 waited in MPI_Recv while rank 1 made 20 brief waits'; then
    pass "watchdog: rank 0 waits 4 timeouts while rank 1 makes 20 brief waits: no stall, the run ends normally"
else
    fail "watchdog: brief waits beside a long one" "exit $rc (3 = ended by the watchdog); $(echo "$out" | grep -E 'error|waited' | head -2)"
fi

decoys_ok=1
for d in $decoy2 $decoy5; do
    st=$(ps -o stat= -p "$d" 2>/dev/null)
    { [ -n "$st" ] && [ "${st:0:1}" != T ]; } || decoys_ok=0
done
if [ $decoys_ok = 1 ]; then
    pass "watchdog: processes the tests did not start, named like their ranks, are neither killed nor stopped"
else
    fail "watchdog: the tests signalled processes they did not start" "decoys: $(ps -o pid=,stat=,args= -p "$decoy2,$decoy5" 2>/dev/null | tr '\n' ';')"
fi
kill $decoy2 $decoy5 2>/dev/null
wait $decoy2 $decoy5 2>/dev/null

# alive but slow: the shortest timeout, 1 s; every census finds the peer computing, so the
# run ends normally with the losses of a run without a watchdog
mpi_run 120 2 "$BUILD/chapter-5" --pp 2 --microbatches 4 --steps 4 --peak-gflops 10 --timeout 1 --log "$TEST_TMPDIR/wd_slow.jsonl"
slow_rc=$RC slow_out=$OUT
mpi_run 120 2 "$BUILD/chapter-5" --pp 2 --microbatches 4 --steps 4 --peak-gflops 10 --timeout 0 --log "$TEST_TMPDIR/wd_off.jsonl"
if [ "$slow_rc" = 0 ] && ! echo "$slow_out" | grep -q watchdog &&
    [ "$(grep '"type":"step"' "$TEST_TMPDIR/wd_slow.jsonl" | sed 's/"ms".*//')" = "$(grep '"type":"step"' "$TEST_TMPDIR/wd_off.jsonl" | sed 's/"ms".*//')" ]; then
    pass "watchdog: a live run with --timeout 1 ends normally, with the losses of --timeout 0"
else
    fail "watchdog: a slow live run" "exit $slow_rc; $(echo "$slow_out" | grep -E 'error|watchdog' | head -2)"
fi

# below 1 s (WATCHDOG_MIN_SECONDS) a collective every rank is in looks like
# a deadlock: 1e-9 reported one at start-up
for bad in -1 2e6 1e-9 0.5; do
    error_case chapter-2 2 "--dp 2 --timeout $bad" "--timeout must be 0 (no watchdog) or a number of seconds"
done
finish
