#!/bin/bash
# ckpt_delta_kinds.sh: what an incremental checkpoint's delta (the xor with
# the last full save, compressed with zstd -3 as common/ckpt.c does) costs
# per kind of state: the parameters, AdamW's m and v (docs/checkpoints.md,
# "Incremental"). Chapter 0 on the small model saves full checkpoints after
# steps 1, 2 and 3, with and without --freeze embeddings; each kind of steps
# 2 and 3 is xor'ed with step 1's and compressed alone.
set -e
cd "$(dirname "$0")/../.."
W=${TMPDIR:-/tmp}/ckpt_delta_kinds.$$
mkdir -p "$W"
trap 'rm -rf "$W"' EXIT
for freeze in none embeddings; do
    bash tests/mpirun.sh -np 1 build/chapter-0 --model small --steps 3 --batch 8 --seq 64 --peak-gflops 10 \
        --ckpt-dir "$W/$freeze" --save-every 1 --keep 0 --freeze $freeze >/dev/null
    for step in 2 3; do
        python3 - "$W/$freeze/step-00000001/rank-00000.bin" "$W/$freeze/step-0000000$step/rank-00000.bin" "$W/x" <<'PY'
import sys
a, b = open(sys.argv[1], 'rb').read()[64:], open(sys.argv[2], 'rb').read()[64:]
p = len(a) // 12  # floats per kind: params, m, v in a row (ckpt_add_state's order)
for k, name in enumerate(["params", "m", "v"]):
    x = int.from_bytes(a[4*p*k:4*p*(k+1)], 'little') ^ int.from_bytes(b[4*p*k:4*p*(k+1)], 'little')
    open(sys.argv[3] + "." + name, 'wb').write(x.to_bytes(4 * p, 'little'))
PY
        for kind in params m v; do
            raw=$(stat -c %s "$W/x.$kind")
            z=$(zstd -3 -q -c "$W/x.$kind" | wc -c)
            echo "freeze $freeze, step $step vs step 1, $kind: $raw bytes -> $z compressed ($(awk -v a=$z -v b=$raw 'BEGIN { printf "%.1f", 100 * a / b }')%)"
        done
    done
done
