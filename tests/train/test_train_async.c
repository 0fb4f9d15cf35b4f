/*
 * test_train_async.c — --dp-mode local and gossip (docs/async.md) as real
 * processes, against synchronous DDP.
 *
 *   local_equiv   --sync-every 1 (plain averaging) and a run that stays in
 *                 post-local SGD's synchronous phase are DDP bit for bit
 *                 (every loss, the final parameters); --sync-every 4 is
 *                 not (it must differ: the local steps are real), and
 *                 --check-every 4 finds the replicas equal after each
 *                 average.
 *   local_loss    80 steps at equal samples: local SGD (H 4, 8, SlowMo,
 *                 DiLoCo's Nesterov outer step) ends no more than 5%
 *                 above DDP's validation loss at 2 ranks and 10% at 4
 *                 ranks (smaller per-rank batches; an outer momentum may
 *                 end below DDP, down to 0.8x is accepted); every rank's final
 *                 parameters are equal (the last step averages).
 *   local_resume  stopped mid-period (step 6 of H 4) and resumed: bit-
 *                 identical to the uninterrupted run (each rank's own
 *                 parameters, optimizer state, anchor and outer momentum
 *                 come back), with SlowMo and the optimizer state averaged.
 *   gossip_equiv  the hypercube topology (an exact average every step) with
 *                 plain SGD equals DDP within float tolerance (1e-5) at 2
 *                 and 4 ranks: the losses the ranks agree on, the
 *                 validation loss every 2 steps and the final parameters
 *                 (parameter averaging after an SGD step is gradient
 *                 averaging, up to rounding).
 *   gossip_bytes  bytes per step do not grow with the ranks: exp sends one
 *                 vector at 2 and 4 ranks, ring two at 3 and 4; the
 *                 consensus distance is in the metrics every 10 steps,
 *                 0 at the start and for two replicas (a pair's mix is an
 *                 exact average), in (0, 1) for more; the final parameters of every
 *                 rank are equal; ring, exp and random at 4 ranks end no
 *                 more than 10% above DDP's validation loss; ring and
 *                 random resume bit-identically.
 *   errors        settings the modes refuse exit naming them.
 *   slow          DT_FAULT_SLOW=0:4 makes the shortest step at least 2x longer (4x
 *                 expected; the margin is for a loaded machine).
 *   ps_train      --dp-mode ps at 4 ranks with rank 1 three times slower:
 *                 K 2 S 2, K 4 S 0, K 1 S 4 with the seeds' compensation,
 *                 K 2 S 4 with DC-ASGD: every update counted (steps x 4
 *                 workers x K shards), none applied staler than S (the
 *                 servers' histogram; rank 0's per-step staleness in the
 *                 metrics), some stale when S > 0, validation loss no more
 *                 than 10% above DDP's (SGD) at equal samples (20% with
 *                 the seeds' rule, which shrinks stale steps).
 *                 The servers' optimizer is the run's: AdamW at K 2 S 2
 *                 ends within 10% of DDP with AdamW.
 *   ps_equiv      one rank: --dp-mode ps is DDP bit for bit; 4 ranks with
 *                 staleness 0 and plain SGD (no clipping, no weight decay)
 *                 equal DDP within
 *                 float tolerance (validation loss every 2 steps, final
 *                 parameters: W pushes of lr/W are one averaged step, up to
 *                 rounding).
 *   ps_resume     staleness 0 with AdamW and a straggler: two runs are
 *                 bit-identical, and one stopped after step 5 and resumed
 *                 equals them bit for bit. Staleness 2 (DC-ASGD, 3 servers,
 *                 a straggler) stopped after step 6: the checkpoint is
 *                 consistent (every server's clocks at 6, 6 x 4 updates on
 *                 each, its parameters exactly the servers' shards), and
 *                 the resumed run counts every update once.
 *   ps_delay      the delay compensation against a double-precision
 *                 serial reference of its formulas.
 *   ps_fault      a worker (rank 2) and a server (rank 1) killed mid-run:
 *                 the job fails within seconds (no hang), the lost rank
 *                 named.
 *   mode_fault    the same for local SGD (killed between two averages) and
 *                 gossip (ring and exp): the job fails in seconds, the
 *                 lost rank named.
 *   bf16          --precision bf16, where the model's 16-bit weight copy
 *                 must be re-rounded after every write of the parameters
 *                 by a mode (an average, a mix, a pull): local SGD H 1
 *                 equals DDP bit for bit (DDP's optimizer writes the copy
 *                 as it updates, local SGD's is rounded after the average);
 *                 local SGD stopped right after an average, gossip (every
 *                 step mixes) and the parameter server at staleness 0
 *                 stopped and resumed are bit-identical to the runs that
 *                 never stopped (a resumed run rounds its copy afresh from
 *                 the checkpoint, so a stale copy in the whole run would
 *                 show), and each of them trains (its loss falls).
 * Run one case per process: test_train_async CASE.
 */
#include "train_util.h"

#include "dtrain/ckpt.h"
#include "dtrain/parallel.h"

#include <math.h>

