// rank.h: which rank this process is, and printing on rank 0 only (the
// human lines every program prints once, not once per rank).
#ifndef RANK_H
#define RANK_H

// This process's rank in MPI_COMM_WORLD (0 before MPI is initialised).
int world_rank(void);

// printf on rank 0 only, flushed.
void print0(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

#endif
