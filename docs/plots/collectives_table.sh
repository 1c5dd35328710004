#!/bin/bash
# collectives_table.sh: turn the JSONL rows of `build/chapter-1 --bench --log FILE`
# into a whitespace table that gnuplot can read (gnuplot cannot parse JSON).
#
#   bash docs/plots/collectives_table.sh IN.jsonl [OUT.dat]
#   infile=IN.jsonl outfile=OUT.dat bash docs/plots/collectives_table.sh
#
# Without an output file name the table goes to standard output.
#
# Output: comment lines start with '#'. The first gives the memory copy bandwidth
# per rank the bench measured (its "copy_bandwidth" record), so the plot can draw
# it as a reference line. Then one row per "collective" record:
#
#   op ranks bytes hand_busbw lib_busbw
#
# in the order of the file. The bench writes each op's sizes in increasing order, one
# op after another. gnuplot picks an op with
#   plot datafile using (strcol(1) eq "allreduce_ring" ? $3 : NaN):4
# Only bash, grep, sed and awk are used: no python, no jq.
set -euo pipefail

infile="${1:-${infile:-}}"
outfile="${2:-${outfile:-}}"
if [ -z "$infile" ]; then
    echo "usage: $0 IN.jsonl [OUT.dat]   (or infile=... outfile=... $0)" >&2
    exit 2
fi
if [ ! -r "$infile" ]; then
    echo "$0: cannot read '$infile': run build/chapter-1 --bench --log '$infile' first" >&2
    exit 1
fi

# field NAME: the value of "NAME": in one JSON line (numbers and strings; no nesting).
make_table() {
    awk '
    function field(line, name,    s, v) {
        s = line
        if (!match(s, "\"" name "\":")) return ""
        v = substr(s, RSTART + RLENGTH)
        sub(/^[ \t]*/, "", v)
        if (substr(v, 1, 1) == "\"") {          # a string
            v = substr(v, 2)
            sub(/".*$/, "", v)
        } else {                                 # a number
            sub(/[,}].*$/, "", v)
            gsub(/[ \t]/, "", v)
        }
        return v
    }
    BEGIN { rows = 0 }
    /"type":"copy_bandwidth"/ {
        printf "# copy_gbps %s ranks %s\n", field($0, "gbps"), field($0, "ranks")
        next
    }
    /"type":"collective"/ {
        if (rows++ == 0) printf "# %-18s %5s %12s %12s %12s\n", "op", "ranks", "bytes", "hand_busbw", "lib_busbw"
        printf "%-20s %5s %12s %12s %12s\n", field($0, "op"), field($0, "ranks"), field($0, "bytes"),
               field($0, "hand_busbw"), field($0, "lib_busbw")
    }
    END { if (rows == 0) { print "no \"collective\" rows in the input" > "/dev/stderr"; exit 1 } }
    ' "$infile"
}

if [ -n "$outfile" ]; then
    mkdir -p "$(dirname "$outfile")"
    tmp="$outfile.tmp.$$"
    trap 'rm -f "$tmp"' EXIT
    make_table > "$tmp"
    mv "$tmp" "$outfile"
    trap - EXIT
else
    make_table
fi
