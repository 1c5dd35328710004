// report.c: step lines, JSONL records, the gathered summary.
#include "report.h"

#include <errno.h>
#include <mpi.h>
#include <stdlib.h>
#include <string.h>

#include "comm.h"
#include "common.h"
#include "memory.h"

const char* jsonl_open(JsonLog* log, const char* path, char* msg, size_t msg_len) {
    log->f = NULL;
    if (!path || world_rank() != 0) return NULL;
    log->f = fopen(path, "w");
    if (!log->f) {
        snprintf(msg, msg_len, "cannot write log file '%s': %s", path, strerror(errno));
        return msg;
    }
    return NULL;
}

void jsonl_close(JsonLog* log) {
    if (log->f) fclose(log->f);
    log->f = NULL;
}

void report_step(JsonLog* log, int step, int steps, float loss, float norm, double ms,
                 double tokens_per_s) {
    if (world_rank() != 0) return;
    // the step index as the JSONL record has it: 0 .. steps-1
    printf("step %4d/%d | loss %.6f | norm %7.4f | %8.2f ms | %9.0f tok/s\n", step, steps,
           loss, norm, ms, tokens_per_s);
    fflush(stdout);
    if (log->f) {
        fprintf(log->f,
                "{\"type\":\"step\",\"step\":%d,\"loss\":%.7f,\"norm\":%.6f,\"ms\":%.3f,"
                "\"tokens_per_s\":%.1f}\n",
                step, loss, norm, ms, tokens_per_s);
        fflush(log->f);
    }
}

void report_val(JsonLog* log, int step, float val_loss) {
    if (world_rank() != 0) return;
    // after step `step` (0-based, as the record); -1: before any step (--steps 0)
    if (step < 0) printf("before training | val loss %.6f\n", val_loss);
    else printf("step %4d | val loss %.6f\n", step, val_loss);
    fflush(stdout);
    if (log->f) {
        fprintf(log->f, "{\"type\":\"val\",\"step\":%d,\"val_loss\":%.7f}\n", step, val_loss);
        fflush(log->f);
    }
}

