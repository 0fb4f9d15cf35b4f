/*
 * test_ddp_priority.c — DDP's critical-path-first schedule
 * (dt_ddp_options.priority = DT_COMM_PRIORITY_CRITICAL) with real ranks:
 *
 *   order_tcp_2   three buckets made final one at a time, each only once
 *                 the one before has started going out: every piece within
 *                 --comm-piece, the buffer covered exactly once, each
 *                 bucket's pieces in offset order; a bucket nearer the front,
 *                 once started, is never interrupted by one behind it; the
 *                 tail bucket IS interrupted (pre-emption seen in the
 *                 timestamps); the averages have the same bits as a FIFO
 *                 DDP's on the same inputs and match a serial average. Then
 *                 a deferred step: finish_later, take of the front bucket
 *                 hands out exactly that one, settle the rest, each once.
 *   merge_shm_3   buckets smaller than a piece, final together: pieces span
 *                 several buckets (merged); the same bits as FIFO (direct,
 *                 rank order).
 *   det_tcp_3     3 ranks over TCP with DT_DETERMINISTIC=1: the same bits as
 *                 FIFO (without the mode the ring's bits depend on the cut).
 *   dead_tcp_2    a rank killed in the middle of a critical step: the
 *                 survivor's finish fails naming it, within DT_TIMEOUT.
 */
#include "comm/harness.h"
#include "dtrain/parallel.h"

#include <math.h>
#include <string.h>
#include <unistd.h>

static dt_group *join(void) {
    dt_group *g;
    ASSERT_OK(dt_group_init_from_env(&g));
    return g;
}

/* Rank r's gradient: values that are not exact in any order of addition. */
static void fill(float *g, size_t n, int rank, int step) {
    for (size_t i = 0; i < n; i++)
        g[i] = (float)(sin(0.001 * (double)i + rank + 0.37 * step) * (1.0 + 0.01 * rank) + 1e-3);
}

typedef struct handed {
    size_t begin[64], end[64];
    int n;
} handed;

static void note(void *user, size_t begin, size_t end) {
    handed *h = user;
    ASSERT_TRUE(h->n < 64);
    h->begin[h->n] = begin;
    h->end[h->n++] = end;
}

static size_t bucket_of(const dt_ddp *d, size_t off) {
    for (size_t i = 0; i < dt_ddp_num_buckets(d); i++) {
        size_t b, e;
        dt_ddp_bucket(d, i, &b, &e);
        if (off >= b && off < e)
            return i;
    }
    TEST_FAILF("offset %zu in no bucket", off);
    return 0;
}

/* The pieces cover [0, n) once, each at most `piece` floats. */
static void check_cover(const dt_ddp_piece *pc, size_t np, size_t n, size_t piece) {
    unsigned char *seen = calloc(n, 1);
    ASSERT_TRUE(seen != NULL);
    for (size_t k = 0; k < np; k++) {
        ASSERT_TRUE(pc[k].begin < pc[k].end && pc[k].end <= n);
        ASSERT_TRUE(pc[k].end - pc[k].begin <= piece);
        ASSERT_TRUE(pc[k].t_start <= pc[k].t_end);
        for (size_t i = pc[k].begin; i < pc[k].end; i++) {
            ASSERT_EQ(seen[i], 0);
            seen[i] = 1;
        }
    }
    for (size_t i = 0; i < n; i++)
        ASSERT_EQ(seen[i], 1);
    free(seen);
}

/* FIFO on the same inputs: the reference bits. */
static float *fifo_result(dt_group *g, size_t n, size_t bucket_bytes, int rank, int step) {
    float *p = calloc(n, sizeof *p), *x = malloc(n * sizeof *x);
    ASSERT_TRUE(p && x);
    fill(x, n, rank, step);
    dt_ddp *d;
    ASSERT_OK(dt_ddp_create(&d, g, p, x, n, bucket_bytes));
    dt_ddp_begin(d, true);
    dt_ddp_grad_ready(d, 0);
    ASSERT_OK(dt_ddp_finish(d, NULL, NULL));
    dt_ddp_destroy(d);
    free(p);
    return x;
}

static dt_ddp *critical(dt_group *g, float *p, float *x, size_t n, size_t bucket_bytes,
                        size_t piece_bytes) {
    dt_ddp_options o = dt_ddp_options_default();
    o.bucket_bytes = bucket_bytes;
    o.priority = DT_COMM_PRIORITY_CRITICAL;
    o.piece_bytes = piece_bytes;
    dt_ddp *d;
    ASSERT_OK(dt_ddp_create_with(&d, g, p, x, n, &o));
    return d;
}

