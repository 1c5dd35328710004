// matmul_peak.h: the machine's measured matmul rate, the peak that MFU
// divides by (matmul_peak.c). It runs the ops, so it sits above them; the
// clocks it reads are runtime.h's.
#ifndef MATMUL_PEAK_H
#define MATMUL_PEAK_H

// Measured single-precision matmul rate of this rank's device (GFLOP/s): the
// best of a few square sgemms through matmul_forward. Allocations it makes are
// freed and the allocator's peaks reset.
double measure_matmul_gflops(void);
// The same for matmul_forward's out (N, OC) = inp (N, C) @ w^T: the best of
// five calls after a warm-up (build/roofline measures a block's shapes).
double measure_matmul_gflops_at(int N, int C, int OC);

#endif
