/*
 * test_train_ddp.c — data-parallel training as real processes.
 *
 *   equiv        N = 2 and 4 ranks with per-rank batch B match 1 rank with
 *                batch N*B after 5 steps (losses and final parameters within
 *                1e-5 relative), with global-norm clipping (update after the
 *                last bucket) and without it (update per bucket as it
 *                arrives), over several buckets.
 *   accum        the same with 2 micro-batches of accumulation, which must
 *                also match 1 rank taking the whole batch at once.
 *   resume       2 ranks stopped and resumed: bit-identical losses/params,
 *                also in fp16 with loss scaling (a skipped step, a growing
 *                scale);
 *                resumed on 4 ranks instead (same global batch): the same
 *                losses within 1e-5.
 *   restart      `dtrain launch --max-restarts 1`: a rank SIGKILLs itself
 *                (DT_FAULT_KILL) mid-run; the job restarts by itself, resumes
 *                from the last checkpoint and ends bit-identical to a run
 *                that was never interrupted.
 *   sigterm      SIGTERM to `dtrain train --nproc 2`: every rank stops
 *                after the same step, which is checkpointed.
 *   check        --check-every catches a rank whose parameters drifted
 *                (DT_FAULT_PERTURB changes one on purpose).
 *   divisible    --global-batch not divisible by the ranks is refused.
 *   deterministic  --deterministic: 4 ranks over TCP with DT_ALGO ring, rhd
 *                and tree, 4 ranks on shared memory, and 2 hosts x 2 ranks
 *                (two launchers on loopback: shm inside, TCP between) all
 *                give bit-identical losses and parameters; without it the
 *                ring and rhd runs differ (so the comparison can fail).
 *   priority     --comm-priority critical gives the bits of fifo (losses,
 *                gradient norms, parameters) where a reduction's bits do not
 *                depend on how the buffer is cut: 2 ranks over TCP, 4 on
 *                shared memory, 4 over TCP with --deterministic; deferred
 *                steps (--clip 0: the next forward updates each layer) with
 *                evaluations, checkpoints and 2 micro-batches between them,
 *                and steps that wait (--clip 1), bf16 (the optimizer writes
 *                the 16-bit weight copy in the deferred updates); a stopped
 *                and resumed critical run equals an uninterrupted one; the
 *                header says what the order does, and the metrics carry
 *                fwd_lead_ms.
 * Run one case per process: test_train_ddp CASE.
 */
#include "train_util.h"

#include <math.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#define DTRAIN DT_CLI_PATH
/* AdamW's eps is 1e-4 here, not 1e-8: some gradients are zero in exact
 * arithmetic (the attention key bias: softmax ignores a shift common to all
 * keys) and in float32 are rounding noise ~1e-9 that depends on summation
 * order. Adam turns a gradient g into a step lr*g/(|g|+eps), amplifying that
 * noise by lr/eps; with 1e-8 two correct summation orders (1 rank vs N) then
 * differ by ~1e-4 relative on those elements, with 1e-4 by ~1e-6. SGD (also
 * tested) has no such amplification. */
#define TINY                                                                                       \
    "--model tiny --layers 2 --dim 32 --heads 2 --seq 32 --threads 1 --peak-flops 1e9 "            \
    "--sample-tokens 0 --progress plain --val-split 0 --bucket-size 16K --lr 1e-3 --warmup 1 "     \
    "--schedule linear --min-lr 1e-4 --eps 1e-4"

static char corpus[128];

/* Train into tu_dir/NAME; returns the final parameters. */
static float *train(const char *name, const char *extra, size_t *n, double *loss) {
    EXPECT_RC(tu_run("%s train --data %s " TINY " --steps 5 --ckpt-dir %s/%s/ck --run-dir %s/%s %s",
                     DTRAIN, corpus, tu_dir, name, tu_dir, name, extra),
              0);
    char p[192];
    snprintf(p, sizeof p, "%s/%s/metrics.jsonl", tu_dir, name);
    ASSERT_EQ(tu_losses(p, loss, 15), 5);
    snprintf(p, sizeof p, "%s/%s/ck", tu_dir, name);
    return tu_params(p, n);
}

/* Losses and parameters of b within 1e-5 relative of a (parameters: per
 * element, with a 1e-7 absolute floor for values near zero). */
