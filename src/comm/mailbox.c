/*
 * mailbox.c — messages matched by (source, tag) in any order, and receives
 * from any source, over a group's transports (comm.h, "Tagged messages").
 *
 * A mailbox owns a split of the user's group (its own shm segments and TCP
 * sockets) and one thread that alone drives that split's transports. The
 * transports deliver, per pair of ranks, a FIFO of frames that must be
 * received in order with the length the sender gave; the mailbox turns that
 * into tagged messages with a small protocol. Every frame starts as a
 * 64-byte envelope (mb_env); the receiver always has the next envelope from
 * each open peer posted, and learns from it what follows:
 *
 *   EAGER  tag, count, dtype  + payload    a message up to the eager limit
 *   RTS    tag, count, dtype, id           a larger message asks to be sent
 *   CTS    id                              the receiver posted a match: send
 *   DATA   id  + payload                   the payload, into that receive
 *   CLOSE                                  the sender destroyed its mailbox
 *
 *     sender                      receiver
 *     isend(8 MiB, tag 3) --RTS-->  unexpected (no receive yet: only the
 *                                   envelope is kept)
 *                                   irecv(src, tag 3) matches it
 *                      <--CTS---
 *     --DATA + payload----------->  straight into the receive's buffer
 *
 * A receive matches the oldest unexpected message (arrival order); an
 * arriving envelope matches the oldest posted receive. Messages of one
 * source come in the order sent, so one source's messages with one tag are
 * never overtaken. A send to this rank itself never touches a transport.
 *
 * Invariants:
 *   1. Only the mailbox thread touches the split's transports, the peers'
 *      state and the lists below; callers hand requests over through
 *      `inbox` (under mu) and wake the thread (transport notify of its own
 *      rank). Completion is published under the split group's mu, as a
 *      group operation's is, so dt_work_wait/test work unchanged.
 *   2. An envelope is decoded, its kind, dtype, length and id validated
 *      against what this rank expects before anything is sized from it
 *      (DT_ERR_PROTOCOL otherwise); a payload is received only into a
 *      buffer at least as long, with the exact length the envelope gave.
 *   3. A request leaves every list before it is completed: the caller may
 *      free it the moment it is done.
 *   4. The first error fails the mailbox (sticky): every pending request
 *      completes with it, the peers are told through the transports'
 *      abort, and later requests complete with it at once.
 *   5. Every pending request is bounded by DT_TIMEOUT seconds without
 *      progress; liveness of the peers is checked every 50 ms.
 */
#include "comm_internal.h"

#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MB_MAGIC         0x584f424du /* "MBOX" */
#define MB_EAGER         (64u << 10) /* default: largest message sent with its envelope */
#define MB_TAG_ENV       0x4d42      /* transport tags of envelope and payload frames */
#define MB_TAG_PAY       0x4d43
#define MB_CHECK_SECONDS 0.05 /* liveness and timeout checks */
#define MB_CLOSE_SECONDS 10.0 /* at most this long to deliver CLOSE on destroy */
#define MB_YIELDS        0    /* sched_yield()s after work before sleeping */

enum { MB_EAGER_MSG = 1, MB_RTS, MB_CTS, MB_DATA, MB_CLOSE, MB_KIND_END };

typedef struct mb_env {
    uint32_t magic; /* MB_MAGIC */
    uint8_t kind;   /* MB_* */
    uint8_t dtype;  /* dt_dtype of the message */
    uint16_t zero;
    int32_t tag; /* EAGER, RTS: the message's tag (>= 0) */
    int32_t zero2;
    uint64_t count; /* EAGER, RTS, DATA: elements */
    uint64_t bytes; /* EAGER, DATA: the payload that follows; RTS: the one announced */
    uint64_t id;    /* RTS, DATA: the sender's message number; CTS: the RTS it answers */
    uint64_t pad[3];
} mb_env;
_Static_assert(sizeof(mb_env) == 64, "a mailbox envelope is 64 bytes");

typedef struct mb_req mb_req;

/* A caller's send or receive. `w` first: dt_work_wait frees the whole. */
struct mb_req {
    dt_work w;
    mb_req *next; /* in at most one list at a time */
    bool is_send;
    int peer; /* dest; or source, maybe DT_ANY_SOURCE */
    int tag;  /* maybe DT_ANY_TAG for a receive */
    char *buf;
    size_t count; /* elements: the message's (send), the room (receive) */
    dt_dtype dtype;
    uint64_t bytes;
    dt_msg_info *info;
    uint64_t id;          /* send of RTS, or receive waiting for DATA: the message number */
    uint64_t msg_count;   /* receive: the matched message's count */
    int msg_src, msg_tag; /* receive: the matched message's source and tag */
    double since;         /* posted or last progressed (DT_TIMEOUT) */
    uint64_t moved;       /* bytes moved at the last check */
    mb_env env;           /* send: its envelope */
    dt__xfer x[2];        /* send: envelope and payload; receive: payload in x[0] */
    int nx;               /* transfers posted and not yet seen done */
};

/* A message that arrived before any receive matched it. */
typedef struct mb_unexp {
    struct mb_unexp *next;
    int src, tag;
    dt_dtype dtype;
    uint64_t count, bytes;
    uint64_t id;       /* RTS: the message number to answer */
    bool rts;          /* only the envelope is here; the payload waits at its sender */
    char *data;        /* eager: the payload (being received until ready) */
    bool ready;        /* eager: payload complete */
    mb_req *self_send; /* a large send to this rank, waiting for a receive */
    mb_req *claimed;   /* eager, not ready: the receive that took it */
} mb_unexp;

/* A control frame (CTS, CLOSE) on its way out. */
typedef struct mb_ctl {
    struct mb_ctl *next;
    int peer;
    mb_env env;
    dt__xfer x;
} mb_ctl;

typedef struct mb_peer {
    int rank;
    bool closed;           /* it sent CLOSE: nothing more comes from it */
    bool close_sent;       /* we sent CLOSE (destroy) */
    uint64_t fsent, frcvd; /* frames numbered per direction (the transport's check) */
    uint64_t next_id;      /* RTS message numbers */
    mb_env in;             /* the envelope being received */
    dt__xfer inx;
    bool in_posted;
    dt__xfer payx; /* the payload being received, into pay_req or pay_unexp */
    bool pay_posted;
    mb_req *pay_req;
    mb_unexp *pay_unexp;
    mb_req *rts_wait;  /* my RTS sends to it, waiting for CTS */
    mb_req *data_wait; /* my receives from it, waiting for DATA after CTS */
} mb_peer;

