#!/usr/bin/env python3
"""Checks a --trace file against the run's JSONL log (docs/tracing.md).

usage: trace_check.py TRACE.json LOG.jsonl --layers L [--micro K] [--recompute MODE]
       trace_check.py TRACE.json LOG.jsonl --pipeline [--split [--split-head]] [--recompute MODE]

  --pipeline  chapter 5: each rank holds only its stage's layers and runs each
              of them once per microbatch, so L is the summary's "layers" of
              that rank and K its "microbatches" (every rank runs them all)
  --split     the schedule splits backward (zb): each layer's B holds its
              "block l backward" span and its W a "block l backward weights"
              span, and --recompute recomputes before both (2 K L recompute)
  --split-head  the head's backward is split too (chapter 5): its B holds
              "head backward", its W "head backward weights" (the capstone
              keeps the head's weight gradients in B: no such span)

  1. the file is one JSON object whose "traceEvents" are Chrome trace events;
     the complete events ("ph":"X") carry name, cat, ts, dur, pid, tid, and
     the pids are the ranks 0 .. world-1 of the summary;
  2. on every rank the host row (tid 0) is well nested (two spans either
     hold one another or do not meet) and every in-flight row holds spans
     that do not overlap; times are compared as integer nanoseconds;
  3. every rank has one step span per step the log records, numbered as
     the log numbers it (a resumed run's from its first step on), each holding K x L "block l
     forward" and as many "block l backward" spans, and L "block l
     recompute" spans per micro-batch unless --recompute none (with --split
     K x L "block l backward weights" and twice the recompute spans, else
     none of those), K "head forward" and K "head backward" spans (with
     --split-head K "head backward weights") on the ranks that run the last
     block and none elsewhere, and the "optimizer";
  4. rank 0's totals over the timed steps equal the summary's figures per
     step: the step spans its ms_per_step, the wait spans its
     comm_wait_ms_per_step and the comm spans its comm_progress_ms_per_step.
     They come from the same clock reads, so they differ only by rounding:
     the log prints 3 decimals of a millisecond (half a microsecond) and the
     trace rounds each span's ends to a nanosecond (one nanosecond a span).
Prints one line per check: PASS ... or FAIL ...; exits 1 on a failure.
"""
import json
import re
import sys
from collections import defaultdict
from decimal import Decimal

failures = 0


def check(ok, what, detail=""):
    global failures
    print(("PASS " if ok else "FAIL ") + what + ("" if ok else ": " + detail))
    if not ok:
        failures += 1


def ns(x):
    # ts and dur are written as microseconds with exactly 3 decimals
    return int(Decimal(str(x)) * 1000)


