// memory.c: allocation (memory.h). The tracking allocator remembers every
// live allocation (there are few: whole buffers, never per-tensor objects)
// with its size and category.
#include "memory.h"

#include "device.h"
#include "errors.h"

#include <stdlib.h>

typedef struct {
    void* ptr;
    size_t bytes;
    MemCategory category;
} Allocation;

static Allocation* live = NULL;
static int num_live = 0, cap_live = 0;
static size_t current[MEM_NUM_CATEGORIES], peak[MEM_NUM_CATEGORIES];
static size_t current_total = 0, peak_total = 0;

const char* mem_category_name(MemCategory c) {
    static const char* names[MEM_NUM_CATEGORIES] = {"params", "grads", "optimizer",
                                                    "activations", "comm", "other"};
    return (c >= 0 && c < MEM_NUM_CATEGORIES) ? names[c] : "?";
}

void* mem_alloc(size_t bytes, MemCategory category) {
    CHECK(category >= 0 && category < MEM_NUM_CATEGORIES, "bad memory category %d", category);
    // past the device's memory in all: refused, before malloc could overcommit
    // it and the zeroing meet the kernel's out-of-memory killer, which ends a
    // rank without a word (the count is this rank's buffers, not the node's)
    static size_t device_bytes = 0;
    if (!device_bytes) device_bytes = device_memory_bytes();
    int fits = bytes <= device_bytes && current_total <= device_bytes - bytes;
    void* p = fits ? device_raw_alloc(bytes) : NULL;
    // what to change: the batch's buffers grow with --batch x --seq, the model's with its size
    int batch_sized = category == MEM_ACTIVATIONS || category == MEM_COMM || category == MEM_OTHER;
    CHECK(p != NULL, "out of %s allocating %zu bytes (%.1f GiB) of %s (in use: %zu bytes): %s; build/plan gives a "
          "run's bytes per rank before it starts", device_memory_name(), bytes, (double)bytes / (1 << 30),
          mem_category_name(category), current_total,
          batch_sized ? "lower --batch or --seq, or split the batch over more ranks"
                      : "use a smaller model, or more ranks to shard it over");
    if (num_live == cap_live) {
        cap_live = cap_live ? 2 * cap_live : 64;
        Allocation* grown = xmalloc((size_t)cap_live * sizeof(Allocation));
        for (int i = 0; i < num_live; i++) grown[i] = live[i];
        free(live);
        live = grown;
    }
    live[num_live++] = (Allocation){p, bytes, category};
    current[category] += bytes;
    current_total += bytes;
    if (current[category] > peak[category]) peak[category] = current[category];
    if (current_total > peak_total) peak_total = current_total;
    return p;
}

float* mem_alloc_floats(size_t count, MemCategory category) {
    return (float*)mem_alloc(count * sizeof(float), category);
}

void mem_free(void* ptr) {
    if (!ptr) return;
    for (int i = 0; i < num_live; i++) {
        if (live[i].ptr == ptr) {
            current[live[i].category] -= live[i].bytes;
            current_total -= live[i].bytes;
            live[i] = live[--num_live];
            device_raw_free(ptr);
            return;
        }
    }
    FATAL("mem_free of a pointer mem_alloc did not return");
}

size_t mem_current(MemCategory c) { return current[c]; }
size_t mem_peak(MemCategory c) { return peak[c]; }
size_t mem_peak_total(void) { return peak_total; }

void mem_reset_peaks(void) {
    for (int c = 0; c < MEM_NUM_CATEGORIES; c++) peak[c] = current[c];
    peak_total = current_total;
}

// ---------------------------------------------------------------- host memory

void* xmalloc(size_t bytes) {
    void* p = malloc(bytes ? bytes : 1);
    CHECK(p != NULL, "out of host memory allocating %zu bytes", bytes);
    return p;
}

void* xcalloc(size_t count, size_t size) {
    void* p = calloc(count ? count : 1, size ? size : 1);
    CHECK(p != NULL, "out of host memory allocating %zu x %zu bytes", count, size);
    return p;
}
