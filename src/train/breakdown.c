/*
 * breakdown.c — where every rank's step time went (train.h,
 * dt_step_breakdown; docs/observability.md, "Step breakdown"), gathered on
 * rank 0 for metrics.jsonl, the summary and RUN_DIR/summary.json.
 *
 * Each rank measures its own step: reading the batches, forward and
 * backward, the communication it waited for, the optimizer, and the rest
 * (idle). A rank that finishes its work before a slower one waits for it
 * inside the next collective, which its own clock shows as exposed
 * communication: rank 0 moves that part, up to the difference between the
 * slowest rank's work (compute + data) and this rank's, from exposed
 * communication to idle. What is left exposed is the communication itself.
 *
 * Invariants: the gather runs on the world group on the steps where the
 * replicas meet anyway (every step of DDP, ZeRO, a pipeline; the averaging
 * steps of local SGD and gossip), in the same order on every rank; the
 * arrays are allocated once before the loop.
 */
#include "train_internal.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FIELDS DT_BREAKDOWN_FIELDS

static void to_array(const dt_step_breakdown *b, double *v) {
    v[0] = b->compute;
    v[1] = b->exposed_comm;
    v[2] = b->overlapped_comm;
    v[3] = b->data;
    v[4] = b->optimizer;
    v[5] = b->idle;
    v[6] = b->step;
}

static void from_array(const double *v, dt_step_breakdown *b) {
    *b = (dt_step_breakdown){.compute = v[0],
                             .exposed_comm = v[1],
                             .overlapped_comm = v[2],
                             .data = v[3],
                             .optimizer = v[4],
                             .idle = v[5],
                             .step = v[6]};
}

dt_status dt__breakdown_init(trainer *t) {
    size_t n = (size_t)t->size;
    t->bd = dt_calloc(n, sizeof *t->bd);
    t->bd_sum = dt_calloc(n, sizeof *t->bd_sum);
    t->rss = dt_calloc(2 * n, sizeof *t->rss);
    t->bd_gather = dt_calloc(n * FIELDS, sizeof *t->bd_gather);
    if (!t->bd || !t->bd_sum || !t->rss || !t->bd_gather)
        return dt_error_set(DT_ERR_NOMEM, "step breakdown of %d ranks", t->size);
    t->bd_steps = 0;
    return DT_OK;
}

/* Waiting for a slower rank, moved from exposed communication to idle. */
static void attribute_waits(dt_step_breakdown *b, int n) {
    double slowest = 0;
    for (int r = 0; r < n; r++)
        slowest = fmax(slowest, b[r].compute + b[r].data);
    for (int r = 0; r < n; r++) {
        double wait = fmin(b[r].exposed_comm, slowest - (b[r].compute + b[r].data));
        if (wait > 0) {
            b[r].exposed_comm -= wait;
            b[r].idle += wait;
        }
    }
}

dt_status dt__breakdown_exchange(trainer *t, const dt_step_breakdown *mine, bool meet, bool count,
                                 int *nranks) {
    int n = 1;
    if (t->world && meet) {
        double v[FIELDS], *all = t->rank == 0 ? t->bd_gather : NULL;
        to_array(mine, v);
        DT_CHECK(dt_group_gather(t->world, v, all, FIELDS, DT_F64, 0));
        if (t->rank == 0)
            for (int r = 0; r < t->size; r++)
                from_array(all + (size_t)r * FIELDS, &t->bd[r]);
        n = t->size;
    } else if (t->rank == 0) {
        t->bd[0] = *mine;
    }
    if (t->rank != 0) {
        *nranks = 0;
        return DT_OK;
    }
    if (n > 1)
        attribute_waits(t->bd, n);
    /* The means count the steps where every rank's figures arrived. */
    if (count && n == t->size) {
        if (t->bd_steps == 0)
            t->bd_first = t->step;
        for (int r = 0; r < n; r++) {
            double a[FIELDS], s[FIELDS];
            to_array(&t->bd[r], a);
            to_array(&t->bd_sum[r], s);
            for (int k = 0; k < FIELDS; k++)
                s[k] += a[k];
            from_array(s, &t->bd_sum[r]);
        }
        t->bd_steps++;
    }
    *nranks = n;
    return DT_OK;
}

dt_status dt__breakdown_collect(trainer *t) {
    uint64_t now = 0, peak = 0;
    double mine[2] = {NAN, (double)t->rss_base};
    if (dt_mem_resident(&now, &peak))
        mine[0] = (double)peak;
    if (!t->world) {
        memcpy(t->rss, mine, sizeof mine);
        return DT_OK;
    }
    return dt_group_gather(t->world, mine, t->rank == 0 ? t->rss : NULL, 2, DT_F64, 0);
}