#define DTRAIN DT_CLI_PATH
#define TINY                                                                                       \
    "--model tiny --layers 4 --dim 32 --heads 4 --seq 32 --threads 1 --peak-flops 1e9 "            \
    "--sample-tokens 0 --progress plain --val-split 0 --lr 1e-3 --warmup 1 --schedule linear "     \
    "--min-lr 1e-4 --eps 1e-4 --global-batch 12 --clip 0.5 --bucket-size 16K"
/* Longer runs with a validation loss (local_loss, gossip_bytes). */
#define LONG                                                                                       \
    "--model tiny --layers 4 --dim 32 --heads 4 --seq 32 --threads 1 --peak-flops 1e9 "            \
    "--sample-tokens 0 --progress plain --val-split 0.1 --eval-batches 4 --lr 3e-3 --warmup 5 "    \
    "--schedule cosine --min-lr 3e-4 --global-batch 24 --clip 1 --bucket-size 16K"
#define STEPS      12
#define LONG_STEPS 80

static char corpus[128];

/* Train into tu_dir/NAME (checkpoints in NAME/ck). */
static void train(const char *name, const char *flags, int steps, const char *extra) {
    EXPECT_RC(tu_run("%s train --data %s %s --steps %d --ckpt-dir %s/%s/ck --run-dir %s/%s %s",
                     DTRAIN, corpus, flags, steps, tu_dir, name, tu_dir, name, extra),
              0);
}

/* The last validation loss of run NAME (its summary line). */
static double val_loss(void) {
    const char *at = strstr(tu_out, "val loss ");
    if (!at) {
        fprintf(stderr, "output was:\n%s\n", tu_out);
        TEST_FAILF("no validation loss in the summary");
    }
    return strtod(at + strlen("val loss "), NULL);
}

/* Every rank's own parameters (the first n floats of its sync state) in
 * the newest checkpoint of NAME are equal. */
static void ranks_agree(const char *name, size_t n, int ranks) {
    char dir[192];
    snprintf(dir, sizeof dir, "%s/%s/ck", tu_dir, name);
    dt_ckpt_set *set;
    ASSERT_OK(dt_ckpt_set_open_latest(&set, dir));
    dt_ckpt_info first = {0};
    for (int r = 0; r < ranks; r++) {
        dt_ckpt_info info;
        const dt_ckpt *f = dt_ckpt_set_file_of(set, r);
        ASSERT_TRUE(f != NULL);
        ASSERT_OK(dt_ckpt_find(f, "sync.state", &info));
        ASSERT_TRUE(info.bytes >= n * sizeof(float));
        if (r == 0)
            first = info;
        else if (memcmp(first.data, info.data, n * sizeof(float)) != 0)
            TEST_FAILF("%s: rank %d's final parameters differ from rank 0's", name, r);
    }
    dt_ckpt_set_close(set);
}

static void test_local_equiv(void) {
    train("ddp", TINY, STEPS, "--nproc 2");
    train("h1", TINY, STEPS, "--nproc 2 --dp-mode local --sync-every 1");
    tu_compare_runs("ddp", "h1", STEPS);
    train("post", TINY, STEPS, "--nproc 2 --dp-mode local --sync-every 4 --post-local-after 12");
    tu_compare_runs("ddp", "post", STEPS);
    printf("  --sync-every 1 and the post-local warm-up: DDP's bits\n");
    /* Local steps: other losses, replicas equal after every average. */
    train("h4", TINY, STEPS, "--nproc 2 --dp-mode local --sync-every 4 --check-every 4");
    double ld[64], lh[64];
    char p[192];
    snprintf(p, sizeof p, "%s/ddp/metrics.jsonl", tu_dir);
    tu_losses(p, ld, 63);
    snprintf(p, sizeof p, "%s/h4/metrics.jsonl", tu_dir);
    tu_losses(p, lh, 63);
    ASSERT_EQ(ld[1], lh[1]); /* the same start */
    int differ = 0;
    for (int s = 2; s <= STEPS; s++)
        differ += ld[s] != lh[s];
    if (differ < STEPS - 2)
        TEST_FAILF("--sync-every 4 matched DDP at %d of %d steps: no local steps?",
                   STEPS - 1 - differ, STEPS - 1);
}

static void test_local_loss(void) {
    static const char *const modes[] = {
        "--dp-mode local --sync-every 4",
        "--dp-mode local --sync-every 8",
        "--dp-mode local --sync-every 8 --outer slowmo --outer-lr 1 --outer-momentum 0.5",
        "--dp-mode local --sync-every 8 --outer nesterov --outer-lr 0.7 --outer-momentum 0.9",
    };
    for (int np = 2; np <= 4; np += 2) {
        char extra[256], name[32];
        snprintf(extra, sizeof extra, "--nproc %d", np);
        snprintf(name, sizeof name, "ddp%d", np);
        train(name, LONG, LONG_STEPS, extra);
        double ref = val_loss(), tol = np == 2 ? 0.05 : 0.10;
        size_t n;
        snprintf(extra, sizeof extra, "%s/%s/ck", tu_dir, name);
        free(tu_params(extra, &n));
        for (size_t m = 0; m < sizeof modes / sizeof *modes; m++) {
            snprintf(extra, sizeof extra, "--nproc %d %s", np, modes[m]);
            snprintf(name, sizeof name, "local%d_%zu", np, m);
            train(name, LONG, LONG_STEPS, extra);
            double v = val_loss();
            printf("  %d ranks, %s: val loss %.4f, DDP %.4f (%+.1f%%)\n", np, modes[m], v, ref,
                   100 * (v - ref) / ref);
            /* An outer momentum may do better than DDP (a larger step). */
            if (!(v <= (1 + tol) * ref && v >= 0.8 * ref))
                TEST_FAILF("%s at %d ranks: val loss %.4f is more than %.0f%% above DDP's %.4f "
                           "(or implausibly below)",
                           modes[m], np, v, 100 * tol, ref);
            ranks_agree(name, n, np);
        }
    }
}