/* Wait until some piece of the current step begins below `below`. */
static void wait_piece_below(const dt_ddp *d, size_t below) {
    double t0 = dt_now();
    for (;;) {
        size_t np;
        int na;
        const dt_ddp_piece *pc = dt_ddp_pieces(d, &np, &na);
        for (size_t k = 0; k < np; k++)
            if (pc[k].begin < below)
                return;
        ASSERT_TRUE(dt_now() - t0 < 30);
        usleep(50);
    }
}

static void order_tcp_2(int rank, int size) {
    (void)size;
    dt_group *g = join();
    const size_t per = 1u << 19, n = 3 * per, piece = 1024; /* 2 MiB buckets, 4 KiB pieces */
    float *p = calloc(n, sizeof *p), *x = malloc(n * sizeof *x);
    ASSERT_TRUE(p && x);
    dt_ddp *d = critical(g, p, x, n, per * sizeof(float), piece * sizeof(float));
    ASSERT_EQ(dt_ddp_num_buckets(d), 3);
    fill(x, n, rank, 0);
    /* Backward: bucket 0 (the tail) final; bucket 1 once bucket 0 is on
     * the wire on this rank; everything once bucket 1 is. */
    dt_ddp_begin(d, true);
    dt_ddp_grad_ready(d, 2 * per);
    wait_piece_below(d, n);
    dt_ddp_grad_ready(d, per);
    wait_piece_below(d, 2 * per);
    dt_ddp_grad_ready(d, 0);
    handed h = {0};
    ASSERT_OK(dt_ddp_finish(d, note, &h));
    ASSERT_EQ(h.n, 3); /* every bucket handed out once, in bucket order */
    for (int i = 0; i < 3; i++)
        ASSERT_EQ(h.end[i], n - (size_t)i * per);

    size_t np;
    int na;
    const dt_ddp_piece *pc = dt_ddp_pieces(d, &np, &na);
    check_cover(pc, np, n, piece);
    ASSERT_TRUE(na >= 3); /* at least one agreement per bucket made final */
    size_t last_off[3] = {0}, first_at[3], last_at[3];
    bool started[3] = {false}, finished[3] = {false};
    size_t left[3] = {per, per, per};
    for (size_t k = 0; k < np; k++) {
        size_t b = bucket_of(d, pc[k].begin);
        ASSERT_EQ(bucket_of(d, pc[k].end - 1), b); /* none spans buckets here */
        /* Front first: while a bucket nearer the front (higher index) is
         * started and unfinished, nothing behind it goes. */
        for (size_t j = b + 1; j < 3; j++)
            ASSERT_TRUE(!started[j] || finished[j]);
        ASSERT_TRUE(!started[b] || pc[k].begin >= last_off[b]); /* offset order within */
        if (!started[b])
            first_at[b] = k;
        started[b] = true;
        last_off[b] = pc[k].end;
        last_at[b] = k;
        left[b] -= pc[k].end - pc[k].begin;
        finished[b] = left[b] == 0;
    }
    /* Pre-emption: bucket 1 went out while bucket 0 was unfinished, bucket 2
     * while bucket 1 was (bucket 0 has 512 pieces of ~0.1 ms each, far more
     * than the time this rank takes to notice its first piece). */
    ASSERT_TRUE(first_at[1] < last_at[0]);
    ASSERT_TRUE(first_at[2] < last_at[0]);
    ASSERT_TRUE(pc[first_at[1]].t_start < pc[last_at[0]].t_start);
    if (rank == 0)
        printf("  %zu pieces, %d agreements: bucket 0 pieces %zu..%zu, bucket 1 %zu..%zu, bucket "
               "2 %zu..%zu\n",
               np, na, first_at[0], last_at[0], first_at[1], last_at[1], first_at[2], last_at[2]);
    float *ref = fifo_result(g, n, per * sizeof(float), rank, 0);
    ASSERT_TRUE(memcmp(ref, x, n * sizeof *x) == 0);
    float *y = malloc(n * sizeof *y);
    ASSERT_TRUE(y != NULL);
    for (int r = 0; r < 2; r++) {
        fill(y, n, r, 0);
        for (size_t i = 0; i < n; i++)
            ref[i] = r == 0 ? y[i] : (ref[i] + y[i]) / 2;
    }
    for (size_t i = 0; i < n; i++)
        ASSERT_NEAR(x[i], ref[i], 1e-6, 1e-6);

    /* A deferred step: the front bucket first, then the rest. */
    fill(x, n, rank, 1);
    dt_ddp_begin(d, true);
    dt_ddp_grad_ready(d, 0);
    ASSERT_OK(dt_ddp_finish_later(d));
    ASSERT_TRUE(dt_ddp_pending(d));
    handed t = {0};
    ASSERT_OK(dt_ddp_take(d, 0, 10, note, &t)); /* the front bucket alone */
    ASSERT_EQ(t.n, 1);
    ASSERT_EQ(t.begin[0], 0);
    ASSERT_OK(dt_ddp_take(d, 0, 10, note, &t)); /* not again */
    ASSERT_EQ(t.n, 1);
    ASSERT_OK(dt_ddp_settle(d, note, &t));
    ASSERT_EQ(t.n, 3);
    ASSERT_EQ(t.end[1], n);
    ASSERT_EQ(t.end[2], n - per);
    ASSERT_TRUE(!dt_ddp_pending(d));
    ASSERT_TRUE(dt_ddp_last_stats(d)->comm_ms > 0);
    float *ref1 = fifo_result(g, n, per * sizeof(float), rank, 1);
    ASSERT_TRUE(memcmp(ref1, x, n * sizeof *x) == 0);
    dt_ddp_destroy(d);
    free(ref);
    free(ref1);
    free(y);
    free(p);
    free(x);
    dt_group_destroy(g);
}

