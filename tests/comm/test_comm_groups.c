/*
 * test_comm_groups.c — sub-groups, two groups used concurrently from two
 * threads, 100 outstanding non-blocking operations, tagged send/recv,
 * batched send/recv (large ring exchanges, a pipeline's pairs), a
 * hierarchical (two simulated hosts) group, and dt_group_abort().
 * Every case runs real processes over loopback (harness.h).
 */
#include "harness.h"

#include <pthread.h>

static dt_group *init_world(void) {
    dt_group *g = NULL;
    ASSERT_OK(dt_group_init_from_env(&g));
    return g;
}

/* sum over ranks r of (r + 1) * (i % 13 + 1) */
static void check_sum(const int32_t *v, size_t n, int size, int32_t scale, const char *what) {
    int32_t tri = size * (size + 1) / 2;
    for (size_t i = 0; i < n; i++)
        if (v[i] != tri * (int32_t)(i % 13 + 1) * scale)
            TEST_FAILF("%s: element %zu = %d, want %d", what, i, v[i],
                       tri * (int32_t)(i % 13 + 1) * scale);
}

static void fill(int32_t *v, size_t n, int rank, int32_t scale) {
    for (size_t i = 0; i < n; i++)
        v[i] = (rank + 1) * (int32_t)(i % 13 + 1) * scale;
}

static void split_case(int rank, int size) {
    dt_group *w = init_world();
    /* even / odd */
    dt_group *half = NULL;
    ASSERT_OK(dt_group_split(w, rank % 2, rank, &half));
    ASSERT_EQ(dt_group_size(half), (size + 1 - rank % 2) / 2);
    ASSERT_EQ(dt_group_rank(half), rank / 2);
    ASSERT_EQ(dt_group_world_rank(half, dt_group_rank(half)), rank);
    int32_t v = rank, sum = 0;
    ASSERT_OK(dt_group_allreduce(half, &v, &sum, 1, DT_I32, DT_SUM));
    int32_t want = 0;
    for (int r = rank % 2; r < size; r += 2)
        want += r;
    ASSERT_EQ(sum, want);
    /* reversed order by key; the last rank opts out */
    dt_group *rev = NULL;
    ASSERT_OK(dt_group_split(w, rank == size - 1 ? DT_UNDEFINED : 7, -rank, &rev));
    if (rank == size - 1) {
        ASSERT_TRUE(rev == NULL);
    } else {
        ASSERT_EQ(dt_group_size(rev), size - 1);
        ASSERT_EQ(dt_group_rank(rev), size - 2 - rank);
        int32_t b = rank == 0 ? 1234 : -1;
        ASSERT_OK(dt_group_broadcast(rev, &b, 1, DT_I32, dt_group_rank(rev) == 0 ? 0 : 0));
        ASSERT_EQ(b, size == 2 ? 1234 : b); /* root 0 of rev is world rank size-2 */
        int32_t root_val = rank == size - 2 ? 77 : 0;
        ASSERT_OK(dt_group_broadcast(rev, &root_val, 1, DT_I32, 0));
        ASSERT_EQ(root_val, 77);
    }
    /* nested split of a sub-group */
    dt_group *one = NULL;
    ASSERT_OK(dt_group_split(half, dt_group_rank(half), 0, &one));
    ASSERT_EQ(dt_group_size(one), 1);
    ASSERT_OK(dt_group_allreduce(one, &v, &sum, 1, DT_I32, DT_SUM));
    ASSERT_EQ(sum, rank);
    dt_group_destroy(one);
    dt_group_destroy(rev);
    dt_group_destroy(half);
    ASSERT_OK(dt_group_barrier(w));
    dt_group_destroy(w);
}

typedef struct thr_arg {
    dt_group *g;
    int rank, size, iters;
    int32_t scale;
    dt_status st;
} thr_arg;

static void *hammer(void *p) {
    thr_arg *a = p;
    size_t n = 100003;
    int32_t *v = malloc(n * sizeof *v);
    for (int it = 0; it < a->iters && a->st == DT_OK; it++) {
        fill(v, n, a->rank, a->scale + it);
        a->st = dt_group_allreduce(a->g, v, v, n, DT_I32, DT_SUM);
        if (a->st == DT_OK)
            check_sum(v, n, a->size, a->scale + it, "concurrent group");
    }
    free(v);
    return NULL;
}

