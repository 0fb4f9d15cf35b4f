/*
 * tokfile.c — the .tok token file: building its image from text, writing it
 * atomically, mapping and validating it.
 *
 * One validator serves both origins: a .tok file is mapped read-only and
 * validated; a text file is tokenized into the same image in memory and
 * validated the same way. Invariants after a successful open: the image
 * size is exactly what the header describes, the checksum matches, the
 * vocabulary table is well formed, and every token is < V — so the loader
 * and the model may index with tokens without checking them again.
 * Every length is checked against the real file size before it is used.
 */
#include "dtrain/data.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the .tok format is little-endian");

#define TOK_MAGIC       "DTTOKENS"
#define TOK_HEADER      64
#define TOK_TRAILER     8
#define TOK_TOKEN_BYTES 2

struct dt_token_file {
    char *path;             /* as given to open */
    dt_tokenizer tok;       /* from the file's table */
    const uint8_t *image;   /* the whole file image */
    size_t image_len;       /* its size in bytes */
    bool mapped;            /* image is an mmap (else dt_alloc'ed) */
    size_t count;           /* number of tokens */
    const uint16_t *tokens; /* (count), inside image */
    uint64_t checksum;      /* stored XXH3-64 */
};

static size_t pad8(size_t n) { return (n + 7) & ~(size_t)7; }

static uint32_t rd32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

