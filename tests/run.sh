#!/bin/bash
# The one test runner: `make test` calls it after building everything.
# Runs the C test programs and the MPI runs of the chapters, counts every
# check, and ends with the line "N passed, N failed, N skipped".
set -u
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
MPIRUN="bash tests/mpirun.sh"
export TEST_TMPDIR=$(mktemp -d)
trap 'rm -rf "$TEST_TMPDIR"' EXIT
passed=0
failed=0
skipped=0

pass() { echo "PASS $1"; passed=$((passed + 1)); }
fail() { echo "FAIL $1: $2"; failed=$((failed + 1)); }
skip() { echo "SKIP $1: $2"; skipped=$((skipped + 1)); }

# A C test program prints PASS/FAIL lines; a crash counts as one failure.
run_program() {
    local prog=$1 out rc
    out=$("$prog" 2>&1)
    rc=$?
    echo "$out" | grep -E '^(PASS|FAIL)'
    passed=$((passed + $(echo "$out" | grep -c '^PASS')))
    failed=$((failed + $(echo "$out" | grep -c '^FAIL')))
    if [ $rc -ne 0 ] && ! echo "$out" | grep -q '^FAIL'; then
        fail "$(basename "$prog")" "exited $rc without a failed check: $(echo "$out" | tail -3)"
    fi
}

echo "== unit tests"
for t in test_ops test_model test_data; do
    run_program "$BUILD/tests/$t"
done

echo "== chapter 0: the mesh"
# np, flags, a group line the picture must show
mesh_case() {
    local np=$1 flags=$2 expect=$3 out rc
    out=$(timeout 60 $MPIRUN -np "$np" "$BUILD/chapter-0" $flags --steps 0 2>&1)
    rc=$?
    if [ $rc -eq 0 ] && echo "$out" | grep -q "mesh check: the sum of ranks along every axis matches" &&
        echo "$out" | grep -qF -- "$expect"; then
        pass "mesh on $np ranks ($flags) checks out and shows '$expect'"
    else
        fail "mesh on $np ranks ($flags)" "exit $rc; output: $(echo "$out" | head -20)"
    fi
}
mesh_case 1 "" "rank 0 holds the whole model"
mesh_case 2 "--dp 2" "dp groups: {0,1}"
mesh_case 2 "--tp 2" "tp groups: {0,1}"
mesh_case 4 "--dp 2 --tp 2" "dp groups: {0,2} {1,3}"
mesh_case 4 "--dp 2 --tp 2" "tp groups: {0,1} {2,3}"
mesh_case 4 "--pp 2 --dp 2" "pp groups: {0,2} {1,3}"
mesh_case 4 "--pp 4" "pp groups: {0,1,2,3}"
mesh_case 6 "--dp 3 --tp 2" "dp groups: {0,2,4} {1,3,5}"
mesh_case 6 "--pp 2 --cp 3" "cp groups: {0,1,2} {3,4,5}"
mesh_case 6 "--dp 2 --ep 3" "ep groups: {0,1,2} {3,4,5}"

echo "== chapter 0: the reference trainer"
log1=$TEST_TMPDIR/ref1.jsonl
log2=$TEST_TMPDIR/ref2.jsonl
out=$(timeout 120 $MPIRUN -np 1 "$BUILD/chapter-0" --steps 12 --peak-gflops 10 --log "$log1" 2>&1)
rc=$?
if [ $rc -eq 0 ] && [ "$(grep -c '"type":"step"' "$log1")" = 12 ] && grep -q '"type":"summary"' "$log1"; then
    pass "reference: 12 steps on the default corpus write 12 step records and a summary"
else
    fail "reference: 12 steps" "exit $rc; $(echo "$out" | tail -5)"
fi
first=$(grep '"type":"step"' "$log1" | head -1 | sed 's/.*"loss":\([0-9.]*\).*/\1/')
last=$(grep '"type":"step"' "$log1" | tail -1 | sed 's/.*"loss":\([0-9.]*\).*/\1/')
if awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a - 0.3) }'; then
    pass "reference: loss falls over 12 steps ($first -> $last)"
else
    fail "reference: loss falls" "first $first, last $last"
fi
for field in '"peak_bytes":{"params":\[' '"grads":\[' '"optimizer":\[' '"activations":\[' '"comm":\[' '"other":\[' '"tokens_per_s":' '"mfu":' '"mesh":{"dp":1'; do
    if grep '"type":"summary"' "$log1" | grep -q "$field"; then
        pass "reference: summary carries $field"
    else
        fail "reference: summary carries $field" "$(grep summary "$log1")"
    fi
done
timeout 120 $MPIRUN -np 1 "$BUILD/chapter-0" --steps 12 --peak-gflops 10 --log "$log2" >/dev/null 2>&1
if [ "$(grep '"type":"step"' "$log1" | sed 's/,"ms".*//')" = "$(grep '"type":"step"' "$log2" | sed 's/,"ms".*//')" ]; then
    pass "reference: two runs give bit-identical losses"
else
    fail "reference: two runs give bit-identical losses" "losses differ"
fi
# save, then load the saved file as the model: the loaded model has the same
# validation loss as the one that was saved
ckpt=$TEST_TMPDIR/ref.bin
saved=$(timeout 120 $MPIRUN -np 1 "$BUILD/chapter-0" --steps 3 --peak-gflops 10 --save "$ckpt" 2>&1 | grep 'val loss' | tail -1 | sed 's/.*val loss //')
loaded=$(timeout 120 $MPIRUN -np 1 "$BUILD/chapter-0" --model "$ckpt" --steps 0 --peak-gflops 10 2>&1 | grep 'val loss' | tail -1 | sed 's/.*val loss //')
if [ -f "$ckpt" ] && [ -n "$saved" ] && [ "$saved" = "$loaded" ]; then
    pass "reference: a saved checkpoint loads back with the same validation loss ($loaded)"
else
    fail "reference: save and load" "val loss when saved '$saved', after loading '$loaded'"
fi

# a text file turned into token files trains exactly like the text file itself
head -c 200000 /usr/share/games/fortunes/fortunes > "$TEST_TMPDIR/corpus.txt"
"$BUILD/tokenize" "$TEST_TMPDIR/corpus.txt" "$TEST_TMPDIR/corpus" >/dev/null
from_text=$(timeout 60 $MPIRUN -np 1 "$BUILD/chapter-0" --data "$TEST_TMPDIR/corpus.txt" --steps 3 --peak-gflops 10 2>&1 | grep -E 'loss' | sed 's/|[^|]*ms.*//')
from_tokens=$(timeout 60 $MPIRUN -np 1 "$BUILD/chapter-0" --data "$TEST_TMPDIR/corpus_train.bin" --val "$TEST_TMPDIR/corpus_val.bin" --steps 3 --peak-gflops 10 2>&1 | grep -E 'loss' | sed 's/|[^|]*ms.*//')
if [ -n "$from_text" ] && [ "$from_text" = "$from_tokens" ] && [ "$(echo "$from_text" | wc -l)" = 4 ]; then
    pass "tokenize: token files from a text file give the same losses as the text file"
else
    fail "tokenize" "text: $from_text / tokens: $from_tokens"
fi

# --sample N prints N generated characters after training, then a newline.
# Counted through a file: the byte-level sampler may emit a NUL, which a shell
# variable would drop.
timeout 60 $MPIRUN -np 1 "$BUILD/chapter-0" --steps 2 --sample 50 --peak-gflops 10 > "$TEST_TMPDIR/sample.out" 2>&1
n=$(sed -n '/^sample (50 tokens):/,$p' "$TEST_TMPDIR/sample.out" | tail -n +2 | wc -c)
if grep -q '^sample (50 tokens):' "$TEST_TMPDIR/sample.out" && [ "$n" = 51 ]; then
    pass "--sample 50 prints a sample of 50 generated characters"
