/*
 * test_ddp_buckets.c — DDP bucket layout and launch order without peers:
 * buckets partition the buffer from its end, the backward hook starts
 * exactly the buckets that are complete, and finish hands every range to
 * the callback once, in order.
 */
#include "dtrain/parallel.h"
#include "test.h"

typedef struct seen {
    size_t begin[64], end[64];
    int n;
} seen;

static void record(void *user, size_t begin, size_t end) {
    seen *s = user;
    ASSERT_TRUE(s->n < 64);
    s->begin[s->n] = begin;
    s->end[s->n] = end;
    s->n++;
}

static void check_layout(size_t n, size_t bucket_bytes) {
    static float p[5000], g[5000];
    dt_ddp *d;
    ASSERT_OK(dt_ddp_create(&d, NULL, p, g, n, bucket_bytes));
    size_t per = bucket_bytes / 4, nb = dt_ddp_num_buckets(d);
    ASSERT_EQ(nb, n == 0 ? 0 : (n + per - 1) / per);
    size_t expect_end = n;
    for (size_t i = 0; i < nb; i++) {
        size_t b, e;
        dt_ddp_bucket(d, i, &b, &e);
        ASSERT_EQ(e, expect_end);
        ASSERT_TRUE(b < e && e - b <= per);
        expect_end = b;
    }
    ASSERT_EQ(expect_end, 0);

    /* Two micro-batches: the first does not communicate. Hook positions
     * like a model's blocks: every 37 floats from the end, then 0. */
    seen s = {0};
    dt_ddp_begin(d, false);
    for (size_t r = n; r > 37; r -= 37)
        dt_ddp_grad_ready(d, r - 37);
    dt_ddp_grad_ready(d, 0);
    dt_ddp_begin(d, true);
    for (size_t r = n; r > 37; r -= 37)
        dt_ddp_grad_ready(d, r - 37);
    dt_ddp_grad_ready(d, 0);
    ASSERT_OK(dt_ddp_finish(d, record, &s));
    ASSERT_EQ(s.n, nb);
    for (int i = 0; i < s.n; i++) {
        size_t b, e;
        dt_ddp_bucket(d, (size_t)i, &b, &e);
        ASSERT_EQ(s.begin[i], b);
        ASSERT_EQ(s.end[i], e);
    }
    const dt_ddp_stats *st = dt_ddp_last_stats(d);
    ASSERT_EQ(st->buckets, nb);
    ASSERT_EQ(st->bytes_sent, 0); /* alone: nothing sent */
    /* finish without any hook call starts everything itself. */
    s.n = 0;
    dt_ddp_begin(d, true);
    ASSERT_OK(dt_ddp_finish(d, record, &s));
    ASSERT_EQ(s.n, nb);
    ASSERT_OK(dt_ddp_broadcast_params(d));
    ASSERT_OK(dt_ddp_check_params(d, 1));
    double v[2] = {1.5, -2};
    ASSERT_OK(dt_ddp_average(d, v, 2));
    ASSERT_TRUE(v[0] == 1.5 && v[1] == -2);
    dt_ddp_destroy(d);
}

static void test_layouts(void) {
    check_layout(1000, 400);     /* 10 equal buckets */
    check_layout(1001, 400);     /* a 1-float bucket at the front */
    check_layout(5000, 1 << 20); /* one bucket */
    check_layout(7, 4);          /* one float per bucket */
    check_layout(0, 400);        /* nothing */
    dt_ddp_destroy(NULL);
    dt_ddp *d;
    float x;
    ASSERT_STATUS(dt_ddp_create(&d, NULL, &x, &x, 1, 3), DT_ERR_INVALID);
    ASSERT_CONTAINS(dt_last_error(), "bucket size 3 bytes");
}

/* dt_ddp_options: defaults, rejected combinations; one process applies no
 * codec (nothing to send, the gradient stays exact) and has no state. */
static void test_options(void) {
    dt_ddp_options o = dt_ddp_options_default();
    ASSERT_EQ(o.bucket_bytes, (size_t)DT_DDP_DEFAULT_BUCKET_BYTES);
    ASSERT_EQ(o.grad_dtype, DT_F32);
    ASSERT_EQ(o.codec.kind, DT_CODEC_NONE);
    ASSERT_EQ(o.ef, DT_EF_DEFAULT);
    static float p[100], g[100];
    dt_ddp *d;
    o.grad_dtype = DT_BF16;
    ASSERT_OK(dt_codec_parse("codec", "topk:0.1", &o.codec));
    ASSERT_STATUS(dt_ddp_create_with(&d, NULL, p, g, 100, &o), DT_ERR_INVALID);
    ASSERT_CONTAINS(dt_last_error(), "gradient dtype bf16 with codec topk:0.1: choose one");
    o.grad_dtype = DT_I32;
    o.codec.kind = DT_CODEC_NONE;
    ASSERT_STATUS(dt_ddp_create_with(&d, NULL, p, g, 100, &o), DT_ERR_INVALID);
    ASSERT_CONTAINS(dt_last_error(), "gradient dtype i32");
    o.grad_dtype = DT_F32;
    ASSERT_OK(dt_codec_parse("codec", "powersgd:2", &o.codec));
    o.bucket_bytes = 160;
    ASSERT_OK(dt_ddp_create_with(&d, NULL, p, g, 100, &o));
    ASSERT_EQ(dt_ddp_state_bytes(d), (size_t)0);
    ASSERT_OK(dt_ddp_set_state(d, NULL, 0));
    for (int i = 0; i < 100; i++)
        g[i] = (float)i;
    dt_ddp_begin(d, true);
    dt_ddp_grad_ready(d, 0);
    seen s = {.n = 0};
    ASSERT_OK(dt_ddp_finish(d, record, &s));
    ASSERT_EQ(s.n, 3);
    for (int i = 0; i < 100; i++)
        ASSERT_EQ(g[i], (float)i);
    dt_ddp_destroy(d);
}

int main(void) {
    RUN(test_layouts);
    RUN(test_options);
    return TEST_SUMMARY();
}
