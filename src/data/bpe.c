/*
 * bpe.c — byte-level BPE as GPT-2 defines it: the pre-tokenisation
 * pattern, the rank-ordered merges, GPT-2's two files (encoder.json,
 * vocab.bpe), and learning a new vocabulary from a corpus (dtrain/data.h).
 *
 * Encoding, as OpenAI's tiktoken (and js-tiktoken, the reference the tests
 * compare with token for token) does it:
 *
 *   1. Split the text into pieces with GPT-2's pattern
 *        's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 *      matched left to right, the first alternative that matches winning
 *      (split_piece below walks it by hand; \p{L}, \p{N} and ECMAScript's \s
 *      come from unicode_tables.h).
 *   2. Each piece starts as its bytes; repeatedly merge the adjacent pair
 *      whose concatenation has the lowest rank (a token's rank is its id:
 *      merge k of vocab.bpe makes token 256 + k), until no pair is a token.
 *   3. A piece seen before is taken from a cache (most words repeat).
 *
 * Tokens are byte strings. encoder.json spells them with GPT-2's
 * byte-to-unicode map (printable bytes stand for themselves, the others
 * are shifted to U+0100 and up), which the loader undoes. Ids at or above
 * 256 + merges (GPT-2's <|endoftext|>) are special: decodable, never
 * produced by encoding.
 *
 * Input that is not UTF-8: an invalid byte is a character of its own,
 * neither letter, number nor space (node would see U+FFFD instead; only
 * valid UTF-8 is compared).
 */
#include "dtrain/data.h"
#include "unicode_tables.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* ------------------------------------------------------------------------ */
/* Character classes                                                        */
/* ------------------------------------------------------------------------ */

enum { CLS_OTHER, CLS_LETTER, CLS_NUMBER, CLS_SPACE };

static bool in_ranges(const uint32_t (*r)[2], size_t n, uint32_t cp) {
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (cp < r[mid][0])
            hi = mid;
        else if (cp > r[mid][1])
            lo = mid + 1;
        else
            return true;
    }
    return false;
}

#define NRANGES(t) (sizeof t / sizeof t[0])

static uint8_t ascii_class[128];

static void init_ascii(void) {
    for (uint32_t c = 0; c < 128; c++)
        ascii_class[c] = in_ranges(dt__uni_letter, NRANGES(dt__uni_letter), c)   ? CLS_LETTER
                         : in_ranges(dt__uni_number, NRANGES(dt__uni_number), c) ? CLS_NUMBER
                         : in_ranges(dt__uni_space, NRANGES(dt__uni_space), c)   ? CLS_SPACE
                                                                                 : CLS_OTHER;
}

static int class_of(uint32_t cp) {
    if (cp < 128)
        return ascii_class[cp];
    if (in_ranges(dt__uni_letter, NRANGES(dt__uni_letter), cp))
        return CLS_LETTER;
    if (in_ranges(dt__uni_number, NRANGES(dt__uni_number), cp))
        return CLS_NUMBER;
    if (in_ranges(dt__uni_space, NRANGES(dt__uni_space), cp))
        return CLS_SPACE;
    return CLS_OTHER;
}

/* Decode the character at s[i] (n bytes left): its length and class. An
 * invalid or truncated sequence is one byte of class other. */
static int char_at(const uint8_t *s, size_t n, size_t i, int *cls) {
    uint8_t c = s[i];
    if (c < 0x80) {
        *cls = ascii_class[c];
        return 1;
    }
    int len = (c & 0xe0) == 0xc0 ? 2 : (c & 0xf0) == 0xe0 ? 3 : (c & 0xf8) == 0xf0 ? 4 : 0;
    uint32_t min = len == 2 ? 0x80 : len == 3 ? 0x800 : 0x10000;
    uint32_t cp = len == 2 ? c & 0x1fu : len == 3 ? c & 0x0fu : c & 0x07u;
    if (len == 0 || i + (size_t)len > n) {
        *cls = CLS_OTHER;
        return 1;
    }
    for (int k = 1; k < len; k++) {
        if ((s[i + (size_t)k] & 0xc0) != 0x80) {
            *cls = CLS_OTHER;
            return 1;
        }
        cp = cp << 6 | (s[i + (size_t)k] & 0x3fu);
    }
    if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) {
        *cls = CLS_OTHER;
        return 1;
    }
    *cls = class_of(cp);
    return len;
}

/* The end of the run of class `cls` starting at i. */
static size_t run_end(const uint8_t *s, size_t n, size_t i, int cls) {
    while (i < n) {
        int c, l = char_at(s, n, i, &c);
        if (c != cls)
            break;
        i += (size_t)l;
    }
    return i;
}