struct dt_mailbox {
    dt_group *g; /* the split: its transports are the mailbox's */
    int rank, size;
    uint64_t eager; /* messages up to this many bytes go with their envelope */
    dt__op svc;     /* the descriptor transfers are posted under */
    mb_peer *peers;
    /* Handed over by callers (under mu). */
    pthread_mutex_t mu;
    mb_req *inbox, *inbox_tail;
    bool stop;
    _Atomic int aborted;
    _Atomic int failed; /* sticky dt_status; read by callers too */
    char failmsg[768];
    dt_thread *thread;
    /* The thread's own. */
    mb_req *posted, *posted_tail; /* receives without a match, in post order */
    mb_req *sending;              /* sends with transfers in flight */
    mb_unexp *unexp, *unexp_tail; /* messages without a receive, in arrival order */
    mb_ctl *ctl;                  /* control frames in flight */
    int open_peers;               /* peers that have not closed */
};

/* ------------------------------------------------------------------------ */
/* Small helpers                                                            */
/* ------------------------------------------------------------------------ */

static void wake(dt_mailbox *mb) {
    dt_group *g = mb->g;
    if (g->shm)
        g->shm->ops->notify(g->shm, g->rank);
    if (g->tcp)
        g->tcp->ops->notify(g->tcp, g->rank);
}

static void describe(const mb_req *r, char *buf, size_t n) {
    char who[32];
    if (r->peer == DT_ANY_SOURCE)
        snprintf(who, sizeof who, "any rank");
    else
        snprintf(who, sizeof who, "rank %d", r->peer);
    char tag[24];
    if (r->tag == DT_ANY_TAG)
        snprintf(tag, sizeof tag, "any tag");
    else
        snprintf(tag, sizeof tag, "tag %d", r->tag);
    snprintf(buf, n, "mailbox %s (%zu %s, %s %s, %s)", r->is_send ? "send" : "recv", r->count,
             dt_dtype_name(r->dtype), r->is_send ? "to" : "from", who, tag);
}

/* Publish r's completion; r must be in no list (invariant 3). */
static void complete(dt_mailbox *mb, mb_req *r, dt_status st, const char *msg) {
    dt_group *g = mb->g;
    if (st == DT_OK && !r->is_send && r->info)
        *r->info =
            (dt_msg_info){.source = r->msg_src, .tag = r->msg_tag, .count = (size_t)r->msg_count};
    r->w.status = st;
    if (st != DT_OK)
        snprintf(r->w.err, sizeof r->w.err, "%s", msg);
    pthread_mutex_lock(&g->mu);
    r->w.done = true;
    g->last_progress = dt_now();
    pthread_cond_broadcast(&g->done_cv);
    pthread_mutex_unlock(&g->mu);
}

/* Remove r from the list at *head (returns whether it was there). */
static bool unlink_req(mb_req **head, mb_req **tail, mb_req *r) {
    for (mb_req **pp = head, *prev = NULL; *pp; prev = *pp, pp = &(*pp)->next)
        if (*pp == r) {
            *pp = r->next;
            if (tail && *tail == r)
                *tail = prev;
            r->next = NULL;
            return true;
        }
    return false;
}

static void push_req(mb_req **head, mb_req **tail, mb_req *r) {
    r->next = NULL;
    if (*tail)
        (*tail)->next = r;
    else
        *head = r;
    *tail = r;
}

static void push_front(mb_req **head, mb_req *r) {
    r->next = *head;
    *head = r;
}

static bool matches(const mb_req *r, int src, int tag) {
    return (r->peer == DT_ANY_SOURCE || r->peer == src) && (r->tag == DT_ANY_TAG || r->tag == tag);
}

/* The message (src, tag, count of dtype) fits receive r? DT_ERR_MISMATCH
 * naming both otherwise. */
static dt_status fits(const dt_mailbox *mb, const mb_req *r, int src, int tag, dt_dtype dtype,
                      uint64_t count, uint64_t bytes) {
    char d[160];
    describe(r, d, sizeof d);
    if (dtype != r->dtype)
        return dt_error_set(DT_ERR_MISMATCH,
                            "rank %d sent %llu %s with tag %d, but the receive that matched it "
                            "on rank %d is a %s",
                            src, (unsigned long long)count, dt_dtype_name(dtype), tag, mb->rank, d);
    if (bytes > r->bytes)
        return dt_error_set(DT_ERR_MISMATCH,
                            "rank %d sent %llu %s (%llu bytes) with tag %d, larger than the "
                            "receive that matched it on rank %d, a %s (room for %llu bytes)",
                            src, (unsigned long long)count, dt_dtype_name(dtype),
                            (unsigned long long)bytes, tag, mb->rank, d,
                            (unsigned long long)r->bytes);
    return DT_OK;
}

/* ------------------------------------------------------------------------ */
/* Posting frames                                                           */
/* ------------------------------------------------------------------------ */

static dt_status post_frame(dt_mailbox *mb, dt__xfer *x, int peer, bool send, void *buf,
                            uint64_t bytes, int tag) {
    mb_peer *p = &mb->peers[peer];
    dt__p2p_item it = {.p = {.send = send,
                             .buf = buf,
                             .count = (size_t)bytes,
                             .dtype = DT_U8,
                             .peer = peer,
                             .tag = tag},
                       .seq = send ? ++p->fsent : ++p->frcvd};
    return dt__post_item(&mb->svc, x, &it);
}

static dt_status post_envelope_recv(dt_mailbox *mb, mb_peer *p) {
    p->in_posted = true;
    return post_frame(mb, &p->inx, p->rank, false, &p->in, sizeof p->in, MB_TAG_ENV);
}

