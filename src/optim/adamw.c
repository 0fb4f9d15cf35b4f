/*
 * adamw.c — AdamW, RAdam and SGD (momentum, Nesterov) on flat ranges.
 *
 * All follow PyTorch 1.13's single-tensor code operation by operation:
 * the same multiplications and additions in the same order, the per-step
 * scalars computed in double and rounded to float once, as PyTorch does
 * with its Python-float arguments. Each step has a scalar form and an
 * AVX-512 form whose tail is handled with masked loads and stores rather
 * than a scalar loop; both give bit-identical results (see
 * optim_internal.h), so the way a buffer is split into ranges — by shard,
 * by tensor, by OpenMP chunk — never changes a parameter. dt__optim_vec()
 * picks the form at run time (DT_ISA=scalar runs the scalar one).
 *
 * RAdam's weight decay is decoupled (p *= 1 - lr * wd first, as AdamW and
 * PyTorch 2's RAdam(decoupled_weight_decay=True)); 1.13's RAdam only has
 * the L2 form, which the reference reproduces by decaying p itself.
 */
#include "optim_internal.h"

#include <math.h>

#ifdef __AVX512F__
#include <immintrin.h>
#endif

dt_adamw_config dt_adamw_config_default(void) {
    return (dt_adamw_config){.beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 1e-2f};
}

void dt__adamw_k_init(dt__adamw_k *k, float lr, const dt_adamw_config *c, int64_t step,
                      float weight_decay) {
    double b1 = c->beta1, b2 = c->beta2;
    double bc1 = 1.0 - pow(b1, (double)step);
    double bc2 = 1.0 - pow(b2, (double)step);
    k->decay = (float)(1.0 - (double)lr * (double)weight_decay);
    k->b1 = c->beta1;
    k->omb1 = (float)(1.0 - b1);
    k->b2 = c->beta2;
    k->omb2 = (float)(1.0 - b2);
    k->bc2_sqrt = c->beta2 == 1.0f ? 1.0f : (float)sqrt(bc2); /* 1: v frozen (optim.h) */
    k->eps = c->eps;
    k->neg_step = (float)(-((double)lr / bc1));
}

void dt__adamw_range_scalar(float *p, const float *g, float *m, float *v, size_t n,
                            const dt__adamw_k *k) {
    for (size_t i = 0; i < n; i++) {
        float pi = p[i] * k->decay;
        float mi = m[i] * k->b1 + k->omb1 * g[i];
        float vi = v[i] * k->b2 + k->omb2 * g[i] * g[i];
        float denom = sqrtf(vi) / k->bc2_sqrt + k->eps;
        p[i] = pi + k->neg_step * (mi / denom);
        m[i] = mi;
        v[i] = vi;
    }
}

void dt__sgd_range_scalar(float *p, const float *g, float *b, size_t n, float lr, float momentum,
                          bool nesterov, float weight_decay) {
    float neg_lr = -lr;
    for (size_t i = 0; i < n; i++) {
        float d = weight_decay != 0.0f ? g[i] + weight_decay * p[i] : g[i];
        if (momentum != 0.0f) {
            float bi = b[i] * momentum + d;
            b[i] = bi;
            d = nesterov ? d + momentum * bi : bi;
        }
        p[i] = p[i] + neg_lr * d;
    }
}

void dt__radam_k_init(dt__radam_k *k, float lr, const dt_adamw_config *c, int64_t step,
                      float weight_decay) {
    double b1 = c->beta1, b2 = c->beta2, t = (double)step;
    double bc1 = 1.0 - pow(b1, t), bc2 = 1.0 - pow(b2, t);
    k->decay = (float)(1.0 - (double)lr * (double)weight_decay);
    k->b1 = c->beta1;
    k->omb1 = (float)(1.0 - b1);
    k->b2 = c->beta2;
    k->omb2 = (float)(1.0 - b2);
    k->bc1 = (float)bc1;
    k->lr = lr;
    k->sbc2 = (float)sqrt(bc2);
    k->eps = c->eps;
    /* The length of the approximated simple moving average and its
     * maximum; the adaptive step once it exceeds 5 (Liu et al. 2020). */
    double rho_inf = 2.0 / (1.0 - b2) - 1.0;
    double rho_t = rho_inf - 2.0 * t * pow(b2, t) / bc2;
    k->rectify = rho_t > 5.0;
    k->rect = k->rectify ? (float)sqrt((rho_t - 4) * (rho_t - 2) * rho_inf /
                                       ((rho_inf - 4) * (rho_inf - 2) * rho_t))
                         : 1.0f;
}

