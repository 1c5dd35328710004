#!/bin/bash
# expert_load.sh: chapter 7's load-balance plot (plots.sh calls it).
#
#   bash docs/plots/expert_load.sh DATA_DIR TABLE_DIR
#
# Reads DATA_DIR/ch7/ch7_load_aux*.jsonl: chapter 7 runs of the same model,
# one per --aux-coef (the file name ends in the coefficient). From each step
# record's "expert_tokens" (token-slots routed to each expert, per MoE layer,
# over the global batch) it writes TABLE_DIR/ch7_load_auxC.dat: step, then
# layer 0's slots per expert as a share of the fair load (k N / E), and
# prints the coefficients it found, which plots.sh hands to
# docs/plots/expert_load.gp (one panel each) to draw expert_load.png.
# Nothing to read: prints nothing, no error.
set -u
cd "$(dirname "$0")/../.."
data=$1 tables=$2
# a glob, not a word-split list: a DATA_DIR with a space in its name works
files=("$data"/ch7/ch7_load_aux*.jsonl)
[ -e "${files[0]}" ] || exit 0
mkdir -p "$tables"
list=""
for f in "${files[@]}"; do
    c=$(basename "$f" .jsonl | sed 's/ch7_load_aux//')
    grep '"type":"step"' "$f" | sed 's/.*"step":\([0-9]*\),.*"expert_tokens":\[\[\([0-9,]*\)\].*/\1 \2/' |
        awk '{ n = split($2, t, ","); s = 0; for (i = 1; i <= n; i++) s += t[i]
               printf "%d", $1; for (i = 1; i <= n; i++) printf " %.4f", t[i] * n / s; printf "\n" }' \
        > "$tables/ch7_load_aux$c.dat"
    list="$list $c"
done
echo $list
