// matmul_peak.c: the measured matmul rate (matmul_peak.h).
#include "matmul_peak.h"

#include "device.h"
#include "device_clock.h"
#include "memory.h"
#include "ops.h"

// Each call is a span of the device's clock (device_clock.h): on CUDA
// events on the compute stream around the sgemm, so neither the launch nor
// the host's wait is counted in; on the CPU the host clock around the call.
static void run_product(MatmulProduct product, float* out, const float* inp, const float* w, int N, int C, int OC) {
    if (product == MATMUL_BLAS) matmul_forward(out, inp, w, NULL, N, C, OC);
    else if (product == MATMUL_ROWWISE) matmul_forward_rowwise(out, inp, w, NULL, N, C, OC);
    else matmul_backward_input_rowwise(out, inp, w, N, OC, C);  // out (N, OC) += inp (N, C) @ w (C, OC)
}

double measure_product_gflops_at(MatmulProduct product, int N, int C, int OC) {
    float* inp = mem_alloc_floats((size_t)N * C, MEM_OTHER);
    float* w = mem_alloc_floats((size_t)OC * C, MEM_OTHER);
    float* out = mem_alloc_floats((size_t)N * OC, MEM_OTHER);
    run_product(product, out, inp, w, N, C, OC);  // warm-up: threads, caches, the library's plan
    device_synchronize();
    DeviceClock clock = {0};
    double best = 1e30;
    for (int r = 0; r < 5; r++) {
        device_clock_start(&clock);
        run_product(product, out, inp, w, N, C, OC);
        device_clock_stop(&clock);
        double dt = device_clock_seconds(&clock);  // waits for the span's end
        device_clock_reset(&clock);
        if (dt > 0 && dt < best) best = dt;
    }
    device_clock_free(&clock);
    mem_free(inp);
    mem_free(w);
    mem_free(out);
    mem_reset_peaks();
    return 2.0 * N * (double)C * OC / best / 1e9;
}

double measure_matmul_gflops_at(int N, int C, int OC) { return measure_product_gflops_at(MATMUL_BLAS, N, C, OC); }

double measure_matmul_gflops_sized(int* size) {
    // square matmuls from 1536 up: big enough to reach a CPU library's peak
    // in a fraction of a second; a device that does one in under 5 ms (a
    // GPU) gets larger ones, doubling up to 6144, since its library reaches
    // its rate only with more work per call. The best rate of the sizes.
    double best = 0.0;
    int best_n = 1536;
    for (int n = 1536; n <= 6144; n *= 2) {
        double g = measure_matmul_gflops_at(n, n, n);
        if (g > best) best = g, best_n = n;
        if (2.0 * n * (double)n * n / (g * 1e9) > 0.005) break;
    }
    if (size) *size = best_n;
    return best;
}

double measure_matmul_gflops(void) { return measure_matmul_gflops_sized(NULL); }
