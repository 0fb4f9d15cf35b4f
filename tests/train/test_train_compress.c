/*
 * test_train_compress.c — `dtrain train` with compressed or 16-bit gradient
 * communication, 2 real ranks.
 *
 *   topk       --compress topk:0.01 lowers the loss, the ranks stay in sync
 *              (--check-every), and metrics' bytes_sent is exactly the
 *              encoded size (32-byte header + 8 bytes per kept value, per
 *              bucket, one copy to the peer).
 *   powersgd   --compress powersgd:4 lowers the loss in sync and sends less
 *              than half of the fp32 allreduce.
 *   bf16       --grad-dtype bf16 sends exactly half the bytes of fp32 and
 *              follows the fp32 losses within 1%.
 *   warmup     --compress-start 4: steps 1-4 are the plain fp32 run bit
 *              for bit and send its bytes; from step 5 top-k sends its
 *              encoded size and the losses leave the plain run's.
 *   freeze     --compress-freeze-v: AdamW's v after 4 and after 6 steps
 *              with --compress-start 2 are the same bits (frozen after the
 *              dense steps), unlike without the flag; the run learns;
 *              the flag without a warm-up or codec is refused.
 *   resume     topk and powersgd runs stopped after 3 of 10 steps and
 *              resumed: losses and parameters bit-identical to the
 *              uninterrupted run (residuals and Q are in the checkpoint),
 *              also across the switch of --compress-start 5 (stopped in
 *              the dense phase) and 2 (stopped just after it), and with
 *              --compress-freeze-v on both sides;
 *              resuming with another codec is allowed and says that the
 *              codec state was not restored.
 *   config     the config file keys compress / compress-ef work like the
 *              flags; every other codec and --grad-dtype fp16 train 5 steps
 *              in sync; --grad-dtype with --compress is refused.
 *   dense      --compress-dense-below 200 (the tiny model's vectors): after
 *              one step (no clipping) every vector parameter equals the
 *              plain fp32 run's bit for bit and some matrix parameter does
 *              not; without the flag some vector differs; each step sends
 *              top-k's bytes plus 4 per vector value; without a codec
 *              the flag changes nothing (same bytes and parameters).
 *   ramp       --compress-start 2 --compress-ramp 3: steps 1-2 send the
 *              fp32 bytes, steps 3-5 top-k's at the falling density
 *              (25% -> 1%, per bucket 32 + 8 ceil(f m) bytes), then top-k
 *              1%'s; ramps that cannot ramp are refused.
 *   auto       --compress auto: every step's metrics name a codec per bucket
 *              (the first step none: nothing measured yet) and the link
 *              estimate, bytes_sent follows the choice (none's fp32 bytes,
 *              less when a bucket is compressed), the ranks stay in sync
 *              (--check-every) and the run learns; config.json keeps the
 *              list and --config reads it back; a stopped and resumed run
 *              restores its state (residuals of auto:none,topk:0.05 with
 *              error feedback); combinations it cannot serve are refused.
 * Run one case per process: test_train_compress CASE.
 */
#include "train_util.h"

#include "dtrain/compress.h"
#include "dtrain/nn.h"

#include <math.h>

#define DTRAIN DT_CLI_PATH
#define TINY                                                                                       \
    "--model tiny --layers 2 --dim 32 --heads 2 --seq 32 --threads 1 --peak-flops 1e9 "            \
    "--sample-tokens 0 --progress plain --val-split 0 --bucket-size 16K --lr 3e-3 --warmup 2 "     \
    "--global-batch 8 --nproc 2"

static char corpus[128];

/* Train into tu_dir/NAME for `steps` steps (metrics must reach step
 * `last`); loss[1..last] from metrics. */
static void train_to(const char *name, int steps, int last, const char *extra, double *loss) {
    EXPECT_RC(tu_run("%s train --data %s " TINY " --steps %d --check-every 5 --ckpt-dir %s/%s/ck "
                     "--run-dir %s/%s %s",
                     DTRAIN, corpus, steps, tu_dir, name, tu_dir, name, extra),
              0);
    char p[192];
    snprintf(p, sizeof p, "%s/%s/metrics.jsonl", tu_dir, name);
    ASSERT_EQ(tu_losses(p, loss, 63), last);
}

static void train(const char *name, int steps, const char *extra, double *loss) {
    train_to(name, steps, steps, extra, loss);
}

