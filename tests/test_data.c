// test_data.c: tokenizer, token files, the train/val split, and batches that
// are the same whatever the world size.
#include <stdio.h>
#include <stdlib.h>
#include <signal.h>
#include <string.h>
#include <errno.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "atomic_file.h"
#include "data.h"
#include "test.h"

static void test_tokenizer_and_files(void) {
    const char* text = "Hello\n\xc3\xa9!";  // UTF-8 bytes above 127 stay bytes
    uint16_t tok[9];
    tokenize_bytes(text, 9, tok);
    check(tok[0] == 'H' && tok[5] == '\n' && tok[6] == 0xc3 && tok[7] == 0xa9 && tok[8] == '!',
          "data: byte-level tokenizer maps each byte to its value", "got %d %d %d", tok[0], tok[6], tok[7]);

    // token file round trip, in llm.c's format
    uint16_t tokens[1000];
    int want_max = 0;
    for (int i = 0; i < 1000; i++) {
        tokens[i] = (uint16_t)((i * 7919) % 50257);
        if (tokens[i] > want_max) want_max = tokens[i];
    }
    char msg[1024];
    const char* path = tmp_path("test_data_tokens.bin");
    const char* bad = data_write_tokens(path, tokens, 1000, msg, sizeof(msg));
    TokenSet set, val;
    if (!bad) bad = data_open(path, &set, &val, msg, sizeof(msg));
    check(bad == NULL && set.count == 1000 && memcmp(set.tokens, tokens, sizeof(tokens)) == 0 &&
              val.count == 0 && set.max_token == want_max && want_max > 50000,
          "data: token file round trip (a token file is used whole, ids up to GPT-2's)", "%s", bad ? bad : "content differs");
    FILE* f = fopen(path, "rb");
    int header[256];
    size_t got = fread(header, sizeof(int), 256, f);
    fclose(f);
    check(got == 256 && header[0] == 20240520 && header[1] == 1 && header[2] == 1000,
          "data: token file header is llm.c's (20240520, 1, count)", "header %d %d %d", header[0], header[1], header[2]);
    data_close(&set);

    // broken token files
    unsigned char* bytes = malloc(1024 + 2000);
    f = fopen(path, "rb");
    got = fread(bytes, 1, 1024 + 2000, f);
    fclose(f);
    const char* broken = tmp_path("test_data_broken.bin");
    struct { const char* name; int field; int value; size_t len; const char* expect; } cases[] = {
        {"wrong magic", 0, 20240326, 3024, "not an llm.c token file"},
        {"wrong version", 1, 2, 3024, "version"},
        {"truncated", -1, 0, 3022, "truncated"},
        {"count larger than the file", 2, 5000, 3024, "truncated"},
        {"shorter than its header", -1, 0, 512, "too short"},
    };
    for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
        int saved = 0;
        if (cases[k].field >= 0) {
            memcpy(&saved, bytes + 4 * cases[k].field, 4);
            memcpy(bytes + 4 * cases[k].field, &cases[k].value, 4);
        }
        write_bytes(broken, bytes, cases[k].len);
        if (cases[k].field >= 0) memcpy(bytes + 4 * cases[k].field, &saved, 4);
        TokenSet s;
        bad = data_open_tokens(broken, &s, msg, sizeof(msg));
        char name[128];
        snprintf(name, sizeof(name), "data: token file with %s is refused with a message", cases[k].name);
        check(bad != NULL && strstr(bad, cases[k].expect) != NULL, name, "got: %s", bad ? bad : "(accepted)");
        if (!bad) data_close(&s);
    }
    bad = data_open(tmp_path("no_such_data.txt"), &set, &val, msg, sizeof(msg));
    check(bad && strstr(bad, "cannot open"), "data: a missing data file is refused with a message", "got: %s", bad ? bad : "(accepted)");
    free(bytes);
    remove(path);
    remove(broken);
}

