#!/bin/bash
# Hardening: a diverging run stops, a log that cannot be written stops the run,
# no output destroys an input, bad input values are refused, counts cannot
# overflow, atomic writes leave no temporary file, objects follow the flags.
. "$(dirname "$0")/lib.sh"
ref_checkpoint
bad_inputs
if [ ! -e "$TEST_TMPDIR/corpus.txt" ]; then
    head -c 200000 /usr/share/games/fortunes/fortunes > "$TEST_TMPDIR/corpus.txt"
fi
echo "== hardening: divergence, log writes, input checks"
# (--peak-gflops 10 on the runs that train: without it every rank first
# measures the matmul peak, seconds of a loaded machine for a figure no check reads)
# divergence stops every chapter with the step and the last finite loss;
# the log stays valid JSON, a good checkpoint is not overwritten, and the
# checkpoint directories' locks are let go of (their text was left, and the
# next run called the diverged one stale)
bash tests/mpirun.sh -np 1 "$BUILD/chapter-0" --steps 2 --peak-gflops 10 --save "$TEST_TMPDIR/good.bin" >/dev/null 2>&1
cp "$TEST_TMPDIR/good.bin" "$TEST_TMPDIR/good_before.bin"
# each chapter on its own copy of the good checkpoint and its own log, so
# that the runs are independent: 2 at a time (jobs_run, tests/lib.sh). The
# diverged run ends through MPI_Finalize after its message: mpirun need not
# wait to stop ranks that are left (error_case, tests/lib.sh)
div_case() {  # PROGRAM NP FLAGS...
    local bin=$1 np=$2 out rc n good=$TEST_TMPDIR/good_$1.bin div=$TEST_TMPDIR/div_$1.jsonl ck=$TEST_TMPDIR/divck_$1
    shift 2
    cp "$TEST_TMPDIR/good.bin" "$good"
    out=$(OMPI_MCA_odls_base_sigkill_timeout=0 timeout 60 $MPIRUN -np "$np" "$BUILD/$bin" "$@" --steps 3 --peak-gflops 10 --lr 1e30 --clip 0 --log "$div" \
          --save "$good" --ckpt-dir "$ck" --ckpt-local "$ck.local" 2>&1)
    rc=$?
    n=$(echo "$out" | grep -c '^error: training diverged at step 1: .*the last finite loss was [0-9.]* at step 0')
    # the log: records up to the last finite step, each one JSON, none non-finite
    if [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ "$n" = 1 ] && grep -q '"type":"step"' "$div" && ! grep -qiE 'nan|inf' "$div" &&
        python3 -c 'import json, sys; [json.loads(l) for l in open(sys.argv[1])]' "$div" 2>/dev/null &&
        cmp -s "$good" "$TEST_TMPDIR/good_before.bin" && [ -e "$ck/.lock" ] && [ ! -s "$ck/.lock" ] &&
        [ -e "$ck.local/node-0/.lock" ] && [ ! -s "$ck.local/node-0/.lock" ]; then
        pass "hardening: $bin on $np rank(s) stops at a non-finite loss (step, last finite loss; log valid; checkpoint kept; locks let go of)"
    else
        fail "hardening: $bin divergence" "exit $rc, $n matching error lines; log: $(head -c 300 "$div"); .lock: '$(cat "$ck/.lock" 2>/dev/null)', level 1: '$(cat "$ck.local/node-0/.lock" 2>/dev/null)'; output: $(echo "$out" | grep -v '^step' | head -5)"
    fi
}
for spec in "chapter-0 1" "chapter-2 2 --dp 2" "chapter-3 2 --dp 2" "chapter-5 2 --pp 2" "chapter-7 2 --ep 2"; do
    jobs_run div_case $spec
