/*
 * gemm.c — thread control and the matrix multiplies (OpenBLAS cblas_sgemm).
 *
 * One thread pool: OpenMP. OpenBLAS is kept single-threaded and a large
 * sgemm is split by dt_sgemm into one block of rows (or columns) of C per
 * OpenMP thread, each a single-threaded sgemm call. With OpenBLAS's own
 * pthread pool as well, its workers spin after every call while our OpenMP
 * kernels run, and on a machine with few cores the two pools steal each
 * other's cores. Calls made inside an OpenMP region (the attention tiles)
 * go straight to the single-threaded multiply. All matrices are row-major;
 * linear layers keep PyTorch's (out, in) weight layout so checkpoints and
 * fixtures map one to one.
 *
 * The single-threaded multiply (sgemm1) is oneDNN's dnnl_sgemm when op(A) is
 * not transposed, OpenBLAS otherwise. Measured on this machine's AVX-512
 * core (Sapphire Rapids, 1 thread), oneDNN 2.x runs the NT shapes of the
 * linear forwards (2048 x {384..1536} x {384,1536}) at 162-170 GFLOP/s
 * against OpenBLAS's 140-156, and the NN shapes of the input gradients at
 * 150-168 against 141-156; for the TN weight gradients OpenBLAS is the
 * faster one (140-146 against 118-147), so those stay there. Both are
 * deterministic for a fixed call: one thread, fixed blocking. oneDNN's ISA
 * cap can be set only once per process, before its first use: onednn.c
 * fixes it from DT_ISA at the first dt__onednn_available() call, which
 * sgemm1 makes before every dnnl_sgemm; where oneDNN is unavailable (built
 * without libdnnl-dev, DT_ISA lowered below the cap) sgemm1 stays on
 * OpenBLAS.
 */
#include "tensor_internal.h"

#include <cblas.h>
#ifdef __SSE__
#include <xmmintrin.h>
#endif
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#ifdef DT_HAVE_DNNL /* src/tensor/deps.cmake: libdnnl-dev found */
#include <oneapi/dnnl/dnnl.h>
#endif

/* Declared by OpenBLAS's cblas.h; repeated so a reference cblas.h still builds. */
void openblas_set_num_threads(int num_threads);

static int g_threads; /* 0 = not set yet */

void dt_tensor_set_threads(int n) {
    if (n < 1)
        n = 1;
    g_threads = n;
    omp_set_num_threads(n);
#ifdef __SSE__
    /* Flush denormals to zero (FTZ) and read them as zero (DAZ) on this
     * thread and every pool thread: a saturated softmax produces gradients
     * below 1e-38, and sgemm on denormal inputs runs ~10x slower (measured
     * with PyTorch's default init on this machine). Values that small are
     * far below float32's resolution of the sums they enter. */
    _mm_setcsr(_mm_getcsr() | 0x8040);
#pragma omp parallel num_threads(n)
    _mm_setcsr(_mm_getcsr() | 0x8040);
#endif
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

/* Parts per thread of a split product. More parts than threads, taken
 * dynamically: when the OS preempts one of our threads (a shared machine),
 * the others take its remaining parts instead of spinning at the barrier.
 * Parts stay >= 64 rows/columns, large enough for sgemm to run at speed. */
#define PARTS_PER_THREAD 4

/* Block t of nt over [0, len), multiples of 64 wide (whole register tiles). */
static void split_range(int len, int nt, int t, int *lo, int *hi) {
    int chunk = ((len + nt - 1) / nt + 63) & ~63;
    *lo = t * chunk < len ? t * chunk : len;
    *hi = *lo + chunk < len ? *lo + chunk : len;
}

/* Below this many multiply-adds an sgemm runs on one thread. */
#define GEMM_SPLIT_MIN (1u << 21)

/* C = alpha op(A) op(B) + beta C on the calling thread only; oneDNN when
 * op(A) is not transposed or dnnl_ta is set (see the file comment). */
static void sgemm1_on(bool dnnl_ta, bool ta, bool tb, int M, int N, int K, float alpha,
                      const float *A, int lda, const float *B, int ldb, float beta, float *C,
                      int ldc) {
#ifdef DT_HAVE_DNNL
    /* dnnl_sgemm sizes its own OpenMP team: it runs on this thread only
     * inside a parallel region or when the pool is one thread. */
    if ((!ta || dnnl_ta) && (omp_in_parallel() || omp_get_max_threads() == 1)) {
        /* A failing dnnl_sgemm (only bad arguments) fails before writing C. */
        if (dt__onednn_available(NULL, 0) &&
            dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', M, N, K, alpha, A, lda, B, ldb, beta, C,
                       ldc) == dnnl_success)
            return;
    }
#else
    (void)dnnl_ta;
#endif
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N,
                K, alpha, A, lda, B, ldb, beta, C, ldc);
}

