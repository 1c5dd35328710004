#!/bin/bash
# Chapter 3: fully sharded data parallel. The invariant for ZeRO-1, 2 and 3 on
# 1 to 4 ranks, with and without prefetch and resharding; memory and
# communication against the formulas; validation; sharded save and load; bad
# input; --help.
. "$(dirname "$0")/lib.sh"

echo "== chapter 3: fully sharded data parallel"
# The expected per-rank figures, from the doc's formulas, for the tiny model
# (L = 2): units of n = 20480 (wte, wpe), 49984 (a block), 49984, 128 (lnf)
# floats; rank r owns S_u = ceil(n_u / N) of each.
# Per step: 4 units are reduce-scattered (L + 2 calls) and the norm is one
# all-reduce of 4 bytes. All-gathers: ZeRO-1/2 gather the 4 updated units
# after the step; ZeRO-3 gathers the 4 units in forward, unit 0 again for the
# head and the L = 2 blocks again in backward (2L + 3 = 7 calls), or, with
# --reshard 0, each unit once (4). Of ZeRO-3's gathers, all but the exposed
# ones are started ahead by prefetch_unit: with resharding 7 - 3 = 4 (the
# first unit 0, unit 0 for the head and the first block of backward are
# exposed), without 4 - 1 = 3 (only the first unit 0); none without prefetch.
fsdp_expect() {  # N zero reshard prefetch -> "params grads optimizer allgather_bytes reduce_scatter_bytes allgather_calls prefetched" per step
    local N=$1 z=$2 rs=$3 pf=$4 S=0 Smax=0 S0 Sb Ppad Umax U0 params grads opt ag rsb agc ahead=0
    for n in 20480 49984 49984 128; do
        local s=$(( (n + N - 1) / N ))
        S=$((S + s)); [ $s -gt $Smax ] && Smax=$s
    done
    S0=$(( (20480 + N - 1) / N )); Sb=$(( (49984 + N - 1) / N ))
    Ppad=$((N * S)); Umax=$((N * Smax)); U0=$((N * S0))
    opt=$((2 * S))
    case $z in
        1) params=$Ppad; grads=$((S + Ppad)); ag=$Ppad; agc=4 ;;
        2) params=$Ppad; grads=$((S + Umax + U0)); ag=$Ppad; agc=4 ;;
        3) grads=$((S + Umax + U0))
           if [ $rs = 1 ]; then params=$((S + 2 * Umax)); ag=$((Ppad + U0 + 2 * N * Sb)); agc=7; ahead=4
           else params=$((S + Ppad)); ag=$Ppad; agc=4; ahead=3; fi
           [ $pf = 0 ] && ahead=0 ;;
    esac
    echo "$((4 * params)) $((4 * grads)) $((4 * opt)) $((4 * ag)) $((4 * Ppad)) $agc $ahead"
}
fsdp_run() {  # np zero prefetch reshard
    local np=$1 z=$2 pf=$3 rs=$4 name="ZeRO-$2 dp=$1 prefetch=$3 reshard=$4" sum
    invariant --norm --val "fsdp $name" "$INV_FLAGS" $np chapter-3 "--dp $np --zero $z --prefetch $pf --reshard $rs"
    read -r e_params e_grads e_opt e_ag e_rs e_agc e_ahead <<< "$(fsdp_expect $np $z $rs $pf)"
    sum=$(grep '"type":"summary"' "$INV_LOG")
    if echo "$sum" | grep -qF "\"params\":$(rank_array $e_params $np),\"grads\":$(rank_array $e_grads $np),\"optimizer\":$(rank_array $e_opt $np)"; then
        pass "fsdp $name: peak params/grads/optimizer bytes per rank = formula ($e_params/$e_grads/$e_opt)"
    else
        fail "fsdp $name: memory" "want params $e_params grads $e_grads optimizer $e_opt; got $(echo "$sum" | sed 's/.*"peak_bytes":{\([^}]*\)}.*/\1/')"
    fi
    # each collective by name: calls and bytes over the 10 steps, every rank
    if echo "$sum" | grep -qF "\"allreduce\":{\"dp\":{\"calls\":$(rank_array 10 $np),\"bytes\":$(rank_array 40 $np)," &&
        echo "$sum" | grep -qF "\"reduce_scatter\":{\"dp\":{\"calls\":$(rank_array $((10 * 4)) $np),\"bytes\":$(rank_array $((10 * e_rs)) $np)," &&
        echo "$sum" | grep -qF "\"allgather\":{\"dp\":{\"calls\":$(rank_array $((10 * e_agc)) $np),\"bytes\":$(rank_array $((10 * e_ag)) $np),"; then
        pass "fsdp $name: per step $e_agc all-gathers of $e_ag bytes, 4 reduce-scatters of $e_rs, 1 all-reduce of 4 = formula"
    else
        fail "fsdp $name: comm" "want per step allgather $e_agc calls $e_ag bytes, reduce_scatter 4 / $e_rs, allreduce 1 / 4; got $(echo "$sum" | sed 's/.*"comm":\({.*}\),"comm_wait_s".*/\1/')"
    fi
    if echo "$sum" | grep -qE "\"padding_nonzero\":0[,}]"; then
        pass "fsdp $name: every shard's padding is still zero after training"
    else
        fail "fsdp $name: padding" "$(echo "$sum" | grep -o '"padding_nonzero":[0-9]*')"
    fi
    if echo "$sum" | grep -qE "\"gathers_prefetched_per_step\":$e_ahead[,}]"; then
        pass "fsdp $name: $e_ahead unit gathers per step started ahead by prefetch"
    else
        fail "fsdp $name: prefetch" "want $e_ahead gathers prefetched per step; got $(echo "$sum" | grep -o '"gathers_prefetched_per_step":[^,}]*')"
    fi
}
# the layouts are independent: 2 at a time (jobs_run, tests/lib.sh), after
# the references the later ones need
reference "$INV_FLAGS"
for extra in "--val-every 5" "--clip 0" "--wd 0.1"; do jobs_run reference "$INV_FLAGS $extra"; done
# prefetch only exists under ZeRO-3 (ZeRO-1 and 2 keep the full parameters)
for z in 1 2 3; do
    pfs="1"
    [ $z = 3 ] && pfs="0 1"
    for np in 1 2 3 4; do
        for pf in $pfs; do
            jobs_run fsdp_run $np $z $pf 1
        done
    done
