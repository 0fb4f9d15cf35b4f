/*
 * native.c — dtrain's own backend: each collective asks tune.c for an
 * algorithm and runs it over the group's transports. Operations without a
 * choice (gather, scatter, alltoall, send/recv, barrier off-host) have one
 * linear schedule here: post everything, then wait; the transports move
 * data to all peers at once.
 *
 * Agreement. Every collective returns DT_OK on a rank only if every rank of
 * the group called it with the same descriptor (op, dtype, reduction,
 * count, root, sequence number); otherwise every rank gets DT_ERR_MISMATCH
 * from that very call. Every message carries its sender's descriptor and
 * the receiver compares it with its own before it takes the payload
 * (wire.c), so a rank that completes has checked, link by link, a chain of
 * descriptors from every rank whose data its result depends on. Where
 * every rank's result depends on every rank's input (allreduce,
 * reduce-scatter, allgather, alltoall, barrier, and the direct algorithm,
 * whose first barrier compares all descriptors), that already is the whole
 * agreement: no rank can finish while one disagrees, and the one that sees
 * the disagreement tells the others (group.c fail_group). Nothing is added to
 * their hot path.
 *
 * Rooted operations over messages are different: a root that only sends,
 * or a rank that only sends to it, hears nobody, and ranks that disagree
 * on the root wait for each other until DT_TIMEOUT. The tree broadcast
 * carries the agreement itself (header-only messages between the pairs of
 * recursive doubling, tree.c: the latency of the tree alone). Reduce,
 * gather and scatter, and every call with count 0 (which moves no data),
 * agree first (agree(): the direct barrier on one host, else a
 * dissemination barrier of header-only messages, log2 n rounds; ~1-3 us
 * on shared memory, ~10-30 us over TCP on this 2-core machine).
 *
 * Deadlock-free detection: in every schedule a rank sends to a rank before
 * it waits for it (or the wait is for a rank that sends to it first), so
 * ranks in different calls that wait for each other find the other's
 * descriptor queued; on shared memory, where the direct algorithm waits on
 * flags instead, the waiters also publish their call (shm.c).
 */
#include "backend.h"

#include <stdlib.h>
#include <string.h>

static size_t esz(const dt__op *op) { return dt_dtype_size(op->dtype); }

/* The dissemination barrier: after round k every rank has heard, through
 * checked descriptors, from 2^(k+1) ranks; a round's message is sent only
 * after the previous round's arrived and matched. */
static dt_status dissemination(dt__op *op) {
    dt_group *g = op->g;
    for (int d = 1; d < g->size; d *= 2) {
        int to = (g->rank + d) % g->size, from = (g->rank - d + g->size) % g->size;
        DT_CHECK(dt__sendrecv(op, to, NULL, 0, from, NULL, 0));
    }
    return DT_OK;
}

/* Every rank confirms that every other called this operation with the
 * same descriptor (see the top of the file); DT_ERR_MISMATCH otherwise. */
static dt_status agree(dt__op *op) {
    dt_group *g = op->g;
    if (g->size == 1)
        return DT_OK;
    dt__team all;
    dt__team_all(g, &all, NULL);
    if (dt__team_shared(op, &all))
        return dt__direct_barrier(op, &all);
    return dissemination(op);
}

