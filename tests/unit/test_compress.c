/*
 * test_compress.c — codecs and error feedback (src/compress).
 *
 * Each codec is checked against a bound derived from its definition, not
 * against its own output: fp16 rounds to 11 significant bits (relative
 * error <= 2^-11), bf16 to 8 (2^-8), int8 to half a step of absmax/127 per
 * block, QSGD to less than one step 2m/(2^b - 1) and unbiased in the mean;
 * top-k is compared with a full sort, PowerSGD with matrices whose rank or
 * spectrum is known by construction. Error feedback is checked for
 * conservation of mass on integer data, where fp32 is exact. Corrupt
 * buffers (truncations, extensions, random byte flips, forged headers with
 * a valid check) must be rejected or decode within bounds; run under ASan
 * to make the second half meaningful. PyTorch is the independent reference
 * for the casts and PowerSGD (tests/data/compress_ref.bin). The codec tests
 * run twice: with the SIMD paths, then with the scalar fallbacks forced.
 */
#include "compress/internal.h"
#include "dtrain/compress.h"
#include "test.h"

#include <float.h>

static dt_codec_spec spec_of(const char *text) {
    dt_codec_spec s;
    ASSERT_OK(dt_codec_parse("--compress", text, &s));
    return s;
}

static float *falloc(size_t n) {
    float *p = dt_alloc(n * sizeof(float) + 1);
    ASSERT_TRUE(p != NULL);
    return p;
}

/* Integer-valued data in [-range, range]. */
static void fill_int(float *x, size_t n, int range, uint64_t seed) {
    dt_rng r;
    dt_rng_init(&r, seed, dt_rng_stream_id(0, 0, DT_RNG_TEST));
    for (size_t i = 0; i < n; i++)
        x[i] = (float)((int)dt_rng_below(&r, (uint32_t)(2 * range + 1)) - range);
}

static void fill_normal(float *x, size_t n, float scale, uint64_t seed) {
    dt_rng r;
    dt_rng_init(&r, seed, dt_rng_stream_id(0, 1, DT_RNG_TEST));
    for (size_t i = 0; i < n; i++)
        x[i] = scale * dt_rng_normal(&r);
}

/* Encode x with a fresh compressor (error feedback as given) and decode. */
static size_t roundtrip(const char *spec_text, const float *x, size_t n, float *out, dt_ef_mode ef,
                        uint64_t step) {
    dt_codec_spec spec = spec_of(spec_text);
    dt_compressor_config cfg = dt_compressor_config_default();
    cfg.seed = 7;
    cfg.ef = ef;
    dt_compressor *c;
    ASSERT_OK(dt_compressor_create(&c, &spec, n, &cfg));
    size_t cap = dt_compressor_encoded_bytes(c), used = 0;
    uint8_t *buf = dt_alloc(cap);
    ASSERT_OK(dt_compressor_compress(c, x, step, buf, cap, &used));
    ASSERT_EQ(used, cap);
    ASSERT_OK(dt_codec_decode(buf, used, n, out, DT_DECODE_SET));
    dt_free(buf);
    dt_compressor_destroy(c);
    return used;
}

/* ------------------------------------------------------------------------ */

static void test_parse(void) {
    char buf[64];
    static const char *const good[] = {"none",      "fp16",      "bf16",       "int8",
                                       "qsgd:1",    "qsgd:8",    "sign",       "topk:0.01",
                                       "topk:1000", "randk:0.5", "powersgd:4", "topk:1.0"};
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        dt_codec_spec s = spec_of(good[i]);
        ASSERT_STREQ(dt_codec_format(&s, buf, sizeof buf), good[i]);
    }
    dt_codec_spec s = spec_of("topk:1e-3");
    ASSERT_NEAR(s.fraction, 1e-3, 0, 1e-12);
    ASSERT_EQ(s.count, 0);
    s = spec_of("topk:7");
    ASSERT_EQ(s.count, 7);
    static const char *const bad[] = {
        "",           "zip",        "qsgd",     "qsgd:0",    "qsgd:9",    "topk",
        "topk:0.0",   "topk:1.5",   "topk:0",   "topk:-3",   "topk:abc",  "fp16:2",
        "powersgd:0", "powersgd:x", "randk:",   "sign:1",    "topk: 0.1", "topk:+0.1",
        "topk:nan",   "topk:1e0x",  "TOPK:0.1", "topk:0.1:2"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ASSERT_STATUS(dt_codec_parse("--compress", bad[i], &s), DT_ERR_INVALID);
        ASSERT_CONTAINS(dt_last_error(), "--compress");
    }
    ASSERT_STATUS(dt_codec_parse("DT_COMPRESS", "qsgd:12", &s), DT_ERR_INVALID);
    ASSERT_CONTAINS(dt_last_error(), "1..8");
    ASSERT_STATUS(dt_codec_parse("DT_COMPRESS", "zip", &s), DT_ERR_INVALID);
    ASSERT_CONTAINS(dt_last_error(), "\"zip\"");
    /* k from a fraction rounds up and stays in [1, n]. */
    s = spec_of("topk:0.01");
    ASSERT_EQ(dt_codec_k(&s, 1000), 10);
    ASSERT_EQ(dt_codec_k(&s, 1001), 11);
    ASSERT_EQ(dt_codec_k(&s, 5), 1);
    ASSERT_EQ(dt_codec_k(&s, 0), 0);
    s = spec_of("topk:1000");
    ASSERT_EQ(dt_codec_k(&s, 10), 10);
}

static void test_env_knobs(void) {
    dt_codec_spec s;
    dt_ef_mode ef;
    unsetenv("DT_COMPRESS");
    unsetenv("DT_COMPRESS_EF");
    ASSERT_OK(dt_compress_env(&s, &ef));
    ASSERT_EQ(s.kind, DT_CODEC_NONE);
    ASSERT_EQ(ef, DT_EF_DEFAULT);
    setenv("DT_COMPRESS", "powersgd:4", 1);
    setenv("DT_COMPRESS_EF", "off", 1);
    ASSERT_OK(dt_compress_env(&s, &ef));
    ASSERT_EQ(s.kind, DT_CODEC_POWERSGD);
    ASSERT_EQ(s.rank, 4);
    ASSERT_EQ(ef, DT_EF_OFF);
    setenv("DT_COMPRESS_EF", "sometimes", 1);
    ASSERT_STATUS(dt_compress_env(NULL, &ef), DT_ERR_INVALID);
    ASSERT_CONTAINS(dt_last_error(), "DT_COMPRESS_EF: \"sometimes\"");
    setenv("DT_COMPRESS", "topk:2.0", 1);
    ASSERT_STATUS(dt_compress_env(&s, NULL), DT_ERR_INVALID);
    ASSERT_CONTAINS(dt_last_error(), "DT_COMPRESS");
    ASSERT_OK(dt_ef_parse("--compress-ef", "on", &ef));
    ASSERT_EQ(ef, DT_EF_ON);
    ASSERT_OK(dt_ef_parse("--compress-ef", "auto", &ef));
    ASSERT_EQ(ef, DT_EF_DEFAULT);
    unsetenv("DT_COMPRESS");
    unsetenv("DT_COMPRESS_EF");
}

static void test_info(void) {
    ASSERT_TRUE(dt_codec_get_info(DT_CODEC_SIGN)->ef_default);
    ASSERT_TRUE(dt_codec_get_info(DT_CODEC_TOPK)->ef_default);
    ASSERT_TRUE(dt_codec_get_info(DT_CODEC_POWERSGD)->ef_default);
    ASSERT_TRUE(!dt_codec_get_info(DT_CODEC_INT8)->ef_default);
    ASSERT_TRUE(!dt_codec_get_info(DT_CODEC_QSGD)->biased);
    ASSERT_TRUE(dt_codec_get_info(DT_CODEC_FP16)->linear);
    ASSERT_TRUE(dt_codec_get_info(DT_CODEC_COUNT) == NULL);
}

/* Exact byte accounting, from the layouts in docs/compress.md. */
static void test_sizes(void) {
    const size_t n = 1000, H = DT_COMPRESS_HEADER_BYTES, nb = 4;
    struct {
        const char *spec;
        size_t bytes;
    } cases[] = {
        {"none", H + 4 * n},        {"fp16", H + 2 * n},          {"bf16", H + 2 * n},
        {"int8", H + 4 * nb + n},   {"qsgd:3", H + 4 * nb + 375}, {"qsgd:8", H + 4 * nb + n},
        {"sign", H + 4 * nb + 125}, {"topk:0.01", H + 8 * 10},    {"randk:25", H + 24 + 4 * 25},
    };
    float *x = falloc(n), *y = falloc(n);
    fill_normal(x, n, 1.0f, 1);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        size_t used = roundtrip(cases[i].spec, x, n, y, DT_EF_DEFAULT, 0), planned = 0;
        if (used != cases[i].bytes)
            TEST_FAILF("%s: %zu bytes, expected %zu", cases[i].spec, used, cases[i].bytes);
        dt_codec_spec sp = spec_of(cases[i].spec);
        ASSERT_OK(dt_codec_encoded_bytes(&sp, n, 0, 0, 0, &planned));
        ASSERT_EQ(planned, used);
    }
    /* PowerSGD: 40 x 25 at rank 2 sends 2 * (40 + 25) floats. */
    dt_codec_spec spec = spec_of("powersgd:2");
    dt_compressor_config cfg = dt_compressor_config_default();
    cfg.rows = 40;
    cfg.cols = 25;
    dt_compressor *c;
    ASSERT_OK(dt_compressor_create(&c, &spec, n, &cfg));
    ASSERT_EQ(dt_compressor_encoded_bytes(c), H + 4 * 2 * 65);
    ASSERT_EQ(dt_powersgd_rank(c), 2);
    size_t planned = 0;
    ASSERT_OK(dt_codec_encoded_bytes(&spec, n, 40, 25, 0, &planned));
    ASSERT_EQ(planned, H + 4 * 2 * 65);
    ASSERT_OK(dt_codec_encoded_bytes(&spec, n, 40, 25, 1001, &planned)); /* below min_compress */
    ASSERT_EQ(planned, H + 4 * n);
    /* Compressed only when P and Q take at most half the tensor: 16 x 16 at
     * rank 4 sends 4 * (16 + 16) = 128 of 256 floats; rank 5 would send 160. */
    dt_codec_spec r4 = spec_of("powersgd:4"), r5 = spec_of("powersgd:5");
    ASSERT_OK(dt_codec_encoded_bytes(&r4, 256, 16, 16, 0, &planned));
    ASSERT_EQ(planned, H + 4 * 4 * 32);
    ASSERT_OK(dt_codec_encoded_bytes(&r5, 256, 16, 16, 0, &planned));
    ASSERT_EQ(planned, H + 4 * 256);
    dt_compressor_destroy(c);
    /* ... and a shape where low rank would not be smaller goes as fp32. */
    cfg.rows = 4;
    cfg.cols = 250;
    spec = spec_of("powersgd:4");
    ASSERT_OK(dt_compressor_create(&c, &spec, n, &cfg));
    ASSERT_EQ(dt_powersgd_rank(c), 0);
    ASSERT_EQ(dt_compressor_encoded_bytes(c), H + 4 * n);
    dt_compressor_destroy(c);
    cfg.rows = 40;
    cfg.cols = 25;
    cfg.bucket = 1u << 24;
    ASSERT_STATUS(dt_compressor_create(&c, &spec, n, &cfg), DT_ERR_INVALID);
    ASSERT_CONTAINS(dt_last_error(), "bucket id");
    cfg.bucket = 0;
    cfg.rows = 3;
    cfg.cols = 250;
    ASSERT_STATUS(dt_compressor_create(&c, &spec, n, &cfg), DT_ERR_INVALID);
    ASSERT_CONTAINS(dt_last_error(), "3 x 250");
    ASSERT_STATUS(dt_codec_encoded_bytes(&spec, n, 3, 250, 0, &planned), DT_ERR_INVALID);
    dt_free(x);
    dt_free(y);
}

