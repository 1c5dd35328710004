#!/bin/bash
# Chapter 2: data parallel. The invariant in every mode on 1 to 4 ranks, with
# and without gradient accumulation, the accounting formulas, bad input, --help.
. "$(dirname "$0")/lib.sh"

echo "== chapter 2: data parallel"
# the invariant: every mode, dp = 1..4, with and without gradient accumulation,
# reproduces the reference's losses, gradient norms (the norm before
# clipping, as chapter 0 logs it; TOL and TOL_NORM in tests/lib.sh) and
# validation loss; every run ends with bit-identical replicas.
dp_steps=$INV_STEPS; dp_B=$INV_BATCH; dp_T=$INV_SEQ
reference "$INV_FLAGS"
if [ "$(cat "$REF.rc")" = 0 ] && [ "$(grep -c '"type":"step"' "$REF")" = $dp_steps ]; then
    pass "data parallel: the reference run (chapter 0, 10 steps, batch 24 x 32) writes 10 step records"
else
    fail "data parallel: the reference run" "exit $(cat "$REF.rc"); command: $(cat "$REF.cmd"); $(tail -3 "$REF.out")"
fi
# The expected accounting, from the doc's formulas, for the tiny model (Vp =
# 256, C = 64, maxT = 64, L = 2, NH = 4) at T = 32 and --bucket-kb 64.
dp_C=64; dp_L=2; dp_NH=4; dp_Vp=256; dp_maxT=64
dp_P=$((dp_Vp * dp_C + dp_maxT * dp_C + dp_L * (12 * dp_C * dp_C + 13 * dp_C) + 2 * dp_C))  # 120,576
dp_tensors=$((4 + 12 * dp_L))  # naive: one all-reduce per tensor per layer
dp_bf=$((64 * 1024 / 4))       # floats per bucket
dp_nb=$(( (dp_P + dp_bf - 1) / dp_bf ))
# A bucket starts before backward ends when it lies wholly above a hook's
# boundary other than the embedding's (0); the lowest such boundary is block
# 0's first offset, just after wte and wpe. Bucket i is [max(P-(i+1)bf, 0), P-i*bf).
dp_block0=$((dp_Vp * dp_C + dp_maxT * dp_C))
dp_early=0
for ((dp_i = 0; dp_i < dp_nb; dp_i++)); do
    dp_lo=$((dp_P - (dp_i + 1) * dp_bf)); [ $dp_lo -lt 0 ] && dp_lo=0
    [ $dp_lo -ge $dp_block0 ] && dp_early=$((dp_early + 1))
