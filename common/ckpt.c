// ckpt.c: training-state checkpoints (ckpt.h, docs/checkpoints.md).
//
// Save: every rank copies the slices it owns to a host buffer and writes
// them, behind a 64-byte header, to DIR/step-N.tmp/rank-R.bin (fsync'ed, a
// checksum computed on the way); rank 0 gathers every rank's slice list and
// checksum, writes the MANIFEST last (fsync'ed), and renames the directory
// to DIR/step-N. A crash before the rename leaves a .tmp directory that no
// reader looks at; the previous checkpoint is untouched. With --async-save a
// thread writes the file while training goes on; the commit (gather,
// manifest, rename) happens on the main thread once every rank's file is on
// disk, checked after each step. With --ckpt-local, level 1 writes the same
// files into each node's own directory first, and a step saved on both
// levels is drained: level 3's file is a copy of level 1's, made by the
// thread, so the state is serialised once.
//
// Load: the manifest is read and checked against the model and the batch;
// each rank cuts every run it needs against every saved slice of the same
// tensor and reads the overlaps from the files that hold them, after
// checking those files' sizes and checksums. A level-1 resume reads each
// node's directory on that node's ranks only; rebuilds and files a node
// lacks go over MPI.
#include "ckpt.h"

// Paths and messages live in fixed buffers (4 KiB, ERROR_MAX), which gcc
// warns may cut at every snprintf (clang has no such warning, and stops at
// a pragma that names one it does not know). Nothing is cut: a flag's path
// is at most ARGS_MAX_STRING (args.h), leaving room for the names added
// under it, and a message has room for three such paths (errors.h).
#ifndef __clang__
#pragma GCC diagnostic ignored "-Wformat-truncation"
#endif

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <mpi.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>
#include <zstd.h>

#include "ckpt_files.h"
#include "ckpt_levels.h"
#include "errors.h"
#include "memory.h"
#include "rank.h"
#include "runtime.h"
#include "train.h"  // TrainSetup's fields (ckpt_init)
#include "report.h"

// ---------------------------------------------------------------- set-up

// One writer per checkpoint directory: rank 0 holds an exclusive flock on
// DIR/.lock for the whole run (level 1: each node's first rank on
// LOCAL/node-K/.lock, its node's own storage), and writes its pid, host and start time into
// it for the message a second run gets. The kernel drops the lock when the
// process ends, however it ends, so a .lock file whose lock can be taken is
// the leftover of a run that died: it is taken over with a note. (flock
// works across processes on one machine and, on Linux, on NFS through
// fcntl locks; a file system without locks gives a clear error instead.)
static const char* lock_dir(const char* dir, const char* flag, int* lock_fd, char* msg, size_t msg_len) {
    char path[4096 + 16];
    mkdir(dir, 0755);  // may exist; the open below says if it is unusable
    snprintf(path, sizeof(path), "%s/.lock", dir);
    int fd = open(path, O_RDWR | O_CREAT, 0644);
    if (fd < 0) {
        snprintf(msg, msg_len, "cannot create the lock file '%s': %s (check %s)", path, strerror(errno), flag);
        return msg;
    }
    char before[256] = "";
    ssize_t got = pread(fd, before, sizeof(before) - 1, 0);
    before[got > 0 ? got : 0] = 0;
    before[strcspn(before, "\n")] = 0;
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        int err = errno;
        close(fd);
        if (err == EWOULDBLOCK)
            snprintf(msg, msg_len, "%s '%s' is in use by another run (%s): give each run its own directory, or wait for that one to end",
                     flag, dir, before[0] ? before : "its .lock file names no process");
        else
            snprintf(msg, msg_len, "cannot lock '%s': %s (a file system without file locks: use a local %s)", path,
                     strerror(err), flag);
        return msg;
    }
    // printf, not print0: on level 1 the node's first rank may not be rank 0
    if (before[0]) printf("note: %s '%s': the lock of an earlier run (%s) is stale (that run has ended); taking it over\n", flag, dir, before);
    char host[256] = "?", now[64] = "?";
    gethostname(host, sizeof(host) - 1);
    time_t t = time(NULL);
    strftime(now, sizeof(now), "%Y-%m-%d %H:%M:%S UTC", gmtime(&t));
    char line[512];
    int n = snprintf(line, sizeof(line), "pid %d on host %s, since %s\n", (int)getpid(), host, now);
    if (ftruncate(fd, 0) != 0 || pwrite(fd, line, (size_t)n, 0) != n) {
        snprintf(msg, msg_len, "cannot write the lock file '%s': %s", path, strerror(errno));
        close(fd);
        return msg;
    }
    *lock_fd = fd;
    return NULL;
}

// The lock's text goes with the lock: a .lock file left with text means a
// run died holding it (a refusal after the locks releases them too).
static void release_locks(Ckpt* c) {
    if (c->lock_fd >= 0) {
        if (ftruncate(c->lock_fd, 0) != 0) print0("note: cannot clear the lock file '%s/.lock'\n", c->dir);
        close(c->lock_fd);
        c->lock_fd = -1;
    }
    if (c->local_lock_fd >= 0) {
        if (ftruncate(c->local_lock_fd, 0) != 0) printf("note: cannot clear the lock file of '%s/node-%d'\n", c->local, c->node);
        close(c->local_lock_fd);
        c->local_lock_fd = -1;
    }
}

// A refusal (fail_all, fail_if_any: a refused resume, a diverged step) runs
// this on every rank before it ends the run (errors_on_refusal), at the same
// point of the run on every rank (both are collective): a save still being
// written in the background (--async-save, a drain) is finished and
// committed, as a sync save would already have been (it holds the state
// after a step whose loss and norm were finite: a diverged step is refused
// before it is saved), not left as a .tmp directory without a manifest;
// then the locks of the open
// checkpoint go, and a resume's scratch directory. (An exit handler is not
// enough: once the failing rank has exited, mpirun ends the ranks still in
// MPI_Finalize before their exit handlers run.)
static Ckpt* refusal_ckpt = NULL;  // the open one, from ckpt_open to ckpt_close
static void restore_scratch_remove(void);
static void join_and_commit(Ckpt* c);
static void on_refusal(void) {
    if (refusal_ckpt) join_and_commit(refusal_ckpt);  // a refusal inside the commit: none pending (commit)
    restore_scratch_remove();
    if (refusal_ckpt) release_locks(refusal_ckpt);
}

