#!/bin/bash
# Multi-level checkpoints (common/ckpt_levels.c, docs/checkpoints.md "Levels"):
# level 1 under --ckpt-local DIR/node-K, level 2 (partner copies, xor
# parity) across simulated nodes (--ranks-per-node), a node's directory
# deleted and the run resumed (bit for bit on the same mesh, within the
# invariant's tolerance on another), two nodes lost under xor, level 1
# next to level 3, incremental saves (the chain, --keep, a missing or
# foreign base), and the flags' refusals. A topic script of tests/run.sh.
. "$(dirname "$0")/lib.sh"

echo "== checkpoint levels: node-local, partner, xor, rebuild"
LV=$TEST_TMPDIR/levels
mkdir -p "$LV"
LVF="--steps 8 --batch 12 --seq 32 --peak-gflops 10"
LV_TOL=3e-5  # the invariant's tolerance (tests/run.sh, chapter 2)

lv_run() {  # NAME NP CHAPTER FLAGS...: output in $LV/NAME.out, log $LV/NAME.jsonl
    local name=$1 np=$2 ch=$3
    shift 3
    timeout 120 $MPIRUN -np "$np" "$BUILD/chapter-$ch" $LVF --log "$LV/$name.jsonl" "$@" >"$LV/$name.out" 2>&1
}

# lv_losses FILE FIRST: "step loss norm" lines of the steps from FIRST on
lv_losses() { grep '"type":"step"' "$1" | sed 's/.*"step":\([0-9]*\).*"loss":\([-0-9.e]*\).*"norm":\([-0-9.e]*\).*/\1 \2 \3/' | awk -v f="$2" '$1 >= f'; }
# lv_near REF RUN FIRST: the same steps from FIRST on, losses within LV_TOL
# and norms within TOL_NORM (another chapter and mesh: the float's last
# digits move); prints the largest differences, exit 0 when within
lv_near() {
    paste -d' ' <(lv_losses "$LV/$1.jsonl" "$3") <(lv_losses "$LV/$2.jsonl" "$3") |
        awk -v tl="$LV_TOL" -v tn="$TOL_NORM" '{ n++; dl = $2 - $5; dn = $3 - $6; if (dl < 0) dl = -dl; if (dn < 0) dn = -dn
             if ($1 != $4 || NF != 6) bad = 1; if (dl > ml) ml = dl; if (dn > mn) mn = dn }
             END { printf "%d steps, max |dloss| %.1e, |dnorm| %.1e", n, ml, mn; exit !(n > 0 && !bad && ml <= tl && mn <= tn) }'
}

# lv_same REF RUN FIRST WHAT: the resumed run printed the level line, logged
# the same losses and norms as REF from FIRST on, and saved the same weights
lv_same() {
    local ref=$1 run=$2 first=$3 what=$4
    # bit for bit by construction: a rebuilt file is the same bytes (copy, xor) resumed on the same mesh
    if grep -q "checkpoint: resuming from level 1" "$LV/$run.out" && [ -n "$(lv_losses "$LV/$run.jsonl" "$first")" ] &&
        [ "$(lv_losses "$LV/$ref.jsonl" "$first")" = "$(lv_losses "$LV/$run.jsonl" "$first")" ] && cmp -s "$LV/$ref.bin" "$LV/$run.bin"; then
        pass "levels: $what ($(grep -o 'resuming from level 1.*' "$LV/$run.out" | head -1))"
    else
        fail "levels: $what" "$(grep -E '^error|resuming' "$LV/$run.out" | head -2)"
    fi
}

