/*
 * profile.c — the machine profile (train.h): the peak cache file of peak.c
 * with two more sections, what `dtrain bench memcpy` and `dtrain bench
 * comm` measured on this machine:
 *
 *   {"version": 1, "peaks": {...},
 *    "memory": {"AMD EPYC ...|2": {"traffic_gbs": 41.7, "measured": "2026-..."}},
 *    "links": {"AMD EPYC ...|shm|allreduce|2":
 *                {"alpha_us": 2.1, "beta_gbs": 6.4, "link_alpha_us": 1.05,
 *                 "link_bw_gbs": 6.4, "points": 26, "max_error": 0.31,
 *                 "lo": 8, "hi": 268435456, "measured": "2026-..."}}}
 *
 * Keys start with the CPU model, so a profile copied to another machine
 * is not mistaken for its own. A damaged or foreign file is replaced, as
 * peak.c does; an unwritable one is not an error for a reader.
 */
#include "dtrain/comm.h"
#include "train_internal.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* The profile's root object (a fresh one if the file is missing or not
 * ours), and its path in `path`. NULL only when out of memory. */
static json_t *load(char *path, size_t len, bool *have_path) {
    *have_path = dt_peak_cache_path(path, len) == DT_OK;
    json_t *root = *have_path ? json_load_file(path, 0, NULL) : NULL;
    if (root &&
        (!json_is_object(root) || json_integer_value(json_object_get(root, "version")) != 1)) {
        json_decref(root);
        root = NULL;
    }
    if (!root)
        root = json_pack("{s:i, s:{}}", "version", 1, "peaks");
    return root;
}

/* The object `name` of root, created if missing. */
static json_t *section(json_t *root, const char *name) {
    json_t *s = json_object_get(root, name);
    if (json_is_object(s))
        return s;
    s = json_object();
    if (!s || json_object_set_new(root, name, s) != 0)
        return NULL;
    return s;
}

static dt_status save(const char *path, json_t *root) {
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash)
        *slash = '\0';
    char *text = json_dumps(root, JSON_INDENT(2) | JSON_REAL_PRECISION(6));
    if (!text)
        return dt_error_set(DT_ERR_NOMEM, "machine profile: formatting %s", path);
    dt_status st = dt_mkdir_p(dir);
    if (st == DT_OK)
        st = dt_file_write_atomic(path, &(dt_file_part){text, strlen(text)}, 1);
    free(text);
    return st;
}

static void now_text(char *out, size_t len) {
    time_t now = time(NULL);
    struct tm tm;
    strftime(out, len, "%Y-%m-%dT%H:%M:%SZ", gmtime_r(&now, &tm));
}

/* ------------------------------------------------------------------------ */
/* Alpha-beta fits                                                          */
/* ------------------------------------------------------------------------ */

/* Steps of latency and the fraction of the bytes one link carries in the
 * ring model of `op` over n ranks (see dt_link_fit). */
static void ring_model(const char *op, int n, double *steps, double *share) {
    double nn = n > 1 ? n : 2;
    if (!strcmp(op, "allreduce")) {
        *steps = 2 * (nn - 1);
        *share = 2 * (nn - 1) / nn;
    } else if (!strcmp(op, "broadcast")) {
        *steps = ceil(log2(nn));
        *share = 1;
    } else {
        *steps = nn - 1;
        *share = (nn - 1) / nn;
    }
}

dt_status dt_link_fit_points(const char *transport, const char *op, int ranks, const double *bytes,
                             const double *seconds, size_t n, dt_link_fit *out) {
    memset(out, 0, sizeof *out);
    snprintf(out->transport, sizeof out->transport, "%s", transport);
    snprintf(out->op, sizeof out->op, "%s", op);
    out->ranks = ranks;
    double lo = INFINITY, hi = 0;
    for (size_t i = 0; i < n; i++) {
        if (!(bytes[i] > 0) || !(seconds[i] > 0))
            return dt_error_set(DT_ERR_INVALID, "alpha-beta fit: point %zu is (%g B, %g s)", i,
                                bytes[i], seconds[i]);
        lo = fmin(lo, bytes[i]);
        hi = fmax(hi, bytes[i]);
    }
    if (n < 2 || !(hi > lo))
        return dt_error_set(DT_ERR_INVALID,
                            "alpha-beta fit: %zu point(s); two different sizes at least", n);
    /* t = a + b m, weights 1/t^2 (relative error): the 2x2 normal equations. */
    double sw = 0, sm = 0, smm = 0, st = 0, smt = 0;
    for (size_t i = 0; i < n; i++) {
        double w = 1 / (seconds[i] * seconds[i]);
        sw += w;
        sm += w * bytes[i];
        smm += w * bytes[i] * bytes[i];
        st += w * seconds[i];
        smt += w * bytes[i] * seconds[i];
    }
    double det = sw * smm - sm * sm, a = (smm * st - sm * smt) / det,
           b = (sw * smt - sm * st) / det;
    if (!(a >= 0) || !(b > 0)) { /* latency or bandwidth outside the model: the other alone */
        a = fmax(a, 0);
        b = (smt - a * sm) / smm;
        if (!(b > 0)) {
            b = 0;
            a = st / sw;
        }
    }
    double worst = 0;
    for (size_t i = 0; i < n; i++)
        worst = fmax(worst, fabs(a + b * bytes[i] - seconds[i]) / seconds[i]);
    out->alpha = a;
    out->beta = b > 0 ? 1 / b : INFINITY;
    double steps, share;
    ring_model(op, ranks, &steps, &share);
    out->link_alpha = a / steps;
    out->link_bw = out->beta * share;
    out->points = (int)n;
    out->max_error = worst;
    out->lo = lo;
    out->hi = hi;
    return DT_OK;
}

