#!/bin/bash
# Chapter 5: pipeline parallelism. The schedules as data on a grid without
# training (test_schedule); the invariant for every schedule on pp = 2, 3, 4,
# m = 1, pp, 2 pp, an uneven layer split and dp x pp = 2 x 2; each stage's
# activation bytes against the formula; the timelines in the log;
# training-state checkpoints (resume on pp=2, chapter 5 <-> chapter 0);
# --show-schedule; bad input; --help. --recompute selective and full run with
# every schedule among the invariant's cases, their activation bytes too.
. "$(dirname "$0")/lib.sh"

echo "== chapter 5: pipeline parallelism"
# the schedules: valid lists, peaks in flight and bubbles = the formulas
run_program "$BUILD/tests/test_schedule"

# The invariant against chapter 0 on the same model and batch: tiny (2 layers)
# for pp = 2 with a layer a stage, tiny6 (6 layers) for pp = 2, 3, 4 (6 over
# 4 stages is the uneven 2, 2, 1, 1). Batch 8 splits into m = 1, 2, 4, 8;
# batch 6 into m = 1, 3, 6 for pp = 3. 10 AdamW steps of 32 tokens a sequence.
pp_T=32
pp_flags() { echo "--model $1 --steps 10 --batch $2 --seq $pp_T --peak-gflops 10"; }
# pp_acts B DP PP M SCHED RECOMPUTE LAYERS...: each rank's activation bytes
# from the formula (docs/05_pipeline.md, "The idea"): a shared BlockScratch
# and (--recompute selective, full) the one transient of docs/recompute.md,
# plus per microbatch in flight a slot: the chunk's input and dres (2btC),
# what its layers keep (store: 18C + NH + 4 floats a token for none,
# 12C + NH + 4 selective, C full), the head's on the last stage, the stash with a
# split backward, the token ids at the ends. Slots in flight: m (gpipe),
# min(pp, m) (zb), min(pp - s, m) (1f1b). tiny's C = 64, NH = 4, Vp = 256.
pp_acts() {
    local B=$1 dp=$2 pp=$3 m=$4 sched=$5 rc=$6
    shift 6
    awk -v B=$B -v dp=$dp -v pp=$pp -v m=$m -v sched=$sched -v rc=$rc -v T=$pp_T -v layers="$*" 'BEGIN {
        C = 64; NH = 4; Vp = 256; b = B / (dp * m); bt = b * T; split(layers, n, " ")
        store = 18 * C + NH + 4; transient = 0
        if (rc == "selective") { store = 12 * C + NH + 4; transient = 6 * C }
        if (rc == "full") { store = C; transient = 18 * C + NH + 4 }
        for (s = 0; s < pp; s++) {
            L = n[s + 1]; first = s == 0; last = s == pp - 1
            slot = 2 * bt * C + L * bt * store + (last ? bt * (C + Vp + 6) : 0) + (first ? bt : 0) + (last ? bt : 0)
            if (sched == "zb") slot += L * bt * 11 * C + (last ? bt * C : 0)
            if (sched == "gpipe") k = m; else if (sched == "zb") k = (pp < m ? pp : m); else k = (pp - s < m ? pp - s : m)
            for (d = 0; d < dp; d++) out = out (out == "" ? "" : ",") 4 * (bt * (13 * C + transient) + k * slot)
        }
        print "[" out "]" }'
}
# timeline_check LOG DP: every timeline record names its rank's place
# (dp varies fastest, mesh.h: stage rank / DP, dp rank rank % DP), and the
# summary's bubble_measured is the mean over the timed steps (1..9) of each
# step's 1 - busy / (ranks x span), recomputed from the records' times (the
# same stamps, rounded to the microsecond: within 2e-3)
timeline_check() {
    python3 - "$1" "$2" <<'PY'
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1]) if '"type":"timeline"' in l or '"type":"summary"' in l]
dp = int(sys.argv[2])
steps = {}
for r in recs:
    if r["type"] != "timeline":
        continue
    if r["stage"] != r["rank"] // dp or r["dp"] != r["rank"] % dp:
        sys.exit("rank %d logged as stage %d, dp %d" % (r["rank"], r["stage"], r["dp"]))
    steps.setdefault(r["step"], []).append(r["actions"])
