/*
 * test_train_elastic.c — `dtrain train --elastic MIN:MAX` with real
 * processes: ranks killed at random points, rank 0 (the store's host)
 * killed, a newcomer let in, and what is refused.
 *
 *   shrink_1..3  4 ranks (--elastic 2:4, --global-batch 12); the test
 *                SIGKILLs a rank (1, 2 or 3 by seed) as soon as its trace
 *                shows it started a step chosen by the seed, plus a random
 *                0-5 ms (so anywhere in the step: data, forward, backward,
 *                allreduce, checkpoint). Then:
 *                  - the job ends successfully at 3 ranks, in the same 3
 *                    processes (no restart), the first step of the new
 *                    membership starting within 5 s of the kill;
 *                  - its losses after the restored step S0 match a 3-rank
 *                    run resumed from the checkpoint of step S0 (within
 *                    1e-5 relative), and so do the final parameters;
 *                  - sample accounting (DT_DATA_TRACE): every step 1..N was
 *                    last run by one membership whose ranks read, together,
 *                    exactly the 12 windows of that step of a 1-rank loader
 *                    with batch 12, none twice; only the step cut short is
 *                    read again.
 *   shrink_mid   the same with a deterministic kill in the middle of step 9
 *                (DT_FAULT_KILL=2:9:mid): the survivors restore step 8.
 *   shrink_fp16  the same in fp16 with dynamic loss scaling (the scaler's
 *                state and the 16-bit weight copy follow the broadcast).
 *   kill0        rank 0 killed at a seeded step: the store moves, the new
 *                rank 0 writes the metrics; the same checks.
 *   kill0_after  rank 0 kills itself right after its checkpoint of step 7
 *                (DT_FAULT_KILL=0:7): the survivors continue from step 7.
 *   grow         3 ranks; a 4th process started with the job's address
 *                (--join) is let in at a step boundary and gets the state
 *                by broadcast; its losses after S0 match a 4-rank run
 *                resumed from S0, and the accounting holds.
 *   below        --elastic 4:4 and a rank dies: the job fails within
 *                seconds, saying it is below its minimum.
 *   refuse       --elastic with --tp / --zero / a codec (unsupported: exit
 *                1), without --global-batch, with a global batch some size
 *                cannot divide, --join without --elastic, MIN > MAX,
 *                MIN < 1, a malformed or unresolvable --join ADDR:PORT,
 *                for train and launch (exit 2): clear errors.
 */
#include "dtrain/data.h"
#include "train_util.h"

#include <dirent.h>
#include <sys/time.h>

#define DTRAIN DT_CLI_PATH
#define STEPS  30
#define G      12 /* the global batch: divisible by 2, 3 and 4 */
#define TINY                                                                                       \
    "--model tiny --layers 2 --dim 32 --heads 2 --seq 32 --threads 1 --peak-flops 1e9 "            \
    "--sample-tokens 0 --progress plain --val-split 0 --lr 1e-3 --warmup 1 --schedule linear "     \
    "--min-lr 1e-4 --eps 1e-4 --seed 7 --global-batch 12 --keep 1000 --ckpt-every 1"

static char corpus[128];
static const char *extra = ""; /* more flags for every run of a case (bf16) */

static double realtime(void) {
    struct timeval tv;
    gettimeofday(&tv, NULL);
    return (double)tv.tv_sec + tv.tv_usec * 1e-6;
}

/* ------------------------------------------------------------------------ */
/* DT_DATA_TRACE records                                                    */
/* ------------------------------------------------------------------------ */

typedef struct rec {
    double time;
    int gen, step, k, rank, world, pid, n;
    uint32_t win[G];
} rec;

typedef struct trace {
    rec *r;
    int n, cap;
} trace;

