/*
 * test_train_optim.c — `dtrain train --optimizer NAME` end to end, one case
 * per process (test_train_optim CASE):
 *   resume   every optimizer (and --grad-centralization) stopped after 3 of
 *            6 steps and resumed: losses and parameters bit-identical to the
 *            uninterrupted run (8-bit codes through their fp32 values,
 *            Adafactor's factors keyed by tensor, L-BFGS's history and
 *            scalars); 1-bit Adam/LAMB on 2 ranks past the warm-up, with
 *            their codec residuals.
 *   ddp      LAMB, Adafactor, centralised AdamW and K-FAC on 2 data-parallel ranks
 *            against 1 rank with the same global batch: the per-tensor
 *            statistics see the averaged gradient (the difference is the
 *            allreduce's rounding).
 *   zero     every optimizer that shards (all but L-BFGS and the 1-bit
 *            kinds, whose compression ZeRO's plain reduce-scatter does not
 *            carry) with --zero 1 at dp 2 and --zero 2 at dp 3 against
 *            DDP on as many ranks: the same bits, except 8-bit AdamW (its
 *            blocks are cut at the replicas' piece boundaries); the kinds
 *            with per-tensor statistics, whose pieces' partial sums are
 *            added over the replicas, are allowed 1e-6 but come out the
 *            same too. Resumed across zero 1 -> 0.
 *   zero3    --zero 3 (each replica keeps only its parameter pieces, which are
 *            all the update reads): RAdam bit-identical to DDP; LAMB,
 *            LARS, Adafactor, 8-bit AdamW, centralised AdamW and Lookahead
 *            over LAMB bit-identical to --zero 1 (the same pieces and
 *            partial sums) and LAMB within 1e-6 of DDP at dp 3; Adafactor
 *            resumed at zero 3 bit-identically.
 *   offload  --offload optimizer=disk:DIR: every kind that streams (all but
 *            L-BFGS and K-FAC) bit-identical to its state in memory, with
 *            zero 0, 1 and 3 and the 1-bit kinds' compression stage; 8-bit
 *            AdamW and LAMB resumed bit-identically (also into memory); no
 *            file left in DIR.
 *   cp       context parallelism (--cp 2, both attention modes) against 1
 *            rank: LAMB, Adafactor, K-FAC and L-BFGS see the gradient
 *            averaged over the dp x cp group (K-FAC also its factors), and
 *            with --zero 1 over that group the per-tensor kinds sum their
 *            pieces' statistics over it: the same bits as without ZeRO.
 *   config   config.json holds every optimizer flag under its name (those
 *            of the optimizers that did not run too), and --config of it
 *            runs the same training bit for bit.
 *   onebit   1-bit Adam: 2 ranks learn; the warm-up steps send fp32, the
 *            compression stage sign bits (about 28x fewer bytes); v stays
 *            as the warm-up left it.
 *   errors   bad combinations are refused naming the flags and values.
 */
#include "train_util.h"

#include <sys/stat.h>

#define DTRAIN DT_CLI_PATH
#define TINY                                                                                       \
    "--model tiny --layers 2 --dim 32 --heads 2 --seq 32 --threads 1 --peak-flops 1e9 "            \
    "--sample-tokens 0 --progress plain --val-split 0 --warmup 2 --global-batch 8"

static char corpus[128];

static void train(const char *name, int steps, const char *extra, double *loss) {
    EXPECT_RC(tu_run("%s train --data %s " TINY " --steps %d --ckpt-dir %s/%s/ck --run-dir %s/%s "
                     "%s",
                     DTRAIN, corpus, steps, tu_dir, name, tu_dir, name, extra),
              0);
    char p[192];
    snprintf(p, sizeof p, "%s/%s/metrics.jsonl", tu_dir, name);
    ASSERT_EQ(tu_losses(p, loss, 63), steps);
}

static float *params_of(const char *name, size_t *n) {
    char p[192];
    snprintf(p, sizeof p, "%s/%s/ck", tu_dir, name);
    return tu_params(p, n);
}

