/*
 * test_optim.c — AdamW, SGD, schedules and clipping against PyTorch 1.13
 * (tests/reference/optim_reference.txt, written by gen_optim_reference.py),
 * plus properties: vector == scalar bit for bit, any split of a buffer into
 * ranges gives the same bits, the thread count never changes a result, and
 * the sum of squares is exact on integer-valued input.
 */
#include "dtrain/optim.h"
#include "optim/optim_internal.h"
#include "test.h"

#include <omp.h>

#define FIXTURE DT_TEST_DATA_DIR "/reference/optim_reference.txt"

/* ---- fixture reader: lines "name count v0 v1 ..." ---- */

static char *fixture_text;

static void load_fixture(void) {
    FILE *f = fopen(FIXTURE, "rb");
    if (!f)
        TEST_FAILF("cannot open %s", FIXTURE);
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    fixture_text = malloc((size_t)len + 1);
    ASSERT_TRUE(fixture_text != NULL);
    ASSERT_EQ(fread(fixture_text, 1, (size_t)len, f), len);
    fixture_text[len] = 0;
    fclose(f);
}

/* Returns a malloc'ed array of the named line's values; *n gets its count. */
static double *fx(const char *name, size_t *n) {
    size_t nl = strlen(name);
    for (const char *p = fixture_text; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL) {
        if (strncmp(p, name, nl) == 0 && p[nl] == ' ') {
            char *end;
            size_t count = strtoull(p + nl + 1, &end, 10);
            double *v = malloc((count ? count : 1) * sizeof *v);
            for (size_t i = 0; i < count; i++)
                v[i] = strtod(end, &end);
            *n = count;
            return v;
        }
    }
    TEST_FAILF("fixture %s has no array '%s'", FIXTURE, name);
}

static float *fx_f32(const char *name, size_t expect_n) {
    size_t n;
    double *d = fx(name, &n);
    ASSERT_EQ(n, expect_n);
    float *f = malloc(n * sizeof *f);
    for (size_t i = 0; i < n; i++)
        f[i] = (float)d[i];
    free(d);
    return f;
}

static double fx_scalar(const char *name, size_t i) {
    size_t n;
    double *d = fx(name, &n);
    ASSERT_TRUE(i < n);
    double v = d[i];
    free(d);
    return v;
}

#define STEPS   5
#define N_DECAY 67
#define N       100

static void expect_close(const float *got, const float *want, size_t n, const char *what) {
    double worst = 0.0;
    for (size_t i = 0; i < n; i++) {
        if (!(fabsf(got[i] - want[i]) <= 1e-6f * fabsf(want[i]) + 1e-7f))
            TEST_FAILF("%s[%zu]: got %.9g, PyTorch %.9g (rel diff %.3g > 1e-6)", what, i,
                       (double)got[i], (double)want[i],
                       fabs((double)got[i] - want[i]) / fabs((double)want[i]));
        double rel = fabs((double)got[i] - want[i]) / fmax(fabs((double)want[i]), 1e-30);
        worst = rel > worst ? rel : worst;
    }
    printf("  %s: max relative difference from PyTorch %.2g\n", what, worst);
}

static void test_adamw_matches_pytorch(void) {
    float *p = fx_f32("params0", N);
    float *g[STEPS];
    for (int k = 0; k < STEPS; k++) {
        char name[16];
        snprintf(name, sizeof name, "grads%d", k);
        g[k] = fx_f32(name, N);
    }
    float lr = (float)fx_scalar("adamw_hparams", 0);
    dt_adamw_config c = {.beta1 = (float)fx_scalar("adamw_hparams", 1),
                         .beta2 = (float)fx_scalar("adamw_hparams", 2),
                         .eps = (float)fx_scalar("adamw_hparams", 3),
                         .weight_decay = (float)fx_scalar("adamw_hparams", 4)};
    float m[N] = {0}, v[N] = {0};
    for (int k = 0; k < STEPS; k++) {
        /* Two tensors: one decayed, one not (a bias or a norm gain). */
        dt_adamw_step(p, g[k], m, v, N_DECAY, lr, &c, k + 1, c.weight_decay);
        dt_adamw_step(p + N_DECAY, g[k] + N_DECAY, m + N_DECAY, v + N_DECAY, N - N_DECAY, lr, &c,
                      k + 1, 0.0f);
    }
    float *want = fx_f32("adamw_out", N);
    expect_close(p, want, N, "adamw params after 5 steps");
    free(want);
    free(p);
    for (int k = 0; k < STEPS; k++)
        free(g[k]);
}

