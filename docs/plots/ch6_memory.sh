#!/bin/bash
# ch6_memory.sh DATA_DIR TABLE_DIR: chapter 6's activation memory per rank
# against the sequence length, from its own runs in DATA_DIR/ch6/
# (ch6_mem_MODE_cpN_TT.jsonl, one step each; the commands are in
# docs/notes/06_sequence_context.md). Writes TABLE_DIR/ch6_mem_MODE_cpN.dat,
# "T MiB" per line, T ascending, and prints the "MODE_cpN" names it wrote.
# Nothing to read: prints nothing, no error.
set -u
data=$1/ch6
tables=$2
ls "$data"/ch6_mem_*_T*.jsonl > /dev/null 2>&1 || exit 0
mkdir -p "$tables"
rm -f "$tables"/ch6_mem_*.tmp
names=""
for f in "$data"/ch6_mem_*_T*.jsonl; do
    [ -e "$f" ] || continue
    b=$(basename "$f" .jsonl)
    key=${b%_T*}
    key=${key#ch6_mem_}
    T=${b##*_T}
    act=$(grep '"type":"summary"' "$f" | grep -o '"activations":\[[0-9]*' | grep -o '[0-9]*$')
    [ -n "$act" ] || continue
    echo "$T $(awk -v a="$act" 'BEGIN { printf "%.4f", a / 1048576 }')" >> "$tables/ch6_mem_$key.tmp"
    case " $names " in *" $key "*) ;; *) names="$names $key" ;; esac
done
for k in $names; do
    sort -n "$tables/ch6_mem_$k.tmp" > "$tables/ch6_mem_$k.dat"
    rm -f "$tables/ch6_mem_$k.tmp"
done
echo $names