done
# a divergence while the step before's save is still being written in the
# background (--async-save, or a drain from level 1): the save is finished
# and committed, as a sync save is at once, not left as a .tmp directory
# without a manifest, and a run resumes from it
div_async_case() {  # PROGRAM NP FLAGS...
    local bin=$1 np=$2 out rc ck=$TEST_TMPDIR/divasync_$1_$2
    shift 2
    out=$(OMPI_MCA_odls_base_sigkill_timeout=0 timeout 60 $MPIRUN -np "$np" "$BUILD/$bin" "$@" --steps 3 --peak-gflops 10 --lr 1e30 --clip 0 \
          --ckpt-dir "$ck" --save-every 1 2>&1)
    rc=$?
    local resumed
    resumed=$(timeout 60 $MPIRUN -np "$np" "$BUILD/$bin" "$@" --steps 2 --peak-gflops 10 --ckpt-dir "$ck" --resume "$ck" 2>&1)
    if [ $rc -ne 0 ] && [ $rc -ne 124 ] && echo "$out" | grep -q '^error: training diverged at step 1: ' &&
        [ -f "$ck/step-00000001/MANIFEST" ] && [ -z "$(ls -d "$ck"/*.tmp 2>/dev/null)" ] &&
        echo "$resumed" | grep -q "checkpoint: resumed from .*/step-00000001 (chapter .*: step 1,"; then
        pass "hardening: $bin on $np rank(s) $* diverging with a save in flight commits that save (step 1: its MANIFEST, no .tmp left, resumed from)"
    else
        fail "hardening: $bin divergence with a save in flight ($*)" "exit $rc; $(ls -a "$ck" 2>&1 | tr '\n' ' '); $(echo "$out" | grep -E '^error|checkpoint' | head -3); resume: $(echo "$resumed" | grep -E '^error|checkpoint' | head -2)"
    fi
}
jobs_run div_async_case chapter-0 1 --async-save
jobs_run div_async_case chapter-3 2 --dp 2 --async-save
jobs_run div_async_case chapter-5 2 --pp 2 --ckpt-local "$TEST_TMPDIR/divasync_local" --local-every 1
# a mesh refused at start-up writes nothing: no checkpoint directory, no
# lock (chapter 6 opened its checkpoint before its mesh checks and left
# both levels' .lock files)
refused_writes_nothing() {  # NAME PROGRAM NP PHRASE FLAGS...
    local name=$1 bin=$2 np=$3 phrase=$4 d=$TEST_TMPDIR/refused_$1
    shift 4
    mkdir -p "$d"
    OMPI_MCA_odls_base_sigkill_timeout=0 mpi_run --may-fail $T_SHORT "$np" "$BUILD/$bin" --peak-gflops 10 "$@" \
        --ckpt-dir "$d/ck" --ckpt-local "$d/local"
    if [ $RC -ne 0 ] && ! timed_out && [ "$(echo "$OUT" | grep -c '^error: ')" = 1 ] && echo "$OUT" | grep -qF -- "$phrase" &&
        [ ! -e "$d/ck" ] && [ ! -e "$d/local" ]; then
        pass "hardening: $bin on $np rank(s), $*: refused ('$phrase') with no checkpoint directory or lock written"
    else
        fail "hardening: $bin refusal writes nothing ($*)" "exit $RC; left: $(cd "$d" 2>/dev/null && find . | tr '\n' ' '); $(echo "$OUT" | grep '^error' | head -2)"
    fi
}
jobs_run refused_writes_nothing ch6cp chapter-6 2 "--seq 33" --cp 2 --seq 33
jobs_run refused_writes_nothing ch6sp chapter-6 2 "does not divide them" --tp 2 --sp --batch 3 --seq 33
jobs_run refused_writes_nothing ch3 chapter-3 2 "--batch 3" --dp 2 --batch 3
jobs_run refused_writes_nothing ch7 chapter-7 2 "3 experts do not split" --ep 2 --experts 3
# a log that cannot be written ends the run (here: a full disk)
out=$(timeout 60 $MPIRUN -np 2 "$BUILD/chapter-2" --dp 2 --steps 2 --peak-gflops 10 --log /dev/full 2>&1)
rc=$?
if [ $rc -ne 0 ] && [ $rc -ne 124 ] && echo "$out" | grep -q "^error: writing the log file '/dev/full' failed: No space left on device"; then
    pass "hardening: a failed log write (full disk) ends the run with a message"
else
    fail "hardening: full-disk log" "exit $rc; $(echo "$out" | head -5)"
fi
jobs_run error_case chapter-0 1 "--batch 0" "--batch must be positive"
jobs_run error_case chapter-0 1 "--seq 0" "--seq must be positive"
jobs_run error_case chapter-0 1 "--threads 100000" "--threads must be between 0 (cores / ranks) and 1024"
jobs_run error_case chapter-0 1 "--val-batches 2147483647" "--val-batches must be between 1 and 100000"
jobs_run error_case chapter-0 1 "--lr 1e-50" "1e-50 is too small for a float"
jobs_run error_case chapter-0 1 "--val $TEST_TMPDIR" "token file '$TEST_TMPDIR' is a directory: give an llm.c token file"
jobs_run error_case chapter-0 1 "--sample 1000000" "--sample must be between 0 and 100000"
jobs_run error_case chapter-0 1 "--dp 65536 --tp 65536 --pp 65536 --cp 65536" "has 18446744073709551616 ranks but mpirun started 1"
jobs_run error_case chapter-1 2 "--bench --op nosuch" "--op 'nosuch' matches no algorithm"
head -c 5000 "$TEST_TMPDIR/corpus.txt" > "$TEST_TMPDIR/short_val.txt"
"$BUILD/tokenize" "$TEST_TMPDIR/short_val.txt" "$TEST_TMPDIR/short_val" >/dev/null
# a validation token past the vocabulary: the file named, and what to do
cp "$TEST_TMPDIR/short_val_val.bin" "$TEST_TMPDIR/bigtok.bin"
printf '\x2c\x01' | dd of="$TEST_TMPDIR/bigtok.bin" bs=1 seek=$((1024 + 2 * 10)) conv=notrunc status=none  # token 10: 300
jobs_run error_case chapter-0 1 "--val $TEST_TMPDIR/bigtok.bin" "validation file '$TEST_TMPDIR/bigtok.bin' holds token id 300 but the model's vocabulary has 256: give validation data"
# the same in the file's last token (500 tokens: the last at 1024 + 2 * 499)
cp "$TEST_TMPDIR/short_val_val.bin" "$TEST_TMPDIR/bigtok_last.bin"
printf '\x2c\x01' | dd of="$TEST_TMPDIR/bigtok_last.bin" bs=1 seek=$((1024 + 2 * 499)) conv=notrunc status=none
jobs_run error_case chapter-0 1 "--val $TEST_TMPDIR/bigtok_last.bin" "validation file '$TEST_TMPDIR/bigtok_last.bin' holds token id 300 but the model's vocabulary has 256"
jobs_run error_case chapter-0 1 "--val $TEST_TMPDIR/short_val_val.bin --batch 8" "validation file '$TEST_TMPDIR/short_val_val.bin' has 500 tokens, fewer than one batch"
jobs_run error_case chapter-0 1 "--data $CKPT" "is an llm.c model checkpoint, not training data"
# a weight that is not a number is the file's fault, named where it sits
# (it was blamed on training: a non-finite loss, "lower --lr"); tiny's file:
# qkvw of layer 1 starts at float 16384 + 4096 + 128 + 128 + 12288 (wte,
# wpe, ln1w, ln1b, layer 0's qkvw), behind the 1024-byte header
cp "$CKPT" "$TEST_TMPDIR/nan.bin"
printf '\x00\x00\xc0\x7f' | dd of="$TEST_TMPDIR/nan.bin" bs=1 seek=$((1024 + 4 * (33024 + 5))) conv=notrunc status=none
cp "$CKPT" "$TEST_TMPDIR/inf.bin"
printf '\x00\x00\x80\x7f' | dd of="$TEST_TMPDIR/inf.bin" bs=1 seek=$((1024 + 4 * 100)) conv=notrunc status=none
jobs_run error_case chapter-0 1 "--model $TEST_TMPDIR/nan.bin" "holds a weight that is not a number (NaN) at element 5 of tensor qkvw of layer 1: the file is corrupt"
# a sharded read (chapter 3: each rank reads its own ranges) and a stage's (chapter 5)
jobs_run error_case chapter-3 2 "--dp 2 --zero 3 --model $TEST_TMPDIR/inf.bin" "holds a weight that is not a number (Inf) at element 100 of tensor wte: the file is corrupt"
jobs_run error_case chapter-5 2 "--pp 2 --model $TEST_TMPDIR/nan.bin" "(NaN) at element 5 of tensor qkvw of layer 1"
# chapter 4's tiles (it said "training diverged at step 0: ... lower --lr"),
# and chapter 7's reader (the capstone's too): an MoE file (tests/make_model.py,
# E 4, H 128, C 64) with an Inf in wte and a NaN in its last float, the last
# element of the last layer's experts (4 (2 H C + H + C) - 1 = 66303)
jobs_run error_case chapter-4 2 "--tp 2 --model $TEST_TMPDIR/inf.bin" "(Inf) at element 100 of tensor wte: the file is corrupt"
python3 tests/make_model.py "$TEST_TMPDIR/moe_nan.bin" 250 256 64 2 4 64 4 2 128 1
python3 - "$TEST_TMPDIR/moe_nan.bin" <<'PYEOF'
import os, struct, sys
with open(sys.argv[1], "r+b") as f:
    f.seek(1024 + 4 * 100); f.write(struct.pack("<f", float("inf")))
    f.seek(os.path.getsize(sys.argv[1]) - 4); f.write(struct.pack("<f", float("nan")))
