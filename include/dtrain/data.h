/*
 * dtrain/data.h — tokenizers, the .tok token file, and the data loader.
 *
 * Overview
 * --------
 * Text becomes training windows in three steps:
 *
 *   1. A tokenizer maps bytes to token ids. Three kinds: `byte` (V = 256,
 *      id = byte value; any file round-trips), `char` (the distinct byte
 *      values of the corpus, sorted; a smaller V for small character-level
 *      models), and `bpe`, byte-level BPE as GPT-2 defines it (dt_bpe,
 *      below: GPT-2's own 50257 tokens, or a vocabulary learned from a
 *      corpus). The vocabulary travels with the data (in the .tok file: the
 *      byte table, or the BPE's hash) and with a run (in its checkpoint).
 *   2. A token file holds the tokenizer and the tokens. `dt_data_prepare`
 *      writes one to disk (atomically: temp file, fsync, rename) and
 *      `dt_token_file_open` maps it read-only and validates all of it before
 *      returning: magic, version, sizes, checksum (XXH3-64) and every token
 *      against the vocabulary. A .txt file can be opened directly; it is
 *      tokenized in memory into the same validated structure.
 *   3. A loader cuts a token range (the training part, or the validation
 *      part) into windows of T+1 tokens and hands out batches of B windows
 *      per rank, shuffled per epoch.
 *
 * The .tok format, versions 1 and 2 (little-endian)
 * -------------------------------------------------
 *     offset  size  field
 *          0     8  magic "DTTOKENS"
 *          8     4  version (1: byte and char; 2: bpe)
 *         12     4  tokenizer kind: 1 = byte, 2 = char, 3 = bpe (version 2)
 *         16     4  vocabulary size V: 1..256, for bpe 257..65536
 *         20     4  bytes per token (2: unsigned 16-bit tokens)
 *         24     8  token count N >= 1
 *         32     8  bpe: dt_bpe_hash of its tokenizer; byte and char: zero
 *         40    24  reserved, zero
 *         64     V  byte and char: the byte value of each token id, then
 *                   zero padding to a multiple of 8 (bpe: nothing)
 *          .    2N  tokens, then zero padding to a multiple of 8
 *          .     8  XXH3-64 (seed 0) of every byte before it
 * The file size is therefore fixed by the header, and a truncated file or one
 * with trailing bytes is refused before anything is read from its body.
 *
 * Windows, batches and ranks
 * --------------------------
 * A range [begin, end) of L tokens holds W = (L - 1) / T windows; window w
 * starts at begin + w*T and covers T+1 tokens (inputs are its first T,
 * targets its last T; consecutive windows share one token). Each epoch e
 * shuffles the W windows with a Fisher-Yates permutation drawn from dt_rng
 * keyed by (seed, stream (rank 0, step e, DT_RNG_DATA)) — the same on every
 * rank. Global step s of the epoch takes permutation entries
 * [s*world*B, (s+1)*world*B): the global batch, in that order. Rank r takes
 * its rows [r*B, (r+1)*B). Hence N ranks with batch B see exactly the windows
 * that 1 rank with batch N*B sees, rank r holding rows r*B .. r*B+B-1 of the
 * single-rank batch. An epoch has floor(W / (world*B)) steps; the windows
 * left over at the end of a permutation are skipped in that epoch (a
 * different few each epoch). The loader's position is (epoch, step).
 *
 * Example
 * -------
 *     dt_token_file *f;
 *     DT_CHECK(dt_data_open(&f, "input.txt", DT_TOKENIZER_CHAR, NULL));
 *     size_t n = dt_token_file_count(f), split;
 *     DT_CHECK(dt_data_split(n, 0.05, &split));          // last 5% validate
 *     dt_loader *train;
 *     DT_CHECK(dt_loader_create(&train, f, 0, split, B, T, seed, rank, world));
 *     DT_CHECK(dt_loader_next(train, inputs, targets)); // (B,T) each
 */