static void expect_close(const char *what, const double *la, const double *lb, const float *pa,
                         const float *pb, size_t n) {
    for (int s = 1; s <= 5; s++)
        if (!(fabs(la[s] - lb[s]) <= 1e-5 * fabs(la[s])))
            TEST_FAILF("%s: step %d loss %.9g vs %.9g", what, s, la[s], lb[s]);
    double worst = 0;
    size_t wi = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)pa[i] - pb[i]) / (fabs((double)pa[i]) + 1e-2);
        if (d > worst) {
            worst = d;
            wi = i;
        }
        if (!(fabs((double)pa[i] - pb[i]) <= 1e-5 * fabs((double)pa[i]) + 1e-7))
            TEST_FAILF("%s: param %zu = %.9g vs %.9g", what, i, pa[i], pb[i]);
    }
    printf("  %s: losses %.6f..%.6f, worst param diff %.2g (rel, at %zu)\n", what, la[1], la[5],
           worst, wi);
}

static void run_equiv(const char *clip) {
    double l1[16], l2[16], l4[16];
    size_t n1, n2, n4;
    char extra[160];
    snprintf(extra, sizeof extra, "--global-batch 8 %s", clip);
    float *p1 = train("one", extra, &n1, l1);
    snprintf(extra, sizeof extra, "--global-batch 8 %s --nproc 2", clip);
    float *p2 = train("two", extra, &n2, l2);
    EXPECT_OUT("2 rank(s) x batch 4");
    /* Overlap: buckets of late layers started while backward still ran. */
    const char *ov = strstr(tu_out, "exposed (");
    int started = 0, buckets = 0;
    ASSERT_TRUE(ov && sscanf(strstr(ov, "); ") + 3, "%d of %d buckets", &started, &buckets) == 2);
    ASSERT_TRUE(buckets >= 4);
    ASSERT_TRUE(started >= buckets - 2);
    snprintf(extra, sizeof extra, "--batch 2 %s --nproc 4", clip);
    float *p4 = train("four", extra, &n4, l4);
    EXPECT_OUT("4 rank(s) x batch 2");
    ASSERT_EQ(n1, n2);
    ASSERT_EQ(n1, n4);
    char what[128];
    snprintf(what, sizeof what, "%s, 2 ranks", clip);
    expect_close(what, l1, l2, p1, p2, n1);
    snprintf(what, sizeof what, "%s, 4 ranks", clip);
    expect_close(what, l1, l4, p1, p4, n1);
    ASSERT_TRUE(l1[5] < l1[1]);
    /* The 2-rank run communicated: several buckets, bytes on the wire. */
    char p[192], line[2048];
    snprintf(p, sizeof p, "%s/two/metrics.jsonl", tu_dir);
    FILE *f = fopen(p, "r");
    ASSERT_TRUE(f && fgets(line, sizeof line, f));
    fclose(f);
    const char *b = strstr(line, "\"bytes_sent\":");
    ASSERT_TRUE(b && strtoull(b + 13, NULL, 10) >= n1 * 4 / 2);
    free(p1);
    free(p2);
    free(p4);
}

static void test_equiv(void) {
    run_equiv("--clip 1.0");
    run_equiv("--clip 0");
    run_equiv("--clip 0 --optimizer sgd --lr 0.1");
}

static void test_accum(void) {
    double l1[16], lk[16], l2[16], l4[16];
    size_t n1, nk, n2, n4;
    float *p1 = train("big", "--global-batch 8", &n1, l1);
    float *pk = train("acc1", "--global-batch 4 --accum 2", &nk, lk);
    float *p2 = train("acc2", "--global-batch 4 --accum 2 --nproc 2", &n2, l2);
    float *p4 = train("acc4", "--batch 1 --accum 2 --nproc 4", &n4, l4);
    expect_close("accum 2 vs one batch of 8", l1, lk, p1, pk, n1);
    expect_close("accum 2, 2 ranks", lk, l2, pk, p2, n1);
    expect_close("accum 2, 4 ranks", lk, l4, pk, p4, n1);
    free(p1);
    free(pk);
    free(p2);
    free(p4);
}

#define TEN    "--global-batch 4 --steps 10 --ckpt-every 2 --nproc 2 --clip 0.5"
#define SCALED " --precision fp16 --loss-scale-interval 2"

