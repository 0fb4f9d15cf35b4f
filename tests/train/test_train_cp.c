/*
 * test_train_cp.c — context-parallel training as real processes, against
 * one rank.
 *
 *   equiv     cp 2 in each mode in fp32 and bf16, cp 4 ring, dp 2 x cp 2, cp 2 x tp 2 (with and
 * without
 *             --sp), cp 2 x pp 2 (1f1b and zero-bubble), cp 2 with ZeRO 1
 *             and 3 and with recomputation: the loss and global gradient norm of each of
 *             20 steps and the final parameters (read back from the
 *             layout-independent checkpoint) equal the 1-rank run's within
 *             a tolerance for the summation order (fp32 2e-5 relative, bf16
 *             5e-3, as for tensor parallelism).
 *   resume    a cp 2 ring run stopped after 10 steps and resumed in its own
 *             layout is bit-identical to the uninterrupted one; one saved at
 *             cp 2 resumes on one rank, and one saved on one rank at cp 2,
 *             with the same losses within float tolerance.
 *   errors    what cannot be split exits 2 naming the numbers (heads not
 *             divisible by cp with Ulysses, T not divisible by 2 cp with the
 *             ring, an unknown mode); a rank killed mid-run ends the job
 *             naming it; --cp-mode
 *             auto picks the ring where Ulysses cannot split the heads and
 *             config.json records the mode used.
 * Run one case per process: test_train_cp CASE.
 */
#include "train_util.h"

#define DTRAIN DT_CLI_PATH
#define TINY                                                                                       \
    "--model tiny --layers 2 --dim 32 --heads 4 --seq 32 --threads 1 --peak-flops 1e9 "            \
    "--sample-tokens 0 --progress plain --val-split 0 --lr 1e-3 --warmup 1 --schedule linear "     \
    "--min-lr 1e-4 --eps 1e-4 --global-batch 4"
#define STEPS 20

static char corpus[128];

/* tu_train with this test's flags. */
static float *train(const char *name, const char *extra, int steps, size_t *n, double *loss,
                    double *norm) {
    return tu_train(TINY, corpus, name, extra, steps, n, loss, norm);
}

static void test_equiv(void) {
    /* The 1-rank references: fp32, bf16, fp32 in 2 micro-batches (pp). */
    static const char *const refs[] = {"--precision fp32", "--precision bf16",
                                       "--precision fp32 --accum 2"};
    static const struct {
        int ref;
        const char *layout;
    } runs[] = {
        {0, "--nproc 2 --cp 2 --cp-mode ulysses"},
        {0, "--nproc 2 --cp 2 --cp-mode ring"},
        {0, "--nproc 4 --cp 4 --cp-mode ring"},
        {0, "--nproc 4 --cp 2 --cp-mode ulysses"}, /* dp 2 x cp 2 */
        {0, "--nproc 4 --cp 2 --tp 2 --sp --cp-mode ring"},
        {0, "--nproc 4 --cp 2 --tp 2 --cp-mode ulysses"},
        {0, "--nproc 2 --cp 2 --cp-mode ring --zero 1"},
        {0, "--nproc 2 --cp 2 --cp-mode ulysses --zero 3"},
        {0, "--nproc 2 --cp 2 --cp-mode ring --recompute blocks"},
        {1, "--nproc 2 --cp 2 --cp-mode ulysses"},
        {1, "--nproc 2 --cp 2 --cp-mode ring"},
        {2, "--nproc 4 --cp 2 --pp 2 --cp-mode ring"},
        {2, "--nproc 4 --cp 2 --pp 2 --cp-mode ulysses --pp-schedule zb"},
    };
    enum { NREF = sizeof refs / sizeof refs[0] };
    double l1[NREF][64], n1[NREF][64], l2[64], n2[64];
    size_t na[NREF], nb;
    float *one[NREF];
    for (int r = 0; r < NREF; r++) {
        char name[32];
        snprintf(name, sizeof name, "one_%d", r);
        one[r] = train(name, refs[r], STEPS, &na[r], l1[r], n1[r]);
    }
    for (size_t k = 0; k < sizeof runs / sizeof runs[0]; k++) {
        int r = runs[k].ref;
        char name[32], extra[256];
        snprintf(name, sizeof name, "cp_%zu", k);
        snprintf(extra, sizeof extra, "%s %s", refs[r], runs[k].layout);
        float *pb = train(name, extra, STEPS, &nb, l2, n2);
        ASSERT_EQ(na[r], nb);
        tu_expect_close(extra, STEPS, l1[r], l2, n1[r], n2, one[r], pb, nb, r == 1 ? 5e-3 : 2e-5);
        free(pb);
    }
    for (int r = 0; r < NREF; r++)
        free(one[r]);
}