/* The length of the piece of GPT-2's pattern that starts at s[i]. */
static size_t split_piece(const uint8_t *s, size_t n, size_t i) {
    if (s[i] == '\'' && i + 1 < n) { /* 's|'t|'re|'ve|'m|'ll|'d */
        uint8_t a = s[i + 1], b = i + 2 < n ? s[i + 2] : 0;
        if (a == 's' || a == 't' || a == 'm' || a == 'd')
            return 2;
        if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l'))
            return 3;
    }
    int c0, l0 = char_at(s, n, i, &c0);
    /* ` ?\p{L}+`, ` ?\p{N}+`, ` ?[^\s\p{L}\p{N}]+`: an optional U+0020
     * before a run of one class. */
    size_t at = i;
    int cls = c0;
    if (s[i] == ' ' && i + 1 < n) {
        int c1;
        char_at(s, n, i + 1, &c1);
        if (c1 != CLS_SPACE) {
            at = i + 1;
            cls = c1;
        }
    }
    if (cls != CLS_SPACE)
        return run_end(s, n, at, cls) - i;
    /* `\s+(?!\S)`, else `\s+`: a run of spaces before a non-space gives up
     * its last character (which then leads the next piece), unless it has
     * only one. */
    size_t end = run_end(s, n, i, CLS_SPACE);
    if (end == n)
        return end - i;
    size_t last = end - 1; /* the start of the run's last character */
    while (last > i && (s[last] & 0xc0) == 0x80)
        last--;
    (void)l0;
    return last > i ? last - i : end - i;
}

/* ------------------------------------------------------------------------ */
/* Hash tables                                                              */
/* ------------------------------------------------------------------------ */

/* Byte string -> rank (token id), open addressing; the key bytes live in
 * the tokenizer's blob. */
typedef struct rank_slot {
    uint32_t off, len; /* key in blob; len 0: empty */
    int32_t id;
} rank_slot;

/* Piece -> its token ids, cached; the ids live in cache_ids. */
typedef struct cache_slot {
    uint64_t hash;
    uint32_t key_off, key_len; /* in cache_keys; key_len 0: empty */
    uint32_t ids_off, ids_len; /* in cache_ids */
} cache_slot;

struct dt_bpe {
    int vocab;                   /* tokens, specials included */
    int mergeable;               /* 256 + merges: ids below it can result from encoding */
    uint8_t *blob;               /* every token's bytes */
    uint32_t *tok_off, *tok_len; /* (vocab) each token in blob */
    rank_slot *ranks;            /* (nranks) power of two */
    size_t nranks;
    uint64_t hash;  /* XXH3 of the tokens, in id order: the tokenizer's identity */
    int32_t *left;  /* (vocab) a learned merge's left token, or NULL (loaded) */
    char name[512]; /* "gpt2" or the folder it was read from */
    /* The piece cache: cleared when full. */
    cache_slot *cache;
    size_t ncache, cache_used;
    uint8_t *cache_keys;
    size_t keys_len, keys_cap;
    int32_t *cache_ids;
    size_t ids_len, ids_cap;
    /* Scratch of one piece's merge. */
    size_t *parts;
    uint32_t *part_rank;
    size_t scratch_cap;
};

#define CACHE_SLOTS (1u << 16)

static uint64_t hash_bytes(const uint8_t *s, size_t n) { return dt_hash64(s, n, 0); }

static int32_t rank_of(const dt_bpe *b, const uint8_t *s, size_t n) {
    size_t mask = b->nranks - 1, h = (size_t)hash_bytes(s, n) & mask;
    for (;;) {
        const rank_slot *r = &b->ranks[h];
        if (r->len == 0)
            return -1;
        if (r->len == n && memcmp(b->blob + r->off, s, n) == 0)
            return r->id;
        h = (h + 1) & mask;
    }
}

static void rank_put(dt_bpe *b, int32_t id) {
    size_t mask = b->nranks - 1;
    size_t h = (size_t)hash_bytes(b->blob + b->tok_off[id], b->tok_len[id]) & mask;
    while (b->ranks[h].len != 0)
        h = (h + 1) & mask;
    b->ranks[h] = (rank_slot){b->tok_off[id], b->tok_len[id], id};
}

/* ------------------------------------------------------------------------ */
/* Building a tokenizer from its tokens                                     */
/* ------------------------------------------------------------------------ */

void dt_bpe_destroy(dt_bpe *b) {
    if (!b)
        return;
    free(b->blob);
    free(b->tok_off);
    free(b->tok_len);
    free(b->ranks);
    free(b->cache);
    free(b->cache_keys);
    free(b->cache_ids);
    free(b->parts);
    free(b->part_rank);
    free(b->left);
    free(b);
}

/* A tokenizer of `vocab` tokens, the bytes of token i being
 * blob[off[i], off[i] + len[i]) (the arrays are taken over); ids below
 * `mergeable` are ranked. Single bytes must all be tokens. */
