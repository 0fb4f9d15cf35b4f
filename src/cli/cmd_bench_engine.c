/*
 * cmd_bench_engine.c — `dtrain bench gemm` and `dtrain bench train`.
 *
 * gemm measures OpenBLAS sgemm on square matrices with the chosen thread
 * count; its best figure is the peak that `bench train` reports MFU
 * against (measured again in the same process, so both see the same
 * machine state). train times whole training steps (forward, a backward
 * that overwrites the gradients (no zeroing pass, as dtrain train does), AdamW
 * over the flat buffer) after warm-up and reports medians.
 * FLOPs per step = 3 x forward FLOPs (dt_gpt_flops_per_token), the usual
 * convention; the optimizer and the elementwise kernels count as zero.
 * train runs every combination of the --precision and --recompute lists
 * (modes) in one process, round-robin, so their ratios share machine state.
 */
#include "cli.h"
#include "dtrain/nn.h"
#include "dtrain/optim.h"
#include "dtrain/train.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static double median(double *v, int n) {
    cli_sort_doubles(v, (size_t)n);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static int apply_threads(cli_args *a) {
    int t = (int)cli_int(a, "threads");
    if (t <= 0)
        t = cli_default_threads();
    dt_tensor_set_threads(t);
    return t;
}

/* Best GFLOP/s of `reps` sgemm calls of size n^3 (after one warm-up). */
static double sgemm_gflops(int n, int reps, double *best_ms) {
    size_t nn = (size_t)n * n;
    float *A = dt_alloc(nn * 4), *B = dt_alloc(nn * 4), *C = dt_alloc(nn * 4);
    if (!A || !B || !C) {
        dt_free(A), dt_free(B), dt_free(C);
        return 0.0;
    }
    for (size_t i = 0; i < nn; i++) {
        A[i] = (float)(i % 7) * 0.1f;
        B[i] = (float)(i % 5) * 0.1f;
    }
    dt_sgemm(false, true, n, n, n, 1.0f, A, n, B, n, 0.0f, C, n);
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        double t0 = dt_now();
        dt_sgemm(false, true, n, n, n, 1.0f, A, n, B, n, 0.0f, C, n);
        double dt = dt_now() - t0;
        best = dt < best ? dt : best;
    }
    dt_free(A), dt_free(B), dt_free(C);
    if (best_ms)
        *best_ms = best * 1e3;
    return 2.0 * n * (double)n * n / best * 1e-9;
}

/* ------------------------------------------------------------------------ */

static const cli_opt gemm_opts[] = {
    {"threads", 't', CLI_INT, "N", "0", "DT_THREADS", "threads; 0: OMP_NUM_THREADS, else all CPUs",
     NULL, 0, 1024},
    {"size", 0, CLI_INT, "N", "0", NULL, "one size N (N x N x N); 0 = sweep 256..2048", NULL, 0,
     16384},
    {"reps", 0, CLI_INT, "R", "5", NULL, "timed repetitions per size (best is shown)", NULL, 1,
     1000},
    {0},
};

static int run_gemm(cli_args *a) {
    int threads = apply_threads(a);
    int sizes[] = {256, 512, 1024, 1536, 2048};
    int nsizes = 5, one = (int)cli_int(a, "size");
    if (one > 0) {
        sizes[0] = one;
        nsizes = 1;
    }
    printf("# OpenBLAS sgemm, row-major C = A B^T, fp32, %d thread(s), best of %d\n", threads,
           (int)cli_int(a, "reps"));
    printf("%8s %8s %12s %12s\n", "size", "threads", "time (ms)", "GFLOP/s");
    double peak = 0.0;
    for (int i = 0; i < nsizes; i++) {
        double ms = 0.0;
        double gf = sgemm_gflops(sizes[i], (int)cli_int(a, "reps"), &ms);
        peak = gf > peak ? gf : peak;
        printf("%8d %8d %12.3f %12.1f\n", sizes[i], threads, ms, gf);
    }
    printf("# peak %.1f GFLOP/s\n", peak);
    return 0;
}