void dt__breakdown_print(const trainer *t, FILE *f) {
    if (t->bd_steps == 0)
        return;
    double k = 1.0 / (double)t->bd_steps;
    fprintf(f, "time/step:  ms, mean of %lld step(s) from step %lld (dtrain report draws it)\n",
            (long long)t->bd_steps, (long long)t->bd_first);
    fprintf(f, "  %5s %10s %10s %10s %8s %10s %9s %10s\n", "rank", "compute", "exposed", "hidden",
            "data", "optimizer", "idle", "step");
    int shown = t->size <= 8 ? t->size : 8;
    for (int r = 0; r < shown; r++) {
        const dt_step_breakdown *b = &t->bd_sum[r];
        fprintf(f, "  %5d %10.1f %10.1f %10.1f %8.2f %10.1f %9.1f %10.1f\n", r, b->compute * k,
                b->exposed_comm * k, b->overlapped_comm * k, b->data * k, b->optimizer * k,
                b->idle * k, b->step * k);
    }
    if (shown < t->size)
        fprintf(f, "  ... %d more rank(s) in summary.json\n", t->size - shown);
}

/* A real, or null when not finite. */
static json_t *num(double v) { return isfinite(v) ? json_real(v) : json_null(); }

/* A string (not UTF-8: null). */
static json_t *text_or_null(const char *s) {
    json_t *v = json_string(s);
    return v ? v : json_null();
}

dt_status dt__train_write_summary(const trainer *t, const dt_train_result *res, double mfu) {
    const dt_train_config *c = t->c;
    if (t->rank != 0 || !c->run_dir)
        return DT_OK;
    json_t *o = json_object(), *bd = json_object(), *mem = json_object();
    bool ok = o && bd && mem;
    double k = t->bd_steps ? 1.0 / (double)t->bd_steps : NAN;
    for (int f = 0; ok && f < FIELDS; f++) {
        json_t *a = json_array();
        ok = a != NULL;
        for (int r = 0; ok && r < t->size; r++) {
            double v[FIELDS];
            to_array(&t->bd_sum[r], v);
            ok = json_array_append_new(a, num(v[f] * k)) == 0;
        }
        ok = ok && json_object_set_new(bd, dt_breakdown_names[f], a) == 0;
    }
    ok = ok && json_object_set_new(bd, "steps", json_integer(t->bd_steps)) == 0 &&
         json_object_set_new(bd, "first_step", json_integer(t->bd_first)) == 0;
    json_t *peak = json_array(), *base = json_array();
    ok = ok && peak && base;
    for (int r = 0; ok && r < t->size; r++)
        ok = json_array_append_new(peak, num(t->rss[2 * r])) == 0 &&
             json_array_append_new(base, num(t->rss[2 * r + 1])) == 0;
    const dt_rank_memory *p = &t->plan;
    ok = ok &&
         json_object_set_new(
             mem, "planned",
             json_pack("{s:I, s:I, s:I, s:I, s:I, s:I}", "params", (json_int_t)p->params, "grads",
                       (json_int_t)p->grads, "weights16", (json_int_t)p->weights16, "optimizer",
                       (json_int_t)p->optimizer, "activations", (json_int_t)p->activations, "total",
                       (json_int_t)p->total)) == 0 &&
         json_object_set_new(mem, "peak_resident", peak) == 0 &&
         json_object_set_new(mem, "base_resident", base) == 0;
    if (!ok) {
        json_decref(peak);
        json_decref(base);
    }
    ok = ok && json_object_set_new(o, "version", json_integer(1)) == 0 &&
         json_object_set_new(o, "world", json_integer(t->size)) == 0 &&
         json_object_set_new(o, "first_step", json_integer(res->first_step)) == 0 &&
         json_object_set_new(o, "last_step", json_integer(res->last_step)) == 0 &&
         json_object_set_new(o, "seconds", num(res->seconds)) == 0 &&
         json_object_set_new(o, "first_loss", num(res->first_loss)) == 0 &&
         json_object_set_new(o, "last_loss", num(res->last_loss)) == 0 &&
         json_object_set_new(o, "val_loss", num(res->val_loss)) == 0 &&
         json_object_set_new(o, "tokens_per_s", num(res->tokens_per_s)) == 0 &&
         json_object_set_new(o, "mfu", num(mfu)) == 0 &&
         json_object_set_new(o, "comm_ms", num(res->comm_ms)) == 0 &&
         json_object_set_new(o, "exposed_comm_ms", num(res->exposed_comm_ms)) == 0 &&
         json_object_set_new(o, "pp_bubble", num(res->pp_bubble)) == 0 &&
         json_object_set_new(o, "peak_flops", num(t->peak_flops)) == 0 &&
         json_object_set_new(o, "peak_from", text_or_null(t->peak_from)) == 0 &&
         json_object_set_new(o, "precision", json_string(dt_precision_name(c->precision))) == 0 &&
         json_object_set_new(o, "trace",
                             t->trace.on ? json_string("trace/trace.json") : json_null()) == 0 &&
         json_object_set_new(o, "breakdown", bd) == 0;
    if (ok)
        bd = NULL;
    ok = ok && json_object_set_new(o, "memory", mem) == 0;
    if (ok)
        mem = NULL;
    char *text = ok ? json_dumps(o, JSON_INDENT(1) | JSON_REAL_PRECISION(9)) : NULL;
    json_decref(o);
    json_decref(bd);
    json_decref(mem);
    if (!text)
        return dt_error_set(DT_ERR_NOMEM, "summary.json");
    char path[4200];
    snprintf(path, sizeof path, "%s/summary.json", c->run_dir);
    dt_status st = dt_file_write_atomic(path, &(dt_file_part){text, strlen(text)}, 1);
    free(text);
    return st;
}
