#!/bin/bash
# Homework mode (tests/homework/, docs/teaching.md) for every chapter with a
# tests/homework/chapter_N.grade: the exercise markers are well formed; the
# full tree scores every exercise; a fresh student tree builds under -Werror,
# scores zero with the stub's error: line under each failed check, shows no
# solution line in its docs and passes docs-check's references and quotes
# (with HOMEWORK_BUGS=all, solved, it earns every point from its own grader);
# the buggy variants of tests/homework/bugs/ lose their exercise's points;
# make grade-class grades each exercise of a submission on its own.
#
# The grading runs as jobs, HOMEWORK_JOBS (default 2, the machine's cores) at
# a time, each in its own scratch folder (the reference run is shared): per
# chapter, the full tree's grade, the student tree (cut, built, graded once)
# and the chapter's variants, applied one by one to one copy of the full tree
# and each graded on its own exercise's checks alone.
#
# Which variants: HOMEWORK_BUGS=all (make homework-check; CI runs make test
# with it) grades every one. By default (make test) each chapter grades its
# first variant by name that does not say "# hangs" in its header: a variant
# whose bug deadlocks (a message sent to the wrong peer is never received)
# loses its points only when the run's time limit kills it, minutes of
# waiting ranks that spin on a loaded machine.
. "$(dirname "$0")/lib.sh"

hw_jobs=${HOMEWORK_JOBS:-2}
hw_bugs=${HOMEWORK_BUGS:-first}
case $hw_bugs in
    first | all) ;;
    *) echo "error: HOMEWORK_BUGS=$hw_bugs: use 'all' (every variant) or 'first' (one a chapter)" >&2; exit 2 ;;
esac
# the chapters with homework: a grading file, in numeric order
hw_chapters=$(ls tests/homework/chapter_*.grade 2>/dev/null | sed 's/.*chapter_\([0-9]*\)\.grade$/\1/' | sort -n)

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
rm -rf "$hw_tmp"
# every variant's sed script still changes its file, whichever of them this
# run grades (by default one a chapter): a variant whose code moved would
# lose nothing and be found only under HOMEWORK_BUGS=all
hw_stale=""
for v in tests/homework/bugs/chapter_*_ex*.sed; do
    [ -e "$v" ] || continue
    f=$(sed -n 's/^# file: //p' "$v")
    if [ ! -f "$f" ] || sed -f "$v" "$f" | cmp -s - "$f"; then hw_stale="$hw_stale $(basename "$v") ($f)"; fi
done
if [ -z "$hw_stale" ]; then
    pass "homework: every variant in tests/homework/bugs/ still changes its file ($(ls tests/homework/bugs/*.sed | wc -l) sed scripts)"
else
    fail "homework: variants whose sed script no longer changes its file (the code moved: update them)" "$hw_stale"
fi
# the comparison under a failed invariant check (tests/compare_losses.sh)
# says where a run first leaves the reference, both figures side by side
# (step 0's loss right and its norm wrong: the bug is in backward), and how
# many steps a run that stopped logged
hw_tmp=$TEST_TMPDIR/homework_compare
mkdir -p "$hw_tmp"
printf '{"type":"step","step":0,"loss":5.551928,"norm":2.4706}\n{"type":"step","step":1,"loss":5.343512,"norm":2.2411}\n' > "$hw_tmp/ref"
printf '{"type":"step","step":0,"loss":5.551928,"norm":2.4093}\n{"type":"step","step":1,"loss":5.340882,"norm":2.1837}\n' > "$hw_tmp/bad"
head -1 "$hw_tmp/ref" > "$hw_tmp/short"
hw_cmp_case() {  # NAME WANT-RC PHRASE ARGS...
    local name=$1 want=$2 phrase=$3 o rc
    shift 3
    o=$(bash tests/compare_losses.sh "$@" 2>&1)
    rc=$?
    if [ $rc = "$want" ] && [[ "$o" == *"$phrase"* ]]; then
        pass "homework: a comparison message: $name ('$o')"
    else
        fail "homework: a comparison message: $name" "exit $rc, want $want; want '$phrase'; got '$o'"
    fi
}
hw_cmp_case "the same run" 0 "2 steps, max |dnorm| 0.00e+00" "$hw_tmp/ref" "$hw_tmp/ref" 1e-5 norm
hw_cmp_case "the first norm off, both figures" 1 "(first over 1e-5 at step 0: 2.4093, the reference 2.4706)" \
    "$hw_tmp/ref" "$hw_tmp/bad" 1e-5 norm