/* bytes_sent of every step of NAME's metrics into b[1..]; returns the count. */
static int step_bytes(const char *name, uint64_t *b, int max) {
    char text[64][64];
    int n = tu_metric_text(name, "bytes_sent", text, max < 64 ? max : 64);
    for (int i = 0; i < n; i++)
        b[i + 1] = strtoull(text[i] + strlen("\"bytes_sent\":"), NULL, 10);
    return n;
}

/* bytes_sent of the last line of NAME's metrics. */
static uint64_t bytes_sent(const char *name) {
    uint64_t b[64];
    int n = step_bytes(name, b, 63);
    ASSERT_TRUE(n >= 1 && n < 63); /* the last line, not the 63rd */
    return b[n];
}

/* Parameters in the newest checkpoint of NAME. */
static size_t nparams(const char *name) {
    char p[192];
    size_t n;
    snprintf(p, sizeof p, "%s/%s/ck", tu_dir, name);
    free(tu_params(p, &n));
    return n;
}

static void expect_learns(const char *what, const double *l, int steps) {
    printf("  %s: loss %.4f -> %.4f\n", what, l[1], l[steps]);
    if (!(l[steps] < l[1] - 0.3))
        TEST_FAILF("%s: loss %.4f -> %.4f did not go down by 0.3", what, l[1], l[steps]);
}

static void test_topk(void) {
    double l[64];
    train("topk", 40, "--compress topk:0.01", l);
    EXPECT_OUT("gradients: topk:0.01 ef=auto");
    expect_learns("topk:0.01", l, 40);
    /* Overlap: the worker took buckets while backward still ran. */
    const char *ov = strstr(tu_out, "exposed (");
    int started = 0, buckets = 0;
    ASSERT_TRUE(ov && sscanf(strstr(ov, "); ") + 3, "%d of %d buckets", &started, &buckets) == 2);
    ASSERT_TRUE(buckets >= 4);
    ASSERT_TRUE(started >= buckets - 2);
    /* Buckets of 4096 floats from the end of the buffer; each sends its
     * encoding (32 + 8 k bytes) once to the one peer. */
    size_t n = nparams("topk"), per = 4096;
    dt_codec_spec spec;
    ASSERT_OK(dt_codec_parse("spec", "topk:0.01", &spec));
    uint64_t want = 0;
    for (size_t end = n; end > 0; end = end > per ? end - per : 0) {
        size_t m = end > per ? per : end;
        want += 32 + 8 * dt_codec_k(&spec, m);
    }
    ASSERT_EQ(bytes_sent("topk"), want);
}

static void test_powersgd(void) {
    double l[64], lp[64];
    train("plain", 40, "", lp);
    train("psgd", 40, "--compress powersgd:4", l);
    EXPECT_OUT("gradients: powersgd:4 ef=auto");
    expect_learns("powersgd:4", l, 40);
    uint64_t plain = bytes_sent("plain"), psgd = bytes_sent("psgd");
    printf("  bytes per step: fp32 %llu, powersgd:4 %llu\n", (unsigned long long)plain,
           (unsigned long long)psgd);
    ASSERT_EQ(plain, nparams("plain") * 4); /* 2 (W-1)/W * 4n at W = 2 */
    ASSERT_TRUE(psgd > 0 && psgd < plain / 2);
}

static void test_warmup(void) {
    enum { N = 8, START = 4 };
    double lp[64], lw[64];
    uint64_t bp[64], bw[64];
    train("plain", N, "", lp);
    train("warm", N, "--compress topk:0.01 --compress-start 4", lw);
    EXPECT_OUT("gradients: topk:0.01 ef=auto grad_dtype=f32 buckets=");
    EXPECT_OUT(", dense (fp32) for steps 1-4");
    ASSERT_EQ(step_bytes("plain", bp, 63), N);
    ASSERT_EQ(step_bytes("warm", bw, 63), N);
    for (int s = 1; s <= START; s++) {
        if (lw[s] != lp[s]) /* dense steps: the plain allreduce, bit for bit */
            TEST_FAILF("dense step %d: loss %.9g with warm-up, %.9g plain", s, lw[s], lp[s]);
        ASSERT_EQ(bw[s], bp[s]);
    }
    /* Step START+1 is the first compressed one: its loss is computed with
     * the weights of the dense steps, its gradients are sparse. */
    ASSERT_TRUE(lw[START + 1] == lp[START + 1]);
    for (int s = START + 1; s <= N; s++)
        ASSERT_TRUE(bw[s] < bp[s] / 20);
    if (!(lw[N] != lp[N]))
        TEST_FAILF("step %d: loss %.9g equals the plain run's: was anything compressed?", N, lw[N]);
    EXPECT_RC(tu_run("%s train --data %s " TINY " --steps 1 --compress-start -1", DTRAIN, corpus),
              2);
    EXPECT_OUT("--compress-start");
}

