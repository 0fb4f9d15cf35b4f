/*
 * direct.c — collectives for ranks that share memory: every rank copies its
 * input into its own shared window, and then reads its peers' windows
 * directly. No messages; synchronisation is one counter per rank.
 *
 * Allreduce, per chunk of at most DT_SHM_WINDOW bytes, four ranks:
 *
 *   1. copy in     rank r: window_r <- send[chunk]
 *   2. barrier     (every rank's input is visible)
 *   3. reduce      rank r: slice r = window_0[r] op window_1[r] op ... ;
 *                  written to recv and back into window_r[slice r]
 *   4. barrier     (every slice is reduced)
 *   5. copy out    rank r: recv[slice q] <- window_q[slice q], q != r
 *
 * Each rank reads n slices of 1/n of the chunk and writes 1/n: the
 * reduction work is split evenly, and each element is reduced by exactly one
 * rank in a fixed order, so results are bit-identical everywhere.
 * Windows have two halves used alternately: before writing half h for chunk
 * k, a rank has passed the first barrier of chunk k-1, which every peer
 * reaches only after its last read of half h (chunk k-2). Reduce-scatter,
 * allgather and broadcast need just one barrier per chunk by the same
 * argument.
 *
 * The op descriptor is published next to the counter before the first
 * barrier and compared after it: ranks in different operations get
 * DT_ERR_MISMATCH, exactly as with messages.
 *
 * Single copy (when the transport says every member may read and write every
 * other's memory, and the message is at least DT_SHM_CMA_MIN, or for the
 * allgather ag_use_cma's smaller threshold): instead of copying into its
 * window, a rank publishes its buffer addresses (same parity slot as the
 * descriptor) and peers copy straight between their buffers with the
 * transport's read_peer / write_peer. Allgather: publish my block, barrier,
 * pull every peer's block, barrier; from DT_SHM_PUSH_MIN of output, publish
 * my recv, barrier, push my block into every peer's recv, barrier.
 *
 * Why push only large outputs: pushing reads each block once, while it is
 * hot, instead of every rank reading every peer's block cold; but pushed
 * lines arrive in the writer's cache, so the owner's first read of them
 * misses. Measured with a consumer that reads the whole output after each
 * call (2 cores, docs/comm.md): push/pull 0.5-0.6x at 256 KiB-1 MiB of
 * output, 0.84-0.96x at 2 MiB, 0.99-1.11x at 4 MiB, 1.03-1.13x at 8-16 MiB;
 * hence DT_SHM_PUSH_MIN = 4 MiB by default.
 * Allreduce (two ranks, out of place): publish send and recv, barrier,
 * pull the peer's half of my slice into recv and reduce it with my send,
 * barrier, pull the peer's reduced slice from its recv, barrier. The last
 * barrier of each is what lets a rank return: after it no peer touches its
 * buffers. Each byte crosses once instead of twice.
 */
#include "comm_internal.h"

#include <sched.h>
#include <stdlib.h>
#include <string.h>

#define MAX_LOCAL 256

typedef struct dctx {
    dt__op *op;
    const dt__team *t;
    dt__peer_info pi[MAX_LOCAL];
    uint64_t target;
    unsigned pub; /* parity slot of the addresses published for this op */
    bool checked;
} dctx;

bool dt__team_shared(dt__op *op, const dt__team *t) {
    dt_group *g = op->g;
    if (!g->shm || t->n > MAX_LOCAL)
        return false;
    for (int i = 0; i < t->n; i++)
        if (i != t->me && g->tp[t->ranks[i]] != g->shm)
            return false;
    return true;
}

static bool flags_reached(void *arg) {
    dctx *d = arg;
    for (int i = 0; i < d->t->n; i++)
        if (atomic_load_explicit(d->pi[i].flag, memory_order_acquire) < d->target)
            return false;
    return true;
}

/* The ranks whose flag has not reached the target (for a timeout). */
static int flags_behind(void *arg, int *ranks, int max) {
    dctx *d = arg;
    int n = 0;
    for (int i = 0; i < d->t->n && n < max; i++)
        if (atomic_load_explicit(d->pi[i].flag, memory_order_acquire) < d->target)
            ranks[n++] = d->t->ranks[i];
    return n;
}