static const cli_opt peak_opts[] = {
    {"threads", 't', CLI_INT, "N", "0", "DT_THREADS", "threads; 0: OMP_NUM_THREADS, else all CPUs",
     NULL, 0, 1024},
    {"precision", 0, CLI_STRING, "LIST", "fp32,bf16", "DT_PRECISION",
     "compute types to measure (fp32, bf16, fp16)", NULL, 0, 0},
    {0},
};

/* `dtrain bench peak`: measure the peak MFU divides by (2048^3, best of
 * 10) and replace the cached values. */
static int run_peak(cli_args *a) {
    int threads = apply_threads(a);
    char path[4096] = "(no cache: neither XDG_CACHE_HOME nor HOME is set)";
    (void)dt_peak_cache_path(path, sizeof path);
    printf("# peak FLOP/s per rank for MFU, %d thread(s), cached in %s\n", threads, path);
    printf("%-10s %12s  %s\n", "precision", "GFLOP/s", "source");
    char list[128];
    snprintf(list, sizeof list, "%s", cli_str(a, "precision"));
    for (char *save = NULL, *p = strtok_r(list, ",", &save); p; p = strtok_r(NULL, ",", &save)) {
        dt_precision pr;
        if (dt_precision_parse("--precision", p, &pr) != DT_OK)
            cli_usage_error(a->cmd, "%s", dt_last_error());
        double f;
        char from[4400];
        if (dt_peak_flops(pr, true, &f, from, sizeof from) != DT_OK)
            return cli_fail(DT_ERR_INVALID);
        printf("%-10s %12.1f  %s\n", dt_precision_name(pr), f * 1e-9, from);
    }
    return 0;
}

const cli_cmd cli_bench_peak = {
    .name = "peak",
    .parent = "bench",
    .summary = "measure and cache the peak FLOP/s that MFU is relative to",
    .usage = "dtrain bench peak [--threads N] [--precision fp32,bf16,fp16]",
    .description = "Measures a 2048^3 GEMM in each compute type (best of 10) with this rank's\n"
                   "threads and stores it in the cache `dtrain train` and `dtrain bench train`\n"
                   "read (MFU = model FLOPs per second / this peak; docs/train.md).",
    .opts = peak_opts,
    .run = run_peak,
};

const cli_cmd cli_bench_gemm = {
    .name = "gemm",
    .parent = "bench",
    .summary = "OpenBLAS sgemm GFLOP/s over sizes",
    .usage = "dtrain bench gemm [--threads N] [--size N] [--reps R]",
    .opts = gemm_opts,
    .run = run_gemm,
};

/* ------------------------------------------------------------------------ */

static const cli_opt train_opts[] = {
    {"model", 'm', CLI_STRING, "PRESET", "shakespeare-char", "DT_MODEL",
     "gpt2-124m | gpt2-350m | shakespeare-char | tiny", NULL, 0, 0},
    {"batch", 'b', CLI_INT, "B", "8", "DT_BATCH", "sequences per step", NULL, 1, 1 << 16},
    {"seq", 's', CLI_INT, "T", "0", "DT_SEQ", "tokens per sequence; 0 = the model's max_seq", NULL,
     0, 1 << 20},
    {"vocab", 0, CLI_INT, "V", "0", NULL, "override the preset's vocabulary size; 0 = keep", NULL,
     0, 1 << 24},
    {"threads", 't', CLI_INT, "N", "0", "DT_THREADS", "threads; 0: OMP_NUM_THREADS, else all CPUs",
     NULL, 0, 1024},
    {"precision", 0, CLI_STRING, "LIST", "fp32", "DT_PRECISION",
     "compute types to run side by side: fp32, bf16, fp16, comma-separated", NULL, 0, 0},
    {"recompute", 0, CLI_STRING, "LIST", "none", "DT_RECOMPUTE",
     "activation recomputation modes (none, blocks, every:K), comma-separated", NULL, 0, 0},
    {"rounds", 0, CLI_INT, "R", "1", NULL,
     "rounds over all modes (alternating); medians over all rounds", NULL, 1, 1000},
    {"steps", 0, CLI_INT, "N", "10", NULL, "timed steps", NULL, 1, 1e6},
    {"warmup", 0, CLI_INT, "N", "2", NULL, "untimed steps first", NULL, 0, 1e6},
    {"json", 0, CLI_FLAG, NULL, NULL, NULL, "print one JSON object instead of the table", NULL, 0,
     0},
    {0},
};

