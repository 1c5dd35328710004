# file: 03_fsdp/fsdp.c
# Shard size n / N rounded down: the last n mod N floats of a unit belong to
# no rank (off by one chunk when N does not divide n).
s|f->shard\[i\] = (f->numel\[i\] + N - 1) / N;|f->shard[i] = f->numel[i] / N;|
