/*
 * elastic.c — memberships that change while a job runs (dtrain/elastic.h):
 * revoke / agree / shrink-or-grow through the rendezvous store, and a store
 * that moves to another member when its host dies.
 *
 * The store keys of the protocol (all under "E/"):
 *
 *   E/alive/ID          ephemeral: ID's process is alive (its connection is open)
 *   E/gen               max: the newest generation any process knows
 *   E/gK/decision       set-if-absent: generation K's membership (the text below)
 *   E/gK/revoked        generation K has ended: its members are forming K+1
 *   E/reg/ID            "K STEP": member ID of generation K wants K+1, with its state
 *   E/join/n, E/join/i/N  newcomers' requests ("ID SERVE"), counted
 *   E/admitted/ID       the generation a newcomer was let into
 *   E/stores            where the store may be served, in order (for newcomers)
 *   E/done              the store's host is leaving: the job has finished
 *                       (newcomers stop waiting)
 *
 * A membership, as stored and as every member keeps it:
 *
 *   dtrain-elastic 1 gen K size N root R step S prev P
 *   ID PREV_RANK STEP SERVE          (N lines: ranks 0..N-1 of generation K)
 *   lost LIST                        (previous ranks left out, or "-")
 *
 * or "dtrain-elastic 1 gen K fail" and a message line, when the round could
 * not continue (fewer than min members, no state).
 *
 * Invariants:
 *   1. A decision is written once (set-if-absent); every member that reads
 *      it reads the same text, and only the decider writes one: the lowest
 *      member of the previous generation whose alive key exists.
 *   2. Survivors keep their relative order and newcomers come after them,
 *      so in any two memberships the members common to both are in the same
 *      order: walking either one for the store's next host finds the same
 *      first live member.
 *   3. Everything in the store is soft state: after a failover each process
 *      publishes again what it knows (its alive key, its newest decision,
 *      revocations, its join request), and the round in progress starts
 *      over; nothing needs copying from the dead host.
 */
#include "dtrain/elastic.h"

#include "comm_internal.h"
#include "jobenv.h"

#include <errno.h>
#include <inttypes.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define ID_LEN      16 /* hex digits of a process id in the protocol */
#define SERVE_LEN   280
#define TEXT_MAGIC  "dtrain-elastic 1"
#define MAX_MEMBERS 65536

typedef struct member {
    char id[ID_LEN + 1];
    int prev;     /* rank in the generation before, -1 for a newcomer */
    int64_t step; /* the state it registered (-1: none) */
    char serve[SERVE_LEN];
} member;

/* One generation's membership. */
typedef struct table {
    int gen; /* -1: none */
    int n;
    member *m;
    int root;
    int64_t root_step;
    int prev_size;
    char lost[256];
    bool fail;     /* the round ended the job */
    char *text;    /* as stored (malloc'ed), republished after a failover */
    char msg[512]; /* fail: why */
} table;

struct dt_elastic {
    int min, max;
    double timeout;
    char token[DT__TOKEN_LEN + 1];
    char job_id[128];
    char master[256]; /* the job's address: rank 0 of generation 0 serves there */
    int master_port;
    char local[64]; /* this host's address as others reach it */
    char id[ID_LEN + 1];
    int serve_fd;          /* listening, not yet served (-1 once the server took it) */
    char serve[SERVE_LEN]; /* its address */
    dt__store *store;
    dt__store_server *server; /* while this process hosts the store */
    uint64_t epoch;           /* store connections so far (a new one: publish again) */
    table cur;                /* the newest membership this process is in */
    int rank;                 /* in cur (-1: a newcomer not let in yet) */
    bool revoked;             /* cur has ended */
    /* Newcomers: where the store may be (E/stores), refreshed while waiting. */
    char stores[4096];
    uint64_t join_epoch; /* the store connection its join request was published on */
    /* dt_elastic_joiners' cache: requests scanned on store connection
     * scan_epoch, and the ids still waiting. */
    uint64_t scan_epoch;
    int64_t scanned;
    member *pending;
    int npending, cap_pending;
    /* The membership being formed (the store watch reads it). */
    const table *forming;
};

/* ------------------------------------------------------------------------ */
/* Memberships as text                                                      */
/* ------------------------------------------------------------------------ */

static void table_free(table *t) {
    free(t->m);
    free(t->text);
    memset(t, 0, sizeof *t);
    t->gen = -1;
}

static int table_find(const table *t, const char *id) {
    for (int i = 0; i < t->n; i++)
        if (strcmp(t->m[i].id, id) == 0)
            return i;
    return -1;
}

/* The text of t (t->text set; t->fail uses t->msg). */
static dt_status table_render(table *t) {
    size_t cap = 256 + (size_t)t->n * (ID_LEN + SERVE_LEN + 64) + sizeof t->lost + sizeof t->msg;
    char *s = malloc(cap);
    if (!s)
        return dt_error_set(DT_ERR_NOMEM, "elastic: membership text");
    size_t off = 0;
    if (t->fail) {
        snprintf(s, cap, TEXT_MAGIC " gen %d fail\n%s\n", t->gen, t->msg);
    } else {
        off += (size_t)snprintf(s + off, cap - off,
                                TEXT_MAGIC " gen %d size %d root %d step %" PRId64 " prev %d\n",
                                t->gen, t->n, t->root, t->root_step, t->prev_size);
        for (int i = 0; i < t->n; i++)
            off += (size_t)snprintf(s + off, cap - off, "%s %d %" PRId64 " %s\n", t->m[i].id,
                                    t->m[i].prev, t->m[i].step, t->m[i].serve);
        snprintf(s + off, cap - off, "lost %s\n", t->lost[0] ? t->lost : "-");
    }
    free(t->text);
    t->text = s;
    return DT_OK;
}

