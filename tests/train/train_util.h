/*
 * train_util.h — helpers for the tests that run `dtrain train` as a real
 * command: run a command line and capture its output, write a corpus,
 * read metrics.jsonl and a checkpoint's parameters.
 */
#ifndef DTRAIN_TEST_TRAIN_UTIL_H
#define DTRAIN_TEST_TRAIN_UTIL_H

#include "dtrain/nn.h"
#include "dtrain/train.h"
#include "test.h"

#include <math.h>
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

/* The parameters of the newest checkpoint in dir as global tensors, in the
 * unsharded model's layout, whatever layout wrote them. */
static float *tu_global_params(const char *dir, size_t *n) {
    dt_ckpt_set *set;
    ASSERT_OK(dt_ckpt_set_open_latest(&set, dir));
    int64_t id[DT_TRAIN_IDENT_COUNT];
    ASSERT_OK(
        dt_ckpt_read(dt_ckpt_set_manifest(set), "ident", DT_CKPT_I64, id, DT_TRAIN_IDENT_COUNT));
    dt_gpt_config c = {(int)id[0], (int)id[1], (int)id[2], (int)id[3], (int)id[4]};
    dt_param_info *all;
    ASSERT_OK(dt_gpt_config_tensors(&c, &all));
    size_t nt = dt_gpt_config_num_tensors(&c);
    dt_ckpt_tensor *tens = calloc(nt, sizeof *tens);
    dt_ckpt_box *want = calloc(nt, sizeof *want);
    for (size_t i = 0; i < nt; i++) {
        snprintf(tens[i].name, sizeof tens[i].name, "%s", all[i].name);
        tens[i].ndim = (uint32_t)all[i].ndim;
        want[i] = (dt_ckpt_box){.tensor = (uint32_t)i, .offset = all[i].offset};
        for (int d = 0; d < 3; d++)
            tens[i].shape[d] = want[i].extent[d] = all[i].shape[d];
    }
    *n = dt_gpt_config_num_params(&c);
    float *p = malloc(*n * sizeof *p);
    ASSERT_OK(dt_ckpt_set_read_boxes(set, "params", tens, nt, want, nt, p));
    free(tens);
    free(want);
    dt_free(all);
    dt_ckpt_set_close(set);
    return p;
}

/* b against a: losses and norms of every step within rel, parameters
 * within rel (with an absolute floor for values near zero). */
static void tu_expect_close(const char *what, int steps, const double *la, const double *lb,
                            const double *na, const double *nb, const float *pa, const float *pb,
                            size_t n, double rel) {
    double wl = 0, wp = 0;
    for (int s = 1; s <= steps; s++) {
        if (!(fabs(la[s] - lb[s]) <= rel * fabs(la[s])))
            TEST_FAILF("%s: step %d loss %.9g vs %.9g (tolerance %g)", what, s, la[s], lb[s], rel);
        if (!(fabs(na[s] - nb[s]) <= 10 * rel * fabs(na[s])))
            TEST_FAILF("%s: step %d gradient norm %.9g vs %.9g", what, s, na[s], nb[s]);
        wl = fmax(wl, fabs(la[s] - lb[s]) / fabs(la[s]));
    }
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)pa[i] - pb[i]);
        if (!(d <= 10 * rel * fabs((double)pa[i]) + rel / 50))
            TEST_FAILF("%s: param %zu = %.9g vs %.9g", what, i, pa[i], pb[i]);
        wp = fmax(wp, d);
    }
    printf("  %s: losses %.6f..%.6f, worst loss diff %.2g (rel), param diff %.2g\n", what, la[1],
           la[steps], wl, wp);
}

/* The layout tests' run (tp, pp, cp): `dtrain train` with the test's
 * common flags and `extra` into tu_dir/NAME for `steps` steps. Fills
 * loss[s] and norm[s] from its metrics (s = 1..steps); returns its final
 * global parameters (caller frees). */
static float *tu_train(const char *common, const char *corpus, const char *name, const char *extra,
                       int steps, size_t *n, double *loss, double *norm) {
    EXPECT_RC(tu_run("%s train --data %s %s --steps %d --ckpt-dir %s/%s/ck --run-dir %s/%s %s",
                     DT_CLI_PATH, corpus, common, steps, tu_dir, name, tu_dir, name, extra),
              0);
    char p[192];
    snprintf(p, sizeof p, "%s/%s/metrics.jsonl", tu_dir, name);
    ASSERT_EQ(tu_losses(p, loss, 63), steps);
    char text[64][64];
    ASSERT_EQ(tu_metric_text(name, "grad_norm", text, 63), steps);
    for (int s = 1; s <= steps; s++)
        norm[s] = strtod(text[s - 1] + strlen("\"grad_norm\":"), NULL);
    snprintf(p, sizeof p, "%s/%s/ck", tu_dir, name);
    return tu_global_params(p, n);
}

/* Stop after steps/2 in layout a, resume in layout b, against a's
 * uninterrupted run: bit-identical (losses and parameters) with rel 0,
 * else within rel. */
static void tu_reshard(const char *common, const char *corpus, const char *name, const char *a,
                       const char *b, double rel, int steps) {
    double lu[64], nu[64], lr[64], nr[64];
    size_t n1, n2;
    char un[64], rs[64], extra[256];
    snprintf(un, sizeof un, "%s_whole", name);
    snprintf(rs, sizeof rs, "%s_resumed", name);
    float *pu = tu_train(common, corpus, un, a, steps, &n1, lu, nu);
    EXPECT_RC(tu_run("%s train --data %s %s --steps %d --ckpt-dir %s/%s/ck --run-dir %s/%s "
                     "--stop-after %d %s",
                     DT_CLI_PATH, corpus, common, steps, tu_dir, rs, tu_dir, rs, steps / 2, a),
              0);
    snprintf(extra, sizeof extra, "--resume %s", b);
    float *pr = tu_train(common, corpus, rs, extra, steps, &n2, lr, nr);
    EXPECT_OUT("resumed from");
    ASSERT_EQ(n1, n2);
    if (rel == 0) {
        for (int s = 1; s <= steps; s++)
            if (lu[s] != lr[s])
                TEST_FAILF("%s: step %d loss %.9g uninterrupted, %.9g resumed", name, s, lu[s],
                           lr[s]);
        ASSERT_TRUE(memcmp(pu, pr, n1 * sizeof *pu) == 0);
        printf("  %s: bit-identical\n", name);
    } else {
        tu_expect_close(name, steps, lu, lr, nu, nr, pu, pr, n1, rel);
    }
    free(pu);
    free(pr);
}

#endif