/* Cut a metrics line's text from "loss_scale" on after the value of
 * "skipped_steps" (times and other fields may follow it). */
static void keep_scale_fields(char *line) {
    char *k = strstr(line, "\"skipped_steps\":");
    if (k)
        k[strcspn(k, ",}")] = '\0';
}

/* The "loss_scale" and "skipped_steps" of every step of two runs agree. */
static void compare_scales(const char *a, const char *b, int steps) {
    char la[64][64], lb[64][64];
    ASSERT_TRUE(steps <= 64);
    ASSERT_EQ(tu_metric_text(a, "loss_scale", la, steps), steps);
    ASSERT_EQ(tu_metric_text(b, "loss_scale", lb, steps), steps);
    for (int i = 0; i < steps; i++) { /* the two fields alone: other fields may follow */
        keep_scale_fields(la[i]);
        keep_scale_fields(lb[i]);
    }
    for (int i = 0; i < steps; i++)
        if (strcmp(la[i], lb[i]) != 0)
            TEST_FAILF("step %d: %.60s uninterrupted, %.60s interrupted", i + 1, la[i], lb[i]);
    printf("  loss scaling: step 1 %.40s", la[0]);
    printf("  step %d %.40s", steps, la[steps - 1]);
}

/* Train run `full` for 10 steps, and run `cut` the same way stopped after
 * step 3 and resumed (env: variables for the first two commands; flags:
 * extra train flags). `full_says` must be in the full run's output; the
 * resumed run's output stays in tu_out. */
static void stop_and_resume(const char *full, const char *cut, const char *env, const char *flags,
                            const char *full_says) {
    EXPECT_RC(tu_run("%s %s train --data %s " TINY " " TEN
                     " %s --ckpt-dir %s/%s/ck --run-dir %s/%s",
                     env, DTRAIN, corpus, flags, tu_dir, full, tu_dir, full),
              0);
    if (full_says)
        EXPECT_OUT(full_says);
    EXPECT_RC(tu_run("%s %s train --data %s " TINY " " TEN
                     " %s --ckpt-dir %s/%s/ck --run-dir %s/%s --stop-after 3",
                     env, DTRAIN, corpus, flags, tu_dir, cut, tu_dir, cut),
              0);
    EXPECT_RC(tu_run("%s train --data %s " TINY " " TEN " %s --ckpt-dir %s/%s/ck --run-dir %s/%s "
                     "--resume",
                     DTRAIN, corpus, flags, tu_dir, cut, tu_dir, cut),
              0);
}

static void test_resume(void) {
    stop_and_resume("a", "b", "", "", NULL);
    EXPECT_OUT("at step 3");
    tu_compare_runs("a", "b", 10);
    /* fp16 with loss scaling: rank 0 finds an overflow at step 2 (the step
     * is skipped) and the scale grows every 2 clean steps. The scaler state and
     * the skipped-step count (AdamW's step count) are in the checkpoint, so
     * the resumed run is bit-identical, loss scales included. */
    stop_and_resume("s", "t", "DT_FAULT_OVERFLOW=0:2", SCALED, "1 step(s) skipped");
    EXPECT_OUT("at step 3, loss scale 32768");
    tu_compare_runs("s", "t", 10);
    compare_scales("s", "t", 10);
    /* The same through topk with error feedback: the residuals, kept in
     * the loss scale's units as it changes, resume bit-identically too. */
    stop_and_resume("u", "v", "DT_FAULT_OVERFLOW=0:2", SCALED " --compress topk:0.1", NULL);
    tu_compare_runs("u", "v", 10);
    compare_scales("u", "v", 10);
    /* Elastic: stopped on 2 ranks, resumed on 4 with the same global batch.
     * The data order is that of the global batch, so the run continues the
     * same trajectory (up to summation order). */
    EXPECT_RC(tu_run("%s train --data %s " TINY " " TEN
                     " --ckpt-dir %s/c/ck --run-dir %s/c --stop-after 3",
                     DTRAIN, corpus, tu_dir, tu_dir),
              0);
    EXPECT_RC(tu_run("%s train --data %s " TINY " " TEN " --ckpt-dir %s/c/ck --run-dir %s/c "
                     "--resume --nproc 4",
                     DTRAIN, corpus, tu_dir, tu_dir),
              0);
    EXPECT_OUT("4 rank(s) x batch 1");
    double la[64], lc[64];
    char pa[192], pc[192];
    snprintf(pa, sizeof pa, "%s/a/metrics.jsonl", tu_dir);
    snprintf(pc, sizeof pc, "%s/c/metrics.jsonl", tu_dir);
    ASSERT_EQ(tu_losses(pa, la, 63), 10);
    ASSERT_EQ(tu_losses(pc, lc, 63), 10);
    for (int s = 1; s <= 10; s++)
        ASSERT_NEAR(lc[s], la[s], 1e-5, 0);
}