static void test_text_split(void) {
    char text[1000];
    for (int i = 0; i < 1000; i++) text[i] = (char)('a' + i % 26);
    const char* path = tmp_path("test_data_text.txt");
    write_bytes(path, text, 1000);
    TokenSet train, val;
    char msg[1024];
    const char* bad = data_open(path, &train, &val, msg, sizeof(msg));
    check(bad == NULL && train.count == 900 && val.count == 100 && train.tokens[0] == 'a' &&
              val.tokens[0] == (uint16_t)text[900] && val.tokens[99] == (uint16_t)text[999],
          "data: a text file splits into the first 90% (train) and last 10% (val)",
          "train %zu, val %zu", train.count, val.count);
    data_close(&train);
    data_close(&val);
    // a length that is no multiple of 10: val is the last len/10 bytes,
    // rounded down (95 bytes: 86 and 9), not 90% rounded
    write_bytes(path, text, 95);
    bad = data_open(path, &train, &val, msg, sizeof(msg));
    check(bad == NULL && train.count == 86 && val.count == 9 && val.tokens[0] == (uint16_t)text[86],
          "data: a 95-byte text splits into 86 train and 9 val tokens (val = the last len/10)",
          "train %zu, val %zu", train.count, val.count);
    data_close(&train);
    data_close(&val);
    remove(path);
}

static void test_batches(void) {
    // a token set where token i is i % 60000, so positions can be read back
    size_t n = 10007;
    uint16_t* tokens = malloc(n * sizeof(uint16_t));
    for (size_t i = 0; i < n; i++) tokens[i] = (uint16_t)(i % 60000);
    TokenSet set = {.tokens = tokens, .count = n, .max_token = 10006};
    int B = 12, T = 16;
    size_t per_epoch = data_batches_per_epoch(&set, B, T);
    check(per_epoch == (n - 1) / (size_t)(B * T), "data: whole batches per epoch = (count - 1) / (B*T)",
          "%zu", per_epoch);
    // a batch reads B*T + 1 tokens (the targets one ahead): 5 batches' worth
    // of tokens exactly holds 4 whole ones, one token more holds 5
    TokenSet exact = {.tokens = tokens, .count = 5 * (size_t)(B * T), .max_token = 10006};
    size_t k4 = data_batches_per_epoch(&exact, B, T);
    exact.count++;
    size_t k5 = data_batches_per_epoch(&exact, B, T);
    check(k4 == 4 && k5 == 5, "data: 5*B*T tokens hold 4 whole batches (the last target is one past), 5*B*T + 1 hold 5",
          "%zu and %zu", k4, k5);
    int* in = malloc(sizeof(int) * B * T);
    int* tg = malloc(sizeof(int) * B * T);
    int ok_pos = 1, ok_split = 1;
    for (long step = 0; step < 3 * (long)per_epoch + 5; step++) {
        data_batch(&set, step, B, T, 0, B, in, tg);
        // llm.c's order: sequence b of step s starts at (s*B + b)*T, and the
        // loader goes back to 0 when a whole batch no longer fits
        long s = step % (long)per_epoch;
        for (int b = 0; b < B; b++)
            for (int t = 0; t < T; t++) {
                long want = (s * B + b) * T + t;
                if (in[b * T + t] != want || tg[b * T + t] != want + 1) ok_pos = 0;
            }
        // the global batch is the same whatever the world size: each of n
        // ranks reads only its B/n sequences, and together they are the batch
        for (int world = 1; world <= 4; world++) {
            if (B % world) continue;
            int per = B / world;
            for (int r = 0; r < world; r++) {
                int* rin = malloc(sizeof(int) * per * T);
                int* rtg = malloc(sizeof(int) * per * T);
                data_batch(&set, step, B, T, r * per, per, rin, rtg);
                if (memcmp(rin, in + r * per * T, sizeof(int) * per * T) ||
                    memcmp(rtg, tg + r * per * T, sizeof(int) * per * T))
                    ok_split = 0;
                free(rin);
                free(rtg);
            }
        }
    }
    check(ok_pos, "data: sequence b of step s starts at token (s*B + b)*T, wrapping per whole batch",
          "a sequence started elsewhere");
    check(ok_split, "data: ranks' slices of a step concatenate to the global batch (world 1..4)",
          "a rank's slice differs from the global batch");
    free(in);
    free(tg);
    free(tokens);
}

