#!/bin/bash
# The GPU tests: the CUDA backend builds wherever nvcc is; the op tests, the
# reference across backends, the collectives on NCCL and the chapter
# invariants run where nvidia-smi lists a GPU and say "skipped" elsewhere.
# make gpu-check's harness (tests/gpu_check.sh) is checked everywhere, on
# the CPU build: its case list, a case, a skip and a planted hang.
. "$(dirname "$0")/lib.sh"

echo "== GPU"
# The CUDA backend compiles and links wherever nvcc is; its tests run where
# nvidia-smi lists a GPU and say "skipped" elsewhere.
CUDA_BUILD=$BUILD/cuda  # the Makefile's BIN for BACKEND=cuda under BUILD
nvcc_path=$(command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
gpus=$(visible_gpus)
cuda_built=0
if [ -z "$nvcc_path" ]; then
    skip "CUDA backend build" "nvcc not found"
# (on every core: after a change to common/ the whole backend recompiles)
# (the tests make gpu-check runs on a GPU too: a CUDA-only error in them shows here)
elif make --no-print-directory -j"$(nproc 2>/dev/null || echo 2)" BUILD="$BUILD" BACKEND=cuda all "$CUDA_BUILD/tests/test_ops" \
        "$CUDA_BUILD/tests/test_comm" "$CUDA_BUILD/tests/test_fsdp" >"$TEST_TMPDIR/cuda-build.log" 2>&1; then
    cuda_built=1
    pass "CUDA backend compiles and links (make BUILD=$BUILD BACKEND=cuda all, and the tests make gpu-check runs: test_ops, test_comm, test_fsdp)"
else
    fail "CUDA backend build" "$(grep -E 'error|warning' "$TEST_TMPDIR/cuda-build.log" | head -5; tail -3 "$TEST_TMPDIR/cuda-build.log")"
fi
# the reason a GPU check cannot run here, or nothing when it can
gpu_missing=""
if [ "$gpus" = 0 ]; then gpu_missing="no GPU here (nvidia-smi -L lists none, or CUDA_VISIBLE_DEVICES hides them)"
elif [ $cuda_built = 0 ]; then gpu_missing="the CUDA backend was not built (see above)"
fi

# every op against the double-precision reference, on the GPU
if [ -z "$gpu_missing" ]; then
    run_program "$CUDA_BUILD/tests/test_ops"
else
    skip "CUDA op tests ($CUDA_BUILD/tests/test_ops)" "$gpu_missing"
fi

# the reference invariant across backends: chapter 0, tiny model, 10 steps,
# the same per-step losses on the GPU as on the CPU within 1e-4
if [ -z "$gpu_missing" ]; then
    reference "--steps 10 --peak-gflops 10"
    cpu_losses=$(step_losses < "$REF.out")
    mpi_run $T_RUN 1 "$CUDA_BUILD/chapter-0" --steps 10 --peak-gflops 10
    gpu_out=$OUT
    gpu_losses=$(echo "$gpu_out" | step_losses)
    diff=$(paste <(echo "$cpu_losses") <(echo "$gpu_losses") | awk '
        { n++; d = $1 - $2; if (d < 0) d = -d; if (d > max) max = d }
        END { if (n == 10) printf "%.2e", max; else print "steps missing" }')
    if [ "$(echo "$cpu_losses" | wc -l)" = 10 ] && [ "$(echo "$gpu_losses" | wc -l)" = 10 ] &&
        awk -v d="$diff" 'BEGIN { exit !(d + 0 <= 1e-4 && d != "steps missing") }'; then
        pass "chapter 0 on the GPU reproduces the CPU reference: 10 steps, max |dloss| $diff <= 1e-4"
    else
        fail "chapter 0 GPU vs CPU losses" "max |dloss| $diff; cpu: $(echo $cpu_losses); gpu: $(echo $gpu_losses); $(echo "$gpu_out" | grep -E '^error|rank' | head -3)"
    fi
else
    skip "chapter 0 on the GPU vs the CPU reference (10 steps, 1e-4)" "$gpu_missing"
fi

# a head size whose flash-attention tiles pass every GPU's shared memory per
# block (hs 512: 393,984 bytes for dk, dv; an H100 gives 232,448) ends with
# one line naming the head size, not cudaFuncSetAttribute's "invalid argument"
if [ -z "$gpu_missing" ]; then
    python3 tests/make_model.py "$TEST_TMPDIR/hs512.bin" 250 256 64 1 1 512
    mpi_run --may-fail $T_RUN 1 "$CUDA_BUILD/chapter-0" $INV_FLAGS --steps 1 --model "$TEST_TMPDIR/hs512.bin"
    if [ "$RC" != 0 ] && [ "$(echo "$OUT" | grep -c '^error: .*flash attention at head size 512 (channels / heads) needs [0-9]* bytes of shared memory a block; this GPU gives a block at most [0-9]*')" = 1 ]; then
        pass "a head size of 512 on the GPU: exit $RC, one line naming it and the shared memory"
    else
        fail "a head size of 512 on the GPU" "exit $RC; $(echo "$OUT" | grep -E '^error' | head -2)"
    fi
else
    skip "a head size past the GPU's shared memory per block: one line naming it" "$gpu_missing"
fi

# the collectives on NCCL: hand-written and library against the exact results
for np in 1 2; do
    if [ -n "$gpu_missing" ]; then
        skip "chapter 1 --check on $np GPU rank(s)" "$gpu_missing"
    elif [ "$gpus" -lt $np ]; then
        skip "chapter 1 --check on $np GPU ranks" "$gpus GPU(s) here, one rank per GPU"
    else
        mpi_run 300 $np "$CUDA_BUILD/chapter-1" --check
        if [ $RC -eq 0 ] && echo "$OUT" | grep -q "check summary: \([0-9]*\) of \1 collective runs match on $np ranks$"; then
            pass "collectives on $np GPU rank(s), NCCL: $(echo "$OUT" | grep 'check summary' | sed 's/check summary: //')"
        else
            fail "collectives on $np GPU rank(s)" "exit $RC; command: $CMD; $(echo "$OUT" | grep -E 'FAIL|summary|error' | head -5)"
        fi
    fi
done

# the chapter invariants on the GPU: chapters 2 and 3 on 2 GPU ranks reproduce
# chapter 0 on one GPU (same backend, so the same tolerance as on the CPU).
# These runs exercise the stream and event ordering of the non-blocking
# collectives (overlapped buckets, prefetched gathers).
gpu_invariant() {  # name, chapter, flags
    local name=$1 ch=$2 flags=$3 run cmp crc
    if [ -n "$gpu_missing" ]; then skip "$name on 2 GPU ranks" "$gpu_missing"; return; fi
    if [ "$gpus" -lt 2 ]; then skip "$name on 2 GPU ranks" "$gpus GPU(s) here, one rank per GPU"; return; fi
    if [ ! -x "$CUDA_BUILD/chapter-$ch" ]; then skip "$name on 2 GPU ranks" "$CUDA_BUILD/chapter-$ch is not built"; return; fi
    run=$TEST_TMPDIR/gpu_run.jsonl
    rm -f "$run"
    mpi_run 300 2 "$CUDA_BUILD/chapter-$ch" $flags $gpu_common --log "$run"
    cmp=$(bash tests/compare_losses.sh "$gpu_ref" "$run" 3e-5 2>&1)
    crc=$?
    if [ $RC -eq 0 ] && [ $crc -eq 0 ]; then
        pass "$name on 2 GPU ranks: chapter 0's GPU losses ($cmp)"
    else
        fail "$name on 2 GPU ranks" "exit $RC; $cmp; command: $CMD; $(echo "$OUT" | grep -E '^error|rank' | head -3)"
    fi
}
gpu_common="--steps 10 --batch 24 --seq 32 --peak-gflops 10"
gpu_ref=$TEST_TMPDIR/gpu_ref.jsonl
if [ -z "$gpu_missing" ] && [ "$gpus" -ge 2 ]; then
    mpi_run $T_RUN 1 "$CUDA_BUILD/chapter-0" $gpu_common --log "$gpu_ref"
fi
for mode in naive overlapped; do
    gpu_invariant "chapter 2 $mode dp=2" 2 "--dp 2 --dp-mode $mode --bucket-kb 64"
done
gpu_invariant "chapter 2 overlapped dp=2 grad-accum=2" 2 "--dp 2 --dp-mode overlapped --bucket-kb 64 --grad-accum 2"
for z in 1 2 3; do
    pfs="1"
    [ $z = 3 ] && pfs="0 1"
    for pf in $pfs; do
        gpu_invariant "chapter 3 ZeRO-$z dp=2 prefetch=$pf" 3 "--dp 2 --zero $z --prefetch $pf"
    done
done
# chapter 4: the tp all-reduces and the vocabulary-parallel loss on NCCL
gpu_invariant "chapter 4 tp=2" 4 "--tp 2"

# without a GPU the CUDA build stops every rank with one clear message
for np in 1 2; do
    flags="--steps 1"
    [ $np = 2 ] && flags="--dp 2 --steps 1"
    if [ -z "$nvcc_path" ]; then
        skip "CUDA build without a GPU on $np rank(s)" "nvcc not found"
    elif [ "$gpus" != 0 ]; then
        skip "CUDA build without a GPU on $np rank(s)" "this machine has a GPU"
    elif [ $cuda_built = 0 ]; then
        skip "CUDA build without a GPU on $np rank(s)" "the CUDA backend was not built (see above)"
    else
        # the ranks end by MPI_Abort after the one message: no 2 s grace
        # for mpirun to stop them (as error_case, tests/lib.sh)
        OMPI_MCA_odls_base_sigkill_timeout=0 mpi_run --may-fail $T_SHORT $np "$CUDA_BUILD/chapter-0" $flags
        n=$(echo "$OUT" | grep -c '^error: ')
        if [ $RC -ne 0 ] && ! timed_out && [ "$n" = 1 ] && echo "$OUT" | grep -q '^error: no CUDA GPU found'; then
            pass "CUDA build without a GPU on $np rank(s): exit $RC, one line '$(echo "$OUT" | grep '^error: ' | cut -c1-60)...'"
        else
            fail "CUDA build without a GPU on $np rank(s)" "exit $RC (124 = hang), $n error lines; command: $CMD; $(echo "$OUT" | head -4)"
        fi
    fi
done

# make gpu-check's harness, without a GPU (tests/gpu_check.sh in its cpu
# mode: the same cases on the CPU build). Its case list holds every chapter
# at 1-2 ranks and the risky cases at 4; a subset of that very list runs,
# with a planted hang: the training case passes against its CPU reference
# with a row in the table, the sanitizer case says why it is skipped, and
# the hang is a TIMEOUT row with every rank's stacks, taken before the ranks
# were killed. The hang is a real one, so that where each rank waits is
# known: the log is a named pipe whose reader stopped reading (its buffer
# full), so rank 0 waits in write(2) as it logs step 0 and rank 1 in a
# collective of step 1. (A pipe no process reads at all is refused at its
# open, jsonl_open.) (A long run sampled at its limit is not: a rank
# caught inside a BLAS kernel written without unwind tables, as OpenBLAS's
# Sandybridge sgemm is, has no stack past it: gdb stopped there in 13 and 14
# of 40 samples of a training rank in two tries under make test-kernels.)
gc_list=$TEST_TMPDIR/gpu_check_list.txt
bash tests/gpu_check.sh --list > "$gc_list"
gc_missing=""
for want in "chapter-0 " "chapter-1 " "chapter-2 " "chapter-3 " "chapter-4 " "chapter-5 " "chapter-6 " "chapter-7 " "capstone "; do
    awk -F'|' -v p="$want" 'index($4, p) && $2 + 0 <= 2 { f = 1 } END { exit !f }' "$gc_list" || gc_missing="$gc_missing ${want% } on 2 ranks,"
done
grep -E '^train *\| *4 \|.*--pp 4 --schedule interleaved' "$gc_list" >/dev/null || gc_missing="$gc_missing pp 4 interleaved,"
grep -E '^train *\| *4 \|.*chapter-6 .*--cp 4' "$gc_list" >/dev/null || gc_missing="$gc_missing cp 4 ring,"
for k in memcheck racecheck kill; do grep -q "^$k " "$gc_list" || gc_missing="$gc_missing $k,"; done
# each setting that turns comm.c's channels off, on a multi-rank case (the held path it falls back to)
for v in CUDA_LAUNCH_BLOCKING=1 NCCL_COMM_SPLIT_SHARE_RESOURCES=1 CUDA_MODULE_LOADING=LAZY; do
    grep -E "^train *\| *[2-9] \|.*\| *$v *\$" "$gc_list" >/dev/null || gc_missing="$gc_missing $v,"
done
if [ -z "$gc_missing" ]; then
    pass "make gpu-check's list: chapters 0-7 and the capstone at 1-2 ranks, pp 4 interleaved and cp 4 ring at 4, memcheck, racecheck, a killed rank, the three settings without channels ($(wc -l < "$gc_list") cases)"
else
    fail "make gpu-check's list" "missing:${gc_missing%,}"
fi
gc_cases=$TEST_TMPDIR/gpu_check_cases.txt gc_out=$TEST_TMPDIR/gpu_check gc_fifo=$TEST_TMPDIR/gpu_check_hang.jsonl
# the reader that stopped, killed after both hangs below
stalled_pipe "$gc_fifo"
gc_filler=$FILLER_PID
{
    grep -E '^train .*\| capstone pp=2 zb m=4 ' "$gc_list"
    grep -E '^memcheck ' "$gc_list"
    echo "prog | 2 | planted hang | chapter-2 --dp 2 --steps 3 --batch 24 --seq 32 --peak-gflops 10 --log $gc_fifo | | 8"
} > "$gc_cases"
gc_log=$TEST_TMPDIR/gpu_check.out
env -u TEST_COUNTS GPU_CHECK_BACKEND=cpu GPU_CHECK_CASES="$gc_cases" GPU_CHECK_OUT="$gc_out" \
    timeout -k 10 $T_RUN bash tests/gpu_check.sh > "$gc_log" 2>&1
gc_rc=$?
gc_ok=1 gc_why=""
gc_need() { grep -qE -- "$1" "$gc_log" || { gc_ok=0; gc_why="$gc_why no line '$1';"; }; }
gc_need '^result +np +case +s +\|dloss\| +\|dnorm\| +ms/step +cpu ms'
gc_need '^PASS +2 +capstone pp=2 zb m=4 +[0-9]+ +[0-9.]+e[-+][0-9]+ +[0-9.]+e[-+][0-9]+ +[0-9.]+ +[0-9.]+ '
gc_need '^SKIP +1 +op tests under compute-sanitizer memcheck .* cpu mode$'
gc_need '^TIMEOUT +2 +planted hang .*no end in 8 s: stacks in cases/03-planted_hang$'
gc_need '^1 passed, 1 failed, 1 skipped$'
for r in 0 1; do
    # the rank's main thread, named by gdb, down to the program's main; where
    # gdb is missing (a dependency: .ci/install-deps.sh) or may not attach
    # (a container without ptrace), the kernel's stacks from /proc
    gc_stack=$gc_out/cases/03-planted_hang/stack.rank$r.txt
    if grep -q '^Thread 1 ' "$gc_stack" 2>/dev/null; then
        # (check_log is static: inlined or not)
        if [ $r = 0 ]; then gc_need "^    rank 0: .*write.* < report_step_extra < train_loop_step < main$"
        else gc_need "^    rank 1: .*(MPI_|comm_).* < main$"; fi
    elif ! grep -q 'kernel stacks from /proc' "$gc_stack" 2>/dev/null; then
        gc_ok=0 gc_why="$gc_why no stack of rank $r;"
    fi
done
[ -s "$gc_out.tar.gz" ] || { gc_ok=0; gc_why="$gc_why no $gc_out.tar.gz;"; }
[ $gc_rc = 1 ] || { gc_ok=0; gc_why="$gc_why exit $gc_rc, not 1 (one failed case);"; }
if [ $gc_ok = 1 ]; then
    pass "make gpu-check on the CPU build (GPU_CHECK_BACKEND=cpu): a case of its list against its CPU reference, a skipped sanitizer, a planted hang (a log whose reader stopped) as a TIMEOUT row with both ranks' stacks where they wait ($(grep -m1 "^    rank 0:" "$gc_log" | sed 's/^ *//'); $(grep -m1 "^    rank 1:" "$gc_log" | sed "s/^ *rank 1: .* < \([^<]* < [^<]* < main\)$/rank 1: ... \1/"))"
else
    fail "make gpu-check on the CPU build" "${gc_why% ;}; $(tail -12 "$gc_log")"
fi
# the sanitizer rows' scoring, through a stand-in for compute-sanitizer
# (GPU_CHECK_SANITIZER) that runs the program and ends as each tool does:
# racecheck with "RACECHECK SUMMARY: N hazards displayed (E errors, W
# warnings)", the others with "ERROR SUMMARY: N errors"; a run it reports
# a hazard in fails (exit 99, --error-exitcode's)
gc_san=$TEST_TMPDIR/sanitizer_standin.sh
cat > "$gc_san" <<'STANDIN'
#!/bin/bash
tool=memcheck
while [ "${1#--}" != "$1" ]; do [ "$1" = --tool ] && tool=$2; shift 2; done
"$@" > /dev/null; rc=$?
n=0; [ "${STANDIN_HAZARDS:-0}" != 0 ] && [ "$tool" = "$STANDIN_HAZARDS" ] && n=1 rc=99
if [ "$tool" = racecheck ]; then echo "========= RACECHECK SUMMARY: $n hazards displayed ($n errors, 0 warnings)"
else echo "========= ERROR SUMMARY: $n errors"; fi
exit $rc
STANDIN
chmod +x "$gc_san"
for k in memcheck racecheck initcheck synccheck; do echo "$k | 1 | stand-in $k | chapter-0 --steps 0 | | 60"; done > "$gc_cases.san"
gc_out=$TEST_TMPDIR/gpu_check_san gc_log=$TEST_TMPDIR/gpu_check_san.out
env -u TEST_COUNTS GPU_CHECK_SANITIZER="$gc_san" GPU_CHECK_BACKEND=cpu GPU_CHECK_CASES="$gc_cases.san" GPU_CHECK_OUT="$gc_out" \
    timeout -k 10 $T_RUN bash tests/gpu_check.sh > "$gc_log" 2>&1
gc_rc=$? gc_ok=1 gc_why=""
for k in memcheck initcheck synccheck; do gc_need "^PASS +1 +stand-in $k .*ERROR SUMMARY: 0 errors"; done
gc_need '^PASS +1 +stand-in racecheck .*RACECHECK SUMMARY: 0 hazards displayed'
gc_need '^4 passed, 0 failed, 0 skipped$'
[ $gc_rc = 0 ] || { gc_ok=0; gc_why="$gc_why exit $gc_rc, not 0;"; }
gc_out=$TEST_TMPDIR/gpu_check_san2 gc_log=$TEST_TMPDIR/gpu_check_san2.out
env -u TEST_COUNTS STANDIN_HAZARDS=racecheck GPU_CHECK_SANITIZER="$gc_san" GPU_CHECK_BACKEND=cpu GPU_CHECK_CASES="$gc_cases.san" \
    GPU_CHECK_OUT="$gc_out" timeout -k 10 $T_RUN bash tests/gpu_check.sh > "$gc_log" 2>&1
gc_need '^FAIL +1 +stand-in racecheck .*RACECHECK SUMMARY: 1 hazards displayed'
gc_need '^3 passed, 1 failed, 0 skipped$'
if [ $gc_ok = 1 ]; then
    pass "make gpu-check's sanitizer rows: each tool's own summary line read (racecheck's 'RACECHECK SUMMARY: 0 hazards', the others' 'ERROR SUMMARY: 0 errors'), a reported hazard a FAIL"
else
    fail "make gpu-check's sanitizer rows" "${gc_why% ;}; $(tail -8 "$gc_log")"
fi
# ... and where gdb reads no stack (GPU_CHECK_GDB=false, as in a container
# without ptrace), each rank's main thread from /proc: its wait channel, and
# where the kernel lets us read it, rank 0's kernel stack in the pipe's write
gc_out=$TEST_TMPDIR/gpu_check_proc gc_log=$TEST_TMPDIR/gpu_check_proc.out
grep 'planted hang' "$gc_cases" > "$gc_cases.hang"
env -u TEST_COUNTS GPU_CHECK_GDB=false GPU_CHECK_BACKEND=cpu GPU_CHECK_CASES="$gc_cases.hang" GPU_CHECK_OUT="$gc_out" \
    timeout -k 10 $T_RUN bash tests/gpu_check.sh > "$gc_log" 2>&1
gc_rc=$? gc_ok=1 gc_why=""
gc_need '^TIMEOUT +2 +planted hang .*no end in 8 s: stacks in cases/01-planted_hang$'
gc_need '^    rank 0: no gdb stack; main thread [0-9]+ chapter-2, wchan '
gc_need '^    rank 1: no gdb stack; main thread [0-9]+ chapter-2, wchan '
gc_stack=$gc_out/cases/01-planted_hang/stack.rank0.txt
if grep -q '^\[<' "$gc_stack" 2>/dev/null && ! grep -q 'pipe_write' "$gc_stack"; then
    gc_ok=0 gc_why="$gc_why rank 0's kernel stack has no pipe_write;"
fi
kill $gc_filler 2>/dev/null
wait $gc_filler 2>/dev/null
[ $gc_rc = 1 ] || { gc_ok=0; gc_why="$gc_why exit $gc_rc, not 1 (one failed case);"; }
if [ $gc_ok = 1 ]; then
    pass "make gpu-check without gdb's stacks: the planted hang's ranks from /proc ($(grep -m1 "^    rank 0:" "$gc_log" | sed 's/^ *//'))"
else
    fail "make gpu-check without gdb's stacks" "${gc_why% ;}; $(tail -8 "$gc_log")"
fi

finish
