/*
 * group.c — groups: bootstrap from the environment, topology, split, the
 * per-group work queue and progress thread, failure bookkeeping, and the
 * public collective entry points.
 *
 * Invariants:
 *   1. Operations on a group execute one at a time, in issue order; each gets
 *      the next sequence number at issue time (that number travels in every
 *      frame, so ranks that disagree on the order are caught).
 *   2. An operation executes either on the progress thread or, when the
 *      group is idle and the call is blocking, inline on the caller (saves
 *      two thread hand-offs for small messages). `busy` guards both.
 *   3. The first failure is sticky: the group tells its peers, drops every
 *      queued transfer (they point into user buffers) and fails every later
 *      operation with the same status.
 *   4. Arguments are validated before anything is queued or sent.
 */
#include "backend.h"
#include "dtrain/trace.h"
#include "jobenv.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const dt__backend *const backends[] = {
    &dt__backend_native,
#ifdef DT_HAVE_MPI
    &dt__backend_mpi,
#endif
};
#define NBACKENDS (sizeof backends / sizeof backends[0])

/* ------------------------------------------------------------------------ */
/* Job: what the world group and its sub-groups share                       */
/* ------------------------------------------------------------------------ */

static void job_release(dt__job *job, bool clean) {
    if (!job || atomic_fetch_sub(&job->refs, 1) != 1)
        return;
    char saved[1024]; /* the store calls below must not eat the caller's error */
    snprintf(saved, sizeof saved, "%s", dt_last_error());
    if (job->store) {
        /* Rank 0 serves the store: it waits (at most 10 s, 2 s after a
         * failure) until every rank has said it is done with it, so that a
         * slow rank still finishing its bootstrap is not cut off. */
        int64_t n = 0;
        if (dt__store_add(job->store, "exit", 1, &n) == DT_OK && job->server) {
            double dl = dt_now() + (clean ? (job->timeout < 10 ? job->timeout : 10) : 2.0);
            while (n < job->world_size && dt_now() < dl) {
                dt_sleep_ms(2);
                if (dt__store_add(job->store, "exit", 0, &n) != DT_OK)
                    break;
            }
        }
        dt__store_close(job->store);
    }
    dt_error_clear();
    if (saved[0])
        dt_error_set(DT_OK, "%s", saved);
    dt__store_server_stop(job->server);
    if (job->host_keys)
        for (int i = 0; i < job->world_size; i++)
            free(job->host_keys[i]);
    free(job->host_keys);
    free(job->pids);
    pthread_mutex_destroy(&job->store_mu);
    free(job);
}

static void host_key(char *out, size_t n) {
    char host[256] = "localhost", boot[64] = "";
    gethostname(host, sizeof host - 1);
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    if (f) {
        if (!fgets(boot, sizeof boot, f))
            boot[0] = 0;
        fclose(f);
        boot[strcspn(boot, "\n")] = 0;
    }
    /* DT_NODE_RANK lets `dtrain launch` (and the tests) say which ranks are
     * one node even when they happen to share a kernel. */
    const char *node = getenv("DT_NODE_RANK");
    snprintf(out, n, "%s|%s|%s", host, boot, node && *node ? node : "-");
}

static bool token_ok(const char *tok) {
    return tok && strlen(tok) == DT__TOKEN_LEN &&
           strspn(tok, "0123456789abcdefABCDEF") == DT__TOKEN_LEN;
}

static dt_status job_create(const dt_group_options *o, dt__job **out) {
    int rank = o->rank, size = o->size;
    dt__job *job = calloc(1, sizeof *job);
    if (!job)
        return dt_error_set(DT_ERR_NOMEM, "comm: out of memory");
    dt_status st = DT_OK;
    pthread_mutex_init(&job->store_mu, NULL);
    atomic_store(&job->refs, 1);
    job->world_rank = rank;
    job->world_size = size;
    job->timeout = o->timeout;
    if (job->timeout <= 0)
        DT_CHECK_GOTO(dt_config_env_double("DT_TIMEOUT", 300, 0.1, 1e7, &job->timeout), st, fail);
    if (o->token)
        memcpy(job->token, o->token, DT__TOKEN_LEN);
    else
        memset(job->token, '0', DT__TOKEN_LEN); /* a world of one talks to nobody */
    snprintf(job->job_id, sizeof job->job_id, "%s", o->job_id && *o->job_id ? o->job_id : "dtrain");
    snprintf(job->master, sizeof job->master, "%s",
             o->master_addr && *o->master_addr ? o->master_addr : "127.0.0.1");
    job->master_port = o->master_port;
    host_key(job->host, sizeof job->host);
    dt__net_local_addr(job->master, job->addr, sizeof job->addr);
    job->host_keys = calloc((size_t)size, sizeof *job->host_keys);
    job->pids = calloc((size_t)size, sizeof *job->pids);
    if (!job->host_keys || !job->pids) {
        st = dt_error_set(DT_ERR_NOMEM, "comm: out of memory");
        goto fail;
    }
    if (size == 1) {
        job->host_keys[0] = strdup(job->host);
        job->pids[0] = getpid();
        *out = job;
        return DT_OK;
    }
    if (rank == 0) {
        int bound;
        DT_CHECK_GOTO(
            dt__store_server_start(NULL, job->master_port, job->token, &job->server, &bound), st,
            fail);
        job->master_port = bound;
        if (o->on_listen)
            DT_CHECK_GOTO(o->on_listen(o->on_listen_arg, bound), st, fail);
    }
    DT_CHECK_GOTO(
        dt__store_connect(job->master, job->master_port, job->token, job->timeout, &job->store), st,
        fail);
    char key[64], val[512];
    snprintf(key, sizeof key, "w/info/%d", rank);
    snprintf(val, sizeof val, "%d %s %s", (int)getpid(), job->addr, job->host);
    DT_CHECK_GOTO(dt__store_set(job->store, key, val, strlen(val) + 1), st, fail);
    for (int r = 0; r < size; r++) {
        void *v = NULL;
        size_t len;
        snprintf(key, sizeof key, "w/info/%d", r);
        DT_CHECK_GOTO(dt__store_wait(job->store, key, &v, &len), st, fail);
        int pid = 0, consumed = 0;
        char addr[64];
        if (sscanf(v, "%d %63s %n", &pid, addr, &consumed) < 2 || consumed <= 0 || pid <= 0) {
            dt_free(v);
            st = dt_error_set(DT_ERR_PROTOCOL, "bad rank info for rank %d in the store", r);
            goto fail;
        }
        job->pids[r] = pid;
        job->host_keys[r] = strdup((char *)v + consumed);
        dt_free(v);
        if (!job->host_keys[r]) {
            st = dt_error_set(DT_ERR_NOMEM, "comm: out of memory");
            goto fail;
        }
    }
    *out = job;
    return DT_OK;
fail:
    job_release(job, false);
    return st;
}

