# moe_lib.sh: the helpers tests/chapter_7.sh and tests/capstone.sh share to
# check chapter 7's model: sourced after tests/lib.sh, with C7_PROG the
# program (chapter-7 or capstone) and C7_LABEL the checks' prefix.
c7_drops() { grep '"type":"step"' "$1" | grep -o '"dropped":[0-9]*' | tr '\n' ' '; }  # "dropped":N per step
c7_same() {
    local log=$TEST_TMPDIR/c7_$2_$(echo "$1" | tr -cd 'a-z0-9').jsonl a="" v=""
    mpi_run $T_RUN "$2" "$BUILD/$C7_PROG" $c7_flags $3 --log "$log"
    C7_LOG=$log
    if [ $RC = 0 ] && a=$(bash tests/compare_routing.sh "$c7_ref" "$log" $TOL $TOL_NORM 2>&1) &&
        v=$(c7_val_same "$c7_ref" "$log" "$a"); then
        pass "$C7_LABEL: $1 reproduces ep=1 ($a; $v)"
    else
        fail "$C7_LABEL: $1" "exit $RC; $a; $v; command: $CMD; $(echo "$OUT" | grep -E 'error' | head -3)"
    fi
}
# c7_val_same REF RUN COMPARED: the validation losses within TOL (compare_val)
# when COMPARED, compare_routing.sh's line, says the routing was the same at
# every step: the same model, validated on the same sequences (after a flip
# the runs train different models, and nothing is compared)
c7_val_same() {
    case $3 in
        *"routing the same at every step"*) compare_val "$1" "$2" ;;
        *) echo "validation not compared: the routing differs" ;;
    esac
}
c7_tail() { grep '"type":"step"' "$1" | awk -v f="$2" '{ match($0, /"step":[0-9]+/); if (substr($0, RSTART + 7, RLENGTH - 7) + 0 >= f) print }' |
    sed 's/"ms":[^,]*,"tokens_per_s":[^,]*,//'; }
# After a resume's mpi_run (RC, OUT): RES, the resumed run's log, against
# FULL, the uninterrupted run's, from step 4 on. NAME says what resumed where.
#   c7_resumed_same NAME FULL RES         every field of every record, the same bits
c7_resumed_same() {
    local a b
    a=$(c7_tail "$2" 4) b=$(c7_tail "$3" 0)
    if [ $RC = 0 ] && echo "$OUT" | grep -q "checkpoint: resumed from" && [ -n "$a" ] && [ "$a" = "$b" ] &&
        [ "$(echo "$b" | wc -l)" = $((INV_STEPS - 4)) ]; then
        pass "$C7_LABEL: $1 resumed at step 4 repeats steps 4..$((INV_STEPS - 1)) bit for bit"
    else
        fail "$C7_LABEL: resume on $1" "exit $RC; $(diff <(echo "$a") <(echo "$b") | head -4); $(echo "$OUT" | grep -E 'error|resumed' | head -2)"
    fi
}
c7_sample() { sed -n '/^sample (40 tokens):/,$p' <<< "$OUT" | head -2; }

