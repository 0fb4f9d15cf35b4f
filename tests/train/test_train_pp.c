/*
 * test_train_pp.c — pipeline-parallel training as real processes, against
 * one rank.
 *
 *   equiv_pp2, equiv_pp3, equiv_pp4
 *                every schedule (gpipe, 1f1b, interleaved:2, zb) at pp = 2,
 *                3 and 4 stages (oversubscribed: 2 cores): the loss and the
 *                global gradient norm (clipped at 0.5, so the norm over
 *                the stages decides every update) of each of 20 steps, and
 *                the final parameters read back as global tensors, equal
 *                the 1-rank run's within 1e-5 (only the tied embedding's
 *                gradient is summed in another order; the step-1 loss is
 *                the same bits).
 *   equiv_mixed  dp 2 x pp 2 and tp 2 x pp 2 (--sp) at 4 ranks; bf16 with
 *                recomputation at pp = 2 (1f1b, interleaved:2, zb).
 *   reshard      a pp 2 run stopped and resumed at pp 2 is bit-identical to
 *                the uninterrupted one; pp 2 resumes at one rank, one rank
 *                at pp 2, interleaved pp 2 at dp 2.
 *   memory       measured in the run: stage 0 keeps at most P micro-batches
 *                alive with 1f1b, all M with gpipe (metrics pp_peak_live),
 *                and its activation memory (the header) is smaller; the
 *                bubble is reported in the metrics and the summary.
 *   kill         SIGKILL one stage (rank 2 of pp 4) in the middle of a step:
 *                every rank exits with an error within 10 s.
 *   errors       bad pipeline settings exit 2 naming them.
 * Run one case per process: test_train_pp CASE.
 */
#include "train_util.h"

#include "dtrain/nn.h"

#include <dirent.h>
#include <fcntl.h>
#include <math.h>

#define DTRAIN DT_CLI_PATH
#define TINY                                                                                       \
    "--model tiny --layers 8 --dim 32 --heads 4 --seq 32 --threads 1 --peak-flops 1e9 "            \
    "--sample-tokens 0 --progress plain --val-split 0 --lr 1e-3 --warmup 1 --schedule linear "     \
    "--min-lr 1e-4 --eps 1e-4 --global-batch 4 --clip 0.5"
#define STEPS 20

static char corpus[128];

/* tu_train with this test's flags. */
static float *train(const char *name, const char *extra, int steps, size_t *n, double *loss,
                    double *norm) {
    return tu_train(TINY, corpus, name, extra, steps, n, loss, norm);
}

/* Each schedule at P stages against one rank with the same micro-batches
 * (interleaving needs a multiple of P: 6 at P = 3). */
static void run_pp(int P) {
    static const char *const kinds[] = {"gpipe", "1f1b", "interleaved:2", "zb"};
    int M = P == 3 ? 6 : 4;
    double l1[64], n1[64], l2[64], n2[64];
    size_t na, nb;
    char name[64], extra[256];
    snprintf(extra, sizeof extra, "--micro-batches %d", M);
    float *pa = train("one", extra, STEPS, &na, l1, n1);
    for (int k = 0; k < 4; k++) {
        snprintf(name, sizeof name, "pp%d_%d", P, k);
        snprintf(extra, sizeof extra, "--nproc %d --pp %d --pp-schedule %s --micro-batches %d", P,
                 P, kinds[k], M);
        float *pb = train(name, extra, STEPS, &nb, l2, n2);
        ASSERT_EQ(na, nb);
        if (l1[1] != l2[1])
            TEST_FAILF("%s: step 1 loss %.9g, one rank %.9g (the same bits expected)", extra, l2[1],
                       l1[1]);
        tu_expect_close(extra, STEPS, l1, l2, n1, n2, pa, pb, na, 1e-5);
        free(pb);
    }
    free(pa);
}

static void test_equiv_pp2(void) { run_pp(2); }
static void test_equiv_pp3(void) { run_pp(3); }
static void test_equiv_pp4(void) { run_pp(4); }

static void test_equiv_mixed(void) {
    double l1[64], n1[64], l2[64], n2[64];
    size_t na, nb;
    float *pa = train("one", "--micro-batches 4", STEPS, &na, l1, n1);
    static const char *const layouts[] = {
        "--nproc 4 --pp 2 --micro-batches 4",
        "--nproc 4 --pp 2 --pp-schedule zb --micro-batches 4",
        "--nproc 4 --tp 2 --sp --pp 2 --micro-batches 4",
    };
    for (int i = 0; i < 3; i++) {
        char name[32];
        snprintf(name, sizeof name, "mixed%d", i);
        float *pb = train(name, layouts[i], STEPS, &nb, l2, n2);
        ASSERT_EQ(na, nb);
        /* tp adds the row-parallel layers' reduction order (as test_train_tp). */
        tu_expect_close(layouts[i], STEPS, l1, l2, n1, n2, pa, pb, na, i == 2 ? 2e-5 : 1e-5);
        free(pb);
    }
    free(pa);
    /* bf16 with recomputation: the same bf16 arithmetic per stage, but a
     * tied-embedding gradient that differs by rounding can round an
     * activation to the neighbouring bf16 value (as in test_train_tp). */
    pa = train("one_bf16", "--micro-batches 4 --precision bf16 --recompute blocks", STEPS, &na, l1,
               n1);
    static const char *const kinds[] = {"1f1b", "interleaved:2", "zb"};
    for (int k = 0; k < 3; k++) {
        char name[32], extra[192];
        snprintf(name, sizeof name, "bf16_%d", k);
        snprintf(extra, sizeof extra,
                 "--nproc 2 --pp 2 --pp-schedule %s --micro-batches 4 --precision bf16 "
                 "--recompute blocks",
                 kinds[k]);
        float *pb = train(name, extra, STEPS, &nb, l2, n2);
        tu_expect_close(extra, STEPS, l1, l2, n1, n2, pa, pb, na, 5e-3);
        free(pb);
    }
    free(pa);
}