done
jobs_run fsdp_run 2 3 1 0
jobs_run fsdp_run 3 3 0 0
# --comm hand: chapter 1's ring reduce-scatter and all-gather move the shards
# (prefetch then gathers at once: a hand collective completes at its start)
jobs_run invariant --norm "fsdp ZeRO-3 dp=2 --comm hand" "$INV_FLAGS" 2 chapter-3 "--dp 2 --zero 3 --comm hand"
jobs_run invariant --norm "fsdp ZeRO-1 dp=3 --comm hand" "$INV_FLAGS" 3 chapter-3 "--dp 3 --zero 1 --comm hand"
jobs_run invariant --norm "fsdp ZeRO-2 dp=4 --comm hand" "$INV_FLAGS" 4 chapter-3 "--dp 4 --zero 2 --comm hand"
# validation during training (--val-every) runs the same sharded forward:
# chapter 0's validation losses, and under ZeRO-3 each of the 4 validation
# batches costs one forward's gathers (L + 3 = 5 calls, Ppad + U0 floats)
fsdp_val() {
    local vref vrun vcmp vrc e_ag e_agc val_ag
    reference "$INV_FLAGS --val-every 5"
    vref=$REF
    vrun=$TEST_TMPDIR/fsdp_vrun.jsonl
    mpi_run $T_RUN 3 "$BUILD/chapter-3" --dp 3 --zero 3 --steps 10 --batch 24 --seq 32 --val-every 5 --peak-gflops 10 --log "$vrun"
    vcmp=$(compare_val "$vref" "$vrun" 2>&1)
    vrc=$?
    read -r _ _ _ e_ag _ e_agc _ <<< "$(fsdp_expect 3 3 1 1)"
    val_ag=$((4 * (3 * 40194 + 3 * 6827)))  # Ppad + U0 on 3 ranks (section 3.2)
    if [ $vrc -eq 0 ] && [ "$(val_records "$vrun" | wc -l)" = 2 ] &&
        grep '"type":"summary"' "$vrun" | grep -qF "\"allgather\":{\"dp\":{\"calls\":$(rank_array $((10 * e_agc + 4 * 5)) 3),\"bytes\":$(rank_array $((10 * e_ag + 4 * val_ag)) 3),"; then
        pass "fsdp: --val-every 5 on 3 ranks gives chapter 0's validation losses ($vcmp), each validation batch costs 5 gathers"
    else
        fail "fsdp: --val-every" "$vcmp; command: $CMD; $(grep -o '"allgather":{[^}]*}' "$vrun")"
    fi
}
jobs_run fsdp_val

# without clipping a missing or doubled gradient average moves the losses
# (with clipping on every step, the clip hides it); and weight decay, which
# the sharded step applies to the shard: every stage, on 3 ranks (padding)
for extra in "--clip 0" "--wd 0.1"; do
    for z in 1 2 3; do
        jobs_run invariant --norm "fsdp ZeRO-$z dp=3 $extra" "$INV_FLAGS $extra" 3 chapter-3 "--dp 3 --zero $z $extra"
    done
