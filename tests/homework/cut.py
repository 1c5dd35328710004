#!/usr/bin/env python3
"""Homework mode: the exercises marked in a chapter's code, and the student tree.

  cut.py check [N ...]          the markers of chapters N (all chapters if none)
                                are well formed; exit 1 with one line per problem
  cut.py list N                 the exercises of chapter N, one a line
  cut.py student N DEST         writes the student tree of chapter N to DEST
  cut.py copy DEST              copies the tracked files to DEST
  cut.py splice N K SRC DEST    exercise K's region of tree SRC into tree DEST
                                (grade.sh's SUBMISSION mode)
  cut.py shown N DEST           exit 1 if DEST's Markdown files show a line
                                of chapter N's solutions (tests/homework.sh)

An exercise is a region of a chapter's own code (NN_name/*.c, *.h):

    // EXERCISE n: <one-line task>
    ...the solution...
    // END EXERCISE n

Well formed: every region opens and closes in the same file, regions do not
nest, the numbers of a chapter are 1..k with no gap or repeat, every task line
says something. A chapter with markers has 3 to 6 exercises; a chapter
without any has no homework yet.

The student tree is the whole repository (the files git tracks, or every file
but build/ outside git) with each region of chapter N replaced by a stub that
compiles under the project's flags (-Wall -Wextra -Werror: the enclosing
function's parameters are cast to void) and stops the run at once with
"exercise n of chapter N is not done" (exercise_not_done, common/exercise.h),
plus HOMEWORK.md. The instructor's material stays out: docs/answers.md (only
its headings, the lessons' links, stay) and the buggy variants of
tests/homework/bugs/ (their context lines are the solutions). In every
Markdown file a `path:N` reference to a stubbed file is renumbered to the
student file, and a fenced block quoting such a range (docs-check's rule)
becomes the student file's lines: the lessons show the stub, not the
solution, and `make docs-check` holds in the student tree too.
"""
import os
import re
import shutil
import subprocess
import sys

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
OPEN = re.compile(r"^(\s*)// EXERCISE (\d+): ?(.*)$")
CLOSE = re.compile(r"^\s*// END EXERCISE (\d+)\s*$")
ANY = re.compile(r"//\s*(END\s+)?EXERCISE\b")
# A copy of another chapter's exercise in code a later chapter or the
# capstone runs (the capstone's main.c sums chapter 7's gradient groups as
# its exercise 4 does): marked so that every cut that stubs the exercise
# stubs the copy too.
#     // COPY OF CHAPTER 7 EXERCISE 4: why the copy exists
#     ...
#     // END COPY OF CHAPTER 7 EXERCISE 4
COPY_OPEN = re.compile(r"^(\s*)// COPY OF CHAPTER (\d+) EXERCISE (\d+): ?(.*)$")
COPY_CLOSE = re.compile(r"^\s*// END COPY OF CHAPTER (\d+) EXERCISE (\d+)\s*$")
COPY_ANY = re.compile(r"//\s*(END\s+)?COPY OF\b")
# kept out of a student tree (paths relative to the root)
INSTRUCTOR_ONLY = ("docs/answers.md", "tests/homework/bugs/")
# sections of a doc kept out of a student tree, their headings left (the
# instructor's guide names where the tree still shows an answer, every wrong
# answer the grader catches, and what went wrong when the exercises were
# done: answers of this week and later ones)
INSTRUCTOR_SECTIONS = {"docs/teaching.md": ("What a student tree still shows",
                                            "Wrong answers tried, and what catches each",
                                            "Time, order and points per exercise")}


def cut_sections(text, titles):
    """text without the bodies of its `## title` sections named in titles."""
    out, skipping = [], False
    for line in text.split("\n"):
        if line.startswith("## "):
            if skipping:
                out.append("")
            skipping = line[3:].strip() in titles
            out.append(line)
            if skipping:
                out += ["", "The instructor's copy of this section is not part of a homework tree: it",
                        "names answers. HOMEWORK.md gives the order of this chapter's exercises."]
            continue
        if not skipping:
            out.append(line)
    return "\n".join(out)


def exercise_order(chapter):
    """The order column of chapter's row in docs/teaching.md's table of the
    order in a student's own tree, or None."""
    in_table = False
    for line in open(os.path.join(ROOT, "docs", "teaching.md")):
        if line.startswith("|") and "order in the student's own tree" in line:
            in_table = True
        elif in_table and not line.startswith("|"):
            return None
        elif in_table:
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if cells and cells[0] == str(chapter):
                return cells[-1]
    return None


