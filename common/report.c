// report.c: step lines, JSONL records, the gathered summary.
#include "report.h"

#include <errno.h>
#include <stdarg.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <mpi.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "comm.h"
#include "comm_stats.h"
#include "errors.h"
#include "memory.h"
#include "optime.h"
#include "matmul_peak.h"
#include "runtime.h"
#include "watchdog.h"
#include "rank.h"

const char* jsonl_open(JsonLog* log, const char* path, char* msg, size_t msg_len) {
    log->f = NULL;
    log->path = path;
    if (!path || world_rank() != 0) return NULL;
    // Opened without truncating, then locked: a second run given the same
    // log fails here instead of interleaving its records with the first's.
    // Without waiting: a pipe that no process reads would block open() for
    // ever, where no --timeout sees it (then the log is written blocking).
    int fd = open(path, O_WRONLY | O_CREAT | O_NONBLOCK, 0644);
    if (fd < 0 && errno == ENXIO) {
        snprintf(msg, msg_len, "cannot write log file '%s': it is a pipe that no process reads; start its reader first, "
                 "or give --log a file", path);
        return msg;
    }
    if (fd < 0) {
        snprintf(msg, msg_len, "cannot write log file '%s': %s", path, strerror(errno));
        return msg;
    }
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        close(fd);
        snprintf(msg, msg_len, "log file '%s' is being written by another run: give each run its own --log", path);
        return msg;
    }
    struct stat st;  // truncate a regular file (not /dev/stdout or a pipe)
    int regular = fstat(fd, &st) == 0 && S_ISREG(st.st_mode);
    log->good = regular ? 0 : -1;
    if ((regular && ftruncate(fd, 0) != 0) || !(log->f = fdopen(fd, "w"))) {
        snprintf(msg, msg_len, "cannot write log file '%s': %s", path, strerror(errno));
        close(fd);
        return msg;
    }
    return NULL;
}

// A log that cannot be written (a full disk, a vanished directory) ends the
// run: a run that exits 0 with an empty log would look like a success. Only
// rank 0 writes, so it aborts the job (every rank exits non-zero).
// The message is the user's to act on (a full disk), not a bug's: an
// "error:" line like every refusal, then the whole job ends.
static void log_failed(const char* doing, const char* path) {
    fprintf(stderr, "error: %s the log file '%s' failed: %s (free space, or give --log another place)\n", doing, path,
            strerror(errno));
    fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
}

// A failed write leaves no half record behind: a regular file is cut back
// to its last whole one (and its descriptor closed, so that no flush at the
// exit appends the rest), which JSONL readers can still read.
static void check_log(JsonLog* log, int ok) {
    if (ok && fflush(log->f) == 0 && !ferror(log->f)) {
        if (log->good >= 0) log->good = ftell(log->f);
        return;
    }
    int err = errno;
    if (log->good >= 0 && ftruncate(fileno(log->f), log->good) == 0) close(fileno(log->f));
    errno = err;
    log_failed("writing", log->path);
}

// Rank 0's writes of a record are a marked wait (watchdog.h), as a message
// is: a --log pipe whose reader stopped reading blocks rank 0 there, its
// peers wait for it in their next collective, and the watchdog ends the
// job naming the write instead of letting it hang (a write to a file ends).
static void log_wait_enter(void) { watchdog_enter("write to --log", "", -1); }

void jsonl_close(JsonLog* log) {
    if (log->f && fclose(log->f) != 0) log_failed("closing", log->path);
    log->f = NULL;
}

// A JSON number, or null for inf and NaN (JSON has no such numbers).
static void json_number(char* out, size_t len, const char* fmt, double x) {
    if (isfinite(x))
        snprintf(out, len, fmt, x);
    else
        snprintf(out, len, "null");
}

void report_step(JsonLog* log, int step, int steps, float loss, float norm, double ms,
                 double tokens_per_s) {
    report_step_extra(log, step, steps, loss, norm, ms, tokens_per_s, NULL);
}

