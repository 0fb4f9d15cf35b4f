/*
 * quant.c — block-scaled quantisers: int8, QSGD (1..8 bits) and 1-bit sign.
 *
 * All three cut the tensor into blocks of DT_COMPRESS_BLOCK (256) values
 * (the last block may be shorter) and send one fp32 scale per block, so a
 * single large gradient only coarsens its own block. Payload layout:
 *
 *   scales   f32[nblocks]
 *   codes    int8:  i8[n]                 q = round(x / s), s = absmax / 127
 *            qsgd:  b bits per value       (LSB-first bit stream)
 *            sign:  1 bit per value        (1 = negative)
 *
 * int8: |x - q s| <= s / 2 (plus fp32 rounding of the product): biased only
 *   by rounding, error feedback optional.
 * QSGD (stochastic rounding on a grid of L = 2^b - 1 intervals spanning
 *   [-m, m], m = block absmax): u = (x / m + 1) L / 2 is rounded up with
 *   probability frac(u), so E[decode] = x exactly in real arithmetic and
 *   |x - decode| < 2m / L. Using the block max instead of the L2 norm of the
 *   original QSGD keeps b = 1 meaningful (values become +-m, like TernGrad)
 *   and gives a smaller variance for the same bits. One 32-bit Philox draw
 *   per value, stream keyed by (seed, rank, step, bucket).
 * sign: decode = sign(x) * mean(|x| over the block): biased, so error
 *   feedback is on by default (EF-SignSGD, Karimireddy et al. 2019).
 *
 * Encoding a block holding inf or NaN fails with DT_ERR_NUMERIC (its scale
 * would be meaningless); decoding rejects any non-finite or negative scale
 * as corrupt, since encode never produces one.
 */
#include "internal.h"

#include <immintrin.h>
#include <math.h>

static bool bytes_scaled(const dt_codec_header *h, size_t bits_per_value, size_t *out) {
    size_t n = (size_t)h->count; /* <= SIZE_MAX / 8, checked by the caller */
    size_t code_bits = n * bits_per_value;
    size_t codes = code_bits / 8 + (code_bits % 8 != 0);
    size_t scales = dt__nblocks(n) * 4;
    *out = scales + codes;
    return *out >= codes;
}

/* int8 and QSGD send a block whose largest magnitude is below this as
 * zeros: the reciprocal of its scale would overflow (127 / m is inf for m
 * below ~4e-37), and such values carry nothing a model could use. With error
 * feedback they stay in the residual. */
#define TINY 1e-30f

/* The block's absmax, or DT_ERR_NUMERIC if it holds inf or NaN (a scale
 * computed from it would be meaningless). */
static dt_status block_scale(const char *codec, const float *x, size_t len, size_t block,
                             float *absmax) {
    uint32_t bits = dt__absmax_bits(x, len);
    if (bits >= 0x7f800000u)
        return dt_error_set(DT_ERR_NUMERIC, "%s encode: block %zu holds a non-finite value", codec,
                            block);
    memcpy(absmax, &bits, 4);
    return DT_OK;
}

/* A block's input: x itself, or x + residual gathered into tmp (the fused
 * error-feedback path: one pass instead of add, encode, decode, subtract). */
static const float *block_input(const float *x, const float *res_in, size_t lo, size_t len,
                                float *tmp) {
    if (!res_in)
        return x + lo;
    for (size_t i = 0; i < len; i++)
        tmp[i] = x[lo + i] + res_in[lo + i];
    return tmp;
}

static dt_status scales_validate(const dt_codec_header *h, const uint8_t *p) {
    return dt__validate_scales(p, dt__nblocks((size_t)h->count), dt_codec_get_info(h->kind)->name);
}

/* ------------------------------------------------------------------------ */
/* int8                                                                     */
/* ------------------------------------------------------------------------ */

static bool int8_bytes(const dt_codec_header *h, size_t *out) { return bytes_scaled(h, 8, out); }

/* With res_in (error feedback): encode x + res_in and write res_out =
 * (x + res_in) - decode, computed exactly as decode does. */