static void test_sgd_matches_pytorch(void) {
    float lr = (float)fx_scalar("sgd_lr", 0);
    for (int c = 0; c < 3; c++) {
        char name[32];
        snprintf(name, sizeof name, "sgd%d_hparams", c);
        float momentum = (float)fx_scalar(name, 0);
        bool nesterov = fx_scalar(name, 1) != 0.0;
        float wd = (float)fx_scalar(name, 2);
        float *p = fx_f32("params0", N);
        float buf[N] = {0};
        for (int k = 0; k < STEPS; k++) {
            snprintf(name, sizeof name, "grads%d", k);
            float *g = fx_f32(name, N);
            dt_sgd_step(p, g, momentum != 0.0f ? buf : NULL, N, lr, momentum, nesterov, wd);
            free(g);
        }
        snprintf(name, sizeof name, "sgd%d_out", c);
        float *want = fx_f32(name, N);
        expect_close(p, want, N, name);
        free(want);
        free(p);
    }
}

static void test_clip_matches_pytorch(void) {
    float *g = fx_f32("grads0", N);
    float max_norm = (float)fx_scalar("clip_max_norm", 0);
    double norm = sqrt(dt_grad_sumsq(g, N));
    ASSERT_NEAR(norm, fx_scalar("clip_total_norm", 0), 1e-6, 0);
    float s = dt_clip_scale(dt_grad_sumsq(g, N), max_norm);
    ASSERT_TRUE(s < 1.0f);
    dt_scale(g, N, s);
    float *want = fx_f32("clip_out", N);
    expect_close(g, want, N, "clipped gradient");
    free(want);
    free(g);
}

static void test_schedules_match_pytorch(void) {
    dt_schedule s = {.base_lr = (float)fx_scalar("sched_hparams", 0),
                     .min_lr = (float)fx_scalar("sched_hparams", 1),
                     .warmup = (int64_t)fx_scalar("sched_hparams", 2),
                     .total = (int64_t)fx_scalar("sched_hparams", 3)};
    size_t len = (size_t)fx_scalar("sched_hparams", 4);
    for (int kind = 0; kind < DT_SCHED_COUNT; kind++) {
        s.kind = (dt_schedule_kind)kind;
        ASSERT_OK(dt_schedule_validate(&s));
        char name[32];
        snprintf(name, sizeof name, "sched_%s", dt_schedule_names[kind]);
        size_t n;
        double *want = fx(name, &n);
        ASSERT_EQ(n, len);
        for (size_t i = 0; i < n; i++) {
            double got = dt_schedule_lr(&s, (int64_t)i);
            if (!(fabs(got - want[i]) <= 1e-6 * want[i]))
                TEST_FAILF("%s at step %zu: got %.9g, PyTorch %.9g", name, i, got, want[i]);
        }
        free(want);
    }
}

static void test_schedule_edges(void) {
    dt_schedule s = {
        .kind = DT_SCHED_COSINE, .base_lr = 1.0f, .min_lr = 0.1f, .warmup = 0, .total = 10};
    ASSERT_OK(dt_schedule_validate(&s));
    ASSERT_EQ(dt_schedule_lr(&s, 0), 1.0f);             /* no warmup: peak at once */
    ASSERT_NEAR(dt_schedule_lr(&s, 5), 0.55f, 1e-6, 0); /* half way */
    ASSERT_EQ(dt_schedule_lr(&s, 10), 0.1f);            /* the floor ... */
    ASSERT_EQ(dt_schedule_lr(&s, 1000000), 0.1f);       /* ... stays */
    s.kind = DT_SCHED_INVSQRT;
    ASSERT_EQ(dt_schedule_lr(&s, 3), 0.5f);    /* 1/sqrt(4) */
    ASSERT_EQ(dt_schedule_lr(&s, 1000), 0.1f); /* floored at min_lr */
    s.kind = DT_SCHED_LINEAR;
    s.total = 0;
    ASSERT_STATUS(dt_schedule_validate(&s), DT_ERR_INVALID);
    ASSERT_CONTAINS(dt_last_error(), "total steps (0)");
    s = (dt_schedule){.kind = DT_SCHED_CONSTANT, .base_lr = 1.0f, .min_lr = 2.0f};
    ASSERT_STATUS(dt_schedule_validate(&s), DT_ERR_INVALID);
    ASSERT_CONTAINS(dt_last_error(), "min_lr 2");
    s = (dt_schedule){.kind = DT_SCHED_CONSTANT, .base_lr = 1.0f, .warmup = -1};
    ASSERT_STATUS(dt_schedule_validate(&s), DT_ERR_INVALID);
}

