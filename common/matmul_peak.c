// matmul_peak.c: the measured matmul rate (matmul_peak.h).
#include "matmul_peak.h"

#include "device.h"
#include "memory.h"
#include "ops.h"
#include "runtime.h"

double measure_matmul_gflops_at(int N, int C, int OC) {
    float* inp = mem_alloc_floats((size_t)N * C, MEM_OTHER);
    float* w = mem_alloc_floats((size_t)OC * C, MEM_OTHER);
    float* out = mem_alloc_floats((size_t)N * OC, MEM_OTHER);
    matmul_forward(out, inp, w, NULL, N, C, OC);  // warm-up: threads, caches
    device_synchronize();
    double best = 1e30;
    for (int r = 0; r < 5; r++) {
        double t0 = now_seconds();
        matmul_forward(out, inp, w, NULL, N, C, OC);
        device_synchronize();
        double dt = now_seconds() - t0;
        if (dt < best) best = dt;
    }
    mem_free(inp);
    mem_free(w);
    mem_free(out);
    mem_reset_peaks();
    return 2.0 * N * (double)C * OC / best / 1e9;
}

double measure_matmul_gflops(void) {
    // square matmuls big enough to reach the library's peak, small enough to
    // take a fraction of a second
    return measure_matmul_gflops_at(1536, 1536, 1536);
}