/* tu_reshard with this test's flags, stopping after STEPS / 2. */
static void reshard(const char *name, const char *a, const char *b, bool bitwise) {
    tu_reshard(TINY, corpus, name, a, b, bitwise ? 0 : 1e-5, STEPS);
}

static void test_reshard(void) {
    reshard("same_pp2", "--nproc 2 --pp 2 --micro-batches 4", "--nproc 2 --pp 2 --micro-batches 4",
            true);
    reshard("same_zb", "--nproc 2 --pp 2 --pp-schedule zb --micro-batches 4",
            "--nproc 2 --pp 2 --pp-schedule zb --micro-batches 4", true);
    reshard("pp2_to_one", "--nproc 2 --pp 2 --micro-batches 4", "--micro-batches 4", false);
    reshard("one_to_pp2", "--micro-batches 4", "--nproc 2 --pp 2 --micro-batches 4", false);
    reshard("interleaved_to_dp2", "--nproc 2 --pp 2 --pp-schedule interleaved:2 --micro-batches 4",
            "--nproc 2 --micro-batches 4", false);
}

/* The most micro-batches stage 0 kept alive (pp_peak_live of rank 0), and
 * its activation memory from the header. */
static int peak_live(const char *name) {
    char text[64][64];
    int n = tu_metric_text(name, "pp_peak_live", text, 63), most = 0;
    for (int i = 0; i < n; i++) {
        int v = atoi(text[i] + strlen("\"pp_peak_live\":"));
        most = v > most ? v : most;
    }
    return most;
}

static double activations_mib(void) {
    const char *at = strstr(tu_out, "activations ");
    ASSERT_TRUE(at != NULL);
    double v;
    char unit[8];
    ASSERT_EQ(sscanf(at, "activations %lf %7s", &v, unit), 2);
    return strcmp(unit, "KiB") == 0 ? v / 1024 : strcmp(unit, "GiB") == 0 ? v * 1024 : v;
}

static void test_memory(void) {
    double l[64], g[64];
    size_t n;
    free(train("gpipe", "--nproc 2 --pp 2 --pp-schedule gpipe --micro-batches 8", 3, &n, l, g));
    double act_gpipe = activations_mib();
    EXPECT_OUT("pipeline bubble");
    EXPECT_OUT("(theory 11.1%), 8 micro-batch(es) alive at most");
    free(train("1f1b", "--nproc 2 --pp 2 --pp-schedule 1f1b --micro-batches 8", 3, &n, l, g));
    double act_1f1b = activations_mib();
    EXPECT_OUT("2 micro-batch(es) alive at most");
    ASSERT_EQ(peak_live("gpipe"), 8);
    ASSERT_EQ(peak_live("1f1b"), 2);
    printf("  stage 0 activations: gpipe %.2f MiB (8 alive), 1f1b %.2f MiB (2 alive)\n", act_gpipe,
           act_1f1b);
    ASSERT_TRUE(act_1f1b < act_gpipe / 2);
    char text[64][64];
    ASSERT_EQ(tu_metric_text("1f1b", "pp_bubble", text, 63), 3);
    double b = strtod(text[2] + strlen("\"pp_bubble\":"), NULL);
    ASSERT_TRUE(b > 0 && b < 1);
}

/* The launcher's children (the ranks) and the one whose DT_RANK is `rank`. */
static pid_t child_rank(pid_t parent, int rank) {
    DIR *d = opendir("/proc");
    ASSERT_TRUE(d != NULL);
    struct dirent *e;
    pid_t found = 0;
    while (!found && (e = readdir(d))) {
        pid_t pid = (pid_t)atoi(e->d_name);
        if (pid <= 0)
            continue;
        char p[64], buf[4096];
        snprintf(p, sizeof p, "/proc/%d/stat", (int)pid);
        FILE *f = fopen(p, "r");
        if (!f)
            continue;
        int ppid = 0;
        char *close_paren = fgets(buf, sizeof buf, f) ? strrchr(buf, ')') : NULL;
        fclose(f);
        if (!close_paren || sscanf(close_paren + 2, "%*c %d", &ppid) != 1 || ppid != parent)
            continue;
        snprintf(p, sizeof p, "/proc/%d/environ", (int)pid);
        int fd = open(p, O_RDONLY);
        if (fd < 0)
            continue;
        ssize_t len = read(fd, buf, sizeof buf - 1);
        close(fd);
        char want[32];
        snprintf(want, sizeof want, "DT_RANK=%d", rank);
        for (ssize_t i = 0; i < len; i += (ssize_t)strlen(buf + i) + 1)
            if (strcmp(buf + i, want) == 0)
                found = pid;
    }
    closedir(d);
    return found;
}

