/*
 * test_act16.c — the 16-bit activation kernels (src/amp/act16.c) against
 * the fp32 kernels of dtrain/tensor.h run on the same, already rounded,
 * inputs; for bf16 and fp16, forward and backward, at every ISA level this
 * CPU has (from the top down, so the scalar fallback runs too).
 *
 * What is compared, and why that tolerance:
 *   - layernorm, GELU, attention widen their 16-bit inputs exactly and run
 *     the fp32 kernel, so their outputs must be the fp32 kernel's output
 *     rounded once to the 16-bit type, to the bit, and their fp32 statistics
 *     (mean, rstd, lse) must be equal. (A layernorm row longer than 4096
 *     takes its own loop: within one 16-bit rounding, u = 2^-8 for bf16 and
 *     2^-11 for fp16, plus 1e-6 relative for the fp32 sum order.)
 *   - linear layers: with integer-valued inputs in [-4, 4] every product and
 *     partial sum is an integer below 2^24, so any fp32 summation order is
 *     exact: results must equal the fp32 layer to the bit (after one
 *     rounding for 16-bit output). With random inputs in [-1, 1] the sums
 *     differ only in order: |x - ref| <= 2 K 2^-24 sum|terms| (the classic
 *     bound for K fp32 additions, for both orders) + u |ref| for the final
 *     rounding to the 16-bit type. fp16 operands go through the fp32 layer
 *     itself, so fp16 must match to the bit in both cases.
 */
#include "dtrain/amp.h"
#include "dtrain/tensor.h"
#include "test.h"

static dt_precision g_p;     /* the precision under test */
static dt_isa_level g_level; /* the ISA level under test */

static float unit_roundoff(dt_precision p) { return p == DT_PRECISION_BF16 ? 0x1p-8f : 0x1p-11f; }

static float round16(dt_precision p, float x) {
    return p == DT_PRECISION_BF16 ? dt_f32_from_bf16(dt_bf16_from_f32(x))
                                  : dt_f32_from_f16(dt_f16_from_f32(x));
}

/* n values rounded to p: uniform in [-scale, scale], or integers in [-4, 4].
 * Returns the 16-bit array; wide gets the exact fp32 values. */
static uint16_t *make16(size_t n, float scale, bool integers, dt_rng *r, float **wide) {
    uint16_t *x = malloc(n * sizeof *x);
    float *w = malloc(n * sizeof *w);
    ASSERT_TRUE(x && w);
    for (size_t i = 0; i < n; i++) {
        float v = integers ? (float)((int)dt_rng_below(r, 9) - 4)
                           : scale * (2.0f * dt_rng_uniform(r) - 1.0f);
        w[i] = round16(g_p, v);
        x[i] = g_p == DT_PRECISION_BF16 ? dt_bf16_from_f32(v) : dt_f16_from_f32(v);
    }
    *wide = w;
    return x;
}

static float *make32(size_t n, float scale, bool integers, dt_rng *r) {
    float *x = malloc(n * sizeof *x);
    ASSERT_TRUE(x);
    for (size_t i = 0; i < n; i++)
        x[i] = integers ? (float)((int)dt_rng_below(r, 9) - 4)
                        : scale * (2.0f * dt_rng_uniform(r) - 1.0f);
    return x;
}

/* got (16-bit) must be ref rounded once to p, bit for bit. */
static void expect_rounded(const char *what, const uint16_t *got, const float *ref, size_t n) {
    for (size_t i = 0; i < n; i++) {
        uint16_t want =
            g_p == DT_PRECISION_BF16 ? dt_bf16_from_f32(ref[i]) : dt_f16_from_f32(ref[i]);
        if (got[i] != want)
            TEST_FAILF("%s %s at %s: element %zu is 0x%04x, want 0x%04x (fp32 %.9g)", what,
                       dt_precision_name(g_p), dt_isa_name(g_level), i, got[i], want, ref[i]);
    }
}

