/*
 * load.c — a run directory into a dt_run (report.h): the metrics, the
 * summary, the machine's roofs, and the trace aggregated by kernel and by
 * collective, plus the events of the last traced steps for the timeline.
 *
 * The trace is read as the train layer writes it (src/train/tracing.c):
 * one event per line. Two passes: the first aggregates and finds rank 0's
 * steps, the second keeps the events of the window (the last WINDOW_STEPS
 * steps of rank 0), so memory does not grow with the trace.
 *
 * Invariants: every length read from a file is bounded before use (a
 * metrics or trace line of more than MAX_LINE bytes is refused); a damaged
 * file is DT_ERR_CORRUPT naming the file and line.
 */
#include "report_internal.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_LINE     ((size_t)4 << 20)
#define WINDOW_STEPS 3
#define MAX_EVENTS   40000

double dt__rj_num(json_t *o, const char *key) {
    json_t *v = o ? json_object_get(o, key) : NULL;
    return json_is_number(v) ? json_number_value(v) : NAN;
}

/* A number as an integer, 0 when not finite or out of range. */
static int64_t whole(double v) { return isfinite(v) && fabs(v) < 9e15 ? (int64_t)v : 0; }

int64_t dt__rj_cfg_int(const dt_run *r, const char *key, int64_t def) {
    json_t *v = r->config ? json_object_get(r->config, key) : NULL;
    if (!v && r->config)
        v = json_object_get(json_object_get(r->config, "info"), key);
    return json_is_integer(v)  ? (int64_t)json_integer_value(v)
           : json_is_number(v) ? whole(json_number_value(v))
                               : def;
}

const char *dt__rj_cfg_str(const dt_run *r, const char *key, const char *def) {
    json_t *v = r->config ? json_object_get(r->config, key) : NULL;
    if (!v && r->config)
        v = json_object_get(json_object_get(r->config, "info"), key);
    return json_is_string(v) ? json_string_value(v) : def;
}

