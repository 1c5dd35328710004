#!/bin/bash
# tests/lib.sh: what every test script shares. A script starts with
#     . "$(dirname "$0")/lib.sh"
# makes its checks with the helpers below and ends with `finish`.
#
# Run alone (`bash tests/chapter_2.sh`) a script prints its own summary line;
# run by tests/run.sh it hands its counts to the runner (TEST_COUNTS), which
# prints the one summary line of the whole run. The runner also shares one
# scratch directory (TEST_TMPDIR) between the scripts, so a cached run (the
# reference, the saved checkpoint) is made once per test run.
#
#   pass NAME / fail NAME WHY / skip NAME WHY      count one check
#   mpi_run [--may-fail] LIMIT NP PROGRAM ARGS...  an MPI run under a timeout
#   run_program PROGRAM                            a C test program (PASS/FAIL lines)
#   count_lines TEXT                               adds the PASS/FAIL/SKIP lines of TEXT
#   error_case, help_case                          bad input / --help of a program
#   reference "FLAGS"                              chapter 0's run with FLAGS (cached)
#   invariant [...] NAME "REF_FLAGS" NP PROGRAM "FLAGS"   a layout vs the reference
#   step_losses, val_records, compare_val, rank_array     readers of logs and summaries
#   ref_checkpoint, bad_inputs                     files several chapters' tests use
#   jobs_run FUNCTION ARGS..., jobs_wait           independent checks, 2 at a time
set -u
cd "$(dirname "${BASH_SOURCE[0]}")/.."
BUILD=${BUILD:-build}
MPIRUN="bash tests/mpirun.sh"
if [ -z "${TEST_TMPDIR:-}" ]; then
    TEST_TMPDIR=$(mktemp -d)
    export TEST_TMPDIR
    trap 'rm -rf "$TEST_TMPDIR"' EXIT
fi
# The environment the runs take (threads, how a waiting rank yields, the
# topology file, the shared-memory transport): tests/run_env.sh, which
# `make docs-check` reads too, so the docs' commands run as the tests' do.
. tests/run_env.sh
passed=0
failed=0
skipped=0

pass() { echo "PASS $1"; passed=$((passed + 1)); }
fail() { echo "FAIL $1: $2"; failed=$((failed + 1)); }
skip() { echo "SKIP $1: $2"; skipped=$((skipped + 1)); }

# The end of a script: its counts to the runner, or its summary line when it
# runs alone. The exit status is non-zero when a check failed.
finish() {
    if [ -n "${TEST_COUNTS:-}" ]; then
        echo "$passed $failed $skipped" > "$TEST_COUNTS"
    else
        echo
        echo "$passed passed, $failed failed, $skipped skipped"
    fi
    [ $failed -eq 0 ]
}

# The GPUs this process may use: nvidia-smi -L lists the node's, and
# CUDA_VISIBLE_DEVICES, where set, narrows them to its entries (an empty
# value: none). 0 without nvidia-smi.
visible_gpus() {
    local n
    n=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
    if [ -n "${CUDA_VISIBLE_DEVICES+set}" ]; then
        local listed
        listed=$(echo "$CUDA_VISIBLE_DEVICES" | tr ',' '\n' | grep -c .)
        [ "$listed" -lt "$n" ] && n=$listed
    fi
    echo "${n:-0}"
}

# Per-call limits of an MPI run, in seconds. A hang (a rank waiting for a
# collective another rank never calls) fails after the limit instead of
# stopping the suite. Generous: 8 ranks on a loaded 2-core machine start
# slowly; a tiny-model run takes a few seconds there.
T_SHORT=60    # mesh pictures, bad input, --help, runs of a few steps
T_RUN=${T_RUN:-120}  # training runs of 10 or more steps, collective checks
                     # (tests/homework.sh gives a variant that hangs less)