static dt_status ctx_init(dctx *d, dt__op *op, const dt__team *t) {
    d->op = op;
    d->t = t;
    d->checked = false;
    for (int i = 0; i < t->n; i++) {
        op->g->shm->ops->peer_info(op->g->shm, t->ranks[i], &d->pi[i]);
        DT_ASSERT(d->pi[i].shared);
    }
    /* Publish my descriptor before my first flag of this op, in the slot of
     * that flag's parity: the other slot may still be read by a peer that
     * has not yet checked the previous op. */
    dt__wire_hdr desc = op->desc;
    desc.offset = desc.len = 0;
    d->pi[t->me].desc[(op->g->direct_epoch + 1) & 1] = desc;
    return DT_OK;
}

static dt_status barrier(dctx *d) {
    dt_group *g = d->op->g;
    d->target = ++g->direct_epoch;
    atomic_store_explicit(d->pi[d->t->me].flag, d->target, memory_order_release);
    for (int i = 0; i < d->t->n; i++)
        if (i != d->t->me)
            g->shm->ops->notify(g->shm, d->t->ranks[i]);
    DT_CHECK(dt__wait_pred_from(d->op, flags_reached, flags_behind, d));
    if (!d->checked) {
        d->checked = true;
        dt__wire_hdr want = d->op->desc;
        want.offset = want.len = 0;
        for (int i = 0; i < d->t->n; i++) {
            if (i == d->t->me)
                continue;
            dt__wire_hdr got = d->pi[i].desc[d->target & 1];
            DT_CHECK(dt__wire_check(&got, &want, g->rank, d->t->ranks[i], 0, 0));
        }
    }
    return DT_OK;
}

/* Single copy for this op? Same answer on every member: cma and cma_min
 * are agreed at creation and bytes is in the (checked) descriptor. */
static bool use_cma(const dctx *d, size_t bytes) {
    const dt__peer_info *me = &d->pi[d->t->me];
    const dt__transport_ops *ops = d->op->g->shm->ops;
    return me->cma && bytes >= me->cma_min && ops->read_peer && ops->write_peer;
}

/* Publish my buffer addresses for the coming first barrier of this op (the
 * descriptor's parity slot, same lifetime argument). */
static void publish(dctx *d, const void *a, const void *b) {
    d->pub = (unsigned)((d->op->g->direct_epoch + 1) & 1);
    uint64_t *slot = d->pi[d->t->me].addr + 2 * d->pub;
    slot[0] = (uint64_t)(uintptr_t)a;
    slot[1] = (uint64_t)(uintptr_t)b;
}

/* Peer i's published address k; valid after the first barrier. */
static uint64_t peer_addr(const dctx *d, int i, int k) {
    return d->pi[i].addr[2 * d->pub + (unsigned)k];
}

static dt_status pull(dctx *d, int i, void *dst, uint64_t addr, size_t len) {
    if (!len)
        return DT_OK;
    dt__transport *tr = d->op->g->shm;
    dt_status st = tr->ops->read_peer(tr, d->t->ranks[i], dst, addr, len);
    return st == DT_OK ? st : dt__op_error(d->op, st);
}

static char *win(dctx *d, int i, unsigned half) {
    return d->pi[i].window + (size_t)half * d->pi[i].window_size;
}

static unsigned next_half(dt_group *g) { return (unsigned)(g->direct_chunk++ & 1); }

/* dst = window 0 op window 1 op ... op window n-1, each read at byte offset
 * off of half h: always in rank order, so every rank gets the same bits. */
static void reduce_windows(dctx *d, unsigned h, size_t off, void *dst, size_t count) {
    dt__op *op = d->op;
    dt_reduce(dst, win(d, 0, h) + off, win(d, 1, h) + off, count, op->dtype, op->redop);
    for (int i = 2; i < d->t->n; i++)
        dt_reduce(dst, dst, win(d, i, h) + off, count, op->dtype, op->redop);
}

/* Slice i of c elements, cut in whole cache lines so no two ranks write the
 * same line. */
static void slice(size_t c, size_t es, int n, int i, size_t *off, size_t *len) {
    size_t unit = 64 / es, units = (c + unit - 1) / unit;
    size_t per = units / (size_t)n, extra = units % (size_t)n;
    size_t u0 = (size_t)i * per + ((size_t)i < extra ? (size_t)i : extra);
    size_t u1 = u0 + per + ((size_t)i < extra);
    *off = u0 * unit < c ? u0 * unit : c;
    size_t end = u1 * unit < c ? u1 * unit : c;
    *len = end - *off;
}

