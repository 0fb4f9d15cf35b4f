/*
 * test_tensor.c — every kernel's backward against central finite
 * differences, flash attention against the naive reference, and the
 * forward kernels against float64 formulas.
 *
 * Finite differences: loss = sum_i w_i out_i with fixed random w (so every
 * output element matters), evaluated in double; d loss/d x_i by central
 * differences with step h on sampled elements, compared with the analytic
 * gradient from the backward kernel fed dout = w:
 *     |fd - analytic| <= tol * (|analytic| + rms(analytic)).
 * float32 forward passes make fd accurate to ~1e-3 relative, hence tol 1e-2
 * (a wrong backward is off by O(1)).
 */
#include "dtrain/tensor.h"
#include "tensor_check.h"

static double proj(const float *out, const float *w, size_t n) {
    double s = 0.0;
    for (size_t i = 0; i < n; i++)
        s += (double)out[i] * w[i];
    return s;
}

typedef double (*loss_fn)(void *ctx);

/* Finite-difference check of d loss / d x on `samples` random elements. */
static void fd_check(const char *what, float *x, size_t n, const float *analytic, loss_fn f,
                     void *ctx, int samples, float h) {
    double r = rms(analytic, n);
    ASSERT_TRUE(r > 0.0);
    for (int s = 0; s < samples; s++) {
        size_t i = samples >= (int)n ? (size_t)s : dt_rng_below(&g_rng, (uint32_t)n);
        if (i >= n)
            break;
        float x0 = x[i];
        x[i] = x0 + h;
        double lp = f(ctx);
        x[i] = x0 - h;
        double lm = f(ctx);
        x[i] = x0;
        double fd = (lp - lm) / (2.0 * (double)h);
        double err = fabs(fd - analytic[i]) / (fabs((double)analytic[i]) + r);
        if (!(err <= 1e-2))
            TEST_FAILF("%s: d/dx[%zu]: finite difference %.7g, backward %.7g (rel err %.3g)", what,
                       i, fd, analytic[i], err);
    }
}

/* ---------------------------------------------------------------- layernorm */

typedef struct ln_ctx {
    int N, C;
    float *out, *mean, *rstd, *inp, *w, *b, *dout;
} ln_ctx;

static double ln_loss(void *p) {
    ln_ctx *c = p;
    dt_layernorm_forward(c->out, c->mean, c->rstd, c->inp, c->w, c->b, c->N, c->C);
    return proj(c->out, c->dout, (size_t)c->N * c->C);
}

static void test_layernorm(void) {
    int sizes[][2] = {{5, 7}, {6, 48}, {33, 100}};
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        int N = sizes[k][0], C = sizes[k][1];
        size_t NC = (size_t)N * C;
        ln_ctx c = {N,
                    C,
                    zerov(NC),
                    zerov(N),
                    zerov(N),
                    randv(NC, 1.0f),
                    randv(C, 1.0f),
                    randv(C, 1.0f),
                    randv(NC, 1.0f)};
        for (int i = 0; i < C; i++)
            c.w[i] += 1.0f;
        /* forward against float64 */
        ln_loss(&c);
        float *ref = zerov(NC);
        for (int i = 0; i < N; i++) {
            double m = 0, v = 0;
            for (int j = 0; j < C; j++)
                m += c.inp[(size_t)i * C + j];
            m /= C;
            for (int j = 0; j < C; j++)
                v += pow(c.inp[(size_t)i * C + j] - m, 2);
            v /= C;
            for (int j = 0; j < C; j++) {
                double y = (c.inp[(size_t)i * C + j] - m) / sqrt(v + 1e-5) * c.w[j] + c.b[j];
                ref[(size_t)i * C + j] = (float)y;
            }
        }
        check_close("layernorm forward", c.out, ref, NC, 1e-5);
        free(ref);
        float *dinp = zerov(NC), *dw = zerov(C), *db = zerov(C);
        dt_layernorm_backward(dinp, dw, db, c.dout, c.inp, c.w, c.mean, c.rstd, N, C);
        fd_check("layernorm dinp", c.inp, NC, dinp, ln_loss, &c, 48, 1e-2f);
        fd_check("layernorm dweight", c.w, C, dw, ln_loss, &c, 24, 1e-2f);
        fd_check("layernorm dbias", c.b, C, db, ln_loss, &c, 24, 1e-2f);
        /* accumulation: a second backward doubles the gradients */
        float *dw1 = malloc(C * sizeof(float));
        memcpy(dw1, dw, C * sizeof(float));
        dt_layernorm_backward(dinp, dw, db, c.dout, c.inp, c.w, c.mean, c.rstd, N, C);
        for (int i = 0; i < C; i++)
            dw1[i] *= 2.0f;
        check_close("layernorm dweight accumulates", dw, dw1, C, 1e-6);
        free(dw1);
        free(dinp), free(dw), free(db);
        free(c.out), free(c.mean), free(c.rstd), free(c.inp), free(c.w), free(c.b), free(c.dout);
    }
}

