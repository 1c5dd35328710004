// report.h: what a run tells: one human line per step on stdout, JSONL records
// with --log, and the summary that gathers every rank's figures.
#ifndef REPORT_H
#define REPORT_H

#include <stdio.h>

#include "mesh.h"

typedef struct {
    FILE* f;           // rank 0's --log file, or NULL
    const char* path;  // its name, for messages
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
    float final_loss, val_loss;  // val_loss < 0: none
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

#endif