# --- xor over 2 simulated nodes of 2 ranks: node 0 lost, rebuilt, bit for bit
lv_xor2() {
lv_run x2 4 3 --dp 4 --zero 3 --ckpt-local "$LV/x2" --local-every 3 --ranks-per-node 2 --ckpt-redundancy xor --save "$LV/x2.bin"
# --local-every 3 does not divide the 8 steps: the last step is saved too,
# as --save-every's is (a run that ends between saves loses nothing)
if [ -f "$LV/x2/node-0/step-00000008/MANIFEST" ] && [ -f "$LV/x2/node-1/step-00000008/MANIFEST" ]; then
    pass "levels: --local-every 3 over 8 steps also saves the last step, 8, on every node"
else
    fail "levels: the last step's level-1 save" "node-0 and node-1 hold: $(ls "$LV/x2/node-0" "$LV/x2/node-1" 2>&1 | tr '\n' ' ')"
fi
rm -rf "$LV/x2/node-0" "$LV/x2/node-1/step-00000008"
lv_run x2r 4 3 --dp 4 --zero 3 --ckpt-local "$LV/x2" --ranks-per-node 2 --resume "$LV/x2" --save "$LV/x2r.bin"
lv_same x2 x2r 6 "xor, 2 nodes x 2 ranks, node 0 deleted: rebuilt and resumed at step 6 bit for bit"
lv_own_node x2r 2 "the xor rebuild of node 0 over MPI"
}

# lv_own_node RUN R WHAT: the resume's "level-1 reads" line names, for each
# rank r, node-(r/R) alone: no rank read another node's directory (node-local
# disks on a cluster), and some rank sent xor pieces or files over MPI. Every
# path under --ckpt-local the resume opens is made by one function
# (local_path in common/ckpt_levels.c), which records its node: a rank 0 that read
# node 1's directory, as the resume before the MPI rebuild did, fails here.
lv_own_node() {
    local run=$1 per=$2 what=$3 line
    line=$(grep '^checkpoint: level-1 reads:' "$LV/$run.out")
    if [ -n "$line" ] && echo "$line" | grep -q 'sent [0-9]* bytes' && echo "$line" | sed 's/^checkpoint: level-1 reads://' | tr ';' '\n' |
        awk -v per="$per" '{ n++; want = "node-" int($2 / per); if ($4 != want && $4 != want ",") bad = 1; if ($0 ~ /node-[0-9]+,node-/) bad = 1 }
                            END { exit bad || n == 0 }'; then
        pass "levels: $what: every rank read its own node's directory only ($(echo "$line" | sed "s/^checkpoint: level-1 reads: //"))"
    else
        fail "levels: $what: a rank read another node's directory, or nothing was sent" "${line:-no level-1 reads line}"
    fi
}

