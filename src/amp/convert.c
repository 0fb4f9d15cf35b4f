/*
 * convert.c — fp32 <-> bf16 and fp32 <-> fp16, scalar reference and
 * AVX2 / AVX-512 / AVX512-BF16 paths chosen by dt_isa().
 *
 * Invariant: every path gives the same bits as the scalar reference for
 * every input (tests check all 65536 16-bit patterns and the special fp32
 * values on every level). Two hardware details shape the vector code:
 *   - vcvtneps2bf16 flushes fp32 subnormal inputs to zero, which neither
 *     PyTorch's bf16 rounding nor ours does; the AVX512-BF16 path therefore
 *     uses the instruction only for blocks without subnormals and falls back
 *     to integer rounding for the rare block that has one.
 *   - F16C (vcvtps2ph with immediate 0, vcvtph2ps) quiets NaNs and keeps the
 *     top payload bits; the scalar reference is written to do the same.
 * Vector functions carry target attributes, so a portable build
 * (-DDT_NATIVE=OFF) still contains every path and picks one at run time.
 */
#include "dtrain/amp.h"

#include <immintrin.h>
#include <omp.h>
#include <string.h>

static inline uint32_t f32_bits(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}

static inline float bits_f32(uint32_t u) {
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

/* ------------------------------------------------------------------------ */
/* Scalar reference                                                         */
/* ------------------------------------------------------------------------ */

dt_bf16 dt_bf16_from_f32(float x) {
    uint32_t u = f32_bits(x);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (dt_bf16)((u >> 16) | 0x40u); /* NaN: set the quiet bit */
    /* Adding 0x7fff plus the lowest kept bit rounds half to even; a carry
     * out of the mantissa correctly bumps the exponent (up to infinity). */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (dt_bf16)(u >> 16);
}

float dt_f32_from_bf16(dt_bf16 x) { return bits_f32((uint32_t)x << 16); }

dt_f16 dt_f16_from_f32(float x) {
    uint32_t u = f32_bits(x);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) /* NaN: quiet, top 10 payload bits kept */
        return (dt_f16)(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
    if (a >= 0x477ff000u) /* >= 65520 (half-way above 65504) rounds to inf */
        return (dt_f16)(sign | 0x7c00u);
    if (a >= 0x38800000u) { /* a normal half: rebias 127 -> 15, round 13 bits */
        uint32_t r = a + 0xfffu + ((a >> 13) & 1u);
        return (dt_f16)(sign | ((r >> 13) - (112u << 10)));
    }
    if (a <= 0x33000000u) /* <= 2^-25: half-way to 2^-24 or less rounds to 0 */
        return sign;
    /* A half subnormal: value = m * 2^(e-150) = q * 2^-24 with q = m >> (126-e). */
    uint32_t e = a >> 23, m = (a & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126u - e; /* 14..24 */
    uint32_t q = m >> shift, rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (q & 1u)))
        q++;
    return (dt_f16)(sign | q);
}

float dt_f32_from_f16(dt_f16 h) {
    uint32_t sign = ((uint32_t)h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0x1f) /* inf, or NaN made quiet like vcvtph2ps does */
        return bits_f32(sign | 0x7f800000u | (m ? 0x400000u | (m << 13) : 0));
    if (e == 0) {
        if (m == 0)
            return bits_f32(sign);
        e = 1; /* normalise a subnormal */
        while (!(m & 0x400u)) {
            m <<= 1;
            e--;
        }
        m &= 0x3ffu;
    }
    return bits_f32(sign | ((e + 112u) << 23) | (m << 13));
}

static void f32_to_bf16_scalar(dt_bf16 *out, const float *in, size_t n) {
    for (size_t i = 0; i < n; i++)
        out[i] = dt_bf16_from_f32(in[i]);
}

static void bf16_to_f32_scalar(float *out, const dt_bf16 *in, size_t n) {
    for (size_t i = 0; i < n; i++)
        out[i] = dt_f32_from_bf16(in[i]);
}

static void f32_to_f16_scalar(dt_f16 *out, const float *in, size_t n) {
    for (size_t i = 0; i < n; i++)
        out[i] = dt_f16_from_f32(in[i]);
}

