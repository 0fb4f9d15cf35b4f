/*
 * test_core.c — status strings, error messages, config parsing (including
 * every error case), logging, allocation, time and the Philox generator
 * against Random123's published known-answer vectors.
 */
#include "test.h"

#include <dirent.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

static void test_status_strings(void) {
    ASSERT_STREQ(dt_strerror(DT_OK), "success");
    ASSERT_STREQ(dt_status_name(DT_ERR_TIMEOUT), "DT_ERR_TIMEOUT");
    ASSERT_STREQ(dt_strerror((dt_status)999), "unknown status");
    for (int s = 0; s < DT_STATUS_COUNT; s++) {
        ASSERT_TRUE(dt_strerror((dt_status)s)[0] != '\0');
        ASSERT_TRUE(strncmp(dt_status_name((dt_status)s), "DT_", 3) == 0);
    }
}

static dt_status failing_inner(void) {
    return dt_error_set(DT_ERR_IO, "cannot read %s", "weights.bin");
}
static dt_status failing_outer(void) {
    DT_CHECK(failing_inner());
    return DT_OK;
}

static void test_error_messages(void) {
    dt_error_clear();
    ASSERT_STREQ(dt_last_error(), "");
    ASSERT_STATUS(failing_outer(), DT_ERR_IO);
    ASSERT_CONTAINS(dt_last_error(), "cannot read weights.bin");
    ASSERT_CONTAINS(dt_last_error(), "test_core.c:");
    dt_error_set(DT_ERR_PEER, "rank 3 lost");
    dt_error_prefix("allreduce #%d", 7);
    ASSERT_STREQ(dt_last_error(), "allreduce #7: rank 3 lost");
    /* The current message as an argument of the next one (group.c wraps
     * an error this way after an abort): formatting a buffer into itself
     * garbled it ("group w was aborted (group w was aborted (..."). */
    dt_error_set(DT_ERR_ABORTED, "group w was aborted (%s)", dt_last_error());
    ASSERT_STREQ(dt_last_error(), "group w was aborted (allreduce #7: rank 3 lost)");
    errno = ENOENT;
    dt_error_set_errno(DT_ERR_IO, "again [%s]", dt_last_error());
    ASSERT_STREQ(
        dt_last_error(),
        "again [group w was aborted (allreduce #7: rank 3 lost)]: No such file or directory");
}

