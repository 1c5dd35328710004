#!/bin/bash
# --recompute and --trace (docs/recompute.md, docs/tracing.md): recomputation
# logs the same losses and norms as none, bit for bit, in chapters 0, 2 and 3,
# and each rank's activation peak is the mode's formula; a trace is valid
# JSON, nested per rank and adds up to its run's summary (tests/trace_check.py,
# chapters 0, 2-7, and the capstone, chapter 7's model, on dp x cp x ep =
# 2 x 2 x 2 and on dp x tp x pp = 2 x 2 x 2),
# and the checker fails on a broken trace; bad flags give one message.
. "$(dirname "$0")/lib.sh"
echo "== --recompute and --trace"
# rc_steps RUN.jsonl: the step records without their timings, for a bitwise
# comparison of loss and norm (the log prints them in full: %.8g and %.6f)
rc_steps() { grep '"type":"step"' "$1" | sed 's/,"ms":.*//'; }
rc_run() {  # LABEL NP BIN FLAGS...: runs into $TEST_TMPDIR/rc_LABEL.jsonl, fails on a non-zero exit
    local label=$1 np=$2 bin=$3
    shift 3
    mpi_run $T_RUN "$np" "$BUILD/$bin" --steps 6 --batch 8 --seq 32 --peak-gflops 10 \
        --log "$TEST_TMPDIR/rc_$label.jsonl" "$@"
    [ "$RC" -eq 0 ] || fail "recompute/trace: $label" "exit $RC; $(echo "$OUT" | tail -3)"
}
# bit for bit by construction: the same calls on the same rows, recomputed
# the same losses and norms, bit for bit, as recompute none in the same chapter
rc_same() {  # LABEL REF_LABEL WHAT
    if [ -s "$TEST_TMPDIR/rc_$1.jsonl" ] && [ "$(rc_steps "$TEST_TMPDIR/rc_$1.jsonl")" = "$(rc_steps "$TEST_TMPDIR/rc_$2.jsonl")" ]; then
        pass "recompute: $3 logs the same 6 losses and norms as none, bit for bit"
    else
        fail "recompute: $3" "$(diff <(rc_steps "$TEST_TMPDIR/rc_$1.jsonl") <(rc_steps "$TEST_TMPDIR/rc_$2.jsonl") | head -4)"
    fi
}
# activation bytes per rank, docs/recompute.md: 4BT[C + L*store + transient +
# (C+Vp+6) + 13C + C + 2] for tiny (C 64, NH 4, L 2, Vp 256) at T 32
rc_acts() {  # MODE B: the formula's bytes for B sequences
    local C=64 NH=4 L=2 Vp=256 T=32 store transient
    case $1 in
        none) store=$((18 * C + NH + 4)); transient=0 ;;
        selective) store=$((12 * C + NH + 4)); transient=$((6 * C)) ;;
        full) store=$C; transient=$((18 * C + NH + 4)) ;;
    esac
    echo $((4 * $2 * T * (C + L * store + transient + (C + Vp + 6) + 13 * C + C + 2)))
}
rc_peak() {  # LABEL MODE B NP WHAT: every rank's activation peak = the formula
    local want got i list=""
    want=$(rc_acts "$2" "$3")
    for ((i = 0; i < $4; i++)); do list="$list${list:+,}$want"; done
    got=$(grep '"type":"summary"' "$TEST_TMPDIR/rc_$1.jsonl" | grep -o '"activations":\[[0-9,]*\]')
    if [ "$got" = "\"activations\":[$list]" ]; then
        pass "recompute: $5 peak activation bytes per rank = the $2 formula ($want)"
    else
        fail "recompute: $5 activation peak" "want [$list], got $got"
    fi
}
rc_trace() {  # LABEL WHAT ARGS...: the trace is valid and agrees with the log
    local label=$1 what=$2 out
    shift 2
    if out=$(python3 tests/trace_check.py "$TEST_TMPDIR/rc_$label.json" "$TEST_TMPDIR/rc_$label.jsonl" "$@" 2>&1) &&
        python3 -m json.tool "$TEST_TMPDIR/rc_$label.json" >/dev/null 2>&1; then
        pass "trace: $what: valid JSON, nested spans, $(echo "$out" | grep -c '^PASS') checks against the log"
    else
        fail "trace: $what" "$(echo "$out" | grep -v '^PASS' | head -4)"
    fi
}
rc_run c0none 1 chapter-0
rc_run c0sel 1 chapter-0 --recompute selective
rc_run c0full 1 chapter-0 --recompute full --trace "$TEST_TMPDIR/rc_c0full.json"
rc_same c0sel c0none "chapter 0 selective"
rc_same c0full c0none "chapter 0 full"
rc_peak c0none none 8 1 "chapter 0 none"
rc_peak c0sel selective 8 1 "chapter 0 selective"
rc_peak c0full full 8 1 "chapter 0 full"
rc_trace c0full "chapter 0, recompute full" --layers 2 --recompute full
# chapter 2: overlapped buckets, 2 micro-batches per rank
rc_run c2none 2 chapter-2 --dp 2 --grad-accum 2 --bucket-kb 64
rc_run c2full 2 chapter-2 --dp 2 --grad-accum 2 --bucket-kb 64 --recompute full --trace "$TEST_TMPDIR/rc_c2full.json"
rc_same c2full c2none "chapter 2 dp=2 overlapped, grad-accum 2, full"
rc_peak c2full full 2 2 "chapter 2 dp=2 grad-accum 2 full"
rc_trace c2full "chapter 2 dp=2 overlapped, grad-accum 2" --layers 2 --micro 2 --recompute full
# chapter 3: ZeRO-3 recomputes after the block's gather in backward
rc_run c3none 2 chapter-3 --dp 2 --zero 3
rc_run c3sel 2 chapter-3 --dp 2 --zero 3 --recompute selective --trace "$TEST_TMPDIR/rc_c3sel.json"
rc_run c3full 2 chapter-3 --dp 2 --zero 2 --recompute full
rc_same c3sel c3none "chapter 3 ZeRO-3 dp=2 selective"
rc_same c3full c3none "chapter 3 ZeRO-2 dp=2 full"
rc_peak c3sel selective 4 2 "chapter 3 dp=2 selective"
rc_trace c3sel "chapter 3 ZeRO-3 dp=2, recompute selective" --layers 2 --recompute selective
# chapter 6: sequence parallelism (tp=2) and the ring (cp=2), recompute full
rc_run c6sp 2 chapter-6 --tp 2 --sp --recompute full --trace "$TEST_TMPDIR/rc_c6sp.json"
rc_trace c6sp "chapter 6 --tp 2 --sp, recompute full" --layers 2 --recompute full
rc_run c6ring 2 chapter-6 --cp 2 --recompute full --trace "$TEST_TMPDIR/rc_c6ring.json"
rc_trace c6ring "chapter 6 --cp 2 ring, recompute full" --layers 2 --recompute full
# chapters 4, 5 and 7 (tests/trace_check.py): chapter 4's TP blocks; chapter
# 5's stages each hold one of the 2 layers and run them once per microbatch
# (--pipeline reads that from the summary), zb's W spans (--split); chapter
# 7's MoE layers with their all-to-alls inside
rc_run c4 4 chapter-4 --dp 2 --tp 2 --steps 3 --trace "$TEST_TMPDIR/rc_c4.json"
rc_trace c4 "chapter 4 dp=2 x tp=2" --layers 2
rc_run c5 4 chapter-5 --pp 2 --dp 2 --schedule 1f1b --recompute full --steps 3 --trace "$TEST_TMPDIR/rc_c5.json"
rc_trace c5 "chapter 5 pp=2 x dp=2 1f1b, recompute full" --pipeline --recompute full
rc_run c5zb 4 chapter-5 --pp 2 --dp 2 --schedule zb --recompute selective --steps 3 --trace "$TEST_TMPDIR/rc_c5zb.json"
rc_trace c5zb "chapter 5 pp=2 x dp=2 zb, recompute selective" --pipeline --split --split-head --recompute selective
rc_run c7 4 chapter-7 --ep 2 --dp 2 --recompute full --steps 3 --trace "$TEST_TMPDIR/rc_c7.json"
rc_trace c7 "chapter 7 ep=2 x dp=2, recompute full" --layers 2 --recompute full
# the capstone (chapter 7's model) on the composed mesh dp x cp x ep =
# 2 x 2 x 2 (8 ranks on the machine's cores; the ring with zigzag),
# recompute full: valid and adding up, and every rank's timeline holds each
# axis's exchanges in flight or waited for: the ring's sends and receives
# (cp), the all-to-alls (ep) and the all-reduces of the two gradient groups
# (dp+cp+ep, dp+cp)
rc_run c7cp 8 capstone --dp 2 --cp 2 --ep 2 --cp-balance zigzag --recompute full --steps 3 --trace "$TEST_TMPDIR/rc_c7cp.json"
rc_trace c7cp "capstone dp x cp x ep = 2 x 2 x 2, recompute full" --layers 2 --recompute full
# rc_axes LABEL NP WHAT CAT:NAME...: every rank's timeline holds each span
rc_axes() {
    local label=$1 np=$2 what=$3 out
    shift 3
    if out=$(python3 - "$TEST_TMPDIR/rc_$label.json" "$np" "$@" 2>&1 <<'EOF_PY'
import json, sys
spans = [e for e in json.load(open(sys.argv[1]))["traceEvents"] if e.get("ph") == "X"]
want = [tuple(w.split(":", 1)) for w in sys.argv[3:]]
bad = []
for r in range(int(sys.argv[2])):
    have = {(e["cat"], e["name"]) for e in spans if e["pid"] == r}
    bad += [f"rank {r} has no {c} '{n}'" for c, n in want if (c, n) not in have]
if bad:
    print("; ".join(bad[:4]))
    sys.exit(1)
print(f"each of {sys.argv[2]} ranks: " + ", ".join(n for _, n in want))
EOF_PY
    ); then
        pass "trace: the capstone on $what shows every axis's exchanges on every rank ($out)"
    else
        fail "trace: the axes of the capstone on $what" "$out"
    fi
}
rc_axes c7cp 8 "dp x cp x ep = 2 x 2 x 2" "inflight:send (cp)" "inflight:recv (cp)" "inflight:alltoall (ep)" \
    "wait:allreduce (dp+cp+ep)" "wait:allreduce (dp+cp)"