void report_summary(JsonLog* log, const Mesh* mesh, const RunSummary* s) {
    int n = mesh->world_size, rank = mesh->rank;
    // every rank's peak bytes per category, plus its total and its matmul peak
    double mine[MEM_NUM_CATEGORIES + 2];
    for (int c = 0; c < MEM_NUM_CATEGORIES; c++) mine[c] = (double)mem_peak(c);
    mine[MEM_NUM_CATEGORIES] = (double)mem_peak_total();
    mine[MEM_NUM_CATEGORIES + 1] = s->peak_gflops;
    int width = MEM_NUM_CATEGORIES + 2;
    double* all = rank == 0 ? xmalloc((size_t)n * width * sizeof(double)) : NULL;
    MPI_CHECK(MPI_Gather(mine, width, MPI_DOUBLE, all, width, MPI_DOUBLE, 0, MPI_COMM_WORLD));
    // every rank's communication counts: calls, bytes, bus bytes per
    // collective and axis, then the seconds it waited on communication and
    // the seconds it spent driving non-blocking communication
    int ncomm = NUM_COLLECTIVES * COMM_NUM_AXES * 3 + 2;
    double* comm_mine = xmalloc(sizeof(double) * ncomm);
    for (int c = 0; c < NUM_COLLECTIVES; c++)
        for (int a = 0; a < COMM_NUM_AXES; a++) {
            CommCount k = comm_count((Collective)c, a);
            double* slot = comm_mine + (c * COMM_NUM_AXES + a) * 3;
            slot[0] = k.calls;
            slot[1] = k.bytes;
            slot[2] = k.bus_bytes;
        }
    comm_mine[ncomm - 2] = comm_wait_seconds();
    comm_mine[ncomm - 1] = comm_progress_seconds();
    double* comm_all = rank == 0 ? xmalloc(sizeof(double) * ncomm * n) : NULL;
    MPI_CHECK(MPI_Gather(comm_mine, ncomm, MPI_DOUBLE, comm_all, ncomm, MPI_DOUBLE, 0, MPI_COMM_WORLD));
    free(comm_mine);
    if (rank != 0) return;

    double peak_sum = 0.0;
    for (int r = 0; r < n; r++) peak_sum += all[(size_t)r * width + MEM_NUM_CATEGORIES + 1];
    double mfu = peak_sum > 0 ? s->tokens_per_s * s->flops_per_token / (peak_sum * 1e9) : 0.0;
    char shape[128];
    mesh_describe(mesh, shape, sizeof(shape));

    printf("\n%s | %zu parameters | %d x %d tokens per step\n", s->model, s->num_params, s->batch, s->seq);
    printf("throughput: %.1f ms/step, %.0f tokens/s, %.2f GFLOP/s, MFU %.1f%% of %.1f GFLOP/s measured matmul peak\n",
           s->ms_per_step, s->tokens_per_s, s->tokens_per_s * s->flops_per_token / 1e9, 100.0 * mfu, peak_sum);
    printf("peak memory per rank (MiB):\n  rank");
    for (int c = 0; c < MEM_NUM_CATEGORIES; c++) printf(" %11s", mem_category_name(c));
    printf(" %11s\n", "total");
    for (int r = 0; r < n; r++) {
        printf("  %4d", r);
        for (int c = 0; c <= MEM_NUM_CATEGORIES; c++)
            printf(" %11.3f", all[(size_t)r * width + c] / (1024.0 * 1024.0));
        printf("\n");
    }
    fflush(stdout);

    if (log->f) {
        FILE* f = log->f;
        fprintf(f, "{\"type\":\"summary\",\"chapter\":%d,\"world_size\":%d,\"mesh\":{", s->chapter, n);
        for (int a = 0; a < NUM_AXES; a++)
            fprintf(f, "%s\"%s\":%d", a ? "," : "", mesh_axis_name(a), mesh->size[a]);
        fprintf(f, "},\"mesh_shape\":\"%s\",\"model\":\"%s\",\"params\":%zu,\"batch\":%d,\"seq\":%d,"
                   "\"steps\":%d,\"ms_per_step\":%.3f,\"tokens_per_s\":%.1f,\"flops_per_token\":%.0f,"
                   "\"peak_gflops\":%.2f,\"mfu\":%.5f,\"final_loss\":%.7f",
                shape, s->model, s->num_params, s->batch, s->seq, s->steps, s->ms_per_step,
                s->tokens_per_s, s->flops_per_token, peak_sum, mfu, s->final_loss);
        if (s->val_loss >= 0) fprintf(f, ",\"val_loss\":%.7f", s->val_loss);
        // peak bytes: one array per category, one entry per rank
        fprintf(f, ",\"peak_bytes\":{");
        for (int c = 0; c <= MEM_NUM_CATEGORIES; c++) {
            fprintf(f, "%s\"%s\":[", c ? "," : "", c < MEM_NUM_CATEGORIES ? mem_category_name(c) : "total");
            for (int r = 0; r < n; r++) fprintf(f, "%s%.0f", r ? "," : "", all[(size_t)r * width + c]);
            fprintf(f, "]");
        }
        fprintf(f, "}");
        // communication: only the (collective, axis) pairs some rank used
        fprintf(f, ",\"comm\":{");
        int first_coll = 1;
        for (int c = 0; c < NUM_COLLECTIVES; c++) {
            int first_axis = 1;
            for (int a = 0; a < COMM_NUM_AXES; a++) {
                double used = 0.0;
                for (int r = 0; r < n; r++) used += comm_all[(size_t)r * ncomm + (c * COMM_NUM_AXES + a) * 3];
                if (used == 0.0) continue;
                if (first_axis) fprintf(f, "%s\"%s\":{", first_coll ? "" : ",", collective_name((Collective)c));
                fprintf(f, "%s\"%s\":{", first_axis ? "" : ",", comm_axis_name(a));
                const char* fields[3] = {"calls", "bytes", "bus_bytes"};
                for (int k = 0; k < 3; k++) {
                    fprintf(f, "%s\"%s\":[", k ? "," : "", fields[k]);
                    for (int r = 0; r < n; r++)
                        fprintf(f, "%s%.0f", r ? "," : "", comm_all[(size_t)r * ncomm + (c * COMM_NUM_AXES + a) * 3 + k]);
                    fprintf(f, "]");
                }
                fprintf(f, "}");
                first_axis = 0;
                first_coll = 0;
            }
            if (!first_axis) fprintf(f, "}");
        }
        fprintf(f, "},\"comm_wait_s\":[");
        for (int r = 0; r < n; r++) fprintf(f, "%s%.6f", r ? "," : "", comm_all[(size_t)r * ncomm + ncomm - 2]);
        fprintf(f, "],\"comm_progress_s\":[");
        for (int r = 0; r < n; r++) fprintf(f, "%s%.6f", r ? "," : "", comm_all[(size_t)r * ncomm + ncomm - 1]);
        fprintf(f, "]");
        if (s->extra_json && s->extra_json[0]) fprintf(f, ",%s", s->extra_json);
        fprintf(f, "}\n");
        fflush(f);
    }
    free(all);
    free(comm_all);
}
