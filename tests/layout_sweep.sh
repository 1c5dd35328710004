#!/bin/bash
# make sweep-layouts: the invariant on layouts nobody wrote down. For
# SWEEP_SECONDS (default 600) it draws capstone layouts at random from
# SWEEP_SEED (default 1; the same seed draws the same layouts): a mesh of
# 2 to 8 ranks over dp, tp, pp, cp, ep, with the schedule, microbatches,
# chunks, ZeRO stage, recompute mode, cp algorithm and balance, and
# --ep-overlap chunks, on tiny or tiny6 with --moe-every 1 to 3. Half the
# draws are the dense model (one expert, k = 1), checked against chapter
# 0's losses and norms (tests/lib.sh's invariant); the other half have 2 or
# 4 experts, top-1 or top-2, dropless or with capacity, checked against the
# capstone on one rank with the same microbatches (tests/compare_routing.sh,
# as tests/capstone.sh checks its meshes). Then the layout's checkpoint of
# step 3 is resumed on a second layout drawn for the same model, and the
# five steps of the two runs are checked as one run against the same
# reference (the experts': one rank, resumed where the microbatches
# change). A layout the capstone refuses (composed_rules.c) is counted
# under its error line, not run. Each failure prints its commands; exit 1
# on any. tests/capstone.sh holds the fixed cases make test runs; this one
# is for after a change to an axis.
. "$(dirname "$0")/lib.sh"
SWEEP_SECONDS=${SWEEP_SECONDS:-600}
SWEEP_SEED=${SWEEP_SEED:-1}
RANDOM=$SWEEP_SEED
# pick VAR WORD...: one of the words into VAR (in this shell: RANDOM in a
# $(...) subshell is reseeded, and the seed would not repeat the draws)
pick() { local var=$1; shift; printf -v "$var" '%s' "${@:$((RANDOM % $# + 1)):1}"; }
echo "== layout sweep: seed $SWEEP_SEED, $SWEEP_SECONDS s"

# The model and the run every layout of a draw shares: BASE (the flags the
# references take too), MOE (the experts), E, DENSE (1: one expert, k = 1:
# chapter 0's model), LAYERS.
draw_model() {
    local model every batch lr wd k cap aux
    pick model tiny tiny6
    pick every 1 1 2
    LAYERS=2
    if [ $model = tiny6 ]; then pick every 1 2 3; LAYERS=6; fi
    pick batch 8 16
    pick lr 1e-3 3e-3
    pick wd 0 0.1
    BASE="--steps 5 --batch $batch --seq 32 --peak-gflops 10 --model $model --lr $lr --wd $wd"
    pick DENSE 0 1
    E=1
    if [ "$DENSE" = 1 ]; then  # chapter 0's model as the capstone's: one expert of 4C, every token to it
        MOE="--experts 1 --top-k 1 --moe-every $every"
    else
        pick E 2 4 4
        pick k 1 2
        pick cap 0 0 1 1.5
        pick aux 0.01 0.1
        MOE="--experts $E --top-k $k --moe-every $every --capacity-factor $cap --aux-coef $aux"
    fi
}

# A layout for that model: MESH (the capstone's layout flags), NP and M
# (its microbatches); fails when the draw is not a mesh of 2 to 8 ranks.
draw_mesh() {
    local dp tp pp cp ep=1 s zero v mode balance recompute overlap
    pick dp 1 1 2
    pick tp 1 1 2
    pick pp 1 1 2 3
    pick cp 1 1 2 4
    M=1
    [ "$DENSE" = 0 ] && pick ep 1 2 2 4
    [ $LAYERS = 2 ] && [ $pp = 3 ] && pp=2
    [ $((E % ep)) = 0 ] || return 1
    NP=$((dp * tp * pp * cp * ep))
    [ $NP -ge 2 ] && [ $NP -le 8 ] || return 1
    MESH="--dp $dp --tp $tp --pp $pp --cp $cp --ep $ep"
    if [ $cp -gt 1 ]; then
        pick mode ring ulysses
        pick balance none zigzag
        MESH="$MESH --cp-mode $mode --cp-balance $balance"
    fi
    if [ $pp -gt 1 ]; then
        pick s gpipe 1f1b interleaved zb
        pick M 1 2 4
        MESH="$MESH --schedule $s --microbatches $M"
        if [ $s = interleaved ]; then pick v 1 2 3; MESH="$MESH --virtual $v"; fi
        pick zero 0 1  # 2 and 3 are refused with the pipeline
    else
        pick zero 0 1 2 3
    fi
    pick recompute none selective full
    pick overlap 1 2 3
    MESH="$MESH --zero $zero --recompute $recompute --ep-overlap $overlap"
}
mb_flag() { [ "$1" -gt 1 ] && echo "--microbatches $1"; }

# refused: 0 when the capstone refuses MESH for the model (its own rules,
# before any step), the error counted; a refusal without an error line fails.
refused_count=0
declare -A why
refused() {
    mpi_run --may-fail $T_SHORT "$NP" "$BUILD/capstone" $MESH $MOE $BASE --steps 0
    [ $RC = 0 ] && return 1
    if timed_out || ! echo "$OUT" | grep -q '^error: '; then
        fail "sweep: the check of $MESH $MOE $BASE" "exit $RC without an error line (a hang or a crash): $(echo "$OUT" | tail -3)"
    else
        refused_count=$((refused_count + 1))
        local key
        key=$(echo "$OUT" | grep -m1 '^error: ' | sed 's/[0-9]\+/N/g' | cut -c1-90)
        why[$key]=$((${why[$key]:-0} + 1))
    fi
    return 0
}