else
    fail "--sample 50" "$n bytes after the header, want 51; $(tail -4 "$TEST_TMPDIR/sample.out")"
fi

# the summary's MFU is tokens/s * flops/token / peak (docs/00_mesh.md, section 6.2)
mfu_log=$TEST_TMPDIR/mfu.jsonl
timeout 60 $MPIRUN -np 1 "$BUILD/chapter-0" --steps 3 --peak-gflops 10 --log "$mfu_log" >/dev/null 2>&1
mfu_check=$(grep '"type":"summary"' "$mfu_log" | awk '{
    match($0, /"tokens_per_s":[0-9.e+-]+/); tps = substr($0, RSTART + 15, RLENGTH - 15)
    match($0, /"flops_per_token":[0-9.e+-]+/); fpt = substr($0, RSTART + 18, RLENGTH - 18)
    match($0, /"peak_gflops":[0-9.e+-]+/); pk = substr($0, RSTART + 14, RLENGTH - 14)
    match($0, /"mfu":[0-9.e+-]+/); mfu = substr($0, RSTART + 6, RLENGTH - 6)
    want = tps * fpt / (pk * 1e9); d = mfu - want; if (d < 0) d = -d
    printf "%s %.5f %.5f %s", (fpt + 0 == 786432 && pk + 0 == 10 && d <= 1e-5 + 1e-3 * want) ? "ok" : "bad", mfu, want, fpt }')
if [ "${mfu_check%% *}" = ok ]; then
    pass "summary: flops_per_token 786432 for tiny at T=64, mfu = tokens/s * flops/token / peak ($mfu_check)"
else
    fail "summary MFU" "${mfu_check:-no summary record}"
fi

echo "== errors: one message from rank 0, non-zero exit, no hang"
# error_case BINARY NP "FLAGS" "PHRASE": the run must end non-zero (not by the
# 60 s timeout), with exactly one line "error: ..." that contains PHRASE
error_case() {
    local bin=$1 np=$2 flags=$3 expect=$4 out rc start end n
    start=$(date +%s)
    out=$(timeout 60 $MPIRUN -np "$np" "$BUILD/$bin" $flags 2>&1)
    rc=$?
    end=$(date +%s)
    n=$(echo "$out" | grep -c '^error: ')
    if [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ "$n" = 1 ] && echo "$out" | grep '^error: ' | grep -qF -- "$expect"; then
        pass "$bin on $np rank(s), '$flags': error '$expect' ($((end - start)) s)"
    else
        fail "$bin on $np rank(s), '$flags'" "exit $rc (124 = hang), $n error lines; output: $(echo "$out" | head -8)"
    fi
}
printf 'not a checkpoint at all, just some text that is long enough to fill a header ............................................................................................................................................................................................................................................................................................................................................................................................................................................................................................................................................................................................................................................................................................................................................................................................................................................................................................................................................................................................................................................................................................................\n' > "$TEST_TMPDIR/text.bin"
head -c 2000 "$ckpt" > "$TEST_TMPDIR/truncated.bin"
printf 'short' > "$TEST_TMPDIR/short.txt"
error_case chapter-0 1 "--bogus 3" "unknown flag --bogus"
error_case chapter-0 2 "--steps abc" "--steps needs an integer"
error_case chapter-0 2 "--steps" "needs a value"
error_case chapter-0 2 "--lr -1" "--lr must be positive"
error_case chapter-0 2 "--dp 3" "has 3 ranks but mpirun started 2"
error_case chapter-0 4 "--dp 2 --tp 4" "has 8 ranks but mpirun started 4"
error_case chapter-0 1 "--model nosuch.bin" "cannot open checkpoint 'nosuch.bin'"
error_case chapter-0 1 "--model $TEST_TMPDIR/text.bin" "not an llm.c GPT-2 checkpoint"
error_case chapter-0 1 "--model $TEST_TMPDIR/truncated.bin" "truncated or corrupt"
error_case chapter-0 1 "--data $TEST_TMPDIR/nosuch.txt" "cannot open data file"
error_case chapter-0 1 "--data $TEST_TMPDIR" "Is a directory"
error_case chapter-0 1 "--model $TEST_TMPDIR" "is not a regular file but a directory"
error_case chapter-0 1 "--lr inf" "--lr needs a number, got 'inf'"
error_case chapter-0 1 "--data $TEST_TMPDIR/short.txt" "fewer than one batch needs"
error_case chapter-0 1 "--val $TEST_TMPDIR/short.txt" "too short for its 1024-byte header"
error_case chapter-0 1 "--val $TEST_TMPDIR/text.bin" "not an llm.c token file"
error_case chapter-0 1 "--seq 100" "longer than the model's 64 positions"
error_case chapter-0 1 "--log /nonexistent-dir/x.jsonl" "cannot write --log '/nonexistent-dir/x.jsonl': its directory '/nonexistent-dir' does not exist"
error_case chapter-0 1 "--save /nonexistent-dir/x.bin --steps 1" "cannot write --save '/nonexistent-dir/x.bin': its directory '/nonexistent-dir' does not exist"
error_case chapter-0 3 "--steps 5" "mpirun started 3 ranks: give axis sizes whose product is 3"
if [ -e /nonexistent-dir/x.bin ] || ls /nonexistent-dir 2>/dev/null | grep -q tmp; then
    fail "errors: no partial checkpoint left behind" "found a file"
else
    pass "errors: no partial checkpoint left behind"
fi

# ==== new tests: hardening (issue 23) ====
echo "== hardening: divergence, log writes, input checks"
# divergence stops every chapter with the step and the last finite loss;
# the log stays valid JSON and a good checkpoint is not overwritten
bash tests/mpirun.sh -np 1 "$BUILD/chapter-0" --steps 2 --save "$TEST_TMPDIR/good.bin" >/dev/null 2>&1
cp "$TEST_TMPDIR/good.bin" "$TEST_TMPDIR/good_before.bin"
for spec in "chapter-0 1" "chapter-2 2 --dp 2" "chapter-3 2 --dp 2"; do
    set -- $spec
    bin=$1 np=$2
    shift 2
    rm -f "$TEST_TMPDIR/div.jsonl"
    out=$(timeout 60 $MPIRUN -np "$np" "$BUILD/$bin" "$@" --steps 3 --lr 1e30 --clip 0 --log "$TEST_TMPDIR/div.jsonl" \
          --save "$TEST_TMPDIR/good.bin" 2>&1)
    rc=$?
    n=$(echo "$out" | grep -c '^error: training diverged at step 1: .*the last finite loss was [0-9.]* at step 0')
    if [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ "$n" = 1 ] && ! grep -qiE 'nan|inf' "$TEST_TMPDIR/div.jsonl" &&
        cmp -s "$TEST_TMPDIR/good.bin" "$TEST_TMPDIR/good_before.bin"; then
        pass "hardening: $bin on $np rank(s) stops at a non-finite loss (step, last finite loss; log valid; checkpoint kept)"
    else
        fail "hardening: $bin divergence" "exit $rc, $n matching error lines; log: $(head -c 300 "$TEST_TMPDIR/div.jsonl"); output: $(echo "$out" | grep -v '^step' | head -5)"
    fi
