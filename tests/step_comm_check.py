#!/usr/bin/env python3
"""Checks docs/plots/step_comm.py's listing of the capstone's steps (chapter 7's
model) against what capstone/main.c issues and against the run's own counters.

usage: step_comm_check.py TRACE.json LOG.jsonl --layers L --chunks N --cp-mode ring|ulysses|none
                          --replicated P --experts-local Q --tokens N_rank --top-k k --channels C
                          [--tp T] [--cp R]

(--cp-mode none: a mesh without cp, whose steps have no cp traffic; --cp R:
the ring's size, 2 unless told; --tp T: tensor parallelism, 1 unless told.
P is the replicated count the run prints, of the whole model: with --tp a
rank holds P - T S of it whole and S = L (4 C^2 + 3 C) / T in slices. Q is
a rank's expert parameters: the run's "in experts" count / ep. N_rank is a
rank's tokens, B T / (dp tp cp ep).)

For every rank and every step of the trace (step_comm.py's listing, as --json --rank r --step s prints it):

  1. the order of one step: per MoE layer l = 0..L-1 in "block l forward",
     the attention (with --tp: an all-gather over tp, the cp traffic, a
     reduce-scatter over tp; chapter 6's sp_attention_forward, which
     composed_attention.c calls), then the dispatch and combine
     all-to-alls over ep (2 N of them, N = --ep-overlap's chunks); backward,
     l = L-1..0 in "block l backward", the MoE's 2 N all-to-alls over ep
     first, then the attention's backward (with --tp: an all-gather, the cp
     traffic, an all-gather and a reduce-scatter); then, after the last
     backward, the gradients' all-reduces (reduce_gradients): the replicated
     parameters over dp+cp+ep, the experts over dp+cp, with --tp the slices
     over dp+cp+ep (and tp in the first two groups: dp+tp+cp+ep, dp+tp+cp);
     then the norm's over ep and the experts' group (clip_and_step).
     Without cp, no cp in the names. No other group, no other collective.
  2. the bytes the code fixes: the gradient all-reduces carry 4 P, 4 Q
     (and 4 S) bytes; dropless, each forward dispatch sends the rank's
     N_rank k rows of C floats in all (summed over its chunks), and so does
     each backward's first exchange; every tp all-gather and reduce-scatter
     counts the group's N_rank tp rows of C floats.
  3. the cp traffic: Ulysses' all-to-alls, or the ring's cp - 1 K|V
     messages forward and (cp - 1) + cp backward, each a send and a receive
     of 2 N_rank C floats, over cp only.
  4. over all steps, the calls and bytes per collective and group equal the
     summary's "comm" counters of that rank (the trace and the counters are
     two outputs of one tally).

Exits 1 with every problem found, 0 with one line per check passed.
"""
import importlib.util
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


