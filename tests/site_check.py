#!/usr/bin/env python3
"""site_check.py: `make site-check`. The course site in a real browser.

    python3 tests/site_check.py [--site DIR] [--shots DIR] [PAGE.html ...]
    python3 tests/site_check.py --self-test

Opens every page of the site `make site` built (build/site/, or the pages
named) in headless Chromium over the DevTools protocol (Debian's chromium
and python3-websocket) and fails on:

- a page that does not load;
- a broken internal link: a file:// link to no file of the site, out of it,
  or to a folder; an #anchor that is no id of its page (on a source page
  #LN and #LN-LM name lines that must exist);
- a missing image (not loaded, or no pixels), stylesheet or script;
- any JavaScript error: an uncaught exception, console.error, or an error
  the browser logs (a resource that failed to load);
- a code reference of a doc (`path:N`, as docs_check.py finds them) that
  is no link on its page;
- a code reference link (`path:N` of a lesson, class "ref") that does not
  open the source page of PATH at line N, or whose lines there do not hold
  what the lesson names: the name docs_check.py finds for it (data-name,
  checked with docs_check's name_in on the lines as the page shows them) or
  the lines of the fenced block that quotes it (data-quote, equal).

External (http, https) links are not followed: the check runs offline. A
source page's line numbers, each a link to its own line, are not counted.
Saves screenshots of the home page and of one lesson (desktop and a
tablet's width) in build/site-check/. Prints one FAIL line per problem,
then one summary line; exits 1 if anything failed.

--self-test copies the site to a temporary folder, breaks a lesson page in
each of the ways above and checks that every fault is reported; exits 1 if
one was missed.
"""
import base64
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import docs_check as dc  # noqa: E402  the one rule of what a reference names
sys.path.insert(0, os.path.join(HERE, '..', 'tools', 'site'))

ROOT = os.path.normpath(os.path.join(HERE, '..'))
PAGE_TIMEOUT = 60  # s a page may take to load; a hang, not a slow machine
LESSON = '02_data_parallel.html'

COLLECT = r'''(() => {
  const ids = Array.from(document.querySelectorAll('[id]')).map(e => e.id)
    .concat(Array.from(document.querySelectorAll('a[name]')).map(e => e.name));
  // a source page's line numbers link their own line (#LN, the id beside
  // them): thousands of links that hold by construction, left out
  const links = Array.from(document.querySelectorAll('a[href]:not(.ln)')).map(a => ({
    href: a.href, raw: a.getAttribute('href'), ref: a.getAttribute('data-ref'),
    name: a.getAttribute('data-name'), quote: a.getAttribute('data-quote'),
    text: a.textContent.trim().slice(0, 60)}));
  const imgs = Array.from(document.images).map(i => ({src: i.getAttribute('src'), url: i.src,
    ok: i.complete && i.naturalWidth > 0}));
  const lines = {};
  document.querySelectorAll('pre.source .line').forEach(l => {
    const c = l.cloneNode(true); const n = c.querySelector('a.ln'); if (n) n.remove();
    lines[l.id.slice(1)] = c.textContent; });
  return JSON.stringify({title: document.title, ids: ids, links: links, imgs: imgs, lines: lines,
    body: document.body ? document.body.innerText.length : 0});
})()'''


