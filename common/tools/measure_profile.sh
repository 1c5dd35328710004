#!/bin/bash
# measure_profile.sh OUT: this machine's profile for build/plan --profile
# (make profile runs it; the format and the model are in tools/plan/plan_time.h
# and docs/planner.md). Every figure is measured here, one line each with the
# command it came from:
#   - build/roofline: the matmul rate at the four shapes of a block of the
#     small preset over 2048 tokens (their FLOP-weighted harmonic mean: the
#     time a block's matmuls take at those rates), the row-by-row products
#     chapter 7's experts run (the same mean of their four rates), and the
#     copy bandwidth;
#   - build/plan --measure-attention: the chapters' attention
#     (attention_flash_*), forward + backward at the small preset's B 8 x T 256;
#   - chapter 1's bench (build/chapter-1 --bench) on 2, 3 and 4 ranks, and a
#     fit of time = alpha + bus_bytes / busbw to the library's times (the
#     chapters call the library) from 64 KiB to 64 MiB: 1 / busbw is the
#     median of time / bus_bytes over the sizes from 1 MiB, alpha the median
#     of time - bus_bytes / busbw (at least 0) below 1 MiB. Medians, not least
#     squares: on a shared machine one size caught behind another job's burst
#     would drag a least-squares line anywhere.
# The raw outputs stay in build/profile-data/ (the fit can be read against them).
# Environment: BIN (build), RANKS ("2 3 4"), ITERS (10).
set -u
cd "$(dirname "$0")/../.."
OUT=${1:?usage: measure_profile.sh OUT}
BIN=${BIN:-build}
RANKS=${RANKS:-2 3 4}
ITERS=${ITERS:-10}
MPIRUN="bash tests/mpirun.sh"
TMP=build/profile-data
rm -rf "$TMP"
mkdir -p "$TMP"
for tool in roofline plan chapter-1; do
    [ -x "$BIN/$tool" ] || { echo "error: $BIN/$tool is missing (make all builds it)" >&2; exit 1; }
done
echo "profile: measuring this machine into $OUT (load average at start: $(cut -d' ' -f1-3 /proc/loadavg))"
$MPIRUN -np 1 "$BIN/roofline" > "$TMP/roofline.txt" || { echo "error: build/roofline failed" >&2; exit 1; }
$MPIRUN -np 1 "$BIN/plan" --measure-attention --model small --batch 8 --seq 256 > "$TMP/attention.txt" ||
    { echo "error: build/plan --measure-attention failed" >&2; exit 1; }
for p in $RANKS; do
    $MPIRUN -np "$p" "$BIN/chapter-1" --bench --min-bytes 64K --max-bytes 64M --iters "$ITERS" \
        --log "$TMP/coll_np$p.jsonl" > /dev/null || { echo "error: chapter 1's bench on $p ranks failed" >&2; exit 1; }
