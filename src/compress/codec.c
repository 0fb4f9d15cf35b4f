/*
 * codec.c — spec strings, the encoded-buffer header, decode dispatch, and
 * the compressor object with error feedback.
 *
 * Header (32 bytes, little-endian), at the start of every encoded buffer:
 *
 *   offset  size  field
 *   0       4     magic "DTCZ"
 *   4       1     version (1)
 *   5       1     codec (dt_codec_kind)
 *   6       1     bits (qsgd: 1..8, otherwise 0)
 *   7       1     reserved, 0
 *   8       8     count: values represented
 *   16      8     k: topk/randk values sent; powersgd rows; otherwise 0
 *   24      4     rank: powersgd rank used (0 = uncompressed); otherwise 0
 *   28      4     check: low 32 bits of XXH3-64 of bytes 0..27
 *
 * The check makes a damaged header (say fp16 turned into bf16, which has the
 * same payload size) fail instead of decoding into garbage; the payload is
 * not checksummed (the transports are), but no payload byte can steer a
 * write out of bounds.
 *
 * Invariants: every field is checked against the codec's rules, and the
 * buffer length must equal header + payload_bytes(header) exactly (with
 * overflow-checked arithmetic) before any payload byte is read. A buffer
 * that passes has every section in bounds; validate() then checks the
 * contents that could steer a write. Decoding writes nothing until all
 * checks have passed.
 *
 * Error feedback: work = grad + residual; encode(work); residual = work -
 * decode(encoding). Sent plus residual therefore equals the sum of all
 * inputs up to fp32 rounding of that one subtraction (exactly, when the
 * values are small integers or dyadic). top-k and random-k, which send
 * values unchanged, get the same result in place: residual += grad, encode
 * from it, zero what was sent. The block quantisers (int8, qsgd, sign) and
 * the casts fuse the four passes into one, writing the new residual next to
 * the old and swapping the two buffers when the encode has succeeded.
 */
#include "internal.h"

#include "dtrain/trace.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "encoded buffers are little-endian");

#define HDR_MAGIC   0x5A435444u /* "DTCZ" read as a little-endian u32 */
#define HDR_VERSION 1

bool dt__compress_generic_ef = false;

static const dt__codec_ops *const codecs[DT_CODEC_COUNT] = {
    [DT_CODEC_NONE] = &dt__codec_none,         [DT_CODEC_FP16] = &dt__codec_fp16,
    [DT_CODEC_BF16] = &dt__codec_bf16,         [DT_CODEC_INT8] = &dt__codec_int8,
    [DT_CODEC_QSGD] = &dt__codec_qsgd,         [DT_CODEC_SIGN] = &dt__codec_sign,
    [DT_CODEC_TOPK] = &dt__codec_topk,         [DT_CODEC_RANDK] = &dt__codec_randk,
    [DT_CODEC_POWERSGD] = &dt__codec_powersgd,
};
_Static_assert(sizeof codecs / sizeof codecs[0] == DT_CODEC_COUNT, "one ops table per codec");

const dt_codec_info *dt_codec_get_info(dt_codec_kind kind) {
    if ((unsigned)kind >= DT_CODEC_COUNT)
        return NULL;
    return &codecs[kind]->info;
}

void dt__compress_rng(dt_rng *r, uint64_t seed, uint32_t rank, uint64_t step, uint32_t bucket) {
    dt_rng_init(r, seed, dt_rng_stream_id(rank, step, DT_RNG_COMPRESS));
    /* 2^40 outputs per bucket, far more than any bucket draws; bucket ids
     * are below 2^24 (checked at creation), so this fits 64 bits. */
    dt_rng_seek(r, (uint64_t)bucket << 40);
}

dt_status dt__validate_scales(const uint8_t *scales, size_t nblocks, const char *codec) {
    for (size_t b = 0; b < nblocks; b++) {
        float s = dt__load_f32(scales + 4 * b);
        if (!(s >= 0.0f && s <= 3.4028235e38f)) /* also rejects NaN */
            return dt_error_set(DT_ERR_CORRUPT, "%s buffer: scale of block %zu is %g", codec, b,
                                (double)s);
    }
    return DT_OK;
}

/* ------------------------------------------------------------------------ */
/* Spec strings                                                             */
/* ------------------------------------------------------------------------ */

static const char *const spec_syntax =
    "none|fp16|bf16|int8|qsgd:BITS|sign|topk:K|randk:K|powersgd:RANK";

