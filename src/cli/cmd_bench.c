/*
 * cmd_bench.c — `dtrain bench WHAT`: dispatch to a benchmark.
 *
 * Each benchmark is its own cli_cmd (own flags, own help) listed in the
 * table below, so `dtrain bench comm --help` works like any subcommand.
 */
#include "cli.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* `dtrain bench rng`: Philox throughput, the cost of our random numbers. */
static const cli_opt rng_opts[] = {
    {"count", 0, CLI_SIZE, "N", "64M", NULL, "32-bit numbers to draw", NULL, 1, 1e12},
    {"seed", 0, CLI_INT, "S", "1", NULL, "seed", NULL, 0, 9.2e18},
    {0},
};

static int run_rng(cli_args *a) {
    size_t n = cli_size(a, "count");
    dt_rng r;
    dt_rng_init(&r, (uint64_t)cli_int(a, "seed"), dt_rng_stream_id(0, 0, DT_RNG_TEST));
    volatile uint32_t sink; /* keeps the loop from being optimised away */
    uint32_t acc = 0;
    double t0 = dt_now();
    for (size_t i = 0; i < n; i++)
        acc ^= dt_rng_u32(&r);
    double dt = dt_now() - t0;
    printf("%-12s %14s %12s %12s\n", "generator", "numbers", "time (s)", "M/s");
    printf("%-12s %14zu %12.3f %12.1f\n", "philox4x32", n, dt, (double)n / dt * 1e-6);
    sink = acc;
    (void)sink;
    return 0;
}

static const cli_cmd bench_rng = {
    .name = "rng",
    .parent = "bench",
    .summary = "Philox4x32-10 throughput",
    .usage = "dtrain bench rng [--count N]",
    .opts = rng_opts,
    .run = run_rng,
};

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

void cli_sort_doubles(double *v, size_t n) { qsort(v, n, sizeof *v, cmp_double); }

/* clang-format off */
static const cli_cmd *const benches[] = {
    &bench_rng,
    &cli_bench_comm,
    &cli_bench_topo,
    &cli_bench_gemm,
    &cli_bench_peak,
    &cli_bench_train,
    &cli_bench_optim,
    &cli_bench_compress,
    &cli_bench_gemm_bf16,
    &cli_bench_gemm_tn,
    &cli_bench_amp_convert,
    &cli_bench_act16,
    &cli_bench_attention,
    &cli_bench_memcpy,
    &cli_bench_tokenizer,
};
/* clang-format on */
#define NBENCHES (sizeof benches / sizeof benches[0])

static const cli_opt bench_opts[] = {{0}};

static const char bench_description[] =
    "benchmarks:\n"
    "  rng          Philox4x32-10 throughput\n"
    "  comm         collective bandwidth/latency (nccl-tests columns)\n"
    "  topo         link latency/bandwidth per pair of ranks, hierarchy, alpha-beta\n"
    "  memcpy       memory bandwidth, the ceiling for shared-memory collectives\n"
    "  gemm         OpenBLAS sgemm GFLOP/s\n"
    "  peak         measure and cache the peak FLOP/s MFU is relative to\n"
    "  train        GPT training step: ms/step, tokens/s, GFLOP/s, MFU\n"
    "  optim        optimizer kernels (AdamW, SGD, clipping)\n"
    "  compress     gradient codecs: GB/s, bytes, error\n"
    "  gemm-bf16    bf16 GEMM backends vs fp32 sgemm\n"
    "  gemm-tn      weight-gradient product: OpenBLAS vs the AVX-512 kernel\n"
    "  amp-convert  16-bit conversions per ISA level\n"
    "  act16        16-bit activation kernels vs fp32, per GPT step\n"
    "  attention    causal attention fwd/bwd: AVX-512 register tiles vs tile sgemm\n"
    "  tokenizer    GPT-2 BPE encoding MB/s on a file (bench/tokenizer.sh: vs js-tiktoken)\n"
    "Run 'dtrain bench WHAT --help' for a benchmark's options.";

static int run_bench(cli_args *a) {
    return cli_run_sub(a, benches, NBENCHES, "benchmark", "(see 'dtrain help bench')");
}

const cli_cmd cli_cmd_bench = {
    .name = "bench",
    .summary = "run a benchmark and print a table",
    .usage = "dtrain bench WHAT [OPTIONS]",
    .description = bench_description,
    .opts = bench_opts,
    .run = run_bench,
    .stop_at_positional = true,
    .subs = benches,
    .nsubs = NBENCHES,
};