static void expect_equal32(const char *what, const float *got, const float *ref, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (memcmp(&got[i], &ref[i], sizeof(float)) != 0)
            TEST_FAILF("%s %s at %s: element %zu is %.9g, want %.9g", what, dt_precision_name(g_p),
                       dt_isa_name(g_level), i, got[i], ref[i]);
}

/* |got - ref| <= bound[i] elementwise. */
static void expect_within(const char *what, const float *got, const float *ref, const float *bound,
                          size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!(fabsf(got[i] - ref[i]) <= bound[i]))
            TEST_FAILF("%s %s at %s: element %zu is %.9g, want %.9g +- %.3g", what,
                       dt_precision_name(g_p), dt_isa_name(g_level), i, got[i], ref[i], bound[i]);
}

static void test_convert(void) {
    dt_rng r;
    dt_rng_init(&r, 1, 0);
    size_t n = 70001; /* crosses the 4096 blocks and the parallel threshold */
    float *x = make32(n, 70000.0f, false, &r), *back = malloc(n * sizeof *back);
    uint16_t *h = malloc(n * sizeof *h);
    ASSERT_TRUE(back && h);
    x[5] = INFINITY, x[6] = -0.0f, x[7] = 1e-30f, x[8] = NAN;
    dt_act16_from_f32(g_p, h, x, n);
    expect_rounded("dt_act16_from_f32", h, x, n);
    dt_act16_to_f32(g_p, back, h, n);
    for (size_t i = 0; i < n; i++) {
        float want = g_p == DT_PRECISION_BF16 ? dt_f32_from_bf16(h[i]) : dt_f32_from_f16(h[i]);
        if (memcmp(&back[i], &want, sizeof want) != 0)
            TEST_FAILF("dt_act16_to_f32 element %zu: %g, want %g", i, back[i], want);
    }
    free(x), free(back), free(h);
}

static void test_layernorm(void) {
    static const int shapes[][2] = {{37, 768}, {3, 100}, {5, 4096}, {2, 5000}};
    dt_rng r;
    dt_rng_init(&r, 2, 0);
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int N = shapes[s][0], C = shapes[s][1];
        size_t n = (size_t)N * C;
        float *inp = make32(n, 3.0f, false, &r), *w = make32((size_t)C, 1.0f, false, &r);
        float *b = make32((size_t)C, 0.5f, false, &r), *ref = malloc(n * sizeof *ref);
        float *mean = malloc(sizeof(float) * N), *rstd = malloc(sizeof(float) * N);
        float *rmean = malloc(sizeof(float) * N), *rrstd = malloc(sizeof(float) * N);
        uint16_t *out = malloc(n * sizeof *out);
        ASSERT_TRUE(ref && mean && rstd && rmean && rrstd && out);
        for (size_t i = 0; i < n; i++) /* a per-row offset: the mean matters */
            inp[i] += (float)(i / (size_t)C);
        dt_layernorm_forward(ref, rmean, rrstd, inp, w, b, N, C);
        dt_layernorm16_forward(g_p, out, mean, rstd, inp, w, b, N, C);
        if (C <= 4096) {
            expect_rounded("layernorm16 out", out, ref, n);
            expect_equal32("layernorm16 mean", mean, rmean, (size_t)N);
            expect_equal32("layernorm16 rstd", rstd, rrstd, (size_t)N);
        } else {
            float *got = malloc(n * sizeof *got), *bound = malloc(n * sizeof *bound);
            ASSERT_TRUE(got && bound);
            dt_act16_to_f32(g_p, got, out, n);
            for (size_t i = 0; i < n; i++)
                bound[i] = unit_roundoff(g_p) * fabsf(ref[i]) + 1e-5f;
            expect_within("layernorm16 (long rows) out", got, ref, bound, n);
            for (int i = 0; i < N; i++) {
                ASSERT_NEAR(mean[i], rmean[i], 1e-6, 1e-6);
                ASSERT_NEAR(rstd[i], rrstd[i], 1e-5, 0);
            }
            free(got), free(bound);
        }
        free(inp), free(w), free(b), free(ref), free(mean), free(rstd), free(rmean), free(rrstd);
        free(out);
    }
}

