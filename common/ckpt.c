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

// Paths and messages live in fixed buffers (4 KiB, 1 KiB); a longer one is
// cut, which gcc warns about at every snprintf. A cut message still names
// the start of the path; a path that long fails at open with a message.
#pragma GCC diagnostic ignored "-Wformat-truncation"

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

#include "errors.h"
#include "memory.h"
#include "rank.h"
#include "runtime.h"
#include "train.h"  // TrainSetup's fields (ckpt_init)

#define CKPT_FILE_MAGIC "GPTSTATE"
#define CKPT_FILE_VERSION 2u  // 2: the header holds the checksum of the rank's slice list
#define CKPT_HEADER_BYTES 64
// version 2: XXH3-64 checksums (version 1 had a 64-bit FNV variant whose
// paired flips of a word's top bit cancelled)
#define CKPT_MANIFEST_MAGIC "gpt-training-state 2"
#define CKPT_MANIFEST_MAGIC_V1 "gpt-training-state 1"

static const char* kind_names[CKPT_NUM_KINDS] = {"params", "m", "v"};

// ---------------------------------------------------------------- slices

void ckpt_add(CkptList* l, CkptSlice s) {
    if (s.count == 1) s.stride = s.len;
    if (s.len == 0 || s.count == 0) return;
    if (l->n == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 64;
        CkptSlice* grown = xmalloc(sizeof(CkptSlice) * (size_t)l->cap);
        if (l->n) memcpy(grown, l->s, sizeof(CkptSlice) * (size_t)l->n);
        free(l->s);
        l->s = grown;
    }
    l->s[l->n++] = s;
    l->floats += s.len * s.count;
}

void ckpt_add_flat(CkptList* l, const GPTConfig* cfg, CkptKind kind, size_t lo, size_t n, float* data) {
    size_t hi = lo + n;
    // each (tensor, layer) piece of the layer-major layout is one run of the
    // tensor's global index space: layer l's copy starts at l * numel
    for (ParamTensor t = 0; t < NUM_PARAM_TENSORS; t++) {
        int layers = param_tensor_is_block(t) ? cfg->num_layers : 1;
        size_t numel = param_tensor_numel(cfg, t);
        for (int layer = 0; layer < layers; layer++) {
            size_t off = gpt_tensor_offset(cfg, t, layer);
            size_t a = off > lo ? off : lo, b = off + numel < hi ? off + numel : hi;
            if (a >= b) continue;
            CkptSlice s = {.kind = kind, .tensor = t, .start = (size_t)layer * numel + (a - off),
                           .len = b - a, .stride = b - a, .count = 1, .data = data + (a - lo)};
            ckpt_add(l, s);
        }
    }
}

void ckpt_add_state(CkptList* l, const GPTConfig* cfg, size_t lo, size_t n, float* params, float* m, float* v) {
    if (params) ckpt_add_flat(l, cfg, CKPT_PARAMS, lo, n, params);
    if (m) ckpt_add_flat(l, cfg, CKPT_M, lo, n, m);
    if (v) ckpt_add_flat(l, cfg, CKPT_V, lo, n, v);
}

void ckpt_list_free(CkptList* l) {
    free(l->s);
    memset(l, 0, sizeof(*l));
}

// The global shape of tensor t (llm.c's: block tensors have L outermost).
static int tensor_shape(const GPTConfig* cfg, ParamTensor t, size_t dims[3]) {
    size_t C = (size_t)cfg->channels, L = (size_t)cfg->num_layers;
    switch (t) {
        case P_WTE: dims[0] = (size_t)cfg->padded_vocab_size; dims[1] = C; return 2;
        case P_WPE: dims[0] = (size_t)cfg->max_seq_len; dims[1] = C; return 2;
        case P_LNFW: case P_LNFB: dims[0] = C; return 1;
        case P_QKVW: dims[0] = L; dims[1] = 3 * C; dims[2] = C; return 3;
        case P_ATTPROJW: dims[0] = L; dims[1] = C; dims[2] = C; return 3;
        case P_FCW: dims[0] = L; dims[1] = 4 * C; dims[2] = C; return 3;
        case P_FCPROJW: dims[0] = L; dims[1] = C; dims[2] = 4 * C; return 3;
        case P_QKVB: dims[0] = L; dims[1] = 3 * C; return 2;
        case P_FCB: dims[0] = L; dims[1] = 4 * C; return 2;
        default: dims[0] = L; dims[1] = C; return 2;  // the LayerNorms, attprojb, fcprojb
    }
}

static size_t tensor_numel(const GPTConfig* cfg, ParamTensor t) {
    return (param_tensor_is_block(t) ? (size_t)cfg->num_layers : 1) * param_tensor_numel(cfg, t);
}

// The tensor table of c's model: the GPT's, or the one ckpt_set_model gave.
static int n_tensors_of(const Ckpt* c) { return c->tensors ? c->n_tensors : NUM_PARAM_TENSORS; }

static const char* tensor_name_of(const Ckpt* c, int t) {
    return c->tensors ? c->tensors[t].name : param_tensor_name((ParamTensor)t);
}

static int shape_of(const Ckpt* c, int t, size_t dims[4]) {
    if (!c->tensors) return tensor_shape(&c->cfg, (ParamTensor)t, dims);
    for (int d = 0; d < c->tensors[t].nd; d++) dims[d] = c->tensors[t].dims[d];
    return c->tensors[t].nd;
}

static size_t numel_of(const Ckpt* c, int t) {
    if (!c->tensors) return tensor_numel(&c->cfg, (ParamTensor)t);
    size_t n = 1;
    for (int d = 0; d < c->tensors[t].nd; d++) n *= c->tensors[t].dims[d];
    return n;
}

// ---------------------------------------------------------------- the checksum

unsigned long long ckpt_checksum(const void* buf, size_t n) { return (unsigned long long)XXH3_64bits(buf, n); }

// The streaming form, for a file written or read in pieces: the same value
// as ckpt_checksum over the concatenation, wherever the pieces are cut.
static XXH3_state_t* checksum_begin(void) {
    XXH3_state_t* s = XXH3_createState();
    if (!s || XXH3_64bits_reset(s) != XXH_OK) FATAL("cannot start an XXH3 checksum");
    return s;
}

static void checksum_add(XXH3_state_t* s, const void* buf, size_t n) {
    if (XXH3_64bits_update(s, buf, n) != XXH_OK) FATAL("XXH3 checksum update failed");
}

static unsigned long long checksum_end(XXH3_state_t* s) {
    unsigned long long h = (unsigned long long)XXH3_64bits_digest(s);
    XXH3_freeState(s);
    return h;
}

// The checksum of a list of slices as (kind, tensor, start, len, stride,
// count) rows: a rank's file header carries the one of the slices it wrote,
// and a load compares it with the slices the manifest gives that file.
static unsigned long long slice_rows_checksum(const uint64_t* rows, size_t n_rows) {
    return ckpt_checksum(rows, n_rows * 6 * sizeof(uint64_t));
}

static unsigned long long own_slices_checksum(const CkptList* l) {
    uint64_t* rows = xmalloc(sizeof(uint64_t) * 6 * (size_t)(l->n ? l->n : 1));
    for (int i = 0; i < l->n; i++) {
        const CkptSlice* s = &l->s[i];
        uint64_t row[6] = {(uint64_t)s->kind, (uint64_t)s->tensor, s->start, s->len, s->stride, s->count};
        memcpy(rows + 6 * i, row, sizeof(row));
    }
    unsigned long long h = slice_rows_checksum(rows, (size_t)l->n);
    free(rows);
    return h;
}

// ---------------------------------------------------------------- small file helpers

static int fsync_path(const char* path) {
    int fd = open(path, O_RDONLY);
    if (fd < 0) return -1;
    int rc = fsync(fd);
    close(fd);
    return rc;
}

// Removes a directory of plain files (a checkpoint or a stale .tmp).
static void remove_dir(const char* path) {
    DIR* d = opendir(path);
    if (d) {
        struct dirent* e;
        char file[4096 + 256];
        while ((e = readdir(d)) != NULL) {
            if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
            snprintf(file, sizeof(file), "%s/%s", path, e->d_name);
            unlink(file);
        }
        closedir(d);
    }
    rmdir(path);
}

// "step-00000006" and nothing more: a complete checkpoint's name; its step.
static int parse_step_name(const char* name, int* step) {
    int n = 0, used = 0;
    if (strlen(name) != 13 || sscanf(name, "step-%8d%n", &n, &used) != 1 || used != 13) return 0;
    *step = n;
    return 1;
}

static int has_manifest(const char* dir) {
    char path[4096 + 16];
    snprintf(path, sizeof(path), "%s/MANIFEST", dir);
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

const char* ckpt_latest(const char* dir, char* out, size_t out_len) {
    if (has_manifest(dir)) {
        snprintf(out, out_len, "%s", dir);
        return out;
    }
    DIR* d = opendir(dir);
    if (!d) return NULL;
    int best = -1;
    struct dirent* e;
    char path[4096 + 256];
    while ((e = readdir(d)) != NULL) {
        int step;
        if (!parse_step_name(e->d_name, &step) || step <= best) continue;
        snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
        if (has_manifest(path)) best = step;
    }
    closedir(d);
    if (best < 0) return NULL;
    snprintf(out, out_len, "%s/step-%08d", dir, best);
    return out;
}

// Keeps the newest `keep` complete checkpoints of dir (0: all).
static void prune(const char* dir, int keep) {
    if (keep <= 0) return;
    DIR* d = opendir(dir);
    if (!d) return;
    int* steps = NULL;
    int n = 0, cap = 0;
    struct dirent* e;
    while ((e = readdir(d)) != NULL) {
        int step;
        if (!parse_step_name(e->d_name, &step)) continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 16;
            int* grown = xmalloc(sizeof(int) * (size_t)cap);
            if (n) memcpy(grown, steps, sizeof(int) * (size_t)n);
            free(steps);
            steps = grown;
        }
        steps[n++] = step;
    }
    closedir(d);
    // the newest keep stay, and every full save a kept delta needs (an
    // incremental manifest names its base: "incremental base=step-B ...")
    for (int i = 0; i < n; i++)
        for (int j = i + 1; j < n; j++)
            if (steps[j] > steps[i]) {
                int t = steps[i];
                steps[i] = steps[j];
                steps[j] = t;
            }
    char* needed = xcalloc((size_t)n + 1, 1);
    char path[4096 + 32];
    for (int i = 0; i < n && i < keep; i++) {
        needed[i] = 1;
        snprintf(path, sizeof(path), "%s/step-%08d/MANIFEST", dir, steps[i]);
        FILE* f = fopen(path, "r");
        char line[256];
        int base = -1;
        while (f && fgets(line, sizeof(line), f))
            if (sscanf(line, "incremental base=step-%d", &base) == 1) break;
        if (f) fclose(f);
        for (int j = 0; j < n && base >= 0; j++)
            if (steps[j] == base) needed[j] = 1;
    }
    for (int i = 0; i < n; i++) {
        if (needed[i]) continue;
        snprintf(path, sizeof(path), "%s/step-%08d", dir, steps[i]);
        remove_dir(path);
    }
    free(needed);
    free(steps);
}

// ---------------------------------------------------------------- fault injection (tests)

// CKPT_KILL=step:S:R kills rank R with SIGKILL after step S; save:S:R kills
// it halfway through writing its file of the checkpoint of step S. Only in a
// run that did not resume, so a restarted job runs through. The tests and
// docs/checkpoints.md use it to kill a rank at a known moment.
static int fault_fires(const Ckpt* c, const char* where, int step) {
    const char* spec = getenv("CKPT_KILL");
    if (!spec || c->start_step != 0) return 0;
    char what[16];
    int s = -1, r = -1;
    if (sscanf(spec, "%15[a-z]:%d:%d", what, &s, &r) != 3) return 0;
    return !strcmp(what, where) && s == step && r == c->rank;
}

static void fault_kill(void) {
    fprintf(stderr, "[rank %d] CKPT_KILL: killing this rank (SIGKILL)\n", world_rank());
    fflush(stderr);
    raise(SIGKILL);
}

// ---------------------------------------------------------------- set-up

