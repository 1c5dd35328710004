#!/bin/bash
# bench.sh: the sweep behind the plots in docs/plots/ (`make bench` runs it).
#
# Every run is one program on the `small` preset (or chapter 1's collective
# bench), launched with tests/mpirun.sh, logging JSONL into docs/plots/data/,
# one file per run, named after what it is:
#
#   ch0_reference_np1          chapter 0, one rank: the yardstick
#   collectives_npP            chapter 1 --bench, 8 B .. 256 MiB, P = 2 and 4 ranks
#                              (and its console table, collectives_npP.txt)
#   ch2_MODE_dp2               chapter 2, each --dp-mode at dp=2 (global batch 8 x 256)
#   ch2_ps_dp4                 the parameter server at dp=4: its cost grows with the ranks
#   ch2_overlapped_dpN         strong scaling: overlapped at dp = 1, 2, 4, global batch 8
#   ch2_overlapped_dpN_bB      weak scaling: 4 sequences per rank (dp=1 batch 4, dp=4
#                              batch 16; dp=2 batch 8 is ch2_overlapped_dp2)
#   ch3_zeroZ_dpN              chapter 3, --zero 1, 2, 3 at dp = 2 and 4, and ZeRO-3 at
#                              dp = 1 (memory per rank against N = 1, 2, 4)
#   ch4_tpT_dpD                chapter 4 (ZeRO-3 over dp): (tp, dp) = (1, 2), (2, 1),
#                              (1, 4), (2, 2), (3, 1): tp x dp ranks against chapter 3
#   ch6_MODE_BAL_cp2           chapter 6, context parallelism at cp = 2: the ring
#                              (zigzag) and Ulysses
#   ch6_sp_tp2_dp1             chapter 6, sequence parallelism (--tp 2 --sp), beside
#                              ch4_tp2_dp1
#   ch7_e4k1_epN               chapter 7, 4 experts, top-1 (the dense model's active
#                              parameters), ep = 1 and 4
#   attention_bB_tT            build/attention_bench: attention forward + backward,
#                              the (B, NH, T, T) op against the O(T)-memory one
#                              (attention_flash_*, issue 46), alternated in one
#                              process: the small preset's layer at B 8 x T 256
#                              (the longest its maxT allows) and at B 2 x T 1024
#                              (the same tokens, a longer context)
#   ch7_e4k1_AXES              the same model on 4 ranks of two axes composed:
#                              ep2_tp2, ep2_pp2, tp2_pp2 (issue #35), by build/capstone
#                              (chapter 7's model on every axis; its summaries say
#                              chapter 7, so the runs keep chapter 7's names)
#
# A chapter's runs are in the sweep only if its binary ($BIN/chapter-N, or
# $BIN/capstone) exists.
# Each run first writes a temporary file and replaces the old one only when it
# succeeds. Every run's console output is kept in build/plots/logs/NAME.out.
# At the end sweep.txt in the data folder lists the runs, their command lines,
# the machine and its load (a load: line per time runs were made, which a
# partial rerun adds to): plots.sh reads it.
#
# Environment: BIN (build), OUT (docs/plots/data), STEPS (5; the programs time
# steps 2..STEPS), ONLY (run only the runs whose name matches this extended
# regular expression, e.g. ONLY='^ch' for every training run; sweep.txt then
# keeps the other runs' lines and notes the partial rerun).
set -u
cd "$(dirname "$0")/../.."
BIN=${BIN:-build}
OUT=${OUT:-docs/plots/data}
STEPS=${STEPS:-5}
ONLY=${ONLY:-}
LOGS=build/plots/logs
MPIRUN="bash tests/mpirun.sh"
mkdir -p "$OUT" "$LOGS"

TRAIN="--model small --steps $STEPS --val-batches 1"

names=()
nps=()
cmds=()
# add NAME NP ARGS...: one run, if its program exists
add() {
    local name=$1 np=$2
    shift 2
    if [ -n "$ONLY" ] && ! [[ "$name" =~ $ONLY ]]; then return; fi
    names+=("$name")
    nps+=("$np")
    cmds+=("$*")
}
have() { [ -x "$BIN/chapter-$1" ]; }
skipped=""

if have 0; then
    add ch0_reference_np1 1 "$BIN/chapter-0" $TRAIN
else skipped="$skipped 0"; fi

if have 1; then
    for np in 2 4; do
        add collectives_np$np $np "$BIN/chapter-1" --bench --min-bytes 8 --max-bytes 256M
    done
else skipped="$skipped 1"; fi

