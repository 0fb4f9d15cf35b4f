/*
 * bench_act16.c — `dtrain bench act16`: every kernel of a GPT training step
 * in fp32 (dtrain/tensor.h) against its 16-bit form (dt_*16_*, amp.h) on the
 * shapes of one model preset, in the same run, and the per-step totals that
 * follow from how often a step calls each kernel.
 *
 * The 16-bit column includes what the 16-bit path adds around the kernels:
 * the cast of every weight to a 16-bit copy (once per step), and the casts
 * of the fp32 gradients (dres for the c_proj layers, dlogits for the head)
 * to 16 bits before a 16-bit linear backward. Each kernel is timed in
 * `--runs` rounds (fp32 and 16-bit taking turns), a round repeating the call
 * for at least --min-time seconds; the median round is shown. The totals
 * leave out the embedding, residual adds, cross-entropy and the optimizer,
 * which are fp32 in both paths.
 */
#include "cli.h"
#include "dtrain/amp.h"
#include "dtrain/nn.h"
#include "dtrain/tensor.h"

#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const char *const prec_choices[] = {"bf16", "fp16", NULL};

static const cli_opt act16_opts[] = {
    {"model", 'm', CLI_STRING, "PRESET", "gpt2-124m", NULL, "model preset (shapes)", NULL, 0, 0},
    {"batch", 'b', CLI_INT, "B", "4", NULL, "sequences per step", NULL, 1, 1 << 20},
    {"seq", 's', CLI_INT, "T", "64", NULL, "tokens per sequence", NULL, 1, 1 << 20},
    {"precision", 0, CLI_ENUM, NULL, "bf16", NULL, "16-bit type", prec_choices, 0, 0},
    {"runs", 'r', CLI_INT, "N", "5", NULL, "timed rounds per kernel (the median is shown)", NULL, 3,
     1000},
    {"min-time", 0, CLI_DOUBLE, "SEC", "0.05", NULL, "minimum duration of one round", NULL, 0,
     3600},
    {"threads", 't', CLI_INT, "N", "0", NULL, "threads (0: OMP_NUM_THREADS, else all CPUs)", NULL,
     0, 4096},
    {"only", 0, CLI_STRING, "KERNEL", "", NULL,
     "time only this kernel (a name of the first column, e.g. \"lm head\"; for perf)", NULL, 0, 0},
    {0},
};

/* Everything one kernel call may touch, allocated once for the largest use. */
typedef struct bufs {
    dt_precision p;
    int N, C, V, NH, B, T;
    float *x, *y, *dx, *dy, *w, *dw, *b, *db, *mean, *rstd, *lse, *work32;
    uint16_t *x16, *y16, *dy16, *w16, *qkv16;
    float *work16;
} bufs;

typedef enum kernel {
    K_LN,
    K_QKV,
    K_ATTN,
    K_APROJ,
    K_FC,
    K_GELU,
    K_FCPROJ,
    K_HEAD,
    K_CAST_W,
    K_COUNT
} kernel;

static const char *const kernel_names[K_COUNT] = {"layernorm", "qkv",     "attention",
                                                  "attn proj", "fc",      "gelu",
                                                  "fc proj",   "lm head", "weight cast"};

/* Calls per step of each kernel: per block (x layers), or once. */
static int per_step(kernel k, int L) {
    switch (k) {
    case K_LN: return 2 * L + 1;
    case K_HEAD:
    case K_CAST_W: return 1;
    default: return L;
    }
}

