/*
 * cluster.c — cluster descriptions (plan.h): read and write the JSON file,
 * and measure this machine. Every number read is checked for range before
 * it is used; a missing optional field takes the default stated in
 * docs/planner.md.
 */
#include "dtrain/amp.h"
#include "dtrain/plan.h"
#include "dtrain/tensor.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static dt_status bad(const char *path, const char *field, const char *what) {
    return dt_error_set(DT_ERR_INVALID, "cluster file %s: %s: %s", path, field, what);
}

/* A number field of obj in [lo, hi]; absent: *out = dflt (required: an error). */
static dt_status number(const char *path, json_t *obj, const char *key, const char *field,
                        bool required, double dflt, double lo, double hi, double *out) {
    json_t *v = obj ? json_object_get(obj, key) : NULL;
    if (!v) {
        if (required)
            return bad(path, field, "missing (a number is required)");
        *out = dflt;
        return DT_OK;
    }
    if (!json_is_number(v))
        return bad(path, field, "not a number");
    double x = json_number_value(v);
    if (!(x >= lo && x <= hi))
        return dt_error_set(DT_ERR_INVALID, "cluster file %s: %s = %g: expected %g..%g", path,
                            field, x, lo, hi);
    *out = x;
    return DT_OK;
}

static void text(json_t *obj, const char *key, char *out, size_t len) {
    json_t *v = obj ? json_object_get(obj, key) : NULL;
    if (json_is_string(v))
        snprintf(out, len, "%s", json_string_value(v));
}

static dt_status link_of(const char *path, json_t *root, const char *key, bool inter, dt_link *l) {
    json_t *o = json_object_get(root, key);
    char f[64];
    double bw = 0, lat = 0, rails = 1;
    snprintf(f, sizeof f, "%s.bw_gbs", key);
    DT_CHECK(number(path, o, "bw_gbs", f, true, 0, 1e-6, 1e6, &bw));
    snprintf(f, sizeof f, "%s.latency_us", key);
    DT_CHECK(number(path, o, "latency_us", f, false, inter ? 5 : 2, 0, 1e6, &lat));
    if (inter) {
        snprintf(f, sizeof f, "%s.rails", key);
        DT_CHECK(number(path, o, "rails", f, false, 1, 1, 64, &rails));
    }
    *l = (dt_link){.bw = bw * 1e9, .alpha = lat * 1e-6, .rails = (int)rails};
    text(o, "topology", l->topology, sizeof l->topology);
    return DT_OK;
}

dt_status dt_cluster_load(const char *path, dt_cluster *out) {
    memset(out, 0, sizeof *out);
    json_error_t err;
    json_t *root = json_load_file(path, 0, &err);
    if (!root)
        return dt_error_set(DT_ERR_INVALID, "cluster file %s: line %d: %s", path, err.line,
                            err.text);
    dt_status st = DT_OK;
    double v, dpn, nodes, shared = 0;
    json_t *dev = json_object_get(root, "device"), *peak = json_object_get(dev, "peak_tflops");
    json_t *eff = json_object_get(dev, "efficiency");
    if (!json_is_object(root) || !json_is_object(dev) || !json_is_object(peak)) {
        st = bad(path, "device.peak_tflops", "missing (an object of per-precision TFLOP/s)");
        goto done;
    }
    snprintf(out->name, sizeof out->name, "%s", path);
    text(root, "name", out->name, sizeof out->name);
    text(root, "source", out->source, sizeof out->source);
    if ((st = number(path, root, "devices_per_node", "devices_per_node", true, 0, 1, 4096, &dpn)) !=
            DT_OK ||
        (st = number(path, root, "nodes", "nodes", false, 0, 0, 1e6, &nodes)) != DT_OK)
        goto done;
    out->devices_per_node = (int)dpn;
    out->nodes = (int)nodes;
    json_t *sc = json_object_get(dev, "shared_compute");
    if (sc && !json_is_boolean(sc)) {
        st = bad(path, "device.shared_compute", "not true or false");
        goto done;
    }
    shared = json_is_true(sc);
    out->shared_compute = shared != 0;
    for (int p = 0; p < DT_PRECISION_COUNT; p++) {
        char f[64];
        snprintf(f, sizeof f, "device.peak_tflops.%s", dt_precision_name((dt_precision)p));
        if ((st = number(path, peak, dt_precision_name((dt_precision)p), f, false, 0, 0, 1e6,
                         &v)) != DT_OK)
            goto done;
        out->peak[p] = v * 1e12;
    }
    if (out->peak[DT_PRECISION_FP32] <= 0 && out->peak[DT_PRECISION_BF16] <= 0 &&
        out->peak[DT_PRECISION_FP16] <= 0) {
        st = bad(path, "device.peak_tflops", "no precision has a peak > 0");
        goto done;
    }
    if ((st = number(path, eff, "max", "device.efficiency.max", false, 0.6, 0.01, 1,
                     &out->eff_max)) != DT_OK ||
        (st = number(path, eff, "half_width", "device.efficiency.half_width", false, 0, 0, 1e6,
                     &out->eff_half)) != DT_OK ||
        (st = number(path, dev, "memory_gib", "device.memory_gib", true, 0, 1e-3, 1e7, &v)) !=
            DT_OK)
        goto done;
    out->memory = v * 1073741824.0;
    if ((st = number(path, dev, "memory_usable", "device.memory_usable", false, 0.9, 0.05, 1,
                     &out->memory_usable)) != DT_OK ||
        (st = number(path, dev, "memory_bw_gbs", "device.memory_bw_gbs", true, 0, 1e-3, 1e6, &v)) !=
            DT_OK)
        goto done;
    out->mem_bw = v * 1e9;
    if ((st = link_of(path, root, "intra", false, &out->intra)) != DT_OK)
        goto done;
    if (json_object_get(root, "inter"))
        st = link_of(path, root, "inter", true, &out->inter);
    else if (out->nodes != 1)
        st = bad(path, "inter", "missing (needed unless \"nodes\": 1)");
done:
    json_decref(root);
    return st;
}