if have 2; then
    for mode in naive bucketed overlapped ps; do
        add ch2_${mode}_dp2 2 "$BIN/chapter-2" --dp 2 --dp-mode $mode $TRAIN
    done
    add ch2_ps_dp4 4 "$BIN/chapter-2" --dp 4 --dp-mode ps $TRAIN
    # strong scaling: the global batch stays 8 x 256 (dp=2 is above)
    add ch2_overlapped_dp1 1 "$BIN/chapter-2" --dp 1 --dp-mode overlapped $TRAIN
    add ch2_overlapped_dp4 4 "$BIN/chapter-2" --dp 4 --dp-mode overlapped $TRAIN
    # weak scaling: 4 sequences per rank (dp=2, batch 8 is ch2_overlapped_dp2)
    add ch2_overlapped_dp1_b4 1 "$BIN/chapter-2" --dp 1 --dp-mode overlapped $TRAIN --batch 4
    add ch2_overlapped_dp4_b16 4 "$BIN/chapter-2" --dp 4 --dp-mode overlapped $TRAIN --batch 16
else skipped="$skipped 2"; fi

if have 3; then
    add ch3_zero3_dp1 1 "$BIN/chapter-3" --dp 1 --zero 3 $TRAIN
    for dp in 2 4; do
        for z in 1 2 3; do
            add ch3_zero${z}_dp$dp $dp "$BIN/chapter-3" --dp $dp --zero $z $TRAIN
        done
    done
else skipped="$skipped 3"; fi

if have 4; then
    # tensor parallelism against FSDP at the same rank count: tp = 1 is
    # chapter 3's ZeRO-3 run through chapter 4; small's 6 heads split over
    # tp = 1, 2, 3 (not 4)
    for mesh in "2 1" "1 2" "4 1" "2 2" "1 3"; do
        set -- $mesh
        add ch4_tp$2_dp$1 $(($1 * $2)) "$BIN/chapter-4" --dp $1 --tp $2 $TRAIN
    done
else skipped="$skipped 4"; fi
if have 5; then
    # chapter 5: each schedule on pp=2 (small's 6 layers: 3 per stage), 4
    # microbatches of 2 sequences; 1F1B on pp=4 (2,2,1,1 layers) and dp x pp
    for sched in gpipe 1f1b zb; do
        add ch5_${sched}_pp2 2 "$BIN/chapter-5" --pp 2 --schedule $sched --microbatches 4 $TRAIN
    done
    add ch5_interleaved_pp2 2 "$BIN/chapter-5" --pp 2 --schedule interleaved --virtual 3 --microbatches 4 $TRAIN
    add ch5_1f1b_pp4 4 "$BIN/chapter-5" --pp 4 --schedule 1f1b --microbatches 8 $TRAIN
    add ch5_1f1b_dp2_pp2 4 "$BIN/chapter-5" --dp 2 --pp 2 --schedule 1f1b --microbatches 2 $TRAIN
else skipped="$skipped 5"; fi

if have 6; then
    # chapter 6: context parallelism, the sequence of 256 cut over cp ranks
    add ch6_ring_zigzag_cp2 2 "$BIN/chapter-6" --cp 2 --cp-mode ring --cp-balance zigzag $TRAIN
    add ch6_ulysses_none_cp2 2 "$BIN/chapter-6" --cp 2 --cp-mode ulysses $TRAIN
    # sequence parallelism on chapter 4's tensor parallelism: against ch4_tp2_dp1
    add ch6_sp_tp2_dp1 2 "$BIN/chapter-6" --tp 2 --sp $TRAIN
else skipped="$skipped 6"; fi

if have 7; then
    # chapter 7: 4 experts of width 4C, top-1: a token meets as many weights
    # as in the dense model (plus the router's E C per layer), on 1 and 4 ranks
    add ch7_e4k1_ep1 1 "$BIN/chapter-7" --experts 4 --top-k 1 $TRAIN
    add ch7_e4k1_ep4 4 "$BIN/chapter-7" --ep 4 --experts 4 --top-k 1 $TRAIN
else skipped="$skipped 7"; fi
if [ -x "$BIN/capstone" ]; then
    # the same model composed on 4 ranks, two axes at a time (1F1B, 2
    # microbatches with pp): the capstone's runs
    add ch7_e4k1_ep2_tp2 4 "$BIN/capstone" --ep 2 --tp 2 --experts 4 --top-k 1 $TRAIN
    add ch7_e4k1_ep2_pp2 4 "$BIN/capstone" --ep 2 --pp 2 --experts 4 --top-k 1 $TRAIN
    add ch7_e4k1_tp2_pp2 4 "$BIN/capstone" --tp 2 --pp 2 --experts 4 --top-k 1 $TRAIN
