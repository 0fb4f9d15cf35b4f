/*
 * rhd.c — allreduce by recursive halving-doubling (Rabenseifner) for large
 * vectors and recursive doubling for small ones, for any rank count.
 *
 * Non-power-of-two: with p2 the largest power of two <= n and rem = n - p2,
 * the first 2*rem ranks pair up first; each even one hands its vector to
 * its odd neighbour and sits out, so p2 ranks remain (the "virtual" ranks);
 * at the end the odd ones hand the result back. For four ranks (no
 * pre-step), vector cut in blocks 0..3:
 *
 *   halving (reduce-scatter)       doubling (allgather)
 *   d=2: 0<->2, 1<->3 swap halves  d=1: 0<->1, 2<->3 swap quarters
 *   d=1: 0<->1, 2<->3 swap quarters d=2: 0<->2, 1<->3 swap halves
 *   virtual rank v owns block v    everyone owns everything
 *
 * That is log2(p2) steps each way and 2(p2-1)/p2 of the vector moved: as
 * little as the ring, in log instead of linear latency. Below p2 elements,
 * or when DT says the message is small, recursive doubling exchanges the
 * whole vector log2(p2) times instead (latency-optimal). Both partners of a
 * step compute a op b with the same operands, so results are bit-identical
 * on every rank.
 *
 * dt__rhd_allgather is the doubling half on its own, for a power-of-two
 * team: at step d (1, 2, 4, ...) rank r swaps the d blocks it holds (an
 * aligned run, so one contiguous range) with rank r ^ d. Every block moves
 * log2(n) times at most instead of being forwarded through n-1 ranks. Each
 * step's exchange is cut into pieces and the receive and send of each piece
 * are posted together, so both directions of the pair stream at once.
 */
#include "comm_internal.h"

#include <stdlib.h>
#include <string.h>

/* group rank of virtual rank v */
static int real_rank(const dt__team *t, int v, int rem) {
    int i = v < rem ? 2 * v + 1 : v + rem;
    return t->ranks[i];
}

/* One exchange with `peer`: slen bytes from sbuf out, rlen into rbuf, cut
 * into pieces of at least DT_CHUNK_SIZE (at most MAX_PIECES per direction),
 * the receive and send of each piece posted side by side so the transport
 * moves both directions at once. With red_out set, each received piece
 * (staged at rbuf) is reduced as it lands: red_out = red_in op piece (a
 * piece is whole elements). While the sockets work, copy_len bytes are
 * copied from copy_src to copy_dst. Returns when all of it is done. */
#define MAX_PIECES 16
static dt_status exchange(dt__op *op, int peer, const char *sbuf, size_t slen, char *rbuf,
                          size_t rlen, char *red_out, const char *red_in, const void *copy_src,
                          void *copy_dst, size_t copy_len) {
    size_t es = dt_dtype_size(op->dtype);
    size_t big = slen > rlen ? slen : rlen, piece = op->g->cfg.chunk;
    if (piece * MAX_PIECES < big)
        piece = (big + MAX_PIECES - 1) / MAX_PIECES;
    piece = (piece + es - 1) / es * es;
    dt__xfer *x = malloc(2 * MAX_PIECES * sizeof *x);
    if (!x)
        return dt_error_set(DT_ERR_NOMEM, "rhd: out of memory");
    int nx = 0;
    dt_status st = DT_OK;
    for (size_t off = 0; off < big && st == DT_OK; off += piece) {
        if (off < rlen) {
            size_t len = rlen - off < piece ? rlen - off : piece;
            st = red_out ? dt__post_recv_reduce(op, &x[nx++], peer, rbuf + off, len, red_out + off,
                                                red_in + off)
                         : dt__post_recv(op, &x[nx++], peer, rbuf + off, len);
        }
        if (st == DT_OK && off < slen)
            st = dt__post_send(op, &x[nx++], peer, sbuf + off,
                               slen - off < piece ? slen - off : piece);
    }
    if (st == DT_OK && copy_len)
        memcpy(copy_dst, copy_src, copy_len);
    if (st == DT_OK)
        st = dt__waitall(op, x, nx);
    free(x);
    return st;
}

