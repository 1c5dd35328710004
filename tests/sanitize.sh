#!/bin/bash
# make sanitize: the tiny tests under AddressSanitizer and UndefinedBehavior-
# Sanitizer, on a build of their own (BUILD=build/sanitize, made by the
# Makefile). Any sanitizer report fails its run. Ends "N passed, N failed".
set -u
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build/sanitize}
MPIRUN="bash tests/mpirun.sh"
# Open MPI keeps its own allocations to the end: leaks are not ours to judge
export ASAN_OPTIONS=detect_leaks=0:abort_on_error=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
export TEST_TMPDIR=$(mktemp -d)
trap 'rm -rf "$TEST_TMPDIR"' EXIT
passed=0
failed=0

# run NAME COMMAND...: passes when the command exits 0 and no sanitizer spoke
run() { run_want "$1" 0 "" "${@:2}"; }
# run_want NAME RC WANT COMMAND...: passes when the command exits RC (0, or
# "fail": any status but 0 and 124, the timeout's), its output holds the
# extended regular expression WANT (none when empty: the path the case is
# meant to take was taken, not skipped) and no sanitizer spoke
run_want() {
    local name=$1 want_rc=$2 want=$3 out rc rc_ok=0
    shift 3
    out=$(timeout 300 "$@" 2>&1)
    rc=$?
    if [ "$want_rc" = fail ]; then [ $rc -ne 0 ] && [ $rc -ne 124 ] && rc_ok=1; else [ $rc -eq "$want_rc" ] && rc_ok=1; fi
    [ -z "$want" ] || echo "$out" | grep -qE -- "$want" || rc_ok=0
    if [ $rc_ok = 1 ] && ! echo "$out" | grep -qE 'AddressSanitizer|runtime error:|LeakSanitizer'; then
        echo "PASS sanitize: $name"
        passed=$((passed + 1))
    else
        echo "FAIL sanitize: $name: exit $rc${want:+ (wanted: $want)}"
        echo "$out" | grep -m5 -E 'ERROR|runtime error|SUMMARY|^error' | sed 's/^/    /'
        failed=$((failed + 1))
    fi
}

# the C tests that run alone (tests/unit.sh: no "// run by:" line)
for src in tests/test_*.c; do
    grep -q '^// run by:' "$src" || run "$(basename "$src" .c)" "$BUILD/tests/$(basename "$src" .c)"
done
run "test_fsdp on 3 ranks" $MPIRUN -np 3 "$BUILD/tests/test_fsdp"
run "test_ckpt on 3 ranks" $MPIRUN -np 3 "$BUILD/tests/test_ckpt"
run "test_comm on 4 ranks" $MPIRUN -np 4 "$BUILD/tests/test_comm"
run "test_ring on 2 ranks" $MPIRUN -np 2 "$BUILD/tests/test_ring"
run "chapter 0, 3 steps" $MPIRUN -np 1 "$BUILD/chapter-0" --steps 3 --peak-gflops 10 --sample 20 --save "$TEST_TMPDIR/s.bin"
run "chapter 0 from a checkpoint" $MPIRUN -np 1 "$BUILD/chapter-0" --steps 1 --peak-gflops 10 --model "$TEST_TMPDIR/s.bin"
run "chapter 1 --check on 3 ranks" $MPIRUN -np 3 "$BUILD/chapter-1" --check
for mode in naive bucketed overlapped ps; do
    run "chapter 2 $mode on 2 ranks" $MPIRUN -np 2 "$BUILD/chapter-2" --dp 2 --dp-mode "$mode" --bucket-kb 64 --steps 2 --peak-gflops 10
done
for zero in 1 2 3; do
    run "chapter 3 ZeRO-$zero on 3 ranks" $MPIRUN -np 3 "$BUILD/chapter-3" --dp 3 --batch 6 --zero "$zero" --steps 2 --peak-gflops 10
