/*
 * scaler.c — fp16 dynamic loss scaling (PyTorch GradScaler semantics) and
 * the inf/nan check and unscale over flat fp32 gradient buffers.
 *
 * Update rule, per optimizer step (torch.cuda.amp.GradScaler.update):
 *   found_inf:  scale *= backoff_factor; growth_tracker = 0; step skipped
 *   otherwise:  growth_tracker += 1; if it reaches growth_interval,
 *               scale *= growth_factor and growth_tracker = 0.
 * Unlike PyTorch, the scale is clamped to [FLT_MIN, FLT_MAX/growth]: a run
 * whose gradients are nan for reasons scaling cannot fix would otherwise
 * drive the scale to 0 (and then to nan), and a very long clean run to inf.
 *
 * The check reads the exponent field: an fp32 value is inf or nan exactly
 * when its exponent bits are all ones, so one AND and one compare per lane
 * suffice, with no floating-point exceptions raised on the way.
 */
#include "dtrain/amp.h"

#include <float.h>
#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <string.h>

dt_scaler_config dt_scaler_config_default(void) {
    return (dt_scaler_config){
        .init_scale = 65536.0,
        .growth_factor = 2.0,
        .backoff_factor = 0.5,
        .growth_interval = 2000,
    };
}

dt_status dt_scaler_config_from_env(dt_scaler_config *out) {
    dt_scaler_config c = dt_scaler_config_default();
    /* The ranges are those dt_scaler_init accepts (open ends approximated). */
    DT_CHECK(
        dt_config_env_double("DT_LOSS_SCALE_INIT", c.init_scale, FLT_MIN, FLT_MAX, &c.init_scale));
    DT_CHECK(dt_config_env_double("DT_LOSS_SCALE_GROWTH", c.growth_factor, 1.0 + 1e-6, 65536.0,
                                  &c.growth_factor));
    DT_CHECK(dt_config_env_double("DT_LOSS_SCALE_BACKOFF", c.backoff_factor, 1e-6, 1.0 - 1e-6,
                                  &c.backoff_factor));
    DT_CHECK(dt_config_env_int("DT_LOSS_SCALE_INTERVAL", c.growth_interval, 1, INT64_MAX,
                               &c.growth_interval));
    *out = c;
    return DT_OK;
}

static bool scale_ok(double s) { return isfinite(s) && s >= FLT_MIN && s <= FLT_MAX; }

dt_status dt_scaler_init(dt_scaler *s, const dt_scaler_config *cfg) {
    dt_scaler_config c = cfg ? *cfg : dt_scaler_config_default();
    if (!scale_ok(c.init_scale))
        return dt_error_set(DT_ERR_INVALID, "loss scaler: init_scale %g must be a finite float > 0",
                            c.init_scale);
    if (!(isfinite(c.growth_factor) && c.growth_factor > 1.0 && c.growth_factor <= 65536.0))
        return dt_error_set(DT_ERR_INVALID, "loss scaler: growth_factor %g must be in (1, 65536]",
                            c.growth_factor);
    if (!(c.backoff_factor > 0.0 && c.backoff_factor < 1.0))
        return dt_error_set(DT_ERR_INVALID, "loss scaler: backoff_factor %g must be in (0, 1)",
                            c.backoff_factor);
    if (c.growth_interval < 1)
        return dt_error_set(DT_ERR_INVALID, "loss scaler: growth_interval %lld must be at least 1",
                            (long long)c.growth_interval);
    memset(s, 0, sizeof *s);
    s->cfg = c;
    s->scale = (float)c.init_scale;
    return DT_OK;
}

bool dt_scaler_update(dt_scaler *s, bool found_inf) {
    s->steps++;
    if (found_inf) {
        s->skipped++;
        s->growth_tracker = 0;
        double next = (double)s->scale * s->cfg.backoff_factor;
        s->scale = next < FLT_MIN ? FLT_MIN : (float)next;
        return true;
    }
    if (++s->growth_tracker >= s->cfg.growth_interval) {
        s->growth_tracker = 0;
        double next = (double)s->scale * s->cfg.growth_factor;
        if (next <= FLT_MAX)
            s->scale = (float)next;
    }
    return false;
}

void dt_scaler_get_state(const dt_scaler *s, dt_scaler_state *out) {
    out->scale = s->scale;
    out->growth_tracker = s->growth_tracker;
    out->skipped = s->skipped;
    out->steps = s->steps;
}

dt_status dt_scaler_set_state(dt_scaler *s, const dt_scaler_state *st) {
    if (!scale_ok(st->scale))
        return dt_error_set(DT_ERR_INVALID, "loss scaler state: scale %g is not a finite float > 0",
                            (double)st->scale);
    if (st->growth_tracker < 0 || st->growth_tracker >= s->cfg.growth_interval)
        return dt_error_set(DT_ERR_INVALID,
                            "loss scaler state: growth_tracker %lld not in [0, %lld)",
                            (long long)st->growth_tracker, (long long)s->cfg.growth_interval);
    if (st->skipped < 0 || st->steps < 0 || st->skipped > st->steps)
        return dt_error_set(DT_ERR_INVALID,
                            "loss scaler state: skipped %lld / steps %lld must be 0 <= skipped <= "
                            "steps",
                            (long long)st->skipped, (long long)st->steps);
    s->scale = st->scale;
    s->growth_tracker = st->growth_tracker;
    s->skipped = st->skipped;
    s->steps = st->steps;
    return DT_OK;
}

