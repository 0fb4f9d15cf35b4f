/*
 * cast.c — the identity codec and the fp16 / bf16 cast codecs.
 *
 * Both casts round to nearest, ties to even, like the hardware converters:
 *   fp16: 11 significant bits, so |x - q| <= 2^-11 |x| for normal results
 *         (|x| >= 2^-14), |x - q| <= 2^-25 below; |x| >= 65520 becomes inf.
 *   bf16: 8 significant bits, |x - q| <= 2^-8 |x|; fp32's exponent range.
 * NaN stays NaN (quiet), inf stays inf.
 *
 * fp16 uses F16C (8 lanes) or AVX-512F (16 lanes) when the CPU has them,
 * chosen at run time so a portable build still gets them; the scalar code
 * is the reference the tests compare against bit for bit. bf16's rounding
 * is three integer operations, done 16 lanes at a time with AVX-512F;
 * AVX512-BF16's VCVTNEPS2BF16 is not used because it flushes subnormal
 * inputs to zero and would not match the reference.
 */
#include "internal.h"

#include <cpuid.h>
#include <immintrin.h>
#include <math.h>

/* ------------------------------------------------------------------------ */
/* Scalar reference conversions                                             */
/* ------------------------------------------------------------------------ */

static inline uint32_t f2u(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
static inline float u2f(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Round-to-nearest-even fp32 -> fp16. Subnormal results come from one fp32
 * addition whose rounding (the default mode) does the work. */
static uint16_t f16_from_f32(float x) {
    uint32_t f = f2u(x);
    uint32_t sign = (f >> 16) & 0x8000u;
    f &= 0x7fffffffu;
    if (f >= 0x47800000u) { /* >= 2^16: inf, or NaN keeping its top payload bits, quiet */
        if (f > 0x7f800000u)
            return (uint16_t)(sign | 0x7e00u | ((f >> 13) & 0x3ffu));
        return (uint16_t)(sign | 0x7c00u);
    }
    if (f < 0x38800000u) { /* below 2^-14: fp16 subnormal or zero */
        const uint32_t magic = (127u - 15u + 23u - 10u + 1u) << 23; /* 0.5 in fp16 ulp units */
        return (uint16_t)(sign | (f2u(u2f(f) + u2f(magic)) - magic));
    }
    uint32_t odd = (f >> 13) & 1u;
    f += 0xc8000fffu + odd; /* rebias the exponent by -112, add half an ulp minus tie bit */
    return (uint16_t)(sign | (f >> 13));
}

static float f32_from_f16(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
    if (exp == 0) {
        float v = (float)mant * 0x1p-24f;
        return sign ? -v : v;
    }
    if (exp == 31)
        return u2f(sign | 0x7f800000u | (mant << 13));
    return u2f(sign | ((exp + 112u) << 23) | (mant << 13));
}

/* ------------------------------------------------------------------------ */
/* SIMD fp16                                                                */
/* ------------------------------------------------------------------------ */

__attribute__((target("avx,f16c"))) static size_t f16_enc_f16c(uint8_t *out, const float *in,
                                                               size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT);
        _mm_storeu_si128((__m128i *)(out + 2 * i), h);
    }
    return i;
}

__attribute__((target("avx,f16c"))) static size_t f16_dec_f16c(float *out, const uint8_t *in,
                                                               size_t n, dt_decode_mode mode) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(in + 2 * i)));
        if (mode == DT_DECODE_ADD)
            v = _mm256_add_ps(v, _mm256_loadu_ps(out + i));
        _mm256_storeu_ps(out + i, v);
    }
    return i;
}

__attribute__((target("avx512f"))) static size_t f16_enc_avx512(uint8_t *out, const float *in,
                                                                size_t n) {
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256i h = _mm512_cvtps_ph(_mm512_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT);
        _mm256_storeu_si256((__m256i *)(out + 2 * i), h);
    }
    return i;
}

__attribute__((target("avx512f"))) static size_t f16_dec_avx512(float *out, const uint8_t *in,
                                                                size_t n, dt_decode_mode mode) {
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 v = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(in + 2 * i)));
        if (mode == DT_DECODE_ADD)
            v = _mm512_add_ps(v, _mm512_loadu_ps(out + i));
        _mm512_storeu_ps(out + i, v);
    }
    return i;
}

bool dt__compress_scalar_only = false;

bool dt__have_avx512f(void) {
    if (dt__compress_scalar_only)
        return false;
    static int have = -1;
    int h = __atomic_load_n(&have, __ATOMIC_RELAXED);
    if (h < 0) {
        __builtin_cpu_init();
        h = __builtin_cpu_supports("avx512f") != 0;
        __atomic_store_n(&have, h, __ATOMIC_RELAXED);
    }
    return h;
}

