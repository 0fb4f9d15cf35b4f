/*
 * test_comm_kernels.c — the reduction kernels against an independent scalar
 * reference, for every dtype and op, odd lengths (vector tails), all three
 * aliasing forms (out = a, out = b, disjoint) and unaligned pointers; the
 * 16-bit conversions (round to nearest even) and AVG scaling.
 */
#include "dtrain/comm.h"
#include "test.h"

#include "comm/comm_internal.h"

static float ref_bf16(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* round-to-nearest-even f32 -> bf16, written differently from reduce.c:
 * compare the discarded half against the halfway point */
static uint16_t ref_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t hi = u >> 16, lo = u & 0xffff;
    if (lo > 0x8000 || (lo == 0x8000 && (hi & 1)))
        hi++;
    return (uint16_t)hi;
}

static double load(const void *p, dt_dtype d, size_t i) {
    switch (d) {
    case DT_F32: return ((const float *)p)[i];
    case DT_F64: return ((const double *)p)[i];
    case DT_F16: return (double)((const _Float16 *)p)[i];
    case DT_BF16: return ref_bf16(((const uint16_t *)p)[i]);
    case DT_I8: return ((const int8_t *)p)[i];
    case DT_U8: return ((const uint8_t *)p)[i];
    case DT_I32: return ((const int32_t *)p)[i];
    case DT_I64: return (double)((const int64_t *)p)[i];
    default: abort();
    }
}

/* one reference element: combine in f32 for 16-bit floats (as documented),
 * natively for the others, integers wrapping */
static void ref_elem(void *out, const void *a, const void *b, size_t i, dt_dtype d, dt_redop op) {
#define R(T, U)                                                                                    \
    do {                                                                                           \
        T x = ((const T *)a)[i], y = ((const T *)b)[i], r;                                         \
        switch (op) {                                                                              \
        case DT_PROD: r = (T)((U)x * (U)y); break;                                                 \
        case DT_MIN: r = x < y ? x : y; break;                                                     \
        case DT_MAX: r = x > y ? x : y; break;                                                     \
        default: r = (T)((U)x + (U)y); break;                                                      \
        }                                                                                          \
        ((T *)out)[i] = r;                                                                         \
    } while (0)
    switch (d) {
    case DT_F32: R(float, float); break;
    case DT_F64: R(double, double); break;
    case DT_I8: R(int8_t, uint8_t); break;
    case DT_U8: R(uint8_t, uint8_t); break;
    case DT_I32: R(int32_t, uint32_t); break;
    case DT_I64: R(int64_t, uint64_t); break;
    case DT_F16:
    case DT_BF16: {
        float x = (float)load(a, d, i), y = (float)load(b, d, i), r;
        switch (op) {
        case DT_PROD: r = x * y; break;
        case DT_MIN: r = x < y ? x : y; break;
        case DT_MAX: r = x > y ? x : y; break;
        default: r = x + y; break;
        }
        if (d == DT_F16)
            ((_Float16 *)out)[i] = (_Float16)r;
        else
            ((uint16_t *)out)[i] = ref_to_bf16(r);
        break;
    }
    default: abort();
    }
#undef R
}

static void fill_random(void *p, dt_dtype d, size_t n, dt_rng *rng) {
    for (size_t i = 0; i < n; i++) {
        float f = (dt_rng_uniform(rng) - 0.5f) * 64.0f;
        uint32_t u = dt_rng_u32(rng);
        switch (d) {
        case DT_F32: ((float *)p)[i] = f; break;
        case DT_F64: ((double *)p)[i] = (double)f * 1.000000123; break;
        case DT_F16: ((_Float16 *)p)[i] = (_Float16)f; break;
        case DT_BF16: ((uint16_t *)p)[i] = ref_to_bf16(f); break;
        case DT_I8: ((int8_t *)p)[i] = (int8_t)u; break;
        case DT_U8: ((uint8_t *)p)[i] = (uint8_t)u; break;
        case DT_I32: ((int32_t *)p)[i] = (int32_t)u; break;
        case DT_I64: ((int64_t *)p)[i] = (int64_t)(((uint64_t)u << 32) | dt_rng_u32(rng)); break;
        default: abort();
        }
    }
}