static dt_status int8_encode_impl(dt_compressor *c, const float *x, const float *res_in,
                                  float *res_out, uint8_t *p) {
    size_t n = c->n, nb = dt__nblocks(n);
    int8_t *codes = (int8_t *)(p + 4 * nb);
    float tmp[DT_COMPRESS_BLOCK];
    for (size_t b = 0; b < nb; b++) {
        size_t lo = b * DT_COMPRESS_BLOCK;
        size_t len = n - lo < DT_COMPRESS_BLOCK ? n - lo : DT_COMPRESS_BLOCK;
        const float *restrict xb = block_input(x, res_in, lo, len, tmp);
        float m = 0.0f;
        DT_CHECK(block_scale("int8", xb, len, b, &m));
        m = m < TINY ? 0.0f : m;
        float inv = m > 0.0f ? 127.0f / m : 0.0f, s = m / 127.0f;
        if (!(s * 127.0f <= 3.4028235e38f)) /* m near FLT_MAX: keep 127 s finite */
            s = nextafterf(s, 0.0f);
        dt__store_f32(p + 4 * b, s);
        int8_t *restrict q = codes + lo;
        for (size_t i = 0; i < len; i++) {
            float v = rintf(xb[i] * inv);
            v = v > 127.0f ? 127.0f : (v < -127.0f ? -127.0f : v);
            q[i] = (int8_t)v;
        }
        if (res_out) {
            float *restrict r = res_out + lo;
            for (size_t i = 0; i < len; i++)
                r[i] = xb[i] - (float)q[i] * s;
        }
    }
    return DT_OK;
}

static dt_status int8_encode(dt_compressor *c, const float *x, uint64_t step, uint8_t *p) {
    return int8_encode_impl(c, x, NULL, NULL, p);
}

static dt_status int8_encode_ef(dt_compressor *c, const float *grad, const float *res_in,
                                float *res_out, uint64_t step, uint8_t *p) {
    return int8_encode_impl(c, grad, res_in, res_out, p);
}

static void int8_decode(const dt_codec_header *h, const uint8_t *p, float *out,
                        dt_decode_mode mode) {
    size_t n = (size_t)h->count, nb = dt__nblocks(n);
    const int8_t *codes = (const int8_t *)(p + 4 * nb);
    for (size_t b = 0; b < nb; b++) {
        size_t lo = b * DT_COMPRESS_BLOCK;
        size_t len = n - lo < DT_COMPRESS_BLOCK ? n - lo : DT_COMPRESS_BLOCK;
        float s = dt__load_f32(p + 4 * b);
        const int8_t *restrict q = codes + lo;
        float *restrict o = out + lo;
        if (mode == DT_DECODE_ADD)
            for (size_t i = 0; i < len; i++)
                o[i] += (float)q[i] * s;
        else
            for (size_t i = 0; i < len; i++)
                o[i] = (float)q[i] * s;
    }
}

const dt__codec_ops dt__codec_int8 = {
    .info = {.name = "int8"},
    .payload_bytes = int8_bytes,
    .encode = int8_encode,
    .encode_ef = int8_encode_ef,
    .validate = scales_validate,
    .decode = int8_decode,
};

/* ------------------------------------------------------------------------ */
/* QSGD                                                                     */
/* ------------------------------------------------------------------------ */

static bool qsgd_bytes(const dt_codec_header *h, size_t *out) {
    return bytes_scaled(h, (size_t)h->bits, out);
}

/* Blocks start on byte boundaries in the code stream (256 b bits is a
 * whole number of bytes), so each block packs and unpacks on its own. */
static inline __attribute__((always_inline)) void pack_bits(uint8_t *out, const uint8_t *q,
                                                            size_t len, unsigned bits) {
    uint64_t acc = 0;
    unsigned have = 0;
    size_t o = 0;
    for (size_t i = 0; i < len; i++) {
        acc |= (uint64_t)q[i] << have;
        have += bits;
        if (have >= 32) {
            dt__store_u32(out + o, (uint32_t)acc);
            o += 4;
            acc >>= 32;
            have -= 32;
        }
    }
    for (; have > 0; have = have > 8 ? have - 8 : 0) {
        out[o++] = (uint8_t)acc;
        acc >>= 8;
    }
}

/* Reads exactly ceil(len bits / 8) bytes. */
static inline __attribute__((always_inline)) void unpack_bits(uint8_t *q, const uint8_t *in,
                                                              size_t len, unsigned bits) {
    size_t nbytes = (len * bits + 7) / 8, at = 0;
    uint64_t acc = 0;
    unsigned have = 0;
    uint32_t mask = (1u << bits) - 1u;
    for (size_t i = 0; i < len; i++) {
        if (have < bits) {
            if (at + 4 <= nbytes) {
                acc |= (uint64_t)dt__load_u32(in + at) << have;
                at += 4;
                have += 32;
            } else {
                while (have < bits) {
                    acc |= (uint64_t)in[at++] << have;
                    have += 8;
                }
            }
        }
        q[i] = (uint8_t)(acc & mask);
        acc >>= bits;
        have -= bits;
    }
}

