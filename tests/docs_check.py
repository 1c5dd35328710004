#!/usr/bin/env python3
"""docs_check.py: `make docs-check`. Keeps the docs true to the code.

    python3 tests/docs_check.py [--root DIR] [--no-figures] [FILE.md ...]

--no-figures checks references, quotes and links only (runs no command).
In a student tree of the homework (HOMEWORK.md at the root), a figure whose
command stops at an exercise's stub ("exercise n of chapter N is not done")
is listed as waiting for that exercise, not as a problem.

Without files it reads every docs/*.md but docs/TEMPLATE.md, every
docs/notes/*.md (run records, which quote code too) and the top-level
README.md. docs/TEMPLATE.md
says what is checked; in short:

1. Code references: every `path:N` or `path:N-M` in backquotes names a file of
   the repository (from the root, not from the doc) and lines that exist. When
   the next non-blank line after the reference's line opens a fenced code
   block, the block equals lines N..M exactly (trailing white space ignored).
   Where one line holds several references, the block must equal one of them.
   A reference no block quotes names what its lines hold, and they must hold
   it: the name in backquotes right after it, `path:N` (`name`), or else the
   backquoted name of its sentence nearest before it (after it when none is
   before; not a reference, not a path). A range of C (.c .h .cu) holds whole
   blocks: as many braces closed as opened. So code that moves under a
   reference fails the check even when the reference still exists.
2. Links and images: every relative [text](path), ![alt](path) and
   [label]: path resolves (from the doc's folder) to a file or folder of the
   repository; a #anchor on a Markdown file matches one of its headings
   (GitHub's rule), #Ln or #Ln-Lm on another file names lines that exist.
3. Quoted figures: a line that starts with <!-- check: CMD --> (the comment
   may go on over several lines) runs CMD with bash from the root, with
   $DOCS_TMP a scratch folder; CMD must exit 0 and every non-empty line it
   prints must appear in the next block: the next fenced code block, or else
   the next paragraph (there white space runs count as one space, as
   Markdown renders them). Outputs are cached per command text. Verbatim,
   but for decimal figures (a loss, a norm: a float that comes out of a
   reduction, whose last digits move with the CPU, the BLAS kernel and the
   compiler): one printed with d decimals may differ from the quote, written
   with d decimals too, by one unit in its last digit plus FLOAT_REL of its
   size. Integers (bytes, counts, steps) and all other text stay exact.

The commands run first, DOCS_CHECK_JOBS (default 2) at a time, each with a
$DOCS_TMP of its doc's own; a doc's commands that use it run in their order
(a later command may read what an earlier one left there; another doc's
files are never seen, as when the doc is checked alone). A command that
uses $DOCS_TMP is cached per doc, any other once per run. Then the docs are
checked in order.

"A file of the repository" is a file git tracks or would track (not ignored,
so nothing under build/); outside a git work tree, any file under the root.

Prints one PASS or FAIL line per doc, and under a FAIL one line per problem,
"  doc:line: what differs"; then the printed lines that matched only within
the tolerance, the closest to it first. Exits 1 if anything failed, 2 on
bad usage.
"""
import os
import bisect
import re
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
import urllib.parse

CMD_TIMEOUT = 300  # s; a hang, not a slow machine, is what this catches

FENCE_RE = re.compile(r'^(\s*)(`{3,}|~{3,})(.*)$')
CODE_SPAN_RE = re.compile(r'(?<!`)(`+)(?!`)(.+?)(?<!`)\1(?!`)')
REF_RE = re.compile(r'^([A-Za-z0-9_.][A-Za-z0-9_./+-]*):([0-9]+)(?:-([0-9]+))?$')
LINK_RE = re.compile(r'(!?)\[((?:[^\[\]]|\[[^\[\]]*\])*)\]\(\s*(<[^>]*>|[^\s)]*)(?:\s+("[^"]*"|\'[^\']*\'|\([^)]*\)))?\s*\)')
REFDEF_RE = re.compile(r'^\s{0,3}\[([^\]]+)\]:\s*(<[^>]*>|\S+)')
HEADING_RE = re.compile(r'^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$')
HTML_ID_RE = re.compile(r'<a\s+[^>]*(?:name|id)\s*=\s*"([^"]+)"', re.I)
SCHEME_RE = re.compile(r'^[A-Za-z][A-Za-z0-9+.-]*:')
LINE_ANCHOR_RE = re.compile(r'^L([0-9]+)(?:-L([0-9]+))?$')


