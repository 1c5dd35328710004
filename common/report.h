// report.h: what a run tells: one human line per step on stdout, JSONL records
// with --log, and the summary that gathers every rank's figures.
#ifndef REPORT_H
#define REPORT_H

#include <stdint.h>
#include <stdio.h>

#include "mesh.h"

typedef struct {
    FILE* f;           // rank 0's --log file, or NULL
    const char* path;  // its name, for messages
    long good;         // a regular file: its length after the last whole record (-1: a pipe, a terminal)
} JsonLog;

// Rank 0 opens path (NULL: no log). Returns NULL or a message.
const char* jsonl_open(JsonLog* log, const char* path, char* msg, size_t msg_len);
void jsonl_close(JsonLog* log);

// One training step: the human line and {"type":"step",...} (rank 0 writes).
// Both number the steps alike, from 0: "step    0/5" ... "step    4/5".
// Collective: every rank calls it with the same loss and norm. A non-finite
// loss or norm ends every rank with a message naming the step and the last
// finite loss, before anything of that step is logged. A failed log write
// ends the run too.
void report_step(JsonLog* log, int step, int steps, float loss, float norm, double ms,
                 double tokens_per_s);
// The same with a chapter's own fields appended to the step record
// ("\"k\":v,...", or NULL): other losses under their own names (chapter 7's
// "aux_loss"), never "loss".
void report_step_extra(JsonLog* log, int step, int steps, float loss, float norm, double ms,
                       double tokens_per_s, const char* extra_json);
// A validation loss after step s: {"type":"val","step":s,"val_loss":x} and
// "step    s | val loss x" (s = -1, before any step: "before training | ...").
// Rank 0 only.
void report_val(JsonLog* log, int step, float val_loss);

typedef struct {
    int chapter;
    const char* model;
    size_t num_params;
    int batch, seq, steps;
    double ms_per_step;        // mean over the timed steps
    double tokens_per_s;       // global tokens per second
    double flops_per_token;
    double peak_gflops;        // this rank's measured (or given) matmul peak
    float final_loss, val_loss;  // final_loss NAN: no step ran (null); val_loss < 0: none
    // rank 0's milliseconds per timed step blocked in communication and in
    // non-blocking starts and tests (the step clock's); written only when
    // has_comm_ms (the training loop, train.h, sets all three)
    double comm_wait_ms_per_step, comm_progress_ms_per_step;
    int has_comm_ms;
    const char* extra_json;    // a chapter's own fields, "\"k\":v,..." or NULL
} RunSummary;

// The matmul peak the summary's MFU divides by: given_gflops (--peak-gflops)
// when > 0, else measured on this rank now (measure_matmul_gflops, about a
// second). Remembers which, so the summary says where its peak came from.
double report_matmul_peak(double given_gflops);

// Collective: gathers every rank's peak bytes per category, matmul peak and
// communication counts (comm.h); rank 0 prints the memory table and MFU and
// writes {"type":"summary",...} with "peak_bytes" and "comm" arrays indexed by
// rank, and "peak_source": "measured" or "flag" (report_matmul_peak; absent
// when the peak came from neither).
// MFU = tokens/s * flops/token / (sum of the ranks' matmul peaks).
void report_summary(JsonLog* log, const Mesh* mesh, const RunSummary* s);

// report_summary in its two halves, for a caller that runs something between
// reading the counters and writing the record (the training loop's final
// validation: the summary's memory, communication and op times are the
// training's alone). report_gather is collective and reads every rank's
// figures now; report_summary_gathered prints and writes them (rank 0) and
// frees g.
typedef struct {
    int n;                       // ranks
    double *mem, *comm, *op;     // rank 0: (n, width) each; other ranks: NULL
} RunFigures;
void report_gather(RunFigures* g, const Mesh* mesh, double peak_gflops);
void report_summary_gathered(JsonLog* log, const Mesh* mesh, const RunSummary* s, RunFigures* g);

// ---------------------------------------------------------------- a chapter's own JSON fields
// "key":value pairs a chapter adds to a record (its summary fields, its step
// fields), built by these calls instead of by hand: keys as given, strings
// escaped, numbers that are not finite written as null (JSON has none).
// A zeroed JsonBuf is empty and ready; json_fields gives "k":v,"k2":v2 (no
// braces, "" when empty), which RunSummary.extra_json and report_step_extra
// take.
typedef struct {
    char* s;
    size_t len, cap;
} JsonBuf;
void json_add_int(JsonBuf* b, const char* key, long long v);
// fmt: one printf conversion of a double ("%.3f", "%g", "%.0f")
void json_add_double(JsonBuf* b, const char* key, double v, const char* fmt);
void json_add_string(JsonBuf* b, const char* key, const char* v);
// v as a string of 16 hex digits (a hash: JSON numbers stop at 2^53)
void json_add_hex64(JsonBuf* b, const char* key, uint64_t v);
void json_add_bool(JsonBuf* b, const char* key, int v);
void json_add_int_array(JsonBuf* b, const char* key, const int* v, int n);
void json_add_long_array(JsonBuf* b, const char* key, const long* v, int n);
void json_add_double_array(JsonBuf* b, const char* key, const double* v, int n, const char* fmt);
// v is (rows, cols) row-major: [[row 0], [row 1], ...]
void json_add_long_matrix(JsonBuf* b, const char* key, const long* v, int rows, int cols);
const char* json_fields(const JsonBuf* b);
void json_clear(JsonBuf* b);  // empty again, memory kept
void json_free(JsonBuf* b);

// One record of a kind of its own: {"type":"TYPE",FIELDS} on a line of the
// log (nothing without --log); a write that fails ends the run, as every
// record's does. Rank 0 only.
void report_record(JsonLog* log, const char* type, const JsonBuf* fields);

#endif