static void test_gelu(void) {
    dt_rng r;
    dt_rng_init(&r, 3, 0);
    size_t n = 100003;
    float *x32, *ref = malloc(n * sizeof *ref), *dout = make32(n, 2.0f, false, &r);
    uint16_t *x = make16(n, 6.0f, false, &r, &x32), *y = malloc(n * sizeof *y);
    ASSERT_TRUE(ref && y);
    dt_gelu_forward(ref, x32, n);
    dt_gelu16_forward(g_p, y, x, n);
    expect_rounded("gelu16 forward", y, ref, n);
    dt_gelu_backward(ref, x32, dout, n);
    dt_gelu16_backward(g_p, y, x, dout, n);
    expect_rounded("gelu16 backward", y, ref, n);
    free(x32), free(ref), free(dout), free(x), free(y);
}

static void test_attention(void) {
    /* the last one has more (sequence, head) pairs than the kernels' 16 slots */
    static const int shapes[][4] = {{2, 70, 64, 4}, {1, 130, 96, 2}, {3, 1, 32, 1}, {3, 20, 96, 8}};
    dt_rng r;
    dt_rng_init(&r, 4, 0);
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int B = shapes[s][0], T = shapes[s][1], C = shapes[s][2], NH = shapes[s][3];
        size_t n = (size_t)B * T * C, nl = (size_t)B * NH * T;
        float *qkv32, *out32 = malloc(n * sizeof(float)), *lse32 = malloc(nl * sizeof(float));
        float *lse = malloc(nl * sizeof(float)), *dout = make32(n, 1.0f, false, &r);
        float *dqkv32 = malloc(3 * n * sizeof(float)), *outw = malloc(n * sizeof(float));
        uint16_t *qkv = make16(3 * n, 2.0f, false, &r, &qkv32);
        uint16_t *out = malloc(n * sizeof *out), *dqkv = malloc(3 * n * sizeof *dqkv);
        /* The workspace, then a guard the kernels must not touch. */
        size_t nw = dt_attention16_workspace(B, T, C, NH);
        float *work = malloc((nw + 64) * sizeof(float));
        ASSERT_TRUE(work);
        for (size_t i = nw; i < nw + 64; i++)
            work[i] = -7.0f;
        ASSERT_TRUE(out32 && lse32 && lse && dqkv32 && outw && out && dqkv && work);
        dt_attention_forward(out32, lse32, qkv32, B, T, C, NH);
        dt_attention16_forward(g_p, out, lse, qkv, B, T, C, NH, work);
        expect_rounded("attention16 forward out", out, out32, n);
        expect_equal32("attention16 forward lse", lse, lse32, nl);
        /* The backward reads the 16-bit out of forward, as the GPT stores it. */
        dt_act16_to_f32(g_p, outw, out, n);
        dt_attention_backward(dqkv32, dout, qkv32, outw, lse32, B, T, C, NH);
        dt_attention16_backward(g_p, dqkv, dout, qkv, out, lse, B, T, C, NH, work);
        expect_rounded("attention16 backward dqkv", dqkv, dqkv32, 3 * n);
        for (size_t i = nw; i < nw + 64; i++)
            ASSERT_TRUE(work[i] == -7.0f);
        free(qkv32), free(out32), free(lse32), free(lse), free(dout), free(dqkv32), free(outw);
        free(qkv), free(out), free(dqkv), free(work);
    }
}

/* sum_k |a_k b_k| (+|c|) bounds for the random-input check of the linear
 * layers, computed in double on the widened operands. */
