# file: 05_pipeline/pipeline.c
# The peer's message list never looked up (a pointer left NULL): the run
# dies of a segmentation fault, which the grader must say as such.
# crashes: segmentation fault (SIGSEGV) in exercise 3
# ((void)lists: the unused parameter would stop the build under -Werror.)
s|    Incoming\* in = lists\[0\].peer == peer ? &lists\[0\] : &lists\[1\];|    Incoming* in = NULL;\n    (void)lists;|
