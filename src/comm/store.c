/*
 * store.c — the rendezvous key-value store rank 0 serves over TCP.
 *
 * Ranks use it to exchange addresses, host names and shared-memory names
 * when a group is created; it is idle afterwards. Operations: set, get,
 * wait (client-side polling of get with back-off, bounded by DT_TIMEOUT),
 * atomic add, and the server's trace clock (aligning the ranks' traces). One server thread
 * multiplexes every client with poll().
 *
 * Invariants: every connection passes the token handshake first; every
 * length read from a client is checked (key 1..1024 bytes, value <= 16 MiB)
 * before anything is allocated; a client that misbehaves is dropped, never
 * trusted. A client handle is safe to share between threads (one mutex). A
 * request cut short (I/O error, deadline) poisons the client: the stream is
 * out of step, so later requests fail at once instead of misreading it.
 */
#include "comm_internal.h"
#include "dtrain/trace.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define KV_MAGIC       0x564b5444u /* "DTKV" */
#define KV_MAX_KEY     1024
#define KV_MAX_VAL     ((size_t)16 << 20)
#define KV_MAX_CLIENTS 4096
#define KV_IO_SECONDS  10.0 /* a client must finish a request this fast */

enum { KV_SET = 1, KV_GET = 2, KV_ADD = 3, KV_TIME = 4 };

typedef struct kv_req {
    uint32_t magic;
    uint32_t cmd;
    uint32_t keylen;
    uint32_t reserved;
    uint64_t vallen;
} kv_req;

typedef struct kv_rep {
    uint32_t magic;
    int32_t status;
    uint64_t vallen;
} kv_rep;

typedef struct kv_entry {
    char *key;
    char *val;
    size_t len;
} kv_entry;

struct dt__store_server {
    int lfd;
    int wake[2]; /* pipe: stop request */
    char token[DT__TOKEN_LEN];
    dt_thread *thread;
    kv_entry *kv;
    size_t nkv, cap;
    int *clients;
    size_t nclients;
};

struct dt__store {
    int fd;
    double timeout;
    bool broken; /* a request was cut mid-way: the stream is out of step */
    pthread_mutex_t mu;
};

static kv_entry *kv_find(dt__store_server *s, const char *key) {
    for (size_t i = 0; i < s->nkv; i++)
        if (strcmp(s->kv[i].key, key) == 0)
            return &s->kv[i];
    return NULL;
}

static dt_status kv_put(dt__store_server *s, char *key, char *val, size_t len) {
    kv_entry *e = kv_find(s, key);
    if (e) {
        free(key);
        free(e->val);
        e->val = val;
        e->len = len;
        return DT_OK;
    }
    if (s->nkv == s->cap) {
        size_t cap = s->cap ? 2 * s->cap : 64;
        kv_entry *kv = realloc(s->kv, cap * sizeof *kv);
        if (!kv)
            return dt_error_set(DT_ERR_NOMEM, "store: out of memory");
        s->kv = kv;
        s->cap = cap;
    }
    s->kv[s->nkv++] = (kv_entry){key, val, len};
    return DT_OK;
}

static dt_status reply(int fd, dt_status st, const void *val, size_t len) {
    kv_rep rep = {KV_MAGIC, st, len};
    double dl = dt_now() + KV_IO_SECONDS;
    DT_CHECK(dt__net_write(fd, &rep, sizeof rep, dl));
    if (len)
        DT_CHECK(dt__net_write(fd, val, len, dl));
    return DT_OK;
}