static uint64_t rd64(const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

/* Validate an image and fill f's view of it. Messages start with the path. */
static dt_status validate(dt_token_file *f, const char *path, const uint8_t *img, size_t len) {
    if (len == 0)
        return dt_error_set(DT_ERR_CORRUPT, "%s: empty file (0 bytes), not a token file", path);
    if (len < TOK_HEADER + TOK_TRAILER)
        return dt_error_set(DT_ERR_CORRUPT,
                            "%s: truncated: %zu bytes, less than the %d-byte header and checksum",
                            path, len, TOK_HEADER + TOK_TRAILER);
    if (memcmp(img, TOK_MAGIC, 8) != 0) {
        char shown[9];
        for (int i = 0; i < 8; i++)
            shown[i] = img[i] >= 0x20 && img[i] < 0x7f ? (char)img[i] : '?';
        shown[8] = 0;
        return dt_error_set(DT_ERR_CORRUPT,
                            "%s: bad magic \"%s\" (expected \"%s\"): not a dtrain token file", path,
                            shown, TOK_MAGIC);
    }
    uint32_t version = rd32(img + 8), kind = rd32(img + 12), vocab = rd32(img + 16);
    uint32_t width = rd32(img + 20);
    uint64_t count = rd64(img + 24);
    if (version != 1 && version != DT_TOKEN_FILE_VERSION)
        return dt_error_set(DT_ERR_CORRUPT,
                            "%s: unsupported version %u (this build reads 1 and %d)", path, version,
                            DT_TOKEN_FILE_VERSION);
    if (kind < 1 || kind > DT_TOKENIZER_COUNT || (kind == 3 && version < 2))
        return dt_error_set(DT_ERR_CORRUPT,
                            "%s: unknown tokenizer kind %u (1 byte, 2 char, 3 bpe from version 2)",
                            path, kind);
    bool bpe = kind == DT_TOKENIZER_BPE + 1;
    if (bpe ? vocab < 257 || vocab > 65536 : vocab < 1 || vocab > 256)
        return dt_error_set(DT_ERR_CORRUPT, "%s: vocabulary size %u is outside %s", path, vocab,
                            bpe ? "257..65536" : "1..256");
    /* The byte table's length in the file (bpe has none). */
    uint32_t table = bpe ? 0 : vocab;
    if (width != TOK_TOKEN_BYTES)
        return dt_error_set(DT_ERR_CORRUPT, "%s: token width %u bytes is not supported (2)", path,
                            width);
    if (count == 0)
        return dt_error_set(DT_ERR_CORRUPT, "%s: the header says it holds no tokens", path);
    /* The size the header describes, bounded by the real size before use. */
    size_t fixed = TOK_HEADER + pad8(table) + TOK_TRAILER;
    uint64_t fits = len > fixed ? (len - fixed) / TOK_TOKEN_BYTES : 0;
    if (count > fits)
        return dt_error_set(DT_ERR_CORRUPT,
                            "%s: truncated: %zu bytes, too few for the %llu tokens its header "
                            "announces",
                            path, len, (unsigned long long)count);
    size_t expect = fixed + pad8((size_t)count * TOK_TOKEN_BYTES);
    if (len < expect)
        return dt_error_set(DT_ERR_CORRUPT,
                            "%s: truncated: %zu bytes, the header describes %zu (%llu tokens)",
                            path, len, expect, (unsigned long long)count);
    if (len > expect)
        return dt_error_set(DT_ERR_CORRUPT,
                            "%s: %zu unexpected bytes after the end (file has %zu, the header "
                            "describes %zu)",
                            path, len - expect, len, expect);
    uint64_t stored = rd64(img + len - TOK_TRAILER);
    uint64_t computed = dt_hash64(img, len - TOK_TRAILER, 0);
    if (stored != computed)
        return dt_error_set(DT_ERR_CORRUPT,
                            "%s: checksum mismatch (stored %016llx, computed %016llx): the file "
                            "is damaged",
                            path, (unsigned long long)stored, (unsigned long long)computed);
    for (int i = bpe ? 40 : 32; i < TOK_HEADER; i++)
        if (img[i] != 0)
            return dt_error_set(DT_ERR_CORRUPT, "%s: reserved header byte %d is not zero", path, i);
    /* Padding is zero by the format; anything else is a writer bug or damage. */
    size_t tok_end = TOK_HEADER + pad8(table) + (size_t)count * TOK_TOKEN_BYTES;
    for (size_t i = TOK_HEADER + table; i < TOK_HEADER + pad8(table); i++)
        if (img[i] != 0)
            return dt_error_set(DT_ERR_CORRUPT,
                                "%s: padding byte %zu after the vocabulary is not zero", path, i);
    for (size_t i = tok_end; i < len - TOK_TRAILER; i++)
        if (img[i] != 0)
            return dt_error_set(DT_ERR_CORRUPT, "%s: padding byte %zu after the tokens is not zero",
                                path, i);
    if (bpe) {
        memset(&f->tok, 0, sizeof f->tok);
        f->tok.kind = DT_TOKENIZER_BPE;
        f->tok.vocab_size = (int)vocab;
        for (int c = 0; c < 256; c++)
            f->tok.byte_to_id[c] = -1;
        f->tok.bpe_hash = rd64(img + 32);
    } else {
        dt_status st = dt_tokenizer_init_table(&f->tok, (dt_tokenizer_kind)(kind - 1),
                                               img + TOK_HEADER, (int)vocab);
        if (st != DT_OK) {
            dt_error_prefix("%s: ", path);
            return st;
        }
    }
    const uint16_t *tokens = (const uint16_t *)(const void *)(img + TOK_HEADER + pad8(table));
    /* A max scan (vectorises) first; the index is looked up only on failure. */
    uint16_t max = 0;
    for (size_t i = 0; i < count; i++)
        max = tokens[i] > max ? tokens[i] : max;
    if ((uint32_t)max >= vocab) {
        size_t i = 0;
        while (tokens[i] < vocab)
            i++;
        return dt_error_set(DT_ERR_CORRUPT,
                            "%s: token %u at index %zu is outside the vocabulary (V = %u)", path,
                            tokens[i], i, vocab);
    }
    f->image = img;
    f->image_len = len;
    f->count = (size_t)count;
    f->tokens = tokens;
    f->checksum = stored;
    return DT_OK;
}

/* Encode `text` with `tok` into a complete file image (dt_alloc'ed). */
static dt_status build_image(const char *path, const dt_tokenizer *tok, const uint8_t *text,
                             size_t len, uint8_t **out, size_t *out_len) {
    bool bpe = tok->kind == DT_TOKENIZER_BPE;
    int32_t *ids = NULL;
    if (bpe) { /* the ids first: their count sizes the image */
        size_t n = 0;
        dt_status st = dt_tokenizer_encode_any(tok, text, len, &ids, &n);
        if (st != DT_OK) {
            free(ids);
            dt_error_prefix("%s", path);
            return st;
        }
        len = n;
    }
    size_t tok_bytes;
    if (!dt_mul_size(len, TOK_TOKEN_BYTES, &tok_bytes) || tok_bytes > SIZE_MAX / 2) {
        free(ids);
        return dt_error_set(DT_ERR_INVALID, "%s: %zu bytes is too large", path, len);
    }
    size_t vpad = bpe ? 0 : pad8((size_t)tok->vocab_size);
    size_t total = TOK_HEADER + vpad + pad8(tok_bytes) + TOK_TRAILER;
    uint8_t *img = dt_alloc(total);
    if (!img) {
        free(ids);
        return dt_error_set(DT_ERR_NOMEM, "%s: cannot allocate %zu bytes for its tokens", path,
                            total);
    }
    memset(img, 0, total);
    /* byte and char files stay version 1, as before bpe existed. */
    uint32_t hdr32[4] = {bpe ? DT_TOKEN_FILE_VERSION : 1, (uint32_t)tok->kind + 1,
                         (uint32_t)tok->vocab_size, TOK_TOKEN_BYTES};
    uint64_t count = len;
    memcpy(img, TOK_MAGIC, 8);
    memcpy(img + 8, hdr32, sizeof hdr32);
    memcpy(img + 24, &count, 8);
    if (bpe)
        memcpy(img + 32, &tok->bpe_hash, 8);
    else
        memcpy(img + TOK_HEADER, tok->id_to_byte, (size_t)tok->vocab_size);
    uint16_t *tokens = (uint16_t *)(void *)(img + TOK_HEADER + vpad);
    for (size_t i = 0; bpe && i < len; i++)
        tokens[i] = (uint16_t)ids[i];
    free(ids);
    for (size_t i = 0; !bpe && i < len; i++) {
        int id = tok->byte_to_id[text[i]];
        if (id < 0) {
            dt_free(img);
            return dt_error_set(DT_ERR_INVALID,
                                "%s: byte 0x%02x at offset %zu is not in the %s vocabulary "
                                "(V = %d) of the training data",
                                path, text[i], i, dt_tokenizer_names[tok->kind], tok->vocab_size);
        }
        tokens[i] = (uint16_t)id;
    }
    uint64_t sum = dt_hash64(img, total - TOK_TRAILER, 0);
    memcpy(img + total - TOK_TRAILER, &sum, 8);
    *out = img;
    *out_len = total;
    return DT_OK;
}

static dt_status open_errno(const char *path, const char *what) {
    if (errno == ENOENT)
        return dt_error_set(DT_ERR_NOT_FOUND, "%s: no such file", path);
    return dt_error_set_errno(DT_ERR_IO, "%s: cannot %s", path, what);
}

/* Map a whole regular file read-only; *len 0 gives *data NULL. Opened
 * non-blocking: a FIFO is refused below instead of waiting for a writer. */
static dt_status map_file(const char *path, const uint8_t **data, size_t *len) {
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0)
        return open_errno(path, "open");
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        dt_status st = dt_error_set_errno(DT_ERR_IO, "%s: cannot stat", path);
        close(fd);
        return st;
    }
    if (!S_ISREG(sb.st_mode)) {
        close(fd);
        return dt_error_set(DT_ERR_INVALID, "%s: not a regular file", path);
    }
    *len = (size_t)sb.st_size;
    *data = NULL;
    if (*len > 0) {
        void *p = mmap(NULL, *len, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) {
            dt_status st = dt_error_set_errno(DT_ERR_IO, "%s: cannot map %zu bytes", path, *len);
            close(fd);
            return st;
        }
        *data = p;
    }
    close(fd);
    return DT_OK;
}

