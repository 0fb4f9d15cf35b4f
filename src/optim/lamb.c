/*
 * lamb.c — the layer-wise optimizers' range kernels: LAMB's moments and
 * update, LARS's update, and the lane sums their trust ratios (and every
 * other per-tensor statistic) are made of.
 *
 * A trust ratio needs norms over a whole tensor, which a ZeRO rank may own
 * only part of; the kernels therefore only add this range's squares into
 * lanes (dt__lanes), and optimizer.c sums the lanes of a tensor's pieces,
 * then over the ranks (the config's reduce), before applying. LAMB makes
 * two passes: moments (written) and norms, then the update, recomputing
 * u from m, v and the unchanged p rather than storing it.
 *
 * As everywhere in this layer, the vector and scalar forms perform the same
 * IEEE operations in the same order (bit-identical), lanes included.
 */
#include "optim_internal.h"

#include <math.h>

#ifdef __AVX512F__
#include <immintrin.h>
#endif

double dt__lanes_total(const dt__lanes *a) {
    double s = 0.0;
    for (int j = 0; j < DT__LANES; j++)
        s += a->l[j];
    return s;
}

void dt__lanes_sum_scalar(dt__lanes *a, const float *x, size_t n, bool squares) {
    for (size_t i = 0; i < n; i++) {
        double d = (double)x[i];
        a->l[i % DT__LANES] += squares ? d * d : d;
    }
}

void dt__lamb_k_init(dt__lamb_k *k, const dt_adamw_config *c, int64_t step, float weight_decay,
                     bool frozen) {
    double b1 = c->beta1, b2 = c->beta2;
    k->b1 = c->beta1;
    k->omb1 = (float)(1.0 - b1);
    k->b2 = frozen ? 1.0f : c->beta2;
    k->omb2 = frozen ? 0.0f : (float)(1.0 - b2);
    k->bc1 = (float)(1.0 - pow(b1, (double)step));
    k->bc2 = frozen ? 1.0f : (float)(1.0 - pow(b2, (double)step));
    k->eps = c->eps;
    k->wd = weight_decay;
}

/* The LAMB direction of one element. */
static inline float lamb_u(float p, float m, float v, const dt__lamb_k *k) {
    return (m / k->bc1) / (sqrtf(v / k->bc2) + k->eps) + k->wd * p;
}

void dt__lamb_moments_scalar(const float *p, const float *g, float *m, float *v, size_t n,
                             const dt__lamb_k *k, dt__lanes *pp, dt__lanes *uu) {
    for (size_t i = 0; i < n; i++) {
        float mi = m[i], vi = v[i];
        if (g) {
            mi = mi * k->b1 + k->omb1 * g[i];
            vi = vi * k->b2 + k->omb2 * g[i] * g[i];
            m[i] = mi;
            v[i] = vi;
        }
        double u = (double)lamb_u(p[i], mi, vi, k), pd = (double)p[i];
        pp->l[i % DT__LANES] += pd * pd;
        uu->l[i % DT__LANES] += u * u;
    }
}

void dt__lamb_apply_scalar(float *p, const float *m, const float *v, size_t n, const dt__lamb_k *k,
                           float neg_step) {
    for (size_t i = 0; i < n; i++)
        p[i] = p[i] + neg_step * lamb_u(p[i], m[i], v[i], k);
}

void dt__lars_range_scalar(float *p, const float *g, float *b, size_t n, float lr, float momentum,
                           bool nesterov, float wd, float trust) {
    float neg_lr = -lr;
    for (size_t i = 0; i < n; i++) {
        float d = (g[i] + wd * p[i]) * trust;
        if (momentum != 0.0f) {
            float bi = b[i] * momentum + d;
            b[i] = bi;
            d = nesterov ? d + momentum * bi : bi;
        }
        p[i] = p[i] + neg_lr * d;
    }
}

#ifdef __AVX512F__

/* a's lanes 0-7 += x's low half (as doubles), lanes 8-15 += its high half. */
static inline void lanes_add16(__m512d acc[2], __m512 x) {
    acc[0] = _mm512_add_pd(acc[0], _mm512_cvtps_pd(_mm512_castps512_ps256(x)));
    acc[1] = _mm512_add_pd(
        acc[1], _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1))));
}

static inline void lanes_addsq16(__m512d acc[2], __m512 x) {
    __m512d lo = _mm512_cvtps_pd(_mm512_castps512_ps256(x));
    __m512d hi = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1)));
    acc[0] = _mm512_add_pd(acc[0], _mm512_mul_pd(lo, lo));
    acc[1] = _mm512_add_pd(acc[1], _mm512_mul_pd(hi, hi));
}

static inline void lanes_load(__m512d acc[2], const dt__lanes *a) {
    acc[0] = _mm512_loadu_pd(a->l);
    acc[1] = _mm512_loadu_pd(a->l + 8);
}

static inline void lanes_store(dt__lanes *a, const __m512d acc[2]) {
    _mm512_storeu_pd(a->l, acc[0]);
    _mm512_storeu_pd(a->l + 8, acc[1]);
}

static inline __mmask16 tail_mask(size_t left) { return (__mmask16)((1u << left) - 1u); }

