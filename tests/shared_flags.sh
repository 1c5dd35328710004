#!/bin/bash
# tests/shared_flags.sh: every shared flag through every training chapter
# (0, 2..7), the same check for each, so a chapter whose loop drifts from
# the others fails here (issue 30: `--val-every 1 --steps 3` gave chapter 2
# one validation line and every other chapter three).
#
# The table: one row per (flag, chapter). Each chapter runs on its smallest
# mesh (1 or 2 ranks) the tiny model for 3 steps, seven runs per chapter:
#   A  --val-every 1 --recompute full --trace --save --log
#   B  --ckpt-dir --save-every 2 --log        (the plain run)
#   C  --resume B's step-2 checkpoint         (step 2 alone)
#   D  --comm hand                            (chapters 2..7; chapter 0 refuses it)
#   E  --model A's --save file --steps 0      (the saved model loads)
#   S  --sample 20 after one step             (alone: a chapter that refuses it fails one row)
#   X  --tf32 --log                           (the CPU build: accepted, no effect)
# and the checks, the same for every chapter:
#   --val-every  3 validation records (after steps 0, 1, 2) and 3 "val loss"
#                lines, the summary's val_loss the last of them
#   --sample     "sample (20 tokens):" then 20 characters (a byte-level
#                model: one character a token)
#   --log        step records with the same fields in every chapter, steps
#                0..2 in order; the summary last, holding every field
#                chapter 0's summary has; its final_loss the last step's
#   --save       E's loss before training = A's final validation loss
#   --resume     C's step 2 = B's step 2, loss and norm, bit for bit
#   --recompute  A's losses and norms = B's, bit for bit (recomputing runs
#                the same forward again: the same bits)
#   --trace      one JSON object; every rank has 3 step spans, and rank 0's
#                timed step spans (steps 1, 2) add up to the summary's
#                ms_per_step x 2 (the same clock reads)
#   --comm hand  (2..7) summary comm_impl "hand", hand_collectives > 0,
#                losses = B's within 1e-5 (hand collectives may add in
#                another order); chapter 0 (one rank, no collectives) refuses
#                the flag with one error line and a non-zero exit
#   --tf32       (CPU) exit 0, one line "note: --tf32 has no effect on the
#                CPU backend ...", and B's losses and norms bit for bit (the
#                flag changes nothing on the CPU: docs/cuda.md, section 3)
#   --peak-gflops  summary peak_gflops = ranks x the given 7, and mfu = that
#                tokens_per_s x flops_per_token / (peak x 1e9)
# Floats out of reductions are compared within the tolerances above; counts
# and field names exactly.
. "$(dirname "$0")/lib.sh"

echo "== shared flags: each through every chapter"
S=$TEST_TMPDIR/shared_flags
mkdir -p "$S"
# (SHARED_FLAGS_CHAPTERS: a subset, 0 first: its summary is the reference)
CHAPTERS=${SHARED_FLAGS_CHAPTERS:-0 2 3 4 5 6 7}
# the smallest mesh of each chapter that uses its axis
declare -A NP=([0]=1 [2]=2 [3]=2 [4]=2 [5]=2 [6]=2 [7]=2)
declare -A MESH=([0]="" [2]="--dp 2" [3]="--dp 2" [4]="--tp 2" [5]="--pp 2" [6]="--cp 2" [7]="--ep 2")
F="--model tiny --batch 4 --seq 16 --steps 3 --wd 0.1 --peak-gflops 7"

# The seven runs of chapter $1; each writes $S/c$1_X.{out,jsonl,rc}.
chapter_runs() {
    local c=$1 d=$S/c$1
    local P="$BUILD/chapter-$c"
    mkdir -p "$d"
    run() {  # run NAME ARGS...
        local name=$1
        shift
        mpi_run --may-fail $T_SHORT ${NP[$c]} "$P" ${MESH[$c]} "$@"
        echo "$RC" > "$d/$name.rc"
        cp "$OUT_FILE" "$d/$name.out"  # the bytes as printed: a sampled byte may be anything
        echo "$CMD" > "$d/$name.cmd"
    }
    run A $F --val-every 1 --recompute full --trace "$d/A.trace.json" --save "$d/A.bin" --log "$d/A.jsonl"
    run B $F --ckpt-dir "$d/ckpt" --save-every 2 --log "$d/B.jsonl"
    run C $F --resume "$d/ckpt/step-00000002" --log "$d/C.jsonl"
    run D $F --comm hand --log "$d/D.jsonl"
    run E --model "$d/A.bin" --batch 4 --seq 16 --steps 0 --peak-gflops 7 --log "$d/E.jsonl"
    run S --model tiny --batch 4 --seq 16 --steps 1 --peak-gflops 7 --sample 20
    run X $F --tf32 --log "$d/X.jsonl"
}
for c in $CHAPTERS; do jobs_run chapter_runs "$c"; done
jobs_wait

