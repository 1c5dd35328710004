#!/bin/bash
# The watchdog (common/watchdog.h, --timeout): a rank stopped with SIGSTOP
# (alive to the kernel, dead to its peers) ends the whole job with one
# message naming it, the wait and the step, in a collective (chapter 2) and
# in a pipeline message (chapter 5); a run much slower than its timeout but
# alive is left alone; a bad --timeout is refused. A plain MPI call outside
# the comm layer is watched too (tests/test_watchdog.c).
# A topic script of tests/run.sh (make test CHAPTER=watchdog runs it alone).
. "$(dirname "$0")/lib.sh"
echo "== watchdog: stopped ranks, slow ranks"

# wd_stop NAME NP WORLD-RANK PROGRAM FLAGS...: starts the run with
# --timeout 2, waits for its step 2, stops one rank with SIGSTOP and expects
# every rank to end (exit 3 from MPI_Abort) within the limit, with one
# error line naming the stopped rank
wd_stop() {
    local name=$1 np=$2 victim=$3 bin=$4 out=$TEST_TMPDIR/wd_$1.out pid pids rc i t0 t1
    shift 4
    timeout 120 $MPIRUN -np "$np" "$BUILD/$bin" "$@" --steps 100000 --peak-gflops 10 --timeout 2 >"$out" 2>&1 &
    pid=$!
    for i in $(seq 1 600); do grep -q '^step *2/' "$out" 2>/dev/null && break; sleep 0.1; done
    # the ranks' pids in rank order: Open MPI numbers a node's ranks as it starts them
    pids=$(pgrep -f -- "^$BUILD/$bin .*--timeout 2" | sort -n)
    t0=$(date +%s)
    kill -STOP "$(echo "$pids" | sed -n "$((victim + 1))p")"
    wait $pid
    rc=$?
    t1=$(date +%s)
    { pkill -9 -f -- "$BUILD/$bin .*--timeout 2"; } 2>/dev/null
    if [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ "$(grep -c '^error: watchdog' "$out")" = 1 ] &&
        grep -q "^error: watchdog: rank [0-9]* in .* at step [0-9]*; rank $victim stopped progressing (no answer within 2 s): ending every rank (--timeout 2)" "$out"; then
        pass "watchdog: $name: rank $victim stopped, every rank ended in $((t1 - t0)) s with one message naming it"
    else
        fail "watchdog: $name" "exit $rc after $((t1 - t0)) s; $(grep -E '^error' "$out" | head -2)"
    fi
}
wd_stop "a collective (chapter 2, dp 2)" 2 1 chapter-2 --dp 2
wd_stop "a pipeline message (chapter 5, pp 2)" 2 0 chapter-5 --pp 2 --microbatches 4

# a plain MPI call (a loss's mean, a stage's loss broadcast, a checkpoint's
# "every writer done?"), not one of comm.c's marked waits: watch_mpi.c marks
# it too, so a peer stopped there ends the job as well (tests/test_watchdog.c)
for call in allreduce bcast recv gather barrier; do
    t0=$(date +%s)
    out=$(timeout 60 $MPIRUN -np 2 "$BUILD/tests/test_watchdog" $call 2>&1)
    rc=$? t1=$(date +%s)
    { pkill -9 -f -- "$BUILD/tests/test_watchdog"; } 2>/dev/null
    if [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ "$(echo "$out" | grep -c '^error: watchdog')" = 1 ] &&
        echo "$out" | grep -q "^error: watchdog: rank 0 in MPI_${call^} .* rank 1 stopped progressing"; then
        pass "watchdog: rank 0 in a plain MPI_$call, rank 1 stopped: every rank ended in $((t1 - t0)) s"
    else
        fail "watchdog: a plain MPI_$call" "exit $rc (124 = hang) after $((t1 - t0)) s; $(echo "$out" | grep -E 'error|returned' | head -2)"
    fi
done

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
