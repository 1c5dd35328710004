#!/bin/bash
# bench_peer.sh: make bench-peer. This course's trainers against the same
# model in PyTorch (common/tools/peer_gpt.py), same checkpoint, batch and
# data, alternated A B A B so that a slow spell of the machine falls on both:
#   one process x 2 threads:    chapter 0            vs PyTorch
#   2 ranks x 1 thread:         chapter 2 overlapped vs PyTorch DDP over gloo
# Prints tokens/s of every run, the ratios, and the first-step losses of both
# (they must agree: the same model trains the same numbers).
#
# PyTorch is Debian's python3-torch, installed here (as root) when missing; it
# is never needed by the build or the tests.
# Settings: PEER_ROUNDS (4), PEER_STEPS (8; the first is not timed), BIN (build).
# A slow spell of a shared machine can fall on one run of a round and not on
# the other: more rounds of more steps average it out, and the median and the
# lowest ratio, printed with the mean, show whether one round carried it.
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN=${BIN:-build}
ROUNDS=${PEER_ROUNDS:-4}
STEPS=${PEER_STEPS:-8}
PY=/usr/bin/python3  # Debian's python, where python3-torch installs
OUT=$BIN/peer
mkdir -p "$OUT"

if ! "$PY" -c 'import torch' 2>/dev/null; then
    if [ "$(id -u)" = 0 ]; then
        echo "bench-peer: installing Debian's python3-torch (once)"
        DEBIAN_FRONTEND=noninteractive apt-get install -y python3-torch >"$OUT/apt.log" 2>&1 ||
            { echo "bench-peer: apt-get install python3-torch failed (see $OUT/apt.log)"; exit 1; }
    else
        echo "bench-peer: needs PyTorch: sudo apt-get install python3-torch"; exit 1
    fi
fi

# the same weights for both: the small preset's init, written as an llm.c file
bash tests/mpirun.sh -np 1 "$BIN/chapter-0" --model small --steps 0 --peak-gflops 1 \
    --save "$OUT/small.bin" >"$OUT/save.log" 2>&1 || { cat "$OUT/save.log"; exit 1; }
COMMON=(--model "$OUT/small.bin" --batch 8 --seq 256 --steps "$STEPS" --peak-gflops 1)

ours() {  # ours LOG NP ARGS...: tokens/s and first loss from the summary/step records
    local log=$1 np=$2; shift 2
    rm -f "$log"
    bash tests/mpirun.sh -np "$np" "$@" "${COMMON[@]}" --log "$log" >"$log.out" 2>&1 ||
        { cat "$log.out"; exit 1; }
}
peer() {  # peer LOG ARGS...
    local log=$1; shift
    "$PY" common/tools/peer_gpt.py "$OUT/small.bin" --batch 8 --seq 256 --steps "$STEPS" \
        --log "$log" "$@" >"$log.out" 2>&1 || { cat "$log.out"; exit 1; }
}

for r in $(seq "$ROUNDS"); do
    echo "round $r of $ROUNDS: chapter 0, PyTorch, chapter 2, PyTorch DDP"
    ours "$OUT/c0_$r.jsonl" 1 "$BIN/chapter-0" --threads 2
    peer "$OUT/pt1_$r.json" --threads 2 --ranks 1
    ours "$OUT/c2_$r.jsonl" 2 "$BIN/chapter-2" --dp 2 --dp-mode overlapped --threads 1
    peer "$OUT/pt2_$r.json" --threads 1 --ranks 2
done

python3 - "$OUT" "$ROUNDS" <<'PY'
import json, sys
out, rounds = sys.argv[1], int(sys.argv[2])
def ours(path):
    recs = [json.loads(l) for l in open(path)]
    steps = [r for r in recs if r.get("type") == "step"]
    summ = [r for r in recs if r.get("type") == "summary"][-1]
    return summ["tokens_per_s"], steps[0]["loss"]
def peer(path):
    rec = json.load(open(path))
    return rec["tokens_per_s"], rec["losses"][0]
for label, a, b in (("1 process x 2 threads: chapter 0 vs PyTorch", "c0", "pt1"),
                    ("2 ranks x 1 thread: chapter 2 overlapped vs PyTorch DDP (gloo)", "c2", "pt2")):
    print(label)
    ratios = []
    for r in range(1, rounds + 1):
        (ta, la), (tb, lb) = ours(f"{out}/{a}_{r}.jsonl"), peer(f"{out}/{b}_{r}.json")
        ratios.append(ta / tb)
        print(f"  round {r}: ours {ta:7.0f} tokens/s, PyTorch {tb:7.0f} tokens/s, ratio {ta / tb:.2f}"
              f" | first loss ours {la:.6f}, PyTorch {lb:.6f} (|diff| {abs(la - lb):.1e})")
    mid = sorted(ratios)[len(ratios) // 2] if len(ratios) % 2 else \
        sum(sorted(ratios)[len(ratios) // 2 - 1:len(ratios) // 2 + 1]) / 2
    print(f"  mean ratio {sum(ratios) / len(ratios):.2f} over {rounds} round(s)"
          f" (median {mid:.2f}, lowest {min(ratios):.2f})")
PY
