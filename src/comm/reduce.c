/*
 * reduce.c — element-wise reduction kernels for every dtype and op, and the
 * dtype/op/algorithm name tables.
 *
 * Each (dtype, op) pair is one simple loop the compiler vectorises; the
 * loops are compiled three times (AVX-512, AVX2+F16C, baseline) with
 * target_clones and the loader picks the best for the CPU it runs on, so a
 * portable build still gets the wide paths. 16-bit floats are widened to
 * f32, combined, and rounded back to nearest-even once per call: a ring or
 * tree therefore rounds once per step, which the tests' bounds account for.
 * Integer sums wrap modulo 2^bits (two's complement, computed unsigned so
 * the overflow is defined); AVG reduces as SUM here, group.c divides once.
 */
#include "comm_internal.h"

#include <string.h>

/* clang-format off */
static const size_t dtype_sizes[DT_DTYPE_COUNT] = {4, 8, 2, 2, 1, 1, 4, 8};
static const char *const dtype_names[DT_DTYPE_COUNT] =
    {"f32", "f64", "f16", "bf16", "i8", "u8", "i32", "i64"};
static const char *const redop_names[DT_REDOP_COUNT] = {"sum", "avg", "prod", "min", "max"};
static const char *const algo_names[DT_ALGO_COUNT] =
    {"auto", "ring", "rhd", "tree", "direct", "hier", "torus2d", "ordered"};
static const char *const coll_names[DT_COLL_COUNT] =
    {"allreduce", "reduce_scatter", "allgather", "broadcast", "reduce", "gather", "scatter",
     "alltoall", "barrier", "send", "recv", "sendrecv_batch"};
/* clang-format on */
_Static_assert(sizeof dtype_names / sizeof *dtype_names == DT_DTYPE_COUNT, "dtype table");
_Static_assert(sizeof redop_names / sizeof *redop_names == DT_REDOP_COUNT, "redop table");
_Static_assert(sizeof algo_names / sizeof *algo_names == DT_ALGO_COUNT, "algo table");
_Static_assert(sizeof coll_names / sizeof *coll_names == DT_COLL_COUNT, "coll table");

size_t dt_dtype_size(dt_dtype d) { return (unsigned)d < DT_DTYPE_COUNT ? dtype_sizes[d] : 0; }
const char *dt_dtype_name(dt_dtype d) {
    return (unsigned)d < DT_DTYPE_COUNT ? dtype_names[d] : "?";
}
const char *dt_redop_name(dt_redop op) {
    return (unsigned)op < DT_REDOP_COUNT ? redop_names[op] : "?";
}
const char *dt_algo_name(dt_algo a) { return (unsigned)a < DT_ALGO_COUNT ? algo_names[a] : "?"; }
const char *dt_coll_name(dt_coll c) { return (unsigned)c < DT_COLL_COUNT ? coll_names[c] : "?"; }

dt_status dt_dtype_parse(const char *text, dt_dtype *out) {
    for (int i = 0; i < DT_DTYPE_COUNT; i++)
        if (text && strcmp(text, dtype_names[i]) == 0) {
            *out = (dt_dtype)i;
            return DT_OK;
        }
    return dt_error_set(DT_ERR_INVALID, "unknown dtype \"%s\" (f32 f64 f16 bf16 i8 u8 i32 i64)",
                        text ? text : "(null)");
}

/* ------------------------------------------------------------------------ */
/* 16-bit float conversions                                                 */
/* ------------------------------------------------------------------------ */

static inline float bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint16_t f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) /* NaN: keep it a quiet NaN */
        return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1); /* round to nearest even */
    return (uint16_t)(u >> 16);
}

#if defined(__SANITIZE_THREAD__)
/* TSan instruments the ifunc resolvers target_clones generates, and they
 * run before TSan is initialised: plain functions under TSan. */
#define KERNEL_TARGETS
#else
#define KERNEL_TARGETS __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#endif

/* ------------------------------------------------------------------------ */
/* Kernels: out = a op b                                                    */
/* ------------------------------------------------------------------------ */

/* Two forms per (type, op): o = a op b on disjoint arrays, and o = o op b
 * in place; out == b is handled by swapping (every op is commutative). Both
 * keep `restrict` truthful, so the compiler vectorises without runtime
 * overlap checks. */
#define DEFINE_OP(name, T, U, EXPR)                                                                \
    KERNEL_TARGETS static void name##3(T *restrict o, const T *restrict a, const T *restrict b,    \
                                       size_t n) {                                                 \
        for (size_t i = 0; i < n; i++) {                                                           \
            T x = a[i], y = b[i];                                                                  \
            o[i] = (EXPR);                                                                         \
        }                                                                                          \
    }                                                                                              \
    KERNEL_TARGETS static void name##2(T *restrict o, const T *restrict b, size_t n) {             \
        for (size_t i = 0; i < n; i++) {                                                           \
            T x = o[i], y = b[i];                                                                  \
            o[i] = (EXPR);                                                                         \
        }                                                                                          \
    }

