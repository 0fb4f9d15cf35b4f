/*
 * cmd_bench_comm.c — `dtrain bench comm`: collective bandwidth and latency
 * in the nccl-tests format, and `dtrain bench memcpy`: the memory-bandwidth
 * ceiling the shared-memory numbers should be read against.
 *
 * Run it under any launcher that sets DT_RANK/DT_WORLD_SIZE (or mpirun),
 * or give --nproc N and it starts N local ranks itself (fork/exec, a random
 * job token and a free port). Every row is checked: before timing, each
 * rank contributes small integers whose reduction is exact, and #wrong
 * counts elements that differ from the expected value on any rank.
 *
 * busbw follows nccl-tests: algbw times the fraction of the data each rank
 * must move in the bandwidth-optimal algorithm (allreduce 2(n-1)/n,
 * reduce_scatter and allgather and alltoall (n-1)/n, broadcast 1), so it is
 * comparable across rank counts and with the hardware's bandwidth.
 */
#include "cli.h"
#include "dtrain/comm.h"
#include "dtrain/launch.h"
#include "dtrain/train.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

static const char *const op_choices[] = {"allreduce", "reduce_scatter", "allgather",
                                         "broadcast", "alltoall",       NULL};
static const dt_coll op_colls[] = {DT_COLL_ALLREDUCE, DT_COLL_REDUCE_SCATTER, DT_COLL_ALLGATHER,
                                   DT_COLL_BROADCAST, DT_COLL_ALLTOALL};
static const char *const algo_choices[] = {"auto", "ring",    "rhd",     "tree", "direct",
                                           "hier", "torus2d", "ordered", NULL};
static const char *const transport_choices[] = {"auto", "shm", "tcp", NULL};
static const char *const redop_choices[] = {"sum", "avg", "prod", "min", "max", NULL};

static const cli_opt comm_opts[] = {
    {"op", 0, CLI_ENUM, "OP", "allreduce", NULL, "collective to time", op_choices, 0, 0},
    {"sizes", 0, CLI_STRING, "MIN:MAX", "8:256M", NULL,
     "message sizes in bytes, doubling from MIN to MAX", NULL, 0, 0},
    {"dtype", 0, CLI_STRING, "T", "f32", NULL, "element type (f32 f64 f16 bf16 i8 u8 i32 i64)",
     NULL, 0, 0},
    {"redop", 0, CLI_ENUM, "OP", "sum", NULL, "reduction", redop_choices, 0, 0},
    {"algo", 0, CLI_ENUM, "A", "auto", "DT_ALGO", "algorithm", algo_choices, 0, 0},
    {"transport", 0, CLI_ENUM, "T", "auto", "DT_TRANSPORT", "transport", transport_choices, 0, 0},
    {"deterministic", 0, CLI_FLAG, NULL, NULL, "DT_DETERMINISTIC",
     "rank-ordered allreduce and reduce-scatter: the same bits on every algorithm and layout", NULL,
     0, 0},
    {"nproc", 'n', CLI_INT, "N", "0", NULL,
     "start N local ranks (0: join the job of dtrain launch, mpirun, srun or torchrun)", NULL, 0,
     256},
    {"iters", 0, CLI_INT, "N", "0", NULL, "timed iterations per size (0: by size)", NULL, 0, 1e6},
    {"warmup", 0, CLI_INT, "N", "3", NULL, "untimed iterations per size", NULL, 0, 1e6},
    {"check", 0, CLI_BOOL, "BOOL", "true", NULL, "verify every row", NULL, 0, 0},
    {"read", 0, CLI_FLAG, NULL, NULL, NULL,
     "after every call each rank reads its whole output, inside the timing (a consumer)", NULL, 0,
     0},
    {"json", 0, CLI_FLAG, NULL, NULL, NULL, "one JSON object per row instead of the table", NULL, 0,
     0},
    {"profile", 0, CLI_BOOL, "BOOL", "true", NULL,
     "fit alpha + size / beta to the rows (3 sizes or more, --algo auto) and store it in this "
     "machine's profile, for dtrain report and dtrain plan --cluster this",
     NULL, 0, 0},
    {0},
};

