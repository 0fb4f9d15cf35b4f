/*
 * reference.h — the serial reference the collective tests compare against:
 * integer-valued inputs (exact in every dtype, f16 and bf16 included), the
 * reduction over ranks computed in int64 and wrapped like the dtype, and an
 * element check that allows AVG's final division 2 ulps.
 */
#ifndef DTRAIN_TEST_COMM_REFERENCE_H
#define DTRAIN_TEST_COMM_REFERENCE_H

#include "dtrain/comm.h"
#include "test.h"

static uint64_t mix(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static bool is_float(dt_dtype d) { return d <= DT_BF16; }

/* integer-valued input of rank r at index i */
static int64_t gen(int r, size_t i, uint64_t salt, dt_dtype dt, dt_redop op) {
    uint64_t h = mix(salt ^ mix((uint64_t)r * 1000003u + i));
    if (op == DT_PROD)
        return dt == DT_U8 ? (int64_t)(1 + h % 2) : (int64_t[]){1, -1, 2}[h % 3];
    if (dt == DT_U8)
        return (int64_t)(h % 5);
    return (int64_t)(h % 9) - 4;
}

static uint16_t to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7fffu + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}
static float from_bf16(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static void put(void *buf, dt_dtype dt, size_t i, double v) {
    switch (dt) {
    case DT_F32: ((float *)buf)[i] = (float)v; break;
    case DT_F64: ((double *)buf)[i] = v; break;
    case DT_F16: ((_Float16 *)buf)[i] = (_Float16)v; break;
    case DT_BF16: ((uint16_t *)buf)[i] = to_bf16((float)v); break;
    case DT_I8: ((int8_t *)buf)[i] = (int8_t)(int64_t)v; break;
    case DT_U8: ((uint8_t *)buf)[i] = (uint8_t)(int64_t)v; break;
    case DT_I32: ((int32_t *)buf)[i] = (int32_t)(int64_t)v; break;
    case DT_I64: ((int64_t *)buf)[i] = (int64_t)v; break;
    default: abort();
    }
}

static double get(const void *buf, dt_dtype dt, size_t i) {
    switch (dt) {
    case DT_F32: return ((const float *)buf)[i];
    case DT_F64: return ((const double *)buf)[i];
    case DT_F16: return (double)((const _Float16 *)buf)[i];
    case DT_BF16: return from_bf16(((const uint16_t *)buf)[i]);
    case DT_I8: return ((const int8_t *)buf)[i];
    case DT_U8: return ((const uint8_t *)buf)[i];
    case DT_I32: return ((const int32_t *)buf)[i];
    case DT_I64: return (double)((const int64_t *)buf)[i];
    default: abort();
    }
}

/* wrap an exact integer into the dtype's range (two's complement) */
static int64_t wrap(int64_t v, dt_dtype dt) {
    switch (dt) {
    case DT_I8: return (int8_t)v;
    case DT_U8: return (uint8_t)v;
    case DT_I32: return (int32_t)v;
    default: return v;
    }
}

/* reference reduction over ranks of gen(r, i) */
static double ref_reduce(int n, size_t i, uint64_t salt, dt_dtype dt, dt_redop op) {
    int64_t acc = gen(0, i, salt, dt, op);
    for (int r = 1; r < n; r++) {
        int64_t x = gen(r, i, salt, dt, op);
        switch (op) {
        case DT_SUM:
        case DT_AVG: acc = (int64_t)((uint64_t)acc + (uint64_t)x); break;
        case DT_PROD: acc = (int64_t)((uint64_t)acc * (uint64_t)x); break;
        case DT_MIN: acc = x < acc ? x : acc; break;
        case DT_MAX: acc = x > acc ? x : acc; break;
        default: abort();
        }
        if (!is_float(dt))
            acc = wrap(acc, dt);
    }
    if (op == DT_AVG) {
        if (is_float(dt))
            return (double)acc / n;
        return (double)(wrap(acc, dt) / n);
    }
    return (double)acc;
}

static double avg_tol(dt_dtype dt) {
    switch (dt) {
    case DT_F32: return 0x1p-22;
    case DT_F64: return 0x1p-51;
    case DT_F16: return 0x1p-9;
    case DT_BF16: return 0x1p-6;
    default: return 0;
    }
}

static void check_elem(const char *what, const void *buf, dt_dtype dt, size_t i, double want,
                       dt_redop op) {
    double got = get(buf, dt, i);
    double tol = op == DT_AVG ? avg_tol(dt) * fabs(want) : 0;
    if (!(fabs(got - want) <= tol))
        TEST_FAILF("%s: element %zu: got %.9g, want %.9g (tol %.3g)", what, i, got, want, tol);
}

#endif
