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
# as tests/capstone.sh checks its meshes). A layout the capstone refuses
# (composed_rules.c) is counted under its error line, not run. Each failure
# prints both commands; exit 1 on any. tests/capstone.sh holds the fixed
# cases make test runs; this one is for after a change to an axis.
. "$(dirname "$0")/lib.sh"
SWEEP_SECONDS=${SWEEP_SECONDS:-600}
SWEEP_SEED=${SWEEP_SEED:-1}
RANDOM=$SWEEP_SEED
pick() { local a=("$@"); echo "${a[$((RANDOM % ${#a[@]}))]}"; }
echo "== layout sweep: seed $SWEEP_SEED, $SWEEP_SECONDS s"

# One random layout: MESH (the capstone's layout flags), BASE (the run's
# flags every reference shares), MOE (the model's experts) and REF_M (the
# one-rank reference's --microbatches); fails when the draw is not a mesh
# of 2 to 8 ranks.
draw() {
    local dp tp pp cp ep E np s m=1 zero model every
    model=$(pick tiny tiny6) every=$(pick 1 1 2)
    dp=$(pick 1 1 2) tp=$(pick 1 1 2) pp=$(pick 1 1 2 3) cp=$(pick 1 1 2 4) ep=1 E=1
    if [ $model = tiny6 ]; then every=$(pick 1 2 3); elif [ $pp = 3 ]; then pp=2; fi  # tiny has 2 layers
    DENSE=$(pick 0 1)
    if [ "$DENSE" = 0 ]; then E=$(pick 2 4 4) ep=$(pick 1 2 2 4); fi
    [ $((E % ep)) = 0 ] || return 1
    np=$((dp * tp * pp * cp * ep))
    [ $np -ge 2 ] && [ $np -le 8 ] || return 1
    NP=$np
    MESH="--dp $dp --tp $tp --pp $pp --cp $cp --ep $ep"
    [ $cp -gt 1 ] && MESH="$MESH --cp-mode $(pick ring ulysses) --cp-balance $(pick none zigzag)"
    if [ $pp -gt 1 ]; then
        s=$(pick gpipe 1f1b interleaved zb) m=$(pick 1 2 4)
        MESH="$MESH --schedule $s --microbatches $m"
        [ $s = interleaved ] && MESH="$MESH --virtual $(pick 1 2 3)"
        zero=$(pick 0 1)  # 2 and 3 are refused with the pipeline
    else
        zero=$(pick 0 1 2 3)
    fi
    MESH="$MESH --zero $zero --recompute $(pick none selective full) --ep-overlap $(pick 1 2 3)"
    REF_M=""
    [ $m -gt 1 ] && REF_M="--microbatches $m"
    BASE="--steps 5 --batch $(pick 8 16) --seq 32 --peak-gflops 10 --model $model --lr $(pick 1e-3 3e-3) --wd $(pick 0 0.1)"
    if [ "$DENSE" = 1 ]; then  # chapter 0's model as the capstone's: one expert of 4C, every token to it
        MOE="--experts 1 --top-k 1 --moe-every $every"
    else
        MOE="--experts $E --top-k $(pick 1 2) --moe-every $every --capacity-factor $(pick 0 0 1 1.5) --aux-coef $(pick 0.01 0.1)"
    fi
}

n=0 refused=0
declare -A why
end=$(($(date +%s) + SWEEP_SECONDS))
while [ "$(date +%s)" -lt $end ]; do
    draw || continue
    # refused layouts: the capstone's own rules, before any step
    mpi_run --may-fail $T_SHORT "$NP" "$BUILD/capstone" $MESH $MOE $BASE --steps 0
    if [ $RC -ne 0 ]; then
        if timed_out || ! echo "$OUT" | grep -q '^error: '; then
            fail "sweep: the check of $MESH $MOE $BASE" "exit $RC without an error line (a hang or a crash): $(echo "$OUT" | tail -3)"
        else
            refused=$((refused + 1))
            key=$(echo "$OUT" | grep -m1 '^error: ' | sed 's/[0-9]\+/N/g' | cut -c1-90)
            why[$key]=$((${why[$key]:-0} + 1))
        fi
        continue
    fi
    n=$((n + 1))
    if [ "$DENSE" = 1 ]; then
        invariant "sweep $n: $NP ranks, $MESH $MOE | $BASE, chapter 0's" "$BASE" "$NP" capstone "$MESH $MOE"
        continue
    fi
    ref=$TEST_TMPDIR/sweep_ref_$n.jsonl log=$TEST_TMPDIR/sweep_$n.jsonl a=""
    mpi_run $T_RUN 1 "$BUILD/capstone" $MOE $BASE $REF_M --log "$ref"
    ref_rc=$RC ref_cmd=$CMD
    mpi_run $T_RUN "$NP" "$BUILD/capstone" $MESH $MOE $BASE --log "$log"
    if [ $ref_rc = 0 ] && [ $RC = 0 ] && a=$(bash tests/compare_routing.sh "$ref" "$log" $TOL $TOL_NORM 2>&1); then
        pass "sweep $n: $NP ranks, $MESH $MOE | $BASE, one rank's: $a"
    else
        fail "sweep $n" "exit $ref_rc (one rank), $RC; ${a:-}; reference: $ref_cmd; run: $CMD"
    fi
    rm -f "$ref" "$log"
done
echo "-- $n layouts run, $refused refused:"
for key in "${!why[@]}"; do printf '   %3d  %s\n' "${why[$key]}" "$key"; done | sort -rn
finish
