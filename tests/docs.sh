#!/bin/bash
# The docs: the checker on a doc tree with known defects, then the real docs
# (make docs-check): every path:N reference and quote, link and checked figure.
. "$(dirname "$0")/lib.sh"
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

finish
