/*
 * cmd_bench_compress.c — `dtrain bench compress`: codec throughput and size.
 *
 * For each codec: encode and decode of COUNT fp32 values (normal(0, 1)
 * data), timed separately, median of --iters runs after one warm-up, in
 * GB/s of fp32 input (4 COUNT bytes / time), so codecs compare directly
 * with `none` (a memcpy) measured in the same run. Also: encoded bytes,
 * compression ratio, bits per value, encode throughput with error feedback
 * on (the residual add and update cost two more passes), and the relative
 * L2 error of one round trip. PowerSGD views the values as a rows x cols
 * matrix (--rows, default: the divisor of COUNT closest to its square
 * root); on random data its one-step error is high by nature.
 */
#include "cli.h"
#include "dtrain/compress.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const char *const all_codecs[] = {"none", "fp16",      "bf16",       "int8",      "qsgd:4",
                                         "sign", "topk:0.01", "randk:0.01", "powersgd:4"};
#define NALL (sizeof all_codecs / sizeof all_codecs[0])

static const cli_opt compress_opts[] = {
    {"codec", 0, CLI_STRING, "SPEC", "all", NULL,
     "codec spec (none|fp16|bf16|int8|qsgd:B|sign|topk:K|randk:K|powersgd:R) or all", NULL, 0, 0},
    {"count", 0, CLI_SIZE, "N", "4M", NULL, "values per tensor", NULL, 1, 1ull << 31},
    {"rows", 0, CLI_SIZE, "R", "0", NULL, "powersgd matrix rows (0: closest to square)", NULL, 0,
     1ull << 31},
    {"iters", 0, CLI_INT, "K", "5", NULL, "timed runs per codec (median reported)", NULL, 1, 1000},
    {"seed", 0, CLI_INT, "S", "1", NULL, "seed of the data and the codecs", NULL, 0, 9.2e18},
    {"json", 0, CLI_FLAG, NULL, NULL, NULL, "print one JSON object per codec", NULL, 0, 0},
    {"cpu-time", 0, CLI_FLAG, NULL, NULL, NULL,
     "time with the process CPU clock (steadier on a shared machine)", NULL, 0, 0},
    {0},
};

/* The clock: wall time by default; process CPU time with --cpu-time, which
 * leaves out the time other processes held the core. */
static bool use_cpu_clock;

