/*
 * test_launch.c — end-to-end tests of `dtrain launch` with real processes.
 *
 * `test_launch NAME` runs one test (ctest registers each name as its own
 * test, see tests/launch.cmake). Each test runs the dtrain binary through
 * /bin/sh with its output captured in files, and the ranks are the probe
 * program, which leaves evidence (environment, pids, received signals) in a
 * fresh directory. "Nothing left running" is checked by pid: every rank and
 * every grandchild a rank started must be dead (or a zombie of a dead
 * parent) once the launcher has returned. The driver makes itself a child
 * subreaper so that such orphans are reparented to it and reaped.
 */
#include "test.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static char dir[256];
static char out_text[1 << 20], err_text[1 << 20];

typedef struct result {
    int code;       /* exit code, or 128 + signal */
    double seconds; /* wall time */
} result;

static void make_dir(void) {
    snprintf(dir, sizeof dir, "/tmp/dt-launch-test-XXXXXX");
    ASSERT_TRUE(mkdtemp(dir) != NULL);
}

static void remove_dir(void) {
    DIR *d = opendir(dir);
    if (!d)
        return;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
        char p[512];
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        unlink(p);
    }
    closedir(d);
    rmdir(dir);
}

static void read_file(const char *path, char *buf, size_t len) {
    buf[0] = '\0';
    FILE *f = fopen(path, "r");
    if (!f)
        return;
    size_t n = fread(buf, 1, len - 1, f);
    buf[n] = '\0';
    fclose(f);
}

static bool file_exists(const char *name, int rank) {
    char p[512];
    snprintf(p, sizeof p, "%s/%s.%d", dir, name, rank);
    return access(p, F_OK) == 0;
}

