/*
 * test_gpt_reference.c — the GPT forward, backward and 3 AdamW steps against
 * PyTorch (float64 reference stored as float32 by
 * tests/reference/gen_gpt_reference.py).
 *
 * Tolerances (per element, with r = the reference tensor's RMS so that
 * elements near zero are judged on the tensor's scale):
 *     |ours - ref| <= tol * (|ref| + r)
 *   logits, loss: 1e-5; gradients: 1e-4; parameters after 3 steps: 1e-5.
 * Fixture a has T = 64 (a whole attention block), fixture b T = 77 (a
 * partial block) and a head size of 12 (masked vector tails).
 * The bf16 and fp16 paths are checked against the same fixtures with
 * norm-relative tolerances in units of their roundoff (check_fixture16).
 * tests/nn.cmake runs this program again under DT_ISA=avx2 and scalar.
 */
#include "dtrain/nn.h"
#include "dtrain/optim.h"
#include "test.h"

typedef struct fixture {
    dt_gpt_config cfg;
    int B, T, steps;
    float lr, beta1, beta2, eps, wd;
    int32_t *inputs, *targets;
    float *params, *logits, loss, *grads, *after;
    size_t n;
} fixture;

static void read_exact(FILE *f, void *dst, size_t bytes, const char *what) {
    if (fread(dst, 1, bytes, f) != bytes)
        TEST_FAILF("fixture truncated while reading %s", what);
}

static void *xmalloc(size_t bytes) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p)
        TEST_FAILF("out of memory (%zu bytes)", bytes);
    return p;
}

static void load_fixture(const char *name, fixture *fx) {
    char path[512];
    snprintf(path, sizeof path, "%s/data/%s", DT_TEST_DATA_DIR, name);
    FILE *f = fopen(path, "rb");
    if (!f)
        TEST_FAILF("cannot open fixture %s", path);
    uint32_t hdr[2];
    int32_t dims[7];
    float hp[5];
    read_exact(f, hdr, sizeof hdr, "header");
    ASSERT_EQ(hdr[0], 0x52475444u);
    ASSERT_EQ(hdr[1], 1);
    read_exact(f, dims, sizeof dims, "dims");
    fx->cfg = (dt_gpt_config){dims[0], dims[1], dims[2], dims[3], dims[4]};
    fx->B = dims[5];
    fx->T = dims[6];
    read_exact(f, hp, sizeof hp, "hyperparameters");
    read_exact(f, &fx->steps, sizeof fx->steps, "steps");
    fx->lr = hp[0];
    fx->beta1 = hp[1];
    fx->beta2 = hp[2];
    fx->eps = hp[3];
    fx->wd = hp[4];
    ASSERT_OK(dt_gpt_config_validate(&fx->cfg));
    size_t BT = (size_t)fx->B * fx->T, V = (size_t)fx->cfg.vocab;
    fx->n = dt_gpt_config_num_params(&fx->cfg);
    fx->inputs = xmalloc(BT * 4);
    fx->targets = xmalloc(BT * 4);
    fx->params = xmalloc(fx->n * 4);
    fx->logits = xmalloc(BT * V * 4);
    fx->grads = xmalloc(fx->n * 4);
    fx->after = xmalloc(fx->n * 4);
    read_exact(f, fx->inputs, BT * 4, "inputs");
    read_exact(f, fx->targets, BT * 4, "targets");
    read_exact(f, fx->params, fx->n * 4, "params");
    read_exact(f, fx->logits, BT * V * 4, "logits");
    read_exact(f, &fx->loss, 4, "loss");
    read_exact(f, fx->grads, fx->n * 4, "grads");
    read_exact(f, fx->after, fx->n * 4, "params after AdamW");
    char extra;
    ASSERT_EQ(fread(&extra, 1, 1, f), 0); /* nothing left over: the layouts agree */
    fclose(f);
}

static void free_fixture(fixture *fx) {
    free(fx->inputs);
    free(fx->targets);
    free(fx->params);
    free(fx->logits);
    free(fx->grads);
    free(fx->after);
}

/* Compare one tensor; print the worst element on failure. */
static void check_close(const char *fx, const char *what, const float *got, const float *ref,
                        size_t n, double tol) {
    double ss = 0.0;
    for (size_t i = 0; i < n; i++)
        ss += (double)ref[i] * ref[i];
    double rms = n ? sqrt(ss / (double)n) : 0.0;
    double worst = 0.0;
    size_t wi = 0;
    for (size_t i = 0; i < n; i++) {
        double err = fabs((double)got[i] - ref[i]) / (fabs((double)ref[i]) + rms + 1e-30);
        if (!(err <= worst)) { /* also catches NaN */
            worst = err;
            wi = i;
        }
    }
    if (!(worst <= tol))
        TEST_FAILF("%s %s: element %zu: ours %.9g, PyTorch %.9g (rel err %.3g > %.1g, tensor "
                   "rms %.3g)",
                   fx, what, wi, got[wi], ref[wi], worst, tol, rms);
}