/* ------------------------------------------------------------------------ */
/* Group creation and destruction                                           */
/* ------------------------------------------------------------------------ */

static void *progress_main(void *arg);

static void group_free(dt_group *g, bool clean) {
    if (!g)
        return;
    if (g->thread) {
        pthread_mutex_lock(&g->mu);
        g->stop = true;
        pthread_cond_broadcast(&g->work_cv);
        pthread_mutex_unlock(&g->mu);
        dt_thread_join(g->thread);
    }
    if (g->backend && g->backend->fini)
        g->backend->fini(g, clean);
    if (g->shm)
        g->shm->ops->destroy(g->shm, clean);
    if (g->tcp)
        g->tcp->ops->destroy(g->tcp, clean);
    if (g->host_ranks)
        for (int h = 0; h < g->nhosts; h++)
            free(g->host_ranks[h]);
    free(g->host_ranks);
    free(g->host_size);
    free(g->world);
    free(g->host);
    free(g->leaders);
    free(g->ident);
    free(g->tp);
    free(g->sent);
    free(g->rcvd);
    dt_free(g->scratch);
    pthread_mutex_destroy(&g->mu);
    pthread_cond_destroy(&g->work_cv);
    pthread_cond_destroy(&g->done_cv);
    job_release(g->job, clean);
    free(g);
}

/* The group's number in trace events (FNV-1a of its id, the same on every
 * member) and the link its operations cross (after the backend's init,
 * which may rename the transport). */
static void trace_ids(dt_group *g) {
    uint32_t h = 2166136261u;
    for (const char *c = g->id; *c; c++)
        h = (h ^ (uint8_t)*c) * 16777619u;
    g->trace_id = h;
    g->trace_link = !strcmp(g->tpname, "shm")       ? DT_TRACE_LINK_SHM
                    : !strcmp(g->tpname, "tcp")     ? DT_TRACE_LINK_TCP
                    : !strcmp(g->tpname, "shm+tcp") ? DT_TRACE_LINK_MIXED
                    : !strcmp(g->tpname, "mpi")     ? DT_TRACE_LINK_MPI
                                                    : DT_TRACE_LINK_SELF;
}

static dt_status group_create(dt__job *job, const char *id, int rank, int size, const int *world,
                              dt_group **out) {
    dt_status st = DT_OK;
    dt_group *g = calloc(1, sizeof *g);
    if (!g)
        return dt_error_set(DT_ERR_NOMEM, "comm: out of memory");
    atomic_fetch_add(&job->refs, 1);
    g->job = job;
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->work_cv, NULL);
    pthread_cond_init(&g->done_cv, NULL);
    atomic_store(&g->lost, -1);
    snprintf(g->id, sizeof g->id, "%s", id);
    g->rank = rank;
    g->size = size;
    DT_CHECK_GOTO(dt__config_read(&g->cfg), st, fail);
    g->cfg.timeout = job->timeout; /* DT_TIMEOUT, unless dt_group_init was given one */
    g->world = malloc((size_t)size * sizeof *g->world);
    g->host = malloc((size_t)size * sizeof *g->host);
    g->ident = malloc((size_t)size * sizeof *g->ident);
    g->tp = calloc((size_t)size, sizeof *g->tp);
    g->host_size = calloc((size_t)size, sizeof *g->host_size);
    g->host_ranks = calloc((size_t)size, sizeof *g->host_ranks);
    g->leaders = malloc((size_t)size * sizeof *g->leaders);
    g->sent = calloc((size_t)size, sizeof *g->sent);
    g->rcvd = calloc((size_t)size, sizeof *g->rcvd);
    if (!g->sent || !g->rcvd || !g->world || !g->host || !g->ident || !g->tp || !g->host_size ||
        !g->host_ranks || !g->leaders) {
        st = dt_error_set(DT_ERR_NOMEM, "comm: out of memory");
        goto fail;
    }
    /* Topology: host indices in order of first appearance. */
    for (int r = 0; r < size; r++) {
        g->world[r] = world[r];
        g->ident[r] = r;
        const char *key = job->host_keys[world[r]];
        int h = 0;
        while (h < g->nhosts && strcmp(job->host_keys[world[g->leaders[h]]], key) != 0)
            h++;
        if (h == g->nhosts) {
            g->leaders[h] = r;
            g->host_ranks[h] = malloc((size_t)size * sizeof(int));
            if (!g->host_ranks[h]) {
                st = dt_error_set(DT_ERR_NOMEM, "comm: out of memory");
                goto fail;
            }
            g->nhosts++;
        }
        g->host[r] = h;
        g->host_ranks[h][g->host_size[h]++] = r;
    }
    int myh = g->host[rank];
    g->local = g->host_ranks[myh];
    g->local_size = g->host_size[myh];
    for (int i = 0; i < g->local_size; i++)
        if (g->local[i] == rank)
            g->local_rank = i;
    /* When every local rank can have a core of its own, a short spin (50 us)
     * takes small-message latency from ~1.5 us to ~0.5 us and costs nothing
     * measurable in training (docs/comm.md). Oversubscribed, a spinning
     * waiter keeps the core its peer needs, so there the default is to
     * yield, up to 1000 times (~1 ms when nothing else runs), then sleep on
     * the futex. */
    if (g->cfg.spin < 0)
        g->cfg.spin = g->local_size <= dt_cpu_count() ? 50 : 0;
    if (g->cfg.yield < 0)
        g->cfg.yield = 1000;
    /* TCP socket buffers: 4 MiB lets a sender with a core of its own stream
     * a whole piece without waiting for its receiver. When ranks share
     * cores the receiver is often not running, and a smaller window (1 MiB)
     * hands the core over sooner and keeps the bytes in flight in cache
     * (4 ranks on 2 cores, 16 MiB allgather: 12.6 -> 10.9 ms; 2 ranks on 2
     * cores, 8 MiB reduce-scatter: 2.3 ms with 4 MiB, 4.4 ms with 1 MiB). */
    if (g->cfg.tcp_buffer == SIZE_MAX)
        g->cfg.tcp_buffer = g->local_size <= dt_cpu_count() ? 4 << 20 : 1 << 20;

    /* Transports: shared memory inside a host, TCP between hosts. */
    int *shm_peers = malloc((size_t)size * sizeof(int)), nshm = 0;
    int *tcp_peers = malloc((size_t)size * sizeof(int)), ntcp = 0;
    if (!shm_peers || !tcp_peers) {
        free(shm_peers);
        free(tcp_peers);
        st = dt_error_set(DT_ERR_NOMEM, "comm: out of memory");
        goto fail;
    }
    for (int r = 0; r < size; r++) {
        if (r == rank)
            continue;
        if (g->host[r] == myh && g->cfg.transport != 2)
            shm_peers[nshm++] = r;
        else
            tcp_peers[ntcp++] = r;
    }
    if (nshm > 0)
        st = dt__shm_create(g, shm_peers, nshm, &g->shm);
    if (st == DT_OK && ntcp > 0)
        st = dt__tcp_create(g, tcp_peers, ntcp, &g->tcp);
    if (st == DT_OK) {
        for (int i = 0; i < nshm; i++)
            g->tp[shm_peers[i]] = g->shm;
        for (int i = 0; i < ntcp; i++)
            g->tp[tcp_peers[i]] = g->tcp;
    }
    free(shm_peers);
    free(tcp_peers);
    if (st != DT_OK)
        goto fail;
    snprintf(g->tpname, sizeof g->tpname, "%s",
             g->shm && g->tcp ? "shm+tcp"
             : g->shm         ? "shm"
             : g->tcp         ? "tcp"
                              : "self");

    const char *bname = getenv("DT_BACKEND");
    if (!bname || !*bname)
        bname = "native";
    for (size_t i = 0; i < NBACKENDS; i++)
        if (strcmp(backends[i]->name, bname) == 0)
            g->backend = backends[i];
    if (!g->backend) {
        st = dt_error_set(DT_ERR_UNSUPPORTED,
                          "DT_BACKEND=%s: this build has only the native "
                          "backend (see src/comm/backend.h)",
                          bname);
        goto fail;
    }
    if (g->cfg.deterministic && g->backend != &dt__backend_native) {
        st = dt_error_set(DT_ERR_UNSUPPORTED,
                          "DT_DETERMINISTIC=1 needs the native backend (DT_BACKEND=%s reduces "
                          "in an order dtrain does not control)",
                          bname);
        goto fail;
    }
    DT_ASSERT(g->backend->api_version == DT__BACKEND_API);
    if (g->backend->init)
        DT_CHECK_GOTO(g->backend->init(g), st, fail);
    trace_ids(g);
    g->last_progress = dt_now();
    DT_CHECK_GOTO(dt_thread_create(&g->thread, "dt-comm", progress_main, g), st, fail);
    DT_DEBUG("comm", "group %s: rank %d of %d, %d host(s), %d local, transport %s", g->id, rank,
             size, g->nhosts, g->local_size, g->tpname);
    *out = g;
    return DT_OK;
