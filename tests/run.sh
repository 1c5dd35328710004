#!/bin/bash
# The one test runner: `make test` calls it after building everything.
#
#   bash tests/run.sh              everything: unit.sh, chapter_0.sh,
#                                  chapter_1.sh, ... (every tests/chapter_N.sh
#                                  there is, in order), then the topic scripts
#                                  of TOPICS (comm, hardening, docs, plots, gpu)
#   bash tests/run.sh 2            one chapter's script, tests/chapter_2.sh
#                                  (`make test CHAPTER=2`)
#   bash tests/run.sh 0 unit gpu   several: a number N is tests/chapter_N.sh,
#                                  a word W is tests/W.sh
#
# Every script sources tests/lib.sh and counts its own checks; this runner
# sums them and ends with the one line "N passed, N failed, N skipped". It
# exits non-zero when a check failed or a script ended without its counts.
# The scripts share one scratch directory, so a run they have in common (the
# reference of the invariant, a saved checkpoint) is made once.
set -u
cd "$(dirname "$0")/.."
TEST_TMPDIR=$(mktemp -d)
export TEST_TMPDIR
trap 'rm -rf "$TEST_TMPDIR"' EXIT

# the scripts that are not a chapter's, in the order a full run takes them
TOPICS="comm hardening docs plots gpu"
scripts=()
if [ $# -eq 0 ]; then
    scripts+=(tests/unit.sh)
    # chapter scripts by number, so chapter_10 would follow chapter_9
    for f in $(ls tests/chapter_*.sh | sort -t_ -k2 -n); do scripts+=("$f"); done
    # topic scripts: every program's hardening, the docs, the plots, the GPU
    for t in $TOPICS; do scripts+=("tests/$t.sh"); done
else
    for a in "$@"; do
        case $a in
            [0-9]*) f=tests/chapter_$a.sh ;;
            *) f=tests/$a.sh ;;
        esac
        if [ ! -f "$f" ]; then
            echo "error: no test script $f for '$a'; there are: $(cd tests && ls chapter_*.sh unit.sh; for t in $TOPICS; do echo "$t.sh"; done | tr '\n' ' ')" >&2
            exit 2
        fi
        scripts+=("$f")
    done
fi

passed=0
failed=0
skipped=0
for f in "${scripts[@]}"; do
    counts=$TEST_TMPDIR/counts
    rm -f "$counts"
    start=$(date +%s)
    TEST_COUNTS=$counts bash "$f"
    rc=$?
    if [ -s "$counts" ]; then
        read -r p q s < "$counts"
    else
        # a script that stops early (a syntax error, an exit) fails as a whole
        echo "FAIL $f: ended (exit $rc) before reaching finish; its checks are not counted"
        p=0 q=1 s=0
    fi
    passed=$((passed + p)) failed=$((failed + q)) skipped=$((skipped + s))
    echo "-- $f: $p pass, $q fail, $s skip ($(($(date +%s) - start)) s)"
done

