/*
 * test_ckpt_info.c — `dtrain ckpt info` on an intact file, a damaged file,
 * a truncated file and a directory.
 */
#include "dtrain/train.h"
#include "test.h"

#include <sys/wait.h>
#include <unistd.h>

static char out[16384];

/* Like ASSERT_CONTAINS, printing the whole (long) output on failure. */
#define EXPECT_OUT(needle)                                                                         \
    do {                                                                                           \
        if (!strstr(out, (needle))) {                                                              \
            fprintf(stderr, "output was:\n%s\n", out);                                             \
            TEST_FAILF("expected the output to contain \"%s\"", (needle));                         \
        }                                                                                          \
    } while (0)

/* Run `dtrain ckpt info ARG` and capture stdout+stderr; returns exit code. */
static int info(const char *arg) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "'%s' ckpt info '%s' 2>&1", DT_CLI_PATH, arg);
    FILE *p = popen(cmd, "r");
    ASSERT_TRUE(p != NULL);
    size_t n = fread(out, 1, sizeof out - 1, p);
    out[n] = '\0';
    int status = pclose(p);
    ASSERT_TRUE(WIFEXITED(status));
    return WEXITSTATUS(status);
}

static void test_info(void) {
    char dir[256], path[512];
    snprintf(dir, sizeof dir, "/tmp/dt_ckinfo_XXXXXX");
    ASSERT_TRUE(mkdtemp(dir) != NULL);
    float params[300];
    for (int i = 0; i < 300; i++)
        params[i] = (float)i;
    int64_t step = 5;
    uint64_t rng[2] = {1234, 99};
    const char *cfg = "{\"model\": \"tiny\"}\n";
    dt_ckpt_section s[] = {
        {"params", DT_CKPT_F32, params, 300},
        {"step", DT_CKPT_I64, &step, 1},
        {"rng", DT_CKPT_U64, rng, 2},
        {"config", DT_CKPT_TEXT, cfg, strlen(cfg)},
    };
    ASSERT_OK(dt_ckpt_save(dir, step, s, 4, 2, path, sizeof path));

    ASSERT_EQ(info(path), 0);
    EXPECT_OUT("version 1");
    EXPECT_OUT("4 sections");
    EXPECT_OUT("checksum:  ok");
    EXPECT_OUT("step:      5");
    EXPECT_OUT("params");
    EXPECT_OUT("1.17 KiB");
    EXPECT_OUT("= 1234 99");
    EXPECT_OUT("{\"model\": \"tiny\"}");

    ASSERT_EQ(info(dir), 0); /* a directory shows what resume would load */
    EXPECT_OUT("ckpt-000005.dtck");

    /* Flip one byte of the parameters: shown, but checksum BAD and exit 1. */
    FILE *f = fopen(path, "r+b");
    ASSERT_TRUE(f != NULL);
    dt_ckpt *ck;
    ASSERT_OK(dt_ckpt_open(&ck, path));
    dt_ckpt_info pi;
    ASSERT_OK(dt_ckpt_find(ck, "params", &pi));
    long off = (long)pi.offset + 17;
    dt_ckpt_close(ck);
    fseek(f, off, SEEK_SET);
    int c = fgetc(f);
    fseek(f, off, SEEK_SET);
    fputc(c ^ 0x40, f);
    fclose(f);
    ASSERT_EQ(info(path), 1);
    EXPECT_OUT("checksum:  BAD");
    EXPECT_OUT("step:      5");

    ASSERT_OK(truncate(path, 100) == 0 ? DT_OK : DT_ERR_IO);
    ASSERT_EQ(info(path), 1);
    EXPECT_OUT("truncated");
    EXPECT_OUT(path);

    ASSERT_EQ(info("/nonexistent.dtck"), 1);
    EXPECT_OUT("does not exist");

    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    ASSERT_EQ(system(cmd), 0);
}

int main(void) {
    RUN(test_info);
    return TEST_SUMMARY();
}
