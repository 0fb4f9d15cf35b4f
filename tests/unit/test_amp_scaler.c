/*
 * test_amp_scaler.c — the fp16 dynamic loss scaler (PyTorch GradScaler
 * semantics), the inf/nan check and unscale on every ISA level.
 */
#include "dtrain/amp.h"
#include "test.h"

#include <float.h>

static void test_defaults_and_validation(void) {
    dt_scaler s;
    ASSERT_OK(dt_scaler_init(&s, NULL));
    ASSERT_EQ(dt_scaler_scale(&s), 65536);
    ASSERT_EQ(s.cfg.growth_interval, 2000);
    ASSERT_NEAR(s.cfg.growth_factor, 2.0, 0, 0);
    ASSERT_NEAR(s.cfg.backoff_factor, 0.5, 0, 0);
    dt_scaler_config c = dt_scaler_config_default();
    c.backoff_factor = 1.0;
    ASSERT_STATUS(dt_scaler_init(&s, &c), DT_ERR_INVALID);
    ASSERT_CONTAINS(dt_last_error(), "backoff_factor 1");
    c = dt_scaler_config_default();
    c.growth_factor = 0.9;
    ASSERT_STATUS(dt_scaler_init(&s, &c), DT_ERR_INVALID);
    ASSERT_CONTAINS(dt_last_error(), "growth_factor 0.9");
    c = dt_scaler_config_default();
    c.growth_interval = 0;
    ASSERT_STATUS(dt_scaler_init(&s, &c), DT_ERR_INVALID);
    ASSERT_CONTAINS(dt_last_error(), "growth_interval 0");
    c = dt_scaler_config_default();
    c.init_scale = INFINITY;
    ASSERT_STATUS(dt_scaler_init(&s, &c), DT_ERR_INVALID);
    ASSERT_CONTAINS(dt_last_error(), "init_scale inf");
}

/* The default schedule: 2000 clean steps double the scale, one overflow
 * halves it and restarts the count, exactly as GradScaler.update does. */
static void test_growth_and_backoff(void) {
    dt_scaler s;
    ASSERT_OK(dt_scaler_init(&s, NULL));
    for (int i = 0; i < 1999; i++)
        ASSERT_TRUE(!dt_scaler_update(&s, false));
    ASSERT_EQ(dt_scaler_scale(&s), 65536);
    ASSERT_EQ(s.growth_tracker, 1999);
    dt_scaler_update(&s, false);
    ASSERT_EQ(dt_scaler_scale(&s), 131072);
    ASSERT_EQ(s.growth_tracker, 0);
    for (int i = 0; i < 1500; i++)
        dt_scaler_update(&s, false);
    ASSERT_TRUE(dt_scaler_update(&s, true)); /* skip */
    ASSERT_EQ(dt_scaler_scale(&s), 65536);
    ASSERT_EQ(s.growth_tracker, 0); /* the clean count restarts */
    ASSERT_EQ(s.skipped, 1);
    ASSERT_EQ(s.steps, 3501);
    for (int i = 0; i < 1999; i++)
        dt_scaler_update(&s, false);
    ASSERT_EQ(dt_scaler_scale(&s), 65536);
    dt_scaler_update(&s, false);
    ASSERT_EQ(dt_scaler_scale(&s), 131072);
}

/* A forced-overflow run: fp16 gradients of a loss scaled by s overflow
 * while s * g > 65504. The scaler must skip exactly those steps, settle on
 * the largest safe power of two, then grow again after `interval` clean
 * steps, overflow once more, and back off. */