class Browser:
    """Headless Chromium and one tab, spoken to over the DevTools protocol."""

    def __init__(self):
        try:
            import websocket  # python3-websocket
        except ImportError:
            # Debian's package, for a python3 that is not Debian's (pyenv, a
            # virtualenv) and so does not read its dist-packages
            sys.path.append('/usr/lib/python3/dist-packages')
            import websocket
        exe = next((shutil.which(c) for c in ('chromium', 'chromium-browser', 'google-chrome') if shutil.which(c)),
                   None)
        if exe is None:
            raise RuntimeError('no chromium: make setup installs it (Debian package chromium)')
        self.profile = tempfile.mkdtemp(prefix='site-check-chromium.')
        self.log = open(os.path.join(self.profile, 'stderr.log'), 'w')
        args = [exe, '--headless=new', '--disable-gpu', '--disable-dev-shm-usage', '--no-first-run',
                '--no-default-browser-check', '--disable-extensions', '--disable-background-networking',
                '--disable-sync', '--mute-audio', '--hide-scrollbars', '--remote-debugging-port=0',
                '--remote-allow-origins=*', '--user-data-dir=' + self.profile, 'about:blank']
        if os.geteuid() == 0:
            args.insert(1, '--no-sandbox')  # root (CI, containers): Chromium refuses its sandbox
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=self.log, stdin=subprocess.DEVNULL)
        port_file = os.path.join(self.profile, 'DevToolsActivePort')
        t0 = time.time()
        while not (os.path.exists(port_file) and open(port_file).read().count('\n') >= 1):
            if self.proc.poll() is not None or time.time() - t0 > 60:
                self.close()
                raise RuntimeError('chromium did not start (exit %s); its log: %s' % (
                    self.proc.returncode, open(self.log.name).read()[-600:]))
            time.sleep(0.1)
        port = open(port_file).read().split('\n')[0].strip()
        pages = []
        while not pages and time.time() - t0 < 60:
            with urllib.request.urlopen('http://127.0.0.1:%s/json/list' % port, timeout=10) as r:
                pages = [p for p in json.load(r) if p.get('type') == 'page']
            time.sleep(0.1) if not pages else None
        self.ws = websocket.create_connection(pages[0]['webSocketDebuggerUrl'], timeout=PAGE_TIMEOUT,
                                              suppress_origin=True, enable_multithread=False)
        self.next_id = 0
        self.events = []
        for domain in ('Page', 'Runtime', 'Log', 'Network'):
            self.call(domain + '.enable')

    def call(self, method, params=None, timeout=PAGE_TIMEOUT):
        self.next_id += 1
        mid = self.next_id
        self.ws.send(json.dumps({'id': mid, 'method': method, 'params': params or {}}))
        deadline = time.time() + timeout
        while True:
            self.ws.settimeout(max(0.1, deadline - time.time()))
            msg = json.loads(self.ws.recv())
            if msg.get('id') == mid:
                if 'error' in msg:
                    raise RuntimeError('%s: %s' % (method, msg['error'].get('message')))
                return msg.get('result', {})
            if 'method' in msg:
                self.events.append(msg)

    def wait_event(self, name, timeout=PAGE_TIMEOUT):
        """Reads events until NAME came (True) or TIMEOUT passed (False)."""
        if any(e['method'] == name for e in self.events):
            return True
        deadline = time.time() + timeout
        while time.time() < deadline:
            self.ws.settimeout(max(0.1, deadline - time.time()))
            try:
                msg = json.loads(self.ws.recv())
            except Exception:  # websocket's time-out
                return False
            if 'method' in msg:
                self.events.append(msg)
                if msg['method'] == name:
                    return True
        return False

    def open(self, url):
        """Loads URL; returns (error text or None, [the errors the browser
        reported about it, one line each])."""
        self.events = []
        res = self.call('Page.navigate', {'url': url})
        if res.get('errorText'):
            return res['errorText'], []
        loaded = self.wait_event('Page.loadEventFired')
        # a script's late errors (a timer, a deferred handler) get a moment
        self.call('Runtime.evaluate', {'expression': 'new Promise(r => setTimeout(r, 30))', 'awaitPromise': True})
        return (None if loaded else 'did not finish loading in %d s' % PAGE_TIMEOUT), self.errors()

    def errors(self):
        """The errors among the events read since the last call."""
        seen, self.events = self.events, []
        urls = {e['params']['requestId']: e['params']['request']['url'] for e in seen
                if e['method'] == 'Network.requestWillBeSent'}
        out = []
        for e in seen:
            out.extend(describe(e, urls))
        return out

    def evaluate(self, expr):
        r = self.call('Runtime.evaluate', {'expression': expr, 'returnByValue': True})
        if 'exceptionDetails' in r:
            raise RuntimeError('the collector failed: %s' % r['exceptionDetails'].get('text'))
        return r['result'].get('value')

    def screenshot(self, url, path, width, height, mobile=False):
        self.call('Emulation.setDeviceMetricsOverride', {'width': width, 'height': height, 'deviceScaleFactor': 1,
                                                         'mobile': mobile})
        self.open(url)
        data = self.call('Page.captureScreenshot', {'format': 'png'})['data']
        with open(path, 'wb') as f:
            f.write(base64.b64decode(data))
        self.call('Emulation.clearDeviceMetricsOverride')

    def close(self):
        try:
            if getattr(self, 'ws', None):
                self.ws.close()
        except Exception:
            pass
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        shutil.rmtree(self.profile, ignore_errors=True)


