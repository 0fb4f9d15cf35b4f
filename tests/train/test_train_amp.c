/*
 * test_train_amp.c — mixed precision in `dtrain train`, as real processes.
 *
 *   overflow     dynamic loss scaling on 2 ranks. (1) DT_FAULT_OVERFLOW puts
 *                an inf into rank 1's averaged gradient at step 3 only: both
 *                ranks log the skip of step 3 (rank 0 because another rank
 *                found it), --check-every 1 finds their parameters equal
 *                after every step, the checkpoints of steps 2 and 3 hold the
 *                same parameters and AdamW state, the scale halves, and the
 *                loss keeps falling. The same fault without scaling stops
 *                the run naming the step. (2) fp16 with a loss scale of 2^40
 *                overflows for real: several skipped steps, the scale
 *                backing off at each, then clean steps and a falling loss,
 *                the same skips logged by both ranks; also with the
 *                gradients on an fp16 wire, topk and PowerSGD (with error
 *                feedback).
 *                In fp32 a scaled run through topk (error feedback) equals
 *                an unscaled one bit for bit while the scale grows.
 *   precision    bf16 and fp16 runs reach a validation loss within 2% of the
 *                fp32 run after the same number of steps (a small model on
 *                an English-like corpus; bench/precision-eval.sh is the
 *                full shakespeare-char version).
 * Run one case per process: test_train_amp CASE.
 */
#include "train_util.h"

#include <math.h>

#define DTRAIN DT_CLI_PATH
#define TINY                                                                                       \
    "--model tiny --layers 2 --dim 32 --heads 2 --seq 32 --threads 1 --peak-flops 1e9 "            \
    "--sample-tokens 0 --progress plain --val-split 0 --bucket-size 16K --lr 1e-3 --warmup 1 "     \
    "--schedule linear --min-lr 1e-4 --global-batch 4 --nproc 2"

static char corpus[128];

/* One step's line of metrics.jsonl. */
typedef struct step_line {
    double loss, grad_norm, loss_scale;
    long long skipped_steps;
} step_line;

/* A number or null after "key": in a metrics line (null -> NaN). */
static double json_num(const char *line, const char *key) {
    char k[64];
    snprintf(k, sizeof k, "\"%s\":", key);
    const char *p = strstr(line, k);
    if (!p)
        TEST_FAILF("no %s in metrics line %.300s", key, line);
    p += strlen(k);
    return strncmp(p, "null", 4) == 0 ? NAN : strtod(p, NULL);
}

/* Read RUN/metrics.jsonl into s[1..]; returns the number of steps. */
static int read_steps(const char *run, step_line *s, int max) {
    char path[192], line[2048];
    snprintf(path, sizeof path, "%s/metrics.jsonl", run);
    FILE *f = fopen(path, "r");
    ASSERT_TRUE(f != NULL);
    int n = 0;
    while (fgets(line, sizeof line, f)) {
        int step = (int)json_num(line, "step");
        ASSERT_TRUE(step >= 1 && step <= max);
        s[step] =
            (step_line){json_num(line, "loss"), json_num(line, "grad_norm"),
                        json_num(line, "loss_scale"), (long long)json_num(line, "skipped_steps")};
        n = step > n ? step : n;
    }
    fclose(f);
    return n;
}

/* Section `name` of checkpoint DIR/ckpt-<step>.dtck (caller frees). */
static void *ckpt_section(const char *dir, int64_t step, const char *name, size_t *bytes) {
    char path[256];
    dt_ckpt_path(path, sizeof path, dir, step);
    dt_ckpt *ck;
    ASSERT_OK(dt_ckpt_open(&ck, path));
    dt_ckpt_info info;
    ASSERT_OK(dt_ckpt_find(ck, name, &info));
    void *p = malloc(info.bytes);
    memcpy(p, info.data, info.bytes);
    *bytes = info.bytes;
    dt_ckpt_close(ck);
    return p;
}

static void expect_same_section(const char *dir, int64_t a, int64_t b, const char *name) {
    size_t na, nb;
    void *x = ckpt_section(dir, a, name, &na), *y = ckpt_section(dir, b, name, &nb);
    ASSERT_EQ(na, nb);
    if (memcmp(x, y, na) != 0)
        TEST_FAILF("section %s differs between the checkpoints of steps %lld and %lld", name,
                   (long long)a, (long long)b);
    free(x);
    free(y);
}

/* Does the last output hold "[RANK] DEBUG amp: step STEP: ..." ? */
static bool logged_skip(int rank, int step, const char *why) {
    char needle[160];
    snprintf(needle, sizeof needle, "[%d] DEBUG amp: step %d: %s", rank, step, why);
    return strstr(tu_out, needle) != NULL;
}