/* Parse a stored membership (every field checked: it came over a socket). */
static dt_status table_parse(const char *text, table *out) {
    table t = {.gen = -1};
    int consumed = 0;
    const char *p = text;
    if (strncmp(p, TEXT_MAGIC " gen ", strlen(TEXT_MAGIC " gen ")) != 0)
        goto bad;
    p += strlen(TEXT_MAGIC " gen ");
    if (sscanf(p, "%d%n", &t.gen, &consumed) != 1 || t.gen < 0)
        goto bad;
    p += consumed;
    if (strncmp(p, " fail\n", 6) == 0) {
        t.fail = true;
        snprintf(t.msg, sizeof t.msg, "%s", p + 6);
        t.msg[strcspn(t.msg, "\n")] = 0;
    } else {
        if (sscanf(p, " size %d root %d step %" SCNd64 " prev %d%n", &t.n, &t.root, &t.root_step,
                   &t.prev_size, &consumed) != 4 ||
            t.n < 1 || t.n > MAX_MEMBERS || t.root < 0 || t.root >= t.n || t.prev_size < 0)
            goto bad;
        p += consumed;
        t.m = calloc((size_t)t.n, sizeof *t.m);
        if (!t.m)
            return dt_error_set(DT_ERR_NOMEM, "elastic: membership of %d", t.n);
        for (int i = 0; i < t.n; i++) {
            member *m = &t.m[i];
            if (*p != '\n' ||
                sscanf(p + 1, "%16s %d %" SCNd64 " %279s%n", m->id, &m->prev, &m->step, m->serve,
                       &consumed) != 4 ||
                strlen(m->id) != ID_LEN || m->prev < -1 || m->prev >= MAX_MEMBERS)
                goto bad;
            p += 1 + consumed;
        }
        if (sscanf(p, "\nlost %255s", t.lost) != 1)
            goto bad;
        if (strcmp(t.lost, "-") == 0)
            t.lost[0] = 0;
    }
    t.text = strdup(text);
    if (!t.text) {
        free(t.m);
        return dt_error_set(DT_ERR_NOMEM, "elastic: membership text");
    }
    *out = t;
    return DT_OK;
bad:
    free(t.m);
    return dt_error_set(DT_ERR_PROTOCOL, "elastic: a membership in the store is malformed: %.120s",
                        text);
}

/* ------------------------------------------------------------------------ */
/* Store helpers                                                            */
/* ------------------------------------------------------------------------ */

/* *val (text, dt_alloc'ed) or NULL when absent. */
static dt_status get_opt(dt_elastic *e, const char *key, char **val) {
    void *v = NULL;
    size_t len;
    *val = NULL;
    dt_status st = dt__store_get(e->store, key, &v, &len);
    if (st == DT_ERR_NOT_FOUND) {
        dt_error_clear();
        return DT_OK;
    }
    DT_CHECK(st);
    *val = v;
    return DT_OK;
}

static dt_status exists(dt_elastic *e, const char *key, bool *yes) {
    char *v;
    DT_CHECK(get_opt(e, key, &v));
    *yes = v != NULL;
    dt_free(v);
    return DT_OK;
}

/* An integer written by add or max (absent: 0). */
static dt_status get_i64(dt_elastic *e, const char *key, int64_t *out) {
    void *v = NULL;
    size_t len = 0;
    *out = 0;
    dt_status st = dt__store_get(e->store, key, &v, &len);
    if (st == DT_ERR_NOT_FOUND) {
        dt_error_clear();
        return DT_OK;
    }
    DT_CHECK(st);
    if (len == sizeof *out)
        memcpy(out, v, sizeof *out);
    dt_free(v);
    return len == sizeof *out
               ? DT_OK
               : dt_error_set(DT_ERR_PROTOCOL, "elastic: %s holds %zu bytes", key, len);
}

static dt_status set_text(dt_elastic *e, const char *key, const char *text) {
    return dt__store_set(e->store, key, text, strlen(text) + 1);
}

/* "addr:port" into its parts. */
static dt_status split_addr(const char *s, char *host, size_t n, int *port) {
    const char *colon = strrchr(s, ':');
    char *end;
    long p = colon ? strtol(colon + 1, &end, 10) : 0;
    if (!colon || colon == s || (size_t)(colon - s) >= n || *end || p < 1 || p > 65535)
        return dt_error_set(DT_ERR_INVALID, "\"%s\" is not ADDR:PORT (port 1..65535)", s);
    memcpy(host, s, (size_t)(colon - s));
    host[colon - s] = 0;
    *port = (int)p;
    return DT_OK;
}

/* Does a process listen at serve ("addr:port")? Every member keeps its
 * socket listening for its whole life, so a refused connection means it
 * is dead (its kernel closed the socket); no answer within a second, from
 * another host, counts as dead too. The connection is closed at once: a
 * server that accepts it reads the end of the stream and drops it. */
