/*
 * test_data.c — tokenizers, the .tok file and the loader.
 *
 * Tokenizers round-trip; a .tok file written by dt_data_prepare opens to the
 * same tokens as the text it came from; every single-byte corruption of a
 * small file, every truncation and a wrong magic/version/vocabulary/token are
 * refused with DT_ERR_CORRUPT and a message naming the file and the problem.
 * The loader is deterministic, its ranks' shares are disjoint and together
 * equal the batch of one rank with N times the batch size, and a saved
 * position reproduces the same batches.
 */
#include "dtrain/data.h"
#include "test.h"

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

static char tmpdir[64];

static void path_in_tmp(char *out, size_t len, const char *name) {
    snprintf(out, len, "%s/%s", tmpdir, name);
}

static void write_file(const char *path, const void *data, size_t len) {
    FILE *f = fopen(path, "wb");
    if (!f)
        TEST_FAILF("cannot create %s", path);
    ASSERT_EQ(fwrite(data, 1, len, f), len);
    ASSERT_EQ(fclose(f), 0);
}

static uint8_t *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f)
        TEST_FAILF("cannot open %s", path);
    fseek(f, 0, SEEK_END);
    *len = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *d = malloc(*len + 1);
    ASSERT_EQ(fread(d, 1, *len, f), *len);
    fclose(f);
    return d;
}

/* A small English-like corpus with a fixed seed. */
static char *make_text(size_t n, uint64_t seed) {
    static const char alphabet[] = "etaoin shrdlu\ncmfwyp,.ETAOIN";
    char *s = malloc(n + 1);
    dt_rng r;
    dt_rng_init(&r, seed, dt_rng_stream_id(0, 0, DT_RNG_TEST));
    for (size_t i = 0; i < n; i++)
        s[i] = alphabet[dt_rng_below(&r, sizeof alphabet - 1)];
    s[n] = 0;
    return s;
}

/* ---- tokenizers ---- */

static void test_tokenizer_round_trip(void) {
    dt_tokenizer t;
    uint8_t all[1024];
    for (size_t i = 0; i < sizeof all; i++)
        all[i] = (uint8_t)(i * 7 + 3);
    int32_t ids[1024];
    char back[1024];
    dt_tokenizer_init_byte(&t);
    ASSERT_EQ(t.vocab_size, 256);
    ASSERT_OK(dt_tokenizer_encode(&t, all, sizeof all, ids));
    ASSERT_EQ(ids[1], 10);
    ASSERT_OK(dt_tokenizer_decode(&t, ids, sizeof all, back));
    ASSERT_EQ(memcmp(all, back, sizeof all), 0);

    const char *text = "hello, world\n";
    ASSERT_OK(dt_tokenizer_init_char(&t, text, strlen(text)));
    ASSERT_EQ(t.kind, DT_TOKENIZER_CHAR);
    ASSERT_EQ(t.vocab_size, 10); /* "\n ,dehlorw" */
    ASSERT_EQ(t.id_to_byte[0], '\n');
    ASSERT_EQ(t.id_to_byte[1], ' ');
    ASSERT_EQ(t.id_to_byte[9], 'w');
    for (int i = 1; i < t.vocab_size; i++)
        ASSERT_TRUE(t.id_to_byte[i] > t.id_to_byte[i - 1]);
    ASSERT_OK(dt_tokenizer_encode(&t, text, strlen(text), ids));
    ASSERT_EQ(ids[0], 5); /* 'h' after "\n ,de" */
    ASSERT_OK(dt_tokenizer_decode(&t, ids, strlen(text), back));
    ASSERT_EQ(memcmp(text, back, strlen(text)), 0);

    ASSERT_STATUS(dt_tokenizer_encode(&t, "hex", 3, ids), DT_ERR_INVALID);
    ASSERT_CONTAINS(dt_last_error(), "byte 0x78 ('x') at offset 2");
    ids[0] = 10;
    ASSERT_STATUS(dt_tokenizer_decode(&t, ids, 1, back), DT_ERR_INVALID);
    ASSERT_CONTAINS(dt_last_error(), "token id 10 at index 0 is outside [0, 10)");
    ASSERT_STATUS(dt_tokenizer_init_char(&t, "", 0), DT_ERR_INVALID);

    /* Tables from a file or a checkpoint. */
    dt_tokenizer u, c;
    ASSERT_OK(dt_tokenizer_init_char(&c, text, strlen(text)));
    ASSERT_OK(dt_tokenizer_init_table(&u, DT_TOKENIZER_CHAR, c.id_to_byte, c.vocab_size));
    ASSERT_TRUE(dt_tokenizer_equal(&u, &c));
    uint8_t bad[3] = {'a', 'c', 'b'};
    ASSERT_STATUS(dt_tokenizer_init_table(&u, DT_TOKENIZER_CHAR, bad, 3), DT_ERR_CORRUPT);
    ASSERT_CONTAINS(dt_last_error(), "not strictly increasing at id 2");
    ASSERT_STATUS(dt_tokenizer_init_table(&u, DT_TOKENIZER_BYTE, bad, 3), DT_ERR_CORRUPT);
    dt_tokenizer_init_byte(&u);
    ASSERT_TRUE(!dt_tokenizer_equal(&u, &c));
}