double dt__run_bd(const dt_run *r, int rank, int k) {
    if (rank < 0 || rank >= r->bd_ranks)
        return NAN;
    return r->bd_mean[(size_t)rank * DT_BREAKDOWN_FIELDS + (size_t)k];
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

double dt__run_step_ms(const dt_run *r) {
    if (r->bd_ranks > 0) {
        double s = 0;
        for (int i = 0; i < r->bd_ranks; i++)
            s += dt__run_bd(r, i, 6);
        if (isfinite(s) && s > 0)
            return s / r->bd_ranks;
    }
    double *v = malloc((r->nsteps + 1) * sizeof *v);
    size_t n = 0;
    for (size_t i = 1; v && i < r->nsteps; i++)
        if (isfinite(r->steps[i].step_ms))
            v[n++] = r->steps[i].step_ms;
    double m = NAN;
    if (n) {
        qsort(v, n, sizeof *v, cmp_double);
        m = v[n / 2];
    }
    free(v);
    return m;
}

double dt__run_model_s(const dt_run *r, const char *op, const char *link, int ranks, double size) {
    const run_link *best = NULL;
    for (size_t i = 0; i < r->nlinks; i++) {
        const run_link *l = &r->links[i];
        if (strcmp(l->op, op) != 0 || strcmp(l->transport, link) != 0)
            continue;
        if (!best || abs(l->ranks - ranks) < abs(best->ranks - ranks))
            best = l;
    }
    if (!best || !(best->beta > 0))
        return NAN;
    return best->alpha + size / best->beta;
}

/* ------------------------------------------------------------------------ */
/* Lines                                                                    */
/* ------------------------------------------------------------------------ */

/* The next line of f into *buf (grown as needed, at most MAX_LINE bytes);
 * 0 at the end, -1 when a line is too long. */
static int next_line(FILE *f, char **buf, size_t *cap, size_t *len) {
    size_t n = 0;
    int c;
    while ((c = fgetc(f)) != EOF) {
        if (n + 2 > *cap) {
            if (*cap >= MAX_LINE)
                return -1;
            size_t nc = *cap ? *cap * 2 : 4096;
            char *nb = realloc(*buf, nc);
            if (!nb)
                return -1;
            *buf = nb;
            *cap = nc;
        }
        (*buf)[n++] = (char)c;
        if (c == '\n')
            break;
    }
    if (n == 0)
        return 0;
    (*buf)[n] = 0;
    *len = n;
    return 1;
}

static json_t *load_json(const char *dir, const char *name, bool required, dt_status *st) {
    char path[4400];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = NULL;
    dt_status o = dt_file_open_read(path, name, &f);
    if (o == DT_ERR_NOT_FOUND && !required) {
        dt_error_clear();
        return NULL;
    }
    if (o != DT_OK) {
        *st = o;
        return NULL;
    }
    json_error_t err;
    json_t *v = json_loadf(f, 0, &err);
    fclose(f);
    if (!v)
        *st = dt_error_set(DT_ERR_CORRUPT, "%s: line %d: %s", path, err.line, err.text);
    return v;
}

/* ------------------------------------------------------------------------ */
/* metrics.jsonl                                                            */
/* ------------------------------------------------------------------------ */

static dt_status load_metrics(dt_run *r) {
    char path[4400];
    snprintf(path, sizeof path, "%s/metrics.jsonl", r->dir);
    FILE *f = NULL;
    dt_status st = dt_file_open_read(path, "metrics file", &f);
    if (st == DT_ERR_NOT_FOUND)
        return dt_error_set(DT_ERR_NOT_FOUND,
                            "%s: no metrics.jsonl (is it a run directory of dtrain train?)",
                            r->dir);
    DT_CHECK(st);
    char *line = NULL;
    size_t cap = 0, len, lineno = 0, scap = 0;
    int got;
    while ((got = next_line(f, &line, &cap, &len)) > 0) {
        lineno++;
        json_error_t err;
        json_t *o = json_loadb(line, len, 0, &err);
        if (!o || !json_is_object(o) || !json_is_integer(json_object_get(o, "step"))) {
            json_decref(o);
            st = dt_error_set(DT_ERR_CORRUPT, "%s: line %zu: not a metrics line", path, lineno);
            break;
        }
        if (r->nsteps == scap) {
            scap = scap ? 2 * scap : 256;
            run_step *ns = realloc(r->steps, scap * sizeof *ns);
            if (!ns) {
                json_decref(o);
                st = dt_error_set(DT_ERR_NOMEM, "%s", path);
                break;
            }
            r->steps = ns;
        }
        run_step *s = &r->steps[r->nsteps++];
        *s = (run_step){.step = json_integer_value(json_object_get(o, "step")),
                        .loss = dt__rj_num(o, "loss"),
                        .val_loss = dt__rj_num(o, "val_loss"),
                        .tokens_per_s = dt__rj_num(o, "tokens_per_s"),
                        .mfu = dt__rj_num(o, "mfu"),
                        .step_ms = dt__rj_num(o, "step_ms"),
                        .pp_bubble = dt__rj_num(o, "pp_bubble")};
        json_t *bd = json_object_get(o, "breakdown");
        json_t *c0 = bd ? json_object_get(bd, dt_breakdown_names[0]) : NULL;
        size_t nr = json_is_array(c0) ? json_array_size(c0) : 0;
        if (nr > 0 && nr <= 1 << 20) {
            s->bd = malloc(nr * DT_BREAKDOWN_FIELDS * sizeof *s->bd);
            if (s->bd) {
                s->nranks = (int)nr;
                for (int k = 0; k < DT_BREAKDOWN_FIELDS; k++) {
                    json_t *a = json_object_get(bd, dt_breakdown_names[k]);
                    for (size_t i = 0; i < nr; i++) {
                        json_t *v = json_array_get(a, i);
                        s->bd[i * DT_BREAKDOWN_FIELDS + (size_t)k] =
                            json_is_number(v) ? json_number_value(v) : NAN;
                    }
                }
            }
            if ((int)nr > r->world)
                r->world = (int)nr;
        }
        json_decref(o);
    }
    if (got < 0 && st == DT_OK)
        st = dt_error_set(DT_ERR_CORRUPT, "%s: line %zu: longer than %zu bytes", path, lineno + 1,
                          MAX_LINE);
    free(line);
    fclose(f);
    return st;
}

/* The mean breakdown per rank: summary.json's, else the metrics' lines
 * with every rank (after the first). */
static dt_status mean_breakdown(dt_run *r) {
    json_t *bd = r->summary ? json_object_get(r->summary, "breakdown") : NULL;
    json_t *c0 = bd ? json_object_get(bd, dt_breakdown_names[0]) : NULL;
    int n = json_is_array(c0) ? (int)json_array_size(c0) : 0;
    if (n > 0 && n <= 1 << 20) {
        r->bd_mean = malloc((size_t)n * DT_BREAKDOWN_FIELDS * sizeof *r->bd_mean);
        if (!r->bd_mean)
            return dt_error_set(DT_ERR_NOMEM, "breakdown");
        for (int k = 0; k < DT_BREAKDOWN_FIELDS; k++) {
            json_t *a = json_object_get(bd, dt_breakdown_names[k]);
            for (int i = 0; i < n; i++) {
                json_t *v = json_array_get(a, (size_t)i);
                r->bd_mean[(size_t)i * DT_BREAKDOWN_FIELDS + (size_t)k] =
                    json_is_number(v) ? json_number_value(v) : NAN;
            }
        }
        r->bd_ranks = n;
        r->bd_steps = whole(dt__rj_num(bd, "steps"));
        return DT_OK;
    }
    int w = r->world > 0 ? r->world : 1;
    double *sum = calloc((size_t)w * DT_BREAKDOWN_FIELDS, sizeof *sum);
    if (!sum)
        return dt_error_set(DT_ERR_NOMEM, "breakdown");
    int64_t cnt = 0;
    for (size_t i = r->nsteps > 1 ? 1 : 0; i < r->nsteps; i++) {
        if (r->steps[i].nranks != w)
            continue;
        for (size_t j = 0; j < (size_t)w * DT_BREAKDOWN_FIELDS; j++)
            sum[j] += r->steps[i].bd[j];
        cnt++;
    }
    if (cnt == 0) {
        free(sum);
        return DT_OK;
    }
    for (size_t j = 0; j < (size_t)w * DT_BREAKDOWN_FIELDS; j++)
        sum[j] /= (double)cnt;
    r->bd_mean = sum;
    r->bd_ranks = w;
    r->bd_steps = cnt;
    return DT_OK;
}

/* ------------------------------------------------------------------------ */
/* machine.json                                                             */
/* ------------------------------------------------------------------------ */

static dt_status load_machine(dt_run *r) {
    dt_status st = DT_OK;
    r->machine = load_json(r->dir, "trace/machine.json", false, &st);
    DT_CHECK(st);
    r->peak_flops = NAN;
    r->mem_bw = NAN;
    snprintf(r->precision, sizeof r->precision, "%s", dt__rj_cfg_str(r, "precision", "fp32"));
    if (r->summary)
        r->peak_flops = dt__rj_num(r->summary, "peak_flops");
    if (!r->machine)
        return DT_OK;
    json_t *pk = json_object_get(r->machine, "peak_flops");
    double p = dt__rj_num(pk, r->precision);
    if (p > 0)
        r->peak_flops = p;
    double bw = dt__rj_num(r->machine, "mem_bw");
    r->mem_bw = bw > 0 ? bw : NAN;
    json_t *links = json_object_get(r->machine, "links");
    size_t n = json_is_array(links) ? json_array_size(links) : 0;
    r->links = n ? calloc(n, sizeof *r->links) : NULL;
    if (n && !r->links)
        return dt_error_set(DT_ERR_NOMEM, "links");
    for (size_t i = 0; i < n; i++) {
        json_t *l = json_array_get(links, i);
        run_link *o = &r->links[r->nlinks];
        const char *tp = json_string_value(json_object_get(l, "transport"));
        const char *op = json_string_value(json_object_get(l, "op"));
        if (!tp || !op)
            continue;
        snprintf(o->transport, sizeof o->transport, "%s", tp);
        snprintf(o->op, sizeof o->op, "%s", op);
        o->ranks = (int)whole(dt__rj_num(l, "ranks"));
        o->alpha = dt__rj_num(l, "alpha_s");
        o->beta = dt__rj_num(l, "beta_Bps");
        if (o->ranks > 0 && o->alpha >= 0 && o->beta > 0)
            r->nlinks++;
    }
    return DT_OK;
}

/* ------------------------------------------------------------------------ */
/* The trace                                                                */
/* ------------------------------------------------------------------------ */

/* An event line ("{...},\n") as a JSON object, or NULL for other lines. */
static json_t *event_of(char *line, size_t len) {
    if (len == 0 || line[0] != '{' || strncmp(line, "{\"traceEvents\"", 14) == 0)
        return NULL;
    while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == ',' || line[len - 1] == ' '))
        len--;
    return json_loadb(line, len, 0, NULL);
}

