/*
 * launch.c — start the ranks of a job on this node, relay their output, stop
 * them all when one fails, restart the job, and leave nothing behind.
 *
 * One attempt of a job is one pass of run_attempt(): fork every rank, then a
 * single poll() loop that reads the ranks' output pipes, the exec-status
 * pipes, the launcher's own signals (through a self-pipe written by the
 * handlers), the connections to the other nodes' launchers, and reaps
 * children with waitpid(WNOHANG) after every wake-up.
 *
 * Invariants:
 *   - every rank leads its own process group (pgid == its pid) and has
 *     PR_SET_PDEATHSIG(SIGKILL): signals go to groups, so a rank's own
 *     children are stopped too, and a launcher killed by SIGKILL still
 *     takes its ranks with it;
 *   - an attempt ends only after every rank has been reaped, and then every
 *     rank's process group is sent SIGKILL, so nothing outlives it;
 *   - every rank's stdout and stderr are pipes read here, tagged or not,
 *     and a line of output is written with one write() (prefixed when
 *     tagging), so lines of different ranks never mix; a line longer than
 *     LINE_BUF is cut into several lines, and an unterminated last line
 *     gets its newline;
 *   - the summary of a failure names the first rank that failed on its own,
 *     never one that was stopped because of it.
 */
#include "launch_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

#define RING_LINES    8    /* stderr lines kept per rank for the summary */
#define RING_LINE_MAX 200  /* characters kept of each of those lines */
#define LINE_BUF      4096 /* longest line relayed in one piece */
#define DRAIN_SECONDS 2.0  /* how long to wait for output after the ranks are gone */

/* The variables this launcher sets; inherited values are dropped. */
static const char *const job_vars[] = {
    "DT_RANK",      "DT_WORLD_SIZE", "DT_LOCAL_RANK",    "DT_LOCAL_WORLD_SIZE",
    "DT_NODE_RANK", "DT_NNODES",     "DT_MASTER_ADDR",   "DT_MASTER_PORT",
    "DT_JOB_ID",    "DT_JOB_TOKEN",  "DT_RESTART_COUNT", NULL,
};
/* ... and those it sets for an elastic job only. */
static const char *const elastic_vars[] = {"DT_ELASTIC", "DT_JOIN", NULL};

typedef struct stream {
    int fd;      /* read end of the rank's pipe, -1 when closed */
    int out_fd;  /* where its lines go: 1 or 2 */
    bool is_err; /* stderr: lines also go to the ring */
    size_t len;  /* bytes of the unfinished line in buf */
    char buf[LINE_BUF];
} stream;

typedef struct proc {
    int rank;    /* global rank */
    int local;   /* local rank */
    pid_t pid;   /* the rank's pid (also its process group id) */
    bool reaped; /* waitpid() returned it */
    int wstatus; /* its wait status once reaped */
    int exec_fd; /* read end of the close-on-exec status pipe, -1 when closed */
    stream out, err;
    char ring[RING_LINES][RING_LINE_MAX]; /* last stderr lines, circular */
    int ring_next, ring_count;
} proc;

typedef struct job {
    const dt_launch_options *o;
    int nproc, world;
    char path[4096];       /* resolved program */
    char master_addr[256]; /* DT_MASTER_ADDR */
    int store_port;        /* DT_MASTER_PORT */
    char job_id[64];
    char token[DT_LAUNCH_TOKEN_HEX + 1];
    char **base_env; /* inherited environment minus job_vars and env_unset */
    size_t base_count;
    dt__meeting meet;     /* multi-node only */
    struct rlimit nofile; /* the caller's descriptor limit, restored for the ranks */
    bool nofile_raised;
    bool multi;

    /* One attempt. */
    proc *p;
    int first_fail; /* local index of the first rank that failed, -1 */
    int exec_fail;  /* local index of a rank whose exec() failed, -1 */
    int exec_errno;
    bool stopping;        /* SIGTERM (or the forwarded signal) was sent */
    bool killed;          /* SIGKILL was sent */
    double kill_at;       /* when to send SIGKILL while stopping */
    int interrupted;      /* signal that interrupted the launcher, 0 if none */
    bool stopped_by_peer; /* another node asked us to stop */
    /* Multi-node, node 0: what the other nodes reported this attempt. */
    int *node_result; /* dt__result per node (index node_rank - 1), -1 = none yet */
    int *node_code;
    int fail_source; /* -2 none yet, -1 this node, else node rank */
    char remote_summary[DT__MSG_TEXT_MAX + 1];
    int remote_code;
} job;

/* ---------------------------------------------------------------------- */
/* Signals: handlers only write the signal number into a pipe.              */
/* ---------------------------------------------------------------------- */

static int sig_pipe[2] = {-1, -1};

static void on_signal(int sig) {
    int saved = errno;
    unsigned char b = (unsigned char)sig;
    if (write(sig_pipe[1], &b, 1) < 0) {
        /* Pipe full: the loop wakes up anyway and reaps. */
    }
    errno = saved;
}

typedef struct saved_signals {
    struct sigaction intr, term, chld, pipe;
} saved_signals;

static dt_status install_signals(saved_signals *s) {
    if (pipe2(sig_pipe, O_CLOEXEC | O_NONBLOCK) != 0)
        return dt_error_set_errno(DT_ERR_SYSTEM, "pipe");
    struct sigaction sa = {0};
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    sigaction(SIGINT, &sa, &s->intr);
    sigaction(SIGTERM, &sa, &s->term);
    sa.sa_flags = SA_RESTART | SA_NOCLDSTOP;
    sigaction(SIGCHLD, &sa, &s->chld);
    /* Our stdout may be a pipe that closes; relaying must not kill us (and
     * with us the guarantee that the ranks are stopped and reaped). */
    struct sigaction ign = {0};
    ign.sa_handler = SIG_IGN;
    sigaction(SIGPIPE, &ign, &s->pipe);
    return DT_OK;
}

static void restore_signals(const saved_signals *s) {
    sigaction(SIGINT, &s->intr, NULL);
    sigaction(SIGTERM, &s->term, NULL);
    sigaction(SIGCHLD, &s->chld, NULL);
    sigaction(SIGPIPE, &s->pipe, NULL);
    close(sig_pipe[0]);
    close(sig_pipe[1]);
    sig_pipe[0] = sig_pipe[1] = -1;
}

/* ---------------------------------------------------------------------- */
/* Options, program lookup, token                                           */
/* ---------------------------------------------------------------------- */