fail:
    group_free(g, false);
    return st;
}

dt_status dt_group_init(dt_group **out, const dt_group_options *o) {
    if (!out || !o)
        return dt_error_set(DT_ERR_INVALID, "dt_group_init: NULL argument");
    *out = NULL;
    if (o->size < 1 || o->rank < 0 || o->rank >= o->size)
        return dt_error_set(DT_ERR_INVALID, "dt_group_init: rank %d is not a rank of a group of %d",
                            o->rank, o->size);
    if (o->master_port < 0 || o->master_port > 65535 || (o->master_port == 0 && o->rank != 0))
        return dt_error_set(DT_ERR_INVALID,
                            "dt_group_init: master port %d (1..65535; 0 only on rank 0)",
                            o->master_port);
    if (o->token ? !token_ok(o->token) : o->size > 1)
        return dt_error_set(DT_ERR_INVALID,
                            "dt_group_init: the token must be %d hex digits, the same on every "
                            "rank; got \"%.40s\"",
                            DT__TOKEN_LEN, o->token ? o->token : "(null)");
    int rank = o->rank, size = o->size;
    dt__job *job = NULL;
    DT_CHECK(job_create(o, &job));
    int *world = malloc((size_t)size * sizeof *world);
    if (!world) {
        job_release(job, false);
        return dt_error_set(DT_ERR_NOMEM, "comm: out of memory");
    }
    for (int r = 0; r < size; r++)
        world[r] = r;
    dt_status st = group_create(job, "w", rank, size, world, out);
    free(world);
    job_release(job, st == DT_OK); /* the group holds its own reference */
    if (st != DT_OK)
        dt_error_prefix("rank %d: creating the world group", rank);
    if (st == DT_OK && (*out)->cfg.topo_probe && size > 1) { /* DT_TOPO_PROBE=1 */
        dt_topology topo;
        st = dt_group_probe(*out, false, 256 << 10, &topo, NULL, NULL);
        if (st != DT_OK) {
            dt_error_prefix("rank %d: DT_TOPO_PROBE", rank);
            dt_group_destroy(*out);
            *out = NULL;
        }
    }
    return st;
}

dt_status dt_group_init_from_env(dt_group **out) {
    if (!out)
        return dt_error_set(DT_ERR_INVALID, "dt_group_init_from_env: out is NULL");
    *out = NULL;
    /* Under mpirun/srun: the meeting place (MPI bootstrap when available). */
    DT_CHECK(dt__jobenv_export());
    /* Rank and size from DT_*, Open MPI, MPICH/PMI or a Slurm step, in that
     * order (jobenv.c); a process without any of them is a world of one. */
    dt__jobenv e;
    DT_CHECK(dt__jobenv_read(&e));
    dt_log_set_rank(e.rank);
    int64_t port;
    DT_CHECK(dt_config_env_int("DT_MASTER_PORT", 29500, 1, 65535, &port));
    const char *tok = getenv("DT_JOB_TOKEN");
    if (tok && *tok && !token_ok(tok))
        return dt_error_set(DT_ERR_INVALID, "DT_JOB_TOKEN must be %d hex digits, got \"%.40s\"",
                            DT__TOKEN_LEN, tok);
    if (!(tok && *tok) && e.size > 1)
        return dt_error_set(DT_ERR_INVALID,
                            "DT_JOB_TOKEN is not set (every rank of a job needs "
                            "the same %d-hex-digit secret; `dtrain launch` sets it)",
                            DT__TOKEN_LEN);
    dt_group_options o = {.rank = e.rank,
                          .size = e.size,
                          .master_addr = getenv("DT_MASTER_ADDR"),
                          .master_port = (int)port,
                          .token = tok && *tok ? tok : NULL,
                          .job_id = getenv("DT_JOB_ID")};
    return dt_group_init(out, &o);
}