static void test_overflow_fault(void) {
    char ck[160], run[160];
    snprintf(ck, sizeof ck, "%s/f/ck", tu_dir);
    snprintf(run, sizeof run, "%s/f", tu_dir);
    EXPECT_RC(tu_run("DT_LOG=debug DT_LOG_SUBSYS=amp DT_FAULT_OVERFLOW=1:3 %s train --data %s " TINY
                     " --steps 8 --loss-scaling on --check-every 1 --ckpt-dir %s --ckpt-every 1 "
                     "--keep 10 --run-dir %s",
                     DTRAIN, corpus, ck, run),
              0);
    EXPECT_OUT("loss scaling on (from 65536");
    EXPECT_OUT("1 step(s) skipped");
    if (!logged_skip(0, 3,
                     "another rank found inf/nan gradients; skipped, loss scale 65536 -> "
                     "32768") ||
        !logged_skip(1, 3, "inf/nan in this rank's gradients; skipped")) {
        fprintf(stderr, "output was:\n%s\n", tu_out);
        TEST_FAILF("expected both ranks to log the skip of step 3");
    }
    step_line s[16];
    ASSERT_EQ(read_steps(run, s, 15), 8);
    for (int i = 1; i <= 8; i++) {
        ASSERT_EQ(s[i].skipped_steps, i >= 3 ? 1 : 0);
        ASSERT_EQ(s[i].loss_scale, i <= 3 ? 65536.0 : 32768.0);
        ASSERT_TRUE(i == 3 ? !isfinite(s[i].grad_norm) : isfinite(s[i].grad_norm));
    }
    ASSERT_TRUE(s[8].loss < s[1].loss);
    /* The skipped step 3 left parameters and optimizer state as step 2 had
     * them; step 4 changed them again. */
    expect_same_section(ck, 2, 3, "params");
    expect_same_section(ck, 2, 3, "adamw.m");
    expect_same_section(ck, 2, 3, "adamw.v");
    size_t nb;
    float *p3 = ckpt_section(ck, 3, "params", &nb), *p4 = ckpt_section(ck, 4, "params", &nb);
    ASSERT_TRUE(memcmp(p3, p4, nb) != 0);
    free(p3);
    free(p4);
    int64_t *sk = ckpt_section(ck, 3, "skipped_steps", &nb);
    ASSERT_EQ(nb, sizeof(int64_t));
    ASSERT_EQ(*sk, 1);
    free(sk);
    double *sc = ckpt_section(ck, 3, "scaler", &nb);
    ASSERT_EQ(nb, 4 * sizeof(double));
    ASSERT_EQ(sc[0], 32768.0); /* the scale the next step uses */
    ASSERT_EQ(sc[2], 1.0);     /* skipped */
    ASSERT_EQ(sc[3], 3.0);     /* updates */
    free(sc);

    /* Without scaling an inf gradient is an error that names the step. */
    EXPECT_RC(tu_run("DT_FAULT_OVERFLOW=1:3 %s train --data %s " TINY " --steps 8", DTRAIN, corpus),
              1);
    EXPECT_OUT("gradient norm is infinite at step 3");
    /* A scale whose inverse is not a normal float is refused. */
    EXPECT_RC(tu_run("%s train --data %s " TINY " --steps 1 --loss-scaling on "
                     "--loss-scale-init 1e38",
                     DTRAIN, corpus),
              2);
    EXPECT_OUT("--loss-scale-init 1e+38: at most 2^126");
}

/* fp16 with a loss scale far too large (this model's fp16 gradients overflow
 * above about 2^20; the backoff of 1/16 gets there in a few steps): real overflows until the scale
 * has backed off, then clean training. */