void dt__radam_range_scalar(float *p, const float *g, float *m, float *v, size_t n,
                            const dt__radam_k *k) {
    for (size_t i = 0; i < n; i++) {
        float pi = p[i] * k->decay;
        float mi = m[i] * k->b1 + k->omb1 * g[i];
        float vi = v[i] * k->b2 + k->omb2 * g[i] * g[i];
        float t = (mi / k->bc1) * k->lr;
        if (k->rectify)
            t = (t * (k->sbc2 / (sqrtf(vi) + k->eps))) * k->rect;
        p[i] = pi - t;
        m[i] = mi;
        v[i] = vi;
    }
}

#ifdef __AVX512F__

static inline void radam16(__m512 *pv, __m512 gv, __m512 *mv, __m512 *vv, const dt__radam_k *k) {
    __m512 pi = _mm512_mul_ps(*pv, _mm512_set1_ps(k->decay));
    __m512 mi = _mm512_add_ps(_mm512_mul_ps(*mv, _mm512_set1_ps(k->b1)),
                              _mm512_mul_ps(_mm512_set1_ps(k->omb1), gv));
    __m512 vi = _mm512_add_ps(_mm512_mul_ps(*vv, _mm512_set1_ps(k->b2)),
                              _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(k->omb2), gv), gv));
    __m512 t = _mm512_mul_ps(_mm512_div_ps(mi, _mm512_set1_ps(k->bc1)), _mm512_set1_ps(k->lr));
    if (k->rectify) {
        __m512 a = _mm512_div_ps(_mm512_set1_ps(k->sbc2),
                                 _mm512_add_ps(_mm512_sqrt_ps(vi), _mm512_set1_ps(k->eps)));
        t = _mm512_mul_ps(_mm512_mul_ps(t, a), _mm512_set1_ps(k->rect));
    }
    *pv = _mm512_sub_ps(pi, t);
    *mv = mi;
    *vv = vi;
}

void dt__radam_range_vec(float *p, const float *g, float *m, float *v, size_t n,
                         const dt__radam_k *k) {
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 pv = _mm512_loadu_ps(p + i), mv = _mm512_loadu_ps(m + i);
        __m512 vv = _mm512_loadu_ps(v + i);
        radam16(&pv, _mm512_loadu_ps(g + i), &mv, &vv, k);
        _mm512_storeu_ps(p + i, pv);
        _mm512_storeu_ps(m + i, mv);
        _mm512_storeu_ps(v + i, vv);
    }
    if (i < n) {
        __mmask16 mask = (__mmask16)((1u << (n - i)) - 1u);
        __m512 pv = _mm512_maskz_loadu_ps(mask, p + i), mv = _mm512_maskz_loadu_ps(mask, m + i);
        __m512 vv = _mm512_maskz_loadu_ps(mask, v + i);
        radam16(&pv, _mm512_maskz_loadu_ps(mask, g + i), &mv, &vv, k);
        _mm512_mask_storeu_ps(p + i, mask, pv);
        _mm512_mask_storeu_ps(m + i, mask, mv);
        _mm512_mask_storeu_ps(v + i, mask, vv);
    }
}