/* All at once, buckets of 1000 floats, pieces of 4000. */
static void merged(int rank, bool expect_merge) {
    dt_group *g = join();
    const size_t n = 10007, per = 1000, piece = 4000;
    float *p = calloc(n, sizeof *p), *x = malloc(n * sizeof *x);
    ASSERT_TRUE(p && x);
    dt_ddp *d = critical(g, p, x, n, per * sizeof(float), piece * sizeof(float));
    for (int step = 0; step < 3; step++) {
        fill(x, n, rank, step);
        dt_ddp_begin(d, true);
        for (size_t r = n; r > 700; r -= 700) /* a model's blocks */
            dt_ddp_grad_ready(d, r - 700);
        dt_ddp_grad_ready(d, 0);
        ASSERT_OK(dt_ddp_finish(d, NULL, NULL));
        size_t np;
        int na;
        const dt_ddp_piece *pc = dt_ddp_pieces(d, &np, &na);
        check_cover(pc, np, n, piece);
        size_t spans = 0;
        for (size_t k = 0; k < np; k++)
            spans += bucket_of(d, pc[k].begin) != bucket_of(d, pc[k].end - 1);
        if (expect_merge)
            ASSERT_TRUE(spans > 0);
        float *ref = fifo_result(g, n, per * sizeof(float), rank, step);
        ASSERT_TRUE(memcmp(ref, x, n * sizeof *x) == 0);
        free(ref);
    }
    dt_ddp_destroy(d);
    free(p);
    free(x);
    dt_group_destroy(g);
}

static void merge_shm_3(int rank, int size) {
    (void)size;
    merged(rank, true);
}

static void det_tcp_3(int rank, int size) {
    (void)size;
    merged(rank, false);
}

static void dead_tcp_2(int rank, int size) {
    (void)size;
    dt_group *g = join();
    const size_t n = 1u << 20;
    float *p = calloc(n, sizeof *p), *x = malloc(n * sizeof *x);
    ASSERT_TRUE(p && x);
    dt_ddp *d = critical(g, p, x, n, n, 4096);
    fill(x, n, rank, 0);
    dt_ddp_begin(d, true);
    dt_ddp_grad_ready(d, n / 2);
    if (rank == 1) {
        wait_piece_below(d, n);
        raise(SIGKILL);
    }
    dt_ddp_grad_ready(d, 0);
    double t0 = dt_now();
    ASSERT_STATUS(dt_ddp_finish(d, NULL, NULL), DT_ERR_PEER);
    ASSERT_CONTAINS(dt_last_error(), "rank 1");
    ASSERT_TRUE(dt_now() - t0 < 10);
    dt_ddp_destroy(d);
    free(p);
    free(x);
    dt_group_abort(g);
    dt_group_destroy(g);
}

static const hcase cases[] = {
    {"order_tcp_2", 2, order_tcp_2, {"DT_TRANSPORT=tcp", NULL}, -1, 60},
    {"merge_shm_3", 3, merge_shm_3, {NULL}, -1, 60},
    {"det_tcp_3", 3, det_tcp_3, {"DT_TRANSPORT=tcp", "DT_DETERMINISTIC=1", NULL}, -1, 60},
    {"dead_tcp_2", 2, dead_tcp_2, {"DT_TRANSPORT=tcp", "DT_TIMEOUT=20", NULL}, 1, 60},
};

int main(int argc, char **argv) {
    return harness_main(argc, argv, cases, (int)(sizeof cases / sizeof cases[0]));
}
