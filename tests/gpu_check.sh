#!/bin/bash
# make gpu-check: the first-GPU-day script (docs/cuda.md, section 6).
# One command, one table: every chapter (0-7 and the capstone) on 1-2 GPU
# ranks, the risky cases on 4 (pp 4 interleaved, cp 4 ring), the op tests
# under compute-sanitizer (memcheck, racecheck, then initcheck, synccheck),
# each training run compared with the same command on the CPU backend (same
# ranks, same flags); within 15 minutes, hangs included.
#
#   bash tests/gpu_check.sh            the GPU day (make gpu-check)
#   bash tests/gpu_check.sh --list     the case list, one case a line
#   bash tests/gpu_check.sh --cpu      (or GPU_CHECK_BACKEND=cpu) the very
#                                      same cases on the CPU build: the
#                                      harness (limits, stack dumps,
#                                      comparison, table) checked without a GPU
#   GPU_CHECK_ONLY=REGEX               only the cases whose name matches
#   GPU_CHECK_CASES=FILE               the cases of FILE (the --list format)
#   GPU_CHECK_TIMEOUT=S                a case's limit unless it has its own [120]
#   GPU_CHECK_BUDGET=S                 no case runs past S s [840: 14 min]
#   GPU_CHECK_MAX_HANGS=N              after N hangs, skip the multi-rank cases [3]
#   GPU_CHECK_OUT=DIR                  where everything is kept [build/gpu-check;
#                                      the run before is kept in DIR.prev]
#
# Every device run gets NCCL_DEBUG=WARN (NCCL's warnings in the output, counted
# in the table) and NCCL_BUFFSIZE=16384: the tiny models' messages then exceed
# NCCL's buffer as a real model's do, which is when a send that waits for its
# receive shows (tests/test_cuda_queue.c). A case past its limit is a hang:
# before it is killed every rank's stacks are written (gdb, all threads),
# so the first hang on a GPU is a report and not just "exit 124".
. "$(dirname "$0")/lib.sh"

BACKEND=${GPU_CHECK_BACKEND:-cuda}
OUT_DIR=${GPU_CHECK_OUT:-$BUILD/gpu-check}
LIMIT=${GPU_CHECK_TIMEOUT:-120}
BUDGET=${GPU_CHECK_BUDGET:-840}
NCCL_ENV="NCCL_DEBUG=WARN NCCL_BUFFSIZE=16384"
# A training case's run: 10 steps of 24 sequences of 32 tokens, tiny (2
# layers) unless the case picks a model. No --peak-gflops: each run measures
# its device's matmul rate, so the MFU column is against the GPU's own rate.
TRAIN="--steps 10 --batch 24 --seq 32"
P5="--model tiny6 --batch 48"             # chapter 5: 6 layers, 2 or 3 stages
MOE="--experts 4 --top-k 2"               # chapter 7 and the capstone's experts
T8=$OUT_DIR/tiny8.bin                     # 8 layers: pp 4 x v 2 chunks of one