static dt_status parse_k(const char *knob, const char *text, const char *arg, dt_codec_spec *s) {
    if (*arg == '\0')
        return dt_error_set(DT_ERR_INVALID,
                            "%s: \"%s\" needs a fraction in (0, 1] (e.g. 0.01) or a count "
                            "(e.g. 1000) after ':'",
                            knob, text);
    if (!(isdigit((unsigned char)arg[0]) || arg[0] == '.'))
        return dt_error_set(DT_ERR_INVALID,
                            "%s: \"%s\": \"%s\" is neither a fraction in (0, 1] nor a count >= 1",
                            knob, text, arg);
    if (strpbrk(arg, ".eE")) {
        char *end;
        errno = 0;
        double f = strtod(arg, &end);
        if (*end != '\0' || errno != 0 || !(f > 0.0 && f <= 1.0))
            return dt_error_set(DT_ERR_INVALID, "%s: \"%s\": fraction \"%s\" is not in (0, 1]",
                                knob, text, arg);
        s->fraction = f;
        s->count = 0;
        return DT_OK;
    }
    int64_t v;
    dt_status st = dt_config_parse_int(knob, arg, 1, INT64_MAX, &v);
    if (st != DT_OK)
        return dt_error_set(DT_ERR_INVALID,
                            "%s: \"%s\": \"%s\" is neither a fraction in (0, 1] nor a count >= 1",
                            knob, text, arg);
    s->count = (size_t)v;
    s->fraction = 0;
    return DT_OK;
}

dt_status dt_codec_parse(const char *knob, const char *text, dt_codec_spec *out) {
    if (!text)
        return dt_error_set(DT_ERR_INVALID, "%s: no codec given (expected %s)", knob, spec_syntax);
    dt_codec_spec s = {.kind = DT_CODEC_NONE};
    const char *colon = strchr(text, ':');
    size_t name_len = colon ? (size_t)(colon - text) : strlen(text);
    const char *arg = colon ? colon + 1 : NULL;
    int kind = -1;
    for (int i = 0; i < DT_CODEC_COUNT; i++) {
        const char *name = codecs[i]->info.name;
        if (strlen(name) == name_len && strncmp(name, text, name_len) == 0)
            kind = i;
    }
    if (kind < 0)
        return dt_error_set(DT_ERR_INVALID, "%s: unknown codec \"%s\" (expected %s)", knob, text,
                            spec_syntax);
    s.kind = (dt_codec_kind)kind;
    bool wants_arg = s.kind == DT_CODEC_QSGD || s.kind == DT_CODEC_TOPK ||
                     s.kind == DT_CODEC_RANDK || s.kind == DT_CODEC_POWERSGD;
    if (wants_arg && !arg)
        return dt_error_set(DT_ERR_INVALID, "%s: \"%s\" needs a parameter (expected %s)", knob,
                            text, spec_syntax);
    if (!wants_arg && arg)
        return dt_error_set(DT_ERR_INVALID, "%s: \"%s\": codec %s takes no parameter", knob, text,
                            codecs[kind]->info.name);
    int64_t v;
    switch (s.kind) {
    case DT_CODEC_QSGD:
        if (dt_config_parse_int(knob, arg, 1, 8, &v) != DT_OK)
            return dt_error_set(DT_ERR_INVALID, "%s: \"%s\": qsgd bits must be an integer in 1..8",
                                knob, text);
        s.bits = (int)v;
        break;
    case DT_CODEC_TOPK:
    case DT_CODEC_RANDK: DT_CHECK(parse_k(knob, text, arg, &s)); break;
    case DT_CODEC_POWERSGD:
        if (dt_config_parse_int(knob, arg, 1, DT_COMPRESS_MAX_RANK, &v) != DT_OK)
            return dt_error_set(DT_ERR_INVALID,
                                "%s: \"%s\": powersgd rank must be an integer in 1..%d", knob, text,
                                DT_COMPRESS_MAX_RANK);
        s.rank = (int)v;
        break;
    default: break;
    }
    *out = s;
    return DT_OK;
}

