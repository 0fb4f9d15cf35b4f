/*
 * test_comm_det.c — DT_DETERMINISTIC=1: allreduce and reduce-scatter give
 * the bits of the rank-ordered fold (x0 op x1) op x2 ... whatever the
 * algorithm (every DT_ALGO), transport (shm, tcp), host layout (one host,
 * simulated hosts with shm inside and tcp between) and chunk size.
 *
 * Inputs are random reals spread over 2^-12..2^12 with zeros of both signs,
 * so that summation order shows in the bits; every rank computes the
 * canonical fold serially (it can generate every rank's input) and compares
 * its output with it bit for bit, for f32, bf16 and f16, sum, avg, min and
 * max, counts 0, 1, 7, 1000, 4099 and 65537, in and out of place. Since
 * every case is compared with the same serial fold, all cases agree with
 * each other.
 *
 * The control case (ctl_*) runs the ring over TCP without the mode and
 * requires that some element differs from the fold: the inputs do expose
 * reduction order, so the cases above could fail.
 */
#include "harness.h"
/* mix, to_bf16 and from_bf16; the integer reference is not used here */
#pragma GCC diagnostic ignored "-Wunused-function"
#include "reference.h"

#include <math.h>

static const size_t det_counts[] = {0, 1, 7, 1000, 4099, 65537};
static const dt_dtype det_dtypes[] = {DT_F32, DT_BF16, DT_F16};
static const dt_redop det_ops[] = {DT_SUM, DT_AVG, DT_MIN, DT_MAX};

/* Rank r's input at index i: a random real of random magnitude, or a zero
 * of either sign (min/max of +0 and -0 depend on operand roles). */
static float det_input(int r, size_t i, uint64_t salt) {
    uint64_t h = mix(salt ^ mix((uint64_t)r * 1000003u + i));
    if (h % 16 == 0)
        return (h >> 8) & 1 ? -0.0f : 0.0f;
    float m = (float)((h >> 11) % 1000000) / 1e6f + 0.5f;
    int e = (int)((h >> 40) % 25) - 12;
    return ((h >> 4) & 1 ? -m : m) * ldexpf(1.0f, e);
}

static void det_put(void *buf, dt_dtype dt, size_t i, float v) {
    if (dt == DT_F32)
        ((float *)buf)[i] = v;
    else if (dt == DT_F16)
        ((_Float16 *)buf)[i] = (_Float16)v;
    else
        ((uint16_t *)buf)[i] = to_bf16(v);
}

/* a op b as the specification says: f32 arithmetic, 16-bit types widened
 * and rounded to nearest even after each step; min/max keep a unless b
 * compares strictly smaller/greater. */
static void det_step(void *acc, const void *x, size_t i, dt_dtype dt, dt_redop op) {
    float a, b;
    if (dt == DT_F32) {
        a = ((float *)acc)[i];
        b = ((const float *)x)[i];
    } else if (dt == DT_F16) {
        a = (float)((_Float16 *)acc)[i];
        b = (float)((const _Float16 *)x)[i];
    } else {
        a = from_bf16(((uint16_t *)acc)[i]);
        b = from_bf16(((const uint16_t *)x)[i]);
    }
    if (op == DT_MIN || op == DT_MAX) {
        bool take = op == DT_MIN ? b < a : b > a;
        if (take)
            memcpy((char *)acc + i * dt_dtype_size(dt), (const char *)x + i * dt_dtype_size(dt),
                   dt_dtype_size(dt));
        return;
    }
    det_put(acc, dt, i, a + b);
}

static void det_avg(void *acc, size_t i, dt_dtype dt, int n) {
    if (dt == DT_F32)
        ((float *)acc)[i] *= 1.0f / (float)n;
    else if (dt == DT_F16)
        ((_Float16 *)acc)[i] = (_Float16)((float)((_Float16 *)acc)[i] / (float)n);
    else
        ((uint16_t *)acc)[i] = to_bf16(from_bf16(((uint16_t *)acc)[i]) / (float)n);
}

