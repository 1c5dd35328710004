#!/bin/bash
# The C test programs: every op against a double-precision reference and its
# backward against finite differences (test_ops), the whole model (test_model),
# data order and slicing (test_data).
. "$(dirname "$0")/lib.sh"

echo "== unit tests"
for t in test_ops test_model test_data test_cuda_queue; do
    run_program "$BUILD/tests/$t"
done

finish
