/*
 * metrics.c — RUN_DIR/metrics.jsonl (one JSON object per optimizer step),
 * RUN_DIR/config.json, and the small JSON writer both use.
 *
 * Invariants: every metrics line is complete and flushed before the next
 * step starts, so a crashed run's file ends at its last finished step (a
 * resumed run appends). Non-finite numbers are written as null, keeping
 * the file valid JSON for every reader.
 */
#include "train_internal.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------------ */
/* JSON writer                                                              */
/* ------------------------------------------------------------------------ */

static void json_put(dt_json *j, const char *s, size_t n) {
    if (j->failed)
        return;
    if (j->len + n + 1 > j->cap) {
        size_t cap = j->cap ? j->cap : 256;
        while (j->len + n + 1 > cap)
            cap *= 2;
        char *b = realloc(j->buf, cap);
        if (!b) {
            j->failed = true;
            return;
        }
        j->buf = b;
        j->cap = cap;
    }
    memcpy(j->buf + j->len, s, n);
    j->len += n;
    j->buf[j->len] = '\0';
}

static void json_puts(dt_json *j, const char *s) { json_put(j, s, strlen(s)); }

static void json_printf(dt_json *j, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void json_printf(dt_json *j, const char *fmt, ...) {
    char b[64];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(b, sizeof b, fmt, ap);
    va_end(ap);
    DT_ASSERT(n >= 0 && (size_t)n < sizeof b);
    json_put(j, b, (size_t)n);
}

static void json_string(dt_json *j, const char *s) {
    json_puts(j, "\"");
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        switch (*p) {
        case '"': json_puts(j, "\\\""); break;
        case '\\': json_puts(j, "\\\\"); break;
        case '\n': json_puts(j, "\\n"); break;
        case '\t': json_puts(j, "\\t"); break;
        case '\r': json_puts(j, "\\r"); break;
        default:
            if (*p < 0x20)
                json_printf(j, "\\u%04x", *p);
            else
                json_put(j, (const char *)p, 1);
        }
    }
    json_puts(j, "\"");
}

static void json_key(dt_json *j, const char *key) {
    json_puts(j, j->first ? "\n  " : ",\n  ");
    j->first = false;
    json_string(j, key);
    json_puts(j, ": ");
}

void dt_json_begin(dt_json *j) {
    memset(j, 0, sizeof *j);
    j->first = true;
    json_puts(j, "{");
}

void dt_json_str(dt_json *j, const char *key, const char *value) {
    json_key(j, key);
    if (value)
        json_string(j, value);
    else
        json_puts(j, "null");
}

void dt_json_int(dt_json *j, const char *key, int64_t value) {
    json_key(j, key);
    json_printf(j, "%" PRId64, value);
}

void dt_json_num(dt_json *j, const char *key, double value) {
    json_key(j, key);
    if (isfinite(value))
        json_printf(j, "%.17g", value);
    else
        json_puts(j, "null");
}

void dt_json_bool(dt_json *j, const char *key, bool value) {
    json_key(j, key);
    json_puts(j, value ? "true" : "false");
}

const char *dt_json_finish(dt_json *j) {
    json_puts(j, j->first ? "}\n" : "\n}\n");
    return j->failed ? NULL : j->buf;
}

void dt_json_free(dt_json *j) {
    free(j->buf);
    memset(j, 0, sizeof *j);
}

/* ------------------------------------------------------------------------ */
/* metrics.jsonl                                                            */
/* ------------------------------------------------------------------------ */

struct dt_metrics {
    FILE *f;    /* RUN_DIR/metrics.jsonl */
    char *path; /* for messages */
};

/* "%.9g" or null: nine significant digits round-trip a float exactly. */
static int fmt_num(char *b, size_t len, double v) {
    return isfinite(v) ? snprintf(b, len, "%.9g", v) : snprintf(b, len, "null");
}

int dt_metrics_format(char *buf, size_t len, const dt_step_metrics *s) {
    char loss[32], val[32], lr[32], gn[32], tps[32], step[32], comp[32], comm[32], exp[32], mfu[32],
        scale[32], tpc[32], bub[32];
    fmt_num(loss, sizeof loss, s->loss);
    fmt_num(val, sizeof val, s->val_loss);
    fmt_num(lr, sizeof lr, s->lr);
    fmt_num(gn, sizeof gn, s->grad_norm);
    fmt_num(tps, sizeof tps, s->tokens_per_s);
    fmt_num(step, sizeof step, s->step_ms);
    fmt_num(comp, sizeof comp, s->compute_ms);
    fmt_num(comm, sizeof comm, s->comm_ms);
    fmt_num(exp, sizeof exp, s->exposed_comm_ms);
    fmt_num(tpc, sizeof tpc, s->tp_comm_ms);
    fmt_num(bub, sizeof bub, s->pp_bubble);
    fmt_num(mfu, sizeof mfu, s->mfu);
    fmt_num(scale, sizeof scale, s->loss_scale);
    int n = snprintf(buf, len,
                     "{\"step\":%" PRId64 ",\"loss\":%s,\"val_loss\":%s,\"lr\":%s,\"grad_norm\":%s,"
                     "\"tokens_per_s\":%s,\"step_ms\":%s,\"compute_ms\":%s,\"comm_ms\":%s,"
                     "\"exposed_comm_ms\":%s,\"tp_comm_ms\":%s,\"pp_bubble\":%s,"
                     "\"pp_peak_live\":%d,\"mfu\":%s,\"bytes_sent\":%" PRIu64 ",\"tokens\":%" PRId64
                     ",\"loss_scale\":%s,\"skipped_steps\":%" PRId64 "}\n",
                     s->step, loss, val, lr, gn, tps, step, comp, comm, exp, tpc, bub,
                     s->pp_peak_live, mfu, s->bytes_sent, s->tokens, scale, s->skipped_steps);
    return n < 0 || (size_t)n >= len ? -1 : n;
}