# Every check on every chapter's runs: prints one PASS/FAIL line per
# (flag, chapter). Chapter 0's summary fields are the set every chapter must
# hold.
checks=$(python3 - "$S" $CHAPTERS <<'EOF'

import json, math, os, re, sys

S, chapters = sys.argv[1], sys.argv[2:]
STEPS, SAMPLE, PEAK = 3, 20, 7.0


def read(c, run, ext):
    p = os.path.join(S, "c" + c, run + "." + ext)
    return open(p, encoding="latin-1").read() if os.path.exists(p) else ""  # a byte a character


def records(c, run):
    out = []
    for line in read(c, run, "jsonl").splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            out.append({"type": "unparsable", "line": line})
    return out


def rc(c, run):
    t = read(c, run, "rc").strip()
    return int(t) if t else -1


def of(recs, kind):
    return [r for r in recs if r.get("type") == kind]


def summary(recs):
    s = of(recs, "summary")
    return s[-1] if s else {}


def row(flag, c, ok, why):
    print(("PASS shared flags: %s in chapter %s (%s)" % (flag, c, why)) if ok
          else ("FAIL shared flags: %s in chapter %s: %s" % (flag, c, why)))


def ran(c, run):
    if rc(c, run) != 0:
        err = [l for l in read(c, run, "out").splitlines() if "error" in l.lower()]
        return "run %s exited %d: %s (%s)" % (run, rc(c, run), err[0] if err else "no error line",
                                             read(c, run, "cmd").strip())
    return None


def steps_of(recs):
    return [(r["step"], r["loss"], r["norm"]) for r in of(recs, "step")]


ref_fields = set(summary(records("0", "B")).keys())
ref_step_fields = set(of(records("0", "B"), "step")[0].keys()) if of(records("0", "B"), "step") else set()
for c in chapters:
    A, B, C, D, E = (records(c, r) for r in "ABCDE")
    sa, sb = summary(A), summary(B)
    bad_a, bad_b = ran(c, "A"), ran(c, "B")

    # --val-every 1 --steps 3: a validation after every step, the last one final
    vals = of(A, "val")
    lines = [l for l in read(c, "A", "out").splitlines() if re.match(r"^step +\d+ \| val loss ", l)]
    ok = (not bad_a and [v["step"] for v in vals] == [0, 1, 2] and len(lines) == 3
          and sa.get("val_loss") == vals[-1]["val_loss"])
    row("--val-every 1 --steps 3", c, ok, bad_a or "val records after steps %s, %d val lines, summary val_loss %s"
        % ([v["step"] for v in vals], len(lines), sa.get("val_loss")))

    # --sample 20: the header, then 20 characters
    bad_s = ran(c, "S")
    out = read(c, "S", "out")
    m = re.search(r"\nsample \((\d+) tokens\):\n", out)
    text = out[m.end():m.end() + SAMPLE] if m else ""
    ok = not bad_s and m is not None and int(m.group(1)) == SAMPLE and len(text) == SAMPLE
    row("--sample 20", c, ok, bad_s or ("prints %d characters" % len(text) if m else "no 'sample (N tokens):' line"))

    # --log: the same step fields, steps in order, the summary last with every
    # field of chapter 0's, final_loss the last step's
    st = of(B, "step")
    step_fields = set(st[0].keys()) if st else set()
    missing = sorted(ref_fields - set(sb.keys()))
    ok = (not bad_b and [r["step"] for r in st] == list(range(STEPS)) and B and B[-1].get("type") == "summary"
          and ref_step_fields <= step_fields and not missing and sb.get("steps") == STEPS
          and st and sb.get("final_loss") == st[-1]["loss"])
    row("--log (step and summary fields)", c, ok, bad_b or "steps %s, last record %s, missing summary fields %s, missing step fields %s"
        % ([r["step"] for r in st], B[-1].get("type") if B else None, missing, sorted(ref_step_fields - step_fields)))

    # --save: the file loads, and its validation loss is A's final one
    bad_e = ran(c, "E")
    ve = of(E, "val")
    ok = not bad_a and not bad_e and len(ve) == 1 and ve[0]["step"] == -1 and vals and ve[0]["val_loss"] == vals[-1]["val_loss"]
    row("--save (loads with --model, --steps 0)", c, ok, bad_a or bad_e or "loaded val loss %s, trained %s"
        % (ve[0]["val_loss"] if ve else None, vals[-1]["val_loss"] if vals else None))

    # --resume: step 2 again from the step-2 checkpoint, bit for bit
    # (by construction: the same mesh, so the same calls on the same rows)
    bad_c = ran(c, "C")
    ok = not bad_b and not bad_c and steps_of(C) == steps_of(B)[2:] and len(steps_of(C)) == 1
    row("--resume (step 2 from the step-2 checkpoint)", c, ok, bad_b or bad_c or "resumed %s, trained %s"
        % (steps_of(C), steps_of(B)[2:]))

    # --recompute full: the same losses and norms, bit for bit
    # (by construction: the same calls on the same rows, recomputed)
    ok = not bad_a and not bad_b and steps_of(A) == steps_of(B) and len(steps_of(A)) == STEPS
    row("--recompute full", c, ok, bad_a or bad_b or "with %s, without %s" % (steps_of(A), steps_of(B)))

    # --trace: a Chrome trace with 3 step spans per rank, rank 0's timed ones
    # adding up to the summary's ms per step (3 decimals: a microsecond of rounding each)
    why = bad_a
    if not why:
        try:
            ev = [e for e in json.loads(read(c, "A", "trace.json"))["traceEvents"] if e.get("ph") == "X"]
            world = sa.get("world_size", 0)
            per = {r: sorted((e for e in ev if e.get("cat") == "step" and e.get("pid") == r), key=lambda e: e["ts"])
                   for r in range(world)}
            counts = [len(per[r]) for r in range(world)]
            timed = sum(e["dur"] for e in per[0][1:]) / 1e3 if world else 0
            want = sa["ms_per_step"] * (STEPS - 1)
            if counts != [STEPS] * world:
                why = "step spans per rank %s, want %d each" % (counts, STEPS)
            elif abs(timed - want) > 0.002 * STEPS:
                why = "rank 0's timed step spans %.3f ms, summary %.3f ms" % (timed, want)
        except (ValueError, KeyError) as e:
            why = "no trace of Chrome events: %s" % e
    row("--trace", c, not why, why or "3 step spans on each of %d ranks, adding up to ms_per_step" % sa.get("world_size", 0))

    # --comm hand
    bad_d = ran(c, "D")
    sd = summary(D)
    if c == "0":
        out = read(c, "D", "out")
        errs = [l for l in out.splitlines() if l.startswith("error:")]
        ok = rc(c, "D") != 0 and len(errs) == 1 and "--comm" in errs[0]
        row("--comm hand (refused on one rank)", c, ok, "exit %d, %s" % (rc(c, "D"), errs))
    else:
        ld, lb = steps_of(D), steps_of(B)
        close = len(ld) == len(lb) == STEPS and all(abs(x[1] - y[1]) <= 1e-5 and abs(x[2] - y[2]) <= 1e-5 for x, y in zip(ld, lb))
        ok = not bad_d and sd.get("comm_impl") == "hand" and sd.get("hand_collectives", 0) > 0 and close
        row("--comm hand", c, ok, bad_d or "comm_impl %s, hand_collectives %s, losses within 1e-5 of library's: %s"
            % (sd.get("comm_impl"), sd.get("hand_collectives"), close))

    # --tf32 on the CPU: accepted, said to do nothing, and doing nothing
    bad_x = ran(c, "X")
    notes = [l for l in read(c, "X", "out").splitlines() if l.startswith("note: --tf32 has no effect on the CPU backend")]
    ok = not bad_x and not bad_b and len(notes) == 1 and steps_of(records(c, "X")) == steps_of(B) and len(steps_of(B)) == STEPS
    row("--tf32 (CPU: a note, no effect)", c, ok, bad_x or bad_b or "%d note lines, losses and norms %s, without %s"
        % (len(notes), steps_of(records(c, "X")), steps_of(B)))

    # --peak-gflops 7: the sum over ranks, and MFU from it
    world = sb.get("world_size", 0)
    peak = sb.get("peak_gflops", 0)
    mfu = sb.get("tokens_per_s", 0) * sb.get("flops_per_token", 0) / (peak * 1e9) if peak else -1
    ok = not bad_b and abs(peak - PEAK * world) < 0.01 and world > 0 and abs(sb.get("mfu", -2) - mfu) <= 1e-5 + 1e-3 * mfu
    row("--peak-gflops 7", c, ok, bad_b or "peak_gflops %s on %s ranks, mfu %s (from the figures %.5f)"
        % (peak, world, sb.get("mfu"), mfu))
EOF
)
prc=$?
count_lines "$checks"
[ $prc = 0 ] || [ -n "$(echo "$checks" | grep '^FAIL')" ] || fail "shared flags: the checker" "python exited $prc: $checks"
finish