class Repo:
    """The files of the repository and their lines, read once."""

    def __init__(self, root):
        self.root = os.path.abspath(root)
        self.files = None
        self.dirs = set()
        try:
            out = subprocess.run(
                ['git', '-C', self.root, 'ls-files', '-z', '--cached', '--others', '--exclude-standard'],
                capture_output=True, check=True).stdout.decode()
            inside = subprocess.run(['git', '-C', self.root, 'rev-parse', '--show-prefix'],
                                    capture_output=True, check=True).stdout.decode().strip()
            if inside == '':  # root is the top of a work tree
                # deleted files are still listed by ls-files until committed
                self.files = {f for f in out.split('\0') if f and os.path.isfile(os.path.join(self.root, f))}
        except (OSError, subprocess.CalledProcessError):
            pass
        if self.files is None:
            self.files = set()
            for d, subdirs, names in os.walk(self.root):
                subdirs[:] = [s for s in subdirs if s not in ('.git', 'build')]
                for n in names:
                    self.files.add(os.path.relpath(os.path.join(d, n), self.root))
        for f in self.files:
            d = os.path.dirname(f)
            while d:
                self.dirs.add(d)
                d = os.path.dirname(d)
        self._lines = {}
        self._anchors = {}

    def is_file(self, rel):
        return rel in self.files

    def is_dir(self, rel):
        return rel in ('', '.') or rel.rstrip('/') in self.dirs

    def lines(self, rel):
        if rel not in self._lines:
            with open(os.path.join(self.root, rel), encoding='utf-8', errors='replace') as f:
                self._lines[rel] = f.read().split('\n')
            if self._lines[rel] and self._lines[rel][-1] == '':
                self._lines[rel].pop()  # the newline that ends the last line
        return self._lines[rel]

    def anchors(self, rel):
        if rel not in self._anchors:
            self._anchors[rel] = markdown_anchors(self.lines(rel))
        return self._anchors[rel]


def slug(text):
    """GitHub's heading anchor: the rendered text, lower case, punctuation
    dropped (letters, digits, '_', '-' and spaces stay), spaces to hyphens."""
    text = re.sub(r'!?\[([^\]]*)\]\([^)]*\)', r'\1', text)  # links: their text
    text = re.sub(r'<[^>]+>', '', text)  # inline HTML tags
    text = text.replace('`', '').replace('*', '')
    text = text.strip().lower()
    text = re.sub(r'[^\w\- ]', '', text)
    return text.replace(' ', '-')


def markdown_anchors(lines):
    anchors = set()
    seen = {}
    fence = None
    prev = ''
    for line in lines:
        m = FENCE_RE.match(line)
        if fence:
            if m and m.group(2)[0] == fence[0] and len(m.group(2)) >= len(fence) and not m.group(3).strip():
                fence = None
            prev = ''
            continue
        if m:
            fence = m.group(2)
            prev = ''
            continue
        text = None
        h = HEADING_RE.match(line)
        if h:
            text = h.group(2)
        elif re.match(r'^\s{0,3}(=+|-+)\s*$', line) and prev.strip() and not prev.lstrip().startswith(('-', '*', '|')):
            text = prev.strip()  # a setext heading: the line above, underlined
        if text is not None:
            s = slug(text)
            n = seen.get(s, 0)
            seen[s] = n + 1
            anchors.add(s if n == 0 else '%s-%d' % (s, n))
        for a in HTML_ID_RE.findall(line):
            anchors.add(a)
        prev = line
    return anchors


class Doc:
    """One Markdown file cut into what the checks need: prose lines (outside
    fences and comments), fenced blocks and check comments."""

    def __init__(self, rel, lines):
        self.rel = rel
        self.lines = lines
        self.prose = []     # (line index, text)
        self.fences = {}    # index of the opening line -> (body lines, index of the first body line, indent)
        self.checks = []    # (index of the comment's first line, command, index after the comment)
        self.kind = ['prose'] * len(lines)  # prose, fence, comment, blank
        i = 0
        n = len(lines)
        while i < n:
            line = lines[i]
            m = FENCE_RE.match(line)
            if m:
                indent, fence = len(m.group(1)), m.group(2)
                j = i + 1
                body = []
                while j < n:
                    c = FENCE_RE.match(lines[j])
                    if c and c.group(2)[0] == fence[0] and len(c.group(2)) >= len(fence) and not c.group(3).strip():
                        break
                    # the fence's indent is not part of the block (fences in lists)
                    body.append(lines[j][indent:] if lines[j][:indent].strip() == '' else lines[j].lstrip())
                    j += 1
                self.fences[i] = (body, i + 1, indent)
                for k in range(i, min(j + 1, n)):
                    self.kind[k] = 'fence'
                i = j + 1
                continue
            if line.lstrip().startswith('<!--'):
                j = i
                while j < n and '-->' not in lines[j]:
                    j += 1
                text = '\n'.join(lines[i:j + 1])
                for k in range(i, min(j + 1, n)):
                    self.kind[k] = 'comment'
                c = re.match(r'^\s*<!--\s*check:(.*?)-->', text, re.S)
                if c:
                    self.checks.append((i, c.group(1).strip(), j + 1))
                rest = lines[j][lines[j].index('-->') + 3:] if j < n else ''
                if rest.strip():
                    self.prose.append((j, rest))
                i = j + 1
                continue
            if not line.strip():
                self.kind[i] = 'blank'
            else:
                self.prose.append((i, re.sub(r'<!--.*?-->', '', line)))
            i += 1

    def next_nonblank(self, i):
        while i < len(self.lines) and not self.lines[i].strip():
            i += 1
        return i

    def block_after(self, i):
        """The block a check quotes: the next fenced block, or else the next
        paragraph. Returns (kind, text, index of its first line) or None."""
        i = self.next_nonblank(i)
        if i >= len(self.lines):
            return None
        if i in self.fences:
            body, first, _ = self.fences[i]
            return ('fenced block', '\n'.join(l.rstrip() for l in body), first)
        j = i
        while j < len(self.lines) and self.lines[j].strip() and self.kind[j] == 'prose':
            j += 1
        return ('paragraph', ' '.join(self.lines[i:j]), i)