/* Keep the lines of steps <= upto (a resumed run replays later steps):
 * rewrite the file atomically with only those. A missing file is fine. */
static dt_status keep_steps_upto(const char *path, int64_t upto) {
    FILE *in = fopen(path, "r");
    if (!in)
        return DT_OK;
    /* A line is a few hundred bytes: read each into a fixed buffer, so a
     * damaged file cannot make us allocate without bound. */
    enum { MAX_LINE = 1 << 16 };
    char *kept = NULL, *line = malloc(MAX_LINE);
    size_t klen = 0, kcap = 0;
    dt_status st = line ? DT_OK : dt_error_set(DT_ERR_NOMEM, "reading %s", path);
    while (st == DT_OK && fgets(line, MAX_LINE, in)) {
        size_t n = strlen(line);
        if (n == MAX_LINE - 1 && line[n - 1] != '\n') {
            st = dt_error_set(DT_ERR_CORRUPT,
                              "%s: a line longer than %d bytes is not a metrics "
                              "line",
                              path, MAX_LINE - 1);
            break;
        }
        long long step;
        if (sscanf(line, "{\"step\":%lld", &step) != 1 || step > upto)
            continue;
        if (klen + n > kcap) {
            kcap = (klen + n) * 2;
            char *k = realloc(kept, kcap);
            if (!k) {
                st = dt_error_set(DT_ERR_NOMEM, "reading %s", path);
                break;
            }
            kept = k;
        }
        memcpy(kept + klen, line, n);
        klen += n;
    }
    free(line);
    fclose(in);
    if (st == DT_OK)
        st = dt_file_write_atomic(path, &(dt_file_part){kept ? kept : "", klen}, 1);
    free(kept);
    return st;
}

dt_status dt_metrics_create(dt_metrics **out, const char *run_dir, int64_t resume_step) {
    *out = NULL;
    DT_CHECK(dt_mkdir_p(run_dir));
    dt_metrics *m = dt_calloc(1, sizeof *m);
    if (!m)
        return DT_ERR_NOMEM;
    size_t len = strlen(run_dir) + sizeof "/metrics.jsonl";
    m->path = malloc(len);
    if (!m->path) {
        dt_free(m);
        return dt_error_set(DT_ERR_NOMEM, "metrics path");
    }
    snprintf(m->path, len, "%s/metrics.jsonl", run_dir);
    /* Never a device, FIFO or directory (a FIFO would block the read). */
    dt_status st = dt_file_check_replaceable(m->path);
    if (st == DT_OK && resume_step > 0)
        st = keep_steps_upto(m->path, resume_step);
    m->f = st == DT_OK ? fopen(m->path, resume_step > 0 ? "a" : "w") : NULL;
    if (!m->f) {
        if (st == DT_OK)
            st = dt_error_set_errno(DT_ERR_IO, "cannot open %s", m->path);
        free(m->path);
        dt_free(m);
        return st;
    }
    *out = m;
    return DT_OK;
}

dt_status dt_metrics_log(dt_metrics *m, const dt_step_metrics *s) {
    char line[1024];
    int n = dt_metrics_format(line, sizeof line, s);
    DT_ASSERT(n > 0);
    if (fwrite(line, 1, (size_t)n, m->f) != (size_t)n || fflush(m->f) != 0) {
        dt_status st = errno == ENOSPC ? DT_ERR_NOSPACE : DT_ERR_IO;
        return dt_error_set_errno(st, "cannot write %s", m->path);
    }
    return DT_OK;
}

void dt_metrics_destroy(dt_metrics *m) {
    if (!m)
        return;
    fclose(m->f);
    free(m->path);
    dt_free(m);
}

dt_status dt_metrics_write_config(const char *run_dir, const char *json) {
    DT_CHECK(dt_mkdir_p(run_dir));
    char path[4096];
    if (snprintf(path, sizeof path, "%s/config.json", run_dir) >= (int)sizeof path)
        return dt_error_set(DT_ERR_INVALID, "run directory name too long: %s", run_dir);
    return dt_file_write_atomic(path, &(dt_file_part){json, strlen(json)}, 1);
}