static dt_status send_ctl(dt_mailbox *mb, int peer, int kind, uint64_t id) {
    mb_ctl *c = calloc(1, sizeof *c);
    if (!c)
        return dt_error_set(DT_ERR_NOMEM, "mailbox: out of memory");
    c->peer = peer;
    c->env = (mb_env){.magic = MB_MAGIC, .kind = (uint8_t)kind, .id = id};
    c->next = mb->ctl;
    mb->ctl = c;
    return post_frame(mb, &c->x, peer, true, &c->env, sizeof c->env, MB_TAG_ENV);
}

/* A send's envelope (and payload when it carries one) onto the transport. */
static dt_status post_send_frames(dt_mailbox *mb, mb_req *r, bool payload) {
    r->nx = 1;
    DT_CHECK(post_frame(mb, &r->x[0], r->peer, true, &r->env, sizeof r->env, MB_TAG_ENV));
    if (payload && r->bytes > 0) {
        r->nx = 2;
        DT_CHECK(post_frame(mb, &r->x[1], r->peer, true, r->buf, r->bytes, MB_TAG_PAY));
    }
    r->since = dt_now();
    push_front(&mb->sending, r);
    return DT_OK;
}

/* Receive r takes the payload that follows from peer p. */
static dt_status post_payload(dt_mailbox *mb, mb_peer *p, mb_req *r, mb_unexp *u, char *buf,
                              uint64_t bytes) {
    p->pay_req = r;
    p->pay_unexp = u;
    p->pay_posted = true;
    if (r)
        r->since = dt_now();
    return post_frame(mb, &p->payx, p->rank, false, buf, bytes, MB_TAG_PAY);
}

/* ------------------------------------------------------------------------ */
/* Failure                                                                  */
/* ------------------------------------------------------------------------ */

static void fail_list(dt_mailbox *mb, mb_req **head, dt_status st, const char *msg) {
    while (*head) {
        mb_req *r = *head;
        *head = r->next;
        r->next = NULL;
        complete(mb, r, st, msg);
    }
}

/* Complete every request still held with st (the transports' queues,
 * which point into them, are dropped first). */
static void drop_all(dt_mailbox *mb, dt_status st, const char *msg) {
    dt_group *g = mb->g;
    if (g->shm)
        g->shm->ops->reset(g->shm);
    if (g->tcp)
        g->tcp->ops->reset(g->tcp);
    fail_list(mb, &mb->posted, st, msg);
    mb->posted_tail = NULL;
    fail_list(mb, &mb->sending, st, msg);
    for (int i = 0; i < mb->size; i++) {
        mb_peer *p = &mb->peers[i];
        fail_list(mb, &p->rts_wait, st, msg);
        fail_list(mb, &p->data_wait, st, msg);
        if (p->pay_req) {
            complete(mb, p->pay_req, st, msg);
            p->pay_req = NULL;
        }
        p->pay_unexp = NULL;
        p->in_posted = p->pay_posted = false;
    }
    while (mb->unexp) {
        mb_unexp *u = mb->unexp;
        mb->unexp = u->next;
        if (u->self_send)
            complete(mb, u->self_send, st, msg);
        if (u->claimed)
            complete(mb, u->claimed, st, msg);
        free(u->data);
        free(u);
    }
    mb->unexp_tail = NULL;
    while (mb->ctl) {
        mb_ctl *c = mb->ctl;
        mb->ctl = c->next;
        free(c);
    }
}

/* Fail the mailbox with the current error (invariant 4). */
static void fail_all(dt_mailbox *mb, dt_status st) {
    dt_group *g = mb->g;
    int expected = 0;
    char msg[768];
    snprintf(msg, sizeof msg, "%s", dt_last_error());
    if (!atomic_compare_exchange_strong(&mb->failed, &expected, (int)st)) {
        st = (dt_status)atomic_load(&mb->failed);
        snprintf(msg, sizeof msg, "%s", mb->failmsg);
    } else {
        snprintf(mb->failmsg, sizeof mb->failmsg, "%s", msg);
        DT_DEBUG("comm", "mailbox on rank %d failed: %s", mb->rank, msg);
        /* The peers learn it from the transports, as from a failed group. */
        int lost = atomic_load(&g->lost);
        dt_status tell = st == DT_ERR_MISMATCH ? DT_ERR_MISMATCH : DT_ERR_PEER;
        if (g->shm)
            g->shm->ops->abort(g->shm, tell, lost, 0, true);
        if (g->tcp)
            g->tcp->ops->abort(g->tcp, tell, lost, 0, true);
        atomic_store(&g->failed, (int)st); /* the split is torn down uncleanly */
    }
    drop_all(mb, st, msg);
}

/* Complete a new request at once with the sticky failure. */
static void refuse(dt_mailbox *mb, mb_req *r) {
    char d[160];
    describe(r, d, sizeof d);
    dt_status st = (dt_status)atomic_load(&mb->failed);
    char msg[768];
    snprintf(msg, sizeof msg, "%s on rank %d: the mailbox failed earlier: %.500s", d, mb->rank,
             mb->failmsg);
    complete(mb, r, st, msg);
}

/* A peer that closed its mailbox: what needed it fails (not the mailbox). */
static void peer_closed(dt_mailbox *mb, mb_peer *p) {
    char msg[256];
    snprintf(msg, sizeof msg, "rank %d closed its mailbox (dt_mailbox_destroy)", p->rank);
    for (mb_req **pp = &mb->posted, *prev = NULL; *pp;) {
        mb_req *r = *pp;
        if (r->peer != p->rank) {
            prev = r;
            pp = &r->next;
            continue;
        }
        *pp = r->next;
        if (mb->posted_tail == r)
            mb->posted_tail = prev;
        r->next = NULL;
        char d[160], m[480];
        describe(r, d, sizeof d);
        snprintf(m, sizeof m, "%s on rank %d: %.250s", d, mb->rank, msg);
        complete(mb, r, DT_ERR_PEER, m);
    }
    fail_list(mb, &p->rts_wait, DT_ERR_PEER, msg);
    fail_list(mb, &p->data_wait, DT_ERR_PEER, msg);
    p->closed = true;
    mb->open_peers--;
}

/* ------------------------------------------------------------------------ */
/* Matching                                                                 */
/* ------------------------------------------------------------------------ */

static void copy_into(mb_req *r, const void *data, uint64_t bytes, int src, int tag,
                      uint64_t count) {
    if (bytes)
        memcpy(r->buf, data, bytes);
    r->msg_src = src;
    r->msg_tag = tag;
    r->msg_count = count;
}