def chapter_dir(n):
    for d in sorted(os.listdir(ROOT)):
        if re.match(r"^0*%d_" % int(n), d) and os.path.isdir(os.path.join(ROOT, d)):
            return d
    return None


def chapters():
    return sorted(int(d.split("_")[0]) for d in os.listdir(ROOT)
                  if re.match(r"^\d\d_", d) and os.path.isfile(os.path.join(ROOT, d, "main.c")))


def chapter_files(n):
    d = chapter_dir(n)
    if d is None:
        return []
    return sorted(os.path.join(d, f) for f in os.listdir(os.path.join(ROOT, d)) if f.endswith((".c", ".h")))


def regions(n):
    """(exercises, problems): exercises as dicts (n, task, path, first, last
    line indexes of the markers, indent)."""
    found, problems = [], []
    for path in chapter_files(n):
        lines = open(os.path.join(ROOT, path)).read().split("\n")
        current = None
        for i, line in enumerate(lines):
            m, c = OPEN.match(line), CLOSE.match(line)
            where = "%s:%d" % (path, i + 1)
            if m:
                if current:
                    problems.append("%s: EXERCISE %s opens inside EXERCISE %d (regions do not nest)" % (where, m.group(2), current["n"]))
                    continue
                task = m.group(3).strip()
                if not task:
                    problems.append("%s: EXERCISE %s has no task after the colon" % (where, m.group(2)))
                current = {"n": int(m.group(2)), "task": task, "path": path, "first": i, "indent": m.group(1)}
            elif c:
                if not current:
                    problems.append("%s: END EXERCISE %s closes nothing" % (where, c.group(1)))
                elif int(c.group(1)) != current["n"]:
                    problems.append("%s: END EXERCISE %s closes EXERCISE %d" % (where, c.group(1), current["n"]))
                    current = None
                else:
                    current["last"] = i
                    found.append(current)
                    current = None
            elif ANY.search(line):
                problems.append("%s: a malformed marker (write '// EXERCISE n: task' and '// END EXERCISE n'): %s" % (where, line.strip()))
        if current:
            problems.append("%s:%d: EXERCISE %d is never closed" % (path, current["first"] + 1, current["n"]))
    numbers = sorted(e["n"] for e in found)
    for k in set(numbers):
        if numbers.count(k) > 1:
            problems.append("chapter %d: EXERCISE %d is marked %d times" % (n, k, numbers.count(k)))
    if found and sorted(set(numbers)) != list(range(1, max(numbers) + 1)):
        problems.append("chapter %d: exercises are numbered %s, not 1..%d" % (n, sorted(set(numbers)), max(numbers)))
    if found and not 3 <= len(set(numbers)) <= 6:
        problems.append("chapter %d: %d exercises; a chapter marks 3 to 6" % (n, len(set(numbers))))
    found.sort(key=lambda e: e["n"])
    return found, problems


def copies():
    """(copies, problems): the copy regions of the tree's code (chapters'
    folders, capstone/ and common/), as dicts like regions' with the chapter
    and the exercise they copy."""
    found, problems = [], []
    for f in tracked_files():
        if not (f.endswith((".c", ".h", ".cu")) and (re.match(r"^\d\d_", f) or f.startswith(("common/", "capstone/")))):
            continue
        if not os.path.isfile(os.path.join(ROOT, f)):
            continue
        lines = open(os.path.join(ROOT, f), errors="replace").read().split("\n")
        current = None
        for i, line in enumerate(lines):
            m, c = COPY_OPEN.match(line), COPY_CLOSE.match(line)
            where = "%s:%d" % (f, i + 1)
            if m:
                if current:
                    problems.append("%s: a COPY opens inside another" % where)
                    continue
                current = {"chapter": int(m.group(2)), "n": int(m.group(3)), "task": m.group(4).strip(),
                           "path": f, "first": i, "indent": m.group(1), "copy": True}
                if not current["task"]:
                    problems.append("%s: a COPY has no reason after the colon" % where)
            elif c:
                if not current or (int(c.group(1)), int(c.group(2))) != (current["chapter"], current["n"]):
                    problems.append("%s: END COPY OF CHAPTER %s EXERCISE %s closes nothing" % (where, c.group(1), c.group(2)))
                    current = None
                else:
                    current["last"] = i
                    found.append(current)
                    current = None
            elif COPY_ANY.search(line):
                problems.append("%s: a malformed copy marker: %s" % (where, line.strip()))
        if current:
            problems.append("%s:%d: the COPY is never closed" % (f, current["first"] + 1))
    for cp in found:
        if not any(e["n"] == cp["n"] for e in regions(cp["chapter"])[0]):
            problems.append("%s:%d: chapter %d has no exercise %d to copy"
                            % (cp["path"], cp["first"] + 1, cp["chapter"], cp["n"]))
    return found, problems