/* Small vectors: one barrier instead of two. Every rank reduces the whole
 * (tiny) vector from all windows, in the same order, so results are still
 * identical everywhere; what is saved is a round of waiting for the slowest
 * rank, which dominates latency when ranks share cores. */
#define SMALL_BYTES (16 << 10)
#define CMA_PIECE   (256 << 10)
#define AG_PIECE    (512 << 10)

/* Tiny messages (<= DT__SMALL_BYTES of payload per rank): no window and
 * no separate flag. Each rank writes its payload, the op's identity and
 * the epoch into one cache line of its ctrl (epoch last, release), bumps
 * its flag too (so a peer in a windowed op of a mismatched call still sees
 * the epoch and reports the mismatch), and waits until every peer's line
 * carries the same epoch: one cache-line transfer per peer instead of the
 * flag, descriptor and window lines. Lines alternate by epoch parity: a
 * rank rewrites line E&1 only at epoch E+2, after every peer published
 * E+1, i.e. after it finished reading line E&1. */
typedef struct small_wait {
    dctx *d;
    uint64_t epoch;
} small_wait;

static bool small_late(const small_wait *w, int i) {
    const dctx *d = w->d;
    const dt__small_line *l = &d->pi[i].small[w->epoch & 1];
    return atomic_load_explicit(&l->epoch, memory_order_acquire) != w->epoch &&
           atomic_load_explicit(d->pi[i].flag, memory_order_acquire) < w->epoch;
}

static int small_behind(void *arg, int *ranks, int max) {
    small_wait *w = arg;
    int n = 0;
    for (int i = 0; i < w->d->t->n && n < max; i++)
        if (i != w->d->t->me && small_late(w, i))
            ranks[n++] = w->d->t->ranks[i];
    return n;
}

static bool small_ready(void *arg) {
    small_wait *w = arg;
    for (int i = 0; i < w->d->t->n; i++)
        if (i != w->d->t->me && small_late(w, i))
            return false;
    return true;
}

static void small_id(const dt__op *op, uint64_t id[2]) {
    id[0] = (uint64_t)op->coll | (uint64_t)op->dtype << 8 | (uint64_t)op->redop << 16 |
            (op->desc.seq & 0xffffffffu) << 32;
    id[1] = op->count;
}

/* Publish len bytes, wait for every peer's line of this epoch and check it
 * is the same operation. Returns the epoch's lines in d->pi[i].small. */
static dt_status small_exchange(dctx *d, const void *payload, size_t len,
                                const dt__small_line **lines) {
    dt__op *op = d->op;
    dt_group *g = op->g;
    int me = d->t->me;
    uint64_t e = d->target = ++g->direct_epoch;
    dt__small_line *mine = &d->pi[me].small[e & 1];
    memcpy(mine->data, payload, len);
    small_id(op, mine->id);
    atomic_store_explicit(&mine->epoch, e, memory_order_release);
    atomic_store_explicit(d->pi[me].flag, e, memory_order_release);
    for (int i = 0; i < d->t->n; i++)
        if (i != me)
            g->shm->ops->notify(g->shm, d->t->ranks[i]);
    small_wait w = {d, e};
    DT_CHECK(dt__wait_pred_from(op, small_ready, small_behind, &w));
    for (int i = 0; i < d->t->n; i++) {
        const dt__small_line *l = &d->pi[i].small[e & 1];
        lines[i] = l;
        if (i == me || (atomic_load_explicit(&l->epoch, memory_order_acquire) == e &&
                        l->id[0] == mine->id[0] && l->id[1] == mine->id[1]))
            continue;
        /* a different call: the full descriptors name both */
        dt__wire_hdr want = op->desc, got = d->pi[i].desc[e & 1];
        want.offset = want.len = 0;
        DT_CHECK(dt__wire_check(&got, &want, g->rank, d->t->ranks[i], 0, 0));
        return dt_error_set(DT_ERR_MISMATCH, "rank %d and rank %d disagree on %s #%llu", g->rank,
                            d->t->ranks[i], dt_coll_name(op->coll),
                            (unsigned long long)op->desc.seq);
    }
    return DT_OK;
}

/* out = the count elements at byte `at` of every rank's line, combined in
 * rank order (n >= 2). */
static void reduce_lines(const dt__op *op, void *out, const dt__small_line *const *l, int n,
                         size_t at, size_t count) {
    dt_reduce(out, l[0]->data + at, l[1]->data + at, count, op->dtype, op->redop);
    for (int i = 2; i < n; i++)
        dt_reduce(out, out, l[i]->data + at, count, op->dtype, op->redop);
}

