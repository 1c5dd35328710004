// device.h: what a backend provides underneath memory.h: raw allocation on
// the device. Only memory.c calls these; everything else uses mem_alloc.
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

#endif