static void linear_case(int N, int C, int OC, bool integers, bool with_bias, dt_rng *r) {
    size_t no = (size_t)N * OC, ni = (size_t)N * C, nw = (size_t)OC * C;
    float scale = 1.0f;
    float *inp32, *w32, *dout32;
    uint16_t *inp = make16(ni, scale, integers, r, &inp32);
    uint16_t *w = make16(nw, scale, integers, r, &w32);
    uint16_t *dout = make16(no, scale, integers, r, &dout32);
    float *bias = with_bias ? make32((size_t)OC, 1.0f, integers, r) : NULL;
    float *ref = malloc(no * sizeof(float)), *got = malloc(no * sizeof(float));
    float *bound = malloc((no > nw ? no : nw) * sizeof(float) + ni * sizeof(float));
    uint16_t *out16 = malloc(no * sizeof *out16);
    ASSERT_TRUE(ref && got && bound && out16);
    bool exact = integers || g_p == DT_PRECISION_FP16;
    float u = unit_roundoff(g_p);
    const float eps = 0x1p-24f;

    /* forward, fp32 and 16-bit output */
    dt_matmul_forward(ref, inp32, w32, bias, N, C, OC);
    for (int i = 0; i < N; i++)
        for (int o = 0; o < OC; o++) {
            double s = bias ? fabs(bias[o]) : 0.0;
            for (int c = 0; c < C; c++)
                s += fabs((double)inp32[(size_t)i * C + c] * w32[(size_t)o * C + c]);
            bound[(size_t)i * OC + o] = (float)(2.0 * (C + 1) * eps * s);
        }
    ASSERT_OK(dt_linear16_forward(g_p, got, true, inp, w, bias, N, C, OC));
    if (exact)
        expect_equal32("linear16 forward (fp32 out)", got, ref, no);
    else
        expect_within("linear16 forward (fp32 out)", got, ref, bound, no);
    ASSERT_OK(dt_linear16_forward(g_p, out16, false, inp, w, bias, N, C, OC));
    if (exact) {
        expect_rounded("linear16 forward (16-bit out)", out16, ref, no);
    } else {
        dt_act16_to_f32(g_p, got, out16, no);
        for (size_t i = 0; i < no; i++)
            bound[i] = bound[i] * (1 + u) + u * fabsf(ref[i]);
        expect_within("linear16 forward (16-bit out)", got, ref, bound, no);
    }

    /* backward: dinp overwritten, dw and dbias accumulated onto a start value */
    float *dinp = malloc(ni * sizeof(float)), *rdinp = malloc(ni * sizeof(float));
    float *dw = make32(nw, 1.0f, integers, r), *rdw = malloc(nw * sizeof(float));
    float *db = make32((size_t)OC, 1.0f, integers, r), *rdb = malloc(OC * sizeof(float));
    ASSERT_TRUE(dinp && rdinp && rdw && rdb);
    memcpy(rdw, dw, nw * sizeof(float));
    memcpy(rdb, db, (size_t)OC * sizeof(float));
    for (size_t i = 0; i < ni; i++)
        dinp[i] = NAN; /* must be overwritten */
    dt_matmul_backward(rdinp, rdw, rdb, dout32, inp32, w32, N, C, OC);
    float *dw0 = malloc(nw * sizeof(float)), *db0 = malloc(OC * sizeof(float));
    ASSERT_TRUE(dw0 && db0);
    memcpy(dw0, dw, nw * sizeof(float));
    memcpy(db0, db, (size_t)OC * sizeof(float));
    ASSERT_OK(dt_linear16_backward(g_p, dinp, dw, with_bias ? db : NULL, dout, inp, w, N, C, OC));
    if (!with_bias) /* dbias skipped: the reference's must be undone */
        memcpy(rdb, db0, (size_t)OC * sizeof(float));
    if (exact) {
        expect_equal32("linear16 backward dinp", dinp, rdinp, ni);
        expect_equal32("linear16 backward dw", dw, rdw, nw);
        expect_equal32("linear16 backward dbias", db, rdb, (size_t)OC);
    } else {
        float *bd = bound; /* dinp bound: sum over OC */
        for (int i = 0; i < N; i++)
            for (int c = 0; c < C; c++) {
                double s = 0;
                for (int o = 0; o < OC; o++)
                    s += fabs((double)dout32[(size_t)i * OC + o] * w32[(size_t)o * C + c]);
                bd[(size_t)i * C + c] = (float)(2.0 * OC * eps * s);
            }
        expect_within("linear16 backward dinp", dinp, rdinp, bd, ni);
        for (int o = 0; o < OC; o++) /* dw bound: sum over N, plus the start value */
            for (int c = 0; c < C; c++) {
                double s = fabs(dw0[(size_t)o * C + c]);
                for (int i = 0; i < N; i++)
                    s += fabs((double)dout32[(size_t)i * OC + o] * inp32[(size_t)i * C + c]);
                bd[(size_t)o * C + c] = (float)(2.0 * (N + 1) * eps * s);
            }
        expect_within("linear16 backward dw", dw, rdw, bd, nw);
        for (int o = 0; o < OC; o++) {
            double s = fabs(db0[o]);
            for (int i = 0; i < N; i++)
                s += fabs(dout32[(size_t)i * OC + o]);
            bd[o] = (float)(2.0 * (N + 1) * eps * s);
        }
        expect_within("linear16 backward dbias", db, rdb, bd, (size_t)OC);
    }
    /* dinp NULL: only the parameter gradients */
    memcpy(rdw, dw, nw * sizeof(float));
    ASSERT_OK(dt_linear16_backward(g_p, NULL, dw, NULL, dout, inp, w, N, C, OC));
    ASSERT_TRUE(memcmp(dw, rdw, nw * sizeof(float)) != 0 || integers); /* it did add */

    free(inp), free(w), free(dout), free(inp32), free(w32), free(dout32), free(bias), free(ref);
    free(got), free(bound), free(out16), free(dinp), free(rdinp), free(dw), free(rdw), free(db);
    free(rdb), free(dw0), free(db0);
}

