# file: 07_expert/main.c
# No exclusive scan: every rank keeps the first `cap` slots of its own
# tokens, so the global batch keeps (dp x ep) x cap per expert.
/MPI_CHECK(MPI_Exscan(cnt, before, E, MPI_LONG, MPI_SUM, m->batch.mpi));/d
