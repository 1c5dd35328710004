#!/usr/bin/env python3
"""The course's GPT in PyTorch (fp32, CPU), the peer of make bench-peer.

Loads an llm.c GPT-2 checkpoint (the file chapter 0 writes with --save),
trains it on the same data in the same order as the C trainers (the default
corpus, bytes as tokens, sequence b of step s starting at token (s*B + b)*T
of the first 90%), with the same AdamW and global-norm clipping, and prints
the loss of every step and the tokens/s over the steps after the first (the
C trainers leave the first step out too). With --ranks 2 it runs
DistributedDataParallel over gloo, each rank on its share of the batch, as
chapter 2 does.

usage: peer_gpt.py CHECKPOINT.bin [--steps N] [--batch B] [--seq T]
                   [--threads N] [--ranks R] [--log FILE.json]
Needs python3-torch (Debian's package; make bench-peer installs it).
"""
import argparse
import json
import math
import os
import struct
import sys
import time

import torch
import torch.nn.functional as F

CORPUS_DIR = "/usr/share/games/fortunes"  # common/data.h: DEFAULT_CORPUS_DIR


def load_checkpoint(path):
    """The llm.c file: 256 int32 header, then 16 tensors, all layers of each together."""
    with open(path, "rb") as f:
        header = struct.unpack("256i", f.read(1024))
        if header[0] != 20240326 or header[1] != 3:
            sys.exit(f"{path}: not an fp32 llm.c GPT-2 checkpoint")
        maxT, V, L, NH, C, Vp = header[2], header[3], header[4], header[5], header[6], header[7]
        shapes = [("wte", (Vp, C)), ("wpe", (maxT, C)), ("ln1w", (L, C)), ("ln1b", (L, C)),
                  ("qkvw", (L, 3 * C, C)), ("qkvb", (L, 3 * C)), ("attprojw", (L, C, C)),
                  ("attprojb", (L, C)), ("ln2w", (L, C)), ("ln2b", (L, C)),
                  ("fcw", (L, 4 * C, C)), ("fcb", (L, 4 * C)), ("fcprojw", (L, C, 4 * C)),
                  ("fcprojb", (L, C)), ("lnfw", (C,)), ("lnfb", (C,))]
        params = {}
        for name, shape in shapes:
            n = math.prod(shape)
            data = torch.frombuffer(bytearray(f.read(4 * n)), dtype=torch.float32)
            params[name] = torch.nn.Parameter(data.reshape(shape).clone())
    cfg = dict(maxT=maxT, V=V, L=L, NH=NH, C=C, Vp=Vp)
    return cfg, params


class GPT(torch.nn.Module):
    """GPT-2 as common/model.c runs it: pre-LayerNorm blocks, causal attention,
    tanh-GELU MLP, final LayerNorm, LM head tied to wte, loss over the first V
    logits (the padded ones never enter the softmax)."""

    def __init__(self, cfg, params):
        super().__init__()
        self.cfg = cfg
        self.p = torch.nn.ParameterDict(params)

    def forward(self, idx, targets):
        cfg, p = self.cfg, self.p
        B, T = idx.shape
        C, NH = cfg["C"], cfg["NH"]
        hs = C // NH
        mask = torch.ones(T, T, dtype=torch.bool).tril()
        x = p["wte"][idx] + p["wpe"][:T]
        for l in range(cfg["L"]):
            h = F.layer_norm(x, (C,), p["ln1w"][l], p["ln1b"][l], 1e-5)
            qkv = F.linear(h, p["qkvw"][l], p["qkvb"][l])
            q, k, v = (t.view(B, T, NH, hs).transpose(1, 2) for t in qkv.split(C, dim=2))
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
            att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
            y = (att @ v).transpose(1, 2).reshape(B, T, C)
            x = x + F.linear(y, p["attprojw"][l], p["attprojb"][l])
            h = F.layer_norm(x, (C,), p["ln2w"][l], p["ln2b"][l], 1e-5)
            h = F.gelu(F.linear(h, p["fcw"][l], p["fcb"][l]), approximate="tanh")
            x = x + F.linear(h, p["fcprojw"][l], p["fcprojb"][l])
        x = F.layer_norm(x, (C,), p["lnfw"], p["lnfb"], 1e-5)
        logits = x @ p["wte"].t()
        V = cfg["V"]
        return F.cross_entropy(logits[..., :V].reshape(-1, V), targets.reshape(-1))


