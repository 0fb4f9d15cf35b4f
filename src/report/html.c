/*
 * html.c — `dtrain report`'s page (report.h, dt_report_write): one HTML
 * file holding the run's data as JSON, the advice and the configuration
 * as markup, and the script and style that draw the charts (page.js,
 * page.css, compiled in by cmake/embed.cmake). Viewing it needs nothing
 * else: no network, no file next to it.
 *
 * Charts (each a <div class="chart" data-chart=KIND>, drawn by page.js):
 * loss, throughput, mfu, breakdown (per rank), breakdown-steps (per step,
 * a rank chosen in a menu), timeline (the last traced steps, every rank's
 * threads), roofline, collectives (against their alpha-beta model),
 * memory. With two runs (--compare) the curves are overlaid and each run
 * gets its own timeline.
 *
 * Invariants: every string of the run that reaches the page is escaped
 * for where it lands (HTML text, or JSON inside a script, where "</" is
 * written "<\/" so no value can close the script).
 */
#include "report_assets.h"
#include "report_internal.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Per-step breakdowns drawn at most (longer runs are sampled evenly). */
#define MAX_BD_STEPS 600

static void html_text(FILE *f, const char *s) {
    for (; s && *s; s++) {
        switch (*s) {
        case '<': fputs("&lt;", f); break;
        case '>': fputs("&gt;", f); break;
        case '&': fputs("&amp;", f); break;
        case '"': fputs("&quot;", f); break;
        default: fputc(*s, f);
        }
    }
}

static json_t *num(double v) { return isfinite(v) ? json_real(v) : json_null(); }

static json_t *str(const char *s) {
    json_t *v = json_string(s ? s : "");
    return v ? v : json_string("?");
}

static json_t *steps_json(const dt_run *r) {
    json_t *a = json_array();
    for (size_t i = 0; a && i < r->nsteps; i++) {
        const run_step *s = &r->steps[i];
        json_array_append_new(a, json_pack("[I, o, o, o, o, o]", (json_int_t)s->step, num(s->loss),
                                           num(s->val_loss), num(s->tokens_per_s), num(s->mfu),
                                           num(s->step_ms)));
    }
    return a;
}

static json_t *breakdown_json(const dt_run *r) {
    json_t *fields = json_array(), *ranks = json_array();
    for (int k = 0; k < DT_BREAKDOWN_FIELDS; k++)
        json_array_append_new(fields, str(dt_breakdown_names[k]));
    for (int i = 0; i < r->bd_ranks; i++) {
        json_t *row = json_array();
        for (int k = 0; k < DT_BREAKDOWN_FIELDS; k++)
            json_array_append_new(row, num(dt__run_bd(r, i, k)));
        json_array_append_new(ranks, row);
    }
    return json_pack("{s:o, s:o, s:I}", "fields", fields, "ranks", ranks, "steps",
                     (json_int_t)r->bd_steps);
}

/* The steps with every rank's breakdown, sampled down to MAX_BD_STEPS. */
static json_t *breakdown_steps_json(const dt_run *r) {
    size_t full = 0;
    for (size_t i = 0; i < r->nsteps; i++)
        full += r->steps[i].nranks == r->world;
    json_t *steps = json_array(), *data = json_array();
    size_t stride = full > MAX_BD_STEPS ? (full + MAX_BD_STEPS - 1) / MAX_BD_STEPS : 1, seen = 0;
    for (size_t i = 0; i < r->nsteps; i++) {
        const run_step *s = &r->steps[i];
        if (s->nranks != r->world || seen++ % stride != 0)
            continue;
        json_array_append_new(steps, json_integer(s->step));
        json_t *row = json_array();
        for (int j = 0; j < s->nranks * DT_BREAKDOWN_FIELDS; j++)
            json_array_append_new(row, num(round(s->bd[j] * 1e3) / 1e3));
        json_array_append_new(data, row);
    }
    return json_pack("{s:o, s:o, s:i}", "steps", steps, "data", data, "ranks", r->world);
}