done
load_end=$(cut -d' ' -f1-3 /proc/loadavg)
cpu=$(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //; s/  */ /g')
python3 - "$TMP" "$OUT" "${cpu:-unknown CPU}, $(nproc) cores" "$(date -u '+%Y-%m-%d %H:%M UTC')" "$load_end" "$ITERS" $RANKS <<'PY'
import json, re, sys
tmp, out, machine, when, load, iters = sys.argv[1:7]
ranks = [int(x) for x in sys.argv[7:]]
roof = open(f"{tmp}/roofline.txt").read()
peak = float(re.search(r"matmul peak.*?([0-9.]+) GFLOP/s", roof).group(1))
shapes = {m.group(1): float(m.group(2)) for m in re.finditer(r"^\s+(qkv|attproj|fc|fcproj)\s.*?([0-9.]+) GFLOP/s", roof, re.M)}
copy = float(re.search(r"copy.*?([0-9.]+) GB/s", roof).group(1))
# a block's matmul flops per shape: qkv 3C^2, attproj C^2, fc 4C^2, fcproj 4C^2
weights = {"qkv": 3, "attproj": 1, "fc": 4, "fcproj": 4}
block = sum(weights.values()) / sum(w / shapes[k] for k, w in weights.items())
# the row-by-row products (chapter 7's experts): forward and input gradient at
# fc and fcproj, four products of equal FLOPs (H = 4C): their harmonic mean
rowwise = [float(x) for m in re.finditer(r"^\s+(?:fc|fcproj)\s.*?([0-9.]+) forward,\s+([0-9.]+) d input GFLOP/s", roof, re.M)
           for x in m.groups()]
if len(rowwise) != 4:
    sys.exit("error: build/roofline printed no row-by-row products at fc and fcproj")
attention = open(f"{tmp}/attention.txt").read().strip()
lines = [
    f"# machine profile of this machine: bash common/tools/measure_profile.sh (make profile), {when}",
    f"# load average at the end: {load} (a shared machine: read the figures as one measurement)",
    f"name = {machine}, measured {when}",
    "compute_shared = 1  # CPU: the ranks of the node share its cores and memory bus (r = ranks in plan_time.h)",
    "overlap = 0  # CPU: the cores that compute also copy, and MPI progresses only inside its calls",
    "element_bytes = 4  # the course's floats",
    f"info.matmul_peak_gflops = {peak:.1f}  # build/roofline: matmul peak, 1536 x 1536 x 1536",
    f"matmul_gflops = {block:.1f}  # build/roofline: FLOP-weighted harmonic mean of qkv {shapes['qkv']}, attproj "
    f"{shapes['attproj']}, fc {shapes['fc']}, fcproj {shapes['fcproj']} GFLOP/s (small preset, 2048 tokens)",
    f"rowwise_gflops = {len(rowwise) / sum(1 / x for x in rowwise):.1f}  # build/roofline: harmonic mean of the "
    f"row-by-row products (chapter 7's experts), forward and d input at fc and fcproj: {', '.join(map(str, rowwise))} GFLOP/s",
    attention,
    f"memory_gbps = {copy:.1f}  # build/roofline: copy of 256 MiB, bytes read + written",
]
names = {"allreduce_ring": "allreduce", "reduce_scatter": "reduce_scatter", "allgather": "allgather",
         "broadcast": "broadcast", "reduce": "reduce", "alltoall": "alltoall"}
def factor(op, p):
    if op in ("allreduce_ring",): return 2.0 * (p - 1) / p
    if op in ("broadcast", "reduce"): return 1.0
    return (p - 1) / p
for p in ranks:
    rows = [json.loads(l) for l in open(f"{tmp}/coll_np{p}.jsonl") if '"type":"collective"' in l]
    for op, name in names.items():
        pts = [(r["bytes"] * factor(op, p), r["lib_us"]) for r in rows
               if r["op"] == op and 65536 <= r["bytes"] <= 64 << 20 and r["lib_us"] > 0]
        if len(pts) < 2:
            continue
        def median(v):
            v = sorted(v)
            return v[len(v) // 2] if len(v) % 2 else 0.5 * (v[len(v) // 2 - 1] + v[len(v) // 2])
        big = [t / x for x, t in pts if x >= 1 << 20]
        if not big:
            continue
        b = median(big)  # us per bus byte
        a = median([max(0.0, t - x * b) for x, t in pts if x < 1 << 20] or [0.0])
        lines.append(f"coll.{name}.p{p}.alpha_us = {a:.1f}  # fit of build/chapter-1 --bench --min-bytes 64K "
                     f"--max-bytes 64M --iters {iters} on {p} ranks, library times, {len(pts)} sizes")
        lines.append(f"coll.{name}.p{p}.busbw_gbps = {1e-3 / b:.3f}  # the same fit: 1 / median of time / bus bytes from 1 MiB")
open(out, "w").write("\n".join(lines) + "\n")
print(f"profile: wrote {out}: matmul {block:.1f} GFLOP/s, copy {copy:.1f} GB/s, {attention.split('#')[0].strip()}, "
      f"collective fits on {' '.join(map(str, ranks))} ranks")
PY
echo "profile: load average at the end: $load_end"