/* ---- token files ---- */

static void test_prepare_and_open(void) {
    char txt[128], tok[128];
    path_in_tmp(txt, sizeof txt, "corpus.txt");
    path_in_tmp(tok, sizeof tok, "corpus.tok");
    size_t n = 5000;
    char *text = make_text(n, 1);
    write_file(txt, text, n);
    for (int kind = 0; kind < DT_TOKENIZER_BPE; kind++) {
        ASSERT_OK(dt_data_prepare(txt, tok, (dt_tokenizer_kind)kind));
        dt_token_file *f, *g;
        ASSERT_OK(dt_token_file_open(&f, tok));
        ASSERT_OK(dt_token_file_from_text(&g, txt, (dt_tokenizer_kind)kind, NULL));
        ASSERT_EQ(dt_token_file_count(f), n);
        const dt_tokenizer *t = dt_token_file_tokenizer(f);
        ASSERT_EQ(t->kind, kind);
        ASSERT_EQ(t->vocab_size, kind == DT_TOKENIZER_BYTE ? 256 : 28);
        /* The on-disk file and the in-memory image are the same bytes. */
        ASSERT_EQ(dt_token_file_checksum(f), dt_token_file_checksum(g));
        ASSERT_EQ(dt_token_file_bytes(f), dt_token_file_bytes(g));
        const uint16_t *tk = dt_token_file_tokens(f);
        for (size_t i = 0; i < n; i++)
            if (t->id_to_byte[tk[i]] != (uint8_t)text[i])
                TEST_FAILF("token %zu decodes to 0x%02x, text has 0x%02x", i, t->id_to_byte[tk[i]],
                           (uint8_t)text[i]);
        /* dt_data_open picks the reader by the name. */
        dt_token_file *h;
        ASSERT_OK(dt_data_open(&h, tok, DT_TOKENIZER_BYTE, NULL));
        ASSERT_EQ(dt_token_file_checksum(h), dt_token_file_checksum(f));
        dt_token_file_close(h);
        ASSERT_OK(dt_data_open(&h, txt, (dt_tokenizer_kind)kind, NULL));
        ASSERT_EQ(dt_token_file_checksum(h), dt_token_file_checksum(f));
        dt_token_file_close(h);
        dt_token_file_close(f);
        dt_token_file_close(g);
    }
    /* No temporary file is left behind. */
    DIR *d = opendir(tmpdir);
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        if (strstr(e->d_name, ".tmp."))
            TEST_FAILF("temporary file %s left in %s", e->d_name, tmpdir);
    closedir(d);
    free(text);
}