static void concurrent_case(int rank, int size) {
    dt_group *w = init_world();
    dt_group *a = NULL, *b = NULL;
    ASSERT_OK(dt_group_split(w, 0, rank, &a));
    ASSERT_OK(dt_group_split(w, 0, rank, &b));
    thr_arg ta = {a, rank, size, 20, 1, DT_OK}, tb = {b, rank, size, 20, 1000, DT_OK};
    pthread_t t1, t2;
    pthread_create(&t1, NULL, hammer, &ta);
    pthread_create(&t2, NULL, hammer, &tb);
    pthread_join(t1, NULL);
    pthread_join(t2, NULL);
    ASSERT_OK(ta.st);
    ASSERT_OK(tb.st);
    dt_group_destroy(a);
    dt_group_destroy(b);
    dt_group_destroy(w);
}

static void outstanding_case(int rank, int size) {
    dt_group *w = init_world();
    enum { K = 100 };
    size_t n = 777;
    int32_t *bufs = malloc(K * n * sizeof *bufs);
    dt_work *works[K];
    for (int k = 0; k < K; k++) {
        fill(bufs + k * n, n, rank, k + 1);
        ASSERT_OK(dt_group_iallreduce(w, bufs + k * n, bufs + k * n, n, DT_I32, DT_SUM, &works[k]));
    }
    /* the queue completes in order: poll the last one until done */
    bool done = false;
    double t0 = dt_now();
    while (!done && dt_now() - t0 < 30) {
        ASSERT_OK(dt_work_test(works[K - 1], &done));
        if (!done)
            dt_sleep_ms(1);
    }
    ASSERT_TRUE(done);
    for (int k = 0; k < K; k++) {
        bool d = false;
        ASSERT_OK(dt_work_test(works[k], &d));
        ASSERT_TRUE(d); /* issue order: everything before the last is done */
        ASSERT_OK(dt_work_wait(works[k]));
        check_sum(bufs + k * n, n, size, k + 1, "outstanding");
    }
    /* a mix of kinds outstanding at once */
    dt_work *mix[4];
    int32_t g[64], s = rank, b = rank == 1 ? 5 : 0, x = 1;
    ASSERT_OK(dt_group_iallgather(w, &s, g, 1, DT_I32, &mix[0]));
    ASSERT_OK(dt_group_ibroadcast(w, &b, 1, DT_I32, 1 % size, &mix[1]));
    ASSERT_OK(dt_group_ibarrier(w, &mix[2]));
    ASSERT_OK(dt_group_iallreduce(w, &x, &x, 1, DT_I32, DT_MAX, &mix[3]));
    for (int i = 0; i < 4; i++)
        ASSERT_OK(dt_work_wait(mix[i]));
    for (int r = 0; r < size; r++)
        ASSERT_EQ(g[r], r);
    ASSERT_EQ(b, size > 1 ? 5 : 0);
    ASSERT_EQ(x, 1);
    free(bufs);
    dt_group_destroy(w);
}

