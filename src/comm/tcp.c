/*
 * tcp.c — the TCP transport: full mesh of non-blocking sockets between the
 * group's ranks, several sockets per pair.
 *
 * A message is one or more frames (64-byte header + payload). Messages of at
 * least DT_TCP_STRIPE_MIN bytes are cut into one part per socket so that a
 * pair uses several connections (and kernel queues) at once; smaller ones go
 * whole on the sockets in turn. Sender and receiver derive the same split
 * from the message length and a per-pair message counter, so each socket is
 * its own FIFO and no reordering logic is needed.
 *
 * Invariants: sockets are non-blocking and progress() never blocks; a frame
 * header is validated and matched against the posted receive before its
 * payload is accepted; the payload is read straight into the caller's buffer
 * and never past the posted length; data for a receive not yet posted stays
 * in the kernel (that is the flow control). A closed connection is
 * DT_ERR_PEER unless the peer said goodbye (BYE frame) first.
 *
 * Naming the lost rank. A rank that gives up because a third rank died
 * closes its connections too, and its survivors must not blame it. It says
 * why twice: an ABORT frame on every socket that is between frames, and,
 * first of all and before any socket closes, a record "<group>/gaveup/<me>"
 * = lost rank in the rendezvous store. The frame is cheap but cannot be
 * read when every socket of the pair is mid-frame (striped payload on all
 * of them, as in halving-doubling), so on a lost connection a survivor
 * looks for the frame, then for the record (one request, at most
 * ABORT_STORE_SECONDS), and only then blames the peer. No record means the
 * peer itself died: the record precedes the close, so there is no race. A
 * dedicated control socket per pair was the alternative; it costs a socket,
 * a poll slot and connection-setup code on every pair for a rare path, and
 * the store is already connected. Its limit: when the store's host (world
 * rank 0) is gone, the record cannot be written or read and the survivor
 * falls back to the frame or to blaming the peer.
 */
#include "comm_internal.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#define ABORT_STORE_SECONDS 2.0 /* bound on each store request on a failure path */

typedef struct tsock {
    int fd;
    dt__part *sq, *sq_tail; /* parts to send, FIFO */
    dt__part *rq, *rq_tail; /* parts to receive, FIFO */
    bool quiet;             /* peer closed after BYE: stop watching it */
    bool parked;            /* peer gave up in a collective while a point-to-point
                               call ran that does not use this socket: not
                               watched until a later call must hear it */
    bool midframe;          /* a frame is partly written (abort must not cut in) */
} tsock;

typedef struct tpeer {
    int rank;
    int nsock;
    uint64_t nsent, nrecv; /* messages, for the socket choice of small ones */
    bool bye;              /* peer left cleanly */
    tsock s[DT__MAX_SOCKS];
} tpeer;

typedef struct tcp_t {
    dt__transport base;
    dt_group *g;
    int npeers;
    tpeer *peers;
    int *idx; /* [group size] index into peers or -1 */
    struct pollfd *pfd;
    size_t stripe;
    int wake_fd; /* eventfd: notify(own rank) ends a block() from another thread */
} tcp_t;

static tpeer *peer_of(tcp_t *t, int rank) {
    DT_ASSERT(rank >= 0 && rank < t->g->size && t->idx[rank] >= 0);
    return &t->peers[t->idx[rank]];
}

/* Split [0, len) into parts; both sides compute the same thing. */
static void plan(tcp_t *t, tpeer *p, dt__xfer *x, uint64_t *counter) {
    int k = (x->len >= t->stripe && p->nsock > 1) ? p->nsock : 1;
    int first = k == 1 ? (int)(*counter % (uint64_t)p->nsock) : 0;
    (*counter)++;
    uint64_t per = (x->len / (uint64_t)k + 4095) & ~(uint64_t)4095;
    x->nparts = k;
    x->parts_done = 0;
    for (int j = 0; j < k; j++) {
        dt__part *pt = &x->parts[j];
        uint64_t off = per * (uint64_t)j;
        if (off > x->len)
            off = x->len;
        uint64_t end = j == k - 1 ? x->len : off + per;
        if (end > x->len)
            end = x->len;
        *pt = (dt__part){.x = x, .offset = off, .len = end - off};
        pt->hdr = x->hdr;
        pt->hdr.offset = off;
        pt->hdr.len = end - off;
        tsock *s = &p->s[first + j];
        if (x->is_send) {
            if (s->sq_tail)
                s->sq_tail->next = pt;
            else
                s->sq = pt;
            s->sq_tail = pt;
        } else {
            if (s->rq_tail)
                s->rq_tail->next = pt;
            else
                s->rq = pt;
            s->rq_tail = pt;
        }
    }
}

