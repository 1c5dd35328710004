#!/bin/bash
# The one test runner: `make test` calls it after building everything.
#
#   bash tests/run.sh              everything: unit.sh, chapter_0.sh,
#                                  chapter_1.sh, ... (every tests/chapter_N.sh
#                                  there is, in order), capstone.sh (the
#                                  program of every axis, build/capstone), then
#                                  the topic scripts of TOPICS (comm, checkpoints, ckpt_levels, hardening, watchdog, recompute_trace, docs, plots, homework, gpu)
#   bash tests/run.sh 2            one chapter's script, tests/chapter_2.sh
#                                  (`make test CHAPTER=2`); `capstone`:
#                                  tests/capstone.sh (`make test CHAPTER=capstone`)
#   bash tests/run.sh 0 unit gpu   several: a number N is tests/chapter_N.sh,
#                                  a word W is tests/W.sh
#   bash tests/run.sh portability  what a full run leaves out: other BLAS
#                                  kernels, a build without -march=native,
#                                  one by clang, TCP (`make portability`;
#                                  CI runs it)
#
# Every script sources tests/lib.sh and counts its own checks; this runner
# sums them and ends with the one line "N passed, N failed, N skipped". It
# exits non-zero when a check failed or a script ended without its counts.
# The scripts share one scratch directory, so a run they have in common (the
# reference of the invariant, a saved checkpoint) is made once.
#
# Every MPI run of every script is profiled (tests/lib.sh, mpi_run: wall and
# CPU seconds, ranks, command) into the scratch directory; the runner ends
# with the ten slowest runs, then the summary line. TEST_PROFILE=FILE also
# appends this run's profile lines to FILE.
set -u
cd "$(dirname "$0")/.."
TEST_TMPDIR=$(mktemp -d)
export TEST_TMPDIR
trap 'rm -rf "$TEST_TMPDIR"' EXIT
user_profile=${TEST_PROFILE:-}
TEST_PROFILE=$TEST_TMPDIR/profile.tsv
export TEST_PROFILE
: > "$TEST_PROFILE"

# the scripts that are not a chapter's, in the order a full run takes them
TOPICS="comm checkpoints ckpt_levels hardening watchdog recompute_trace docs plots homework gpu"
TOPICS="$TOPICS optime"  # the per-op timers (docs/performance.md)
TOPICS="$TOPICS shared_flags"  # every shared flag through every training chapter, compared
TOPICS="$TOPICS model_files"  # --model FILE.bin in every chapter on every axis
TOPICS="$TOPICS plan"  # build/plan predicts the peak bytes and communication of a run, exactly
scripts=()
if [ $# -eq 0 ]; then
    scripts+=(tests/unit.sh)
    # chapter scripts by number, so chapter_10 would follow chapter_9
    for f in $(ls tests/chapter_*.sh | sort -t_ -k2 -n); do scripts+=("$f"); done
    # the capstone composes the chapters: it follows them, as a chapter would
    scripts+=(tests/capstone.sh)
    # topic scripts: every program's hardening, the docs, the plots, the GPU
    for t in $TOPICS; do scripts+=("tests/$t.sh"); done
else
    for a in "$@"; do
        case $a in
            [0-9]*) f=tests/chapter_$a.sh ;;
            *) f=tests/$a.sh ;;
        esac
        if [ ! -f "$f" ]; then
            echo "error: no test script $f for '$a'; there are: $(cd tests && ls chapter_*.sh capstone.sh unit.sh; for t in $TOPICS portability; do echo "$t.sh"; done | tr '\n' ' ')" >&2
            exit 2
        fi
        scripts+=("$f")
    done
fi

passed=0
failed=0
skipped=0
# The scripts run TEST_RUN_JOBS (default 2, the cores the course assumes) at
# a time, the longest first, and print in their order, each when it is done.
# Most of them wait more than they compute (MPI start-up, ranks that yield
# their core, the watchdog's timeouts): one after another, the 23 scripts of
# a full run kept 2 cores busy only about half the time (7 min 14 s of wall
# time for 8 min of CPU time). Each runs in a
# scratch directory of its own, so no two share a file; only the reference
# cache (tests/lib.sh, reference: one run per key under the key's lock,
# written under a temporary name and moved in place) is one for all.
run_jobs=${TEST_RUN_JOBS:-2}
# by wall time on a quiet 2-core machine (2026-11-29): homework first, whose
# planted hangs wait at their time limits while the capstone computes beside it
LONGEST_FIRST="homework capstone plan checkpoints docs plots chapter_7"
order=()
for w in $LONGEST_FIRST; do
    for i in "${!scripts[@]}"; do [ "${scripts[$i]}" = "tests/$w.sh" ] && order+=("$i"); done
