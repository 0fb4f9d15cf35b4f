/*
 * bench_optim.c — `dtrain bench optim`: time the optimizer kernels on one
 * flat buffer of N parameters, the way a training step calls them, and
 * (with --model) the state every optimizer keeps for a model.
 *
 * Each kernel runs `--steps` times after one warm-up call; the table shows
 * the median time and the memory bandwidth it implies (bytes each element
 * moves: AdamW 28 = p,g,m,v in and p,m,v out; SGD with momentum 20; sum of
 * squares 4; scale 8; the optimizer objects as listed in `bytes` below,
 * all their passes counted). These kernels are memory-bound, so GB/s
 * against the machine's bandwidth is the figure that matters.
 * bench/compare-pytorch-optim.py runs PyTorch's AdamW, SGD and RAdam on the
 * same size; bench/optimizers.sh trains with each optimizer.
 *
 * The optimizer objects see the buffer as 8 matrices of n/8 values (rows
 * of 1024), so that the layer-wise kinds have tensors to work on.
 */
#include "cli.h"
#include "dtrain/nn.h"
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
    {"kernels", 'k', CLI_STRING, "LIST", "all", NULL,
     "comma-separated kernels to time (names as in the table), or all", NULL, 0, 0},
    {"model", 0, CLI_STRING, "PRESET", NULL, NULL,
     "instead of timing: each optimizer's state per parameter on this model's tensors", NULL, 0, 0},
    {"json", 0, CLI_FLAG, NULL, NULL, NULL, "one JSON object per kernel instead of a table", NULL,
     0, 0},
    {0},
};

/* The kernels: the range functions, then optimizer objects. */
typedef struct kernel {
    const char *name;
    int bytes;          /* per parameter per step, all passes */
    dt_optim_kind kind; /* objects: the kind; DT_OPTIM_COUNT for a range function */
} kernel;

enum { K_ADAMW, K_SGD, K_SUMSQ, K_SCALE, K_RANGE_COUNT };

/* clang-format off */
static const kernel kernels[] = {
    {"adamw",          28, DT_OPTIM_COUNT},
    {"sgd-nesterov",   20, DT_OPTIM_COUNT},
    {"grad-sumsq",      4, DT_OPTIM_COUNT},
    {"scale",           8, DT_OPTIM_COUNT},
    {"radam",          28, DT_OPTIM_RADAM},     /* p g m v in, p m v out */
    {"adamw8bit",      16, DT_OPTIM_ADAMW8BIT}, /* p g in, 2 bytes in; p out, 2 bytes out */
    {"lamb",           40, DT_OPTIM_LAMB},      /* p g m v in, m v out; p m v in, p out */
    {"lars",           28, DT_OPTIM_LARS},      /* p g in; p g b in, p b out */
    {"adafactor",      24, DT_OPTIM_ADAFACTOR}, /* p g in; g in; p g in, p out */
    {"adamw-object",   28, DT_OPTIM_ADAMW},
};
/* clang-format on */
#define NKERNELS (sizeof kernels / sizeof kernels[0])

static bool wanted(const char *list, const char *name) {
    if (strcmp(list, "all") == 0)
        return true;
    size_t n = strlen(name);
    for (const char *p = list; (p = strstr(p, name)) != NULL; p += n)
        if ((p == list || p[-1] == ',') && (p[n] == ',' || p[n] == '\0'))
            return true;
    return false;
}

static dt_optim_config object_config(dt_optim_kind kind) {
    dt_optim_config c = dt_optim_config_default();
    c.kind = kind;
    c.momentum = 0.9f;
    return c;
}

/* --model: state bytes per parameter of every kind on the model's tensors
 * (all of them, and the matrices alone). L-BFGS and K-FAC are computed, not
 * built: L-BFGS's (2 m + 6) vectors and K-FAC's factors would not fit for a
 * large model. K-FAC: momentum, then per block linear layer (in, out) the
 * factors and their inverses in float, 2 (in^2 + out^2) values, and their
 * double accumulators, (in^2 + out^2) values. */