done  # 6 of 8 buckets for tiny at 64 KiB
# activation bytes of one sequence: chapter 0's formula (docs/00_mesh.md, section 5)
dp_seq_acts=$((4 * dp_T * (dp_C + dp_L * (18 * dp_C + dp_NH + 4) + (dp_C + dp_Vp + 6) + 13 * dp_C + dp_C + 2)))
dp_rank0() {  # value N -> [value,0,...,0]: rank 0 alone holds it
    local out=$1 i
    for ((i = 1; i < $2; i++)); do out="$out,0"; done
    echo "[$out]"
}
# dp_accounting MODE NP ACC LOG: the summary's counters and peaks = the formulas
dp_accounting() {
    local mode=$1 np=$2 acc=$3 log=$4 sum calls early opt comm want="" ok=1 n=$dp_steps
    sum=$(grep '"type":"summary"' "$log")
    case $mode in
        naive) calls=$dp_tensors ;;
        *) calls=$dp_nb ;;
    esac
    if [ $mode = ps ]; then
        # one reduce and one broadcast of 4P per step; only rank 0 keeps AdamW
        # state (8P) and the receive buffer (4P)
        opt=$(dp_rank0 $((8 * dp_P)) $np)
        comm=$(dp_rank0 $((4 * dp_P)) $np)
        echo "$sum" | grep -qF "\"broadcast\":{\"dp\":{\"calls\":$(rank_array $n $np),\"bytes\":$(rank_array $((n * 4 * dp_P)) $np)," &&
            echo "$sum" | grep -qF "\"reduce\":{\"dp\":{\"calls\":$(rank_array $n $np),\"bytes\":$(rank_array $((n * 4 * dp_P)) $np)," &&
            ! echo "$sum" | grep -qF '"allreduce"' || ok=0
        want="1 reduce and 1 broadcast of 4P bytes per step, AdamW state and receive buffer on rank 0 only"
    else
        opt=$(rank_array $((8 * dp_P)) $np)
        comm=$(rank_array 0 $np)
        echo "$sum" | grep -qF "\"allreduce\":{\"dp\":{\"calls\":$(rank_array $((n * calls)) $np),\"bytes\":$(rank_array $((n * 4 * dp_P)) $np)," || ok=0
        want="$calls all-reduces per step, together 4P bytes, 4P of params and of grads per rank"
    fi
    echo "$sum" | grep -qF "\"peak_bytes\":{\"params\":$(rank_array $((4 * dp_P)) $np),\"grads\":$(rank_array $((4 * dp_P)) $np),\"optimizer\":$opt,\"activations\":$(rank_array $((dp_seq_acts * dp_B / (np * acc))) $np),\"comm\":$comm," || ok=0
    # only overlapped mode may start an all-reduce before backward has ended
    early=0; [ $mode = overlapped ] && early=$dp_early
    echo "$sum" | grep -qE "\"early_buckets_per_step\":$early[,}]" || ok=0
    # the buckets the mode sends: naive and ps none, whatever --bucket-kb says
    nb=0; case $mode in bucketed | overlapped) nb=$dp_nb ;; esac
    echo "$sum" | grep -qE "\"buckets\":$nb[,}]" || ok=0
    case $mode in
        bucketed | overlapped) want="$want, $early of $dp_nb buckets started before backward ended" ;;
    esac
    if [ $ok = 1 ]; then
        pass "data parallel $mode dp=$np grad-accum=$acc: $want; activations of $((dp_B / (np * acc))) sequences"
    else
        fail "data parallel $mode dp=$np grad-accum=$acc: accounting" "want $want, activations $((dp_seq_acts * dp_B / (np * acc))) per rank, early_buckets_per_step $early; got $(echo "$sum" | sed 's/.*"peak_bytes"://')"
    fi
}
dp_case() {  # MODE NP ACC: one layout's invariant and accounting
    # bit-identical replicas by construction: every replica applies the same all-reduced bytes from the same start
    # and chapter 0's validation loss: each rank validates its slice of every
    # validation batch, micro-batch by micro-batch under --grad-accum
    invariant --norm --val --expect "bit-identical on every rank" "data parallel $1 dp=$2 grad-accum=$3" \
        "$INV_FLAGS" $2 chapter-2 "--dp $2 --dp-mode $1 --grad-accum $3 --bucket-kb 64"
    dp_accounting $1 $2 $3 "$INV_LOG"
}
# the layouts are independent: 2 at a time (jobs_run, tests/lib.sh); first
# the references of the --clip 0 and --wd 0.1 runs below
for extra in "--clip 0" "--wd 0.1"; do jobs_run reference "$INV_FLAGS $extra"; done
for mode in naive bucketed overlapped ps; do
    for np in 1 2 3 4; do
        for acc in 1 2; do
            jobs_run dp_case $mode $np $acc
        done
    done
done

# a bucket size that divides the gradients exactly (tiny's 4P = 482,304
# bytes = 3 x 157 KiB): 3 buckets, 3 all-reduces a step, no empty fourth
mpi_run $T_SHORT 2 "$BUILD/chapter-2" --dp 2 --dp-mode bucketed --bucket-kb 157 --steps 2 --batch 4 --seq 32 --peak-gflops 10 --log "$TEST_TMPDIR/dp_exact.jsonl"
sum=$(grep '"type":"summary"' "$TEST_TMPDIR/dp_exact.jsonl")
if [ $RC = 0 ] && [ $((3 * 157 * 1024)) = $((4 * dp_P)) ] && echo "$sum" | grep -qE '"buckets":3[,}]' &&
    echo "$sum" | grep -qF '"allreduce":{"dp":{"calls":[6,6],'; then
    pass "data parallel bucketed --bucket-kb 157 (4P in exactly 3 buckets): 3 buckets, 3 all-reduces a step"
else
    fail "data parallel: buckets that divide 4P" "exit $RC; $(echo "$sum" | grep -o '"buckets":[0-9]*\|"allreduce":{"dp":{"calls":[^]]*]')"
fi

# without clipping a missing or doubled gradient average moves the losses
# (with clipping on every step, the clip hides it); and weight decay
for extra in "--clip 0" "--wd 0.1"; do
    jobs_run invariant --norm "data parallel overlapped dp=2 $extra" "$INV_FLAGS $extra" 2 chapter-2 "--dp 2 --bucket-kb 64 $extra"
    jobs_run invariant --norm "data parallel ps dp=3 $extra" "$INV_FLAGS $extra" 3 chapter-2 "--dp 3 --dp-mode ps $extra"