// The checksum of a --model FILE's bytes, read in pieces (a GPT-2 file is
// hundreds of MiB); 0 when it cannot be read (train_setup has read it already).
static unsigned long long file_checksum(const char* path) {
    FILE* f = fopen(path, "rb");
    if (!f) return 0;
    XXH3_state_t* sum = ckpt_checksum_begin();
    size_t cap = 1u << 22, got;
    unsigned char* buf = xmalloc(cap);
    while ((got = fread(buf, 1, cap, f)) > 0) ckpt_checksum_add(sum, buf, got);
    free(buf);
    fclose(f);
    return ckpt_checksum_end(sum);
}

// The run's identity (ckpt.h): rank 0 hashes the training tokens and the
// settings that decide the trained model, every rank gets the result. The
// start weights count: two runs from other --model files are other runs
// although their shapes agree. The model's variant (chapter 7's experts)
// is known later and mixed in by ckpt_set_model.
static void run_identity(Ckpt* c, const TrainSetup* s) {
    unsigned long long v[3] = {0, 0, 0};
    if (c->rank == 0) {
        v[1] = ckpt_checksum(s->train.tokens, s->train.count * sizeof(uint16_t));
        v[2] = s->train.count;
        const GPTConfig* g = &c->cfg;
        char text[512];
        int n = snprintf(text, sizeof(text), "model %d %d %d %d %d %d batch %d seq %d seed %d lr %.9g wd %.9g clip %.9g data %llu %016llx start %016llx",
                         g->max_seq_len, g->vocab_size, g->padded_vocab_size, g->num_layers, g->num_heads, g->channels,
                         c->B, c->T, c->seed, c->lr, c->wd, c->clip, v[2], v[1],
                         s->checkpoint ? file_checksum(s->checkpoint) : 0ULL);
        v[0] = ckpt_checksum(text, (size_t)n);
    }
    MPI_CHECK(MPI_Bcast(v, 3, MPI_UNSIGNED_LONG_LONG, 0, MPI_COMM_WORLD));
    c->run_id = v[0];
    c->data_hash = v[1];
    c->data_tokens = (size_t)v[2];
}

// What a run continues: the run id and step of the checkpoint it resumed
// (a fresh run: step -1), and whether the directory checked is the one it
// resumed from (its older steps are the history this run continues).
typedef struct {
    unsigned long long id;
    int step, here;
} Resumed;

// A run on a directory holding another run's complete checkpoints would
// prune them by step or be pruned for them, and a later restart could
// resume the other run's model: refused, saying how to go on. A resumed run
// owns, besides its own, the steps up to the one it resumed of the run it
// continues (of any run, in the directory it resumed from).
static const char* foreign_dir(const char* flag, const char* dir, const char* base, unsigned long long id,
                               const Resumed* from, char* msg, size_t len) {
    int step = ckpt_foreign_step(base, id, from->id, from->step, from->here);
    if (step < 0) return NULL;
    if (from->step < 0)
        snprintf(msg, len, "%s '%s' holds another run's checkpoints (%s/step-%08d: other data or settings than this run's): give this run its own %s, or continue that run with --resume %s",
                 flag, dir, base, step, flag, dir);
    else if (step > from->step)
        snprintf(msg, len, "%s '%s' holds %s/step-%08d, newer than the step %d this run resumes and saved with other data or settings than this run's: a restart could resume it, and --keep would prune this run's saves for it: give this run its own %s",
                 flag, dir, base, step, from->step, flag);
    else
        snprintf(msg, len, "%s '%s' holds another run's checkpoints (%s/step-%08d: other data or settings than this run's and the run it resumes): --keep would prune them for this run's saves: give this run its own %s",
                 flag, dir, base, step, flag);
    return msg;
}

void ckpt_init(Ckpt* c, const TrainArgs* a, const TrainSetup* s, const Mesh* mesh, int chapter) {
    memset(c, 0, sizeof(*c));
    c->dir = a->ckpt_dir;
    c->resume = a->resume;
    c->every = a->save_every;
    c->keep = a->keep;
    c->async = a->async_save;
    c->chapter = chapter;
    c->cfg = s->cfg;
    c->B = s->B;
    c->T = s->T;
    c->seed = a->seed;
    c->steps = a->steps;
    c->lr = a->lr;
    c->wd = a->wd;
    c->clip = a->clip;
    for (int ax = 0; ax < NUM_AXES; ax++) c->mesh[ax] = mesh ? mesh->size[ax] : 1;
    MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &c->world));
    MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &c->rank));
    c->lock_fd = -1;
    c->last_saved = c->local_last_saved = -1;
    c->group = MPI_COMM_NULL;
    c->local = a->ckpt_local;
    c->local_every = a->local_every;
    c->redundancy = a->redundancy;
    c->incremental = a->incremental;
    c->local_lock_fd = -1;
    refusal_ckpt = c;
    errors_on_refusal(on_refusal);
    if (c->local) ckpt_nodes_init(c, a->ranks_per_node);
    char msg[ERROR_MAX];
    const char* bad = NULL;
    if (c->local && c->local_index == 0) {  // a second run's first save would delete this one's .tmp
        char node_dir[4096];
        ckpt_node_dir(c, c->node, node_dir, sizeof(node_dir));
        mkdir(c->local, 0755);
        bad = lock_dir(node_dir, "--ckpt-local", &c->local_lock_fd, msg, sizeof(msg));
        if (!bad) ckpt_restore_replaced(node_dir);  // locked for this run: a crash's half replacement undone
    }
    fail_if_any(bad != NULL, bad);
    if (c->dir) {
        bad = c->rank == 0 ? lock_dir(c->dir, "--ckpt-dir", &c->lock_fd, msg, sizeof(msg)) : NULL;
        if (c->rank == 0 && !bad) ckpt_restore_replaced(c->dir);  // locked for this run: a crash's half replacement undone
        fail_if_any(bad != NULL, bad);
    }
    if (!c->dir && !c->local && !c->resume) return;  // a resume compares the identity
    run_identity(c, s);
}

// The run's directories hold no other run's checkpoints (foreign_dir).
// Called by ckpt_resume, after ckpt_set_model has given the identity its
// variant (and a resume has read what it continues); a repeated call finds
// this run's own checkpoints and passes.
static void refuse_foreign_dirs(Ckpt* c, const Resumed* from) {
    if (!c->dir && !c->local) return;
    char msg[ERROR_MAX];
    const char* bad = c->dir && c->rank == 0 ? foreign_dir("--ckpt-dir", c->dir, c->dir, c->run_id, from, msg, sizeof(msg)) : NULL;
    if (!bad && c->local && c->local_index == 0) {
        char node_dir[4096];
        ckpt_node_dir(c, c->node, node_dir, sizeof(node_dir));
        Resumed local = *from;
        // node-local and read by every resume (ckpt_local_pick): its older
        // steps of any run count as history (a continued run's restart finds
        // its earlier run's there); a newer one of other settings does not
        local.here = 1;
        bad = foreign_dir("--ckpt-local", c->local, node_dir, c->run_id, &local, msg, sizeof(msg));
    }
    fail_if_any(bad != NULL, bad);  // refused: the locks go (on_refusal)
}