static void unexp_append(dt_mailbox *mb, mb_unexp *u) {
    u->next = NULL;
    if (mb->unexp_tail)
        mb->unexp_tail->next = u;
    else
        mb->unexp = u;
    mb->unexp_tail = u;
}

static void unexp_remove(dt_mailbox *mb, mb_unexp *u) {
    for (mb_unexp **pp = &mb->unexp, *prev = NULL; *pp; prev = *pp, pp = &(*pp)->next)
        if (*pp == u) {
            *pp = u->next;
            if (mb->unexp_tail == u)
                mb->unexp_tail = prev;
            return;
        }
}

/* The oldest posted receive matching (src, tag), taken off the list. */
static mb_req *take_posted(dt_mailbox *mb, int src, int tag) {
    for (mb_req *r = mb->posted; r; r = r->next)
        if (matches(r, src, tag)) {
            unlink_req(&mb->posted, &mb->posted_tail, r);
            return r;
        }
    return NULL;
}

/* Receive r answers the rendezvous message (src, id): CTS, then DATA. */
static dt_status clear_to_send(dt_mailbox *mb, mb_req *r, int src, int tag, uint64_t count,
                               uint64_t id) {
    DT_CHECK(send_ctl(mb, src, MB_CTS, id));
    r->msg_src = src;
    r->msg_tag = tag;
    r->msg_count = count;
    r->id = id;
    r->since = dt_now();
    push_front(&mb->peers[src].data_wait, r);
    return DT_OK;
}

/* A caller's new receive: the oldest unexpected message, else posted. */
static dt_status start_recv(dt_mailbox *mb, mb_req *r) {
    for (mb_unexp *u = mb->unexp; u; u = u->next) {
        if (u->claimed || !matches(r, u->src, u->tag))
            continue;
        DT_CHECK(fits(mb, r, u->src, u->tag, u->dtype, u->count, u->bytes));
        if (!u->ready) { /* its payload is still arriving: it completes r */
            u->claimed = r;
            r->since = dt_now();
            return DT_OK;
        }
        if (u->rts) {
            DT_CHECK(clear_to_send(mb, r, u->src, u->tag, u->count, u->id));
            unexp_remove(mb, u);
            free(u);
            return DT_OK;
        }
        unexp_remove(mb, u);
        if (u->self_send) { /* a large send to myself: one copy, both done */
            copy_into(r, u->self_send->buf, u->bytes, u->src, u->tag, u->count);
            complete(mb, u->self_send, DT_OK, NULL);
            complete(mb, r, DT_OK, NULL);
            free(u);
            return DT_OK;
        }
        copy_into(r, u->data, u->bytes, u->src, u->tag, u->count);
        complete(mb, r, DT_OK, NULL);
        free(u->data);
        free(u);
        return DT_OK;
    }
    if (r->peer != DT_ANY_SOURCE && r->peer != mb->rank && mb->peers[r->peer].closed) {
        char d[160], m[320];
        describe(r, d, sizeof d);
        snprintf(m, sizeof m, "%s on rank %d: rank %d closed its mailbox (dt_mailbox_destroy)", d,
                 mb->rank, r->peer);
        complete(mb, r, DT_ERR_PEER, m);
        return DT_OK;
    }
    r->since = dt_now();
    push_req(&mb->posted, &mb->posted_tail, r);
    return DT_OK;
}

/* A caller's new send. */
static dt_status start_send(dt_mailbox *mb, mb_req *r) {
    if (r->peer == mb->rank) { /* to myself: no transport */
        mb_req *m = take_posted(mb, r->peer, r->tag);
        if (m) {
            dt_status st = fits(mb, m, r->peer, r->tag, r->dtype, r->count, r->bytes);
            if (st != DT_OK) {
                complete(mb, m, st, dt_last_error());
                return st;
            }
            copy_into(m, r->buf, r->bytes, r->peer, r->tag, r->count);
            complete(mb, m, DT_OK, NULL);
            complete(mb, r, DT_OK, NULL);
            return DT_OK;
        }
        mb_unexp *u = calloc(1, sizeof *u);
        if (!u)
            return dt_error_set(DT_ERR_NOMEM, "mailbox: out of memory");
        *u = (mb_unexp){.src = r->peer,
                        .tag = r->tag,
                        .dtype = r->dtype,
                        .count = r->count,
                        .bytes = r->bytes,
                        .ready = true};
        if (r->bytes <= mb->eager) { /* small: copied aside, the send is done */
            u->data = malloc(r->bytes ? r->bytes : 1);
            if (!u->data) {
                free(u);
                return dt_error_set(DT_ERR_NOMEM, "mailbox: out of memory");
            }
            memcpy(u->data, r->buf, r->bytes);
            unexp_append(mb, u);
            complete(mb, r, DT_OK, NULL);
        } else {
            u->self_send = r;
            r->since = dt_now();
            unexp_append(mb, u);
        }
        return DT_OK;
    }
    mb_peer *p = &mb->peers[r->peer];
    if (p->closed) {
        char d[160], m[320];
        describe(r, d, sizeof d);
        snprintf(m, sizeof m, "%s on rank %d: rank %d closed its mailbox (dt_mailbox_destroy)", d,
                 mb->rank, r->peer);
        complete(mb, r, DT_ERR_PEER, m);
        return DT_OK;
    }
    bool eager = r->bytes <= mb->eager;
    r->env = (mb_env){.magic = MB_MAGIC,
                      .kind = (uint8_t)(eager ? MB_EAGER_MSG : MB_RTS),
                      .dtype = (uint8_t)r->dtype,
                      .tag = r->tag,
                      .count = r->count,
                      .bytes = r->bytes,
                      .id = eager ? 0 : ++p->next_id};
    r->id = r->env.id;
    if (eager)
        return post_send_frames(mb, r, true);
    /* The RTS goes out as a control-like frame of the send itself; the
     * request waits for CTS in rts_wait, its envelope transfer tracked
     * there (done long before the CTS can come back). */
    r->nx = 0;
    r->since = dt_now();
    DT_CHECK(post_frame(mb, &r->x[0], r->peer, true, &r->env, sizeof r->env, MB_TAG_ENV));
    push_front(&p->rts_wait, r);
    return DT_OK;
}