char *dt_codec_format(const dt_codec_spec *s, char *buf, size_t len) {
    const dt_codec_info *info = dt_codec_get_info(s->kind);
    const char *name = info ? info->name : "?";
    switch (s->kind) {
    case DT_CODEC_QSGD: snprintf(buf, len, "%s:%d", name, s->bits); break;
    case DT_CODEC_TOPK:
    case DT_CODEC_RANDK:
        if (s->count)
            snprintf(buf, len, "%s:%zu", name, s->count);
        else
            snprintf(buf, len, "%s:%.6g%s", name, s->fraction,
                     s->fraction == floor(s->fraction) ? ".0" : "");
        break;
    case DT_CODEC_POWERSGD: snprintf(buf, len, "%s:%d", name, s->rank); break;
    default: snprintf(buf, len, "%s", name);
    }
    return buf;
}

dt_status dt_ef_parse(const char *knob, const char *text, dt_ef_mode *out) {
    if (text && strcmp(text, "auto") == 0) {
        *out = DT_EF_DEFAULT;
        return DT_OK;
    }
    bool on;
    if (!text || dt_config_parse_bool(knob, text, &on) != DT_OK)
        return dt_error_set(DT_ERR_INVALID,
                            "%s: \"%s\" is not an error-feedback mode (expected auto|on|off)", knob,
                            text ? text : "");
    *out = on ? DT_EF_ON : DT_EF_OFF;
    return DT_OK;
}

dt_status dt_compress_env(dt_codec_spec *spec, dt_ef_mode *ef) {
    const char *v;
    if (spec) {
        v = getenv("DT_COMPRESS");
        DT_CHECK(dt_codec_parse("DT_COMPRESS", v && *v ? v : "none", spec));
    }
    if (ef) {
        v = getenv("DT_COMPRESS_EF");
        DT_CHECK(dt_ef_parse("DT_COMPRESS_EF", v && *v ? v : "auto", ef));
    }
    return DT_OK;
}

size_t dt_codec_k(const dt_codec_spec *s, size_t n) {
    if (n == 0)
        return 0;
    size_t k;
    if (s->count)
        k = s->count;
    else {
        double kk = ceil(s->fraction * (double)n);
        k = kk >= (double)n ? n : (size_t)kk;
    }
    if (k < 1)
        k = 1;
    return k > n ? n : k;
}

static dt_status validate_spec(const dt_codec_spec *s) {
    if ((unsigned)s->kind >= DT_CODEC_COUNT)
        return dt_error_set(DT_ERR_INVALID, "codec kind %d is out of range", (int)s->kind);
    if (s->kind == DT_CODEC_QSGD && (s->bits < 1 || s->bits > 8))
        return dt_error_set(DT_ERR_INVALID, "qsgd bits %d is not in 1..8", s->bits);
    if ((s->kind == DT_CODEC_TOPK || s->kind == DT_CODEC_RANDK) && s->count == 0 &&
        !(s->fraction > 0.0 && s->fraction <= 1.0))
        return dt_error_set(DT_ERR_INVALID, "%s fraction %g is not in (0, 1]",
                            codecs[s->kind]->info.name, s->fraction);
    if (s->kind == DT_CODEC_POWERSGD && (s->rank < 1 || s->rank > DT_COMPRESS_MAX_RANK))
        return dt_error_set(DT_ERR_INVALID, "powersgd rank %d is not in 1..%d", s->rank,
                            DT_COMPRESS_MAX_RANK);
    return DT_OK;
}

/* ------------------------------------------------------------------------ */
/* Header                                                                   */
/* ------------------------------------------------------------------------ */

static void header_write(uint8_t *p, const dt_codec_header *h) {
    uint32_t magic = HDR_MAGIC;
    memcpy(p, &magic, 4);
    p[4] = HDR_VERSION;
    p[5] = (uint8_t)h->kind;
    p[6] = (uint8_t)h->bits;
    p[7] = 0;
    memcpy(p + 8, &h->count, 8);
    memcpy(p + 16, &h->k, 8);
    uint32_t rank = (uint32_t)h->rank, check;
    memcpy(p + 24, &rank, 4);
    check = (uint32_t)dt_hash64(p, 28, 0);
    memcpy(p + 28, &check, 4);
}