// Whether checkpoint directory `dir` (base/step-N) sits in `base`.
static int sits_in(const char* dir, const char* base) {
    char parent[4096], a[PATH_MAX], b[PATH_MAX];
    snprintf(parent, sizeof(parent), "%s", dir);
    char* slash = strrchr(parent, '/');
    if (!slash) return 0;
    *slash = 0;
    return realpath(parent, a) && realpath(base, b) && !strcmp(a, b);
}

void ckpt_add_identity(Ckpt* c, const char* what) {
    // every rank mixes in the same text, so every rank keeps the same run_id
    if (!what || !what[0] || (!c->dir && !c->local && !c->resume)) return;
    char text[512];
    int len = snprintf(text, sizeof(text), "run %016llx %s", c->run_id, what);
    if (len >= (int)sizeof(text)) len = (int)sizeof(text) - 1;
    c->run_id = ckpt_checksum(text, (size_t)len);
}

void ckpt_set_model(Ckpt* c, const CkptTensor* tensors, int n, const char* variant) {
    c->tensors = tensors;
    c->n_tensors = n;
    snprintf(c->variant, sizeof(c->variant), "%s", variant ? variant : "");
    // the variant decides the model as much as GPTConfig does (another
    // --experts or --top-k trains another model): part of the identity
    if (c->variant[0]) {
        char text[300];
        snprintf(text, sizeof(text), "variant %s", c->variant);
        ckpt_add_identity(c, text);
    }
}

// ---------------------------------------------------------------- a level-3 save: the writer, then the commit

// Writes c->host behind the header to c->file_path: fsync'ed, its checksum
// and size in c->file_hash / c->file_bytes, an error in c->file_err. Runs on
// the main thread (sync) or the writer thread (async); no MPI here.
static void write_file(Ckpt* c) {
    double t0 = now_seconds();
    unsigned char header[CKPT_HEADER_BYTES];
    ckpt_file_header(c, c->pending_step, header);
    size_t data_bytes = c->own.floats * sizeof(float);
    const void* parts[2] = {header, c->host};
    size_t sizes[2] = {sizeof(header), data_bytes};
    CkptFileOut out;
    c->delta_bytes = 0;
    if (c->pending_delta) {
        // the full file's size and checksum, which the resume checks after
        // applying the delta, then the delta: the xor of the state with the
        // last full save's, compressed (an unchanged bit is a 0 bit)
        XXH3_state_t* sum = ckpt_checksum_begin();
        ckpt_checksum_add(sum, header, sizeof(header));
        ckpt_checksum_add(sum, c->host, data_bytes);
        c->file_hash = ckpt_checksum_end(sum);
        c->file_bytes = sizeof(header) + data_bytes;
        const uint32_t* now = (const uint32_t*)c->host;
        const uint32_t* base = (const uint32_t*)c->base_host;
        uint32_t* x = xmalloc(data_bytes ? data_bytes : 1);
        for (size_t i = 0; i < c->own.floats; i++) x[i] = now[i] ^ base[i];
        size_t bound = ZSTD_compressBound(data_bytes);
        unsigned char* z = xmalloc(bound ? bound : 1);
        size_t zn = ZSTD_compress(z, bound, x, data_bytes, 3);
        free(x);
        if (ZSTD_isError(zn)) {
            snprintf(c->file_err, sizeof(c->file_err), "compressing the delta '%s' failed: %s", c->delta_path,
                     ZSTD_getErrorName(zn));
            free(z);
            return;
        }
        parts[1] = z;
        sizes[1] = zn;
        ckpt_write_parts(c->delta_path, parts, sizes, ckpt_fault_fires(c, "save", c->pending_step), &out);
        free(z);
        snprintf(c->file_err, sizeof(c->file_err), "%s", out.err);
        if (!out.err[0]) c->serialised_bytes += out.bytes;
        c->delta_bytes = out.bytes;
        c->delta_hash = out.hash;
        c->write_s += now_seconds() - t0;
        return;
    }
    if (c->pending_drain) {
        // level 1 holds this step's file already: copy it, and check that
        // the copy is the bytes level 1 wrote (its checksum)
        ckpt_copy_file(c->drain_src, c->file_path, ckpt_fault_fires(c, "save", c->pending_step), &out);
        if (!out.err[0] && (out.bytes != c->local_file_bytes || out.hash != c->local_file_hash))
            snprintf(out.err, sizeof(out.err), "draining '%s' to '%s': the level-1 file changed since its save (%zu bytes, checksum %016llx; level 1 wrote %zu, %016llx)",
                     c->drain_src, c->file_path, out.bytes, out.hash, c->local_file_bytes, c->local_file_hash);
        if (!out.err[0]) c->drained_bytes += out.bytes;
    } else {
        ckpt_write_parts(c->file_path, parts, sizes, ckpt_fault_fires(c, "save", c->pending_step), &out);
        if (!out.err[0]) c->serialised_bytes += out.bytes;
    }
    snprintf(c->file_err, sizeof(c->file_err), "%s", out.err);
    if (out.err[0]) return;
    c->file_hash = out.hash;
    c->file_bytes = out.bytes;
    c->write_s += now_seconds() - t0;
}

static void* writer_thread(void* arg) {
    Ckpt* c = arg;
    write_file(c);
    __atomic_store_n(&c->thread_done, 1, __ATOMIC_RELEASE);
    return NULL;
}

