/*
 * ring.c — ring reduce-scatter, allgather and allreduce, pipelined in
 * chunks.
 *
 * The buffer is cut into one block per rank (sizes differ by at most one
 * element). Reduce-scatter takes n-1 steps; at step s rank r sends block
 * (r-s-1) mod n to its right neighbour and receives block (r-s-2) mod n from
 * its left, reducing it into its own copy. Four ranks, blocks A..D, "+"
 * marks a partial sum:
 *
 *             rank 0     rank 1     rank 2     rank 3
 *   step 0   D ->       A ->       B ->       C ->       (send own block)
 *   step 1   C+ ->      D+ ->      A+ ->      B+ ->
 *   step 2   B+ ->      C+ ->      D+ ->      A+ ->
 *   result   A (all 4)  B          C          D
 *
 * Allgather then circulates the finished blocks the same way (n-1 steps),
 * so allreduce moves 2(n-1)/n of the buffer per rank: bandwidth optimal.
 *
 * Pipelining: each block is cut into DT_CHUNK_SIZE chunks. A chunk is
 * forwarded at step s+1 as soon as it has been received (and reduced) at
 * step s, so the steps overlap instead of waiting for whole blocks. Sends
 * and receives to a neighbour are posted in the same order on both sides,
 * which is all the transports need to match them (FIFO per peer).
 *
 * Every rank reduces a given element in the same order (the block travels
 * the same path), so all ranks end with bit-identical results.
 */
#include "comm_internal.h"

#include <stdlib.h>
#include <string.h>

typedef struct ring_plan {
    dt__op *op;
    const dt__team *t;
    int left, right;
    size_t es, chunk_elems;
    const size_t *counts, *displs;
    int max_chunks;
} ring_plan;

static int nchunks(const ring_plan *p, int blk) {
    size_t c = p->counts[blk];
    return c == 0 ? 1 : (int)((c + p->chunk_elems - 1) / p->chunk_elems);
}

static void chunk_range(const ring_plan *p, int blk, int c, size_t *off, size_t *len) {
    size_t start = (size_t)c * p->chunk_elems;
    size_t end = start + p->chunk_elems;
    if (end > p->counts[blk])
        end = p->counts[blk];
    if (start > end)
        start = end;
    *off = (p->displs[blk] + start) * p->es;
    *len = (end - start) * p->es;
}

static int mod(int a, int n) { return ((a % n) + n) % n; }

/* Post the receive of chunk c of block blk from the left neighbour: reduced
 * into dst (dst = in op payload, staged in tmp) when `in` is set, else stored
 * at dst. */
static dt_status post_chunk_recv(const ring_plan *p, dt__xfer *x, int blk, int c, char *dst,
                                 const char *in, char *tmp) {
    size_t off, len;
    chunk_range(p, blk, c, &off, &len);
    if (in)
        return dt__post_recv_reduce(p->op, x, p->left, tmp + off, len, dst + off, in + off);
    return dt__post_recv(p->op, x, p->left, dst + off, len);
}

/*
 * One pass of n-1 steps. Step s sends block sblk(s) and receives rblk(s),
 * with rblk(s) == sblk(s+1). With `in` non-NULL the received chunk is
 * reduced: dst = in op payload; otherwise it is stored at dst.
 * The first step's data comes from src0, later steps from dst.
 */
static dt_status ring_pass(ring_plan *p, int sfirst, const char *src0, char *dst, const char *in,
                           char *tmp) {
    const dt__team *t = p->t;
    int n = t->n, me = t->me, steps = n - 1;
    int C = p->max_chunks;
    dt_status st = DT_OK;
    dt__xfer *rx = malloc(2 * (size_t)C * sizeof *rx);
    dt__xfer *tx = malloc(2 * (size_t)C * sizeof *tx);
    bool *txl = calloc(2 * (size_t)C, sizeof *txl);
    if (!rx || !tx || !txl) {
        st = dt_error_set(DT_ERR_NOMEM, "ring: out of memory");
        goto out;
    }
#define SBLK(s) mod(me - (s)-sfirst, n)
#define RBLK(s) mod(me - (s)-sfirst - 1, n)
    size_t off, len;
    int sb = SBLK(0), rb = RBLK(0);
    for (int c = 0; c < nchunks(p, rb); c++)
        DT_CHECK_GOTO(post_chunk_recv(p, &rx[c], rb, c, dst, in, tmp), st, out);
    for (int c = 0; c < nchunks(p, sb); c++) {
        chunk_range(p, sb, c, &off, &len);
        DT_CHECK_GOTO(dt__post_send(p->op, &tx[c], p->right, src0 + off, len), st, out);
        txl[c] = true;
    }
    for (int s = 0; s < steps; s++) {
        int par = s & 1, nxt = par ^ 1;
        rb = RBLK(s);
        int nrb = nchunks(p, rb);
        int nnext = s + 1 < steps ? nchunks(p, RBLK(s + 1)) : 0;
        for (int c = 0; c < nrb; c++) {
            DT_CHECK_GOTO(dt__wait(p->op, &rx[par * C + c]), st, out);
            if (s + 1 >= steps)
                continue;
            /* forward the chunk just completed: step s+1 sends block rb */
            dt__xfer *x = &tx[nxt * C + c];
            if (txl[nxt * C + c])
                DT_CHECK_GOTO(dt__wait(p->op, x), st, out);
            chunk_range(p, rb, c, &off, &len);
            DT_CHECK_GOTO(dt__post_send(p->op, x, p->right, dst + off, len), st, out);
            txl[nxt * C + c] = true;
            if (c < nnext)
                DT_CHECK_GOTO(post_chunk_recv(p, &rx[nxt * C + c], RBLK(s + 1), c, dst, in, tmp),
                              st, out);
        }
        for (int c = nrb; c < nnext; c++) /* the next block has more chunks */
            DT_CHECK_GOTO(post_chunk_recv(p, &rx[nxt * C + c], RBLK(s + 1), c, dst, in, tmp), st,
                          out);
    }
#undef SBLK
#undef RBLK
    for (int i = 0; i < 2 * C; i++)
        if (txl[i])
            DT_CHECK_GOTO(dt__wait(p->op, &tx[i]), st, out);
out:
    free(rx);
    free(tx);
    free(txl);
    return st;
}

