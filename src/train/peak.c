/*
 * peak.c — the peak FLOP/s that MFU divides by: measured once per machine
 * and compute type, cached in a small JSON file (dtrain/train.h).
 *
 * Why a cache: a multiply timed at each start measured 73-247 GFLOP/s on
 * one machine depending on what else ran, and an MFU computed against a low
 * draw exceeded 100%. One number per (CPU model, ISA level, threads,
 * compute type), taken once and re-taken only on request (`dtrain bench
 * peak`), makes MFU comparable between runs. The file is a JSON object:
 *
 *   {"version": 1, "peaks": {"AMD EPYC|avx512bf16|2|bf16":
 *       {"flops": 4.1e11, "n": 2048, "measured": "2026-11-25T03:10:00Z"}, ...}}
 *
 * It is read and written with jansson; a damaged or foreign file is
 * replaced, never trusted.
 */
#include "dtrain/amp.h"
#include "dtrain/tensor.h"
#include "train_internal.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

dt_status dt_peak_cache_path(char *buf, size_t len) {
    const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    int n;
    if (xdg && *xdg)
        n = snprintf(buf, len, "%s/dtrain/peak.json", xdg);
    else if (home && *home)
        n = snprintf(buf, len, "%s/.cache/dtrain/peak.json", home);
    else
        return dt_error_set(DT_ERR_NOT_FOUND, "neither XDG_CACHE_HOME nor HOME is set");
    if (n < 0 || (size_t)n >= len)
        return dt_error_set(DT_ERR_INVALID, "cache path too long");
    return DT_OK;
}

/* "model name" of /proc/cpuinfo, or "unknown CPU". */
void dt__cpu_model(char *out, size_t len) {
    snprintf(out, len, "unknown CPU");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f)
        return;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "model name", 10) != 0)
            continue;
        const char *v = strchr(line, ':');
        if (!v)
            break;
        v++;
        while (*v == ' ' || *v == '\t')
            v++;
        snprintf(out, len, "%.*s", (int)strcspn(v, "\n"), v);
        break;
    }
    fclose(f);
}

/* The best GFLOP/s of `bursts` timed multiplies of n^3 in the compute type
 * (after one untimed). */
static dt_status measure(dt_precision p, int n, int bursts, double *flops) {
    size_t nn = (size_t)n * n;
    float *a = dt_alloc(3 * nn * sizeof(float));
    uint16_t *h = p == DT_PRECISION_FP32 ? NULL : dt_alloc(2 * nn * sizeof(uint16_t));
    if (!a || (p != DT_PRECISION_FP32 && !h)) {
        dt_free(a);
        dt_free(h);
        return dt_error_set(DT_ERR_NOMEM, "peak measurement buffers (%d x %d)", n, n);
    }
    for (size_t i = 0; i < 2 * nn; i++)
        a[i] = (float)(i % 7) * 0.1f;
    if (p == DT_PRECISION_BF16)
        dt_f32_to_bf16((dt_bf16 *)h, a, 2 * nn);
    else if (p == DT_PRECISION_FP16)
        dt_f32_to_f16((dt_f16 *)h, a, 2 * nn);
    double best = 0;
    dt_status st = DT_OK;
    for (int b = 0; b <= bursts && st == DT_OK; b++) {
        double t0 = dt_now();
        if (p == DT_PRECISION_FP32)
            dt_sgemm(false, false, n, n, n, 1.0f, a, n, a + nn, n, 0.0f, a + 2 * nn, n);
        else if (p == DT_PRECISION_BF16)
            st = dt_gemm_bf16(DT_GEMM_NT, n, n, n, (const dt_bf16 *)h, (const dt_bf16 *)h + nn,
                              a + 2 * nn, DT_GEMM_OUT_F32, false);
        else
            st = dt_gemm_f16(DT_GEMM_NT, n, n, n, (const dt_f16 *)h, (const dt_f16 *)h + nn,
                             a + 2 * nn, false);
        double f = 2.0 * n * (double)nn / (dt_now() - t0);
        if (b > 0) /* the first warms caches and the library's threads */
            best = f > best ? f : best;
    }
    dt_free(a);
    dt_free(h);
    *flops = best;
    return st;
}

dt_status dt_peak_flops(dt_precision p, bool remeasure, double *flops, char *from, size_t len) {
    char cpu[256], key[400], path[4096];
    dt__cpu_model(cpu, sizeof cpu);
    snprintf(key, sizeof key, "%s|%s|%d|%s", cpu, dt_isa_name(dt_isa()), dt_tensor_threads(),
             dt_precision_name(p));
    bool have_path = dt_peak_cache_path(path, sizeof path) == DT_OK;
    json_t *root = have_path ? json_load_file(path, 0, NULL) : NULL;
    if (root &&
        (!json_is_object(root) || json_integer_value(json_object_get(root, "version")) != 1 ||
         !json_is_object(json_object_get(root, "peaks")))) {
        json_decref(root);
        root = NULL;
    }
    json_t *peaks = root ? json_object_get(root, "peaks") : NULL;
    json_t *entry = peaks ? json_object_get(peaks, key) : NULL;
    double cached = entry ? json_number_value(json_object_get(entry, "flops")) : 0;
    if (!remeasure && isfinite(cached) && cached > 0) {
        *flops = cached;
        if (from)
            snprintf(from, len, "%s, measured %s", path,
                     json_string_value(json_object_get(entry, "measured"))
                         ? json_string_value(json_object_get(entry, "measured"))
                         : "earlier");
        json_decref(root);
        return DT_OK;
    }
    int n = remeasure ? 2048 : 1024, bursts = remeasure ? 10 : 5;
    dt_status st = measure(p, n, bursts, flops);
    if (st != DT_OK) {
        json_decref(root);
        return st;
    }
    if (from)
        snprintf(from, len, "measured now, %s GEMM %d^3", dt_precision_name(p), n);
    if (!have_path) {
        json_decref(root);
        return DT_OK;
    }
    if (!root) {
        root = json_pack("{s:i, s:{}}", "version", 1, "peaks");
        peaks = root ? json_object_get(root, "peaks") : NULL;
    }
    char when[32];
    time_t now = time(NULL);
    struct tm tm;
    strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", gmtime_r(&now, &tm));
    json_t *e = json_pack("{s:f, s:i, s:s}", "flops", *flops, "n", n, "measured", when);
    if (peaks && e && json_object_set_new(peaks, key, e) == 0) {
        e = NULL;
        char dir[4096];
        snprintf(dir, sizeof dir, "%s", path);
        char *slash = strrchr(dir, '/');
        if (slash)
            *slash = '\0';
        char *text = json_dumps(root, JSON_INDENT(2) | JSON_REAL_PRECISION(6));
        if (!text || dt_mkdir_p(dir) != DT_OK ||
            dt_file_write_atomic(path, &(dt_file_part){text, strlen(text)}, 1) != DT_OK)
            DT_INFO("peak: cannot cache the measured peak in %s: %s", path, dt_last_error());
        else if (from)
            snprintf(from, len, "measured now, %s GEMM %d^3, cached in %s", dt_precision_name(p), n,
                     path);
        free(text);
    }
    json_decref(e);
    json_decref(root);
    return DT_OK;
}