static dt_status tcp_post_send(dt__transport *tr, dt__xfer *x) {
    tcp_t *t = (tcp_t *)tr;
    tpeer *p = peer_of(t, x->peer);
    plan(t, p, x, &p->nsent);
    return DT_OK;
}

static dt_status tcp_post_recv(dt__transport *tr, dt__xfer *x) {
    tcp_t *t = (tcp_t *)tr;
    tpeer *p = peer_of(t, x->peer);
    plan(t, p, x, &p->nrecv);
    return DT_OK;
}

static void part_done(dt__part *pt) {
    dt__xfer *x = pt->x;
    x->moved += pt->len;
    if (++x->parts_done == x->nparts)
        x->done = true;
}

/* If the peer left an ABORT frame on any of its sockets, that is the real
 * story (it gave up because of someone else, or because its call differed
 * from a peer's); report it and return its status, else DT_OK. */
static dt_status explain(tcp_t *t, tpeer *p) {
    for (int j = 0; j < p->nsock; j++) {
        dt__wire_hdr raw, h;
        if (p->s[j].rq && p->s[j].rq->hdr_done != 0)
            continue; /* mid-frame: the next bytes are payload */
        if (recv(p->s[j].fd, &raw, sizeof raw, MSG_PEEK | MSG_DONTWAIT) == (ssize_t)sizeof raw &&
            dt__wire_decode(&raw, sizeof raw, &h) == DT_OK && h.kind == DT__MSG_ABORT) {
            if (h.root >= 0 && h.root < t->g->size)
                atomic_store(&t->g->lost, h.root);
            return dt__abort_error(p->rank, (dt_status)h.status, h.root, t->g->size, false);
        }
    }
    return DT_OK;
}

static void abort_key(const tcp_t *t, int rank, char *key, size_t n) {
    snprintf(key, n, "%s/gaveup/%d", t->g->id, rank);
}

/* The out-of-band record "<status> <lost rank> <seq>" a rank that gave up
 * posted before it closed anything (tcp_abort): why, whom it blamed, in
 * which collective. Absent: the peer itself died. The lookup is bounded by
 * ABORT_STORE_SECONDS; a store that is gone (its host died) is no answer,
 * and the peer is blamed. Returns the recorded status, or DT_OK (also for
 * a failure in a collective after `cur`, when cur is given: see
 * dt__abort_later). */
static dt_status recorded(tcp_t *t, tpeer *p, const dt__wire_hdr *cur, bool busy, bool *later) {
    dt__store *st = t->g->job->store;
    *later = false;
    if (!st)
        return DT_OK;
    char key[128];
    abort_key(t, p->rank, key, sizeof key);
    void *v = NULL;
    size_t len = 0;
    if (dt__store_get_within(st, key, &v, &len, ABORT_STORE_SECONDS) != DT_OK)
        return DT_OK;
    char *end, *at, *at2; /* the store NUL-terminates every value it returns */
    long status = strtol(v, &at, 10), root = strtol(at, &at2, 10);
    unsigned long long seq = strtoull(at2, &end, 10);
    bool ok = end != at2 && *end == 0 &&
              ((status == DT_ERR_PEER && root >= 0 && root < t->g->size) ||
               (status == DT_ERR_MISMATCH && root == -1));
    dt_free(v);
    if (ok && cur && dt__abort_later(seq, cur, busy))
        *later = true;
    if (!ok || *later)
        return DT_OK;
    if (root >= 0)
        atomic_store(&t->g->lost, (int)root);
    return dt__abort_error(p->rank, (dt_status)status, (int)root, t->g->size, true);
}