# ==== new tests: chapter 4 ====
echo "== chapter 4: tensor parallelism x data parallelism"
# The invariant on every mesh the issue lists: chapter 0's losses and gradient
# norms (TOL, TOL_NORM as chapter 2 states them) over 10 steps, replicated
# tensors bit-identical on every tp rank, and the step's communication and
# memory exactly as docs/04_fsdp_tp.md's formulas give them.
tp_ref=$TEST_TMPDIR/tp_ref.jsonl
timeout 120 $MPIRUN -np 1 "$BUILD/chapter-0" --steps 10 --batch 24 --seq 32 --peak-gflops 10 --log "$tp_ref" >/dev/null 2>&1
# tp_expect Vp V maxT L NH C B T dp tp r: the doc's per-step figures for tp
# rank r (docs/04_fsdp_tp.md, section 3; r matters for its vocabulary rows
# only) under ZeRO-3 with prefetch and resharding, in bytes:
#  1 tp all-reduce calls (4L + 2 activations + 1 norm)  2 their bytes
#  3 tp all-gather bytes (the cross-entropy partials)   4 dp all-gather calls (2L + 3)
#  5 dp all-gather bytes                                6 dp reduce-scatter bytes (L + 2 calls)
#  7 params  8 grads  9 optimizer  10 activations (peak per rank)
#  11 dp reduce-scatter calls (L + 2)
tp_expect() {
    local Vp=$1 V=$2 maxT=$3 L=$4 NH=$5 C=$6 B=$7 T=$8 dp=$9 tp=${10} r=${11}
    local N=$(( B / dp * T )) per=$(( (Vp + tp - 1) / tp )) Cl=$(( C / tp )) Vl
    Vl=$(( Vp - r * per )); [ $Vl -gt $per ] && Vl=$per
    # the tp shard's units ([wte rows, wpe], L blocks, [lnfw lnfb]) and their dp shards
    local n0=$(( Vl * C + maxT * C )) nb=$(( 12 * Cl * C + 7 * Cl + 6 * C )) nf=$(( 2 * C ))
    local S0=$(( (n0 + dp - 1) / dp )) Sb=$(( (nb + dp - 1) / dp )) Sf=$(( (nf + dp - 1) / dp ))
    local S=$(( S0 + L * Sb + Sf )) Smax=$S0
    [ $Sb -gt $Smax ] && Smax=$Sb; [ $Sf -gt $Smax ] && Smax=$Sf
    local Ppad=$(( dp * S )) Umax=$(( dp * Smax )) U0=$(( dp * S0 ))
    local acts=$(( N * C + L * N * (6 * C + 12 * Cl + NH / tp * T + 4) + N * (C + Vl + 6) + 3 * N * tp \
        + N * (C + 12 * Cl + NH / tp * T) + N * C + 2 * N ))
    echo "$(( 4 * L + 3 )) $(( (4 * L + 2) * N * C * 4 + 4 )) $(( 3 * N * tp * 4 )) $(( 2 * L + 3 ))" \
         "$(( 4 * (Ppad + U0 + L * dp * Sb) )) $(( 4 * Ppad ))" \
         "$(( 4 * (S + 2 * Umax) )) $(( 4 * (S + Umax + U0) )) $(( 8 * S )) $(( 4 * acts )) $(( L + 2 ))"
}
# field K of tp_expect for every world rank (tp is the fastest axis), times M: "[a,b,...]"
tp_ranks() {  # K M Vp V maxT L NH C B T dp tp
    local k=$1 mul=$2 out="" w np v
    shift 2
    np=$(( $9 * ${10} ))
    for ((w = 0; w < np; w++)); do
        v=$(tp_expect "$@" $(( w % ${10} )) | cut -d' ' -f$k)
        out="$out${out:+,}$(( v * mul ))"
    done
    echo "[$out]"
}
tp_same() {  # value np -> "[value,...]"
    local out="" w
    for ((w = 0; w < $2; w++)); do out="$out${out:+,}$1"; done
    echo "[$out]"
}
tp_case() {  # dp tp ref flags model-sizes (Vp V maxT L NH C)
    local dp=$1 tp=$2 ref=$3 flags=$4 np=$(( $1 * $2 )) run=$TEST_TMPDIR/tp_run.jsonl out rc cmp crc ncmp nrc sum
    shift 4
    rm -f "$run"
    out=$(timeout 300 $MPIRUN -np $np "$BUILD/chapter-4" --dp $dp --tp $tp $flags --steps 10 --peak-gflops 10 --log "$run" 2>&1)
    rc=$?
    cmp=$(bash tests/compare_losses.sh "$ref" "$run" $TOL 2>&1)
    crc=$?
    ncmp=$(bash tests/compare_losses.sh "$ref" "$run" $TOL_NORM norm 2>&1)
    nrc=$?
    local name="chapter 4 dp=$dp tp=$tp ($flags)" vref vrun
    sum=$(grep '"type":"summary"' "$run")
    # the final validation loss, through the same sharded forward
    vref=$(grep '"type":"val"' "$ref" | tail -1 | sed 's/.*"val_loss":\([-0-9.e]*\).*/\1/')
    vrun=$(grep '"type":"val"' "$run" | tail -1 | sed 's/.*"val_loss":\([-0-9.e]*\).*/\1/')
    if [ $rc -eq 0 ] && [ $crc -eq 0 ] && [ $nrc -eq 0 ] && echo "$out" | grep -q 'bit-identical on every tp rank' &&
        [ -n "$vrun" ] && awk -v a="$vref" -v b="$vrun" -v tol="$TOL" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= tol) }'; then
        pass "$name: chapter 0's losses ($cmp), norms ($ncmp) and val loss ($vrun); replicated tensors bit-identical across tp"
    else
        fail "$name" "exit $rc; $cmp; $ncmp; val loss '$vrun' vs '$vref'; $(echo "$out" | grep -E 'replicated|error' | head -3)"
    fi
    local B T sz e
    B=$(echo "$flags" | sed 's/.*--batch \([0-9]*\).*/\1/'); T=$(echo "$flags" | sed 's/.*--seq \([0-9]*\).*/\1/')
    sz="$* $B $T $dp $tp"
    read -r -a e <<< "$(tp_expect $sz 0)"
    # counters over the 10 steps, every rank
    local want_comm
    want_comm="{\"allreduce\":{\"dp\":{\"calls\":$(tp_same 10 $np),\"bytes\":$(tp_same 40 $np),"
    want_comm="$want_comm|\"tp\":{\"calls\":$(tp_ranks 1 10 $sz),\"bytes\":$(tp_ranks 2 10 $sz),"
    want_comm="$want_comm|\"reduce_scatter\":{\"dp\":{\"calls\":$(tp_ranks 11 10 $sz),\"bytes\":$(tp_ranks 6 10 $sz),"
    want_comm="$want_comm|\"allgather\":{\"dp\":{\"calls\":$(tp_ranks 4 10 $sz),\"bytes\":$(tp_ranks 5 10 $sz),"
    want_comm="$want_comm|\"tp\":{\"calls\":$(tp_same 10 $np),\"bytes\":$(tp_ranks 3 10 $sz),"
    local comm_ok=1 piece
    IFS='|' read -r -a pieces <<< "$want_comm"
    for piece in "${pieces[@]}"; do echo "$sum" | grep -qF -- "$piece" || comm_ok=0; done
    if [ $comm_ok = 1 ]; then
        pass "$name: per step ${e[0]} tp all-reduces ($((e[1])) bytes), 1 tp all-gather (${e[2]}), ${e[3]} dp all-gathers (${e[4]}), ${e[10]} reduce-scatters (${e[5]}) on tp rank 0 = formula"
    else
        fail "$name: comm" "want (tp rank 0, per step) $(echo "${e[@]:0:6}"); got $(echo "$sum" | sed 's/.*"comm":\({.*}\),"comm_wait_s".*/\1/')"
    fi
    local want_mem="\"peak_bytes\":{\"params\":$(tp_ranks 7 1 $sz),\"grads\":$(tp_ranks 8 1 $sz),\"optimizer\":$(tp_ranks 9 1 $sz),\"activations\":$(tp_ranks 10 1 $sz),"
    if echo "$sum" | grep -qF -- "$want_mem"; then
        pass "$name: peak params/grads/optimizer/activations per rank = formula (tp rank 0: ${e[6]}/${e[7]}/${e[8]}/${e[9]} bytes)"
    else
        fail "$name: memory" "want $want_mem; got $(echo "$sum" | sed 's/.*"peak_bytes":{\([^}]*\)}.*/\1/')"
    fi
}
tiny_sizes="256 256 64 2 4 64"
for mesh in "1 2" "2 1" "2 2" "1 4"; do
    tp_case ${mesh% *} ${mesh#* } "$tp_ref" "--batch 24 --seq 32" $tiny_sizes
done
# small (NH = 6) on tp = 3: heads 2 per rank, and the 256 vocabulary rows split 86/86/84
small_ref=$TEST_TMPDIR/tp_small_ref.jsonl
timeout 300 $MPIRUN -np 1 "$BUILD/chapter-0" --model small --steps 10 --batch 4 --seq 64 --peak-gflops 10 --log "$small_ref" >/dev/null 2>&1
tp_case 1 3 "$small_ref" "--model small --batch 4 --seq 64" 256 256 256 6 6 384
# the other ZeRO stages and ZeRO-3 without prefetch or resharding, over dp
# with tp = 2: the same losses (the engine is chapter 3's, tested there)
for zf in "--zero 1" "--zero 2" "--zero 3 --prefetch 0 --reshard 0"; do
    zrun=$TEST_TMPDIR/tp_zero.jsonl
    rm -f "$zrun"
    out=$(timeout 300 $MPIRUN -np 4 "$BUILD/chapter-4" --dp 2 --tp 2 $zf --batch 24 --seq 32 --steps 10 --peak-gflops 10 --log "$zrun" 2>&1)
    rc=$?
    cmp=$(bash tests/compare_losses.sh "$tp_ref" "$zrun" $TOL 2>&1)
    crc=$?
    if [ $rc -eq 0 ] && [ $crc -eq 0 ]; then
        pass "chapter 4 dp=2 tp=2 $zf: chapter 0's losses ($cmp)"
    else
        fail "chapter 4 dp=2 tp=2 $zf" "exit $rc; $cmp; $(echo "$out" | grep -E 'error' | head -3)"
    fi
done
# --save from (dp, tp) = (2, 2) writes the reference's model after the same 3
# steps: the same header, every parameter within 1e-4 (a tenth of one AdamW
# step at lr 1e-3; a misplaced tile is off by ~0.02, the init's scale), and
# chapter 0 loading it reaches the reference's validation loss within TOL
tp_saved=$TEST_TMPDIR/tp_saved.bin
ref_saved=$TEST_TMPDIR/tp_ref_saved.bin
vref=$(timeout 120 $MPIRUN -np 1 "$BUILD/chapter-0" --steps 3 --batch 24 --seq 32 --peak-gflops 10 --save "$ref_saved" 2>&1 | grep 'val loss' | tail -1 | sed 's/.*val loss //')
timeout 120 $MPIRUN -np 4 "$BUILD/chapter-4" --dp 2 --tp 2 --steps 3 --batch 24 --seq 32 --peak-gflops 10 --save "$tp_saved" >/dev/null 2>&1
vtp=$(timeout 120 $MPIRUN -np 1 "$BUILD/chapter-0" --model "$tp_saved" --steps 0 --batch 24 --seq 32 --peak-gflops 10 2>&1 | grep 'val loss' | tail -1 | sed 's/.*val loss //')
pdiff=$(paste <(od -A n -v -t f4 -j 1024 -w4 "$ref_saved") <(od -A n -v -t f4 -j 1024 -w4 "$tp_saved") | awk '
    { n++; d = $1 - $2; if (d < 0) d = -d; if (d > m) m = d } END { printf "%d %.3g", n, m }')
if [ -f "$tp_saved" ] && cmp -s -n 1024 "$ref_saved" "$tp_saved" && [ "${pdiff% *}" = 120576 ] &&
    awk -v d="${pdiff#* }" -v a="$vref" -v b="$vtp" -v tol="$TOL" 'BEGIN { e = a - b; if (e < 0) e = -e; exit !(d <= 1e-4 && a != "" && e <= tol) }'; then
    pass "chapter 4: --save on dp=2 tp=2 writes the reference's model (max |dparam| ${pdiff#* } over ${pdiff% *}; val loss $vtp vs $vref)"
else
    fail "chapter 4: --save" "params compared/max diff '$pdiff', val loss '$vtp' vs reference '$vref'"
fi
# a checkpoint read tile by tile gives the reference's first loss
l4=$(timeout 60 $MPIRUN -np 4 "$BUILD/chapter-4" --tp 4 --model "$ref_saved" --batch 24 --seq 32 --steps 1 --peak-gflops 10 2>&1 | grep 'step    0/1' | sed 's/.*loss \([0-9.]*\).*/\1/')
l0=$(timeout 60 $MPIRUN -np 1 "$BUILD/chapter-0" --model "$ref_saved" --batch 24 --seq 32 --steps 1 --peak-gflops 10 2>&1 | grep 'step    0/1' | sed 's/.*loss \([0-9.]*\).*/\1/')
if [ -n "$l4" ] && awk -v a="$l4" -v b="$l0" -v tol="$TOL" 'BEGIN { e = a - b; if (e < 0) e = -e; exit !(e <= tol) }'; then
    pass "chapter 4: a checkpoint loaded tile by tile on tp=4 gives chapter 0's loss ($l4 vs $l0)"
else
    fail "chapter 4: sharded load" "tp=4 '$l4' vs chapter 0 '$l0'"
fi
error_case chapter-4 3 "--tp 3" "the model's 4 heads do not split over tp=3"
error_case chapter-4 2 "--dp 2 --zero 4" "--zero 4: the stages are 1, 2 and 3"
error_case chapter-4 2 "--dp 2 --batch 3" "does not split over dp=2"
error_case chapter-4 2 "--tp 2 --model $TEST_TMPDIR/truncated.bin" "truncated or corrupt"
error_case chapter-4 2 "--pp 2" "--pp"
error_case chapter-4 4 "--tp 2" "has 2 ranks but mpirun started 4"
help_case chapter-4 "--tp N"
gpu_invariant "chapter 4 tp=2" 4 "--tp 2"
# ==== end of new tests: chapter 4 ====

echo
echo "$passed passed, $failed failed, $skipped skipped"
[ $failed -eq 0 ]
