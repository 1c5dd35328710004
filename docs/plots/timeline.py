#!/usr/bin/env python3
"""Draws a --trace file as a Gantt chart PNG with gnuplot (make timeline).

usage: timeline.py TRACE.json OUT.png [FIRST:LAST] [TITLE]

Two rows per rank: the host (what the rank's thread is doing: forward in
light blue, backward in blue, a recomputed forward in violet, the optimizer in teal, host work in a
non-blocking start or test in orange, blocked waiting in red) and the
collectives in flight (green: started, not yet completed; overlapping ones
stack up darker). Steps FIRST..LAST (rank 0's step spans) are drawn; the
default is the first two timed steps, or all steps if there are fewer.
"""
import json
import os
import re
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # beside this script, however it is loaded
from gp import draw_png, gp_string  # noqa: E402 (docs/plots/gp.py)

COLORS = {  # kind -> (rgb, legend)
    "forward": (0x88BBEE, "forward"),
    "compute": (0x3366AA, "backward"),
    "recompute": (0xAA66CC, "recompute (forward again)"),
    "optimizer": (0x228833, "optimizer"),
    "comm": (0xEE7733, "comm start/test (host)"),
    "wait": (0xCC3311, "waiting"),
    "inflight": (0x66BB66, "collective in flight"),
}


def main(argv):
    if len(argv) < 3:
        sys.exit("usage: timeline.py TRACE.json OUT.png [FIRST:LAST] [TITLE]")
    path, out = argv[1], argv[2]
    window = argv[3] if len(argv) > 3 and argv[3] else ""
    title = argv[4] if len(argv) > 4 and argv[4] else os.path.basename(path)
    try:
        with open(path) as f:
            events = json.load(f)["traceEvents"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        sys.exit(f"timeline: cannot read the trace '{path}': {e}")
    try:  # the course's spans (common/trace.c): pid, ts, dur, cat, name, args
        spans = [e for e in events if e.get("ph") == "X"]
        ranks = sorted({e["pid"] for e in spans})
        steps = sorted((e["args"]["step"], e["ts"], e["ts"] + e["dur"], e["args"].get("timed", 0))
                       for e in spans if e["cat"] == "step" and e["pid"] == 0)
        for e in spans:
            e["pid"], e["ts"], e["dur"], e["cat"], e["name"]
    except (AttributeError, KeyError, TypeError) as e:
        sys.exit(f"timeline: '{path}' is not a trace of the course's programs (--trace FILE): {type(e).__name__} {e}")
    if not steps:
        sys.exit(f"timeline: '{path}' holds no step spans")
    if window:
        m = re.fullmatch(r"(\d+):(\d+)", window)
        if not m:
            sys.exit(f"timeline: STEPS={window}: give FIRST:LAST, e.g. 1:2")
        a, b = int(m.group(1)), int(m.group(2))
    else:
        timed = [s[0] for s in steps if s[3]]
        a = timed[0] if timed else steps[0][0]
        b = min(a + 1, steps[-1][0])
    chosen = [s for s in steps if a <= s[0] <= b]
    if not chosen:
        sys.exit(f"timeline: no steps {a}..{b} in '{path}' (it has steps {steps[0][0]}..{steps[-1][0]})")
    # the window: the chosen steps of rank 0, every rank drawn over the same time
    t_lo, t_hi = chosen[0][1], chosen[-1][2]
    pad = 0.01 * (t_hi - t_lo)
    t_lo, t_hi = t_lo - pad, t_hi + pad

    rows = []
    for r in ranks:
        for e in spans:
            if e["pid"] != r or e["cat"] in ("step", "validation"):  # the frames, not work
                continue
            t0, t1 = e["ts"], e["ts"] + e["dur"]
            if t1 < t_lo or t0 > t_hi:
                continue
            kind = e["cat"]
            if kind == "compute" and "forward" in e["name"]:
                kind = "forward"
            elif kind == "compute" and "recompute" in e["name"]:
                kind = "recompute"
            elif kind == "compute" and e["name"] == "optimizer":
                kind = "optimizer"
            # rank r: host row at y = 2r + 1, in-flight row at 2r + 0.35
            y, h = (2 * len(ranks) - 2 * r - 1, 0.4) if kind != "inflight" else (2 * len(ranks) - 2 * r - 1.6, 0.25)
            # nested spans draw after their parents, so the innermost shows
            depth = {"forward": 0, "compute": 0, "optimizer": 0, "recompute": 1, "comm": 2, "wait": 2, "inflight": 0}[kind]
            rows.append((depth, (t0 - t_lo) / 1000.0, (t1 - t_lo) / 1000.0, y, h, COLORS[kind][0]))
    rows.sort()
    with tempfile.TemporaryDirectory() as tmp:
        dat = os.path.join(tmp, "spans.dat")
        with open(dat, "w") as f:
            for _, x0, x1, y, h, c in rows:
                f.write(f"{(x0 + x1) / 2:.6f} {y:.3f} {x0:.6f} {x1:.6f} {y - h:.3f} {y + h:.3f} {c}\n")
        ytics = []
        for r in ranks:
            ytics.append(f'"rank {r}" {2 * len(ranks) - 2 * r - 1}')
            ytics.append(f'"in flight" {2 * len(ranks) - 2 * r - 1.6}')
        step_lines = "\n".join(
            f'set arrow from {(s[1] - t_lo) / 1000.0:.6f}, graph 0 to {(s[1] - t_lo) / 1000.0:.6f}, graph 1 '
            f'nohead dt 2 lc rgb "#999999"\nset label "step {s[0]}" at {(s[1] - t_lo) / 1000.0:.6f}, graph 1.02 '
            f'font ",9" tc rgb "#666666"' for s in chosen)
        legend = ", ".join(f'NaN with boxes fs solid 1.0 lc rgb "#{c:06X}" title "{name}"'
                           for c, name in COLORS.values())
        height = max(260, 120 + 90 * len(ranks))
        gp = f"""
set title {gp_string(f"{title}: steps {a}-{b}")} noenhanced
set xlabel "ms"
set xrange [0:{(t_hi - t_lo) / 1000.0:.6f}]
set yrange [0:{2 * len(ranks)}]
set ytics ({", ".join(ytics)})
set key outside right top
set grid xtics
{step_lines}
plot {gp_string(dat)} using 1:2:3:4:5:6:7 with boxxyerror fs solid 1.0 noborder lc rgb variable notitle, {legend}
"""
        bad = draw_png(f'set terminal pngcairo size 1200,{height} font "sans,10"', gp, out, os.path.join(tmp, "timeline.gp"))
        if bad:
            sys.exit(f"timeline: {bad}")
    print(f"timeline: {out} (steps {a}-{b} of {len(ranks)} rank{'s' if len(ranks) != 1 else ''})")


if __name__ == "__main__":
    main(sys.argv)
