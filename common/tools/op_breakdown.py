#!/usr/bin/env python3
"""Prints where a run's step time went, from the summary record of its
--log FILE.jsonl: the step time, the FLOP/s and their share of the measured
sgemm peak, and the per-op breakdown (common/optime.h) of one rank, forward
and backward of each op kind, the optimizer and communication, with the
remainder of the step as "other". make bench-ref runs it.

usage: op_breakdown.py FILE.jsonl [RANK]
"""
import json
import sys

KINDS = ["matmul", "attention", "layernorm", "gelu", "residual", "encoder",
         "crossentropy", "moe", "memory"]


def main():
    if len(sys.argv) >= 2 and sys.argv[1] in ("-h", "--help"):
        print(__doc__.strip())
        return
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__.strip())
    path, rank = sys.argv[1], sys.argv[2] if len(sys.argv) == 3 else "0"
    if not rank.isdigit():
        sys.exit(f"RANK={rank}: give a rank number")
    rank = int(rank)
    summary, n = None, 0
    try:
        with open(path) as f:
            for n, line in enumerate(f, 1):
                rec = json.loads(line)
                if isinstance(rec, dict) and rec.get("type") == "summary":
                    summary = rec
    except OSError as e:
        sys.exit(f"{path}: cannot read it: {e.strerror}")
    except UnicodeDecodeError:
        sys.exit(f"{path}:{n + 1}: not text: give the --log FILE.jsonl of a run")
    except ValueError:
        sys.exit(f"{path}:{n}: not a JSON line: give the --log FILE.jsonl of a run")
    if summary is None:
        sys.exit(f"{path}: no summary record (did the run finish?)")
    ops = summary.get("op_ms_per_step")
    if ops is None:
        sys.exit(f"{path}: the summary has no op_ms_per_step (a build from before the per-op timers)")
    if not 0 <= rank < summary["world_size"]:
        sys.exit(f"rank {rank} is not in this {summary['world_size']}-rank run")

    step = summary["ms_per_step"]
    gflops = summary["tokens_per_s"] * summary["flops_per_token"] / 1e9
    peak = summary["peak_gflops"]
    # where the peak came from (logs before "peak_source" do not say)
    source = {"measured": "the measured ", "flag": "the --peak-gflops "}.get(summary.get("peak_source"), "the ")
    print(f"chapter {summary['chapter']}, {summary['model']}, {summary['world_size']} rank(s) "
          f"({summary['mesh_shape']}), {summary['batch']} x {summary['seq']} tokens per step")
    print(f"step {step:.1f} ms, {summary['tokens_per_s']:.0f} tokens/s, {gflops:.1f} GFLOP/s = "
          f"{100 * summary['mfu']:.1f}% of {source}sgemm peak ({peak:.1f} GFLOP/s)")

    def ms(name):
        return ops.get(name, [0.0] * summary["world_size"])[rank]

    rows = []
    for k in KINDS:
        fwd, bwd = ms(k + "_fwd"), ms(k + "_bwd")
        if fwd or bwd or k in ("matmul", "attention", "layernorm", "gelu"):
            rows.append((k, fwd, bwd))
    rows.append(("optimizer", ms("optimizer_fwd"), None))
    rows.append(("comm wait", ms("comm_wait"), None))
    rows.append(("comm progress", ms("comm_progress"), None))
    # this rank's own step (ranks start a step at different moments); the
    # summary's ms per step is rank 0's
    step = ops["step"][rank] if "step" in ops else step
    counted = sum(f + (b or 0.0) for _, f, b in rows)
    if counted == 0.0:
        print("no per-op figures: this backend's ops do not time themselves (common/optime.h)")
        return
    rows.append(("other", step - counted, None))

    print(f"per-op breakdown of rank {rank}, ms per timed step:")
    print(f"  {'op':<14} {'forward':>9} {'backward':>9} {'total':>9} {'share':>7}")
    for name, fwd, bwd in rows:
        total = fwd + (bwd or 0.0)
        b = f"{bwd:9.1f}" if bwd is not None else f"{'':9}"
        f = f"{fwd:9.1f}" if bwd is not None else f"{'':9}"
        print(f"  {name:<14} {f} {b} {total:9.1f} {100 * total / step:6.1f}%")
    print(f"  {'step':<14} {'':9} {'':9} {step:9.1f} {100.0:6.1f}%")


if __name__ == "__main__":
    main()