# --- xor over 3 nodes (the parity is half a file): one node lost and the
# run resumed on another mesh (chapter 2, dp 2); two nodes lost: refused
lv_xor3() {
local out
lv_run x3 3 3 --dp 3 --zero 3 --ckpt-local "$LV/x3" --local-every 4 --ranks-per-node 1 --ckpt-redundancy xor
cp -r "$LV/x3" "$LV/x3b"
cp -r "$LV/x3" "$LV/x3c"
# every node's loss is rebuilt to the checksum its manifest names (a resume
# with nothing left to train still rebuilds and checks every file)
local n ok=1 why=""
for n in 0 2; do
    rm -rf "$LV/x3n"; cp -r "$LV/x3" "$LV/x3n"; rm -rf "$LV/x3n/node-$n" "$LV/x3n"/node-*/step-00000008
    out=$(timeout 60 $MPIRUN -np 3 "$BUILD/chapter-3" --dp 3 --zero 3 $LVF --steps 4 --ckpt-local "$LV/x3n" --ranks-per-node 1 --resume "$LV/x3n" 2>&1) &&
        echo "$out" | grep -q "rebuilt rank-0000$n.bin of node $n from the xor parity" || { ok=0; why="node $n: $(echo "$out" | grep -E '^error' | head -1)"; }
done
if [ $ok = 1 ]; then pass "levels: xor over 3 nodes: node 0 and node 2, each deleted alone, rebuilt to their manifest checksums"; else fail "levels: xor rebuild of every node" "$why"; fi
if [ "$(stat -c %s "$LV/x3/node-1/step-00000004/xor-00001.bin")" -lt "$(stat -c %s "$LV/x3/node-1/step-00000004/rank-00001.bin")" ]; then
    pass "levels: xor over 3 nodes keeps a parity smaller than a rank's file ($(stat -c %s "$LV/x3/node-1/step-00000004/xor-00001.bin") < $(stat -c %s "$LV/x3/node-1/step-00000004/rank-00001.bin") bytes)"
else
    fail "levels: xor parity size" "$(ls -l "$LV/x3/node-1/step-00000004" | tr '\n' ' ')"
fi
rm -rf "$LV/x3/node-1" "$LV/x3"/node-*/step-00000008
lv_run x3r 3 2 --dp 3 --ckpt-local "$LV/x3" --ranks-per-node 1 --resume "$LV/x3"
lv_own_node x3r 1 "the xor rebuild onto chapter 2"
if grep -q "rebuilt rank-00001.bin of node 1 from the xor parity" "$LV/x3r.out" &&
    ck=$(awk 'FNR == 1 { f++ } /"type":"step"/ { match($0, /"step":[0-9]+/); s = substr($0, RSTART + 7, RLENGTH - 7) + 0
         match($0, /"loss":[-0-9.e]+/); l = substr($0, RSTART + 7, RLENGTH - 7) + 0
         if (f == 1) r[s] = l; else { n++; d = l - r[s]; if (d < 0) d = -d; if (d > m) m = d } }
         END { printf "steps 4..7, max |dloss| %.1e", m; exit !(n == 4 && m <= '"$LV_TOL"') }' "$LV/x3.jsonl" "$LV/x3r.jsonl"); then
    pass "levels: xor over 3 nodes, node 1 deleted, rebuilt and resumed on chapter 2 dp=3 ($ck, within $LV_TOL)"
else
    fail "levels: xor rebuild onto another mesh" "$(grep -E '^error|resuming' "$LV/x3r.out" | head -2)"
fi
rm -rf "$LV/x3b/node-1" "$LV/x3b/node-2"
error_case chapter-3 3 "--dp 3 --zero 3 $LVF --ckpt-local $LV/x3b --ranks-per-node 1 --resume $LV/x3b" \
    "cannot rebuild rank-00001.bin of node 1 from the xor parity: rank-00002.bin of node 2, in the same xor group, is lost too"
# a save of 3 nodes resumed on 1: nodes 1 and 2 are there, but no rank of
# this run can read them (said so, not "lost")
error_case chapter-3 1 "$LVF --ckpt-local $LV/x3c --ranks-per-node 1 --resume $LV/x3c" \
    "cannot rebuild rank-00001.bin of node 1 from the xor parity: rank-00002.bin of node 2, in the same xor group, is out of reach too: this run has no rank on node 2 (it runs on 1 node(s), the save on 3)"
# the refusal empties every node's lock (a run that ends leaves none to call stale)
local locks
locks=$(cat "$LV"/x3b/node-*/.lock 2>/dev/null)
if ls "$LV"/x3b/node-*/.lock >/dev/null 2>&1 && [ -z "$locks" ]; then
    pass "levels: the refused level-1 resume leaves its nodes' .lock files empty"
else
    fail "levels: the refused level-1 resume's locks" "$(ls "$LV"/x3b/node-*/.lock 2>&1 | head -3); text: $locks"
fi
}

# --- a node dies before it commits a level-1 step the others commit: with
# --keep 1 they pruned their older step at once, and no step was complete
# on every node ("rank-00001.bin of node 1 is on no node"); the older step
# now goes only once every node holds the new one
lv_commit() {
CKPT_KILL=commit:3:1 lv_run cm 2 3 --dp 2 --zero 3 --ckpt-local "$LV/cm" --local-every 1 --ranks-per-node 1 --keep 1
local half=""
[ -d "$LV/cm/node-0/step-00000003" ] && [ ! -d "$LV/cm/node-1/step-00000003" ] && half=1
lv_run cmr 2 3 --dp 2 --zero 3 --ckpt-local "$LV/cm" --ranks-per-node 1 --resume "$LV/cm"
# (the resumed run's save of step 8 passes node 0's half step 3: it goes)
if grep -q "CKPT_KILL: killing this rank" "$LV/cm.out" && [ -n "$half" ] && [ ! -d "$LV/cm/node-0/step-00000003" ] &&
    grep -q "^checkpoint: resuming from level 1 (node-local), step 2" "$LV/cmr.out" &&
    [ "$(lv_losses "$LV/cmr.jsonl" 2 | wc -l)" = 6 ]; then
    pass "levels: node 1 died before committing step 3, node 0 committed it: step 2 kept on both (--keep 1), resumed; node 0's half step 3 removed once the run's save passed it"
else
    fail "levels: a node dead before its commit" "$(ls "$LV"/cm/node-* | tr '\n' ' '); $(grep -E '^error|resuming' "$LV/cmr.out" | head -2)"
fi
}