def cut_regions(chapter):
    """What the student tree of `chapter` stubs: every exercise of that
    chapter and of every later one (a tree handed out in week N must not hold
    week N+1's answers), and every copy of one of them elsewhere. Each a dict
    of regions() with its "chapter"."""
    out = []
    for c in chapters():
        if c >= chapter:
            for e in regions(c)[0]:
                out.append(dict(e, chapter=c))
    out += [cp for cp in copies()[0] if cp["chapter"] >= chapter]
    return out


def enclosing_params(lines, first):
    """The parameter names of the function whose body holds line `first`.
    A function definition starts at column 0 in this code base: the nearest
    such line above (not a comment, preprocessor line or closing brace) starts
    the signature, which ends at the first line ending in '{'."""
    j = first - 1
    while j >= 0 and (not lines[j][:1] or lines[j][:1].isspace() or lines[j].startswith(("//", "#", "}"))):
        j -= 1
    if j < 0:
        return []
    k = j
    while k < first and not lines[k].rstrip().endswith("{"):
        k += 1
    sig = " ".join(l.strip() for l in lines[j:k + 1])
    if "(" not in sig or ")" not in sig:
        return []
    inside = sig[sig.index("(") + 1:sig.rindex(")")]
    names = []
    for p in inside.split(","):
        p = re.sub(r"\[.*?\]", "", p).strip()
        if not p or p == "void" or p == "...":
            continue
        m = re.search(r"(\w+)\s*$", p)
        if m:
            names.append(m.group(1))
    return names


def stub(ex, chapter, lines):
    ind = ex["indent"]
    out = [lines[ex["first"]],
           ind + "// Your code here: HOMEWORK.md says what to build and how it is graded.",
           ind + "// Until then the stub below stops the run.",]
    params = enclosing_params(lines, ex["first"])
    if params:
        out.append(ind + " ".join("(void)%s;" % p for p in params))
    out.append(ind + "exercise_not_done(%d, %d);" % (ex.get("chapter", chapter), ex["n"]))
    out.append(lines[ex["last"]])
    return out


def tracked_files():
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
        files = [f for f in out.decode().split("\0") if f]
        if files:
            return files
    except (OSError, subprocess.CalledProcessError):
        pass
    files = []
    for d, subdirs, names in os.walk(ROOT):
        rel = os.path.relpath(d, ROOT)
        subdirs[:] = [s for s in subdirs if not (rel == "." and s in ("build", ".git"))]
        files += [os.path.normpath(os.path.join(rel, n)) for n in names]
    return files


def grade_entries(chapter):
    """(exercise, points, title) and (exercise, what is checked) of
    tests/homework/chapter_N.grade."""
    path = os.path.join(ROOT, "tests", "homework", "chapter_%d.grade" % chapter)
    exercises, checks = [], []
    if not os.path.exists(path):
        return exercises, checks
    for line in open(path):
        m = re.match(r'^exercise (\d+) (\d+) "(.*)"', line)
        if m:
            exercises.append((int(m.group(1)), int(m.group(2)), m.group(3)))
        m = re.match(r'^check (\d+) "(.*?)"', line)
        if m:
            checks.append((int(m.group(1)), m.group(2)))
    return exercises, checks