void dt_launch_options_init(dt_launch_options *o) {
    memset(o, 0, sizeof *o);
    o->nproc = 1;
    o->nnodes = 1;
    o->grace = 5.0;
}

bool dt_launch_in_job(void) {
    static const char *const vars[] = {"DT_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK",
                                       NULL};
    for (int i = 0; vars[i]; i++) {
        const char *v = getenv(vars[i]);
        if (v && *v)
            return true;
    }
    /* torchrun: RANK and WORLD_SIZE with a master (see comm's jobenv.h). */
    const char *r = getenv("RANK"), *w = getenv("WORLD_SIZE"), *m = getenv("MASTER_ADDR");
    return r && *r && w && *w && m && *m;
}

dt_status dt_launch_new_token(char *out) {
    unsigned char raw[DT_LAUNCH_TOKEN_HEX / 2];
    int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return dt_error_set_errno(DT_ERR_SYSTEM, "cannot open /dev/urandom");
    size_t got = 0;
    while (got < sizeof raw) {
        ssize_t n = read(fd, raw + got, sizeof raw - got);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            close(fd);
            return dt_error_set_errno(DT_ERR_SYSTEM, "cannot read /dev/urandom");
        }
        got += (size_t)n;
    }
    close(fd);
    for (size_t i = 0; i < sizeof raw; i++)
        snprintf(out + 2 * i, 3, "%02x", raw[i]);
    return DT_OK;
}

static bool is_token(const char *t) {
    if (strlen(t) != DT_LAUNCH_TOKEN_HEX)
        return false;
    for (const char *c = t; *c; c++)
        if (!((*c >= '0' && *c <= '9') || (*c >= 'a' && *c <= 'f') || (*c >= 'A' && *c <= 'F')))
            return false;
    return true;
}

static bool executable_file(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISREG(sb.st_mode) && access(path, X_OK) == 0;
}

/* Resolve PROGRAM like execvp would, so "not found" is known before any
 * rank starts. */
static dt_status find_program(const char *prog, char *out, size_t len) {
    if (prog[0] == '\0')
        return dt_error_set(DT_ERR_INVALID, "the program name is empty");
    if (strchr(prog, '/')) {
        if (!executable_file(prog)) {
            if (access(prog, F_OK) != 0)
                return dt_error_set_errno(DT_ERR_NOT_FOUND, "cannot execute \"%s\"", prog);
            return dt_error_set(DT_ERR_NOT_FOUND,
                                "cannot execute \"%s\": not an executable regular file", prog);
        }
        snprintf(out, len, "%s", prog);
        return DT_OK;
    }
    const char *path = getenv("PATH");
    if (!path || !*path)
        path = "/usr/local/bin:/usr/bin:/bin";
    for (const char *p = path; *p;) {
        const char *end = strchr(p, ':');
        size_t n = end ? (size_t)(end - p) : strlen(p);
        char cand[4096];
        if (n == 0)
            snprintf(cand, sizeof cand, "%s", prog);
        else
            snprintf(cand, sizeof cand, "%.*s/%s", (int)n, p, prog);
        if (executable_file(cand)) {
            snprintf(out, len, "%s", cand);
            return DT_OK;
        }
        p = end ? end + 1 : p + n;
    }
    return dt_error_set(DT_ERR_NOT_FOUND, "program \"%s\" not found in PATH", prog);
}

static dt_status check_options(const dt_launch_options *o) {
    if (o->nproc < 1 || o->nproc > DT_LAUNCH_MAX_NPROC)
        return dt_error_set(DT_ERR_INVALID, "-n/--nproc: %d is not in [1, %d]", o->nproc,
                            DT_LAUNCH_MAX_NPROC);
    if (o->nnodes < 1 || o->nnodes > DT_LAUNCH_MAX_NNODES)
        return dt_error_set(DT_ERR_INVALID, "--nnodes: %d is not in [1, %d]", o->nnodes,
                            DT_LAUNCH_MAX_NNODES);
    if (o->node_rank < 0 || o->node_rank >= o->nnodes)
        return dt_error_set(DT_ERR_INVALID, "--node-rank: %d is not in [0, %d] (--nnodes %d)",
                            o->node_rank, o->nnodes - 1, o->nnodes);
    if ((int64_t)o->nproc * o->nnodes > 1 << 20)
        return dt_error_set(DT_ERR_INVALID, "world size %lld is above %d",
                            (long long)o->nproc * o->nnodes, 1 << 20);
    if (o->nnodes > 1 && !o->master)
        return dt_error_set(DT_ERR_INVALID,
                            "--master ADDR:PORT is required with --nnodes %d (node 0's address "
                            "as the other nodes reach it)",
                            o->nnodes);
    if (o->max_restarts < 0)
        return dt_error_set(DT_ERR_INVALID, "--max-restarts: %d is negative", o->max_restarts);
    if (!(o->grace >= 0 && o->grace <= 3600))
        return dt_error_set(DT_ERR_INVALID, "--grace: %g is not in [0, 3600] seconds", o->grace);
    if (!o->argv || !o->argv[0])
        return dt_error_set(DT_ERR_INVALID, "no program to launch");
    return DT_OK;
}

/* ---------------------------------------------------------------------- */
/* Environment                                                              */
/* ---------------------------------------------------------------------- */

static bool var_is(const char *entry, const char *name) {
    size_t n = strlen(name);
    return strncmp(entry, name, n) == 0 && entry[n] == '=';
}

static dt_status build_base_env(job *j) {
    size_t n = 0;
    while (environ[n])
        n++;
    j->base_env = calloc(n + 1, sizeof *j->base_env);
    if (!j->base_env)
        return dt_error_set(DT_ERR_NOMEM, "environment");
    for (size_t i = 0; i < n; i++) {
        bool drop = false;
        for (int k = 0; job_vars[k] && !drop; k++)
            drop = var_is(environ[i], job_vars[k]);
        for (int k = 0; elastic_vars[k] && !drop; k++)
            drop = var_is(environ[i], elastic_vars[k]);
        for (int k = 0; j->o->env_unset && j->o->env_unset[k] && !drop; k++)
            drop = var_is(environ[i], j->o->env_unset[k]);
        if (!drop)
            j->base_env[j->base_count++] = environ[i];
    }
    return DT_OK;
}

/* The complete environment of one rank: base + the job variables. The
 * strings live in `store` (freed by the caller after fork). */
