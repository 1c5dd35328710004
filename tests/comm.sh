#!/bin/bash
# The comm layer beyond one axis: groups over several mesh axes and over
# listed ranks (tests/test_comm.c on 4 ranks), their summary keys, a message
# shorter than its receive refused (NCCL's rule, on the CPU), and the
# progress call that moves non-blocking MPI operations while compute runs.
. "$(dirname "$0")/lib.sh"
# test_comm on 4 ranks: every group over every set of axes of a 2x2 (dp x
# tp) and a 2x1x2 (dp x tp x cp) mesh reduces over exactly its ranks and is
# counted in its own slot; a group of listed ranks too; the summary's "comm"
# has a key per group. Then a bad rank list, and chapter 3's prefetch line
# with comm_progress on and off (the losses must not move: progress only
# moves bytes sooner).
echo "== comm: groups over several axes, progress"
comm_log=$TEST_TMPDIR/test_comm.jsonl
out=$(timeout 300 $MPIRUN -np 4 "$BUILD/tests/test_comm" --log "$comm_log" 2>&1)
rc=$?
echo "$out" | grep -E '^(PASS|FAIL)'
passed=$((passed + $(echo "$out" | grep -c '^PASS')))
failed=$((failed + $(echo "$out" | grep -c '^FAIL')))
if [ $rc -ne 0 ] && ! echo "$out" | grep -q '^FAIL'; then
    fail "test_comm on 4 ranks" "exit $rc (124 = hang) without a failed check: $(echo "$out" | tail -3)"
fi
if grep '"type":"summary"' "$comm_log" 2>/dev/null | grep -q '"allreduce":{"dp":{"calls":\[4,4,4,4\].*"dp+cp":{"calls":\[4,4,4,4\].*"ends":{"calls":\[1,0,0,1\]'; then
    pass "summary: a group over several axes is its own key beside the axes (\"dp+cp\"), a listed group under its name"
else
    fail "summary keys for groups" "$(grep -o '"comm":{.\{0,300\}' "$comm_log" 2>/dev/null)"
fi
error_case tests/test_comm 4 "--bad-list" "comm_create_group_ranks: rank 0 is listed twice"
# a message shorter than the receive posted for it: MPI takes it, NCCL would
# not match the two, so the CPU backend ends the job naming both ranks
for mode in recv sendrecv irecv; do
    out=$(timeout -k 5 60 $MPIRUN -np 4 "$BUILD/tests/test_comm" --short-message $mode 2>&1)
    rc=$?
    if [ $rc -ne 0 ] && [ $rc -ne 124 ] &&
        echo "$out" | grep -q "^\[rank 1\] .*: rank 1 of group world received 3 floats from its rank 0 where the receive posted 4: a send and its receive must have the same count"; then
        pass "comm_$mode: a message of 3 floats into a receive of 4 ends the job, both ranks named"
    else
        fail "comm_$mode with a short message" "exit $rc (124 = hang); $(echo "$out" | grep -E 'rank|error' | head -2)"
    fi
done
reference "--steps 10 --batch 24 --seq 32 --peak-gflops 10"
ref=$REF
for us in 1 0; do
    run=$TEST_TMPDIR/pt_run.jsonl
    rm -f "$run"
    out=$(COMM_PROGRESS=$us timeout 120 $MPIRUN -x COMM_PROGRESS -np 2 "$BUILD/chapter-3" --dp 2 --zero 3 \
        --steps 10 --batch 24 --seq 32 --peak-gflops 10 --log "$run" 2>&1)
    rc=$?
    cmp=$(bash tests/compare_losses.sh "$ref" "$run" $TOL 2>&1)
    crc=$?
    # the norms too: a gradient scaled by a constant leaves the losses alone
    ncmp=$(bash tests/compare_losses.sh "$ref" "$run" $TOL_NORM norm 2>&1) || crc=1
    cmp="$cmp; norms: ${ncmp#* steps, }"
    want=on; [ $us = 0 ] && want=off
    if [ $rc -eq 0 ] && [ $crc -eq 0 ] && echo "$out" | grep -q "^prefetch: .* hidden behind compute .*comm_progress $want)" &&
        grep '"type":"summary"' "$run" | grep -q "\"prefetch_hidden_share\":[01]\.[0-9]*,.*\"comm_progress\":$us"; then
        pass "chapter 3 ZeRO-3 dp=2, COMM_PROGRESS=$us: comm_progress $want, chapter 0's losses and norms ($cmp), share hidden reported"
    else
        fail "chapter 3 with COMM_PROGRESS=$us" "exit $rc; $cmp; $(echo "$out" | grep -E '^prefetch|^error|rank' | head -3)"
    fi