/* The rules a header must obey, shared by the reader and create(). */
static dt_status header_check(const dt_codec_header *h) {
    const char *name = codecs[h->kind]->info.name;
    if ((h->kind == DT_CODEC_QSGD) != (h->bits != 0) || h->bits > 8)
        return dt_error_set(DT_ERR_CORRUPT, "%s buffer: bits field %d is invalid", name, h->bits);
    switch (h->kind) {
    case DT_CODEC_TOPK:
    case DT_CODEC_RANDK:
        if (h->count > UINT32_MAX || h->k > h->count || (h->count > 0 && h->k == 0) || h->rank != 0)
            return dt_error_set(DT_ERR_CORRUPT,
                                "%s buffer: k = %" PRIu64 " for count = %" PRIu64 " is invalid",
                                name, h->k, h->count);
        break;
    case DT_CODEC_POWERSGD: {
        uint64_t rows = h->k;
        if (h->count == 0) {
            if (rows != 0 || h->rank != 0)
                return dt_error_set(DT_ERR_CORRUPT, "powersgd buffer: empty tensor with shape");
            break;
        }
        if (rows == 0 || h->count % rows != 0)
            return dt_error_set(DT_ERR_CORRUPT,
                                "powersgd buffer: %" PRIu64 " rows do not divide count %" PRIu64,
                                rows, h->count);
        uint64_t cols = h->count / rows;
        uint64_t mn = rows < cols ? rows : cols;
        if (h->rank >= mn && h->rank != 0)
            return dt_error_set(DT_ERR_CORRUPT,
                                "powersgd buffer: rank %" PRIu64 " for a %" PRIu64 " x %" PRIu64
                                " matrix",
                                h->rank, rows, cols);
        break;
    }
    default:
        if (h->k != 0 || h->rank != 0)
            return dt_error_set(DT_ERR_CORRUPT, "%s buffer: unexpected k/rank fields", name);
    }
    return DT_OK;
}

dt_status dt_codec_peek(const void *buf, size_t len, dt_codec_header *out) {
    const uint8_t *p = buf;
    if (!buf || len < DT_COMPRESS_HEADER_BYTES)
        return dt_error_set(DT_ERR_CORRUPT,
                            "encoded buffer of %zu bytes is shorter than the %d-byte header",
                            buf ? len : 0, DT_COMPRESS_HEADER_BYTES);
    uint32_t magic;
    memcpy(&magic, p, 4);
    if (magic != HDR_MAGIC)
        return dt_error_set(DT_ERR_CORRUPT, "encoded buffer: bad magic 0x%08x", magic);
    if (p[4] != HDR_VERSION)
        return dt_error_set(DT_ERR_CORRUPT, "encoded buffer: version %u, expected %u", p[4],
                            HDR_VERSION);
    uint32_t check;
    memcpy(&check, p + 28, 4);
    if (check != (uint32_t)dt_hash64(p, 28, 0))
        return dt_error_set(DT_ERR_CORRUPT, "encoded buffer: header check 0x%08x does not match",
                            check);
    if (p[5] >= DT_CODEC_COUNT)
        return dt_error_set(DT_ERR_CORRUPT, "encoded buffer: unknown codec %u", p[5]);
    if (p[7] != 0)
        return dt_error_set(DT_ERR_CORRUPT, "encoded buffer: reserved byte is %u", p[7]);
    dt_codec_header h = {.kind = (dt_codec_kind)p[5], .bits = p[6]};
    memcpy(&h.count, p + 8, 8);
    memcpy(&h.k, p + 16, 8);
    uint32_t rank;
    memcpy(&rank, p + 24, 4);
    h.rank = rank;
    DT_CHECK(header_check(&h));
    size_t payload;
    if (h.count > SIZE_MAX / 8 || !codecs[h.kind]->payload_bytes(&h, &payload) ||
        payload > SIZE_MAX - DT_COMPRESS_HEADER_BYTES)
        return dt_error_set(DT_ERR_CORRUPT, "%s buffer: count %" PRIu64 " is too large",
                            codecs[h.kind]->info.name, h.count);
    if (len != DT_COMPRESS_HEADER_BYTES + payload)
        return dt_error_set(DT_ERR_CORRUPT, "%s buffer: %zu bytes, header implies %zu",
                            codecs[h.kind]->info.name, len, DT_COMPRESS_HEADER_BYTES + payload);
    *out = h;
    return DT_OK;
}

