/*
 * test_amp_gemm.c — the bf16 multiply on every backend, every op (NN, NT,
 * TN, TT), both output types, with and without accumulation, on odd shapes
 * (1, 7, 33, 1000 and shapes that cross the kernels' 12-row, 32-column and
 * 256-k blocks; 17x40x700 keeps the AMX kernel in its column-panel order
 * with several k blocks, the larger ones take its B-resident order), at
 * every ISA level this CPU has.
 *
 * Two checks per case, against a float64 reference:
 *   - integer-valued inputs in [-4, 4]: every partial sum is an integer below
 *     2^24, so fp32 accumulation is exact and the result must match to the
 *     bit (after one round-to-nearest-even to bf16 for bf16 output);
 *   - random inputs in [-1, 1]: |C - ref| <= K * 2^-24 * sum_k |a_k b_k|
 *     (+ 2^-24 |C_old| when accumulating), the classic bound for K fp32
 *     additions (each bf16 x bf16 product is exact in fp32), plus 2^-8 |ref|
 *     for the final rounding to bf16. A second check starts from fp32 inputs
 *     and adds their rounding to bf16: each product is off by at most
 *     2^-7 + 2^-16 relative.
 *
 * Without DT_ISA the levels are tried from the top down in this process
 * (oneDNN fixes its ISA at first use, so it runs at the top level here);
 * tests/amp.cmake runs this program again under DT_ISA=<level> for each
 * lower level, which is how oneDNN's fallbacks are covered. A level above
 * the CPU's gives exit code 77 (skipped).
 */
#include "dtrain/amp.h"
#include "test.h"

typedef struct shape {
    int M, N, K;
} shape;

static const shape shapes[] = {
    {1, 1, 1},     {7, 33, 1},   {1, 1000, 7},  {33, 7, 1000},
    {1000, 33, 7}, {13, 70, 65}, {40, 64, 600}, {17, 40, 700},
};
#define NSHAPES (int)(sizeof shapes / sizeof shapes[0])

static const char *op_names[] = {"NN", "NT", "TN", "TT"};

static dt_bf16 *make_bf16(size_t n, bool integers, dt_rng *r, float *orig) {
    dt_bf16 *x = malloc(n * sizeof *x);
    ASSERT_TRUE(x);
    for (size_t i = 0; i < n; i++) {
        float v = integers ? (float)((int)dt_rng_below(r, 9) - 4) : 2.0f * dt_rng_uniform(r) - 1.0f;
        if (orig)
            orig[i] = v;
        x[i] = dt_bf16_from_f32(v);
    }
    return x;
}

/* ref = sum_k a(i,k) b(k,j) in float64, and sum_k |a b| for the bound. */
static void reference(dt_gemm_op op, shape s, const float *A, const float *B, double *ref,
                      double *absref) {
    bool ta = op == DT_GEMM_TN || op == DT_GEMM_TT, tb = op == DT_GEMM_NT || op == DT_GEMM_TT;
    for (int i = 0; i < s.M; i++)
        for (int j = 0; j < s.N; j++) {
            double acc = 0, aacc = 0;
            for (int k = 0; k < s.K; k++) {
                double a = ta ? A[(size_t)k * s.M + i] : A[(size_t)i * s.K + k];
                double b = tb ? B[(size_t)j * s.K + k] : B[(size_t)k * s.N + j];
                acc += a * b;
                aacc += fabs(a * b);
            }
            ref[(size_t)i * s.N + j] = acc;
            absref[(size_t)i * s.N + j] = aacc;
        }
}

static long long cases_run;

