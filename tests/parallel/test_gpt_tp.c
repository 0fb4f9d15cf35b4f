/*
 * test_gpt_tp.c — a tensor-parallel shard of the GPT against the whole
 * model, with real processes: tp = 2 and 4 ranks each hold a shard (with
 * and without sequence parallelism, fp32 and bf16, with and without
 * recomputation) and every rank also builds the unsharded model from the
 * same seed. Checked per rank:
 *   - initialisation: the shard's parameters are exactly the whole model's
 *     values in its boxes (padding rows of wte zero);
 *   - two accumulated micro-batches: the mean loss of each, and every
 *     gradient tensor's box, equal the whole model's within a tolerance
 *     for the changed reduction order (fp32: 1e-4 relative L2 of each
 *     tensor; bf16: 4e-2, a few bf16 ulps, since a sum computed in another
 *     order can round an activation to the neighbouring bf16 value);
 *   - sampling: the gathered last-position logits equal the whole model's,
 *     the vocabulary padding is -inf;
 *   - the backward hook reports non-increasing offsets ending at 0, and the
 *     communication points were timed.
 * The vocabulary (97) is not a multiple of tp, so padding is exercised.
 */
#include "comm/harness.h"
#include "dtrain/nn.h"
#include "dtrain/parallel.h"

#include <math.h>

static const dt_gpt_config cfg = {.layers = 2, .dim = 64, .heads = 4, .max_seq = 16, .vocab = 97};
enum { B = 3, T = 16, N = B * T };

static void tokens(int32_t *x, uint64_t stream) {
    dt_rng r;
    dt_rng_init(&r, 42, dt_rng_stream_id(0, stream, DT_RNG_TEST));
    for (int i = 0; i < N; i++)
        x[i] = (int32_t)dt_rng_below(&r, (uint32_t)cfg.vocab);
}

/* Index into the whole model's flat buffer of element (i0, i1, i2) of
 * tensor `pi`'s global box. */
static size_t whole_index(const dt_param_info *w, size_t i0, size_t i1, size_t i2) {
    return w->offset + (i0 * w->shape[1] + i1) * w->shape[2] + i2;
}

/* The shard's tensor k vs the whole model's in its box: exact (tol 0) or
 * within tol relative L2. */
static void compare_box(const char *what, const dt_param_info *s, const float *sbuf,
                        const dt_param_info *w, const float *wbuf, double tol) {
    double num = 0, den = 0;
    const float *p = sbuf + s->offset;
    for (size_t i0 = 0; i0 < s->extent[0]; i0++)
        for (size_t i1 = 0; i1 < s->extent[1]; i1++)
            for (size_t i2 = 0; i2 < s->extent[2]; i2++) {
                float a = *p++, b = wbuf[whole_index(w, s->begin[0] + i0, s->begin[1] + i1,
                                                     s->begin[2] + i2)];
                if (tol == 0 && memcmp(&a, &b, sizeof a) != 0)
                    TEST_FAILF("%s %s[%zu,%zu,%zu]: shard %.9g, whole model %.9g", what, s->name,
                               s->begin[0] + i0, s->begin[1] + i1, s->begin[2] + i2, (double)a,
                               (double)b);
                num += ((double)a - b) * ((double)a - b);
                den += (double)b * b;
            }
    if (tol > 0 && sqrt(num) > tol * sqrt(den) + 1e-12)
        TEST_FAILF("%s %s: relative L2 difference %.3g > %.3g", what, s->name,
                   sqrt(num / (den > 0 ? den : 1)), tol);
    /* Padding rows of wte (beyond its box) stay zero. */
    size_t box = s->extent[0] * s->extent[1] * s->extent[2];
    for (size_t i = box; i < s->rows * s->cols; i++)
        if (sbuf[s->offset + i] != 0.0f)
            TEST_FAILF("%s %s: padding element %zu is %g, not 0", what, s->name, i,
                       (double)sbuf[s->offset + i]);
}

static void compare_models(const char *what, dt_gpt *shard, float *sbuf, dt_gpt *whole, float *wbuf,
                           double tol) {
    for (size_t i = 0; i < dt_gpt_num_tensors(shard); i++) {
        dt_param_info s, w;
        dt_gpt_tensor_info(shard, i, &s);
        dt_gpt_tensor_info(whole, i, &w);
        ASSERT_TRUE(strcmp(s.name, w.name) == 0);
        compare_box(what, &s, sbuf, &w, wbuf, tol);
    }
    (void)dt_gpt_params;
}

/* The hook: offsets reported must not increase and end at 0. */
typedef struct hook_log {
    size_t last;
    int calls;
} hook_log;

static void on_ready(void *user, size_t from) {
    hook_log *h = user;
    if (from > h->last)
        TEST_FAILF("hook: ready_from %zu after %zu", from, h->last);
    h->last = from;
    h->calls++;
}

static void near(const char *what, double a, double b, double tol) {
    if (!(fabs(a - b) <= tol * fabs(b) + 1e-6))
        TEST_FAILF("%s: shard %.9g, whole model %.9g (tolerance %g)", what, a, b, tol);
}

