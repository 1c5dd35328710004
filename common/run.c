// run.c: a training program's start and end, the same in every chapter
// (run.h): MPI, the flags, the mesh, threads, the device, the communicators,
// the set-up, the matmul peak; and their teardown.
#include "run.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device.h"
#include "errors.h"
#include "matmul_peak.h"
#include "memory.h"
#include "rank.h"
#include "report.h"
#include "runtime.h"
#include "trace.h"
#include "train_step.h"
#include "watchdog.h"

int run_start(Run* r, int argc, char** argv, const char* program, const char* summary,
              const ArgSpec* extra, int n_extra, unsigned axes) {
    memset(r, 0, sizeof(*r));
    runtime_init(&argc, &argv);
    char msg[ERROR_MAX];
    // every trainer from chapter 2 on takes --comm: the chapter's flags, then it
    ArgSpec* flags = xmalloc(sizeof(ArgSpec) * (size_t)(n_extra + 1));
    if (n_extra) memcpy(flags, extra, sizeof(ArgSpec) * (size_t)n_extra);
    flags[n_extra] = (ArgSpec){"comm", ARG_STRING, &r->args.comm,
                               "library | hand: MPI's collectives, or chapter 1's by hand (CPU only)  [library]"};
    const char* bad = args_parse(argc, argv, &r->args, flags, n_extra + 1, axes, msg, sizeof(msg));
    if (bad && !strcmp(bad, "help")) {
        if (world_rank() == 0) args_usage(program, summary, flags, n_extra + 1, axes);
        free(flags);
        runtime_finalize();
        return 0;
    }
    free(flags);
    if (bad) fail_all("%s", bad);
    if (strcmp(r->args.comm, "library") != 0 && strcmp(r->args.comm, "hand") != 0)
        fail_all("--comm %s is not one of library, hand", r->args.comm);
    bad = comm_set_impl(!strcmp(r->args.comm, "hand") ? COMM_IMPL_HAND : COMM_IMPL_LIBRARY);
    if (bad) fail_all("%s", bad);
    bad = mesh_create(&r->mesh, r->args.mesh, msg, sizeof(msg));
    if (bad) fail_all("%s", bad);
    runtime_set_threads(r->args.threads);
    watchdog_start(r->args.timeout);  // from here on, a rank that stops ends the job (watchdog.h)
    r->device = device_init(runtime_local_rank());
    const char* tf32_note = device_set_tf32(r->args.tf32);
    if (tf32_note) print0("note: %s\n", tf32_note);
    comm_create(&r->world, r->axes, &r->mesh);
    train_setup(&r->setup, &r->args);
    train_note_unused(argc, argv, &r->setup);
    r->peak_gflops = report_matmul_peak(r->args.peak_gflops);
    comm_counts_reset();
    trace_open(r->args.trace);
    return 1;
}

void run_refuse_flags(const Run* r, unsigned missing, const char* chapter) {
    const TrainArgs* a = &r->args;
    if ((missing & RUN_NO_CHECKPOINTS) && (a->ckpt_dir || a->resume || a->save_every || a->async_save || a->ckpt_local))
        fail_all("%s does not save or resume training state yet: drop --ckpt-dir, --ckpt-local, --resume, --save-every and "
                 "--async-save (--save FILE.bin writes the weights)", chapter);
    if ((missing & RUN_NO_RECOMPUTE) && a->recompute != RECOMPUTE_NONE)
        fail_all("%s keeps its activations its own way and does not recompute them yet: drop --recompute", chapter);
}

void run_finish(Run* r) {
    train_sumsq_free();
    trace_finish();
    train_setup_free(&r->setup);
    comm_destroy(&r->world, r->axes);
    mesh_destroy(&r->mesh);
    runtime_finalize();
}