static void test_restart(void) {
    const char *flags = TINY " --global-batch 4 --steps 10 --ckpt-every 2 --clip 0.5";
    EXPECT_RC(tu_run("%s launch -n 2 -- %s train --data %s %s --ckpt-dir %s/a/ck --run-dir %s/a",
                     DTRAIN, DTRAIN, corpus, flags, tu_dir, tu_dir),
              0);
    /* Rank 1 dies after step 5 (the last checkpoint is step 4); the
     * launcher restarts the job, which resumes by itself. */
    EXPECT_RC(tu_run("DT_FAULT_KILL=1:5 %s launch -n 2 --max-restarts 1 --grace 2 -- %s train "
                     "--data %s %s --ckpt-dir %s/b/ck --run-dir %s/b --resume",
                     DTRAIN, DTRAIN, corpus, flags, tu_dir, tu_dir),
              0);
    EXPECT_OUT("DT_FAULT_KILL: killing myself after step 5");
    EXPECT_OUT("resumed from");
    tu_compare_runs("a", "b", 10);
    /* Without restarts the same fault fails the job, naming the rank. */
    EXPECT_RC(tu_run("DT_FAULT_KILL=1:3 %s launch -n 2 --grace 2 -- %s train --data %s %s "
                     "--ckpt-dir %s/c/ck",
                     DTRAIN, DTRAIN, corpus, flags, tu_dir),
              128 + 9);
    EXPECT_OUT("rank 1");
}

/* SIGTERM to `dtrain train --nproc 2` (the launcher forwards it): both
 * ranks stop after the same step, which is checkpointed. */
static void test_sigterm(void) {
    char dir[128];
    snprintf(dir, sizeof dir, "%s/term", tu_dir);
    const char *args[] = {"--data",
                          corpus,
                          "--global-batch",
                          "4",
                          "--steps",
                          "1000000",
                          "--nproc",
                          "2",
                          "--ckpt-every",
                          "5",
                          "--model",
                          "tiny",
                          "--layers",
                          "2",
                          "--dim",
                          "32",
                          "--heads",
                          "2",
                          "--seq",
                          "32",
                          "--threads",
                          "1",
                          "--peak-flops",
                          "1e9",
                          "--val-split",
                          "0",
                          "--progress",
                          "plain",
                          NULL};
    int64_t last, saved;
    ASSERT_EQ(tu_interrupt(dir, SIGTERM, args, &last, &saved), 128 + SIGTERM);
    ASSERT_TRUE(last >= 5);
    ASSERT_EQ(saved, last);
}

/* --check-every compares parameter hashes across ranks: a rank whose
 * parameters were changed behind DDP's back is named. */
static void test_check(void) {
    EXPECT_RC(tu_run("%s train --data %s " TINY " --global-batch 4 --steps 6 --nproc 2 "
                     "--check-every 1",
                     DTRAIN, corpus),
              0);
    EXPECT_RC(tu_run("DT_FAULT_PERTURB=1:3 %s train --data %s " TINY
                     " --global-batch 4 --steps 6 --nproc 2 --check-every 1",
                     DTRAIN, corpus),
              1);
    EXPECT_OUT("parameters diverged at step 4: rank 1 hash");
}

static void test_divisible(void) {
    EXPECT_RC(
        tu_run("%s train --data %s " TINY " --global-batch 8 --nproc 3 --steps 1", DTRAIN, corpus),
        2);
    EXPECT_OUT("--global-batch 8 is not divisible by the 3 ranks");
}