static dt_status lost(tcp_t *t, tpeer *p, const char *what, int err) {
    bool later;
    dt_status why = explain(t, p);
    if (why == DT_OK)
        why = recorded(t, p, NULL, true, &later);
    if (why != DT_OK)
        return why;
    atomic_store(&t->g->lost, p->rank);
    if (err)
        return dt_error_set(DT_ERR_PEER, "%s (%s): rank %d is lost", what, strerror(err), p->rank);
    return dt_error_set(DT_ERR_PEER, "%s: rank %d is lost", what, p->rank);
}

/* What is left of a part's frame as at most two iovecs (header, payload);
 * returns how many. */
static int part_iov(dt__part *pt, struct iovec iov[2]) {
    int n = 0;
    if (pt->hdr_done < sizeof pt->hdr)
        iov[n++] = (struct iovec){(char *)&pt->hdr + pt->hdr_done, sizeof pt->hdr - pt->hdr_done};
    if (pt->done < pt->len)
        iov[n++] = (struct iovec){pt->x->buf + pt->offset + pt->done, pt->len - pt->done};
    return n;
}

/* Account r bytes moved through part_iov's vectors: header first, then payload. */
static void part_advance(dt__part *pt, size_t r) {
    size_t h = sizeof pt->hdr - pt->hdr_done;
    if (r >= h) {
        pt->hdr_done = sizeof pt->hdr;
        pt->done += (uint64_t)(r - h);
    } else {
        pt->hdr_done += (unsigned)r;
    }
}

static dt_status drive_send(tcp_t *t, tpeer *p, tsock *s, bool *progressed) {
    while (s->sq) {
        dt__part *pt = s->sq;
        struct iovec iov[2];
        int n = part_iov(pt, iov);
        ssize_t r = 0;
        if (n > 0) {
            struct msghdr mh = {.msg_iov = iov, .msg_iovlen = (size_t)n};
            r = sendmsg(s->fd, &mh, MSG_DONTWAIT | MSG_NOSIGNAL);
            if (r < 0) {
                if (errno == EAGAIN || errno == EWOULDBLOCK)
                    return DT_OK;
                if (errno == EINTR)
                    continue;
                return lost(t, p, "sending failed", errno);
            }
            *progressed = true;
            part_advance(pt, (size_t)r);
            s->midframe = true;
        }
        if (pt->hdr_done == sizeof pt->hdr && pt->done == pt->len) {
            s->midframe = false;
            s->sq = pt->next;
            if (!s->sq)
                s->sq_tail = NULL;
            part_done(pt);
        } else if (r == 0) {
            return DT_OK;
        }
    }
    return DT_OK;
}

static dt_status drive_recv(tcp_t *t, tpeer *p, tsock *s, bool *progressed) {
    while (s->rq) {
        dt__part *pt = s->rq;
        dt__xfer *x = pt->x;
        /* Reading the payload in the same call saves a syscall per message;
         * it lands inside the posted range whatever the header says, and a
         * bad header fails the operation before anyone looks at it. */
        struct iovec iov[2];
        int n = part_iov(pt, iov);
        if (n > 0) {
            struct msghdr mh = {.msg_iov = iov, .msg_iovlen = (size_t)n};
            ssize_t r = recvmsg(s->fd, &mh, MSG_DONTWAIT);
            if (r == 0) {
                if (pt->hdr_done == 0 && p->bye)
                    return dt_error_set(DT_ERR_PEER,
                                        "rank %d left the group (clean exit) while "
                                        "rank %d still expected data",
                                        p->rank, t->g->rank);
                return lost(t, p, "connection closed by the peer", 0);
            }
            if (r < 0) {
                if (errno == EAGAIN || errno == EWOULDBLOCK)
                    return DT_OK;
                if (errno == EINTR)
                    continue;
                return lost(t, p, "receiving failed", errno);
            }
            *progressed = true;
            unsigned before = pt->hdr_done;
            part_advance(pt, (size_t)r);
            if (before < sizeof pt->hdr && pt->hdr_done == sizeof pt->hdr) {
                dt__wire_hdr got;
                DT_CHECK(dt__wire_decode(&pt->hdr, sizeof pt->hdr, &got));
                if (got.kind == DT__MSG_ABORT && got.root >= 0 && got.root < t->g->size)
                    atomic_store(&t->g->lost, got.root);
                DT_CHECK(dt__wire_check(&got, &x->hdr, t->g->rank, p->rank, pt->offset, pt->len));
            }
        }
        if (pt->hdr_done == sizeof pt->hdr && pt->done == pt->len) {
            s->rq = pt->next;
            if (!s->rq)
                s->rq_tail = NULL;
            part_done(pt);
        } else {
            return DT_OK;
        }
    }
    return DT_OK;
}

