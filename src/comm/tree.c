/*
 * tree.c — binomial-tree broadcast (pipelined in chunks) and reduce.
 *
 * Ranks are renumbered relative to the root (v = (r - root) mod n). In a
 * binomial tree v's parent is v minus its lowest set bit, and its children
 * are v + 2^k for every 2^k below that bit. Eight ranks, root 0:
 *
 *        0
 *      / | \
 *     4  2  1          broadcast: a chunk flows down; reduce: partial
 *    /|  |             results flow up, each rank combining its children
 *   6 5  3             in a fixed order (bit-identical on reruns)
 *   |
 *   7
 *
 * Depth is ceil(log2 n). Broadcast cuts the buffer into DT_CHUNK_SIZE
 * chunks so that a chunk moves down one level while the next arrives.
 */
#include "comm_internal.h"

#include <stdlib.h>
#include <string.h>

static int lowbit_mask(int v, int n) {
    int mask = 1;
    while (mask < n && !(v & mask))
        mask <<= 1;
    return mask; /* >= n for the root */
}

dt_status dt__tree_broadcast(dt__op *op, const dt__team *t, void *buf, size_t bytes, int root) {
    int n = t->n;
    if (n == 1)
        return DT_OK;
    int v = (t->me - root + n) % n;
    int mask = lowbit_mask(v, n);
    int parent = v ? t->ranks[(v - mask + root) % n] : -1;
    int children[32], nc = 0;
    for (int m = mask >> 1; m > 0; m >>= 1)
        if (v + m < n)
            children[nc++] = t->ranks[(v + m + root) % n];
    size_t chunk = op->g->cfg.chunk;
    size_t nch = bytes == 0 ? 1 : (bytes + chunk - 1) / chunk;
    dt__xfer *rx = parent >= 0 ? malloc(nch * sizeof *rx) : NULL;
    dt__xfer *tx = nc ? malloc(nch * (size_t)nc * sizeof *tx) : NULL;
    dt_status st = DT_OK;
    if ((parent >= 0 && !rx) || (nc && !tx)) {
        st = dt_error_set(DT_ERR_NOMEM, "tree: out of memory");
        goto out;
    }
    char *p = buf;
    if (parent >= 0)
        for (size_t c = 0; c < nch; c++) {
            size_t off = c * chunk, len = bytes - off < chunk ? bytes - off : chunk;
            DT_CHECK_GOTO(dt__post_recv(op, &rx[c], parent, p + off, len), st, out);
        }
    for (size_t c = 0; c < nch; c++) {
        size_t off = c * chunk, len = bytes - off < chunk ? bytes - off : chunk;
        if (parent >= 0)
            DT_CHECK_GOTO(dt__wait(op, &rx[c]), st, out);
        for (int k = 0; k < nc; k++)
            DT_CHECK_GOTO(
                dt__post_send(op, &tx[c * (size_t)nc + (size_t)k], children[k], p + off, len), st,
                out);
    }
    if (nc)
        st = dt__waitall(op, tx, (int)(nch * (size_t)nc));
out:
    free(rx);
    free(tx);
    return st;
}

dt_status dt__tree_reduce(dt__op *op, const dt__team *t, const void *send, void *recv, size_t count,
                          int root) {
    size_t es = dt_dtype_size(op->dtype), bytes = count * es;
    int n = t->n;
    int v = (t->me - root + n) % n;
    char *acc, *tmp;
    void *scratch;
    DT_CHECK(dt__scratch(op->g, 2 * bytes + 64, &scratch));
    tmp = (char *)scratch;
    acc = v == 0 ? (char *)recv : (char *)scratch + dt_align_up(bytes, 64);
    if (acc != send)
        memcpy(acc, send, bytes);
    for (int mask = 1; mask < n; mask <<= 1) {
        if (v & mask) {
            DT_CHECK(dt__sendrecv(op, t->ranks[(v - mask + root) % n], acc, bytes, -1, NULL, 0));
            break;
        }
        if (v + mask < n) {
            dt__xfer x;
            DT_CHECK(dt__post_recv_reduce(op, &x, t->ranks[(v + mask + root) % n], tmp, bytes, acc,
                                          acc));
            DT_CHECK(dt__wait(op, &x));
        }
    }
    return DT_OK;
}