dt_status dt_cluster_write(const dt_cluster *c, FILE *f) {
    fprintf(f, "{\n  \"name\": \"%s\",\n  \"source\": \"%s\",\n", c->name, c->source);
    fprintf(f, "  \"devices_per_node\": %d,\n  \"nodes\": %d,\n", c->devices_per_node, c->nodes);
    fprintf(f,
            "  \"device\": {\"memory_gib\": %.3f, \"memory_usable\": %.2f, "
            "\"memory_bw_gbs\": %.2f,\n",
            c->memory / 1073741824.0, c->memory_usable, c->mem_bw / 1e9);
    fprintf(f, "             \"peak_tflops\": {\"fp32\": %.4g, \"bf16\": %.4g, \"fp16\": %.4g},\n",
            c->peak[DT_PRECISION_FP32] / 1e12, c->peak[DT_PRECISION_BF16] / 1e12,
            c->peak[DT_PRECISION_FP16] / 1e12);
    fprintf(f, "             \"efficiency\": {\"max\": %.3f, \"half_width\": %.1f},\n", c->eff_max,
            c->eff_half);
    fprintf(f, "             \"shared_compute\": %s},\n", c->shared_compute ? "true" : "false");
    fprintf(f, "  \"intra\": {\"bw_gbs\": %.3f, \"latency_us\": %.2f, \"topology\": \"%s\"}",
            c->intra.bw / 1e9, c->intra.alpha * 1e6, c->intra.topology);
    if (c->nodes != 1)
        fprintf(f,
                ",\n  \"inter\": {\"bw_gbs\": %.3f, \"latency_us\": %.2f, \"rails\": %d, "
                "\"topology\": \"%s\"}",
                c->inter.bw / 1e9, c->inter.alpha * 1e6, c->inter.rails, c->inter.topology);
    fprintf(f, "\n}\n");
    return ferror(f) ? dt_error_set(DT_ERR_IO, "writing the cluster file") : DT_OK;
}

double dt_cluster_efficiency(const dt_cluster *c, double w) {
    return c->eff_half > 0 ? c->eff_max * w / (w + c->eff_half) : c->eff_max;
}

/* ------------------------------------------------------------------------ */
/* Measuring this machine                                                   */
/* ------------------------------------------------------------------------ */

/* Best bytes/s of copying 64 MiB (counted once: what a transfer moves). */
static double copy_bandwidth(void) {
    const size_t n = (size_t)64 << 20;
    char *a = dt_alloc(n), *b = dt_alloc(n);
    double best = 0;
    if (!a || !b) {
        dt_free(a);
        dt_free(b);
        return 1e9;
    }
    memset(a, 1, n);
    memset(b, 2, n);
    for (int i = 0; i < 4; i++) {
        double t0 = dt_now();
        memcpy(i & 1 ? a : b, i & 1 ? b : a, n);
        double bw = (double)n / (dt_now() - t0);
        if (i > 0 && bw > best)
            best = bw;
    }
    dt_free(a);
    dt_free(b);
    return best;
}

/* The achieved fraction of `peak` of a training micro-batch (forward and
 * backward, fp32) of a 2-block GPT of width C at B 8, T 128: the best of 3. */
