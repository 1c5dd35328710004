"""What tests/plan.sh's step-time checks share: a profile file read as
build/plan reads it (`key = value` lines, `#` comments), the two records of
build/plan --json's output, and a flag's value on a command line."""
import json


def read_profile(path):
    """{key: value as written} of a profile file."""
    prof = {}
    for line in open(path):
        line = line.split("#")[0].strip()
        if "=" in line:
            k, v = [x.strip() for x in line.split("=", 1)]
            prof[k] = v
    return prof


def plan_records(out):
    """The "plan" and "plan_time" records of build/plan --json --profile."""
    recs = [json.loads(l) for l in out.splitlines() if l.startswith("{")]
    return [r for r in recs if r["type"] == "plan"][0], [r for r in recs if r["type"] == "plan_time"][0]


def flag(flags, name, default):
    """The integer after `name` in the list flags, or default."""
    return int(flags[flags.index(name) + 1]) if name in flags else default


def _latency(prof, key):
    """A latency of the profile in seconds; 0 when unknown or missing."""
    v = prof.get(key, "unknown")
    return 0.0 if v == "unknown" else float(v) * 1e-6


def link_seconds(prof, coll, p, n, calls, bus, s):
    """The link model's time (tools/plan/plan_time.h, docs/planner.md) of
    `calls` calls of collective `coll` on p ranks over n nodes moving `bus`
    bus bytes, written here from the closed forms, not from the C code:
      ring       base + (steps - inter) Li + inter Le + bus s / bw
      tree       (all-reduce across nodes) base + 2((k-1) Li + log2(n) Le) + 2 S s / bw
      the rest   base + one latency + bus s / bw
    An all-reduce takes the faster of ring and tree. Returns (seconds, tree)."""
    import math
    if p < 2 or coll == "recv":
        return 0.0, False
    base, li = _latency(prof, "link.base_latency_us"), _latency(prof, "link.intra.latency_us")
    le = _latency(prof, "link.inter.latency_us") if n > 1 else 0.0
    bw = float(prof["link.intra.gbps" if n == 1 else "link.inter.gbps"]) * 1e9
    if coll not in ("allreduce", "reduce_scatter", "allgather"):
        return calls * (base + (le if n > 1 else li)) + bus * s / bw, False
    steps, inter = (2 * (p - 1), 2 * (n - 1)) if coll == "allreduce" else (p - 1, n - 1)
    ring = calls * (base + (steps - inter) * li + inter * le) + bus * s / bw
    if coll != "allreduce" or n == 1:
        return ring, False
    S = bus * p / (2 * (p - 1))
    tree = calls * (base + 2 * ((p / n - 1) * li + math.log2(n) * le)) + 2 * S * s / bw
    return (tree, True) if tree < ring else (ring, False)
