#!/bin/bash
# make fuzz: builds one libFuzzer target per loader a user feeds files to
# (llm.c checkpoint, token file, --data text) with clang, AddressSanitizer and
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
SOURCES="common/errors.c common/rank.c common/atomic_file.c common/memory.c common/model_layout.c common/model.c
         common/init.c common/model_file.c common/data.c
         common/cpu/ops.c common/cpu/device.c"
objs=""
for src in $SOURCES; do
    obj="$OUT/obj/$(basename "$src" .c).o"
    OMPI_CC=clang mpicc $FLAGS -I"$BLAS_INC" -c -o "$obj" "$src" || exit 1
    objs="$objs $obj"
done
status=0
for target in checkpoint tokens text; do
    bin="$OUT/fuzz_$target"
    OMPI_CC=clang mpicc $FLAGS -fsanitize=fuzzer -o "$bin" "tests/fuzz/fuzz_$target.c" $objs \
        -L"$BLAS_DIR" -Wl,-rpath,"$BLAS_DIR" -lopenblas -lm || exit 1
    mkdir -p "$OUT/corpus/$target"
    log="$OUT/fuzz_$target.log"
    "$bin" -max_total_time="$SECONDS_EACH" -max_len=8192 -timeout=10 -rss_limit_mb=2048 \
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