dt_status dt__rhd_allreduce(dt__op *op, const dt__team *t, const void *send, void *recv,
                            size_t count) {
    size_t es = dt_dtype_size(op->dtype), bytes = count * es;
    char *buf = recv;
    if (t->n == 1) {
        if (send != recv)
            memcpy(recv, send, bytes);
        return DT_OK;
    }
    /* Where my partial result lives: `send` until the first step writes it
     * to buf (reducing send + incoming into buf), buf after. Out of place
     * this saves copying send into recv first, a pass over the whole vector
     * that costs as much as a third of the socket traffic. */
    const char *src = send;
    int n = t->n, me = t->me;
    int p2 = 1;
    while (p2 * 2 <= n)
        p2 *= 2;
    int rem = n - p2;
    char *tmp;
    DT_CHECK(dt__scratch(op->g, bytes ? bytes : 1, (void **)&tmp));

    int v; /* my virtual rank, -1 while sitting out */
    if (me < 2 * rem) {
        if (me % 2 == 0) {
            DT_CHECK(dt__sendrecv(op, t->ranks[me + 1], src, bytes, -1, NULL, 0));
            v = -1;
        } else {
            dt__xfer x;
            DT_CHECK(dt__post_recv_reduce(op, &x, t->ranks[me - 1], tmp, bytes, buf, src));
            DT_CHECK(dt__wait(op, &x));
            src = buf;
            v = me / 2;
        }
    } else {
        v = me - rem;
    }

    if (v >= 0) {
        bool halving = count >= (size_t)p2 && bytes >= op->g->cfg.chunk / 4;
        if (!halving) {
            for (int d = 1; d < p2; d *= 2) {
                int peer = real_rank(t, v ^ d, rem);
                /* buf is being sent while the partner's copy arrives, so
                 * land it in tmp and reduce after both are done */
                DT_CHECK(dt__sendrecv(op, peer, src, bytes, peer, tmp, bytes));
                dt_reduce(buf, src, tmp, count, op->dtype, op->redop);
                src = buf;
            }
        } else {
            size_t *cnt = malloc((size_t)p2 * sizeof *cnt), *dsp = malloc((size_t)p2 * sizeof *dsp);
            if (!cnt || !dsp) {
                free(cnt);
                free(dsp);
                return dt_error_set(DT_ERR_NOMEM, "rhd: out of memory");
            }
            size_t off = 0;
            for (int b = 0; b < p2; b++) {
                cnt[b] = count / (size_t)p2 + ((size_t)b < count % (size_t)p2);
                dsp[b] = off;
                off += cnt[b];
            }
#define RANGE_OFF(lo)     (dsp[lo] * es)
#define RANGE_LEN(lo, hi) ((dsp[(hi)-1] + cnt[(hi)-1] - dsp[lo]) * es)
            int lo = 0, hi = p2;
            dt_status st = DT_OK;
            for (int d = p2 / 2; d >= 1 && st == DT_OK; d /= 2) {
                int peer = real_rank(t, v ^ d, rem), mid = (lo + hi) / 2;
                int klo = (v & d) ? mid : lo, khi = (v & d) ? hi : mid;
                int slo = (v & d) ? lo : mid, shi = (v & d) ? mid : hi;
                st = exchange(op, peer, src + RANGE_OFF(slo), RANGE_LEN(slo, shi), tmp,
                              RANGE_LEN(klo, khi), buf + RANGE_OFF(klo), src + RANGE_OFF(klo), NULL,
                              NULL, 0);
                src = buf; /* the range kept from now on is in buf */
                lo = klo;
                hi = khi;
            }
            for (int d = 1; d < p2 && st == DT_OK; d *= 2) {
                int peer = real_rank(t, v ^ d, rem), w = hi - lo;
                int plo = (v & d) ? lo - w : hi, phi = plo + w;
                st = exchange(op, peer, buf + RANGE_OFF(lo), RANGE_LEN(lo, hi),
                              buf + RANGE_OFF(plo), RANGE_LEN(plo, phi), NULL, NULL, NULL, NULL, 0);
                if (plo < lo)
                    lo = plo;
                else
                    hi = phi;
            }
#undef RANGE_OFF
#undef RANGE_LEN
            free(cnt);
            free(dsp);
            DT_CHECK(st);
        }
    }

    if (me < 2 * rem) {
        if (me % 2 == 0)
            DT_CHECK(dt__sendrecv(op, -1, NULL, 0, t->ranks[me + 1], buf, bytes));
        else
            DT_CHECK(dt__sendrecv(op, t->ranks[me - 1], buf, bytes, -1, NULL, 0));
    }
    return DT_OK;
}