/* Samples per step: step, fwd, bwd, opt, products, attention, elementwise, casts. */
#define BENCH_SERIES 8

/* One mode of `bench train`: a compute type and a recomputation setting,
 * with its samples accumulated over the rounds. */
typedef struct bench_mode {
    dt_gpt_options opt;
    /* rounds x steps samples of: the step, forward, backward, optimizer,
     * and the passes' products, attention, elementwise kernels and casts */
    double *t[BENCH_SERIES];
    int n; /* samples so far */
    float first_loss, loss;
    dt_memory_report mr;
} bench_mode;

#define BENCH_MAX_MODES 16

/* Split a comma-separated list of precisions and one of recompute modes
 * into their product, in list order (precision outer). */
static dt_status parse_modes(const char *precs, const char *recs, bench_mode *out, int *count) {
    char pbuf[256], rbuf[256];
    int k = 0;
    snprintf(pbuf, sizeof pbuf, "%s", precs);
    for (char *ps = NULL, *p = strtok_r(pbuf, ",", &ps); p; p = strtok_r(NULL, ",", &ps)) {
        dt_precision pr;
        DT_CHECK(dt_precision_parse("--precision", p, &pr));
        snprintf(rbuf, sizeof rbuf, "%s", recs);
        for (char *rs = NULL, *r = strtok_r(rbuf, ",", &rs); r; r = strtok_r(NULL, ",", &rs)) {
            int every;
            DT_CHECK(dt_recompute_parse("--recompute", r, &every));
            if (k == BENCH_MAX_MODES)
                return dt_error_set(DT_ERR_INVALID,
                                    "--precision '%s' x --recompute '%s': more than %d modes",
                                    precs, recs, BENCH_MAX_MODES);
            out[k++] = (bench_mode){.opt = {pr, every}};
        }
    }
    if (k == 0)
        return dt_error_set(DT_ERR_INVALID, "--precision '%s' x --recompute '%s': no mode", precs,
                            recs);
    *count = k;
    return DT_OK;
}

/* Create a model for mode bm, run warmup + steps training steps on (in, tg)
 * and append the timed ones to bm's samples. The optimizer is the
 * trainer's: AdamW over every tensor (decay on matrices), and in bf16/fp16
 * the weight handle (it writes the 16-bit copy as it updates; the model
 * rounds the weights once, at the first forward). */