/* ------------------------------------------------------------------------ */
/* inf/nan check and unscale                                                */
/* ------------------------------------------------------------------------ */

#define EXP_MASK 0x7f800000u

static bool has_inf_nan_scalar(const float *x, size_t n) {
    uint32_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &x[i], sizeof u);
        bad |= (u & EXP_MASK) == EXP_MASK;
    }
    return bad;
}

static bool unscale_scalar(float *x, size_t n, float inv) {
    uint32_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &x[i], sizeof u);
        bad |= (u & EXP_MASK) == EXP_MASK;
        x[i] *= inv;
    }
    return bad;
}

__attribute__((target("avx2"))) static bool has_inf_nan_avx2(const float *x, size_t n) {
    const __m256i e = _mm256_set1_epi32((int)EXP_MASK);
    __m256i acc = _mm256_setzero_si256();
    size_t i = 0;
    /* Branch-free main loop: OR the compare results, test once at the end
     * (a check that almost never fires should not pay a branch per vector). */
    for (; i + 8 <= n; i += 8) {
        __m256i u = _mm256_loadu_si256((const __m256i *)(x + i));
        acc = _mm256_or_si256(acc, _mm256_cmpeq_epi32(_mm256_and_si256(u, e), e));
    }
    return !_mm256_testz_si256(acc, acc) || has_inf_nan_scalar(x + i, n - i);
}

__attribute__((target("avx2"))) static bool unscale_avx2(float *x, size_t n, float inv) {
    const __m256i e = _mm256_set1_epi32((int)EXP_MASK);
    const __m256 s = _mm256_set1_ps(inv);
    __m256i acc = _mm256_setzero_si256();
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i);
        __m256i u = _mm256_castps_si256(v);
        acc = _mm256_or_si256(acc, _mm256_cmpeq_epi32(_mm256_and_si256(u, e), e));
        _mm256_storeu_ps(x + i, _mm256_mul_ps(v, s));
    }
    return !_mm256_testz_si256(acc, acc) | unscale_scalar(x + i, n - i, inv);
}

__attribute__((target("avx512f"))) static bool has_inf_nan_avx512(const float *x, size_t n) {
    const __m512i e = _mm512_set1_epi32((int)EXP_MASK);
    __mmask16 bad = 0;
    for (size_t i = 0; i < n; i += 16) {
        __mmask16 m = n - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1u);
        __m512i u = _mm512_maskz_loadu_epi32(m, x + i);
        bad |= _mm512_cmpeq_epi32_mask(_mm512_and_si512(u, e), e);
    }
    return bad != 0;
}

__attribute__((target("avx512f"))) static bool unscale_avx512(float *x, size_t n, float inv) {
    const __m512i e = _mm512_set1_epi32((int)EXP_MASK);
    const __m512 s = _mm512_set1_ps(inv);
    __mmask16 bad = 0;
    for (size_t i = 0; i < n; i += 16) {
        __mmask16 m = n - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1u);
        __m512 v = _mm512_maskz_loadu_ps(m, x + i);
        bad |= _mm512_cmpeq_epi32_mask(_mm512_and_si512(_mm512_castps_si512(v), e), e);
        _mm512_mask_storeu_ps(x + i, m, _mm512_mul_ps(v, s));
    }
    return bad != 0;
}

/* One pass over x[0..n) on one thread: check, and scale when `scale`. */
static bool check_serial(dt_isa_level l, float *x, size_t n, bool scale, float inv) {
    if (l >= DT_ISA_AVX512)
        return scale ? unscale_avx512(x, n, inv) : has_inf_nan_avx512(x, n);
    if (l >= DT_ISA_AVX2)
        return scale ? unscale_avx2(x, n, inv) : has_inf_nan_avx2(x, n);
    return scale ? unscale_scalar(x, n, inv) : has_inf_nan_scalar(x, n);
}

/* Gradient buffers are large (a 124M-parameter model: 500 MB): above a
 * million elements the pass is split over the OpenMP threads, as in
 * convert.c, and the flags OR-reduced. */
#define PAR_MIN ((size_t)1 << 20)

static bool check(float *x, size_t n, bool scale, float inv) {
    dt_isa_level l = dt_isa();
    int nt = omp_get_max_threads();
    if (n < PAR_MIN || nt < 2 || omp_in_parallel())
        return check_serial(l, x, n, scale, inv);
    size_t chunk = dt_align_up((n + (size_t)nt - 1) / (size_t)nt, 64);
    int bad = 0;
#pragma omp parallel for num_threads(nt) schedule(static) reduction(| : bad)
    for (int t = 0; t < nt; t++) {
        size_t b = (size_t)t * chunk, e = b + chunk < n ? b + chunk : n;
        if (b < e)
            bad |= check_serial(l, x + b, e - b, scale, inv);
    }
    return bad != 0;
}

bool dt_has_inf_nan(const float *x, size_t n) {
    return check((float *)x, n, false, 1.0f); /* not written when scale is false */
}

bool dt_unscale(float *x, size_t n, float inv_scale) { return check(x, n, true, inv_scale); }
