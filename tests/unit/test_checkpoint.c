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

/* ---- sharded state ---------------------------------------------------- */

/* Every flat range [lo, hi) of a (3, 4, 5) box stored at offset 7 becomes
 * at most 5 boxes that are disjoint, lie in the box, start where the flat
 * layout says, and together are exactly the range. */
static void test_boxes_in_range(void) {
    dt_ckpt_box whole = {.tensor = 2, .begin = {1, 2, 3}, .extent = {3, 4, 5}, .offset = 7};
    for (uint64_t lo = 0; lo <= 70; lo++)
        for (uint64_t hi = lo; hi <= 70; hi++) {
            dt_ckpt_box out[5];
            size_t n = dt_ckpt_boxes_in_range(&whole, lo, hi, out);
            ASSERT_TRUE(n <= 5);
            bool hit[60] = {false};
            uint64_t total = 0;
            for (size_t k = 0; k < n; k++) {
                const dt_ckpt_box *b = &out[k];
                ASSERT_EQ(b->tensor, 2);
                uint64_t rel[3], first = 0;
                for (int d = 0; d < 3; d++) {
                    ASSERT_TRUE(b->extent[d] >= 1 && b->begin[d] >= whole.begin[d]);
                    ASSERT_TRUE(b->begin[d] + b->extent[d] <= whole.begin[d] + whole.extent[d]);
                    rel[d] = b->begin[d] - whole.begin[d];
                }
                first = (rel[0] * 4 + rel[1]) * 5 + rel[2];
                ASSERT_EQ(b->offset, whole.offset + first);
                /* Walk the box row-major: its elements must be consecutive
                 * in the flat buffer (one contiguous piece) and new. */
                uint64_t expect = first;
                for (uint64_t i = 0; i < b->extent[0]; i++)
                    for (uint64_t j = 0; j < b->extent[1]; j++)
                        for (uint64_t k2 = 0; k2 < b->extent[2]; k2++) {
                            uint64_t f = ((rel[0] + i) * 4 + rel[1] + j) * 5 + rel[2] + k2;
                            ASSERT_EQ(f, expect);
                            expect++;
                            ASSERT_TRUE(!hit[f]);
                            hit[f] = true;
                            total++;
                        }
            }
            uint64_t a = lo > 7 ? lo - 7 : 0, z = hi > 7 ? (hi - 7 < 60 ? hi - 7 : 60) : 0;
            ASSERT_EQ(total, z > a ? z - a : 0);
            for (uint64_t f = 0; f < 60; f++)
                ASSERT_EQ(hit[f], f >= a && f < z);
        }
}

/* Three global tensors, A (3, 4, 6), B (10) and C (5, 7); value of an
 * element = 1000 * tensor + its flat index in the global tensor. */
static const dt_ckpt_tensor gt[3] = {
    {"A", 3, 0, {3, 4, 6}}, {"B", 1, 0, {10, 1, 1}}, {"C", 2, 0, {5, 7, 1}}};

static float gval(uint32_t t, uint64_t i0, uint64_t i1, uint64_t i2) {
    return (float)(1000 * t + (i0 * gt[t].shape[1] + i1) * gt[t].shape[2] + i2);
}

/* Fill `buf` with the values of the boxes. */
static void fill_boxes(float *buf, const dt_ckpt_box *b, size_t n) {
    for (size_t k = 0; k < n; k++) {
        uint64_t o = b[k].offset;
        for (uint64_t i = 0; i < b[k].extent[0]; i++)
            for (uint64_t j = 0; j < b[k].extent[1]; j++)
                for (uint64_t l = 0; l < b[k].extent[2]; l++)
                    buf[o++] =
                        gval(b[k].tensor, b[k].begin[0] + i, b[k].begin[1] + j, b[k].begin[2] + l);
    }
}

/* Layout 1: two writers, A split on dimension 1 (like a tensor-parallel
 * shard of c_attn), B in halves, C by rows; rank 1's buffer has padding. */
static const dt_ckpt_box w0[] = {{0, 0, {0, 0, 0}, {3, 2, 6}, 0},
                                 {1, 0, {0, 0, 0}, {5, 1, 1}, 36},
                                 {2, 0, {0, 0, 0}, {3, 7, 1}, 41}};
static const dt_ckpt_box w1[] = {{0, 0, {0, 2, 0}, {3, 2, 6}, 4},
                                 {1, 0, {5, 0, 0}, {5, 1, 1}, 40},
                                 {2, 0, {3, 0, 0}, {2, 7, 1}, 45}};