else skipped="$skipped capstone"; fi
if [ -x "$BIN/attention_bench" ]; then
    add attention_b8_t256 1 "$BIN/attention_bench" --batch 8 --seq 256 --reps 15
    add attention_b2_t1024 1 "$BIN/attention_bench" --batch 2 --seq 1024 --reps 9
else skipped="$skipped attention_bench"; fi
total=${#names[@]}
if [ "$total" = 0 ]; then
    echo "bench: nothing to run: no $BIN/chapter-N or $BIN/capstone binaries${ONLY:+ with runs matching '$ONLY'} (make all builds them)" >&2
    exit 1
fi
# One matmul peak for the whole sweep. Each program measures its own at
# start-up, but on a shared machine a measurement made while another job
# runs comes out low, and the MFU of that run then looks high (past 100% in
# one sweep). So the node's peak is measured here, best of three one-rank
# runs with every core, and each run gets it split over its ranks
# (--peak-gflops is per rank; the summary sums the ranks). PEAK=X skips it.
# A partial sweep (ONLY=...) keeps the peak of the sweep it joins.
PEAK=${PEAK:-}
if [ -z "$PEAK" ] && [ -n "$ONLY" ] && [ -f "$OUT/sweep.txt" ]; then
    PEAK=$(sed -n 's/^peak: \([0-9.]*\) GFLOP.*/\1/p' "$OUT/sweep.txt" | head -1)
fi
needs_peak=0
for name in "${names[@]}"; do case $name in ch*) needs_peak=1 ;; esac; done
if [ -z "$PEAK" ] && [ $needs_peak = 1 ] && [ -x "$BIN/chapter-0" ]; then
    for i in 1 2 3; do
        $MPIRUN -np 1 "$BIN/chapter-0" --steps 1 --log "$LOGS/peak$i.jsonl" > /dev/null 2>&1 || continue
        p=$(grep -o '"peak_gflops":[0-9.]*' "$LOGS/peak$i.jsonl" | cut -d: -f2)
        PEAK=$(awk -v a="${PEAK:-0}" -v b="$p" 'BEGIN { print (b + 0 > a + 0) ? b : a }')
    done
fi
if [ $needs_peak = 1 ] && { [ -z "$PEAK" ] || [ "$PEAK" = 0 ]; }; then
    echo "bench: could not measure the matmul peak (build chapter 0, or give PEAK=GFLOPS)" >&2
    exit 1
fi
[ -n "$skipped" ] && echo "bench: leaving out chapter(s)$skipped: no $BIN/chapter-N (or $BIN/capstone) binary"
echo "bench: $total runs, $STEPS steps each on the small model, logs to $OUT/, console output to $LOGS/"
echo "bench: this machine has $(nproc) cores; load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
[ $needs_peak = 1 ] && echo "bench: matmul peak of the node: $PEAK GFLOP/s (every run's MFU is against it)"

# the figure each run reports when done
result() {
    local log=$1
    if grep -q '"type":"attention"' "$log"; then
        # the attention bench: both ops' forward + backward, median ms of
        # wall and of CPU time
        sed 's/.*"full_ms":\([0-9.]*\),"flash_ms":\([0-9.]*\),.*"full_cpu_ms":\([0-9.]*\),"flash_cpu_ms":\([0-9.]*\),.*/\1 \2 \3 \4/' "$log" |
            awk '{ printf "attention fwd+bwd: full %.2f ms, flash %.2f ms (x%.3f; CPU time x%.3f)", $1, $2, $2 / $1, $4 / $3 }'
    elif grep -q '"type":"summary"' "$log"; then
        grep '"type":"summary"' "$log" | tail -1 |
            sed 's/.*"tokens_per_s":\([0-9.]*\).*"mfu":\([0-9.]*\).*/\1 \2/' |
            awk '{ printf "%.0f tokens/s, MFU %.1f%%", $1, 100 * $2 }'
    else
        # chapter 1: the largest all-reduce, hand-written ring against the library
        grep '"op":"allreduce_ring"' "$log" | tail -1 |
            sed 's/.*"bytes":\([0-9]*\).*"hand_busbw":\([0-9.]*\).*"lib_busbw":\([0-9.]*\).*/\1 \2 \3/' |
            awk '{ printf "%d rows; ring all-reduce of %.0f MiB: busbw %.2f GB/s by hand, %.2f library", n, $1 / 1048576, $2, $3 }' \
                n="$(grep -c '"type":"collective"' "$log")"
    fi
}