static char **rank_env(const job *j, const proc *p, int restart, char *store, size_t store_len) {
    char **env = calloc(j->base_count + 14, sizeof *env);
    if (!env)
        return NULL;
    memcpy(env, j->base_env, j->base_count * sizeof *env);
    size_t k = j->base_count, off = 0;
#define PUT(...)                                                                                   \
    do {                                                                                           \
        int w = snprintf(store + off, store_len - off, __VA_ARGS__);                               \
        env[k++] = store + off;                                                                    \
        off += (size_t)w + 1;                                                                      \
    } while (0)
    PUT("DT_RANK=%d", p->rank);
    PUT("DT_WORLD_SIZE=%d", j->world);
    PUT("DT_LOCAL_RANK=%d", p->local);
    PUT("DT_LOCAL_WORLD_SIZE=%d", j->nproc);
    PUT("DT_NODE_RANK=%d", j->o->node_rank);
    PUT("DT_NNODES=%d", j->o->nnodes);
    PUT("DT_MASTER_ADDR=%s", j->master_addr);
    PUT("DT_MASTER_PORT=%d", j->store_port);
    PUT("DT_JOB_ID=%s", j->job_id);
    PUT("DT_JOB_TOKEN=%s", j->token);
    PUT("DT_RESTART_COUNT=%d", restart);
    if (j->o->elastic_max > 0)
        PUT("DT_ELASTIC=%d:%d", j->o->elastic_min, j->o->elastic_max);
    if (j->o->join)
        PUT("DT_JOIN=%s", j->o->join);
#undef PUT
    env[k] = NULL;
    return env;
}

/* ---------------------------------------------------------------------- */
/* Output relay                                                             */
/* ---------------------------------------------------------------------- */

static void write_full(int fd, const char *buf, size_t len) {
    while (len > 0) {
        ssize_t n = write(fd, buf, len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return; /* our output is gone (EPIPE): keep running the job */
        buf += n;
        len -= (size_t)n;
    }
}

static void emit_line(const job *j, proc *p, stream *s, const char *line, size_t len) {
    char out[LINE_BUF + 32];
    size_t off = 0;
    if (j->o->tag_output)
        off = (size_t)snprintf(out, sizeof out, "[%d] ", p->rank);
    memcpy(out + off, line, len);
    off += len;
    out[off++] = '\n';
    write_full(s->out_fd, out, off);
    if (s->is_err) {
        size_t keep = len < RING_LINE_MAX - 1 ? len : RING_LINE_MAX - 1;
        memcpy(p->ring[p->ring_next], line, keep);
        p->ring[p->ring_next][keep] = '\0';
        p->ring_next = (p->ring_next + 1) % RING_LINES;
        if (p->ring_count < RING_LINES)
            p->ring_count++;
    }
}

/* Read what is available; emit complete lines. Closes the stream at EOF,
 * emitting an unfinished last line as a line. */
static void pump(const job *j, proc *p, stream *s) {
    ssize_t n = read(s->fd, s->buf + s->len, LINE_BUF - s->len);
    if (n < 0 && (errno == EINTR || errno == EAGAIN))
        return;
    if (n <= 0) {
        if (s->len)
            emit_line(j, p, s, s->buf, s->len);
        s->len = 0;
        close(s->fd);
        s->fd = -1;
        return;
    }
    s->len += (size_t)n;
    size_t start = 0;
    for (size_t i = s->len - (size_t)n; i < s->len; i++) {
        if (s->buf[i] == '\n') {
            emit_line(j, p, s, s->buf + start, i - start);
            start = i + 1;
        }
    }
    if (start == 0 && s->len == LINE_BUF) {
        emit_line(j, p, s, s->buf, s->len); /* a line longer than LINE_BUF */
        start = s->len;
    }
    memmove(s->buf, s->buf + start, s->len - start);
    s->len -= start;
}

/* ---------------------------------------------------------------------- */
/* Starting and stopping ranks                                              */
/* ---------------------------------------------------------------------- */

static void signal_all(job *j, int sig) {
    for (int i = 0; i < j->nproc; i++)
        if (j->p[i].pid > 0)
            kill(-j->p[i].pid, sig); /* the group: reaped leaders may have left children */
}

static void begin_stop(job *j, int sig) {
    if (!j->stopping) {
        j->stopping = true;
        j->kill_at = dt_now() + j->o->grace;
        signal_all(j, sig);
    }
}

static void child_exec(job *j, proc *p, char **env, int out_w, int err_w, int exec_w, pid_t parent,
                       const sigset_t *mask) {
    /* Between fork and exec only async-signal-safe calls. */
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent)
        _exit(127); /* the launcher died before PDEATHSIG was armed */
    setpgid(0, 0);
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    signal(SIGCHLD, SIG_DFL);
    signal(SIGPIPE, SIG_DFL);
    sigprocmask(SIG_SETMASK, mask, NULL);
    if (p->local > 0 || j->o->node_rank > 0) {
        int nul = open("/dev/null", O_RDONLY);
        if (nul >= 0) {
            dup2(nul, 0);
            if (nul != 0)
                close(nul);
        }
    }
    dup2(out_w, 1);
    dup2(err_w, 2);
    if (j->nofile_raised)
        setrlimit(RLIMIT_NOFILE, &j->nofile);
    execve(j->path, j->o->argv, env);
    int e = errno;
    if (write(exec_w, &e, sizeof e) < 0)
        _exit(127);
    _exit(127);
}

static dt_status spawn(job *j, proc *p, int restart) {
    int out[2] = {-1, -1}, err[2] = {-1, -1}, ex[2] = {-1, -1};
    char store[2048];
    char **env = NULL;
    dt_status st = DT_OK;
    if (pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0 || pipe2(ex, O_CLOEXEC) != 0) {
        st = dt_error_set_errno(DT_ERR_SYSTEM, "pipe for rank %d", p->rank);
        goto fail;
    }
    env = rank_env(j, p, restart, store, sizeof store);
    if (!env) {
        st = dt_error_set(DT_ERR_NOMEM, "environment of rank %d", p->rank);
        goto fail;
    }
    sigset_t all, old;
    sigfillset(&all);
    sigprocmask(SIG_BLOCK, &all, &old);
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid == 0)
        child_exec(j, p, env, out[1], err[1], ex[1], parent, &old);
    int fork_errno = errno;
    sigprocmask(SIG_SETMASK, &old, NULL);
    if (pid < 0) {
        errno = fork_errno;
        st = dt_error_set_errno(DT_ERR_SYSTEM, "fork for rank %d", p->rank);
        goto fail;
    }
    setpgid(pid, pid); /* also here: signals sent before the child ran must reach its group */
    p->pid = pid;
    p->out.fd = out[0];
    p->err.fd = err[0];
    p->exec_fd = ex[0];
    out[0] = err[0] = ex[0] = -1;
    fcntl(p->err.fd, F_SETFL, O_NONBLOCK);
    fcntl(p->out.fd, F_SETFL, O_NONBLOCK);