static void write_layout1(const char *dir, int64_t step, bool with_rank1) {
    static float b0[62], b1[64];
    memset(b1, 0xff, sizeof b1); /* padding, never read */
    fill_boxes(b0, w0, 3);
    fill_boxes(b1, w1, 3);
    dt_ckpt_section s1[] = {{"params", DT_CKPT_F32, b1, 64},
                            {"params.map", DT_CKPT_BYTES, w1, sizeof w1}};
    dt_ckpt_file_rec rec = {.rank = 1};
    char p[512];
    ASSERT_OK(dt_mkdir_p(dir));
    dt_ckpt_shard_path(p, sizeof p, dir, step, 1);
    ASSERT_OK(dt_ckpt_write_file_sum(p, s1, 2, &rec));
    int64_t st = step;
    dt_ckpt_section m[] = {{"step", DT_CKPT_I64, &st, 1},
                           {"tensors", DT_CKPT_BYTES, gt, sizeof gt},
                           {"params", DT_CKPT_F32, b0, 62},
                           {"params.map", DT_CKPT_BYTES, w0, sizeof w0}};
    ASSERT_OK(dt_ckpt_save_set(dir, step, m, 4, &rec, with_rank1 ? 1 : 0, 3, NULL, 0));
}

static void test_sharded_roundtrip(void) {
    make_tmpdir();
    char dir[512];
    snprintf(dir, sizeof dir, "%s/sharded", tmpdir);
    write_layout1(dir, 4, true);
    dt_ckpt_set *set;
    ASSERT_OK(dt_ckpt_set_open_latest(&set, dir));
    ASSERT_EQ(dt_ckpt_set_num_files(set), 2);
    ASSERT_EQ(dt_ckpt_set_num_tensors(set), 3);
    ASSERT_TRUE(dt_ckpt_set_file_of(set, 1) != NULL);
    ASSERT_TRUE(dt_ckpt_set_has_state(set, "params"));
    ASSERT_TRUE(!dt_ckpt_set_has_state(set, "adamw.m"));
    /* Layout 2, in the reader's own tensor order (C, A, B): all of A, B[3:8]
     * (across the writers' cut), C's columns 2..4 of every row. */
    dt_ckpt_tensor mine[3] = {gt[2], gt[0], gt[1]};
    dt_ckpt_box want[] = {{1, 0, {0, 0, 0}, {3, 4, 6}, 0},
                          {2, 0, {3, 0, 0}, {5, 1, 1}, 72},
                          {0, 0, {0, 2, 0}, {5, 3, 1}, 77}};
    float got[92];
    ASSERT_OK(dt_ckpt_set_read_boxes(set, "params", mine, 3, want, 3, got));
    float expect[92];
    dt_ckpt_box in_gt[3];
    memcpy(in_gt, want, sizeof in_gt);
    in_gt[0].tensor = 0, in_gt[1].tensor = 1, in_gt[2].tensor = 2; /* the global numbering */
    fill_boxes(expect, in_gt, 3);
    ASSERT_EQ(memcmp(got, expect, sizeof got), 0);
    /* A shape that differs is refused naming the tensor. */
    mine[1].shape[2] = 7;
    ASSERT_STATUS(dt_ckpt_set_read_boxes(set, "params", mine, 3, want, 1, got), DT_ERR_MISMATCH);
    ASSERT_CONTAINS(dt_last_error(), "tensor A has shape 3x4x6");
    dt_ckpt_set_close(set);

    /* Without rank 1's file the manifest cannot cover B[3:8]. */
    write_layout1(dir, 5, false);
    ASSERT_OK(dt_ckpt_set_open_latest(&set, dir));
    mine[1].shape[2] = 6;
    ASSERT_STATUS(dt_ckpt_set_read_boxes(set, "params", mine, 3, want + 1, 1, got),
                  DT_ERR_MISMATCH);
    ASSERT_CONTAINS(dt_last_error(), "tensor B holds 2 of the 5 values");
    dt_ckpt_set_close(set);
    remove_tmpdir();
}