static void run_variant(dt_tp *tp, int rank, int size, bool sp, dt_precision pr, int recompute) {
    char what[96];
    snprintf(what, sizeof what, "tp %d%s %s recompute %d", size, sp ? " sp" : "",
             dt_precision_name(pr), recompute);
    dt_gpt_options wo = {.precision = pr, .recompute_every = recompute};
    dt_gpt_options so = wo;
    so.part = (dt_gpt_part){
        .tp_rank = rank, .tp_size = size, .sequence_parallel = sp, .regions = dt_tp_regions_of(tp)};
    dt_gpt *whole, *shard;
    ASSERT_OK(dt_gpt_create_with(&whole, &cfg, B, T, &wo));
    ASSERT_OK(dt_gpt_create_with(&shard, &cfg, B, T, &so));
    dt_gpt_init_params(whole, 7);
    dt_gpt_init_params(shard, 7);
    compare_models(what, shard, dt_gpt_params(shard), whole, dt_gpt_params(whole), 0);
    double tol = pr == DT_PRECISION_FP32 ? 1e-4 : 4e-2;
    int32_t x[N], y[N];
    for (int k = 0; k < 2; k++) {
        tokens(x, 2 * (uint64_t)k);
        tokens(y, 2 * (uint64_t)k + 1);
        float lw, ls;
        ASSERT_OK(dt_gpt_forward(whole, x, y, B, T, &lw));
        ASSERT_OK(dt_gpt_forward(shard, x, y, B, T, &ls));
        near(what, ls, lw, pr == DT_PRECISION_FP32 ? 1e-5 : 1e-2);
        dt_grad_mode mode = k == 0 ? DT_GRAD_OVERWRITE : DT_GRAD_ACCUMULATE;
        hook_log h = {.last = SIZE_MAX};
        ASSERT_OK(dt_gpt_backward_mode(whole, 0.5f, mode, NULL, NULL));
        ASSERT_OK(dt_gpt_backward_mode(shard, 0.5f, mode, on_ready, &h));
        ASSERT_EQ(h.last, 0);
        ASSERT_EQ(h.calls, cfg.layers + 1);
    }
    compare_models(what, shard, dt_gpt_grads(shard), whole, dt_gpt_grads(whole), tol);
    ASSERT_TRUE(dt_gpt_take_comm_ms(shard) > 0);
    ASSERT_TRUE(dt_gpt_take_comm_ms(shard) == 0);

    /* Sampling: no targets; the last positions of every sequence. */
    ASSERT_OK(dt_gpt_forward(whole, x, NULL, B, T, NULL));
    ASSERT_OK(dt_gpt_forward(shard, x, NULL, B, T, NULL));
    int Vp = (cfg.vocab + size - 1) / size * size;
    for (int b = 0; b < B; b++) {
        const float *lw = dt_gpt_last_logits(whole, b), *ls = dt_gpt_last_logits(shard, b);
        double num = 0, den = 0;
        for (int v = 0; v < cfg.vocab; v++) {
            num += ((double)ls[v] - lw[v]) * ((double)ls[v] - lw[v]);
            den += (double)lw[v] * lw[v];
        }
        if (sqrt(num) > tol * sqrt(den))
            TEST_FAILF("%s: sampled logits of sequence %d differ (relative L2 %.3g)", what, b,
                       sqrt(num / den));
        for (int v = cfg.vocab; v < Vp; v++)
            if (ls[v] != -INFINITY)
                TEST_FAILF("%s: padding logit %d is %g, not -inf", what, v, (double)ls[v]);
    }
    dt_gpt_destroy(shard);
    dt_gpt_destroy(whole);
    if (rank == 0)
        printf("  %s: ok\n", what);
}

static void tp_case(int rank, int size) {
    dt_group *w = NULL;
    ASSERT_OK(dt_group_init_from_env(&w));
    dt_tp *tp;
    ASSERT_OK(dt_tp_create(&tp, w));
    for (int sp = 0; sp < 2; sp++)
        for (int p = 0; p < 2; p++)
            for (int rc = 0; rc < 2; rc++)
                run_variant(tp, rank, size, sp, p ? DT_PRECISION_BF16 : DT_PRECISION_FP32, rc);
    /* A shard refuses what it cannot split, naming the setting. */
    dt_gpt_options o = dt_gpt_options_default();
    o.part = (dt_gpt_part){.tp_rank = 0, .tp_size = 3, .regions = dt_tp_regions_of(tp)};
    dt_gpt *m = NULL;
    ASSERT_STATUS(dt_gpt_create_with(&m, &cfg, B, T, &o), DT_ERR_INVALID);
    ASSERT_CONTAINS(dt_last_error(), "--tp 3 does not divide the model's 4 attention heads");
    o.part = (dt_gpt_part){
        .tp_rank = 0, .tp_size = 2, .sequence_parallel = true, .regions = dt_tp_regions_of(tp)};
    ASSERT_STATUS(dt_gpt_create_with(&m, &cfg, B, 15, &o), DT_ERR_INVALID);
    ASSERT_CONTAINS(dt_last_error(), "sequence length 15 is not a multiple of --tp 2");
    dt_tp_destroy(tp);
    dt_group_destroy(w);
}

int main(int argc, char **argv) {
    static const hcase cases[] = {
        {"tp_2", 2, tp_case, {NULL}, -1, 240},
        {"tp_4", 4, tp_case, {NULL}, -1, 300},
    };
    return harness_main(argc, argv, cases, (int)(sizeof cases / sizeof cases[0]));
}