static void test_parse_size(void) {
    size_t v = 0;
    ASSERT_OK(dt_config_parse_size("--s", "4096", 0, SIZE_MAX, &v));
    ASSERT_EQ(v, 4096);
    ASSERT_OK(dt_config_parse_size("--s", "64K", 0, SIZE_MAX, &v));
    ASSERT_EQ(v, 65536);
    ASSERT_OK(dt_config_parse_size("--s", "25M", 0, SIZE_MAX, &v));
    ASSERT_EQ(v, 25u << 20);
    ASSERT_OK(dt_config_parse_size("--s", "1G", 0, SIZE_MAX, &v));
    ASSERT_EQ(v, 1u << 30);
    ASSERT_OK(dt_config_parse_size("--s", "2KiB", 0, SIZE_MAX, &v));
    ASSERT_EQ(v, 2048);
    ASSERT_OK(dt_config_parse_size("--s", "3mb", 0, SIZE_MAX, &v));
    ASSERT_EQ(v, 3u << 20);
    ASSERT_OK(dt_config_parse_size("--s", "0", 0, SIZE_MAX, &v));
    ASSERT_EQ(v, 0);

    v = 77;
    ASSERT_STATUS(dt_config_parse_size("--bucket-size", "12Q", 0, SIZE_MAX, &v), DT_ERR_INVALID);
    ASSERT_CONTAINS(dt_last_error(), "--bucket-size");
    ASSERT_CONTAINS(dt_last_error(), "\"12Q\" is not a size");
    ASSERT_EQ(v, 77); /* untouched on failure */
    ASSERT_STATUS(dt_config_parse_size("--s", "", 0, SIZE_MAX, &v), DT_ERR_INVALID);
    ASSERT_STATUS(dt_config_parse_size("--s", NULL, 0, SIZE_MAX, &v), DT_ERR_INVALID);
    ASSERT_STATUS(dt_config_parse_size("--s", "-5", 0, SIZE_MAX, &v), DT_ERR_INVALID);
    ASSERT_STATUS(dt_config_parse_size("--s", " 5", 0, SIZE_MAX, &v), DT_ERR_INVALID);
    ASSERT_STATUS(dt_config_parse_size("--s", "5 K", 0, SIZE_MAX, &v), DT_ERR_INVALID);
    ASSERT_STATUS(dt_config_parse_size("--s", "1.5M", 0, SIZE_MAX, &v), DT_ERR_INVALID);
    ASSERT_STATUS(dt_config_parse_size("--s", "99999999999999999999999", 0, SIZE_MAX, &v),
                  DT_ERR_INVALID);
    ASSERT_STATUS(dt_config_parse_size("--s", "17179869184G", 0, SIZE_MAX, &v), DT_ERR_INVALID);
    ASSERT_STATUS(dt_config_parse_size("--s", "2M", 0, 1u << 20, &v), DT_ERR_INVALID);
    ASSERT_CONTAINS(dt_last_error(), "out of range [0 B, 1.00 MiB]");
    ASSERT_STATUS(dt_config_parse_size("--s", "1K", 4096, SIZE_MAX, &v), DT_ERR_INVALID);
}

static void test_parse_bool(void) {
    bool b = false;
    const char *yes[] = {"1", "true", "TRUE", "yes", "On"};
    const char *no[] = {"0", "false", "No", "off", "OFF"};
    for (int i = 0; i < 5; i++) {
        ASSERT_OK(dt_config_parse_bool("--x", yes[i], &b));
        ASSERT_TRUE(b);
        ASSERT_OK(dt_config_parse_bool("--x", no[i], &b));
        ASSERT_TRUE(!b);
    }
    ASSERT_STATUS(dt_config_parse_bool("--overlap", "maybe", &b), DT_ERR_INVALID);
    ASSERT_CONTAINS(dt_last_error(), "--overlap: \"maybe\" is not a boolean");
    ASSERT_STATUS(dt_config_parse_bool("--x", "", &b), DT_ERR_INVALID);
}

static void test_parse_int(void) {
    int64_t v = 0;
    ASSERT_OK(dt_config_parse_int("--n", "42", 0, 100, &v));
    ASSERT_EQ(v, 42);
    ASSERT_OK(dt_config_parse_int("--n", "-3", -10, 10, &v));
    ASSERT_EQ(v, -3);
    ASSERT_OK(dt_config_parse_int("--n", "0x10", 0, 100, &v));
    ASSERT_EQ(v, 16);
    ASSERT_STATUS(dt_config_parse_int("--nproc", "0", 1, 1024, &v), DT_ERR_INVALID);
    ASSERT_CONTAINS(dt_last_error(), "--nproc: 0 is out of range [1, 1024]");
    ASSERT_STATUS(dt_config_parse_int("--n", "4x", 1, 10, &v), DT_ERR_INVALID);
    ASSERT_CONTAINS(dt_last_error(), "\"4x\" is not an integer");
    ASSERT_STATUS(dt_config_parse_int("--n", "", 1, 10, &v), DT_ERR_INVALID);
    ASSERT_STATUS(dt_config_parse_int("--n", "99999999999999999999", INT64_MIN, INT64_MAX, &v),
                  DT_ERR_INVALID);
}