/* AdamW's second moment in the newest checkpoint of NAME (caller frees). */
static float *second_moment(const char *name, size_t *n) {
    char p[192];
    snprintf(p, sizeof p, "%s/%s/ck", tu_dir, name);
    return tu_section(p, "adamw.v", n);
}

static void test_freeze(void) {
    double l[64];
    const char *fv = "--compress topk:0.05 --compress-start 2 --compress-freeze-v";
    train("fv4", 4, fv, l);
    EXPECT_OUT(", dense (fp32) for steps 1-2");
    train("fv20", 20, fv, l);
    expect_learns("topk:0.05, v frozen after step 2", l, 20);
    train("nf6", 6, "--compress topk:0.05 --compress-start 2", l);
    size_t n4, n20, n6;
    float *v4 = second_moment("fv4", &n4), *v20 = second_moment("fv20", &n20),
          *v6 = second_moment("nf6", &n6);
    ASSERT_EQ(n4, n20);
    ASSERT_EQ(n4, n6);
    /* v depends only on the gradients of steps 1-2 (the same in every run:
     * the schedules differ from step 3 on), then stays. */
    ASSERT_TRUE(memcmp(v4, v20, n4 * sizeof *v4) == 0);
    ASSERT_TRUE(memcmp(v4, v6, n4 * sizeof *v4) != 0);
    free(v4);
    free(v20);
    free(v6);
    EXPECT_RC(tu_run("%s train --data %s " TINY " --steps 2 --compress topk:0.05 "
                     "--compress-freeze-v",
                     DTRAIN, corpus),
              2);
    EXPECT_OUT("--compress-freeze-v needs --optimizer adamw, a --compress codec and "
               "--compress-start >= 1");
}

/* The tiny model of TINY over the corpus's vocabulary: its tensor table
 * (the vocabulary is found from the parameter count of a checkpoint). */
static dt_gpt *tiny_model(size_t n) {
    dt_gpt_config cfg = {.layers = 2, .dim = 32, .heads = 2, .max_seq = 32, .vocab = 1};
    while (cfg.vocab < 512 && dt_gpt_config_num_params(&cfg) != n)
        cfg.vocab++;
    ASSERT_EQ(dt_gpt_config_num_params(&cfg), n);
    dt_gpt *m;
    ASSERT_OK(dt_gpt_create(&m, &cfg, 1, 32));
    return m;
}

/* Parameters of NAME's checkpoint that differ from REF's, counted in
 * vectors (rows == 1) and in matrices. */
static void count_diffs(const char *ref, const char *name, const dt_gpt *m, size_t *vec,
                        size_t *mat) {
    char pa[192], pb[192];
    size_t na, nb;
    snprintf(pa, sizeof pa, "%s/%s/ck", tu_dir, ref);
    snprintf(pb, sizeof pb, "%s/%s/ck", tu_dir, name);
    float *a = tu_params(pa, &na), *b = tu_params(pb, &nb);
    ASSERT_EQ(na, nb);
    *vec = *mat = 0;
    for (size_t i = 0; i < dt_gpt_num_tensors(m); i++) {
        dt_param_info pi;
        dt_gpt_tensor_info(m, i, &pi);
        for (size_t j = pi.offset; j < pi.offset + pi.rows * pi.cols; j++)
            if (memcmp(&a[j], &b[j], sizeof *a) != 0)
                ++*(pi.rows == 1 ? vec : mat);
    }
    free(a);
    free(b);
}