dt_status dt_profile_save_link(const dt_link_fit *f, char *where, size_t len) {
    char path[4096], cpu[256], key[400], when[32];
    bool have_path;
    json_t *root = load(path, sizeof path, &have_path);
    if (!have_path) {
        json_decref(root);
        return dt_error_set(DT_ERR_NOT_FOUND, "machine profile: neither XDG_CACHE_HOME nor HOME");
    }
    json_t *links = root ? section(root, "links") : NULL;
    dt__cpu_model(cpu, sizeof cpu);
    snprintf(key, sizeof key, "%s|%s|%s|%d", cpu, f->transport, f->op, f->ranks);
    now_text(when, sizeof when);
    json_t *e =
        json_pack("{s:f, s:f, s:f, s:f, s:i, s:f, s:I, s:I, s:s}", "alpha_us", f->alpha * 1e6,
                  "beta_gbs", isfinite(f->beta) ? f->beta * 1e-9 : 0.0, "link_alpha_us",
                  f->link_alpha * 1e6, "link_bw_gbs",
                  isfinite(f->link_bw) ? f->link_bw * 1e-9 : 0.0, "points", f->points, "max_error",
                  f->max_error, "lo", (json_int_t)f->lo, "hi", (json_int_t)f->hi, "measured", when);
    dt_status st = links && e && json_object_set_new(links, key, e) == 0
                       ? save(path, root)
                       : dt_error_set(DT_ERR_NOMEM, "machine profile: out of memory");
    if (st == DT_OK && where)
        snprintf(where, len, "%s", path);
    json_decref(root);
    return st;
}

/* A stored link entry (key "CPU|transport|op|ranks") of this CPU into *f. */
static bool parse_link(const char *key, json_t *v, const char *cpu, dt_link_fit *f) {
    size_t cl = strlen(cpu);
    if (strncmp(key, cpu, cl) != 0 || key[cl] != '|' || !json_is_object(v))
        return false;
    memset(f, 0, sizeof *f);
    const char *rest = key + cl + 1, *b1 = strchr(rest, '|'), *b2 = b1 ? strchr(b1 + 1, '|') : NULL;
    if (!b1 || !b2)
        return false;
    snprintf(f->transport, sizeof f->transport, "%.*s", (int)(b1 - rest), rest);
    snprintf(f->op, sizeof f->op, "%.*s", (int)(b2 - b1 - 1), b1 + 1);
    f->ranks = atoi(b2 + 1);
    double bg = json_number_value(json_object_get(v, "beta_gbs"));
    double lbw = json_number_value(json_object_get(v, "link_bw_gbs"));
    f->alpha = json_number_value(json_object_get(v, "alpha_us")) * 1e-6;
    f->beta = bg > 0 ? bg * 1e9 : INFINITY;
    f->link_alpha = json_number_value(json_object_get(v, "link_alpha_us")) * 1e-6;
    f->link_bw = lbw > 0 ? lbw * 1e9 : INFINITY;
    f->points = (int)json_integer_value(json_object_get(v, "points"));
    f->max_error = json_number_value(json_object_get(v, "max_error"));
    f->lo = json_number_value(json_object_get(v, "lo"));
    f->hi = json_number_value(json_object_get(v, "hi"));
    return f->ranks > 0 && f->alpha >= 0;
}

dt_status dt_profile_links(dt_link_fit *out, size_t max, size_t *n) {
    char path[4096], cpu[256];
    bool have_path;
    *n = 0;
    json_t *root = load(path, sizeof path, &have_path);
    if (!root)
        return dt_error_set(DT_ERR_NOMEM, "machine profile: out of memory");
    dt__cpu_model(cpu, sizeof cpu);
    const char *key;
    json_t *v;
    json_object_foreach(json_object_get(root, "links"), key, v) {
        dt_link_fit f;
        if (!parse_link(key, v, cpu, &f))
            continue;
        if (*n < max)
            out[*n] = f;
        (*n)++;
    }
    json_decref(root);
    return DT_OK;
}