static void test_empty_and_tiny(void) {
    static const char *const specs[] = {"none", "fp16",      "bf16",      "int8",      "qsgd:4",
                                        "sign", "topk:0.01", "randk:0.1", "powersgd:2"};
    float x[3] = {1.5f, -2.0f, 0.25f}, y[3];
    for (size_t i = 0; i < sizeof specs / sizeof specs[0]; i++) {
        roundtrip(specs[i], x, 0, y, DT_EF_DEFAULT, 0);
        roundtrip(specs[i], x, 1, y, DT_EF_DEFAULT, 0);
        roundtrip(specs[i], x, 3, y, DT_EF_DEFAULT, 0);
    }
    /* top-k of 3 at 0.01 keeps one value: the largest. */
    roundtrip("topk:0.01", x, 3, y, DT_EF_DEFAULT, 0);
    ASSERT_EQ(y[0], 0);
    ASSERT_EQ(y[1], -2);
    ASSERT_EQ(y[2], 0);
}

/* ------------------------------------------------------------------------ */
/* Casts                                                                    */
/* ------------------------------------------------------------------------ */

static float u2f(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static void test_fp16_simd_matches_scalar(void) {
    /* Encode: random bit patterns plus every rounding neighbourhood. */
    const size_t n = 1 << 16;
    float *x = falloc(n);
    uint8_t *a = dt_alloc(2 * n + 2), *b = dt_alloc(2 * n + 2);
    dt_rng r;
    dt_rng_init(&r, 3, dt_rng_stream_id(0, 2, DT_RNG_TEST));
    for (size_t i = 0; i < n; i++) {
        uint32_t u = dt_rng_u32(&r);
        if (i % 4 == 1) /* exponents near fp16's range: subnormal to overflow */
            u = (u & 0x807fffffu) | ((uint32_t)(100 + dt_rng_below(&r, 45)) << 23);
        if (i % 4 == 2) /* exact ties: the 13 dropped bits are 1000000000000 */
            u = (u & 0xffffe000u) | 0x1000u;
        x[i] = u2f(u);
    }
    x[0] = 65504.0f;
    x[1] = 65519.99f;
    x[2] = 65520.0f;
    x[3] = 0x1p-25f;
    x[4] = 0x1p-24f * 1.5f;
    x[5] = u2f(0x7f800001u);
    /* odd length: the SIMD loop leaves a scalar tail */
    dt__f32_to_f16(a, x, n - 3, true);
    dt__f32_to_f16(b, x, n - 3, false);
    for (size_t i = 0; i < n - 3; i++) {
        uint16_t ha, hb;
        memcpy(&ha, a + 2 * i, 2);
        memcpy(&hb, b + 2 * i, 2);
        bool nan_a = (ha & 0x7c00) == 0x7c00 && (ha & 0x3ff),
             nan_b = (hb & 0x7c00) == 0x7c00 && (hb & 0x3ff);
        if (nan_a || nan_b) {
            ASSERT_TRUE(nan_a && nan_b);
            continue;
        }
        if (ha != hb)
            TEST_FAILF("fp16(%a): simd 0x%04x, scalar 0x%04x", (double)x[i], ha, hb);
    }
    /* bf16: the same patterns (NaN payloads included) through both paths. */
    dt__compress_scalar_only = true;
    dt__f32_to_bf16(b, x, n - 3);
    dt__compress_scalar_only = false;
    dt__f32_to_bf16(a, x, n - 3);
    for (size_t i = 0; i < n - 3; i++)
        if (memcmp(a + 2 * i, b + 2 * i, 2) != 0)
            TEST_FAILF("bf16(%a): simd and scalar differ", (double)x[i]);
    /* Decode: every half value, both modes. */
    float *fa = falloc(n), *fb = falloc(n);
    for (size_t i = 0; i < n; i++) {
        uint16_t h = (uint16_t)i;
        memcpy(a + 2 * i, &h, 2);
    }
    dt__f16_to_f32(fa, a, n, true, DT_DECODE_SET);
    dt__f16_to_f32(fb, a, n, false, DT_DECODE_SET);
    for (size_t i = 0; i < n; i++) {
        if (isnan(fa[i]) || isnan(fb[i])) {
            ASSERT_TRUE(isnan(fa[i]) && isnan(fb[i]));
            continue;
        }
        if (memcmp(&fa[i], &fb[i], 4) != 0)
            TEST_FAILF("half 0x%04zx: simd %a, scalar %a", i, (double)fa[i], (double)fb[i]);
    }
    dt_free(x);
    dt_free(a);
    dt_free(b);
    dt_free(fa);
    dt_free(fb);
}

static void test_fp16_bound(void) {
    const size_t n = 100000;
    float *x = falloc(n), *y = falloc(n);
    dt_rng r;
    dt_rng_init(&r, 4, dt_rng_stream_id(0, 3, DT_RNG_TEST));
    for (size_t i = 0; i < n; i++) /* log-uniform over fp16's range, both signs */
        x[i] = (dt_rng_u32(&r) & 1 ? -1.0f : 1.0f) * exp2f(-26.0f + 41.9f * dt_rng_uniform(&r));
    roundtrip("fp16", x, n, y, DT_EF_OFF, 0);
    for (size_t i = 0; i < n; i++) {
        double ax = fabs((double)x[i]), err = fabs((double)x[i] - y[i]);
        double bound = ax >= 0x1p-14 ? ldexp(ax, -11) : 0x1p-25;
        if (err > bound)
            TEST_FAILF("fp16 %a -> %a: error %g > %g", (double)x[i], (double)y[i], err, bound);
    }
    /* Ties go to even; overflow to inf; specials survive. */
    float t[] = {1.0f + 0x1p-11f, 1.0f + 3 * 0x1p-11f, 65520.0f, -INFINITY, NAN, -0.0f};
    float e[] = {1.0f, 1.0f + 0x1p-9f, INFINITY, -INFINITY, NAN, -0.0f};
    float o[6];
    roundtrip("fp16", t, 6, o, DT_EF_OFF, 0);
    for (int i = 0; i < 6; i++) {
        if (isnan(e[i]))
            ASSERT_TRUE(isnan(o[i]));
        else
            ASSERT_TRUE(memcmp(&o[i], &e[i], 4) == 0);
    }
    dt_free(x);
    dt_free(y);
}

static void test_bf16_bound(void) {
    const size_t n = 100000;
    float *x = falloc(n), *y = falloc(n);
    dt_rng r;
    dt_rng_init(&r, 5, dt_rng_stream_id(0, 4, DT_RNG_TEST));
    for (size_t i = 0; i < n; i++)
        x[i] = (dt_rng_u32(&r) & 1 ? -1.0f : 1.0f) * exp2f(-120.0f + 240.0f * dt_rng_uniform(&r));
    roundtrip("bf16", x, n, y, DT_EF_OFF, 0);
    for (size_t i = 0; i < n; i++) {
        double err = fabs((double)x[i] - y[i]), bound = ldexp(fabs((double)x[i]), -8);
        if (err > bound)
            TEST_FAILF("bf16 %a -> %a: error %g > %g", (double)x[i], (double)y[i], err, bound);
    }
    float t[] = {1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f, FLT_MAX, -INFINITY, NAN, 0x1p-130f};
    float e[] = {1.0f, 1.0f + 0x1p-6f, INFINITY, -INFINITY, NAN, 0x1p-130f};
    float o[6];
    roundtrip("bf16", t, 6, o, DT_EF_OFF, 0);
    for (int i = 0; i < 6; i++) {
        if (isnan(e[i]))
            ASSERT_TRUE(isnan(o[i]));
        else if (memcmp(&o[i], &e[i], 4) != 0)
            TEST_FAILF("bf16(%a) = %a, expected %a", (double)t[i], (double)o[i], (double)e[i]);
    }
    dt_free(x);
    dt_free(y);
}

/* ------------------------------------------------------------------------ */
/* Quantisers                                                               */
/* ------------------------------------------------------------------------ */

static float absmax_block(const float *x, size_t n, size_t b) {
    float m = 0;
    for (size_t i = b * DT_COMPRESS_BLOCK; i < n && i < (b + 1) * DT_COMPRESS_BLOCK; i++)
        m = fmaxf(m, fabsf(x[i]));
    return m;
}

static void test_int8_bound(void) {
    const size_t n = 1000; /* 3 full blocks and a short one */
    float *x = falloc(n), *y = falloc(n);
    fill_normal(x, n, 3.0f, 6);
    for (size_t i = 256; i < 512; i++) /* one block of very different scale */
        x[i] *= 1e-4f;
    x[700] = 0;
    roundtrip("int8", x, n, y, DT_EF_OFF, 0);
    for (size_t i = 0; i < n; i++) {
        double step = absmax_block(x, n, i / DT_COMPRESS_BLOCK) / 127.0;
        double bound = step / 2 * (1 + 1e-5);
        if (fabs((double)x[i] - y[i]) > bound)
            TEST_FAILF("int8 x[%zu] = %g -> %g: error > %g", i, (double)x[i], (double)y[i], bound);
    }
    ASSERT_EQ(y[700], 0);
    /* An all-zero block decodes to zeros; a NaN is refused at encode. */
    memset(x, 0, n * sizeof(float));
    roundtrip("int8", x, n, y, DT_EF_OFF, 0);
    for (size_t i = 0; i < n; i++)
        ASSERT_EQ(y[i], 0);
    x[300] = NAN;
    dt_codec_spec spec = spec_of("int8");
    dt_compressor *c;
    ASSERT_OK(dt_compressor_create(&c, &spec, n, NULL));
    uint8_t *buf = dt_alloc(dt_compressor_encoded_bytes(c));
    size_t used;
    ASSERT_STATUS(dt_compressor_compress(c, NULL, 0, buf, dt_compressor_encoded_bytes(c), &used),
                  DT_ERR_INVALID);
    ASSERT_STATUS(dt_compressor_compress(c, x, 0, buf, dt_compressor_encoded_bytes(c) - 1, &used),
                  DT_ERR_INVALID);
    ASSERT_STATUS(
        dt_compressor_compress(c, x, 1ull << 36, buf, dt_compressor_encoded_bytes(c), &used),
        DT_ERR_INVALID);
    ASSERT_STATUS(dt_compressor_compress(c, x, 0, buf, dt_compressor_encoded_bytes(c), &used),
                  DT_ERR_NUMERIC);
    ASSERT_CONTAINS(dt_last_error(), "block 1");
    dt_free(buf);
    dt_compressor_destroy(c);
    dt_free(x);
    dt_free(y);
}

/* QSGD's wire format as documented: per-block f32 scales, then codes as
 * one LSB-first bit stream (value i at bit i * B), decoded here by hand. */
static void test_qsgd_wire_format(void) {
    const size_t n = 600, nb = 3;
    float *x = falloc(n), *y = falloc(n);
    fill_normal(x, n, 1.0f, 950);
    for (int bits = 1; bits <= 8; bits++) {
        dt_codec_spec spec = {.kind = DT_CODEC_QSGD, .bits = bits};
        dt_compressor *c;
        ASSERT_OK(dt_compressor_create(&c, &spec, n, NULL));
        ASSERT_EQ(dt_compressor_count(c), n);
        size_t cap = dt_compressor_encoded_bytes(c), used;
        uint8_t *buf = dt_alloc(cap);
        ASSERT_OK(dt_compressor_compress(c, x, 1, buf, cap, &used));
        ASSERT_OK(dt_codec_decode(buf, used, n, y, DT_DECODE_SET));
        const uint8_t *p = buf + DT_COMPRESS_HEADER_BYTES, *codes = p + 4 * nb;
        int L = (1 << bits) - 1;
        for (size_t i = 0; i < n; i++) {
            unsigned v = 0;
            for (int t = 0; t < bits; t++) {
                size_t at = i * (size_t)bits + (size_t)t;
                v |= (unsigned)((codes[at / 8] >> (at % 8)) & 1u) << t;
            }
            float m;
            memcpy(&m, p + 4 * (i / 256), 4);
            float want = m * ((float)(2 * (int)v - L) / (float)L);
            if (memcmp(&want, &y[i], 4) != 0)
                TEST_FAILF("qsgd:%d value %zu: code %u decodes to %g, by hand %g", bits, i, v,
                           (double)y[i], (double)want);
        }
        dt_free(buf);
        dt_compressor_destroy(c);
    }
    dt_free(x);
    dt_free(y);
}

/* The batched Philox used by QSGD is dt_rng's stream, output for output. */
static void test_philox_fill_matches_dt_rng(void) {
    static const uint64_t seeds[] = {0, 1, 0xdeadbeefcafef00dull};
    static const uint64_t positions[] = {0, 4, 256, (1ull << 40) + 512, 0xfffffffffull * 4};
    uint32_t got[300];
    for (size_t s = 0; s < 3; s++)
        for (size_t p = 0; p < 5; p++) {
            uint64_t stream = dt_rng_stream_id((uint32_t)s * 7, p * 1000 + 3, DT_RNG_COMPRESS);
            size_t count = 1 + (s * 97 + p * 61) % 300;
            dt__philox_fill(seeds[s], stream, positions[p], got, count);
            dt_rng r;
            dt_rng_init(&r, seeds[s], stream);
            dt_rng_seek(&r, positions[p]);
            for (size_t i = 0; i < count; i++) {
                uint32_t want = dt_rng_u32(&r);
                if (got[i] != want)
                    TEST_FAILF("philox_fill seed %" PRIu64 " pos %" PRIu64 " [%zu]: 0x%08x, "
                               "dt_rng 0x%08x",
                               seeds[s], positions[p], i, got[i], want);
            }
        }
}

/* Blocks of tiny values (subnormal, or just above) decode to finite values
 * within 1e-30; int8 and QSGD send them as exact zeros, since their
 * reciprocal scale would overflow (and 0 * inf would be NaN). */
static void test_tiny_blocks(void) {
    const size_t n = 512;
    float x[512], y[512];
    for (size_t i = 0; i < n; i++)
        x[i] = (i % 2 ? -1.0f : 1.0f) * (i < 256 ? 1e-38f * (float)(i % 7) : 0x1p-149f * (float)i);
    static const char *const specs[] = {"int8", "qsgd:1", "qsgd:8", "sign"};
    for (size_t s = 0; s < 4; s++) {
        roundtrip(specs[s], x, n, y, DT_EF_OFF, 0);
        for (size_t i = 0; i < n; i++) {
            if (!isfinite(y[i]) || fabsf(y[i] - x[i]) > 1e-30f || (s < 3 && y[i] != 0.0f))
                TEST_FAILF("%s: tiny x[%zu] = %g decoded as %g", specs[s], i, (double)x[i],
                           (double)y[i]);
        }
    }
}

/* Blocks near FLT_MAX: int8 and QSGD decode finite values within their
 * bounds (no x + m or 2m overflow); sign refuses a block whose |x| sums
 * past FLT_MAX instead of producing a scale its decoder would reject. */
static void test_huge_blocks(void) {
    const size_t n = 300;
    float x[300], y[300];
    for (size_t i = 0; i < n; i++)
        x[i] = (i % 3 ? -1.0f : 1.0f) * ((float)(i % 5 + 1) / 5.0f * FLT_MAX);
    static const char *const specs[] = {"int8", "qsgd:1", "qsgd:4", "qsgd:8"};
    for (size_t s = 0; s < 4; s++) {
        roundtrip(specs[s], x, n, y, DT_EF_OFF, 0);
        for (size_t i = 0; i < n; i++)
            if (!isfinite(y[i]) ||
                fabs((double)y[i] - x[i]) > 2.0 * FLT_MAX * 1.0001 / (s ? 1 : 254))
                TEST_FAILF("%s: x[%zu] = %g decoded as %g", specs[s], i, (double)x[i],
                           (double)y[i]);
    }
    dt_codec_spec spec = spec_of("sign");
    dt_compressor *c;
    ASSERT_OK(dt_compressor_create(&c, &spec, n, NULL));
    size_t cap = dt_compressor_encoded_bytes(c), used;
    uint8_t *buf = dt_alloc(cap);
    ASSERT_STATUS(dt_compressor_compress(c, x, 0, buf, cap, &used), DT_ERR_NUMERIC);
    ASSERT_CONTAINS(dt_last_error(), "overflows");
    dt_free(buf);
    dt_compressor_destroy(c);
}

static void test_qsgd_bound_and_reproducible(void) {
    const size_t n = 777;
    float *x = falloc(n), *y = falloc(n), *z = falloc(n);
    fill_normal(x, n, 1.0f, 8);
    for (int bits = 1; bits <= 8; bits++) {
        char spec[16];
        snprintf(spec, sizeof spec, "qsgd:%d", bits);
        roundtrip(spec, x, n, y, DT_EF_OFF, 5);
        double levels = (double)((1 << bits) - 1);
        for (size_t i = 0; i < n; i++) {
            double m = absmax_block(x, n, i / DT_COMPRESS_BLOCK), step = 2 * m / levels;
            if (fabs((double)x[i] - y[i]) > step * (1 + 1e-5))
                TEST_FAILF("%s x[%zu] = %g -> %g: error > step %g", spec, i, (double)x[i],
                           (double)y[i], step);
        }
        /* Same (seed, rank, step, bucket): same result; another step differs. */
        roundtrip(spec, x, n, z, DT_EF_OFF, 5);
        ASSERT_TRUE(memcmp(y, z, n * sizeof(float)) == 0);
        roundtrip(spec, x, n, z, DT_EF_OFF, 6);
        ASSERT_TRUE(memcmp(y, z, n * sizeof(float)) != 0);
    }
    dt_free(x);
    dt_free(y);
    dt_free(z);
}

/* E[decode(encode(x))] = x: the mean over T independent draws (one step
 * each) lies within 5 standard errors of x, per element, where one draw's
 * variance is at most step^2 / 4 (a two-point distribution one step wide). */
static void test_qsgd_unbiased(void) {
    const size_t n = 300, T = 2000;
    float *x = falloc(n), *y = falloc(n);
    double *sum = calloc(n, sizeof(double));
    fill_normal(x, n, 1.0f, 9);
    static const int bit_cases[] = {1, 2, 4, 8};
    for (size_t bc = 0; bc < 4; bc++) {
        int bits = bit_cases[bc];
        dt_codec_spec spec = {.kind = DT_CODEC_QSGD, .bits = bits};
        dt_compressor_config cfg = dt_compressor_config_default();
        cfg.seed = 11;
        cfg.rank = 3;
        dt_compressor *c;
        ASSERT_OK(dt_compressor_create(&c, &spec, n, &cfg));
        size_t cap = dt_compressor_encoded_bytes(c), used;
        uint8_t *buf = dt_alloc(cap);
        memset(sum, 0, n * sizeof(double));
        for (size_t t = 0; t < T; t++) {
            ASSERT_OK(dt_compressor_compress(c, x, t, buf, cap, &used));
            ASSERT_OK(dt_codec_decode(buf, used, n, y, DT_DECODE_SET));
            for (size_t i = 0; i < n; i++)
                sum[i] += y[i];
        }
        double total_err = 0, total_var = 0;
        for (size_t i = 0; i < n; i++) {
            double m = absmax_block(x, n, i / DT_COMPRESS_BLOCK);
            double step = 2 * m / ((1 << bits) - 1);
            double se = step / 2 / sqrt((double)T);
            double mean = sum[i] / (double)T;
            if (fabs(mean - x[i]) > 5 * se + 1e-6 * m)
                TEST_FAILF("qsgd:%d x[%zu] = %.6f, mean of %zu draws %.6f, > 5 SE (%.2g)", bits, i,
                           (double)x[i], T, mean, se);
            total_err += mean - x[i];
            total_var += se * se;
        }
        /* The sum over elements must be unbiased too (catches a small
         * systematic drift that no single element shows). */
        if (fabs(total_err) > 5 * sqrt(total_var) + 1e-5)
            TEST_FAILF("qsgd:%d total bias %.3g > 5 SE %.3g", bits, total_err, 5 * sqrt(total_var));
        dt_free(buf);
        dt_compressor_destroy(c);
    }
    free(sum);
    dt_free(x);
    dt_free(y);
}

static void test_sign(void) {
    const size_t n = 600;
    float *x = falloc(n), *y = falloc(n);
    fill_int(x, n, 9, 10);
    roundtrip("sign", x, n, y, DT_EF_OFF, 0);
    for (size_t b = 0; b < 3; b++) {
        size_t lo = b * 256, hi = lo + 256 < n ? lo + 256 : n;
        double s = 0;
        for (size_t i = lo; i < hi; i++)
            s += fabs(x[i]);
        float scale = (float)(s / (double)(hi - lo));
        for (size_t i = lo; i < hi; i++) {
            float e = x[i] < 0 ? -scale : scale;
            if (y[i] != e)
                TEST_FAILF("sign x[%zu] = %g -> %g, expected %g", i, (double)x[i], (double)y[i],
                           (double)e);
        }
    }
    dt_free(x);
    dt_free(y);
}

/* ------------------------------------------------------------------------ */
/* Sparsifiers                                                              */
/* ------------------------------------------------------------------------ */

static const float *sort_base;
/* Order by magnitude, largest first, then by index (the codec's tie rule). */
static int cmp_mag_desc(const void *pa, const void *pb) {
    uint32_t a = *(const uint32_t *)pa, b = *(const uint32_t *)pb;
    float ma = fabsf(sort_base[a]), mb = fabsf(sort_base[b]);
    if (ma != mb)
        return ma > mb ? -1 : 1;
    return a < b ? -1 : (a > b);
}
static int cmp_u32(const void *pa, const void *pb) {
    uint32_t a = *(const uint32_t *)pa, b = *(const uint32_t *)pb;
    return a < b ? -1 : (a > b);
}

/* Both the AVX-512 and the scalar selection against a full sort. */
static void check_topk(const float *x, size_t n, size_t k) {
    uint32_t *keys = dt_alloc(n * 4 + 4), *order = dt_alloc(n * 4 + 4);
    uint8_t *idx = dt_alloc(k * 4 + 4);
    for (size_t i = 0; i < n; i++)
        order[i] = (uint32_t)i;
    sort_base = x;
    qsort(order, n, 4, cmp_mag_desc);
    qsort(order, k, 4, cmp_u32); /* the codec emits indices in increasing order */
    for (int simd = 0; simd < 2; simd++) {
        dt__topk_select(x, n, k, keys, idx, simd);
        for (size_t j = 0; j < k; j++) {
            uint32_t got;
            memcpy(&got, idx + 4 * j, 4);
            if (got != order[j])
                TEST_FAILF("topk n=%zu k=%zu simd=%d: index %zu is %u, full sort says %u", n, k,
                           simd, j, got, order[j]);
        }
    }
    dt_free(keys);
    dt_free(order);
    dt_free(idx);
}

static void test_topk_matches_sort(void) {
    static const size_t sizes[] = {1, 2, 7, 256, 1000, 4099, 50000};
    float *x = falloc(50000);
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        size_t n = sizes[s];
        size_t ks[] = {1, 2, n / 100 + 1, n / 3 + 1, n - 1 ? n - 1 : 1, n};
        for (int kind = 0; kind < 3; kind++) {
            if (kind == 0)
                fill_normal(x, n, 1.0f, 20 + s);
            else if (kind == 1)
                fill_int(x, n, 3, 30 + s); /* many ties and zeros */
            else
                for (size_t i = 0; i < n; i++) /* magnitudes sharing high bits */
                    x[i] = (i % 2 ? -1.0f : 1.0f) * (1.0f + (float)(i * 7919 % 1024) * 0x1p-23f);
            for (size_t kk = 0; kk < sizeof ks / sizeof ks[0]; kk++)
                check_topk(x, n, ks[kk] > n ? n : ks[kk]);
        }
    }
    /* Through the codec: decode keeps exactly the selected values. */
    const size_t n = 10000;
    float *y = falloc(n);
    fill_normal(x, n, 1.0f, 40);
    roundtrip("topk:0.01", x, n, y, DT_EF_OFF, 0);
    size_t kept = 0;
    for (size_t i = 0; i < n; i++) {
        if (y[i] != 0) {
            ASSERT_TRUE(y[i] == x[i]);
            kept++;
        }
    }
    ASSERT_EQ(kept, 100);
    dt_free(x);
    dt_free(y);
}