/* --------------------------------------------------------------------- GELU */

typedef struct gelu_ctx {
    size_t n;
    float *out, *inp, *dout;
} gelu_ctx;

static double gelu_loss(void *p) {
    gelu_ctx *c = p;
    dt_gelu_forward(c->out, c->inp, c->n);
    return proj(c->out, c->dout, c->n);
}

static void test_gelu(void) {
    size_t n = 1000; /* not a multiple of 16: exercises the scalar tail */
    gelu_ctx c = {n, zerov(n), randv(n, 2.0f), randv(n, 1.0f)};
    c.inp[0] = 0.0f;
    c.inp[1] = 30.0f; /* saturated tanh must not give NaN */
    c.inp[2] = -30.0f;
    gelu_loss(&c);
    for (size_t i = 0; i < n; i++) {
        double x = c.inp[i];
        double y = 0.5 * x * (1.0 + tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
        float yf = (float)y;
        float scale = 1.0f;
        double err = fabs(c.out[i] - yf) / (fabs(yf) + scale);
        if (!(err <= 2e-6))
            TEST_FAILF("gelu(%g) = %.9g, expected %.9g", x, c.out[i], yf);
    }
    float *dinp = zerov(n);
    dt_gelu_backward(dinp, c.inp, c.dout, n);
    fd_check("gelu dinp", c.inp, n, dinp, gelu_loss, &c, 64, 1e-2f);
    free(dinp), free(c.out), free(c.inp), free(c.dout);
}

/* The GELU bias fold of the GPT forward: gelu(inp + bias) with inp left as
 * it is, against float64, and its backward against the unfused
 * dt_gelu_backward, with a row width that leaves a scalar tail (37) and one
 * of whole vectors (64). (The residual's bias fold: test_residual_layernorm.) */
static void test_bias_folds(void) {
    const int widths[] = {37, 64};
    for (int w = 0; w < 2; w++) {
        int N = 9, C = widths[w];
        size_t n = (size_t)N * C;
        float *x = randv(n, 2.0f), *x0 = malloc(n * sizeof(float)), *bias = randv((size_t)C, 1.0f);
        float *out = zerov(n);
        ASSERT_TRUE(x0 != NULL);
        memcpy(x0, x, n * sizeof(float));
        dt_gelu_bias_forward(out, x, bias, N, C);
        for (size_t i = 0; i < n; i++) {
            float v = x0[i] + bias[i % (size_t)C];
            if (x[i] != x0[i])
                TEST_FAILF("gelu_bias: inp[%zu] = %.9g, expected unchanged %.9g", i, x[i], x0[i]);
            double y =
                0.5 * v * (1.0 + tanh(0.7978845608028654 * (v + 0.044715 * (double)v * v * v)));
            if (!(fabs(out[i] - y) / (fabs(y) + 1.0) <= 2e-6))
                TEST_FAILF("gelu_bias: out[%zu] = %.9g, expected %.9g", i, out[i], y);
        }
        /* backward: x + bias formed as the forward forms it, so the result
         * equals dt_gelu_backward on the biased input (bit for bit where both
         * take the same vector or scalar path; a row's tail may be scalar
         * here and vector there); in place (dinp == dout) as the GPT calls it. */
        float *xb = zerov(n), *ref = zerov(n), *dy = randv(n, 1.0f);
        for (size_t i = 0; i < n; i++)
            xb[i] = x0[i] + bias[i % (size_t)C];
        dt_gelu_backward(ref, xb, dy, n);
        dt_gelu_bias_backward(dy, x0, bias, dy, N, C);
        for (size_t i = 0; i < n; i++)
            if (!(fabs(dy[i] - ref[i]) <= 2e-6 * (fabs(ref[i]) + 1.0)))
                TEST_FAILF("gelu_bias_backward: dinp[%zu] = %.9g, expected %.9g", i, dy[i], ref[i]);
        free(xb), free(ref), free(dy);
        free(x), free(x0), free(bias), free(out);
    }
}

/* ------------------------------------------------------------------- matmul */

typedef struct mm_ctx {
    int N, IC, OC;
    float *out, *inp, *w, *b, *dout;
} mm_ctx;

static double mm_loss(void *p) {
    mm_ctx *c = p;
    dt_matmul_forward(c->out, c->inp, c->w, c->b, c->N, c->IC, c->OC);
    return proj(c->out, c->dout, (size_t)c->N * c->OC);
}

static void test_matmul(void) {
    int N = 13, IC = 24, OC = 70;
    mm_ctx c = {N,
                IC,
                OC,
                zerov((size_t)N * OC),
                randv((size_t)N * IC, 1.0f),
                randv((size_t)OC * IC, 0.2f),
                randv(OC, 1.0f),
                randv((size_t)N * OC, 1.0f)};
    mm_loss(&c);
    float *ref = zerov((size_t)N * OC);
    for (int i = 0; i < N; i++)
        for (int o = 0; o < OC; o++) {
            double s = c.b[o];
            for (int k = 0; k < IC; k++)
                s += (double)c.inp[(size_t)i * IC + k] * c.w[(size_t)o * IC + k];
            ref[(size_t)i * OC + o] = (float)s;
        }
    check_close("matmul forward", c.out, ref, (size_t)N * OC, 1e-5);
    free(ref);
    float *dinp = zerov((size_t)N * IC), *dw = zerov((size_t)OC * IC), *db = zerov(OC);
    dt_matmul_backward(dinp, dw, db, c.dout, c.inp, c.w, N, IC, OC);
    fd_check("matmul dinp", c.inp, (size_t)N * IC, dinp, mm_loss, &c, 32, 1e-2f);
    fd_check("matmul dweight", c.w, (size_t)OC * IC, dw, mm_loss, &c, 32, 1e-2f);
    fd_check("matmul dbias", c.b, OC, db, mm_loss, &c, 32, 1e-2f);
    free(dinp), free(dw), free(db);
    free(c.out), free(c.inp), free(c.w), free(c.b), free(c.dout);
}

/* Large products are split across threads by rows or columns of C: every
 * transpose combination, both split directions, against float64. */
static void test_sgemm_split(void) {
    int shapes[][3] = {{200, 130, 100}, {70, 300, 120}}; /* split M, split N */
    for (int s = 0; s < 2; s++)
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++) {
                int M = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
                float *A = randv((size_t)M * K, 1.0f), *B = randv((size_t)K * N, 1.0f);
                float *C = randv((size_t)M * N, 1.0f), *ref = zerov((size_t)M * N);
                int lda = ta ? M : K, ldb = tb ? K : N;
                for (int i = 0; i < M; i++)
                    for (int j = 0; j < N; j++) {
                        double acc = 0.0;
                        for (int k = 0; k < K; k++)
                            acc += (double)(ta ? A[(size_t)k * lda + i] : A[(size_t)i * lda + k]) *
                                   (tb ? B[(size_t)j * ldb + k] : B[(size_t)k * ldb + j]);
                        ref[(size_t)i * N + j] = (float)(0.5 * acc + 2.0 * C[(size_t)i * N + j]);
                    }
                dt_sgemm(ta, tb, M, N, K, 0.5f, A, lda, B, ldb, 2.0f, C, N);
                char what[64];
                snprintf(what, sizeof what, "sgemm %dx%dx%d ta=%d tb=%d", M, N, K, ta, tb);
                check_close(what, C, ref, (size_t)M * N, 1e-5);
                free(A), free(B), free(C), free(ref);
            }
}