static void test_dense(void) {
    double l[64];
    const char *one = "--clip 0 --warmup 0";
    char flags[160];
    train("plain", 1, one, l);
    snprintf(flags, sizeof flags, "%s --compress topk:0.01", one);
    train("topk", 1, flags, l);
    snprintf(flags, sizeof flags, "%s --compress topk:0.01 --compress-dense-below 200", one);
    train("dense", 1, flags, l);
    EXPECT_OUT(" dense_below=200, tensors < 200 values exact");
    size_t n = nparams("plain"), vec, mat, nvec = 0;
    dt_gpt *m = tiny_model(n);
    for (size_t i = 0; i < dt_gpt_num_tensors(m); i++) {
        dt_param_info pi;
        dt_gpt_tensor_info(m, i, &pi);
        nvec += pi.rows == 1 ? pi.cols : 0;
        /* The threshold splits this model's tensors into vectors and matrices. */
        ASSERT_TRUE((pi.rows == 1) == (pi.rows * pi.cols < 200));
    }
    count_diffs("plain", "dense", m, &vec, &mat);
    printf("  dense_below: %zu vector values (%zu differ from fp32), %zu matrix values differ\n",
           nvec, vec, mat);
    ASSERT_EQ(vec, 0);
    ASSERT_TRUE(mat > 0);
    count_diffs("plain", "topk", m, &vec, &mat);
    printf("  top-k alone: %zu vector values differ from fp32\n", vec);
    ASSERT_TRUE(vec > 0);
    /* W = 2: the vectors' f32 allreduce sends 4 bytes per value. */
    ASSERT_EQ(bytes_sent("dense"), bytes_sent("topk") + 4 * nvec);
    /* Without a codec everything is exact already: accepted, the same bytes. */
    snprintf(flags, sizeof flags, "%s --compress-dense-below 200", one);
    train("plain_d", 1, flags, l);
    ASSERT_EQ(bytes_sent("plain_d"), bytes_sent("plain"));
    count_diffs("plain", "plain_d", m, &vec, &mat);
    ASSERT_EQ(vec + mat, 0);
    dt_gpt_destroy(m);
}

static void test_ramp(void) {
    enum { N = 7, START = 2, RAMP = 3 };
    double l[64];
    uint64_t b[64];
    train("ramp", N, "--compress topk:0.01 --compress-start 2 --compress-ramp 3", l);
    EXPECT_OUT(", density 25% -> 1% over steps 3-5");
    ASSERT_EQ(step_bytes("ramp", b, 63), N);
    size_t n = nparams("ramp"), per = 4096;
    for (int s = 1; s <= N; s++) {
        uint64_t want = 0;
        int r = s - 1 - START; /* steps into the ramp */
        double f = r >= 0 && r < RAMP
                       ? pow(0.25, 1 - (double)r / RAMP) * pow(0.01, (double)r / RAMP)
                       : 0.01;
        for (size_t end = n; end > 0; end = end > per ? end - per : 0) {
            size_t m = end > per ? per : end;
            dt_codec_spec spec = {.kind = DT_CODEC_TOPK, .fraction = f};
            want += s <= START ? 4 * m : 32 + 8 * dt_codec_k(&spec, m);
        }
        printf("  step %d: density %.4f, %llu bytes\n", s, s <= START ? 1.0 : f,
               (unsigned long long)b[s]);
        ASSERT_EQ(b[s], want);
    }
    ASSERT_TRUE(b[3] > b[4] && b[4] > b[5] && b[5] > b[6] && b[6] == b[7]);
    EXPECT_RC(tu_run("%s train --data %s " TINY " --steps 2 --compress powersgd:2 "
                     "--compress-ramp 2",
                     DTRAIN, corpus),
              2);
    EXPECT_OUT("--compress-ramp 2 needs --compress topk:F with a fraction F below 0.25");
    EXPECT_RC(tu_run("%s train --data %s " TINY " --steps 2 --compress topk:0.5 "
                     "--compress-ramp 2",
                     DTRAIN, corpus),
              2);
    EXPECT_OUT("got topk:0.5");
}

static void test_bf16(void) {
    double l32[64], l16[64];
    train("f32", 20, "", l32);
    train("bf16", 20, "--grad-dtype bf16", l16);
    EXPECT_OUT("gradients: none ef=auto grad_dtype=bf16");
    ASSERT_EQ(bytes_sent("bf16") * 2, bytes_sent("f32"));
    for (int s = 1; s <= 20; s++)
        ASSERT_NEAR(l16[s], l32[s], 1e-2, 0);
    expect_learns("grad-dtype bf16", l16, 20);
}