static bool listening(const char *serve) {
    char host[SERVE_LEN], ps[16];
    int port;
    if (split_addr(serve, host, sizeof host, &port) != DT_OK) {
        dt_error_clear();
        return false;
    }
    snprintf(ps, sizeof ps, "%d", port);
    struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *res = NULL;
    if (getaddrinfo(host, ps, &hints, &res) != 0 || !res)
        return false;
    bool yes = false;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd >= 0) {
        int rc = connect(fd, res->ai_addr, res->ai_addrlen);
        if (rc == 0) {
            yes = true;
        } else if (errno == EINPROGRESS) {
            struct pollfd p = {.fd = fd, .events = POLLOUT};
            int err = 0;
            socklen_t len = sizeof err;
            yes = poll(&p, 1, 1000) == 1 && getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 &&
                  err == 0;
        }
        close(fd);
    }
    freeaddrinfo(res);
    return yes;
}

/* Is member m alive? Its key in the store says yes; without the key (it
 * died, or a store that just started has not heard from it yet) its
 * listening socket decides. */
static dt_status alive_member(dt_elastic *e, const member *m, bool *yes) {
    char key[64];
    snprintf(key, sizeof key, "E/alive/%s", m->id);
    DT_CHECK(exists(e, key, yes));
    if (!*yes)
        *yes = strcmp(m->serve, e->serve) == 0 || listening(m->serve);
    return DT_OK;
}

/* ------------------------------------------------------------------------ */
/* Publishing, and moving the store                                         */
/* ------------------------------------------------------------------------ */

static dt_status publish_join(dt_elastic *e) {
    int64_t k;
    char key[64], val[ID_LEN + SERVE_LEN + 2];
    DT_CHECK(dt__store_add(e->store, "E/join/n", 1, &k));
    snprintf(key, sizeof key, "E/join/i/%" PRId64, k);
    snprintf(val, sizeof val, "%s %s", e->id, e->serve);
    DT_CHECK(set_text(e, key, val));
    e->join_epoch = e->epoch;
    return DT_OK;
}

/* What this process knows, into a store that may have just started empty
 * (invariant 3). Idempotent. */
static dt_status publish(dt_elastic *e) {
    char key[64];
    snprintf(key, sizeof key, "E/alive/%s", e->id);
    DT_CHECK(dt__store_set_ephemeral(e->store, key, "1", 2));
    if (e->cur.gen >= 0) {
        int64_t g;
        void *v = NULL;
        size_t len;
        snprintf(key, sizeof key, "E/g%d/decision", e->cur.gen);
        DT_CHECK(
            dt__store_set_if_absent(e->store, key, e->cur.text, strlen(e->cur.text) + 1, &v, &len));
        dt_free(v);
        DT_CHECK(dt__store_max(e->store, "E/gen", e->cur.gen, &g));
        if (e->revoked) {
            snprintf(key, sizeof key, "E/g%d/revoked", e->cur.gen);
            DT_CHECK(set_text(e, key, "1"));
        }
    } else if (e->join_epoch != e->epoch) {
        DT_CHECK(publish_join(e));
    }
    return DT_OK;
}

/* E/stores: the serve addresses of t in rank order. */
static dt_status publish_stores(dt_elastic *e, const table *t) {
    size_t cap = (size_t)t->n * SERVE_LEN + 1, off = 0;
    char *s = malloc(cap);
    if (!s)
        return DT_ERR_NOMEM;
    s[0] = 0;
    for (int i = 0; i < t->n; i++)
        off += (size_t)snprintf(s + off, cap - off, "%s%s", i ? " " : "", t->m[i].serve);
    dt_status st = set_text(e, "E/stores", s);
    free(s);
    return st;
}

/* This process starts serving the store: on its own socket and on the
 * job's master port when it can bind it (rank 0 of the first generation
 * from the start; a successor when the first host is gone, so that
 * newcomers given the job's address find the store there). A member's own
 * socket stays its identity: the master port is never probed for a
 * member's life. */
static dt_status activate(dt_elastic *e, bool must_bind_master) {
    int fds[2] = {e->serve_fd, -1}, n = 1, port;
    dt_status st = dt__net_listen(NULL, e->master_port, &fds[1], &port);
    if (st == DT_OK)
        n = 2;
    else if (must_bind_master)
        return st;
    dt_error_clear();
    st = dt__store_server_adopt(fds, n, e->token, &e->server);
    if (st != DT_OK) {
        if (n == 2)
            close(fds[1]);
        return st;
    }
    e->serve_fd = -1;
    if (!must_bind_master)
        DT_INFO("elastic: the store's host is gone; this process now serves it at %s%s", e->serve,
                n == 2 ? " and on the job's port" : "");
    return DT_OK;
}

/* The store's host is gone (or unreachable): find the next one, in the
 * order of the newest membership this process knows (a newcomer: the
 * order the job published, then the job's address). A refused connection
 * is a dead member; the first member that accepts serves, or will as soon
 * as it notices; if that is this process, it starts serving. */
