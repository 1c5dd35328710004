# file: 03_fsdp/fsdp.c
# The gather sends the start of the shard buffer for every unit, not the
# unit's own shard.
s|const float\* mine = f->shard_params + f->shard_off\[i\];|const float* mine = f->shard_params;|
