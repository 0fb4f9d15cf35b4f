/*
 * test_gemm_tn.c — the AVX-512 weight-gradient kernel (src/tensor/gemm_tn.c)
 * against a float64 reference: C (M,N) += A^T B, A (K,M), B (K,N).
 *
 * Shapes straddle every edge of the blocking: rows around the 6-row tile
 * and the 384-row block, columns around the 64-column tile, tokens around
 * the 256-token chunk, with leading dimensions larger than the matrices.
 * With small integer inputs every partial sum is an integer below 2^24, so
 * the kernel must match the float64 reference EXACTLY: a skipped or doubled
 * tile, row, column or token chunk changes some element. Elements outside
 * C's M x N view (the leading-dimension gap and a guard row) must stay
 * untouched. The fused column sums of A (the bias gradient) likewise,
 * exactly, with a guard element on either side. Also: Gaussian inputs within rounding, the same
 * bits when the caller splits the rows or columns (as the 2-thread path does) and a refusal that
 * touches nothing when AVX-512 is not the active level.
 */
#include "dtrain/tensor.h"
#include "tensor/tensor_internal.h"
#include "test.h"

#include <math.h>

static dt_rng g_rng;

typedef struct mats {
    int M, N, K, lda, ldb, ldc;
    float *A, *B, *C; /* C has M + 1 rows: the last is a guard row */
    double *ref;      /* (M,N): C0 + A^T B in float64 */
    float *colsum;    /* M + 2: a guard element on each side of the M sums */
    double *colref;   /* (M): colsum0 + column sums of A in float64 */
} mats;

static void fill(float *p, size_t n, bool integer) {
    for (size_t i = 0; i < n; i++)
        p[i] = integer ? (float)((int)dt_rng_below(&g_rng, 7) - 3) : dt_rng_normal(&g_rng);
}

static mats make(int M, int N, int K, int pad, bool integer) {
    mats m = {M, N, K, M + pad, N + 2 * pad, N + pad, NULL, NULL, NULL, NULL, NULL, NULL};
    m.A = malloc(sizeof(float) * (size_t)K * m.lda);
    m.B = malloc(sizeof(float) * (size_t)K * m.ldb);
    m.C = malloc(sizeof(float) * (size_t)(M + 1) * m.ldc);
    m.ref = malloc(sizeof(double) * (size_t)M * N);
    m.colsum = malloc(sizeof(float) * (size_t)(M + 2));
    m.colref = malloc(sizeof(double) * (size_t)M);
    ASSERT_TRUE(m.A && m.B && m.C && m.ref && m.colsum && m.colref);
    fill(m.A, (size_t)K * m.lda, integer);
    fill(m.B, (size_t)K * m.ldb, integer);
    fill(m.C, (size_t)(M + 1) * m.ldc, integer);
    fill(m.colsum, (size_t)M + 2, integer);
    for (int i = 0; i < M; i++) {
        double acc = m.colsum[i + 1];
        for (int k = 0; k < K; k++)
            acc += m.A[(size_t)k * m.lda + i];
        m.colref[i] = acc;
    }
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double acc = m.C[(size_t)i * m.ldc + j];
            for (int k = 0; k < K; k++)
                acc += (double)m.A[(size_t)k * m.lda + i] * m.B[(size_t)k * m.ldb + j];
            m.ref[(size_t)i * N + j] = acc;
        }
    return m;
}

static void drop(mats *m) {
    free(m->A), free(m->B), free(m->C), free(m->ref), free(m->colsum), free(m->colref);
}

/* Runs the kernel on m and checks C against the reference (exactly when
 * integer, else within tol of the sum of |terms|) and the untouched gap. */
static void check(mats *m, bool integer, double tol) {
    size_t nc = (size_t)(m->M + 1) * m->ldc;
    float *before = malloc(sizeof(float) * nc);
    ASSERT_TRUE(before != NULL);
    memcpy(before, m->C, sizeof(float) * nc);
    float guard[2] = {m->colsum[0], m->colsum[m->M + 1]};
    ASSERT_TRUE(dt__sgemm_tn(m->M, m->N, m->K, m->A, m->lda, m->B, m->ldb, m->C, m->ldc,
                             m->colsum + 1, true));
    int bad = 0;
    ASSERT_TRUE(memcmp(guard, m->colsum, sizeof(float)) == 0);
    ASSERT_TRUE(memcmp(guard + 1, m->colsum + m->M + 1, sizeof(float)) == 0);
    for (int i = 0; i < m->M && bad < 5; i++) {
        double bound = 0.0;
        if (!integer) {
            for (int k = 0; k < m->K; k++)
                bound += fabs(m->A[(size_t)k * m->lda + i]);
            bound = tol * (bound + fabs(m->colref[i]));
        }
        if (!(fabs(m->colsum[i + 1] - m->colref[i]) <= bound)) {
            fprintf(stderr, "  M=%d N=%d K=%d: colsum[%d] = %.9g, float64 reference %.9g\n", m->M,
                    m->N, m->K, i, m->colsum[i + 1], m->colref[i]);
            bad++;
        }
    }
    for (int i = 0; i <= m->M && bad < 5; i++)
        for (int j = 0; j < m->ldc && bad < 5; j++) {
            size_t at = (size_t)i * m->ldc + j;
            float got = m->C[at];
            if (i == m->M || j >= m->N) {
                if (memcmp(&got, &before[at], sizeof got) != 0) {
                    fprintf(stderr,
                            "  M=%d N=%d K=%d: C[%d][%d] outside the view changed: %g -> %g\n",
                            m->M, m->N, m->K, i, j, before[at], got);
                    bad++;
                }
                continue;
            }
            double want = m->ref[(size_t)i * m->N + j];
            double bound = 0.0;
            if (!integer) {
                bound = fabs(before[at]);
                for (int k = 0; k < m->K; k++)
                    bound +=
                        fabs((double)m->A[(size_t)k * m->lda + i] * m->B[(size_t)k * m->ldb + j]);
                bound *= tol;
            }
            if (!(fabs(got - want) <= bound)) {
                fprintf(stderr,
                        "  M=%d N=%d K=%d: C[%d][%d] = %.9g, float64 reference %.9g (bound %g)\n",
                        m->M, m->N, m->K, i, j, got, want, bound);
                bad++;
            }
        }
    ASSERT_EQ(bad, 0);
    free(before);
}