# ---------------------------------------------------------------- the cases
# One case a line, fields split by '|':
#   KIND | NP | NAME | PROGRAM ARGS | ENV (VAR=VALUE ...) | LIMIT (s, optional)
# KIND: train (against the same run on the CPU build: losses and gradient
#       norms within 1e-4, or chapter 7's routing-aware comparison),
#       check (chapter 1 --check: every collective against the exact result),
#       prog (a C test program: exit 0, no FAIL line), memcheck, racecheck,
#       initcheck, synccheck (compute-sanitizer's tool on the program: no
#       error), kill (a rank SIGKILLed: the job must end, not hang), speed
#       (a model less tiny, 4096 tokens a step: exit 0, for the table's
#       ms/step and MFU, where tiny's are mostly launch overhead).
# PROGRAM is a binary of the build (chapter-N, capstone, tests/test_ops).
# The order is the order of value: if the hour runs out, what ran first is
# what an engineer most wants to have seen (racecheck, minutes on a GPU,
# after the chapters; initcheck and synccheck, beyond the issue, last).
cases() {
    cat <<EOF
prog      | 1 | op tests (test_ops)                          | tests/test_ops |
memcheck  | 1 | op tests under compute-sanitizer memcheck     | tests/test_ops | | 240
train     | 1 | chapter 0                                     | chapter-0 $TRAIN |
check     | 2 | chapter 1 --check (ring shift, sendrecv)      | chapter-1 --check |
train     | 2 | chapter 2 dp=2 overlapped                     | chapter-2 $TRAIN --dp 2 --dp-mode overlapped --bucket-kb 64 |
train     | 2 | chapter 3 dp=2 ZeRO-3 prefetch                | chapter-3 $TRAIN --dp 2 --zero 3 --prefetch 1 |
train     | 2 | chapter 4 tp=2                                | chapter-4 $TRAIN --tp 2 |
train     | 2 | chapter 5 pp=2 1f1b m=4                       | chapter-5 $TRAIN $P5 --pp 2 --schedule 1f1b --microbatches 4 |
train     | 2 | chapter 5 pp=2 interleaved v=3 m=4            | chapter-5 $TRAIN $P5 --pp 2 --schedule interleaved --virtual 3 --microbatches 4 |
train     | 2 | chapter 6 cp=2 ring                           | chapter-6 $TRAIN --cp 2 |
train     | 2 | chapter 7 ep=2                                | chapter-7 $TRAIN $MOE --ep 2 |
train     | 2 | capstone ep=2 --ep-overlap 2                  | capstone $TRAIN $MOE --ep 2 --ep-overlap 2 |
train     | 2 | capstone pp=2 zb m=4                          | capstone $TRAIN $MOE --pp 2 --schedule zb --microbatches 4 |
train     | 2 | capstone cp=2 ring                            | capstone $TRAIN $MOE --cp 2 --cp-mode ring |
train     | 4 | chapter 5 pp=4 interleaved v=2 m=8 (8 layers) | chapter-5 $TRAIN --model $T8 --batch 48 --pp 4 --schedule interleaved --virtual 2 --microbatches 8 |
train     | 4 | chapter 6 cp=4 ring                           | chapter-6 $TRAIN --cp 4 |
train     | 4 | capstone cp=4 ring zigzag                     | capstone $TRAIN $MOE --cp 4 --cp-balance zigzag |
train     | 4 | capstone ep=2 x pp=2 zb --ep-overlap 2        | capstone $TRAIN $MOE --ep 2 --pp 2 --schedule zb --microbatches 4 --ep-overlap 2 |
check     | 4 | chapter 1 --check                             | chapter-1 --check |
racecheck | 1 | op tests under compute-sanitizer racecheck    | tests/test_ops | | 300
prog      | 2 | FSDP engine (test_fsdp)                       | tests/test_fsdp |
prog      | 4 | comm layer (test_comm)                        | tests/test_comm |
train     | 2 | chapter 2 dp=2 naive                          | chapter-2 $TRAIN --dp 2 --dp-mode naive |
train     | 2 | chapter 3 dp=2 ZeRO-1                         | chapter-3 $TRAIN --dp 2 --zero 1 |
train     | 2 | chapter 3 dp=2 ZeRO-3 --recompute full        | chapter-3 $TRAIN --dp 2 --zero 3 --recompute full |
train     | 2 | chapter 5 pp=2 gpipe m=4                      | chapter-5 $TRAIN $P5 --pp 2 --schedule gpipe --microbatches 4 |
train     | 2 | chapter 5 pp=2 zb m=4                         | chapter-5 $TRAIN $P5 --pp 2 --schedule zb --microbatches 4 |
train     | 2 | chapter 6 cp=2 ulysses                        | chapter-6 $TRAIN --cp 2 --cp-mode ulysses |
train     | 2 | chapter 6 cp=2 ring zigzag, overlap off       | chapter-6 $TRAIN --cp 2 --cp-balance zigzag --cp-overlap 0 |
train     | 2 | chapter 6 tp=2 sp                             | chapter-6 $TRAIN --tp 2 --sp |
train     | 2 | chapter 7 ep=2 capacity 1.0 (drops)           | chapter-7 $TRAIN --experts 2 --capacity-factor 1.0 --ep 2 |
train     | 2 | chapter 7 ep=2 experts 8 top-1 (empty sends)  | chapter-7 $TRAIN --experts 8 --top-k 1 --ep 2 |
train     | 2 | chapter 7 ep=2 --ep-overlap 2                 | chapter-7 $TRAIN $MOE --ep 2 --ep-overlap 2 |
train     | 2 | capstone pp=2 interleaved v=3 m=4             | capstone $TRAIN $MOE --model tiny6 --pp 2 --schedule interleaved --virtual 3 --microbatches 4 |
train     | 2 | capstone tp=2                                 | capstone $TRAIN $MOE --tp 2 |
train     | 4 | chapter 4 dp=2 x tp=2 ZeRO-3                  | chapter-4 $TRAIN --dp 2 --tp 2 --zero 3 |
train     | 4 | chapter 5 dp=2 x pp=2 interleaved v=3 m=4     | chapter-5 $TRAIN $P5 --dp 2 --pp 2 --schedule interleaved --virtual 3 --microbatches 4 |
train     | 4 | chapter 7 dp=2 x ep=2                         | chapter-7 $TRAIN $MOE --dp 2 --ep 2 |
train     | 4 | capstone tp=2 x pp=2 zb                       | capstone $TRAIN $MOE --tp 2 --pp 2 --schedule zb --microbatches 4 |
train     | 4 | chapter 6 dp=2 x cp=2 ring zigzag (dp+cp group) | chapter-6 $TRAIN --dp 2 --cp 2 --cp-balance zigzag |
train     | 3 | chapter 5 pp=3 interleaved v=2 m=6            | chapter-5 $TRAIN $P5 --pp 3 --schedule interleaved --virtual 2 --microbatches 6 |
train     | 3 | chapter 5 pp=3 1f1b m=6                       | chapter-5 $TRAIN $P5 --pp 3 --schedule 1f1b --microbatches 6 |
train     | 2 | chapter 3 dp=2 ZeRO-2                         | chapter-3 $TRAIN --dp 2 --zero 2 |
train     | 2 | chapter 2 dp=2 --trace                        | chapter-2 $TRAIN --dp 2 --trace $OUT_DIR/trace.json |
train     | 2 | chapter 5 interleaved, shared stream, NCCL buffer | chapter-5 $TRAIN $P5 --pp 2 --schedule interleaved --virtual 3 --microbatches 4 | NCCL_LAUNCH_ORDER_IMPLICIT=0 NCCL_BUFFSIZE=4194304
train     | 2 | chapter 6 cp=2 ring, shared stream, NCCL buffer   | chapter-6 $TRAIN --cp 2 | NCCL_LAUNCH_ORDER_IMPLICIT=0 NCCL_BUFFSIZE=4194304
train     | 2 | chapter 6 cp=2 ring, CUDA_LAUNCH_BLOCKING (no channels) | chapter-6 $TRAIN --cp 2 | CUDA_LAUNCH_BLOCKING=1
train     | 2 | chapter 5 interleaved, split comms share resources (no channels) | chapter-5 $TRAIN $P5 --pp 2 --schedule interleaved --virtual 3 --microbatches 4 | NCCL_COMM_SPLIT_SHARE_RESOURCES=1
train     | 2 | chapter 5 1f1b, lazy module loading (no channels) | chapter-5 $TRAIN $P5 --pp 2 --schedule 1f1b --microbatches 4 | CUDA_MODULE_LOADING=LAZY
kill      | 2 | chapter 2 dp=2, rank 1 killed at step 3       | chapter-2 --dp 2 --steps 50 --ckpt-dir $OUT_DIR/kill_ckpt --save-every 2 | CKPT_KILL=step:3:1
speed     | 1 | chapter 0 small (speed)                       | chapter-0 --model small --batch 16 --seq 256 --steps 5 |
speed     | 1 | chapter 0 small --tf32 (speed, beside fp32)   | chapter-0 --model small --batch 16 --seq 256 --steps 5 --tf32 |
speed     | 2 | chapter 2 small dp=2 overlapped (speed)       | chapter-2 --model small --batch 16 --seq 256 --steps 5 --dp 2 --dp-mode overlapped |
initcheck | 1 | op tests under compute-sanitizer initcheck     | tests/test_ops | | 240
synccheck | 1 | op tests under compute-sanitizer synccheck     | tests/test_ops | | 240
EOF
}
# (the shared-stream cases run with NCCL's default 4 MiB buffer: under one
# stream for every communicator the model finds deadlocks above the buffer,
# docs/notes/cuda.md, so a small buffer there would test what is known)