/* Start `sh -c cmd` with stdout/stderr going to files in dir. */
static pid_t start(const char *cmd, const char *tag) {
    pid_t pid = fork();
    ASSERT_TRUE(pid >= 0);
    if (pid == 0) {
        char o[512], e[512];
        snprintf(o, sizeof o, "%s/%s.out", dir, tag);
        snprintf(e, sizeof e, "%s/%s.err", dir, tag);
        int fo = open(o, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        int fe = open(e, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        dup2(fo, 1);
        dup2(fe, 2);
        int nul = open("/dev/null", O_RDONLY);
        dup2(nul, 0);
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(126);
    }
    return pid;
}

static result finish(pid_t pid, double t0, const char *tag, double timeout) {
    result r = {-1, 0};
    int ws;
    for (;;) {
        pid_t w = waitpid(pid, &ws, WNOHANG);
        if (w == pid)
            break;
        if (dt_now() - t0 > timeout) {
            kill(pid, SIGKILL);
            waitpid(pid, &ws, 0);
            TEST_FAILF("command did not finish within %.0f s", timeout);
        }
        dt_sleep_ms(5);
    }
    r.seconds = dt_now() - t0;
    r.code = WIFEXITED(ws) ? WEXITSTATUS(ws) : 128 + WTERMSIG(ws);
    char p[512];
    snprintf(p, sizeof p, "%s/%s.out", dir, tag);
    read_file(p, out_text, sizeof out_text);
    snprintf(p, sizeof p, "%s/%s.err", dir, tag);
    read_file(p, err_text, sizeof err_text);
    fprintf(stderr, "  [%s] exit %d after %.2f s\n%s", tag, r.code, r.seconds, err_text);
    return r;
}

static result run(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static result run(const char *fmt, ...) {
    char cmd[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    fprintf(stderr, "$ %s\n", cmd);
    double t0 = dt_now();
    return finish(start(cmd, "cmd"), t0, "cmd", 60);
}

static void wait_for_files(const char *name, int count, double timeout) {
    double t0 = dt_now();
    for (int r = 0; r < count; r++)
        while (!file_exists(name, r)) {
            if (dt_now() - t0 > timeout)
                TEST_FAILF("%s/%s.%d did not appear within %.0f s", dir, name, r, timeout);
            dt_sleep_ms(10);
        }
}

/* A process is gone when kill() finds nothing or only a zombie is left. */
static bool alive(pid_t pid) {
    if (kill(pid, 0) != 0)
        return false;
    char p[64], stat[512];
    snprintf(p, sizeof p, "/proc/%d/stat", (int)pid);
    read_file(p, stat, sizeof stat);
    const char *rp = strrchr(stat, ')');
    return rp && rp[1] == ' ' && rp[2] != 'Z' && rp[2] != 'X';
}

static void reap_orphans(void) {
    while (waitpid(-1, NULL, WNOHANG) > 0) {
    }
}

/* Every rank and grandchild recorded in pid.<r> must be gone. */
static void assert_all_gone(int count, double within) {
    double t0 = dt_now();
    for (int r = 0; r < count; r++) {
        char p[512], text[128];
        snprintf(p, sizeof p, "%s/pid.%d", dir, r);
        read_file(p, text, sizeof text);
        int a = 0, b = 0;
        ASSERT_EQ(sscanf(text, "%d %d", &a, &b), 2);
        pid_t pids[2] = {a, b};
        for (int k = 0; k < 2; k++) {
            while (alive(pids[k])) {
                reap_orphans();
                if (dt_now() - t0 > within)
                    TEST_FAILF("%s %d of rank %d is still running %.1f s after the launcher "
                               "returned",
                               k ? "grandchild" : "rank", (int)pids[k], r, within);
                dt_sleep_ms(10);
            }
        }
    }
    reap_orphans();
}

static const char *env_value(const char *text, const char *name, char *out, size_t len) {
    char key[64];
    snprintf(key, sizeof key, "\n%s=", name);
    char buf[4096];
    snprintf(buf, sizeof buf, "\n%s", text);
    const char *p = strstr(buf, key);
    if (!p)
        TEST_FAILF("%s missing in:\n%s", name, text);
    p += strlen(key);
    size_t n = strcspn(p, "\n");
    snprintf(out, len, "%.*s", (int)n, p);
    return out;
}

/* ------------------------------------------------------------------------ */

/* The DT_* environment of every rank; stale inherited values are replaced,
 * DT_NPROC is not passed on, stdin of ranks > 0 is /dev/null. */
static void test_env(void) {
    result r = run("DT_RANK=77 DT_JOB_TOKEN= DT_NPROC=3 %s launch %s env %s", DT_CLI, PROBE, dir);
    ASSERT_EQ(r.code, 0);
    char token0[64] = "", job0[64] = "", port0[16] = "";
    for (int rank = 0; rank < 3; rank++) {
        char p[512], text[4096], v[128];
        snprintf(p, sizeof p, "%s/env.%d", dir, rank);
        read_file(p, text, sizeof text);
        ASSERT_EQ(atoi(env_value(text, "DT_RANK", v, sizeof v)), rank);
        ASSERT_EQ(atoi(env_value(text, "DT_LOCAL_RANK", v, sizeof v)), rank);
        ASSERT_EQ(atoi(env_value(text, "DT_WORLD_SIZE", v, sizeof v)), 3);
        ASSERT_EQ(atoi(env_value(text, "DT_LOCAL_WORLD_SIZE", v, sizeof v)), 3);
        ASSERT_EQ(atoi(env_value(text, "DT_NODE_RANK", v, sizeof v)), 0);
        ASSERT_EQ(atoi(env_value(text, "DT_NNODES", v, sizeof v)), 1);
        ASSERT_EQ(atoi(env_value(text, "DT_RESTART_COUNT", v, sizeof v)), 0);
        ASSERT_STREQ(env_value(text, "DT_MASTER_ADDR", v, sizeof v), "127.0.0.1");
        ASSERT_STREQ(env_value(text, "DT_NPROC", v, sizeof v), "(unset)");
        env_value(text, "DT_MASTER_PORT", v, sizeof v);
        int port = atoi(v);
        ASSERT_TRUE(port > 0 && port < 65536);
        if (rank == 0)
            snprintf(port0, sizeof port0, "%s", v);
        ASSERT_STREQ(v, port0);
        env_value(text, "DT_JOB_TOKEN", v, sizeof v);
        ASSERT_EQ(strlen(v), 32);
        ASSERT_EQ(strspn(v, "0123456789abcdef"), 32);
        if (rank == 0)
            snprintf(token0, sizeof token0, "%s", v);
        ASSERT_STREQ(v, token0);
        env_value(text, "DT_JOB_ID", v, sizeof v);
        ASSERT_TRUE(strlen(v) > 0);
        if (rank == 0)
            snprintf(job0, sizeof job0, "%s", v);
        ASSERT_STREQ(v, job0);
        if (rank > 0)
            ASSERT_STREQ(env_value(text, "STDIN_READ", v, sizeof v), "0");
    }
    /* A second job gets a different token. */
    r = run("%s launch -n 1 %s env %s", DT_CLI, PROBE, dir);
    ASSERT_EQ(r.code, 0);
    char p[512], text[4096], v[128];
    snprintf(p, sizeof p, "%s/env.0", dir);
    read_file(p, text, sizeof text);
    ASSERT_TRUE(strcmp(env_value(text, "DT_JOB_TOKEN", v, sizeof v), token0) != 0);
}

/* Every line whole (the probe writes each in two pieces with a pause
 * between), in order, none lost, prefixed with "[rank] " when tagging; the
 * unterminated last line of each rank on a line of its own. */
static void check_lines(bool tagged) {
    const int n = 4, lines = 60;
    result r = run("%s launch -n %d %s %s lines %s %d", DT_CLI, n, tagged ? "--tag-output" : "",
                   PROBE, dir, lines);
    ASSERT_EQ(r.code, 0);
    int seen[4] = {0}, last[4] = {0};
    for (char *line = strtok(out_text, "\n"); line; line = strtok(NULL, "\n")) {
        int rank = -1, rank2, i, i2, used = 0;
        char *body = line;
        if (tagged) {
            if (sscanf(line, "[%d] %n", &rank, &used) != 1 || used == 0)
                TEST_FAILF("untagged line: \"%s\"", line);
            body = line + used;
        }
        if (sscanf(body, "unterminated last line of %d%n", &rank2, &used) == 1 &&
            body[used] == '\0') {
            ASSERT_TRUE(rank2 >= 0 && rank2 < n);
            ASSERT_TRUE(!tagged || rank == rank2);
            last[rank2]++;
            continue;
        }
        if (sscanf(body, "rank %d line %d first-half second-half %d%n", &rank2, &i, &i2, &used) !=
                3 ||
            body[used] != '\0' || rank2 < 0 || rank2 >= n)
            TEST_FAILF("torn or mixed line: \"%s\"", line);
        ASSERT_TRUE(!tagged || rank == rank2);
        ASSERT_EQ(i, i2);
        ASSERT_EQ(i, seen[rank2]); /* in order, none lost */
        seen[rank2]++;
    }
    for (int k = 0; k < n; k++) {
        ASSERT_EQ(seen[k], lines);
        ASSERT_EQ(last[k], 1);
    }
    int errs = 0;
    for (char *line = strtok(err_text, "\n"); line; line = strtok(NULL, "\n")) {
        int rank = -1, rank2, i, used = 0;
        char *body = line;
        if (tagged && sscanf(line, "[%d] %n", &rank, &used) == 1 && used > 0)
            body = line + used;
        if (sscanf(body, "e:rank %d err %d", &rank2, &i) == 2) {
            ASSERT_TRUE(!tagged || rank == rank2);
            errs++;
        }
    }
    ASSERT_EQ(errs, n * lines / 10);
}

static void test_tag_output(void) { check_lines(true); }

/* Without --tag-output too: ranks' stdout used to be the launcher's own,
 * so their writes interleaved mid-line (4 ranks x 20 000 lines: 24 mixed)
 * and an unterminated last line was glued to another rank's line. */
static void test_untagged_output(void) { check_lines(false); }

/* A failing rank: exit code and summary, the others stopped at once. */
static void test_fail(void) {
    result r = run("%s launch -n 4 --grace 20 %s fail %s 2 7", DT_CLI, PROBE, dir);
    ASSERT_EQ(r.code, 7);
    ASSERT_CONTAINS(err_text, "rank 2 (node 0, local rank 2, pid");
    ASSERT_CONTAINS(err_text, "exited with code 7");
    /* The ring keeps the last 8 stderr lines: 5..12. */
    ASSERT_CONTAINS(err_text, "    [2] diagnostic line 12 of rank 2");
    ASSERT_CONTAINS(err_text, "    [2] diagnostic line 5 of rank 2");
    ASSERT_TRUE(strstr(err_text, "    [2] diagnostic line 4 of rank 2") == NULL);
    ASSERT_TRUE(r.seconds < 5); /* SIGTERM worked; the 20 s grace was not needed */
    assert_all_gone(4, 2);
}

static void test_fail_signal(void) {
    result r = run("%s launch -n 3 %s fail %s 0 segv", DT_CLI, PROBE, dir);
    ASSERT_EQ(r.code, 128 + SIGSEGV);
    ASSERT_CONTAINS(err_text, "rank 0 (node 0");
    ASSERT_CONTAINS(err_text, "was killed by signal 11");
    assert_all_gone(3, 2);
}

/* Ranks that ignore SIGTERM get SIGKILL after the grace period. */
static void test_fail_grace(void) {
    result r = run("%s launch -n 3 --grace 1 %s fail %s 1 5 ignore-term", DT_CLI, PROBE, dir);
    ASSERT_EQ(r.code, 5);
    ASSERT_CONTAINS(err_text, "rank 1 (node 0");
    ASSERT_TRUE(r.seconds >= 1.0);
    ASSERT_TRUE(r.seconds < 5.0);
    assert_all_gone(3, 2);
}

/* SIGINT/SIGTERM to the launcher reach every rank; exit 128 + signal. */
static void test_signal(int sig) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "exec %s launch -n 3 %s hang %s", DT_CLI, PROBE, dir);
    double t0 = dt_now();
    pid_t pid = start(cmd, "sig");
    wait_for_files("pid", 3, 20);
    ASSERT_EQ(kill(pid, sig), 0);
    result r = finish(pid, t0, "sig", 20);
    ASSERT_EQ(r.code, 128 + sig);
    ASSERT_CONTAINS(err_text, "interrupted by signal");
    for (int rank = 0; rank < 3; rank++) {
        char p[512], text[64];
        snprintf(p, sizeof p, "%s/sig.%d", dir, rank);
        read_file(p, text, sizeof text);
        ASSERT_EQ(atoi(text), sig);
    }
    assert_all_gone(3, 2);
}
static void test_sigint(void) { test_signal(SIGINT); }
static void test_sigterm(void) { test_signal(SIGTERM); }

/* --max-restarts: the whole job runs again with DT_RESTART_COUNT. */
static void test_restart(void) {
    result r = run("%s launch -n 3 --max-restarts 2 %s restart %s 2", DT_CLI, PROBE, dir);
    ASSERT_EQ(r.code, 0);
    ASSERT_CONTAINS(err_text, "restarting the job (restart 1 of 2)");
    ASSERT_CONTAINS(err_text, "restarting the job (restart 2 of 2)");
    /* Rank 1 ran every attempt; the last attempt ran to the end on every
     * rank (earlier ones may have been stopped before a rank wrote). */
    ASSERT_TRUE(file_exists("restart0", 1));
    ASSERT_TRUE(file_exists("restart1", 1));
    for (int rank = 0; rank < 3; rank++)
        if (!file_exists("restart2", rank))
            TEST_FAILF("rank %d did not run in attempt 2", rank);
    /* Not enough restarts: the last failure is reported. */
    r = run("%s launch -n 2 --max-restarts 1 %s restart %s 5", DT_CLI, PROBE, dir);
    ASSERT_EQ(r.code, 3);
    ASSERT_CONTAINS(err_text, "rank 1 fails in attempt 1");
}

/* A rank's leftover child is killed even when the job succeeds. */
static void test_no_orphans(void) {
    result r = run("%s launch -n 2 %s orphan %s", DT_CLI, PROBE, dir);
    ASSERT_EQ(r.code, 0);
    assert_all_gone(2, 2);
}

/* A launcher killed by SIGKILL still takes its ranks with it. */
static void test_launcher_killed(void) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "exec %s launch -n 3 %s hang %s", DT_CLI, PROBE, dir);
    double t0 = dt_now();
    pid_t pid = start(cmd, "kill");
    wait_for_files("pid", 3, 20);
    kill(pid, SIGKILL);
    finish(pid, t0, "kill", 10);
    /* PR_SET_PDEATHSIG reaches the ranks; their own children are outside
     * its reach (see docs/launch.md), so only ranks are checked. */
    for (int rank = 0; rank < 3; rank++) {
        char p[512], text[128];
        snprintf(p, sizeof p, "%s/pid.%d", dir, rank);
        read_file(p, text, sizeof text);
        int a = 0, b = 0;
        ASSERT_EQ(sscanf(text, "%d %d", &a, &b), 2);
        double t1 = dt_now();
        while (alive(a)) {
            reap_orphans();
            if (dt_now() - t1 > 2)
                TEST_FAILF("rank %d (pid %d) survived its launcher", rank, a);
            dt_sleep_ms(10);
        }
        kill(b, SIGKILL); /* the grandchild: clean up after ourselves */
    }
    reap_orphans();
}

