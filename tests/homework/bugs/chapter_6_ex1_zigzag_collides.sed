# file: 06_sequence_context/ring.c
# Zigzag's late half-chunk one too early: two ranks hold the same positions
# and the last half-chunk belongs to nobody.
s|return (p == 0 ? rank : 2 \* s->cp - 1 - rank) \* s->len;|return (p == 0 ? rank : 2 * s->cp - 2 - rank) * s->len;|