start=$(date +%s)
failed=0
failed_names=""
manifest=""
for i in $(seq 0 $((total - 1))); do
    name=${names[$i]}
    np=${nps[$i]}
    cmd=${cmds[$i]}
    tmp="$OUT/$name.jsonl.tmp.$$"
    printf '[%2d/%d] %-24s np=%d  %s ... ' $((i + 1)) "$total" "$name" "$np" "${cmd#$BIN/}"
    t0=$(date +%s)
    peak_flag=""
    case $name in ch*) peak_flag="--peak-gflops $(awk -v p="$PEAK" -v n="$np" 'BEGIN { printf "%.3f", p / n }')" ;; esac
    # shellcheck disable=SC2086
    timeout 600 $MPIRUN -np "$np" $cmd $peak_flag --log "$tmp" > "$LOGS/$name.out" 2>&1
    rc=$?
    t1=$(date +%s)
    if [ $rc = 0 ] && [ -s "$tmp" ]; then
        mv "$tmp" "$OUT/$name.jsonl"
        # chapter 1's console table is worth reading next to its plot
        case $name in collectives_np*) cp "$LOGS/$name.out" "$OUT/$name.txt" ;; esac
        echo "$(result "$OUT/$name.jsonl") ($((t1 - t0)) s)"
        manifest="$manifest$name.jsonl  np=$np  $cmd${peak_flag:+ $peak_flag}  ($((t1 - t0)) s)"$'\n'
    else
        rm -f "$tmp"
        echo "FAILED, exit $rc ($((t1 - t0)) s): see $LOGS/$name.out"
        tail -3 "$LOGS/$name.out" | sed 's/^/    /'
        failed=$((failed + 1))
        failed_names="$failed_names $name"
    fi
done
end=$(date +%s)
load_end=$(cut -d' ' -f1-3 /proc/loadavg)
echo "bench: $((total - failed)) of $total runs done in $((end - start)) s; load average at the end: $load_end"

# sweep.txt: the runs behind the files. A partial sweep (ONLY=...) keeps the
# lines of the runs it did not repeat and says which runs are newer.
if [ $((total - failed)) -gt 0 ]; then
    cpu=$(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //; s/  */ /g')
    now=$(date -u '+%Y-%m-%d %H:%M UTC')
    kept=""
    header_date="date: $now"
    # one load: line per time the runs were made (plots.sh prints them when
    # the plots mix runs of several times)
    loads="load: all $now: $load_end"
    duration="duration: $((end - start)) s"
    if [ -n "$ONLY" ] && [ -f "$OUT/sweep.txt" ]; then
        kept=$(sed -n '/^runs:$/,$p' "$OUT/sweep.txt" | tail -n +2 | grep '\.jsonl ' || true)
        for name in "${names[@]}"; do
            case " $failed_names " in *" $name "*) continue ;; esac
            kept=$(printf '%s\n' "$kept" | grep -v "^$name\.jsonl " || true)
        done
        header_date="$(grep -m1 '^date:' "$OUT/sweep.txt"); runs matching '$ONLY' again on $now"
        duration="$(grep -m1 '^duration:' "$OUT/sweep.txt"); runs matching '$ONLY': $((end - start)) s"
        loads="$(grep '^load: ' "$OUT/sweep.txt" | grep -vF "load: '$ONLY' " || true)
load: '$ONLY' $now: $load_end"
        loads=$(printf '%s\n' "$loads" | sed '/^$/d')
    fi
    {
        echo "# the sweep that wrote these files: bash docs/plots/bench.sh (make bench)"
        echo "$header_date"
        echo "machine: ${cpu:-unknown CPU}, $(nproc) cores"
        echo "$duration"
        echo "peak: $PEAK GFLOP/s, the node's matmul peak, for every run's MFU (--peak-gflops peak/ranks)"
        echo "note: ${cpu:-unknown CPU}, $(nproc) cores shared with other jobs (load average at the end $load_end): expect noise"
        printf '%s\n' "$loads"
        echo "runs:"
        if [ -n "$kept" ]; then printf '%s\n' "$kept"; fi
        printf '%s' "$manifest"
        # a failed run keeps its older JSONL file, which the plots still draw
        if [ -n "$failed_names" ]; then
            echo "failed (their files, if any, are from an older sweep):$failed_names"
        fi
    } > "$OUT/sweep.txt.tmp.$$"
    mv "$OUT/sweep.txt.tmp.$$" "$OUT/sweep.txt"
fi
[ $failed = 0 ]