static void test_overflow_fp16(const char *name, const char *extra) {
    char run[160];
    snprintf(run, sizeof run, "%s/%s", tu_dir, name);
    EXPECT_RC(tu_run("DT_LOG=debug DT_LOG_SUBSYS=amp %s train --data %s " TINY
                     " --steps 30 --log-every 100 --precision fp16 --loss-scale-init 0x1p40 "
                     "--loss-scale-backoff 0.0625 --check-every 1 --run-dir %s %s",
                     DTRAIN, corpus, run, extra),
              0);
    EXPECT_OUT("precision fp16");
    EXPECT_OUT("loss scaling on");
    step_line s[48];
    ASSERT_EQ(read_steps(run, s, 47), 30);
    /* Skipped steps come first, each with a smaller scale than the last. */
    int first_clean = 0;
    for (int i = 1; i <= 30 && !first_clean; i++)
        if (s[i].skipped_steps < i)
            first_clean = i;
    printf("  fp16 from 2^40 %s: %d skipped steps, clean from step %d at scale %g; loss %.4f -> "
           "%.4f\n",
           extra, first_clean - 1, first_clean, s[first_clean].loss_scale, s[first_clean].loss,
           s[30].loss);
    ASSERT_TRUE(first_clean >= 3);
    for (int i = 2; i < first_clean; i++) {
        /* 9 digits in the file: exact once rounded back to float */
        ASSERT_EQ((float)s[i].loss_scale, (float)s[i - 1].loss_scale * 0.0625f);
        if (!logged_skip(0, i, "inf/nan in this rank's gradients") ||
            !logged_skip(1, i, "inf/nan in this rank's gradients")) {
            fprintf(stderr, "output was:\n%s\n", tu_out);
            TEST_FAILF("expected both ranks to log the skip of step %d", i);
        }
    }
    /* Then it trains: clean steps, the scale no higher (growth comes after
     * 2000 clean steps; an occasional later overflow may halve it), and
     * the skipped count printed at the end. */
    for (int i = first_clean + 1; i <= 30; i++)
        if (s[i].skipped_steps > s[i - 1].skipped_steps)
            printf("  a later overflow at step %d (scale %g -> %g)\n", i, s[i].loss_scale,
                   s[i + (i < 30)].loss_scale);
    ASSERT_TRUE(s[30].skipped_steps <= first_clean + 2);
    ASSERT_TRUE(s[30].loss_scale <= s[first_clean].loss_scale);
    char want[64];
    snprintf(want, sizeof want, "%lld step(s) skipped", s[30].skipped_steps);
    EXPECT_OUT(want);
    ASSERT_EQ((float)s[1].loss_scale, 0x1p40f);
    ASSERT_TRUE(s[30].loss < s[first_clean].loss - 0.1);
}

/* In fp32, scaling by powers of two is exact, so a scaled run equals an
 * unscaled one bit for bit, including through topk with error feedback,
 * whose residuals are in the scale's units and must be rescaled each time
 * the scale grows (here every 2 steps, 2^16 -> 2^20). */
static void test_scaled_codec(void) {
    char a[160], b[160];
    snprintf(a, sizeof a, "%s/plain", tu_dir);
    snprintf(b, sizeof b, "%s/scaled", tu_dir);
    EXPECT_RC(tu_run("%s train --data %s " TINY " --steps 10 --compress topk:0.1 --run-dir %s "
                     "--ckpt-dir %s/ck",
                     DTRAIN, corpus, a, a),
              0);
    EXPECT_RC(tu_run("%s train --data %s " TINY " --steps 10 --compress topk:0.1 --run-dir %s "
                     "--ckpt-dir %s/ck --loss-scaling on --loss-scale-interval 2",
                     DTRAIN, corpus, b, b),
              0);
    step_line x[16], y[16];
    ASSERT_EQ(read_steps(a, x, 15), 10);
    ASSERT_EQ(read_steps(b, y, 15), 10);
    ASSERT_EQ(y[10].loss_scale, 0x1p20);
    for (int i = 1; i <= 10; i++)
        if (x[i].loss != y[i].loss)
            TEST_FAILF("step %d: loss %.9g unscaled, %.9g scaled", i, x[i].loss, y[i].loss);
    char pa[192], pb[192];
    snprintf(pa, sizeof pa, "%s/ck", a);
    snprintf(pb, sizeof pb, "%s/ck", b);
    size_t na, nb;
    float *p = tu_params(pa, &na), *q = tu_params(pb, &nb);
    ASSERT_EQ(na, nb);
    ASSERT_TRUE(memcmp(p, q, na * sizeof *p) == 0);
    free(p);
    free(q);
}

static void test_overflow(void) {
    test_scaled_codec();
    test_overflow_fault();
    test_overflow_fp16("h", "");
    /* With the gradients on a 16-bit wire or through a codec with error
     * feedback (the DDP codecs of docs/compress.md) the scaled gradients
     * overflow there too, and the residuals must not carry an inf into
     * later steps: the same recovery. */
    test_overflow_fp16("h16", "--grad-dtype fp16");
    test_overflow_fp16("htopk", "--compress topk:0.1");
    test_overflow_fp16("hpsgd", "--compress powersgd:2");
}

/* A small GPT (2 layers, dim 64, 4 heads, T 64; 106k parameters) on 200 KB
 * of English-like characters, 2 ranks x batch 4, 300 AdamW steps: the val
 * loss falls from ln 26 = 3.26 (uniform over the 26 characters) to 1.33,
 * still falling, so every evaluation compares models in the middle of learning,
 * where a wrong gradient or a lost update shows at once (the fp32 val loss
 * moves by ~10% between steps 100 and 200). Each evaluation (every 50
 * steps, 8 batches) of bf16 and fp16 must be within 2% of fp32's. A few
 * seconds per run in Release. */
