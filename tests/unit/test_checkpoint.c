/*
 * test_checkpoint.c — the checkpoint container: round trip, every kind of
 * damage refused with a message naming file and problem, keep-K rotation,
 * fallback to an older file, and SIGKILL of a writer at random instants.
 */
#define _XOPEN_SOURCE 700
#include "dtrain/train.h"
#include "test.h"

#include <dirent.h>
#include <fcntl.h>
#include <ftw.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static char tmpdir[256];

static int rm_entry(const char *p, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb, (void)flag, (void)ftw;
    return remove(p);
}

static void make_tmpdir(void) {
    const char *base = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    snprintf(tmpdir, sizeof tmpdir, "%s/dt_ckpt_XXXXXX", base);
    ASSERT_TRUE(mkdtemp(tmpdir) != NULL);
}

static void remove_tmpdir(void) { nftw(tmpdir, rm_entry, 16, FTW_DEPTH | FTW_PHYS); }

/* Parameters whose values depend on the step, so a loaded file proves which
 * step it holds and that its content is not mixed with another step's. */
enum { NPARAM = 1000 };
static float params[NPARAM];
static double mom[17];
static int64_t step_val;
static const char *config_text = "{\"model\": \"tiny\", \"layers\": 2}";

static void fill(int64_t step) {
    for (int i = 0; i < NPARAM; i++)
        params[i] = (float)(step * 1000 + i);
    for (int i = 0; i < 17; i++)
        mom[i] = (double)step + 0.5 * i;
    step_val = step;
}

static size_t sections(dt_ckpt_section *s) {
    s[0] = (dt_ckpt_section){"params", DT_CKPT_F32, params, NPARAM};
    s[1] = (dt_ckpt_section){"momentum", DT_CKPT_F64, mom, 17};
    s[2] = (dt_ckpt_section){"step", DT_CKPT_I64, &step_val, 1};
    s[3] = (dt_ckpt_section){"config", DT_CKPT_TEXT, config_text, strlen(config_text)};
    s[4] = (dt_ckpt_section){"empty", DT_CKPT_BYTES, NULL, 0};
    return 5;
}

/* The checkpoint holds exactly what fill(step) produced. */
static void expect_step(const dt_ckpt *ck, int64_t step) {
    float p[NPARAM];
    double m[17];
    int64_t s;
    ASSERT_OK(dt_ckpt_read(ck, "step", DT_CKPT_I64, &s, 1));
    ASSERT_EQ(s, step);
    ASSERT_OK(dt_ckpt_read(ck, "params", DT_CKPT_F32, p, NPARAM));
    ASSERT_OK(dt_ckpt_read(ck, "momentum", DT_CKPT_F64, m, 17));
    for (int i = 0; i < NPARAM; i++)
        if (p[i] != (float)(step * 1000 + i))
            TEST_FAILF("params[%d] = %g, expected %g", i, p[i], (double)(step * 1000 + i));
    for (int i = 0; i < 17; i++)
        ASSERT_EQ(m[i] * 2, (double)step * 2 + i);
}