# Capacity on other meshes against one rank. c7_capacity_hand MESH...:
# E = 2, k = 2, capacity 0.25 keeps the first 192 token-slots of each
# expert of the global batch and drops 2304 per step on any mesh (the hand
# count); each MESH ("NP FLAGS") drops the same and matches one rank.
# c7_capacity_routed MESH...: E = 4, k = 2, capacity 1, where the router
# chooses: the same slots dropped at every step as one rank's.
c7_capacity_hand() {
    local cap="--steps 3 --batch 24 --seq 32 --peak-gflops 10 --experts 2 --top-k 2 --capacity-factor 0.25" n1 n2 np log a mesh
    mpi_run $T_RUN 1 "$BUILD/$C7_PROG" $cap --log "$TEST_TMPDIR/c7_cap1.jsonl"
    n1=$(grep -c '"dropped":2304,' "$TEST_TMPDIR/c7_cap1.jsonl")
    # bit for bit by construction: the chunks' calls differ in rows, and every op they run is row-stable (tests/test_rows.c)
    for mesh in "$@"; do
        np=${mesh%% *} log=$TEST_TMPDIR/c7_cap$(echo "$mesh" | tr -cd 'a-z0-9').jsonl a=""
        mpi_run $T_RUN $np "$BUILD/$C7_PROG" $cap ${mesh#* } --log "$log"
        n2=$(grep -c '"dropped":2304,' "$log")
        if [ "$n1" = 3 ] && [ "$n2" = 3 ] && a=$(bash tests/compare_routing.sh "$TEST_TMPDIR/c7_cap1.jsonl" "$log" $TOL $TOL_NORM 2>&1); then
            pass "$C7_LABEL: capacity 0.25 drops 2304 token-slots per step (hand count), ${mesh#* } drops the same and matches ($a)"
        else
            fail "$C7_LABEL: capacity mode on ${mesh#* }" "steps with 2304 dropped: $n1 (ep=1), $n2 (${mesh#* }); $a; exit $RC"
        fi
    done
}
c7_capacity_routed() {
    local cap="$INV_FLAGS --experts 4 --top-k 2 --capacity-factor 1" n1 log a mesh ref=$TEST_TMPDIR/c7_capr1.jsonl
    mpi_run $T_RUN 1 "$BUILD/$C7_PROG" $cap --log "$ref"
    n1=$(grep '"type":"step"' "$ref" | grep -vc '"dropped":0,')
    for mesh in "$@"; do
        log=$TEST_TMPDIR/c7_capr$(echo "$mesh" | tr -cd 'a-z0-9').jsonl a=""
        mpi_run $T_RUN ${mesh%% *} "$BUILD/$C7_PROG" $cap ${mesh#* } --log "$log"
        if [ $RC = 0 ] && [ "$n1" = $INV_STEPS ] && [ "$(c7_drops "$log")" = "$(c7_drops "$ref")" ] &&
            a=$(bash tests/compare_routing.sh "$ref" "$log" $TOL $TOL_NORM 2>&1); then
            pass "$C7_LABEL: capacity 1 with E=4, k=2 on ${mesh#* } reproduces one rank, the same slots dropped at every step ($a)"
        else
            fail "$C7_LABEL: capacity 1 on ${mesh#* }" "exit $RC; steps with drops on one rank: $n1 of $INV_STEPS; dropped $(c7_drops "$log") against $(c7_drops "$ref"); $a"
        fi
    done
}

# c7_odd_meshes MESH...: a dense layer below an MoE layer (--moe-every 2),
# experts of width 96, and k = 3 > the 2 experts of a rank (the receive
# buffers' bound min(k, E/ep)), the flags c7_odd: each MESH ("NP FLAGS")
# against one rank.
c7_odd="--steps 4 --batch 24 --seq 32 --peak-gflops 10 --experts 4 --top-k 3 --moe-every 2 --expert-hidden 96"
c7_odd_meshes() {
    local odd=$c7_odd ref=$TEST_TMPDIR/c7_odd1.jsonl mesh log a
    mpi_run $T_RUN 1 "$BUILD/$C7_PROG" $odd --log "$ref"
    for mesh in "$@"; do
        log=$TEST_TMPDIR/c7_odd$(echo "$mesh" | tr -cd 'a-z0-9').jsonl a=""
        mpi_run $T_RUN ${mesh%% *} "$BUILD/$C7_PROG" $odd ${mesh#* } --log "$log"
        if [ $RC = 0 ] && a=$(bash tests/compare_routing.sh "$ref" "$log" $TOL $TOL_NORM 2>&1); then
            pass "$C7_LABEL: --moe-every 2, H=96, k=3 on ${mesh#* } reproduces ep=1 ($a)"
        else
            fail "$C7_LABEL: --moe-every 2, H=96, k=3 on ${mesh#* }" "exit $RC; $a; command: $CMD"
        fi
    done
}

# c7_reference: the MoE model (E = 4, k = 2, c7_flags) on one rank, the
# reference of the meshes (c7_ref, read by c7_same); it must train every step.
c7_reference() {
    c7_flags="$INV_FLAGS --experts 4 --top-k 2"
    c7_ref=$TEST_TMPDIR/c7_ref.jsonl
    mpi_run $T_RUN 1 "$BUILD/$C7_PROG" $c7_flags --log "$c7_ref"
    if [ $RC = 0 ] && [ "$(grep -c '"type":"step"' "$c7_ref")" = $INV_STEPS ]; then
        pass "$C7_LABEL: E=4, k=2 on one rank trains $INV_STEPS steps"
    else
        fail "$C7_LABEL: the ep=1 run" "exit $RC; command: $CMD; $(echo "$OUT" | tail -3)"
    fi
}