static void det_run(const char *name, const char *env, const char *flags) {
    EXPECT_RC(tu_run("%s %s train --data %s " TINY " --global-batch 8 --steps 5 --ckpt-dir "
                     "%s/%s/ck --run-dir %s/%s %s",
                     env, DTRAIN, corpus, tu_dir, name, tu_dir, name, flags),
              0);
}

static void test_deterministic(void) {
    const char *det = "--deterministic --nproc 4";
    det_run("ring", "DT_TRANSPORT=tcp DT_ALGO=ring", det);
    det_run("rhd", "DT_TRANSPORT=tcp DT_ALGO=rhd", det);
    det_run("tree", "DT_TRANSPORT=tcp DT_ALGO=tree", det);
    det_run("shm", "DT_ALGO=ring", det);
    tu_compare_runs("ring", "rhd", 5);
    tu_compare_runs("ring", "tree", 5);
    tu_compare_runs("ring", "shm", 5);
    /* 2 hosts x 2 ranks: two launchers on loopback, node 1 first. */
    int port = test_free_port_pair();
    char train[1024];
    snprintf(train, sizeof train,
             "%s train --data %s " TINY " --global-batch 8 --steps 5 --ckpt-dir %s/hosts/ck "
             "--run-dir %s/hosts --deterministic",
             DTRAIN, corpus, tu_dir, tu_dir);
    EXPECT_RC(tu_run("DT_TIMEOUT=60 %s launch --nnodes 2 --node-rank 1 --master 127.0.0.1:%d -n 2 "
                     "%s & n1=$!; DT_TIMEOUT=60 %s launch --nnodes 2 --node-rank 0 --master "
                     "127.0.0.1:%d -n 2 %s; rc=$?; wait $n1 && exit $rc",
                     DTRAIN, port, train, DTRAIN, port, train),
              0);
    tu_compare_runs("ring", "hosts", 5);
    /* The control: the same two algorithms without the mode differ. */
    det_run("ring-free", "DT_TRANSPORT=tcp DT_ALGO=ring", "--nproc 4");
    det_run("rhd-free", "DT_TRANSPORT=tcp DT_ALGO=rhd", "--nproc 4");
    char pa[192], pb[192];
    snprintf(pa, sizeof pa, "%s/ring-free/ck", tu_dir);
    snprintf(pb, sizeof pb, "%s/rhd-free/ck", tu_dir);
    size_t na, nb;
    float *x = tu_params(pa, &na), *y = tu_params(pb, &nb);
    ASSERT_EQ(na, nb);
    size_t differ = 0;
    for (size_t i = 0; i < na; i++)
        differ += memcmp(&x[i], &y[i], sizeof *x) != 0;
    printf("  without --deterministic, ring and rhd differ in %zu of %zu parameters\n", differ, na);
    ASSERT_TRUE(differ > 0);
    free(x);
    free(y);
}

/* The grad_norm of every step of two runs agree bit for bit. */
static void compare_norms(const char *a, const char *b, int steps) {
    char la[64][64], lb[64][64];
    ASSERT_EQ(tu_metric_text(a, "grad_norm", la, steps), steps);
    ASSERT_EQ(tu_metric_text(b, "grad_norm", lb, steps), steps);
    for (int i = 0; i < steps; i++) {
        la[i][strcspn(la[i], ",")] = lb[i][strcspn(lb[i], ",")] = '\0';
        if (strcmp(la[i], lb[i]) != 0 || strstr(la[i], "null"))
            TEST_FAILF("step %d: %.60s in run %.40s, %.60s in run %.40s", i + 1, la[i], a, lb[i],
                       b);
    }
}

/* A 5-step run of 8 sequences per step with evaluations and checkpoints
 * every 2 steps (where a deferred step must complete first). */
static void prio_run(const char *name, const char *env, const char *flags) {
    EXPECT_RC(tu_run("%s %s train --data %s " TINY " --global-batch 8 --steps 5 --val-split 0.1 "
                     "--eval-every 2 --eval-batches 2 --ckpt-every 2 --ckpt-dir %s/%s/ck "
                     "--run-dir %s/%s %s",
                     env, DTRAIN, corpus, tu_dir, name, tu_dir, name, flags),
              0);
}