static void test_roundtrip(void) {
    make_tmpdir();
    dt_ckpt_section s[8];
    size_t n = sections(s);
    fill(42);
    char path[512];
    snprintf(path, sizeof path, "%s/one.dtck", tmpdir);
    ASSERT_OK(dt_ckpt_write_file(path, s, n));
    dt_ckpt *ck;
    ASSERT_OK(dt_ckpt_open(&ck, path));
    ASSERT_EQ(dt_ckpt_num_sections(ck), 5);
    ASSERT_EQ(dt_ckpt_version(ck), DT_CKPT_VERSION);
    expect_step(ck, 42);
    dt_ckpt_info info;
    ASSERT_OK(dt_ckpt_find(ck, "config", &info));
    ASSERT_EQ(info.type, DT_CKPT_TEXT);
    ASSERT_EQ(info.bytes, strlen(config_text));
    ASSERT_TRUE(memcmp(info.data, config_text, info.bytes) == 0);
    ASSERT_EQ(info.offset % 64, 0);
    ASSERT_OK(dt_ckpt_find(ck, "empty", &info));
    ASSERT_EQ(info.count, 0);
    /* Shape and type mismatches name the section and both shapes. */
    float small[10];
    ASSERT_STATUS(dt_ckpt_read(ck, "params", DT_CKPT_F32, small, 10), DT_ERR_MISMATCH);
    ASSERT_CONTAINS(dt_last_error(), "'params' holds 1000 f32 values, expected 10 f32");
    ASSERT_STATUS(dt_ckpt_read(ck, "step", DT_CKPT_F64, small, 1), DT_ERR_MISMATCH);
    ASSERT_CONTAINS(dt_last_error(), "i64");
    ASSERT_STATUS(dt_ckpt_read(ck, "nope", DT_CKPT_F32, small, 1), DT_ERR_MISMATCH);
    ASSERT_CONTAINS(dt_last_error(), "no section 'nope'");
    dt_ckpt_close(ck);
    dt_ckpt_close(NULL);

    /* Bad sections are refused before anything is written. */
    dt_ckpt_section dup[2] = {s[0], s[0]};
    ASSERT_STATUS(dt_ckpt_write_file(path, dup, 2), DT_ERR_INVALID);
    ASSERT_CONTAINS(dt_last_error(), "two sections named params");
    dt_ckpt_section longname = {"a_section_name_that_is_far_too_long", DT_CKPT_F32, params, 1};
    ASSERT_STATUS(dt_ckpt_write_file(path, &longname, 1), DT_ERR_INVALID);
    ASSERT_OK(dt_ckpt_open(&ck, path)); /* the earlier file is untouched */
    dt_ckpt_close(ck);
    ASSERT_STATUS(dt_ckpt_open(&ck, "/nonexistent/x.dtck"), DT_ERR_NOT_FOUND);
    ASSERT_CONTAINS(dt_last_error(), "/nonexistent/x.dtck");
    remove_tmpdir();
}

static unsigned char *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    ASSERT_TRUE(f != NULL);
    fseek(f, 0, SEEK_END);
    *len = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc(*len);
    ASSERT_EQ(fread(b, 1, *len, f), *len);
    fclose(f);
    return b;
}

static void spit(const char *path, const unsigned char *b, size_t len) {
    FILE *f = fopen(path, "wb");
    ASSERT_TRUE(f != NULL);
    ASSERT_EQ(fwrite(b, 1, len, f), len);
    fclose(f);
}

/* Write a damaged copy and expect open() to refuse it with `needle`. */
static void expect_refused(const unsigned char *good, size_t len, size_t newlen,
                           void (*damage)(unsigned char *, size_t), const char *needle) {
    char path[512];
    snprintf(path, sizeof path, "%s/bad.dtck", tmpdir);
    unsigned char *b = malloc(len);
    memcpy(b, good, len);
    if (damage)
        damage(b, len);
    spit(path, b, newlen);
    free(b);
    dt_ckpt *ck = NULL;
    ASSERT_STATUS(dt_ckpt_open(&ck, path), DT_ERR_CORRUPT);
    ASSERT_TRUE(ck == NULL);
    ASSERT_CONTAINS(dt_last_error(), path);
    ASSERT_CONTAINS(dt_last_error(), needle);
}

static void flip_data_byte(unsigned char *b, size_t len) { b[len / 2] ^= 0x10; }
static void wrong_magic(unsigned char *b, size_t len) { memcpy(b, "GGUF\0\0\0\0", 8); }
static void wrong_version(unsigned char *b, size_t len) { b[8] = 7; }
static void huge_section(unsigned char *b, size_t len) {
    /* First table entry: name[32] type reserved count offset bytes. */
    uint64_t count = 1ull << 60, bytes = count * 4;
    memcpy(b + 64 + 40, &count, 8);
    memcpy(b + 64 + 56, &bytes, 8);
}
static void overflow_section(unsigned char *b, size_t len) {
    uint64_t count = (1ull << 62) + 1; /* count * 4 overflows */
    memcpy(b + 64 + 40, &count, 8);
}
static void many_sections(unsigned char *b, size_t len) {
    uint32_t n = 1u << 30;
    memcpy(b + 12, &n, 4);
}
static void flip_trailer(unsigned char *b, size_t len) { b[len - 3] ^= 1; }
static void flip_header_reserved(unsigned char *b, size_t len) { b[40] ^= 1; }

