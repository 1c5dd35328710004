# file: 05_pipeline/pipeline.c
# The peer's message list never looked up (a pointer left NULL): the run
# dies of a segmentation fault, which the grader must say as such.
# crashes: segmentation fault (SIGSEGV) in exercise 3
s|    Incoming\* in = l->in\[0\].peer == peer ? &l->in\[0\] : &l->in\[1\];|    Incoming* in = NULL;|