static void test_randk(void) {
    const size_t n = 1000, k = 50, T = 400;
    float *x = falloc(n), *y = falloc(n), *z = falloc(n);
    unsigned *hits = calloc(n, sizeof(unsigned));
    fill_int(x, n, 5, 50);
    for (size_t i = 0; i < n; i++)
        x[i] += x[i] >= 0 ? 100 : -100; /* no zeros: a kept value is visible */
    dt_codec_spec spec = spec_of("randk:50");
    dt_compressor_config cfg = dt_compressor_config_default();
    cfg.ef = DT_EF_OFF;
    cfg.seed = 3;
    dt_compressor *c, *c2;
    ASSERT_OK(dt_compressor_create(&c, &spec, n, &cfg));
    cfg.rank = 5; /* another rank picks the same indices */
    ASSERT_OK(dt_compressor_create(&c2, &spec, n, &cfg));
    size_t cap = dt_compressor_encoded_bytes(c), used;
    uint8_t *buf = dt_alloc(cap), *buf2 = dt_alloc(cap);
    for (size_t t = 0; t < T; t++) {
        ASSERT_OK(dt_compressor_compress(c, x, t, buf, cap, &used));
        ASSERT_OK(dt_compressor_compress(c2, x, t, buf2, cap, &used));
        ASSERT_TRUE(memcmp(buf, buf2, cap) == 0);
        ASSERT_OK(dt_codec_decode(buf, used, n, y, DT_DECODE_SET));
        size_t kept = 0;
        for (size_t i = 0; i < n; i++) {
            if (y[i] != 0) {
                ASSERT_TRUE(y[i] == x[i]);
                hits[i]++;
                kept++;
            }
        }
        ASSERT_EQ(kept, k);
    }
    /* Linear: two ranks' value arrays added in encoded form decode to the
     * sum of the two decodes. */
    fill_int(z, n, 7, 51);
    ASSERT_OK(dt_compressor_compress(c, x, 77, buf, cap, &used));
    ASSERT_OK(dt_compressor_compress(c2, z, 77, buf2, cap, &used));
    float *sum1 = falloc(n);
    ASSERT_OK(dt_codec_decode(buf, cap, n, sum1, DT_DECODE_SET));
    ASSERT_OK(dt_codec_decode(buf2, cap, n, sum1, DT_DECODE_ADD));
    for (size_t j = 0; j < k; j++) {
        float a, b;
        memcpy(&a, buf + cap - 4 * (k - j), 4);
        memcpy(&b, buf2 + cap - 4 * (k - j), 4);
        a += b;
        memcpy(buf + cap - 4 * (k - j), &a, 4);
    }
    ASSERT_OK(dt_codec_decode(buf, cap, n, y, DT_DECODE_SET));
    ASSERT_TRUE(memcmp(y, sum1, n * sizeof(float)) == 0);
    dt_free(sum1);
    /* Each index is kept with probability k/n: T k/n = 20 expected hits,
     * binomial sd ~4.4; all 1000 counts within 6 sd of it. */
    for (size_t i = 0; i < n; i++)
        if (hits[i] > 20 + 27 || hits[i] + 27 < 20)
            TEST_FAILF("randk: index %zu kept %u times in %zu steps (expected ~20)", i, hits[i], T);
    free(hits);
    dt_free(buf);
    dt_free(buf2);
    dt_compressor_destroy(c);
    dt_compressor_destroy(c2);
    dt_free(x);
    dt_free(y);
    dt_free(z);
}

