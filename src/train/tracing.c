/*
 * tracing.c — `dtrain train --trace`: when the recorder of dtrain/trace.h
 * runs, and the files it leaves (docs/observability.md):
 *
 *   RUN_DIR/trace/rank-R.json   rank R's events (Chrome trace / Perfetto JSON)
 *   RUN_DIR/trace/trace.json    every rank's events on one time line
 *   RUN_DIR/trace/machine.json  this machine's measured peaks, memory
 *                               bandwidth and link models (the report's roofs)
 *
 * Clocks. Every rank measures its trace clock against rank 0's through the
 * rendezvous store (dt_group_clock_sample) when tracing starts and again
 * when it ends. Each sample bounds the offset (rank 0's clock minus this
 * one) to an interval; the offset at local time x is taken on the line
 * through the two midpoints, which removes a constant offset and a linear
 * drift. Ranks on one kernel share CLOCK_MONOTONIC: when both intervals
 * hold 0 the offset is exactly 0 (a measured offset there is the probe's
 * asymmetry, not the clock's). Every file's time 0 is rank 0's clock when
 * tracing started. Each event is written with its aligned start ("ts")
 * and length ("dur") in microseconds, one event per line (so a reader can
 * stream the file; the whole is one JSON document).
 *
 * Invariants: recording is on only inside the steps of --trace-steps;
 * the files are written after the loop, when no thread records (rule 3 of
 * trace.h); the merged file is assembled on rank 0 from what every rank
 * sends it over the world group, so no shared file system is needed.
 */
#include "dtrain/tensor.h"
#include "dtrain/trace.h"
#include "train_internal.h"

#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define CLOCK_PROBES 64
#define MAX_THREADS  256
#define TAG_TRACE    0x7472 /* point-to-point tag of the events sent to rank 0 */

/* DT_FAULT_CLOCK="RANK:OFFSET_MS[:DRIFT_PPM]" (a test hook): that rank's
 * trace clock runs OFFSET_MS ahead and drifts DRIFT_PPM. */
static dt_status clock_fault(const trainer *t) {
    const char *f = getenv("DT_FAULT_CLOCK");
    if (!f || !*f)
        return DT_OK;
    int r, n;
    double ms, ppm = 0;
    char tail;
    n = sscanf(f, "%d:%lf:%lf%c", &r, &ms, &ppm, &tail);
    if ((n != 2 && n != 3) || r < 0 || !(fabs(ms) <= 1e6) || !(fabs(ppm) <= 1e5))
        return bad("DT_FAULT_CLOCK=%s: expected RANK:OFFSET_MS[:DRIFT_PPM] (|offset| <= 1e6 ms, "
                   "|drift| <= 1e5 ppm)",
                   f);
    if (r == t->rank)
        dt_trace_set_clock_fault((int64_t)(ms * 1e6), ppm);
    return DT_OK;
}

dt_status dt__trace_start(trainer *t) {
    const dt_train_config *c = t->c;
    run_trace *tr = &t->trace;
    tr->on = c->trace;
    if (!tr->on)
        return DT_OK;
    tr->first = c->trace_first > 0 ? c->trace_first : 1;
    tr->last = c->trace_last > 0 ? c->trace_last : c->steps;
    snprintf(tr->dir, sizeof tr->dir, "%s/trace", c->run_dir);
    DT_CHECK(clock_fault(t));
    DT_CHECK(dt_trace_configure(c->trace_buffer ? c->trace_buffer : 16384));
    dt_trace_reset();
    dt_trace_name_thread("main");
    if (t->world)
        DT_CHECK(dt_group_clock_sample(t->world, CLOCK_PROBES, &tr->c0));
    else
        tr->c0 = (dt_clock_sample){.local_ns = (double)dt_trace_now(), .same_kernel = true};
    /* Time 0 of every file: rank 0's clock now. */
    tr->origin = tr->c0.local_ns + tr->c0.offset_ns;
    if (t->world)
        DT_CHECK(dt_group_broadcast(t->world, &tr->origin, 1, DT_F64, 0));
    if (t->rank == 0) {
        DT_CHECK(dt_mkdir_p(tr->dir));
        fprintf(stderr,
                "trace:      steps %" PRId64 "..%" PRId64 " of every rank, %zu events per "
                "thread, into %s/\n",
                tr->first, tr->last, c->trace_buffer ? c->trace_buffer : (size_t)16384, tr->dir);
    }
    return DT_OK;
}