hw_cmp_case "the first loss off, both figures" 1 "(first over 3e-5 at step 1: 5.340882, the reference 5.343512)" \
    "$hw_tmp/ref" "$hw_tmp/bad" 3e-5
hw_cmp_case "a run that stopped" 1 "(the run logged 1 of the reference's 2 steps)" "$hw_tmp/ref" "$hw_tmp/short" 3e-5
rm -rf "$hw_tmp"
if [ -z "$hw_chapters" ]; then
    fail "homework: the chapters with homework" "no tests/homework/chapter_N.grade"
fi

# grade_line OUTPUT -> "S T" of its last line "grade chapter N: S / T"
hw_score() { echo "$1" | tail -1 | sed -n 's/^grade chapter [0-9]*: \([0-9]*\) \/ \([0-9]*\)$/\1 \2/p'; }

# ---------------------------------------------------------------- the jobs
# Each prints its own PASS/FAIL lines; the parent counts them in order.

# hw_full N: the full tree (its programs already built) scores every exercise
hw_full() {
    local ch=$1 out s t
    out=$(GRADE_NO_BUILD=1 bash tests/homework/grade.sh "$ch" 2>&1)
    read -r s t <<< "$(hw_score "$out")"
    if [ -n "${t:-}" ] && [ "$s" = "$t" ] && [ "$t" -gt 0 ]; then
        pass "homework: make grade CHAPTER=$ch on the full tree: $s / $t ($(echo "$out" | grep -c '^PASS') checks)"
    else
        fail "homework: make grade CHAPTER=$ch on the full tree" "$(echo "$out" | grep -E '^(FAIL|  )|^grade' | head -6)"
    fi
}

