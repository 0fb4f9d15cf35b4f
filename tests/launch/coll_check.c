/*
 * coll_check.c — one rank of a collective correctness check that runs the
 * same under every way of starting a job: `dtrain launch -n N`, `mpirun -np
 * N` (DT_BACKEND=mpi or native with MPI bootstrap) and across network
 * namespaces. Uses only the public comm API.
 *
 *   coll_check [--expect-transport T] [--expect-hier] [--expect-backend B]
 *              [--die RANK]
 *
 * Every collective, every dtype and reduction, in place and out of place,
 * over counts {0, 1, 7, 1000, 65537}, roots 0 and size-1, a split into
 * even/odd ranks, and several overlapping non-blocking allreduces. Inputs
 * are small integers, so every expected value is exact in every dtype
 * (including f16/bf16) and computed here independently of comm. The first
 * wrong element is printed with both values and the rank exits 1.
 * --die RANK makes that rank exit 3 right after joining, while the others
 * are in an allreduce: the job must end quickly, naming it.
 */
#include "dtrain/comm.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int me, n;
static long checks;

#define FAIL(...)                                                                                  \
    do {                                                                                           \
        fprintf(stderr, "coll_check: rank %d: ", me);                                              \
        fprintf(stderr, __VA_ARGS__);                                                              \
        fprintf(stderr, "\n");                                                                     \
        exit(1);                                                                                   \
    } while (0)

