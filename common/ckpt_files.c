// ckpt_files.c: the checkpoint's files and manifest (ckpt_files.h): a
// rank's file written or copied with its checksum, the manifest's text and
// atomic install, the manifest parsed and checked, slices read back.
#include "ckpt_files.h"

// gcc's -Wformat-truncation off, as in ckpt.c, which says why no path or
// message here is cut.
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

#include "errors.h"
#include "memory.h"
#include "rank.h"

const char* ckpt_kind_names[CKPT_NUM_KINDS] = {"params", "m", "v"};

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

const char* ckpt_tensor_name_of(const Ckpt* c, int t) {
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
XXH3_state_t* ckpt_checksum_begin(void) {
    XXH3_state_t* s = XXH3_createState();
    if (!s || XXH3_64bits_reset(s) != XXH_OK) FATAL("cannot start an XXH3 checksum");
    return s;
}

void ckpt_checksum_add(XXH3_state_t* s, const void* buf, size_t n) {
    if (XXH3_64bits_update(s, buf, n) != XXH_OK) FATAL("XXH3 checksum update failed");
}

unsigned long long ckpt_checksum_end(XXH3_state_t* s) {
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

int ckpt_open_read(const char* path) {
    int fd = open(path, O_RDONLY | O_NONBLOCK);  // a pipe's open returns at once
    struct stat st = {0};
    if (fd < 0) return -1;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        int err = S_ISDIR(st.st_mode) ? EISDIR : EINVAL;
        close(fd);
        errno = err;
        return -1;
    }
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
    return fd;
}

FILE* ckpt_fopen_read(const char* path) {
    int fd = ckpt_open_read(path);
    FILE* f = fd >= 0 ? fdopen(fd, "rb") : NULL;
    if (fd >= 0 && !f) close(fd);
    return f;
}

static int fsync_path(const char* path) {
    int fd = open(path, O_RDONLY);
    if (fd < 0) return -1;
    int rc = fsync(fd);
    close(fd);
    return rc;
}

// Removes a directory of plain files (a checkpoint or a stale .tmp).
void ckpt_remove_dir(const char* path) {
    // the manifest first: a crash halfway leaves no directory that looks
    // complete (a reader takes a step-N with a MANIFEST)
    char manifest[4096 + 16];
    snprintf(manifest, sizeof(manifest), "%s/MANIFEST", path);
    unlink(manifest);
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

int ckpt_foreign_step(const char* base, unsigned long long run_id, unsigned long long resumed_id, int upto,
                      int any_upto) {
    DIR* d = opendir(base);
    if (!d) return -1;
    int newest = -1, step;
    struct dirent* e;
    while ((e = readdir(d)) != NULL) {
        if (!ckpt_parse_step_name(e->d_name, &step) || step <= newest) continue;
        char path[4096 + 64];
        snprintf(path, sizeof(path), "%s/%s/MANIFEST", base, e->d_name);
        size_t n = 0;
        char* text = (char*)ckpt_read_whole(path, &n);
        if (!text) continue;  // not complete: no run's checkpoint yet
        char* grown = realloc(text, n + 1);
        if (!grown) {
            free(text);
            continue;
        }
        text = grown;
        text[n] = 0;
        unsigned long long id = 0;
        const char* line = strstr(text, "\nrun id=");
        int has_id = line && sscanf(line + 1, "run id=%llx", &id) == 1;
        int own = has_id && id == run_id;
        int history = step <= upto && (any_upto || (has_id && id == resumed_id));
        if (!own && !history) newest = step;
        free(text);
    }
    closedir(d);
    return newest;
}

// "step-00000006" and nothing more: a complete checkpoint's name; its step.
int ckpt_parse_step_name(const char* name, int* step) {
    // eight digits and nothing else: sscanf's %d also takes a sign or
    // spaces, and "step-+0000012" taken for step 12 let a prune rebuild the
    // name and delete step-00000012
    if (strlen(name) != 13 || strncmp(name, "step-", 5)) return 0;
    int n = 0;
    for (int i = 5; i < 13; i++) {
        if (name[i] < '0' || name[i] > '9') return 0;
        n = 10 * n + (name[i] - '0');
    }
    *step = n;
    return 1;
}

int ckpt_has_manifest(const char* dir) {
    char path[4096 + 16];
    snprintf(path, sizeof(path), "%s/MANIFEST", dir);
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

const char* ckpt_latest(const char* dir, char* out, size_t out_len) {
    if (ckpt_has_manifest(dir)) {
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
        if (!ckpt_parse_step_name(e->d_name, &step) || step <= best) continue;
        snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
        if (ckpt_has_manifest(path)) best = step;
    }
    closedir(d);
    if (best < 0) return NULL;
    snprintf(out, out_len, "%s/step-%08d", dir, best);
    return out;
}

void ckpt_prune(const char* dir, int keep, int newest, int passed) {
    if (keep <= 0) return;
    DIR* d = opendir(dir);
    if (!d) return;
    int* steps = NULL;
    int n = 0, cap = 0;
    struct dirent* e;
    while ((e = readdir(d)) != NULL) {
        int step;
        if (!ckpt_parse_step_name(e->d_name, &step) || step > newest) continue;
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
    // a branch left behind and passed now: not one of the newest
    int m = 0;
    for (int i = 0; i < n; i++)
        if (passed < 0 || steps[i] <= passed || steps[i] == newest) steps[m++] = steps[i];
        else snprintf(path, sizeof(path), "%s/step-%08d", dir, steps[i]), ckpt_remove_dir(path);
    n = m;
    for (int i = 0; i < n && i < keep; i++) {
        needed[i] = 1;
        snprintf(path, sizeof(path), "%s/step-%08d/MANIFEST", dir, steps[i]);
        FILE* f = ckpt_fopen_read(path);
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
        ckpt_remove_dir(path);
    }
    free(needed);
    free(steps);
}

// ---------------------------------------------------------------- fault injection (tests)

// CKPT_KILL=step:S:R kills rank R with SIGKILL after step S; save:S:R kills
// it halfway through writing its file of the checkpoint of step S; flip:S:R
// changes one byte of its level-1 file of step S before level 3 drains it
// (ckpt_fault_flip: the drain must notice); commit:S:R kills it 2 s after
// the level-1 manifest of step S reached every node, before its node installs
// it (the other nodes do in those 2 s). Only in a
// run that did not resume, so a restarted job runs through. The tests and
// docs/checkpoints.md use it to kill a rank at a known moment.
int ckpt_fault_fires(const Ckpt* c, const char* where, int step) {
    const char* spec = getenv("CKPT_KILL");
    if (!spec || c->start_step != 0) return 0;
    char what[16];
    int s = -1, r = -1;
    if (sscanf(spec, "%15[a-z]:%d:%d", what, &s, &r) != 3) return 0;
    return !strcmp(what, where) && s == step && r == c->rank;
}

void ckpt_fault_flip(const char* path) {
    int fd = open(path, O_RDWR);
    unsigned char b = 0;
    off_t at = fd >= 0 ? lseek(fd, 0, SEEK_END) / 2 : 0;
    if (fd < 0 || pread(fd, &b, 1, at) != 1) FATAL("CKPT_KILL=flip: cannot read '%s'", path);
    b ^= 0x01;
    if (pwrite(fd, &b, 1, at) != 1) FATAL("CKPT_KILL=flip: cannot write '%s'", path);
    close(fd);
    fprintf(stderr, "[rank %d] CKPT_KILL: changed byte %lld of %s\n", world_rank(), (long long)at, path);
}

void ckpt_fault_kill(void) {
    fprintf(stderr, "[rank %d] CKPT_KILL: killing this rank (SIGKILL)\n", world_rank());
    fflush(stderr);
    raise(SIGKILL);
}

// ---------------------------------------------------------------- writing a rank's file

// The 64-byte header of rank c->rank's file of `step`.
void ckpt_file_header(const Ckpt* c, int step, unsigned char header[CKPT_HEADER_BYTES]) {
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

// Writes parts[0] then parts[1] (sizes[1] may be 0) to path, fsync'ed, its
// checksum computed on the way. kill_here: the CKPT_KILL=save hook, die
// with half of parts[1] written. No MPI here (the writer thread runs it).
void ckpt_write_parts(const char* path, const void* const parts[2], const size_t sizes[2], int kill_here,
                        CkptFileOut* out) {
    out->err[0] = 0;
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) {
        snprintf(out->err, sizeof(out->err), "cannot write checkpoint file '%s': %s", path, strerror(errno));
        return;
    }
    XXH3_state_t* sum = ckpt_checksum_begin();
    for (int p = 0; p < 2; p++) ckpt_checksum_add(sum, parts[p], sizes[p]);
    unsigned long long h = ckpt_checksum_end(sum);
    int err = 0;
    for (int p = 0; p < 2 && !err; p++) {
        const unsigned char* bytes = parts[p];
        size_t done = 0;
        while (done < sizes[p]) {
            // the test hook: die with half the data written
            if (kill_here && p == 1 && done >= sizes[p] / 2) ckpt_fault_kill();
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
    if (kill_here) ckpt_fault_kill();  // an empty payload: die anyway
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
void ckpt_copy_file(const char* src, const char* dst, int kill_here, CkptFileOut* out) {
    out->err[0] = 0;
    int in = ckpt_open_read(src);
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
    XXH3_state_t* sum = ckpt_checksum_begin();
    int err = 0;
    while (done < total && !err) {
        if (kill_here && done >= total / 2) ckpt_fault_kill();
        size_t want = total - done < cap ? total - done : cap;
        if (kill_here && done < total / 2 && done + want > total / 2) want = total / 2 - done;
        ssize_t r = read(in, buf, want);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            err = r < 0 ? errno : EIO;  // shorter than fstat said: it changed under us
            break;
        }
        ckpt_checksum_add(sum, buf, (size_t)r);
        for (ssize_t w, put = 0; put < r && !err; put += w) {
            w = write(fd, buf + put, (size_t)(r - put));
            if (w < 0 && errno == EINTR) w = 0;
            else if (w <= 0) err = w < 0 ? errno : EIO;
        }
        done += (size_t)r;
    }
    if (kill_here) ckpt_fault_kill();
    free(buf);
    unsigned long long h = ckpt_checksum_end(sum);
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

// ---------------------------------------------------------------- commit: manifest last, then rename

void ckpt_tmp_dir_of(const char* base, int step, char* out, size_t len) {
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
    // which run saved it: a fresh run refuses a directory of another's
    OUT("run id=%016llx data_tokens=%zu data_hash=%016llx\n", c->run_id, c->data_tokens, c->data_hash);
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
            OUT("tensor %s.%s %d", ckpt_kind_names[k], ckpt_tensor_name_of(c, t), nd);
            for (int d = 0; d < nd; d++) OUT(" %zu", dims[d]);
            OUT("\n");
        }
    OUT("slices %d\n", total);
    const uint64_t* m = meta;
    for (int r = 0; r < c->world; r++) {
        uint64_t offset = CKPT_HEADER_BYTES;
        for (int i = 0; i < counts[r]; i++, m += 6) {
            OUT("slice %s.%s file=%d offset=%llu start=%llu len=%llu stride=%llu count=%llu\n", ckpt_kind_names[m[0]],
                ckpt_tensor_name_of(c, (int)m[1]), file_index[r], (unsigned long long)offset,
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
const char* ckpt_install_manifest(const char* base, int step, const char* text, size_t len,
                                    char* msg, size_t msg_len) {
    char tmp[4096], final[4096], path[4096 + 16];
    ckpt_tmp_dir_of(base, step, tmp, sizeof(tmp));
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
        ckpt_remove_dir(tmp);
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
        ckpt_remove_dir(old);
        if (rename(final, old) != 0) replacing = 0;
    }
    if (rename(tmp, final) != 0) {
        snprintf(msg, msg_len, "cannot rename checkpoint '%s' to '%s': %s", tmp, final, strerror(errno));
        ckpt_remove_dir(tmp);
        if (replacing) rename(old, final);  // the checkpoint that was there comes back
        return msg;
    }
    fsync_path(base);
    if (replacing) ckpt_remove_dir(old);
    return NULL;
}

// Gathers every rank's slice list (6 numbers per slice) and file figures
// (file: 5 numbers, manifest_text's) on rank 0, which returns the manifest
// text (the other ranks NULL). Collective.
char* ckpt_gather_manifest(const Ckpt* c, int step, const uint64_t file[5], int level, size_t* len) {
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

// Removes the .tmp directories a crashed save left in base.
void ckpt_remove_stale_tmp(const char* base) {
    DIR* d = opendir(base);
    struct dirent* e;
    char path[4096 + 256];
    while (d && (e = readdir(d)) != NULL) {
        size_t nl = strlen(e->d_name);
        if (strncmp(e->d_name, "step-", 5) || nl < 5 || strcmp(e->d_name + nl - 4, ".tmp")) continue;
        snprintf(path, sizeof(path), "%s/%s", base, e->d_name);
        ckpt_remove_dir(path);
    }
    if (d) closedir(d);
}

void ckpt_restore_replaced(const char* base) {
    DIR* d = opendir(base);
    struct dirent* e;
    char old[4096 + 256], final[4096 + 256];
    while (d && (e = readdir(d)) != NULL) {
        size_t nl = strlen(e->d_name);
        int step;
        char name[32];
        if (nl != 17 || strcmp(e->d_name + 13, ".old")) continue;
        snprintf(name, sizeof(name), "%.13s", e->d_name);
        if (!ckpt_parse_step_name(name, &step)) continue;
        snprintf(old, sizeof(old), "%s/%s", base, e->d_name);
        snprintf(final, sizeof(final), "%s/%s", base, name);
        struct stat st;
        if (stat(final, &st) == 0) ckpt_remove_dir(old);
        else if (rename(old, final) == 0) fsync_path(base);
    }
    if (d) closedir(d);
}

// ---------------------------------------------------------------- load

// Sets f->path (allocated: a manifest may list many files, each path long).
void ckpt_set_path(CkptSavedFile* f, const char* fmt, ...) {
    char buf[4096 + 160];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    free(f->path);
    f->path = xmalloc(strlen(buf) + 1);
    memcpy(f->path, buf, strlen(buf) + 1);
}

void ckpt_manifest_free(CkptManifest* m) {
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
            snprintf(full, sizeof(full), "%s.%s", ckpt_kind_names[k], ckpt_tensor_name_of(c, t));
            if (!strcmp(full, name)) {
                *kind = k;
                *tensor = (int)t;
                return 1;
            }
        }
    return 0;
}

// Reads and checks DIR/MANIFEST. Returns NULL or a message naming it.
const char* ckpt_read_manifest(const char* dir, const Ckpt* c, CkptManifest* m, char* msg, size_t msg_len) {
    const GPTConfig* want = &c->cfg;
    char variant[256] = "";  // the manifest's variant line (none: the GPT)
    memset(m, 0, sizeof(*m));
    m->base_step = -1;  // a full save unless an incremental line says otherwise
    char path[4096 + 16];
    snprintf(path, sizeof(path), "%s/MANIFEST", dir);
    FILE* f = ckpt_fopen_read(path);
    if (!f) {
        snprintf(msg, msg_len, "cannot open the checkpoint manifest '%s': %s", path,
                 errno == EINVAL ? "not a regular file" : strerror(errno));
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
        else if (!strncmp(line, "run ", 4)) ok = m->has_run_id = sscanf(line, "run id=%llx", &m->run_id) == 1;
        else if (!strncmp(line, "adamw ", 6)) ok = sscanf(line, "adamw lr=%f wd=%f clip=%f", &m->lr, &m->wd, &m->clip) == 3;
        else if (!strncmp(line, "files ", 6)) {
            // one "files" line: a second would replace the list (and leak it)
            ok = !m->files && sscanf(line, "files %d", &m->n_files) == 1 && m->n_files >= 0 && m->n_files < (1 << 24);
            if (ok) m->files = xcalloc((size_t)m->n_files + 1, sizeof(CkptSavedFile));
        } else if (!strncmp(line, "file ", 5)) {
            int i = -1;
            ok = m->files && sscanf(line, "file %d", &i) == 1 && i == files_seen && i < m->n_files &&
                 sscanf(line, "file %*d %63s bytes=%llu hash=%llx", m->files[i].name, &m->files[i].bytes,
                        &m->files[i].hash) == 3 && !strchr(m->files[i].name, '/');
            if (ok) ckpt_set_path(&m->files[i], "%s/%s", dir, m->files[i].name);
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
            if (ok) m->slices = xcalloc((size_t)m->n_slices + 1, sizeof(CkptSavedSlice));
        } else if (!strncmp(line, "slice ", 6)) {
            char name[64];
            CkptSavedSlice s;
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
    // a file holds its slices back to back after its header, in the order
    // listed (manifest_text writes them so), and nothing else: an offset
    // the checksums do not cover, edited, would read other bytes
    unsigned long long* slices_end = bad ? NULL : xcalloc((size_t)m->n_files + 1, sizeof(unsigned long long));
    for (int f = 0; slices_end && f < m->n_files; f++) slices_end[f] = CKPT_HEADER_BYTES;
    for (int j = 0; slices_end && !bad && j < m->n_slices; j++) {
        const CkptSavedSlice* s = &m->slices[j];
        if (s->offset != slices_end[s->file]) {
            snprintf(msg, msg_len, "checkpoint manifest '%s': slice %d of %s starts at byte %zu, where the slices before it end at %llu",
                     path, j, m->files[s->file].name, s->offset, slices_end[s->file]);
            bad = msg;
        }
        slices_end[s->file] += (unsigned long long)s->len * s->count * sizeof(float);
    }
    for (int f = 0; slices_end && !bad && f < m->n_files; f++)
        if (slices_end[f] != m->files[f].bytes) {
            snprintf(msg, msg_len, "checkpoint manifest '%s': the slices of %s end at byte %llu, but the file has %llu",
                     path, m->files[f].name, slices_end[f], m->files[f].bytes);
            bad = msg;
        }
    free(slices_end);
    return bad;
}

const char* ckpt_check_manifest(const Ckpt* c, const char* dir, char* msg, size_t msg_len) {
    CkptManifest m;
    const char* bad = ckpt_read_manifest(dir, c, &m, msg, msg_len);
    ckpt_manifest_free(&m);
    return bad;
}

// Checks file i of the checkpoint: present, the size and checksum the
// manifest says, and a header naming this step.
const char* ckpt_verify_file(const CkptManifest* m, int i, char* msg, size_t msg_len) {
    const char* path = m->files[i].path;
    int fd = ckpt_open_read(path);
    if (fd < 0) {
        snprintf(msg, msg_len, "checkpoint file '%s' is missing or unreadable (%s): the checkpoint is incomplete; resume from another one",
                 path, errno == EINVAL ? "not a regular file" : strerror(errno));
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
    XXH3_state_t* sum = ckpt_checksum_begin();
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
        ckpt_checksum_add(sum, buf, (size_t)r);
        total += (size_t)r;
    }
    unsigned long long h = ckpt_checksum_end(sum);
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
        const CkptSavedSlice* v = &m->slices[j];
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
size_t ckpt_intersect_saved(const CkptSlice* s, const CkptSavedSlice* v, CkptPieceFn fn, void* ctx) {
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
    CkptSavedSlice v = {.kind = saved->kind, .tensor = saved->tensor, .offset = offset, .start = saved->start,
                    .len = saved->len, .stride = saved->stride, .count = saved->count};
    return ckpt_intersect_saved(need, &v, fn, ctx);
}

void ckpt_read_piece(void* ctx, size_t dst, size_t file_offset, size_t n) {
    CkptReadCtx* r = ctx;
    size_t want = n * sizeof(float), done = 0;
    for (size_t i = 0; r->seen && i < n; i++) r->twice += r->seen[dst + i]++ != 0;
    while (done < want && !r->failed) {
        ssize_t got = pread(r->fd, (char*)(r->dst + dst) + done, want - done, (off_t)(file_offset + done));
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) r->failed = 1;
        else done += (size_t)got;
    }
    r->bytes += want;
}

// Reads a whole file into a new buffer of *n bytes; NULL if it cannot.
unsigned char* ckpt_read_whole(const char* path, size_t* n) {
    int fd = ckpt_open_read(path);
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