void dt_group_destroy(dt_group *g) {
    if (!g)
        return;
    group_free(g, atomic_load(&g->failed) == 0);
}

void dt_group_abort(dt_group *g) {
    if (!g)
        return;
    atomic_store(&g->aborted, 1);
    /* Thread-safe parts only: the owner thread notices `aborted` within one
     * sleep and fails its operation; peers learn it from our transports. */
    if (g->shm)
        g->shm->ops->abort(g->shm, DT_ERR_ABORTED, -1, 0, false);
    if (g->tcp)
        g->tcp->ops->abort(g->tcp, DT_ERR_ABORTED, -1, 0, false);
    pthread_mutex_lock(&g->mu);
    pthread_cond_broadcast(&g->work_cv);
    pthread_cond_broadcast(&g->done_cv);
    pthread_mutex_unlock(&g->mu);
}

/* The boot id part of a host key ("host|boot|node"). */
static void boot_of(const char *key, char *out, size_t len) {
    const char *a = strchr(key, '|'), *b = a ? strchr(a + 1, '|') : NULL;
    snprintf(out, len, "%.*s", a && b ? (int)(b - a - 1) : 0, a ? a + 1 : "");
}

dt_status dt_group_clock_sample(dt_group *g, int probes, dt_clock_sample *out) {
    if (!g || !out || probes < 1 || probes > 10000)
        return dt_error_set(DT_ERR_INVALID, "dt_group_clock_sample: bad arguments (probes %d)",
                            probes);
    dt__job *job = g->job;
    uint64_t now = dt_trace_now();
    *out = (dt_clock_sample){.local_ns = (double)now, .same_kernel = true};
    if (!job->store || job->world_rank == 0)
        return DT_OK;
    char mine[80], theirs[80];
    boot_of(job->host_keys[job->world_rank], mine, sizeof mine);
    boot_of(job->host_keys[0], theirs, sizeof theirs);
    out->same_kernel = mine[0] && strcmp(mine, theirs) == 0;
    double best = -1;
    dt_status st = DT_OK;
    for (int i = 0; i < probes && st == DT_OK; i++) {
        uint64_t t1, T, t2;
        st = dt__store_time(job->store, &t1, &T, &t2);
        if (st != DT_OK)
            break;
        double rtt = (double)(t2 - t1);
        if (best < 0 || rtt < best) {
            best = rtt;
            out->local_ns = 0.5 * ((double)t1 + (double)t2);
            out->offset_ns = (double)T - out->local_ns;
            out->error_ns = 0.5 * rtt;
        }
    }
    if (st != DT_OK)
        dt_error_prefix("measuring the clock offset to rank 0");
    return st;
}

int dt_group_rank(const dt_group *g) { return g ? g->rank : -1; }
int dt_group_size(const dt_group *g) { return g ? g->size : 0; }
int dt_group_world_rank(const dt_group *g, int r) {
    return g && r >= 0 && r < g->size ? g->world[r] : -1;
}
int dt_group_local_size(const dt_group *g) { return g ? g->local_size : 0; }
int dt_group_local_rank(const dt_group *g) { return g ? g->local_rank : -1; }
const char *dt_group_transport(const dt_group *g) { return g ? g->tpname : "none"; }
dt_algo dt_group_last_algo(const dt_group *g) {
    return g ? (dt_algo)atomic_load(&((dt_group *)g)->last_algo) : DT_ALGO_AUTO;
}
dt_algo dt_group_algo_for(const dt_group *g, dt_coll coll, size_t bytes) {
    return g ? dt__tune_choose(g, coll, bytes) : DT_ALGO_AUTO;
}

/* ------------------------------------------------------------------------ */
/* Execution                                                                */
/* ------------------------------------------------------------------------ */

/* The first failure is sticky and told to every peer, with the collective
 * it happened in (op->desc.seq; 0 for send/recv/batch, numbered per peer). */
static void fail_group(dt_group *g, const dt__op *op, dt_status st) {
    int expected = 0;
    if (atomic_compare_exchange_strong(&g->failed, &expected, (int)st)) {
        snprintf(g->failmsg, sizeof g->failmsg, "%s", dt_last_error());
        int lost = atomic_load(&g->lost);
        dt_status tell = st == DT_ERR_MISMATCH ? DT_ERR_MISMATCH : DT_ERR_PEER;
        uint64_t seq = dt__is_p2p(op->coll) ? 0 : op->desc.seq;
        if (g->shm)
            g->shm->ops->abort(g->shm, tell, lost, seq, true);
        if (g->tcp)
            g->tcp->ops->abort(g->tcp, tell, lost, seq, true);
    }
    if (g->shm)
        g->shm->ops->reset(g->shm);
    if (g->tcp)
        g->tcp->ops->reset(g->tcp);
}

/* Payload bytes one rank contributes to op (a batch: all its transfers). */
static uint64_t op_bytes(const dt__op *op) {
    if (op->coll != DT_COLL_BATCH)
        return (uint64_t)op->count * dt_dtype_size(op->dtype);
    uint64_t b = 0;
    for (size_t i = 0; i < op->count; i++)
        b += (uint64_t)op->items[i].p.count * dt_dtype_size(op->items[i].p.dtype);
    return b;
}

/* The trace event of an operation that ran from t0 until now. */
static void trace_op(const dt_group *g, const dt_work *w, uint64_t t0, dt_trace_cat cat) {
    const dt__op *op = &w->op;
    int peer = op->coll == DT_COLL_BATCH ? (op->count ? op->items[0].p.peer : -1) : op->root;
    dt_trace_event e = {.t0 = t0,
                        .name = dt_coll_name(op->coll),
                        .t_issue = w->t_issue,
                        .bytes = op_bytes(op),
                        .group = g->trace_id,
                        .seq = (uint32_t)op->desc.seq,
                        .idx = op->coll == DT_COLL_BATCH ? (int32_t)op->count : -1,
                        .peer = (int16_t)peer,
                        .ranks = (uint16_t)g->size,
                        .cat = (uint8_t)cat,
                        .algo = (uint8_t)op->algo,
                        .link = g->trace_link,
                        .dtype = (uint8_t)op->dtype};
    dt_trace_put(&e);
}