/* ---- properties ---- */

static void fill(float *x, size_t n, uint64_t seed, float scale) {
    dt_rng r;
    dt_rng_init(&r, seed, dt_rng_stream_id(0, 0, DT_RNG_TEST));
    for (size_t i = 0; i < n; i++)
        x[i] = dt_rng_normal(&r) * scale;
}

static void test_vector_equals_scalar(void) {
    enum { MAXN = 300 };
    float p1[MAXN], p2[MAXN], g[MAXN], m1[MAXN], m2[MAXN], v1[MAXN], v2[MAXN];
    dt_adamw_config c = dt_adamw_config_default();
    for (size_t n = 0; n <= MAXN; n += (n < 40 ? 1 : 37)) {
        fill(p1, n, 1, 1.0f);
        fill(g, n, 2, 0.1f);
        memcpy(p2, p1, n * sizeof *p1);
        memset(m1, 0, sizeof m1), memset(v1, 0, sizeof v1);
        memset(m2, 0, sizeof m2), memset(v2, 0, sizeof v2);
        for (int step = 1; step <= 3; step++) {
            dt__adamw_k k;
            dt__adamw_k_init(&k, 1e-3f, &c, step, 0.1f);
            dt__adamw_range_vec(p1, g, m1, v1, n, &k);
            dt__adamw_range_scalar(p2, g, m2, v2, n, &k);
        }
        ASSERT_EQ(memcmp(p1, p2, n * sizeof *p1), 0);
        ASSERT_EQ(memcmp(v1, v2, n * sizeof *v1), 0);
        for (int nest = 0; nest < 2; nest++) {
            dt__sgd_range_vec(p1, g, m1, n, 0.01f, 0.9f, nest, 0.01f);
            dt__sgd_range_scalar(p2, g, m2, n, 0.01f, 0.9f, nest, 0.01f);
            ASSERT_EQ(memcmp(p1, p2, n * sizeof *p1), 0);
            ASSERT_EQ(memcmp(m1, m2, n * sizeof *m1), 0);
        }
        double a = dt__sumsq_block_vec(g, n), b = dt__sumsq_block_scalar(g, n);
        ASSERT_EQ(memcmp(&a, &b, sizeof a), 0);
    }
}

/* beta2 = 1 freezes v (bit for bit) and uses it without bias correction:
 * the step equals the one computed by hand with v fixed. */
static void test_adamw_frozen_v(void) {
    enum { NF = 7 };
    float p[NF], g[NF], m[NF], v[NF], v0[NF], want[NF];
    for (int i = 0; i < NF; i++) {
        p[i] = 0.5f * (float)(i + 1);
        g[i] = (float)(i - 3) * 0.25f;
        m[i] = 0.0f;
        v[i] = v0[i] = 0.01f * (float)(i + 1);
    }
    dt_adamw_config c = dt_adamw_config_default();
    c.beta2 = 1.0f;
    for (int step = 1; step <= 3; step++) {
        for (int i = 0; i < NF; i++) {
            float mi = c.beta1 * m[i] + (1.0f - c.beta1) * g[i];
            double bc1 = 1.0 - pow((double)c.beta1, step);
            want[i] =
                p[i] * (1.0f - 1e-3f * 0.1f) - (float)(1e-3 / bc1) * mi / (sqrtf(v0[i]) + c.eps);
        }
        dt_adamw_step(p, g, m, v, NF, 1e-3f, &c, step, 0.1f);
        ASSERT_EQ(memcmp(v, v0, sizeof v), 0);
        for (int i = 0; i < NF; i++)
            ASSERT_NEAR(p[i], want[i], 1e-6, 1e-6);
    }
}

