#!/bin/bash
# Chapter 6: context parallelism. Ring attention over a simulated ring
# against whole-sequence attention (test_ring); the invariant for ring (none
# and zigzag) and Ulysses on cp = 2 and 4 (Ulysses over zigzag at cp = 2)
# and for dp x cp = 2 x 2; the cp
# traffic, the gradient all-reduce and the memory per rank against their
# formulas; --recompute (the same bits, memory and traffic per formula); bad
# meshes and flags; --help.
. "$(dirname "$0")/lib.sh"

echo "== chapter 6: context parallelism"
run_program "$BUILD/tests/test_ring"

# the invariant: chapter 0's losses, gradient norms and validation loss
invariant --norm --val "cp=2 ring" "$INV_FLAGS" 2 chapter-6 "--cp 2"
RING2=$INV_LOG
invariant --norm --val "cp=2 ring zigzag" "$INV_FLAGS" 2 chapter-6 "--cp 2 --cp-balance zigzag"
invariant --norm --val "cp=4 ring" "$INV_FLAGS" 4 chapter-6 "--cp 4"
invariant --norm --val "cp=4 ring zigzag" "$INV_FLAGS" 4 chapter-6 "--cp 4 --cp-balance zigzag"
RING4=$INV_LOG
invariant --norm --val "cp=2 ulysses" "$INV_FLAGS" 2 chapter-6 "--cp 2 --cp-mode ulysses"
ULY2=$INV_LOG
invariant --norm --val "cp=4 ulysses" "$INV_FLAGS" 4 chapter-6 "--cp 4 --cp-mode ulysses"
ULY4=$INV_LOG
# Ulysses over zigzag's layout: its all-to-alls move each rank's two parts
invariant --norm --val "cp=2 ulysses zigzag" "$INV_FLAGS" 2 chapter-6 "--cp 2 --cp-mode ulysses --cp-balance zigzag"
invariant --norm --val "dp=2 x cp=2 ring zigzag" "$INV_FLAGS" 4 chapter-6 "--dp 2 --cp 2 --cp-balance zigzag"
# weight decay, as chapter 0 applies it to every parameter
invariant --val "cp=2 ring --wd 0.1" "$INV_FLAGS --wd 0.1" 2 chapter-6 "--cp 2"

# The formulas, on the tiny model (L = 2, C = 64, NH = 4, Vp = 256) with
# INV_FLAGS (B = 24, T = 32): N = B T / cp token rows per rank (dp = 1).
L=2 C=64 NH=4 VP=256 T=$INV_SEQ P=120576
# summary_has NAME LOG TEXT: the summary record of LOG contains TEXT
summary_has() {
    if grep '"type":"summary"' "$2" | grep -qF -- "$3"; then
        pass "$1"
    else
        fail "$1" "want $3; summary: $(grep '"type":"summary"' "$2" | cut -c1-400)"
    fi
}
# The ring per layer and step: K/V go cp-1 hops in forward and again in
# backward, dK/dV cp hops (the last one home): L(3cp-2) sends of N x 2C floats.
N=$((INV_BATCH * T / 4))
summary_has "cp=4 ring: L(3cp-2) = 20 sends of N 2C 4 = $((N * 2 * C * 4)) bytes per rank per step" "$RING4" \
    "\"cp_calls_per_step\":20,\"cp_bytes_per_step\":$((20 * N * 2 * C * 4)),"
# Ulysses per layer and step: all-to-alls of qkv (3C) and the output (C) in
# forward, of d output (C) and dqkv (3C) in backward: 4L calls, 8 L N C floats.
summary_has "cp=4 ulysses: 4L = 8 all-to-alls of 8 L N C 4 = $((8 * L * N * C * 4)) bytes per rank per step" "$ULY4" \
    "\"cp_calls_per_step\":8,\"cp_bytes_per_step\":$((8 * L * N * C * 4)),"
# the gradients: one all-reduce of all P parameters per step over dp x cp
summary_has "cp=4: one all-reduce of the $P gradients per step over the dp+cp group" "$RING4" \
    "\"allreduce\":{\"dp+cp\":{\"calls\":$(rank_array $INV_STEPS 4),\"bytes\":$(rank_array $((INV_STEPS * P * 4)) 4),"
