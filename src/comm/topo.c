/*
 * topo.c — topology discovery: what the links between a group's ranks
 * cost, measured, and the hierarchy that shows in it.
 *
 * Hosts are known before any probe: ranks with the same host key (host
 * name, boot id, DT_NODE_RANK) share memory, and that is physical truth.
 * What a probe adds is the price of each link class, in the alpha-beta
 * model (time of an m-byte message = alpha + m / beta):
 *
 *   for each measured pair (a, b), one pair at a time, everyone else idle:
 *     alpha = half the median round trip of an 8-byte ping-pong
 *     beta  = m / (half the best round trip of an m-byte ping-pong - alpha)
 *   the class of a pair: inside a host or between hosts; a class's alpha
 *   and beta are the medians over its pairs
 *
 * and two readings of the hierarchy: whether latency confirms the hosts
 * (inside-host alpha at most half the between-host alpha), and groups of
 * hosts whose mutual latency is clearly lower than to the others ("hosts
 * per switch": single linkage below the geometric mean of the lowest and
 * highest host-pair latency, when those differ by 2x or more).
 *
 * A full probe measures every pair (n(n-1)/2 ping-pongs in turn: `dtrain
 * bench topo`); a quick one only one pair per class (DT_TOPO_PROBE=1 at
 * world creation). Either way the class parameters are kept in the group
 * and inherited by groups split from it, where tune.c reads them.
 */
#include "comm_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define PING_ITERS 11
#define BIG_ITERS  3

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n ? v[n / 2] : 0;
}

/* One ping-pong of `bytes` between me and peer; the lower rank starts. */
static dt_status pingpong(dt_group *g, int peer, void *buf, size_t bytes) {
    if (g->rank < peer) {
        DT_CHECK(dt_group_send(g, buf, bytes, DT_U8, peer, 1));
        return dt_group_recv(g, buf, bytes, DT_U8, peer, 1);
    }
    DT_CHECK(dt_group_recv(g, buf, bytes, DT_U8, peer, 1));
    return dt_group_send(g, buf, bytes, DT_U8, peer, 1);
}

/* Measure the pair (me, peer): latency (s) and bandwidth (bytes/s). */
static dt_status measure_pair(dt_group *g, int peer, char *buf, size_t big, double *lat,
                              double *bw) {
    double rt[PING_ITERS];
    DT_CHECK(pingpong(g, peer, buf, 8)); /* warm-up: connections, caches */
    for (int i = 0; i < PING_ITERS; i++) {
        double t0 = dt_now();
        DT_CHECK(pingpong(g, peer, buf, 8));
        rt[i] = dt_now() - t0;
    }
    *lat = median(rt, PING_ITERS) / 2;
    DT_CHECK(pingpong(g, peer, buf, big));
    double best = 1e30;
    for (int i = 0; i < BIG_ITERS; i++) {
        double t0 = dt_now();
        DT_CHECK(pingpong(g, peer, buf, big));
        double t = dt_now() - t0;
        best = t < best ? t : best;
    }
    double one_way = best / 2 - *lat;
    *bw = (double)big / (one_way > 1e-9 ? one_way : 1e-9);
    return DT_OK;
}

/* The pairs a quick probe measures: the first pair inside a host and the
 * first pair between hosts, in rank order. */
static bool quick_pair(const dt_group *g, int a, int b, bool *seen) {
    int cls = g->host[a] == g->host[b] ? 0 : 1;
    if (seen[cls])
        return false;
    seen[cls] = true;
    return true;
}

/* Hosts per "switch": components of the host graph whose edges are the
 * host pairs with latency below the cut. */
static int switch_groups(const dt_group *g, const double *lat) {
    int H = g->nhosts, n = g->size;
    if (H < 3)
        return 1;
    double *hl = calloc((size_t)H * (size_t)H, sizeof *hl);
    int *cnt = calloc((size_t)H * (size_t)H, sizeof *cnt), *comp = malloc((size_t)H * sizeof *comp);
    int groups = 1;
    if (!hl || !cnt || !comp)
        goto out;
    for (int a = 0; a < n; a++)
        for (int b = a + 1; b < n; b++) {
            int x = g->host[a], y = g->host[b];
            if (x == y || lat[a * n + b] <= 0)
                continue;
            hl[x * H + y] += lat[a * n + b];
            cnt[x * H + y]++;
        }
    double lo = 1e30, hi = 0;
    for (int x = 0; x < H; x++)
        for (int y = x + 1; y < H; y++) {
            if (!cnt[x * H + y])
                goto out; /* not every host pair measured */
            hl[x * H + y] /= cnt[x * H + y];
            lo = fmin(lo, hl[x * H + y]);
            hi = fmax(hi, hl[x * H + y]);
        }
    if (hi < 2 * lo)
        goto out;
    double cut = sqrt(lo * hi);
    for (int x = 0; x < H; x++)
        comp[x] = x;
    for (bool changed = true; changed;) { /* label propagation: smallest label wins */
        changed = false;
        for (int x = 0; x < H; x++)
            for (int y = x + 1; y < H; y++)
                if (hl[x * H + y] < cut && comp[x] != comp[y]) {
                    int m = comp[x] < comp[y] ? comp[x] : comp[y];
                    comp[x] = comp[y] = m;
                    changed = true;
                }
    }
    groups = 0;
    for (int x = 0; x < H; x++)
        groups += comp[x] == x;
out:
    free(hl);
    free(cnt);
    free(comp);
    return groups;
}