def homework_md(chapter, exs, maps, later=()):
    entries, checks = grade_entries(chapter)
    points = {e: (p, t) for e, p, t in entries}
    total = sum(p for _, p, _ in entries)
    d = chapter_dir(chapter)
    doc = "docs/%s.md" % d
    out = ["# Homework: chapter %d (%s)" % (chapter, d), "",
           "This tree is the course with %d regions of chapter %d's code cut out. Each is" % (len(exs), chapter),
           "marked `// EXERCISE n: task` ... `// END EXERCISE n`; in between, a stub stops",
           "every run that reaches it with `exercise n of chapter %d is not done`." % chapter,
           "Replace the stub (keep the two marker lines) until the grader gives full marks.",
           "The lesson, %s, explains the ideas; its section *Exercises* has hints." % doc, ""]
    if later:
        out += ["The exercises of the later chapters (%s) are stubs too: they are the homework" % ", ".join(map(str, later)),
                "of the weeks to come, and a run of those chapters stops at its first stub.", ""]
    out += [
           "| # | where | task | points |", "|---|---|---|---|"]
    for e in exs:
        p = points.get(e["n"], (0, ""))[0]
        # the line in this (the student) tree, not the full one
        out.append("| %d | `%s:%d` | %s | %d |" % (e["n"], e["path"], maps[e["path"]][2](e["first"] + 1), e["task"], p))
    out += ["", "## Build, run, grade", "",
            "    make -j2 all                  # the CPU build; it compiles with the stubs in place",
            "    make grade CHAPTER=%d          # builds, then runs each exercise's checks" % chapter, "",
            "The grader prints PASS or FAIL for every check, a score per exercise (all of",
            "an exercise's points when every one of its checks passes, none otherwise),",
            "and as its last line `grade chapter %d: S / %d`. Only exercise k:" % (chapter, total),
            "`make grade CHAPTER=%d EXERCISE=k`." % chapter, "",
            "Your own `make grade` runs your whole tree: an exercise's checks also run",
            "through the exercises they depend on, and stop at those still stubbed.",
            "The order: %s." % (exercise_order(chapter) or "any"),
            "The instructor grades each exercise on",
            "its own, with the other exercises taken from the solution, so partial work",
            "earns its points. Only the lines between an exercise's two markers are",
            "graded: keep all your code there, helpers included.", "",
            "## What each exercise is graded on", ""]
    for e in exs:
        out.append("%d. %s" % (e["n"], points.get(e["n"], (0, e["task"]))[1] or e["task"]))
        for k, what in checks:
            if k == e["n"]:
                out.append("   - %s" % what)
    out += ["", "The invariant (every chapter on every mesh reproduces chapter 0's per-step",
            "losses and gradient norms within 3e-5 and 1e-5) is the main check: a wrong",
            "chunk, peer or scale trains a different model. The lessons show the stubs",
            "where they quote an exercise's code, with this tree's line numbers;",
            "`make docs-check` holds here and lists the quoted figures whose command",
            "stops at a stub as waiting for that exercise.", ""]
    return "\n".join(out)


def line_map(lines, exs, chapter):
    """(student lines, lo, hi) of one file: lo(n) and hi(n) give the student
    tree's line (1-based) of the full file's line n, as the first and as the
    last line of a range; a line inside a region maps to the stub's first
    (lo) or last (hi) line, the markers."""
    out, spans, at = [], [], 0  # spans: (full first, full last, student first, student last), 1-based
    for e in sorted(exs, key=lambda e: e["first"]):
        out += lines[at:e["first"]]
        s = stub(e, chapter, lines)
        spans.append((e["first"] + 1, e["last"] + 1, len(out) + 1, len(out) + len(s)))
        out += s
        at = e["last"] + 1
    out += lines[at:]

    def shift(n):
        d = 0
        for f0, f1, s0, s1 in spans:
            if n > f1:
                d = s1 - f1
        return n + d

    def lo(n):
        for f0, f1, s0, s1 in spans:
            if f0 <= n <= f1:
                return s0
        return shift(n)

    def hi(n):
        for f0, f1, s0, s1 in spans:
            if f0 <= n <= f1:
                return s1
        return shift(n)
    return out, lo, hi


