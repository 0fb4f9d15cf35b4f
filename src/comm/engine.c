/*
 * engine.c — the primitives algorithms are written in: post a send, post a
 * receive (optionally reducing as it lands), wait. It drives every
 * transport of the group from the calling thread and is where waiting
 * policy lives: spin a little (cheap when cores are free), then sleep in the
 * transport (futex for shm, poll for tcp) so an idle rank burns no core.
 *
 * Invariants: every wait is bounded by DT_TIMEOUT seconds without progress;
 * peer liveness is checked every 50 ms while waiting; dt_group_abort() is
 * noticed within one sleep (<= 20 ms). Algorithms never see a transport.
 */
#include "comm_internal.h"

#include <sched.h>
#include <stdio.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define cpu_relax() _mm_pause()
#else
#define cpu_relax() ((void)0)
#endif

void dt__team_all(dt_group *g, dt__team *t, int *unused) {
    (void)unused;
    t->n = g->size;
    t->me = g->rank;
    t->ranks = g->ident;
}

static dt__transport *tp_of(dt__op *op, int peer) {
    DT_ASSERT(peer >= 0 && peer < op->g->size && peer != op->g->rank);
    dt__transport *t = op->g->tp[peer];
    DT_ASSERT(t);
    return t;
}

static void xfer_init(dt__op *op, dt__xfer *x, int peer, bool is_send, const void *buf,
                      size_t len) {
    memset(x, 0, offsetof(dt__xfer, parts));
    x->nparts = 0;
    x->reduce = false;
    x->reduced = false;
    x->peer = peer;
    x->is_send = is_send;
    x->buf = (char *)buf;
    x->len = len;
    x->hdr = op->desc;
    x->hdr.src = op->g->rank;
    x->hdr.offset = 0;
    x->hdr.len = len;
}

dt_status dt__post_send(dt__op *op, dt__xfer *x, int peer, const void *buf, size_t len) {
    xfer_init(op, x, peer, true, buf, len);
    dt__transport *t = tp_of(op, peer);
    return t->ops->post_send(t, x);
}

dt_status dt__post_recv(dt__op *op, dt__xfer *x, int peer, void *buf, size_t len) {
    xfer_init(op, x, peer, false, buf, len);
    dt__transport *t = tp_of(op, peer);
    return t->ops->post_recv(t, x);
}

dt_status dt__post_item(dt__op *op, dt__xfer *x, const dt__p2p_item *it) {
    size_t len = it->p.count * dt_dtype_size(it->p.dtype);
    xfer_init(op, x, it->p.peer, it->p.send, it->p.buf, len);
    x->hdr.coll = (uint8_t)(it->p.send ? DT_COLL_SEND : DT_COLL_RECV);
    x->hdr.dtype = (uint8_t)it->p.dtype;
    x->hdr.redop = DT_SUM;
    x->hdr.root = it->p.peer;
    x->hdr.tag = it->p.tag;
    x->hdr.seq = it->seq;
    x->hdr.count = it->p.count;
    dt__transport *t = tp_of(op, it->p.peer);
    return it->p.send ? t->ops->post_send(t, x) : t->ops->post_recv(t, x);
}

dt_status dt__post_recv_reduce(dt__op *op, dt__xfer *x, int peer, void *tmp, size_t len, void *out,
                               const void *in) {
    xfer_init(op, x, peer, false, tmp, len);
    x->reduce = true;
    x->red_out = out;
    x->red_in = in;
    x->dtype = op->dtype;
    x->redop = op->redop;
    dt__transport *t = tp_of(op, peer);
    return t->ops->post_recv(t, x);
}

static dt_status progress_all(dt_group *g, bool *progressed) {
    if (g->shm)
        DT_CHECK(g->shm->ops->progress(g->shm, progressed));
    if (g->tcp)
        DT_CHECK(g->tcp->ops->progress(g->tcp, progressed));
    return DT_OK;
}

static dt_status check_all(dt__op *op) {
    dt_group *g = op->g;
    if (g->shm)
        DT_CHECK(g->shm->ops->check(g->shm, &op->desc));
    if (g->tcp)
        DT_CHECK(g->tcp->ops->check(g->tcp, &op->desc));
    return DT_OK;
}

/* Transports describe what broke; say in which call it happened. A
 * mismatch seen here already names both calls ("rank 1 called ... but rank
 * 0 called ..."); one reported by a peer that gave up does not. */