// One writer per checkpoint directory: rank 0 holds an exclusive flock on
// DIR/.lock for the whole run, and writes its pid, host and start time into
// it for the message a second run gets. The kernel drops the lock when the
// process ends, however it ends, so a .lock file whose lock can be taken is
// the leftover of a run that died: it is taken over with a note. (flock
// works across processes on one machine and, on Linux, on NFS through
// fcntl locks; a file system without locks gives a clear error instead.)
static const char* lock_dir(Ckpt* c, char* msg, size_t msg_len) {
    char path[4096 + 16];
    mkdir(c->dir, 0755);  // may exist; the open below says if it is unusable
    snprintf(path, sizeof(path), "%s/.lock", c->dir);
    int fd = open(path, O_RDWR | O_CREAT, 0644);
    if (fd < 0) {
        snprintf(msg, msg_len, "cannot create the lock file '%s': %s (check --ckpt-dir)", path, strerror(errno));
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
            snprintf(msg, msg_len, "--ckpt-dir '%s' is in use by another run (%s): give each run its own directory, or wait for that one to end",
                     c->dir, before[0] ? before : "its .lock file names no process");
        else
            snprintf(msg, msg_len, "cannot lock '%s': %s (a file system without file locks: use a local --ckpt-dir)", path,
                     strerror(err));
        return msg;
    }
    if (before[0]) print0("note: --ckpt-dir '%s': the lock of an earlier run (%s) is stale (that run has ended); taking it over\n", c->dir, before);
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
    c->lock_fd = fd;
    return NULL;
}

static void nodes_init(Ckpt* c, int ranks_per_node);  // level 1's nodes and groups, below

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
    c->group = MPI_COMM_NULL;
    c->local = a->ckpt_local;
    c->local_every = a->local_every;
    c->redundancy = a->redundancy;
    c->incremental = a->incremental;
    if (c->local) nodes_init(c, a->ranks_per_node);
    if (c->dir) {
        char msg[1024];
        const char* bad = c->rank == 0 ? lock_dir(c, msg, sizeof(msg)) : NULL;
        fail_if_any(bad != NULL, bad);
    }
}

void ckpt_set_model(Ckpt* c, const CkptTensor* tensors, int n, const char* variant) {
    c->tensors = tensors;
    c->n_tensors = n;
    snprintf(c->variant, sizeof(c->variant), "%s", variant ? variant : "");
}

// ---------------------------------------------------------------- writing a rank's file

// The 64-byte header of rank c->rank's file of `step`.
static void file_header(const Ckpt* c, int step, unsigned char header[CKPT_HEADER_BYTES]) {
    memset(header, 0, CKPT_HEADER_BYTES);
    uint32_t version = CKPT_FILE_VERSION, rank = (uint32_t)c->rank;
    uint64_t st = (uint64_t)step, floats = c->own.floats;
    memcpy(header, CKPT_FILE_MAGIC, 8);
    memcpy(header + 8, &version, 4);
    memcpy(header + 12, &rank, 4);
    memcpy(header + 16, &st, 8);
    memcpy(header + 24, &floats, 8);
    uint64_t slices_sum = own_slices_checksum(&c->own);
    memcpy(header + 32, &slices_sum, 8);
}

// What a file write gives: its size and checksum, or an error.
typedef struct {
    size_t bytes;
    unsigned long long hash;
    char err[1024];  // empty when the write succeeded
} FileOut;

// Writes parts[0] then parts[1] (sizes[1] may be 0) to path, fsync'ed, its
// checksum computed on the way. kill_here: the CKPT_KILL=save hook, die
// with half of parts[1] written. No MPI here (the writer thread runs it).
static void write_parts(const char* path, const void* const parts[2], const size_t sizes[2], int kill_here,
                        FileOut* out) {
    out->err[0] = 0;
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) {
        snprintf(out->err, sizeof(out->err), "cannot write checkpoint file '%s': %s", path, strerror(errno));
        return;
    }
    XXH3_state_t* sum = checksum_begin();
    for (int p = 0; p < 2; p++) checksum_add(sum, parts[p], sizes[p]);
    unsigned long long h = checksum_end(sum);
    int err = 0;
    for (int p = 0; p < 2 && !err; p++) {
        const unsigned char* bytes = parts[p];
        size_t done = 0;
        while (done < sizes[p]) {
            // the test hook: die with half the data written
            if (kill_here && p == 1 && done >= sizes[p] / 2) fault_kill();
            size_t chunk = sizes[p] - done < (1u << 24) ? sizes[p] - done : (1u << 24);
            if (kill_here && p == 1 && done < sizes[p] / 2 && done + chunk > sizes[p] / 2) chunk = sizes[p] / 2 - done;
            ssize_t w = write(fd, bytes + done, chunk);
            if (w < 0 && errno == EINTR) continue;
            if (w <= 0) {
                err = w < 0 ? errno : EIO;
                break;
            }
            done += (size_t)w;
        }
    }
    if (kill_here) fault_kill();  // an empty payload: die anyway
    if (!err && fsync(fd) != 0) err = errno;
    if (close(fd) != 0 && !err) err = errno;
    if (err) {
        snprintf(out->err, sizeof(out->err), "writing checkpoint file '%s' failed: %s", path, strerror(err));
        return;
    }
    out->hash = h;
    out->bytes = sizes[0] + sizes[1];
}

// Copies the file src to dst, fsync'ed, its checksum computed on the way
// (the drain of a level-1 file to level 3). kill_here: the CKPT_KILL=save
// hook, die with half of it copied. No MPI here (the writer thread runs it).
static void copy_file(const char* src, const char* dst, int kill_here, FileOut* out) {
    out->err[0] = 0;
    int in = open(src, O_RDONLY);
    if (in < 0) {
        snprintf(out->err, sizeof(out->err), "cannot read the level-1 file '%s' to drain it to level 3: %s", src, strerror(errno));
        return;
    }
    struct stat st;
    int fd = fstat(in, &st) == 0 ? open(dst, O_WRONLY | O_CREAT | O_TRUNC, 0644) : -1;
    if (fd < 0) {
        snprintf(out->err, sizeof(out->err), "cannot write checkpoint file '%s': %s", dst, strerror(errno));
        close(in);
        return;
    }
    size_t total = (size_t)st.st_size, done = 0, cap = (size_t)1 << 24;
    unsigned char* buf = xmalloc(cap);
    XXH3_state_t* sum = checksum_begin();
    int err = 0;
    while (done < total && !err) {
        if (kill_here && done >= total / 2) fault_kill();
        size_t want = total - done < cap ? total - done : cap;
        if (kill_here && done < total / 2 && done + want > total / 2) want = total / 2 - done;
        ssize_t r = read(in, buf, want);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            err = r < 0 ? errno : EIO;  // shorter than fstat said: it changed under us
            break;
        }
        checksum_add(sum, buf, (size_t)r);
        for (ssize_t w, put = 0; put < r && !err; put += w) {
            w = write(fd, buf + put, (size_t)(r - put));
            if (w < 0 && errno == EINTR) w = 0;
            else if (w <= 0) err = w < 0 ? errno : EIO;
        }
        done += (size_t)r;
    }
    if (kill_here) fault_kill();
    free(buf);
    unsigned long long h = checksum_end(sum);
    close(in);
    if (!err && fsync(fd) != 0) err = errno;
    if (close(fd) != 0 && !err) err = errno;
    if (err) {
        snprintf(out->err, sizeof(out->err), "draining '%s' to checkpoint file '%s' failed: %s", src, dst, strerror(err));
        return;
    }
    out->hash = h;
    out->bytes = total;
}

// Writes c->host behind the header to c->file_path: fsync'ed, its checksum
// and size in c->file_hash / c->file_bytes, an error in c->file_err. Runs on
// the main thread (sync) or the writer thread (async); no MPI here.
static void write_file(Ckpt* c) {
    double t0 = now_seconds();
    unsigned char header[CKPT_HEADER_BYTES];
    file_header(c, c->pending_step, header);
    size_t data_bytes = c->own.floats * sizeof(float);
    const void* parts[2] = {header, c->host};
    size_t sizes[2] = {sizeof(header), data_bytes};
    FileOut out;
    c->delta_bytes = 0;
    if (c->pending_delta) {
        // the full file's size and checksum, which the resume checks after
        // applying the delta, then the delta: the xor of the state with the
        // last full save's, compressed (an unchanged bit is a 0 bit)
        XXH3_state_t* sum = checksum_begin();
        checksum_add(sum, header, sizeof(header));
        checksum_add(sum, c->host, data_bytes);
        c->file_hash = checksum_end(sum);
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
        write_parts(c->delta_path, parts, sizes, fault_fires(c, "save", c->pending_step), &out);
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
        copy_file(c->drain_src, c->file_path, fault_fires(c, "save", c->pending_step), &out);
        if (!out.err[0] && (out.bytes != c->local_file_bytes || out.hash != c->local_file_hash))
            snprintf(out.err, sizeof(out.err), "draining '%s' to '%s': the level-1 file changed since its save (%zu bytes, checksum %016llx; level 1 wrote %zu, %016llx)",
                     c->drain_src, c->file_path, out.bytes, out.hash, c->local_file_bytes, c->local_file_hash);
        if (!out.err[0]) c->drained_bytes += out.bytes;
    } else {
        write_parts(c->file_path, parts, sizes, fault_fires(c, "save", c->pending_step), &out);
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

// ---------------------------------------------------------------- commit: manifest last, then rename

static void tmp_dir_of(const char* base, int step, char* out, size_t len) {
    snprintf(out, len, "%s/step-%08d.tmp", base, step);
}

// Rank 0's manifest text from every rank's slice list and file figures
// (files: 5 per rank: has a file, its bytes and checksum, its xor parity's
// bytes and checksum). level 1 adds the nodes and the redundancy.
static char* manifest_text(const Ckpt* c, int step, const int* counts, const uint64_t* meta, const uint64_t* files,
                           int level, size_t* text_len) {
    // the manifest as text in memory, then written in one go
    size_t cap = 4096, len = 0;
    int total = 0;
    for (int r = 0; r < c->world; r++) total += counts[r];
    cap += (size_t)total * 160 + (size_t)c->world * 160 + (size_t)(3 * n_tensors_of(c) + 16) * 112 + sizeof(c->variant);
    char* text = xmalloc(cap);
#define OUT(...) len += (size_t)snprintf(text + len, cap - len, __VA_ARGS__)
    const GPTConfig* g = &c->cfg;
    OUT("%s\n", CKPT_MANIFEST_MAGIC);
    OUT("chapter %d\n", c->chapter);
    OUT("mesh dp=%d tp=%d pp=%d cp=%d ep=%d world=%d\n", c->mesh[AXIS_DP], c->mesh[AXIS_TP], c->mesh[AXIS_PP],
        c->mesh[AXIS_CP], c->mesh[AXIS_EP], c->world);
    OUT("model maxT=%d V=%d Vp=%d L=%d NH=%d C=%d\n", g->max_seq_len, g->vocab_size, g->padded_vocab_size,
        g->num_layers, g->num_heads, g->channels);
    if (c->variant[0]) OUT("variant %s\n", c->variant);
    OUT("step %d\n", step);
    // the data position: llm.c's order, batch s starts at sequence s*B
    OUT("data batch=%d seq=%d next_sequence=%lld\n", c->B, c->T, (long long)step * c->B);
    // init is counter-based and sampling seeds itself from --seed: the seed
    // is the whole RNG state
    OUT("rng seed=%d\n", c->seed);
    OUT("adamw lr=%.9g wd=%.9g clip=%.9g t=%d\n", c->lr, c->wd, c->clip, step);
    int n_files = 0;
    for (int r = 0; r < c->world; r++) n_files += files[5 * r] != 0;
    OUT("files %d\n", n_files);
    int* file_index = xmalloc(sizeof(int) * (size_t)c->world);
    for (int r = 0, f = 0; r < c->world; r++) {
        file_index[r] = files[5 * r] ? f++ : -1;
        if (files[5 * r])
            OUT("file %d rank-%05d.bin bytes=%llu hash=%016llx\n", file_index[r], r,
                (unsigned long long)files[5 * r + 1], (unsigned long long)files[5 * r + 2]);
    }
    if (level == 1) {
        // which node held which rank's files: the partner and the xor
        // groups follow from it
        OUT("level 1 nodes=%d redundancy=%s\nnode-of", c->nodes, args_redundancy_name(c->redundancy));
        for (int r = 0; r < c->world; r++) OUT(" %d", c->node_of[r]);
        OUT("\n");
        for (int r = 0; r < c->world; r++)
            if (files[5 * r + 3])
                OUT("parity %d bytes=%llu hash=%016llx\n", r, (unsigned long long)files[5 * r + 3],
                    (unsigned long long)files[5 * r + 4]);
    }
    if (level == 3 && c->pending_delta) {
        // an incremental save: each file is a delta against the full save
        // of base_step, named by its manifest's checksum (another run's
        // step-B is refused); the file lines give the full files it restores
        OUT("incremental base=step-%08d base_hash=%016llx\n", c->base_step, c->base_manifest_hash);
        for (int r = 0; r < c->world; r++)
            if (files[5 * r])
                OUT("delta %d bytes=%llu hash=%016llx\n", r, (unsigned long long)files[5 * r + 3],
                    (unsigned long long)files[5 * r + 4]);
    }
    OUT("tensors %d\n", CKPT_NUM_KINDS * n_tensors_of(c));
    for (int k = 0; k < CKPT_NUM_KINDS; k++)
        for (int t = 0; t < n_tensors_of(c); t++) {
            size_t dims[4];
            int nd = shape_of(c, t, dims);
            OUT("tensor %s.%s %d", kind_names[k], tensor_name_of(c, t), nd);
            for (int d = 0; d < nd; d++) OUT(" %zu", dims[d]);
            OUT("\n");
        }
    OUT("slices %d\n", total);
    const uint64_t* m = meta;
    for (int r = 0; r < c->world; r++) {
        uint64_t offset = CKPT_HEADER_BYTES;
        for (int i = 0; i < counts[r]; i++, m += 6) {
            OUT("slice %s.%s file=%d offset=%llu start=%llu len=%llu stride=%llu count=%llu\n", kind_names[m[0]],
                tensor_name_of(c, (int)m[1]), file_index[r], (unsigned long long)offset,
                (unsigned long long)m[2], (unsigned long long)m[3], (unsigned long long)m[4],
                (unsigned long long)m[5]);
            offset += m[3] * m[5] * sizeof(float);
        }
    }
    // the manifest's own checksum, over every byte before this line
    unsigned long long h = ckpt_checksum(text, len);
    OUT("end %016llx\n", h);
#undef OUT
    free(file_index);
    *text_len = len;
    return text;
}

// Writes the manifest text into BASE/step-N.tmp, then renames that
// directory to BASE/step-N. Returns NULL or a message.
static const char* install_manifest(const Ckpt* c, const char* base, int step, const char* text, size_t len,
                                    char* msg, size_t msg_len) {
    char tmp[4096], final[4096], path[4096 + 16];
    tmp_dir_of(base, step, tmp, sizeof(tmp));
    snprintf(final, sizeof(final), "%s/step-%08d", base, step);
    snprintf(path, sizeof(path), "%s/MANIFEST", tmp);
    // every error names its own errno (a short write on a full disk sets
    // none: the next write says ENOSPC), and a failed manifest takes its
    // .tmp directory with it, so nothing half-written stays behind
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644), err = fd < 0 ? errno : 0;
    for (size_t done = 0; !err && done < len;) {
        ssize_t w = write(fd, text + done, len - done);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) err = w < 0 ? errno : EIO;
        else done += (size_t)w;
    }
    if (!err && fsync(fd) != 0) err = errno;
    if (fd >= 0 && close(fd) != 0 && !err) err = errno;
    if (err) {
        snprintf(msg, msg_len, "cannot write the checkpoint manifest '%s': %s; the checkpoint of step %d is not saved (earlier ones are kept)",
                 path, strerror(err), step);
        remove_dir(tmp);
        return msg;
    }
    // every file and the manifest are on disk; the directory entries too
    fsync_path(tmp);
    // into place: a checkpoint of this step already there (a run restarted
    // from an older one) moves aside first, since rename cannot replace a
    // non-empty directory
    struct stat st;
    char old[4096 + 16];
    snprintf(old, sizeof(old), "%s.old", final);
    int replacing = stat(final, &st) == 0;
    if (replacing) {
        remove_dir(old);
        if (rename(final, old) != 0) replacing = 0;
    }
    if (rename(tmp, final) != 0) {
        snprintf(msg, msg_len, "cannot rename checkpoint '%s' to '%s': %s", tmp, final, strerror(errno));
        remove_dir(tmp);
        if (replacing) rename(old, final);  // the checkpoint that was there comes back
        return msg;
    }
    fsync_path(base);
    if (replacing) remove_dir(old);
    prune(base, c->keep);
    return NULL;
}

