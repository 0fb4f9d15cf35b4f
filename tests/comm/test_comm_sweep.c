/*
 * test_comm_sweep.c — every collective x dtype x op x algorithm x count x
 * in/out-of-place against a serial reference, on 1..8 real processes, over
 * shared memory and over TCP.
 *
 * The full product is large (~5000 combinations per world size), so CI
 * runs a deterministic sample: each combination is kept with a probability
 * that depends on its cost (all sizes see different samples, every
 * collective/algorithm pair is still hit; the recursive-doubling allgather
 * runs every dtype and placement). DT_TEST_FULL=1 runs everything.
 *
 * Inputs are small integers, so every sum, product (|x| <= 256), min and
 * max is exact in every dtype, including f16 and bf16 (integers up to 2048
 * and 256 are exact there): results must match bit for bit. The only
 * inexact step is AVG's final division, allowed 2 ulps. Integer types
 * wrap like two's complement, and the reference wraps the same way.
 * A separate case uses random real inputs and checks the sum against a
 * double-precision reference within the summation-order bound
 * (n - 1) * u * sum|x_i| per element (u = unit roundoff of the dtype),
 * which covers any order of n-1 roundings.
 */
#include "harness.h"
#include "reference.h"

static const size_t counts[] = {0, 1, 7, 1000, 1000003};
#define NCOUNTS 5

typedef struct combo {
    dt_coll coll;
    dt_dtype dt;
    dt_redop op;
    size_t count;
    bool inplace;
    uint64_t salt;
} combo;

