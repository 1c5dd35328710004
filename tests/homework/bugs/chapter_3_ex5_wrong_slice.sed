# file: 03_fsdp/fsdp.c
# The ZeRO-1/2 step updates the slice at the shard's offset in the shard
# buffer (shard_off) instead of this rank's slice of the unit (r * S).
s|adamw_update(full + (size_t)r \* S, f->shard_grads + so|adamw_update(full + so, f->shard_grads + so|