/* ------------------------------------------------------------------------ */
/* Error feedback                                                           */
/* ------------------------------------------------------------------------ */

/* Over T steps, sum of what was sent + final residual == sum of inputs.
 * Exact for the sparsifiers on integers (they send values unchanged); for
 * the others every step's residual subtraction may round once. */
static void ef_mass(const char *spec_text, bool exact) {
    const size_t n = 1200, T = 25;
    float *x = falloc(n), *y = falloc(n);
    double *sent = calloc(n, sizeof(double)), *input = calloc(n, sizeof(double));
    dt_codec_spec spec = spec_of(spec_text);
    dt_compressor_config cfg = dt_compressor_config_default();
    cfg.ef = DT_EF_ON;
    cfg.rows = 40;
    cfg.cols = 30;
    dt_compressor *c;
    ASSERT_OK(dt_compressor_create(&c, &spec, n, &cfg));
    ASSERT_TRUE(dt_compressor_error_feedback(c));
    size_t cap = dt_compressor_encoded_bytes(c), used;
    uint8_t *buf = dt_alloc(cap);
    for (size_t t = 0; t < T; t++) {
        fill_int(x, n, 20, 100 + t);
        ASSERT_OK(dt_compressor_compress(c, x, t, buf, cap, &used));
        ASSERT_OK(dt_codec_decode(buf, used, n, y, DT_DECODE_SET));
        for (size_t i = 0; i < n; i++) {
            sent[i] += y[i];
            input[i] += x[i];
        }
    }
    const float *res = dt_compressor_residual(c);
    for (size_t i = 0; i < n; i++) {
        double lhs = sent[i] + res[i];
        double tol = exact ? 0 : 1e-5 * (fabs(input[i]) + 20.0 * T);
        if (fabs(lhs - input[i]) > tol)
            TEST_FAILF("%s: sent + residual = %.9g, sum of inputs = %.9g (element %zu)", spec_text,
                       lhs, input[i], i);
    }
    /* Error feedback keeps the residual bounded: it never holds more than a
     * few steps' worth of gradient. */
    double rmax = 0;
    for (size_t i = 0; i < n; i++)
        rmax = fmax(rmax, fabs(res[i]));
    if (strncmp(spec_text, "randk", 5) != 0 && rmax > 20.0 * T)
        TEST_FAILF("%s: residual grew to %g", spec_text, rmax);
    free(sent);
    free(input);
    dt_free(buf);
    dt_compressor_destroy(c);
    dt_free(x);
    dt_free(y);
}

static void test_error_feedback_conserves_mass(void) {
    ef_mass("topk:0.05", true);
    ef_mass("randk:0.05", true);
    ef_mass("topk:7", true);
    ef_mass("none", true);
    ef_mass("sign", false);
    ef_mass("int8", false);
    ef_mass("qsgd:2", false);
    ef_mass("fp16", false);
    ef_mass("powersgd:3", false);
}

/* The fused error-feedback paths (block codecs, casts) give the generic
 * path's bytes and residuals exactly, and a failed encode leaves the
 * residual as it was. */
static void test_fused_ef_matches_generic(void) {
    static const char *const specs[] = {"int8", "qsgd:3", "sign", "none", "fp16", "bf16"};
    const size_t n = 1000;
    float *g = falloc(n);
    for (size_t s = 0; s < 6; s++) {
        dt_codec_spec spec = spec_of(specs[s]);
        dt_compressor_config cfg = dt_compressor_config_default();
        cfg.ef = DT_EF_ON;
        dt_compressor *a, *b;
        ASSERT_OK(dt_compressor_create(&a, &spec, n, &cfg));
        ASSERT_OK(dt_compressor_create(&b, &spec, n, &cfg));
        size_t cap = dt_compressor_encoded_bytes(a), used;
        uint8_t *ba = dt_alloc(cap), *bb = dt_alloc(cap);
        for (uint64_t t = 0; t < 5; t++) {
            fill_normal(g, n, 1.0f, 900 + t);
            ASSERT_OK(dt_compressor_compress(a, g, t, ba, cap, &used));
            dt__compress_generic_ef = true;
            ASSERT_OK(dt_compressor_compress(b, g, t, bb, cap, &used));
            dt__compress_generic_ef = false;
            if (memcmp(ba, bb, cap) != 0)
                TEST_FAILF("%s step %" PRIu64 ": fused and generic encodings differ", specs[s], t);
            if (memcmp(dt_compressor_residual(a), dt_compressor_residual(b), n * 4) != 0)
                TEST_FAILF("%s step %" PRIu64 ": fused and generic residuals differ", specs[s], t);
        }
        if (s < 3) { /* the block codecs refuse non-finite input */
            float *before = falloc(n);
            memcpy(before, dt_compressor_residual(a), n * 4);
            g[700] = INFINITY;
            ASSERT_STATUS(dt_compressor_compress(a, g, 9, ba, cap, &used), DT_ERR_NUMERIC);
            ASSERT_TRUE(memcmp(before, dt_compressor_residual(a), n * 4) == 0);
            dt_free(before);
        }
        dt_free(ba);
        dt_free(bb);
        dt_compressor_destroy(a);
        dt_compressor_destroy(b);
    }
    dt_free(g);
}

static void test_ef_defaults_and_residual_io(void) {
    const size_t n = 500;
    float *x = falloc(n), *y = falloc(n);
    dt_codec_spec spec = spec_of("topk:0.1");
    dt_compressor *a, *b, *c;
    ASSERT_OK(dt_compressor_create(&a, &spec, n, NULL));
    ASSERT_TRUE(dt_compressor_error_feedback(a));
    ASSERT_OK(dt_compressor_create(&b, &spec, n, NULL));
    size_t cap = dt_compressor_encoded_bytes(a), used;
    uint8_t *ba = dt_alloc(cap), *bb = dt_alloc(cap);
    fill_int(x, n, 50, 60);
    ASSERT_OK(dt_compressor_compress(a, x, 0, ba, cap, &used));
    /* Move a's residual to b (as a checkpoint would), then both continue
     * identically. */
    size_t rb = dt_compressor_residual_bytes(a);
    ASSERT_EQ(rb, n * 4);
    uint8_t *saved = dt_alloc(rb);
    ASSERT_OK(dt_compressor_get_residual(a, saved, rb));
    ASSERT_OK(dt_compressor_set_residual(b, saved, rb));
    fill_int(x, n, 50, 61);
    ASSERT_OK(dt_compressor_compress(a, x, 1, ba, cap, &used));
    ASSERT_OK(dt_compressor_compress(b, x, 1, bb, cap, &used));
    ASSERT_TRUE(memcmp(ba, bb, cap) == 0);
    /* Wrong sizes and non-finite values are refused. */
    ASSERT_STATUS(dt_compressor_set_residual(b, saved, rb - 4), DT_ERR_INVALID);
    ASSERT_CONTAINS(dt_last_error(), "1996 bytes given");
    float nan = NAN;
    memcpy(saved + 40, &nan, 4);
    ASSERT_STATUS(dt_compressor_set_residual(b, saved, rb), DT_ERR_CORRUPT);
    ASSERT_STATUS(dt_compressor_get_residual(b, saved, 3), DT_ERR_INVALID);
    /* int8 has no error feedback unless asked for. */
    dt_codec_spec s8 = spec_of("int8");
    ASSERT_OK(dt_compressor_create(&c, &s8, n, NULL));
    ASSERT_TRUE(!dt_compressor_error_feedback(c));
    ASSERT_EQ(dt_compressor_residual_bytes(c), 0);
    ASSERT_TRUE(dt_compressor_residual(c) == NULL);
    ASSERT_OK(dt_compressor_set_residual(c, NULL, 0));
    dt_compressor_destroy(c);
    dt_compressor_destroy(NULL);
    dt_free(saved);
    dt_free(ba);
    dt_free(bb);
    dt_compressor_destroy(a);
    dt_compressor_destroy(b);
    dt_free(x);
    dt_free(y);
}

