#!/bin/bash
# The comm layer beyond one axis: groups over several mesh axes and over
# listed ranks (tests/test_comm.c on 4 ranks), their summary keys, and the
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
    want=on; [ $us = 0 ] && want=off
    if [ $rc -eq 0 ] && [ $crc -eq 0 ] && echo "$out" | grep -q "^prefetch: .* hidden behind compute .*comm_progress $want)" &&
        grep '"type":"summary"' "$run" | grep -q "\"prefetch_hidden_share\":[01]\.[0-9]*,.*\"comm_progress\":$us"; then
        pass "chapter 3 ZeRO-3 dp=2, COMM_PROGRESS=$us: comm_progress $want, chapter 0's losses ($cmp), share hidden reported"
    else
        fail "chapter 3 with COMM_PROGRESS=$us" "exit $rc; $cmp; $(echo "$out" | grep -E '^prefetch|^error|rank' | head -3)"
    fi
done

finish
