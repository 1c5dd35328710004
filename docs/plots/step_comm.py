#!/usr/bin/env python3
"""One training step's collectives on one rank, in order, per group (make capstone).

usage: step_comm.py TRACE.json [OUT.png] [--rank R] [--step S] [--title T] [--json] [--trim OUT.json]

Reads a --trace file (docs/tracing.md), takes rank R's spans (default 0) inside
its step S (default: the first timed step) and lists every collective the comm
layer issued there, in the order the rank issued them:

  - a blocking call is its wait span, named "OP (GROUP)";
  - a non-blocking one is its start span, "start OP (GROUP)" (its later
    "wait ..."/"test ..." spans are the same operation, not new ones);

each with the bytes the comm layer counted for it (the span's "args":{"bytes"},
the summary's "comm" figures call by call), the group it ran on ("dp", "ep",
"dp+cp", ...: the counter slot comm_groups.c names) and the outermost compute
span it sits in ("block 1 forward"), or "after X" when it sits between them.
Prints the listing (no timings: the order, groups and bytes are the program's,
not the machine's); --json prints it as JSON instead. With OUT.png, draws it
with gnuplot: one row per group, one column per collective in the step's
order, coloured by the operation and labelled with its bytes.

--trim OUT.json writes the part of the trace the listing reads (rank R's
spans inside its step S, and how many ranks the run had) as a trace of its
own: the tool reads it as it reads the whole one, so a page can quote a
listing from a small committed file (docs/plots/data/capstone/) instead of
a live run, whose all-to-all bytes depend on the routing and so on the
machine's float rounding.

Host exchanges of integers that a chapter makes with plain MPI (chapter 7's
routing counts, for one) do not go through the comm layer and are not here.
On the CUDA backend blocking calls draw no wait spans (docs/tracing.md), so
the listing is for traces of the CPU backend.
"""
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # beside this script, however it is loaded
from gp import draw_png, gp_string  # noqa: E402 (docs/plots/gp.py)

AXES = ["dp", "tp", "pp", "cp", "ep"]
COLORS = {  # operation -> colour
    "allreduce": 0x4477BB, "reduce_scatter": 0x88BBEE, "allgather": 0x228833,
    "alltoall": 0xEE7733, "send": 0xAA66CC, "recv": 0xCCA6E0,
    "broadcast": 0x999933, "reduce": 0x66CCEE, "scatter": 0xBBBB77,
    "gather": 0x44AA99, "barrier": 0x999999,
}


def die(msg):
    sys.exit(f"step_comm: {msg}")


def parse_args(argv):
    opts = {"rank": 0, "step": None, "title": "", "json": False, "trace": None, "out": None, "trim": None}
    i = 1
    while i < len(argv):
        a = argv[i]
        if a in ("--rank", "--step", "--title", "--trim"):
            if i + 1 >= len(argv):
                die(f"{a} needs a value")
            v = argv[i + 1]
            if a in ("--title", "--trim"):
                opts[a[2:]] = v
            else:
                try:
                    opts[a[2:]] = int(v)
                except ValueError:
                    die(f"{a} {v}: not an integer")
            i += 2
            continue
        if a == "--json":
            opts["json"] = True
        elif a in ("-h", "--help"):
            print(__doc__.strip())
            sys.exit(0)
        elif a.startswith("--"):
            die(f"unknown flag {a} (--rank, --step, --title, --json, --trim)")
        elif opts["trace"] is None:
            opts["trace"] = a
        elif opts["out"] is None:
            opts["out"] = a
        else:
            die(f"one trace and one picture only ({a}?)")
        i += 1
    if opts["trace"] is None:
        die("usage: step_comm.py TRACE.json [OUT.png] [--rank R] [--step S] [--title T] [--json] [--trim OUT.json]")
    return opts


def split_name(name):
    """'start alltoall (dp+cp)' -> ('alltoall', 'dp+cp')"""
    op, _, group = name.rpartition(" (")
    return op.split(" ")[-1], group.rstrip(")")