/* 6 steps straight, and 3 + a resume to 6: the same bits. */
static void resume_case(const char *tag, const char *flags) {
    double a[64], b[64];
    char straight[64], stopped[64];
    snprintf(straight, sizeof straight, "%s_6", tag);
    snprintf(stopped, sizeof stopped, "%s_3", tag);
    train(straight, 6, flags, a);
    char extra[512];
    snprintf(extra, sizeof extra, "%s --stop-after 3", flags);
    EXPECT_RC(tu_run("%s train --data %s " TINY " --steps 6 --ckpt-dir %s/%s/ck --run-dir %s/%s "
                     "%s",
                     DTRAIN, corpus, tu_dir, stopped, tu_dir, stopped, extra),
              0);
    snprintf(extra, sizeof extra, "%s --resume", flags);
    train(stopped, 6, extra, b);
    EXPECT_OUT("resumed");
    for (int s = 1; s <= 6; s++)
        if (a[s] != b[s])
            TEST_FAILF("%s: step %d loss %.9g straight, %.9g resumed", tag, s, a[s], b[s]);
    size_t na, nb;
    float *pa = params_of(straight, &na), *pb = params_of(stopped, &nb);
    ASSERT_EQ(na, nb);
    if (memcmp(pa, pb, na * sizeof *pa) != 0)
        TEST_FAILF("%s: parameters after 6 steps differ between the straight and the resumed "
                   "run",
                   tag);
    printf("  %-12s resume bit-identical (loss %.4f -> %.4f)\n", tag, a[1], a[6]);
    free(pa);
    free(pb);
}

static void test_resume(void) {
    resume_case("adamw8bit", "--optimizer adamw8bit --adamw8bit-block 256");
    resume_case("adafactor", "--optimizer adafactor --adafactor-beta1 0.9");
    resume_case("lamb", "--optimizer lamb --lr 1e-2");
    resume_case("lars", "--optimizer lars --lr 0.5 --nesterov");
    resume_case("radam", "--optimizer radam");
    resume_case("lookahead", "--optimizer lookahead --lookahead-inner lamb --lookahead-k 2");
    resume_case("lookahead8", "--optimizer lookahead --lookahead-inner adamw8bit --lookahead-k 2");
    resume_case("gc", "--optimizer adamw --grad-centralization");
    resume_case("lbfgs", "--optimizer lbfgs --lr 1 --lbfgs-max-iter 3 --lbfgs-history 2");
    resume_case("kfac", "--optimizer kfac --lr 0.3 --kfac-inv-every 2 --kfac-damping 0.1");
    resume_case("kfac_2", "--nproc 2 --optimizer kfac --lr 0.3 --kfac-inv-every 2");
    resume_case("onebit_adam", "--nproc 2 --optimizer onebit-adam --compress-start 2");
    resume_case("onebit_lamb", "--nproc 2 --optimizer onebit-lamb --compress-start 2 --lr 1e-2");
}

static void ddp_case(const char *tag, const char *flags) {
    double a[64], b[64];
    char one[64], two[64], extra[256];
    snprintf(one, sizeof one, "%s_1", tag);
    snprintf(two, sizeof two, "%s_2", tag);
    train(one, 5, flags, a);
    snprintf(extra, sizeof extra, "%s --nproc 2", flags);
    train(two, 5, extra, b);
    size_t na, nb;
    float *pa = params_of(one, &na), *pb = params_of(two, &nb);
    ASSERT_EQ(na, nb);
    double worst = 0;
    for (size_t i = 0; i < na; i++)
        worst = fmax(worst, fabs((double)pa[i] - pb[i]) / fmax(fabs((double)pa[i]), 1e-2));
    printf("  %-10s 2 ranks vs 1: loss %.6f vs %.6f at step 5, parameters within %.2g\n", tag, b[5],
           a[5], worst);
    ASSERT_TRUE(fabs(a[5] - b[5]) < 1e-4);
    ASSERT_TRUE(worst < 1e-3);
    free(pa);
    free(pb);
}

