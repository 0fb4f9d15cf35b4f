/*
 * bench_gemm_bf16.c — `dtrain bench gemm-bf16`: GFLOP/s of each bf16 GEMM
 * backend against fp32 dt_sgemm (OpenBLAS kernels split over the OpenMP
 * threads, as dtrain's fp32 layers run) on the same shapes, same op,
 * same thread count, in the same run.
 *
 * Each (shape, op) is warmed up once per backend (oneDNN creates and caches
 * its primitive then), then timed `--runs` times, the backends taking turns
 * within each round; a run repeats the multiply until it has taken at least
 * --min-time seconds, and the table shows the median run (and the slowest
 * and fastest) as GFLOP/s = 2 M N K / time, and the median GFLOP per second
 * of process CPU time (GF/cpu-s): on a shared machine the wall clock counts
 * time the threads spent descheduled, CPU time does not.
 * Default shapes: the GPT-2 124M linear layers at B*T = 256 (M = 256 rows):
 * qkv 768->2304, attention projection 768->768, MLP 768->3072 and
 * 3072->768, and the tied LM head 768->50257.
 */
#include "cli.h"
#include "dtrain/amp.h"

#include "dtrain/tensor.h"

#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* "layer": the three multiplies of a linear layer whose forward is the given
 * shape: forward NT (M,N,K), input gradient NN (M,K,N), weight gradient TN
 * (N,K,M). "all": each op on the literal shape. */

static const char *const op_choices[] = {"nt", "nn", "tn", "all", "layer", NULL};
enum { OP_SEL_ALL = 3, OP_SEL_LAYER = 4 };
static const char *const out_choices[] = {"f32", "bf16", NULL}; /* order of dt_gemm_out */

static const cli_opt gemm_opts[] = {
    {"shapes", 0, CLI_STRING, "MxNxK,...",
     "256x2304x768,256x768x768,256x3072x768,256x768x3072,256x50257x768", NULL,
     "shapes C(M,N) = A(M,K) B(K,N)", NULL, 0, 0},
    {"out", 0, CLI_ENUM, NULL, "f32", NULL, "C's type for the bf16 backends", out_choices, 0, 0},
    {"op", 0, CLI_ENUM, NULL, "nt", NULL,
     "nt, nn, tn, all (each on the shape), layer (fwd NT, bwd NN + TN shapes)", op_choices, 0, 0},
    {"backends", 0, CLI_STRING, "LIST", "onednn,openblas,amx,avx512,sgemm,f16", NULL,
     "backends to time (also: ref; f16 = dt_gemm_f16); unavailable ones are listed and skipped",
     NULL, 0, 0},
    {"runs", 'r', CLI_INT, "N", "5", NULL, "timed runs per case (the median is shown)", NULL, 3,
     1000},
    {"min-time", 0, CLI_DOUBLE, "SEC", "0.2", NULL, "minimum duration of one run", NULL, 0, 3600},
    {"threads", 't', CLI_INT, "N", "0", NULL,
     "threads for every backend (0: OMP_NUM_THREADS, else all CPUs)", NULL, 0, 4096},
    {"json", 0, CLI_FLAG, NULL, NULL, NULL, "print one JSON object per line instead of a table",
     NULL, 0, 0},
    {0},
};

typedef struct gemm_case {
    int M, N, K;
    dt_gemm_op op;
    dt_gemm_out out; /* C's type for the bf16 backends */
    dt_bf16 *A, *B;
    dt_f16 *A16, *B16; /* fp16 copies, for dt_gemm_f16 */
    float *A32, *B32, *C;
} gemm_case;

/* Pseudo-backend of the table: dt_gemm_f16 (fp16 widened to fp32, sgemm). */
#define BE_F16 DT_GEMM_BACKEND_COUNT