static dt_status allreduce_small(dctx *d, const void *send, void *recv, size_t count) {
    dt__op *op = d->op;
    int me = d->t->me;
    size_t es = dt_dtype_size(op->dtype);
    unsigned h = next_half(op->g);
    memcpy(win(d, me, h), send, count * es);
    DT_CHECK(barrier(d));
    reduce_windows(d, h, 0, recv, count);
    return DT_OK;
}

/* dst = every rank's c elements at byte offset `at` of its send buffer,
 * combined in rank order: my own read from `own`, the peers' pulled with
 * process_vm_readv into the two-piece staging buffer, or straight into dst
 * when `into_dst` (dst is then free to hold one input: rank 0's, on every
 * rank but 0, so that it stays dt_reduce's first operand like the
 * accumulator after it; min and max of +0 and -0 depend on which operand
 * is first, and DT_DETERMINISTIC needs the same roles on every path). */
static dt_status reduce_piece(dctx *d, char *dst, const char *own, uint64_t at, size_t c,
                              char *stage, bool into_dst) {
    dt__op *op = d->op;
    int n = d->t->n, me = d->t->me;
    size_t es = dt_dtype_size(op->dtype), bytes = c * es;
    const char *in[2];
    for (int i = 0; i < 2; i++) {
        char *to = into_dst && i == 0 ? dst : stage + (size_t)i * CMA_PIECE;
        if (i != me)
            DT_CHECK(pull(d, i, to, peer_addr(d, i, 0) + at, bytes));
        in[i] = i == me ? own : to;
    }
    if (in[1] == dst) { /* rank 1 in place: rank 0's value must stay the first operand */
        memcpy(stage + CMA_PIECE, dst, bytes);
        in[1] = stage + CMA_PIECE;
    }
    dt_reduce(dst, in[0], in[1], c, op->dtype, op->redop);
    for (int i = 2; i < n; i++) {
        const char *x = own;
        if (i != me) {
            DT_CHECK(pull(d, i, stage, peer_addr(d, i, 0) + at, bytes));
            x = stage;
        }
        dt_reduce(dst, dst, x, c, op->dtype, op->redop);
    }
    return DT_OK;
}

/* Single-copy allreduce. After one barrier (addresses published), rank r
 * reduces slice r piece by piece: a peer's piece is pulled straight into
 * recv (out of place) or into a cache-sized staging buffer (in place, or
 * the third and later inputs) and combined in rank order while still in
 * cache; after each piece r bumps its progress word. Then r pulls every
 * other slice from its owner's recv, each run of pieces the owner has
 * finished in one call. No barrier between the reduction and the gather: a
 * rank that is ahead starts gathering while its peer still reduces. (Pulling
 * a peer's pieces between my own, as soon as they are reduced, measured
 * slower: the lines are then still modified in the peer core's cache.) A
 * final barrier: after it no peer reads my buffers.
 *
 * In place is safe for two ranks: the only bytes of my buffer I overwrite
 * that a peer reads are those of its slice, and I pull its reduced piece k
 * only after its progress says k is done, i.e. after it read my piece k.
 * With more ranks a rank's own input would be overwritten by the first
 * combination before it is read, so 3+ ranks in place use the window. */
typedef struct prog_wait {
    _Atomic uint64_t *word;
    uint64_t want;
    int rank; /* whose progress word */
} prog_wait;

static bool prog_reached(void *arg) {
    prog_wait *w = arg;
    return atomic_load_explicit(w->word, memory_order_acquire) >= w->want;
}

static int prog_behind(void *arg, int *ranks, int max) {
    prog_wait *w = arg;
    if (max < 1 || prog_reached(w))
        return 0;
    ranks[0] = w->rank;
    return 1;
}

