// cuda_common.h: what the CUDA backend's files share: the compute stream, the
// cuBLAS handle, and the macros that check every CUDA, cuBLAS and NCCL call.
//
// Included by ops_*.cu and device.cu (C++, nvcc) and by comm.c (C, mpicc).
// A .cu file includes this header first and the project's other headers
// inside extern "C" { }: they are C headers without C++ guards of their own.
//
// A failed call is a bug or a broken system, never bad input: the macros
// print "[rank r] file:line: call failed: reason" and abort every rank
// (fatal_at, errors.h), so no rank is left waiting in a collective.
#ifndef CUDA_COMMON_H
#define CUDA_COMMON_H

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <nccl.h>
// ncclCommSplit, which makes comm.c's point-to-point channels, came with 2.18
#if NCCL_VERSION_CODE < NCCL_VERSION(2, 18, 0)
#error "the CUDA backend needs NCCL 2.18 or later (ncclCommSplit): docs/cuda.md, section 2"
#endif
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "errors.h"

// All compute (kernels, cuBLAS, copies, memsets) runs in order on this one
// stream. The communication layer has streams of its own (one per group
// and per channel) and orders them against this one with events (comm.c). Created by device_init.
extern cudaStream_t cuda_compute_stream;
// The one cuBLAS handle, bound to the compute stream. Created by device_init.
extern cublasHandle_t cuda_cublas;
// How device_synchronize waits for the compute stream: NULL (a plain
// synchronize) until the NCCL layer sets its polling wait, which also stops
// the job on an asynchronous NCCL error (comm.c).
extern void (*cuda_compute_wait)(void);
// How a free waits for the communication streams before cudaFree's
// device-wide synchronisation: NULL (nothing to wait for) until the NCCL
// layer sets its polling wait for every stream it queued work on (comm.c).
extern void (*cuda_comm_wait)(void);
// Four floats of device memory for the comm layer's one-element handshakes
// (connect_channels in comm.c): a static device array, as ops_columns.cu's, so not
// one of the model's memory categories (device.cu).
float* cuda_handshake_floats(void);

#ifdef __cplusplus
}
#endif

#define CUDA_CHECK(call)                                                              \
    do {                                                                              \
        cudaError_t cuda_rc_ = (call);                                                \
        if (cuda_rc_ != cudaSuccess)                                                  \
            fatal_at(__FILE__, __LINE__, "%s failed: %s (%s)", #call,                 \
                     cudaGetErrorString(cuda_rc_), cudaGetErrorName(cuda_rc_));       \
    } while (0)

// After every kernel launch: a bad launch configuration shows up here at once;
// a fault inside a kernel shows up at the next call that synchronizes.
#define KERNEL_CHECK() CUDA_CHECK(cudaGetLastError())

#define CUBLAS_CHECK(call)                                                            \
    do {                                                                              \
        cublasStatus_t cublas_rc_ = (call);                                           \
        if (cublas_rc_ != CUBLAS_STATUS_SUCCESS)                                      \
            fatal_at(__FILE__, __LINE__, "%s failed: %s (cuBLAS status %d)", #call,   \
                     cublasGetStatusString(cublas_rc_), (int)cublas_rc_);             \
    } while (0)

#define NCCL_CHECK(call)                                                              \
    do {                                                                              \
        ncclResult_t nccl_rc_ = (call);                                               \
        if (nccl_rc_ != ncclSuccess)                                                  \
            fatal_at(__FILE__, __LINE__, "%s failed: %s (NCCL error %d)", #call,      \
                     ncclGetErrorString(nccl_rc_), (int)nccl_rc_);                    \
    } while (0)

#endif
