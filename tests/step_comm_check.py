#!/usr/bin/env python3
"""Checks docs/plots/step_comm.py's listing of chapter 7's steps against what
07_expert/main.c issues and against the run's own counters.

usage: step_comm_check.py TRACE.json LOG.jsonl --layers L --chunks N --cp-mode ring|ulysses|none
                          --replicated P --experts-local Q --tokens N_rank --top-k k --channels C

(--cp-mode none: a mesh without cp, whose steps have no cp traffic.)

For every rank and every step of the trace (step_comm.py --json --rank r --step s):

  1. the order of one step: per MoE layer l = 0..L-1 in "block l forward",
     the attention's cp traffic, then the dispatch and combine all-to-alls
     over ep (2 N of them, N = --ep-overlap's chunks); backward, l = L-1..0
     in "block l backward", the MoE's 2 N all-to-alls over ep first, then the
     attention's cp traffic; then, after the last backward, the gradients'
     all-reduces, the replicated parameters over dp+cp+ep, then the experts
     over dp+cp (reduce_gradients), then the norm's over ep and dp+cp
     (clip_and_step); without cp, dp+ep and dp. No other group and no
     other collective.
  2. the bytes the code fixes: the gradient all-reduces carry 4 P and 4 Q
     bytes (P, Q: the replicated and local expert parameters the run prints);
     dropless, each forward dispatch sends the rank's N_rank k rows of C
     floats in all (summed over its chunks), and so does each backward's
     first exchange.
  3. the cp traffic: the ring's send and receive pairs, or Ulysses'
     all-to-alls, over cp only.
  4. over all steps, the calls and bytes per collective and group equal the
     summary's "comm" counters of that rank (the trace and the counters are
     two outputs of one tally).

Exits 1 with every problem found, 0 with one line per check passed.
"""
import json
import subprocess
import sys


def opts(argv):
    o = {}
    i = 3
    while i < len(argv):
        o[argv[i].lstrip("-").replace("-", "_")] = argv[i + 1]
        i += 2
    return o


def listing(trace, rank, step):
    out = subprocess.run([sys.executable, "docs/plots/step_comm.py", trace, "--json", "--rank", str(rank),
                          "--step", str(step)], capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"FAIL step_comm.py on rank {rank} step {step}: {out.stderr.strip()}")
    return json.loads(out.stdout)


def main(argv):
    if len(argv) < 3 or argv[1] in ("-h", "--help"):
        print(__doc__.strip())
        return 0 if len(argv) > 1 else 2
    trace, log = argv[1], argv[2]
    o = opts(argv)
    L, nc, mode = int(o["layers"]), int(o["chunks"]), o["cp_mode"]
    P, Q, N, k, C = (int(o[x]) for x in ("replicated", "experts_local", "tokens", "top_k", "channels"))
    events = json.load(open(trace))["traceEvents"]
    summary = [json.loads(line) for line in open(log) if '"type":"summary"' in line][-1]
    ranks = sorted({e["pid"] for e in events if e.get("ph") == "X"})
    steps = sorted({e["args"]["step"] for e in events if e.get("ph") == "X" and e["cat"] == "step" and e["pid"] == 0})
    problems = []
    cp_ops = {"send", "recv"} if mode == "ring" else {"alltoall"} if mode == "ulysses" else set()
    for r in ranks:
        totals = {}
        for s in steps:
            ops = listing(trace, r, s)["collectives"]
            where = f"rank {r} step {s}"
            for x in ops:
                t = totals.setdefault((x["op"], x["group"]), [0, 0])
                t[0] += 1
                t[1] += x["bytes"]
            # 1. the order: cut the step into its blocks' collectives
            rest = list(ops)
            for l, phase in [(l, "forward") for l in range(L)] + [(l, "backward") for l in reversed(range(L))]:
                name = f"block {l} {phase}"
                mine = [x for x in rest if x["in"] == name]
                if not rest or rest[:len(mine)] != mine or not mine:
                    problems.append(f"{where}: {name}'s collectives are not next in the step "
                                    f"(next: {[(x['op'], x['group'], x['in']) for x in rest[:3]]})")
                    break
                rest = rest[len(mine):]
                a2a = [x for x in mine if x["group"] == "ep"]
                cp = [x for x in mine if x["group"] == "cp"]
                if len(a2a) + len(cp) != len(mine):
                    problems.append(f"{where}: {name} has collectives on other groups: "
                                    f"{sorted({x['group'] for x in mine} - {'ep', 'cp'})}")
                if [x["op"] for x in a2a] != ["alltoall"] * (2 * nc):
                    problems.append(f"{where}: {name} has {[x['op'] for x in a2a]} over ep, "
                                    f"not the {2 * nc} all-to-alls of {nc} chunk(s)")
                if bool(cp) != bool(cp_ops) or {x["op"] for x in cp} - cp_ops:
                    problems.append(f"{where}: {name}'s cp traffic is {[x['op'] for x in cp]}, not {mode}'s {sorted(cp_ops)}")
                # attention (cp) before the experts (ep) forward, after them backward
                order = [x["group"] for x in mine]
                first, second = ("cp", "ep") if phase == "forward" else ("ep", "cp")
                if order != [first] * order.count(first) + [second] * order.count(second):
                    problems.append(f"{where}: {name} runs its groups in the order {order}, not {first} then {second}")
                # 2. dropless: the first exchange of a layer moves the rank's N k rows (all its chunks)
                sent = sum(x["bytes"] for x in a2a[:nc])
                if len(a2a) == 2 * nc and sent != N * k * C * 4:
                    problems.append(f"{where}: {name}'s first exchange sends {sent} bytes, not N k C 4 = {N * k * C * 4}")
            # the groups' names are their axes; without cp: dp+ep and dp (expert_model.c)
            rep, exp = ("dp+cp+ep", "dp+cp") if cp_ops else ("dp+ep", "dp")
            want = [("allreduce", rep, 4 * P), ("allreduce", exp, 4 * Q), ("allreduce", "ep", None),
                    ("allreduce", exp, None)]
            got = [(x["op"], x["group"], x["bytes"]) for x in rest]
            if len(got) != len(want) or any(g[:2] != w[:2] or (w[2] is not None and g[2] != w[2]) for g, w in zip(got, want)):
                problems.append(f"{where}: after the last backward {got}, not the gradients' and the norm's {want}")
        # 4. the trace's calls and bytes against the counters
        counters = {(op, g): [v["calls"][r], v["bytes"][r]] for op, by in summary["comm"].items() for g, v in by.items()
                    if v["calls"][r]}
        if {key: [c, int(b)] for key, (c, b) in counters.items()} != totals:
            problems.append(f"rank {r}: the trace's calls and bytes per collective and group {sorted(totals.items())} "
                            f"are not the summary's {sorted(counters.items())}")
    if problems:
        print("\n".join(f"FAIL {p}" for p in problems[:12]))
        return 1
    print(f"ok: {len(ranks)} ranks x {len(steps)} steps: every step's collectives in the order of 07_expert/main.c "
          f"({L} layers, {nc} chunk(s), cp {mode}), the gradients' bytes, and the summary's counters")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
