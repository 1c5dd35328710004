# moe_lib.sh: the helpers tests/chapter_7.sh and tests/capstone.sh share to
# check chapter 7's model: sourced after tests/lib.sh, with C7_PROG the
# program (chapter-7 or capstone) and C7_LABEL the checks' prefix.
c7_drops() { grep '"type":"step"' "$1" | grep -o '"dropped":[0-9]*' | tr '\n' ' '; }  # "dropped":N per step
c7_same() {
    local log=$TEST_TMPDIR/c7_$2_$(echo "$1" | tr -cd 'a-z0-9').jsonl a=""
    mpi_run $T_RUN "$2" "$BUILD/$C7_PROG" $c7_flags $3 --log "$log"
    C7_LOG=$log
    if [ $RC = 0 ] && a=$(bash tests/compare_routing.sh "$c7_ref" "$log" $TOL $TOL_NORM 2>&1); then
        pass "$C7_LABEL: $1 reproduces ep=1 ($a)"
    else
        fail "$C7_LABEL: $1" "exit $RC; $a; command: $CMD; $(echo "$OUT" | grep -E 'error' | head -3)"
    fi
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