/* Epsilons well above float rounding noise: gradients that are zero in
 * exact arithmetic come out as ~1e-9 noise that depends on the summation
 * order (1 rank or 2), and an epsilon of 1e-8 (on sqrt(v)) or 1e-30 (on
 * g^2, Adafactor's) would turn that noise into whole steps
 * (test_train_ddp.c explains the same for AdamW). */
static void test_ddp(void) {
    ddp_case("lamb", "--optimizer lamb --lr 1e-2 --eps 1e-4");
    ddp_case("adafactor", "--optimizer adafactor --adafactor-eps1 1e-8");
    ddp_case("gc", "--optimizer adamw --grad-centralization --eps 1e-4");
    /* K-FAC: the factors averaged over the ranks are the global batch's;
     * the inverses of layer j computed on rank j % 2 and broadcast. */
    ddp_case("kfac", "--optimizer kfac --lr 0.3 --kfac-inv-every 2 --kfac-damping 0.1");
    ddp_case("kfac_accum",
             "--optimizer kfac --lr 0.3 --kfac-inv-every 2 --kfac-damping 0.1 --accum 2");
}

/* One rank against two context-parallel ranks (each holding half of every
 * sequence), the same global batch: the losses and parameters agree to
 * the rounding of the gradient's allreduce (and of the ring's merge). */
static void cp_case(const char *tag, const char *flags) {
    double a[64], b[64];
    char one[64], two[64], extra[256];
    snprintf(one, sizeof one, "%s_1", tag);
    snprintf(two, sizeof two, "%s_cp2", tag);
    train(one, 5, flags, a);
    snprintf(extra, sizeof extra, "%s --nproc 2 --cp 2", flags);
    train(two, 5, extra, b);
    size_t na, nb;
    float *pa = params_of(one, &na), *pb = params_of(two, &nb);
    ASSERT_EQ(na, nb);
    double wl = 0, wp = 0;
    for (int s = 1; s <= 5; s++)
        wl = fmax(wl, fabs(a[s] - b[s]) / fabs(a[s]));
    for (size_t i = 0; i < na; i++)
        wp = fmax(wp, fabs((double)pa[i] - pb[i]) / fmax(fabs((double)pa[i]), 1e-2));
    printf("  %-12s cp 2 vs 1 rank: loss %.6f vs %.6f at step 5 (worst %.2g), parameters "
           "within %.2g\n",
           tag, b[5], a[5], wl, wp);
    ASSERT_TRUE(wl < 1e-5);
    ASSERT_TRUE(wp < 1e-3);
    free(pa);
    free(pb);
}

/* Runs a and b: same losses and parameters, bit for bit (rel 0) or within
 * rel. */
static void zero_case(const char *tag, const char *flags, const char *la_flags,
                      const char *lb_flags, double rel, double prel) {
    double a[64], b[64];
    char na[64], nb[64], extra[384];
    snprintf(na, sizeof na, "%s_a", tag);
    snprintf(nb, sizeof nb, "%s_b", tag);
    snprintf(extra, sizeof extra, "%s %s --bucket-size 16K --eps 1e-4 --global-batch 12", flags,
             la_flags);
    train(na, 6, extra, a);
    snprintf(extra, sizeof extra, "%s %s --bucket-size 16K --eps 1e-4 --global-batch 12", flags,
             lb_flags);
    train(nb, 6, extra, b);
    char pa[192], pb[192];
    snprintf(pa, sizeof pa, "%s/%s/ck", tu_dir, na);
    snprintf(pb, sizeof pb, "%s/%s/ck", tu_dir, nb);
    size_t n1, n2;
    float *x = tu_global_params(pa, &n1), *y = tu_global_params(pb, &n2);
    ASSERT_EQ(n1, n2);
    double wl = 0, wp = 0;
    for (int s = 1; s <= 6; s++)
        wl = fmax(wl, fabs(a[s] - b[s]) / fabs(a[s]));
    for (size_t i = 0; i < n1; i++)
        wp = fmax(wp, fabs((double)x[i] - y[i]) / fmax(fabs((double)x[i]), 1e-2));
    bool same = wl == 0 && memcmp(x, y, n1 * sizeof *x) == 0;
    printf("  %-22s %s vs %s: %s (loss diff %.2g, params %.2g)\n", tag, la_flags, lb_flags,
           same ? "bit-identical" : "close", wl, wp);
    if (rel == 0 && !same)
        TEST_FAILF("%s: %s and %s differ (loss %.2g, params %.2g); the same bits expected", tag,
                   la_flags, lb_flags, wl, wp);
    if (!(wl <= rel && wp <= prel))
        TEST_FAILF("%s: loss differs by %.2g, parameters by %.2g (tolerances %g, %g)", tag, wl, wp,
                   rel, prel);
    free(x);
    free(y);
}