/* The option's name before it was --nproc, like train's and launch's. */
static const cli_alias comm_aliases[] = {{"np", "nproc"}, {0}};

/* --------------------------------------------------------------------- */
/* Self-launch: start N ranks of this very command.                      */
/* --------------------------------------------------------------------- */

/* Through the launcher (src/launch): the children get the DT_* job
 * environment, a failing rank stops the others with a summary, and nothing
 * outlives the command. */
int cli_bench_self_launch(int np, const cli_args *a) {
    char exe[4096];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0)
        return 1;
    exe[n] = 0;
    /* the children re-run this command with the same settings, minus --nproc */
    char **cargv = calloc(CLI_MAX_OPTS + 4, sizeof *cargv);
    char *texts[CLI_MAX_OPTS];
    int k = 0, nt = 0;
    cargv[k++] = exe;
    cargv[k++] = "bench";
    cargv[k++] = (char *)a->cmd->name;
    for (int i = 0; a->cmd->opts[i].name; i++) {
        const cli_opt *o = &a->cmd->opts[i];
        const cli_value *v = &a->values[i];
        if (!v->set || strcmp(o->name, "nproc") == 0)
            continue;
        if (o->kind == CLI_FLAG) {
            if (v->b) {
                texts[nt] = malloc(strlen(o->name) + 3);
                sprintf(texts[nt], "--%s", o->name);
                cargv[k++] = texts[nt++];
            }
            continue;
        }
        texts[nt] = malloc(strlen(o->name) + strlen(v->text) + 4);
        sprintf(texts[nt], "--%s=%s", o->name, v->text);
        cargv[k++] = texts[nt++];
    }
    cargv[k] = NULL;
    dt_launch_options o;
    dt_launch_options_init(&o);
    o.nproc = np;
    o.argv = cargv;
    int rc = 1;
    if (dt_launch_run(&o, &rc) != DT_OK)
        fprintf(stderr, "dtrain bench %s: error: %s\n", a->cmd->name, dt_last_error());
    for (int i = 0; i < nt; i++)
        free(texts[i]);
    free(cargv);
    return rc;
}

/* --------------------------------------------------------------------- */

/* seconds the first size warms up for when iterations go by size: the
 * ranks' start-up transient (4 ranks on 2 cores: 8 B allreduce 2.3-2.8 us
 * instead of 1.5-1.8) sometimes outlasted 0.25 s (docs/comm.md) */
#define FIRST_WARM_S 1.0

static double busbw_factor(dt_coll c, int n) {
    switch (c) {
    case DT_COLL_ALLREDUCE: return 2.0 * (n - 1) / n;
    case DT_COLL_BROADCAST: return 1.0;
    default: return (double)(n - 1) / n;
    }
}

/* total bytes (the nccl-tests "size") -> per-rank element count */
static size_t count_for(dt_coll c, size_t bytes, size_t es, int n) {
    size_t elems = bytes / es;
    if (c == DT_COLL_REDUCE_SCATTER || c == DT_COLL_ALLGATHER || c == DT_COLL_ALLTOALL)
        return elems / (size_t)n;
    return elems;
}

static dt_status run_op(dt_group *g, dt_coll c, void *in, void *out, size_t cnt, dt_dtype dt,
                        dt_redop op) {
    switch (c) {
    case DT_COLL_ALLREDUCE: return dt_group_allreduce(g, in, out, cnt, dt, op);
    case DT_COLL_REDUCE_SCATTER: return dt_group_reduce_scatter(g, in, out, cnt, dt, op);
    case DT_COLL_ALLGATHER: return dt_group_allgather(g, in, out, cnt, dt);
    case DT_COLL_BROADCAST: return dt_group_broadcast(g, out, cnt, dt, 0);
    case DT_COLL_ALLTOALL: return dt_group_alltoall(g, in, out, cnt, dt);
    default: return DT_ERR_INVALID;
    }
}