/* Linear layers large enough to be split across threads (by tokens or by
 * output channels) agree with the single-thread results. */
static void test_matmul_split(void) {
    int shapes[][3] = {{130, 64, 300}, {300, 80, 100}}; /* (N, IC, OC) */
    for (int s = 0; s < 2; s++) {
        int N = shapes[s][0], IC = shapes[s][1], OC = shapes[s][2];
        float *inp = randv((size_t)N * IC, 1.0f), *w = randv((size_t)OC * IC, 0.2f);
        float *b = randv(OC, 1.0f), *dout = randv((size_t)N * OC, 1.0f);
        float *out[2], *dinp[2], *dw[2], *db[2];
        for (int k = 0; k < 2; k++) {
            dt_tensor_set_threads(k + 1);
            out[k] = zerov((size_t)N * OC);
            dinp[k] = zerov((size_t)N * IC);
            dw[k] = zerov((size_t)OC * IC);
            db[k] = zerov(OC);
            dt_matmul_forward(out[k], inp, w, b, N, IC, OC);
            dt_matmul_backward(dinp[k], dw[k], db[k], dout, inp, w, N, IC, OC);
        }
        dt_tensor_set_threads(2);
        check_close("split matmul out", out[1], out[0], (size_t)N * OC, 1e-6);
        check_close("split matmul dinp", dinp[1], dinp[0], (size_t)N * IC, 1e-6);
        check_close("split matmul dweight", dw[1], dw[0], (size_t)OC * IC, 1e-6);
        ASSERT_TRUE(memcmp(db[0], db[1], OC * sizeof(float)) == 0);
        for (int k = 0; k < 2; k++)
            free(out[k]), free(dinp[k]), free(dw[k]), free(db[k]);
        free(inp), free(w), free(b), free(dout);
    }
}