static json_t *memory_json(const dt_run *r) {
    json_t *m = r->summary ? json_object_get(r->summary, "memory") : NULL;
    if (!m)
        return json_null();
    return json_pack("{s:O, s:O, s:O}", "planned", json_object_get(m, "planned"), "peak",
                     json_object_get(m, "peak_resident"), "base",
                     json_object_get(m, "base_resident"));
}

static json_t *roofline_json(const dt_run *r) {
    if (!r->traced)
        return json_null();
    json_t *k = json_array();
    for (size_t i = 0; i < r->nkernels; i++) {
        const run_kernel *x = &r->kernels[i];
        json_array_append_new(k, json_pack("{s:o, s:o, s:f, s:f, s:f, s:I}", "name", str(x->name),
                                           "cat", str(x->cat), "flops", x->flops, "bytes", x->bytes,
                                           "us", x->us, "count", (json_int_t)x->count));
    }
    return json_pack("{s:o, s:o, s:o}", "peak", num(r->peak_flops), "mem_bw", num(r->mem_bw),
                     "kernels", k);
}

static json_t *collectives_json(const dt_run *r) {
    json_t *a = json_array();
    for (size_t i = 0; i < r->ncolls; i++) {
        const run_coll *c = &r->colls[i];
        json_array_append_new(a, json_pack("{s:o, s:o, s:o, s:i, s:f, s:I, s:f, s:o, s:o}", "op",
                                           str(c->op), "link", str(c->link), "algo", str(c->algo),
                                           "ranks", c->ranks, "size", c->size, "count",
                                           (json_int_t)c->count, "us", c->us, "min", num(c->min),
                                           "model", num(c->model)));
    }
    return a;
}

static json_t *links_json(const dt_run *r) {
    json_t *a = json_array();
    for (size_t i = 0; i < r->nlinks; i++) {
        const run_link *l = &r->links[i];
        json_array_append_new(a, json_pack("{s:o, s:o, s:i, s:f, s:f}", "transport",
                                           str(l->transport), "op", str(l->op), "ranks", l->ranks,
                                           "alpha", l->alpha, "beta", l->beta));
    }
    return a;
}

static json_t *events_json(const run_event *evs, size_t n) {
    json_t *ev = json_array();
    for (size_t i = 0; i < n; i++) {
        const run_event *e = &evs[i];
        json_array_append_new(ev,
                              json_pack("[i, i, f, f, o, o, i, o]", e->pid, e->tid, e->ts, e->dur,
                                        str(e->name), str(e->cat), e->idx, num(e->bytes)));
    }
    return ev;
}

static json_t *threads_json(const run_thread *t, size_t n) {
    json_t *th = json_array();
    for (size_t i = 0; i < n; i++)
        json_array_append_new(th, json_pack("[i, i, o]", t[i].pid, t[i].tid, str(t[i].name)));
    return th;
}

/* The measured window and, overlaid, the predicted step (dtrain plan). */
static json_t *timeline_json(const dt_run *r) {
    bool measured = r->traced && r->nevents > 0;
    if (!measured && r->npred == 0)
        return json_null();
    json_t *o = json_pack("{s:f, s:f, s:I, s:o, s:o}", "t0", measured ? r->win0 : 0.0, "t1",
                          measured ? r->win1 : r->pred_step_us, "steps",
                          (json_int_t)(measured ? r->win_steps : 0), "threads",
                          measured ? threads_json(r->threads, r->nthreads) : json_array(), "events",
                          measured ? events_json(r->events, r->nevents) : json_array());
    if (r->npred)
        json_object_set_new(o, "predicted",
                            json_pack("{s:f, s:o, s:o, s:o}", "step_us", r->pred_step_us, "layout",
                                      str(r->pred_layout), "threads",
                                      threads_json(r->pred_threads, r->npred_threads), "events",
                                      events_json(r->pred, r->npred)));
    return o;
}

static json_t *run_json(const dt_run *r) {
    return json_pack("{s:o, s:o, s:i, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:b}", "name",
                     str(r->name), "dir", str(r->dir), "world", r->world, "precision",
                     str(r->precision), "steps", steps_json(r), "breakdown", breakdown_json(r),
                     "breakdown_steps", breakdown_steps_json(r), "memory", memory_json(r),
                     "roofline", roofline_json(r), "collectives", collectives_json(r), "links",
                     links_json(r), "timeline", timeline_json(r), "traced", r->traced);
}

