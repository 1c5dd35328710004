# file: 05_pipeline/pipeline.c
# The tied embedding's two halves all-reduced over the whole pipeline group
# instead of the embedding group of the first and the last stage: the same
# group at pp 2, so only a mesh of 3 or more stages tells them apart.
# ((void)embed: the unused parameter would stop the build under -Werror.)
s|    comm_allreduce(embed, mine, n, COMM_SUM);|    comm_allreduce(pp, mine, n, COMM_SUM);\n    (void)embed;|