/* Bytes of output a call leaves on each rank. */
static size_t out_bytes(dt_coll c, size_t cnt, size_t es, int n) {
    return c == DT_COLL_ALLGATHER || c == DT_COLL_ALLTOALL ? cnt * es * (size_t)n : cnt * es;
}

/* The consumer of --read: every byte of the output is loaded once, as the
 * code that uses a collective's result would (where the bytes sit after
 * the call, in whose cache, is part of what a collective costs). */
static void read_all(const void *p, size_t bytes) {
    static volatile uint64_t sink;
    const unsigned char *b = p;
    uint64_t s = 0, w;
    for (size_t i = 0; i + 8 <= bytes; i += 8) {
        memcpy(&w, b + i, 8);
        s += w;
    }
    sink += s;
}

/* One timed call: the collective, then with --read its consumer. */
static dt_status call(dt_group *g, dt_coll c, void *in, void *out, size_t cnt, dt_dtype dt,
                      dt_redop op, bool read) {
    dt_status st = run_op(g, c, in, out, cnt, dt, op);
    if (st == DT_OK && read)
        read_all(out, out_bytes(c, cnt, dt_dtype_size(dt), dt_group_size(g)));
    return st;
}

/* small integers, exact in every dtype for any reduction we check */
static void put(void *p, dt_dtype d, size_t i, int v) {
    switch (d) {
    case DT_F32: ((float *)p)[i] = (float)v; break;
    case DT_F64: ((double *)p)[i] = v; break;
    case DT_F16: ((_Float16 *)p)[i] = (_Float16)v; break;
    case DT_BF16: {
        float f = (float)v;
        uint32_t u;
        memcpy(&u, &f, 4);
        ((uint16_t *)p)[i] = (uint16_t)(u >> 16);
        break;
    }
    case DT_I8: ((int8_t *)p)[i] = (int8_t)v; break;
    case DT_U8: ((uint8_t *)p)[i] = (uint8_t)v; break;
    case DT_I32: ((int32_t *)p)[i] = v; break;
    case DT_I64: ((int64_t *)p)[i] = v; break;
    default: break;
    }
}

static int value(int rank, size_t i) { return (int)((i * 7 + (size_t)rank * 3) % 5); }

/* Fill inputs, run once, count wrong elements against the expectation. */
static long check_row(dt_group *g, dt_coll c, char *in, char *out, size_t cnt, dt_dtype dt,
                      dt_redop op, dt_status *st) {
    int n = dt_group_size(g), me = dt_group_rank(g);
    size_t es = dt_dtype_size(dt);
    size_t nin = c == DT_COLL_ALLREDUCE || c == DT_COLL_ALLGATHER ? cnt : cnt * (size_t)n;
    size_t nout = out_bytes(c, cnt, es, n) / es;
    if (c == DT_COLL_BROADCAST) {
        for (size_t i = 0; i < cnt; i++)
            put(out, dt, i, me == 0 ? value(0, i) : 9);
    } else {
        for (size_t i = 0; i < nin; i++)
            put(in, dt, i, value(me, i));
    }
    *st = run_op(g, c, in, out, cnt, dt, op);
    if (*st != DT_OK)
        return -1;
    char *want = malloc(nout * es + 1);
    for (size_t i = 0; i < nout; i++) {
        long v = 0;
        switch (c) {
        case DT_COLL_ALLREDUCE:
        case DT_COLL_REDUCE_SCATTER: {
            size_t idx = c == DT_COLL_ALLREDUCE ? i : (size_t)me * cnt + i;
            v = op == DT_MAX ? 0 : op == DT_MIN ? 4 : op == DT_PROD ? 1 : 0;
            for (int r = 0; r < n; r++) {
                int x = value(r, idx);
                v = op == DT_MAX    ? (x > v ? x : v)
                    : op == DT_MIN  ? (x < v ? x : v)
                    : op == DT_PROD ? v * x
                                    : v + x;
            }
            if (op == DT_AVG)
                v = -1000; /* not checked exactly: skip below */
            break;
        }
        case DT_COLL_ALLGATHER: v = value((int)(i / cnt), i % cnt); break;
        case DT_COLL_BROADCAST: v = value(0, i); break;
        case DT_COLL_ALLTOALL: v = value((int)(i / cnt), (size_t)me * cnt + i % cnt); break;
        default: break;
        }
        put(want, dt, i, (int)v);
    }
    long wrong = 0;
    if (op != DT_AVG && !(op == DT_PROD && n > 4))
        for (size_t i = 0; i < nout; i++)
            wrong += memcmp(out + i * es, want + i * es, es) != 0;
    free(want);
    long total = 0;
    int64_t w = wrong;
    *st = dt_group_allreduce(g, &w, &w, 1, DT_I64, DT_SUM);
    total = (long)w;
    return total;
}

