/*
 * test_train_cli.c — `dtrain train` as a user runs it, one rank: bad input
 * of every kind gives a clear error, NaN stops naming the step and keeps the
 * last good checkpoint, a checkpoint of another model or vocabulary is
 * refused, --config works with flags winning, --resume continues
 * bit-identically, and SIGKILL at random moments (often inside a
 * checkpoint write) never leaves the run without a resumable checkpoint.
 */
#include "train_util.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>

#define DTRAIN DT_CLI_PATH
/* A small model that still has several tensors per block. */
#define TINY                                                                                       \
    "--model tiny --layers 2 --dim 32 --heads 2 --seq 32 --threads 1 --peak-flops 1e9 "            \
    "--sample-tokens 0 --progress plain --val-split 0.1 --eval-batches 2"

static char corpus[128], corpus2[128];

static void test_bad_inputs(void) {
    EXPECT_RC(tu_run("%s train --batch 2 " TINY, DTRAIN), 2);
    EXPECT_OUT("--data FILE is required");
    EXPECT_RC(tu_run("%s train --data %s/missing.txt --batch 2 " TINY, DTRAIN, tu_dir), 1);
    EXPECT_OUT("missing.txt");
    EXPECT_OUT("no such file");
    EXPECT_RC(tu_run("touch %s/empty.txt && %s train --data %s/empty.txt --batch 2 " TINY, tu_dir,
                     DTRAIN, tu_dir),
              2);
    EXPECT_OUT("empty.txt: the file is empty");
    EXPECT_RC(tu_run("printf 'to be or not' > %s/short.txt && %s train --data %s/short.txt "
                     "--batch 2 --val-split 0 " TINY,
                     tu_dir, DTRAIN, tu_dir),
              2);
    EXPECT_OUT("shorter than one window of T+1 = 33 tokens");
    /* Enough for training but the 10% validation split is too short. */
    EXPECT_RC(tu_run("head -c 400 %s > %s/small.txt && %s train --data %s/small.txt --batch 2 "
                     "--steps 1 " TINY,
                     corpus, tu_dir, DTRAIN, tu_dir),
              2);
    EXPECT_OUT("validation data");
    EXPECT_RC(tu_run("%s train --data %s --batch 0 " TINY, DTRAIN, corpus), 2);
    EXPECT_OUT("--batch: 0 is out of range");
    EXPECT_RC(tu_run("%s train --data %s --batch -3 " TINY, DTRAIN, corpus), 2);
    EXPECT_OUT("--batch: -3 is out of range");
    EXPECT_RC(tu_run("%s train --data %s --batch 2 --steps 0 " TINY, DTRAIN, corpus), 2);
    EXPECT_OUT("--steps: 0 is out of range");
    EXPECT_RC(tu_run("%s train --data %s --batch 2 " TINY " --dim 30 --heads 4", DTRAIN, corpus),
              2);
    EXPECT_OUT("multiple of heads");
    EXPECT_RC(tu_run("%s train --data %s --batch 2 " TINY " --vocab 5", DTRAIN, corpus), 2);
    EXPECT_OUT("--vocab 5 is smaller than the data's vocabulary");
    EXPECT_RC(tu_run("%s train --data %s --batch 2 --lr -1 " TINY, DTRAIN, corpus), 2);
    EXPECT_OUT("--lr");
    EXPECT_RC(tu_run("%s train --data %s --batch 2 --global-batch 4 " TINY, DTRAIN, corpus), 2);
    EXPECT_OUT("--batch 2 x 1 ranks != --global-batch 4");
    EXPECT_RC(tu_run("%s train --data %s --batch 2 --steps 5 --warmup 5 " TINY, DTRAIN, corpus), 2);
    EXPECT_OUT("--warmup 5 must be smaller than --steps 5");
    EXPECT_RC(tu_run("%s train --data %s --batch 2 --resume " TINY, DTRAIN, corpus), 2);
    EXPECT_OUT("--resume needs --ckpt-dir");
}

/* A learning rate far too large: the run stops naming the step, and the
 * checkpoint directory still holds the last good step. */
