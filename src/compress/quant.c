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

#include <math.h>

static bool bytes_scaled(const dt_codec_header *h, size_t bits_per_value, size_t *out) {
    size_t n = (size_t)h->count; /* <= SIZE_MAX / 8, checked by the caller */
    size_t code_bits = n * bits_per_value;
    size_t codes = code_bits / 8 + (code_bits % 8 != 0);
    size_t scales = dt__nblocks(n) * 4;
    *out = scales + codes;
    return *out >= codes;
}

static float block_absmax(const float *x, size_t len) {
    float m = 0.0f;
    for (size_t i = 0; i < len; i++) {
        float a = fabsf(x[i]);
        m = a > m ? a : m;
    }
    return m;
}

/* Non-finite check hoisted out of the inner loops: a NaN anywhere in the
 * block makes the sum of |x| NaN, an inf makes it inf. */
static dt_status check_block(const char *codec, const float *x, size_t len, size_t block) {
    float s = 0.0f;
    for (size_t i = 0; i < len; i++)
        s += fabsf(x[i]) * 0.0f; /* 0 for finite values, NaN for inf and NaN */
    if (s != 0.0f)
        return dt_error_set(DT_ERR_NUMERIC, "%s encode: block %zu holds a non-finite value", codec,
                            block);
    return DT_OK;
}

static dt_status scales_validate(const dt_codec_header *h, const uint8_t *p) {
    return dt__validate_scales(p, dt__nblocks((size_t)h->count), dt_codec_get_info(h->kind)->name);
}

/* ------------------------------------------------------------------------ */
/* int8                                                                     */
/* ------------------------------------------------------------------------ */

static bool int8_bytes(const dt_codec_header *h, size_t *out) { return bytes_scaled(h, 8, out); }

static dt_status int8_encode(dt_compressor *c, const float *x, uint64_t step, uint8_t *p) {
    size_t n = c->n, nb = dt__nblocks(n);
    int8_t *codes = (int8_t *)(p + 4 * nb);
    for (size_t b = 0; b < nb; b++) {
        size_t lo = b * DT_COMPRESS_BLOCK;
        size_t len = n - lo < DT_COMPRESS_BLOCK ? n - lo : DT_COMPRESS_BLOCK;
        DT_CHECK(check_block("int8", x + lo, len, b));
        float m = block_absmax(x + lo, len);
        float scale = m / 127.0f;
        float inv = m > 0.0f ? 127.0f / m : 0.0f;
        dt__store_f32(p + 4 * b, scale);
        for (size_t i = 0; i < len; i++) {
            float q = rintf(x[lo + i] * inv);
            q = q > 127.0f ? 127.0f : (q < -127.0f ? -127.0f : q);
            codes[lo + i] = (int8_t)q;
        }
    }
    return DT_OK;
}

static void int8_decode(const dt_codec_header *h, const uint8_t *p, float *out,
                        dt_decode_mode mode) {
    size_t n = (size_t)h->count, nb = dt__nblocks(n);
    const int8_t *codes = (const int8_t *)(p + 4 * nb);
    for (size_t b = 0; b < nb; b++) {
        size_t lo = b * DT_COMPRESS_BLOCK;
        size_t len = n - lo < DT_COMPRESS_BLOCK ? n - lo : DT_COMPRESS_BLOCK;
        float s = dt__load_f32(p + 4 * b);
        if (mode == DT_DECODE_ADD)
            for (size_t i = 0; i < len; i++)
                out[lo + i] += (float)codes[lo + i] * s;
        else
            for (size_t i = 0; i < len; i++)
                out[lo + i] = (float)codes[lo + i] * s;
    }
}

const dt__codec_ops dt__codec_int8 = {
    .info = {.name = "int8"},
    .payload_bytes = int8_bytes,
    .encode = int8_encode,
    .validate = scales_validate,
    .decode = int8_decode,
};

/* ------------------------------------------------------------------------ */
/* QSGD                                                                     */
/* ------------------------------------------------------------------------ */

static bool qsgd_bytes(const dt_codec_header *h, size_t *out) {
    return bytes_scaled(h, (size_t)h->bits, out);
}

static dt_status qsgd_encode(dt_compressor *c, const float *x, uint64_t step, uint8_t *p) {
    size_t n = c->n, nb = dt__nblocks(n);
    unsigned bits = (unsigned)c->hdr.bits;
    float levels = (float)((1u << bits) - 1u);
    uint8_t *codes = p + 4 * nb;
    dt_rng rng;
    dt__compress_rng(&rng, c->cfg.seed, c->cfg.rank, step, c->cfg.bucket);
    uint64_t acc = 0; /* bit stream accumulator, LSB first */
    unsigned have = 0;
    size_t out = 0;
    for (size_t b = 0; b < nb; b++) {
        size_t lo = b * DT_COMPRESS_BLOCK;
        size_t len = n - lo < DT_COMPRESS_BLOCK ? n - lo : DT_COMPRESS_BLOCK;
        DT_CHECK(check_block("qsgd", x + lo, len, b));
        float m = block_absmax(x + lo, len);
        dt__store_f32(p + 4 * b, m);
        float mul = m > 0.0f ? 0.5f * levels / m : 0.0f;
        for (size_t i = 0; i < len; i++) {
            float u = (x[lo + i] + m) * mul; /* in [0, levels] */
            float f = floorf(u);
            uint32_t q = (uint32_t)f + (dt_rng_uniform(&rng) < u - f);
            if (q > (1u << bits) - 1u)
                q = (1u << bits) - 1u;
            acc |= (uint64_t)q << have;
            have += bits;
            if (have >= 32) {
                dt__store_u32(codes + out, (uint32_t)acc);
                out += 4;
                acc >>= 32;
                have -= 32;
            }
        }
    }
    while (have > 0) {
        codes[out++] = (uint8_t)acc;
        acc >>= 8;
        have = have > 8 ? have - 8 : 0;
    }
    return DT_OK;
}