dt_status dt_codec_decode(const void *buf, size_t len, size_t n, float *out, dt_decode_mode mode) {
    dt_codec_header h;
    DT_CHECK(dt_codec_peek(buf, len, &h));
    if (h.count != n)
        return dt_error_set(DT_ERR_CORRUPT, "%s buffer holds %" PRIu64 " values, expected %zu",
                            codecs[h.kind]->info.name, h.count, n);
    if (n > 0 && !out)
        return dt_error_set(DT_ERR_INVALID, "dt_codec_decode: out is NULL");
    const uint8_t *payload = (const uint8_t *)buf + DT_COMPRESS_HEADER_BYTES;
    if (codecs[h.kind]->validate)
        DT_CHECK(codecs[h.kind]->validate(&h, payload));
    uint64_t t = dt_trace_begin();
    codecs[h.kind]->decode(&h, payload, out, mode);
    dt_trace_end(t, DT_TRACE_COMPRESS, "decode", -1, 0, len + n * sizeof(float));
    return DT_OK;
}

/* ------------------------------------------------------------------------ */
/* Compressor                                                               */
/* ------------------------------------------------------------------------ */

dt_compressor_config dt_compressor_config_default(void) {
    return (dt_compressor_config){.ef = DT_EF_DEFAULT};
}

void dt_compressor_destroy(dt_compressor *c) {
    if (!c)
        return;
    dt_free(c->residual);
    dt_free(c->work);
    dt_free(c->decoded);
    dt_free(c->keys);
    dt_free(c->P);
    dt_free(c->Q);
    dt_free(c);
}

/* Allocate `count` elements of `size` bytes, or fail with a message. */
static dt_status alloc_array(void *out, size_t count, size_t size, const char *what) {
    size_t bytes;
    if (!dt_mul_size(count, size, &bytes))
        return dt_error_set(DT_ERR_NOMEM, "compressor %s: %zu x %zu bytes overflows", what, count,
                            size);
    void *p = dt_calloc(1, bytes);
    if (!p)
        return dt_error_set(DT_ERR_NOMEM, "compressor %s: cannot allocate %zu bytes", what, bytes);
    memcpy(out, &p, sizeof p);
    return DT_OK;
}

/* The header every encoding of (spec, n, shape) carries: the one place
 * that decides k and PowerSGD's effective rank. Also checks the arguments. */
static dt_status plan_header(const dt_codec_spec *spec, size_t n, size_t rows, size_t cols,
                             size_t min_compress, dt_codec_header *h) {
    DT_CHECK(validate_spec(spec));
    const char *name = codecs[spec->kind]->info.name;
    if (n > SIZE_MAX / 16)
        return dt_error_set(DT_ERR_INVALID, "%s: %zu values is too many", name, n);
    if ((spec->kind == DT_CODEC_TOPK || spec->kind == DT_CODEC_RANDK) && n > UINT32_MAX)
        return dt_error_set(DT_ERR_INVALID,
                            "%s indexes with u32, %zu values is too many (split the bucket)", name,
                            n);
    *h = (dt_codec_header){.kind = spec->kind, .count = n};
    switch (spec->kind) {
    case DT_CODEC_QSGD: h->bits = spec->bits; break;
    case DT_CODEC_TOPK:
    case DT_CODEC_RANDK: h->k = dt_codec_k(spec, n); break;
    case DT_CODEC_POWERSGD: {
        if (rows == 0 && cols == 0) {
            rows = n;
            cols = n ? 1 : 0;
        }
        size_t prod;
        if (!dt_mul_size(rows, cols, &prod) || prod != n || (n > 0 && (rows == 0 || cols == 0)))
            return dt_error_set(DT_ERR_INVALID,
                                "powersgd: shape %zu x %zu does not hold %zu values", rows, cols,
                                n);
        size_t r = dt__powersgd_rank_for(rows, cols, (size_t)spec->rank, min_compress);
        h->k = n ? rows : 0;
        h->rank = r;
        break;
    }
    default: break;
    }
    DT_ASSERT(header_check(h) == DT_OK);
    return DT_OK;
}

dt_status dt_codec_encoded_bytes(const dt_codec_spec *spec, size_t n, size_t rows, size_t cols,
                                 size_t min_compress, size_t *out) {
    dt_codec_header h;
    DT_CHECK(plan_header(spec, n, rows, cols, min_compress, &h));
    size_t payload;
    DT_ASSERT(codecs[h.kind]->payload_bytes(&h, &payload));
    *out = DT_COMPRESS_HEADER_BYTES + payload;
    return DT_OK;
}

/* The buffers a compressor of n values holds, in values of 4 bytes:
 * residual, decode buffer, work buffer, top-k's keys, PowerSGD's P and Q
 * (0: none). dt_compressor_create allocates exactly these;
 * dt_compressor_plan_bytes adds them up. */