/* Stop after `stop` steps and resume, against the uninterrupted run. */
static void resume_case(const char *name, const char *flags, int stop) {
    char whole[64], part[64], extra[256];
    snprintf(whole, sizeof whole, "%s_whole", name);
    snprintf(part, sizeof part, "%s_resumed", name);
    train(whole, TINY, STEPS, flags);
    snprintf(extra, sizeof extra, "%s --stop-after %d", flags, stop);
    train(part, TINY, STEPS, extra);
    snprintf(extra, sizeof extra, "%s --resume", flags);
    train(part, TINY, STEPS, extra);
    EXPECT_OUT("resumed from");
    tu_compare_runs(whole, part, STEPS);
    printf("  %s: stopped after %d, resumed: bit-identical\n", name, stop);
}

static void test_local_resume(void) {
    resume_case("local", "--nproc 2 --dp-mode local --sync-every 4", 6);
    resume_case("slowmo",
                "--nproc 2 --dp-mode local --sync-every 4 --outer slowmo --outer-lr 0.8 "
                "--sync-optim-state",
                6);
    resume_case("post", "--nproc 2 --dp-mode local --sync-every 3 --post-local-after 4", 5);
}

/* Validation losses of run NAME by step (NaN where it did not evaluate). */
static void val_losses(const char *name, double *out, int steps) {
    char text[64][64];
    ASSERT_EQ(tu_metric_text(name, "val_loss", text, 63), steps);
    for (int s = 1; s <= steps; s++) {
        const char *v = text[s - 1] + strlen("\"val_loss\":");
        out[s] = strncmp(v, "null", 4) == 0 ? NAN : strtod(v, NULL);
    }
}

static void test_gossip_equiv(void) {
    /* Training losses are agreed over the ranks at steps 1, 11 and 12 only
     * (between them rank 0 logs its own): the validation loss, averaged
     * over the ranks every 2 steps, is compared too. */
    const char *sgd = "--optimizer sgd --momentum 0 --clip 0 --lr 0.05 --val-split 0.1 "
                      "--eval-every 2 --eval-batches 2";
    for (int np = 2; np <= 4; np += 2) {
        char a[64], b[64], ea[128], eb[160], pa_dir[192], pb_dir[192];
        snprintf(a, sizeof a, "ddp_sgd%d", np);
        snprintf(b, sizeof b, "cube%d", np);
        snprintf(ea, sizeof ea, "--nproc %d %s", np, sgd);
        snprintf(eb, sizeof eb, "--nproc %d %s --dp-mode gossip --gossip-topology hypercube", np,
                 sgd);
        train(a, TINY, STEPS, ea);
        train(b, TINY, STEPS, eb);
        double la[64], lb[64], va[64], vb[64];
        char p[192];
        snprintf(p, sizeof p, "%s/%s/metrics.jsonl", tu_dir, a);
        tu_losses(p, la, 63);
        snprintf(p, sizeof p, "%s/%s/metrics.jsonl", tu_dir, b);
        tu_losses(p, lb, 63);
        val_losses(a, va, STEPS);
        val_losses(b, vb, STEPS);
        double worst = 0;
        for (int s = 1; s <= STEPS; s++) {
            bool agreed = s == 1 || s == 11 || s == STEPS;
            double d = fabs(la[s] - lb[s]) / la[s], dv = fabs(va[s] - vb[s]) / va[s];
            if (agreed && !(d <= 1e-5))
                TEST_FAILF("%d ranks, step %d: loss %.9g with DDP, %.9g with hypercube gossip", np,
                           s, la[s], lb[s]);
            if (s % 2 == 0 && !(dv <= 1e-5))
                TEST_FAILF("%d ranks, step %d: val loss %.9g with DDP, %.9g with hypercube gossip",
                           np, s, va[s], vb[s]);
            worst = fmax(worst, fmax(agreed ? d : 0, s % 2 == 0 ? dv : 0));
        }
        size_t n1, n2;
        snprintf(pa_dir, sizeof pa_dir, "%s/%s/ck", tu_dir, a);
        snprintf(pb_dir, sizeof pb_dir, "%s/%s/ck", tu_dir, b);
        float *pa = tu_params(pa_dir, &n1), *pb = tu_params(pb_dir, &n2);
        ASSERT_EQ(n1, n2);
        double wp = 0;
        for (size_t i = 0; i < n1; i++) {
            double d = fabs((double)pa[i] - pb[i]);
            if (!(d <= 1e-5 * fabs((double)pa[i]) + 1e-6))
                TEST_FAILF("%d ranks: param %zu = %.9g with DDP, %.9g with gossip", np, i, pa[i],
                           pb[i]);
            wp = fmax(wp, d);
        }
        printf("  %d ranks: hypercube gossip vs DDP (sgd): worst loss diff %.2g (rel), param "
               "diff %.2g\n",
               np, worst, wp);
        free(pa);
        free(pb);
    }
}