/* One AdamW update of 16 lanes; the same operations as the scalar loop. */
static inline void adamw16(__m512 *pv, __m512 gv, __m512 *mv, __m512 *vv, const dt__adamw_k *k) {
    __m512 pi = _mm512_mul_ps(*pv, _mm512_set1_ps(k->decay));
    __m512 mi = _mm512_add_ps(_mm512_mul_ps(*mv, _mm512_set1_ps(k->b1)),
                              _mm512_mul_ps(_mm512_set1_ps(k->omb1), gv));
    __m512 vi = _mm512_add_ps(_mm512_mul_ps(*vv, _mm512_set1_ps(k->b2)),
                              _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(k->omb2), gv), gv));
    __m512 denom = _mm512_add_ps(_mm512_div_ps(_mm512_sqrt_ps(vi), _mm512_set1_ps(k->bc2_sqrt)),
                                 _mm512_set1_ps(k->eps));
    *pv = _mm512_add_ps(pi, _mm512_mul_ps(_mm512_set1_ps(k->neg_step), _mm512_div_ps(mi, denom)));
    *mv = mi;
    *vv = vi;
}

void dt__adamw_range_vec(float *p, const float *g, float *m, float *v, size_t n,
                         const dt__adamw_k *k) {
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 pv = _mm512_loadu_ps(p + i), mv = _mm512_loadu_ps(m + i);
        __m512 vv = _mm512_loadu_ps(v + i);
        adamw16(&pv, _mm512_loadu_ps(g + i), &mv, &vv, k);
        _mm512_storeu_ps(p + i, pv);
        _mm512_storeu_ps(m + i, mv);
        _mm512_storeu_ps(v + i, vv);
    }
    if (i < n) {
        __mmask16 mask = (__mmask16)((1u << (n - i)) - 1u);
        __m512 pv = _mm512_maskz_loadu_ps(mask, p + i), mv = _mm512_maskz_loadu_ps(mask, m + i);
        __m512 vv = _mm512_maskz_loadu_ps(mask, v + i);
        adamw16(&pv, _mm512_maskz_loadu_ps(mask, g + i), &mv, &vv, k);
        _mm512_mask_storeu_ps(p + i, mask, pv);
        _mm512_mask_storeu_ps(m + i, mask, mv);
        _mm512_mask_storeu_ps(v + i, mask, vv);
    }
}

static inline __m512 sgd16(__m512 pv, __m512 gv, __m512 *bv, float lr, float momentum,
                           bool nesterov, float weight_decay) {
    __m512 d = gv;
    if (weight_decay != 0.0f)
        d = _mm512_add_ps(gv, _mm512_mul_ps(_mm512_set1_ps(weight_decay), pv));
    if (momentum != 0.0f) {
        __m512 mom = _mm512_set1_ps(momentum);
        __m512 bi = _mm512_add_ps(_mm512_mul_ps(*bv, mom), d);
        *bv = bi;
        d = nesterov ? _mm512_add_ps(d, _mm512_mul_ps(mom, bi)) : bi;
    }
    return _mm512_add_ps(pv, _mm512_mul_ps(_mm512_set1_ps(-lr), d));
}

void dt__sgd_range_vec(float *p, const float *g, float *b, size_t n, float lr, float momentum,
                       bool nesterov, float weight_decay) {
    bool use_b = momentum != 0.0f;
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 bv = use_b ? _mm512_loadu_ps(b + i) : _mm512_setzero_ps();
        __m512 pv = sgd16(_mm512_loadu_ps(p + i), _mm512_loadu_ps(g + i), &bv, lr, momentum,
                          nesterov, weight_decay);
        _mm512_storeu_ps(p + i, pv);
        if (use_b)
            _mm512_storeu_ps(b + i, bv);
    }
    if (i < n) {
        __mmask16 mask = (__mmask16)((1u << (n - i)) - 1u);
        __m512 bv = use_b ? _mm512_maskz_loadu_ps(mask, b + i) : _mm512_setzero_ps();
        __m512 pv = sgd16(_mm512_maskz_loadu_ps(mask, p + i), _mm512_maskz_loadu_ps(mask, g + i),
                          &bv, lr, momentum, nesterov, weight_decay);
        _mm512_mask_storeu_ps(p + i, mask, pv);
        if (use_b)
            _mm512_mask_storeu_ps(b + i, mask, bv);
    }
}