static dt_status build(dt_bpe **out, int vocab, int mergeable, uint8_t *blob, uint32_t *off,
                       uint32_t *len, int32_t *left, const char *name) {
    dt_bpe *b = calloc(1, sizeof *b);
    if (!b) {
        free(blob);
        free(off);
        free(len);
        free(left);
        return DT_ERR_NOMEM;
    }
    b->left = left;
    if (!ascii_class['A'])
        init_ascii();
    b->vocab = vocab;
    b->mergeable = mergeable;
    b->blob = blob;
    b->tok_off = off;
    b->tok_len = len;
    snprintf(b->name, sizeof b->name, "%s", name);
    b->nranks = 1;
    while (b->nranks < 2 * (size_t)vocab)
        b->nranks *= 2;
    b->ranks = calloc(b->nranks, sizeof *b->ranks);
    b->cache = calloc(CACHE_SLOTS, sizeof *b->cache);
    b->ncache = CACHE_SLOTS;
    if (!b->ranks || !b->cache) {
        dt_bpe_destroy(b);
        return DT_ERR_NOMEM;
    }
    dt_hasher *hs;
    if (dt_hasher_create(&hs, 0) != DT_OK) {
        dt_bpe_destroy(b);
        return DT_ERR_NOMEM;
    }
    for (int i = 0; i < vocab; i++) {
        dt_hasher_update(hs, &len[i], sizeof len[i]);
        dt_hasher_update(hs, blob + off[i], len[i]);
        if (len[i] == 0) {
            dt_hasher_destroy(hs);
            dt_bpe_destroy(b);
            return dt_error_set(DT_ERR_CORRUPT, "%s: token %d is empty", name, i);
        }
        if (i < mergeable) {
            if (rank_of(b, blob + off[i], len[i]) >= 0) {
                dt_hasher_destroy(hs);
                dt_bpe_destroy(b);
                return dt_error_set(DT_ERR_CORRUPT, "%s: token %d repeats an earlier token", name,
                                    i);
            }
            rank_put(b, i);
        }
    }
    b->hash = dt_hasher_final(hs);
    dt_hasher_destroy(hs);
    for (int c = 0; c < 256; c++) {
        uint8_t byte = (uint8_t)c;
        if (rank_of(b, &byte, 1) < 0) {
            dt_bpe_destroy(b);
            return dt_error_set(DT_ERR_CORRUPT, "%s: byte 0x%02x is not a token", name, c);
        }
    }
    *out = b;
    return DT_OK;
}

/* GPT-2's bytes_to_unicode: printable bytes ('!'..'~', 0xA1..0xAC,
 * 0xAE..0xFF) stand for themselves, the 68 others for U+0100 onwards in
 * byte order. unicode_of[b] is b's code point; byte_of_cp the inverse. */
static void byte_map(uint32_t unicode_of[256]) {
    int next = 0;
    for (int c = 0; c < 256; c++) {
        bool printable = (c >= '!' && c <= '~') || (c >= 0xa1 && c <= 0xac) || c >= 0xae;
        unicode_of[c] = printable ? (uint32_t)c : 256u + (uint32_t)next++;
    }
}

/* Undo byte_map on a UTF-8 key: its bytes into out (at most n). Returns
 * the length, or -1 if a character is not one of the 256. */
static long unmap(const char *key, uint8_t *out, size_t cap) {
    static int16_t byte_of_cp[512];
    static bool ready;
    if (!ready) {
        uint32_t u[256];
        byte_map(u);
        for (int i = 0; i < 512; i++)
            byte_of_cp[i] = -1;
        for (int c = 0; c < 256; c++)
            byte_of_cp[u[c]] = (int16_t)c;
        ready = true;
    }
    size_t n = 0;
    const uint8_t *s = (const uint8_t *)key;
    for (size_t i = 0; s[i];) {
        uint32_t cp;
        if (s[i] < 0x80) {
            cp = s[i++];
        } else if ((s[i] & 0xe0) == 0xc0 && (s[i + 1] & 0xc0) == 0x80) {
            cp = (uint32_t)(s[i] & 0x1f) << 6 | (s[i + 1] & 0x3f);
            i += 2;
        } else {
            return -1;
        }
        if (cp >= 512 || byte_of_cp[cp] < 0 || n >= cap)
            return -1;
        out[n++] = (uint8_t)byte_of_cp[cp];
    }
    return (long)n;
}

static dt_status read_text(const char *path, char **out, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f)
        return dt_error_set_errno(errno == ENOENT ? DT_ERR_NOT_FOUND : DT_ERR_IO, "cannot open %s",
                                  path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (!s || fread(s, 1, (size_t)n, f) != (size_t)n) {
        free(s);
        fclose(f);
        return dt_error_set(DT_ERR_IO, "cannot read %s", path);
    }
    s[n] = '\0';
    fclose(f);
    *out = s;
    *len = (size_t)n;
    return DT_OK;
}