static void trace_load(const char *dir, trace *t) {
    t->n = 0;
    DIR *d = opendir(dir);
    ASSERT_TRUE(d != NULL);
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        int pid;
        if (sscanf(e->d_name, "trace-%d.txt", &pid) != 1)
            continue;
        char path[512], line[4096];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        FILE *f = fopen(path, "r");
        ASSERT_TRUE(f != NULL);
        while (fgets(line, sizeof line, f)) {
            if (!strchr(line, '\n'))
                break; /* a line cut by the kill */
            if (t->n == t->cap) {
                t->cap = t->cap ? 2 * t->cap : 256;
                t->r = realloc(t->r, (size_t)t->cap * sizeof *t->r);
            }
            rec *r = &t->r[t->n];
            int off = 0;
            if (sscanf(line, "%lf %d %d %d %d %d%n", &r->time, &r->gen, &r->step, &r->k, &r->rank,
                       &r->world, &off) != 6)
                TEST_FAILF("bad trace line in %.200s: %.200s", path, line);
            r->pid = pid;
            r->n = 0;
            unsigned w;
            int used;
            while (r->n < G && sscanf(line + off, "%u%n", &w, &used) == 1) {
                r->win[r->n++] = w;
                off += used;
            }
            t->n++;
        }
        fclose(f);
    }
    closedir(d);
}

/* The pid of the process that was rank `rank` of generation 0 (0 if none
 * yet), and the highest step it started. */
static int trace_pid(const trace *t, int rank, int *step) {
    int pid = 0;
    *step = 0;
    for (int i = 0; i < t->n; i++)
        if (t->r[i].gen == 0 && t->r[i].rank == rank) {
            pid = t->r[i].pid;
            *step = t->r[i].step > *step ? t->r[i].step : *step;
        }
    return pid;
}

/* The accounting (see the file comment); returns how many steps were read
 * by more than one membership. */
static int check_accounting(const trace *t, int steps) {
    dt_token_file *f;
    ASSERT_OK(dt_data_open(&f, corpus, DT_TOKENIZER_CHAR, NULL));
    dt_loader *l;
    ASSERT_OK(dt_loader_create(&l, f, 0, dt_token_file_count(f), G, 32, 7, 0, 1));
    uint64_t spe = dt_loader_steps_per_epoch(l);
    int reread = 0;
    for (int s = 1; s <= steps; s++) {
        int last = -1, gens = 0, seen_gen = -2;
        for (int i = 0; i < t->n; i++)
            if (t->r[i].step == s && t->r[i].gen > last)
                last = t->r[i].gen;
        if (last < 0)
            TEST_FAILF("step %d: no rank read its batch", s);
        for (int g = 0; g <= last; g++)
            for (int i = 0; i < t->n; i++)
                if (t->r[i].step == s && t->r[i].gen == g && seen_gen != g) {
                    seen_gen = g;
                    gens++;
                }
        reread += gens > 1;
        uint32_t want[G];
        ASSERT_OK(dt_loader_set_state(
            l, (dt_loader_state){(uint64_t)(s - 1) / spe, (uint64_t)(s - 1) % spe}));
        dt_loader_peek(l, want);
        int count[G] = {0}, world = -1, ranks = 0;
        bool rank_seen[8] = {0};
        for (int i = 0; i < t->n; i++) {
            const rec *r = &t->r[i];
            if (r->step != s || r->gen != last)
                continue;
            if (world < 0)
                world = r->world;
            ASSERT_EQ(r->world, world);
            ASSERT_TRUE(r->rank >= 0 && r->rank < 8);
            if (rank_seen[r->rank])
                TEST_FAILF("step %d: rank %d of generation %d read it twice", s, r->rank, last);
            rank_seen[r->rank] = true;
            ranks++;
            ASSERT_EQ(r->n, G / world);
            for (int b = 0; b < r->n; b++) {
                int j = 0;
                while (j < G && want[j] != r->win[b])
                    j++;
                if (j == G)
                    TEST_FAILF("step %d: rank %d read window %u, not one of the step's", s, r->rank,
                               r->win[b]);
                count[j]++;
            }
        }
        ASSERT_EQ(ranks, world);
        for (int j = 0; j < G; j++)
            if (count[j] != 1)
                TEST_FAILF("step %d: window %u was read %d times by generation %d", s, want[j],
                           count[j], last);
    }
    dt_loader_destroy(l);
    dt_token_file_close(f);
    return reread;
}

