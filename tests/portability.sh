#!/bin/bash
# tests/portability.sh (`make portability`, or `make test CHAPTER=portability`;
# CI runs it, .ci/run): what a student's other machine changes, on this one.
# The last digits of a float that comes out of a reduction move with the CPU,
# the BLAS kernel and the compiler (its vectorisation, its contraction into
# FMAs); a two-machine `mpirun --hostfile` talks over TCP, not shared memory.
# Four legs, each with one invariant run per chapter (and one of the
# capstone, build/capstone), the first three with the docs' figures (make
# docs-check):
#
#   haswell    OpenBLAS's AVX2 kernels (OPENBLAS_CORETYPE=Haswell) instead
#              of the ones it picks for this CPU (AVX-512 on a recent x86-64)
#   portable   a build without -march=native (make BUILD=build/portable
#              ARCH=: gcc -O3 for the x86-64 baseline, SSE2 vectors only)
#   clang      the programs and tests built by clang (OMPI_CC=clang mpicc,
#              build/clang, -march=native): another compiler's vectorisation,
#              and its contraction (clang fuses a*b+c inside an expression
#              into one FMA; gcc in -std=c11 does not), as on macOS, whose cc
#              is clang. A SKIP line where clang with OpenMP is missing
#   tcp        Open MPI over TCP on the loopback (--mca btl self,tcp, pml
#              ob1), the path of a multi-node run; the tests elsewhere pin
#              shared memory (btl self,vader, tests/lib.sh). The arithmetic
#              is that of the native build, so its docs figures are not
#              checked again, only the runs that talk.
#   isa-v2, isa-v3, isa-v4   builds for the x86-64 levels (-march=x86-64-v2:
#              SSE4.2, 4 lanes; v3: AVX2, 8 lanes; v4: AVX-512 with 512-bit
#              vectors preferred, 16 lanes, as gcc tunes for Intel's AVX-512
#              servers), each where this CPU runs it (ld.so --help says which)
#              and a SKIP line where it does not. They run only the claims
#              that are bit for bit by construction (below).
#
# Every leg also runs the bit-for-bit claims that hold by construction, so
# they must hold in every build and with every BLAS kernel: each row op's
# rows the same bits alone as in any batch (tests/test_rows.c) and chapter 7's
# --ep-overlap 5 the same step records as --ep-overlap 1 (its experts'
# products are row by row, ops.h). make test runs both in the native build.
#
# In each leg every chapter reproduces chapter 0's losses within the
# invariant's tolerance (TOL, TOL_NORM: both runs on the same machine, as in
# the chapter tests), and in the first three, chapter 0's reference itself
# stays within that tolerance of the native build's: the drift across
# machines is no larger than the drift across layouts.
# Prints PASS/FAIL lines; tests/run.sh counts them. A few minutes on 2 cores.
. "$(dirname "$0")/lib.sh"
PORT_BUILD=${PORT_BUILD:-build/portable}
CLANG_BUILD=${CLANG_BUILD:-build/clang}
LEGS=${PORT_LEGS:-haswell portable clang tcp isa-v2 isa-v3 isa-v4}

# The native reference (this CPU's OpenBLAS kernels, -march=native) that the
# other builds' references are compared with.
reference "$INV_FLAGS"
NATIVE_REF=$REF

# docs_leg LEG ROOT: make docs-check's checker on the tree ROOT, its PASS and
# FAIL lines named for the leg, and what the tolerance let through
docs_leg() {
    local out rc
    out=$(cd "$2" && timeout 600 python3 tests/docs_check.py 2>&1)
    rc=$?
    echo "$out" | grep -E '^(PASS|FAIL|  )' | sed -E "s/^(PASS|FAIL) /\1 $1: /"
    echo "$out" | grep '^docs-check: ' | sed "s/^/  $1: /"
    passed=$((passed + $(echo "$out" | grep -c '^PASS')))
    failed=$((failed + $(echo "$out" | grep -c '^FAIL')))
    if [ $rc -ne 0 ] && ! echo "$out" | grep -q '^FAIL'; then
        fail "$1: docs-check" "exited $rc without a failed doc: $(echo "$out" | tail -3 | tr '\n' ' ')"
    fi
}