static dt_status new_file(dt_token_file **out, const char *path) {
    dt_token_file *f = calloc(1, sizeof *f);
    char *p = strdup(path);
    if (!f || !p) {
        free(f);
        free(p);
        return dt_error_set(DT_ERR_NOMEM, "%s: out of memory", path);
    }
    f->path = p;
    *out = f;
    return DT_OK;
}

dt_status dt_token_file_open(dt_token_file **out, const char *path) {
    *out = NULL;
    const uint8_t *data;
    size_t len;
    DT_CHECK(map_file(path, &data, &len));
    dt_token_file *f = NULL;
    dt_status st = new_file(&f, path);
    if (st == DT_OK) {
        f->mapped = true;
        st = validate(f, path, data, len);
        if (st == DT_OK) {
            *out = f;
            return DT_OK;
        }
        f->image = NULL; /* unmapped below */
        dt_token_file_close(f);
    }
    if (data)
        munmap((void *)data, len);
    return st;
}

dt_status dt_token_file_from_text(dt_token_file **out, const char *path, dt_tokenizer_kind kind,
                                  const dt_tokenizer *vocab) {
    *out = NULL;
    if (!vocab && ((unsigned)kind >= DT_TOKENIZER_COUNT || kind == DT_TOKENIZER_BPE))
        return dt_error_set(DT_ERR_INVALID,
                            "tokenizer kind %d: byte or char, or give the "
                            "tokenizer (bpe)",
                            (int)kind);
    const uint8_t *text;
    size_t len;
    DT_CHECK(map_file(path, &text, &len));
    if (len == 0)
        return dt_error_set(DT_ERR_INVALID, "%s: the file is empty", path);
    dt_tokenizer tok;
    if (vocab)
        tok = *vocab;
    else if (kind == DT_TOKENIZER_BYTE)
        dt_tokenizer_init_byte(&tok);
    else
        (void)dt_tokenizer_init_char(&tok, text, len); /* len > 0: cannot fail */
    uint8_t *img = NULL;
    size_t img_len = 0;
    dt_token_file *f = NULL;
    dt_status st;
    DT_CHECK_GOTO(build_image(path, &tok, text, len, &img, &img_len), st, fail);
    DT_CHECK_GOTO(new_file(&f, path), st, fail);
    DT_CHECK_GOTO(validate(f, path, img, img_len), st, fail);
    if (tok.kind == DT_TOKENIZER_BPE)
        f->tok.bpe = tok.bpe;
    munmap((void *)text, len);
    *out = f;
    return DT_OK;
fail:
    if (f)
        f->image = NULL;
    dt_token_file_close(f);
    dt_free(img);
    munmap((void *)text, len);
    return st;
}