fail:
    for (int k = 0; k < 2; k++) {
        if (out[k] >= 0)
            close(out[k]);
        if (err[k] >= 0)
            close(err[k]);
        if (ex[k] >= 0)
            close(ex[k]);
    }
    free(env);
    return st;
}

static int code_of(int ws);

static void reap(job *j) {
    for (int i = 0; i < j->nproc; i++) {
        proc *p = &j->p[i];
        if (p->pid <= 0 || p->reaped)
            continue;
        int ws;
        pid_t r = waitpid(p->pid, &ws, WNOHANG);
        if (r != p->pid)
            continue;
        p->reaped = true;
        p->wstatus = ws;
        bool ok = WIFEXITED(ws) && WEXITSTATUS(ws) == 0;
        if (!ok && j->o->elastic_max > 0 && !j->stopping && j->exec_fail < 0) {
            /* Elastic: the others form a new membership without it. */
            if (j->first_fail < 0)
                j->first_fail = i;
            if (WIFSIGNALED(ws))
                fprintf(stderr,
                        "dtrain launch: rank %d (pid %d) was killed by signal %d (%s); the job "
                        "goes on without it (--elastic)\n",
                        p->rank, (int)p->pid, WTERMSIG(ws), strsignal(WTERMSIG(ws)));
            else
                fprintf(stderr,
                        "dtrain launch: rank %d (pid %d) exited with code %d; the job goes on "
                        "without it (--elastic)\n",
                        p->rank, (int)p->pid, code_of(ws));
            continue;
        }
        if (!ok && j->first_fail < 0 && !j->stopping && j->exec_fail < 0) {
            j->first_fail = i;
            begin_stop(j, SIGTERM);
        }
    }
}

static int code_of(int ws) {
    if (WIFEXITED(ws))
        return WEXITSTATUS(ws);
    if (WIFSIGNALED(ws))
        return 128 + WTERMSIG(ws);
    return 1;
}

/* "rank 3 (pid 123) exited with code 7; its last lines on stderr: ..." */
static void summarize(const job *j, char *out, size_t len) {
    const proc *p = &j->p[j->first_fail];
    size_t off = 0;
#define ADD(...)                                                                                   \
    do {                                                                                           \
        if (off < len)                                                                             \
            off += (size_t)snprintf(out + off, len - off, __VA_ARGS__);                            \
    } while (0)
    ADD("rank %d (node %d, local rank %d, pid %d) ", p->rank, j->o->node_rank, p->local,
        (int)p->pid);
    if (WIFEXITED(p->wstatus))
        ADD("exited with code %d", WEXITSTATUS(p->wstatus));
    else if (WIFSIGNALED(p->wstatus))
        ADD("was killed by signal %d (%s)", WTERMSIG(p->wstatus), strsignal(WTERMSIG(p->wstatus)));
    if (p->ring_count == 0) {
        ADD("; it wrote nothing to stderr");
    } else {
        ADD("; its last lines on stderr:");
        int first = (p->ring_next - p->ring_count + RING_LINES) % RING_LINES;
        for (int k = 0; k < p->ring_count; k++)
            ADD("\n    [%d] %s", p->rank, p->ring[(first + k) % RING_LINES]);
    }
#undef ADD
}

/* ---------------------------------------------------------------------- */
/* Messages from the other nodes' launchers                                 */
/* ---------------------------------------------------------------------- */

static void send_stop_to_nodes(job *j) {
    /* An elastic job's other nodes go on without a failed node's ranks. */
    if (!j->multi || j->o->node_rank != 0 || (j->o->elastic_max > 0 && !j->interrupted))
        return;
    for (int i = 0; i < j->o->nnodes - 1; i++)
        if (j->meet.fds[i] >= 0)
            (void)dt__msg_send(j->meet.fds[i], DT__MSG_STOP, 0, 0, 0, NULL);
}

/* Node 0: note a failure on node `src` (-1: this node) if it is the first. */
static void note_failure(job *j, int src, int code, const char *text) {
    if (j->fail_source != -2)
        return;
    j->fail_source = src;
    j->remote_code = code;
    if (text)
        snprintf(j->remote_summary, sizeof j->remote_summary, "%s", text);
    send_stop_to_nodes(j);
}

/* Node 0: read one message from node idx + 1 and record it. Returns true
 * if that node failed (or went away). */
static bool record_node_message(job *j, int idx) {
    int fd = j->meet.fds[idx];
    int node = idx + 1;
    dt__msg m;
    dt_status st = dt__msg_recv(fd, 10.0, &m);
    if (st != DT_OK || m.type != DT__MSG_RESULT) {
        char why[256];
        snprintf(why, sizeof why, "the launcher of node %d went away (%s)", node,
                 st != DT_OK ? dt_last_error() : "unexpected message");
        close(fd);
        j->meet.fds[idx] = -1;
        j->node_result[idx] = DT__RESULT_FAILED;
        j->node_code[idx] = 1;
        note_failure(j, node, 1, why);
        return true;
    }
    j->node_result[idx] = m.b;
    j->node_code[idx] = m.a;
    if (m.b == DT__RESULT_FAILED) {
        note_failure(j, node, m.a, m.text);
        return true;
    }
    return false;
}

static void on_node_message(job *j, int idx) {
    if (j->o->node_rank == 0) {
        if (record_node_message(j, idx) && j->o->elastic_max <= 0)
            begin_stop(j, SIGTERM);
        return;
    }
    dt__msg m;
    dt_status st = dt__msg_recv(j->meet.fds[idx], 10.0, &m);
    if (st != DT_OK || m.type != DT__MSG_STOP) {
        /* Node 0 is gone: nobody can coordinate the job any more. */
        close(j->meet.fds[idx]);
        j->meet.fds[idx] = -1;
        if (j->o->elastic_max > 0) {
            /* ... but an elastic job's ranks here go on without node 0's. */
            fprintf(stderr,
                    "dtrain launch: node %d: node 0's launcher is gone; the ranks here go "
                    "on (--elastic)\n",
                    j->o->node_rank);
            return;
        }
    }
    j->stopped_by_peer = true;
    begin_stop(j, SIGTERM);
}