static void test_parse_double(void) {
    double v = 0;
    ASSERT_OK(dt_config_parse_double("--lr", "3e-4", 0, 1, &v));
    ASSERT_NEAR(v, 3e-4, 1e-12, 0);
    ASSERT_STATUS(dt_config_parse_double("--lr", "-1", 0, 1, &v), DT_ERR_INVALID);
    ASSERT_CONTAINS(dt_last_error(), "--lr: -1 is out of range [0, 1]");
    ASSERT_STATUS(dt_config_parse_double("--lr", "nan", 0, 1, &v), DT_ERR_INVALID);
    ASSERT_STATUS(dt_config_parse_double("--lr", "inf", 0, 1e300, &v), DT_ERR_INVALID);
    ASSERT_STATUS(dt_config_parse_double("--lr", "1e-3x", 0, 1, &v), DT_ERR_INVALID);
}

static void test_parse_enum(void) {
    static const char *const algos[] = {"ring", "rhd", "tree"};
    int v = -1;
    ASSERT_OK(dt_config_parse_enum("DT_ALGO", "tree", algos, 3, &v));
    ASSERT_EQ(v, 2);
    ASSERT_STATUS(dt_config_parse_enum("DT_ALGO", "Ring", algos, 3, &v), DT_ERR_INVALID);
    ASSERT_CONTAINS(dt_last_error(), "DT_ALGO: \"Ring\" is not one of ring|rhd|tree");
    ASSERT_EQ(v, 2);
}

static void test_env(void) {
    size_t s = 0;
    unsetenv("DT_TEST_SIZE");
    ASSERT_OK(dt_config_env_size("DT_TEST_SIZE", 123, 0, SIZE_MAX, &s));
    ASSERT_EQ(s, 123);
    setenv("DT_TEST_SIZE", "8M", 1);
    ASSERT_OK(dt_config_env_size("DT_TEST_SIZE", 123, 0, SIZE_MAX, &s));
    ASSERT_EQ(s, 8u << 20);
    setenv("DT_TEST_SIZE", "lots", 1);
    ASSERT_STATUS(dt_config_env_size("DT_TEST_SIZE", 123, 0, SIZE_MAX, &s), DT_ERR_INVALID);
    ASSERT_CONTAINS(dt_last_error(), "DT_TEST_SIZE: \"lots\"");
    int64_t i = 0;
    setenv("DT_TEST_INT", "300", 1);
    ASSERT_STATUS(dt_config_env_int("DT_TEST_INT", 5, 0, 255, &i), DT_ERR_INVALID);
    ASSERT_CONTAINS(dt_last_error(), "DT_TEST_INT: 300 is out of range [0, 255]");
    bool b = false;
    setenv("DT_TEST_BOOL", "yes", 1);
    ASSERT_OK(dt_config_env_bool("DT_TEST_BOOL", false, &b));
    ASSERT_TRUE(b);
    double d = 0;
    setenv("DT_TEST_DOUBLE", "", 1);
    ASSERT_OK(dt_config_env_double("DT_TEST_DOUBLE", 2.5, 0, 10, &d));
    ASSERT_NEAR(d, 2.5, 0, 0);
}

static char captured[2048];
static void capture_sink(dt_log_level level, const char *line, void *user) {
    (void)level;
    (void)user;
    size_t n = strlen(captured);
    snprintf(captured + n, sizeof captured - n, "%s\n", line);
}