def main(argv):
    args = {"--micro": "1", "--recompute": "none"}
    pos = []
    i = 1
    while i < len(argv):
        if argv[i] in ("--pipeline", "--split", "--split-head"):
            args[argv[i]] = True
            i += 1
        elif argv[i].startswith("--"):
            args[argv[i]] = argv[i + 1]
            i += 2
        else:
            pos.append(argv[i])
            i += 1
    trace_path, log_path = pos
    pipeline, split, split_head = "--pipeline" in args, "--split" in args, "--split-head" in args
    L, K = (0 if pipeline else int(args["--layers"])), int(args["--micro"])
    recompute = args["--recompute"] != "none"

    with open(trace_path) as f:
        try:
            doc = json.load(f, parse_float=Decimal)
        except ValueError as e:
            check(False, "trace is valid JSON", str(e))
            return
    summary = None
    logged = []  # the steps this run took: a resumed run's continue the numbers
    with open(log_path) as f:
        for line in f:
            rec = json.loads(line, parse_float=Decimal)
            if rec.get("type") == "summary":
                summary = rec
            elif rec.get("type") == "step":
                logged.append(rec["step"])
    world = summary["world_size"] if "world_size" in summary else len(summary["peak_bytes"]["params"])
    steps = len(logged)
    # layers per rank: the same L everywhere, or each pipeline stage's own
    layers = summary["layers"] if pipeline else [L] * world
    if pipeline:
        K = summary["microbatches"]

    events = doc.get("traceEvents") if isinstance(doc, dict) else None
    spans = [e for e in events or [] if e.get("ph") == "X"]
    fields_ok = all(all(k in e for k in ("name", "cat", "ts", "dur", "pid", "tid")) for e in spans)
    pids = sorted({e["pid"] for e in spans})
    check(isinstance(events, list) and fields_ok and pids == list(range(world)),
          f"trace is a JSON object of Chrome trace events, complete events with ts/dur/pid/tid, pids = ranks 0..{world - 1}",
          f"pids {pids}, fields complete: {fields_ok}")

    rows = defaultdict(list)
    for e in spans:
        t0 = ns(e["ts"])
        rows[(e["pid"], e["tid"])].append((t0, t0 + ns(e["dur"]), e))
    nested = True
    bad = ""
    for (pid, tid), rs in rows.items():
        rs.sort(key=lambda s: (s[0], -s[1]))
        stack = []
        for t0, t1, e in rs:
            if tid == 0:
                while stack and stack[-1][1] <= t0:
                    stack.pop()
                if stack and t1 > stack[-1][1]:
                    nested = False
                    bad = f"rank {pid}: '{e['name']}' [{t0}, {t1}] crosses '{stack[-1][2]['name']}' ending {stack[-1][1]}"
                stack.append((t0, t1, e))
            else:
                if stack and t0 < stack[-1][1]:
                    nested = False
                    bad = f"rank {pid} row {tid}: '{e['name']}' overlaps '{stack[-1][2]['name']}'"
                stack = [(t0, t1, e)]
    check(nested, "every rank's host row is well nested and in-flight rows do not overlap", bad)

    # 3: the spans of each step. The head runs on the ranks that hold the
    # last block (a pipeline's last stage; every rank otherwise)
    last_block = max((int(m.group(1)) for e in spans
                      for m in [re.fullmatch(r"block (\d+) forward", e["name"])] if m), default=-1)
    counts_ok = True
    bad = ""
    for pid in range(world):
        L = layers[pid] if pid < len(layers) else 0
        host = rows[(pid, 0)]
        step_spans = [s for s in host if s[2]["cat"] == "step"]
        if sorted(int(st["args"]["step"]) for _, _, st in step_spans) != logged:
            counts_ok = False
            bad = (f"rank {pid}: step spans {sorted(int(st['args']['step']) for _, _, st in step_spans)}, "
                   f"want the log's steps {logged}")
            continue
        has_head = any(e["name"] == f"block {last_block} forward" for _, _, e in host)
        for s0, s1, st in step_spans:
            inside = [e["name"] for t0, t1, e in host if s0 <= t0 and t1 <= s1 and e["cat"] == "compute"]
            heads = [inside.count(n) for n in ("head forward", "head backward", "head backward weights")]
            want_heads = [K if has_head else 0, K if has_head else 0, K if has_head and split_head else 0]
            if heads != want_heads:
                counts_ok = False
                bad = (f"rank {pid} {st['name']}: head forward, backward, backward weights spans {heads}; "
                       f"want {want_heads}")
                continue
            fwd = sum(1 for n in inside if re.fullmatch(r"block \d+ forward", n))
            bwd = sum(1 for n in inside if re.fullmatch(r"block \d+ backward", n))
            rec = sum(1 for n in inside if re.fullmatch(r"block \d+ recompute", n))
            wts = sum(1 for n in inside if re.fullmatch(r"block \d+ backward weights", n))
            want_rec = K * L * (2 if split else 1) if recompute else 0
            want_wts = K * L if split else 0
            if fwd != K * L or bwd != K * L or rec != want_rec or wts != want_wts or "optimizer" not in inside:
                counts_ok = False
                bad = (f"rank {pid} {st['name']}: {fwd} forward, {bwd} backward, {rec} recompute, {wts} backward "
                       f"weights spans, optimizer {'optimizer' in inside}; want {K * L}, {K * L}, {want_rec}, "
                       f"{want_wts}, True")
    ltext = f"(layers {layers} from the summary)" if pipeline else f"{L}"
    check(counts_ok, f"every step of every rank holds {K}x{ltext} block forward and backward spans"
          + (", as many backward weights spans" if split else "")
          + ((f", {'2x' if split else ''}{K}x{ltext} recompute spans") if recompute else ", no recompute span")
          + ", the head's (forward, backward" + (", backward weights" if split_head else "")
          + f") {K} each where block {last_block} runs, and the optimizer", bad)

    # 4: rank 0's totals over the timed steps against the summary
    host = rows[(0, 0)]
    timed = [(t0, t1) for t0, t1, e in host if e["cat"] == "step" and e.get("args", {}).get("timed")]
    n = len(timed)
    tot = defaultdict(int)
    cnt = defaultdict(int)
    for t0, t1, e in host:
        if e["cat"] == "step":
            if e.get("args", {}).get("timed"):
                tot["step"] += t1 - t0
                cnt["step"] += 1
            continue
        if any(a <= t0 and t1 <= b for a, b in timed):
            tot[e["cat"]] += t1 - t0
            cnt[e["cat"]] += 1
    pairs = [("step", "ms_per_step"), ("wait", "comm_wait_ms_per_step"), ("comm", "comm_progress_ms_per_step")]
    for cat, field in pairs:
        if field not in summary:
            continue
        per_step_ns = Decimal(tot[cat]) / n if n else Decimal(0)
        logged_ns = Decimal(str(summary[field])) * 1000000
        # rounding: 500 ns of the log's 3 decimals, 1 ns per span end pair
        allowed = Decimal(500) + Decimal(cnt[cat]) / (n or 1)
        diff = abs(per_step_ns - logged_ns)
        check(diff <= allowed,
              f"rank 0: the {cat} spans of the {n} timed steps add up to the summary's {field} "
              f"({per_step_ns / 1000000:.6f} ms vs {summary[field]}, off by {diff:.0f} ns, rounding allows {allowed:.0f})",
              f"{per_step_ns / 1000000:.6f} ms vs {summary[field]}")
    if n:
        # exclusive times: a span's own time, less the spans nested in it
        # (a recompute inside a backward, an all-gather inside the optimizer)
        own = defaultdict(int)
        stack = []
        for t0, t1, e in host:
            while stack and stack[-1][1] <= t0:
                stack.pop()
            inside_timed = any(a <= t0 and t1 <= b for a, b in timed)
            if inside_timed and e["cat"] != "step":
                own[e["cat"]] += t1 - t0
                if stack and stack[-1][2]["cat"] != "step":
                    own[stack[-1][2]["cat"]] -= t1 - t0
            stack.append((t0, t1, e))
        compute = own["compute"]
        other = tot["step"] - compute - own["wait"] - own["comm"]
        print(f"NOTE rank 0 per timed step: step {tot['step'] / n / 1e6:.3f} ms = compute {compute / n / 1e6:.3f} "
              f"+ wait {tot['wait'] / n / 1e6:.3f} + comm {tot['comm'] / n / 1e6:.3f} + untraced host work "
              f"{other / n / 1e6:.3f}")


if __name__ == "__main__":
    main(sys.argv)
    sys.exit(1 if failures else 0)