/* Integer inputs, exact: every edge of the 6 x 64 tile, the 384-row block
 * and the 256-token chunk, on both sides. */
static void test_exact_edges(void) {
    const int Ms[] = {1, 5, 6, 7, 13, 383, 390};
    const int Ns[] = {1, 15, 16, 63, 64, 65, 130};
    const int Ks[] = {1, 255, 256, 257, 600};
    int runs = 0;
    for (int a = 0; a < 7; a++)
        for (int b = 0; b < 7; b++) {
            /* all K for the small shapes; for the larger ones a K that
             * crosses two chunk boundaries and one that ends on one */
            for (int c = 0; c < 5; c++) {
                bool big = Ms[a] > 100 || Ns[b] > 100;
                if (big && c != 3 && c != 1)
                    continue;
                mats m = make(Ms[a], Ns[b], Ks[c], (a + b + c) % 3 * 5, true);
                check(&m, true, 0.0);
                drop(&m);
                runs++;
            }
        }
    fprintf(stderr, "  %d exact shapes\n", runs);
}

/* Gaussian inputs: within float32 rounding of the float64 sum. */
static void test_gaussian(void) {
    const int shapes[][3] = {{1152, 384, 300}, {384, 1536 + 17, 77}, {47, 200, 1100}};
    for (int s = 0; s < 3; s++) {
        mats m = make(shapes[s][0], shapes[s][1], shapes[s][2], 3, false);
        check(&m, false, 1e-5);
        drop(&m);
    }
}

/* The 2-thread path hands the kernel a block of rows or columns; each
 * element's sum must not depend on where the caller split. */
static void test_split_bits(void) {
    int M = 397, N = 203, K = 531;
    mats m = make(M, N, K, 0, false);
    size_t nc = (size_t)(M + 1) * N;
    float *rows = malloc(sizeof(float) * nc), *cols = malloc(sizeof(float) * nc);
    ASSERT_TRUE(rows && cols);
    memcpy(rows, m.C, sizeof(float) * nc);
    memcpy(cols, m.C, sizeof(float) * nc);
    float *sum_one = calloc((size_t)M, sizeof(float)), *sum_two = calloc((size_t)M, sizeof(float));
    ASSERT_TRUE(sum_one && sum_two);
    ASSERT_TRUE(dt__sgemm_tn(M, N, K, m.A, M, m.B, N, m.C, N, sum_one, true));
    int r = 100; /* not a multiple of the 6-row tile */
    ASSERT_TRUE(dt__sgemm_tn(r, N, K, m.A, M, m.B, N, rows, N, sum_two, true));
    ASSERT_TRUE(
        dt__sgemm_tn(M - r, N, K, m.A + r, M, m.B, N, rows + (size_t)r * N, N, sum_two + r, true));
    int c = 37; /* not a multiple of the 64-column tile */
    ASSERT_TRUE(dt__sgemm_tn(M, c, K, m.A, M, m.B, N, cols, N, NULL, true));
    ASSERT_TRUE(dt__sgemm_tn(M, N - c, K, m.A, M, m.B + c, N, cols + c, N, NULL, true));
    ASSERT_TRUE(memcmp(rows, m.C, sizeof(float) * nc) == 0);
    ASSERT_TRUE(memcmp(cols, m.C, sizeof(float) * nc) == 0);
    ASSERT_TRUE(memcmp(sum_one, sum_two, sizeof(float) * M) == 0);
    free(sum_one), free(sum_two);
    free(rows), free(cols);
    drop(&m);
}

/* Below AVX-512 the kernel refuses and leaves C alone (callers fall back). */
static void test_refuses_below_avx512(void) {
    dt_isa_level was = dt_isa();
    ASSERT_OK(dt_isa_set(DT_ISA_AVX2));
    float A[4] = {1, 2, 3, 4}, B[4] = {1, 1, 1, 1}, C[4] = {5, 6, 7, 8};
    float S[2] = {9, 9};
    ASSERT_TRUE(!dt__sgemm_tn(2, 2, 2, A, 2, B, 2, C, 2, S, true));
    ASSERT_EQ(S[1], 9.0f);
    ASSERT_EQ(C[0], 5.0f);
    ASSERT_EQ(C[3], 8.0f);
    ASSERT_OK(dt_isa_set(was));
}

int main(void) {
    dt_rng_init(&g_rng, 7, dt_rng_stream_id(0, 0, DT_RNG_TEST));
    if (dt_isa() < DT_ISA_AVX512) {
        fprintf(stderr, "SKIP: active ISA %s below avx512, the kernel does not run here\n",
                dt_isa_name(dt_isa()));
        RUN(test_refuses_below_avx512);
        return TEST_SUMMARY();
    }
    RUN(test_exact_edges);
    RUN(test_gaussian);
    RUN(test_split_bits);
    RUN(test_refuses_below_avx512);
    return TEST_SUMMARY();
}