static dt_status run_mode(bench_mode *bm, const dt_gpt_config *cfg, int B, int T, int warmup,
                          int steps, const int32_t *in, const int32_t *tg) {
    dt_gpt *m = NULL;
    dt_optimizer *o = NULL;
    dt_optim_tensor *tab = NULL;
    dt_status st;
    DT_CHECK(dt_gpt_create_with(&m, cfg, B, T, &bm->opt));
    dt_gpt_init_params(m, 1);
    dt_gpt_memory(m, &bm->mr);
    size_t n = dt_gpt_num_params(m), nt = dt_gpt_num_tensors(m);
    tab = calloc(nt, sizeof *tab);
    if (!tab) {
        st = dt_error_set(DT_ERR_NOMEM, "cannot allocate the optimizer's tensor table");
        goto done;
    }
    for (size_t i = 0; i < nt; i++) {
        dt_param_info p;
        dt_gpt_tensor_info(m, i, &p);
        tab[i] = (dt_optim_tensor){.offset = p.offset, .count = p.rows * p.cols, .decay = p.decay};
    }
    dt_optim_config oc = dt_optim_config_default();
    oc.adamw = (dt_adamw_config){0.9f, 0.95f, 1e-8f, 0.1f};
    DT_CHECK_GOTO(dt_optimizer_create(&o, &oc, tab, nt, &(dt_range){0, n}, 1), st, done);
    bool low = bm->opt.precision != DT_PRECISION_FP32;
    if (low) {
        dt_optimizer_set_copy(o, dt_gpt_write_weights16, m);
        dt_gpt_set_weights16(m, DT_GPT_W16_STALE);
    }
    dt_gpt_profile_enable(m, true);
    float loss = 0.0f;
    for (int s = 0; s < warmup + steps; s++) {
        (void)dt_gpt_take_profile(m);
        double t0 = dt_now();
        /* No zero_grads: the step's one backward overwrites the gradients. */
        DT_CHECK_GOTO(dt_gpt_forward(m, in, tg, B, T, &loss), st, done);
        double t1 = dt_now();
        DT_CHECK_GOTO(dt_gpt_backward_mode(m, 1.0f, DT_GRAD_OVERWRITE, NULL, NULL), st, done);
        double t2 = dt_now();
        dt_optimizer_begin(o, s, 3e-4f);
        DT_CHECK_GOTO(dt_optimizer_step(o, dt_gpt_params(m), dt_gpt_grads(m)), st, done);
        dt_optimizer_end(o, true);
        if (low)
            dt_gpt_set_weights16(m, DT_GPT_W16_CURRENT);
        double t3 = dt_now();
        dt_gpt_profile pf = dt_gpt_take_profile(m);
        if (s == 0 && bm->n == 0)
            bm->first_loss = loss;
        if (s >= warmup) {
            const double v[BENCH_SERIES] = {t3 - t0,
                                            t1 - t0,
                                            t2 - t1,
                                            t3 - t2,
                                            pf.products_ms * 1e-3,
                                            pf.attention_ms * 1e-3,
                                            pf.elementwise_ms * 1e-3,
                                            pf.casts_ms * 1e-3};
            for (int k = 0; k < BENCH_SERIES; k++)
                bm->t[k][bm->n] = v[k];
            bm->n++;
        }
    }
    bm->loss = loss;
    st = DT_OK;
done:
    dt_optimizer_destroy(o);
    free(tab);
    dt_gpt_destroy(m);
    return st;
}

/* The backend of a mode's 16-bit products. */
static const char *gemm16_name(dt_precision p) {
    if (p == DT_PRECISION_FP32)
        return "fp32 sgemm";
    if (p == DT_PRECISION_FP16)
        return "sgemm (widened)";
    return dt_gemm_backend_name(dt_gemm_backend_default());
}

