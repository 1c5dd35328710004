#!/usr/bin/env python3
"""build.py: `make site`. The course as a website, build/site/, offline.

    python3 tools/site/build.py [--root DIR] [--out DIR]

Reads the checkout and writes static pages that open from the disk
(file://, no server, no network):

- every docs/**/*.md and the top-level README.md as a page (pandoc, GitHub's
  Markdown): docs/README.md, the course map, is index.html; docs/X.md is
  X.html, docs/notes/X.md notes/X.html, README.md readme.html. The lessons
  (docs/NN_*.md, then docs/capstone.md) get previous/next in that order.
- every `path:N` or `path:N-M` code reference, found as docs_check.py finds
  them (tests/docs_check.py, the same parser), becomes a link to the source
  page of that file at #LN (#LN-LM for a range). The link carries what its
  sentence says the lines hold (data-name, docs_check's rule 1b) or the lines
  a fenced block after it quotes (data-quote), so that tests/site_check.py can
  check in the browser that the page shows them at that line.
- a source page, src/PATH.html, highlighted by Pygments with one anchor a
  line, for every tracked source file of the course (.c .h .cu .cuh .sh .py
  .gp .mk, Makefiles) and any other tracked file a doc links or references;
  a folder a doc links is src/DIR/index.html, a listing.
- relative links between .md files become links between the pages, anchors
  kept; the PNGs of docs/ are copied where the docs point.
- each committed Chrome trace, docs/plots/traces/NAME.json, as
  traces/NAME.html: the trace drawn in the page (tools/site/trace.js, no
  library, the JSON inlined so that it loads from file://), with the
  committed timeline figure; the lesson of its chapter and the figure it was
  drawn into link to it.
- the look: tools/site/site.css (one column for a phone or a tablet, the
  contents beside the text on a wide screen, a dark theme where the system
  asks for one), tools/site/page.js (the arrow keys turn the lessons).
- pages.html lists every page and searches them: every section of every doc
  and every source file's name (tools/site/search.js, the index a script,
  assets/search-index.js, since a page from file:// may not fetch).

Uses python3, pandoc and python3-pygments (Debian packages). Prints one line
and exits 0, or names what failed and exits 1.
"""
import html
import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, '..', '..', 'tests'))
import docs_check as dc  # noqa: E402  the one parser of references and links

try:
    import pygments  # noqa: F401
except ImportError:
    # Debian's python3-pygments, for a python3 that is not Debian's (pyenv,
    # a virtualenv) and so does not read its dist-packages
    sys.path.append('/usr/lib/python3/dist-packages')
try:
    from pygments import highlight
    from pygments.formatters import HtmlFormatter
    from pygments.lexers import get_lexer_by_name, get_lexer_for_filename, TextLexer
    from pygments.util import ClassNotFound
except ImportError:
    highlight = None  # main() says so; tests/site_check.py imports this file for site_path alone

TITLE = 'Distributed GPT training in C'
SOURCE_EXTS = ('.c', '.h', '.cu', '.cuh', '.sh', '.py', '.gp', '.gpi', '.mk')
IMAGE_EXTS = ('.png', '.svg', '.jpg', '.jpeg', '.gif')
LEXER_ALIASES = {'.gp': 'gnuplot', '.gpi': 'gnuplot', '.cu': 'cuda', '.cuh': 'cuda', '.mk': 'make'}
SHELL_START = re.compile(r'^(make|bash|mpirun|build/|python3|sudo|apt-get|cd|git|\$ )\b')


# ---------------------------------------------------------------- where things go
def is_page_md(rel):
    return rel == 'README.md' or (rel.startswith('docs/') and rel.endswith('.md'))


def site_path(rel, repo):
    """The site's file for repository path REL (a file or a folder)."""
    if rel == 'README.md':
        return 'readme.html'
    if is_page_md(rel):
        r = rel[len('docs/'):]
        return r[:-len('README.md')] + 'index.html' if os.path.basename(r) == 'README.md' else r[:-3] + '.html'
    if repo.is_dir(rel) and not repo.is_file(rel):
        return 'src/%s/index.html' % rel.strip('/') if rel not in ('', '.') else 'src/index.html'
    if rel.endswith(IMAGE_EXTS) or rel.endswith('.json') and rel.startswith('docs/plots/traces/'):
        return rel[len('docs/'):] if rel.startswith('docs/') else 'src/' + rel
    return 'src/%s.html' % rel