static void test_bad_input(void) {
    result r = run("%s launch -n 0 %s env %s", DT_CLI, PROBE, dir);
    ASSERT_EQ(r.code, 2);
    ASSERT_CONTAINS(err_text, "--nproc: 0 is out of range");
    r = run("%s launch -n 2 dt-no-such-program-xyz", DT_CLI);
    ASSERT_EQ(r.code, 1);
    ASSERT_CONTAINS(err_text, "program \"dt-no-such-program-xyz\" not found in PATH");
    r = run("%s launch -n 2 %s/nothing-here", DT_CLI, dir);
    ASSERT_EQ(r.code, 1);
    ASSERT_CONTAINS(err_text, "nothing-here\": No such file or directory");
    r = run("%s launch -n 2 %s", DT_CLI, dir);
    ASSERT_EQ(r.code, 1);
    ASSERT_CONTAINS(err_text, "not an executable regular file");
    /* Passes the lookup, fails in execve(): reported through the pipe. */
    r = run("printf 'not a program' > %s/junk && chmod +x %s/junk && %s launch -n 3 %s/junk", dir,
            dir, DT_CLI, dir);
    ASSERT_EQ(r.code, 1);
    ASSERT_CONTAINS(err_text, "cannot execute");
    ASSERT_CONTAINS(err_text, "Exec format error");
    r = run("%s launch -n 2", DT_CLI);
    ASSERT_EQ(r.code, 2);
    ASSERT_CONTAINS(err_text, "which program?");
    r = run("%s launch -n 2 --nnodes 2 --node-rank 2 --master 127.0.0.1:5000 true", DT_CLI);
    ASSERT_EQ(r.code, 2);
    ASSERT_CONTAINS(err_text, "--node-rank 2 is not below --nnodes 2");
    r = run("%s launch -n 2 --nnodes 2 true", DT_CLI);
    ASSERT_EQ(r.code, 2);
    ASSERT_CONTAINS(err_text, "--master ADDR:PORT is required");
    r = run("%s launch -n 2 --master 127.0.0.1:99999 true", DT_CLI);
    ASSERT_EQ(r.code, 2);
    ASSERT_CONTAINS(err_text, "port \"99999\"");
    /* An address that cannot be resolved: refused before any rank starts
     * (every rank used to fail with exit 1). */
    r = run("%s launch -n 2 --master abc %s env %s", DT_CLI, PROBE, dir);
    ASSERT_EQ(r.code, 2);
    ASSERT_CONTAINS(err_text, "--master: \"abc\" is not an IPv4 address or a host name");
    ASSERT_TRUE(!file_exists("env", 0));
    r = run("%s launch -n 2 --master 256.1.1.1:80 %s env %s", DT_CLI, PROBE, dir);
    ASSERT_EQ(r.code, 2);
    ASSERT_CONTAINS(err_text, "\"256.1.1.1\"");
    r = run("DT_JOB_TOKEN=xyz %s launch -n 2 true", DT_CLI);
    ASSERT_EQ(r.code, 2);
    ASSERT_CONTAINS(err_text, "DT_JOB_TOKEN: \"xyz\" is not 32 hexadecimal");
}