# docs_tree DIR BUILD: a copy of the repository's files (what docs-check
# reads) in DIR with build/ pointing at the build BUILD, so the docs'
# commands (build/chapter-N) run its programs
docs_tree() {
    mkdir -p "$1"
    if git rev-parse --is-inside-work-tree > /dev/null 2>&1; then
        git ls-files -z --cached --others --exclude-standard | tar --null -T - -cf - 2>/dev/null | tar -xf - -C "$1"
    else
        tar --exclude=./build --exclude=./.git -cf - . | tar -xf - -C "$1"
    fi
    rm -rf "$1/build"
    case $2 in /*) ln -s "$2" "$1/build" ;; *) ln -s "$PWD/$2" "$1/build" ;; esac
}

# ref_drift LEG: this leg's chapter 0 reference against the native build's
ref_drift() {
    local a b ok=1
    reference "$INV_FLAGS"
    a=$(bash tests/compare_losses.sh "$NATIVE_REF" "$REF" $TOL 2>&1) || ok=0
    b=$(bash tests/compare_losses.sh "$NATIVE_REF" "$REF" $TOL_NORM norm 2>&1) || ok=0
    if [ "$(cat "$REF.rc")" = 0 ] && [ $ok = 1 ]; then
        pass "$1: chapter 0's reference within the invariant's tolerance of the native build's ($a; ${b#* steps, })"
    else
        fail "$1: chapter 0's reference against the native build's" "$a; $b; $(cat "$REF.cmd") (exit $(cat "$REF.rc"))"
    fi
}

# mesh_talks LEG NP FLAGS: chapter 0's mesh check (an all-reduce along every axis)
mesh_talks() {
    mpi_run $T_SHORT "$2" "$BUILD/chapter-0" $3 --steps 0
    if [ $RC = 0 ] && echo "$OUT" | grep -q 'mesh check: the sum of ranks along every axis matches'; then
        pass "$1: chapter 0's mesh on $2 ranks ($3) checks out"
    else
        fail "$1: chapter 0's mesh on $2 ranks ($3)" "exit $RC; command: $CMD; $(echo "$OUT" | tail -3)"
    fi
}

# collectives LEG NP: chapter 1's collectives by hand against the library
collectives() {
    mpi_run $T_RUN "$2" "$BUILD/chapter-1" --check
    if [ $RC -eq 0 ] && echo "$OUT" | grep -q "check summary: \([0-9]*\) of \1 collective runs match on $2 ranks$"; then
        pass "$1: chapter 1's collectives on $2 ranks: $(echo "$OUT" | grep 'check summary' | sed 's/check summary: //')"
    else
        fail "$1: chapter 1's collectives on $2 ranks" "exit $RC; command: $CMD; $(echo "$OUT" | grep -E 'FAIL|summary|error' | head -5)"
    fi
}

# experts LEG: chapter 7's MoE (E = 4, k = 2) on ep = 2 against one rank;
# the dense link to chapter 0 (E = 1) is chapter 7's own test
experts() {
    local flags="$INV_FLAGS --experts 4 --top-k 2" one=$TEST_TMPDIR/c7_one$TEST_JOB.jsonl a b ok=1
    mpi_run $T_RUN 1 "$BUILD/chapter-7" $flags --log "$one"
    [ $RC = 0 ] || ok=0
    mpi_run $T_RUN 2 "$BUILD/chapter-7" $flags --ep 2 --log "$TEST_TMPDIR/c7_ep2$TEST_JOB.jsonl"
    [ $RC = 0 ] || ok=0
    a=$(bash tests/compare_losses.sh "$one" "$TEST_TMPDIR/c7_ep2$TEST_JOB.jsonl" $TOL 2>&1) || ok=0
    b=$(bash tests/compare_losses.sh "$one" "$TEST_TMPDIR/c7_ep2$TEST_JOB.jsonl" $TOL_NORM norm 2>&1) || ok=0
    if [ $ok = 1 ]; then
        pass "$1: chapter 7 E=4 k=2 on ep=2 reproduces one rank ($a; ${b#* steps, })"
    else
        fail "$1: chapter 7 E=4 k=2 on ep=2" "exit $RC; $a; $b; command: $CMD"
    fi
}

# bits LEG: the claims that are bit for bit by construction, in this leg's
# build: tests/test_rows (its PASS/FAIL lines named for the leg) and chapter
# 7's --ep-overlap 5 against 1 on ep 2 (the step records, timings aside)
bits() {
    local L=$1 out rc a b
    out=$(timeout -k 10 600 "$BUILD/tests/test_rows" < /dev/null 2>&1)
    rc=$?
    echo "$out" | grep -E '^(PASS|FAIL)' | sed -E "s/^(PASS|FAIL) /\1 $L: /"
    passed=$((passed + $(echo "$out" | grep -c '^PASS')))
    failed=$((failed + $(echo "$out" | grep -c '^FAIL')))
    [ $rc -eq 0 ] || echo "$out" | grep -q '^FAIL' || fail "$L: test_rows" "exited $rc: $(echo "$out" | tail -2)"
    local flags="$INV_FLAGS --experts 4 --top-k 2 --ep 2"
    mpi_run $T_RUN 2 "$BUILD/chapter-7" $flags --ep-overlap 1 --log "$TEST_TMPDIR/bits_ov1.jsonl"
    a=$(grep '"type":"step"' "$TEST_TMPDIR/bits_ov1.jsonl" 2>/dev/null | sed 's/"ms":[^,]*,"tokens_per_s":[^,]*,//')
    mpi_run $T_RUN 2 "$BUILD/chapter-7" $flags --ep-overlap 5 --log "$TEST_TMPDIR/bits_ov5.jsonl"
    b=$(grep '"type":"step"' "$TEST_TMPDIR/bits_ov5.jsonl" 2>/dev/null | sed 's/"ms":[^,]*,"tokens_per_s":[^,]*,//')
    # bit for bit by construction: every op a chunk runs is row-stable (tests/test_rows.c)
    if [ $RC = 0 ] && [ -n "$a" ] && [ "$a" = "$b" ]; then
        pass "$L: chapter 7 --ep-overlap 5 on ep=2 gives --ep-overlap 1's step records bit for bit ($(echo "$a" | wc -l) steps)"
    else
        fail "$L: chapter 7 --ep-overlap 5 against 1" "exit $RC; $(diff <(echo "$a") <(echo "$b") | head -3)"
    fi
}

# isa_build LEG LEVEL ARCH: builds the programs and tests for an x86-64 level
# into build/isa-LEVEL and points BUILD there; returns 1 (with a SKIP line)
# where this CPU cannot run that level
isa_build() {
    local L=$1 level=$2 arch=$3 log
    if ! /lib64/ld-linux-x86-64.so.2 --help 2>/dev/null | grep -q "x86-64-$level (supported"; then
        skip "$L: x86-64-$level" "this CPU does not run x86-64-$level code (ld.so --help), so its build is not tested here"
        return 1
    fi
    echo "== portability: $L: a build with $arch (build/isa-$level)"
    log=$TEST_TMPDIR/build.log
    if ! make --no-print-directory BACKEND=cpu BUILD="build/isa-$level" ARCH="$arch" all tests > "$log" 2>&1; then
        fail "$L: make ARCH='$arch' all tests" "$(grep -m3 -E 'error:|\*\*\*' "$log")"
        return 1
    fi
    pass "$L: make BUILD=build/isa-$level ARCH='$arch' all tests builds"
    BUILD=build/isa-$level
}

# chapters LEG: one run per chapter, two at a time
chapters() {
    local L=$1
    jobs_run bits "$L"
    if [ "$L" = tcp ]; then
        jobs_run mesh_talks "$L" 4 "--dp 2 --tp 2"
    else
        jobs_run ref_drift "$L"
    fi
    jobs_run collectives "$L" 3
    # replicas (and tp replicas below) bit-identical by construction: the same ops on the same all-reduced bytes
    jobs_run invariant --norm --expect "bit-identical on every rank" "$L: chapter 2 dp=2 overlapped" "$INV_FLAGS" 2 \
        chapter-2 "--dp 2 --bucket-kb 64"
    jobs_run invariant --norm --val "$L: chapter 3 ZeRO-3 dp=2" "$INV_FLAGS" 2 chapter-3 "--dp 2 --zero 3"
    jobs_run invariant --norm --val --expect "bit-identical on every tp rank" "$L: chapter 4 dp=2 tp=2" "$INV_FLAGS" 4 \
        chapter-4 "--dp 2 --tp 2"
    jobs_run invariant --norm "$L: chapter 5 pp=2 1f1b m=4" "$INV_FLAGS" 2 chapter-5 "--pp 2 --schedule 1f1b --microbatches 4"
    jobs_run invariant --norm --val "$L: chapter 6 cp=2 ring zigzag" "$INV_FLAGS" 2 chapter-6 "--cp 2 --cp-balance zigzag"
    jobs_run experts "$L"
    # the capstone: E = 1 (chapter 0's model) with tp inside pp's stages
    jobs_run invariant --norm "$L: capstone E=1 tp=2 x pp=2" "$INV_FLAGS" 4 capstone "--experts 1 --top-k 1 --tp 2 --pp 2"
    jobs_wait
}

# leg LEG: the leg's environment, in a subshell with a scratch folder of its
# own (its chapter 0 reference is its own, not the native one)
leg() {
    local L=$1
    passed=0 failed=0 skipped=0
    export TEST_TMPDIR=$TEST_TMPDIR/leg_$L
    mkdir -p "$TEST_TMPDIR"
    case $L in
        haswell)
            export OPENBLAS_CORETYPE=Haswell
            echo "== portability: haswell: OpenBLAS's Haswell (AVX2) kernels, -march=native build"
            docs_leg "$L" . ;;
        portable)
            echo "== portability: portable: gcc -O3 without -march=native ($PORT_BUILD)"
            local log=$TEST_TMPDIR/build.log
            if ! make --no-print-directory BACKEND=cpu BUILD="$PORT_BUILD" ARCH= all tests > "$log" 2>&1; then
                fail "$L: make BUILD=$PORT_BUILD ARCH= all tests" "$(grep -m3 -E 'error:|\*\*\*' "$log")"
                return
            fi
            pass "$L: make BUILD=$PORT_BUILD ARCH= all tests builds without -march=native"
            BUILD=$PORT_BUILD
            docs_tree "$TEST_TMPDIR/tree" "$PORT_BUILD"
            docs_leg "$L" "$TEST_TMPDIR/tree" ;;
        clang)
            if ! command -v clang > /dev/null 2>&1 ||
                ! echo 'int main(void){return 0;}' | clang -x c -fopenmp -o /dev/null - > /dev/null 2>&1; then
                skip "$L: a build by clang" "no clang with OpenMP here (make portability installs clang libomp-dev as root: bash .ci/install-deps.sh portability)"
                echo "$passed $failed $skipped" > "$TEST_TMPDIR/counts"
                return
            fi
            echo "== portability: clang: the course built by clang ($CLANG_BUILD)"
            export OMPI_CC=clang
            local log=$TEST_TMPDIR/build.log
            if ! make --no-print-directory BACKEND=cpu BUILD="$CLANG_BUILD" all tests > "$log" 2>&1 ||
                ! grep -q 'clang version' <(strings "$CLANG_BUILD/chapter-0"); then
                fail "$L: OMPI_CC=clang make BUILD=$CLANG_BUILD all tests" "$(grep -m3 -E 'error:|\*\*\*' "$log")"
                echo "$passed $failed $skipped" > "$TEST_TMPDIR/counts"
                return
            fi
            pass "$L: OMPI_CC=clang make BUILD=$CLANG_BUILD all tests builds with clang ($(clang --version | head -1))"
            BUILD=$CLANG_BUILD
            docs_tree "$TEST_TMPDIR/tree" "$CLANG_BUILD"
            docs_leg "$L" "$TEST_TMPDIR/tree" ;;
        tcp)
            export OMPI_MCA_pml=ob1 OMPI_MCA_btl=self,tcp OMPI_MCA_btl_tcp_if_include=lo
            echo "== portability: tcp: Open MPI over TCP on the loopback (btl self,tcp; pml ob1)"
            # the ranks do talk over TCP: Open MPI says which transport it set up
            OMPI_MCA_btl_base_verbose=100 mpi_run $T_SHORT 2 "$BUILD/chapter-0" --dp 2 --steps 0
            if [ $RC = 0 ] && echo "$OUT" | grep -q 'btl: tcp: Using interface: lo' &&
                ! echo "$OUT" | grep -qE 'found loaded component (vader|sm)$'; then
                pass "$L: the ranks talk through Open MPI's tcp transport on lo (btl_base_verbose), no shared memory"
            else
                fail "$L: the tcp transport" "exit $RC; command: $CMD; $(echo "$OUT" | grep -iE 'tcp|error' | head -3)"
            fi ;;
        isa-v2|isa-v3|isa-v4)
            local level=${L#isa-} arch="-march=x86-64-${L#isa-}"
            [ "$level" = v4 ] && arch="$arch -mprefer-vector-width=512"
            if isa_build "$L" "$level" "$arch"; then
                bits "$L"
            fi
            echo "$passed $failed $skipped" > "$TEST_TMPDIR/counts"
            return ;;
        *) fail "portability" "no leg '$L' (PORT_LEGS: haswell portable clang tcp isa-v2 isa-v3 isa-v4)"; return ;;
    esac
    chapters "$L"
    echo "$passed $failed $skipped" > "$TEST_TMPDIR/counts"
}

for L in $LEGS; do
    ( leg "$L" )
    if [ -s "$TEST_TMPDIR/leg_$L/counts" ]; then
        read -r p q s < "$TEST_TMPDIR/leg_$L/counts"
        passed=$((passed + p)) failed=$((failed + q)) skipped=$((skipped + s))
    else
        fail "portability: $L" "the leg ended before counting its checks"
    fi
done

finish
