#!/bin/bash
# plots.sh: draw the course's plots from the sweep's JSONL files (`make plots`).
# It never runs the sweep: `make bench` (docs/plots/bench.sh) writes the data.
#
#   bash docs/plots/plots.sh [DATA_DIR] [TABLE_DIR] [PNG_DIR]
#        defaults:            docs/plots/data build/plots build/plots
#
# The PNGs go to build/plots/ unless PNG_DIR says otherwise: the tracked
# figures in docs/plots/ change only when asked (`make docs-plots`, or
# `make plots DOCS=1`, which pass docs/plots as PNG_DIR).
#
# 1. docs/plots/extract.sh turns DATA_DIR/*.jsonl into tables in TABLE_DIR;
# 2. gnuplot draws, from those tables, into PNG_DIR:
#      memory_per_rank.png        memory.gp        peak memory per rank by category
#      tokens_per_s.png           throughput.gp    tokens/s per run; strong and weak scaling
#      comm_bytes_per_step.png    comm_bytes.gp    bytes communicated per step per rank
#      step_time_split.png        step_time.gp     ms per step: waiting on communication vs the rest
#      collectives_busbw_npP.png  collectives_busbw.gp   chapter 1: busbw, hand-written vs library
#      pipeline_NAME.png          gantt.gp         chapter 5: per-rank timeline of a step, per run
#      expert_load.png            expert_load.gp   chapter 7: tokens per expert per step (expert_load.sh)
#      ch6_memory.png             ch6_memory.gp    chapter 6: activations per rank against T (ch6_memory.sh)
#      ckpt_levels.png            ckpt_levels.gp   checkpoints: stall and bytes per level and mode (ckpt_levels.sh)
#      plan_check.png             plan_check.gp    build/plan's predicted ms/step and peak bytes against runs
#                                                  (make plan-check writes DATA_DIR/plan_check.tsv)
#    The first four draw one labelled row per run, grouped by chapter, in a
#    picture as tall as the runs need (rows.gpi, which they load).
#
# Every script gets note (the machine and its load) and mixed (empty, or
# which runs sweep.txt says were made at other times, and under what load).
#
# GP_VARS (environment) is passed to every script before its own settings,
# e.g. GP_VARS="strong_batch=4; weak_per_rank=2" for a sweep with other batches.
set -u
cd "$(dirname "$0")/../.."
data=${1:-docs/plots/data}
tables=${2:-build/plots}
pngs=${3:-build/plots}
vars=${GP_VARS:-}
gp=docs/plots

if ! command -v gnuplot >/dev/null 2>&1; then
    echo "plots: gnuplot is not installed (Debian: apt-get install gnuplot-nox, or make setup)" >&2
    exit 1
fi

