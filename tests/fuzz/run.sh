#!/bin/bash
# make fuzz: builds one libFuzzer target per loader a user feeds files to
# (llm.c checkpoint, token file, --data text, the training-state MANIFEST,
# --schedule-file) with clang, AddressSanitizer and
# UndefinedBehaviorSanitizer, and runs each for FUZZ_SECONDS (default 60)
# from the seed corpus in tests/fuzz/corpus/. New inputs go to
# build/fuzz/corpus/, crashes to build/fuzz/crashes/. Exit 1 on any finding.
# Needs clang and libFuzzer (Debian: clang libclang-rt-dev libomp-dev);
# installed here as root, never a dependency of the build or the tests.
set -u
cd "$(dirname "$0")/../.."
SECONDS_EACH=${FUZZ_SECONDS:-60}
OUT=build/fuzz
if ! command -v clang >/dev/null 2>&1 || ! echo 'int main(void){return 0;}' | clang -x c -fopenmp -o /dev/null - 2>/dev/null; then
    if [ "$(id -u)" = 0 ]; then
        echo "fuzz: installing clang libclang-rt-dev libomp-dev"
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends clang libclang-rt-dev libomp-dev >/dev/null || exit 1
    else
        echo "fuzz: needs clang with libFuzzer: sudo apt-get install -y clang libclang-rt-dev libomp-dev"
        exit 1
    fi
fi
mkdir -p "$OUT/obj" "$OUT/crashes"
# the loaders and what they link, built once with the fuzzer's coverage
FLAGS="-O1 -g -std=c11 -D_GNU_SOURCE -fopenmp -Icommon -Itests/fuzz -fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined"
MULTIARCH=$(gcc -print-multiarch)
BLAS_INC=/usr/include/$MULTIARCH/openblas-openmp
BLAS_DIR=/usr/lib/$MULTIARCH/openblas-openmp
# the sources every program links, from the Makefile's own list (so this
# list cannot fall behind the Makefile), with the CPU backend
SOURCES=$(make -s --no-print-directory BACKEND=cpu print-link-sources) || exit 1
LDLIBS=$(make -s --no-print-directory BACKEND=cpu print-ldlibs) || exit 1
# each source's own directory on the include path (a module's header)
INCS=$(for src in $SOURCES; do echo "-I$(dirname "$src")"; done | sort -u | tr '\n' ' ')
objs=""
for src in $SOURCES; do
    obj="$OUT/obj/$(echo "${src%.c}" | tr / _).o"
    OMPI_CC=clang mpicc $FLAGS $INCS -I"$BLAS_INC" -c -o "$obj" "$src" 2>"$obj.log" || { cat "$obj.log"; exit 1; }
    objs="$objs $obj"
done
# what a target links beyond them (a chapter's module), and its longest input
extra_sources() { case $1 in schedule) echo 05_pipeline/schedule.c ;; esac; }
extra_includes() { case $1 in schedule) echo -I05_pipeline ;; esac; }
max_len() { case $1 in manifest) echo 16384 ;; *) echo 8192 ;; esac; }
status=0
for target in checkpoint tokens text manifest schedule; do
    bin="$OUT/fuzz_$target"
    OMPI_CC=clang mpicc $FLAGS $(extra_includes $target) -fsanitize=fuzzer -o "$bin" "tests/fuzz/fuzz_$target.c" \
        $(extra_sources $target) $objs \
        $LDLIBS || exit 1
    mkdir -p "$OUT/corpus/$target"
    log="$OUT/fuzz_$target.log"
    "$bin" -max_total_time="$SECONDS_EACH" -max_len=$(max_len $target) -timeout=10 -rss_limit_mb=2048 \
        -artifact_prefix="$OUT/crashes/${target}-" "$OUT/corpus/$target" "tests/fuzz/corpus/$target" >"$log" 2>&1
    rc=$?
    runs=$(grep -o 'Done [0-9]* runs in [0-9]* second' "$log" | tail -1)
    cov=$(grep -o 'cov: [0-9]* ft: [0-9]*' "$log" | tail -1)
    if [ $rc -eq 0 ]; then
        echo "fuzz $target: ${runs:-no summary}s, $cov, no crash"
    else
        echo "fuzz $target: FOUND A PROBLEM (exit $rc): see $log and $OUT/crashes/"
        grep -m3 -E 'ERROR|SUMMARY|runtime error' "$log"
        status=1
    fi
done
exit $status
