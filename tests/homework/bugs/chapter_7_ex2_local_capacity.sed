# file: 07_expert/moe_layer.c
# No sum of the blocks' counts over the batch: every rank sees only its own
# blocks, keeps the first `cap` slots of its own tokens, so the global batch
# keeps (dp x cp x ep) x cap per expert.
/MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, cnt, n_blocks \* E, MPI_LONG, MPI_SUM, X->batch->mpi));/d