static void check_backend(dt_gemm_backend be, bool integers) {
    dt_rng r;
    dt_rng_init(&r, 42, dt_rng_stream_id(0, integers, DT_RNG_TEST));
    for (int si = 0; si < NSHAPES; si++) {
        shape s = shapes[si];
        size_t na = (size_t)s.M * s.K, nb = (size_t)s.K * s.N, nc = (size_t)s.M * s.N;
        float *a32 = malloc(na * 4), *b32 = malloc(nb * 4), *a16f = malloc(na * 4),
              *b16f = malloc(nb * 4);
        ASSERT_TRUE(a32 && b32 && a16f && b16f);
        dt_bf16 *A = make_bf16(na, integers, &r, a32), *B = make_bf16(nb, integers, &r, b32);
        dt_bf16_to_f32(a16f, A, na);
        dt_bf16_to_f32(b16f, B, nb);
        dt_bf16 *c0 = make_bf16(nc, integers, &r, NULL); /* previous C, for accumulate */
        double *ref = malloc(nc * 8), *absref = malloc(nc * 8), *ref32 = malloc(nc * 8),
               *absref32 = malloc(nc * 8);
        float *cf = malloc(nc * 4);
        dt_bf16 *cb = malloc(nc * 2);
        ASSERT_TRUE(ref && absref && ref32 && absref32 && cf && cb);
        for (int op = 0; op < DT_GEMM_OP_COUNT; op++) {
            /* The same buffers read as (M,K) or (K,M): the reference follows op. */
            reference((dt_gemm_op)op, s, a16f, b16f, ref, absref);
            if (!integers)
                reference((dt_gemm_op)op, s, a32, b32, ref32, absref32);
            for (int out = 0; out < DT_GEMM_OUT_COUNT; out++) {
                for (int acc = 0; acc <= 1; acc++) {
                    void *C = out == DT_GEMM_OUT_F32 ? (void *)cf : (void *)cb;
                    for (size_t i = 0; i < nc; i++) {
                        cf[i] = dt_f32_from_bf16(c0[i]);
                        cb[i] = c0[i];
                    }
                    ASSERT_OK(dt_gemm_bf16_with(be, (dt_gemm_op)op, s.M, s.N, s.K, A, B, C,
                                                (dt_gemm_out)out, acc));
                    cases_run++;
                    for (size_t i = 0; i < nc; i++) {
                        double old = acc ? dt_f32_from_bf16(c0[i]) : 0.0;
                        double want = ref[i] + old;
                        double got = out == DT_GEMM_OUT_F32 ? cf[i] : dt_f32_from_bf16(cb[i]);
                        double tol, tol32 = 0;
                        if (integers) {
                            tol = 0;
                            if (out == DT_GEMM_OUT_BF16)
                                want = dt_f32_from_bf16(dt_bf16_from_f32((float)want));
                        } else {
                            double t = s.K * 0x1p-24 * absref[i] + 0x1p-24 * fabs(old);
                            double rnd = out == DT_GEMM_OUT_BF16 ? 0x1p-8 * (fabs(want) + t) : 0;
                            tol = t + rnd;
                            tol32 = tol + (0x1p-7 + 0x1p-16) * absref32[i];
                        }
                        if (!(fabs(got - want) <= tol) ||
                            (!integers && !(fabs(got - (ref32[i] + old)) <= tol32)))
                            TEST_FAILF("%s isa %s %s out=%s acc=%d M=%d N=%d K=%d [%zu,%zu]: "
                                       "got %.9g want %.9g (tol %.3g) fp32-input ref %.9g (tol "
                                       "%.3g)",
                                       dt_gemm_backend_name(be), dt_isa_name(dt_isa()),
                                       op_names[op], out ? "bf16" : "f32", acc, s.M, s.N, s.K,
                                       i / s.N, i % s.N, got, want, tol, ref32[i] + old, tol32);
                    }
                }
            }
        }
        free(a32), free(b32), free(a16f), free(b16f), free(A), free(B), free(c0);
        free(ref), free(absref), free(ref32), free(absref32), free(cf), free(cb);
    }
}

static bool forced; /* DT_ISA given: test that level only */

static void test_backends_all_levels(void) {
    dt_isa_level top = dt_isa();
    for (int l = (int)top; l >= (forced ? (int)top : 0); l--) {
        ASSERT_OK(dt_isa_set((dt_isa_level)l));
        for (int be = DT_GEMM_REF; be < DT_GEMM_BACKEND_COUNT; be++) {
            char why[160];
            if (be == DT_GEMM_REF && l != (int)top)
                continue; /* plain C: one level is enough */
            if (!dt_gemm_backend_available((dt_gemm_backend)be, why, sizeof why)) {
                printf("  %-6s %-10s unavailable: %s\n", dt_isa_name(dt_isa()),
                       dt_gemm_backend_name((dt_gemm_backend)be), why);
                continue;
            }
            long long before = cases_run;
            check_backend((dt_gemm_backend)be, true);
            check_backend((dt_gemm_backend)be, false);
            printf("  %-6s %-10s %lld cases ok\n", dt_isa_name(dt_isa()),
                   dt_gemm_backend_name((dt_gemm_backend)be), cases_run - before);
        }
    }
    ASSERT_OK(dt_isa_set(top));
    dt_gemm_release();
}

