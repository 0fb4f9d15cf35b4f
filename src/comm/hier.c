/*
 * hier.c — hierarchical allreduce for groups spanning several hosts.
 *
 *   host A: ranks a0 a1        host B: ranks b0 b1
 *   1. reduce-scatter inside each host (shared memory): a0 holds block 0 of
 *      the host's sum, a1 block 1; likewise b0, b1
 *   2. allreduce across hosts among ranks with the same local index
 *      (a0<->b0 on block 0, a1<->b1 on block 1), all pairs at once
 *   3. allgather inside each host
 *
 * Only 1/L of the vector (L ranks per host) crosses the network per rank,
 * and every host link is used by L streams in parallel. Requires the same
 * number of ranks on every host (the chooser checks).
 */
#include "comm_internal.h"

#include <stdlib.h>

bool dt__hier_ok(const dt_group *g) {
    if (g->nhosts < 2)
        return false;
    for (int h = 1; h < g->nhosts; h++)
        if (g->host_size[h] != g->host_size[0])
            return false;
    return true;
}

dt_status dt__hier_allreduce(dt__op *op, const void *send, void *recv, size_t count) {
    dt_group *g = op->g;
    DT_ASSERT(dt__hier_ok(g));
    size_t es = dt_dtype_size(op->dtype);
    int L = g->local_size;
    dt__team local = {L, g->local_rank, g->local};
    int *cross_ranks = malloc((size_t)g->nhosts * sizeof *cross_ranks);
    size_t *counts = malloc((size_t)L * sizeof *counts),
           *displs = malloc((size_t)L * sizeof *displs);
    dt_status st = DT_OK;
    if (!cross_ranks || !counts || !displs) {
        st = dt_error_set(DT_ERR_NOMEM, "hier: out of memory");
        goto out;
    }
    for (int h = 0; h < g->nhosts; h++)
        cross_ranks[h] = g->host_ranks[h][g->local_rank];
    dt__team cross = {g->nhosts, g->host[g->rank], cross_ranks};
    size_t off = 0;
    for (int b = 0; b < L; b++) {
        counts[b] = count / (size_t)L + ((size_t)b < count % (size_t)L);
        displs[b] = off;
        off += counts[b];
    }
    char *blk = (char *)recv + displs[local.me] * es;
    DT_CHECK_GOTO(dt__ring_reduce_scatter(op, &local, send, blk, counts, displs), st, out);
    if (counts[local.me] * es < 64 * 1024)
        DT_CHECK_GOTO(dt__rhd_allreduce(op, &cross, blk, blk, counts[local.me]), st, out);
    else
        DT_CHECK_GOTO(dt__ring_allreduce(op, &cross, blk, blk, counts[local.me]), st, out);
    DT_CHECK_GOTO(dt__ring_allgather(op, &local, recv, counts, displs), st, out);
out:
    free(cross_ranks);
    free(counts);
    free(displs);
    return st;
}