static void test_linear(void) {
    static const int shapes[][3] = {
        {64, 96, 288}, {7, 33, 70}, {1, 5, 1}, {130, 64, 17}, {5, 24, 17001}};
    dt_rng r;
    dt_rng_init(&r, 5, 0);
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int integers = 0; integers < 2; integers++)
            linear_case(shapes[s][0], shapes[s][1], shapes[s][2], integers, s != 1, &r);
}

static void test_linear_errors(void) {
    uint16_t a = 0;
    float c = 0;
    ASSERT_STATUS(dt_linear16_forward(DT_PRECISION_FP32, &c, true, &a, &a, NULL, 1, 1, 1),
                  DT_ERR_INVALID);
    ASSERT_CONTAINS(dt_last_error(), "fp32");
    ASSERT_STATUS(dt_linear16_forward(DT_PRECISION_BF16, &c, true, &a, &a, NULL, 0, 1, 1),
                  DT_ERR_INVALID);
    ASSERT_CONTAINS(dt_last_error(), "N=0");
    ASSERT_STATUS(dt_linear16_backward(DT_PRECISION_FP16, &c, &c, NULL, &a, &a, NULL, 1, 1, 1),
                  DT_ERR_INVALID);
    ASSERT_CONTAINS(dt_last_error(), "w is NULL");
}

static void run_all(void) {
    for (int p = DT_PRECISION_BF16; p <= DT_PRECISION_FP16; p++) {
        g_p = (dt_precision)p;
        RUN(test_convert);
        RUN(test_layernorm);
        RUN(test_gelu);
        RUN(test_attention);
        RUN(test_linear);
    }
}

int main(void) {
    dt_status st = dt_isa_init(); /* DT_ISA above this CPU's level: skipped */
    if (st == DT_ERR_UNSUPPORTED) {
        printf("skipped: %s\n", dt_last_error());
        return 77;
    }
    ASSERT_OK(st);
    dt_tensor_set_threads(2);
    RUN(test_linear_errors);
    /* Top level first (oneDNN fixes its ISA at first use), then each lower
     * level: the bf16 multiply then falls back to the next backend and the
     * conversions to their AVX2 / scalar paths. */
    for (int l = (int)dt_isa(); l >= 0; l--) {
        ASSERT_OK(dt_isa_set((dt_isa_level)l));
        g_level = (dt_isa_level)l;
        fprintf(stderr, "-- ISA %s, gemm backend %s\n", dt_isa_name(g_level),
                dt_gemm_backend_name(dt_gemm_backend_default()));
        run_all();
    }
    dt_gemm_release();
    return TEST_SUMMARY();
}