/* ------------------------------------------------------------------------ */
/* Arrivals                                                                 */
/* ------------------------------------------------------------------------ */

static dt_status bad_env(dt_mailbox *mb, mb_peer *p, const char *why) {
    return dt_error_set(DT_ERR_PROTOCOL,
                        "mailbox on rank %d: bad envelope from rank %d (kind %u, tag %d, count "
                        "%llu, bytes %llu, id %llu): %s",
                        mb->rank, p->rank, (unsigned)p->in.kind, p->in.tag,
                        (unsigned long long)p->in.count, (unsigned long long)p->in.bytes,
                        (unsigned long long)p->in.id, why);
}

/* The envelope from p is in p->in (invariant 2). */
static dt_status on_envelope(dt_mailbox *mb, mb_peer *p) {
    mb_env e = p->in;
    p->in_posted = false;
    if (e.magic != MB_MAGIC || e.zero || e.zero2 || e.kind < MB_EAGER_MSG || e.kind >= MB_KIND_END)
        return bad_env(mb, p, "not a mailbox envelope");
    if (e.kind == MB_CLOSE) {
        peer_closed(mb, p);
        return DT_OK; /* nothing more comes from it: no envelope posted */
    }
    if (e.kind == MB_CTS) {
        mb_req *r = p->rts_wait;
        while (r && r->id != e.id)
            r = r->next;
        if (!r)
            return bad_env(mb, p, "clears no message this rank asked to send");
        unlink_req(&p->rts_wait, NULL, r);
        DT_ASSERT(r->x[0].done); /* the RTS was written before its answer could come */
        r->env.kind = MB_DATA;
        DT_CHECK(post_send_frames(mb, r, true));
        return post_envelope_recv(mb, p);
    }
    size_t es = dt_dtype_size((dt_dtype)e.dtype);
    if (e.dtype >= DT_DTYPE_COUNT || e.count > DT__WIRE_MAX_LEN / (es ? es : 1) ||
        e.bytes != e.count * es)
        return bad_env(mb, p, "the length does not match the count and dtype");
    if (e.kind == MB_DATA) {
        mb_req *r = p->data_wait;
        while (r && r->id != e.id)
            r = r->next;
        if (!r)
            return bad_env(mb, p, "data for no message this rank cleared");
        if (e.count != r->msg_count)
            return bad_env(mb, p, "the payload differs from the one announced");
        unlink_req(&p->data_wait, NULL, r);
        if (e.bytes == 0) {
            complete(mb, r, DT_OK, NULL);
            return post_envelope_recv(mb, p);
        }
        return post_payload(mb, p, r, NULL, r->buf, e.bytes);
    }
    if (e.tag < 0)
        return bad_env(mb, p, "negative tag");
    if (e.kind == MB_EAGER_MSG && e.bytes > mb->eager)
        return bad_env(mb, p, "an eager message above the eager limit");
    mb_req *r = take_posted(mb, p->rank, e.tag);
    if (r) {
        dt_status st = fits(mb, r, p->rank, e.tag, (dt_dtype)e.dtype, e.count, e.bytes);
        if (st != DT_OK) {
            complete(mb, r, st, dt_last_error());
            return st;
        }
        if (e.kind == MB_RTS) {
            DT_CHECK(clear_to_send(mb, r, p->rank, e.tag, e.count, e.id));
            return post_envelope_recv(mb, p);
        }
        r->msg_src = p->rank;
        r->msg_tag = e.tag;
        r->msg_count = e.count;
        if (e.bytes == 0) {
            complete(mb, r, DT_OK, NULL);
            return post_envelope_recv(mb, p);
        }
        return post_payload(mb, p, r, NULL, r->buf, e.bytes);
    }
    mb_unexp *u = calloc(1, sizeof *u);
    if (!u)
        return dt_error_set(DT_ERR_NOMEM, "mailbox: out of memory");
    *u = (mb_unexp){.src = p->rank,
                    .tag = e.tag,
                    .dtype = (dt_dtype)e.dtype,
                    .count = e.count,
                    .bytes = e.bytes,
                    .id = e.id,
                    .rts = e.kind == MB_RTS};
    if (u->rts || e.bytes == 0) {
        u->ready = true;
        if (!u->rts && !(u->data = malloc(1))) {
            free(u);
            return dt_error_set(DT_ERR_NOMEM, "mailbox: out of memory");
        }
        unexp_append(mb, u);
        return post_envelope_recv(mb, p);
    }
    if (!(u->data = malloc(e.bytes))) {
        free(u);
        return dt_error_set(DT_ERR_NOMEM, "mailbox: %llu bytes for a message from rank %d",
                            (unsigned long long)e.bytes, p->rank);
    }
    unexp_append(mb, u);
    return post_payload(mb, p, NULL, u, u->data, e.bytes);
}

/* The payload from p landed. */
static dt_status on_payload(dt_mailbox *mb, mb_peer *p) {
    p->pay_posted = false;
    mb_req *r = p->pay_req;
    mb_unexp *u = p->pay_unexp;
    p->pay_req = NULL;
    p->pay_unexp = NULL;
    if (r) {
        complete(mb, r, DT_OK, NULL);
    } else if (u) {
        u->ready = true;
        if (u->claimed) {
            mb_req *c = u->claimed;
            unexp_remove(mb, u);
            copy_into(c, u->data, u->bytes, u->src, u->tag, u->count);
            complete(mb, c, DT_OK, NULL);
            free(u->data);
            free(u);
        }
    }
    return post_envelope_recv(mb, p);
}

/* Everything the transports finished since the last look. */
static dt_status harvest(dt_mailbox *mb, bool *did) {
    for (int i = 0; i < mb->size; i++) {
        mb_peer *p = &mb->peers[i];
        if (p->in_posted && p->inx.done) {
            *did = true;
            DT_CHECK(on_envelope(mb, p));
        }
        if (p->pay_posted && p->payx.done) {
            *did = true;
            DT_CHECK(on_payload(mb, p));
        }
    }
    for (mb_req **pp = &mb->sending; *pp;) {
        mb_req *r = *pp;
        if (r->x[0].done && (r->nx < 2 || r->x[1].done)) {
            *pp = r->next;
            r->next = NULL;
            *did = true;
            complete(mb, r, DT_OK, NULL);
        } else {
            pp = &r->next;
        }
    }
    for (mb_ctl **pp = &mb->ctl; *pp;) {
        mb_ctl *c = *pp;
        if (c->x.done) {
            *pp = c->next;
            free(c);
            *did = true;
        } else {
            pp = &c->next;
        }
    }
    return DT_OK;
}

