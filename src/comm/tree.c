/*
 * tree.c — binomial-tree broadcast (pipelined in chunks, optionally with
 * the agreement of every rank built in) and reduce.
 *
 * Ranks are renumbered relative to the root (v = (r - root) mod n).
 *
 * Broadcast, for p2 ranks (p2 a power of two): in round d = 1, 2, 4, ...
 * the ranks v < d, which hold the data, send it to v + d. So v receives it
 * from v - hb(v) (hb: highest set bit) and forwards it to v + d for every
 * d > hb(v). Eight ranks:
 *
 *   round 1: 0->1   round 2: 0->2 1->3   round 4: 0->4 1->5 2->6 3->7
 *
 * With n not a power of two, the extra ranks p2..n-1 are served last by
 * v - p2. A chunk is forwarded as soon as it has arrived, so large buffers
 * stream down all levels at once (DT_CHUNK_SIZE chunks).
 *
 * Agreement (the public broadcast): the pairs of each round are those of
 * recursive doubling (v and v ^ d), so if every pair talks in every round,
 * every rank hears, through descriptors checked on arrival, from every
 * other within the same log2 n rounds. So the rank that gets data sends a
 * header-only message (the op's descriptor) back, ranks that hold no data
 * yet swap headers, and an extra rank swaps headers with v - p2 first. A
 * message of round d leaves only after the rank's receives of rounds < d
 * have arrived: for data that holds for the last chunk (earlier chunks go
 * at once). No rank then finishes unless every rank made the same call,
 * within the tree's own log2 n rounds (a separate barrier first made small
 * TCP broadcasts 3-4x slower; this costs 2 ranks 1.7 us, docs/comm.md).
 *
 * Reduce (below) is the binomial tree of the other orientation: v's parent
 * is v minus its lowest set bit, its children v + 2^k for every 2^k below
 * that bit; partial results flow up, each rank combining its children in a
 * fixed order (bit-identical on reruns). Depth ceil(log2 n) for both.
 */
#include "comm_internal.h"

#include <stdlib.h>
#include <string.h>

static int highbit(int v) {
    int b = 1;
    while (b * 2 <= v)
        b *= 2;
    return v ? b : 0;
}

dt_status dt__tree_broadcast(dt__op *op, const dt__team *t, void *buf, size_t bytes, int root,
                             bool agree) {
    int n = t->n;
    if (n == 1)
        return DT_OK;
    int v = (t->me - root + n) % n, p2 = 1;
    while (p2 * 2 <= n)
        p2 *= 2;
#define REAL(u) t->ranks[((u) + root) % n]
    /* Data: from `parent` (-1 at the root), to kids[] in round order, the
     * folded extra last. Headers (agree): swapped with v ^ d in the rounds
     * before v gets data, sent to the parent, received from each kid. */
    int parent = -1, kids[33], nk = 0, d0 = highbit(v), swaps[32], ns = 0;
    if (v >= p2) {
        parent = v - p2;
    } else {
        if (v)
            parent = v - d0;
        for (int d = 1; d < d0; d *= 2)
            swaps[ns++] = v ^ d;
        for (int d = d0 ? 2 * d0 : 1; d < p2; d *= 2)
            kids[nk++] = v + d;
        if (v + p2 < n)
            kids[nk++] = v + p2;
    }
    size_t chunk = op->g->cfg.chunk;
    size_t nch = bytes == 0 ? 1 : (bytes + chunk - 1) / chunk;
    dt__xfer *rx = parent >= 0 ? malloc(nch * sizeof *rx) : NULL;
    dt__xfer *tx = nk ? malloc(nch * (size_t)nk * sizeof *tx) : NULL;
    dt__xfer *hdr = agree ? malloc(((size_t)nk + 1) * sizeof *hdr) : NULL; /* kids, parent */
    int nh = 0, kid_hdr = 0;
    dt_status st = DT_OK;
    if ((parent >= 0 && !rx) || (nk && !tx) || (agree && !hdr)) {
        st = dt_error_set(DT_ERR_NOMEM, "tree: out of memory");
        goto out;
    }
    if (agree) {
        /* An extra and the rank that serves it swap headers first, so the
         * server has heard the extra before its first round. Like every
         * wait here, it follows a message to the rank waited for: ranks
         * that made different calls and wait for each other always find
         * the other's descriptor queued (TCP has no other way to see it). */
        if (v >= p2)
            DT_CHECK_GOTO(dt__sendrecv(op, REAL(parent), NULL, 0, REAL(parent), NULL, 0), st, out);
        else if (v + p2 < n)
            DT_CHECK_GOTO(dt__sendrecv(op, REAL(v + p2), NULL, 0, REAL(v + p2), NULL, 0), st, out);
        for (int i = 0; i < ns; i++) /* rounds < d0: nobody here holds data yet */
            DT_CHECK_GOTO(dt__sendrecv(op, REAL(swaps[i]), NULL, 0, REAL(swaps[i]), NULL, 0), st,
                          out);
        if (parent >= 0 && v < p2)
            DT_CHECK_GOTO(dt__post_send(op, &hdr[nh++], REAL(parent), NULL, 0), st, out);
        kid_hdr = nh;
        for (int k = 0; k < nk; k++)
            if (kids[k] < p2) /* the extra sent its header first, above */
                DT_CHECK_GOTO(dt__post_recv(op, &hdr[nh++], REAL(kids[k]), NULL, 0), st, out);
    }
    char *p = buf;
    if (parent >= 0)
        for (size_t c = 0; c < nch; c++) {
            size_t off = c * chunk, len = bytes - off < chunk ? bytes - off : chunk;
            DT_CHECK_GOTO(dt__post_recv(op, &rx[c], REAL(parent), p + off, len), st, out);
        }
    for (size_t c = 0; c < nch; c++) {
        size_t off = c * chunk, len = bytes - off < chunk ? bytes - off : chunk;
        if (parent >= 0)
            DT_CHECK_GOTO(dt__wait(op, &rx[c]), st, out);
        for (int k = 0; k < nk; k++) {
            /* the last chunk to the kid of round d certifies every receive
             * of rounds < d: the earlier kids' headers */
            if (agree && c + 1 == nch && k > 0 && kids[k - 1] < p2)
                DT_CHECK_GOTO(dt__wait(op, &hdr[kid_hdr + k - 1]), st, out);
            DT_CHECK_GOTO(
                dt__post_send(op, &tx[c * (size_t)nk + (size_t)k], REAL(kids[k]), p + off, len), st,
                out);
        }
    }
    if (nk)
        DT_CHECK_GOTO(dt__waitall(op, tx, (int)(nch * (size_t)nk)), st, out);
    st = dt__waitall(op, hdr, nh);
out:
#undef REAL
    free(rx);
    free(tx);
    free(hdr);
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