#define OK(call)                                                                                   \
    do {                                                                                           \
        dt_status st__ = (call);                                                                   \
        if (st__ != DT_OK)                                                                         \
            FAIL("%s: %s: %s", #call, dt_status_name(st__), dt_last_error());                      \
    } while (0)

/* Exact conversions for small integers (|x| < 2048). */
static uint16_t to_f16(double x) {
    if (x == 0)
        return 0;
    uint16_t sign = x < 0 ? 0x8000 : 0;
    double a = x < 0 ? -x : x;
    int e = 0;
    while (a >= 2) {
        a /= 2;
        e++;
    }
    while (a < 1) {
        a *= 2;
        e--;
    }
    return (uint16_t)(sign | (uint16_t)((e + 15) << 10) | (uint16_t)((a - 1) * 1024));
}
static double from_f16(uint16_t h) {
    if ((h & 0x7fff) == 0)
        return 0;
    int e = ((h >> 10) & 31) - 15;
    double m = 1 + (h & 1023) / 1024.0;
    double v = m;
    for (; e > 0; e--)
        v *= 2;
    for (; e < 0; e++)
        v /= 2;
    return h & 0x8000 ? -v : v;
}
static uint16_t to_bf16(double x) {
    float f = (float)x;
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)(u >> 16);
}
static double from_bf16(uint16_t b) {
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static void put(void *buf, size_t i, dt_dtype t, double v) {
    switch (t) {
    case DT_F32: ((float *)buf)[i] = (float)v; break;
    case DT_F64: ((double *)buf)[i] = v; break;
    case DT_F16: ((uint16_t *)buf)[i] = to_f16(v); break;
    case DT_BF16: ((uint16_t *)buf)[i] = to_bf16(v); break;
    case DT_I8: ((int8_t *)buf)[i] = (int8_t)v; break;
    case DT_U8: ((uint8_t *)buf)[i] = (uint8_t)v; break;
    case DT_I32: ((int32_t *)buf)[i] = (int32_t)v; break;
    case DT_I64: ((int64_t *)buf)[i] = (int64_t)v; break;
    default: FAIL("bad dtype");
    }
}
static double get(const void *buf, size_t i, dt_dtype t) {
    switch (t) {
    case DT_F32: return ((const float *)buf)[i];
    case DT_F64: return ((const double *)buf)[i];
    case DT_F16: return from_f16(((const uint16_t *)buf)[i]);
    case DT_BF16: return from_bf16(((const uint16_t *)buf)[i]);
    case DT_I8: return ((const int8_t *)buf)[i];
    case DT_U8: return ((const uint8_t *)buf)[i];
    case DT_I32: return ((const int32_t *)buf)[i];
    case DT_I64: return (double)((const int64_t *)buf)[i];
    default: FAIL("bad dtype");
    }
}

/* Rank r's input element i: small non-negative integers. */
static double input(int r, size_t i, dt_redop op) {
    if (op == DT_PROD)
        return (double)((r + (int)i) % 2 + 1); /* 1 or 2: product <= 2^n */
    return (double)(i % 3 + 1 + 2 * (size_t)r);
}
static double expect_reduce(size_t i, dt_redop op, int size, const int *ranks) {
    double acc = op == DT_PROD ? 1 : op == DT_MIN ? 1e30 : op == DT_MAX ? -1e30 : 0;
    for (int k = 0; k < size; k++) {
        double v = input(ranks[k], i, op);
        if (op == DT_SUM || op == DT_AVG)
            acc += v;
        else if (op == DT_PROD)
            acc *= v;
        else if (op == DT_MIN)
            acc = v < acc ? v : acc;
        else
            acc = v > acc ? v : acc;
    }
    if (op == DT_AVG)
        acc = (double)(int64_t)(acc / size); /* exact: the sum is a multiple of size */
    return acc;
}

static void check_eq(const char *what, size_t i, double got, double want) {
    if (got != want)
        FAIL("%s: element %zu is %g, expected %g", what, i, got, want);
    checks++;
}

static const size_t counts[] = {0, 1, 7, 1000, 65537};
#define NCOUNTS (sizeof counts / sizeof counts[0])

static void test_allreduce(dt_group *g, const int *ranks) {
    int r = dt_group_rank(g), size = dt_group_size(g);
    for (int t = 0; t < DT_DTYPE_COUNT; t++) {
        size_t es = dt_dtype_size((dt_dtype)t);
        for (int op = 0; op < DT_REDOP_COUNT; op++) {
            /* AVG of integers: sums are multiples of size only for SUM-style
             * inputs; input() is built so that they are. */
            for (size_t c = 0; c < NCOUNTS; c++) {
                size_t cnt = counts[c];
                if (t != DT_F32 && cnt > 1000)
                    continue; /* the big count once per op is enough */
                char *send = malloc(cnt * es + 1), *recv = malloc(cnt * es + 1);
                for (int inplace = 0; inplace < 2; inplace++) {
                    for (size_t i = 0; i < cnt; i++)
                        put(send, i, (dt_dtype)t, input(ranks[r], i, (dt_redop)op));
                    char *out = inplace ? send : recv;
                    OK(dt_group_allreduce(g, send, out, cnt, (dt_dtype)t, (dt_redop)op));
                    char what[96];
                    snprintf(what, sizeof what, "allreduce %s %s count %zu%s",
                             dt_dtype_name((dt_dtype)t), dt_redop_name((dt_redop)op), cnt,
                             inplace ? " in place" : "");
                    for (size_t i = 0; i < cnt; i++)
                        check_eq(what, i, get(out, i, (dt_dtype)t),
                                 expect_reduce(i, (dt_redop)op, size, ranks));
                }
                free(send);
                free(recv);
            }
        }
    }
}

static void test_others(dt_group *g, const int *ranks) {
    int r = dt_group_rank(g), size = dt_group_size(g);
    const dt_dtype t = DT_I32;
    for (size_t c = 0; c < NCOUNTS; c++) {
        size_t cnt = counts[c] > 1000 ? 4099 : counts[c];
        size_t all = cnt * (size_t)size;
        int32_t *a = calloc(all + 1, 4), *b = calloc(all + 1, 4);
        char what[96];

        /* reduce_scatter: block k of rank r's send is input(r, k*cnt + i). */
        for (int inplace = 0; inplace < 2; inplace++) {
            for (size_t i = 0; i < all; i++)
                a[i] = (int32_t)input(ranks[r], i, DT_SUM);
            int32_t *out = inplace ? a : b;
            OK(dt_group_reduce_scatter(g, a, out, cnt, t, DT_SUM));
            int32_t *res = inplace ? a + (size_t)r * cnt : b;
            snprintf(what, sizeof what, "reduce_scatter count %zu%s", cnt,
                     inplace ? " in place" : "");
            for (size_t i = 0; i < cnt; i++)
                check_eq(what, i, res[i], expect_reduce((size_t)r * cnt + i, DT_SUM, size, ranks));
        }
        /* allgather */
        for (int inplace = 0; inplace < 2; inplace++) {
            int32_t *src = inplace ? b + (size_t)r * cnt : a;
            for (size_t i = 0; i < cnt; i++)
                src[i] = (int32_t)(ranks[r] * 100000 + (int)i);
            OK(dt_group_allgather(g, src, b, cnt, t));
            snprintf(what, sizeof what, "allgather count %zu%s", cnt, inplace ? " in place" : "");
            for (int k = 0; k < size; k++)
                for (size_t i = 0; i < cnt; i++)
                    check_eq(what, (size_t)k * cnt + i, b[(size_t)k * cnt + i],
                             ranks[k] * 100000 + (int)i);
        }
        for (int root = 0; root<size; root += size> 1 ? size - 1 : 1) {
            /* broadcast */
            for (size_t i = 0; i < cnt; i++)
                a[i] = r == root ? (int32_t)(7 * i + 3) : -1;
            OK(dt_group_broadcast(g, a, cnt, t, root));
            snprintf(what, sizeof what, "broadcast count %zu root %d", cnt, root);
            for (size_t i = 0; i < cnt; i++)
                check_eq(what, i, a[i], (double)(7 * i + 3));
            /* reduce */
            for (int inplace = 0; inplace < 2; inplace++) {
                for (size_t i = 0; i < cnt; i++)
                    a[i] = (int32_t)input(ranks[r], i, DT_MAX);
                int32_t *out = inplace ? a : b;
                OK(dt_group_reduce(g, a, out, cnt, t, DT_MAX, root));
                snprintf(what, sizeof what, "reduce max count %zu root %d%s", cnt, root,
                         inplace ? " in place" : "");
                if (r == root)
                    for (size_t i = 0; i < cnt; i++)
                        check_eq(what, i, out[i], expect_reduce(i, DT_MAX, size, ranks));
            }
            /* gather */
            for (size_t i = 0; i < cnt; i++)
                a[i] = (int32_t)(ranks[r] * 1000 + (int)i);
            OK(dt_group_gather(g, a, b, cnt, t, root));
            snprintf(what, sizeof what, "gather count %zu root %d", cnt, root);
            if (r == root)
                for (int k = 0; k < size; k++)
                    for (size_t i = 0; i < cnt; i++)
                        check_eq(what, (size_t)k * cnt + i, b[(size_t)k * cnt + i],
                                 ranks[k] * 1000 + (int)i);
            /* scatter */
            if (r == root)
                for (size_t i = 0; i < all; i++)
                    a[i] = (int32_t)(5 * i + 1);
            OK(dt_group_scatter(g, a, b, cnt, t, root));
            snprintf(what, sizeof what, "scatter count %zu root %d", cnt, root);
            for (size_t i = 0; i < cnt; i++)
                check_eq(what, i, b[i], (double)(5 * ((size_t)r * cnt + i) + 1));
        }
        /* alltoall: block k of rank j's send -> block j of rank k's recv */
        for (int inplace = 0; inplace < 2; inplace++) {
            for (int k = 0; k < size; k++)
                for (size_t i = 0; i < cnt; i++)
                    a[(size_t)k * cnt + i] = (int32_t)(ranks[r] * 10000 + k * 100 + (int)(i % 100));
            int32_t *out = inplace ? a : b;
            OK(dt_group_alltoall(g, a, out, cnt, t));
            snprintf(what, sizeof what, "alltoall count %zu%s", cnt, inplace ? " in place" : "");
            for (int j = 0; j < size; j++)
                for (size_t i = 0; i < cnt; i++)
                    check_eq(what, (size_t)j * cnt + i, out[(size_t)j * cnt + i],
                             ranks[j] * 10000 + r * 100 + (int)(i % 100));
        }
        /* send/recv between pairs (0,1), (2,3), ...: comm matches point-to-
         * point operations by their position in each rank's queue, so both
         * sides issue them in the same order and every rank takes part. */
        if (size % 2 == 0) {
            int peer = r ^ 1;
            for (size_t i = 0; i < cnt; i++)
                a[i] = (int32_t)(ranks[r] * 3 + (int)i);
            for (int step = 0; step < 2; step++) {
                if ((step == 0) == (r % 2 == 0))
                    OK(dt_group_send(g, a, cnt, t, peer, 5));
                else
                    OK(dt_group_recv(g, b, cnt, t, peer, 5));
            }
            snprintf(what, sizeof what, "send/recv count %zu", cnt);
            for (size_t i = 0; i < cnt; i++)
                check_eq(what, i, b[i], ranks[peer] * 3 + (int)i);
            /* The same exchange both ways at once, in one batch. */
            memset(b, 0, cnt * sizeof *b);
            dt_p2p ops[2] = {{true, a, cnt, t, peer, 9}, {false, b, cnt, t, peer, 9}};
            OK(dt_group_sendrecv_batch(g, ops, 2));
            snprintf(what, sizeof what, "sendrecv_batch count %zu", cnt);
            for (size_t i = 0; i < cnt; i++)
                check_eq(what, i, b[i], ranks[peer] * 3 + (int)i);
        }
        OK(dt_group_barrier(g));
        free(a);
        free(b);
    }
    /* Several non-blocking allreduces in flight at once. */
    enum { K = 4, C = 3001 };
    float *bufs[K];
    dt_work *w[K];
    for (int k = 0; k < K; k++) {
        bufs[k] = malloc(C * sizeof(float));
        for (size_t i = 0; i < C; i++)
            bufs[k][i] = (float)(input(ranks[r], i, DT_SUM) + k);
        OK(dt_group_iallreduce(g, bufs[k], bufs[k], C, DT_F32, DT_SUM, &w[k]));
    }
    for (int k = 0; k < K; k++) {
        OK(dt_work_wait(w[k]));
        for (size_t i = 0; i < C; i++)
            check_eq("overlapping iallreduce", i, bufs[k][i],
                     expect_reduce(i, DT_SUM, size, ranks) + (double)k * size);
        free(bufs[k]);
    }
}

int main(int argc, char **argv) {
    const char *expect_transport = NULL, *expect_backend = NULL;
    bool expect_hier = false;
    int die = -1;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--expect-transport") == 0 && i + 1 < argc)
            expect_transport = argv[++i];
        else if (strcmp(argv[i], "--expect-backend") == 0 && i + 1 < argc)
            expect_backend = argv[++i];
        else if (strcmp(argv[i], "--expect-hier") == 0)
            expect_hier = true;
        else if (strcmp(argv[i], "--die") == 0 && i + 1 < argc)
            die = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: coll_check [--expect-transport T] [--expect-backend B] "
                            "[--expect-hier] [--die RANK]\n");
            return 2;
        }
    }
    /* Until the group exists, name the rank the launcher gave us. */
    const char *er = getenv("DT_RANK") ? getenv("DT_RANK") : getenv("OMPI_COMM_WORLD_RANK");
    me = er ? atoi(er) : -1;
    dt_group *world = NULL;
    OK(dt_group_init_from_env(&world));
    me = dt_group_rank(world);
    n = dt_group_size(world);
    const char *backend = getenv("DT_BACKEND") ? getenv("DT_BACKEND") : "native";
    if (expect_backend && strcmp(expect_backend, backend) != 0)
        FAIL("DT_BACKEND is %s, expected %s", backend, expect_backend);
    if (expect_transport && strcmp(dt_group_transport(world), expect_transport) != 0)
        FAIL("transport is %s, expected %s", dt_group_transport(world), expect_transport);
    if (die >= 0) {
        if (me == die) {
            fprintf(stderr, "coll_check: rank %d: exiting with code 3 on purpose (--die)\n", me);
            exit(3);
        }
        float x[1024] = {0};
        dt_status st = dt_group_allreduce(world, x, x, 1024, DT_F32, DT_SUM);
        FAIL("allreduce with rank %d gone returned %s: %s", die, dt_status_name(st),
             dt_last_error());
    }
    int *ranks = malloc((size_t)n * sizeof *ranks);
    for (int k = 0; k < n; k++)
        ranks[k] = k;
    if (expect_hier) {
        /* Two hosts or more: the chooser picks the hierarchical allreduce
         * for a large message by default, and it is the one that runs. */
        size_t cnt = 1 << 20;
        dt_algo a = dt_group_algo_for(world, DT_COLL_ALLREDUCE, cnt * sizeof(float));
        if (a != DT_ALGO_HIER)
            FAIL("allreduce of %zu bytes: chooser picked %s, expected hier", cnt * sizeof(float),
                 dt_algo_name(a));
        float *x = malloc(cnt * sizeof(float));
        for (size_t i = 0; i < cnt; i++)
            x[i] = (float)input(me, i, DT_SUM);
        OK(dt_group_allreduce(world, x, x, cnt, DT_F32, DT_SUM));
        if (dt_group_last_algo(world) != DT_ALGO_HIER)
            FAIL("the allreduce ran %s, expected hier", dt_algo_name(dt_group_last_algo(world)));
        for (size_t i = 0; i < cnt; i++)
            check_eq("hier allreduce 4 MiB", i, x[i], expect_reduce(i, DT_SUM, n, ranks));
        free(x);
    }
    test_allreduce(world, ranks);
    test_others(world, ranks);
    /* Sub-groups: even and odd world ranks. */
    dt_group *half = NULL;
    OK(dt_group_split(world, me % 2, me, &half));
    int hn = dt_group_size(half), *hranks = malloc((size_t)hn * sizeof *hranks);
    for (int k = 0; k < hn; k++)
        hranks[k] = me % 2 + 2 * k;
    test_others(half, hranks);
    dt_group_destroy(half);
    printf("coll_check: rank %d of %d: %ld checks passed (backend %s, transport %s)\n", me, n,
           checks, backend, dt_group_transport(world));
    free(hranks);
    free(ranks);
    dt_group_destroy(world);
    return 0;
}