static void execute(dt_group *g, dt_work *w) {
    dt__op *op = &w->op;
    dt_status st;
    uint64_t t_start = dt_trace_begin();
    int failed = atomic_load(&g->failed);
    if (failed) {
        char d[160];
        dt__desc_format(&op->desc, d, sizeof d);
        st = dt_error_set((dt_status)failed, "%s: group %s failed earlier: %s", d, g->id,
                          g->failmsg);
    } else if (atomic_load(&g->aborted)) {
        st = dt_error_set(DT_ERR_ABORTED, "group %s was aborted", g->id);
        fail_group(g, op, st);
    } else {
        dt_error_clear();
        dt_status (*run)(dt__op *) = g->backend->run[op->coll];
        if (!run) {
            st = dt_error_set(DT_ERR_UNSUPPORTED, "backend %s has no %s", g->backend->name,
                              dt_coll_name(op->coll));
        } else {
            st = run(op);
            if (st == DT_OK && op->redop == DT_AVG && !g->backend->avg_native && g->size > 1) {
                if (op->coll == DT_COLL_ALLREDUCE)
                    dt__scale_avg(op->recv, op->count, op->dtype, g->size);
                else if (op->coll == DT_COLL_REDUCE_SCATTER)
                    dt__scale_avg((char *)op->recv +
                                      (op->send == op->recv
                                           ? (size_t)g->rank * op->count * dt_dtype_size(op->dtype)
                                           : 0),
                                  op->count, op->dtype, g->size);
                else if (op->coll == DT_COLL_REDUCE && op->root == g->rank)
                    dt__scale_avg(op->recv, op->count, op->dtype, g->size);
            }
        }
        if (st != DT_OK) {
            if (atomic_load(&g->aborted) && st != DT_ERR_ABORTED)
                st = dt_error_set(DT_ERR_ABORTED, "group %s was aborted (%s)", g->id,
                                  dt_last_error());
            fail_group(g, op, st);
        }
    }
    w->status = st;
    if (st != DT_OK)
        snprintf(w->err, sizeof w->err, "%s", dt_last_error());
    atomic_store(&g->last_algo, (int)op->algo);
    if (t_start)
        trace_op(g, w, t_start, DT_TRACE_COMM);
}

static void *progress_main(void *arg) {
    dt_group *g = arg;
    dt_log_set_rank(g->job->world_rank);
    char tname[16]; /* the trace's name of this thread: "comm " and the group's id */
    snprintf(tname, sizeof tname, "comm %.10s", g->id);
    dt_trace_name_thread(tname);
    pthread_mutex_lock(&g->mu);
    for (;;) {
        while (!g->stop && (!g->head || g->busy))
            pthread_cond_wait(&g->work_cv, &g->mu);
        if (g->stop && !g->head)
            break;
        if (g->busy || !g->head)
            continue;
        dt_work *w = g->head;
        g->head = w->next;
        if (!g->head)
            g->tail = NULL;
        g->busy = true;
        g->last_progress = dt_now();
        pthread_mutex_unlock(&g->mu);
        execute(g, w);
        pthread_mutex_lock(&g->mu);
        g->busy = false;
        w->done = true;
        g->last_progress = dt_now();
        pthread_cond_broadcast(&g->done_cv);
    }
    pthread_mutex_unlock(&g->mu);
    return NULL;
}

dt_status dt_work_test(dt_work *w, bool *done) {
    if (!w || !done)
        return dt_error_set(DT_ERR_INVALID, "dt_work_test: NULL argument");
    dt_group *g = w->op.g;
    pthread_mutex_lock(&g->mu);
    *done = w->done;
    pthread_mutex_unlock(&g->mu);
    return DT_OK;
}

/* Wait for w to complete and collect its status; frees w if asked. */
static dt_status work_finish(dt_work *w, bool free_it) {
    dt_group *g = w->op.g;
    dt_status st;
    uint64_t t_wait = dt_trace_begin();
    bool ran_here = false;
    pthread_mutex_lock(&g->mu);
    bool was_done = w->done;
    if (!w->done && g->head == w && !g->busy) {
        /* Nobody has started it: run it here, as a blocking call on an idle
         * group does, rather than sleep until the progress thread wakes,
         * runs it and wakes us (two hand-offs: most of the time of a small
         * operation waited for right after it was issued). */
        g->head = w->next;
        if (!g->head)
            g->tail = NULL;
        g->busy = true;
        pthread_mutex_unlock(&g->mu);
        execute(g, w);
        ran_here = true;
        pthread_mutex_lock(&g->mu);
        g->busy = false;
        w->done = true;
        g->last_progress = dt_now();
        if (g->head)
            pthread_cond_signal(&g->work_cv);
    }
    while (!w->done) {
        /* Each operation bounds its own waits by DT_TIMEOUT; this only
         * guards against a progress thread that stopped making any. */
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_sec += 1;
        pthread_cond_timedwait(&g->done_cv, &g->mu, &ts);
        if (!w->done && dt_now() - g->last_progress > g->cfg.timeout + 30) {
            pthread_mutex_unlock(&g->mu);
            char d[160];
            dt__desc_format(&w->op.desc, d, sizeof d);
            /* the handle stays queued: it is leaked rather than freed under
             * the progress thread */
            return dt_error_set(DT_ERR_TIMEOUT, "%s: the progress thread of group %s is stuck", d,
                                g->id);
        }
    }
    pthread_mutex_unlock(&g->mu);
    /* Time the caller spent blocked on an operation another thread ran
     * (one it ran itself is its comm event). */
    if (t_wait && !was_done && !ran_here && !w->inline_run)
        trace_op(g, w, t_wait, DT_TRACE_WAIT);
    st = w->status;
    if (st != DT_OK)
        dt_error_set(st, "%s", w->err);
    if (free_it)
        free(w);
    return st;
}

dt_status dt_work_wait(dt_work *w) {
    if (!w)
        return dt_error_set(DT_ERR_INVALID, "dt_work_wait: NULL handle");
    return work_finish(w, true);
}