/* Wait until fd is readable or SIGINT/SIGTERM arrives (returns that signal,
 * else 0). No deadline: the other side's ranks may run for days; a dead
 * peer machine is noticed by TCP keepalive (see node.c). */
static int wait_fds_or_signal(const int *fds, int nfds, int *ready) {
    struct pollfd *pfd = calloc((size_t)nfds + 1, sizeof *pfd);
    DT_ASSERT(pfd);
    int result = 0;
    for (;;) {
        /* A negative fd is ignored by poll(). */
        pfd[0] = (struct pollfd){.fd = sig_pipe[0], .events = POLLIN};
        for (int i = 0; i < nfds; i++)
            pfd[i + 1] = (struct pollfd){.fd = fds[i], .events = POLLIN};
        int r = poll(pfd, (nfds_t)nfds + 1, 1000);
        if (r <= 0)
            continue;
        if (pfd[0].revents) {
            unsigned char sigs[64];
            ssize_t got = read(sig_pipe[0], sigs, sizeof sigs);
            for (ssize_t k = 0; k < got && !result; k++)
                if (sigs[k] == SIGINT || sigs[k] == SIGTERM)
                    result = sigs[k];
            if (result)
                break;
        }
        int i = 0;
        while (i < nfds && !(pfd[i + 1].revents & (POLLIN | POLLHUP | POLLERR)))
            i++;
        if (i < nfds) {
            *ready = i;
            break;
        }
    }
    free(pfd);
    return result;
}

/* ---------------------------------------------------------------------- */
/* One attempt                                                              */
/* ---------------------------------------------------------------------- */

/* An elastic job whose ranks failed: it finished when one of its ranks
 * (one that went on without them) exited successfully. */
static bool elastic_done(const job *j) {
    if (j->o->elastic_max <= 0)
        return false;
    for (int i = 0; i < j->nproc; i++)
        if (j->p[i].reaped && WIFEXITED(j->p[i].wstatus) && WEXITSTATUS(j->p[i].wstatus) == 0)
            return true;
    return false;
}

typedef struct attempt {
    dt_status st; /* DT_OK, DT_ERR_PEER (a rank failed), DT_ERR_ABORTED, launch errors */
    int code;     /* exit code to report */
    dt__result result;
    char summary[DT__MSG_TEXT_MAX + 1];
} attempt;

static void run_attempt(job *j, int restart, attempt *a) {
    memset(a, 0, sizeof *a);
    j->first_fail = j->exec_fail = -1;
    j->stopping = j->killed = j->stopped_by_peer = false;
    j->interrupted = 0;
    j->fail_source = -2;
    int nnodes_ctrl = !j->multi ? 0 : j->o->node_rank == 0 ? j->o->nnodes - 1 : 1;
    for (int i = 0; j->multi && j->o->node_rank == 0 && i < nnodes_ctrl; i++)
        j->node_result[i] = j->meet.fds[i] >= 0 ? -1 : DT__RESULT_FAILED;

    for (int i = 0; i < j->nproc; i++) {
        proc *p = &j->p[i];
        memset(p, 0, offsetof(proc, ring));
        p->ring_next = p->ring_count = 0;
        p->local = i;
        p->rank = j->o->node_rank * j->nproc + i;
        p->pid = -1;
        p->exec_fd = p->out.fd = p->err.fd = -1;
        p->out.out_fd = 1;
        p->err.out_fd = 2;
        p->err.is_err = true;
    }
    int started = 0;
    for (; started < j->nproc; started++) {
        dt_status st = spawn(j, &j->p[started], restart);
        if (st != DT_OK) {
            a->st = st;
            a->code = 1;
            snprintf(a->summary, sizeof a->summary, "%s", dt_last_error());
            begin_stop(j, SIGKILL);
            break;
        }
    }

    size_t cap = 1 + 3 * (size_t)j->nproc + (size_t)nnodes_ctrl;
    struct pollfd *pfd = calloc(cap, sizeof *pfd);
    int *what = calloc(cap, sizeof *what); /* >= 0: proc*3 + stream; < 0: -(node idx) - 1 */
    DT_ASSERT(pfd && what);
    double drain_until = 0;
    for (;;) {
        /* Build the poll set. */
        size_t n = 0;
        pfd[n] = (struct pollfd){.fd = sig_pipe[0], .events = POLLIN};
        what[n++] = 0;
        for (int i = 0; i < started; i++) {
            proc *p = &j->p[i];
            int fds[3] = {p->out.fd, p->err.fd, p->exec_fd};
            for (int k = 0; k < 3; k++)
                if (fds[k] >= 0) {
                    pfd[n] = (struct pollfd){.fd = fds[k], .events = POLLIN};
                    what[n++] = i * 3 + k;
                }
        }
        for (int i = 0; i < nnodes_ctrl; i++)
            if (j->meet.fds[i] >= 0 && (j->o->node_rank == 0 ? j->node_result[i] < 0 : true)) {
                pfd[n] = (struct pollfd){.fd = j->meet.fds[i], .events = POLLIN};
                what[n++] = -i - 1;
            }

        bool all_reaped = true;
        for (int i = 0; i < started; i++)
            all_reaped &= j->p[i].reaped;
        bool any_stream = false;
        for (size_t k = 1; k < n; k++)
            any_stream |= what[k] >= 0;
        if (all_reaped) {
            if (drain_until == 0) {
                /* Whatever the ranks left behind in their groups goes now. */
                signal_all(j, SIGKILL);
                drain_until = dt_now() + DRAIN_SECONDS;
            }
            if (!any_stream || dt_now() >= drain_until)
                break;
        }

        int timeout_ms = 1000; /* reap even if a SIGCHLD wake-up were lost */
        double now = dt_now();
        if (j->stopping && !j->killed) {
            int ms = (int)((j->kill_at - now) * 1000) + 1;
            if (ms < timeout_ms)
                timeout_ms = ms < 0 ? 0 : ms;
        }
        if (drain_until > 0) {
            int ms = (int)((drain_until - now) * 1000) + 1;
            if (ms < timeout_ms)
                timeout_ms = ms < 0 ? 0 : ms;
        }
        int r = poll(pfd, n, timeout_ms);
        if (r < 0 && errno != EINTR) {
            a->st = dt_error_set_errno(DT_ERR_SYSTEM, "poll");
            begin_stop(j, SIGKILL);
        }
        for (size_t k = 0; r > 0 && k < n; k++) {
            if (!(pfd[k].revents & (POLLIN | POLLHUP | POLLERR)))
                continue;
            if (k == 0) {
                unsigned char sigs[64];
                ssize_t got = read(sig_pipe[0], sigs, sizeof sigs);
                for (ssize_t s = 0; s < got; s++) {
                    if (sigs[s] != SIGINT && sigs[s] != SIGTERM)
                        continue;
                    if (j->interrupted) {
                        signal_all(j, SIGKILL); /* a second ^C: no more waiting */
                        j->killed = true;
                    } else {
                        j->interrupted = sigs[s];
                        j->stopping = false; /* forward this signal even if stopping */
                        begin_stop(j, sigs[s]);
                    }
                }
                continue;
            }
            if (what[k] < 0) {
                on_node_message(j, -what[k] - 1);
                continue;
            }
            proc *p = &j->p[what[k] / 3];
            switch (what[k] % 3) {
            case 0: pump(j, p, &p->out); break;
            case 1: pump(j, p, &p->err); break;
            case 2: {
                int e = 0;
                ssize_t got = read(p->exec_fd, &e, sizeof e);
                close(p->exec_fd);
                p->exec_fd = -1;
                if (got == (ssize_t)sizeof e && j->exec_fail < 0) {
                    j->exec_fail = (int)(p - j->p);
                    j->exec_errno = e;
                    begin_stop(j, SIGKILL);
                }
                break;
            }
            }
        }
        reap(j);
        if (j->stopping && !j->killed && dt_now() >= j->kill_at) {
            signal_all(j, SIGKILL);
            j->killed = true;
        }
        /* Node 0: any local stop (a failed rank, ^C, an exec error) stops
         * the other nodes at once; a remote failure has set fail_source. */
        if (j->multi && j->o->node_rank == 0 && j->stopping && j->fail_source == -2)
            note_failure(j, -1, 0, NULL);
    }
    free(pfd);
    free(what);

    /* Close what a stray grandchild may still hold open. */
    for (int i = 0; i < started; i++) {
        proc *p = &j->p[i];
        stream *ss[2] = {&p->out, &p->err};
        for (int k = 0; k < 2; k++) {
            if (ss[k]->fd >= 0) {
                if (ss[k]->len)
                    emit_line(j, p, ss[k], ss[k]->buf, ss[k]->len);
                close(ss[k]->fd);
                ss[k]->fd = -1;
            }
        }
        if (p->exec_fd >= 0) {
            close(p->exec_fd);
            p->exec_fd = -1;
        }
    }

    if (a->st != DT_OK) {
        a->result = DT__RESULT_FAILED;
        return;
    }
    if (j->exec_fail >= 0) {
        errno = j->exec_errno;
        a->st = dt_error_set_errno(DT_ERR_NOT_FOUND, "rank %d: cannot execute \"%s\"",
                                   j->p[j->exec_fail].rank, j->path);
        snprintf(a->summary, sizeof a->summary, "%s", dt_last_error());
        a->code = 1;
        a->result = DT__RESULT_FAILED;
    } else if (j->interrupted) {
        a->st = DT_ERR_ABORTED;
        snprintf(a->summary, sizeof a->summary,
                 "interrupted by signal %d (%s); the job was stopped", j->interrupted,
                 strsignal(j->interrupted));
        a->code = 128 + j->interrupted;
        a->result = DT__RESULT_FAILED;
    } else if (j->first_fail >= 0 && elastic_done(j)) {
        a->result = DT__RESULT_OK; /* lost ranks, but the job finished */
    } else if (j->first_fail >= 0) {
        a->st = DT_ERR_PEER;
        summarize(j, a->summary, sizeof a->summary);
        a->code = code_of(j->p[j->first_fail].wstatus);
        a->result = DT__RESULT_FAILED;
    } else if (j->stopped_by_peer) {
        a->st = DT_ERR_PEER;
        snprintf(a->summary, sizeof a->summary, "stopped because another node failed");
        a->code = 1;
        a->result = DT__RESULT_STOPPED;
    } else {
        a->result = DT__RESULT_OK;
    }
}