done
# a log that cannot be written ends the run (here: a full disk)
out=$(timeout 60 $MPIRUN -np 2 "$BUILD/chapter-2" --dp 2 --steps 2 --log /dev/full 2>&1)
rc=$?
if [ $rc -ne 0 ] && [ $rc -ne 124 ] && echo "$out" | grep -q "writing the log file '/dev/full' failed: No space left on device"; then
    pass "hardening: a failed log write (full disk) ends the run with a message"
else
    fail "hardening: full-disk log" "exit $rc; $(echo "$out" | head -5)"
fi
error_case chapter-0 1 "--batch 0" "--batch must be positive"
error_case chapter-0 1 "--seq 0" "--seq must be positive"
error_case chapter-0 1 "--lr 1e-50" "1e-50 is too small for a float"
error_case chapter-0 1 "--val $TEST_TMPDIR" "is not a regular file but a directory"
error_case chapter-0 1 "--sample 1000000" "--sample must be between 0 and 100000"
error_case chapter-0 1 "--dp 65536 --tp 65536 --pp 65536 --cp 65536" "has 18446744073709551616 ranks but mpirun started 1"
error_case chapter-1 2 "--bench --op nosuch" "--op 'nosuch' matches no algorithm"
head -c 5000 "$TEST_TMPDIR/corpus.txt" > "$TEST_TMPDIR/short_val.txt"
"$BUILD/tokenize" "$TEST_TMPDIR/short_val.txt" "$TEST_TMPDIR/short_val" >/dev/null
error_case chapter-0 1 "--val $TEST_TMPDIR/short_val_val.bin --batch 8" "validation file '$TEST_TMPDIR/short_val_val.bin' has 500 tokens, fewer than one batch"
error_case chapter-0 1 "--data $ckpt" "is an llm.c model checkpoint, not training data"
# a model path with a quote is escaped in the JSON summary
cp "$ckpt" "$TEST_TMPDIR/a\"b.bin"
timeout 60 $MPIRUN -np 1 "$BUILD/chapter-0" --model "$TEST_TMPDIR/a\"b.bin" --steps 1 --log "$TEST_TMPDIR/quote.jsonl" >/dev/null 2>&1
if grep -qF "\"model\":\"$TEST_TMPDIR/a\\\"b.bin\"" "$TEST_TMPDIR/quote.jsonl"; then
    pass "hardening: a model path with a quote is escaped in the JSON summary"
else
    fail "hardening: model path escaping" "$(grep -o '"model":[^,]*' "$TEST_TMPDIR/quote.jsonl")"
fi
# past a file-size limit the token writer fails with a message naming its
# target and leaves no temporary file (SIGXFSZ is ignored during the write)
out=$( (ulimit -f 10; "$BUILD/tokenize" "$TEST_TMPDIR/corpus.txt" "$TEST_TMPDIR/limited") 2>&1)
rc=$?
if [ $rc -ne 0 ] && echo "$out" | grep -q "writing '$TEST_TMPDIR/limited_train.bin' failed: File too large" &&
    [ -z "$(ls "$TEST_TMPDIR" | grep 'limited.*tmp')" ]; then
    pass "hardening: a write past the file-size limit fails with a message and leaves no temporary file"
else
    fail "hardening: file-size limit" "exit $rc; $out; $(ls "$TEST_TMPDIR" | grep limited)"
fi
# an output that is an input is refused before anything is written (same
# device and inode: a hard link counts), and the input is left intact
"$BUILD/tokenize" "$TEST_TMPDIR/corpus.txt" "$TEST_TMPDIR/same" >/dev/null
cp "$TEST_TMPDIR/same_train.bin" "$TEST_TMPDIR/same_before.bin"
error_case chapter-0 1 "--data $TEST_TMPDIR/same_train.bin --log $TEST_TMPDIR/same_train.bin" "--log '$TEST_TMPDIR/same_train.bin' is the same file as --data"
ln -f "$ckpt" "$TEST_TMPDIR/hardlink.bin"
error_case chapter-0 1 "--model $ckpt --save $TEST_TMPDIR/hardlink.bin" "--save '$TEST_TMPDIR/hardlink.bin' is the same file as --model"
error_case chapter-3 2 "--dp 2 --model $ckpt --log $ckpt" "--log '$ckpt' is the same file as --model"
error_case chapter-0 1 "--save $TEST_TMPDIR" "it is a directory"
if cmp -s "$TEST_TMPDIR/same_train.bin" "$TEST_TMPDIR/same_before.bin" && head -c 4 "$ckpt" | od -An -tu4 | grep -q 20240326; then
    pass "hardening: refused outputs left their inputs intact"
else
    fail "hardening: inputs intact" "an input was changed"
fi
# two runs given one log: the second fails clearly, the first keeps writing
timeout 120 $MPIRUN -np 1 "$BUILD/chapter-0" --steps 400 --log "$TEST_TMPDIR/shared.jsonl" >/dev/null 2>&1 &
first=$!
for i in $(seq 1 100); do grep -q '"type":"step"' "$TEST_TMPDIR/shared.jsonl" 2>/dev/null && break; sleep 0.2; done
error_case chapter-0 1 "--steps 1 --log $TEST_TMPDIR/shared.jsonl" "is being written by another run"
kill $first 2>/dev/null
wait $first 2>/dev/null
# ==== end of new tests: hardening ====


echo "== chapter 1: collectives by hand"
# every algorithm against the exact result and the library, odd counts,
# both roots, integer and random data; all-to-all-v against the exact blocks;
# COMM_AVG against sum/p; non-blocking forms; the counters of every collective
for np in 1 2 3 4 5 8; do
    out=$(timeout 120 $MPIRUN -np $np "$BUILD/chapter-1" --check 2>&1)
    rc=$?
    if [ $rc -eq 0 ] && echo "$out" | grep -q "check summary: \([0-9]*\) of \1 collective runs match on $np ranks$"; then
        pass "collectives on $np ranks: $(echo "$out" | grep 'check summary' | sed 's/check summary: //')"
    else
        fail "collectives on $np ranks" "exit $rc; $(echo "$out" | grep -E 'FAIL|summary|error' | head -5)"
    fi
done
# the trace shows p-1 ring steps per rank for reduce-scatter: p(p-1) lines
out=$(timeout 60 $MPIRUN -np 4 "$BUILD/chapter-1" --trace 2>&1)
n=$(echo "$out" | sed -n '/^== reduce_scatter/,/^$/p' | grep -c 'sends chunk')
if [ "$n" = 12 ] && echo "$out" | grep -q "step 2: rank 3 sends chunk 0 to rank 0, adds chunk 3 from rank 2"; then
    pass "collectives: --trace on 4 ranks shows the 12 messages of the ring reduce-scatter"
else
    fail "collectives: --trace" "$n ring lines; $(echo "$out" | head -12)"
fi
# the bench runs, finds nothing wrong, and writes the rows the plots read
blog=$TEST_TMPDIR/bench.jsonl
out=$(timeout 120 $MPIRUN -np 2 "$BUILD/chapter-1" --bench --min-bytes 8 --max-bytes 64K --iters 3 --log "$blog" 2>&1)
rows=$(grep -c '"type":"collective"' "$blog" 2>/dev/null)
if [ $? -eq 0 ] && [ "$rows" -ge 90 ] && ! grep -q '"hand_wrong":[1-9]' "$blog" && ! grep -q '"lib_wrong":[1-9]' "$blog" &&
    grep '"type":"collective"' "$blog" | head -1 | grep -q '"hand_busbw":.*"lib_busbw":' && grep -q '"type":"copy_bandwidth"' "$blog"; then
    pass "collectives: --bench writes $rows rows, none wrong, with busbw for hand and library"