# compare REF RUN: the dense model's losses and norms, or the experts' as
# far as the routing agrees; prints the figures, fails past the tolerances.
compare() {
    if [ "$DENSE" = 1 ]; then
        local l g
        l=$(bash tests/compare_losses.sh "$1" "$2" $TOL) && g=$(bash tests/compare_losses.sh "$1" "$2" $TOL_NORM norm) &&
            echo "losses $l, norms ${g#* steps, }" && return 0
        echo "losses $l, norms ${g:-}"
        return 1
    fi
    bash tests/compare_routing.sh "$1" "$2" $TOL $TOL_NORM 2>&1
}

n=0 resumes=0
end=$(($(date +%s) + SWEEP_SECONDS))
while [ "$(date +%s)" -lt $end ]; do
    draw_model
    draw_mesh || continue
    refused && continue
    n=$((n + 1))
    ref=$TEST_TMPDIR/sweep_ref.jsonl log=$TEST_TMPDIR/sweep.jsonl a=""
    rm -rf "$ref" "$log" "$TEST_TMPDIR"/sweep_*
    # the reference: chapter 0 (cached), or the capstone on one rank
    if [ "$DENSE" = 1 ]; then
        reference "$BASE"
        cp "$REF" "$ref"
        ref_cmd=$(cat "$REF.cmd") ref_rc=$(cat "$REF.rc")
    else
        mpi_run $T_RUN 1 "$BUILD/capstone" $MOE $BASE $(mb_flag $M) --log "$ref"
        ref_cmd=$CMD ref_rc=$RC
    fi
    mpi_run $T_RUN "$NP" "$BUILD/capstone" $MESH $MOE $BASE --log "$log" --ckpt-dir "$TEST_TMPDIR/sweep_ck" --save-every 3
    if [ "$ref_rc" = 0 ] && [ $RC = 0 ] && a=$(compare "$ref" "$log"); then
        pass "sweep $n: $NP ranks, $MESH $MOE | $BASE: $a"
    else
        fail "sweep $n" "exit $ref_rc (reference), $RC; ${a:-}; reference: $ref_cmd; run: $CMD"
        continue
    fi
    # step 3's checkpoint on a second layout of the model: steps 0-2 of
    # the first run and 3-4 of the resumed one, as one run
    first_mesh=$MESH first_np=$NP first_m=$M
    for try in 1 2 3 4 5 6 7 8; do
        draw_mesh && ! refused && break
        NP=0
    done
    [ "$NP" = 0 ] && continue
    grep -v '"step":[34],' "$log" > "$TEST_TMPDIR/sweep_joined.jsonl"
    rm -rf "$TEST_TMPDIR/sweep_ck/step-00000005"
    if [ "$DENSE" = 0 ] && [ "$M" != "$first_m" ]; then  # the reference resumed where the microbatches change
        mpi_run $T_RUN 1 "$BUILD/capstone" $MOE $BASE --steps 3 $(mb_flag $first_m) --ckpt-dir "$TEST_TMPDIR/sweep_ref_ck"
        mpi_run $T_RUN 1 "$BUILD/capstone" $MOE $BASE $(mb_flag $M) --resume "$TEST_TMPDIR/sweep_ref_ck" --log "$TEST_TMPDIR/sweep_ref_tail.jsonl"
        ref_cmd="$ref_cmd, then $CMD" ref_rc=$RC
        grep -v '"step":[34],' "$ref" > "$TEST_TMPDIR/sweep_ref_joined.jsonl"
        cat "$TEST_TMPDIR/sweep_ref_tail.jsonl" >> "$TEST_TMPDIR/sweep_ref_joined.jsonl"
        ref=$TEST_TMPDIR/sweep_ref_joined.jsonl
    fi
    mpi_run $T_RUN "$NP" "$BUILD/capstone" $MESH $MOE $BASE --resume "$TEST_TMPDIR/sweep_ck" --log "$TEST_TMPDIR/sweep_tail.jsonl"
    cat "$TEST_TMPDIR/sweep_tail.jsonl" >> "$TEST_TMPDIR/sweep_joined.jsonl"
    resumes=$((resumes + 1)) a=""
    if [ "$ref_rc" = 0 ] && [ $RC = 0 ] && echo "$OUT" | grep -q "^checkpoint: resumed from .*step-00000003 (chapter 7, world $first_np)" &&
        a=$(compare "$ref" "$TEST_TMPDIR/sweep_joined.jsonl"); then
        pass "sweep $n: step 3 of $first_np ranks ($first_mesh) resumed on $NP ranks, $MESH: $a"
    else
        fail "sweep $n: step 3 of $first_np ranks ($first_mesh) resumed on $NP ranks ($MESH)" \
            "exit $ref_rc (reference), $RC; ${a:-}; $(echo "$OUT" | grep -E '^error|resumed' | head -2); reference: $ref_cmd; run: $CMD"
    fi
done
echo "-- $n layouts run, $resumes of their checkpoints resumed on another, $refused_count refused:"
for key in "${!why[@]}"; do printf '   %3d  %s\n' "${why[$key]}" "$key"; done | sort -rn
finish