/* The weight gradient sums over tokens in chunks (gemm.c TN_CHUNK): more
 * tokens than two chunks with a tail, split by output and by input
 * channels, accumulating into a non-zero dweight, against float64. */
static void test_matmul_dweight_chunks(void) {
    int shapes[][3] = {{1100, 24, 40}, {1100, 40, 24}}; /* (N, IC, OC) */
    for (int s = 0; s < 2; s++) {
        int N = shapes[s][0], IC = shapes[s][1], OC = shapes[s][2];
        float *inp = randv((size_t)N * IC, 1.0f), *dout = randv((size_t)N * OC, 1.0f);
        float *w = randv((size_t)OC * IC, 0.2f), *dw = randv((size_t)OC * IC, 1.0f);
        float *ref = zerov((size_t)OC * IC);
        for (int o = 0; o < OC; o++)
            for (int i = 0; i < IC; i++) {
                double acc = dw[(size_t)o * IC + i];
                for (int k = 0; k < N; k++)
                    acc += (double)dout[(size_t)k * OC + o] * inp[(size_t)k * IC + i];
                ref[(size_t)o * IC + i] = (float)acc;
            }
        dt_matmul_backward(NULL, dw, NULL, dout, inp, w, N, IC, OC);
        check_close("chunked dweight", dw, ref, (size_t)OC * IC, 1e-5);
        free(inp), free(dout), free(w), free(dw), free(ref);
    }
}

static float *nanv(size_t n) {
    float *x = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++)
        x[i] = NAN;
    return x;
}

static void assert_bits(const char *what, const float *got, const float *ref, size_t n) {
    for (size_t i = 0; i < n; i++) {
        uint32_t a, b;
        memcpy(&a, &got[i], 4);
        memcpy(&b, &ref[i], 4);
        if (a != b)
            TEST_FAILF("%s[%zu]: %.9g (0x%08x), expected %.9g (0x%08x)", what, i, got[i], a, ref[i],
                       b);
    }
}

/* The _mode kernels with DT_GRAD_OVERWRITE on NaN-filled gradients write
 * the bits of zero + DT_GRAD_ACCUMULATE: linear layers split by output and
 * by input channels, over several token chunks, on 1 and 2 threads, with
 * the AVX-512 weight-gradient kernel and with sgemm (DT_ISA avx2);
 * LayerNorm on its one-pass and column-block paths; wpe's rows. */