#else /* no AVX-512 in this build: AVX2 forms for AdamW and SGD, the scalar loops for the rest */

#include <immintrin.h>

void dt__radam_range_vec(float *p, const float *g, float *m, float *v, size_t n,
                         const dt__radam_k *k) {
    dt__radam_range_scalar(p, g, m, v, n, k);
}

/* 8 lanes of AdamW: the scalar loop's operations in its order (no FMA:
 * the file is compiled with -ffp-contract=off and the intrinsics are the
 * separate multiply and add), so every lane rounds as the scalar code. The
 * tail (< 8) is the scalar loop. */
__attribute__((target("avx2"))) void dt__adamw_range_vec(float *p, const float *g, float *m,
                                                         float *v, size_t n, const dt__adamw_k *k) {
    const __m256 decay = _mm256_set1_ps(k->decay), b1 = _mm256_set1_ps(k->b1),
                 omb1 = _mm256_set1_ps(k->omb1), b2 = _mm256_set1_ps(k->b2),
                 omb2 = _mm256_set1_ps(k->omb2), bc2 = _mm256_set1_ps(k->bc2_sqrt),
                 eps = _mm256_set1_ps(k->eps), neg = _mm256_set1_ps(k->neg_step);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 gv = _mm256_loadu_ps(g + i);
        __m256 pi = _mm256_mul_ps(_mm256_loadu_ps(p + i), decay);
        __m256 mi =
            _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(m + i), b1), _mm256_mul_ps(omb1, gv));
        __m256 vi = _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(v + i), b2),
                                  _mm256_mul_ps(_mm256_mul_ps(omb2, gv), gv));
        __m256 denom = _mm256_add_ps(_mm256_div_ps(_mm256_sqrt_ps(vi), bc2), eps);
        _mm256_storeu_ps(p + i, _mm256_add_ps(pi, _mm256_mul_ps(neg, _mm256_div_ps(mi, denom))));
        _mm256_storeu_ps(m + i, mi);
        _mm256_storeu_ps(v + i, vi);
    }
    dt__adamw_range_scalar(p + i, g + i, m + i, v + i, n - i, k);
}

__attribute__((target("avx2"))) void dt__sgd_range_vec(float *p, const float *g, float *b, size_t n,
                                                       float lr, float momentum, bool nesterov,
                                                       float weight_decay) {
    const __m256 wd = _mm256_set1_ps(weight_decay), mom = _mm256_set1_ps(momentum),
                 neg_lr = _mm256_set1_ps(-lr);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 pv = _mm256_loadu_ps(p + i), gv = _mm256_loadu_ps(g + i);
        __m256 d = weight_decay != 0.0f ? _mm256_add_ps(gv, _mm256_mul_ps(wd, pv)) : gv;
        if (momentum != 0.0f) {
            __m256 bi = _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(b + i), mom), d);
            _mm256_storeu_ps(b + i, bi);
            d = nesterov ? _mm256_add_ps(d, _mm256_mul_ps(mom, bi)) : bi;
        }
        _mm256_storeu_ps(p + i, _mm256_add_ps(pv, _mm256_mul_ps(neg_lr, d)));
    }
    dt__sgd_range_scalar(p + i, g + i, b ? b + i : NULL, n - i, lr, momentum, nesterov,
                         weight_decay);
}

#endif

static void copied(const dt__copy *cp, const float *params, size_t off, size_t len) {
    if (cp && cp->fn)
        cp->fn(cp->user, params + off, cp->at + off, len);
}