# Signals go to this script's own processes only, by PID, never by a name
# pattern (pkill -f, pgrep): on a shared machine a pattern also matches
# another checkout's or another test run's ranks.
# own_tree PID: PID and every process below it, one a line.
own_tree() {
    local p
    echo "$1"
    for p in $(ps -o pid= --ppid "$1" 2>/dev/null); do own_tree "$p"; done
}
# own_rank_pid PID RANK: the pid of MPI rank RANK of the job under PID (a
# job this script started in the background), read from the ranks' own
# environment (Open MPI's OMPI_COMM_WORLD_RANK); empty when not started yet.
own_rank_pid() {
    local p
    for p in $(own_tree "$1"); do
        if tr '\0' '\n' < "/proc/$p/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$2"; then
            echo "$p"
            return
        fi
    done
}
# is_own PID: PID is still a process of this test run (it inherited this
# run's TEST_TMPDIR), not another process that reused the number.
is_own() { { tr '\0' '\n' < "/proc/$1/environ"; } 2>/dev/null | grep -qxF "TEST_TMPDIR=$TEST_TMPDIR"; }
# own_kill PID: SIGKILL to PID and everything below it (a stopped rank
# included), deepest first, so no process is left to its parent's timeout.
own_kill() {
    local tree
    tree=$(own_tree "$1" | tac)
    [ -n "$tree" ] && kill -9 $tree 2>/dev/null
    return 0
}

# stalled_pipe FIFO: a reader that stopped reading, in the background
# (FILLER_PID): it holds FIFO open and fills the pipe's buffer, then sleeps
# until killed, so a program's next write to FIFO blocks. Returns once full.
stalled_pipe() {
    rm -f "$1" && mkfifo "$1"
    python3 -c '
import os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_NONBLOCK)
for size in (4096, 1):
    try:
        while True:
            os.write(fd, b"x" * size)
    except BlockingIOError:
        pass
print("full", flush=True)
time.sleep(600)
' "$1" > "$1.filler" &
    FILLER_PID=$!
    local i
    for i in $(seq 1 100); do grep -q full "$1.filler" && break; sleep 0.1; done
}