/* Widths that divide 8: whole bytes of 8 / bits values, the same LSB-first
 * layout as pack_bits (value i at bit i * bits), in loops that vectorise. */
static inline __attribute__((always_inline)) void pack_pow2(uint8_t *out, const uint8_t *q,
                                                            size_t len, unsigned bits) {
    const unsigned per = 8 / bits;
    size_t full = len / per;
    for (size_t j = 0; j < full; j++) {
        unsigned byte = 0;
        for (unsigned k = 0; k < per; k++)
            byte |= (unsigned)q[j * per + k] << (k * bits);
        out[j] = (uint8_t)byte;
    }
    if (len % per) {
        unsigned byte = 0;
        for (size_t k = 0; k < len % per; k++)
            byte |= (unsigned)q[full * per + k] << (k * bits);
        out[full] = (uint8_t)byte;
    }
}

static inline __attribute__((always_inline)) void unpack_pow2(uint8_t *q, const uint8_t *in,
                                                              size_t len, unsigned bits) {
    const unsigned per = 8 / bits, mask = (1u << bits) - 1u;
    size_t full = len / per;
    for (size_t j = 0; j < full; j++)
        for (unsigned k = 0; k < per; k++)
            q[j * per + k] = (uint8_t)((in[j] >> (k * bits)) & mask);
    for (size_t k = 0; k < len % per; k++)
        q[full * per + k] = (uint8_t)((in[full] >> (k * bits)) & mask);
}

/* A switch on constant bit widths lets each case's loop specialise. */
static void pack_block(uint8_t *out, const uint8_t *q, size_t len, unsigned bits) {
    switch (bits) {
    case 1: pack_pow2(out, q, len, 1); break;
    case 2: pack_pow2(out, q, len, 2); break;
    case 3: pack_bits(out, q, len, 3); break;
    case 4: pack_pow2(out, q, len, 4); break;
    case 5: pack_bits(out, q, len, 5); break;
    case 6: pack_bits(out, q, len, 6); break;
    case 7: pack_bits(out, q, len, 7); break;
    default: memcpy(out, q, len); break;
    }
}

static void unpack_block(uint8_t *q, const uint8_t *in, size_t len, unsigned bits) {
    switch (bits) {
    case 1: unpack_pow2(q, in, len, 1); break;
    case 2: unpack_pow2(q, in, len, 2); break;
    case 3: unpack_bits(q, in, len, 3); break;
    case 4: unpack_pow2(q, in, len, 4); break;
    case 5: unpack_bits(q, in, len, 5); break;
    case 6: unpack_bits(q, in, len, 6); break;
    case 7: unpack_bits(q, in, len, 7); break;
    default: memcpy(q, in, len); break;
    }
}

static dt_status qsgd_encode_impl(dt_compressor *c, const float *x, const float *res_in,
                                  float *res_out, uint64_t step, uint8_t *p) {
    size_t n = c->n, nb = dt__nblocks(n);
    unsigned bits = (unsigned)c->hdr.bits;
    uint32_t top = (1u << bits) - 1u;
    float levels = (float)top;
    uint8_t *codes = p + 4 * nb;
    /* Value i of the bucket uses output (bucket << 40) + i of the stream. */
    uint64_t stream = dt_rng_stream_id(c->cfg.rank, step, DT_RNG_COMPRESS);
    uint64_t base = (uint64_t)c->cfg.bucket << 40;
    uint32_t rnd[DT_COMPRESS_BLOCK];
    uint8_t q[DT_COMPRESS_BLOCK];
    float tmp[DT_COMPRESS_BLOCK];
    for (size_t b = 0; b < nb; b++) {
        size_t lo = b * DT_COMPRESS_BLOCK;
        size_t len = n - lo < DT_COMPRESS_BLOCK ? n - lo : DT_COMPRESS_BLOCK;
        const float *restrict xb = block_input(x, res_in, lo, len, tmp);
        float m = 0.0f;
        DT_CHECK(block_scale("qsgd", xb, len, b, &m));
        m = m < TINY ? 0.0f : m;
        dt__store_f32(p + 4 * b, m);
        dt__philox_fill(c->cfg.seed, stream, base + lo, rnd, len);
        float mul = m > 0.0f ? 0.5f * levels / m : 0.0f, half = 0.5f * levels;
        /* Signed conversions, truncation for floor (u >= 0) and a float
         * select keep this loop vectorised; floorf would not be (it may
         * not raise "inexact" under the default -ftrapping-math). */
        const int itop = (int)top;
        for (size_t i = 0; i < len; i++) {
            float u = xb[i] * mul + half; /* in [0, levels]; x + m could overflow */
            float f = (float)(int)u;
            float r = (float)(int32_t)(rnd[i] >> 8) * 0x1p-24f; /* dt_rng_uniform's mapping */
            int level = (int)(f + (r < u - f ? 1.0f : 0.0f));
            q[i] = (uint8_t)(level < itop ? level : itop);
        }
        pack_block(codes + lo / 8 * bits, q, len, bits);
        if (res_out) {
            float *restrict r = res_out + lo; /* exactly as qsgd_decode */
            for (size_t i = 0; i < len; i++)
                r[i] = xb[i] - m * ((float)(2 * (int)q[i] - itop) / levels);
        }
    }
    return DT_OK;
}