def relative(target, page):
    """TARGET (a site path, maybe with #anchor) as a link from site page PAGE."""
    path, hashmark, anchor = target.partition('#')
    r = os.path.relpath(path, os.path.dirname(page) or '.')
    return urllib.parse.quote(r) + (hashmark + anchor if hashmark else '')


def lexer_for(rel, text=''):
    ext = os.path.splitext(rel)[1]
    try:
        if ext in LEXER_ALIASES:
            return get_lexer_by_name(LEXER_ALIASES[ext], stripnl=False, ensurenl=False)
        if os.path.basename(rel) == 'Makefile':
            return get_lexer_by_name('make', stripnl=False, ensurenl=False)
        return get_lexer_for_filename(rel, text, stripnl=False, ensurenl=False)
    except ClassNotFound:
        return TextLexer(stripnl=False, ensurenl=False)


def block_lexer(lang, body):
    if lang:
        try:
            return get_lexer_by_name(lang, stripnl=False)
        except ClassNotFound:
            pass
    first = next((l for l in body.split('\n') if l.strip()), '')
    if SHELL_START.match(first.strip()):
        return get_lexer_by_name('bash', stripnl=False)
    return TextLexer(stripnl=False)


# ---------------------------------------------------------------- pandoc's tree
def stringify(inlines):
    out = []
    for x in inlines:
        t, c = x['t'], x.get('c')
        if t == 'Str':
            out.append(c)
        elif t in ('Space', 'SoftBreak', 'LineBreak'):
            out.append(' ')
        elif t == 'Code':
            out.append(c[1])
        elif t in ('Emph', 'Strong', 'Strikeout', 'SmallCaps', 'Underline', 'Superscript', 'Subscript'):
            out.append(stringify(c))
        elif t in ('Link', 'Span'):
            out.append(stringify(c[1]))
        elif t == 'Quoted':
            out.append('"%s"' % stringify(c[1]))
    return ''.join(out)


def walk(node, fn):
    """Calls FN on every dict node (children first); FN returns a list to
    splice in place of the node, or None to keep it."""
    if isinstance(node, list):
        out = []
        for x in node:
            walk(x, fn)
            r = fn(x) if isinstance(x, dict) and 't' in x else None
            out.extend(r if r is not None else [x])
        node[:] = out
    elif isinstance(node, dict):
        for v in node.values():
            if isinstance(v, (list, dict)):
                walk(v, fn)


def pandoc(args, data):
    p = subprocess.run(['pandoc'] + args, input=data.encode(), capture_output=True)
    if p.returncode != 0:
        raise RuntimeError('pandoc %s: %s' % (' '.join(args), p.stderr.decode().strip()))
    return p.stdout.decode()


