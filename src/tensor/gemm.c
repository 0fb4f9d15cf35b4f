/*
 * gemm.c — thread control and the matrix multiplies (OpenBLAS cblas_sgemm).
 *
 * One thread pool: OpenMP. OpenBLAS is kept single-threaded and a large
 * sgemm is split by dt_sgemm into one block of rows (or columns) of C per
 * OpenMP thread, each a single-threaded sgemm call. With OpenBLAS's own
 * pthread pool as well, its workers spin after every call while our OpenMP
 * kernels run, and on a machine with few cores the two pools steal each
 * other's cores. Calls made inside an OpenMP region (the attention tiles)
 * go straight to OpenBLAS. All matrices are row-major; linear layers keep
 * PyTorch's (out, in) weight layout so checkpoints and fixtures map one to
 * one.
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
    openblas_set_num_threads(1); /* see the file comment: we split sgemm ourselves */
}

int dt_tensor_threads(void) {
    if (g_threads == 0) {
        int n;
        if (dt_tensor_threads_from_env(&n) != DT_OK) {
            DT_WARN("%s; using %d threads", dt_last_error(), dt_cpu_count());
            dt_tensor_set_threads(dt_cpu_count());
        }
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

/* Below this many multiply-adds an sgemm runs on one thread. */
#define GEMM_SPLIT_MIN (1u << 21)

static void sgemm1(bool ta, bool tb, int M, int N, int K, float alpha, const float *A, int lda,
                   const float *B, int ldb, float beta, float *C, int ldc) {
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N,
                K, alpha, A, lda, B, ldb, beta, C, ldc);
}

void dt_sgemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float *A, int lda,
              const float *B, int ldb, float beta, float *C, int ldc) {
    if (M == 0 || N == 0)
        return;
    int nt = omp_in_parallel() ? 1 : omp_get_max_threads();
    if (nt <= 1 || (double)M * N * K < GEMM_SPLIT_MIN) {
        sgemm1(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        return;
    }
    /* Split the larger of M and N into nt blocks, multiples of 64 so that
     * every block keeps whole register tiles. Each thread packs its own
     * panels; the duplicated packing of the shared operand is small next to
     * the multiply for the sizes that reach this path. */
    bool split_m = M >= N;
    int len = split_m ? M : N;
    int chunk = ((len + nt - 1) / nt + 63) & ~63;
#pragma omp parallel for num_threads(nt) schedule(static, 1)
    for (int t = 0; t < nt; t++) {
        int lo = t * chunk, hi = lo + chunk < len ? lo + chunk : len;
        if (lo >= hi)
            continue;
        if (split_m) {
            /* rows lo..hi of op(A) and of C */
            const float *Ab = trans_a ? A + lo : A + (size_t)lo * lda;
            sgemm1(trans_a, trans_b, hi - lo, N, K, alpha, Ab, lda, B, ldb, beta,
                   C + (size_t)lo * ldc, ldc);
        } else {
            /* columns lo..hi of op(B) and of C */
            const float *Bb = trans_b ? B + (size_t)lo * ldb : B + lo;
            sgemm1(trans_a, trans_b, M, hi - lo, K, alpha, A, lda, Bb, ldb, beta, C + lo, ldc);
        }
    }
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
