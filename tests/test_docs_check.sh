#!/bin/bash
# test_docs_check.sh: the docs checker (tests/docs_check.py) on a small doc
# tree it writes in a temporary folder. The correct tree must pass; each
# defect must fail, exit non-zero and name the doc's file:line:
#   a. one digit changed in a quoted figure (a fenced block and a paragraph);
#   b. a quoted code line moved (a line inserted above it in the source) or
#      edited in the doc; a reference past the end of the file;
#   c. a broken link, a broken #anchor, a broken image;
#   d. a check command that fails;
#   e. a quoted loss changed in its 4th decimal, a 4-decimal norm two units
#      off, a byte count off by one, a float with another number of decimals;
#   f. code moved under a reference no block quotes: a line inserted above a
#      named line (the name is no longer there), above a range of C (the name
#      still is, but the range cuts the function); a wrong name after a
#      reference; a reference whose sentence names nothing.
# A decimal figure that differs by one unit in its last digit (the loss
# 4.834765 quoted 4.834766), or by the relative tolerance, passes.
# The correct tree's docs/README.md shows that each doc has a $DOCS_TMP of its
# own, that a doc's commands run in order (the docs run in parallel), and
# that the commands take the environment the tree's tests/run_env.sh exports.
# Prints PASS/FAIL lines; tests/run.sh counts them. Takes about a second.
set -u
cd "$(dirname "$0")/.."
pass() { echo "PASS $1"; }
fail() { echo "FAIL $1: $2"; }

if ! command -v python3 >/dev/null 2>&1; then
    fail "docs-check" "python3 is not installed (make setup)"
    exit 0
fi
checker=$PWD/tests/docs_check.py
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# ---------------------------------------------------------------- the correct tree
good=$tmp/good
mkdir -p "$good/docs/plots" "$good/src"
cat > "$good/src/sum.c" <<'EOF'
// sum.c: a file the docs quote
#include <stdio.h>

int main(void) {
    int s = 0;
    for (int i = 1; i <= 10; i++) s += i;
    printf("sum %d\n", s);
    return 0;
}
EOF
printf 'P5 1 1 255 x' > "$good/docs/plots/fig.png"
cat > "$good/README.md" <<'EOF'
# The project