def group_key(g):
    """dp, tp, pp, cp, ep, then groups of two axes, of three, ..., then the rest"""
    parts = g.split("+")
    if all(p in AXES for p in parts):
        return (len(parts), [AXES.index(p) for p in parts], g)
    return (len(AXES) + 1, [], g)


def collectives(events, rank, step):
    """rank's step span and the collectives it issued inside it, in order"""
    spans = [e for e in events if e.get("ph") == "X" and e.get("pid") == rank]
    steps = sorted((e for e in spans if e["cat"] == "step"), key=lambda e: e["ts"])
    if not steps:
        die(f"rank {rank} has no step spans in the trace")
    if step is None:
        timed = [e for e in steps if e["args"].get("timed")]
        chosen = timed[0] if timed else steps[0]
    else:
        found = [e for e in steps if e["args"]["step"] == step]
        if not found:
            die(f"no step {step} on rank {rank} (it has steps {steps[0]['args']['step']}..{steps[-1]['args']['step']})")
        chosen = found[0]
    t0, t1 = chosen["ts"], chosen["ts"] + chosen["dur"]
    host = sorted((e for e in spans if e["tid"] == 0 and e["cat"] != "step" and t0 <= e["ts"] <= t1),
                  key=lambda e: (e["ts"], -e["dur"]))
    # the outermost compute spans of the step: where each collective sits
    outer = []
    for e in host:
        if e["cat"] == "compute" and not (outer and e["ts"] + e["dur"] <= outer[-1]["ts"] + outer[-1]["dur"]):
            outer.append(e)

    def where(ts):
        before = None
        for o in outer:
            if o["ts"] <= ts <= o["ts"] + o["dur"]:
                return o["name"]
            if o["ts"] + o["dur"] < ts:
                before = o["name"]
        return f"after {before}" if before else "before the first compute"

    out = []
    for e in host:
        name = e["name"]
        blocking = e["cat"] == "wait" and not name.startswith("wait ")
        started = e["cat"] == "comm" and name.startswith("start ")
        if not (blocking or started):
            continue
        op, group = split_name(name)
        bytes_ = e.get("args", {}).get("bytes")
        if bytes_ is None:
            die(f"the span '{name}' at {e['ts']} us has no bytes: a trace from before the comm layer wrote them")
        out.append({"op": op, "group": group, "bytes": int(bytes_), "in": where(e["ts"]),
                    "blocking": blocking})
    return chosen, host, out


def fmt_bytes(b):
    if b < 1024:
        return f"{b} B"
    if b < 1024 * 1024:
        return f"{b / 1024:.1f} KiB"
    return f"{b / 1048576:.2f} MiB"


def listing(rank, ranks, step, ops):
    groups = sorted({o["group"] for o in ops}, key=group_key)
    lines = [f"step {step} of rank {rank} ({ranks} ranks): {len(ops)} collectives on {len(groups)} groups, in the order issued",
             f"{'#':>3}  {'group':<12} {'op':<15} {'bytes':>9}  {'call':<8}  in"]
    for i, o in enumerate(ops, 1):
        call = "blocking" if o["blocking"] else "started"
        lines.append(f"{i:>3}  {o['group']:<12} {o['op']:<15} {o['bytes']:>9}  {call:<8}  {o['in']}")
    for g in groups:
        mine = [o for o in ops if o["group"] == g]
        kinds = sorted({o["op"] for o in mine})
        per = ", ".join(f"{sum(1 for o in mine if o['op'] == k)} {k}" for k in kinds)
        lines.append(f"group {g}: {per}; {sum(o['bytes'] for o in mine)} bytes")
    return lines