static void run_combo(dt_group *g, const combo *c, const char *algo) {
    int n = dt_group_size(g), me = dt_group_rank(g);
    size_t es = dt_dtype_size(c->dt), cnt = c->count, N = (size_t)n;
    int root = (int)(c->salt % N);
    char what[256];
    snprintf(what, sizeof what, "%s %s %s count=%zu %s algo=%s n=%d rank=%d root=%d",
             dt_coll_name(c->coll), dt_dtype_name(c->dt), dt_redop_name(c->op), cnt,
             c->inplace ? "in-place" : "out-of-place", algo, n, me, root);
    size_t big = N * cnt + 1;
    char *in = malloc(big * es), *out = malloc(big * es);
    ASSERT_TRUE(in && out);
    memset(out, 0x5a, big * es);
    dt_status st = DT_OK;
    switch (c->coll) {
    case DT_COLL_ALLREDUCE:
    case DT_COLL_REDUCE: {
        for (size_t i = 0; i < cnt; i++)
            put(in, c->dt, i, (double)gen(me, i, c->salt, c->dt, c->op));
        char *dst = c->inplace ? in : out;
        if (c->coll == DT_COLL_ALLREDUCE)
            st = dt_group_allreduce(g, in, dst, cnt, c->dt, c->op);
        else
            st = dt_group_reduce(g, in, dst, cnt, c->dt, c->op, root);
        if (st != DT_OK)
            TEST_FAILF("%s: %s: %s", what, dt_status_name(st), dt_last_error());
        if (c->coll == DT_COLL_ALLREDUCE || me == root)
            for (size_t i = 0; i < cnt; i++)
                check_elem(what, dst, c->dt, i, ref_reduce(n, i, c->salt, c->dt, c->op), c->op);
        break;
    }
    case DT_COLL_REDUCE_SCATTER: {
        for (size_t i = 0; i < N * cnt; i++)
            put(in, c->dt, i, (double)gen(me, i, c->salt, c->dt, c->op));
        st = dt_group_reduce_scatter(g, in, c->inplace ? in : out, cnt, c->dt, c->op);
        if (st != DT_OK)
            TEST_FAILF("%s: %s: %s", what, dt_status_name(st), dt_last_error());
        const char *res = c->inplace ? in + (size_t)me * cnt * es : out;
        for (size_t i = 0; i < cnt; i++)
            check_elem(what, res, c->dt, i,
                       ref_reduce(n, (size_t)me * cnt + i, c->salt, c->dt, c->op), c->op);
        break;
    }
    case DT_COLL_ALLGATHER:
    case DT_COLL_GATHER: {
        char *src = in;
        if (c->inplace && (c->coll == DT_COLL_ALLGATHER || me == root))
            src = out + (size_t)me * cnt * es;
        for (size_t i = 0; i < cnt; i++)
            put(src, c->dt, i, (double)gen(me, i, c->salt, c->dt, DT_SUM));
        const void *s = c->inplace && (c->coll == DT_COLL_ALLGATHER || me == root) ? out : in;
        if (c->coll == DT_COLL_ALLGATHER)
            st = dt_group_allgather(g, s, out, cnt, c->dt);
        else
            st = dt_group_gather(g, s, out, cnt, c->dt, root);
        if (st != DT_OK)
            TEST_FAILF("%s: %s: %s", what, dt_status_name(st), dt_last_error());
        if (c->coll == DT_COLL_ALLGATHER || me == root)
            for (int r = 0; r < n; r++)
                for (size_t i = 0; i < cnt; i++)
                    check_elem(what, out, c->dt, (size_t)r * cnt + i,
                               (double)gen(r, i, c->salt, c->dt, DT_SUM), DT_SUM);
        break;
    }
    case DT_COLL_BROADCAST: {
        for (size_t i = 0; i < cnt; i++)
            put(out, c->dt, i, me == root ? (double)gen(root, i, c->salt, c->dt, DT_SUM) : 99);
        st = dt_group_broadcast(g, out, cnt, c->dt, root);
        if (st != DT_OK)
            TEST_FAILF("%s: %s: %s", what, dt_status_name(st), dt_last_error());
        for (size_t i = 0; i < cnt; i++)
            check_elem(what, out, c->dt, i, (double)gen(root, i, c->salt, c->dt, DT_SUM), DT_SUM);
        break;
    }
    case DT_COLL_SCATTER: {
        if (me == root)
            for (size_t i = 0; i < N * cnt; i++)
                put(in, c->dt, i, (double)gen(root, i, c->salt, c->dt, DT_SUM));
        bool ip = c->inplace && me == root;
        st = dt_group_scatter(g, in, ip ? in : out, cnt, c->dt, root);
        if (st != DT_OK)
            TEST_FAILF("%s: %s: %s", what, dt_status_name(st), dt_last_error());
        const char *res = ip ? in + (size_t)me * cnt * es : out;
        for (size_t i = 0; i < cnt; i++)
            check_elem(what, res, c->dt, i,
                       (double)gen(root, (size_t)me * cnt + i, c->salt, c->dt, DT_SUM), DT_SUM);
        break;
    }
    case DT_COLL_ALLTOALL: {
        for (size_t i = 0; i < N * cnt; i++)
            put(in, c->dt, i, (double)gen(me, i, c->salt, c->dt, DT_SUM));
        char *dst = c->inplace ? in : out;
        st = dt_group_alltoall(g, in, dst, cnt, c->dt);
        if (st != DT_OK)
            TEST_FAILF("%s: %s: %s", what, dt_status_name(st), dt_last_error());
        for (int r = 0; r < n; r++)
            for (size_t i = 0; i < cnt; i++)
                check_elem(what, dst, c->dt, (size_t)r * cnt + i,
                           (double)gen(r, (size_t)me * cnt + i, c->salt, c->dt, DT_SUM), DT_SUM);
        break;
    }
    default: abort();
    }
    free(in);
    free(out);
}

static bool reducing(dt_coll c) {
    return c == DT_COLL_ALLREDUCE || c == DT_COLL_REDUCE_SCATTER || c == DT_COLL_REDUCE;
}

static const dt_coll colls[] = {DT_COLL_ALLREDUCE, DT_COLL_REDUCE_SCATTER, DT_COLL_ALLGATHER,
                                DT_COLL_BROADCAST, DT_COLL_REDUCE,         DT_COLL_GATHER,
                                DT_COLL_SCATTER,   DT_COLL_ALLTOALL};

/* Random reals: the sum within the summation-order bound. */
static void real_sums(dt_group *g) {
    int n = dt_group_size(g), me = dt_group_rank(g);
    const size_t cnt = 4099;
    static const dt_dtype dts[] = {DT_F32, DT_F64, DT_F16, DT_BF16};
    static const double u[] = {0x1p-24, 0x1p-53, 0x1p-11, 0x1p-8};
    for (int d = 0; d < 4; d++) {
        size_t es = dt_dtype_size(dts[d]);
        char *buf = malloc(cnt * es);
        for (size_t i = 0; i < cnt; i++)
            put(buf, dts[d], i, (double)(mix((uint64_t)me * 7919 + i) % 2000001) / 1e6 - 1.0);
        ASSERT_OK(dt_group_allreduce(g, buf, buf, cnt, dts[d], DT_SUM));
        for (size_t i = 0; i < cnt; i++) {
            double want = 0, mag = 0;
            for (int r = 0; r < n; r++) {
                char one[8];
                put(one, dts[d], 0, (double)(mix((uint64_t)r * 7919 + i) % 2000001) / 1e6 - 1.0);
                double x = get(one, dts[d], 0); /* the input as the rank stored it */
                want += x;
                mag += fabs(x);
            }
            /* n-1 additions, each rounding by at most u * |partial| <= u * mag,
             * plus the final rounding into the dtype */
            double tol = (n)*u[d] * mag + 1e-300;
            double got = get(buf, dts[d], i);
            if (!(fabs(got - want) <= tol))
                TEST_FAILF("real sum %s n=%d element %zu: got %.9g want %.9g tol %.3g",
                           dt_dtype_name(dts[d]), n, i, got, want, tol);
        }
        free(buf);
    }
}