dt_status dt_bpe_load(dt_bpe **out, const char *encoder_json, const char *vocab_bpe,
                      const char *name) {
    *out = NULL;
    json_error_t je;
    json_t *enc = json_load_file(encoder_json, JSON_REJECT_DUPLICATES, &je);
    if (!enc)
        return dt_error_set(json_error_code(&je) == json_error_cannot_open_file ? DT_ERR_NOT_FOUND
                                                                                : DT_ERR_CORRUPT,
                            "%s: %s", encoder_json, je.text);
    if (!json_is_object(enc) || json_object_size(enc) < 256 || json_object_size(enc) > 65536) {
        json_decref(enc);
        return dt_error_set(DT_ERR_CORRUPT, "%s: expected an object of 256 to 65536 tokens",
                            encoder_json);
    }
    /* The merges only count (their tokens are encoder.json's): merge k is
     * token 256 + k, so ids from 256 + merges on are special. */
    char *bpe = NULL;
    size_t bl = 0;
    dt_status st = read_text(vocab_bpe, &bpe, &bl);
    if (st != DT_OK) {
        json_decref(enc);
        return st;
    }
    long merges = 0;
    for (char *line = strtok(bpe, "\n"); line; line = strtok(NULL, "\n"))
        if (strncmp(line, "#version", 8) != 0 && *line)
            merges++;
    free(bpe);
    int V = (int)json_object_size(enc);
    if (256 + merges > V) {
        json_decref(enc);
        return dt_error_set(DT_ERR_CORRUPT, "%s has %ld merges, %s only %d tokens", vocab_bpe,
                            merges, encoder_json, V);
    }
    uint8_t *blob = malloc((size_t)V * 64 + 4096);
    uint32_t *off = calloc((size_t)V, sizeof *off), *len = calloc((size_t)V, sizeof *len);
    size_t used = 0, cap = (size_t)V * 64 + 4096;
    if (!blob || !off || !len) {
        free(blob);
        free(off);
        free(len);
        json_decref(enc);
        return DT_ERR_NOMEM;
    }
    const char *key;
    json_t *v;
    json_object_foreach(enc, key, v) {
        json_int_t id = json_is_integer(v) ? json_integer_value(v) : -1;
        if (id < 0 || id >= V || len[id] != 0) {
            st = dt_error_set(DT_ERR_CORRUPT,
                              "%s: token \"%.40s\" has id %lld (ids must be 0..%d, "
                              "each once)",
                              encoder_json, key, (long long)id, V - 1);
            break;
        }
        if (used + strlen(key) + 1 > cap) {
            cap = 2 * cap + strlen(key);
            uint8_t *g = realloc(blob, cap);
            if (!g) {
                st = DT_ERR_NOMEM;
                break;
            }
            blob = g;
        }
        long n = unmap(key, blob + used, cap - used);
        if (n <= 0 && id < 256 + merges) {
            st = dt_error_set(DT_ERR_CORRUPT,
                              "%s: token \"%.40s\" is not in GPT-2's byte-to-unicode alphabet",
                              encoder_json, key);
            break;
        }
        if (n <= 0) { /* a special token spelled outside the alphabet: its UTF-8 */
            n = (long)strlen(key);
            memcpy(blob + used, key, (size_t)n);
        }
        off[id] = (uint32_t)used;
        len[id] = (uint32_t)n;
        used += (size_t)n;
    }
    json_decref(enc);
    if (st != DT_OK) {
        free(blob);
        free(off);
        free(len);
        return st;
    }
    return build(out, V, 256 + (int)merges, blob, off, len, NULL, name ? name : encoder_json);
}

dt_status dt_bpe_dir(char *out, size_t len) {
    const char *d = getenv("DT_TOKENIZER_DIR");
    if (d && *d) {
        snprintf(out, len, "%s", d);
        return DT_OK;
    }
    const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    if (xdg && *xdg)
        snprintf(out, len, "%s/dtrain/gpt2", xdg);
    else if (home && *home)
        snprintf(out, len, "%s/.cache/dtrain/gpt2", home);
    else
        return dt_error_set(DT_ERR_NOT_FOUND, "no DT_TOKENIZER_DIR, XDG_CACHE_HOME or HOME");
    return DT_OK;
}

dt_status dt_bpe_open(dt_bpe **out, const char *spec) {
    char dir[4096], e[4200], m[4200];
    bool gpt2 = strcmp(spec, "gpt2") == 0;
    if (gpt2)
        DT_CHECK(dt_bpe_dir(dir, sizeof dir));
    else
        snprintf(dir, sizeof dir, "%s", spec);
    snprintf(e, sizeof e, "%s/encoder.json", dir);
    snprintf(m, sizeof m, "%s/vocab.bpe", dir);
    dt_status st = dt_bpe_load(out, e, m, gpt2 ? "gpt2" : dir);
    if (st == DT_ERR_NOT_FOUND)
        return dt_error_set(st, "%s: no encoder.json / vocab.bpe there%s", dir,
                            gpt2 ? " (run scripts/get-gpt2-tokenizer.sh to fetch GPT-2's, or set "
                                   "DT_TOKENIZER_DIR)"
                                 : "");
    return st;
}

int dt_bpe_vocab_size(const dt_bpe *b) { return b->vocab; }
uint64_t dt_bpe_hash(const dt_bpe *b) { return b->hash; }
const char *dt_bpe_name(const dt_bpe *b) { return b->name; }

const uint8_t *dt_bpe_token(const dt_bpe *b, int32_t id, size_t *len) {
    if (id < 0 || id >= b->vocab)
        return NULL;
    *len = b->tok_len[id];
    return b->blob + b->tok_off[id];
}

/* ------------------------------------------------------------------------ */
/* Encoding                                                                 */
/* ------------------------------------------------------------------------ */

static bool grow(void **p, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap)
        return true;
    size_t c = *cap ? *cap : 1024;
    while (c < need)
        c *= 2;
    void *g = realloc(*p, c * elem);
    if (!g)
        return false;
    *p = g;
    *cap = c;
    return true;
}