static void test_nan_stops(void) {
    EXPECT_RC(tu_run("%s train --data %s --batch 2 --steps 50 --lr 1000 --clip 0 --ckpt-dir "
                     "%s/nan --ckpt-every 1 " TINY,
                     DTRAIN, corpus, tu_dir),
              1);
    EXPECT_OUT(" at step ");
    EXPECT_OUT("the last good checkpoint is kept");
    const char *at = strstr(tu_out, " at step ");
    long bad_step = strtol(at + 9, NULL, 10);
    ASSERT_TRUE(bad_step >= 2);
    char dir[128];
    snprintf(dir, sizeof dir, "%s/nan", tu_dir);
    dt_ckpt *ck;
    ASSERT_OK(dt_ckpt_open_latest(&ck, dir));
    int64_t step;
    ASSERT_OK(dt_ckpt_read(ck, "step", DT_CKPT_I64, &step, 1));
    ASSERT_EQ(step, bad_step - 1);
    dt_ckpt_info p;
    ASSERT_OK(dt_ckpt_find(ck, "params", &p));
    for (size_t i = 0; i < p.count; i++)
        ASSERT_TRUE(isfinite(((const float *)p.data)[i]));
    dt_ckpt_close(ck);
}

static void test_resume_refuses_mismatch(void) {
    EXPECT_RC(tu_run("%s train --data %s --batch 2 --steps 2 --ckpt-dir %s/mm " TINY, DTRAIN,
                     corpus, tu_dir),
              0);
    EXPECT_RC(tu_run("%s train --data %s --batch 2 --steps 4 --ckpt-dir %s/mm --resume " TINY
                     " --dim 48",
                     DTRAIN, corpus, tu_dir),
              1);
    EXPECT_OUT("was written with dim 32, this run has dim 48");
    EXPECT_RC(tu_run("%s train --data %s --batch 3 --steps 4 --ckpt-dir %s/mm --resume " TINY,
                     DTRAIN, corpus, tu_dir),
              1);
    EXPECT_OUT("was written with global batch 2, this run has global batch 3");
    EXPECT_RC(tu_run("%s train --data %s --batch 2 --steps 4 --ckpt-dir %s/mm --resume " TINY,
                     DTRAIN, corpus2, tu_dir),
              1);
    EXPECT_OUT("was written with vocab 26, this run has vocab 10");
    /* Same vocabulary size, other characters ('a' became 'A'). */
    EXPECT_RC(tu_run("tr a A < %s > %s/upper.txt && %s train --data %s/upper.txt --batch 2 "
                     "--steps 4 --ckpt-dir %s/mm --resume " TINY,
                     corpus, tu_dir, DTRAIN, tu_dir, tu_dir),
              1);
    EXPECT_OUT("vocabulary mismatch");
    EXPECT_RC(tu_run("%s train --data %s --batch 2 --steps 4 --ckpt-dir %s/mm --resume "
                     "--optimizer sgd " TINY,
                     DTRAIN, corpus, tu_dir),
              1);
    EXPECT_OUT("was written with optimizer adamw, this run has optimizer sgd");
    /* A damaged newest checkpoint: resume falls back to the previous one. */
    EXPECT_RC(tu_run("%s train --data %s --batch 2 --steps 4 --ckpt-dir %s/mm --resume "
                     "--ckpt-every 1 " TINY,
                     DTRAIN, corpus, tu_dir),
              0);
    char p[256];
    snprintf(p, sizeof p, "%s/mm/ckpt-000004.dtck", tu_dir);
    ASSERT_EQ(truncate(p, 1000), 0);
    EXPECT_RC(tu_run("%s train --data %s --batch 2 --steps 4 --ckpt-dir %s/mm --resume " TINY,
                     DTRAIN, corpus, tu_dir),
              0);
    EXPECT_OUT("resumed from");
    EXPECT_OUT("ckpt-000003.dtck at step 3");
}