case ${1:-} in
    --list) if [ -n "${GPU_CHECK_CASES:-}" ]; then cat "$GPU_CHECK_CASES"; else cases; fi
            exit 0 ;;
    --cpu) BACKEND=cpu ;;
    "") ;;
    *) sed -n '2,/^$/s/^# \{0,1\}//p' "$0"; exit 2 ;;
esac

echo "== GPU check ($BACKEND backend)"
T0=$SECONDS
# the run before stays, as DIR.prev: a rerun of a few cases (GPU_CHECK_ONLY)
# must not lose the full run's stacks; a folder that is not a gpu-check's
# output is never removed
if [ -e "$OUT_DIR" ]; then
    if [ ! -e "$OUT_DIR/env.txt" ] && [ -n "$(ls -A "$OUT_DIR" 2>/dev/null)" ]; then
        echo "error: $OUT_DIR is not a gpu-check output (no env.txt): set GPU_CHECK_OUT to another folder" >&2
        exit 2
    fi
    rm -rf "$OUT_DIR.prev"
    mv "$OUT_DIR" "$OUT_DIR.prev"
fi
mkdir -p "$OUT_DIR/cases"
SUMMARY=$OUT_DIR/summary.txt
ROWS=$OUT_DIR/rows.txt
: > "$ROWS"

# ---------------------------------------------------------------- the machine
# env.txt: what the results were measured on, sent back with them
{
    echo "date: $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
    echo "commit: $(git rev-parse HEAD 2>/dev/null) $(git status --porcelain 2>/dev/null | grep -q . && echo '(with local changes)')"
    echo "host: $(uname -nrm)"
    echo "cpus: $(nproc 2>/dev/null)"
    if command -v nvidia-smi >/dev/null; then
        nvidia-smi 2>&1 | head -20
        nvidia-smi topo -m 2>&1
    else
        echo "nvidia-smi: not found (no NVIDIA driver here)"
    fi
    (command -v nvcc || ls /usr/local/cuda/bin/nvcc) >/dev/null 2>&1 && { nvcc --version 2>/dev/null || /usr/local/cuda/bin/nvcc --version; } | tail -2
    # the libraries' full versions: the names their links resolve to
    for l in $(ldconfig -p 2>/dev/null | grep -oE '/[^ ]*lib(nccl|cublas|cudart)\.so[.0-9]*$'); do
        readlink -f "$l"
    done | sort -u
    mpirun --version 2>&1 | head -1
} > "$OUT_DIR/env.txt" 2>&1