static dt_status parse_sizes(const char *text, size_t *lo, size_t *hi) {
    char buf[64];
    snprintf(buf, sizeof buf, "%s", text);
    char *colon = strchr(buf, ':');
    if (colon)
        *colon = 0;
    DT_CHECK(dt_config_parse_size("--sizes", buf, 1, (size_t)1 << 40, lo));
    *hi = *lo;
    if (colon)
        DT_CHECK(dt_config_parse_size("--sizes", colon + 1, *lo, (size_t)1 << 40, hi));
    return DT_OK;
}

/* Refuse sizes this machine cannot hold before any rank allocates them: a
 * rank that overcommits and touches too much is killed by the kernel's OOM
 * killer, which on a shared machine may choose someone else's process.
 * Each rank holds its input, its output and the check's expected values,
 * and the collective may need up to two more buffers of that size inside
 * (ring work and staging, tree accumulators): about 5x the largest size. */
#define BUFFERS_PER_RANK 5

static void check_memory(const cli_args *a, int local_ranks, size_t hi) {
    uint64_t avail;
    if (!dt_mem_available(&avail))
        return;
    double need = (double)BUFFERS_PER_RANK * (double)hi * local_ranks;
    if (need <= (double)avail)
        return;
    char h[32], n[32], v[32];
    cli_usage_error(a->cmd,
                    "--sizes: the largest size, %s, needs about %s on this machine (%d rank(s) x "
                    "%d buffers of it) but only %s is available",
                    dt_format_bytes((double)hi, h, sizeof h), dt_format_bytes(need, n, sizeof n),
                    local_ranks, BUFFERS_PER_RANK, dt_format_bytes((double)avail, v, sizeof v));
}

/* The alpha-beta model of the sweep into the machine profile (train.h,
 * dt_link_fit): what `dtrain report` draws the collectives against and
 * `dtrain plan --cluster this` prices links with. Only the algorithm the
 * chooser picks (--algo auto) describes what training will see. */
static void store_fit(const cli_args *a, dt_coll coll, const char *transport, int n,
                      const double *bytes, const double *secs, size_t k, bool json) {
    if (strcmp(cli_str(a, "algo"), "auto") != 0 || cli_bool(a, "read") ||
        cli_bool(a, "deterministic"))
        return;
    dt_link_fit f;
    char where[4200] = "";
    dt_status st = dt_link_fit_points(transport, dt_coll_name(coll), n, bytes, secs, k, &f);
    if (st == DT_OK)
        st = dt_profile_save_link(&f, where, sizeof where);
    if (json)
        return;
    if (st != DT_OK) {
        printf("# alpha-beta fit not stored: %s\n", dt_last_error());
        return;
    }
    printf("# alpha-beta fit: %s on %s, %d ranks: alpha %.2f us, beta %.3f GB/s (largest error "
           "%.0f%% over %d sizes); as a ring link: %.2f us, %.3f GB/s; stored in %s\n",
           f.op, f.transport, n, f.alpha * 1e6, f.beta * 1e-9, 100 * f.max_error, f.points,
           f.link_alpha * 1e6, f.link_bw * 1e-9, where);
}