# not_built PROGRAM: nothing when PROGRAM is built; else prints the
# error line saying which make target builds it (after `make all`, the test
# programs of `make tests` are missing: they ran as "exited 127")
not_built() {
    [ -x "$1" ] && return 1
    local backend=cpu target=all
    case $1 in "$BUILD"/cuda/*) backend=cuda ;; esac
    case $1 in */tests/*) target=tests ;; esac
    echo "error: $1 is not built: run 'make BACKEND=$backend BUILD=$BUILD all tests' (make $target builds it; make test builds everything it runs)"
}

# mpi_run [--may-fail] LIMIT NP PROGRAM ARGS...: runs PROGRAM on NP ranks
# (tests/mpirun.sh) under `timeout LIMIT`, stdin closed. Sets OUT (stdout and
# stderr together), OUT_FILE (the same bytes, NULs included; overwritten by
# the next call), RC (124 or 137 = timed out) and CMD (the full command). A
# timeout always prints the command; another non-zero exit prints it unless
# --may-fail (a run that is meant to fail, such as an error case).
mpi_run() {
    local may_fail=0 limit np
    if [ "$1" = --may-fail ]; then may_fail=1; shift; fi
    limit=$1 np=$2
    shift 2
    OUT_FILE=$TEST_TMPDIR/mpi_run$TEST_JOB.out
    CMD="$MPIRUN -np $np $*"
    # -k: an mpirun that ignores SIGTERM is killed 10 s later
    if not_built "$1" > "$OUT_FILE"; then
        RC=127 OUT=$(cat "$OUT_FILE")
        echo "  $OUT"
        return
    fi
    [ -n "${TEST_PROFILE:-}" ] && profile_start
    timeout -k 10 "$limit" $MPIRUN -np "$np" "$@" < /dev/null > "$OUT_FILE" 2>&1
    RC=$?
    [ -n "${TEST_PROFILE:-}" ] && profile_end "$np" "$*"
    OUT=$(tr -d '\0' < "$OUT_FILE")
    if [ $RC = 124 ] || [ $RC = 137 ]; then
        echo "  TIMEOUT after $limit s (a hang?), exit $RC: $CMD"
    elif [ $RC != 0 ] && [ $may_fail = 0 ]; then
        echo "  exit $RC: $CMD"
    fi
}
timed_out() { [ "$RC" = 124 ] || [ "$RC" = 137 ]; }

# TEST_PROFILE=FILE: every mpi_run appends a line to FILE, tab-separated:
# the script, the run's wall seconds, its CPU seconds (user + sys of mpirun
# and the ranks: the children this shell waited for), its ranks, its
# command and its exit code (a failed run that waited for mpirun's 2 s of
# stopping it shows as wall time without CPU time). On a shared machine a
# run's CPU time says what it costs more than its wall time. tests/run.sh
# profiles every run into its scratch folder and ends with the ten slowest;
# `sort -t$'\t' -k3 -rn FILE | head` lists the dearest runs. Measured
# without a fork: $EPOCHREALTIME and the builtin `times`, so profiling
# costs the run nothing but a file write.
profile_start() {
    PROFILE_T0=${EPOCHREALTIME/[.,]/}  # microseconds
    profile_cpu
    PROFILE_C0=$PROFILE_CPU
}
profile_end() {
    local t1=${EPOCHREALTIME/[.,]/} w c
    profile_cpu
    w=$(( (t1 - PROFILE_T0 + 5000) / 10000 )) c=$(( (PROFILE_CPU - PROFILE_C0 + 5) / 10 ))  # centiseconds
    printf '%s\t%d.%02d\t%d.%02d\t%s\t%s\t%s\n' "${0##*/}" $((w / 100)) $((w % 100)) $((c / 100)) $((c % 100)) "$1" "$2" "$RC" >> "$TEST_PROFILE"
}
# PROFILE_CPU: the CPU milliseconds (user + sys) of the children this shell
# has waited for, from the builtin `times` (written to a file: in a $(...)
# subshell it would count only the subshell's children); its second line is
# the children's "XmY.ZZZs XmY.ZZZs"
profile_cpu() {
    local f=$TEST_TMPDIR/times.$BASHPID l u s t m ms=0
    times > "$f"
    { read -r l; read -r u s; } < "$f"
    for t in "$u" "$s"; do
        m=${t%%m*} t=${t#*m} t=${t%s}
        ms=$((ms + 10#$m * 60000 + 10#${t%[.,]*} * 1000 + 10#${t#*[.,]}))
    done
    PROFILE_CPU=$ms
}

# A C test program prints PASS/FAIL lines; a crash or a hang counts as one
# failure.
run_program() {
    local prog=$1 out rc
    if out=$(not_built "$prog"); then
        fail "$(basename "$prog")" "$out"
        return
    fi
    out=$(timeout -k 10 600 "$prog" < /dev/null 2>&1)
    rc=$?
    echo "$out" | grep -E '^(PASS|FAIL)'
    passed=$((passed + $(echo "$out" | grep -c '^PASS')))
    failed=$((failed + $(echo "$out" | grep -c '^FAIL')))
    if [ $rc -ne 0 ] && ! echo "$out" | grep -q '^FAIL'; then
        fail "$(basename "$prog")" "exited $rc (124 = timed out after 600 s) without a failed check: $(echo "$out" | tail -3)"
    fi
}

# count_lines TEXT: prints and counts the PASS/FAIL/SKIP lines of another
# script's output (tests/test_plots.sh)
count_lines() {
    echo "$1" | grep -E '^(PASS|FAIL|SKIP)'
    passed=$((passed + $(echo "$1" | grep -c '^PASS')))
    failed=$((failed + $(echo "$1" | grep -c '^FAIL')))
    skipped=$((skipped + $(echo "$1" | grep -c '^SKIP')))
}

# error_case PROGRAM NP "FLAGS" "PHRASE": the run must end non-zero (not by the
# timeout), with exactly one line "error: ..." that contains PHRASE
error_case() {
    local bin=$1 np=$2 flags=$3 expect=$4 start end n peak=""
    # A training chapter measures the matmul peak (a second of every rank's
    # time) before it checks the mesh against the model; the figure is only
    # the MFU's denominator, so a refusal needs none (given first: the flags
    # under test keep their place, the last one included; the capstone trains too)
    case $bin in chapter-[02-9] | capstone) [[ " $flags " == *" --peak-gflops "* ]] || peak="--peak-gflops 10" ;; esac
    start=$(date +%s)
    # A rank that exits non-zero makes mpirun stop the job: by default it
    # sleeps 1 s, sends SIGTERM to the ranks left, sleeps 1 s more and sends
    # SIGKILL, 2 s even when every rank has already exited. Bad input ends
    # a run through MPI_Finalize (which waits for every rank) or MPI_Abort,
    # each after the one message: no wait is needed for it, and none for a
    # hang either (a rank that hangs hangs its peers' MPI_Finalize: the
    # timeout catches it as before).
    OMPI_MCA_odls_base_sigkill_timeout=0 mpi_run --may-fail $T_SHORT "$np" "$BUILD/$bin" $peak $flags
    end=$(date +%s)
    n=$(echo "$OUT" | grep -c '^error: ')
    if [ $RC -ne 0 ] && ! timed_out && [ "$n" = 1 ] && echo "$OUT" | grep '^error: ' | grep -qF -- "$expect"; then
        pass "$bin on $np rank(s), '$flags': error '$expect' ($((end - start)) s)"
    else
        fail "$bin on $np rank(s), '$flags'" "exit $RC (124 = hang), $n error lines; command: $CMD; output: $(echo "$OUT" | head -8)"
    fi
}

# help_case PROGRAM FLAG: --help lists FLAG and exits 0
help_case() {
    mpi_run $T_SHORT 1 "$BUILD/$1" --help
    if [ $RC -eq 0 ] && echo "$OUT" | grep -q -- "$2" && ! echo "$OUT" | grep -q '^error'; then
        pass "$1 --help lists $2 and exits 0"
    else
        fail "$1 --help" "exit $RC; command: $CMD; $(echo "$OUT" | head -5)"
    fi
}

# The losses of the human step lines ("step ... | loss X ..."), one a line
step_losses() { grep '^step .*| loss ' | sed 's/.*| loss \([-0-9.e]*\) .*/\1/'; }

# rank_array VALUE N -> [VALUE,VALUE,...]: a summary's per-rank array
rank_array() {
    local v=$1 N=$2 out="" i
    for ((i = 0; i < N; i++)); do out="$out${out:+,}$v"; done
    echo "[$out]"
}

# ---------------------------------------------------------------- the invariant
# Every layout reproduces chapter 0's per-step losses within TOL (DESIGN.md,
# "The invariant"). The gradient norm's tolerance is the loss tolerance scaled
# to the norm's size: 3e-5 on losses of 4.6 to 5.6 is about 6e-6 relative, and
# the reference's norms over the 10 steps of INV_FLAGS are 1.56 to 2.47, so
# 1e-5 absolute (10 times the log's printed resolution of the norm, 1e-6).
TOL=3e-5
TOL_NORM=1e-5
# The invariant's run on the test model: 10 AdamW steps of a global batch of
# 24 sequences of 32 tokens (24 splits over 1, 2, 3, 4, 6, 8 ranks).
INV_STEPS=10 INV_BATCH=24 INV_SEQ=32
INV_FLAGS="--steps $INV_STEPS --batch $INV_BATCH --seq $INV_SEQ --peak-gflops 10"

# reference "FLAGS": chapter 0 on one rank with FLAGS --log. Sets REF to the
# log's path; the run's output and exit code sit beside it ($REF.out,
# $REF.rc). Cached by FLAGS (whitespace aside) for the whole test run, so
# every chapter's invariant with the same flags shares one reference run.
reference() {
    local key lock
    key=$(echo $1 | md5sum | cut -c1-16)
    REF=$TEST_TMPDIR/ref_cache/$key.jsonl
    [ -e "$REF.rc" ] && return
    mkdir -p "$TEST_TMPDIR/ref_cache"
    # One run per key: jobs and scripts share ref_cache (jobs_run,
    # tests/run.sh, tests/homework.sh), and one that misses while another
    # makes the reference waits on the key's lock, then reads that one's.
    # (Two that ran at once renamed their files over each other's: a run
    # that failed, a timeout on a loaded machine, replaced a good log.)
    # The run does not inherit the lock's descriptor ({lock}>&-).
    exec {lock}>"$REF.lock"
    flock "$lock"
    if [ ! -e "$REF.rc" ]; then
        # written under a name of its own and moved in place, .rc last: a
        # job that finds .rc never reads a half-written log
        local tmp=$REF.$BASHPID
        mpi_run $T_RUN 1 "$BUILD/chapter-0" $1 --log "$tmp" {lock}>&-
        cp "$OUT_FILE" "$tmp.out"
        echo "$CMD" > "$tmp.cmd"
        echo $RC > "$tmp.rc"
        [ -e "$tmp" ] && mv -f "$tmp" "$REF"
        mv -f "$tmp.out" "$REF.out"
        mv -f "$tmp.cmd" "$REF.cmd"
        mv -f "$tmp.rc" "$REF.rc"
    fi
    exec {lock}>&-
}

# val_records FILE: "step val_loss" per validation record
val_records() { grep '"type":"val"' "$1" | sed 's/.*"step":\([0-9]*\),"val_loss":\([-0-9.e]*\).*/\1 \2/'; }
# compare_val REF RUN: the same validation steps, every val loss within TOL
compare_val() {
    paste <(val_records "$1") <(val_records "$2") | awk -v tol="$TOL" '
        { n++; if (NF != 4 || $1 != $3) bad = 1
          d = $2 - $4; if (d < 0) d = -d; if (d > max) max = d }
        END { printf "%d val losses, max |dval| %.2e", n, max
              exit (n >= 1 && !bad && max <= tol) ? 0 : 1 }'
}

# invariant [--norm] [--val] [--expect PHRASE] NAME "REF_FLAGS" NP PROGRAM "FLAGS"
# One check, NAME: PROGRAM ($BUILD/PROGRAM) on NP ranks with FLAGS REF_FLAGS
# exits 0 and reproduces the per-step losses of `reference "REF_FLAGS"` within
# TOL and its gradient norms within TOL_NORM, always: AdamW barely reacts to
# a gradient scaled by a constant, so the losses alone would not show one
# (--norm is accepted and changes nothing). --val: the validation losses,
# within TOL; --expect PHRASE: the output contains PHRASE. Leaves
# INV_LOG (the run's log), REF, OUT, RC and CMD for further checks of the
# same run. Example: invariant "tp=2" "$INV_FLAGS" 2 chapter-4 "--tp 2"
INV_RUNS=0
invariant() {
    local norm=1 val=0 expect="" name ref_flags np prog flags ok=1 got="" why="" cmp
    while :; do
        case $1 in
            --norm) norm=1; shift ;;
            --val) val=1; shift ;;
            --expect) expect=$2; shift 2 ;;
            *) break ;;
        esac
    done
    name=$1 ref_flags=$2 np=$3 prog=$4 flags=$5
    reference "$ref_flags"
    INV_RUNS=$((INV_RUNS + 1))
    INV_LOG=$TEST_TMPDIR/inv_$INV_RUNS$TEST_JOB.jsonl
    # the cached reference lies beside the run's own --log: a program under
    # test (a graded exercise) that rewrote it would pass by its own losses
    local ref_sum
    ref_sum=$(cat "$REF" "$REF.rc" 2> /dev/null | md5sum)
    mpi_run $T_RUN "$np" "$BUILD/$prog" $flags $ref_flags --log "$INV_LOG"
    if [ $RC -ne 0 ]; then
        ok=0
        why="exit $RC"
        timed_out && why="no end within the time limit (exit $RC: a hang)"
    fi
    if [ "$(cat "$REF" "$REF.rc" 2> /dev/null | md5sum)" != "$ref_sum" ]; then
        ok=0
        why="${why:+$why; }the program changed the reference's log ($REF): a program writes its own --log only"
    fi
    cmp=$(bash tests/compare_losses.sh "$REF" "$INV_LOG" $TOL 2>&1) || ok=0
    got="reference losses ($cmp)"
    if [ $norm = 1 ]; then
        cmp=$(bash tests/compare_losses.sh "$REF" "$INV_LOG" $TOL_NORM norm 2>&1) || ok=0
        got="$got, norms (${cmp#* steps, })"
    fi
    if [ $val = 1 ]; then
        cmp=$(compare_val "$REF" "$INV_LOG" 2>&1) || ok=0
        got="$got, validation loss ($cmp)"
    fi
    if [ -n "$expect" ]; then
        if echo "$OUT" | grep -qF -- "$expect"; then got="$got, '$expect'"
        else ok=0; got="$got, no '$expect' in the output"; fi
    fi
    if [ $ok = 1 ]; then
        pass "$name: $got"
    else
        fail "$name" "${why:+$why; }$got; command: $CMD; reference: $(cat "$REF.cmd") (exit $(cat "$REF.rc")); $(echo "$OUT" | grep -E 'error|FAIL|replicas' | head -3)"
    fi
}