static void test_zero(void) {
    /* Element-wise: the reduce-scatter sums each element in the
     * allreduce's order, so the bits agree. 8-bit AdamW's quantisation
     * blocks are cut where a replica's piece begins or ends (a block
     * that straddles two pieces has one scale in each), so its codes
     * differ there: within the code's resolution, not bit for bit. */
    static const char *const same[] = {"--optimizer radam", "--optimizer sgd --lr 0.05",
                                       "--optimizer lookahead --lookahead-k 2"};
    static const char *const same_tag[] = {"radam", "sgd", "lookahead"};
    for (int i = 0; i < 3; i++) {
        char tag[64];
        snprintf(tag, sizeof tag, "%s_z1", same_tag[i]);
        zero_case(tag, same[i], "--nproc 2", "--nproc 2 --zero 1", 0, 0);
    }
    zero_case("radam_z2_dp3", "--optimizer radam", "--nproc 3", "--nproc 3 --zero 2", 0, 0);
    zero_case("adamw8bit_z1", "--optimizer adamw8bit --adamw8bit-block 256", "--nproc 2",
              "--nproc 2 --zero 1", 1e-4, 0.05);
    zero_case("adamw8bit_z2_dp3", "--optimizer adamw8bit --adamw8bit-block 256", "--nproc 3",
              "--nproc 3 --zero 2", 1e-4, 0.05);
    /* Per-tensor statistics: partial sums in double over the replicas. */
    static const char *const tw[] = {
        "--optimizer lamb --lr 1e-2", "--optimizer lars --lr 0.5",
        "--optimizer adafactor --adafactor-eps1 1e-8 --adafactor-beta1 0.9",
        "--optimizer adamw --grad-centralization",
        "--optimizer lookahead --lookahead-inner lamb --lr 1e-2 --lookahead-k 2"};
    static const char *const tw_tag[] = {"lamb", "lars", "adafactor", "gc", "lookahead_lamb"};
    for (int i = 0; i < 5; i++) {
        char tag[64];
        snprintf(tag, sizeof tag, "%s_z1", tw_tag[i]);
        zero_case(tag, tw[i], "--nproc 2", "--nproc 2 --zero 1", 1e-6, 1e-4);
        snprintf(tag, sizeof tag, "%s_z2_dp3", tw_tag[i]);
        zero_case(tag, tw[i], "--nproc 3", "--nproc 3 --zero 2", 1e-6, 1e-4);
    }
    /* Resume across layouts: zero 1 at dp 2 stopped, resumed as zero 0. */
    const char *f = "--optimizer adafactor --adafactor-beta1 0.9 --adafactor-eps1 1e-8 "
                    "--bucket-size 16K";
    double a[64], b[64];
    char extra[384];
    snprintf(extra, sizeof extra, "%s --nproc 2 --zero 1", f);
    train("zr_a", 6, extra, a);
    EXPECT_RC(tu_run("%s train --data %s " TINY " --steps 6 --ckpt-dir %s/zr_b/ck --run-dir "
                     "%s/zr_b %s --stop-after 3",
                     DTRAIN, corpus, tu_dir, tu_dir, extra),
              0);
    snprintf(extra, sizeof extra, "%s --nproc 2 --resume", f);
    train("zr_b", 6, extra, b);
    EXPECT_OUT("resumed");
    double wl = 0;
    for (int s = 1; s <= 6; s++)
        wl = fmax(wl, fabs(a[s] - b[s]) / fabs(a[s]));
    printf("  adafactor zero 1 -> zero 0 resume: worst loss diff %.2g\n", wl);
    ASSERT_TRUE(wl <= 1e-6);
}