static int run_comm(cli_args *a) {
    int np = (int)cli_int(a, "nproc");
    bool launching = np > 0 && !getenv("DT_RANK") && !getenv("OMPI_COMM_WORLD_RANK");
    dt_coll coll = op_colls[cli_enum(a, "op")];
    dt_redop redop = (dt_redop)cli_enum(a, "redop");
    dt_dtype dt;
    size_t lo, hi;
    dt_status st = dt_dtype_parse(cli_str(a, "dtype"), &dt);
    if (st == DT_OK)
        st = parse_sizes(cli_str(a, "sizes"), &lo, &hi);
    if (st != DT_OK)
        cli_usage_error(a->cmd, "%s", dt_last_error());
    if (launching) {
        check_memory(a, np, hi);
        return cli_bench_self_launch(np, a);
    }
    /* Under a launcher: every rank judges for the ranks of its host (all
     * refuse together instead of leaving the others waiting). */
    const char *local = getenv("DT_LOCAL_WORLD_SIZE");
    check_memory(a, local && atoi(local) > 0 ? atoi(local) : 1, hi);
    /* the flags win over the environment: hand them to comm through it */
    setenv("DT_ALGO", cli_str(a, "algo"), 1);
    setenv("DT_TRANSPORT", cli_str(a, "transport"), 1);
    if (cli_bool(a, "deterministic"))
        setenv("DT_DETERMINISTIC", "1", 1);
    dt_group *g = NULL;
    st = dt_group_init_from_env(&g);
    if (st != DT_OK)
        return cli_fail(st);
    int n = dt_group_size(g), me = dt_group_rank(g);
    size_t es = dt_dtype_size(dt);
    bool json = cli_bool(a, "json"), check = cli_bool(a, "check"), read = cli_bool(a, "read");
    size_t maxbytes = hi + (size_t)n * es + 64;
    char *in = dt_alloc(maxbytes), *out = dt_alloc(maxbytes);
    if (!in || !out) {
        dt_group_destroy(g);
        return cli_fail(DT_ERR_NOMEM);
    }
    memset(in, 0, maxbytes);
    memset(out, 0, maxbytes);
    if (me == 0 && !json) {
        printf("# dtrain bench comm: %s %s %s, %d ranks, transport %s, algo %s%s\n",
               dt_coll_name(coll), dt_dtype_name(dt), dt_redop_name(redop), n,
               dt_group_transport(g), cli_str(a, "algo"), read ? ", every call's output read" : "");
        printf("# %12s %12s %10s %12s %12s %8s %7s\n", "size(B)", "count", "time(us)",
               "algbw(GB/s)", "busbw(GB/s)", "algo", "#wrong");
    }
    int rc = 0;
    bool first = true;
    /* The rows for the alpha-beta fit (rank 0). */
    enum { MAX_ROWS = 64 };
    double fit_bytes[MAX_ROWS], fit_secs[MAX_ROWS];
    size_t nfit = 0;
    long wrong_total = 0;
    for (size_t bytes = lo; bytes <= hi && st == DT_OK; bytes *= 2) {
        size_t cnt = count_for(coll, bytes, es, n);
        if (cnt == 0)
            continue;
        long wrong = check ? check_row(g, coll, in, out, cnt, dt, redop, &st) : 0;
        if (st != DT_OK)
            break;
        int iters = (int)cli_int(a, "iters"), warm = (int)cli_int(a, "warmup");
        bool by_size = iters == 0;
        if (by_size) {
            size_t it = ((size_t)256 << 20) / (bytes + 4096);
            iters = it < 5 ? 5 : it > 2000 ? 2000 : (int)it;
        }
        /* The first size warms up for as many calls as it times: with 3
         * warm-up calls the first row of tiny messages often took 30-50 us
         * per call instead of 0.4 us, never with 3000 (a start-up transient
         * of ~0.1 s; its cause is not pinned down: an adaptive spin did not
         * remove it). Later sizes run on a warm pair. */
        if (first && warm < iters)
            warm = iters;
        for (int i = 0; i < warm && st == DT_OK; i++)
            st = call(g, coll, in, out, cnt, dt, redop, read);
        /* Counting calls is not enough at the sizes where a call is short
         * but not tiny: a 1 MiB 2-rank allgather as the first row took
         * 91-206 us per call after its 255 warm-up calls (~20 ms) and 42-45
         * us after 1000 or as a later row. So with iterations by size, the
         * first size also warms up for FIRST_WARM_S seconds, in batches of
         * `iters` calls; the ranks agree on the elapsed time (max) so that
         * all make the same calls. */
        for (double t0 = dt_now(), el = 0; first && by_size && st == DT_OK && el < FIRST_WARM_S;) {
            for (int i = 0; i < iters && st == DT_OK; i++)
                st = call(g, coll, in, out, cnt, dt, redop, read);
            el = dt_now() - t0;
            if (st == DT_OK)
                st = dt_group_allreduce(g, &el, &el, 1, DT_F64, DT_MAX);
        }
        first = false;
        if (st == DT_OK)
            st = dt_group_barrier(g);
        double t0 = dt_now();
        for (int i = 0; i < iters && st == DT_OK; i++)
            st = call(g, coll, in, out, cnt, dt, redop, read);
        double t = (dt_now() - t0) / iters;
        const char *algo = dt_algo_name(dt_group_last_algo(g));
        if (st != DT_OK)
            break;
        st = dt_group_allreduce(g, &t, &t, 1, DT_F64, DT_MAX); /* the slowest rank counts */
        if (st != DT_OK)
            break;
        double algbw = (double)bytes / t * 1e-9, busbw = algbw * busbw_factor(coll, n);
        if (wrong)
            rc = 1;
        wrong_total += wrong;
        if (nfit < MAX_ROWS) {
            fit_bytes[nfit] = (double)bytes;
            fit_secs[nfit++] = t;
        }
        if (me == 0) {
            if (json)
                cli_json_line(json_pack(
                    "{s:s, s:s, s:i, s:s, s:I, s:I, s:o, s:o, s:o, s:s, s:I}", "op",
                    dt_coll_name(coll), "dtype", dt_dtype_name(dt), "ranks", n, "transport",
                    dt_group_transport(g), "size", (json_int_t)bytes, "count", (json_int_t)cnt,
                    "time_us", cli_json_num(t * 1e6), "algbw", cli_json_num(algbw), "busbw",
                    cli_json_num(busbw), "algo", algo, "wrong", (json_int_t)wrong));
            else
                printf("  %12zu %12zu %10.2f %12.3f %12.3f %8s %7ld\n", bytes, cnt, t * 1e6, algbw,
                       busbw, algo, wrong);
            fflush(stdout);
        }
    }
    dt_free(in);
    dt_free(out);
    if (st != DT_OK) {
        int code = cli_fail(st);
        dt_group_destroy(g);
        return code;
    }
    if (me == 0 && n > 1 && cli_bool(a, "profile") && wrong_total == 0 && nfit >= 3)
        store_fit(a, coll, dt_group_transport(g), n, fit_bytes, fit_secs, nfit, json);
    dt_group_destroy(g);
    return rc;
}