/* 0 scalar, 1 F16C, 2 AVX-512F; decided once. */
static int f16_level(void) {
    if (dt__compress_scalar_only)
        return 0;
    static int level = -1;
    int l = __atomic_load_n(&level, __ATOMIC_RELAXED);
    if (l < 0) {
        /* F16C from CPUID directly: clang's __builtin_cpu_supports does not
         * know "f16c"; "avx" also checks that the OS saves the registers. */
        unsigned a, b, c, d;
        bool f16c = __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
        l = dt__have_avx512f() ? 2 : (f16c && __builtin_cpu_supports("avx")) ? 1 : 0;
        __atomic_store_n(&level, l, __ATOMIC_RELAXED);
    }
    return l;
}

void dt__f32_to_f16(uint8_t *out, const float *in, size_t n, bool simd) {
    size_t i = 0;
    int level = simd ? f16_level() : 0;
    if (level == 2)
        i = f16_enc_avx512(out, in, n);
    else if (level == 1)
        i = f16_enc_f16c(out, in, n);
    for (; i < n; i++) {
        uint16_t h = f16_from_f32(in[i]);
        memcpy(out + 2 * i, &h, 2);
    }
}

void dt__f16_to_f32(float *out, const uint8_t *in, size_t n, bool simd, dt_decode_mode mode) {
    size_t i = 0;
    int level = simd ? f16_level() : 0;
    if (level == 2)
        i = f16_dec_avx512(out, in, n, mode);
    else if (level == 1)
        i = f16_dec_f16c(out, in, n, mode);
    for (; i < n; i++) {
        uint16_t h;
        memcpy(&h, in + 2 * i, 2);
        float v = f32_from_f16(h);
        out[i] = mode == DT_DECODE_ADD ? out[i] + v : v;
    }
}

/* ------------------------------------------------------------------------ */
/* bf16                                                                     */
/* ------------------------------------------------------------------------ */

static void bf16_enc_scalar(uint8_t *out, const float *in, size_t n) {
    for (size_t i = 0; i < n; i++) {
        uint32_t f = f2u(in[i]);
        uint32_t rounded = (f + 0x7fffu + ((f >> 16) & 1u)) >> 16;
        uint32_t quiet_nan = (f >> 16) | 0x40u;
        uint16_t h = (uint16_t)((f & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded);
        memcpy(out + 2 * i, &h, 2);
    }
}

static void bf16_dec_scalar(float *out, const uint8_t *in, size_t n, dt_decode_mode mode) {
    for (size_t i = 0; i < n; i++) {
        uint16_t h;
        memcpy(&h, in + 2 * i, 2);
        float v = u2f((uint32_t)h << 16);
        out[i] = mode == DT_DECODE_ADD ? out[i] + v : v;
    }
}

/* The scalar rounding, 16 lanes at a time, narrowed with vpmovdw. */
__attribute__((target("avx512f"))) static size_t bf16_enc_avx512(uint8_t *out, const float *in,
                                                                 size_t n) {
    const __m512i one = _mm512_set1_epi32(1), bias = _mm512_set1_epi32(0x7fff);
    const __m512i abs_mask = _mm512_set1_epi32(0x7fffffff), inf = _mm512_set1_epi32(0x7f800000);
    const __m512i quiet = _mm512_set1_epi32(0x40);
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512i f = _mm512_loadu_si512(in + i);
        __m512i hi = _mm512_srli_epi32(f, 16);
        __m512i rounded = _mm512_srli_epi32(
            _mm512_add_epi32(_mm512_add_epi32(f, bias), _mm512_and_si512(hi, one)), 16);
        __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(f, abs_mask), inf);
        __m512i h = _mm512_mask_blend_epi32(nan, rounded, _mm512_or_si512(hi, quiet));
        _mm256_storeu_si256((__m256i *)(out + 2 * i), _mm512_cvtepi32_epi16(h));
    }
    return i;
}

__attribute__((target("avx512f"))) static size_t bf16_dec_avx512(float *out, const uint8_t *in,
                                                                 size_t n, dt_decode_mode mode) {
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512i h = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(in + 2 * i)));
        __m512 v = _mm512_castsi512_ps(_mm512_slli_epi32(h, 16));
        if (mode == DT_DECODE_ADD)
            v = _mm512_add_ps(v, _mm512_loadu_ps(out + i));
        _mm512_storeu_ps(out + i, v);
    }
    return i;
}

void dt__f32_to_bf16(uint8_t *out, const float *in, size_t n) {
    size_t i = dt__have_avx512f() ? bf16_enc_avx512(out, in, n) : 0;
    bf16_enc_scalar(out + 2 * i, in + i, n - i);
}

void dt__bf16_to_f32(float *out, const uint8_t *in, size_t n, dt_decode_mode mode) {
    size_t i = dt__have_avx512f() ? bf16_dec_avx512(out, in, n, mode) : 0;
    bf16_dec_scalar(out + i, in + 2 * i, n - i, mode);
}

/* ------------------------------------------------------------------------ */
/* Codec tables                                                             */
/* ------------------------------------------------------------------------ */

static bool bytes_x4(const dt_codec_header *h, size_t *out) {
    return dt_mul_size((size_t)h->count, 4, out);
}
static bool bytes_x2(const dt_codec_header *h, size_t *out) {
    return dt_mul_size((size_t)h->count, 2, out);
}

