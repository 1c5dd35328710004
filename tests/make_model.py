"""make_model.py FILE V Vp maxT L NH C [E K H EVERY]: an llm.c model file
(version 3, fp32) with random weights (uniform with std 0.02, llm.c's
init's; LayerNorm weights near 1, biases near 0) and the padded rows of wte
zero; with E K H EVERY, chapter 7's mixture-of-experts file (version 7001,
07_expert/moe.h's layout: every EVERY-th layer's MLP is a router and E
experts of width H, each token to K of them), which chapter 7 and the
capstone read (tests/capstone.sh: 6 heads over tp 3 with a vocabulary of 256).
tests/model_files.sh plans odd shapes with it, tests/gpu_check.sh the
8-layer model pp 4 interleaves, docs/attention.md a model of 1,024
positions. Uniform, not normal: random.random is C, random.gauss Python,
ten times slower (12 s on the 10.6M weights of docs/attention.md's model)."""
import random, struct, sys
path, (V, Vp, maxT, L, NH, C) = sys.argv[1], map(int, sys.argv[2:8])
rng = random.Random(2026)
u = rng.random  # [0, 1): std 1/sqrt(12), so (u - 1/2) sqrt(12) s has std s
w = lambda n: [(u() - 0.5) * (12 ** 0.5 * 0.02) for _ in range(n)]
near = lambda n, c: [c + (u() - 0.5) * (12 ** 0.5 * 0.05) for _ in range(n)]
if len(sys.argv) > 8:
    E, K, H, every = map(int, sys.argv[8:12])
    moe = [l for l in range(L) if (l + 1) % every == 0]
    p = w(V * C) + [0.0] * ((Vp - V) * C) + w(maxT * C)      # wte (padded rows 0), wpe
    for l in range(L):                                         # each block's shared piece, in turn
        p += near(C, 1.0) + near(C, 0.0) + w(3 * C * C) + near(3 * C, 0.0) + w(C * C) + near(C, 0.0)
        p += near(C, 1.0) + near(C, 0.0)                       # ln2w ln2b
        p += w(E * C) if l in moe else w(4 * C * C) + near(4 * C, 0.0) + w(C * 4 * C) + near(C, 0.0)
    p += near(C, 1.0) + near(C, 0.0)                           # lnfw lnfb
    for l in moe:                                              # the experts: fcw fcb fcprojw fcprojb each
        for e in range(E):
            p += w(H * C) + near(H, 0.0) + w(C * H) + near(C, 0.0)
    h = [0] * 256
    h[:12] = [20240326, 7001, maxT, V, L, NH, C, Vp, E, K, H, every]
    open(path, 'wb').write(struct.pack('256i', *h) + struct.pack('%df' % len(p), *p))
    sys.exit(0)
p = w(V * C) + [0.0] * ((Vp - V) * C) + w(maxT * C)          # wte (padded rows 0), wpe
p += near(L * C, 1.0) + near(L * C, 0.0)                      # ln1w ln1b
p += w(L * 3 * C * C) + near(L * 3 * C, 0.0)                  # qkvw qkvb
p += w(L * C * C) + near(L * C, 0.0)                          # attprojw attprojb
p += near(L * C, 1.0) + near(L * C, 0.0)                      # ln2w ln2b
p += w(L * 4 * C * C) + near(L * 4 * C, 0.0)                  # fcw fcb
p += w(L * C * 4 * C) + near(L * C, 0.0)                      # fcprojw fcprojb
p += near(C, 1.0) + near(C, 0.0)                              # lnfw lnfb
h = [0] * 256
h[:8] = [20240326, 3, maxT, V, L, NH, C, Vp]
open(path, 'wb').write(struct.pack('256i', *h) + struct.pack('%df' % len(p), *p))