static void sweep(int rank, int size) {
    (void)rank;
    bool full = getenv("DT_TEST_FULL") && atoi(getenv("DT_TEST_FULL")) == 1;
    const char *tp = getenv("DT_TRANSPORT") ? getenv("DT_TRANSPORT") : "auto";
    const char *nodes = getenv("DT_TEST_NODES");
    if (nodes) { /* simulate several hosts: shm inside each, tcp between */
        char node[16];
        snprintf(node, sizeof node, "%d", rank * atoi(nodes) / size);
        setenv("DT_NODE_RANK", node, 1);
    }
    dt_group *world = NULL;
    ASSERT_OK(dt_group_init_from_env(&world));
    uint64_t seed = mix((uint64_t)size * 131 + (uint64_t)tp[0] + (nodes ? 7 : 0));
    int ran = 0, big = 0;
    const char *only = getenv("DT_TEST_ONLY_ALGO"); /* a case that sweeps one algorithm */
    for (int a = 0; a < DT_ALGO_COUNT; a++) {
        if (only && strcmp(only, dt_algo_name((dt_algo)a)) != 0)
            continue;
        setenv("DT_ALGO", dt_algo_name((dt_algo)a), 1);
        dt_group *g = NULL;
        ASSERT_OK(dt_group_split(world, 0, rank, &g));
        ASSERT_EQ(dt_group_size(g), size);
        if (a == 0 || only)
            real_sums(g);
        for (size_t ci = 0; ci < sizeof colls / sizeof colls[0]; ci++) {
            dt_coll coll = colls[ci];
            /* skip forced algorithms that cannot run this collective here:
             * the chooser would run the default, tested under "auto" */
            if (a != 0 && dt_group_algo_for(g, coll, 4000) != (dt_algo)a)
                continue;
            for (int dt = 0; dt < DT_DTYPE_COUNT; dt++)
                for (int op = 0; op < (reducing(coll) ? DT_REDOP_COUNT : 1); op++)
                    for (int k = 0; k < NCOUNTS; k++)
                        for (int ip = 0; ip < 2; ip++) {
                            combo c = {coll, (dt_dtype)dt, (dt_redop)op, counts[k], ip == 1, 0};
                            c.salt = mix(seed ^ mix(((uint64_t)a << 40) | ((uint64_t)ci << 32) |
                                                    ((uint64_t)dt << 24) | ((uint64_t)op << 16) |
                                                    ((uint64_t)k << 8) | (uint64_t)ip));
                            double p = k == 4 ? 0.004 : k == 0 ? 0.03 : 0.06;
                            if (size == 1)
                                p *= 3;
                            /* the recursive-doubling allgather (new, and its
                             * non-power-of-two fallback to the ring) at every
                             * dtype and placement below 1M elements; at 1M+3
                             * one dtype per world size, both placements */
                            if (a == DT_ALGO_RHD && coll == DT_COLL_ALLGATHER)
                                p = k < 4 || dt == size % DT_DTYPE_COUNT ? 1 : 0;
                            /* torus2d: everything below 1M elements, one
                             * dtype at 1M+3 (both placements) */
                            if (a == DT_ALGO_TORUS2D)
                                p = k < 4 || dt == size % DT_DTYPE_COUNT ? 1 : 0;
                            if (!full && (double)(c.salt >> 11) * 0x1p-53 >= p)
                                continue;
                            run_combo(g, &c, dt_algo_name((dt_algo)a));
                            ran++;
                            big += k == 4;
                        }
        }
        ASSERT_OK(dt_group_barrier(g));
        dt_group_destroy(g);
    }
    if (only) /* the algorithm could run here and did */
        ASSERT_TRUE(ran > 0);
    if (rank == 0)
        printf("rank 0: %d combinations (%d with 1M+3 elements), transport %s\n", ran, big,
               dt_group_transport(world));
    dt_group_destroy(world);
}