// Gathers every rank's slice list (6 numbers per slice) and file figures
// (file: 5 numbers, manifest_text's) on rank 0, which returns the manifest
// text (the other ranks NULL). Collective.
static char* gather_manifest(const Ckpt* c, int step, const uint64_t file[5], int level, size_t* len) {
    int n = c->own.n;
    uint64_t* mine = xmalloc(sizeof(uint64_t) * 6 * (size_t)(n ? n : 1));
    for (int i = 0; i < n; i++) {
        const CkptSlice* s = &c->own.s[i];
        uint64_t row[6] = {(uint64_t)s->kind, (uint64_t)s->tensor, s->start, s->len, s->stride, s->count};
        memcpy(mine + 6 * i, row, sizeof(row));
    }
    int* counts = NULL;
    int* displs = NULL;
    uint64_t *meta = NULL, *files = NULL;
    if (c->rank == 0) {
        counts = xmalloc(sizeof(int) * (size_t)c->world);
        displs = xmalloc(sizeof(int) * (size_t)c->world);
        files = xmalloc(sizeof(uint64_t) * 5 * (size_t)c->world);
    }
    int n6 = 6 * n;
    MPI_CHECK(MPI_Gather(&n6, 1, MPI_INT, counts, 1, MPI_INT, 0, MPI_COMM_WORLD));
    MPI_CHECK(MPI_Gather(file, 5, MPI_UINT64_T, files, 5, MPI_UINT64_T, 0, MPI_COMM_WORLD));
    if (c->rank == 0) {
        int total = 0;
        for (int r = 0; r < c->world; r++) {
            displs[r] = total;
            total += counts[r];
        }
        meta = xmalloc(sizeof(uint64_t) * (size_t)(total ? total : 1));
    }
    MPI_CHECK(MPI_Gatherv(mine, n6, MPI_UINT64_T, meta, counts, displs, MPI_UINT64_T, 0, MPI_COMM_WORLD));
    char* text = NULL;
    if (c->rank == 0) {
        for (int r = 0; r < c->world; r++) counts[r] /= 6;
        text = manifest_text(c, step, counts, meta, files, level, len);
    }
    free(mine);
    free(counts);
    free(displs);
    free(meta);
    free(files);
    return text;
}

// After every rank's file is on disk (or failed): the collective part of a
// save. Gathers the slice lists and file figures on rank 0, which writes the
// manifest and renames the directory.
static void commit(Ckpt* c) {
    int step = c->pending_step;
    int has_file = c->own.n > 0;
    // a failed write on any rank: the .tmp directory goes, the previous
    // checkpoint stays the latest, and every rank ends with the message
    int failed = has_file && c->file_err[0], any = 0;
    MPI_CHECK(MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD));
    if (any && c->rank == 0) {
        char tmp[4096];
        tmp_dir_of(c->dir, step, tmp, sizeof(tmp));
        remove_dir(tmp);
    }
    fail_if_any(failed, c->file_err);
    // slots 3 and 4: the delta's file, for an incremental save
    uint64_t file[5] = {(uint64_t)has_file, has_file ? c->file_bytes : 0, has_file ? c->file_hash : 0,
                        has_file && c->pending_delta ? c->delta_bytes : 0, has_file && c->pending_delta ? c->delta_hash : 0};
    size_t len = 0;
    char* text = gather_manifest(c, step, file, 3, &len);
    // a full save is the base of the deltas that follow: its manifest's checksum names it
    if (c->rank == 0 && !c->pending_delta) c->base_manifest_hash = ckpt_checksum(text, len);
    char msg[1024];
    const char* bad = c->rank == 0 ? install_manifest(c, c->dir, step, text, len, msg, sizeof(msg)) : NULL;
    free(text);
    fail_if_any(bad != NULL, bad);
    if (has_file) {
        if (c->pending_delta) c->deltas++, c->delta_bytes_total += c->delta_bytes;
        else c->full_bytes_total += c->file_bytes;
    }
    c->pending = 0;
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

// ---------------------------------------------------------------- level 1 and level 2

// LOCAL/node-K: node K's level-1 directory (node-local storage on a cluster).
static void node_dir(const Ckpt* c, int node, char* out, size_t len) { snprintf(out, len, "%s/node-%d", c->local, node); }

// Which ranks form a node: --ranks-per-node R (rank / R, nodes simulated on
// one machine), else the ranks that share memory (MPI's shared-memory
// split), nodes numbered by their lowest rank. Then the level-2 groups: the
// ranks at the same place on every node, ordered by node, so a group never
// has two ranks on one node. Collective.
static void nodes_init(Ckpt* c, int ranks_per_node) {
    int key = ranks_per_node > 0 ? c->rank / ranks_per_node : c->rank;
    if (ranks_per_node <= 0) {
        MPI_Comm node;
        MPI_CHECK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node));
        MPI_CHECK(MPI_Allreduce(&c->rank, &key, 1, MPI_INT, MPI_MIN, node));
        MPI_Comm_free(&node);
    }
    int* keys = xmalloc(sizeof(int) * (size_t)c->world);
    MPI_CHECK(MPI_Allgather(&key, 1, MPI_INT, keys, 1, MPI_INT, MPI_COMM_WORLD));
    c->node_of = xmalloc(sizeof(int) * (size_t)c->world);
    c->nodes = 0;
    for (int r = 0; r < c->world; r++) {
        // the node's number: how many distinct keys are smaller
        int below = 0;
        for (int q = 0; q < c->world; q++) {
            int first = 1;
            for (int p = 0; p < q && first; p++) first = keys[p] != keys[q];
            below += first && keys[q] < keys[r];
        }
        c->node_of[r] = below;
        if (below + 1 > c->nodes) c->nodes = below + 1;
    }
    free(keys);
    c->node = c->node_of[c->rank];
    c->local_index = 0;
    for (int r = 0; r < c->rank; r++) c->local_index += c->node_of[r] == c->node;
    MPI_CHECK(MPI_Comm_split(MPI_COMM_WORLD, c->local_index, c->node, &c->group));
    MPI_CHECK(MPI_Comm_size(c->group, &c->group_size));
    MPI_CHECK(MPI_Comm_rank(c->group, &c->group_index));
    char msg[1024];
    int alone = c->redundancy != CKPT_REDUNDANCY_NONE && c->group_size < 2;
    snprintf(msg, sizeof(msg), "--ckpt-redundancy %s keeps each rank's level-1 files on another node, but rank %d has no rank at its place (%d) on another node (%d node(s)): run on more nodes, or simulate them with --ranks-per-node",
             args_redundancy_name(c->redundancy), c->rank, c->local_index, c->nodes);
    fail_if_any(alone, msg);
}

// Sends n bytes to `to` and receives m bytes from `from` over comm, in
// pieces an int counts.
static void sendrecv_bytes(const void* out, size_t n, int to, void* in, size_t m, int from, MPI_Comm comm) {
    const size_t piece = (size_t)1 << 30;
    for (size_t at = 0; at < n || at < m; at += piece) {
        int ns = at < n ? (int)(n - at < piece ? n - at : piece) : 0;
        int ms = at < m ? (int)(m - at < piece ? m - at : piece) : 0;
        MPI_CHECK(MPI_Sendrecv(ns ? (const char*)out + at : out, ns, MPI_BYTE, to, 77, ms ? (char*)in + at : in, ms,
                               MPI_BYTE, from, 77, comm, MPI_STATUS_IGNORE));
    }
}

// The xor parity's geometry for a group of g files of at most max_bytes:
// each file, zero-padded, is cut in g - 1 chunks of `chunk` bytes (a
// multiple of 8, for the 64-bit xor).
static size_t xor_chunk(size_t max_bytes, int g) {
    size_t chunk = (max_bytes + (size_t)(g - 2)) / (size_t)(g - 1);
    return (chunk + 7) / 8 * 8;
}