static run_kernel *kernel_slot(dt_run *r, const char *name, const char *cat, size_t *cap) {
    for (size_t i = 0; i < r->nkernels; i++)
        if (!strcmp(r->kernels[i].name, name))
            return &r->kernels[i];
    if (r->nkernels == *cap) {
        *cap = *cap ? 2 * *cap : 64;
        run_kernel *n = realloc(r->kernels, *cap * sizeof *n);
        if (!n)
            return NULL;
        r->kernels = n;
    }
    run_kernel *k = &r->kernels[r->nkernels++];
    memset(k, 0, sizeof *k);
    snprintf(k->name, sizeof k->name, "%s", name);
    snprintf(k->cat, sizeof k->cat, "%s", cat);
    k->min = INFINITY;
    return k;
}

static run_coll *coll_slot(dt_run *r, const char *op, const char *link, const char *algo, int ranks,
                           double size, size_t *cap) {
    for (size_t i = 0; i < r->ncolls; i++) {
        run_coll *c = &r->colls[i];
        if (c->ranks == ranks && c->size == size && !strcmp(c->op, op) && !strcmp(c->link, link) &&
            !strcmp(c->algo, algo))
            return c;
    }
    if (r->ncolls == *cap) {
        *cap = *cap ? 2 * *cap : 64;
        run_coll *n = realloc(r->colls, *cap * sizeof *n);
        if (!n)
            return NULL;
        r->colls = n;
    }
    run_coll *c = &r->colls[r->ncolls++];
    memset(c, 0, sizeof *c);
    snprintf(c->op, sizeof c->op, "%s", op);
    snprintf(c->link, sizeof c->link, "%s", link);
    snprintf(c->algo, sizeof c->algo, "%s", algo);
    c->ranks = ranks;
    c->size = size;
    c->min = INFINITY;
    return c;
}

