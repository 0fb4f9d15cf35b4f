/*
 * harness.h — run a test as N real processes on loopback.
 *
 * The test program calls harness_main(argc, argv, cases). Without
 * arguments it is the parent: for each case it picks a free port and a
 * random job token, then fork/execs itself N times with DT_RANK,
 * DT_WORLD_SIZE, DT_MASTER_ADDR=127.0.0.1, DT_MASTER_PORT, DT_JOB_TOKEN,
 * DT_JOB_ID and the case's extra variables set, waits (with a deadline,
 * killing every child on expiry) and checks every exit status. A child runs
 * the case's function with its rank; a failed ASSERT exits 1.
 */
#ifndef DTRAIN_TEST_HARNESS_H
#define DTRAIN_TEST_HARNESS_H

#include "dtrain/comm.h"
#include "test.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

typedef struct hcase {
    const char *name;
    int nranks;
    void (*fn)(int rank, int size);
    const char *env[8]; /* "NAME=value" extras, NULL-terminated */
    int killed_rank;    /* rank expected to die by SIGKILL, or -1 */
    double timeout;     /* seconds for the whole case */
} hcase;

static int harness_free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof sa;
    if (fd < 0 || bind(fd, (struct sockaddr *)&sa, sizeof sa) < 0 ||
        getsockname(fd, (struct sockaddr *)&sa, &len) < 0) {
        perror("free port");
        exit(1);
    }
    int port = ntohs(sa.sin_port);
    close(fd);
    return port;
}

static void harness_token(char out[33]) {
    unsigned char b[16];
    int fd = open("/dev/urandom", O_RDONLY);
    if (fd < 0 || read(fd, b, sizeof b) != (ssize_t)sizeof b) {
        perror("urandom");
        exit(1);
    }
    close(fd);
    for (int i = 0; i < 16; i++)
        snprintf(out + 2 * i, 3, "%02x", b[i]);
}

/* Parent: run one case; returns 0 on success. */
static int harness_run(const char *self, const hcase *c) {
    char token[33], port[16], size[16], jobid[64];
    harness_token(token);
    snprintf(port, sizeof port, "%d", harness_free_port());
    snprintf(size, sizeof size, "%d", c->nranks);
    snprintf(jobid, sizeof jobid, "test-%d-%s", (int)getpid(), c->name);
    pid_t pids[64];
    double t0 = dt_now();
    for (int r = 0; r < c->nranks; r++) {
        pid_t pid = fork();
        if (pid < 0) {
            perror("fork");
            return 1;
        }
        if (pid == 0) {
            char rank[16];
            snprintf(rank, sizeof rank, "%d", r);
            setenv("DT_RANK", rank, 1);
            setenv("DT_WORLD_SIZE", size, 1);
            setenv("DT_MASTER_ADDR", "127.0.0.1", 1);
            setenv("DT_MASTER_PORT", port, 1);
            setenv("DT_JOB_TOKEN", token, 1);
            setenv("DT_JOB_ID", jobid, 1);
            if (!getenv("DT_TIMEOUT"))
                setenv("DT_TIMEOUT", "60", 1);
            for (int i = 0; c->env[i]; i++)
                putenv((char *)c->env[i]);
            execl(self, self, "--child", c->name, (char *)NULL);
            perror("exec");
            _exit(127);
        }
        pids[r] = pid;
    }
    int failures = 0, left = c->nranks;
    int status[64] = {0};
    bool done[64] = {0};
    while (left > 0) {
        for (int r = 0; r < c->nranks; r++) {
            if (done[r])
                continue;
            pid_t p = waitpid(pids[r], &status[r], WNOHANG);
            if (p == pids[r]) {
                done[r] = true;
                left--;
            }
        }
        if (left == 0)
            break;
        if (dt_now() - t0 > c->timeout) {
            fprintf(stderr, "case %s: timed out after %.0f s, killing ranks\n", c->name,
                    c->timeout);
            for (int r = 0; r < c->nranks; r++)
                if (!done[r])
                    kill(pids[r], SIGKILL);
            for (int r = 0; r < c->nranks; r++)
                if (!done[r])
                    waitpid(pids[r], &status[r], 0);
            return 1;
        }
        usleep(2000);
    }
    for (int r = 0; r < c->nranks; r++) {
        int st = status[r];
        if (r == c->killed_rank) {
            if (!(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL)) {
                fprintf(stderr, "case %s: rank %d should have been killed\n", c->name, r);
                failures++;
            }
        } else if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
            fprintf(stderr, "case %s: rank %d failed (%s %d)\n", c->name, r,
                    WIFEXITED(st) ? "exit" : "signal",
                    WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
            failures++;
        }
    }
    printf("%s %s (%d ranks, %.2f s)\n", failures ? "FAIL" : "ok", c->name, c->nranks,
           dt_now() - t0);
    fflush(stdout);
    return failures;
}

/* argv: [self] runs every case; [self, name...] runs the named cases;
 * [self, --child, name] is a rank. */
static int harness_main(int argc, char **argv, const hcase *cases, int ncases) {
    if (argc >= 3 && strcmp(argv[1], "--child") == 0) {
        for (int i = 0; i < ncases; i++)
            if (strcmp(cases[i].name, argv[2]) == 0) {
                test__current = cases[i].name;
                /* Started by the parent (DT_RANK) or by mpirun (the
                 * suite also runs as `mpirun -np N prog --child case`). */
                const char *rv = getenv("DT_RANK");
                if (!rv)
                    rv = getenv("OMPI_COMM_WORLD_RANK");
                int rank = rv ? atoi(rv) : 0;
                cases[i].fn(rank, cases[i].nranks);
                fflush(stdout);
                return 0;
            }
        fprintf(stderr, "no case %s\n", argv[2]);
        return 2;
    }
    char self[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0)
        return 2;
    self[n] = 0;
    int failures = 0, ran = 0;
    for (int i = 0; i < ncases; i++) {
        bool want = argc < 2;
        for (int a = 1; a < argc; a++)
            if (strcmp(argv[a], cases[i].name) == 0 ||
                (argv[a][strlen(argv[a]) - 1] == '*' &&
                 strncmp(argv[a], cases[i].name, strlen(argv[a]) - 1) == 0))
                want = true;
        if (!want)
            continue;
        ran++;
        failures += harness_run(self, &cases[i]) != 0;
    }
    if (ran == 0) {
        fprintf(stderr, "no case matched\n");
        return 2;
    }
    test__run_count = ran - failures;
    printf("%d cases, %d failed\n", ran, failures);
    return failures ? 1 : 0;
}

#endif