static void test_zero3(void) {
    zero_case("radam_z3", "--optimizer radam", "--nproc 2", "--nproc 2 --zero 3", 0, 0);
    static const char *const f[] = {
        "--optimizer lamb --lr 1e-2",
        "--optimizer lars --lr 0.5",
        "--optimizer adafactor --adafactor-eps1 1e-8 --adafactor-beta1 0.9",
        "--optimizer adamw8bit --adamw8bit-block 256",
        "--optimizer adamw --grad-centralization",
        "--optimizer lookahead --lookahead-inner lamb --lr 1e-2 --lookahead-k 2"};
    static const char *const tag[] = {"lamb",      "lars", "adafactor",
                                      "adamw8bit", "gc",   "lookahead_lamb"};
    for (int i = 0; i < 6; i++) {
        char t[64];
        snprintf(t, sizeof t, "%s_z1_z3", tag[i]);
        zero_case(t, f[i], "--nproc 2 --zero 1", "--nproc 2 --zero 3", 0, 0);
    }
    zero_case("lamb_z3_dp3", f[0], "--nproc 3", "--nproc 3 --zero 3", 1e-6, 1e-4);
    resume_case("adafactor_z3", "--optimizer adafactor --adafactor-beta1 0.9 --nproc 2 --zero 3 "
                                "--bucket-size 16K");
}

static void test_cp(void) {
    cp_case("lamb", "--optimizer lamb --lr 1e-2 --eps 1e-4");
    cp_case("lamb_ring", "--optimizer lamb --lr 1e-2 --eps 1e-4 --cp-mode ring");
    cp_case("adafactor", "--optimizer adafactor --adafactor-eps1 1e-8");
    cp_case("kfac", "--optimizer kfac --lr 0.3 --kfac-inv-every 2 --kfac-damping 0.1");
    cp_case("lbfgs", "--optimizer lbfgs --lr 1 --lbfgs-max-iter 3 --lbfgs-history 2");
    /* ZeRO over the dp x cp group: at dp 1 the two cp ranks each own half
     * of every bucket, so the trust ratios need the pieces' sums. */
    zero_case("lamb_cp_z1", "--optimizer lamb --lr 1e-2", "--nproc 2 --cp 2",
              "--nproc 2 --cp 2 --zero 1", 0, 0);
    zero_case("lars_cp_z3", "--optimizer lars --lr 0.5", "--nproc 2 --cp 2 --zero 1",
              "--nproc 2 --cp 2 --zero 3", 0, 0);
}