def student_doc(text, maps, solution):
    """A Markdown file of the student tree: every `path:N` or `path:N-M` of a
    stubbed file renumbered to the student file, and a fenced block that
    quotes such a range (docs-check's rule: the next block after the line of
    the reference) replaced by the student file's lines, so the lesson shows
    the stub where it quoted the solution and `make docs-check` holds."""
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    import docs_check
    lines = text.split("\n")
    doc = docs_check.Doc("x", lines)
    replace = {}  # fence index -> new body
    for i, line in enumerate(lines):
        refs = []
        for cm in docs_check.CODE_SPAN_RE.finditer(line):
            m = docs_check.REF_RE.match(cm.group(2).strip())
            if m and m.group(1) in maps:
                refs.append(m)
        if not refs:
            continue
        fence = doc.next_nonblank(i + 1)
        if doc.kind[i] != "fence" and fence in doc.fences and fence not in replace:
            body = [l.rstrip() for l in doc.fences[fence][0]]
            for m in refs:
                full, student, lo, hi = maps[m.group(1)]
                a = int(m.group(2))
                b = int(m.group(3)) if m.group(3) else a
                if [l.rstrip() for l in full[a - 1:b]] == body and full[a - 1:b] != student[lo(a) - 1:hi(b)]:
                    replace[fence] = student[lo(a) - 1:hi(b)]
                    break

        def renumber(cm):
            m = docs_check.REF_RE.match(cm.group(2).strip())
            if not m or m.group(1) not in maps:
                return cm.group(0)
            _, _, lo, hi = maps[m.group(1)]
            a = int(m.group(2))
            b = int(m.group(3)) if m.group(3) else None
            # a line inside a region: the whole stub
            ref = "%s:%d" % (m.group(1), lo(a)) if b is None and lo(a) == hi(a) else \
                "%s:%d-%d" % (m.group(1), lo(a), hi(b or a))
            return cm.group(1) + ref + cm.group(1)
        if doc.kind[i] != "fence":
            lines[i] = docs_check.CODE_SPAN_RE.sub(renumber, line)
    # a block that quotes a solution's lines without a reference (a run
    # record, an aside): those lines give way to a note
    quotes = quoted_code(text.split("\n"), ROOT)  # of code outside every region: the student tree has it too
    for i, (body, first, indent) in doc.fences.items():
        if i in replace or first in quotes:
            continue
        hit = sorted({solution[normalize(l)] for l in body if normalize(l) in solution})
        if hit:
            replace[i] = [l if normalize(l) not in solution else
                          re.match(r"\s*", l).group(0) + "// ... (the solution of %s: not in the homework tree)"
                          % solution[normalize(l)] for l in body]
            # a run of such notes is one note
            replace[i] = [l for k, l in enumerate(replace[i]) if k == 0 or "(the solution of" not in l
                          or l.strip() != replace[i][k - 1].strip()]
    out, i = [], 0
    while i < len(lines):
        if i in replace:
            body, first, indent = doc.fences[i]
            out.append(lines[i])
            out += [" " * indent + l if l.strip() else l for l in replace[i]]
            i = first + len(body)
            continue
        out.append(lines[i])
        i += 1
    return "\n".join(out)


def solution_lines(exs):
    """{normalized line: "exercise n of chapter c"}: the lines that the leak
    test (leaks) counts as giving a solution away in a Markdown file."""
    common = boilerplate()
    sol = {}
    for k, lines in solution_sets(exs).items():
        for n in lines - common:
            sol[n] = label(k)
    return sol


def write_student(chapter, dest):
    exs, problems = regions(chapter)
    problems += [p for c in chapters() if c > chapter for p in regions(c)[1]] + copies()[1]
    if problems:
        sys.exit("error: the exercise markers are not well formed:\n  %s" % "\n  ".join(problems))
    if not exs:
        sys.exit("error: chapter %d has no exercises marked yet (chapters with homework: %s)"
                 % (chapter, ", ".join(str(c) for c in chapters() if regions(c)[0]) or "none"))
    dest = os.path.abspath(dest)
    if os.path.realpath(dest).startswith(os.path.realpath(ROOT) + os.sep) and not os.path.realpath(dest).startswith(
            os.path.realpath(os.path.join(ROOT, "build")) + os.sep):
        sys.exit("error: DEST=%s lies inside the repository; give a path outside it or under build/" % dest)
    parent = dest
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        sys.exit("error: DEST=%s: %s is a file, not a folder; give another DEST" % (dest, parent))
    if os.path.exists(dest) and os.listdir(dest):
        sys.exit("error: DEST=%s exists and is not empty; remove it or give another DEST" % dest)
    exs = [dict(e, chapter=chapter) for e in exs]
    cut = cut_regions(chapter)  # chapter's exercises, every later chapter's, their copies
    by_path = {}
    for e in cut:
        by_path.setdefault(e["path"], []).append(e)
    maps = {}  # stubbed file -> (full lines, student lines, lo, hi)
    for f, fexs in by_path.items():
        lines = open(os.path.join(ROOT, f)).read().split("\n")
        student, lo, hi = line_map(lines, fexs, chapter)
        maps[f] = (lines, student, lo, hi)
    solution = solution_lines(cut)
    for f in tracked_files():
        if f.startswith(INSTRUCTOR_ONLY):
            continue
        src, dst = os.path.join(ROOT, f), os.path.join(dest, f)
        if not os.path.isfile(src):
            continue
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        if f in maps:
            open(dst, "w").write("\n".join(maps[f][1]))
            shutil.copymode(src, dst)
        elif f.endswith(".md"):
            text = open(src).read()
            new = student_doc(cut_sections(text, INSTRUCTOR_SECTIONS.get(f, ())), maps, solution)
            if new == text:
                shutil.copy2(src, dst)
            else:
                open(dst, "w").write(new)
                shutil.copymode(src, dst)
        else:
            shutil.copy2(src, dst)  # keeps the time stamp: a copied build stays valid
    later = sorted({e["chapter"] for e in cut if e["chapter"] > chapter})
    open(os.path.join(dest, "HOMEWORK.md"), "w").write(homework_md(chapter, exs, maps, later))
    # the lessons link to the answers' chapters: their headings stay, the
    # answers do not
    heads = [l for l in open(os.path.join(ROOT, "docs", "answers.md")).read().split("\n") if l.startswith("#")]
    with open(os.path.join(dest, "docs", "answers.md"), "w") as f:
        f.write(heads[0] + "\n\nThe answers are the instructor's: this is a homework tree (HOMEWORK.md).\n\n")
        f.write("\n\n".join(heads[1:]) + "\n")
    print("wrote the student tree of chapter %d to %s: %d exercises stubbed (%s)%s, HOMEWORK.md"
          % (chapter, dest, len(exs), ", ".join("%d" % e["n"] for e in exs),
             "; the later chapters' too (%s: %d regions, copies included)"
             % (", ".join(map(str, later)), len(cut) - len(exs)) if later else ""))


