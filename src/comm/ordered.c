/*
 * ordered.c — reductions whose bits depend only on the inputs and the
 * group size (DT_DETERMINISTIC=1, or DT_ALGO=ordered).
 *
 * The canonical result of element i over n ranks is the left fold in rank
 * order, rounded after every step as dt_reduce rounds:
 *
 *   r[i] = (...((x0[i] op x1[i]) op x2[i]) ... ) op x(n-1)[i]
 *
 * Nothing in it depends on which rank computes it, how the vector is cut
 * into blocks or chunks, or which route the data took, so any schedule that
 * evaluates exactly this expression gives the same bits. The direct
 * algorithm (direct.c) already does on a host whose ranks share memory;
 * this file does it with messages for every other layout:
 *
 *   four ranks, blocks A..D (rank r owns block r):
 *   1. every rank sends block b of its input to b's owner (all at once,
 *      rotated so that no owner is everyone's first target)
 *   2. owner r folds A0 op A1 op A2 op A3 (its own block, in rank order),
 *      piece by piece as the pieces arrive
 *   3. allgather of the folded blocks, every owner to every rank at once:
 *      copies, no arithmetic
 *
 * Each rank sends and receives (n-1)/n of the vector in step 1 and again in
 * step 3, like the ring; what it gives up is the ring's neighbour-only
 * traffic (every pair talks) and the pipelining of the reduction into the
 * next send. Reduce-scatter is steps 1 and 2.
 *
 * Operand roles are fixed as well as their order: the accumulator is always
 * dt_reduce's first input and the next rank's value its second, so even the
 * ops whose result depends on operand order for equal-comparing inputs (min
 * and max of +0 and -0) agree with direct.c's windows path.
 */
#include "comm_internal.h"

#include <stdlib.h>
#include <string.h>

typedef struct ordered_plan {
    dt__op *op;
    const dt__team *t;
    size_t es;
    size_t piece;                  /* elements per piece of my block */
    size_t npieces;                /* pieces of my block (0 when it is empty) */
    const size_t *counts, *displs; /* block b: counts[b] elements at displs[b] */
} ordered_plan;

static size_t pieces_of(size_t count, size_t piece) { return (count + piece - 1) / piece; }

/* Fold piece k of my block: out = x0 op x1 op ... op x(n-1), where xi is
 * rank i's piece, waiting for each peer's piece just before it is needed. */
static dt_status fold_piece(const ordered_plan *p, size_t k, char *const *in, dt__xfer *rx,
                            char *out) {
    const dt__team *t = p->t;
    size_t mine = p->counts[t->me], at = k * p->piece;
    size_t c = mine - at < p->piece ? mine - at : p->piece, off = at * p->es;
    for (int i = 0; i < t->n; i++) {
        if (i != t->me)
            DT_CHECK(dt__wait(p->op, &rx[(size_t)i * p->npieces + k]));
        if (i == 1)
            dt_reduce(out + off, in[0] + off, in[1] + off, c, p->op->dtype, p->op->redop);
        else if (i > 1)
            dt_reduce(out + off, out + off, in[i] + off, c, p->op->dtype, p->op->redop);
    }
    return DT_OK;
}

/* Steps 1 and 2: my block, folded in rank order, lands at out (which may be
 * my own block of send: in place). Returns once my sends are done too, so
 * the caller may overwrite send afterwards. */
static dt_status ordered_fold(ordered_plan *p, const char *send, char *out) {
    dt__op *op = p->op;
    const dt__team *t = p->t;
    int n = t->n, me = t->me;
    size_t es = p->es, mine = p->counts[me], bytes = mine * es;
    const char *own = send + p->displs[me] * es;
    p->piece = op->g->cfg.chunk / es ? op->g->cfg.chunk / es : 1;
    p->npieces = pieces_of(mine, p->piece);
    size_t nsend = 0;
    for (int b = 0; b < n; b++)
        if (b != me)
            nsend += pieces_of(p->counts[b], p->piece);
    /* Staging: one slot per rank (peers' pieces land there; mine is copied
     * into my slot only when out overlaps it, since the fold writes out
     * before it reads every input). */
    char *stage;
    DT_CHECK(dt__scratch(op->g, (size_t)n * bytes + 1, (void **)&stage));
    dt__xfer *rx = calloc((size_t)n * p->npieces + nsend + 1, sizeof *rx);
    char **in = malloc((size_t)n * sizeof *in);
    if (!rx || !in) {
        free(rx);
        free(in);
        return dt_error_set(DT_ERR_NOMEM, "ordered: out of memory for %d ranks", n);
    }
    dt__xfer *tx = rx + (size_t)n * p->npieces;
    dt_status st = DT_OK;
    for (int i = 0; i < n; i++)
        in[i] = stage + (size_t)i * bytes;
    if (own < out + bytes && out < own + bytes)
        memcpy(stage + (size_t)me * bytes, own, bytes);
    else
        in[me] = (char *)own;
    /* Step s: receive from the rank s to my left, send to the rank s to
     * my right, pieces of the two interleaved so both directions stream. */
    size_t nt = 0;
    for (int s = 1; s < n; s++) {
        int from = (me - s + n) % n, to = (me + s) % n;
        const char *blk = send + p->displs[to] * es;
        size_t sc = p->counts[to], ns = pieces_of(sc, p->piece);
        size_t most = ns > p->npieces ? ns : p->npieces;
        for (size_t k = 0; k < most; k++) {
            size_t at = k * p->piece;
            if (k < p->npieces) {
                size_t c = mine - at < p->piece ? mine - at : p->piece;
                DT_CHECK_GOTO(dt__post_recv(op, &rx[(size_t)from * p->npieces + k], t->ranks[from],
                                            in[from] + at * es, c * es),
                              st, done);
            }
            if (k < ns) {
                size_t c = sc - at < p->piece ? sc - at : p->piece;
                DT_CHECK_GOTO(dt__post_send(op, &tx[nt++], t->ranks[to], blk + at * es, c * es), st,
                              done);
            }
        }
    }
    for (size_t k = 0; k < p->npieces; k++)
        DT_CHECK_GOTO(fold_piece(p, k, in, rx, out), st, done);
    st = dt__waitall(op, tx, (int)nt);
done:
    free(rx);
    free(in);
    return st;
}