// Which chunk of member j's file goes into member i's parity (i != j):
// every member's g - 1 chunks go to the g - 1 others, one each, so the
// parities are spread over the nodes as RAID-5's are.
static int xor_chunk_of(int j, int i, int g) { return ((i - j - 1) % g + g) % g; }

#define CKPT_XOR_MAGIC "GPTXOR01"

// Level 2, partner: this rank's file image goes to the next node's rank of
// its group, which writes it under the same name (the same bytes, so the
// same checksum as the original); this rank writes the previous node's.
static void partner_copy(Ckpt* c, const unsigned char* image, size_t bytes, const char* tmp, FileOut* out) {
    int g = c->group_size, to = (c->group_index + 1) % g, from = (c->group_index + g - 1) % g;
    uint64_t mine = bytes, theirs = 0;
    sendrecv_bytes(&mine, sizeof(mine), to, &theirs, sizeof(theirs), from, c->group);
    // the world rank whose copy this is: the group's members by node
    int src_world = -1;
    MPI_Group wg, gg;
    MPI_CHECK(MPI_Comm_group(c->group, &gg));
    MPI_CHECK(MPI_Comm_group(MPI_COMM_WORLD, &wg));
    MPI_CHECK(MPI_Group_translate_ranks(gg, 1, &from, wg, &src_world));
    MPI_Group_free(&gg);
    MPI_Group_free(&wg);
    unsigned char* copy = xmalloc(theirs ? theirs : 1);
    sendrecv_bytes(image, bytes, to, copy, theirs, from, c->group);
    out->err[0] = 0;
    if (theirs) {
        char path[4096 + 32];
        snprintf(path, sizeof(path), "%s/rank-%05d.bin", tmp, src_world);
        const void* parts[2] = {copy, NULL};
        size_t sizes[2] = {theirs, 0};
        write_parts(path, parts, sizes, 0, out);
    }
    c->redundancy_bytes = theirs;
    free(copy);
}

// Level 2, xor: one reduce-scatter over the group leaves member i the xor
// of chunk xor_chunk_of(j, i) of every other member j's file; it writes
// that parity to xor-R.bin behind a 64-byte header. One lost member's file
// is then the xor of its chunks' parities with the others' chunks.
static void xor_parity(Ckpt* c, int step, const unsigned char* image, size_t bytes, const char* tmp, FileOut* out) {
    int g = c->group_size, me = c->group_index;
    uint64_t mine = bytes, max_bytes = 0;
    MPI_CHECK(MPI_Allreduce(&mine, &max_bytes, 1, MPI_UINT64_T, MPI_MAX, c->group));
    out->err[0] = 0;
    out->bytes = 0;
    if (max_bytes == 0) return;  // no member has a file: nothing to protect
    size_t chunk = xor_chunk(max_bytes, g);
    unsigned char* send = xcalloc((size_t)g, chunk);
    for (int i = 0; i < g; i++) {
        if (i == me) continue;
        size_t at = (size_t)xor_chunk_of(me, i, g) * chunk;
        if (at < bytes) memcpy(send + (size_t)i * chunk, image + at, bytes - at < chunk ? bytes - at : chunk);
    }
    unsigned char* parity = xmalloc(chunk);
    MPI_CHECK(MPI_Reduce_scatter_block(send, parity, (int)(chunk / 8), MPI_UINT64_T, MPI_BXOR, c->group));
    free(send);
    unsigned char header[CKPT_HEADER_BYTES] = {0};
    uint64_t st = (uint64_t)step, ch = chunk;
    uint32_t gs = (uint32_t)g, gi = (uint32_t)me;
    memcpy(header, CKPT_XOR_MAGIC, 8);
    memcpy(header + 8, &st, 8);
    memcpy(header + 16, &gs, 4);
    memcpy(header + 20, &gi, 4);
    memcpy(header + 24, &ch, 8);
    char path[4096 + 32];
    snprintf(path, sizeof(path), "%s/xor-%05d.bin", tmp, c->rank);
    const void* parts[2] = {header, parity};
    size_t sizes[2] = {sizeof(header), chunk};
    write_parts(path, parts, sizes, 0, out);
    c->redundancy_bytes = out->err[0] ? 0 : out->bytes;
    free(parity);
}

// Removes the .tmp directories a crashed save left in base.
static void remove_stale_tmp(const char* base) {
    DIR* d = opendir(base);
    struct dirent* e;
    char path[4096 + 256];
    while (d && (e = readdir(d)) != NULL) {
        size_t nl = strlen(e->d_name);
        if (strncmp(e->d_name, "step-", 5) || nl < 5 || strcmp(e->d_name + nl - 4, ".tmp")) continue;
        snprintf(path, sizeof(path), "%s/%s", base, e->d_name);
        remove_dir(path);
    }
    if (d) closedir(d);
}