static void resume_case(const char *codec, const char *tag) {
    char a[64], b[64], flags[128];
    snprintf(a, sizeof a, "full_%s", tag);
    snprintf(b, sizeof b, "cut_%s", tag);
    snprintf(flags, sizeof flags, "--ckpt-every 2 --clip 0.5 --compress %s", codec);
    double l[64];
    train(a, 10, flags, l);
    char stop[160];
    snprintf(stop, sizeof stop, "%s --stop-after 3", flags);
    train_to(b, 10, 3, stop, l);
    char more[160];
    snprintf(more, sizeof more, "%s --resume", flags);
    train(b, 10, more, l);
    EXPECT_OUT("at step 3");
    if (strstr(tu_out, "not restored"))
        TEST_FAILF("%s: the codec state was not restored:\n%.600s", codec, tu_out);
    tu_compare_runs(a, b, 10);
}

static void test_resume(void) {
    resume_case("topk:0.05", "topk");
    resume_case("powersgd:2", "psgd");
    /* Dense warm-up: stopped during it (residuals all zero in the
     * checkpoint) and right after it (the first residuals). */
    resume_case("topk:0.05 --compress-start 5", "topk_w5");
    resume_case("powersgd:2 --compress-start 2", "psgd_w2");
    resume_case("topk:0.05 --compress-start 5 --compress-freeze-v", "topk_fv5");
    resume_case("topk:0.05 --compress-start 2 --compress-freeze-v", "topk_fv2");
    /* Stopped inside a density ramp, with exact vectors. */
    resume_case("topk:0.05 --compress-ramp 6 --compress-dense-below 200", "topk_rd");
    /* Another codec on resume: allowed, the state starts from zero. */
    EXPECT_RC(tu_run("%s train --data %s " TINY " --steps 12 --ckpt-dir %s/cut_topk/ck "
                     "--run-dir %s/cut_topk --compress sign --resume",
                     DTRAIN, corpus, tu_dir, tu_dir),
              0);
    EXPECT_OUT("gradient codec state not restored (it was written with another codec");
}

static void test_config(void) {
    char cfg[128];
    snprintf(cfg, sizeof cfg, "%s/run.cfg", tu_dir);
    FILE *f = fopen(cfg, "w");
    ASSERT_TRUE(f != NULL);
    fprintf(f, "compress = topk:0.02\ncompress-ef = on\ncompress-start = 1\n");
    fclose(f);
    double l[64];
    char extra[192];
    snprintf(extra, sizeof extra, "--config %s", cfg);
    train("cfg", 3, extra, l);
    EXPECT_OUT("gradients: topk:0.02 ef=on");
    EXPECT_OUT("dense (fp32) for steps 1-1");
    char path[160], json[8192];
    snprintf(path, sizeof path, "%s/cfg/config.json", tu_dir);
    f = fopen(path, "r");
    ASSERT_TRUE(f != NULL);
    json[fread(json, 1, sizeof json - 1, f)] = '\0';
    fclose(f);
    ASSERT_TRUE(strstr(json, "\"compress\": \"topk:0.02\"") != NULL);
    ASSERT_TRUE(strstr(json, "\"compress-ef\": \"on\"") != NULL);
    ASSERT_TRUE(strstr(json, "\"compress-start\": 1") != NULL);
    /* Every other codec and dtype: a few steps with the ranks in sync. */
    const char *more[] = {"--compress fp16",  "--compress bf16 --compress-ef on",
                          "--compress int8",  "--compress qsgd:4",
                          "--compress sign",  "--compress randk:0.1",
                          "--grad-dtype fp16"};
    for (size_t i = 0; i < sizeof more / sizeof more[0]; i++) {
        char name[16];
        snprintf(name, sizeof name, "more%zu", i);
        train_to(name, 5, 5, more[i], l);
        if (!(l[5] < l[1]))
            TEST_FAILF("%s: loss %.4f -> %.4f", more[i], l[1], l[5]);
    }
    EXPECT_RC(tu_run("%s train --data %s " TINY " --steps 1 --grad-dtype bf16 --compress int8",
                     DTRAIN, corpus),
              2);
    EXPECT_OUT("--grad-dtype bf16 with --compress: choose one");
}

/* The "codecs" of every step of NAME's metrics: each names one codec per
 * bucket (runs "SPEC*K", K adding up to `buckets`), from the candidates. */