dt_status dt__op_error(dt__op *op, dt_status st) {
    if (st != DT_ERR_MISMATCH || !strstr(dt_last_error(), " but rank ")) {
        char d[160];
        dt__desc_format(&op->desc, d, sizeof d);
        dt_error_prefix("%s on rank %d", d, op->g->rank);
    }
    return st;
}

/* Give up the shm sleep announced by arm() (the last look found work). */
static void disarm(dt_group *g, bool *armed, uint64_t tok) {
    if (*armed)
        g->shm->ops->block(g->shm, tok, 0);
    *armed = false;
}

/* "rank 2" or "ranks 1, 3": the ranks this wait needs something from. */
static void waited_for(dt__op *op, int (*behind)(void *, int *, int), void *arg, char *buf,
                       size_t len) {
    dt_group *g = op->g;
    int ranks[64], n = 0;
    if (behind)
        n = behind(arg, ranks, 64);
    if (g->shm && g->shm->ops->pending)
        n += g->shm->ops->pending(g->shm, ranks + n, 64 - n);
    if (g->tcp && g->tcp->ops->pending)
        n += g->tcp->ops->pending(g->tcp, ranks + n, 64 - n);
    size_t at = 0;
    buf[0] = '\0';
    for (int i = 0, shown = 0; i < n && at < len; i++) {
        bool dup = false;
        for (int j = 0; j < i; j++)
            dup = dup || ranks[j] == ranks[i];
        if (dup)
            continue;
        at += (size_t)snprintf(buf + at, len - at, "%s%d", shown++ ? ", " : "", ranks[i]);
    }
}

static dt_status timed_out(dt__op *op, int (*behind)(void *, int *, int), void *arg) {
    dt_group *g = op->g;
    char d[160], who[256];
    dt__desc_format(&op->desc, d, sizeof d);
    waited_for(op, behind, arg, who, sizeof who);
    if (!who[0])
        return dt_error_set(DT_ERR_TIMEOUT,
                            "%s on rank %d: no progress for DT_TIMEOUT=%.0f s (a peer is "
                            "stuck or never called it)",
                            d, g->rank, g->cfg.timeout);
    const char *ranks = strchr(who, ',') ? "ranks" : "rank";
    if (dt__is_p2p(op->desc.coll))
        return dt_error_set(DT_ERR_TIMEOUT,
                            "%s on rank %d: no progress for DT_TIMEOUT=%.0f s waiting for %s %s "
                            "(stuck, or never posted the matching transfer)",
                            d, g->rank, g->cfg.timeout, ranks, who);
    return dt_error_set(DT_ERR_TIMEOUT,
                        "%s on rank %d: no progress for DT_TIMEOUT=%.0f s waiting for %s %s "
                        "(stuck, or never called %s #%llu)",
                        d, g->rank, g->cfg.timeout, ranks, who,
                        dt_coll_name((dt_coll)op->desc.coll), (unsigned long long)op->desc.seq);
}

dt_status dt__wait_pred(dt__op *op, bool (*pred)(void *), void *arg) {
    return dt__wait_pred_from(op, pred, NULL, arg);
}