/* Serve one request; a non-OK return drops the client. */
static dt_status serve(dt__store_server *s, int fd) {
    double dl = dt_now() + KV_IO_SECONDS;
    kv_req req;
    DT_CHECK(dt__net_read(fd, &req, sizeof req, dl));
    if (req.magic != KV_MAGIC || req.keylen == 0 || req.keylen > KV_MAX_KEY ||
        req.vallen > KV_MAX_VAL)
        return dt_error_set(DT_ERR_PROTOCOL,
                            "store: bad request (magic 0x%08x, key %u, value %llu)", req.magic,
                            req.keylen, (unsigned long long)req.vallen);
    char *key = malloc(req.keylen + 1);
    char *val = malloc(req.vallen ? req.vallen : 1);
    if (!key || !val) {
        free(key);
        free(val);
        return dt_error_set(DT_ERR_NOMEM, "store: out of memory");
    }
    dt_status st = dt__net_read(fd, key, req.keylen, dl);
    key[req.keylen] = 0;
    if (st == DT_OK && req.vallen)
        st = dt__net_read(fd, val, req.vallen, dl);
    if (st != DT_OK || strlen(key) != req.keylen) {
        free(key);
        free(val);
        return st != DT_OK ? st : dt_error_set(DT_ERR_PROTOCOL, "store: NUL in key");
    }
    switch (req.cmd) {
    case KV_SET:
        st = kv_put(s, key, val, req.vallen);
        if (st != DT_OK) {
            free(val);
            return st;
        }
        return reply(fd, DT_OK, NULL, 0);
    case KV_GET: {
        kv_entry *e = kv_find(s, key);
        free(key);
        free(val);
        return e ? reply(fd, DT_OK, e->val, e->len) : reply(fd, DT_ERR_NOT_FOUND, NULL, 0);
    }
    case KV_ADD: {
        int64_t delta, cur = 0;
        if (req.vallen != sizeof delta) {
            free(key);
            free(val);
            return dt_error_set(DT_ERR_PROTOCOL, "store: add with a %llu-byte value",
                                (unsigned long long)req.vallen);
        }
        memcpy(&delta, val, sizeof delta);
        kv_entry *e = kv_find(s, key);
        if (e && e->len == sizeof cur)
            memcpy(&cur, e->val, sizeof cur);
        cur = (int64_t)((uint64_t)cur + (uint64_t)delta);
        memcpy(val, &cur, sizeof cur);
        char *copy = malloc(sizeof cur);
        if (!copy) {
            free(key);
            free(val);
            return dt_error_set(DT_ERR_NOMEM, "store: out of memory");
        }
        memcpy(copy, &cur, sizeof cur);
        st = kv_put(s, key, copy, sizeof cur);
        if (st != DT_OK) {
            free(copy);
            free(val);
            return st;
        }
        st = reply(fd, DT_OK, val, sizeof cur);
        free(val);
        return st;
    }
    case KV_TIME: {
        /* Stamped as late as possible: the client brackets the request
         * with its own clock, and this reading lies inside the bracket. */
        free(key);
        free(val);
        uint64_t now = dt_trace_now();
        return reply(fd, DT_OK, &now, sizeof now);
    }
    default:
        free(key);
        free(val);
        return dt_error_set(DT_ERR_PROTOCOL, "store: unknown command %u", req.cmd);
    }
}

static void drop_client(dt__store_server *s, size_t i) {
    close(s->clients[i]);
    s->clients[i] = s->clients[--s->nclients];
}

static void *server_main(void *arg) {
    dt__store_server *s = arg;
    struct pollfd *pf = NULL;
    size_t pfcap = 0;
    for (;;) {
        size_t n = s->nclients + 2;
        if (n > pfcap) {
            struct pollfd *np = realloc(pf, n * sizeof *pf);
            if (!np) {
                dt_sleep_ms(10);
                continue;
            }
            pf = np;
            pfcap = n;
        }
        pf[0] = (struct pollfd){.fd = s->wake[0], .events = POLLIN};
        pf[1] = (struct pollfd){.fd = s->lfd, .events = POLLIN};
        for (size_t i = 0; i < s->nclients; i++)
            pf[i + 2] = (struct pollfd){.fd = s->clients[i], .events = POLLIN};
        int rc = poll(pf, (nfds_t)n, 1000);
        if (rc < 0 && errno != EINTR)
            break;
        if (rc <= 0)
            continue;
        if (pf[0].revents)
            break;
        /* Serve existing clients first (from the back: drop_client moves
         * the last one into the hole). */
        for (size_t i = s->nclients; i-- > 0;) {
            if (!pf[i + 2].revents)
                continue;
            if (serve(s, s->clients[i]) != DT_OK) {
                if (dt_last_error()[0] && !strstr(dt_last_error(), "closed by peer"))
                    DT_DEBUG("comm", "store: dropping a client: %s", dt_last_error());
                drop_client(s, i);
            }
        }
        if (pf[1].revents & POLLIN) {
            int fd = accept4(s->lfd, NULL, NULL, SOCK_CLOEXEC);
            if (fd < 0)
                continue;
            dt__net_tune(fd, 0);
            dt__hs hs;
            char tok[DT__TOKEN_LEN + 1];
            memcpy(tok, s->token, DT__TOKEN_LEN);
            if (dt__net_hs_server(fd, tok, DT__HS_STORE, &hs, dt_now() + KV_IO_SECONDS) != DT_OK ||
                s->nclients >= KV_MAX_CLIENTS) {
                DT_WARN("store: %s", dt_last_error());
                close(fd);
                continue;
            }
            int *nc = realloc(s->clients, (s->nclients + 1) * sizeof *nc);
            if (!nc) {
                close(fd);
                continue;
            }
            s->clients = nc;
            s->clients[s->nclients++] = fd;
        }
    }
    free(pf);
    return NULL;
}