/* The canonical fold of elements [from, from + cnt) of every rank's input. */
static void det_reference(void *ref, int n, size_t from, size_t cnt, dt_dtype dt, dt_redop op,
                          uint64_t salt) {
    size_t es = dt_dtype_size(dt);
    char *x = malloc(cnt * es + 1);
    ASSERT_TRUE(x != NULL);
    for (size_t i = 0; i < cnt; i++)
        det_put(ref, dt, i, det_input(0, from + i, salt));
    for (int r = 1; r < n; r++) {
        for (size_t i = 0; i < cnt; i++)
            det_put(x, dt, i, det_input(r, from + i, salt));
        for (size_t i = 0; i < cnt; i++)
            det_step(ref, x, i, dt, op);
    }
    if (op == DT_AVG)
        for (size_t i = 0; i < cnt; i++)
            det_avg(ref, i, dt, n);
    free(x);
}

/* Compare bit for bit; returns the number of differing elements and
 * reports the first when `must_match`. */
static size_t det_compare(const char *what, const void *got, const void *want, size_t cnt,
                          dt_dtype dt, bool must_match) {
    size_t es = dt_dtype_size(dt), bad = 0;
    for (size_t i = 0; i < cnt; i++) {
        if (memcmp((const char *)got + i * es, (const char *)want + i * es, es) == 0)
            continue;
        if (must_match && bad == 0) {
            uint32_t g = 0, w = 0;
            memcpy(&g, (const char *)got + i * es, es);
            memcpy(&w, (const char *)want + i * es, es);
            TEST_FAILF("%s: element %zu: bits 0x%x, the rank-ordered fold gives 0x%x", what, i, g,
                       w);
        }
        bad++;
    }
    return bad;
}

/* One collective; returns how many elements differ from the fold. */
static size_t det_one(dt_group *g, dt_coll coll, dt_dtype dt, dt_redop op, size_t cnt, bool inplace,
                      uint64_t salt, const char *algo, bool must_match) {
    int n = dt_group_size(g), me = dt_group_rank(g);
    size_t es = dt_dtype_size(dt), N = (size_t)n;
    size_t total = coll == DT_COLL_ALLREDUCE ? cnt : N * cnt;
    char *in = malloc(total * es + 1), *out = malloc(total * es + 1), *ref = malloc(cnt * es + 1);
    ASSERT_TRUE(in && out && ref);
    for (size_t i = 0; i < total; i++)
        det_put(in, dt, i, det_input(me, i, salt));
    char what[200];
    snprintf(what, sizeof what, "%s %s %s count=%zu %s algo=%s n=%d rank=%d (%s)",
             dt_coll_name(coll), dt_dtype_name(dt), dt_redop_name(op), cnt,
             inplace ? "in-place" : "out-of-place", algo, n, me, dt_group_transport(g));
    char *dst = inplace ? in : out;
    dt_status st = coll == DT_COLL_ALLREDUCE ? dt_group_allreduce(g, in, dst, cnt, dt, op)
                                             : dt_group_reduce_scatter(g, in, dst, cnt, dt, op);
    if (st != DT_OK)
        TEST_FAILF("%s: %s: %s", what, dt_status_name(st), dt_last_error());
    size_t from = coll == DT_COLL_ALLREDUCE ? 0 : (size_t)me * cnt;
    const char *res = coll == DT_COLL_REDUCE_SCATTER && inplace ? in + from * es : dst;
    det_reference(ref, n, from, cnt, dt, op, salt);
    size_t bad = det_compare(what, res, ref, cnt, dt, must_match);
    free(in);
    free(out);
    free(ref);
    return bad;
}

static void det_layout(int rank, int size) {
    const char *nodes = getenv("DT_TEST_NODES");
    if (nodes) { /* simulated hosts: shm inside each, tcp between */
        char node[16];
        snprintf(node, sizeof node, "%d", rank * atoi(nodes) / size);
        setenv("DT_NODE_RANK", node, 1);
    }
}

