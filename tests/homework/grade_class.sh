#!/bin/bash
# tests/homework/grade_class.sh N DIR [CSV]: `make grade-class CHAPTER=N
# SUBMISSIONS=DIR [CSV=file]`, in the full (instructor's) tree. DIR holds one
# student tree per folder (a `make homework` tree with the student's code);
# each is graded by grade.sh's SUBMISSION mode, every exercise on its own
# (the student's region in a copy of this tree, the other exercises this
# tree's solutions), so a region that fails to build or hangs (each run has
# its time limit) scores 0 for that exercise alone and the other folders go on.
# Prints one line per folder, name, points per exercise and total, and
# writes the same as CSV (default build/grade-class-N.csv).
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
csv=${3:-build/grade-class-$chapter.csv}
exs=$(sed -n 's/^exercise \([0-9]*\) .*/\1/p' "$spec")
head="name$(for k in $exs; do printf ',ex%s/%s' "$k" "$(sed -n "s/^exercise $k \([0-9]*\) .*/\1/p" "$spec")"; done),total"
mkdir -p "$(dirname "$csv")"
echo "$head" > "$csv.tmp"
echo "$head" | tr ',' '\t'
n=0
for sub in "$dir"/*/; do
    [ -d "$sub" ] || continue
    name=$(basename "$sub")
    log=build/grade-class-$chapter-$name.log
    SUBMISSION=$sub bash tests/homework/grade.sh "$chapter" > "$log" 2>&1 < /dev/null
    row=$name sum=0
    for k in $exs; do
        got=$(sed -n "s/^exercise $k\( (.*)\)\{0,1\}: \([0-9]*\) \/ [0-9]*$/\2/p" "$log" | tail -1)
        row="$row,${got:-0}" sum=$((sum + ${got:-0}))
    done
    echo "$row,$sum" >> "$csv.tmp"
    echo "$row,$sum" | tr ',' '\t'
    n=$((n + 1))
done
mv "$csv.tmp" "$csv"
echo "graded $n submissions of chapter $chapter: $csv (each folder's checks in build/grade-class-$chapter-NAME.log)"