done
run "chapter 4 dp=2 tp=2 (with --save) on 4 ranks" $MPIRUN -np 4 "$BUILD/chapter-4" --dp 2 --tp 2 --steps 2 --peak-gflops 10 --save "$TEST_TMPDIR/s4.bin"
run "chapter 4 from its checkpoint, tile by tile, on tp=4" $MPIRUN -np 4 "$BUILD/chapter-4" --tp 4 --model "$TEST_TMPDIR/s4.bin" --steps 1 --peak-gflops 10
run "chapter 4 small on tp=3 (uneven vocabulary)" $MPIRUN -np 3 "$BUILD/chapter-4" --tp 3 --model small --batch 1 --seq 16 --steps 1 --val-batches 1 --peak-gflops 10
run "chapter 0 saves training state" $MPIRUN -np 1 "$BUILD/chapter-0" --steps 2 --peak-gflops 10 --ckpt-dir "$TEST_TMPDIR/st"
run "chapter 3 ZeRO-3 resumes it on 2 ranks (async saves)" $MPIRUN -np 2 "$BUILD/chapter-3" --dp 2 --zero 3 --steps 4 --peak-gflops 10 --resume "$TEST_TMPDIR/st" --ckpt-dir "$TEST_TMPDIR/st3" --save-every 1 --async-save
run "chapter 4 resumes it on tp 2" $MPIRUN -np 2 "$BUILD/chapter-4" --tp 2 --steps 4 --peak-gflops 10 --resume "$TEST_TMPDIR/st3"
for schedule in gpipe 1f1b zb; do
    run "chapter 5 $schedule on pp 2" $MPIRUN -np 2 "$BUILD/chapter-5" --pp 2 --schedule "$schedule" --microbatches 4 --steps 2 --peak-gflops 10
done
run "chapter 5 interleaved on pp 2, v 3, dp 2 (4 ranks, tiny6)" $MPIRUN -np 4 "$BUILD/chapter-5" --model tiny6 --dp 2 --pp 2 --schedule interleaved --virtual 3 --microbatches 4 --batch 8 --steps 2 --peak-gflops 10
run "chapter 6 ring on cp 2" $MPIRUN -np 2 "$BUILD/chapter-6" --cp 2 --cp-mode ring --steps 2 --peak-gflops 10
run "chapter 6 zigzag ring on dp 2 x cp 2" $MPIRUN -np 4 "$BUILD/chapter-6" --dp 2 --cp 2 --cp-mode ring --cp-balance zigzag --steps 2 --peak-gflops 10
run "chapter 6 ulysses on cp 2" $MPIRUN -np 2 "$BUILD/chapter-6" --cp 2 --cp-mode ulysses --steps 2 --peak-gflops 10
run "chapter 6 tp 2 with sequence parallelism" $MPIRUN -np 2 "$BUILD/chapter-6" --tp 2 --sp --steps 2 --peak-gflops 10
if [ -x "$BUILD/chapter-7" ]; then
    run "chapter 7 dp 2 x ep 2, capacity, save" $MPIRUN -np 4 "$BUILD/chapter-7" --dp 2 --ep 2 --batch 8 --steps 2 --capacity-factor 1 --peak-gflops 10 --save "$TEST_TMPDIR/m.bin"
    run "chapter 7 from its file on ep 4" $MPIRUN -np 4 "$BUILD/chapter-7" --ep 4 --batch 8 --steps 1 --peak-gflops 10 --model "$TEST_TMPDIR/m.bin"
