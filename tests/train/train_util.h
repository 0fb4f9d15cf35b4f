/*
 * train_util.h — helpers for the tests that run `dtrain train` as a real
 * command: run a command line and capture its output, write a corpus,
 * read metrics.jsonl and a checkpoint's parameters.
 */
#ifndef DTRAIN_TEST_TRAIN_UTIL_H
#define DTRAIN_TEST_TRAIN_UTIL_H

#include "dtrain/train.h"
#include "test.h"

#include <signal.h>
#include <stdarg.h>
#include <sys/wait.h>
#include <unistd.h>

/* Each test program uses some of these helpers. */
#pragma GCC diagnostic ignored "-Wunused-function"

static char tu_out[8192]; /* last command's output (stdout + stderr, tail) */
static char tu_dir[64];   /* the test's scratch directory */

/* Run a shell command line (printf-style); returns its exit code, or
 * 128 + signal. The output's last 8 KiB land in tu_out. */
static int tu_run(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int tu_run(const char *fmt, ...) {
    char cmd[4096], full[4300];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    snprintf(full, sizeof full, "%s > %s/out.txt 2>&1", cmd, tu_dir);
    int status = system(full);
    char path[128];
    snprintf(path, sizeof path, "%s/out.txt", tu_dir);
    FILE *f = fopen(path, "rb");
    tu_out[0] = '\0';
    if (f) {
        fseek(f, 0, SEEK_END);
        long len = ftell(f);
        long from = len > (long)sizeof tu_out - 1 ? len - (long)sizeof tu_out + 1 : 0;
        fseek(f, from, SEEK_SET);
        size_t n = fread(tu_out, 1, sizeof tu_out - 1, f);
        tu_out[n] = '\0';
        fclose(f);
    }
    if (WIFEXITED(status))
        return WEXITSTATUS(status);
    return 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
}

/* Expect the last output to contain `needle`, printing it otherwise. */
#define EXPECT_OUT(needle)                                                                         \
    do {                                                                                           \
        if (!strstr(tu_out, (needle))) {                                                           \
            fprintf(stderr, "output was:\n%s\n", tu_out);                                          \
            TEST_FAILF("expected the output to contain \"%s\"", (needle));                         \
        }                                                                                          \
    } while (0)

#define EXPECT_RC(call, rc)                                                                        \
    do {                                                                                           \
        int tu__rc = (call);                                                                       \
        if (tu__rc != (rc)) {                                                                      \
            fprintf(stderr, "output was:\n%s\n", tu_out);                                          \
            TEST_FAILF("%s exited %d, expected %d", #call, tu__rc, (rc));                          \
        }                                                                                          \
    } while (0)

static void tu_setup(void) {
    snprintf(tu_dir, sizeof tu_dir, "/tmp/dt_train_XXXXXX");
    ASSERT_TRUE(mkdtemp(tu_dir) != NULL);
}

static void tu_cleanup(void) {
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tu_dir);
    ASSERT_EQ(system(cmd), 0);
}

/* A deterministic English-like corpus of about `bytes` bytes. */
static void tu_corpus(const char *path, size_t bytes) {
    static const char *const words[] = {
        "the",   "king",  "and",    "queen", "of",   "a",     "castle", "rode", "to",
        "war",   "with",  "his",    "men",   "but",  "she",   "said",   "no",   "more",
        "shall", "we",    "fight",  "for",   "gold", "or",    "glory",  "in",   "this",
        "land",  "where", "rivers", "run",   "cold", "under", "stone"};
    FILE *f = fopen(path, "w");
    ASSERT_TRUE(f != NULL);
    dt_rng r;
    dt_rng_init(&r, 7, dt_rng_stream_id(0, 0, DT_RNG_TEST));
    size_t n = 0;
    int col = 0;
    while (n < bytes) {
        const char *w = words[dt_rng_below(&r, sizeof words / sizeof words[0])];
        n += (size_t)fprintf(f, "%s", w);
        col += (int)strlen(w);
        if (dt_rng_below(&r, 9) == 0) {
            n += (size_t)fprintf(f, ".\n");
            col = 0;
        } else if (col > 60) {
            n += (size_t)fprintf(f, ",\n");
            col = 0;
        } else {
            n += (size_t)fprintf(f, " ");
            col++;
        }
    }
    fclose(f);
}

/* Losses of metrics.jsonl by step (the last line of a step wins, as after a
 * restart); returns the highest step seen. */
static int64_t tu_losses(const char *path, double *loss, int64_t max_step) {
    FILE *f = fopen(path, "r");
    ASSERT_TRUE(f != NULL);
    char line[2048];
    int64_t hi = 0;
    while (fgets(line, sizeof line, f)) {
        long long step;
        double l;
        if (sscanf(line, "{\"step\":%lld,\"loss\":%lf", &step, &l) != 2)
            TEST_FAILF("bad metrics line in %s: %.200s", path, line);
        ASSERT_TRUE(step >= 1 && step <= max_step);
        loss[step] = l;
        hi = step > hi ? step : hi;
    }
    fclose(f);
    return hi;
}

/* Section `name` of the newest checkpoint in dir, as floats (caller frees). */
static float *tu_section(const char *dir, const char *name, size_t *n) {
    dt_ckpt *ck;
    ASSERT_OK(dt_ckpt_open_latest(&ck, dir));
    dt_ckpt_info info;
    ASSERT_OK(dt_ckpt_find(ck, name, &info));
    float *p = malloc(info.bytes);
    memcpy(p, info.data, info.bytes);
    *n = info.count;
    dt_ckpt_close(ck);
    return p;
}

/* The parameters of the newest checkpoint in dir (caller frees). */
static float *tu_params(const char *dir, size_t *n) { return tu_section(dir, "params", n); }

/* For each of the first `max` lines of run NAME's metrics.jsonl (NAME under
 * tu_dir), the text from `"KEY":` on, cut to 63 bytes, into out[i]; every
 * line must have KEY. Returns the number of lines read. */
static int tu_metric_text(const char *name, const char *key, char (*out)[64], int max) {
    char path[192], line[2048], quoted[64];
    snprintf(path, sizeof path, "%s/%s/metrics.jsonl", tu_dir, name);
    snprintf(quoted, sizeof quoted, "\"%s\":", key);
    FILE *f = fopen(path, "r");
    ASSERT_TRUE(f != NULL);
    int n = 0;
    while (n < max && fgets(line, sizeof line, f)) {
        const char *at = strstr(line, quoted);
        if (!at)
            TEST_FAILF("%s: no %s in line %d: %.200s", path, quoted, n + 1, line);
        snprintf(out[n++], 64, "%s", at);
    }
    fclose(f);
    return n;
}

/* Start `dtrain train ARGS... --ckpt-dir DIR --run-dir DIR/run` in the
 * background (output to DIR.log), wait until it wrote a checkpoint, send
 * `sig`, and return its exit code; *last_step gets the last step in its
 * metrics and *ckpt_step the step of the newest checkpoint. */
static int tu_interrupt(const char *dir, int sig, const char *const *args, int64_t *last_step,
                        int64_t *ckpt_step) {
    char run[160], log[160], latest[160];
    snprintf(run, sizeof run, "%s/run", dir);
    snprintf(log, sizeof log, "%s.log", dir);
    snprintf(latest, sizeof latest, "%s/latest", dir);
    pid_t pid = fork();
    ASSERT_TRUE(pid >= 0);
    if (pid == 0) {
        const char *argv[64];
        int n = 0;
        argv[n++] = DT_CLI_PATH;
        argv[n++] = "train";
        for (int i = 0; args[i]; i++)
            argv[n++] = args[i];
        argv[n++] = "--ckpt-dir";
        argv[n++] = dir;
        argv[n++] = "--run-dir";
        argv[n++] = run;
        argv[n] = NULL;
        FILE *f = freopen(log, "w", stderr);
        (void)f;
        dup2(2, 1);
        execv(DT_CLI_PATH, (char *const *)argv);
        _exit(127);
    }
    double t0 = dt_now();
    char target[64];
    while (readlink(latest, target, sizeof target) <= 0 && dt_now() - t0 < 30)
        dt_sleep_ms(5);
    kill(pid, sig);
    int status;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    double loss[1];
    (void)loss;
    char path[200];
    snprintf(path, sizeof path, "%s/metrics.jsonl", run);
    FILE *f = fopen(path, "r");
    ASSERT_TRUE(f != NULL);
    char line[2048];
    *last_step = 0;
    while (fgets(line, sizeof line, f)) {
        long long st;
        if (sscanf(line, "{\"step\":%lld", &st) == 1)
            *last_step = st;
    }
    fclose(f);
    dt_ckpt *ck;
    ASSERT_OK(dt_ckpt_open_latest(&ck, dir));
    ASSERT_OK(dt_ckpt_read(ck, "step", DT_CKPT_I64, ckpt_step, 1));
    dt_ckpt_close(ck);
    if (!WIFEXITED(status)) {
        char cmd[200];
        snprintf(cmd, sizeof cmd, "tail -n 5 '%s' >&2", log);
        (void)system(cmd);
        TEST_FAILF("dtrain train was killed by signal %d after signal %d",
                   WIFSIGNALED(status) ? WTERMSIG(status) : -1, sig);
    }
    return WEXITSTATUS(status);
}

/* Runs a and b (run directories under tu_dir, checkpoints in RUN/ck) had
 * the same loss at every one of `steps` steps and end with bit-identical
 * parameters. */
static void tu_compare_runs(const char *a, const char *b, int64_t steps) {
    double la[64], lb[64];
    char pa[192], pb[192];
    snprintf(pa, sizeof pa, "%s/%s/metrics.jsonl", tu_dir, a);
    snprintf(pb, sizeof pb, "%s/%s/metrics.jsonl", tu_dir, b);
    ASSERT_EQ(tu_losses(pa, la, 63), steps);
    ASSERT_EQ(tu_losses(pb, lb, 63), steps);
    for (int s = 1; s <= steps; s++)
        if (la[s] != lb[s])
            TEST_FAILF("step %d: loss %.9g in run %s, %.9g in run %s", s, la[s], a, lb[s], b);
    size_t na, nb;
    snprintf(pa, sizeof pa, "%s/%s/ck", tu_dir, a);
    snprintf(pb, sizeof pb, "%s/%s/ck", tu_dir, b);
    float *x = tu_params(pa, &na), *y = tu_params(pb, &nb);
    ASSERT_EQ(na, nb);
    ASSERT_TRUE(memcmp(x, y, na * sizeof *x) == 0);
    free(x);
    free(y);
}

/* main() of a multi-case train test: the case argv[1] names runs in a fresh
 * scratch directory with a 40 KB corpus written to `corpus` (len bytes). */
static int tu_main(int argc, char **argv, const test_case *cases, size_t n, char *corpus,
                   size_t len) {
    const test_case *c = test_find_case(argc, argv, cases, n);
    if (!c)
        return 2;
    tu_setup();
    snprintf(corpus, len, "%s/corpus.txt", tu_dir);
    tu_corpus(corpus, 40000);
    test_run_case(c);
    tu_cleanup();
    return TEST_SUMMARY();
}

#endif