gpus=0
missing=""
# GPU_CHECK_SANITIZER: another compute-sanitizer; in cpu mode, a stand-in
# that takes its options (a check of the harness's sanitizer rows)
SANITIZER=${GPU_CHECK_SANITIZER:-$(command -v compute-sanitizer 2>/dev/null || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null)}
if [ "$BACKEND" = cpu ]; then
    # the same cases, the "device" run on the CPU build: what this checks is
    # the harness, not the CUDA backend (its runs equal their references)
    DEV=$BUILD
    echo "GPU_CHECK_BACKEND=cpu: the GPU cases run on the CPU build (the harness, not the GPU, is checked)"
elif [ "$BACKEND" = cuda ]; then
    DEV=$BUILD/cuda  # the Makefile's BIN for BACKEND=cuda under BUILD
    gpus=$(visible_gpus)  # tests/lib.sh: CUDA_VISIBLE_DEVICES counts
    if [ "$gpus" = 0 ]; then
        missing="no GPU here (nvidia-smi -L lists none, or CUDA_VISIBLE_DEVICES hides them)"
        echo "no GPU here (nvidia-smi -L lists none, or CUDA_VISIBLE_DEVICES hides them): every case is skipped (GPU_CHECK_BACKEND=cpu runs them on the CPU)"
    elif ! make --no-print-directory -j"$(nproc 2>/dev/null || echo 2)" BUILD="$BUILD" BACKEND=cuda all \
            "$DEV/tests/test_ops" "$DEV/tests/test_comm" "$DEV/tests/test_fsdp" >"$OUT_DIR/cuda-build.log" 2>&1; then
        fail "CUDA build" "$(grep -E 'error' "$OUT_DIR/cuda-build.log" | head -3)"
        missing="the CUDA build failed ($OUT_DIR/cuda-build.log)"
    else
        echo "$gpus GPU(s): $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | sort | uniq -c | sed 's/^ *//' | paste -sd, -)"
    fi
else
    echo "GPU_CHECK_BACKEND=$BACKEND: not cuda or cpu" >&2
    exit 2
fi
# the references and the cpu mode's runs: the CPU build and its test programs
if [ -z "$missing" ] && ! make --no-print-directory -j"$(nproc 2>/dev/null || echo 2)" BUILD="$BUILD" BACKEND=cpu all \
        "$BUILD/tests/test_ops" "$BUILD/tests/test_comm" "$BUILD/tests/test_fsdp" >"$OUT_DIR/cpu-build.log" 2>&1; then
    fail "CPU build" "$(grep -E 'error' "$OUT_DIR/cpu-build.log" | head -3)"
fi

# tiny8.bin: tiny with 8 layers (an llm.c model file, random weights), the
# smallest model that pp 4 cuts into 2 interleaved chunks a rank
[ -z "$missing" ] && python3 "$(dirname "$0")/make_model.py" "$T8" 256 256 64 8 4 64

