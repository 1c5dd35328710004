#!/bin/bash
# tests/homework/grade.sh N: the autograder of chapter N's exercises
# (`make grade CHAPTER=N`), in a student tree or the full one.
#
# It builds the CPU programs it needs, then runs the checks that tests/homework/
# chapter_N.grade lists for each exercise:
#     exercise K POINTS "title"
#     check K "what it checks" HELPER ARGS...
# An exercise earns its POINTS when every one of its checks passes, nothing
# otherwise; after its first failed check the rest are skipped (they would
# only repeat the failure). It prints PASS/FAIL per check, a line per
# exercise, and last `grade chapter N: S / T` for a grading script to read.
#
#   EXERCISE=K      grade exercise K only (T is then its points)
#   SUBMISSION=DIR  (in the full tree) grade the student tree DIR, each
#                   exercise on its own: DIR's region k in a copy of this
#                   tree, the other exercises this tree's solutions
#   GRADE_NO_BUILD=1  use the programs already built (tests/homework.sh)
#   GRADE_RESULT=FILE  also write "K GOT POINTS" per exercise graded into
#                   FILE: the score a grading script reads (grade_class.sh,
#                   SUBMISSION mode), from the grader itself, never from the
#                   output of a program under test, which prints what it likes
#
# The helpers a .grade file calls (each returns 0 when its check passes):
#   collective OP NP...         chapter-1 --check --op OP on each NP: exact
#                               against the library on odd sizes, two roots
#   train NP PROGRAM "FLAGS" [--expect PHRASE] [--summary ERE]...
#                               PROGRAM on NP ranks reproduces chapter 0's
#                               losses and gradient norms (GRADE_FLAGS: 6 AdamW
#                               steps of 24 x 32 on the tiny model); the output
#                               has PHRASE, the JSONL summary matches each ERE
#                               (the memory and communication formulas)
set -u
chapter=${1:-}
if ! [[ "$chapter" =~ ^[0-9]+$ ]]; then
    echo "error: give the chapter: make grade CHAPTER=N" >&2
    exit 2
fi
. "$(dirname "$0")/../lib.sh"
spec=tests/homework/chapter_$chapter.grade
if [ ! -f "$spec" ]; then
    echo "error: chapter $chapter has no grading entries ($spec); chapters with homework: $(ls tests/homework/*.grade 2>/dev/null | sed 's/.*chapter_\([0-9]*\).grade/\1/' | tr '\n' ' ')" >&2
    exit 2
fi
only=${EXERCISE:-}
# the result file is the grader's: not in the environment of the programs it runs
result=${GRADE_RESULT:-}
unset GRADE_RESULT
# SUBMISSION mode's copies: a secret on stdin (never in the environment, a
# file or a command line the programs under test could read), to be shown
# with each score line; the programs get no stdin
nonce=""
if [ -n "${GRADE_NONCE_ON_STDIN:-}" ]; then
    unset GRADE_NONCE_ON_STDIN
    read -r nonce
    exec < /dev/null
fi
[ -z "$result" ] || : > "$result" || { echo "error: GRADE_RESULT=$result cannot be written" >&2; exit 2; }
if [ -n "$only" ] && { ! [[ "$only" =~ ^[0-9]+$ ]] || ! grep -q "^exercise $only " "$spec"; }; then
    echo "error: chapter $chapter has no exercise $only (it has $(sed -n 's/^exercise \([0-9]*\) .*/\1/p' "$spec" | tr '\n' ' '))" >&2
    exit 2
fi

GRADE_FLAGS="--steps 6 --batch 24 --seq 32 --peak-gflops 10"
# A run that fails (a stub's MPI_Abort, a wrong result's exit, a crash)
# ends at once: mpirun does not spend its 2 s stopping the ranks left (the
# grader reads what they printed before; error_case in tests/lib.sh says
# why that is safe), and a hang still ends at the time limit. A fresh
# student tree fails a run in each stubbed exercise: chapter 7's make grade
# took 3.6 and 3.8 s of wall time with the wait, 1.3 and 1.9 s without.
export OMPI_MCA_odls_base_sigkill_timeout=${OMPI_MCA_odls_base_sigkill_timeout:-0}

collective() {
    local op=$1 np
    shift
    for np in "$@"; do
        mpi_run --may-fail $T_RUN "$np" "$BUILD/chapter-1" --check --op "$op"
        if [ $RC -ne 0 ] || ! echo "$OUT" | grep -q '^check summary: .* match' || echo "$OUT" | grep -q 'FAILED' ||
            ! echo "$OUT" | grep -qE "^check $op +[0-9]+ runs .*: exact"; then
            program_error
            echo "  chapter-1 --check --op $op on $np ranks: exit $RC"
            echo "$OUT" | grep -E 'FAIL' | head -3 | cut -c1-600 | sed 's/^ */    /'
            return 1
        fi
    done
    return 0
}