dt_status dt_group_probe(dt_group *g, bool all_pairs, size_t bytes, dt_topology *out, double *lat,
                         double *bw) {
    if (!g || !out)
        return dt_error_set(DT_ERR_INVALID, "dt_group_probe: NULL argument");
    if (bytes < 1024 || bytes > ((size_t)1 << 30))
        return dt_error_set(DT_ERR_INVALID,
                            "dt_group_probe: message size %zu bytes (1 KiB .. 1 GiB)", bytes);
    int n = g->size, me = g->rank;
    size_t nn = (size_t)n * (size_t)n;
    memset(out, 0, sizeof *out);
    /* [0, nn): latency, [nn, 2nn): bandwidth; each pair written by its
     * lower rank, summed over ranks */
    double *m = calloc(2 * nn, sizeof *m);
    char *buf = dt_alloc(bytes);
    dt_status st = DT_OK;
    if (!m || !buf) {
        st = dt_error_set(DT_ERR_NOMEM, "dt_group_probe: out of memory (%d ranks)", n);
        goto out;
    }
    memset(buf, 0x5a, bytes);
    bool seen[2] = {false, false};
    for (int a = 0; a < n; a++)
        for (int b = a + 1; b < n; b++) {
            if (!all_pairs && !quick_pair(g, a, b, seen))
                continue;
            if (me == a || me == b)
                DT_CHECK_GOTO(measure_pair(g, me == a ? b : a, buf, bytes, &m[a * n + b],
                                           &m[nn + (size_t)(a * n + b)]),
                              st, out);
            if (me == b) { /* counted once, by the lower rank */
                m[a * n + b] = 0;
                m[nn + (size_t)(a * n + b)] = 0;
            }
            DT_CHECK_GOTO(dt_group_barrier(g), st, out); /* one pair at a time */
        }
    DT_CHECK_GOTO(dt_group_allreduce(g, m, m, 2 * nn, DT_F64, DT_SUM), st, out);
    out->size = n;
    out->nhosts = g->nhosts;
    out->ranks_per_host = g->host_size[0];
    for (int h = 1; h < g->nhosts; h++)
        if (g->host_size[h] != g->host_size[0])
            out->ranks_per_host = 0;
    for (int cls = 0; cls < DT_LINK_CLASS_COUNT; cls++) {
        double *al = malloc(nn * sizeof *al), *be = malloc(nn * sizeof *be);
        int k = 0;
        if (!al || !be) {
            free(al);
            free(be);
            st = dt_error_set(DT_ERR_NOMEM, "dt_group_probe: out of memory");
            goto out;
        }
        for (int a = 0; a < n; a++)
            for (int b = a + 1; b < n; b++)
                if (m[a * n + b] > 0 && (g->host[a] == g->host[b]) == (cls == DT_LINK_INTRA)) {
                    al[k] = m[a * n + b];
                    be[k++] = m[nn + (size_t)(a * n + b)];
                }
        out->link[cls].pairs = k;
        out->link[cls].alpha = median(al, k);
        out->link[cls].beta = median(be, k);
        free(al);
        free(be);
    }
    const dt_link_params *in = &out->link[DT_LINK_INTRA], *x = &out->link[DT_LINK_INTER];
    out->hosts_confirmed = in->pairs && x->pairs && 2 * in->alpha <= x->alpha;
    out->switches = all_pairs ? switch_groups(g, m) : 1;
    for (size_t i = 0; i < nn; i++) { /* symmetric matrices for the caller */
        size_t a = i / (size_t)n, b = i % (size_t)n;
        double l = a < b ? m[i] : m[b * (size_t)n + a];
        double w = a < b ? m[nn + i] : m[nn + b * (size_t)n + a];
        if (lat)
            lat[i] = a == b ? 0 : l;
        if (bw)
            bw[i] = a == b ? 0 : w;
    }
    /* Kept for the chooser (tune.c), in this group and the groups split
     * from it later: the same on every member, from the summed matrices. */
    dt__links links = {true, {0}, {0}};
    for (int cls = 0; cls < DT_LINK_CLASS_COUNT; cls++) {
        links.alpha[cls] = out->link[cls].alpha;
        links.beta[cls] = out->link[cls].beta;
    }
    g->links = links;
out:
    free(m);
    dt_free(buf);
    return st;
}

bool dt_group_links(const dt_group *g, dt_link_params out[DT_LINK_CLASS_COUNT]) {
    for (int cls = 0; cls < DT_LINK_CLASS_COUNT; cls++)
        out[cls] = (dt_link_params){.alpha = g->links.alpha[cls],
                                    .beta = g->links.beta[cls],
                                    .pairs = g->links.beta[cls] > 0};
    return g->links.valid;
}
