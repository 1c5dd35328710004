#!/bin/bash
# extract.sh: turn the programs' JSONL logs into whitespace tables for gnuplot
# (gnuplot cannot parse JSON). Only bash, grep, sed, sort and awk: no python, no jq.
#
#   bash docs/plots/extract.sh [DATA_DIR] [TABLE_DIR]     [docs/plots/data] [build/plots]
#   bash docs/plots/extract.sh --fields                   the fields the tables are made of
#
# Every DATA_DIR/*.jsonl with a {"type":"summary",...} record is one training
# run. From its summary (the last one in the file) come:
#
#   runs.dat      one row per run: x chapter ranks batch steps ms_per_step
#                 tokens_per_s mfu mode label
#   memory.dat    peak MiB per category (params grads optimizer activations comm
#                 other) and the peak of their sum (total), rank 0; and a second
#                 bar, the rank whose peaks differ most from rank 0's, when the
#                 ranks differ
#   comm.dat      MiB per step per rank (rank 0) by collective, summed over
#                 axes: "bytes" (the buffer each call works on) / steps, and the
#                 total "bus_bytes" / steps (what the algorithm sends per rank)
#   time.dat      ms per step, split three ways: blocked waiting on
#                 communication, driving non-blocking communication (starts
#                 and tests), and the rest (computing)
#   scaling.dat   chapter 2's overlapped runs (grad-accum 1): ranks, batch,
#                 batch per rank, tokens/s: the strong- and weak-scaling series
#
# Every DATA_DIR/*.jsonl with {"type":"collective",...} rows (chapter 1's
# --bench) becomes TABLE_DIR/collectives_npP.dat through collectives_table.sh.
#
# Every table's first column, x, is the bar position (runs sorted by chapter,
# ranks, mode, batch, with a gap between chapters), and its last column the
# quoted label of the run's row, on one line ("ch2 naive, dp=2, batch 8"; in
# memory.dat ", rank R" follows it); the label starts with "chN", which the
# plots read the chapter from; the numbers in between can be read with awk.
#
# A record that lacks a field the tables need stops the
# extraction with the file and the field named.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"