# ---------------------------------------------------------------- shared files
# ref_checkpoint: chapter 0 trained 3 steps and saved (--save); sets CKPT to
# the file, CKPT_OUT to the run's output and CKPT_LOG to its --log. Made once
# per test run.
ref_checkpoint() {
    CKPT=$TEST_TMPDIR/ref.bin
    CKPT_OUT=$TEST_TMPDIR/ref.bin.out
    CKPT_LOG=$TEST_TMPDIR/ref.bin.jsonl
    if [ ! -e "$CKPT_OUT" ]; then
        mpi_run $T_RUN 1 "$BUILD/chapter-0" --steps 3 --peak-gflops 10 --save "$CKPT" --log "$CKPT_LOG"
        cp "$OUT_FILE" "$CKPT_OUT"
    fi
}
# bad_inputs: files the error cases feed the programs: text.bin (text, not a
# checkpoint or token file), truncated.bin (the first 2000 bytes of a real
# checkpoint), short.txt (5 bytes)
bad_inputs() {
    [ -e "$TEST_TMPDIR/truncated.bin" ] && return
    printf 'not a checkpoint at all, just some text that is long enough to fill a header ............................................................................................................................................................................................................................................................................................................................................................................................................................................................................................................................................................................................................................................................................................................................................................................................................................................................................................................................................................................................................................................................................................................\n' > "$TEST_TMPDIR/text.bin"
    ref_checkpoint
    head -c 2000 "$CKPT" > "$TEST_TMPDIR/truncated.bin"
    printf 'short' > "$TEST_TMPDIR/short.txt"
}

