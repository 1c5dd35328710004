// attention_bench: the two attentions of common/ops.h, forward + backward,
// timed in one process with the runs alternated, so that a shared machine's
// load falls on both alike.
//
//   build/attention_bench [--batch B] [--seq T] [--channels C] [--heads NH]
//                         [--reps N] [--threads N] [--log FILE.jsonl]
//
// "full" is attention_forward + attention_backward, which keep the
// (B, NH, T, T) probabilities (and take as much again as scratch for their
// gradient); "flash" is attention_flash_forward + attention_flash_backward,
// which keep out and the per-row log-sum-exp, B*T*NH floats. Defaults: the
// small preset's layer (C 384, 6 heads) at its default batch, 8 x 256.
// Each repetition runs full then flash, or flash then full on odd ones; the
// figures are the median over the repetitions (and the best, which a
// shared machine's noise moves less), and the process's CPU time of each
// (CLOCK_PROCESS_CPUTIME_ID: on a machine whose cores other jobs share, the
// time the op ran, not the time it waited for a core; with one thread the
// fairest of the three, with more it also counts threads spinning at
// barriers). Both results are compared, so a faster op that computes
// something else shows.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "args.h"
#include "atomic_file.h"
#include "device.h"
#include "errors.h"
#include "memory.h"
#include "ops.h"
#include "paths.h"
#include "runtime.h"

static double cpu_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void* a, const void* b) {
    double x = *(const double*)a, y = *(const double*)b;
    return (x > y) - (x < y);
}
static double median(double* x, int n) {
    qsort(x, (size_t)n, sizeof(double), cmp_double);
    return n % 2 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2]);
}
static double best(const double* x, int n) {
    double m = x[0];
    for (int i = 1; i < n; i++) m = x[i] < m ? x[i] : m;
    return m;
}

// max |a - b| / max |b| over n device floats
static double rel_diff(const float* a_dev, const float* b_dev, size_t n) {
    float* a = xmalloc(n * sizeof(float));
    float* b = xmalloc(n * sizeof(float));
    mem_to_host(a, a_dev, n * sizeof(float));
    mem_to_host(b, b_dev, n * sizeof(float));
    double d = 0.0, s = 0.0;
    for (size_t i = 0; i < n; i++) {
        d = fmax(d, fabs((double)a[i] - b[i]));
        s = fmax(s, fabs((double)b[i]));
    }
    free(a), free(b);
    return d / (s + 1e-30);
}

