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
// How many bytes the device has: the machine's physical memory on the CPU
// backend, the GPU's total memory on CUDA (cudaMemGetInfo). mem_alloc refuses
// a buffer that would take a rank past it.
size_t device_memory_bytes(void);

// Host threads for this rank's ops (OpenMP and the BLAS library).
void device_set_threads(int n);

// What the backend needs in the environment before anything starts the
// device, MPI_Init included (a CUDA-aware MPI may start CUDA in it): called
// first by runtime_init. CUDA: CUDA_MODULE_LOADING=EAGER unless the user
// set it (device.cu says why; comm.c turns the channels off otherwise).
// Nothing on the CPU.
void device_environment(void);
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
// How many times this rank's host has waited for its device so far: on CUDA
// every device_synchronize, so every blocking copy (mem_to_host,
// mem_to_device), allocation and free, and DeviceClock or DeviceStamps read
// (each waits through it). The CPU backend counts the same copies,
// allocations, frees and device_synchronize calls, which wait for nothing
// there, so that a test on the CPU can assert how many waits a piece of
// code would make on a GPU (tests/test_moe.c: an MoE layer's). The clocks'
// reads are left out on the CPU (once a step, never inside a layer), and
// the comm layer's own waits on both (comm_barrier; on CUDA, a channel's
// turn for a point-to-point operation, docs/cuda.md).
long device_host_waits(void);

#endif