static dt_status allreduce_cma(dctx *d, const void *send, void *recv, size_t count) {
    dt__op *op = d->op;
    dt_group *g = op->g;
    int n = d->t->n, me = d->t->me;
    size_t es = dt_dtype_size(op->dtype), piece = CMA_PIECE / es;
    char *stage;
    DT_CHECK(dt__scratch(g, 2 * piece * es, (void **)&stage));
    size_t so, sl;
    slice(count, es, n, me, &so, &sl);
    publish(d, send, recv);
    DT_CHECK(barrier(d));
    /* progress values of this op: epoch in the high bits, pieces below;
     * epochs only grow, so a value from an older op is always smaller */
    uint64_t tag = d->target << 24;
    DT_ASSERT((sl + piece - 1) / piece < (1u << 24));
    for (size_t b = 0, k = 1; b < sl; b += piece, k++) {
        size_t c = sl - b < piece ? sl - b : piece, at = (so + b) * es;
        DT_CHECK(reduce_piece(d, (char *)recv + at, (const char *)send + at, at, c, stage,
                              send != recv));
        atomic_store_explicit(d->pi[me].progress, tag | k, memory_order_release);
    }
    for (int i = 0; i < n; i++)
        if (i != me)
            g->shm->ops->notify(g->shm, d->t->ranks[i]);
    for (int i = 0; i < n; i++) {
        if (i == me)
            continue;
        size_t po, pl;
        slice(count, es, n, i, &po, &pl);
        size_t np = (pl + piece - 1) / piece;
        prog_wait w = {d->pi[i].progress, 0, d->t->ranks[i]};
        for (size_t got = 0; got < np;) {
            w.want = tag | (got + 1);
            DT_CHECK(dt__wait_pred_from(op, prog_reached, prog_behind, &w));
            size_t upto = atomic_load_explicit(w.word, memory_order_acquire) - tag;
            upto = upto < np ? upto : np;
            size_t b = got * piece, e = upto * piece < pl ? upto * piece : pl;
            size_t at = (po + b) * es;
            DT_CHECK(pull(d, i, (char *)recv + at, peer_addr(d, i, 1) + at, (e - b) * es));
            got = upto;
        }
    }
    return barrier(d);
}

dt_status dt__direct_allreduce(dt__op *op, const dt__team *t, const void *send, void *recv,
                               size_t count) {
    dctx d;
    DT_CHECK(ctx_init(&d, op, t));
    dt_group *g = op->g;
    size_t es = dt_dtype_size(op->dtype), cap = d.pi[t->me].window_size / es;
    int n = t->n, me = t->me;
    if (count * es <= DT__SMALL_BYTES) {
        const dt__small_line *l[MAX_LOCAL];
        DT_CHECK(small_exchange(&d, send, count * es, l));
        reduce_lines(op, recv, l, n, 0, count);
        return DT_OK;
    }
    if (count * es <= SMALL_BYTES && count * es <= d.pi[me].window_size)
        return allreduce_small(&d, send, recv, count);
    if ((n == 2 || send != recv) && use_cma(&d, count * es))
        return allreduce_cma(&d, send, recv, count);
    for (size_t base = 0; base < count; base += cap) {
        size_t c = count - base < cap ? count - base : cap;
        unsigned h = next_half(g);
        memcpy(win(&d, me, h), (const char *)send + base * es, c * es);
        DT_CHECK(barrier(&d));
        size_t so, sl;
        slice(c, es, n, me, &so, &sl);
        char *dst = (char *)recv + (base + so) * es;
        if (sl) {
            reduce_windows(&d, h, so * es, dst, sl);
            memcpy(win(&d, me, h) + so * es, dst, sl * es);
        }
        DT_CHECK(barrier(&d));
        for (int i = 0; i < n; i++) {
            if (i == me)
                continue;
            slice(c, es, n, i, &so, &sl);
            memcpy((char *)recv + (base + so) * es, win(&d, i, h) + so * es, sl * es);
        }
    }
    return DT_OK;
}

/* Single-copy reduce-scatter: publish send, barrier, reduce block `me` of
 * every rank's send piece by piece (peer pieces pulled into a cache-sized
 * staging buffer, combined in rank order into out), barrier. Peers only
 * read blocks other than their reader's own, so in place is safe for two
 * ranks; with more, a rank's own block would be overwritten by the first
 * combination before it is read (in place on 3+ ranks uses the window). */
static dt_status reduce_scatter_cma(dctx *d, const void *send, char *out, size_t count) {
    dt__op *op = d->op;
    int me = d->t->me;
    size_t es = dt_dtype_size(op->dtype), piece = CMA_PIECE / es;
    char *stage;
    DT_CHECK(dt__scratch(op->g, 2 * piece * es, (void **)&stage));
    publish(d, send, NULL);
    DT_CHECK(barrier(d));
    for (size_t b = 0; b < count; b += piece) {
        size_t c = count - b < piece ? count - b : piece, at = ((size_t)me * count + b) * es;
        DT_CHECK(reduce_piece(d, out + b * es, (const char *)send + at, at, c, stage, false));
    }
    return barrier(d);
}

