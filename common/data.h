// data.h: tokens, token files and batches.
//
// Tokenizer: byte-level, one token per byte (vocab 256). Token files are
// llm.c's: 256 int32 header (magic 20240520, version 1, count) then count
// uint16 tokens; a GPT-2-token file made by llm.c's scripts loads too.
//
// Batches are deterministic and independent of the world size: sequence b of
// step s starts at token (s*B + b)*T, as in llm.c's unshuffled loader, and the
// loader goes back to the start when a whole batch no longer fits (llm.c
// resets the same way). A rank reads only the sequences it asks for.
#ifndef DATA_H
#define DATA_H

#include <stddef.h>
#include <stdint.h>

#define DEFAULT_CORPUS_DIR "/usr/share/games/fortunes"

typedef struct {
    const uint16_t* tokens;  // count tokens (mapped from a file, or owned)
    size_t count;
    int max_token;           // the largest token id present
    void* map;               // the mmap of a token file, or NULL
    size_t map_bytes;
    uint16_t* owned;         // tokens converted from text, or NULL
} TokenSet;

// Opens FILE: a token file is used whole as the training set (val stays empty);
// a text file is tokenized byte-level and split: first 90% train, last 10% val.
// path NULL means the default corpus, the text files of Debian's `fortunes`
// package in DEFAULT_CORPUS_DIR, concatenated in name order.
// Returns NULL or a message naming the problem and the fix.
const char* data_open(const char* path, TokenSet* train, TokenSet* val, char* msg, size_t msg_len);
// Opens a token file (the validation set given with --val).
const char* data_open_tokens(const char* path, TokenSet* set, char* msg, size_t msg_len);
void data_close(TokenSet* set);

// Byte-level tokenizer on a text buffer: tokens[i] = (unsigned char)text[i].
void tokenize_bytes(const char* text, size_t len, uint16_t* tokens);
// Writes a token file atomically (temporary file, then rename).
const char* data_write_tokens(const char* path, const uint16_t* tokens, size_t count, char* msg,
                              size_t msg_len);

// Whole batches of B sequences of T+1 tokens that fit in the set (0: too small).
size_t data_batches_per_epoch(const TokenSet* set, int B, int T);
// Fills sequences [b0, b0 + nb) of the global batch of step `step` (B sequences
// of T tokens): inputs and targets are (nb, T), targets shifted by one.
void data_batch(const TokenSet* set, long step, int B, int T, int b0, int nb, int* inputs,
                int* targets);

#endif