static void check_fixture(const char *name) {
    fixture fx;
    load_fixture(name, &fx);
    dt_gpt *m;
    ASSERT_OK(dt_gpt_create(&m, &fx.cfg, fx.B, fx.T));
    ASSERT_EQ(dt_gpt_num_params(m), fx.n);
    memcpy(dt_gpt_params(m), fx.params, fx.n * 4);

    float loss;
    ASSERT_OK(dt_gpt_forward(m, fx.inputs, fx.targets, fx.B, fx.T, &loss));
    size_t BTV = (size_t)fx.B * fx.T * fx.cfg.vocab;
    check_close(name, "logits", dt_gpt_logits(m), fx.logits, BTV, 1e-5);
    check_close(name, "loss", &loss, &fx.loss, 1, 1e-5);

    dt_gpt_zero_grads(m);
    ASSERT_OK(dt_gpt_backward(m, 1.0f, NULL, NULL));
    for (size_t t = 0; t < dt_gpt_num_tensors(m); t++) {
        dt_param_info pi;
        dt_gpt_tensor_info(m, t, &pi);
        char what[96];
        snprintf(what, sizeof what, "grad of %s", pi.name);
        check_close(name, what, dt_gpt_grads(m) + pi.offset, fx.grads + pi.offset,
                    pi.rows * pi.cols, 1e-4);
    }

    /* 3 AdamW steps on the same batch, decay only where info.decay. */
    float *mom = calloc(fx.n, 4), *var = calloc(fx.n, 4);
    ASSERT_TRUE(mom && var);
    dt_adamw_config ac = {fx.beta1, fx.beta2, fx.eps, fx.wd};
    for (int s = 1; s <= fx.steps; s++) {
        if (s > 1) {
            ASSERT_OK(dt_gpt_forward(m, fx.inputs, fx.targets, fx.B, fx.T, NULL));
            dt_gpt_zero_grads(m);
            ASSERT_OK(dt_gpt_backward(m, 1.0f, NULL, NULL));
        }
        for (size_t t = 0; t < dt_gpt_num_tensors(m); t++) {
            dt_param_info pi;
            dt_gpt_tensor_info(m, t, &pi);
            size_t o = pi.offset;
            dt_adamw_step(dt_gpt_params(m) + o, dt_gpt_grads(m) + o, mom + o, var + o,
                          pi.rows * pi.cols, fx.lr, &ac, s, pi.decay ? fx.wd : 0.0f);
        }
    }
    for (size_t t = 0; t < dt_gpt_num_tensors(m); t++) {
        dt_param_info pi;
        dt_gpt_tensor_info(m, t, &pi);
        char what[96];
        snprintf(what, sizeof what, "%s after %d AdamW steps", pi.name, fx.steps);
        check_close(name, what, dt_gpt_params(m) + pi.offset, fx.after + pi.offset,
                    pi.rows * pi.cols, 1e-5);
    }
    free(mom);
    free(var);
    dt_gpt_destroy(m);
    free_fixture(&fx);
}

/* ||got - ref|| / ||ref|| over n elements (0 when both are zero). */
static double rel_norm_err(const float *got, const float *ref, size_t n) {
    double d = 0.0, r = 0.0;
    for (size_t i = 0; i < n; i++) {
        double e = (double)got[i] - ref[i];
        d += e * e;
        r += (double)ref[i] * ref[i];
    }
    return r > 0 ? sqrt(d / r) : sqrt(d);
}

/* The bf16/fp16 path against the same float64 PyTorch reference. Errors
 * are judged relative to each tensor's norm (a 16-bit activation is off by
 * up to half a unit in the last place of ITS value, so per-element checks
 * would fail on elements near zero that do not matter). With unit roundoff
 * u (bf16 2^-8 = 3.9e-3, fp16 2^-11 = 4.9e-4) every 16-bit tensor carries a
 * relative error of about u/(2 sqrt 3) RMS, and the logits and gradients go
 * through a handful of such roundings in series (weights, ln, qkv, atty,
 * fch, gelu, dout): measured 1.2-1.3u for logits and whole gradients, <= 2u
 * for the worst tensor (ln_2.weight), the loss (a mean over B*T tokens)
 * 0.02u. Tolerances about twice that: logits 3u, loss 0.5u, gradient 3u,
 * any one tensor's gradient 5u. A path that rounded the residual stream or
 * a statistic, or fed a stale or fp32-misread dout, is off by far more
 * (tens of u or worse). */