static void test_kill(void) {
    char run[128], log[160];
    snprintf(run, sizeof run, "%s/kill", tu_dir);
    snprintf(log, sizeof log, "%s/kill.log", tu_dir);
    pid_t pid = fork();
    ASSERT_TRUE(pid >= 0);
    if (pid == 0) {
        int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        dup2(fd, 1);
        dup2(fd, 2);
        execl(DTRAIN, "dtrain", "train", "--data", corpus, "--nproc", "4", "--pp", "4",
              "--micro-batches", "8", "--global-batch", "8", "--steps", "100000", "--model", "tiny",
              "--layers", "8", "--dim", "128", "--heads", "4", "--seq", "64", "--threads", "1",
              "--peak-flops", "1e9", "--val-split", "0", "--progress", "plain", "--run-dir", run,
              (char *)NULL);
        _exit(127);
    }
    /* Wait for two steps, then kill stage 2 at a random moment. */
    char metrics[192];
    snprintf(metrics, sizeof metrics, "%s/metrics.jsonl", run);
    double t0 = dt_now();
    for (;;) {
        FILE *f = fopen(metrics, "r");
        int lines = 0;
        for (int c; f && (c = fgetc(f)) != EOF;)
            lines += c == '\n';
        if (f)
            fclose(f);
        if (lines >= 2)
            break;
        ASSERT_TRUE(dt_now() - t0 < 60);
        dt_sleep_ms(10);
    }
    pid_t victim = child_rank(pid, 2);
    ASSERT_TRUE(victim > 0);
    dt_rng r;
    dt_rng_init(&r, (uint64_t)dt_now(), dt_rng_stream_id(0, 0, DT_RNG_TEST));
    dt_sleep_ms(dt_rng_below(&r, 40));
    double tk = dt_now();
    ASSERT_EQ(kill(victim, SIGKILL), 0);
    int status;
    while (waitpid(pid, &status, WNOHANG) == 0) {
        if (dt_now() - tk > 30) {
            kill(pid, SIGKILL);
            TEST_FAILF("the job still runs 30 s after stage 2 was killed");
        }
        dt_sleep_ms(10);
    }
    double took = dt_now() - tk;
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) != 0);
    ASSERT_EQ(tu_run("cat %s", log), 0);
    EXPECT_OUT("rank 2");
    printf("  every rank exited %.1f s after stage 2 was killed\n", took);
    if (took > 10)
        TEST_FAILF("the job took %.1f s to exit after stage 2 was killed (at most 10)", took);
}

static void test_errors(void) {
    EXPECT_RC(tu_run("%s train --data %s " TINY " --steps 1 --nproc 2 --pp 3", DTRAIN, corpus), 2);
    EXPECT_OUT("not a multiple of --tp 1 x --pp 3");
    EXPECT_RC(tu_run("%s train --data %s " TINY " --steps 1 --pp-schedule zb", DTRAIN, corpus), 2);
    EXPECT_OUT("--pp-schedule zb needs --pp 2 or more");
    EXPECT_RC(tu_run("%s train --data %s " TINY " --steps 1 --nproc 2 --pp 2 --pp-schedule fast",
                     DTRAIN, corpus),
              2);
    EXPECT_OUT("--pp-schedule \"fast\"");
    EXPECT_RC(tu_run("%s train --data %s " TINY
                     " --steps 1 --nproc 2 --pp 2 --pp-schedule interleaved:2 --micro-batches 3",
                     DTRAIN, corpus),
              2);
    EXPECT_OUT("multiple of");
    EXPECT_RC(
        tu_run("%s train --data %s " TINY " --steps 1 --nproc 2 --pp 2 --layers 1", DTRAIN, corpus),
        2);
    EXPECT_OUT("but the model has 1 layers");
    EXPECT_RC(
        tu_run("%s train --data %s " TINY " --steps 1 --accum 2 --micro-batches 4", DTRAIN, corpus),
        2);
    EXPECT_OUT("--micro-batches 4 and --accum 2");
}

int main(int argc, char **argv) {
    static const test_case cases[] = {
        {"equiv_pp2", test_equiv_pp2}, {"equiv_pp3", test_equiv_pp3},
        {"equiv_pp4", test_equiv_pp4}, {"equiv_mixed", test_equiv_mixed},
        {"reshard", test_reshard},     {"memory", test_memory},
        {"kill", test_kill},           {"errors", test_errors},
    };
    return tu_main(argc, argv, cases, sizeof cases / sizeof cases[0], corpus, sizeof corpus);
}
