/*
 * tune.c — which algorithm runs an operation: one table, read top to bottom,
 * first matching row wins. DT_ALGO forces a choice when it can run the
 * operation on this group's topology; otherwise the table decides (and the
 * benchmark's "algo" column shows what really ran). Two things come before
 * both: DT_DETERMINISTIC, which gives allreduce and reduce-scatter only to
 * rank-ordered schedules, and, once links were measured (topo.c), an
 * alpha-beta model that picks a multi-host allreduce.
 *
 * The thresholds come from `dtrain bench comm` on the development machine
 * (2 cores, loopback; see docs/comm.md): on one host the direct algorithm
 * wins at every size because it sends no messages at all; over TCP,
 * recursive doubling wins below 64 KiB (log n latency) and the ring above
 * (bandwidth optimal, pipelined); across hosts, the hierarchical algorithm
 * keeps most bytes inside each host. From 4 MiB up, while each rank's ring
 * block still fits in one DT_CHUNK_SIZE chunk, the ring cannot pipeline and
 * its n-1 store-and-forward steps lose to halving-doubling's log2 n (TCP,
 * 4 ranks, 4 MiB: 1.06 -> 1.27 GB/s busbw; at 2 ranks and 4 MiB, or 4 ranks
 * and 8 MiB, the pipelined ring wins or ties). Allgather between ranks that
 * do not share memory uses recursive doubling at every size when the rank
 * count is a power of two (the ring otherwise): log2 n exchanges instead of
 * n-1 store-and-forward steps (TCP, 4 ranks, medians of 3-5 interleaved
 * runs: 1.3-2x the ring's busbw from 1 KiB to 512 KiB, 1.1-1.3x from 1 to
 * 8 MiB, even at 16 MiB). With each exchange cut into pieces posted in
 * both directions at once, halving-doubling edges out the pipelined ring
 * for allreduce at 4 ranks from 8 MiB too (1.04-1.06x, interleaved
 * medians), but the chooser keeps the ring there: the gain is within
 * this VM's run-to-run noise and was measured on a shared machine. (It was
 * first held back because a survivor of a killed rank, cut off mid-frame,
 * could blame the neighbour that gave up; tcp.c's store record fixed that,
 * comm_fail kill_tcp_rhd_4.)
 */
#include "comm_internal.h"

typedef struct tune_row {
    dt_coll coll;
    int shared;       /* 1: all ranks share memory, 0: not, -1: either */
    int multi_host;   /* 1: several hosts with equal rank counts, -1: either */
    size_t min_bytes; /* row applies from this size up */
    int unpiped;      /* 1: only when the ring cannot pipeline (block <= DT_CHUNK_SIZE) */
    dt_algo algo;
} tune_row;

/* clang-format off */
static const tune_row table[] = {
    /* coll                   shared multi  min bytes unpiped algorithm */
    {DT_COLL_ALLREDUCE,         1,    -1,   0,          0,  DT_ALGO_DIRECT},
    {DT_COLL_ALLREDUCE,        -1,     1,   256 << 10,  0,  DT_ALGO_HIER},
    {DT_COLL_ALLREDUCE,         0,    -1,   4 << 20,    1,  DT_ALGO_RHD},
    {DT_COLL_ALLREDUCE,        -1,    -1,   64 << 10,   0,  DT_ALGO_RING},
    {DT_COLL_ALLREDUCE,        -1,    -1,   0,          0,  DT_ALGO_RHD},
    {DT_COLL_REDUCE_SCATTER,    1,    -1,   0,          0,  DT_ALGO_DIRECT},
    {DT_COLL_REDUCE_SCATTER,   -1,    -1,   0,          0,  DT_ALGO_RING},
    {DT_COLL_ALLGATHER,         1,    -1,   0,          0,  DT_ALGO_DIRECT},
    {DT_COLL_ALLGATHER,         0,    -1,   0,          0,  DT_ALGO_RHD},
    {DT_COLL_ALLGATHER,        -1,    -1,   0,          0,  DT_ALGO_RING},
    {DT_COLL_BROADCAST,         1,    -1,   0,          0,  DT_ALGO_DIRECT},
    {DT_COLL_BROADCAST,        -1,    -1,   0,          0,  DT_ALGO_TREE},
    {DT_COLL_REDUCE,           -1,    -1,   0,          0,  DT_ALGO_TREE},
    {DT_COLL_BARRIER,           1,    -1,   0,          0,  DT_ALGO_DIRECT},
};
/* clang-format on */

static bool group_shared(const dt_group *g) { return g->shm && !g->tcp; }