static dt_status failover(dt_elastic *e, double deadline) {
    char list[8192];
    size_t off = 0;
    list[0] = 0;
    if (e->cur.gen >= 0)
        for (int i = 0; i < e->cur.n; i++)
            off += (size_t)snprintf(list + off, sizeof list - off, "%s ", e->cur.m[i].serve);
    else
        off += (size_t)snprintf(list, sizeof list, "%s ", e->stores);
    char job_addr[300];
    snprintf(job_addr, sizeof job_addr, "%s:%d", e->master, e->master_port);
    if (!strstr(list, job_addr))
        snprintf(list + off, sizeof list - off, "%s", job_addr);
    char why[512] = "";
    double started = dt_now();
    for (unsigned pause_ms = 2;; pause_ms = pause_ms < 200 ? 2 * pause_ms : 200) {
        char copy[sizeof list];
        snprintf(copy, sizeof copy, "%s", list);
        for (char *save, *a = strtok_r(copy, " ", &save); a; a = strtok_r(NULL, " ", &save)) {
            char host[SERVE_LEN];
            int port;
            if (split_addr(a, host, sizeof host, &port) != DT_OK)
                continue;
            if (strcmp(a, e->serve) == 0 && e->cur.gen >= 0 && e->rank >= 0) {
                if (!e->server)
                    DT_CHECK(activate(e, false));
                DT_CHECK(dt__store_reconnect(e->store, host, port, deadline - dt_now()));
                e->epoch++;
                return DT_OK;
            }
            double left = deadline - dt_now();
            if (dt__store_reconnect(e->store, host, port, left > 0.01 ? left : 0.01) == DT_OK) {
                e->epoch++;
                DT_DEBUG("comm", "elastic: the store is now at %s", a);
                return DT_OK;
            }
            snprintf(why, sizeof why, "%s: %s", a, dt_last_error());
            DT_DEBUG("comm", "elastic: no store at %s", why);
        }
        /* Every address refused: the members are dead (a member always
         * finds itself in its list, so only a newcomer gets here), the job
         * is gone or over. A few seconds cover a host restarting. */
        if (dt_now() > deadline || (e->rank < 0 && dt_now() - started > 3))
            return dt_error_set(DT_ERR_PEER,
                                "elastic: the job is gone: neither its store nor any member "
                                "answers (tried %s; last: %s)",
                                list, why);
        dt_sleep_ms(pause_ms);
    }
}

/* After a store request failed: move to the next host and publish again.
 * Errors other than a lost connection are passed on. */
static dt_status recover_store(dt_elastic *e, dt_status st, double deadline) {
    if (st != DT_ERR_PEER && st != DT_ERR_TIMEOUT && st != DT_ERR_AUTH)
        return st;
    DT_DEBUG("comm", "elastic: store request failed (%s); looking for the store", dt_last_error());
    DT_CHECK(failover(e, deadline));
    return publish(e);
}

/* ------------------------------------------------------------------------ */
/* Forming a generation's world group                                       */
/* ------------------------------------------------------------------------ */

/* The store watch while a group forms: a member that died, or a revoked
 * generation, ends the waits at once instead of after DT_TIMEOUT. */
static dt_status watch_forming(void *arg) {
    dt_elastic *e = arg;
    const table *t = e->forming;
    if (!t)
        return DT_OK;
    char key[64];
    bool yes;
    snprintf(key, sizeof key, "E/g%d/revoked", t->gen);
    DT_CHECK(exists(e, key, &yes));
    if (yes)
        return dt_error_set(DT_ERR_PEER, "elastic: generation %d was revoked while it formed",
                            t->gen);
    for (int i = 0; i < t->n; i++) {
        DT_CHECK(alive_member(e, &t->m[i], &yes));
        if (!yes)
            return dt_error_set(
                DT_ERR_PEER, "elastic: rank %d of generation %d died while it formed", i, t->gen);
    }
    return DT_OK;
}

static dt_status form_group(dt_elastic *e, const table *t, int rank, dt_group **world) {
    char prefix[16];
    snprintf(prefix, sizeof prefix, "g%d", t->gen);
    dt_group_options o = {.rank = rank,
                          .size = t->n,
                          .master_addr = e->master,
                          .token = e->token,
                          .job_id = e->job_id,
                          .timeout = e->timeout};
    e->forming = t;
    dt__store_set_watch(e->store, watch_forming, e);
    dt_status st = dt__group_init_on_store(e->store, prefix, &o, world);
    dt__store_set_watch(e->store, NULL, NULL);
    e->forming = NULL;
    return st;
}

/* ------------------------------------------------------------------------ */
/* Creation                                                                 */
/* ------------------------------------------------------------------------ */

static dt_status random_id(char *out) {
    char tok[33];
    DT_CHECK(dt__random_token(tok));
    memcpy(out, tok, ID_LEN);
    out[ID_LEN] = 0;
    return DT_OK;
}

/* Generation 0: the launcher's ranks, in its order. */
static dt_status first_generation(dt_elastic *e, int rank, int size, dt_group **world) {
    char key[64], val[ID_LEN + SERVE_LEN + 2];
    snprintf(key, sizeof key, "E/g0/m/%d", rank);
    snprintf(val, sizeof val, "%s %s", e->id, e->serve);
    DT_CHECK(set_text(e, key, val));
    table t = {.gen = 0, .n = size, .root = 0, .root_step = -1, .prev_size = 0};
    t.m = calloc((size_t)size, sizeof *t.m);
    if (!t.m)
        return dt_error_set(DT_ERR_NOMEM, "elastic: %d members", size);
    dt_status st = DT_OK;
    for (int r = 0; r < size && st == DT_OK; r++) {
        void *v = NULL;
        size_t len;
        snprintf(key, sizeof key, "E/g0/m/%d", r);
        st = dt__store_wait(e->store, key, &v, &len);
        if (st != DT_OK)
            break;
        member *m = &t.m[r];
        if (sscanf(v, "%16s %279s", m->id, m->serve) != 2 || strlen(m->id) != ID_LEN)
            st = dt_error_set(DT_ERR_PROTOCOL, "elastic: bad record of rank %d: %.100s", r,
                              (char *)v);
        m->prev = r;
        m->step = -1;
        dt_free(v);
    }
    if (st == DT_OK)
        st = table_render(&t);
    if (st == DT_OK && rank == 0) {
        void *v = NULL;
        size_t len;
        int64_t g;
        st = dt__store_set_if_absent(e->store, "E/g0/decision", t.text, strlen(t.text) + 1, &v,
                                     &len);
        dt_free(v);
        if (st == DT_OK)
            st = dt__store_max(e->store, "E/gen", 0, &g);
        if (st == DT_OK)
            st = publish_stores(e, &t);
    }
    if (st == DT_OK)
        st = form_group(e, &t, rank, world);
    if (st != DT_OK) {
        table_free(&t);
        return st;
    }
    e->cur = t;
    e->rank = rank;
    return DT_OK;
}