/* Pipelined recursive-doubling allgather. Step k (d = 2^k) pairs rank r
 * with r ^ d, and r sends the d blocks it holds in the order
 *
 *   seq(r, 0) = [r]
 *   seq(r, k) = [r] ++ seq(r^1, 0) ++ seq(r^2, 1) ++ ... ++ seq(r^(d/2), k-1)
 *
 * (its own block, then what it received at steps 0, 1, ..., each in the
 * order its sender sent it), so the receiver knows which block each piece
 * is. Every receive is posted at the start, and a send is posted as soon as
 * the piece it forwards has arrived: own blocks leave at once for every
 * step, and a block received at step j is passed on at later steps piece by
 * piece instead of after the whole step. The steps overlap (no barrier
 * between them) and a forwarded piece is sent while it is still in cache.
 * Per pair there is one step's traffic only, posted in the same order on
 * both sides, which is all a transport's FIFO matching needs. */
#define AG_MAX_XFERS 1024 /* bounds the pieces per block on large teams */

typedef struct ag_send {
    int step, block, part;
} ag_send;

typedef struct ag_state {
    dt__op *op;
    const dt__team *t;
    int steps, nparts;
    size_t block, piece;
    const char *mine;
    char *buf;
    dt__xfer *x;    /* receives, then sends as they are posted */
    int nx;         /* xfers posted */
    int *recv_of;   /* [block * nparts + part] -> receive xfer, -1: my own block */
    ag_send *sends; /* each step's sends in posting order, step after step */
    int *first;     /* [steps + 1] index of each step's first send */
    int *cursor;    /* [steps] next send of the step to post */
} ag_state;

/* out[] = seq(r, k), 2^k block indices; returns how many. */
static int ag_seq(int r, int k, int *out) {
    int n = 0;
    out[n++] = r;
    for (int j = 0; j < k; j++)
        n += ag_seq(r ^ (1 << j), j, out + n);
    return n;
}

static size_t ag_len(const ag_state *s, int part) {
    size_t off = (size_t)part * s->piece;
    return s->block - off < s->piece ? s->block - off : s->piece;
}

static bool ag_here(const ag_state *s, const ag_send *a) {
    int r = s->recv_of[a->block * s->nparts + a->part];
    return r < 0 || s->x[r].done;
}

static bool ag_done(const ag_state *s) {
    for (int k = 0; k < s->steps; k++)
        if (s->cursor[k] < s->first[k + 1])
            return false;
    for (int i = 0; i < s->nx; i++)
        if (!s->x[i].done)
            return false;
    return true;
}

/* Something to post, or everything done. */
static bool ag_wake(void *arg) {
    ag_state *s = arg;
    for (int k = 0; k < s->steps; k++)
        if (s->cursor[k] < s->first[k + 1] && ag_here(s, &s->sends[s->cursor[k]]))
            return true;
    return ag_done(s);
}

