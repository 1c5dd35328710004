#!/usr/bin/env python3
"""The course's GPT in PyTorch (fp32, CPU), the peer of make bench-peer.

Written as a PyTorch user writes GPT-2 (one nn.Module per block, nn.Linear,
nn.LayerNorm, nn.Embedding, the LM head tied to the token embedding,
torch.optim.AdamW, clip_grad_norm_, DistributedDataParallel with its default
buckets), so that make bench-peer measures the course against the PyTorch a
student would write, not against a PyTorch slowed down by its layout.

Loads an llm.c GPT-2 checkpoint (the file chapter 0 writes with --save),
trains it on the same data in the same order as the C trainers (the default
corpus, bytes as tokens, sequence b of step s starting at token (s*B + b)*T
of the first 90%), with AdamW as the course applies it (weight decay on every
parameter) and global-norm clipping, and prints the loss of every step and the
tokens/s over the steps after the first (the C trainers leave the first step
out too). With --ranks 2 it runs DistributedDataParallel over gloo, each rank
on its share of the batch, as chapter 2 does.

usage: peer_gpt.py CHECKPOINT.bin [--steps N] [--batch B] [--seq T]
                   [--lr LR] [--wd WD] [--clip CLIP]
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
import torch.nn as nn
import torch.nn.functional as F

CORPUS_DIR = "/usr/share/games/fortunes"  # common/data.h: DEFAULT_CORPUS_DIR


class CausalSelfAttention(nn.Module):
    def __init__(self, C, NH):
        super().__init__()
        self.n_head = NH
        self.c_attn = nn.Linear(C, 3 * C)
        self.c_proj = nn.Linear(C, C)
        # torch >= 2.0 has the fused kernel users call today; older releases
        # (Debian 12 ships 1.13) get the masked softmax users wrote before it
        self.flash = hasattr(F, "scaled_dot_product_attention")

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, NH, T, hs)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        if self.flash:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
            # the mask is made here, not kept as a buffer: DDP would broadcast
            # a buffer from rank 0 before every forward (and gloo takes no bool)
            causal = torch.ones(T, T, dtype=torch.bool).tril()
            att = att.masked_fill(~causal, float("-inf"))
            y = F.softmax(att, dim=-1) @ v
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)


class MLP(nn.Module):
    def __init__(self, C):
        super().__init__()
        self.c_fc = nn.Linear(C, 4 * C)
        self.c_proj = nn.Linear(4 * C, C)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, C, NH):
        super().__init__()
        self.ln_1 = nn.LayerNorm(C)
        self.attn = CausalSelfAttention(C, NH)
        self.ln_2 = nn.LayerNorm(C)
        self.mlp = MLP(C)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """GPT-2 as common/model.c runs it: pre-LayerNorm blocks, causal attention,
    tanh-GELU MLP, final LayerNorm, LM head tied to wte, loss over the first V
    logits (the padded ones never enter the softmax)."""

    def __init__(self, maxT, V, L, NH, C, Vp):
        super().__init__()
        self.V = V
        self.wte = nn.Embedding(Vp, C)
        self.wpe = nn.Embedding(maxT, C)
        self.h = nn.ModuleList(Block(C, NH) for _ in range(L))
        self.ln_f = nn.LayerNorm(C)
        self.lm_head = nn.Linear(C, Vp, bias=False)
        self.lm_head.weight = self.wte.weight  # tied

    def forward(self, idx, targets):
        B, T = idx.shape
        x = self.wte(idx) + self.wpe(torch.arange(T))
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        if logits.size(-1) > self.V:
            logits = logits[..., :self.V]
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))


def load_checkpoint(path):
    """The llm.c file: 256 int32 header, then 16 tensors, each with all layers
    together (DESIGN.md); every layer's slice is copied into its own module."""
    with open(path, "rb") as f:
        header = struct.unpack("256i", f.read(1024))
        if header[0] != 20240326 or header[1] != 3:
            sys.exit(f"{path}: not an fp32 llm.c GPT-2 checkpoint")
        maxT, V, L, NH, C, Vp = header[2:8]
        raw = f.read()
        if len(raw) % 4:
            sys.exit(f"{path}: not a whole number of floats after the header")
        data = torch.frombuffer(bytearray(raw), dtype=torch.float32)
    model = GPT(maxT, V, L, NH, C, Vp)
    h = model.h
    # (file tensor, shape without the layer axis, the parameter of layer l)
    layout = [
        ("wte", (Vp, C), lambda l: model.wte.weight),
        ("wpe", (maxT, C), lambda l: model.wpe.weight),
        ("ln1w", (C,), lambda l: h[l].ln_1.weight), ("ln1b", (C,), lambda l: h[l].ln_1.bias),
        ("qkvw", (3 * C, C), lambda l: h[l].attn.c_attn.weight),
        ("qkvb", (3 * C,), lambda l: h[l].attn.c_attn.bias),
        ("attprojw", (C, C), lambda l: h[l].attn.c_proj.weight),
        ("attprojb", (C,), lambda l: h[l].attn.c_proj.bias),
        ("ln2w", (C,), lambda l: h[l].ln_2.weight), ("ln2b", (C,), lambda l: h[l].ln_2.bias),
        ("fcw", (4 * C, C), lambda l: h[l].mlp.c_fc.weight),
        ("fcb", (4 * C,), lambda l: h[l].mlp.c_fc.bias),
        ("fcprojw", (C, 4 * C), lambda l: h[l].mlp.c_proj.weight),
        ("fcprojb", (C,), lambda l: h[l].mlp.c_proj.bias),
        ("lnfw", (C,), lambda l: model.ln_f.weight), ("lnfb", (C,), lambda l: model.ln_f.bias),
    ]
    off = 0
    with torch.no_grad():
        for name, shape, param in layout:
            layers = 1 if name in ("wte", "wpe", "lnfw", "lnfb") else L
            n = math.prod(shape)
            for l in range(layers):
                if off + n > data.numel():
                    sys.exit(f"{path}: ends inside {name}")
                param(l).copy_(data[off:off + n].view(shape))
                off += n
    if off != data.numel():
        sys.exit(f"{path}: {4 * (data.numel() - off)} bytes after the last tensor")
    return model


def training_tokens():
    """The default corpus as common/data.c reads it: the regular files of the
    fortunes directory but the .dat indexes and .u8 links, in name order,
    concatenated; the first 90% is training data; a byte is a token."""
    names = sorted(os.listdir(CORPUS_DIR), key=lambda s: s.encode())
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
    model = load_checkpoint(args.checkpoint)
    net = model
    if world > 1:
        net = nn.parallel.DistributedDataParallel(model)  # default buckets (25 MiB)
    # the course's AdamW: decay on every parameter (DESIGN.md, as llm.c)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.999), eps=1e-8,
                            weight_decay=args.wd)
    tokens = training_tokens()
    B, T = args.batch, args.seq
    if B % world:
        sys.exit(f"--batch {B} does not split over {world} ranks")
    nb = B // world
    losses, times = [], []
    for step in range(args.steps):
        x, y = batch(tokens, step, B, T, rank * nb, nb)
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = net(x, y)
        loss.backward()  # DDP all-reduces (averages) bucket by bucket during it
        # the course clips by clip / norm when the global norm is above clip;
        # clip_grad_norm_ scales by clip / (norm + 1e-6), which Adam does not see
        norm = nn.utils.clip_grad_norm_(model.parameters(),
                                        args.clip if args.clip > 0 else float("inf"))
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
    ap.add_argument("--wd", type=float, default=0.0)
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
