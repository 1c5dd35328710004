# file: 01_collectives/collectives.c
# The broadcast is linear: the root sends the buffer to every other rank in
# turn. Every rank ends with it, in p-1 sends from the root, not ceil(log2 p).
0,/^    int round = 0;$/s/^    int round = 0;$/    int round = 0;\n    if (c->rank == root) {\n        for (int i = 0; i < p; i++)\n            if (i != root) comm_send(c, buf, n, i);\n    } else {\n        comm_recv(c, buf, n, root);\n    }\n    return;/