static dt_status tcp_progress(dt__transport *tr, bool *progressed) {
    tcp_t *t = (tcp_t *)tr;
    for (int i = 0; i < t->npeers; i++) {
        tpeer *p = &t->peers[i];
        for (int j = 0; j < p->nsock; j++) {
            tsock *s = &p->s[j];
            if (s->sq)
                DT_CHECK(drive_send(t, p, s, progressed));
            if (s->rq)
                DT_CHECK(drive_recv(t, p, s, progressed));
        }
    }
    return DT_OK;
}

static uint64_t tcp_arm(dt__transport *tr) {
    (void)tr;
    return 0;
}

static int fill_pollfds(tcp_t *t) {
    int n = 0;
    for (int i = 0; i < t->npeers; i++) {
        tpeer *p = &t->peers[i];
        for (int j = 0; j < p->nsock; j++) {
            tsock *s = &p->s[j];
            short ev = 0;
            if (s->rq)
                ev |= POLLIN;
            if (s->sq)
                ev |= POLLOUT;
            if (!s->quiet && !p->bye && !s->parked)
                ev |= POLLRDHUP;
            t->pfd[n++] = (struct pollfd){.fd = ev ? s->fd : -1, .events = ev};
        }
    }
    return n;
}

static void tcp_block(dt__transport *tr, uint64_t tok, int ms) {
    (void)tok;
    tcp_t *t = (tcp_t *)tr;
    int n = fill_pollfds(t);
    if (t->wake_fd >= 0)
        t->pfd[n++] = (struct pollfd){.fd = t->wake_fd, .events = POLLIN};
    if (poll(t->pfd, (nfds_t)n, ms) > 0 && t->wake_fd >= 0 && t->pfd[n - 1].revents) {
        uint64_t v;
        (void)!read(t->wake_fd, &v, sizeof v);
    }
}

/* A socket with no receive posted that is readable or hung up: look at
 * what is queued without consuming it. Nothing at all: the peer died. A BYE:
 * it left cleanly. An ABORT: it gave up, and says why. Data: a message for
 * this operation (fine), a later one (fine) or another call (mismatch). */
static dt_status inspect(tcp_t *t, tpeer *p, tsock *s, const dt__wire_hdr *cur, bool hup) {
    dt__wire_hdr raw, h;
    ssize_t r = recv(s->fd, &raw, sizeof raw, MSG_PEEK | MSG_DONTWAIT);
    if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR && errno != EWOULDBLOCK)) {
        if (p->bye) {
            s->quiet = true;
            return DT_OK;
        }
        bool later;
        dt_status why = recorded(t, p, cur, s->sq != NULL, &later);
        if (why != DT_OK || later) { /* later: finish this call, fail at the next */
            s->parked = later && dt__is_p2p(cur->coll);
            return why;
        }
        atomic_store(&t->g->lost, p->rank);
        return dt_error_set(DT_ERR_PEER,
                            "connection to rank %d closed without goodbye (the process died?): "
                            "rank %d is lost",
                            p->rank, p->rank);
    }
    if (r < (ssize_t)sizeof raw)
        return DT_OK; /* a partial frame; more is coming or EOF follows */
    DT_CHECK(dt__wire_decode(&raw, sizeof raw, &h));
    if (h.kind == DT__MSG_BYE) {
        p->bye = true;
        s->quiet = true;
    } else if (h.kind == DT__MSG_ABORT) {
        if (dt__abort_later(h.seq, cur, s->sq != NULL)) {
            s->parked = dt__is_p2p(cur->coll);
            return DT_OK; /* this call can still complete: fail at the next */
        }
        if (h.root >= 0 && h.root < t->g->size)
            atomic_store(&t->g->lost, h.root);
        return dt__abort_error(p->rank, (dt_status)h.status, h.root, t->g->size, false);
    } else {
        DT_CHECK(dt__wire_early(&h, cur, t->g->rank, p->rank));
        if (hup) {
            /* Data, then the peer left. If it gave up, its ABORT frame is
             * queued behind data nobody will read: its store record says
             * why. Otherwise stop watching until a recv is posted. */
            bool later;
            dt_status why = recorded(t, p, cur, s->sq != NULL, &later);
            if (why != DT_OK || later) {
                s->parked = later && dt__is_p2p(cur->coll);
                return why;
            }
            s->quiet = true;
        }
    }
    return DT_OK;
}