done
jobs_wait

echo "== chapter 3: errors, save and load, --help"
bad_inputs
jobs_run error_case chapter-3 2 "--dp 2 --zero 4" "--zero 4: the stages are 1, 2 and 3"
jobs_run error_case chapter-3 2 "--dp 2 --prefetch 2" "--prefetch and --reshard take 0 or 1"
jobs_run error_case chapter-3 2 "--dp 2 --zero 2 --reshard 0" "--reshard 0 applies to --zero 3 only"
jobs_run error_case chapter-3 3 "--dp 3 --batch 4" "does not split over dp=3"
jobs_run error_case chapter-3 2 "--dp 2 --model $TEST_TMPDIR/truncated.bin" "truncated or corrupt"
jobs_wait  # independent: 2 at a time
# a checkpoint read shard by shard gives the same model as one read whole
saved3=$TEST_TMPDIR/fsdp_saved.bin
mpi_run $T_SHORT 3 "$BUILD/chapter-3" --dp 3 --batch 12 --steps 3 --peak-gflops 10 --save "$saved3"
mpi_run $T_SHORT 1 "$BUILD/chapter-0" --model "$saved3" --steps 0 --peak-gflops 10
v0=$(echo "$OUT" | grep 'val loss' | sed 's/.*val loss //')
mpi_run $T_SHORT 3 "$BUILD/chapter-3" --dp 3 --model "$saved3" --batch 12 --steps 1 --peak-gflops 10
l3=$(echo "$OUT" | grep 'step    0/1' | sed 's/.*loss \([0-9.]*\).*/\1/')
mpi_run $T_SHORT 1 "$BUILD/chapter-0" --model "$saved3" --batch 12 --steps 1 --peak-gflops 10
l0=$(echo "$OUT" | grep 'step    0/1' | sed 's/.*loss \([0-9.]*\).*/\1/')
if [ -n "$v0" ] && [ -n "$l3" ] && [ "$l3" = "$l0" ]; then
    pass "fsdp: --save gathers the shards into an llm.c file; loading it shard by shard gives the reference's loss ($l3)"
else
    fail "fsdp: save and sharded load" "val '$v0', first loss sharded '$l3' vs whole '$l0'"
fi
# the gather for --save puts every float where chapter 0 has it: an
# untrained model saved by each stage on 3 ranks (padding) is chapter 0's
# file byte for byte (init is counter-based, so the bits are the same)
mpi_run $T_SHORT 1 "$BUILD/chapter-0" --steps 0 --peak-gflops 10 --save "$TEST_TMPDIR/init0.bin"
for z in 1 2 3; do
    mpi_run $T_SHORT 3 "$BUILD/chapter-3" --dp 3 --batch 12 --zero $z --steps 0 --peak-gflops 10 --save "$TEST_TMPDIR/init3_z$z.bin"
    # byte for byte by construction: each value a function of its index, the gather a copy (no arithmetic)
    if [ $RC = 0 ] && cmp -s "$TEST_TMPDIR/init0.bin" "$TEST_TMPDIR/init3_z$z.bin"; then
        pass "fsdp: ZeRO-$z --save of the untrained model on 3 ranks = chapter 0's file, byte for byte"
    else
        fail "fsdp: ZeRO-$z untrained save" "exit $RC; $(cmp "$TEST_TMPDIR/init0.bin" "$TEST_TMPDIR/init3_z$z.bin" 2>&1 | head -1)"
    fi
done
# ...and the file holds the trained model: its val loss is the one chapter 0
# reaches training alike (a gather that misplaces one float fails here)
mpi_run $T_SHORT 1 "$BUILD/chapter-0" --model "$saved3" --batch 12 --steps 0 --peak-gflops 10
vs3=$(echo "$OUT" | grep 'val loss' | sed 's/.*val loss //')
# (chapter 0 trained alike: 3 steps at batch 12; the ZeRO-2 check below uses it too)
mpi_run $T_SHORT 1 "$BUILD/chapter-0" --batch 12 --steps 3 --peak-gflops 10
vt3=$(echo "$OUT" | grep 'val loss' | tail -1 | sed 's/.*val loss //')
if [ -n "$vs3" ] && [ -n "$vt3" ] && awk -v a="$vs3" -v b="$vt3" -v tol="$TOL" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= tol) }'; then
    pass "fsdp: a ZeRO-3 --save on 3 ranks loads in chapter 0 with the val loss chapter 0 trains to ($vs3 vs $vt3)"
else
    fail "fsdp: ZeRO-3 save" "val loss of the saved file '$vs3', of chapter 0 trained alike '$vt3'"