enum { BUF_RESIDUAL, BUF_DECODED, BUF_WORK, BUF_KEYS, BUF_P, BUF_Q, BUF_COUNT };
static void buffers_of(const dt_codec_spec *spec, const dt_codec_header *hdr, size_t n, bool ef,
                       size_t out[BUF_COUNT]) {
    const dt__codec_ops *ops = codecs[spec->kind];
    bool generic_ef = ef && !ops->ef_sent, psgd = spec->kind == DT_CODEC_POWERSGD;
    size_t rows = psgd && hdr->k ? (size_t)hdr->k : 0, cols = rows ? n / rows : 0,
           r = psgd ? (size_t)hdr->rank : 0;
    out[BUF_RESIDUAL] = ef ? n : 0;
    out[BUF_DECODED] = generic_ef ? n : 0;
    out[BUF_WORK] = generic_ef || psgd ? n : 0;
    out[BUF_KEYS] = spec->kind == DT_CODEC_TOPK ? n : 0;
    out[BUF_P] = psgd ? (r ? rows * r : n) : 0;
    out[BUF_Q] = psgd ? cols * r : 0;
}

static bool ef_of(const dt_codec_spec *spec, dt_ef_mode ef) {
    return ef == DT_EF_ON || (ef == DT_EF_DEFAULT && codecs[spec->kind]->info.ef_default);
}

dt_status dt_compressor_plan_bytes(const dt_codec_spec *spec, size_t n,
                                   const dt_compressor_config *cfg_in, size_t *out) {
    dt_compressor_config cfg = cfg_in ? *cfg_in : dt_compressor_config_default();
    dt_codec_header hdr;
    DT_CHECK(plan_header(spec, n, cfg.rows, cfg.cols, cfg.min_compress, &hdr));
    size_t b[BUF_COUNT], sum = 0;
    buffers_of(spec, &hdr, n, ef_of(spec, cfg.ef), b);
    for (int k = 0; k < BUF_COUNT; k++)
        sum += b[k] * sizeof(float);
    *out = sum;
    return DT_OK;
}

dt_status dt_compressor_create(dt_compressor **out, const dt_codec_spec *spec, size_t n,
                               const dt_compressor_config *cfg_in) {
    dt_compressor_config cfg = cfg_in ? *cfg_in : dt_compressor_config_default();
    if (cfg.rank >= (1u << 20))
        return dt_error_set(DT_ERR_INVALID, "compressor: rank %u is not below 2^20", cfg.rank);
    if (cfg.bucket >= (1u << 24)) /* bucket << 40 must fit a 64-bit stream position */
        return dt_error_set(DT_ERR_INVALID, "compressor: bucket id %u is not below 2^24",
                            cfg.bucket);
    dt_codec_header hdr;
    DT_CHECK(plan_header(spec, n, cfg.rows, cfg.cols, cfg.min_compress, &hdr));
    const dt__codec_ops *ops = codecs[spec->kind];
    dt_status st = DT_OK;
    dt_compressor *c = dt_calloc(1, sizeof *c);
    if (!c)
        return dt_error_set(DT_ERR_NOMEM, "compressor: out of memory");
    c->spec = *spec;
    c->ops = ops;
    c->n = n;
    c->cfg = cfg;
    c->ef = ef_of(spec, cfg.ef);
    c->hdr = hdr;
    if (spec->kind == DT_CODEC_POWERSGD) {
        c->rows = hdr.k ? (size_t)hdr.k : 0;
        c->cols = hdr.k ? n / (size_t)hdr.k : 0;
        c->prank = (int)hdr.rank;
    }
    size_t payload;
    DT_ASSERT(ops->payload_bytes(&c->hdr, &payload));
    c->encoded_bytes = DT_COMPRESS_HEADER_BYTES + payload;

    size_t b[BUF_COUNT];
    buffers_of(spec, &hdr, n, c->ef, b);
    if (b[BUF_RESIDUAL])
        DT_CHECK_GOTO(alloc_array(&c->residual, b[BUF_RESIDUAL], sizeof(float), "residual"), st,
                      fail);
    if (b[BUF_DECODED])
        DT_CHECK_GOTO(alloc_array(&c->decoded, b[BUF_DECODED], sizeof(float), "decode buffer"), st,
                      fail);
    if (b[BUF_WORK])
        DT_CHECK_GOTO(alloc_array(&c->work, b[BUF_WORK], sizeof(float), "work buffer"), st, fail);
    if (b[BUF_KEYS])
        DT_CHECK_GOTO(alloc_array(&c->keys, b[BUF_KEYS], sizeof(uint32_t), "selection keys"), st,
                      fail);
    if (spec->kind == DT_CODEC_POWERSGD) {
        DT_CHECK_GOTO(alloc_array(&c->P, b[BUF_P], sizeof(float), "powersgd P"), st, fail);
        DT_CHECK_GOTO(alloc_array(&c->Q, b[BUF_Q], sizeof(float), "powersgd Q"), st, fail);
    }
    *out = c;
    return DT_OK;
fail:
    dt_compressor_destroy(c);
    return st;
}