static void p2p_case(int rank, int size) {
    dt_group *w = init_world();
    int right = (rank + 1) % size, left = (rank + size - 1) % size;
    size_t n = 300001;
    int64_t *out = malloc(n * sizeof *out), *in = malloc(n * sizeof *in);
    for (size_t i = 0; i < n; i++)
        out[i] = (int64_t)rank * 1000000 + (int64_t)i;
    /* a ring of isend/irecv with a tag, posted in the same order everywhere:
     * even ranks send first, odd ranks receive first */
    dt_work *ws, *wr;
    if (rank % 2 == 0) {
        ASSERT_OK(dt_group_isend(w, out, n, DT_I64, right, 42, &ws));
        ASSERT_OK(dt_group_irecv(w, in, n, DT_I64, left, 42, &wr));
    } else {
        ASSERT_OK(dt_group_irecv(w, in, n, DT_I64, left, 42, &wr));
        ASSERT_OK(dt_group_isend(w, out, n, DT_I64, right, 42, &ws));
    }
    ASSERT_OK(dt_work_wait(ws));
    ASSERT_OK(dt_work_wait(wr));
    for (size_t i = 0; i < n; i += 997)
        ASSERT_EQ(in[i], (int64_t)left * 1000000 + (int64_t)i);
    /* blocking pair 0 -> last, zero length */
    if (rank == 0)
        ASSERT_OK(dt_group_send(w, NULL, 0, DT_F32, size - 1, 7));
    if (rank == size - 1)
        ASSERT_OK(dt_group_recv(w, NULL, 0, DT_F32, 0, 7));
    /* bad arguments are refused before anything is sent */
    ASSERT_STATUS(dt_group_send(w, out, 1, DT_I64, rank, 1), DT_ERR_INVALID);
    ASSERT_STATUS(dt_group_broadcast(w, out, 1, DT_I64, size), DT_ERR_INVALID);
    ASSERT_STATUS(dt_group_allreduce(w, out, in, 1, (dt_dtype)99, DT_SUM), DT_ERR_INVALID);
    ASSERT_CONTAINS(dt_last_error(), "dtype");
    ASSERT_OK(dt_group_barrier(w));
    free(out);
    free(in);
    dt_group_destroy(w);
}

/* Batched point-to-point (dt_group_sendrecv_batch): every rank sends to
 * and receives from both ring neighbours in one batch, large messages
 * included (sent one after the other without a batch, every rank would
 * first wait to send); a pipeline's send-forward / receive-backward pairs
 * for 3 micro-batches with their tags, non-blocking with an allreduce
 * issued behind it; a zero-length transfer; mismatched tags named; bad
 * arguments refused. */