/* bytes_sent of step `step` (1-based) of run NAME. */
static uint64_t step_bytes(const char *name, int step) {
    char text[64][64];
    int n = tu_metric_text(name, "bytes_sent", text, 63);
    ASSERT_TRUE(step <= n);
    return strtoull(text[step - 1] + strlen("\"bytes_sent\":"), NULL, 10);
}

/* The consensus distances of run NAME (steps 1, 11, 21, ...). */
static int consensus(const char *name, double *out, int max) {
    char path[192], line[2048];
    snprintf(path, sizeof path, "%s/%s/metrics.jsonl", tu_dir, name);
    FILE *f = fopen(path, "r");
    ASSERT_TRUE(f != NULL);
    int n = 0, step = 0;
    while (fgets(line, sizeof line, f)) {
        step++;
        const char *at = strstr(line, "\"consensus\":");
        if ((step - 1) % 10 == 0 && !at)
            TEST_FAILF("%s: no consensus at step %d: %.200s", path, step, line);
        if (at && n < max)
            out[n++] = strtod(at + strlen("\"consensus\":"), NULL);
    }
    fclose(f);
    return n;
}

static void test_gossip_bytes(void) {
    size_t n;
    char dir[192];
    train("ddp4", LONG, LONG_STEPS, "--nproc 4");
    double ref = val_loss();
    snprintf(dir, sizeof dir, "%s/ddp4/ck", tu_dir);
    free(tu_params(dir, &n));
    /* One vector per step for exp, whatever the ranks; two for ring. */
    static const struct {
        const char *name, *flags;
        int np, vectors;
    } runs[] = {
        {"exp2", "--dp-mode gossip --gossip-topology exp", 2, 1},
        {"exp4", "--dp-mode gossip --gossip-topology exp", 4, 1},
        {"ring3", "--dp-mode gossip --gossip-topology ring", 3, 2},
        {"ring4", "--dp-mode gossip --gossip-topology ring", 4, 2},
        {"random4", "--dp-mode gossip --gossip-topology random", 4, 1},
    };
    for (size_t i = 0; i < sizeof runs / sizeof *runs; i++) {
        char extra[160];
        snprintf(extra, sizeof extra, "--nproc %d %s", runs[i].np, runs[i].flags);
        train(runs[i].name, LONG, LONG_STEPS, extra);
        double v = val_loss();
        uint64_t b = step_bytes(runs[i].name, 5), want = (uint64_t)runs[i].vectors * n * 4;
        if (b != want)
            TEST_FAILF("%s: step 5 sent %llu bytes, expected %d vectors of %zu floats = %llu",
                       runs[i].name, (unsigned long long)b, runs[i].vectors, n,
                       (unsigned long long)want);
        double c[16];
        int nc = consensus(runs[i].name, c, 16);
        ASSERT_EQ(nc, LONG_STEPS / 10);
        ASSERT_EQ(c[0], 0.0); /* step 1: every replica starts from the same weights */
        /* With 2 replicas (pairwise) and 3 (ring: both others, 1/3 each)
         * every mix is an exact average, up to rounding. */
        for (int k = 1; k < nc; k++)
            if (!(runs[i].np < 4 ? c[k] >= 0 && c[k] < 1e-9 : c[k] > 0 && c[k] < 1.0))
                TEST_FAILF("%s: consensus distance %g at step %d", runs[i].name, c[k], 10 * k + 1);
        ranks_agree(runs[i].name, n, runs[i].np);
        printf("  %s: %llu bytes per step, consensus %.3g..%.3g, val loss %.4f (DDP at 4 ranks "
               "%.4f, %+.1f%%)\n",
               runs[i].name, (unsigned long long)b, c[1], c[nc - 1], v, ref, 100 * (v - ref) / ref);
        if (runs[i].np == 4 && !(v <= 1.10 * ref && v >= 0.8 * ref))
            TEST_FAILF("%s: val loss %.4f is not within 10%% of DDP's %.4f", runs[i].name, v, ref);
    }
    resume_case("ring", "--nproc 3 --dp-mode gossip --gossip-topology ring", 5);
    resume_case("random", "--nproc 4 --dp-mode gossip --gossip-topology random --gossip-every 2",
                7);
}

