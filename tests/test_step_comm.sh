#!/bin/bash
# test_step_comm.sh: docs/plots/step_comm.py (make capstone, docs/capstone.md)
# on fresh traces of build/capstone (the page's listing is quoted from a committed
# trace; this checks the tool on this machine's runs). Prints PASS/FAIL/SKIP
# lines; tests/plots.sh counts them. Takes ~20 s.
#
#   1. the page's mesh dp 2 x tp 2 x cp 2 (ring) x ep 2 on 16 ranks, and
#      dp 2 x cp 2 (ring) x ep 2, dp 2 x cp 2 (Ulysses) x ep 2 with
#      --ep-overlap 2, dp 4 x ep 2 on 8 ranks, tp 2 x ep 2 on 4: 2 or 3
#      steps of the test model with --trace and --log;
#   2. tests/step_comm_check.py: every rank's every step lists the collectives
#      capstone/main.c and chapter 6's attention half (composed_attention.c
#      calls it) issue, in their order, on their
#      groups, with the bytes that do not depend on the routing (the ring's
#      messages, tp's all-gathers and reduce-scatters, the dispatch's total,
#      the gradients' all-reduces), and the calls and bytes add up to the
#      summary's counters;
#   3. the check fails on four-axis traces made wrong on purpose (a
#      collective moved to another group, the gradient all-reduces swapped,
#      a send dropped, tp's all-gather and reduce-scatter swapped, a tp
#      all-gather's bytes halved, the tp slices' all-reduce on another
#      group), and the tool refuses a trace without bytes and a step that is
#      not there; a trimmed trace (--trim) lists the same as the whole;
#   4. the picture is a PNG, and make capstone's command line is the one the
#      docs' figure came from.
set -u
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
MPIRUN="bash tests/mpirun.sh"
pass() { echo "PASS $1"; }
fail() { echo "FAIL $1: $2"; }
skip() { echo "SKIP $1: $2"; }

if [ ! -x "$BUILD/capstone" ]; then
    fail "step_comm" "$BUILD/capstone is not built (make all)"
    exit 1
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
FLAGS="--batch 24 --seq 32 --peak-gflops 10 --experts 4 --top-k 2"

# ---------------------------------------------------------------- 1-2. real traces
# run NAME NP STEPS TOKENS CHECK-FLAGS -- CAPSTONE-FLAGS
# TOKENS: a rank's tokens, 24 / (dp ep tp) sequences of 32 / cp positions
run() {
    local name=$1 np=$2 steps=$3 tokens=$4 check=$5 out
    shift 6
    if ! out=$(timeout 180 $MPIRUN -np "$np" "$BUILD/capstone" $FLAGS --steps "$steps" "$@" \
            --trace "$tmp/$name.json" --log "$tmp/$name.jsonl" 2>&1); then
        fail "step_comm: capstone $*" "$(echo "$out" | tail -3 | tr '\n' ' ')"
        return 1
    fi
    # the parameters the gradient all-reduces carry, as the run prints them
    local P Q
    P=$(echo "$out" | grep -o '(\([0-9]*\) replicated' | grep -o '[0-9]*')
    Q=$(echo "$out" | grep -o '[0-9]* in experts' | grep -o '^[0-9]*')
    Q=$((Q / 2))  # ep 2: half the experts on each rank
    if out=$(python3 tests/step_comm_check.py "$tmp/$name.json" "$tmp/$name.jsonl" --layers 2 --top-k 2 \
            --channels 64 --tokens "$tokens" --replicated "$P" --experts-local "$Q" $check 2>&1); then
        pass "step_comm: $name: $out"
    else
        fail "step_comm: $name" "$(echo "$out" | head -4 | tr '\n' ' ')"
    fi
}
# the page's mesh: four axes on 16 ranks (tokens: 24 / 8 x 32 / 2)
run mesh4 16 2 48 "--chunks 1 --cp-mode ring --tp 2" -- --dp 2 --tp 2 --cp 2 --ep 2
run ring 8 3 96 "--chunks 1 --cp-mode ring" -- --dp 2 --cp 2 --ep 2
run ulysses 8 2 96 "--chunks 2 --cp-mode ulysses" -- --dp 2 --cp 2 --ep 2 --cp-mode ulysses --ep-overlap 2
run nocp 8 2 96 "--chunks 1 --cp-mode none" -- --dp 4 --ep 2
run tpnocp 4 2 192 "--chunks 1 --cp-mode none --tp 2" -- --tp 2 --ep 2