# ---------------------------------------------------------------- one run
# dump_stacks PID NP DIR: every rank of the job under PID, all threads, into
# DIR/stack.rankN.txt, taken at once (the ranks side by side, so the stacks
# are one moment of the job). A rank is every process that carries its
# OMPI_COMM_WORLD_RANK: under compute-sanitizer, the tool and the program.
# Prints one line a rank: its main thread's frames (stack_where), so the
# table's reader sees where each rank waits.
dump_stacks() {
    local pid=$1 np=$2 dir=$3 r ps f jobs=()
    for ((r = 0; r < np; r++)); do
        ps=$(rank_pids "$pid" $r)
        f=$dir/stack.rank$r.txt
        if [ -z "$ps" ]; then
            echo "rank $r: no process (not started, or already gone)" > "$f"
        else
            (for p in $ps; do stack_of "$p"; done > "$f" 2>&1) &
            jobs+=($!)
        fi
    done
    # only the dumps: the job itself is still running (and hung)
    [ ${#jobs[@]} -gt 0 ] && wait "${jobs[@]}"
    command -v nvidia-smi >/dev/null && nvidia-smi > "$dir/nvidia-smi.txt" 2>&1
    for ((r = 0; r < np; r++)); do
        echo "    rank $r: $(stack_where "$dir/stack.rank$r.txt")"
    done
}
# rank_pids PID RANK: every process of MPI rank RANK under PID, parents first
rank_pids() {
    local p
    for p in $(own_tree "$1"); do
        tr '\0' '\n' < "/proc/$p/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$2" && echo "$p"
    done
}
# stack_of PID: one process's stacks, every thread: gdb's (-nx: no
# ~/.gdbinit; the CUDA driver's and NCCL's threads are listed too), or
# where there is no gdb, or it may not attach (a container without ptrace),
# each thread's kernel stack and wait channel from /proc.
# GPU_CHECK_GDB: another gdb (false: the /proc fallback, for its test)
stack_of() {
    local t out gdb=${GPU_CHECK_GDB:-gdb}
    echo "== pid $1: $(tr '\0' ' ' < "/proc/$1/cmdline" 2>/dev/null | cut -c1-200)"
    if command -v "$gdb" >/dev/null; then
        out=$(timeout 60 "$gdb" -batch -nx -p "$1" -ex 'set pagination off' -ex 'info threads' \
            -ex 'thread apply all bt' 2>&1)
        echo "$out"
        echo "$out" | grep -q '^Thread 1 ' && return
        echo "gdb read no stack (ptrace not permitted?): kernel stacks from /proc"
    else
        echo "no gdb: kernel stacks from /proc (apt-get install gdb for the program's own frames)"
    fi
    for t in /proc/"$1"/task/*; do
        echo "-- thread ${t##*/} $(cat "$t/comm" 2>/dev/null), wchan $(cat "$t/wchan" 2>/dev/null)"
        cat "$t/stack" 2>/dev/null
    done
}
# stack_where FILE: the main thread's frames (gdb's "Thread 1"; of the last
# process dumped, the program rather than a tool that runs it), function
# names, innermost first: the two where it waits and, past the library's
# own, the last five, which name the course's function that called it
stack_where() {
    local w
    w=$(awk '/^Thread 1 /{ on = 1; n = 0; next } /^Thread /{ on = 0 }
             on && /^#[0-9]/ { f = ""
                               for (i = 1; i <= NF; i++) if ($i == "in") { f = $(i + 1); break }
                               if (f == "" && /^#[0-9]+ +[a-zA-Z_]/) f = $2
                               if (f != "") fr[n++] = f }
             END { for (i = 0; i < n; i++)
                       if (n <= 7 || i < 2 || i >= n - 5) printf "%s%s", (i ? " < " : ""), fr[i]
                       else if (i == 2) printf " < ..." }' "$1")
    [ -n "$w" ] && { echo "$w"; return; }
    # no gdb stack: the main thread's wait channel from /proc, or what the
    # file says (a rank that was not running)
    w=$(awk '/^== pid/ { m = "" } /^-- thread/ && m == "" { m = $0 } END { print m }' "$1")
    [ -n "$w" ] && echo "no gdb stack; main thread${w#-- thread}" || head -1 "$1"
}

# watch_run LIMIT DIR NP ENV PROGRAM ARGS...: PROGRAM on NP ranks with ENV
# (VAR=VALUE words) under a limit of LIMIT s. Sets RC (124 past the limit,
# after the stacks of every rank are in DIR), SECS (wall seconds) and
# WHERE (the dump's lines). Output in DIR/out.txt.
watch_run() {
    local limit=$1 dir=$2 np=$3 envs=$4 pid t0=$SECONDS
    shift 4
    mkdir -p "$dir"
    echo "$envs $MPIRUN -np $np $*" > "$dir/cmd.txt"
    WHERE=""
    if ! not_built "$1" > "$dir/out.txt"; then
        # shellcheck disable=SC2086
        env $envs $MPIRUN -np "$np" "$@" < /dev/null > "$dir/out.txt" 2>&1 &
        pid=$!
        # poll rather than `timeout`: the ranks must still be alive when
        # their stacks are taken
        while kill -0 $pid 2>/dev/null && [ $((SECONDS - t0)) -lt "$limit" ]; do sleep 0.5; done
        if kill -0 $pid 2>/dev/null; then
            WHERE=$(dump_stacks $pid "$np" "$dir")
            own_kill $pid
            wait $pid 2>/dev/null
            RC=124
        else
            wait $pid
            RC=$?
        fi
    else
        RC=127
    fi
    SECS=$((SECONDS - t0))
}

# field NAME FILE: a number of the run's summary record, or -
field() {
    local v
    v=$(grep '"type":"summary"' "$2" 2>/dev/null | grep -o "\"$1\":[-0-9.e]*" | head -1 | cut -d: -f2)
    echo "${v:--}"
}
# row RESULT NP NAME SECS DLOSS DNORM MS CPUMS MFU WARN NOTE: a line of the table
row() {
    printf '%-8s %2s  %-50.50s %4s %9s %9s %9s %9s %6s %4s %-26s %s\n' "$@" >> "$ROWS"
}
# figure LOG: the chapter's own figure of the run, "name value": chapter 5's
# measured bubble, the experts' all-to-all share hidden behind compute
# (-1 where the layout has none), the ring's wait, or the comm wait
figure() {
    local f v
    for f in bubble_measured:bubble a2a_hidden_share:a2a_hidden ring_wait_ms_per_step:ring_wait_ms \
             comm_wait_ms_per_step:comm_wait_ms; do
        v=$(field "${f%%:*}" "$1")
        [ "$v" != - ] && [ "$v" != -1.0000 ] && { echo "${f#*:} $v"; return; }
    done
    echo -
}

# ---------------------------------------------------------------- the references
# Every train case's reference: the same command on the CPU build, the same
# ranks, cached by program, ranks and flags (the shared-stream variants share
# theirs). Run first, several at a time (CPU cores are not what the GPU runs
# need): GPU_CHECK_JOBS at a time [a quarter of the cores, 1 to 8].
ALL=$OUT_DIR/cases.txt
if [ -n "${GPU_CHECK_CASES:-}" ]; then cp "$GPU_CHECK_CASES" "$ALL"; else cases > "$ALL"; fi
trim() { local s=$1; s=${s#"${s%%[![:space:]]*}"}; echo "${s%"${s##*[![:space:]]}"}"; }
selected() { [ -z "${GPU_CHECK_ONLY:-}" ] || echo "$1" | grep -qE -- "$GPU_CHECK_ONLY"; }
ref_key() { echo "$1 $2" | md5sum | cut -c1-12; }
JOBS=${GPU_CHECK_JOBS:-$(( $(nproc 2>/dev/null || echo 4) / 4 ))}
[ "$JOBS" -lt 1 ] && JOBS=1
[ "$JOBS" -gt 8 ] && JOBS=8
if [ -z "$missing" ]; then
    nref=0
    while IFS='|' read -r kind np name cmd envs lim; do
        kind=$(trim "$kind") np=$(trim "$np") name=$(trim "$name") cmd=$(trim "$cmd") lim=$(trim "$lim")
        if [ "$kind" != train ] || ! selected "$name"; then continue; fi
        [ "$BACKEND" = cuda ] && [ "$gpus" -lt "$np" ] && continue
        d=$OUT_DIR/refs/$(ref_key "$np" "$cmd")
        [ -d "$d" ] && continue
        mkdir -p "$d"
        while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do wait -n; done
        # each reference on its share of the cores (JOBS of them side by
        # side): its "cpu ms" is then not a fight for cores. The comparison
        # holds whatever the threads (chapter 0 at 1 and 2: the same bits)
        thr=$(( $(nproc 2>/dev/null || echo 2) / (JOBS * np) ))
        [ $thr -lt 1 ] && thr=1
        # shellcheck disable=SC2086
        (watch_run "${lim:-$LIMIT}" "$d" "$np" "" "$BUILD/"$cmd --threads $thr --log "$d/log.jsonl"
         echo "$RC $SECS" > "$d/rc"; [ -n "$WHERE" ] && echo "$WHERE" > "$d/where") &
        nref=$((nref + 1))
    done < <(grep -v '^ *#' "$ALL")
    wait
    echo "CPU references: $nref run(s) in $((SECONDS - T0)) s ($JOBS at a time), in $OUT_DIR/refs"
fi

# ---------------------------------------------------------------- the cases
# Device runs leave the tests' sleeping-yield preload out (tests/mpirun.sh):
# a GPU rank's host threads should wait as they will in a real job.
unset TEST_YIELD_SLEEP_LIB
# After MAX_HANGS hangs the multi-rank cases left are skipped: when the
# first ones all hang (NCCL cannot connect, say) the rest would most likely
# hang too, each for its whole limit, and the hour is better spent on the
# stacks already taken. The 1-rank cases still run.
MAX_HANGS=${GPU_CHECK_MAX_HANGS:-3}
hangs=0
total=$(grep -v '^ *#' "$ALL" | grep -c '|')
n=0
while IFS='|' read -r kind np name cmd envs lim; do
    kind=$(trim "$kind") np=$(trim "$np") name=$(trim "$name") cmd=$(trim "$cmd") envs=$(trim "$envs") lim=$(trim "$lim")
    [ -z "$kind" ] && continue
    selected "$name" || continue
    n=$((n + 1))
    dir=$OUT_DIR/cases/$(printf '%02d' $n)-$(echo "$name" | tr -c 'a-zA-Z0-9=.\n' '_' | tr -s _ | cut -c1-60)
    label="$name on $np rank(s)"
    if [ -n "$missing" ]; then skip "$label" "$missing"; row SKIP "$np" "$name" - - - - - - - - "$missing"; continue; fi
    if [ "$BACKEND" = cuda ] && [ "$gpus" -lt "$np" ]; then
        skip "$label" "$gpus GPU(s) here, one rank a GPU (NCCL refuses two ranks of a communicator on one GPU)"
        row SKIP "$np" "$name" - - - - - - - - "needs $np GPUs"; continue
    fi
    if [ $hangs -ge "$MAX_HANGS" ] && [ "$np" -gt 1 ]; then
        skip "$label" "after $hangs hangs (GPU_CHECK_MAX_HANGS=$MAX_HANGS): read their stacks first"
        row SKIP "$np" "$name" - - - - - - - - "after $hangs hangs"; continue
    fi
    # where the run is, on a terminal (an hour goes fast)
    [ -t 2 ] && printf '[%d/%d, %d s] %s on %d rank(s)\n' $n "$total" $((SECONDS - T0)) "$name" "$np" >&2
    # the budget: no case starts after BUDGET s, and none runs past it (its
    # limit is cut to what is left), so with the last dump (at most 60 s)
    # the whole check ends within BUDGET + 60 s: 15 minutes by default
    left=$((BUDGET - (SECONDS - T0)))
    if [ $left -le 0 ]; then
        skip "$label" "past the budget of $BUDGET s (GPU_CHECK_BUDGET)"
        row SKIP "$np" "$name" - - - - - - - - "budget"; continue
    fi
    cut=""
    [ "${lim:-$LIMIT}" -gt $left ] && lim=$left cut=" (the limit cut to the $left s left of GPU_CHECK_BUDGET)"
    prog=${cmd%% *}
    args=${cmd#"$prog"}
    envs="$NCCL_ENV $envs"
    case $kind in
    memcheck|racecheck|initcheck|synccheck)
        if [ "$BACKEND" = cpu ] && [ -z "${GPU_CHECK_SANITIZER:-}" ]; then
            skip "$label" "compute-sanitizer checks CUDA kernels: not in cpu mode"
            row SKIP "$np" "$name" - - - - - - - - "cpu mode"; continue
        elif [ -z "$SANITIZER" ]; then
            skip "$label" "compute-sanitizer not found (PATH, /usr/local/cuda/bin)"
            row SKIP "$np" "$name" - - - - - - - - "no compute-sanitizer"; continue
        fi
        # shellcheck disable=SC2086
        watch_run "${lim:-$LIMIT}" "$dir" "$np" "$envs" "$SANITIZER" --tool $kind --error-exitcode 99 \
            --print-limit 20 "$DEV/$prog" $args
        ;;
    train|speed)
        # shellcheck disable=SC2086
        watch_run "${lim:-$LIMIT}" "$dir" "$np" "$envs" "$DEV/$prog" $args --log "$dir/log.jsonl" ;;
    *)
        # shellcheck disable=SC2086
        watch_run "${lim:-$LIMIT}" "$dir" "$np" "$envs" "$DEV/$prog" $args ;;
    esac
    out=$dir/out.txt
    warn=$(grep -c 'NCCL WARN' "$out")
    why="exit $RC" note="" dl=- dn=- ms=- cms=- mfu=- fig=- ok=0
    [ $RC = 124 ] && why="no end in ${lim:-$LIMIT} s$cut (a hang?): stacks of every rank in $dir"
    case $kind in
    train)
        ref=$OUT_DIR/refs/$(ref_key "$np" "$cmd")
        read -r rrc _ < "$ref/rc"
        ms=$(field ms_per_step "$dir/log.jsonl") cms=$(field ms_per_step "$ref/log.jsonl") mfu=$(field mfu "$dir/log.jsonl")
        fig=$(figure "$dir/log.jsonl")
        [ "$fig" != - ] && fig="$fig / $(figure "$ref/log.jsonl" | cut -d' ' -f2)"
        # chapter 7's models route: a near-tie that picks another expert on
        # the GPU is not a bug (tests/compare_routing.sh); the dense ones
        # compare loss and norm step by step. 1e-4: the two backends add in
        # other orders (the CPU tests' 3e-5 is for one backend).
        if grep -q '"expert_tokens"' "$ref/log.jsonl" 2>/dev/null; then
            note=$(bash tests/compare_routing.sh "$ref/log.jsonl" "$dir/log.jsonl" 1e-4 1e-4 2>&1) && cmp_ok=1 || cmp_ok=0
            dl=$(echo "$note" | grep -o 'max |dloss| [0-9.e+-]*' | awk '{print $3}')
            dn=$(echo "$note" | grep -o 'max |dnorm| [0-9.e+-]*' | awk '{print $3}')
            note=$(echo "$note" | grep -o '(routing[^)]*)' | head -1)
        else
            l=$(bash tests/compare_losses.sh "$ref/log.jsonl" "$dir/log.jsonl" 1e-4 2>&1) && l_ok=1 || l_ok=0
            m=$(bash tests/compare_losses.sh "$ref/log.jsonl" "$dir/log.jsonl" 1e-4 norm 2>&1) && m_ok=1 || m_ok=0
            dl=$(echo "$l" | awk '{print $5}') dn=$(echo "$m" | awk '{print $5}')
            cmp_ok=$((l_ok * m_ok))
            [ $cmp_ok = 1 ] || note="$l; $m"
        fi
        if [ "$rrc" != 0 ]; then why="the CPU reference failed (exit $rrc: $ref)"
        elif [ $RC = 0 ] && [ $cmp_ok = 1 ]; then ok=1
        elif [ $RC = 0 ]; then why="not the CPU's numbers"
        fi ;;
    speed)
        ms=$(field ms_per_step "$dir/log.jsonl") mfu=$(field mfu "$dir/log.jsonl") fig=$(figure "$dir/log.jsonl")
        [ $RC = 0 ] && [ "$ms" != - ] && ok=1 note="no CPU comparison: the time is the point" ;;
    check)
        s=$(grep -o "check summary: \([0-9]*\) of \1 collective runs match on $np ranks$" "$out")
        [ $RC = 0 ] && [ -n "$s" ] && ok=1
        note=${s:-$(grep -E 'check summary|FAIL' "$out" | head -1)} ;;
    prog)
        note="$(grep -c '^PASS' "$out") PASS, $(grep -c '^FAIL' "$out") FAIL"
        [ $RC = 0 ] && ! grep -q '^FAIL' "$out" && ok=1 ;;
    memcheck|racecheck|initcheck|synccheck)
        # memcheck, initcheck and synccheck end with "ERROR SUMMARY: N
        # errors"; racecheck with its own "RACECHECK SUMMARY: N hazards
        # displayed (E errors, W warnings)"
        note=$(grep -oE '(ERROR|RACECHECK) SUMMARY: .*' "$out" | tail -1)
        [ $RC = 0 ] && echo "$note" | grep -qE '^(ERROR SUMMARY: 0 errors|RACECHECK SUMMARY: 0 hazards)' && ok=1 ;;
    kill)
        # the job ends (not a hang, not exit 0), and it was the kill that ended it
        if [ $RC != 0 ] && [ $RC != 124 ] && grep -q CKPT_KILL "$out"; then ok=1; note="ended with exit $RC"; fi ;;
    esac
    [ "$warn" = 0 ] || note="$note${note:+; }$(grep -m1 'NCCL WARN' "$out" | sed 's/.*NCCL WARN *//' | cut -c1-60)"
    if [ $ok = 1 ]; then
        pass "$label (${SECS} s${note:+: $note})"
        row PASS "$np" "$name" "$SECS" "${dl:--}" "${dn:--}" "$ms" "$cms" "$mfu" "$warn" "$fig" "$note"
    else
        result=FAIL
        # a sanitizer past its limit is more likely slow (kernels run tens
        # of times slower under it) than hung: not counted as a hang
        if [ $RC = 124 ]; then
            result=TIMEOUT
            case $kind in
                memcheck|racecheck|initcheck|synccheck) ;;
                *) hangs=$((hangs + 1)) ;;
            esac
        fi
        fail "$label" "$why; $(cat "$dir/cmd.txt"); $(grep -E '^error|FAIL' "$out" | head -2)"
        [ -n "$WHERE" ] && echo "$WHERE"
        [ $RC = 124 ] && note="no end in ${lim:-$LIMIT} s${cut:+ (budget)}: stacks in ${dir#"$OUT_DIR/"}"
        row $result "$np" "$name" "$SECS" "${dl:--}" "${dn:--}" "$ms" "$cms" "$mfu" "$warn" "$fig" "${note:-$why}"
        [ -n "$WHERE" ] && echo "$WHERE" >> "$ROWS"
    fi