size_t dt_compressor_encoded_bytes(const dt_compressor *c) { return c->encoded_bytes; }

dt_status dt_compressor_set_k(dt_compressor *c, size_t k) {
    if (c->spec.kind != DT_CODEC_TOPK)
        return dt_error_set(DT_ERR_INVALID, "%s: k can be set for topk only", c->ops->info.name);
    if (k < 1 || k > c->n)
        return dt_error_set(DT_ERR_INVALID, "topk: k = %zu is not in [1, %zu]", k, c->n);
    c->hdr.k = k;
    size_t payload;
    DT_ASSERT(c->ops->payload_bytes(&c->hdr, &payload));
    c->encoded_bytes = DT_COMPRESS_HEADER_BYTES + payload;
    return DT_OK;
}
size_t dt_compressor_count(const dt_compressor *c) { return c->n; }
bool dt_compressor_error_feedback(const dt_compressor *c) { return c->ef; }

static dt_status compress(dt_compressor *c, const float *grad, uint64_t step, void *out, size_t cap,
                          size_t *used) {
    if (!out || !used || (c->n > 0 && !grad))
        return dt_error_set(DT_ERR_INVALID, "%s encode: NULL gradient, buffer or size",
                            c->ops->info.name);
    if (cap < c->encoded_bytes)
        return dt_error_set(DT_ERR_INVALID, "%s encode: buffer of %zu bytes, need %zu",
                            c->ops->info.name, cap, c->encoded_bytes);
    if (step >= (1ull << 36))
        return dt_error_set(DT_ERR_INVALID, "%s encode: step %" PRIu64 " is not below 2^36",
                            c->ops->info.name, step);
    if (c->stage != 0)
        return dt_error_set(DT_ERR_INVALID, "%s encode: a staged PowerSGD step is in progress",
                            c->ops->info.name);
    /* Locals with restrict: the build uses -fno-strict-aliasing, so through
     * c-> every float store could alias c's own fields and no loop here
     * would vectorise. */
    const size_t n = c->n;
    float *restrict work = c->work, *restrict res = c->residual, *restrict dec = c->decoded;
    uint8_t *p = out;
    header_write(p, &c->hdr);
    if (c->ef && c->ops->ef_sent) {
        /* Sparse codecs send values unchanged: the residual itself is the
         * work buffer, and what was sent is zeroed afterwards. The encode
         * cannot fail, so the residual is never left half updated. */
        for (size_t i = 0; i < n; i++)
            res[i] += grad[i];
        DT_CHECK(c->ops->encode(c, res, step, p + DT_COMPRESS_HEADER_BYTES));
        c->ops->ef_sent(&c->hdr, p + DT_COMPRESS_HEADER_BYTES, res);
        *used = c->encoded_bytes;
        return DT_OK;
    }
    if (c->ef && c->ops->encode_ef && !dt__compress_generic_ef) {
        /* Fused: the new residual goes to the work buffer, which becomes
         * the residual only once the encode has succeeded. */
        DT_CHECK(c->ops->encode_ef(c, grad, res, work, step, p + DT_COMPRESS_HEADER_BYTES));
        c->work = res;
        c->residual = work;
        *used = c->encoded_bytes;
        return DT_OK;
    }
    const float *x = grad;
    if (c->ef) {
        for (size_t i = 0; i < n; i++)
            work[i] = grad[i] + res[i];
        x = work;
    }
    DT_CHECK(c->ops->encode(c, x, step, p + DT_COMPRESS_HEADER_BYTES));
    if (c->ef) {
        c->ops->decode(&c->hdr, p + DT_COMPRESS_HEADER_BYTES, dec, DT_DECODE_SET);
        for (size_t i = 0; i < n; i++)
            res[i] = work[i] - dec[i];
    }
    *used = c->encoded_bytes;
    return DT_OK;
}

