#!/bin/bash
# ckpt_bench.sh: save and load figures of training-state checkpoints for each
# chapter and mesh, sync against async (docs/checkpoints.md, "Measure it").
#
#   bash common/tools/ckpt_bench.sh            # the small model
#   MODEL=tiny bash common/tools/ckpt_bench.sh
#
# Each case trains 6 steps saving every 2 (3 saves, the last at the end), once sync and once with
# --async-save, then resumes the sync run's step 2 to time the load. Prints one
# row per case from the runs' {"type":"checkpoint"} records: bytes each rank
# writes, the training stall per save (the main thread inside checkpoint
# calls in the training loop), the wait for the last save at the end (async:
# nothing is left to hide it behind), the file write per save on rank 0 (in a
# thread when async), and the
# load: bytes and milliseconds, the slowest rank's.
set -eu
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build}
MODEL=${MODEL:-small}
FLAGS="--model $MODEL --steps 6 --batch 8 --seq 64 --peak-gflops 10 --val-batches 1"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

case_run() {  # NAME NP CHAPTER FLAGS...
    local name=$1 np=$2 ch=$3
    shift 3
    for mode in sync async; do
        local extra=""
        [ $mode = async ] && extra=--async-save
        bash tests/mpirun.sh -np "$np" "$BUILD/chapter-$ch" $FLAGS "$@" --ckpt-dir "$out/$name-$mode" --save-every 2 \
            $extra --log "$out/$name-$mode.jsonl" >"$out/$name-$mode.out" 2>&1
    done
    bash tests/mpirun.sh -np "$np" "$BUILD/chapter-$ch" $FLAGS "$@" --resume "$out/$name-sync/step-00000002" --steps 2 \
        --log "$out/$name-load.jsonl" >"$out/$name-load.out" 2>&1
    python3 - "$out" "$name" <<'EOF'
import json, sys
out, name = sys.argv[1], sys.argv[2]
def rec(mode, kind):
    for line in open(f"{out}/{name}-{mode}.jsonl"):
        r = json.loads(line)
        if r["type"] == kind:
            return r
s, a, l = rec("sync", "checkpoint"), rec("async", "checkpoint"), rec("load", "checkpoint")
ms = rec("sync", "summary")["ms_per_step"]
kib = "/".join(f"{b / 1024:.0f}" for b in s["save_bytes"])
print(f"| {name} | {kib} | {ms:.0f} | {s['stall_ms_per_save']:.1f} | {a['stall_ms_per_save']:.1f} | "
      f"{a['final_wait_ms']:.0f} | {s['write_ms_per_save'][0]:.1f} | {max(l['load_bytes']) / 1024:.0f} | {max(l['load_ms']):.1f} |")
EOF
}

echo "model $MODEL, $FLAGS, $(nproc) cores, load average $(cut -d' ' -f1 /proc/loadavg) at the start"
echo "| chapter, mesh | KiB written per rank | ms/step | stall ms/save, sync | stall ms/save, async | async: last save's wait at the end, ms | write ms/save (rank 0) | KiB read (max rank) | load ms (max rank) |"
echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"
case_run "ch0 1 rank" 1 0
case_run "ch2 dp=2" 2 2 --dp 2
case_run "ch3 dp=2 ZeRO-1" 2 3 --dp 2 --zero 1
case_run "ch3 dp=2 ZeRO-3" 2 3 --dp 2 --zero 3
case_run "ch3 dp=4 ZeRO-3" 4 3 --dp 4 --zero 3
