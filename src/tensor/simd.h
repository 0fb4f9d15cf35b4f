/*
 * simd.h — small vector helpers shared by the tensor kernels (internal).
 *
 * With __AVX512F__ (an -march=native build on an AVX-512 machine) the
 * helpers use 16-lane intrinsics; otherwise they are plain loops that the
 * compiler may vectorise for whatever the target has. Both paths compute the
 * same function; the AVX-512 exp agrees with expf() to about 2 ulp.
 */
#ifndef DT_TENSOR_SIMD_H
#define DT_TENSOR_SIMD_H

#include <math.h>
#include <stddef.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

/* The AVX-512 feature set of the hand-written kernels: a function with this
 * attribute compiles in a portable build too (its callers choose at run time
 * with dt_isa()), and inlines into any caller that has these features. */
#define DT__AVX512_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma")))

/* e^x: x = n ln2 + r with |r| <= ln2/2, e^r by a degree-7 Taylor polynomial
 * (truncation error < 1e-8 relative), then scaled by 2^n with vscalefps,
 * which handles overflow to +inf and underflow to 0 without bit tricks. */
DT__AVX512_TARGET static inline __attribute__((always_inline)) __m512 dt__exp16(__m512 x) {
    const __m512 log2e = _mm512_set1_ps(1.44269504088896341f);
    const __m512 ln2_hi = _mm512_set1_ps(0.693359375f);
    const __m512 ln2_lo = _mm512_set1_ps(-2.12194440e-4f);
    x = _mm512_max_ps(x, _mm512_set1_ps(-104.0f));
    x = _mm512_min_ps(x, _mm512_set1_ps(89.0f));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, log2e),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, ln2_hi, x);
    r = _mm512_fnmadd_ps(n, ln2_lo, r);
    __m512 p = _mm512_set1_ps(1.0f / 5040.0f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}

#endif

#ifdef __AVX512F__
/* Mask selecting the first n (< 16) lanes. */
static inline __mmask16 dt__tail_mask(size_t n) { return (__mmask16)((1u << n) - 1u); }
#endif

/* y[i] = exp(x[i] - m) for i < n; returns the sum of y (y may alias x). */
static inline float dt__exp_shift_sum(float *y, const float *x, float m, size_t n) {
#ifdef __AVX512F__
    __m512 vm = _mm512_set1_ps(m), acc = _mm512_setzero_ps();
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 e = dt__exp16(_mm512_sub_ps(_mm512_loadu_ps(x + i), vm));
        _mm512_storeu_ps(y + i, e);
        acc = _mm512_add_ps(acc, e);
    }
    if (i < n) {
        __mmask16 k = dt__tail_mask(n - i);
        __m512 e = dt__exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, x + i), vm));
        e = _mm512_maskz_mov_ps(k, e);
        _mm512_mask_storeu_ps(y + i, k, e);
        acc = _mm512_add_ps(acc, e);
    }
    return _mm512_reduce_add_ps(acc);
#else
    float s = 0.0f;
    for (size_t i = 0; i < n; i++) {
        y[i] = expf(x[i] - m);
        s += y[i];
    }
    return s;
#endif
}

/* max of x[0..n), n >= 1. */
static inline float dt__max(const float *x, size_t n) {
#ifdef __AVX512F__
    __m512 acc = _mm512_set1_ps(-INFINITY);
    size_t i = 0;
    for (; i + 16 <= n; i += 16)
        acc = _mm512_max_ps(acc, _mm512_loadu_ps(x + i));
    if (i < n)
        acc = _mm512_mask_max_ps(acc, dt__tail_mask(n - i), acc,
                                 _mm512_maskz_loadu_ps(dt__tail_mask(n - i), x + i));
    return _mm512_reduce_max_ps(acc);
#else
    float m = x[0];
    for (size_t i = 1; i < n; i++)
        m = x[i] > m ? x[i] : m;
    return m;
#endif
}

/* sum of x[i] * y[i]. */
static inline float dt__dot(const float *x, const float *y, size_t n) {
#ifdef __AVX512F__
    __m512 acc = _mm512_setzero_ps();
    size_t i = 0;
    for (; i + 16 <= n; i += 16)
        acc = _mm512_fmadd_ps(_mm512_loadu_ps(x + i), _mm512_loadu_ps(y + i), acc);
    if (i < n) {
        __mmask16 k = dt__tail_mask(n - i);
        acc =
            _mm512_fmadd_ps(_mm512_maskz_loadu_ps(k, x + i), _mm512_maskz_loadu_ps(k, y + i), acc);
    }
    return _mm512_reduce_add_ps(acc);
#else
    float s = 0.0f;
    for (size_t i = 0; i < n; i++)
        s += x[i] * y[i];
    return s;
#endif
}

/* y[i] += a * x[i]. */
static inline void dt__axpy(float *restrict y, float a, const float *restrict x, size_t n) {
#ifdef __AVX512F__
    __m512 va = _mm512_set1_ps(a);
    size_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(y + i,
                         _mm512_fmadd_ps(va, _mm512_loadu_ps(x + i), _mm512_loadu_ps(y + i)));
    if (i < n) {
        __mmask16 k = dt__tail_mask(n - i);
        _mm512_mask_storeu_ps(
            y + i, k,
            _mm512_fmadd_ps(va, _mm512_maskz_loadu_ps(k, x + i), _mm512_maskz_loadu_ps(k, y + i)));
    }
#else
    for (size_t i = 0; i < n; i++)
        y[i] += a * x[i];
#endif
}

/* y[i] *= a. */
static inline void dt__scal(float *y, float a, size_t n) {
    for (size_t i = 0; i < n; i++)
        y[i] *= a;
}

/* log sum exp of x[0..n), n >= 1, without storing the exponentials. The
 * cross-entropy kernels and the GPT's chunked LM head both use this one
 * summation order, so their losses agree bit for bit. */
static inline float dt__lse(const float *x, size_t n) {
    float m = dt__max(x, n), s = 0.0f;
    size_t j = 0;
#ifdef __AVX512F__
    __m512 vm = _mm512_set1_ps(m), acc = _mm512_setzero_ps();
    for (; j + 16 <= n; j += 16)
        acc = _mm512_add_ps(acc, dt__exp16(_mm512_sub_ps(_mm512_loadu_ps(x + j), vm)));
    s = _mm512_reduce_add_ps(acc);
#endif
    for (; j < n; j++)
        s += expf(x[j] - m);
    // cppcheck-suppress invalidFunctionArg ; s >= exp(0) = 1: the max term is included
    return m + logf(s);
}

/* d[j] = scale * exp(x[j] - l) for j < n (d may be x): softmax times scale
 * given the row's log-sum-exp l, the cross-entropy gradient before the
 * one-hot is subtracted. */
static inline void dt__exp_shift_scale(float *d, const float *x, float l, float scale, size_t n) {
    size_t j = 0;
#ifdef __AVX512F__
    __m512 vl = _mm512_set1_ps(l), vs = _mm512_set1_ps(scale);
    for (; j + 16 <= n; j += 16)
        _mm512_storeu_ps(d + j,
                         _mm512_mul_ps(vs, dt__exp16(_mm512_sub_ps(_mm512_loadu_ps(x + j), vl))));
#endif
    for (; j < n; j++)
        d[j] = scale * expf(x[j] - l);
}

#endif /* DT_TENSOR_SIMD_H */