// After every rank's file is on disk (or failed): the collective part of a
// save. Gathers the slice lists and file figures on rank 0, which writes the
// manifest and renames the directory.
static void commit(Ckpt* c) {
    c->pending = 0;  // from here a refusal (below, or a failed write) commits nothing again (on_refusal)
    int step = c->pending_step;
    int has_file = c->own.n > 0;
    // a failed write on any rank: the .tmp directory goes, the previous
    // checkpoint stays the latest, and every rank ends with the message
    int failed = has_file && c->file_err[0], any = 0;
    MPI_CHECK(MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD));
    if (any && c->rank == 0) {
        char tmp[4096];
        ckpt_tmp_dir_of(c->dir, step, tmp, sizeof(tmp));
        ckpt_remove_dir(tmp);
    }
    fail_if_any(failed, c->file_err);
    // slots 3 and 4: the delta's file, for an incremental save
    uint64_t file[5] = {(uint64_t)has_file, has_file ? c->file_bytes : 0, has_file ? c->file_hash : 0,
                        has_file && c->pending_delta ? c->delta_bytes : 0, has_file && c->pending_delta ? c->delta_hash : 0};
    size_t len = 0;
    char* text = ckpt_gather_manifest(c, step, file, 3, &len);
    // a full save is the base of the deltas that follow: its manifest's checksum names it
    if (c->rank == 0 && !c->pending_delta) c->base_manifest_hash = ckpt_checksum(text, len);
    char msg[ERROR_MAX];
    const char* bad = c->rank == 0 ? ckpt_install_manifest(c->dir, step, text, len, msg, sizeof(msg)) : NULL;
    free(text);
    fail_if_any(bad != NULL, bad);
    if (c->rank == 0) ckpt_prune(c->dir, c->keep, step, c->last_saved);
    if (c->last_saved >= 0) c->last_saved = step;
    if (has_file) {
        if (c->pending_delta) c->deltas++, c->delta_bytes_total += c->delta_bytes;
        else c->full_bytes_total += c->file_bytes;
    }
    c->saves++;
    c->drains += c->pending_drain;
    print0("checkpoint: saved %s/step-%08d%s\n", c->dir, step, c->pending_drain ? " (drained from level 1)" : "");
}

// Waits for the writer thread and commits its save.
static void join_and_commit(Ckpt* c) {
    if (!c->pending) return;
    if (c->thread_running) pthread_join(c->thread, NULL);
    c->thread_running = 0;
    commit(c);
}

// ---------------------------------------------------------------- save

// A save of `step` on level 1 (local), level 3 (durable) or both: the state
// comes off the device once, into c->host. Level 1 writes it at once. Level
// 3 alone writes it from that buffer (in the background with --async-save);
// a step on both levels is drained: each rank's level-1 file, already
// written and checksummed, is copied into level 3's .tmp directory by the
// writer thread, and the commit follows when every rank's copy is done, as
// an async save's does. The state is serialised once, not twice.
static void save(Ckpt* c, int step, int local, int durable) {
    double t0 = now_seconds();
    // past a file-size limit a write must fail with EFBIG and be reported,
    // not kill the process (the writer may be a thread: process-wide)
    signal(SIGXFSZ, SIG_IGN);
    join_and_commit(c);  // one save at a time: the buffer is reused
    // the state, off the device, before training changes it
    if (c->own.floats > c->host_cap) {
        free(c->host);
        c->host = xmalloc(c->own.floats * sizeof(float));
        c->host_cap = c->own.floats;
    }
    size_t at = 0;
    for (int i = 0; i < c->own.n; i++) {
        const CkptSlice* s = &c->own.s[i];
        mem_to_host(c->host + at, s->data, s->len * s->count * sizeof(float));
        at += s->len * s->count;
    }
    if (local) {
        // level 1's time is its own figure (local_s), not level 3's stall
        double before = c->local_s;
        ckpt_save_local(c, step);
        t0 += c->local_s - before;
        if (durable && c->own.n > 0 && ckpt_fault_fires(c, "flip", step)) {  // the test hook (ckpt_files.c)
            char path[4096 + 64];
            ckpt_node_dir(c, c->node, path, sizeof(path));
            snprintf(path + strlen(path), sizeof(path) - strlen(path), "/step-%08d/rank-%05d.bin", step, c->rank);
            ckpt_fault_flip(path);
        }
    }
    if (!durable) {
        c->stall_s += now_seconds() - t0;
        return;
    }
    // rank 0 makes the .tmp directory (a stale one from a crash goes first)
    char msg[ERROR_MAX], tmp[4096];
    const char* bad = NULL;
    ckpt_tmp_dir_of(c->dir, step, tmp, sizeof(tmp));
    if (c->rank == 0) {
        mkdir(c->dir, 0755);  // may exist; the checks below say if it is unusable
        if (c->saves == 0) ckpt_remove_stale_tmp(c->dir);  // leftovers of a crashed save: never read, removed
        ckpt_remove_dir(tmp);
        if (mkdir(tmp, 0755) != 0) {
            snprintf(msg, sizeof(msg), "cannot create the checkpoint directory '%s': %s (check --ckpt-dir)", tmp,
                     strerror(errno));
            bad = msg;
        }
    }
    fail_if_any(bad != NULL, bad);
    snprintf(c->file_path, sizeof(c->file_path), "%s/rank-%05d.bin", tmp, c->rank);
    snprintf(c->delta_path, sizeof(c->delta_path), "%s/rank-%05d.delta", tmp, c->rank);
    // --incremental K: the run's first save and every K-th are full, the
    // others deltas against the last full one (held in base_host)
    c->pending_delta = c->incremental > 1 && c->base_host && c->saves % c->incremental != 0;
    // a delta is computed from the state (it is not level 1's file): it is
    // written from c->host; a full save of a step on level 1 is drained
    c->pending_drain = local && !c->pending_delta;
    if (c->pending_drain) {
        char base[4096];
        ckpt_node_dir(c, c->node, base, sizeof(base));
        snprintf(c->drain_src, sizeof(c->drain_src), "%s/step-%08d/rank-%05d.bin", base, step, c->rank);
    }
    if (!c->pending_delta && c->incremental > 1) {
        if (!c->base_host) c->base_host = xmalloc((c->own.floats ? c->own.floats : 1) * sizeof(float));
        memcpy(c->base_host, c->host, c->own.floats * sizeof(float));
        c->base_step = step;
    }
    c->pending = 1;
    c->pending_step = step;
    c->thread_done = 0;
    if (c->async || c->pending_drain) {
        // a rank that owns nothing has no file to write: done at once
        if (c->own.n > 0) {
            if (pthread_create(&c->thread, NULL, writer_thread, c) != 0) FATAL("cannot start the checkpoint writer thread");
            c->thread_running = 1;
        } else {
            c->thread_done = 1;
        }
    } else {
        if (c->own.n > 0) write_file(c);
        commit(c);
    }
    c->stall_s += now_seconds() - t0;
}

void ckpt_after_step(Ckpt* c, int step) {
    if (ckpt_fault_fires(c, "step", step)) ckpt_fault_kill();
    if (!c->dir && !c->local) return;
    if (c->pending) {
        // an async save or a drain (a sync one is committed in save): commit
        // as soon as every rank's writer is done, one int over the world
        double t0 = now_seconds();
        int done = __atomic_load_n(&c->thread_done, __ATOMIC_ACQUIRE), all = 0;
        MPI_CHECK(MPI_Allreduce(&done, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD));
        if (all) join_and_commit(c);
        c->stall_s += now_seconds() - t0;
    }
    int completed = step + 1;
    int durable = c->dir && ((c->every > 0 && completed % c->every == 0) || completed == c->steps);
    int local = c->local && ((c->local_every > 0 && completed % c->local_every == 0) || completed == c->steps);
    if (durable || local) save(c, completed, local, durable);
}