/* ------------------------------------------------------------------------ */
/* PowerSGD                                                                 */
/* ------------------------------------------------------------------------ */

static double frob_diff(const float *a, const float *b, size_t n) {
    double s = 0;
    for (size_t i = 0; i < n; i++)
        s += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
    return sqrt(s);
}

static double frob(const float *a, size_t n) {
    double s = 0;
    for (size_t i = 0; i < n; i++)
        s += (double)a[i] * a[i];
    return sqrt(s);
}

/* M = A B^T with A (rows, t), B (cols, t) small integers: rank <= t. */
static void low_rank(float *M, size_t rows, size_t cols, size_t t, uint64_t seed) {
    float *A = falloc(rows * t), *B = falloc(cols * t);
    fill_int(A, rows * t, 3, seed);
    fill_int(B, cols * t, 3, seed + 1);
    for (size_t i = 0; i < rows; i++)
        for (size_t j = 0; j < cols; j++) {
            float s = 0;
            for (size_t l = 0; l < t; l++)
                s += A[i * t + l] * B[j * t + l];
            M[i * cols + j] = s;
        }
    dt_free(A);
    dt_free(B);
}

static dt_compressor *psgd_new(int rank, size_t rows, size_t cols, dt_ef_mode ef, uint32_t who) {
    dt_codec_spec spec = {.kind = DT_CODEC_POWERSGD, .rank = rank};
    dt_compressor_config cfg = dt_compressor_config_default();
    cfg.rows = rows;
    cfg.cols = cols;
    cfg.ef = ef;
    cfg.seed = 99;
    cfg.rank = who;
    dt_compressor *c;
    ASSERT_OK(dt_compressor_create(&c, &spec, rows * cols, &cfg));
    return c;
}

static void test_powersgd_exact_low_rank(void) {
    const size_t rows = 64, cols = 48, n = rows * cols;
    float *M = falloc(n), *y = falloc(n);
    for (size_t t = 1; t <= 3; t++) {
        low_rank(M, rows, cols, t, 70 + t);
        for (int r = (int)t; r <= (int)t + 2; r++) {
            dt_compressor *c = psgd_new(r, rows, cols, DT_EF_OFF, 0);
            size_t cap = dt_compressor_encoded_bytes(c), used;
            ASSERT_EQ(cap, DT_COMPRESS_HEADER_BYTES + 4 * (size_t)r * (rows + cols));
            uint8_t *buf = dt_alloc(cap);
            ASSERT_OK(dt_compressor_compress(c, M, 0, buf, cap, &used));
            ASSERT_OK(dt_codec_decode(buf, used, n, y, DT_DECODE_SET));
            double rel = frob_diff(M, y, n) / frob(M, n);
            if (rel > 1e-5)
                TEST_FAILF("powersgd:%d of a rank-%zu matrix: relative error %.3g", r, t, rel);
            dt_free(buf);
            dt_compressor_destroy(c);
        }
    }
    /* A zero matrix compresses to zero, and the next step still works. */
    memset(M, 0, n * sizeof(float));
    dt_compressor *c = psgd_new(2, rows, cols, DT_EF_OFF, 0);
    size_t cap = dt_compressor_encoded_bytes(c), used;
    uint8_t *buf = dt_alloc(cap);
    ASSERT_OK(dt_compressor_compress(c, M, 0, buf, cap, &used));
    ASSERT_OK(dt_codec_decode(buf, used, n, y, DT_DECODE_SET));
    ASSERT_EQ(frob(y, n), 0);
    low_rank(M, rows, cols, 2, 80);
    ASSERT_OK(dt_compressor_compress(c, M, 1, buf, cap, &used));
    ASSERT_OK(dt_codec_decode(buf, used, n, y, DT_DECODE_SET));
    ASSERT_TRUE(frob_diff(M, y, n) / frob(M, n) < 1e-5);
    dt_free(buf);
    dt_compressor_destroy(c);
    dt_free(M);
    dt_free(y);
}

/* M = U diag(s) V^T with orthonormal U, V: the best rank-r error is
 * sqrt(sum of s_i^2, i >= r). Repeated steps on the same M are subspace
 * iteration from the warm start and must converge to it. */
static void test_powersgd_warm_start_converges(void) {
    const size_t rows = 60, cols = 40, n = rows * cols, full = 40, r = 2;
    float *U = falloc(rows * full), *V = falloc(cols * full), *M = falloc(n), *y = falloc(n);
    fill_normal(U, rows * full, 1.0f, 90);
    fill_normal(V, cols * full, 1.0f, 91);
    dt__powersgd_orthonormalize(U, rows, full);
    dt__powersgd_orthonormalize(V, cols, full);
    double s[40], best2 = 0;
    for (size_t l = 0; l < full; l++) {
        s[l] = l == 0 ? 10 : l == 1 ? 6 : 3.0 * pow(0.8, (double)l);
        if (l >= r)
            best2 += s[l] * s[l];
    }
    for (size_t i = 0; i < rows; i++)
        for (size_t j = 0; j < cols; j++) {
            double v = 0;
            for (size_t l = 0; l < full; l++)
                v += U[i * full + l] * s[l] * V[j * full + l];
            M[i * cols + j] = (float)v;
        }
    dt_compressor *c = psgd_new((int)r, rows, cols, DT_EF_OFF, 0);
    size_t cap = dt_compressor_encoded_bytes(c), used;
    uint8_t *buf = dt_alloc(cap);
    double first = 0, last = 0;
    for (int it = 0; it < 40; it++) {
        ASSERT_OK(dt_compressor_compress(c, M, (uint64_t)it, buf, cap, &used));
        ASSERT_OK(dt_codec_decode(buf, used, n, y, DT_DECODE_SET));
        last = frob_diff(M, y, n);
        if (it == 0)
            first = last;
    }
    double best = sqrt(best2);
    if (!(last <= best * 1.01))
        TEST_FAILF("powersgd warm start: error %.6g after 40 steps, best rank-2 error %.6g", last,
                   best);
    if (!(first > last * 1.05))
        TEST_FAILF("powersgd warm start: first error %.6g not above final %.6g", first, last);
    dt_free(buf);
    dt_compressor_destroy(c);
    dt_free(U);
    dt_free(V);
    dt_free(M);
    dt_free(y);
}

/* Three "ranks" in one process run the staged API with sums in place of the
 * allreduces: every rank gets the same output, equal to the one-shot codec
 * applied to the average gradient, and each residual is its own M minus it. */
static void test_powersgd_staged(void) {
    const size_t rows = 32, cols = 24, n = rows * cols, W = 3;
    dt_compressor *c[3];
    float *g[3], *out[3], *avg = falloc(n), *ref = falloc(n);
    memset(avg, 0, n * sizeof(float));
    for (size_t w = 0; w < W; w++) {
        c[w] = psgd_new(3, rows, cols, DT_EF_ON, (uint32_t)w);
        g[w] = falloc(n);
        out[w] = falloc(n);
        low_rank(g[w], rows, cols, 2 + w, 200 + w);
        for (size_t i = 0; i < n; i++)
            avg[i] += g[w][i] / (float)W;
    }
    size_t np, nq;
    float *sum = falloc(rows * cols);
    for (size_t w = 0; w < W; w++)
        ASSERT_OK(dt_powersgd_begin(c[w], g[w], 0));
    ASSERT_STATUS(dt_powersgd_end(c[0], 1.0f, out[0]), DT_ERR_INVALID); /* out of order */
    dt_powersgd_p(c[0], &np);
    ASSERT_EQ(np, rows * 3);
    memset(sum, 0, np * sizeof(float));
    for (size_t w = 0; w < W; w++) {
        float *P = dt_powersgd_p(c[w], &np);
        for (size_t i = 0; i < np; i++)
            sum[i] += P[i];
    }
    for (size_t w = 0; w < W; w++) {
        memcpy(dt_powersgd_p(c[w], &np), sum, np * sizeof(float));
        ASSERT_OK(dt_powersgd_middle(c[w]));
    }
    dt_powersgd_q(c[0], &nq);
    ASSERT_EQ(nq, cols * 3);
    memset(sum, 0, nq * sizeof(float));
    for (size_t w = 0; w < W; w++) {
        float *Q = dt_powersgd_q(c[w], &nq);
        for (size_t i = 0; i < nq; i++)
            sum[i] += Q[i];
    }
    for (size_t w = 0; w < W; w++) {
        memcpy(dt_powersgd_q(c[w], &nq), sum, nq * sizeof(float));
        ASSERT_OK(dt_powersgd_end(c[w], 1.0f / (float)W, out[w]));
    }
    for (size_t w = 1; w < W; w++)
        ASSERT_TRUE(memcmp(out[0], out[w], n * sizeof(float)) == 0);
    dt_compressor *one = psgd_new(3, rows, cols, DT_EF_OFF, 0);
    size_t cap = dt_compressor_encoded_bytes(one), used;
    uint8_t *buf = dt_alloc(cap);
    ASSERT_OK(dt_compressor_compress(one, avg, 0, buf, cap, &used));
    ASSERT_OK(dt_codec_decode(buf, used, n, ref, DT_DECODE_SET));
    double rel = frob_diff(out[0], ref, n) / frob(ref, n);
    if (rel > 1e-4)
        TEST_FAILF("staged powersgd vs one-shot on the average: relative difference %.3g", rel);
    for (size_t w = 0; w < W; w++) {
        const float *res = dt_compressor_residual(c[w]);
        for (size_t i = 0; i < n; i++)
            ASSERT_NEAR(res[i] + out[w][i], g[w][i], 1e-5, 1e-4);
    }
    dt_free(buf);
    dt_compressor_destroy(one);
    for (size_t w = 0; w < W; w++) {
        dt_compressor_destroy(c[w]);
        dt_free(g[w]);
        dt_free(out[w]);
    }
    dt_free(sum);
    dt_free(avg);
    dt_free(ref);
}

/* A bucket of three tensors and two uncovered gaps, reduced over three
 * simulated ranks: matrices of rank <= r come back exactly (averaged), the
 * vector and the gaps are plain averages, every rank gets the same result,
 * and residual + output == gradient on each rank. */