static void batch_case(int rank, int size) {
    dt_group *w = init_world();
    int right = (rank + 1) % size, left = (rank + size - 1) % size;
    const size_t counts[] = {0, 1, 4097, (size_t)3 << 20}; /* up to 24 MiB of i64 */
    for (size_t k = 0; k < sizeof counts / sizeof counts[0]; k++) {
        size_t n = counts[k];
        int64_t *to_r = malloc((n + 1) * sizeof(int64_t)),
                *to_l = malloc((n + 1) * sizeof(int64_t));
        int64_t *from_l = malloc((n + 1) * sizeof(int64_t)),
                *from_r = malloc((n + 1) * sizeof(int64_t));
        for (size_t i = 0; i < n; i++) {
            to_r[i] = (int64_t)rank * 1000000007 + (int64_t)i;
            to_l[i] = -((int64_t)rank * 1000000007 + (int64_t)i);
        }
        /* Each rank lists its transfers in its own order: matching is per
         * peer and direction, not by position in the batch. */
        dt_p2p ops[4] = {
            {.send = true, .buf = to_r, .count = n, .dtype = DT_I64, .peer = right, .tag = 1},
            {.send = false, .buf = from_l, .count = n, .dtype = DT_I64, .peer = left, .tag = 1},
            {.send = true, .buf = to_l, .count = n, .dtype = DT_I64, .peer = left, .tag = 2},
            {.send = false, .buf = from_r, .count = n, .dtype = DT_I64, .peer = right, .tag = 2}};
        if (rank % 2) {
            dt_p2p t = ops[0];
            ops[0] = ops[3];
            ops[3] = t;
        }
        /* With two ranks left == right: both directions of each pair are
         * then two messages to the same peer, matched in order (tag 1 first
         * on both sides, as the tag check confirms). */
        if (size == 2 && rank % 2) {
            dt_p2p t = ops[0];
            ops[0] = ops[3];
            ops[3] = t;
        }
        ASSERT_OK(dt_group_sendrecv_batch(w, ops, 4));
        for (size_t i = 0; i < n; i += 1 + n / 257) {
            ASSERT_EQ(from_l[i], (int64_t)left * 1000000007 + (int64_t)i);
            ASSERT_EQ(from_r[i], -((int64_t)right * 1000000007 + (int64_t)i));
        }
        free(to_r), free(to_l), free(from_l), free(from_r);
    }
    /* A pipeline: rank r sends activations forward to r+1 and receives
     * gradients back from r+1, both in one batch per micro-batch. */
    enum { MB = 3, NA = 100003 };
    float *act = malloc(NA * sizeof(float)), *grad = malloc(NA * sizeof(float));
    float *act_in = malloc(NA * sizeof(float)), *grad_in = malloc(NA * sizeof(float));
    for (int mb = 0; mb < MB; mb++) {
        for (size_t i = 0; i < NA; i++) {
            act[i] = (float)(rank * 100 + mb) + (float)(i % 7);
            grad[i] = -(float)(rank * 100 + mb) - (float)(i % 5);
        }
        dt_p2p ops[4];
        size_t k = 0;
        if (rank + 1 < size) {
            ops[k++] = (dt_p2p){true, act, NA, DT_F32, rank + 1, 10 + mb};
            ops[k++] = (dt_p2p){false, grad_in, NA, DT_F32, rank + 1, 20 + mb};
        }
        if (rank > 0) {
            ops[k++] = (dt_p2p){false, act_in, NA, DT_F32, rank - 1, 10 + mb};
            ops[k++] = (dt_p2p){true, grad, NA, DT_F32, rank - 1, 20 + mb};
        }
        dt_work *wk;
        ASSERT_OK(dt_group_isendrecv_batch(w, ops, k, &wk));
        int32_t one = 1, sum = 0;
        ASSERT_OK(dt_group_allreduce(w, &one, &sum, 1, DT_I32, DT_SUM)); /* queued behind it */
        ASSERT_EQ(sum, size);
        ASSERT_OK(dt_work_wait(wk));
        for (size_t i = 0; i < NA; i += 1009) {
            if (rank > 0)
                ASSERT_TRUE(act_in[i] == (float)((rank - 1) * 100 + mb) + (float)(i % 7));
            if (rank + 1 < size)
                ASSERT_TRUE(grad_in[i] == -(float)((rank + 1) * 100 + mb) - (float)(i % 5));
        }
    }
    free(act), free(grad), free(act_in), free(grad_in);
    ASSERT_OK(dt_group_sendrecv_batch(w, NULL, 0));
    /* Bad arguments: refused before anything is sent, naming the transfer. */
    int64_t x = 0;
    dt_p2p self = {true, &x, 1, DT_I64, rank, 0};
    ASSERT_STATUS(dt_group_sendrecv_batch(w, &self, 1), DT_ERR_INVALID);
    ASSERT_CONTAINS(dt_last_error(), "transfer 0: peer");
    dt_p2p nobuf = {false, NULL, 5, DT_I64, right, 0};
    ASSERT_STATUS(dt_group_sendrecv_batch(w, &nobuf, 1), DT_ERR_INVALID);
    ASSERT_CONTAINS(dt_last_error(), "NULL buffer");
    ASSERT_OK(dt_group_barrier(w));
    /* Mismatched tags between ranks 0 and 1: the receiver names both. */
    if (rank < 2) {
        dt_p2p op =
            rank == 0 ? (dt_p2p){true, &x, 1, DT_I64, 1, 5} : (dt_p2p){false, &x, 1, DT_I64, 0, 6};
        dt_status st = dt_group_sendrecv_batch(w, &op, 1);
        if (rank == 1) {
            ASSERT_EQ(st, DT_ERR_MISMATCH);
            ASSERT_CONTAINS(dt_last_error(), "tag 5");
            ASSERT_CONTAINS(dt_last_error(), "tag 6");
        }
    }
    dt_group_destroy(w);
}

