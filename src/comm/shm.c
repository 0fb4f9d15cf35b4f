/*
 * shm.c — the shared-memory transport between ranks of one host.
 *
 * Each rank creates one POSIX shared-memory segment and maps every local
 * peer's. A segment holds:
 *
 *   ctrl    doorbell + sleeping flag (futex), the direct algorithm's phase
 *           counter and op descriptor, departed/abort words, the pid
 *   rings   one per local sender: head (written by the sender), tail
 *           (written by me), DT_SHM_SLOTS slots of DT_SHM_SLOT bytes, each
 *           slot a 64-byte frame header + payload
 *   window  2 x DT_SHM_WINDOW bytes that peers read directly (direct.c)
 *
 * Single copy: the ctrl also holds its own address in its owner (a probe
 * target), the owner's verdict on reading every peer with process_vm_readv
 * and DT_SHM_CMA_MIN, so all members agree on using read_peer (direct.c).
 *
 * A send copies fragments into the receiver's ring for this sender and
 * rings the receiver's doorbell; a receive copies (or reduces) them out
 * and rings the sender's doorbell to say space is free. Waiting is
 * spin-then-futex: a waiter publishes `sleeping`, looks for work once
 * more, and sleeps on the doorbell; a notifier, after publishing its data,
 * reads `sleeping` and only if it is set bumps the doorbell and calls
 * futex_wake. Both sides put a full fence between their store and their
 * load, so either the waiter's last look sees the data or the notifier
 * sees the waiter asleep (the store-load pattern of Dekker's algorithm).
 * The fast path has no system call and, while the peer is awake, no
 * read-modify-write of a line every peer writes; an idle rank uses no
 * CPU.
 *
 * Invariants: every header copied out of a slot is decoded and matched
 * before its length is used; a peer's segment is checked to have the
 * expected size before it is mapped; segments are unlinked as soon as all
 * peers have mapped them, so a crash leaves nothing in /dev/shm. A peer
 * whose process exits without setting `departed` is DT_ERR_PEER (watched
 * through a pidfd, which becomes readable when the process dies even
 * before it is reaped).
 */
#include "comm_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <poll.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif

typedef struct shm_ctrl {
    _Alignas(64) _Atomic uint32_t doorbell;
    _Atomic uint32_t sleeping;
    _Alignas(64) _Atomic uint64_t flag;     /* direct: phases completed */
    dt__wire_hdr desc[2];                   /* direct: op descriptor, by flag parity */
    uint64_t cma_addr[2][2];                /* direct: buffer addresses, by flag parity */
    uint64_t self_addr;                     /* where this ctrl lives in its owner (probe) */
    uint64_t cma_min;                       /* owner's DT_SHM_CMA_MIN */
    uint64_t push_min;                      /* owner's DT_SHM_PUSH_MIN */
    _Atomic int32_t cma_ok;                 /* owner can read every peer (process_vm_readv) */
    _Alignas(64) _Atomic uint64_t progress; /* direct single copy: pieces ready (epoch-tagged) */
    dt__small_line small[2];                /* direct small messages, by epoch parity */
    _Alignas(64) _Atomic uint64_t gate;     /* direct push allgather: epoch it accepts writes for */
    _Atomic int32_t pushing;                /* direct push allgather: writing into rank - 1 */
    _Alignas(64) _Atomic uint64_t waiting[3]; /* the collective its owner waits in (shm_waiting) */
    _Alignas(64) _Atomic int32_t departed;
    _Atomic int32_t abort_status;
    _Atomic int32_t abort_lost;
    _Atomic uint64_t abort_seq; /* the collective it failed in, 0: unknown */
    int32_t pid;
} shm_ctrl;

typedef struct shm_ring {
    _Alignas(64) _Atomic uint64_t head; /* fragments written (sender) */
    _Alignas(64) _Atomic uint64_t tail; /* fragments consumed (receiver) */
} shm_ring;

typedef struct speer {
    int rank;   /* group rank */
    char *base; /* its mapped segment */
    shm_ctrl *ctrl;
    shm_ring *out;              /* my ring in its segment */
    shm_ring *in;               /* its ring in my segment */
    uint64_t out_head, in_tail; /* local copies of what only I write */
    dt__xfer *sq, *sq_tail, *rq, *rq_tail;
    int pidfd;
    int pid;
} speer;