/* The data as the text of a <script>: "</" can close nothing. */
static dt_status put_data(FILE *f, const dt_run *const *runs, size_t n) {
    json_t *arr = json_array();
    for (size_t i = 0; arr && i < n; i++) {
        json_t *rj = run_json(runs[i]);
        if (!rj || json_array_append_new(arr, rj) != 0) {
            json_decref(arr);
            return dt_error_set(DT_ERR_NOMEM, "report: the page's data");
        }
    }
    json_t *root = arr ? json_pack("{s:o, s:i}", "runs", arr, "version", 1) : NULL;
    char *text = root ? json_dumps(root, JSON_COMPACT | JSON_REAL_PRECISION(7)) : NULL;
    json_decref(root);
    if (!text)
        return dt_error_set(DT_ERR_NOMEM, "report: the page's data");
    for (const char *p = text; *p; p++) {
        if (p[0] == '<' && p[1] == '/')
            fputs("<\\", f);
        else
            fputc(*p, f);
    }
    free(text);
    return DT_OK;
}

static void card(FILE *f, const char *k, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void card(FILE *f, const char *k, const char *fmt, ...) {
    char v[128];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(v, sizeof v, fmt, ap);
    va_end(ap);
    fprintf(f, "<div class=\"card\"><div class=\"k\">");
    html_text(f, k);
    fprintf(f, "</div><div class=\"v\">");
    html_text(f, v);
    fprintf(f, "</div></div>");
}

static void cards(FILE *f, const dt_run *r) {
    double tps = r->summary ? dt__rj_num(r->summary, "tokens_per_s") : NAN;
    double mfu = r->summary ? dt__rj_num(r->summary, "mfu") : NAN;
    double step = dt__run_step_ms(r);
    const run_step *last = r->nsteps ? &r->steps[r->nsteps - 1] : NULL;
    double val = NAN;
    for (size_t i = r->nsteps; i-- > 0;)
        if (isfinite(r->steps[i].val_loss)) {
            val = r->steps[i].val_loss;
            break;
        }
    fprintf(f, "<div class=\"cards\">");
    card(f, "run", "%s", r->name);
    card(f, "model", "%s", dt__rj_cfg_str(r, "model", "?"));
    card(f, "steps", "%lld", last ? (long long)last->step : 0LL);
    card(f, "ranks", "%d", r->world);
    json_t *info = r->config ? json_object_get(r->config, "info") : NULL;
    double dp = dt__rj_num(info, "dp");
    card(f, "layout", "dp %lld tp %lld pp %lld cp %lld",
         isfinite(dp) ? (long long)dp : (long long)dt__rj_cfg_int(r, "dp", 1),
         (long long)dt__rj_cfg_int(r, "tp", 1), (long long)dt__rj_cfg_int(r, "pp", 1),
         (long long)dt__rj_cfg_int(r, "cp", 1));
    card(f, "precision", "%s", r->precision);
    if (isfinite(tps))
        card(f, "tokens/s (median)", "%.0f", tps);
    if (isfinite(mfu))
        card(f, "MFU (median)", "%.1f%%", 100 * mfu);
    if (isfinite(step))
        card(f, "step (mean)", "%.1f ms", step);
    if (last)
        card(f, "final loss", "%.4f", last->loss);
    if (isfinite(val))
        card(f, "val loss", "%.4f", val);
    fprintf(f, "</div>\n");
}

static void advice_html(FILE *f, const dt_run *r, bool named) {
    dt_advice adv[16];
    size_t n = dt_run_advise(r, adv, 16);
    if (named) {
        fprintf(f, "<p class=\"run-name\">");
        html_text(f, r->name);
        fprintf(f, "</p>");
    }
    fprintf(f, "<ol class=\"advice\" data-run=\"");
    html_text(f, r->name);
    fprintf(f, "\">\n");
    for (size_t i = 0; i < n && i < 16; i++) {
        fprintf(f, "<li data-rule=\"%s\"><div class=\"title\">", adv[i].rule);
        html_text(f, adv[i].title);
        fprintf(f, "</div><div>");
        html_text(f, adv[i].text);
        fprintf(f, "</div>");
        if (adv[i].gain_ms > 0)
            fprintf(f, "<div class=\"gain\">expected gain: %.1f ms per step (%.0f%%)</div>",
                    adv[i].gain_ms, 100 * adv[i].gain);
        fprintf(f, "</li>\n");
    }
    if (n == 0) {
        double step = dt__run_step_ms(r);
        double c = r->bd_ranks ? dt__run_bd(r, 0, 0) : NAN;
        fprintf(f, "<li data-rule=\"none\"><div class=\"title\">No rule fired</div><div>");
        if (isfinite(step) && isfinite(c))
            fprintf(f,
                    "Compute is %.0f%% of rank 0's %.1f ms step; communication, data, the "
                    "optimizer and waiting are each below their thresholds.",
                    100 * c / step, step);
        fprintf(f, "</div></li>\n");
    }
    fprintf(f, "</ol>\n");
}

/* The configuration: every option of config.json (and its info), the
 * rows that differ between two runs marked. */
static void config_html(FILE *f, const dt_run *const *runs, size_t n) {
    fprintf(f, "<table class=\"cfg\"><tr><th>option</th>");
    for (size_t i = 0; i < n; i++) {
        fprintf(f, "<th>");
        html_text(f, runs[i]->name);
        fprintf(f, "</th>");
    }
    fprintf(f, "</tr>\n");
    const char *sections[2] = {NULL, "info"};
    for (int s = 0; s < 2; s++) {
        json_t *base = runs[0]->config;
        if (s == 1)
            base = base ? json_object_get(base, "info") : NULL;
        const char *key;
        json_t *v;
        json_object_foreach(base, key, v) {
            if (s == 0 && !strcmp(key, "info"))
                continue;
            char *vals[2] = {NULL, NULL};
            for (size_t i = 0; i < n; i++) {
                json_t *c = runs[i]->config;
                if (s == 1)
                    c = c ? json_object_get(c, "info") : NULL;
                json_t *x = c ? json_object_get(c, key) : NULL;
                vals[i] = x ? json_dumps(x, JSON_ENCODE_ANY | JSON_COMPACT) : NULL;
            }
            bool diff = n > 1 && (!vals[0] || !vals[1] || strcmp(vals[0], vals[1]) != 0);
            fprintf(f, "<tr%s><td>", diff ? " class=\"diff\"" : "");
            if (sections[s])
                fprintf(f, "%s.", sections[s]);
            html_text(f, key);
            fprintf(f, "</td>");
            for (size_t i = 0; i < n; i++) {
                fprintf(f, "<td>");
                html_text(f, vals[i] ? vals[i] : "");
                fprintf(f, "</td>");
                free(vals[i]);
            }
            fprintf(f, "</tr>\n");
        }
    }
    fprintf(f, "</table>\n");
}

static void chart(FILE *f, const char *id, const char *kind, const char *title, const char *note,
                  bool wide, int run) {
    fprintf(f,
            "<section%s id=\"sec-%s\"><h2>%s</h2><div class=\"chart\" id=\"chart-%s\" "
            "data-chart=\"%s\" data-run=\"%d\"></div>",
            wide ? " class=\"wide\"" : "", id, title, id, kind, run);
    if (note)
        fprintf(f, "<p class=\"note\">%s</p>", note);
    fprintf(f, "</section>\n");
}

dt_status dt_report_write(const dt_run *const *runs, size_t n, FILE *f) {
    if (n < 1 || n > 2)
        return dt_error_set(DT_ERR_INVALID, "report: %zu runs (1, or 2 to compare)", n);
    fprintf(f,
            "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
            "<meta name=\"generator\" content=\"dtrain %s\">\n<title>dtrain report: ",
            DT_VERSION_STRING);
    html_text(f, runs[0]->name);
    if (n > 1) {
        fprintf(f, " vs ");
        html_text(f, runs[1]->name);
    }
    fprintf(f, "</title>\n<style>\n%s</style>\n", dt__page_css);
    /* Before anything else runs: errors are written into the page, where a
     * test (or a reader) finds them. */
    fprintf(f, "<script>window.addEventListener('error', function (e) {"
               " var d = document.getElementById('js-errors');"
               " if (d) d.textContent += (e.message || 'error') + ' at ' + (e.filename || '') +"
               " ':' + (e.lineno || 0) + '\\n'; });</script>\n</head>\n<body>\n");
    fprintf(f, "<header><h1>dtrain report</h1><p class=\"sub\">");
    for (size_t i = 0; i < n; i++) {
        if (i)
            fprintf(f, " &nbsp;vs&nbsp; ");
        html_text(f, runs[i]->dir);
    }
    fprintf(f, "</p>\n");
    for (size_t i = 0; i < n; i++)
        cards(f, runs[i]);
    fprintf(f, "</header>\n<div id=\"js-errors\"></div>\n");
    fprintf(f,
            "<nav><a href=\"#sec-advice\">advice</a><a href=\"#sec-loss\">loss</a>"
            "<a href=\"#sec-breakdown\">breakdown</a><a href=\"#sec-timeline\">timeline</a>"
            "<a href=\"#sec-roofline\">roofline</a><a href=\"#sec-collectives\">collectives</a>"
            "<a href=\"#sec-memory\">memory</a><a href=\"#sec-config\">configuration</a></nav>\n");
    fprintf(f, "<main>\n<section class=\"wide\" id=\"sec-advice\"><h2>Advice</h2>\n");
    for (size_t i = 0; i < n; i++)
        advice_html(f, runs[i], n > 1);
    fprintf(f, "</section>\n");
    chart(f, "loss", "loss", "Loss", "training loss per step; validation loss where evaluated",
          false, 0);
    chart(f, "throughput", "throughput", "Throughput", "tokens per second of all ranks, per step",
          false, 0);
    chart(f, "mfu", "mfu", "Model FLOPs utilisation",
          "model FLOPs (3 x forward) per second against the measured peak of every rank", false, 0);
    chart(f, "breakdown", "breakdown", "Step breakdown per rank",
          "mean ms per step; overlapped communication ran during compute (in the tooltip)", false,
          0);
    chart(f, "breakdown-steps", "breakdown-steps", "Step breakdown per step", NULL, true, 0);
    for (size_t i = 0; i < n; i++) {
        char id[32], title[300];
        snprintf(id, sizeof id, i ? "timeline-%zu" : "timeline", i);
        snprintf(title, sizeof title, "Timeline%s%s", n > 1 ? ": " : "",
                 n > 1 ? runs[i]->name : "");
        chart(f, id, "timeline", title,
              "every rank's threads over the last traced steps (the merged trace); the whole "
              "trace opens in ui.perfetto.dev: trace/trace.json",
              true, (int)i);
    }
    chart(f, "roofline", "roofline", "Roofline",
          "each kernel's FLOP/s and arithmetic intensity against this machine's measured peak and "
          "memory bandwidth; area: share of kernel time",
          false, 0);
    chart(f, "collectives", "collectives", "Collectives",
          "achieved bandwidth per operation and size; dashed: the alpha-beta model fitted to "
          "dtrain bench comm",
          false, 0);
    chart(f, "memory", "memory", "Memory per rank",
          "planned (params, grads, optimizer, activations) above the measured peak resident "
          "memory",
          true, 0);
    fprintf(f, "<section class=\"wide\" id=\"sec-config\"><h2>Configuration</h2>\n");
    config_html(f, runs, n);
    fprintf(f, "</section>\n</main>\n<script type=\"application/json\" id=\"report-data\">");
    DT_CHECK(put_data(f, runs, n));
    fprintf(f, "</script>\n<script>\n%s</script>\n</body></html>\n", dt__page_js);
    return ferror(f) ? dt_error_set(DT_ERR_IO, "report: writing the page") : DT_OK;
}