# cpu_build_copy SRC DST: SRC's CPU build (its programs, test programs,
# objects and their flag stamp) copied to DST with the time stamps kept, so
# that make in a copy of the tree recompiles only the sources that differ
# there (tests/homework.sh, grade.sh's SUBMISSION mode). The other builds
# that share SRC (cuda/, sanitize/, portable/, isa-*/, site/: 240 MB of a CI
# tree's 250) stay out: the graders build and run the CPU programs only.
cpu_build_copy() {
    local f
    mkdir -p "$2/obj"
    for f in "$1"/*; do [ -f "$f" ] && cp -a "$f" "$2/"; done
    [ -d "$1/obj/cpu" ] && cp -a "$1/obj/cpu" "$2/obj/"
    [ -d "$1/tests" ] && cp -a "$1/tests" "$2/"
    return 0
}

# ---------------------------------------------------------------- parallel checks
# Independent checks (each makes its own runs: the invariant over a list of
# meshes) run TEST_JOBS (default 2, the cores the course assumes) at a time:
#     for np in 1 2 3 4; do jobs_run my_check "$np"; done
#     jobs_wait
# jobs_run FUNCTION ARGS...: FUNCTION ARGS in a background subshell once fewer
# than TEST_JOBS run; it sees the script's variables as they were when it
# started, and what it sets is lost. jobs_wait waits for every job, then
# prints each one's output in the order they started and counts its
# PASS/FAIL/SKIP lines; a job that ended before its function returned (an
# unbound variable under set -u, an exit) fails, since the checks after that
# point never ran. A job's mpi_run and invariant files carry its number
# (TEST_JOB); the reference cache is safe to share; make the other shared
# files (ref_checkpoint, bad_inputs) before starting jobs that use them.
TEST_JOB=
TEST_JOBS=${TEST_JOBS:-2}
JOBS_STARTED=0
JOBS_SHOWN=0
JOB_WHAT=()
jobs_run() {
    while [ "$(jobs -rp | wc -l)" -ge "$TEST_JOBS" ]; do wait -n; done
    JOBS_STARTED=$((JOBS_STARTED + 1))
    local done=$TEST_TMPDIR/job_$JOBS_STARTED.done
    rm -f "$done"
    (TEST_JOB=.j$JOBS_STARTED; "$@"; echo > "$done") > "$TEST_TMPDIR/job_$JOBS_STARTED.out" 2>&1 < /dev/null &
    JOB_WHAT[$JOBS_STARTED]="$*"
}
jobs_wait() {
    local i f
    wait
    for ((i = JOBS_SHOWN + 1; i <= JOBS_STARTED; i++)); do
        f=$TEST_TMPDIR/job_$i.out
        cat "$f"
        passed=$((passed + $(grep -c '^PASS' "$f")))
        failed=$((failed + $(grep -c '^FAIL' "$f")))
        skipped=$((skipped + $(grep -c '^SKIP' "$f")))
        [ -e "$TEST_TMPDIR/job_$i.done" ] ||
            fail "job '${JOB_WHAT[$i]:0:160}'" "it ended before its checks did (an error of the test script): $(tail -2 "$f" | tr '\n' ' ')"
        rm -f "$f" "$TEST_TMPDIR/job_$i.done"
    done
    JOBS_SHOWN=$JOBS_STARTED
}