static void check_fixture16(const char *name, dt_precision pr) {
    fixture fx;
    load_fixture(name, &fx);
    dt_gpt *m;
    dt_gpt_options opt = {.precision = pr, .recompute_every = 0};
    ASSERT_OK(dt_gpt_create_with(&m, &fx.cfg, fx.B, fx.T, &opt));
    memcpy(dt_gpt_params(m), fx.params, fx.n * 4);
    const double u = pr == DT_PRECISION_BF16 ? 0x1p-8 : 0x1p-11;
    float loss;
    ASSERT_OK(dt_gpt_forward(m, fx.inputs, fx.targets, fx.B, fx.T, &loss));
    size_t BTV = (size_t)fx.B * fx.T * fx.cfg.vocab;
    double e_logits = rel_norm_err(dt_gpt_logits(m), fx.logits, BTV);
    double e_loss = fabs((double)loss - fx.loss) / fx.loss;
    dt_gpt_zero_grads(m);
    ASSERT_OK(dt_gpt_backward(m, 1.0f, NULL, NULL));
    double e_all = rel_norm_err(dt_gpt_grads(m), fx.grads, fx.n), e_worst = 0.0;
    const char *worst = "";
    for (size_t t = 0; t < dt_gpt_num_tensors(m); t++) {
        dt_param_info pi;
        dt_gpt_tensor_info(m, t, &pi);
        double e =
            rel_norm_err(dt_gpt_grads(m) + pi.offset, fx.grads + pi.offset, pi.rows * pi.cols);
        if (!(e <= e_worst)) {
            e_worst = e;
            worst = pi.name;
        }
    }
    printf("  %s %s: rel errors logits %.2e (%.1fu), loss %.2e (%.1fu), grads %.2e (%.1fu), "
           "worst tensor %s %.2e (%.1fu)\n",
           name, dt_precision_name(pr), e_logits, e_logits / u, e_loss, e_loss / u, e_all,
           e_all / u, worst, e_worst, e_worst / u);
    if (!(e_logits <= 3 * u))
        TEST_FAILF("%s %s logits: rel error %.3g > 3u = %.3g", name, dt_precision_name(pr),
                   e_logits, 3 * u);
    if (!(e_loss <= 0.5 * u))
        TEST_FAILF("%s %s loss: ours %.7g, PyTorch %.7g (rel error %.3g > u/2 = %.3g)", name,
                   dt_precision_name(pr), loss, fx.loss, e_loss, 0.5 * u);
    if (!(e_all <= 3 * u))
        TEST_FAILF("%s %s gradient: rel error %.3g > 3u = %.3g", name, dt_precision_name(pr), e_all,
                   3 * u);
    if (!(e_worst <= 5 * u))
        TEST_FAILF("%s %s grad of %s: rel error %.3g > 5u = %.3g", name, dt_precision_name(pr),
                   worst, e_worst, 5 * u);
    dt_gpt_destroy(m);
    free_fixture(&fx);
}

static void test_fixture_a(void) { check_fixture("gpt_ref_a.bin"); }
static void test_fixture_b(void) { check_fixture("gpt_ref_b.bin"); }

/* Same fixture with 2 threads and with 1: identical results for our kernels
 * (threads split rows or whole heads); sgemm may differ in the last bits. */
static void test_fixture_threads(void) {
    dt_tensor_set_threads(1);
    check_fixture("gpt_ref_b.bin");
    dt_tensor_set_threads(2);
}

static void test_fixture_bf16(void) {
    check_fixture16("gpt_ref_a.bin", DT_PRECISION_BF16);
    check_fixture16("gpt_ref_b.bin", DT_PRECISION_BF16);
}

static void test_fixture_fp16(void) {
    check_fixture16("gpt_ref_a.bin", DT_PRECISION_FP16);
    check_fixture16("gpt_ref_b.bin", DT_PRECISION_FP16);
}

int main(void) {
    dt_tensor_set_threads(2);
    RUN(test_fixture_a);
    RUN(test_fixture_b);
    RUN(test_fixture_threads);
    RUN(test_fixture_bf16);
    RUN(test_fixture_fp16);
    return TEST_SUMMARY();
}
