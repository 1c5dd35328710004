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
#   GRADE_NO_BUILD=1  use the programs already built (tests/homework.sh)
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
if [ -n "$only" ] && ! grep -q "^exercise $only " "$spec"; then
    echo "error: chapter $chapter has no exercise $only (it has $(sed -n 's/^exercise \([0-9]*\) .*/\1/p' "$spec" | tr '\n' ' '))" >&2
    exit 2
fi

GRADE_FLAGS="--steps 6 --batch 24 --seq 32 --peak-gflops 10"

collective() {
    local op=$1 np
    shift
    for np in "$@"; do
        mpi_run --may-fail $T_RUN "$np" "$BUILD/chapter-1" --check --op "$op"
        if [ $RC -ne 0 ] || ! echo "$OUT" | grep -q '^check summary: .* match' || echo "$OUT" | grep -q 'FAILED'; then
            echo "  chapter-1 --check --op $op on $np ranks: exit $RC; $(echo "$OUT" | grep -E 'error|FAIL' | head -3)"
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
        sed 's/^FAIL /  /' "$TEST_TMPDIR/grade_inv" | head -3 | cut -c1-600
        return 1
    fi
    sum=$(grep '"type":"summary"' "$INV_LOG")
    for ere in "${summaries[@]+"${summaries[@]}"}"; do
        if ! echo "$sum" | grep -qE -- "$ere"; then
            echo "  the summary of $prog on $np ranks ($flags) does not match $ere"
            return 1
        fi
    done
    return 0
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
    if "$@"; then
        echo "PASS exercise $k: $what"
    else
        echo "FAIL exercise $k: $what"
        ok[$k]=0
    fi
}

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
done
echo "grade chapter $chapter: $score / $total"