bubbles = []
for step in sorted(steps):
    acts = [a for rank in steps[step] for a in rank]
    t0, t1 = min(a[3] for a in acts), max(a[4] for a in acts)
    busy = sum(a[4] - a[3] for a in acts)
    if step > 0:
        bubbles.append(1 - busy / (len(steps[step]) * (t1 - t0)))
want = sum(bubbles) / len(bubbles)
got = [r for r in recs if r["type"] == "summary"][-1]["bubble_measured"]
if abs(got - want) > 2e-3:
    sys.exit("bubble_measured %.4f, the timelines' %.4f" % (got, want))
print("bubble_measured %.4f, the timelines' %.4f" % (got, want))
PY
}
# pp_case MODEL B DP PP M SCHED V LAYERS [RECOMPUTE]: the invariant (losses,
# norms and the validation loss, which runs forward through the stages on
# each dp rank's share), the timelines, and (v = 1) the activation bytes of
# every rank
pp_case() {
    local model=$1 B=$2 dp=$3 pp=$4 m=$5 sched=$6 v=$7 layers=$8 rc=${9:-none} want got n
    local name="pipeline $sched dp=$dp pp=$pp m=$m v=$v ($model, layers per stage $layers)"
    [ $rc = none ] || name="$name, recompute $rc"
    invariant --norm --val "$name" "$(pp_flags $model $B)" $((dp * pp)) chapter-5 \
        "--dp $dp --pp $pp --schedule $sched --virtual $v --microbatches $m --recompute $rc"
    # each rank logs its timeline every step, and the summary the measured bubble
    n=$(grep -c '"type":"timeline"' "$INV_LOG")
    if [ "$n" = $((10 * dp * pp)) ] && got=$(timeline_check "$INV_LOG" $dp 2>&1); then
        pass "$name: a timeline per rank per step, each rank's stage and dp rank, and the measured bubble ($got)"
    else
        fail "$name: timelines" "$n timeline records, want $((10 * dp * pp)); ${got:-}; command: $CMD"
    fi
    [ $v = 1 ] || return 0
    want=$(pp_acts $B $dp $pp $m $sched $rc $(echo $layers | tr ',' ' '))
    got=$(grep '"type":"summary"' "$INV_LOG" | sed 's/.*"activations":\(\[[0-9,]*\]\).*/\1/')
    if [ "$want" = "$got" ]; then
        pass "$name: peak activation bytes per rank = the formula $want"
    else
        fail "$name: activation memory" "want $want, got $got; command: $CMD"
    fi
}
# --recompute (docs/recompute.md): every schedule with each mode, among the
# cases (a slot keeps less of each layer; the rank holds one transient)
pp_case tiny 8 1 2 1 gpipe 1 "1,1"
pp_case tiny 8 1 2 2 1f1b 1 "1,1"
pp_case tiny6 8 1 2 4 interleaved 3 "3,3"
pp_case tiny6 8 1 2 4 interleaved 3 "3,3" full
pp_case tiny6 8 1 2 2 zb 1 "3,3"
pp_case tiny6 8 1 4 8 1f1b 1 "2,2,1,1" selective
pp_case tiny6 8 1 4 4 zb 1 "2,2,1,1" full
pp_case tiny6 8 1 4 1 gpipe 1 "2,2,1,1" full
pp_case tiny6 8 2 2 4 zb 1 "3,3" selective
pp_case tiny6 6 1 3 3 interleaved 2 "2,2,2" selective
pp_case tiny6 6 1 3 6 gpipe 1 "2,2,2" selective
pp_case tiny6 6 1 3 1 1f1b 1 "2,2,2" full
PP3_LOG=$INV_LOG
# weight decay (AdamW's, on every parameter as llm.c applies it): each stage
# decays its own layers, and both ends their copy of the tied wte alike
invariant --val "pipeline 1f1b dp=2 pp=2 --wd 0.1 (tiny)" "$(pp_flags tiny 8) --wd 0.1" 4 chapter-5 "--dp 2 --pp 2"