static double now(void) {
    if (!use_cpu_clock)
        return dt_now();
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static double median(double *v, int n) {
    cli_sort_doubles(v, (size_t)n);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

typedef struct result {
    size_t bytes;
    double enc_s, dec_s, enc_ef_s, rel_err;
    bool ef_default;
} result;

static dt_status bench_one(const dt_codec_spec *spec, const float *x, size_t n, size_t rows,
                           int iters, uint64_t seed, float *y, result *res) {
    dt_status st = DT_OK;
    dt_compressor *c = NULL, *cef = NULL;
    uint8_t *buf = NULL;
    double *t = calloc((size_t)iters, sizeof *t);
    if (!t)
        return dt_error_set(DT_ERR_NOMEM, "bench: out of memory");
    dt_compressor_config cfg = dt_compressor_config_default();
    cfg.seed = seed;
    cfg.rows = spec->kind == DT_CODEC_POWERSGD ? rows : 0;
    cfg.cols = spec->kind == DT_CODEC_POWERSGD ? n / rows : 0;
    cfg.ef = DT_EF_OFF;
    DT_CHECK_GOTO(dt_compressor_create(&c, spec, n, &cfg), st, out);
    cfg.ef = DT_EF_ON;
    DT_CHECK_GOTO(dt_compressor_create(&cef, spec, n, &cfg), st, out);
    size_t cap = dt_compressor_encoded_bytes(c), used = 0;
    buf = dt_alloc(cap);
    if (!buf) {
        st = dt_error_set(DT_ERR_NOMEM, "bench: cannot allocate %zu bytes", cap);
        goto out;
    }
    res->bytes = cap;
    res->ef_default = dt_codec_get_info(spec->kind)->ef_default;

    /* encode, error feedback off; step 0 is the warm-up */
    for (int i = 0; i <= iters; i++) {
        double t0 = now();
        DT_CHECK_GOTO(dt_compressor_compress(c, x, (uint64_t)i, buf, cap, &used), st, out);
        if (i)
            t[i - 1] = now() - t0;
    }
    res->enc_s = median(t, iters);
    for (int i = 0; i <= iters; i++) {
        double t0 = now();
        DT_CHECK_GOTO(dt_codec_decode(buf, used, n, y, DT_DECODE_SET), st, out);
        if (i)
            t[i - 1] = now() - t0;
    }
    res->dec_s = median(t, iters);
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        num += ((double)x[i] - y[i]) * ((double)x[i] - y[i]);
        den += (double)x[i] * x[i];
    }
    res->rel_err = den > 0 ? sqrt(num / den) : 0;
    for (int i = 0; i <= iters; i++) {
        double t0 = now();
        DT_CHECK_GOTO(dt_compressor_compress(cef, x, (uint64_t)i, buf, cap, &used), st, out);
        if (i)
            t[i - 1] = now() - t0;
    }
    res->enc_ef_s = median(t, iters);
out:
    free(t);
    dt_free(buf);
    dt_compressor_destroy(c);
    dt_compressor_destroy(cef);
    return st;
}

static size_t squarest_rows(size_t n) {
    size_t best = 1;
    for (size_t r = 1; r * r <= n; r++)
        if (n % r == 0)
            best = r;
    return best;
}

static int run_compress(cli_args *a) {
    size_t n = cli_size(a, "count");
    size_t rows = cli_size(a, "rows");
    int iters = (int)cli_int(a, "iters");
    uint64_t seed = (uint64_t)cli_int(a, "seed");
    bool json = cli_bool(a, "json");
    use_cpu_clock = cli_bool(a, "cpu-time");
    const char *which = cli_str(a, "codec");
    if (rows == 0)
        rows = squarest_rows(n);
    if (n % rows != 0)
        cli_usage_error(a->cmd, "--rows %zu does not divide --count %zu", rows, n);

    const char *single[1] = {which};
    const char *const *list = all_codecs;
    size_t nlist = NALL;
    if (strcmp(which, "all") != 0) {
        list = single;
        nlist = 1;
    }
    dt_codec_spec specs[NALL];
    for (size_t i = 0; i < nlist; i++) {
        dt_status st = dt_codec_parse("--codec", list[i], &specs[i]);
        if (st != DT_OK)
            return cli_fail(st);
    }

    float *x = dt_alloc(n * sizeof(float)), *y = dt_alloc(n * sizeof(float));
    if (!x || !y) {
        dt_free(x);
        dt_free(y);
        return cli_fail(dt_error_set(DT_ERR_NOMEM, "bench: cannot allocate 2 x %zu floats", n));
    }
    dt_rng r;
    dt_rng_init(&r, seed, dt_rng_stream_id(0, 0, DT_RNG_TEST));
    for (size_t i = 0; i < n; i++)
        x[i] = dt_rng_normal(&r);

    if (!json) {
        printf("# %zu fp32 values (%.1f MiB), normal(0,1); powersgd as %zu x %zu; median of %d"
               " (%s time)\n",
               n, (double)n * 4 / (1 << 20), rows, n / rows, iters, use_cpu_clock ? "CPU" : "wall");
        printf("%-12s %12s %8s %9s %10s %10s %12s %4s %10s\n", "codec", "bytes", "ratio",
               "bits/val", "enc GB/s", "dec GB/s", "enc+EF GB/s", "EF", "rel err");
    }
    int rc = 0;
    for (size_t i = 0; i < nlist; i++) {
        result res = {0};
        char name[64];
        dt_codec_format(&specs[i], name, sizeof name);
        dt_status st = bench_one(&specs[i], x, n, rows, iters, seed, y, &res);
        if (st != DT_OK) {
            rc = cli_fail(st);
            break;
        }
        double in = (double)n * 4;
        double ratio = in / (double)res.bytes, bpv = 8.0 * (double)res.bytes / (double)n;
        if (json)
            cli_json_line(json_pack(
                "{s:s, s:s, s:I, s:I, s:o, s:o, s:o, s:o, s:o, s:b, s:o, s:s}", "bench", "compress",
                "codec", name, "count", (json_int_t)n, "bytes", (json_int_t)res.bytes, "ratio",
                cli_json_num(ratio), "bits_per_value", cli_json_num(bpv), "encode_gbps",
                cli_json_num(in / res.enc_s * 1e-9), "decode_gbps",
                cli_json_num(in / res.dec_s * 1e-9), "encode_ef_gbps",
                cli_json_num(in / res.enc_ef_s * 1e-9), "ef_default", (int)res.ef_default,
                "rel_error", cli_json_num(res.rel_err), "clock", use_cpu_clock ? "cpu" : "wall"));
        else
            printf("%-12s %12zu %8.2f %9.3f %10.2f %10.2f %12.2f %4s %10.3g\n", name, res.bytes,
                   ratio, bpv, in / res.enc_s * 1e-9, in / res.dec_s * 1e-9,
                   in / res.enc_ef_s * 1e-9, res.ef_default ? "on" : "off", res.rel_err);
        fflush(stdout);
    }
    dt_free(x);
    dt_free(y);
    return rc;
}

const cli_cmd cli_bench_compress = {
    .name = "compress",
    .parent = "bench",
    .summary = "gradient codecs: encode/decode GB/s, bytes, ratio, error",
    .usage =
        "dtrain bench compress [--codec SPEC|all] [--count N] [--iters K] [--json] [--cpu-time]",
    .description = "Throughput is fp32 input bytes per second on one thread (PowerSGD's sgemm\n"
                   "uses OpenBLAS's threads). 'EF' is the codec's "
                   "error-feedback default; 'enc+EF' includes the residual update.",
    .opts = compress_opts,
    .run = run_compress,
};