class Checker:
    def __init__(self, repo, jobs=2, figures=True):
        self.repo = repo
        self.jobs = max(1, jobs)
        self.figures = figures  # False (--no-figures): references, quotes and links only
        # a student tree of the homework (cut.py writes HOMEWORK.md at its
        # root): a figure whose command stops at an exercise's stub waits
        self.homework = os.path.isfile(os.path.join(repo.root, 'HOMEWORK.md'))
        self.stubbed = []
        self.cache = {}
        self.tmp = tempfile.mkdtemp(prefix='docs-check.')
        self.env = None  # the commands' environment, made by the first command (run_env)
        self.lock = threading.Lock()
        self.ran = 0
        self.run_seconds = 0.0
        # (share of the tolerance used, doc:line, printed, quoted): the
        # figures that matched within the tolerance but not verbatim
        self.tolerated = []

    @staticmethod
    def key(rel, cmd):
        """A command that uses $DOCS_TMP depends on what its doc's earlier
        commands left there: cached per doc. Any other: once per run."""
        return (rel, cmd) if 'DOCS_TMP' in cmd else ('', cmd)

    def run_env(self):
        """The tests' run environment (tests/run_env.sh: how threads and
        waiting ranks yield, the topology file, the transport), which
        changes how fast a run goes on a loaded machine, never what it
        prints; the process's own where the tree has no such file."""
        with self.lock:
            if self.env is None:
                self.env = dict(os.environ)
                if os.path.isfile(os.path.join(self.repo.root, 'tests', 'run_env.sh')):
                    p = subprocess.run(['bash', '-c', '. tests/run_env.sh && env -0'], cwd=self.repo.root,
                                       env=dict(os.environ, TEST_TMPDIR=self.tmp), stdin=subprocess.DEVNULL,
                                       capture_output=True)
                    if p.returncode == 0:
                        self.env = dict(v.split('=', 1) for v in p.stdout.decode(errors='replace').split('\0')
                                        if '=' in v)
            return self.env

    def run(self, rel, cmd):
        k = self.key(rel, cmd)
        if k not in self.cache:
            tmp = os.path.join(self.tmp, re.sub(r'[^A-Za-z0-9_.-]', '_', rel))
            os.makedirs(tmp, exist_ok=True)
            env = dict(self.run_env(), DOCS_TMP=tmp)
            t0 = time.time()
            try:
                p = subprocess.run(['bash', '-c', cmd], cwd=self.repo.root, env=env,
                                   stdin=subprocess.DEVNULL, capture_output=True, timeout=CMD_TIMEOUT)
                result = (p.returncode, p.stdout.decode(errors='replace'), p.stderr.decode(errors='replace'))
            except subprocess.TimeoutExpired:
                result = (None, '', 'timed out after %d s' % CMD_TIMEOUT)
            with self.lock:
                self.cache[k] = result
                self.ran += 1
                self.run_seconds += time.time() - t0
        return self.cache[k]

    def read(self, rel):
        """The doc's lines, or None if it cannot be read."""
        try:
            return self.repo.lines(rel) if self.repo.is_file(rel) else open(
                os.path.join(self.repo.root, rel), encoding='utf-8').read().split('\n')
        except OSError:
            return None

    def prefetch(self, rels):
        """Runs the check commands of the docs RELS, self.jobs at a time, so
        that check() finds them cached. A doc's commands that use $DOCS_TMP
        run in their order, one chain (a later one may read what an earlier
        one left); any other command is a chain of its own, run once for
        every doc that has it. The chains of several commands start first:
        the longest work first keeps the jobs busy to the end."""
        chains, seen = [], set()
        for rel in rels:
            lines = self.read(rel)
            if lines is None:
                continue
            chain = []
            for _, cmd, _ in Doc(rel, lines).checks:
                if self.key(rel, cmd) in seen:
                    continue
                seen.add(self.key(rel, cmd))
                if 'DOCS_TMP' in cmd:
                    chain.append(cmd)
                else:
                    chains.append((rel, [cmd]))
            if chain:
                chains.append((rel, chain))
        chains.sort(key=lambda c: -len(c[1]))  # stable: the docs' order among equals
        with ThreadPoolExecutor(self.jobs) as pool:
            for f in [pool.submit(lambda c: [self.run(c[0], cmd) for cmd in c[1]], c) for c in chains]:
                f.result()

    def check(self, rel):
        """Returns (problems, counts) for one doc."""
        problems = []
        counts = {'references': 0, 'quotes': 0, 'named': 0, 'links': 0, 'figures': 0}
        try:
            lines = self.repo.lines(rel) if self.repo.is_file(rel) else open(
                os.path.join(self.repo.root, rel), encoding='utf-8').read().split('\n')
        except OSError as e:
            return ['%s: cannot read: %s' % (rel, e.strerror)], counts
        doc = Doc(rel, lines)

        def problem(i, what):
            problems.append('%s:%d: %s' % (rel, i + 1, what))

        # reference-style link definitions, for [text][label] links
        for i, text in doc.prose:
            m = REFDEF_RE.match(text)
            if m:
                counts['links'] += 1
                self.check_link(rel, m.group(2), lambda w, i=i: problem(i, w))
        need_name = set()  # (line index, reference) of references no block quotes
        for i, text in doc.prose:
            refs = []
            for span in CODE_SPAN_RE.finditer(text):
                m = REF_RE.match(span.group(2).strip())
                if m:
                    refs.append(m)
            # links: outside code spans
            bare = CODE_SPAN_RE.sub(lambda s: ' ' * len(s.group(0)), text)
            for m in LINK_RE.finditer(bare):
                counts['links'] += 1
                self.check_link(rel, m.group(3), lambda w, i=i: problem(i, w))
            if not refs:
                continue
            counts['references'] += len(refs)
            ok = []
            for m in refs:
                what = self.check_ref(m)
                if what:
                    problem(i, what)
                else:
                    ok.append(m)
            # the references of this line that still need a name (rule 1b):
            # those that exist and that no fenced block after the line quotes
            unnamed = list(ok)
            j = doc.next_nonblank(i + 1)
            if j in doc.fences and len(ok) == len(refs):
                counts['quotes'] += 1
                body, first, _ = doc.fences[j]
                diffs = [self.compare_quote(m, body, first, rel) for m in refs]
                if all(diffs):
                    for d in diffs:
                        problem(d[0], d[1])
                    unnamed = []  # the quote is what is wrong: said once
                else:
                    unnamed = [m for m, d in zip(refs, diffs) if d is not None]
            for m in unnamed:
                need_name.add((i, m.group(0)))

        # 1b. every reference that no block quotes names what its lines hold
        for unit in prose_units(doc):
            self.check_names(unit, need_name, counts, problem)

        for i, cmd, after in doc.checks:
            counts['figures'] += 1
            block = doc.block_after(after)
            if block is None:
                problem(i, 'check: no block after the comment to hold the figures')
                continue
            kind, text, first = block
            if not self.figures:
                continue
            rc, out, err = self.run(rel, cmd)
            if rc != 0 and self.homework and re.search(r'exercise \d+ of chapter \d+ is not done', err + out):
                # a student tree (HOMEWORK.md): the figure comes from code
                # that is still a stub; it holds once the exercise is done
                with self.lock:
                    self.stubbed.append('%s:%d' % (rel, i + 1))
                continue
            if rc != 0:
                why = 'timed out' if rc is None else 'exit %d' % rc
                problem(i, 'check: the command failed (%s): %s; %s' % (
                    why, cmd, ' | '.join((err or out).strip().split('\n')[-3:])))
                continue
            outlines = [l.rstrip() for l in out.split('\n') if l.strip()]
            if not outlines and self.homework:
                # a student tree: a command that hides its runs' output
                # prints nothing when one stops at a stub
                with self.lock:
                    self.stubbed.append('%s:%d' % (rel, i + 1))
                continue
            if not outlines:
                problem(i, 'check: the command prints nothing, so it checks nothing: %s' % cmd)
                continue
            hay = text if kind == 'fenced block' else ' '.join(text.split())
            for l in outlines:
                needle = l if kind == 'fenced block' else ' '.join(l.split())
                if needle in hay:
                    continue
                # not verbatim: the same text with every decimal figure
                # within the tolerance (docs/TEMPLATE.md)?
                ok, bad = tolerant_match(needle, hay)
                if ok:
                    with self.lock:
                        self.tolerated.append((ok[0], '%s:%d' % (rel, first + 1), l, ok[1]))
                    continue
                near, k = closest(needle, hay, kind)
                # a fenced block's nearest line is where the figure went wrong
                at = first + k if kind == 'fenced block' and near else first
                over = ''
                if bad:
                    a, b, d, tol = bad[2]
                    over = ' (%s against %s: |d| %.1e > tolerance %.1e)' % (a, b, d, tol)
                problem(at, 'check: the command prints "%s", which the %s at line %d does not hold%s%s' % (
                    l, kind, first + 1, '; nearest there: "%s"' % near if near else '', over))
        return problems, counts

    def check_ref(self, m):
        path, a = m.group(1), int(m.group(2))
        b = int(m.group(3)) if m.group(3) else a
        if not self.repo.is_file(path):
            # paths count from the top of the repository: name the files meant
            same = sorted(f for f in self.repo.files if os.path.basename(f) == os.path.basename(path))
            hint = '; paths start at the top of the repository: %s?' % ' or '.join(same[:3]) if same else ''
            return 'code reference `%s`: no file %s in the repository%s' % (m.group(0), path, hint)
        n = len(self.repo.lines(path))
        if a < 1 or b < a:
            return 'code reference `%s`: not a range of lines' % m.group(0)
        if b > n:
            return 'code reference `%s`: %s has %d lines' % (m.group(0), path, n)
        return None

    def check_names(self, unit, need_name, counts, problem):
        """Rule 1b: a reference that no fenced block quotes names what its
        lines hold, and the name must be in those lines: the name written
        right after it in parentheses, `path:N` (`name`), or else the
        backticked name of the same sentence nearest before it (after it when
        none is before): a code span that is neither a reference nor a path
        of the repository. A range of C must also hold whole blocks (as many
        braces closed as opened), so that code moving under a range that held
        a function or a loop is seen even when the name is still inside."""
        text, starts = unit
        spans = []  # (start, end, content, reference match or None)
        for s in CODE_SPAN_RE.finditer(text):
            c = s.group(2).strip()
            spans.append((s.start(), s.end(), c, REF_RE.match(c)))
        if not any(r for _, _, _, r in spans):
            return
        bounds = sentence_bounds(text, spans)
        for k, (a, b, c, r) in enumerate(spans):
            if not r:
                continue
            i = starts[bisect.bisect_right(starts, (a, 1 << 30)) - 1][1]
            if (i, r.group(0)) not in need_name:
                continue
            need_name.discard((i, r.group(0)))
            path, lo = r.group(1), int(r.group(2))
            hi = int(r.group(3)) if r.group(3) else lo
            named = self.name_of(text, spans, bounds, k)
            if named is None:
                problem(i, 'code reference `%s` names nothing its lines could be checked against: quote the '
                        'lines in a fenced block after it, name them in the sentence (`name`), or write '
                        '`%s` (`name`)' % (r.group(0), r.group(0)))
                continue
            name, how = named
            lines = self.repo.lines(path)
            held = name_in(name, lines[lo - 1:hi])
            depth = brace_depth(lines[lo - 1:hi]) if path.endswith(C_EXTS) and hi > lo else (0, 0)
            if held and depth != (0, 0):
                # the name is there but the range cuts a block: the code moved
                # under a range that held a whole function, loop or block
                problem(i, 'code reference `%s` (`%s`): lines %d-%d of %s cut a block (%s); a range of C holds '
                        'whole blocks%s' % (r.group(0), name, lo, hi, path, describe_depth(depth),
                                            whole_block_hint(lines, lo, hi, name)))
                continue
            if held:
                counts['named'] += 1
                continue
            if self.homework and any('exercise_not_done(' in l for l in lines[lo - 1:hi]):
                counts['named'] += 1  # a student tree: the lines are an exercise's stub now
                continue
            at = [n + 1 for n in range(len(lines)) if name_in(name, lines[n:n + 1])]
            where = '; %s holds it at line%s %s' % (path, 's' * (len(at) > 1), ', '.join(map(str, at[:6]))) \
                if at else '; %s does not hold it at all' % path
            problem(i, 'code reference `%s` names `%s` (%s), which lines %s of %s do not hold%s' % (
                r.group(0), name, how, '%d-%d' % (lo, hi) if hi > lo else lo, path, where))

    def name_of(self, text, spans, bounds, k):
        """(name, how) that the reference spans[k] of TEXT names (rule 1b),
        or None when its sentence names nothing. SPANS and BOUNDS as in
        check_names; tools/site/ marks its links with the same name."""
        a, b = spans[k][0], spans[k][1]
        explicit = EXPLICIT_NAME_RE.match(text, b)
        if explicit:
            return explicit.group(2).strip(), 'the name after it'
        s0, s1 = next((x, y) for x, y in bounds if x <= a < y)
        # the nearest before it, else the nearest after it
        cands = [(x > a, a - y if x < a else x - b, cc) for x, y, cc, rr in spans
                 if not rr and s0 <= x < s1 and self.is_name(cc)]
        if not cands:
            return None
        after, _, name = min(cands)
        return name, 'the nearest name %s it in its sentence' % ('after' if after else 'before')

    def is_name(self, c):
        """A code span a reference may name: not a path of the repository
        (the file itself names no lines)."""
        c = c.rstrip('/')
        return bool(c) and not self.repo.is_file(c) and not self.repo.is_dir(c)

    def compare_quote(self, m, body, first, rel):
        """None if the block equals the lines, else (doc line index, what differs)."""
        path, a = m.group(1), int(m.group(2))
        b = int(m.group(3)) if m.group(3) else a
        want = [l.rstrip() for l in self.repo.lines(path)[a - 1:b]]
        got = [l.rstrip() for l in body]
        if want == got:
            return None
        where = ''
        flines = [l.rstrip() for l in self.repo.lines(path)]
        for s in range(len(flines) - len(got) + 1):
            if got and flines[s:s + len(got)] == got:
                where = '; the quote is at %s:%s now' % (
                    path, s + 1 if len(got) == 1 else '%d-%d' % (s + 1, s + len(got)))
                break
        for k in range(max(len(want), len(got))):
            w = want[k] if k < len(want) else None
            g = got[k] if k < len(got) else None
            if w != g:
                if g is None:
                    return (first + len(got), 'quote of `%s` ends after %d lines; %s:%d is "%s"%s' % (
                        m.group(0), len(got), path, a + k, w, where))
                if w is None:
                    return (first + k, 'quote of `%s` has %d lines, the range %d; extra line "%s"%s' % (
                        m.group(0), len(got), len(want), g, where))
                return (first + k, 'quote of `%s` differs from %s:%d: quoted "%s", the file has "%s"%s' % (
                    m.group(0), path, a + k, g.strip(), w.strip(), where))
        return None

    def check_link(self, rel, target, problem):
        target = target.strip()
        if target.startswith('<') and target.endswith('>'):
            target = target[1:-1]
        if not target or SCHEME_RE.match(target) or target.startswith('//'):
            return  # absolute URLs are not checked (the check runs offline)
        path, _, anchor = target.partition('#')
        path = urllib.parse.unquote(path)
        anchor = urllib.parse.unquote(anchor)
        if path == '':
            dest = rel
        elif path.startswith('/'):
            dest = os.path.normpath(path.lstrip('/'))
        else:
            dest = os.path.normpath(os.path.join(os.path.dirname(rel), path))
        if dest.startswith('..'):
            problem('link %s: leads outside the repository' % target)
            return
        if self.repo.is_dir(dest) and not self.repo.is_file(dest):
            if anchor:
                problem('link %s: an anchor on a folder' % target)
            return
        if not self.repo.is_file(dest):
            problem('link %s: no file %s in the repository' % (target, dest))
            return
        if not anchor:
            return
        if dest.endswith('.md'):
            if anchor not in self.repo.anchors(dest):
                near = sorted(self.repo.anchors(dest), key=lambda a: -similarity(a, anchor))[:1]
                problem('link %s: %s has no heading with anchor #%s%s' % (
                    target, dest, anchor, '; nearest: #%s' % near[0] if near else ''))
        else:
            m = LINE_ANCHOR_RE.match(anchor)
            if m:
                n = len(self.repo.lines(dest))
                last = int(m.group(2) or m.group(1))
                if last > n:
                    problem('link %s: %s has %d lines' % (target, dest, n))