int dt_elastic_generation(const dt_elastic *e) { return e && e->rank >= 0 ? e->cur.gen : -1; }

dt_status dt_elastic_create(dt_elastic **out, const dt_elastic_options *o, dt_group **world) {
    if (!out || !o || !world)
        return dt_error_set(DT_ERR_INVALID, "dt_elastic_create: NULL argument");
    *out = NULL;
    *world = NULL;
    if (o->min < 1 || o->max < o->min || o->max > MAX_MEMBERS)
        return dt_error_set(DT_ERR_INVALID,
                            "--elastic %d:%d: need 1 <= MIN <= MAX <= %d (MIN:MAX world sizes)",
                            o->min, o->max, MAX_MEMBERS);
    dt_elastic *e = calloc(1, sizeof *e);
    if (!e)
        return dt_error_set(DT_ERR_NOMEM, "elastic");
    e->min = o->min;
    e->max = o->max;
    e->serve_fd = -1;
    e->rank = -1;
    e->cur.gen = -1;
    e->epoch = 1;
    dt_status st = DT_OK;
    e->timeout = o->timeout;
    if (e->timeout <= 0)
        DT_CHECK_GOTO(dt_config_env_double("DT_TIMEOUT", 300, 0.1, 1e7, &e->timeout), st, fail);
    const char *tok = getenv("DT_JOB_TOKEN");
    if (!tok || strlen(tok) != DT__TOKEN_LEN ||
        strspn(tok, "0123456789abcdefABCDEF") != DT__TOKEN_LEN) {
        st = dt_error_set(
            DT_ERR_INVALID, "--elastic: DT_JOB_TOKEN must hold the job's token (%d hex digits%s)",
            DT__TOKEN_LEN, o->join ? "; a newcomer is given the running job's own" : "");
        goto fail;
    }
    snprintf(e->token, sizeof e->token, "%s", tok);
    DT_CHECK_GOTO(random_id(e->id), st, fail);
    int rank = 0, size = 0;
    if (o->join) {
        DT_CHECK_GOTO(split_addr(o->join, e->master, sizeof e->master, &e->master_port), st, fail);
        const char *id = getenv("DT_JOB_ID");
        snprintf(e->job_id, sizeof e->job_id, "%s", id && *id ? id : "dtrain");
    } else {
        dt__jobenv je;
        DT_CHECK_GOTO(dt__jobenv_read(&je), st, fail);
        if (je.launcher != DT__LAUNCHER_DTRAIN || je.master_port <= 0) {
            st = dt_error_set(DT_ERR_UNSUPPORTED,
                              "--elastic needs the job started by `dtrain launch` (or `dtrain "
                              "train --nproc N`), which keeps the other ranks running when one "
                              "dies; this process was started by %s",
                              dt__launcher_name(je.launcher));
            goto fail;
        }
        rank = je.rank;
        size = je.size;
        if (size < e->min || size > e->max) {
            st = dt_error_set(DT_ERR_INVALID,
                              "--elastic %d:%d: the job starts with %d ranks, outside MIN:MAX",
                              e->min, e->max, size);
            goto fail;
        }
        snprintf(e->master, sizeof e->master, "%s",
                 je.master_addr[0] ? je.master_addr : "127.0.0.1");
        e->master_port = je.master_port;
        snprintf(e->job_id, sizeof e->job_id, "%s", je.job_id[0] ? je.job_id : "dtrain");
    }
    dt__net_local_addr(e->master, e->local, sizeof e->local);
    /* The socket this process serves the store on if it is ever chosen,
     * listening from now to its end (its liveness for the others); rank 0
     * of the first generation serves from the start, there and on the
     * job's port. */
    int port;
    DT_CHECK_GOTO(dt__net_listen(NULL, 0, &e->serve_fd, &port), st, fail);
    snprintf(e->serve, sizeof e->serve, "%s:%d", e->local, port);
    if (!o->join && rank == 0)
        DT_CHECK_GOTO(activate(e, true), st, fail);
    DT_CHECK_GOTO(dt__store_connect(e->master, e->master_port, e->token, e->timeout, &e->store), st,
                  fail);
    DT_CHECK_GOTO(publish(e), st, fail);
    if (o->join) {
        char *v;
        DT_CHECK_GOTO(get_opt(e, "E/stores", &v), st, fail);
        snprintf(e->stores, sizeof e->stores, "%s", v ? v : "");
        dt_free(v);
        *out = e;
        return DT_OK;
    }
    DT_CHECK_GOTO(first_generation(e, rank, size, world), st, fail);
    *out = e;
    return DT_OK;
fail:
    dt_error_prefix("elastic");
    dt_elastic_destroy(e);
    return st;
}