done
# --comm hand: chapter 1's collectives (01_collectives/collectives.c) run the
# all-reduces and the start-up broadcast; the same invariant, and the
# counters count each hand collective once, as the library's
dp_hand() {  # NP
    local np=$1
    # bit-identical replicas by construction: every replica applies the same all-reduced bytes from the same start
    invariant --norm --expect "bit-identical on every rank" "data parallel overlapped dp=$np --comm hand" \
        "$INV_FLAGS" $np chapter-2 "--dp $np --dp-mode overlapped --bucket-kb 64 --comm hand"
    # the counters: one call per bucket, as the library's (the hand ring's
    # scratch is counted as comm memory, so the peaks differ from the library's)
    if grep '"type":"summary"' "$INV_LOG" | grep -qF "\"allreduce\":{\"dp\":{\"calls\":$(rank_array $((dp_steps * dp_nb)) $np),\"bytes\":$(rank_array $((dp_steps * 4 * dp_P)) $np),"; then
        pass "data parallel overlapped dp=$np --comm hand: $dp_nb all-reduces per step of together 4P bytes, counted as the library's"
    else
        fail "data parallel overlapped dp=$np --comm hand: counters" "$(grep -o '"allreduce":{[^}]*}' "$INV_LOG")"
    fi
}
for np in 2 3 4; do jobs_run dp_hand $np; done
# bit-identical replicas by construction: every rank receives the server's same broadcast bytes
jobs_run invariant --norm --expect "bit-identical on every rank" "data parallel ps dp=3 --comm hand" \
    "$INV_FLAGS" 3 chapter-2 "--dp 3 --dp-mode ps --comm hand"
jobs_wait

echo "== chapter 2: errors and --help"
bad_inputs
jobs_run error_case chapter-2 3 "--dp 3 --batch 4" "--batch 4 does not split over dp=3 ranks"
jobs_run error_case chapter-2 2 "--dp 2 --batch 6 --grad-accum 2" "--batch 6 does not split over dp=2 ranks x 2 micro-batches: use a batch divisible by 4"
jobs_run error_case chapter-2 2 "--dp 2 --batch 4 --grad-accum 3" "use at most 2 micro-batches, or a batch divisible by 6"
# more micro-batches than a rank has sequences: refused, where dp x micro in
# an int overflowed (2^30 x 4: a division by zero; 2^31-1 x 2: a run of
# micro-batches of 0 sequences that never ended)
jobs_run error_case chapter-2 4 "--dp 4 --batch 4 --grad-accum 1073741824" "too few for 1073741824 micro-batches: use at most 1 micro-batch"
jobs_run error_case chapter-2 2 "--dp 2 --batch 4 --grad-accum 2147483647" "leaves 2 sequences a rank, too few for 2147483647 micro-batches: use at most 2 micro-batches"
jobs_run error_case chapter-2 2 "--dp 2 --dp-mode rings" "--dp-mode rings is not one of"
jobs_run error_case chapter-2 2 "--dp 2 --tp 1" "this chapter has no tp axis"
jobs_run error_case chapter-2 2 "--dp 2 --model $TEST_TMPDIR/truncated.bin" "truncated or corrupt"
# --dp-mode overlapped starts every bucket before it waits for any: more
# buckets than the comm layer holds in flight (COMM_MAX_IN_FLIGHT, 1024) are
# refused up front, with the smallest size that fits (small: 43376640 bytes
# of gradients, 42 KiB = 1009 buckets, 41 KiB = 1034), not aborted mid-step
jobs_run error_case chapter-2 2 "--dp 2 --dp-mode overlapped --bucket-kb 7 --model small --batch 2 --seq 32" "use --bucket-kb 42 or more"
jobs_run error_case chapter-2 2 "--dp 2 --dp-mode overlapped --bucket-kb 41 --model small --batch 2 --seq 32" "use --bucket-kb 42 or more"
dp_fewest_buckets() {
    mpi_run $T_RUN 2 "$BUILD/chapter-2" --dp 2 --dp-mode overlapped --bucket-kb 42 --model small --batch 2 --seq 32 --steps 2 --peak-gflops 10
    # (and --peak-gflops is one rank's: the MFU's denominator is said as the two ranks' sum)
    if [ $RC = 0 ] && echo "$OUT" | grep -q "mode overlapped, 1009 buckets of 42 KiB" && echo "$OUT" | grep -q "bit-identical on every rank" &&
        echo "$OUT" | grep -q "of 20.0 GFLOP/s matmul peak given by --peak-gflops (2 ranks x 10.0)$"; then
        pass "chapter 2 overlapped, --bucket-kb 42 on small: 1009 buckets in flight at once, 2 steps, replicas bit-identical; the peak 2 ranks x 10.0"
    else
        fail "chapter 2 overlapped at the fewest KiB that fit" "exit $RC; $(echo "$OUT" | grep -E '^error|buckets' | head -2)"
    fi
}
jobs_run dp_fewest_buckets
jobs_run help_case chapter-2 "--dp-mode S"
jobs_run help_case chapter-2 "--comm S"
jobs_run error_case chapter-2 2 "--dp 2 --comm mpi" "--comm mpi is not one of library, hand"
jobs_wait  # independent: 2 at a time

finish
