/*
 * search.c — every layout of a device count, predicted and ranked
 * (plan.h). The enumeration is the product of the choices below, each
 * restricted by the request's fixed values; a layout that cannot run is
 * counted under the kind of its reason (the first one's text kept), so
 * `dtrain plan` can say why nothing bigger fits.
 */
#include "dtrain/plan.h"

#include <stdlib.h>
#include <string.h>

dt_plan_request dt_plan_request_default(void) {
    return (dt_plan_request){.precision = DT_PRECISION_BF16,
                             .zero = -1,
                             .recompute = -1,
                             .pp_kind = -1,
                             .optimizer = DT_OPTIM_ADAMW};
}

dt_status dt_plan_request_validate(const dt_plan_request *rq, const dt_cluster *cl) {
    DT_CHECK(dt_gpt_config_validate(&rq->model));
    if (rq->devices < 1)
        return dt_error_set(DT_ERR_INVALID, "--devices %d: expected >= 1", rq->devices);
    if (rq->global_batch < 1)
        return dt_error_set(DT_ERR_INVALID, "--global-batch %d: expected >= 1", rq->global_batch);
    if (cl->nodes > 0 && rq->devices > (long)cl->nodes * cl->devices_per_node &&
        !cl->shared_compute)
        return dt_error_set(DT_ERR_INVALID,
                            "--devices %d: the cluster %s has %d node(s) of %d devices",
                            rq->devices, cl->name, cl->nodes, cl->devices_per_node);
    if (!rq->any_precision && cl->peak[rq->precision] <= 0)
        return dt_error_set(DT_ERR_INVALID, "--precision %s: the cluster %s gives no peak for it",
                            dt_precision_name(rq->precision), cl->name);
    static const char *const names[] = {"--dp", "--tp", "--pp", "--cp"};
    const int fixed[] = {rq->dp, rq->tp, rq->pp, rq->cp};
    for (int i = 0; i < 4; i++)
        if (fixed[i] && rq->devices % fixed[i])
            return dt_error_set(DT_ERR_INVALID, "%s %d does not divide --devices %d", names[i],
                                fixed[i], rq->devices);
    return DT_OK;
}

/* The kind of a reason: its text up to the first digit, so that "needs 81
 * GiB" and "needs 90 GiB" count together. */
static size_t kind_len(const char *r) {
    size_t n = strcspn(r, "0123456789");
    return n > 24 ? 24 : n;
}

typedef struct acc {
    dt_plan_result *res;
    size_t cap, pcap;
} acc;

static dt_status prune(acc *a, const dt_plan_layout *l, const char *why) {
    dt_plan_result *r = a->res;
    size_t k = kind_len(why);
    for (size_t i = 0; i < r->npruned; i++)
        if (kind_len(r->pruned[i].reason) == k && !strncmp(r->pruned[i].reason, why, k)) {
            r->pruned[i].count++;
            return DT_OK;
        }
    if (r->npruned == a->pcap) {
        size_t cap = a->pcap ? 2 * a->pcap : 16;
        dt_plan_pruned *p = realloc(r->pruned, cap * sizeof *p);
        if (!p)
            return DT_ERR_NOMEM;
        r->pruned = p;
        a->pcap = cap;
    }
    dt_plan_pruned *p = &r->pruned[r->npruned++];
    snprintf(p->reason, sizeof p->reason, "%s", why);
    p->count = 1;
    p->example = *l;
    return DT_OK;
}

static dt_status keep(acc *a, const dt_plan_candidate *c) {
    dt_plan_result *r = a->res;
    if (r->n == a->cap) {
        size_t cap = a->cap ? 2 * a->cap : 256;
        dt_plan_candidate *p = realloc(r->ranked, cap * sizeof *p);
        if (!p)
            return DT_ERR_NOMEM;
        r->ranked = p;
        a->cap = cap;
    }
    r->ranked[r->n++] = *c;
    return DT_OK;
}

/* Phase 1: the estimate of every layout (kept in res->ranked). */
static dt_status try_layout(acc *a, const dt_plan_request *rq, const dt_cluster *cl,
                            const dt_plan_layout *l) {
    dt_plan_candidate c;
    dt_status st = dt_plan_estimate(rq, cl, l, &c);
    if (st == DT_OK)
        return keep(a, &c);
    if (st != DT_ERR_INVALID && st != DT_ERR_NOMEM && st != DT_ERR_UNSUPPORTED)
        return st;
    return prune(a, l, dt_last_error());
}