fi
# the capstone: chapter 7's model on the compositions (its --model file is
# chapter 7's, saved above)
if [ -x "$BUILD/capstone" ]; then
    run "capstone ep 2 x cp 2 (Ulysses, zigzag), capacity, recompute selective" $MPIRUN -np 4 "$BUILD/capstone" --ep 2 --cp 2 --cp-mode ulysses --cp-balance zigzag --batch 8 --steps 2 --capacity-factor 1 --recompute selective --peak-gflops 10
    # --zero 1: padded shards (dp 3), the moments' checkpoint slices, resumed with the tp slices' shards
    run "capstone zb on tp 2 x pp 2, --moe-every 2 (the split backward's queues)" $MPIRUN -np 4 "$BUILD/capstone" --tp 2 --pp 2 --schedule zb --moe-every 2 --batch 8 --steps 2 --peak-gflops 10
    run "capstone zb on ep 2 x pp 2, recompute full" $MPIRUN -np 4 "$BUILD/capstone" --ep 2 --pp 2 --schedule zb --batch 8 --steps 2 --recompute full --peak-gflops 10
    run "capstone --zero 1 on dp 3, save" $MPIRUN -np 3 "$BUILD/capstone" --dp 3 --batch 12 --steps 2 --zero 1 --peak-gflops 10 --ckpt-dir "$TEST_TMPDIR/z" --save-every 1
    run "capstone --zero 1 resumed on dp 2 x tp 2" $MPIRUN -np 4 "$BUILD/capstone" --dp 2 --tp 2 --batch 12 --steps 2 --zero 1 --peak-gflops 10 --resume "$TEST_TMPDIR/z/step-00000001"
    run "capstone --zero 3 on dp 2 x tp 2 (units, gathers, checkpoint, save)" $MPIRUN -np 4 "$BUILD/capstone" --dp 2 --tp 2 --batch 12 --steps 2 --zero 3 --peak-gflops 10 --ckpt-dir "$TEST_TMPDIR/z3" --save-every 1 --save "$TEST_TMPDIR/m3.bin"
    run "capstone --zero 2 on dp 3, resumed from it" $MPIRUN -np 3 "$BUILD/capstone" --dp 3 --batch 12 --steps 2 --zero 2 --peak-gflops 10 --resume "$TEST_TMPDIR/z3/step-00000001"
    run "capstone --zero 3 on dp 2 x ep 2 from chapter 7's file, recompute full" $MPIRUN -np 4 "$BUILD/capstone" --dp 2 --ep 2 --batch 8 --steps 2 --zero 3 --recompute full --peak-gflops 10 --model "$TEST_TMPDIR/m.bin"
fi
# the checkpoint levels (common/ckpt_levels.c): level 1 under --ckpt-local
# with partner copies on 3 simulated nodes (on chapter 2 only rank 0 writes:
# two ranks in a row own no file) and xor parity, a node's directory
# deleted and rebuilt over MPI on the resume
LV=$TEST_TMPDIR/levels
mkdir -p "$LV"
LVF="--batch 6 --seq 32 --peak-gflops 10"
run "chapter 3 ZeRO-3, level 1 with partner copies on 3 nodes" $MPIRUN -np 3 "$BUILD/chapter-3" --dp 3 --zero 3 $LVF --steps 2 \
    --ckpt-local "$LV/p" --local-every 1 --ranks-per-node 1 --ckpt-redundancy partner
rm -rf "$LV/p/node-0"
run_want "chapter 3 resumed with node 0 lost: its files from the partner copy" 0 "partner copy on node" $MPIRUN -np 3 "$BUILD/chapter-3" \
    --dp 3 --zero 3 $LVF --steps 3 --ckpt-local "$LV/p" --ranks-per-node 1 --resume "$LV/p"
run "chapter 2 on 3 nodes, partner copies (ranks that own no file)" $MPIRUN -np 3 "$BUILD/chapter-2" --dp 3 $LVF --steps 2 \
    --ckpt-local "$LV/p2" --local-every 1 --ranks-per-node 1 --ckpt-redundancy partner
run "chapter 3 ZeRO-3, level 1 with xor parity on 3 nodes" $MPIRUN -np 3 "$BUILD/chapter-3" --dp 3 --zero 3 $LVF --steps 2 \
    --ckpt-local "$LV/x" --local-every 1 --ranks-per-node 1 --ckpt-redundancy xor