/* ---------------------------------------------------------------------- */
/* The job                                                                  */
/* ---------------------------------------------------------------------- */

/* Node 0 of a multi-node job: wait for every node's RESULT of this attempt.
 * A node that failed has already been told to stop the others; a ^C here
 * stops every node (a second one gives up waiting). */
static void collect_results(job *j) {
    int nn = j->o->nnodes - 1;
    int *pending = malloc((size_t)nn * sizeof *pending);
    DT_ASSERT(pending);
    for (;;) {
        int np = 0;
        for (int i = 0; i < nn; i++) {
            if (j->node_result[i] < 0 && j->meet.fds[i] < 0) {
                j->node_result[i] = DT__RESULT_FAILED;
                note_failure(j, i + 1, 1, "a node's launcher went away");
            }
            pending[i] = j->node_result[i] < 0 ? j->meet.fds[i] : -1;
            np += pending[i] >= 0;
        }
        if (np == 0)
            break;
        int idx = -1;
        int sig = wait_fds_or_signal(pending, nn, &idx);
        if (sig) {
            if (j->interrupted) {
                for (int i = 0; i < nn; i++)
                    if (j->node_result[i] < 0)
                        j->node_result[i] = DT__RESULT_FAILED;
                break;
            }
            j->interrupted = sig;
            char why[128];
            snprintf(why, sizeof why, "interrupted by signal %d (%s); the job was stopped", sig,
                     strsignal(sig));
            note_failure(j, -1, 128 + sig, why);
            send_stop_to_nodes(j); /* even if a failure was noted before */
            continue;
        }
        record_node_message(j, idx);
    }
    free(pending);
}