/* tu_reshard with this test's flags, stopping after STEPS / 2. */
static void resume(const char *name, const char *a, const char *b, bool bitwise) {
    tu_reshard(TINY, corpus, name, a, b, bitwise ? 0 : 2e-5, STEPS);
}

static void test_resume(void) {
    resume("same_ring", "--nproc 2 --cp 2 --cp-mode ring", "--nproc 2 --cp 2 --cp-mode ring", true);
    resume("cp2_to_one", "--nproc 2 --cp 2 --cp-mode ulysses", "", false);
    resume("one_to_cp2", "", "--nproc 2 --cp 2 --cp-mode ring", false);
}

static void test_errors(void) {
    EXPECT_RC(tu_run("%s train --data %s " TINY " --steps 2 --nproc 2 --cp 2 --heads 2 --dim 32 "
                     "--cp-mode ulysses --layers 1 --seq 32",
                     DTRAIN, corpus),
              0); /* 2 heads / cp 2: fine */
    EXPECT_RC(tu_run("%s train --data %s " TINY " --steps 1 --nproc 3 --cp 3 --seq 30 "
                     "--cp-mode ulysses",
                     DTRAIN, corpus),
              2);
    EXPECT_OUT("--cp 3 does not divide the 4 attention heads");
    EXPECT_RC(tu_run("%s train --data %s " TINY " --steps 1 --nproc 2 --cp 2 --seq 30 "
                     "--cp-mode ring",
                     DTRAIN, corpus),
              2);
    EXPECT_OUT("the sequence length 30 is not a multiple of 4");
    /* A rank killed between ring steps: the job ends naming it, in seconds. */
    double t0 = dt_now();
    EXPECT_RC(tu_run("DT_FAULT_KILL=1:3 %s train --data %s " TINY " --steps 10 --nproc 2 --cp 2 "
                     "--cp-mode ring",
                     DTRAIN, corpus),
              128 + 9); /* the first failure's status, as the launcher passes it on */
    EXPECT_OUT("rank 1 (node 0, local rank 1");
    EXPECT_OUT("killed by signal 9");
    ASSERT_TRUE(dt_now() - t0 < 30);
    /* auto: 4 heads do not divide by cp 3, so the ring (30 = 5 x 2 cp),
     * and config.json says so. */
    EXPECT_RC(tu_run("%s train --data %s " TINY " --steps 2 --nproc 3 --cp 3 --seq 30 "
                     "--run-dir %s/auto",
                     DTRAIN, corpus, tu_dir),
              0);
    char p[192];
    snprintf(p, sizeof p, "%s/auto/config.json", tu_dir);
    FILE *f = fopen(p, "r");
    ASSERT_TRUE(f != NULL);
    char text[8192];
    size_t got = fread(text, 1, sizeof text - 1, f);
    text[got] = '\0';
    fclose(f);
    if (!strstr(text, "\"cp-mode\": \"ring\""))
        TEST_FAILF("config.json of --cp 3 (auto) does not record the ring:\n%.900s", text);
}

int main(int argc, char **argv) {
    static const test_case cases[] = {
        {"equiv", test_equiv},
        {"resume", test_resume},
        {"errors", test_errors},
    };
    return tu_main(argc, argv, cases, sizeof cases / sizeof cases[0], corpus, sizeof corpus);
}