uint64_t dt__trace_step_begin(trainer *t) {
    run_trace *tr = &t->trace;
    if (tr->on && !tr->recording && t->step + 1 >= tr->first && t->step + 1 <= tr->last) {
        tr->recording = true;
        dt_trace_enable(true);
    }
    return dt_trace_begin();
}

void dt__trace_step_end(trainer *t, uint64_t t0) {
    run_trace *tr = &t->trace;
    dt_trace_end(t0, DT_TRACE_STEP, "step", (int32_t)t->step, 0, 0);
    if (tr->recording && t->step >= tr->last) {
        dt_trace_enable(false);
        tr->recording = false;
    }
}

/* ------------------------------------------------------------------------ */
/* Writing                                                                  */
/* ------------------------------------------------------------------------ */

/* A growing text buffer. */
typedef struct text {
    char *p;
    size_t len, cap;
    bool failed;
} text;

static void put(text *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(text *b, const char *fmt, ...) {
    if (b->failed)
        return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(b->p ? b->p + b->len : NULL, b->p ? b->cap - b->len : 0, fmt, ap);
        va_end(ap);
        if (n < 0) {
            b->failed = true;
            return;
        }
        if (b->p && b->len + (size_t)n < b->cap) {
            b->len += (size_t)n;
            return;
        }
        size_t cap = (b->cap ? b->cap * 2 : 1 << 16) + (size_t)n;
        char *np = realloc(b->p, cap);
        if (!np) {
            b->failed = true;
            return;
        }
        b->p = np;
        b->cap = cap;
    }
}

/* s as the inside of a JSON string (thread names: any bytes). */
static void put_escaped(text *b, const char *s) {
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\')
            put(b, "\\%c", ch);
        else if (ch < 0x20 || ch >= 0x7f)
            put(b, "\\u%04x", ch);
        else
            put(b, "%c", ch);
    }
}

/* The offset to rank 0's clock at local time x (see the file comment). */
typedef struct clock_map {
    double l0, o0, drift; /* offset(x) = o0 + drift (x - l0) */
    double span;          /* local time between the two samples (ns) */
    double origin;        /* rank 0's clock at time 0 */
    const char *method;   /* "reference", "same kernel", "store" */
} clock_map;

static clock_map make_map(const run_trace *tr, const dt_clock_sample *c1, int rank) {
    const dt_clock_sample *c0 = &tr->c0;
    clock_map m = {.l0 = c0->local_ns,
                   .span = c1->local_ns - c0->local_ns,
                   .origin = tr->origin,
                   .method = "store"};
    if (rank == 0) {
        m.method = "reference";
        return m;
    }
    if (c0->same_kernel && fabs(c0->offset_ns) <= c0->error_ns &&
        fabs(c1->offset_ns) <= c1->error_ns) {
        m.method = "same kernel";
        return m;
    }
    m.o0 = c0->offset_ns;
    m.span = c1->local_ns - c0->local_ns;
    m.drift = m.span > 1e6 ? (c1->offset_ns - c0->offset_ns) / m.span : 0;
    return m;
}

/* Microseconds since time 0 of local time x. */
static double aligned_us(const clock_map *m, double x) {
    return (x + m->o0 + m->drift * (x - m->l0) - m->origin) * 1e-3;
}

static void put_event(text *b, const dt_trace_event *e, int pid, int tid, const clock_map *m) {
    double ts = aligned_us(m, (double)e->t0), end = aligned_us(m, (double)e->t1);
    const char *cat = e->cat < DT_TRACE_CAT_COUNT ? dt_trace_cat_names[e->cat] : "other";
    put(b,
        "{\"name\":\"%s\",\"cat\":\"%s\",\"ph\":\"X\",\"ts\":%.3f,\"dur\":%.3f,\"pid\":%d,"
        "\"tid\":%d,\"args\":{",
        e->name ? e->name : "?", cat, ts, end - ts > 0 ? end - ts : 0, pid, tid);
    bool comm = e->cat == DT_TRACE_COMM || e->cat == DT_TRACE_WAIT;
    const char *sep = "";
    if (comm) {
        put(b,
            "\"bytes\":%" PRIu64 ",\"group\":\"%08x\",\"seq\":%u,\"ranks\":%u,\"algo\":\"%s\","
            "\"link\":\"%s\",\"dtype\":\"%s\"",
            e->bytes, e->group, e->seq, e->ranks, dt_algo_name((dt_algo)e->algo),
            e->link < DT_TRACE_LINK_COUNT ? dt_trace_link_names[e->link] : "?",
            dt_dtype_name((dt_dtype)e->dtype));
        if (e->peer >= 0)
            put(b, ",\"peer\":%d", e->peer);
        if (e->t_issue && e->t_issue <= e->t0)
            put(b, ",\"queued_us\":%.3f", (double)(e->t0 - e->t_issue) * 1e-3);
        if (e->idx >= 0)
            put(b, ",\"transfers\":%d", e->idx);
        sep = ",";
    } else {
        if (e->flops) {
            put(b, "\"flops\":%" PRIu64, e->flops);
            sep = ",";
        }
        if (e->bytes) {
            put(b, "%s\"bytes\":%" PRIu64, sep, e->bytes);
            sep = ",";
        }
        if (e->idx >= 0)
            put(b, "%s\"%s\":%d", sep,
                e->cat == DT_TRACE_STEP      ? "step"
                : e->cat == DT_TRACE_COMPUTE ? "layer"
                                             : "index",
                e->idx);
    }
    put(b, "}},\n");
}