static void test_bad_inputs(void) {
    char txt[128], tok[128], missing[128];
    path_in_tmp(txt, sizeof txt, "empty.txt");
    path_in_tmp(tok, sizeof tok, "never.tok");
    path_in_tmp(missing, sizeof missing, "missing.txt");
    dt_token_file *f;
    write_file(txt, "", 0);
    ASSERT_STATUS(dt_data_prepare(txt, tok, DT_TOKENIZER_CHAR), DT_ERR_INVALID);
    ASSERT_CONTAINS(dt_last_error(), "empty.txt: the file is empty");
    ASSERT_TRUE(access(tok, F_OK) != 0); /* nothing written */
    ASSERT_STATUS(dt_data_prepare(missing, tok, DT_TOKENIZER_BYTE), DT_ERR_NOT_FOUND);
    ASSERT_CONTAINS(dt_last_error(), "missing.txt: no such file");
    ASSERT_STATUS(dt_token_file_open(&f, tok), DT_ERR_NOT_FOUND);
    ASSERT_TRUE(f == NULL);
    ASSERT_STATUS(dt_data_open(&f, tmpdir, DT_TOKENIZER_BYTE, NULL), DT_ERR_INVALID);
    ASSERT_CONTAINS(dt_last_error(), "not a regular file");
    /* A .tok file that is empty. */
    path_in_tmp(tok, sizeof tok, "empty.tok");
    write_file(tok, "", 0);
    ASSERT_STATUS(dt_token_file_open(&f, tok), DT_ERR_CORRUPT);
    ASSERT_CONTAINS(dt_last_error(), "empty.tok: empty file");
    /* A text file given where a .tok is expected: bad magic. */
    path_in_tmp(tok, sizeof tok, "text.tok");
    const char *words = "this is plain text, not tokens at all; long enough for a header.\n"
                        "this is plain text, not tokens at all; long enough for a header.\n";
    write_file(tok, words, strlen(words));
    ASSERT_STATUS(dt_token_file_open(&f, tok), DT_ERR_CORRUPT);
    ASSERT_CONTAINS(dt_last_error(), "text.tok: bad magic \"this is \"");
    /* Validation text outside the training vocabulary; a .tok with another vocabulary. */
    dt_tokenizer train;
    ASSERT_OK(dt_tokenizer_init_char(&train, "abc\n", 4));
    path_in_tmp(txt, sizeof txt, "val.txt");
    write_file(txt, "abcab\ncad\n", 10);
    ASSERT_STATUS(dt_data_open(&f, txt, DT_TOKENIZER_CHAR, &train), DT_ERR_INVALID);
    ASSERT_CONTAINS(dt_last_error(), "byte 0x64 at offset 8 is not in the char vocabulary (V = 4)");
    path_in_tmp(tok, sizeof tok, "val.tok");
    ASSERT_OK(dt_data_prepare(txt, tok, DT_TOKENIZER_CHAR));
    ASSERT_STATUS(dt_data_open(&f, tok, DT_TOKENIZER_CHAR, &train), DT_ERR_MISMATCH);
    ASSERT_CONTAINS(dt_last_error(),
                    "vocabulary (char, V = 5) differs from the expected one (char, V = 4)");
    /* The same vocabulary passes. */
    ASSERT_OK(dt_tokenizer_init_char(&train, "abcd\n", 5));
    ASSERT_OK(dt_data_open(&f, tok, DT_TOKENIZER_CHAR, &train));
    dt_token_file_close(f);
    /* Splits. */
    size_t end;
    ASSERT_OK(dt_data_split(1000, 0.05, &end));
    ASSERT_EQ(end, 950);
    ASSERT_OK(dt_data_split(1000, 0.0, &end));
    ASSERT_EQ(end, 1000);
    ASSERT_STATUS(dt_data_split(1000, 1.0, &end), DT_ERR_INVALID);
    ASSERT_CONTAINS(dt_last_error(), "validation fraction 1 is outside [0, 1)");
    ASSERT_STATUS(dt_data_split(1000, -0.1, &end), DT_ERR_INVALID);
}

/* Write `img` to `name` in tmpdir and expect open to fail with `msg`. */
static void expect_corrupt(const char *name, const uint8_t *img, size_t len, const char *msg) {
    char path[128];
    path_in_tmp(path, sizeof path, name);
    write_file(path, img, len);
    dt_token_file *f = (dt_token_file *)1;
    dt_error_clear();
    dt_status st = dt_token_file_open(&f, path);
    if (st != DT_ERR_CORRUPT)
        TEST_FAILF("%s: open returned %s, expected DT_ERR_CORRUPT (%s)", name, dt_status_name(st),
                   msg);
    ASSERT_TRUE(f == NULL);
    ASSERT_CONTAINS(dt_last_error(), name);
    ASSERT_CONTAINS(dt_last_error(), msg);
}