static void test_powersgd_bucket(void) {
    const size_t W = 3, r = 3, n = 5 + 32 * 24 + 24 + 16 * 40 + 10;
    const dt_powersgd_tensor t[] = {
        {.offset = 5 + 32 * 24 + 24, .rows = 16, .cols = 40}, /* given out of order */
        {.offset = 5, .rows = 32, .cols = 24},
        {.offset = 5 + 32 * 24, .rows = 24, .cols = 1}, /* a bias: uncompressed */
    };
    dt_powersgd_bucket *b[3];
    float *g[3], *out[3], *avg = falloc(n);
    memset(avg, 0, n * sizeof(float));
    dt_compressor_config cfg = dt_compressor_config_default();
    cfg.seed = 5;
    for (size_t w = 0; w < W; w++) {
        cfg.rank = (uint32_t)w;
        ASSERT_OK(dt_powersgd_bucket_create(&b[w], (int)r, n, t, 3, &cfg));
        g[w] = falloc(n);
        out[w] = falloc(n);
        fill_int(g[w], n, 4, 700 + w);
        low_rank(g[w] + 5, 32, 24, 1, 710 + w); /* sum of three: rank <= 3 */
        low_rank(g[w] + 5 + 32 * 24 + 24, 16, 40, 1, 720 + w);
        for (size_t i = 0; i < n; i++)
            avg[i] += g[w][i] / (float)W;
    }
    ASSERT_EQ(dt_powersgd_bucket_compressed(b[0]), 2);
    size_t np, nq;
    dt_powersgd_bucket_p(b[0], &np);
    dt_powersgd_bucket_q(b[0], &nq);
    ASSERT_EQ(np, (32 + 16) * r + 5 + 24 + 10);
    ASSERT_EQ(nq, (24 + 40) * r);
    float *sum = falloc(np + nq);
    for (int pass = 0; pass < 2; pass++) {
        for (size_t w = 0; w < W; w++) {
            if (pass == 0)
                ASSERT_OK(dt_powersgd_bucket_begin(b[w], g[w], 0));
            else
                ASSERT_OK(dt_powersgd_bucket_middle(b[w]));
        }
        size_t cnt = 0;
        memset(sum, 0, (np + nq) * sizeof(float));
        for (size_t w = 0; w < W; w++) {
            float *buf =
                pass == 0 ? dt_powersgd_bucket_p(b[w], &cnt) : dt_powersgd_bucket_q(b[w], &cnt);
            for (size_t i = 0; i < cnt; i++)
                sum[i] += buf[i];
        }
        for (size_t w = 0; w < W; w++) {
            float *buf =
                pass == 0 ? dt_powersgd_bucket_p(b[w], &cnt) : dt_powersgd_bucket_q(b[w], &cnt);
            memcpy(buf, sum, cnt * sizeof(float));
        }
    }
    for (size_t w = 0; w < W; w++)
        ASSERT_OK(dt_powersgd_bucket_end(b[w], 1.0f / (float)W, out[w]));
    for (size_t w = 1; w < W; w++)
        ASSERT_TRUE(memcmp(out[0], out[w], n * sizeof(float)) == 0);
    /* The averaged matrices have rank <= 3: reconstructed; the rest exact. */
    for (size_t i = 0; i < n; i++)
        ASSERT_NEAR(out[0][i], avg[i], 1e-4, 1e-4);
    uint8_t *state = dt_alloc(dt_powersgd_bucket_state_bytes(b[0]));
    ASSERT_EQ(dt_powersgd_bucket_state_bytes(b[0]), 4 * (n + nq));
    ASSERT_OK(dt_powersgd_bucket_get_state(b[0], state, 4 * (n + nq)));
    const float *res = (const float *)state;
    for (size_t i = 0; i < n; i++)
        ASSERT_NEAR(res[i] + out[0][i], g[0][i], 1e-5, 1e-4);
    ASSERT_OK(dt_powersgd_bucket_set_state(b[1], state, 4 * (n + nq)));
    ASSERT_STATUS(dt_powersgd_bucket_set_state(b[1], state, 4), DT_ERR_INVALID);
    ASSERT_STATUS(dt_powersgd_bucket_middle(b[1]), DT_ERR_INVALID); /* out of order */
    /* Overlapping and out-of-range tensors are refused. */
    dt_powersgd_bucket *bad;
    dt_powersgd_tensor overlap[] = {{.offset = 0, .rows = 10, .cols = 10},
                                    {.offset = 99, .rows = 2, .cols = 2}};
    ASSERT_STATUS(dt_powersgd_bucket_create(&bad, 2, 200, overlap, 2, NULL), DT_ERR_INVALID);
    ASSERT_CONTAINS(dt_last_error(), "tensor at 99");
    dt_powersgd_tensor outside[] = {{.offset = 150, .rows = 10, .cols = 10}};
    ASSERT_STATUS(dt_powersgd_bucket_create(&bad, 2, 200, outside, 1, NULL), DT_ERR_INVALID);
    ASSERT_STATUS(dt_powersgd_bucket_create(&bad, 0, 200, NULL, 0, NULL), DT_ERR_INVALID);
    /* No tensors at all: everything travels as plain values. */
    ASSERT_OK(dt_powersgd_bucket_create(&bad, 2, 200, NULL, 0, NULL));
    dt_powersgd_bucket_p(bad, &np);
    ASSERT_EQ(np, 200);
    dt_powersgd_bucket_destroy(bad);
    dt_powersgd_bucket_destroy(NULL);
    dt_free(state);
    dt_free(sum);
    for (size_t w = 0; w < W; w++) {
        dt_powersgd_bucket_destroy(b[w]);
        dt_free(g[w]);
        dt_free(out[w]);
    }
    dt_free(avg);
}

/* ------------------------------------------------------------------------ */
/* PyTorch reference (tests/reference/gen_compress_reference.py)            */
/* ------------------------------------------------------------------------ */

static void read_exact(FILE *f, void *p, size_t bytes) {
    if (fread(p, 1, bytes, f) != bytes)
        TEST_FAILF("compress_ref.bin: short read of %zu bytes", bytes);
}

static void test_pytorch_reference(void) {
    const char *path = DT_TEST_DATA_DIR "/data/compress_ref.bin";
    FILE *f = fopen(path, "rb");
    if (!f)
        TEST_FAILF("cannot open %s", path);
    char magic[8];
    read_exact(f, magic, 8);
    ASSERT_TRUE(memcmp(magic, "DTCZREF1", 8) == 0);
    uint32_t n;
    read_exact(f, &n, 4);
    ASSERT_EQ(n, 8192);
    float *x = falloc(n);
    uint16_t *t16 = malloc(2 * n), *tbf = malloc(2 * n);
    uint8_t *ours = malloc(2 * n);
    read_exact(f, x, 4 * n);
    read_exact(f, t16, 2 * n);
    read_exact(f, tbf, 2 * n);
    for (int simd = 0; simd < 2; simd++) {
        dt__f32_to_f16(ours, x, n, simd);
        for (size_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, ours + 2 * i, 2);
            if (h != t16[i])
                TEST_FAILF("fp16(%a) [%zu, simd %d]: 0x%04x, torch 0x%04x", (double)x[i], i, simd,
                           h, t16[i]);
        }
    }
    dt__f32_to_bf16(ours, x, n);
    for (size_t i = 0; i < n; i++) {
        uint16_t h;
        memcpy(&h, ours + 2 * i, 2);
        if (h != tbf[i])
            TEST_FAILF("bf16(%a) [%zu]: 0x%04x, torch 0x%04x", (double)x[i], i, h, tbf[i]);
    }

    uint32_t shape[3];
    read_exact(f, shape, sizeof shape);
    size_t rows = shape[0], cols = shape[1], r = shape[2], mn = rows * cols;
    float *q0 = falloc(cols * r), *m1 = falloc(mn), *o1 = falloc(mn), *m2 = falloc(mn),
          *o2 = falloc(mn), *y = falloc(mn);
    read_exact(f, q0, 4 * cols * r);
    read_exact(f, m1, 4 * mn);
    read_exact(f, o1, 4 * mn);
    read_exact(f, m2, 4 * mn);
    read_exact(f, o2, 4 * mn);
    fclose(f);
    /* Same start Q as torch, then two steps: the second warm-starts. */
    dt_compressor *c = psgd_new((int)r, rows, cols, DT_EF_OFF, 0);
    ASSERT_EQ(dt_compressor_state_bytes(c), 4 * cols * r);
    ASSERT_OK(dt_compressor_set_state(c, q0, 4 * cols * r));
    size_t cap = dt_compressor_encoded_bytes(c), used;
    uint8_t *buf = dt_alloc(cap);
    const float *ms[2] = {m1, m2}, *os[2] = {o1, o2};
    for (int s = 0; s < 2; s++) {
        ASSERT_OK(dt_compressor_compress(c, ms[s], (uint64_t)s, buf, cap, &used));
        ASSERT_OK(dt_codec_decode(buf, used, mn, y, DT_DECODE_SET));
        double rel = frob_diff(y, os[s], mn) / frob(os[s], mn);
        if (rel > 2e-5)
            TEST_FAILF("powersgd step %d vs torch powerSGD_hook math: relative difference %.3g", s,
                       rel);
    }
    dt_free(buf);
    dt_compressor_destroy(c);
    dt_free(q0);
    dt_free(m1);
    dt_free(o1);
    dt_free(m2);
    dt_free(o2);
    dt_free(y);
    dt_free(x);
    free(t16);
    free(tbf);
    free(ours);
}

/* Checkpoint state: residual + warm-start Q restore a run bit for bit. */
static void test_state_resume(void) {
    const size_t rows = 24, cols = 20, n = rows * cols;
    float *g = falloc(n);
    dt_compressor *a = psgd_new(2, rows, cols, DT_EF_ON, 0),
                  *b = psgd_new(2, rows, cols, DT_EF_ON, 0);
    size_t cap = dt_compressor_encoded_bytes(a), used;
    uint8_t *ba = dt_alloc(cap), *bb = dt_alloc(cap);
    for (uint64_t t = 0; t < 3; t++) {
        fill_int(g, n, 9, 600 + t);
        ASSERT_OK(dt_compressor_compress(a, g, t, ba, cap, &used));
    }
    size_t sb = dt_compressor_state_bytes(a);
    ASSERT_EQ(sb, 4 * n + 4 * cols * 2);
    uint8_t *state = dt_alloc(sb);
    ASSERT_OK(dt_compressor_get_state(a, state, sb));
    ASSERT_OK(dt_compressor_set_state(b, state, sb));
    for (uint64_t t = 3; t < 6; t++) {
        fill_int(g, n, 9, 600 + t);
        ASSERT_OK(dt_compressor_compress(a, g, t, ba, cap, &used));
        ASSERT_OK(dt_compressor_compress(b, g, t, bb, cap, &used));
        ASSERT_TRUE(memcmp(ba, bb, cap) == 0);
    }
    ASSERT_STATUS(dt_compressor_set_state(b, state, sb - 1), DT_ERR_INVALID);
    ASSERT_OK(dt_powersgd_begin(b, g, 7));
    ASSERT_STATUS(dt_compressor_set_state(b, state, sb), DT_ERR_INVALID);
    ASSERT_CONTAINS(dt_last_error(), "staged");
    /* reset == a fresh compressor: same bytes as one that never ran. */
    dt_compressor_reset(b);
    dt_compressor *fresh = psgd_new(2, rows, cols, DT_EF_ON, 0);
    ASSERT_OK(dt_compressor_compress(b, g, 8, ba, cap, &used));
    ASSERT_OK(dt_compressor_compress(fresh, g, 8, bb, cap, &used));
    ASSERT_TRUE(memcmp(ba, bb, cap) == 0);
    dt_compressor_destroy(fresh);
    dt_free(state);
    dt_free(ba);
    dt_free(bb);
    dt_compressor_destroy(a);
    dt_compressor_destroy(b);
    dt_free(g);
}