done

# --comm hand in chapters 4-7: chapter 1's hand-written collectives in place
# of the library's, on the same mesh, give the same step records (loss and
# norm as logged, %.8g and %.6f): cm_pair runs the pair, 3 steps each. Where
# every reduction is over 2 ranks the sum a + b is the same either way, bit
# for bit; chapter 7 averages over dp x ep = 4 ranks, which the ring adds in
# another order, so there (--tol) the losses agree within the invariant's
# TOL and the norms within TOL_NORM.
echo "== comm: --comm hand against --comm library, chapters 4 to 7"
cm_steps() { grep '"type":"step"' "$1" | sed 's/,"ms":.*//'; }
cm_pair() {  # [--tol] WHAT NP BIN FLAGS...: the library run, the hand run, the same records
    local tol=0 what np bin mode ok=1 cmp
    if [ "$1" = --tol ]; then tol=1; shift; fi
    what=$1 np=$2 bin=$3
    shift 3
    for mode in library hand; do
        rm -f "$TEST_TMPDIR/cm_$mode.jsonl"
        mpi_run $T_SHORT "$np" "$BUILD/$bin" --steps 3 --batch 8 --seq 32 --peak-gflops 10 --comm $mode \
            --log "$TEST_TMPDIR/cm_$mode.jsonl" "$@"
        [ "$RC" -eq 0 ] || ok=0
    done
    # the hand run really ran chapter 1's code (a 2-rank sum is the same
    # either way, so equal records alone would not show it)
    local nh
    nh=$(grep -o '"hand_collectives":[0-9]*' "$TEST_TMPDIR/cm_hand.jsonl" | cut -d: -f2)
    if grep -q '"comm_impl":"hand"' "$TEST_TMPDIR/cm_hand.jsonl" && [ "${nh:-0}" -gt 0 ] &&
        grep -q '"comm_impl":"library","hand_collectives":0' "$TEST_TMPDIR/cm_library.jsonl"; then
        pass "$what --comm hand: rank 0 ran $nh collectives of chapter 1's code, the library run none"
    else
        fail "$what --comm hand: the summary does not show chapter 1's collectives ran" \
            "$(grep -o '"comm_impl":"[a-z]*","hand_collectives":[0-9]*' "$TEST_TMPDIR"/cm_*.jsonl)"
    fi
    if [ $tol = 1 ]; then
        if [ $ok = 1 ] && cmp=$(bash tests/compare_losses.sh "$TEST_TMPDIR/cm_library.jsonl" \
            "$TEST_TMPDIR/cm_hand.jsonl" $TOL 2>&1) && cmp="$cmp; $(bash tests/compare_losses.sh \
            "$TEST_TMPDIR/cm_library.jsonl" "$TEST_TMPDIR/cm_hand.jsonl" $TOL_NORM norm 2>&1)"; then
            pass "$what --comm hand: --comm library's 3 losses within $TOL, norms within $TOL_NORM ($cmp)"
        else
            fail "$what --comm hand" "exit $RC; $cmp"
        fi
    # bit for bit by construction: every sum is over 2 ranks, a + b = b + a; the other calls are the same
    elif [ $ok = 1 ] && [ -s "$TEST_TMPDIR/cm_hand.jsonl" ] &&
        [ "$(cm_steps "$TEST_TMPDIR/cm_hand.jsonl")" = "$(cm_steps "$TEST_TMPDIR/cm_library.jsonl")" ]; then
        pass "$what --comm hand: the same 3 losses and norms as --comm library, bit for bit"
    else
        fail "$what --comm hand" "exit $RC; $(diff <(cm_steps "$TEST_TMPDIR/cm_hand.jsonl") \
            <(cm_steps "$TEST_TMPDIR/cm_library.jsonl") 2>&1 | head -4)"
    fi
}
cm_pair "chapter 4 dp=2 x tp=2" 4 chapter-4 --dp 2 --tp 2
cm_pair "chapter 5 pp=2 x dp=2 1f1b" 4 chapter-5 --pp 2 --dp 2 --schedule 1f1b
cm_pair "chapter 6 cp=2 ring" 2 chapter-6 --cp 2
cm_pair "chapter 6 tp=2 --sp" 2 chapter-6 --tp 2 --sp
cm_pair --tol "chapter 7 ep=2 x dp=2" 4 chapter-7 --ep 2 --dp 2

finish
