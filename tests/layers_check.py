#!/usr/bin/env python3
"""The layering of common/: no file includes a chapter's header, and the files
call each other without a circle, on either backend.

A file A depends on a file B when A includes a header that declares a
function B defines and A calls it. A circle (A -> ... -> A) means neither
file can be read, tested or replaced without the other. Prints one line per
problem and exits 1, or prints "layers ok: N files, no circle" per backend.

  python3 tests/layers_check.py [ROOT]
"""
import glob
import os
import re
import sys


def strip_comments(text):
    return re.sub(r'/\*.*?\*/', '', re.sub(r'//[^\n]*', '', text), flags=re.S)


def check(backend):
    other = 'cuda' if backend == 'cpu' else 'cpu'
    srcs = sorted(f for f in glob.glob('common/**/*.c', recursive=True) + glob.glob('common/**/*.cu', recursive=True)
                  if not f.startswith('common/%s/' % other))
    header_files = glob.glob('common/**/*.h', recursive=True) + glob.glob('common/**/*.cuh', recursive=True)
    headers = {os.path.basename(h) for h in header_files}
    declared = {}
    for h in header_files:
        text = strip_comments(open(h).read())
        declared[os.path.basename(h)] = set(re.findall(
            r'^[A-Za-z_][\w \*]*?\b(\w+)\s*\([^;{]*\)\s*(?:__attribute__\(\(.*?\)\))?\s*;', text, re.M | re.S))
    defined, text_of = {}, {}
    for c in srcs:
        text_of[c] = strip_comments(open(c).read())
        defined[c] = set(re.findall(r'^(?!static)(?:extern "C" )?[A-Za-z_][\w \*]*?\b(\w+)\s*\([^;{)]*\)\s*\{',
                                    text_of[c], re.M))
    problems = []
    edges = {}
    for c in srcs:
        called = set(re.findall(r'\b(\w+)\s*\(', text_of[c]))
        edges[c] = set()
        for inc in re.findall(r'#include "([^"]+)"', text_of[c]):
            h = os.path.basename(inc)
            if h not in headers:
                problems.append('%s includes "%s", which is not a header of common/' % (c, inc))
                continue
            for b in srcs:
                if b != c and declared[h] & defined[b] & called:
                    edges[c].add(b)
        # <mpi.h> declares the MPI_X that a file of common/ may define itself
        # (watch_mpi.c's wrappers, MPI's profiling interface): a call of one
        # goes through that file as surely as a call of a common/ header's
        if re.search(r'#include <mpi\.h>', text_of[c]):
            for b in srcs:
                if b != c and any(f.startswith('MPI_') for f in defined[b] & called):
                    edges[c].add(b)
    # circles: strongly connected components of more than one file
    index, low, stack, on, comps, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                comps.append(sorted(comp))

    for v in srcs:
        if v not in index:
            visit(v)
    for comp in comps:
        problems.append('%s backend: a circle among %s' % (backend, ', '.join(comp)))
    return problems, len(srcs)


def main(argv):
    os.chdir(argv[0] if argv else os.path.join(os.path.dirname(os.path.abspath(__file__)), '..'))
    bad = 0
    for backend in ('cpu', 'cuda'):
        problems, n = check(backend)
        for p in problems:
            print('layers: ' + p)
        if problems:
            bad = 1
        else:
            print('layers ok (%s backend): %d files of common/, no chapter header, no circle' % (backend, n))
    return bad


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
