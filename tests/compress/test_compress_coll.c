/*
 * test_compress_coll.c — the compressed allreduce (dt_callreduce) with real
 * processes on loopback, against a serial reference.
 *
 *   coll_W     W = 2, 3, 4 ranks; every codec, error feedback default and
 *              on, sizes 1, 777 and 5000, three steps each. The reference
 *              runs W compressors (one per simulated rank) in this process:
 *              (1/W) sum_r decode(encode(x_r + residual_r)), added in rank
 *              order. Inputs are small integers, so the casts, random-k
 *              and the plain allreduce are exact in any summation order and
 *              every codec but PowerSGD must match bit for bit; PowerSGD
 *              (comm's summation order, BLAS) within 1e-4 of the largest
 *              value. All ranks must hold identical bits, the reported wire
 *              bytes must be the formula of collective.c, and with error
 *              feedback on, mass is conserved: sum of residuals over ranks
 *              + W * sum of outputs = sum of all inputs.
 *   nonfinite  3 ranks; rank 1's input holds an inf or a NaN at one step:
 *              every rank's output is non-finite, no error, and the next
 *              step equals the reference that skipped the bad one (each
 *              rank's residual and Q were put back).
 *   corrupt    3 ranks; rank 1 damages its encoding before it is sent
 *              (header bit, top-k index out of range, int8 scale NaN):
 *              every rank gets DT_ERR_CORRUPT naming rank 1, and the group
 *              stays usable for the next, clean, run.
 */
#include "../comm/harness.h"
#include "compress/internal.h"
#include "dtrain/compress.h"

#include <math.h>

static const char *const specs[] = {"none", "fp16",      "bf16",      "int8",      "qsgd:3",
                                    "sign", "topk:0.05", "randk:0.1", "powersgd:2"};
#define NSPECS (int)(sizeof specs / sizeof specs[0])
static const size_t sizes[] = {1, 777, 5000};
#define STEPS 3

/* Rank r's input at a step: small integers, some zero. */
static void input(float *x, size_t n, int r, int step) {
    for (size_t i = 0; i < n; i++)
        x[i] = (float)((int)((i * 7 + (size_t)r * 13 + (size_t)step * 5 + i / 3) % 19) - 9);
}

/* PowerSGD's matrices for a range of n: one (rows, cols) block when it is
 * large enough, the rest raw. */
static size_t tensors_for(size_t n, dt_powersgd_tensor *t) {
    if (n < 700)
        return 0;
    size_t cols = n >= 5000 ? 100 : 111;
    t[0] = (dt_powersgd_tensor){
        .offset = n >= 5000 ? 500 : 0, .rows = n >= 5000 ? 40 : 7, .cols = cols};
    return 1;
}

/* The reference of W ranks, one step; ref[n] gets the average. */
typedef struct refstate {
    dt_compressor *c[8];
    dt_powersgd_bucket *b[8];
    /* The two-phase scheme (int8, qsgd at 4+ ranks): chunk compressors of
     * every rank, the owners' re-encoders, chunk offsets. */
    bool rsag;
    dt_compressor *ch[8][8], *sv[8];
    size_t off[9];
} refstate;

static bool uses_rsag(const dt_codec_spec *spec, int W) {
    return (spec->kind == DT_CODEC_INT8 || spec->kind == DT_CODEC_QSGD) && W >= 4;
}