static void test_errors(void) {
    EXPECT_RC(tu_run("%s train --data %s " TINY " --steps 1 --nproc 3 --dp-mode gossip "
                     "--gossip-topology exp",
                     DTRAIN, corpus),
              2);
    EXPECT_OUT("--gossip-topology exp with 3 replicas: needs a power of two");
    EXPECT_RC(tu_run("%s train --data %s " TINY " --steps 1 --nproc 2 --dp-mode local --zero 1",
                     DTRAIN, corpus),
              2);
    EXPECT_OUT("--dp-mode local with --zero 1");
    EXPECT_RC(tu_run("%s train --data %s " TINY
                     " --steps 1 --nproc 2 --dp-mode gossip --compress int8",
                     DTRAIN, corpus),
              2);
    EXPECT_OUT("--dp-mode gossip averages parameters");
    EXPECT_RC(tu_run("%s train --data %s " TINY " --steps 1 --dp-mode local --sync-every 0", DTRAIN,
                     corpus),
              2);
    EXPECT_OUT("--sync-every");
    EXPECT_RC(tu_run("%s train --data %s " TINY " --steps 1 --dp-mode star", DTRAIN, corpus), 2);
    EXPECT_OUT("--dp-mode");
    EXPECT_RC(tu_run("%s train --data %s " TINY " --steps 1 --nproc 2 --dp-mode local "
                     "--precision fp16",
                     DTRAIN, corpus),
              2);
    EXPECT_OUT("--dp-mode local with loss scaling");
    EXPECT_RC(tu_run("DT_FAULT_SLOW=1:x %s train --data %s " TINY " --steps 1", DTRAIN, corpus), 2);
    EXPECT_OUT("DT_FAULT_SLOW=1:x: expected RANK:FACTOR");
}

/* The shortest step of run NAME over steps 3..STEPS: the least disturbed
 * by other processes on the shared cores (a median moved with the load
 * between the two runs: 1.9x once under ctest -j2). A slowed step sleeps
 * (F - 1) x the previous step's compute, so its shortest is still about
 * F x the shortest compute. */
static double min_step_ms(const char *name) {
    char text[64][64];
    int n = tu_metric_text(name, "step_ms", text, 63);
    ASSERT_TRUE(n > 3);
    double best = INFINITY;
    for (int i = 2; i < n; i++)
        best = fmin(best, strtod(text[i] + strlen("\"step_ms\":"), NULL));
    return best;
}

static void test_slow(void) {
    train("fast", TINY, STEPS, "");
    EXPECT_RC(tu_run("DT_FAULT_SLOW=0:4 %s train --data %s " TINY " --steps %d --run-dir %s/slow "
                     "--no-save",
                     DTRAIN, corpus, STEPS, tu_dir),
              0);
    double fast = min_step_ms("fast"), slow = min_step_ms("slow");
    printf("  shortest step %.2f ms, slowed 4x: %.2f ms (%.1fx)\n", fast, slow, slow / fast);
    if (!(slow >= 2 * fast))
        TEST_FAILF("DT_FAULT_SLOW=0:4: shortest step %.2f ms, unslowed %.2f ms", slow, fast);
}

/* --dp-mode ps: plain SGD on the servers. */
#define PS_FLAGS LONG " --optimizer sgd --momentum 0 --lr 0.3 --weight-decay 0"

/* "staleness max M (bound S)" and the update count of the summary. */
static void ps_summary(int64_t *updates, int64_t *max) {
    const char *at = strstr(tu_out, "parameter server: ");
    long long u, m;
    if (!at || sscanf(at, "parameter server: %lld updates, staleness max %lld", &u, &m) != 2) {
        fprintf(stderr, "output was:\n%s\n", tu_out);
        TEST_FAILF("no parameter-server summary in the output");
    }
    *updates = u;
    *max = m;
}

static void test_ps_train(void) {
    train("ps_ddp", PS_FLAGS, LONG_STEPS, "--nproc 4");
    double ref_sgd = val_loss(), ref_adamw = 0;
    /* Rank 1 three times slower, so that the bound is reached. */
    static const struct {
        const char *name, *flags;
        int K, S;
        double tol; /* above DDP's validation loss */
        bool adamw; /* the servers step AdamW (LONG's settings), against DDP with it */
    } runs[] = {
        {"ps_k2_s2", "--ps-servers 2 --staleness 2", 2, 2, 0.10, false},
        {"ps_k4_s0", "--ps-servers 4 --staleness 0", 4, 0, 0.10, false},
        /* g / (1 + tau) shrinks the stale steps: slower progress. */
        {"ps_k1_s4_seed", "--ps-servers 1 --staleness 4 --delay-comp seed", 1, 4, 0.20, false},
        {"ps_k2_s4_dc", "--ps-servers 2 --staleness 4 --delay-comp dcasgd", 2, 4, 0.10, false},
        {"ps_k2_s2_adamw", "--ps-servers 2 --staleness 2", 2, 2, 0.10, true},
    };
    for (size_t i = 0; i < sizeof runs / sizeof *runs; i++) {
        char cmd[512];
        if (runs[i].adamw && !ref_adamw) {
            train("ps_ddp_adamw", LONG, LONG_STEPS, "--nproc 4");
            ref_adamw = val_loss();
        }
        snprintf(cmd, sizeof cmd, "%s --nproc 4 --dp-mode ps %s", runs[i].adamw ? LONG : PS_FLAGS,
                 runs[i].flags);
        double ref = runs[i].adamw ? ref_adamw : ref_sgd;
        EXPECT_RC(tu_run("DT_FAULT_SLOW=1:3 %s train --data %s %s --steps %d --ckpt-dir %s/%s/ck "
                         "--run-dir %s/%s",
                         DTRAIN, corpus, cmd, LONG_STEPS, tu_dir, runs[i].name, tu_dir,
                         runs[i].name),
                  0);
        double v = val_loss();
        int64_t updates, max;
        ps_summary(&updates, &max);
        ASSERT_EQ(updates, (int64_t)LONG_STEPS * 4 * runs[i].K);
        if (max > runs[i].S)
            TEST_FAILF("%s: an update was applied with staleness %lld > %d", runs[i].name,
                       (long long)max, runs[i].S);
        if (runs[i].S > 0 && max < 1)
            TEST_FAILF("%s: no stale update with a straggler: the bound was not exercised",
                       runs[i].name);
        /* Rank 0's per-step staleness in the metrics: within the bound too. */
        char text[128][64];
        int steps = tu_metric_text(runs[i].name, "staleness", text, 128);
        ASSERT_EQ(steps, LONG_STEPS);
        for (int k = 0; k < steps; k++)
            ASSERT_TRUE(atoi(text[k] + strlen("\"staleness\":")) <= runs[i].S);
        printf("  %s: staleness max %lld (bound %d), val loss %.4f (DDP %.4f, %+.1f%%)\n",
               runs[i].name, (long long)max, runs[i].S, v, ref, 100 * (v - ref) / ref);
        if (!(v <= (1 + runs[i].tol) * ref && v >= 0.8 * ref))
            TEST_FAILF("%s: val loss %.4f is more than %.0f%% above DDP's %.4f", runs[i].name, v,
                       100 * runs[i].tol, ref);
    }
}

