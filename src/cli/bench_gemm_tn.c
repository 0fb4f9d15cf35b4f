/*
 * bench_gemm_tn.c — `dtrain bench gemm-tn`: the weight-gradient product
 * dW (M,N) += dY^T X with dY (K,M), X (K,N) on ONE thread, three ways in the
 * same run: OpenBLAS as one TN sgemm, OpenBLAS in 512-token chunks (the
 * route before gemm_tn.c) and the AVX-512 outer-product kernel of
 * gemm_tn.c. Default shapes: shakespeare-char's four linear layers at
 * B*T = 2048 tokens (OC x IC = 1152x384, 384x384, 1536x384, 384x1536).
 *
 * The methods take turns within each round; a run repeats the product
 * until it has taken --min-time seconds; the median, slowest and fastest
 * run are shown as GFLOP/s = 2 M N K / time. The kernel's result is also
 * compared with OpenBLAS's (max |diff| relative to max |C|).
 */
#include "cli.h"
#include "tensor/tensor_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const cli_opt tn_opts[] = {
    {"shapes", 0, CLI_STRING, "MxNxK,...", "1152x384x2048,384x384x2048,1536x384x2048,384x1536x2048",
     NULL, "shapes dW(M,N) += dY(K,M)^T X(K,N)", NULL, 0, 0},
    {"runs", 'r', CLI_INT, "R", "5", NULL, "timed runs per method (median shown)", NULL, 1, 1000},
    {"min-time", 0, CLI_DOUBLE, "S", "0.2", NULL, "seconds per run", NULL, 0.001, 60},
    {0},
};

enum { M_BLAS, M_BLAS512, M_AVX512, NMETHODS };
static const char *const method_names[NMETHODS] = {"openblas", "openblas-512", "avx512"};

static void run_method(int m, int M, int N, int K, const float *A, const float *B, float *C) {
    switch (m) {
    case M_BLAS: dt_sgemm(true, false, M, N, K, 1.0f, A, M, B, N, 1.0f, C, N); break;
    case M_BLAS512:
        for (int k0 = 0; k0 < K; k0 += 512) {
            int kk = K - k0 < 512 ? K - k0 : 512;
            dt_sgemm(true, false, M, N, kk, 1.0f, A + (size_t)k0 * M, M, B + (size_t)k0 * N, N,
                     1.0f, C, N);
        }
        break;
    default:
        if (!dt__sgemm_tn(M, N, K, A, M, B, N, C, N, NULL, true))
            dt_sgemm(true, false, M, N, K, 1.0f, A, M, B, N, 1.0f, C, N);
        break;
    }
}

static int run_tn(cli_args *a) {
    dt_tensor_set_threads(1);
    int runs = (int)cli_int(a, "runs");
    double min_time = cli_double(a, "min-time");
    const char *p = cli_str(a, "shapes");
    printf("# dW(M,N) += dY(K,M)^T X(K,N), fp32, 1 thread, kernel %s, median of %d runs of >= "
           "%.2f s (methods alternate)\n",
           dt_isa() >= DT_ISA_AVX512 ? "avx512 6x64" : "unavailable (OpenBLAS shown twice)", runs,
           min_time);
    printf("%6s %6s %6s  %-13s %9s %9s %9s %9s\n", "M", "N", "K", "method", "GFLOP/s", "min", "max",
           "rel.err");
    while (*p) {
        int M, N, K, used = 0;
        if (sscanf(p, "%dx%dx%d%n", &M, &N, &K, &used) != 3 || M < 1 || N < 1 || K < 1) {
            fprintf(stderr, "dtrain bench gemm-tn: bad shape in --shapes at '%s' (want MxNxK)\n",
                    p);
            return 2;
        }
        p += used;
        if (*p == ',')
            p++;
        float *A = dt_alloc(sizeof(float) * (size_t)K * M);
        float *B = dt_alloc(sizeof(float) * (size_t)K * N);
        float *C[NMETHODS] = {0};
        for (int m = 0; m < NMETHODS; m++)
            C[m] = dt_alloc(sizeof(float) * (size_t)M * N);
        if (!A || !B || !C[0] || !C[1] || !C[2]) {
            fprintf(stderr, "dtrain bench gemm-tn: out of memory for %dx%dx%d\n", M, N, K);
            return 1;
        }
        dt_rng r;
        dt_rng_init(&r, 1, dt_rng_stream_id(0, 0, DT_RNG_TEST));
        for (size_t i = 0; i < (size_t)K * M; i++)
            A[i] = dt_rng_normal(&r);
        for (size_t i = 0; i < (size_t)K * N; i++)
            B[i] = dt_rng_normal(&r);
        /* correctness: one product each from zero */
        double cmax = 0.0, err[NMETHODS] = {0};
        for (int m = 0; m < NMETHODS; m++) {
            memset(C[m], 0, sizeof(float) * (size_t)M * N);
            run_method(m, M, N, K, A, B, C[m]);
        }
        for (size_t i = 0; i < (size_t)M * N; i++)
            cmax = fmax(cmax, fabs(C[0][i]));
        for (int m = 0; m < NMETHODS; m++)
            for (size_t i = 0; i < (size_t)M * N; i++)
                err[m] = fmax(err[m], fabs((double)C[m][i] - C[0][i]) / (cmax > 0 ? cmax : 1));
        double *gf = malloc(sizeof(double) * NMETHODS * runs);
        for (int rd = 0; rd < runs; rd++)
            for (int m = 0; m < NMETHODS; m++) {
                int n = 0;
                double t0 = dt_now(), t;
                do {
                    run_method(m, M, N, K, A, B, C[m]);
                    n++;
                    t = dt_now() - t0;
                } while (t < min_time);
                gf[m * runs + rd] = 2.0 * M * (double)N * K * n / t * 1e-9;
            }
        for (int m = 0; m < NMETHODS; m++) {
            double *g = gf + m * runs;
            cli_sort_doubles(g, runs);
            printf("%6d %6d %6d  %-13s %9.1f %9.1f %9.1f %9.1e\n", M, N, K, method_names[m],
                   g[runs / 2], g[0], g[runs - 1], err[m]);
        }
        free(gf);
        dt_free(A), dt_free(B);
        for (int m = 0; m < NMETHODS; m++)
            dt_free(C[m]);
    }
    return 0;
}

const cli_cmd cli_bench_gemm_tn = {
    .name = "gemm-tn",
    .parent = "bench",
    .summary = "weight-gradient product dY^T X, 1 thread: OpenBLAS vs the AVX-512 kernel",
    .usage = "dtrain bench gemm-tn [--shapes MxNxK,...] [--runs R] [--min-time S]",
    .opts = tn_opts,
    .run = run_tn,
};