dt_status dt__direct_reduce_scatter(dt__op *op, const dt__team *t, const void *send, void *recv,
                                    size_t count) {
    dctx d;
    DT_CHECK(ctx_init(&d, op, t));
    dt_group *g = op->g;
    int n = t->n, me = t->me;
    size_t es = dt_dtype_size(op->dtype), cap = d.pi[me].window_size / es / (size_t)n;
    if (cap == 0)
        return dt_error_set(DT_ERR_INVALID, "DT_SHM_WINDOW too small for %d ranks", n);
    char *out = (char *)recv + (send == recv ? (size_t)me * count * es : 0);
    if ((n == 2 || send != recv) && use_cma(&d, count * es))
        return reduce_scatter_cma(&d, send, out, count);
    if ((size_t)n * count * es <= DT__SMALL_BYTES) {
        const dt__small_line *l[MAX_LOCAL];
        size_t at = (size_t)me * count * es;
        DT_CHECK(small_exchange(&d, send, (size_t)n * count * es, l));
        reduce_lines(op, out, l, n, at, count);
        return DT_OK;
    }
    for (size_t base = 0; base < count; base += cap) {
        size_t c = count - base < cap ? count - base : cap;
        unsigned h = next_half(g);
        for (int b = 0; b < n; b++)
            memcpy(win(&d, me, h) + (size_t)b * c * es,
                   (const char *)send + ((size_t)b * count + base) * es, c * es);
        DT_CHECK(barrier(&d));
        size_t mo = (size_t)me * c * es;
        char *dst = out + base * es;
        reduce_windows(&d, h, mo, dst, c);
    }
    return DT_OK;
}

/* Push allgather: peers write into my output, so I must not return while
 * one may still be writing (my caller may free or reuse the buffer at
 * once), not even after a failure. Each rank's gate holds the epoch whose
 * writes it accepts. A writer announces which rank it is writing into,
 * then reads that rank's gate; a failing rank closes its gate, then waits
 * until no live peer announces a write into it. Both sides store, then
 * load (seq_cst), so every write either sees the gate closed or is waited
 * for. A closed gate means its owner failed: the writer stops pushing and
 * waits to hear why (the owner's abort), so that it fails too instead of
 * leaving its other peers with a partial output. */
static bool push(dctx *d, int i, uint64_t addr, const void *src, size_t len, uint64_t epoch,
                 dt_status *st) {
    dt__transport *tr = d->op->g->shm;
    _Atomic int32_t *mine = d->pi[d->t->me].pushing;
    atomic_store(mine, d->t->ranks[i] + 1);
    bool open = atomic_load(d->pi[i].gate) == epoch;
    if (open)
        *st = tr->ops->write_peer(tr, d->t->ranks[i], addr, src, len);
    atomic_store_explicit(mine, 0, memory_order_release);
    if (*st != DT_OK)
        dt__op_error(d->op, *st);
    return open;
}

/* Single copy replaces two copies through the windows, but each piece costs
 * a system call per peer. Measured break-even for the allgather (2 cores,
 * with a consumer reading the output): 16 KiB per rank at 2 ranks (1.5-2x
 * faster from there), ~128 KiB at 4. A fit to those two points:
 * DT_SHM_CMA_MIN (256 KiB by default) x (n-1)^2 / 16, and never above
 * DT_SHM_CMA_MIN itself. */
static bool ag_use_cma(const dctx *d, size_t block) {
    size_t peers = (size_t)d->t->n - 1, scaled = block * 16 / (peers * peers);
    return use_cma(d, scaled > block ? scaled : block);
}

static bool never(void *arg) {
    (void)arg;
    return false;
}

static dt_status close_gate(dctx *d, dt_status st) {
    dt_group *g = d->op->g;
    int me = d->t->me, self = d->t->ranks[me] + 1;
    atomic_store(d->pi[me].gate, 0);
    double until = dt_now() + g->cfg.timeout;
    for (int i = 0; i < d->t->n; i++) {
        if (i == me)
            continue;
        for (int spins = 0; atomic_load(d->pi[i].pushing) == self &&
                            !g->shm->ops->peer_dead(g->shm, d->t->ranks[i]) && dt_now() < until;
             spins++)
            spins < 1000 ? (void)sched_yield() : dt_sleep_ms(1);
    }
    return st;
}

