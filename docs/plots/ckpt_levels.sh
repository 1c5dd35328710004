#!/bin/bash
# ckpt_levels.sh DATA_DIR TABLE_DIR: the checkpoint levels' costs, from the
# runs of common/tools/ckpt_levels_bench.sh in DATA_DIR/ckpt/ (MODE_rN.jsonl,
# two rounds). Writes, for docs/plots/ckpt_levels.gp:
#   TABLE_DIR/ckpt_stall.dat   "label round1_ms round2_ms": the time a save
#                              held the training loop, per save, rank 0
#   TABLE_DIR/ckpt_bytes.dat   "label serialised_MiB other_MiB": what rank 0
#                              wrote per save, the state serialised, and the
#                              rest (a partner's copy, a parity, a drained copy)
# and prints "ok"; nothing to read: prints nothing, no error.
set -u
data=$1/ckpt
tables=$2
ls "$data"/l1_none_r1.jsonl > /dev/null 2>&1 || exit 0
mkdir -p "$tables"
num() {  # FILE TYPE KEY: the number KEY of the first TYPE record (empty: none)
    grep -m1 "\"type\":\"$2\"" "$1" 2>/dev/null | grep -o "\"$3\":\[\?[-0-9.e]*" | head -1 | sed 's/.*[:[]//'
}
stall() {  # MODE ROUND: ms per save in the loop
    local f="$data/$1_r$2.jsonl"
    case $1 in
        l1_*) num "$f" checkpoint_local ms_per_save ;;
        # a step on both levels: level 1's save, then level 3's share
        l3_drained) awk -v a="$(num "$f" checkpoint_local ms_per_save)" -v b="$(num "$f" checkpoint stall_ms_per_save)" \
            'BEGIN { if (a == "" || b == "") print "NaN"; else printf "%.3f", a + b }' ;;
        *) num "$f" checkpoint stall_ms_per_save ;;
    esac
}
mib() { awk -v b="${1:-}" 'BEGIN { if (b == "") print "NaN"; else printf "%.3f", b / 1048576 }'; }
{
    echo "# label round1_ms round2_ms (common/tools/ckpt_levels_bench.sh; docs/plots/ckpt_levels.sh)"
    for m in l1_none:"L1 none" l1_partner:"L1 partner" l1_xor:"L1 xor" l3_sync:"L3 sync" l3_async:"L3 async" \
             l3_drained:"L1+L3, L3 drained" l3_incremental:"L3 incremental 4"; do
        key=${m%%:*}
        echo "\"${m#*:}\" $(stall "$key" 1 || true) $(stall "$key" 2 || true)" | sed 's/  */ /g; s/ $/ NaN/'
    done
} > "$tables/ckpt_stall.dat"
f="$data/l1_none_r1.jsonl"
file=$(num "$f" checkpoint_local file_bytes)
{
    echo "# label serialised_MiB other_MiB per save on rank 0"
    echo "\"L1 none\" $(mib "$file") 0"
    echo "\"L1 partner\" $(mib "$(num "$data/l1_partner_r1.jsonl" checkpoint_local file_bytes)") $(mib "$(num "$data/l1_partner_r1.jsonl" checkpoint_local redundancy_bytes)")"
    echo "\"L1 xor\" $(mib "$(num "$data/l1_xor_r1.jsonl" checkpoint_local file_bytes)") $(mib "$(num "$data/l1_xor_r1.jsonl" checkpoint_local redundancy_bytes)")"
    echo "\"L3 sync\" $(mib "$(num "$data/l3_sync_r1.jsonl" checkpoint save_bytes)") 0"
    echo "\"L3 async\" $(mib "$(num "$data/l3_async_r1.jsonl" checkpoint save_bytes)") 0"
    d="$data/l3_drained_r1.jsonl"
    ls1=$(num "$d" checkpoint_local saves)
    echo "\"L1+L3, L3 drained\" $(mib "$(awk -v s="$(num "$d" checkpoint_local serialised_bytes)" -v n="$ls1" 'BEGIN { printf "%.0f", s / n }')") $(mib "$(awk -v s="$(num "$d" checkpoint_local drained_bytes)" -v n="$ls1" 'BEGIN { printf "%.0f", s / n }')")"
    i="$data/l3_incremental_r1.jsonl"
    echo "\"L3 incr., full\" $(mib "$(num "$i" checkpoint full_bytes_per_save)") 0"
    echo "\"L3 incr., delta\" $(mib "$(num "$i" checkpoint delta_bytes_per_save)") 0"
} > "$tables/ckpt_bytes.dat"
echo ok
