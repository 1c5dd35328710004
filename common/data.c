// data.c: token sets from token files, text files and the default corpus.
#include "data.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "atomic_file.h"
#include "errors.h"
#include "memory.h"
#include "paths.h"

#define TOKENS_MAGIC 20240520
#define TOKENS_VERSION 1

static void set_from_owned(TokenSet* set, uint16_t* tokens, size_t count) {
    memset(set, 0, sizeof(*set));
    set->owned = tokens;
    set->tokens = tokens;
    set->count = count;
    int mx = 0;
    for (size_t i = 0; i < count; i++) mx = tokens[i] > mx ? tokens[i] : mx;
    set->max_token = mx;
}

void tokenize_bytes(const char* text, size_t len, uint16_t* tokens) {
    for (size_t i = 0; i < len; i++) tokens[i] = (unsigned char)text[i];
}

// Reads a whole regular file into memory; *len gets its size. Returns NULL
// with errno set when the file cannot be read (EISDIR for a directory).
static char* read_file(const char* path, size_t* len) {
    struct stat st;
    if (stat(path, &st) != 0) return NULL;
    if (!S_ISREG(st.st_mode)) {
        errno = S_ISDIR(st.st_mode) ? EISDIR : EINVAL;
        return NULL;
    }
    FILE* f = fopen(path, "rb");
    if (!f) return NULL;
    size_t size = (size_t)st.st_size;
    char* buf = xmalloc(size);
    size_t got = fread(buf, 1, size, f);
    int failed = ferror(f);
    fclose(f);
    if (failed) {
        free(buf);
        errno = EIO;
        return NULL;
    }
    *len = got;
    return buf;
}

// (path is a regular file: data_open checks before it opens anything)
static int is_token_file(const char* path) {
    FILE* f = fopen(path, "rb");
    if (!f) return 0;
    int magic = 0;
    int got = fread(&magic, sizeof(int), 1, f) == 1;
    fclose(f);
    return got && magic == TOKENS_MAGIC;
}

