/*
 * bench_attention.c — `dtrain bench attention`: causal attention forward and
 * backward (fp32, flash style, O(T) memory) at one shape, the AVX-512
 * register-tile kernels against the tile-sgemm path they replaced, in the
 * same run. Default shape: shakespeare-char (B=8 T=256 C=384 NH=6, head
 * size 64) on one thread.
 *
 * The methods take turns within each round; a run repeats the call until it
 * has taken --min-time seconds; the median, fastest and slowest run are
 * shown. GFLOP/s counts the causal work only: per (sequence, head) the
 * T (T+1) / 2 visible (query, key) pairs times 2 HS flops per product, with
 * two products in forward (Q K^T, P V) and five in backward (Q K^T again,
 * dO V^T, P^T dO, dS^T Q, dS K); the softmax, masks and packing are not
 * counted. The kernels' outputs are compared with the tiles' (max |diff|
 * relative to max |value|).
 */
#include "cli.h"
#include "tensor/attention_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const cli_opt att_opts[] = {
    {"batch", 'b', CLI_INT, "B", "8", NULL, "sequences", NULL, 1, 1 << 20},
    {"seq", 's', CLI_INT, "T", "256", NULL, "sequence length", NULL, 1, 1 << 20},
    {"dim", 0, CLI_INT, "C", "384", NULL, "model width (heads x head size)", NULL, 1, 1 << 20},
    {"heads", 0, CLI_INT, "NH", "6", NULL, "attention heads", NULL, 1, 4096},
    {"threads", 't', CLI_INT, "N", "1", NULL, "threads", NULL, 1, 4096},
    {"runs", 'r', CLI_INT, "R", "5", NULL, "timed runs per method (median shown)", NULL, 1, 1000},
    {"min-time", 0, CLI_DOUBLE, "S", "0.2", NULL, "seconds per run", NULL, 0.001, 60},
    {0},
};

enum { M_AVX512, M_TILES, NMETHODS };
static const char *const method_names[NMETHODS] = {"avx512", "tiles"};

typedef struct att_buf {
    int B, T, C, NH;
    float *qkv, *dout, *out[NMETHODS], *lse[NMETHODS], *dqkv[NMETHODS];
} att_buf;

/* "avx512" is the public entry point (the kernels where they take the head
 * size, else the tiles); "tiles" always the tile path. */
static void forward(int m, att_buf *u) {
    if (m == M_AVX512)
        dt_attention_forward(u->out[m], u->lse[m], u->qkv, u->B, u->T, u->C, u->NH);
    else
        dt__attention_forward_tiles(u->out[m], u->lse[m], u->qkv, u->B, u->T, u->C, u->NH);
}

static void backward(int m, att_buf *u) {
    if (m == M_AVX512)
        dt_attention_backward(u->dqkv[m], u->dout, u->qkv, u->out[m], u->lse[m], u->B, u->T, u->C,
                              u->NH);
    else
        dt__attention_backward_tiles(u->dqkv[m], u->dout, u->qkv, u->out[m], u->lse[m], u->B, u->T,
                                     u->C, u->NH);
}

static double rel_diff(const float *x, const float *ref, size_t n) {
    double mx = 0.0, d = 0.0;
    for (size_t i = 0; i < n; i++) {
        mx = fmax(mx, fabs(ref[i]));
        d = fmax(d, fabs((double)x[i] - ref[i]));
    }
    return d / (mx > 0 ? mx : 1);
}

/* Seconds per call of forward (pass 0) or backward (pass 1), one run. */
static double time_run(int m, int pass, att_buf *u, double min_time) {
    int n = 0;
    double t0 = dt_now(), t;
    do {
        if (pass == 0)
            forward(m, u);
        else
            backward(m, u);
        n++;
        t = dt_now() - t0;
    } while (t < min_time);
    return t / n;
}