/* ------------------------------------------------------------------------ */
/* Liveness and timeouts                                                    */
/* ------------------------------------------------------------------------ */

static dt_status progress_all(dt_group *g, bool *progressed) {
    if (g->shm)
        DT_CHECK(g->shm->ops->progress(g->shm, progressed));
    if (g->tcp)
        DT_CHECK(g->tcp->ops->progress(g->tcp, progressed));
    return DT_OK;
}

/* The transports' liveness check. A peer reported gone after it closed
 * its mailbox left cleanly (its CLOSE may only now be read): not an error. */
static dt_status check_peers(dt_mailbox *mb) {
    dt_group *g = mb->g;
    dt_status st = DT_OK;
    if (g->shm)
        st = g->shm->ops->check(g->shm, &mb->svc.desc);
    if (st == DT_OK && g->tcp)
        st = g->tcp->ops->check(g->tcp, &mb->svc.desc);
    if (st != DT_ERR_PEER)
        return st;
    int lost = atomic_load(&g->lost);
    char msg[768];
    snprintf(msg, sizeof msg, "%s", dt_last_error());
    bool did = false, progressed = false;
    if (lost >= 0 && lost < mb->size && !mb->peers[lost].closed) {
        DT_CHECK(progress_all(g, &progressed));
        DT_CHECK(harvest(mb, &did));
    }
    if (lost >= 0 && lost < mb->size && mb->peers[lost].closed) {
        atomic_store(&g->lost, -1);
        return DT_OK;
    }
    return dt_error_set(st, "%s", msg);
}

static int waited_ranks(dt_mailbox *mb, const mb_req *r, char *buf, size_t n) {
    if (r->peer != DT_ANY_SOURCE)
        return snprintf(buf, n, "rank %d", r->peer);
    size_t at = (size_t)snprintf(buf, n, "any of ranks");
    int shown = 0;
    for (int i = 0; i < mb->size && at < n; i++)
        if (i == mb->rank || !mb->peers[i].closed)
            at += (size_t)snprintf(buf + at, n - at, "%s %d", shown++ ? "," : "", i);
    return (int)at;
}

/* A request without progress for DT_TIMEOUT fails the mailbox. */
static dt_status check_one(dt_mailbox *mb, mb_req *r, double now, const char *what) {
    uint64_t moved = r->x[0].moved + r->x[1].moved;
    for (int i = 0; i < mb->size; i++)
        if (mb->peers[i].pay_req == r)
            moved += mb->peers[i].payx.moved;
    if (moved != r->moved) {
        r->moved = moved;
        r->since = now;
    }
    if (now - r->since <= mb->g->cfg.timeout)
        return DT_OK;
    char d[160], who[256];
    describe(r, d, sizeof d);
    waited_ranks(mb, r, who, sizeof who);
    return dt_error_set(DT_ERR_TIMEOUT,
                        "%s on rank %d: no progress for DT_TIMEOUT=%.0f s waiting for %s (%s)", d,
                        mb->rank, mb->g->cfg.timeout, who, what);
}

static dt_status check_timeouts(dt_mailbox *mb, double now) {
    for (mb_req *r = mb->posted; r; r = r->next)
        DT_CHECK(check_one(mb, r, now, "no message matched"));
    for (mb_req *r = mb->sending; r; r = r->next)
        DT_CHECK(check_one(mb, r, now, "it does not take the data"));
    for (int i = 0; i < mb->size; i++) {
        mb_peer *p = &mb->peers[i];
        for (mb_req *r = p->rts_wait; r; r = r->next)
            DT_CHECK(check_one(mb, r, now, "it posted no receive that matches"));
        for (mb_req *r = p->data_wait; r; r = r->next)
            DT_CHECK(check_one(mb, r, now, "it does not send the data"));
        if (p->pay_req)
            DT_CHECK(check_one(mb, p->pay_req, now, "it does not send the data"));
    }
    for (mb_unexp *u = mb->unexp; u; u = u->next) {
        if (u->self_send)
            DT_CHECK(check_one(mb, u->self_send, now, "this rank posted no receive that matches"));
        if (u->claimed)
            DT_CHECK(check_one(mb, u->claimed, now, "it does not send the data"));
    }
    return DT_OK;
}

/* ------------------------------------------------------------------------ */
/* The thread                                                               */
/* ------------------------------------------------------------------------ */

static bool pending_close(const dt_mailbox *mb) {
    for (const mb_ctl *c = mb->ctl; c; c = c->next)
        if (c->env.kind == MB_CLOSE)
            return true;
    return false;
}

/* Destroy: tell every open peer (best effort, bounded by the caller). */
static void begin_close(dt_mailbox *mb) {
    for (int i = 0; i < mb->size; i++) {
        mb_peer *p = &mb->peers[i];
        if (i != mb->rank && !p->close_sent && atomic_load(&mb->failed) == 0) {
            p->close_sent = true;
            dt_status st = send_ctl(mb, i, MB_CLOSE, 0);
            if (st != DT_OK)
                fail_all(mb, st);
        }
    }
}

/* A caller's request the thread cannot take: it is in no list yet. */
static void start_failed(dt_mailbox *mb, mb_req *r, dt_status st) {
    char d[160], msg[768];
    describe(r, d, sizeof d);
    dt_error_prefix("%s on rank %d", d, mb->rank);
    snprintf(msg, sizeof msg, "%s", dt_last_error());
    complete(mb, r, st, msg);
    dt_error_set(st, "%s", msg);
    fail_all(mb, st);
}

