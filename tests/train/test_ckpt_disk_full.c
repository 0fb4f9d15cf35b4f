/*
 * test_ckpt_disk_full.c — a checkpoint that does not fit on the disk gives
 * DT_ERR_NOSPACE with a clear message, leaves no temp file, and the
 * previous checkpoint stays loadable.
 *
 * The "disk" is a 1 MiB tmpfs mounted in a private mount namespace (so it
 * disappears with the process). Without the privilege to do that the test
 * exits 77, which ctest reports as skipped.
 */
#include "dtrain/train.h"
#include "test.h"

#include <dirent.h>
#include <errno.h>
#include <sched.h>
#include <sys/mount.h>
#include <unistd.h>

static int count_entries(const char *dir) {
    DIR *d = opendir(dir);
    ASSERT_TRUE(d != NULL);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        n += strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0;
    closedir(d);
    return n;
}

enum { N = 100 * 1024 }; /* 400 KiB of floats */
static float params[N];
static int64_t step_val;

static void save_ok(const char *dir, int64_t step, size_t count) {
    step_val = step;
    for (size_t i = 0; i < count; i++)
        params[i] = (float)(step + (int64_t)i);
    dt_ckpt_section s[] = {{"step", DT_CKPT_I64, &step_val, 1},
                           {"params", DT_CKPT_F32, params, count}};
    ASSERT_OK(dt_ckpt_save(dir, step, s, 2, 2, NULL, 0));
}

static void expect_latest(const char *dir, int64_t step) {
    dt_ckpt *ck;
    ASSERT_OK(dt_ckpt_open_latest(&ck, dir));
    int64_t s;
    ASSERT_OK(dt_ckpt_read(ck, "step", DT_CKPT_I64, &s, 1));
    ASSERT_EQ(s, step);
    dt_ckpt_close(ck);
}

static char mnt[256];

static void test_disk_full(void) {
    char dir[300];
    snprintf(dir, sizeof dir, "%s/ckpts", mnt);
    save_ok(dir, 10, N);
    save_ok(dir, 20, N);
    expect_latest(dir, 20);
    /* keep=2 needs room for three files while the new one is written. */
    step_val = 30;
    dt_ckpt_section s[] = {{"step", DT_CKPT_I64, &step_val, 1}, {"params", DT_CKPT_F32, params, N}};
    ASSERT_STATUS(dt_ckpt_save(dir, 30, s, 2, 2, NULL, 0), DT_ERR_NOSPACE);
    ASSERT_CONTAINS(dt_last_error(), "ckpt-000030.dtck");
    ASSERT_CONTAINS(dt_last_error(), "No space left on device");
    printf("  message: %s\n", dt_last_error());
    ASSERT_EQ(count_entries(dir), 3); /* ckpt-10, ckpt-20, latest: no temp file */
    expect_latest(dir, 20);

    /* A file system that fills up while the data is being written (no
     * reservation possible for the tail): fill the disk with a ballast file
     * first, then a small checkpoint still fails cleanly. */
    char ballast[320];
    snprintf(ballast, sizeof ballast, "%s/ballast", mnt);
    FILE *f = fopen(ballast, "wb");
    ASSERT_TRUE(f != NULL);
    static char junk[4096];
    while (fwrite(junk, 1, sizeof junk, f) == sizeof junk && fflush(f) == 0) {
    }
    fclose(f);
    step_val = 40;
    dt_ckpt_section small[] = {{"step", DT_CKPT_I64, &step_val, 1},
                               {"params", DT_CKPT_F32, params, 4096}};
    dt_status st = dt_ckpt_save(dir, 40, small, 2, 2, NULL, 0);
    ASSERT_EQ(st, DT_ERR_NOSPACE);
    ASSERT_EQ(count_entries(dir), 3);
    expect_latest(dir, 20);
    unlink(ballast);
    save_ok(dir, 50, 4096); /* space is back: saving works again */
    expect_latest(dir, 50);
}

int main(void) {
    dt_log_set_level(DT_LOG_LEVEL_ERROR);
    if (unshare(CLONE_NEWNS) != 0) {
        printf("SKIP: cannot create a mount namespace (%s); run as root to test a full disk\n",
               strerror(errno));
        return 77;
    }
    if (mount("none", "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0) {
        printf("SKIP: cannot make mounts private (%s)\n", strerror(errno));
        return 77;
    }
    snprintf(mnt, sizeof mnt, "/tmp/dt_diskfull_XXXXXX");
    ASSERT_TRUE(mkdtemp(mnt) != NULL);
    if (mount("tmpfs", mnt, "tmpfs", 0, "size=1m") != 0) {
        printf("SKIP: cannot mount a tmpfs (%s)\n", strerror(errno));
        rmdir(mnt);
        return 77;
    }
    RUN(test_disk_full);
    umount2(mnt, MNT_DETACH);
    rmdir(mnt);
    return TEST_SUMMARY();
}
