#!/usr/bin/env python3
"""Writes the fuzzers' seed corpus (tests/fuzz/corpus/): a few small valid
and broken files for each loader. Run from anywhere; the files are committed."""
import os
import struct

here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")


def put(target, name, data):
    os.makedirs(os.path.join(here, target), exist_ok=True)
    with open(os.path.join(here, target, name), "wb") as f:
        f.write(data)


def header(values):
    return struct.pack("<256i", *(values + [0] * (256 - len(values))))


# a micro GPT: maxT 4, V 8, L 1, NH 1, C 4, Vp 8 -> 300 parameters
C, L, V, Vp, T = 4, 1, 8, 8, 4
params = Vp * C + T * C + L * (12 * C * C + 13 * C) + 2 * C
body = struct.pack("<%df" % params, *[(i % 7) * 0.125 - 0.375 for i in range(params)])
put("checkpoint", "micro.bin", header([20240326, 3, T, V, L, 1, C, Vp]) + body)
put("checkpoint", "bf16.bin", header([20240326, 5, T, V, L, 1, C, Vp]))
put("checkpoint", "truncated.bin", (header([20240326, 3, T, V, L, 1, C, Vp]) + body)[:1500])

tokens = [(i * 37) % 256 for i in range(100)]
token_file = header([20240520, 1, len(tokens)]) + struct.pack("<%dH" % len(tokens), *tokens)
put("tokens", "small.bin", token_file)
put("tokens", "truncated.bin", token_file[:1100])
put("tokens", "gpt2_ids.bin", header([20240520, 1, 3]) + struct.pack("<3H", 50256, 0, 15496))

put("text", "hello.txt", b"Hello, world.\nA second line, with a tab\tand more.\n" * 4)
put("text", "utf8.txt", "na\u00efve caf\u00e9 \u2014 \u65e5\u672c\u8a9e\n".encode() * 8)
put("text", "tokens.bin", token_file)