/* Sleep until a frame arrives, a caller wakes us, or ms pass. */
static void idle(dt_mailbox *mb, int ms) {
    dt_group *g = mb->g;
    bool more;
    if (g->shm) {
        uint64_t tok = g->shm->ops->arm(g->shm);
        pthread_mutex_lock(&mb->mu);
        more = mb->inbox || mb->stop;
        pthread_mutex_unlock(&mb->mu);
        if (!more && !atomic_load(&mb->failed)) {
            bool progressed = false;
            more = progress_all(g, &progressed) != DT_OK || progressed;
        }
        if (g->tcp) { /* both: poll the sockets, nap briefly on the bell */
            g->tcp->ops->block(g->tcp, 0, 0);
            g->shm->ops->block(g->shm, tok, more ? 0 : 1);
        } else {
            g->shm->ops->block(g->shm, tok, more ? 0 : ms);
        }
    } else if (g->tcp) {
        g->tcp->ops->block(g->tcp, 0, ms); /* callers write its eventfd */
    } else {
        pthread_mutex_lock(&mb->mu); /* one rank: only callers bring work */
        more = mb->inbox || mb->stop;
        pthread_mutex_unlock(&mb->mu);
        if (!more)
            dt_sleep_ms(1);
    }
}

static void *mb_main(void *arg) {
    dt_mailbox *mb = arg;
    dt_group *g = mb->g;
    dt_log_set_rank(g->job->world_rank);
    dt_status st = DT_OK;
    for (int i = 0; i < mb->size && st == DT_OK; i++)
        if (i != mb->rank)
            st = post_envelope_recv(mb, &mb->peers[i]);
    if (st != DT_OK)
        fail_all(mb, st);
    double next_check = dt_now() + MB_CHECK_SECONDS, close_by = 0;
    int yields = 0;
    for (;;) {
        bool did = false;
        pthread_mutex_lock(&mb->mu);
        mb_req *in = mb->inbox;
        mb->inbox = mb->inbox_tail = NULL;
        bool stop = mb->stop;
        pthread_mutex_unlock(&mb->mu);
        if (!atomic_load(&mb->failed) && atomic_load(&mb->aborted)) {
            dt_error_set(DT_ERR_ABORTED, "mailbox on rank %d: aborted (dt_mailbox_abort)",
                         mb->rank);
            fail_all(mb, DT_ERR_ABORTED);
        }
        while (in) {
            mb_req *r = in;
            in = r->next;
            r->next = NULL;
            did = true;
            if (atomic_load(&mb->failed))
                refuse(mb, r);
            else if ((st = r->is_send ? start_send(mb, r) : start_recv(mb, r)) != DT_OK)
                start_failed(mb, r, st);
        }
        if (stop && !close_by) {
            begin_close(mb);
            double t = g->cfg.timeout < MB_CLOSE_SECONDS ? g->cfg.timeout : MB_CLOSE_SECONDS;
            close_by = dt_now() + t;
        }
        if (!atomic_load(&mb->failed)) {
            bool progressed = false;
            st = progress_all(g, &progressed);
            if (st == DT_OK)
                st = harvest(mb, &did);
            if (st != DT_OK)
                fail_all(mb, st);
            did = did || progressed;
        }
        double now = dt_now();
        if (now >= next_check) {
            if (!atomic_load(&mb->failed)) {
                st = check_peers(mb);
                if (st == DT_OK && !stop)
                    st = check_timeouts(mb, now);
                if (st != DT_OK)
                    fail_all(mb, st);
            }
            pthread_mutex_lock(&g->mu);
            g->last_progress = now; /* the thread lives (dt_work_wait's guard) */
            pthread_mutex_unlock(&g->mu);
            next_check = now + MB_CHECK_SECONDS;
        }
        if (stop && (atomic_load(&mb->failed) || !pending_close(mb) || now > close_by))
            break;
        if (did) {
            yields = 0;
            continue;
        }
        if (yields < MB_YIELDS) {
            yields++;
            sched_yield();
            continue;
        }
        int ms = (int)((next_check - now) * 1e3) + 1;
        idle(mb, ms < 1 ? 1 : ms > 50 ? 50 : ms);
        yields = MB_YIELDS / 2;
    }
    /* Destroyed: what a caller left pending ends here (rule 3 of comm.h). */
    char msg[160];
    snprintf(msg, sizeof msg, "the mailbox of rank %d was destroyed with this operation pending",
             mb->rank);
    drop_all(mb, DT_ERR_ABORTED, msg);
    return NULL;
}

/* ------------------------------------------------------------------------ */
/* Public API                                                               */
/* ------------------------------------------------------------------------ */

dt_status dt_mailbox_create(dt_mailbox **out, dt_group *g) {
    return dt_mailbox_create_with(out, g, 0);
}

dt_status dt_mailbox_create_with(dt_mailbox **out, dt_group *g, size_t eager_bytes) {
    if (!out || !g)
        return dt_error_set(DT_ERR_INVALID, "dt_mailbox_create: NULL argument");
    *out = NULL;
    if (eager_bytes > DT__WIRE_MAX_LEN)
        return dt_error_set(DT_ERR_INVALID, "dt_mailbox_create: eager_bytes %zu exceeds %llu",
                            eager_bytes, (unsigned long long)DT__WIRE_MAX_LEN);
    dt_mailbox *mb = calloc(1, sizeof *mb);
    if (!mb)
        return dt_error_set(DT_ERR_NOMEM, "mailbox: out of memory");
    mb->eager = eager_bytes ? eager_bytes : MB_EAGER;
    dt_status st = dt_group_split(g, 0, dt_group_rank(g), &mb->g);
    if (st != DT_OK) {
        free(mb);
        dt_error_prefix("creating a mailbox on rank %d", dt_group_rank(g));
        return st;
    }
    pthread_mutex_init(&mb->mu, NULL);
    mb->rank = mb->g->rank;
    mb->size = mb->g->size;
    mb->open_peers = mb->size - 1;
    mb->svc = (dt__op){.g = mb->g, .coll = DT_COLL_BATCH, .dtype = DT_U8, .root = -1};
    mb->svc.desc = (dt__wire_hdr){.magic = DT__WIRE_MAGIC,
                                  .version = DT__WIRE_VERSION,
                                  .kind = DT__MSG_DATA,
                                  .coll = DT_COLL_BATCH,
                                  .dtype = DT_U8,
                                  .redop = DT_SUM,
                                  .root = -1,
                                  .src = mb->rank};
    mb->peers = calloc((size_t)mb->size, sizeof *mb->peers);
    if (!mb->peers) {
        st = dt_error_set(DT_ERR_NOMEM, "mailbox: out of memory");
        goto fail;
    }
    for (int i = 0; i < mb->size; i++)
        mb->peers[i].rank = i;
    st = dt_thread_create(&mb->thread, "dt-mailbox", mb_main, mb);
    if (st != DT_OK)
        goto fail;
    *out = mb;
    return DT_OK;
fail:
    dt_group_destroy(mb->g);
    pthread_mutex_destroy(&mb->mu);
    free(mb->peers);
    free(mb);
    return st;
}

