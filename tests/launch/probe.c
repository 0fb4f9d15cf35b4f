/*
 * probe.c — a rank for the launcher tests. `probe MODE DIR [ARGS]` does one
 * thing a real rank might do (print, fail, hang, ignore SIGTERM, spawn a
 * child) and leaves evidence in DIR for test_launch.c to check: its
 * environment (env.<rank>), its pid and its child's pid (pid.<rank>).
 */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

static const char *dir;
static int rank;

static void write_file(const char *name, const char *text) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s.%d", dir, name, rank);
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f) {
        perror(tmp);
        exit(99);
    }
    fputs(text, f);
    fclose(f);
    rename(tmp, path); /* the test never sees a half-written file */
}

static const char *env(const char *name) {
    const char *v = getenv(name);
    return v ? v : "(unset)";
}

/* Record our pid and a grandchild's pid that sleeps: both must be gone
 * once the launcher has returned. */
static void record_pids(void) {
    pid_t child = fork();
    if (child == 0) {
        execlp("sleep", "sleep", "60", (char *)NULL);
        _exit(1);
    }
    char text[64];
    snprintf(text, sizeof text, "%d %d\n", (int)getpid(), (int)child);
    write_file("pid", text);
}

static volatile sig_atomic_t got_signal;
static void on_signal(int sig) { got_signal = sig; }

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: probe MODE DIR [ARGS]\n");
        return 2;
    }
    const char *mode = argv[1];
    dir = argv[2];
    rank = atoi(env("DT_RANK"));
    if (strcmp(mode, "env") == 0) {
        static const char *const vars[] = {"DT_RANK",
                                           "DT_WORLD_SIZE",
                                           "DT_LOCAL_RANK",
                                           "DT_LOCAL_WORLD_SIZE",
                                           "DT_NODE_RANK",
                                           "DT_NNODES",
                                           "DT_MASTER_ADDR",
                                           "DT_MASTER_PORT",
                                           "DT_JOB_ID",
                                           "DT_JOB_TOKEN",
                                           "DT_RESTART_COUNT",
                                           "DT_NPROC",
                                           NULL};
        char text[2048];
        size_t off = 0;
        for (int i = 0; vars[i]; i++)
            off +=
                (size_t)snprintf(text + off, sizeof text - off, "%s=%s\n", vars[i], env(vars[i]));
        /* stdin: ranks > 0 must read EOF at once (/dev/null). */
        char c;
        ssize_t n = rank > 0 ? read(0, &c, 1) : -2;
        snprintf(text + off, sizeof text - off, "STDIN_READ=%zd\n", n);
        write_file("env", text);
        return 0;
    }
    if (strcmp(mode, "lines") == 0) {
        /* Lines written in pieces with pauses between: the launcher must
         * still relay each as one unbroken line. */
        int count = argc > 3 ? atoi(argv[3]) : 50;
        for (int i = 0; i < count; i++) {
            char a[64], b[64];
            snprintf(a, sizeof a, "rank %d line %d first-half", rank, i);
            snprintf(b, sizeof b, " second-half %d\n", i);
            if (write(1, a, strlen(a)) < 0 || (usleep(200), write(1, b, strlen(b))) < 0)
                return 3;
            if (i % 10 == 0 && write(2, "e:", 2) == 2)
                fprintf(stderr, "rank %d err %d\n", rank, i);
        }
        printf("unterminated last line of %d", rank); /* no newline */
        return 0;
    }
    if (strcmp(mode, "fail") == 0) {
        /* probe fail DIR RANK CODE|signal: RANK fails, the others hang. */
        int bad = atoi(argv[3]);
        record_pids();
        if (rank == bad) {
            /* Fail only once every rank has recorded its pids, so that the
             * test can check all of them are gone afterwards. */
            int world = atoi(env("DT_WORLD_SIZE"));
            for (int r = 0, tries = 0; r < world && tries < 2000; tries++) {
                char path[4096];
                snprintf(path, sizeof path, "%s/pid.%d", dir, r);
                if (access(path, F_OK) == 0)
                    r++;
                else
                    usleep(5000);
            }
            for (int i = 1; i <= 12; i++)
                fprintf(stderr, "diagnostic line %d of rank %d\n", i, rank);
            usleep(100 * 1000);
            if (strcmp(argv[4], "segv") == 0) {
                signal(SIGSEGV, SIG_DFL); /* a sanitizer's handler would turn it into abort */
                raise(SIGSEGV);
            }
            return atoi(argv[4]);
        }
        if (argc > 5 && strcmp(argv[5], "ignore-term") == 0)
            signal(SIGTERM, SIG_IGN);
        for (;;)
            pause();
    }
    if (strcmp(mode, "hang") == 0) {
        /* Wait for a signal; report which one arrived, then exit 0. */
        signal(SIGINT, on_signal);
        signal(SIGTERM, on_signal);
        record_pids();
        while (!got_signal)
            pause();
        char text[32];
        snprintf(text, sizeof text, "%d\n", (int)got_signal);
        write_file("sig", text);
        return 0;
    }
    if (strcmp(mode, "orphan") == 0) {
        /* Exit 0 at once, leaving a sleeping child behind. */
        record_pids();
        return 0;
    }
    if (strcmp(mode, "slow") == 0) {
        /* probe slow DIR MIN_RANK MS: ranks >= MIN_RANK take MS ms. */
        record_pids();
        if (rank >= atoi(argv[3]))
            usleep((useconds_t)atoi(argv[4]) * 1000);
        return 0;
    }
    if (strcmp(mode, "restart") == 0) {
        /* Rank 1 fails until DT_RESTART_COUNT reaches argv[3]. */
        int need = atoi(argv[3]);
        int count = atoi(env("DT_RESTART_COUNT"));
        char name[32];
        snprintf(name, sizeof name, "restart%d", count);
        write_file(name, "ran\n");
        if (rank == 1 && count < need) {
            fprintf(stderr, "rank 1 fails in attempt %d\n", count);
            return 3;
        }
        return 0;
    }
    fprintf(stderr, "probe: unknown mode %s\n", mode);
    return 2;
}