int main(int argc, char** argv) {
    int B = 8, T = 256, C = 384, NH = 6, reps = 9, threads = 0;
    const char* log_path = NULL;
    for (int i = 1; i < argc; i++) {
        const char* value = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(argv[i], "--help")) {
            printf("usage: %s [--batch B] [--seq T] [--channels C] [--heads NH] [--reps N] [--threads N] [--log FILE.jsonl]\n"
                   "times attention_forward + _backward (full: the (B, NH, T, T) probabilities) against\n"
                   "attention_flash_forward + _backward (O(T) memory), alternated; default the small\n"
                   "preset's layer, B 8 x T 256, C 384, 6 heads, 9 repetitions\n",
                   argv[0]);
            return 0;
        } else if (!strcmp(argv[i], "--batch")) {
            B = args_int_in("--batch", value, 1, 1 << 16), i++;
        } else if (!strcmp(argv[i], "--seq")) {
            T = args_int_in("--seq", value, 1, 1 << 16), i++;
        } else if (!strcmp(argv[i], "--channels")) {
            C = args_int_in("--channels", value, 1, 1 << 14), i++;
        } else if (!strcmp(argv[i], "--heads")) {
            NH = args_int_in("--heads", value, 1, 1 << 10), i++;
        } else if (!strcmp(argv[i], "--reps")) {
            reps = args_int_in("--reps", value, 1, 1000), i++;
        } else if (!strcmp(argv[i], "--threads")) {
            threads = args_int_in("--threads", value, 1, 1024), i++;
        } else if (!strcmp(argv[i], "--log")) {
            if (!value) {
                fprintf(stderr, "error: --log takes a file name\n");
                return 1;
            }
            log_path = value, i++;
        } else {
            fprintf(stderr, "error: unknown option '%s' (see --help)\n", argv[i]);
            return 1;
        }
    }
    if (C % NH) {
        fprintf(stderr, "error: --channels %d is not a multiple of --heads %d\n", C, NH);
        return 1;
    }
    char msg[ERROR_MAX];
    PathArg log_arg = {"--log", log_path};
    // now, not after the bench; a file renamed over its place (never a device)
    if (paths_check_writable(&log_arg, 0, msg, sizeof(msg)) ||
        (log_path && paths_check_regular("--log", log_path, "give a file name", msg, sizeof(msg)))) {
        fprintf(stderr, "error: %s\n", msg);
        return 1;
    }
    // every buffer below: the host copy, qkv, dqkv twice, out, dout, out twice, att and datt, lse
    double need = 4.0 * (4.0 * B * T * 3 * C + 3.0 * B * T * C + 2.0 * B * NH * (double)T * T + (double)B * T * NH);
    double machine = (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE);
    if (need > machine) {
        fprintf(stderr, "error: --batch %d --seq %d --channels %d --heads %d need %.1f GiB (the full attention's (B, NH, T, "
                "T) twice), more than this machine's %.1f GiB: lower --batch or --seq\n", B, T, C, NH, need / (1 << 30),
                machine / (1 << 30));
        return 1;
    }
    runtime_init(&argc, &argv);
    int nthreads = runtime_set_threads(threads);
    const char* device = device_init(runtime_local_rank());

    const size_t nqkv = (size_t)B * T * 3 * C, nout = (size_t)B * T * C;
    const size_t natt = (size_t)B * NH * T * T, nlse = (size_t)B * T * NH;
    float* h = xmalloc(nqkv * sizeof(float));
    unsigned s = 12345u;
    for (size_t i = 0; i < nqkv; i++) {  // uniform in [-1, 1): scores of a few units
        s = s * 1664525u + 1013904223u;
        h[i] = (float)((s >> 8) * (2.0 / 16777216.0) - 1.0);
    }
    float* qkv = mem_alloc_floats(nqkv, MEM_OTHER);
    float* dout = mem_alloc_floats(nout, MEM_OTHER);
    mem_to_device(qkv, h, nqkv * sizeof(float));
    mem_to_device(dout, h, nout * sizeof(float));
    free(h);
    float* out_full = mem_alloc_floats(nout, MEM_OTHER);
    float* att = mem_alloc_floats(natt, MEM_OTHER);
    float* datt = mem_alloc_floats(natt, MEM_OTHER);
    float* dqkv_full = mem_alloc_floats(nqkv, MEM_OTHER);
    float* out_flash = mem_alloc_floats(nout, MEM_OTHER);
    float* lse = mem_alloc_floats(nlse, MEM_OTHER);
    float* dqkv_flash = mem_alloc_floats(nqkv, MEM_OTHER);

    double* t[4];  // full fwd, full bwd, flash fwd, flash bwd
    double* cpu[2];  // full, flash: fwd + bwd, CPU time
    for (int k = 0; k < 4; k++) t[k] = xmalloc((size_t)reps * sizeof(double));
    for (int k = 0; k < 2; k++) cpu[k] = xmalloc((size_t)reps * sizeof(double));
    for (int r = -1; r < reps; r++) {  // r = -1: a warm-up of both, not counted
        for (int turn = 0; turn < 2; turn++) {
            int flash = (turn + (r & 1)) & 1;  // full first on even repetitions
            float* dqkv = flash ? dqkv_flash : dqkv_full;
            mem_zero(dqkv, nqkv * sizeof(float));
            device_synchronize();
            double c0 = cpu_seconds();
            double t0 = now_seconds();
            if (flash) attention_flash_forward(out_flash, lse, qkv, B, T, C, NH);
            else attention_forward(out_full, att, qkv, B, T, C, NH);
            device_synchronize();
            double t1 = now_seconds();
            if (flash) attention_flash_backward(dqkv, dout, qkv, out_flash, lse, B, T, C, NH);
            else attention_backward(dqkv, datt, dout, qkv, att, B, T, C, NH);
            device_synchronize();
            double t2 = now_seconds();
            double c2 = cpu_seconds();
            if (r >= 0) {
                cpu[flash][r] = (c2 - c0) * 1e3;
                t[2 * flash][r] = (t1 - t0) * 1e3;
                t[2 * flash + 1][r] = (t2 - t1) * 1e3;
            }
        }
    }
    double both[2][1000];
    for (int f = 0; f < 2; f++)
        for (int r = 0; r < reps; r++) both[f][r] = t[2 * f][r] + t[2 * f + 1][r];
    double med[4], min[4], med_both[2], min_both[2];
    for (int k = 0; k < 4; k++) min[k] = best(t[k], reps), med[k] = median(t[k], reps);
    for (int f = 0; f < 2; f++) min_both[f] = best(both[f], reps), med_both[f] = median(both[f], reps);
    double med_cpu[2];
    for (int f = 0; f < 2; f++) med_cpu[f] = median(cpu[f], reps);
    double d_out = rel_diff(out_flash, out_full, nout), d_grad = rel_diff(dqkv_flash, dqkv_full, nqkv);

    printf("attention, B %d x T %d, C %d, %d heads, on %s, %d thread(s), %d alternated repetitions\n", B, T,
           C, NH, device, nthreads, reps);
    printf("  ms (median, best)      forward          backward         both\n");
    printf("  full (B,NH,T,T) probs  %6.2f %6.2f    %6.2f %6.2f    %6.2f %6.2f\n", med[0], min[0], med[1],
           min[1], med_both[0], min_both[0]);
    printf("  flash (online softmax) %6.2f %6.2f    %6.2f %6.2f    %6.2f %6.2f\n", med[2], min[2], med[3],
           min[3], med_both[1], min_both[1]);
    printf("  flash / full, both:    %.3f (median), %.3f (best)\n", med_both[1] / med_both[0],
           min_both[1] / min_both[0]);
    printf("  CPU time, both (median): full %.2f ms, flash %.2f ms, flash / full %.3f\n", med_cpu[0],
           med_cpu[1], med_cpu[1] / med_cpu[0]);
    printf("  kept for backward: full %.1f MiB of probabilities (+ as much scratch), flash %.3f MiB of lse\n",
           natt * 4.0 / 1048576, nlse * 4.0 / 1048576);
    printf("  flash against full: out %.2g, dqkv %.2g (max difference / max value)\n", d_out, d_grad);
    if (log_path) {  // whole or not at all (atomic_file.h), and a failed write said
        AtomicFile a;
        int err = atomic_open(&a, log_path);
        if (err) {
            fprintf(stderr, "error: cannot write --log '%s': %s\n", log_path, strerror(err));
            return 1;
        }
        FILE* f = a.f;
        int ok = fprintf(f,
                "{\"type\":\"attention\",\"B\":%d,\"T\":%d,\"C\":%d,\"NH\":%d,\"threads\":%d,\"reps\":%d,"
                "\"full_fwd_ms\":%.3f,\"full_bwd_ms\":%.3f,\"flash_fwd_ms\":%.3f,\"flash_bwd_ms\":%.3f,"
                "\"full_ms\":%.3f,\"flash_ms\":%.3f,\"full_best_ms\":%.3f,\"flash_best_ms\":%.3f,"
                "\"ratio\":%.4f,\"full_cpu_ms\":%.3f,\"flash_cpu_ms\":%.3f,\"full_bytes\":%zu,\"flash_bytes\":%zu,\"out_diff\":%.3g,\"dqkv_diff\":%.3g}\n",
                B, T, C, NH, nthreads, reps, med[0], med[1], med[2], med[3], med_both[0], med_both[1],
                min_both[0], min_both[1], med_both[1] / med_both[0], med_cpu[0], med_cpu[1], natt * 4, nlse * 4, d_out, d_grad) > 0;
        if ((err = atomic_close(&a, ok))) {
            fprintf(stderr, "error: writing --log '%s' failed: %s\n", log_path, strerror(err));
            return 1;
        }
    }
    for (int k = 0; k < 4; k++) free(t[k]);
    for (int k = 0; k < 2; k++) free(cpu[k]);
    float* bufs[] = {qkv, dout, out_full, att, datt, dqkv_full, out_flash, lse, dqkv_flash};
    for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++) mem_free(bufs[i]);
    runtime_finalize();
    return 0;
}