# --- partner copies (chapter 2: rank 0 alone has a file, its copy on node 1)
lv_partner() {
lv_run p2 2 2 --dp 2 --ckpt-local "$LV/p2" --local-every 4 --ranks-per-node 1 --ckpt-redundancy partner --save "$LV/p2.bin"
rm -rf "$LV/p2/node-0" "$LV/p2/node-1/step-00000008"
lv_run p2r 2 2 --dp 2 --ckpt-local "$LV/p2" --ranks-per-node 1 --ckpt-redundancy partner --resume "$LV/p2" --save "$LV/p2r.bin"
lv_same p2 p2r 4 "partner, node 0 deleted: its file read from the partner copy on node 1, bit for bit"
lv_own_node p2r 1 "the partner copy sent from node 1"
}

# --- partner copies on 3 nodes (chapter 2: rank 0 alone has a file, so
# ranks 1 and 2 in a row have none; each still meets its neighbours, or the
# save hangs): the save in time, node 0 deleted and rebuilt from node 1
lv_partner3() {
lv_run p3 3 2 --dp 3 --ckpt-local "$LV/p3" --local-every 1 --ranks-per-node 1 --ckpt-redundancy partner --save "$LV/p3.bin"
if grep -q "saved level 1" "$LV/p3.out" && [ -f "$LV/p3/node-1/step-00000008/rank-00000.bin" ] &&
    cmp -s "$LV/p3/node-0/step-00000008/rank-00000.bin" "$LV/p3/node-1/step-00000008/rank-00000.bin"; then
    pass "levels: partner over 3 nodes, two ranks in a row without a file: every step saved, rank 0's copy on node 1"
else
    fail "levels: partner over 3 nodes (a hang times out at 120 s)" "$(grep -E '^error|watchdog' "$LV/p3.out" | head -2)"
fi
rm -rf "$LV/p3/node-0" "$LV/p3/node-"[12]/step-00000008
lv_run p3r 3 2 --dp 3 --ckpt-local "$LV/p3" --ranks-per-node 1 --ckpt-redundancy partner --resume "$LV/p3" --save "$LV/p3r.bin"
lv_same p3 p3r 7 "partner over 3 nodes, node 0 deleted: rank 0's file from node 1's copy, bit for bit"
lv_own_node p3r 1 "the partner copy sent from node 1 of 3"
}