#ifndef DTRAIN_DATA_H
#define DTRAIN_DATA_H

#include "dtrain/core.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------ */
/* Tokenizers                                                               */
/* ------------------------------------------------------------------------ */

typedef enum dt_tokenizer_kind {
    DT_TOKENIZER_BYTE, /* V = 256, id = byte value */
    DT_TOKENIZER_CHAR, /* the corpus's distinct byte values, sorted */
    DT_TOKENIZER_BPE,  /* byte-level BPE (dt_bpe): GPT-2's, or learned */
    DT_TOKENIZER_COUNT
} dt_tokenizer_kind;

/* "byte", "char", "bpe" (indexable by dt_tokenizer_kind). */
extern const char *const dt_tokenizer_names[DT_TOKENIZER_COUNT];

typedef struct dt_bpe dt_bpe;

/* A tokenizer is a plain value: copy it, compare it, store its table. A
 * bpe tokenizer holds its dt_bpe by a borrowed pointer (NULL when only
 * its hash is known, as in a .tok file read without the BPE's files). */
typedef struct dt_tokenizer {
    dt_tokenizer_kind kind;
    int vocab_size;          /* number of token ids: 1..256, bpe up to 65536 */
    uint8_t id_to_byte[256]; /* byte value of each id; entries >= vocab_size are 0 */
    int16_t byte_to_id[256]; /* id of each byte value, or -1 if it has none */
    dt_bpe *bpe;             /* bpe: the tokenizer (borrowed), or NULL */
    uint64_t bpe_hash;       /* bpe: dt_bpe_hash, its identity */
} dt_tokenizer;

/* The byte tokenizer (V = 256). */
void dt_tokenizer_init_byte(dt_tokenizer *t);
/* The char tokenizer of a corpus: its distinct byte values, sorted.
 * DT_ERR_INVALID for an empty corpus. */
dt_status dt_tokenizer_init_char(dt_tokenizer *t, const void *text, size_t len);
/* Rebuild a tokenizer from a stored table (a file or a checkpoint): byte
 * tables must be the identity on 256 values, char tables strictly
 * increasing. DT_ERR_CORRUPT names the problem otherwise. */
dt_status dt_tokenizer_init_table(dt_tokenizer *t, dt_tokenizer_kind kind, const uint8_t *table,
                                  int vocab_size);
/* The bpe tokenizer of b (borrowed: b must outlive every copy). */
void dt_tokenizer_init_bpe(dt_tokenizer *t, dt_bpe *b);
/* Same kind and same vocabulary (bpe: the same hash). */
bool dt_tokenizer_equal(const dt_tokenizer *a, const dt_tokenizer *b);
/* The bytes of token `id` (*len of them), or NULL for an id outside the
 * vocabulary or a bpe tokenizer without its dt_bpe. */
const uint8_t *dt_tokenizer_token(const dt_tokenizer *t, int32_t id, size_t *len);
/* Any kind: encode text into *ids (grown with realloc; the caller frees),
 * *n ids. char: DT_ERR_INVALID for a byte outside the vocabulary; bpe
 * without its dt_bpe: DT_ERR_UNSUPPORTED. */
dt_status dt_tokenizer_encode_any(const dt_tokenizer *t, const void *text, size_t len,
                                  int32_t **ids, size_t *n);
/* out[i] = id of text[i] (out holds len ids). DT_ERR_INVALID names the first
 * byte that has no id (possible only with a char tokenizer) and its offset. */
dt_status dt_tokenizer_encode(const dt_tokenizer *t, const void *text, size_t len, int32_t *out);
/* out[i] = byte of ids[i] (out holds n bytes, no terminating NUL).
 * DT_ERR_INVALID names the first id outside [0, V). */
dt_status dt_tokenizer_decode(const dt_tokenizer *t, const int32_t *ids, size_t n, char *out);