/* Re-seal an edited image with a valid checksum, to reach the checks behind it. */
static void reseal(uint8_t *img, size_t len) {
    uint64_t h = dt_hash64(img, len - 8, 0);
    memcpy(img + len - 8, &h, 8);
}

static void test_corruption(void) {
    char txt[128], tok[128];
    path_in_tmp(txt, sizeof txt, "small.txt");
    path_in_tmp(tok, sizeof tok, "small.tok");
    char *text = make_text(101, 2);
    write_file(txt, text, 101);
    ASSERT_OK(dt_data_prepare(txt, tok, DT_TOKENIZER_CHAR));
    size_t len;
    uint8_t *img = read_file(tok, &len);
    uint8_t *bad = malloc(len + 16);

    /* Every single flipped byte is refused. */
    for (size_t i = 0; i < len; i++) {
        memcpy(bad, img, len);
        bad[i] ^= 0x20;
        expect_corrupt("flip.tok", bad, len, "");
    }
    memcpy(bad, img, len);
    bad[200] ^= 1;
    expect_corrupt("flip.tok", bad, len, "checksum mismatch");
    /* Every truncation is refused. */
    for (size_t cut = 0; cut < len; cut++)
        expect_corrupt("cut.tok", img, cut, cut == 0 ? "empty file" : "truncated");
    /* Trailing bytes. */
    memcpy(bad, img, len);
    memset(bad + len, 0, 8);
    expect_corrupt("long.tok", bad, len + 8, "8 unexpected bytes after the end");
    /* Wrong magic, version, vocabulary table and out-of-range token, each
     * with a valid checksum so the specific check is reached. */
    memcpy(bad, img, len);
    memcpy(bad, "GGUF\0\0\0\0", 8);
    expect_corrupt("magic.tok", bad, len, "bad magic \"GGUF????\"");
    memcpy(bad, img, len);
    bad[8] = 3;
    reseal(bad, len);
    expect_corrupt("version.tok", bad, len, "unsupported version 3 (this build reads 1 and 2)");
    memcpy(bad, img, len);
    bad[12] = 9;
    reseal(bad, len);
    expect_corrupt("kind.tok", bad, len, "unknown tokenizer kind 9");
    memcpy(bad, img, len);
    bad[64 + 1] = bad[64]; /* two ids for one byte */
    reseal(bad, len);
    expect_corrupt("table.tok", bad, len, "not strictly increasing at id 1");
    memcpy(bad, img, len);
    uint32_t vocab;
    memcpy(&vocab, img + 16, 4);
    size_t tok0 = 64 + ((vocab + 7) & ~7u);
    /* Nonzero padding after the table (V = 26) and after the 101 tokens. */
    ASSERT_EQ(vocab % 8 != 0, 1);
    memcpy(bad, img, len);
    bad[64 + vocab] = 1;
    reseal(bad, len);
    expect_corrupt("vpad.tok", bad, len, "padding byte");
    memcpy(bad, img, len);
    bad[tok0 + 2 * 101] = 1;
    reseal(bad, len);
    expect_corrupt("tpad.tok", bad, len, "after the tokens is not zero");
    memcpy(bad, img, len);
    uint16_t big = (uint16_t)vocab;
    memcpy(bad + tok0 + 2 * 17, &big, 2);
    reseal(bad, len);
    char msg[96];
    snprintf(msg, sizeof msg, "token %u at index 17 is outside the vocabulary (V = %u)", vocab,
             vocab);
    expect_corrupt("token.tok", bad, len, msg);
    /* The intact file still opens. */
    dt_token_file *f;
    ASSERT_OK(dt_token_file_open(&f, tok));
    dt_token_file_close(f);
    free(bad);
    free(img);
    free(text);
}

/* Random edits of the header and vocabulary, re-sealed with a valid
 * checksum so they reach the structural checks: open must either refuse the
 * file with DT_ERR_CORRUPT or return one whose invariants hold (under ASan
 * this also shows that no check reads outside the file). */
