// matmul_peak.h: the machine's measured matmul rate, the peak that MFU
// divides by (matmul_peak.c). It runs the ops, so it sits above them; the
// clocks it reads are runtime.h's.
#ifndef MATMUL_PEAK_H
#define MATMUL_PEAK_H

// Measured single-precision matmul rate of this rank's device (GFLOP/s): the
// best of a few square sgemms through matmul_forward, each timed on the
// device's clock (CUDA events on a GPU), at 1536 and, on a device that does
// that in under 5 ms, at larger sizes up to 6144 (the best rate counts).
// Allocations it makes are freed and the allocator's peaks reset.
double measure_matmul_gflops(void);
// The same, and the size whose rate was the best (N = C = OC).
double measure_matmul_gflops_sized(int* size);
// The same for matmul_forward's out (N, OC) = inp (N, C) @ w^T: the best of
// five calls after a warm-up (build/roofline measures a block's shapes).
double measure_matmul_gflops_at(int N, int C, int OC);
// The same for another of ops.h's products of that shape, (N, C) in, (N, OC)
// out: the BLAS call above, matmul_forward_rowwise, or
// matmul_backward_input_rowwise (its dinp (N, OC) from a dout (N, C)).
typedef enum { MATMUL_BLAS, MATMUL_ROWWISE, MATMUL_ROWWISE_BACKWARD } MatmulProduct;
double measure_product_gflops_at(MatmulProduct product, int N, int C, int OC);

#endif