# --- level 1 next to level 3: the same bytes; no redundancy and a node lost:
# the resume falls back to level 3 and says why
lv_both() {
lv_run b0 1 0 --ckpt-local "$LV/b1" --local-every 2 --ckpt-dir "$LV/b3" --save-every 4 --async-save
# byte for byte by construction: level 3's file is a copy of level 1's
if cmp -s "$LV/b1/node-0/step-00000004/rank-00000.bin" "$LV/b3/step-00000004/rank-00000.bin"; then
    pass "levels: level 1 and level 3 of step 4 hold the same rank file, byte for byte (one copy off the device)"
else
    fail "levels: level 1 vs level 3 bytes" "$(ls -l "$LV/b1/node-0/step-00000004" "$LV/b3/step-00000004" | tr '\n' ' ')"
fi
# the drain: 8 steps, level 1 every 2 (4 saves), level 3 every 4 (steps 4
# and 8, on both levels): the state is serialised 4 times, not 6; level 3's
# two files are copies of level 1's (counted exactly, in bytes)
local fb line
fb=$(stat -c %s "$LV/b1/node-0/step-00000004/rank-00000.bin")
line=$(grep '^checkpoint: the state serialised' "$LV/b0.out")
if [ "$line" = "checkpoint: the state serialised to files: $((4 * fb)) bytes on rank 0 in 4 level-1 and 2 level-3 saves; 2 level-3 saves drained from level 1 ($((2 * fb)) bytes copied, not serialised again)" ] &&
    [ "$(grep -c 'checkpoint: saved .*/b3/step-0000000[48] (drained from level 1)$' "$LV/b0.out")" = 2 ]; then
    pass "levels: level 3 drained from level 1: $((4 * fb)) bytes serialised (4 x $fb), not $((6 * fb)); $((2 * fb)) copied"
else
    fail "levels: the drain of level 3 from level 1" "${line:-no serialised line} (a file: $fb bytes)"
fi
# a rank killed halfway through draining step 4 to level 3: level 3 has
# only a .tmp directory, level 1 the whole step; the resume takes level 1
CKPT_KILL=save:4:0 lv_run bk 1 0 --ckpt-local "$LV/bk1" --local-every 2 --ckpt-dir "$LV/bk3" --save-every 4 --async-save
local left
left=$(ls "$LV/bk3" | tr '\n' ' ')
lv_run bkr 1 0 --ckpt-local "$LV/bk1" --ckpt-dir "$LV/bk3" --resume "$LV/bk3"
# bit for bit by construction: the same state resumed on the same mesh
if [ "$left" = "step-00000004.tmp " ] && grep -q "resuming from level 1 (node-local), step 4 (level 3 has none)" "$LV/bkr.out" &&
    [ "$(lv_losses "$LV/b0.jsonl" 4)" = "$(lv_losses "$LV/bkr.jsonl" 4)" ]; then
    pass "levels: killed while draining step 4: level 3 left only step-00000004.tmp, the resume took level 1's step 4 and went on bit for bit"
else
    fail "levels: a kill during the drain" "level 3 held: $left; $(grep -E '^error|resuming' "$LV/bkr.out" | head -2)"
fi
rm -rf "$LV/b3/step-00000008" "$LV/b1/node-0/step-0000000"[48] "$LV/b1/node-0/step-00000006/rank-00000.bin"
lv_run b0r 1 0 --ckpt-local "$LV/b1" --resume "$LV/b3"
# bit for bit by construction: the same state resumed on the same mesh
if grep -q "^note: level-1 step 6: rank-00000.bin of node 0 is on no node" "$LV/b0r.out" &&
    grep -q "resuming from level 3 (durable), step 4" "$LV/b0r.out" && [ "$(lv_losses "$LV/b0.jsonl" 4)" = "$(lv_losses "$LV/b0r.jsonl" 4)" ]; then
    pass "levels: level 1's newest step has a file lost and no redundancy, its next is older than level 3's: resumed from level 3 (step 4) bit for bit, saying why"
else
    fail "levels: fall back to level 3" "$(grep -E '^error|^note|resuming' "$LV/b0r.out" | head -3)"
fi
}

