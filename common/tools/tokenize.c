// tokenize: turns any text file into llm.c token files, byte-level.
//
//   build/tokenize input.txt data/corpus
//
// writes data/corpus_train.bin (first 90% of the bytes) and data/corpus_val.bin
// (last 10%), the split the chapters make themselves from a text --data file.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data.h"
#include "errors.h"
#include "paths.h"

int main(int argc, char** argv) {
    int help = 0;
    for (int i = 1; i < argc; i++) help |= !strcmp(argv[i], "--help") || !strcmp(argv[i], "-h");
    if (argc != 3 || help) {
        if (!help) fprintf(stderr, "error: give an input file and an output prefix (%d argument%s given)\n", argc - 1,
                           argc == 2 ? "" : "s");
        fprintf(help ? stdout : stderr,
                "usage: %s INPUT.txt OUTPUT_PREFIX\n"
                "writes OUTPUT_PREFIX_train.bin (first 90%%) and OUTPUT_PREFIX_val.bin (last 10%%)\n",
                argv[0]);
        return help ? 0 : 1;
    }
    // the prefix names files: not empty, not a directory (prefix/_train.bin), not a flag
    size_t plen = strlen(argv[2]);
    if (plen == 0 || argv[2][plen - 1] == '/' || argv[2][0] == '-') {
        fprintf(stderr, "error: the output prefix '%s' %s: give a path and a name, such as data/corpus\n", argv[2],
                plen == 0 ? "is empty" : argv[2][0] == '-' ? "looks like a flag" : "ends in '/' (a directory, no name)");
        return 1;
    }
    char msg[ERROR_MAX];
    TokenSet train, val;
    const char* bad = data_open(argv[1], &train, &val, msg, sizeof(msg));
    if (!bad && train.map) {
        fprintf(stderr, "error: '%s' is already a token file\n", argv[1]);
        return 1;
    }
    size_t len = strlen(argv[2]) + 16;
    char* train_path = malloc(len);
    char* val_path = malloc(len);
    snprintf(train_path, len, "%s_train.bin", argv[2]);
    snprintf(val_path, len, "%s_val.bin", argv[2]);
    if (!bad && train.count == 0) bad = "the input is empty: there is nothing to tokenize";
    // both outputs checked before either is written: never the input itself,
    // never one file written and the other refused
    PathArg input = {"the input", argv[1]};
    PathArg outputs[] = {{"the output", train_path}, {"the output", val_path}};
    if (!bad) bad = paths_check_distinct(&input, 1, outputs, 2, msg, sizeof(msg));
    for (int o = 0; o < 2 && !bad; o++) bad = paths_check_writable(&outputs[o], 0, msg, sizeof(msg));
    for (int o = 0; o < 2 && !bad; o++)  // renamed over: never a device or a pipe
        bad = paths_check_regular("the output", outputs[o].path, "give another prefix", msg, sizeof(msg));
    // both or neither: each written whole beside its place (atomic_file.h),
    // then both renamed into place, so a failed write leaves the pair that
    // was there before (removing the new train file left no train file)
    char* train_new = malloc(len + 4);
    char* val_new = malloc(len + 4);
    snprintf(train_new, len + 4, "%s.new", train_path);
    snprintf(val_new, len + 4, "%s.new", val_path);
    if (!bad) bad = data_write_tokens(train_new, train.tokens, train.count, msg, sizeof(msg));
    if (!bad && data_write_tokens(val_new, val.tokens, val.count, msg, sizeof(msg))) {
        remove(train_new);
        bad = msg;
    }
    if (!bad && (rename(train_new, train_path) != 0 || rename(val_new, val_path) != 0)) {
        snprintf(msg, sizeof(msg), "cannot rename the new token files into place ('%s', '%s')", train_path, val_path);
        remove(train_new);
        remove(val_new);
        bad = msg;
    }
    free(train_new);
    free(val_new);
    if (bad) {
        fprintf(stderr, "error: %s\n", bad);
        return 1;
    }
    printf("%s: %zu tokens\n%s: %zu tokens\n", train_path, train.count, val_path, val.count);
    free(train_path);
    free(val_path);
    data_close(&train);
    data_close(&val);
    return 0;
}