static void ref_create(refstate *s, const dt_codec_spec *spec, size_t n, int W, dt_ef_mode ef,
                       uint32_t bucket) {
    memset(s, 0, sizeof *s);
    if (uses_rsag(spec, W)) {
        s->rsag = true;
        size_t nb = (n + DT_COMPRESS_BLOCK - 1) / DT_COMPRESS_BLOCK;
        size_t per = (nb + (size_t)W - 1) / (size_t)W * DT_COMPRESS_BLOCK;
        for (int j = 0; j <= W; j++)
            s->off[j] = (size_t)j * per < n ? (size_t)j * per : n;
        for (int j = 0; j < W; j++) {
            size_t len = s->off[j + 1] - s->off[j];
            dt_compressor_config cc = dt_compressor_config_default();
            cc.bucket = bucket;
            for (int r = 0; r < W; r++) {
                cc.seed = dt__callreduce_chunk_seed(42, (size_t)j);
                cc.rank = (uint32_t)r;
                cc.ef = ef;
                ASSERT_OK(dt_compressor_create(&s->ch[r][j], spec, len, &cc));
            }
            cc.seed = dt__callreduce_chunk_seed(42, (size_t)(W + j));
            cc.rank = (uint32_t)j;
            cc.ef = DT_EF_OFF;
            ASSERT_OK(dt_compressor_create(&s->sv[j], spec, len, &cc));
        }
        return;
    }
    for (int r = 0; r < W; r++) {
        dt_compressor_config cc = dt_compressor_config_default();
        cc.seed = 42;
        cc.rank = (uint32_t)r;
        cc.bucket = bucket;
        cc.ef = ef;
        if (spec->kind == DT_CODEC_POWERSGD) {
            dt_powersgd_tensor t[1];
            size_t nt = tensors_for(n, t);
            ASSERT_OK(dt_powersgd_bucket_create(&s->b[r], spec->rank, n, t, nt, &cc));
        } else if (spec->kind != DT_CODEC_NONE) {
            ASSERT_OK(dt_compressor_create(&s->c[r], spec, n, &cc));
        }
    }
}

static void ref_destroy(refstate *s, int W) {
    for (int r = 0; r < W; r++) {
        for (int j = 0; j < W; j++)
            dt_compressor_destroy(s->ch[r][j]);
        dt_compressor_destroy(s->sv[r]);
        dt_compressor_destroy(s->c[r]);
        dt_powersgd_bucket_destroy(s->b[r]);
    }
}

static void ref_step(refstate *s, const dt_codec_spec *spec, size_t n, int W, int step,
                     float *ref) {
    float *x = dt_alloc((n + 1) * sizeof(float));
    const float inv = 1.0f / (float)W;
    if (s->rsag) {
        /* Per chunk: the owner's sum of every rank's decoding, re-encoded
         * once, decoded by all. */
        float *sum = dt_alloc((n + 1) * sizeof(float));
        for (int j = 0; j < W; j++) {
            size_t o = s->off[j], len = s->off[j + 1] - o;
            size_t cap = dt_compressor_encoded_bytes(s->sv[j]), used;
            uint8_t *buf = dt_alloc(cap);
            for (int r = 0; r < W; r++) {
                input(x, n, r, step);
                ASSERT_OK(
                    dt_compressor_compress(s->ch[r][j], x + o, (uint64_t)step, buf, cap, &used));
                ASSERT_OK(
                    dt_codec_decode(buf, used, len, sum, r == 0 ? DT_DECODE_SET : DT_DECODE_ADD));
            }
            ASSERT_OK(dt_compressor_compress(s->sv[j], sum, (uint64_t)step, buf, cap, &used));
            ASSERT_OK(dt_codec_decode(buf, used, len, ref + o, DT_DECODE_SET));
            dt_free(buf);
        }
        for (size_t i = 0; i < n; i++)
            ref[i] *= inv;
        dt_free(sum);
    } else if (spec->kind == DT_CODEC_POWERSGD) {
        size_t np, nq;
        for (int r = 0; r < W; r++) {
            input(x, n, r, step);
            ASSERT_OK(dt_powersgd_bucket_begin(s->b[r], x, (uint64_t)step));
        }
        float *P0 = dt_powersgd_bucket_p(s->b[0], &np);
        for (int r = 1; r < W; r++) {
            float *P = dt_powersgd_bucket_p(s->b[r], &np);
            for (size_t i = 0; i < np; i++)
                P0[i] += P[i];
        }
        for (int r = 1; r < W; r++)
            memcpy(dt_powersgd_bucket_p(s->b[r], &np), P0, np * sizeof(float));
        for (int r = 0; r < W; r++)
            ASSERT_OK(dt_powersgd_bucket_middle(s->b[r]));
        float *Q0 = dt_powersgd_bucket_q(s->b[0], &nq);
        for (int r = 1; r < W; r++) {
            float *Q = dt_powersgd_bucket_q(s->b[r], &nq);
            for (size_t i = 0; i < nq; i++)
                Q0[i] += Q[i];
        }
        for (int r = 1; r < W; r++)
            memcpy(dt_powersgd_bucket_q(s->b[r], &nq), Q0, nq * sizeof(float));
        for (int r = 0; r < W; r++) {
            ASSERT_OK(dt_powersgd_bucket_end(s->b[r], inv, x));
            if (r == 0)
                memcpy(ref, x, n * sizeof(float));
        }
    } else if (spec->kind == DT_CODEC_NONE) {
        memset(ref, 0, n * sizeof(float));
        for (int r = 0; r < W; r++) {
            input(x, n, r, step);
            for (size_t i = 0; i < n; i++)
                ref[i] += x[i];
        }
        if (W > 1)
            for (size_t i = 0; i < n; i++)
                ref[i] *= inv;
    } else {
        size_t cap = dt_compressor_encoded_bytes(s->c[0]), used;
        uint8_t *buf = dt_alloc(cap);
        for (int r = 0; r < W; r++) {
            input(x, n, r, step);
            ASSERT_OK(dt_compressor_compress(s->c[r], x, (uint64_t)step, buf, cap, &used));
            ASSERT_OK(dt_codec_decode(buf, used, n, ref, r == 0 ? DT_DECODE_SET : DT_DECODE_ADD));
        }
        if (W > 1)
            for (size_t i = 0; i < n; i++)
                ref[i] *= inv;
        dt_free(buf);
    }
    dt_free(x);
}