def training_tokens():
    """The default corpus as common/data.c reads it: the regular files of the
    fortunes directory but the .dat indexes and .u8 links, in name order,
    concatenated; the first 90% is training data; a byte is a token."""
    names = sorted(os.listdir(CORPUS_DIR).copy(), key=lambda s: s.encode())
    text = bytearray()
    for name in names:
        path = os.path.join(CORPUS_DIR, name)
        if name.startswith(".") or name.endswith(".dat") or name.endswith(".u8"):
            continue
        if os.path.isfile(path):
            with open(path, "rb") as f:
                text += f.read()
    n_train = len(text) - len(text) // 10
    return torch.frombuffer(bytearray(text[:n_train]), dtype=torch.uint8).to(torch.long)


def batch(tokens, step, B, T, b0, nb):
    """Sequences b0 .. b0+nb-1 of the global batch of step `step`."""
    xs, ys = [], []
    n = tokens.numel()
    for b in range(b0, b0 + nb):
        start = ((step * B + b) * T) % n
        idx = (torch.arange(T + 1) + start) % n
        seq = tokens[idx]
        xs.append(seq[:T])
        ys.append(seq[1:])
    return torch.stack(xs), torch.stack(ys)


def run(rank, args):
    torch.set_num_threads(args.threads)
    world = args.ranks
    if world > 1:
        import torch.distributed as dist
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(args.port))
        dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    cfg, params = load_checkpoint(args.checkpoint)
    model = GPT(cfg, params)
    net = model
    if world > 1:
        net = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.999), eps=1e-8,
                            weight_decay=0.0)
    tokens = training_tokens()
    B, T = args.batch, args.seq
    if B % world:
        sys.exit(f"--batch {B} does not split over {world} ranks")
    nb = B // world
    losses, times = [], []
    for step in range(args.steps):
        x, y = batch(tokens, step, B, T, rank * nb, nb)
        t0 = time.perf_counter()
        loss = net(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()  # DDP averages the gradients over the ranks here
        # clip by the global norm as the C trainers do: clip / norm when above
        norm = torch.sqrt(sum((p.grad.double() ** 2).sum() for p in model.parameters()))
        if args.clip > 0 and norm > args.clip:
            for p in model.parameters():
                p.grad.mul_(float(args.clip / norm))
        opt.step()
        dt = time.perf_counter() - t0
        lv = loss.detach().clone()
        if world > 1:
            dist.all_reduce(lv)
            lv /= world
        losses.append(float(lv))
        times.append(dt)
        if rank == 0:
            print(f"step {step:4d}/{args.steps} | loss {float(lv):.6f} | norm {float(norm):7.4f} | "
                  f"{1e3 * dt:8.2f} ms | {B * T / dt:9.0f} tok/s", flush=True)
    timed = times[1:] if len(times) > 1 else times
    tps = B * T / (sum(timed) / len(timed))
    if rank == 0:
        rec = {"peer": "pytorch", "torch": torch.__version__, "ranks": world,
               "threads": args.threads, "batch": B, "seq": T, "steps": args.steps,
               "losses": losses, "tokens_per_s": tps}
        print(f"pytorch {torch.__version__}: {world} process(es) x {args.threads} thread(s), "
              f"{tps:.0f} tokens/s")
        if args.log:
            with open(args.log, "w") as f:
                json.dump(rec, f)
                f.write("\n")
    if world > 1:
        dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("checkpoint")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--clip", type=float, default=1.0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ranks", type=int, default=1)
    ap.add_argument("--port", type=int, default=29517)
    ap.add_argument("--log")
    args = ap.parse_args()
    if args.ranks > 1:
        import torch.multiprocessing as mp
        mp.spawn(run, args=(args,), nprocs=args.ranks, join=True)
    else:
        run(0, args)


if __name__ == "__main__":
    main()
