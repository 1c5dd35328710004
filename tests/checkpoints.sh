#!/bin/bash
# Training-state checkpoints (common/ckpt.c, docs/checkpoints.md): resume
# equality on chapters 0, 2 (the parameter server too) and 3 (each ZeRO
# stage, padded shards at dp 3); the reshard matrix; a rank killed during a
# step and during a save, then resumed (and under the supervisor); corrupt,
# truncated and missing files and mismatched manifests; async = sync content.
# A topic script of tests/run.sh (make test CHAPTER=checkpoints runs it alone).
. "$(dirname "$0")/lib.sh"

echo "== checkpoints: save, resume, reshard, faults"
CK=$TEST_TMPDIR/ckpt
mkdir -p "$CK"
# the tiny model, a batch that splits over 1, 2, 3 and 4 ranks, 8 steps
CKF="--steps 8 --batch 12 --seq 32 --peak-gflops 10"
CK_TOL=3e-5  # the invariant's tolerance (tests/run.sh, chapter 2)

# The runs below go in two rounds of independent jobs, 2 at a time (jobs_run,
# tests/lib.sh; each job prints its PASS/FAIL lines, which jobs_wait counts):
# first the runs that save, then what resumes, reshards or breaks their files.

# the engine alone: tp tiles (strided slices) against uneven flat ranges
ck_engine() {  # NP
    local np=$1 out rc
    out=$(timeout 120 $MPIRUN -np $np "$BUILD/tests/test_ckpt" 2>&1)
    rc=$?
    echo "$out" | grep -E '^(PASS|FAIL)' | sed "s/\$/ [$np ranks]/"
    if [ $rc -ne 0 ] && ! echo "$out" | grep -q '^FAIL'; then
        fail "test_ckpt on $np ranks" "exited $rc without a failed check: $(echo "$out" | tail -3)"
    fi
}

# ck_run NAME NP CHAPTER FLAGS...: runs, keeps the output in $CK/NAME.out
# and the log in $CK/NAME.jsonl; returns the exit status
ck_run() {
    local name=$1 np=$2 ch=$3
    shift 3
    timeout 120 $MPIRUN -np "$np" "$BUILD/chapter-$ch" $CKF --log "$CK/$name.jsonl" "$@" >"$CK/$name.out" 2>&1
}

# ck_cmp REF RUN TOL FIRST: RUN logged exactly steps FIRST..7, and each
# step's loss is within TOL of REF's same step and its norm within TOL_NORM
# (TOL 0: the same printed bits for both). Prints what it found.
ck_cmp() {
    local ntol=$TOL_NORM
    [ "$3" = 0 ] && ntol=0
    awk -v tol="$3" -v ntol="$ntol" -v first="$4" '
        FNR == 1 { file++ }
        /"type":"step"/ {
            match($0, /"step":[0-9]+/); s = substr($0, RSTART + 7, RLENGTH - 7) + 0
            match($0, /"loss":[-0-9.e]+/); l = substr($0, RSTART + 7, RLENGTH - 7)
            match($0, /"norm":[-0-9.e]+/); n = substr($0, RSTART + 7, RLENGTH - 7)
            if (file == 1) { rl[s] = l; rn[s] = n; next }
            if (s != first + seen) bad = 1
            seen++
            if (!(s in rl)) { bad = 1; next }
            d = l - rl[s]; if (d < 0) d = -d; if (d > max) max = d
            d = n - rn[s]; if (d < 0) d = -d; if (d > maxn) maxn = d
        }
        END { printf "steps %d..%d, max |dloss| %.1e, |dnorm| %.1e", first, first + seen - 1, max, maxn
              exit (!bad && seen == 8 - first && max <= tol && maxn <= ntol) ? 0 : 1 }' "$1" "$2"
}

# ck_expect NAME DESCRIPTION REF FIRST TOL [BIN_A BIN_B]: the run succeeded and
# continues REF from step FIRST; with two --save files, they are equal bytes.
ck_expect() {
    local name=$1 what=$2 ref=$3 first=$4 tol=$5 a=${6:-} b=${7:-} cmp rc=0
    cmp=$(ck_cmp "$CK/$ref.jsonl" "$CK/$name.jsonl" "$tol" "$first") || rc=1
    if [ -n "$a" ]; then
        # bit for bit by construction: every resume compared at tolerance 0 here is on the same mesh (the same calls on the same rows)
        if cmp -s "$a" "$b"; then cmp="$cmp, final parameters bit-identical"; else rc=1; cmp="$cmp, final parameters DIFFER"; fi
    fi
    if [ $rc = 0 ] && grep -q "checkpoint: resumed from" "$CK/$name.out"; then
        pass "checkpoint: $what ($cmp)"
    else
        fail "checkpoint: $what" "$cmp; $(grep -E 'error|resumed' "$CK/$name.out" | head -3)"
    fi
}

# --- the reference, saving every 4 steps; chapter 0 resumed from step 4
ck_c0() {
ck_run ref 1 0 --ckpt-dir "$CK/c0" --save-every 4 --save "$CK/ref.bin"
ck_run c0r 1 0 --resume "$CK/c0/step-00000004" --save "$CK/c0r.bin"
ck_expect c0r "chapter 0 resumed at step 4 repeats the uninterrupted run bit for bit" ref 4 0 "$CK/ref.bin" "$CK/c0r.bin"
# a resume past --steps trains nothing: the checkpoint's model validated
# under its own step (the same floats, the same calls: the reference's last
# record), no loss claimed
ck_run c0e 1 0 --resume "$CK/c0/" --steps 5
local ref_val end_val
ref_val=$(grep '"type":"val"' "$CK/ref.jsonl" | tail -1)
end_val=$(grep '"type":"val"' "$CK/c0e.jsonl")
if [ -n "$ref_val" ] && [ "$end_val" = "$ref_val" ] && grep -q '"final_loss":null' "$CK/c0e.jsonl" &&
    ! grep -q '"type":"step"' "$CK/c0e.jsonl" && grep -q "checkpoint is at step 8, --steps 5: nothing left to train" "$CK/c0e.out"; then
    pass "checkpoint: a resume past --steps (step 8, --steps 5) trains nothing, validates the checkpoint's model as step 7 ($end_val) and logs final_loss null"
else
    fail "checkpoint: a resume past --steps" "val record '$end_val' (the reference's last: '$ref_val'), $(grep -o '"final_loss":[^,]*' "$CK/c0e.jsonl")"
fi
# a directory given with trailing '/'s names its checkpoints with one
ck_run c0s 1 0 --steps 1 --ckpt-dir "$CK/c0s//"
if grep -q "^checkpoint: resumed from $CK/c0/step-00000008 " "$CK/c0e.out" &&
    grep -q "^checkpoint: saved $CK/c0s/step-00000001$" "$CK/c0s.out"; then
    pass "checkpoint: --resume DIR/ and --ckpt-dir DIR// name DIR/step-N (one '/')"
else
    fail "checkpoint: trailing '/'s in directory flags" "$(grep -hE '^checkpoint: (resumed|saved)' "$CK/c0e.out" "$CK/c0s.out")"
fi
}

