#!/bin/bash
# Chapter 4: tensor parallelism x FSDP. The invariant on every mesh of the
# issue ((dp, tp) = (1,2), (2,1), (2,2), (1,4) on tiny, (1,3) on small: its
# 6 heads, and a vocabulary of 256 rows split unevenly), with the gradient
# norms (replicated tensors counted once) and the validation loss;
# replicated tensors and the losses bit-identical on every tp rank; memory and every
# collective per rank against docs/04_fsdp_tp.md's formulas; the other ZeRO
# stages over dp; --save against chapter 0's file; a checkpoint read tile by
# tile; training-state checkpoints (resume on the same mesh bit for bit, on
# another mesh and chapter 0 within TOL); bad input; --help.
. "$(dirname "$0")/lib.sh"

echo "== chapter 4: tensor parallelism x FSDP"
# tp_expect Vp V maxT L NH C B T dp tp r: the doc's per-step figures for tp
# rank r (docs/04_fsdp_tp.md, "Formulas"; r matters for its vocabulary rows
# only) under ZeRO-3 with prefetch and resharding, in bytes:
#  1 tp all-reduce calls (4L + 2 activations + 1 norm)  2 their bytes
#  3 tp all-gather bytes (the cross-entropy partials)   4 dp all-gather calls (2L + 3)
#  5 dp all-gather bytes                                6 dp reduce-scatter bytes
#  7 params  8 grads  9 optimizer  10 activations (peak per rank)
#  11 dp reduce-scatter calls (L + 2)
# With TP_RECOMPUTE=selective|full (docs/recompute.md) a layer keeps less and
# one transient buffer holds the rest; full reruns each block's forward in
# backward, its 2 tp all-reduces of N*C floats included.
tp_expect() {
    local Vp=$1 V=$2 maxT=$3 L=$4 NH=$5 C=$6 B=$7 T=$8 dp=$9 tp=${10} r=${11}
    local N=$(( B / dp * T )) per=$(( (Vp + tp - 1) / tp )) Cl=$(( C / tp )) Vl
    local store=$(( 6 * C + 12 * Cl + NH / tp + 4 )) transient=0 again=0
    case ${TP_RECOMPUTE:-none} in
        selective) store=$(( 4 * C + 8 * Cl + NH / tp + 4 )) transient=$(( 2 * C + 4 * Cl )) ;;
        full) transient=$store store=$C again=$(( 2 * L )) ;;
    esac
    Vl=$(( Vp - r * per )); [ $Vl -gt $per ] && Vl=$per
    # the tp shard's units ([wte rows, wpe], L blocks, [lnfw lnfb]) and their dp shards
    local n0=$(( Vl * C + maxT * C )) nb=$(( 12 * Cl * C + 7 * Cl + 6 * C )) nf=$(( 2 * C ))
    local S0=$(( (n0 + dp - 1) / dp )) Sb=$(( (nb + dp - 1) / dp )) Sf=$(( (nf + dp - 1) / dp ))
    local S=$(( S0 + L * Sb + Sf )) Smax=$S0
    [ $Sb -gt $Smax ] && Smax=$Sb; [ $Sf -gt $Smax ] && Smax=$Sf
    local Ppad=$(( dp * S )) Umax=$(( dp * Smax )) U0=$(( dp * S0 ))
    local acts=$(( N * C + L * N * store + N * transient + N * (C + Vl + 6) + 3 * N * tp \
        + N * (C + 12 * Cl) + N * C + 2 * N ))
    echo "$(( 4 * L + 3 + again )) $(( (4 * L + 2 + again) * N * C * 4 + 4 )) $(( 3 * N * tp * 4 )) $(( 2 * L + 3 ))" \
         "$(( 4 * (Ppad + U0 + L * dp * Sb) )) $(( 4 * Ppad ))" \
         "$(( 4 * (S + 2 * Umax) )) $(( 4 * (S + Umax + U0) )) $(( 8 * S )) $(( 4 * acts )) $(( L + 2 ))"
}
# tp_ranks K M Vp V maxT L NH C B T dp tp: field K of tp_expect for every world
# rank (tp is the mesh's fastest axis), times M: "[a,b,...]"
tp_ranks() {
    local k=$1 mul=$2 out="" w np v
    shift 2
    np=$(( $9 * ${10} ))
    for ((w = 0; w < np; w++)); do
        v=$(tp_expect "$@" $(( w % ${10} )) | cut -d' ' -f$k)
        out="$out${out:+,}$(( v * mul ))"
    done
    echo "[$out]"
}
# tp_case dp tp "REF_FLAGS" B T Vp V maxT L NH C: the invariant (losses, norms,
# validation loss, the replica check's line), then the summary's counters over
# the 10 steps and peak memory, every rank, against the formulas
tp_case() {
    local dp=$1 tp=$2 ref_flags=$3 B=$4 T=$5 np=$(( $1 * $2 )) name="chapter 4 dp=$1 tp=$2${TP_FLAGS:+ $TP_FLAGS}" sum sz e
    shift 5
    # replicas bit-identical by construction: every tp rank runs the same ops on the same all-reduced bytes
    invariant --norm --val --expect "bit-identical on every tp rank" "$name ($ref_flags)" "$ref_flags" $np \
        chapter-4 "--dp $dp --tp $tp ${TP_FLAGS:-}"
    sum=$(grep '"type":"summary"' "$INV_LOG")
    sz="$* $B $T $dp $tp"
    read -r -a e <<< "$(tp_expect $sz 0)"
    local want=(
        "{\"allreduce\":{\"dp\":{\"calls\":$(rank_array 10 $np),\"bytes\":$(rank_array 40 $np),"
        "\"tp\":{\"calls\":$(tp_ranks 1 10 $sz),\"bytes\":$(tp_ranks 2 10 $sz),"
        "\"reduce_scatter\":{\"dp\":{\"calls\":$(tp_ranks 11 10 $sz),\"bytes\":$(tp_ranks 6 10 $sz),"
        "\"allgather\":{\"dp\":{\"calls\":$(tp_ranks 4 10 $sz),\"bytes\":$(tp_ranks 5 10 $sz),"
        "\"tp\":{\"calls\":$(rank_array 10 $np),\"bytes\":$(tp_ranks 3 10 $sz),")
    local comm_ok=1 piece
    for piece in "${want[@]}"; do echo "$sum" | grep -qF -- "$piece" || comm_ok=0; done
    if [ $comm_ok = 1 ]; then
        pass "$name: per step ${e[0]} tp all-reduces (${e[1]} bytes), 1 tp all-gather (${e[2]}), ${e[3]} dp all-gathers (${e[4]}), ${e[10]} reduce-scatters (${e[5]}) on tp rank 0 = formula"
    else
        fail "$name: comm" "want (tp rank 0, per step) ${e[*]:0:6}; got $(echo "$sum" | sed 's/.*"comm":\({.*}\),"comm_wait_s".*/\1/')"
    fi
    local want_mem="\"peak_bytes\":{\"params\":$(tp_ranks 7 1 $sz),\"grads\":$(tp_ranks 8 1 $sz),\"optimizer\":$(tp_ranks 9 1 $sz),\"activations\":$(tp_ranks 10 1 $sz),"
    if echo "$sum" | grep -qF -- "$want_mem"; then
        pass "$name: peak params/grads/optimizer/activations per rank = formula (tp rank 0: ${e[6]}/${e[7]}/${e[8]}/${e[9]} bytes)"
    else
        fail "$name: memory" "want $want_mem; got $(echo "$sum" | sed 's/.*"peak_bytes":{\([^}]*\)}.*/\1/')"
    fi
    # ZeRO-3 with prefetch and resharding (the default): chapter 3's count,
    # 2L of the 2L + 3 gathers a step started ahead (each block's twice)
    if echo "$sum" | grep -qE "\"gathers_prefetched_per_step\":$((2 * $4))[,}]"; then
        pass "$name: $((2 * $4)) unit gathers per step started ahead by prefetch (2L)"
    else
        fail "$name: prefetch" "want $((2 * $4)); got $(echo "$sum" | grep -o '"gathers_prefetched_per_step":[^,}]*')"
    fi
}
tiny_sizes="256 256 64 2 4 64"  # Vp V maxT L NH C
for mesh in "1 2" "2 1" "2 2" "1 4"; do
    tp_case ${mesh% *} ${mesh#* } "$INV_FLAGS" $INV_BATCH $INV_SEQ $tiny_sizes
    [ "$mesh" = "2 2" ] && NONE_LOG=$INV_LOG
done
# --recompute on (dp, tp) = (2, 2): the invariant, the formulas (a layer keeps
# less, one transient holds the rest; full's recomputed forward issues its 2
# tp all-reduces per layer again), and the same losses and norms as none, bit
# for bit (the recomputed tensors are the same ops on the same inputs)
rc4_steps() { grep '"type":"step"' "$1" | sed 's/,"ms":.*//'; }
for md in selective full; do
    TP_RECOMPUTE=$md TP_FLAGS="--recompute $md" tp_case 2 2 "$INV_FLAGS" $INV_BATCH $INV_SEQ $tiny_sizes
    # bit for bit by construction: the same calls on the same rows, recomputed
    if [ -s "$INV_LOG" ] && [ "$(rc4_steps "$INV_LOG")" = "$(rc4_steps "$NONE_LOG")" ]; then
        pass "chapter 4 dp=2 tp=2 --recompute $md logs the same 10 losses and norms as none, bit for bit"
    else
        fail "chapter 4 dp=2 tp=2 --recompute $md" "$(diff <(rc4_steps "$INV_LOG") <(rc4_steps "$NONE_LOG") | head -4)"
    fi
done
tp_case 1 3 "--model small --steps 10 --batch 4 --seq 64 --peak-gflops 10" 4 64 256 256 256 6 6 384

# the other ZeRO stages, and ZeRO-3 without prefetch or resharding, over dp
# with tp = 2 (the engine is chapter 3's and tested there)
for zf in "--zero 1" "--zero 2" "--zero 3 --prefetch 0 --reshard 0"; do
    invariant "chapter 4 dp=2 tp=2 $zf" "$INV_FLAGS" 4 chapter-4 "--dp 2 --tp 2 $zf"
done
# weight decay on every parameter, the tp-sharded tiles and the replicated
# ones alike (chapter 0 decays all of them, as llm.c does)
invariant --val "chapter 4 dp=2 tp=2 --wd 0.1" "$INV_FLAGS --wd 0.1" 4 chapter-4 "--dp 2 --tp 2"

# --save from (dp, tp) = (2, 2) writes the reference's model after the same 3
# steps: the same header, every parameter within 1e-4 (a tenth of one AdamW
# step at lr 1e-3; a misplaced tile is off by ~0.02, the init's scale; the
# largest difference measured is 1.33e-5, chapter 2's and 3's 3.2e-6), and
# chapter 0 loading it reaches the reference's validation loss within TOL
save_flags="--steps 3 --batch 24 --seq 32 --peak-gflops 10"
ref_saved=$TEST_TMPDIR/tp_ref_saved.bin
tp_saved=$TEST_TMPDIR/tp_saved.bin
mpi_run $T_RUN 1 "$BUILD/chapter-0" $save_flags --save "$ref_saved"
vref=$(echo "$OUT" | grep 'val loss' | tail -1 | sed 's/.*val loss //')
mpi_run $T_RUN 4 "$BUILD/chapter-4" --dp 2 --tp 2 $save_flags --save "$tp_saved"
mpi_run $T_RUN 1 "$BUILD/chapter-0" --model "$tp_saved" --steps 0 --batch 24 --seq 32 --peak-gflops 10
vtp=$(echo "$OUT" | grep 'val loss' | tail -1 | sed 's/.*val loss //')
pdiff=$(paste <(od -A n -v -t f4 -j 1024 -w4 "$ref_saved") <(od -A n -v -t f4 -j 1024 -w4 "$tp_saved") | awk '
    { n++; d = $1 - $2; if (d < 0) d = -d; if (d > m) m = d } END { printf "%d %.3g", n, m }')
if [ -f "$tp_saved" ] && cmp -s -n 1024 "$ref_saved" "$tp_saved" && [ "${pdiff% *}" = 120576 ] &&
    awk -v d="${pdiff#* }" -v a="$vref" -v b="$vtp" -v tol="$TOL" 'BEGIN { e = a - b; if (e < 0) e = -e; exit !(d <= 1e-4 && a != "" && b != "" && e <= tol) }'; then
    pass "chapter 4: --save on dp=2 tp=2 writes the reference's model (max |dparam| ${pdiff#* } over ${pdiff% *}; val loss $vtp vs $vref)"
else
    fail "chapter 4: --save" "params compared/max diff '$pdiff', val loss '$vtp' vs reference '$vref'"
fi
# a checkpoint read tile by tile on tp = 4 gives chapter 0's first loss
mpi_run $T_SHORT 4 "$BUILD/chapter-4" --tp 4 --model "$ref_saved" --batch 24 --seq 32 --steps 1 --peak-gflops 10
l4=$(echo "$OUT" | step_losses | head -1)
mpi_run $T_SHORT 1 "$BUILD/chapter-0" --model "$ref_saved" --batch 24 --seq 32 --steps 1 --peak-gflops 10
l0=$(echo "$OUT" | step_losses | head -1)
if [ -n "$l4" ] && awk -v a="$l4" -v b="$l0" -v tol="$TOL" 'BEGIN { e = a - b; if (e < 0) e = -e; exit !(b != "" && e <= tol) }'; then
    pass "chapter 4: a checkpoint loaded tile by tile on tp=4 gives chapter 0's loss ($l4 vs $l0)"
else
    fail "chapter 4: sharded load" "tp=4 '$l4' vs chapter 0 '$l0'"
fi

# Training-state checkpoints (docs/checkpoints.md): each rank writes its dp
# shard of its tiles (a tp column slice is a strided slice of the global
# tensor), a replicated tile once (tp rank 0). On the invariant's run, saved
# at step 5: (dp, tp) = (2, 2) resumed on the same mesh repeats its
# uninterrupted run bit for bit (losses, norms, the final --save); the same
# checkpoint resumed on another mesh (tp = 4) and by chapter 0, and chapter
# 0's resumed by (2, 2) under ZeRO-1 (whole parameters, written by dp rank 0)
# and saved again at step 7 for chapter 0, continue chapter 0's losses.
CK4=$TEST_TMPDIR/ckpt4
rm -rf "$CK4" && mkdir -p "$CK4"
# ck4_cmp REF RUN TOL FIRST: RUN logged exactly steps FIRST..9, each step's
# loss within TOL of REF's same step and its norm within TOL_NORM (TOL 0:
# the same printed digits for both)
ck4_cmp() {
    local ntol=$TOL_NORM
    [ "$3" = 0 ] && ntol=0
    awk -v tol="$3" -v ntol="$ntol" -v first="$4" '
        FNR == 1 { file++ }
        /"type":"step"/ {
            match($0, /"step":[0-9]+/); s = substr($0, RSTART + 7, RLENGTH - 7) + 0
            match($0, /"loss":[-0-9.e]+/); l = substr($0, RSTART + 7, RLENGTH - 7)
            match($0, /"norm":[-0-9.e]+/); n = substr($0, RSTART + 7, RLENGTH - 7)
            if (file == 1) { rl[s] = l; rn[s] = n; next }
            if (s != first + seen || !(s in rl)) bad = 1
            seen++
            d = l - rl[s]; if (d < 0) d = -d; if (d > max) max = d
            d = n - rn[s]; if (d < 0) d = -d; if (d > maxn) maxn = d
        }
        END { printf "steps %d..%d, max |dloss| %.1e, |dnorm| %.1e", first, first + seen - 1, max, maxn
              exit (!bad && seen == 10 - first && max <= tol && maxn <= ntol) ? 0 : 1 }' "$1" "$2"
}
# ck4_case NAME DESCRIPTION REF TOL FIRST NP PROGRAM FLAGS... [-- BIN_A BIN_B]
ck4_case() {
    local name=$1 what=$2 ref=$3 tol=$4 first=$5 np=$6 prog=$7 a="" b="" cmp ok=1 args=()
    shift 7
    while [ $# -gt 0 ] && [ "$1" != -- ]; do args+=("$1"); shift; done
    [ "${1:-}" = -- ] && a=$2 b=$3
    mpi_run $T_RUN "$np" "$BUILD/$prog" $INV_FLAGS "${args[@]}" --log "$CK4/$name.jsonl"
    [ $RC = 0 ] || ok=0
    cmp=$(ck4_cmp "$ref" "$CK4/$name.jsonl" "$tol" "$first") || ok=0
    echo "$OUT" | grep -q "checkpoint: resumed from" || { ok=0; cmp="$cmp, not resumed"; }
    if [ -n "$a" ]; then
        # bit for bit by construction: only same-mesh resumes pass BIN_A BIN_B (the same calls on the same rows)
        if cmp -s "$a" "$b"; then cmp="$cmp, final parameters bit-identical"; else ok=0; cmp="$cmp, final parameters DIFFER"; fi
    fi
    if [ $ok = 1 ]; then pass "checkpoint: $what ($cmp)"
    else fail "checkpoint: $what" "exit $RC; $cmp; command: $CMD; $(echo "$OUT" | grep -E 'error' | head -3)"; fi
}
invariant "checkpoint: chapter 4 dp=2 tp=2 saving at steps 5 and 10" "$INV_FLAGS" 4 chapter-4 \
    "--dp 2 --tp 2 --ckpt-dir $CK4/a --save-every 5 --save $CK4/a.bin"
A_LOG=$INV_LOG
reference "$INV_FLAGS"
files=$(ls "$CK4/a/step-00000005" 2>/dev/null | tr '\n' ' ')
if [ "$files" = "MANIFEST rank-00000.bin rank-00001.bin rank-00002.bin rank-00003.bin " ]; then
    pass "checkpoint: chapter 4 dp=2 tp=2 writes one file per rank and the manifest"
else
    fail "checkpoint: chapter 4 files" "step-00000005 holds '$files'"
fi
# bit for bit by construction: the same calls on the same rows (a resume on the same mesh)
ck4_case a_r "chapter 4 dp=2 tp=2 resumed at step 5 repeats its uninterrupted run bit for bit" "$A_LOG" 0 5 \
    4 chapter-4 --dp 2 --tp 2 --resume "$CK4/a/step-00000005" --save "$CK4/a_r.bin" -- "$CK4/a.bin" "$CK4/a_r.bin"
ck4_case tp4 "chapter 4 tp=4 resumed from dp=2 tp=2's step 5 (another mesh) continues chapter 0's losses" "$REF" $TOL 5 \
    4 chapter-4 --tp 4 --resume "$CK4/a/step-00000005"
ck4_case c0r "chapter 0 resumed from chapter 4 dp=2 tp=2's step 5 continues chapter 0's losses" "$REF" $TOL 5 \
    1 chapter-0 --resume "$CK4/a/step-00000005"
mpi_run $T_RUN 1 "$BUILD/chapter-0" $INV_FLAGS --ckpt-dir "$CK4/c0" --save-every 5
ck4_case z1 "chapter 4 dp=2 tp=2 ZeRO-1 resumed from chapter 0's step 5 continues chapter 0's losses" "$REF" $TOL 5 \
    4 chapter-4 --dp 2 --tp 2 --zero 1 --resume "$CK4/c0/step-00000005" --ckpt-dir "$CK4/z1" --save-every 7
ck4_case z1c0 "chapter 0 resumed from that ZeRO-1 run's step 7 continues chapter 0's losses" "$REF" $TOL 7 \
    1 chapter-0 --resume "$CK4/z1/step-00000007"

bad_inputs
jobs_run error_case chapter-4 3 "--tp 3" "the model's 4 heads do not split over tp=3"
jobs_run error_case chapter-4 2 "--dp 2 --zero 4" "--zero 4: the stages are 1, 2 and 3"
jobs_run error_case chapter-4 2 "--dp 2 --batch 3" "does not split over dp=2"
jobs_run error_case chapter-4 2 "--tp 2 --model $TEST_TMPDIR/truncated.bin" "truncated or corrupt"
jobs_run error_case chapter-4 2 "--pp 2" "--pp"
jobs_run error_case chapter-4 4 "--tp 2" "has 2 ranks but mpirun started 4"
jobs_run help_case chapter-4 "--tp N"
# a padded vocabulary too small for tp: 6 rows over tp = 4 are 2, 2, 2 and
# none for the last rank (a 1-layer model file with V = Vp = 6, 4 heads, and
# token ids below 6, so that the data passes and the mesh check speaks)
python3 -c "
import struct
V, Vp, maxT, L, NH, C = 6, 6, 16, 1, 4, 8
h = [0] * 256; h[:8] = [20240326, 3, maxT, V, L, NH, C, Vp]
P = Vp * C + maxT * C + L * (12 * C * C + 13 * C) + 2 * C
open('$TEST_TMPDIR/vocab6.bin', 'wb').write(struct.pack('256i', *h) + struct.pack('%df' % P, *([0.01] * P)))
h = [0] * 256; h[:3] = [20240520, 1, 2048]
open('$TEST_TMPDIR/tokens6.bin', 'wb').write(struct.pack('256i', *h) + struct.pack('2048H', *[i % 6 for i in range(2048)]))
"
jobs_run error_case chapter-4 4 "--tp 4 --model $TEST_TMPDIR/vocab6.bin --data $TEST_TMPDIR/tokens6.bin --seq 8" \
    "the model's padded vocabulary of 6 rows, 2 a rank, leaves rank 3 of tp=4 none: use a smaller tp"
# two ranks past the last piece: 7 rows, 2 a rank, on tp = 6 (it said "the last")
python3 tests/make_model.py "$TEST_TMPDIR/vocab7.bin" 7 7 16 1 6 12
jobs_run error_case chapter-4 6 "--tp 6 --model $TEST_TMPDIR/vocab7.bin --data $TEST_TMPDIR/tokens6.bin --seq 8 --batch 6" \
    "the model's padded vocabulary of 7 rows, 2 a rank, leaves ranks 4 to 5 of tp=6 none"

jobs_run error_case chapter-4 2 "--tp 2 --recompute some" "--recompute some is not one of none, selective, full"
jobs_wait  # the error cases and --help are independent: 2 at a time

finish