static dt_status achieved(int C, double peak, double *frac) {
    dt_gpt_config cfg = {.layers = 2, .dim = C, .heads = C / 64, .max_seq = 128, .vocab = 256};
    const int B = 8, T = 128;
    dt_gpt *m;
    DT_CHECK(dt_gpt_create(&m, &cfg, B, T));
    dt_gpt_init_params(m, 1);
    int32_t *x = dt_alloc(2 * (size_t)B * T * sizeof *x);
    if (!x) {
        dt_gpt_destroy(m);
        return DT_ERR_NOMEM;
    }
    for (int i = 0; i < 2 * B * T; i++)
        x[i] = (i * 7919) % cfg.vocab;
    double best = 1e30;
    dt_status st = DT_OK;
    for (int r = 0; r < 4 && st == DT_OK; r++) {
        double t0 = dt_now();
        float loss;
        st = dt_gpt_forward(m, x, x + B * T, B, T, &loss);
        if (st == DT_OK)
            st = dt_gpt_backward_mode(m, 1.0f, DT_GRAD_OVERWRITE, NULL, NULL);
        double t = dt_now() - t0;
        if (r > 0 && t < best)
            best = t;
    }
    *frac = 3.0 * dt_gpt_flops_per_token(&cfg, T) * B * T / best / peak;
    dt_free(x);
    dt_gpt_destroy(m);
    return st;
}

dt_status dt_cluster_measure(dt_cluster *out) {
    memset(out, 0, sizeof *out);
    snprintf(out->name, sizeof out->name, "this");
    long cpus = dt_cpu_count();
    for (int p = 0; p < DT_PRECISION_COUNT; p++) {
        double f = 0;
        if (dt_peak_flops((dt_precision)p, false, &f, NULL, 0) == DT_OK)
            out->peak[p] = f;
    }
    /* The efficiency curve eff_max * C / (C + half) through two widths. */
    double e1, e2;
    const double w1 = 128, w2 = 512;
    DT_CHECK(achieved((int)w1, out->peak[DT_PRECISION_FP32], &e1));
    DT_CHECK(achieved((int)w2, out->peak[DT_PRECISION_FP32], &e2));
    /* 1/e = 1/max + half/(max w): linear in 1/w. */
    double slope = (1 / e1 - 1 / e2) / (1 / w1 - 1 / w2), icpt = 1 / e2 - slope / w2;
    if (icpt > 0 && slope > 0) {
        out->eff_max = fmin(1.0, 1 / icpt);
        out->eff_half = slope * out->eff_max;
    } else {
        out->eff_max = fmax(e1, e2);
        out->eff_half = 0;
    }
    double bw = copy_bandwidth();
    out->devices_per_node = (int)(cpus > 0 ? cpus : 1);
    out->nodes = 1;
    out->shared_compute = true;
    out->memory = (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE);
    out->memory_usable = 0.8;
    out->mem_bw = bw;
    /* Ranks on one host talk through shared memory: a large message is
     * one copy (process_vm_readv), at the copy bandwidth; the latency is
     * the shm transport's small-message round (docs/comm.md). */
    out->intra = (dt_link){.bw = bw, .alpha = 5e-6, .rails = 1};
    snprintf(out->intra.topology, sizeof out->intra.topology, "shm");
    /* The shared-memory allreduce `dtrain bench comm` fitted on this
     * machine (the machine profile, train.h), read as a ring link, when
     * there is one: measured instead of assumed. */
    dt_link_fit fit;
    char link[160] = "shm link assumed: copy bandwidth, 5 us (no dtrain bench comm fit)";
    if (dt_profile_link("shm", "allreduce", out->devices_per_node, &fit) == DT_OK &&
        fit.link_bw > 0 && isfinite(fit.link_bw)) {
        out->intra.bw = fit.link_bw;
        out->intra.alpha = fit.link_alpha;
        snprintf(link, sizeof link,
                 "shm link from the machine profile (bench comm allreduce, %d ranks): %.2f us, "
                 "%.2f GB/s",
                 fit.ranks, fit.link_alpha * 1e6, fit.link_bw * 1e-9);
    } else {
        dt_error_clear();
    }
    snprintf(out->source, sizeof out->source,
             "measured by dtrain plan --cluster this: %ld CPU(s), peak from dtrain bench peak's "
             "cache, efficiency from fp32 passes at C 128 (%.2f) and C 512 (%.2f), copy %.1f GB/s; "
             "%s",
             cpus, e1, e2, bw / 1e9, link);
    return DT_OK;
}