// --data takes text or a token file; anything else is refused by name.
static void test_not_text(void) {
    char msg[1024];
    TokenSet train, val;
    const char* path = tmp_path("test_data_not_text.bin");
    static unsigned char buf[4096];
    struct { const char* name; int kind; const char* expect; } cases[] = {
        {"an llm.c checkpoint (magic 20240326)", 0, "--model"},
        {"a token file whose magic is corrupt", 1, "not text"},
        {"random bytes", 2, "not text"},
        {"text with one NUL byte", 3, "NUL"},
    };
    for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
        memset(buf, 'a', sizeof(buf));
        int header[256] = {0};
        if (cases[k].kind <= 1) {
            header[0] = cases[k].kind == 0 ? 20240326 : 20240521;
            header[1] = cases[k].kind == 0 ? 3 : 1;
            header[2] = 1000;
            memcpy(buf, header, sizeof(header));
        } else if (cases[k].kind == 2) {
            unsigned x = 12345;
            for (size_t i = 0; i < sizeof(buf); i++) buf[i] = (unsigned char)((x = x * 1103515245u + 12345u) >> 24);
        } else {
            buf[2000] = 0;
        }
        write_bytes(path, buf, sizeof(buf));
        const char* bad = data_open(path, &train, &val, msg, sizeof(msg));
        char name[160];
        snprintf(name, sizeof(name), "data: --data with %s is refused, naming the file", cases[k].name);
        check(bad && strstr(bad, cases[k].expect) && strstr(bad, path), name, "got: %s", bad ? bad : "(accepted as text)");
        if (!bad) {
            data_close(&train);
            data_close(&val);
        }
    }
    // Latin-1 text: a few bytes that are not UTF-8 (under 1%) are still text
    memset(buf, 'a', sizeof(buf));
    for (size_t i = 0; i < 30; i++) buf[100 * i + 7] = 0xE9;  // Latin-1 e-acute, alone
    buf[3000] = 0xC3;  // and one real UTF-8 e-acute
    buf[3001] = 0xA9;
    write_bytes(path, buf, sizeof(buf));
    const char* bad = data_open(path, &train, &val, msg, sizeof(msg));
    check(bad == NULL && train.count + val.count == sizeof(buf), "data: text with a few Latin-1 bytes (under 1%) is accepted",
          "%s", bad ? bad : "wrong count");
    if (!bad) {
        data_close(&train);
        data_close(&val);
    }
    remove(path);
}

// A write stopped by SIGINT or SIGTERM leaves no temporary file behind, and
// the process still dies of the signal.
static void test_tmpfile_guard(void) {
    int sigs[2] = {SIGINT, SIGTERM};
    for (int k = 0; k < 2; k++) {
        const char* tmp = tmp_path("test_data_guard.tmp.1");
        write_bytes(tmp, "half a file", 11);
        pid_t pid = fork();
        if (pid == 0) {
            tmpfile_guard_begin(tmp);
            raise(sigs[k]);
            _exit(0);  // not reached
        }
        int status = 0;
        waitpid(pid, &status, 0);
        int gone = access(tmp, F_OK) != 0;
        char name[128];
        snprintf(name, sizeof(name), "data: %s during an atomic write removes its temporary file", k ? "SIGTERM" : "SIGINT");
        check(gone && WIFSIGNALED(status) && WTERMSIG(status) == sigs[k], name, "file %s, status %d",
              gone ? "removed" : "left behind", status);
        remove(tmp);
    }
    // after the write, the signals are the process's own again
    const char* tmp = tmp_path("test_data_guard.tmp.2");
    write_bytes(tmp, "x", 1);
    tmpfile_guard_begin(tmp);
    tmpfile_guard_end();
    struct sigaction now;
    sigaction(SIGTERM, NULL, &now);
    check(now.sa_handler == SIG_DFL && access(tmp, F_OK) == 0, "data: tmpfile_guard_end restores the signal handlers",
          "handler not restored");
    remove(tmp);
}

// atomic_open refuses a target that is not a regular file: its rename would
// replace the pipe (or, as root, a device node) with a file.
static void test_atomic_not_regular(void) {
    const char* pipe_path = tmp_path("test_data_pipe");
    remove(pipe_path);
    AtomicFile a;
    int made = mkfifo(pipe_path, 0600) == 0, err = made ? atomic_open(&a, pipe_path) : -1;
    struct stat st;
    int still = stat(pipe_path, &st) == 0 && S_ISFIFO(st.st_mode);
    check(made && err == EINVAL && still, "data: atomic_open refuses a pipe (EINVAL) and leaves it a pipe",
          "mkfifo %d, atomic_open %d, still a pipe %d", made, err, still);
    if (err == 0) atomic_close(&a, 0);
    remove(pipe_path);
}

int main(void) {
    test_atomic_not_regular();
    test_tokenizer_and_files();
    test_text_split();
    test_not_text();
    test_tmpfile_guard();
    test_batches();
    return test_exit_code();
}