else
    fail "collectives: --bench" "$rows rows; $(echo "$out" | tail -5)"
fi
# busbw = algbw * nccl-tests' factor, written out here independently of the
# program: 2(p-1)/p for all-reduce (both algorithms), (p-1)/p for
# reduce-scatter, all-gather, scatter, gather and all-to-all, 1 for broadcast
# and reduce; and algbw = bytes / time. Checked for hand and library columns
# of every row whose algbw is large enough (>= 0.01 GB/s) for the 5 printed
# decimals; every op must have such a row. 2 ranks from the bench above; 3 and
# 4 ranks from one size each (on 2 ranks all-reduce, broadcast and reduce
# share the factor 1, so only more ranks tell them apart).
busbw_factors() {  # JSONL file, ranks -> "ok N" or a complaint
    grep '"type":"collective"' "$1" | awk -v P="$2" '
        function field(name,   m) {
            if (!match($0, "\"" name "\":[^,}]*")) return "";
            m = substr($0, RSTART, RLENGTH); sub(/^[^:]*:/, "", m); gsub(/"/, "", m); return m
        }
        BEGIN { split("allreduce_ring allreduce_doubling reduce_scatter allgather broadcast reduce scatter gather alltoall", ops, " ") }
        {
            op = field("op"); p = field("ranks") + 0; bytes = field("bytes") + 0
            if (p != P) { bad = bad " " op ":ranks=" p; next }
            if (op ~ /^allreduce_/) f = 2 * (p - 1) / p
            else if (op == "broadcast" || op == "reduce") f = 1
            else if (op == "reduce_scatter" || op == "allgather" || op == "scatter" || op == "gather" || op == "alltoall") f = (p - 1) / p
            else { bad = bad " unknown-op:" op; next }
            for (s = 0; s < 2; s++) {
                side = s ? "lib" : "hand"
                alg = field(side "_algbw") + 0; bus = field(side "_busbw") + 0; us = field(side "_us") + 0
                if (alg < 0.01) continue
                d = bus - f * alg; if (d < 0) d = -d
                # time is printed to 0.001 us and algbw to 0.00001 GB/s: algbw must lie
                # in the interval those roundings leave
                lo = bytes / ((us + 0.0005) * 1000) - 0.000005; hi = us > 0.0005 ? bytes / ((us - 0.0005) * 1000) + 0.000005 : 1e30
                if (d > 2e-5) bad = bad sprintf(" %s/%s@%d:busbw=%s,algbw*%.4f=%.5f", op, side, bytes, bus, f, f * alg)
                if (alg < lo || alg > hi) bad = bad sprintf(" %s/%s@%d:algbw=%s,bytes/time=%.5f", op, side, bytes, alg, bytes / (us * 1000))
                checked[op]++; n++
            }
        }
        END {
            for (i = 1; i <= 9; i++) if (!checked[ops[i]]) bad = bad " no-usable-row:" ops[i]
            if (bad != "") print "bad" bad; else print "ok " n
        }'
}
res=$(busbw_factors "$blog" 2)
if [ "${res%% *}" = ok ]; then
    pass "collectives: busbw = algbw x nccl-tests factor and algbw = bytes/time, every op, 2 ranks (${res#ok } values)"
else
    fail "collectives: bus factors on 2 ranks" "$res"
fi
for np in 3 4; do
    flog=$TEST_TMPDIR/bench_np$np.jsonl
    timeout 60 $MPIRUN -np $np "$BUILD/chapter-1" --bench --min-bytes 64K --max-bytes 64K --iters 3 --log "$flog" >/dev/null 2>&1
    res=$(busbw_factors "$flog" $np)
    if [ "${res%% *}" = ok ]; then
        pass "collectives: busbw = algbw x nccl-tests factor and algbw = bytes/time, every op, $np ranks (${res#ok } values)"
    else
        fail "collectives: bus factors on $np ranks" "$res"
    fi
done
error_case chapter-1 2 "--steps 3" "unknown flag --steps"
error_case chapter-1 2 "--max-bytes 12Q" "is not a size"
error_case chapter-1 1 "--bench --min-bytes 1M --max-bytes 1K" "larger than --max-bytes"

echo "== chapter 2: data parallel"
# the invariant: every mode, dp = 1..4, with and without gradient accumulation,
# reproduces the reference's losses and gradient norms (the norm before
# clipping, as chapter 0 logs it); every run ends with bit-identical replicas.
# The norm's tolerance is the loss tolerance scaled to the norm's size: 3e-5
# on losses of 4.6 to 5.6 is about 6e-6 relative, and the reference's norms
# over these 10 steps are 1.56 to 2.47, so 1e-5 absolute (10 times the log's
# printed resolution of the norm, 1e-6).
TOL=3e-5
TOL_NORM=1e-5
dp_steps=10; dp_B=24; dp_T=32
ref=$TEST_TMPDIR/dp_ref.jsonl
out=$(timeout 120 $MPIRUN -np 1 "$BUILD/chapter-0" --steps $dp_steps --batch $dp_B --seq $dp_T --peak-gflops 10 --log "$ref" 2>&1)
rc=$?
if [ $rc -eq 0 ] && [ "$(grep -c '"type":"step"' "$ref")" = $dp_steps ]; then
    pass "data parallel: the reference run (chapter 0, 10 steps, batch 24 x 32) writes 10 step records"
else
    fail "data parallel: the reference run" "exit $rc; $(echo "$out" | tail -3)"
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
dp_seq_acts=$((4 * dp_T * (dp_C + dp_L * (18 * dp_C + dp_NH * dp_T + 4) + (dp_C + dp_Vp + 6) + (13 * dp_C + dp_NH * dp_T) + dp_C + 2)))
dp_ranks() {  # value N -> [value,value,...]
    local v=$1 N=$2 out="" i
    for ((i = 0; i < N; i++)); do out="$out${out:+,}$v"; done
    echo "[$out]"
}
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
        echo "$sum" | grep -qF "\"broadcast\":{\"dp\":{\"calls\":$(dp_ranks $n $np),\"bytes\":$(dp_ranks $((n * 4 * dp_P)) $np)," &&
            echo "$sum" | grep -qF "\"reduce\":{\"dp\":{\"calls\":$(dp_ranks $n $np),\"bytes\":$(dp_ranks $((n * 4 * dp_P)) $np)," &&
            ! echo "$sum" | grep -qF '"allreduce"' || ok=0
        want="1 reduce and 1 broadcast of 4P bytes per step, AdamW state and receive buffer on rank 0 only"
    else
        opt=$(dp_ranks $((8 * dp_P)) $np)
        comm=$(dp_ranks 0 $np)
        echo "$sum" | grep -qF "\"allreduce\":{\"dp\":{\"calls\":$(dp_ranks $((n * calls)) $np),\"bytes\":$(dp_ranks $((n * 4 * dp_P)) $np)," || ok=0
        want="$calls all-reduces per step, together 4P bytes"
    fi
    echo "$sum" | grep -qF "\"optimizer\":$opt,\"activations\":$(dp_ranks $((dp_seq_acts * dp_B / (np * acc))) $np),\"comm\":$comm," || ok=0
    # only overlapped mode may start an all-reduce before backward has ended
    early=0; [ $mode = overlapped ] && early=$dp_early
    echo "$sum" | grep -qE "\"early_buckets_per_step\":$early[,}]" || ok=0
    case $mode in
        bucketed | overlapped) want="$want, $early of $dp_nb buckets started before backward ended" ;;
    esac
    if [ $ok = 1 ]; then
        pass "data parallel $mode dp=$np grad-accum=$acc: $want; activations of $((dp_B / (np * acc))) sequences"
    else
        fail "data parallel $mode dp=$np grad-accum=$acc: accounting" "want $want, activations $((dp_seq_acts * dp_B / (np * acc))) per rank, early_buckets_per_step $early; got $(echo "$sum" | sed 's/.*"peak_bytes"://')"
    fi
}
for mode in naive bucketed overlapped ps; do
    for np in 1 2 3 4; do
        for acc in 1 2; do
            run=$TEST_TMPDIR/dp_${mode}_np${np}_acc${acc}.jsonl
            out=$(timeout 120 $MPIRUN -np $np "$BUILD/chapter-2" --dp $np --dp-mode $mode --grad-accum $acc \
                --steps $dp_steps --batch $dp_B --seq $dp_T --bucket-kb 64 --peak-gflops 10 --log "$run" 2>&1)
            rc=$?
            cmp=$(bash tests/compare_losses.sh "$ref" "$run" $TOL 2>&1)
            crc=$?
            ncmp=$(bash tests/compare_losses.sh "$ref" "$run" $TOL_NORM norm 2>&1)
            ncrc=$?
            if [ $rc -eq 0 ] && [ $crc -eq 0 ] && [ $ncrc -eq 0 ] && echo "$out" | grep -q "bit-identical on every rank"; then
                pass "data parallel $mode dp=$np grad-accum=$acc: reference losses ($cmp) and norms (${ncmp#* steps, }), replicas bit-identical"
            else
                fail "data parallel $mode dp=$np grad-accum=$acc" "exit $rc; $cmp; $ncmp; $(echo "$out" | grep -E 'error|replicas|FAIL' | head -3)"
            fi
            dp_accounting $mode $np $acc "$run"
        done
    done