/* This rank's events (metadata first), as lines "{...},\n". *dropped gets
 * the events the rings overwrote. */
static dt_status rank_events(const trainer *t, const clock_map *m, text *b, uint64_t *dropped) {
    dt_trace_thread th[MAX_THREADS];
    size_t n = dt_trace_threads(th, MAX_THREADS);
    if (n > MAX_THREADS)
        n = MAX_THREADS;
    int pid = t->rank;
    put(b,
        "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":0,\"args\":{\"name\":\"rank "
        "%d\"}},\n",
        pid, pid);
    put(b,
        "{\"name\":\"process_sort_index\",\"ph\":\"M\",\"pid\":%d,\"tid\":0,\"args\":{\"sort_"
        "index\":%d}},\n",
        pid, pid);
    *dropped = 0;
    for (size_t i = 0; i < n; i++) {
        put(b, "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":%d,\"args\":{\"name\":\"",
            pid, th[i].index);
        put_escaped(b, th[i].name);
        put(b, "\"}},\n");
        *dropped += th[i].dropped;
        dt_trace_event *ev;
        size_t k;
        DT_CHECK(dt_trace_copy(th[i].index, &ev, &k));
        for (size_t j = 0; j < k; j++)
            put_event(b, &ev[j], pid, th[i].index, m);
        free(ev);
    }
    return b->failed ? dt_error_set(DT_ERR_NOMEM, "trace: formatting rank %d's events", t->rank)
                     : DT_OK;
}

static void put_clock(text *b, int rank, const clock_map *m, const dt_clock_sample *c0,
                      const dt_clock_sample *c1, uint64_t dropped) {
    put(b,
        "{\"rank\":%d,\"method\":\"%s\",\"offset_ns\":%.1f,\"drift_ppm\":%.4f,\"error_ns\":%.1f,"
        "\"span_ns\":%.0f,\"start\":{\"offset_ns\":%.1f,\"error_ns\":%.1f},\"end\":{"
        "\"offset_ns\":%.1f,\"error_ns\":%.1f},\"dropped\":%" PRIu64 "}",
        rank, m->method, m->o0, m->drift * 1e6, fmax(c0->error_ns, c1->error_ns), m->span,
        c0->offset_ns, c0->error_ns, c1->offset_ns, c1->error_ns, dropped);
}

/* The document around lines of events (without the last line's comma: a
 * closing metadata event ends the array). */
static void put_head(text *b) { put(b, "{\"traceEvents\":[\n"); }

static void put_tail(text *b, const char *other) {
    put(b,
        "{\"name\":\"trace_end\",\"ph\":\"M\",\"pid\":0,\"tid\":0,\"args\":{}}\n],\n"
        "\"displayTimeUnit\":\"ms\",\n\"otherData\":%s}\n",
        other);
}

/* Write `parts` to path through a temporary file and a rename. */
static dt_status write_file(const char *path, const dt_file_part *parts, int n) {
    return dt_file_write_atomic(path, parts, n);
}

