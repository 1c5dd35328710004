// device.h: the backend's device: this rank's device started (the GPU of its
// node-local rank on CUDA), its queue waited for, its ops' host threads, and
// the raw allocation underneath memory.h (only memory.c calls
// device_raw_alloc and device_raw_free; everything else uses mem_alloc).
// The clocks of the device's work are device_clock.h's.
#ifndef DEVICE_H
#define DEVICE_H

#include <stddef.h>

// Zero-filled device memory, or NULL when the device is out of memory.
void* device_raw_alloc(size_t bytes);
void device_raw_free(void* ptr);

// What the device's memory is called in messages: "host memory" on the CPU
// backend, "GPU memory" on CUDA.
const char* device_memory_name(void);

// Host threads for this rank's ops (OpenMP and the BLAS library).
void device_set_threads(int n);

// Picks and prepares this rank's device (the GPU of its node-local rank on
// CUDA; nothing on the CPU). Returns a printable name.
const char* device_init(int local_rank);
// --tf32: on CUDA, 1 lets cuBLAS's single-precision matmuls run on TF32
// tensor cores (cublasSetMathMode CUBLAS_TF32_TENSOR_OP_MATH: inputs
// rounded to a 10-bit mantissa, fp32 sums), 0 keeps full fp32 (the default
// math mode). Only cuBLAS's calls change: the hand-written kernels
// (attention's, the rowwise matmuls, every reduction) stay fp32. Call after
// device_init. Returns NULL, or a note for the user when the flag does
// nothing: the CPU backend accepts it and says so (its matmuls are CBLAS
// sgemms, fp32 only), so one command line runs on both backends.
const char* device_set_tf32(int on);
// Waits for all work queued on the device (a no-op on the CPU).
void device_synchronize(void);

#endif