/* ------------------------------------------------------------------------ */
/* Byte-level BPE (GPT-2)                                                   */
/* ------------------------------------------------------------------------ */
/*
 * GPT-2's tokenizer: text is cut into pieces by GPT-2's pattern ('s, 't,
 * letters, numbers, other symbols, each with an optional leading space;
 * runs of whitespace), and each piece's bytes are merged pairwise, lowest
 * rank first, as tiktoken does; the result is the same token for token as
 * js-tiktoken's "gpt2" encoding (tested on whole corpora). The vocabulary
 * comes in GPT-2's two files, encoder.json (token -> id) and vocab.bpe (the
 * merges in order); scripts/get-gpt2-tokenizer.sh fetches GPT-2's into
 * dt_bpe_dir(). dt_bpe_train learns a new vocabulary in the same format.
 * Encoding keeps a cache of pieces, so a dt_bpe is not thread-safe.
 */

/* Load encoder.json and vocab.bpe; `name` (may be NULL) labels it. */
dt_status dt_bpe_load(dt_bpe **out, const char *encoder_json, const char *vocab_bpe,
                      const char *name);
/* "gpt2": GPT-2's files from dt_bpe_dir(); anything else: a folder holding
 * encoder.json and vocab.bpe. DT_ERR_NOT_FOUND says how to fetch them. */
dt_status dt_bpe_open(dt_bpe **out, const char *spec);
/* Where GPT-2's files are kept: DT_TOKENIZER_DIR, else
 * $XDG_CACHE_HOME/dtrain/gpt2, else ~/.cache/dtrain/gpt2. */
dt_status dt_bpe_dir(char *out, size_t len);
void dt_bpe_destroy(dt_bpe *b);
int dt_bpe_vocab_size(const dt_bpe *b);
/* XXH3 of the tokens in id order: equal hashes, equal tokenizers. */
uint64_t dt_bpe_hash(const dt_bpe *b);
const char *dt_bpe_name(const dt_bpe *b); /* "gpt2", a folder, or "learned" */
/* Encode len bytes into *ids (grown with realloc, the caller frees; *ids
 * may be NULL), *n ids. */
dt_status dt_bpe_encode(dt_bpe *b, const void *text, size_t len, int32_t **ids, size_t *n);
/* The bytes of token id (*len), or NULL outside [0, V). */
const uint8_t *dt_bpe_token(const dt_bpe *b, int32_t id, size_t *len);
/* The length of the pre-tokenisation piece that starts at text[at]. */
size_t dt_bpe_split(const void *text, size_t len, size_t at);
/* Learn a vocabulary of vocab_size tokens (the 256 bytes, vocab_size - 257
 * merges of the most frequent adjacent pair within pieces, ties to the
 * smaller ids, and <|endoftext|>) from a corpus. Fewer merges when no pair
 * occurs twice any more. */
dt_status dt_bpe_train(dt_bpe **out, const void *text, size_t len, int vocab_size);
/* Write dir/encoder.json and dir/vocab.bpe in GPT-2's format. */
dt_status dt_bpe_save(const dt_bpe *b, const char *dir);

/* ------------------------------------------------------------------------ */
/* Token files                                                              */
/* ------------------------------------------------------------------------ */

typedef struct dt_token_file dt_token_file;

#define DT_TOKEN_FILE_VERSION 2 /* written for bpe; byte and char files stay version 1 */

/* Tokenize a text file and write a .tok file atomically: the data goes to a
 * temporary file in the same directory, is fsync'ed and renamed over `out`,
 * then the directory is fsync'ed. A failure (missing or empty input, full
 * disk) leaves no partial `out` and no temporary file. */
dt_status dt_data_prepare(const char *in_txt, const char *out_tok, dt_tokenizer_kind kind);
/* The same with a given tokenizer (a bpe one, or a table to share). */
dt_status dt_data_prepare_with(const char *in_txt, const char *out_tok, const dt_tokenizer *tok);

/* Map a .tok file and validate all of it (see the format above). Every
 * problem is DT_ERR_CORRUPT with the file name and what is wrong, except a
 * missing file (DT_ERR_NOT_FOUND) and other I/O errors (DT_ERR_IO). */