/* RUN_DIR/trace/machine.json: the roofs of the report (rank 0). */
static dt_status write_machine(const trainer *t) {
    char cpu[256], from[4400] = "", path[4400];
    dt__cpu_model(cpu, sizeof cpu);
    double bw = NAN;
    if (dt_profile_mem_bw(t->threads, &bw, from, sizeof from) != DT_OK) {
        bw = NAN;
        snprintf(from, sizeof from, "unknown: %s", dt_last_error());
    }
    text b = {0};
    put(&b, "{\"version\":1,\"cpu\":\"");
    put_escaped(&b, cpu);
    put(&b, "\",\"isa\":\"%s\",\"threads\":%d,\"ranks\":%d,\"precision\":\"%s\",",
        dt_isa_name(dt_isa()), t->threads, t->size, dt_precision_name(t->c->precision));
    put(&b, "\"peak_flops\":{\"%s\":%.6g},\"peak_from\":\"", dt_precision_name(t->c->precision),
        isfinite(t->peak_flops) ? t->peak_flops : 0.0);
    put_escaped(&b, t->peak_from);
    put(&b, "\",\"mem_bw\":%.6g,\"mem_bw_from\":\"", isfinite(bw) ? bw : 0.0);
    put_escaped(&b, from);
    put(&b, "\",\"links\":[");
    dt_link_fit fits[64];
    size_t n = 0;
    if (dt_profile_links(fits, 64, &n) != DT_OK)
        n = 0;
    for (size_t i = 0; i < n && i < 64; i++)
        put(&b,
            "%s\n  {\"transport\":\"%s\",\"op\":\"%s\",\"ranks\":%d,\"alpha_s\":%.6g,"
            "\"beta_Bps\":%.6g,\"link_alpha_s\":%.6g,\"link_bw_Bps\":%.6g,\"points\":%d,"
            "\"max_error\":%.4g,\"lo\":%.0f,\"hi\":%.0f}",
            i ? "," : "", fits[i].transport, fits[i].op, fits[i].ranks, fits[i].alpha,
            isfinite(fits[i].beta) ? fits[i].beta : 0.0, fits[i].link_alpha,
            isfinite(fits[i].link_bw) ? fits[i].link_bw : 0.0, fits[i].points, fits[i].max_error,
            fits[i].lo, fits[i].hi);
    put(&b, "]}\n");
    dt_status st = b.failed ? dt_error_set(DT_ERR_NOMEM, "trace: machine.json") : DT_OK;
    snprintf(path, sizeof path, "%s/machine.json", t->trace.dir);
    if (st == DT_OK)
        st = write_file(path, &(dt_file_part){b.p, b.len}, 1);
    free(b.p);
    return st;
}