# ---------------------------------------------------------------- figures within a tolerance
# A decimal figure (digits, a point, digits, maybe an exponent) that is not
# part of a longer token such as a version 2.28.9 or a name gpt3.5: the only
# kind of number compared within a tolerance. Integers (bytes, counts, steps)
# and all other text stay exact.
DECIMAL_RE = re.compile(r'(?<![\w.])-?[0-9]+\.([0-9]+)(?:[eE]([-+]?[0-9]+))?(?![0-9]|\.[0-9])')
# The tolerance, docs/TEMPLATE.md: a figure printed with d decimals may differ
# from the quote by one unit in its last digit (two values a hair apart may
# round either way) plus a relative FLOAT_REL of its size (what another
# summation order moves: another CPU, BLAS kernel or compiler). A loss of 5
# printed as 4.834766 may move by 1e-6 + 2.5e-5; a change in its 4th decimal
# (1e-4) fails for any loss below 19.
FLOAT_REL = 5e-6


def decimal_unit(m):
    """One unit in the last printed digit of a DECIMAL_RE match."""
    return 10.0 ** (-len(m.group(1)) + int(m.group(2) or 0))


def tolerant_match(needle, hay):
    """Looks for NEEDLE in HAY with each decimal figure of NEEDLE free to take
    another value of the same form (as many decimals, an exponent or none).
    Returns (ok, bad): ok is (share of the tolerance used, the text in HAY)
    for the best match within the tolerance, else None; bad the same for the
    match that failed by the least, with (printed, quoted, |d|, tolerance) of
    its worst figure, else None (or when NEEDLE has no decimal figure)."""
    figs = list(DECIMAL_RE.finditer(needle))
    if not figs:
        return None, None
    pat, pos = '', 0
    for m in figs:
        pat += re.escape(needle[pos:m.start()])
        pat += r'(?<![\w.])(-?[0-9]+\.[0-9]{%d}%s)(?![0-9]|\.[0-9])' % (
            len(m.group(1)), r'[eE][-+]?[0-9]+' if m.group(2) is not None else '')
        pos = m.end()
    pat += re.escape(needle[pos:])
    ok = bad = None
    for h in re.finditer(pat, hay):
        worst = (0.0, None)
        for k, m in enumerate(figs):
            a, b = float(m.group(0)), float(h.group(k + 1))
            unit = max(decimal_unit(m), decimal_unit(DECIMAL_RE.match(h.group(k + 1))))
            tol = unit + FLOAT_REL * max(abs(a), abs(b))
            share = abs(a - b) / tol
            if share > worst[0] or worst[1] is None:
                worst = (share, (m.group(0), h.group(k + 1), abs(a - b), tol))
        if worst[0] <= 1.0 + 1e-9:  # the boundary itself, whatever the rounding of the arithmetic
            if ok is None or worst[0] < ok[0]:
                ok = (worst[0], h.group(0))
        elif bad is None or worst[0] < bad[0]:
            bad = (worst[0], h.group(0), worst[1])
    return ok, bad