dt_status dt__wait_pred_from(dt__op *op, bool (*pred)(void *), int (*behind)(void *, int *, int),
                             void *arg) {
    dt_group *g = op->g;
    /* "No progress for DT_TIMEOUT" is timed from the first time this wait
     * gets past its yields: a wait that ends within them (every small
     * message on a healthy group) reads no clock. */
    double deadline = 0, next_check = 0;
    /* spin budget in ns, measured from the last progress or wake-up */
    uint64_t spin_ns = (uint64_t)g->cfg.spin * 1000u, spin_from = 0, tok = 0;
    int yields = 0;
    bool armed = false; /* shm sleep announced: one more look, then block */
    for (;;) {
        bool progressed = false;
        dt_status st = progress_all(g, &progressed);
        bool done = st == DT_OK && pred(arg);
        if (st != DT_OK || done || progressed)
            disarm(g, &armed, tok);
        if (st != DT_OK)
            return dt__op_error(op, st);
        if (done)
            return DT_OK;
        if (atomic_load_explicit(&g->aborted, memory_order_relaxed)) {
            disarm(g, &armed, tok);
            char d[160];
            dt__desc_format(&op->desc, d, sizeof d);
            return dt_error_set(DT_ERR_ABORTED, "%s on rank %d: the group was aborted", d, g->rank);
        }
        if (progressed) {
            spin_from = 0;
            yields = 0;
            deadline = 0;
            continue;
        }
        if (armed) { /* the look after arm() found nothing: sleep */
            if (g->tcp) {
                g->tcp->ops->block(g->tcp, 0, 0);
                g->shm->ops->block(g->shm, tok, 1);
            } else {
                g->shm->ops->block(g->shm, tok, 20);
            }
            armed = false;
            spin_from = dt_now_ns() - spin_ns / 2; /* half a spin after each wake-up */
            continue;
        }
        /* Spinning pays only where polling is a memory read (shm); a TCP
         * poll is a system call, and sleeping in poll() wakes on data. */
        if (g->shm && spin_ns) {
            uint64_t t = dt_now_ns();
            if (!spin_from)
                spin_from = t;
            if (t - spin_from < spin_ns) {
                cpu_relax();
                continue;
            }
        }
        /* When ranks outnumber cores the peer we wait for is often runnable
         * but not running: handing it our core now beats a futex round
         * trip. A few yields, then sleep. The same holds for TCP: on
         * loopback the bytes we wait for are copied by the peer's own
         * sendmsg(), so it needs a core, and a yield that finds nobody
         * else runnable returns at once and polls again instead of paying
         * a sleep and an interrupt-driven wake-up in poll() (measured,
         * 4 ranks on 2 cores: allreduce 1-2 MiB 1.4-1.5 -> 1.9-2.2 GB/s,
         * 4-16 MiB +5-15%; 2 ranks: +10-30% at 1-2 MiB). */
        if (yields < g->cfg.yield) {
            yields++;
            sched_yield();
            continue;
        }
        double now = dt_now();
        if (!deadline) {
            deadline = now + g->cfg.timeout;
            if (g->shm && g->shm->ops->waiting)
                g->shm->ops->waiting(g->shm, &op->desc);
        }
        if (now >= next_check) {
            st = check_all(op);
            if (st != DT_OK)
                return dt__op_error(op, st);
            next_check = now + 0.05;
        }
        if (now > deadline)
            return timed_out(op, behind, arg);
        if (g->shm) { /* announce, look once more (loop top), then block */
            tok = g->shm->ops->arm(g->shm);
            armed = true;
            continue;
        }
        if (g->tcp)
            g->tcp->ops->block(g->tcp, 0, 20);
        spin_from = dt_now_ns() - spin_ns / 2;
    }
}

static void finish_reduce(dt__xfer *x) {
    if (x->reduce && !x->reduced && x->done) {
        size_t es = dt_dtype_size(x->dtype);
        dt_reduce(x->red_out, x->red_in, x->buf, x->len / es, x->dtype, x->redop);
        x->reduced = true;
    }
}

static bool one_done(void *arg) { return ((dt__xfer *)arg)->done; }

dt_status dt__wait(dt__op *op, dt__xfer *x) {
    DT_CHECK(dt__wait_pred(op, one_done, x));
    finish_reduce(x);
    return DT_OK;
}

typedef struct many {
    dt__xfer *xs;
    int n;
    int first; /* all before first are known done */
} many;

static bool all_done(void *arg) {
    many *m = arg;
    while (m->first < m->n && m->xs[m->first].done)
        m->first++;
    return m->first == m->n;
}

dt_status dt__waitall(dt__op *op, dt__xfer *xs, int n) {
    many m = {xs, n, 0};
    DT_CHECK(dt__wait_pred(op, all_done, &m));
    for (int i = 0; i < n; i++)
        finish_reduce(&xs[i]);
    return DT_OK;
}

dt_status dt__sendrecv(dt__op *op, int to, const void *sbuf, size_t slen, int from, void *rbuf,
                       size_t rlen) {
    dt__xfer x[2];
    int n = 0;
    if (from >= 0)
        DT_CHECK(dt__post_recv(op, &x[n++], from, rbuf, rlen));
    if (to >= 0)
        DT_CHECK(dt__post_send(op, &x[n++], to, sbuf, slen));
    return dt__waitall(op, x, n);
}

dt_status dt__scratch(dt_group *g, size_t bytes, void **out) {
    if (bytes > g->scratch_size) {
        void *p = dt_alloc(bytes);
        if (!p)
            return dt_error_set(DT_ERR_NOMEM, "comm: cannot allocate %zu bytes of scratch", bytes);
        dt_free(g->scratch);
        g->scratch = p;
        g->scratch_size = bytes;
    }
    *out = g->scratch;
    return DT_OK;
}