# The fields read, as "record-type pattern" ("summary:N" = chapter N's
# summaries only); the pattern is the text the field starts with in the JSON.
# tests/test_plots.sh checks that the programs' logs carry every one.
fields() {
    cat <<'EOF'
summary "chapter":
summary "world_size":
summary "mesh_shape":"
summary "batch":
summary "steps":
summary "ms_per_step":
summary "tokens_per_s":
summary "mfu":
summary "peak_bytes":{
summary "params":[
summary "grads":[
summary "optimizer":[
summary "activations":[
summary "comm":[
summary "other":[
summary "total":[
summary "comm":{
summary "comm_wait_s":[
summary "comm_progress_s":[
summary:2 "dp_mode":"
summary:2 "grad_accum":
summary:3 "zero":
collective "op":"
collective "ranks":
collective "bytes":
collective "hand_busbw":
collective "lib_busbw":
copy_bandwidth "gbps":
EOF
}
if [ "${1:-}" = "--fields" ]; then
    fields
    exit 0
fi

data="${1:-docs/plots/data}"
out="${2:-build/plots}"
if [ ! -d "$data" ]; then
    echo "extract.sh: no data folder '$data'" >&2
    exit 1
fi
mkdir -p "$out"

shopt -s nullglob
runs=()
benches=()
for f in "$data"/*.jsonl; do
    if grep -q '"type":"summary"' "$f"; then runs+=("$f"); fi
    if grep -q '"type":"collective"' "$f"; then benches+=("$f"); fi
done

# ---------------------------------------------------------------- training runs
# One line per run on standard input: FILE<TAB>summary JSON. The awk below
# flattens the JSON into F["peak_bytes.params.0"] = "43376640" and so on, then
# writes one line per table row, "TABLE<TAB>sortkey<TAB>row"; sort and split.
summaries() {
    local f
    for f in "${runs[@]}"; do
        printf '%s\t%s\n' "$(basename "$f" .jsonl)" "$(grep '"type":"summary"' "$f" | tail -1)"
    done
}

rows=$(summaries | awk -F'\t' '
# ---- a small JSON flattener: objects, arrays, strings, numbers
function skip() { while (P <= N && index(" \t\r\n", substr(S, P, 1))) P++ }
function str(    v, c) {
    P++; v = ""
    while (P <= N && (c = substr(S, P, 1)) != "\"") {
        if (c == "\\") { P++; c = substr(S, P, 1) }
        v = v c; P++
    }
    P++
    return v
}
function val(path,    c, k, i, v) {
    skip(); c = substr(S, P, 1)
    if (c == "{") {
        P++; skip()
        if (substr(S, P, 1) == "}") { P++; return }
        while (P <= N) {
            skip(); k = str(); skip(); P++          # the key and its colon
            val(path == "" ? k : path "." k)
            skip(); c = substr(S, P, 1); P++
            if (c != ",") return
        }
    } else if (c == "[") {
        P++; skip(); i = 0
        if (substr(S, P, 1) == "]") { P++; F[path ".len"] = 0; return }
        while (P <= N) {
            val(path "." i); i++
            skip(); c = substr(S, P, 1); P++
            if (c != ",") break
        }
        F[path ".len"] = i
    } else if (c == "\"") {
        F[path] = str(); K[++NK] = path
    } else {
        v = ""
        while (P <= N && !index(",]} \t", (c = substr(S, P, 1)))) { v = v c; P++ }
        F[path] = v; K[++NK] = path
    }
}
function need(key) {
    if (!(key in F)) {
        printf "extract.sh: %s.jsonl: the summary has no \"%s\" (the plots need it)\n", RUN, key > "/dev/stderr"
        bad = 1
        exit 1
    }
    return F[key]
}
function mib(b) { return b / 1048576 }
BEGIN {
    ncat = split("params grads optimizer activations comm other", cat, " ")
    ncoll = split("allreduce reduce_scatter allgather broadcast reduce scatter gather alltoall send recv", coll, " ")
    mode_order["naive"] = 1; mode_order["bucketed"] = 2; mode_order["overlapped"] = 3; mode_order["ps"] = 4
}
{
    RUN = $1; S = $2; N = length(S); P = 1
    split("", F); NK = 0
    val("")
    ch = need("chapter") + 0; n = need("world_size") + 0
    steps = need("steps") + 0; batch = need("batch") + 0
    ms = need("ms_per_step") + 0; tps = need("tokens_per_s") + 0; mfu = need("mfu") + 0
    shape = need("mesh_shape")
    for (c = 1; c <= ncat; c++) for (r = 0; r < n; r++) need("peak_bytes." cat[c] "." r)
    for (r = 0; r < n; r++) need("peak_bytes.total." r)
    for (r = 0; r < n; r++) need("comm_wait_s." r)
    need("comm_progress_s.0")

    # the label under the bar, and where the run sorts
    mode = ""; order = 0
    if ("dp_mode" in F) { mode = F["dp_mode"]; order = mode_order[mode] + 0 }
    else if ("zero" in F) { mode = "ZeRO-" F["zero"]; order = F["zero"] + 0 }
    else if ("zero_stage" in F) { mode = "ZeRO-" F["zero_stage"]; order = F["zero_stage"] + 0 }
    else if ("schedule" in F) { mode = F["schedule"] ((F["virtual"] + 0) > 1 ? " v=" F["virtual"] : "") ", m=" F["microbatches"] }
    else if (ch == 0) mode = "reference"
    else mode = RUN
    if (ch == 6 && ("sp" in F)) mode = "seq. parallel"  # chapter 6 --sp (its summary has zero too)
    else if (ch == 6 && ("cp_mode" in F)) mode = F["cp_mode"] (F["cp_balance"] != "" && F["cp_balance"] != "none" ? " " F["cp_balance"] : "")
    if (ch == 7 && ("experts" in F)) mode = sprintf("MoE E=%d k=%d", F["experts"], F["top_k"])
    if (ch == 2 && need("grad_accum") + 0 > 1) mode = mode ", accum " F["grad_accum"]
    # one line: the plots draw one row per run, the label beside it
    label = sprintf("ch%d %s, %s, batch %d", ch, mode, shape, batch)
    key = sprintf("%02d %04d %02d %06d %s", ch, n, order, batch, RUN)

    printf "runs\t%s\t%d %d %d %d %.3f %.1f %.5f \"%s\" \"%s\"\n", key, ch, n, batch, steps, ms, tps, mfu, mode, label

    # memory: rank 0; and the rank that differs most from it, if any differs
    far = -1; fardist = 0
    for (r = 1; r < n; r++) {
        d = 0
        for (c = 1; c <= ncat; c++) {
            x = F["peak_bytes." cat[c] "." r] - F["peak_bytes." cat[c] ".0"]
            d += (x < 0 ? -x : x)
        }
        if (d > fardist) { fardist = d; far = r }
    }
    rowl = (far >= 0) ? label ", rank 0" : label
    line = "0"
    for (c = 1; c <= ncat; c++) line = line sprintf(" %.3f", mib(F["peak_bytes." cat[c] ".0"]))
    line = line sprintf(" %.3f", mib(F["peak_bytes.total.0"]))
    printf "memory\t%s 0\t%s \"%s\"\n", key, line, rowl
    if (far >= 0) {
        line = far ""
        for (c = 1; c <= ncat; c++) line = line sprintf(" %.3f", mib(F["peak_bytes." cat[c] "." far]))
        line = line sprintf(" %.3f", mib(F["peak_bytes.total." far]))
        printf "memory\t%s 1\t%s \"%s, rank %d\"\n", key, line, label, far
    }

    # communication per step, rank 0, each collective summed over its axes
    line = ""; bus = 0
    for (c = 1; c <= ncoll; c++) {
        b = 0
        for (i = 1; i <= NK; i++)
            if (index(K[i], "comm." coll[c] ".") == 1 && K[i] ~ /\.bytes\.0$/ && K[i] !~ /bus_bytes/) {
                b += F[K[i]]
                p = K[i]; sub(/\.bytes\.0$/, ".bus_bytes.0", p)
                bus += F[p]
            }
        line = line sprintf("%s%.4f", (c > 1 ? " " : ""), (steps > 0 ? mib(b) / steps : 0))
    }
    printf "comm\t%s\t%s %.4f \"%s\"\n", key, line, (steps > 0 ? mib(bus) / steps : 0), label

    # time: ms per timed step; the wait is comm_wait_s over ALL steps / steps
    # (the first step is in the wait, not in ms_per_step: see docs/plots.md)
    w0 = steps > 0 ? 1000 * F["comm_wait_s.0"] / steps : 0
    wmax = 0
    for (r = 0; r < n; r++) { w = steps > 0 ? 1000 * F["comm_wait_s." r] / steps : 0; if (w > wmax) wmax = w }
    # the same rule for the seconds spent inside non-blocking starts and tests
    p0 = steps > 0 ? 1000 * F["comm_progress_s.0"] / steps : 0
    if (w0 > ms) w0 = ms
    if (w0 + p0 > ms) p0 = ms - w0
    rest = ms - w0 - p0
    exact = ("comm_wait_ms_per_step" in F) ? F["comm_wait_ms_per_step"] : "NaN"
    printf "time\t%s\t%.3f %.3f %.3f %.3f %s %.3f \"%s\"\n", key, ms, w0, rest, wmax, exact, p0, label

    # scaling: chapter 2, overlapped, no accumulation
    if (ch == 2 && F["dp_mode"] == "overlapped" && F["grad_accum"] + 0 == 1)
        printf "scaling\t%s\t%d %d %g %.1f\n", key, n, batch, batch / n, tps
}')

# the x position of each bar: one apart, a gap of one where the chapter changes
split_table() {
    local table=$1 header=$2 file=$3
    {
        echo "$header"
        printf '%s\n' "$rows" | awk -F'\t' -v t="$table" '$1 == t' | sort -t"$(printf '\t')" -k2,2 |
            awk -F'\t' '{ ch = substr($2, 1, 2) + 0
                          if (NR > 1 && ch != last) x++
                          last = ch; printf "%d %s\n", x++, $3 }'
    } > "$file"
}
if [ ${#runs[@]} -gt 0 ]; then
    split_table runs "# x chapter ranks batch steps ms_per_step tokens_per_s mfu mode label" "$out/runs.dat"
    split_table memory "# x rank params grads optimizer activations comm other total label   (peak MiB per category; total = peak of the sum)" "$out/memory.dat"
    split_table comm "# x allreduce reduce_scatter allgather broadcast reduce scatter gather alltoall send recv bus label   (MiB per step, rank 0: bytes per collective, then all bus_bytes)" "$out/comm.dat"
    split_table time "# x ms_per_step wait_rank0 rest(computing) wait_max_over_ranks wait_rank0_timed_steps(where logged, else NaN) progress_rank0 label   (ms per step)" "$out/time.dat"
    { echo "# ranks batch batch_per_rank tokens_per_s   (chapter 2, overlapped, grad-accum 1)"
      printf '%s\n' "$rows" | awk -F'\t' '$1 == "scaling" { print $3 }' | sort -n -k1,1 -k2,2; } > "$out/scaling.dat"
else
    rm -f "$out/runs.dat" "$out/memory.dat" "$out/comm.dat" "$out/time.dat" "$out/scaling.dat"
fi

# ---------------------------------------------------------------- chapter 1's bench
rm -f "$out"/collectives_np*.dat
for f in "${benches[@]}"; do
    p=$(grep -m1 '"type":"collective"' "$f" | sed 's/.*"ranks":\([0-9]*\).*/\1/')
    if [ -e "$out/collectives_np$p.dat" ]; then
        echo "extract.sh: $(basename "$f") is a second $p-rank bench; it replaces the first" >&2
    fi
    bash "$here/collectives_table.sh" "$f" "$out/collectives_np$p.dat"
done

echo "extract.sh: ${#runs[@]} training run(s), ${#benches[@]} collective bench(es) -> $out/"