/* The whole buffer a collective's payload stands for (the nccl-tests size). */
static double coll_size(const char *op, double bytes, int ranks) {
    bool per_rank = !strcmp(op, "allgather") || !strcmp(op, "reduce_scatter") ||
                    !strcmp(op, "alltoall") || !strcmp(op, "gather") || !strcmp(op, "scatter");
    return per_rank ? bytes * ranks : bytes;
}

typedef struct step_mark {
    double ts, end;
    int64_t step;
} step_mark;

/* Pass 1: aggregate; rank 0's steps into *marks. */
static dt_status trace_pass1(dt_run *r, FILE *f, const char *path, step_mark **marks,
                             size_t *nmarks) {
    char *line = NULL;
    size_t cap = 0, len, lineno = 0, kcap = 0, ccap = 0, mcap = 0, tcap = 0;
    int got;
    dt_status st = DT_OK;
    while (st == DT_OK && (got = next_line(f, &line, &cap, &len)) > 0) {
        lineno++;
        if (strncmp(line, "\"otherData\":", 12) == 0) {
            char *b = strchr(line, '{'), *e = strrchr(line, '}');
            json_t *o = b && e > b ? json_loadb(b, (size_t)(e - b), 0, NULL) : NULL;
            json_t *clocks = json_object_get(o, "clocks");
            for (size_t i = 0; i < json_array_size(clocks); i++) {
                double err = dt__rj_num(json_array_get(clocks, i), "error_ns");
                if (isfinite(err) && err * 1e-3 > r->clock_error_us)
                    r->clock_error_us = err * 1e-3;
            }
            json_decref(o);
            continue;
        }
        json_t *e = event_of(line, len);
        if (!e)
            continue;
        const char *ph = json_string_value(json_object_get(e, "ph"));
        const char *name = json_string_value(json_object_get(e, "name"));
        const char *cat = json_string_value(json_object_get(e, "cat"));
        json_t *args = json_object_get(e, "args");
        int pid = (int)json_integer_value(json_object_get(e, "pid"));
        int tid = (int)json_integer_value(json_object_get(e, "tid"));
        if (!ph || !name) {
            json_decref(e);
            st = dt_error_set(DT_ERR_CORRUPT, "%s: line %zu: an event without ph or name", path,
                              lineno);
            break;
        }
        if (!strcmp(ph, "M") && !strcmp(name, "thread_name")) {
            if (r->nthreads == tcap) {
                tcap = tcap ? 2 * tcap : 16;
                run_thread *nt = realloc(r->threads, tcap * sizeof *nt);
                if (!nt) {
                    json_decref(e);
                    st = dt_error_set(DT_ERR_NOMEM, "%s", path);
                    break;
                }
                r->threads = nt;
            }
            run_thread *t = &r->threads[r->nthreads++];
            t->pid = pid;
            t->tid = tid;
            const char *tn = json_string_value(json_object_get(args, "name"));
            snprintf(t->name, sizeof t->name, "%s", tn ? tn : "?");
            if (pid + 1 > r->world)
                r->world = pid + 1;
        }
        if (strcmp(ph, "X") != 0 || !cat) {
            json_decref(e);
            continue;
        }
        double ts = dt__rj_num(e, "ts"), dur = dt__rj_num(e, "dur");
        double flops = dt__rj_num(args, "flops"), bytes = dt__rj_num(args, "bytes");
        if (!strcmp(cat, "step") && !strcmp(name, "step") && pid == 0) {
            if (*nmarks == mcap) {
                mcap = mcap ? 2 * mcap : 64;
                step_mark *nm = realloc(*marks, mcap * sizeof *nm);
                if (!nm) {
                    json_decref(e);
                    st = dt_error_set(DT_ERR_NOMEM, "%s", path);
                    break;
                }
                *marks = nm;
            }
            (*marks)[(*nmarks)++] = (step_mark){ts, ts + dur, whole(dt__rj_num(args, "step"))};
        } else if ((!strcmp(cat, "compute") || !strcmp(cat, "cast")) && (flops > 0 || bytes > 0)) {
            run_kernel *k = kernel_slot(r, name, cat, &kcap);
            if (!k) {
                json_decref(e);
                st = dt_error_set(DT_ERR_NOMEM, "%s", path);
                break;
            }
            k->count++;
            k->us += dur;
            k->min = fmin(k->min, dur);
            double work = flops > 0 ? flops : bytes;
            if (dur > 0 && work / dur > k->best_rate)
                k->best_rate = work / dur;
            k->flops += flops > 0 ? flops : 0;
            k->bytes += bytes > 0 ? bytes : 0;
        } else if (!strcmp(cat, "comm") && bytes > 0) {
            int ranks = (int)whole(dt__rj_num(args, "ranks"));
            const char *link = json_string_value(json_object_get(args, "link"));
            const char *algo = json_string_value(json_object_get(args, "algo"));
            if (ranks > 1 && link) {
                run_coll *c = coll_slot(r, name, link, algo ? algo : "?", ranks,
                                        coll_size(name, bytes, ranks), &ccap);
                if (!c) {
                    json_decref(e);
                    st = dt_error_set(DT_ERR_NOMEM, "%s", path);
                    break;
                }
                c->count++;
                c->us += dur;
                c->min = fmin(c->min, dur);
            }
        }
        json_decref(e);
    }
    if (st == DT_OK && got < 0)
        st = dt_error_set(DT_ERR_CORRUPT, "%s: line %zu: longer than %zu bytes", path, lineno + 1,
                          MAX_LINE);
    free(line);
    return st;
}