static void check_codecs(const char *name, int steps, int buckets, const char *const *cands) {
    char path[192], line[4096];
    snprintf(path, sizeof path, "%s/%s/metrics.jsonl", tu_dir, name);
    FILE *f = fopen(path, "r");
    ASSERT_TRUE(f != NULL);
    int n = 0;
    while (fgets(line, sizeof line, f)) {
        n++;
        const char *at = strstr(line, "\"codecs\":\"");
        if (!at || !strstr(line, "\"link_MBps\":"))
            TEST_FAILF("%s line %d: no codecs or link: %.300s", path, n, line);
        at += strlen("\"codecs\":\"");
        int total = 0;
        while (*at && *at != '"') {
            const char *star = strchr(at, '*');
            ASSERT_TRUE(star != NULL);
            bool known = false;
            for (int c = 0; cands[c]; c++)
                known |= strlen(cands[c]) == (size_t)(star - at) &&
                         strncmp(at, cands[c], (size_t)(star - at)) == 0;
            if (!known)
                TEST_FAILF("%s line %d: codec %.*s is not a candidate", path, n, (int)(star - at),
                           at);
            total += atoi(star + 1);
            at = star + 1 + strspn(star + 1, "0123456789");
            at += *at == ',';
        }
        ASSERT_EQ(total, buckets);
        if (n == 1 && !strstr(line, "\"codecs\":\"none*"))
            TEST_FAILF("step 1 is not uncompressed: %.300s", line);
    }
    fclose(f);
    ASSERT_EQ(n, steps);
}

static void test_auto(void) {
    double l[64];
    static const char *const def[] = {"none", "fp16", "int8", NULL};
    train("auto", 30, "--compress auto", l);
    EXPECT_OUT("gradients: auto:none,fp16,int8 ef=auto");
    expect_learns("auto", l, 30);
    size_t n = nparams("auto"), buckets = (n + 4095) / 4096;
    check_codecs("auto", 30, (int)buckets, def);
    /* Step 1 sends the fp32 allreduce's bytes (4 per value, once at W = 2);
     * no step sends more. */
    uint64_t b[64];
    ASSERT_EQ(step_bytes("auto", b, 63), 30);
    ASSERT_EQ(b[1], 4 * n);
    for (int s = 2; s <= 30; s++)
        ASSERT_TRUE(b[s] <= 4 * n);
    char cfg[192];
    snprintf(cfg, sizeof cfg, "%s/auto/config.json", tu_dir);
    EXPECT_RC(tu_run("grep -qF '\"compress\": \"auto:none,fp16,int8\"' %s", cfg), 0);
    EXPECT_RC(tu_run("%s train --config %s --data %s --steps 3 --no-save", DTRAIN, cfg, corpus), 0);
    EXPECT_OUT("gradients: auto:none,fp16,int8");
    /* Stopped and resumed with error feedback on: the state comes back. */
    static const char *const two[] = {"none", "topk:0.05", NULL};
    const char *fl = "--compress auto:none,topk:0.05 --compress-ef on --ckpt-every 3";
    train_to("auto-r", 10, 3, "--compress auto:none,topk:0.05 --compress-ef on --stop-after 3", l);
    EXPECT_RC(tu_run("%s train --data %s " TINY " --steps 10 --ckpt-dir %s/auto-r/ck --run-dir "
                     "%s/auto-r %s --resume",
                     DTRAIN, corpus, tu_dir, tu_dir, fl),
              0);
    EXPECT_OUT("resumed from");
    ASSERT_TRUE(strstr(tu_out, "codec state was not restored") == NULL);
    check_codecs("auto-r", 10, (int)buckets, two);
    /* Refused: one candidate, ZeRO, a 16-bit dtype, critical priority. */
    const char *bad[][2] = {
        {"--compress auto:int8", "at least two candidates"},
        {"--compress auto --zero 1", "not with --zero"},
        {"--compress auto --grad-dtype bf16", "not with --grad-dtype"},
        {"--compress auto --comm-priority critical", "not with --comm-priority critical"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        EXPECT_RC(
            tu_run("%s train --data %s " TINY " --steps 1 --no-save %s", DTRAIN, corpus, bad[i][0]),
            2);
        EXPECT_OUT(bad[i][1]);
    }
}

static const test_case cases[] = {
    {"auto", test_auto},     {"topk", test_topk},     {"powersgd", test_powersgd},
    {"bf16", test_bf16},     {"resume", test_resume}, {"config", test_config},
    {"warmup", test_warmup}, {"freeze", test_freeze}, {"dense", test_dense},
    {"ramp", test_ramp},
};

int main(int argc, char **argv) {
    return tu_main(argc, argv, cases, sizeof cases / sizeof cases[0], corpus, sizeof corpus);
}