void dt_mailbox_destroy(dt_mailbox *mb) {
    if (!mb)
        return;
    pthread_mutex_lock(&mb->mu);
    mb->stop = true;
    pthread_mutex_unlock(&mb->mu);
    wake(mb);
    dt_thread_join(mb->thread);
    /* Requests handed over after stop was seen: refused. */
    while (mb->inbox) {
        mb_req *r = mb->inbox;
        mb->inbox = r->next;
        complete(mb, r, DT_ERR_ABORTED, "the mailbox was destroyed");
    }
    while (mb->ctl) {
        mb_ctl *c = mb->ctl;
        mb->ctl = c->next;
        free(c);
    }
    while (mb->unexp) {
        mb_unexp *u = mb->unexp;
        mb->unexp = u->next;
        free(u->data);
        free(u);
    }
    dt_group_destroy(mb->g);
    pthread_mutex_destroy(&mb->mu);
    free(mb->peers);
    free(mb);
}

void dt_mailbox_abort(dt_mailbox *mb) {
    if (!mb)
        return;
    atomic_store(&mb->aborted, 1);
    wake(mb);
}

int dt_mailbox_rank(const dt_mailbox *mb) { return mb ? mb->rank : -1; }
int dt_mailbox_size(const dt_mailbox *mb) { return mb ? mb->size : 0; }

/* Validate, then hand the request to the thread. */
static dt_status submit(dt_mailbox *mb, bool is_send, void *buf, size_t count, dt_dtype dtype,
                        int peer, int tag, dt_msg_info *info, dt_work **work) {
    const char *what = is_send ? "dt_mailbox_isend" : "dt_mailbox_irecv";
    if (work)
        *work = NULL;
    if (!mb || !work)
        return dt_error_set(DT_ERR_INVALID, "%s: NULL %s", what, mb ? "work" : "mailbox");
    if ((unsigned)dtype >= DT_DTYPE_COUNT)
        return dt_error_set(DT_ERR_INVALID, "%s: bad dtype %d", what, (int)dtype);
    bool any = !is_send && peer == DT_ANY_SOURCE;
    if (!any && (peer < 0 || peer >= mb->size))
        return dt_error_set(DT_ERR_INVALID, "%s: %s %d is not a rank of a group of %d%s", what,
                            is_send ? "dest" : "source", peer, mb->size,
                            is_send ? "" : " (or DT_ANY_SOURCE)");
    if (tag < 0 && !(tag == DT_ANY_TAG && !is_send))
        return dt_error_set(DT_ERR_INVALID, "%s: tag %d (tags are >= 0%s)", what, tag,
                            is_send ? "" : ", or DT_ANY_TAG");
    size_t bytes;
    if (!dt_mul_size(count, dt_dtype_size(dtype), &bytes) || bytes > DT__WIRE_MAX_LEN)
        return dt_error_set(DT_ERR_INVALID, "%s: count %zu of %s is too large", what, count,
                            dt_dtype_name(dtype));
    if (count > 0 && !buf)
        return dt_error_set(DT_ERR_INVALID, "%s: NULL buffer for %zu elements", what, count);
    mb_req *r = calloc(1, sizeof *r);
    if (!r)
        return dt_error_set(DT_ERR_NOMEM, "mailbox: out of memory");
    r->w.op = mb->svc; /* op.g: the split, whose mu and done_cv publish completion */
    r->w.op.desc.coll = (uint8_t)(is_send ? DT_COLL_SEND : DT_COLL_RECV);
    r->w.op.desc.root = peer;
    r->w.op.desc.tag = tag;
    r->w.op.desc.count = count;
    r->w.op.desc.dtype = (uint8_t)dtype;
    r->is_send = is_send;
    r->peer = peer;
    r->tag = tag;
    r->buf = buf;
    r->count = count;
    r->dtype = dtype;
    r->bytes = bytes;
    r->info = info;
    pthread_mutex_lock(&mb->mu);
    bool stopped = mb->stop;
    if (!stopped)
        push_req(&mb->inbox, &mb->inbox_tail, r);
    pthread_mutex_unlock(&mb->mu);
    if (stopped) {
        free(r);
        return dt_error_set(DT_ERR_INVALID, "%s: the mailbox is being destroyed", what);
    }
    wake(mb);
    *work = &r->w;
    return DT_OK;
}

dt_status dt_mailbox_isend(dt_mailbox *mb, const void *buf, size_t count, dt_dtype dtype, int dest,
                           int tag, dt_work **work) {
    return submit(mb, true, (void *)buf, count, dtype, dest, tag, NULL, work);
}

dt_status dt_mailbox_send(dt_mailbox *mb, const void *buf, size_t count, dt_dtype dtype, int dest,
                          int tag) {
    dt_work *w = NULL;
    DT_CHECK(submit(mb, true, (void *)buf, count, dtype, dest, tag, NULL, &w));
    return dt_work_wait(w);
}

dt_status dt_mailbox_irecv(dt_mailbox *mb, void *buf, size_t count, dt_dtype dtype, int source,
                           int tag, dt_msg_info *info, dt_work **work) {
    return submit(mb, false, buf, count, dtype, source, tag, info, work);
}

dt_status dt_mailbox_recv(dt_mailbox *mb, void *buf, size_t count, dt_dtype dtype, int source,
                          int tag, dt_msg_info *info) {
    dt_work *w = NULL;
    DT_CHECK(submit(mb, false, buf, count, dtype, source, tag, info, &w));
    return dt_work_wait(w);
}