def draw(out, title, ops):
    groups = sorted({o["group"] for o in ops}, key=group_key)
    row = {g: len(groups) - i for i, g in enumerate(groups)}  # the first group on top
    n = len(ops)
    # where each collective sits, as bands over the columns
    bands = []
    for i, o in enumerate(ops, 1):
        if bands and bands[-1][2] == o["in"]:
            bands[-1][1] = i
        else:
            bands.append([i, i, o["in"]])
    top = len(groups) + 0.6
    with tempfile.TemporaryDirectory() as tmp:
        dat = os.path.join(tmp, "ops.dat")
        with open(dat, "w") as f:
            for i, o in enumerate(ops, 1):
                y = row[o["group"]]
                c = COLORS.get(o["op"], 0x777777)
                dark = (c >> 16) * 0.3 + (c >> 8 & 255) * 0.59 + (c & 255) * 0.11 < 140
                f.write(f'{i} {y} {i - 0.42} {i + 0.42} {y - 0.42} {y + 0.42} {c} '
                        f'"{o["op"]} {fmt_bytes(o["bytes"])}" {0xFFFFFF if dark else 0}\n')
        objs = []
        for k, (a, b, name) in enumerate(bands):
            shade = "#EEEEEE" if k % 2 == 0 else "#DDDDDD"
            objs.append(f'set object rect from {a - 0.5},{top} to {b + 0.5},{top + 0.55} fc rgb "{shade}" fs solid 1.0 noborder')
            objs.append(f'set label "{name}" at {(a + b) / 2.0},{top + 0.27} center font ",8" noenhanced')
            if k > 0:
                objs.append(f'set arrow from {a - 0.5},0.4 to {a - 0.5},{top} nohead dt 2 lc rgb "#999999"')
        used = [k for k in COLORS if any(o["op"] == k for o in ops)]
        legend = ", ".join(f'NaN with boxes fs solid 1.0 lc rgb "#{COLORS[k]:06X}" title "{k}" noenhanced' for k in used)
        ytics = ", ".join(f'"{g}" {row[g]}' for g in groups)
        width = max(700, 160 + 38 * n)
        height = 200 + 150 * len(groups)
        gp = f"""
set title {gp_string(title)} noenhanced
set xlabel "collectives in the order the rank issues them"
set xrange [0.4:{n + 0.6}]
set yrange [0.4:{top + 0.6}]
set ytics ({ytics})
set xtics 1 font ",8"
set key outside right top vertical
set border 3
{chr(10).join(objs)}
plot {gp_string(dat)} using 1:2:3:4:5:6:7 with boxxyerror fs solid 1.0 noborder lc rgb variable notitle, \\
     {gp_string(dat)} using 1:2:8:9 with labels rotate by 90 font ",8" tc rgb variable notitle noenhanced, {legend}
"""
        bad = draw_png(f'set terminal pngcairo size {width},{height} font "sans,10"', gp, out, os.path.join(tmp, "step_comm.gp"))
        if bad:
            die(bad)


def main(argv):
    opts = parse_args(argv)
    try:
        with open(opts["trace"]) as f:
            doc = json.load(f)
        events = doc["traceEvents"]
        # a trimmed trace (--trim) says how many ranks the run had
        ranks = doc.get("otherData", {}).get("ranks") or len({e["pid"] for e in events if e.get("ph") == "X"})
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        die(f"cannot read the trace '{opts['trace']}': {e}")
    chosen, host, ops = collectives(events, opts["rank"], opts["step"])
    step = chosen["args"]["step"]
    if opts["trim"]:  # whole or not at all: beside its place, then renamed
        try:
            with open(opts["trim"] + ".tmp", "w") as f:
                json.dump({"traceEvents": [chosen] + host, "otherData": {"ranks": ranks}}, f, separators=(",", ":"))
                f.write("\n")
            os.replace(opts["trim"] + ".tmp", opts["trim"])
        except OSError as e:
            die(f"cannot write --trim '{opts['trim']}': {e}")
    if opts["json"]:
        print(json.dumps({"rank": opts["rank"], "ranks": ranks, "step": step, "collectives": ops}))
    else:
        print("\n".join(listing(opts["rank"], ranks, step, ops)))
    if opts["out"]:
        if not ops:
            die(f"step {step} of rank {opts['rank']} issued no collective: nothing to draw")
        title = opts["title"] or os.path.basename(opts["trace"])
        draw(opts["out"], f"{title}: step {step}, rank {opts['rank']}", ops)
        print(f"step_comm: {opts['out']}", file=sys.stderr)


if __name__ == "__main__":
    main(sys.argv)