void report_step_extra(JsonLog* log, int step, int steps, float loss, float norm, double ms,
                       double tokens_per_s, const char* extra_json) {
    // Divergence stops the run on every rank before anything is logged or
    // saved: a NaN model must not be written over a good checkpoint.
    static float last_loss = NAN;
    static int last_step = -1;
    watchdog_set_step(step + 1);  // a wait from here on belongs to the next step
    char msg[512];
    int diverged = !isfinite(loss) || !isfinite(norm);
    if (diverged) {
        char last[128] = "the first step of this run";  // its loss may be finite: the norm is not
        if (last_step >= 0) snprintf(last, sizeof(last), "the last finite loss was %.6f at step %d", last_loss, last_step);
        snprintf(msg, sizeof(msg), "training diverged at step %d: loss %g, gradient norm %g (%s); the diverged state was not saved: lower --lr or keep --clip on",
                 step, loss, norm, last);
    }
    fail_if_any(diverged, msg);
    last_loss = loss;
    last_step = step;
    if (world_rank() != 0) return;
    // the step index as the JSONL record has it: 0 .. steps-1
    printf("step %4d/%d | loss %.6f | norm %7.4f | %8.2f ms | %9.0f tok/s\n", step, steps,
           loss, norm, ms, tokens_per_s);
    fflush(stdout);
    if (log->f) {
        log_wait_enter();
        int ok = fprintf(log->f,
                         "{\"type\":\"step\",\"step\":%d,\"loss\":%.7f,\"norm\":%.6f,\"ms\":%.3f,"
                         "\"tokens_per_s\":%.1f%s%s}\n",
                         step, loss, norm, ms, tokens_per_s, extra_json ? "," : "",
                         extra_json ? extra_json : "") > 0;
        check_log(log, ok);
        watchdog_leave();
    }
}

void report_val(JsonLog* log, int step, float val_loss) {
    if (world_rank() != 0) return;
    // after step `step` (0-based, as the record); -1: before any step (--steps 0)
    if (step < 0) printf("before training | val loss %.6f\n", val_loss);
    else printf("step %4d | val loss %.6f\n", step, val_loss);
    fflush(stdout);
    if (log->f) {
        char v[64];
        json_number(v, sizeof(v), "%.7f", val_loss);
        log_wait_enter();
        check_log(log, fprintf(log->f, "{\"type\":\"val\",\"step\":%d,\"val_loss\":%s}\n", step, v) > 0);
        watchdog_leave();
    }
}

// Writes s as a JSON string (quotes, backslashes and control characters escaped).
static int json_string(FILE* f, const char* s) {
    int ok = fputc('"', f) != EOF;
    for (const unsigned char* p = (const unsigned char*)s; ok && *p; p++) {
        if (*p == '"' || *p == '\\')
            ok = fprintf(f, "\\%c", *p) > 0;
        else if (*p < 0x20)
            ok = fprintf(f, "\\u%04x", *p) > 0;
        else
            ok = fputc(*p, f) != EOF;
    }
    return ok && fputc('"', f) != EOF;
}

// Where the matmul peak came from, for the summary: "measured", "flag", or
// NULL when the program set RunSummary.peak_gflops by other means
static const char* peak_source;

double report_matmul_peak(double given_gflops) {
    peak_source = given_gflops > 0 ? "flag" : "measured";
    return given_gflops > 0 ? given_gflops : measure_matmul_gflops();
}

// The widths of RunFigures' rows: peak bytes per category, their total and
// the matmul peak; calls, bytes and bus bytes per (collective, slot), then
// the wait and progress seconds; ms per step per (op kind, pass), then
// comm wait, comm progress and the step.
#define MEM_WIDTH (MEM_NUM_CATEGORIES + 2)
#define COMM_WIDTH (NUM_COLLECTIVES * COMM_MAX_SLOTS * 3 + 2)
#define OP_WIDTH (NUM_OP_KINDS * NUM_OP_PASSES + 3)

