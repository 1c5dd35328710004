#!/bin/bash
# The C test programs that run alone, one process and no arguments: every
# tests/test_*.c whose source has no "// run by: tests/X.sh" line (every op
# against a double-precision reference and its backward against finite
# differences: test_ops; the whole model: test_model; data order and slicing:
# test_data; ...). A test that names its script must be run there.
. "$(dirname "$0")/lib.sh"

echo "== unit tests"
for src in tests/test_*.c; do
    t=$(basename "$src" .c)
    script=$(sed -n 's|^// run by: *\([^ ]*\).*|\1|p' "$src")
    if [ -z "$script" ]; then
        run_program "$BUILD/tests/$t"
    elif [ -f "$script" ] && grep -q "tests/$t\b" "$script"; then
        pass "$t is run by $script"
    else
        fail "$t" "its source says it is run by '$script', which does not run $BUILD/tests/$t"
    fi
done

# common/'s layering: no file includes a chapter's header, no circle of
# files calling each other (tests/layers_check.py), on both backends
if out=$(python3 tests/layers_check.py 2>&1); then
    pass "common/ layering: $(echo "$out" | tr '\n' ' ')"
else
    fail "common/ layering" "$(echo "$out" | tr '\n' ' ')"
fi

finish