static void sgemm1(bool ta, bool tb, int M, int N, int K, float alpha, const float *A, int lda,
                   const float *B, int ldb, float beta, float *C, int ldc) {
    sgemm1_on(false, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

/* Attention's tiles (at most a few hundred rows, K <= 256): oneDNN for every
 * transpose. Measured on the attention backward at B=8 T=256 C=384 NH=6,
 * 1 thread: its transposed tile products (P^T dO, dS^T Q) ran ~0.4 ms
 * faster per layer on oneDNN than on OpenBLAS, unlike the large TN
 * weight-gradient shapes. */
void dt__sgemm_tile(bool ta, bool tb, int M, int N, int K, float alpha, const float *A, int lda,
                    const float *B, int ldb, float beta, float *C, int ldc) {
    sgemm1_on(true, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
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
    /* Split the larger of M and N into parts, multiples of 64 so that
     * every block keeps whole register tiles. Each thread packs its own
     * panels; the duplicated packing of the shared operand is small next to
     * the multiply for the sizes that reach this path. */
    bool split_m = M >= N;
    int len = split_m ? M : N, np = nt * PARTS_PER_THREAD;
#pragma omp parallel for num_threads(nt) schedule(dynamic, 1)
    for (int p = 0; p < np; p++) {
        int lo, hi;
        split_range(len, np, p, &lo, &hi);
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

static int pool_size(double macs) {
    int nt = omp_in_parallel() ? 1 : omp_get_max_threads();
    return macs < GEMM_SPLIT_MIN ? 1 : nt;
}

/* Part t of nt of a linear forward: the bias is written into this part of
 * out, then sgemm adds into it (beta = 1). */
static void matmul_forward_part(float *out, const float *inp, const float *weight,
                                const float *bias, int N, int IC, int OC, int nt, int t) {
    bool split_rows = N >= OC; /* tokens, else output channels */
    int lo, hi;
    split_range(split_rows ? N : OC, nt, t, &lo, &hi);
    if (lo >= hi)
        return;
    int r0 = split_rows ? lo : 0, r1 = split_rows ? hi : N;
    int c0 = split_rows ? 0 : lo, c1 = split_rows ? OC : hi;
    if (bias)
        for (int i = r0; i < r1; i++)
            memcpy(out + (size_t)i * OC + c0, bias + c0, sizeof(float) * (size_t)(c1 - c0));
    // out[r0:r1, c0:c1] (+)= inp[r0:r1, :] @ weight[c0:c1, :]^T
    sgemm1(false, true, r1 - r0, c1 - c0, IC, 1.0f, inp + (size_t)r0 * IC, IC,
           weight + (size_t)c0 * IC, IC, bias ? 1.0f : 0.0f, out + (size_t)r0 * OC + c0, OC);
}

void dt__matmul_forward(float *out, const float *inp, const float *weight, const float *bias, int N,
                        int IC, int OC) {
    // out (N,OC) = inp (N,IC) @ weight^T (IC,OC) [+ bias]
    /* One parallel region per layer: each thread seeds and multiplies its
     * own block of out, so there is no barrier between bias and sgemm. */
    int nt = pool_size((double)N * IC * OC);
    if (nt <= 1) {
        matmul_forward_part(out, inp, weight, bias, N, IC, OC, 1, 0);
        return;
    }
    int np = nt * PARTS_PER_THREAD;
#pragma omp parallel for num_threads(nt) schedule(dynamic, 1)
    for (int p = 0; p < np; p++)
        matmul_forward_part(out, inp, weight, bias, N, IC, OC, np, p);
}

/* Tokens per TN weight-gradient sgemm. OpenBLAS's TN product runs faster
 * as a sequence of K = 256..512 products than as one K = 2048 product:
 * measured on this machine (Sapphire Rapids core, 1 thread, OpenBLAS 0.3.21,
 * beta = 1) for shakespeare-char's four linear shapes OC x IC = 1152x384,
 * 384x384, 1536x384, 384x1536 at N = B*T = 2048: 134-145 GFLOP/s as one
 * product, 142-150 in chunks of 512 (two runs, +3-5%). The alternatives
 * measured slower on the same shapes: oneDNN's dnnl_sgemm TN 117-151 (only
 * 384x384 ahead), a cached f32 oneDNN matmul primitive with A described
 * transposed by strides and the sum post-op 131-143, and transposing dout
 * into a scratch for an NN product 110-128 (the transpose alone costs 1-6 ms
 * per layer, more than the NN product saves). */
#define TN_CHUNK 512

/* Part t of nt of a linear backward: a block of dinp rows, a block of
 * dweight, a slice of dbias. The three are independent, so one region
 * without inner barriers does all of them. dbias sums rows in a fixed
 * order: per 256-token chunk inside the AVX-512 weight-gradient kernel when
 * it runs and owns the slice, else all rows per 64-column block here; which
 * one is used depends only on the shape, the ISA and the thread count. */
static void matmul_backward_part(float *dinp, float *dweight, float *dbias, const float *dout,
                                 const float *inp, const float *weight, int N, int IC, int OC,
                                 int nt, int t, bool acc) {
    const bool by_rows = OC >= IC; /* dweight split by rows (OC) or by columns (IC) */
    int lo, hi;
    if (dinp) {
        // dinp[lo:hi, :] = dout[lo:hi, :] (.,OC) @ weight (OC,IC)
        split_range(N, nt, t, &lo, &hi);
        if (lo < hi)
            sgemm1(false, false, hi - lo, IC, OC, 1.0f, dout + (size_t)lo * OC, OC, weight, IC,
                   0.0f, dinp + (size_t)lo * IC, IC);
    }
    if (!dweight) /* the input gradient alone (a zero-bubble B) */
        return;
    // dweight (OC,IC) += dout^T (OC,N) @ inp (N,IC), split by the longer side
    split_range(by_rows ? OC : IC, nt, t, &lo, &hi);
    /* The AVX-512 kernel (gemm_tn.c) where it runs, else OpenBLAS with the
     * sum over tokens in chunks of TN_CHUNK, each added into dweight in
     * order. Either way the order is fixed for a fixed thread count. The
     * kernel also sums dbias while it packs dout, when this part's rows of
     * dweight are exactly its slice of dbias (split by OC, or one part). */
    bool fused_dbias = false;
    if (lo < hi) {
        fused_dbias = dbias && (by_rows || nt == 1);
        bool done = by_rows ? dt__sgemm_tn(hi - lo, IC, N, dout + lo, OC, inp, IC,
                                           dweight + (size_t)lo * IC, IC,
                                           fused_dbias ? dbias + lo : NULL, acc)
                            : dt__sgemm_tn(OC, hi - lo, N, dout, OC, inp + lo, IC, dweight + lo, IC,
                                           fused_dbias ? dbias : NULL, acc);
        if (done)
            lo = hi;
        else
            fused_dbias = false;
    }
    /* Overwriting on this path: clear the block, then accumulate (the same
     * bits; the AVX-512 kernel above is the fast path). */
    if (!acc && lo < hi) {
        int rows = by_rows ? hi - lo : OC, cols = by_rows ? IC : hi - lo;
        float *d0 = by_rows ? dweight + (size_t)lo * IC : dweight + lo;
        for (int i = 0; i < rows; i++)
            memset(d0 + (size_t)i * IC, 0, sizeof(float) * (size_t)cols);
    }
    for (int k0 = 0; lo < hi && k0 < N; k0 += TN_CHUNK) {
        int kk = N - k0 < TN_CHUNK ? N - k0 : TN_CHUNK;
        const float *dk = dout + (size_t)k0 * OC, *xk = inp + (size_t)k0 * IC;
        if (by_rows)
            sgemm1(true, false, hi - lo, IC, kk, 1.0f, dk + lo, OC, xk, IC, 1.0f,
                   dweight + (size_t)lo * IC, IC);
        else
            sgemm1(true, false, OC, hi - lo, kk, 1.0f, dk, OC, xk + lo, IC, 1.0f, dweight + lo, IC);
    }
    if (dbias && !fused_dbias) {
        split_range(OC, nt, t, &lo, &hi);
        for (int o0 = lo; o0 < hi; o0 += 64) {
            int o1 = o0 + 64 < hi ? o0 + 64 : hi;
            float sum[64] = {0};
            for (int i = 0; i < N; i++) {
                const float *row = dout + (size_t)i * OC;
                for (int o = o0; o < o1; o++)
                    sum[o - o0] += row[o];
            }
            for (int o = o0; o < o1; o++)
                dbias[o] = (acc ? dbias[o] : 0.0f) + sum[o - o0];
        }
    }
}

void dt__matmul_backward_mode(float *dinp, float *dweight, float *dbias, const float *dout,
                              const float *inp, const float *weight, int N, int IC, int OC,
                              dt_grad_mode mode) {
    bool acc = mode == DT_GRAD_ACCUMULATE;
    int nt = pool_size((double)N * IC * OC);
    if (nt <= 1) {
        matmul_backward_part(dinp, dweight, dbias, dout, inp, weight, N, IC, OC, 1, 0, acc);
        return;
    }
    int np = nt * PARTS_PER_THREAD;
#pragma omp parallel for num_threads(nt) schedule(dynamic, 1)
    for (int p = 0; p < np; p++)
        matmul_backward_part(dinp, dweight, dbias, dout, inp, weight, N, IC, OC, np, p, acc);
}

void dt_matmul_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                        const float *inp, const float *weight, int N, int IC, int OC) {
    dt_matmul_backward_mode(dinp, dweight, dbias, dout, inp, weight, N, IC, OC, DT_GRAD_ACCUMULATE);
}