/* A master port that is taken is reported before any rank starts. */
static void test_port_in_use(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(bind(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    ASSERT_EQ(listen(fd, 1), 0);
    socklen_t len = sizeof sa;
    getsockname(fd, (struct sockaddr *)&sa, &len);
    int port = ntohs(sa.sin_port);
    result r = run("%s launch -n 2 --master 127.0.0.1:%d %s env %s", DT_CLI, port, PROBE, dir);
    close(fd);
    ASSERT_EQ(r.code, 1);
    char want[128];
    snprintf(want, sizeof want, "master port %d is not free on this machine", port);
    ASSERT_CONTAINS(err_text, want);
    ASSERT_TRUE(!file_exists("env", 0));
}

static void test_unreachable_master(void) {
    int port = test_free_port_pair();
    result r = run("DT_TIMEOUT=1 %s launch -n 2 --nnodes 2 --node-rank 1 --master 127.0.0.1:%d "
                   "%s env %s",
                   DT_CLI, port, PROBE, dir);
    ASSERT_EQ(r.code, 1);
    ASSERT_CONTAINS(err_text, "cannot reach the master 127.0.0.1:");
    ASSERT_TRUE(r.seconds < 5);
    ASSERT_TRUE(!file_exists("env", 2));
    /* Node 0 alone waits for the others, bounded by DT_TIMEOUT too. */
    r = run("DT_TIMEOUT=1 %s launch -n 2 --nnodes 3 --node-rank 0 --master 127.0.0.1:%d %s env %s",
            DT_CLI, port, PROBE, dir);
    ASSERT_EQ(r.code, 1);
    ASSERT_CONTAINS(err_text, "only 1 of 3 nodes joined");
    ASSERT_CONTAINS(err_text, "missing node ranks: 1,2");
    ASSERT_TRUE(!file_exists("env", 0));
}

/* Two nodes by hand on loopback: run both launchers, return both results. */
static void run_two_nodes(const char *node0_extra, const char *node1_extra, const char *args,
                          result *r0, char *err0, result *r1, char *err1) {
    int port = test_free_port_pair();
    char c0[2048], c1[2048];
    snprintf(c0, sizeof c0, "exec %s launch --nnodes 2 --node-rank 0 --master 127.0.0.1:%d %s %s",
             DT_CLI, port, node0_extra, args);
    snprintf(c1, sizeof c1, "exec %s launch --nnodes 2 --node-rank 1 --master 127.0.0.1:%d %s %s",
             DT_CLI, port, node1_extra, args);
    fprintf(stderr, "$ %s\n$ %s\n", c1, c0);
    double t0 = dt_now();
    pid_t p1 = start(c1, "node1"); /* the joining node first: it must wait */
    dt_sleep_ms(100);
    pid_t p0 = start(c0, "node0");
    *r1 = finish(p1, t0, "node1", 30);
    snprintf(err1, 8192, "%s", err_text);
    *r0 = finish(p0, t0, "node0", 30);
    snprintf(err0, 8192, "%s", err_text);
}

static void test_two_nodes(void) {
    char args[1024], e0[8192], e1[8192];
    result r0, r1;
    snprintf(args, sizeof args, "%s env %s", PROBE, dir);
    run_two_nodes("-n 2", "-n 2", args, &r0, e0, &r1, e1);
    ASSERT_EQ(r0.code, 0);
    ASSERT_EQ(r1.code, 0);
    char token0[64] = "", job0[64] = "", port0[16] = "";
    for (int rank = 0; rank < 4; rank++) {
        char p[512], text[4096], v[128];
        snprintf(p, sizeof p, "%s/env.%d", dir, rank);
        read_file(p, text, sizeof text);
        ASSERT_EQ(atoi(env_value(text, "DT_RANK", v, sizeof v)), rank);
        ASSERT_EQ(atoi(env_value(text, "DT_LOCAL_RANK", v, sizeof v)), rank % 2);
        ASSERT_EQ(atoi(env_value(text, "DT_NODE_RANK", v, sizeof v)), rank / 2);
        ASSERT_EQ(atoi(env_value(text, "DT_WORLD_SIZE", v, sizeof v)), 4);
        ASSERT_EQ(atoi(env_value(text, "DT_NNODES", v, sizeof v)), 2);
        if (rank == 0) {
            snprintf(token0, sizeof token0, "%s", env_value(text, "DT_JOB_TOKEN", v, sizeof v));
            snprintf(job0, sizeof job0, "%s", env_value(text, "DT_JOB_ID", v, sizeof v));
            snprintf(port0, sizeof port0, "%s", env_value(text, "DT_MASTER_PORT", v, sizeof v));
        }
        ASSERT_STREQ(env_value(text, "DT_JOB_TOKEN", v, sizeof v), token0);
        ASSERT_STREQ(env_value(text, "DT_JOB_ID", v, sizeof v), job0);
        ASSERT_STREQ(env_value(text, "DT_MASTER_PORT", v, sizeof v), port0);
    }
}

static void test_two_nodes_mismatch(void) {
    char args[1024], e0[8192], e1[8192];
    result r0, r1;
    snprintf(args, sizeof args, "%s env %s", PROBE, dir);
    run_two_nodes("-n 2", "-n 3", args, &r0, e0, &r1, e1);
    ASSERT_NE(r0.code, 0);
    ASSERT_NE(r1.code, 0);
    ASSERT_CONTAINS(e0, "node 1 was started with --nnodes 2 -n 3 (world size 6) but node 0 with "
                        "--nnodes 2 -n 2 (world size 4)");
    ASSERT_CONTAINS(e1, "node 0 refused the job: node 1 was started with");
    for (int rank = 0; rank < 6; rank++)
        ASSERT_TRUE(!file_exists("env", rank));
}

/* A node cannot find the program: both launchers say so at once and no
 * rank starts anywhere. */
static void test_two_nodes_missing(void) {
    char n0[1024], e0[8192], e1[8192];
    result r0, r1;
    snprintf(n0, sizeof n0, "-n 2 %s env %s", PROBE, dir);
    run_two_nodes(n0, "-n 2 /nonexistent/dt-prog", "", &r0, e0, &r1, e1);
    ASSERT_EQ(r0.code, 1);
    ASSERT_EQ(r1.code, 1);
    ASSERT_CONTAINS(e0, "node 1 cannot run the job: cannot execute \"/nonexistent/dt-prog\"");
    ASSERT_CONTAINS(e1, "node 0 refused the job: node 1 cannot run the job");
    ASSERT_TRUE(r0.seconds < 10);
    for (int rank = 0; rank < 4; rank++)
        ASSERT_TRUE(!file_exists("env", rank));
    /* Node 0 cannot: it tells node 1 when it connects. */
    char n1[1024];
    snprintf(n1, sizeof n1, "-n 2 %s env %s", PROBE, dir);
    run_two_nodes("-n 2 /nonexistent/dt-prog", n1, "", &r0, e0, &r1, e1);
    ASSERT_EQ(r0.code, 1);
    ASSERT_EQ(r1.code, 1);
    ASSERT_CONTAINS(e0, "(1 of 1 other nodes were told)");
    ASSERT_CONTAINS(e1, "node 0 refused the job: node 0 cannot run the job: cannot execute");
    ASSERT_TRUE(r1.seconds < 10);
    for (int rank = 0; rank < 4; rank++)
        ASSERT_TRUE(!file_exists("env", rank));
}

/* A rank failing on node 1 ends the job on node 0 too, quickly. */
static void test_two_nodes_fail(void) {
    char args[1024], e0[8192], e1[8192];
    result r0, r1;
    snprintf(args, sizeof args, "%s fail %s 3 9", PROBE, dir);
    run_two_nodes("-n 2", "-n 2", args, &r0, e0, &r1, e1);
    ASSERT_EQ(r0.code, 9);
    ASSERT_EQ(r1.code, 9);
    ASSERT_CONTAINS(e0, "rank 3 (node 1, local rank 1, pid");
    ASSERT_CONTAINS(e0, "[3] diagnostic line 12 of rank 3");
    ASSERT_CONTAINS(e1, "rank 3 (node 1, local rank 1, pid");
    ASSERT_TRUE(r0.seconds < 8);
    assert_all_gone(4, 2);
}

/* Restarts are coordinated: both nodes run every attempt. */
static void test_two_nodes_restart(void) {
    char args[1024], e0[8192], e1[8192];
    result r0, r1;
    snprintf(args, sizeof args, "--max-restarts 1 %s restart %s 1", PROBE, dir);
    run_two_nodes("-n 2", "-n 2", args, &r0, e0, &r1, e1);
    ASSERT_EQ(r0.code, 0);
    ASSERT_EQ(r1.code, 0);
    ASSERT_TRUE(file_exists("restart0", 1));
    for (int rank = 0; rank < 4; rank++)
        ASSERT_TRUE(file_exists("restart1", rank));
    ASSERT_CONTAINS(e1, "node 1: restarting the job (restart 1 of 1)");
}

/* Node 0's ranks finish long before node 1's (longer than DT_TIMEOUT):
 * node 0 waits for them, however long the job runs. */
static void test_two_nodes_slow(void) {
    char args[1024], e0[8192], e1[8192];
    result r0, r1;
    snprintf(args, sizeof args, "%s slow %s 2 2500", PROBE, dir);
    setenv("DT_TIMEOUT", "1", 1);
    run_two_nodes("-n 2", "-n 2", args, &r0, e0, &r1, e1);
    unsetenv("DT_TIMEOUT");
    ASSERT_EQ(r0.code, 0);
    ASSERT_EQ(r1.code, 0);
    ASSERT_TRUE(r0.seconds >= 2.4);
    assert_all_gone(4, 2);
}

/* ^C on node 0 stops the job on both nodes. */
static void test_two_nodes_sigint(void) {
    int port = test_free_port_pair();
    char c0[2048], c1[2048];
    snprintf(c0, sizeof c0,
             "exec %s launch --nnodes 2 --node-rank 0 --master 127.0.0.1:%d -n 2 %s hang %s",
             DT_CLI, port, PROBE, dir);
    snprintf(c1, sizeof c1,
             "exec %s launch --nnodes 2 --node-rank 1 --master 127.0.0.1:%d -n 2 %s hang %s",
             DT_CLI, port, PROBE, dir);
    double t0 = dt_now();
    pid_t p1 = start(c1, "node1");
    pid_t p0 = start(c0, "node0");
    wait_for_files("pid", 4, 20);
    kill(p0, SIGINT);
    result r0 = finish(p0, t0, "node0", 20);
    ASSERT_EQ(r0.code, 130);
    result r1 = finish(p1, t0, "node1", 20);
    ASSERT_EQ(r1.code, 130);
    ASSERT_CONTAINS(err_text, "interrupted by signal 2");
    for (int rank = 0; rank < 4; rank++) {
        char p[512], text[64];
        snprintf(p, sizeof p, "%s/sig.%d", dir, rank);
        read_file(p, text, sizeof text);
        ASSERT_EQ(atoi(text), rank < 2 ? SIGINT : SIGTERM); /* node 1's were stopped */
    }
    assert_all_gone(4, 2);
}

/* The comm layer under dtrain launch: one node (shm) and two nodes on
 * loopback (shm inside a node, TCP across, hierarchical allreduce). */
static void test_comm_one_node(void) {
    result r = run("%s launch -n 4 --tag-output %s --expect-transport shm", DT_CLI, COLL);
    ASSERT_EQ(r.code, 0);
    for (int rank = 0; rank < 4; rank++) {
        char want[64];
        snprintf(want, sizeof want, "[%d] coll_check: rank %d of 4: ", rank, rank);
        ASSERT_CONTAINS(out_text, want);
    }
}

static void test_comm_two_nodes(void) {
    char args[1024], e0[8192], e1[8192];
    result r0, r1;
    snprintf(args, sizeof args, "%s --expect-transport shm+tcp --expect-hier", COLL);
    run_two_nodes("-n 2", "-n 2", args, &r0, e0, &r1, e1);
    ASSERT_EQ(r0.code, 0);
    ASSERT_EQ(r1.code, 0);
}

/* A distributed subcommand starting itself through the launcher. */
static void test_bench_np(void) {
    result r = run("%s bench comm --np 3 --sizes 1K:16K --iters 2 --warmup 1", DT_CLI);
    ASSERT_EQ(r.code, 0);
    ASSERT_CONTAINS(out_text, "allreduce f32 sum, 3 ranks, transport shm");
    int rows = 0;
    for (char *line = strtok(out_text, "\n"); line; line = strtok(NULL, "\n")) {
        if (line[0] == '#')
            continue;
        size_t len = strlen(line);
        ASSERT_TRUE(len > 2 && strcmp(line + len - 2, " 0") == 0); /* #wrong */
        rows++;
    }
    ASSERT_EQ(rows, 5);
    /* More than the machine holds: refused before any rank allocates (the
     * ranks used to start, and with a size just below what overcommit
     * grants, one was killed by the OOM killer). */
    r = run("%s bench comm --np 2 --sizes 1T", DT_CLI);
    ASSERT_EQ(r.code, 2);
    ASSERT_CONTAINS(err_text, "--sizes: the largest size, 1.00 TiB, needs about");
    ASSERT_CONTAINS(err_text, "is available");
    ASSERT_TRUE(strstr(err_text, "rank 0") == NULL);
}

/* A program relaunching itself through dt_launch_self (like `dtrain train
 * --nproc N`). */
static void test_self(void) {
    result r = run("DT_NPROC=9 %s --nproc 3 --foo bar -- --nproc 5", SELFEXEC);
    ASSERT_EQ(r.code, 0);
    for (int rank = 0; rank < 3; rank++) {
        char want[256];
        snprintf(want, sizeof want,
                 "[%d] rank %d of 3 args: --foo bar -- --nproc 5 nproc-env=unset\n", rank, rank);
        ASSERT_CONTAINS(out_text, want);
    }
    r = run("%s --nproc=2 x", SELFEXEC);
    ASSERT_EQ(r.code, 0);
    ASSERT_CONTAINS(out_text, "[1] rank 1 of 2 args: x nproc-env=unset\n");
}

typedef struct named_test {
    const char *name;
    void (*fn)(void);
} named_test;

static const named_test tests[] = {
    {"env", test_env},
    {"tag_output", test_tag_output},
    {"untagged_output", test_untagged_output},
    {"fail", test_fail},
    {"fail_signal", test_fail_signal},
    {"fail_grace", test_fail_grace},
    {"sigint", test_sigint},
    {"sigterm", test_sigterm},
    {"restart", test_restart},
    {"no_orphans", test_no_orphans},
    {"launcher_killed", test_launcher_killed},
    {"bad_input", test_bad_input},
    {"port_in_use", test_port_in_use},
    {"unreachable_master", test_unreachable_master},
    {"two_nodes", test_two_nodes},
    {"two_nodes_mismatch", test_two_nodes_mismatch},
    {"two_nodes_fail", test_two_nodes_fail},
    {"two_nodes_missing", test_two_nodes_missing},
    {"two_nodes_restart", test_two_nodes_restart},
    {"two_nodes_slow", test_two_nodes_slow},
    {"two_nodes_sigint", test_two_nodes_sigint},
    {"self", test_self},
    {"comm_one_node", test_comm_one_node},
    {"comm_two_nodes", test_comm_two_nodes},
    {"bench_np", test_bench_np},
};

int main(int argc, char **argv) {
    prctl(PR_SET_CHILD_SUBREAPER, 1);
    for (size_t i = 0; i < sizeof tests / sizeof tests[0]; i++) {
        if (argc > 1 && strcmp(argv[1], tests[i].name) != 0)
            continue;
        make_dir();
        test__current = tests[i].name;
        fprintf(stderr, "== %s (%s)\n", tests[i].name, dir);
        tests[i].fn();
        test__run_count++;
        remove_dir();
    }
    if (test__run_count == 0) {
        fprintf(stderr, "unknown test %s\n", argc > 1 ? argv[1] : "");
        return 2;
    }
    fprintf(stderr, "%d test(s) passed\n", test__run_count);
    return 0;
}