# --- chapter 2, dp 2: rank 0 alone writes the replica
ck_c2() {
# (64 KiB buckets: 6 of tiny's 8 start before backward ends, chapter_2.sh)
ck_run c2 2 2 --dp 2 --bucket-kb 64 --ckpt-dir "$CK/c2" --save-every 4 --save "$CK/c2.bin"
ck_run c2r 2 2 --dp 2 --bucket-kb 64 --resume "$CK/c2/step-00000004" --save "$CK/c2r.bin"
ck_expect c2r "chapter 2 dp=2 resumed at step 4 repeats its uninterrupted run bit for bit" c2 4 0 "$CK/c2.bin" "$CK/c2r.bin"
if [ "$(ls "$CK/c2/step-00000004")" = "$(printf 'MANIFEST\nrank-00000.bin')" ]; then
    pass "checkpoint: chapter 2's replicas are written once, by dp rank 0 (MANIFEST, rank-00000.bin)"
else
    fail "checkpoint: chapter 2 writes one replica" "$(ls "$CK/c2/step-00000004" | tr '\n' ' ')"
fi
# the summary's per-step counts are of the steps this run trained (4 of 8)
local e0 e1
e0=$(grep '"type":"summary"' "$CK/c2.jsonl" | grep -o '"early_buckets_per_step":[0-9.]*')
e1=$(grep '"type":"summary"' "$CK/c2r.jsonl" | grep -o '"early_buckets_per_step":[0-9.]*')
if [ "$e0" = '"early_buckets_per_step":6' ] && [ "$e0" = "$e1" ]; then
    pass "checkpoint: chapter 2 resumed at step 4 reports the uninterrupted run's $e0"
else
    fail "checkpoint: chapter 2's per-step counts after a resume" "uninterrupted '$e0', resumed '$e1'"
fi
# the parameter server on 3 ranks: every rank reads its state back (the
# server its moments, the workers the parameters)
ck_run ps 3 2 --dp 3 --dp-mode ps --ckpt-dir "$CK/ps" --save-every 4 --save "$CK/ps.bin"
ck_run psr 3 2 --dp 3 --dp-mode ps --resume "$CK/ps/step-00000004" --save "$CK/psr.bin"
ck_expect psr "chapter 2 --dp-mode ps dp=3 resumed at step 4 repeats its uninterrupted run bit for bit" ps 4 0 "$CK/ps.bin" "$CK/psr.bin"
}

# --- chapter 3, dp 4, ZeRO-3: every rank writes its shard
ck_c3() {
local sizes
ck_run c3 4 3 --dp 4 --zero 3 --ckpt-dir "$CK/c3" --save-every 3 --save "$CK/c3.bin"
ck_run c3r 4 3 --dp 4 --zero 3 --resume "$CK/c3/step-00000003" --save "$CK/c3r.bin"
ck_expect c3r "chapter 3 dp=4 ZeRO-3 resumed at step 3 repeats its uninterrupted run bit for bit" c3 3 0 "$CK/c3.bin" "$CK/c3r.bin"
sizes=$(cd "$CK/c3/step-00000003" && stat -c %s rank-*.bin | sort -u | wc -l)
if [ "$(ls "$CK/c3/step-00000003" | grep -c '^rank-')" = 4 ] && [ "$(ls "$CK/c3" | tr '\n' ' ')" = "step-00000003 step-00000006 step-00000008 " ]; then
    pass "checkpoint: chapter 3 ZeRO-3 on 4 ranks writes 4 shard files ($sizes size(s)); saves at steps 3, 6 and the end"
else
    fail "checkpoint: chapter 3 ZeRO-3 files" "$(ls -R "$CK/c3" | tr '\n' ' ')"
fi
}

# --- the reshard matrix: chapter 3 dp 4 ZeRO-3 -> chapter 2 dp 2 -> chapter 0;
# ZeRO-1 dp 2 -> ZeRO-3 dp 3 (shards with padding); each continues the reference
ck_m() {
ck_run m2 2 2 --dp 2 --resume "$CK/c3/step-00000003" --ckpt-dir "$CK/m2" --save-every 3
ck_expect m2 "chapter 3 dp=4 ZeRO-3 -> chapter 2 dp=2 at step 3 continues the reference within $CK_TOL" ref 3 $CK_TOL
ck_run m0 1 0 --resume "$CK/m2/step-00000006"
ck_expect m0 "-> chapter 0 at step 6 (chapter 2's checkpoint) continues the reference within $CK_TOL" ref 6 $CK_TOL
}
ck_z3() {
ck_run z3 3 3 --dp 3 --zero 3 --resume "$CK/z1/step-00000004"
ck_expect z3 "chapter 3 dp=2 ZeRO-1 -> dp=3 ZeRO-3 at step 4 continues the reference within $CK_TOL" ref 4 $CK_TOL
}

# --- async: the thread writes the same bytes the sync save writes
ck_z1() {
ck_run z1 2 3 --dp 2 --zero 1 --ckpt-dir "$CK/z1" --save-every 4 --save "$CK/z1.bin"
ck_run z1a 2 3 --dp 2 --zero 1 --ckpt-dir "$CK/z1a" --save-every 4 --async-save
if diff -r "$CK/z1" "$CK/z1a" >/dev/null && grep -q "2 saves (async)" "$CK/z1a.out" && [ "$(ls "$CK/z1a" | wc -l)" = 2 ]; then
    pass "checkpoint: --async-save writes byte-identical files and manifests to the sync save (ZeRO-1, dp=2, steps 4 and 8)"
else
    fail "checkpoint: async content" "$(diff -rq "$CK/z1" "$CK/z1a" | head -3); $(grep 'saves' "$CK/z1a.out")"
fi
}
# --- each ZeRO stage resumed on its own mesh: every rank reads back what it
# holds (ZeRO-1 and 2 the whole parameters on every dp rank, ZeRO-3 at dp 3
# its padded shard)
ck_same_mesh() {
ck_run z1r 2 3 --dp 2 --zero 1 --resume "$CK/z1/step-00000004" --save "$CK/z1r.bin"
ck_expect z1r "chapter 3 dp=2 ZeRO-1 resumed at step 4 repeats its uninterrupted run bit for bit" z1 4 0 "$CK/z1.bin" "$CK/z1r.bin"
ck_run z2 2 3 --dp 2 --zero 2 --ckpt-dir "$CK/z2" --save-every 4 --save "$CK/z2.bin"
ck_run z2r 2 3 --dp 2 --zero 2 --resume "$CK/z2/step-00000004" --save "$CK/z2r.bin"
ck_expect z2r "chapter 3 dp=2 ZeRO-2 resumed at step 4 repeats its uninterrupted run bit for bit" z2 4 0 "$CK/z2.bin" "$CK/z2r.bin"
ck_run z33 3 3 --dp 3 --zero 3 --ckpt-dir "$CK/z33" --save-every 4 --save "$CK/z33.bin"
ck_run z33r 3 3 --dp 3 --zero 3 --resume "$CK/z33/step-00000004" --save "$CK/z33r.bin"
ck_expect z33r "chapter 3 dp=3 ZeRO-3 (padded shards) resumed at step 4 repeats its uninterrupted run bit for bit" z33 4 0 "$CK/z33.bin" "$CK/z33r.bin"
}
# the first round: the runs that save
for np in 2 3; do jobs_run ck_engine $np; done
for f in ck_c0 ck_c2 ck_c3 ck_z1; do jobs_run $f; done
jobs_wait