static void test_config(void) {
    /* Lookahead over LARS with every setting away from its default. */
    const char *flags =
        "--optimizer lookahead --lookahead-inner lars --lookahead-k 3 --lookahead-alpha 0.6 "
        "--lr 0.3 --nesterov --trust-coeff 0.002 --trust-eps 1e-7 --grad-centralization "
        "--adafactor-beta1 0.5 --adafactor-decay -0.7 --adafactor-eps1 1e-20 "
        "--adafactor-eps2 0.002 --adafactor-clip 2 --adafactor-relative-step off "
        "--adafactor-scale-parameter off --adafactor-warmup-init --adamw8bit-block 512 "
        "--lbfgs-history 4 --lbfgs-max-iter 9 --lbfgs-max-eval 7 --lbfgs-tolerance-grad 1e-6 "
        "--lbfgs-tolerance-change 1e-8 --lbfgs-line-search off --kfac-damping 0.01 "
        "--kfac-inv-every 3 --kfac-ema 0.9 --kfac-kl-clip 0.002";
    double a[64], b[64];
    train("cfg_a", 5, flags, a);
    char path[192], json[8192];
    snprintf(path, sizeof path, "%s/cfg_a/config.json", tu_dir);
    FILE *f = fopen(path, "r");
    ASSERT_TRUE(f != NULL);
    json[fread(json, 1, sizeof json - 1, f)] = '\0';
    fclose(f);
    static const char *const keys[] = {"\"optimizer\": \"lookahead\"",
                                       "\"lookahead-inner\": \"lars\"",
                                       "\"lookahead-k\": 3,",
                                       "\"lookahead-alpha\": 0.6,",
                                       "\"nesterov\": true,",
                                       "\"trust-coeff\": 0.002,",
                                       "\"trust-eps\": 1e-7,",
                                       "\"grad-centralization\": true,",
                                       "\"adafactor-beta1\": 0.5,",
                                       "\"adafactor-decay\": -0.7,",
                                       "\"adafactor-eps1\": 1e-20,",
                                       "\"adafactor-eps2\": 0.002,",
                                       "\"adafactor-clip\": 2.0,",
                                       "\"adafactor-relative-step\": \"off\"",
                                       "\"adafactor-scale-parameter\": \"off\"",
                                       "\"adafactor-warmup-init\": true,",
                                       "\"adamw8bit-block\": 512,",
                                       "\"lbfgs-history\": 4,",
                                       "\"lbfgs-max-iter\": 9,",
                                       "\"lbfgs-max-eval\": 7,",
                                       "\"lbfgs-tolerance-grad\": 1e-6,",
                                       "\"lbfgs-tolerance-change\": 1e-8,",
                                       "\"lbfgs-line-search\": \"off\"",
                                       "\"kfac-damping\": 0.01,",
                                       "\"kfac-inv-every\": 3,",
                                       "\"kfac-ema\": 0.9,",
                                       "\"kfac-kl-clip\": 0.002,",
                                       "\"optimizer-state-bytes-per-param\": "};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
        if (!strstr(json, keys[i]))
            TEST_FAILF("config.json lacks %s:\n%.900s", keys[i], json);
    /* Read back with nothing else given: the same run. */
    EXPECT_RC(tu_run("%s train --config %s --run-dir %s/cfg_b --ckpt-dir %s/cfg_b/ck", DTRAIN, path,
                     tu_dir, tu_dir),
              0);
    snprintf(path, sizeof path, "%s/cfg_b/metrics.jsonl", tu_dir);
    ASSERT_EQ(tu_losses(path, b, 63), 5);
    for (int s = 1; s <= 5; s++)
        if (a[s] != b[s])
            TEST_FAILF("--config config.json: step %d loss %.9g, the run's %.9g", s, b[s], a[s]);
    size_t na, nb;
    float *pa = params_of("cfg_a", &na), *pb = params_of("cfg_b", &nb);
    ASSERT_EQ(na, nb);
    ASSERT_TRUE(memcmp(pa, pb, na * sizeof *pa) == 0);
    free(pa);
    free(pb);
    printf("  config.json: %zu optimizer keys; --config of it: the same 5 losses and parameters\n",
           sizeof keys / sizeof keys[0]);
}

static char offdir[160];

/* No file left in offdir (the offload files are unlinked at creation). */
static bool offdir_empty(void) {
    char cmd[200];
    snprintf(cmd, sizeof cmd, "test -z \"$(ls -A '%s')\"", offdir);
    return system(cmd) == 0;
}

