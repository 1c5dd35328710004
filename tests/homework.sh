#!/bin/bash
# Homework mode (tests/homework/, docs/teaching.md): the exercise markers are
# well formed; the full tree scores every exercise of chapters 1-4; a fresh
# student tree builds under -Werror and scores zero; every buggy variant of
# tests/homework/bugs/ loses its exercise's points.
. "$(dirname "$0")/lib.sh"

echo "== homework: markers"
out=$(python3 tests/homework/cut.py check 2>&1)
if [ $? = 0 ]; then
    pass "homework: exercise markers numbered 1..k, closed, unique, 3-6 a chapter ($(echo "$out" | tr '\n' ';' | sed 's/;$//'))"
else
    fail "homework: exercise markers" "$out"
fi
# the checker itself catches a region left open, a repeated number and a gap
hw_tmp=$TEST_TMPDIR/homework_markers
rm -rf "$hw_tmp"
mkdir -p "$hw_tmp/tests/homework" "$hw_tmp/01_x"
cp tests/homework/cut.py "$hw_tmp/tests/homework/"
echo 'int main(void) { return 0; }' > "$hw_tmp/01_x/main.c"
hw_marker_case() {  # NAME PHRASE FILE-TEXT
    printf '%b' "$3" > "$hw_tmp/01_x/ex.c"
    local o
    o=$(python3 "$hw_tmp/tests/homework/cut.py" check 1 2>&1)
    if [ $? != 0 ] && echo "$o" | grep -qF -- "$2"; then
        pass "homework: the marker check finds $1 ('$2')"
    else
        fail "homework: the marker check misses $1" "want '$2'; got: $o"
    fi
}
hw_ok='// EXERCISE 1: a\n// END EXERCISE 1\n// EXERCISE 2: b\n// END EXERCISE 2\n'
hw_marker_case "a region never closed" "EXERCISE 3 is never closed" "$hw_ok// EXERCISE 3: c\n"
hw_marker_case "a number used twice" "EXERCISE 2 is marked 2 times" "$hw_ok// EXERCISE 3: c\n// END EXERCISE 3\n// EXERCISE 2: d\n// END EXERCISE 2\n"
hw_marker_case "a gap in the numbers" "not 1..4" "$hw_ok// EXERCISE 4: c\n// END EXERCISE 4\n"
hw_marker_case "nested regions" "regions do not nest" "// EXERCISE 1: a\n// EXERCISE 2: b\n// END EXERCISE 2\n// END EXERCISE 1\n"

# grade_line OUTPUT -> "S T" of its last line "grade chapter N: S / T"
hw_score() { echo "$1" | tail -1 | sed -n 's/^grade chapter [0-9]*: \([0-9]*\) \/ \([0-9]*\)$/\1 \2/p'; }

echo "== homework: the full tree scores every exercise"
for ch in 1 2 3 4; do
    out=$(GRADE_NO_BUILD=1 bash tests/homework/grade.sh $ch 2>&1)
    read -r s t <<< "$(hw_score "$out")"
    if [ -n "${t:-}" ] && [ "$s" = "$t" ] && [ "$t" -gt 0 ]; then
        pass "homework: make grade CHAPTER=$ch on the full tree: $s / $t ($(echo "$out" | grep -c '^PASS') checks)"
    else
        fail "homework: make grade CHAPTER=$ch on the full tree" "$(echo "$out" | grep -E '^(FAIL|  )|^grade' | head -6)"
    fi
done