/* ------------------------------------------------------------------------ */
/* Runs                                                                     */
/* ------------------------------------------------------------------------ */

/* Start `sh -c CMD` (output to LOG) in the background. */
static pid_t start(const char *log, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static pid_t start(const char *log, const char *fmt, ...) {
    char cmd[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    fflush(stdout);
    pid_t pid = fork();
    ASSERT_TRUE(pid >= 0);
    if (pid == 0) {
        FILE *f = freopen(log, "w", stdout);
        (void)f;
        dup2(1, 2);
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    return pid;
}

/* Wait for pid (at most `seconds`); its exit code, printing LOG's tail
 * when it is not `want`. */
static int finish(pid_t pid, const char *log, double seconds, int want) {
    double t0 = dt_now();
    int status = 0;
    while (waitpid(pid, &status, WNOHANG) == 0) {
        if (dt_now() - t0 > seconds) {
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            char cmd[300];
            snprintf(cmd, sizeof cmd, "tail -n 30 '%s' >&2", log);
            (void)system(cmd);
            TEST_FAILF("%s: still running after %.0f s", log, seconds);
        }
        dt_sleep_ms(10);
    }
    int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    if (code != want) {
        char cmd[300];
        snprintf(cmd, sizeof cmd, "tail -n 40 '%s' >&2", log);
        (void)system(cmd);
        TEST_FAILF("%s: exit code %d, expected %d", log, code, want);
    }
    return code;
}

/* The one line of RUN/elastic.jsonl: fields into *out. */
typedef struct event {
    int generation, world, prev_world, joined;
    int64_t step;
    double recovery_s, time;
    char lost[32];
} event;

static void read_event(const char *run, event *ev) {
    char path[256], line[2048];
    snprintf(path, sizeof path, "%s/elastic.jsonl", run);
    FILE *f = fopen(path, "r");
    if (!f)
        TEST_FAILF("%s: no membership change was recorded", path);
    int lines = 0;
    while (fgets(line, sizeof line, f)) {
        if (++lines > 1)
            TEST_FAILF("%.200s: more than one membership change: %.200s", path, line);
        long long step;
        if (sscanf(line,
                   "{\"generation\":%d,\"step\":%lld,\"world\":%d,\"prev_world\":%d,\"lost\":\"%31["
                   "^\"]\",\"joined\":%d",
                   &ev->generation, &step, &ev->world, &ev->prev_world, ev->lost,
                   &ev->joined) != 6) {
            ev->lost[0] = 0;
            if (sscanf(line,
                       "{\"generation\":%d,\"step\":%lld,\"world\":%d,\"prev_world\":%d,\"lost\":"
                       "\"\",\"joined\":%d",
                       &ev->generation, &step, &ev->world, &ev->prev_world, &ev->joined) != 5)
                TEST_FAILF("bad line in %.200s: %.200s", path, line);
        }
        ev->step = step;
        const char *r = strstr(line, "\"recovery_s\":"), *t = strstr(line, "\"time\":");
        ASSERT_TRUE(r && t);
        ev->recovery_s = atof(r + 13);
        ev->time = atof(t + 7);
    }
    fclose(f);
    ASSERT_EQ(lines, 1);
}

/* A run at `world` ranks resumed from RUN's checkpoint of step s0 must
 * give RUN's losses after s0 and its final parameters. */
static void compare_with_resumed(const char *run, int64_t s0, int world) {
    char ref[256], ck[300];
    snprintf(ref, sizeof ref, "%s/ref", tu_dir);
    snprintf(ck, sizeof ck, "%s/ck", ref);
    EXPECT_RC(tu_run("mkdir -p %s && cp %s/ck/ckpt-%06lld.dtck %s/", ck, run, (long long)s0, ck),
              0);
    EXPECT_RC(tu_run("%s train --data %s " TINY " %s --steps %d --nproc %d --resume --ckpt-dir %s "
                     "--run-dir %s",
                     DTRAIN, corpus, extra, STEPS, world, ck, ref),
              0);
    double la[STEPS + 1], lb[STEPS + 1];
    char pa[300], pb[300];
    snprintf(pa, sizeof pa, "%s/metrics.jsonl", run);
    snprintf(pb, sizeof pb, "%s/metrics.jsonl", ref);
    ASSERT_EQ(tu_losses(pa, la, STEPS), STEPS);
    ASSERT_EQ(tu_losses(pb, lb, STEPS), STEPS);
    double worst = 0;
    for (int s = (int)s0 + 1; s <= STEPS; s++) {
        double d = fabs(la[s] - lb[s]) / fabs(lb[s]);
        if (!(d <= 1e-5))
            TEST_FAILF("step %d: loss %.9g elastic, %.9g resumed at %d ranks from step %lld", s,
                       la[s], lb[s], world, (long long)s0);
        worst = fmax(worst, d);
    }
    size_t na, nb;
    snprintf(pa, sizeof pa, "%s/ck", run);
    float *x = tu_params(pa, &na), *y = tu_params(ck, &nb);
    ASSERT_EQ(na, nb);
    double pw = 0;
    for (size_t i = 0; i < na; i++) {
        double d = fabs((double)x[i] - y[i]);
        if (!(d <= 1e-5 * fabs((double)y[i]) + 1e-7))
            TEST_FAILF("param %zu: %.9g elastic, %.9g resumed", i, x[i], y[i]);
        pw = fmax(pw, d);
    }
    free(x);
    free(y);
    printf("  losses after step %lld match a %d-rank run resumed there (worst %.2g rel), "
           "parameters within %.2g\n",
           (long long)s0, world, worst, pw);
}

/* 4 ranks, one lost (killed by the test when `at` > 0, else by
 * DT_FAULT_KILL=fault); every check of the file comment. */
static void shrink(int victim, int at, int jitter_ms, const char *fault, int64_t want_s0) {
    char run[200], traces[200], log[220];
    snprintf(run, sizeof run, "%s/run", tu_dir);
    snprintf(traces, sizeof traces, "%s/traces", tu_dir);
    snprintf(log, sizeof log, "%s/job.log", tu_dir);
    EXPECT_RC(tu_run("mkdir -p %s", traces), 0);
    pid_t job = start(log,
                      "%s%s DT_DATA_TRACE=%s %s train --data %s " TINY " %s --steps %d --nproc 4 "
                      "--elastic 2:4 --run-dir %s --ckpt-dir %s/ck",
                      fault ? "DT_FAULT_KILL=" : "", fault ? fault : "", traces, DTRAIN, corpus,
                      extra, STEPS, run, run);
    trace t = {0};
    int victim_pid = 0;
    double killed_at = 0;
    if (at > 0) {
        double t0 = dt_now();
        for (int step = 0; step < at; dt_sleep_ms(1)) {
            if (dt_now() - t0 > 60)
                TEST_FAILF("rank %d never reached step %d", victim, at);
            trace_load(traces, &t);
            victim_pid = trace_pid(&t, victim, &step);
        }
        dt_sleep_ms(jitter_ms);
        killed_at = realtime();
        ASSERT_EQ(kill(victim_pid, SIGKILL), 0);
    }
    finish(job, log, 90, 0);
    trace_load(traces, &t);
    if (at == 0) {
        int last;
        victim_pid = trace_pid(&t, victim, &last);
    }
    event ev;
    read_event(run, &ev);
    char lost[16];
    snprintf(lost, sizeof lost, "%d", victim);
    ASSERT_EQ(ev.generation, 1);
    ASSERT_EQ(ev.world, 3);
    ASSERT_EQ(ev.prev_world, 4);
    ASSERT_EQ(ev.joined, 0);
    ASSERT_STREQ(ev.lost, lost);
    if (want_s0 >= 0)
        ASSERT_EQ(ev.step, want_s0);
    /* The survivors are the same processes; none was started anew. */
    int pids0[8], n0 = 0, pids1[8], n1 = 0;
    double first1 = 0;
    for (int i = 0; i < t.n; i++) {
        const rec *r = &t.r[i];
        int *p = r->gen == 0 ? pids0 : pids1, *n = r->gen == 0 ? &n0 : &n1;
        ASSERT_TRUE(r->gen <= 1);
        bool have = false;
        for (int j = 0; j < *n; j++)
            have |= p[j] == r->pid;
        if (!have && *n < 8)
            p[(*n)++] = r->pid;
        if (r->gen == 1 && (first1 == 0 || r->time < first1))
            first1 = r->time;
    }
    ASSERT_EQ(n0, 4);
    ASSERT_EQ(n1, 3);
    for (int j = 0; j < n1; j++) {
        bool was = false;
        for (int i = 0; i < n0; i++)
            was |= pids0[i] == pids1[j];
        ASSERT_TRUE(was);
        ASSERT_NE(pids1[j], victim_pid);
    }
    if (killed_at == 0) /* DT_FAULT_KILL: the victim's last trace line */
        for (int i = 0; i < t.n; i++)
            if (t.r[i].pid == victim_pid && t.r[i].time > killed_at)
                killed_at = t.r[i].time;
    double took = first1 - killed_at;
    printf("  rank %d lost, the 3 others continued from step %lld: their first step %.3f s after "
           "the kill, recovery %.3f s\n",
           victim, (long long)ev.step, took, ev.recovery_s);
    ASSERT_TRUE(ev.recovery_s < 5);
    ASSERT_TRUE(took > 0 && took < 5);
    int reread = check_accounting(&t, STEPS);
    ASSERT_TRUE(reread <= 1);
    printf("  accounting: steps 1..%d each read exactly once by their last membership (%d step "
           "read again after the loss)\n",
           STEPS, reread);
    compare_with_resumed(run, ev.step, 3);
    free(t.r);
}

static uint64_t seed_mix(int seed) {
    dt_rng r;
    dt_rng_init(&r, (uint64_t)seed, dt_rng_stream_id(0, 0, DT_RNG_TEST));
    return ((uint64_t)dt_rng_u32(&r) << 32) | dt_rng_u32(&r);
}

static void shrink_seed(int seed) {
    uint64_t x = seed_mix(seed);
    int victim = 1 + (int)(x % 3), at = 3 + (int)((x >> 8) % 20), jitter = (int)((x >> 16) % 6);
    printf("  seed %d: kill rank %d once it starts step %d, + %d ms\n", seed, victim, at, jitter);
    shrink(victim, at, jitter, NULL, -1);
}

static void test_shrink_1(void) { shrink_seed(1); }
static void test_shrink_2(void) { shrink_seed(2); }
static void test_shrink_3(void) { shrink_seed(3); }
static void test_shrink_mid(void) { shrink(2, 0, 0, "2:9:mid", 8); }

static void test_shrink_fp16(void) {
    extra = "--precision fp16";
    shrink(1, 0, 0, "1:6:mid", 5);
}

static void test_kill0(void) {
    uint64_t x = seed_mix(4);
    int at = 3 + (int)(x % 20);
    printf("  kill rank 0 (the store's host) once it starts step %d\n", at);
    shrink(0, at, (int)((x >> 8) % 6), NULL, -1);
}

static void test_kill0_after(void) { shrink(0, 0, 0, "0:7", 7); }

static void test_grow(void) {
    char run[200], traces[200], log[220], jlog[220];
    snprintf(run, sizeof run, "%s/run", tu_dir);
    snprintf(traces, sizeof traces, "%s/traces", tu_dir);
    snprintf(log, sizeof log, "%s/job.log", tu_dir);
    snprintf(jlog, sizeof jlog, "%s/newcomer.log", tu_dir);
    EXPECT_RC(tu_run("mkdir -p %s", traces), 0);
    int port = test_free_port_pair();
    const char *token = "00112233445566778899aabbccddeeff";
    /* Rank 0 a straggler (DT_FAULT_SLOW): steps of ~10 ms or more, so that the job
     * is still running when the newcomer has started. */
    pid_t job = start(log,
                      "DT_FAULT_SLOW=0:10 DT_JOB_TOKEN=%s DT_DATA_TRACE=%s %s launch --master "
                      "127.0.0.1:%d --elastic 2:4 -n 3 -- %s train --data %s " TINY " --steps %d "
                      "--elastic 2:4 --run-dir %s --ckpt-dir %s/ck",
                      token, traces, DTRAIN, port, DTRAIN, corpus, STEPS, run, run);
    trace t = {0};
    double t0 = dt_now();
    for (int step = 0; step < 5; dt_sleep_ms(1)) {
        if (dt_now() - t0 > 60)
            TEST_FAILF("the job never reached step 5");
        trace_load(traces, &t);
        trace_pid(&t, 0, &step);
    }
    pid_t nc = start(jlog,
                     "DT_JOB_TOKEN=%s DT_DATA_TRACE=%s %s train --join 127.0.0.1:%d --data %s " TINY
                     " --steps %d --elastic 2:4 --run-dir %s --ckpt-dir %s/ck",
                     token, traces, DTRAIN, port, corpus, STEPS, run, run);
    finish(job, log, 90, 0);
    finish(nc, jlog, 30, 0);
    event ev;
    read_event(run, &ev);
    ASSERT_EQ(ev.generation, 1);
    ASSERT_EQ(ev.world, 4);
    ASSERT_EQ(ev.prev_world, 3);
    ASSERT_EQ(ev.joined, 1);
    ASSERT_STREQ(ev.lost, "");
    ASSERT_TRUE(ev.step >= 5 && ev.step < STEPS);
    trace_load(traces, &t);
    int newcomer_lines = 0;
    for (int i = 0; i < t.n; i++)
        if (t.r[i].pid == (int)nc || (t.r[i].gen == 1 && t.r[i].rank == 3))
            newcomer_lines++;
    ASSERT_TRUE(newcomer_lines >= STEPS - ev.step);
    printf("  a newcomer was let in after step %lld (%.3f s); it read %d batches\n",
           (long long)ev.step, ev.recovery_s, newcomer_lines);
    ASSERT_TRUE(ev.recovery_s < 5);
    ASSERT_EQ(check_accounting(&t, STEPS), 0);
    compare_with_resumed(run, ev.step, 4);
    free(t.r);
}

static void test_below(void) {
    char run[200], log[220];
    snprintf(run, sizeof run, "%s/run", tu_dir);
    snprintf(log, sizeof log, "%s/job.log", tu_dir);
    double t0 = dt_now();
    pid_t job = start(log,
                      "DT_FAULT_KILL=1:4 %s train --data %s " TINY " --steps %d --nproc 4 "
                      "--elastic 4:4 --run-dir %s --ckpt-dir %s/ck",
                      DTRAIN, corpus, STEPS, run, run);
    int code = 0, status;
    while (waitpid(job, &status, WNOHANG) == 0)
        dt_sleep_ms(10);
    code = WIFEXITED(status) ? WEXITSTATUS(status) : 128;
    ASSERT_NE(code, 0);
    ASSERT_TRUE(dt_now() - t0 < 20);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "cat %s", log);
    tu_run("%s", cmd);
    EXPECT_OUT("below --elastic 4:4");
    EXPECT_OUT("lost: ranks 1");
}

static void test_refuse(void) {
    const char *common = "--model tiny --layers 2 --dim 32 --heads 2 --seq 32 --steps 2 --no-save";
    EXPECT_RC(tu_run("DT_RANK=0 DT_WORLD_SIZE=1 %s train --data %s %s --elastic 2:4 --global-batch "
                     "12 --tp 2",
                     DTRAIN, corpus, common),
              1);
    EXPECT_OUT("--elastic with --tp");
    EXPECT_RC(tu_run("DT_RANK=0 DT_WORLD_SIZE=1 %s train --data %s %s --elastic 2:4 --global-batch "
                     "12 --zero 1",
                     DTRAIN, corpus, common),
              1);
    EXPECT_OUT("--elastic with --zero");
    EXPECT_RC(tu_run("DT_RANK=0 DT_WORLD_SIZE=1 %s train --data %s %s --elastic 2:4 --global-batch "
                     "12 --compress int8",
                     DTRAIN, corpus, common),
              1);
    EXPECT_OUT("--elastic with --compress");
    EXPECT_RC(tu_run("DT_RANK=0 DT_WORLD_SIZE=1 %s train --data %s %s --elastic 2:4 --batch 4",
                     DTRAIN, corpus, common),
              2);
    EXPECT_OUT("give --global-batch G");
    EXPECT_RC(tu_run("DT_RANK=0 DT_WORLD_SIZE=1 %s train --data %s %s --elastic 2:4 --global-batch "
                     "8",
                     DTRAIN, corpus, common),
              2);
    EXPECT_OUT("--global-batch 8 is not divisible by 3 ranks");
    EXPECT_OUT("multiple of 12");
    EXPECT_RC(
        tu_run("%s train --data %s %s --global-batch 8 --join 127.0.0.1:1", DTRAIN, corpus, common),
        2);
    EXPECT_OUT("--join 127.0.0.1:1 needs --elastic");
    EXPECT_RC(
        tu_run("%s train --data %s %s --elastic 3:2 --global-batch 12", DTRAIN, corpus, common), 2);
    EXPECT_OUT("--elastic 3:2");
    EXPECT_RC(
        tu_run("%s train --data %s %s --elastic 0:4 --global-batch 12", DTRAIN, corpus, common), 2);
    EXPECT_OUT("--elastic 0:4: expected MIN:MAX with 1 <= MIN <= MAX");
    EXPECT_RC(tu_run("%s train --data %s %s --elastic 4 --global-batch 12", DTRAIN, corpus, common),
              2);
    EXPECT_OUT("--elastic 4: expected MIN:MAX");
    /* A bad --join is named before anything connects (not as a token or
     * store error). */
    static const char *const bad_join[][2] = {
        {"127.0.0.1", "expected ADDR:PORT"},
        {"127.0.0.1:99999", "expected ADDR:PORT"},
        {":5", "expected ADDR:PORT"},
        {"no-such-host.invalid:5", "is not an IPv4 address or a host name that resolves"},
    };
    for (size_t i = 0; i < sizeof bad_join / sizeof bad_join[0]; i++) {
        EXPECT_RC(tu_run("%s train --data %s %s --elastic 2:4 --global-batch 12 --join %s", DTRAIN,
                         corpus, common, bad_join[i][0]),
                  2);
        char want[160];
        snprintf(want, sizeof want, "--join %s: ", bad_join[i][0]);
        EXPECT_OUT(want);
        EXPECT_OUT(bad_join[i][1]);
    }
    /* The launcher's side. */
    EXPECT_RC(tu_run("%s launch -n 1 --elastic 3:2 -- /bin/true", DTRAIN), 2);
    EXPECT_OUT("--elastic 3:2: expected MIN:MAX");
    EXPECT_RC(tu_run("%s launch -n 1 --elastic 2:4 --join 127.0.0.1:99999 -- /bin/true", DTRAIN),
              2);
    EXPECT_OUT("--join: port \"99999\"");
    EXPECT_RC(tu_run("%s launch -n 1 --join 127.0.0.1:5 -- /bin/true", DTRAIN), 2);
    EXPECT_OUT("needs --elastic MIN:MAX");
}

int main(int argc, char **argv) {
    static const test_case cases[] = {
        {"shrink_1", test_shrink_1},
        {"shrink_2", test_shrink_2},
        {"shrink_3", test_shrink_3},
        {"shrink_mid", test_shrink_mid},
        {"shrink_fp16", test_shrink_fp16},
        {"kill0", test_kill0},
        {"kill0_after", test_kill0_after},
        {"grow", test_grow},
        {"below", test_below},
        {"refuse", test_refuse},
    };
    return tu_main(argc, argv, cases, sizeof cases / sizeof cases[0], corpus, sizeof corpus);
}