# --- faults. A rank killed (SIGKILL) after step 5: the job ends, no hang
# (the timeout is 120 s); --resume takes the last complete checkpoint (4)
ck_k1() {
local rc
CKPT_KILL=step:5:1 ck_run k1 4 3 --dp 4 --zero 3 --ckpt-dir "$CK/k1" --save-every 2
rc=$?
if [ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q "CKPT_KILL" "$CK/k1.out"; then
    pass "checkpoint: kill -9 of rank 1 after step 5 ends the 4-rank job (exit $rc, no hang)"
else
    fail "checkpoint: kill during a step" "exit $rc; $(tail -3 "$CK/k1.out")"
fi
ck_run k1r 4 3 --dp 4 --zero 3 --resume "$CK/k1" --save "$CK/k1r.bin"
ck_expect k1r "after the kill, --resume from the last checkpoint (step 4) repeats the run that was never killed bit for bit" c3 4 0 "$CK/c3.bin" "$CK/k1r.bin"
}
# killed halfway through writing its file of step 6: step 3 stays the latest
ck_k2() {
local rc
CKPT_KILL=save:6:2 ck_run k2 4 3 --dp 4 --zero 3 --ckpt-dir "$CK/k2" --save-every 3
rc=$?
if [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ -f "$CK/k2/step-00000003/MANIFEST" ] && [ ! -e "$CK/k2/step-00000006" ]; then
    pass "checkpoint: a rank killed while writing step 6 ends the job (exit $rc); step 3 stays complete, step 6 only a .tmp"
else
    fail "checkpoint: kill during a save" "exit $rc; $(ls "$CK/k2" | tr '\n' ' ')"
fi
ck_run k2r 4 3 --dp 4 --zero 3 --resume "$CK/k2" --ckpt-dir "$CK/k2" --save-every 3 --keep 2 --save "$CK/k2r.bin"
ck_expect k2r "after a kill during a save, --resume (step 3) repeats the run that was never killed bit for bit" c3 3 0 "$CK/c3.bin" "$CK/k2r.bin"
if [ "$(ls "$CK/k2" | tr '\n' ' ')" = "step-00000006 step-00000008 " ] && [ -f "$CK/k2/step-00000006/MANIFEST" ]; then
    pass "checkpoint: the resumed run removes the crashed save's .tmp, writes step 6 complete, and --keep 2 leaves steps 6 and 8"
else
    fail "checkpoint: stale .tmp" "$(ls "$CK/k2" | tr '\n' ' ')"
fi
}
# the supervisor: rank 1 killed after step 5 on 4 ranks, restarted on 2
ck_sv() {
local rc
CKPT_KILL=step:5:1 timeout 240 bash common/tools/supervise.sh --np 4 --fallback-np 2 -- \
    "$BUILD/chapter-3" --dp {np} --zero 3 $CKF --ckpt-dir "$CK/sv" --save-every 2 --log "$CK/sv.jsonl" >"$CK/sv.out" 2>&1
rc=$?
if [ $rc -eq 0 ] && grep -q "restarting on 2 rank(s)" "$CK/sv.out"; then
    ck_expect sv "the supervisor restarts a killed 4-rank job on 2 ranks from step 4, continuing the reference within $CK_TOL" ref 4 $CK_TOL
else
    fail "checkpoint: supervisor" "exit $rc; $(grep -E 'supervise|error' "$CK/sv.out" | head -5)"
fi
}

# the supervisor falls back past a corrupt newest checkpoint: the job (rank 0
# killed after step 5, checkpoints at steps 2 and 4) is restarted by a
# launcher that first flips a byte of step 4's file, so the restart from
# step 4 is refused naming it; the supervisor skips it and resumes from
# step 2 without using up a retry. A refusal that names no checkpoint (a
# bad flag) is not retried at all.
ck_sv_fallback() {
local rc out
rm -rf "$CK/svf" "$CK/svf.launches"
cat >"$CK/svf_mpirun.sh" <<EOF
#!/bin/bash
# the second launch finds step 4 corrupted (one byte of rank 0's file)
echo x >>"$CK/svf.launches"
if [ "\$(wc -l <"$CK/svf.launches")" = 2 ]; then
    printf '\\377' | dd of="$CK/svf/step-00000004/rank-00000.bin" bs=1 seek=5000 conv=notrunc 2>/dev/null
fi
exec bash "$PWD/tests/mpirun.sh" "\$@"
EOF
CKPT_KILL=step:5:0 MPIRUN="bash $CK/svf_mpirun.sh" timeout 240 bash common/tools/supervise.sh --np 1 --retries 1 -- \
    "$BUILD/chapter-0" $CKF --ckpt-dir "$CK/svf" --save-every 2 --keep 0 --log "$CK/svf.jsonl" >"$CK/svf.out" 2>&1
rc=$?
if [ $rc -eq 0 ] && grep -q "^supervise: skipping checkpoint $CK/svf/step-00000004, which the job refused: error: checkpoint file '$CK/svf/step-00000004/rank-00000.bin' is corrupt" "$CK/svf.out" &&
    grep -q "resumed from $CK/svf/step-00000002 " "$CK/svf.out"; then
    ck_expect svf "the supervisor skips a corrupt newest checkpoint (step 4, reason printed) and resumes from step 2, continuing the reference bit for bit" ref 2 0
else
    fail "checkpoint: supervisor fallback" "exit $rc; $(grep -E '^supervise|^error' "$CK/svf.out" | head -6)"
fi
# a requeued job's command carries its own --resume DIR: a corrupt newest
# step is skipped on the first attempt too (the supervisor took no resume
# of its own there, and stopped at the refusal), and the restart resumes
# from the supervisor's choice, not the command's DIR again
rm -rf "$CK/svq"
CKPT_KILL=step:5:0 bash tests/mpirun.sh -np 1 "$BUILD/chapter-0" $CKF --ckpt-dir "$CK/svq" --save-every 2 --keep 0 > /dev/null 2>&1
printf '\377' | dd of="$CK/svq/step-00000004/rank-00000.bin" bs=1 seek=5000 conv=notrunc 2>/dev/null
timeout 240 bash common/tools/supervise.sh --np 1 --retries 0 -- \
    "$BUILD/chapter-0" $CKF --ckpt-dir "$CK/svq" --resume "$CK/svq" --save-every 2 --keep 0 --log "$CK/svq.jsonl" >"$CK/svq.out" 2>&1
rc=$?
if [ $rc -eq 0 ] && grep -q "^supervise: skipping checkpoint $CK/svq/step-00000004, which the job refused" "$CK/svq.out" &&
    grep -q "^supervise: attempt 1 on 1 rank(s): .* --resume $CK/svq/step-00000002$" "$CK/svq.out" &&
    grep -q "resumed from $CK/svq/step-00000002 " "$CK/svq.out"; then
    ck_expect svq "a requeued command's own --resume: the supervisor skips its corrupt newest step on the first attempt and resumes from step 2, the reference bit for bit" ref 2 0
else
    fail "checkpoint: supervisor and the command's own --resume" "exit $rc; $(grep -E '^supervise|^error' "$CK/svq.out" | head -6)"
fi
# a delta whose full save is gone is skipped too (the refusal quotes the
# checkpoint itself, 'D/step-N', not one of its files: the supervisor
# matched only the latter and gave up, "no restart")
cat >"$CK/svd_mpirun.sh" <<EOF
#!/bin/bash
# the second launch finds the full save of step 6 gone (step 8 is a delta on it)
echo x >>"$CK/svd.launches"
[ "\$(wc -l <"$CK/svd.launches")" = 2 ] && rm -rf "$CK/svd/step-00000006"
exec bash "$PWD/tests/mpirun.sh" "\$@"
EOF
CKPT_KILL=step:9:0 MPIRUN="bash $CK/svd_mpirun.sh" timeout 240 bash common/tools/supervise.sh --np 1 --retries 1 -- \
    "$BUILD/chapter-0" $CKF --steps 10 --ckpt-dir "$CK/svd" --save-every 2 --incremental 2 --keep 0 >"$CK/svd.out" 2>&1
rc=$?
if [ $rc -eq 0 ] && grep -q "^supervise: skipping checkpoint $CK/svd/step-00000008, which the job refused: error: checkpoint '$CK/svd/step-00000008' is a delta against the full save of step 6, but" "$CK/svd.out" &&
    grep -q "resumed from $CK/svd/step-00000004 " "$CK/svd.out"; then
    pass "checkpoint: the supervisor skips a delta whose full save is gone (step 8 on step 6) and resumes from the delta before it (step 4 on step 2)"
else
    fail "checkpoint: supervisor and a broken delta chain" "exit $rc; $(grep -E '^supervise|^error' "$CK/svd.out" | head -6)"
fi
# its own flags: a --retries of "abc" restarted a failing job without end
# (645 attempts in 10 s), a --np without a value stopped on an unbound variable
local bad_flags=""
for a in "--retries abc" "--np" "--np 0" "--fallback-np x"; do
    out=$(timeout 20 bash common/tools/supervise.sh $a -- "$BUILD/chapter-0" --ckpt-dir "$CK/svx" 2>&1)
    rc=$?
    [ $rc = 2 ] && [ "$(echo "$out" | wc -l)" = 1 ] && echo "$out" | grep -q "^supervise.sh: ${a%% *} needs a" || bad_flags="$bad_flags [$a: exit $rc, $out]"
done
if [ -z "$bad_flags" ] && [ ! -e "$CK/svx" ]; then
    pass "checkpoint: the supervisor refuses its own bad flags (--retries abc, --np without a value, --np 0, --fallback-np x) with one line, exit 2, nothing run"
else
    fail "checkpoint: the supervisor's own flags" "$bad_flags"
fi
out=$(timeout 120 bash common/tools/supervise.sh --np 2 --retries 3 -- "$BUILD/chapter-2" --dp 3 $CKF --ckpt-dir "$CK/svr" 2>&1)
rc=$?
if [ $rc -eq 1 ] && [ "$(echo "$out" | grep -c '^supervise: attempt')" = 1 ] && echo "$out" | grep -q "no restart"; then
    pass "checkpoint: the supervisor does not retry a refusal (exit 1 after one attempt)"
else
    fail "checkpoint: supervisor and a refusal" "exit $rc; $(echo "$out" | grep -E '^supervise|^error' | head -4)"
fi
}

# the supervisor uses every level: with --ckpt-local and level 3 only every
# 100 steps, a job killed after step 5 resumes from level 1's step 4 (it
# printed "no usable checkpoint: starting over" and started over each time)
ck_sv_levels() {
local rc
rm -rf "$CK/svl" "$CK/svl1"
CKPT_KILL=step:5:0 timeout 240 bash common/tools/supervise.sh --np 1 --retries 1 -- \
    "$BUILD/chapter-0" $CKF --ckpt-dir "$CK/svl" --save-every 100 --ckpt-local "$CK/svl1" --local-every 2 --log "$CK/svl.jsonl" >"$CK/svl.out" 2>&1
rc=$?
if [ $rc -eq 0 ] && grep -q "^supervise: attempt 2 on 1 rank(s): .* --resume $CK/svl$" "$CK/svl.out" &&
    grep -q "checkpoint: resuming from level 1 (node-local), step 4" "$CK/svl.out" && ! grep -q "starting over" "$CK/svl.out"; then
    ck_expect svl "the supervisor resumes a killed job from level 1's step 4 (level 3 has none), continuing the reference bit for bit" ref 4 0
else
    fail "checkpoint: supervisor and level 1" "exit $rc; $(grep -E '^supervise|^error|resuming' "$CK/svl.out" | head -5)"
fi
}

# both levels' newest steps corrupt (level 3's step 4, level 1's step 6):
# the program falls back across level 1 by itself but not below level 3's
# newest, so the supervisor, once the job refused level 3's step 4, names
# the level-3 step left (none: the level-1 directory alone); it stopped with
# "no restart" while level 1's step 3 was intact
ck_sv_levels3() {
local rc
rm -rf "$CK/svm" "$CK/svm1" "$CK/svm.launches"
cat >"$CK/svm_mpirun.sh" <<EOF
#!/bin/bash
echo x >>"$CK/svm.launches"
if [ "\$(wc -l <"$CK/svm.launches")" = 2 ]; then
    for f in "$CK/svm/step-00000004/rank-00000.bin" "$CK/svm1/node-0/step-00000006/rank-00000.bin"; do
        printf '\\377' | dd of="\$f" bs=1 seek=5000 conv=notrunc 2>/dev/null
    done
fi
exec bash "$PWD/tests/mpirun.sh" "\$@"
EOF
CKPT_KILL=step:6:0 MPIRUN="bash $CK/svm_mpirun.sh" timeout 240 bash common/tools/supervise.sh --np 1 --retries 1 -- \
    "$BUILD/chapter-0" $CKF --ckpt-dir "$CK/svm" --save-every 4 --ckpt-local "$CK/svm1" --local-every 3 --keep 0 \
    --log "$CK/svm.jsonl" >"$CK/svm.out" 2>&1
rc=$?
if [ $rc -eq 0 ] && grep -q "^supervise: skipping checkpoint $CK/svm/step-00000004, which the job refused: error: checkpoint file '$CK/svm/step-00000004/rank-00000.bin' is corrupt" "$CK/svm.out" &&
    grep -q "^supervise: attempt 2 on 1 rank(s): .* --resume $CK/svm1$" "$CK/svm.out" &&
    grep -q "checkpoint: resuming from level 1 (node-local), step 3" "$CK/svm.out"; then
    ck_expect svm "the supervisor skips level 3's corrupt step 4 and the job level 1's corrupt step 6: resumed from level 1's step 3, continuing the reference bit for bit" ref 3 0
else
    fail "checkpoint: supervisor, both levels' newest corrupt" "exit $rc; $(grep -E '^supervise|^error|resuming|^note' "$CK/svm.out" | head -8)"
fi
}

# a SIGTERM the supervisor did not send (a scheduler's, to mpirun) is a
# failure to restart from, not a refusal of the input (mpirun exits 1 and
# no rank prints an error: line); one sent to the supervisor ends the job
# and the supervisor, with no restart. Every signal goes to a process this
# test started, found by pid.
# The job: 600 steps, a checkpoint every 20, the signal sent once the first
# is saved; the 580 steps left take about 3.7 s of a core (300 took 1.9 s),
# against a tenth of a second for the signal to land, so it lands mid-run.
# (3000 steps and a checkpoint every 100 before: the restarted run's 2900
# steps cost 18 s of CPU.)
ck_sv_term() {
local sv mp p i rc
rm -rf "$CK/svt"
timeout 240 bash common/tools/supervise.sh --np 1 --retries 1 -- "$BUILD/chapter-0" --steps 600 --batch 12 --seq 32 \
    --peak-gflops 10 --ckpt-dir "$CK/svt" --save-every 20 >"$CK/svt.out" 2>&1 &
sv=$!
for i in $(seq 1 600); do grep -q '^checkpoint: saved' "$CK/svt.out" 2>/dev/null && break; sleep 0.1; done
mp=""
for p in $(own_tree $sv); do [ "$(cat /proc/$p/comm 2>/dev/null)" = mpirun ] && mp=$p; done
[ -n "$mp" ] && kill -TERM "$mp"
wait $sv
rc=$?
if [ -n "$mp" ] && [ $rc -eq 0 ] && grep -q "^supervise: attempt 1 failed (exit 1); restarting" "$CK/svt.out" &&
    grep -q "^checkpoint: resumed from $CK/svt/step-" "$CK/svt.out" && grep -q "^supervise: attempt 2 succeeded" "$CK/svt.out"; then
    pass "checkpoint: SIGTERM to the job's mpirun (not from the supervisor): restarted from the newest checkpoint, and succeeded"
else
    fail "checkpoint: the supervisor and a SIGTERM to mpirun" "mpirun ${mp:-not found}, exit $rc; $(grep -E '^supervise|^error' "$CK/svt.out" | head -4)"
fi
rm -rf "$CK/svs"
timeout 240 bash common/tools/supervise.sh --np 1 --retries 3 -- "$BUILD/chapter-0" --steps 600 --batch 12 --seq 32 \
    --peak-gflops 10 --ckpt-dir "$CK/svs" --save-every 20 >"$CK/svs.out" 2>&1 &
sv=$!
for i in $(seq 1 600); do grep -q '^checkpoint: saved' "$CK/svs.out" 2>/dev/null && break; sleep 0.1; done
p=$(ps -o pid= --ppid $sv | head -1)  # the supervisor's bash, under timeout
[ -n "$p" ] && kill -TERM $p
wait $sv
rc=$?
sleep 1
if [ -n "$p" ] && [ $rc -ne 0 ] && [ "$(grep -c '^supervise: attempt' "$CK/svs.out")" = 1 ] &&
    grep -q "^supervise: stopped by SIGTERM" "$CK/svs.out" && [ -z "$(own_tree $sv | tail -n +2)" ]; then
    pass "checkpoint: SIGTERM to the supervisor ends the job and the supervisor, with no restart"
else
    fail "checkpoint: SIGTERM to the supervisor" "exit $rc; $(grep -E '^supervise|^error' "$CK/svs.out" | head -4)"
fi
}

# run identity: every manifest records the run (a hash of the model, seed,
# batch, AdamW's settings and the training tokens). A fresh run on a
# directory holding another run's checkpoints is refused before anything
# is saved or pruned (it lost its own saves to --keep, and a restart then
# resumed the other run's model as a success); the same run again is not;
# an explicit --resume of another run's checkpoint goes on, saying so
ck_identity() {
local before out rc
rm -rf "$CK/idA" "$CK/idL"
head -c 30000 README.md > "$CK/other.txt"
mpi_run $T_RUN 2 "$BUILD/chapter-3" --dp 2 --zero 3 $CKF --ckpt-dir "$CK/idA" --save-every 2 --ckpt-local "$CK/idL" --local-every 2
before=$(ls "$CK/idA" "$CK/idL/node-0" | tr '\n' ' ')
error_case chapter-3 2 "--dp 2 --zero 3 $CKF --ckpt-dir $CK/idA --save-every 2 --data $CK/other.txt" \
    "--ckpt-dir '$CK/idA' holds another run's checkpoints ($CK/idA/step-00000008: other data or settings than this run's): give this run its own --ckpt-dir, or continue that run with --resume $CK/idA"
error_case chapter-0 1 "$CKF --ckpt-dir $CK/idA --save-every 2 --seed 7" "holds another run's checkpoints"
error_case chapter-0 1 "$CKF --ckpt-local $CK/idL --local-every 2 --lr 3e-3" "--ckpt-local '$CK/idL' holds another run's checkpoints ($CK/idL/node-0/step-00000008"
if [ "$(ls "$CK/idA" "$CK/idL/node-0" | tr '\n' ' ')" = "$before" ] && [ -z "$(cat "$CK/idA/.lock")" ]; then
    pass "checkpoint: the refused runs left both levels as they were ($before) and no lock held"
else
    fail "checkpoint: a refused run changed the directories" "before: $before; after: $(ls "$CK/idA" "$CK/idL/node-0" | tr '\n' ' ')"
fi
if grep -q "^run id=[0-9a-f]\{16\} data_tokens=[0-9]* data_hash=[0-9a-f]\{16\}$" "$CK/idA/step-00000008/MANIFEST" "$CK/idL/node-0/step-00000008/MANIFEST"; then
    pass "checkpoint: both levels' manifests record the run ($(grep '^run ' "$CK/idA/step-00000008/MANIFEST"))"
else
    fail "checkpoint: the run line of the manifests" "$(grep -h '^run' "$CK/idA/step-00000008/MANIFEST" "$CK/idL/node-0/step-00000008/MANIFEST")"
fi
# the same run again, on another mesh (the same model: the same run), is not refused
mpi_run $T_RUN 1 "$BUILD/chapter-0" $CKF --ckpt-dir "$CK/idA" --save-every 2
rc=$RC
out=$(timeout 60 $MPIRUN -np 1 "$BUILD/chapter-0" $CKF --steps 10 --data "$CK/other.txt" --resume "$CK/idA" 2>&1)
rc2=$?
if [ $rc -eq 0 ] && [ $rc2 -eq 0 ] && echo "$out" | grep -q "^note: checkpoint '$CK/idA/step-00000008' is another run's (other data or settings than this run's): continuing from it, as --resume asks" &&
    echo "$out" | grep -q "checkpoint: resumed from $CK/idA/step-00000008"; then
    pass "checkpoint: the same run fresh again is not refused; an explicit --resume of another run's checkpoint goes on with a note"
else
    fail "checkpoint: the same run again, or --resume of another run" "exits $rc, $rc2; $(echo "$out" | grep -E '^(error|note)' | head -2)"
fi
# this run's own checkpoint resumed without --ckpt-dir: no such note (a
# resume alone took no identity, so every one was "another run's")
out=$(timeout 60 $MPIRUN -np 1 "$BUILD/chapter-0" $CKF --steps 10 --resume "$CK/idA" 2>&1)
if [ $? -eq 0 ] && echo "$out" | grep -q "checkpoint: resumed from $CK/idA/step-00000008" && ! echo "$out" | grep -q "another run's"; then
    pass "checkpoint: a --resume of this run's checkpoint without --ckpt-dir says nothing of another run"
else
    fail "checkpoint: --resume alone of this run's checkpoint" "$(echo "$out" | grep -E '^(error|note)' | head -2)"
fi
# a resumed run saves beside its own checkpoints and the history it
# continues, no other run's: another run's newer step in its --ckpt-dir (a
# restart resumed that one, --keep 1 pruned every save of this run for it,
# all with exit 0) or older one (pruned for this run's) is refused, so is
# its own directory's newer step of other settings; the directory it resumed
# from, older steps of other settings included, is its own to go on in
rm -rf "$CK/idB" "$CK/idC" "$CK/idH"
mpi_run $T_RUN 1 "$BUILD/chapter-0" $CKF --steps 4 --seed 7 --ckpt-dir "$CK/idB"
cp -r "$CK/idB" "$CK/idC"
before=$(ls "$CK/idA" "$CK/idC" | tr '\n' ' ')
error_case chapter-0 1 "$CKF --seed 7 --resume $CK/idB --ckpt-dir $CK/idA --save-every 1 --keep 1" \
    "--ckpt-dir '$CK/idA' holds $CK/idA/step-00000008, newer than the step 4 this run resumes and saved with other data or settings than this run's"
error_case chapter-0 1 "$CKF --resume $CK/idA --ckpt-dir $CK/idC --save-every 1" \
    "--ckpt-dir '$CK/idC' holds another run's checkpoints ($CK/idC/step-00000004: other data or settings than this run's and the run it resumes)"
error_case chapter-0 1 "$CKF --lr 3e-3 --resume $CK/idA/step-00000004 --ckpt-dir $CK/idA --save-every 1" \
    "--ckpt-dir '$CK/idA' holds $CK/idA/step-00000008, newer than the step 4 this run resumes"
cp -r "$CK/idA" "$CK/idH"
mpi_run $T_RUN 1 "$BUILD/chapter-0" $CKF --steps 10 --lr 3e-3 --resume "$CK/idH" --ckpt-dir "$CK/idH" --save-every 1
rc=$RC
out=$(timeout 60 $MPIRUN -np 1 "$BUILD/chapter-0" $CKF --steps 11 --lr 3e-3 --resume "$CK/idH" --ckpt-dir "$CK/idH" --save-every 1 2>&1)
rc2=$?
if [ $rc -eq 0 ] && [ $rc2 -eq 0 ] && [ "$(ls "$CK/idA" "$CK/idC" | tr '\n' ' ')" = "$before" ] &&
    echo "$out" | grep -q "checkpoint: resumed from $CK/idH/step-00000010" && [ -d "$CK/idH/step-00000011" ]; then
    pass "checkpoint: a resume refuses another run's checkpoints where it saves, newer or older, and its own directory's newer step of other settings (nothing changed); it goes on where it resumed, older steps of other settings there"
else
    fail "checkpoint: a resume's --ckpt-dir" "exits $rc, $rc2; dirs $(ls "$CK/idA" "$CK/idC" | tr '\n' ' ') (were $before); $(echo "$out" | grep -E '^(error|note|checkpoint)' | head -3)"
fi
# a level-1 step of another run in --ckpt-local is not taken for this run's
# level 3 (it was, as if --resume had named it), and, newer than the step
# resumed, refused there; --freeze embeddings trains another model: another run
rm -rf "$CK/idX" "$CK/idL2" "$CK/idF"
mpi_run $T_RUN 1 "$BUILD/chapter-0" $CKF --steps 6 --seed 7 --ckpt-local "$CK/idL2" --local-every 2
mpi_run $T_RUN 1 "$BUILD/chapter-0" $CKF --steps 4 --ckpt-dir "$CK/idX"
error_case chapter-0 1 "$CKF --resume $CK/idX --ckpt-local $CK/idL2" \
    "--ckpt-local '$CK/idL2' holds $CK/idL2/node-0/step-00000006, newer than the step 4 this run resumes"
mpi_run $T_RUN 1 "$BUILD/chapter-0" $CKF --steps 4 --ckpt-dir "$CK/idF"
error_case chapter-0 1 "$CKF --freeze embeddings --ckpt-dir $CK/idF" "--ckpt-dir '$CK/idF' holds another run's checkpoints"
# a continued run (other --lr) whose restart takes its own level-1 step,
# newer than level 3's: the --ckpt-dir that --resume names holds the run it
# continued, its history (refused when only a level-3 pick counted it)
rm -rf "$CK/idK" "$CK/idKL"
mpi_run $T_RUN 1 "$BUILD/chapter-0" $CKF --ckpt-dir "$CK/idK" --save-every 4
mpi_run $T_RUN 1 "$BUILD/chapter-0" $CKF --steps 10 --lr 3e-3 --resume "$CK/idK" --ckpt-local "$CK/idKL" --local-every 2
mpi_run $T_RUN 1 "$BUILD/chapter-0" $CKF --steps 12 --lr 3e-3 --resume "$CK/idK" --ckpt-dir "$CK/idK" --ckpt-local "$CK/idKL"
if [ $RC = 0 ] && echo "$OUT" | grep -q "checkpoint: resuming from level 1 (node-local), step 10"; then
    pass "checkpoint: a continued run's restart from its own level-1 step goes on beside the run it continued in the --ckpt-dir --resume names"
else
    fail "checkpoint: a continued run's level-1 restart" "exit $RC; $(echo "$OUT" | grep -E '^(error|checkpoint|note)' | head -3)"
fi
# --keep prunes up to the step just saved: a run resumed from step 4
# because step 8 is corrupt keeps its own saves (pruning by number kept
# the corrupt step 8 alone, and the next restart had nothing to resume)
rm -rf "$CK/idP"
mpi_run $T_RUN 1 "$BUILD/chapter-0" $CKF --ckpt-dir "$CK/idP" --save-every 4
printf 'x' | dd of="$CK/idP/step-00000008/rank-00000.bin" bs=1 seek=200 conv=notrunc 2>/dev/null
mpi_run $T_RUN 1 "$BUILD/chapter-0" $CKF --steps 7 --resume "$CK/idP/step-00000004" --ckpt-dir "$CK/idP" --save-every 1 --keep 1
if [ $RC = 0 ] && [ "$(ls "$CK/idP" | tr '\n' ' ')" = "step-00000007 step-00000008 " ]; then
    pass "checkpoint: --keep 1 after a resume from step 4 (step 8 corrupt) keeps its own newest save and leaves step 8 (step-00000007 step-00000008)"
else
    fail "checkpoint: --keep after a resume below a newer step" "exit $RC; left: $(ls "$CK/idP" | tr '\n' ' ')"
fi
# ... and once its saves pass the step it left (save 9 after 7), that step
# is removed: it is not this run's line, and kept it would count as one of
# the newest (--keep 2 kept 9 and the corrupt 8)
mpi_run $T_RUN 1 "$BUILD/chapter-0" $CKF --steps 10 --resume "$CK/idP/step-00000007" --ckpt-dir "$CK/idP" --save-every 3 --keep 2
if [ $RC = 0 ] && [ "$(ls "$CK/idP" | tr '\n' ' ')" = "step-00000009 step-00000010 " ]; then
    pass "checkpoint: a step left behind is removed once the run's saves pass it (--keep 2: step-00000009 step-00000010)"
else
    fail "checkpoint: a passed step left behind" "exit $RC; left: $(ls "$CK/idP" | tr '\n' ' ')"
fi
# a crash between the two renames that replace a step (the old one aside,
# the new one in) left step-N.old and no step-N, which nothing read back: a
# run that takes the directory restores it (and drops a .old beside its step)
rm -rf "$CK/idR"
mpi_run $T_RUN 1 "$BUILD/chapter-0" $CKF --ckpt-dir "$CK/idR" --save-every 4
mv "$CK/idR/step-00000008" "$CK/idR/step-00000008.old"
cp -r "$CK/idR/step-00000004" "$CK/idR/step-00000004.old"
mpi_run $T_RUN 1 "$BUILD/chapter-0" $CKF --resume "$CK/idR" --ckpt-dir "$CK/idR"
if [ $RC = 0 ] && echo "$OUT" | grep -q "resumed from $CK/idR/step-00000008 " &&
    [ "$(ls "$CK/idR" | tr '\n' ' ')" = "step-00000004 step-00000008 " ]; then
    pass "checkpoint: a step a crash left moved aside (step-00000008.old, no step-00000008) comes back and is resumed; a stale .old beside its step is removed"
else
    fail "checkpoint: a half-replaced step" "exit $RC; left: $(ls "$CK/idR" | tr '\n' ' '); $(echo "$OUT" | grep -E '^(error|checkpoint)' | head -2)"
fi
}

# --- bad checkpoints: one message naming the file, exit 1 on every rank,
# nothing written. Each case works on a copy of chapter 3's step 3.
# ck_bad NAME DESCRIPTION EXPECTED-TEXT NP FLAGS...
ck_bad() {
    local name=$1 what=$2 expect=$3 np=$4 before after rc
    shift 4
    before=$(cd "$CK/$name" && find . -type f ! -name .lock | sort | xargs md5sum)
    # (no kill grace: the refusal ends every rank through MPI_Finalize; error_case, tests/lib.sh)
    OMPI_MCA_odls_base_sigkill_timeout=0 timeout 120 $MPIRUN -np "$np" "$BUILD/chapter-3" $CKF --resume "$CK/$name" --ckpt-dir "$CK/$name" --save-every 1 "$@" >"$CK/$name.out" 2>&1
    rc=$?
    after=$(cd "$CK/$name" && find . -type f ! -name .lock | sort | xargs md5sum)
    if [ $rc -eq 1 ] && [ "$(grep -c '^error' "$CK/$name.out")" = 1 ] && grep -qF -- "$expect" "$CK/$name.out" &&
        [ "$before" = "$after" ] && ! grep -q '^step' "$CK/$name.out" && [ ! -s "$CK/$name/.lock" ]; then
        pass "checkpoint: $what: exit 1, one message ('$expect'), nothing written, the lock let go of"
    else
        fail "checkpoint: $what" "exit $rc; $(grep -E '^error' "$CK/$name.out" | head -2); files changed: $([ "$before" = "$after" ] && echo no || echo yes); .lock: '$(cat "$CK/$name/.lock" 2>/dev/null)'"
    fi
}
ck_copy() { rm -rf "$CK/$1"; cp -r "$CK/c3/step-00000003" "$CK/$1"; }
# the second round: resumes on other meshes, kills, the supervisor, bad files
# run identity, the model's variant and its start: chapter 7's experts
# (--experts, --top-k, ...) and the --model file a run starts from decide
# the model as much as its shapes do. A fresh run with other --experts, or
# from another --model file, on the same --ckpt-dir is refused (before,
# neither entered the identity: the run went on and pruned the other run's
# steps by number); the same run again is not
ck_identity_model() {
local rc
rm -rf "$CK/idE" "$CK/idM"
mpi_run $T_RUN 2 "$BUILD/chapter-7" --ep 2 --experts 4 $CKF --ckpt-dir "$CK/idE" --save-every 4
rc=$RC
error_case chapter-7 2 "--ep 2 --experts 2 $CKF --ckpt-dir $CK/idE --save-every 4" \
    "--ckpt-dir '$CK/idE' holds another run's checkpoints ($CK/idE/step-00000008: other data or settings than this run's)"
error_case chapter-7 2 "--ep 2 --experts 4 --top-k 1 $CKF --ckpt-dir $CK/idE --save-every 4" "--ckpt-dir '$CK/idE' holds another run's checkpoints"
error_case chapter-7 2 "--ep 2 --experts 4 --capacity-factor 1 $CKF --ckpt-dir $CK/idE --save-every 4" "--ckpt-dir '$CK/idE' holds another run's checkpoints"
error_case chapter-7 2 "--ep 2 --experts 4 --aux-coef 0.1 $CKF --ckpt-dir $CK/idE --save-every 4" "--ckpt-dir '$CK/idE' holds another run's checkpoints"
mpi_run $T_RUN 2 "$BUILD/chapter-7" --ep 2 --experts 4 $CKF --ckpt-dir "$CK/idE" --save-every 4
if [ $rc -eq 0 ] && [ "$RC" = 0 ]; then
    pass "checkpoint: chapter 7 with the same --experts again on its --ckpt-dir is not refused"
else
    fail "checkpoint: chapter 7, the same run again" "exits $rc, $RC; $(echo "$OUT" | grep '^error' | head -1)"
fi
# two start files of the same shapes: a step apart
mpi_run $T_RUN 1 "$BUILD/chapter-0" --steps 1 --batch 12 --seq 32 --peak-gflops 10 --save "$CK/start1.bin"
mpi_run $T_RUN 1 "$BUILD/chapter-0" --steps 2 --batch 12 --seq 32 --peak-gflops 10 --save "$CK/start2.bin"
mpi_run $T_RUN 1 "$BUILD/chapter-0" --model "$CK/start1.bin" $CKF --ckpt-dir "$CK/idM" --save-every 4
error_case chapter-0 1 "--model $CK/start2.bin $CKF --ckpt-dir $CK/idM --save-every 4" "--ckpt-dir '$CK/idM' holds another run's checkpoints"
}

jobs_run ck_m
jobs_run ck_z3
jobs_run ck_same_mesh
jobs_run ck_k1
jobs_run ck_k2
jobs_run ck_sv
jobs_run ck_sv_fallback
jobs_run ck_sv_levels
jobs_run ck_sv_levels3
jobs_run ck_sv_term
jobs_run ck_identity
jobs_run ck_identity_model
ck_copy flip
# one byte flipped in the middle of rank 3's shard (read by rank 1 of dp 2)
size=$(stat -c %s "$CK/flip/rank-00003.bin")
byte=$(od -An -tu1 -j $((size / 2)) -N1 "$CK/flip/rank-00003.bin" | tr -d ' ')
printf "$(printf '\\%03o' $(((byte + 1) % 256)))" | dd of="$CK/flip/rank-00003.bin" bs=1 seek=$((size / 2)) conv=notrunc 2>/dev/null
jobs_run ck_bad flip "one flipped byte in a shard" "flip/rank-00003.bin' is corrupt" 2 --dp 2
# two flips of the top bit of two 64-bit words (bit 7 of bytes 871 and
# 40071): they cancelled in the first format's word-wise hash, which then
# accepted the file and trained other losses
ck_copy pair
python3 - "$CK/pair/rank-00001.bin" <<'PYEOF'
import sys
data = bytearray(open(sys.argv[1], "rb").read())
for at in (871, 40071):
    data[at] ^= 0x80
open(sys.argv[1], "wb").write(data)
PYEOF
jobs_run ck_bad pair "two flipped top bits of two words" "pair/rank-00001.bin' is corrupt" 2 --dp 2
ck_copy trunc
truncate -s -100 "$CK/trunc/rank-00001.bin"
jobs_run ck_bad trunc "a truncated shard" "trunc/rank-00001.bin' has" 4 --dp 4
ck_copy missing
rm "$CK/missing/rank-00002.bin"
jobs_run ck_bad missing "a missing shard" "missing/rank-00002.bin' is missing" 1 --dp 1
ck_copy manifest
sed -i 's/^step 3$/step 4/' "$CK/manifest/MANIFEST"
jobs_run ck_bad manifest "an edited manifest" "MANIFEST' is corrupt or truncated" 2 --dp 2
# a pipe where a shard or the manifest belongs: its open waited for a writer
# forever, every rank behind it (no watchdog sees an open)
ck_copy pipe
rm "$CK/pipe/rank-00001.bin" && mkfifo "$CK/pipe/rank-00001.bin"
jobs_run ck_bad pipe "a pipe for a shard" "pipe/rank-00001.bin' is missing or unreadable (not a regular file)" 2 --dp 2
# a fresh run's --ckpt-dir whose step-9 has a pipe for a manifest: the
# check for another run's checkpoints read it and waited forever
rm -rf "$CK/pipem" && mkdir -p "$CK/pipem/step-00000009" && mkfifo "$CK/pipem/step-00000009/MANIFEST"
timeout 120 $MPIRUN -np 1 "$BUILD/chapter-0" $CKF --steps 2 --ckpt-dir "$CK/pipem" >"$CK/pipem.out" 2>&1
rc=$?
if [ $rc = 0 ] && grep -q "^checkpoint: saved $CK/pipem/step-00000002" "$CK/pipem.out"; then
    pass "checkpoint: a pipe for a manifest in a fresh --ckpt-dir is no checkpoint: the run trains and saves"
else
    fail "checkpoint: a pipe for a manifest in --ckpt-dir" "exit $rc (124 = hang); $(grep -E '^error' "$CK/pipem.out" | head -2)"
fi
# ck_rehash MANIFEST SED-SCRIPT: edits a manifest with sed, sets its "slices"
# count to the slice lines left, and writes its checksum line anew (XXH3-64
# of the text before it, as xxhsum -H3 prints it), so that only the check
# a case is aimed at can catch the edit
ck_rehash() {
python3 - "$1" "$2" <<'PYEOF'
import re, subprocess, sys
path, edit = sys.argv[1], sys.argv[2]
body = [l for l in open(path).read().split("\n") if l and not l.startswith("end ")]
body = subprocess.run(["sed", edit], input="\n".join(body) + "\n", capture_output=True, text=True,
                      check=True).stdout.rstrip("\n").split("\n")
n = sum(1 for l in body if l.startswith("slice "))
body = [("slices %d" % n) if l.startswith("slices ") else l for l in body]
text = ("\n".join(body) + "\n").encode()
out = subprocess.run(["xxhsum", "-H3", "-"], input=text, capture_output=True, check=True).stdout.decode()
open(path, "wb").write(text + ("end %s\n" % re.search(r"[0-9a-f]{16}", out).group(0)).encode())
PYEOF
}
# a manifest that no longer covers the model (rank 3's file and slices
# dropped, so every file left agrees with its lines: only the coverage
# check can catch it)
ck_copy cover
ck_rehash "$CK/cover/MANIFEST" '/ file=3 /d;/^file 3 /d;s/^files 4$/files 3/'
jobs_run ck_bad cover "a manifest whose slices do not cover the model" "its manifest does not match this model" 2 --dp 2
# a manifest that points rank 1's slices at rank 2's file: the lines of
# files 1 and 2 swapped (each name with its own size and checksum), so both
# files pass their own checks; the slice list in a file's header catches it
ck_copy swap
ck_rehash "$CK/swap/MANIFEST" '/^file 1 /{s/^file 1 /file 2 /;h;d};/^file 2 /{s/^file 2 /file 1 /;G}'
jobs_run ck_bad swap "a manifest pointing a rank at another rank's file" "does not hold the slices the manifest reads from it" 4 --dp 4
# a file renamed to another rank's name (manifest line and file both)
ck_copy rename
mv "$CK/rename/rank-00002.bin" "$CK/rename/rank-00005.bin"
ck_rehash "$CK/rename/MANIFEST" 's/^file 2 rank-00002.bin /file 2 rank-00005.bin /'
jobs_run ck_bad rename "a rank file under another rank's name" "was written by rank 2, but the manifest lists it as 'rank-00005.bin'" 4 --dp 4
# a slice's offset moved 16 bytes into its file (the checksums cover every
# other field of a slice): it resumed, reading other bytes, with other losses
ck_copy offset
ck_rehash "$CK/offset/MANIFEST" 's/ file=1 offset=64 / file=1 offset=80 /'
jobs_run ck_bad offset "a slice's offset moved" "rank-00001.bin starts at byte 80, where the slices before it end at 64" 2 --dp 2
# a checkpoint written with the first format's checksum (FNV over words)
ck_copy v1
ck_rehash "$CK/v1/MANIFEST" '1s/.*/gpt-training-state 1/'
jobs_run ck_bad v1 "a manifest of the first format" "is of the first format" 1 --dp 1
ck_copy model
jobs_run ck_bad model "a checkpoint of another model" "holds a model with L=2 C=64" 1 --dp 1 --model small
ck_copy batch
jobs_run ck_bad batch "another batch" "was trained with batch 12 x 32" 2 --dp 2 --seq 16
rm -rf "$CK/none" && mkdir "$CK/none"
jobs_run ck_bad none "a directory without a checkpoint" "no complete checkpoint there" 1 --dp 1

# a save that cannot be written (a file-size limit of 64 MiB, which MPI's own
# start-up needs; the small model's state is 124 MiB): the message names the
# file, the .tmp directory goes, the checkpoint already there stays
ck_full() {
local out rc
# (the older checkpoint is this run's own step 1, resumed: a fresh run on a
# directory of another run's checkpoints is refused before it saves)
rm -rf "$CK/full"
timeout 120 $MPIRUN -np 1 "$BUILD/chapter-0" --model small --steps 1 --batch 1 --seq 16 --peak-gflops 10 --ckpt-dir "$CK/full" >/dev/null 2>&1
out=$( (ulimit -f 65536; timeout 120 $MPIRUN -np 1 "$BUILD/chapter-0" --model small --steps 2 --batch 1 --seq 16 \
    --peak-gflops 10 --ckpt-dir "$CK/full" --resume "$CK/full") 2>&1)
rc=$?
if [ $rc -eq 1 ] && echo "$out" | grep -q "^error: writing checkpoint file '.*full/step-00000002.tmp/rank-00000.bin' failed: File too large" &&
    [ "$(ls "$CK/full" | tr '\n' ' ')" = "step-00000001 " ]; then
    pass "checkpoint: a save past a file-size limit fails with the file's name; the older checkpoint stays, no .tmp is left"
else
    fail "checkpoint: failed save" "exit $rc; $(echo "$out" | grep error | head -2); files: $(ls "$CK/full" | tr '\n' ' ')"
fi
}
jobs_run ck_full

# a disk that fills up at the manifest: a tmpfs (in a mount namespace of its
# own, so nothing outside sees it) with room for the rank file and the lock
# but not the manifest; sync and async saves end with ENOSPC named, and no
# .tmp directory or step directory is left. Skipped where a mount namespace
# cannot be made (not root, or a container that forbids it).
ck_manifest_full() {
local bytes size mode out rc
bytes=$(sed -n 's/^file 0 .* bytes=\([0-9]*\) .*/\1/p' "$CK/c0/step-00000004/MANIFEST")
size=$(( ((bytes + 4095) / 4096 + 1) * 4096 ))
if ! unshare -m true 2>/dev/null; then
    skip "checkpoint: a full disk at the manifest" "no mount namespace here (unshare -m needs root)"
    return
fi
for mode in sync async; do
    out=$(unshare -m bash -c "mkdir -p '$CK/tfs' && mount -t tmpfs -o size=$size tmpfs '$CK/tfs' &&
        timeout 120 $MPIRUN -np 1 '$BUILD/chapter-0' $CKF --steps 4 --ckpt-dir '$CK/tfs/ck' $([ $mode = async ] && echo --async-save) 2>&1;
        echo \"rc=\$?\"; echo \"left: \$(ls '$CK/tfs/ck' | tr '\n' ' ')\"" 2>&1)
    if echo "$out" | grep -q '^rc=1$' && [ "$(echo "$out" | grep -c '^error')" = 1 ] &&
        echo "$out" | grep -q "^error: cannot write the checkpoint manifest '.*/step-00000004.tmp/MANIFEST': No space left on device" &&
        echo "$out" | grep -q '^left: $'; then
        pass "checkpoint: a full disk at the manifest ($mode save): ENOSPC named, no .tmp or step directory left"
    else
        fail "checkpoint: a full disk at the manifest ($mode save)" "$(echo "$out" | grep -E '^(error|rc=|left:)' | head -4)"
    fi
done
}
jobs_run ck_manifest_full

# one writer per --ckpt-dir: a second run stops at once naming the first
# (its pid and host); after the first is killed, its lock is stale and the
# next run takes it over with a note
ck_lock() {
local pid out rc i
rm -rf "$CK/lock"
timeout 300 $MPIRUN -np 1 "$BUILD/chapter-0" $CKF --steps 100000 --ckpt-dir "$CK/lock" >"$CK/lockA.out" 2>&1 &
pid=$!
for i in $(seq 1 600); do grep -q '^step' "$CK/lockA.out" 2>/dev/null && break; sleep 0.1; done
out=$(OMPI_MCA_odls_base_sigkill_timeout=0 timeout 60 $MPIRUN -np 2 "$BUILD/chapter-2" --dp 2 $CKF --ckpt-dir "$CK/lock" 2>&1)
rc=$?
local holder
holder=$(cat "$CK/lock/.lock" 2>/dev/null)
{ own_kill $pid; wait $pid; } 2>/dev/null  # run A: its own processes, by pid
if [ $rc -eq 1 ] && [ "$(echo "$out" | grep -c '^error')" = 1 ] &&
    echo "$out" | grep -qF -- "--ckpt-dir '$CK/lock' is in use by another run ($holder)" && ! echo "$out" | grep -q '^step' &&
    echo "$holder" | grep -q "^pid [0-9]* on host"; then
    pass "checkpoint: a second run on a --ckpt-dir in use stops at once, naming the first ($holder)"
else
    fail "checkpoint: a second run on one --ckpt-dir" "exit $rc; $(echo "$out" | grep -E '^error|^step' | head -2); .lock: $holder"
fi
out=$(timeout 60 $MPIRUN -np 1 "$BUILD/chapter-0" $CKF --steps 1 --ckpt-dir "$CK/lock" 2>&1)
rc=$?
if [ $rc -eq 0 ] && echo "$out" | grep -qF "the lock of an earlier run ($holder) is stale" && [ ! -s "$CK/lock/.lock" ]; then
    pass "checkpoint: the lock of a killed run is recognised as stale and taken over; a finished run leaves it empty"
else
    fail "checkpoint: a stale lock" "exit $rc; $(echo "$out" | grep -E '^error|^note' | head -2); .lock after: $(cat "$CK/lock/.lock")"
fi
}
jobs_run ck_lock

# flags that cannot work: one message, exit 1, before any step
ck_flag() {  # DESCRIPTION EXPECTED-TEXT FLAGS...
    local what=$1 expect=$2 out rc
    shift 2
    out=$(OMPI_MCA_odls_base_sigkill_timeout=0 timeout 60 $MPIRUN -np 2 "$BUILD/chapter-2" --dp 2 $CKF "$@" 2>&1)
    rc=$?
    if [ $rc -eq 1 ] && [ "$(echo "$out" | grep -c '^error')" = 1 ] && echo "$out" | grep -qF -- "$expect" &&
        ! echo "$out" | grep -q '^step'; then
        pass "checkpoint flags: $what: exit 1, '$expect'"
    else
        fail "checkpoint flags: $what" "exit $rc; $(echo "$out" | grep -E '^error' | head -2)"
    fi
}
jobs_run ck_flag "--save-every without --ckpt-dir" "--save-every and --async-save need --ckpt-dir DIR" --save-every 2
jobs_run ck_flag "--keep without a checkpoint directory" "--keep needs --ckpt-dir or --ckpt-local DIR" --keep 2
jobs_run ck_flag "--resume of a directory that does not exist" "--resume '$CK/nosuch' does not exist" --resume "$CK/nosuch"
jobs_run ck_flag "--ckpt-dir naming a file" "--ckpt-dir '$CK/ref.bin' is a file, not a directory" --ckpt-dir "$CK/ref.bin"
jobs_wait

finish
