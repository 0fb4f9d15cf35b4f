/*
 * adamw8bit.c — 8-bit AdamW's kernels: the block-wise code of its two
 * moments (optim_internal.h draws it) and the fused step that dequantises
 * in registers, updates as AdamW does, and requantises.
 *
 * Why this code. Dettmers et al. (2022) quantise each 2048-value block
 * relative to its absolute maximum with a "dynamic tree" map of 256 values
 * whose precision is relative rather than absolute, so that small moments
 * survive next to large ones. An 8-bit floating-point code relative to the
 * block maximum has the same property and quantises with integer
 * arithmetic on the float's bits (no table search), which is what lets the
 * step stay memory-bound. The second moment is stored as r = sqrt(v): half
 * the dynamic range to cover (r's smallest code, 2^-11 of the block
 * maximum, is 2^-22 in v) and the square root the update needs anyway. Rounding is to nearest
 * (stochastic rounding would make the slowly-moving v a random walk).
 *
 * The update itself is AdamW's, operation by operation, on the dequantised
 * m and v = r * r, except that sqrt(v) is multiplied by 1 / sqrt(1 - beta2^t)
 * rather than divided by sqrt(1 - beta2^t) (one division fewer per element;
 * a difference of an ulp, far below the code's resolution). Normal codes
 * round to nearest with ties up (an add and a shift on the bits), subnormal
 * ones to nearest even; both forms do the same.
 */
#include "optim_internal.h"

#include <math.h>
#include <string.h>

/* The vector form also needs AVX512BW/VL (byte loads and stores, vpmovdb). */
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define Q8_VEC 1
#include <immintrin.h>
#endif

#define M_SUB_SCALE 131072.0f      /* 2^17: E = 0 codes of m are F * 2^-17 */
#define M_NORMAL    6.10351562e-5f /* 2^-14: m's smallest E = 1 value */
#define M_BIAS      896            /* (127 - 15) << 3: float exponent bits to code E */
#define R_SUB_SCALE 2048.0f        /* 2^11: E = 0 codes of r are F * 2^-11 */
#define R_NORMAL    0.015625f      /* 2^-6 */
#define R_BIAS      3840           /* (127 - 7) << 5 */

static inline uint32_t f2u(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}
static inline float u2f(uint32_t u) {
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

uint8_t dt__q8_encode_m(float y) {
    uint32_t sign = (f2u(y) >> 24) & 0x80u;
    float a = fminf(fabsf(y), 1.0f);
    uint32_t c;
    if (a < M_NORMAL) {
        c = (uint32_t)lrintf(a * M_SUB_SCALE);
    } else {
        c = ((f2u(a) + 0x80000u) >> 20) - M_BIAS; /* nearest, ties up */
    }
    return (uint8_t)(sign | c);
}

float dt__q8_decode_m(uint8_t c) {
    uint32_t mag = c & 0x7fu;
    float x = mag < 8 ? (float)mag * (1.0f / M_SUB_SCALE) : u2f((mag + M_BIAS) << 20);
    return u2f(f2u(x) | ((uint32_t)(c & 0x80u) << 24));
}

uint8_t dt__q8_encode_r(float y) {
    float a = fminf(y, 1.0f);
    if (!(a > 0.0f))
        return 0;
    if (a < R_NORMAL) {
        /* Never 0 for a positive r: a second moment rounded to zero would
         * turn a tiny m into a step of m / eps. */
        long c = lrintf(a * R_SUB_SCALE);
        return (uint8_t)(c > 0 ? c : 1);
    }
    return (uint8_t)(((f2u(a) + 0x20000u) >> 18) - R_BIAS);
}

float dt__q8_decode_r(uint8_t c) {
    uint32_t x = c;
    return x < 32 ? (float)x * (1.0f / R_SUB_SCALE) : u2f((x + R_BIAS) << 18);
}

void dt__q8_step_scalar(float *p, const float *g, const uint8_t *qm, const uint8_t *qr, float am,
                        float ar, size_t n, const dt__adamw_k *k, float *mb, float *rb, float *mmax,
                        float *rmax) {
    float mx = *mmax, rx = *rmax, ib = 1.0f / k->bc2_sqrt;
    for (size_t i = 0; i < n; i++) {
        float mo = dt__q8_decode_m(qm[i]) * am;
        float ro = dt__q8_decode_r(qr[i]) * ar;
        float vo = ro * ro;
        float pi = p[i] * k->decay;
        float mi = mo * k->b1 + k->omb1 * g[i];
        float vi = vo * k->b2 + k->omb2 * g[i] * g[i];
        float ri = sqrtf(vi);
        float denom = ri * ib + k->eps;
        p[i] = pi + k->neg_step * (mi / denom);
        mb[i] = mi;
        rb[i] = ri;
        mx = fmaxf(mx, fabsf(mi));
        rx = fmaxf(rx, ri);
    }
    *mmax = mx;
    *rmax = rx;
}

static inline float inverse(float amax) { return amax > 0.0f ? 1.0f / amax : 0.0f; }

void dt__q8_quantise_scalar(uint8_t *q, const float *x, size_t n, float amax, bool is_m) {
    float inv = inverse(amax);
    for (size_t i = 0; i < n; i++)
        q[i] = is_m ? dt__q8_encode_m(x[i] * inv) : dt__q8_encode_r(x[i] * inv);
}

void dt__q8_dequantise(float *x, const uint8_t *q, size_t n, float amax, bool is_m) {
    for (size_t i = 0; i < n; i++)
        x[i] = (is_m ? dt__q8_decode_m(q[i]) : dt__q8_decode_r(q[i])) * amax;
}

#ifdef Q8_VEC

static inline __mmask16 tail_mask(size_t left) {
    return left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1u);
}