static dt_status nat_allreduce(dt__op *op) {
    dt_group *g = op->g;
    size_t bytes = op->count * esz(op);
    if (op->count == 0)
        return agree(op);
    if (g->size == 1) {
        if (op->send != op->recv)
            memcpy(op->recv, op->send, bytes);
        return DT_OK;
    }
    dt__team all;
    dt__team_all(g, &all, NULL);
    op->algo = dt__tune_choose(g, DT_COLL_ALLREDUCE, bytes);
    switch (op->algo) {
    case DT_ALGO_DIRECT: return dt__direct_allreduce(op, &all, op->send, op->recv, op->count);
    case DT_ALGO_HIER: return dt__hier_allreduce(op, op->send, op->recv, op->count);
    case DT_ALGO_TORUS2D: return dt__torus2d_allreduce(op, op->send, op->recv, op->count);
    case DT_ALGO_ORDERED: return dt__ordered_allreduce(op, &all, op->send, op->recv, op->count);
    case DT_ALGO_RHD: return dt__rhd_allreduce(op, &all, op->send, op->recv, op->count);
    case DT_ALGO_TREE:
        DT_CHECK(dt__tree_reduce(op, &all, op->send, op->recv, op->count, 0));
        return dt__tree_broadcast(op, &all, op->recv, bytes, 0, false);
    default:
        op->algo = DT_ALGO_RING;
        return dt__ring_allreduce(op, &all, op->send, op->recv, op->count);
    }
}

static dt_status nat_reduce_scatter(dt__op *op) {
    dt_group *g = op->g;
    size_t es = esz(op), n = (size_t)g->size;
    if (op->count == 0)
        return agree(op);
    if (g->size == 1) {
        if (op->send != op->recv)
            memcpy(op->recv, op->send, op->count * es);
        return DT_OK;
    }
    dt__team all;
    dt__team_all(g, &all, NULL);
    op->algo = dt__tune_choose(g, DT_COLL_REDUCE_SCATTER, op->count * es * n);
    if (op->algo == DT_ALGO_DIRECT)
        return dt__direct_reduce_scatter(op, &all, op->send, op->recv, op->count);
    if (op->algo == DT_ALGO_ORDERED)
        return dt__ordered_reduce_scatter(op, &all, op->send, op->recv, op->count);
    op->algo = DT_ALGO_RING;
    size_t *counts = malloc(n * sizeof *counts), *displs = malloc(n * sizeof *displs);
    if (!counts || !displs) {
        free(counts);
        free(displs);
        return dt_error_set(DT_ERR_NOMEM, "reduce_scatter: out of memory");
    }
    for (size_t b = 0; b < n; b++) {
        counts[b] = op->count;
        displs[b] = b * op->count;
    }
    char *out = (char *)op->recv + (op->send == op->recv ? (size_t)g->rank * op->count * es : 0);
    dt_status st = dt__ring_reduce_scatter(op, &all, op->send, out, counts, displs);
    free(counts);
    free(displs);
    return st;
}

static dt_status nat_allgather(dt__op *op) {
    dt_group *g = op->g;
    size_t es = esz(op), n = (size_t)g->size;
    if (op->count == 0)
        return agree(op);
    char *mine = (char *)op->recv + (size_t)g->rank * op->count * es;
    if (g->size == 1) {
        if (op->send != op->recv)
            memcpy(op->recv, op->send, op->count * es);
        return DT_OK;
    }
    dt__team all;
    dt__team_all(g, &all, NULL);
    op->algo = dt__tune_choose(g, DT_COLL_ALLGATHER, op->count * es * n);
    if (op->algo == DT_ALGO_DIRECT)
        return dt__direct_allgather(op, &all, op->send, op->recv, op->count);
    if (op->algo == DT_ALGO_RHD && (g->size & (g->size - 1)) == 0)
        return dt__rhd_allgather(op, &all, op->send == op->recv ? mine : op->send, op->recv,
                                 op->count * es);
    op->algo = DT_ALGO_RING; /* also rhd at a size that is not a power of two */
    if (op->send != op->recv)
        memcpy(mine, op->send, op->count * es);
    size_t *counts = malloc(n * sizeof *counts), *displs = malloc(n * sizeof *displs);
    if (!counts || !displs) {
        free(counts);
        free(displs);
        return dt_error_set(DT_ERR_NOMEM, "allgather: out of memory");
    }
    for (size_t b = 0; b < n; b++) {
        counts[b] = op->count;
        displs[b] = b * op->count;
    }
    dt_status st = dt__ring_allgather(op, &all, op->recv, counts, displs);
    free(counts);
    free(displs);
    return st;
}

