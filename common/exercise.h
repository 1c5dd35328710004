// exercise.h: the stub that `make homework` puts in place of exercise n of a
// chapter (tests/homework/cut.py, docs/teaching.md). A file with an exercise
// region includes this header, so its student version compiles.
#ifndef EXERCISE_H
#define EXERCISE_H

// "error: exercise n of chapter N is not done", then every rank exits with
// status 3 (MPI_Abort). Rank 0 speaks at once; another rank that reaches a
// stub waits a moment first, so the one message comes from rank 0 whenever
// rank 0 reaches it too, and from that rank when rank 0 never does.
void exercise_not_done(int chapter, int n) __attribute__((noreturn));

#endif