static dt_status qsgd_encode(dt_compressor *c, const float *x, uint64_t step, uint8_t *p) {
    return qsgd_encode_impl(c, x, NULL, NULL, step, p);
}

static dt_status qsgd_encode_ef(dt_compressor *c, const float *grad, const float *res_in,
                                float *res_out, uint64_t step, uint8_t *p) {
    return qsgd_encode_impl(c, grad, res_in, res_out, step, p);
}

static void qsgd_decode(const dt_codec_header *h, const uint8_t *p, float *out,
                        dt_decode_mode mode) {
    size_t n = (size_t)h->count, nb = dt__nblocks(n);
    unsigned bits = (unsigned)h->bits;
    float levels = (float)((1u << bits) - 1u);
    const uint8_t *codes = p + 4 * nb;
    uint8_t q[DT_COMPRESS_BLOCK];
    for (size_t b = 0; b < nb; b++) {
        size_t lo = b * DT_COMPRESS_BLOCK;
        size_t len = n - lo < DT_COMPRESS_BLOCK ? n - lo : DT_COMPRESS_BLOCK;
        float m = dt__load_f32(p + 4 * b);
        const int itop = (int)levels;
        unpack_block(q, codes + lo / 8 * bits, len, bits);
        float *restrict o = out + lo;
        if (mode == DT_DECODE_ADD)
            for (size_t i = 0; i < len; i++)
                o[i] += m * ((float)(2 * (int)q[i] - itop) / levels);
        else
            for (size_t i = 0; i < len; i++)
                o[i] = m * ((float)(2 * (int)q[i] - itop) / levels);
    }
}

const dt__codec_ops dt__codec_qsgd = {
    .info = {.name = "qsgd", .stochastic = true},
    .payload_bytes = qsgd_bytes,
    .encode = qsgd_encode,
    .encode_ef = qsgd_encode_ef,
    .validate = scales_validate,
    .decode = qsgd_decode,
};

/* ------------------------------------------------------------------------ */
/* sign                                                                     */
/* ------------------------------------------------------------------------ */

static bool sign_bytes(const dt_codec_header *h, size_t *out) { return bytes_scaled(h, 1, out); }