done
error_case chapter-2 3 "--dp 3 --batch 4" "--batch 4 does not split over dp=3 ranks"
error_case chapter-2 2 "--dp 2 --batch 4 --grad-accum 3" "use a batch divisible by 6"
error_case chapter-2 2 "--dp 2 --dp-mode rings" "--dp-mode rings is not one of"
error_case chapter-2 2 "--dp 2 --tp 1" "this chapter has no tp axis"
error_case chapter-2 2 "--dp 2 --model $TEST_TMPDIR/truncated.bin" "truncated or corrupt"

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
rank_array() {  # value N -> [value,value,...]
    local v=$1 N=$2 out="" i
    for ((i = 0; i < N; i++)); do out="$out${out:+,}$v"; done
    echo "[$out]"
}
# val_records FILE: "step val_loss" per validation record
val_records() { grep '"type":"val"' "$1" | sed 's/.*"step":\([0-9]*\),"val_loss":\([-0-9.e]*\).*/\1 \2/'; }
# compare_val REF RUN: the same validation steps, every val loss within TOL
compare_val() {
    paste <(val_records "$1") <(val_records "$2") | awk -v tol="$TOL" '
        { n++; if (NF != 4 || $1 != $3) bad = 1
          d = $2 - $4; if (d < 0) d = -d; if (d > max) max = d }
        END { printf "%d val losses, max |dval| %.2e", n, max
              exit (n >= 1 && !bad && max <= tol) ? 0 : 1 }'
}
fsdp_run() {  # np zero prefetch reshard
    local np=$1 z=$2 pf=$3 rs=$4 run=$TEST_TMPDIR/fsdp_run.jsonl out rc cmp crc vcmp vrc sum
    rm -f "$run"
    out=$(timeout 120 $MPIRUN -np $np "$BUILD/chapter-3" --dp $np --zero $z --prefetch $pf --reshard $rs \
        --steps 10 --batch 24 --seq 32 --peak-gflops 10 --log "$run" 2>&1)
    rc=$?
    cmp=$(bash tests/compare_losses.sh "$ref" "$run" $TOL 2>&1)
    crc=$?
    vcmp=$(compare_val "$ref" "$run" 2>&1)
    vrc=$?
    local name="ZeRO-$z dp=$np prefetch=$pf reshard=$rs"
    if [ $rc -eq 0 ] && [ $crc -eq 0 ] && [ $vrc -eq 0 ]; then
        pass "fsdp $name: reference losses ($cmp) and validation loss ($vcmp)"
    else
        fail "fsdp $name" "exit $rc; $cmp; $vcmp; $(echo "$out" | grep -E 'error' | head -3)"
    fi
    read -r e_params e_grads e_opt e_ag e_rs e_agc e_ahead <<< "$(fsdp_expect $np $z $rs $pf)"
    sum=$(grep '"type":"summary"' "$run")
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
    if echo "$sum" | grep -qE "\"gathers_prefetched_per_step\":$e_ahead[,}]"; then
        pass "fsdp $name: $e_ahead unit gathers per step started ahead by prefetch"
    else
        fail "fsdp $name: prefetch" "want $e_ahead gathers prefetched per step; got $(echo "$sum" | grep -o '"gathers_prefetched_per_step":[^,}]*')"
    fi
}
# prefetch only exists under ZeRO-3 (ZeRO-1 and 2 keep the full parameters)
for z in 1 2 3; do
    pfs="1"
    [ $z = 3 ] && pfs="0 1"
    for np in 1 2 3 4; do
        for pf in $pfs; do
            fsdp_run $np $z $pf 1
        done
    done
done
fsdp_run 2 3 1 0
fsdp_run 3 3 0 0
# validation during training (--val-every) runs the same sharded forward:
# chapter 0's validation losses, and under ZeRO-3 each of the 4 validation
# batches costs one forward's gathers (L + 3 = 5 calls, Ppad + U0 floats)
vref=$TEST_TMPDIR/fsdp_vref.jsonl
vrun=$TEST_TMPDIR/fsdp_vrun.jsonl
timeout 120 $MPIRUN -np 1 "$BUILD/chapter-0" --steps 10 --batch 24 --seq 32 --val-every 5 --peak-gflops 10 --log "$vref" >/dev/null 2>&1
timeout 120 $MPIRUN -np 3 "$BUILD/chapter-3" --dp 3 --zero 3 --steps 10 --batch 24 --seq 32 --val-every 5 --peak-gflops 10 --log "$vrun" >/dev/null 2>&1
vcmp=$(compare_val "$vref" "$vrun" 2>&1)
vrc=$?
read -r _ _ _ e_ag _ e_agc _ <<< "$(fsdp_expect 3 3 1 1)"
val_ag=$((4 * (3 * 40194 + 3 * 6827)))  # Ppad + U0 on 3 ranks (section 3.2)
if [ $vrc -eq 0 ] && [ "$(val_records "$vrun" | wc -l)" = 2 ] &&
    grep '"type":"summary"' "$vrun" | grep -qF "\"allgather\":{\"dp\":{\"calls\":$(rank_array $((10 * e_agc + 4 * 5)) 3),\"bytes\":$(rank_array $((10 * e_ag + 4 * val_ag)) 3),"; then
    pass "fsdp: --val-every 5 on 3 ranks gives chapter 0's validation losses ($vcmp), each validation batch costs 5 gathers"
else
    fail "fsdp: --val-every" "$vcmp; $(grep -o '"allgather":{[^}]*}' "$vrun")"
