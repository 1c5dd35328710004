// ckpt_files.h: the checkpoint's files and manifest, below ckpt.c and
// ckpt_levels.c (docs/checkpoints.md): writing and copying a rank's file
// with its checksum, the manifest's text, its atomic install (manifest last,
// then one rename) and its parsing and checks, and reading the slices back.
// Nothing here decides when to save or which level to read: ckpt.c and
// ckpt_levels.c do. The functions say in ckpt_files.c what they do.
#ifndef CKPT_FILES_H
#define CKPT_FILES_H

#include <stddef.h>
#include <stdint.h>
#include <xxhash.h>

#include "ckpt.h"
#include "errors.h"

#define CKPT_FILE_MAGIC "GPTSTATE"
#define CKPT_FILE_VERSION 2u  // 2: the header holds the checksum of the rank's slice list
#define CKPT_HEADER_BYTES 64
// version 2: XXH3-64 checksums (version 1 had a 64-bit FNV variant whose
// paired flips of a word's top bit cancelled)
#define CKPT_MANIFEST_MAGIC "gpt-training-state 2"
#define CKPT_MANIFEST_MAGIC_V1 "gpt-training-state 1"
#define CKPT_XOR_MAGIC "GPTXOR01"

extern const char* ckpt_kind_names[CKPT_NUM_KINDS];  // "params", "m", "v"
const char* ckpt_tensor_name_of(const Ckpt* c, int t);

// checksums, streamed: the same value as ckpt_checksum over the concatenation
XXH3_state_t* ckpt_checksum_begin(void);
void ckpt_checksum_add(XXH3_state_t* s, const void* buf, size_t n);
unsigned long long ckpt_checksum_end(XXH3_state_t* s);

// small file helpers
void ckpt_remove_dir(const char* path);
// The newest complete checkpoint (step-N with a MANIFEST) in base that
// another run saved (its manifest's run id is not `run_id`, or it has
// none), or -1. A resumed run (upto >= 0) also owns the steps up to `upto`
// that the run it resumes saved (run id `resumed_id`) or, with `any_upto`
// (base is where it resumed from), any run saved: the history it continues.
int ckpt_foreign_step(const char* base, unsigned long long run_id, unsigned long long resumed_id, int upto,
                      int any_upto);
int ckpt_parse_step_name(const char* name, int* step);
int ckpt_has_manifest(const char* dir);
void ckpt_tmp_dir_of(const char* base, int step, char* out, size_t len);
void ckpt_remove_stale_tmp(const char* base);
// A step-N.old without its step-N is a checkpoint a crash caught being
// replaced (ckpt_install_manifest moves it aside for two renames): it comes
// back. One beside its step-N, the replaced one a crash left: removed.
void ckpt_restore_replaced(const char* base);
unsigned char* ckpt_read_whole(const char* path, size_t* n);
// Opens a checkpoint's file to read, a regular file only: a pipe put where a
// file belongs would block its open (and every rank behind it) forever.
// -1 with errno, EINVAL for a pipe or a device, EISDIR for a directory;
// ckpt_fopen_read the same as a FILE*.
int ckpt_open_read(const char* path);
FILE* ckpt_fopen_read(const char* path);

// the CKPT_KILL test hook
int ckpt_fault_fires(const Ckpt* c, const char* where, int step);
void ckpt_fault_kill(void);
void ckpt_fault_flip(const char* path);

// writing a rank's file
// What a file write gives: its size and checksum, or an error.
typedef struct {
    size_t bytes;
    unsigned long long hash;
    char err[ERROR_MAX];  // empty when the write succeeded
} CkptFileOut;
void ckpt_file_header(const Ckpt* c, int step, unsigned char header[CKPT_HEADER_BYTES]);
void ckpt_write_parts(const char* path, const void* const parts[2], const size_t sizes[2], int kill_here,
                      CkptFileOut* out);
void ckpt_copy_file(const char* src, const char* dst, int kill_here, CkptFileOut* out);

// the manifest: gathered on rank 0, installed (manifest last, then rename)
char* ckpt_gather_manifest(const Ckpt* c, int step, const uint64_t file[5], int level, size_t* len);
const char* ckpt_install_manifest(const char* base, int step, const char* text, size_t len,
                                  char* msg, size_t msg_len);
// Keeps the newest `keep` complete checkpoints of dir up to `step`, the one
// just installed (0: all, and nothing removed), and the full saves their
// deltas need. A step after it stays; a step after `passed` and before
// `step` (passed >= 0: a resumed run's previous save, or the step it
// resumed) is a branch the run left behind (corrupt, or abandoned) and has
// now passed: removed. Pruning by
// number alone kept such a step and deleted the run's own saves for it.
// Called once every rank (every node) has installed the new one: a node
// that pruned before another had committed could leave no step complete on
// all of them.
void ckpt_prune(const char* dir, int keep, int step, int passed);

// a manifest read back: its files and slices
typedef struct {
    int kind, tensor, file;
    size_t offset, start, len, stride, count;
} CkptSavedSlice;

typedef struct {
    char name[64];
    unsigned long long bytes, hash;
    char* path;  // where it is read from: DIR/name, a level-1 copy, a rebuild or a restored delta
} CkptSavedFile;

typedef struct {
    int step, B, T, seed, chapter, world;
    GPTConfig cfg;
    float lr, wd, clip;
    unsigned long long run_id;  // the saving run's identity (Ckpt.run_id)
    int has_run_id;             // 0: a manifest of a version that wrote none
    int n_files, n_slices;
    CkptSavedFile* files;
    CkptSavedSlice* slices;
    // a level-1 manifest's: the nodes, the redundancy, each rank's parity
    int level, nodes, redundancy;
    int* node_of;                          // (world)
    unsigned long long *parity_bytes, *parity_hash;  // (world) 0 bytes: none
    // an incremental save's: the full save it is a delta against (-1: none)
    int base_step;
    unsigned long long base_hash;
    unsigned long long *delta_bytes, *delta_hash;  // (world)
    int* holder;  // (files) a level-1 resume's: the rank that serves each file
} CkptManifest;
void ckpt_set_path(CkptSavedFile* f, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
void ckpt_manifest_free(CkptManifest* m);
const char* ckpt_read_manifest(const char* dir, const Ckpt* c, CkptManifest* m, char* msg, size_t msg_len);
const char* ckpt_verify_file(const CkptManifest* m, int i, char* msg, size_t msg_len);

// reading slices: the overlaps of a needed slice with a saved one
size_t ckpt_intersect_saved(const CkptSlice* s, const CkptSavedSlice* v, CkptPieceFn fn, void* ctx);
typedef struct {
    int fd;
    float* dst;
    const char* path;
    int failed;
    size_t bytes;
    unsigned char* seen;  // per element of dst: read already (NULL: not tracked)
    size_t twice;         // elements read from two saved slices: slices that overlap
} CkptReadCtx;
void ckpt_read_piece(void* ctx, size_t dst, size_t file_offset, size_t n);

#endif