static void test_fuzz_header(void) {
    char txt[128], tok[128], path[128];
    path_in_tmp(txt, sizeof txt, "fuzz.txt");
    path_in_tmp(tok, sizeof tok, "fuzz.tok");
    path_in_tmp(path, sizeof path, "fuzzed.tok");
    char *text = make_text(300, 4);
    write_file(txt, text, 300);
    ASSERT_OK(dt_data_prepare(txt, tok, DT_TOKENIZER_CHAR));
    size_t len;
    uint8_t *img = read_file(tok, &len);
    uint8_t *bad = malloc(len);
    dt_rng r;
    dt_rng_init(&r, 5, dt_rng_stream_id(0, 2, DT_RNG_TEST));
    int refused = 0, accepted = 0;
    for (int iter = 0; iter < 1500; iter++) {
        memcpy(bad, img, len);
        int edits = 1 + (int)dt_rng_below(&r, 3);
        for (int e = 0; e < edits; e++) {
            size_t at = dt_rng_below(&r, 64 + 32); /* header and vocabulary table */
            bad[at] = dt_rng_below(&r, 4) == 0 ? 0 : (uint8_t)dt_rng_u32(&r);
        }
        reseal(bad, len);
        write_file(path, bad, len);
        dt_token_file *f = NULL;
        dt_status st = dt_token_file_open(&f, path);
        if (st == DT_OK) {
            const dt_tokenizer *t = dt_token_file_tokenizer(f);
            const uint16_t *tk = dt_token_file_tokens(f);
            ASSERT_TRUE(t->vocab_size >= 1 && t->vocab_size <= 256);
            ASSERT_EQ(dt_token_file_bytes(f), len);
            for (size_t i = 0; i < dt_token_file_count(f); i++)
                ASSERT_TRUE(tk[i] < t->vocab_size);
            dt_token_file_close(f);
            accepted++;
        } else {
            if (st != DT_ERR_CORRUPT)
                TEST_FAILF("iteration %d: %s, expected DT_ERR_CORRUPT", iter, dt_status_name(st));
            ASSERT_TRUE(f == NULL);
            ASSERT_CONTAINS(dt_last_error(), "fuzzed.tok: ");
            refused++;
        }
    }
    printf("  fuzzed headers: %d refused, %d accepted (edits that kept the file valid)\n", refused,
           accepted);
    ASSERT_TRUE(refused > 1000);
    free(bad);
    free(img);
    free(text);
}

/* ---- loader ---- */

#define LT 8 /* sequence length of the loader tests */

static dt_token_file *loader_file(size_t n) {
    char txt[128];
    path_in_tmp(txt, sizeof txt, "loader.txt");
    char *text = make_text(n, 3);
    write_file(txt, text, n);
    free(text);
    dt_token_file *f;
    ASSERT_OK(dt_token_file_from_text(&f, txt, DT_TOKENIZER_BYTE, NULL));
    return f;
}

/* The window index a row came from, checking that it is a real window. */
static size_t window_of(const dt_token_file *f, size_t begin, size_t end, const int32_t *in,
                        const int32_t *tg) {
    const uint16_t *tk = dt_token_file_tokens(f);
    for (int t = 0; t + 1 < LT; t++)
        ASSERT_EQ(tg[t], in[t + 1]);
    for (size_t w = 0; begin + w * LT + LT + 1 <= end; w++) {
        const uint16_t *s = tk + begin + w * LT;
        bool same = true;
        for (int t = 0; t < LT && same; t++)
            same = in[t] == s[t] && tg[t] == s[t + 1];
        if (same)
            return w;
    }
    TEST_FAILF("a batch row is no window of the range [%zu, %zu)", begin, end);
}