/* One forward + backward of kernel k, fp32 (half = false) or 16-bit. */
static void run_kernel(bufs *u, kernel k, bool half) {
    int N = u->N, C = u->C, V = u->V;
    dt_precision p = u->p;
    size_t nc = (size_t)N * C;
    int ic = C, oc = C;
    bool f32_out = false, bias = true;
    switch (k) {
    case K_LN:
        if (half)
            dt_layernorm16_forward(p, u->y16, u->mean, u->rstd, u->x, u->w, u->b, N, C);
        else
            dt_layernorm_forward(u->y, u->mean, u->rstd, u->x, u->w, u->b, N, C);
        dt_layernorm_backward(u->dx, u->dw, u->db, u->dy, u->x, u->w, u->mean, u->rstd, N, C);
        return;
    case K_ATTN:
        if (half) {
            dt_attention16_forward(p, u->y16, u->lse, u->qkv16, u->B, u->T, C, u->NH, u->work16);
            dt_attention16_backward(p, u->dy16, u->dy, u->qkv16, u->y16, u->lse, u->B, u->T, C,
                                    u->NH, u->work16);
        } else {
            dt_attention_forward(u->y, u->lse, u->x, u->B, u->T, C, u->NH);
            dt_attention_backward(u->dx, u->dy, u->x, u->y, u->lse, u->B, u->T, C, u->NH);
        }
        return;
    case K_GELU:
        if (half) {
            dt_gelu16_forward(p, u->y16, u->x16, 4 * nc);
            dt_gelu16_backward(p, u->dy16, u->x16, u->dy, 4 * nc);
        } else {
            dt_gelu_forward(u->y, u->x, 4 * nc);
            dt_gelu_backward(u->dx, u->x, u->dy, 4 * nc);
        }
        return;
    case K_CAST_W: /* the 16-bit path only: cast of all weights, here ~ the model's */
        if (half)
            dt_act16_from_f32(p, u->w16, u->w, (size_t)V * C + 12 * (size_t)C * C * 12);
        return;
    case K_QKV: oc = 3 * C; break;
    case K_APROJ: f32_out = true; break;
    case K_FC: oc = 4 * C; break;
    case K_FCPROJ: ic = 4 * C, f32_out = true; break;
    case K_HEAD: oc = V, f32_out = true, bias = false; break;
    default: return;
    }
    size_t nout = (size_t)N * oc;
    if (!half) {
        dt_matmul_forward(u->y, u->x, u->w, bias ? u->b : NULL, N, ic, oc);
        dt_matmul_backward(u->dx, u->dw, bias ? u->db : NULL, u->dy, u->x, u->w, N, ic, oc);
        return;
    }
    (void)dt_linear16_forward(p, f32_out ? (void *)u->y : (void *)u->y16, f32_out, u->x16, u->w16,
                              bias ? u->b : NULL, N, ic, oc);
    /* A layer with fp32 output gets an fp32 gradient: the path casts it. */
    if (f32_out)
        dt_act16_from_f32(p, u->dy16, u->dy, nout);
    (void)dt_linear16_backward(p, u->dx, u->dw, bias ? u->db : NULL, u->dy16, u->x16, u->w16, N, ic,
                               oc);
}

static double cpu_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Median over rounds of the wall seconds per call (out) and of the process
 * CPU seconds per call (cpu: on a shared machine, time spent descheduled
 * inflates the wall clock but not this). */
static void time_kernel(bufs *u, kernel k, int runs, double min_time, double out[2],
                        double cpu[2]) {
    double *t[2] = {malloc(sizeof(double) * runs), malloc(sizeof(double) * runs)};
    double *c[2] = {malloc(sizeof(double) * runs), malloc(sizeof(double) * runs)};
    for (int h = 0; h < 2; h++)
        run_kernel(u, k, h); /* warm-up: oneDNN primitives, scratch, pages */
    for (int r = 0; r < runs; r++)
        for (int h = 0; h < 2; h++) {
            int calls = 0;
            double t0 = dt_now(), c0 = cpu_now(), el;
            do {
                run_kernel(u, k, h);
                calls++;
            } while ((el = dt_now() - t0) < min_time);
            t[h][r] = el / calls;
            c[h][r] = (cpu_now() - c0) / calls;
        }
    for (int h = 0; h < 2; h++) {
        cli_sort_doubles(t[h], (size_t)runs);
        cli_sort_doubles(c[h], (size_t)runs);
        out[h] = t[h][runs / 2];
        cpu[h] = c[h][runs / 2];
        free(t[h]);
        free(c[h]);
    }
}

static float *falloc(size_t n, dt_rng *r, float scale) {
    float *x = dt_alloc(n * sizeof *x);
    if (x)
        for (size_t i = 0; i < n; i++)
            x[i] = scale * (2.0f * dt_rng_uniform(r) - 1.0f);
    return x;
}