dt_status dt__trace_finish(trainer *t) {
    run_trace *tr = &t->trace;
    if (!tr->on)
        return DT_OK;
    dt_trace_enable(false);
    tr->recording = false;
    dt_clock_sample c1 = {.local_ns = (double)dt_trace_now(), .same_kernel = true};
    if (t->world)
        DT_CHECK(dt_group_clock_sample(t->world, CLOCK_PROBES, &c1));
    clock_map m = make_map(tr, &c1, t->rank);
    text ev = {0};
    uint64_t dropped = 0;
    dt_status st = rank_events(t, &m, &ev, &dropped);
    /* This rank's own file. */
    char path[4400];
    snprintf(path, sizeof path, "%s/rank-%d.json", tr->dir, t->rank);
    if (st == DT_OK && t->rank != 0)
        st = dt_mkdir_p(tr->dir);
    if (st == DT_OK) {
        text head = {0}, tail = {0}, other = {0};
        put_head(&head);
        put(&other, "{\"version\":1,\"rank\":%d,\"world\":%d,\"clocks\":[", t->rank, t->size);
        put_clock(&other, t->rank, &m, &tr->c0, &c1, dropped);
        put(&other, "]}");
        put_tail(&tail, other.p ? other.p : "{}");
        st = head.failed || tail.failed || other.failed
                 ? dt_error_set(DT_ERR_NOMEM, "trace: formatting")
                 : write_file(
                       path,
                       (dt_file_part[]){{head.p, head.len}, {ev.p, ev.len}, {tail.p, tail.len}}, 3);
        free(head.p);
        free(tail.p);
        free(other.p);
    }
    /* Every rank's status first: nobody waits for events that will not come. */
    if (t->world) {
        int64_t ok = st == DT_OK ? 0 : 1;
        dt_status cst = dt_group_allreduce(t->world, &ok, &ok, 1, DT_I64, DT_SUM);
        if (cst != DT_OK) {
            free(ev.p);
            return cst;
        }
        if (ok && st == DT_OK)
            st = dt_error_set(DT_ERR_IO, "trace: another rank could not write its trace file");
    }
    if (st != DT_OK) {
        free(ev.p);
        return st;
    }
    /* The merged file: rank 0 receives every rank's lines and clock. */
    enum { CLOCK_FIELDS = 9 };
    double mine[CLOCK_FIELDS] = {m.o0,
                                 m.drift,
                                 tr->c0.offset_ns,
                                 tr->c0.error_ns,
                                 c1.offset_ns,
                                 c1.error_ns,
                                 (double)dropped,
                                 (double)(strcmp(m.method, "store") == 0         ? 2
                                          : strcmp(m.method, "same kernel") == 0 ? 1
                                                                                 : 0),
                                 m.span};
    double *clocks = t->rank == 0 ? calloc((size_t)t->size * CLOCK_FIELDS, sizeof *clocks) : NULL;
    int64_t len = (int64_t)ev.len,
            *lens = t->rank == 0 ? calloc((size_t)t->size, sizeof *lens) : NULL;
    if (t->rank == 0 && (!clocks || !lens))
        st = dt_error_set(DT_ERR_NOMEM, "trace: merging");
    if (t->world) {
        dt_status cst = dt_group_gather(t->world, mine, clocks, CLOCK_FIELDS, DT_F64, 0);
        if (cst == DT_OK)
            cst = dt_group_gather(t->world, &len, lens, 1, DT_I64, 0);
        if (cst == DT_OK && t->rank != 0)
            cst = dt_group_send(t->world, ev.p ? ev.p : "", (size_t)len, DT_U8, 0, TAG_TRACE);
        if (cst != DT_OK) {
            free(ev.p);
            free(clocks);
            free(lens);
            return cst;
        }
    } else if (clocks && lens) {
        memcpy(clocks, mine, sizeof mine);
        lens[0] = len;
    }
    if (t->rank == 0) {
        char tmp[4500];
        snprintf(path, sizeof path, "%s/trace.json", tr->dir);
        snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
        FILE *f = st == DT_OK ? fopen(tmp, "w") : NULL;
        if (st == DT_OK && !f)
            st = dt_error_set_errno(DT_ERR_IO, "cannot write %s", tmp);
        text head = {0};
        put_head(&head);
        if (f)
            fwrite(head.p, 1, head.len, f);
        free(head.p);
        if (f)
            fwrite(ev.p, 1, ev.len, f);
        char *buf = NULL;
        for (int r = 1; r < t->size; r++) {
            /* Received even after a local failure: every sender waits for it. */
            char *nb = realloc(buf, (size_t)lens[r] + 1);
            if (!nb) {
                st = dt_error_set(DT_ERR_NOMEM, "trace: %" PRId64 " bytes of rank %d", lens[r], r);
                break;
            }
            buf = nb;
            dt_status rst = dt_group_recv(t->world, buf, (size_t)lens[r], DT_U8, r, TAG_TRACE);
            if (rst != DT_OK) {
                st = rst;
                break;
            }
            if (f)
                fwrite(buf, 1, (size_t)lens[r], f);
        }
        free(buf);
        text other = {0};
        put(&other, "{\"version\":1,\"world\":%d,\"clocks\":[", t->size);
        for (int r = 0; r < t->size; r++) {
            const double *c = clocks + (size_t)r * CLOCK_FIELDS;
            clock_map mr = {.o0 = c[0],
                            .drift = c[1],
                            .span = c[8],
                            .method = c[7] == 2   ? "store"
                                      : c[7] == 1 ? "same kernel"
                                                  : "reference"};
            dt_clock_sample s0 = {.offset_ns = c[2], .error_ns = c[3]},
                            s1 = {.offset_ns = c[4], .error_ns = c[5]};
            if (r)
                put(&other, ",");
            put_clock(&other, r, &mr, &s0, &s1, (uint64_t)c[6]);
        }
        put(&other, "]}");
        text tail = {0};
        put_tail(&tail, other.p ? other.p : "{}");
        if (f) {
            fwrite(tail.p, 1, tail.len, f);
            bool bad_write = ferror(f) != 0;
            if (fflush(f) != 0 || fsync(fileno(f)) != 0)
                bad_write = true;
            if (fclose(f) != 0)
                bad_write = true;
            if (st == DT_OK && bad_write)
                st = dt_error_set_errno(DT_ERR_IO, "cannot write %s", tmp);
            if (st == DT_OK && rename(tmp, path) != 0)
                st = dt_error_set_errno(DT_ERR_IO, "cannot rename %s to %s", tmp, path);
            if (st != DT_OK)
                unlink(tmp);
        }
        free(tail.p);
        free(other.p);
        if (st == DT_OK)
            st = write_machine(t);
    }
    free(ev.p);
    free(clocks);
    free(lens);
    dt_trace_reset(); /* nothing records any more (rule 3 of trace.h) */
    return st;
}