#define SMALL                                                                                      \
    "--model tiny --layers 2 --dim 64 --heads 4 --seq 64 --threads 1 --peak-flops 1e9 "            \
    "--sample-tokens 0 --progress plain --log-every 1000 --val-split 0.1 --global-batch 8 "        \
    "--nproc 2 --lr 3e-3 --warmup 10 --eval-batches 8 --eval-every 50 --steps 300"
#define EVALS 6

/* Validation losses at steps 50, 100, ..., 300 of run NAME. */
static void val_losses(const char *name, double *v) {
    char path[192], line[2048];
    snprintf(path, sizeof path, "%s/%s/metrics.jsonl", tu_dir, name);
    FILE *f = fopen(path, "r");
    ASSERT_TRUE(f != NULL);
    int n = 0;
    while (fgets(line, sizeof line, f)) {
        double x = json_num(line, "val_loss");
        if (isfinite(x)) {
            ASSERT_TRUE(n < EVALS);
            ASSERT_EQ(json_num(line, "step"), 50.0 * (n + 1));
            v[n++] = x;
        }
    }
    fclose(f);
    ASSERT_EQ(n, EVALS);
}

static void test_precision(void) {
    static const char *const names[3] = {"fp32", "bf16", "fp16"};
    double v[3][EVALS];
    char big[128];
    snprintf(big, sizeof big, "%s/big.txt", tu_dir);
    tu_corpus(big, 200000);
    for (int p = 0; p < 3; p++) {
        EXPECT_RC(tu_run("%s train --data %s " SMALL " --precision %s --run-dir %s/%s "
                         "--ckpt-dir %s/%s/ck",
                         DTRAIN, big, names[p], tu_dir, names[p], tu_dir, names[p]),
                  0);
        char want[64];
        snprintf(want, sizeof want, "precision %s", names[p]);
        EXPECT_OUT(want);
        EXPECT_OUT(p == 2 ? "loss scaling on" : "loss scaling off");
        val_losses(names[p], v[p]);
    }
    printf("  step   fp32 val   bf16 (diff)        fp16 (diff)\n");
    for (int e = 0; e < EVALS; e++) {
        printf("  %4d   %.4f     %.4f (%+.3f%%)   %.4f (%+.3f%%)\n", 50 * (e + 1), v[0][e], v[1][e],
               100 * (v[1][e] / v[0][e] - 1), v[2][e], 100 * (v[2][e] / v[0][e] - 1));
        for (int p = 1; p < 3; p++)
            if (!(fabs(v[p][e] - v[0][e]) <= 0.02 * v[0][e]))
                TEST_FAILF("%s val loss %.5f at step %d is not within 2%% of fp32's %.5f", names[p],
                           v[p][e], 50 * (e + 1), v[0][e]);
    }
    /* It learned, and 2% separates stages of learning. */
    ASSERT_TRUE(v[0][EVALS - 1] < 0.5 * log(26.0));
    ASSERT_TRUE(fabs(v[0][1] - v[0][3]) > 0.02 * v[0][3]);

    /* Resuming in another precision is allowed: fp16 stopped at step 150,
     * finished in fp32 (the scaler state is ignored), lands within 2% too. */
    EXPECT_RC(tu_run("%s train --data %s " SMALL " --precision fp16 --run-dir %s/mix "
                     "--ckpt-dir %s/mix/ck --stop-after 150",
                     DTRAIN, big, tu_dir, tu_dir),
              0);
    EXPECT_RC(tu_run("%s train --data %s " SMALL " --precision fp32 --run-dir %s/mix "
                     "--ckpt-dir %s/mix/ck --resume",
                     DTRAIN, big, tu_dir, tu_dir),
              0);
    EXPECT_OUT("at step 150 (written in fp16, continuing in fp32)");
    double m[EVALS];
    val_losses("mix", m);
    printf("  fp16 to step 150, then fp32: val %.4f at step 300 (%+.3f%%)\n", m[EVALS - 1],
           100 * (m[EVALS - 1] / v[0][EVALS - 1] - 1));
    ASSERT_EQ(m[2], v[2][2]); /* the fp16 part is the fp16 run */
    ASSERT_NEAR(m[EVALS - 1], v[0][EVALS - 1], 0.02, 0);
}

static const test_case cases[] = {
    {"overflow", test_overflow},
    {"precision", test_precision},
};

int main(int argc, char **argv) {
    return tu_main(argc, argv, cases, sizeof cases / sizeof cases[0], corpus, sizeof corpus);
}
