// device.cu: the CUDA backend's device: one GPU per rank, memory from
// cudaMalloc. The twin of common/cpu/device.c (device.h and the device part
// of memory.h).
//
// Every copy, memset and kernel runs on one compute stream, created here
// together with the cuBLAS handle that runs the matmuls on it. The stream is
// a non-blocking one: it never waits on CUDA's legacy default stream, so the
// only orderings are the ones written down (this stream's own order, and the
// events of the communication layer in comm.c).
#include "cuda_common.h"

#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "device.h"
#include "memory.h"
}

cudaStream_t cuda_compute_stream = NULL;
void (*cuda_compute_wait)(void) = NULL;
void (*cuda_comm_wait)(void) = NULL;
cublasHandle_t cuda_cublas = NULL;

// ---------------------------------------------------------------- device.h

// Plain device memory (never managed memory: a rank's data lives on its GPU
// and moves only through mem_to_device, mem_to_host and the comm layer),
// zero-filled before it is handed out. Sizes round up to cudaMalloc's 256-byte
// granule, and a request for 0 bytes still gets a block, as on the CPU.
extern "C" void* device_raw_alloc(size_t bytes) {
    size_t rounded = (bytes + 255) / 256 * 256;
    if (rounded == 0) rounded = 256;
    void* p = NULL;
    cudaError_t rc = cudaMalloc(&p, rounded);
    if (rc == cudaErrorMemoryAllocation) {
        (void)cudaGetLastError();  // clear it; mem_alloc reports the failure with the category
        return NULL;
    }
    CUDA_CHECK(rc);
    CUDA_CHECK(cudaMemsetAsync(p, 0, rounded, cuda_compute_stream));
    device_synchronize();  // zero before anyone sees it (polled: the stream may wait for NCCL)
    return p;
}

// Queued work (a collective the host did not wait for) may still use the
// block, and cudaFree "may perform implicit synchronization" (its
// documentation) of the whole device, unpolled: an operation stuck on a dead
// peer, on any stream, would hold it forever. So every stream first, polled
// and watched: the compute stream (device_synchronize), then the
// communication layer's (cuda_comm_wait, comm.c). The block is free of
// queued work, and a dead peer ends the job with a message.
static void all_streams_wait(void) {
    device_synchronize();
    if (cuda_comm_wait) cuda_comm_wait();
}

extern "C" void device_raw_free(void* ptr) {
    all_streams_wait();
    CUDA_CHECK(cudaFree(ptr));
}

extern "C" const char* device_memory_name(void) { return "GPU memory"; }

// cudaMemGetInfo(free, total): the current device's free and total bytes.
extern "C" size_t device_memory_bytes(void) {
    size_t free_bytes = 0, total_bytes = 0;
    CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
    return total_bytes;
}

// The host threads left to a GPU rank: OpenMP's, for whatever host loops run.
extern "C" void device_set_threads(int n) { omp_set_num_threads(n); }

// ---------------------------------------------------------------- memory.h
// Copies go on the compute stream, so they come after the kernels queued
// before them, and wait for completion, so the host buffer can be reused (or
// read) as soon as the call returns, as with memcpy on the CPU. The compute
// stream may wait for communication (comm.c queues collectives
// stream-ordered), and a peer that died would leave a plain wait on it
// waiting forever: so device_synchronize first, which polls for NCCL's
// errors under the watchdog. Only then the copy: with pageable host memory
// cudaMemcpyAsync itself waits, unpolled, for the stream ("API
// synchronization behavior" in the CUDA Runtime API: to pageable memory it
// "will return only once the copy has completed"; from it "the driver may
// synchronize with the stream"), and the stream now holds the copy alone.
static void copy_alone(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
    device_synchronize();
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, kind, cuda_compute_stream));
    CUDA_CHECK(cudaStreamSynchronize(cuda_compute_stream));  // the copy only (pinned memory returns at once)
}

extern "C" void mem_to_device(void* dst_device, const void* src_host, size_t bytes) {
    if (bytes == 0) return;
    copy_alone(dst_device, src_host, bytes, cudaMemcpyHostToDevice);
}

static __device__ float handshake[4];
extern "C" float* cuda_handshake_floats(void) {
    void* p = NULL;
    CUDA_CHECK(cudaGetSymbolAddress(&p, handshake));
    return (float*)p;
}

extern "C" void mem_to_host(void* dst_host, const void* src_device, size_t bytes) {
    if (bytes == 0) return;
    copy_alone(dst_host, src_device, bytes, cudaMemcpyDeviceToHost);
}

// Without the wait: from and to pinned memory cudaMemcpyAsync returns at once
// and the copy runs in the compute stream's order (memory.h).
extern "C" void mem_to_device_queued(void* dst_device, const void* src_host, size_t bytes) {
    if (bytes == 0) return;
    CUDA_CHECK(cudaMemcpyAsync(dst_device, src_host, bytes, cudaMemcpyHostToDevice, cuda_compute_stream));
}

extern "C" void mem_to_host_queued(void* dst_host, const void* src_device, size_t bytes) {
    if (bytes == 0) return;
    CUDA_CHECK(cudaMemcpyAsync(dst_host, src_device, bytes, cudaMemcpyDeviceToHost, cuda_compute_stream));
}