train() {
    local np=$1 prog=$2 flags=$3 expect="" res=0 before=$failed sum ere
    local -a summaries=()
    shift 3
    while [ $# -gt 0 ]; do
        case $1 in
            --expect) expect=$2; shift 2 ;;
            --summary) summaries+=("$2"); shift 2 ;;
            *) echo "  grade: unknown train option $1" >&2; return 1 ;;
        esac
    done
    if [ -n "$expect" ]; then
        invariant --norm --expect "$expect" "$prog on $np ranks, $flags" "$GRADE_FLAGS" "$np" "$prog" "$flags" > "$TEST_TMPDIR/grade_inv" 2>&1
    else
        invariant --norm "$prog on $np ranks, $flags" "$GRADE_FLAGS" "$np" "$prog" "$flags" > "$TEST_TMPDIR/grade_inv" 2>&1
    fi
    [ $failed -eq $before ] || res=1
    failed=$before
    passed=0
    if [ $res = 1 ]; then
        # the program's own error: line first and whole, then the comparison
        program_error
        sed 's/^FAIL /  /' "$TEST_TMPDIR/grade_inv" | quiet | head -3 | cut -c1-600
        return 1
    fi
    sum=$(grep '"type":"summary"' "$INV_LOG")
    for ere in "${summaries[@]+"${summaries[@]}"}"; do
        if ! echo "$sum" | grep -qE -- "$ere"; then
            echo "  the summary of $prog on $np ranks ($flags): expected $(readable "$ere"), got $(actual "$ere" "$sum")"
            return 1
        fi
    done
    return 0
}