dt_status dt_compressor_compress(dt_compressor *c, const float *grad, uint64_t step, void *out,
                                 size_t cap, size_t *used) {
    uint64_t t = dt_trace_begin();
    dt_status st = compress(c, grad, step, out, cap, used);
    dt_trace_end(t, DT_TRACE_COMPRESS, "encode", -1, 0, c->n * sizeof(float) + c->encoded_bytes);
    return st;
}

size_t dt_compressor_residual_bytes(const dt_compressor *c) {
    return c->ef ? c->n * sizeof(float) : 0;
}

const float *dt_compressor_residual(const dt_compressor *c) { return c->residual; }

dt_status dt_compressor_get_residual(const dt_compressor *c, void *buf, size_t len) {
    size_t need = dt_compressor_residual_bytes(c);
    if (len < need)
        return dt_error_set(DT_ERR_INVALID, "residual: buffer of %zu bytes, need %zu", len, need);
    if (need)
        memcpy(buf, c->residual, need);
    return DT_OK;
}

dt_status dt_compressor_set_residual(dt_compressor *c, const void *buf, size_t len) {
    size_t need = dt_compressor_residual_bytes(c);
    if (len != need)
        return dt_error_set(
            DT_ERR_INVALID, "residual: %zu bytes given, this %s compressor of %zu values %s %zu",
            len, c->ops->info.name, c->n,
            c->ef ? "with error feedback needs" : "without error feedback has", need);
    /* A residual holds no value encode could not produce from finite
     * gradients; refusing NaN/inf here keeps a bad checkpoint from
     * poisoning every later step. */
    for (size_t i = 0; i < need / 4; i++) {
        float v = dt__load_f32((const uint8_t *)buf + 4 * i);
        if (!isfinite(v))
            return dt_error_set(DT_ERR_CORRUPT, "residual: value %zu is %g", i, (double)v);
    }
    if (need)
        memcpy(c->residual, buf, need);
    return DT_OK;
}

static size_t q_floats(const dt_compressor *c) { return c->cols * (size_t)c->prank; }

size_t dt_compressor_state_bytes(const dt_compressor *c) {
    return dt_compressor_residual_bytes(c) + q_floats(c) * sizeof(float);
}

dt_status dt_compressor_get_state(const dt_compressor *c, void *buf, size_t len) {
    size_t need = dt_compressor_state_bytes(c), rb = dt_compressor_residual_bytes(c);
    if (len < need)
        return dt_error_set(DT_ERR_INVALID, "compressor state: buffer of %zu bytes, need %zu", len,
                            need);
    if (rb)
        memcpy(buf, c->residual, rb);
    if (q_floats(c))
        memcpy((uint8_t *)buf + rb, c->Q, q_floats(c) * sizeof(float));
    return DT_OK;
}

dt_status dt_compressor_set_state(dt_compressor *c, const void *buf, size_t len) {
    size_t need = dt_compressor_state_bytes(c), rb = dt_compressor_residual_bytes(c);
    if (len != need)
        return dt_error_set(DT_ERR_INVALID,
                            "compressor state: %zu bytes given, this %s compressor of %zu values "
                            "has %zu",
                            len, c->ops->info.name, c->n, need);
    if (c->stage != 0)
        return dt_error_set(DT_ERR_INVALID,
                            "compressor state: cannot restore during a staged PowerSGD step");
    for (size_t i = 0; i < need / 4; i++) {
        float v = dt__load_f32((const uint8_t *)buf + 4 * i);
        if (!isfinite(v))
            return dt_error_set(DT_ERR_CORRUPT, "compressor state: value %zu is %g", i, (double)v);
    }
    if (rb)
        memcpy(c->residual, buf, rb);
    if (q_floats(c))
        memcpy(c->Q, (const uint8_t *)buf + rb, q_floats(c) * sizeof(float));
    return DT_OK;
}

void dt_compressor_reset(dt_compressor *c) {
    if (c->residual)
        memset(c->residual, 0, c->n * sizeof(float));
    if (q_floats(c))
        memset(c->Q, 0, q_floats(c) * sizeof(float)); /* zero columns are redrawn */
    c->stage = 0;
}