done < <(grep -v '^ *#' "$ALL")

# ---------------------------------------------------------------- the table
{
    echo
    echo "GPU check, $BACKEND backend, $(date -u '+%Y-%m-%d %H:%M UTC'), $((SECONDS - T0)) s"
    # NCCL prints its version at NCCL_DEBUG=WARN as at VERSION (showVersion,
    # NCCL's src/init.cc): the version the runs loaded, not the one linked
    nccl=$(cat "$OUT_DIR"/cases/*/out.txt 2>/dev/null | grep -o -m1 'NCCL version [^ ]*')
    [ -n "$nccl" ] && echo "$nccl; $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | sort | uniq -c | sed 's/^ *//' | paste -sd';' -)"
    printf '%-8s %2s  %-50s %4s %9s %9s %9s %9s %6s %4s %-26s %s\n' result np case s "|dloss|" "|dnorm|" \
        "ms/step" "cpu ms" mfu warn "figure (gpu / cpu)" note
    cat "$ROWS"
    echo "(|dloss|, |dnorm|: largest step difference from the same run on the CPU build, bound 1e-4;"
    echo " cpu ms: that run's, $JOBS at a time on a share of the $(nproc 2>/dev/null) cores each;"
    echo " warn: NCCL WARN lines; figure: chapter 5's measured bubble, the share of the experts'"
    echo " all-to-all hidden behind compute, the ring's wait or the comm wait, in ms a step;"
    echo " every case's output, log and stacks under $OUT_DIR/cases)"
} > "$SUMMARY"
cat "$SUMMARY"
# what to send back: one file
tar -czf "$OUT_DIR.tar.gz" --exclude='*.bin' -C "$(dirname "$OUT_DIR")" "$(basename "$OUT_DIR")" 2>/dev/null &&
    echo "send back: $OUT_DIR.tar.gz ($(du -h "$OUT_DIR.tar.gz" | cut -f1))"
finish