static dt_status prepare(job *j, const dt_launch_options *o) {
    DT_CHECK(check_options(o));
    j->o = o;
    j->nproc = o->nproc;
    j->world = o->nproc * o->nnodes;
    j->multi = o->nnodes > 1;
    /* A joining node that cannot run the program still meets node 0, to
     * tell everybody why the job cannot start (else node 0 would wait for
     * it until DT_TIMEOUT). */
    dt_status found = find_program(o->argv[0], j->path, sizeof j->path);
    char problem[1024] = "";
    if (found != DT_OK && !j->multi)
        return found;
    if (found != DT_OK) {
        snprintf(problem, sizeof problem, "%s", dt_last_error());
        if (o->node_rank == 0)
            fprintf(stderr,
                    "dtrain launch: %s; telling the other nodes as they connect (^C to stop)\n",
                    problem);
    }

    int port = 0;
    snprintf(j->master_addr, sizeof j->master_addr, "127.0.0.1");
    if (o->join && (j->multi || o->master || o->elastic_max <= 0))
        return dt_error_set(DT_ERR_INVALID,
                            "--join %s starts newcomers for a running elastic job: it needs "
                            "--elastic MIN:MAX (the job's) and takes no --master or --nnodes",
                            o->join);
    if (o->join) {
        DT_CHECK(dt__parse_master("--join", o->join, j->master_addr, sizeof j->master_addr, &port));
        if (port == 0)
            return dt_error_set(DT_ERR_INVALID, "--join %s: the job's store port is needed",
                                o->join);
        const char *tok = getenv("DT_JOB_TOKEN");
        if (!tok || !is_token(tok))
            return dt_error_set(DT_ERR_INVALID,
                                "--join: DT_JOB_TOKEN must hold the running job's token (%d "
                                "hexadecimal characters)",
                                DT_LAUNCH_TOKEN_HEX);
    }
    if (o->master)
        DT_CHECK(
            dt__parse_master("--master", o->master, j->master_addr, sizeof j->master_addr, &port));
    if (j->multi && port == 0)
        return dt_error_set(DT_ERR_INVALID, "--master: \"%s\" needs a port with --nnodes %d",
                            o->master, o->nnodes);

    const char *tok = getenv("DT_JOB_TOKEN");
    bool token_given = tok && *tok;
    if (token_given) {
        if (!is_token(tok))
            return dt_error_set(DT_ERR_INVALID,
                                "DT_JOB_TOKEN: \"%.40s\" is not %d hexadecimal characters", tok,
                                DT_LAUNCH_TOKEN_HEX);
        snprintf(j->token, sizeof j->token, "%s", tok);
    } else {
        DT_CHECK(dt_launch_new_token(j->token));
    }
    const char *id = getenv("DT_JOB_ID");
    if (id && *id) {
        if (strlen(id) >= sizeof j->job_id || strpbrk(id, " \t\n"))
            return dt_error_set(DT_ERR_INVALID,
                                "DT_JOB_ID: \"%.70s\" must be under 64 characters, no spaces", id);
        snprintf(j->job_id, sizeof j->job_id, "%s", id);
    } else {
        char hex[DT_LAUNCH_TOKEN_HEX + 1];
        DT_CHECK(dt_launch_new_token(hex));
        snprintf(j->job_id, sizeof j->job_id, "dt-%.12s", hex);
    }

    if (!j->multi) {
        if (port == 0)
            DT_CHECK(dt__free_port(&port));
        else if (!o->join) /* a newcomer's is the running job's, in use */
            DT_CHECK(dt__check_port_free(port, "master"));
        j->store_port = port;
        return DT_OK;
    }
    j->meet = (dt__meeting){.nnodes = o->nnodes,
                            .node_rank = o->node_rank,
                            .nproc = o->nproc,
                            .addr = j->master_addr,
                            .port = port,
                            .timeout = o->timeout,
                            .token_given = token_given,
                            .store_port = port + 1,
                            .problem = problem[0] ? problem : NULL};
    snprintf(j->meet.job_id, sizeof j->meet.job_id, "%s", j->job_id);
    snprintf(j->meet.token, sizeof j->meet.token, "%s", j->token);
    if (o->node_rank == 0) {
        DT_CHECK(dt__check_port_free(port, "master"));
        DT_CHECK(dt__check_port_free(port + 1, "store (master port + 1)"));
    }
    DT_CHECK(dt__meet(&j->meet));
    if (problem[0]) /* node 0 did not refuse us: an old launcher; fail here */
        return dt_error_set(found, "%s", problem);
    snprintf(j->job_id, sizeof j->job_id, "%s", j->meet.job_id);
    snprintf(j->token, sizeof j->token, "%s", j->meet.token);
    j->store_port = j->meet.store_port;
    if (o->node_rank == 0) {
        j->node_result = calloc((size_t)o->nnodes, sizeof *j->node_result);
        j->node_code = calloc((size_t)o->nnodes, sizeof *j->node_code);
        if (!j->node_result || !j->node_code)
            return dt_error_set(DT_ERR_NOMEM, "node results");
    }
    return DT_OK;
}

static void release(job *j) {
    if (j->multi)
        dt__meeting_close(&j->meet);
    free(j->node_result);
    free(j->node_code);
    free(j->base_env);
    free(j->p);
}