class Site:
    def __init__(self, root, out):
        self.repo = dc.Repo(root)
        self.checker = dc.Checker(self.repo, figures=False)
        self.root = self.repo.root
        self.out = out
        files = sorted(self.repo.files)
        self.docs = [f for f in files if is_page_md(f)]
        self.lessons = sorted(f for f in self.docs if re.match(r'docs/\d\d_[^/]*\.md$', f))
        if 'docs/capstone.md' in self.docs:
            self.lessons.append('docs/capstone.md')
        self.sources = set(f for f in files if f.endswith(SOURCE_EXTS) or os.path.basename(f) == 'Makefile')
        self.copies = set(f for f in files if f.startswith('docs/') and f.endswith(IMAGE_EXTS))
        self.folders = set()
        self.backlinks = {}  # source path -> [(page, title, line, label)]
        self.traces = self.find_traces()
        self.titles = {}
        self.problems = []

    # ---- traces: docs/plots/traces/NAME.json, the figure each was drawn into
    def find_traces(self):
        traces = {}
        readme = 'docs/plots/traces/README.md'
        rows = self.repo.lines(readme) if self.repo.is_file(readme) else []
        for f in sorted(self.repo.files):
            m = re.match(r'docs/plots/traces/([^/]+)\.json$', f)
            if not m:
                continue
            name = m.group(1)
            fig = None
            for row in rows:
                if row.startswith('| `%s`' % name):
                    o = re.search(r'OUT=(docs/plots/[^\s`"]+\.png)', row)
                    fig = o.group(1) if o and self.repo.is_file(o.group(1)) else None
            ch = re.match(r'ch(\d)_', name)
            lesson = next((l for l in self.lessons if ch and os.path.basename(l).startswith('0' + ch.group(1))), None)
            if name.startswith('capstone_') and 'docs/capstone.md' in self.lessons:
                lesson = 'docs/capstone.md'  # capstone_MESH: the capstone's lesson
            log = 'docs/plots/traces/%s.jsonl' % name
            traces[name] = {'json': f, 'figure': fig, 'lesson': lesson,
                            'log': log if self.repo.is_file(log) else None,
                            'page': 'traces/%s.html' % name}
        return traces

    def target(self, rel, url):
        """A relative link URL of doc REL as (site path with anchor, repo
        path) or None when it is absolute or names nothing of the repo."""
        url = url.strip()
        if not url or dc.SCHEME_RE.match(url) or url.startswith('//'):
            return None
        path, hashmark, anchor = url.partition('#')
        path = urllib.parse.unquote(path)
        if path == '':
            dest = rel
        elif path.startswith('/'):
            dest = os.path.normpath(path.lstrip('/'))
        else:
            dest = os.path.normpath(os.path.join(os.path.dirname(rel), path))
        if dest.startswith('..'):
            return None
        if self.repo.is_dir(dest) and not self.repo.is_file(dest):
            self.folders.add(dest)
            return site_path(dest, self.repo), dest
        if not self.repo.is_file(dest):
            return None
        if not is_page_md(dest):
            if site_path(dest, self.repo).endswith('.html'):
                self.sources.add(dest)
            else:
                self.copies.add(dest)
        return site_path(dest, self.repo) + (hashmark + anchor if hashmark else ''), dest

    # ---- one doc
    def preprocess(self, rel):
        """The doc's Markdown with each code reference wrapped in a link (raw
        HTML around the code span, which pandoc keeps) and the language of
        the source file on each fenced block that quotes one."""
        lines = list(self.repo.lines(rel))
        doc = dc.Doc(rel, lines)
        page = site_path(rel, self.repo)
        marks = {}  # line index -> [(reference text, attributes)]
        quoted = {}  # line index of a fence -> the language of the file it quotes
        for text, starts in dc.prose_units(doc):
            spans = []
            for s in dc.CODE_SPAN_RE.finditer(text):
                c = s.group(2).strip()
                spans.append((s.start(), s.end(), c, dc.REF_RE.match(c)))
            if not any(r for _, _, _, r in spans):
                continue
            bounds = dc.sentence_bounds(text, spans)
            for k, (a, b, c, r) in enumerate(spans):
                if not r:
                    continue
                i = starts[max(j for j, (off, _) in enumerate(starts) if off <= a)][1]
                if self.checker.check_ref(r):
                    continue  # no such file or lines: docs-check says so; no link
                path, lo = r.group(1), int(r.group(2))
                hi = int(r.group(3)) if r.group(3) else lo
                attrs = {'class': 'ref', 'data-ref': r.group(0)}
                j = doc.next_nonblank(i + 1)
                if j in doc.fences and self.checker.compare_quote(r, doc.fences[j][0], doc.fences[j][1], rel) is None:
                    attrs['data-quote'] = '\n'.join(l.rstrip() for l in doc.fences[j][0])
                    quoted[j] = os.path.splitext(path)[1] or path
                else:
                    named = self.checker.name_of(text, spans, bounds, k)
                    if named:
                        attrs['data-name'] = named[0]
                self.sources.add(path)
                attrs['href'] = relative(site_path(path, self.repo) + '#L%d' % lo + ('-L%d' % hi if hi > lo else ''),
                                         page)
                marks.setdefault(i, []).append((r.group(0), attrs))
                self.backlinks.setdefault(path, []).append((rel, lo, hi))
        for i, refs in marks.items():
            line = lines[i]
            out, pos = [], 0
            for s in dc.CODE_SPAN_RE.finditer(line):
                c = s.group(2).strip()
                if refs and c == refs[0][0]:
                    attrs = refs.pop(0)[1]
                    a = ' '.join('%s="%s"' % (k, html.escape(v).replace('\n', '&#10;')) for k, v in attrs.items())
                    out.append(line[pos:s.start()] + '<a %s>' % a + s.group(0) + '</a>')
                    pos = s.end()
            out.append(line[pos:])
            lines[i] = ''.join(out)
        for j, ext in quoted.items():
            m = dc.FENCE_RE.match(lines[j])
            if m and not m.group(3).strip():
                lang = {'.c': 'c', '.h': 'c', '.cu': 'cuda', '.cuh': 'cuda', '.sh': 'bash', '.py': 'python',
                        '.gp': 'gnuplot', '.mk': 'make', 'Makefile': 'make'}.get(ext, '')
                lines[j] = m.group(1) + m.group(2) + lang
        return '\n'.join(lines) + '\n'

    def render_doc(self, rel):
        page = site_path(rel, self.repo)
        tree = json.loads(pandoc(['-f', 'gfm', '-t', 'json'], self.preprocess(rel)))
        toc = []
        trace_figs = {t['figure']: name for name, t in self.traces.items() if t['figure']}

        def fix(x):
            t = x['t']
            if t == 'Link':
                got = self.target(rel, x['c'][2][0])
                if got:
                    x['c'][2][0] = relative(got[0], page)
            elif t == 'Image':
                got = self.target(rel, x['c'][2][0])
                if got:
                    x['c'][2][0] = relative(got[0], page)
                    # a tap opens the figure alone, at its own size (a tablet zooms it there)
                    x = {'t': 'Link', 'c': [['', ['figure'], []], [x], [x['c'][2][0], '']]}
                    if got[1] in trace_figs:
                        tr = self.traces[trace_figs[got[1]]]
                        link = {'t': 'Link', 'c': [['', ['trace-link'], []],
                                                   [{'t': 'Str', 'c': 'Open this trace, zoomable'}],
                                                   [relative(tr['page'], page), '']]}
                        return [x, {'t': 'LineBreak'}, link]
                    return [x]
            elif t == 'CodeBlock':
                (ident, classes, kv), body = x['c']
                lexer = block_lexer(classes[0] if classes else '', body)
                code = highlight(body, lexer, HtmlFormatter(nowrap=True))
                return [{'t': 'RawBlock', 'c': ['html', '<pre class="code"><code>%s</code></pre>' % code.rstrip('\n')]}]
            elif t == 'Header' and x['c'][0] in (2, 3):
                toc.append((x['c'][0], x['c'][1][0], stringify(x['c'][2])))
            return None

        walk(tree['blocks'], fix)
        sections = self.sections(tree['blocks'])
        body = pandoc(['-f', 'json', '-t', 'html5', '--no-highlight'], json.dumps(tree))
        # tables scroll sideways in their box; one of 5 columns or more keeps
        # the width its prose needs (a phone scrolls it rather than cut words)
        def table(m):
            head = re.search(r'<tr[^>]*>(.*?)</tr>', m.group(0), re.S)
            cols = len(re.findall(r'<th[\s>]', head.group(1))) if head else 0
            return '<div class="table-wrap"><table%s>%s</table></div>' % (
                ' class="wide"' if cols >= 5 else '', m.group(1))
        body = re.sub(r'<table>(.*?)</table>', table, body, flags=re.S)
        title = next((stringify(b['c'][2]) for b in tree['blocks'] if b['t'] == 'Header' and b['c'][0] == 1),
                     os.path.basename(rel))
        return page, title, body, toc, sections

    def sections(self, blocks):
        """[(anchor, heading, plain text)] of the doc's sections, for the search."""
        out = [['', '', []]]

        def text(node, acc):
            if isinstance(node, dict):
                t, c = node.get('t'), node.get('c')
                if t == 'Str':
                    acc.append(c)
                elif t in ('Space', 'SoftBreak', 'LineBreak'):
                    acc.append(' ')
                elif t == 'Code':
                    acc.append(c[1])
                elif t == 'RawBlock' or t == 'RawInline':
                    # tags out first, then entities (an &lt; in code is text);
                    # a comment (a docs-check command) is not on the page
                    raw = '' if t == 'RawInline' or c[1].lstrip().startswith('<!--') else c[1]
                    acc.append(html.unescape(re.sub(r'<[^>]+>', '', raw)))
                elif isinstance(c, (list, dict)):
                    text(c, acc)
                if t in ('Para', 'Plain', 'RawBlock', 'Header'):
                    acc.append('\n')
            elif isinstance(node, list):
                for x in node:
                    text(x, acc)
        for b in blocks:
            if b['t'] == 'Header' and b['c'][0] <= 3:
                out.append([b['c'][1][0], stringify(b['c'][2]), []])
            else:
                text(b, out[-1][2])
        return [(a, h, ' '.join(''.join(acc).split())) for a, h, acc in out if h or acc]

    # ---- the page shell
    def shell(self, page, title, body, nav='', toc=None, cls='doc', head='', bottom=''):
        up = relative('index.html', page)
        toc_html = ''
        if toc and len(toc) > 2:
            items = ''.join('<li class="l%d"><a href="#%s">%s</a></li>' % (lvl, html.escape(i), html.escape(t))
                            for lvl, i, t in toc)
            toc_html = '<details class="toc"><summary>On this page</summary><ul>%s</ul></details>' % items
        # the navigation and the contents go under the page's title
        at = body.find('</h1>')
        at = at + len('</h1>') if at >= 0 else 0
        body = body[:at] + nav + toc_html + body[at:]
        return ('<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
                '<meta name="viewport" content="width=device-width, initial-scale=1">'
                '<title>%s</title>'
                '<link rel="stylesheet" href="%s"><link rel="stylesheet" href="%s">%s</head>\n'
                '<body class="%s"><header class="top"><a class="home" href="%s">%s</a>'
                '<a class="all" href="%s">All pages · search</a></header>\n'
                '<main>%s\n%s</main>\n'
                '<footer><a href="%s">Course map</a> · <a href="%s">All pages</a> · built from the checkout by '
                '<code>make site</code></footer></body></html>\n') % (
            html.escape(title + ('' if title == TITLE else ' · ' + TITLE)),
            relative('assets/site.css', page), relative('assets/pygments.css', page), head,
            cls, up, TITLE, relative('pages.html', page), body, bottom, up, relative('pages.html', page))

    def lesson_nav(self, rel, page, bottom=False):
        """Previous and next through the lessons in course order, with the
        page's notes, lesson and trace: compact at the top (the chapter's
        number), the full titles at the bottom."""
        def label(r):
            full = self.short(r)
            text = full if bottom else full.split(':')[0]
            return html.escape(text), html.escape(full)
        parts = []
        if rel in self.lessons:
            k = self.lessons.index(rel)
            prev = self.lessons[k - 1] if k else 'docs/README.md'
            nxt = self.lessons[k + 1] if k + 1 < len(self.lessons) else None
            text, full = label(prev)
            parts.append('<a class="prev" rel="prev" href="%s" title="%s">← %s</a>' % (
                relative(site_path(prev, self.repo), page), full, text))
            if nxt:
                text, full = label(nxt)
                parts.append('<a class="next" rel="next" href="%s" title="%s">%s →</a>' % (
                    relative(site_path(nxt, self.repo), page), full, text))
        elif rel == 'docs/README.md' and self.lessons:
            parts.append('<a class="next" rel="next" href="%s">Start: %s →</a>' % (
                relative(site_path(self.lessons[0], self.repo), page), html.escape(self.short(self.lessons[0]))))
        extra = []
        if rel.startswith('docs/notes/'):
            lesson = 'docs/' + os.path.basename(rel)
            if lesson in self.docs:
                extra.append('<a href="%s">the lesson: %s</a>' % (relative(site_path(lesson, self.repo), page),
                                                                   html.escape(self.short(lesson))))
        elif rel in self.docs:
            note = 'docs/notes/' + os.path.basename(rel)
            if note in self.docs and rel != 'docs/README.md':
                extra.append('<a href="%s">its notes</a>' % relative(site_path(note, self.repo), page))
        for name, t in sorted(self.traces.items()):
            if t['lesson'] == rel:
                extra.append('<a href="%s">its trace, %s</a>' % (relative(t['page'], page), html.escape(name)))
        if not parts and not extra:
            return ''
        if bottom:
            return '<nav class="nav bottom">%s</nav>' % ''.join(parts) if parts else ''
        return '<nav class="nav top">%s%s</nav>' % (''.join(parts), (
            '<span class="extra">%s</span>' % ' · '.join(extra)) if extra else '')

    def short(self, rel):
        return self.titles.get(rel, os.path.basename(rel))

    # ---- source pages
    def render_source(self, rel):
        page = site_path(rel, self.repo)
        with open(os.path.join(self.root, rel), encoding='utf-8', errors='replace') as f:
            text = f.read()
        if text.endswith('\n'):
            text = text[:-1]
        code = highlight(text + '\n', lexer_for(rel, text), HtmlFormatter(nowrap=True))
        code = (code[:-1] if code.endswith('\n') else code).split('\n')  # one newline: a file's blank last lines stay
        n = len(self.repo.lines(rel))
        if len(code) != n:  # a lexer that changed the line count: plain text keeps the anchors true
            code = [html.escape(l) for l in self.repo.lines(rel)]
        # block elements, one a line, with no newline between them (a copy
        # from the page still gets one a line; a newline would show as a gap)
        rows = ''.join('<span class="line" id="L%d"><a class="ln" href="#L%d" data-n="%d"></a>%s</span>'
                         % (k + 1, k + 1, k + 1, c) for k, c in enumerate(code))
        crumbs = ['<a href="%s">src</a>' % relative('src/index.html', page)]
        parts = rel.split('/')
        for k in range(1, len(parts)):
            d = '/'.join(parts[:k])
            self.folders.add(d)
            crumbs.append('<a href="%s">%s</a>' % (relative(site_path(d, self.repo), page), html.escape(parts[k - 1])))
        crumbs.append(html.escape(parts[-1]))
        back = ''
        refs = self.backlinks.get(rel, [])
        if refs:
            # the docs render on two threads, so refs arrive in either order: sort them
            order = {d: k for k, d in enumerate(self.docs)}
            seen = sorted(set(refs), key=lambda r: (order.get(r[0], len(order)), r[0], r[1], r[2]))
            items = ', '.join('<a href="%s">%s</a> (<a href="#L%d%s">%s</a>)' % (
                relative(site_path(d, self.repo), page), html.escape(self.short(d)), lo,
                '-L%d' % hi if hi > lo else '', '%d-%d' % (lo, hi) if hi > lo else lo) for d, lo, hi in seen[:40])
            back = '<details class="backlinks"><summary>Referenced by %d lesson line%s</summary><p>%s</p></details>' % (
                len(seen), 's' * (len(seen) != 1), items)
        body = ('<h1 class="path">%s</h1><p class="meta">%d lines · <code>%s</code></p>%s'
                '<pre class="code source"><code>%s</code></pre>') % (
            ' / '.join(crumbs), n, html.escape(rel), back, rows)
        head = '<script src="%s" defer></script>' % relative('assets/source.js', page)
        return page, self.shell(page, rel, body, cls='source', head=head)

    def render_folder(self, d):
        page = site_path(d, self.repo)
        prefix = '' if d in ('', '.') else d.rstrip('/') + '/'
        entries = set()
        for f in self.repo.files:
            if f.startswith(prefix):
                entries.add(f[len(prefix):].split('/')[0] + ('/' if '/' in f[len(prefix):] else ''))
        items = []
        for e in sorted(entries, key=lambda e: (not e.endswith('/'), e)):
            rel = prefix + e.rstrip('/')
            if e.endswith('/'):
                self.folders.add(rel)
                items.append('<li class="dir"><a href="%s">%s</a></li>' % (relative(site_path(rel, self.repo), page), e))
            elif is_page_md(rel):
                items.append('<li><a href="%s">%s</a></li>' % (relative(site_path(rel, self.repo), page), e))
            elif rel in self.sources:
                items.append('<li><a href="%s">%s</a></li>' % (relative(site_path(rel, self.repo), page), e))
            else:
                items.append('<li class="plain">%s</li>' % html.escape(e))
        up = ''
        if prefix:
            parent = os.path.dirname(d.rstrip('/'))
            up = '<p><a href="%s">↑ %s</a></p>' % (relative(site_path(parent or '.', self.repo), page), parent or 'src')
        body = '<h1 class="path">%s</h1>%s<ul class="listing">%s</ul>' % (
            html.escape(prefix or 'The repository'), up, ''.join(items))
        return page, self.shell(page, prefix or 'src', body, cls='listing')

    # ---- traces
    def render_trace(self, name, t):
        page = t['page']
        with open(os.path.join(self.root, t['json']), encoding='utf-8') as f:
            data = f.read()
        json.loads(data)  # a trace that does not parse fails the build here, not in a student's browser
        data = data.replace('</', '<\\/')
        parts = ['<h1>Trace %s</h1>' % html.escape(name)]
        about = []
        if t['lesson']:
            about.append('from the run of <a href="%s">%s</a>' % (relative(site_path(t['lesson'], self.repo), page),
                                                                  html.escape(self.short(t['lesson']))))
        about.append('how it was made: <a href="%s">the traces\' README</a>' % relative(
            site_path('docs/plots/traces/README.md', self.repo), page))
        about.append('what the rows and colours mean: <a href="%s">%s</a>' % (
            relative(site_path('docs/tracing.md', self.repo), page), html.escape(self.short('docs/tracing.md')))
            if 'docs/tracing.md' in self.docs else '')
        parts.append('<p>%s.</p>' % '; '.join(a for a in about if a))
        parts.append('<p class="help">Drag or swipe sideways to pan, Ctrl and the wheel or + and − to zoom, pick a step, '
                     'tap a span for its name and length. The same file opens in <code>chrome://tracing</code> or '
                     'Perfetto: '
                     '<a href="%s" download>%s.json</a>.</p>' % (relative(site_path(t['json'], self.repo), page), name))
        parts.append('<div class="trace" id="trace"><div class="trace-bar"><button data-z="in">+</button>'
                     '<button data-z="out">−</button><button data-z="all">all</button>'
                     '<select id="trace-step" aria-label="step"></select></div>'
                     '<canvas id="trace-canvas" role="img" aria-label="the trace as a timeline: one row per rank and '
                     'thread"></canvas>'
                     '<div id="trace-info" class="trace-info">Tap a span.</div><div id="trace-legend"></div></div>')
        if t['figure']:
            parts.append('<h2 id="figure">The committed figure</h2><p><img src="%s" alt="timeline of %s"></p>' % (
                relative(site_path(t['figure'], self.repo), page), html.escape(name)))
        parts.append('<script type="application/json" id="trace-data">%s</script>' % data)
        parts.append('<script src="%s"></script>' % relative('assets/trace.js', page))
        self.copies.add(t['json'])
        return page, self.shell(page, 'Trace ' + name, '\n'.join(parts), cls='trace-page')

    # ---- everything
    def build(self):
        # into OUT.partial, then renamed over OUT: a build that fails leaves
        # the last site whole, never half of a new one
        t0, final = time.time(), self.out
        self.out = final + '.partial'
        if os.path.isdir(self.out):
            shutil.rmtree(self.out)
        os.makedirs(self.out)
        for d in self.docs:  # titles first: the navigation names the pages by them
            for line in self.repo.lines(d):
                h = dc.HEADING_RE.match(line)
                if h and len(h.group(1)) == 1:
                    self.titles[d] = re.sub(r'[`*]', '', h.group(2))
                    break
        with ThreadPoolExecutor(2) as pool:
            rendered = list(pool.map(self.render_doc, self.docs))
        written = 0
        index = []  # the search's: (page, anchor, doc title, section title, text)
        for rel, (page, title, body, toc, sections) in zip(self.docs, rendered):
            index.extend([page, a, title, h, t] for a, h, t in sections)
            nav = self.lesson_nav(rel, page)
            bottom = self.lesson_nav(rel, page, bottom=True)
            src = '<p class="edit">This page is <code>%s</code> of the repository.</p>' % html.escape(rel)
            head = '<script src="%s" defer></script>' % relative('assets/page.js', page)
            self.write(page, self.shell(page, title, body + src, nav=nav, toc=toc, bottom=bottom, head=head,
                                        cls='doc lesson' if rel in self.lessons else 'doc'))
            written += 1
        for name, t in sorted(self.traces.items()):
            self.write(*self.render_trace(name, t))
            written += 1
        for rel in sorted(self.sources):
            self.write(*self.render_source(rel))
            written += 1
        done = set()
        self.folders.add('.')
        while self.folders - done:
            d = sorted(self.folders - done)[0]
            done.add(d)
            self.write(*self.render_folder(d))
            written += 1
        for rel in sorted(self.copies):
            dest = os.path.join(self.out, site_path(rel, self.repo))
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            shutil.copyfile(os.path.join(self.root, rel), dest)
        self.write('pages.html', self.index_page())
        written += 1
        assets = os.path.join(self.out, 'assets')
        os.makedirs(assets, exist_ok=True)
        index.extend(['src/%s.html' % f, '', 'source', f, ''] for f in sorted(self.sources))
        with open(os.path.join(assets, 'search-index.js'), 'w', encoding='utf-8') as f:
            # a script, not JSON to fetch: the site opens from file://, where fetch is refused
            f.write('window.SITE_INDEX = %s;\n' % json.dumps(index, separators=(',', ':')))
        for a in ('site.css', 'page.js', 'source.js', 'trace.js', 'search.js'):
            shutil.copyfile(os.path.join(HERE, a), os.path.join(assets, a))
        with open(os.path.join(assets, 'pygments.css'), 'w') as f:
            # light, and dark where the reader's system asks for it (site.css's colours follow)
            f.write(HtmlFormatter(style='default').get_style_defs('.code'))
            dark = HtmlFormatter(style='monokai').get_style_defs('.code')
            dark = '\n'.join(l for l in dark.split('\n') if not re.match(r'\s*(pre|\.code)\s*\{|\s*\.code \.hll|'
                                                                          r'\s*td\.|\s*span\.|\s*\.code\s+\{', l))
            f.write('\n@media (prefers-color-scheme: dark) {\n%s\n}\n' % dark)
        with open(os.path.join(self.out, SITE_MARK), 'w') as f:
            f.write('a site tools/site/build.py wrote: --out may replace this folder\n')
        if os.path.isdir(final):
            shutil.rmtree(final)
        os.rename(self.out, final)
        self.out = final
        print('site: %d pages (%d docs, %d source files, %d traces), %d files copied, in %s/ (%.1f s)' % (
            written, len(self.docs), len(self.sources), len(self.traces), len(self.copies),
            os.path.relpath(self.out, os.getcwd()) if not os.path.relpath(self.out, os.getcwd()).startswith('..')
            else self.out, time.time() - t0))

    def index_page(self):
        page = 'pages.html'

        def li(rel):
            return '<li><a href="%s">%s</a> <code>%s</code></li>' % (
                relative(site_path(rel, self.repo), page), html.escape(self.short(rel)), html.escape(rel))
        lessons = ''.join(li(r) for r in self.lessons)
        topics = ''.join(li(r) for r in self.docs if r not in self.lessons and not r.startswith('docs/notes/'))
        notes = ''.join(li(r) for r in self.docs if r.startswith('docs/notes/'))
        traces = ''.join('<li><a href="%s">%s</a></li>' % (relative(t['page'], page), html.escape(n))
                         for n, t in sorted(self.traces.items()))
        src = '<p><a href="%s">Browse the source</a> (%d files).</p>' % (relative('src/index.html', page),
                                                                         len(self.sources))
        body = ('<h1>All pages</h1><form class="search" role="search" onsubmit="return false">'
                '<input id="q" type="search" placeholder="Search the lessons, notes and file names" '
                'aria-label="search" autocomplete="off"></form><ol id="hits" class="hits"></ol>'
                '<script src="assets/search-index.js"></script><script src="assets/search.js"></script>'
                '<h2 id="lessons">Lessons, in course order</h2><ol>%s</ol>'
                '<h2 id="topics">Topics</h2><ul>%s</ul><h2 id="notes">Notes and run records</h2><ul>%s</ul>'
                '<h2 id="traces">Traces</h2><ul>%s</ul><h2 id="source">Source</h2>%s') % (
            lessons, topics, notes, traces, src)
        return self.shell(page, 'All pages', body)

    def write(self, page, text):
        dest = os.path.join(self.out, page)
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        with open(dest, 'w', encoding='utf-8') as f:
            f.write(text)


