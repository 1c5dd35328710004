#!/bin/bash
# tests/optime.sh: the per-op timers (common/optime.h) and the breakdown
# make bench-ref prints (common/tools/op_breakdown.py). No check compares a
# time with a bound: only what must hold whatever the machine's speed.
. "$(dirname "$0")/lib.sh"

echo "== per-op timers"
# check_ops LOG NP: every op kind and pass, per rank, in the summary; the ops
# a GPT step runs have taken time; and the timed ops of a rank, which run
# inside the timed steps one after another, add up to no more than the step
check_ops() {
    python3 - "$1" "$2" <<'PY'
import json, sys
path, np = sys.argv[1], int(sys.argv[2])
summ = [json.loads(l) for l in open(path) if '"type":"summary"' in l][-1]
ops = summ.get("op_ms_per_step")
if ops is None:
    sys.exit("no op_ms_per_step in the summary")
kinds = ["encoder", "layernorm", "matmul", "attention", "gelu", "residual", "crossentropy",
         "moe", "optimizer", "memory"]
want = [k + p for k in kinds for p in ("_fwd", "_bwd")] + ["comm_wait", "comm_progress", "step"]
if sorted(ops) != sorted(want):
    sys.exit(f"keys {sorted(ops)}, expected {sorted(want)}")
for k, v in ops.items():
    if len(v) != np or any(x < 0 for x in v):
        sys.exit(f"{k}: {v} is not {np} non-negative figures")
for k in ("matmul_fwd", "matmul_bwd", "attention_fwd", "attention_bwd", "layernorm_fwd",
          "layernorm_bwd", "gelu_fwd", "gelu_bwd", "encoder_fwd", "encoder_bwd",
          "crossentropy_fwd", "crossentropy_bwd", "optimizer_fwd"):
    if not all(x > 0 for x in ops[k]):
        sys.exit(f"{k} = {ops[k]}: an op every step runs took no time")
for r in range(np):
    step = ops["step"][r]
    total = sum(v[r] for k, v in ops.items() if k != "step")
    # the figures are written to 0.001 ms each
    if total > step + 0.001 * len(ops):
        sys.exit(f"rank {r}: ops add up to {total} ms, more than its step's {step}")
print("ok")
PY
}

log=$TEST_TMPDIR/optime0.jsonl
mpi_run $T_RUN 1 "$BUILD/chapter-0" --steps 4 --peak-gflops 10 --log "$log"
why=$([ $RC -eq 0 ] && check_ops "$log" 1 2>&1)
if [ $RC -eq 0 ] && [ "$why" = ok ]; then
    pass "chapter 0: the summary has every op kind's ms per step, and they fit in the step"
else
    fail "chapter 0 per-op timers" "exit $RC; $why"
fi

out=$(python3 common/tools/op_breakdown.py "$log" 2>&1)
if [ $? -eq 0 ] && echo "$out" | grep -q "^per-op breakdown of rank 0" &&
    echo "$out" | grep -q "^  matmul " && echo "$out" | grep -q "^  other " &&
    echo "$out" | grep -q "^  step .* 100.0%$"; then
    pass "op_breakdown.py prints the breakdown of a chapter 0 run, with the rest as other"
else
    fail "op_breakdown.py" "$out"
fi

log2=$TEST_TMPDIR/optime2.jsonl
mpi_run $T_RUN 2 "$BUILD/chapter-2" --dp 2 --steps 4 --peak-gflops 10 --log "$log2"
why=$([ $RC -eq 0 ] && check_ops "$log2" 2 2>&1)
if [ $RC -eq 0 ] && [ "$why" = ok ] && python3 common/tools/op_breakdown.py "$log2" 1 | grep -q "^  comm wait "; then
    pass "chapter 2 on 2 ranks: every rank's op times, and the breakdown of rank 1 with its communication"
else
    fail "chapter 2 per-op timers" "exit $RC; $why"
fi

# a log without a summary (a run that did not finish): a message, not a trace
grep -v '"type":"summary"' "$log" > "$TEST_TMPDIR/optime_nosum.jsonl"
out=$(python3 common/tools/op_breakdown.py "$TEST_TMPDIR/optime_nosum.jsonl" 2>&1)
if [ $? -ne 0 ] && echo "$out" | grep -q "no summary record"; then
    pass "op_breakdown.py on a log without a summary says so and exits non-zero"
else
    fail "op_breakdown.py without a summary" "$out"
fi
# a binary file (a traceback: UnboundLocalError), and --help (it took it for a file)
out=$(python3 common/tools/op_breakdown.py "$BUILD/chapter-0" 2>&1)
rc=$?
out2=$(python3 common/tools/op_breakdown.py --help 2>&1)
rc2=$?
if [ $rc = 1 ] && [ "$out" = "$BUILD/chapter-0:1: not text: give the --log FILE.jsonl of a run" ] && [ $rc2 = 0 ] &&
    echo "$out2" | grep -q "^usage: op_breakdown.py FILE.jsonl"; then
    pass "op_breakdown.py on a binary file: one line, exit 1; --help prints the usage"
else
    fail "op_breakdown.py on a binary file, --help" "exit $rc: $out; exit $rc2: $(echo "$out2" | tail -2)"
fi

echo "== roofline (make bench-ref's first line)"
# build/roofline measures through the ops: its figures must be positive, and
# the ridge point it prints must be the peak over the bandwidth it printed
mpi_run $T_RUN 1 "$BUILD/roofline" --tokens 256 --channels 64
why=$([ $RC -eq 0 ] && echo "$OUT" | python3 -c '
import re, sys
text = sys.stdin.read()
def num(pattern):
    m = re.search(pattern + r" *([0-9.]+)", text)
    if not m:
        sys.exit("no line " + repr(pattern))
    return float(m.group(1))
peak, bw = num(r"matmul peak, 1536 x 1536 x 1536:"), num(r"copy, 256 MiB \(read \+ write\):")
ridge = num(r"ridge point, peak / copy bandwidth:")
shapes = re.findall(r"^    (qkv|attproj|fc|fcproj) +C +[0-9]+ -> OC +[0-9]+: +([0-9.]+) GFLOP/s$", text, re.M)
if [s for s, _ in shapes] != ["qkv", "attproj", "fc", "fcproj"] or not all(float(v) > 0 for _, v in shapes):
    sys.exit(f"shape rows {shapes}")
rows = re.findall(r"^    (fc|fcproj) +C +([0-9]+) -> OC +([0-9]+): +([0-9.]+) forward, +([0-9.]+) d input GFLOP/s$", text, re.M)
if [(s, int(c), int(o)) for s, c, o, _, _ in rows] != [("fc", 64, 256), ("fcproj", 256, 64)] or \
        not all(float(f) > 0 and float(d) > 0 for _, _, _, f, d in rows):
    sys.exit(f"row-by-row rows {rows}")
if peak <= 0 or bw <= 0 or abs(ridge - peak / bw) > 0.05 + 0.01 * ridge:
    sys.exit(f"peak {peak}, bandwidth {bw}, ridge {ridge}")
print("ok")' 2>&1)
if [ $RC -eq 0 ] && [ "$why" = ok ]; then
    pass "roofline prints the matmul peak, a block's four shapes, the row-by-row products at fc and fcproj, the copy bandwidth and their ratio"
else
    fail "roofline" "exit $RC; $why; $(echo "$OUT" | head -12)"
fi
error_case roofline 1 "--channels 0" "--channels takes an integer from 1"
error_case roofline 1 "--bogus" "unknown option '--bogus'"

finish
