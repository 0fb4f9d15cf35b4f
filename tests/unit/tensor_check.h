/*
 * tensor_check.h — helpers shared by the kernel tests (test_tensor.c,
 * test_attention.c): random and zeroed float arrays, the RMS, and the
 * elementwise comparison on the scale of the reference. Include after
 * test.h; the including test seeds g_rng.
 */
#ifndef DT_TESTS_TENSOR_CHECK_H
#define DT_TESTS_TENSOR_CHECK_H

#include "test.h"

static dt_rng g_rng;

static float *randv(size_t n, float scale) {
    float *p = malloc((n ? n : 1) * sizeof(float));
    ASSERT_TRUE(p != NULL);
    for (size_t i = 0; i < n; i++)
        p[i] = scale * dt_rng_normal(&g_rng);
    return p;
}

static float *zerov(size_t n) {
    float *p = calloc(n ? n : 1, sizeof(float));
    ASSERT_TRUE(p != NULL);
    return p;
}

static double rms(const float *x, size_t n) {
    double s = 0.0;
    for (size_t i = 0; i < n; i++)
        s += (double)x[i] * x[i];
    return n ? sqrt(s / (double)n) : 0.0;
}

/* Compare two arrays elementwise on the scale of ref:
 * |got - ref| <= tol * (|ref| + rms(ref)). */
static void check_close(const char *what, const float *got, const float *ref, size_t n,
                        double tol) {
    double r = rms(ref, n);
    for (size_t i = 0; i < n; i++) {
        double err = fabs((double)got[i] - ref[i]) / (fabs((double)ref[i]) + r + 1e-30);
        if (!(err <= tol))
            TEST_FAILF("%s: element %zu of %zu: got %.9g, expected %.9g (rel err %.3g > %.1g)",
                       what, i, n, got[i], ref[i], err, tol);
    }
}

#endif /* DT_TESTS_TENSOR_CHECK_H */