void report_gather(RunFigures* g, const Mesh* mesh, double peak_gflops) {
    int n = mesh->world_size, rank = mesh->rank;
    g->n = n;
    // every rank's peak bytes per category, plus its total and its matmul peak
    double mine[MEM_WIDTH];
    for (int c = 0; c < MEM_NUM_CATEGORIES; c++) mine[c] = (double)mem_peak(c);
    mine[MEM_NUM_CATEGORIES] = (double)mem_peak_total();
    mine[MEM_NUM_CATEGORIES + 1] = peak_gflops;
    int width = MEM_WIDTH;
    double* all = rank == 0 ? xmalloc((size_t)n * width * sizeof(double)) : NULL;
    MPI_CHECK(MPI_Gather(mine, width, MPI_DOUBLE, all, width, MPI_DOUBLE, 0, MPI_COMM_WORLD));
    // every rank's communication counts: calls, bytes, bus bytes per
    // collective and counter slot (axes, world, groups: every slot, so every
    // rank sends the same width), then the seconds it waited on
    // communication and the seconds it spent driving non-blocking communication
    int ncomm = COMM_WIDTH;
    double* comm_mine = xcalloc((size_t)ncomm, sizeof(double));
    for (int c = 0; c < NUM_COLLECTIVES; c++)
        for (int a = 0; a < comm_num_slots(); a++) {
            CommCount k = comm_count((Collective)c, a);
            double* slot = comm_mine + (c * COMM_MAX_SLOTS + a) * 3;
            slot[0] = k.calls;
            slot[1] = k.bytes;
            slot[2] = k.bus_bytes;
        }
    comm_mine[ncomm - 2] = comm_wait_seconds();
    comm_mine[ncomm - 1] = comm_progress_seconds();
    double* comm_all = rank == 0 ? xmalloc(sizeof(double) * ncomm * n) : NULL;
    MPI_CHECK(MPI_Gather(comm_mine, ncomm, MPI_DOUBLE, comm_all, ncomm, MPI_DOUBLE, 0, MPI_COMM_WORLD));
    free(comm_mine);
    // every rank's milliseconds per timed step in each op kind and pass,
    // then in communication (wait, progress), then its own step: the
    // per-op breakdown
    int nop = OP_WIDTH;
    double op_mine[OP_WIDTH];
    for (int k = 0; k < NUM_OP_KINDS; k++)
        for (int p = 0; p < NUM_OP_PASSES; p++) op_mine[k * NUM_OP_PASSES + p] = optime_ms_per_step(k, p);
    op_mine[nop - 3] = optime_comm_wait_ms_per_step();
    op_mine[nop - 2] = optime_comm_progress_ms_per_step();
    op_mine[nop - 1] = optime_step_ms();
    double* op_all = rank == 0 ? xmalloc(sizeof(double) * nop * n) : NULL;
    MPI_CHECK(MPI_Gather(op_mine, nop, MPI_DOUBLE, op_all, nop, MPI_DOUBLE, 0, MPI_COMM_WORLD));
    g->mem = all;
    g->comm = comm_all;
    g->op = op_all;
}

void report_summary(JsonLog* log, const Mesh* mesh, const RunSummary* s) {
    RunFigures g;
    report_gather(&g, mesh, s->peak_gflops);
    report_summary_gathered(log, mesh, s, &g);
}