fi
# ZeRO-2 keeps full (padded) parameters: --save from 3 ranks (padding) must
# hold the trained model, whose validation loss chapter 0 reaches itself
saved2=$TEST_TMPDIR/fsdp_saved_z2.bin
mpi_run $T_SHORT 3 "$BUILD/chapter-3" --dp 3 --zero 2 --batch 12 --steps 3 --peak-gflops 10 --save "$saved2"
mpi_run $T_SHORT 1 "$BUILD/chapter-0" --model "$saved2" --batch 12 --steps 0 --peak-gflops 10
vl=$(echo "$OUT" | grep 'val loss' | sed 's/.*val loss //')
vt=$vt3
if [ -n "$vl" ] && [ -n "$vt" ] && awk -v a="$vl" -v b="$vt" -v tol="$TOL" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= tol) }'; then
    pass "fsdp: a ZeRO-2 --save on 3 ranks loads in chapter 0 with the val loss chapter 0 trains to ($vl vs $vt)"
else
    fail "fsdp: ZeRO-2 save" "val loss of the saved file '$vl', of chapter 0 trained alike '$vt'"
fi
help_case chapter-3 "--zero N"

echo "== chapter 3's engine (03_fsdp/fsdp.c) and the train.h glue, over MPI"
# test_fsdp: units of odd sizes through every ZeRO stage (gather, prefetch,
# reduce-scatter, sumsq, the sharded step, gather to rank 0), a ZeroBuffer's
# checkpoint lines (every float written once, uneven and tiny buffers), and
# the mean, norm and AdamW helpers; on 4 ranks the norm runs over a dp x tp mesh
for np in 1 3 4; do
    out=$(timeout 120 $MPIRUN -np $np "$BUILD/tests/test_fsdp" 2>&1)
    rc=$?
    echo "$out" | grep -E '^(PASS|FAIL)' | sed "s/^\(PASS\|FAIL\) /\1 [np $np] /"
    passed=$((passed + $(echo "$out" | grep -c '^PASS')))
    failed=$((failed + $(echo "$out" | grep -c '^FAIL')))
    if [ $rc -ne 0 ] && ! echo "$out" | grep -q '^FAIL'; then
        fail "test_fsdp on $np ranks" "exited $rc without a failed check: $(echo "$out" | tail -3)"
    fi
done
# train_check_mesh: one message style per axis (the tiny model: NH 4, L 2)
jobs_run error_case tests/test_fsdp 3 "--check-mesh dp=3 4 64" "--batch 4 does not split over dp=3 ranks: use a batch divisible by 3"
jobs_run error_case tests/test_fsdp 2 "--check-mesh dp=2 6 64 2" "--batch 6 does not split over dp=2 ranks x 2 micro-batches: use a batch divisible by 4"
jobs_run error_case tests/test_fsdp 2 "--check-mesh dp=2 4 64 3" "--batch 4 over dp=2 ranks leaves 2 sequences a rank, too few for 3 micro-batches: use at most 2 micro-batches, or a batch divisible by 6"
jobs_run error_case tests/test_fsdp 3 "--check-mesh tp=3 6 64" "the model's 4 heads do not split over tp=3 ranks: use a tp that divides 4"
jobs_run error_case tests/test_fsdp 3 "--check-mesh tp=3 6 64 1 0 small" "the model's padded vocabulary of 256 does not split over tp=3 ranks: use a tp that divides 256"
jobs_run error_case tests/test_fsdp 4 "--check-mesh pp=4 4 64" "the model's 2 layers do not split over pp=4 ranks: use a pp that divides 2"
jobs_run error_case tests/test_fsdp 3 "--check-mesh cp=3 4 64" "--seq 64 does not split over cp=3 ranks: use a sequence length divisible by 3"
jobs_run error_case tests/test_fsdp 2 "--check-mesh ep=2 4 64" "the model has no experts to split over ep=2 ranks"
jobs_run error_case tests/test_fsdp 3 "--check-mesh ep=3 4 64 1 8" "the model's 8 experts do not split over ep=3 ranks: use an ep that divides 8"
jobs_wait  # independent: 2 at a time
out=$(timeout 60 $MPIRUN -np 4 "$BUILD/tests/test_fsdp" --check-mesh dp=2,tp=2 4 64 2 2>&1)
if [ $? -eq 0 ] && echo "$out" | grep -q '^mesh ok'; then
    pass "train_check_mesh: dp=2 x tp=2, batch 4 in 2 micro-batches per rank, fits the tiny model"
else
    fail "train_check_mesh: dp=2 x tp=2" "$(echo "$out" | head -3)"
fi
# ==== end of new tests: fsdp engine and train.h glue ====

finish