# A schedule of one's own (--schedule-file) that makes every message arrive
# before the one its receiver waits for: each rank runs its microbatches in
# the order its peer does not send them. The early message goes into its own
# slot and the action that needs it later finds it there (receive); the
# summary counts them, one per rank per step. The second file also splits the
# backward (W) and recomputes.
printf 'rank 0: F0 F1 B0 B1\nrank 1: F1 F0 B1 B0\n' > "$TEST_TMPDIR/pp_reverse.sched"
printf '# pp=2, 2 microbatches, split backward\nrank 0: F0 F1 B0 W0 B1 W1\nrank 1: F1 F0 B1 W1 B0 W0\n' > "$TEST_TMPDIR/pp_reverse_zb.sched"
for f in pp_reverse pp_reverse_zb; do
    rc=none
    [ $f = pp_reverse_zb ] && rc=selective
    invariant --norm "pipeline --schedule-file $f (tiny, pp=2, recompute $rc)" "$(pp_flags tiny 8)" 2 chapter-5 \
        "--pp 2 --schedule-file $TEST_TMPDIR/$f.sched --recompute $rc"
    got=$(grep '"type":"summary"' "$INV_LOG" | grep -o '"early_receives":\[[0-9,]*\]')
    if [ "$got" = '"early_receives":[10,10]' ]; then
        pass "pipeline --schedule-file $f: every step each rank took one message early and used it later ($got)"
    else
        fail "pipeline --schedule-file $f: early messages" "want \"early_receives\":[10,10], got '$got'; command: $CMD"
    fi
done
# the built-in schedules never receive early (the last case above: 1f1b on pp=3)
if grep -q '"early_receives":\[0,0,0\]' "$PP3_LOG"; then
    pass "pipeline 1f1b pp=3: no message arrives early"
else
    fail "pipeline 1f1b pp=3: early messages" "$(grep -o '"early_receives":[^]]*]' "$PP3_LOG")"
fi

