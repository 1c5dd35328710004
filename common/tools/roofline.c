// roofline: the two numbers that bound every op on this machine, measured
// through the course's own ops on one rank's device.
//
//   build/roofline [--threads N] [--tokens N] [--channels C]
//
// - the matmul peak: the best of a few 1536^3 sgemms (what the chapters'
//   MFU divides by), then matmul_forward at the four shapes of a block of a
//   model with C channels over N tokens (the small preset and its B 8 x T 256
//   by default), forward only; and the row-by-row products chapter 7's
//   experts use (matmul_forward_rowwise, matmul_backward_input_rowwise) at
//   the MLP's two shapes;
// - the copy bandwidth: ops_copy of 256 MiB, counted as bytes read plus
//   bytes written.
// Their ratio is the ridge point: an op that does fewer flops per byte it
// moves is bound by memory, one that does more by the matmul rate
// (docs/performance.md).
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "args.h"
#include "device.h"
#include "matmul_peak.h"
#include "memory.h"
#include "ops.h"
#include "runtime.h"

#define ROOF_REPS 5

// best of ROOF_REPS copies of n floats, in GB/s of bytes read plus written
static double roof_copy(size_t n) {
    float* src = mem_alloc_floats(n, MEM_OTHER);
    float* dst = mem_alloc_floats(n, MEM_OTHER);
    ops_copy(dst, src, n);  // warm-up: the pages of dst are touched once
    device_synchronize();
    double best = 1e30;
    for (int r = 0; r < ROOF_REPS; r++) {
        double t0 = now_seconds();
        ops_copy(dst, src, n);
        device_synchronize();
        double dt = now_seconds() - t0;
        if (dt < best) best = dt;
    }
    mem_free(src);
    mem_free(dst);
    return 2.0 * n * sizeof(float) / best / 1e9;
}

int main(int argc, char** argv) {
    int threads = 0, N = 8 * 256, C = 384;
    for (int i = 1; i < argc; i++) {
        const char* value = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(argv[i], "--help")) {
            printf("usage: %s [--threads N] [--tokens N] [--channels C]\n"
                   "prints the matmul peak, matmul_forward at a block's four shapes (N tokens, C channels;\n"
                   "default the small preset, 2048 tokens, 384 channels), the copy bandwidth and their ratio\n",
                   argv[0]);
            return 0;
        } else if (!strcmp(argv[i], "--threads")) {
            threads = args_int_in("--threads", value, 1, 1024), i++;
        } else if (!strcmp(argv[i], "--tokens")) {
            N = args_int_in("--tokens", value, 1, 1 << 20), i++;
        } else if (!strcmp(argv[i], "--channels")) {
            C = args_int_in("--channels", value, 1, 1 << 14), i++;
        } else {
            fprintf(stderr, "error: unknown option '%s' (see --help)\n", argv[i]);
            return 1;
        }
    }
    runtime_init(&argc, &argv);
    int n = runtime_set_threads(threads);
    const char* device = device_init(runtime_local_rank());
    // the largest shape's buffers (fc: N x C in, 4C x C weights, N x 4C out),
    // refused now with this tool's flags (mem_alloc's message names a chapter's)
    double need = 4.0 * (5.0 * N * C + 4.0 * C * C), have = (double)device_memory_bytes();
    if (need > have) {
        fprintf(stderr, "error: --tokens %d x --channels %d need %.1f GiB for the fc shape's buffers, more than this "
                "%s's %.1f GiB: lower --tokens or --channels\n", N, C, need / (1 << 30), device, have / (1 << 30));
        runtime_finalize();
        return 1;
    }

    int size = 0;
    double peak = measure_matmul_gflops_sized(&size);
    printf("roofline of one rank: %s, %d thread(s)\n", device, n);
    printf("  matmul peak, %d x %d x %d:       %8.1f GFLOP/s\n", size, size, size, peak);
    printf("  matmul_forward at a block's shapes, N %d tokens:\n", N);
    const char* names[4] = {"qkv", "attproj", "fc", "fcproj"};
    const int ins[4] = {C, C, C, 4 * C}, outs[4] = {3 * C, C, 4 * C, C};
    for (int k = 0; k < 4; k++)
        printf("    %-8s C %5d -> OC %5d:           %8.1f GFLOP/s\n", names[k], ins[k], outs[k],
               measure_matmul_gflops_at(N, ins[k], outs[k]));
    // chapter 7's experts multiply row by row (ops.h: each row's bits whatever
    // the rows beside it), at the MLP's two shapes, forward and d input
    printf("  the row-by-row products (chapter 7's experts), N %d tokens:\n", N);
    for (int k = 2; k < 4; k++)
        printf("    %-8s C %5d -> OC %5d: %6.1f forward, %6.1f d input GFLOP/s\n", names[k], ins[k], outs[k],
               measure_product_gflops_at(MATMUL_ROWWISE, N, ins[k], outs[k]),
               measure_product_gflops_at(MATMUL_ROWWISE_BACKWARD, N, outs[k], ins[k]));
    double bw = roof_copy((size_t)64 << 20);
    printf("  copy, 256 MiB (read + write):          %8.1f GB/s\n", bw);
    printf("  ridge point, peak / copy bandwidth:    %8.1f flop per byte\n", peak / bw);
    runtime_finalize();
    return 0;
}