/* One rank: the parameter server is the run's optimizer, DDP's bits. Four
 * ranks, staleness 0, SGD without clipping: each server applies a step's
 * pushes (lr / 4 each) in worker order, which is one averaged step up to
 * rounding; every worker then reads the same parameters, so the
 * validation loss (every 2 steps) and the final parameters match DDP's
 * within float tolerance. */
static void test_ps_equiv(void) {
    train("ddp1", TINY, STEPS, "");
    train("ps1", TINY, STEPS, "--dp-mode ps");
    tu_compare_runs("ddp1", "ps1", STEPS);
    printf("  one rank: --dp-mode ps is DDP bit for bit\n");
    /* No weight decay: W decays of lr / W compound (a second-order term). */
    const char *sgd = "--nproc 4 --optimizer sgd --momentum 0 --clip 0 --lr 0.05 --val-split 0.1 "
                      "--eval-every 2 --eval-batches 2 --weight-decay 0";
    char flags[256];
    train("ddp4", TINY, STEPS, sgd);
    snprintf(flags, sizeof flags, "%s --dp-mode ps --ps-servers 3 --staleness 0", sgd);
    train("ps4", TINY, STEPS, flags);
    double va[64], vb[64], worst = 0;
    val_losses("ddp4", va, STEPS);
    val_losses("ps4", vb, STEPS);
    for (int s = 2; s <= STEPS; s += 2) {
        double d = fabs(va[s] - vb[s]) / va[s];
        if (!(d <= 1e-5))
            TEST_FAILF("step %d: val loss %.9g with DDP, %.9g with the parameter server", s, va[s],
                       vb[s]);
        worst = fmax(worst, d);
    }
    char da[192], db[192];
    snprintf(da, sizeof da, "%s/ddp4/ck", tu_dir);
    snprintf(db, sizeof db, "%s/ps4/ck", tu_dir);
    size_t n1, n2;
    float *pa = tu_params(da, &n1), *pb = tu_params(db, &n2);
    ASSERT_EQ(n1, n2);
    double wp = 0;
    for (size_t i = 0; i < n1; i++) {
        double d = fabs((double)pa[i] - pb[i]);
        if (!(d <= 1e-5 * fabs((double)pa[i]) + 1e-6))
            TEST_FAILF("param %zu = %.9g with DDP, %.9g with the parameter server", i, pa[i],
                       pb[i]);
        wp = fmax(wp, d);
    }
    printf("  4 ranks, staleness 0, sgd: worst val loss diff %.2g (rel), param diff %.2g\n",
           worst, wp);
    free(pa);
    free(pb);
}

/* Rank r's sync state in the newest checkpoint of run NAME (caller frees). */
static unsigned char *sync_state(const char *name, int r, size_t *bytes) {
    char dir[192];
    snprintf(dir, sizeof dir, "%s/%s/ck", tu_dir, name);
    dt_ckpt_set *set;
    ASSERT_OK(dt_ckpt_set_open_latest(&set, dir));
    const dt_ckpt *f = dt_ckpt_set_file_of(set, r);
    ASSERT_TRUE(f != NULL);
    dt_ckpt_info info;
    ASSERT_OK(dt_ckpt_find(f, "sync.state", &info));
    unsigned char *p = malloc(info.bytes);
    memcpy(p, info.data, info.bytes);
    *bytes = info.bytes;
    dt_ckpt_set_close(set);
    return p;
}