/* Number op's messages: collectives in one sequence, point-to-point
 * messages in one per (direction, peer), so that a send and its recv carry
 * the same number whatever else the two ranks do. A batch numbers each
 * transfer and takes no collective number. Under g->mu. */
static void stamp(dt_group *g, dt__op *op) {
    if (op->coll == DT_COLL_BATCH) {
        for (size_t i = 0; i < op->count; i++) {
            dt__p2p_item *it = &op->items[i];
            it->seq = it->p.send ? ++g->sent[it->p.peer] : ++g->rcvd[it->p.peer];
        }
        return;
    }
    op->desc.seq = op->coll == DT_COLL_SEND   ? ++g->sent[op->root]
                   : op->coll == DT_COLL_RECV ? ++g->rcvd[op->root]
                                              : ++g->issued;
}

/* Number w, then run it inline (a blocking call on an idle group: no
 * thread hand-off) or queue it for the progress thread. A blocking call
 * waits here; `heap` says its handle was allocated (and is freed). */
static dt_status start(dt_group *g, dt_work *w, dt_work **work, bool heap) {
    pthread_mutex_lock(&g->mu);
    stamp(g, &w->op);
    if (!work && !g->busy && !g->head) {
        g->busy = true;
        pthread_mutex_unlock(&g->mu);
        execute(g, w);
        pthread_mutex_lock(&g->mu);
        g->busy = false;
        g->last_progress = dt_now();
        /* Only the progress thread can be waiting for `busy` to clear, and
         * only if work was queued meanwhile: no wake-up otherwise (a
         * broadcast here would wake it for nothing on every call). */
        if (g->head)
            pthread_cond_signal(&g->work_cv);
        pthread_mutex_unlock(&g->mu);
        w->done = true;
        return work_finish(w, heap);
    }
    if (g->tail)
        g->tail->next = w;
    else
        g->head = w;
    g->tail = w;
    pthread_cond_signal(&g->work_cv);
    pthread_mutex_unlock(&g->mu);
    if (work) {
        *work = w;
        return DT_OK;
    }
    return work_finish(w, heap);
}

/* Validate, stamp the descriptor and sequence number, then run inline (if
 * blocking and idle) or queue. */
static dt_status submit(dt_group *g, dt_coll coll, const void *send, void *recv, size_t count,
                        dt_dtype dtype, dt_redop redop, int root, int tag, dt_work **work) {
    if (!g)
        return dt_error_set(DT_ERR_INVALID, "%s: group is NULL", dt_coll_name(coll));
    if (work)
        *work = NULL;
    if ((unsigned)dtype >= DT_DTYPE_COUNT)
        return dt_error_set(DT_ERR_INVALID, "%s: bad dtype %d", dt_coll_name(coll), (int)dtype);
    if ((unsigned)redop >= DT_REDOP_COUNT)
        return dt_error_set(DT_ERR_INVALID, "%s: bad reduction op %d", dt_coll_name(coll),
                            (int)redop);
    bool rooted = coll == DT_COLL_BROADCAST || coll == DT_COLL_REDUCE || coll == DT_COLL_GATHER ||
                  coll == DT_COLL_SCATTER;
    bool p2p = coll == DT_COLL_SEND || coll == DT_COLL_RECV;
    if (rooted && (root < 0 || root >= g->size))
        return dt_error_set(DT_ERR_INVALID, "%s: root %d is not a rank of a group of %d",
                            dt_coll_name(coll), root, g->size);
    if (p2p && (root < 0 || root >= g->size || root == g->rank))
        return dt_error_set(DT_ERR_INVALID, "%s: peer %d is not another rank of a group of %d",
                            dt_coll_name(coll), root, g->size);
    size_t total;
    if (!dt_mul_size(count, dt_dtype_size(dtype), &total) ||
        !dt_mul_size(total, (size_t)g->size, &total) || total > DT__WIRE_MAX_LEN)
        return dt_error_set(DT_ERR_INVALID, "%s: count %zu of %s is too large", dt_coll_name(coll),
                            count, dt_dtype_name(dtype));
    if (count > 0 && coll != DT_COLL_BARRIER) {
        bool need_send = coll != DT_COLL_RECV && coll != DT_COLL_BROADCAST;
        bool need_recv = coll != DT_COLL_SEND && !(coll == DT_COLL_REDUCE && root != g->rank) &&
                         !(coll == DT_COLL_GATHER && root != g->rank);
        if (coll == DT_COLL_BROADCAST || coll == DT_COLL_SEND)
            need_recv = false;
        if (coll == DT_COLL_SCATTER && root != g->rank)
            need_send = false;
        if ((need_send && !send) || (need_recv && !recv) || (coll == DT_COLL_BROADCAST && !recv))
            return dt_error_set(DT_ERR_INVALID, "%s: NULL buffer for %zu elements",
                                dt_coll_name(coll), count);
    }
    /* A blocking call's handle lives on the caller's stack: it is done (and
     * dequeued) before this function returns. */
    dt_work local, *w = &local;
    if (work) {
        w = malloc(sizeof *w);
        if (!w)
            return dt_error_set(DT_ERR_NOMEM, "comm: out of memory");
    }
    w->next = NULL;
    w->t_issue = dt_trace_begin();
    w->done = false;
    w->inline_run = false;
    w->status = DT_OK;
    w->err[0] = 0;
    dt__op *op = &w->op;
    op->g = g;
    op->coll = coll;
    op->send = send;
    op->recv = recv;
    op->count = count;
    op->dtype = dtype;
    op->redop = redop;
    op->root = root;
    op->tag = tag;
    op->algo = DT_ALGO_AUTO;
    op->items = NULL;
    op->desc = (dt__wire_hdr){.magic = DT__WIRE_MAGIC,
                              .version = DT__WIRE_VERSION,
                              .kind = DT__MSG_DATA,
                              .coll = (uint8_t)coll,
                              .dtype = (uint8_t)dtype,
                              .redop = (uint8_t)redop,
                              .root = rooted || p2p ? root : -1,
                              .tag = tag,
                              .src = g->rank,
                              .count = count};
    return start(g, w, work, false);
}

/* A batch of point-to-point transfers (comm.h): validated, copied into the
 * handle's own memory, numbered and started like any operation. */
