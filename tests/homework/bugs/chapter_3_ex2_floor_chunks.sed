# file: 03_fsdp/fsdp.c
# The shard range uses chapter 1's chunks, floor(n r / N), instead of the
# shard layout r * S: each rank fills a slightly different slice.
s|\*lo = (size_t)r \* f->shard\[i\];|*lo = (size_t)r * f->numel[i] / (size_t)f->dp->size;|