static void test_errors_and_default(void) {
    dt_bf16 a[4] = {0}, b[4] = {0};
    float c[4];
    ASSERT_STATUS(dt_gemm_bf16(DT_GEMM_NN, 0, 2, 2, a, b, c, DT_GEMM_OUT_F32, false),
                  DT_ERR_INVALID);
    ASSERT_CONTAINS(dt_last_error(), "M=0");
    ASSERT_STATUS(dt_gemm_bf16(DT_GEMM_NN, 2, 2, 2, NULL, b, c, DT_GEMM_OUT_F32, false),
                  DT_ERR_INVALID);
    ASSERT_STATUS(dt_gemm_bf16(DT_GEMM_OP_COUNT, 2, 2, 2, a, b, c, DT_GEMM_OUT_F32, false),
                  DT_ERR_INVALID);
    dt_gemm_backend be;
    ASSERT_OK(dt_gemm_backend_parse("DT_GEMM_BACKEND", "onednn", &be));
    ASSERT_EQ(be, DT_GEMM_ONEDNN);
    ASSERT_STATUS(dt_gemm_backend_parse("DT_GEMM_BACKEND", "cublas", &be), DT_ERR_INVALID);
    ASSERT_CONTAINS(dt_last_error(), "cublas");
    dt_gemm_backend def = dt_gemm_backend_default();
    ASSERT_TRUE(def != DT_GEMM_AUTO && dt_gemm_backend_available(def, NULL, 0));
    printf("  default backend at %s: %s\n", dt_isa_name(dt_isa()), dt_gemm_backend_name(def));
    if (dt_isa() < DT_ISA_AVX512BF16) {
        ASSERT_STATUS(
            dt_gemm_bf16_with(DT_GEMM_AVX512, DT_GEMM_NN, 2, 2, 2, a, b, c, DT_GEMM_OUT_F32, 0),
            DT_ERR_UNSUPPORTED);
        ASSERT_CONTAINS(dt_last_error(), "avx512bf16");
    }
    /* The default path works, and works again after the caches are released. */
    a[0] = b[0] = dt_bf16_from_f32(3.0f);
    for (int rep = 0; rep < 2; rep++) {
        ASSERT_OK(dt_gemm_bf16(DT_GEMM_NN, 2, 2, 2, a, b, c, DT_GEMM_OUT_F32, false));
        ASSERT_EQ(c[0], 9.0f);
        ASSERT_EQ(c[3], 0.0f);
        dt_gemm_release();
    }
}

/* dt_gemm_f16 (widened to fp32, sgemm) on every level (the widening is
 * dispatched): integer inputs exact; random inputs within the fp32
 * accumulation bound, and within (2^-10 + 2^-22) sum |a b| more of the
 * product of the unrounded fp32 inputs (fp16 rounds each to 2^-11). */
static void test_f16_all_levels(void) {
    dt_isa_level top = dt_isa();
    for (int l = (int)top; l >= (forced ? (int)top : 0); l--) {
        ASSERT_OK(dt_isa_set((dt_isa_level)l));
        dt_rng r;
        dt_rng_init(&r, 5, dt_rng_stream_id(0, 0, DT_RNG_TEST));
        for (int si = 0; si < NSHAPES; si++) {
            shape s = shapes[si];
            size_t na = (size_t)s.M * s.K, nb = (size_t)s.K * s.N, nc = (size_t)s.M * s.N;
            float *a32 = malloc(na * 4), *b32 = malloc(nb * 4), *a16f = malloc(na * 4),
                  *b16f = malloc(nb * 4), *c = malloc(nc * 4), *c0 = malloc(nc * 4);
            dt_f16 *A = malloc(na * 2), *B = malloc(nb * 2);
            double *ref = malloc(nc * 8), *absref = malloc(nc * 8), *ref32 = malloc(nc * 8),
                   *absref32 = malloc(nc * 8);
            ASSERT_TRUE(a32 && b32 && a16f && b16f && c && c0 && A && B && ref && absref && ref32 &&
                        absref32);
            for (int integers = 1; integers >= 0; integers--) {
                for (size_t i = 0; i < na; i++)
                    a32[i] = integers ? (float)((int)dt_rng_below(&r, 9) - 4)
                                      : 2.0f * dt_rng_uniform(&r) - 1.0f;
                for (size_t i = 0; i < nb; i++)
                    b32[i] = integers ? (float)((int)dt_rng_below(&r, 9) - 4)
                                      : 2.0f * dt_rng_uniform(&r) - 1.0f;
                for (size_t i = 0; i < nc; i++)
                    c0[i] = (float)((int)dt_rng_below(&r, 9) - 4);
                dt_f32_to_f16(A, a32, na);
                dt_f32_to_f16(B, b32, nb);
                dt_f16_to_f32(a16f, A, na);
                dt_f16_to_f32(b16f, B, nb);
                for (int op = 0; op < DT_GEMM_OP_COUNT; op++) {
                    reference((dt_gemm_op)op, s, a16f, b16f, ref, absref);
                    reference((dt_gemm_op)op, s, a32, b32, ref32, absref32);
                    for (int acc = 0; acc <= 1; acc++) {
                        memcpy(c, c0, nc * 4);
                        ASSERT_OK(dt_gemm_f16((dt_gemm_op)op, s.M, s.N, s.K, A, B, c, acc));
                        for (size_t i = 0; i < nc; i++) {
                            double old = acc ? c0[i] : 0.0, want = ref[i] + old;
                            double tol =
                                integers ? 0 : s.K * 0x1p-24 * absref[i] + 0x1p-24 * fabs(old);
                            double tol32 = tol + (0x1p-10 + 0x1p-22) * absref32[i];
                            if (!(fabs(c[i] - want) <= tol) ||
                                (!integers && !(fabs(c[i] - (ref32[i] + old)) <= tol32)))
                                TEST_FAILF("f16 isa %s %s acc=%d M=%d N=%d K=%d [%zu]: got %.9g "
                                           "want %.9g (tol %.3g), fp32-input ref %.9g (tol %.3g)",
                                           dt_isa_name(dt_isa()), op_names[op], acc, s.M, s.N, s.K,
                                           i, (double)c[i], want, tol, ref32[i] + old, tol32);
                        }
                    }
                }
            }
            free(a32), free(b32), free(a16f), free(b16f), free(c), free(c0), free(A), free(B);
            free(ref), free(absref), free(ref32), free(absref32);
        }
        printf("  %-6s f16 (widened sgemm) ok\n", dt_isa_name(dt_isa()));
    }
    ASSERT_OK(dt_isa_set(top));
    float c1[1];
    dt_f16 one = 0x3c00;
    ASSERT_STATUS(dt_gemm_f16(DT_GEMM_NN, 1, 0, 1, &one, &one, c1, false), DT_ERR_INVALID);
    ASSERT_OK(dt_gemm_f16(DT_GEMM_TT, 1, 1, 1, &one, &one, c1, false));
    ASSERT_EQ(c1[0], 1.0f);
}