static void test_grad_overwrite(void) {
    const dt_isa_level isa0 = dt_isa();
    const int threads0 = dt_tensor_threads();
    int shapes[][3] = {{1100, 24, 40}, {1100, 40, 24}, {130, 64, 300}, {300, 80, 100}};
    for (int iso = 0; iso < 2; iso++) {
        if (iso == 1 && dt_isa_set(isa0 < DT_ISA_AVX2 ? isa0 : DT_ISA_AVX2) != DT_OK)
            break;
        for (int th = 1; th <= 2; th++) {
            dt_tensor_set_threads(th);
            for (int s = 0; s < 4; s++) {
                int N = shapes[s][0], IC = shapes[s][1], OC = shapes[s][2];
                float *inp = randv((size_t)N * IC, 1.0f), *w = randv((size_t)OC * IC, 0.2f);
                float *dout = randv((size_t)N * OC, 1.0f);
                float *dw0 = zerov((size_t)OC * IC), *db0 = zerov(OC);
                float *dw1 = nanv((size_t)OC * IC), *db1 = nanv(OC);
                dt_matmul_backward(NULL, dw0, db0, dout, inp, w, N, IC, OC);
                dt_matmul_backward_mode(NULL, dw1, db1, dout, inp, w, N, IC, OC, DT_GRAD_OVERWRITE);
                assert_bits("overwritten dweight", dw1, dw0, (size_t)OC * IC);
                assert_bits("overwritten dbias", db1, db0, OC);
                free(inp), free(w), free(dout), free(dw0), free(db0), free(dw1), free(db1);
            }
            /* LayerNorm: N*C above the threading threshold (2 threads: column blocks) */
            int N = 300, C = 200;
            float *x = randv((size_t)N * C, 1.0f), *dy = randv((size_t)N * C, 1.0f);
            float *wt = randv(C, 1.0f), *bs = randv(C, 1.0f), *y = zerov((size_t)N * C);
            float *mean = zerov(N), *rstd = zerov(N), *dx = zerov((size_t)N * C);
            float *gw0 = zerov(C), *gb0 = zerov(C), *gw1 = nanv(C), *gb1 = nanv(C);
            dt_layernorm_forward(y, mean, rstd, x, wt, bs, N, C);
            dt_layernorm_backward(dx, gw0, gb0, dy, x, wt, mean, rstd, N, C);
            dt_layernorm_backward_mode(dx, gw1, gb1, dy, x, wt, mean, rstd, N, C,
                                       DT_GRAD_OVERWRITE);
            assert_bits("overwritten ln dweight", gw1, gw0, C);
            assert_bits("overwritten ln dbias", gb1, gb0, C);
            free(x), free(dy), free(wt), free(bs), free(y), free(mean), free(rstd), free(dx);
            free(gw0), free(gb0), free(gw1), free(gb1);
        }
        /* Embedding: wpe rows [0,T) overwritten, rows past T untouched, wte added to. */
        int B = 3, T = 50, Tmax = 64, V = 11, C = 96;
        int32_t tok[150];
        for (int i = 0; i < B * T; i++)
            tok[i] = (int32_t)dt_rng_below(&g_rng, (uint32_t)V);
        float *dout = randv((size_t)B * T * C, 1.0f), *wte0 = randv((size_t)V * C, 1.0f);
        float *wte1 = malloc((size_t)V * C * sizeof(float));
        memcpy(wte1, wte0, (size_t)V * C * sizeof(float));
        float *wpe0 = zerov((size_t)Tmax * C), *wpe1 = nanv((size_t)Tmax * C);
        dt_embedding_backward(wte0, wpe0, dout, tok, B, T, C);
        dt_embedding_backward_mode(wte1, wpe1, dout, tok, B, T, C, DT_GRAD_OVERWRITE);
        assert_bits("embedding dwte", wte1, wte0, (size_t)V * C);
        assert_bits("overwritten dwpe", wpe1, wpe0, (size_t)T * C);
        for (size_t i = (size_t)T * C; i < (size_t)Tmax * C; i++)
            ASSERT_TRUE(isnan(wpe1[i]));
        free(dout), free(wte0), free(wte1), free(wpe0), free(wpe1);
    }
    ASSERT_OK(dt_isa_set(isa0));
    dt_tensor_set_threads(threads0);
}

/* dt_residual_layernorm_forward = a + (b + bias), or dt_residual_forward without bias, then
 * dt_layernorm_forward, bit for bit, with and without the bias, on 1 and 2 threads. */