/* tiktoken's byte_pair_merge: the part boundaries of piece s (n bytes)
 * after merging lowest-ranked pairs first; their ids appended to out. */
static dt_status merge_piece(dt_bpe *b, const uint8_t *s, size_t n, int32_t **out, size_t *nout,
                             size_t *cap) {
    if (!grow((void **)out, cap, *nout + n, sizeof **out))
        return DT_ERR_NOMEM;
    int32_t whole = rank_of(b, s, n);
    if (whole >= 0 && whole < b->mergeable) {
        (*out)[(*nout)++] = whole;
        return DT_OK;
    }
    if (n + 1 > b->scratch_cap) {
        size_t c = 2 * (n + 1);
        size_t *p = realloc(b->parts, c * sizeof *p);
        if (!p)
            return DT_ERR_NOMEM;
        b->parts = p;
        uint32_t *r = realloc(b->part_rank, c * sizeof *r);
        if (!r)
            return DT_ERR_NOMEM;
        b->part_rank = r;
        b->scratch_cap = c;
    }
    size_t *start = b->parts; /* start[0..np]: boundaries */
    uint32_t *rank = b->part_rank;
    size_t np = n;
    for (size_t i = 0; i <= n; i++)
        start[i] = i;
    /* rank[i]: the rank of merging parts i and i + 1, UINT32_MAX if none. */
    for (size_t i = 0; i + 1 < np; i++) {
        int32_t r = rank_of(b, s + start[i], start[i + 2] - start[i]);
        rank[i] = r >= 0 && r < b->mergeable ? (uint32_t)r : UINT32_MAX;
    }
    while (np > 1) {
        uint32_t best = UINT32_MAX;
        size_t at = 0;
        for (size_t i = 0; i + 1 < np; i++)
            if (rank[i] < best) {
                best = rank[i];
                at = i;
            }
        if (best == UINT32_MAX)
            break;
        /* Merge parts at and at + 1: drop boundary at + 1. */
        memmove(start + at + 1, start + at + 2, (np - at - 1) * sizeof *start);
        if (at + 1 < np - 1)
            memmove(rank + at + 1, rank + at + 2, (np - at - 2) * sizeof *rank);
        np--;
        for (size_t i = at > 0 ? at - 1 : 0; i <= at && i + 1 < np; i++) {
            int32_t r = rank_of(b, s + start[i], start[i + 2] - start[i]);
            rank[i] = r >= 0 && r < b->mergeable ? (uint32_t)r : UINT32_MAX;
        }
    }
    for (size_t i = 0; i < np; i++) {
        int32_t id = rank_of(b, s + start[i], start[i + 1] - start[i]);
        DT_ASSERT(id >= 0); /* every part is a token: single bytes are */
        (*out)[(*nout)++] = id;
    }
    return DT_OK;
}

static void cache_clear(dt_bpe *b) {
    memset(b->cache, 0, b->ncache * sizeof *b->cache);
    b->cache_used = b->keys_len = b->ids_len = 0;
}

/* The piece's ids from the cache, or merged and cached. */
static dt_status encode_piece(dt_bpe *b, const uint8_t *s, size_t n, int32_t **out, size_t *nout,
                              size_t *cap) {
    if (n > 256) /* long pieces (a run of punctuation or spaces) are not cached */
        return merge_piece(b, s, n, out, nout, cap);
    uint64_t h = hash_bytes(s, n);
    size_t mask = b->ncache - 1, i = (size_t)h & mask;
    for (;; i = (i + 1) & mask) {
        cache_slot *c = &b->cache[i];
        if (c->key_len == 0)
            break;
        if (c->hash == h && c->key_len == n && memcmp(b->cache_keys + c->key_off, s, n) == 0) {
            if (!grow((void **)out, cap, *nout + c->ids_len, sizeof **out))
                return DT_ERR_NOMEM;
            memcpy(*out + *nout, b->cache_ids + c->ids_off, c->ids_len * sizeof **out);
            *nout += c->ids_len;
            return DT_OK;
        }
    }
    size_t before = *nout;
    DT_CHECK(merge_piece(b, s, n, out, nout, cap));
    size_t k = *nout - before;
    if (b->cache_used * 2 >= b->ncache) {
        cache_clear(b);
        i = (size_t)h & mask;
    }
    if (!grow((void **)&b->cache_keys, &b->keys_cap, b->keys_len + n, 1) ||
        !grow((void **)&b->cache_ids, &b->ids_cap, b->ids_len + k, sizeof *b->cache_ids))
        return DT_OK; /* no room to cache: fine */
    memcpy(b->cache_keys + b->keys_len, s, n);
    memcpy(b->cache_ids + b->ids_len, *out + before, k * sizeof **out);
    b->cache[i] =
        (cache_slot){h, (uint32_t)b->keys_len, (uint32_t)n, (uint32_t)b->ids_len, (uint32_t)k};
    b->keys_len += n;
    b->ids_len += k;
    b->cache_used++;
    return DT_OK;
}