static uint64_t expected_wire(const dt_codec_spec *spec, size_t n, int W, dt_callreduce *c,
                              refstate *s) {
    uint64_t ring = (uint64_t)(2 * (W - 1));
    switch (spec->kind) {
    case DT_CODEC_NONE: return ring * 4 * n / (uint64_t)W;
    case DT_CODEC_FP16:
    case DT_CODEC_BF16: return ring * 2 * n / (uint64_t)W;
    case DT_CODEC_RANDK: return ring * 4 * dt_codec_k(spec, n) / (uint64_t)W;
    case DT_CODEC_POWERSGD: {
        size_t np, nq;
        (void)dt_powersgd_bucket_p(s->b[0], &np);
        (void)dt_powersgd_bucket_q(s->b[0], &nq);
        return ring * 4 * np / (uint64_t)W + ring * 4 * nq / (uint64_t)W;
    }
    default:
        (void)c;
        if (s->rsag)
            return 2 * (uint64_t)(W - 1) * dt_compressor_encoded_bytes(s->ch[0][0]);
        return (uint64_t)(W - 1) * dt_compressor_encoded_bytes(s->c[0]);
    }
}

/* bad_step >= 0: at that step rank 1's input holds an inf (or a NaN, for
 * odd bucket ids); every rank's output must then be non-finite, and the
 * run must go on as if that step had never happened. */
