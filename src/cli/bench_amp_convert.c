/*
 * bench_amp_convert.c — `dtrain bench amp-convert`: throughput of the 16-bit
 * conversions, the inf/nan check and unscale at every ISA level this CPU
 * has, so the vector paths are measured against the scalar one in one run.
 * Bandwidth counts bytes read + written; the median of --runs is shown.
 */
#include "cli.h"
#include "dtrain/amp.h"

#include <stdlib.h>

static const cli_opt convert_opts[] = {
    {"count", 0, CLI_SIZE, "N", "4M", NULL, "elements per call", NULL, 1, 1e10},
    {"runs", 'r', CLI_INT, "N", "5", NULL, "timed runs per case (median shown)", NULL, 3, 1000},
    {0},
};

enum { OP_TO_BF16, OP_FROM_BF16, OP_TO_F16, OP_FROM_F16, OP_INF_CHECK, OP_UNSCALE, OP_COUNT };
static const char *const op_names[OP_COUNT] = {"f32->bf16", "bf16->f32",     "f32->f16",
                                               "f16->f32",  "inf/nan check", "unscale"};
static const int op_bytes[OP_COUNT] = {6, 6, 6, 6, 4, 8}; /* per element, read + written */

static int run_convert(cli_args *a) {
    dt_status st = dt_isa_init();
    if (st != DT_OK)
        return cli_fail(st);
    size_t n = cli_size(a, "count");
    int runs = (int)cli_int(a, "runs");
    float *x = dt_alloc(n * sizeof *x), *y = dt_alloc(n * sizeof *y);
    uint16_t *h = dt_alloc(n * sizeof *h);
    double *t = malloc((size_t)runs * sizeof *t);
    if (!x || !y || !h || !t)
        return cli_fail(DT_ERR_NOMEM);
    dt_rng r;
    dt_rng_init(&r, 3, dt_rng_stream_id(0, 0, DT_RNG_TEST));
    for (size_t i = 0; i < n; i++)
        x[i] = dt_rng_normal(&r);
    dt_isa_level top = dt_isa();
    printf("# %zu elements per call, %d runs, median; GB/s counts bytes read + written\n", n, runs);
    printf("%-14s", "op");
    for (int l = 0; l <= (int)top; l++)
        printf(" %11s", dt_isa_name((dt_isa_level)l));
    printf("   (GB/s)\n");
    volatile bool sink = false;
    for (int op = 0; op < OP_COUNT; op++) {
        printf("%-14s", op_names[op]);
        for (int l = 0; l <= (int)top; l++) {
            dt_isa_set((dt_isa_level)l);
            for (int rep = 0; rep < runs + 1; rep++) { /* the first is a warm-up */
                double t0 = dt_now();
                switch (op) {
                case OP_TO_BF16: dt_f32_to_bf16(h, x, n); break;
                case OP_FROM_BF16: dt_bf16_to_f32(y, h, n); break;
                case OP_TO_F16: dt_f32_to_f16(h, x, n); break;
                case OP_FROM_F16: dt_f16_to_f32(y, h, n); break;
                case OP_INF_CHECK: sink = sink ^ dt_has_inf_nan(x, n); break;
                case OP_UNSCALE: sink = sink ^ dt_unscale(y, n, 1.0f); break;
                }
                if (rep > 0)
                    t[rep - 1] = dt_now() - t0;
            }
            cli_sort_doubles(t, (size_t)runs);
            printf(" %11.2f", (double)n * op_bytes[op] / t[runs / 2] * 1e-9);
            fflush(stdout);
        }
        printf("\n");
    }
    dt_isa_set(top);
    dt_free(x), dt_free(y), dt_free(h), free(t);
    return 0;
}

const cli_cmd cli_bench_amp_convert = {
    .name = "amp-convert",
    .parent = "bench",
    .summary = "16-bit conversions and inf/nan check, per ISA level (GB/s)",
    .usage = "dtrain bench amp-convert [--count N] [--runs N]",
    .opts = convert_opts,
    .run = run_convert,
};