/* ------------------------------------------------------------------------ */
/* Newcomers waiting                                                        */
/* ------------------------------------------------------------------------ */

dt_status dt_elastic_joiners(dt_elastic *e, int *count) {
    *count = 0;
    if (!e || e->rank < 0 || e->cur.n >= e->max)
        return DT_OK;
    if (e->scan_epoch != e->epoch) { /* a new store: its requests are numbered anew */
        e->scan_epoch = e->epoch;
        e->scanned = 0;
        e->npending = 0;
    }
    /* A store that fails here is noticed by the collectives too: no error. */
    char *v = NULL;
    int64_t n = 0;
    dt_status st = get_i64(e, "E/join/n", &n);
    for (int64_t k = e->scanned + 1; st == DT_OK && k <= n; k++) {
        char key[64];
        member nm = {.prev = -1, .step = -1};
        snprintf(key, sizeof key, "E/join/i/%" PRId64, k);
        st = get_opt(e, key, &v);
        if (st != DT_OK)
            break;
        bool fresh = v && sscanf(v, "%16s %279s", nm.id, nm.serve) == 2 &&
                     strlen(nm.id) == ID_LEN && table_find(&e->cur, nm.id) < 0;
        dt_free(v);
        e->scanned = k;
        if (!fresh)
            continue;
        if (e->npending == e->cap_pending) {
            int cap = e->cap_pending ? 2 * e->cap_pending : 8;
            void *p = realloc(e->pending, (size_t)cap * sizeof *e->pending);
            if (!p)
                break;
            e->pending = p;
            e->cap_pending = cap;
        }
        e->pending[e->npending++] = nm;
    }
    int live = 0;
    for (int i = 0; st == DT_OK && i < e->npending; i++) {
        bool yes = false;
        st = alive_member(e, &e->pending[i], &yes);
        if (st == DT_OK && yes && table_find(&e->cur, e->pending[i].id) < 0)
            e->pending[live++] = e->pending[i];
    }
    if (st != DT_OK) {
        DT_DEBUG("comm", "elastic: could not look for newcomers: %s", dt_last_error());
        dt_error_clear();
        return DT_OK;
    }
    e->npending = live;
    int room = e->max - e->cur.n;
    *count = live < room ? live : room;
    return DT_OK;
}

/* ------------------------------------------------------------------------ */
/* A round                                                                  */
/* ------------------------------------------------------------------------ */

/* The registration of member id for generation gen+1: its step, or
 * *registered = false. */
static dt_status registration(dt_elastic *e, const char *id, int gen, bool *registered,
                              int64_t *step) {
    char key[64], *v;
    snprintf(key, sizeof key, "E/reg/%s", id);
    DT_CHECK(get_opt(e, key, &v));
    int g = -1;
    int64_t s = -1;
    *registered = v && sscanf(v, "%d %" SCNd64, &g, &s) == 2 && g == gen;
    *step = s;
    dt_free(v);
    return DT_OK;
}

/* The decider's part (invariant 1): once every live member of cur has
 * registered (or the round's time is up), write the next membership. Sets
 * *wrote when it did. */