dt_status dt_profile_link(const char *transport, const char *op, int ranks, dt_link_fit *out) {
    dt_link_fit all[256];
    size_t n;
    DT_CHECK(dt_profile_links(all, 256, &n));
    int best = -1;
    for (size_t i = 0; i < n && i < 256; i++) {
        if (strcmp(all[i].transport, transport) != 0 || strcmp(all[i].op, op) != 0)
            continue;
        if (best < 0 || abs(all[i].ranks - ranks) < abs(all[best].ranks - ranks))
            best = (int)i;
    }
    if (best < 0)
        return dt_error_set(DT_ERR_NOT_FOUND,
                            "machine profile: no %s model on %s (run dtrain bench comm --op %s)",
                            op, transport, op);
    *out = all[best];
    return DT_OK;
}

/* ------------------------------------------------------------------------ */
/* Memory bandwidth                                                         */
/* ------------------------------------------------------------------------ */

typedef struct copier {
    size_t size;
    double secs;
} copier;

/* 4 copies of `size` bytes each way, the last 3 timed. */
static void *copy_main(void *p) {
    copier *c = p;
    char *a = dt_alloc(c->size), *b = dt_alloc(c->size);
    if (!a || !b) {
        dt_free(a);
        dt_free(b);
        c->secs = -1;
        return NULL;
    }
    memset(a, 1, c->size);
    memset(b, 2, c->size);
    memcpy(b, a, c->size);
    double t0 = dt_now();
    for (int i = 0; i < 3; i++)
        memcpy(i % 2 ? a : b, i % 2 ? b : a, c->size);
    c->secs = dt_now() - t0;
    dt_free(a);
    dt_free(b);
    return NULL;
}

/* Traffic (read + write) bytes/s of `threads` concurrent copies. */
static dt_status measure_bw(int threads, double *traffic) {
    enum { MAXT = 64 };
    if (threads < 1)
        threads = 1;
    if (threads > MAXT)
        threads = MAXT;
    copier c[MAXT];
    dt_thread *th[MAXT] = {0};
    dt_status st = DT_OK;
    int started = 0;
    for (int i = 0; i < threads && st == DT_OK; i++) {
        c[i] = (copier){.size = (size_t)32 << 20};
        st = dt_thread_create(&th[i], "dt-membw", copy_main, &c[i]);
        if (st == DT_OK)
            started++;
    }
    double worst = 0;
    for (int i = 0; i < started; i++) {
        dt_thread_join(th[i]);
        if (c[i].secs < 0)
            st = dt_error_set(DT_ERR_NOMEM, "memory bandwidth: copy buffers");
        worst = fmax(worst, c[i].secs);
    }
    if (st != DT_OK)
        return st;
    *traffic = 2.0 * 3 * (double)c[0].size * started / worst;
    return DT_OK;
}

static void mem_key(char *key, size_t len, int threads) {
    char cpu[256];
    dt__cpu_model(cpu, sizeof cpu);
    snprintf(key, len, "%s|%d", cpu, threads);
}

dt_status dt_profile_save_mem_bw(int threads, double traffic) {
    char path[4096], key[400], when[32];
    bool have_path;
    json_t *root = load(path, sizeof path, &have_path);
    if (!have_path) {
        json_decref(root);
        return dt_error_set(DT_ERR_NOT_FOUND, "machine profile: neither XDG_CACHE_HOME nor HOME");
    }
    json_t *mem = root ? section(root, "memory") : NULL;
    mem_key(key, sizeof key, threads);
    now_text(when, sizeof when);
    json_t *e = json_pack("{s:f, s:s}", "traffic_gbs", traffic * 1e-9, "measured", when);
    dt_status st = mem && e && json_object_set_new(mem, key, e) == 0
                       ? save(path, root)
                       : dt_error_set(DT_ERR_NOMEM, "machine profile: out of memory");
    json_decref(root);
    return st;
}

dt_status dt_profile_mem_bw(int threads, double *traffic, char *from, size_t len) {
    char path[4096], key[400];
    bool have_path;
    json_t *root = load(path, sizeof path, &have_path);
    mem_key(key, sizeof key, threads);
    json_t *e = root ? json_object_get(json_object_get(root, "memory"), key) : NULL;
    double gbs = e ? json_number_value(json_object_get(e, "traffic_gbs")) : 0;
    json_decref(root);
    if (gbs > 0) {
        *traffic = gbs * 1e9;
        if (from)
            snprintf(from, len, "%s", path);
        return DT_OK;
    }
    DT_CHECK(measure_bw(threads, traffic));
    if (from)
        snprintf(from, len, "measured now (%d thread(s) copying 32 MiB)", threads);
    if (have_path && dt_profile_save_mem_bw(threads, *traffic) != DT_OK)
        DT_INFO("profile: cannot store the memory bandwidth in %s: %s", path, dt_last_error());
    return DT_OK;
}