# Memory per rank (floats x 4 bytes): a full replica, P each for params and
# grads, 2P for AdamW; activations per layer N(18C + 4) for the block plus
# N NH (lse) and for Ulysses N 4C (my heads' qkv and output for whole
# sequences), and once N(21C + Vp + 8 + 3NH) (embedding, head, backward
# buffers, the ring's pair partials C + 3NH) / N(24C + Vp + 8) (Ulysses'
# head-shard gradients 4C); comm: the ring's five N x 2C K/V buffers,
# Ulysses' send and receive N x 3C.
ring_act=$((4 * (L * N * (18 * C + 4 + NH) + N * (21 * C + VP + 8 + 3 * NH))))
summary_has "cp=4 ring memory per rank: params, grads, optimizer P, P, 2P; activations $ring_act; comm 5 N 2C" "$RING4" \
    "\"peak_bytes\":{\"params\":$(rank_array $((P * 4)) 4),\"grads\":$(rank_array $((P * 4)) 4),\"optimizer\":$(rank_array $((2 * P * 4)) 4),\"activations\":$(rank_array $ring_act 4),\"comm\":$(rank_array $((5 * N * 2 * C * 4)) 4),"
N=$((INV_BATCH * T / 2))
uly_act=$((4 * (L * N * (22 * C + 4 + NH) + N * (24 * C + VP + 8))))
summary_has "cp=2 ulysses memory per rank: activations $uly_act; comm 2 N 3C" "$ULY2" \
    "\"activations\":$(rank_array $uly_act 2),\"comm\":$(rank_array $((2 * N * 3 * C * 4)) 2),"
# zigzag's balance: the causal scores per rank, equal (T(T+1)/2 B NH L / cp)
summary_has "cp=4 zigzag: every rank computes $((T * (T + 1) / 2 * INV_BATCH * NH * L / 4)) attention scores per step" "$RING4" \
    "\"attention_scores_per_rank\":$(rank_array $((T * (T + 1) / 2 * INV_BATCH * NH * L / 4)) 4)"

# --recompute in context parallelism (docs/recompute.md): the same losses and
# norms as none, bit for bit (the runs above); what a layer keeps and the
# peak activations against the formulas; full reruns each block's forward,
# the ring's K/V passes (L(cp-1) more sends) or Ulysses' two all-to-alls (2L
# more). Per token: selective keeps 12C+4+NH (+ Ulysses 4C) and shares a
# transient of 6C; full keeps C and shares a whole layer.
cp_steps() { grep '"type":"step"' "$1" | grep -o '"step":[0-9]*,"loss":[-0-9.e]*,"norm":[-0-9.e]*'; }
cp_recompute_case() {
    local mode=$1 r=$2 ncp=$3 flags=$4 none_log=$5 name="cp=$3 $1 --recompute $2" sum
    local N=$((INV_BATCH * T / ncp)) kept transient whole calls per_call
    if [ $mode = ring ]; then
        whole=$((18 * C + 4 + NH)); calls=$((L * (3 * ncp - 2))); per_call=$((2 * C))
        [ $r = full ] && calls=$((calls + L * (ncp - 1)))
        [ $r = selective ] && kept=$((12 * C + 4 + NH)) transient=$((6 * C))
    else
        whole=$((22 * C + 4 + NH)); calls=$((4 * L)); per_call=$((2 * C))
        [ $r = full ] && calls=$((calls + 2 * L))
        [ $r = selective ] && kept=$((16 * C + 4 + NH)) transient=$((6 * C))
    fi
    [ $r = full ] && kept=$C transient=$whole
    local once=$((21 * C + VP + 8 + 3 * NH))
    [ $mode = ulysses ] && once=$((24 * C + VP + 8))
    local acts=$((4 * N * (L * kept + transient + once)))
    invariant --norm --val --expect "activations kept per layer: $((4 * N * kept)) bytes" "$name" "$INV_FLAGS" $ncp \
        chapter-6 "--cp $ncp --cp-mode $mode $flags --recompute $r"
    sum=$(grep '"type":"summary"' "$INV_LOG")
    # bit for bit by construction: the same calls on the same rows, recomputed
    if [ "$(cp_steps "$INV_LOG")" = "$(cp_steps "$none_log")" ] &&
        echo "$sum" | grep -qF "\"activations\":$(rank_array $acts $ncp)," &&
        echo "$sum" | grep -qF "\"cp_calls_per_step\":$calls,\"cp_bytes_per_step\":$((calls * N * per_call * 4)),"; then
        pass "$name: the same losses and norms as none, bit for bit; peak activations $acts = formula; $calls cp $([ $mode = ring ] && echo sends || echo all-to-alls) per step"
    else
        fail "$name" "losses/norms equal to none: $([ "$(cp_steps "$INV_LOG")" = "$(cp_steps "$none_log")" ] && echo yes || echo NO); want activations $acts, $calls calls; got $(echo "$sum" | grep -o '"activations":\[[0-9,]*\]\|"cp_calls_per_step":[0-9]*,"cp_bytes_per_step":[0-9]*' | tr '\n' ' ')"
    fi
}
cp_recompute_case ring selective 4 "--cp-balance zigzag" "$RING4"
cp_recompute_case ring full 4 "--cp-balance zigzag" "$RING4"
cp_recompute_case ulysses selective 2 "" "$ULY2"
cp_recompute_case ulysses full 2 "" "$ULY2"
# --cp-overlap 0 waits for each K/V (and dK/dV) block before computing:
# the same sums in the same order, so the same bits as the overlapped ring
invariant --norm --val --expect "overlap off" "cp=2 ring --cp-overlap 0" "$INV_FLAGS" 2 chapter-6 "--cp 2 --cp-overlap 0"
# bit for bit by construction: the same calls on the same blocks in the same order, only the waits move
if [ -n "$(cp_steps "$INV_LOG")" ] && [ "$(cp_steps "$INV_LOG")" = "$(cp_steps "$RING2")" ]; then
    pass "cp=2 ring --cp-overlap 0: the same losses and norms as overlapped, bit for bit"