const cli_cmd cli_bench_comm = {
    .name = "comm",
    .parent = "bench",
    .summary = "collective bandwidth/latency (nccl-tests columns)",
    .usage = "dtrain bench comm [--nproc N] [--op OP] [--sizes MIN:MAX] [--dtype T] [--algo A]",
    .description = "Times one collective over doubling sizes and prints size, count, time,\n"
                   "algbw, busbw, the algorithm that ran and #wrong (elements that differ\n"
                   "from the exact expected result on any rank). Start it with --nproc N, or\n"
                   "under `dtrain launch`, mpirun, srun or torchrun: each rank finds the job\n"
                   "from the launcher's own variables, nothing needs exporting.",
    .opts = comm_opts,
    .run = run_comm,
    .aliases = comm_aliases,
};

/* --------------------------------------------------------------------- */
/* memcpy bandwidth                                                       */
/* --------------------------------------------------------------------- */

static const cli_opt memcpy_opts[] = {
    {"size", 0, CLI_SIZE, "SIZE", "256M", NULL, "bytes per buffer", NULL, 1 << 20, 1e12},
    {"threads", 't', CLI_INT, "N", "0", NULL,
     "concurrent copies (0: OMP_NUM_THREADS, else one per CPU)", NULL, 0, 256},
    {"iters", 0, CLI_INT, "N", "10", NULL, "copies per thread", NULL, 1, 1e6},
    {0},
};

