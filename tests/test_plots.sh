#!/bin/bash
# test_plots.sh: the plotting pipeline end to end, on a small fixture written by
# the built programs themselves (so a field the programs stop writing, or a
# broken extractor or gnuplot script, fails here). Prints PASS/FAIL/SKIP lines;
# tests/plots.sh counts them. Takes ~10-20 s.
#
#   1. chapter 0 (tiny, 3 steps), chapter 2 (dp 2, tiny, 3 steps), chapter 3 if
#      built (ZeRO-3, dp 2), chapter 1 (--bench up to 1 KiB) log JSONL files;
#   2. every field docs/plots/extract.sh reads (extract.sh --fields) must be in
#      the fixture's records;
#   3. docs/plots/plots.sh runs extract.sh and every gnuplot script on the
#      fixture into a temporary folder; each PNG must exist, be a PNG and not
#      be trivially small;
#   4. the pipeline refuses what it must refuse: a summary without a field, a
#      data folder without data;
#   5. `make plots` draws into build/plots/ and leaves the docs' figures in
#      docs/plots/ as they are (only `make docs-plots` rewrites those).
set -u
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
MPIRUN="bash tests/mpirun.sh"
pass() { echo "PASS $1"; }
fail() { echo "FAIL $1: $2"; }
skip() { echo "SKIP $1: $2"; }

if ! command -v gnuplot >/dev/null 2>&1; then
    skip "plots" "gnuplot not installed"
    echo "END of tests/test_plots.sh"  # skipped whole: nothing ended early
    exit 0
fi
for n in 0 1 2; do
    if [ ! -x "$BUILD/chapter-$n" ]; then
        fail "plots" "$BUILD/chapter-$n is not built (make all)"
        exit 1
    fi
done

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
data=$tmp/data
mkdir -p "$data"

# ---------------------------------------------------------------- 1. the fixture
fixture() {  # name np program args...
    local name=$1 np=$2 out
    shift 2
    if out=$(timeout 60 $MPIRUN -np "$np" "$@" --log "$data/$name.jsonl" 2>&1) && [ -s "$data/$name.jsonl" ]; then
        pass "plots fixture: $name ($np rank(s)) writes its JSONL log"
    else
        fail "plots fixture: $name" "$(echo "$out" | tail -3 | tr '\n' ' ')"
    fi
}
fixture ch0_reference_np1 1 "$BUILD/chapter-0" --steps 3 --val-batches 1 --peak-gflops 10
fixture ch2_overlapped_dp2 2 "$BUILD/chapter-2" --dp 2 --steps 3 --val-batches 1 --peak-gflops 10
if [ -x "$BUILD/chapter-3" ]; then
    fixture ch3_zero3_dp2 2 "$BUILD/chapter-3" --dp 2 --zero 3 --steps 3 --val-batches 1 --peak-gflops 10
fi
fixture ch1_collectives_np2 2 "$BUILD/chapter-1" --bench --min-bytes 8 --max-bytes 1K --iters 3

# ---------------------------------------------------------------- 2. the fields
# "summary FIELD": every summary; "summary:N FIELD": chapter N's summaries
fields=$(bash docs/plots/extract.sh --fields)
if [ -z "$fields" ]; then
    fail "plots fields" "docs/plots/extract.sh --fields lists nothing"