# ---------------------------------------------------------------- leaks
# A solution leaks when a file of the student tree shows its lines: a copy
# of the code somewhere else (another chapter's program, a test, a script)
# or a doc that quotes it. Lines are compared after normalize(): stripped,
# white space collapsed, a trailing // comment dropped (a copy's comment
# differs from the original's). Only lines of 20 characters or more count:
# `}` or `return;` say nothing.
RUN = 3  # this many solution lines of one exercise in a row (comments and short lines between them aside): a copy


def normalize(line):
    l = line.strip()
    m = re.search(r"\s//", l)
    if m and l[:m.start()].count('"') % 2 == 0:
        l = l[:m.start()]
    return " ".join(l.split())


def telling(line):
    """A normalized line that can give a solution away: long enough and code."""
    return len(line) >= 20 and not line.startswith(("//", "/*", "*"))


def region_lines(lines, e):
    return lines[e["first"] + 1:e["last"]]


def solution_sets(exs):
    """{(chapter, n): the telling normalized lines of the full tree's
    solution of exercise n of chapter (and of its marked copies)}"""
    sol = {}
    for e in exs:
        lines = open(os.path.join(ROOT, e["path"]), errors="replace").read().split("\n")
        sol.setdefault((e["chapter"], e["n"]), set()).update(
            n for n in map(normalize, region_lines(lines, e)) if telling(n))
    return sol


def boilerplate():
    """The telling lines that the full tree's code outside every exercise and
    copy holds in two files or more (`const GPTConfig* g = P->cfg;`): a doc
    that quotes one gives no solution away. A line of one file only (a
    solution line that chapter 5's backward shares with its exercise 5) is
    not boilerplate: a doc must not quote it."""
    inside = {}
    for e in [dict(x, chapter=c) for c in chapters() for x in regions(c)[0]] + copies()[0]:
        inside.setdefault(e["path"], set()).update(range(e["first"], e["last"] + 1))
    seen = {}
    for f in tracked_files():
        if f.endswith((".c", ".h", ".cu")) and os.path.isfile(os.path.join(ROOT, f)):
            for i, l in enumerate(open(os.path.join(ROOT, f), errors="replace").read().split("\n")):
                if i not in inside.get(f, ()):
                    n = normalize(l)
                    if telling(n):
                        seen.setdefault(n, set()).add(f)
    return {n for n, fs in seen.items() if len(fs) >= 2}


def marked(lines):
    """{line index: (chapter or None, n)} of the lines between the markers of
    an exercise (chapter None: the file's own chapter) or of a copy."""
    out, cur = {}, None
    for i, l in enumerate(lines):
        m, c = OPEN.match(l) or COPY_OPEN.match(l), CLOSE.match(l) or COPY_CLOSE.match(l)
        if m:
            cur = (int(m.group(2)), int(m.group(3))) if m.re is COPY_OPEN else (None, int(m.group(2)))
        elif c:
            cur = None
        elif cur:
            out[i] = cur
    return out