dt_status dt__direct_allgather(dt__op *op, const dt__team *t, const void *send, void *recv,
                               size_t count) {
    dctx d;
    DT_CHECK(ctx_init(&d, op, t));
    dt_group *g = op->g;
    int n = t->n, me = t->me;
    size_t es = dt_dtype_size(op->dtype), cap = d.pi[me].window_size / es;
    const char *mine = send == recv ? (const char *)recv + (size_t)me * count * es : send;
    if (count * es <= DT__SMALL_BYTES) {
        const dt__small_line *l[MAX_LOCAL];
        DT_CHECK(small_exchange(&d, mine, count * es, l));
        for (int i = 0; i < n; i++)
            if (i != me || send != recv)
                memcpy((char *)recv + (size_t)i * count * es, l[i]->data, count * es);
        return DT_OK;
    }
    if (ag_use_cma(&d, count * es)) {
        /* Pieces interleaved: my own copy and the copies to or from each
         * peer alternate, in an order rotated by rank, instead of one long
         * memcpy followed by one long transfer (measured 1.3x faster for
         * 2 x 8 MiB: the ranks no longer run in lockstep through the same
         * phases, and each piece's destination is written while hot).
         * Small outputs are pulled, large ones pushed (DT_SHM_PUSH_MIN);
         * after the last barrier no peer touches my buffers, and a failed
         * push allgather closes its gate before it returns. */
        size_t bytes = count * es;
        bool pushing = bytes * (size_t)n >= d.pi[me].push_min;
        uint64_t epoch = g->direct_epoch + 1; /* the target of the first barrier */
        if (pushing)
            atomic_store(d.pi[me].gate, epoch);
        publish(&d, pushing ? recv : (void *)mine, NULL);
        dt_status st = barrier(&d);
        bool open = true;
        for (size_t off = 0; off < bytes && st == DT_OK && open; off += AG_PIECE) {
            size_t len = bytes - off < AG_PIECE ? bytes - off : AG_PIECE;
            for (int k = 0; k < n && st == DT_OK && open; k++) {
                int i = (me + k) % n;
                char *dst = (char *)recv + (size_t)i * bytes + off;
                size_t at = (size_t)me * bytes + off;
                if (i == me && send != recv)
                    memcpy(dst, mine + off, len);
                else if (i != me && pushing)
                    open = push(&d, i, peer_addr(&d, i, 0) + at, mine + off, len, epoch, &st);
                else if (i != me)
                    st = pull(&d, i, dst, peer_addr(&d, i, 0) + off, len);
            }
        }
        if (st == DT_OK && !open) /* that peer failed: wait to hear why */
            st = dt__wait_pred(op, never, NULL);
        if (st == DT_OK)
            st = barrier(&d);
        return st == DT_OK || !pushing ? st : close_gate(&d, st);
    }
    for (size_t base = 0; base < count; base += cap) {
        size_t c = count - base < cap ? count - base : cap;
        unsigned h = next_half(g);
        memcpy(win(&d, me, h), mine + base * es, c * es);
        DT_CHECK(barrier(&d));
        for (int i = 0; i < n; i++) {
            char *dst = (char *)recv + ((size_t)i * count + base) * es;
            if (i == me) {
                if (send != recv)
                    memcpy(dst, mine + base * es, c * es);
            } else {
                memcpy(dst, win(&d, i, h), c * es);
            }
        }
    }
    return DT_OK;
}

dt_status dt__direct_broadcast(dt__op *op, const dt__team *t, void *buf, size_t bytes, int root) {
    dctx d;
    DT_CHECK(ctx_init(&d, op, t));
    dt_group *g = op->g;
    size_t cap = d.pi[t->me].window_size;
    for (size_t base = 0; base < bytes; base += cap) {
        size_t c = bytes - base < cap ? bytes - base : cap;
        unsigned h = next_half(g);
        if (t->me == root)
            memcpy(win(&d, root, h), (char *)buf + base, c);
        DT_CHECK(barrier(&d));
        if (t->me != root)
            memcpy((char *)buf + base, win(&d, root, h), c);
    }
    return DT_OK;
}

/* A barrier with no data (used for dt_group_barrier on one host). */
dt_status dt__direct_barrier(dt__op *op, const dt__team *t) {
    dctx d;
    DT_CHECK(ctx_init(&d, op, t));
    return barrier(&d);
}