static int state_table(const char *model, bool json) {
    dt_gpt_config mc;
    if (dt_gpt_preset(model, &mc) != DT_OK)
        return cli_fail(DT_ERR_INVALID);
    if (mc.vocab == 0)
        mc.vocab = 50257;
    dt_param_info *all;
    if (dt_gpt_config_tensors(&mc, &all) != DT_OK)
        return cli_fail(DT_ERR_NOMEM);
    size_t nt = dt_gpt_config_num_tensors(&mc), n = 0, nmat = 0;
    dt_optim_tensor *tab = calloc(nt, sizeof *tab), *mats = calloc(nt, sizeof *mats);
    size_t nm = 0;
    double kfac_bytes = 0;
    for (size_t i = 0; i < nt; i++) {
        const char *nmv = all[i].name;
        size_t ln = strlen(nmv);
        if (strncmp(nmv, "h.", 2) == 0 && ln > 7 && strcmp(nmv + ln - 7, ".weight") == 0 &&
            (strstr(nmv, ".c_attn.") || strstr(nmv, ".c_proj.") || strstr(nmv, ".c_fc."))) {
            double a = (double)all[i].cols * all[i].cols, g = (double)all[i].rows * all[i].rows;
            kfac_bytes += 2 * (a + g) * sizeof(float) + (a + g) * sizeof(double);
        }
        size_t count = all[i].rows * all[i].cols;
        bool mat = all[i].rows > 1;
        tab[i] = (dt_optim_tensor){
            n, count, all[i].decay, mat ? all[i].rows : 0, mat ? all[i].cols : 0, false};
        if (mat) {
            mats[nm] = tab[i];
            mats[nm++].offset = nmat;
            nmat += count;
        }
        n += count;
    }
    free(all);
    if (!json)
        printf("%s: %zu parameters, %zu in matrices\n%-12s %16s %18s\n", model, n, nmat,
               "optimizer", "bytes/param", "bytes/param (mat)");
    for (int k = 0; k < DT_OPTIM_COUNT; k++) {
        double per[2];
        for (int m = 0; m < 2; m++) {
            size_t np = m ? nmat : n;
            if (k == DT_OPTIM_LBFGS) { /* the default history of 10 */
                per[m] = (2.0 * 10 + 6) * sizeof(float);
                continue;
            }
            if (k == DT_OPTIM_KFAC) { /* momentum 0.9 */
                per[m] = sizeof(float) + kfac_bytes / (double)np;
                continue;
            }
            dt_optim_config c = object_config((dt_optim_kind)k);
            c.freeze_v_from = 1;
            if (k == DT_OPTIM_LOOKAHEAD)
                c.inner = DT_OPTIM_ADAMW;
            dt_optimizer *o;
            dt_status st =
                dt_optimizer_create(&o, &c, m ? mats : tab, m ? nm : nt, &(dt_range){0, np}, 1);
            if (st != DT_OK) {
                free(tab), free(mats);
                return cli_fail(st);
            }
            per[m] = (double)dt_optimizer_state_bytes(o) / (double)np;
            dt_optimizer_destroy(o);
        }
        if (json)
            cli_json_line(json_pack("{s:s, s:s, s:o, s:o}", "model", model, "optimizer",
                                    dt_optim_names[k], "bytes_per_param", cli_json_num(per[0]),
                                    "bytes_per_param_matrices", cli_json_num(per[1])));
        else
            printf("%-12s %16.4f %18.4f%s\n", dt_optim_names[k], per[0], per[1],
                   k == DT_OPTIM_LBFGS  ? "  (history 10)"
                   : k == DT_OPTIM_KFAC ? "  (factors, inverses, accumulators)"
                                        : "");
    }
    free(tab), free(mats);
    return 0;
}