static dt_status decide(dt_elastic *e, double since, bool *wrote) {
    *wrote = false;
    const table *c = &e->cur;
    int n = c->n;
    member *m = calloc((size_t)n + (size_t)e->max + 1, sizeof *m);
    if (!m)
        return DT_ERR_NOMEM;
    dt_status st = DT_OK;
    int kept = 0, waiting = 0;
    char lost[256] = "";
    size_t loff = 0;
    for (int i = 0; i < n; i++) {
        bool yes, reg;
        int64_t step;
        DT_CHECK_GOTO(alive_member(e, &c->m[i], &yes), st, out);
        DT_CHECK_GOTO(registration(e, c->m[i].id, c->gen, &reg, &step), st, out);
        if (yes && reg) {
            m[kept] = c->m[i];
            m[kept].prev = i;
            m[kept].step = step;
            kept++;
            continue;
        }
        if (yes)
            waiting++;
        if (loff < sizeof lost)
            loff += (size_t)snprintf(lost + loff, sizeof lost - loff, "%s%d", loff ? "," : "", i);
    }
    if (waiting > 0 && dt_now() - since < e->timeout)
        goto out; /* a live member has not noticed yet: it will */
    DT_DEBUG("comm", "elastic: deciding generation %d: %d kept, %d waited for", c->gen + 1, kept,
             waiting);
    if (waiting > 0)
        DT_WARN("elastic: %d live member(s) of generation %d did not arrive within %.0f s; "
                "continuing without them",
                waiting, c->gen, e->timeout);
    /* Newcomers, up to max, in the order they asked. */
    char *v = NULL;
    int64_t nj = 0;
    int joined = 0;
    DT_CHECK_GOTO(get_i64(e, "E/join/n", &nj), st, out);
    for (int64_t k = 1; k <= nj && kept + joined < e->max; k++) {
        char key[64];
        member nm = {.prev = -1, .step = -1};
        snprintf(key, sizeof key, "E/join/i/%" PRId64, k);
        DT_CHECK_GOTO(get_opt(e, key, &v), st, out);
        bool ok = v && sscanf(v, "%16s %279s", nm.id, nm.serve) == 2 && strlen(nm.id) == ID_LEN;
        dt_free(v);
        if (!ok || table_find(c, nm.id) >= 0)
            continue;
        bool dup = false;
        for (int j = kept; j < kept + joined; j++)
            dup |= strcmp(m[j].id, nm.id) == 0;
        bool yes = false;
        if (!dup)
            DT_CHECK_GOTO(alive_member(e, &nm, &yes), st, out);
        if (yes)
            m[kept + joined++] = nm;
    }
    table t = {.gen = c->gen + 1, .n = kept + joined, .m = m, .prev_size = n, .root_step = -1};
    snprintf(t.lost, sizeof t.lost, "%s", lost);
    for (int i = 0; i < kept; i++)
        if (m[i].step > t.root_step) {
            t.root_step = m[i].step;
            t.root = i;
        }
    if (t.n < e->min) {
        t.fail = true;
        snprintf(t.msg, sizeof t.msg,
                 "only %d rank(s) of generation %d (%d ranks) are left%s%s, below --elastic "
                 "%d:%d: the job cannot continue",
                 kept, c->gen, n, lost[0] ? "; lost: ranks " : "", lost, e->min, e->max);
    } else if (t.root_step < 0) {
        t.fail = true;
        snprintf(t.msg, sizeof t.msg,
                 "no member of generation %d that holds the training state is left", c->gen);
    }
    st = table_render(&t);
    t.m = NULL; /* m is freed below */
    if (st == DT_OK) {
        char key[64];
        void *stored = NULL;
        size_t len;
        int64_t g;
        snprintf(key, sizeof key, "E/g%d/decision", t.gen);
        st = dt__store_set_if_absent(e->store, key, t.text, strlen(t.text) + 1, &stored, &len);
        if (st == DT_OK)
            *wrote = strcmp(stored, t.text) == 0;
        dt_free(stored);
        if (st == DT_OK)
            st = dt__store_max(e->store, "E/gen", t.gen, &g);
        if (st == DT_OK && *wrote && !t.fail) {
            t.m = m;
            st = publish_stores(e, &t);
            t.m = NULL;
        }
    }
    free(t.text);
out:
    free(m);
    return st;
}

/* Is this process the decider of the round after cur: no member before it
 * alive? */
static dt_status is_decider(dt_elastic *e, bool *yes) {
    *yes = false;
    for (int i = 0; i < e->rank; i++) {
        bool a;
        DT_CHECK(alive_member(e, &e->cur.m[i], &a));
        if (a)
            return DT_OK;
    }
    *yes = true;
    return DT_OK;
}

/* Adopt membership t (this process's row found, newcomers marked let in). */
static dt_status adopt(dt_elastic *e, table *t, dt_elastic_view *v) {
    if (t->fail)
        return dt_error_set(DT_ERR_PEER, "elastic: %s", t->msg);
    int me = table_find(t, e->id);
    if (me < 0)
        return dt_error_set(DT_ERR_PEER,
                            "elastic: this process was left out of generation %d (it did not "
                            "arrive within %.0f s, DT_TIMEOUT)",
                            t->gen, e->timeout);
    for (int i = 0; i < t->n; i++)
        if (t->m[i].prev < 0) {
            char key[64], val[16];
            snprintf(key, sizeof key, "E/admitted/%s", t->m[i].id);
            snprintf(val, sizeof val, "%d", t->gen);
            DT_CHECK(set_text(e, key, val));
        }
    v->generation = t->gen;
    v->rank = me;
    v->size = t->n;
    v->prev_rank = e->rank >= 0 ? t->m[me].prev : -1;
    v->prev_size = t->prev_size;
    v->root = t->root;
    v->root_step = t->root_step;
    v->joined = 0;
    for (int i = 0; i < t->n; i++)
        v->joined += t->m[i].prev < 0;
    v->lost = t->prev_size - (t->n - v->joined);
    snprintf(v->lost_ranks, sizeof v->lost_ranks, "%s", t->lost);
    table_free(&e->cur);
    e->cur = *t;
    memset(t, 0, sizeof *t);
    e->rank = me;
    e->revoked = false;
    return DT_OK;
}

/* A newcomer: which generation let it in, if any yet. */
static dt_status admitted(dt_elastic *e, int *gen) {
    char key[64], *v;
    *gen = -1;
    snprintf(key, sizeof key, "E/admitted/%s", e->id);
    DT_CHECK(get_opt(e, key, &v));
    if (v && sscanf(v, "%d", gen) != 1)
        *gen = -1;
    dt_free(v);
    if (*gen >= 0)
        return DT_OK;
    bool done;
    DT_CHECK(exists(e, "E/done", &done));
    if (done)
        return dt_error_set(DT_ERR_PEER, "elastic: the job finished before this process was let "
                                         "in");
    DT_CHECK(get_opt(e, "E/stores", &v)); /* where to look should the store move */
    if (v)
        snprintf(e->stores, sizeof e->stores, "%s", v);
    dt_free(v);
    return DT_OK;
}

/* One look at the store: the decision after generation `gen` (*t filled,
 * *found), deciding it first when this process is the decider. */