static dt_status tcp_check(dt__transport *tr, const dt__wire_hdr *cur) {
    tcp_t *t = (tcp_t *)tr;
    /* A parked failure is heard by the first call that cannot ignore it. */
    for (int i = 0; i < t->npeers; i++)
        for (int j = 0; j < t->peers[i].nsock; j++) {
            tsock *s = &t->peers[i].s[j];
            if (s->parked && !s->rq && (!dt__is_p2p(cur->coll) || s->sq)) {
                s->parked = false;
                DT_CHECK(inspect(t, &t->peers[i], s, cur, true));
            }
        }
    int n = fill_pollfds(t);
    for (int i = 0; i < n; i++) {
        t->pfd[i].events &= POLLRDHUP;
        if (t->pfd[i].events)
            t->pfd[i].events |= POLLIN;
    }
    if (poll(t->pfd, (nfds_t)n, 0) <= 0)
        return DT_OK;
    int k = 0;
    for (int i = 0; i < t->npeers; i++) {
        tpeer *p = &t->peers[i];
        for (int j = 0; j < p->nsock; j++, k++) {
            tsock *s = &p->s[j];
            if (!(t->pfd[k].revents & (POLLIN | POLLRDHUP | POLLHUP | POLLERR)))
                continue;
            if (s->rq)
                continue; /* the receive path reads it and reports */
            DT_CHECK(inspect(t, p, s, cur, t->pfd[k].revents & (POLLRDHUP | POLLHUP | POLLERR)));
        }
    }
    return DT_OK;
}

static int tcp_pending(dt__transport *tr, int *ranks, int max) {
    tcp_t *t = (tcp_t *)tr;
    int n = 0;
    for (int i = 0; i < t->npeers && n < max; i++) {
        tpeer *p = &t->peers[i];
        bool busy = false;
        for (int j = 0; j < p->nsock; j++)
            busy = busy || p->s[j].sq || p->s[j].rq;
        if (busy)
            ranks[n++] = p->rank;
    }
    return n;
}

static void tcp_peer_info(dt__transport *tr, int peer, dt__peer_info *out) {
    (void)tr;
    (void)peer;
    memset(out, 0, sizeof *out);
}

static void tcp_abort(dt__transport *tr, dt_status st, int lost_rank, uint64_t seq, bool owner) {
    tcp_t *t = (tcp_t *)tr;
    if (owner && t->g->job->store &&
        ((st == DT_ERR_PEER && lost_rank >= 0 && lost_rank != t->g->rank) ||
         st == DT_ERR_MISMATCH)) {
        /* Before any socket closes: a peer that sees our connection go
         * looks here when it cannot read our ABORT frame. Best effort. */
        char key[128], val[64];
        abort_key(t, t->g->rank, key, sizeof key);
        snprintf(val, sizeof val, "%d %d %llu", (int)st, st == DT_ERR_MISMATCH ? -1 : lost_rank,
                 (unsigned long long)seq);
        char saved[1024]; /* keep the caller's error, whatever the store says */
        snprintf(saved, sizeof saved, "%s", dt_last_error());
        if (dt__store_set_within(t->g->job->store, key, val, strlen(val) + 1,
                                 ABORT_STORE_SECONDS) != DT_OK)
            DT_WARN("could not record the abort in the store: %s", dt_last_error());
        dt_error_set(st, "%s", saved);
    }
    for (int i = 0; i < t->npeers; i++) {
        tpeer *p = &t->peers[i];
        for (int j = 0; j < p->nsock; j++) {
            tsock *s = &p->s[j];
            if (owner && !s->midframe) {
                /* Only between frames, or the receiver would read our abort
                 * as payload. Best effort: never wait for buffer space. */
                dt__wire_hdr h = {.magic = DT__WIRE_MAGIC,
                                  .version = DT__WIRE_VERSION,
                                  .kind = DT__MSG_ABORT,
                                  .root = lost_rank,
                                  .src = t->g->rank,
                                  .status = st,
                                  .seq = seq};
                (void)!send(s->fd, &h, sizeof h, MSG_DONTWAIT | MSG_NOSIGNAL);
            }
            /* Half-close: peers read our frame and then EOF, and what they
             * still send us is absorbed instead of answered with a reset
             * that could destroy the frame before they read it. */
            shutdown(s->fd, SHUT_WR);
        }
    }
}