// ---------------------------------------------------------------- incremental: applying a delta

// The resume's private directory, removed at exit on every path: a refused
// resume ends every rank through fail_if_any (exit), the ranks whose own
// checks passed too, and the full rank files restored there must not pile
// up in the temporary directory at every attempt of a supervisor.
static char restore_scratch[4096];
static void restore_scratch_remove(void) {
    if (restore_scratch[0]) ckpt_remove_dir(restore_scratch);
    restore_scratch[0] = 0;
}
static void restore_scratch_keep(const char* dir) {
    static int registered = 0;
    if (!registered) atexit(restore_scratch_remove);
    registered = 1;
    snprintf(restore_scratch, sizeof(restore_scratch), "%s", dir);
}

// The full save an incremental checkpoint in dir is a delta against: the
// step directory base_step beside it.
static void base_dir_of(const char* dir, int base_step, char* base, size_t len) {
    snprintf(base, len, "%s", dir);
    char* slash = strrchr(base, '/');
    if (slash) snprintf(slash + 1, len - (size_t)(slash + 1 - base), "step-%08d", base_step);
    else snprintf(base, len, "step-%08d", base_step);
}

// The incremental chain, checked before anything is restored, each link
// against its own manifest: the full save's manifest is the one the delta
// was taken against (its checksum); each full file this rank restores
// matches the full save's own manifest (size, checksum, step:
// ckpt_verify_file); each delta matches the delta's manifest. A failure
// names the file at fault where it lies, never a scratch copy restored from
// it, and the caller refuses the resume on every rank before any rank
// restores a file from a broken chain. Returns NULL or a message.
static const char* chain_check(const Ckpt* c, const char* dir, const CkptManifest* m, const int* use, char* msg,
                               size_t msg_len) {
    char base[4096], path[4096 + 96], why[ERROR_MAX];
    base_dir_of(dir, m->base_step, base, sizeof(base));
    snprintf(path, sizeof(path), "%s/MANIFEST", base);
    size_t n = 0;
    unsigned char* text = ckpt_read_whole(path, &n);
    if (!text) {
        snprintf(msg, msg_len, "checkpoint '%s' is a delta against the full save of step %d, but '%s' is missing: resume from a full save (--keep keeps the full saves its deltas need)",
                 dir, m->base_step, path);
        return msg;
    }
    unsigned long long h = ckpt_checksum(text, n);
    free(text);
    if (h != m->base_hash) {
        snprintf(msg, msg_len, "checkpoint '%s' is a delta against another run's full save of step %d ('%s' is not the one it was taken against): resume from a full save",
                 dir, m->base_step, base);
        return msg;
    }
    CkptManifest bm;
    const char* bad = NULL;
    if (ckpt_read_manifest(base, c, &bm, why, sizeof(why))) {
        snprintf(msg, msg_len, "checkpoint '%s' is a delta against the full save '%s', whose manifest cannot be used: %s", dir, base, why);
        bad = msg;
    }
    for (int f = 0; f < m->n_files && !bad; f++) {
        if (!use[f] && f % c->world != c->rank) continue;  // the files delta_restore restores here
        int j = 0, r = -1;
        while (j < bm.n_files && strcmp(bm.files[j].name, m->files[f].name) != 0) j++;
        sscanf(m->files[f].name, "rank-%d.bin", &r);
        if (j == bm.n_files) {
            snprintf(msg, msg_len, "checkpoint '%s' is a delta against the full save '%s', whose manifest lists no %s", dir, base, m->files[f].name);
            bad = msg;
        } else if (ckpt_verify_file(&bm, j, why, sizeof(why))) {
            snprintf(msg, msg_len, "checkpoint '%s' is a delta against the full save '%s', which does not match its own manifest: %s; resume from another checkpoint",
                     dir, base, why);
            bad = msg;
        } else if (r < 0 || r >= m->world || !m->delta_bytes[r]) {
            snprintf(msg, msg_len, "checkpoint '%s' lists no delta for %s", dir, m->files[f].name);
            bad = msg;
        } else {
            snprintf(path, sizeof(path), "%s/rank-%05d.delta", dir, r);
            size_t dn = 0;
            unsigned char* delta = ckpt_read_whole(path, &dn);
            if (!delta || dn != m->delta_bytes[r] || ckpt_checksum(delta, dn) != m->delta_hash[r] || dn < CKPT_HEADER_BYTES) {
                snprintf(msg, msg_len, "checkpoint delta '%s' is missing, truncated or corrupt (its size or checksum is not its manifest's, '%s/MANIFEST')",
                         path, dir);
                bad = msg;
            }
            free(delta);
        }
    }
    ckpt_manifest_free(&bm);
    return bad;
}

// Restores full file f of the incremental checkpoint in dir: its delta
// decompressed and xor'ed with the same file of the full save it names.
// chain_check has already checked every link against its own manifest (the
// base is the save the delta was taken against, the delta's size and
// checksum), so only a read that fails here is refused. Writes the full
// file into the private directory scratch and points the manifest's path
// there; ckpt_verify_file then checks it against the full file's checksum.
// Returns NULL or a message.
static const char* delta_restore(const char* dir, CkptManifest* m, int f, const char* scratch, char* msg, size_t msg_len) {
    char base[4096], path[4096 + 96];
    base_dir_of(dir, m->base_step, base, sizeof(base));
    int r = -1;
    sscanf(m->files[f].name, "rank-%d.bin", &r);
    snprintf(path, sizeof(path), "%s/rank-%05d.delta", dir, r);
    size_t dn = 0, bn = 0;
    unsigned char* delta = ckpt_read_whole(path, &dn);
    if (!delta || dn < CKPT_HEADER_BYTES) {
        free(delta);
        snprintf(msg, msg_len, "checkpoint delta '%s' could not be read", path);
        return msg;
    }
    snprintf(path, sizeof(path), "%s/%s", base, m->files[f].name);
    unsigned char* full = ckpt_read_whole(path, &bn);
    const char* bad = NULL;
    if (!full || bn != m->files[f].bytes) {
        snprintf(msg, msg_len, "the full save's '%s' that the delta of '%s' needs is missing or of another size", path, dir);
        bad = msg;
    } else {
        // the data: the delta's xor, decompressed, xor'ed into the full save's
        size_t data = bn - CKPT_HEADER_BYTES;
        unsigned char* x = xmalloc(data ? data : 1);
        size_t got = ZSTD_decompress(x, data, delta + CKPT_HEADER_BYTES, dn - CKPT_HEADER_BYTES);
        if (ZSTD_isError(got) || got != data) {
            snprintf(msg, msg_len, "checkpoint delta '%s/rank-%05d.delta' does not decompress to %zu bytes", dir, r, data);
            bad = msg;
        } else {
            memcpy(full, delta, CKPT_HEADER_BYTES);  // this step's header
            for (size_t i = 0; i < data; i++) full[CKPT_HEADER_BYTES + i] ^= x[i];
            ckpt_set_path(&m->files[f], "%s/%s", scratch, m->files[f].name);
            const void* parts[2] = {full, NULL};
            size_t sizes[2] = {bn, 0};
            CkptFileOut out;
            ckpt_write_parts(m->files[f].path, parts, sizes, 0, &out);
            if (out.err[0]) {
                snprintf(msg, msg_len, "%s", out.err);
                bad = msg;
            } else if (out.hash != m->files[f].hash) {
                // the delta passed its own checksum: the base file is what is
                // wrong, named where it is (the scratch copy is removed)
                snprintf(msg, msg_len, "the full save's '%s', which the delta '%s/rank-%05d.delta' is applied to, is corrupt: the restored file's checksum %016llx is not the manifest's %016llx; resume from another checkpoint",
                         path, dir, r, out.hash, m->files[f].hash);
                bad = msg;
            }
        }
        free(x);
    }
    free(full);
    free(delta);
    return bad;
}