PYEOF
python3 tests/make_model.py "$TEST_TMPDIR/moe_nan2.bin" 250 256 64 2 4 64 4 2 128 1
python3 -c "import os,struct,sys; f=open(sys.argv[1],'r+b'); f.seek(os.path.getsize(sys.argv[1])-4); f.write(struct.pack('<f',float('nan')))" "$TEST_TMPDIR/moe_nan2.bin"
jobs_run error_case chapter-7 1 "--model $TEST_TMPDIR/moe_nan.bin" "(Inf) at element 100 of the parameters beside the experts: the file is corrupt"
jobs_run error_case chapter-7 2 "--ep 2 --model $TEST_TMPDIR/moe_nan2.bin" "(NaN) at element 66303 of an MoE layer's experts: the file is corrupt"
jobs_run error_case capstone 2 "--tp 2 --model $TEST_TMPDIR/moe_nan.bin" "(Inf) at element 100 of the parameters beside the experts"
jobs_wait  # the divergences and these error cases: 2 at a time
# a path is at most ARGS_MAX_STRING (3840) characters, so that the names a
# run adds under it fit the system's 4096: a directory of 3840 takes a
# checkpoint and resumes it; one longer is refused at once (one of 4070 was
# cut at the end of training: "cannot write the checkpoint manifest
# '/tmp/ddd..." and no reason)
long=$TEST_TMPDIR/long
while [ ${#long} -lt 3600 ]; do long=$long/$(printf 'd%.0s' $(seq 199)); done
long=$long/$(printf 'e%.0s' $(seq $((3840 - ${#long} - 1))))
mkdir -p "$long"
mpi_run --may-fail $T_SHORT 1 "$BUILD/chapter-0" --peak-gflops 10 --steps 1 --ckpt-dir "$long"
mpi_run --may-fail $T_SHORT 1 "$BUILD/chapter-0" --peak-gflops 10 --steps 2 --resume "$long"
r=$(echo "$OUT" | grep -c "^checkpoint: resumed from .*/step-00000001 (chapter 0, world 1): step 1")
mpi_run --may-fail $T_SHORT 1 "$BUILD/chapter-0" --peak-gflops 10 --steps 1 --ckpt-dir "$long/x"
n=$(echo "$OUT" | grep -c '^error: flag --ckpt-dir: its value is 3842 characters long, more than the 3840')
if [ ${#long} = 3840 ] && [ "$r" = 1 ] && [ "$n" = 1 ] && [ $RC -ne 0 ] && ! timed_out; then
    pass "hardening: a --ckpt-dir of 3840 characters saves and resumes, one of 3842 is refused before training"
else
    fail "hardening: path length" "${#long} characters; $r resumes; $n refusals; exit $RC"
fi
rm -rf "$TEST_TMPDIR/long"
# an error that names a path of 3840 characters keeps its reason: the
# messages were built in 1024 bytes and cut inside the path (ERROR_MAX,
# errors.h); here a file stands where the path needs a directory
touch "$TEST_TMPDIR/afile"
long=$TEST_TMPDIR/afile
while [ ${#long} -lt 3600 ]; do long=$long/$(printf 'd%.0s' $(seq 199)); done
long=$long/$(printf 'e%.0s' $(seq $((3840 - ${#long} - 1))))
kept=0
for run in "chapter-0 --model" "chapter-0 --ckpt-dir" "capstone --save" "chapter-7 --log" "chapter-5 --schedule-file"; do
    # stderr alone: mpirun forwards stdout and stderr apart, in pieces of
    # 4 KiB, so on one file a longer line can get stdout's lines in its
    # middle (CI did, under load); what the rank wrote is what is checked
    timeout -k 10 $T_SHORT $MPIRUN -np 1 "$BUILD/${run% *}" --peak-gflops 10 --steps 1 "${run#* }" "$long" \
        < /dev/null > /dev/null 2> "$TEST_TMPDIR/long_err.txt"
    line=$(grep '^error: ' "$TEST_TMPDIR/long_err.txt")
    case $line in
        *"'$long': Not a directory"* | *"'$long': its directory '${long%/*}' does not exist: a file stands on its path") kept=$((kept + 1)) ;;
        *) echo "  ${run}: $(echo "$line" | cut -c1-100)...$(echo "$line" | tail -c 100)" ;;
    esac
done
if [ ${#long} = 3840 ] && [ $kept = 5 ]; then
    pass "hardening: an error naming a path of 3840 characters ends with its reason (--model, --ckpt-dir, --save, --log, --schedule-file)"
else
    fail "hardening: long paths in errors" "${#long} characters; $kept of 5 messages whole"
fi
rm -f "$TEST_TMPDIR/afile"
# the test scripts after `make all` without `make tests`: the programs of
# make tests are missing; a script says what to build (it said "exited 127")
mkdir -p "$TEST_TMPDIR/half"
cp "$BUILD"/chapter-* "$TEST_TMPDIR/half/"
out=$(BUILD=$TEST_TMPDIR/half env -u TEST_COUNTS bash tests/unit.sh 2>&1)
if [ $? -ne 0 ] && echo "$out" | grep -q "^FAIL test_ops: error: $TEST_TMPDIR/half/tests/test_ops is not built: run 'make BACKEND=cpu BUILD=$TEST_TMPDIR/half all tests'" &&
    ! echo "$out" | grep -q "exited 127"; then
    pass "hardening: a test script with its programs not built says what to build, not 'exited 127'"
else
    fail "hardening: a test script without its programs" "$(echo "$out" | grep -E 'test_ops|127' | head -2)"
fi
out=$(BUILD=$TEST_TMPDIR/half env -u TEST_COUNTS bash -c '. tests/lib.sh; mpi_run --may-fail 60 1 "$BUILD/tests/test_watchdog" allreduce; echo "RC=$RC"' 2>&1)
if echo "$out" | grep -q "error: $TEST_TMPDIR/half/tests/test_watchdog is not built: run 'make" && echo "$out" | grep -qx "RC=127"; then
    pass "hardening: mpi_run of a program not built names it and what to build"
else
    fail "hardening: mpi_run of a program not built" "$(echo "$out" | head -3)"
fi
# a model path with a quote is escaped in the JSON summary
cp "$CKPT" "$TEST_TMPDIR/a\"b.bin"
timeout 60 $MPIRUN -np 1 "$BUILD/chapter-0" --model "$TEST_TMPDIR/a\"b.bin" --steps 1 --peak-gflops 10 --log "$TEST_TMPDIR/quote.jsonl" >/dev/null 2>&1
if grep -qF "\"model\":\"$TEST_TMPDIR/a\\\"b.bin\"" "$TEST_TMPDIR/quote.jsonl"; then
    pass "hardening: a model path with a quote is escaped in the JSON summary"
else
    fail "hardening: model path escaping" "$(grep -o '"model":[^,]*' "$TEST_TMPDIR/quote.jsonl")"
fi
# past a file-size limit the token writer fails with a message naming its
# target and leaves no temporary file (SIGXFSZ is ignored during the write)
out=$( (ulimit -f 10; "$BUILD/tokenize" "$TEST_TMPDIR/corpus.txt" "$TEST_TMPDIR/limited") 2>&1)
rc=$?
if [ $rc -ne 0 ] && echo "$out" | grep -q "writing '$TEST_TMPDIR/limited_train.bin.new' failed: File too large" &&
    [ -z "$(ls "$TEST_TMPDIR" | grep 'limited.*\(tmp\|new\)')" ]; then
    pass "hardening: a write past the file-size limit fails with a message and leaves no temporary file"
else
    fail "hardening: file-size limit" "exit $rc; $out; $(ls "$TEST_TMPDIR" | grep limited)"
fi
# outputs written whole and renamed over their place are refused on a pipe
# or a device, which the rename would replace (as root, --save /dev/null
# replaced /dev/null with a file): a pipe here stands for both
mkfifo "$TEST_TMPDIR/pipe"
ln -s "$TEST_TMPDIR/pipe" "$TEST_TMPDIR/tkpipe_val.bin"
bad=""
for what in "--save" "--trace"; do
    out=$(timeout 60 $MPIRUN -np 1 "$BUILD/chapter-0" --steps 1 --peak-gflops 10 $what "$TEST_TMPDIR/pipe" 2>&1)
    [ $? = 1 ] && echo "$out" | grep -q "^error: $what '$TEST_TMPDIR/pipe' is a pipe: give a file name" || bad="$bad $what: $out;"
done
out=$(timeout 60 "$BUILD/attention_bench" --batch 1 --seq 16 --channels 8 --heads 2 --reps 1 --log "$TEST_TMPDIR/pipe" 2>&1)
[ $? = 1 ] && echo "$out" | grep -q "^error: --log '$TEST_TMPDIR/pipe' is a pipe" || bad="$bad attention_bench: $out;"
out=$(timeout 60 "$BUILD/tokenize" "$TEST_TMPDIR/short_val.txt" "$TEST_TMPDIR/tkpipe" 2>&1)
[ $? = 1 ] && echo "$out" | grep -q "^error: the output '$TEST_TMPDIR/tkpipe_val.bin' is a pipe" || bad="$bad tokenize: $out;"
if [ -z "$bad" ] && [ -p "$TEST_TMPDIR/pipe" ] && [ ! -e "$TEST_TMPDIR/tkpipe_train.bin" ]; then
    pass "hardening: --save, --trace, attention_bench --log and tokenize refuse a pipe (a device alike) as a file to replace"
else
    fail "hardening: outputs over a pipe" "${bad:-the pipe was replaced}"
fi
# the tokenizer: never its own input, both files or neither, an empty input
# and missing arguments refused with an error line
cp "$TEST_TMPDIR/short_val.txt" "$TEST_TMPDIR/tk_train.bin"
out=$("$BUILD/tokenize" "$TEST_TMPDIR/tk_train.bin" "$TEST_TMPDIR/tk" 2>&1)
rc=$?
if [ $rc -ne 0 ] && echo "$out" | grep -q "^error: the output '$TEST_TMPDIR/tk_train.bin' is the same file as the input" &&
    cmp -s "$TEST_TMPDIR/tk_train.bin" "$TEST_TMPDIR/short_val.txt"; then
    pass "hardening: tokenize refuses to write over its input, which stays intact"
else
    fail "hardening: tokenize over its input" "exit $rc; $out"
fi
# a second file that cannot be written (a full disk there: tests/fail_create.c)
# leaves the pair that was there before, both files (it removed the new train
# file, and with it the only one)
"$BUILD/tokenize" "$TEST_TMPDIR/short_val.txt" "$TEST_TMPDIR/tkp" > /dev/null
cp "$TEST_TMPDIR/tkp_train.bin" "$TEST_TMPDIR/tkp_train.before"
out=$(TEST_FAIL_CREATE="*/tkp_val.bin*" LD_PRELOAD=$(cd "$BUILD/tests" && pwd)/libfail_create.so "$BUILD/tokenize" "$TEST_TMPDIR/corpus.txt" "$TEST_TMPDIR/tkp" 2>&1)
rc=$?
if [ $rc -ne 0 ] && echo "$out" | grep -q "No space left on device" && cmp -s "$TEST_TMPDIR/tkp_train.bin" "$TEST_TMPDIR/tkp_train.before" &&
    [ -f "$TEST_TMPDIR/tkp_val.bin" ] && [ -z "$(ls "$TEST_TMPDIR" | grep 'tkp.*\(tmp\|new\)')" ]; then
    pass "hardening: tokenize whose second file fails keeps the pair that was there, and leaves nothing new"
else
    fail "hardening: tokenize's failed second file" "exit $rc; $out; $(ls "$TEST_TMPDIR" | grep tkp | tr '\n' ' ')"
fi
mkdir -p "$TEST_TMPDIR/tkd_val.bin"
out=$("$BUILD/tokenize" "$TEST_TMPDIR/short_val.txt" "$TEST_TMPDIR/tkd" 2>&1)
rc=$?
if [ $rc -ne 0 ] && echo "$out" | grep -q "^error: cannot write the output '$TEST_TMPDIR/tkd_val.bin': it is a directory" &&
    [ ! -e "$TEST_TMPDIR/tkd_train.bin" ]; then
    pass "hardening: tokenize writes both files or neither"
else
    fail "hardening: tokenize both or neither" "exit $rc; $out; $(ls "$TEST_TMPDIR" | grep tkd)"
fi
# a prefix that names no file: empty (it wrote _train.bin here), ending in
# '/' (dir/_train.bin), a flag (--help second wrote --help_train.bin)
mkdir -p "$TEST_TMPDIR/tkx"
bad="" tk=$(cd "$BUILD" && pwd)/tokenize
for prefix in "" "$TEST_TMPDIR/tkx/" "--help"; do
    out=$(cd "$TEST_TMPDIR/tkx" && "$tk" "$TEST_TMPDIR/short_val.txt" "$prefix" 2>&1)
    rc=$?
    if [ "$prefix" = --help ]; then [ $rc = 0 ] && echo "$out" | grep -q "^usage:" || bad="$bad [--help: $rc $out]"
    else [ $rc = 1 ] && echo "$out" | grep -q "^error: the output prefix '$prefix' " || bad="$bad ['$prefix': $rc $out]"; fi
done
if [ -z "$bad" ] && [ -z "$(ls -A "$TEST_TMPDIR/tkx")" ]; then
    pass "hardening: tokenize refuses an empty prefix or one ending in '/', and --help in any place prints the usage; nothing written"
else
    fail "hardening: tokenize's prefix" "$bad $(ls -A "$TEST_TMPDIR/tkx")"
fi
: > "$TEST_TMPDIR/empty.txt"
out=$("$BUILD/tokenize" "$TEST_TMPDIR/empty.txt" "$TEST_TMPDIR/tke" 2>&1)
rc=$?
out2=$("$BUILD/tokenize" 2>&1)
rc2=$?
if [ $rc -ne 0 ] && echo "$out" | grep -q "^error: the input is empty" && [ ! -e "$TEST_TMPDIR/tke_train.bin" ] &&
    [ $rc2 -ne 0 ] && echo "$out2" | grep -q "^error: give an input file and an output prefix"; then
    pass "hardening: tokenize refuses an empty input and missing arguments with an error line"
else
    fail "hardening: tokenize empty input / no arguments" "exit $rc: $out; exit $rc2: $out2"
fi
# a batch whose blocks' activations alone pass this machine's memory (small
# keeps L (18C + NH + 4) T floats = 42,528,768 bytes a sequence in them at
# T = 256, one buffer): a message that says what to change, on an abort of
# every rank, before malloc could overcommit it and the zeroing meet the
# kernel's out-of-memory killer, which ends a rank without a word
mem_bytes=$(( $(awk '/^MemTotal:/ {print $2}' /proc/meminfo) * 1024 ))
oom_batch=$(( mem_bytes / 42528768 + 2 ))
if [ $(( oom_batch * 256 + 1 )) -gt 2319007 ]; then  # the default corpus's training tokens
    skip "hardening: batch too large for memory" "this machine's memory needs a batch past the default corpus"
else
    out=$(timeout 60 $MPIRUN -np 1 "$BUILD/chapter-0" --model small --batch $oom_batch --seq 256 --steps 1 --peak-gflops 10 2>&1)
    rc=$?
    if [ $rc -ne 0 ] && [ $rc -ne 124 ] && echo "$out" | grep -q "out of host memory allocating [0-9]* bytes ([0-9.]* GiB) of activations .*: lower --batch or --seq"; then
        pass "hardening: a batch past the machine's memory (--batch $oom_batch) ends every rank with what to change"
    else
        fail "hardening: batch too large for memory" "exit $rc; $(echo "$out" | grep -v '^--' | head -8)"
    fi
fi
# the attention bench: sizes past the machine and an unwritable --log refused
# before anything runs (the first was a segmentation fault)
out=$("$BUILD/attention_bench" --batch 65536 --seq 32768 --reps 1 2>&1)
rc=$?
out2=$("$BUILD/attention_bench" --log "$TEST_TMPDIR" --reps 1 2>&1)
rc2=$?
if [ $rc -eq 1 ] && echo "$out" | grep -q "^error: --batch 65536 --seq 32768 .* GiB (.*), more than this machine's" &&
    [ $rc2 -eq 1 ] && [ "$(echo "$out2" | head -1)" = "error: cannot write --log '$TEST_TMPDIR': it is a directory; give a file name" ]; then
    pass "hardening: attention_bench refuses sizes past the machine and an unwritable --log up front"
else
    fail "hardening: attention_bench refusals" "exit $rc: $(echo "$out" | head -3); exit $rc2: $(echo "$out2" | head -3)"
fi
# an output that is an input is refused before anything is written (same
# device and inode: a hard link counts), and the input is left intact
"$BUILD/tokenize" "$TEST_TMPDIR/corpus.txt" "$TEST_TMPDIR/same" >/dev/null
cp "$TEST_TMPDIR/same_train.bin" "$TEST_TMPDIR/same_before.bin"
ln -f "$CKPT" "$TEST_TMPDIR/hardlink.bin"
jobs_run error_case chapter-0 1 "--data $TEST_TMPDIR/same_train.bin --log $TEST_TMPDIR/same_train.bin" "--log '$TEST_TMPDIR/same_train.bin' is the same file as --data"
jobs_run error_case chapter-0 1 "--model $CKPT --save $TEST_TMPDIR/hardlink.bin" "--save '$TEST_TMPDIR/hardlink.bin' is the same file as --model"
jobs_run error_case chapter-3 2 "--dp 2 --model $CKPT --log $CKPT" "--log '$CKPT' is the same file as --model"
jobs_run error_case chapter-0 1 "--save $TEST_TMPDIR" "it is a directory"
# outputs that could not be made are refused before step 0, not after training
jobs_run error_case chapter-3 2 "--dp 2 --save $TEST_TMPDIR/newdir/" "cannot write --save '$TEST_TMPDIR/newdir/': it names a directory (it ends in '/')"
jobs_run error_case chapter-0 1 "--save /proc/m.bin" "cannot write --save '/proc/m.bin': its directory '/proc' takes no new file"
jobs_run error_case chapter-7 1 "--trace /proc/t.json" "cannot write --trace '/proc/t.json': its directory '/proc' takes no new file"
# a pipe as an input: refused before it is opened (opening blocks until a
# writer comes, and no --timeout sees it)
mkfifo "$TEST_TMPDIR/fifo"
jobs_run error_case chapter-3 2 "--dp 2 --data $TEST_TMPDIR/fifo" "data file '$TEST_TMPDIR/fifo' is a pipe: give a text file or an llm.c token file"
jobs_run error_case chapter-3 2 "--dp 2 --val $TEST_TMPDIR/fifo" "token file '$TEST_TMPDIR/fifo' is a pipe: give an llm.c token file"
# a pipe as --log with no reader: opening it for writing blocked rank 0 in
# open() for ever (no MPI wait: no --timeout saw it), the others in the step
jobs_run error_case chapter-3 2 "--dp 2 --log $TEST_TMPDIR/fifo" "cannot write log file '$TEST_TMPDIR/fifo': it is a pipe that no process reads"
# an output name that fits alone but not as the NAME.tmp.PID it is written
# as first: refused at start-up (it failed after training); a file output
# that is a checkpoint directory too (it failed at the end, "Invalid argument")
long=$TEST_TMPDIR/$(printf 'a%.0s' $(seq 1 245))
jobs_run error_case chapter-3 2 "--dp 2 --save $long" "cannot write --save '$long': its name is 245 bytes (written first beside it as NAME.tmp.PID, 15 more)"
jobs_run error_case chapter-0 1 "--trace $long" "cannot write --trace '$long': its name is 245 bytes"
jobs_run error_case chapter-3 2 "--dp 2 --save $TEST_TMPDIR/both_ckpt --ckpt-dir $TEST_TMPDIR/both_ckpt" "--save '$TEST_TMPDIR/both_ckpt' and --ckpt-dir '$TEST_TMPDIR/both_ckpt' are the same file"
jobs_run error_case chapter-0 1 "--log $TEST_TMPDIR/both_local --ckpt-local $TEST_TMPDIR/both_local" "--log '$TEST_TMPDIR/both_local' and --ckpt-local '$TEST_TMPDIR/both_local' are the same file"
# --model too, in every reader (chapter 7's, which the capstone and the planner use, hung)
for bin in chapter-0 chapter-7 capstone; do
    jobs_run error_case $bin 1 "--model $TEST_TMPDIR/fifo" "checkpoint '$TEST_TMPDIR/fifo' is a pipe: give a preset"
done
out=$(timeout 60 "$BUILD/plan" --chapter 7 --model "$TEST_TMPDIR/fifo" 2>&1)
rc=$?
if [ $rc = 1 ] && [ "$(echo "$out" | grep -c '^error: ')" = 1 ] && echo "$out" | grep -q "^error: checkpoint '$TEST_TMPDIR/fifo' is a pipe"; then
    pass "hardening: plan --chapter 7 --model on a pipe: one error line"
else
    fail "hardening: plan --model on a pipe" "exit $rc (124 = hang): $(echo "$out" | head -3)"
fi
# two outputs that are one file (the second written replaced the first, and
# the run said it saved both), however spelled, made or not; a chapter's own
# input (chapter 5's --schedule-file) is an input like --data; a flag as a
# value (--save --tf32 saved to a file named --tf32 and never set --tf32)
echo x > "$TEST_TMPDIR/out_a.txt"
ln -f "$TEST_TMPDIR/out_a.txt" "$TEST_TMPDIR/out_b.txt"
printf 'rank 0: F0 F1 B0 B1\nrank 1: F0 F1 B0 B1\n' > "$TEST_TMPDIR/own.sched"
jobs_run error_case chapter-0 1 "--log $TEST_TMPDIR/both.out --trace $TEST_TMPDIR/./both.out" "--log '$TEST_TMPDIR/both.out' and --trace '$TEST_TMPDIR/./both.out' are the same file"
jobs_run error_case chapter-3 2 "--dp 2 --save $TEST_TMPDIR/out_a.txt --log $TEST_TMPDIR/out_b.txt" "--log '$TEST_TMPDIR/out_b.txt' and --save '$TEST_TMPDIR/out_a.txt' are the same file"
jobs_run error_case chapter-5 2 "--pp 2 --schedule-file $TEST_TMPDIR/own.sched --log $TEST_TMPDIR/own.sched" "--log '$TEST_TMPDIR/own.sched' is the same file as --schedule-file"
jobs_run error_case chapter-0 1 "--save --tf32" "flag --save needs a value, got the flag --tf32 (a file of that name: ./--tf32)"
# numbers past their type: said so, not "needs a number"
jobs_run error_case chapter-0 1 "--lr 1e39" "flag --lr: 1e39 is out of range for a float"
jobs_run error_case chapter-0 1 "--steps 2147483648" "flag --steps: 2147483648 is out of range for an integer"
jobs_wait  # independent (each refuses before it writes): 2 at a time
if cmp -s "$TEST_TMPDIR/same_train.bin" "$TEST_TMPDIR/same_before.bin" && head -c 4 "$CKPT" | od -An -tu4 | grep -q 20240326; then
    pass "hardening: refused outputs left their inputs intact"
else
    fail "hardening: inputs intact" "an input was changed"
fi
# two runs given one log: the second fails clearly, the first keeps writing
timeout 120 $MPIRUN -np 1 "$BUILD/chapter-0" --steps 400 --peak-gflops 10 --log "$TEST_TMPDIR/shared.jsonl" >/dev/null 2>&1 &
first=$!
for i in $(seq 1 100); do grep -q '"type":"step"' "$TEST_TMPDIR/shared.jsonl" 2>/dev/null && break; sleep 0.2; done
# (--peak-gflops: the second run need not measure the peak to find the log taken)
error_case chapter-0 1 "--steps 1 --peak-gflops 10 --log $TEST_TMPDIR/shared.jsonl" "is being written by another run"
kill $first 2>/dev/null
wait $first 2>/dev/null
# --log is opened where it is, never renamed over: a file that exists needs
# no new file in its directory (--log /proc/self/fd/1, the run's own
# stdout, was refused: "'/proc/self/fd' takes no new file"); and --model's
# preset name is no file even where one of that name is (--log tiny in a
# directory holding ./tiny was "the same file as --model 'tiny'")
out=$(timeout 60 $MPIRUN -np 1 "$BUILD/chapter-0" --steps 2 --peak-gflops 10 --log /proc/self/fd/1 2>&1)
rc=$?
if [ $rc = 0 ] && [ "$(echo "$out" | grep -c '^{"type":"step"')" = 2 ]; then
    pass "hardening: --log /proc/self/fd/1 streams the records to the run's stdout (2 step records)"
else
    fail "hardening: --log /proc/self/fd/1" "exit $rc: $(echo "$out" | grep -E 'error|type' | head -3)"
fi
mkdir -p "$TEST_TMPDIR/preset_dir" && : > "$TEST_TMPDIR/preset_dir/tiny"
root=$PWD bin=$BUILD/chapter-0
case $bin in /*) ;; *) bin=$root/$bin ;; esac
out=$(cd "$TEST_TMPDIR/preset_dir" && timeout 60 bash "$root/tests/mpirun.sh" -np 1 "$bin" --steps 1 \
    --peak-gflops 10 --model tiny --log tiny 2>&1)
rc=$?
if [ $rc = 0 ] && grep -q '"type":"summary"' "$TEST_TMPDIR/preset_dir/tiny"; then
    pass "hardening: --model tiny (a preset) beside a file named tiny: --log tiny is no input, the run logs to it"
else
    fail "hardening: --model preset beside a file of its name" "exit $rc: $(echo "$out" | grep error | head -2)"
fi
# a flag of a mode or an axis that is off is said on rank 0, not refused (a
# sweep passes one set of flags to every mode): one note naming the flag,
# exit 0, and none where the run uses the flag. They were passed over in
# silence, and chapter 2's set-up line gave naive mode buckets it never sends
note_case() {  # PROGRAM NP FLAG-NAME WANT(1 note, 0 none) FLAGS...
    local bin=$1 np=$2 flag=$3 want=$4 out rc n
    shift 4
    out=$(timeout 60 $MPIRUN -np "$np" "$BUILD/$bin" --steps 0 --peak-gflops 10 "$@" 2>&1)
    rc=$?
    n=$(echo "$out" | grep -c -- "^note: --$flag does nothing here: ")
    if [ $rc -eq 0 ] && [ "$n" = "$want" ] && { [ "$bin" != chapter-2 ] || [ "$want" = 0 ] || ! echo "$out" | grep '^chapter 2:' | grep -q 'bucket'; }; then
        pass "hardening: $bin $*: $([ "$want" = 1 ] && echo "one note that --$flag does nothing" || echo "no note for --$flag")"
    else
        fail "hardening: $bin $* (--$flag, $want note)" "exit $rc, $n notes: $(echo "$out" | grep -E '^(note|error|chapter 2:)' | head -3)"
    fi
}
jobs_run note_case chapter-2 2 bucket-kb 1 --dp 2 --dp-mode naive --bucket-kb 64
jobs_run note_case chapter-2 2 bucket-kb 0 --dp 2 --dp-mode bucketed --bucket-kb 64
jobs_run note_case chapter-3 2 prefetch 1 --dp 2 --zero 2 --prefetch 0
jobs_run note_case chapter-3 2 prefetch 0 --dp 2 --zero 3 --prefetch 0
jobs_run note_case chapter-6 2 cp-balance 1 --dp 2 --cp-balance zigzag
jobs_run note_case chapter-6 2 cp-overlap 1 --cp 2 --cp-mode ulysses --cp-overlap 0
jobs_run note_case chapter-6 2 cp-overlap 0 --cp 2 --cp-overlap 0
jobs_run note_case chapter-3 2 reshard 1 --dp 2 --zero 2 --reshard 1
# at cp 1 the balance is off, so zigzag's half-chunks no longer refuse
# --seq 63 after the note said it did nothing
jobs_run note_case chapter-6 1 cp-balance 1 --cp-balance zigzag --seq 63
jobs_run note_case chapter-5 1 schedule 1 --schedule gpipe
jobs_run note_case chapter-5 1 schedule 0 --schedule zb
jobs_run note_case capstone 2 schedule 1 --dp 2 --schedule gpipe
jobs_run note_case capstone 2 schedule 0 --dp 2 --microbatches 2 --schedule gpipe
# validation flags with no validation data (a token file alone has no split):
# the run validated never and said nothing
jobs_run note_case chapter-0 1 val-every 1 --data "$TEST_TMPDIR/short_val_train.bin" --val-every 2
jobs_run note_case chapter-3 2 val-batches 1 --dp 2 --data "$TEST_TMPDIR/short_val_train.bin" --val-batches 2
jobs_run note_case chapter-0 1 val-every 0 --val-every 2
jobs_wait
# objects depend on the flags: a new OPT rebuilds, the same OPT does not
fb="$TEST_TMPDIR/flagbuild"
obj="$fb/obj/cpu/common/comm_stats.o"
make -s BACKEND=cpu BUILD="$fb" OPT=-O0 "$obj" >/dev/null 2>&1
make -q BACKEND=cpu BUILD="$fb" OPT=-O0 "$obj" >/dev/null 2>&1
same=$?
make -q BACKEND=cpu BUILD="$fb" OPT=-O1 "$obj" >/dev/null 2>&1
changed=$?
if [ -f "$obj" ] && [ $same -eq 0 ] && [ $changed -eq 1 ]; then
    pass "hardening: objects rebuild when OPT changes, and only then (flags.stamp)"
else
    fail "hardening: flags stamp" "same OPT: make -q $same (want 0); new OPT: $changed (want 1)"
fi

finish
