// ckpt_levels.c: checkpoint levels 1 and 2 (ckpt_levels.h): each rank's
// file in its node's directory, a partner's copy or an xor parity on the
// other nodes, and the resume that reads each node's directory on that
// node's ranks only, rebuilding a lost node over MPI.
#include "ckpt_levels.h"

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

#include "errors.h"
#include "memory.h"
#include "rank.h"
#include "runtime.h"

// ---------------------------------------------------------------- level 1 and level 2

// LOCAL/node-K: node K's level-1 directory (node-local storage on a cluster).
void ckpt_node_dir(const Ckpt* c, int node, char* out, size_t len) { snprintf(out, len, "%s/node-%d", c->local, node); }

// Which ranks form a node: --ranks-per-node R (rank / R, nodes simulated on
// one machine), else the ranks that share memory (MPI's shared-memory
// split), nodes numbered by their lowest rank. Then the level-2 groups: the
// ranks at the same place on every node, ordered by node, so a group never
// has two ranks on one node. Collective.
void ckpt_nodes_init(Ckpt* c, int ranks_per_node) {
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
    char msg[ERROR_MAX];
    int alone = c->redundancy != CKPT_REDUNDANCY_NONE && c->group_size < 2;
    snprintf(msg, sizeof(msg), "--ckpt-redundancy %s keeps each rank's level-1 files on another node, but rank %d has no rank at its place (%d) on another node (%d node(s)): run on more nodes, or simulate them with --ranks-per-node",
             args_redundancy_name(c->redundancy), c->rank, c->local_index, c->nodes);
    fail_if_any(alone, msg);
}

// Sends n bytes to `to` and receives m bytes from `from` over comm, in
// pieces an int counts: ceil(n / piece) messages out, ceil(m / piece) in,
// none for 0 bytes. The receiver's m is the sender's n (the sizes go first,
// 8 bytes each way), so every message posted is matched, whatever each
// rank holds: a rank with nothing to send or receive posts nothing, and
// no neighbour waits for it (a skipped MPI_Sendrecv hung 3+ nodes).
static void sendrecv_bytes(const void* out, size_t n, int to, void* in, size_t m, int from, MPI_Comm comm) {
    const size_t piece = (size_t)1 << 30;
    size_t k = 0, count = (n + piece - 1) / piece + (m + piece - 1) / piece;
    MPI_Request* req = xmalloc((count ? count : 1) * sizeof(*req));
    for (size_t at = 0; at < m; at += piece)
        MPI_CHECK(MPI_Irecv((char*)in + at, (int)(m - at < piece ? m - at : piece), MPI_BYTE, from, 77, comm, &req[k++]));
    for (size_t at = 0; at < n; at += piece)
        MPI_CHECK(MPI_Isend((const char*)out + at, (int)(n - at < piece ? n - at : piece), MPI_BYTE, to, 77, comm, &req[k++]));
    MPI_CHECK(MPI_Waitall((int)k, req, MPI_STATUSES_IGNORE));
    free(req);
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

// Level 2, partner: this rank's file image goes to the next node's rank of
// its group, which writes it under the same name (the same bytes, so the
// same checksum as the original); this rank writes the previous node's.
static void partner_copy(Ckpt* c, const unsigned char* image, size_t bytes, const char* tmp, CkptFileOut* out) {
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
        ckpt_write_parts(path, parts, sizes, 0, out);
    }
    c->redundancy_bytes = theirs;
    free(copy);
}

// Level 2, xor: one reduce-scatter over the group leaves member i the xor
// of chunk xor_chunk_of(j, i) of every other member j's file; it writes
// that parity to xor-R.bin behind a 64-byte header. One lost member's file
// is then the xor of its chunks' parities with the others' chunks.
static void xor_parity(Ckpt* c, int step, const unsigned char* image, size_t bytes, const char* tmp, CkptFileOut* out) {
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
    ckpt_write_parts(path, parts, sizes, 0, out);
    c->redundancy_bytes = out->err[0] ? 0 : out->bytes;
    free(parity);
}

// fail_if_any for a level-1 save past the creation of its .tmp directory:
// if any rank failed (a full disk), every node's first rank removes the
// step's .tmp before every rank ends, as level 3 cleans up its own. Every
// rank is past its writes here, so nothing writes into what is removed.
static void local_fail_if_any(const Ckpt* c, const char* tmp, int failed, const char* msg) {
    int any = 0;
    MPI_CHECK(MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD));
    if (any && c->local_index == 0) ckpt_remove_dir(tmp);
    fail_if_any(failed, msg);
}