static int cmp_event_dur(const void *a, const void *b) {
    double x = ((const run_event *)a)->dur, y = ((const run_event *)b)->dur;
    return x > y ? -1 : x < y;
}

/* Pass 2: the events inside [win0, win1]. */
static dt_status trace_pass2(dt_run *r, FILE *f, const char *path) {
    char *line = NULL;
    size_t cap = 0, len, ecap = 0;
    int got;
    dt_status st = DT_OK;
    while (st == DT_OK && (got = next_line(f, &line, &cap, &len)) > 0) {
        json_t *e = event_of(line, len);
        if (!e)
            continue;
        const char *ph = json_string_value(json_object_get(e, "ph"));
        double ts = dt__rj_num(e, "ts"), dur = dt__rj_num(e, "dur");
        if (!ph || strcmp(ph, "X") != 0 || !(ts < r->win1) || !(ts + dur > r->win0)) {
            json_decref(e);
            continue;
        }
        if (r->nevents == ecap) {
            ecap = ecap ? 2 * ecap : 1024;
            run_event *ne = realloc(r->events, ecap * sizeof *ne);
            if (!ne) {
                json_decref(e);
                st = dt_error_set(DT_ERR_NOMEM, "%s", path);
                break;
            }
            r->events = ne;
        }
        run_event *v = &r->events[r->nevents++];
        json_t *args = json_object_get(e, "args");
        const char *name = json_string_value(json_object_get(e, "name"));
        const char *cat = json_string_value(json_object_get(e, "cat"));
        snprintf(v->name, sizeof v->name, "%s", name ? name : "?");
        snprintf(v->cat, sizeof v->cat, "%s", cat ? cat : "?");
        v->pid = (int)json_integer_value(json_object_get(e, "pid"));
        v->tid = (int)json_integer_value(json_object_get(e, "tid"));
        v->ts = ts;
        v->dur = dur;
        double idx = dt__rj_num(args, "layer");
        if (!isfinite(idx))
            idx = dt__rj_num(args, "step");
        v->idx = isfinite(idx) && fabs(idx) < 2e9 ? (int)idx : -1;
        v->bytes = dt__rj_num(args, "bytes");
        json_decref(e);
    }
    free(line);
    if (st == DT_OK && r->nevents > MAX_EVENTS) { /* the longest ones */
        qsort(r->events, r->nevents, sizeof *r->events, cmp_event_dur);
        r->nevents = MAX_EVENTS;
    }
    return st;
}