# ---------------------------------------------------------------- is the data there?
missing() {
    echo "plots: $1" >&2
    echo "plots: \`make bench\` writes the data into docs/plots/data/ (about 10 minutes on 2 cores); then \`make plots\`" >&2
    exit 1
}
[ -d "$data" ] || missing "no data folder $data"
nruns=$(grep -l '"type":"summary"' "$data"/*.jsonl 2>/dev/null | wc -l)
nbench=$(grep -l '"type":"collective"' "$data"/*.jsonl 2>/dev/null | wc -l)
[ "$nruns" -gt 0 ] || missing "no training run summaries ({\"type\":\"summary\"} records) in $data/*.jsonl"
[ "$nbench" -gt 0 ] || missing "no chapter-1 collective bench rows ({\"type\":\"collective\"} records) in $data/*.jsonl"
# the sweep's list of files: every one must be there
if [ -f "$data/sweep.txt" ]; then
    lost=$(sed -n '/^runs:/,$p' "$data/sweep.txt" | awk 'NR > 1 && $1 ~ /\.jsonl$/ { print $1 }' |
        while read -r f; do [ -f "$data/$f" ] || printf ' %s' "$f"; done)
    [ -z "$lost" ] || missing "$data/sweep.txt lists files that are not there:$lost"
fi
note=$(sed -n 's/^note: //p' "$data/sweep.txt" 2>/dev/null | head -1 | tr -d "'\"")
# Runs made again later (ONLY=REGEX make bench) ran under another load.
# sweep.txt's date: line says which runs and when, its load: lines under what
# load; groups holds one line per time, "REGEX<TAB>when<TAB>load average",
# the first one "all" (the whole sweep).
groups=""
if [ -f "$data/sweep.txt" ]; then
    groups=$(tr -d '"' < "$data/sweep.txt" | awk '
        /^load: / { s = substr($0, 7); gsub(/\047/, "", s); g = substr(s, 1, index(s, " ") - 1)
                    load[g] = substr(s, index(s, " UTC: ") + 6) }
        /^date: / && d == "" { d = substr($0, 7) }
        END { if (d == "") exit
              gsub(/\047/, "", d); n = split(d, part, "; ")
              printf "all\t%s\t%s\n", part[1], load["all"]
              for (i = 2; i <= n; i++) {
                  s = part[i]; sub(/^runs matching /, "", s); split(s, w, " again on ")
                  printf "%s\t%s\t%s\n", w[1], w[2], load[w[1]] } }')
fi
# the plots that draw runs of several times say so under their title, with
# each time's load (the 1-minute average at its end, where sweep.txt has it)
mixed=$(printf '%s\n' "$groups" | awk -F'\t' 'NF < 2 { next }
    { split($3, l, " "); ld = (l[1] != "" ? " (load " l[1] ")" : "") }
    NR == 1 { first = $2; firstld = ld; split(first, fd, " "); next }
    { when = $2; if (index(when, fd[1] " ") == 1) { when = substr(when, length(fd[1]) + 2); sub(/ UTC$/, "", when) }
      out = out (NR > 2 ? ", " : "Mixed loads: the runs matching ") $1 (NR > 2 ? " at " : " ran at ") when ld }
    END { if (out != "") print out ", the others at " first firstld ", each under the load of its time: compare times only between runs made together" }')
# the note of the plots that draw runs of one time: that time's load; the
# plots of several times get the machine alone (their mixed line has the loads)
note_of() {  # JSONL file name
    printf '%s\n' "$groups" | awk -F'\t' -v f="$1" -v note="$note" '
        NF >= 2 && (NR == 1 || f ~ $1) { when = $2; load = $3 }
        END { if (load == "") { print note; exit }
              sub(/ \(load average at the end [^)]*\)/, "", note); sub(/: expect noise$/, "", note)
              print note " (load average " load " at the end of the runs of " when "): expect noise" }'
}
if [ -n "$mixed" ]; then
    note=$(printf '%s\n' "$note" | sed 's/ (load average at the end [^)]*)//')
fi

# ---------------------------------------------------------------- tables, then plots
bash "$gp/extract.sh" "$data" "$tables" || exit 1
mkdir -p "$pngs"
failed=0
draw() {  # script, output, extra variables
    local script=$1 out=$2 extra=${3:-} err tmp="$2.tmp.$$.png"
    # draw into a temporary file: a script that fails half-way leaves no PNG
    err=$(gnuplot -e "$vars; dir='$tables'; outfile='$tmp'; note='$note'; mixed='$mixed'; $extra" "$gp/$script" 2>&1)
    if [ $? -eq 0 ] && [ -s "$tmp" ] && mv "$tmp" "$out"; then
        echo "plots: $out"
        # gnuplot's warnings (a series with no valid points, ...) are shown
        echo "$err" | grep -i 'warning' | sed "s|^|plots: $script: |" >&2
    else
        rm -f "$tmp"
        echo "plots: FAILED $script -> $out:" >&2
        echo "$err" | grep -v 'warning: Skipping data file' | tail -5 >&2
        failed=$((failed + 1))
    fi
}
draw memory.gp "$pngs/memory_per_rank.png"
draw throughput.gp "$pngs/tokens_per_s.png"
draw comm_bytes.gp "$pngs/comm_bytes_per_step.png"
draw step_time.gp "$pngs/step_time_split.png"
# one y scale for every rank count, so the plots compare at a glance: the
# highest busbw of the four plotted collectives, or copy bandwidth, of all tables
ymax=$(cat "$tables"/collectives_np*.dat 2>/dev/null | awk '
    $1 == "#" && $2 == "copy_gbps" { if ($3 > m) m = $3 }
    $1 ~ /^(allreduce_ring|allreduce_doubling|reduce_scatter|allgather)$/ {
        if ($4 > m) m = $4; if ($5 > m) m = $5 }
    END { printf "%g", m + 0 }')
for t in "$tables"/collectives_np*.dat; do
    [ -f "$t" ] || continue
    p=$(basename "$t" .dat | sed 's/collectives_np//')
    draw collectives_busbw.gp "$pngs/collectives_busbw_np$p.png" "datafile='$t'; ymax=$ymax; note='$(note_of "collectives_np$p.jsonl")'"
done
# chapter 5: a Gantt chart of the last logged step of each pipeline run,
# from its {"type":"timeline"} records (times in ms from the step's start)
for f in "$data"/ch5_*.jsonl; do
    [ -f "$f" ] || continue
    name=$(basename "$f" .jsonl)
    t="$tables/gantt_$name.dat"
    last=$(grep '"type":"timeline"' "$f" | tail -1 | sed 's/.*"step":\([0-9]*\),.*/\1/')
    grep '"type":"timeline","step":'"$last"',' "$f" | awk '{
        match($0, /"rank":[0-9]+/); r = substr($0, RSTART + 7, RLENGTH - 7)
        s = $0; sub(/.*"actions":\[/, "", s); gsub(/\]\]\}/, "", s); n = split(s, a, /\],\[/)
        for (i = 1; i <= n; i++) { gsub(/[\[\]"]/, "", a[i]); split(a[i], f, ",")
            printf "%s %.3f %.3f %d %s %s\n", r, 1e3 * f[4], 1e3 * f[5], index("FBW", f[1]) - 1, f[2], f[3] } }' > "$t"
    sched=$(grep -m1 '"type":"summary"' "$f" | sed 's/.*"schedule":"\([a-z0-9]*\)".*/\1/')
    bubble=$(grep -m1 '"type":"summary"' "$f" | sed 's/.*"bubble_measured":\([0-9.]*\),"bubble_simulated":\([0-9.]*\),"bubble_formula":\([0-9.]*\).*/measured \1, simulated \2, formula \3/')
    draw gantt.gp "$pngs/pipeline_${name#ch5_}.png" "datafile='$t'; note='$(note_of "$name.jsonl")'; title='chapter 5, ${name#ch5_} ($sched), step $last; bubble $bubble'"
done
# chapter 7's load balance, from its own runs in DATA_DIR/ch7/ (expert_load.sh
# writes the tables and names the --aux-coef values it found)
coefs=$(bash "$gp/expert_load.sh" "$data" "$tables") || failed=$((failed + 1))
[ -n "$coefs" ] && draw expert_load.gp "$pngs/expert_load.png" "coefs='$coefs'"
# chapter 6's activation memory against T, from its own runs in DATA_DIR/ch6/
ch6_names=$(bash "$gp/ch6_memory.sh" "$data" "$tables") || failed=$((failed + 1))
[ -n "$ch6_names" ] && draw ch6_memory.gp "$pngs/ch6_memory.png" "names='$ch6_names'"
# the checkpoint levels' costs, from their own runs in DATA_DIR/ckpt/
# (common/tools/ckpt_levels_bench.sh, make bench-ckpt), with their load
ck=$(bash "$gp/ckpt_levels.sh" "$data" "$tables") || failed=$((failed + 1))
if [ -n "$ck" ]; then
    ckload=$(awk '/^date: / { d = substr($0, 7) } /^load at the start: / { a = $5 } /^load at the end: / { b = $5 }
        END { printf "runs of %s, load average %s at the start, %s at the end: expect noise", d, a, b }' "$data/ckpt/runs.txt")
    draw ckpt_levels.gp "$pngs/ckpt_levels.png" "load='$ckload'"
fi
# the planner against runs: make plan-check (common/tools/plan_check.sh) writes DATA_DIR/plan_check.tsv
[ -f "$data/plan_check.tsv" ] && draw plan_check.gp "$pngs/plan_check.png" "datafile='$data/plan_check.tsv'"
[ $failed -eq 0 ]