else
    fail "cp=2 ring --cp-overlap 0" "the losses and norms differ from the overlapped ring's (or a log is empty)"
fi

# Training-state checkpoints: the dp=2 x cp=2 zigzag ring run saves at step 5
# (world rank 0 alone writes the replica's state: with dp = 2 a cp group's
# rank 0 is not enough, its save would hold every float twice); cp=4 Ulysses
# resumes it and continues chapter 0's losses (steps 5..9) within TOL and its
# norms within TOL_NORM.
CK6=$TEST_TMPDIR/ck6
invariant "checkpoint: dp=2 x cp=2 ring zigzag saving at step 5" "--steps 5 --batch $INV_BATCH --seq $INV_SEQ --peak-gflops 10" 4 \
    chapter-6 "--dp 2 --cp 2 --cp-balance zigzag --ckpt-dir $CK6"
reference "$INV_FLAGS"
mpi_run $T_RUN 4 "$BUILD/chapter-6" $INV_FLAGS --cp 4 --cp-mode ulysses --resume "$CK6/step-00000005" --log "$TEST_TMPDIR/ck6r.jsonl"
cmp=$(awk -v tol=$TOL -v ntol=$TOL_NORM '
    /"type":"step"/ { match($0, /"step":[0-9]+/); s = substr($0, RSTART + 7, RLENGTH - 7) + 0
                      match($0, /"loss":[-0-9.e]+/); l = substr($0, RSTART + 7, RLENGTH - 7) + 0
                      match($0, /"norm":[-0-9.e]+/); g = substr($0, RSTART + 7, RLENGTH - 7) + 0
                      if (FNR == NR) { r[s] = l; rn[s] = g; next }
                      if (s != 5 + n || !(s in r)) bad = 1; n++
                      d = l - r[s]; if (d < 0) d = -d; if (d > max) max = d
                      d = g - rn[s]; if (d < 0) d = -d; if (d > maxn) maxn = d }
    END { printf "steps 5..%d, max |dloss| %.1e, |dnorm| %.1e", 4 + n, max, maxn
          exit (!bad && n == 5 && max <= tol && maxn <= ntol) ? 0 : 1 }' \
    "$REF" "$TEST_TMPDIR/ck6r.jsonl" 2>&1)
cmp_rc=$?
if [ $RC = 0 ] && [ $cmp_rc = 0 ] && echo "$OUT" | grep -q "checkpoint: resumed from"; then
    pass "checkpoint: cp=4 ulysses resumed from dp=2 x cp=2 ring's step 5 continues chapter 0's losses and norms ($cmp)"
else
    fail "checkpoint: cp=4 ulysses resumed" "exit $RC; $cmp; command: $CMD; $(echo "$OUT" | grep -E 'error' | head -3)"
fi

# bad meshes and flags: one message, every rank exits
jobs_run error_case chapter-6 3 "--cp 3" "--seq 64 does not split over cp=3"
jobs_run error_case chapter-6 4 "--cp 4 --seq 12 --batch 4 --cp-balance zigzag" "--seq 12 does not split into 2 x cp = 8 zigzag half-chunks"
jobs_run error_case chapter-6 3 "--cp 3 --seq 24 --batch 3 --cp-mode ulysses" "ulysses splits the model's 4 heads over cp=3"
jobs_run error_case chapter-6 2 "--cp 2 --cp-mode star" "--cp-mode star is not one of ring, ulysses"
jobs_run error_case chapter-6 2 "--cp 2 --cp-balance random" "--cp-balance random is not one of none, zigzag"
jobs_run error_case chapter-6 2 "--cp 2 --cp-overlap 2" "--cp-overlap 2 is not 0 or 1"
jobs_run error_case chapter-6 2 "--tp 2" "--tp 2 without --sp"
jobs_run error_case chapter-6 4 "--cp 2" "has 2 ranks but mpirun started 4"
jobs_run help_case chapter-6 "--cp-balance"
jobs_wait  # independent: 2 at a time

# ---------------------------------------------------------------- sequence parallelism (--tp N --sp)
echo "== chapter 6: sequence parallelism"
# 06_sequence_context/sequence.c, docs/06_sequence_context.md "Sequence
# parallelism". The invariant on tp=2, tp=4 and dp=2 x tp=2 with the norms
# and the validation loss, the LayerNorm gradients and the replicated tensors
# bit-identical on every tp rank; every collective per rank against the
# formula; what a layer keeps (the allocator's counts) and the peak
# activations against the formula; a checkpoint resumed bit for bit and by
# chapter 4; the bus bytes of the all-gathers and reduce-scatters against
# chapter 4's all-reduces, measured; B*T not divisible by tp; --sp with --cp.
#
# sp_expect Vp maxT L NH C B T dp tp r: the doc's per-step figures on tp rank r
# (ZeRO-3, prefetch, reshard), N = B/dp*T tokens, Nl = N/tp, in bytes:
#  1 tp all-gather calls (6L + 3)   2 their bytes   3 tp reduce-scatter calls (4L + 2)
#  4 their bytes   5 tp all-reduce calls (2L LayerNorms + lnf + norm)   6 their bytes
#  7 kept per layer: token shard Nl*(6C+4)   8 chapter 4's: N*(6C+4)
#  9 peak activations
sp_expect() {
    local Vp=$1 maxT=$2 L=$3 NH=$4 C=$5 B=$6 T=$7 dp=$8 tp=$9 r=${10}
    local N=$(( B / dp * T )) per=$(( (Vp + tp - 1) / tp )) Cl=$(( C / tp )) Vl
    local Nl=$(( N / tp )) NC4=$(( N * C * 4 ))
    Vl=$(( Vp - r * per )); [ $Vl -gt $per ] && Vl=$per
    # chapter 4's activations with each layer's token part cut to Nl, and
    # three (Nl,C) buffers more: the embedding's output, dres, dln
    local acts=$(( N * C + L * (Nl * (6 * C + 4) + N * (12 * Cl + NH / tp)) + N * (C + Vl + 6) + 3 * N * tp \
        + N * (C + 12 * Cl) + N * C + 2 * N + 3 * Nl * C ))
    echo "$(( 6 * L + 3 )) $(( (6 * L + 2) * NC4 + 3 * N * tp * 4 )) $(( 4 * L + 2 )) $(( (4 * L + 2) * NC4 ))" \
         "$(( 2 * L + 2 )) $(( (2 * L + 1) * 2 * C * 4 + 4 ))" \
         "$(( 4 * Nl * (6 * C + 4) )) $(( 4 * N * (6 * C + 4) )) $(( 4 * acts ))"
}
# sp_ranks K M SIZES...: field K of sp_expect for every world rank, times M
sp_ranks() {
    local k=$1 mul=$2 out="" w np v
    shift 2
    np=$(( $8 * $9 ))
    for ((w = 0; w < np; w++)); do
        v=$(sp_expect "$@" $(( w % $9 )) | cut -d' ' -f$k)
        out="$out${out:+,}$(( v * mul ))"
    done
    echo "[$out]"
}
# sp_case dp tp [FLAGS]: the invariant, then the summary against the formulas
sp_case() {
    local dp=$1 tp=$2 np=$(( $1 * $2 )) name="chapter 6 --sp dp=$1 tp=$2" sum sz e
    # bit-identical by construction: every tp rank receives the same all-reduced bytes and runs the same ops on them
    invariant --norm --val --expect "LayerNorm gradients (summed over tp): bit-identical on every tp rank at every step" \
        "$name" "$INV_FLAGS" $np chapter-6 "--dp $dp --tp $tp --sp ${3:-}"
    echo "$OUT" | grep -qF "replicated tensors (LayerNorms, row-parallel biases, wpe, lnf) and losses: bit-identical on every tp rank" &&
        pass "$name: replicated tensors and losses bit-identical on every tp rank" ||
        fail "$name: replicas" "$(echo "$OUT" | grep replicated)"
    cp "$INV_LOG" "$TEST_TMPDIR/sp_dp${dp}_tp${tp}.jsonl"
    sum=$(grep '"type":"summary"' "$INV_LOG")
    sz="256 64 2 4 64 $INV_BATCH $INV_SEQ $dp $tp"
    read -r -a e <<< "$(sp_expect $sz 0)"
    local want=(
        "\"allreduce\":{\"dp\":{\"calls\":$(rank_array 10 $np),\"bytes\":$(rank_array 40 $np),"
        "\"tp\":{\"calls\":$(sp_ranks 5 10 $sz),\"bytes\":$(sp_ranks 6 10 $sz),"
        "\"reduce_scatter\":{\"dp\":{"
        "\"tp\":{\"calls\":$(sp_ranks 3 10 $sz),\"bytes\":$(sp_ranks 4 10 $sz),"
        "\"allgather\":{\"dp\":{"
        "\"tp\":{\"calls\":$(sp_ranks 1 10 $sz),\"bytes\":$(sp_ranks 2 10 $sz),")
    local ok=1 piece
    for piece in "${want[@]}"; do echo "$sum" | grep -qF -- "$piece" || ok=0; done
    if [ $ok = 1 ]; then
        pass "$name: per step ${e[0]} tp all-gathers (${e[1]} bytes), ${e[2]} reduce-scatters (${e[3]}), ${e[4]} all-reduces (${e[5]}) = formula"
    else
        fail "$name: comm" "want (tp rank 0, per step) ${e[*]:0:6}; got $(echo "$sum" | sed 's/.*"comm":\({.*}\),"comm_wait_s".*/\1/')"
    fi
    # what a layer keeps of its own tokens, from the allocator's counts: 1/tp of chapter 4's
    if echo "$sum" | grep -qF "\"layer_token_shard_bytes\":${e[6]},\"layer_token_shard_bytes_ch4\":${e[7]}," &&
        [ $(( e[7] )) = $(( tp * e[6] )) ] &&
        echo "$sum" | grep -qF "\"activations\":$(sp_ranks 9 1 $sz),"; then
        pass "$name: a layer keeps ${e[6]} bytes of LayerNorm/residual activations, 1/$tp of chapter 4's ${e[7]} (allocator); peak activations ${e[8]} bytes = formula"
    else
        fail "$name: memory" "want token shard ${e[6]} (chapter 4 ${e[7]}), peak activations $(sp_ranks 9 1 $sz); got $(echo "$sum" | grep -o '"layer_[a-z_0-9]*":[0-9]*' | tr '\n' ' ') $(echo "$sum" | grep -o '"activations":\[[0-9,]*\]')"
    fi
}
SPCK=$TEST_TMPDIR/sp_ckpt
rm -rf "$SPCK"
sp_case 1 2 "--ckpt-dir $SPCK --save-every 5"
sp_case 2 2
sp_case 1 4
# weight decay on the tp-sharded tiles and the replicated LayerNorms alike
invariant --val "sequence parallel tp=2 --wd 0.1" "$INV_FLAGS --wd 0.1" 2 chapter-6 "--tp 2 --sp"
# --recompute on tp=2: the same bits as none (the logged losses and norms of
# the run above); what a layer keeps, the peak activations and, for full,
# the block's collectives issued again, against the formulas
# (docs/recompute.md): selective keeps Nl(4C+4) + N(8C + NH)/tp per layer and
# shares a transient of 2 Nl C + 4NC/tp; full keeps Nl C (res3) and
# shares everything else of one layer
sp_recompute_case() {
    local r=$1 name="chapter 6 --sp tp=2 --recompute $1" sum N=$(( INV_BATCH * INV_SEQ )) C=64 L=2 NH=4 T=$INV_SEQ tp=2
    local Nl=$(( N / tp )) Cl=$(( C / tp )) Vl=128 kept transient extra_ag=0 extra_rs=0
    if [ $r = selective ]; then
        kept=$(( Nl * (4 * C + 4) + N * (8 * Cl + NH / tp) )); transient=$(( 2 * Nl * C + N * 4 * Cl ))
    else
        kept=$(( Nl * C )); transient=$(( Nl * (5 * C + 4) + N * (12 * Cl + NH / tp) ))
        extra_ag=$(( 2 * L )); extra_rs=$(( 2 * L ))
    fi
    local acts=$(( 4 * (N * C + L * kept + transient + N * (C + Vl + 6) + 3 * N * tp \
        + N * (C + 12 * Cl) + N * C + 2 * N + 3 * Nl * C) ))
    invariant --norm --expect "recompute $r: backward recomputes" "$name" "$INV_FLAGS" 2 chapter-6 "--tp 2 --sp --recompute $r"
    sum=$(grep '"type":"summary"' "$INV_LOG")
    # bit for bit by construction: the same calls on the same rows, recomputed
    if [ "$(sp_steps "$INV_LOG" 0)" = "$(sp_steps "$TEST_TMPDIR/sp_dp1_tp2.jsonl" 0)" ] &&
        echo "$sum" | grep -qF "\"layer_acts_bytes\":$(( 4 * kept ))," &&
        echo "$sum" | grep -qF "\"activations\":$(rank_array $acts 2)," &&
        echo "$sum" | grep -qF "\"reduce_scatter\":{\"dp\":{" &&
        echo "$sum" | grep -qF "\"tp\":{\"calls\":$(rank_array $(( 10 * (4 * L + 2 + extra_rs) )) 2)," &&
        echo "$sum" | grep -qF "\"tp\":{\"calls\":$(rank_array $(( 10 * (6 * L + 3 + extra_ag) )) 2),"; then
        pass "$name: the same losses and norms as none, bit for bit; $(( 4 * kept )) bytes kept per layer, peak activations $acts, $(( 6 * L + 3 + extra_ag )) all-gathers and $(( 4 * L + 2 + extra_rs )) reduce-scatters per step = formula"
    else
        fail "$name" "losses/norms equal to none: $([ "$(sp_steps "$INV_LOG" 0)" = "$(sp_steps "$TEST_TMPDIR/sp_dp1_tp2.jsonl" 0)" ] && echo yes || echo NO); want layer_acts_bytes $(( 4 * kept )), activations $acts; got $(echo "$sum" | grep -o '"layer_acts_bytes":[0-9]*') $(echo "$sum" | grep -o '"activations":\[[0-9,]*\]')"
    fi
}
sp_steps() { grep '"type":"step"' "$1" | grep -o '"step":[0-9]*,"loss":[-0-9.e]*,"norm":[-0-9.e]*' | awk -F'[:,]' -v f="$2" '$2 >= f'; }
sp_recompute_case selective
sp_recompute_case full
# training-state checkpoints: the state is chapter 4's (the same tiles over
# the same FSDP). The tp=2 run above saved at step 5: resumed on the same
# mesh it repeats steps 5..9 bit for bit (the logged losses and norms), and
# chapter 4 on dp=2 x tp=2 resumes the same files on chapter 0's losses.
mpi_run $T_RUN 2 "$BUILD/chapter-6" --tp 2 --sp $INV_FLAGS --resume "$SPCK/step-00000005" --log "$TEST_TMPDIR/sp_resumed.jsonl"
# bit for bit by construction: the same calls on the same rows (a resume on the same mesh)
if [ $RC = 0 ] && echo "$OUT" | grep -q "checkpoint: resumed from" &&
    [ "$(sp_steps "$TEST_TMPDIR/sp_dp1_tp2.jsonl" 5)" = "$(sp_steps "$TEST_TMPDIR/sp_resumed.jsonl" 0)" ] &&
    [ "$(sp_steps "$TEST_TMPDIR/sp_resumed.jsonl" 0 | wc -l)" = 5 ]; then
    pass "chapter 6 --sp tp=2 resumed at step 5 repeats steps 5..9 bit for bit"
else
    fail "chapter 6 --sp resume" "exit $RC; $CMD; $(sp_steps "$TEST_TMPDIR/sp_resumed.jsonl" 0 | head -2)"
fi
mpi_run $T_RUN 4 "$BUILD/chapter-4" --dp 2 --tp 2 $INV_FLAGS --resume "$SPCK/step-00000005" --log "$TEST_TMPDIR/sp_ch4_resumed.jsonl"
reference "$INV_FLAGS"
read -r n dmax nmax <<< "$(paste <(sp_steps "$REF" 5) <(sp_steps "$TEST_TMPDIR/sp_ch4_resumed.jsonl" 0) | awk -F'[:,\t]' '
    { n++; if ($2 != $8) bad = 1; d = $4 - $10; if (d < 0) d = -d; if (d > m) m = d
      d = $6 - $12; if (d < 0) d = -d; if (d > mn) mn = d }
    END { printf "%d %.2e %.2e", bad ? -1 : n, m, mn }')"
if [ $RC = 0 ] && [ "$n" = 5 ] && awk -v d="$dmax" -v dn="$nmax" -v tol="$TOL" -v ntol="$TOL_NORM" 'BEGIN { exit !(d <= tol && dn <= ntol) }'; then
    pass "chapter 4 dp=2 tp=2 resumed from chapter 6 --sp's step 5 continues chapter 0's losses and norms (steps 5..9, max |dloss| $dmax, |dnorm| $nmax)"
else
    fail "chapter 4 resuming chapter 6 --sp" "exit $RC, $n steps, max |dloss| $dmax, |dnorm| $nmax; $CMD"
fi
# the same bus bytes as chapter 4 in a ring, measured on tp=2: chapter 4's
# tp all-reduces and its all-gather (the cross-entropy's) against sequence
# parallelism's all-gathers and reduce-scatters, less what it adds: the 2L
# re-gathers of a LayerNorm output in backward ((tp-1)/tp x N*C*4 bytes of
# bus each) and the all-reduces of the LayerNorm gradients (2L+1 of 2C
# floats, 2(tp-1)/tp x 8C bytes of bus each), over the 10 steps
mpi_run $T_RUN 2 "$BUILD/chapter-4" --tp 2 $INV_FLAGS --log "$TEST_TMPDIR/sp_ch4.jsonl"
read -r bus4 bussp added <<< "$(python3 - "$TEST_TMPDIR/sp_ch4.jsonl" "$TEST_TMPDIR/sp_dp1_tp2.jsonl" <<PY
import json, sys
ch4, sp = ([json.loads(l) for l in open(f) if '"type":"summary"' in l][0] for f in sys.argv[1:3])
bus = lambda s, coll: sum(s["comm"].get(coll, {}).get("tp", {}).get("bus_bytes", [0])[:1])
steps, L, N, C, tp = $INV_STEPS, 2, $INV_BATCH * $INV_SEQ, 64, 2
added = steps * (2 * L * (tp - 1) * N * C * 4 / tp + (2 * L + 1) * 2 * (tp - 1) * 8 * C / tp)
print("%d %d %d" % (bus(ch4, "allreduce") + bus(ch4, "allgather"),
                    bus(sp, "allgather") + bus(sp, "reduce_scatter") + bus(sp, "allreduce") - added, added))
PY
)"
if [ $RC = 0 ] && [ -n "$bus4" ] && [ "$bus4" = "$bussp" ]; then
    pass "chapter 6 --sp tp=2: tp bus bytes over 10 steps, less the re-gathers and LayerNorm sums ($added), $bussp = chapter 4's $bus4 (measured)"
else
    fail "chapter 6 --sp: bus bytes" "chapter 4 '$bus4', sequence parallelism less its additions '$bussp' (exit $RC)"
fi
jobs_run error_case chapter-6 2 "--tp 2 --sp --batch 3 --seq 33" "--sp splits the 3 x 33 = 99 tokens of a dp rank's batch over tp=2 ranks"
jobs_run error_case chapter-6 4 "--tp 2 --cp 2 --sp" "--sp runs on a dp x tp mesh"
jobs_wait

finish