const char* data_open_tokens(const char* path, TokenSet* set, char* msg, size_t msg_len) {
    memset(set, 0, sizeof(*set));
    // before open(): opening a FIFO blocks until a writer comes, where no --timeout sees it
    if (paths_check_regular("token file", path, "give an llm.c token file", msg, msg_len)) return msg;
    int fd = open(path, O_RDONLY);
    if (fd < 0) {
        snprintf(msg, msg_len, "cannot open token file '%s': %s", path, strerror(errno));
        return msg;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {  // replaced since the check
        close(fd);
        snprintf(msg, msg_len, "token file '%s' is not a regular file: give an llm.c token file", path);
        return msg;
    }
    size_t bytes = (size_t)st.st_size;
    int header[256];
    if (bytes < sizeof(header) || pread(fd, header, sizeof(header), 0) != (ssize_t)sizeof(header)) {
        close(fd);
        snprintf(msg, msg_len, "token file '%s' is too short for its 1024-byte header (%zu bytes)", path, bytes);
        return msg;
    }
    if (header[0] != TOKENS_MAGIC) {
        close(fd);
        snprintf(msg, msg_len, "'%s' is not an llm.c token file: magic %d, expected %d (make one with build/tokenize; a "
                 "text file goes to --data, which splits off its own validation)", path, header[0], TOKENS_MAGIC);
        return msg;
    }
    if (header[1] != TOKENS_VERSION) {
        close(fd);
        snprintf(msg, msg_len, "token file '%s' has version %d, expected %d", path, header[1], TOKENS_VERSION);
        return msg;
    }
    size_t count = (size_t)(unsigned)header[2];
    if (header[2] < 0 || bytes != sizeof(header) + 2 * count) {
        close(fd);
        snprintf(msg, msg_len, "token file '%s' has %zu bytes, but its header promises %d tokens (%zu bytes): the file is truncated or corrupt",
                 path, bytes, header[2], sizeof(header) + 2 * count);
        return msg;
    }
    // map the file: a rank touches only the pages of the sequences it reads
    void* map = mmap(NULL, bytes, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (map == MAP_FAILED) {
        snprintf(msg, msg_len, "cannot map token file '%s': %s", path, strerror(errno));
        return msg;
    }
    set->map = map;
    set->map_bytes = bytes;
    set->tokens = (const uint16_t*)((const char*)map + sizeof(header));
    set->count = count;
    int mx = 0;
    for (size_t i = 0; i < count; i++) mx = set->tokens[i] > mx ? set->tokens[i] : mx;
    set->max_token = mx;
    return NULL;
}

// Splits text bytes into train (first 90%) and val (last 10%).
static void split_text(const char* text, size_t len, TokenSet* train, TokenSet* val) {
    size_t n_train = len - len / 10;
    uint16_t* a = xmalloc((n_train ? n_train : 1) * sizeof(uint16_t));
    uint16_t* b = xmalloc((len - n_train ? len - n_train : 1) * sizeof(uint16_t));
    tokenize_bytes(text, n_train, a);
    tokenize_bytes(text + n_train, len - n_train, b);
    set_from_owned(train, a, n_train);
    set_from_owned(val, b, len - n_train);
}

static int compare_names(const void* a, const void* b) {
    return strcmp(*(char* const*)a, *(char* const*)b);
}

static const char* open_default_corpus(TokenSet* train, TokenSet* val, char* msg, size_t msg_len) {
    DIR* dir = opendir(DEFAULT_CORPUS_DIR);
    if (!dir) {
        snprintf(msg, msg_len, "the default corpus %s is missing: install it with 'apt-get install fortunes' (or 'make setup' as root), or give a text or token file with --data FILE",
                 DEFAULT_CORPUS_DIR);
        return msg;
    }
    // the text files: every regular file except the .dat indexes and .u8 links
    char** names = NULL;
    int n = 0, cap = 0;
    struct dirent* e;
    while ((e = readdir(dir)) != NULL) {
        size_t len = strlen(e->d_name);
        if (e->d_name[0] == '.') continue;
        if (len > 4 && strcmp(e->d_name + len - 4, ".dat") == 0) continue;
        if (len > 3 && strcmp(e->d_name + len - 3, ".u8") == 0) continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 64;
            char** grown = xmalloc((size_t)cap * sizeof(char*));
            for (int i = 0; i < n; i++) grown[i] = names[i];
            free(names);
            names = grown;
        }
        names[n++] = strdup(e->d_name);
    }
    closedir(dir);
    qsort(names, (size_t)n, sizeof(char*), compare_names);
    char* text = NULL;
    size_t total = 0, text_cap = 0;
    for (int i = 0; i < n; i++) {
        char path[1024];
        snprintf(path, sizeof(path), "%s/%s", DEFAULT_CORPUS_DIR, names[i]);
        struct stat st;
        size_t len = 0;
        char* part = (stat(path, &st) == 0 && S_ISREG(st.st_mode)) ? read_file(path, &len) : NULL;
        if (part) {
            // the buffer doubles when it is full, so the text read so far is
            // copied once per doubling, not once per file (43 files here)
            if (total + len + 1 > text_cap) {
                size_t want = text_cap ? 2 * text_cap : (size_t)1 << 20;
                while (want < total + len + 1) want *= 2;
                char* grown = xmalloc(want);
                if (text) memcpy(grown, text, total);
                free(text);
                text = grown;
                text_cap = want;
            }
            memcpy(text + total, part, len);
            free(part);
            total += len;
        }
        free(names[i]);
    }
    free(names);
    if (total == 0) {
        free(text);
        snprintf(msg, msg_len, "the default corpus %s has no text files: reinstall it with 'apt-get install --reinstall fortunes', or give --data FILE",
                 DEFAULT_CORPUS_DIR);
        return msg;
    }
    split_text(text, total, train, val);
    free(text);
    return NULL;
}

// Bytes of text that are not part of a well-formed UTF-8 sequence (ASCII is
// UTF-8). Overlong forms and surrogates are not told apart: this only has to
// tell text from binary.
static size_t invalid_utf8_bytes(const unsigned char* s, size_t len) {
    size_t bad = 0, i = 0;
    while (i < len) {
        unsigned char c = s[i];
        int follow = c < 0x80 ? 0 : (c >> 5) == 0x6 ? 1 : (c >> 4) == 0xE ? 2 : (c >> 3) == 0x1E ? 3 : -1;
        int ok = follow >= 0 && i + (size_t)follow < len;
        for (int k = 1; ok && k <= follow; k++) ok = (s[i + k] & 0xC0) == 0x80;
        if (ok) {
            i += (size_t)follow + 1;
        } else {
            bad++;
            i++;
        }
    }
    return bad;
}

// A --data file that is not a token file must be text: a model checkpoint or
// a token file whose header is corrupt would otherwise train as bytes. Text
// has no NUL byte, and at most a small share (1%) of bytes that are not UTF-8
// (a Latin-1 accent here and there is fine; binary data is not).
static const char* check_text(const char* path, const char* text, size_t len, char* msg, size_t msg_len) {
    int magic = 0;
    if (len >= sizeof(int)) memcpy(&magic, text, sizeof(int));
    if (magic == 20240326) {  // llm.c's checkpoint magic (model_file.c)
        snprintf(msg, msg_len, "'%s' is an llm.c model checkpoint, not training data: give it with --model, and a text or token file with --data", path);
        return msg;
    }
    size_t nul = len ? (size_t)(memchr(text, 0, len) != NULL) : 0;
    size_t bad = invalid_utf8_bytes((const unsigned char*)text, len);
    if (nul || bad > len / 100) {
        snprintf(msg, msg_len, "data file '%s' is not text (%s%zu of %zu bytes are not UTF-8) and not an llm.c token file (magic 20240520): give a text file, or a token file made by build/tokenize",
                 path, nul ? "it holds NUL bytes; " : "", bad, len);
        return msg;
    }
    return NULL;
}

const char* data_open(const char* path, TokenSet* train, TokenSet* val, char* msg, size_t msg_len) {
    memset(train, 0, sizeof(*train));
    memset(val, 0, sizeof(*val));
    if (!path) return open_default_corpus(train, val, msg, msg_len);
    // before any open(): opening a FIFO blocks until a writer comes, where no --timeout sees it
    if (paths_check_regular("data file", path, "give a text file or an llm.c token file", msg, msg_len)) return msg;
    if (is_token_file(path)) return data_open_tokens(path, train, msg, msg_len);
    size_t len = 0;
    char* text = read_file(path, &len);
    if (!text) {
        snprintf(msg, msg_len, "cannot open data file '%s': %s (give a text file or an llm.c token file)", path, strerror(errno));
        return msg;
    }
    const char* bad = check_text(path, text, len, msg, msg_len);
    if (bad) {
        free(text);
        return bad;
    }
    split_text(text, len, train, val);
    free(text);
    return NULL;
}

void data_close(TokenSet* set) {
    if (set->map) munmap(set->map, set->map_bytes);
    free(set->owned);
    memset(set, 0, sizeof(*set));
}

const char* data_write_tokens(const char* path, const uint16_t* tokens, size_t count, char* msg,
                              size_t msg_len) {
    if (count > 0x7FFFFFFF) {
        snprintf(msg, msg_len, "'%s': %zu tokens do not fit the int32 count of the file header", path, count);
        return msg;
    }
    AtomicFile out;  // a temporary file renamed over the target when complete
    int err = atomic_open(&out, path);
    if (err) {
        snprintf(msg, msg_len, "cannot write '%s' (through a temporary file next to it): %s", path, strerror(err));
        return msg;
    }
    FILE* f = out.f;
    int header[256] = {0};
    header[0] = TOKENS_MAGIC;
    header[1] = TOKENS_VERSION;
    header[2] = (int)count;
    int ok = fwrite(header, sizeof(int), 256, f) == 256;
    ok = ok && fwrite(tokens, sizeof(uint16_t), count, f) == count;
    err = atomic_close(&out, ok);
    if (err) {
        snprintf(msg, msg_len, "writing '%s' failed: %s", path, strerror(err));
        return msg;
    }
    return NULL;
}

size_t data_batches_per_epoch(const TokenSet* set, int B, int T) {
    if (set->count < 1) return 0;
    return (set->count - 1) / ((size_t)B * T);
}

void data_batch(const TokenSet* set, long step, int B, int T, int b0, int nb, int* inputs,
                int* targets) {
    size_t per_epoch = data_batches_per_epoch(set, B, T);
    CHECK(per_epoch > 0, "token set of %zu tokens is smaller than one batch (%d x %d + 1)",
          set->count, B, T);
    size_t batch = (size_t)step % per_epoch;
    for (int i = 0; i < nb; i++) {
        size_t start = (batch * (size_t)B + (size_t)(b0 + i)) * (size_t)T;
        const uint16_t* seq = set->tokens + start;
        for (int t = 0; t < T; t++) {
            inputs[(size_t)i * T + t] = seq[t];
            targets[(size_t)i * T + t] = seq[t + 1];
        }
    }
}