static void test_kernels(void) {
    dt_rng rng;
    dt_rng_init(&rng, 7, dt_rng_stream_id(0, 0, DT_RNG_TEST));
    static const size_t lens[] = {0, 1, 3, 15, 16, 17, 63, 64, 65, 1000, 4099};
    for (int d = 0; d < DT_DTYPE_COUNT; d++)
        for (int op = 0; op < DT_REDOP_COUNT; op++)
            for (size_t li = 0; li < sizeof lens / sizeof *lens; li++) {
                size_t n = lens[li], es = dt_dtype_size((dt_dtype)d);
                /* +8 bytes: start one element in, so vectors are unaligned */
                char *a = malloc((n + 2) * es), *b = malloc((n + 2) * es);
                char *o = malloc((n + 2) * es), *r = malloc((n + 2) * es);
                char *ca = malloc((n + 2) * es);
                fill_random(a, (dt_dtype)d, n + 2, &rng);
                fill_random(b, (dt_dtype)d, n + 2, &rng);
                for (size_t i = 0; i < n; i++)
                    ref_elem(r + es, a + es, b + es, i, (dt_dtype)d, (dt_redop)op);
                for (int form = 0; form < 3; form++) {
                    memcpy(ca, a, (n + 2) * es);
                    char *out = form == 0 ? o : form == 1 ? ca : b;
                    char *bb = form == 2 ? malloc((n + 2) * es) : b;
                    if (form == 2) { /* out aliases b: keep a pristine copy of b */
                        memcpy(bb, b, (n + 2) * es);
                        out = bb;
                    }
                    dt_reduce(out + es, ca + es, bb + es, n, (dt_dtype)d, (dt_redop)op);
                    if (memcmp(out + es, r + es, n * es) != 0) {
                        for (size_t i = 0; i < n; i++)
                            if (memcmp(out + es + i * es, r + es + i * es, es) != 0)
                                TEST_FAILF("%s %s n=%zu form %d: element %zu = %.9g, want %.9g",
                                           dt_dtype_name((dt_dtype)d), dt_redop_name((dt_redop)op),
                                           n, form, i, load(out + es, (dt_dtype)d, i),
                                           load(r + es, (dt_dtype)d, i));
                    }
                    if (form == 2)
                        free(bb);
                }
                free(a);
                free(b);
                free(o);
                free(r);
                free(ca);
            }
}

static void test_bf16_rounding(void) {
    /* 1 + 2^-8 is halfway between bf16 1 and 1 + 2^-7: ties to even (1) */
    uint16_t a = ref_to_bf16(1.0f), b = ref_to_bf16(0x1p-8f), o;
    dt_reduce(&o, &a, &b, 1, DT_BF16, DT_SUM);
    ASSERT_EQ(o, 0x3f80);
    /* 1 + 3*2^-8 is halfway between 1+2^-7 (odd) and 1+2^-6: goes up */
    a = ref_to_bf16(1.0f + 0x1p-7f);
    dt_reduce(&o, &a, &b, 1, DT_BF16, DT_SUM);
    ASSERT_EQ(o, 0x3f82);
    _Float16 h1 = (_Float16)2048.0f, h2 = (_Float16)1.0f, ho;
    dt_reduce(&ho, &h1, &h2, 1, DT_F16, DT_SUM); /* 2049 -> ties to even 2048 */
    ASSERT_EQ((int)(float)ho, 2048);
}

static void test_avg_scale(void) {
    int32_t v[3] = {7, -7, 9};
    dt__scale_avg(v, 3, DT_I32, 2);
    ASSERT_EQ(v[0], 3);
    ASSERT_EQ(v[1], -3); /* truncation toward zero, as documented */
    ASSERT_EQ(v[2], 4);
    float f[2] = {3, 1};
    dt__scale_avg(f, 2, DT_F32, 4);
    ASSERT_NEAR(f[0], 0.75, 0, 0);
    uint16_t bf = ref_to_bf16(6.0f);
    dt__scale_avg(&bf, 1, DT_BF16, 3);
    ASSERT_EQ(bf, ref_to_bf16(2.0f));
}

static void test_names(void) {
    dt_dtype d;
    ASSERT_OK(dt_dtype_parse("bf16", &d));
    ASSERT_EQ(d, DT_BF16);
    ASSERT_STATUS(dt_dtype_parse("f8", &d), DT_ERR_INVALID);
    ASSERT_CONTAINS(dt_last_error(), "f8");
    ASSERT_EQ(dt_dtype_size(DT_I64), 8);
    ASSERT_EQ(dt_dtype_size((dt_dtype)42), 0);
    ASSERT_STREQ(dt_redop_name(DT_AVG), "avg");
    ASSERT_STREQ(dt_algo_name(DT_ALGO_HIER), "hier");
    ASSERT_STREQ(dt_coll_name(DT_COLL_REDUCE_SCATTER), "reduce_scatter");
}

int main(void) {
    RUN(test_kernels);
    RUN(test_bf16_rounding);
    RUN(test_avg_scale);
    RUN(test_names);
    return TEST_SUMMARY();
}