fi
error_case chapter-3 2 "--dp 2 --zero 4" "--zero 4: the stages are 1, 2 and 3"
error_case chapter-3 2 "--dp 2 --prefetch 2" "--prefetch and --reshard take 0 or 1"
error_case chapter-3 2 "--dp 2 --zero 2 --reshard 0" "--reshard 0 applies to --zero 3 only"
error_case chapter-3 3 "--dp 3 --batch 4" "does not split over dp=3"
error_case chapter-3 2 "--dp 2 --model $TEST_TMPDIR/truncated.bin" "truncated or corrupt"
# a checkpoint read shard by shard gives the same model as one read whole
saved3=$TEST_TMPDIR/fsdp_saved.bin
timeout 60 $MPIRUN -np 3 "$BUILD/chapter-3" --dp 3 --batch 12 --steps 3 --peak-gflops 10 --save "$saved3" >/dev/null 2>&1
v0=$(timeout 60 $MPIRUN -np 1 "$BUILD/chapter-0" --model "$saved3" --steps 0 --peak-gflops 10 2>&1 | grep 'val loss' | sed 's/.*val loss //')
l3=$(timeout 60 $MPIRUN -np 3 "$BUILD/chapter-3" --dp 3 --model "$saved3" --batch 12 --steps 1 --peak-gflops 10 2>&1 | grep 'step    0/1' | sed 's/.*loss \([0-9.]*\).*/\1/')
l0=$(timeout 60 $MPIRUN -np 1 "$BUILD/chapter-0" --model "$saved3" --batch 12 --steps 1 --peak-gflops 10 2>&1 | grep 'step    0/1' | sed 's/.*loss \([0-9.]*\).*/\1/')
if [ -n "$v0" ] && [ -n "$l3" ] && [ "$l3" = "$l0" ]; then
    pass "fsdp: --save gathers the shards into an llm.c file; loading it shard by shard gives the reference's loss ($l3)"
else
    fail "fsdp: save and sharded load" "val '$v0', first loss sharded '$l3' vs whole '$l0'"
fi
# ZeRO-2 keeps full (padded) parameters: --save from 3 ranks (padding) must
# hold the trained model, whose validation loss chapter 0 reaches itself
saved2=$TEST_TMPDIR/fsdp_saved_z2.bin
timeout 60 $MPIRUN -np 3 "$BUILD/chapter-3" --dp 3 --zero 2 --batch 12 --steps 3 --peak-gflops 10 --save "$saved2" >/dev/null 2>&1
vl=$(timeout 60 $MPIRUN -np 1 "$BUILD/chapter-0" --model "$saved2" --batch 12 --steps 0 --peak-gflops 10 2>&1 | grep 'val loss' | sed 's/.*val loss //')
vt=$(timeout 60 $MPIRUN -np 1 "$BUILD/chapter-0" --batch 12 --steps 3 --peak-gflops 10 2>&1 | grep 'val loss' | tail -1 | sed 's/.*val loss //')
if [ -n "$vl" ] && [ -n "$vt" ] && awk -v a="$vl" -v b="$vt" -v tol="$TOL" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= tol) }'; then
    pass "fsdp: a ZeRO-2 --save on 3 ranks loads in chapter 0 with the val loss chapter 0 trains to ($vl vs $vt)"
else
    fail "fsdp: ZeRO-2 save" "val loss of the saved file '$vl', of chapter 0 trained alike '$vt'"
fi

# ==== new tests: fsdp engine and train.h glue ====
echo "== chapter 3's engine (03_fsdp/fsdp.c) and the train.h glue, over MPI"
# test_fsdp: units of odd sizes through every ZeRO stage (gather, prefetch,
# reduce-scatter, sumsq, the sharded step, gather to rank 0), and the mean,
# norm and AdamW helpers; on 4 ranks the norm runs over a dp x tp mesh
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
error_case tests/test_fsdp 3 "--check-mesh dp=3 4 64" "--batch 4 does not split over dp=3 ranks: use a batch divisible by 3"
error_case tests/test_fsdp 2 "--check-mesh dp=2 4 64 3" "--batch 4 does not split over dp=2 ranks x 3 micro-batches: use a batch divisible by 6"
error_case tests/test_fsdp 3 "--check-mesh tp=3 6 64" "the model's 4 heads do not split over tp=3 ranks: use a tp that divides 4"
error_case tests/test_fsdp 3 "--check-mesh tp=3 6 64 1 0 small" "the model's padded vocabulary of 256 does not split over tp=3 ranks: use a tp that divides 256"
error_case tests/test_fsdp 4 "--check-mesh pp=4 4 64" "the model's 2 layers do not split over pp=4 ranks: use a pp that divides 2"
error_case tests/test_fsdp 3 "--check-mesh cp=3 4 64" "--seq 64 does not split over cp=3 ranks: use a sequence length divisible by 3"
error_case tests/test_fsdp 2 "--check-mesh ep=2 4 64" "the model has no experts to split over ep=2 ranks"
error_case tests/test_fsdp 3 "--check-mesh ep=3 4 64 1 8" "the model's 8 experts do not split over ep=3 ranks: use an ep that divides 8"
out=$(timeout 60 $MPIRUN -np 4 "$BUILD/tests/test_fsdp" --check-mesh dp=2,tp=2 4 64 2 2>&1)
if [ $? -eq 0 ] && echo "$out" | grep -q '^mesh ok'; then
    pass "train_check_mesh: dp=2 x tp=2, batch 4 in 2 micro-batches per rank, fits the tiny model"
else
    fail "train_check_mesh: dp=2 x tp=2" "$(echo "$out" | head -3)"
fi
# ==== end of new tests: fsdp engine and train.h glue ====