static void run_codec(dt_group *g, const char *text, size_t n, dt_ef_mode ef, uint32_t bucket,
                      int bad_step) {
    int rank = dt_group_rank(g), W = dt_group_size(g);
    dt_codec_spec spec;
    ASSERT_OK(dt_codec_parse("spec", text, &spec));
    dt_callreduce_config cfg = dt_callreduce_config_default();
    dt_powersgd_tensor t[1];
    cfg.seed = 42;
    cfg.bucket = bucket;
    cfg.ef = ef;
    cfg.ntensors = tensors_for(n, t);
    cfg.tensors = t;
    dt_callreduce *c;
    ASSERT_OK(dt_callreduce_create(&c, g, &spec, n, &cfg));
    refstate s;
    ref_create(&s, &spec, n, W, ef, bucket);
    ASSERT_EQ(dt_callreduce_wire_bytes(c), expected_wire(&spec, n, W, c, &s));
    static const char *const algo[DT_CODEC_COUNT] = {"allreduce", "allreduce16", "allreduce16",
                                                     "allgather", "allgather",   "allgather",
                                                     "allgather", "allreduce-k", "powersgd"};
    ASSERT_STREQ(dt_callreduce_algo(c), s.rsag ? "alltoall+allgather" : algo[spec.kind]);
    float *x = dt_alloc(n * sizeof(float)), *ref = dt_alloc(n * sizeof(float));
    double *in_sum = calloc(n, sizeof(double)), *out_sum = calloc(n, sizeof(double));
    for (int step = 0; step < STEPS; step++) {
        input(x, n, rank, step);
        if (step == bad_step) {
            if (rank == 1)
                x[n / 2] = bucket % 2 ? NAN : -INFINITY;
            ASSERT_OK(dt_callreduce_run(c, x, (uint64_t)step));
            bool finite = true;
            for (size_t i = 0; i < n; i++)
                finite = finite && isfinite(x[i]);
            if (finite)
                TEST_FAILF("%s n=%zu W=%d: rank 1's inf/NaN did not reach rank %d", text, n, W,
                           rank);
            continue; /* nor the reference */
        }
        for (int r = 0; r < W; r++) {
            float *tmp = dt_alloc(n * sizeof(float) + 4);
            input(tmp, n, r, step);
            for (size_t i = 0; i < n; i++)
                in_sum[i] += tmp[i];
            dt_free(tmp);
        }
        ASSERT_OK(dt_callreduce_run(c, x, (uint64_t)step));
        ref_step(&s, &spec, n, W, step, ref);
        double amax = 0;
        for (size_t i = 0; i < n; i++)
            amax = fmax(amax, fabs(ref[i]));
        double tol = spec.kind == DT_CODEC_POWERSGD ? 1e-4 * (amax + 1) : 0;
        for (size_t i = 0; i < n; i++) {
            out_sum[i] += (double)x[i];
            if (!(fabs((double)x[i] - ref[i]) <= tol))
                TEST_FAILF("%s n=%zu W=%d ef=%d step %d: value %zu is %.9g, reference %.9g", text,
                           n, W, (int)ef, step, i, (double)x[i], (double)ref[i]);
        }
        /* Identical bits on every rank. */
        int64_t h = (int64_t)dt_hash64(x, n * sizeof(float), 0), all[8];
        ASSERT_OK(dt_group_allgather(g, &h, all, 1, DT_I64));
        for (int r = 1; r < W; r++)
            if (all[r] != all[0])
                TEST_FAILF("%s n=%zu W=%d step %d: rank %d's result differs from rank 0's", text, n,
                           W, step, r);
    }
    /* The two-phase scheme re-quantises each reduced chunk without a
     * residual: mass is conserved for the first encode only, which the
     * equality with the reference over three steps already covers. */
    if (ef == DT_EF_ON && spec.kind != DT_CODEC_NONE && !s.rsag) {
        ASSERT_TRUE(dt_callreduce_error_feedback(c));
        size_t sb = dt_callreduce_state_bytes(c);
        ASSERT_TRUE(sb >= n * sizeof(float));
        float *state = dt_alloc(sb + 4);
        ASSERT_OK(dt_callreduce_get_state(c, state, sb));
        double *res = calloc(n + 1, sizeof(double));
        for (size_t i = 0; i < n; i++)
            res[i] = state[i];
        ASSERT_OK(dt_group_allreduce(g, res, res, n, DT_F64, DT_SUM));
        for (size_t i = 0; i < n; i++) {
            double got = res[i] + W * out_sum[i];
            if (!(fabs(got - in_sum[i]) <= 1e-4 * (1 + fabs(in_sum[i]))))
                TEST_FAILF("%s n=%zu W=%d: mass at %zu: residuals + sent = %.9g, inputs %.9g", text,
                           n, W, i, got, in_sum[i]);
        }
        /* Residual scaling (a loss-scale change), state round trip, reset. */
        float *scaled = dt_alloc(sb + 4);
        dt_callreduce_scale_residual(c, 2.0f);
        ASSERT_OK(dt_callreduce_get_state(c, scaled, sb));
        for (size_t i = 0; i < sb / 4; i++)
            ASSERT_EQ(scaled[i], i < n ? 2.0f * state[i] : state[i]);
        dt_free(scaled);
        ASSERT_OK(dt_callreduce_set_state(c, state, sb));
        ASSERT_STATUS(dt_callreduce_set_state(c, state, sb - 4), DT_ERR_INVALID);
        dt_callreduce_reset(c);
        free(res);
        dt_free(state);
    }
    free(in_sum);
    free(out_sum);
    dt_free(x);
    dt_free(ref);
    ref_destroy(&s, W);
    dt_callreduce_destroy(c);
}