static dt_status load_trace(dt_run *r) {
    char path[4400];
    snprintf(path, sizeof path, "%s/trace/trace.json", r->dir);
    FILE *f = NULL;
    dt_status st = dt_file_open_read(path, "trace file", &f);
    if (st == DT_ERR_NOT_FOUND) {
        dt_error_clear();
        return DT_OK;
    }
    DT_CHECK(st);
    step_mark *marks = NULL;
    size_t nmarks = 0;
    st = trace_pass1(r, f, path, &marks, &nmarks);
    if (st == DT_OK && nmarks > 0) {
        r->traced = true;
        r->traced_steps = (int64_t)nmarks;
        size_t first = nmarks > WINDOW_STEPS ? nmarks - WINDOW_STEPS : 0;
        r->win0 = marks[first].ts;
        r->win1 = marks[nmarks - 1].end;
        r->win_steps = (int64_t)(nmarks - first);
        rewind(f);
        st = trace_pass2(r, f, path);
    }
    free(marks);
    fclose(f);
    /* The collectives' model (machine.json's fits). */
    for (size_t i = 0; i < r->ncolls; i++)
        r->colls[i].model = dt__run_model_s(r, r->colls[i].op, r->colls[i].link, r->colls[i].ranks,
                                            r->colls[i].size) *
                            1e6;
    return st;
}

/* ------------------------------------------------------------------------ */
/* A predicted step                                                         */
/* ------------------------------------------------------------------------ */

static dt_status bad_pred(const char *path, const char *what) {
    return dt_error_set(DT_ERR_INVALID,
                        "%s: %s: not a predicted timeline (`dtrain plan --timeline-json FILE` "
                        "writes one)",
                        path, what);
}