static dt_status submit_batch(dt_group *g, const dt_p2p *ops, size_t n, dt_work **work) {
    if (!g)
        return dt_error_set(DT_ERR_INVALID, "sendrecv_batch: group is NULL");
    if (work)
        *work = NULL;
    if (n > 0 && !ops)
        return dt_error_set(DT_ERR_INVALID, "sendrecv_batch: %zu transfers but no array", n);
    if (n > ((size_t)1 << 24))
        return dt_error_set(DT_ERR_INVALID, "sendrecv_batch: %zu transfers, at most 2^24", n);
    for (size_t i = 0; i < n; i++) {
        const dt_p2p *p = &ops[i];
        size_t bytes;
        if (p->peer < 0 || p->peer >= g->size || p->peer == g->rank)
            return dt_error_set(DT_ERR_INVALID,
                                "sendrecv_batch: transfer %zu: peer %d is not another rank of a "
                                "group of %d",
                                i, p->peer, g->size);
        if ((unsigned)p->dtype >= DT_DTYPE_COUNT)
            return dt_error_set(DT_ERR_INVALID, "sendrecv_batch: transfer %zu: bad dtype %d", i,
                                (int)p->dtype);
        if (!dt_mul_size(p->count, dt_dtype_size(p->dtype), &bytes) || bytes > DT__WIRE_MAX_LEN)
            return dt_error_set(DT_ERR_INVALID, "sendrecv_batch: transfer %zu: count %zu too large",
                                i, p->count);
        if (p->count > 0 && !p->buf)
            return dt_error_set(DT_ERR_INVALID,
                                "sendrecv_batch: transfer %zu: NULL buffer for %zu elements", i,
                                p->count);
    }
    dt_work *w = malloc(sizeof *w + n * sizeof(dt__p2p_item));
    if (!w)
        return dt_error_set(DT_ERR_NOMEM, "comm: out of memory");
    memset(w, 0, sizeof *w);
    w->t_issue = dt_trace_begin();
    dt__op *op = &w->op;
    op->g = g;
    op->coll = DT_COLL_BATCH;
    op->count = n;
    op->dtype = DT_U8;
    op->redop = DT_SUM;
    op->root = -1;
    op->algo = DT_ALGO_AUTO;
    op->items = (dt__p2p_item *)(void *)(w + 1);
    for (size_t i = 0; i < n; i++)
        op->items[i] = (dt__p2p_item){.p = ops[i]};
    op->desc = (dt__wire_hdr){.magic = DT__WIRE_MAGIC,
                              .version = DT__WIRE_VERSION,
                              .kind = DT__MSG_DATA,
                              .coll = DT_COLL_BATCH,
                              .dtype = DT_U8,
                              .redop = DT_SUM,
                              .root = -1,
                              .src = g->rank,
                              .count = n};
    return start(g, w, work, true);
}

dt_status dt_group_sendrecv_batch(dt_group *g, const dt_p2p *ops, size_t n) {
    return submit_batch(g, ops, n, NULL);
}

dt_status dt_group_isendrecv_batch(dt_group *g, const dt_p2p *ops, size_t n, dt_work **work) {
    if (!work)
        return dt_error_set(DT_ERR_INVALID, "isendrecv_batch: work is NULL");
    return submit_batch(g, ops, n, work);
}

/* ------------------------------------------------------------------------ */
/* Split                                                                    */
/* ------------------------------------------------------------------------ */

dt_status dt_group_split(dt_group *g, int color, int key, dt_group **out) {
    if (!g || !out)
        return dt_error_set(DT_ERR_INVALID, "dt_group_split: NULL argument");
    *out = NULL;
    if (color < 0 && color != DT_UNDEFINED)
        return dt_error_set(DT_ERR_INVALID, "dt_group_split: color %d (use >= 0 or DT_UNDEFINED)",
                            color);
    int32_t mine[2] = {color, key};
    int32_t *all = malloc((size_t)g->size * 2 * sizeof *all);
    int *members = malloc((size_t)g->size * sizeof *members);
    int *world = malloc((size_t)g->size * sizeof *world);
    dt_status st = DT_OK;
    if (!all || !members || !world) {
        st = dt_error_set(DT_ERR_NOMEM, "comm: out of memory");
        goto out;
    }
    DT_CHECK_GOTO(dt_group_allgather(g, mine, all, 2, DT_I32), st, out);
    int split_no = g->splits++;
    if (color == DT_UNDEFINED)
        goto out;
    int n = 0;
    for (int r = 0; r < g->size; r++)
        if (all[2 * r] == color)
            members[n++] = r;
    /* order by (key, rank in g): insertion sort, n is small */
    for (int i = 1; i < n; i++) {
        int m = members[i], j = i;
        while (j > 0 && (all[2 * members[j - 1] + 1] > all[2 * m + 1] ||
                         (all[2 * members[j - 1] + 1] == all[2 * m + 1] && members[j - 1] > m))) {
            members[j] = members[j - 1];
            j--;
        }
        members[j] = m;
    }
    int me = -1;
    for (int i = 0; i < n; i++) {
        world[i] = g->world[members[i]];
        if (members[i] == g->rank)
            me = i;
    }
    DT_ASSERT(me >= 0);
    char id[64];
    int idlen = snprintf(id, sizeof id, "%.40s.%dc%d", g->id, split_no, color);
    if (strlen(g->id) > 40 || idlen >= (int)sizeof id) {
        st = dt_error_set(DT_ERR_INVALID, "dt_group_split: groups nested too deeply");
        goto out;
    }
    if (g->size > 1 && !g->job->store) {
        st = dt_error_set(DT_ERR_INTERNAL, "dt_group_split: no store");
        goto out;
    }
    st = group_create(g->job, id, me, n, world, out);
    if (st != DT_OK)
        dt_error_prefix("splitting group %s (color %d)", g->id, color);
    else /* every member had the same (probed together, or inherited) */
        (*out)->links = g->links;
out:
    free(all);
    free(members);
    free(world);
    return st;
}

/* ------------------------------------------------------------------------ */
/* Public collectives                                                       */
/* ------------------------------------------------------------------------ */