static void test_ps_resume(void) {
    /* Staleness 0: deterministic, whatever the straggler does. */
    setenv("DT_FAULT_SLOW", "1:3", 1);
    resume_case("ps_s0", "--nproc 4 --dp-mode ps --ps-servers 2 --staleness 0", 5);
    train("ps_s0_again", TINY, STEPS, "--nproc 4 --dp-mode ps --ps-servers 2 --staleness 0");
    tu_compare_runs("ps_s0_whole", "ps_s0_again", STEPS);
    printf("  staleness 0 with a straggler: a second run is bit-identical\n");
    /* Staleness 2: a consistent checkpoint at step 6. */
    enum { W = 4, K = 3, STOP = 6, HIST = 64 };
    const char *s2 = "--nproc 4 --dp-mode ps --ps-servers 3 --staleness 2 --delay-comp dcasgd";
    char flags[256];
    snprintf(flags, sizeof flags, "%s --stop-after %d", s2, STOP);
    train("ps_s2", TINY, STEPS, flags);
    unsetenv("DT_FAULT_SLOW");
    char dir[192];
    snprintf(dir, sizeof dir, "%s/ps_s2/ck", tu_dir);
    size_t n;
    float *params = tu_params(dir, &n);
    for (int k = 0; k < K; k++) {
        size_t bytes, lo = n * (size_t)k / K, hi = n * (size_t)(k + 1) / K;
        unsigned char *st = sync_state("ps_s2", k, &bytes);
        int64_t iv[1 + 2 * W + HIST];
        ASSERT_TRUE(bytes >= sizeof iv + (n + hi - lo) * sizeof(float));
        memcpy(iv, st, sizeof iv);
        ASSERT_EQ(iv[0], (int64_t)STOP * W); /* the server's optimizer: one update per push */
        int64_t counted = 0;
        for (int w = 0; w < W; w++) {
            ASSERT_EQ(iv[1 + w], (int64_t)STOP); /* every worker's clock */
            ASSERT_TRUE(iv[1 + W + w] <= STOP);  /* its last read */
        }
        for (int b = 0; b < HIST; b++)
            counted += iv[1 + 2 * W + b];
        ASSERT_EQ(counted, (int64_t)STOP * W);
        /* after the worker's own view: the server's shard = the checkpoint's */
        const float *w = (const float *)(const void *)(st + sizeof iv) + n;
        if (memcmp(w, params + lo, (hi - lo) * sizeof(float)) != 0)
            TEST_FAILF("server %d: its shard differs from the checkpoint's parameters", k);
        free(st);
    }
    free(params);
    printf("  staleness 2, stopped after %d: every server's clocks at %d, %d updates each, the "
           "parameters are the servers' shards\n",
           STOP, STOP, STOP * W);
    setenv("DT_FAULT_SLOW", "1:3", 1);
    snprintf(flags, sizeof flags, "%s --resume", s2);
    train("ps_s2", TINY, STEPS, flags);
    unsetenv("DT_FAULT_SLOW");
    EXPECT_OUT("resumed from");
    int64_t updates, max;
    ps_summary(&updates, &max);
    ASSERT_EQ(updates, (int64_t)STEPS * W * K);
    ASSERT_TRUE(max <= 2);
    printf("  resumed to step %d: %lld updates in all, staleness max %lld\n", STEPS,
           (long long)updates, (long long)max);
}

/* The delay compensation against a double-precision serial reference of
 * the formulas, on random values. */
static void test_ps_delay(void) {
    enum { N = 1000 };
    static float g[N], now[N], then[N], out[N];
    dt_rng r;
    dt_rng_init(&r, 3, dt_rng_stream_id(0, 0, DT_RNG_TEST));
    for (int i = 0; i < N; i++) {
        g[i] = dt_rng_normal(&r);
        now[i] = dt_rng_normal(&r);
        then[i] = now[i] + 0.1f * dt_rng_normal(&r);
    }
    for (int kind = 0; kind < DT_DELAY_COMP_COUNT; kind++)
        for (int tau = 0; tau <= 5; tau += 5) {
            memcpy(out, g, sizeof g);
            dt_ps_delay_compensate((dt_delay_comp)kind, 0.5f, tau, out, now, then, N);
            double worst = 0;
            for (int i = 0; i < N; i++) {
                double want = kind == DT_DELAY_COMP_NONE ? g[i]
                              : kind == DT_DELAY_COMP_SEED
                                  ? (double)g[i] / (1.0 + tau)
                                  : g[i] + 0.5 * (double)g[i] * g[i] * ((double)now[i] - then[i]);
                double d = fabs(out[i] - want);
                if (!(d <= 1e-6 * fabs(want) + 1e-7))
                    TEST_FAILF("%s, tau %d, element %d: %.9g, reference %.9g",
                               dt_delay_comp_names[kind], tau, i, out[i], want);
                worst = fmax(worst, d);
            }
            printf("  %s, tau %d: worst difference %.2g\n", dt_delay_comp_names[kind], tau, worst);
        }
}

/* A worker and a server killed mid-run: the job fails (no hang), and the
 * launcher names the lost rank. The survivors' own errors (their pair's
 * transfer fails with DT_ERR_PEER, naming the worker and the server) race
 * with the launcher's teardown, so they are printed when present but not
 * required. */