static void test_logging(void) {
    setenv("DT_LOG", "info", 1);
    setenv("DT_LOG_SUBSYS", "shm", 1);
    ASSERT_OK(dt_log_init());
    dt_log_set_sink(capture_sink, NULL);
    dt_log_set_rank(3);
    captured[0] = '\0';
    DT_INFO("hello %d", 42);
    DT_DEBUG("comm", "not shown: level");
    dt_log(DT_LOG_LEVEL_INFO, "tcp", "not shown: subsystem");
    dt_log(DT_LOG_LEVEL_INFO, "shm", "shown: subsystem");
    ASSERT_CONTAINS(captured, "[3] INFO  hello 42");
    ASSERT_CONTAINS(captured, "shm: shown: subsystem");
    ASSERT_TRUE(strstr(captured, "not shown") == NULL);
    ASSERT_TRUE(!dt_log_enabled(DT_LOG_LEVEL_DEBUG, NULL));
    ASSERT_TRUE(dt_log_enabled(DT_LOG_LEVEL_ERROR, "tcp"));

    setenv("DT_LOG", "chatty", 1);
    ASSERT_STATUS(dt_log_init(), DT_ERR_INVALID);
    ASSERT_CONTAINS(dt_last_error(), "error|warn|info|debug|trace");
    ASSERT_EQ(dt_log_get_level(), DT_LOG_LEVEL_INFO); /* unchanged */
    dt_log_set_sink(NULL, NULL);
    dt_log_set_rank(-1);
    unsetenv("DT_LOG_SUBSYS");
    unsetenv("DT_LOG");
    ASSERT_OK(dt_log_init());
}

static void test_alloc(void) {
    for (size_t n = 0; n < 300; n += 37) {
        unsigned char *p = dt_alloc(n);
        ASSERT_TRUE(p != NULL);
        ASSERT_EQ((uintptr_t)p % DT_ALIGN, 0);
        memset(p, 0xab, n);
        dt_free(p);
    }
    int *z = dt_calloc(1000, sizeof(int));
    ASSERT_TRUE(z != NULL);
    for (int i = 0; i < 1000; i++)
        ASSERT_EQ(z[i], 0);
    dt_free(z);
    ASSERT_TRUE(dt_calloc(SIZE_MAX / 2, 4) == NULL);
    ASSERT_CONTAINS(dt_last_error(), "overflows");
    /* More than the machine can back: refused up front (overcommit would
     * grant it and the OOM killer would collect when it is touched). */
    uint64_t avail = 0;
    ASSERT_TRUE(dt_mem_available(&avail));
    ASSERT_TRUE(avail > 0);
    ASSERT_TRUE(dt_alloc((size_t)avail + ((size_t)1 << 30)) == NULL);
    ASSERT_CONTAINS(dt_last_error(), "of memory is available");
    dt_free(NULL);
    char buf[32];
    ASSERT_STREQ(dt_format_bytes(1536, buf, sizeof buf), "1.50 KiB");
    ASSERT_STREQ(dt_format_bytes(100, buf, sizeof buf), "100 B");
}

static void test_time(void) {
    uint64_t t0 = dt_now_ns();
    dt_sleep_ms(20);
    uint64_t t1 = dt_now_ns();
    ASSERT_TRUE(t1 - t0 >= 20000000u);
    ASSERT_TRUE(t1 - t0 < 2000000000u);
    ASSERT_TRUE(dt_cpu_count() >= 1);
}

static void *thread_body(void *arg) {
    int *v = arg;
    *v += 1;
    return v;
}

static void test_threads(void) {
    int value = 41;
    dt_thread *t = NULL;
    ASSERT_OK(dt_thread_create(&t, "dt-test", thread_body, &value));
    void *ret = dt_thread_join(t);
    ASSERT_TRUE(ret == &value);
    ASSERT_EQ(value, 42);
    ASSERT_TRUE(dt_thread_join(NULL) == NULL);
}