# --- incremental: every 4th save full, deltas between; --keep 2 keeps the
# base; the chain resumed bit for bit, and on another mesh; the refusals
lv_inc() {
local out
lv_run i3 2 3 --dp 2 --zero 3 --ckpt-dir "$LV/i3" --save-every 1 --incremental 4 --keep 2 --save "$LV/i3.bin"
if [ "$(ls "$LV/i3" | tr '\n' ' ')" = "step-00000005 step-00000007 step-00000008 " ] &&
    grep -q "^incremental base=step-00000005 " "$LV/i3/step-00000007/MANIFEST" && [ -f "$LV/i3/step-00000007/rank-00001.delta" ]; then
    pass "levels: --incremental 4 --keep 2: steps 7 and 8 kept, and step 5, the full save step 7's delta needs"
else
    fail "levels: --incremental files" "$(ls "$LV/i3" | tr '\n' ' ')"
fi
lv_run i3r 2 3 --dp 2 --zero 3 --resume "$LV/i3/step-00000007" --save "$LV/i3r.bin"
# bit for bit by construction: base xor delta is the saved state's bytes, resumed on the same mesh
if grep -q "checkpoint: resumed from" "$LV/i3r.out" && [ "$(lv_losses "$LV/i3.jsonl" 7)" = "$(lv_losses "$LV/i3r.jsonl" 7)" ] && cmp -s "$LV/i3.bin" "$LV/i3r.bin"; then
    pass "levels: a delta (step 7) applied to its full save (step 5) resumes bit for bit"
else
    fail "levels: the delta chain" "$(grep -E '^error|resumed' "$LV/i3r.out" | head -2)"
fi
lv_run i0 1 0 --resume "$LV/i3/step-00000007"
if grep -q "checkpoint: resumed from" "$LV/i0.out" && near=$(lv_near i3 i0 7); then
    pass "levels: the delta resumes on another chapter and mesh (chapter 0: $near, within $LV_TOL and $TOL_NORM)"
else
    fail "levels: the delta on chapter 0" "${near:-} $(grep -E '^error' "$LV/i0.out" | head -2)"
fi
# another run's full save of step 5 in its place; then none at all
lv_run i3o 2 3 --dp 2 --zero 3 --seed 7 --steps 5 --ckpt-dir "$LV/i3o"
cp -r "$LV/i3" "$LV/i3x"
rm -rf "$LV/i3x/step-00000005"; cp -r "$LV/i3o/step-00000005" "$LV/i3x/step-00000005"
error_case chapter-3 2 "--dp 2 --zero 3 $LVF --resume $LV/i3x/step-00000007" "is a delta against another run's full save of step 5"
rm -rf "$LV/i3x/step-00000005"
error_case chapter-3 2 "--dp 2 --zero 3 $LVF --resume $LV/i3x/step-00000007" "is a delta against the full save of step 5, but"
# a corrupt base (the full save's rank 1 file, one byte, same size): the
# chain is checked before anything is restored, each link against its own
# manifest, so the refusal names the base file and the full save's
# manifest it failed (before, only the file restored from it in a scratch
# directory was checked, against the delta's manifest, and the line said
# so: "which the delta ... is applied to, is corrupt: the restored file's
# checksum"), and a refused resume leaves no scratch directory in TMPDIR
cp -r "$LV/i3" "$LV/i3c"
printf '\xff' | dd of="$LV/i3c/step-00000005/rank-00001.bin" bs=1 seek=2000 conv=notrunc status=none
mkdir -p "$LV/i3c_tmp"
out=$(TMPDIR="$LV/i3c_tmp" timeout 60 $MPIRUN -np 2 -x TMPDIR "$BUILD/chapter-3" --dp 2 --zero 3 $LVF --resume "$LV/i3c/step-00000007" 2>&1)
local rc=$? left
left=$(ls -A "$LV/i3c_tmp" | tr '\n' ' ')
if [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ "$(echo "$out" | grep -c '^error: ')" = 1 ] && [ -z "$left" ] &&
    echo "$out" | grep -q "^error: checkpoint '$LV/i3c/step-00000007' is a delta against the full save '$LV/i3c/step-00000005', which does not match its own manifest: checkpoint file '$LV/i3c/step-00000005/rank-00001.bin' is corrupt"; then
    pass "levels: a corrupt base of an incremental chain, checked against its own manifest before the restore: the refusal names the base file, no ckpt-restore-* directory is left in TMPDIR"
else
    fail "levels: scratch directories after a refused resume" "exit $rc; left in TMPDIR: ${left:-nothing}; $(echo "$out" | grep '^error' | head -1)"
fi
}

# --- a level-1 file changed in place (one byte, the same size) between its
# save and the drain to level 3 (the test hook CKPT_KILL=flip:4:0): the
# drain compares the copy's checksum with what level 1 wrote and refuses it,
# so level 3 never holds a step that differs from the state saved
lv_flip() {
local out rc
rm -rf "$LV/fl1" "$LV/fl3"
out=$(CKPT_KILL=flip:4:0 timeout 60 $MPIRUN -np 1 "$BUILD/chapter-0" $LVF --ckpt-local "$LV/fl1" --local-every 2 \
    --ckpt-dir "$LV/fl3" --save-every 4 2>&1)
rc=$?
if [ $rc -eq 1 ] && [ "$(echo "$out" | grep -c '^error')" = 1 ] &&
    echo "$out" | grep -q "^error: draining '$LV/fl1/node-0/step-00000004/rank-00000.bin' to '.*': the level-1 file changed since its save" &&
    [ -z "$(ls "$LV/fl3")" ]; then
    pass "levels: a level-1 file changed before its drain (same size): the drain refuses it, level 3 keeps nothing of step 4"
else
    fail "levels: a changed level-1 file at the drain" "exit $rc; level 3: $(ls "$LV/fl3" | tr '\n' ' '); $(echo "$out" | grep -E '^error|CKPT' | head -2)"
fi
}

