# file: 02_data_parallel/main.c
# The hook starts a bucket as soon as its top is above the boundary, before
# the gradients in its lower part are final.
s/if (b->started || b->lo < boundary) continue;/if (b->started || b->hi < boundary) continue;/
