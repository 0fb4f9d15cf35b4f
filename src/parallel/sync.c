/*
 * sync.c — the public face of dt_grad_sync: each call goes through the
 * strategy's table (sync_internal.h). Nothing here knows a strategy.
 */
#include "dtrain/optim.h"
#include "sync_internal.h"

#include <math.h>
#include <string.h>

dt_status dt_grad_sync_begin_step(dt_grad_sync *s, const dt_sync_step *step) {
    return s->ops->begin_step(s, step);
}
dt_grad_mode dt_grad_sync_begin_backward(dt_grad_sync *s, bool last_microbatch) {
    return s->ops->begin_backward(s, last_microbatch);
}
void dt_grad_sync_ready(void *s, size_t ready_from) {
    dt_grad_sync *g = s;
    g->ops->ready(g, ready_from);
}
dt_status dt_grad_sync_finish(dt_grad_sync *s, dt_sync_result *out) {
    memset(out, 0, sizeof *out);
    out->consensus = NAN; /* measured by the strategies that mix parameters */
    out->staleness = -1;  /* the parameter server's */
    return s->ops->finish(s, out);
}
dt_status dt_grad_sync_apply(dt_grad_sync *s, bool skip, float clip_scale) {
    return s->ops->apply(s, skip, clip_scale);
}
void dt_grad_sync_apply_report(dt_grad_sync *s, dt_sync_result *out) {
    if (s->ops->apply_report)
        s->ops->apply_report(s, out);
}
bool dt_grad_sync_agrees(const dt_grad_sync *s, int64_t step) {
    return s->ops->agrees ? s->ops->agrees(s, step) : true;
}
dt_status dt_grad_sync_replicate(dt_grad_sync *s) { return s->ops->replicate(s); }
dt_status dt_grad_sync_check(dt_grad_sync *s, int64_t step) { return s->ops->check(s, step); }
const char *dt_grad_sync_name(const dt_grad_sync *s) { return s->ops->name; }
void dt_grad_sync_cost(const dt_grad_sync *s, dt_sync_cost *out) {
    memset(out, 0, sizeof *out);
    s->ops->cost(s, out);
}
void dt_grad_sync_layout(const dt_grad_sync *s, dt_sync_layout *out) {
    memset(out, 0, sizeof *out);
    s->ops->layout(s, out);
}
void dt_grad_sync_reset_state(dt_grad_sync *s) { s->ops->reset_state(s); }
size_t dt_grad_sync_state_bytes(const dt_grad_sync *s) { return s->ops->state_bytes(s); }
const char *dt_grad_sync_state_ident(const dt_grad_sync *s) { return s->ops->state_ident(s); }
dt_status dt_grad_sync_get_state(const dt_grad_sync *s, void *buf, size_t len, float *unit) {
    return s->ops->get_state(s, buf, len, unit);
}
dt_status dt_grad_sync_set_state(dt_grad_sync *s, const void *buf, size_t len, float unit) {
    return s->ops->set_state(s, buf, len, unit);
}
void dt_grad_sync_destroy(dt_grad_sync *s) {
    if (s)
        s->ops->destroy(s);
}

const dt_param_hooks *dt_grad_sync_param_hooks(const dt_grad_sync *s) {
    return s->ops->param_hooks ? s->ops->param_hooks(s) : NULL;
}
dt_status dt_grad_sync_gather_params(dt_grad_sync *s, bool whole) {
    return s->ops->gather_params ? s->ops->gather_params(s, whole) : DT_OK;
}
dt_status dt_grad_sync_hold_params(dt_grad_sync *s, bool hold, bool written) {
    return s->ops->hold_params ? s->ops->hold_params(s, hold, written) : DT_OK;
}

dt_status dt__norm_ranges_init(dt__norm_ranges *out, const dt_range *ranges, size_t n,
                               size_t floats) {
    out->n = ranges ? n : 1;
    out->r = dt_calloc(out->n ? out->n : 1, sizeof *out->r);
    if (!out->r)
        return DT_ERR_NOMEM;
    if (ranges)
        memcpy(out->r, ranges, out->n * sizeof *out->r);
    else
        out->r[0] = (dt_range){0, floats};
    return DT_OK;
}

void dt__norm_ranges_free(dt__norm_ranges *nr) { dt_free(nr->r); }

double dt__norm_ranges_sumsq(const dt__norm_ranges *nr, const float *grads, size_t begin,
                             size_t end) {
    double sum = 0;
    for (size_t i = 0; i < nr->n; i++) {
        size_t lo = nr->r[i].begin > begin ? nr->r[i].begin : begin;
        size_t hi = nr->r[i].end < end ? nr->r[i].end : end;
        if (lo < hi)
            sum += dt_grad_sumsq(grads + lo, hi - lo);
    }
    return sum;
}

void dt_strategy_cost_add(dt_strategy_cost *out, dt_comm_cost c) {
    if (out->n < DT_COST_MAX)
        out->item[out->n++] = c;
}

/* The gradient synchronisation a ZeRO stage selects: the trainer's setup
 * makes the same choice (DDP without ZeRO, zero_sync for stages 1-3). */
typedef void (*plan_cost_fn)(const dt_cost_query *q, dt_strategy_cost *out);
static const plan_cost_fn grad_sync_plan_costs[4] = {
    dt_ddp_sync_plan_cost, dt_zero_sync_plan_cost, dt_zero_sync_plan_cost, dt_zero_sync_plan_cost};

void dt_grad_sync_plan_cost(const dt_cost_query *q, dt_strategy_cost *out) {
    DT_ASSERT(q->zero >= 0 && q->zero <= 3);
    grad_sync_plan_costs[q->zero](q, out);
}