/* Updating a buffer in one call (OpenMP-parallel) or as uneven ranges (as
 * ZeRO shards would) gives the same bits, with 1 or 2 threads. */
static void test_split_invariance(void) {
    const size_t n = 3 * DT__OPTIM_PAR_MIN + 12345;
    const size_t cuts[] = {0, 7, 1001, DT__OPTIM_PAR_MIN + 3, 2 * DT__OPTIM_PAR_MIN + 17, n};
    float *p[3], *m[3], *v[3], *g = malloc(n * sizeof *g);
    fill(g, n, 3, 0.5f);
    for (int j = 0; j < 3; j++) {
        p[j] = malloc(n * sizeof(float));
        m[j] = calloc(n, sizeof(float));
        v[j] = calloc(n, sizeof(float));
        fill(p[j], n, 4, 1.0f);
    }
    dt_adamw_config c = dt_adamw_config_default();
    for (int step = 1; step <= 2; step++) {
        omp_set_num_threads(2);
        dt_adamw_step(p[0], g, m[0], v[0], n, 1e-3f, &c, step, 0.01f);
        omp_set_num_threads(1);
        dt_adamw_step(p[1], g, m[1], v[1], n, 1e-3f, &c, step, 0.01f);
        for (size_t i = 0; i + 1 < sizeof cuts / sizeof cuts[0]; i++) {
            size_t a = cuts[i], len = cuts[i + 1] - cuts[i];
            dt_adamw_step(p[2] + a, g + a, m[2] + a, v[2] + a, len, 1e-3f, &c, step, 0.01f);
        }
    }
    ASSERT_EQ(memcmp(p[0], p[1], n * sizeof(float)), 0);
    ASSERT_EQ(memcmp(p[0], p[2], n * sizeof(float)), 0);
    ASSERT_EQ(memcmp(v[0], v[2], n * sizeof(float)), 0);

    /* SGD, Nesterov: one call vs ranges. */
    memcpy(p[1], p[0], n * sizeof(float));
    memset(m[0], 0, n * sizeof(float));
    memset(m[1], 0, n * sizeof(float));
    omp_set_num_threads(2);
    dt_sgd_step(p[0], g, m[0], n, 0.1f, 0.9f, true, 1e-4f);
    for (size_t i = 0; i + 1 < sizeof cuts / sizeof cuts[0]; i++) {
        size_t a = cuts[i], len = cuts[i + 1] - cuts[i];
        dt_sgd_step(p[1] + a, g + a, m[1] + a, len, 0.1f, 0.9f, true, 1e-4f);
    }
    ASSERT_EQ(memcmp(p[0], p[1], n * sizeof(float)), 0);

    /* The sum of squares does not depend on the thread count. */
    omp_set_num_threads(1);
    double s1 = dt_grad_sumsq(g, n);
    omp_set_num_threads(2);
    double s2 = dt_grad_sumsq(g, n);
    ASSERT_EQ(memcmp(&s1, &s2, sizeof s1), 0);
    for (int j = 0; j < 3; j++)
        free(p[j]), free(m[j]), free(v[j]);
    free(g);
}

/* Integer-valued gradients: every square and every partial sum is an
 * integer below 2^53, so the double sum must equal the int64 sum exactly. */
static void test_sumsq_exact_on_integers(void) {
    const size_t n = 300 * DT__SUMSQ_BLOCK + 77; /* more than one group of blocks */
    float *g = malloc(n * sizeof *g);
    dt_rng r;
    dt_rng_init(&r, 9, dt_rng_stream_id(0, 1, DT_RNG_TEST));
    int64_t want = 0;
    for (size_t i = 0; i < n; i++) {
        int x = (int)dt_rng_below(&r, 201) - 100;
        g[i] = (float)x;
        want += (int64_t)x * x;
    }
    omp_set_num_threads(2);
    double got = dt_grad_sumsq(g, n);
    if (got != (double)want)
        TEST_FAILF("sumsq %.17g != exact %lld", got, (long long)want);
    ASSERT_EQ(dt_grad_sumsq(g, 0), 0);

    /* 3-4-5: norm 5 clipped to 1 multiplies by 1 / (5 + 1e-6). */
    float v[2] = {3.0f, 4.0f};
    ASSERT_EQ(dt_grad_sumsq(v, 2), 25);
    float s = dt_clip_scale(25.0, 1.0f);
    ASSERT_EQ(s, 1.0f / (5.0f + 1e-6f));
    ASSERT_EQ(dt_clip_scale(25.0, 10.0f), 1.0f); /* within the bound */
    ASSERT_EQ(dt_clip_scale(25.0, 0.0f), 1.0f);  /* disabled */
    ASSERT_EQ(dt_clip_scale(NAN, 1.0f), 1.0f);   /* documented: the caller checks isfinite */
    ASSERT_EQ(dt_clip_scale(INFINITY, 1.0f), 1.0f);
    dt_scale(v, 2, 0.5f);
    ASSERT_EQ(v[0], 1.5f);
    ASSERT_EQ(v[1], 2.0f);
    free(g);
}