static void test_loader_shards(void) {
    /* Text random enough that every window is unique: 8-token windows over 28 letters. */
    dt_token_file *f = loader_file(4001);
    const size_t begin = 1, end = 3999;
    const int B = 3;
    const size_t W = (end - begin - 1) / LT;
    /* One rank with batch N*B vs N ranks with batch B, over two epochs. */
    for (int N = 1; N <= 4; N++) {
        dt_loader *big, *ranks[4];
        ASSERT_OK(dt_loader_create(&big, f, begin, end, N * B, LT, 42, 0, 1));
        ASSERT_EQ(dt_loader_windows(big), W);
        for (int r = 0; r < N; r++)
            ASSERT_OK(dt_loader_create(&ranks[r], f, begin, end, B, LT, 42, r, N));
        uint64_t spe = dt_loader_steps_per_epoch(big);
        ASSERT_EQ(spe, W / (size_t)(N * B));
        ASSERT_EQ(dt_loader_steps_per_epoch(ranks[0]), spe);
        int32_t bin[4 * 3 * LT], btg[4 * 3 * LT], rin[3 * LT], rtg[3 * LT];
        for (int epoch = 0; epoch < 2; epoch++) {
            char *seen = calloc(W, 1);
            for (uint64_t s = 0; s < spe; s++) {
                ASSERT_OK(dt_loader_next(big, bin, btg));
                for (int r = 0; r < N; r++) {
                    ASSERT_OK(dt_loader_next(ranks[r], rin, rtg));
                    /* Rank r's rows are rows [r*B, (r+1)*B) of the big batch. */
                    ASSERT_EQ(memcmp(rin, bin + r * B * LT, sizeof rin), 0);
                    ASSERT_EQ(memcmp(rtg, btg + r * B * LT, sizeof rtg), 0);
                }
                /* No window twice in an epoch: shares are disjoint. */
                for (int b = 0; b < N * B; b++) {
                    size_t w = window_of(f, begin, end, bin + b * LT, btg + b * LT);
                    if (seen[w])
                        TEST_FAILF("N=%d epoch %d step %llu: window %zu seen twice", N, epoch,
                                   (unsigned long long)s, w);
                    seen[w] = 1;
                }
            }
            dt_loader_state st = dt_loader_get_state(big);
            ASSERT_EQ(st.epoch, (uint64_t)epoch + 1);
            ASSERT_EQ(st.step, 0);
            free(seen);
        }
        dt_loader_destroy(big);
        for (int r = 0; r < N; r++)
            dt_loader_destroy(ranks[r]);
    }
    dt_token_file_close(f);
}

static void test_loader_determinism_and_resume(void) {
    dt_token_file *f = loader_file(2000);
    enum { B = 4 };
    dt_loader *a, *b, *c;
    ASSERT_OK(dt_loader_create(&a, f, 0, 2000, B, LT, 7, 1, 2));
    ASSERT_OK(dt_loader_create(&b, f, 0, 2000, B, LT, 7, 1, 2));
    ASSERT_OK(dt_loader_create(&c, f, 0, 2000, B, LT, 8, 1, 2));
    uint64_t spe = dt_loader_steps_per_epoch(a); /* 249 windows / 8 = 31 */
    ASSERT_EQ(spe, 31);
    int32_t in1[B * LT], tg1[B * LT], in2[B * LT], tg2[B * LT];
    int differ = 0;
    /* Same seed: same batches; another seed: other batches; epochs differ. */
    int32_t first_epoch0[B * LT];
    for (uint64_t s = 0; s < 2 * spe; s++) {
        ASSERT_OK(dt_loader_next(a, in1, tg1));
        ASSERT_OK(dt_loader_next(b, in2, tg2));
        ASSERT_EQ(memcmp(in1, in2, sizeof in1), 0);
        ASSERT_EQ(memcmp(tg1, tg2, sizeof tg1), 0);
        ASSERT_OK(dt_loader_next(c, in2, tg2));
        differ += memcmp(in1, in2, sizeof in1) != 0;
        if (s == 0)
            memcpy(first_epoch0, in1, sizeof in1);
        if (s == spe)
            ASSERT_TRUE(memcmp(first_epoch0, in1, sizeof in1) != 0);
    }
    ASSERT_TRUE(differ > (int)spe);

    /* Save at step 20 of epoch 2, record 30 batches (crossing into epoch 3),
     * restore a fresh loader there and get the same 30 batches. */
    for (uint64_t s = 0; s < 20; s++)
        ASSERT_OK(dt_loader_next(a, in1, tg1));
    dt_loader_state saved = dt_loader_get_state(a);
    ASSERT_EQ(saved.epoch, 2);
    ASSERT_EQ(saved.step, 20);
    int32_t rec_in[30][B * LT], rec_tg[30][B * LT];
    for (int s = 0; s < 30; s++)
        ASSERT_OK(dt_loader_next(a, rec_in[s], rec_tg[s]));
    ASSERT_EQ(dt_loader_get_state(a).epoch, 3);
    dt_loader *d;
    ASSERT_OK(dt_loader_create(&d, f, 0, 2000, B, LT, 7, 1, 2));
    ASSERT_OK(dt_loader_set_state(d, saved));
    for (int s = 0; s < 30; s++) {
        ASSERT_OK(dt_loader_next(d, in1, tg1));
        ASSERT_EQ(memcmp(in1, rec_in[s], sizeof in1), 0);
        ASSERT_EQ(memcmp(tg1, rec_tg[s], sizeof tg1), 0);
    }
    ASSERT_STATUS(dt_loader_set_state(d, (dt_loader_state){.epoch = 0, .step = 31}),
                  DT_ERR_INVALID);
    ASSERT_CONTAINS(dt_last_error(), "saved step 31 is outside the 31 steps of an epoch");
    dt_loader_destroy(a);
    dt_loader_destroy(b);
    dt_loader_destroy(c);
    dt_loader_destroy(d);
    dt_loader_destroy(NULL);
    dt_token_file_close(f);
}