rm -rf "$LV/x/node-1"
run_want "chapter 3 resumed with node 1 lost: rebuilt from the xor parity" 0 "rebuilt rank-00001.bin of node 1 from the xor parity" \
    $MPIRUN -np 3 "$BUILD/chapter-3" --dp 3 --zero 3 $LVF --steps 3 --ckpt-local "$LV/x" --ranks-per-node 1 --resume "$LV/x"
# level 1 every step, level 3 every 2: level 3's saves are drained (copied) from level 1's files
run_want "chapter 0, level 1 drained to level 3 (async)" 0 "saved .*/d3/step-00000002 \(drained from level 1\)" $MPIRUN -np 1 "$BUILD/chapter-0" \
    $LVF --steps 2 --ckpt-local "$LV/d1" --local-every 1 --ckpt-dir "$LV/d3" --save-every 2 --async-save
# incremental saves: step 2 a delta against step 1's full save, restored on another mesh
run "chapter 3 ZeRO-3, --incremental 2" $MPIRUN -np 2 "$BUILD/chapter-3" --dp 2 --zero 3 $LVF --steps 2 --ckpt-dir "$LV/i" --save-every 1 --incremental 2
run_want "chapter 3 ZeRO-1 on 3 ranks resumes the delta" 0 "resumed from .*/i/step-00000002" $MPIRUN -np 3 "$BUILD/chapter-3" --dp 3 --zero 1 $LVF \
    --steps 3 --resume "$LV/i/step-00000002"
# the supervisor (common/tools/supervise.sh): rank 0 killed after step 2,
# the job restarted from level 1's step 2 (level 3 only every 100 steps)
run_want "supervise.sh: a killed job resumed from level 1" 0 "attempt 2 succeeded" env CKPT_KILL=step:2:0 MPIRUN="$MPIRUN" \
    bash common/tools/supervise.sh --np 1 --retries 1 -- "$BUILD/chapter-0" $LVF --steps 3 --ckpt-dir "$LV/s3" --save-every 100 \
    --ckpt-local "$LV/s1" --local-every 1
# a pipeline schedule from a file (chapter 5's --schedule-file), split backward
printf 'rank 0: F0 F1 B0 W0 B1 W1\nrank 1: F1 F0 B1 W1 B0 W0\n' > "$TEST_TMPDIR/zb.sched"
run "chapter 5 --schedule-file on pp 2" $MPIRUN -np 2 "$BUILD/chapter-5" --pp 2 --microbatches 2 --schedule-file "$TEST_TMPDIR/zb.sched" \
    --steps 2 --peak-gflops 10
# the planner: one chapter's plan and a search over meshes
run "plan chapter 7" "$BUILD/plan" --chapter 7 --ranks 4 --ep 2 --dp 2 --batch 8 --steps 2 --json
run "plan --search" "$BUILD/plan" --search --ranks 4 --memory-per-rank 100000000
# the watchdog: a rank stopped (SIGSTOP) while its peer waits in MPI ends
# the job with the watchdog's message (exit 3, MPI_Abort); a rank making
# many brief waits while its peer waits longer than --timeout does not
run_want "watchdog: a stopped rank ended by --timeout" fail "^error: watchdog: rank 0 in MPI_Barrier .*rank 1 stopped progressing" \
    timeout -k 5 60 $MPIRUN -np 2 "$BUILD/tests/test_watchdog" barrier
run_want "watchdog: brief waits beside a long one are no stall" 0 "rank 1 made [0-9]+ brief waits" \
    timeout -k 5 60 $MPIRUN -np 2 "$BUILD/tests/test_watchdog" brief
head -c 50000 /usr/share/games/fortunes/fortunes > "$TEST_TMPDIR/c.txt"
run "tokenize" "$BUILD/tokenize" "$TEST_TMPDIR/c.txt" "$TEST_TMPDIR/c"
echo
echo "$passed passed, $failed failed"
[ $failed -eq 0 ]