# ---------------------------------------------------------------- 3. made wrong on purpose
# on the four-axis trace (P = 54912 replicated, Q = 264704 / 2 experts a rank)
CHECK="--layers 2 --top-k 2 --channels 64 --tokens 48 --replicated 54912 --experts-local 132352 --chunks 1 --cp-mode ring --tp 2"
# tamper HOW OUT: the four-axis trace with one change (python below)
tamper() {
    python3 - "$tmp/mesh4.json" "$2" "$1" <<'PY'
import json, sys
src, dst, how = sys.argv[1:4]
doc = json.load(open(src))
ev = doc["traceEvents"]
rank = [e for e in ev if e.get("ph") == "X" and e["pid"] == 3]
rank.sort(key=lambda e: e["ts"])
if how == "group":    # rank 3's first dispatch goes over dp instead of ep
    e = next(e for e in rank if e["name"] == "start alltoall (ep)")
    e["name"] = "start alltoall (dp)"
elif how == "swap":   # the gradients' two all-reduces of rank 3's last step, swapped
    a = [e for e in rank if e["name"] in ("allreduce (dp+tp+cp+ep)", "allreduce (dp+tp+cp)") and e["args"]["bytes"] > 4]
    a[-2]["name"], a[-1]["name"] = a[-1]["name"], a[-2]["name"]
elif how == "drop":   # one of rank 3's ring sends (its start span) is lost
    e = next(e for e in rank if e["name"] == "start send (cp)")
    ev.remove(e)
elif how == "tp-order":  # rank 3's first tp all-gather and reduce-scatter trade places
    g = next(e for e in rank if e["name"] == "allgather (tp)")
    r = next(e for e in rank if e["name"] == "reduce_scatter (tp)")
    g["name"], r["name"] = r["name"], g["name"]
elif how == "tp-bytes":  # rank 3's first tp all-gather counted as this rank's rows only
    e = next(e for e in rank if e["name"] == "allgather (tp)")
    e["args"]["bytes"] //= 2
elif how == "slices":  # the tp slices' all-reduce over tp's group instead of dp+cp+ep
    e = [e for e in rank if e["name"] == "allreduce (dp+cp+ep)"][-1]
    e["name"] = "allreduce (dp+tp+cp)"
elif how == "nobytes":
    for e in ev:
        if e.get("cat") in ("wait", "comm", "inflight"):
            e.pop("args", None)
json.dump(doc, open(dst, "w"))
PY
}
if [ -s "$tmp/mesh4.json" ]; then
    for how in group swap drop tp-order tp-bytes slices; do
        # the defect made (a tamper that found nothing to change would leave
        # no file, or the same one), then a FAIL line of the check itself
        rm -f "$tmp/$how.json"
        if ! tamper $how "$tmp/$how.json" || ! [ -s "$tmp/$how.json" ] ||
            python3 -c 'import json, sys; sys.exit(json.load(open(sys.argv[1])) != json.load(open(sys.argv[2])))' \
                "$tmp/mesh4.json" "$tmp/$how.json"; then
            fail "step_comm: the trace with $how" "the tamper made no changed trace"
        elif out=$(python3 tests/step_comm_check.py "$tmp/$how.json" "$tmp/mesh4.jsonl" $CHECK 2>&1); then
            fail "step_comm: the check on a trace with $how" "passed: $out"
        elif ! echo "$out" | grep -q '^FAIL '; then
            fail "step_comm: the check on a trace with $how" "failed without a FAIL line of its own: $(echo "$out" | tail -2 | tr '\n' ' ')"
        else
            pass "step_comm: the check fails on a trace with $how ($(echo "$out" | head -1 | cut -c1-120))"
        fi
    done
    tamper nobytes "$tmp/nobytes.json"
    out=$(python3 docs/plots/step_comm.py "$tmp/nobytes.json" 2>&1)
    if [ $? -ne 0 ] && echo "$out" | grep -q 'has no bytes'; then
        pass "step_comm: refuses a trace whose spans carry no bytes"
    else
        fail "step_comm: a trace without bytes" "$out"
    fi
    python3 docs/plots/step_comm.py "$tmp/mesh4.json" --step 1 --trim "$tmp/trim.json" > "$tmp/whole.txt" 2>&1
    python3 docs/plots/step_comm.py "$tmp/trim.json" --step 1 > "$tmp/trim.txt" 2>&1
    if [ -s "$tmp/whole.txt" ] && grep -q '^step 1 of rank 0 (16 ranks)' "$tmp/trim.txt" && cmp -s "$tmp/whole.txt" "$tmp/trim.txt" &&
        [ "$(stat -c %s "$tmp/trim.json")" -lt 40000 ]; then
        pass "step_comm: a trimmed trace ($(($(stat -c %s "$tmp/trim.json") / 1024)) KiB) lists what the whole one does"
    else
        fail "step_comm: --trim" "$(diff "$tmp/whole.txt" "$tmp/trim.txt" | head -3 | tr '\n' ' ')"
    fi
    out=$(python3 docs/plots/step_comm.py "$tmp/mesh4.json" --step 9 2>&1)
    if [ $? -ne 0 ] && echo "$out" | grep -q 'no step 9 on rank 0 (it has steps 0..1)'; then
        pass "step_comm: refuses a step the trace does not hold, naming those it holds"
    else
        fail "step_comm: --step 9" "$out"
    fi

    # ---------------------------------------------------------------- 4. the picture
    if ! command -v gnuplot >/dev/null 2>&1; then
        skip "step_comm: the picture" "gnuplot not installed"
    else
        python3 docs/plots/step_comm.py "$tmp/mesh4.json" "$tmp/step.png" --title test > /dev/null 2>&1
        size=$(stat -c %s "$tmp/step.png" 2>/dev/null || echo 0)
        magic=$(head -c 8 "$tmp/step.png" 2>/dev/null | od -An -tx1 | tr -d ' \n')
        if [ "$magic" = 89504e470d0a1a0a ] && [ "$size" -gt 20000 ]; then
            pass "step_comm: draws a PNG of $((size / 1024)) KiB"
        else
            fail "step_comm: the picture" "magic '$magic', $size bytes"
        fi
        # a title with a quote and a backslash (it broke the gnuplot script
        # and left a PNG of 0 bytes), an output nowhere and a --trim nowhere
        # (a traceback): the picture, or one line and no file; and timeline.py
        # (make timeline) alike, with a STEPS that is not FIRST:LAST
        bad=""
        rm -f "$tmp/q.png" "$tmp/t.png"
        python3 docs/plots/step_comm.py "$tmp/mesh4.json" "$tmp/q.png" --title 'a "b" \ c' > /dev/null 2>&1 &&
            [ "$(head -c 4 "$tmp/q.png" | od -An -tx1 | tr -d ' \n')" = 89504e47 ] || bad="$bad step_comm's quoted title;"
        out=$(python3 docs/plots/step_comm.py "$tmp/mesh4.json" "$tmp/no/q.png" 2>&1 >/dev/null)
        [ $? = 1 ] && ! echo "$out" | grep -q Traceback && [ ! -e "$tmp/no" ] || bad="$bad step_comm to a missing folder: $out;"
        out=$(python3 docs/plots/step_comm.py "$tmp/mesh4.json" --trim "$tmp/no/t.json" 2>&1 >/dev/null)
        [ $? = 1 ] && echo "$out" | grep -q "^step_comm: cannot write --trim" || bad="$bad --trim to a missing folder: $out;"
        python3 docs/plots/timeline.py "$tmp/mesh4.json" "$tmp/t.png" "" "it's \"quoted\"" > /dev/null 2>&1 &&
            [ "$(head -c 4 "$tmp/t.png" | od -An -tx1 | tr -d ' \n')" = 89504e47 ] || bad="$bad timeline's quoted title;"
        out=$(python3 docs/plots/timeline.py "$tmp/mesh4.json" "$tmp/t2.png" abc 2>&1)
        [ $? = 1 ] && echo "$out" | grep -q "^timeline: STEPS=abc: give FIRST:LAST" && [ ! -e "$tmp/t2.png" ] || bad="$bad STEPS=abc: $out;"
        if [ -z "$bad" ]; then
            pass "step_comm and timeline: a quoted title draws, a missing folder or bad STEPS is one error line and no file"
        else
            fail "step_comm and timeline: their input" "$bad"
        fi
    fi
fi
if make -n --no-print-directory capstone DOCS=1 2>/dev/null | grep -q 'step_comm.py docs/plots/data/capstone/step1_rank0.json docs/plots/capstone_step.png' &&
    make -n --no-print-directory capstone DOCS=1 2>/dev/null | grep -q 'step_comm.py .* --trim docs/plots/data/capstone/step1_rank0.json' &&
    make -n --no-print-directory capstone 2>/dev/null | grep -q 'np 16 [^ ]*/capstone --dp 2 --tp 2 --cp 2 --ep 2'; then
    pass "step_comm: make capstone runs build/capstone on dp 2 x tp 2 x cp 2 x ep 2 and DOCS=1 trims docs/plots/data/capstone/ and draws docs/plots/capstone_step.png from it"
else
    fail "step_comm: make capstone" "$(make -n --no-print-directory capstone DOCS=1 2>&1 | tail -2 | tr '\n' ' ')"
fi
# the last line: plots.sh fails a run that ended before it (an error of this script)
echo "END of tests/test_step_comm.sh"