def similarity(a, b):
    """Shared characters in order, cheaply: the longest common prefix plus suffix."""
    p = len(os.path.commonprefix([a, b]))
    s = len(os.path.commonprefix([a[::-1], b[::-1]]))
    return p + s


def closest(needle, hay, kind):
    """The piece of the block that looks most like the missing line, and its
    line in a fenced block: ('', 0) if nothing shares a word with it."""
    cands = hay.split('\n') if kind == 'fenced block' else re.split(r'(?<=[.;:)])\s+', hay)
    words = set(needle.split())
    best, k = '', 0
    score = (0, 0)
    for j, c in enumerate(cands):
        sc = (len(words & set(c.split())), similarity(c.strip(), needle.strip()))
        if sc[0] and sc > score:
            best, k, score = c.strip(), j, sc
    return (best if len(best) <= 160 else best[:157] + '...'), k


# `path:N` (`name`): the name a reference points at, written after it
EXPLICIT_NAME_RE = re.compile(r'\s*\(\s*(`+)(.+?)\1\s*\)')
LIST_ITEM_RE = re.compile(r'^\s*(?:[-*+]|[0-9]+[.)])\s+')
ABBREV_RE = re.compile(r'(?:\be\.g|\bi\.e|\bcf|\bvs|\betc)\.$')