# the errors the browser reports about a page, as one line each
def describe(e, urls):
    m, p = e['method'], e.get('params', {})
    if m == 'Runtime.exceptionThrown':
        d = p.get('exceptionDetails', {})
        text = (d.get('exception') or {}).get('description') or d.get('text', '')
        return ['JavaScript exception: %s (%s:%s)' % (text.split('\n')[0], short_url(d.get('url', '')),
                                                      d.get('lineNumber', '?'))]
    if m == 'Runtime.consoleAPICalled' and p.get('type') in ('error', 'assert'):
        args = ' '.join(str(a.get('value', a.get('description', ''))) for a in p.get('args', []))
        return ['console.%s: %s' % (p['type'], args)]
    if m == 'Log.entryAdded' and p.get('entry', {}).get('level') == 'error':
        en = p['entry']
        return ['browser error (%s): %s%s' % (en.get('source'), en.get('text'),
                                              ' ' + short_url(en['url']) if en.get('url') else '')]
    if m == 'Network.loadingFailed' and not p.get('canceled'):
        return ['a resource failed to load: %s (%s)' % (short_url(urls.get(p.get('requestId'), '?')),
                                                         p.get('errorText'))]
    return []


SITE = None


def short_url(url):
    if SITE and url.startswith('file://'):
        path = urllib.parse.unquote(urllib.parse.urlparse(url).path)
        if path.startswith(SITE + os.sep):
            return os.path.relpath(path, SITE)
    return url