dt_status dt_launch_run(const dt_launch_options *opts, int *exit_code) {
    *exit_code = 1;
    dt_launch_options o = *opts;
    if (o.timeout <= 0) {
        double t;
        if (dt_config_env_double("DT_TIMEOUT", 300, 0.1, 1e9, &t) != DT_OK) {
            *exit_code = 2;
            return DT_ERR_INVALID;
        }
        o.timeout = t;
    }
    job j;
    memset(&j, 0, sizeof j);
    saved_signals saved;
    dt_status st = DT_OK;
    bool signals = false;
    /* Signals first: a ^C during the multi-node meeting must not leave a
     * half-started job (nothing runs yet, so the default action is fine,
     * but the handlers are needed from the first fork on). */
    st = prepare(&j, &o);
    if (st != DT_OK) {
        *exit_code = st == DT_ERR_INVALID ? 2 : 1;
        goto done;
    }
    DT_CHECK_GOTO(build_base_env(&j), st, done);
    j.p = calloc((size_t)j.nproc, sizeof *j.p);
    if (!j.p) {
        st = dt_error_set(DT_ERR_NOMEM, "%d ranks", j.nproc);
        goto done;
    }
    DT_CHECK_GOTO(install_signals(&saved), st, done);
    signals = true;
    /* Three pipes per rank stay open: the usual soft limit of 1024
     * descriptors would cap a node near 340 ranks. */
    if (getrlimit(RLIMIT_NOFILE, &j.nofile) == 0 && j.nofile.rlim_cur < j.nofile.rlim_max) {
        struct rlimit raised = j.nofile;
        raised.rlim_cur = raised.rlim_max;
        j.nofile_raised = setrlimit(RLIMIT_NOFILE, &raised) == 0;
    }

    for (int restart = 0;; restart++) {
        attempt a;
        run_attempt(&j, restart, &a);
        dt__result result = a.result;
        int code = a.code;
        char *summary = a.summary;
        if (j.multi && o.node_rank != 0) {
            /* Report, then let node 0 decide for everybody. */
            dt__msg m = {.type = 0};
            dt_status ms = j.meet.fds[0] >= 0 ? dt__msg_send(j.meet.fds[0], DT__MSG_RESULT, a.code,
                                                             (int)a.result, 0, a.summary)
                                              : DT_ERR_PEER;
            int sig = 0;
            do {
                int idx;
                if (ms == DT_OK && (sig = wait_fds_or_signal(j.meet.fds, 1, &idx)) == 0)
                    ms = dt__msg_recv(j.meet.fds[0], 10.0, &m);
            } while (ms == DT_OK && sig == 0 && m.type == DT__MSG_STOP);
            if (sig) {
                /* Our ranks are done; leaving makes node 0 stop the job. */
                st = dt_error_set(DT_ERR_ABORTED,
                                  "interrupted by signal %d (%s) while waiting for the other nodes",
                                  sig, strsignal(sig));
                *exit_code = 128 + sig;
                break;
            }
            if (ms != DT_OK && o.elastic_max > 0 && a.result == DT__RESULT_OK) {
                st = DT_OK; /* an elastic job that finished here without node 0 */
                *exit_code = 0;
                break;
            }
            if (ms != DT_OK) {
                st = dt_error_set(DT_ERR_PEER, "lost the connection to node 0's launcher%s%s",
                                  a.result == DT__RESULT_OK ? "" : "; this node: ",
                                  a.result == DT__RESULT_OK ? "" : a.summary);
                *exit_code = a.result == DT__RESULT_OK ? 1 : a.code;
                break;
            }
            if (m.type == DT__MSG_RESTART) {
                fprintf(stderr, "dtrain launch: node %d: restarting the job (restart %d of %d)\n",
                        o.node_rank, m.a, o.max_restarts);
                continue;
            }
            *exit_code = m.a;
            st = m.a == 0 ? DT_OK : (a.st == DT_ERR_ABORTED ? DT_ERR_ABORTED : DT_ERR_PEER);
            if (m.a != 0)
                dt_error_set(st, "%s", m.text);
            break;
        }
        if (j.multi) {
            /* Node 0: the job's outcome is the first failure anywhere. */
            if (a.result == DT__RESULT_FAILED)
                note_failure(&j, -1, a.code, NULL);
            collect_results(&j);
            /* Elastic: the job finished if some node's ranks did. */
            bool some_ok = o.elastic_max > 0 && a.result == DT__RESULT_OK;
            for (int i = 0; o.elastic_max > 0 && i < o.nnodes - 1; i++)
                some_ok |= j.node_result[i] == DT__RESULT_OK;
            if (some_ok) {
                result = DT__RESULT_OK;
            } else if (j.fail_source >= 0) {
                result = DT__RESULT_FAILED;
                code = j.remote_code ? j.remote_code : 1;
                summary = j.remote_summary;
                if (a.st == DT_OK || a.result == DT__RESULT_STOPPED)
                    a.st = DT_ERR_PEER;
            }
        }
        bool can_restart = result != DT__RESULT_OK && a.st != DT_ERR_ABORTED &&
                           a.st != DT_ERR_NOT_FOUND && restart < o.max_restarts;
        if (result != DT__RESULT_OK && can_restart) {
            fprintf(stderr,
                    "dtrain launch: %s\ndtrain launch: restarting the job (restart %d of %d)\n",
                    summary, restart + 1, o.max_restarts);
            for (int i = 0; j.multi && i < o.nnodes - 1; i++)
                if (j.meet.fds[i] >= 0)
                    (void)dt__msg_send(j.meet.fds[i], DT__MSG_RESTART, restart + 1, j.store_port, 0,
                                       NULL);
            if (!j.multi && !o.master) {
                /* A fresh port: the old one may linger in TIME_WAIT. */
                int port;
                if (dt__free_port(&port) == DT_OK)
                    j.store_port = port;
            }
            continue;
        }
        if (result == DT__RESULT_OK) {
            st = DT_OK;
            *exit_code = 0;
        } else {
            st = a.st != DT_OK ? a.st : DT_ERR_PEER;
            *exit_code = code;
            dt_error_set(st, "%s", summary);
        }
        for (int i = 0; j.multi && i < o.nnodes - 1; i++)
            if (j.meet.fds[i] >= 0)
                (void)dt__msg_send(j.meet.fds[i], DT__MSG_END, *exit_code, (int)result, 0,
                                   result == DT__RESULT_OK ? NULL : summary);
        break;
    }
done:
    if (j.nofile_raised)
        setrlimit(RLIMIT_NOFILE, &j.nofile);
    if (signals)
        restore_signals(&saved);
    release(&j);
    return st;
}

/* ---------------------------------------------------------------------- */
/* Relaunching oneself                                                      */
/* ---------------------------------------------------------------------- */

dt_status dt_launch_self(const dt_launch_options *opts, int argc, char *const *argv,
                         const char *flag, int *exit_code) {
    *exit_code = 1;
    if (argc < 1 || !flag || strncmp(flag, "--", 2) != 0) {
        *exit_code = 2;
        return dt_error_set(DT_ERR_INVALID, "dt_launch_self: argv and a \"--flag\" are required");
    }
    char **args = calloc((size_t)argc + 1, sizeof *args);
    if (!args)
        return dt_error_set(DT_ERR_NOMEM, "arguments");
    /* The running binary, by its real path so that `ps` shows what runs;
     * /proc/self/exe would also work but names nothing. */
    char self[4096];
    ssize_t sl = readlink("/proc/self/exe", self, sizeof self - 1);
    if (sl <= 0) {
        free(args);
        return dt_error_set_errno(DT_ERR_SYSTEM, "readlink(/proc/self/exe)");
    }
    self[sl] = '\0';
    size_t flen = strlen(flag);
    int n = 0;
    args[n++] = self;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--") == 0) {
            for (; i < argc; i++)
                args[n++] = argv[i]; /* after "--": the program's own arguments */
            break;
        }
        if (strcmp(argv[i], flag) == 0) {
            i++; /* and its value */
            continue;
        }
        if (strncmp(argv[i], flag, flen) == 0 && argv[i][flen] == '=')
            continue;
        args[n++] = argv[i];
    }
    args[n] = NULL;
    static const char *const unset[] = {"DT_NPROC", NULL};
    dt_launch_options o = *opts;
    o.argv = args;
    if (!o.env_unset)
        o.env_unset = unset;
    dt_status st = dt_launch_run(&o, exit_code);
    free(args);
    return st;
}
