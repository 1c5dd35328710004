#!/bin/bash
# ckpt_levels_bench.sh [OUT_DIR]: what each checkpoint level and mode costs
# (docs/checkpoints.md, "Measure it"; `make bench-ckpt` runs it, `make plots`
# draws docs/plots/ckpt_levels.png from what it writes).
#
# The small model on chapter 3, dp 4 ZeRO-3, 4 simulated nodes of one rank,
# 4 steps of 8 x 64 tokens, a save every 2 steps (2 saves), in each mode:
#   l1_none l1_partner l1_xor   level 1 under /dev/shm, each redundancy
#   l3_sync l3_async            level 3 under $TMPDIR (or /tmp), from the host copy
#   l3_drained                  level 1 and level 3 at the same steps: level 3
#                               copied from level 1's files in the background
#   l3_incremental              level 3 every step, --incremental 4 (a full
#                               save, then 3 xor + zstd deltas)
# two rounds, the modes alternated (A B C ... A B C ...). Each run's log is
# OUT_DIR/MODE_rN.jsonl (default docs/plots/data/ckpt; docs/plots/ckpt_levels.sh
# reads them from there); OUT_DIR/runs.txt
# has the commands, each run's seconds, the date and the load average.
cd "$(dirname "$0")/../.."
BIN=${BIN:-build}
out=${1:-docs/plots/data/ckpt}
mkdir -p "$out"
# every run logs into a folder of its own, moved over OUT_DIR's files only
# when all 14 ran: a failure leaves the last measurements (and their date)
final=$out
out=$(mktemp -d "$final/.running.XXXXXX")
trap 'rm -rf "$out"' EXIT
failures=0
D1=/dev/shm/ckpt_levels_bench.$$
D3=${TMPDIR:-/tmp}/ckpt_levels_bench.$$
F="--model small --steps 4 --batch 8 --seq 64 --peak-gflops 10 --dp 4 --zero 3"
L1="--ckpt-local $D1 --local-every 2 --ranks-per-node 1"
L3="--ckpt-dir $D3 --save-every 2"
flags() {
    case $1 in
        l1_none) echo "$L1 --ckpt-redundancy none" ;;
        l1_partner) echo "$L1 --ckpt-redundancy partner" ;;
        l1_xor) echo "$L1 --ckpt-redundancy xor" ;;
        l3_sync) echo "$L3" ;;
        l3_async) echo "$L3 --async-save" ;;
        l3_drained) echo "$L1 --ckpt-redundancy none $L3" ;;
        l3_incremental) echo "--ckpt-dir $D3 --save-every 1 --incremental 4" ;;
    esac
}
modes="l1_none l1_partner l1_xor l3_sync l3_async l3_drained l3_incremental"
{
    echo "# common/tools/ckpt_levels_bench.sh: bash tests/mpirun.sh -np 4 $BIN/chapter-3 $F FLAGS --log MODE_rN.jsonl"
    echo "date: $(date -u '+%Y-%m-%d %H:%M UTC')"
    echo "load at the start: $(cut -d' ' -f1-3 /proc/loadavg)"
    for m in $modes; do echo "mode $m: $(flags $m | sed "s|$D1|/dev/shm/L|; s|$D3|/tmp/D|")"; done
} > "$out/runs.txt"
for round in 1 2; do
    for m in $modes; do
        rm -rf "$D1" "$D3"
        mkdir -p "$D1"
        t0=$(date +%s.%N)
        if ! res=$(bash tests/mpirun.sh -np 4 "$BIN/chapter-3" $F $(flags $m) --log "$out/${m}_r$round.jsonl" 2>&1); then
            echo "failed: $m round $round: $(echo "$res" | grep -m1 '^error' || echo "$res" | tail -1)" | tee -a "$out/runs.txt"
            failures=$((failures + 1))
            continue
        fi
        t1=$(date +%s.%N)
        echo "run ${m}_r$round: $(echo "$t1 - $t0" | bc) s, load $(cut -d' ' -f1 /proc/loadavg)" | tee -a "$out/runs.txt"
        echo "$res" | grep -E '^checkpoint: (level 1:|[0-9]+ save|incremental|the state)' | sed 's/^/    /'
    done
done
rm -rf "$D1" "$D3"
echo "load at the end: $(cut -d' ' -f1-3 /proc/loadavg)" >> "$out/runs.txt"
if [ $failures -gt 0 ]; then
    echo "ckpt-bench: $failures of 14 runs failed: $final keeps the measurements it had" >&2
    exit 1
fi
mv -f "$out"/* "$final"/
# the tables the plot is drawn from (docs/plots/ckpt_levels.sh reads DATA/ckpt), as printed
if [ "$(basename "$final")" != ckpt ]; then
    echo "ckpt-bench: the logs are in $final; docs/plots/ckpt_levels.sh draws from a folder named ckpt"
    exit 0
fi
t=$(mktemp -d)
bash docs/plots/ckpt_levels.sh "$(dirname "$final")" "$t" > /dev/null && cat "$t/ckpt_stall.dat" "$t/ckpt_bytes.dat"
rc=$?
rm -rf "$t"
exit $rc