# --- the newest level-1 step has a file lost and no redundancy: the
# resume takes the older one bit for bit, with a note saying why
lv_older() {
lv_run o0 1 0 --ckpt-local "$LV/o1" --local-every 2
rm -f "$LV/o1/node-0/step-00000008/rank-00000.bin"
lv_run o0r 1 0 --ckpt-local "$LV/o1" --resume "$LV/o1"
if grep -q "^note: level-1 step 8: rank-00000.bin of node 0 is on no node of this run (--ckpt-redundancy none was saved); an older level-1 step is taken" "$LV/o0r.out" &&
    grep -q "checkpoint: resuming from level 1 (node-local), step 6" "$LV/o0r.out" && [ "$(lv_losses "$LV/o0.jsonl" 6)" = "$(lv_losses "$LV/o0r.jsonl" 6)" ]; then
    pass "levels: level 1's newest step lost a file: the resume took step 6 bit for bit, with a note saying why"
else
    fail "levels: the fall back to an older level-1 step" "$(grep -E '^error|^note|resuming' "$LV/o0r.out" | head -3)"
fi
}

# --- one writer per level-1 directory: a second run on the same --ckpt-local
# is refused while the first runs (its first save deleted the first run's
# step-N.tmp in progress); once the first is killed its lock is stale and
# the next run takes it over with a note
lv_lock() {
local pid out rc holder i
rm -rf "$LV/lk"
timeout 300 $MPIRUN -np 1 "$BUILD/chapter-0" $LVF --steps 100000 --ckpt-local "$LV/lk" --local-every 50 >"$LV/lkA.out" 2>&1 &
pid=$!
for i in $(seq 1 600); do grep -q '^step' "$LV/lkA.out" 2>/dev/null && break; sleep 0.1; done
out=$(OMPI_MCA_odls_base_sigkill_timeout=0 timeout 60 $MPIRUN -np 2 "$BUILD/chapter-2" --dp 2 $LVF --ckpt-local "$LV/lk" --local-every 1 2>&1)
rc=$?
holder=$(cat "$LV/lk/node-0/.lock" 2>/dev/null)
{ own_kill $pid; wait $pid; } 2>/dev/null  # run A: its own processes, by pid
if [ $rc -eq 1 ] && [ "$(echo "$out" | grep -c '^error')" = 1 ] && ! echo "$out" | grep -q '^step' &&
    echo "$out" | grep -qF -- "--ckpt-local '$LV/lk/node-0' is in use by another run ($holder)" && echo "$holder" | grep -q "^pid [0-9]* on host"; then
    pass "levels: a second run on a --ckpt-local in use is refused before its first step, naming the holder ($holder)"
else
    fail "levels: the --ckpt-local lock" "exit $rc; holder '$holder'; $(echo "$out" | grep -E '^(error|step|checkpoint)' | head -2)"
fi
out=$(timeout 60 $MPIRUN -np 1 "$BUILD/chapter-0" $LVF --steps 2 --ckpt-local "$LV/lk" --local-every 1 2>&1)
rc=$?
if [ $rc -eq 0 ] && echo "$out" | grep -qF -- "note: --ckpt-local '$LV/lk/node-0': the lock of an earlier run ($holder) is stale" &&
    [ -z "$(cat "$LV/lk/node-0/.lock")" ]; then
    pass "levels: the lock of a killed run is taken over with a note, and cleared at the end"
else
    fail "levels: a stale --ckpt-local lock" "exit $rc; $(echo "$out" | grep -E '^(error|note)' | head -2)"
fi
}