def prose_units(doc):
    """The doc's prose cut into paragraphs, list items, table rows and
    headings, each as (text joined with spaces, [(offset, line index)])."""
    units, cur = [], None
    for i, line in enumerate(doc.lines):
        if doc.kind[i] != 'prose' or not line.strip():
            cur = None
            continue
        text = re.sub(r'<!--.*?-->', '', line)
        alone = text.lstrip().startswith(('|', '#'))
        if cur is None or alone or LIST_ITEM_RE.match(text) or cur[2]:
            cur = ['', [], alone]
            units.append(cur)
        elif cur[0]:
            cur[0] += ' '
        cur[1].append((len(cur[0]), i))
        cur[0] += text
    return [(t, s) for t, s, _ in units]


def sentence_bounds(text, spans):
    """[(start, end)] of the sentences of TEXT: a sentence ends at . ! ? or ;
    followed by white space (outside code spans; not e.g., i.e.); a table row's
    cells are one sentence."""
    masked = list(text)
    for a, b, _, _ in spans:
        masked[a:b] = 'C' * (b - a)
    masked = ''.join(masked)
    bounds, start = [], 0
    for m in re.finditer(r'[.!?;](?=\s)', masked):
        if ABBREV_RE.search(masked[max(0, m.start() - 4):m.end()]):
            continue
        bounds.append((start, m.end()))
        start = m.end()
    bounds.append((start, len(text) + 1))
    return bounds


