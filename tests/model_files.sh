#!/bin/bash
# Model files (--model FILE.bin) in every chapter on every axis. A topic
# script of tests/run.sh (make test CHAPTER=model_files runs it alone).
#
# 1. One model saved by chapter 0 loads into each chapter with each axis > 1:
#    dp (chapter 2; chapter 3 with each ZeRO stage), tp (4), pp with every
#    schedule and interleaved (5), cp ring, zigzag and Ulysses and sp (6).
#    Each reproduces chapter 0's losses and gradient norms on the same file
#    (step 0 is the file's own model) and its validation loss. The file is
#    trained from another seed than the default, so a chapter that ignored
#    it and initialised its own model fails. Chapter 7 loads only its own
#    format (a dense file has no experts): the same model written in it with
#    E = k = 2 experts that are both the dense MLP and a zero router (equal
#    gates: 0.5 f + 0.5 f = f) trains chapter 0's losses on ep = 2 (and on
#    the capstone's ep x pp, chapter 7's model on every axis), without the
#    load-balancing loss and clipping (its norm is not chapter 0's: each
#    expert gets half the MLP's gradient); and a file chapter 7 saved loads
#    on ep = 2 with chapter 7's own losses and norms on one rank.
# 2. A vocabulary padded as llm.c pads GPT-2's (V = 250 < Vp = 256; every
#    preset has V = Vp): the invariant on tp = 2 and 3 (chapter 4, and
#    chapter 6 with --sp), pp = 2 (chapter 5) and ep = 2 (chapter 7, the
#    model as two equal experts as above; ep x pp = 2 x 2 on the capstone). Softmax and loss run over the
#    first V logits, so a padded row that entered the loss would change the
#    losses; the padded rows of wte start at zero and stay zero (checked in
#    a tp = 3 --save).
# 3. An odd number of layers (L = 3; every preset's L is even): ZeRO-3 on
#    chapters 3 and 4 and the capstone. Chapter 3's head needs the tied
#    embedding (unit 0) and the final LayerNorm (unit L + 1) in its two
#    gather slots at once; a slot picked by the unit's parity put both in
#    one slot at odd L only, and passed every test of an even-L model.
. "$(dirname "$0")/lib.sh"

echo "== model files: a saved model in every chapter on every axis"
MF=$TEST_TMPDIR/model_files
mkdir -p "$MF"

# self_pair NAME "FLAGS" NP PROGRAM "MESH": PROGRAM on one rank with FLAGS is
# the reference; on NP ranks with MESH it reproduces its losses within TOL,
# its norms within TOL_NORM and its validation loss within TOL (chapter 7,
# whose model with E > 1 experts no other chapter trains)
self_pair() {
    local name=$1 flags=$2 np=$3 prog=$4 mesh=$5 ref=$MF/${4}_1$TEST_JOB.jsonl run=$MF/${4}_$3$TEST_JOB.jsonl c1 c2 c3 ok=1
    mpi_run $T_RUN 1 "$BUILD/$prog" $flags --log "$ref"
    [ $RC = 0 ] || ok=0
    mpi_run $T_RUN "$np" "$BUILD/$prog" $mesh $flags --log "$run"
    [ $RC = 0 ] || ok=0
    c1=$(bash tests/compare_losses.sh "$ref" "$run" $TOL 2>&1) || ok=0
    c2=$(bash tests/compare_losses.sh "$ref" "$run" $TOL_NORM norm 2>&1) || ok=0
    c3=$(compare_val "$ref" "$run" 2>&1) || ok=0
    if [ $ok = 1 ]; then
        pass "$name: one rank's losses ($c1), norms (${c2#* steps, }), validation loss ($c3)"
    else
        fail "$name" "exit $RC; losses ($c1), norms ($c2), validation ($c3); command: $CMD; $(echo "$OUT" | grep -E '^error' | head -2)"
    fi
}

