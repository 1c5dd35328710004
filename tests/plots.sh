#!/bin/bash
# The plotting pipeline end to end: tests/test_plots.sh, and make capstone's
# tool on chapter 7's traces, tests/test_step_comm.sh (their own PASS/FAIL/SKIP
# lines, counted here).
. "$(dirname "$0")/lib.sh"

echo "== plots"
if [ -f tests/test_plots.sh ]; then
    # its MPI runs have their own 60 s timeouts; this one catches the rest
    out=$(timeout -k 10 600 bash tests/test_plots.sh < /dev/null 2>&1)
    rc=$?
    count_lines "$out"
    if [ $rc = 124 ] || [ $rc = 137 ]; then
        fail "plots" "tests/test_plots.sh timed out after 600 s: $(echo "$out" | tail -3)"
    fi
    if ! echo "$out" | grep -q "^END of tests/test_plots.sh$"; then
        fail "plots" "tests/test_plots.sh ended before its last check (exit $rc): $(echo "$out" | tail -3 | tr '\n' ' ')"
    fi
fi
if [ -f tests/test_step_comm.sh ]; then
    out=$(timeout -k 10 300 bash tests/test_step_comm.sh < /dev/null 2>&1)
    rc=$?
    count_lines "$out"
    if [ $rc = 124 ] || [ $rc = 137 ]; then
        fail "step_comm" "tests/test_step_comm.sh timed out after 300 s: $(echo "$out" | tail -3)"
    fi
    if ! echo "$out" | grep -q "^END of tests/test_step_comm.sh$"; then
        fail "step_comm" "tests/test_step_comm.sh ended before its last check (exit $rc): $(echo "$out" | tail -3 | tr '\n' ' ')"
    fi
fi

finish