/* backend index -1: fp32 sgemm; BE_F16: dt_gemm_f16 */
static dt_status run_once(const gemm_case *c, int be) {
    if (be == BE_F16)
        return dt_gemm_f16(c->op, c->M, c->N, c->K, c->A16, c->B16, c->C, false);
    if (be < 0) {
        bool ta = c->op == DT_GEMM_TN, tb = c->op == DT_GEMM_NT;
        dt_sgemm(ta, tb, c->M, c->N, c->K, 1.0f, c->A32, ta ? c->M : c->K, c->B32, tb ? c->K : c->N,
                 0.0f, c->C, c->N);
        return DT_OK;
    }
    return dt_gemm_bf16_with((dt_gemm_backend)be, c->op, c->M, c->N, c->K, c->A, c->B, c->C, c->out,
                             false);
}

static double cpu_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* One timed run: repeat until min_time has passed. *gflops is FLOP per wall
 * second; *cpu_gflops FLOP per second of CPU time of the whole process, which
 * other processes' load does not inflate (with OMP_WAIT_POLICY=passive, idle
 * workers sleep instead of burning it). */
static dt_status timed_run(const gemm_case *c, int be, double min_time, double *gflops,
                           double *cpu_gflops) {
    double flop = 2.0 * c->M * c->N * c->K;
    int iters = 0;
    double t0 = dt_now(), c0 = cpu_seconds(), t;
    do {
        DT_CHECK(run_once(c, be));
        iters++;
        t = dt_now() - t0;
    } while (t < min_time);
    *gflops = flop * iters / t * 1e-9;
    *cpu_gflops = flop * iters / (cpu_seconds() - c0) * 1e-9;
    return DT_OK;
}

static int parse_shapes(const char *text, int (*out)[3], int max) {
    int n = 0;
    const char *p = text;
    while (*p && n < max) {
        int used = 0;
        if (sscanf(p, "%dx%dx%d%n", &out[n][0], &out[n][1], &out[n][2], &used) != 3 ||
            out[n][0] < 1 || out[n][1] < 1 || out[n][2] < 1)
            return -1;
        n++;
        p += used;
        if (*p == ',')
            p++;
        else if (*p)
            return -1;
    }
    return n;
}