# Training-state checkpoints (docs/checkpoints.md): each stage's dp rank 0
# writes its own layers, wte once (from the first stage). On the invariant's
# tiny6 run (10 steps, batch 8), saved at step 5: chapter 5 pp=2 resumed on
# the same mesh repeats its uninterrupted run bit for bit (losses, norms, the
# final --save); its checkpoint resumed by chapter 0, and chapter 0's resumed
# by chapter 5 dp=2 x pp=2, continue chapter 0's losses within TOL.
CK5=$TEST_TMPDIR/ckpt5
rm -rf "$CK5" && mkdir -p "$CK5"
CK5_FLAGS=$(pp_flags tiny6 8)
reference "$CK5_FLAGS"
# ck5_cmp REF RUN TOL: RUN logged exactly steps 5..9, each step's loss
# within TOL of REF's same step and its norm within TOL_NORM (TOL 0: the
# same printed digits for both)
ck5_cmp() {
    local ntol=$TOL_NORM
    [ "$3" = 0 ] && ntol=0
    awk -v tol="$3" -v ntol="$ntol" '
        FNR == 1 { file++ }
        /"type":"step"/ {
            match($0, /"step":[0-9]+/); s = substr($0, RSTART + 7, RLENGTH - 7) + 0
            match($0, /"loss":[-0-9.e]+/); l = substr($0, RSTART + 7, RLENGTH - 7)
            match($0, /"norm":[-0-9.e]+/); n = substr($0, RSTART + 7, RLENGTH - 7)
            if (file == 1) { rl[s] = l; rn[s] = n; next }
            if (s != 5 + seen || !(s in rl)) bad = 1
            seen++
            d = l - rl[s]; if (d < 0) d = -d; if (d > max) max = d
            d = n - rn[s]; if (d < 0) d = -d; if (d > maxn) maxn = d
        }
        END { printf "steps 5..%d, max |dloss| %.1e, |dnorm| %.1e", 4 + seen, max, maxn
              exit (!bad && seen == 5 && max <= tol && maxn <= ntol) ? 0 : 1 }' "$1" "$2"
}
# ck5_case NAME DESCRIPTION REF TOL NP PROGRAM FLAGS... [-- BIN_A BIN_B]
ck5_case() {
    local name=$1 what=$2 ref=$3 tol=$4 np=$5 prog=$6 a="" b="" cmp ok=1 args=()
    shift 6
    while [ $# -gt 0 ] && [ "$1" != -- ]; do args+=("$1"); shift; done
    [ "${1:-}" = -- ] && a=$2 b=$3
    mpi_run $T_RUN "$np" "$BUILD/$prog" $CK5_FLAGS "${args[@]}" --log "$CK5/$name.jsonl"
    [ $RC = 0 ] || ok=0
    cmp=$(ck5_cmp "$ref" "$CK5/$name.jsonl" "$tol") || ok=0
    echo "$OUT" | grep -q "checkpoint: resumed from" || { ok=0; cmp="$cmp, not resumed"; }
    if [ -n "$a" ]; then
        # bit for bit by construction: only same-mesh resumes pass BIN_A BIN_B (the same calls on the same rows)
        if cmp -s "$a" "$b"; then cmp="$cmp, final parameters bit-identical"; else ok=0; cmp="$cmp, final parameters DIFFER"; fi
    fi
    if [ $ok = 1 ]; then pass "checkpoint: $what ($cmp)"
    else fail "checkpoint: $what" "exit $RC; $cmp; command: $CMD; $(echo "$OUT" | grep -E 'error' | head -3)"; fi
}
invariant "checkpoint: chapter 5 pp=2 saving at steps 5 and 10" "$CK5_FLAGS" 2 chapter-5 \
    "--pp 2 --ckpt-dir $CK5/p2 --save-every 5 --save $CK5/p2.bin"
P2_LOG=$INV_LOG
# bit for bit by construction: the same calls on the same rows (a resume on the same mesh)
ck5_case p2r "chapter 5 pp=2 resumed at step 5 repeats its uninterrupted run bit for bit" "$P2_LOG" 0 \
    2 chapter-5 --pp 2 --resume "$CK5/p2/step-00000005" --save "$CK5/p2r.bin" -- "$CK5/p2.bin" "$CK5/p2r.bin"
ck5_case c0r "chapter 0 resumed from chapter 5 pp=2's step 5 continues chapter 0's losses" "$REF" $TOL \
    1 chapter-0 --resume "$CK5/p2/step-00000005"
mpi_run $T_RUN 1 "$BUILD/chapter-0" $CK5_FLAGS --ckpt-dir "$CK5/c0" --save-every 5
ck5_case dp2pp2 "chapter 5 dp=2 x pp=2 resumed from chapter 0's step 5 continues chapter 0's losses" "$REF" $TOL \
    4 chapter-5 --dp 2 --pp 2 --resume "$CK5/c0/step-00000005"

# --save gathers every stage's pieces where chapter 0 has them: an untrained
# model saved from pp=2 and from interleaved pp=3 x 2 chunks (one layer a
# chunk, the last stage's tied wte copy not written) is chapter 0's file byte
# for byte (init is counter-based and the gather a copy: the same bits by
# construction); a piece at its local offset fails here
mpi_run $T_SHORT 1 "$BUILD/chapter-0" --model tiny6 --steps 0 --peak-gflops 10 --save "$CK5/init0.bin"
for mesh in "2 --pp 2" "3 --pp 3 --schedule interleaved --virtual 2 --microbatches 2"; do
    np=${mesh%% *}
    mpi_run $T_SHORT "$np" "$BUILD/chapter-5" --model tiny6 --steps 0 --peak-gflops 10 ${mesh#* } --save "$CK5/init_pp$np.bin"
    if [ $RC = 0 ] && [ -s "$CK5/init0.bin" ] && cmp -s "$CK5/init0.bin" "$CK5/init_pp$np.bin"; then
        pass "pipeline: --save of the untrained tiny6 from ${mesh#* } = chapter 0's file, byte for byte"
    else
        fail "pipeline: untrained --save from ${mesh#* }" "exit $RC; $(cmp "$CK5/init0.bin" "$CK5/init_pp$np.bin" 2>&1 | head -1)"
    fi
done

# --show-schedule: the simulated timeline before training
mpi_run $T_SHORT 2 "$BUILD/chapter-5" --pp 2 --microbatches 3 --batch 6 --schedule zb --steps 0 --show-schedule --peak-gflops 10
if [ $RC = 0 ] && echo "$OUT" | grep -q '^rank 1 | \.   F0  B0  F1  B1  W0  F2  B2  W1  W2$' &&
    echo "$OUT" | grep -q '^bubble: 0.100 of 2 rank x 10 units'; then
    pass "--show-schedule prints the zb timeline of pp=2, m=3 and its bubble"
else
    fail "--show-schedule" "exit $RC; command: $CMD; $(echo "$OUT" | grep -E '^(rank|bubble)')"
fi

# m < pp runs with a note of its bubble: the simulated one (interleaved's
# formula assumes m >= pp: the note said 0.25 where the schedule idles 0.50)
mpi_run $T_SHORT 2 "$BUILD/chapter-5" --pp 2 --schedule interleaved --virtual 3 --microbatches 1 --model tiny6 --batch 2 --steps 0 --show-schedule --peak-gflops 10
if [ $RC = 0 ] && echo "$OUT" | grep -q '^note: 1 microbatch for 2 stages: some stages always idle (bubble 0.50)$' &&
    echo "$OUT" | grep -q '^bubble: 0.500 of 2 rank x 18 units idle (formula 0.250)$'; then
    pass "m < pp: the note gives the simulated bubble (interleaved pp=2 x 3 chunks, m=1: 0.50, its formula 0.25)"
else
    fail "m < pp note" "exit $RC; $(echo "$OUT" | grep -E '^(note|bubble)')"
fi

# bad input: one message, every rank non-zero, no hang
jobs_run error_case chapter-5 4 "--pp 4 --peak-gflops 10" "the model's 2 layers cannot fill pp=4"
jobs_run error_case chapter-5 2 "--pp 2 --model tiny6 --schedule interleaved --virtual 2 --peak-gflops 10" "do not cut into pp=2 x 2 equal chunks"
jobs_run error_case chapter-5 2 "--pp 2 --virtual 2 --peak-gflops 10" "--virtual 2 needs --schedule interleaved"
jobs_run error_case chapter-5 1 "--schedule interleaved --virtual 2 --peak-gflops 10" "use --pp 2 or more"
jobs_run error_case chapter-5 2 "--pp 2 --schedule pipedream --peak-gflops 10" "--schedule pipedream is not one of"
# sizes bounded before any product is formed (issue: --virtual 2147483647 overflowed pp x virtual)
jobs_run error_case chapter-5 2 "--pp 2 --schedule interleaved --virtual 2147483647 --peak-gflops 10" "--virtual 2147483647: pp x virtual is at most 64 virtual stages: use --virtual <= 32"
jobs_run error_case chapter-5 2 "--pp 2 --microbatches 0 --peak-gflops 10" "--microbatches must be positive"
jobs_run error_case chapter-5 2 "--pp 2 --microbatches 2147483647 --peak-gflops 10" "--microbatches 2147483647: a dp rank holds"
mkdir -p "$TEST_TMPDIR/sched_dir"
jobs_run error_case chapter-5 2 "--pp 2 --schedule-file $TEST_TMPDIR/sched_dir --peak-gflops 10" "is a directory"
jobs_run error_case chapter-5 2 "--pp 2 --microbatches 3 --peak-gflops 10" "use a batch divisible by 3"
jobs_run error_case chapter-5 2 "--pp 2 --model tiny6 --schedule interleaved --virtual 3 --microbatches 3 --batch 6 --peak-gflops 10" "groups of pp=2"
jobs_run error_case chapter-5 2 "--pp 2 --tp 2 --peak-gflops 10" "this chapter has no tp axis"
jobs_run help_case chapter-5 "--schedule S"
# a schedule file: a bad action, a missing rank, a deadlock (the validator), all before training
printf 'rank 0: F0 X1\nrank 1: F0 B0\n' > "$TEST_TMPDIR/pp_bad.sched"
printf 'rank 0: F0 B0\n' > "$TEST_TMPDIR/pp_short.sched"
printf 'rank 0:\nrank 1:\n' > "$TEST_TMPDIR/pp_empty.sched"
printf 'rank 0: F0 B0\nrank 1:\n' > "$TEST_TMPDIR/pp_empty1.sched"
printf 'rank 0: F0 B0 F1 B1\nrank 1: B0 F0 F1 B1\n' > "$TEST_TMPDIR/pp_before.sched"
printf 'rank 0: F0 B0 F1 B1\nrank 1: F1 F0 B0 B1\n' > "$TEST_TMPDIR/pp_cycle.sched"
jobs_run error_case chapter-5 2 "--pp 2 --schedule-file $TEST_TMPDIR/pp_bad.sched --peak-gflops 10" "'X1' is not an action"
jobs_run error_case chapter-5 2 "--pp 2 --schedule-file $TEST_TMPDIR/pp_short.sched --peak-gflops 10" "has no line for rank 1"
jobs_run error_case chapter-5 2 "--pp 2 --schedule-file $TEST_TMPDIR/pp_empty.sched --peak-gflops 10" "rank 0's line has no action"
jobs_run error_case chapter-5 2 "--pp 2 --schedule-file $TEST_TMPDIR/pp_empty1.sched --peak-gflops 10" "rank 1's line has no action"
jobs_run error_case chapter-5 2 "--pp 2 --schedule-file $TEST_TMPDIR/pp_before.sched --peak-gflops 10" "B(0, chunk 0) comes before its F"
jobs_run error_case chapter-5 2 "--pp 2 --schedule-file $TEST_TMPDIR/pp_cycle.sched --peak-gflops 10" "deadlock: every rank waits"
# a refusal names what set m and v: the file, or pp's default (it said
# "--virtual 2" and "--microbatches 2", flags that were never given)
printf 'rank 0: F0 F0.1 B0.1 B0\nrank 1: F0 F0.1 B0.1 B0\n' > "$TEST_TMPDIR/pp_v2.sched"
jobs_run error_case chapter-5 2 "--pp 2 --model tiny6 --schedule-file $TEST_TMPDIR/pp_v2.sched --peak-gflops 10" "--schedule-file's 2 chunks a rank: the model's 6 layers do not cut into pp=2 x 2 equal chunks"
jobs_run error_case chapter-5 2 "--pp 2 --batch 1 --peak-gflops 10" "--pp 2's default of 2 microbatches (one per stage): a dp rank holds 1 of the batch's 1 sequences"
# a schedule file is the whole schedule: a --schedule beside it was dropped without a word
jobs_run error_case chapter-5 2 "--pp 2 --schedule gpipe --schedule-file $TEST_TMPDIR/pp_reverse.sched --peak-gflops 10" "--schedule gpipe and --schedule-file: give one (the file is the schedule)"
# not a file of text: a device never ends (read to its end it spun forever),
# and a terminal escape in a line is refused by its column, never echoed
printf 'rank 0: F0 \033[2J B0\nrank 1: F0 B0\n' > "$TEST_TMPDIR/pp_binary.sched"
jobs_run error_case chapter-5 2 "--pp 2 --schedule-file /dev/zero --peak-gflops 10" "--schedule-file '/dev/zero' is a character device: give a text file"
jobs_run error_case chapter-5 2 "--pp 2 --schedule-file $TEST_TMPDIR/pp_binary.sched --peak-gflops 10" "line 1: byte 12 is not text"
jobs_wait  # independent: 2 at a time (the schedule files are written above)

finish