/* A .tok file (made by `dtrain data prepare`) trains like its text, with a
 * byte tokenizer too; a checkpoint from the text run resumes on the .tok
 * (same vocabulary), and a --val-data file with bytes outside the training
 * vocabulary is refused. */
static void test_token_file(void) {
    EXPECT_RC(tu_run("%s data prepare %s -o %s/c.tok --tokenizer char", DTRAIN, corpus, tu_dir), 0);
    EXPECT_RC(tu_run("%s train --data %s --batch 2 --steps 2 --ckpt-dir %s/tok " TINY, DTRAIN,
                     corpus, tu_dir),
              0);
    EXPECT_RC(
        tu_run("%s train --data %s/c.tok --batch 2 --steps 3 --ckpt-dir %s/tok --resume " TINY,
               DTRAIN, tu_dir, tu_dir),
        0);
    EXPECT_OUT("at step 2");
    EXPECT_RC(
        tu_run("%s train --data %s --tokenizer byte --batch 2 --steps 2 " TINY, DTRAIN, corpus), 0);
    EXPECT_OUT("vocab 256");
    /* A vocabulary larger than the tokenizer's (GPT-2's size on bytes): the
     * weights file keeps the 256-entry byte table and `dtrain sample` draws
     * among those ids (both used to fail: "vocabulary table has 256
     * entries, model vocab is 300", and an out-of-range table read). */
    EXPECT_RC(tu_run("%s train --data %s --tokenizer byte --vocab 300 --batch 2 --steps 2 "
                     "--run-dir %s/v300 " TINY,
                     DTRAIN, corpus, tu_dir),
              0);
    EXPECT_OUT("vocab 300");
    EXPECT_RC(
        tu_run("%s sample --ckpt %s/v300/model.dtgw --tokens 40 --prompt the", DTRAIN, tu_dir), 0);
    EXPECT_RC(tu_run("%s train --data %s --val-data %s --batch 2 --steps 2 " TINY, DTRAIN, corpus,
                     corpus2),
              2);
    EXPECT_OUT("--val-data");
}

/* --config supplies defaults; flags win; unknown keys are refused. */
static void test_config_file(void) {
    char cfg[128];
    snprintf(cfg, sizeof cfg, "%s/run.cfg", tu_dir);
    FILE *f = fopen(cfg, "w");
    ASSERT_TRUE(f != NULL);
    fprintf(f,
            "# a training run\nmodel = tiny\nlayers = 1\ndim = 32\nheads = 2\nseq = 32\n"
            "batch = 2\nsteps = 4\nthreads = 1\npeak-flops = 1e9\nsample-tokens = 0\n"
            "data = %s\nrun-dir = %s/cfgrun\n",
            corpus, tu_dir);
    fclose(f);
    EXPECT_RC(tu_run("%s train --config %s --steps 3", DTRAIN, cfg), 0);
    char path[160];
    double loss[8];
    snprintf(path, sizeof path, "%s/cfgrun/metrics.jsonl", tu_dir);
    ASSERT_EQ(tu_losses(path, loss, 7), 3); /* the flag beat steps = 4 */
    snprintf(path, sizeof path, "%s/cfgrun/config.json", tu_dir);
    f = fopen(path, "r");
    ASSERT_TRUE(f != NULL);
    char json[4096];
    json[fread(json, 1, sizeof json - 1, f)] = '\0';
    fclose(f);
    ASSERT_TRUE(strstr(json, "\"layers\": 1,") != NULL);
    ASSERT_TRUE(strstr(json, "\"steps\": 3,") != NULL);
    /* The run directory's final weights feed `dtrain sample`. */
    EXPECT_RC(tu_run("%s sample --ckpt %s/cfgrun/model.dtgw --tokens 20", DTRAIN, tu_dir), 0);
    f = fopen(cfg, "a");
    fprintf(f, "learning-rate = 0.1\n");
    fclose(f);
    EXPECT_RC(tu_run("%s train --config %s", DTRAIN, cfg), 2);
    EXPECT_OUT("run.cfg:14: unknown key 'learning-rate'");
}

/* Stop after 5 of 9 steps, resume: the losses of steps 6..9 and the final
 * parameters are bit-identical to an uninterrupted run. */