# hw_student N: a fresh student tree builds under -Werror (its CPU build is copied
# along, so only the stubbed files recompile: cut.py keeps the time stamps of
# the files it copies), every exercise scores zero, the instructor's files
# stay out; in chapter 1's, a stub stops a run with one clear message
hw_student() {
    local ch=$1 st=$TEST_TMPDIR/student out s t n_ex
    # A stub ends its run with MPI_Abort after rank 0's message (the other
    # ranks sleep 2 s first): mpirun need not wait 2 s more to stop them
    # (error_case, tests/lib.sh); none of them prints before it does.
    local -x OMPI_MCA_odls_base_sigkill_timeout=0
    rm -rf "$st"
    out=$(python3 tests/homework/cut.py student "$ch" "$st" 2>&1)
    if [ $? != 0 ] || [ ! -f "$st/HOMEWORK.md" ]; then
        fail "homework: make homework CHAPTER=$ch" "$out"
        return
    fi
    cpu_build_copy "$BUILD" "$st/build"
    out=$(cd "$st" && BUILD=build bash tests/homework/grade.sh "$ch" 2>&1)  # its own build, stubs and all
    read -r s t <<< "$(hw_score "$out")"
    n_ex=$(python3 tests/homework/cut.py list "$ch" | wc -l)
    if [ -n "${t:-}" ] && [ "$s" = 0 ] && [ "$t" -gt 0 ] && ! echo "$out" | grep -q '^FAIL the build' &&
        grep -q 'exercise_not_done' "$st/$(printf %02d "$ch")"_*/*.c &&
        [ "$(echo "$out" | grep -c '^FAIL exercise')" = "$n_ex" ]; then
        pass "homework: the student tree of chapter $ch builds with -Werror and scores $s / $t (all $n_ex exercises fail)"
    else
        fail "homework: the student tree of chapter $ch" "$(echo "$out" | grep -E '^(FAIL|PASS)|^grade' | head -8)"
    fi
    # the messages: under a failed check, the program's own error: line
    # first and whole (the stub's), and no "hang" for a run that exited 3
    if echo "$out" | grep -A1 '^FAIL exercise' | grep -q "^  error: exercise [0-9]* of chapter $ch is not done (rank [0-9]* reached its stub; see HOMEWORK.md)$" &&
        ! echo "$out" | grep -qiw 'hang'; then
        pass "homework: the student tree of chapter $ch: a failed check shows the program's error: line first and whole, no 'hang' for exit 3"
    else
        fail "homework: the student tree of chapter $ch's messages" "$(echo "$out" | grep -A2 '^FAIL exercise' | head -4)"
    fi
    if grep -q "make grade CHAPTER=$ch" "$st/HOMEWORK.md" && [ ! -e "$st/tests/homework/bugs" ] &&
        [ "$(grep -cv '^#\|^$' "$st/docs/answers.md")" = 1 ]; then
        pass "homework: the student tree of chapter $ch has HOMEWORK.md and no answers (docs/answers.md's headings only, no tests/homework/bugs/)"
    else
        fail "homework: the student tree of chapter $ch" "HOMEWORK.md missing or the instructor's files were copied"
    fi
    # nor the instructor's sections of the other docs (docs/teaching.md's
    # table of wrong answers, each named by its variant, cut.py's
    # INSTRUCTOR_SECTIONS): no Markdown file of the tree names a variant
    local named="" v
    for v in tests/homework/bugs/*.sed; do
        grep -rlF --include='*.md' "$(basename "$v" .sed)" "$st" > /dev/null && named="$named $(basename "$v" .sed)"
    done
    # and not where the tree still shows an answer (its section names the code)
    grep -qF "hand_alltoallv_pairwise" "$st/docs/teaching.md" && named="$named (where the tree shows an answer)"
    if [ -z "$named" ] && grep -q "^## Wrong answers tried" "$st/docs/teaching.md" &&
        grep -q "^## What a student tree still shows" "$st/docs/teaching.md"; then
        pass "homework: the student tree of chapter $ch keeps docs/teaching.md's headings, not its wrong answers (no doc names one of $(ls tests/homework/bugs/*.sed | wc -l) variants) nor where the tree still shows one"
    else
        fail "homework: the student tree of chapter $ch names wrong answers" "${named:-docs/teaching.md lost its headings}"
    fi
    # one tree a week: the later chapters' exercises are stubs too (a tree
    # of week N holds no answer of week N+1), and so is every marked copy of
    # one (the capstone's main.c sums chapter 7's gradient groups as exercise 4 does)
    local later=() c
    for c in $hw_chapters; do [ "$c" -gt "$ch" ] && later+=("$c"); done
    local missing=""
    for c in "${later[@]+"${later[@]}"}"; do
        grep -q "exercise_not_done($c, " "$st/$(printf %02d "$c")"_*/*.c || missing="$missing $c"
    done
    if [ -n "$missing" ]; then
        fail "homework: the student tree of chapter $ch stubs the later chapters" "no stub in chapter(s)$missing"
    else
        pass "homework: the student tree of chapter $ch stubs the later chapters too (${later[*]:-none})"
    fi
    # no solution of a stubbed exercise anywhere in the tree (cut.py leaks:
    # every file, code, docs, tests and scripts, for runs of its lines; the
    # Markdown files for any of its lines); the docs' references and quotes
    # hold there (the figures are the full tree's docs-check)
    out=$(python3 tests/homework/cut.py leaks "$ch" "$st" 2>&1)
    if [ $? = 0 ]; then
        pass "homework: the student tree of chapter $ch shows no stubbed exercise's solution ($out)"
    else
        fail "homework: the student tree of chapter $ch shows solution lines" "$(echo "$out" | head -4)"
    fi
    out=$(python3 tests/docs_check.py --root "$st" --no-figures 2>&1)
    if [ $? = 0 ]; then
        pass "homework: docs-check --no-figures holds in the student tree of chapter $ch ($(echo "$out" | tail -1 | cut -d';' -f1 | sed 's/^docs-check: //'))"
    else
        fail "homework: docs-check in the student tree of chapter $ch" "$(echo "$out" | grep -A2 '^FAIL' | head -4)"
    fi
    if [ "$ch" = 1 ]; then
        mpi_run --may-fail $T_SHORT 2 "$st/build/chapter-1" --check --op broadcast
        if [ $RC != 0 ] && ! timed_out && [ "$(echo "$OUT" | grep -c '^error: exercise 1 of chapter 1 is not done')" = 1 ]; then
            pass "homework: a stub stops the run: exit $RC, one line 'error: exercise 1 of chapter 1 is not done'"
        else
            fail "homework: a stub's run" "exit $RC; $(echo "$OUT" | head -4)"
        fi
    fi
    # solved, the tree earns every point from its own grader: the chapter's
    # exercise files back from the full tree, the later chapters still stubs
    # (chapter 1's grader trained chapter 2 overlapped, a stub of chapter 1's
    # tree: a solved tree scored 12 / 15). A full grading more: with all only
    if [ "$hw_bugs" = all ]; then
        local f
        for f in $(grep -l "// EXERCISE [0-9]" "$(printf %02d "$ch")"_*/*.[ch]); do cp "$f" "$st/$f"; done
        out=$(cd "$st" && BUILD=build bash tests/homework/grade.sh "$ch" 2>&1)
        read -r s t <<< "$(hw_score "$out")"
        if [ -n "${t:-}" ] && [ "$t" -gt 0 ] && [ "$s" = "$t" ]; then
            pass "homework: the student tree of chapter $ch, solved, earns $s / $t from its own grader"
        else
            fail "homework: the student tree of chapter $ch, solved" "$(echo "$out" | grep -E '^FAIL|^  |^grade' | head -6)"
        fi
    fi
    rm -rf "$st"
}

# hw_variants N: the chapter's variants (HOMEWORK_BUGS) in one copy of the
# full tree, its build included; each is applied to its file, graded on its
# exercise alone, and the file put back
hw_variants() {
    local ch=$1 bt=$TEST_TMPDIR/tree v name ex file out s t lim
    local -a chosen=()
    for v in tests/homework/bugs/chapter_${ch}_ex*.sed; do
        [ -e "$v" ] || continue
        if [ "$hw_bugs" = first ]; then
            grep -q '^# hangs' "$v" && continue
            chosen=("$v")
            break
        fi
        chosen+=("$v")
    done
    if [ ${#chosen[@]} = 0 ]; then
        skip "homework: the variants of chapter $ch" "none in tests/homework/bugs/ (HOMEWORK_BUGS=$hw_bugs)"
        return
    fi
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
    cpu_build_copy "$BUILD" "$bt/build"
    for v in "${chosen[@]}"; do
        name=$(basename "$v" .sed)
        ex=$(echo "$name" | sed 's/^chapter_[0-9]*_ex\([0-9]*\)_.*/\1/')
        file=$(sed -n 's/^# file: //p' "$v")
        cp -p "$bt/$file" "$bt/$file.orig"
        sed -f "$v" "$bt/$file.orig" > "$bt/$file"
        if cmp -s "$bt/$file" "$bt/$file.orig"; then
            fail "homework: variant $name" "the sed script no longer changes $file (the code moved): update it"
            mv "$bt/$file.orig" "$bt/$file"
            continue
        fi
        # a variant that hangs fails at the time limit: 10 s, not T_RUN's
        # 120: its checks are chapter 1's --check runs on 3 to 6 ranks, which
        # took at most 2.3 s each at load average 25 on 2 cores (2026-11-29),
        # so a run still going at 10 s is the hang (30 s before: a minute of
        # waiting in HOMEWORK_BUGS=all for the two variants that hang)
        lim=
        grep -q '^# hangs' "$v" && lim=10
        # BUILD=build: the copy's own build dir, even when BUILD is set for
        # the suite (make's `BUILD ?=` and lib.sh would take it): a buggy
        # program must never overwrite the tree's own
        out=$(cd "$bt" && env BUILD=build ${lim:+T_RUN=$lim} EXERCISE=$ex bash tests/homework/grade.sh "$ch" 2>&1)
        read -r s t <<< "$(hw_score "$out")"
        # a variant that crashes: the grader says which signal, in which
        # exercise, without MPI's banner or a tool's complaint about a log
        # the run never wrote
        local crash
        crash=$(sed -n 's/^# crashes: //p' "$v")
        if [ -n "$crash" ] && { ! echo "$out" | grep -qF -- "$crash" ||
            echo "$out" | grep -qE '\*\*\* End of error message|^grep: |No such file'; }; then
            fail "homework: variant $name's crash report" "want '$crash', no MPI banner, no grep error; got: $(echo "$out" | grep -A3 '^FAIL' | head -4 | cut -c1-200)"
        fi
        # docs/teaching.md's table names the variant and the check that fails first
        local want
        want=$(grep -F "(\`$name\`) |" docs/teaching.md | sed 's/.*(`[a-z0-9_]*`) | \(.*\) |$/\1/')
        if [ -z "$want" ] || [ "$(echo "$out" | grep '^FAIL exercise' | head -1)" != "FAIL exercise $ex: $want" ]; then
            fail "homework: variant $name in docs/teaching.md's table of wrong answers" \
                "the table's first check '${want:-(no row)}', the grader's: $(echo "$out" | grep '^FAIL exercise' | head -1)"
        fi
        if [ -n "${t:-}" ] && [ "$s" = 0 ] && [ "$t" -gt 0 ] && ! echo "$out" | grep -q '^FAIL the build'; then
            pass "homework: variant $name ($(sed -n '2p' "$v" | sed 's/^# //')...) scores $s / $t on exercise $ex: $(echo "$out" | grep '^FAIL' | head -1 | cut -c1-110)"
        else
            fail "homework: variant $name keeps exercise $ex's points" "$(echo "$out" | grep -E '^(FAIL|PASS)|^grade' | head -5)"
        fi
        mv "$bt/$file.orig" "$bt/$file"
        touch "$bt/$file"  # newer than the buggy object: the next build takes it back
    done
    rm -rf "$bt"
}

# hw_class: make grade-class on chapter 7 (every step runs all four
# exercises, so a student's own tree earns nothing until all are done) with
# two submissions: exercise 1 right and 2-4 stubs earns exercise 1's points
# (the others come from this tree); exercise 1 with the P_e-for-f_e gradient
# and a region 2 that does not compile scores 0 for each, and the class goes on
hw_class() {
    local cl=$TEST_TMPDIR/class out csv
    rm -rf "$cl"
    mkdir -p "$cl"
    python3 tests/homework/cut.py student 7 "$cl/ada" > /dev/null &&
        python3 tests/homework/cut.py student 7 "$cl/bob" > /dev/null &&
        python3 tests/homework/cut.py splice 7 1 . "$cl/ada" > /dev/null &&
        python3 tests/homework/cut.py splice 7 1 . "$cl/bob" > /dev/null &&
        sed -i -f tests/homework/bugs/chapter_7_ex1_p_for_f.sed "$cl/bob/07_expert/moe_layer.c" &&
        sed -i 's|^\(    // EXERCISE 2: .*\)$|\1\n    this does not compile;|' "$cl/bob/07_expert/moe_layer.c" &&
        python3 tests/homework/cut.py student 7 "$cl/cyd" > /dev/null &&
        python3 tests/homework/cut.py splice 7 1 . "$cl/cyd" > /dev/null &&
        sed -i 's|^\(    // EXERCISE 4: .*\)$|\1\n    { extern unsigned int sleep(unsigned int); for (;;) sleep(1); }|' "$cl/cyd/07_expert/main.c" &&
        mkdir -p "$cl/dee" && echo "not unpacked" > "$cl/dee/dee.zip" || {
        fail "homework: grade-class" "could not make the submissions"
        return
    }
    csv=$TEST_TMPDIR/class.csv
    # cyd's exercise 4 never returns: its run ends at the time limit (15 s
    # here, T_RUN), its exercise scores 0, exercise 1 keeps its points. It
    # sleeps rather than spins: a spinning loop kept both ranks on both
    # cores until the limit (hw_class took 53.5 s of CPU time with it, 20.7
    # s sleeping: perf stat -e task-clock, which counts the killed ranks
    # that the shell's `times` misses), for the same verdict. The
    # limit holds for every run of the three: chapter 7's 6-step runs on 1
    # to 4 ranks, which took at most 3.6 s here and 8.8 s as a variant's
    # check at load average 25 on 2 cores (2026-11-29), so 15 s still tells
    # a hang from a slow run (20 s before)
    out=$(T_RUN=15 bash tests/homework/grade_class.sh 7 "$cl" "$csv" 2>&1)
    # the CSV: quoted names and notes; bob's note says why he scores 0, with
    # the compiler's message at his own file and line (the line after his
    # exercise 2 marker), not the grader's spliced copy's
    local bob_line
    bob_line=$(grep -n 'this does not compile' "$cl/bob/07_expert/moe_layer.c" | cut -d: -f1)
    if grep -qx 'name,ex1/3,ex2/3,ex3/4,ex4/3,total,note' "$csv" && grep -qx '"ada",3,0,0,0,3,""' "$csv" &&
        grep -qx '"cyd",3,0,0,0,3,""' "$csv" && grep -q 'a hang' "$TEST_TMPDIR/class-cyd.log" &&
        grep -qx '"dee",0,0,0,0,0,"an archive inside, not a tree: unpack dee.zip"' "$csv" &&
        grep -q "^\"bob\",0,0,0,0,0,\"no build: $cl/bob/07_expert/moe_layer.c:$bob_line:" "$csv" &&
        grep -q 'FAIL the build' "$TEST_TMPDIR/class-bob.log" &&
        grep -q '^FAIL exercise 1: finite differences' "$TEST_TMPDIR/class-bob.log"; then
        pass "homework: make grade-class CHAPTER=7: a correct exercise 1 with 2-4 stubbed earns 3 / 13, the P_e-for-f_e gradient and a region that does not build score 0 each, a region that hangs costs only its exercise, a folder holding a zip is told to unpack it, one line a folder and a CSV"
    else
        fail "homework: make grade-class CHAPTER=7" "$(echo "$out" | tail -4 | tr '\n' ';') csv: $(tr '\n' ';' < "$csv" 2>/dev/null); bob: $(grep -E '^(FAIL|  )' "$TEST_TMPDIR/class-bob.log" | head -4 | tr '\n' ';'); cyd: $(grep -E '^(FAIL|  )' "$TEST_TMPDIR/class-cyd.log" | head -6 | tr '\n' ';')"
    fi
    # a second run given a CSV another is writing stops at once (they mixed
    # their rows, and a section got another's score); the lock held here
    # stands for the first run
    exec 8> "$csv.lock"
    flock 8
    out=$(bash tests/homework/grade_class.sh 7 "$cl" "$csv" 2>&1)
    local rc=$?
    exec 8>&-
    if [ $rc = 2 ] && [ "$out" = "error: another make grade-class is writing $csv now: wait for it to end, or give this one CSV=another file" ]; then
        pass "homework: a second make grade-class on one CSV stops with an error"
    else
        fail "homework: grade-class, one CSV twice" "exit $rc: $out"
    fi
    # run inside a student tree, grade-class refuses (it would grade every
    # region against that tree's stubs: a complete submission scores 0)
    out=$(cd "$cl/ada" && bash tests/homework/grade_class.sh 7 "$cl" "$TEST_TMPDIR/x.csv" 2>&1)
    if [ $? = 2 ] && echo "$out" | grep -q "^error: make grade-class runs in the instructor's full tree"; then
        pass "homework: make grade-class refuses to run in a student tree"
    else
        fail "homework: make grade-class in a student tree" "$out"
    fi
    rm -rf "$cl" "$TEST_TMPDIR"/class-*.log
}

# hw_forged: a submission whose exercise 4 of chapter 1 prints what the
# grader prints (its own score line, a check's verdict, a whole chapter's
# grade) and exits: the instructor's grader scores it 0 / 3, from
# the copy's result file (GRADE_RESULT), and never goes on to grade its own
# tree (a forged score line once broke its arithmetic and it did: 15 / 15)
hw_forged() {
    local st=$TEST_TMPDIR/eve out res=$TEST_TMPDIR/eve.result
    rm -rf "$st"
    python3 tests/homework/cut.py student 1 "$st" > /dev/null &&
        python3 - "$st/01_collectives/collectives.c" <<'PY' || { fail "homework: a forged score" "could not make the submission"; return; }
import re, sys
p = sys.argv[1]
s = open(p).read()
m = re.search(r"(    // EXERCISE 4:[^\n]*\n)(.*?)(    // END EXERCISE 4\n)", s, re.S)
body = ('    (void)send, (void)recv, (void)n;\n'
        '    if (c->rank == 0) printf("FAIL\\nexercise 4 (FAIL): 3 / 3\\n"\n'
        '                             "check alltoall 30 runs (forged): exact\\ngrade chapter 1: 15 / 15\\n");\n'
        '    fflush(stdout);\n'
        '    MPI_Finalize();\n'
        '    exit(1);\n')
open(p, "w").write(s[:m.start(2)] + body + s[m.end(2):])
PY
    out=$(SUBMISSION=$st EXERCISE=4 GRADE_RESULT=$res bash tests/homework/grade.sh 1 2>&1)
    if [ "$(cat "$res" 2>/dev/null)" = "4 0 3" ] && [ "$(echo "$out" | grep -c '^exercise 4 (pairwise all-to-all): 0 / 3$')" = 1 ] &&
        echo "$out" | tail -1 | grep -qx 'grade chapter 1: 0 / 3' && ! echo "$out" | grep -q '^== grading chapter 1$'; then
        pass "homework: a submission that prints the grader's lines (a score, a check's verdict, a grade) scores 0 / 3 on its exercise, and the grader stops there"
    else
        fail "homework: a forged score" "result '$(cat "$res" 2>/dev/null)'; $(echo "$out" | grep -E '^(exercise|grade|==)' | head -6 | tr '\n' ';')"
    fi
    # the graders' bad input: each a clear error and exit 2 (1 for cut.py), no run
    local bad=""
    mkdir -p "$TEST_TMPDIR/noclass" && touch "$TEST_TMPDIR/afile"
    out=$(EXERCISE='.*' bash tests/homework/grade.sh 1 2>&1)
    [ $? = 2 ] && echo "$out" | grep -q '^error: chapter 1 has no exercise \.\*' || bad="$bad EXERCISE='.*': $out;"
    out=$(cd "$st" && SUBMISSION=$st bash tests/homework/grade.sh 1 2>&1)
    [ $? = 2 ] && echo "$out" | grep -q "^error: SUBMISSION= grades in the instructor's full tree" || bad="$bad SUBMISSION in a student tree: $out;"
    out=$(bash tests/homework/grade_class.sh 1 "$TEST_TMPDIR/noclass" "$TEST_TMPDIR/noclass.csv" 2>&1)
    [ $? = 2 ] && echo "$out" | grep -q '^error: SUBMISSIONS=.* holds no folder' && [ ! -e "$TEST_TMPDIR/noclass.csv" ] ||
        bad="$bad an empty SUBMISSIONS: $out;"
    out=$(python3 tests/homework/cut.py student 1 "$TEST_TMPDIR/afile/hw" 2>&1)
    [ $? = 1 ] && echo "$out" | grep -q '^error: DEST=.*afile is a file, not a folder' || bad="$bad DEST through a file: $out;"
    if [ -z "$bad" ]; then
        pass "homework: the graders refuse EXERCISE='.*', SUBMISSION= in a student tree, an empty SUBMISSIONS folder and a DEST through a file, each with one error line"
    else
        fail "homework: the graders' bad input" "$bad"
    fi
    rm -rf "$st"
}

# hw_tamper: a chapter 2 submission whose programs attack the grader instead
# of doing the exercises: exercise 1 writes a score where the copy's grader
# kept its result file (beside its TEST_TMPDIR) and prints a score line,
# exercise 2 rewrites the cached reference log its run is compared with,
# exercise 3 rewrites the copy's grade.sh (which graded exercise 4 next:
# 3 / 3 for an empty exercise 4 before each exercise had a fresh copy),
# exercise 4 appends scores to the result file its ancestors' environment
# names (/proc shows a process's environment as it started: the grader's
# unset does not hide it).
# Every exercise scores 0, and the log says what was changed.
hw_tamper() {
    local st=$TEST_TMPDIR/mallory res=$TEST_TMPDIR/mallory.result out
    rm -rf "$st"
    python3 tests/homework/cut.py student 2 "$st" > /dev/null &&
        python3 - "$st/02_data_parallel/main.c" <<'PY' || { fail "homework: a submission that tampers" "could not make it"; return; }
import re, sys
p = sys.argv[1]
s = open(p).read()
bodies = {
    1: '    (void)dp; (void)m;\n'
       '    const char* t = getenv("TEST_TMPDIR");\n'
       '    char path[4096];\n'
       '    snprintf(path, sizeof path, "%s.result", t ? t : ".");\n'
       '    FILE* f = fopen(path, "w");\n'
       '    if (f) fprintf(f, "1 2 2\\n"), fclose(f);\n'
       '    printf("grade-result 0 1 2 2\\nexercise 1 (naive averaging): 2 / 2\\n");\n',
    2: '        (void)args; (void)step; (void)m; (void)dp;\n'
       '        *norm = 0.0f;\n'
       '        if (system("for f in \\"$TEST_TMPDIR\\"/ref_cache/*.jsonl; do echo >> \\"$f\\"; done")) {}\n',
    3: '    (void)ctx; (void)boundary;\n'
       '    FILE* f = fopen("tests/homework/grade.sh", "w");\n'
       '    if (f) fprintf(f, "echo \\"grade-result 0 4 3 3\\"\\n"), fclose(f);\n',
    4: '    (void)bs;\n'
       '    extern int getppid(void);\n'
       '    for (int pid = getppid(); pid > 1;) {  // up its ancestors, to the grader\n'
       '        char path[64], env[65536];\n'
       '        snprintf(path, sizeof path, "/proc/%d/environ", pid);\n'
       '        FILE* f = fopen(path, "r");\n'
       '        size_t n = f ? fread(env, 1, sizeof env - 1, f) : 0;\n'
       '        if (f) fclose(f);\n'
       '        env[n] = 0;\n'
       '        for (size_t i = 0; i < n; i += strlen(env + i) + 1)\n'
       '            if (!strncmp(env + i, "GRADE_RESULT=", 13)) {\n'
       '                FILE* r = fopen(env + i + 13, "a");\n'
       '                if (r) fputs("1 2 2\\n2 3 3\\n", r), fclose(r);\n'
       '            }\n'
       '        snprintf(path, sizeof path, "/proc/%d/stat", pid);\n'
       '        f = fopen(path, "r");\n'
       '        int up = 0;\n'
       '        if (f && fscanf(f, "%*d %*s %*c %d", &up) != 1) up = 0;\n'
       '        if (f) fclose(f);\n'
       '        pid = up;\n'
       '    }\n',
}
for k, body in bodies.items():
    m = re.search(r"( *// EXERCISE %d:[^\n]*\n)(.*?)( *// END EXERCISE %d\n)" % (k, k), s, re.S)
    s = s[:m.start(2)] + body + s[m.end(2):]
open(p, "w").write(s)
PY
    out=$(SUBMISSION=$st GRADE_RESULT=$res bash tests/homework/grade.sh 2 2>&1)
    if [ "$(tr '\n' ';' < "$res" 2>/dev/null)" = "1 0 2;2 0 3;3 0 4;4 0 3;" ] &&
        echo "$out" | sed -n '/^FAIL exercise 2:/,/^exercise 2 /p' | grep -q "the program changed the reference's log" &&
        echo "$out" | grep -q "^FAIL exercise 3: the programs under test changed the grader's files in their copy: tests/homework/grade.sh" &&
        echo "$out" | tail -1 | grep -qx 'grade chapter 2: 0 / 12'; then
        pass "homework: a submission that writes a score file, rewrites the reference log and rewrites the copy's grader scores 0 / 12, each said"
    else
        fail "homework: a submission that tampers with the grader" "result '$(tr '\n' ';' < "$res" 2>/dev/null)'; $(echo "$out" | grep -E '^(FAIL|exercise|grade)' | cut -c1-160 | head -10 | tr '\n' ';')"
    fi
    rm -rf "$st"
}

# hw_spawn NAME FUNCTION ARGS...: FUNCTION ARGS in the background, in its own
# scratch folder (ref_cache shared), once fewer than hw_jobs jobs run
hw_dir=$TEST_TMPDIR/homework
rm -rf "$hw_dir"
mkdir -p "$hw_dir" "$TEST_TMPDIR/ref_cache"
hw_names=()
hw_spawn() {
    local name=$1
    shift
    while [ "$(jobs -rp | wc -l)" -ge "$hw_jobs" ]; do wait -n; done
    mkdir -p "$hw_dir/$name"
    ln -s "$TEST_TMPDIR/ref_cache" "$hw_dir/$name/ref_cache"
    (TEST_TMPDIR=$hw_dir/$name; "$@") > "$hw_dir/$name.out" 2>&1 < /dev/null &
    hw_names+=("$name")
}
# the longest jobs first: the class (three submissions graded one after
# another, one of them waiting for its time limit: 43 s of wall time, the
# longest job by far; it started last, and ran alone for its last 42 s),
# then the full trees, which run every check
[ -f tests/homework/chapter_7.grade ] && hw_spawn class hw_class
[ -f tests/homework/chapter_1.grade ] && hw_spawn class_forged hw_forged
[ -f tests/homework/chapter_2.grade ] && hw_spawn class_tamper hw_tamper
for ch in $hw_chapters; do hw_spawn "full_$ch" hw_full "$ch"; done
for ch in $hw_chapters; do hw_spawn "student_$ch" hw_student "$ch"; done
for ch in $hw_chapters; do hw_spawn "variants_$ch" hw_variants "$ch"; done
wait

hw_section() {  # TITLE PREFIX: the PASS/FAIL lines of the jobs named PREFIX*
    local name
    echo "== homework: $1"
    for name in "${hw_names[@]}"; do
        case $name in
            "$2"*) count_lines "$(cat "$hw_dir/$name.out")"
                   # a job that printed nothing ended early
                   grep -qE '^(PASS|FAIL|SKIP)' "$hw_dir/$name.out" ||
                       fail "homework: job $name" "printed no check: $(tail -3 "$hw_dir/$name.out")" ;;
        esac
    done
}
hw_section "the full tree scores every exercise" full_
hw_section "a fresh student tree builds and scores zero" student_
hw_section "the buggy variants lose their exercise's points (HOMEWORK_BUGS=$hw_bugs)" variants_
hw_section "a class graded exercise by exercise (make grade-class)" class
rm -rf "$hw_dir"

finish