typedef struct shm_t {
    dt__transport base;
    dt_group *g;
    int n;        /* members including me */
    int me;       /* my member index */
    int *idx;     /* [group size] member index or -1 */
    speer *peers; /* [n], peers[me] is myself */
    char *mine;   /* my segment */
    size_t seg_size, ring_off, ring_size, win_off;
    size_t slot, nslots, window;
    bool cma;        /* every member can process_vm_readv every other */
    size_t cma_min;  /* largest DT_SHM_CMA_MIN among members */
    size_t push_min; /* largest DT_SHM_PUSH_MIN among members */
    struct pollfd *pfd;
} shm_t;

#define CTRL_SIZE 4096
_Static_assert(sizeof(shm_ctrl) <= CTRL_SIZE, "shm ctrl must fit its page");

static size_t slot_stride(const shm_t *t) { return sizeof(dt__wire_hdr) + t->slot; }

static char *slot_at(const shm_t *t, shm_ring *r, uint64_t i) {
    return (char *)r + 128 + (size_t)(i % t->nslots) * slot_stride(t);
}

static shm_ring *ring_in_seg(const shm_t *t, char *seg, int sender) {
    return (shm_ring *)(seg + t->ring_off + (size_t)sender * t->ring_size);
}

static void futex_wake(_Atomic uint32_t *addr) {
    syscall(SYS_futex, addr, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

/* The full fence between a store and a later load that the wake-up
 * protocol needs. ThreadSanitizer does not model fences (GCC refuses them
 * under -Werror=tsan); it checks executions as if sequentially consistent,
 * where this fence orders nothing, so a locked no-op on a thread's own word
 * (a full barrier on x86, and no synchronisation TSan could mistake for
 * real) takes its place there. */
#if defined(__SANITIZE_THREAD__)
static _Thread_local _Atomic int fence_word;
#define store_load_fence() ((void)atomic_fetch_add(&fence_word, 0))
#else
#define store_load_fence() atomic_thread_fence(memory_order_seq_cst)
#endif

/* After publishing: wake the owner of c if it armed (see the top comment).
 * Bumping the doorbell unconditionally cost every notification an atomic
 * add on a line all peers write, and every waiter's loop a miss on it: a
 * quarter of the cycles of an 8-byte allreduce on 4 ranks (perf). */
static void ring_bell(shm_ctrl *c) {
    store_load_fence();
    if (atomic_load_explicit(&c->sleeping, memory_order_relaxed)) {
        atomic_fetch_add_explicit(&c->doorbell, 1, memory_order_seq_cst);
        futex_wake(&c->doorbell);
    }
}

static speer *peer_of(shm_t *t, int rank) {
    DT_ASSERT(rank >= 0 && rank < t->g->size && t->idx[rank] >= 0);
    return &t->peers[t->idx[rank]];
}

#define LINK(head, tail, x)                                                                        \
    do {                                                                                           \
        (x)->next = NULL;                                                                          \
        if (tail)                                                                                  \
            (tail)->next = (x);                                                                    \
        else                                                                                       \
            (head) = (x);                                                                          \
        (tail) = (x);                                                                              \
    } while (0)

static dt_status shm_post_send(dt__transport *tr, dt__xfer *x) {
    shm_t *t = (shm_t *)tr;
    speer *p = peer_of(t, x->peer);
    x->nparts = 0; /* frames written so far */
    LINK(p->sq, p->sq_tail, x);
    return DT_OK;
}

static dt_status shm_post_recv(dt__transport *tr, dt__xfer *x) {
    shm_t *t = (shm_t *)tr;
    speer *p = peer_of(t, x->peer);
    x->nparts = 0;
    LINK(p->rq, p->rq_tail, x);
    return DT_OK;
}

static bool drive_send(shm_t *t, speer *p) {
    bool moved = false;
    while (p->sq) {
        dt__xfer *x = p->sq;
        uint64_t tail = atomic_load_explicit(&p->out->tail, memory_order_acquire);
        while (p->out_head - tail < t->nslots && (x->moved < x->len || x->nparts == 0)) {
            char *s = slot_at(t, p->out, p->out_head);
            uint64_t n = x->len - x->moved < t->slot ? x->len - x->moved : t->slot;
            dt__wire_hdr h = x->hdr;
            h.offset = x->moved;
            h.len = n;
            memcpy(s, &h, sizeof h);
            if (n)
                memcpy(s + sizeof h, x->buf + x->moved, n);
            x->moved += n;
            x->nparts++;
            p->out_head++;
            atomic_store_explicit(&p->out->head, p->out_head, memory_order_release);
            moved = true;
        }
        if (x->moved < x->len || x->nparts == 0)
            break;
        x->done = true;
        p->sq = x->next;
        if (!p->sq)
            p->sq_tail = NULL;
    }
    if (moved)
        ring_bell(p->ctrl);
    return moved;
}

static dt_status drive_recv(shm_t *t, speer *p, bool *progressed) {
    bool moved = false;
    dt_status st = DT_OK;
    while (p->rq) {
        dt__xfer *x = p->rq;
        uint64_t head = atomic_load_explicit(&p->in->head, memory_order_acquire);
        while (p->in_tail < head && (x->moved < x->len || x->nparts == 0)) {
            char *s = slot_at(t, p->in, p->in_tail);
            dt__wire_hdr got;
            uint64_t n = x->len - x->moved < t->slot ? x->len - x->moved : t->slot;
            st = dt__wire_decode(s, sizeof got, &got);
            if (st == DT_OK)
                st = dt__wire_check(&got, &x->hdr, t->g->rank, p->rank, x->moved, n);
            if (st != DT_OK)
                goto out;
            /* n is ours (bounded by the posted length and the slot), the
             * header only had to agree with it. */
            if (x->reduce) {
                size_t es = dt_dtype_size(x->dtype);
                dt_reduce((char *)x->red_out + x->moved, (const char *)x->red_in + x->moved,
                          s + sizeof got, n / es, x->dtype, x->redop);
            } else if (n) {
                memcpy(x->buf + x->moved, s + sizeof got, n);
            }
            x->moved += n;
            x->nparts++;
            p->in_tail++;
            atomic_store_explicit(&p->in->tail, p->in_tail, memory_order_release);
            moved = true;
        }
        if (x->moved < x->len || x->nparts == 0)
            break;
        if (x->reduce)
            x->reduced = true;
        x->done = true;
        p->rq = x->next;
        if (!p->rq)
            p->rq_tail = NULL;
    }
out:
    if (moved) {
        *progressed = true;
        ring_bell(p->ctrl);
    }
    return st;
}

static dt_status shm_progress(dt__transport *tr, bool *progressed) {
    shm_t *t = (shm_t *)tr;
    for (int i = 0; i < t->n; i++) {
        if (i == t->me)
            continue;
        speer *p = &t->peers[i];
        if (p->rq)
            DT_CHECK(drive_recv(t, p, progressed));
        if (p->sq && drive_send(t, p))
            *progressed = true;
    }
    return DT_OK;
}

static uint64_t shm_arm(dt__transport *tr) {
    shm_t *t = (shm_t *)tr;
    shm_ctrl *c = t->peers[t->me].ctrl;
    atomic_store_explicit(&c->sleeping, 1, memory_order_seq_cst);
    store_load_fence();
    return atomic_load_explicit(&c->doorbell, memory_order_acquire);
}

static void shm_block(dt__transport *tr, uint64_t tok, int ms) {
    shm_t *t = (shm_t *)tr;
    shm_ctrl *c = t->peers[t->me].ctrl;
    if (ms > 0 && atomic_load_explicit(&c->doorbell, memory_order_seq_cst) == (uint32_t)tok) {
        struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
        syscall(SYS_futex, &c->doorbell, FUTEX_WAIT, (uint32_t)tok, &ts, NULL, 0);
    }
    atomic_store_explicit(&c->sleeping, 0, memory_order_relaxed);
}

/* The record of the collective a rank waits in: three words, each tagged
 * with the low 24 bits of the operation's sequence number so that a reader
 * recognises a record it caught half rewritten (ranks of a group are never
 * more than an operation or two apart, far from 2^24). */
#define REC_SEQ(seq) (((uint64_t)(seq)&0xffffffu) << 40)
#define REC_VALID    ((uint64_t)1 << 39)
#define REC_LOW(w)   ((w) & (((uint64_t)1 << 40) - 1))

/* A waiter announces its operation where its local peers' check() looks:
 * two ranks that wait for each other in different calls, one on a shared
 * flag (direct algorithm) and one for a message, would otherwise never see
 * each other's descriptor. Written only when a wait has outlasted its
 * yields, so a healthy operation never pays for it. */
static void shm_waiting(dt__transport *tr, const dt__wire_hdr *cur) {
    shm_t *t = (shm_t *)tr;
    if (dt__is_p2p(cur->coll))
        return; /* numbered per peer: not comparable across ranks */
    shm_ctrl *c = t->peers[t->me].ctrl;
    uint64_t tag = REC_SEQ(cur->seq);
    atomic_store_explicit(&c->waiting[0], tag | REC_LOW(cur->count), memory_order_relaxed);
    atomic_store_explicit(&c->waiting[1], tag | (uint64_t)(uint32_t)cur->root,
                          memory_order_relaxed);
    atomic_store_explicit(&c->waiting[2],
                          tag | REC_VALID | (uint64_t)cur->coll << 16 | (uint64_t)cur->dtype << 8 |
                              cur->redop,
                          memory_order_relaxed);
}

/* Peer p's waiting record as a descriptor of `cur`'s sequence number;
 * false if it waits in another operation (or nothing whole is there). */
static bool peer_waiting(const speer *p, const dt__wire_hdr *cur, dt__wire_hdr *out) {
    uint64_t w[3];
    for (int i = 0; i < 3; i++)
        w[i] = atomic_load_explicit(&p->ctrl->waiting[i], memory_order_relaxed);
    uint64_t tag = REC_SEQ(cur->seq), mask = REC_SEQ(0xffffffu);
    if ((w[0] & mask) != tag || (w[1] & mask) != tag || (w[2] & mask) != tag || !(w[2] & REC_VALID))
        return false;
    *out = (dt__wire_hdr){.magic = DT__WIRE_MAGIC,
                          .version = DT__WIRE_VERSION,
                          .kind = DT__MSG_DATA,
                          .coll = (uint8_t)(w[2] >> 16),
                          .dtype = (uint8_t)(w[2] >> 8),
                          .redop = (uint8_t)w[2],
                          .root = (int32_t)(uint32_t)REC_LOW(w[1]),
                          .src = p->rank,
                          .seq = cur->seq,
                          .count = REC_LOW(w[0])};
    return out->coll < DT_COLL_COUNT && out->dtype < DT_DTYPE_COUNT && out->redop < DT_REDOP_COUNT;
}

static dt_status shm_check(dt__transport *tr, const dt__wire_hdr *cur) {
    shm_t *t = (shm_t *)tr;
    int k = 0;
    for (int i = 0; i < t->n; i++) {
        if (i == t->me)
            continue;
        speer *p = &t->peers[i];
        int32_t ab = atomic_load(&p->ctrl->abort_status);
        if (ab > 0 && dt__abort_later(atomic_load(&p->ctrl->abort_seq), cur, p->sq || p->rq))
            ab = 0; /* this call can still complete: fail at the next */
        if (ab == DT_ERR_MISMATCH)
            return dt__abort_error(p->rank, DT_ERR_MISMATCH, -1, t->g->size, false);
        if (ab > 0 && ab < DT_STATUS_COUNT) {
            int lostr = atomic_load(&p->ctrl->abort_lost);
            if (lostr >= 0 && lostr < t->g->size) {
                atomic_store(&t->g->lost, lostr);
                return dt_error_set(DT_ERR_PEER, "rank %d gave up (%s): rank %d is lost", p->rank,
                                    dt_status_name((dt_status)ab), lostr);
            }
            return dt_error_set(DT_ERR_PEER, "rank %d gave up (%s)", p->rank,
                                dt_status_name((dt_status)ab));
        }
        /* a frame waiting with no receive posted: does it belong here? */
        dt__wire_hdr got;
        if (!p->rq && p->in_tail < atomic_load_explicit(&p->in->head, memory_order_acquire)) {
            DT_CHECK(dt__wire_decode(slot_at(t, p->in, p->in_tail), sizeof got, &got));
            DT_CHECK(dt__wire_early(&got, cur, t->g->rank, p->rank));
        }
        /* the peer waits too, in the same numbered call: the same one? */
        if (!dt__is_p2p(cur->coll) && peer_waiting(p, cur, &got))
            DT_CHECK(dt__wire_early(&got, cur, t->g->rank, p->rank));
        t->pfd[k++] = (struct pollfd){.fd = p->pidfd, .events = POLLIN};
    }
    if (k == 0 || poll(t->pfd, (nfds_t)k, 0) <= 0)
        return DT_OK;
    k = 0;
    for (int i = 0; i < t->n; i++) {
        if (i == t->me)
            continue;
        speer *p = &t->peers[i];
        if (!t->pfd[k++].revents)
            continue;
        bool busy = p->sq || p->rq;
        if (atomic_load(&p->ctrl->departed) && !busy)
            continue;
        /* gone after giving up where this call does not need it */
        if (atomic_load(&p->ctrl->abort_status) > 0 &&
            dt__abort_later(atomic_load(&p->ctrl->abort_seq), cur, busy))
            continue;
        atomic_store(&t->g->lost, p->rank);
        return dt_error_set(DT_ERR_PEER, "rank %d (pid %d) %s: rank %d is lost", p->rank, p->pid,
                            atomic_load(&p->ctrl->departed) ? "left the group" : "died", p->rank);
    }
    return DT_OK;
}

static int shm_pending(dt__transport *tr, int *ranks, int max) {
    shm_t *t = (shm_t *)tr;
    int n = 0;
    for (int i = 0; i < t->n && n < max; i++)
        if (i != t->me && (t->peers[i].sq || t->peers[i].rq))
            ranks[n++] = t->peers[i].rank;
    return n;
}

/* Has peer's process exited? Never blocks and sets no error: a failing op
 * asks this while its own error stands. */
static bool shm_peer_dead(dt__transport *tr, int peer) {
    shm_t *t = (shm_t *)tr;
    if (peer < 0 || peer >= t->g->size || t->idx[peer] < 0)
        return true;
    struct pollfd f = {.fd = t->peers[t->idx[peer]].pidfd, .events = POLLIN};
    return poll(&f, 1, 0) > 0;
}

static void shm_peer_info(dt__transport *tr, int peer, dt__peer_info *out) {
    shm_t *t = (shm_t *)tr;
    memset(out, 0, sizeof *out);
    if (peer < 0 || peer >= t->g->size || t->idx[peer] < 0)
        return;
    speer *p = &t->peers[t->idx[peer]];
    out->shared = true;
    out->window = p->base + t->win_off;
    out->window_size = t->window;
    out->flag = &p->ctrl->flag;
    out->desc = p->ctrl->desc;
    out->cma = t->cma;
    out->cma_min = t->cma_min;
    out->push_min = t->push_min;
    out->addr = &p->ctrl->cma_addr[0][0];
    out->progress = &p->ctrl->progress;
    out->gate = &p->ctrl->gate;
    out->pushing = &p->ctrl->pushing;
    out->small = p->ctrl->small;
}

/* One process_vm_readv (or _writev) loop. The address came from shared
 * memory: it is only ever used as a remote address, so the kernel validates
 * it against the peer's mappings (EFAULT), never dereferenced here. */
static dt_status cma_copy(dt__transport *tr, int peer, bool write, void *local, uint64_t addr,
                          size_t len) {
    shm_t *t = (shm_t *)tr;
    const char *call = write ? "process_vm_writev" : "process_vm_readv";
    if (peer < 0 || peer >= t->g->size || t->idx[peer] < 0 || !t->cma)
        return dt_error_set(DT_ERR_INVALID, "shm: no single-copy path to rank %d", peer);
    speer *p = &t->peers[t->idx[peer]];
    if (addr == 0 || addr + len < addr)
        return dt_error_set(DT_ERR_PEER, "shm: rank %d published a bad address 0x%llx (+%zu)",
                            p->rank, (unsigned long long)addr, len);
    char *d = local;
    while (len > 0) {
        struct iovec l = {d, len}, r = {(void *)(uintptr_t)addr, len};
        ssize_t got = write ? process_vm_writev(p->pid, &l, 1, &r, 1, 0)
                            : process_vm_readv(p->pid, &l, 1, &r, 1, 0);
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0) {
            int e = got < 0 ? errno : EFAULT;
            if (e == ESRCH) {
                atomic_store(&t->g->lost, p->rank);
                return dt_error_set(DT_ERR_PEER,
                                    "rank %d (pid %d) died during a %s: rank %d is lost", p->rank,
                                    p->pid, call, p->rank);
            }
            return dt_error_set(
                DT_ERR_PEER, "shm: %s of %zu bytes at 0x%llx %s rank %d (pid %d): %s", call, len,
                (unsigned long long)addr, write ? "to" : "from", p->rank, p->pid, strerror(e));
        }
        d += got;
        addr += (uint64_t)got;
        len -= (size_t)got;
    }
    return DT_OK;
}

static dt_status shm_read_peer(dt__transport *tr, int peer, void *dst, uint64_t addr, size_t len) {
    return cma_copy(tr, peer, false, dst, addr, len);
}

static dt_status shm_write_peer(dt__transport *tr, int peer, uint64_t addr, const void *src,
                                size_t len) {
    return cma_copy(tr, peer, true, (void *)src, addr, len);
}

/* Can I read peer p's memory? Read its pid from its ctrl in its own
 * address space and compare. */
static bool cma_probe(const shm_t *t, const speer *p) {
    int32_t pid = 0;
    struct iovec l = {&pid, sizeof pid},
                 r = {(void *)(uintptr_t)(p->ctrl->self_addr + offsetof(shm_ctrl, pid)),
                      sizeof pid};
    (void)t;
    return p->ctrl->self_addr != 0 && process_vm_readv(p->pid, &l, 1, &r, 1, 0) == sizeof pid &&
           pid == p->pid;
}

static void shm_abort(dt__transport *tr, dt_status st, int lost_rank, uint64_t seq, bool owner) {
    (void)owner; /* only atomics: safe from any thread */
    shm_t *t = (shm_t *)tr;
    shm_ctrl *c = t->peers[t->me].ctrl;
    atomic_store(&c->abort_lost, lost_rank);
    atomic_store(&c->abort_seq, seq);
    atomic_store(&c->abort_status, (int32_t)st);
    for (int i = 0; i < t->n; i++)
        if (i != t->me)
            ring_bell(t->peers[i].ctrl);
}

static void shm_reset(dt__transport *tr) {
    shm_t *t = (shm_t *)tr;
    for (int i = 0; i < t->n; i++) {
        speer *p = &t->peers[i];
        p->sq = p->sq_tail = p->rq = p->rq_tail = NULL;
    }
}

static void shm_notify(dt__transport *tr, int peer) {
    shm_t *t = (shm_t *)tr;
    ring_bell(peer_of(t, peer)->ctrl);
}

static void shm_destroy(dt__transport *tr, bool clean) {
    shm_t *t = (shm_t *)tr;
    if (!t)
        return;
    if (t->mine) {
        shm_ctrl *c = (shm_ctrl *)t->mine;
        if (clean)
            atomic_store(&c->departed, 1);
        for (int i = 0; t->peers && i < t->n; i++)
            if (i != t->me && t->peers[i].ctrl)
                ring_bell(t->peers[i].ctrl);
    }
    for (int i = 0; t->peers && i < t->n; i++) {
        speer *p = &t->peers[i];
        if (p->base)
            munmap(p->base, t->seg_size);
        if (p->pidfd >= 0)
            close(p->pidfd);
    }
    free(t->peers);
    free(t->idx);
    free(t->pfd);
    free(t);
}

static const dt__transport_ops shm_ops = {
    .name = "shm",
    .post_send = shm_post_send,
    .post_recv = shm_post_recv,
    .progress = shm_progress,
    .arm = shm_arm,
    .block = shm_block,
    .check = shm_check,
    .waiting = shm_waiting,
    .pending = shm_pending,
    .peer_info = shm_peer_info,
    .read_peer = shm_read_peer,
    .write_peer = shm_write_peer,
    .peer_dead = shm_peer_dead,
    .abort = shm_abort,
    .reset = shm_reset,
    .notify = shm_notify,
    .destroy = shm_destroy,
};

static void seg_name(const dt_group *g, int rank, char *buf, size_t n) {
    snprintf(buf, n, "/dtrain-%016llx-%s-%d",
             (unsigned long long)dt_hash64(g->job->token, DT__TOKEN_LEN,
                                           dt_hash64(g->job->job_id, strlen(g->job->job_id), 0)),
             g->id, rank);
}

/* A segment's layout for n local members (see the file comment): its
 * slots, the ring of one sender, the window, and the whole size. */
static void shm_layout(const dt__config *cfg, int n, size_t *slot, size_t *nslots, size_t *window,
                       size_t *ring, size_t *seg) {
    *slot = dt_align_up(cfg->shm_slot, 64);
    *nslots = (size_t)cfg->shm_slots;
    *window = dt_align_up(cfg->shm_window, 4096);
    *ring = dt_align_up(128 + *nslots * (sizeof(dt__wire_hdr) + *slot), 4096);
    *seg = CTRL_SIZE + (size_t)n * *ring + 2 * *window;
}

dt_status dt_comm_plan_shm_bytes(int local, bool bulk, bool staged, size_t *out) {
    *out = 0;
    if (local < 2)
        return DT_OK;
    dt__config cfg;
    DT_CHECK(dt__config_read(&cfg));
    size_t slot, nslots, window, ring, seg;
    shm_layout(&cfg, local, &slot, &nslots, &window, &ring, &seg);
    (void)seg;
    /* Pages are resident once touched: its own ctrl, each peer's ctrl and
     * the first page of a ring per peer (small messages; large ones go
     * single-copy, process_vm_readv, not through the rings); with bulk
     * traffic its window, which large collectives (a broadcast) stage
     * through, and with staged traffic the peers' windows too, which the
     * direct algorithm reads. */
    size_t page = 4096, peers = (size_t)(local - 1);
    *out = CTRL_SIZE + peers * (page + CTRL_SIZE) + (bulk ? 2 * window : 0) +
           (bulk && staged ? peers * 2 * window : 0);
    return DT_OK;
}

static dt_status map_segment(const char *name, size_t size, bool create, char **out) {
    int fd = shm_open(name, create ? O_RDWR | O_CREAT | O_EXCL : O_RDWR, 0600);
    if (fd < 0 && create && errno == EEXIST) { /* a stale one from a crashed run */
        shm_unlink(name);
        fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0600);
    }
    if (fd < 0)
        return dt_error_set_errno(DT_ERR_SYSTEM, "shm_open(%s)", name);
    dt_status st = DT_OK;
    if (create && ftruncate(fd, (off_t)size) < 0) {
        st = dt_error_set_errno(DT_ERR_SYSTEM, "ftruncate(%s, %zu) (is /dev/shm large enough?)",
                                name, size);
        goto out;
    }
    struct stat sb;
    if (fstat(fd, &sb) < 0 || (size_t)sb.st_size != size) {
        st = dt_error_set(DT_ERR_PROTOCOL,
                          "shared segment %s has %lld bytes, expected %zu "
                          "(peers disagree on DT_SHM_* settings?)",
                          name, (long long)sb.st_size, size);
        goto out;
    }
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        st = dt_error_set_errno(DT_ERR_SYSTEM, "mmap(%s, %zu)", name, size);
        goto out;
    }
    *out = p;