static int by_step(const void *x, const void *y) {
    const dt_plan_candidate *a = x, *b = y;
    return a->step_s < b->step_s ? -1 : a->step_s > b->step_s;
}

/* Among layouts predicted within PLAN_TIE of the fastest of their group
 * (closer than the model can tell apart), what the model does not price
 * decides: fewer micro-batches first (each pass has a fixed cost, and small
 * products run below the fitted efficiency), then the lower ZeRO stage
 * (fewer collectives, whose overlap the model takes as free), then less
 * memory, then the degrees, so that equal predictions always come out in
 * one order. */
#define PLAN_TIE 0.01
static int by_preference(const void *x, const void *y) {
    const dt_plan_candidate *a = x, *b = y;
    const dt_plan_layout *p = &a->layout, *q = &b->layout;
    double keys[][2] = {
        {p->micro, q->micro},
        {p->zero, q->zero},
        {a->memory, b->memory},
        {p->tp, q->tp},
        {p->pp, q->pp},
        {p->cp, q->cp},
        {p->chunks, q->chunks},
        {p->schedule, q->schedule},
        {p->recompute_every, q->recompute_every},
        {p->cp_mode, q->cp_mode},
        {p->precision, q->precision},
        {a->step_s, b->step_s},
    };
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
        if (keys[i][0] != keys[i][1])
            return keys[i][0] < keys[i][1] ? -1 : 1;
    return 0;
}

/* Fastest first, ties (above) broken by preference. */
static void rank_candidates(dt_plan_candidate *c, size_t n) {
    if (n == 0) /* qsort's array may not be NULL, even when empty */
        return;
    qsort(c, n, sizeof *c, by_step);
    for (size_t i = 0, j; i < n; i = j) {
        for (j = i + 1; j < n && c[j].step_s <= c[i].step_s * (1 + PLAN_TIE); j++)
            ;
        qsort(c + i, j - i, sizeof *c, by_preference);
    }
}

static int by_count(const void *x, const void *y) {
    const dt_plan_pruned *a = x, *b = y;
    return a->count > b->count ? -1 : a->count < b->count;
}

/* Pipeline schedules tried: 1F1B, interleaved with 2 and 4 chunks and
 * zero-bubble (GPipe is never faster than 1F1B and holds more). */
typedef struct sched {
    dt_pp_kind kind;
    int chunks;
} sched;
static const sched scheds[] = {
    {DT_PP_1F1B, 1}, {DT_PP_INTERLEAVED, 2}, {DT_PP_INTERLEAVED, 4}, {DT_PP_ZB, 1}};