static void test_sharded_damage(void) {
    make_tmpdir();
    char dir[512], p[600], q[600];
    snprintf(dir, sizeof dir, "%s/damage", tmpdir);
    write_layout1(dir, 7, true);
    /* A shard file replaced by another valid one is not its manifest's. */
    dt_ckpt_shard_path(p, sizeof p, dir, 7, 1);
    float other[4] = {1, 2, 3, 4};
    dt_ckpt_section s[] = {{"params", DT_CKPT_F32, other, 4}};
    ASSERT_OK(dt_ckpt_write_file(p, s, 1));
    dt_ckpt_set *set;
    dt_ckpt_path(q, sizeof q, dir, 7);
    ASSERT_STATUS(dt_ckpt_set_open(&set, q, false), DT_ERR_CORRUPT);
    ASSERT_CONTAINS(dt_last_error(), "does not belong to it");
    /* A missing shard file: the set is refused, and open_latest falls
     * back to an older checkpoint that validates. */
    write_layout1(dir, 6, true);
    unlink(p);
    ASSERT_STATUS(dt_ckpt_set_open(&set, q, true), DT_ERR_NOT_FOUND);
    ASSERT_OK(dt_ckpt_set_open_latest(&set, dir));
    int64_t step;
    ASSERT_OK(dt_ckpt_read(dt_ckpt_set_manifest(set), "step", DT_CKPT_I64, &step, 1));
    ASSERT_EQ(step, 6);
    dt_ckpt_set_close(set);
    /* Boxes that overlap, or leave their tensor, are refused at open. */
    dt_ckpt_box bad[2] = {w0[0], w0[0]};
    bad[1].offset = 36;
    float buf[80] = {0};
    dt_ckpt_section m[] = {{"tensors", DT_CKPT_BYTES, gt, sizeof gt},
                           {"params", DT_CKPT_F32, buf, 80},
                           {"params.map", DT_CKPT_BYTES, bad, sizeof bad}};
    ASSERT_OK(dt_ckpt_write_file(q, m, 3));
    ASSERT_STATUS(dt_ckpt_set_open(&set, q, true), DT_ERR_CORRUPT);
    ASSERT_CONTAINS(dt_last_error(), "stores part of tensor A twice");
    bad[1] = w0[1];
    bad[1].extent[0] = 6; /* B[0:6] but B[5] is at the end of the buffer: fine */
    bad[1].begin[0] = 5;  /* B[5:11] leaves B */
    ASSERT_OK(dt_ckpt_write_file(q, m, 3));
    ASSERT_STATUS(dt_ckpt_set_open(&set, q, true), DT_ERR_CORRUPT);
    ASSERT_CONTAINS(dt_last_error(), "lies outside its tensor or buffer");
    /* A shard file rank 0 cannot see: nothing is committed. */
    dt_ckpt_file_rec ghost = {.rank = 3, .size = 100};
    int64_t st = 9;
    dt_ckpt_section ms[] = {{"step", DT_CKPT_I64, &st, 1}};
    ASSERT_STATUS(dt_ckpt_save_set(dir, 9, ms, 1, &ghost, 1, 3, NULL, 0), DT_ERR_NOT_FOUND);
    ASSERT_CONTAINS(dt_last_error(), "must be one directory shared by every rank");
    dt_ckpt_path(q, sizeof q, dir, 9);
    ASSERT_TRUE(access(q, F_OK) != 0);
    /* A shard file without a manifest (a save that failed) is removed by
     * the next save. */
    dt_ckpt_shard_path(p, sizeof p, dir, 8, 2);
    ASSERT_OK(dt_ckpt_write_file(p, s, 1));
    write_layout1(dir, 10, true);
    ASSERT_TRUE(access(p, F_OK) != 0);
    remove_tmpdir();
}

/* A format-1 checkpoint (no tensors, no maps) reads as one unsharded
 * buffer in the order of the reader's tensors. */
static void test_unsharded_format(void) {
    make_tmpdir();
    char dir[512];
    snprintf(dir, sizeof dir, "%s/format1", tmpdir);
    float flat[72 + 10 + 35];
    dt_ckpt_box whole[3] = {{0, 0, {0, 0, 0}, {3, 4, 6}, 0},
                            {1, 0, {0, 0, 0}, {10, 1, 1}, 72},
                            {2, 0, {0, 0, 0}, {5, 7, 1}, 82}};
    fill_boxes(flat, whole, 3);
    int64_t st = 3;
    dt_ckpt_section m[] = {{"step", DT_CKPT_I64, &st, 1}, {"params", DT_CKPT_F32, flat, 117}};
    ASSERT_OK(dt_ckpt_save(dir, 3, m, 2, 2, NULL, 0));
    dt_ckpt_set *set;
    ASSERT_OK(dt_ckpt_set_open_latest(&set, dir));
    ASSERT_EQ(dt_ckpt_set_num_tensors(set), 0);
    ASSERT_TRUE(dt_ckpt_set_has_state(set, "params"));
    dt_ckpt_box want = {2, 0, {1, 3, 0}, {2, 2, 1}, 0};
    float got[4];
    ASSERT_OK(dt_ckpt_set_read_boxes(set, "params", gt, 3, &want, 1, got));
    ASSERT_TRUE(got[0] == gval(2, 1, 3, 0) && got[3] == gval(2, 2, 4, 0));
    dt_ckpt_tensor smaller[3] = {gt[0], gt[1], gt[2]};
    smaller[1].shape[0] = 9;
    ASSERT_STATUS(dt_ckpt_set_read_boxes(set, "params", smaller, 3, &want, 1, got),
                  DT_ERR_MISMATCH);
    ASSERT_CONTAINS(dt_last_error(), "another model or configuration");
    dt_ckpt_set_close(set);
    remove_tmpdir();
}

int main(void) {
    dt_log_set_level(DT_LOG_LEVEL_ERROR); /* fallbacks warn by design */
    RUN(test_roundtrip);
    RUN(test_corruption_refused);
    RUN(test_rotation_and_fallback);
    RUN(test_sigkill_during_write);
    RUN(test_boxes_in_range);
    RUN(test_sharded_roundtrip);
    RUN(test_sharded_damage);
    RUN(test_unsharded_format);
    return TEST_SUMMARY();
}
