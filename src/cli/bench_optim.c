/*
 * bench_optim.c — `dtrain bench optim`: time the optimizer kernels on one
 * flat buffer of N parameters, the way a training step calls them.
 *
 * Each kernel runs `--steps` times after one warm-up call; the table shows
 * the median time and the memory bandwidth it implies (bytes each element
 * reads and writes: AdamW 28 = p,g,m,v in and p,m,v out; SGD with momentum
 * 20; sum of squares 4; scale 8). These kernels are memory-bound, so GB/s
 * against the machine's bandwidth is the figure that matters.
 * bench/compare-pytorch-optim.py runs PyTorch's AdamW on the same size.
 */
#include "cli.h"
#include "dtrain/optim.h"

#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const cli_opt optim_opts[] = {
    {"params", 0, CLI_SIZE, "N", "16M", NULL, "number of parameters (one flat buffer)", NULL, 1,
     1e12},
    {"threads", 't', CLI_INT, "K", "0", "DT_THREADS", "threads (0: every CPU)", NULL, 0, 4096},
    {"steps", 0, CLI_INT, "S", "10", NULL, "timed calls per kernel (median shown)", NULL, 1, 1e6},
    {"json", 0, CLI_FLAG, NULL, NULL, NULL, "one JSON object per kernel instead of a table", NULL,
     0, 0},
    {0},
};

enum { K_ADAMW, K_SGD, K_SUMSQ, K_SCALE, K_COUNT };
static const char *const kernel_names[K_COUNT] = {"adamw", "sgd-nesterov", "grad-sumsq", "scale"};
static const int kernel_bytes[K_COUNT] = {28, 20, 4, 8};

static int run_optim(cli_args *a) {
    size_t n = cli_size(a, "params");
    int threads = (int)cli_int(a, "threads");
    int steps = (int)cli_int(a, "steps");
    bool json = cli_bool(a, "json");
    if (threads == 0)
        threads = cli_default_threads();
    omp_set_num_threads(threads);

    float *buf[4];
    for (int i = 0; i < 4; i++) {
        buf[i] = dt_alloc(n * sizeof(float));
        if (!buf[i])
            return cli_fail(DT_ERR_NOMEM);
    }
    float *p = buf[0], *g = buf[1], *m = buf[2], *v = buf[3];
    /* First touch in parallel, as the kernels will use the pages. */
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) {
        p[i] = 0.01f * (float)(i % 1000);
        g[i] = 1e-3f * (float)((i * 7) % 101) - 0.05f;
        m[i] = 0.0f;
        v[i] = 0.0f;
    }
    dt_adamw_config c = dt_adamw_config_default();
    double *times = malloc((size_t)steps * sizeof *times);
    volatile double sink = 0.0;
    if (!json)
        printf("%-14s %12s %8s %8s %10s %10s\n", "kernel", "params", "threads", "steps", "ms (med)",
               "GB/s");
    for (int k = 0; k < K_COUNT; k++) {
        for (int s = -1; s < steps; s++) {
            double t0 = dt_now();
            switch (k) {
            case K_ADAMW: dt_adamw_step(p, g, m, v, n, 1e-4f, &c, s + 2, c.weight_decay); break;
            case K_SGD: dt_sgd_step(p, g, m, n, 1e-4f, 0.9f, true, 0.0f); break;
            case K_SUMSQ: sink += dt_grad_sumsq(g, n); break;
            case K_SCALE: dt_scale(g, n, 1.0f); break;
            }
            if (s >= 0)
                times[s] = dt_now() - t0;
        }
        cli_sort_doubles(times, (size_t)steps);
        double med = times[steps / 2];
        double gbs = (double)n * kernel_bytes[k] / med * 1e-9;
        if (json)
            cli_json_line(json_pack("{s:s, s:I, s:i, s:i, s:o, s:o}", "kernel", kernel_names[k],
                                    "params", (json_int_t)n, "threads", threads, "steps", steps,
                                    "ms", cli_json_num(med * 1e3), "gbps", cli_json_num(gbs)));
        else
            printf("%-14s %12zu %8d %8d %10.3f %10.2f\n", kernel_names[k], n, threads, steps,
                   med * 1e3, gbs);
    }
    free(times);
    for (int i = 0; i < 4; i++)
        dt_free(buf[i]);
    return sink < 0.0 ? 1 : 0;
}

const cli_cmd cli_bench_optim = {
    .name = "optim",
    .parent = "bench",
    .summary = "optimizer kernels: AdamW, SGD, sum of squares, scale",
    .usage = "dtrain bench optim [--params N --threads K --steps S --json]",
    .opts = optim_opts,
    .run = run_optim,
};