static dt_status sign_encode_impl(dt_compressor *c, const float *x, const float *res_in,
                                  float *res_out, uint8_t *p) {
    size_t n = c->n, nb = dt__nblocks(n);
    uint8_t *bitsp = p + 4 * nb;
    float tmp[DT_COMPRESS_BLOCK];
    for (size_t b = 0; b < nb; b++) {
        size_t lo = b * DT_COMPRESS_BLOCK;
        size_t len = n - lo < DT_COMPRESS_BLOCK ? n - lo : DT_COMPRESS_BLOCK;
        const float *restrict xb = block_input(x, res_in, lo, len, tmp);
        float m = 0.0f;
        DT_CHECK(block_scale("sign", xb, len, b, &m));
        /* 16 partial sums in a fixed order: vectorisable and deterministic. */
        float part[16] = {0};
        size_t i = 0;
        for (; i + 16 <= len; i += 16)
            for (int l = 0; l < 16; l++)
                part[l] += fabsf(xb[i + l]);
        for (; i < len; i++)
            part[i % 16] += fabsf(xb[i]);
        for (int w = 8; w > 0; w /= 2)
            for (int l = 0; l < w; l++)
                part[l] += part[l + w];
        float scale = part[0] / (float)len;
        if (!(scale <= 3.4028235e38f)) /* the sum of 256 huge values overflowed */
            return dt_error_set(DT_ERR_NUMERIC,
                                "sign encode: block %zu: the sum of |x| overflows fp32", b);
        dt__store_f32(p + 4 * b, scale);
        /* Blocks start on byte boundaries (256 is a multiple of 8). */
        uint8_t *restrict ob = bitsp + lo / 8;
        for (size_t j = 0; j < len / 8; j++) {
            unsigned byte = 0;
            for (unsigned k = 0; k < 8; k++)
                byte |= (unsigned)(xb[8 * j + k] < 0.0f) << k;
            ob[j] = (uint8_t)byte;
        }
        if (len % 8) {
            unsigned byte = 0;
            for (size_t k = len / 8 * 8; k < len; k++)
                byte |= (unsigned)(xb[k] < 0.0f) << (k % 8);
            ob[len / 8] = (uint8_t)byte;
        }
        if (res_out) {
            float *restrict r = res_out + lo;
            for (size_t j = 0; j < len; j++)
                r[j] = xb[j] - (xb[j] < 0.0f ? -scale : scale); /* as sign_decode */
        }
    }
    return DT_OK;
}

static dt_status sign_encode(dt_compressor *c, const float *x, uint64_t step, uint8_t *p) {
    return sign_encode_impl(c, x, NULL, NULL, p);
}

static dt_status sign_encode_ef(dt_compressor *c, const float *grad, const float *res_in,
                                float *res_out, uint64_t step, uint8_t *p) {
    return sign_encode_impl(c, grad, res_in, res_out, p);
}

static void sign_decode_block(float *o, const uint8_t *ib, size_t len, uint32_t s,
                              dt_decode_mode mode) {
    for (size_t i = 0; i < len; i++) {
        uint32_t u = s | (uint32_t)((ib[i >> 3] >> (i & 7)) & 1u) << 31;
        float v;
        memcpy(&v, &u, 4);
        o[i] = mode == DT_DECODE_ADD ? o[i] + v : v;
    }
}

/* 16 values per step: two bytes of sign bits are the blend mask. */
__attribute__((target("avx512f"))) static void
sign_decode_block_avx512(float *o, const uint8_t *ib, size_t len, uint32_t s, dt_decode_mode mode) {
    float sv;
    memcpy(&sv, &s, 4);
    const __m512 pos = _mm512_set1_ps(sv), neg = _mm512_set1_ps(-sv);
    size_t i = 0;
    for (; i + 16 <= len; i += 16) {
        uint16_t mask;
        memcpy(&mask, ib + i / 8, 2);
        __m512 v = _mm512_mask_blend_ps((__mmask16)mask, pos, neg);
        if (mode == DT_DECODE_ADD)
            v = _mm512_add_ps(v, _mm512_loadu_ps(o + i));
        _mm512_storeu_ps(o + i, v);
    }
    sign_decode_block(o + i, ib + i / 8, len - i, s, mode);
}

static void sign_decode(const dt_codec_header *h, const uint8_t *p, float *out,
                        dt_decode_mode mode) {
    size_t n = (size_t)h->count, nb = dt__nblocks(n);
    const uint8_t *bitsp = p + 4 * nb;
    bool simd = dt__have_avx512f();
    for (size_t b = 0; b < nb; b++) {
        size_t lo = b * DT_COMPRESS_BLOCK;
        size_t len = n - lo < DT_COMPRESS_BLOCK ? n - lo : DT_COMPRESS_BLOCK;
        uint32_t s = dt__load_u32(p + 4 * b); /* the scale's bits; >= 0, so bit 31 is 0 */
        if (simd)
            sign_decode_block_avx512(out + lo, bitsp + lo / 8, len, s, mode);
        else
            sign_decode_block(out + lo, bitsp + lo / 8, len, s, mode);
    }
}

const dt__codec_ops dt__codec_sign = {
    .info = {.name = "sign", .biased = true, .ef_default = true},
    .payload_bytes = sign_bytes,
    .encode = sign_encode,
    .encode_ef = sign_encode_ef,
    .validate = scales_validate,
    .decode = sign_decode,
};