void report_summary_gathered(JsonLog* log, const Mesh* mesh, const RunSummary* s, RunFigures* g) {
    int n = g->n, width = MEM_WIDTH, ncomm = COMM_WIDTH, nop = OP_WIDTH;
    double *all = g->mem, *comm_all = g->comm, *op_all = g->op;
    g->mem = g->comm = g->op = NULL;
    if (mesh->rank != 0) return;

    double peak_sum = 0.0;
    for (int r = 0; r < n; r++) peak_sum += all[(size_t)r * width + MEM_NUM_CATEGORIES + 1];
    double mfu = peak_sum > 0 ? s->tokens_per_s * s->flops_per_token / (peak_sum * 1e9) : 0.0;
    char shape[128];
    mesh_describe(mesh, shape, sizeof(shape));

    printf("\n%s | %zu parameters | %d x %d tokens per step\n", s->model, s->num_params, s->batch, s->seq);
    // the peak is the sum of every rank's, measured or given: say which
    const char* peak_what = !peak_source                   ? "matmul peak"
                            : !strcmp(peak_source, "flag") ? "matmul peak given by --peak-gflops"
                                                           : "measured matmul peak";
    // a rank's peak (--peak-gflops is one rank's): the sum over n ranks said as such
    char ranks[64] = "";
    double first = all[MEM_NUM_CATEGORIES + 1];
    int equal = 1;
    for (int r = 1; r < n; r++) equal &= all[(size_t)r * width + MEM_NUM_CATEGORIES + 1] == first;
    if (n > 1 && equal) snprintf(ranks, sizeof(ranks), " (%d ranks x %.1f)", n, first);
    else if (n > 1) snprintf(ranks, sizeof(ranks), " (summed over %d ranks)", n);
    printf("throughput: %.1f ms/step, %.0f tokens/s, %.2f GFLOP/s, MFU %.1f%% of %.1f GFLOP/s %s%s\n",
           s->ms_per_step, s->tokens_per_s, s->tokens_per_s * s->flops_per_token / 1e9, 100.0 * mfu, peak_sum,
           peak_what, ranks);
    if (mfu > 1.0 && peak_source && !strcmp(peak_source, "measured"))  // while other jobs held the cores
        printf("note: MFU above 100%%: the measured peak (its denominator) is below what the steps reached, so it was "
               "measured on a busy machine; give one with --peak-gflops (build/roofline prints it on a quiet one)\n");
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
        log_wait_enter();
        fprintf(f, "{\"type\":\"summary\",\"chapter\":%d,\"world_size\":%d,\"mesh\":{", s->chapter, n);
        for (int a = 0; a < NUM_AXES; a++)
            fprintf(f, "%s\"%s\":%d", a ? "," : "", mesh_axis_name(a), mesh->size[a]);
        fprintf(f, "},\"mesh_shape\":\"%s\",\"model\":", shape);
        json_string(f, s->model);
        char final_loss[64], val_loss[64];
        json_number(final_loss, sizeof(final_loss), "%.7f", s->final_loss);
        json_number(val_loss, sizeof(val_loss), "%.7f", s->val_loss);
        fprintf(f, ",\"params\":%zu,\"batch\":%d,\"seq\":%d,"
                   "\"steps\":%d,\"ms_per_step\":%.3f,\"tokens_per_s\":%.1f,\"flops_per_token\":%.0f,"
                   "\"peak_gflops\":%.2f,\"mfu\":%.5f,\"final_loss\":%s",
                s->num_params, s->batch, s->seq, s->steps, s->ms_per_step,
                s->tokens_per_s, s->flops_per_token, peak_sum, mfu, final_loss);
        if (peak_source) fprintf(f, ",\"peak_source\":\"%s\"", peak_source);
        if (!(s->val_loss < 0)) fprintf(f, ",\"val_loss\":%s", val_loss);
        if (s->has_comm_ms)
            fprintf(f, ",\"comm_wait_ms_per_step\":%.3f,\"comm_progress_ms_per_step\":%.3f", s->comm_wait_ms_per_step,
                    s->comm_progress_ms_per_step);
        // peak bytes: one array per category, one entry per rank
        fprintf(f, ",\"peak_bytes\":{");
        for (int c = 0; c <= MEM_NUM_CATEGORIES; c++) {
            fprintf(f, "%s\"%s\":[", c ? "," : "", c < MEM_NUM_CATEGORIES ? mem_category_name(c) : "total");
            for (int r = 0; r < n; r++) fprintf(f, "%s%.0f", r ? "," : "", all[(size_t)r * width + c]);
            fprintf(f, "]");
        }
        fprintf(f, "}");
        // communication: only the (collective, slot) pairs some rank used; a
        // group over several axes is its own key ("dp+cp") beside the axes
        fprintf(f, ",\"comm\":{");
        int first_coll = 1;
        for (int c = 0; c < NUM_COLLECTIVES; c++) {
            int first_axis = 1;
            for (int a = 0; a < comm_num_slots(); a++) {
                double used = 0.0;
                for (int r = 0; r < n; r++) used += comm_all[(size_t)r * ncomm + (c * COMM_MAX_SLOTS + a) * 3];
                if (used == 0.0) continue;
                if (first_axis) fprintf(f, "%s\"%s\":{", first_coll ? "" : ",", collective_name((Collective)c));
                fprintf(f, "%s\"%s\":{", first_axis ? "" : ",", comm_axis_name(a));
                const char* fields[3] = {"calls", "bytes", "bus_bytes"};
                for (int k = 0; k < 3; k++) {
                    fprintf(f, "%s\"%s\":[", k ? "," : "", fields[k]);
                    for (int r = 0; r < n; r++)
                        fprintf(f, "%s%.0f", r ? "," : "", comm_all[(size_t)r * ncomm + (c * COMM_MAX_SLOTS + a) * 3 + k]);
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
        // which implementation ran the collectives, and (rank 0) how many
        // chapter 1's code ran: --comm hand must show a count above 0
        fprintf(f, ",\"comm_impl\":\"%s\",\"hand_collectives\":%ld", comm_impl_name(), comm_hand_collectives());
        // "op_ms_per_step": {"matmul_fwd": [rank 0, rank 1, ...], ..., "comm_wait": [...],
        // "comm_progress": [...], "step": [...]}
        fprintf(f, ",\"op_ms_per_step\":{");
        for (int i = 0; i < nop; i++) {
            char name[64];
            const char* tail[3] = {"comm_wait", "comm_progress", "step"};
            if (i < nop - 3)
                snprintf(name, sizeof(name), "%s_%s", optime_kind_name(i / NUM_OP_PASSES),
                         i % NUM_OP_PASSES == OP_FWD ? "fwd" : "bwd");
            else
                snprintf(name, sizeof(name), "%s", tail[i - (nop - 3)]);
            fprintf(f, "%s\"%s\":[", i ? "," : "", name);
            for (int r = 0; r < n; r++) fprintf(f, "%s%.3f", r ? "," : "", op_all[(size_t)r * nop + i]);
            fprintf(f, "]");
        }
        fprintf(f, "}");
        if (s->extra_json && s->extra_json[0]) fprintf(f, ",%s", s->extra_json);
        check_log(log, fprintf(f, "}\n") > 0);
        watchdog_leave();
    }
    free(all);
    free(comm_all);
    free(op_all);
}

// ---------------------------------------------------------------- a chapter's own JSON fields

// Appends printf-formatted text, growing the buffer as needed.
static void json_printf(JsonBuf* b, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
static void json_printf(JsonBuf* b, const char* fmt, ...) {
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        size_t room = b->cap - b->len;
        int n = vsnprintf(b->s ? b->s + b->len : NULL, b->s ? room : 0, fmt, ap);
        va_end(ap);
        CHECK(n >= 0, "formatting a JSON field failed");
        if (b->s && (size_t)n < room) {
            b->len += (size_t)n;
            return;
        }
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + (size_t)n + 1) cap *= 2;
        char* s = xmalloc(cap);
        if (b->s) memcpy(s, b->s, b->len + 1);
        else s[0] = '\0';
        free(b->s);
        b->s = s;
        b->cap = cap;
    }
}

// ,"key": (the comma only between fields)
static void json_key(JsonBuf* b, const char* key) { json_printf(b, "%s\"%s\":", b->len ? "," : "", key); }

// Formatted straight into the buffer: "%.3f" of a huge figure is hundreds of digits.
static void json_double_value(JsonBuf* b, double v, const char* fmt) {
    if (isfinite(v)) json_printf(b, fmt, v);
    else json_printf(b, "null");
}

void json_add_int(JsonBuf* b, const char* key, long long v) {
    json_key(b, key);
    json_printf(b, "%lld", v);
}

void json_add_double(JsonBuf* b, const char* key, double v, const char* fmt) {
    json_key(b, key);
    json_double_value(b, v, fmt);
}

void json_add_string(JsonBuf* b, const char* key, const char* v) {
    json_key(b, key);
    json_printf(b, "\"");
    for (const unsigned char* p = (const unsigned char*)v; *p; p++) {
        if (*p == '"' || *p == '\\') json_printf(b, "\\%c", *p);
        else if (*p < 0x20) json_printf(b, "\\u%04x", *p);
        else json_printf(b, "%c", *p);
    }
    json_printf(b, "\"");
}

void json_add_hex64(JsonBuf* b, const char* key, uint64_t v) {
    json_key(b, key);
    json_printf(b, "\"%016" PRIx64 "\"", v);
}

void json_add_bool(JsonBuf* b, const char* key, int v) {
    json_key(b, key);
    json_printf(b, "%s", v ? "true" : "false");
}

void json_add_int_array(JsonBuf* b, const char* key, const int* v, int n) {
    json_key(b, key);
    json_printf(b, "[");
    for (int i = 0; i < n; i++) json_printf(b, "%s%d", i ? "," : "", v[i]);
    json_printf(b, "]");
}

void json_add_long_array(JsonBuf* b, const char* key, const long* v, int n) {
    json_key(b, key);
    json_printf(b, "[");
    for (int i = 0; i < n; i++) json_printf(b, "%s%ld", i ? "," : "", v[i]);
    json_printf(b, "]");
}

void json_add_double_array(JsonBuf* b, const char* key, const double* v, int n, const char* fmt) {
    json_key(b, key);
    json_printf(b, "[");
    for (int i = 0; i < n; i++) {
        if (i) json_printf(b, ",");
        json_double_value(b, v[i], fmt);
    }
    json_printf(b, "]");
}

void json_add_long_matrix(JsonBuf* b, const char* key, const long* v, int rows, int cols) {
    json_key(b, key);
    json_printf(b, "[");
    for (int r = 0; r < rows; r++) {
        json_printf(b, "%s[", r ? "," : "");
        for (int c = 0; c < cols; c++) json_printf(b, "%s%ld", c ? "," : "", v[(size_t)r * cols + c]);
        json_printf(b, "]");
    }
    json_printf(b, "]");
}

const char* json_fields(const JsonBuf* b) { return b->s ? b->s : ""; }

void json_clear(JsonBuf* b) {
    b->len = 0;
    if (b->s) b->s[0] = '\0';
}

void report_record(JsonLog* log, const char* type, const JsonBuf* fields) {
    if (!log || !log->f) return;
    const char* f = json_fields(fields);
    log_wait_enter();
    check_log(log, fprintf(log->f, "{\"type\":\"%s\"%s%s}\n", type, *f ? "," : "", f) > 0);
    watchdog_leave();
}

void json_free(JsonBuf* b) {
    free(b->s);
    *b = (JsonBuf){0};
}