static void test_corruption_refused(void) {
    make_tmpdir();
    dt_ckpt_section s[8];
    size_t n = sections(s);
    fill(7);
    char path[512];
    snprintf(path, sizeof path, "%s/good.dtck", tmpdir);
    ASSERT_OK(dt_ckpt_write_file(path, s, n));
    size_t len;
    unsigned char *good = slurp(path, &len);

    expect_refused(good, len, len, flip_data_byte, "checksum mismatch");
    expect_refused(good, len, len, flip_header_reserved, "checksum mismatch");
    expect_refused(good, len, len - 1, NULL, "truncated");
    expect_refused(good, len, len / 2, NULL, "truncated");
    expect_refused(good, len, 10, NULL, "shorter than a header");
    expect_refused(good, len, 0, NULL, "shorter than a header");
    expect_refused(good, len, len, wrong_magic, "not a dtrain checkpoint");
    expect_refused(good, len, len, wrong_version, "format version 7, this build reads version 1");
    expect_refused(good, len, len, huge_section, "lies outside the file");
    expect_refused(good, len, len, overflow_section, "do not match");
    expect_refused(good, len, len, many_sections, "sections, at most");
    expect_refused(good, len, len, flip_trailer, "end marker missing");

    /* Flip every byte of the header and table in turn (each alone): all are
     * refused, by structure checks or by the checksum. */
    char bad[512];
    snprintf(bad, sizeof bad, "%s/bad.dtck", tmpdir);
    for (size_t i = 0; i < 64 + 5 * 64; i++) {
        good[i] ^= 0x81;
        spit(bad, good, len);
        good[i] ^= 0x81;
        dt_ckpt *ck = NULL;
        dt_status st = dt_ckpt_open(&ck, bad);
        if (st != DT_ERR_CORRUPT)
            TEST_FAILF("byte %zu flipped: open returned %s", i, dt_status_name(st));
    }
    /* The unverified open shows a structurally sound but damaged file, and
     * verify() reports both checksums. */
    flip_data_byte(good, len);
    spit(bad, good, len);
    dt_ckpt *ck;
    ASSERT_OK(dt_ckpt_open_unverified(&ck, bad));
    uint64_t stored, computed;
    ASSERT_STATUS(dt_ckpt_verify(ck, &stored, &computed), DT_ERR_CORRUPT);
    ASSERT_NE(stored, computed);
    dt_ckpt_close(ck);
    free(good);
    remove_tmpdir();
}

static int count_files(const char *dir, const char *prefix) {
    DIR *d = opendir(dir);
    ASSERT_TRUE(d != NULL);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        if (strncmp(e->d_name, prefix, strlen(prefix)) == 0)
            n++;
    closedir(d);
    return n;
}

static void test_rotation_and_fallback(void) {
    make_tmpdir();
    char dir[512];
    snprintf(dir, sizeof dir, "%s/run/ckpts", tmpdir); /* created by save */
    dt_ckpt *ck;
    ASSERT_STATUS(dt_ckpt_open_latest(&ck, dir), DT_ERR_NOT_FOUND);
    dt_ckpt_section s[8];
    size_t n = sections(s);
    for (int64_t step = 100; step <= 1000; step += 100) {
        fill(step);
        char written[600];
        ASSERT_OK(dt_ckpt_save(dir, step, s, n, 3, written, sizeof written));
        ASSERT_CONTAINS(written, "ckpt-");
        ASSERT_TRUE(count_files(dir, "ckpt-") <= 3);
    }
    ASSERT_EQ(count_files(dir, "ckpt-"), 3);
    ASSERT_EQ(count_files(dir, "."), 2); /* only . and .. : no temp files */
    char p[600], link[600];
    snprintf(p, sizeof p, "%s/latest", dir);
    ssize_t ln = readlink(p, link, sizeof link - 1);
    ASSERT_TRUE(ln > 0);
    link[ln] = '\0';
    ASSERT_STREQ(link, "ckpt-001000.dtck");
    ASSERT_OK(dt_ckpt_open(&ck, p)); /* the pointer opens like a file */
    expect_step(ck, 1000);
    dt_ckpt_close(ck);
    ASSERT_OK(dt_ckpt_open_latest(&ck, dir));
    expect_step(ck, 1000);
    dt_ckpt_close(ck);

    /* Damage the newest: resume falls back to 900; damage that too: 800. */
    dt_ckpt_path(p, sizeof p, dir, 1000);
    truncate(p, 100);
    ASSERT_OK(dt_ckpt_open_latest(&ck, dir));
    expect_step(ck, 900);
    dt_ckpt_close(ck);
    dt_ckpt_path(p, sizeof p, dir, 900);
    size_t len;
    unsigned char *b = slurp(p, &len);
    b[200] ^= 4;
    spit(p, b, len);
    free(b);
    ASSERT_OK(dt_ckpt_open_latest(&ck, dir));
    expect_step(ck, 800);
    dt_ckpt_close(ck);
    dt_ckpt_path(p, sizeof p, dir, 800);
    unlink(p);
    ASSERT_STATUS(dt_ckpt_open_latest(&ck, dir), DT_ERR_CORRUPT);
    ASSERT_CONTAINS(dt_last_error(), "none of the 2 checkpoints");
    ASSERT_CONTAINS(dt_last_error(), "ckpt-001000.dtck");

    /* Saving an older step after a resume keeps the abandoned newer files
     * out of the rotation count (they never push out the good ones). */
    fill(850);
    ASSERT_OK(dt_ckpt_save(dir, 850, s, n, 1, NULL, 0));
    ASSERT_OK(dt_ckpt_open_latest(&ck, dir));
    expect_step(ck, 850);
    dt_ckpt_close(ck);
    ASSERT_STATUS(dt_ckpt_save(dir, 1, s, n, 0, NULL, 0), DT_ERR_INVALID);
    ASSERT_CONTAINS(dt_last_error(), "keep count 0");
    remove_tmpdir();
}