static dt_status nat_broadcast(dt__op *op) {
    dt_group *g = op->g;
    size_t bytes = op->count * esz(op);
    if (op->count == 0 || g->size == 1)
        return agree(op);
    dt__team all;
    dt__team_all(g, &all, NULL);
    op->algo = dt__tune_choose(g, DT_COLL_BROADCAST, bytes);
    if (op->algo == DT_ALGO_DIRECT) /* its first barrier compares every descriptor */
        return dt__direct_broadcast(op, &all, op->recv, bytes, op->root);
    op->algo = DT_ALGO_TREE; /* which carries the agreement (tree.c) */
    return dt__tree_broadcast(op, &all, op->recv, bytes, op->root, true);
}

static dt_status nat_reduce(dt__op *op) {
    dt_group *g = op->g;
    if (op->count == 0)
        return agree(op);
    if (g->size == 1) {
        if (op->send != op->recv)
            memcpy(op->recv, op->send, op->count * esz(op));
        return DT_OK;
    }
    dt__team all;
    dt__team_all(g, &all, NULL);
    op->algo = DT_ALGO_TREE;
    DT_CHECK(agree(op));
    return dt__tree_reduce(op, &all, op->send, op->recv, op->count, op->root);
}

/* The root's side of scatter (sends from `in`) and gather (receives into
 * `out`; exactly one of the two is set): one transfer of blk bytes with every
 * other rank, rank r's block at offset r * blk. */
static dt_status root_exchange(dt__op *op, const char *in, char *out, size_t blk) {
    dt_group *g = op->g;
    if (g->size == 1)
        return DT_OK;
    dt__xfer *xs = malloc((size_t)g->size * sizeof *xs);
    if (!xs)
        return dt_error_set(DT_ERR_NOMEM, "%s: out of memory", in ? "scatter" : "gather");
    dt_status st = DT_OK;
    int n = 0;
    for (int r = 0; r < g->size && st == DT_OK; r++) {
        if (r == g->rank)
            continue;
        size_t o = (size_t)r * blk;
        st = in ? dt__post_send(op, &xs[n++], r, in + o, blk)
                : dt__post_recv(op, &xs[n++], r, out + o, blk);
    }
    if (st == DT_OK)
        st = dt__waitall(op, xs, n);
    free(xs);
    return st;
}

static dt_status nat_gather(dt__op *op) {
    dt_group *g = op->g;
    size_t blk = op->count * esz(op);
    DT_CHECK(agree(op));
    if (op->count == 0)
        return DT_OK;
    if (g->rank != op->root) {
        dt__xfer x;
        DT_CHECK(dt__post_send(op, &x, op->root, op->send, blk));
        return dt__wait(op, &x);
    }
    char *out = op->recv;
    if (op->send != op->recv)
        memcpy(out + (size_t)g->rank * blk, op->send, blk);
    return root_exchange(op, NULL, out, blk);
}

static dt_status nat_scatter(dt__op *op) {
    dt_group *g = op->g;
    size_t blk = op->count * esz(op);
    DT_CHECK(agree(op));
    if (op->count == 0)
        return DT_OK;
    if (g->rank != op->root) {
        dt__xfer x;
        DT_CHECK(dt__post_recv(op, &x, op->root, op->recv, blk));
        return dt__wait(op, &x);
    }
    const char *in = op->send;
    if (op->send != op->recv)
        memcpy(op->recv, in + (size_t)g->rank * blk, blk);
    return root_exchange(op, in, NULL, blk);
}

