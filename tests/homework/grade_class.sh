#!/bin/bash
# tests/homework/grade_class.sh N DIR [CSV]: `make grade-class CHAPTER=N
# SUBMISSIONS=DIR [CSV=file]`, in the full (instructor's) tree. DIR holds one
# student tree per folder (a `make homework` tree with the student's code);
# each is graded by grade.sh's SUBMISSION mode, every exercise on its own
# (the student's region in a copy of this tree, the other exercises this
# tree's solutions), so a region that fails to build or hangs (each run has
# its time limit) scores 0 for that exercise alone and the other folders go on.
# Prints one line per folder, name, points per exercise and total, and
# writes the same as CSV (default build/grade-class-N.csv), each folder's
# checks beside it (the CSV's name less .csv, -NAME.log). One run a CSV at a
# time (a lock beside it): two runs given one CSV mixed their rows and logs.
set -u
chapter=${1:-} dir=${2:-}
cd "$(dirname "$0")/../.."
if ! [[ "$chapter" =~ ^[0-9]+$ ]] || [ -z "$dir" ]; then
    echo "error: give the chapter and the folder: make grade-class CHAPTER=N SUBMISSIONS=DIR" >&2
    exit 2
fi
spec=tests/homework/chapter_$chapter.grade
[ -f "$spec" ] || { echo "error: chapter $chapter has no grading entries ($spec)" >&2; exit 2; }
[ -d "$dir" ] || { echo "error: SUBMISSIONS=$dir is not a folder" >&2; exit 2; }
ls -d "$dir"/*/ > /dev/null 2>&1 || { echo "error: SUBMISSIONS=$dir holds no folder (one student tree per folder)" >&2; exit 2; }
# the instructor's tree only: in a student tree (HOMEWORK.md at the root,
# the exercises stubbed) every region spliced into it would be graded
# against stubs, and a complete submission would score 0
if [ -f HOMEWORK.md ] || [ ! -d tests/homework/bugs ]; then
    echo "error: make grade-class runs in the instructor's full tree (this one is a student tree: HOMEWORK.md, no tests/homework/bugs/)" >&2
    exit 2
fi
# csv_field TEXT: TEXT as one CSV field (RFC 4180): quoted, its quotes doubled
csv_field() { local q=${1//\"/\"\"}; printf '"%s"' "$q"; }
# why_zero SUB LOG: a note for a score of 0, else nothing
why_zero() {
    local sub=$1 log=$2 inner archive
    if [ -z "$(ls -A "$sub" 2>/dev/null)" ]; then
        echo "empty folder"
    elif [ ! -f "$sub/Makefile" ]; then
        inner=$(find "$sub" -mindepth 2 -maxdepth 3 -name Makefile -printf '%h\n' 2>/dev/null | head -1)
        # either kind alone (ls of both patterns fails when one matches nothing)
        archive=$(compgen -G "$sub/*.zip" || compgen -G "$sub/*.tar*")
        if [ -n "$archive" ]; then
            echo "an archive inside, not a tree: unpack $(basename "$(echo "$archive" | head -1)")"
        elif [ -n "$inner" ]; then
            echo "the tree is one level down, in ${inner#$sub}"
        else
            echo "not a student tree (no Makefile)"
        fi
    elif grep -q '^FAIL the build' "$log"; then
        # the compiler's own words from the first line that has them: grade.sh's
        # "FAIL the build: ..." line itself when the build printed no other
        # line with "error" before it (make -j2 prints in no fixed order)
        echo "no build: $(grep -m1 -oE '[^ ]+:[0-9]+:[0-9]+: error.*' "$log" | cut -c1-160)"
    elif grep -q 'markers missing' "$log"; then
        echo "exercise markers missing or changed"
    fi
}
csv=${3:-build/grade-class-$chapter.csv}
logs=${csv%.csv}  # the logs' prefix: build/grade-class-N-NAME.log by default
mkdir -p "$(dirname "$csv")"
exec 9> "$csv.lock"
if ! flock -n 9; then
    echo "error: another make grade-class is writing $csv now: wait for it to end, or give this one CSV=another file" >&2
    exit 2
fi
exs=$(sed -n 's/^exercise \([0-9]*\) .*/\1/p' "$spec")
head="name$(for k in $exs; do printf ',ex%s/%s' "$k" "$(sed -n "s/^exercise $k \([0-9]*\) .*/\1/p" "$spec")"; done),total,note"
echo "$head" > "$csv.tmp"
echo "$head" | tr ',' '\t'
n=0
for sub in "$dir"/*/; do
    [ -d "$sub" ] || continue
    name=$(basename "$sub")
    log=$logs-$name.log
    # the scores from grade.sh's result file, not from the log: the log holds
    # what the student's programs printed too
    res=$logs-$name.result
    rm -f "$res"
    SUBMISSION=$sub GRADE_RESULT=$res bash tests/homework/grade.sh "$chapter" > "$log" 2>&1 < /dev/null
    row=$name sum=0 note=""
    # grade.sh writes one line an exercise, once, at its end: any other line
    # (an exercise twice) was written by something else, and scores nothing
    if [ -f "$res" ] && [ -n "$(awk '{ n[$1]++ } END { for (k in n) if (n[k] > 1) print k }' "$res")" ]; then
        : > "$res"
        note="its result file named an exercise twice (a program wrote to it): nothing counted"
    fi
    for k in $exs; do
        got=$(awk -v k="$k" '$1 == k && $2 ~ /^[0-9]+$/ { g = $2 } END { print g + 0 }' "$res" 2>/dev/null)
        row="$row,${got:-0}" sum=$((sum + ${got:-0}))
    done
    rm -f "$res"
    [ "$sum" = 0 ] && [ -z "$note" ] && note=$(why_zero "$sub" "$log")
    # the CSV quotes the name and the note (a folder named "Doe, Jane")
    echo "$(csv_field "$name")${row#"$name"},$sum,$(csv_field "$note")" >> "$csv.tmp"
    printf '%s\t%s\t%s\t%s\n' "$name" "$(echo "${row#"$name,"}" | tr ',' '\t')" "$sum" "$note"
    n=$((n + 1))
done
mv "$csv.tmp" "$csv"
echo "graded $n submissions of chapter $chapter: $csv (each folder's checks in $logs-NAME.log)"