/* ------------------------------------------------------------------------ */
/* Hostile buffers                                                          */
/* ------------------------------------------------------------------------ */

static void test_corrupt_rejected(void) {
    static const char *const specs[] = {"none", "fp16",      "bf16",      "int8",      "qsgd:3",
                                        "sign", "topk:0.05", "randk:0.1", "powersgd:2"};
    const size_t n = 600, trials = 1500;
    float *x = falloc(n), *y = falloc(n);
    fill_normal(x, n, 1.0f, 300);
    dt_rng r;
    dt_rng_init(&r, 301, dt_rng_stream_id(0, 9, DT_RNG_TEST));
    for (size_t s = 0; s < sizeof specs / sizeof specs[0]; s++) {
        dt_codec_spec spec = spec_of(specs[s]);
        dt_compressor_config cfg = dt_compressor_config_default();
        cfg.rows = 30;
        cfg.cols = 20;
        dt_compressor *c;
        ASSERT_OK(dt_compressor_create(&c, &spec, n, &cfg));
        size_t len = dt_compressor_encoded_bytes(c), used;
        uint8_t *good = dt_alloc(len + 1);
        ASSERT_OK(dt_compressor_compress(c, x, 0, good, len, &used));
        ASSERT_OK(dt_codec_decode(good, len, n, y, DT_DECODE_SET));
        /* Wrong expected count, one byte more, every truncation. */
        ASSERT_STATUS(dt_codec_decode(good, len, n - 1, y, DT_DECODE_SET), DT_ERR_CORRUPT);
        ASSERT_STATUS(dt_codec_decode(good, len + 1, n, y, DT_DECODE_SET), DT_ERR_CORRUPT);
        for (size_t cut = 0; cut < len; cut += cut < 64 ? 1 : 37) {
            /* A heap copy of exactly `cut` bytes, so ASan sees any over-read. */
            uint8_t *t = malloc(cut ? cut : 1);
            memcpy(t, good, cut);
            ASSERT_STATUS(dt_codec_decode(t, cut, n, y, DT_DECODE_ADD), DT_ERR_CORRUPT);
            free(t);
        }
        size_t ok = 0, bad = 0;
        for (size_t t = 0; t < trials; t++) {
            uint8_t *b = malloc(len);
            memcpy(b, good, len);
            int flips = 1 + (int)dt_rng_below(&r, 3);
            bool header = t % 2 == 0; /* half the trials hit the header */
            for (int f = 0; f < flips; f++) {
                size_t at = header ? dt_rng_below(&r, DT_COMPRESS_HEADER_BYTES)
                                   : dt_rng_below(&r, (uint32_t)len);
                b[at] ^= (uint8_t)(1 + dt_rng_below(&r, 255));
            }
            /* Trials cut off mid-buffer too, on a third of them. */
            size_t blen = t % 3 == 0 ? dt_rng_below(&r, (uint32_t)len) : len;
            dt_status st = dt_codec_decode(b, blen, n, y, DT_DECODE_ADD);
            ASSERT_TRUE(st == DT_OK || st == DT_ERR_CORRUPT);
            if (st == DT_ERR_CORRUPT)
                ASSERT_TRUE(dt_last_error()[0] != '\0');
            if ((header || blen != len) && st == DT_OK && memcmp(b, good, DT_COMPRESS_HEADER_BYTES))
                TEST_FAILF("%s: damaged header accepted (trial %zu)", specs[s], t);
            st == DT_OK ? ok++ : bad++;
            free(b);
        }
        ASSERT_TRUE(bad >= trials / 2);
        dt_free(good);
        dt_compressor_destroy(c);
    }
    /* Hand-made hostile headers: huge counts must not overflow a size. */
    uint8_t h[DT_COMPRESS_HEADER_BYTES] = {0};
    float dummy;
    ASSERT_STATUS(dt_codec_decode(h, sizeof h, 0, &dummy, DT_DECODE_SET), DT_ERR_CORRUPT);
    ASSERT_STATUS(dt_codec_decode(NULL, 0, 0, &dummy, DT_DECODE_SET), DT_ERR_CORRUPT);
    dt_free(x);
    dt_free(y);
}

/* Hostile headers that carry a valid check (anyone can compute XXH3): every
 * field takes edge values, the payload is random and its length sometimes
 * exactly what the header implies. Decoding must return OK or CORRUPT and
 * stay in bounds (ASan). */
static uint64_t edge_value(dt_rng *r, uint64_t n) {
    static const uint64_t edges[] = {0,
                                     1,
                                     2,
                                     3,
                                     255,
                                     256,
                                     257,
                                     0xffffffffull,
                                     0x100000000ull,
                                     (uint64_t)SIZE_MAX / 8,
                                     (uint64_t)SIZE_MAX / 8 + 1,
                                     (uint64_t)SIZE_MAX / 4,
                                     UINT64_MAX};
    switch (dt_rng_below(r, 4)) {
    case 0: return edges[dt_rng_below(r, sizeof edges / sizeof edges[0])];
    case 1: return n + dt_rng_below(r, 3) - 1;
    case 2: return dt_rng_below(r, (uint32_t)n + 1);
    default: return dt_rng_u64(r);
    }
}

static void test_forged_headers(void) {
    const size_t n = 300;
    float *y = falloc(n);
    dt_rng r;
    dt_rng_init(&r, 77, dt_rng_stream_id(0, 10, DT_RNG_TEST));
    size_t accepted = 0;
    for (int t = 0; t < 20000; t++) {
        uint8_t h[DT_COMPRESS_HEADER_BYTES];
        uint32_t magic = 0x5A435444u;
        memcpy(h, &magic, 4);
        h[4] = 1;
        /* Half the trials are plausible (fields valid for the codec, one of
         * them possibly at an edge), half are arbitrary. */
        bool plausible = dt_rng_below(&r, 2);
        uint8_t kind = (uint8_t)dt_rng_below(&r, DT_CODEC_COUNT + !plausible);
        h[5] = kind;
        h[6] = (uint8_t)(plausible ? (kind == DT_CODEC_QSGD ? 1 + dt_rng_below(&r, 8) : 0)
                                   : dt_rng_below(&r, 10));
        h[7] = 0;
        uint64_t count = plausible || dt_rng_below(&r, 2) ? n : edge_value(&r, n);
        uint64_t k = 0;
        uint32_t rank = 0;
        if (kind == DT_CODEC_TOPK || kind == DT_CODEC_RANDK)
            k = plausible ? 1 + dt_rng_below(&r, (uint32_t)n) : edge_value(&r, n);
        if (kind == DT_CODEC_POWERSGD) {
            static const uint64_t shapes[] = {1,  2,  3,  4,  5,  6,  10,  12,  15,
                                              20, 25, 30, 50, 60, 75, 100, 150, 300};
            k = plausible ? shapes[dt_rng_below(&r, 18)] : edge_value(&r, n);
            rank = (uint32_t)(plausible ? dt_rng_below(&r, 6) : edge_value(&r, n));
        }
        if (!plausible && dt_rng_below(&r, 2)) {
            k = edge_value(&r, n);
            rank = (uint32_t)edge_value(&r, n);
        }
        memcpy(h + 8, &count, 8);
        memcpy(h + 16, &k, 8);
        memcpy(h + 24, &rank, 4);
        uint32_t check = (uint32_t)dt_hash64(h, 28, 0);
        memcpy(h + 28, &check, 4);
        dt_codec_header ph;
        size_t len = DT_COMPRESS_HEADER_BYTES + dt_rng_below(&r, 4096);
        /* Peek at the bare header: for a sane one its error names the
         * implied length, which three trials in four then use. */
        if (dt_codec_peek(h, sizeof h, &ph) == DT_ERR_CORRUPT) {
            const char *e = dt_last_error();
            const char *at = strstr(e, "header implies ");
            if (at && dt_rng_below(&r, 4) != 0) {
                unsigned long long implied = strtoull(at + 15, NULL, 10);
                if (implied < 64 * 1024)
                    len = (size_t)implied;
            }
        }
        uint8_t *b = malloc(len);
        memcpy(b, h, DT_COMPRESS_HEADER_BYTES);
        for (size_t i = DT_COMPRESS_HEADER_BYTES; i < len; i++)
            b[i] = (uint8_t)dt_rng_u32(&r);
        if (dt_rng_below(&r, 3) == 0 && len >= DT_COMPRESS_HEADER_BYTES + 4 * 256)
            memset(b + DT_COMPRESS_HEADER_BYTES, 0, 4 * 256); /* sane scales, small indices */
        dt_status st = dt_codec_decode(b, len, n, y, DT_DECODE_ADD);
        if (st != DT_OK && st != DT_ERR_CORRUPT)
            TEST_FAILF("trial %d: decode returned %s", t, dt_status_name(st));
        if (st == DT_OK) {
            ASSERT_OK(dt_codec_peek(b, len, &ph));
            ASSERT_EQ(ph.count, n);
            accepted++;
        }
        free(b);
    }
    /* Some forged buffers are well formed; they must have decoded in bounds. */
    printf("  forged headers: %zu of 20000 decoded, the rest refused\n", accepted);
    ASSERT_TRUE(accepted > 100);
    dt_free(y);
}

/* A buffer whose header is intact but whose sparse indices were forged:
 * out-of-range and repeated indices are refused before any write. */
static void test_forged_indices(void) {
    const size_t n = 100;
    float x[100], y[100];
    fill_normal(x, n, 1.0f, 400);
    dt_codec_spec spec = spec_of("topk:4");
    dt_compressor *c;
    ASSERT_OK(dt_compressor_create(&c, &spec, n, NULL));
    size_t len = dt_compressor_encoded_bytes(c), used;
    uint8_t *b = dt_alloc(len);
    ASSERT_OK(dt_compressor_compress(c, x, 0, b, len, &used));
    uint8_t *idx = b + DT_COMPRESS_HEADER_BYTES;
    uint32_t saved, v;
    memcpy(&saved, idx + 8, 4);
    for (int i = 0; i < 100; i++)
        y[i] = 42;
    v = 100; /* == n */
    memcpy(idx + 8, &v, 4);
    ASSERT_STATUS(dt_codec_decode(b, len, n, y, DT_DECODE_SET), DT_ERR_CORRUPT);
    ASSERT_CONTAINS(dt_last_error(), "index 2");
    v = 0xffffffffu;
    memcpy(idx + 8, &v, 4);
    ASSERT_STATUS(dt_codec_decode(b, len, n, y, DT_DECODE_SET), DT_ERR_CORRUPT);
    memcpy(&v, idx + 4, 4); /* a repeat of the previous index */
    memcpy(idx + 8, &v, 4);
    ASSERT_STATUS(dt_codec_decode(b, len, n, y, DT_DECODE_SET), DT_ERR_CORRUPT);
    for (int i = 0; i < 100; i++)
        ASSERT_EQ(y[i], 42); /* nothing was written */
    memcpy(idx + 8, &saved, 4);
    ASSERT_OK(dt_codec_decode(b, len, n, y, DT_DECODE_SET));
    /* A scale forged to NaN is refused too. */
    dt_codec_spec s8 = spec_of("int8");
    dt_compressor *c8;
    ASSERT_OK(dt_compressor_create(&c8, &s8, n, NULL));
    size_t len8 = dt_compressor_encoded_bytes(c8);
    uint8_t *b8 = dt_alloc(len8);
    ASSERT_OK(dt_compressor_compress(c8, x, 0, b8, len8, &used));
    float nan = NAN;
    memcpy(b8 + DT_COMPRESS_HEADER_BYTES, &nan, 4);
    ASSERT_STATUS(dt_codec_decode(b8, len8, n, y, DT_DECODE_SET), DT_ERR_CORRUPT);
    ASSERT_CONTAINS(dt_last_error(), "scale of block 0");
    dt_free(b8);
    dt_compressor_destroy(c8);
    /* random-k carries (seed, step, bucket): an impossible step or a
     * non-zero pad is refused (a bad step must not reach dt_rng's assert). */
    dt_codec_spec sr = spec_of("randk:10");
    dt_compressor *cr;
    ASSERT_OK(dt_compressor_create(&cr, &sr, n, NULL));
    size_t lenr = dt_compressor_encoded_bytes(cr);
    uint8_t *br = dt_alloc(lenr);
    ASSERT_OK(dt_compressor_compress(cr, x, 9, br, lenr, &used));
    uint64_t big = 1ull << 40;
    memcpy(br + DT_COMPRESS_HEADER_BYTES + 8, &big, 8);
    ASSERT_STATUS(dt_codec_decode(br, lenr, n, y, DT_DECODE_SET), DT_ERR_CORRUPT);
    ASSERT_CONTAINS(dt_last_error(), "randk buffer: step");
    uint64_t nine = 9;
    memcpy(br + DT_COMPRESS_HEADER_BYTES + 8, &nine, 8);
    br[DT_COMPRESS_HEADER_BYTES + 21] = 1;
    ASSERT_STATUS(dt_codec_decode(br, lenr, n, y, DT_DECODE_SET), DT_ERR_CORRUPT);
    br[DT_COMPRESS_HEADER_BYTES + 21] = 0;
    ASSERT_OK(dt_codec_decode(br, lenr, n, y, DT_DECODE_SET));
    dt_free(br);
    dt_compressor_destroy(cr);
    dt_free(b);
    dt_compressor_destroy(c);
}