dt_status dt_bpe_encode(dt_bpe *b, const void *text, size_t len, int32_t **ids, size_t *n) {
    const uint8_t *s = text;
    size_t cap = *ids ? *n : 0;
    *n = 0;
    if (*ids == NULL)
        cap = 0;
    /* Most pieces of English are 1-2 tokens: start near len / 4. */
    if (!grow((void **)ids, &cap, len / 4 + 16, sizeof **ids))
        return DT_ERR_NOMEM;
    for (size_t i = 0; i < len;) {
        size_t k = split_piece(s, len, i);
        DT_ASSERT(k > 0);
        dt_status st = encode_piece(b, s + i, k, ids, n, &cap);
        if (st != DT_OK)
            return dt_error_set(st, "BPE encoding: out of memory at byte %zu", i);
        i += k;
    }
    return DT_OK;
}

size_t dt_bpe_split(const void *text, size_t len, size_t at) {
    if (!ascii_class['A'])
        init_ascii();
    return at < len ? split_piece(text, len, at) : 0;
}

/* ------------------------------------------------------------------------ */
/* Saving in GPT-2's format                                                 */
/* ------------------------------------------------------------------------ */

/* The byte_map spelling of bytes s (n) as UTF-8 into out (4n + 1). */
static void spell(const uint8_t *s, size_t n, char *out) {
    uint32_t u[256];
    byte_map(u);
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t cp = u[s[i]];
        if (cp < 0x80) {
            out[o++] = (char)cp;
        } else {
            out[o++] = (char)(0xc0 | cp >> 6);
            out[o++] = (char)(0x80 | (cp & 0x3f));
        }
    }
    out[o] = '\0';
}

dt_status dt_bpe_save(const dt_bpe *b, const char *dir) {
    DT_CHECK(dt_mkdir_p(dir));
    json_t *enc = json_object();
    size_t longest = 0;
    for (int i = 0; i < b->vocab; i++)
        longest = b->tok_len[i] > longest ? b->tok_len[i] : longest;
    char *key = malloc(4 * longest + 1);
    /* vocab.bpe: each merge as its two parts; the split of token 256 + k is
     * the one BPE encoding of its bytes makes before the last merge: the
     * two parts whose ranks are below it (found by encoding with ranks
     * < the token's own). */
    char *merges = NULL;
    size_t mlen = 0, mcap = 0;
    dt_status st = enc && key ? DT_OK : DT_ERR_NOMEM;
    static const char head[] = "#version: 0.2\n";
    if (st == DT_OK && grow((void **)&merges, &mcap, sizeof head, 1)) {
        memcpy(merges, head, sizeof head - 1);
        mlen = sizeof head - 1;
    }
    for (int i = 0; st == DT_OK && i < b->vocab; i++) {
        const uint8_t *t = b->blob + b->tok_off[i];
        size_t n = b->tok_len[i];
        if (i >= b->mergeable) { /* specials keep their own spelling */
            memcpy(key, t, n);
            key[n] = '\0';
        } else {
            spell(t, n, key);
        }
        if (json_object_set_new(enc, key, json_integer(i)) != 0) {
            st = DT_ERR_NOMEM;
            break;
        }
        if (i < 256 || i >= b->mergeable)
            continue;
        /* The split: the merge that made the token when it was learned;
         * for a loaded tokenizer the boundary k whose halves are both
         * tokens of lower rank, the larger of the two the smallest (the
         * last merge BPE would make). */
        size_t cut = b->left && b->left[i] >= 0 ? b->tok_len[b->left[i]] : 0;
        int32_t best = INT32_MAX;
        bool learned = cut != 0;
        for (size_t k = 1; k < n && !learned; k++) {
            int32_t l = rank_of(b, t, k), r = rank_of(b, t + k, n - k);
            if (l >= 0 && r >= 0 && l < i && r < i && (l > r ? l : r) < best) {
                best = l > r ? l : r;
                cut = k;
            }
        }
        if (!cut) {
            st = dt_error_set(DT_ERR_INTERNAL, "token %d has no split into earlier tokens", i);
            break;
        }
        char *a = malloc(4 * n + 1), *c = malloc(4 * n + 1);
        if (!a || !c || !grow((void **)&merges, &mcap, mlen + 8 * n + 3, 1)) {
            free(a);
            free(c);
            st = DT_ERR_NOMEM;
            break;
        }
        spell(t, cut, a);
        spell(t + cut, n - cut, c);
        mlen += (size_t)sprintf(merges + mlen, "%s %s\n", a, c);
        free(a);
        free(c);
    }
    free(key);
    char path[4200];
    if (st == DT_OK) {
        char *text = json_dumps(enc, JSON_COMPACT | JSON_ENSURE_ASCII);
        snprintf(path, sizeof path, "%s/encoder.json", dir);
        st = text ? dt_file_write_atomic(path, &(dt_file_part){text, strlen(text)}, 1)
                  : DT_ERR_NOMEM;
        free(text);
    }
    if (st == DT_OK) {
        snprintf(path, sizeof path, "%s/vocab.bpe", dir);
        st = dt_file_write_atomic(path, &(dt_file_part){merges, mlen}, 1);
    }
    json_decref(enc);
    free(merges);
    return st;
}