dt_status dt_group_allreduce(dt_group *g, const void *send, void *recv, size_t count,
                             dt_dtype dtype, dt_redop op) {
    return submit(g, DT_COLL_ALLREDUCE, send, recv, count, dtype, op, -1, 0, NULL);
}
dt_status dt_group_iallreduce(dt_group *g, const void *send, void *recv, size_t count,
                              dt_dtype dtype, dt_redop op, dt_work **work) {
    if (!work)
        return dt_error_set(DT_ERR_INVALID, "iallreduce: work is NULL");
    return submit(g, DT_COLL_ALLREDUCE, send, recv, count, dtype, op, -1, 0, work);
}
dt_status dt_group_reduce_scatter(dt_group *g, const void *send, void *recv, size_t count,
                                  dt_dtype dtype, dt_redop op) {
    return submit(g, DT_COLL_REDUCE_SCATTER, send, recv, count, dtype, op, -1, 0, NULL);
}
dt_status dt_group_ireduce_scatter(dt_group *g, const void *send, void *recv, size_t count,
                                   dt_dtype dtype, dt_redop op, dt_work **work) {
    if (!work)
        return dt_error_set(DT_ERR_INVALID, "ireduce_scatter: work is NULL");
    return submit(g, DT_COLL_REDUCE_SCATTER, send, recv, count, dtype, op, -1, 0, work);
}
dt_status dt_group_allgather(dt_group *g, const void *send, void *recv, size_t count,
                             dt_dtype dtype) {
    return submit(g, DT_COLL_ALLGATHER, send, recv, count, dtype, DT_SUM, -1, 0, NULL);
}
dt_status dt_group_iallgather(dt_group *g, const void *send, void *recv, size_t count,
                              dt_dtype dtype, dt_work **work) {
    if (!work)
        return dt_error_set(DT_ERR_INVALID, "iallgather: work is NULL");
    return submit(g, DT_COLL_ALLGATHER, send, recv, count, dtype, DT_SUM, -1, 0, work);
}
dt_status dt_group_broadcast(dt_group *g, void *buf, size_t count, dt_dtype dtype, int root) {
    return submit(g, DT_COLL_BROADCAST, buf, buf, count, dtype, DT_SUM, root, 0, NULL);
}
dt_status dt_group_ibroadcast(dt_group *g, void *buf, size_t count, dt_dtype dtype, int root,
                              dt_work **work) {
    if (!work)
        return dt_error_set(DT_ERR_INVALID, "ibroadcast: work is NULL");
    return submit(g, DT_COLL_BROADCAST, buf, buf, count, dtype, DT_SUM, root, 0, work);
}
dt_status dt_group_reduce(dt_group *g, const void *send, void *recv, size_t count, dt_dtype dtype,
                          dt_redop op, int root) {
    return submit(g, DT_COLL_REDUCE, send, recv, count, dtype, op, root, 0, NULL);
}
dt_status dt_group_ireduce(dt_group *g, const void *send, void *recv, size_t count, dt_dtype dtype,
                           dt_redop op, int root, dt_work **work) {
    if (!work)
        return dt_error_set(DT_ERR_INVALID, "ireduce: work is NULL");
    return submit(g, DT_COLL_REDUCE, send, recv, count, dtype, op, root, 0, work);
}
dt_status dt_group_gather(dt_group *g, const void *send, void *recv, size_t count, dt_dtype dtype,
                          int root) {
    return submit(g, DT_COLL_GATHER, send, recv, count, dtype, DT_SUM, root, 0, NULL);
}
dt_status dt_group_igather(dt_group *g, const void *send, void *recv, size_t count, dt_dtype dtype,
                           int root, dt_work **work) {
    if (!work)
        return dt_error_set(DT_ERR_INVALID, "igather: work is NULL");
    return submit(g, DT_COLL_GATHER, send, recv, count, dtype, DT_SUM, root, 0, work);
}
dt_status dt_group_scatter(dt_group *g, const void *send, void *recv, size_t count, dt_dtype dtype,
                           int root) {
    return submit(g, DT_COLL_SCATTER, send, recv, count, dtype, DT_SUM, root, 0, NULL);
}
dt_status dt_group_iscatter(dt_group *g, const void *send, void *recv, size_t count, dt_dtype dtype,
                            int root, dt_work **work) {
    if (!work)
        return dt_error_set(DT_ERR_INVALID, "iscatter: work is NULL");
    return submit(g, DT_COLL_SCATTER, send, recv, count, dtype, DT_SUM, root, 0, work);
}
dt_status dt_group_alltoall(dt_group *g, const void *send, void *recv, size_t count,
                            dt_dtype dtype) {
    return submit(g, DT_COLL_ALLTOALL, send, recv, count, dtype, DT_SUM, -1, 0, NULL);
}
dt_status dt_group_ialltoall(dt_group *g, const void *send, void *recv, size_t count,
                             dt_dtype dtype, dt_work **work) {
    if (!work)
        return dt_error_set(DT_ERR_INVALID, "ialltoall: work is NULL");
    return submit(g, DT_COLL_ALLTOALL, send, recv, count, dtype, DT_SUM, -1, 0, work);
}
dt_status dt_group_barrier(dt_group *g) {
    return submit(g, DT_COLL_BARRIER, NULL, NULL, 0, DT_U8, DT_SUM, -1, 0, NULL);
}
dt_status dt_group_ibarrier(dt_group *g, dt_work **work) {
    if (!work)
        return dt_error_set(DT_ERR_INVALID, "ibarrier: work is NULL");
    return submit(g, DT_COLL_BARRIER, NULL, NULL, 0, DT_U8, DT_SUM, -1, 0, work);
}
dt_status dt_group_send(dt_group *g, const void *buf, size_t count, dt_dtype dtype, int peer,
                        int tag) {
    return submit(g, DT_COLL_SEND, buf, NULL, count, dtype, DT_SUM, peer, tag, NULL);
}
dt_status dt_group_isend(dt_group *g, const void *buf, size_t count, dt_dtype dtype, int peer,
                         int tag, dt_work **work) {
    if (!work)
        return dt_error_set(DT_ERR_INVALID, "isend: work is NULL");
    return submit(g, DT_COLL_SEND, buf, NULL, count, dtype, DT_SUM, peer, tag, work);
}
dt_status dt_group_recv(dt_group *g, void *buf, size_t count, dt_dtype dtype, int peer, int tag) {
    return submit(g, DT_COLL_RECV, NULL, buf, count, dtype, DT_SUM, peer, tag, NULL);
}
dt_status dt_group_irecv(dt_group *g, void *buf, size_t count, dt_dtype dtype, int peer, int tag,
                         dt_work **work) {
    if (!work)
        return dt_error_set(DT_ERR_INVALID, "irecv: work is NULL");
    return submit(g, DT_COLL_RECV, NULL, buf, count, dtype, DT_SUM, peer, tag, work);
}