/* Odd world sizes also run with tiny chunks, slots and windows so that even
 * 1000-element messages take the multi-chunk, multi-slot paths (for even
 * sizes the NULL ends the list early: defaults). */
#define SW(name, n, tp)                                                                            \
    {                                                                                              \
        name, n, sweep,                                                                            \
            {tp,                                                                                   \
             (n) % 2 ? "DT_CHUNK_SIZE=4096" : NULL,                                                \
             "DT_SHM_SLOT=4096",                                                                   \
             "DT_SHM_WINDOW=64K",                                                                  \
             "DT_TCP_STRIPE_MIN=8K",                                                               \
             NULL},                                                                                \
            -1, 240                                                                                \
    }
/* One algorithm (torus2d) on a grid, with the small chunks and windows of
 * odd sizes at every size. */
#define TORUS(name, n, tp, grid)                                                                   \
    {                                                                                              \
        name, n, sweep,                                                                            \
            {tp,                                                                                   \
             grid,                                                                                 \
             "DT_TEST_ONLY_ALGO=torus2d",                                                          \
             "DT_CHUNK_SIZE=4096",                                                                 \
             "DT_SHM_SLOT=4096",                                                                   \
             "DT_TCP_STRIPE_MIN=8K",                                                               \
             NULL},                                                                                \
            -1, 240                                                                                \
    }
static const hcase cases[] = {
    SW("shm_1", 1, "DT_TRANSPORT=auto"),
    SW("shm_2", 2, "DT_TRANSPORT=auto"),
    SW("shm_3", 3, "DT_TRANSPORT=auto"),
    SW("shm_4", 4, "DT_TRANSPORT=auto"),
    SW("shm_5", 5, "DT_TRANSPORT=auto"),
    SW("shm_6", 6, "DT_TRANSPORT=auto"),
    SW("shm_7", 7, "DT_TRANSPORT=auto"),
    SW("shm_8", 8, "DT_TRANSPORT=auto"),
    SW("tcp_2", 2, "DT_TRANSPORT=tcp"),
    SW("tcp_3", 3, "DT_TRANSPORT=tcp"),
    SW("tcp_4", 4, "DT_TRANSPORT=tcp"),
    SW("tcp_5", 5, "DT_TRANSPORT=tcp"),
    SW("tcp_6", 6, "DT_TRANSPORT=tcp"),
    SW("tcp_7", 7, "DT_TRANSPORT=tcp"),
    SW("tcp_8", 8, "DT_TRANSPORT=tcp"),
    SW("hier_4", 4, "DT_TEST_NODES=2"),
    SW("hier_5", 5, "DT_TEST_NODES=2"),
    SW("hier_6", 6, "DT_TEST_NODES=2"),
    /* torus2d on several grids (X columns x Y rows): DT_TORUS_X in rank
     * order over TCP and shared memory, and one row per simulated host */
    TORUS("torus_2x2_tcp", 4, "DT_TRANSPORT=tcp", "DT_TORUS_X=2"),
    TORUS("torus_3x2_tcp", 6, "DT_TRANSPORT=tcp", "DT_TORUS_X=3"),
    TORUS("torus_2x3_tcp", 6, "DT_TRANSPORT=tcp", "DT_TORUS_X=2"),
    TORUS("torus_1x3_tcp", 3, "DT_TRANSPORT=tcp", "DT_TORUS_X=1"),
    TORUS("torus_4x2_shm", 8, "DT_TRANSPORT=auto", "DT_TORUS_X=4"),
    TORUS("torus_2x2_hosts", 4, "DT_TEST_NODES=2", "DT_TORUS_X=0"),
    TORUS("torus_3x2_hosts", 6, "DT_TEST_NODES=2", "DT_TORUS_X=0"),
    /* links measured at creation (DT_TOPO_PROBE): the chooser's alpha-beta
     * model picks the multi-host allreduce, the same on every rank */
    {"probe_hosts_4", 4, sweep, {"DT_TEST_NODES=2", "DT_TOPO_PROBE=1", NULL}, -1, 240},
};

int main(int argc, char **argv) {
    return harness_main(argc, argv, cases, (int)(sizeof cases / sizeof cases[0]));
}