static void test_forced_overflow_recovery(void) {
    dt_scaler_config c = dt_scaler_config_default();
    c.growth_interval = 4;
    dt_scaler s;
    ASSERT_OK(dt_scaler_init(&s, &c));
    enum { N = 1000 };
    float g[N];
    dt_f16 h[N];
    float grad_true = 3.0f; /* 65536 * 3 > 65504: overflows until scale <= 2^14 */
    int skipped_at[64], nskip = 0;
    float scales[64];
    for (int step = 0; step < 40; step++) {
        float scale = dt_scaler_scale(&s);
        scales[step] = scale;
        for (int i = 0; i < N; i++)
            g[i] = grad_true * scale * (float)(i % 7 + 1) / 7.0f;
        dt_f32_to_f16(h, g, N); /* the fp16 gradient a backward pass would hold */
        dt_f16_to_f32(g, h, N);
        bool found_inf = dt_unscale(g, N, 1.0f / scale);
        if (!found_inf)
            for (int i = 0; i < N; i++) /* recovered gradients are right */
                ASSERT_NEAR(g[i], grad_true * (float)(i % 7 + 1) / 7.0f, 1e-3, 0);
        if (dt_scaler_update(&s, found_inf))
            skipped_at[nskip++] = step;
    }
    /* Steps 0, 1: 2^16, 2^15 overflow; 2^14 * 3 = 49152 fits. Then every 4
     * clean steps the scale grows to 2^15, overflows, and backs off. */
    ASSERT_EQ(skipped_at[0], 0);
    ASSERT_EQ(skipped_at[1], 1);
    ASSERT_EQ(scales[2], 16384);
    ASSERT_EQ(skipped_at[2], 6); /* steps 2..5 clean, step 6 at 2^15 overflows */
    ASSERT_EQ(scales[6], 32768);
    ASSERT_EQ(scales[7], 16384);
    ASSERT_EQ(nskip, 2 + (40 - 2) / 5);
    ASSERT_EQ(s.skipped, nskip);
    ASSERT_EQ(s.steps, 40);
    printf("  skipped steps: %d of 40, final scale %g\n", nskip, (double)dt_scaler_scale(&s));
}

static void test_clamps(void) {
    dt_scaler_config c = dt_scaler_config_default();
    c.growth_interval = 1;
    c.init_scale = 1e38;
    dt_scaler s;
    ASSERT_OK(dt_scaler_init(&s, &c));
    for (int i = 0; i < 10; i++)
        dt_scaler_update(&s, false);
    ASSERT_TRUE(isfinite(dt_scaler_scale(&s)) && dt_scaler_scale(&s) >= 1e38f);
    for (int i = 0; i < 400; i++)
        dt_scaler_update(&s, true);
    ASSERT_TRUE(dt_scaler_scale(&s) == FLT_MIN);
}

static void test_state_roundtrip(void) {
    dt_scaler a, b;
    ASSERT_OK(dt_scaler_init(&a, NULL));
    ASSERT_OK(dt_scaler_init(&b, NULL));
    for (int i = 0; i < 2345; i++)
        dt_scaler_update(&a, i % 1000 == 999);
    dt_scaler_state st;
    dt_scaler_get_state(&a, &st);
    ASSERT_OK(dt_scaler_set_state(&b, &st));
    for (int i = 0; i < 3000; i++) {
        bool inf = i % 1700 == 5;
        ASSERT_EQ(dt_scaler_update(&a, inf), dt_scaler_update(&b, inf));
        ASSERT_EQ(dt_scaler_scale(&a), dt_scaler_scale(&b));
    }
    ASSERT_EQ(a.skipped, b.skipped);
    st.scale = -1;
    ASSERT_STATUS(dt_scaler_set_state(&b, &st), DT_ERR_INVALID);
    ASSERT_CONTAINS(dt_last_error(), "scale -1");
    dt_scaler_get_state(&a, &st);
    st.growth_tracker = 2000;
    ASSERT_STATUS(dt_scaler_set_state(&b, &st), DT_ERR_INVALID);
    ASSERT_CONTAINS(dt_last_error(), "growth_tracker 2000");
}

static void test_inf_nan_check_all_levels(void) {
    enum { N = 4099 };
    float *x = malloc(N * sizeof *x);
    ASSERT_TRUE(x);
    dt_isa_level max = dt_cpu_features_get()->max_level;
    const float bad[] = {INFINITY, -INFINITY, NAN, -NAN};
    for (int l = 0; l <= (int)max; l++) {
        ASSERT_OK(dt_isa_set((dt_isa_level)l));
        for (size_t n = 0; n <= 40; n++) { /* every tail */
            for (size_t i = 0; i < n; i++)
                x[i] = FLT_MAX * ((i & 1) ? -1.0f : 1.0f);
            ASSERT_TRUE(!dt_has_inf_nan(x, n));
            for (size_t pos = 0; pos < n; pos++) {
                x[pos] = bad[pos % 4];
                ASSERT_TRUE(dt_has_inf_nan(x, n));
                ASSERT_TRUE(!dt_has_inf_nan(x, pos)); /* not read past n */
                x[pos] = 1.0f;
            }
        }
        for (size_t i = 0; i < N; i++)
            x[i] = (float)i;
        ASSERT_TRUE(!dt_unscale(x, N, 0.5f));
        for (size_t i = 0; i < N; i++)
            ASSERT_EQ(x[i] * 2, (float)i);
        x[N - 1] = NAN;
        ASSERT_TRUE(dt_unscale(x, N, 0.25f));
        ASSERT_EQ(x[5], 0.625f);
        x[N - 1] = 0;
        x[4096] = -INFINITY;
        ASSERT_TRUE(dt_has_inf_nan(x, N));
        ASSERT_TRUE(!dt_has_inf_nan(x, 4096));
    }
    ASSERT_OK(dt_isa_set(max));
    free(x);
}

