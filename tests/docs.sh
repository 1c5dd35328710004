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

# make site's guards, on a stand-in checkout (docs/README.md alone): an
# --out that is the checkout's own docs/ (it removed all of docs/), a file,
# a folder of other files, and a --root that is no checkout (it wrote a
# site under it) are each refused with one line, nothing touched
echo "== the website builder's --root and --out"
fake=$TEST_TMPDIR/site_root
mkdir -p "$fake/docs" "$TEST_TMPDIR/site_other"
echo "# course" > "$fake/docs/README.md"
echo keep > "$TEST_TMPDIR/site_other/notes.txt"
: > "$TEST_TMPDIR/site_file"
site_refuses() {  # EXPECT ARGS...
    local expect=$1 out rc
    shift
    out=$(timeout 60 python3 tools/site/build.py "$@" 2>&1)
    rc=$?
    if [ $rc = 1 ] && [ "$(echo "$out" | wc -l)" = 1 ] && echo "$out" | grep -qF -- "$expect" && [ -f "$fake/docs/README.md" ] &&
        [ -f "$TEST_TMPDIR/site_other/notes.txt" ] && [ -f "$TEST_TMPDIR/site_file" ] && [ ! -e /nonexistent-root/build ]; then
        pass "site $*: refused ('$expect'), nothing touched"
    else
        fail "site $*" "exit $rc: $out"
    fi
}
site_refuses "lies in the checkout outside build/" --root "$fake" --out "$fake/docs"
site_refuses "lies in the checkout outside build/" --root "$fake" --out "$fake"
site_refuses "is a file, not a folder" --root "$fake" --out "$TEST_TMPDIR/site_file"
site_refuses "holds files that are not a site this script wrote" --root "$fake" --out "$TEST_TMPDIR/site_other"
site_refuses "is not the course's checkout (no docs/README.md)" --root /nonexistent-root

finish