int ckpt_resume(Ckpt* c) {
    if (!c->resume) {
        refuse_foreign_dirs(c, &(Resumed){0, -1, 0});
        return 0;
    }
    double t0 = now_seconds();
    char msg[ERROR_MAX], dir[4096] = "";
    const char* bad = NULL;
    // the newest checkpoint on level 3 (--resume, shared storage: rank 0
    // looks), and with --ckpt-local a newer or equal one complete or
    // rebuildable on level 1 (every node looks at its own directory)
    int have3[3] = {0, -1, 0};  // a level-3 checkpoint is there; its step (-1: unusable); it has a run id,
    unsigned long long id3 = 0;  // this one
    char dir3[4096] = "";  // rank 0: level 3's newest, where --resume points
    if (c->rank == 0) {
        have3[0] = ckpt_latest(c->resume, dir, sizeof(dir)) != NULL;
        if (have3[0]) snprintf(dir3, sizeof(dir3), "%s", dir);
        if (have3[0]) {
            CkptManifest m3;
            if (!ckpt_read_manifest(dir, c, &m3, msg, sizeof(msg))) {
                have3[1] = m3.step;
                have3[2] = m3.has_run_id;
                id3 = m3.run_id;
            }
            ckpt_manifest_free(&m3);
        }
    }
    MPI_CHECK(MPI_Bcast(have3, 3, MPI_INT, 0, MPI_COMM_WORLD));
    MPI_CHECK(MPI_Bcast(&id3, 1, MPI_UNSIGNED_LONG_LONG, 0, MPI_COMM_WORLD));
    CkptManifest m;
    int level1 = 0;
    // a private directory: a level-1 manifest's copy, files from other
    // nodes, an incremental save's restored files
    char scratch[4096] = "";
    const char* tmpdir = getenv("TMPDIR");
    snprintf(scratch, sizeof(scratch), "%s/ckpt-restore-XXXXXX", tmpdir && tmpdir[0] ? tmpdir : "/tmp");
    if (!mkdtemp(scratch)) {
        snprintf(msg, sizeof(msg), "cannot create a directory '%s' to restore the checkpoint in: %s", scratch, strerror(errno));
        bad = msg;
        scratch[0] = 0;
    } else {
        restore_scratch_keep(scratch);
    }
    fail_if_any(bad != NULL, bad);
    if (c->local) {
        char dir1[4096], report[2048] = "", why[ERROR_MAX] = "", err[ERROR_MAX] = "";
        int step1 = ckpt_local_pick(c, have3[1], have3[2] ? &id3 : NULL, &m, scratch, dir1, sizeof(dir1), report, sizeof(report), why, sizeof(why),
                                    err, sizeof(err));
        fail_if_any(err[0] != 0, err);
        level1 = step1 >= 0;
        if (level1) {
            snprintf(dir, sizeof(dir), "%s", dir1);
            // a newer level-1 step was unusable: say why an older one is taken
            if (why[0]) print0("note: %s; an older level-1 step is taken\n", why);
            print0("checkpoint: resuming from %s%s\n", report,
                   !have3[0]          ? " (level 3 has none)"
                   : have3[1] == step1 ? " (level 3 has the same step: level 1 is read, it is nearer)"
                   : have3[1] >= 0     ? " (level 3 has an older one)"
                                       : "");
        } else {
            if (why[0] && have3[0]) print0("note: %s\n", why);
            if (have3[0]) print0("checkpoint: resuming from level 3 (durable), step %d: level 1 has nothing newer that is complete or rebuildable\n", have3[1]);
        }
        if (!level1 && !have3[0]) {
            snprintf(msg, sizeof(msg), "--resume '%s' --ckpt-local '%s': no checkpoint is complete or rebuildable on any level%s%s",
                     c->resume, c->local, why[0] ? ": " : "", why);
            bad = msg;
        }
    } else if (!have3[0]) {
        snprintf(msg, sizeof(msg), "--resume '%s': no complete checkpoint there (a directory with a MANIFEST, or step-N directories holding one)",
                 c->resume);
        bad = msg;
    }
    fail_if_any(bad != NULL, bad);
    if (!level1) {
        MPI_CHECK(MPI_Bcast(dir, sizeof(dir), MPI_CHAR, 0, MPI_COMM_WORLD));
        bad = ckpt_read_manifest(dir, c, &m, msg, sizeof(msg));
        fail_if_any(bad != NULL, bad);
    }
    if (m.B != c->B || m.T != c->T) {
        snprintf(msg, sizeof(msg), "checkpoint '%s' was trained with batch %d x %d; this run has %d x %d: resume with --batch %d --seq %d (the data position and the losses depend on them)",
                 dir, m.B, m.T, c->B, c->T, m.B, m.T);
        bad = msg;
    }
    fail_if_any(bad != NULL, bad);
    // where this run saves: its own checkpoints and the history it continues
    // (here: --resume names this directory's checkpoints, whichever level's step was taken)
    Resumed from = {m.has_run_id ? m.run_id : 0, m.step, c->rank == 0 && c->dir && dir3[0] && sits_in(dir3, c->dir)};
    refuse_foreign_dirs(c, &from);
    c->last_saved = c->local_last_saved = m.step;  // the steps after it, until this run saves, are another branch's
    if (!m.has_run_id || m.run_id != c->run_id)
        print0("note: checkpoint '%s' is another run's (%s): continuing from it, as --resume asks; this run's saves record this run\n",
               dir, m.has_run_id ? "other data or settings than this run's" : "it records no run");
    if (m.lr != c->lr || m.wd != c->wd || m.clip != c->clip || m.seed != c->seed)
        print0("note: checkpoint '%s' was trained with --lr %g --wd %g --clip %g --seed %d; this run continues with --lr %g --wd %g --clip %g --seed %d\n",
               dir, m.lr, m.wd, m.clip, m.seed, c->lr, c->wd, c->clip, c->seed);
    // which files this rank reads, and which it checks for everyone: every
    // file is checked by at least one rank, so one flipped byte anywhere is found
    int* use = xcalloc((size_t)m.n_files + 1, sizeof(int));
    for (int i = 0; i < c->need.n; i++)
        for (int j = 0; j < m.n_slices; j++) {
            const CkptSavedSlice* v = &m.slices[j];
            if (v->kind == c->need.s[i].kind && v->tensor == c->need.s[i].tensor && ckpt_intersect_saved(&c->need.s[i], v, NULL, NULL))
                use[v->file] = 1;
        }
    // level 1: the files this rank reads that its node lacks come from a
    // rank whose node has them (every file was checked on its node)
    if (level1) {
        bad = ckpt_local_fetch(c, &m, use, scratch, msg, sizeof(msg));
        fail_if_any(bad != NULL, bad);
    }
    // an incremental save: the chain checked first, on every rank, then the
    // full files this rank reads or checks restored from their deltas into
    // its scratch directory
    if (m.base_step >= 0) {
        bad = chain_check(c, dir, &m, use, msg, sizeof(msg));
        fail_if_any(bad != NULL, bad);
    }
    if (m.base_step >= 0)
        for (int f = 0; f < m.n_files && !bad; f++)
            if (use[f] || f % c->world == c->rank) bad = delta_restore(dir, &m, f, scratch, msg, sizeof(msg));
    // level 3: every file is checked by at least one rank, so one flipped
    // byte anywhere is found; level 1: its node's first rank checked it
    for (int f = 0; f < m.n_files && !bad; f++)
        if (use[f] || (!level1 && f % c->world == c->rank)) bad = ckpt_verify_file(&m, f, msg, sizeof(msg));
    fail_if_any(bad != NULL, bad);
    // the reads: each needed slice assembled in a host buffer from every
    // saved slice it overlaps, then copied to the device
    size_t max_floats = 0;
    for (int i = 0; i < c->need.n; i++)
        if (c->need.s[i].len * c->need.s[i].count > max_floats) max_floats = c->need.s[i].len * c->need.s[i].count;
    float* stage = xmalloc((max_floats ? max_floats : 1) * sizeof(float));
    unsigned char* seen = xmalloc(max_floats ? max_floats : 1);
    int* fds = xmalloc(sizeof(int) * ((size_t)m.n_files + 1));
    for (int f = 0; f < m.n_files; f++) {
        fds[f] = use[f] ? ckpt_open_read(m.files[f].path) : -1;
    }
    for (int i = 0; i < c->need.n && !bad; i++) {
        const CkptSlice* s = &c->need.s[i];
        size_t found = 0, want = s->len * s->count;
        CkptReadCtx r = {.dst = stage, .seen = seen};
        memset(seen, 0, want);
        for (int j = 0; j < m.n_slices && !r.failed; j++) {
            const CkptSavedSlice* v = &m.slices[j];
            if (v->kind != s->kind || v->tensor != s->tensor) continue;
            r.fd = fds[v->file];
            r.path = m.files[v->file].name;
            found += ckpt_intersect_saved(s, v, ckpt_read_piece, &r);
        }
        c->load_bytes += r.bytes;
        char name[64];
        snprintf(name, sizeof(name), "%s.%s", ckpt_kind_names[s->kind], ckpt_tensor_name_of(c, s->tensor));
        if (r.failed) {
            snprintf(msg, sizeof(msg), "reading %s from checkpoint '%s' (file %s) failed", name, dir, r.path);
            bad = msg;
        } else if (r.twice) {
            // the count below cannot tell an element saved twice and one missing from every element once
            snprintf(msg, sizeof(msg), "checkpoint '%s' saves %zu elements of %s twice (slices of two writers overlap, "
                     "elements %zu.. of it): its save was wrong; resume from another checkpoint", dir, r.twice, name, s->start);
            bad = msg;
        } else if (found != want) {
            // saved slices are disjoint, so every element must be found once
            snprintf(msg, sizeof(msg), "checkpoint '%s' holds %zu of the %zu elements of %s this rank needs (elements %zu.. of it): its manifest does not match this model",
                     dir, found, want, name, s->start);
            bad = msg;
        } else {
            mem_to_device(s->data, stage, want * sizeof(float));
        }
    }
    for (int f = 0; f < m.n_files; f++)
        if (fds[f] >= 0) close(fds[f]);
    restore_scratch_remove();
    free(fds);
    free(seen);
    free(stage);
    free(use);
    ckpt_manifest_free(&m);
    fail_if_any(bad != NULL, bad);
    c->start_step = m.step;
    c->load_s = now_seconds() - t0;
    if (level1) {
        // which rank read which node's directory, and what it sent: the
        // proof that no rank read another node's storage
        unsigned long long mine[3] = {c->read_nodes, c->rebuild_sent_bytes, c->fetch_sent_bytes};
        unsigned long long* all = c->rank == 0 ? xmalloc(sizeof(mine) * (size_t)c->world) : NULL;
        MPI_CHECK(MPI_Gather(mine, 3, MPI_UNSIGNED_LONG_LONG, all, 3, MPI_UNSIGNED_LONG_LONG, 0, MPI_COMM_WORLD));
        if (c->rank == 0) {
            printf("checkpoint: level-1 reads:");
            for (int r = 0; r < c->world; r++) {
                printf("%s rank %d read", r ? ";" : "", r);
                int any = 0;
                for (int n = 0; n < 64; n++)
                    if (all[3 * r] >> n & 1) printf("%snode-%d", any++ ? "," : " ", n);
                if (!any) printf(" nothing");
                if (all[3 * r + 1]) printf(", sent %llu bytes of xor pieces", all[3 * r + 1]);
                if (all[3 * r + 2]) printf(", sent %llu bytes of files", all[3 * r + 2]);
            }
            printf("\n");
            fflush(stdout);
        }
        free(all);
    }
    print0("checkpoint: resumed from %s (chapter %d, world %d): step %d, the next batch starts at sequence %lld\n", dir,
           m.chapter, m.world, m.step, (long long)m.step * m.B);
    if (m.step >= c->steps) print0("note: the checkpoint is at step %d, --steps %d: nothing left to train\n", m.step, c->steps);
    return m.step;
}

