/*
 * test_file_corrupt.c — every file format dtrain reads (token files, weights
 * files, checkpoints) against damage: truncated at every short length and at
 * random ones, random bytes flipped, bytes inserted, junk appended (or the
 * file joined to a copy of itself), and paths that are not regular files (a
 * directory, a FIFO, a device). Each damaged file must be refused with a
 * status other than DT_OK and a message naming the file; nothing may crash,
 * leak (ASan) or block (a FIFO is never waited on).
 *
 * The random part runs for DT_TEST_FUZZ_SECONDS per format (default 1.5);
 * DT_TEST_SEED replays a run (the seed is printed).
 */
#include "dtrain/data.h"
#include "dtrain/nn.h"
#include "dtrain/train.h"
#include "test.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

static char dir[] = "/tmp/dt_corrupt.XXXXXX";
static uint64_t rng_state;

static uint64_t rnd(void) { /* splitmix64 */
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

typedef struct format {
    const char *name;
    dt_status (*load)(const char *path); /* opens, validates and closes */
    unsigned char *good;                 /* a valid file's bytes */
    size_t size;
} format;

static dt_status load_tok(const char *path) {
    dt_token_file *f = NULL;
    dt_status st = dt_token_file_open(&f, path);
    dt_token_file_close(f);
    return st;
}

static dt_status load_weights(const char *path) {
    dt_gpt *m = NULL;
    uint8_t vocab[256];
    int vlen = 0;
    dt_status st = dt_gpt_load_weights(&m, path, 1, 16, vocab, &vlen);
    dt_gpt_destroy(m);
    return st;
}

static dt_status load_ckpt(const char *path) {
    dt_ckpt *ck = NULL;
    dt_status st = dt_ckpt_open(&ck, path);
    dt_ckpt_close(ck);
    return st;
}

static void slurp(const char *path, unsigned char **data, size_t *len) {
    FILE *f = fopen(path, "rb");
    ASSERT_TRUE(f != NULL);
    ASSERT_EQ(fseek(f, 0, SEEK_END), 0);
    long n = ftell(f);
    ASSERT_TRUE(n > 0);
    rewind(f);
    *data = malloc((size_t)n);
    ASSERT_EQ(fread(*data, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    *len = (size_t)n;
}

static void spill(const char *path, const unsigned char *data, size_t len) {
    FILE *f = fopen(path, "wb");
    ASSERT_TRUE(f != NULL);
    ASSERT_EQ(fwrite(data, 1, len, f), len);
    ASSERT_EQ(fclose(f), 0);
}

/* The damaged bytes must be refused, with the path in the message. */
static void expect_refused(const format *fm, const char *path, const char *what) {
    dt_error_clear();
    dt_status st = fm->load(path);
    if (st == DT_OK)
        TEST_FAILF("%s: %s was accepted", fm->name, what);
    if (!strstr(dt_last_error(), path))
        TEST_FAILF("%s: %s: the message does not name the file: %s", fm->name, what,
                   dt_last_error());
}

static void make_files(format *fmts) {
    char path[512], txt[512];
    /* a token file */
    snprintf(txt, sizeof txt, "%s/in.txt", dir);
    FILE *f = fopen(txt, "w");
    ASSERT_TRUE(f != NULL);
    for (int i = 0; i < 300; i++)
        fprintf(f, "line %d of a small corpus for the corruption sweep.\n", i);
    fclose(f);
    snprintf(path, sizeof path, "%s/good.tok", dir);
    ASSERT_OK(dt_data_prepare(txt, path, DT_TOKENIZER_CHAR));
    slurp(path, &fmts[0].good, &fmts[0].size);
    /* a weights file */
    dt_gpt_config c;
    ASSERT_OK(dt_gpt_preset("tiny", &c));
    dt_gpt *m = NULL;
    ASSERT_OK(dt_gpt_create(&m, &c, 1, 16));
    dt_gpt_init_params(m, 7);
    uint8_t vocab[256];
    for (int i = 0; i < c.vocab; i++)
        vocab[i] = (uint8_t)i;
    snprintf(path, sizeof path, "%s/good.weights", dir);
    ASSERT_OK(dt_gpt_save_weights(m, path, vocab, c.vocab));
    dt_gpt_destroy(m);
    slurp(path, &fmts[1].good, &fmts[1].size);
    /* a checkpoint */
    float params[1000];
    int64_t step = 42;
    for (int i = 0; i < 1000; i++)
        params[i] = (float)i * 0.25f;
    dt_ckpt_section s[] = {{"step", DT_CKPT_I64, &step, 1},
                           {"params", DT_CKPT_F32, params, 1000},
                           {"note", DT_CKPT_BYTES, "corruption sweep", 16}};
    snprintf(path, sizeof path, "%s/good.ckpt", dir);
    ASSERT_OK(dt_ckpt_write_file(path, s, 3));
    slurp(path, &fmts[2].good, &fmts[2].size);
    for (int i = 0; i < 3; i++) {
        snprintf(path, sizeof path, "%s/good.%s", dir,
                 i == 0   ? "tok"
                 : i == 1 ? "weights"
                          : "ckpt");
        ASSERT_OK(fmts[i].load(path));
        unlink(path);
    }
    unlink(txt);
}

/* Paths that are not regular files: refused at once as such. */
static void sweep_special(const format *fm) {
    char path[512];
    const char *kinds[] = {"dir", "fifo", "zero"};
    for (int k = 0; k < 3; k++) {
        snprintf(path, sizeof path, "%s/%s.%s", dir, fm->name, kinds[k]);
        if (k == 0)
            ASSERT_EQ(mkdir(path, 0700), 0);
        else if (k == 1)
            ASSERT_EQ(mkfifo(path, 0600), 0);
        else
            ASSERT_EQ(symlink("/dev/zero", path), 0);
        double t0 = dt_now();
        dt_status st = fm->load(path);
        if (st != DT_ERR_INVALID || !strstr(dt_last_error(), "not a regular file"))
            TEST_FAILF("%s: a %s as the file gave %s: %s (expected DT_ERR_INVALID, \"not a "
                       "regular file\")",
                       fm->name, kinds[k], dt_status_name(st), dt_last_error());
        ASSERT_TRUE(dt_now() - t0 < 5);
        ASSERT_EQ(k == 0 ? rmdir(path) : unlink(path), 0);
    }
    snprintf(path, sizeof path, "%s/%s.missing", dir, fm->name);
    ASSERT_STATUS(fm->load(path), DT_ERR_NOT_FOUND);
}

static int sweep(const format *fm, double seconds) {
    char path[512];
    snprintf(path, sizeof path, "%s/damaged.%s", dir, fm->name);
    size_t n = fm->size, cap = 2 * n + 8192;
    unsigned char *buf = malloc(cap);
    ASSERT_TRUE(buf != NULL);
    char what[128];
    int tried = 0;
    /* every short length, and the last 64 */
    for (size_t len = 0; len < n; len++) {
        if (len >= 512 && len + 64 < n)
            continue;
        spill(path, fm->good, len);
        snprintf(what, sizeof what, "the file cut to %zu of %zu bytes", len, n);
        expect_refused(fm, path, what);
        tried++;
    }
    /* the file joined to itself, and a byte after the end */
    memcpy(buf, fm->good, n);
    memcpy(buf + n, fm->good, n);
    spill(path, buf, 2 * n);
    expect_refused(fm, path, "two copies joined");
    spill(path, buf, n + 1);
    expect_refused(fm, path, "one byte of junk after the end");
    tried += 2;
    for (double t0 = dt_now(); dt_now() - t0 < seconds;) {
        size_t len = n;
        memcpy(buf, fm->good, n);
        switch (rnd() % 4) {
        case 0: { /* flip 1-4 bytes */
            int k = 1 + (int)(rnd() % 4);
            for (int i = 0; i < k; i++)
                buf[rnd() % n] ^= (unsigned char)(1 + rnd() % 255);
            /* two flips of one byte may cancel: make sure something changed */
            if (memcmp(buf, fm->good, n) == 0)
                buf[rnd() % n] ^= 0x80;
            snprintf(what, sizeof what, "%d flipped byte(s)", k);
            break;
        }
        case 1: /* truncated anywhere */
            len = (size_t)(rnd() % n);
            snprintf(what, sizeof what, "the file cut to %zu of %zu bytes", len, n);
            break;
        case 2: { /* junk appended */
            static const size_t sizes[] = {1, 7, 64, 4096};
            size_t j = sizes[rnd() % 4];
            for (size_t i = 0; i < j; i++)
                buf[n + i] = (unsigned char)rnd();
            len = n + j;
            snprintf(what, sizeof what, "%zu bytes of junk appended", j);
            break;
        }
        default: { /* bytes inserted in the middle */
            size_t at = (size_t)(rnd() % n), j = 1 + (size_t)(rnd() % 64);
            memmove(buf + at + j, fm->good + at, n - at);
            for (size_t i = 0; i < j; i++)
                buf[at + i] = (unsigned char)rnd();
            len = n + j;
            snprintf(what, sizeof what, "%zu bytes inserted at %zu", j, at);
            break;
        }
        }
        spill(path, buf, len);
        expect_refused(fm, path, what);
        tried++;
    }
    unlink(path);
    free(buf);
    return tried;
}

int main(void) {
    const char *seed_text = getenv("DT_TEST_SEED");
    rng_state = seed_text ? strtoull(seed_text, NULL, 0) : dt_now_ns();
    const char *sec_text = getenv("DT_TEST_FUZZ_SECONDS");
    double seconds = sec_text ? atof(sec_text) : 1.5;
    printf("seed %llu (DT_TEST_SEED replays it), %.1f s per format\n",
           (unsigned long long)rng_state, seconds);
    /* A loader that waits on a FIFO never returns: end the test instead. */
    alarm((unsigned)(3 * seconds) + 120);
    ASSERT_TRUE(mkdtemp(dir) != NULL);
    format fmts[3] = {{"tok", load_tok, NULL, 0},
                      {"weights", load_weights, NULL, 0},
                      {"ckpt", load_ckpt, NULL, 0}};
    test__current = "make_files";
    make_files(fmts);
    for (int i = 0; i < 3; i++) {
        test__current = fmts[i].name;
        sweep_special(&fmts[i]);
        int tried = sweep(&fmts[i], seconds);
        printf("ok %s: %zu-byte file, %d damaged copies refused, directory/FIFO/device refused\n",
               fmts[i].name, fmts[i].size, tried);
        free(fmts[i].good);
        test__run_count++;
    }
    ASSERT_EQ(rmdir(dir), 0);
    return TEST_SUMMARY();
}