static void test_offload(void) {
    snprintf(offdir, sizeof offdir, "%s/offload", tu_dir);
    ASSERT_EQ(mkdir(offdir, 0755), 0);
    char z1[240], z3[240], z0[240];
    snprintf(z0, sizeof z0, "--nproc 2 --offload optimizer=disk:%s", offdir);
    snprintf(z1, sizeof z1, "--nproc 2 --zero 1 --offload optimizer=disk:%s", offdir);
    snprintf(z3, sizeof z3, "--nproc 2 --zero 3 --offload optimizer=disk:%s", offdir);
    static const char *const f[] = {
        "--optimizer lamb --lr 1e-2",
        "--optimizer lars --lr 0.5",
        "--optimizer adafactor --adafactor-eps1 1e-8 --adafactor-beta1 0.9",
        "--optimizer adamw8bit --adamw8bit-block 256",
        "--optimizer radam",
        "--optimizer sgd --lr 0.05",
        "--optimizer adamw --grad-centralization",
        "--optimizer lookahead --lookahead-inner lamb --lr 1e-2 --lookahead-k 2",
        "--optimizer lookahead --lookahead-inner adamw8bit --lookahead-k 2"};
    static const char *const tag[] = {"lamb", "lars", "adafactor", "adamw8bit", "radam",
                                      "sgd",  "gc",   "la_lamb",   "la_8bit"};
    for (int i = 0; i < 9; i++) {
        char t[64];
        snprintf(t, sizeof t, "%s_off_z1", tag[i]);
        zero_case(t, f[i], "--nproc 2 --zero 1", z1, 0, 0);
    }
    zero_case("lamb_off_z3", f[0], "--nproc 2 --zero 3", z3, 0, 0);
    zero_case("adamw8bit_off_z3", f[3], "--nproc 2 --zero 3", z3, 0, 0);
    zero_case("adafactor_off_z0", f[2], "--nproc 2", z0, 0, 0);
    /* 1-bit Adam and LAMB past their warm-up (premixing reads m from the
     * file), under DDP. */
    char ob[320];
    snprintf(ob, sizeof ob, "--compress-start 2 --offload optimizer=disk:%s", offdir);
    zero_case("onebit_adam_off", "--nproc 2 --optimizer onebit-adam", "--compress-start 2", ob, 0,
              0);
    zero_case("onebit_lamb_off", "--nproc 2 --optimizer onebit-lamb --lr 1e-2",
              "--compress-start 2", ob, 0, 0);
    /* Resumed: the 8-bit codes set through the mapping, LAMB's moments. */
    char r[400];
    snprintf(r, sizeof r, "%s %s", f[3], z1);
    resume_case("adamw8bit_off", r);
    snprintf(r, sizeof r, "%s %s", f[0], z3);
    resume_case("lamb_off_z3", r);
    ASSERT_TRUE(offdir_empty());
}

static void test_onebit(void) {
    double l[64];
#define ONEBIT "--nproc 2 --optimizer onebit-adam --compress-start 5 --lr 3e-3 --schedule constant"
    train("ob", 30, ONEBIT, l);
    EXPECT_OUT("gradients: sign");
    printf("  onebit-adam, 2 ranks: loss %.4f -> %.4f\n", l[1], l[30]);
    ASSERT_TRUE(l[30] < l[1] - 0.3);
    char b[64][64];
    ASSERT_EQ(tu_metric_text("ob", "bytes_sent", b, 30), 30);
    unsigned long long dense = strtoull(b[0] + strlen("\"bytes_sent\":"), NULL, 10);
    unsigned long long sign = strtoull(b[29] + strlen("\"bytes_sent\":"), NULL, 10);
    printf("  bytes per step and rank: warm-up %llu, compression stage %llu\n", dense, sign);
    ASSERT_TRUE(sign * 20 < dense);
    /* v frozen from step 6 on: the same in checkpoints of step 10 and 30
     * (a constant schedule: the dense steps 1-5 are the same in both). */
    double m[64];
    train("ob10", 10, ONEBIT, m);
    char p[192];
    size_t n1, n2;
    snprintf(p, sizeof p, "%s/ob/ck", tu_dir);
    float *v30 = tu_section(p, "onebit-adam.v", &n1);
    snprintf(p, sizeof p, "%s/ob10/ck", tu_dir);
    float *v10 = tu_section(p, "onebit-adam.v", &n2);
    ASSERT_EQ(n1, n2);
    ASSERT_TRUE(memcmp(v10, v30, n1 * sizeof *v10) == 0);
    free(v10);
    free(v30);
}