done
for i in "${!scripts[@]}"; do
    [[ " ${order[*]} " == *" $i "* ]] || order+=("$i")
done
mkdir -p "$TEST_TMPDIR/ref_cache"
# run_script I: script I in $TEST_TMPDIR/sI: its output, exit code, start
# and end (microseconds) and CPU time (the builtin `times` of the subshell
# that waited for it: the script and everything it started)
run_script() {
    local d=$TEST_TMPDIR/s$1
    mkdir -p "$d"
    ln -s "$TEST_TMPDIR/ref_cache" "$d/ref_cache"
    echo "${EPOCHREALTIME/[.,]/}" > "$d/start"
    TEST_TMPDIR=$d TEST_COUNTS=$d/counts bash "${scripts[$1]}" > "$d/out" 2>&1 < /dev/null
    echo $? > "$d/rc"
    times > "$d/times"
    echo "${EPOCHREALTIME/[.,]/}" > "$d/end"
    touch "$d/done"
}
# script_cpu FILE: the CPU seconds (user + sys) of the children in a `times` output
script_cpu() { tail -1 "$1" | awk '{ for (i = 1; i <= 2; i++) { split($i, a, /[ms]/); s += a[1] * 60 + a[2] } } END { printf "%.0f", s }'; }
# A script that mostly waits starts at once, in a slot of its own beside the
# TEST_RUN_JOBS: the watchdog's runs wait for their time-outs (2 s of CPU
# time in 34 s of wall time on a quiet machine, 2026-11-29), which kept a
# core idle for half a minute when it held one of the two slots.
RUN_BESIDE="watchdog"
is_beside() { [[ " $RUN_BESIDE " == *" $(basename "${scripts[$1]}" .sh) "* ]]; }
beside=()  # the pids of those started beside
for i in "${!scripts[@]}"; do
    if is_beside "$i"; then
        run_script "$i" &
        beside+=($!)
    fi
done
# slots_used: the scripts running in the TEST_RUN_JOBS slots
slots_used() {
    local n p
    n=$(jobs -rp | wc -l)
    for p in "${beside[@]+"${beside[@]}"}"; do kill -0 "$p" 2>/dev/null && n=$((n - 1)); done
    echo "$n"
}
started=0 shown=0
while [ $shown -lt ${#scripts[@]} ]; do
    while [ $started -lt ${#scripts[@]} ] && [ "$(slots_used)" -lt "$run_jobs" ]; do
        i=${order[$started]}
        started=$((started + 1))
        if ! is_beside "$i"; then run_script "$i" & fi
    done
    # print every finished script whose turn it is
    while [ $shown -lt ${#scripts[@]} ] && [ -e "$TEST_TMPDIR/s$shown/done" ]; do
        d=$TEST_TMPDIR/s$shown f=${scripts[$shown]}
        cat "$d/out"
        rc=$(cat "$d/rc")
        if [ -s "$d/counts" ]; then
            read -r p q s < "$d/counts"
        else
            # a script that stops early (a syntax error, an exit) fails as a whole
            echo "FAIL $f: ended (exit $rc) before reaching finish; its checks are not counted"
            p=0 q=1 s=0
        fi
        passed=$((passed + p)) failed=$((failed + q)) skipped=$((skipped + s))
        echo "-- $f: $p pass, $q fail, $s skip ($(( ($(cat "$d/end") - $(cat "$d/start") + 500000) / 1000000 )) s, cpu $(script_cpu "$d/times") s)"
        shown=$((shown + 1))
    done
    [ $shown -lt ${#scripts[@]} ] && wait -n
done

# the ten slowest runs by wall time; the scratch directory's path shortened
if [ -s "$TEST_PROFILE" ]; then
    [ -n "$user_profile" ] && cat "$TEST_PROFILE" >> "$user_profile"
    echo
    echo "the 10 slowest of $(wc -l < "$TEST_PROFILE") MPI runs (wall s, cpu s, ranks, script: command; \$T = a script's scratch directory):"
    sort -t$'\t' -k2,2 -rn "$TEST_PROFILE" | head -10 |
        awk -F'\t' -v t="$TEST_TMPDIR" '{ c = $5; while ((i = index(c, t)) > 0) c = substr(c, 1, i - 1) "$T" substr(c, i + length(t))
                                           gsub(/\$T\/s[0-9]+/, "$T", c)
                                           if (length(c) > 160) c = substr(c, 1, 157) "..."
                                           printf "%7.2f %7.2f %3d  %s: %s\n", $2, $3, $4, $1, c }'
fi
echo
echo "$passed passed, $failed failed, $skipped skipped"
[ $failed -eq 0 ]
