#!/bin/bash
# plan_check.sh: the planner against runs (make plan-check; docs/planner.md).
#
# For every run of the committed sweep (docs/plots/data/sweep.txt) in a
# chapter the planner covers (0, 2 to 7), plans it with build/plan --profile
# PROFILE (predicted ms/step and peak bytes), runs it the way the sweep did
# (same flags, --steps 5: the programs time steps 2..5), and prints predicted
# against measured with the error, then the error per chapter. The peak
# bytes are exact counts (the planner's tests/plan.sh checks them equal);
# the time is a model, and its error is what this measures.
#
# Writes OUT (docs/plots/data/plan_check.tsv), the table the plot
# docs/plots/plan_check.gp draws (make plots / make docs-plots).
# Environment: BIN (build), PROFILE (build/profile.txt; measured first by
# common/tools/measure_profile.sh if missing), SWEEP (docs/plots/data/sweep.txt),
# OUT, ONLY (an extended regular expression: only the runs whose name matches),
# RUN (1; RUN=0 runs nothing and takes the measured side from the sweep's own
# files in the data folder: a profile of today against the sweep's day).
set -u
cd "$(dirname "$0")/../.."
BIN=${BIN:-build}
PROFILE=${PROFILE:-build/profile.txt}
SWEEP=${SWEEP:-docs/plots/data/sweep.txt}
OUT=${OUT:-docs/plots/data/plan_check.tsv}
ONLY=${ONLY:-}
RUN=${RUN:-1}
MPIRUN="bash tests/mpirun.sh"
LOGS=build/plan-check
mkdir -p "$LOGS"
[ -f "$SWEEP" ] || { echo "error: $SWEEP is missing (make bench writes it)" >&2; exit 1; }
if [ ! -f "$PROFILE" ]; then
    echo "plan-check: no profile $PROFILE: measuring this machine first (make profile)"
    BIN=$BIN bash common/tools/measure_profile.sh "$PROFILE" || exit 1
fi
"$BIN/plan" --chapter 0 --profile "$PROFILE" > /dev/null || exit 1  # a bad profile stops here, with its error line
load_start=$(cut -d' ' -f1-3 /proc/loadavg)
echo "plan-check: profile $PROFILE ($(sed -n 's/^name = //p' "$PROFILE")), runs of $SWEEP"
echo "plan-check: this machine has $(nproc) cores; load average at start: $load_start"
tmp=$OUT.tmp.$$
printf '# name\tchapter\tranks\tpredicted_ms\tmeasured_ms\terror\tpredicted_peak_bytes\tmeasured_peak_bytes\n' > "$tmp"
printf '%-24s %5s %12s %12s %8s %14s %14s\n' run ranks "predicted ms" "measured ms" error "plan peak B" "run peak B"
n=0
failed=0
# the sweep's lines: "NAME.jsonl  np=N  build/chapter-C FLAGS --peak-gflops X  (S s)",
# or build/capstone (chapter 7's model on every axis: planned as --chapter 7)
while read -r file npf cmd; do
    name=${file%.jsonl}
    case $name in ch[0234567]_*) ;; *) continue ;; esac
    if [ -n "$ONLY" ] && ! [[ "$name" =~ $ONLY ]]; then continue; fi
    np=${npf#np=}
    cmd=${cmd%  (*}
    prog=$(echo "$cmd" | sed 's|^[^ ]*/\([^ /]*\) .*|\1|')
    flags=$(echo "$cmd" | cut -d' ' -f2-)
    # a sweep made before issue 42 ran chapter 7's compositions on chapter-7;
    # build/capstone took those flags over
    if [ "$prog" = chapter-7 ] && [[ " $flags " =~ \ --(tp|cp|cp-mode|cp-balance|pp|schedule|microbatches|virtual|zero)\  ]]; then
        prog=capstone
    fi
    case $prog in
        capstone) ch=7 ;;
        *) ch=${prog#chapter-} ;;
    esac
    # the planner takes the chapter's flags but the run's own (steps, validation, peak)
    plan_flags=$(echo "$flags" | sed 's/--steps [0-9]*//; s/--val-batches [0-9]*//; s/--peak-gflops [0-9.]*//')
    # shellcheck disable=SC2086
    plan=$("$BIN/plan" --chapter "$ch" --ranks "$np" $plan_flags --profile "$PROFILE" --json 2>&1 < /dev/null)
    if [ $? -ne 0 ]; then
        echo "plan-check: $name: the planner failed: $plan" >&2
        failed=$((failed + 1))
        continue
    fi
    log=$LOGS/$name.jsonl
    if [ "$RUN" = 0 ]; then
        log=$(dirname "$SWEEP")/$name.jsonl
    else
        rm -f "$log"
    fi
    # shellcheck disable=SC2086
    if [ "$RUN" != 0 ] && ! timeout 600 $MPIRUN -np "$np" "$BIN/$prog" $flags --log "$log" < /dev/null > "$LOGS/$name.out" 2>&1; then
        echo "plan-check: $name: the run failed (see $LOGS/$name.out)" >&2
        failed=$((failed + 1))
        continue
    fi
    if ! row=$(python3 - "$log" "$plan" 2>"$LOGS/$name.compare" <<'PY'
import json, sys
summ = [json.loads(l) for l in open(sys.argv[1]) if '"type":"summary"' in l][-1]
recs = [json.loads(l) for l in sys.argv[2].splitlines() if l.startswith("{")]
plan = [r for r in recs if r["type"] == "plan"][0]
t = [r for r in recs if r["type"] == "plan_time"][0]
pred, meas = t["ms_per_step"], summ["ms_per_step"]
print(f"{pred:.1f}\t{meas:.1f}\t{(pred - meas) / meas:+.3f}\t{max(plan['peak_bytes']['total'])}\t{max(summ['peak_bytes']['total'])}")
PY
); then  # a log or a plan it cannot read is a failure, never a row (it counted as a match)
        echo "plan-check: $name: cannot compare the plan with $log: $(tail -1 "$LOGS/$name.compare")" >&2
        failed=$((failed + 1))
        continue
    fi
    printf '%s\t%s\t%s\t%s\n' "$name" "$ch" "$np" "$row" >> "$tmp"
    echo "$row" | awk -F'\t' -v n="$name" -v r="$np" '{ printf "%-24s %5d %12.1f %12.1f %+7.1f%% %14d %14d\n", n, r, $1, $2, 100 * $3, $4, $5 }'
    n=$((n + 1))
done < <(sed -n '/^runs:$/,$p' "$SWEEP" | tail -n +2 | grep '\.jsonl ')
load_end=$(cut -d' ' -f1-3 /proc/loadavg)
echo "plan-check: error per chapter (predicted - measured) / measured:"
awk -F'\t' '!/^#/ { c = $2; e = $6 < 0 ? -$6 : $6; s[c] += e; k[c]++; if (e > m[c]) m[c] = e
                    if ($7 != $8) bad[c]++ }
    END { for (c in k) printf "  chapter %s: %d runs, mean |error| %.1f%%, max |error| %.1f%%, peak bytes %s\n",
              c, k[c], 100 * s[c] / k[c], 100 * m[c], bad[c] ? bad[c] " runs differ" : "equal in every run" }' "$tmp" | sort
echo "plan-check: load average at the end: $load_end"
{
    echo "# make plan-check, $(date -u '+%Y-%m-%d %H:%M UTC'), profile $PROFILE; load average at start $load_start, at the end $load_end"
    cat "$tmp"
} > "$OUT"
rm -f "$tmp"
echo "plan-check: $n runs compared, $failed failed; table in $OUT"
[ $failed -eq 0 ]