/* Random123's known-answer vectors (tests/kat_vectors) for philox4x32_10. */
static void test_philox_known_answers(void) {
    static const struct {
        uint32_t ctr[4], key[2], out[4];
    } kat[] = {
        {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
        {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
         {0xffffffff, 0xffffffff},
         {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
        {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
         {0xa4093822, 0x299f31d0},
         {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
    };
    for (size_t i = 0; i < sizeof kat / sizeof kat[0]; i++) {
        uint32_t out[4];
        dt_philox4x32_10(kat[i].ctr, kat[i].key, out);
        for (int j = 0; j < 4; j++)
            ASSERT_EQ(out[j], kat[i].out[j]);
    }
}

static void test_rng_streams(void) {
    dt_rng a, b;
    /* The stream's first block is philox(counter=(0,0,stream), key=seed). */
    dt_rng_init(&a, 0, 0);
    ASSERT_EQ(dt_rng_u32(&a), 0x6627e8d5);

    /* Seek/tell reproduce any position. */
    dt_rng_init(&a, 1234, dt_rng_stream_id(5, 17, DT_RNG_DATA));
    uint32_t seq[11];
    for (int i = 0; i < 11; i++)
        seq[i] = dt_rng_u32(&a);
    ASSERT_EQ(dt_rng_tell(&a), 11);
    for (int start = 0; start < 11; start++) {
        dt_rng_init(&b, 1234, dt_rng_stream_id(5, 17, DT_RNG_DATA));
        dt_rng_seek(&b, (uint64_t)start);
        ASSERT_EQ(dt_rng_tell(&b), start);
        for (int i = start; i < 11; i++)
            ASSERT_EQ(dt_rng_u32(&b), seq[i]);
    }

    /* Different ranks, steps, purposes and seeds give different streams. */
    uint64_t ids[] = {dt_rng_stream_id(0, 0, DT_RNG_DATA), dt_rng_stream_id(1, 0, DT_RNG_DATA),
                      dt_rng_stream_id(0, 1, DT_RNG_DATA), dt_rng_stream_id(0, 0, DT_RNG_INIT)};
    for (int i = 0; i < 4; i++)
        for (int j = i + 1; j < 4; j++)
            ASSERT_NE(ids[i], ids[j]);
    dt_rng_init(&a, 1, 0);
    dt_rng_init(&b, 2, 0);
    ASSERT_NE(dt_rng_u64(&a), dt_rng_u64(&b));
}

static void test_rng_distributions(void) {
    dt_rng r;
    dt_rng_init(&r, 42, dt_rng_stream_id(0, 0, DT_RNG_TEST));
    const int n = 200000;
    double sum = 0, sum2 = 0, nsum = 0, nsum2 = 0;
    int buckets[10] = {0};
    for (int i = 0; i < n; i++) {
        float u = dt_rng_uniform(&r);
        ASSERT_TRUE(u >= 0.0f && u < 1.0f);
        sum += u;
        sum2 += (double)u * u;
        uint32_t k = dt_rng_below(&r, 10);
        ASSERT_TRUE(k < 10);
        buckets[k]++;
        float g = dt_rng_normal(&r);
        ASSERT_TRUE(isfinite(g));
        nsum += g;
        nsum2 += (double)g * g;
    }
    /* Bounds are ~6 standard errors: a correct generator never trips them. */
    ASSERT_NEAR(sum / n, 0.5, 0, 0.004);
    ASSERT_NEAR(sum2 / n - (sum / n) * (sum / n), 1.0 / 12, 0, 0.002);
    ASSERT_NEAR(nsum / n, 0.0, 0, 0.014);
    ASSERT_NEAR(nsum2 / n, 1.0, 0, 0.02);
    for (int k = 0; k < 10; k++)
        ASSERT_NEAR(buckets[k], n / 10, 0, 6 * sqrt(n * 0.09));
}

static void test_hash(void) {
    const char *s = "dtrain";
    uint64_t h1 = dt_hash64(s, 6, 0);
    ASSERT_EQ(h1, dt_hash64(s, 6, 0));
    ASSERT_NE(h1, dt_hash64(s, 6, 1));
    ASSERT_NE(h1, dt_hash64(s, 5, 0));
    dt_hasher *h = NULL;
    ASSERT_OK(dt_hasher_create(&h, 0));
    dt_hasher_update(h, "dt", 2);
    dt_hasher_update(h, "rain", 4);
    ASSERT_EQ(dt_hasher_final(h), h1);
    dt_hasher_destroy(h);
    dt_hasher_destroy(NULL);
}

static void test_file_write_atomic(void) {
    char dir[] = "/tmp/dt_core_file.XXXXXX";
    ASSERT_TRUE(mkdtemp(dir) != NULL);
    char path[128];
    snprintf(path, sizeof path, "%s/out.bin", dir);
    const dt_file_part parts[] = {{"dt", 2}, {"", 0}, {"rain", 4}};
    ASSERT_OK(dt_file_write_atomic(path, parts, 3));
    ASSERT_OK(dt_file_write_atomic(path, parts + 2, 1)); /* replaces, never appends */
    char buf[16] = {0};
    FILE *f = fopen(path, "rb");
    ASSERT_TRUE(f != NULL);
    ASSERT_EQ(fread(buf, 1, sizeof buf, f), 4);
    fclose(f);
    ASSERT_STREQ(buf, "rain");
    /* Only the final file is left: no temporary beside it. */
    DIR *d = opendir(dir);
    int entries = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;)
        if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0)
            entries++;
    closedir(d);
    ASSERT_EQ(entries, 1);
    snprintf(path, sizeof path, "%s/missing/out.bin", dir);
    ASSERT_STATUS(dt_file_write_atomic(path, parts, 1), DT_ERR_IO);
    ASSERT_CONTAINS(dt_last_error(), "cannot create");
    ASSERT_CONTAINS(dt_last_error(), "No such file or directory");
    ASSERT_OK(dt_fsync_dir(dir));
    snprintf(path, sizeof path, "%s/out.bin", dir);
    ASSERT_EQ(unlink(path), 0);

    /* An output that exists but is not a regular file is refused and left
     * alone: the rename used to replace a FIFO, a device node (as root,
     * even /dev/null) or a link to one with a regular file. */
    snprintf(path, sizeof path, "%s/fifo", dir);
    ASSERT_EQ(mkfifo(path, 0600), 0);
    ASSERT_STATUS(dt_file_write_atomic(path, parts, 1), DT_ERR_INVALID);
    ASSERT_CONTAINS(dt_last_error(), "is a FIFO, not a regular file");
    struct stat sb;
    ASSERT_TRUE(lstat(path, &sb) == 0 && S_ISFIFO(sb.st_mode));
    ASSERT_EQ(unlink(path), 0);
    snprintf(path, sizeof path, "%s/null", dir);
    ASSERT_EQ(symlink("/dev/null", path), 0);
    ASSERT_STATUS(dt_file_write_atomic(path, parts, 1), DT_ERR_INVALID);
    ASSERT_CONTAINS(dt_last_error(), "is a character device");
    ASSERT_TRUE(lstat(path, &sb) == 0 && S_ISLNK(sb.st_mode));
    ASSERT_EQ(unlink(path), 0);
    ASSERT_STATUS(dt_file_write_atomic(dir, parts, 1), DT_ERR_INVALID);
    ASSERT_CONTAINS(dt_last_error(), "is a directory");
    ASSERT_STATUS(dt_file_check_replaceable(dir), DT_ERR_INVALID);
    snprintf(path, sizeof path, "%s/absent", dir);
    ASSERT_OK(dt_file_check_replaceable(path));
    ASSERT_EQ(rmdir(dir), 0);
}

int main(void) {
    RUN(test_status_strings);
    RUN(test_error_messages);
    RUN(test_parse_size);
    RUN(test_parse_bool);
    RUN(test_parse_int);
    RUN(test_parse_double);
    RUN(test_parse_enum);
    RUN(test_env);
    RUN(test_logging);
    RUN(test_alloc);
    RUN(test_time);
    RUN(test_threads);
    RUN(test_philox_known_answers);
    RUN(test_rng_streams);
    RUN(test_rng_distributions);
    RUN(test_hash);
    RUN(test_file_write_atomic);
    return TEST_SUMMARY();
}