# program_error: the first error: line of the last run ($OUT), whole (or,
# with none, the first "[rank N] file:line: ..." of a check that stopped
# it); a hang or a crash said as such
program_error() {
    local e
    e=$(echo "$OUT" | grep -m1 '^error:')
    # else a check inside the program that stopped it (FATAL, CHECK: errors.h)
    [ -n "$e" ] || e=$(echo "$OUT" | grep -m1 -E '^\[rank [0-9]+\] ')
    [ -n "$e" ] && echo "  $e"
    if timed_out; then
        echo "  no end within the time limit (exit $RC): a hang"
    elif e=$(crash_report); then
        echo "  $e"
    fi
    return 0
}
# crash_report: "segmentation fault (SIGSEGV) in exercise K on rank R: in
# f, called from g" when the last run died of a signal (mpirun's "exited on
# signal N (Name)" line, else an exit status of 128 + N), the frames from
# the first backtrace Open MPI printed (the program's own, resolved by
# addr2line where it printed an offset); returns 1 when the run did not crash
crash_report() {
    local num="" name="" rank="" where
    read -r rank num name <<< "$(echo "$OUT" | sed -nE 's/.*process rank ([0-9]+) .*exited on signal ([0-9]+) \(([^)]*)\).*/\1 \2 \3/p' | head -1)"
    if [ -z "$num" ]; then
        [ "${RC:-0}" -gt 128 ] && [ "$RC" -lt 160 ] || return 1
        num=$((RC - 128)) rank=""
        name=$(kill -l "$num" 2>/dev/null) || return 1
    fi
    where=$(backtrace_frames | head -2 | paste -sd, | sed 's/,/, called from /')
    echo "$(echo "$name" | tr 'A-Z' 'a-z') (SIG$(kill -l "$num" 2>/dev/null || echo "$num")) in exercise ${current_ex:-?}${rank:+ on rank $rank}${where:+: in $where}"
}
# backtrace_frames: the function names of the program's own frames in the
# first backtrace of $OUT, innermost first (libraries and MPI's wrappers left out)
backtrace_frames() {
    local frame bin sym off
    echo "$OUT" | awk '/\*\*\* Process received signal \*\*\*/ { n++ } n == 1 && /\] \[ *[0-9]+\] / { print } /End of error message/ && n == 1 { exit }' |
        sed -nE 's/.*\] \[ *([0-9]+)\] ([^ (]+)\(([^)]*)\).*/\1 \2 \3/p' | while read -r frame bin sym; do
        case $bin in *.so* | */libc* ) continue ;; esac
        if [[ "$sym" == +0x* ]]; then
            # frame 1 is where the signal hit (frame 0 the handler); any
            # later one a return address, just after its call
            off=$(printf '0x%x' $(( ${sym#+} - (frame > 1 ? 1 : 0) )))
            sym=$(addr2line -f -e "$bin" "$off" 2>/dev/null | head -1)
        else
            sym=${sym%%+*}
        fi
        case $sym in "" | "??" | MPI_* | PMPI_* | _start | __libc*) continue ;; esac
        echo "$sym"
    done
}
# quiet TEXT: without MPI's crash banner (its backtrace lines, "*** End of
# error message ***"), which crash_report has said in one line
quiet() {
    sed -E 's/ *\[[^] ]*:[0-9]+\] \*\*\*[^*]*\*\*\*//g' | grep -vE '^ *\[[^] ]*:[0-9]+\] |^ *$'
}
# readable ERE: the figure an ERE of a .grade file asks for, without the
# regex escapes ('"activation_slots":\[4,3,2,1\]' -> "activation_slots":[4,3,2,1])
readable() { echo "$1" | sed 's/\\//g; s/,$//; s/\.\*/ ... /g'; }
# actual ERE TEXT: the same field(s) in TEXT, as the run wrote them
actual() {
    local f got="" k
    for f in $(echo "$1" | grep -oE '"[a-z_]+":' | tr -d '":'); do
        k=$(echo "$2" | grep -oE "\"$f\":(\[[^]]*\]|[^,}]*)" | tail -1)
        got="$got${got:+ }${k:-no \"$f\" field}"
    done
    echo "${got:-nothing}"
}

# figures NP PROGRAM "FLAGS" FIELD STEP VALUE TOL [FIELD STEP VALUE TOL]...:
# PROGRAM on NP ranks (GRADE_FLAGS FLAGS) writes FIELD at STEP within TOL of
# VALUE (the instructor's solution's figure, stored in the .grade file; TOL 0:
# exactly). A check that does not depend on the student's code elsewhere: a
# gradient wrong the same way on every mesh passes every comparison of one
# mesh with another, not this one.
figures() {
    local np=$1 prog=$2 flags=$3 log f st want tol got
    shift 3
    log=$TEST_TMPDIR/grade_fig_$np$(echo "$prog $flags" | tr -cd 'a-z0-9.').jsonl
    mpi_run --may-fail $T_RUN "$np" "$BUILD/$prog" $GRADE_FLAGS $flags --log "$log"
    if [ $RC != 0 ]; then
        program_error
        echo "  exit $RC: $CMD"
        return 1
    fi
    while [ $# -ge 4 ]; do
        f=$1 st=$2 want=$3 tol=$4
        shift 4
        got=$(grep -E "\"type\":\"step\",\"step\":$st," "$log" | grep -oE "\"$f\":[-0-9.e]+" | cut -d: -f2)
        if [ -z "$got" ] || ! awk -v a="$got" -v b="$want" -v t="$tol" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= t) }'; then
            echo "  $prog on $np ranks ($flags), $f at step $st: expected $want (within $tol), got ${got:-none}"
            return 1
        fi
    done
    return 0
}

# unit TEST: the C test tests/TEST.c (built from this tree's code, so from
# the exercise it includes) passes every check: a finite-difference check
# where a gradient is the exercise
unit() {
    local t=$1 out rc
    if ! make --no-print-directory BACKEND=cpu "$BUILD/tests/$t" > "$TEST_TMPDIR/grade_unit_build" 2>&1; then
        echo "  the build of tests/$t.c failed: $(grep -m2 'error' "$TEST_TMPDIR/grade_unit_build")"
        return 1
    fi
    out=$(timeout -k 10 "${T_RUN:-120}" "$BUILD/tests/$t" < /dev/null 2>&1)
    rc=$?
    if [ $rc = 0 ] && ! echo "$out" | grep -q '^FAIL'; then
        return 0
    fi
    echo "$out" | grep -m1 '^error:' | sed 's/^/  /'
    [ $rc = 124 ] || [ $rc = 137 ] && echo "  tests/$t: no end within ${T_RUN:-120} s (a hang)"
    echo "$out" | grep '^FAIL' | head -2 | sed 's/^FAIL /  /'
    [ $rc = 0 ] || echo "  tests/$t exited $rc"
    return 1
}

# ---------------------------------------------------------------- the entries
# The .grade file is sourced after the build: each `exercise` line declares,
# each `check` line runs at once.
declare -A title points ok
order=()
exercise() {
    title[$1]=$3
    points[$1]=$2
    ok[$1]=1
    order+=("$1")
}
check() {
    local k=$1 what=$2
    shift 2
    [ -n "$only" ] && [ "$only" != "$k" ] && return
    if [ $built = 0 ]; then
        echo "FAIL exercise $k: $what (the build failed)"
        ok[$k]=0
        return
    fi
    if [ "${ok[$k]}" != 1 ]; then
        echo "SKIP exercise $k: $what (an earlier check of exercise $k failed)"
        return
    fi
    # the verdict first, then what the helper found (the program's error:
    # line first, expected against actual)
    local said
    current_ex=$k  # crash_report names it
    if said=$("$@"); then
        echo "PASS exercise $k: $what"
    else
        echo "FAIL exercise $k: $what"
        ok[$k]=0
    fi
    [ -n "$said" ] && echo "$said"
    return 0
}

# ---------------------------------------------------------------- SUBMISSION=DIR
# The instructor's grader: each exercise of the student tree DIR graded on
# its own. For exercise k, a scratch copy of this (the full) tree gets DIR's
# region k in place of its own, every other exercise stays the solution, and
# the copy's grade.sh grades exercise k alone: a correct exercise 1 earns its
# points while 2-5 are stubs, and a region that fails to build or hangs
# costs only its own exercise.
if [ -n "${SUBMISSION:-}" ]; then
    sub=$(cd "$SUBMISSION" 2>/dev/null && pwd) || { echo "error: SUBMISSION=$SUBMISSION is not a folder" >&2; exit 2; }
    # the instructor's tree only (as grade_class.sh): in a student tree every
    # region would be graded against that tree's stubs
    if [ -f HOMEWORK.md ] || [ ! -d tests/homework/bugs ]; then
        echo "error: SUBMISSION= grades in the instructor's full tree (this one is a student tree: HOMEWORK.md, no tests/homework/bugs/)" >&2
        exit 2
    fi
    # this tree as it is (its build too), copied afresh for each exercise:
    # what one exercise's programs write into their copy never reaches the
    # next exercise's
    pristine=$TEST_TMPDIR/pristine iso=$TEST_TMPDIR/isolated
    rm -rf "$pristine" "$iso"
    mkdir -p "$pristine"
    if ! python3 tests/homework/cut.py copy "$pristine" > "$TEST_TMPDIR/grade_copy" 2>&1; then
        echo "error: could not copy the tree: $(head -2 "$TEST_TMPDIR/grade_copy")" >&2
        exit 2
    fi
    [ -d "$BUILD" ] && cpu_build_copy "$BUILD" "$pristine/build"
    echo "== grading chapter $chapter of $sub, each exercise on its own (the others: this tree's solutions)"
    score=0 total=0 scores=""
    for k in $(sed -n 's/^exercise \([0-9]*\) .*/\1/p' "$spec"); do
        [ -n "$only" ] && [ "$only" != "$k" ] && continue
        # the copy's grader shows its score with this secret (GRADE_NONCE_ON_STDIN),
        # new for each exercise: a program left over from the last one never saw it
        nonce=$(od -An -tx1 -N16 /dev/urandom | tr -d ' \n')
        pts=$(sed -n "s/^exercise $k \([0-9]*\) .*/\1/p" "$spec")
        total=$((total + pts))
        ex_title=$(sed -n "s/^exercise $k [0-9]* \"\(.*\)\"$/\1/p" "$spec")
        rm -rf "$iso"
        cp -a "$pristine" "$iso"
        file=$(python3 tests/homework/cut.py splice "$chapter" "$k" "$sub" "$iso" 2>&1)
        if [ $? != 0 ]; then
            echo "FAIL exercise $k: $file"
            echo "exercise $k ($ex_title): 0 / $pts"
            scores+="$k 0 $pts"$'\n'
            continue
        fi
        # BUILD=build: the copy's own build dir (a BUILD set outside would
        # send the student's program over this tree's)
        out=$(cd "$iso" && printf '%s\n' "$nonce" | env -u SUBMISSION GRADE_NONCE_ON_STDIN=1 BUILD=build EXERCISE=$k TEST_TMPDIR="$TEST_TMPDIR/iso_$k" bash -c 'mkdir -p "$TEST_TMPDIR"; bash tests/homework/grade.sh '"$chapter" 2>&1)
        # a compiler message names the copy's file and line: the student's
        # own file and line instead (region k starts at its marker in both)
        rel=${file#"$iso"/}
        at_iso=$(grep -n "^ *// EXERCISE $k:" "$file" | head -1 | cut -d: -f1)
        at_sub=$(grep -n "^ *// EXERCISE $k:" "$sub/$rel" | head -1 | cut -d: -f1)
        # the copy's checks as it printed them, but for its score lines: the
        # score is this grader's line below (a line the student's program
        # printed that looks like one is its output, not a score)
        echo "$out" | grep -vE '^(== grading|grade chapter|grade-result )|^exercise [0-9]+ .*: [0-9]+ / [0-9]+$' |
            awk -v f="$rel" -v d=$(( ${at_sub:-0} - ${at_iso:-0} )) -v dir="$sub" '{
                while (match($0, "(^|[ /])" f ":[0-9]+")) {
                    pre = substr($0, 1, RSTART - 1); m = substr($0, RSTART, RLENGTH); post = substr($0, RSTART + RLENGTH)
                    lead = substr(m, 1, 1) == "/" || substr(m, 1, 1) == " " ? substr(m, 1, 1) : ""
                    n = substr(m, length(lead) + length(f) + 2) + d
                    $0 = pre lead "\001" n post
                }
                gsub("\001", dir "/" f ":"); print }'
        # matched in the shell: a grep's command line would show the secret
        got=0 rk="" rgot="" tag="" secret="" k2="" g2=""
        while read -r tag secret k2 g2 _; do
            [ "$tag" = grade-result ] && [ "$secret" = "$nonce" ] && rk=$k2 rgot=$g2
        done <<< "$out"
        # the grader's own files in the copy, as this tree has them: a
        # program that rewrote one (a check, a script, the reference
        # program's source) earns nothing
        changed=$(diff -rq -x build "$pristine" "$iso" 2>&1 | grep -v "^Only in $iso" | grep -vF "$iso/$rel differ" |
            sed -E "s|^Files $pristine/(.*) and .* differ\$|\\1|; s|^Only in $pristine/?(.*): (.*)|\\1/\\2 (deleted)|" | head -3 | tr '\n' ' ')
        if [ -n "$changed" ]; then
            echo "FAIL exercise $k: the programs under test changed the grader's files in their copy: $changed"
        elif [ "$rk" = "$k" ] && [[ "$rgot" =~ ^[0-9]+$ ]] && [ "$rgot" -le "$pts" ]; then
            got=$rgot
        else
            echo "FAIL exercise $k: the copy's grader wrote no score (it stopped early: $(echo "$out" | tail -1 | cut -c1-200))"
        fi
        echo "exercise $k ($ex_title): $got / $pts"
        scores+="$k $got $pts"$'\n'
        score=$((score + got))
    done
    # written once, whole, after every program of the submission ran: a
    # line one of them appended (the path is in this grader's environment,
    # which /proc shows) is overwritten
    [ -z "$result" ] || printf '%s' "$scores" > "$result"
    rm -rf "$iso" "$pristine"
    echo "grade chapter $chapter: $score / $total"
    exit 0
fi
# the block above ends in exit: a shell error that abandons it must stop
# here, never go on to grade this (the solution's) tree in its place
if [ -n "${SUBMISSION:-}" ]; then
    echo "error: grading SUBMISSION=$SUBMISSION stopped early (a shell error above)" >&2
    exit 2
fi

echo "== grading chapter $chapter$([ -n "$only" ] && echo ", exercise $only")"
built=1
if [ -z "${GRADE_NO_BUILD:-}" ]; then
    # the programs the checks run (chapter 0 for the reference, chapter 1 for
    # the collective checks), not the whole tree: a regrade relinks only them
    progs=$( (echo chapter-0; grep -q '^check .* collective ' "$spec" && echo chapter-1; grep -o 'chapter-[0-9][0-9]*' "$spec") | sort -u)
    if ! make --no-print-directory -j2 BACKEND=cpu $progs > "$TEST_TMPDIR/grade_build" 2>&1; then
        built=0
        echo "FAIL the build: $(grep -E 'error' "$TEST_TMPDIR/grade_build" | head -5)"
    fi
fi
. "$spec"
score=0 total=0
for k in "${order[@]}"; do
    [ -n "$only" ] && [ "$only" != "$k" ] && continue
    got=0
    [ "${ok[$k]}" = 1 ] && got=${points[$k]}
    score=$((score + got)) total=$((total + points[$k]))
    echo "exercise $k (${title[$k]}): $got / ${points[$k]}"
    [ -z "$result" ] || echo "$k $got ${points[$k]}" >> "$result"
    [ -z "$nonce" ] || echo "grade-result $nonce $k $got ${points[$k]}"
done
echo "grade chapter $chapter: $score / $total"
