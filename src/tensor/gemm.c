/*
 * gemm.c — thread control and the matrix multiplies (OpenBLAS cblas_sgemm).
 *
 * dtrain owns two thread pools that never run at the same time: OpenMP for
 * our kernels and OpenBLAS's pool for sgemm. dt_tensor_set_threads() sizes
 * both to the same count so that a step never oversubscribes the cores. All
 * matrices are row-major; linear layers keep PyTorch's (out, in) weight
 * layout so checkpoints and fixtures map one to one.
 */
#include "dtrain/tensor.h"

#include <cblas.h>
#include <omp.h>
#include <stdlib.h>

/* Declared by OpenBLAS's cblas.h; repeated so a reference cblas.h still builds. */
void openblas_set_num_threads(int num_threads);

static int g_threads; /* 0 = not set yet */

void dt_tensor_set_threads(int n) {
    if (n < 1)
        n = 1;
    g_threads = n;
    omp_set_num_threads(n);
    openblas_set_num_threads(n);
}

int dt_tensor_threads(void) {
    if (g_threads == 0) {
        int n;
        if (dt_tensor_threads_from_env(&n) != DT_OK)
            dt_tensor_set_threads(dt_cpu_count());
    }
    return g_threads;
}

dt_status dt_tensor_threads_from_env(int *out) {
    int64_t n;
    DT_CHECK(dt_config_env_int("DT_THREADS", dt_cpu_count(), 1, 1024, &n));
    dt_tensor_set_threads((int)n);
    if (out)
        *out = (int)n;
    return DT_OK;
}

bool dt_tensor_have_avx512(void) {
#ifdef __AVX512F__
    return true;
#else
    return false;
#endif
}

void dt_sgemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float *A, int lda,
              const float *B, int ldb, float beta, float *C, int ldc) {
    if (M == 0 || N == 0)
        return;
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                trans_b ? CblasTrans : CblasNoTrans, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

void dt_matmul_forward(float *out, const float *inp, const float *weight, const float *bias, int N,
                       int IC, int OC) {
    // out (N,OC) = inp (N,IC) @ weight^T (IC,OC) [+ bias]
    float beta = 0.0f;
    if (bias) {
        /* Seed the output with the bias so sgemm adds into it (beta = 1):
         * one pass over out instead of a separate bias pass afterwards. */
#pragma omp parallel for if ((size_t)N * OC > 65536) schedule(static)
        for (int i = 0; i < N; i++)
            for (int o = 0; o < OC; o++)
                out[(size_t)i * OC + o] = bias[o];
        beta = 1.0f;
    }
    dt_sgemm(false, true, N, OC, IC, 1.0f, inp, IC, weight, IC, beta, out, OC);
}

void dt_matmul_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                        const float *inp, const float *weight, int N, int IC, int OC) {
    // dinp (N,IC) = dout (N,OC) @ weight (OC,IC)
    if (dinp)
        dt_sgemm(false, false, N, IC, OC, 1.0f, dout, OC, weight, IC, 0.0f, dinp, IC);
    // dweight (OC,IC) += dout^T (OC,N) @ inp (N,IC)
    dt_sgemm(true, false, OC, IC, N, 1.0f, dout, OC, inp, IC, 1.0f, dweight, IC);
    if (dbias) {
        /* Column sums; threads own disjoint column blocks, rows in order, so
         * the result does not depend on the thread count. */
        enum { CB = 64 };
        int nb = (OC + CB - 1) / CB;
#pragma omp parallel for if ((size_t)N * OC > 65536) schedule(static)
        for (int cb = 0; cb < nb; cb++) {
            int o0 = cb * CB, o1 = o0 + CB < OC ? o0 + CB : OC;
            float acc[CB] = {0};
            for (int i = 0; i < N; i++) {
                const float *row = dout + (size_t)i * OC;
                for (int o = o0; o < o1; o++)
                    acc[o - o0] += row[o];
            }
            for (int o = o0; o < o1; o++)
                dbias[o] += acc[o - o0];
        }
    }
}