static bool ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

dt_status dt_data_open(dt_token_file **out, const char *path, dt_tokenizer_kind kind,
                       const dt_tokenizer *vocab) {
    if (!ends_with(path, ".tok"))
        return dt_token_file_from_text(out, path, kind, vocab);
    DT_CHECK(dt_token_file_open(out, path));
    dt_tokenizer *t = &(*out)->tok;
    if (vocab && !dt_tokenizer_equal(t, vocab)) {
        dt_status st = dt_error_set(
            DT_ERR_MISMATCH,
            "%s: its vocabulary (%s, V = %d) differs from the expected one (%s, V = %d)", path,
            dt_tokenizer_names[t->kind], t->vocab_size, dt_tokenizer_names[vocab->kind],
            vocab->vocab_size);
        dt_token_file_close(*out);
        *out = NULL;
        return st;
    }
    if (vocab && t->kind == DT_TOKENIZER_BPE)
        t->bpe = vocab->bpe; /* the same BPE: decodable now */
    return DT_OK;
}

void dt_token_file_close(dt_token_file *f) {
    if (!f)
        return;
    if (f->image) {
        if (f->mapped)
            munmap((void *)f->image, f->image_len);
        else
            dt_free((void *)f->image);
    }
    free(f->path);
    free(f);
}

const dt_tokenizer *dt_token_file_tokenizer(const dt_token_file *f) { return &f->tok; }
size_t dt_token_file_count(const dt_token_file *f) { return f->count; }
const uint16_t *dt_token_file_tokens(const dt_token_file *f) { return f->tokens; }
uint64_t dt_token_file_checksum(const dt_token_file *f) { return f->checksum; }
size_t dt_token_file_bytes(const dt_token_file *f) { return f->image_len; }
const char *dt_token_file_path(const dt_token_file *f) { return f->path; }

/* ---- writing ---- */

dt_status dt_data_prepare_with(const char *in_txt, const char *out_tok, const dt_tokenizer *tok) {
    if (!out_tok || !*out_tok)
        return dt_error_set(DT_ERR_INVALID, "dt_data_prepare: no output path");
    dt_token_file *f = NULL;
    DT_CHECK(dt_token_file_from_text(&f, in_txt, tok->kind, tok));
    dt_status st = dt_file_write_atomic(out_tok, &(dt_file_part){f->image, f->image_len}, 1);
    dt_token_file_close(f);
    return st;
}

dt_status dt_data_prepare(const char *in_txt, const char *out_tok, dt_tokenizer_kind kind) {
    if ((unsigned)kind >= DT_TOKENIZER_COUNT || kind == DT_TOKENIZER_BPE)
        return dt_error_set(DT_ERR_INVALID,
                            "tokenizer kind %d: byte or char (a bpe tokenizer "
                            "goes to dt_data_prepare_with)",
                            (int)kind);
    if (!out_tok || !*out_tok)
        return dt_error_set(DT_ERR_INVALID, "dt_data_prepare: no output path");
    dt_token_file *f = NULL;
    DT_CHECK(dt_token_file_from_text(&f, in_txt, kind, NULL));
    dt_status st = dt_file_write_atomic(out_tok, &(dt_file_part){f->image, f->image_len}, 1);
    dt_token_file_close(f);
    return st;
}

dt_status dt_data_split(size_t count, double val_fraction, size_t *train_end) {
    if (!(val_fraction >= 0.0 && val_fraction < 1.0))
        return dt_error_set(DT_ERR_INVALID, "validation fraction %g is outside [0, 1)",
                            val_fraction);
    size_t val = (size_t)((double)count * val_fraction);
    *train_end = count - val;
    return DT_OK;
}