# tp inside pp's stages (dp x tp x pp = 2 x 2 x 2, E = 4 on one ep rank):
# tp's all-gathers and reduce-scatters in each stage's layers, pp's
# messages, the three gradient groups (the replicated pieces over
# dp+tp+ep, the experts over dp+tp, the tp slices over dp+ep)
rc_run c7x 8 capstone --dp 2 --tp 2 --pp 2 --recompute full --steps 3 --trace "$TEST_TMPDIR/rc_c7x.json"
rc_trace c7x "capstone dp x tp x pp = 2 x 2 x 2, recompute full" --pipeline --recompute full
rc_axes c7x 8 "dp x tp x pp = 2 x 2 x 2" "wait:allgather (tp)" "wait:reduce_scatter (tp)" "inflight:send (pp)" \
    "wait:recv (pp)" "wait:allreduce (dp+tp+ep)" "wait:allreduce (dp+tp)" "wait:allreduce (dp+ep)"
# ... and fails on a pipeline rank that misses spans: zb's trace checked as
# if the schedule did not split backward (its W spans and their recomputes
# are then too many)
if python3 tests/trace_check.py "$TEST_TMPDIR/rc_c5zb.json" "$TEST_TMPDIR/rc_c5zb.jsonl" --pipeline \
    --recompute selective 2>&1 | grep -q '^FAIL every step of every rank holds'; then
    pass "trace: the checker finds a pipeline step with spans its schedule does not run"