def quoted_code(lines, root):
    """The indexes of the lines of a Markdown file (LINES) inside a fenced
    block that quotes a file of the tree ROOT by reference, exactly
    (docs-check's rule: `path:N-M` on the line before the block). Such a
    quote shows code the tree holds anyway (chapter 6's forward ring, which
    shares lines with its backward, exercise 3): it gives nothing away that
    the tree's own code does not, and it must stay equal to that code for
    docs-check."""
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    import docs_check
    doc = docs_check.Doc("x", lines)
    out = set()
    cache = {}
    for i, line in enumerate(lines):
        if doc.kind[i] == "fence":
            continue
        fence = doc.next_nonblank(i + 1)
        if fence not in doc.fences:
            continue
        body, first, _ = doc.fences[fence]
        for cm in docs_check.CODE_SPAN_RE.finditer(line):
            m = docs_check.REF_RE.match(cm.group(2).strip())
            if not m or not os.path.isfile(os.path.join(root, m.group(1))):
                continue
            if m.group(1) not in cache:
                cache[m.group(1)] = open(os.path.join(root, m.group(1)), errors="replace").read().split("\n")
            a = int(m.group(2))
            b = int(m.group(3)) if m.group(3) else a
            inside = marked(cache[m.group(1)])
            if any(j in inside for j in range(a - 1, b)):
                continue  # a quote of a region: what it shows must be the stub, and is checked
            if [l.rstrip() for l in cache[m.group(1)][a - 1:b]] == [l.rstrip() for l in body]:
                out.update(range(first, first + len(body)))
                break
    return out


def label(key):
    return "exercise %d of chapter %d" % (key[1], key[0])


def file_leaks(rel, lines, sol, common, homes, root):
    """[(line, key, what)]: runs of RUN solution lines of one exercise in
    any file but the exercise's own (there, the code around the stub is the
    scaffolding the student reads: chapter 6's forward ring beside its
    backward, cp_heads_to_seq beside cp_seq_to_heads); in a Markdown file also each
    solution line that is not boilerplate."""
    found, run, start = [], {k: 0 for k in sol if rel not in homes[k]}, {}
    quotes = quoted_code(lines, root) if rel.endswith(".md") else set()
    # in the exercise's own file (or its copy's), what lies between its
    # markers must be the stub: any line of the solution there is a leak
    regions_here = marked(lines) if any(rel in h for h in homes.values()) else {}
    for i, raw in enumerate(lines):
        n = normalize(raw)
        if not telling(n) or i in quotes:
            continue
        if i in regions_here:
            for k, lines_k in sol.items():
                if rel in homes[k] and n in lines_k:
                    found.append((i + 1, k, "a line of its solution between the markers"))
                    break
            continue  # blank, a comment or short: neither part of a run nor its end
        for k in run:
            if n in sol[k]:
                if run[k] == 0:
                    start[k] = i
                run[k] += 1
                if run[k] == RUN:
                    found.append((start[k] + 1, k, "%d lines in a row of its solution" % RUN))
            else:
                run[k] = 0
        if rel.endswith(".md") and n not in common:
            for k, lines_k in sol.items():
                if n in lines_k:
                    found.append((i + 1, k, "a line of its solution: " + n[:70]))
                    break
    return found


def leaks(chapter, st):
    """The check of a student tree ST (tests/homework.sh): every file of ST
    (code, docs, tests, scripts) scanned for the solution lines of every
    exercise the cut of `chapter` stubs. Exit 1 if any shows."""
    exs = cut_regions(chapter)
    sol = solution_sets(exs)
    common = boilerplate()
    homes = {}
    for e in exs:  # a copy's file is a home too: chapter 7's forward ring beside its copy of the backward
        homes.setdefault((e["chapter"], e["n"]), set()).add(e["path"])
    found, scanned = [], 0
    for d, subdirs, names in os.walk(st):
        if os.path.relpath(d, st) == ".":
            subdirs[:] = [x for x in subdirs if x not in ("build", ".git")]
        for name in sorted(names):
            path = os.path.join(d, name)
            rel = os.path.relpath(path, st)
            if os.path.getsize(path) > 4 << 20:
                continue  # a data file, not code or prose
            data = open(path, "rb").read()
            if b"\0" in data[:8192]:
                continue  # binary
            scanned += 1
            for line, k, what in file_leaks(rel, data.decode("utf-8", "replace").split("\n"), sol, common, homes, st):
                found.append("%s:%d: %s: %s" % (rel, line, label(k), what))
    for f in found[:int(os.environ.get("LEAKS_SHOWN", "8"))]:
        print(f)
    print("%d leaks of %d stubbed exercises' solutions (%d telling lines) in %d files"
          % (len(found), len(sol), sum(map(len, sol.values())), scanned))
    sys.exit(1 if found or not sol else 0)