dt_status dt_plan_search(const dt_plan_request *rq, const dt_cluster *cl, dt_plan_result *out) {
    memset(out, 0, sizeof *out);
    DT_CHECK(dt_plan_request_validate(rq, cl));
    double t0 = dt_now();
    acc a = {.res = out};
    const int N = rq->devices, L = rq->model.layers;
    dt_status st = DT_OK;
    for (int tp = 1; tp <= N && st == DT_OK; tp++) {
        if (N % tp || (rq->tp && tp != rq->tp))
            continue;
        if (!cl->shared_compute && tp > cl->devices_per_node) {
            dt_plan_layout l = {.dp = N / tp, .tp = tp, .pp = 1, .cp = 1};
            st = prune(&a, &l, "tp group would span nodes (tensor parallelism stays in a node)");
            continue;
        }
        for (int cp = 1; cp <= N / tp && st == DT_OK; cp++) {
            if ((N / tp) % cp ||
                (rq->cp ? cp != rq->cp : cp > 1 && rq->model.max_seq < 4096 && !cl->shared_compute))
                continue; /* context parallelism only for long sequences, unless asked */
            for (int pp = 1; pp <= N / tp / cp && st == DT_OK; pp++) {
                if ((N / tp / cp) % pp || (rq->pp && pp != rq->pp))
                    continue;
                int dp = N / tp / cp / pp;
                if (rq->dp && dp != rq->dp)
                    continue;
                dt_plan_layout l = {.dp = dp,
                                    .tp = tp,
                                    .pp = pp,
                                    .cp = cp,
                                    .chunks = 1,
                                    .schedule = DT_PP_1F1B,
                                    .sp = false};
                l.cp_mode = (rq->model.heads / tp) % cp == 0 && rq->model.max_seq % cp == 0
                                ? DT_CP_ULYSSES
                                : DT_CP_RING;
                if (pp > L) {
                    st = prune(&a, &l, "more pipeline stages than layers");
                    continue;
                }
                if (rq->global_batch % dp) {
                    st = prune(&a, &l, "global batch not divisible by dp");
                    continue;
                }
                int per = rq->global_batch / dp;
                for (int mb = 1; mb <= per && mb <= 64 && st == DT_OK; mb *= 2) {
                    if (per % mb || (rq->micro_batch && mb != rq->micro_batch))
                        continue;
                    l.micro_batch = mb;
                    l.micro = per / mb;
                    for (size_t si = 0; si < (pp > 1 ? 4 : 1) && st == DT_OK; si++) {
                        l.schedule = scheds[si].kind;
                        l.chunks = pp > 1 ? scheds[si].chunks : 1;
                        if (pp > 1 && rq->pp_kind >= 0 && (int)l.schedule != rq->pp_kind)
                            continue;
                        if (pp > 1 && rq->chunks && l.chunks != rq->chunks)
                            continue;
                        if (l.chunks > 1 && (l.micro % pp || pp * l.chunks > L)) {
                            st = prune(&a, &l,
                                       "interleaving needs micro-batches a multiple of "
                                       "pp and a layer per virtual stage");
                            continue;
                        }
                        for (int z = 0; z <= 3 && st == DT_OK; z++) {
                            if ((rq->zero >= 0 && z != rq->zero) || (z && dp * cp == 1))
                                continue;
                            l.zero = z;
                            for (int rc = 0; rc <= 1 && st == DT_OK; rc++) {
                                if (rq->recompute >= 0 && rc != (rq->recompute > 0))
                                    continue;
                                l.recompute_every =
                                    rc ? (rq->recompute > 0 ? rq->recompute : 1) : 0;
                                for (int p = 0; p < DT_PRECISION_COUNT && st == DT_OK; p++) {
                                    if (rq->any_precision ? cl->peak[p] <= 0
                                                          : p != (int)rq->precision)
                                        continue;
                                    l.precision = (dt_precision)p;
                                    st = try_layout(&a, rq, cl, &l);
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    if (st != DT_OK) {
        dt_plan_result_free(out);
        return st;
    }
    /* Phase 2: in the order of the estimates, the exact evaluation (the
     * trainer's memory plan, the simulated schedule), until rq->keep fit. */
    rank_candidates(out->ranked, out->n);
    size_t estimated = out->n, fit = 0, i = 0;
    for (; i < estimated && (!rq->keep || fit < (size_t)rq->keep) && st == DT_OK; i++) {
        dt_plan_candidate c;
        dt_plan_layout l = out->ranked[i].layout;
        st = dt_plan_evaluate(rq, cl, &l, &c);
        if (st == DT_OK)
            out->ranked[fit++] = c;
        else if (st == DT_ERR_INVALID || st == DT_ERR_NOMEM || st == DT_ERR_UNSUPPORTED)
            st = prune(&a, &l, dt_last_error());
    }
    for (size_t j = i; j < estimated && st == DT_OK; j++)
        st = prune(&a, &out->ranked[j].layout,
                   "not evaluated: estimated slower than the fitting layouts kept (--keep)");
    if (st != DT_OK) {
        dt_plan_result_free(out);
        return st;
    }
    out->n = fit;
    out->seconds = dt_now() - t0;
    /* Layouts refused before a prediction count as considered too. */
    out->considered = out->n;
    for (size_t k = 0; k < out->npruned; k++)
        out->considered += out->pruned[k].count;
    rank_candidates(out->ranked, out->n);
    if (out->npruned)
        qsort(out->pruned, out->npruned, sizeof *out->pruned, by_count);
    return DT_OK;
}

void dt_plan_result_free(dt_plan_result *r) {
    if (!r)
        return;
    free(r->ranked);
    free(r->pruned);
    memset(r, 0, sizeof *r);
}