static void test_residual_layernorm(void) {
    const int threads0 = dt_tensor_threads();
    int N = 300, C = 200;
    float *a = randv((size_t)N * C, 1.0f), *b = randv((size_t)N * C, 1.0f);
    float *bias = randv(C, 1.0f), *w = randv(C, 1.0f), *lb = randv(C, 1.0f);
    float *r0 = zerov((size_t)N * C), *y0 = zerov((size_t)N * C), *m0 = zerov(N), *s0 = zerov(N);
    float *r1 = nanv((size_t)N * C), *y1 = nanv((size_t)N * C), *m1 = nanv(N), *s1 = nanv(N);
    for (int th = 1; th <= 2; th++) {
        dt_tensor_set_threads(th);
        for (int withb = 0; withb < 2; withb++) {
            if (withb) /* the model's formula: the linear layer's bias, then the add */
                for (size_t i = 0; i < (size_t)N * C; i++)
                    r0[i] = a[i] + (b[i] + bias[i % (size_t)C]);
            else
                dt_residual_forward(r0, a, b, (size_t)N * C);
            dt_layernorm_forward(y0, m0, s0, r0, w, lb, N, C);
            dt_residual_layernorm_forward(r1, y1, m1, s1, a, b, withb ? bias : NULL, w, lb, N, C);
            assert_bits("fused residual", r1, r0, (size_t)N * C);
            assert_bits("fused layernorm out", y1, y0, (size_t)N * C);
            assert_bits("fused layernorm mean", m1, m0, N);
            assert_bits("fused layernorm rstd", s1, s0, N);
        }
    }
    free(a), free(b), free(bias), free(w), free(lb);
    free(r0), free(y0), free(m0), free(s0), free(r1), free(y1), free(m1), free(s1);
    dt_tensor_set_threads(threads0);
}

/* ------------------------------------------------------------ cross-entropy */

typedef struct ce_ctx {
    int N, V;
    float *losses, *lse, *logits;
    int32_t *targets;
} ce_ctx;

static double ce_loss(void *p) {
    ce_ctx *c = p;
    return dt_crossentropy_forward(c->losses, c->lse, c->logits, c->targets, c->N, c->V);
}

static void test_crossentropy(void) {
    int N = 9, V = 67;
    ce_ctx c = {N, V, zerov(N), zerov(N), randv((size_t)N * V, 3.0f), malloc(N * sizeof(int32_t))};
    for (int i = 0; i < N; i++)
        c.targets[i] = (int32_t)dt_rng_below(&g_rng, (uint32_t)V);
    float mean = (float)ce_loss(&c);
    double ref = 0.0;
    for (int i = 0; i < N; i++) {
        double m = -1e30, s = 0.0;
        for (int j = 0; j < V; j++)
            m = fmax(m, c.logits[(size_t)i * V + j]);
        for (int j = 0; j < V; j++)
            s += exp(c.logits[(size_t)i * V + j] - m);
        ref += m + log(s) - c.logits[(size_t)i * V + c.targets[i]];
    }
    float reff = (float)(ref / N);
    check_close("cross-entropy mean loss", &mean, &reff, 1, 1e-6);
    /* softmax rows sum to one and match exp(x - lse) */
    float *probs = zerov((size_t)N * V);
    dt_softmax_forward(probs, c.logits, N, V);
    for (int i = 0; i < N; i++) {
        double s = 0.0;
        for (int j = 0; j < V; j++)
            s += probs[(size_t)i * V + j];
        float sf = (float)s, one = 1.0f;
        check_close("softmax row sum", &sf, &one, 1, 1e-6);
    }
    float *dlogits = zerov((size_t)N * V);
    dt_crossentropy_backward(dlogits, c.logits, c.lse, c.targets, 1.0f / N, N, V);
    fd_check("cross-entropy dlogits", c.logits, (size_t)N * V, dlogits, ce_loss, &c, 64, 1e-2f);
    free(probs), free(dlogits);
    free(c.losses), free(c.lse), free(c.logits), free(c.targets);
}

/* ---------------------------------------------------------------- embedding */

typedef struct emb_ctx {
    int B, T, C;
    float *out, *wte, *wpe, *dout;
    int32_t *tok;
} emb_ctx;

static double emb_loss(void *p) {
    emb_ctx *c = p;
    dt_embedding_forward(c->out, c->tok, c->wte, c->wpe, c->B, c->T, c->C);
    return proj(c->out, c->dout, (size_t)c->B * c->T * c->C);
}