# --- a level-1 save that fails (a full disk: a file size limit) leaves no
# step-N.tmp in the node's directory, as level 3 cleans up its own
lv_full() {
local out rc left
rm -rf "$LV/full"
out=$( (ulimit -f 65536; timeout 120 $MPIRUN -np 1 "$BUILD/chapter-0" --model small --steps 1 --batch 1 --seq 16 \
    --peak-gflops 10 --ckpt-local "$LV/full" --local-every 1) 2>&1)
rc=$?
left=$(ls "$LV/full/node-0" 2>/dev/null | tr '\n' ' ')
if [ $rc -eq 1 ] && echo "$out" | grep -q "^error: writing checkpoint file '.*full/node-0/step-00000001.tmp/rank-00000.bin' failed: File too large" &&
    [ -d "$LV/full/node-0" ] && [ -z "$left" ]; then
    pass "levels: a level-1 save that fails (file too large) ends the run with the file named and leaves no step-00000001.tmp"
else
    fail "levels: a failed level-1 save" "exit $rc; left in node-0: ${left:-nothing}; $(echo "$out" | grep '^error' | head -1)"
fi
}

# --- a level-1 resume that cannot write into its scratch directory (a full
# disk there: tests/fail_create.c), first the manifest's copy, then a file
# fetched from the other node (chapter 3's ZeRO-3 files read by chapter 2):
# refused with the file named, every node's .lock empty, no scratch left
lv_scratch() {
local what locks left lib
lib=$(cd "$BUILD/tests" && pwd)/libfail_create.so
lv_run sf 2 3 --dp 2 --zero 3 --ckpt-local "$LV/sf" --local-every 4 --ranks-per-node 1
for what in MANIFEST rank-00001.bin; do
    rm -rf "$LV/sft" && mkdir -p "$LV/sft"
    TMPDIR=$LV/sft TEST_FAIL_CREATE="*/ckpt-restore-*/$what" LD_PRELOAD=$lib \
        error_case chapter-2 2 "--dp 2 $LVF --ckpt-local $LV/sf --ranks-per-node 1 --resume $LV/sf" "/$what': No space left on device"
    locks=$(cat "$LV"/sf/node-*/.lock 2>/dev/null)
    left=$(ls "$LV/sft")
    if ls "$LV"/sf/node-*/.lock >/dev/null 2>&1 && [ -z "$locks" ] && [ -z "$left" ]; then
        pass "levels: a level-1 resume refused at its scratch copy of $what leaves the .lock files empty and no scratch directory"
    else
        fail "levels: the scratch refusal at $what" "lock text: ${locks:-none}; left in TMPDIR: ${left:-nothing}"
    fi
done
}

jobs_run lv_inc
jobs_run lv_scratch
jobs_run lv_xor2
jobs_run lv_xor3
jobs_run lv_partner
jobs_run lv_commit
jobs_run lv_partner3
jobs_run lv_both
jobs_run lv_full
jobs_run lv_older
jobs_run lv_lock
jobs_run lv_flip
jobs_wait

# flags that cannot work: one error: line
error_case chapter-0 1 "--ckpt-local $LV/f --ckpt-redundancy raid6" "--ckpt-redundancy raid6 is not one of none, partner, xor"
error_case chapter-0 1 "--ckpt-local $LV/f --local-every -1" "--local-every must be >= 0"
error_case chapter-0 1 "--local-every 2" "--local-every needs --ckpt-local DIR"
error_case chapter-0 1 "--ckpt-local $LV/f --ranks-per-node -2" "--ranks-per-node must be >= 0"
error_case chapter-0 1 "--ckpt-redundancy xor" "--ranks-per-node and --ckpt-redundancy need --ckpt-local DIR"
error_case chapter-2 2 "--dp 2 --ckpt-local $LV/f --ckpt-redundancy partner" "has no rank at its place (0) on another node (1 node(s))"
error_case chapter-0 1 "--ckpt-local $LV/nosuch/deeper" "cannot write --ckpt-local"
error_case chapter-0 1 "--ckpt-dir $LV/f --incremental -1" "--incremental must be >= 0"
error_case chapter-0 1 "--incremental 4" "--incremental needs --ckpt-dir DIR"
error_case chapter-0 1 "--freeze wte" "--freeze wte is not one of none, embeddings"

finish
