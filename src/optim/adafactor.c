/*
 * adafactor.c — Adafactor's range kernels (Shazeer & Stern 2018, as Hugging
 * Face's transformers.Adafactor computes it).
 *
 * For an n x m matrix the second moment is kept as a row factor R (n) and
 * a column factor C (m), exponential averages of the rows' and columns'
 * means of g^2 + eps1; the update divides g by sqrt(R_i C_j / mean(R)).
 * Vectors keep a full V. optimizer.c runs three passes per step:
 *
 *   1. statistics: row and column sums of g^2, sum of p^2 (these kernels:
 *      dt__adafactor_colsq plus the lane sums), summed over ranks;
 *   2. R, C and the factors rf_i = 1/sqrt(R_i / mean R), cf_j = 1/sqrt(C_j)
 *      (per tensor, in optimizer.c); the sum of u^2 (a `row` or `vec` call
 *      with uu set), summed over ranks, gives RMS(u) for update clipping;
 *   3. the update (the same call with uu NULL), recomputing u.
 *
 * The scalar and vector forms agree bit for bit (same operations, same
 * order; lanes as in lamb.c).
 */
#include "optim_internal.h"

#include <math.h>

#ifdef __AVX512F__
#include <immintrin.h>
#endif

/* The end of an update: u already unscaled; returns the new p. */
static inline float finish(float p, float u, float *m, const dt__adafactor_k *k) {
    u = u * k->scale;
    if (k->b1 != 0.0f) {
        u = *m * k->b1 + k->omb1 * u;
        *m = u;
    }
    if (k->neg_wd != 0.0f)
        p = p + k->neg_wd * p;
    return p - u;
}

void dt__adafactor_row_scalar(float *p, const float *g, float *m, size_t n, float rf,
                              const float *cf, const dt__adafactor_k *k, dt__lanes *uu) {
    for (size_t i = 0; i < n; i++) {
        float u = (rf * cf[i]) * g[i];
        if (uu) {
            double d = (double)u;
            uu->l[i % DT__LANES] += d * d;
        } else {
            p[i] = finish(p[i], u, m ? m + i : NULL, k);
        }
    }
}

void dt__adafactor_vec_scalar(float *p, const float *g, float *v, float *m, size_t n, float b2t,
                              float omb2t, float eps1, bool update_v, const dt__adafactor_k *k,
                              dt__lanes *uu) {
    for (size_t i = 0; i < n; i++) {
        float vi = v[i];
        if (update_v) {
            vi = vi * b2t + omb2t * (g[i] * g[i] + eps1);
            v[i] = vi;
        }
        float u = (1.0f / sqrtf(vi)) * g[i];
        if (uu) {
            double d = (double)u;
            uu->l[i % DT__LANES] += d * d;
        } else {
            p[i] = finish(p[i], u, m ? m + i : NULL, k);
        }
    }
}

double dt__adafactor_colsq_scalar(double *colsum, const float *g, size_t n) {
    dt__lanes a = {{0}};
    for (size_t i = 0; i < n; i++) {
        double d = (double)g[i];
        colsum[i] += d * d;
        a.l[i % DT__LANES] += d * d;
    }
    return dt__lanes_total(&a);
}

#ifdef __AVX512F__

static inline __mmask16 tail_mask(size_t left) {
    return left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1u);
}

static inline void addsq16(__m512d acc[2], __m512 x) {
    __m512d lo = _mm512_cvtps_pd(_mm512_castps512_ps256(x));
    __m512d hi = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1)));
    acc[0] = _mm512_add_pd(acc[0], _mm512_mul_pd(lo, lo));
    acc[1] = _mm512_add_pd(acc[1], _mm512_mul_pd(hi, hi));
}

static inline __m512 finish16(__m512 p, __m512 u, float *m, __mmask16 mask,
                              const dt__adafactor_k *k) {
    u = _mm512_mul_ps(u, _mm512_set1_ps(k->scale));
    if (k->b1 != 0.0f) {
        u = _mm512_add_ps(_mm512_mul_ps(_mm512_maskz_loadu_ps(mask, m), _mm512_set1_ps(k->b1)),
                          _mm512_mul_ps(_mm512_set1_ps(k->omb1), u));
        _mm512_mask_storeu_ps(m, mask, u);
    }
    if (k->neg_wd != 0.0f)
        p = _mm512_add_ps(p, _mm512_mul_ps(_mm512_set1_ps(k->neg_wd), p));
    return _mm512_sub_ps(p, u);
}