#define DEFINE_KERNELS(name, T, U)                                                                 \
    DEFINE_OP(name##_sum, T, U, (T)((U)x + (U)y))                                                  \
    DEFINE_OP(name##_prod, T, U, (T)((U)x * (U)y))                                                 \
    DEFINE_OP(name##_min, T, U, y < x ? y : x)                                                     \
    DEFINE_OP(name##_max, T, U, y > x ? y : x)

/* Floats combine in their own type; integers go through the unsigned type
 * of the same width so that wrap-around is defined behaviour. */
DEFINE_KERNELS(k_f32, float, float)
DEFINE_KERNELS(k_f64, double, double)
DEFINE_KERNELS(k_i8, int8_t, uint8_t)
DEFINE_KERNELS(k_u8, uint8_t, uint8_t)
DEFINE_KERNELS(k_i32, int32_t, uint32_t)
DEFINE_KERNELS(k_i64, int64_t, uint64_t)

/* f16 via _Float16: with F16C/AVX-512 the conversions are vcvtph2ps/ps2ph,
 * which round to nearest even. bf16 widens by a shift and narrows with
 * integer round-to-nearest-even, which vectorises on any x86. */
#define F16(v) ((float)(v))
DEFINE_OP(k_f16_sum, _Float16, float, (_Float16)(F16(x) + F16(y)))
DEFINE_OP(k_f16_prod, _Float16, float, (_Float16)(F16(x) * F16(y)))
DEFINE_OP(k_f16_min, _Float16, float, F16(y) < F16(x) ? y : x)
DEFINE_OP(k_f16_max, _Float16, float, F16(y) > F16(x) ? y : x)
#define BF(v) bf16_to_f32(v)
DEFINE_OP(k_bf16_sum, uint16_t, float, f32_to_bf16(BF(x) + BF(y)))
DEFINE_OP(k_bf16_prod, uint16_t, float, f32_to_bf16(BF(x) * BF(y)))
DEFINE_OP(k_bf16_min, uint16_t, float, BF(y) < BF(x) ? y : x)
DEFINE_OP(k_bf16_max, uint16_t, float, BF(y) > BF(x) ? y : x)

#define CALL(fn, T)                                                                                \
    do {                                                                                           \
        if (out == a)                                                                              \
            fn##2((T *)out, (const T *)b, count);                                                  \
        else if (out == b)                                                                         \
            fn##2((T *)out, (const T *)a, count);                                                  \
        else                                                                                       \
            fn##3((T *)out, (const T *)a, (const T *)b, count);                                    \
    } while (0)

#define DISPATCH(name, T)                                                                          \
    switch (op) {                                                                                  \
    case DT_SUM:                                                                                   \
    case DT_AVG: CALL(name##_sum, T); break;                                                       \
    case DT_PROD: CALL(name##_prod, T); break;                                                     \
    case DT_MIN: CALL(name##_min, T); break;                                                       \
    case DT_MAX: CALL(name##_max, T); break;                                                       \
    default: DT_ASSERT(!"bad redop");                                                              \
    }

void dt_reduce(void *out, const void *a, const void *b, size_t count, dt_dtype dtype, dt_redop op) {
    DT_ASSERT((unsigned)op < DT_REDOP_COUNT);
    switch (dtype) {
    case DT_F32: DISPATCH(k_f32, float); break;
    case DT_F64: DISPATCH(k_f64, double); break;
    case DT_I8: DISPATCH(k_i8, int8_t); break;
    case DT_U8: DISPATCH(k_u8, uint8_t); break;
    case DT_I32: DISPATCH(k_i32, int32_t); break;
    case DT_I64: DISPATCH(k_i64, int64_t); break;
    case DT_F16: DISPATCH(k_f16, _Float16); break;
    case DT_BF16: DISPATCH(k_bf16, uint16_t); break;
    default: DT_ASSERT(!"bad dtype");
    }
}

void dt__scale_avg(void *buf, size_t n, dt_dtype dtype, int ranks) {
    switch (dtype) {
    case DT_F32: {
        float *p = buf, s = 1.0f / (float)ranks;
        for (size_t i = 0; i < n; i++)
            p[i] *= s;
        break;
    }
    case DT_F64: {
        double *p = buf, s = 1.0 / ranks;
        for (size_t i = 0; i < n; i++)
            p[i] *= s;
        break;
    }
    case DT_F16: {
        _Float16 *p = buf;
        for (size_t i = 0; i < n; i++)
            p[i] = (_Float16)((float)p[i] / (float)ranks);
        break;
    }
    case DT_BF16: {
        uint16_t *p = buf;
        for (size_t i = 0; i < n; i++)
            p[i] = f32_to_bf16(bf16_to_f32(p[i]) / (float)ranks);
        break;
    }
    case DT_I8: {
        int8_t *p = buf;
        for (size_t i = 0; i < n; i++)
            p[i] = (int8_t)(p[i] / ranks);
        break;
    }
    case DT_U8: {
        uint8_t *p = buf;
        for (size_t i = 0; i < n; i++)
            p[i] = (uint8_t)(p[i] / ranks);
        break;
    }
    case DT_I32: {
        int32_t *p = buf;
        for (size_t i = 0; i < n; i++)
            p[i] = p[i] / ranks;
        break;
    }
    case DT_I64: {
        int64_t *p = buf;
        for (size_t i = 0; i < n; i++)
            p[i] = p[i] / ranks;
        break;
    }
    default: DT_ASSERT(!"bad dtype");
    }
}