static void f16_to_f32_scalar(float *out, const dt_f16 *in, size_t n) {
    for (size_t i = 0; i < n; i++)
        out[i] = dt_f32_from_f16(in[i]);
}

/* ------------------------------------------------------------------------ */
/* AVX2 (+F16C): 8 lanes, scalar tail                                       */
/* ------------------------------------------------------------------------ */

#define AVX2_TARGET __attribute__((target("avx2,fma,f16c")))

AVX2_TARGET static inline __m128i bf16_round8(__m256i u) {
    const __m256i absmask = _mm256_set1_epi32(0x7fffffff);
    __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, absmask), _mm256_set1_epi32(0x7f800000));
    __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    __m256i r = _mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff)));
    __m256i q = _mm256_or_si256(u, _mm256_set1_epi32(0x400000)); /* NaN: quiet bit */
    r = _mm256_srli_epi32(_mm256_blendv_epi8(r, q, nan), 16);
    /* packus works within 128-bit halves: lanes come out as 0..3,0..3 | 4..7,4..7 */
    __m256i p = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
    return _mm256_castsi256_si128(p);
}

AVX2_TARGET static void f32_to_bf16_avx2(dt_bf16 *out, const float *in, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256i u = _mm256_loadu_si256((const __m256i *)(in + i));
        _mm_storeu_si128((__m128i *)(out + i), bf16_round8(u));
    }
    f32_to_bf16_scalar(out + i, in + i, n - i);
}

AVX2_TARGET static void bf16_to_f32_avx2(float *out, const dt_bf16 *in, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256i h = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(in + i)));
        _mm256_storeu_si256((__m256i *)(out + i), _mm256_slli_epi32(h, 16));
    }
    bf16_to_f32_scalar(out + i, in + i, n - i);
}

AVX2_TARGET static void f32_to_f16_avx2(dt_f16 *out, const float *in, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT);
        _mm_storeu_si128((__m128i *)(out + i), h);
    }
    f32_to_f16_scalar(out + i, in + i, n - i);
}

AVX2_TARGET static void f16_to_f32_avx2(float *out, const dt_f16 *in, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(in + i))));
    f16_to_f32_scalar(out + i, in + i, n - i);
}

/* ------------------------------------------------------------------------ */
/* AVX-512: 16 lanes, masked tail                                           */
/* ------------------------------------------------------------------------ */

#define AVX512_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq")))
#define BF16_TARGET   __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")))

static inline __mmask16 tail_mask(size_t left) {
    return left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1u);
}

AVX512_TARGET static inline __m256i bf16_round16(__m512i u) {
    __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                            _mm512_set1_epi32(0x7f800000));
    __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff)));
    r = _mm512_mask_or_epi32(r, nan, u, _mm512_set1_epi32(0x400000));
    return _mm512_cvtepi32_epi16(_mm512_srli_epi32(r, 16));
}

AVX512_TARGET static void f32_to_bf16_avx512(dt_bf16 *out, const float *in, size_t n) {
    for (size_t i = 0; i < n; i += 16) {
        __mmask16 m = tail_mask(n - i);
        __m512i u = _mm512_maskz_loadu_epi32(m, in + i);
        _mm256_mask_storeu_epi16(out + i, m, bf16_round16(u));
    }
}

AVX512_TARGET static void bf16_to_f32_avx512(float *out, const dt_bf16 *in, size_t n) {
    for (size_t i = 0; i < n; i += 16) {
        __mmask16 m = tail_mask(n - i);
        __m512i h = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, in + i));
        _mm512_mask_storeu_epi32(out + i, m, _mm512_slli_epi32(h, 16));
    }
}

AVX512_TARGET static void f32_to_f16_avx512(dt_f16 *out, const float *in, size_t n) {
    for (size_t i = 0; i < n; i += 16) {
        __mmask16 m = tail_mask(n - i);
        __m256i h = _mm512_cvtps_ph(_mm512_maskz_loadu_ps(m, in + i), _MM_FROUND_TO_NEAREST_INT);
        _mm256_mask_storeu_epi16(out + i, m, h);
    }
}

AVX512_TARGET static void f16_to_f32_avx512(float *out, const dt_f16 *in, size_t n) {
    for (size_t i = 0; i < n; i += 16) {
        __mmask16 m = tail_mask(n - i);
        _mm512_mask_storeu_ps(out + i, m, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, in + i)));
    }
}