# ==== new tests: recompute and trace (issue 20) ====
echo "== --recompute and --trace"
# rc_steps RUN.jsonl: the step records without their timings, for a bitwise
# comparison of loss and norm (the log prints them in full: %.8g and %.6f)
rc_steps() { grep '"type":"step"' "$1" | sed 's/,"ms":.*//'; }
rc_run() {  # LABEL NP BIN FLAGS...: runs into $TEST_TMPDIR/rc_LABEL.jsonl, fails on a non-zero exit
    local label=$1 np=$2 bin=$3 out rc
    shift 3
    out=$(timeout 120 $MPIRUN -np "$np" "$BUILD/$bin" --steps 6 --batch 8 --seq 32 --peak-gflops 10 \
        --log "$TEST_TMPDIR/rc_$label.jsonl" "$@" 2>&1)
    rc=$?
    [ $rc -eq 0 ] || fail "recompute/trace: $label" "exit $rc; $(echo "$out" | tail -3)"
}
# the same losses and norms, bit for bit, as recompute none in the same chapter
rc_same() {  # LABEL REF_LABEL WHAT
    if [ -s "$TEST_TMPDIR/rc_$1.jsonl" ] && [ "$(rc_steps "$TEST_TMPDIR/rc_$1.jsonl")" = "$(rc_steps "$TEST_TMPDIR/rc_$2.jsonl")" ]; then
        pass "recompute: $3 logs the same 6 losses and norms as none, bit for bit"
    else
        fail "recompute: $3" "$(diff <(rc_steps "$TEST_TMPDIR/rc_$1.jsonl") <(rc_steps "$TEST_TMPDIR/rc_$2.jsonl") | head -4)"
    fi
}
# activation bytes per rank, docs/recompute.md: 4BT[C + L*store + transient +
# (C+Vp+6) + (13C+NH*T) + C + 2] for tiny (C 64, NH 4, L 2, Vp 256) at T 32
rc_acts() {  # MODE B: the formula's bytes for B sequences
    local C=64 NH=4 L=2 Vp=256 T=32 store transient
    case $1 in
        none) store=$((18 * C + NH * T + 4)); transient=0 ;;
        selective) store=$((12 * C + 4)); transient=$((6 * C + NH * T)) ;;
        full) store=$C; transient=$((18 * C + NH * T + 4)) ;;
    esac
    echo $((4 * $2 * T * (C + L * store + transient + (C + Vp + 6) + (13 * C + NH * T) + C + 2)))
}
rc_peak() {  # LABEL MODE B NP WHAT: every rank's activation peak = the formula
    local want got i list=""
    want=$(rc_acts "$2" "$3")
    for ((i = 0; i < $4; i++)); do list="$list${list:+,}$want"; done
    got=$(grep '"type":"summary"' "$TEST_TMPDIR/rc_$1.jsonl" | grep -o '"activations":\[[0-9,]*\]')
    if [ "$got" = "\"activations\":[$list]" ]; then
        pass "recompute: $5 peak activation bytes per rank = the $2 formula ($want)"
    else
        fail "recompute: $5 activation peak" "want [$list], got $got"
    fi
}
rc_trace() {  # LABEL WHAT ARGS...: the trace is valid and agrees with the log
    local label=$1 what=$2 out
    shift 2
    if out=$(python3 tests/trace_check.py "$TEST_TMPDIR/rc_$label.json" "$TEST_TMPDIR/rc_$label.jsonl" "$@" 2>&1) &&
        python3 -m json.tool "$TEST_TMPDIR/rc_$label.json" >/dev/null 2>&1; then
        pass "trace: $what: valid JSON, nested spans, $(echo "$out" | grep -c '^PASS') checks against the log"
    else
        fail "trace: $what" "$(echo "$out" | grep -v '^PASS' | head -4)"
    fi
}
rc_run c0none 1 chapter-0
rc_run c0sel 1 chapter-0 --recompute selective
rc_run c0full 1 chapter-0 --recompute full --trace "$TEST_TMPDIR/rc_c0full.json"
rc_same c0sel c0none "chapter 0 selective"
rc_same c0full c0none "chapter 0 full"
rc_peak c0none none 8 1 "chapter 0 none"
rc_peak c0sel selective 8 1 "chapter 0 selective"
rc_peak c0full full 8 1 "chapter 0 full"
rc_trace c0full "chapter 0, recompute full" --layers 2 --recompute full
# chapter 2: overlapped buckets, 2 micro-batches per rank
rc_run c2none 2 chapter-2 --dp 2 --grad-accum 2 --bucket-kb 64
rc_run c2full 2 chapter-2 --dp 2 --grad-accum 2 --bucket-kb 64 --recompute full --trace "$TEST_TMPDIR/rc_c2full.json"
rc_same c2full c2none "chapter 2 dp=2 overlapped, grad-accum 2, full"
rc_peak c2full full 2 2 "chapter 2 dp=2 grad-accum 2 full"
rc_trace c2full "chapter 2 dp=2 overlapped, grad-accum 2" --layers 2 --micro 2 --recompute full
# chapter 3: ZeRO-3 recomputes after the block's gather in backward
rc_run c3none 2 chapter-3 --dp 2 --zero 3
rc_run c3sel 2 chapter-3 --dp 2 --zero 3 --recompute selective --trace "$TEST_TMPDIR/rc_c3sel.json"
rc_run c3full 2 chapter-3 --dp 2 --zero 2 --recompute full
rc_same c3sel c3none "chapter 3 ZeRO-3 dp=2 selective"
rc_same c3full c3none "chapter 3 ZeRO-2 dp=2 full"
rc_peak c3sel selective 4 2 "chapter 3 dp=2 selective"
rc_trace c3sel "chapter 3 ZeRO-3 dp=2, recompute selective" --layers 2 --recompute selective
# the checker can fail: the first block 0 forward made to last past its step
sed '0,/\("name":"block 0 forward","cat":"compute","ph":"X","ts":[0-9.]*,"dur":\)/s//\199999999/' \
    "$TEST_TMPDIR/rc_c3sel.json" > "$TEST_TMPDIR/rc_broken.json"
cp "$TEST_TMPDIR/rc_c3sel.jsonl" "$TEST_TMPDIR/rc_broken.jsonl"
if ! python3 tests/trace_check.py "$TEST_TMPDIR/rc_broken.json" "$TEST_TMPDIR/rc_broken.jsonl" --layers 2 \
    --recompute selective 2>&1 | grep -q '^FAIL every rank.s host row is well nested'; then
    fail "trace: the checker finds a span that crosses its neighbour" "no FAIL line for the nesting"
else
    pass "trace: the checker finds a span that crosses its neighbour"
fi
error_case chapter-2 2 "--dp 2 --recompute some" "--recompute some is not one of none, selective, full"
error_case chapter-3 2 "--dp 2 --trace /nonexistent-dir/t.json" "cannot write --trace '/nonexistent-dir/t.json'"
# ==== end of new tests: recompute and trace ====

echo "== --help"
# every chapter lists its own flags and exits 0
help_case() {  # binary, a flag the help must list
    local out rc
    out=$($MPIRUN -np 1 "$BUILD/$1" --help 2>&1)
    rc=$?
    if [ $rc -eq 0 ] && echo "$out" | grep -q -- "$2" && ! echo "$out" | grep -q '^error'; then
        pass "$1 --help lists $2 and exits 0"
    else
        fail "$1 --help" "exit $rc; $(echo "$out" | head -5)"
    fi
}
help_case chapter-0 "--dp N"
help_case chapter-1 "--trace"
help_case chapter-2 "--dp-mode S"
help_case chapter-3 "--zero N"
help_case tokenize "OUTPUT_PREFIX"

echo "== plots"
if [ -f tests/test_plots.sh ]; then
    out=$(bash tests/test_plots.sh 2>&1)
    echo "$out" | grep -E '^(PASS|FAIL|SKIP)'
    passed=$((passed + $(echo "$out" | grep -c '^PASS')))
    failed=$((failed + $(echo "$out" | grep -c '^FAIL')))
    skipped=$((skipped + $(echo "$out" | grep -c '^SKIP')))
fi

# ==== new tests: docs-check ====
# the docs checker on a doc tree with known defects, then on the real docs:
# one PASS/FAIL line per check of the checker and per doc
echo "== docs-check"
for script in "bash tests/test_docs_check.sh" "python3 tests/docs_check.py"; do
    out=$(timeout 300 $script 2>&1)
    rc=$?
    # a FAIL line is followed by its "  doc:line: what differs" lines
    echo "$out" | grep -E '^(PASS|FAIL|SKIP|  )'
    passed=$((passed + $(echo "$out" | grep -c '^PASS')))
    failed=$((failed + $(echo "$out" | grep -c '^FAIL')))
    skipped=$((skipped + $(echo "$out" | grep -c '^SKIP')))
    if [ $rc -ne 0 ] && ! echo "$out" | grep -q '^FAIL'; then
        fail "$script" "exited $rc without a failed check: $(echo "$out" | tail -3 | tr '\n' ' ')"
    fi
done
# ==== end of new tests: docs-check ====