static void test_config_from_env(void) {
    dt_scaler_config c;
    unsetenv("DT_LOSS_SCALE_INIT");
    ASSERT_OK(dt_scaler_config_from_env(&c));
    ASSERT_EQ(c.growth_interval, 2000);
    setenv("DT_LOSS_SCALE_INIT", "1024", 1);
    setenv("DT_LOSS_SCALE_INTERVAL", "50", 1);
    setenv("DT_LOSS_SCALE_BACKOFF", "0.25", 1);
    setenv("DT_LOSS_SCALE_GROWTH", "4", 1);
    ASSERT_OK(dt_scaler_config_from_env(&c));
    ASSERT_EQ(c.init_scale, 1024);
    ASSERT_EQ(c.growth_interval, 50);
    ASSERT_EQ(c.backoff_factor, 0.25);
    ASSERT_EQ(c.growth_factor, 4);
    dt_scaler s;
    ASSERT_OK(dt_scaler_init(&s, &c));
    for (int i = 0; i < 50; i++)
        dt_scaler_update(&s, false);
    ASSERT_EQ(dt_scaler_scale(&s), 4096);
    dt_scaler_update(&s, true);
    ASSERT_EQ(dt_scaler_scale(&s), 1024);
    setenv("DT_LOSS_SCALE_BACKOFF", "1.5", 1);
    ASSERT_STATUS(dt_scaler_config_from_env(&c), DT_ERR_INVALID);
    ASSERT_CONTAINS(dt_last_error(), "DT_LOSS_SCALE_BACKOFF");
    ASSERT_CONTAINS(dt_last_error(), "1.5");
    unsetenv("DT_LOSS_SCALE_BACKOFF");
    setenv("DT_LOSS_SCALE_INTERVAL", "0", 1);
    ASSERT_STATUS(dt_scaler_config_from_env(&c), DT_ERR_INVALID);
    ASSERT_CONTAINS(dt_last_error(), "DT_LOSS_SCALE_INTERVAL");
    unsetenv("DT_LOSS_SCALE_INTERVAL");
    unsetenv("DT_LOSS_SCALE_INIT");
    unsetenv("DT_LOSS_SCALE_GROWTH");
}

/* Above 2^20 elements the check is split over threads: a bad value in any
 * chunk, and at either end, is found; unscale scales every element. */
static void test_inf_nan_check_threaded(void) {
    size_t n = (3u << 20) + 5;
    float *x = malloc(n * sizeof *x);
    ASSERT_TRUE(x);
    for (size_t i = 0; i < n; i++)
        x[i] = (float)(i & 1023);
    ASSERT_TRUE(!dt_has_inf_nan(x, n));
    size_t where[] = {0, n / 3, n / 2 + 1, n - 1};
    for (size_t w = 0; w < 4; w++) {
        x[where[w]] = w % 2 ? NAN : -INFINITY;
        ASSERT_TRUE(dt_has_inf_nan(x, n));
        x[where[w]] = 1.0f;
    }
    ASSERT_TRUE(!dt_unscale(x, n, 0.5f));
    for (size_t i = 1; i < n - 1; i++)
        if (x[i] != (float)(i & 1023) * 0.5f && i != n / 3 && i != n / 2 + 1)
            TEST_FAILF("x[%zu] = %g after unscale", i, (double)x[i]);
    x[n - 1] = INFINITY;
    ASSERT_TRUE(dt_unscale(x, n, 0.5f));
    free(x);
}

int main(void) {
    RUN(test_defaults_and_validation);
    RUN(test_growth_and_backoff);
    RUN(test_forced_overflow_recovery);
    RUN(test_clamps);
    RUN(test_state_roundtrip);
    RUN(test_inf_nan_check_all_levels);
    RUN(test_config_from_env);
    RUN(test_inf_nan_check_threaded);
    return TEST_SUMMARY();
}