static void test_resume_bit_identical(void) {
    const char *common = "--batch 2 --steps 9 --warmup 2 --schedule cosine --ckpt-every 3 "
                         "--eval-every 4 " TINY;
    EXPECT_RC(tu_run("%s train --data %s %s --ckpt-dir %s/a/ck --run-dir %s/a", DTRAIN, corpus,
                     common, tu_dir, tu_dir),
              0);
    EXPECT_RC(tu_run("%s train --data %s %s --ckpt-dir %s/b/ck --run-dir %s/b --stop-after 5",
                     DTRAIN, corpus, common, tu_dir, tu_dir),
              0);
    EXPECT_OUT("stopped after 5 steps");
    EXPECT_RC(tu_run("%s train --data %s %s --ckpt-dir %s/b/ck --run-dir %s/b --resume", DTRAIN,
                     corpus, common, tu_dir, tu_dir),
              0);
    EXPECT_OUT("resumed from");
    EXPECT_OUT("at step 5");
    double la[16], lb[16];
    char pa[160], pb[160];
    snprintf(pa, sizeof pa, "%s/a/metrics.jsonl", tu_dir);
    snprintf(pb, sizeof pb, "%s/b/metrics.jsonl", tu_dir);
    ASSERT_EQ(tu_losses(pa, la, 15), 9);
    ASSERT_EQ(tu_losses(pb, lb, 15), 9);
    for (int s = 1; s <= 9; s++)
        if (la[s] != lb[s])
            TEST_FAILF("step %d: loss %.9g uninterrupted, %.9g resumed", s, la[s], lb[s]);
    ASSERT_TRUE(la[9] < la[1]); /* it learns */
    size_t na, nb;
    snprintf(pa, sizeof pa, "%s/a/ck", tu_dir);
    snprintf(pb, sizeof pb, "%s/b/ck", tu_dir);
    float *a = tu_params(pa, &na), *b = tu_params(pb, &nb);
    ASSERT_EQ(na, nb);
    ASSERT_TRUE(memcmp(a, b, na * sizeof *a) == 0);
    free(a);
    free(b);
}

/* Kill the trainer (checkpointing every step) at random moments; after
 * every kill the directory validates and the next run resumes from it. */
static void test_sigkill_resume(void) {
    char dir[128], latest[160];
    snprintf(dir, sizeof dir, "%s/kill", tu_dir);
    snprintf(latest, sizeof latest, "%s/latest", dir);
    dt_rng r;
    dt_rng_init(&r, 99, dt_rng_stream_id(0, 0, DT_RNG_TEST));
    int64_t prev = 0;
    for (int it = 0; it < 4; it++) {
        pid_t pid = fork();
        ASSERT_TRUE(pid >= 0);
        if (pid == 0) {
            int fd = open("/dev/null", O_WRONLY);
            dup2(fd, 1);
            dup2(fd, 2);
            execl(DTRAIN, "dtrain", "train", "--data", corpus, "--batch", "2", "--steps", "100000",
                  "--ckpt-dir", dir, "--ckpt-every", "1", "--keep", "2", "--resume", "--model",
                  "tiny", "--layers", "2", "--dim", "32", "--heads", "2", "--seq", "32",
                  "--threads", "1", "--peak-flops", "1e9", "--val-split", "0", (char *)NULL);
            _exit(127);
        }
        /* Wait for a checkpoint newer than the last, then kill at random. */
        struct stat sb;
        double t0 = dt_now();
        while (dt_now() - t0 < 20) {
            char target[64];
            ssize_t n = readlink(latest, target, sizeof target - 1);
            if (n > 0) {
                target[n] = '\0';
                long long s = 0;
                if (sscanf(target, "ckpt-%lld.dtck", &s) == 1 && s > prev)
                    break;
            }
            dt_sleep_ms(5);
        }
        ASSERT_EQ(lstat(latest, &sb), 0);
        dt_sleep_ms(dt_rng_below(&r, 150));
        kill(pid, SIGKILL);
        int status;
        ASSERT_EQ(waitpid(pid, &status, 0), pid);
        ASSERT_TRUE(WIFSIGNALED(status));
        EXPECT_RC(tu_run("%s ckpt info %s", DTRAIN, dir), 0);
        EXPECT_OUT("checksum:  ok");
        EXPECT_OUT("run:       layers 2, dim 32, heads 2, seq 32, vocab 26, optimizer adamw");
        dt_ckpt *ck;
        ASSERT_OK(dt_ckpt_open_latest(&ck, dir));
        int64_t step;
        ASSERT_OK(dt_ckpt_read(ck, "step", DT_CKPT_I64, &step, 1));
        dt_ckpt_close(ck);
        ASSERT_TRUE(step > prev);
        prev = step;
    }
    printf("  4 kills, reached step %" PRId64 "\n", prev);
}

