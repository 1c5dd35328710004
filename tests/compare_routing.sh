#!/bin/bash
# compare_routing.sh REF.jsonl RUN.jsonl TOL TOL_NORM: two chapter 7 runs of
# the same model on different meshes, compared as far as their routing
# agrees.
#
# MoE routing is discontinuous: a token's experts are its top-k router
# probabilities, and capacity mode drops the slots past an expert's limit.
# Two meshes add the same numbers in different orders, so their losses
# differ in the last bits, as the dense chapters' do; but when a token's
# k-th and (k+1)-th probabilities (or an expert's last kept slot) are that
# close, the last bits pick another expert, and from that step on the runs
# train different models (docs/07_expert.md). So: S = the first step whose
# "routing" differs (the signature of every token-slot's expert, kept or
# dropped, over the global batch: moe_layer.h's moe_step_routing, which sees
# two tokens trading experts too); every step before S must give the same
# loss (within TOL) and gradient norm (within TOL_NORM), and the difference
# at S must look like a near-tie, not like two different models: by
# "expert_tokens" (the slots routed to each expert of each MoE layer), at
# most 2 token-slots moved in any MoE layer (a slot moved from one expert to
# another changes two counts by 1; a trade changes none). A routing
# difference at step 0 (the same parameters) fails: the forward differs.
#
# Prints "S steps compared (routing first differs at step S: M token-slots
# moved in one layer), max |dloss| ..., max |dnorm| ..." or "... (routing the
# same at every step) ..."; exits 0 when all of the above hold.
ref=$1 run=$2 tol=$3 tol_norm=$4
here=$(dirname "$0")
# "step expert_tokens routing" per step record ("step ?" without them)
routing() {
    grep '"type":"step"' "$1" |
        sed -e 's/.*"step":\([0-9]*\),.*"expert_tokens":\(\[[][0-9,]*\]\),"routing":"\([0-9a-f]*\)".*/\1 \2 \3/' \
            -e 't' -e 's/.*"step":\([0-9]*\),.*/\1 ?/'
}
# "FIRST MOVED" (FIRST = -1: the same at every step), or "? why"
first=$(paste -d ' ' <(routing "$ref") <(routing "$run") | awk '
    $1 != $4 || $2 == "?" || $5 == "?" {
        print "? the step numbers differ or a record lacks \"expert_tokens\" or \"routing\""; found = 1; exit }
    $3 != $6 || $2 != $5 {
        # the most slots moved in one layer: half the sum of |d count|
        a = $2; b = $5; gsub(/^\[\[|\]\]$/, "", a); gsub(/^\[\[|\]\]$/, "", b)
        nl = split(a, la, /\],\[/); split(b, lb, /\],\[/); worst = 0
        for (l = 1; l <= nl; l++) {
            ne = split(la[l], ea, ","); split(lb[l], eb, ","); s = 0
            for (e = 1; e <= ne; e++) { d = ea[e] - eb[e]; s += d < 0 ? -d : d }
            if (int((s + 1) / 2) > worst) worst = int((s + 1) / 2)
        }
        print $1, worst; found = 1; exit }
    END { if (!found && NR > 0) print -1, 0; if (NR == 0) print "? no step records" }')
case $first in
    \?*) echo "${first#? }"; exit 1 ;;
esac
read -r step moved <<< "$first"
if [ "$step" = 0 ]; then
    echo "the routing differs already at step 0 ($moved token-slots moved in one layer, by the counts): the same parameters routed differently"
    exit 1
fi
# the step records before S, compared as the dense chapters' are
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
before() { grep '"type":"step"' "$1" | awk -v s="$step" '{ match($0, /"step":[0-9]+/); if (s < 0 || substr($0, RSTART + 7, RLENGTH - 7) + 0 < s) print }'; }
before "$ref" >"$tmp/ref"
before "$run" >"$tmp/run"
ok=1
a=$(bash "$here/compare_losses.sh" "$tmp/ref" "$tmp/run" "$tol") || ok=0
b=$(bash "$here/compare_losses.sh" "$tmp/ref" "$tmp/run" "$tol_norm" norm) || ok=0
if [ "$step" -lt 0 ]; then
    where="routing the same at every step"
else
    where="routing first differs at step $step: $moved token-slot$([ "$moved" = 1 ] || echo s) moved in one layer"
    [ "$moved" != 0 ] || where="routing first differs at step $step: tokens traded experts, the counts the same"
    [ "$moved" -le 2 ] || { ok=0; where="$where: more than a near-tie moves"; }
fi
echo "${a%%,*} compared ($where), ${a#* steps, }, ${b#* steps, }"
[ $ok = 1 ]