// ---------------------------------------------------------------- the end

void ckpt_finish(Ckpt* c, JsonLog* log) {
    if (c->pending) {
        double t0 = now_seconds();
        join_and_commit(c);
        c->finish_s += now_seconds() - t0;
    }
    if (c->local_saves > 0) {
        // level 1 and level 2: every rank's level-2 bytes per save
        double mine = (double)c->redundancy_bytes, most = 0;
        MPI_CHECK(MPI_Reduce(&mine, &most, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD));
        double per = 1e3 / c->local_saves;
        print0("checkpoint: level 1: %d save%s on %d node(s), %.2f ms per save in the training loop, of which level 2 (%s) %.2f ms; level-2 bytes per save, most on one rank: %.0f\n",
               c->local_saves, c->local_saves == 1 ? "" : "s", c->nodes, c->local_s * per,
               args_redundancy_name(c->redundancy), c->redundancy_s * per, most);
        // what the drain saves: the state is serialised once per step, on level 1
        print0("checkpoint: the state serialised to files: %zu bytes on rank 0 in %d level-1 and %d level-3 saves; %d level-3 save%s drained from level 1 (%zu bytes copied, not serialised again)\n",
               c->serialised_bytes, c->local_saves, c->saves, c->drains, c->drains == 1 ? "" : "s", c->drained_bytes);
        if (c->rank == 0) {
            JsonBuf rec = {0};
            json_add_int(&rec, "saves", c->local_saves);
            json_add_int(&rec, "nodes", c->nodes);
            json_add_string(&rec, "redundancy", args_redundancy_name(c->redundancy));
            json_add_double(&rec, "ms_per_save", c->local_s * per, "%.3f");
            json_add_double(&rec, "redundancy_ms_per_save", c->redundancy_s * per, "%.3f");
            json_add_double(&rec, "redundancy_bytes_max", most, "%.0f");
            json_add_int(&rec, "file_bytes", (long long)c->local_file_bytes);
            json_add_int(&rec, "redundancy_bytes", (long long)c->redundancy_bytes);
            json_add_int(&rec, "serialised_bytes", (long long)c->serialised_bytes);
            json_add_int(&rec, "drained_bytes", (long long)c->drained_bytes);
            json_add_int(&rec, "drains", c->drains);
            report_record(log, "checkpoint_local", &rec);
            json_free(&rec);
        }
    }
    if (c->saves > 0 || c->resume) {
        // every rank's figures, for the summary line and the log
        double mine[4] = {(double)(c->own.n ? CKPT_HEADER_BYTES + c->own.floats * sizeof(float) : 0),
                          (double)c->load_bytes, c->load_s, c->write_s};
        double* all = c->rank == 0 ? xmalloc(sizeof(double) * 4 * (size_t)c->world) : NULL;
        MPI_CHECK(MPI_Gather(mine, 4, MPI_DOUBLE, all, 4, MPI_DOUBLE, 0, MPI_COMM_WORLD));
        if (c->rank == 0) {
            double per = c->saves ? 1e3 / c->saves : 0.0;
            if (c->saves)
                printf("checkpoint: %d save%s (%s), %.1f KiB on rank 0, training stalled %.2f ms per save, file write %.2f ms per save on rank 0, %.2f ms waiting for the last save at the end\n",
                       c->saves, c->saves == 1 ? "" : "s",
                       c->drains ? (c->async ? "async, drained from level 1" : "drained from level 1") : c->async ? "async" : "sync",
                       mine[0] / 1024.0,
                       c->stall_s * per, c->write_s * per, 1e3 * c->finish_s);
            if (c->deltas && c->saves > c->deltas)
                printf("checkpoint: incremental: %d full save%s of %.1f KiB and %d delta%s of %.1f KiB on rank 0 (%.1f%% of a full save)\n",
                       c->saves - c->deltas, c->saves - c->deltas == 1 ? "" : "s",
                       c->full_bytes_total / 1024.0 / (c->saves - c->deltas), c->deltas, c->deltas == 1 ? "" : "s",
                       c->delta_bytes_total / 1024.0 / c->deltas,
                       100.0 * ((double)c->delta_bytes_total / c->deltas) / ((double)c->full_bytes_total / (c->saves - c->deltas)));
            if (c->resume) printf("checkpoint: loaded %.1f KiB on rank 0 in %.2f ms\n", mine[1] / 1024.0, 1e3 * c->load_s);
            fflush(stdout);
            // an incremental run's full and delta files on rank 0 (0: none)
            int fulls = c->saves - c->deltas;
            JsonBuf rec = {0};
            json_add_int(&rec, "saves", c->saves);
            json_add_bool(&rec, "async", c->async);
            json_add_double(&rec, "stall_ms_per_save", c->stall_s * per, "%.3f");
            json_add_double(&rec, "final_wait_ms", 1e3 * c->finish_s, "%.3f");
            json_add_int(&rec, "deltas", c->deltas);
            json_add_double(&rec, "full_bytes_per_save", fulls ? (double)c->full_bytes_total / fulls : 0.0, "%.0f");
            json_add_double(&rec, "delta_bytes_per_save", c->deltas ? (double)c->delta_bytes_total / c->deltas : 0.0,
                            "%.0f");
            // every rank's figures, one array each: all is (world, 4)
            double* per_rank = xmalloc(sizeof(double) * (size_t)c->world);
            const char* keys[4] = {"save_bytes", "write_ms_per_save", "load_bytes", "load_ms"};
            const int column[4] = {0, 3, 1, 2};  // of mine[] above
            const double scale[4] = {1.0, per, 1.0, 1e3};
            const char* fmt[4] = {"%.0f", "%.3f", "%.0f", "%.3f"};
            for (int k = 0; k < 4; k++) {
                for (int r = 0; r < c->world; r++) per_rank[r] = all[4 * r + column[k]] * scale[k];
                json_add_double_array(&rec, keys[k], per_rank, c->world, fmt[k]);
            }
            free(per_rank);
            report_record(log, "checkpoint", &rec);
            json_free(&rec);
        }
        free(all);
    }
    free(c->host);
    c->host = NULL;
    free(c->base_host);
    c->base_host = NULL;
    release_locks(c);
    refusal_ckpt = NULL;
    if (c->group != MPI_COMM_NULL) MPI_Comm_free(&c->group);
    free(c->node_of);
    c->node_of = NULL;
    ckpt_list_free(&c->own);
    ckpt_list_free(&c->need);
}