echo "== GPU"
# The CUDA backend compiles and links wherever nvcc is; its tests run where
# nvidia-smi lists a GPU and say "skipped" elsewhere.
CUDA_BUILD=build/cuda
nvcc_path=$(command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
cuda_built=0
if [ -z "$nvcc_path" ]; then
    skip "CUDA backend build" "nvcc not found"
elif make --no-print-directory BACKEND=cuda all "$CUDA_BUILD/tests/test_ops" >"$TEST_TMPDIR/cuda-build.log" 2>&1; then
    cuda_built=1
    pass "CUDA backend compiles and links (make BACKEND=cuda all $CUDA_BUILD/tests/test_ops)"
else
    fail "CUDA backend build" "$(grep -E 'error|warning' "$TEST_TMPDIR/cuda-build.log" | head -5; tail -3 "$TEST_TMPDIR/cuda-build.log")"
fi
# the reason a GPU check cannot run here, or nothing when it can
gpu_missing=""
if [ "$gpus" = 0 ]; then gpu_missing="no GPU here (nvidia-smi -L lists none)"
elif [ $cuda_built = 0 ]; then gpu_missing="the CUDA backend was not built (see above)"
fi

# every op against the double-precision reference, on the GPU
if [ -z "$gpu_missing" ]; then
    run_program "$CUDA_BUILD/tests/test_ops"
else
    skip "CUDA op tests ($CUDA_BUILD/tests/test_ops)" "$gpu_missing"
fi

# the reference invariant across backends: chapter 0, tiny model, 10 steps,
# the same per-step losses on the GPU as on the CPU within 1e-4
step_losses() { grep '^step .*| loss ' | sed 's/.*| loss \([-0-9.e]*\) .*/\1/'; }
if [ -z "$gpu_missing" ]; then
    cpu_losses=$(timeout 120 $MPIRUN -np 1 "$BUILD/chapter-0" --steps 10 --peak-gflops 10 2>&1 | step_losses)
    gpu_out=$(timeout 120 $MPIRUN -np 1 "$CUDA_BUILD/chapter-0" --steps 10 --peak-gflops 10 2>&1)
    gpu_losses=$(echo "$gpu_out" | step_losses)
    diff=$(paste <(echo "$cpu_losses") <(echo "$gpu_losses") | awk '
        { n++; d = $1 - $2; if (d < 0) d = -d; if (d > max) max = d }
        END { if (n == 10) printf "%.2e", max; else print "steps missing" }')
    if [ "$(echo "$cpu_losses" | wc -l)" = 10 ] && [ "$(echo "$gpu_losses" | wc -l)" = 10 ] &&
        awk -v d="$diff" 'BEGIN { exit !(d + 0 <= 1e-4 && d != "steps missing") }'; then
        pass "chapter 0 on the GPU reproduces the CPU reference: 10 steps, max |dloss| $diff <= 1e-4"
    else
        fail "chapter 0 GPU vs CPU losses" "max |dloss| $diff; cpu: $(echo $cpu_losses); gpu: $(echo $gpu_losses); $(echo "$gpu_out" | grep -E '^error|rank' | head -3)"
    fi
else
    skip "chapter 0 on the GPU vs the CPU reference (10 steps, 1e-4)" "$gpu_missing"
fi

# the collectives on NCCL: hand-written and library against the exact results
for np in 1 2; do
    if [ -n "$gpu_missing" ]; then
        skip "chapter 1 --check on $np GPU rank(s)" "$gpu_missing"
    elif [ "$gpus" -lt $np ]; then
        skip "chapter 1 --check on $np GPU ranks" "$gpus GPU(s) here, one rank per GPU"
    else
        out=$(timeout 300 $MPIRUN -np $np "$CUDA_BUILD/chapter-1" --check 2>&1)
        rc=$?
        if [ $rc -eq 0 ] && echo "$out" | grep -q "check summary: \([0-9]*\) of \1 collective runs match on $np ranks$"; then
            pass "collectives on $np GPU rank(s), NCCL: $(echo "$out" | grep 'check summary' | sed 's/check summary: //')"
        else
            fail "collectives on $np GPU rank(s)" "exit $rc; $(echo "$out" | grep -E 'FAIL|summary|error' | head -5)"
        fi
    fi
done

# the chapter invariants on the GPU: chapters 2 and 3 on 2 GPU ranks reproduce
# chapter 0 on one GPU (same backend, so the same tolerance as on the CPU).
# These runs exercise the stream and event ordering of the non-blocking
# collectives (overlapped buckets, prefetched gathers).
gpu_invariant() {  # name, chapter, flags
    local name=$1 ch=$2 flags=$3 run out rc cmp crc
    if [ -n "$gpu_missing" ]; then skip "$name on 2 GPU ranks" "$gpu_missing"; return; fi
    if [ "$gpus" -lt 2 ]; then skip "$name on 2 GPU ranks" "$gpus GPU(s) here, one rank per GPU"; return; fi
    if [ ! -x "$CUDA_BUILD/chapter-$ch" ]; then skip "$name on 2 GPU ranks" "$CUDA_BUILD/chapter-$ch is not built"; return; fi
    run=$TEST_TMPDIR/gpu_run.jsonl
    rm -f "$run"
    out=$(timeout 300 $MPIRUN -np 2 "$CUDA_BUILD/chapter-$ch" $flags $gpu_common --log "$run" 2>&1)
    rc=$?
    cmp=$(bash tests/compare_losses.sh "$gpu_ref" "$run" 3e-5 2>&1)
    crc=$?
    if [ $rc -eq 0 ] && [ $crc -eq 0 ]; then
        pass "$name on 2 GPU ranks: chapter 0's GPU losses ($cmp)"
    else
        fail "$name on 2 GPU ranks" "exit $rc; $cmp; $(echo "$out" | grep -E '^error|rank' | head -3)"
    fi
}
gpu_common="--steps 10 --batch 24 --seq 32 --peak-gflops 10"
gpu_ref=$TEST_TMPDIR/gpu_ref.jsonl
if [ -z "$gpu_missing" ] && [ "$gpus" -ge 2 ]; then
    timeout 120 $MPIRUN -np 1 "$CUDA_BUILD/chapter-0" $gpu_common --log "$gpu_ref" >/dev/null 2>&1
fi
for mode in naive overlapped; do
    gpu_invariant "chapter 2 $mode dp=2" 2 "--dp 2 --dp-mode $mode --bucket-kb 64"
done
gpu_invariant "chapter 2 overlapped dp=2 grad-accum=2" 2 "--dp 2 --dp-mode overlapped --bucket-kb 64 --grad-accum 2"
for z in 1 2 3; do
    pfs="1"
    [ $z = 3 ] && pfs="0 1"
    for pf in $pfs; do
        gpu_invariant "chapter 3 ZeRO-$z dp=2 prefetch=$pf" 3 "--dp 2 --zero $z --prefetch $pf"
    done
done

# without a GPU the CUDA build stops every rank with one clear message
for np in 1 2; do
    flags="--steps 1"
    [ $np = 2 ] && flags="--dp 2 --steps 1"
    if [ -z "$nvcc_path" ]; then
        skip "CUDA build without a GPU on $np rank(s)" "nvcc not found"
    elif [ "$gpus" != 0 ]; then
        skip "CUDA build without a GPU on $np rank(s)" "this machine has a GPU"
    elif [ $cuda_built = 0 ]; then
        skip "CUDA build without a GPU on $np rank(s)" "the CUDA backend was not built (see above)"
    else
        out=$(timeout 60 $MPIRUN -np $np "$CUDA_BUILD/chapter-0" $flags 2>&1)
        rc=$?
        n=$(echo "$out" | grep -c '^error: ')
        if [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ "$n" = 1 ] && echo "$out" | grep -q '^error: no CUDA GPU found'; then
            pass "CUDA build without a GPU on $np rank(s): exit $rc, one line '$(echo "$out" | grep '^error: ' | cut -c1-60)...'"
        else
            fail "CUDA build without a GPU on $np rank(s)" "exit $rc (124 = hang), $n error lines; $(echo "$out" | head -4)"
        fi
    fi
done

echo
echo "$passed passed, $failed failed, $skipped skipped"
[ $failed -eq 0 ]