dt_status dt_token_file_open(dt_token_file **out, const char *path);

/* Read a text file and tokenize it in memory. With `vocab` NULL the
 * tokenizer is built from the text by `kind` (byte or char); with a
 * tokenizer (the training data's for a validation file, or a bpe one),
 * `kind` is ignored and the text is encoded with it: a byte a char
 * vocabulary lacks is DT_ERR_INVALID. An empty file is DT_ERR_INVALID. */
dt_status dt_token_file_from_text(dt_token_file **out, const char *path, dt_tokenizer_kind kind,
                                  const dt_tokenizer *vocab);

/* Open `path` by its name: "*.tok" with dt_token_file_open, anything else as
 * text with dt_token_file_from_text. If `vocab` is given, a .tok file must
 * carry the same vocabulary (else DT_ERR_MISMATCH naming both sizes). */
dt_status dt_data_open(dt_token_file **out, const char *path, dt_tokenizer_kind kind,
                       const dt_tokenizer *vocab);

void dt_token_file_close(dt_token_file *f);

const dt_tokenizer *dt_token_file_tokenizer(const dt_token_file *f);
size_t dt_token_file_count(const dt_token_file *f);
const uint16_t *dt_token_file_tokens(const dt_token_file *f); /* (count) */
/* The stored (for text: computed) XXH3-64 of the file image. */
uint64_t dt_token_file_checksum(const dt_token_file *f);
/* Bytes of the file image (on disk for .tok, in memory for text). */
size_t dt_token_file_bytes(const dt_token_file *f);
const char *dt_token_file_path(const dt_token_file *f);

/* The train/validation split used by --val-split: the last
 * floor(count * val_fraction) tokens validate, the rest train:
 * train = [0, *train_end), val = [*train_end, count). val_fraction must be
 * in [0, 1). */
dt_status dt_data_split(size_t count, double val_fraction, size_t *train_end);

/* ------------------------------------------------------------------------ */
/* Loader                                                                   */
/* ------------------------------------------------------------------------ */

typedef struct dt_loader dt_loader;

/* A loader's position: the epoch and the step within it (the next batch to
 * hand out is step `step` of epoch `epoch`). */
typedef struct dt_loader_state {
    uint64_t epoch;
    uint64_t step;
} dt_loader_state;

/* A loader over tokens [begin, end) of `f` (borrowed: f must outlive the
 * loader) for rank `rank` of `world`, with per-rank batch B and sequence
 * length T. Fails with DT_ERR_INVALID naming the value when a size is not
 * positive, the range is outside the file or shorter than one window of T+1
 * tokens, or it holds fewer windows than one global batch (world*B). */
dt_status dt_loader_create(dt_loader **out, const dt_token_file *f, size_t begin, size_t end, int B,
                           int T, uint64_t seed, int rank, int world);
void dt_loader_destroy(dt_loader *l);

/* Fill this rank's next batch and advance (moving to the next epoch after
 * its last step): inputs (B,T) and targets (B,T), targets shifted by one. */
dt_status dt_loader_next(dt_loader *l, int32_t *inputs, int32_t *targets);

dt_loader_state dt_loader_get_state(const dt_loader *l);
/* Continue from a saved position (same file range, B, T, seed and world
 * size). DT_ERR_INVALID if step >= steps per epoch. */
dt_status dt_loader_set_state(dt_loader *l, dt_loader_state s);

size_t dt_loader_windows(const dt_loader *l);           /* W */
uint64_t dt_loader_steps_per_epoch(const dt_loader *l); /* floor(W / (world*B)) */
/* The windows (0..W-1) of the batch dt_loader_next hands out next, B of
 * them, in order: for accounting of which samples a run used (tests). */
void dt_loader_peek(const dt_loader *l, uint32_t *windows);

#ifdef __cplusplus
}
#endif
#endif /* DTRAIN_DATA_H */