static void test_loader_bad_arguments(void) {
    dt_token_file *f = loader_file(100);
    dt_loader *l = (dt_loader *)1;
    ASSERT_STATUS(dt_loader_create(&l, f, 0, 100, 0, LT, 1, 0, 1), DT_ERR_INVALID);
    ASSERT_CONTAINS(dt_last_error(), "batch size 0 must be >= 1");
    ASSERT_TRUE(l == NULL);
    ASSERT_STATUS(dt_loader_create(&l, f, 0, 100, 1, 0, 1, 0, 1), DT_ERR_INVALID);
    ASSERT_CONTAINS(dt_last_error(), "sequence length 0");
    ASSERT_STATUS(dt_loader_create(&l, f, 0, 100, 1, LT, 1, 2, 2), DT_ERR_INVALID);
    ASSERT_CONTAINS(dt_last_error(), "rank 2 is outside [0, 2)");
    ASSERT_STATUS(dt_loader_create(&l, f, 0, 101, 1, LT, 1, 0, 1), DT_ERR_INVALID);
    ASSERT_CONTAINS(dt_last_error(), "token range [0, 101) is empty or outside");
    ASSERT_STATUS(dt_loader_create(&l, f, 50, 50, 1, LT, 1, 0, 1), DT_ERR_INVALID);
    ASSERT_STATUS(dt_loader_create(&l, f, 0, 100, 1, 100, 1, 0, 1), DT_ERR_INVALID);
    ASSERT_CONTAINS(dt_last_error(), "100 tokens are shorter than one window of T+1 = 101 tokens");
    ASSERT_OK(dt_loader_create(&l, f, 0, 100, 1, 99, 1, 0, 1)); /* exactly one window */
    ASSERT_EQ(dt_loader_windows(l), 1);
    dt_loader_destroy(l);
    ASSERT_STATUS(dt_loader_create(&l, f, 0, 100, 4, 32, 1, 0, 2), DT_ERR_INVALID);
    ASSERT_CONTAINS(dt_last_error(), "make 3 windows of 32+1, fewer than one global batch of 2 "
                                     "ranks x 4 = 8");
    dt_token_file_close(f);
}

/* ---- byte-level BPE (the GPT-2 comparison is tests/tokenizer_gpt2.sh) ---- */