def copy_tree(dest):
    """The tracked files (time stamps kept: a copied build stays valid)."""
    for f in tracked_files():
        src = os.path.join(ROOT, f)
        if os.path.isfile(src):
            os.makedirs(os.path.join(dest, os.path.dirname(f)), exist_ok=True)
            shutil.copy2(src, os.path.join(dest, f))


def splice(chapter, n, src_root, dest_root):
    """Exercise n's region of src_root's file into dest_root's same file (the
    lines between the markers; the markers stay dest's). Prints the file
    written; exits 1 with one line if src has no well-formed region n."""
    exs, problems = regions(chapter)
    ex = [e for e in exs if e["n"] == n]
    if not ex:
        sys.exit("chapter %d has no exercise %d" % (chapter, n))
    path = ex[0]["path"]
    src = os.path.join(src_root, path)
    if not os.path.isfile(src):
        sys.exit("the submission has no %s" % path)
    lines = open(src, errors="replace").read().split("\n")
    first = [i for i, l in enumerate(lines) if OPEN.match(l) and int(OPEN.match(l).group(2)) == n]
    last = [i for i, l in enumerate(lines) if CLOSE.match(l) and int(CLOSE.match(l).group(1)) == n]
    if len(first) != 1 or len(last) != 1 or last[0] < first[0]:
        sys.exit("the submission's %s has no region '// EXERCISE %d: ...' ... '// END EXERCISE %d' (markers "
                 "missing, repeated or out of order): exercise %d cannot be graded" % (path, n, n, n))
    body = lines[first[0] + 1:last[0]]
    dst = os.path.join(dest_root, path)
    dl = open(dst).read().split("\n")
    a = [i for i, l in enumerate(dl) if OPEN.match(l) and int(OPEN.match(l).group(2)) == n][0]
    b = [i for i, l in enumerate(dl) if CLOSE.match(l) and int(CLOSE.match(l).group(1)) == n][0]
    new = dl[:a + 1] + body + dl[b:]
    if new != dl:
        open(dst, "w").write("\n".join(new))
    print(dst)


def main(argv):
    if len(argv) < 2 or argv[1] not in ("check", "list", "student", "leaks", "shown", "copy", "splice"):
        sys.exit(__doc__)
    cmd = argv[1]
    if cmd == "copy" and len(argv) == 3:
        copy_tree(argv[2])
        return
    if cmd == "splice" and len(argv) == 6:
        splice(int(argv[2]), int(argv[3]), argv[4], argv[5])
        return
    if cmd in ("leaks", "shown") and len(argv) == 4:
        leaks(int(argv[2]), argv[3])
    if cmd == "check":
        which = [int(a) for a in argv[2:]] or chapters()
        bad = 0
        if not argv[2:]:
            cps, problems = copies()
            for p in problems:
                print("error: %s" % p)
            bad += len(problems)
            if cps and not problems:
                print("copies: %s" % ", ".join("%s:%d of chapter %d's exercise %d" % (c["path"], c["first"] + 1, c["chapter"], c["n"]) for c in cps))
        for c in which:
            exs, problems = regions(c)
            for p in problems:
                print("error: %s" % p)
            bad += len(problems)
            if exs and not problems:
                print("chapter %d: %d exercises, markers well formed" % (c, len(exs)))
        sys.exit(1 if bad else 0)
    if len(argv) < 3 or not argv[2].isdigit():
        sys.exit("error: give a chapter number, e.g. CHAPTER=1")
    chapter = int(argv[2])
    if chapter_dir(chapter) is None:
        sys.exit("error: there is no chapter %d (chapters: %s)" % (chapter, " ".join(map(str, chapters()))))
    if cmd == "list":
        exs, problems = regions(chapter)
        for p in problems:
            print("error: %s" % p)
        for e in exs:
            print("%d %s:%d %s" % (e["n"], e["path"], e["first"] + 1, e["task"]))
        sys.exit(1 if problems else 0)
    if len(argv) < 4:
        sys.exit("error: give the destination directory (DEST=dir)")
    write_student(chapter, argv[3])


if __name__ == "__main__":
    main(sys.argv)