static void plan_init(ring_plan *p, dt__op *op, const dt__team *t, const size_t *counts,
                      const size_t *displs) {
    p->op = op;
    p->t = t;
    p->left = t->ranks[mod(t->me - 1, t->n)];
    p->right = t->ranks[mod(t->me + 1, t->n)];
    p->es = dt_dtype_size(op->dtype);
    p->chunk_elems = op->g->cfg.chunk / p->es;
    if (p->chunk_elems == 0)
        p->chunk_elems = 1;
    p->counts = counts;
    p->displs = displs;
    p->max_chunks = 1;
    for (int b = 0; b < t->n; b++)
        if (nchunks(p, b) > p->max_chunks)
            p->max_chunks = nchunks(p, b);
}

static size_t span(const dt__team *t, const size_t *counts, const size_t *displs) {
    size_t end = 0;
    for (int b = 0; b < t->n; b++)
        if (displs[b] + counts[b] > end)
            end = displs[b] + counts[b];
    return end;
}

/* Reduced blocks accumulate in `work` (a buffer with the layout of send);
 * block me ends there. */
static dt_status reduce_scatter_into(dt__op *op, const dt__team *t, const void *send, void *work,
                                     const size_t *counts, const size_t *displs) {
    ring_plan p;
    plan_init(&p, op, t, counts, displs);
    void *tmp;
    DT_CHECK(dt__scratch(op->g, span(t, counts, displs) * p.es, &tmp));
    return ring_pass(&p, 1, send, work, send, tmp);
}

dt_status dt__ring_reduce_scatter(dt__op *op, const dt__team *t, const void *send, void *recv,
                                  const size_t *counts, const size_t *displs) {
    size_t es = dt_dtype_size(op->dtype), total = span(t, counts, displs) * es;
    if (t->n == 1) {
        memmove(recv, (const char *)send + displs[0] * es, counts[0] * es);
        return DT_OK;
    }
    /* work holds partial blocks; tmp (the group scratch) the incoming chunks */
    char *work = dt_alloc(total);
    if (!work)
        return dt_error_set(DT_ERR_NOMEM, "ring: cannot allocate %zu bytes", total);
    dt_status st = reduce_scatter_into(op, t, send, work, counts, displs);
    if (st == DT_OK)
        memcpy(recv, work + displs[t->me] * es, counts[t->me] * es);
    dt_free(work);
    return st;
}

dt_status dt__ring_allgather(dt__op *op, const dt__team *t, void *buf, const size_t *counts,
                             const size_t *displs) {
    if (t->n == 1)
        return DT_OK;
    ring_plan p;
    plan_init(&p, op, t, counts, displs);
    return ring_pass(&p, 0, buf, buf, NULL, NULL);
}

static dt_status even_blocks(int n, size_t count, size_t **counts, size_t **displs) {
    *counts = malloc((size_t)n * sizeof **counts);
    *displs = malloc((size_t)n * sizeof **displs);
    if (!*counts || !*displs) {
        free(*counts);
        free(*displs);
        return dt_error_set(DT_ERR_NOMEM, "ring: out of memory");
    }
    size_t off = 0;
    for (int b = 0; b < n; b++) {
        (*counts)[b] = count / (size_t)n + ((size_t)b < count % (size_t)n);
        (*displs)[b] = off;
        off += (*counts)[b];
    }
    return DT_OK;
}

dt_status dt__ring_allreduce(dt__op *op, const dt__team *t, const void *send, void *recv,
                             size_t count) {
    size_t es = dt_dtype_size(op->dtype);
    if (t->n == 1) {
        if (send != recv)
            memcpy(recv, send, count * es);
        return DT_OK;
    }
    size_t *counts, *displs;
    DT_CHECK(even_blocks(t->n, count, &counts, &displs));
    /* recv doubles as the work buffer: block b of recv is only written
     * after block b of send was last read (in place is fine too) */
    dt_status st = reduce_scatter_into(op, t, send, recv, counts, displs);
    if (st == DT_OK)
        st = dt__ring_allgather(op, t, recv, counts, displs);
    free(counts);
    free(displs);
    return st;
}