dt_status dt_run_load_predicted(dt_run *r, const char *path) {
    if (access(path, F_OK) != 0)
        return dt_error_set(DT_ERR_NOT_FOUND, "predicted timeline %s: no such file", path);
    json_error_t err;
    json_t *doc = json_load_file(path, 0, &err);
    if (!doc)
        return dt_error_set(DT_ERR_INVALID, "%s: line %d: %s", path, err.line, err.text);
    json_t *evs = json_object_get(doc, "traceEvents");
    json_t *other = json_object_get(doc, "otherData");
    dt_status st = DT_OK;
    if (!json_is_array(evs))
        st = bad_pred(path, "no traceEvents array");
    else if (!json_is_true(json_object_get(other, "predicted")))
        st = bad_pred(path, "otherData.predicted is not true");
    size_t n = st == DT_OK ? json_array_size(evs) : 0;
    free(r->pred);
    free(r->pred_threads);
    r->pred = calloc(n ? n : 1, sizeof *r->pred);
    r->pred_threads = calloc(n ? n : 1, sizeof *r->pred_threads);
    r->npred = r->npred_threads = 0;
    if (st == DT_OK && (!r->pred || !r->pred_threads))
        st = dt_error_set(DT_ERR_NOMEM, "%s: out of memory", path);
    double end = 0;
    for (size_t i = 0; st == DT_OK && i < n; i++) {
        json_t *e = json_array_get(evs, i);
        const char *ph = json_string_value(json_object_get(e, "ph"));
        const char *name = json_string_value(json_object_get(e, "name"));
        json_t *pid = json_object_get(e, "pid"), *tid = json_object_get(e, "tid");
        if (!ph || !name || !json_is_integer(pid) || !json_is_integer(tid)) {
            char what[64];
            snprintf(what, sizeof what, "event %zu lacks ph, name, pid or tid", i);
            st = bad_pred(path, what);
            break;
        }
        json_t *args = json_object_get(e, "args");
        if (!strcmp(ph, "M") && !strcmp(name, "thread_name")) {
            run_thread *t = &r->pred_threads[r->npred_threads++];
            t->pid = (int)json_integer_value(pid);
            t->tid = (int)json_integer_value(tid);
            const char *tn = json_string_value(json_object_get(args, "name"));
            snprintf(t->name, sizeof t->name, "%s", tn ? tn : "?");
            continue;
        }
        if (strcmp(ph, "X") != 0)
            continue;
        double ts = dt__rj_num(e, "ts"), dur = dt__rj_num(e, "dur");
        if (!isfinite(ts) || !isfinite(dur) || ts < 0 || dur < 0) {
            char what[160];
            snprintf(what, sizeof what, "event %zu (%.40s): ts %g, dur %g", i, name, ts, dur);
            st = bad_pred(path, what);
            break;
        }
        run_event *v = &r->pred[r->npred++];
        const char *cat = json_string_value(json_object_get(e, "cat"));
        snprintf(v->name, sizeof v->name, "%s", name);
        snprintf(v->cat, sizeof v->cat, "%s", cat ? cat : "?");
        v->pid = (int)json_integer_value(pid);
        v->tid = (int)json_integer_value(tid);
        v->ts = ts;
        v->dur = dur;
        double idx = dt__rj_num(args, "index");
        v->idx = isfinite(idx) && fabs(idx) < 2e9 ? (int)idx : -1;
        v->bytes = dt__rj_num(args, "bytes");
        end = fmax(end, ts + dur);
    }
    if (st == DT_OK && r->npred == 0)
        st = bad_pred(path, "no complete (X) events");
    if (st == DT_OK && r->npred > MAX_EVENTS) { /* the longest ones */
        qsort(r->pred, r->npred, sizeof *r->pred, cmp_event_dur);
        r->npred = MAX_EVENTS;
    }
    if (st == DT_OK) {
        r->pred_step_us = end;
        const char *lay = json_string_value(json_object_get(other, "layout"));
        snprintf(r->pred_layout, sizeof r->pred_layout, "%s", lay ? lay : "");
        snprintf(r->pred_path, sizeof r->pred_path, "%s", path);
    } else {
        r->npred = r->npred_threads = 0;
    }
    json_decref(doc);
    return st;
}