static void qsgd_decode(const dt_codec_header *h, const uint8_t *p, float *out,
                        dt_decode_mode mode) {
    size_t n = (size_t)h->count, nb = dt__nblocks(n);
    unsigned bits = (unsigned)h->bits;
    uint32_t mask = (1u << bits) - 1u;
    float levels = (float)mask;
    const uint8_t *codes = p + 4 * nb;
    size_t code_bytes = (n * bits + 7) / 8, in = 0;
    uint64_t acc = 0;
    unsigned have = 0;
    for (size_t b = 0; b < nb; b++) {
        size_t lo = b * DT_COMPRESS_BLOCK;
        size_t len = n - lo < DT_COMPRESS_BLOCK ? n - lo : DT_COMPRESS_BLOCK;
        float m = dt__load_f32(p + 4 * b);
        float stepv = 2.0f * m / levels;
        for (size_t i = 0; i < len; i++) {
            if (have < bits) {
                /* Refill 32 bits when they exist, else the tail byte by byte:
                 * never read past code_bytes. */
                if (in + 4 <= code_bytes) {
                    acc |= (uint64_t)dt__load_u32(codes + in) << have;
                    in += 4;
                    have += 32;
                } else {
                    while (have < bits && in < code_bytes) {
                        acc |= (uint64_t)codes[in++] << have;
                        have += 8;
                    }
                }
            }
            float v = (float)(uint32_t)(acc & mask) * stepv - m;
            acc >>= bits;
            have -= bits;
            out[lo + i] = mode == DT_DECODE_ADD ? out[lo + i] + v : v;
        }
    }
}

const dt__codec_ops dt__codec_qsgd = {
    .info = {.name = "qsgd", .stochastic = true},
    .payload_bytes = qsgd_bytes,
    .encode = qsgd_encode,
    .validate = scales_validate,
    .decode = qsgd_decode,
};

/* ------------------------------------------------------------------------ */
/* sign                                                                     */
/* ------------------------------------------------------------------------ */

static bool sign_bytes(const dt_codec_header *h, size_t *out) { return bytes_scaled(h, 1, out); }

static dt_status sign_encode(dt_compressor *c, const float *x, uint64_t step, uint8_t *p) {
    size_t n = c->n, nb = dt__nblocks(n);
    uint8_t *bitsp = p + 4 * nb;
    memset(bitsp, 0, n / 8 + (n % 8 != 0));
    for (size_t b = 0; b < nb; b++) {
        size_t lo = b * DT_COMPRESS_BLOCK;
        size_t len = n - lo < DT_COMPRESS_BLOCK ? n - lo : DT_COMPRESS_BLOCK;
        DT_CHECK(check_block("sign", x + lo, len, b));
        float sum = 0.0f;
        for (size_t i = 0; i < len; i++)
            sum += fabsf(x[lo + i]);
        dt__store_f32(p + 4 * b, sum / (float)len);
        /* Blocks start on byte boundaries (256 is a multiple of 8). */
        for (size_t i = 0; i < len; i++)
            bitsp[(lo + i) >> 3] |= (uint8_t)((x[lo + i] < 0.0f) << ((lo + i) & 7));
    }
    return DT_OK;
}

static void sign_decode(const dt_codec_header *h, const uint8_t *p, float *out,
                        dt_decode_mode mode) {
    size_t n = (size_t)h->count, nb = dt__nblocks(n);
    const uint8_t *bitsp = p + 4 * nb;
    for (size_t b = 0; b < nb; b++) {
        size_t lo = b * DT_COMPRESS_BLOCK;
        size_t len = n - lo < DT_COMPRESS_BLOCK ? n - lo : DT_COMPRESS_BLOCK;
        float s = dt__load_f32(p + 4 * b);
        for (size_t i = 0; i < len; i++) {
            size_t j = lo + i;
            float v = (bitsp[j >> 3] >> (j & 7)) & 1u ? -s : s;
            out[j] = mode == DT_DECODE_ADD ? out[j] + v : v;
        }
    }
}

const dt__codec_ops dt__codec_sign = {
    .info = {.name = "sign", .biased = true, .ef_default = true},
    .payload_bytes = sign_bytes,
    .encode = sign_encode,
    .validate = scales_validate,
    .decode = sign_decode,
};