// A level-1 save of the state already in c->host: every rank writes its
// file into its node's directory, level 2 adds the partner copy or the
// parity, rank 0 builds the manifest (with the nodes and the parities) and
// every node's lowest rank writes it into its directory and renames it into
// place. Synchronous: node-local storage is fast, and the files must be
// there before level 2 and the manifest.
static void save_local(Ckpt* c, int step) {
    double t0 = now_seconds();
    char base[4096], tmp[4096 + 32], msg[1024];
    const char* bad = NULL;
    node_dir(c, c->node, base, sizeof(base));
    tmp_dir_of(base, step, tmp, sizeof(tmp));
    if (c->local_index == 0) {
        mkdir(c->local, 0755);  // may exist; the mkdir below says if it is unusable
        mkdir(base, 0755);
        if (c->local_saves == 0) remove_stale_tmp(base);
        remove_dir(tmp);
        if (mkdir(tmp, 0755) != 0) {
            snprintf(msg, sizeof(msg), "cannot create the level-1 checkpoint directory '%s': %s (check --ckpt-local)", tmp,
                     strerror(errno));
            bad = msg;
        }
    }
    fail_if_any(bad != NULL, bad);
    // the file image: the header and the state, as level 3 writes it
    unsigned char header[CKPT_HEADER_BYTES];
    file_header(c, step, header);
    int has_file = c->own.n > 0;
    size_t bytes = has_file ? CKPT_HEADER_BYTES + c->own.floats * sizeof(float) : 0;
    FileOut own = {0}, extra = {0};
    if (has_file) {
        char path[4096 + 64];
        snprintf(path, sizeof(path), "%s/rank-%05d.bin", tmp, c->rank);
        const void* parts[2] = {header, c->host};
        size_t sizes[2] = {CKPT_HEADER_BYTES, c->own.floats * sizeof(float)};
        write_parts(path, parts, sizes, 0, &own);
        if (!own.err[0]) c->serialised_bytes += own.bytes;
        c->local_file_bytes = own.bytes;
        c->local_file_hash = own.hash;
    }
    if (c->redundancy != CKPT_REDUNDANCY_NONE) {
        double t1 = now_seconds();
        // level 2 needs the image in one piece (a copy: the header in front)
        unsigned char* image = xmalloc(bytes ? bytes : 1);
        if (bytes) {
            memcpy(image, header, CKPT_HEADER_BYTES);
            memcpy(image + CKPT_HEADER_BYTES, c->host, bytes - CKPT_HEADER_BYTES);
        }
        if (c->redundancy == CKPT_REDUNDANCY_PARTNER) partner_copy(c, image, bytes, tmp, &extra);
        else xor_parity(c, step, image, bytes, tmp, &extra);
        free(image);
        c->redundancy_s += now_seconds() - t1;
    }
    int failed = own.err[0] || extra.err[0];
    fail_if_any(failed, own.err[0] ? own.err : extra.err);
    uint64_t file[5] = {(uint64_t)has_file, has_file ? own.bytes : 0, has_file ? own.hash : 0,
                        c->redundancy == CKPT_REDUNDANCY_XOR ? extra.bytes : 0,
                        c->redundancy == CKPT_REDUNDANCY_XOR ? extra.hash : 0};
    size_t len = 0;
    char* text = gather_manifest(c, step, file, 1, &len);
    // every node gets the manifest: rank 0 cannot write into another node's storage
    uint64_t len64 = len;
    MPI_CHECK(MPI_Bcast(&len64, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD));
    if (c->rank != 0) text = xmalloc(len64 + 1);
    MPI_CHECK(MPI_Bcast(text, (int)len64, MPI_CHAR, 0, MPI_COMM_WORLD));
    bad = c->local_index == 0 ? install_manifest(c, base, step, text, (size_t)len64, msg, sizeof(msg)) : NULL;
    free(text);
    fail_if_any(bad != NULL, bad);
    c->local_saves++;
    c->local_s += now_seconds() - t0;
    print0("checkpoint: saved level 1 %s/node-*/step-%08d (redundancy %s)\n", c->local, step,
           args_redundancy_name(c->redundancy));
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
        save_local(c, step);
        t0 += c->local_s - before;
    }
    if (!durable) {
        c->stall_s += now_seconds() - t0;
        return;
    }
    // rank 0 makes the .tmp directory (a stale one from a crash goes first)
    char msg[1024], tmp[4096];
    const char* bad = NULL;
    tmp_dir_of(c->dir, step, tmp, sizeof(tmp));
    if (c->rank == 0) {
        mkdir(c->dir, 0755);  // may exist; the checks below say if it is unusable
        if (c->saves == 0) remove_stale_tmp(c->dir);  // leftovers of a crashed save: never read, removed
        remove_dir(tmp);
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
        node_dir(c, c->node, base, sizeof(base));
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
    if (fault_fires(c, "step", step)) fault_kill();
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

// ---------------------------------------------------------------- load

typedef struct {
    int kind, tensor, file;
    size_t offset, start, len, stride, count;
} SavedSlice;

typedef struct {
    char name[64];
    unsigned long long bytes, hash;
    char* path;  // where it is read from: DIR/name, a level-1 copy, a rebuild or a restored delta
} SavedFile;

// Sets f->path (allocated: a manifest may list many files, each path long).
static void set_path(SavedFile* f, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
static void set_path(SavedFile* f, const char* fmt, ...) {
    char buf[4096 + 160];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    free(f->path);
    f->path = xmalloc(strlen(buf) + 1);
    memcpy(f->path, buf, strlen(buf) + 1);
}

typedef struct {
    int step, B, T, seed, chapter, world;
    GPTConfig cfg;
    float lr, wd, clip;
    int n_files, n_slices;
    SavedFile* files;
    SavedSlice* slices;
    // a level-1 manifest's: the nodes, the redundancy, each rank's parity
    int level, nodes, redundancy;
    int* node_of;                          // (world)
    unsigned long long *parity_bytes, *parity_hash;  // (world) 0 bytes: none
    // an incremental save's: the full save it is a delta against (-1: none)
    int base_step;
    unsigned long long base_hash;
    unsigned long long *delta_bytes, *delta_hash;  // (world)
    int* holder;  // (files) a level-1 resume's: the rank that serves each file
} Manifest;

static void manifest_free(Manifest* m) {
    for (int i = 0; m->files && i < m->n_files; i++) free(m->files[i].path);
    free(m->files);
    free(m->slices);
    free(m->node_of);
    free(m->parity_bytes);
    free(m->parity_hash);
    free(m->delta_bytes);
    free(m->delta_hash);
    free(m->holder);
    m->holder = NULL;
    m->delta_bytes = m->delta_hash = NULL;
    // the scalars stay: ckpt_resume reports them after the reads
    m->files = NULL, m->slices = NULL, m->node_of = NULL, m->parity_bytes = m->parity_hash = NULL;
}

static int find_tensor(const Ckpt* c, const char* name, int* kind, int* tensor) {
    for (int k = 0; k < CKPT_NUM_KINDS; k++)
        for (int t = 0; t < n_tensors_of(c); t++) {
            char full[64];
            snprintf(full, sizeof(full), "%s.%s", kind_names[k], tensor_name_of(c, t));
            if (!strcmp(full, name)) {
                *kind = k;
                *tensor = (int)t;
                return 1;
            }
        }
    return 0;
}

// Reads and checks DIR/MANIFEST. Returns NULL or a message naming it.
static const char* read_manifest(const char* dir, const Ckpt* c, Manifest* m, char* msg, size_t msg_len) {
    const GPTConfig* want = &c->cfg;
    char variant[256] = "";  // the manifest's variant line (none: the GPT)
    memset(m, 0, sizeof(*m));
    m->base_step = -1;  // a full save unless an incremental line says otherwise
    char path[4096 + 16];
    snprintf(path, sizeof(path), "%s/MANIFEST", dir);
    FILE* f = fopen(path, "rb");
    if (!f) {
        snprintf(msg, msg_len, "cannot open the checkpoint manifest '%s': %s", path, strerror(errno));
        return msg;
    }
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    char* text = xmalloc((size_t)(size > 0 ? size : 0) + 1);
    size_t got = fread(text, 1, (size_t)(size > 0 ? size : 0), f);
    fclose(f);
    text[got] = 0;
    // a manifest of the first format: its checksums cannot be verified
    if (!strncmp(text, CKPT_MANIFEST_MAGIC_V1 "\n", strlen(CKPT_MANIFEST_MAGIC_V1) + 1)) {
        snprintf(msg, msg_len, "checkpoint manifest '%s' is of the first format, whose checksum is no longer trusted: resume from a checkpoint written by this version, or from the weights alone (--model FILE.bin)",
                 path);
        free(text);
        return msg;
    }
    // the last line is "end HASH" over every byte before it
    char* end = NULL;
    for (char* p = strstr(text, "\nend "); p; p = strstr(p + 1, "\nend ")) end = p + 1;
    unsigned long long h = 0;
    if (!end || sscanf(end, "end %llx", &h) != 1 || h != ckpt_checksum(text, (size_t)(end - text))) {
        snprintf(msg, msg_len, "checkpoint manifest '%s' is corrupt or truncated (its checksum line does not match): resume from another checkpoint",
                 path);
        free(text);
        return msg;
    }
    const char* bad = NULL;
    int line_no = 0, files_seen = 0, slices_seen = 0, tensors_seen = 0;
    GPTConfig* g = &m->cfg;
    for (char* line = strtok(text, "\n"); line && line < end && !bad; line = strtok(NULL, "\n")) {
        line_no++;
        int ok = 1;
        if (line_no == 1) ok = !strcmp(line, CKPT_MANIFEST_MAGIC);
        else if (!strncmp(line, "chapter ", 8)) ok = sscanf(line, "chapter %d", &m->chapter) == 1;
        else if (!strncmp(line, "mesh ", 5)) ok = strstr(line, "world=") && sscanf(strstr(line, "world="), "world=%d", &m->world) == 1;
        else if (!strncmp(line, "model ", 6)) {
            ok = sscanf(line, "model maxT=%d V=%d Vp=%d L=%d NH=%d C=%d", &g->max_seq_len, &g->vocab_size,
                        &g->padded_vocab_size, &g->num_layers, &g->num_heads, &g->channels) == 6;
            // a checkpoint of another model is refused whole, before its tensors
            if (ok && memcmp(g, want, sizeof(GPTConfig)) != 0) {
                snprintf(msg, msg_len, "checkpoint '%s' holds a model with L=%d C=%d NH=%d V=%d Vp=%d maxT=%d; this run's has L=%d C=%d NH=%d V=%d Vp=%d maxT=%d: resume with the model it was saved from",
                         dir, g->num_layers, g->channels, g->num_heads, g->vocab_size, g->padded_vocab_size,
                         g->max_seq_len, want->num_layers, want->channels, want->num_heads, want->vocab_size,
                         want->padded_vocab_size, want->max_seq_len);
                bad = msg;
            }
        }
        else if (!strncmp(line, "variant ", 8)) snprintf(variant, sizeof(variant), "%s", line + 8);
        else if (!strncmp(line, "step ", 5)) ok = sscanf(line, "step %d", &m->step) == 1 && m->step >= 0;
        else if (!strncmp(line, "data ", 5)) ok = sscanf(line, "data batch=%d seq=%d", &m->B, &m->T) == 2;
        else if (!strncmp(line, "rng ", 4)) ok = sscanf(line, "rng seed=%d", &m->seed) == 1;
        else if (!strncmp(line, "adamw ", 6)) ok = sscanf(line, "adamw lr=%f wd=%f clip=%f", &m->lr, &m->wd, &m->clip) == 3;
        else if (!strncmp(line, "files ", 6)) {
            // one "files" line: a second would replace the list (and leak it)
            ok = !m->files && sscanf(line, "files %d", &m->n_files) == 1 && m->n_files >= 0 && m->n_files < (1 << 24);
            if (ok) m->files = xcalloc((size_t)m->n_files + 1, sizeof(SavedFile));
        } else if (!strncmp(line, "file ", 5)) {
            int i = -1;
            ok = m->files && sscanf(line, "file %d", &i) == 1 && i == files_seen && i < m->n_files &&
                 sscanf(line, "file %*d %63s bytes=%llu hash=%llx", m->files[i].name, &m->files[i].bytes,
                        &m->files[i].hash) == 3 && !strchr(m->files[i].name, '/');
            if (ok) set_path(&m->files[i], "%s/%s", dir, m->files[i].name);
            files_seen++;
        } else if (!strncmp(line, "level ", 6)) {
            char red[16] = "";
            ok = sscanf(line, "level 1 nodes=%d redundancy=%15s", &m->nodes, red) == 2 && m->world > 0 &&
                 m->world < (1 << 24) && m->nodes > 0 && m->nodes <= m->world && !m->node_of;
            m->redundancy = -1;
            for (int r = 0; r < 3; r++)
                if (!strcmp(red, args_redundancy_name(r))) m->redundancy = r;
            ok = ok && m->redundancy >= 0;
            if (ok) {
                m->level = 1;
                m->node_of = xcalloc((size_t)m->world, sizeof(int));
                m->parity_bytes = xcalloc((size_t)m->world, sizeof(unsigned long long));
                m->parity_hash = xcalloc((size_t)m->world, sizeof(unsigned long long));
            }
        } else if (!strncmp(line, "node-of", 7)) {
            // one node per rank, each below the node count
            const char* p = line + 7;
            int r = 0, used = 0, k = 0;
            ok = m->node_of != NULL;
            for (; ok && r < m->world; r++) {
                ok = sscanf(p, " %d%n", &k, &used) == 1 && k >= 0 && k < m->nodes;
                if (ok) m->node_of[r] = k, p += used;
            }
            ok = ok && *p == 0;
        } else if (!strncmp(line, "parity ", 7)) {
            int r = -1;
            unsigned long long b = 0, h = 0;
            ok = m->parity_bytes && sscanf(line, "parity %d bytes=%llu hash=%llx", &r, &b, &h) == 3 && r >= 0 &&
                 r < m->world && b > CKPT_HEADER_BYTES;
            if (ok) m->parity_bytes[r] = b, m->parity_hash[r] = h;
        } else if (!strncmp(line, "incremental ", 12)) {
            ok = sscanf(line, "incremental base=step-%d base_hash=%llx", &m->base_step, &m->base_hash) == 2 &&
                 m->base_step >= 0 && m->world > 0 && m->world < (1 << 24) && !m->delta_bytes;
            if (ok) {
                m->delta_bytes = xcalloc((size_t)m->world, sizeof(unsigned long long));
                m->delta_hash = xcalloc((size_t)m->world, sizeof(unsigned long long));
            } else {
                m->base_step = -1;
            }
        } else if (!strncmp(line, "delta ", 6)) {
            int r = -1;
            unsigned long long b = 0, h = 0;
            ok = m->delta_bytes && sscanf(line, "delta %d bytes=%llu hash=%llx", &r, &b, &h) == 3 && r >= 0 &&
                 r < m->world && b >= CKPT_HEADER_BYTES;
            if (ok) m->delta_bytes[r] = b, m->delta_hash[r] = h;
        } else if (!strncmp(line, "tensors ", 8)) {
            ok = 1;
            // another kind of model (a dense GPT and a mixture of experts,
            // or two different MoE set-ups) is refused whole, before its tensors
            if (strcmp(variant, c->variant) != 0) {
                snprintf(msg, msg_len, "checkpoint '%s' holds a %s%s model; this run's is a %s%s model: resume with the model it was saved from",
                         dir, variant[0] ? "" : "dense GPT", variant, c->variant[0] ? "" : "dense GPT", c->variant);
                bad = msg;
            }
        } else if (!strncmp(line, "tensor ", 7)) {
            // the global shapes must be this model's
            char name[64];
            int kind, tensor, nd;
            size_t d[4] = {0, 0, 0, 0}, want_d[4];
            ok = sscanf(line, "tensor %63s %d %zu %zu %zu %zu", name, &nd, &d[0], &d[1], &d[2], &d[3]) >= 3 &&
                 find_tensor(c, name, &kind, &tensor);
            if (ok && (shape_of(c, tensor, want_d) != nd || d[0] != want_d[0] || (nd > 1 && d[1] != want_d[1]) ||
                       (nd > 2 && d[2] != want_d[2]) || (nd > 3 && d[3] != want_d[3]))) {
                snprintf(msg, msg_len, "checkpoint manifest '%s' has tensor %s of another shape than this model's: resume with the model it was saved from",
                         path, name);
                bad = msg;
            }
            tensors_seen++;
        } else if (!strncmp(line, "slices ", 7)) {
            ok = !m->slices && sscanf(line, "slices %d", &m->n_slices) == 1 && m->n_slices >= 0 &&
                 m->n_slices < (1 << 26);
            if (ok) m->slices = xcalloc((size_t)m->n_slices + 1, sizeof(SavedSlice));
        } else if (!strncmp(line, "slice ", 6)) {
            char name[64];
            SavedSlice s;
            ok = m->slices && slices_seen < m->n_slices &&
                 sscanf(line, "slice %63s file=%d offset=%zu start=%zu len=%zu stride=%zu count=%zu", name, &s.file,
                        &s.offset, &s.start, &s.len, &s.stride, &s.count) == 7 &&
                 find_tensor(c, name, &s.kind, &s.tensor) && s.file >= 0 && s.file < m->n_files && s.len > 0 &&
                 s.count > 0 && s.stride >= s.len &&
                 s.start + (s.count - 1) * s.stride + s.len <= numel_of(c, s.tensor);
            if (ok) m->slices[slices_seen++] = s;
        } else {
            ok = 0;
        }
        if (!ok && !bad) {
            snprintf(msg, msg_len, "checkpoint manifest '%s' line %d is not understood or out of range: '%.80s'", path,
                     line_no, line);
            bad = msg;
        }
    }
    free(text);
    if (!bad && (files_seen != m->n_files || slices_seen != m->n_slices || tensors_seen != CKPT_NUM_KINDS * n_tensors_of(c))) {
        snprintf(msg, msg_len, "checkpoint manifest '%s' lists %d of %d files, %d of %d slices, %d of %d tensors", path,
                 files_seen, m->n_files, slices_seen, m->n_slices, tensors_seen, CKPT_NUM_KINDS * n_tensors_of(c));
        bad = msg;
    }
    return bad;
}

const char* ckpt_check_manifest(const Ckpt* c, const char* dir, char* msg, size_t msg_len) {
    Manifest m;
    const char* bad = read_manifest(dir, c, &m, msg, msg_len);
    manifest_free(&m);
    return bad;
}

// Checks file i of the checkpoint: present, the size and checksum the
// manifest says, and a header naming this step.
static const char* verify_file(const Manifest* m, int i, char* msg, size_t msg_len) {
    const char* path = m->files[i].path;
    int fd = open(path, O_RDONLY);
    if (fd < 0) {
        snprintf(msg, msg_len, "checkpoint file '%s' is missing or unreadable (%s): the checkpoint is incomplete; resume from another one",
                 path, strerror(errno));
        return msg;
    }
    struct stat st;
    fstat(fd, &st);
    if ((unsigned long long)st.st_size != m->files[i].bytes) {
        close(fd);
        snprintf(msg, msg_len, "checkpoint file '%s' has %lld bytes, the manifest says %llu: it is truncated or was replaced",
                 path, (long long)st.st_size, m->files[i].bytes);
        return msg;
    }
    size_t cap = 1u << 22;
    unsigned char* buf = xmalloc(cap);
    XXH3_state_t* sum = checksum_begin();
    unsigned char header[CKPT_HEADER_BYTES] = {0};
    size_t total = 0;
    for (;;) {
        ssize_t r = read(fd, buf, cap);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        if (total < CKPT_HEADER_BYTES) {
            size_t n = (size_t)r < CKPT_HEADER_BYTES - total ? (size_t)r : CKPT_HEADER_BYTES - total;
            memcpy(header + total, buf, n);
        }
        checksum_add(sum, buf, (size_t)r);
        total += (size_t)r;
    }
    unsigned long long h = checksum_end(sum);
    free(buf);
    close(fd);
    uint64_t step = 0;
    memcpy(&step, header + 16, 8);
    if (h != m->files[i].hash) {
        snprintf(msg, msg_len, "checkpoint file '%s' is corrupt: its checksum %016llx is not the manifest's %016llx",
                 path, h, m->files[i].hash);
        return msg;
    }
    if (memcmp(header, CKPT_FILE_MAGIC, 8) != 0 || step != (uint64_t)m->step) {
        snprintf(msg, msg_len, "checkpoint file '%s' is not a state file of step %d", path, m->step);
        return msg;
    }
    // the slices the manifest reads from this file must be the ones its
    // writer put there: a manifest that points one rank's slices at another
    // rank's file (with that file's own name, size and checksum) reads
    // another rank's values into these places
    uint64_t want_sum = 0, version = 0;
    memcpy(&want_sum, header + 32, 8);
    memcpy(&version, header + 8, 4);
    size_t n_rows = 0;
    uint64_t* rows = xmalloc(sizeof(uint64_t) * 6 * (size_t)(m->n_slices + 1));
    for (int j = 0; j < m->n_slices; j++) {
        const SavedSlice* v = &m->slices[j];
        if (v->file != i) continue;
        uint64_t row[6] = {(uint64_t)v->kind, (uint64_t)v->tensor, v->start, v->len, v->stride, v->count};
        memcpy(rows + 6 * n_rows++, row, sizeof(row));
    }
    unsigned long long got_sum = slice_rows_checksum(rows, n_rows);
    free(rows);
    if ((uint32_t)version != CKPT_FILE_VERSION || got_sum != want_sum) {
        snprintf(msg, msg_len, "checkpoint file '%s' does not hold the slices the manifest reads from it (the slice list in its header differs): the manifest does not belong to these files",
                 path);
        return msg;
    }
    // the rank that wrote it must be the one its name says: a manifest that
    // points at another rank's file (with that file's own size and checksum)
    // would otherwise read another rank's slices into this one's places
    uint32_t writer = 0;
    int named = -1;
    memcpy(&writer, header + 12, 4);
    if (sscanf(m->files[i].name, "rank-%d.bin", &named) != 1 || named < 0 || (uint32_t)named != writer) {
        snprintf(msg, msg_len, "checkpoint file '%s' was written by rank %u, but the manifest lists it as '%s': the manifest does not belong to these files",
                 path, writer, m->files[i].name);
        return msg;
    }
    return NULL;
}

// For each run of need slice s, the overlaps with saved slice v:
// fn(ctx, dst floats offset in s's data, file offset in bytes, floats).
typedef CkptPieceFn PieceFn;

static size_t intersect(const CkptSlice* s, const SavedSlice* v, PieceFn fn, void* ctx) {
    size_t found = 0;
    size_t v_end = v->start + (v->count - 1) * v->stride + v->len;
    for (size_t kn = 0; kn < s->count; kn++) {
        size_t a = s->start + kn * s->stride, b = a + s->len;
        if (b <= v->start || a >= v_end) continue;
        // the saved runs that can overlap [a, b): ks from the first run ending past a
        size_t ks = a >= v->start + v->len ? (a - v->start - v->len) / v->stride + 1 : 0;
        for (; ks < v->count; ks++) {
            size_t rs = v->start + ks * v->stride;
            if (rs >= b) break;
            size_t lo = a > rs ? a : rs, hi = b < rs + v->len ? b : rs + v->len;
            if (lo >= hi) continue;
            if (fn) fn(ctx, kn * s->len + (lo - a), v->offset + (ks * v->len + (lo - rs)) * sizeof(float), hi - lo);
            found += hi - lo;
        }
    }
    return found;
}

size_t ckpt_intersect(const CkptSlice* need, const CkptSlice* saved, size_t offset, CkptPieceFn fn, void* ctx) {
    SavedSlice v = {.kind = saved->kind, .tensor = saved->tensor, .offset = offset, .start = saved->start,
                    .len = saved->len, .stride = saved->stride, .count = saved->count};
    return intersect(need, &v, fn, ctx);
}

typedef struct {
    int fd;
    float* dst;
    const char* path;
    int failed;
    size_t bytes;
} ReadCtx;

static void read_piece(void* ctx, size_t dst, size_t file_offset, size_t n) {
    ReadCtx* r = ctx;
    size_t want = n * sizeof(float), done = 0;
    while (done < want && !r->failed) {
        ssize_t got = pread(r->fd, (char*)(r->dst + dst) + done, want - done, (off_t)(file_offset + done));
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) r->failed = 1;
        else done += (size_t)got;
    }
    r->bytes += want;
}

// ---------------------------------------------------------------- level 1 at resume, over MPI
//
// On a cluster a node's level-1 directory is its own disk: only the ranks
// on that node can read it. So the resume is collective: the lowest rank of
// each node (this run's nodes) lists and checks what its node's directory
// holds, the ranks agree on the newest step every file of which is on some
// node or rebuildable, an xor rebuild is a reduction (each rank xors the
// pieces its node holds, the sum lands on the rebuilding rank), and a rank
// that needs a file its node lacks gets it from a rank whose node has it.
// Every path under --ckpt-local comes from local_path, which notes the node
// (read_nodes): the resume's report says which rank read which directory.

// Reads a whole file into a new buffer of *n bytes; NULL if it cannot.
static unsigned char* read_whole(const char* path, size_t* n) {
    int fd = open(path, O_RDONLY);
    if (fd < 0) return NULL;
    struct stat st;
    if (fstat(fd, &st) != 0) {
        close(fd);
        return NULL;
    }
    unsigned char* buf = xmalloc((size_t)st.st_size + 1);
    size_t done = 0;
    while (done < (size_t)st.st_size) {
        ssize_t r = pread(fd, buf + done, (size_t)st.st_size - done, (off_t)done);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        done += (size_t)r;
    }
    close(fd);
    if (done != (size_t)st.st_size) {
        free(buf);
        return NULL;
    }
    *n = done;
    return buf;
}

// LOCAL/node-K/step-N/name (name may be ""): a path on node K's storage,
// noted as read by this rank.
static void local_path(Ckpt* c, int node, int step, const char* name, char* out, size_t len) {
    if (node < 64) c->read_nodes |= 1ull << node;
    snprintf(out, len, "%s/node-%d/step-%08d%s%s", c->local, node, step, name[0] ? "/" : "", name);
}

// Sends n bytes to `to` or receives them from `from` over the world, in
// pieces an int counts.
static void send_bytes(const void* buf, size_t n, int to) {
    const size_t piece = (size_t)1 << 30;
    for (size_t at = 0; at < n; at += piece)
        MPI_CHECK(MPI_Send((const char*)buf + at, (int)(n - at < piece ? n - at : piece), MPI_BYTE, to, 78, MPI_COMM_WORLD));
}
static void recv_bytes(void* buf, size_t n, int from) {
    const size_t piece = (size_t)1 << 30;
    for (size_t at = 0; at < n; at += piece)
        MPI_CHECK(MPI_Recv((char*)buf + at, (int)(n - at < piece ? n - at : piece), MPI_BYTE, from, 78, MPI_COMM_WORLD,
                           MPI_STATUS_IGNORE));
}

// The newest step of this node's directory below `below` (-1: none).
static int node_newest_step(Ckpt* c, int below) {
    char dir[4096];
    local_path(c, c->node, 0, "", dir, sizeof(dir));
    char* cut = strrchr(dir, '/');  // LOCAL/node-K
    if (cut) *cut = 0;
    int best = -1;
    DIR* d = opendir(dir);
    struct dirent* e;
    while (d && (e = readdir(d)) != NULL) {
        int step;
        if (parse_step_name(e->d_name, &step) && step < below && step > best) best = step;
    }
    if (d) closedir(d);
    return best;
}

// The first rank of this run on each node (-1: no rank there).
static int node_leader(const Ckpt* c, int node) {
    for (int r = 0; r < c->world; r++)
        if (c->node_of[r] == node) return r;
    return -1;
}

// Rebuilds rank x's lost file (file index fx) of `step` from its xor group
// (the save's nodes: the ranks at x's place on every node). Chunk k of it
// is the parity of member i = (gx + k + 1) mod g xor'ed with chunk
// xor_chunk_of(j, i) of every other member j's file (xor_parity's layout):
// every node's first rank xors into one buffer the pieces its node holds
// (files and parities), and one MPI_Reduce with BXOR sums them on the
// rebuilding rank, which checks the result against the manifest and writes
// it, with the manifest, into its node's directory. has: (world x (files +
// saved ranks)) which rank's node holds which verified file and parity.
// Collective; returns the rebuilding rank, or -1 with msg on every rank.
static int xor_rebuild(Ckpt* c, Manifest* m, int x, int fx, int step, const int* file_of, const int* has,
                       const char* text, size_t text_len, char* msg, size_t msg_len) {
    int W = m->world, cols = m->n_files + W, *members = xmalloc(sizeof(int) * (size_t)W), g = 0, gx = -1;
    int* place = xcalloc((size_t)W, sizeof(int));  // each saved rank's place on its node
    for (int r = 0; r < W; r++)
        for (int q = 0; q < r; q++) place[r] += m->node_of[q] == m->node_of[r];
    for (int n = 0; n < m->nodes; n++)
        for (int r = 0; r < W; r++)
            if (m->node_of[r] == n && place[r] == place[x]) {
                if (r == x) gx = g;
                members[g++] = r;
            }
    free(place);
    size_t max_bytes = 0;
    for (int j = 0; j < g; j++) {
        int f = file_of[members[j]];
        if (f >= 0 && m->files[f].bytes > max_bytes) max_bytes = m->files[f].bytes;
    }
    const SavedFile* lost = &m->files[fx];
    // who holds what: the first rank whose node holds it (the same on every rank)
    int* file_holder = xmalloc(sizeof(int) * (size_t)g);
    int* parity_holder = xmalloc(sizeof(int) * (size_t)g);
    for (int j = 0; j < g; j++) {
        int f = file_of[members[j]];
        file_holder[j] = parity_holder[j] = -1;
        for (int q = 0; q < c->world; q++) {
            if (f >= 0 && file_holder[j] < 0 && has[(size_t)q * cols + f]) file_holder[j] = q;
            if (parity_holder[j] < 0 && has[(size_t)q * cols + m->n_files + members[j]]) parity_holder[j] = q;
        }
    }
    size_t chunk = g >= 2 ? xor_chunk(max_bytes, g) : 0;
    const char* bad = NULL;
    if (g < 2) {
        snprintf(msg, msg_len, "cannot rebuild %s of node %d: its xor group has no other member", lost->name, m->node_of[x]);
        bad = msg;
    }
    for (int j = 0; j < g && !bad; j++) {
        int f = file_of[members[j]];
        if (j == gx || f < 0 || file_holder[j] >= 0) continue;
        snprintf(msg, msg_len, "cannot rebuild %s of node %d from the xor parity: %s of node %d, in the same xor group, is lost too (xor rebuilds one lost node per group)",
                 lost->name, m->node_of[x], m->files[f].name, m->node_of[members[j]]);
        bad = msg;
    }
    for (int k = 0; k < g - 1 && !bad; k++) {
        int i = (gx + k + 1) % g;
        if (parity_holder[i] >= 0 && m->parity_bytes[members[i]] == CKPT_HEADER_BYTES + chunk) continue;
        snprintf(msg, msg_len, "cannot rebuild %s of node %d: the parity xor-%05d.bin of node %d is missing or corrupt, and it is the only other copy of part of it",
                 lost->name, m->node_of[x], members[i], m->node_of[members[i]]);
        bad = msg;
    }
    if (bad) {  // decided from the gathered table: the same on every rank
        free(members), free(file_holder), free(parity_holder);
        return -1;
    }
    // the rebuilding rank: the first of x's node in this run (its
    // replacement), else rank 0
    int root = node_leader(c, m->node_of[x]);
    if (root < 0) root = 0;
    // this rank's pieces: only what its own node holds, and only the first
    // rank of a node adds them (has marks that rank alone)
    unsigned char* sum = xcalloc((size_t)(g - 1), chunk);
    int mine = 0;
    char path[4096 + 160];
    for (int k = 0; k < g - 1 && !bad; k++) {
        int i = (gx + k + 1) % g;
        unsigned char* out = sum + (size_t)k * chunk;
        if (parity_holder[i] == c->rank) {
            char name[32];
            snprintf(name, sizeof(name), "xor-%05d.bin", members[i]);
            local_path(c, c->node, step, name, path, sizeof(path));
            size_t n = 0;
            unsigned char* parity = read_whole(path, &n);
            if (parity && n == CKPT_HEADER_BYTES + chunk)
                for (size_t b = 0; b < chunk; b++) out[b] ^= parity[CKPT_HEADER_BYTES + b];
            else snprintf(msg, msg_len, "cannot read '%s' to rebuild %s", path, lost->name), bad = msg;
            free(parity);
            mine = 1;
        }
        for (int j = 0; j < g && !bad; j++) {
            if (j == i || j == gx || file_holder[j] != c->rank) continue;
            size_t n = 0;
            unsigned char* file = read_whole(m->files[file_of[members[j]]].path, &n);
            if (!file) {
                snprintf(msg, msg_len, "cannot read '%s' to rebuild %s", m->files[file_of[members[j]]].path, lost->name);
                bad = msg;
                break;
            }
            size_t at = (size_t)xor_chunk_of(j, i, g) * chunk;
            for (size_t b = 0; at + b < n && b < chunk; b++) out[b] ^= file[at + b];
            free(file);
            mine = 1;
        }
    }
    free(file_holder), free(parity_holder), free(members);
    // one reduction, in pieces an int counts (chunk is a multiple of 8)
    size_t words = (size_t)(g - 1) * chunk / 8, piece = (size_t)1 << 27;
    unsigned char* image = c->rank == root ? xcalloc((size_t)(g - 1), chunk) : NULL;
    for (size_t at = 0; at < words; at += piece) {
        int n = (int)(words - at < piece ? words - at : piece);
        MPI_CHECK(MPI_Reduce((uint64_t*)sum + at, image ? (uint64_t*)image + at : NULL, n, MPI_UINT64_T, MPI_BXOR, root,
                             MPI_COMM_WORLD));
    }
    if (mine && c->rank != root) c->rebuild_sent_bytes += (size_t)(g - 1) * chunk;
    free(sum);
    if (c->rank == root && !bad) {
        // into its node's directory (a replacement node's), with the manifest
        char dir[4096 + 160], tmp[4096 + 192];
        local_path(c, c->node, step, "", dir, sizeof(dir));
        char* cut = strrchr(dir, '/');
        if (cut) *cut = 0, mkdir(dir, 0755), *cut = '/';
        mkdir(dir, 0755);
        snprintf(path, sizeof(path), "%s/MANIFEST", dir);
        if (!has_manifest(dir)) {
            FileOut out;
            const void* parts[2] = {text, NULL};
            size_t sizes[2] = {text_len, 0};
            write_parts(path, parts, sizes, 0, &out);
        }
        local_path(c, c->node, step, lost->name, path, sizeof(path));
        snprintf(tmp, sizeof(tmp), "%s.rebuild", path);
        const void* parts[2] = {image, NULL};
        size_t psizes[2] = {lost->bytes, 0};
        FileOut out;
        write_parts(tmp, parts, psizes, 0, &out);
        if (out.err[0] || rename(tmp, path) != 0) {
            snprintf(msg, msg_len, "cannot write the rebuilt '%s': %s", path, out.err[0] ? out.err : strerror(errno));
            bad = msg;
        } else if (out.hash != lost->hash) {
            snprintf(msg, msg_len, "the rebuilt '%s' does not match the manifest's checksum: the xor group's files are not of one save",
                     path);
            bad = msg;
        }
    }
    free(image);
    // a failed read or write anywhere: every rank gets the first message
    int failed = bad != NULL, first = c->world;
    int me = failed ? c->rank : c->world;
    MPI_CHECK(MPI_Allreduce(&me, &first, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD));
    if (first < c->world) {
        MPI_CHECK(MPI_Bcast(msg, (int)msg_len, MPI_CHAR, first, MPI_COMM_WORLD));
        return -1;
    }
    return root;
}

// The newest level-1 step, not older than `floor`, whose every file is on
// some node of this run or rebuildable: its manifest in *m (read from a copy
// in scratch), with each file's path on this rank's node where its node
// holds it (NULL where not), the rank that serves each file in m->holder;
// what was found and rebuilt in report. -1 if none; why says what the newest
// unusable one lacked. Collective; the same answer on every rank.
static int local_pick(Ckpt* c, int floor, Manifest* m, const char* scratch, char* dir, size_t dir_len, char* report,
                      size_t report_len, char* why, size_t why_len) {
    int leader = node_leader(c, c->node) == c->rank;
    int picked = -1, below = INT_MAX;
    char msg[1024];
    memset(m, 0, sizeof(*m));
    while (picked < 0) {
        // the newest step any node holds, below the last one tried
        int mine = leader ? node_newest_step(c, below) : -1, step = -1;
        MPI_CHECK(MPI_Allreduce(&mine, &step, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD));
        if (step < 0 || step < floor) break;
        below = step;
        // a manifest that verifies, on the first node that has one: its text to every rank
        char mdir[4096 + 64];
        local_path(c, c->node, step, "", mdir, sizeof(mdir));
        int ok = 0;
        if (leader && has_manifest(mdir)) {
            Manifest probe;
            const char* why_not = read_manifest(mdir, c, &probe, msg, sizeof(msg));
            ok = !why_not && probe.level == 1;
            if (why_not && !why[0]) snprintf(why, why_len, "level-1 step %d: %s", step, why_not);
            manifest_free(&probe);
        }
        int src = ok ? c->rank : c->world, from = c->world;
        MPI_CHECK(MPI_Allreduce(&src, &from, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD));
        if (from == c->world) continue;
        char mpath[4096 + 80];
        snprintf(mpath, sizeof(mpath), "%s/MANIFEST", mdir);
        size_t text_len = 0;
        unsigned char* text = c->rank == from ? read_whole(mpath, &text_len) : NULL;
        uint64_t n64 = text_len;
        MPI_CHECK(MPI_Bcast(&n64, 1, MPI_UINT64_T, from, MPI_COMM_WORLD));
        if (c->rank != from) text = xmalloc(n64 + 1);
        MPI_CHECK(MPI_Bcast(text, (int)n64, MPI_CHAR, from, MPI_COMM_WORLD));
        text_len = (size_t)n64;
        snprintf(mpath, sizeof(mpath), "%s/MANIFEST", scratch);
        FileOut wrote;
        const void* parts[2] = {text, NULL};
        size_t sizes[2] = {text_len, 0};
        write_parts(mpath, parts, sizes, 0, &wrote);
        const char* bad = wrote.err[0] ? wrote.err : read_manifest(scratch, c, m, msg, sizeof(msg));
        fail_if_any(bad != NULL, bad);
        snprintf(dir, dir_len, "%s/node-%d/step-%08d", c->local, c->node_of[from], step);
        // what each node holds: its first rank checks every file and parity
        // the manifest names in its own directory
        int W = m->world, cols = m->n_files + W;
        int* have = xcalloc((size_t)cols, sizeof(int));
        for (int i = 0; leader && i < m->n_files; i++) {
            char p[4096 + 160];
            local_path(c, c->node, step, m->files[i].name, p, sizeof(p));
            set_path(&m->files[i], "%s", p);
            have[i] = !verify_file(m, i, msg, sizeof(msg));
        }
        for (int r = 0; leader && r < W; r++) {
            if (!m->parity_bytes[r]) continue;
            char p[4096 + 160], name[32];
            snprintf(name, sizeof(name), "xor-%05d.bin", r);
            local_path(c, c->node, step, name, p, sizeof(p));
            size_t n = 0;
            unsigned char* buf = read_whole(p, &n);
            have[m->n_files + r] = buf && n == m->parity_bytes[r] && ckpt_checksum(buf, n) == m->parity_hash[r] &&
                                   !memcmp(buf, CKPT_XOR_MAGIC, 8);
            free(buf);
        }
        int* has = xmalloc(sizeof(int) * (size_t)cols * (size_t)c->world);
        MPI_CHECK(MPI_Allgather(have, cols, MPI_INT, has, cols, MPI_INT, MPI_COMM_WORLD));
        free(have);
        int* file_of = xmalloc(sizeof(int) * (size_t)W);
        for (int r = 0; r < W; r++) file_of[r] = -1;
        for (int i = 0; i < m->n_files; i++) {
            int r = -1;
            if (sscanf(m->files[i].name, "rank-%d.bin", &r) == 1 && r >= 0 && r < W) file_of[r] = i;
        }
        // each file's server: the first rank of its own node if that node
        // holds it, else of the first node that does (a partner's copy)
        m->holder = xmalloc(sizeof(int) * (size_t)(m->n_files + 1));
        size_t at = (size_t)snprintf(report, report_len, "level 1 (node-local), step %d", step);
        for (int i = 0; i < m->n_files; i++) {
            int r = -1, home = -1;
            sscanf(m->files[i].name, "rank-%d.bin", &r);
            if (r >= 0 && r < W) home = m->node_of[r];
            m->holder[i] = -1;
            for (int q = 0; q < c->world; q++)
                if (has[(size_t)q * cols + i] && (m->holder[i] < 0 || (c->node_of[q] == home && c->node_of[m->holder[i]] != home)))
                    m->holder[i] = q;
            if (m->holder[i] >= 0 && c->node_of[m->holder[i]] != home && at < report_len)
                at += (size_t)snprintf(report + at, report_len - at, "; %s of node %d: the partner copy on node %d",
                                       m->files[i].name, home, c->node_of[m->holder[i]]);
        }
        bad = NULL;
        for (int r = 0; r < W && !bad; r++) {
            int i = file_of[r];
            if (i < 0 || m->holder[i] >= 0) continue;
            if (m->redundancy != CKPT_REDUNDANCY_XOR) {
                snprintf(msg, sizeof(msg), "%s of node %d is on no node of this run (--ckpt-redundancy %s was saved)",
                         m->files[i].name, m->node_of[r], args_redundancy_name(m->redundancy));
                bad = msg;
            } else {
                int root = xor_rebuild(c, m, r, i, step, file_of, has, (const char*)text, text_len, msg, sizeof(msg));
                if (root < 0) {
                    bad = msg;
                } else {
                    // its node holds it now
                    m->holder[i] = root;
                    for (int q = 0; q < c->world; q++)
                        if (c->node_of[q] == c->node_of[root]) has[(size_t)q * cols + i] = 1;
                    if (at < report_len)
                        at += (size_t)snprintf(report + at, report_len - at, "; rebuilt %s of node %d from the xor parity on rank %d",
                                               m->files[i].name, m->node_of[r], root);
                }
            }
        }
        free(text);
        // this rank's paths: the files its node holds (its first rank
        // checked them), the others come over MPI (local_fetch)
        for (int i = 0; i < m->n_files && !bad; i++) {
            int here = 0;
            for (int q = 0; q < c->world; q++) here |= c->node_of[q] == c->node && has[(size_t)q * cols + i];
            free(m->files[i].path);
            m->files[i].path = NULL;
            if (here) {
                char p[4096 + 160];
                local_path(c, c->node, step, m->files[i].name, p, sizeof(p));
                set_path(&m->files[i], "%s", p);
            }
        }
        free(has);
        free(file_of);
        if (bad) {
            if (!why[0]) snprintf(why, why_len, "level-1 step %d: %s", step, bad);
            manifest_free(m);
            continue;
        }
        picked = step;
    }
    return picked;
}

// The files this rank reads (use) that its node does not hold: each comes
// from its server (m->holder) into scratch. Every rank walks the same
// (file, rank) list in the same order, so each send meets its receive.
// Collective.
static void local_fetch(Ckpt* c, Manifest* m, const int* use, const char* scratch) {
    int n = m->n_files;
    int* want = xcalloc((size_t)n + 1, sizeof(int));
    for (int f = 0; f < n; f++) want[f] = use[f] && !m->files[f].path;
    int* wants = xmalloc(sizeof(int) * ((size_t)n + 1) * (size_t)c->world);
    MPI_CHECK(MPI_Allgather(want, n + 1, MPI_INT, wants, n + 1, MPI_INT, MPI_COMM_WORLD));
    char msg[1024] = "";
    for (int f = 0; f < n; f++)
        for (int q = 0; q < c->world; q++) {
            if (!wants[(size_t)q * (n + 1) + f]) continue;
            int h = m->holder[f];
            size_t bytes = m->files[f].bytes;
            if (c->rank == h) {
                size_t got = 0;
                unsigned char* buf = read_whole(m->files[f].path, &got);
                if (!buf || got != bytes) {  // checked at the pick: only a file changed since fails
                    free(buf);
                    buf = xcalloc(bytes + 1, 1);
                }
                send_bytes(buf, bytes, q);
                c->fetch_sent_bytes += bytes;
                free(buf);
            } else if (c->rank == q) {
                unsigned char* buf = xmalloc(bytes + 1);
                recv_bytes(buf, bytes, h);
                set_path(&m->files[f], "%s/%s", scratch, m->files[f].name);
                const void* parts[2] = {buf, NULL};
                size_t sizes[2] = {bytes, 0};
                FileOut out;
                write_parts(m->files[f].path, parts, sizes, 0, &out);
                if (out.err[0] && !msg[0]) snprintf(msg, sizeof(msg), "%s", out.err);
                free(buf);
            }
        }
    free(want);
    free(wants);
    fail_if_any(msg[0] != 0, msg);
}

// ---------------------------------------------------------------- incremental: applying a delta

// Restores full file f of the incremental checkpoint in dir: its delta
// (checked against the manifest) decompressed and xor'ed with the same file
// of the full save it names, which must be that save (its manifest's
// checksum). Writes the full file into the private directory scratch and
// points the manifest's path there; verify_file then checks it against the
// full file's checksum. Returns NULL or a message.
static const char* delta_restore(const char* dir, Manifest* m, int f, const char* scratch, char* msg, size_t msg_len) {
    char base[4096], path[4096 + 96];
    snprintf(base, sizeof(base), "%s", dir);
    char* slash = strrchr(base, '/');
    if (slash) snprintf(slash + 1, sizeof(base) - (size_t)(slash + 1 - base), "step-%08d", m->base_step);
    else snprintf(base, sizeof(base), "step-%08d", m->base_step);
    snprintf(path, sizeof(path), "%s/MANIFEST", base);
    size_t n = 0;
    unsigned char* text = read_whole(path, &n);
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
    int r = -1;
    sscanf(m->files[f].name, "rank-%d.bin", &r);
    if (r < 0 || r >= m->world || !m->delta_bytes[r]) {
        snprintf(msg, msg_len, "checkpoint '%s' lists no delta for %s", dir, m->files[f].name);
        return msg;
    }
    snprintf(path, sizeof(path), "%s/rank-%05d.delta", dir, r);
    size_t dn = 0, bn = 0;
    unsigned char* delta = read_whole(path, &dn);
    if (!delta || dn != m->delta_bytes[r] || ckpt_checksum(delta, dn) != m->delta_hash[r] || dn < CKPT_HEADER_BYTES) {
        free(delta);
        snprintf(msg, msg_len, "checkpoint delta '%s' is missing, truncated or corrupt (its size or checksum is not the manifest's)", path);
        return msg;
    }
    snprintf(path, sizeof(path), "%s/%s", base, m->files[f].name);
    unsigned char* full = read_whole(path, &bn);
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
            set_path(&m->files[f], "%s/%s", scratch, m->files[f].name);
            const void* parts[2] = {full, NULL};
            size_t sizes[2] = {bn, 0};
            FileOut out;
            write_parts(m->files[f].path, parts, sizes, 0, &out);
            if (out.err[0]) {
                snprintf(msg, msg_len, "%s", out.err);
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
    if (!c->resume) return 0;
    double t0 = now_seconds();
    char msg[1024], dir[4096] = "";
    const char* bad = NULL;
    // the newest checkpoint on level 3 (--resume, shared storage: rank 0
    // looks), and with --ckpt-local a newer or equal one complete or
    // rebuildable on level 1 (every node looks at its own directory)
    int have3[2] = {0, -1};  // a level-3 checkpoint is there; its step (-1: unusable)
    if (c->rank == 0) {
        have3[0] = ckpt_latest(c->resume, dir, sizeof(dir)) != NULL;
        if (have3[0]) {
            Manifest m3;
            if (!read_manifest(dir, c, &m3, msg, sizeof(msg))) have3[1] = m3.step;
            manifest_free(&m3);
        }
    }
    MPI_CHECK(MPI_Bcast(have3, 2, MPI_INT, 0, MPI_COMM_WORLD));
    Manifest m;
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
    }
    fail_if_any(bad != NULL, bad);
    if (c->local) {
        char dir1[4096], report[2048] = "", why[1024] = "";
        int step1 = local_pick(c, have3[1], &m, scratch, dir1, sizeof(dir1), report, sizeof(report), why, sizeof(why));
        level1 = step1 >= 0;
        if (level1) {
            snprintf(dir, sizeof(dir), "%s", dir1);
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
    if (bad) remove_dir(scratch);
    fail_if_any(bad != NULL, bad);
    if (!level1) {
        MPI_CHECK(MPI_Bcast(dir, sizeof(dir), MPI_CHAR, 0, MPI_COMM_WORLD));
        bad = read_manifest(dir, c, &m, msg, sizeof(msg));
        if (bad) remove_dir(scratch);
        fail_if_any(bad != NULL, bad);
    }
    if (m.B != c->B || m.T != c->T) {
        snprintf(msg, sizeof(msg), "checkpoint '%s' was trained with batch %d x %d; this run has %d x %d: resume with --batch %d --seq %d (the data position and the losses depend on them)",
                 dir, m.B, m.T, c->B, c->T, m.B, m.T);
        bad = msg;
        remove_dir(scratch);
    }
    fail_if_any(bad != NULL, bad);
    if (m.lr != c->lr || m.wd != c->wd || m.clip != c->clip || m.seed != c->seed)
        print0("note: checkpoint '%s' was trained with --lr %g --wd %g --clip %g --seed %d; this run continues with --lr %g --wd %g --clip %g --seed %d\n",
               dir, m.lr, m.wd, m.clip, m.seed, c->lr, c->wd, c->clip, c->seed);
    // which files this rank reads, and which it checks for everyone: every
    // file is checked by at least one rank, so one flipped byte anywhere is found
    int* use = xcalloc((size_t)m.n_files + 1, sizeof(int));
    for (int i = 0; i < c->need.n; i++)
        for (int j = 0; j < m.n_slices; j++) {
            const SavedSlice* v = &m.slices[j];
            if (v->kind == c->need.s[i].kind && v->tensor == c->need.s[i].tensor && intersect(&c->need.s[i], v, NULL, NULL))
                use[v->file] = 1;
        }
    // level 1: the files this rank reads that its node lacks come from a
    // rank whose node has them (every file was checked on its node)
    if (level1) local_fetch(c, &m, use, scratch);
    // an incremental save: the full files this rank reads or checks, restored
    // from their deltas into its scratch directory
    if (m.base_step >= 0)
        for (int f = 0; f < m.n_files && !bad; f++)
            if (use[f] || f % c->world == c->rank) bad = delta_restore(dir, &m, f, scratch, msg, sizeof(msg));
    // level 3: every file is checked by at least one rank, so one flipped
    // byte anywhere is found; level 1: its node's first rank checked it
    for (int f = 0; f < m.n_files && !bad; f++)
        if (use[f] || (!level1 && f % c->world == c->rank)) bad = verify_file(&m, f, msg, sizeof(msg));
    if (bad && scratch[0]) remove_dir(scratch);
    fail_if_any(bad != NULL, bad);
    // the reads: each needed slice assembled in a host buffer from every
    // saved slice it overlaps, then copied to the device
    size_t max_floats = 0;
    for (int i = 0; i < c->need.n; i++)
        if (c->need.s[i].len * c->need.s[i].count > max_floats) max_floats = c->need.s[i].len * c->need.s[i].count;
    float* stage = xmalloc((max_floats ? max_floats : 1) * sizeof(float));
    int* fds = xmalloc(sizeof(int) * ((size_t)m.n_files + 1));
    for (int f = 0; f < m.n_files; f++) {
        fds[f] = use[f] ? open(m.files[f].path, O_RDONLY) : -1;
    }
    for (int i = 0; i < c->need.n && !bad; i++) {
        const CkptSlice* s = &c->need.s[i];
        size_t found = 0, want = s->len * s->count;
        ReadCtx r = {.dst = stage};
        for (int j = 0; j < m.n_slices && !r.failed; j++) {
            const SavedSlice* v = &m.slices[j];
            if (v->kind != s->kind || v->tensor != s->tensor) continue;
            r.fd = fds[v->file];
            r.path = m.files[v->file].name;
            found += intersect(s, v, read_piece, &r);
        }
        c->load_bytes += r.bytes;
        char name[64];
        snprintf(name, sizeof(name), "%s.%s", kind_names[s->kind], tensor_name_of(c, s->tensor));
        if (r.failed) {
            snprintf(msg, sizeof(msg), "reading %s from checkpoint '%s' (file %s) failed", name, dir, r.path);
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
    if (scratch[0]) remove_dir(scratch);
    free(fds);
    free(stage);
    free(use);
    manifest_free(&m);
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
        if (c->rank == 0 && log && log->f) {
            fprintf(log->f, "{\"type\":\"checkpoint_local\",\"saves\":%d,\"nodes\":%d,\"redundancy\":\"%s\",\"ms_per_save\":%.3f,\"redundancy_ms_per_save\":%.3f,\"redundancy_bytes_max\":%.0f,\"file_bytes\":%zu,\"redundancy_bytes\":%zu,\"serialised_bytes\":%zu,\"drained_bytes\":%zu,\"drains\":%d}\n",
                    c->local_saves, c->nodes, args_redundancy_name(c->redundancy), c->local_s * per,
                    c->redundancy_s * per, most, c->local_file_bytes, c->redundancy_bytes, c->serialised_bytes,
                    c->drained_bytes, c->drains);
            fflush(log->f);
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
            if (log && log->f) {
                // an incremental run's full and delta files on rank 0 (0: none)
                int fulls = c->saves - c->deltas;
                fprintf(log->f, "{\"type\":\"checkpoint\",\"saves\":%d,\"async\":%s,\"stall_ms_per_save\":%.3f,\"final_wait_ms\":%.3f,\"deltas\":%d,\"full_bytes_per_save\":%.0f,\"delta_bytes_per_save\":%.0f,\"save_bytes\":[",
                        c->saves, c->async ? "true" : "false", c->stall_s * per, 1e3 * c->finish_s, c->deltas,
                        fulls ? (double)c->full_bytes_total / fulls : 0.0, c->deltas ? (double)c->delta_bytes_total / c->deltas : 0.0);
                for (int r = 0; r < c->world; r++) fprintf(log->f, "%s%.0f", r ? "," : "", all[4 * r]);
                fprintf(log->f, "],\"write_ms_per_save\":[");
                for (int r = 0; r < c->world; r++) fprintf(log->f, "%s%.3f", r ? "," : "", all[4 * r + 3] * per);
                fprintf(log->f, "],\"load_bytes\":[");
                for (int r = 0; r < c->world; r++) fprintf(log->f, "%s%.0f", r ? "," : "", all[4 * r + 1]);
                fprintf(log->f, "],\"load_ms\":[");
                for (int r = 0; r < c->world; r++) fprintf(log->f, "%s%.3f", r ? "," : "", 1e3 * all[4 * r + 2]);
                fprintf(log->f, "]}\n");
                fflush(log->f);
            }
        }
        free(all);
    }
    free(c->host);
    c->host = NULL;
    free(c->base_host);
    c->base_host = NULL;
    if (c->lock_fd >= 0) {
        // the lock's text goes with the lock: a .lock file left with text
        // means a run died holding it
        char path[4096 + 16];
        snprintf(path, sizeof(path), "%s/.lock", c->dir);
        if (ftruncate(c->lock_fd, 0) != 0) print0("note: cannot clear the lock file '%s'\n", path);
        close(c->lock_fd);
        c->lock_fd = -1;
    }
    if (c->group != MPI_COMM_NULL) MPI_Comm_free(&c->group);
    free(c->node_of);
    c->node_of = NULL;
    ckpt_list_free(&c->own);
    ckpt_list_free(&c->need);
}