static dt_status nat_alltoall(dt__op *op) {
    dt_group *g = op->g;
    size_t blk = op->count * esz(op), n = (size_t)g->size;
    if (op->count == 0)
        return agree(op);
    const char *in = op->send;
    char *out = op->recv;
    if (op->send == op->recv) { /* in place: work from a copy of the input */
        void *copy;
        DT_CHECK(dt__scratch(g, n * blk, &copy));
        memcpy(copy, in, n * blk);
        in = copy;
    } else {
        memcpy(out + (size_t)g->rank * blk, in + (size_t)g->rank * blk, blk);
    }
    if (n == 1)
        return DT_OK;
    dt__xfer *xs = malloc(2 * n * sizeof *xs);
    if (!xs)
        return dt_error_set(DT_ERR_NOMEM, "alltoall: out of memory");
    dt_status st = DT_OK;
    int k = 0;
    /* pairwise order: step s talks to rank+s and rank-s, so no rank is the
     * target of everyone at once */
    for (size_t s = 1; s < n && st == DT_OK; s++) {
        size_t from = ((size_t)g->rank + n - s) % n;
        st = dt__post_recv(op, &xs[k++], (int)from, out + from * blk, blk);
    }
    for (size_t s = 1; s < n && st == DT_OK; s++) {
        size_t to = ((size_t)g->rank + s) % n;
        st = dt__post_send(op, &xs[k++], (int)to, in + to * blk, blk);
    }
    if (st == DT_OK)
        st = dt__waitall(op, xs, k);
    if (op->send == op->recv && st == DT_OK)
        memcpy(out + (size_t)g->rank * blk, in + (size_t)g->rank * blk, blk);
    free(xs);
    return st;
}

static dt_status nat_barrier(dt__op *op) {
    dt_group *g = op->g;
    if (g->size == 1)
        return DT_OK;
    dt__team all;
    dt__team_all(g, &all, NULL);
    op->algo = dt__tune_choose(g, DT_COLL_BARRIER, 0);
    if (op->algo == DT_ALGO_DIRECT)
        return dt__direct_barrier(op, &all);
    return dissemination(op);
}

static dt_status nat_send(dt__op *op) {
    dt__xfer x;
    DT_CHECK(dt__post_send(op, &x, op->root, op->send, op->count * esz(op)));
    return dt__wait(op, &x);
}

static dt_status nat_recv(dt__op *op) {
    dt__xfer x;
    DT_CHECK(dt__post_recv(op, &x, op->root, op->recv, op->count * esz(op)));
    return dt__wait(op, &x);
}

/* A batch: post every receive, then every send, then wait for all. */
static dt_status nat_batch(dt__op *op) {
    size_t n = op->count;
    if (n == 0)
        return DT_OK;
    dt__xfer *xs = malloc(n * sizeof *xs);
    if (!xs)
        return dt_error_set(DT_ERR_NOMEM, "sendrecv_batch: %zu transfers", n);
    dt_status st = DT_OK;
    int posted = 0;
    for (int pass = 0; pass < 2 && st == DT_OK; pass++)
        for (size_t i = 0; i < n && st == DT_OK; i++)
            if (op->items[i].p.send == (pass == 1))
                st = dt__post_item(op, &xs[posted++], &op->items[i]);
    if (st == DT_OK)
        st = dt__waitall(op, xs, posted);
    free(xs);
    return st;
}

const dt__backend dt__backend_native = {
    .name = "native",
    .api_version = DT__BACKEND_API,
    .init = NULL,
    .fini = NULL,
    .run =
        {
            [DT_COLL_ALLREDUCE] = nat_allreduce,
            [DT_COLL_REDUCE_SCATTER] = nat_reduce_scatter,
            [DT_COLL_ALLGATHER] = nat_allgather,
            [DT_COLL_BROADCAST] = nat_broadcast,
            [DT_COLL_REDUCE] = nat_reduce,
            [DT_COLL_GATHER] = nat_gather,
            [DT_COLL_SCATTER] = nat_scatter,
            [DT_COLL_ALLTOALL] = nat_alltoall,
            [DT_COLL_BARRIER] = nat_barrier,
            [DT_COLL_SEND] = nat_send,
            [DT_COLL_RECV] = nat_recv,
            [DT_COLL_BATCH] = nat_batch,
        },
    .avg_native = false,
};