echo "== homework: a fresh student tree builds and scores zero"
# build/ is copied along, so only the stubbed files recompile (cut.py keeps
# the time stamps of the files it copies)
for ch in 1 2 3 4; do
    st=$TEST_TMPDIR/student_$ch
    rm -rf "$st"
    out=$(python3 tests/homework/cut.py student $ch "$st" 2>&1)
    if [ $? != 0 ] || [ ! -f "$st/HOMEWORK.md" ]; then
        fail "homework: make homework CHAPTER=$ch" "$out"
        continue
    fi
    cp -a "$BUILD" "$st/build"
    out=$(cd "$st" && bash tests/homework/grade.sh $ch 2>&1)
    read -r s t <<< "$(hw_score "$out")"
    n_ex=$(python3 tests/homework/cut.py list $ch | wc -l)
    if [ -n "${t:-}" ] && [ "$s" = 0 ] && [ "$t" -gt 0 ] && ! echo "$out" | grep -q '^FAIL the build' &&
        grep -q 'exercise_not_done' "$st"/0${ch}_*/*.c &&
        [ "$(echo "$out" | grep -c '^FAIL exercise')" = "$n_ex" ]; then
        pass "homework: the student tree of chapter $ch builds with -Werror and scores $s / $t (all $n_ex exercises fail)"
    else
        fail "homework: the student tree of chapter $ch" "$(echo "$out" | grep -E '^(FAIL|PASS)|^grade' | head -8)"
    fi
    if grep -q "make grade CHAPTER=$ch" "$st/HOMEWORK.md" && [ ! -e "$st/tests/homework/bugs" ] && [ ! -e "$st/docs/answers.md" ]; then
        pass "homework: the student tree of chapter $ch has HOMEWORK.md and no answers (docs/answers.md, tests/homework/bugs/)"
    else
        fail "homework: the student tree of chapter $ch" "HOMEWORK.md missing or the instructor's files were copied"
    fi
done
# a stub stops a run with one clear message and a non-zero exit on every rank
mpi_run --may-fail $T_SHORT 2 "$TEST_TMPDIR/student_1/build/chapter-1" --check --op broadcast
if [ $RC != 0 ] && ! timed_out && [ "$(echo "$OUT" | grep -c '^error: exercise 1 of chapter 1 is not done')" = 1 ]; then
    pass "homework: a stub stops the run: exit $RC, one line 'error: exercise 1 of chapter 1 is not done'"
else
    fail "homework: a stub's run" "exit $RC; $(echo "$OUT" | head -4)"
fi

echo "== homework: every buggy variant loses its exercise's points"
# one copy of the full tree (its build included); each variant is applied to
# one file, graded on its exercise alone, and the file put back
bt=$TEST_TMPDIR/homework_bugs
rm -rf "$bt"
mkdir -p "$bt"
python3 - "$bt" <<'EOF'
import os, shutil, subprocess, sys
files = subprocess.run(["git", "ls-files", "-z"], capture_output=True).stdout.decode().split("\0")
if not any(files):
    files = [os.path.relpath(os.path.join(d, n)) for d, s, ns in os.walk(".") if not d.startswith(("./build", "./.git")) for n in ns]
for f in filter(None, files):
    if os.path.isfile(f):
        os.makedirs(os.path.join(sys.argv[1], os.path.dirname(f)), exist_ok=True)
        shutil.copy2(f, os.path.join(sys.argv[1], f))
EOF
cp -a "$BUILD" "$bt/build"
for v in tests/homework/bugs/*.sed; do
    name=$(basename "$v" .sed)
    ch=$(echo "$name" | sed 's/^chapter_\([0-9]*\)_ex.*/\1/')
    ex=$(echo "$name" | sed 's/^chapter_[0-9]*_ex\([0-9]*\)_.*/\1/')
    file=$(sed -n 's/^# file: //p' "$v")
    cp -p "$bt/$file" "$bt/$file.orig"
    sed -f "$v" "$bt/$file.orig" > "$bt/$file"
    if cmp -s "$bt/$file" "$bt/$file.orig"; then
        fail "homework: variant $name" "the sed script no longer changes $file (the code moved): update it"
        mv "$bt/$file.orig" "$bt/$file"
        continue
    fi
    out=$(cd "$bt" && EXERCISE=$ex bash tests/homework/grade.sh $ch 2>&1)
    read -r s t <<< "$(hw_score "$out")"
    if [ -n "${t:-}" ] && [ "$s" = 0 ] && [ "$t" -gt 0 ] && ! echo "$out" | grep -q '^FAIL the build'; then
        pass "homework: variant $name ($(sed -n '2p' "$v" | sed 's/^# //')...) scores $s / $t on exercise $ex: $(echo "$out" | grep '^FAIL' | head -1 | cut -c1-110)"
    else
        fail "homework: variant $name keeps exercise $ex's points" "$(echo "$out" | grep -E '^(FAIL|PASS)|^grade' | head -5)"
    fi
    mv "$bt/$file.orig" "$bt/$file"
    touch "$bt/$file"  # newer than the buggy object: the next build takes it back
done
rm -rf "$bt" "$TEST_TMPDIR"/student_*

finish