static void test_bpe(void) {
    /* GPT-2's pattern, by hand: contractions, one space kept before a
     * word, a run of spaces giving up its last, a newline never leading. */
    const char *s = "I'm  here\n\n  x 12ab,,!  ";
    const char *want[] = {"I", "'m", " ", " here", "\n\n ", " x", " 12", "ab", ",,!", "  "};
    size_t at = 0, len = strlen(s);
    for (size_t k = 0; k < sizeof want / sizeof want[0]; k++) {
        size_t n = dt_bpe_split(s, len, at);
        ASSERT_EQ(n, strlen(want[k]));
        ASSERT_TRUE(memcmp(s + at, want[k], n) == 0);
        at += n;
    }
    ASSERT_EQ(at, len);
    /* Letters of other scripts and numbers of other scripts are runs too. */
    const char *u = "Привет мир ١٢٣ 日本語";
    ASSERT_EQ(dt_bpe_split(u, strlen(u), 0), strlen("Привет"));
    ASSERT_EQ(dt_bpe_split(u, strlen(u), strlen("Привет мир")), strlen(" ١٢٣"));

    /* Learn, save, load: the same tokens, and text round-trips. */
    size_t n = 20000;
    char *text = make_text(n, 7);
    dt_bpe *b, *c;
    ASSERT_OK(dt_bpe_train(&b, text, n, 300));
    ASSERT_EQ(dt_bpe_vocab_size(b), 300);
    ASSERT_OK(dt_bpe_save(b, tmpdir));
    ASSERT_OK(dt_bpe_open(&c, tmpdir));
    ASSERT_EQ(dt_bpe_hash(b), dt_bpe_hash(c));
    int32_t *ids = NULL;
    size_t nids = 0;
    ASSERT_OK(dt_bpe_encode(c, text, n, &ids, &nids));
    ASSERT_TRUE(nids < n); /* merges happened */
    char *back = malloc(n + 1);
    size_t m = 0;
    for (size_t i = 0; i < nids; i++) {
        size_t l;
        const uint8_t *t = dt_bpe_token(c, ids[i], &l);
        ASSERT_TRUE(t != NULL && m + l <= n);
        memcpy(back + m, t, l);
        m += l;
    }
    ASSERT_EQ(m, n);
    ASSERT_TRUE(memcmp(back, text, n) == 0);
    /* A .tok of it (version 2) opens with the same tokens and hash. */
    char txt[128], tokp[128];
    path_in_tmp(txt, sizeof txt, "bpe.txt");
    path_in_tmp(tokp, sizeof tokp, "bpe.tok");
    write_file(txt, text, n);
    dt_tokenizer tk;
    dt_tokenizer_init_bpe(&tk, c);
    ASSERT_OK(dt_data_prepare_with(txt, tokp, &tk));
    dt_token_file *f;
    ASSERT_OK(dt_token_file_open(&f, tokp));
    ASSERT_EQ(dt_token_file_count(f), nids);
    ASSERT_EQ(dt_token_file_tokenizer(f)->kind, DT_TOKENIZER_BPE);
    ASSERT_EQ(dt_token_file_tokenizer(f)->bpe_hash, dt_bpe_hash(c));
    ASSERT_TRUE(dt_tokenizer_equal(dt_token_file_tokenizer(f), &tk));
    for (size_t i = 0; i < nids; i++)
        ASSERT_EQ(dt_token_file_tokens(f)[i], (uint16_t)ids[i]);
    dt_token_file_close(f);
    dt_bpe *bad; /* not b: a failing call sets its output to NULL */
    ASSERT_STATUS(dt_bpe_train(&bad, text, n, 100), DT_ERR_INVALID);
    ASSERT_STATUS(dt_bpe_open(&bad, "/nonexistent"), DT_ERR_NOT_FOUND);
    free(back);
    free(ids);
    free(text);
    dt_bpe_destroy(c);
    dt_bpe_destroy(b);
}

int main(void) {
    const char *base = getenv("TMPDIR");
    snprintf(tmpdir, sizeof tmpdir, "%s/dt_test_data_XXXXXX", base && *base ? base : "/tmp");
    if (!mkdtemp(tmpdir))
        TEST_FAILF("mkdtemp %s failed", tmpdir);
    RUN(test_tokenizer_round_trip);
    RUN(test_prepare_and_open);
    RUN(test_bad_inputs);
    RUN(test_corruption);
    RUN(test_fuzz_header);
    RUN(test_loader_shards);
    RUN(test_loader_determinism_and_resume);
    RUN(test_loader_bad_arguments);
    RUN(test_bpe);
    /* Remove the scratch directory (flat). */
    DIR *d = opendir(tmpdir);
    struct dirent *e;
    char p[512];
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
        snprintf(p, sizeof p, "%s/%s", tmpdir, e->d_name);
        unlink(p);
    }
    closedir(d);
    rmdir(tmpdir);
    return TEST_SUMMARY();
}