# as_moe DENSE OUT: the dense llm.c model DENSE in chapter 7's format
# (common/moe.h; the format's number from a file chapter 7 saved, $MF/moe.bin):
# every layer an MoE layer of E = 2 experts, k = 2, each expert the layer's
# dense MLP, the router zero
as_moe() {
    python3 - "$1" "$MF/moe.bin" "$2" <<'PY'
import array, struct, sys
dense, moe_saved, out = sys.argv[1:4]
raw = open(dense, 'rb').read()
maxT, V, L, NH, C, Vp = struct.unpack_from('256i', raw)[2:8]
version = struct.unpack_from('i', open(moe_saved, 'rb').read(8), 4)[0]
p = array.array('f')
p.frombytes(raw[1024:])
t, at = {}, 0  # llm.c's tensors, all layers of each together
for name, n in [('wte', Vp * C), ('wpe', maxT * C), ('ln1w', L * C), ('ln1b', L * C), ('qkvw', L * 3 * C * C),
                ('qkvb', L * 3 * C), ('attprojw', L * C * C), ('attprojb', L * C), ('ln2w', L * C), ('ln2b', L * C),
                ('fcw', L * 4 * C * C), ('fcb', L * 4 * C), ('fcprojw', L * 4 * C * C), ('fcprojb', L * C),
                ('lnfw', C), ('lnfb', C)]:
    t[name], at = p[at:at + n], at + n
assert at == len(p), 'not a dense model of this size'
layer = lambda name, l: t[name][l * len(t[name]) // L:(l + 1) * len(t[name]) // L]
E = 2
shared = t['wte'] + t['wpe']  # layer-major: wte wpe, each block's attention half and router, lnf
for l in range(L):
    for name in ('ln1w', 'ln1b', 'qkvw', 'qkvb', 'attprojw', 'attprojb', 'ln2w', 'ln2b'):
        shared += layer(name, l)
    shared += array.array('f', [0.0] * (E * C))
shared += t['lnfw'] + t['lnfb']
experts = array.array('f')  # per layer, per expert: fcw fcb fcprojw fcprojb
for l in range(L):
    for e in range(E):
        for name in ('fcw', 'fcb', 'fcprojw', 'fcprojb'):
            experts += layer(name, l)
h = [0] * 256
h[:12] = [20240326, version, maxT, V, L, NH, C, Vp, E, E, 4 * C, 1]
open(out, 'wb').write(struct.pack('256i', *h) + shared.tobytes() + experts.tobytes())
PY
}
# moe_case NAME "REF_FLAGS" NP PROGRAM "MESH" MOE_FILE: PROGRAM (chapter-7,
# or capstone for a composed MESH) on NP ranks with MESH on MOE_FILE (as_moe
# of REF_FLAGS' --model) reproduces the losses and the validation loss of
# `reference "REF_FLAGS --clip 0"` within TOL
moe_case() {
    local name=$1 ref_flags="$2 --clip 0" np=$3 prog=$4 mesh=$5 file=$6 log=$MF/moe_case$TEST_JOB.jsonl c1 c2 ok=1
    reference "$ref_flags"
    mpi_run $T_RUN "$np" "$BUILD/$prog" $mesh $ref_flags --model "$file" --aux-coef 0 --log "$log"
    [ $RC = 0 ] || ok=0
    c1=$(bash tests/compare_losses.sh "$REF" "$log" $TOL 2>&1) || ok=0
    c2=$(compare_val "$REF" "$log" 2>&1) || ok=0
    if [ $ok = 1 ]; then
        pass "$name: chapter 0's losses ($c1) and validation loss ($c2)"
    else
        fail "$name" "exit $RC; losses ($c1), validation ($c2); command: $CMD; reference: $(cat "$REF.cmd"); $(echo "$OUT" | grep -E '^error' | head -2)"
    fi
}

# pad_model FILE V Vp maxT L NH C: an llm.c model file with random weights
# (normal, 0.02; LayerNorm weights near 1) and the padded rows of wte zero.
# 6 heads of 8 channels split over tp = 2 and 3; the 256 padded rows split
# 86, 85, 85 over tp = 3, so rows V..Vp-1 sit on the last rank.
pad_model() { python3 "$(dirname "$0")/make_model.py" "$@"; }
# pad_rows FILE Vp V C OFFSET: the largest |value| in rows V..Vp-1 of the wte
# that starts OFFSET floats after the 1024-byte header
pad_rows() {
    python3 - "$@" <<'PY'
import struct, sys
path, Vp, V, C, off = sys.argv[1], *map(int, sys.argv[2:6])
with open(path, 'rb') as f:
    f.seek(1024 + 4 * (off + V * C))
    rows = struct.unpack('%df' % ((Vp - V) * C), f.read(4 * (Vp - V) * C))
print(max(abs(x) for x in rows))
PY
}
# ---------------------------------------------------------------- the files
# tiny6: 6 layers cut into pp = 2 stages of 3 chunks; trained 3 steps from
# seed 7 (the chapters' default seed is 1337)
mpi_run $T_RUN 1 "$BUILD/chapter-0" --model tiny6 --seed 7 --steps 3 --batch 8 --seq 32 --peak-gflops 10 --save "$MF/tiny6.bin"
# chapter 7's own: E = 4, k = 2, trained 3 steps from seed 7
mpi_run $T_RUN 1 "$BUILD/chapter-7" --experts 4 --top-k 2 --seed 7 --steps 3 --batch 8 --seq 32 --peak-gflops 10 --save "$MF/moe.bin"
as_moe "$MF/tiny6.bin" "$MF/tiny6_moe.bin"
pad_model "$MF/v250.bin" 250 256 64 2 6 48
as_moe "$MF/v250.bin" "$MF/v250_moe.bin"
MF_FLAGS="--model $MF/tiny6.bin --steps 2 --batch 24 --seq 32 --peak-gflops 10"
PAD_FLAGS="$INV_FLAGS --model $MF/v250.bin"
# the references, made once before the jobs share them
for f in "$MF_FLAGS" "$MF_FLAGS --clip 0" "$PAD_FLAGS" "$PAD_FLAGS --clip 0"; do reference "$f"; done

# ---------------------------------------------------------------- 1. every axis
file_case() {  # NAME NP PROGRAM "MESH"
    invariant --val "model file (tiny6, seed 7): $1" "$MF_FLAGS" "$2" "$3" "$4"
}
jobs_run file_case "chapter 2 dp=2" 2 chapter-2 "--dp 2"
for z in 1 2 3; do jobs_run file_case "chapter 3 dp=2 ZeRO-$z" 2 chapter-3 "--dp 2 --zero $z"; done
jobs_run file_case "chapter 4 tp=2" 2 chapter-4 "--tp 2"
for s in gpipe 1f1b zb; do jobs_run file_case "chapter 5 pp=2 $s" 2 chapter-5 "--pp 2 --schedule $s"; done
jobs_run file_case "chapter 5 pp=2 interleaved v=3" 2 chapter-5 "--pp 2 --schedule interleaved --virtual 3 --microbatches 4"
jobs_run file_case "chapter 5 pp=3 1f1b" 3 chapter-5 "--pp 3"
jobs_run file_case "chapter 6 cp=2 ring" 2 chapter-6 "--cp 2"
jobs_run file_case "chapter 6 cp=2 ring zigzag" 2 chapter-6 "--cp 2 --cp-balance zigzag"
jobs_run file_case "chapter 6 cp=2 ulysses" 2 chapter-6 "--cp 2 --cp-mode ulysses"
jobs_run file_case "chapter 6 tp=2 --sp" 2 chapter-6 "--tp 2 --sp"
jobs_run moe_case "model file (tiny6, seed 7): chapter 7 ep=2, as 2 equal experts" "$MF_FLAGS" 2 chapter-7 "--ep 2" "$MF/tiny6_moe.bin"
jobs_run moe_case "model file (tiny6, seed 7): capstone ep=2 x pp=2 interleaved, as 2 equal experts" "$MF_FLAGS" 4 capstone "--ep 2 --pp 2 --schedule interleaved --virtual 3 --microbatches 4" "$MF/tiny6_moe.bin"
jobs_run self_pair "model file (chapter 7's, E=4 k=2): chapter 7 ep=2" "${MF_FLAGS/tiny6.bin/moe.bin}" 2 chapter-7 "--ep 2"

# ---------------------------------------------------------------- 2. V < Vp
pad_case() {  # NAME NP PROGRAM "MESH"
    invariant --val "padded vocabulary (V=250 < Vp=256): $1" "$PAD_FLAGS" "$2" "$3" "$4"
}
# tp = 3 (the padded rows on the last rank), saved after the 10 steps, with
# chapter 1's collectives: the save's gather of unequal shards then runs on
# messages whose counts must match (a block of each shard's own size passed
# on the library's MPI_Gather, and would not match under NCCL)
pad_tp3() {
    local pmax
    pad_case "chapter 4 tp=3 --comm hand" 3 chapter-4 "--tp 3 --comm hand --save $MF/v250_tp3.bin"
    pmax=$(pad_rows "$MF/v250_tp3.bin" 256 250 48 0 2>&1)
    if [ "$pmax" = 0.0 ]; then
        pass "padded vocabulary: chapter 4 tp=3 keeps wte's padded rows 250..255 zero over 10 steps"
    else
        fail "padded vocabulary: the padded rows of chapter 4 tp=3's --save" "largest |value| '$pmax', want 0"
    fi
}
jobs_run pad_case "chapter 4 tp=2" 2 chapter-4 "--tp 2"
jobs_run pad_tp3
jobs_run pad_case "chapter 6 tp=2 --sp" 2 chapter-6 "--tp 2 --sp"
jobs_run pad_case "chapter 6 tp=3 --sp" 3 chapter-6 "--tp 3 --sp"
jobs_run pad_case "chapter 5 pp=2" 2 chapter-5 "--pp 2"
jobs_run moe_case "padded vocabulary (V=250 < Vp=256): chapter 7 ep=2, as 2 equal experts" "$PAD_FLAGS" 2 chapter-7 "--ep 2" "$MF/v250_moe.bin"
jobs_run moe_case "padded vocabulary (V=250 < Vp=256): capstone ep=2 x pp=2, as 2 equal experts" "$PAD_FLAGS" 4 capstone "--ep 2 --pp 2" "$MF/v250_moe.bin"
jobs_wait

# ---------------------------------------------------------------- 3. L odd
odd_case() {  # NAME NP PROGRAM "MESH"
    invariant --val "3 layers (L odd): $1" "$ODD_FLAGS" "$2" "$3" "$4"
}
pad_model "$MF/l3.bin" 256 256 64 3 4 64
pad_model "$MF/l3_moe.bin" 256 256 64 3 4 64 2 2 128 1
ODD_FLAGS="$INV_FLAGS --model $MF/l3.bin"
reference "$ODD_FLAGS"
jobs_run odd_case "chapter 3 dp=2 ZeRO-3" 2 chapter-3 "--dp 2 --zero 3"
jobs_run odd_case "chapter 3 dp=3 ZeRO-3 --prefetch 0 --reshard 0" 3 chapter-3 "--dp 3 --zero 3 --prefetch 0 --reshard 0"
jobs_run odd_case "chapter 4 dp=2 x tp=2 ZeRO-3" 4 chapter-4 "--dp 2 --tp 2 --zero 3"
jobs_run self_pair "3 layers (L odd), chapter 7's model (E=2 k=2): capstone dp=2 ZeRO-3" "$INV_FLAGS --model $MF/l3_moe.bin" 2 capstone "--dp 2 --zero 3"
jobs_wait

finish