// A level-1 save of the state already in c->host: every rank writes its
// file into its node's directory, level 2 adds the partner copy or the
// parity, rank 0 builds the manifest (with the nodes and the parities) and
// every node's lowest rank writes it into its directory and renames it into
// place. Synchronous: node-local storage is fast, and the files must be
// there before level 2 and the manifest.
void ckpt_save_local(Ckpt* c, int step) {
    double t0 = now_seconds();
    char base[4096], tmp[4096 + 32], msg[ERROR_MAX];
    const char* bad = NULL;
    ckpt_node_dir(c, c->node, base, sizeof(base));
    ckpt_tmp_dir_of(base, step, tmp, sizeof(tmp));
    if (c->local_index == 0) {
        mkdir(c->local, 0755);  // may exist; the mkdir below says if it is unusable
        mkdir(base, 0755);
        if (c->local_saves == 0) ckpt_remove_stale_tmp(base);
        ckpt_remove_dir(tmp);
        if (mkdir(tmp, 0755) != 0) {
            snprintf(msg, sizeof(msg), "cannot create the level-1 checkpoint directory '%s': %s (check --ckpt-local)", tmp,
                     strerror(errno));
            bad = msg;
        }
    }
    fail_if_any(bad != NULL, bad);
    // the file image: the header and the state, as level 3 writes it
    unsigned char header[CKPT_HEADER_BYTES];
    ckpt_file_header(c, step, header);
    int has_file = c->own.n > 0;
    size_t bytes = has_file ? CKPT_HEADER_BYTES + c->own.floats * sizeof(float) : 0;
    CkptFileOut own = {0}, extra = {0};
    if (has_file) {
        char path[4096 + 64];
        snprintf(path, sizeof(path), "%s/rank-%05d.bin", tmp, c->rank);
        const void* parts[2] = {header, c->host};
        size_t sizes[2] = {CKPT_HEADER_BYTES, c->own.floats * sizeof(float)};
        ckpt_write_parts(path, parts, sizes, 0, &own);
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
    local_fail_if_any(c, tmp, failed, own.err[0] ? own.err : extra.err);
    uint64_t file[5] = {(uint64_t)has_file, has_file ? own.bytes : 0, has_file ? own.hash : 0,
                        c->redundancy == CKPT_REDUNDANCY_XOR ? extra.bytes : 0,
                        c->redundancy == CKPT_REDUNDANCY_XOR ? extra.hash : 0};
    size_t len = 0;
    char* text = ckpt_gather_manifest(c, step, file, 1, &len);
    // every node gets the manifest: rank 0 cannot write into another node's storage
    uint64_t len64 = len;
    MPI_CHECK(MPI_Bcast(&len64, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD));
    if (c->rank != 0) text = xmalloc(len64 + 1);
    MPI_CHECK(MPI_Bcast(text, (int)len64, MPI_CHAR, 0, MPI_COMM_WORLD));
    if (ckpt_fault_fires(c, "commit", step)) {  // the test hook: this node dies uncommitted, the others commit
        sleep(2);
        ckpt_fault_kill();
    }
    bad = c->local_index == 0 ? ckpt_install_manifest(base, step, text, (size_t)len64, msg, sizeof(msg)) : NULL;
    free(text);
    local_fail_if_any(c, tmp, bad != NULL, bad);
    if (c->local_index == 0) ckpt_prune(base, c->keep, step, c->local_last_saved);  // every node holds step now
    if (c->local_last_saved >= 0) c->local_last_saved = step;
    c->local_saves++;
    c->local_s += now_seconds() - t0;
    print0("checkpoint: saved level 1 %s/node-*/step-%08d (redundancy %s)\n", c->local, step,
           args_redundancy_name(c->redundancy));
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
        if (ckpt_parse_step_name(e->d_name, &step) && step < below && step > best) best = step;
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
static int xor_rebuild(Ckpt* c, CkptManifest* m, int x, int fx, int step, const int* file_of, const int* has,
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
    const CkptSavedFile* lost = &m->files[fx];
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
        int node = m->node_of[members[j]];
        if (node_leader(c, node) < 0)  // not deleted: this run has no rank there to read it
            snprintf(msg, msg_len, "cannot rebuild %s of node %d from the xor parity: %s of node %d, in the same xor group, is out of reach too: this run has no rank on node %d (it runs on %d node(s), the save on %d), and xor rebuilds one lost node per group: resume on the save's %d nodes, or from a level-3 checkpoint",
                     lost->name, m->node_of[x], m->files[f].name, node, node, c->nodes, m->nodes, m->nodes);
        else
            snprintf(msg, msg_len, "cannot rebuild %s of node %d from the xor parity: %s of node %d, in the same xor group, is lost too (xor rebuilds one lost node per group)",
                     lost->name, m->node_of[x], m->files[f].name, node);
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
            unsigned char* parity = ckpt_read_whole(path, &n);
            if (parity && n == CKPT_HEADER_BYTES + chunk)
                for (size_t b = 0; b < chunk; b++) out[b] ^= parity[CKPT_HEADER_BYTES + b];
            else snprintf(msg, msg_len, "cannot read '%s' to rebuild %s", path, lost->name), bad = msg;
            free(parity);
            mine = 1;
        }
        for (int j = 0; j < g && !bad; j++) {
            if (j == i || j == gx || file_holder[j] != c->rank) continue;
            size_t n = 0;
            unsigned char* file = ckpt_read_whole(m->files[file_of[members[j]]].path, &n);
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
        if (!ckpt_has_manifest(dir)) {
            CkptFileOut out;
            const void* parts[2] = {text, NULL};
            size_t sizes[2] = {text_len, 0};
            ckpt_write_parts(path, parts, sizes, 0, &out);
        }
        local_path(c, c->node, step, lost->name, path, sizeof(path));
        snprintf(tmp, sizeof(tmp), "%s.rebuild", path);
        const void* parts[2] = {image, NULL};
        size_t psizes[2] = {lost->bytes, 0};
        CkptFileOut out;
        ckpt_write_parts(tmp, parts, psizes, 0, &out);
        // checked before it takes the lost file's name: a wrong image never
        // sits where a later restart would look for the file
        if (!out.err[0] && out.hash != lost->hash) {
            snprintf(msg, msg_len, "the rebuilt '%s' does not match the manifest's checksum: the xor group's files are not of one save",
                     path);
            bad = msg;
            unlink(tmp);
        } else if (out.err[0] || rename(tmp, path) != 0) {
            snprintf(msg, msg_len, "cannot write the rebuilt '%s': %s", path, out.err[0] ? out.err : strerror(errno));
            bad = msg;
            unlink(tmp);
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
// unusable one lacked. -1 too when this run cannot copy a manifest into
// scratch: err says why on the ranks that failed (empty on the others).
// Collective; the same answer on every rank.
int ckpt_local_pick(Ckpt* c, int floor, const unsigned long long* level3_id, CkptManifest* m, const char* scratch,
                    char* dir, size_t dir_len, char* report, size_t report_len, char* why, size_t why_len, char* err,
                    size_t err_len) {
    int leader = node_leader(c, c->node) == c->rank;
    int picked = -1, below = INT_MAX;
    char msg[ERROR_MAX];
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
        if (leader && ckpt_has_manifest(mdir)) {
            CkptManifest probe;
            const char* why_not = ckpt_read_manifest(mdir, c, &probe, msg, sizeof(msg));
            ok = !why_not && probe.level == 1;
            if (why_not && !why[0]) snprintf(why, why_len, "level-1 step %d: %s", step, why_not);
            ckpt_manifest_free(&probe);
        }
        int src = ok ? c->rank : c->world, from = c->world;
        MPI_CHECK(MPI_Allreduce(&src, &from, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD));
        if (from == c->world) continue;
        char mpath[4096 + 80];
        snprintf(mpath, sizeof(mpath), "%s/MANIFEST", mdir);
        size_t text_len = 0;
        unsigned char* text = c->rank == from ? ckpt_read_whole(mpath, &text_len) : NULL;
        uint64_t n64 = text_len;
        MPI_CHECK(MPI_Bcast(&n64, 1, MPI_UINT64_T, from, MPI_COMM_WORLD));
        if (c->rank != from) text = xmalloc(n64 + 1);
        MPI_CHECK(MPI_Bcast(text, (int)n64, MPI_CHAR, from, MPI_COMM_WORLD));
        text_len = (size_t)n64;
        snprintf(mpath, sizeof(mpath), "%s/MANIFEST", scratch);
        CkptFileOut wrote;
        const void* parts[2] = {text, NULL};
        size_t sizes[2] = {text_len, 0};
        ckpt_write_parts(mpath, parts, sizes, 0, &wrote);
        const char* bad = wrote.err[0] ? wrote.err : ckpt_read_manifest(scratch, c, m, msg, sizeof(msg));
        // refused on every rank if on any: the caller's refusal (ckpt.c)
        // speaks and lets go of the locks
        int failed = bad != NULL, any = 0;
        MPI_CHECK(MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD));
        if (any) {
            if (bad) snprintf(err, err_len, "%s", bad);
            free(text);
            return -1;
        }
        // another run's step (neither this run's nor level 3's, which this
        // run continues) is not taken: a stale --ckpt-local would decide
        // what the restart trains (the same text on every rank: one choice)
        if (!m->has_run_id || (m->run_id != c->run_id && !(level3_id && m->run_id == *level3_id))) {
            if (!why[0])
                snprintf(why, why_len, "level-1 step %d was saved by another run (other data or settings than this run's and level 3's)",
                         step);
            free(text);
            ckpt_manifest_free(m);
            continue;
        }
        snprintf(dir, dir_len, "%s/node-%d/step-%08d", c->local, c->node_of[from], step);
        // what each node holds: its first rank checks every file and parity
        // the manifest names in its own directory
        int W = m->world, cols = m->n_files + W;
        int* have = xcalloc((size_t)cols, sizeof(int));
        for (int i = 0; leader && i < m->n_files; i++) {
            char p[4096 + 160];
            local_path(c, c->node, step, m->files[i].name, p, sizeof(p));
            ckpt_set_path(&m->files[i], "%s", p);
            have[i] = !ckpt_verify_file(m, i, msg, sizeof(msg));
        }
        for (int r = 0; leader && r < W; r++) {
            if (!m->parity_bytes[r]) continue;
            char p[4096 + 160], name[32];
            snprintf(name, sizeof(name), "xor-%05d.bin", r);
            local_path(c, c->node, step, name, p, sizeof(p));
            size_t n = 0;
            unsigned char* buf = ckpt_read_whole(p, &n);
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
        // checked them), the others come over MPI (ckpt_local_fetch)
        for (int i = 0; i < m->n_files && !bad; i++) {
            int here = 0;
            for (int q = 0; q < c->world; q++) here |= c->node_of[q] == c->node && has[(size_t)q * cols + i];
            free(m->files[i].path);
            m->files[i].path = NULL;
            if (here) {
                char p[4096 + 160];
                local_path(c, c->node, step, m->files[i].name, p, sizeof(p));
                ckpt_set_path(&m->files[i], "%s", p);
            }
        }
        free(has);
        free(file_of);
        if (bad) {
            if (!why[0]) snprintf(why, why_len, "level-1 step %d: %s", step, bad);
            ckpt_manifest_free(m);
            continue;
        }
        picked = step;
    }
    return picked;
}

// The files this rank reads (use) that its node does not hold: each comes
// from its server (m->holder) into scratch. Every rank walks the same
// (file, rank) list in the same order, so each send meets its receive.
// NULL, or (in msg) why this rank could not write a file it received: the
// caller refuses the resume (ckpt.c). Collective.
const char* ckpt_local_fetch(Ckpt* c, CkptManifest* m, const int* use, const char* scratch, char* msg, size_t msg_len) {
    int n = m->n_files;
    int* want = xcalloc((size_t)n + 1, sizeof(int));
    for (int f = 0; f < n; f++) want[f] = use[f] && !m->files[f].path;
    int* wants = xmalloc(sizeof(int) * ((size_t)n + 1) * (size_t)c->world);
    MPI_CHECK(MPI_Allgather(want, n + 1, MPI_INT, wants, n + 1, MPI_INT, MPI_COMM_WORLD));
    msg[0] = 0;
    for (int f = 0; f < n; f++)
        for (int q = 0; q < c->world; q++) {
            if (!wants[(size_t)q * (n + 1) + f]) continue;
            int h = m->holder[f];
            size_t bytes = m->files[f].bytes;
            if (c->rank == h) {
                size_t got = 0;
                unsigned char* buf = ckpt_read_whole(m->files[f].path, &got);
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
                ckpt_set_path(&m->files[f], "%s/%s", scratch, m->files[f].name);
                const void* parts[2] = {buf, NULL};
                size_t sizes[2] = {bytes, 0};
                CkptFileOut out;
                ckpt_write_parts(m->files[f].path, parts, sizes, 0, &out);
                if (out.err[0] && !msg[0]) snprintf(msg, msg_len, "%s", out.err);
                free(buf);
            }
        }
    free(want);
    free(wants);
    return msg[0] ? msg : NULL;
}

