#!/bin/bash
# bench_peer.sh: make bench-peer. This course's trainers against the same
# model written as a PyTorch user writes it (common/tools/peer_gpt.py: one
# module per block, torch.optim.AdamW, DDP's default buckets), same
# checkpoint, batch and data, alternated A B A B so that a slow spell of the
# machine falls on both:
#   one process x 2 threads:    chapter 0            vs PyTorch
#   2 ranks x 1 thread:         chapter 2 overlapped vs PyTorch DDP over gloo
# Prints tokens/s of every run, the ratios, and the losses of both (the first
# must agree: the same model trains the same numbers; the later ones track).
# The matmul peak (build/roofline), measured before and after the rounds, gives
# the limit: the tokens/s of a step whose FLOPs (chapter 0's flops_per_token)
# all ran at the peak, and each side's share of it.
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

peak() {  # peak FILE: the matmul peak line of build/roofline, kept in FILE
    bash tests/mpirun.sh -np 1 "$BIN/roofline" >"$1" 2>&1 || { cat "$1"; exit 1; }
    grep 'matmul peak' "$1"
}

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

echo "before the rounds:"
peak "$OUT/roofline_before.txt"
for r in $(seq "$ROUNDS"); do
    echo "round $r of $ROUNDS: chapter 0, PyTorch, chapter 2, PyTorch DDP"
    ours "$OUT/c0_$r.jsonl" 1 "$BIN/chapter-0" --threads 2
    peer "$OUT/pt1_$r.json" --threads 2 --ranks 1
    ours "$OUT/c2_$r.jsonl" 2 "$BIN/chapter-2" --dp 2 --dp-mode overlapped --threads 1
    peer "$OUT/pt2_$r.json" --threads 1 --ranks 2
done
echo "after the rounds:"
peak "$OUT/roofline_after.txt"

python3 - "$OUT" "$ROUNDS" <<'PY'
import json, re, sys
out, rounds = sys.argv[1], int(sys.argv[2])
def ours(path):
    recs = [json.loads(l) for l in open(path)]
    steps = [r for r in recs if r.get("type") == "step"]
    summ = [r for r in recs if r.get("type") == "summary"][-1]
    return summ["tokens_per_s"], [r["loss"] for r in steps], summ["flops_per_token"]
def peer(path):
    rec = json.load(open(path))
    return rec["tokens_per_s"], rec["losses"]
def gflops(path):
    return float(re.search(r"matmul peak.*?([0-9.]+) GFLOP/s", open(path).read()).group(1))
# the peak is a best-of measurement: the higher of the two is the machine's
peak = max(gflops(f"{out}/roofline_before.txt"), gflops(f"{out}/roofline_after.txt"))
for label, a, b in (("1 process x 2 threads: chapter 0 vs PyTorch", "c0", "pt1"),
                    ("2 ranks x 1 thread: chapter 2 overlapped vs PyTorch DDP (gloo)", "c2", "pt2")):
    print(label)
    ratios, tas, tbs, drift = [], [], [], 0.0
    for r in range(1, rounds + 1):
        (ta, la, fpt), (tb, lb) = ours(f"{out}/{a}_{r}.jsonl"), peer(f"{out}/{b}_{r}.json")
        ratios.append(ta / tb)
        tas.append(ta)
        tbs.append(tb)
        drift = max([drift] + [abs(x - y) for x, y in zip(la, lb)])
        print(f"  round {r}: ours {ta:7.0f} tokens/s, PyTorch {tb:7.0f} tokens/s, ratio {ta / tb:.2f}"
              f" | first loss ours {la[0]:.6f}, PyTorch {lb[0]:.6f} (|diff| {abs(la[0] - lb[0]):.1e})")
    mid = sorted(ratios)[len(ratios) // 2] if len(ratios) % 2 else \
        sum(sorted(ratios)[len(ratios) // 2 - 1:len(ratios) // 2 + 1]) / 2
    print(f"  mean ratio {sum(ratios) / len(ratios):.2f} over {rounds} round(s)"
          f" (median {mid:.2f}, lowest {min(ratios):.2f}); losses of every step within {drift:.1e}")
    limit = peak * 1e9 / fpt
    ma, mb = sum(tas) / len(tas), sum(tbs) / len(tbs)
    print(f"  at the matmul peak ({peak:.1f} GFLOP/s, {fpt / 1e6:.1f} MFLOP a token): {limit:.0f} tokens/s;"
          f" ours {100 * ma / limit:.0f}% of it, PyTorch {100 * mb / limit:.0f}% (means of the rounds)")
PY