dt_status dt__store_server_start(const char *addr, int port, const char *token,
                                 dt__store_server **out, int *bound_port) {
    dt__store_server *s = calloc(1, sizeof *s);
    if (!s)
        return dt_error_set(DT_ERR_NOMEM, "store: out of memory");
    s->wake[0] = s->wake[1] = -1;
    memcpy(s->token, token, DT__TOKEN_LEN);
    dt_status st = dt__net_listen(addr, port, &s->lfd, bound_port);
    if (st != DT_OK) {
        free(s);
        dt_error_prefix("store server on port %d", port);
        return st;
    }
    if (pipe2(s->wake, O_CLOEXEC) < 0) {
        st = dt_error_set_errno(DT_ERR_SYSTEM, "pipe");
        close(s->lfd);
        free(s);
        return st;
    }
    st = dt_thread_create(&s->thread, "dt-store", server_main, s);
    if (st != DT_OK) {
        close(s->lfd);
        close(s->wake[0]);
        close(s->wake[1]);
        free(s);
        return st;
    }
    *out = s;
    return DT_OK;
}

void dt__store_server_stop(dt__store_server *s) {
    if (!s)
        return;
    char c = 1;
    ssize_t w;
    do
        w = write(s->wake[1], &c, 1);
    while (w < 0 && errno == EINTR);
    dt_thread_join(s->thread);
    for (size_t i = 0; i < s->nclients; i++)
        close(s->clients[i]);
    free(s->clients);
    for (size_t i = 0; i < s->nkv; i++) {
        free(s->kv[i].key);
        free(s->kv[i].val);
    }
    free(s->kv);
    close(s->lfd);
    close(s->wake[0]);
    close(s->wake[1]);
    free(s);
}

dt_status dt__store_connect(const char *host, int port, const char *token, double timeout,
                            dt__store **out) {
    double dl = dt_now() + timeout;
    int fd;
    DT_CHECK(dt__net_connect(host, port, dl, &fd));
    dt__net_tune(fd, 0);
    dt__hs hs = {.purpose = DT__HS_STORE, .rank = -1, .index = 0};
    memcpy(hs.token, token, DT__TOKEN_LEN);
    dt_status st = dt__net_hs_client(fd, &hs, dl);
    if (st != DT_OK) {
        close(fd);
        dt_error_prefix("store at %s:%d", host, port);
        return st;
    }
    dt__store *s = calloc(1, sizeof *s);
    if (!s) {
        close(fd);
        return dt_error_set(DT_ERR_NOMEM, "store: out of memory");
    }
    s->fd = fd;
    s->timeout = timeout;
    pthread_mutex_init(&s->mu, NULL);
    *out = s;
    return DT_OK;
}

void dt__store_close(dt__store *s) {
    if (!s)
        return;
    close(s->fd);
    pthread_mutex_destroy(&s->mu);
    free(s);
}