static void ps_kill(const char *who, int rank) {
    EXPECT_RC(tu_run("DT_FAULT_KILL=%d:20 DT_TIMEOUT=30 %s train --data %s %s --steps %d --nproc 4 "
                     "--dp-mode ps --ps-servers 2 --no-save",
                     rank, DTRAIN, corpus, PS_FLAGS, LONG_STEPS),
              137);
    char want[64];
    snprintf(want, sizeof want, "rank %d (node 0, local rank %d", rank, rank);
    EXPECT_OUT(want);
    const char *own = strstr(tu_out, "parameter server");
    printf("  %s (rank %d) killed: reported%s%.*s\n", who, rank, own ? "; a survivor: " : "",
           own ? (int)strcspn(own, "\n") : 0, own ? own : "");
}

static void test_ps_fault(void) {
    ps_kill("a worker", 2);
    ps_kill("the server of shard 1", 1);
}

/* A rank killed in local SGD (step 20 of H 8: between two averages, the
 * survivors learn it at the next) and in gossip: the job ends within
 * DT_TIMEOUT's fraction, the launcher names the rank. */
static void test_mode_fault(void) {
    static const struct {
        const char *mode;
        int rank;
    } runs[] = {{"--dp-mode local --sync-every 8", 3},
                {"--dp-mode gossip --gossip-topology ring", 1},
                {"--dp-mode gossip --gossip-topology exp", 2}};
    for (size_t i = 0; i < sizeof runs / sizeof *runs; i++) {
        double t0 = dt_now();
        EXPECT_RC(tu_run("DT_FAULT_KILL=%d:20 DT_TIMEOUT=60 %s train --data %s %s --steps %d "
                         "--nproc 4 %s --no-save",
                         runs[i].rank, DTRAIN, corpus, LONG, LONG_STEPS, runs[i].mode),
                  137);
        double took = dt_now() - t0;
        char want[64];
        snprintf(want, sizeof want, "rank %d (node 0, local rank %d", runs[i].rank, runs[i].rank);
        EXPECT_OUT(want);
        const char *own = strstr(tu_out, "is lost");
        while (own && own > tu_out && own[-1] != '\n')
            own--; /* the survivor's whole line, when it made it out */
        printf("  %s, rank %d killed at step 20: reported in %.1f s%s%.*s\n", runs[i].mode,
               runs[i].rank, took, own ? "; a survivor: " : "", own ? (int)strcspn(own, "\n") : 0,
               own ? own : "");
        if (!(took < 30))
            TEST_FAILF("%s: the job took %.1f s to end after a rank died (DT_TIMEOUT=60)",
                       runs[i].mode, took);
    }
}

/* The loss of run NAME falls: the mean of its last 3 steps at least 3%
 * below that of its first 3 (DDP: about 6% in 12 steps; a model that ran
 * on its initial weights all along would not move). */
static void loss_falls(const char *name, int steps) {
    double l[64];
    char p[192];
    snprintf(p, sizeof p, "%s/%s/metrics.jsonl", tu_dir, name);
    ASSERT_EQ(tu_losses(p, l, 63), steps);
    double first = (l[1] + l[2] + l[3]) / 3, last = (l[steps - 2] + l[steps - 1] + l[steps]) / 3;
    if (!(last < 0.97 * first))
        TEST_FAILF("%s: loss %.4f over steps 1-3, %.4f over the last 3: it does not train", name,
                   first, last);
    printf("  %s: loss %.4f -> %.4f\n", name, first, last);
}

static void test_bf16(void) {
    train("ddp_bf16", TINY, STEPS, "--nproc 2 --precision bf16");
    train("h1_bf16", TINY, STEPS, "--nproc 2 --precision bf16 --dp-mode local --sync-every 1");
    tu_compare_runs("ddp_bf16", "h1_bf16", STEPS);
    printf("  bf16: --sync-every 1 is DDP bit for bit\n");
    resume_case("local_bf16", "--nproc 2 --precision bf16 --dp-mode local --sync-every 4", 4);
    resume_case("gossip_bf16", "--nproc 3 --precision bf16 --dp-mode gossip --gossip-topology ring",
                5);
    resume_case("ps_bf16", "--nproc 3 --precision bf16 --dp-mode ps --ps-servers 2 --staleness 0",
                5);
    loss_falls("ddp_bf16", STEPS);
    loss_falls("local_bf16_whole", STEPS);
    loss_falls("gossip_bf16_whole", STEPS);
    loss_falls("ps_bf16_whole", STEPS);
}

int main(int argc, char **argv) {
    static const test_case cases[] = {
        {"local_equiv", test_local_equiv},
        {"local_loss", test_local_loss},
        {"local_resume", test_local_resume},
        {"gossip_equiv", test_gossip_equiv},
        {"gossip_bytes", test_gossip_bytes},
        {"errors", test_errors},
        {"slow", test_slow},
        {"ps_train", test_ps_train},
        {"ps_equiv", test_ps_equiv},
        {"ps_resume", test_ps_resume},
        {"ps_delay", test_ps_delay},
        {"ps_fault", test_ps_fault},
        {"mode_fault", test_mode_fault},
        {"bf16", test_bf16},
    };
    return tu_main(argc, argv, cases, sizeof cases / sizeof cases[0], corpus, sizeof corpus);
}