/* A child writes checkpoints in a loop; the parent SIGKILLs it after a
 * random delay. After every kill the directory must still resume, from a
 * file whose content is exactly that of one step. */
static void test_sigkill_during_write(void) {
    make_tmpdir();
    char dir[512];
    snprintf(dir, sizeof dir, "%s/ckpts", tmpdir);
    /* Larger sections so that kills land inside write() and fsync(). */
    enum { BIG = 1 << 18 };
    float *big = malloc(BIG * sizeof *big);
    dt_ckpt_section s[8];
    size_t n = sections(s);
    s[n++] = (dt_ckpt_section){"big", DT_CKPT_F32, big, BIG};
    fill(1);
    ASSERT_OK(dt_ckpt_save(dir, 1, s, n, 2, NULL, 0));

    int iters = getenv("DT_TEST_FULL") ? 300 : 40;
    dt_rng rng;
    dt_rng_init(&rng, 1234, dt_rng_stream_id(0, 0, DT_RNG_TEST));
    int64_t last_step = 1;
    double t0 = dt_now();
    int killed_mid = 0;
    for (int it = 0; it < iters; it++) {
        pid_t pid = fork();
        ASSERT_TRUE(pid >= 0);
        if (pid == 0) {
            for (int64_t step = last_step + 1;; step++) {
                fill(step);
                for (int i = 0; i < BIG; i++)
                    big[i] = (float)i;
                if (dt_ckpt_save(dir, step, s, n, 2, NULL, 0) != DT_OK)
                    _exit(3);
            }
        }
        dt_sleep_ms(dt_rng_below(&rng, 25));
        kill(pid, SIGKILL);
        int status;
        ASSERT_EQ(waitpid(pid, &status, 0), pid);
        ASSERT_TRUE(WIFSIGNALED(status)); /* killed, not failed */
        dt_ckpt *ck;
        ASSERT_OK(dt_ckpt_open_latest(&ck, dir));
        int64_t step;
        ASSERT_OK(dt_ckpt_read(ck, "step", DT_CKPT_I64, &step, 1));
        ASSERT_TRUE(step >= last_step);
        expect_step(ck, step);
        dt_ckpt_close(ck);
        killed_mid += count_files(dir, ".ckpt-") > 0;
        last_step = step;
    }
    /* The next save removes the dead writers' temp files. */
    fill(last_step + 1);
    ASSERT_OK(dt_ckpt_save(dir, last_step + 1, s, n, 2, NULL, 0));
    ASSERT_EQ(count_files(dir, ".ckpt-"), 0);
    ASSERT_EQ(count_files(dir, ".latest"), 0);
    printf("  %d kills in %.2f s, %d left a temp file behind, reached step %" PRId64 "\n", iters,
           dt_now() - t0, killed_mid, last_step);
    free(big);
    remove_tmpdir();
}

int main(void) {
    dt_log_set_level(DT_LOG_LEVEL_ERROR); /* fallbacks warn by design */
    RUN(test_roundtrip);
    RUN(test_corruption_refused);
    RUN(test_rotation_and_fallback);
    RUN(test_sigkill_during_write);
    return TEST_SUMMARY();
}