Start at [the course map](docs/README.md) and the
[sum lesson](docs/01_sum.md#2-the-code-in-the-order-it-runs).
EOF
cat > "$good/docs/README.md" <<'EOF'
# Course map

| chapter | lesson |
| --- | --- |
| 1 | [01_sum.md](01_sum.md) |

Back to [the top](../README.md#the-project). The checker's syntax:
`<!-- check: CMD -->` in code is not a check, nor is `[a](nowhere.md)`.

A doc's own scratch folder: the top README's counter is not seen here, and
this doc's two commands run in order.
<!-- check: echo y >> "$DOCS_TMP/n"; wc -l < "$DOCS_TMP/n" -->
count 1

<!-- check: echo z >> "$DOCS_TMP/n"; wc -l < "$DOCS_TMP/n" -->
count 2

The commands run in the environment tests/run_env.sh exports:
<!-- check: echo "probe ${DOCS_ENV_PROBE:-unset}" -->
probe from run_env.sh
EOF
mkdir -p "$good/tests"
echo 'export DOCS_ENV_PROBE="from run_env.sh"' > "$good/tests/run_env.sh"
cat > "$good/docs/01_sum.md" <<'EOF'
# Chapter 1: sums

## 1. The idea

![a figure](plots/fig.png)

The loop is `src/sum.c:6`:

```c
    for (int i = 1; i <= 10; i++) s += i;
```

## 2. The code, in the order it runs

1. The whole of `main`, `src/sum.c:4-9`:

   ```c
   int main(void) {
       int s = 0;
       for (int i = 1; i <= 10; i++) s += i;
       printf("sum %d\n", s);
       return 0;
   }
   ```

2. References without a quote name what their lines hold. The print,
   `printf` at `src/sum.c:7`. Two in a list, `src/sum.c:1` (`sum.c`) and
   `src/sum.c:2` (`stdio.h`): the name in backquotes right after each.
   The function again, unquoted: `main`, `src/sum.c:4-9`.

## 3. Measure it

<!-- check: printf 'sum 55\nsteps 10\n' -->
```
sum 55
steps 10
ms 12.3 (noise, not checked)
```

The same figures in prose, wrapped over two lines:
<!-- check: printf 'the sum is 55\n' -->
after ten steps the sum
is 55, as Gauss said.

Cached: the counter runs once for both comments.
<!-- check: echo x >> "$DOCS_TMP/n"; wc -l < "$DOCS_TMP/n" -->
count 1

<!-- check: echo x >> "$DOCS_TMP/n"; wc -l < "$DOCS_TMP/n" -->
count 1 again

See [section 1](#1-the-idea) and [the sum](../src/sum.c#L4-L9).

Setext heading
--------------

Links to [it](#setext-heading).

## 4. Figures of a float computation

A loss and a norm come out of reductions: their last printed digit moves
with the CPU, the BLAS kernel and the compiler. Byte counts do not.
<!-- check: printf 'step    7/10 | loss 4.834765 | norm 1.5651\nbytes 1572864\n' -->
```
step    7/10 | loss 4.834766 | norm 1.5651
bytes 1572864
```
EOF

# run the checker on a tree: sets rc and out
check_tree() { out=$(python3 "$checker" --root "$1" 2>&1); rc=$?; }

check_tree "$good"
if [ $rc = 0 ] && [ "$(echo "$out" | grep -c '^PASS docs-check')" = 3 ] && ! echo "$out" | grep -q '^FAIL'; then
    pass "docs-check: the correct tree passes ($(echo "$out" | tail -1 | sed 's/^docs-check: //; s/ from .*//'))"
else
    fail "docs-check: the correct tree" "exit $rc: $(echo "$out" | tr '\n' ' ')"
fi
# each quoted block, reference, link and figure was seen
if echo "$out" | grep -q 'docs/01_sum.md (references 6 (quoted 2, named 4), links 4, figures 5)'; then
    pass "docs-check: counts every reference, quote, link and figure of the tree"
else
    fail "docs-check: counts" "$(echo "$out" | grep 01_sum)"
fi

# the loss printed 4.834765 against the quoted 4.834766: one unit in the last
# digit, within the tolerance of docs/TEMPLATE.md, and named as such
if echo "$out" | grep -qF 'docs-check: 1 printed line matched within the tolerance of decimal figures, not verbatim:' &&
    echo "$out" | grep -qF 'docs-check:   docs/01_sum.md:65 prints "step    7/10 | loss 4.834765 | norm 1.5651", the doc "step    7/10 | loss 4.834766 | norm 1.5651" (4% of the tolerance)'; then
    pass "docs-check: a loss that differs in its last printed digit (4.834765 quoted 4.834766) passes, and is reported"
else
    fail "docs-check: a last-digit difference" "$(echo "$out" | tr '\n' ' ')"
fi

# ---------------------------------------------------------------- the defects
# variant DIR SCRIPT FILE: the good tree copied to DIR with the sed SCRIPT
# applied to its FILE, and the checker run on it (rc, out); fails when the
# script changed nothing (a bug of the test)
variant() {
    rm -rf "$1"
    cp -r "$good" "$1"
    sed -i "$2" "$1/$3"
    if cmp -s "$good/$3" "$1/$3"; then
        rc=0 out="the sed script changed nothing (test bug)"
        return 1
    fi
    check_tree "$1"
}
# name, sed script on a file of the good tree, that file, what the report must name
defect() {
    local name=$1 script=$2 file=$3 expect=$4
    variant "$tmp/bad" "$script" "$file" || { fail "docs-check: $name" "$out"; return; }
    if [ $rc != 0 ] && echo "$out" | grep -q '^FAIL docs-check' && echo "$out" | grep -qF -- "$expect"; then
        pass "docs-check: $name fails: $(echo "$out" | grep -F -- "$expect" | head -1 | sed 's/^ *//')"
    else
        fail "docs-check: $name" "exit $rc, expected a failure naming '$expect': $(echo "$out" | tr '\n' ' ')"
    fi
}
defect "(a) one digit changed in a quoted figure (fenced block)" 's/^sum 55$/sum 56/' docs/01_sum.md \
    'docs/01_sum.md:35: check: the command prints "sum 55", which the fenced block at line 35 does not hold; nearest there: "sum 56"'
defect "(a) one digit changed in a quoted figure (paragraph)" 's/^is 55, as/is 54, as/' docs/01_sum.md \
    'docs/01_sum.md:42: check: the command prints "the sum is 55"'
defect "(b) a quoted code line moved in the source" '5i\    // a new line above the loop' src/sum.c \
    'docs/01_sum.md:10: quote of `src/sum.c:6` differs from src/sum.c:6'
defect "(b) a quoted code line edited in the doc" 's/printf("sum %d\\n", s);/printf("%d\\n", s);/' docs/01_sum.md \
    'docs/01_sum.md:21: quote of `src/sum.c:4-9` differs from src/sum.c:7'
defect "(b) a quoted line edited in the source" 's/i <= 10/i < 10/' src/sum.c \
    'docs/01_sum.md:10: quote of `src/sum.c:6` differs'
defect "(b) a reference past the end of the file" 's/`src\/sum.c:7`/`src\/sum.c:70`/' docs/01_sum.md \
    'docs/01_sum.md:27: code reference `src/sum.c:70`: src/sum.c has 9 lines'
defect "(b) a reference to a missing file" 's/`src\/sum.c:1`/`src\/sums.c:1`/' docs/01_sum.md \
    'docs/01_sum.md:27: code reference `src/sums.c:1`: no file src/sums.c'
defect "(c) a broken link" 's/(01_sum.md)/(01_sums.md)/' docs/README.md \
    'docs/README.md:5: link 01_sums.md: no file docs/01_sums.md in the repository'
defect "(c) a broken anchor" 's/#2-the-code-in-the-order-it-runs/#2-the-code/' README.md \
    'README.md:4: link docs/01_sum.md#2-the-code: docs/01_sum.md has no heading with anchor #2-the-code'
defect "(c) a broken image" 's/plots\/fig.png/plots\/fig2.png/' docs/01_sum.md \
    'docs/01_sum.md:5: link plots/fig2.png: no file docs/plots/fig2.png'
defect "(c) a line anchor past the end" 's/#L4-L9/#L4-L19/' docs/01_sum.md \
    'src/sum.c has 9 lines'
defect "(d) a check command that fails" "s/check: printf 'the sum/check: exit 3; printf 'the sum/" docs/01_sum.md \
    'docs/01_sum.md:41: check: the command failed (exit 3)'
# references no block quotes: each names what its lines hold (docs/TEMPLATE.md)
defect "(f) code moved under a named line" '3i\// a new line near the top' src/sum.c \
    'docs/01_sum.md:27: code reference `src/sum.c:7` names `printf` (the nearest name before it in its sentence), which lines 7 of src/sum.c do not hold; src/sum.c holds it at line 8'
defect "(f) code moved under a range of C that still holds the name" '2i\// a new line near the top' src/sum.c \
    'docs/01_sum.md:29: code reference `src/sum.c:4-9` (`main`): lines 4-9 of src/sum.c cut a block (1 `{` left open); a range of C holds whole blocks; lines 5-10 do'
defect "(f) a wrong name right after a reference" 's/(`stdio.h`)/(`stdlib.h`)/' docs/01_sum.md \
    'docs/01_sum.md:28: code reference `src/sum.c:2` names `stdlib.h` (the name after it), which lines 2 of src/sum.c do not hold; src/sum.c does not hold it at all'
defect "(f) a reference whose sentence names nothing" 's/`printf` at `src/`src/' docs/01_sum.md \
    'docs/01_sum.md:27: code reference `src/sum.c:7` names nothing its lines could be checked against'

# floats within a tolerance, the rest exact (docs/TEMPLATE.md)
defect "(e) a quoted loss changed in its 4th decimal" 's/loss 4.834766/loss 4.834866/' docs/01_sum.md \
    'docs/01_sum.md:65: check: the command prints "step    7/10 | loss 4.834765 | norm 1.5651", which the fenced block at line 65 does not hold; nearest there: "step    7/10 | loss 4.834866 | norm 1.5651" (4.834765 against 4.834866: |d| 1.0e-04 > tolerance 2.5e-05)'
defect "(e) a 4-decimal norm two units off" 's/norm 1.5651$/norm 1.5653/' docs/01_sum.md \
    '(1.5651 against 1.5653: |d| 2.0e-04 > tolerance 1.1e-04)'
defect "(e) a byte count off by one (integers are exact)" 's/^bytes 1572864$/bytes 1572865/' docs/01_sum.md \
    'docs/01_sum.md:66: check: the command prints "bytes 1572864"'
defect "(e) a float quoted with another number of decimals" 's/loss 4.834766/loss 4.83477/' docs/01_sum.md \
    'docs/01_sum.md:65: check: the command prints "step    7/10 | loss 4.834765 | norm 1.5651"'

# within the tolerance: the tree still passes
passes() {
    local name=$1
    variant "$tmp/near" "$2" "$3" || { fail "docs-check: $name" "$out"; return; }
    if [ $rc = 0 ] && ! echo "$out" | grep -q '^FAIL'; then
        pass "docs-check: $name passes"
    else
        fail "docs-check: $name" "exit $rc: $(echo "$out" | grep -A2 '^FAIL' | tr '\n' ' ')"
    fi
}
passes "a 4-decimal norm one unit off (1.5651 quoted 1.5650)" 's/norm 1.5651$/norm 1.5650/' docs/01_sum.md
passes "a loss 2e-5 off (4.834765 quoted 4.834785: the relative 5e-6)" 's/loss 4.834766/loss 4.834785/' docs/01_sum.md