static inline __m512 decode_m16(__m512i c) {
    __m512i mag = _mm512_and_si512(c, _mm512_set1_epi32(0x7f));
    __m512 normal = _mm512_castsi512_ps(
        _mm512_slli_epi32(_mm512_add_epi32(mag, _mm512_set1_epi32(M_BIAS)), 20));
    __m512 sub = _mm512_mul_ps(_mm512_cvtepi32_ps(mag), _mm512_set1_ps(1.0f / M_SUB_SCALE));
    __mmask16 is_sub = _mm512_cmplt_epi32_mask(mag, _mm512_set1_epi32(8)); /* E = 0 */
    __m512 x = _mm512_mask_mov_ps(normal, is_sub, sub);
    __m512i sign = _mm512_slli_epi32(_mm512_and_si512(c, _mm512_set1_epi32(0x80)), 24);
    return _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(x), sign));
}

static inline __m512 decode_r16(__m512i c) {
    __m512 normal =
        _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(c, _mm512_set1_epi32(R_BIAS)), 18));
    __m512 sub = _mm512_mul_ps(_mm512_cvtepi32_ps(c), _mm512_set1_ps(1.0f / R_SUB_SCALE));
    return _mm512_mask_mov_ps(normal, _mm512_cmplt_epi32_mask(c, _mm512_set1_epi32(32)), sub);
}

static inline __m512i encode_m16(__m512 y) {
    __m512i yb = _mm512_castps_si512(y);
    __m512i sign = _mm512_and_si512(_mm512_srli_epi32(yb, 24), _mm512_set1_epi32(0x80));
    __m512 a = _mm512_min_ps(_mm512_abs_ps(y), _mm512_set1_ps(1.0f));
    __m512i cn = _mm512_sub_epi32(
        _mm512_srli_epi32(_mm512_add_epi32(_mm512_castps_si512(a), _mm512_set1_epi32(0x80000)), 20),
        _mm512_set1_epi32(M_BIAS));
    __m512i cs = _mm512_cvtps_epi32(_mm512_mul_ps(a, _mm512_set1_ps(M_SUB_SCALE)));
    __mmask16 is_sub = _mm512_cmp_ps_mask(a, _mm512_set1_ps(M_NORMAL), _CMP_LT_OQ);
    return _mm512_or_si512(_mm512_mask_mov_epi32(cn, is_sub, cs), sign);
}

static inline __m512i encode_r16(__m512 y) {
    __m512 a = _mm512_min_ps(y, _mm512_set1_ps(1.0f));
    __m512i cn = _mm512_sub_epi32(
        _mm512_srli_epi32(_mm512_add_epi32(_mm512_castps_si512(a), _mm512_set1_epi32(0x20000)), 18),
        _mm512_set1_epi32(R_BIAS));
    __m512i cs = _mm512_max_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(a, _mm512_set1_ps(R_SUB_SCALE))),
                                  _mm512_set1_epi32(1));
    __mmask16 is_sub = _mm512_cmp_ps_mask(a, _mm512_set1_ps(R_NORMAL), _CMP_LT_OQ);
    /* Not > 0 (zero, NaN): code 0, as the scalar form. */
    __mmask16 pos = _mm512_cmp_ps_mask(a, _mm512_setzero_ps(), _CMP_GT_OQ);
    return _mm512_maskz_mov_epi32(pos, _mm512_mask_mov_epi32(cn, is_sub, cs));
}