static dt_status look(dt_elastic *e, double since, table *t, bool *found) {
    *found = false;
    char key[64], *v;
    int gen = e->cur.gen;
    if (gen < 0) { /* a newcomer: the generation it was let into */
        DT_CHECK(admitted(e, &gen));
        if (gen < 0)
            return DT_OK;
        gen--;
    } else {
        bool dec;
        DT_CHECK(is_decider(e, &dec));
        bool wrote;
        if (dec)
            DT_CHECK(decide(e, since, &wrote));
    }
    snprintf(key, sizeof key, "E/g%d/decision", gen + 1);
    DT_CHECK(get_opt(e, key, &v));
    if (!v)
        return DT_OK;
    dt_status st = table_parse(v, t);
    dt_free(v);
    DT_CHECK(st);
    *found = true;
    return DT_OK;
}

dt_status dt_elastic_reform(dt_elastic *e, int64_t step, dt_group **world, dt_elastic_view *view) {
    if (!e || !world || !view)
        return dt_error_set(DT_ERR_INVALID, "dt_elastic_reform: NULL argument");
    *world = NULL;
    memset(view, 0, sizeof *view);
    double t0 = dt_now();
    /* A newcomer may wait long for room (the job at max); a member's round
     * is bounded by twice the decider's wait. */
    double deadline = t0 + 2 * e->timeout;
    bool newcomer = e->rank < 0;
    if (e->rank >= 0)
        e->revoked = true;
    bool need_publish = true;
    double since = t0; /* when this generation's round began here */
    for (unsigned pause_us = 200;;) {
        if (dt_now() > deadline)
            return dt_error_set(DT_ERR_TIMEOUT,
                                e->rank < 0 ? "elastic: not let into the job within %.0f s "
                                              "(DT_TIMEOUT; is the job at its --elastic maximum?)"
                                            : "elastic: the membership round did not finish "
                                              "within %.0f s (DT_TIMEOUT)",
                                2 * e->timeout);
        dt_status st = DT_OK;
        if (need_publish) {
            st = publish(e);
            if (st == DT_OK && e->rank >= 0) {
                char key[64], val[64];
                snprintf(key, sizeof key, "E/reg/%s", e->id);
                snprintf(val, sizeof val, "%d %" PRId64, e->cur.gen, step);
                st = set_text(e, key, val);
            }
            need_publish = st != DT_OK;
        }
        table t = {.gen = -1};
        bool found = false;
        if (st == DT_OK)
            st = look(e, since, &t, &found);
        if (st != DT_OK) {
            DT_CHECK(recover_store(e, st, deadline));
            need_publish = true;
            continue;
        }
        if (!found) {
            usleep(pause_us);
            pause_us = pause_us < 5000 ? pause_us * 2 : 5000;
            continue;
        }
        pause_us = 200;
        int prev = e->rank;
        st = adopt(e, &t, view);
        if (st != DT_OK) {
            table_free(&t);
            return st;
        }
        /* A member that fell behind catches up through revoked generations. */
        char key[64];
        bool gone;
        snprintf(key, sizeof key, "E/g%d/revoked", e->cur.gen);
        st = exists(e, key, &gone);
        if (st == DT_OK && !gone) {
            st = form_group(e, &e->cur, e->rank, world);
            if (st == DT_OK) {
                view->seconds = dt_now() - t0;
                if (prev < 0 || newcomer)
                    view->prev_rank = -1;
                DT_DEBUG("comm", "elastic: generation %d: rank %d of %d (%.3f s)", e->cur.gen,
                         e->rank, e->cur.n, view->seconds);
                return DT_OK;
            }
            DT_DEBUG("comm", "elastic: generation %d did not form: %s", e->cur.gen,
                     dt_last_error());
        }
        /* Revoked (or it failed to form): on to the next round, with the
         * same state. A failure to form may be the store's own: if marking
         * the generation revoked fails too, look for the store. */
        e->revoked = true;
        since = dt_now();
        need_publish = true;
        snprintf(key, sizeof key, "E/g%d/revoked", e->cur.gen);
        st = set_text(e, key, "1");
        if (st != DT_OK)
            DT_CHECK(recover_store(e, st, deadline));
    }
}

/* ------------------------------------------------------------------------ */
/* Leaving                                                                  */
/* ------------------------------------------------------------------------ */

void dt_elastic_destroy(dt_elastic *e) {
    if (!e)
        return;
    char saved[1024]; /* leaving must not eat the caller's error */
    snprintf(saved, sizeof saved, "%s", dt_last_error());
    if (e->store && e->rank >= 0 && e->server) {
        /* The store goes with its host: the job is over for the newcomers
         * still waiting, and the host waits until the other members are
         * gone (left, or dead), so that none loses the store mid-way. (A
         * member that leaves alone is a lost rank to the others.) */
        double dl = dt_now() + (e->timeout < 10 ? e->timeout : 10);
        bool others = set_text(e, "E/done", "1") == DT_OK;
        while (others && dt_now() < dl) {
            others = false;
            for (int i = 0; i < e->cur.n && !others; i++) {
                bool yes = false;
                if (i != e->rank && alive_member(e, &e->cur.m[i], &yes) == DT_OK)
                    others = yes;
            }
            if (others)
                dt_sleep_ms(5);
        }
    }
    dt__store_close(e->store);
    dt__store_server_stop(e->server);
    if (e->serve_fd >= 0)
        close(e->serve_fd);
    table_free(&e->cur);
    free(e->pending);
    free(e);
    dt_error_clear();
    if (saved[0])
        dt_error_set(DT_OK, "%s", saved);
}