static dt_status none_encode(dt_compressor *c, const float *x, uint64_t step, uint8_t *p) {
    memcpy(p, x, c->n * sizeof(float));
    return DT_OK;
}

static void none_decode(const dt_codec_header *h, const uint8_t *p, float *out,
                        dt_decode_mode mode) {
    size_t n = (size_t)h->count;
    if (mode == DT_DECODE_SET) {
        memcpy(out, p, n * sizeof(float));
        return;
    }
    for (size_t i = 0; i < n; i++)
        out[i] += dt__load_f32(p + 4 * i);
}

static dt_status fp16_encode(dt_compressor *c, const float *x, uint64_t step, uint8_t *p) {
    dt__f32_to_f16(p, x, c->n, true);
    return DT_OK;
}

static void fp16_decode(const dt_codec_header *h, const uint8_t *p, float *out,
                        dt_decode_mode mode) {
    dt__f16_to_f32(out, p, (size_t)h->count, true, mode);
}

static dt_status bf16_encode(dt_compressor *c, const float *x, uint64_t step, uint8_t *p) {
    dt__f32_to_bf16(p, x, c->n);
    return DT_OK;
}

static void bf16_decode(const dt_codec_header *h, const uint8_t *p, float *out,
                        dt_decode_mode mode) {
    dt__bf16_to_f32(out, p, (size_t)h->count, mode);
}

/* Error feedback for the element-wise codecs in chunks that stay in L1:
 * x = grad + residual, encode, decode, residual = x - decoded; the same
 * arithmetic as the generic path, one pass over memory instead of four. */
typedef void (*chunk_enc)(uint8_t *out, const float *in, size_t n);
typedef void (*chunk_dec)(float *out, const uint8_t *in, size_t n);

static void ef_chunks(size_t width, chunk_enc enc, chunk_dec dec, size_t n, const float *grad,
                      const float *res_in, float *res_out, uint8_t *p) {
    float x[DT_COMPRESS_BLOCK], d[DT_COMPRESS_BLOCK];
    for (size_t lo = 0; lo < n; lo += DT_COMPRESS_BLOCK) {
        size_t len = n - lo < DT_COMPRESS_BLOCK ? n - lo : DT_COMPRESS_BLOCK;
        for (size_t i = 0; i < len; i++)
            x[i] = grad[lo + i] + res_in[lo + i];
        enc(p + width * lo, x, len);
        dec(d, p + width * lo, len);
        for (size_t i = 0; i < len; i++)
            res_out[lo + i] = x[i] - d[i];
    }
}

static void none_chunk_enc(uint8_t *out, const float *in, size_t n) { memcpy(out, in, 4 * n); }
static void none_chunk_dec(float *out, const uint8_t *in, size_t n) { memcpy(out, in, 4 * n); }
static void fp16_chunk_enc(uint8_t *out, const float *in, size_t n) {
    dt__f32_to_f16(out, in, n, true);
}
static void fp16_chunk_dec(float *out, const uint8_t *in, size_t n) {
    dt__f16_to_f32(out, in, n, true, DT_DECODE_SET);
}
static void bf16_chunk_dec(float *out, const uint8_t *in, size_t n) {
    dt__bf16_to_f32(out, in, n, DT_DECODE_SET);
}

static dt_status none_encode_ef(dt_compressor *c, const float *grad, const float *res_in,
                                float *res_out, uint64_t step, uint8_t *p) {
    ef_chunks(4, none_chunk_enc, none_chunk_dec, c->n, grad, res_in, res_out, p);
    return DT_OK;
}

static dt_status fp16_encode_ef(dt_compressor *c, const float *grad, const float *res_in,
                                float *res_out, uint64_t step, uint8_t *p) {
    ef_chunks(2, fp16_chunk_enc, fp16_chunk_dec, c->n, grad, res_in, res_out, p);
    return DT_OK;
}

static dt_status bf16_encode_ef(dt_compressor *c, const float *grad, const float *res_in,
                                float *res_out, uint64_t step, uint8_t *p) {
    ef_chunks(2, dt__f32_to_bf16, bf16_chunk_dec, c->n, grad, res_in, res_out, p);
    return DT_OK;
}

const dt__codec_ops dt__codec_none = {
    .info = {.name = "none", .linear = true},
    .payload_bytes = bytes_x4,
    .encode = none_encode,
    .encode_ef = none_encode_ef,
    .decode = none_decode,
};

const dt__codec_ops dt__codec_fp16 = {
    .info = {.name = "fp16", .linear = true},
    .payload_bytes = bytes_x2,
    .encode = fp16_encode,
    .encode_ef = fp16_encode_ef,
    .decode = fp16_decode,
};

const dt__codec_ops dt__codec_bf16 = {
    .info = {.name = "bf16", .linear = true},
    .payload_bytes = bytes_x2,
    .encode = bf16_encode,
    .encode_ef = bf16_encode_ef,
    .decode = bf16_decode,
};