static int run_train(cli_args *a) {
    int threads = apply_threads(a);
    dt_gpt_config cfg;
    dt_status st = dt_gpt_preset(cli_str(a, "model"), &cfg);
    if (st != DT_OK)
        return cli_fail(st);
    if (cli_int(a, "vocab") > 0)
        cfg.vocab = (int)cli_int(a, "vocab");
    int B = (int)cli_int(a, "batch"), T = (int)cli_int(a, "seq");
    if (T == 0)
        T = cfg.max_seq;
    int steps = (int)cli_int(a, "steps"), warmup = (int)cli_int(a, "warmup");
    int rounds = (int)cli_int(a, "rounds");
    bool json = cli_bool(a, "json");
    bench_mode modes[BENCH_MAX_MODES];
    int nmodes = 0;
    st = parse_modes(cli_str(a, "precision"), cli_str(a, "recompute"), modes, &nmodes);
    if (st != DT_OK)
        return cli_fail(st);
    st = dt_gpt_config_validate(&cfg);
    if (st != DT_OK)
        return cli_fail(st);

    /* MFU against the same per-machine peak as `dtrain train` (per compute
     * type: bf16 modes against the bf16 GEMM's). */
    double peaks[DT_PRECISION_COUNT] = {0};
    size_t n = dt_gpt_config_num_params(&cfg), samples = (size_t)rounds * steps;
    int32_t *in = malloc((size_t)B * T * sizeof(int32_t));
    int32_t *tg = malloc((size_t)B * T * sizeof(int32_t));
    double *buf = calloc((size_t)nmodes * BENCH_SERIES * samples, sizeof(double));
    if (!in || !tg || !buf) {
        st = dt_error_set(DT_ERR_NOMEM, "cannot allocate the benchmark's batch and samples");
        goto done;
    }
    for (int k = 0; k < nmodes; k++) {
        for (int j = 0; j < BENCH_SERIES; j++)
            modes[k].t[j] = buf + ((size_t)k * BENCH_SERIES + (size_t)j) * samples;
    }
    dt_rng r;
    dt_rng_init(&r, 1, dt_rng_stream_id(0, 0, DT_RNG_TEST));
    for (int i = 0; i < B * T; i++) {
        in[i] = (int32_t)dt_rng_below(&r, (uint32_t)cfg.vocab);
        tg[i] = (int32_t)dt_rng_below(&r, (uint32_t)cfg.vocab);
    }
    /* Rounds alternate the modes, so a change in machine load during the
     * run hits every mode alike. */
    for (int rd = 0; rd < rounds; rd++)
        for (int k = 0; k < nmodes; k++)
            DT_CHECK_GOTO(run_mode(&modes[k], &cfg, B, T, warmup, steps, in, tg), st, done);

    if (!json) {
        printf("# model %s: L=%d C=%d NH=%d V=%d, %zu parameters; B=%d T=%d, %d thread(s)\n",
               cli_str(a, "model"), cfg.layers, cfg.dim, cfg.heads, cfg.vocab, n, B, T, threads);
        for (int k = 0; k < nmodes; k++) {
            printf("# ");
            dt_gpt_memory_print(&modes[k].mr, 2 * n * sizeof(float), stdout);
        }
        dt_gpt_config big = cfg;
        big.max_seq = 4096;
        printf("# attention memory per sequence (B=1, fp32), flash vs naive:");
        for (int t = 256; t <= 4096; t *= 4) {
            dt_memory_report p;
            char x[32], y[32];
            dt_gpt_memory_plan(&big, 1, t, &p);
            printf("  T=%d %s vs %s", t, dt_format_bytes((double)p.attention, x, sizeof x),
                   dt_format_bytes((double)(p.attention + p.attention_naive), y, sizeof y));
        }
        printf("\n");
        printf("# kernels %s; 16-bit products: bf16 %s, fp16 widened to fp32 sgemm\n",
               dt_isa_name(dt_isa()), gemm16_name(DT_PRECISION_BF16));
        printf("%-18s %4s %5s %7s %5s %9s %10s %9s %9s %9s %9s %9s %9s %9s %9s %11s %9s %7s %10s "
               "%8s\n",
               "model", "B", "T", "threads", "prec", "recompute", "ms/step", "fwd ms", "bwd ms",
               "opt ms", "prod ms", "attn ms", "elem ms", "cast ms", "rest ms", "tokens/s",
               "GFLOP/s", "MFU", "act peak", "x first");
    }
    double tok_first = 0.0;
    for (int k = 0; k < nmodes; k++) {
        bench_mode *bm = &modes[k];
        int ns = bm->n;
        double ms = median(bm->t[0], ns) * 1e3;
        double fwd = median(bm->t[1], ns) * 1e3, bwd = median(bm->t[2], ns) * 1e3;
        double opt = median(bm->t[3], ns) * 1e3;
        double prod = median(bm->t[4], ns) * 1e3, attn = median(bm->t[5], ns) * 1e3;
        double elem = median(bm->t[6], ns) * 1e3, cast = median(bm->t[7], ns) * 1e3;
        double tok_s = (double)B * T / (ms * 1e-3);
        double gflops = 3.0 * dt_gpt_flops_per_token(&cfg, T) * B * T / (ms * 1e-3) * 1e-9;
        dt_precision pr = bm->opt.precision;
        if (!(peaks[pr] > 0) && dt_peak_flops(pr, false, &peaks[pr], NULL, 0) != DT_OK)
            peaks[pr] = NAN;
        double peak = peaks[pr] * 1e-9;
        double mfu = peak > 0 ? gflops / peak : NAN;
        char rc[32], act[32];
        dt_recompute_format(bm->opt.recompute_every, rc, sizeof rc);
        if (k == 0)
            tok_first = tok_s;
        if (json) {
            json_t *o = json_pack(
                "{s:s, s:s, s:s, s:i, s:i, s:i, s:I, s:i, s:i, s:o, s:o, s:o, s:o, s:o, s:o}",
                "model", cli_str(a, "model"), "precision", dt_precision_name(bm->opt.precision),
                "recompute", rc, "batch", B, "seq", T, "threads", threads, "params", (json_int_t)n,
                "steps", steps, "rounds", rounds, "ms_per_step", cli_json_num(ms), "fwd_ms",
                cli_json_num(fwd), "bwd_ms", cli_json_num(bwd), "opt_ms", cli_json_num(opt),
                "tokens_per_s", cli_json_num(tok_s), "gflops", cli_json_num(gflops));
            json_t *o2 = json_pack(
                "{s:o, s:o, s:I, s:I, s:I, s:I, s:o, s:o}", "peak_gflops", cli_json_num(peak),
                "mfu", cli_json_num(mfu), "activation_bytes", (json_int_t)bm->mr.activations,
                "saved_bytes", (json_int_t)bm->mr.saved, "recompute_bytes",
                (json_int_t)bm->mr.recompute, "weights16_bytes", (json_int_t)bm->mr.weights16,
                "loss_first", cli_json_num(bm->first_loss), "loss_last", cli_json_num(bm->loss));
            json_t *o3 =
                json_pack("{s:o, s:o, s:o, s:o, s:s, s:s}", "products_ms", cli_json_num(prod),
                          "attention_ms", cli_json_num(attn), "elementwise_ms", cli_json_num(elem),
                          "casts_ms", cli_json_num(cast), "isa", dt_isa_name(dt_isa()), "gemm16",
                          gemm16_name(bm->opt.precision));
            DT_ASSERT(o3 && json_object_update(o2, o3) == 0);
            json_decref(o3);
            DT_ASSERT(o && o2 && json_object_update(o, o2) == 0);
            json_decref(o2);
            cli_json_line(o);
        } else {
            printf("%-18s %4d %5d %7d %5s %9s %10.2f %9.2f %9.2f %9.2f %9.2f %9.2f %9.2f %9.2f "
                   "%9.2f %11.1f %9.1f %6.1f%% %10s %7.2fx\n",
                   cli_str(a, "model"), B, T, threads, dt_precision_name(bm->opt.precision), rc, ms,
                   fwd, bwd, opt, prod, attn, elem, cast, ms - opt - prod - attn - elem - cast,
                   tok_s, gflops, mfu * 100,
                   dt_format_bytes((double)bm->mr.activations, act, sizeof act), tok_s / tok_first);
        }
    }
    if (!json)
        printf("# median of %d rounds x %d steps after %d warm-up each (modes alternate per "
               "round); MFU against this machine's cached peak of each compute type (fp32 %.1f "
               "GFLOP/s; dtrain bench peak); act peak = the activation arena (forward/backward "
               "never allocate); prod/attn/elem/cast = the passes' matrix products, attention, "
               "elementwise kernels and 16-bit casts, rest = the step less those and opt; loss "
               "%.4f -> %.4f in the first mode (same batch every step)\n",
               rounds, steps, warmup, peaks[DT_PRECISION_FP32] * 1e-9, modes[0].first_loss,
               modes[0].loss);
done:
    free(buf);
    free(in), free(tg);
    return st == DT_OK ? 0 : cli_fail(st);
}

const cli_cmd cli_bench_train = {
    .name = "train",
    .parent = "bench",
    .summary = "GPT training step: ms/step, tokens/s, GFLOP/s, MFU, activation memory",
    .usage = "dtrain bench train [--model PRESET] [--batch B] [--seq T] [--threads N] "
             "[--precision fp32,bf16] [--recompute none,blocks] [--rounds R] [--steps N] [--json]",
    .description = "Times forward + backward (overwriting the gradients: no zeroing pass) +\n"
                   "AdamW (the trainer's optimizer object; in bf16/fp16 it writes the 16-bit\n"
                   "weight copy as it updates) per step on a fixed random batch, and splits\n"
                   "the passes into matrix products, attention, elementwise kernels and\n"
                   "16-bit casts (the ISA level and 16-bit GEMM backend are printed); MFU is\n"
                   "against the\n"
                   "sgemm peak measured in the same run (n = 1536, see 'dtrain bench gemm').\n"
                   "Every combination of --precision and --recompute runs in the same process,\n"
                   "one fresh model each, alternating per round; the table shows tokens/s and\n"
                   "the activation arena side by side, with the ratio of tokens/s to the first\n"
                   "mode. --json prints one line per mode.",
    .opts = train_opts,
    .run = run_train,
};
