# file: 01_collectives/collectives.c
# The broadcast sends to v + 2^k without turning it back into a rank (+ root):
# right for root 0 only.
# hangs: with root p-1 a rank waits for a message sent to another rank
s/int dst = mod(v + mask + root, p);/int dst = mod(v + mask, p);/