static void det_sweep(int rank, int size) {
    det_layout(rank, size);
    dt_group *world = NULL;
    ASSERT_OK(dt_group_init_from_env(&world));
    int ran = 0;
    for (int a = 0; a < DT_ALGO_COUNT; a++) {
        const char *algo = dt_algo_name((dt_algo)a);
        setenv("DT_ALGO", algo, 1);
        dt_group *g = NULL;
        ASSERT_OK(dt_group_split(world, 0, rank, &g));
        dt_algo want = dt_group_transport(g)[0] == 's' && !strchr(dt_group_transport(g), '+')
                           ? DT_ALGO_DIRECT
                           : DT_ALGO_ORDERED;
        if (size > 1)
            ASSERT_EQ(dt_group_algo_for(g, DT_COLL_ALLREDUCE, 1 << 20), want);
        for (int c = 0; c < 2; c++)
            for (size_t d = 0; d < sizeof det_dtypes / sizeof *det_dtypes; d++)
                for (size_t o = 0; o < sizeof det_ops / sizeof *det_ops; o++)
                    for (size_t k = 0; k < sizeof det_counts / sizeof *det_counts; k++)
                        for (int ip = 0; ip < 2; ip++) {
                            /* the largest count once per algorithm and collective */
                            if (k == 5 && (d != 0 || o != (size_t)(a % 4) || ip != a % 2))
                                continue;
                            dt_coll coll = c ? DT_COLL_REDUCE_SCATTER : DT_COLL_ALLREDUCE;
                            uint64_t salt =
                                mix(((uint64_t)d << 16) ^ (o << 8) ^ k ^ ((uint64_t)c << 24));
                            det_one(g, coll, det_dtypes[d], det_ops[o], det_counts[k], ip == 1,
                                    salt, algo, true);
                            ran++;
                            if (size > 1 && det_counts[k])
                                ASSERT_EQ(dt_group_last_algo(g), want);
                        }
        ASSERT_OK(dt_group_barrier(g));
        dt_group_destroy(g);
    }
    if (rank == 0)
        printf("rank 0: %d collectives bit-identical to the rank-ordered fold, transport %s\n", ran,
               dt_group_transport(world));
    dt_group_destroy(world);
}

/* Without the mode, the ring's order shows in the bits of these inputs. */
static void det_control(int rank, int size) {
    det_layout(rank, size);
    dt_group *g = NULL;
    ASSERT_OK(dt_group_init_from_env(&g));
    size_t bad = det_one(g, DT_COLL_ALLREDUCE, DT_F32, DT_SUM, 4099, false, 7, "ring", false);
    ASSERT_EQ(dt_group_last_algo(g), DT_ALGO_RING);
    if (bad == 0)
        TEST_FAILF("ring over %d ranks matched the rank-ordered fold on every element: the "
                   "inputs do not expose reduction order",
                   size);
    if (rank == 0)
        printf("rank 0: without DT_DETERMINISTIC the ring differs from the fold on %zu of 4099 "
               "elements\n",
               bad);
    dt_group_destroy(g);
}

/* Tiny chunks and windows on some cases, so pieces, slots and the
 * windowed direct path are exercised; the single-copy direct path on one. */
#define DET(name, n, a, b, c)                                                                      \
    { name, n, det_sweep, {"DT_DETERMINISTIC=1", a, b, c, NULL}, -1, 120 }
static const hcase cases[] = {
    DET("shm_2", 2, "DT_TRANSPORT=auto", NULL, NULL),
    DET("shm_3", 3, "DT_TRANSPORT=auto", "DT_SHM_WINDOW=64K", "DT_SHM_CMA=off"),
    DET("shm_4", 4, "DT_TRANSPORT=auto", "DT_SHM_CMA=on", "DT_SHM_CMA_MIN=1"),
    DET("tcp_2", 2, "DT_TRANSPORT=tcp", NULL, NULL),
    DET("tcp_3", 3, "DT_TRANSPORT=tcp", "DT_CHUNK_SIZE=4096", NULL),
    DET("tcp_4", 4, "DT_TRANSPORT=tcp", NULL, NULL),
    DET("hosts_4", 4, "DT_TEST_NODES=2", "DT_CHUNK_SIZE=8192", NULL),
    DET("hosts_5", 5, "DT_TEST_NODES=2", NULL, NULL),
    {"ctl_tcp_3", 3, det_control, {"DT_TRANSPORT=tcp", "DT_ALGO=ring", NULL}, -1, 60},
};

int main(int argc, char **argv) {
    return harness_main(argc, argv, cases, (int)(sizeof cases / sizeof cases[0]));
}