void dt__lanes_sum(dt__lanes *a, const float *x, size_t n, bool squares) {
    if (!dt__optim_vec()) {
        dt__lanes_sum_scalar(a, x, n, squares);
        return;
    }
    __m512d acc[2];
    lanes_load(acc, a);
    for (size_t i = 0; i < n; i += 16) {
        __m512 xv =
            n - i >= 16 ? _mm512_loadu_ps(x + i) : _mm512_maskz_loadu_ps(tail_mask(n - i), x + i);
        if (squares)
            lanes_addsq16(acc, xv);
        else
            lanes_add16(acc, xv);
    }
    lanes_store(a, acc);
}

static inline __m512 lamb_u16(__m512 p, __m512 m, __m512 v, const dt__lamb_k *k) {
    __m512 den = _mm512_add_ps(_mm512_sqrt_ps(_mm512_div_ps(v, _mm512_set1_ps(k->bc2))),
                               _mm512_set1_ps(k->eps));
    return _mm512_add_ps(_mm512_div_ps(_mm512_div_ps(m, _mm512_set1_ps(k->bc1)), den),
                         _mm512_mul_ps(_mm512_set1_ps(k->wd), p));
}

void dt__lamb_moments_vec(const float *p, const float *g, float *m, float *v, size_t n,
                          const dt__lamb_k *k, dt__lanes *pp, dt__lanes *uu) {
    __m512d ap[2], au[2];
    lanes_load(ap, pp);
    lanes_load(au, uu);
    for (size_t i = 0; i < n; i += 16) {
        __mmask16 mask = n - i >= 16 ? (__mmask16)0xffff : tail_mask(n - i);
        __m512 pv = _mm512_maskz_loadu_ps(mask, p + i);
        __m512 mv = _mm512_maskz_loadu_ps(mask, m + i), vv = _mm512_maskz_loadu_ps(mask, v + i);
        if (g) {
            __m512 gv = _mm512_maskz_loadu_ps(mask, g + i);
            mv = _mm512_add_ps(_mm512_mul_ps(mv, _mm512_set1_ps(k->b1)),
                               _mm512_mul_ps(_mm512_set1_ps(k->omb1), gv));
            vv = _mm512_add_ps(_mm512_mul_ps(vv, _mm512_set1_ps(k->b2)),
                               _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(k->omb2), gv), gv));
            _mm512_mask_storeu_ps(m + i, mask, mv);
            _mm512_mask_storeu_ps(v + i, mask, vv);
        }
        /* Masked-off lanes: p, m = 0 and v = 0 give u = 0 / eps = 0. */
        lanes_addsq16(ap, pv);
        lanes_addsq16(au, _mm512_maskz_mov_ps(mask, lamb_u16(pv, mv, vv, k)));
    }
    lanes_store(pp, ap);
    lanes_store(uu, au);
}

void dt__lamb_apply_vec(float *p, const float *m, const float *v, size_t n, const dt__lamb_k *k,
                        float neg_step) {
    for (size_t i = 0; i < n; i += 16) {
        __mmask16 mask = n - i >= 16 ? (__mmask16)0xffff : tail_mask(n - i);
        __m512 pv = _mm512_maskz_loadu_ps(mask, p + i);
        __m512 u =
            lamb_u16(pv, _mm512_maskz_loadu_ps(mask, m + i), _mm512_maskz_loadu_ps(mask, v + i), k);
        _mm512_mask_storeu_ps(p + i, mask,
                              _mm512_add_ps(pv, _mm512_mul_ps(_mm512_set1_ps(neg_step), u)));
    }
}

void dt__lars_range_vec(float *p, const float *g, float *b, size_t n, float lr, float momentum,
                        bool nesterov, float wd, float trust) {
    bool use_b = momentum != 0.0f;
    __m512 mom = _mm512_set1_ps(momentum);
    for (size_t i = 0; i < n; i += 16) {
        __mmask16 mask = n - i >= 16 ? (__mmask16)0xffff : tail_mask(n - i);
        __m512 pv = _mm512_maskz_loadu_ps(mask, p + i);
        __m512 d = _mm512_mul_ps(_mm512_add_ps(_mm512_maskz_loadu_ps(mask, g + i),
                                               _mm512_mul_ps(_mm512_set1_ps(wd), pv)),
                                 _mm512_set1_ps(trust));
        if (use_b) {
            __m512 bi = _mm512_add_ps(_mm512_mul_ps(_mm512_maskz_loadu_ps(mask, b + i), mom), d);
            _mm512_mask_storeu_ps(b + i, mask, bi);
            d = nesterov ? _mm512_add_ps(d, _mm512_mul_ps(mom, bi)) : bi;
        }
        _mm512_mask_storeu_ps(p + i, mask,
                              _mm512_add_ps(pv, _mm512_mul_ps(_mm512_set1_ps(-lr), d)));
    }
}

#else

void dt__lanes_sum(dt__lanes *a, const float *x, size_t n, bool squares) {
    dt__lanes_sum_scalar(a, x, n, squares);
}
void dt__lamb_moments_vec(const float *p, const float *g, float *m, float *v, size_t n,
                          const dt__lamb_k *k, dt__lanes *pp, dt__lanes *uu) {
    dt__lamb_moments_scalar(p, g, m, v, n, k, pp, uu);
}
void dt__lamb_apply_vec(float *p, const float *m, const float *v, size_t n, const dt__lamb_k *k,
                        float neg_step) {
    dt__lamb_apply_scalar(p, m, v, n, k, neg_step);
}
void dt__lars_range_vec(float *p, const float *g, float *b, size_t n, float lr, float momentum,
                        bool nesterov, float wd, float trust) {
    dt__lars_range_scalar(p, g, b, n, lr, momentum, nesterov, wd, trust);
}

#endif