out:
    close(fd);
    if (st != DT_OK && create)
        shm_unlink(name);
    return st;
}

dt_status dt__shm_create(dt_group *g, const int *peers, int npeers, dt__transport **out) {
    dt_status st = DT_OK;
    char name[200], key[200];
    bool unlinked = true;
    shm_t *t = calloc(1, sizeof *t);
    if (!t)
        return dt_error_set(DT_ERR_NOMEM, "shm: out of memory");
    t->base.ops = &shm_ops;
    t->g = g;
    t->n = npeers + 1;
    shm_layout(&g->cfg, t->n, &t->slot, &t->nslots, &t->window, &t->ring_size, &t->seg_size);
    t->ring_off = CTRL_SIZE;
    t->win_off = t->ring_off + (size_t)t->n * t->ring_size;
    t->idx = malloc((size_t)g->size * sizeof *t->idx);
    t->peers = calloc((size_t)t->n, sizeof *t->peers);
    t->pfd = calloc((size_t)t->n, sizeof *t->pfd);
    if (!t->idx || !t->peers || !t->pfd) {
        st = dt_error_set(DT_ERR_NOMEM, "shm: out of memory");
        goto fail;
    }
    for (int r = 0; r < g->size; r++)
        t->idx[r] = -1;
    /* members = peers plus me, ascending */
    int k = 0;
    for (int i = 0; i < npeers; i++) {
        if (k == i && peers[i] > g->rank)
            t->peers[k++].rank = g->rank;
        t->peers[k++].rank = peers[i];
    }
    if (k == npeers)
        t->peers[k++].rank = g->rank;
    for (int i = 0; i < t->n; i++) {
        t->idx[t->peers[i].rank] = i;
        t->peers[i].pidfd = -1;
        if (t->peers[i].rank == g->rank)
            t->me = i;
    }
    DT_ASSERT(k == t->n && t->peers[t->me].rank == g->rank);

    seg_name(g, g->rank, name, sizeof name);
    DT_CHECK_GOTO(map_segment(name, t->seg_size, true, &t->mine), st, fail);
    unlinked = false;
    ((shm_ctrl *)t->mine)->pid = getpid();
    ((shm_ctrl *)t->mine)->self_addr = (uint64_t)(uintptr_t)t->mine;
    ((shm_ctrl *)t->mine)->cma_min = g->cfg.shm_cma_min;
    ((shm_ctrl *)t->mine)->push_min = g->cfg.shm_push_min;
    atomic_store(&((shm_ctrl *)t->mine)->abort_lost, -1);
    t->peers[t->me].base = t->mine;
    t->peers[t->me].ctrl = (shm_ctrl *)t->mine;
    snprintf(key, sizeof key, "%s/shm/%d", g->id, g->rank);
    DT_CHECK_GOTO(dt__store_set(g->job->store, key, name, strlen(name) + 1), st, fail);
    for (int i = 0; i < t->n; i++) {
        if (i == t->me)
            continue;
        speer *p = &t->peers[i];
        void *v = NULL;
        size_t len;
        snprintf(key, sizeof key, "%s/shm/%d", g->id, p->rank);
        DT_CHECK_GOTO(dt__store_wait(g->job->store, key, &v, &len), st, fail);
        st = map_segment((const char *)v, t->seg_size, false, &p->base);
        dt_free(v);
        if (st != DT_OK)
            goto fail;
        p->ctrl = (shm_ctrl *)p->base;
        p->out = ring_in_seg(t, p->base, t->me);
        p->in = ring_in_seg(t, t->mine, i);
        p->pid = g->job->pids[g->world[p->rank]];
        p->pidfd = (int)syscall(SYS_pidfd_open, p->pid, 0);
        if (p->pidfd < 0) {
            st = dt_error_set_errno(DT_ERR_SYSTEM, "pidfd_open(%d) for rank %d", p->pid, p->rank);
            goto fail;
        }
    }
    /* Single copy: probe every peer now (its ctrl was filled before its
     * name was published); publish the verdict before the counter below, so
     * after it every member sees every verdict and all agree. */
    bool ok = g->cfg.shm_cma != 2;
    for (int i = 0; ok && i < t->n; i++)
        if (i != t->me)
            ok = cma_probe(t, &t->peers[i]);
    atomic_store(&((shm_ctrl *)t->mine)->cma_ok, ok ? 1 : 0);
    /* Everyone has mapped everything: unlink, so nothing outlives the job.
     * The counter is per host (named by its lowest rank): with several
     * hosts a shared one would reach n before this host's peers mapped. */
    snprintf(key, sizeof key, "%s/shm/mapped/%d", g->id, t->peers[0].rank);
    int64_t cnt;
    DT_CHECK_GOTO(dt__store_add(g->job->store, key, 1, &cnt), st, fail);
    double dl = dt_now() + g->cfg.timeout;
    while (cnt < t->n) {
        if (dt_now() > dl) {
            st = dt_error_set(DT_ERR_TIMEOUT,
                              "shm: only %lld of %d local ranks mapped the "
                              "segments",
                              (long long)cnt, t->n);
            goto fail;
        }
        dt_sleep_ms(1);
        DT_CHECK_GOTO(dt__store_add(g->job->store, key, 0, &cnt), st, fail);
    }
    shm_unlink(name);
    t->cma = true;
    t->cma_min = t->push_min = 0;
    for (int i = 0; i < t->n; i++) {
        t->cma = t->cma && atomic_load(&t->peers[i].ctrl->cma_ok) == 1;
        if (t->peers[i].ctrl->cma_min > t->cma_min)
            t->cma_min = (size_t)t->peers[i].ctrl->cma_min;
        if (t->peers[i].ctrl->push_min > t->push_min)
            t->push_min = (size_t)t->peers[i].ctrl->push_min;
    }
    if (g->cfg.shm_cma == 1 && !t->cma && t->n > 1) {
        st = dt_error_set(DT_ERR_UNSUPPORTED,
                          "DT_SHM_CMA=on but process_vm_readv between local ranks fails here "
                          "(ptrace scope? use auto or off)");
        unlinked = true;
        goto fail;
    }
    *out = &t->base;
    return DT_OK;
fail:
    if (!unlinked)
        shm_unlink(name);
    shm_destroy(&t->base, false);
    dt_error_prefix("shm transport of group %s, rank %d", g->id, g->rank);
    return st;
}