static int run_act16(cli_args *a) {
    dt_gpt_config cfg;
    dt_status st = dt_gpt_preset(cli_str(a, "model"), &cfg);
    if (st != DT_OK)
        return cli_fail(st);
    int threads = (int)cli_int(a, "threads");
    dt_tensor_set_threads(threads ? threads : cli_default_threads());
    bufs u = {.p = cli_enum(a, "precision") == 0 ? DT_PRECISION_BF16 : DT_PRECISION_FP16,
              .B = (int)cli_int(a, "batch"),
              .T = (int)cli_int(a, "seq"),
              .C = cfg.dim,
              .V = cfg.vocab,
              .NH = cfg.heads};
    u.N = u.B * u.T;
    size_t N = (size_t)u.N, C = (size_t)u.C, V = (size_t)u.V;
    size_t act = N * (V > 4 * C ? V : 4 * C); /* the widest activation */
    size_t wmax = V * C + 144 * C * C;        /* weight-cast size, >= the head */
    dt_rng r;
    dt_rng_init(&r, 1, 0);
    u.x = falloc(act, &r, 1.0f), u.y = falloc(act, &r, 1.0f), u.dx = falloc(act, &r, 1.0f);
    u.dy = falloc(act, &r, 1e-3f), u.w = falloc(wmax, &r, 0.02f), u.dw = falloc(wmax, &r, 0.0f);
    u.b = falloc(V + 4 * C, &r, 0.1f), u.db = falloc(V + 4 * C, &r, 0.0f),
    u.mean = falloc(N, &r, 0);
    u.rstd = falloc(N, &r, 0), u.lse = falloc(N * (size_t)u.NH, &r, 0);
    u.x16 = dt_alloc(act * 2), u.y16 = dt_alloc(act * 2), u.dy16 = dt_alloc(act * 2);
    u.w16 = dt_alloc(wmax * 2), u.qkv16 = dt_alloc(3 * N * C * 2);
    u.work16 = dt_alloc(dt_attention16_workspace(u.B, u.T, u.C, u.NH) * sizeof(float));
    if (!u.x || !u.y || !u.dx || !u.dy || !u.w || !u.dw || !u.b || !u.db || !u.mean || !u.rstd ||
        !u.lse || !u.x16 || !u.y16 || !u.dy16 || !u.w16 || !u.qkv16 || !u.work16)
        return cli_fail(dt_error_set(DT_ERR_NOMEM, "bench act16: buffers"));
    dt_act16_from_f32(u.p, u.x16, u.x, act);
    dt_act16_from_f32(u.p, u.w16, u.w, wmax);
    dt_act16_from_f32(u.p, u.qkv16, u.x, 3 * N * C);
    dt_act16_from_f32(u.p, u.dy16, u.dy, act);

    int runs = (int)cli_int(a, "runs");
    double min_time = cli_double(a, "min-time");
    printf("# %s B=%d T=%d (N=%zu C=%zu V=%zu L=%d), %s, isa %s, gemm %s, %d threads; "
           "forward+backward per call, median of %d rounds\n",
           cli_str(a, "model"), u.B, u.T, N, C, V, cfg.layers, dt_precision_name(u.p),
           dt_isa_name(dt_isa()), dt_gemm_backend_name(dt_gemm_backend_default()),
           dt_tensor_threads(), runs);
    printf("%-14s %6s %10s %10s %8s %13s %13s %13s %13s %8s\n", "kernel", "calls", "fp32 ms",
           "16-bit ms", "speedup", "fp32 ms/step", "16 ms/step", "fp32 cpu/step", "16 cpu/step",
           "cpu x");
    double tot[2] = {0, 0}, ctot[2] = {0, 0};
    const char *only = cli_str(a, "only");
    for (int k = 0; k < K_COUNT; k++) {
        if (only[0] && strcmp(only, kernel_names[k]) != 0)
            continue;
        double t[2], c[2];
        time_kernel(&u, (kernel)k, runs, min_time, t, c);
        int n = per_step((kernel)k, cfg.layers);
        tot[0] += n * t[0], tot[1] += n * t[1];
        ctot[0] += n * c[0], ctot[1] += n * c[1];
        printf("%-14s %6d %10.3f %10.3f %7.2fx %13.1f %13.1f %13.1f %13.1f %7.2fx\n",
               kernel_names[k], n, t[0] * 1e3, t[1] * 1e3, t[1] > 0 ? t[0] / t[1] : 0.0,
               n * t[0] * 1e3, n * t[1] * 1e3, n * c[0] * 1e3, n * c[1] * 1e3,
               c[1] > 0 ? c[0] / c[1] : 0.0);
    }
    printf("%-14s %6s %10s %10s %7.2fx %13.1f %13.1f %13.1f %13.1f %7.2fx\n", "total", "", "", "",
           tot[0] / tot[1], tot[0] * 1e3, tot[1] * 1e3, ctot[0] * 1e3, ctot[1] * 1e3,
           ctot[0] / ctot[1]);
    printf("# ms: wall clock per call (median); cpu/step: process CPU ms per step (all threads; "
           "not inflated by descheduling on a shared machine)\n");
    float *fb[] = {u.x, u.y, u.dx, u.dy, u.w, u.dw, u.b, u.db, u.mean, u.rstd, u.lse, u.work16};
    for (size_t i = 0; i < sizeof fb / sizeof fb[0]; i++)
        dt_free(fb[i]);
    dt_free(u.x16), dt_free(u.y16), dt_free(u.dy16), dt_free(u.w16), dt_free(u.qkv16);
    dt_gemm_release();
    return 0;
}

const cli_cmd cli_bench_act16 = {
    .name = "act16",
    .parent = "bench",
    .summary = "16-bit activation kernels vs fp32, per GPT step",
    .usage = "dtrain bench act16 [--model PRESET] [--batch B] [--seq T] [--precision bf16|fp16]",
    .description = "Times each kernel of a GPT training step (layernorm, the linear layers,\n"
                   "attention, GELU, the LM head) forward + backward in fp32 and in its 16-bit\n"
                   "form on the preset's shapes, and sums them per step (x calls per step).\n"
                   "The 16-bit side includes the per-step weight cast and the casts of fp32\n"
                   "gradients before 16-bit linear backwards. DT_ISA / DT_GEMM_BACKEND apply.",
    .opts = act16_opts,
    .run = run_act16,
};