static void tcp_reset(dt__transport *tr) {
    tcp_t *t = (tcp_t *)tr;
    for (int i = 0; i < t->npeers; i++)
        for (int j = 0; j < t->peers[i].nsock; j++) {
            tsock *s = &t->peers[i].s[j];
            s->sq = s->sq_tail = s->rq = s->rq_tail = NULL;
        }
}

/* Peers learn of data from their sockets; only a wake-up of this rank's
 * own sleeper (the mailbox's thread, woken by a caller that queued work
 * for it) needs anything here. Thread-safe. */
static void tcp_notify(dt__transport *tr, int peer) {
    tcp_t *t = (tcp_t *)tr;
    if (peer == t->g->rank && t->wake_fd >= 0) {
        uint64_t one = 1;
        (void)!write(t->wake_fd, &one, sizeof one);
    }
}

static void tcp_destroy(dt__transport *tr, bool clean) {
    tcp_t *t = (tcp_t *)tr;
    if (!t)
        return;
    for (int i = 0; i < t->npeers; i++) {
        tpeer *p = &t->peers[i];
        if (clean && p->s[0].fd >= 0) {
            dt__wire_hdr h = {.magic = DT__WIRE_MAGIC,
                              .version = DT__WIRE_VERSION,
                              .kind = DT__MSG_BYE,
                              .root = -1,
                              .src = t->g->rank};
            for (int j = 0; j < p->nsock; j++)
                (void)dt__net_write(p->s[j].fd, &h, sizeof h, dt_now() + 1.0);
        }
        for (int j = 0; j < p->nsock; j++)
            if (p->s[j].fd >= 0)
                close(p->s[j].fd);
    }
    if (t->wake_fd >= 0)
        close(t->wake_fd);
    free(t->peers);
    free(t->idx);
    free(t->pfd);
    free(t);
}

static const dt__transport_ops tcp_ops = {
    .name = "tcp",
    .post_send = tcp_post_send,
    .post_recv = tcp_post_recv,
    .progress = tcp_progress,
    .arm = tcp_arm,
    .block = tcp_block,
    .check = tcp_check,
    .pending = tcp_pending,
    .peer_info = tcp_peer_info,
    .abort = tcp_abort,
    .reset = tcp_reset,
    .notify = tcp_notify,
    .destroy = tcp_destroy,
};