# step_comm.py's own functions, called in this process on the trace read once:
# a step_comm.py process per rank and step (32 of them on 16 ranks) read the
# whole trace each time, 2 s of CPU time per check; one run of its command
# line (check_cli) still shows that --json prints the same listing
def step_comm_module():
    spec = importlib.util.spec_from_file_location("step_comm", "docs/plots/step_comm.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def listing(step_comm, events, rank, step):
    try:
        _, _, ops = step_comm.collectives(events, rank, step)
    except SystemExit as e:  # step_comm.py's die(): its message, as its command line prints it
        raise SystemExit(f"FAIL step_comm.py on rank {rank} step {step}: {e}")
    return ops


def check_cli(trace, rank, step, ops):
    out = subprocess.run([sys.executable, "docs/plots/step_comm.py", trace, "--json", "--rank", str(rank),
                          "--step", str(step)], capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"FAIL step_comm.py on rank {rank} step {step}: {out.stderr.strip()}")
    if json.loads(out.stdout)["collectives"] != ops:
        return [f"rank {rank} step {step}: step_comm.py --json lists other collectives than its collectives()"]
    return []


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
    # every rank of the run, each with its steps: a trace that lost a rank (or
    # every span) is not checked on what is left
    if ranks != list(range(summary["world_size"])) or not steps:
        problems.append(f"the trace holds ranks {ranks} and {len(steps)} steps of rank 0, not the run's "
                        f"{summary['world_size']} ranks with a step each")
    cp_ops = {"send", "recv"} if mode == "ring" else {"alltoall"} if mode == "ulysses" else set()
    tp, ncp = int(o.get("tp", 1)), int(o.get("cp", 2 if cp_ops else 1))
    # the groups composed_model.c and composed_tp.c create, named by their axes in mesh order
    def group(*axes):
        return "+".join(a for a in ("dp", "tp", "cp", "ep") if a in axes and (a != "tp" or tp > 1)
                        and (a != "cp" or cp_ops))
    g_batch, g_exp, g_slices = group("dp", "tp", "cp", "ep"), group("dp", "tp", "cp"), group("dp", "cp", "ep")
    # --tp: a rank holds 1/tp of every layer's qkvw, qkvb, attprojw (moe_attn_tp_numel: (4 C^2 + 3 C) / tp),
    # the rest of the replicated parameters whole
    S = L * (4 * C * C + 3 * C) // tp if tp > 1 else 0
    P_rank = P - tp * S
    attn_cp = ["cp"] if cp_ops else []
    attn_fwd = ["allgather tp"] + attn_cp + ["reduce_scatter tp"] if tp > 1 else attn_cp
    attn_bwd = ["allgather tp"] + attn_cp + ["allgather tp", "reduce_scatter tp"] if tp > 1 else attn_cp
    moe = ["alltoall ep"] * (2 * nc)
    step_comm = step_comm_module()
    for r in ranks:
        totals = {}
        for s in steps:
            ops = listing(step_comm, events, r, s)
            if r == ranks[0] and s == steps[0]:
                problems += check_cli(trace, r, s, ops)
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
                # the block's shape: each call as "op group", a run of cp calls as one "cp"
                shape = []
                for x in mine:
                    tok = "cp" if x["group"] == "cp" else f"{x['op']} {x['group']}"
                    if not (tok == "cp" and shape and shape[-1] == "cp"):
                        shape.append(tok)
                if phase == "forward":  # attention (composed_attention.c), then the MoE (main.c)
                    want_shape = attn_fwd + moe
                else:                   # the MoE's exchanges reversed, then attention's backward
                    want_shape = moe + attn_bwd
                if shape != want_shape:
                    problems.append(f"{where}: {name} issues {shape}, not {want_shape}")
                a2a = [x for x in mine if x["group"] == "ep"]
                cp = [x for x in mine if x["group"] == "cp"]
                tpx = [x for x in mine if x["group"] == "tp"]
                if {x["op"] for x in cp} - cp_ops:
                    problems.append(f"{where}: {name}'s cp traffic is {[x['op'] for x in cp]}, not {mode}'s {sorted(cp_ops)}")
                # 3. the ring: cp - 1 K|V messages forward, (cp - 1) + cp backward (dK|dV home),
                # each a send and a receive of 2 N C floats (with tp: N tp rows of C/tp channels)
                if mode == "ring":
                    n_msg = ncp - 1 if phase == "forward" else 2 * ncp - 1
                    for op in ("send", "recv"):
                        got = [x["bytes"] for x in cp if x["op"] == op]
                        if got != [2 * N * C * 4] * n_msg:
                            problems.append(f"{where}: {name}'s ring {op}s carry {got} bytes, "
                                            f"not {n_msg} of 2 N C 4 = {2 * N * C * 4}")
                # tp: every all-gather and reduce-scatter moves the group's N tp rows of C floats
                for x in tpx:
                    if x["bytes"] != N * tp * C * 4:
                        problems.append(f"{where}: {name}'s tp {x['op']} counts {x['bytes']} bytes, "
                                        f"not N tp C 4 = {N * tp * C * 4}")
                # 2. dropless: the first exchange of a layer moves the rank's N k rows (all its chunks)
                sent = sum(x["bytes"] for x in a2a[:nc])
                if len(a2a) == 2 * nc and sent != N * k * C * 4:
                    problems.append(f"{where}: {name}'s first exchange sends {sent} bytes, not N k C 4 = {N * k * C * 4}")
            # after backward: reduce_gradients, then clip_and_step's two sums of squares
            want = [("allreduce", g_batch, 4 * P_rank), ("allreduce", g_exp, 4 * Q)]
            if tp > 1:
                want.append(("allreduce", g_slices, 4 * S))
            want += [("allreduce", "ep", None), ("allreduce", g_exp, None)]
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
    print(f"ok: {len(ranks)} ranks x {len(steps)} steps: every step's collectives in the order of capstone/main.c "
          f"({L} layers, {nc} chunk(s), cp {mode}, tp {tp}), the bytes the code fixes, and the summary's counters")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