/* Post every send whose piece is here, each step in its order. */
static dt_status ag_post(ag_state *s) {
    for (int k = 0; k < s->steps; k++)
        for (; s->cursor[k] < s->first[k + 1]; s->cursor[k]++) {
            const ag_send *a = &s->sends[s->cursor[k]];
            if (!ag_here(s, a))
                break;
            size_t off = (size_t)a->part * s->piece;
            const char *src = a->block == s->t->me ? s->mine : s->buf + (size_t)a->block * s->block;
            int peer = s->t->ranks[s->t->me ^ (1 << a->step)];
            DT_CHECK(dt__post_send(s->op, &s->x[s->nx++], peer, src + off, ag_len(s, a->part)));
        }
    return DT_OK;
}

dt_status dt__rhd_allgather(dt__op *op, const dt__team *t, const void *mine, void *buf,
                            size_t block) {
    int n = t->n, me = t->me;
    DT_ASSERT((n & (n - 1)) == 0);
    char *b = buf, *own = b + (size_t)me * block;
    if (n == 1) {
        if (mine != own)
            memcpy(own, mine, block);
        return DT_OK;
    }
    ag_state s = {.op = op, .t = t, .block = block, .mine = mine, .buf = b};
    while ((1 << s.steps) < n)
        s.steps++;
    /* pieces of >= DT_CHUNK_SIZE, at most 16 a block and AG_MAX_XFERS in all
     * (2 (n-1) transfers per piece index) */
    size_t piece = op->g->cfg.chunk, most = AG_MAX_XFERS / (2 * (size_t)(n - 1));
    if (most > 16)
        most = 16;
    if (most < 1)
        most = 1;
    if (piece * most < block)
        piece = (block + most - 1) / most;
    s.piece = piece;
    s.nparts = (int)((block + piece - 1) / piece);
    int total = 2 * (n - 1) * s.nparts;
    s.x = malloc((size_t)total * sizeof *s.x);
    s.recv_of = malloc((size_t)n * (size_t)s.nparts * sizeof *s.recv_of);
    s.sends = malloc((size_t)(n - 1) * (size_t)s.nparts * sizeof *s.sends);
    s.first = malloc((size_t)(s.steps + 1) * sizeof *s.first);
    s.cursor = malloc((size_t)s.steps * sizeof *s.cursor);
    int *seq = malloc((size_t)n * sizeof *seq);
    dt_status st = DT_OK;
    if (!s.x || !s.recv_of || !s.sends || !s.first || !s.cursor || !seq) {
        st = dt_error_set(DT_ERR_NOMEM, "allgather: out of memory");
        goto out;
    }
    for (int i = 0; i < n * s.nparts; i++)
        s.recv_of[i] = -1;
    int ns = 0;
    for (int k = 0; k < s.steps && st == DT_OK; k++) {
        /* what the partner sends me at this step, in its order */
        int peer = me ^ (1 << k), m = ag_seq(peer, k, seq);
        for (int i = 0; i < m && st == DT_OK; i++)
            for (int p = 0; p < s.nparts && st == DT_OK; p++) {
                s.recv_of[seq[i] * s.nparts + p] = s.nx;
                st = dt__post_recv(op, &s.x[s.nx++], t->ranks[peer],
                                   b + (size_t)seq[i] * block + (size_t)p * piece, ag_len(&s, p));
            }
        /* what I send, in my order */
        s.first[k] = ns;
        s.cursor[k] = ns;
        m = ag_seq(me, k, seq);
        for (int i = 0; i < m; i++)
            for (int p = 0; p < s.nparts; p++)
                s.sends[ns++] = (ag_send){k, seq[i], p};
    }
    s.first[s.steps] = ns;
    if (st == DT_OK)
        st = ag_post(&s);
    if (st == DT_OK && mine != own)
        memcpy(own, mine, block); /* while the first pieces are on their way */
    while (st == DT_OK && !ag_done(&s)) {
        st = dt__wait_pred(op, ag_wake, &s);
        if (st == DT_OK)
            st = ag_post(&s);
    }
out:
    free(s.x);
    free(s.recv_of);
    free(s.sends);
    free(s.first);
    free(s.cursor);
    free(seq);
    return st;
}