static void test_embedding(void) {
    int B = 3, T = 5, C = 70, V = 4; /* V < B*T: tokens repeat, rows accumulate */
    size_t BTC = (size_t)B * T * C;
    emb_ctx c = {B,
                 T,
                 C,
                 zerov(BTC),
                 randv((size_t)V * C, 1.0f),
                 randv((size_t)T * C, 1.0f),
                 randv(BTC, 1.0f),
                 malloc(B * T * sizeof(int32_t))};
    for (int i = 0; i < B * T; i++)
        c.tok[i] = i % V;
    emb_loss(&c);
    float *dwte = zerov((size_t)V * C), *dwpe = zerov((size_t)T * C);
    dt_embedding_backward(dwte, dwpe, c.dout, c.tok, B, T, C);
    fd_check("embedding dwte", c.wte, (size_t)V * C, dwte, emb_loss, &c, 40, 1e-2f);
    fd_check("embedding dwpe", c.wpe, (size_t)T * C, dwpe, emb_loss, &c, 40, 1e-2f);
    /* residual: out = a + b, backward adds dout to both */
    float *r = zerov(BTC), *da = zerov(BTC);
    dt_residual_forward(r, c.out, c.dout, BTC);
    ASSERT_TRUE(r[7] == c.out[7] + c.dout[7]);
    dt_residual_backward(da, NULL, c.dout, BTC);
    dt_residual_backward(da, NULL, c.dout, BTC);
    ASSERT_TRUE(da[11] == 2.0f * c.dout[11]);
    free(r), free(da), free(dwte), free(dwpe);
    free(c.out), free(c.wte), free(c.wpe), free(c.dout), free(c.tok);
}

/* ---------------------------------------------------------------- attention */

typedef struct att_ctx {
    int B, T, C, NH;
    float *out, *lse, *qkv, *dout;
} att_ctx;

static double att_loss(void *p) {
    att_ctx *c = p;
    dt_attention_forward(c->out, c->lse, c->qkv, c->B, c->T, c->C, c->NH);
    return proj(c->out, c->dout, (size_t)c->B * c->T * c->C);
}

static void test_attention_fd(void) {
    int B = 2, T = 70, C = 24, NH = 2; /* T crosses a block; head size 12 */
    size_t BTC = (size_t)B * T * C;
    att_ctx c = {
        B, T, C, NH, zerov(BTC), zerov((size_t)B * NH * T), randv(3 * BTC, 1.0f), randv(BTC, 1.0f)};
    att_loss(&c);
    float *dqkv = zerov(3 * BTC);
    dt_attention_backward(dqkv, c.dout, c.qkv, c.out, c.lse, B, T, C, NH);
    fd_check("flash attention dqkv", c.qkv, 3 * BTC, dqkv, att_loss, &c, 96, 1e-2f);
    free(dqkv), free(c.out), free(c.lse), free(c.qkv), free(c.dout);
}

/* Flash against naive, forward and backward, over block-boundary sizes
 * (64-query blocks; 300 > 256 also joins two forward key tiles). */
static void test_flash_vs_naive(void) {
    int Ts[] = {1, 7, 63, 64, 65, 129, 200, 300};
    int shapes[][2] = {{16, 2}, {24, 2}, {128, 2}}; /* (C, NH): head sizes 8, 12, 64 */
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (size_t k = 0; k < sizeof Ts / sizeof Ts[0]; k++) {
            int B = 2, T = Ts[k], C = shapes[s][0], NH = shapes[s][1];
            size_t BTC = (size_t)B * T * C;
            float *qkv = randv(3 * BTC, 1.5f), *dout = randv(BTC, 1.0f);
            float *o1 = zerov(BTC), *o2 = zerov(BTC), *lse = zerov((size_t)B * NH * T);
            float *att = zerov((size_t)B * NH * T * T);
            float *d1 = zerov(3 * BTC), *d2 = zerov(3 * BTC);
            dt_attention_forward(o1, lse, qkv, B, T, C, NH);
            dt_attention_naive_forward(o2, att, qkv, B, T, C, NH);
            char what[96];
            snprintf(what, sizeof what, "flash vs naive out (T=%d, HS=%d)", T, C / NH);
            check_close(what, o1, o2, BTC, 1e-5);
            memset(d1, 0x7f, 3 * BTC * sizeof(float)); /* backward must overwrite */
            dt_attention_backward(d1, dout, qkv, o1, lse, B, T, C, NH);
            dt_attention_naive_backward(d2, dout, qkv, att, B, T, C, NH);
            snprintf(what, sizeof what, "flash vs naive dqkv (T=%d, HS=%d)", T, C / NH);
            check_close(what, d1, d2, 3 * BTC, 1e-4);
            free(qkv), free(dout), free(o1), free(o2), free(lse), free(att), free(d1), free(d2);
        }
}