/* ------------------------------------------------------------------------ */
/* Learning a vocabulary                                                    */
/* ------------------------------------------------------------------------ */

/* A distinct piece of the corpus: its symbols (token ids) and count. */
typedef struct word {
    int32_t *sym;
    uint32_t n;
    uint64_t count;
} word;

/* Pair (a, b) -> count, open addressing keyed by a << 32 | b. */
typedef struct pair_slot {
    uint64_t key; /* UINT64_MAX: empty */
    int64_t count;
} pair_slot;

typedef struct pairs {
    pair_slot *s;
    size_t cap, used;
} pairs;

static int64_t *pair_ref(pairs *p, uint64_t key) {
    if (2 * (p->used + 1) > p->cap) {
        size_t cap = p->cap ? 2 * p->cap : 1 << 16;
        pair_slot *s = malloc(cap * sizeof *s);
        if (!s)
            return NULL;
        for (size_t i = 0; i < cap; i++)
            s[i].key = UINT64_MAX;
        for (size_t i = 0; i < p->cap; i++) {
            if (p->s[i].key == UINT64_MAX)
                continue;
            size_t h = (size_t)dt_hash64(&p->s[i].key, 8, 0) & (cap - 1);
            while (s[h].key != UINT64_MAX)
                h = (h + 1) & (cap - 1);
            s[h] = p->s[i];
        }
        free(p->s);
        p->s = s;
        p->cap = cap;
    }
    size_t h = (size_t)dt_hash64(&key, 8, 0) & (p->cap - 1);
    while (p->s[h].key != UINT64_MAX && p->s[h].key != key)
        h = (h + 1) & (p->cap - 1);
    if (p->s[h].key == UINT64_MAX) {
        p->s[h] = (pair_slot){key, 0};
        p->used++;
    }
    return &p->s[h].count;
}