static int run_gemm_bf16(cli_args *a) {
    dt_status st = dt_isa_init();
    if (st != DT_OK)
        return cli_fail(st);
    int shapes[32][3];
    int nshapes = parse_shapes(cli_str(a, "shapes"), shapes, 32);
    if (nshapes <= 0)
        cli_usage_error(a->cmd, "--shapes: \"%s\" is not a list like 256x768x768,64x64x64",
                        cli_str(a, "shapes"));
    bool use[DT_GEMM_BACKEND_COUNT] = {false}, use_f16 = false;
    char list[256];
    snprintf(list, sizeof list, "%s", cli_str(a, "backends"));
    for (char *save = NULL, *tok = strtok_r(list, ",", &save); tok;
         tok = strtok_r(NULL, ",", &save)) {
        dt_gemm_backend be;
        if (strcmp(tok, "f16") == 0) {
            use_f16 = true;
            continue;
        }
        if (dt_gemm_backend_parse("--backends", tok, &be) != DT_OK || be == DT_GEMM_AUTO)
            cli_usage_error(a->cmd,
                            "--backends: unknown backend '%s' (ref, onednn, openblas, "
                            "avx512, amx, sgemm, f16)",
                            tok);
        use[be] = true;
    }
    int threads = (int)cli_int(a, "threads");
    if (threads == 0)
        threads = cli_default_threads();
    /* As in training: OpenBLAS single-threaded, products split over the
     * OpenMP threads by dt_sgemm (the fp32 peer and the sgemm backends). */
    dt_tensor_set_threads(threads);
    int runs = (int)cli_int(a, "runs");
    double min_time = cli_double(a, "min-time");
    bool json = cli_bool(a, "json");
    int op_sel = cli_enum(a, "op");
    dt_gemm_out out = (dt_gemm_out)cli_enum(a, "out");
    static const dt_gemm_op ops[] = {DT_GEMM_NT, DT_GEMM_NN, DT_GEMM_TN};
    static const char *const op_names[] = {"nt", "nn", "tn"};

    const dt_cpu_features *f = dt_cpu_features_get();
    if (!json) {
        printf("# bf16 GEMM, fp32 accumulation, %s output; peer: fp32 dt_sgemm (OpenBLAS)\n",
               out_choices[out]);
        printf("# isa %s (cpu max %s), threads %d, %d runs of >= %.2f s each, median shown\n",
               dt_isa_name(dt_isa()), dt_isa_name(f->max_level), threads, runs, min_time);
        for (int be = DT_GEMM_REF; be < DT_GEMM_BACKEND_COUNT; be++) {
            char why[160];
            if (use[be] && !dt_gemm_backend_available((dt_gemm_backend)be, why, sizeof why))
                printf("# %s: unavailable: %s\n", dt_gemm_backend_name((dt_gemm_backend)be), why);
        }
        printf("%6s %6s %6s %3s  %-9s %10s %10s %10s %10s %8s %10s\n", "M", "N", "K", "op",
               "backend", "ms", "GFLOP/s", "min", "max", "vs fp32", "GF/cpu-s");
    }
    double *g = malloc((size_t)runs * (DT_GEMM_BACKEND_COUNT + 2) * sizeof *g);
    double *gc = malloc((size_t)runs * (DT_GEMM_BACKEND_COUNT + 2) * sizeof *gc);
    if (!g || !gc) {
        free(g);
        free(gc);
        return cli_fail(DT_ERR_NOMEM);
    }
    dt_rng rng;
    dt_rng_init(&rng, 1, dt_rng_stream_id(0, 0, DT_RNG_TEST));
    int rc = 0;
    for (int s = 0; s < nshapes && rc == 0; s++) {
        int M0 = shapes[s][0], N0 = shapes[s][1], K0 = shapes[s][2];
        gemm_case c = {.M = M0, .N = N0, .K = K0, .out = out};
        /* Every buffer big enough for any of the three layer shapes. */
        size_t mk = (size_t)M0 * K0, kn = (size_t)K0 * N0, mn = (size_t)M0 * N0;
        size_t big = mk > kn ? mk : kn;
        big = big > mn ? big : mn;
        size_t na = big, nb = big, nc = big;
        c.A32 = dt_alloc(na * 4), c.B32 = dt_alloc(nb * 4), c.C = dt_alloc(nc * 4);
        c.A = dt_alloc(na * 2), c.B = dt_alloc(nb * 2);
        c.A16 = dt_alloc(na * 2), c.B16 = dt_alloc(nb * 2);
        if (!c.A32 || !c.B32 || !c.C || !c.A || !c.B || !c.A16 || !c.B16) {
            rc = cli_fail(DT_ERR_NOMEM);
            goto next;
        }
        for (size_t i = 0; i < na; i++)
            c.A32[i] = dt_rng_normal(&rng);
        for (size_t i = 0; i < nb; i++)
            c.B32[i] = dt_rng_normal(&rng) * 0.02f;
        dt_f32_to_bf16(c.A, c.A32, na);
        dt_f32_to_bf16(c.B, c.B32, nb);
        dt_f32_to_f16(c.A16, c.A32, na);
        dt_f32_to_f16(c.B16, c.B32, nb);
        for (int oi = 0; oi < 3; oi++) {
            if (op_sel != OP_SEL_ALL && op_sel != OP_SEL_LAYER && op_sel != oi)
                continue;
            if (op_sel == OP_SEL_LAYER) { /* ops[] is NT, NN, TN */
                int dims[3][3] = {{M0, N0, K0}, {M0, K0, N0}, {N0, K0, M0}};
                c.M = dims[oi][0], c.N = dims[oi][1], c.K = dims[oi][2];
            }
            c.op = ops[oi];
            /* The backends take turns run by run, so that load from other
             * processes on a shared machine falls on all of them alike. */
            int bes[DT_GEMM_BACKEND_COUNT + 2], nbe = 0;
            for (int be = -1; be < DT_GEMM_BACKEND_COUNT; be++)
                if (be < 0 || (use[be] && dt_gemm_backend_available((dt_gemm_backend)be, NULL, 0)))
                    bes[nbe++] = be;
            if (use_f16)
                bes[nbe++] = BE_F16;
            for (int b = 0; b < nbe; b++) { /* warm-up: primitive creation, page faults */
                if ((st = run_once(&c, bes[b])) != DT_OK) {
                    rc = cli_fail(st);
                    goto next;
                }
            }
            for (int r = 0; r < runs; r++) {
                for (int b = 0; b < nbe; b++) {
                    if ((st = timed_run(&c, bes[b], min_time, &g[b * runs + r],
                                        &gc[b * runs + r])) != DT_OK) {
                        rc = cli_fail(st);
                        goto next;
                    }
                }
            }
            double base = 0;
            for (int b = 0; b < nbe; b++) {
                double *gb = g + b * runs;
                cli_sort_doubles(gb, (size_t)runs);
                cli_sort_doubles(gc + b * runs, (size_t)runs);
                double cmed = gc[b * runs + runs / 2];
                double med = gb[runs / 2];
                if (b == 0)
                    base = med;
                const char *name = bes[b] < 0 ? "sgemm-f32"
                                   : bes[b] == BE_F16
                                       ? "f16-sgemm"
                                       : dt_gemm_backend_name((dt_gemm_backend)bes[b]);
                double ms = 2.0 * c.M * c.N * c.K / med * 1e-6;
                if (json)
                    cli_json_line(json_pack(
                        "{s:s, s:i, s:i, s:i, s:s, s:s, s:s, s:s, s:i, s:o, s:o, s:o, s:o, s:o, "
                        "s:o}",
                        "bench", "gemm-bf16", "M", c.M, "N", c.N, "K", c.K, "op", op_names[oi],
                        "backend", name, "out", out_choices[out], "isa", dt_isa_name(dt_isa()),
                        "threads", threads, "ms", cli_json_num(ms), "gflops", cli_json_num(med),
                        "gflops_min", cli_json_num(gb[0]), "gflops_max", cli_json_num(gb[runs - 1]),
                        "vs_fp32", cli_json_num(med / base), "gflops_per_cpu_s",
                        cli_json_num(cmed)));
                else
                    printf("%6d %6d %6d %3s  %-9s %10.3f %10.1f %10.1f %10.1f %7.2fx %10.1f\n", c.M,
                           c.N, c.K, op_names[oi], name, ms, med, gb[0], gb[runs - 1], med / base,
                           cmed);
            }
            fflush(stdout);
        }
    next:
        dt_free(c.A32), dt_free(c.B32), dt_free(c.C), dt_free(c.A), dt_free(c.B);
        dt_free(c.A16), dt_free(c.B16);
    }
    free(g);
    free(gc);
    dt_gemm_release();
    return rc;
}

const cli_cmd cli_bench_gemm_bf16 = {
    .name = "gemm-bf16",
    .parent = "bench",
    .summary = "bf16 GEMM backends vs fp32 sgemm (GFLOP/s)",
    .usage = "dtrain bench gemm-bf16 [--shapes MxNxK,...] [--op nt|nn|tn|all] [--runs N]",
    .description = "Times C(M,N) = A x B with bf16 inputs and fp32 accumulation on each backend\n"
                   "(DT_ISA lowers the instruction set) against fp32 dt_sgemm on the same\n"
                   "shapes and threads. Default shapes: GPT-2 124M linear layers at B*T = 256.",
    .opts = gemm_opts,
    .run = run_gemm_bf16,
};