dt_status dt_run_load(const char *run_dir, dt_run **out) {
    *out = NULL;
    dt_run *r = calloc(1, sizeof *r);
    if (!r)
        return dt_error_set(DT_ERR_NOMEM, "report: out of memory");
    snprintf(r->dir, sizeof r->dir, "%s", run_dir);
    size_t l = strlen(r->dir);
    while (l > 1 && r->dir[l - 1] == '/')
        r->dir[--l] = 0;
    const char *base = strrchr(r->dir, '/');
    snprintf(r->name, sizeof r->name, "%s", base ? base + 1 : r->dir);
    dt_status st = DT_OK;
    r->config = load_json(r->dir, "config.json", false, &st);
    if (st == DT_OK)
        st = load_metrics(r);
    if (st == DT_OK)
        r->summary = load_json(r->dir, "summary.json", false, &st);
    if (st == DT_OK) {
        int w = (int)dt__rj_cfg_int(r, "world-size", 0);
        if (r->summary && dt__rj_num(r->summary, "world") > 0)
            w = (int)whole(dt__rj_num(r->summary, "world"));
        if (w > r->world)
            r->world = w;
        if (r->world < 1)
            r->world = 1;
        st = mean_breakdown(r);
    }
    if (st == DT_OK)
        st = load_machine(r);
    if (st == DT_OK)
        st = load_trace(r);
    if (st == DT_OK) {
        char pred[4400];
        snprintf(pred, sizeof pred, "%s/trace/predicted.json", r->dir);
        st = dt_run_load_predicted(r, pred);
        if (st == DT_ERR_NOT_FOUND) {
            dt_error_clear();
            st = DT_OK;
        }
    }
    if (st != DT_OK) {
        dt_run_destroy(r);
        return st;
    }
    *out = r;
    return DT_OK;
}

void dt_run_destroy(dt_run *r) {
    if (!r)
        return;
    json_decref(r->config);
    json_decref(r->summary);
    json_decref(r->machine);
    for (size_t i = 0; i < r->nsteps; i++)
        free(r->steps[i].bd);
    free(r->steps);
    free(r->bd_mean);
    free(r->kernels);
    free(r->colls);
    free(r->events);
    free(r->threads);
    free(r->links);
    free(r->pred);
    free(r->pred_threads);
    free(r);
}

const char *dt_run_dir(const dt_run *r) { return r->dir; }

void dt_run_print_summary(const dt_run *r, FILE *f) {
    const run_step *last = r->nsteps ? &r->steps[r->nsteps - 1] : NULL;
    double tps = r->summary ? dt__rj_num(r->summary, "tokens_per_s") : NAN;
    double mfu = r->summary ? dt__rj_num(r->summary, "mfu") : NAN;
    fprintf(f, "run:        %s: %zu step(s), %d rank(s)", r->dir, r->nsteps, r->world);
    if (last)
        fprintf(f, ", loss %.4f at step %lld", last->loss, (long long)last->step);
    if (isfinite(tps))
        fprintf(f, ", %.0f tokens/s", tps);
    if (isfinite(mfu))
        fprintf(f, ", MFU %.1f%%", 100 * mfu);
    fprintf(f, "\n");
    if (r->bd_ranks > 0) {
        int worst = 0;
        for (int i = 1; i < r->bd_ranks; i++)
            if (dt__run_bd(r, i, 6) > dt__run_bd(r, worst, 6))
                worst = i;
        double s = dt__run_bd(r, worst, 6);
        fprintf(f,
                "time/step:  %.1f ms on rank %d: compute %.0f%%, exposed comm %.0f%%, data %.0f%%, "
                "optimizer %.0f%%, idle %.0f%% (overlapped comm %.1f ms)\n",
                s, worst, 100 * dt__run_bd(r, worst, 0) / s, 100 * dt__run_bd(r, worst, 1) / s,
                100 * dt__run_bd(r, worst, 3) / s, 100 * dt__run_bd(r, worst, 4) / s,
                100 * dt__run_bd(r, worst, 5) / s, dt__run_bd(r, worst, 2));
    }
    if (r->npred) {
        double meas = dt__run_step_ms(r);
        fprintf(f, "predicted:  %.1f ms/step by dtrain plan (%s)", r->pred_step_us / 1e3,
                r->pred_layout[0] ? r->pred_layout : r->pred_path);
        if (isfinite(meas) && meas > 0)
            fprintf(f, "; measured %.1f ms (prediction %+.1f%%)", meas,
                    100 * (r->pred_step_us / 1e3 / meas - 1));
        fprintf(f, "\n");
    }
    if (!r->traced)
        fprintf(f, "trace:      none (dtrain train --trace records one: timeline, roofline)\n");
}
