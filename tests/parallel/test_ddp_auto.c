/*
 * test_ddp_auto.c — DDP's adaptive codec choice (dt_ddp_options.auto_codecs,
 * --compress auto) with real ranks:
 *
 *   agree_tcp_2   ranks whose backward runs at different speeds (so each
 *                 measures other times) make the same choice at every step,
 *                 and end with the same averaged gradients.
 *   carry_tcp_2   candidates topk:0.5 and int8 with error feedback: the first
 *                 step (nothing measured yet) runs the first candidate, the
 *                 next ones, with no backward to hide behind, switch buckets
 *                 to the faster int8; across the switch nothing is lost:
 *                 W x the sum of the outputs + every rank's residuals = the
 *                 sum of every rank's inputs.
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

static void fill(float *g, size_t n, int rank, int step) {
    for (size_t i = 0; i < n; i++)
        g[i] = (float)(sin(0.0007 * (double)i * (rank + 1) + 0.3 * step) * 1e-2);
}

static uint64_t hash_text(const char *s) {
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++)
        h = (h ^ (uint8_t)*s) * 1099511628211ull;
    return h;
}

/* Every rank holds the same value. */
static void same_everywhere(dt_group *g, uint64_t v, const char *what) {
    uint64_t all[2];
    ASSERT_OK(dt_group_allgather(g, &v, all, 1, DT_I64));
    if (all[0] != all[1])
        TEST_FAILF("%s differs between the ranks", what);
}

static dt_ddp *adaptive(dt_group *g, float *p, float *x, size_t n, const char *spec, dt_ef_mode ef,
                        dt_codec_auto *a) {
    ASSERT_OK(dt_codec_auto_parse("test", spec, a));
    dt_ddp_options o = dt_ddp_options_default();
    o.bucket_bytes = 64 << 10;
    o.auto_codecs = a;
    o.ef = ef;
    o.seed = 7;
    dt_ddp *d;
    ASSERT_OK(dt_ddp_create_with(&d, g, p, x, n, &o));
    return d;
}

static void agree_tcp_2(int rank, int size) {
    (void)size;
    dt_group *g = join();
    const size_t n = 200003;
    float *p = calloc(n, sizeof *p), *x = malloc(n * sizeof *x);
    ASSERT_TRUE(p && x);
    dt_codec_auto a;
    dt_ddp *d = adaptive(g, p, x, n, "auto", DT_EF_DEFAULT, &a);
    int kinds = 0;
    uint64_t seen[16];
    for (int step = 0; step < 8; step++) {
        fill(x, n, rank, step);
        dt_ddp_begin(d, true);
        for (size_t r = n; r > 20000; r -= 20000) {
            usleep(rank == 0 ? 500 : 1500); /* the ranks see different windows */
            dt_ddp_grad_ready(d, r - 20000);
        }
        dt_ddp_grad_ready(d, 0);
        ASSERT_OK(dt_ddp_finish(d, NULL, NULL));
        double link;
        const char *choice = dt_ddp_codec_choice(d, &link);
        ASSERT_TRUE(choice != NULL && choice[0] != '\0');
        same_everywhere(g, hash_text(choice), "the codec choice");
        same_everywhere(g, dt_hash64(x, n * sizeof *x, 0), "the averaged gradient");
        uint64_t h = hash_text(choice);
        bool known = false;
        for (int k = 0; k < kinds; k++)
            known |= seen[k] == h;
        if (!known && kinds < 16)
            seen[kinds++] = h;
        if (rank == 0)
            printf("  step %d: %s (link %.0f MB/s)\n", step + 1, choice, link / 1e6);
        if (step > 0)
            ASSERT_TRUE(link > 0); /* measured from the first step on */
    }
    dt_ddp_destroy(d);
    free(p);
    free(x);
    dt_group_destroy(g);
}

/* The residual of the candidate that ran last in each bucket, into res
 * (n), from the DDP state (per bucket: that candidate, then each
 * candidate's residual of the bucket's size: no PowerSGD here). Every other
 * candidate's must be zero: a switch hands the residual on. */