else
    fail "trace: the checker on a pipeline trace without --split" "no FAIL line for the span counts"
fi
# ... and on the head's spans: chapter 5's zb W holds a "head backward
# weights" on the last stage, which the capstone's (head in B) does not
if a=$(python3 tests/trace_check.py "$TEST_TMPDIR/rc_c5zb.json" "$TEST_TMPDIR/rc_c5zb.jsonl" --pipeline --split \
    --recompute selective 2>&1); echo "$a" | grep -q "^FAIL every step .*head forward, backward, backward weights spans \[2, 2, 2\]; want \[2, 2, 0\]"; then
    pass "trace: the checker counts the head's spans on the last stage (zb's W: head backward weights)"
else
    fail "trace: the checker on the head's spans" "$(echo "$a" | grep '^FAIL' | head -2)"
fi
# the checker can fail: the first block 0 forward made to last past its step
sed '0,/\("name":"block 0 forward","cat":"compute","ph":"X","ts":[0-9.]*,"dur":\)/s//\199999999/' \
    "$TEST_TMPDIR/rc_c3sel.json" > "$TEST_TMPDIR/rc_broken.json"
cp "$TEST_TMPDIR/rc_c3sel.jsonl" "$TEST_TMPDIR/rc_broken.jsonl"
if ! python3 tests/trace_check.py "$TEST_TMPDIR/rc_broken.json" "$TEST_TMPDIR/rc_broken.jsonl" --layers 2 \
    --recompute selective 2>&1 | grep -q '^FAIL every rank.s host row is well nested'; then
    fail "trace: the checker finds a span that crosses its neighbour" "no FAIL line for the nesting"
else
    pass "trace: the checker finds a span that crosses its neighbour"
fi
# a resumed run's trace numbers its steps as its log does (it named them
# from 0: the timeline of steps 4..5 found none), and validation between
# steps is a span of its own holding its forwards (they lay outside every
# step, unmarked)
rc_run c0ck 1 chapter-0 --ckpt-dir "$TEST_TMPDIR/rc_ck" --save-every 3
rc_run c0res 1 chapter-0 --resume "$TEST_TMPDIR/rc_ck/step-00000003" --val-every 2 --trace "$TEST_TMPDIR/rc_c0res.json"
rc_trace c0res "chapter 0 resumed at step 3, --val-every 2" --layers 2
names=$(python3 -c 'import json, sys
spans = [e for e in json.load(open(sys.argv[1]))["traceEvents"] if e.get("ph") == "X" and e["cat"] in ("step", "validation")]
print(";".join(e["name"] for e in sorted(spans, key=lambda e: e["ts"])))' "$TEST_TMPDIR/rc_c0res.json" 2>&1)
if [ "$names" = "step 3;validation after step 3;step 4;step 5;validation after step 5" ]; then
    pass "trace: a resumed run's steps keep the log's numbers, and each validation is a span between them ($names)"
else
    fail "trace: a resumed run's step and validation spans" "$names"
fi
error_case chapter-2 2 "--dp 2 --recompute some" "--recompute some is not one of none, selective, full"
error_case chapter-3 2 "--dp 2 --trace /nonexistent-dir/t.json" "cannot write --trace '/nonexistent-dir/t.json'"
finish