/* Step 3: every rank's folded block to every other rank, the same pattern
 * as steps 1 and 2 (no arithmetic, so any route gives the same bits; this
 * one has no store-and-forward chain). buf holds every block at displs. */
static dt_status allgather_pairwise(const ordered_plan *p, char *buf) {
    dt__op *op = p->op;
    const dt__team *t = p->t;
    int n = t->n, me = t->me;
    size_t es = p->es, mine = p->counts[me], total = 0;
    for (int b = 0; b < n; b++)
        total += pieces_of(p->counts[b], p->piece);
    total += (size_t)(n - 1) * pieces_of(mine, p->piece);
    dt__xfer *x = calloc(total + 1, sizeof *x);
    if (!x)
        return dt_error_set(DT_ERR_NOMEM, "ordered: out of memory for %d ranks", n);
    dt_status st = DT_OK;
    size_t nx = 0;
    const char *blk = buf + p->displs[me] * es;
    for (int s = 1; s < n && st == DT_OK; s++) {
        int from = (me - s + n) % n, to = (me + s) % n;
        size_t rc = p->counts[from], nr = pieces_of(rc, p->piece), ns = pieces_of(mine, p->piece);
        char *dst = buf + p->displs[from] * es;
        for (size_t k = 0; k < (nr > ns ? nr : ns) && st == DT_OK; k++) {
            size_t at = k * p->piece;
            if (k < nr)
                st = dt__post_recv(op, &x[nx++], t->ranks[from], dst + at * es,
                                   (rc - at < p->piece ? rc - at : p->piece) * es);
            if (k < ns && st == DT_OK)
                st = dt__post_send(op, &x[nx++], t->ranks[to], blk + at * es,
                                   (mine - at < p->piece ? mine - at : p->piece) * es);
        }
    }
    if (st == DT_OK)
        st = dt__waitall(op, x, (int)nx);
    free(x);
    return st;
}

dt_status dt__ordered_reduce_scatter(dt__op *op, const dt__team *t, const void *send, void *recv,
                                     size_t count) {
    size_t n = (size_t)t->n;
    size_t *counts = malloc(n * sizeof *counts), *displs = malloc(n * sizeof *displs);
    if (!counts || !displs) {
        free(counts);
        free(displs);
        return dt_error_set(DT_ERR_NOMEM, "ordered reduce_scatter: out of memory");
    }
    for (size_t b = 0; b < n; b++) {
        counts[b] = count;
        displs[b] = b * count;
    }
    ordered_plan p = {op, t, dt_dtype_size(op->dtype), 0, 0, counts, displs};
    char *out = (char *)recv + (send == recv ? (size_t)t->me * count * p.es : 0);
    dt_status st = ordered_fold(&p, send, out);
    free(counts);
    free(displs);
    return st;
}

dt_status dt__ordered_allreduce(dt__op *op, const dt__team *t, const void *send, void *recv,
                                size_t count) {
    size_t n = (size_t)t->n, es = dt_dtype_size(op->dtype);
    size_t *counts = malloc(n * sizeof *counts), *displs = malloc(n * sizeof *displs);
    if (!counts || !displs) {
        free(counts);
        free(displs);
        return dt_error_set(DT_ERR_NOMEM, "ordered allreduce: out of memory");
    }
    size_t off = 0;
    for (size_t b = 0; b < n; b++) {
        counts[b] = count / n + (b < count % n);
        displs[b] = off;
        off += counts[b];
    }
    ordered_plan p = {op, t, es, 0, 0, counts, displs};
    /* In place, my block of recv is my own input (ordered_fold copies it
     * first); the other blocks of recv are only written by the allgather,
     * after every send of step 1 has completed. */
    dt_status st = ordered_fold(&p, send, (char *)recv + displs[t->me] * es);
    if (st == DT_OK)
        st = allgather_pairwise(&p, recv);
    free(counts);
    free(displs);
    return st;
}