static void add_residuals(const dt_ddp *d, int ncand, float *res) {
    size_t bytes = dt_ddp_state_bytes(d);
    uint8_t *buf = malloc(bytes);
    ASSERT_TRUE(buf != NULL);
    ASSERT_OK(dt_ddp_get_state(d, buf, bytes));
    const uint8_t *q = buf + 16;
    for (size_t i = 0; i < dt_ddp_num_buckets(d); i++) {
        size_t b, e;
        dt_ddp_bucket(d, i, &b, &e);
        int32_t held;
        memcpy(&held, q, sizeof held);
        q += 4;
        ASSERT_TRUE(held >= 0 && held < ncand);
        for (int c = 0; c < ncand; c++) {
            for (size_t k = b; k < e; k++) {
                float v;
                memcpy(&v, q, sizeof v);
                q += sizeof v;
                if (c == held)
                    res[k] += v;
                else if (v != 0)
                    TEST_FAILF("bucket %zu: candidate %d kept a residual after a switch", i, c);
            }
        }
    }
    ASSERT_EQ((size_t)(q - buf), bytes);
    free(buf);
}

static void carry_tcp_2(int rank, int size) {
    dt_group *g = join();
    const size_t n = 100003;
    float *p = calloc(n, sizeof *p), *x = malloc(n * sizeof *x);
    double *sum_out = calloc(n, sizeof *sum_out), *sum_in = calloc(n, sizeof *sum_in);
    float *in = malloc(n * sizeof *in), *res = calloc(n, sizeof *res);
    ASSERT_TRUE(p && x && sum_out && sum_in && in && res);
    dt_codec_auto a;
    dt_ddp *d = adaptive(g, p, x, n, "auto:int8,topk:0.5", DT_EF_ON, &a);
    ASSERT_EQ(a.cand[0].kind, DT_CODEC_TOPK); /* 4 bytes per value beat int8's 1 */
    bool switched = false;
    for (int step = 0; step < 4; step++) {
        fill(x, n, rank, step);
        for (int r = 0; r < size; r++) {
            fill(in, n, r, step);
            for (size_t i = 0; i < n; i++)
                sum_in[i] += in[i];
        }
        dt_ddp_begin(d, true);
        dt_ddp_grad_ready(d, 0); /* no backward left to hide behind */
        ASSERT_OK(dt_ddp_finish(d, NULL, NULL));
        for (size_t i = 0; i < n; i++)
            sum_out[i] += x[i];
        const char *choice = dt_ddp_codec_choice(d, NULL);
        if (rank == 0)
            printf("  step %d: %s\n", step + 1, choice);
        if (step == 0)
            ASSERT_TRUE(strncmp(choice, "topk:0.5*", 9) == 0 && !strchr(choice, ','));
        switched |= strstr(choice, "int8") != NULL;
    }
    ASSERT_TRUE(switched);
    add_residuals(d, a.n, res);
    ASSERT_OK(dt_group_allreduce(g, res, res, n, DT_F32, DT_SUM));
    double worst = 0, scale = 0;
    for (size_t i = 0; i < n; i++) {
        double lhs = size * sum_out[i] + res[i];
        worst = fmax(worst, fabs(lhs - sum_in[i]));
        scale = fmax(scale, fabs(sum_in[i]));
    }
    if (rank == 0)
        printf("  conservation: worst |W sum(out) + residuals - sum(in)| = %.3g of %.3g\n", worst,
               scale);
    ASSERT_TRUE(worst <= 1e-5 * scale);
    dt_ddp_destroy(d);
    free(p);
    free(x);
    free(sum_out);
    free(sum_in);
    free(in);
    free(res);
    dt_group_destroy(g);
}

static const hcase cases[] = {
    {"agree_tcp_2", 2, agree_tcp_2, {"DT_TRANSPORT=tcp", NULL}, -1, 60},
    {"carry_tcp_2", 2, carry_tcp_2, {"DT_TRANSPORT=tcp", NULL}, -1, 60},
};

int main(int argc, char **argv) {
    return harness_main(argc, argv, cases, (int)(sizeof cases / sizeof cases[0]));
}