// Staging buffers (memory.h), page-locked. A copy from pinned memory is a
// DMA straight from the block; from pageable memory the driver first
// stages it into pinned memory of its own ("API synchronization behavior"
// in the CUDA Runtime API). With pinned memory cudaMemcpyAsync may return
// before the copy is done: the device_synchronize in mem_to_device and
// mem_to_host is what lets a caller reuse the buffer at once. Freed after
// every stream's polled wait, as device_raw_free's: no queued work reads
// the block after it (every copy waits anyway), and cudaFreeHost cannot
// hang on an operation stuck on a dead peer.
extern "C" void* mem_alloc_host(size_t bytes) {
    if (!cuda_compute_stream)
        FATAL("mem_alloc_host(%zu bytes) before device_init: a pinned block would belong to GPU 0's context", bytes);
    void* p = NULL;
    CUDA_CHECK(cudaMallocHost(&p, bytes ? bytes : 1));
    return p;
}

extern "C" void mem_free_host(void* ptr) {
    if (!ptr) return;
    all_streams_wait();
    CUDA_CHECK(cudaFreeHost(ptr));
}

// Queued like a kernel: later work on the stream sees zeros.
extern "C" void mem_zero(void* device_ptr, size_t bytes) {
    if (bytes == 0) return;
    CUDA_CHECK(cudaMemsetAsync(device_ptr, 0, bytes, cuda_compute_stream));
}

// Since CUDA 12.2 the runtime loads a kernel's module at the kernel's first
// launch (lazy loading, the Programming Guide's section of that name), and
// that load may wait for the work already on the device. comm.c posts a
// receive early, on a channel of its own, where its kernel spins until the
// peer's host issues the matching send: a first launch (a backward kernel,
// a new cuBLAS shape) behind such a receive would hold this host until the
// receive ends, while the peer's host, held the same way, cannot issue the
// send that ends it. Eager loading loads every module when CUDA starts, so
// no launch waits. Set before CUDA starts, which is when it is read; a
// user's own setting stays, and without EAGER comm.c uses no channels.
extern "C" void device_environment(void) { setenv("CUDA_MODULE_LOADING", "EAGER", 0); }

// Every rank calls this. Without a usable GPU every rank stops with one
// message (fail_if_any is collective over MPI_COMM_WORLD); else this rank
// takes GPU (local_rank mod count) of its node: one rank per GPU when mpirun
// starts as many ranks per node as the node has GPUs.
extern "C" const char* device_init(int local_rank) {
    static char name[512];
    char msg[512] = "";
    int count = 0;
    cudaError_t rc = cudaGetDeviceCount(&count);
    if (rc != cudaSuccess) {
        snprintf(msg, sizeof(msg),
                 "no CUDA GPU found (cudaGetDeviceCount: %s): this binary was built with "
                 "BACKEND=cuda; build with `make BACKEND=cpu` to run on the CPU",
                 cudaGetErrorString(rc));
        (void)cudaGetLastError();
    } else if (count == 0) {
        snprintf(msg, sizeof(msg),
                 "no CUDA GPU found (cudaGetDeviceCount: 0 devices): this binary was built with "
                 "BACKEND=cuda; build with `make BACKEND=cpu` to run on the CPU");
    }
    fail_if_any(rc != cudaSuccess || count == 0, msg);

    int dev = local_rank % count;
    CUDA_CHECK(cudaSetDevice(dev));
    CUDA_CHECK(cudaStreamCreateWithFlags(&cuda_compute_stream, cudaStreamNonBlocking));
    CUBLAS_CHECK(cublasCreate(&cuda_cublas));
    CUBLAS_CHECK(cublasSetStream(cuda_cublas, cuda_compute_stream));
    // full fp32 matmuls (no TF32), so the GPU trains the model the CPU trains;
    // --tf32 changes this (device_set_tf32)
    CUBLAS_CHECK(cublasSetMathMode(cuda_cublas, CUBLAS_DEFAULT_MATH));
    cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
    snprintf(name, sizeof(name), "%s (GPU %d of %d on this node)", prop.name, dev, count);
    return name;
}

// --tf32 (device.h). CUBLAS_TF32_TENSOR_OP_MATH (cublas_api.h: "allow
// accelerating single precision routines using TF32 tensor cores") lets
// cublasSgemm and cublasSgemmStridedBatched round their inputs to TF32 (a
// 10-bit mantissa) and multiply on tensor cores (sm_80 and later), summing
// in fp32; CUBLAS_DEFAULT_MATH keeps them full fp32. The mode belongs to the
// handle, so every later cuBLAS call of this rank follows it, the matmul
// peak's included (report_matmul_peak runs after this): MFU is then
// measured against the TF32 rate.
extern "C" const char* device_set_tf32(int on) {
    CUBLAS_CHECK(cublasSetMathMode(cuda_cublas, on ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH));
    return NULL;
}

// The device's waits (copies, allocations, frees, the clocks' reads) all
// come through device_synchronize: device.h's device_host_waits counts them.
static long host_waits = 0;
extern "C" long device_host_waits(void) { return host_waits; }

// Waits for everything queued on the compute stream (which includes waiting
// for the communication that comm_wait made it depend on).
extern "C" void device_synchronize(void) {
    host_waits++;
    if (cuda_compute_wait) cuda_compute_wait();
    else CUDA_CHECK(cudaStreamSynchronize(cuda_compute_stream));
}