typedef struct mc_arg {
    size_t size;
    int iters;
    double secs;
} mc_arg;

static void *mc_main(void *p) {
    mc_arg *m = p;
    char *a = dt_alloc(m->size), *b = dt_alloc(m->size);
    if (!a || !b) {
        m->secs = -1;
        return NULL;
    }
    memset(a, 1, m->size);
    memset(b, 2, m->size);
    memcpy(b, a, m->size); /* fault in, warm up */
    double t0 = dt_now();
    for (int i = 0; i < m->iters; i++)
        memcpy(i % 2 ? a : b, i % 2 ? b : a, m->size);
    m->secs = dt_now() - t0;
    dt_free(a);
    dt_free(b);
    return NULL;
}

static int run_memcpy(cli_args *a) {
    int nt = (int)cli_int(a, "threads");
    if (nt == 0)
        nt = cli_default_threads();
    size_t size = cli_size(a, "size");
    int iters = (int)cli_int(a, "iters");
    printf("# memcpy bandwidth: %d thread(s), %zu MiB buffers; copy GB/s counts bytes copied,\n"
           "# traffic GB/s counts bytes read + written (what memory must sustain; stored in the\n"
           "# machine profile as the roofline's memory roof)\n",
           nt, size >> 20);
    printf("# %8s %12s %14s\n", "threads", "copy(GB/s)", "traffic(GB/s)");
    for (int t = 1; t <= nt; t *= 2) {
        pthread_t th[256];
        mc_arg args[256];
        for (int i = 0; i < t; i++) {
            args[i] = (mc_arg){size, iters, 0};
            pthread_create(&th[i], NULL, mc_main, &args[i]);
        }
        double worst = 0;
        for (int i = 0; i < t; i++) {
            pthread_join(th[i], NULL);
            if (args[i].secs < 0)
                return cli_fail(DT_ERR_NOMEM);
            if (args[i].secs > worst)
                worst = args[i].secs;
        }
        double copy = (double)size * iters * t / worst * 1e-9;
        printf("  %8d %12.2f %14.2f\n", t, copy, 2 * copy);
        /* The machine profile's memory roof for t threads (docs/observability.md). */
        if (dt_profile_save_mem_bw(t, 2 * copy * 1e9) != DT_OK)
            fprintf(stderr, "dtrain bench memcpy: not stored in the machine profile: %s\n",
                    dt_last_error());
        if (t < nt && t * 2 > nt)
            t = nt / 2; /* end exactly at nt */
    }
    return 0;
}

const cli_cmd cli_bench_memcpy = {
    .name = "memcpy",
    .parent = "bench",
    .summary = "memory bandwidth of memcpy (the ceiling for shared-memory collectives)",
    .usage = "dtrain bench memcpy [--size SIZE] [--threads N]",
    .opts = memcpy_opts,
    .run = run_memcpy,
};