class Check:
    def __init__(self, site, browser):
        self.site = os.path.abspath(site)
        self.b = browser
        self.pages = {}  # relative path -> what the collector found, or None if it did not load
        self.problems = []  # (page, kind, what)
        self.counts = {'pages': 0, 'links': 0, 'anchors': 0, 'images': 0, 'refs': 0, 'named': 0, 'quoted': 0}
        # the docs whose pages these are (the site of this checkout), for check_all_linked
        import build  # tools/site/build.py: where a doc's page goes, said once
        self.repo = dc.Repo(ROOT)
        self.checker = dc.Checker(self.repo, figures=False)
        self.docs = {build.site_path(f, self.repo): f for f in self.repo.files if build.is_page_md(f)}

    def problem(self, page, kind, what):
        self.problems.append((page, kind, what))

    def url(self, rel):
        return 'file://' + urllib.parse.quote(os.path.join(self.site, rel))

    def visit(self, rel):
        if rel in self.pages:
            return self.pages[rel]
        err, errors = self.b.open(self.url(rel))
        self.counts['pages'] += 1
        if err:
            self.pages[rel] = None
            self.problem(rel, 'load', 'the page does not load: %s' % err)
            return None
        found = json.loads(self.b.evaluate(COLLECT))
        errors += self.b.errors()  # while collecting too (none expected)
        for e in errors:
            self.problem(rel, 'js', e)
        if found['body'] == 0:
            self.problem(rel, 'load', 'the page shows no text')
        self.pages[rel] = found
        return found

    def local(self, href):
        """A file:// URL as (path relative to the site or None when outside
        it, fragment); None for a URL the check does not follow."""
        u = urllib.parse.urlparse(href)
        if u.scheme != 'file':
            return None
        path = os.path.normpath(urllib.parse.unquote(u.path))
        frag = urllib.parse.unquote(u.fragment)
        if path != self.site and not path.startswith(self.site + os.sep):
            return '', frag, path
        return os.path.relpath(path, self.site), frag, path

    def check_page(self, rel):
        found = self.visit(rel)
        if found is None:
            return
        self.check_all_linked(rel, found)
        for img in found['imgs']:
            self.counts['images'] += 1
            if not img['ok']:
                self.problem(rel, 'image', 'image %s does not load' % img['src'])
        for a in found['links']:
            loc = self.local(a['href'])
            if loc is None:
                continue  # http(s), mailto: not followed offline
            self.counts['links'] += 1
            target, frag, path = loc
            what = 'link %s ("%s")' % (a['raw'], a['text'])
            if target == '':
                self.problem(rel, 'link', '%s leads out of the site, to %s' % (what, path))
                continue
            if not os.path.exists(path):
                self.problem(rel, 'link', '%s: no file %s in the site' % (what, target))
                continue
            if os.path.isdir(path):
                self.problem(rel, 'link', '%s: a folder, not a page' % what)
                continue
            lines = None
            if frag and target.endswith('.html'):
                self.counts['anchors'] += 1
                t = self.visit(target)
                if t is None:
                    continue  # its own load problem is reported
                m = dc.LINE_ANCHOR_RE.match(frag)
                if m and t['lines']:
                    lo, hi = int(m.group(1)), int(m.group(2) or m.group(1))
                    if str(lo) not in t['lines'] or str(hi) not in t['lines'] or hi < lo:
                        self.problem(rel, 'anchor', '%s: %s has %d lines' % (what, target, len(t['lines'])))
                        continue
                    lines = [t['lines'][str(n)] for n in range(lo, hi + 1)]
                elif frag not in t['ids']:
                    self.problem(rel, 'anchor', '%s: %s has no id #%s' % (what, target, frag))
                    continue
            if a['ref']:
                self.check_ref(rel, a, target, frag, lines)

    def check_all_linked(self, rel, found):
        """The page of a doc links every code reference docs_check.py finds
        in it (that names lines that exist), in the doc's order."""
        doc = self.docs.get(rel)
        if doc is None:
            return
        want = []
        d = dc.Doc(doc, self.repo.lines(doc))
        for i, text in d.prose:
            for span in dc.CODE_SPAN_RE.finditer(text):
                m = dc.REF_RE.match(span.group(2).strip())
                if m and not self.checker.check_ref(m):
                    want.append((m.group(0), i + 1))
        got = [a['ref'] for a in found['links'] if a['ref']]
        k = 0
        for ref, line in want:
            if ref in got[k:]:
                k = got.index(ref, k) + 1
            else:
                self.problem(rel, 'unlinked', 'code reference `%s` of %s:%d is no link on the page' % (ref, doc, line))

    def check_ref(self, rel, a, target, frag, lines):
        """A code reference link: it opens PATH's source page at line N, and
        the lines there hold what the lesson names."""
        self.counts['refs'] += 1
        r = dc.REF_RE.match(a['ref'])
        lo = r and int(r.group(2))
        hi = r and int(r.group(3) or r.group(2))
        want = 'src/%s.html' % r.group(1) if r else None
        anchor = 'L%d' % lo + ('-L%d' % hi if r and hi > lo else '') if r else None
        if not r or target != want or frag != anchor:
            self.problem(rel, 'ref', 'code reference `%s` links %s#%s, not %s#%s' % (
                a['ref'], target, frag, want, anchor))
            return
        if lines is None:
            self.problem(rel, 'ref', 'code reference `%s`: %s shows no lines %s' % (a['ref'], target, frag))
            return
        if a['quote'] is not None:
            self.counts['quoted'] += 1
            got = [l.rstrip() for l in lines]
            want_lines = [l.rstrip() for l in a['quote'].split('\n')]
            if got != want_lines:
                k = next((k for k in range(max(len(got), len(want_lines)))
                          if k >= len(got) or k >= len(want_lines) or got[k] != want_lines[k]), 0)
                self.problem(rel, 'ref', 'code reference `%s`: the lesson quotes "%s" at line %d, the page shows "%s"' % (
                    a['ref'], want_lines[k].strip() if k < len(want_lines) else '(nothing)', lo + k,
                    got[k].strip() if k < len(got) else '(nothing)'))
        elif a['name'] is not None:
            self.counts['named'] += 1
            if not dc.name_in(a['name'], lines):
                self.problem(rel, 'ref', 'code reference `%s` names `%s`, which %s at %s does not show' % (
                    a['ref'], a['name'], target, '#' + frag))

    def screenshots(self, shots):
        os.makedirs(shots, exist_ok=True)
        saved = []
        for page, name, w, h, mobile in (('index.html', 'home.png', 1280, 900, False),
                                         (LESSON, 'lesson.png', 1280, 900, False),
                                         (LESSON, 'lesson-tablet.png', 820, 1180, True)):
            if os.path.exists(os.path.join(self.site, page)):
                path = os.path.join(shots, name)
                self.b.screenshot(self.url(page), path, w, h, mobile)
                saved.append(os.path.relpath(path, os.getcwd()) if not os.path.relpath(
                    path, os.getcwd()).startswith('..') else path)
        return saved


