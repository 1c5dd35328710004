// device.c: the CPU backend's "device" is host memory.
#include <cblas.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "device.h"
#include "errors.h"
#include "memory.h"


// device_host_waits (device.h): the calls that wait for the GPU on CUDA,
// counted here too, though they wait for nothing.
static long host_waits = 0;
long device_host_waits(void) { return host_waits; }

// 64-byte alignment: a cache line, and what AVX-512 loads like.
void* device_raw_alloc(size_t bytes) {
    host_waits++;
    size_t rounded = (bytes + 63) / 64 * 64;
    void* p = aligned_alloc(64, rounded ? rounded : 64);
    if (p) memset(p, 0, rounded);
    return p;
}

void device_raw_free(void* ptr) {
    host_waits++;
    free(ptr);
}

void device_environment(void) {}

const char* device_memory_name(void) { return "host memory"; }

size_t device_memory_bytes(void) { return (size_t)sysconf(_SC_PHYS_PAGES) * (size_t)sysconf(_SC_PAGESIZE); }

void mem_to_device(void* dst_device, const void* src_host, size_t bytes) {
    if (bytes) host_waits++;
    memcpy(dst_device, src_host, bytes);
}

void mem_to_host(void* dst_host, const void* src_device, size_t bytes) {
    if (bytes) host_waits++;
    memcpy(dst_host, src_device, bytes);
}

// An op has finished when it returns: queued is done.
void mem_to_device_queued(void* dst_device, const void* src_host, size_t bytes) {
    memcpy(dst_device, src_host, bytes);
}

void mem_to_host_queued(void* dst_host, const void* src_device, size_t bytes) {
    memcpy(dst_host, src_device, bytes);
}

void mem_zero(void* device_ptr, size_t bytes) { memset(device_ptr, 0, bytes); }

// The host is the device: a staging buffer is plain host memory (malloc,
// not memory.c's xmalloc: memory.c calls this file).
void* mem_alloc_host(size_t bytes) {
    void* p = malloc(bytes ? bytes : 1);
    if (!p) FATAL("out of host memory allocating a %zu-byte staging buffer", bytes);
    return p;
}
void mem_free_host(void* ptr) {
    if (ptr) host_waits++;
    free(ptr);
}

const char* device_init(int local_rank) {
    (void)local_rank;
    return "cpu";
}

const char* device_set_tf32(int on) {
    return on ? "--tf32 has no effect on the CPU backend: its matmuls are fp32 (CBLAS sgemm)" : NULL;
}

void device_synchronize(void) { host_waits++; }

void device_set_threads(int n) {
    omp_set_num_threads(n);
    openblas_set_num_threads(n);
}
