/*
 * metrics.c — RUN_DIR/metrics.jsonl (one JSON object per optimizer step)
 * and RUN_DIR/config.json, both read and written with jansson.
 *
 * Invariants: every metrics line is complete and flushed before the next
 * step starts, so a crashed run's file ends at its last finished step (a
 * resumed run appends). Non-finite numbers are written as null, keeping
 * the file valid JSON for every reader.
 */
#include "train_internal.h"

#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------------ */
/* metrics.jsonl                                                            */
/* ------------------------------------------------------------------------ */

struct dt_metrics {
    FILE *f;    /* RUN_DIR/metrics.jsonl */
    char *path; /* for messages */
};

/* A real, or null when not finite (JSON has no NaN). */
static json_t *num(double v) { return isfinite(v) ? json_real(v) : json_null(); }

const char *const dt_breakdown_names[DT_BREAKDOWN_FIELDS] = {
    "compute", "exposed_comm", "overlapped_comm", "data", "optimizer", "idle", "step"};

/* Field k of a breakdown, in dt_breakdown_names' order. */
static double breakdown_field(const dt_step_breakdown *b, int k) {
    const double v[DT_BREAKDOWN_FIELDS] = {
        b->compute, b->exposed_comm, b->overlapped_comm, b->data, b->optimizer, b->idle, b->step};
    return v[k];
}

/* "breakdown": {"compute": [rank 0, rank 1, ...], ...}, ms rounded to the µs. */
static json_t *breakdown_json(const dt_step_breakdown *r, int n) {
    json_t *o = json_object();
    for (int k = 0; o && k < DT_BREAKDOWN_FIELDS; k++) {
        json_t *a = json_array();
        for (int i = 0; a && i < n; i++)
            json_array_append_new(a, num(round(breakdown_field(&r[i], k) * 1e3) / 1e3));
        if (!a || json_object_set_new(o, dt_breakdown_names[k], a) != 0) {
            json_decref(o);
            return NULL;
        }
    }
    return o;
}

int dt_metrics_format(char *buf, size_t len, const dt_step_metrics *s) {
    json_t *o = json_pack(
        "{s:I, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:i, s:o, s:I, s:I, "
        "s:o, s:I}",
        "step", (json_int_t)s->step, "loss", num(s->loss), "val_loss", num(s->val_loss), "lr",
        num(s->lr), "grad_norm", num(s->grad_norm), "tokens_per_s", num(s->tokens_per_s), "step_ms",
        num(s->step_ms), "compute_ms", num(s->compute_ms), "comm_ms", num(s->comm_ms),
        "exposed_comm_ms", num(s->exposed_comm_ms), "tp_comm_ms", num(s->tp_comm_ms),
        "cp_attention_ms", num(s->cp_attention_ms), "pp_bubble", num(s->pp_bubble), "pp_peak_live",
        s->pp_peak_live, "mfu", num(s->mfu), "bytes_sent", (json_int_t)s->bytes_sent, "tokens",
        (json_int_t)s->tokens, "loss_scale", num(s->loss_scale), "skipped_steps",
        (json_int_t)s->skipped_steps);
    if (!o)
        return -1;
    if (s->has_staleness)
        json_object_set_new(o, "staleness", json_integer(s->staleness));
    if (s->has_consensus) /* only the steps that measured it */
        json_object_set_new(o, "consensus", json_real(s->consensus));
    if (isfinite(s->elapsed_s) && s->elapsed_s > 0) /* the loop's; 0 from other writers */
        json_object_set_new(o, "elapsed_s", json_real(s->elapsed_s));
    if (s->ranks && s->nranks > 0) {
        json_t *b = breakdown_json(s->ranks, s->nranks);
        if (!b || json_object_set_new(o, "breakdown", b) != 0) {
            json_decref(o);
            return -1;
        }
    }
    if (s->codecs) {
        json_object_set_new(o, "codecs", json_string(s->codecs));
        json_object_set_new(o, "link_MBps", num(s->link_mbs));
    }
    if (s->has_fwd_lead && isfinite(s->fwd_lead_ms))
        json_object_set_new(o, "fwd_lead_ms", json_real(s->fwd_lead_ms));
    /* Nine significant digits read back as the same float. */
    size_t n = json_dumpb(o, buf, len, JSON_COMPACT | JSON_REAL_PRECISION(9));
    json_decref(o);
    if (n == 0 || n + 2 > len)
        return -1;
    buf[n] = '\n';
    buf[n + 1] = '\0';
    return (int)n + 1;
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
        json_t *o = json_loadb(line, n, 0, NULL);
        json_t *sv = o ? json_object_get(o, "step") : NULL;
        json_int_t step = json_is_integer(sv) ? json_integer_value(sv) : -1;
        json_decref(o);
        if (step < 0 || step > upto) /* a torn or foreign line goes too */
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
    /* A breakdown adds 7 numbers per rank, each at most ~20 characters. */
    char small[4096];
    size_t cap = 1024 + (size_t)(s->ranks ? s->nranks : 0) * DT_BREAKDOWN_FIELDS * 24;
    char *line = cap <= sizeof small ? small : malloc(cap);
    if (!line)
        return dt_error_set(DT_ERR_NOMEM, "metrics line of %zu bytes", cap);
    int n = dt_metrics_format(line, cap <= sizeof small ? sizeof small : cap, s);
    DT_ASSERT(n > 0);
    dt_status st = DT_OK;
    if (fwrite(line, 1, (size_t)n, m->f) != (size_t)n || fflush(m->f) != 0) {
        st = errno == ENOSPC ? DT_ERR_NOSPACE : DT_ERR_IO;
        st = dt_error_set_errno(st, "cannot write %s", m->path);
    }
    if (line != small)
        free(line);
    return st;
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
