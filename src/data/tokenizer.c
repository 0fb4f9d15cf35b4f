/*
 * tokenizer.c — the byte and char tokenizers.
 *
 * Both map one byte to one token, so a tokenizer is two small tables:
 * id -> byte and byte -> id (-1 where a byte has no id). The byte tokenizer
 * is the identity on 256 values; the char tokenizer holds the distinct byte
 * values of its corpus in increasing order, so the same corpus always gives
 * the same ids. Invariant: for every id < vocab_size,
 * byte_to_id[id_to_byte[id]] == id.
 */
#include "dtrain/data.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>

const char *const dt_tokenizer_names[DT_TOKENIZER_COUNT] = {
    [DT_TOKENIZER_BYTE] = "byte",
    [DT_TOKENIZER_CHAR] = "char",
    [DT_TOKENIZER_BPE] = "bpe",
};
_Static_assert(sizeof dt_tokenizer_names / sizeof dt_tokenizer_names[0] == DT_TOKENIZER_COUNT,
               "one name per tokenizer kind");

static void build_from_present(dt_tokenizer *t, dt_tokenizer_kind kind, const bool present[256]) {
    memset(t, 0, sizeof *t);
    t->kind = kind;
    for (int b = 0; b < 256; b++)
        t->byte_to_id[b] = -1;
    int v = 0;
    for (int b = 0; b < 256; b++) {
        if (present[b]) {
            t->id_to_byte[v] = (uint8_t)b;
            t->byte_to_id[b] = (int16_t)v;
            v++;
        }
    }
    t->vocab_size = v;
}

void dt_tokenizer_init_byte(dt_tokenizer *t) {
    bool all[256];
    for (int b = 0; b < 256; b++)
        all[b] = true;
    build_from_present(t, DT_TOKENIZER_BYTE, all);
}

dt_status dt_tokenizer_init_char(dt_tokenizer *t, const void *text, size_t len) {
    if (len == 0)
        return dt_error_set(DT_ERR_INVALID, "char tokenizer: the corpus is empty");
    bool present[256] = {false};
    const uint8_t *s = text;
    for (size_t i = 0; i < len; i++)
        present[s[i]] = true;
    build_from_present(t, DT_TOKENIZER_CHAR, present);
    return DT_OK;
}

dt_status dt_tokenizer_init_table(dt_tokenizer *t, dt_tokenizer_kind kind, const uint8_t *table,
                                  int vocab_size) {
    if ((unsigned)kind >= DT_TOKENIZER_COUNT)
        return dt_error_set(DT_ERR_CORRUPT, "unknown tokenizer kind %d", (int)kind);
    if (vocab_size < 1 || vocab_size > 256)
        return dt_error_set(DT_ERR_CORRUPT, "vocabulary size %d is outside 1..256", vocab_size);
    if (kind == DT_TOKENIZER_BYTE && vocab_size != 256)
        return dt_error_set(DT_ERR_CORRUPT, "byte tokenizer with vocabulary size %d (must be 256)",
                            vocab_size);
    bool present[256] = {false};
    for (int i = 0; i < vocab_size; i++) {
        if (i > 0 && table[i] <= table[i - 1])
            return dt_error_set(DT_ERR_CORRUPT,
                                "vocabulary table is not strictly increasing at id %d "
                                "(0x%02x after 0x%02x)",
                                i, table[i], table[i - 1]);
        present[table[i]] = true;
    }
    build_from_present(t, kind, present);
    return DT_OK;
}

void dt_tokenizer_init_bpe(dt_tokenizer *t, dt_bpe *b) {
    memset(t, 0, sizeof *t);
    t->kind = DT_TOKENIZER_BPE;
    t->vocab_size = dt_bpe_vocab_size(b);
    for (int c = 0; c < 256; c++)
        t->byte_to_id[c] = -1;
    t->bpe = b;
    t->bpe_hash = dt_bpe_hash(b);
}

bool dt_tokenizer_equal(const dt_tokenizer *a, const dt_tokenizer *b) {
    if (a->kind == DT_TOKENIZER_BPE || b->kind == DT_TOKENIZER_BPE)
        return a->kind == b->kind && a->vocab_size == b->vocab_size && a->bpe_hash == b->bpe_hash;
    return a->kind == b->kind && a->vocab_size == b->vocab_size &&
           memcmp(a->id_to_byte, b->id_to_byte, (size_t)a->vocab_size) == 0;
}

const uint8_t *dt_tokenizer_token(const dt_tokenizer *t, int32_t id, size_t *len) {
    if (id < 0 || id >= t->vocab_size)
        return NULL;
    if (t->kind == DT_TOKENIZER_BPE)
        return t->bpe ? dt_bpe_token(t->bpe, id, len) : NULL;
    *len = 1;
    return &t->id_to_byte[id];
}

dt_status dt_tokenizer_encode_any(const dt_tokenizer *t, const void *text, size_t len,
                                  int32_t **ids, size_t *n) {
    if (t->kind == DT_TOKENIZER_BPE) {
        if (!t->bpe)
            return dt_error_set(DT_ERR_UNSUPPORTED,
                                "this BPE tokenizer is known only by its hash: load its files");
        return dt_bpe_encode(t->bpe, text, len, ids, n);
    }
    int32_t *g = realloc(*ids, (len ? len : 1) * sizeof *g);
    if (!g)
        return dt_error_set(DT_ERR_NOMEM, "%zu token ids", len);
    *ids = g;
    *n = len;
    return dt_tokenizer_encode(t, text, len, g);
}

dt_status dt_tokenizer_encode(const dt_tokenizer *t, const void *text, size_t len, int32_t *out) {
    const uint8_t *s = text;
    for (size_t i = 0; i < len; i++) {
        int id = t->byte_to_id[s[i]];
        if (id < 0)
            return dt_error_set(DT_ERR_INVALID,
                                "byte 0x%02x ('%c') at offset %zu is not in the %s vocabulary "
                                "(V = %d)",
                                s[i], isprint(s[i]) ? s[i] : '?', i, dt_tokenizer_names[t->kind],
                                t->vocab_size);
        out[i] = id;
    }
    return DT_OK;
}

dt_status dt_tokenizer_decode(const dt_tokenizer *t, const int32_t *ids, size_t n, char *out) {
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= t->vocab_size)
            return dt_error_set(DT_ERR_INVALID, "token id %d at index %zu is outside [0, %d)",
                                (int)ids[i], i, t->vocab_size);
        out[i] = (char)t->id_to_byte[ids[i]];
    }
    return DT_OK;
}