dt_status dt_bpe_train(dt_bpe **out, const void *text, size_t len, int vocab_size) {
    *out = NULL;
    if (vocab_size < 257 || vocab_size > 65536)
        return dt_error_set(DT_ERR_INVALID,
                            "--vocab-size %d: must be in [257, 65536] (256 bytes, the merges "
                            "and <|endoftext|>)",
                            vocab_size);
    if (len == 0)
        return dt_error_set(DT_ERR_INVALID, "the corpus is empty");
    if (!ascii_class['A'])
        init_ascii();
    /* The tokens so far: the 256 bytes in GPT-2's id order, then merges. */
    size_t cap_blob = 4096 + (size_t)vocab_size * 16, used = 0;
    uint8_t *blob = malloc(cap_blob);
    uint32_t *off = calloc((size_t)vocab_size, sizeof *off),
             *tlen = calloc((size_t)vocab_size, sizeof *tlen);
    int32_t *left = malloc((size_t)vocab_size * sizeof *left);
    word *words = NULL;
    size_t nwords = 0, capw = 0;
    pairs pc = {0};
    dt_status st = blob && off && tlen && left ? DT_OK : DT_ERR_NOMEM;
    for (int i = 0; left && i < vocab_size; i++)
        left[i] = -1;
    int32_t id_of_byte[256];
    if (st == DT_OK) {
        /* GPT-2's order of the single bytes: byte_map's code point order. */
        uint32_t u[256];
        byte_map(u);
        int id = 0;
        for (uint32_t cp = 0; cp < 512; cp++)
            for (int c = 0; c < 256; c++)
                if (u[c] == cp) {
                    blob[used] = (uint8_t)c;
                    off[id] = (uint32_t)used++;
                    tlen[id] = 1;
                    id_of_byte[c] = id++;
                }
    }
    /* Distinct pieces and their counts (a hash of piece -> word index). */
    size_t hcap = 1 << 16, hused = 0;
    size_t *htab = st == DT_OK ? malloc(hcap * sizeof *htab) : NULL;
    const uint8_t *s = text;
    if (st == DT_OK && !htab)
        st = DT_ERR_NOMEM;
    if (htab)
        memset(htab, 0xff, hcap * sizeof *htab);
    /* Each word keeps its piece's bytes in wbytes (for the hash lookups). */
    for (size_t i = 0; st == DT_OK && i < len;) {
        size_t k = split_piece(s, len, i);
        uint64_t h = hash_bytes(s + i, k);
        size_t at = (size_t)h & (hcap - 1);
        for (;; at = (at + 1) & (hcap - 1)) {
            if (htab[at] == SIZE_MAX)
                break;
            word *w = &words[htab[at]];
            if (w->n == k) {
                bool same = true;
                for (uint32_t q = 0; q < k && same; q++)
                    same = w->sym[q] == id_of_byte[s[i + q]];
                if (same)
                    break;
            }
        }
        if (htab[at] != SIZE_MAX) {
            words[htab[at]].count++;
        } else {
            if (!grow((void **)&words, &capw, nwords + 1, sizeof *words)) {
                st = DT_ERR_NOMEM;
                break;
            }
            word *w = &words[nwords];
            w->sym = malloc(k * sizeof *w->sym);
            if (!w->sym) {
                st = DT_ERR_NOMEM;
                break;
            }
            for (size_t q = 0; q < k; q++)
                w->sym[q] = id_of_byte[s[i + q]];
            w->n = (uint32_t)k;
            w->count = 1;
            htab[at] = nwords++;
            if (2 * ++hused > hcap) { /* rehash by the words' bytes */
                size_t nc = 2 * hcap;
                size_t *nt = malloc(nc * sizeof *nt);
                if (!nt) {
                    st = DT_ERR_NOMEM;
                    break;
                }
                memset(nt, 0xff, nc * sizeof *nt);
                for (size_t x = 0; x < nwords; x++) {
                    uint8_t tmp[4096];
                    uint32_t wn = words[x].n < sizeof tmp ? words[x].n : (uint32_t)sizeof tmp;
                    for (uint32_t q = 0; q < wn; q++)
                        tmp[q] = blob[off[words[x].sym[q]]];
                    size_t a = (size_t)hash_bytes(tmp, wn) & (nc - 1);
                    while (nt[a] != SIZE_MAX)
                        a = (a + 1) & (nc - 1);
                    nt[a] = x;
                }
                free(htab);
                htab = nt;
                hcap = nc;
            }
        }
        i += k;
    }
    free(htab);
    /* Pair counts over all words. */
    for (size_t x = 0; st == DT_OK && x < nwords; x++)
        for (uint32_t q = 0; q + 1 < words[x].n; q++) {
            int64_t *c =
                pair_ref(&pc, (uint64_t)words[x].sym[q] << 32 | (uint32_t)words[x].sym[q + 1]);
            if (!c) {
                st = DT_ERR_NOMEM;
                break;
            }
            *c += (int64_t)words[x].count;
        }
    int next = 256;
    while (st == DT_OK && next < vocab_size - 1) {
        /* The most frequent pair; ties go to the smaller ids (deterministic). */
        uint64_t best = UINT64_MAX;
        int64_t bc = 0;
        for (size_t i = 0; i < pc.cap; i++)
            if (pc.s[i].key != UINT64_MAX &&
                (pc.s[i].count > bc || (pc.s[i].count == bc && bc > 0 && pc.s[i].key < best))) {
                bc = pc.s[i].count;
                best = pc.s[i].key;
            }
        if (bc < 2)
            break; /* nothing left worth a token */
        int32_t a = (int32_t)(best >> 32), b = (int32_t)(best & 0xffffffffu);
        size_t n = (size_t)tlen[a] + tlen[b];
        if (!grow((void **)&blob, &cap_blob, used + n, 1)) {
            st = DT_ERR_NOMEM;
            break;
        }
        memcpy(blob + used, blob + off[a], tlen[a]);
        memcpy(blob + used + tlen[a], blob + off[b], tlen[b]);
        off[next] = (uint32_t)used;
        tlen[next] = (uint32_t)n;
        left[next] = a;
        used += n;
        /* Replace (a, b) by the new token in every word, left to right,
         * moving the counts of the neighbouring pairs. */
        for (size_t x = 0; st == DT_OK && x < nwords; x++) {
            word *w = &words[x];
            int64_t c = (int64_t)w->count;
            uint32_t o = 0;
            for (uint32_t q = 0; q < w->n; q++) {
                if (q + 1 < w->n && w->sym[q] == a && w->sym[q + 1] == b) {
                    int64_t *p;
                    if (o > 0) {
                        p = pair_ref(&pc, (uint64_t)w->sym[o - 1] << 32 | (uint32_t)a);
                        if (p)
                            *p -= c;
                        p = pair_ref(&pc, (uint64_t)w->sym[o - 1] << 32 | (uint32_t)next);
                        if (p)
                            *p += c;
                    }
                    if (q + 2 < w->n) {
                        p = pair_ref(&pc, (uint64_t)b << 32 | (uint32_t)w->sym[q + 2]);
                        if (p)
                            *p -= c;
                        p = pair_ref(&pc, (uint64_t)next << 32 | (uint32_t)w->sym[q + 2]);
                        if (p)
                            *p += c;
                    }
                    w->sym[o++] = next;
                    q++;
                } else {
                    w->sym[o++] = w->sym[q];
                }
            }
            w->n = o;
        }
        *pair_ref(&pc, best) = 0;
        next++;
    }
    for (size_t x = 0; x < nwords; x++)
        free(words[x].sym);
    free(words);
    free(pc.s);
    if (st == DT_OK && !grow((void **)&blob, &cap_blob, used + 16, 1))
        st = DT_ERR_NOMEM;
    if (st != DT_OK) {
        free(blob);
        free(off);
        free(tlen);
        free(left);
        return st;
    }
    /* <|endoftext|>, as in GPT-2, after the merges. */
    static const char eot[] = "<|endoftext|>";
    memcpy(blob + used, eot, sizeof eot - 1);
    off[next] = (uint32_t)used;
    tlen[next] = (uint32_t)(sizeof eot - 1);
    return build(out, next + 1, next, blob, off, tlen, left, "learned");
}