C_EXTS = ('.c', '.h', '.cu', '.cuh')


def brace_depth(lines):
    """(closes before any open, opens left unclosed) of C LINES, braces in
    comments, strings and character literals ignored: (0, 0) when the lines
    hold whole blocks."""
    text = '\n'.join(lines)
    text = re.sub(r'//[^\n]*|/\*.*?\*/|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'', ' ', text, flags=re.S)
    depth = low = 0
    for ch in text:
        if ch == '{':
            depth += 1
        elif ch == '}':
            depth -= 1
            low = min(low, depth)
    return (-low, depth - low)


def describe_depth(depth):
    closes, opens = depth
    what = []
    if closes:
        what.append('%d `}` of a block opened above them' % closes)
    if opens:
        what.append('%d `{` left open' % opens)
    return ' and '.join(what)


def whole_block_hint(lines, lo, hi, name):
    """'; lines a-b do' for the nearest range of the same length that holds
    whole blocks and NAME, within 40 lines, if any."""
    n = hi - lo
    for d in range(1, 41):
        for a in (lo + d, lo - d):
            if 1 <= a and a + n <= len(lines) and brace_depth(lines[a - 1:a + n]) == (0, 0) \
                    and name_in(name, lines[a - 1:a + n]):
                return '; lines %d-%d do' % (a, a + n)
    return ''


def name_in(name, lines):
    """Whether NAME (white space runs as one space; a trailing () dropped)
    appears in LINES, as a whole word where it begins or ends with one."""
    name = ' '.join(name.split())
    if name.endswith('()'):
        name = name[:-2]
    if not name:
        return False
    hay = ' '.join(' '.join(lines).split())
    pat = (r'\b' if re.match(r'\w', name) else '') + re.escape(name) + (r'\b' if re.search(r'\w$', name) else '')
    return re.search(pat, hay) is not None


def default_docs(repo):
    docs = sorted(f for f in repo.files
                  if (f.startswith('docs/') and f.count('/') == 1 or f.startswith('docs/notes/') and f.count('/') == 2)
                  and f.endswith('.md') and f != 'docs/TEMPLATE.md')
    if repo.is_file('README.md'):
        docs.insert(0, 'README.md')
    return docs


def main(argv):
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), '..')
    files = []
    figures = True
    i = 0
    while i < len(argv):
        a = argv[i]
        if a == '--root' and i + 1 < len(argv):
            root = argv[i + 1]
            i += 2
            continue
        if a == '--no-figures':
            figures = False
            i += 1
            continue
        if a in ('-h', '--help'):
            print(__doc__.strip())
            return 0
        if a.startswith('-'):
            print('docs-check: unknown option %s (see --help)' % a, file=sys.stderr)
            return 2
        files.append(a)
        i += 1
    repo = Repo(root)
    if not files:
        files = default_docs(repo)
    else:
        files = [os.path.relpath(os.path.abspath(f), repo.root) if os.path.isabs(f) or os.path.exists(f) else f
                 for f in files]
    t0 = time.time()
    try:
        jobs = int(os.environ.get('DOCS_CHECK_JOBS', '2'))
    except ValueError:
        print('docs-check: DOCS_CHECK_JOBS=%s is not a number' % os.environ['DOCS_CHECK_JOBS'], file=sys.stderr)
        return 2
    checker = Checker(repo, jobs, figures)
    nfail = 0
    total = {'references': 0, 'quotes': 0, 'named': 0, 'links': 0, 'figures': 0}
    try:
        if figures:
            checker.prefetch(files)
        for rel in files:
            problems, counts = checker.check(rel)
            for k in total:
                total[k] += counts[k]
            what = 'references %d (quoted %d, named %d), links %d, figures %d' % (
                counts['references'], counts['quotes'], counts['named'], counts['links'], counts['figures'])
            if problems:
                nfail += 1
                print('FAIL docs-check %s: %d problem%s (%s)' % (rel, len(problems), 's' * (len(problems) != 1), what))
                for p in problems:
                    print('  ' + p)
            else:
                print('PASS docs-check %s (%s)' % (rel, what))
            sys.stdout.flush()
    finally:
        subprocess.run(['rm', '-rf', checker.tmp])
    if checker.tolerated:
        # what the tolerance let through, the largest share of it first: how
        # close this machine's figures came to it
        print('docs-check: %d printed line%s matched within the tolerance of decimal figures, not verbatim:' % (
            len(checker.tolerated), 's' * (len(checker.tolerated) != 1)))
        for share, where, printed, quoted in sorted(checker.tolerated, reverse=True):
            print('docs-check:   %s prints "%s", the doc "%s" (%.0f%% of the tolerance)' % (
                where, printed, quoted, 100 * share))
    if checker.stubbed:
        print('docs-check: %d quoted figure%s wait for an exercise of this homework tree (the command stops at its '
              'stub): %s' % (len(checker.stubbed), 's' * (len(checker.stubbed) != 1), ' '.join(checker.stubbed)))
    print('docs-check: %d of %d docs pass; references %d (quoted %d, named %d), links %d, figures %d from %d '
          'commands (%.1f s running them, %d at a time, %.1f s in all)' % (
              len(files) - nfail, len(files), total['references'], total['quotes'], total['named'], total['links'],
              total['figures'], checker.ran, checker.run_seconds, checker.jobs, time.time() - t0))
    return 1 if nfail else 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
