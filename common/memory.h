// memory.h: allocation. Device memory (host memory on the CPU backend)
// through the tracking allocator, and host memory for bookkeeping.
//
// Every device allocation of every chapter goes through mem_alloc with a
// category, so that each rank can report its peak bytes per category and the
// docs' memory formulas can be checked against what was really allocated.
#ifndef MEMORY_H
#define MEMORY_H

#include <stddef.h>

typedef enum {
    MEM_PARAMS,
    MEM_GRADS,
    MEM_OPTIMIZER,
    MEM_ACTIVATIONS,
    MEM_COMM,
    MEM_OTHER,
    MEM_NUM_CATEGORIES
} MemCategory;

// "params", "grads", "optimizer", "activations", "comm", "other"
const char* mem_category_name(MemCategory c);

// Device memory, zero-filled. Aborts with a message if the device is full.
void* mem_alloc(size_t bytes, MemCategory category);
float* mem_alloc_floats(size_t count, MemCategory category);
// On the CUDA backend a free waits for every stream first (cudaFree may
// synchronise the device): never free while a posted message waits for its
// peer (comm.h's comm_barrier has the same rule).
void mem_free(void* ptr);

// Bytes allocated now and at peak, per category and in total.
size_t mem_current(MemCategory c);
size_t mem_peak(MemCategory c);
size_t mem_peak_total(void);
void mem_reset_peaks(void);

// Copies between host memory and device memory, and zeroing on the device.
void mem_to_device(void* dst_device, const void* src_host, size_t bytes);
void mem_to_host(void* dst_host, const void* src_device, size_t bytes);
void mem_zero(void* device_ptr, size_t bytes);
// The same copies queued on the device's queue without waiting for it: the
// copy runs after the work queued before it and before the work queued
// after it, as a kernel does. The host side must be a staging buffer
// (mem_alloc_host) left untouched until the device has run the copy: after
// the next mem_to_host, mem_to_device or device_synchronize. Chapter 5's
// stages queue a step's tokens and losses this way, so they do not wait for
// the device once per microbatch. On the CPU a plain copy.
void mem_to_device_queued(void* dst_device, const void* src_host, size_t bytes);
void mem_to_host_queued(void* dst_host, const void* src_device, size_t bytes);

// malloc and calloc for host-side bookkeeping (not device memory), ending
// every rank with a message when the host is out of memory.
void* xmalloc(size_t bytes);
void* xcalloc(size_t count, size_t size);

// Host staging buffers: host memory that mem_to_device or mem_to_host copies
// to or from the device EVERY step (the batch's tokens, the per-token losses,
// the norm's scalar, chapter 7's routing plan), allocated once and reused.
// On CUDA they are page-locked (cudaMallocHost). The CUDA Runtime API's
// cudaMallocHost: the driver tracks such ranges and accelerates cudaMemcpy*
// on them, "much higher bandwidth than pageable memory obtained with
// functions such as malloc()"; its "API synchronization behavior" page: a
// copy from pageable memory is first staged by the driver into pinned
// memory (and may synchronize with the stream to do it). The cudaMallocHost
// page also warns that "allocating excessive amounts" of it "may degrade
// system performance, since it reduces the amount of memory available to
// the system for paging", and advises it sparingly, for staging areas: so
// large one-off buffers (a checkpoint's or a model file's parameters, their
// initialization) stay plain xmalloc. Not counted by mem_current / mem_peak
// (host memory, like xmalloc's). On the CPU backend: malloc and free. On
// CUDA, refused (FATAL) before device_init: cudaMallocHost would start a
// CUDA context on GPU 0 of every rank, and the block would count as pinned
// for that context only (cudaHostAlloc's cudaHostAllocPortable flag is what
// makes a block pinned for all). mem_free_host(NULL) does nothing.
void* mem_alloc_host(size_t bytes);
void mem_free_host(void* ptr);

#endif