static void test_decode_add(void) {
    const size_t n = 513;
    float *x = falloc(n), *y = falloc(n), *z = falloc(n);
    fill_int(x, n, 30, 500);
    static const char *const specs[] = {"none", "fp16",     "bf16",      "int8",      "qsgd:5",
                                        "sign", "topk:0.1", "randk:0.2", "powersgd:2"};
    for (size_t s = 0; s < sizeof specs / sizeof specs[0]; s++) {
        dt_codec_spec spec = spec_of(specs[s]);
        dt_compressor_config cfg = dt_compressor_config_default();
        cfg.rows = 27;
        cfg.cols = 19;
        dt_compressor *c;
        ASSERT_OK(dt_compressor_create(&c, &spec, n, &cfg));
        size_t len = dt_compressor_encoded_bytes(c), used;
        uint8_t *b = dt_alloc(len);
        ASSERT_OK(dt_compressor_compress(c, x, 0, b, len, &used));
        ASSERT_OK(dt_codec_decode(b, len, n, y, DT_DECODE_SET));
        for (size_t i = 0; i < n; i++)
            z[i] = (float)i;
        ASSERT_OK(dt_codec_decode(b, len, n, z, DT_DECODE_ADD));
        for (size_t i = 0; i < n; i++)
            ASSERT_NEAR(z[i], (float)i + y[i], 1e-6, 1e-4);
        dt_free(b);
        dt_compressor_destroy(c);
    }
    dt_free(x);
    dt_free(y);
    dt_free(z);
}

/* Every codec encodes and decodes to the same bytes with or without SIMD. */
/* dt_compressor_set_k: after it, top-k encodes exactly as a compressor
 * created with that k and given the same residual (bit for bit), and the
 * encoded size follows; other codecs and k out of [1, n] are refused;
 * dt_callreduce_set_fraction does the same for a run and its wire bytes. */
static void test_topk_set_k(void) {
    enum { NV = 3000 };
    float g[NV];
    dt_codec_spec a = spec_of("topk:10"), b = spec_of("topk:25");
    dt_compressor *ca, *cb;
    ASSERT_OK(dt_compressor_create(&ca, &a, NV, NULL));
    ASSERT_OK(dt_compressor_create(&cb, &b, NV, NULL));
    uint8_t ea[32 + 8 * 300], eb[32 + 8 * 300];
    size_t ua, ub;
    for (int step = 0; step < 6; step++) {
        for (int i = 0; i < NV; i++)
            g[i] = (float)(((i * 7919 + step * 104729) % 2001) - 1000);
        if (step == 2) { /* from here on, ca is cb */
            ASSERT_OK(dt_compressor_set_k(ca, 25));
            ASSERT_OK(
                dt_compressor_set_residual(cb, dt_compressor_residual(ca), NV * sizeof(float)));
        }
        if (step == 4) {
            ASSERT_OK(dt_compressor_set_k(ca, 300));
            ASSERT_OK(dt_compressor_set_k(cb, 300));
        }
        ASSERT_OK(dt_compressor_compress(ca, g, (uint64_t)step, ea, sizeof ea, &ua));
        ASSERT_OK(dt_compressor_compress(cb, g, (uint64_t)step, eb, sizeof eb, &ub));
        size_t k = step < 2 ? 10 : step < 4 ? 25 : 300;
        ASSERT_EQ(ua, 32 + 8 * k);
        ASSERT_EQ(dt_compressor_encoded_bytes(ca), ua);
        if (step >= 2) {
            ASSERT_EQ(ua, ub);
            ASSERT_EQ(memcmp(ea, eb, ua), 0);
            ASSERT_EQ(
                memcmp(dt_compressor_residual(ca), dt_compressor_residual(cb), NV * sizeof(float)),
                0);
        }
    }
    ASSERT_EQ(dt_compressor_set_k(ca, 0), DT_ERR_INVALID);
    ASSERT_EQ(dt_compressor_set_k(ca, NV + 1), DT_ERR_INVALID);
    dt_compressor_destroy(ca);
    dt_compressor_destroy(cb);
    dt_codec_spec i8 = spec_of("int8");
    ASSERT_OK(dt_compressor_create(&ca, &i8, NV, NULL));
    ASSERT_EQ(dt_compressor_set_k(ca, 5), DT_ERR_INVALID);
    dt_compressor_destroy(ca);

    /* One-process compressed allreduce: a larger density grows the buffer. */
    dt_callreduce *cc;
    dt_codec_spec f = spec_of("topk:0.01");
    ASSERT_OK(dt_callreduce_create(&cc, NULL, &f, NV, NULL));
    ASSERT_OK(dt_callreduce_set_fraction(cc, 0.25));
    for (int i = 0; i < NV; i++)
        g[i] = (float)(i % 17) - 8.0f;
    ASSERT_OK(dt_callreduce_run(cc, g, 0));
    int kept = 0;
    for (int i = 0; i < NV; i++)
        kept += g[i] != 0.0f;
    ASSERT_EQ(kept, 750);
    ASSERT_OK(dt_callreduce_set_fraction(cc, 0)); /* back to the spec's k */
    ASSERT_EQ(dt_callreduce_set_fraction(cc, 1.5), DT_ERR_INVALID);
    dt_callreduce_destroy(cc);
    ASSERT_OK(dt_callreduce_create(&cc, NULL, &i8, NV, NULL));
    ASSERT_EQ(dt_callreduce_set_fraction(cc, 0.1), DT_ERR_INVALID);
    ASSERT_OK(dt_callreduce_set_fraction(cc, 0)); /* "the codec's own k": fine for any */
    dt_callreduce_destroy(cc);
}

static void test_simd_scalar_identical(void) {
    static const char *const specs[] = {"fp16", "bf16",      "int8",       "qsgd:3",
                                        "sign", "topk:0.02", "randk:0.02", "powersgd:2"};
    const size_t n = 40 * 103; /* a partial block, SIMD tails, a 40 x 103 matrix */
    float *x = falloc(n), *ya = falloc(n), *yb = falloc(n);
    fill_normal(x, n, 2.0f, 800);
    for (size_t i = 0; i < n; i += 97)
        x[i] = 0; /* zeros, and ties for top-k */
    for (size_t s = 0; s < sizeof specs / sizeof specs[0]; s++) {
        dt_codec_spec spec = spec_of(specs[s]);
        dt_compressor_config cfg = dt_compressor_config_default();
        cfg.ef = DT_EF_OFF;
        cfg.rows = 40;
        cfg.cols = 103;
        dt_compressor *c, *c2; /* two: PowerSGD's warm start is state */
        ASSERT_OK(dt_compressor_create(&c, &spec, n, &cfg));
        ASSERT_OK(dt_compressor_create(&c2, &spec, n, &cfg));
        size_t cap = dt_compressor_encoded_bytes(c), used;
        uint8_t *a = dt_alloc(cap), *b = dt_alloc(cap);
        dt__compress_scalar_only = false;
        ASSERT_OK(dt_compressor_compress(c, x, 3, a, cap, &used));
        ASSERT_OK(dt_codec_decode(a, cap, n, ya, DT_DECODE_SET));
        dt__compress_scalar_only = true;
        ASSERT_OK(dt_compressor_compress(c2, x, 3, b, cap, &used));
        ASSERT_OK(dt_codec_decode(b, cap, n, yb, DT_DECODE_SET));
        dt__compress_scalar_only = false;
        if (memcmp(a, b, cap) != 0)
            TEST_FAILF("%s: SIMD and scalar encodings differ", specs[s]);
        if (memcmp(ya, yb, n * sizeof(float)) != 0)
            TEST_FAILF("%s: SIMD and scalar decodings differ", specs[s]);
        dt_free(a);
        dt_free(b);
        dt_compressor_destroy(c);
        dt_compressor_destroy(c2);
    }
    dt_free(x);
    dt_free(ya);
    dt_free(yb);
}

int main(void) {
    RUN(test_parse);
    RUN(test_env_knobs);
    RUN(test_info);
    RUN(test_sizes);
    RUN(test_empty_and_tiny);
    RUN(test_fp16_simd_matches_scalar);
    RUN(test_fp16_bound);
    RUN(test_bf16_bound);
    RUN(test_int8_bound);
    RUN(test_philox_fill_matches_dt_rng);
    RUN(test_tiny_blocks);
    RUN(test_huge_blocks);
    RUN(test_qsgd_wire_format);
    RUN(test_qsgd_bound_and_reproducible);
    RUN(test_qsgd_unbiased);
    RUN(test_sign);
    RUN(test_topk_matches_sort);
    RUN(test_topk_set_k);
    RUN(test_randk);
    RUN(test_error_feedback_conserves_mass);
    RUN(test_fused_ef_matches_generic);
    RUN(test_ef_defaults_and_residual_io);
    RUN(test_powersgd_exact_low_rank);
    RUN(test_powersgd_warm_start_converges);
    RUN(test_powersgd_staged);
    RUN(test_powersgd_bucket);
    RUN(test_pytorch_reference);
    RUN(test_state_resume);
    RUN(test_corrupt_rejected);
    RUN(test_forged_headers);
    RUN(test_forged_indices);
    RUN(test_decode_add);
    RUN(test_simd_scalar_identical);
    /* Again through the portable scalar code (what a CPU without F16C or
     * AVX-512 runs): same bounds, same exact results. */
    dt__compress_scalar_only = true;
    RUN(test_philox_fill_matches_dt_rng);
    RUN(test_fp16_bound);
    RUN(test_qsgd_bound_and_reproducible);
    RUN(test_qsgd_unbiased);
    RUN(test_sign);
    RUN(test_topk_matches_sort);
    RUN(test_topk_set_k);
    RUN(test_error_feedback_conserves_mass);
    RUN(test_pytorch_reference);
    RUN(test_corrupt_rejected);
    RUN(test_forged_headers);
    RUN(test_decode_add);
    dt__compress_scalar_only = false;
    return TEST_SUMMARY();
}