BF16_TARGET static void f32_to_bf16_avx512bf16(dt_bf16 *out, const float *in, size_t n) {
    for (size_t i = 0; i < n; i += 16) {
        __mmask16 m = tail_mask(n - i);
        __m512 x = _mm512_maskz_loadu_ps(m, in + i);
        __m256i h;
        /* fpclass 0x20: subnormal; vcvtneps2bf16 would flush those to 0. */
        if (_mm512_fpclass_ps_mask(x, 0x20))
            h = bf16_round16(_mm512_castps_si512(x));
        else
            h = (__m256i)_mm512_cvtneps_pbh(x);
        _mm256_mask_storeu_epi16(out + i, m, h);
    }
}

/* ------------------------------------------------------------------------ */
/* Dispatch                                                                 */
/* ------------------------------------------------------------------------ */

/* Arrays of a million elements or more (a model's weights, cast every step)
 * are split over the OpenMP threads in 64-element-aligned chunks: one core
 * does not saturate memory bandwidth. Each chunk runs the same path, so the
 * result is the same bits as one call. */
#define PAR_MIN ((size_t)1 << 20)

typedef enum conv_kind { TO_BF16, FROM_BF16, TO_F16, FROM_F16 } conv_kind;

static void convert_serial(conv_kind k, dt_isa_level l, void *out, const void *in, size_t n) {
    switch (k) {
    case TO_BF16:
        if (l >= DT_ISA_AVX512BF16)
            f32_to_bf16_avx512bf16(out, in, n);
        else if (l >= DT_ISA_AVX512)
            f32_to_bf16_avx512(out, in, n);
        else if (l >= DT_ISA_AVX2)
            f32_to_bf16_avx2(out, in, n);
        else
            f32_to_bf16_scalar(out, in, n);
        break;
    case FROM_BF16:
        if (l >= DT_ISA_AVX512)
            bf16_to_f32_avx512(out, in, n);
        else if (l >= DT_ISA_AVX2)
            bf16_to_f32_avx2(out, in, n);
        else
            bf16_to_f32_scalar(out, in, n);
        break;
    case TO_F16:
        if (l >= DT_ISA_AVX512)
            f32_to_f16_avx512(out, in, n);
        else if (l >= DT_ISA_AVX2)
            f32_to_f16_avx2(out, in, n);
        else
            f32_to_f16_scalar(out, in, n);
        break;
    case FROM_F16:
        if (l >= DT_ISA_AVX512)
            f16_to_f32_avx512(out, in, n);
        else if (l >= DT_ISA_AVX2)
            f16_to_f32_avx2(out, in, n);
        else
            f16_to_f32_scalar(out, in, n);
        break;
    }
}

static void convert(conv_kind k, void *out, size_t out_size, const void *in, size_t in_size,
                    size_t n) {
    dt_isa_level l = dt_isa();
    int nt = omp_get_max_threads();
    if (n < PAR_MIN || nt < 2 || omp_in_parallel()) {
        convert_serial(k, l, out, in, n);
        return;
    }
    size_t chunk = dt_align_up((n + (size_t)nt - 1) / (size_t)nt, 64);
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int t = 0; t < nt; t++) {
        size_t b = (size_t)t * chunk, e = b + chunk < n ? b + chunk : n;
        if (b < e)
            convert_serial(k, l, (char *)out + b * out_size, (const char *)in + b * in_size, e - b);
    }
}

void dt_f32_to_bf16(dt_bf16 *out, const float *in, size_t n) {
    convert(TO_BF16, out, sizeof *out, in, sizeof *in, n);
}

void dt_bf16_to_f32(float *out, const dt_bf16 *in, size_t n) {
    convert(FROM_BF16, out, sizeof *out, in, sizeof *in, n);
}

void dt_f32_to_f16(dt_f16 *out, const float *in, size_t n) {
    convert(TO_F16, out, sizeof *out, in, sizeof *in, n);
}

void dt_f16_to_f32(float *out, const dt_f16 *in, size_t n) {
    convert(FROM_F16, out, sizeof *out, in, sizeof *in, n);
}
