// test_report.c: a chapter's own JSON fields (JsonBuf, common/report.h): each
// helper's exact text, the commas between fields, escaping, null for numbers
// JSON cannot hold, a buffer that grows past its first allocation, and
// report_record's lines in a log file.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "report.h"
#include "test.h"

// Compares the buffer's fields with the text they must be.
static void expect(const JsonBuf* b, const char* want, const char* name) {
    check(strcmp(json_fields(b), want) == 0, name, "got '%s', want '%s'", json_fields(b), want);
}

int main(void) {
    JsonBuf b = {0};
    expect(&b, "", "json: a zeroed JsonBuf is empty");

    json_add_int(&b, "zero", 3);
    json_add_int(&b, "big", 1LL << 40);
    expect(&b, "\"zero\":3,\"big\":1099511627776", "json: integers, a comma between fields and none before the first");

    json_clear(&b);
    json_add_double(&b, "ms", 1.23456, "%.3f");
    json_add_double(&b, "share", 0.5, "%g");
    json_add_double(&b, "nan", NAN, "%.3f");
    json_add_double(&b, "inf", INFINITY, "%g");
    expect(&b, "\"ms\":1.235,\"share\":0.5,\"nan\":null,\"inf\":null",
           "json: doubles in the given format, null for NaN and inf (after json_clear: no leading comma)");

    json_clear(&b);
    json_add_string(&b, "mode", "a \"q\" \\ b\n");
    json_add_bool(&b, "same", 1);
    json_add_bool(&b, "other", 0);
    expect(&b, "\"mode\":\"a \\\"q\\\" \\\\ b\\u000a\",\"same\":true,\"other\":false",
           "json: strings escaped (quote, backslash, control characters), booleans");

    json_clear(&b);
    int ints[3] = {1, -2, 3};
    long longs[2] = {5, 6000000000L};
    double dbl[3] = {0.25, NAN, 2.0};
    long matrix[6] = {1, 2, 3, 4, 5, 6};
    json_add_int_array(&b, "layers", ints, 3);
    json_add_int_array(&b, "none", ints, 0);
    json_add_long_array(&b, "bytes", longs, 2);
    json_add_double_array(&b, "ms", dbl, 3, "%.2f");
    json_add_long_matrix(&b, "tokens", matrix, 2, 3);
    expect(&b, "\"layers\":[1,-2,3],\"none\":[],\"bytes\":[5,6000000000],\"ms\":[0.25,null,2.00],"
               "\"tokens\":[[1,2,3],[4,5,6]]",
           "json: int, long and double arrays, an empty array, a matrix as rows");

    // growth: 300 fields (far past the first 256 bytes), each where it belongs
    json_clear(&b);
    char want[8192] = "", field[64];
    for (int i = 0; i < 300; i++) {
        char key[16];
        snprintf(key, sizeof(key), "k%d", i);
        json_add_int(&b, key, i);
        snprintf(field, sizeof(field), "%s\"k%d\":%d", i ? "," : "", i, i);
        strcat(want, field);
    }
    check(strcmp(json_fields(&b), want) == 0 && b.len == strlen(want) && strlen(want) > 256,
          "json: the buffer grows and keeps every field (300 fields)", "%zu bytes, want %zu", b.len, strlen(want));

    // report_record: a record of its own type, with fields and without,
    // one line each; no log (NULL or not opened) writes nothing
    char path[] = "/tmp/test_report_XXXXXX", msg[256];
    int fd = mkstemp(path);
    close(fd);
    JsonLog log = {0};
    check(jsonl_open(&log, path, msg, sizeof(msg)) == NULL, "json: the log opens", "%s", msg);
    json_clear(&b);
    json_add_int(&b, "saves", 2);
    json_add_bool(&b, "async", 0);
    report_record(&log, "checkpoint", &b);
    json_clear(&b);
    report_record(&log, "empty", &b);
    report_record(NULL, "nowhere", &b);
    jsonl_close(&log);
    report_record(&log, "closed", &b);
    char text[256] = "";
    FILE* f = fopen(path, "r");
    size_t n = f ? fread(text, 1, sizeof(text) - 1, f) : 0;
    text[n] = 0;
    if (f) fclose(f);
    unlink(path);
    check(strcmp(text, "{\"type\":\"checkpoint\",\"saves\":2,\"async\":false}\n{\"type\":\"empty\"}\n") == 0,
          "json: report_record writes one line per record, no comma without fields, nothing without a log", "got '%s'",
          text);

    json_free(&b);
    expect(&b, "", "json: json_free leaves an empty JsonBuf");
    return test_exit_code();
}