fi
for type in $(echo "$fields" | awk '{ print $1 }' | sort -u); do
    rtype=${type%%:*}
    records=$(cat "$data"/*.jsonl 2>/dev/null | grep "\"type\":\"$rtype\"")
    if [ "$type" != "$rtype" ]; then
        records=$(echo "$records" | grep "\"chapter\":${type#*:},")
        if [ -z "$records" ]; then
            skip "plots fields of $type records" "no chapter-${type#*:} run in the fixture"
            continue
        fi
    fi
    if [ -z "$records" ]; then
        fail "plots fields of $type records" "the fixture has no {\"type\":\"$rtype\"} record"
        continue
    fi
    patterns=$(echo "$fields" | awk -v t="$type" '$1 == t { print $2 }')
    lacking=""
    while read -r pattern; do
        # every record of the type must carry the field
        n_without=$(echo "$records" | grep -vcF -- "$pattern")
        [ "$n_without" = 0 ] || lacking="$lacking $pattern"
    done <<< "$patterns"
    if [ -z "$lacking" ]; then
        pass "plots fields: the programs' $type records carry every field the plots read ($(echo "$patterns" | wc -l))"
    else
        fail "plots fields of $type records" "missing:$lacking"
    fi
done

# ---------------------------------------------------------------- 3. every plot
out=$(GP_VARS="strong_batch=4; weak_per_rank=2" bash docs/plots/plots.sh "$data" "$tmp/tables" "$tmp/png" 2>&1)
rc=$?
if [ $rc = 0 ]; then
    pass "plots: extract.sh and the gnuplot scripts run on the fixture"
else
    why=$(echo "$out" | grep -A4 -E 'FAILED|^plots: [^/]' | head -6 | tr '\n' ' ')
    fail "plots: plots.sh on the fixture" "exit $rc: ${why:-$(echo "$out" | tail -4 | tr '\n' ' ')}"
fi
for t in runs memory comm time scaling collectives_np2; do
    if [ -s "$tmp/tables/$t.dat" ] && grep -qv '^#' "$tmp/tables/$t.dat"; then
        pass "plots: extract.sh writes the $t table"
    else
        fail "plots: the $t table" "$tmp/tables/$t.dat is missing or has no rows"
    fi
done
# each training table has one row per run in the fixture (a silently dropped
# run, or a table of nothing but its header, fails here)
n_runs=$(grep -l '"type":"summary"' "$data"/*.jsonl | wc -l)
for t in runs time comm; do
    rows=$(grep -vc '^#' "$tmp/tables/$t.dat" 2>/dev/null)
    rows=${rows:-0}
    if [ "$rows" = "$n_runs" ]; then
        pass "plots: the $t table has one row per fixture run ($rows)"
    else
        fail "plots: the $t table" "$rows rows for $n_runs runs"
    fi
done
# gnuplot says "all points y value undefined" or "No valid points" when a
# series reads a column that is not there: no script may draw an empty series
if echo "$out" | grep -qiE 'no valid points|all points .* undefined'; then
    fail "plots: every series has points" "$(echo "$out" | grep -iE 'no valid points|all points .* undefined' | head -2 | tr '\n' ' ')"
else
    pass "plots: every series of every plot has points"
fi
# the committed data in docs/plots/data goes through the same pipeline, so a
# field the plots start to need fails here before it fails make plots
if [ -d docs/plots/data ] && ls docs/plots/data/*.jsonl >/dev/null 2>&1; then
    out2=$(bash docs/plots/plots.sh docs/plots/data "$tmp/ctables" "$tmp/cpng" 2>&1)
    if [ $? = 0 ]; then
        pass "plots: the committed docs/plots/data draws every plot"
    else
        fail "plots: the committed docs/plots/data (make bench writes it anew)" "$(echo "$out2" | tail -3 | tr '\n' ' ')"
    fi
fi
# every gnuplot script is drawn by plots.sh
for g in docs/plots/*.gp; do
    if ! grep -q "draw $(basename "$g") " docs/plots/plots.sh; then
        fail "plots: $(basename "$g")" "docs/plots/plots.sh never draws it"
    fi
done
for png in memory_per_rank tokens_per_s comm_bytes_per_step step_time_split collectives_busbw_np2; do
    f=$tmp/png/$png.png
    size=$(stat -c %s "$f" 2>/dev/null || echo 0)
    magic=$(head -c 8 "$f" 2>/dev/null | od -An -tx1 | tr -d ' \n')
    if [ "$magic" != 89504e470d0a1a0a ]; then
        fail "plots: $png.png" "missing or not a PNG (magic '$magic')"
    elif [ "$size" -lt 20000 ]; then
        fail "plots: $png.png" "only $size bytes: an empty plot?"
    else
        pass "plots: $png.png is a PNG of $((size / 1024)) KiB"
    fi
done

# ---------------------------------------------------------------- 4. refusals
bad=$tmp/bad
mkdir -p "$bad"
grep -v '"type":"summary"' "$data/ch0_reference_np1.jsonl" > "$bad/ch0.jsonl"
grep '"type":"summary"' "$data/ch0_reference_np1.jsonl" | sed 's/"tokens_per_s":[0-9.]*,//' >> "$bad/ch0.jsonl"
out=$(bash docs/plots/extract.sh "$bad" "$tmp/badtables" 2>&1)
if [ $? -ne 0 ] && echo "$out" | grep -q 'tokens_per_s'; then
    pass "plots: extract.sh refuses a summary without tokens_per_s and names the field"
else
    fail "plots: extract.sh on a summary without tokens_per_s" "exit 0 or no field named: $out"
fi
mkdir -p "$tmp/empty"
out=$(bash docs/plots/plots.sh "$tmp/empty" "$tmp/t2" "$tmp/p2" 2>&1)
if [ $? -ne 0 ] && echo "$out" | grep -q 'make bench'; then
    pass "plots: plots.sh on a folder without data exits non-zero and points to make bench"
else
    fail "plots: plots.sh without data" "$out"
fi

# ---------------------------------------------------------------- 5. where make plots draws
if [ -d docs/plots/data ] && ls docs/plots/data/*.jsonl >/dev/null 2>&1; then
    # a redraw from the same data gives the same bytes: the test looks at the
    # files' times, not only their contents
    touch "$tmp/before_make_plots"
    before=$(md5sum docs/plots/*.png 2>/dev/null)
    rm -f build/plots/memory_per_rank.png
    out=$(make --no-print-directory plots 2>&1)
    rc=$?
    after=$(md5sum docs/plots/*.png 2>/dev/null)
    [ -z "$(find docs/plots -maxdepth 1 -name '*.png' -newer "$tmp/before_make_plots")" ] || after="$after rewritten"
    if [ $rc = 0 ] && [ -s build/plots/memory_per_rank.png ] && [ "$before" = "$after" ]; then
        pass "plots: make plots draws into build/plots/ and leaves docs/plots/*.png as they are"
    else
        fail "plots: make plots" "exit $rc; build/plots/memory_per_rank.png $([ -s build/plots/memory_per_rank.png ] && echo drawn || echo missing); docs/plots/*.png $([ "$before" = "$after" ] && echo unchanged || echo CHANGED); $(echo "$out" | tail -2 | tr '\n' ' ')"
    fi
    if make -n --no-print-directory docs-plots 2>/dev/null | grep -q 'plots.sh docs/plots/data build/plots docs/plots$' &&
        make -n --no-print-directory plots DOCS=1 2>/dev/null | grep -q 'plots.sh docs/plots/data build/plots docs/plots$'; then
        pass "plots: make docs-plots and make plots DOCS=1 draw into docs/plots/"
    else
        fail "plots: make docs-plots / make plots DOCS=1" "$(make -n --no-print-directory docs-plots 2>&1 | tail -1)"
    fi
fi

# ---------------------------------------------------------------- 6. many runs
# The per-run plots draw one row per run (docs/plots/rows.gpi): the picture
# grows with the runs, so 60 runs stay as readable as 20. The fixture's chapter
# 0 run copied 10 and 30 times per chapter (0 and 7): each added row must add
# height, and every run's label is one line (a multi-line label needs more).
png_height() { od -An -tu1 -j20 -N4 "$1" 2>/dev/null | awk '{ print $1 * 16777216 + $2 * 65536 + $3 * 256 + $4 }'; }
many() {  # copies per chapter, folder
    local n=$1 dir=$2 i
    mkdir -p "$dir"
    cp "$data/ch1_collectives_np2.jsonl" "$dir/"
    for i in $(seq 1 "$n"); do
        cp "$data/ch0_reference_np1.jsonl" "$dir/ch0_copy$i.jsonl"
        sed 's/"chapter":0,/"chapter":7,/' "$data/ch0_reference_np1.jsonl" > "$dir/ch7_copy$i.jsonl"
    done
    bash docs/plots/plots.sh "$dir" "$dir/tables" "$dir/png" > "$dir/out" 2>&1
}
if many 10 "$tmp/few" && many 30 "$tmp/many"; then
    for png in tokens_per_s memory_per_rank comm_bytes_per_step step_time_split; do
        h20=$(png_height "$tmp/few/png/$png.png"); h60=$(png_height "$tmp/many/png/$png.png")
        # 40 more runs: at least 15 pixels each
        if [ -n "$h20" ] && [ -n "$h60" ] && [ "$h60" -ge $((h20 + 40 * 15)) ]; then
            pass "plots: $png.png grows with the runs ($h20 px high for 20, $h60 for 60)"
        else
            fail "plots: $png.png for 60 runs" "${h60:-no} px high against ${h20:-no} for 20: the rows do not grow with the runs"
        fi
    done
    if grep -v '^#' "$tmp/many/tables/runs.dat" | grep -q '\\n'; then
        fail "plots: run labels" "a label in runs.dat has a line break: $(grep -m1 '\\n' "$tmp/many/tables/runs.dat")"
    else
        pass "plots: every run's label is one line ($(grep -vc '^#' "$tmp/many/tables/runs.dat") runs)"
    fi
else
    fail "plots: 20 and 60 runs" "plots.sh failed: $(tail -3 "$tmp/many/out" "$tmp/few/out" 2>/dev/null | tr '\n' ' ')"
fi
# the last line: plots.sh fails a run that ended before it (an error of this script)
echo "END of tests/test_plots.sh"