static dt_status request(dt__store *s, uint32_t cmd, const char *key, const void *val, size_t len,
                         void **rval, size_t *rlen, double seconds) {
    size_t kl = strlen(key);
    if (kl == 0 || kl > KV_MAX_KEY || len > KV_MAX_VAL)
        return dt_error_set(DT_ERR_INVALID, "store: key of %zu bytes / value of %zu bytes", kl,
                            len);
    double dl = dt_now() + seconds;
    kv_req req = {KV_MAGIC, cmd, (uint32_t)kl, 0, len};
    kv_rep rep;
    dt_status st;
    bool whole = false; /* the reply was read to its end */
    pthread_mutex_lock(&s->mu);
    if (s->broken) {
        st = dt_error_set(DT_ERR_PEER, "store: connection unusable after an earlier failure");
        goto out;
    }
    DT_CHECK_GOTO(dt__net_write(s->fd, &req, sizeof req, dl), st, out);
    DT_CHECK_GOTO(dt__net_write(s->fd, key, kl, dl), st, out);
    if (len)
        DT_CHECK_GOTO(dt__net_write(s->fd, val, len, dl), st, out);
    DT_CHECK_GOTO(dt__net_read(s->fd, &rep, sizeof rep, dl), st, out);
    if (rep.magic != KV_MAGIC || rep.vallen > KV_MAX_VAL) {
        st = dt_error_set(DT_ERR_PROTOCOL, "store: bad reply (magic 0x%08x, %llu bytes)", rep.magic,
                          (unsigned long long)rep.vallen);
        goto out;
    }
    void *buf = dt_alloc(rep.vallen + 1);
    if (!buf) {
        st = DT_ERR_NOMEM;
        goto out;
    }
    st = rep.vallen ? dt__net_read(s->fd, buf, rep.vallen, dl) : DT_OK;
    if (st != DT_OK) {
        dt_free(buf);
        goto out;
    }
    whole = true;
    ((char *)buf)[rep.vallen] = 0; /* values are often text */
    if (rval) {
        *rval = buf;
        *rlen = rep.vallen;
    } else {
        dt_free(buf);
    }
    st = (dt_status)rep.status;
    if (st == DT_ERR_NOT_FOUND)
        dt_error_set(st, "store: no key \"%s\"", key);
    else if (st != DT_OK)
        dt_error_set(st, "store: request for \"%s\" failed", key);
    if (st != DT_OK && rval) {
        dt_free(*rval);
        *rval = NULL;
    }
out:
    if (!whole)
        s->broken = true; /* a later request would read this one's leftovers */
    pthread_mutex_unlock(&s->mu);
    if (st != DT_OK && st != DT_ERR_NOT_FOUND)
        dt_error_prefix("store");
    return st;
}

dt_status dt__store_set(dt__store *s, const char *key, const void *val, size_t len) {
    return request(s, KV_SET, key, val, len, NULL, NULL, s->timeout);
}

dt_status dt__store_get(dt__store *s, const char *key, void **val, size_t *len) {
    return request(s, KV_GET, key, NULL, 0, val, len, s->timeout);
}

dt_status dt__store_set_within(dt__store *s, const char *key, const void *val, size_t len,
                               double seconds) {
    return request(s, KV_SET, key, val, len, NULL, NULL, seconds);
}

dt_status dt__store_get_within(dt__store *s, const char *key, void **val, size_t *len,
                               double seconds) {
    return request(s, KV_GET, key, NULL, 0, val, len, seconds);
}

dt_status dt__store_wait(dt__store *s, const char *key, void **val, size_t *len) {
    double dl = dt_now() + s->timeout;
    unsigned us = 50;
    for (;;) {
        dt_status st = dt__store_get(s, key, val, len);
        if (st != DT_ERR_NOT_FOUND)
            return st;
        if (dt_now() > dl)
            return dt_error_set(DT_ERR_TIMEOUT,
                                "store: key \"%s\" did not appear within DT_TIMEOUT=%.0f s (a rank "
                                "did not join?)",
                                key, s->timeout);
        usleep(us);
        if (us < 5000)
            us *= 2;
    }
}

dt_status dt__store_add(dt__store *s, const char *key, int64_t delta, int64_t *result) {
    void *v = NULL;
    size_t len = 0;
    DT_CHECK(request(s, KV_ADD, key, &delta, sizeof delta, &v, &len, s->timeout));
    if (len != sizeof *result) {
        dt_free(v);
        return dt_error_set(DT_ERR_PROTOCOL, "store: add replied %zu bytes", len);
    }
    memcpy(result, v, sizeof *result);
    dt_free(v);
    return DT_OK;
}

dt_status dt__store_time(dt__store *s, uint64_t *sent, uint64_t *server, uint64_t *received) {
    void *v = NULL;
    size_t len = 0;
    *sent = dt_trace_now();
    DT_CHECK(request(s, KV_TIME, "t", NULL, 0, &v, &len, s->timeout));
    *received = dt_trace_now();
    if (len != sizeof *server) {
        dt_free(v);
        return dt_error_set(DT_ERR_PROTOCOL, "store: time replied %zu bytes", len);
    }
    memcpy(server, v, sizeof *server);
    dt_free(v);
    return DT_OK;
}