static void test_errors(void) {
    EXPECT_RC(
        tu_run("%s train --data %s " TINY " --steps 2 --optimizer onebit-adam", DTRAIN, corpus), 2);
    EXPECT_OUT("--optimizer onebit-adam compresses the momentum after a dense warm-up: it needs "
               "--compress-start >= 1");
    EXPECT_RC(
        tu_run("%s train --data %s " TINY " --steps 2 --optimizer lamb --tp 2", DTRAIN, corpus), 1);
    EXPECT_OUT("per-tensor statistics of tensor-parallel shards are not summed");
    EXPECT_RC(tu_run("%s train --data %s " TINY " --steps 2 --optimizer lbfgs --precision fp16",
                     DTRAIN, corpus),
              2);
    EXPECT_OUT("--optimizer lbfgs with loss scaling");
    EXPECT_RC(tu_run("%s train --data %s " TINY " --steps 2 --optimizer lookahead "
                     "--lookahead-inner lbfgs",
                     DTRAIN, corpus),
              2);
    EXPECT_OUT("lookahead: inner optimizer lbfgs cannot be wrapped");
    EXPECT_RC(tu_run("%s train --data %s " TINY " --steps 2 --optimizer adamw8bit "
                     "--adamw8bit-block 100",
                     DTRAIN, corpus),
              2);
    EXPECT_OUT("adamw8bit: block 100 must be a multiple of 16");
    EXPECT_RC(tu_run("%s train --data %s " TINY " --steps 2 --optimizer adafactor "
                     "--adafactor-decay 0.5",
                     DTRAIN, corpus),
              2);
    EXPECT_OUT("--adafactor-decay");
    EXPECT_RC(tu_run("%s train --data %s " TINY " --steps 2 --optimizer kfac --precision bf16",
                     DTRAIN, corpus),
              2);
    EXPECT_OUT("--optimizer kfac needs --precision fp32");
    EXPECT_RC(tu_run("%s train --data %s " TINY " --steps 2 --optimizer kfac --nproc 2 --zero 1",
                     DTRAIN, corpus),
              2);
    EXPECT_OUT("K-FAC preconditions whole weight matrices and does not shard");
    /* The kinds whose step needs the whole buffer at once do not stream. */
    EXPECT_RC(tu_run("%s train --data %s " TINY " --steps 2 --optimizer kfac --offload "
                     "optimizer=disk:%s",
                     DTRAIN, corpus, tu_dir),
              2);
    EXPECT_OUT("--optimizer kfac with --offload optimizer=disk:");
    EXPECT_OUT("its state cannot stream through memory in pieces");
    EXPECT_RC(tu_run("%s train --data %s " TINY " --steps 2 --optimizer lbfgs --offload "
                     "optimizer=disk:%s",
                     DTRAIN, corpus, tu_dir),
              2);
    EXPECT_OUT("--optimizer lbfgs with --offload optimizer=disk:");
    EXPECT_OUT("L-BFGS's two-loop recursion and line search read its whole history");
    /* K-FAC and L-BFGS at zero 3: refused as at every stage. */
    EXPECT_RC(tu_run("%s train --data %s " TINY " --steps 2 --optimizer lbfgs --nproc 2 --zero 3",
                     DTRAIN, corpus),
              2);
    EXPECT_OUT("L-BFGS keeps its history for the whole parameter buffer and does not shard");
}

static const test_case cases[] = {
    {"resume", test_resume},   {"ddp", test_ddp},       {"zero", test_zero},
    {"zero3", test_zero3},     {"cp", test_cp},         {"config", test_config},
    {"offload", test_offload}, {"onebit", test_onebit}, {"errors", test_errors},
};

int main(int argc, char **argv) {
    return tu_main(argc, argv, cases, sizeof cases / sizeof cases[0], corpus, sizeof corpus);
}