static void hier_case(int rank, int size) {
    char node[8];
    snprintf(node, sizeof node, "%d", rank < size / 2 ? 0 : 1);
    setenv("DT_NODE_RANK", node, 1); /* two simulated hosts */
    dt_group *w = init_world();
    ASSERT_EQ(dt_group_local_size(w), size / 2);
    ASSERT_EQ(dt_group_local_rank(w), rank % (size / 2));
    ASSERT_STREQ(dt_group_transport(w), "shm+tcp");
    static const char *const algos[] = {"hier", "ring", "rhd", "tree", "auto"};
    for (int a = 0; a < 5; a++) {
        setenv("DT_ALGO", algos[a], 1);
        dt_group *g = NULL;
        ASSERT_OK(dt_group_split(w, 0, rank, &g));
        static const size_t ns[] = {1, 7, 1000, 1000003};
        for (int k = 0; k < 4; k++) {
            size_t n = ns[k];
            int32_t *v = malloc(n * sizeof *v);
            fill(v, n, rank, 3);
            ASSERT_OK(dt_group_allreduce(g, v, v, n, DT_I32, DT_SUM));
            check_sum(v, n, size, 3, algos[a]);
            if (a == 0)
                ASSERT_EQ(dt_group_last_algo(g), DT_ALGO_HIER);
            free(v);
        }
        /* the other collectives across hosts */
        int32_t all[16], mine = rank * 10;
        ASSERT_OK(dt_group_allgather(g, &mine, all, 1, DT_I32));
        for (int r = 0; r < size; r++)
            ASSERT_EQ(all[r], r * 10);
        dt_group_destroy(g);
    }
    dt_group_destroy(w);
}

typedef struct abort_arg {
    dt_group *g;
} abort_arg;

static void *aborter(void *p) {
    dt_sleep_ms(300);
    dt_group_abort(((abort_arg *)p)->g);
    return NULL;
}

static void abort_case(int rank, int size) {
    (void)size;
    dt_group *w = init_world();
    dt_group *g = NULL;
    ASSERT_OK(dt_group_split(w, 0, rank, &g));
    float x = 1;
    if (rank == 0) {
        /* rank 0 waits for a message nobody sends; another thread aborts */
        abort_arg a = {g};
        pthread_t t;
        pthread_create(&t, NULL, aborter, &a);
        double t0 = dt_now();
        dt_status st = dt_group_recv(g, &x, 1, DT_F32, 1, 5);
        pthread_join(t, NULL);
        ASSERT_STATUS(st, DT_ERR_ABORTED);
        ASSERT_TRUE(dt_now() - t0 < 5);
        ASSERT_STATUS(dt_group_barrier(g), DT_ERR_ABORTED); /* sticky */
    }
    /* the world group still works */
    ASSERT_OK(dt_group_barrier(w));
    if (rank != 0) {
        /* the others find out as soon as they need rank 0 */
        double t0 = dt_now();
        dt_status st = dt_group_broadcast(g, &x, 1, DT_F32, 0);
        if (st != DT_ERR_PEER && st != DT_ERR_ABORTED)
            TEST_FAILF("broadcast from an aborted root returned %s: %s", dt_status_name(st),
                       dt_last_error());
        ASSERT_TRUE(dt_now() - t0 < 5);
    }
    dt_group_destroy(g);
    dt_group_destroy(w);
}

#define C(name, n, fn, ...)                                                                        \
    { name, n, fn, {__VA_ARGS__}, -1, 120 }
static const hcase cases[] = {
    C("split_shm_4", 4, split_case, NULL),
    C("split_tcp_3", 3, split_case, "DT_TRANSPORT=tcp", NULL),
    C("concurrent_shm_3", 3, concurrent_case, NULL),
    C("concurrent_tcp_2", 2, concurrent_case, "DT_TRANSPORT=tcp", NULL),
    C("outstanding_shm_4", 4, outstanding_case, NULL),
    C("outstanding_tcp_3", 3, outstanding_case, "DT_TRANSPORT=tcp", NULL),
    C("p2p_shm_5", 5, p2p_case, NULL),
    C("p2p_tcp_4", 4, p2p_case, "DT_TRANSPORT=tcp", "DT_TCP_STRIPE_MIN=64K", NULL),
    C("batch_shm_2", 2, batch_case, NULL),
    C("batch_shm_4", 4, batch_case, NULL),
    C("batch_tcp_3", 3, batch_case, "DT_TRANSPORT=tcp", "DT_TCP_STRIPE_MIN=64K", NULL),
    C("hier_4", 4, hier_case, NULL),
    C("hier_6", 6, hier_case, NULL),
    C("abort_shm_2", 2, abort_case, NULL),
    C("abort_tcp_3", 3, abort_case, "DT_TRANSPORT=tcp", NULL),
};

int main(int argc, char **argv) {
    return harness_main(argc, argv, cases, (int)(sizeof cases / sizeof cases[0]));
}