dt_status dt__tcp_create(dt_group *g, const int *peers, int npeers, dt__transport **out) {
    dt_status st = DT_OK;
    int lfd = -1, port = 0;
    char key[160], val[128];
    tcp_t *t = calloc(1, sizeof *t);
    if (!t)
        return dt_error_set(DT_ERR_NOMEM, "tcp: out of memory");
    t->base.ops = &tcp_ops;
    t->g = g;
    t->npeers = npeers;
    t->stripe = g->cfg.tcp_stripe;
    t->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    t->peers = calloc((size_t)npeers, sizeof *t->peers);
    t->idx = malloc((size_t)g->size * sizeof *t->idx);
    t->pfd = calloc((size_t)npeers * DT__MAX_SOCKS + 1, sizeof *t->pfd);
    if (!t->peers || !t->idx || !t->pfd || t->wake_fd < 0) {
        st = t->wake_fd < 0 ? dt_error_set_errno(DT_ERR_SYSTEM, "tcp: eventfd")
                            : dt_error_set(DT_ERR_NOMEM, "tcp: out of memory");
        goto fail;
    }
    for (int r = 0; r < g->size; r++)
        t->idx[r] = -1;
    int nsock = g->cfg.tcp_socks;
    for (int i = 0; i < npeers; i++) {
        t->idx[peers[i]] = i;
        t->peers[i].rank = peers[i];
        t->peers[i].nsock = nsock;
        for (int j = 0; j < DT__MAX_SOCKS; j++)
            t->peers[i].s[j].fd = -1;
    }
    double dl = dt_now() + g->cfg.timeout;
    DT_CHECK_GOTO(dt__net_listen(NULL, 0, &lfd, &port), st, fail);
    snprintf(key, sizeof key, "%s/tcp/%d", g->id, g->rank);
    snprintf(val, sizeof val, "%s:%d", g->job->addr, port);
    DT_CHECK_GOTO(dt__store_set(g->job->store, key, val, strlen(val) + 1), st, fail);

    /* Connect to lower ranks, then accept from higher ones (see the
     * ordering argument in docs/comm.md: no cycle of waits). */
    for (int i = 0; i < npeers; i++) {
        tpeer *p = &t->peers[i];
        if (p->rank > g->rank)
            continue;
        void *v = NULL;
        size_t len = 0;
        snprintf(key, sizeof key, "%s/tcp/%d", g->id, p->rank);
        DT_CHECK_GOTO(dt__store_wait(g->job->store, key, &v, &len), st, fail);
        char host[128];
        int pport = 0;
        char *colon = strrchr((char *)v, ':');
        if (!colon || colon - (char *)v >= (long)sizeof host ||
            sscanf(colon + 1, "%d", &pport) != 1) {
            dt_free(v);
            st =
                dt_error_set(DT_ERR_PROTOCOL, "tcp: bad address for rank %d in the store", p->rank);
            goto fail;
        }
        memcpy(host, v, (size_t)(colon - (char *)v));
        host[colon - (char *)v] = 0;
        dt_free(v);
        for (int j = 0; j < nsock; j++) {
            int fd;
            DT_CHECK_GOTO(dt__net_connect(host, pport, dl, &fd), st, fail);
            p->s[j].fd = fd;
            dt__net_tune(fd, g->cfg.tcp_buffer);
            dt__hs hs = {.purpose = DT__HS_DATA, .rank = g->rank, .index = j};
            memcpy(hs.token, g->job->token, DT__TOKEN_LEN);
            snprintf(hs.group, sizeof hs.group, "%s", g->id);
            DT_CHECK_GOTO(dt__net_hs_client(fd, &hs, dl), st, fail);
        }
    }
    int expect = 0;
    for (int i = 0; i < npeers; i++)
        if (t->peers[i].rank > g->rank)
            expect += nsock;
    while (expect > 0) {
        struct pollfd pf = {.fd = lfd, .events = POLLIN};
        double left = dl - dt_now();
        if (left <= 0) {
            st = dt_error_set(DT_ERR_TIMEOUT, "tcp: %d connections from higher ranks never came",
                              expect);
            goto fail;
        }
        if (poll(&pf, 1, left > 1 ? 1000 : (int)(left * 1000) + 1) <= 0)
            continue;
        int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
        if (fd < 0)
            continue;
        dt__hs hs;
        dt_status hst = dt__net_hs_server(fd, g->job->token, DT__HS_DATA, &hs, dl);
        int pi = hst == DT_OK && hs.rank > g->rank && hs.rank < g->size ? t->idx[hs.rank] : -1;
        if (hst != DT_OK || pi < 0 || strcmp(hs.group, g->id) != 0 || hs.index < 0 ||
            hs.index >= nsock || t->peers[pi].s[hs.index].fd >= 0) {
            DT_WARN("tcp: refused a data connection: %s",
                    hst != DT_OK ? dt_last_error() : "unexpected group, rank or socket index");
            close(fd);
            continue;
        }
        dt__net_tune(fd, g->cfg.tcp_buffer);
        t->peers[pi].s[hs.index].fd = fd;
        expect--;
    }
    close(lfd);
    lfd = -1;
    for (int i = 0; i < npeers; i++)
        for (int j = 0; j < nsock; j++)
            DT_CHECK_GOTO(dt__net_set_nonblocking(t->peers[i].s[j].fd), st, fail);
    *out = &t->base;
    return DT_OK;
fail:
    if (lfd >= 0)
        close(lfd);
    tcp_destroy(&t->base, false);
    dt_error_prefix("tcp transport of group %s, rank %d", g->id, g->rank);
    return st;
}