/* SIGINT: the run finishes its step, saves a checkpoint of it, exits 130. */
static void test_sigint_saves(void) {
    char dir[128];
    snprintf(dir, sizeof dir, "%s/int", tu_dir);
    const char *args[] = {
        "--data",  corpus,        "--batch", "2",          "--steps",   "1000000", "--ckpt-every",
        "5",       "--model",     "tiny",    "--layers",   "2",         "--dim",   "32",
        "--heads", "2",           "--seq",   "32",         "--threads", "1",       "--peak-flops",
        "1e9",     "--val-split", "0",       "--progress", "plain",     NULL};
    int64_t last, saved;
    ASSERT_EQ(tu_interrupt(dir, SIGINT, args, &last, &saved), 128 + SIGINT);
    ASSERT_TRUE(last >= 5);
    ASSERT_EQ(saved, last);
}

/* A second signal ends the run at once, by that signal, as Ctrl-C twice
 * should (the first has asked for a clean stop). */
static void test_second_signal_ends(void) {
    char dir[128], latest[160], target[64];
    snprintf(dir, sizeof dir, "%s/int2", tu_dir);
    snprintf(latest, sizeof latest, "%s/latest", dir);
    pid_t pid = fork();
    ASSERT_TRUE(pid >= 0);
    if (pid == 0) {
        FILE *f = freopen("/dev/null", "w", stderr);
        (void)f;
        execl(DT_CLI_PATH, DT_CLI_PATH, "train", "--data", corpus, "--batch", "2", "--steps",
              "1000000", "--ckpt-every", "5", "--model", "tiny", "--layers", "2", "--dim", "32",
              "--heads", "2", "--seq", "32", "--threads", "1", "--peak-flops", "1e9", "--val-split",
              "0", "--progress", "plain", "--ckpt-dir", dir, (char *)NULL);
        _exit(127);
    }
    double t0 = dt_now();
    while (readlink(latest, target, sizeof target) <= 0 && dt_now() - t0 < 30)
        dt_sleep_ms(5);
    kill(pid, SIGINT);
    kill(pid, SIGTERM);
    int status;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFSIGNALED(status)); /* by whichever of the two was taken second */
    ASSERT_TRUE(WTERMSIG(status) == SIGINT || WTERMSIG(status) == SIGTERM);
}

int main(void) {
    tu_setup();
    snprintf(corpus, sizeof corpus, "%s/corpus.txt", tu_dir);
    tu_corpus(corpus, 60000);
    snprintf(corpus2, sizeof corpus2, "%s/corpus2.txt", tu_dir);
    FILE *f = fopen(corpus2, "w"); /* another alphabet: digits only */
    for (int i = 0; i < 20000; i++)
        fputc('0' + (i * 7 + i / 13) % 10, f);
    fclose(f);
    RUN(test_bad_inputs);
    RUN(test_nan_stops);
    RUN(test_resume_refuses_mismatch);
    RUN(test_token_file);
    RUN(test_config_file);
    RUN(test_resume_bit_identical);
    RUN(test_sigkill_resume);
    RUN(test_sigint_saves);
    RUN(test_second_signal_ends);
    tu_cleanup();
    return TEST_SUMMARY();
}