/* Several threads multiplying at once, through every backend, must each
 * get their own exact result (backends share packing buffers and caches
 * behind locks). Integer inputs: the result is exact. */
typedef struct worker {
    int seed;
    int failures;
} worker;

static void *worker_main(void *arg) {
    worker *w = arg;
    dt_rng r;
    dt_rng_init(&r, (uint64_t)w->seed, dt_rng_stream_id(0, 0, DT_RNG_TEST));
    int M = 17 + w->seed, N = 40 + 3 * w->seed, K = 70 + w->seed;
    dt_bf16 *A = make_bf16((size_t)M * K, true, &r, NULL);
    dt_bf16 *B = make_bf16((size_t)K * N, true, &r, NULL);
    float *C = malloc((size_t)M * N * 4), *R = malloc((size_t)M * N * 4);
    if (!C || !R) {
        w->failures++;
        return NULL;
    }
    if (dt_gemm_bf16_with(DT_GEMM_REF, DT_GEMM_NT, M, N, K, A, B, R, DT_GEMM_OUT_F32, false))
        w->failures++;
    for (int rep = 0; rep < 20; rep++) {
        dt_gemm_backend be =
            (dt_gemm_backend)(DT_GEMM_REF + 1 + (rep + w->seed) % (DT_GEMM_BACKEND_COUNT - 2));
        if (!dt_gemm_backend_available(be, NULL, 0))
            continue;
        if (dt_gemm_bf16_with(be, DT_GEMM_NT, M, N, K, A, B, C, DT_GEMM_OUT_F32, false) ||
            memcmp(C, R, (size_t)M * N * 4) != 0)
            w->failures++;
    }
    free(A), free(B), free(C), free(R);
    return NULL;
}

static void test_concurrent_callers(void) {
    enum { T = 4 };
    worker w[T];
    dt_thread *th[T];
    for (int t = 0; t < T; t++) {
        w[t] = (worker){.seed = t, .failures = 0};
        ASSERT_OK(dt_thread_create(&th[t], "gemm-test", worker_main, &w[t]));
    }
    for (int t = 0; t < T; t++) {
        dt_thread_join(th[t]);
        ASSERT_EQ(w[t].failures, 0);
    }
}

int main(void) {
    const char *env = getenv("DT_ISA");
    forced = env && *env;
    dt_status st = dt_isa_init();
    if (st == DT_ERR_UNSUPPORTED) {
        printf("skipped: %s\n", dt_last_error());
        return 77;
    }
    ASSERT_OK(st);
    RUN(test_errors_and_default);
    RUN(test_backends_all_levels);
    RUN(test_f16_all_levels);
    RUN(test_concurrent_callers);
    return TEST_SUMMARY();
}