/* The optimizer object against the range kernels it drives: per-tensor
 * decay, AdamW's count skipping a skipped step, any split of the owned
 * range, an owned sub-range (a ZeRO share), the v freeze, SGD with and
 * without momentum, and bad configurations. */
#define NO 1000 /* parameters of the optimizer-object test */

static void test_optimizer_object(void) {
    /* Three tensors: a decayed matrix, a bias, a decayed matrix. */
    const dt_optim_tensor tens[] = {
        {0, 600, true, 0, 0, false}, {600, 40, false, 0, 0, false}, {640, 360, true, 0, 0, false}};
    float *p0 = malloc(NO * sizeof(float)), *p1 = malloc(NO * sizeof(float));
    float *g = malloc(NO * sizeof(float)), *m = calloc(NO, sizeof(float)),
          *v = calloc(NO, sizeof(float));
    fill(p0, NO, 4, 1.0f);
    memcpy(p1, p0, NO * sizeof(float));
    dt_optim_config c = dt_optim_config_default();
    c.weight_decay = 0.1f;
    c.freeze_v_from = 3;
    dt_optimizer *o, *share;
    ASSERT_OK(dt_optimizer_create(&o, &c, tens, 3, &(dt_range){0, NO}, 1));
    /* The share [300, 500) + [550, 700) of a second object (a ZeRO rank's
     * pieces of two buckets): splits two tensors, one of them twice. */
    const dt_range pieces[] = {{300, 500}, {550, 700}};
    float *q = malloc(NO * sizeof(float));
    memcpy(q, p0, NO * sizeof(float));
    ASSERT_OK(dt_optimizer_create(&share, &c, tens, 3, pieces, 2));
    ASSERT_EQ(dt_optimizer_num_states(o), 2);
    ASSERT_EQ(dt_optimizer_state_bytes(share), 2 * 350 * sizeof(float));
    ASSERT_EQ(dt_optimizer_owned_count(share), 350);
    ASSERT_EQ(dt_optimizer_num_owned(share), 2);
    dt_adamw_config fz = c.adamw;
    fz.beta2 = 1.0f;
    int64_t count = 0;
    for (int step = 0; step < 5; step++) {
        fill(g, NO, 10 + (uint64_t)step, 0.5f);
        bool applied = step != 1; /* step 1 is skipped (an overflow) */
        dt_optimizer_begin(o, step, 1e-2f);
        dt_optimizer_begin(share, step, 1e-2f);
        if (step == 3) { /* the freeze: v becomes bias-corrected */
            float inv = (float)(1.0 / (1.0 - pow((double)c.adamw.beta2, (double)count)));
            dt_scale(v, NO, inv);
        }
        if (applied) {
            /* Uneven pieces, out of order, as buckets arrive. */
            dt_optimizer_update(o, p1, g, 640, NO);
            dt_optimizer_update(o, p1, g, 0, 77);
            dt_optimizer_update(o, p1, g, 77, 640);
            dt_optimizer_update(share, q, g, 600, 700);
            dt_optimizer_update(share, q, g, 300, 500);
            dt_optimizer_update(share, q, g, 550, 600);
            for (size_t t = 0; t < 3; t++)
                dt_adamw_step(p0 + tens[t].offset, g + tens[t].offset, m + tens[t].offset,
                              v + tens[t].offset, tens[t].count, 1e-2f, step >= 3 ? &fz : &c.adamw,
                              count + 1, tens[t].decay ? 0.1f : 0.0f);
            count++;
        }
        dt_optimizer_end(o, applied);
        dt_optimizer_end(share, applied);
    }
    ASSERT_EQ(dt_optimizer_count(o), count);
    ASSERT_EQ(memcmp(p0, p1, NO * sizeof(float)), 0);
    ASSERT_EQ(memcmp(q + 300, p0 + 300, 200 * sizeof(float)), 0);
    ASSERT_EQ(memcmp(q + 550, p0 + 550, 150 * sizeof(float)), 0);
    ASSERT_EQ(memcmp(q, p1, 300 * sizeof(float)) == 0, false); /* outside the share: untouched */
    ASSERT_EQ(memcmp(q + 500, p1 + 500, 50 * sizeof(float)) == 0, false);
    const char *name;
    float *sv = dt_optimizer_state(o, 1, &name);
    ASSERT_TRUE(strcmp(name, "adamw.v") == 0);
    ASSERT_EQ(memcmp(sv, v, NO * sizeof(float)), 0);
    const float *sm = dt_optimizer_state(share, 0, NULL);
    ASSERT_EQ(memcmp(sm, m + 300, 200 * sizeof(float)), 0);
    ASSERT_EQ(memcmp(sm + 200, m + 550, 150 * sizeof(float)), 0);
    dt_optimizer_destroy(o);
    dt_optimizer_destroy(share);

    /* SGD: momentum keeps one state buffer, none without momentum. */
    c = dt_optim_config_default();
    c.kind = DT_OPTIM_SGD;
    c.weight_decay = 1e-4f;
    ASSERT_OK(dt_optimizer_create(&o, &c, tens, 3, &(dt_range){0, NO}, 1));
    ASSERT_EQ(dt_optimizer_num_states(o), 0);
    memcpy(p1, p0, NO * sizeof(float));
    dt_optimizer_begin(o, 0, 0.1f);
    dt_optimizer_update(o, p1, g, 0, NO);
    dt_optimizer_end(o, true);
    for (size_t t = 0; t < 3; t++)
        dt_sgd_step(p0 + tens[t].offset, g + tens[t].offset, NULL, tens[t].count, 0.1f, 0.0f, false,
                    tens[t].decay ? 1e-4f : 0.0f);
    ASSERT_EQ(memcmp(p0, p1, NO * sizeof(float)), 0);
    dt_optimizer_destroy(o);
    c.momentum = 0.9f;
    ASSERT_OK(dt_optimizer_create(&o, &c, tens, 3, &(dt_range){0, NO}, 1));
    dt_optimizer_state(o, 0, &name);
    ASSERT_TRUE(strcmp(name, "sgd.momentum") == 0);
    dt_optimizer_destroy(o);

    /* Bad input names the field. */
    c.momentum = 1.5f;
    ASSERT_STATUS(dt_optimizer_create(&o, &c, tens, 3, &(dt_range){0, NO}, 1), DT_ERR_INVALID);
    ASSERT_CONTAINS(dt_last_error(), "momentum 1.5");
    c = dt_optim_config_default();
    const dt_optim_tensor overlap[] = {{0, 10, true, 0, 0, false}, {5, 10, true, 0, 0, false}};
    ASSERT_STATUS(dt_optimizer_create(&o, &c, overlap, 2, &(dt_range){0, 15}, 1), DT_ERR_INVALID);
    ASSERT_CONTAINS(dt_last_error(), "overlaps");
    ASSERT_STATUS(dt_optimizer_create(&o, &c, tens, 3, &(dt_range){10, 5}, 1), DT_ERR_INVALID);
    free(p0), free(p1), free(q), free(g), free(m), free(v);
}

int main(void) {
    load_fixture();
    RUN(test_adamw_matches_pytorch);
    RUN(test_sgd_matches_pytorch);
    RUN(test_clip_matches_pytorch);
    RUN(test_schedules_match_pytorch);
    RUN(test_schedule_edges);
    RUN(test_vector_equals_scalar);
    RUN(test_split_invariance);
    RUN(test_adamw_frozen_v);
    RUN(test_sumsq_exact_on_integers);
    RUN(test_optimizer_object);
    free(fixture_text);
    return TEST_SUMMARY();
}