/* The same results with 1 and 2 threads (threads own rows or heads). */
static void test_thread_invariance(void) {
    int B = 3, T = 100, C = 64, NH = 4;
    size_t BTC = (size_t)B * T * C;
    float *qkv = randv(3 * BTC, 1.0f), *dout = randv(BTC, 1.0f);
    float *o[2], *l[2], *d[2];
    for (int k = 0; k < 2; k++) {
        dt_tensor_set_threads(k + 1);
        o[k] = zerov(BTC);
        l[k] = zerov((size_t)B * NH * T);
        d[k] = zerov(3 * BTC);
        dt_attention_forward(o[k], l[k], qkv, B, T, C, NH);
        dt_attention_backward(d[k], dout, qkv, o[k], l[k], B, T, C, NH);
    }
    ASSERT_TRUE(memcmp(o[0], o[1], BTC * sizeof(float)) == 0);
    ASSERT_TRUE(memcmp(d[0], d[1], 3 * BTC * sizeof(float)) == 0);
    /* layernorm backward: one pass on one thread, rows and column blocks
     * on two; the same bits (N*C above the kernels' threading threshold) */
    {
        int N = B * T, LC = 200;
        size_t NC = (size_t)N * LC;
        float *x = randv(NC, 1.0f), *dy = randv(NC, 1.0f), *w = randv(LC, 1.0f);
        float *mean = zerov(N), *rstd = zerov(N), *y = zerov(NC);
        float *dx0 = randv(NC, 1.0f), *dx[2], *dw[2], *db[2]; /* dinp accumulates into dx0 */
        dt_layernorm_forward(y, mean, rstd, x, w, w, N, LC);
        for (int k = 0; k < 2; k++) {
            dt_tensor_set_threads(k + 1);
            dx[k] = zerov(NC), dw[k] = zerov(LC), db[k] = zerov(LC);
            memcpy(dx[k], dx0, NC * sizeof(float));
            dt_layernorm_backward(dx[k], dw[k], db[k], dy, x, w, mean, rstd, N, LC);
        }
        ASSERT_TRUE(memcmp(dx[0], dx[1], NC * sizeof(float)) == 0);
        ASSERT_TRUE(memcmp(dw[0], dw[1], LC * sizeof(float)) == 0);
        ASSERT_TRUE(memcmp(db[0], db[1], LC * sizeof(float)) == 0);
        for (int k = 0; k < 2; k++)
            free(dx[k]), free(dw[k]), free(db[k]);
        free(x), free(dy), free(w), free(mean), free(rstd), free(y), free(dx0);
    }
    for (int k = 0; k < 2; k++)
        free(o[k]), free(l[k]), free(d[k]);
    free(qkv), free(dout);
    dt_tensor_set_threads(2);
    ASSERT_EQ(dt_tensor_threads(), 2);
}

int main(void) {
    dt_rng_init(&g_rng, 42, dt_rng_stream_id(0, 0, DT_RNG_TEST));
    dt_tensor_set_threads(2);
    printf("# AVX-512 kernels: %s\n", dt_tensor_have_avx512() ? "yes" : "no (scalar fallback)");
    RUN(test_layernorm);
    RUN(test_gelu);
    RUN(test_bias_folds);
    RUN(test_matmul);
    RUN(test_sgemm_split);
    RUN(test_matmul_split);
    RUN(test_matmul_dweight_chunks);
    RUN(test_grad_overwrite);
    RUN(test_residual_layernorm);
    RUN(test_crossentropy);
    RUN(test_embedding);
    RUN(test_attention_fd);
    RUN(test_flash_vs_naive);
    RUN(test_thread_invariance);
    return TEST_SUMMARY();
}