static bool applicable(const dt_group *g, dt_coll c, dt_algo a) {
    switch (a) {
    case DT_ALGO_RING:
        return c == DT_COLL_ALLREDUCE || c == DT_COLL_REDUCE_SCATTER || c == DT_COLL_ALLGATHER;
    case DT_ALGO_RHD: return c == DT_COLL_ALLREDUCE || c == DT_COLL_ALLGATHER;
    case DT_ALGO_TREE:
        return c == DT_COLL_ALLREDUCE || c == DT_COLL_BROADCAST || c == DT_COLL_REDUCE;
    case DT_ALGO_DIRECT:
        return group_shared(g) &&
               (c == DT_COLL_ALLREDUCE || c == DT_COLL_REDUCE_SCATTER || c == DT_COLL_ALLGATHER ||
                c == DT_COLL_BROADCAST || c == DT_COLL_BARRIER);
    case DT_ALGO_HIER: return c == DT_COLL_ALLREDUCE && dt__hier_ok(g);
    case DT_ALGO_TORUS2D: return c == DT_COLL_ALLREDUCE && dt__torus2d_ok(g);
    case DT_ALGO_ORDERED: return c == DT_COLL_ALLREDUCE || c == DT_COLL_REDUCE_SCATTER;
    default: return false;
    }
}

/* Measured links (dt_group_probe, topo.c): a multi-host allreduce is timed
 * in the alpha-beta model for each candidate and the fastest runs, instead
 * of the fixed rows. A flat ring or halving-doubling crosses the
 * between-host links at every step; hier and torus2d take 2(L-1) steps
 * inside each host so that only 1/L of the vector crosses, with the L
 * column streams sharing each host's link. Which wins depends on how much
 * faster the inside links are, which only a measurement knows (over TCP
 * inside hosts too, DT_TRANSPORT=tcp, the flat algorithms can win). */
static double t_ring(int n, double bytes, double alpha, double beta) {
    return n < 2 ? 0 : 2.0 * (n - 1) * (alpha + bytes / n / beta);
}

static double t_rhd(int n, double bytes, double alpha, double beta) {
    int steps = 0;
    while ((1 << steps) < n)
        steps++;
    return n < 2 ? 0 : 2.0 * steps * alpha + 2.0 * (n - 1) / n * bytes / beta;
}

static dt_algo model_choice(const dt_group *g, size_t bytes) {
    const dt__links *l = &g->links;
    int L = g->local_size, H = g->nhosts;
    double ai = l->alpha[DT_LINK_INTRA], bi = l->beta[DT_LINK_INTRA];
    double ax = l->alpha[DT_LINK_INTER], bx = l->beta[DT_LINK_INTER], S = (double)bytes;
    if (bx <= 0 || (L > 1 && bi <= 0))
        return DT_ALGO_AUTO; /* a class was not measured */
    double inside = t_ring(L, S, ai, bi), col = S / L, col_beta = bx / L;
    /* hier's column allreduce: halving-doubling below 64 KiB (hier.c) */
    double hier =
        inside + (col < 64 * 1024 ? t_rhd(H, col, ax, col_beta) : t_ring(H, col, ax, col_beta));
    const struct {
        dt_algo algo;
        double t;
    } cand[] = {{DT_ALGO_HIER, hier},
                {DT_ALGO_TORUS2D, inside + t_ring(H, col, ax, col_beta)},
                {DT_ALGO_RHD, t_rhd(g->size, S, ax, bx)},
                {DT_ALGO_RING, t_ring(g->size, S, ax, bx)}};
    size_t best = 0;
    for (size_t i = 1; i < sizeof cand / sizeof cand[0]; i++)
        if (cand[i].t < cand[best].t)
            best = i;
    return cand[best].algo;
}

/* DT_DETERMINISTIC: only schedules that evaluate the rank-ordered fold
 * (ordered.c) may reduce, whatever DT_ALGO says; the direct algorithm is
 * one of them and the fastest where it runs. */
static bool ordered_only(const dt_group *g, dt_coll c) {
    return g->cfg.deterministic && (c == DT_COLL_ALLREDUCE || c == DT_COLL_REDUCE_SCATTER);
}

dt_algo dt__tune_choose(const dt_group *g, dt_coll coll, size_t bytes) {
    if (ordered_only(g, coll))
        return group_shared(g) ? DT_ALGO_DIRECT : DT_ALGO_ORDERED;
    if (g->cfg.algo != DT_ALGO_AUTO && applicable(g, coll, g->cfg.algo))
        return g->cfg.algo;
    bool shared = group_shared(g), multi = dt__hier_ok(g);
    if (coll == DT_COLL_ALLREDUCE && multi && g->links.valid) {
        dt_algo a = model_choice(g, bytes);
        if (a != DT_ALGO_AUTO)
            return a;
    }
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++) {
        const tune_row *r = &table[i];
        if (r->coll != coll || bytes < r->min_bytes)
            continue;
        if (r->shared >= 0 && r->shared != (int)shared)
            continue;
        if (r->multi_host >= 0 && r->multi_host != (int)multi)
            continue;
        if (r->unpiped && bytes / (size_t)g->size > g->cfg.chunk)
            continue;
        return r->algo;
    }
    return DT_ALGO_AUTO; /* the operation has one fixed schedule */
}