static void prio_pair(const char *name, const char *env, const char *flags) {
    char a[64], b[64], fa[256], fb[256];
    snprintf(a, sizeof a, "%s-fifo", name);
    snprintf(b, sizeof b, "%s-crit", name);
    snprintf(fa, sizeof fa, "--comm-priority fifo %s", flags);
    snprintf(fb, sizeof fb, "--comm-priority critical --comm-piece 8K %s", flags);
    prio_run(a, env, fa);
    prio_run(b, env, fb);
    EXPECT_OUT("gradient order: critical (the first layers first, pieces of ");
    tu_compare_runs(a, b, 5);
    compare_norms(a, b, 5);
    printf("  %s: fifo and critical agree bit for bit\n", name);
}

static void test_priority(void) {
    prio_pair("tcp2", "DT_TRANSPORT=tcp", "--nproc 2 --clip 0");
    EXPECT_OUT("the next forward overlaps the last pieces");
    /* Every step after the first says how early its forward started. */
    char path[192], line[2048];
    snprintf(path, sizeof path, "%s/tcp2-crit/metrics.jsonl", tu_dir);
    FILE *f = fopen(path, "r");
    ASSERT_TRUE(f != NULL);
    int leads = 0;
    while (fgets(line, sizeof line, f))
        leads += strstr(line, "\"fwd_lead_ms\":") != NULL;
    fclose(f);
    ASSERT_EQ(leads, 4);
    prio_pair("shm4", "", "--nproc 4 --clip 0 --accum 2");
    /* One bucket of the whole model in pieces of 72 KiB, both reduced by
     * halving-doubling (above 64 KiB): each element in an order set by where
     * its vector is cut, unless the mode fixes it. */
    const char *cut = "--nproc 4 --clip 0 --bucket-size 1M --comm-piece 72K";
    char flags[160];
    snprintf(flags, sizeof flags, "%s --deterministic", cut);
    prio_pair("det4", "DT_TRANSPORT=tcp", flags);
    /* The control: without the mode the two orders differ (so the
     * comparisons above can fail). */
    prio_run("ctl-fifo", "DT_TRANSPORT=tcp", cut);
    snprintf(flags, sizeof flags, "%s --comm-priority critical", cut);
    prio_run("ctl-crit", "DT_TRANSPORT=tcp", flags);
    char pa[192], pb[192];
    snprintf(pa, sizeof pa, "%s/ctl-fifo/ck", tu_dir);
    snprintf(pb, sizeof pb, "%s/ctl-crit/ck", tu_dir);
    size_t na, nb;
    float *x = tu_params(pa, &na), *y = tu_params(pb, &nb);
    ASSERT_EQ(na, nb);
    size_t differ = 0;
    for (size_t i = 0; i < na; i++)
        differ += memcmp(&x[i], &y[i], sizeof *x) != 0;
    printf("  4 ranks over TCP without --deterministic: %zu of %zu parameters differ\n", differ,
           na);
    ASSERT_TRUE(differ > 0);
    free(x);
    free(y);
    prio_pair("clip2", "DT_TRANSPORT=tcp", "--nproc 2 --clip 1.0");
    EXPECT_OUT("--clip waits for every gradient");
    /* bf16: the optimizer writes the 16-bit weight copy as it updates, here
     * inside the next forward's parameter hooks. */
    prio_pair("bf16", "DT_TRANSPORT=tcp", "--nproc 2 --clip 0 --precision bf16");
    EXPECT_OUT("precision bf16");
    /* Stopped after step 3 (deferred) and resumed: the checkpoint holds
     * the completed step. */
    stop_and_resume("ra", "rb", "DT_TRANSPORT=tcp", "--comm-priority critical --clip 0", NULL);
    EXPECT_OUT("at step 3");
    tu_compare_runs("ra", "rb", 10);
    compare_norms("ra", "rb", 10);
}

static const test_case cases[] = {
    {"priority", test_priority},   {"deterministic", test_deterministic},
    {"equiv", test_equiv},         {"accum", test_accum},
    {"resume", test_resume},       {"restart", test_restart},
    {"sigterm", test_sigterm},     {"check", test_check},
    {"divisible", test_divisible},
};

int main(int argc, char **argv) {
    return tu_main(argc, argv, cases, sizeof cases / sizeof cases[0], corpus, sizeof corpus);
}