SITE_MARK = '.course-site'  # in every site this script wrote: the one folder outside build/ it replaces


def out_problem(root, out):
    """Why OUT must not be (re)written, or None: never a file, never the
    checkout or a folder of it but build/, never a folder outside build/
    that is not a site this script wrote (its old content is removed)."""
    root, real = os.path.realpath(root), os.path.realpath(out)
    build = os.path.join(root, 'build')
    if os.path.exists(out) and not os.path.isdir(out):
        return '--out %s is a file, not a folder' % out
    if real == root or root.startswith(real + os.sep) or (
            real.startswith(root + os.sep) and real != build and not real.startswith(build + os.sep)):
        return '--out %s lies in the checkout outside build/ (its content would be replaced): give a path under build/ or outside it' % out
    if (os.path.isdir(out) and os.listdir(out) and not real.startswith(build + os.sep)
            and not os.path.exists(os.path.join(out, SITE_MARK))):
        return '--out %s holds files that are not a site this script wrote: remove them or give another --out' % out
    return None


def main(argv):
    root = os.path.normpath(os.path.join(HERE, '..', '..'))
    out = None
    i = 0
    while i < len(argv):
        if argv[i] in ('--root', '--out') and i + 1 < len(argv):
            if argv[i] == '--root':
                root = argv[i + 1]
            else:
                out = argv[i + 1]
            i += 2
        elif argv[i] in ('-h', '--help'):
            print(__doc__.strip())
            return 0
        else:
            print('site: unknown argument %s (see --help)' % argv[i], file=sys.stderr)
            return 2
    if not os.path.isfile(os.path.join(root, 'docs', 'README.md')):
        print('site: --root %s is not the course\'s checkout (no docs/README.md)' % root, file=sys.stderr)
        return 1
    out = os.path.abspath(out or os.path.join(root, 'build', 'site'))
    bad = out_problem(root, out)
    if bad:
        print('site: %s' % bad, file=sys.stderr)
        return 1
    for what, missing in (('pandoc', shutil.which('pandoc') is None), ('python3-pygments', highlight is None)):
        if missing:
            print('site: %s is missing: bash .ci/install-deps.sh site installs it' % what, file=sys.stderr)
            return 1
    site = Site(root, out)
    try:
        site.build()
    except (RuntimeError, OSError, ValueError) as e:  # ValueError: a trace that is not JSON, among others
        print('site: %s: %s (the last site, if any, is left as it was)' % (type(e).__name__, e), file=sys.stderr)
        shutil.rmtree(out + '.partial', ignore_errors=True)
        return 1
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