void dt__adafactor_row_vec(float *p, const float *g, float *m, size_t n, float rf, const float *cf,
                           const dt__adafactor_k *k, dt__lanes *uu) {
    __m512d acc[2] = {_mm512_setzero_pd(), _mm512_setzero_pd()};
    if (uu) {
        acc[0] = _mm512_loadu_pd(uu->l);
        acc[1] = _mm512_loadu_pd(uu->l + 8);
    }
    __m512 r = _mm512_set1_ps(rf);
    for (size_t i = 0; i < n; i += 16) {
        __mmask16 mask = tail_mask(n - i);
        __m512 u = _mm512_mul_ps(_mm512_mul_ps(r, _mm512_maskz_loadu_ps(mask, cf + i)),
                                 _mm512_maskz_loadu_ps(mask, g + i));
        if (uu)
            addsq16(acc, u);
        else
            _mm512_mask_storeu_ps(
                p + i, mask,
                finish16(_mm512_maskz_loadu_ps(mask, p + i), u, m ? m + i : NULL, mask, k));
    }
    if (uu) {
        _mm512_storeu_pd(uu->l, acc[0]);
        _mm512_storeu_pd(uu->l + 8, acc[1]);
    }
}

void dt__adafactor_vec_vec(float *p, const float *g, float *v, float *m, size_t n, float b2t,
                           float omb2t, float eps1, bool update_v, const dt__adafactor_k *k,
                           dt__lanes *uu) {
    __m512d acc[2] = {_mm512_setzero_pd(), _mm512_setzero_pd()};
    if (uu) {
        acc[0] = _mm512_loadu_pd(uu->l);
        acc[1] = _mm512_loadu_pd(uu->l + 8);
    }
    __m512 b = _mm512_set1_ps(b2t), omb = _mm512_set1_ps(omb2t), e = _mm512_set1_ps(eps1);
    for (size_t i = 0; i < n; i += 16) {
        __mmask16 mask = tail_mask(n - i);
        __m512 gv = _mm512_maskz_loadu_ps(mask, g + i);
        __m512 vi = _mm512_maskz_loadu_ps(mask, v + i);
        if (update_v) {
            vi = _mm512_add_ps(_mm512_mul_ps(vi, b),
                               _mm512_mul_ps(omb, _mm512_add_ps(_mm512_mul_ps(gv, gv), e)));
            _mm512_mask_storeu_ps(v + i, mask, vi);
        }
        /* Masked-off lanes are 0 / sqrt(0) = NaN; they are never stored
         * and are zeroed before they reach a sum. */
        __m512 u = _mm512_mul_ps(_mm512_div_ps(_mm512_set1_ps(1.0f), _mm512_sqrt_ps(vi)), gv);
        if (uu)
            addsq16(acc, _mm512_maskz_mov_ps(mask, u));
        else
            _mm512_mask_storeu_ps(
                p + i, mask,
                finish16(_mm512_maskz_loadu_ps(mask, p + i), u, m ? m + i : NULL, mask, k));
    }
    if (uu) {
        _mm512_storeu_pd(uu->l, acc[0]);
        _mm512_storeu_pd(uu->l + 8, acc[1]);
    }
}

double dt__adafactor_colsq_vec(double *colsum, const float *g, size_t n) {
    __m512d acc[2] = {_mm512_setzero_pd(), _mm512_setzero_pd()};
    for (size_t i = 0; i < n; i += 16) {
        __mmask16 mask = tail_mask(n - i);
        __m512 x = _mm512_maskz_loadu_ps(mask, g + i);
        __m512d lo = _mm512_cvtps_pd(_mm512_castps512_ps256(x));
        __m512d hi =
            _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1)));
        lo = _mm512_mul_pd(lo, lo);
        hi = _mm512_mul_pd(hi, hi);
        __mmask8 ml = (__mmask8)(mask & 0xff), mh = (__mmask8)(mask >> 8);
        _mm512_mask_storeu_pd(colsum + i, ml,
                              _mm512_add_pd(_mm512_maskz_loadu_pd(ml, colsum + i), lo));
        _mm512_mask_storeu_pd(colsum + i + 8, mh,
                              _mm512_add_pd(_mm512_maskz_loadu_pd(mh, colsum + i + 8), hi));
        acc[0] = _mm512_add_pd(acc[0], lo);
        acc[1] = _mm512_add_pd(acc[1], hi);
    }
    dt__lanes a;
    _mm512_storeu_pd(a.l, acc[0]);
    _mm512_storeu_pd(a.l + 8, acc[1]);
    return dt__lanes_total(&a);
}

#else

void dt__adafactor_row_vec(float *p, const float *g, float *m, size_t n, float rf, const float *cf,
                           const dt__adafactor_k *k, dt__lanes *uu) {
    dt__adafactor_row_scalar(p, g, m, n, rf, cf, k, uu);
}
void dt__adafactor_vec_vec(float *p, const float *g, float *v, float *m, size_t n, float b2t,
                           float omb2t, float eps1, bool update_v, const dt__adafactor_k *k,
                           dt__lanes *uu) {
    dt__adafactor_vec_scalar(p, g, v, m, n, b2t, omb2t, eps1, update_v, k, uu);
}
double dt__adafactor_colsq_vec(double *colsum, const float *g, size_t n) {
    return dt__adafactor_colsq_scalar(colsum, g, n);
}

#endif