void dt__adamw_step_copy(float *params, const float *grads, float *m, float *v, size_t n, float lr,
                         const dt_adamw_config *c, int64_t step, float weight_decay,
                         const dt__copy *cp) {
    DT_ASSERT(c != NULL && step >= 1);
    dt__adamw_k k;
    dt__adamw_k_init(&k, lr, c, step, weight_decay);
    void (*f)(float *, const float *, float *, float *, size_t, const dt__adamw_k *) =
        dt__optim_vec() ? dt__adamw_range_vec : dt__adamw_range_scalar;
    if (n < DT__OPTIM_PAR_MIN) {
        f(params, grads, m, v, n, &k);
        copied(cp, params, 0, n);
        return;
    }
    size_t nchunks = (n + DT__OPTIM_CHUNK - 1) / DT__OPTIM_CHUNK;
#pragma omp parallel for schedule(static)
    for (size_t ci = 0; ci < nchunks; ci++) {
        size_t off = ci * DT__OPTIM_CHUNK;
        size_t len = n - off < DT__OPTIM_CHUNK ? n - off : DT__OPTIM_CHUNK;
        f(params + off, grads + off, m + off, v + off, len, &k);
        copied(cp, params, off, len);
    }
}

void dt_adamw_step(float *params, const float *grads, float *m, float *v, size_t n, float lr,
                   const dt_adamw_config *c, int64_t step, float weight_decay) {
    dt__adamw_step_copy(params, grads, m, v, n, lr, c, step, weight_decay, NULL);
}

void dt__radam_step(float *params, const float *grads, float *m, float *v, size_t n, float lr,
                    const dt_adamw_config *c, int64_t step, float weight_decay,
                    const dt__copy *cp) {
    DT_ASSERT(c != NULL && step >= 1);
    dt__radam_k k;
    dt__radam_k_init(&k, lr, c, step, weight_decay);
    void (*f)(float *, const float *, float *, float *, size_t, const dt__radam_k *) =
        dt__optim_vec() ? dt__radam_range_vec : dt__radam_range_scalar;
    if (n < DT__OPTIM_PAR_MIN) {
        f(params, grads, m, v, n, &k);
        copied(cp, params, 0, n);
        return;
    }
    size_t nchunks = (n + DT__OPTIM_CHUNK - 1) / DT__OPTIM_CHUNK;
#pragma omp parallel for schedule(static)
    for (size_t ci = 0; ci < nchunks; ci++) {
        size_t off = ci * DT__OPTIM_CHUNK;
        size_t len = n - off < DT__OPTIM_CHUNK ? n - off : DT__OPTIM_CHUNK;
        f(params + off, grads + off, m + off, v + off, len, &k);
        copied(cp, params, off, len);
    }
}

void dt__sgd_step_copy(float *params, const float *grads, float *momentum_buf, size_t n, float lr,
                       float momentum, bool nesterov, float weight_decay, const dt__copy *cp) {
    DT_ASSERT(momentum == 0.0f || momentum_buf != NULL);
    void (*f)(float *, const float *, float *, size_t, float, float, bool, float) =
        dt__optim_vec() ? dt__sgd_range_vec : dt__sgd_range_scalar;
    if (n < DT__OPTIM_PAR_MIN) {
        f(params, grads, momentum_buf, n, lr, momentum, nesterov, weight_decay);
        copied(cp, params, 0, n);
        return;
    }
    size_t nchunks = (n + DT__OPTIM_CHUNK - 1) / DT__OPTIM_CHUNK;
#pragma omp parallel for schedule(static)
    for (size_t ci = 0; ci < nchunks; ci++) {
        size_t off = ci * DT__OPTIM_CHUNK;
        size_t len = n - off < DT__OPTIM_CHUNK ? n - off : DT__OPTIM_CHUNK;
        f(params + off, grads + off, momentum_buf ? momentum_buf + off : NULL, len, lr, momentum,
          nesterov, weight_decay);
        copied(cp, params, off, len);
    }
}

void dt_sgd_step(float *params, const float *grads, float *momentum_buf, size_t n, float lr,
                 float momentum, bool nesterov, float weight_decay) {
    dt__sgd_step_copy(params, grads, momentum_buf, n, lr, momentum, nesterov, weight_decay, NULL);
}