def all_pages(site):
    """Every page of the site, and the page of every doc even when it is
    missing (then it does not load)."""
    import build
    repo = dc.Repo(ROOT)
    pages = [build.site_path(f, repo) for f in sorted(repo.files) if build.is_page_md(f)]
    pages = [p for p in pages if not os.path.exists(os.path.join(site, p))]
    for d, _, names in os.walk(site):
        for n in names:
            if n.endswith('.html'):
                pages.append(os.path.relpath(os.path.join(d, n), site))
    # the home page and the lessons first: their problems are the ones a student meets
    return sorted(pages, key=lambda p: (p != 'index.html', p.startswith('src/'), p))


def run(site, pages, shots=None, quiet=False):
    global SITE
    SITE = os.path.abspath(site)
    t0 = time.time()
    b = Browser()
    try:
        c = Check(site, b)
        for p in pages:
            c.check_page(p)
        saved = c.screenshots(shots) if shots else []
    finally:
        b.close()
    if not quiet:
        for page, kind, what in c.problems:
            print('FAIL site-check %s: %s' % (page, what))
    return c, saved, time.time() - t0


def self_test(site):
    """Breaks a copy of the site in each way the check must catch."""
    if not os.path.exists(os.path.join(site, LESSON)):
        print('site-check self-test: no %s in %s: run make site first' % (LESSON, site))
        return 1
    tmp = tempfile.mkdtemp(prefix='site-check-selftest.')
    try:
        copy = os.path.join(tmp, 'site')
        shutil.copytree(site, copy)
        path = os.path.join(copy, LESSON)
        text = open(path, encoding='utf-8').read()
        faults = {}
        # a reference whose lines no longer hold what the lesson names
        m = re.search(r'<a class="ref" data-ref="([^"]+)" data-name="([^"]+)"', text)
        if m:
            text = text[:m.start(2)] + 'name_the_self_test_moved_away' + text[m.end(2):]
            faults['ref'] = 'names `name_the_self_test_moved_away`'
        # a reference whose quote the page no longer shows
        m = re.search(r'<a class="ref" data-ref="([^"]+)" data-quote="', text)
        if m:
            text = text[:m.end()] + 'a line the self-test put in the quote&#10;' + text[m.end():]
            faults['quote'] = 'the lesson quotes "a line the self-test put in the quote"'
        # a reference the generator left without its link (the page's last,
        # not one of those broken above)
        m = ([None] + list(re.finditer(r'<a class="ref" data-ref="([^"]+)"[^>]*>(<code>[^<]*</code>)</a>', text)))[-1]
        if m:
            text = text[:m.start()] + m.group(2) + text[m.end():]
            faults['unlinked'] = 'code reference `%s` of docs/%s:' % (m.group(1), LESSON.replace('.html', '.md'))
        broken = ('<p><a href="no-such-page.html">gone</a> <a href="index.html#no-such-anchor">nowhere</a> '
                  '<a href="src/Makefile.html#L999999">past the end</a> '
                  '<img src="plots/no-such-plot.png" alt="missing"></p>'
                  '<script>console.error("the self-test logs an error")</script>'
                  '<script>selfTestCallsNothing()</script>')
        text = text.replace('</main>', broken + '</main>')
        faults.update({'link': 'no file no-such-page.html', 'anchor': 'has no id #no-such-anchor',
                       'lines': 'src/Makefile.html has', 'image': 'image plots/no-such-plot.png does not load',
                       'console': 'console.error: the self-test logs an error',
                       'exception': 'selfTestCallsNothing', 'load': 'the page does not load'})
        with open(path, 'w', encoding='utf-8') as f:
            f.write(text)
        c, _, secs = run(copy, [LESSON, 'a-page-the-self-test-removed.html'], quiet=True)
        said = ['%s: %s' % (p, w) for p, _, w in c.problems]
        missed = [k for k, needle in faults.items() if not any(needle in s for s in said)]
        if missed:
            print('site-check self-test: FAIL: the check missed %d of the %d faults put in a copy of the site: %s' % (
                len(missed), len(faults), ', '.join('%s ("%s")' % (k, faults[k]) for k in missed)))
            for s in said:
                print('  it said: ' + s)
            return 1
        print('site-check self-test: all %d faults put in a copy of %s caught (%.1f s):' % (len(faults), LESSON, secs))
        for s in said:
            print('  caught: ' + s)
        return 0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main(argv):
    site = os.path.join(ROOT, 'build', 'site')
    shots = os.path.join(ROOT, 'build', 'site-check')
    pages, selftest = [], False
    i = 0
    while i < len(argv):
        a = argv[i]
        if a in ('--site', '--shots') and i + 1 < len(argv):
            if a == '--site':
                site = argv[i + 1]
            else:
                shots = argv[i + 1]
            i += 2
            continue
        if a == '--self-test':
            selftest = True
        elif a in ('-h', '--help'):
            print(__doc__.strip())
            return 0
        elif a.startswith('-'):
            print('site-check: unknown option %s (see --help)' % a, file=sys.stderr)
            return 2
        else:
            pages.append(a)
        i += 1
    site = os.path.abspath(site)
    if not os.path.isdir(site):
        print('site-check: no site in %s: run make site first' % site)
        return 1
    try:
        if selftest:
            return self_test(site)
        c, saved, secs = run(site, pages or all_pages(site), shots)
    except Exception as e:  # the browser died, or would not start: say so in one line
        print('site-check: FAIL: %s: %s' % (type(e).__name__, e))
        return 1
    k = c.counts
    bad_pages = len(set(p for p, _, _ in c.problems))
    print('site-check: %d of %d pages pass; links %d (anchors %d), code references %d (named %d, quoted %d), '
          'images %d; screenshots %s (%.1f s)' % (
              k['pages'] - bad_pages, k['pages'], k['links'], k['anchors'], k['refs'], k['named'], k['quoted'],
              k['images'], ' '.join(saved) or 'none', secs))
    return 1 if c.problems else 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