/* One group of 16 of the step (mask: the lanes that exist). */
static inline void q8_step16(float *p, const float *g, const uint8_t *qm, const uint8_t *qr,
                             __mmask16 mask, __m512 amv, __m512 arv, __m512 ib,
                             const dt__adamw_k *k, float *mb, float *rb, __m512 *mx, __m512 *rx) {
    __m512 mo =
        _mm512_mul_ps(decode_m16(_mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(mask, qm))), amv);
    __m512 ro =
        _mm512_mul_ps(decode_r16(_mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(mask, qr))), arv);
    __m512 vo = _mm512_mul_ps(ro, ro);
    __m512 gv = _mm512_maskz_loadu_ps(mask, g);
    __m512 pi = _mm512_mul_ps(_mm512_maskz_loadu_ps(mask, p), _mm512_set1_ps(k->decay));
    __m512 mi = _mm512_add_ps(_mm512_mul_ps(mo, _mm512_set1_ps(k->b1)),
                              _mm512_mul_ps(_mm512_set1_ps(k->omb1), gv));
    __m512 vi = _mm512_add_ps(_mm512_mul_ps(vo, _mm512_set1_ps(k->b2)),
                              _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(k->omb2), gv), gv));
    __m512 ri = _mm512_sqrt_ps(vi);
    __m512 denom = _mm512_add_ps(_mm512_mul_ps(ri, ib), _mm512_set1_ps(k->eps));
    _mm512_mask_storeu_ps(
        p, mask,
        _mm512_add_ps(pi, _mm512_mul_ps(_mm512_set1_ps(k->neg_step), _mm512_div_ps(mi, denom))));
    _mm512_mask_storeu_ps(mb, mask, mi);
    _mm512_mask_storeu_ps(rb, mask, ri);
    /* Lanes that do not exist hold m = 0 and r = 0: no effect on the maxima. */
    *mx = _mm512_max_ps(*mx, _mm512_abs_ps(mi));
    *rx = _mm512_max_ps(*rx, ri);
}

void dt__q8_step_vec(float *p, const float *g, const uint8_t *qm, const uint8_t *qr, float am,
                     float ar, size_t n, const dt__adamw_k *k, float *mb, float *rb, float *mmax,
                     float *rmax) {
    __m512 mx = _mm512_set1_ps(*mmax), rx = _mm512_set1_ps(*rmax);
    __m512 amv = _mm512_set1_ps(am), arv = _mm512_set1_ps(ar);
    __m512 ib = _mm512_set1_ps(1.0f / k->bc2_sqrt);
    size_t i = 0;
    for (; i + 16 <= n; i += 16)
        q8_step16(p + i, g + i, qm + i, qr + i, (__mmask16)0xffff, amv, arv, ib, k, mb + i, rb + i,
                  &mx, &rx);
    if (i < n)
        q8_step16(p + i, g + i, qm + i, qr + i, tail_mask(n - i), amv, arv, ib, k, mb + i, rb + i,
                  &mx, &rx);
    *mmax = _mm512_reduce_max_ps(mx);
    *rmax = _mm512_reduce_max_ps(rx);
}

void dt__q8_quantise_vec(uint8_t *q, const float *x, size_t n, float amax, bool is_m) {
    __m512 inv = _mm512_set1_ps(inverse(amax));
    for (size_t i = 0; i < n; i += 16) {
        __mmask16 mask = tail_mask(n - i);
        __m512 y = _mm512_mul_ps(_mm512_maskz_loadu_ps(mask, x + i), inv);
        __m512i c = is_m ? encode_m16(y) : encode_r16(y);
        _mm_mask_storeu_epi8(q + i, mask, _mm512_cvtepi32_epi8(c));
    }
}

#else

void dt__q8_step_vec(float *p, const float *g, const uint8_t *qm, const uint8_t *qr, float am,
                     float ar, size_t n, const dt__adamw_k *k, float *mb, float *rb, float *mmax,
                     float *rmax) {
    dt__q8_step_scalar(p, g, qm, qr, am, ar, n, k, mb, rb, mmax, rmax);
}
void dt__q8_quantise_vec(uint8_t *q, const float *x, size_t n, float amax, bool is_m) {
    dt__q8_quantise_scalar(q, x, n, amax, is_m);
}

#endif