static void test_coll(int rank, int size) {
    (void)rank;
    dt_group *g;
    ASSERT_OK(dt_group_init_from_env(&g));
    ASSERT_EQ(dt_group_size(g), size);
    uint32_t bucket = 0;
    for (int s = 0; s < NSPECS; s++)
        for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
            run_codec(g, specs[s], sizes[k], DT_EF_DEFAULT, bucket++, -1);
            run_codec(g, specs[s], sizes[k], DT_EF_ON, bucket++, -1);
        }
    dt_group_destroy(g);
}

/* A non-finite input on rank 1 at step 1 of 3, error feedback on and
 * default, inf and NaN: no error, non-finite everywhere, and steps 0 and 2
 * equal the reference that never saw step 1 (state restored). */
static void test_nonfinite(int rank, int size) {
    (void)rank;
    dt_group *g;
    ASSERT_OK(dt_group_init_from_env(&g));
    ASSERT_EQ(dt_group_size(g), size);
    uint32_t bucket = 0;
    for (int s = 0; s < NSPECS; s++)
        for (int v = 0; v < 2; v++) {
            run_codec(g, specs[s], 5000, DT_EF_ON, bucket++, 1);
            run_codec(g, specs[s], 777, DT_EF_DEFAULT, bucket++, 1);
        }
    dt_group_destroy(g);
}

static int tamper_kind;
static void tamper(int rank, uint8_t *buf, size_t len) {
    if (rank != 1)
        return;
    switch (tamper_kind) {
    case 0: buf[9] ^= 0x10; break; /* count field: the header check fails */
    case 1: memset(buf + DT_COMPRESS_HEADER_BYTES, 0xff, 4); break; /* topk index 2^32-1 */
    case 2: {
        float nan = NAN; /* int8 scale of block 0 */
        memcpy(buf + DT_COMPRESS_HEADER_BYTES, &nan, 4);
        break;
    }
    }
    (void)len;
}

static void test_corrupt(int rank, int size) {
    (void)rank;
    (void)size;
    dt_group *g;
    ASSERT_OK(dt_group_init_from_env(&g));
    const char *kinds[] = {"topk:0.1", "topk:0.1", "int8"};
    for (int k = 0; k < 3; k++) {
        dt_codec_spec spec;
        ASSERT_OK(dt_codec_parse("spec", kinds[k], &spec));
        dt_callreduce *c;
        ASSERT_OK(dt_callreduce_create(&c, g, &spec, 1000, NULL));
        float x[1000];
        input(x, 1000, dt_group_rank(g), 0);
        tamper_kind = k;
        dt__callreduce_tamper = tamper;
        ASSERT_STATUS(dt_callreduce_run(c, x, 0), DT_ERR_CORRUPT);
        ASSERT_CONTAINS(dt_last_error(), "rank 1");
        dt__callreduce_tamper = NULL;
        dt_callreduce_reset(c);
        ASSERT_OK(dt_callreduce_run(c, x, 1)); /* the group is still fine */
        dt_callreduce_destroy(c);
    }
    dt_group_destroy(g);
}

static const hcase cases[] = {
    {.name = "coll_2", .nranks = 2, .fn = test_coll, .killed_rank = -1, .timeout = 120},
    {.name = "coll_3", .nranks = 3, .fn = test_coll, .killed_rank = -1, .timeout = 120},
    {.name = "coll_4", .nranks = 4, .fn = test_coll, .killed_rank = -1, .timeout = 120},
    {.name = "nonfinite", .nranks = 3, .fn = test_nonfinite, .killed_rank = -1, .timeout = 120},
    {.name = "nonfinite_4", .nranks = 4, .fn = test_nonfinite, .killed_rank = -1, .timeout = 120},
    {.name = "corrupt_4", .nranks = 4, .fn = test_corrupt, .killed_rank = -1, .timeout = 60},
    {.name = "corrupt", .nranks = 3, .fn = test_corrupt, .killed_rank = -1, .timeout = 60},
};

int main(int argc, char **argv) {
    return harness_main(argc, argv, cases, (int)(sizeof cases / sizeof cases[0]));
}