static int run_att(cli_args *a) {
    att_buf u = {.B = (int)cli_int(a, "batch"),
                 .T = (int)cli_int(a, "seq"),
                 .C = (int)cli_int(a, "dim"),
                 .NH = (int)cli_int(a, "heads")};
    int runs = (int)cli_int(a, "runs");
    double min_time = cli_double(a, "min-time");
    if (u.C % u.NH != 0 || u.C / u.NH > 256) {
        fprintf(stderr,
                "dtrain bench attention: --dim %d must be a multiple of --heads %d with a head "
                "size <= 256\n",
                u.C, u.NH);
        return 2;
    }
    dt_tensor_set_threads((int)cli_int(a, "threads"));
    size_t n = (size_t)u.B * u.T * u.C, nl = (size_t)u.B * u.NH * u.T;
    u.qkv = dt_alloc(3 * n * sizeof(float));
    u.dout = dt_alloc(n * sizeof(float));
    bool ok = u.qkv && u.dout;
    for (int m = 0; m < NMETHODS; m++) {
        u.out[m] = dt_alloc(n * sizeof(float));
        u.lse[m] = dt_alloc(nl * sizeof(float));
        u.dqkv[m] = dt_alloc(3 * n * sizeof(float));
        ok = ok && u.out[m] && u.lse[m] && u.dqkv[m];
    }
    if (!ok) {
        fprintf(stderr, "dtrain bench attention: out of memory for B=%d T=%d C=%d\n", u.B, u.T,
                u.C);
        return 1;
    }
    dt_rng r;
    dt_rng_init(&r, 1, dt_rng_stream_id(0, 0, DT_RNG_TEST));
    for (size_t i = 0; i < 3 * n; i++)
        u.qkv[i] = dt_rng_normal(&r);
    for (size_t i = 0; i < n; i++)
        u.dout[i] = dt_rng_normal(&r);
    for (int m = 0; m < NMETHODS; m++) {
        forward(m, &u);
        backward(m, &u);
    }
    bool have = dt__attention_avx512_ok(u.C, u.NH);
    int HS = u.C / u.NH;
    double pairs = (double)u.B * u.NH * u.T * (u.T + 1) / 2.0;
    double flops[2] = {2 * 2.0 * HS * pairs, 5 * 2.0 * HS * pairs};
    printf("# causal attention fp32, B=%d T=%d C=%d NH=%d (head size %d), %d thread(s), isa %s; "
           "avx512 kernels %s; median of %d runs of >= %.2f s (methods alternate)\n",
           u.B, u.T, u.C, u.NH, HS, dt_tensor_threads(), dt_isa_name(dt_isa()),
           have ? "active" : "unavailable (tiles shown twice)", runs, min_time);
    printf("# GFLOP/s: causal products only, 2 HS flops per visible (query, key) pair per "
           "product; forward 2 products, backward 5 (scores recomputed)\n");
    printf("%-9s %-7s %9s %9s %9s %9s %9s\n", "pass", "method", "ms", "min", "max", "GFLOP/s",
           "rel.err");
    double *ts = malloc(sizeof(double) * NMETHODS * runs), med[2][NMETHODS];
    if (!ts)
        return 1;
    for (int pass = 0; pass < 2; pass++) {
        for (int rd = 0; rd < runs; rd++)
            for (int m = 0; m < NMETHODS; m++)
                ts[m * runs + rd] = time_run(m, pass, &u, min_time);
        for (int m = 0; m < NMETHODS; m++) {
            double *t = ts + m * runs;
            cli_sort_doubles(t, runs);
            med[pass][m] = t[runs / 2];
            double err = pass == 0 ? rel_diff(u.out[m], u.out[M_TILES], n)
                                   : rel_diff(u.dqkv[m], u.dqkv[M_TILES], 3 * n);
            printf("%-9s %-7s %9.3f %9.3f %9.3f %9.1f %9.1e\n", pass ? "backward" : "forward",
                   method_names[m], t[runs / 2] * 1e3, t[0] * 1e3, t[runs - 1] * 1e3,
                   flops[pass] / t[runs / 2] * 1e-9, err);
        }
    }
    printf("# forward+backward: avx512 %.3f ms, tiles %.3f ms (%.2fx)\n",
           (med[0][M_AVX512] + med[1][M_AVX512]) * 1e3, (med[0][M_TILES] + med[1][M_TILES]) * 1e3,
           (med[0][M_TILES] + med[1][M_TILES]) / (med[0][M_AVX512] + med[1][M_AVX512]));
    free(ts);
    dt_free(u.qkv), dt_free(u.dout);
    for (int m = 0; m < NMETHODS; m++)
        dt_free(u.out[m]), dt_free(u.lse[m]), dt_free(u.dqkv[m]);
    return 0;
}

const cli_cmd cli_bench_attention = {
    .name = "attention",
    .parent = "bench",
    .summary = "causal attention fwd/bwd: AVX-512 register tiles vs tile sgemm",
    .usage = "dtrain bench attention [--batch B] [--seq T] [--dim C] [--heads NH] [--threads N] "
             "[--runs R] [--min-time S]",
    .opts = att_opts,
    .run = run_att,
};
