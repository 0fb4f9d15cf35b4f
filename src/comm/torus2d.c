/*
 * torus2d.c — 2D-torus allreduce: the ranks as an X x Y grid, rings along
 * both dimensions ("X direction, then Y direction").
 *
 *   X = 2, Y = 2 (rank = y * X + x; by default a row is one host):
 *
 *        x=0  x=1
 *   y=0   r0   r1      1. reduce-scatter along each row: r0 holds block 0
 *   y=1   r2   r3         of row 0's sum, r1 block 1; r2, r3 likewise
 *                      2. allreduce along each column on the block it holds
 *                         (r0<->r2 on block 0, r1<->r3 on block 1), all
 *                         columns at once
 *                      3. allgather along each row
 *
 * Each rank sends 2(X-1)/X of the vector along its row and 2(Y-1)/(XY)
 * along its column, in 2(X-1) + 2(Y-1) steps instead of the flat ring's
 * 2(XY-1). With a row per host, only 1/X of the vector crosses the network
 * per rank, and every host link carries X column rings side by side.
 *
 * The grid: DT_TORUS_X columns in rank order when set (the group size must
 * be a multiple of it), else one row per host and X = ranks per host (every
 * host must hold as many ranks; rows are the hosts in the order of their
 * lowest rank, columns the local index). hier.c is the same three phases on
 * the host grid, but picks recursive halving-doubling for small column
 * blocks; the torus keeps rings in both dimensions whatever the size.
 */
#include "comm_internal.h"

#include <stdlib.h>

/* Grid shape for g: X columns (0 if no grid fits). */
static int torus_x(const dt_group *g) {
    int x = g->cfg.torus_x;
    if (x > 0)
        return g->size % x == 0 ? x : 0;
    return dt__hier_ok(g) ? g->local_size : 0;
}

bool dt__torus2d_ok(const dt_group *g) {
    int x = torus_x(g);
    return x > 0 && g->size > 1;
}

/* My row and column as teams. row/col have room for X and Y ranks. */
static void grid_teams(const dt_group *g, int x, int *row, int *col, dt__team *rt, dt__team *ct) {
    int y = g->size / x;
    if (g->cfg.torus_x > 0) {
        int my_y = g->rank / x, my_x = g->rank % x;
        for (int j = 0; j < x; j++)
            row[j] = my_y * x + j;
        for (int i = 0; i < y; i++)
            col[i] = i * x + my_x;
        *rt = (dt__team){x, my_x, row};
        *ct = (dt__team){y, my_y, col};
        return;
    }
    for (int j = 0; j < x; j++)
        row[j] = g->local[j];
    for (int h = 0; h < y; h++)
        col[h] = g->host_ranks[h][g->local_rank];
    *rt = (dt__team){x, g->local_rank, row};
    *ct = (dt__team){y, g->host[g->rank], col};
}

dt_status dt__torus2d_allreduce(dt__op *op, const void *send, void *recv, size_t count) {
    dt_group *g = op->g;
    int x = torus_x(g);
    DT_ASSERT(x > 0);
    int y = g->size / x;
    size_t es = dt_dtype_size(op->dtype);
    int *row = malloc((size_t)x * sizeof *row), *col = malloc((size_t)y * sizeof *col);
    size_t *counts = malloc((size_t)x * sizeof *counts),
           *displs = malloc((size_t)x * sizeof *displs);
    dt_status st = DT_OK;
    if (!row || !col || !counts || !displs) {
        st = dt_error_set(DT_ERR_NOMEM, "torus2d: out of memory for a %d x %d grid", x, y);
        goto out;
    }
    dt__team rt, ct;
    grid_teams(g, x, row, col, &rt, &ct);
    size_t off = 0;
    for (int b = 0; b < x; b++) {
        counts[b] = count / (size_t)x + ((size_t)b < count % (size_t)x);
        displs[b] = off;
        off += counts[b];
    }
    char *blk = (char *)recv + displs[rt.me] * es;
    DT_CHECK_GOTO(dt__ring_reduce_scatter(op, &rt, send, blk, counts, displs), st, out);
    DT_CHECK_GOTO(dt__ring_allreduce(op, &ct, blk, blk, counts[rt.me]), st, out);
    DT_CHECK_GOTO(dt__ring_allgather(op, &rt, recv, counts, displs), st, out);
out:
    free(row);
    free(col);
    free(counts);
    free(displs);
    return st;
}