static int run_optim(cli_args *a) {
    size_t n = cli_size(a, "params");
    int threads = (int)cli_int(a, "threads");
    int steps = (int)cli_int(a, "steps");
    const char *list = cli_str(a, "kernels");
    bool json = cli_bool(a, "json");
    if (threads == 0)
        threads = cli_default_threads();
    omp_set_num_threads(threads);
    if (cli_str(a, "model"))
        return state_table(cli_str(a, "model"), json);

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
    /* The objects' tensors: 8 matrices of rows of 1024 (the last takes the
     * remainder as a vector). */
    dt_optim_tensor tab[9];
    size_t nt = 0, per = n / 8 / 1024 * 1024;
    for (size_t off = 0; off < n; nt++) {
        size_t count = nt < 7 && per > 0 ? per : n - off;
        bool mat = count % 1024 == 0 && count >= 2048;
        tab[nt] =
            (dt_optim_tensor){off, count, true, mat ? count / 1024 : 0, mat ? 1024 : 0, false};
        off += count;
    }
    dt_adamw_config c = dt_adamw_config_default();
    double *times = malloc((size_t)steps * sizeof *times);
    volatile double sink = 0.0;
    if (!json)
        printf("%-14s %12s %8s %8s %10s %10s %12s\n", "kernel", "params", "threads", "steps",
               "ms (med)", "GB/s", "state B/par");
    for (size_t k = 0; k < NKERNELS; k++) {
        if (!wanted(list, kernels[k].name))
            continue;
        dt_optimizer *o = NULL;
        double state_per = k == K_ADAMW ? 8 : k == K_SGD ? 4 : 0;
        if (kernels[k].kind != DT_OPTIM_COUNT) {
            dt_optim_config oc = object_config(kernels[k].kind);
            dt_status st = dt_optimizer_create(&o, &oc, tab, nt, &(dt_range){0, n}, 1);
            if (st != DT_OK)
                return cli_fail(st);
            state_per = (double)dt_optimizer_state_bytes(o) / (double)n;
        }
        for (int s = -1; s < steps; s++) {
            double t0 = dt_now();
            if (o) {
                dt_optimizer_begin(o, s + 1, 1e-4f);
                dt_status st = dt_optimizer_step(o, p, g);
                dt_optimizer_end(o, true);
                if (st != DT_OK)
                    return cli_fail(st);
            } else {
                switch (k) {
                case K_ADAMW: dt_adamw_step(p, g, m, v, n, 1e-4f, &c, s + 2, c.weight_decay); break;
                case K_SGD: dt_sgd_step(p, g, m, n, 1e-4f, 0.9f, true, 0.0f); break;
                case K_SUMSQ: sink += dt_grad_sumsq(g, n); break;
                case K_SCALE: dt_scale(g, n, 1.0f); break;
                }
            }
            if (s >= 0)
                times[s] = dt_now() - t0;
        }
        dt_optimizer_destroy(o);
        cli_sort_doubles(times, (size_t)steps);
        double med = times[steps / 2];
        double gbs = (double)n * kernels[k].bytes / med * 1e-9;
        if (json)
            cli_json_line(json_pack(
                "{s:s, s:I, s:i, s:i, s:o, s:o, s:o}", "kernel", kernels[k].name, "params",
                (json_int_t)n, "threads", threads, "steps", steps, "ms", cli_json_num(med * 1e3),
                "gbps", cli_json_num(gbs), "state_bytes_per_param", cli_json_num(state_per)));
        else
            printf("%-14s %12zu %8d %8d %10.3f %10.2f %12.4f\n", kernels[k].name, n, threads, steps,
                   med * 1e3, gbs, state_per);
    }
    free(times);
    for (int i = 0; i < 4; i++)
        dt_free(buf[i]);
    return sink < 0.0 ? 1 : 0;
}

const cli_cmd cli_bench_optim = {
    .name = "optim",
    .parent = "bench",
    .summary = "optimizer kernels and objects: time, bandwidth, state per parameter",
    .usage = "dtrain bench optim [--params N --threads K --steps S --kernels LIST --json] | "
             "--model PRESET",
    .opts = optim_opts,
    .run = run_optim,
};
