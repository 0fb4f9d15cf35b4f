/*
 * runner.c — the runner interface (parallel.h, "Runners") and the
 * sequential runner: forward and backward of each micro-batch in turn, the
 * first backward overwriting the gradients and the last one communicating.
 */
#include "runner_internal.h"

#include <stdio.h>

dt_status dt_runner_step(dt_runner *r, const dt_run_batch *b, dt_grad_sync *sync,
                         dt_run_result *out) {
    memset(out, 0, sizeof *out);
    if (!b || b->micro < 1 || b->B < 1 || b->T < 1 || !b->inputs || !b->targets)
        return dt_error_set(DT_ERR_INVALID, "runner: a step needs micro >= 1, B, T >= 1, inputs "
                                            "and targets");
    return r->ops->step(r, b, sync, out);
}

dt_status dt_runner_eval(dt_runner *r, const int32_t *inputs, const int32_t *targets, int B, int T,
                         double *loss) {
    return r->ops->eval(r, inputs, targets, B, T, loss);
}

const char *dt_runner_name(const dt_runner *r) { return r->ops->name(r); }

void dt_runner_destroy(dt_runner *r) {
    if (r)
        r->ops->destroy(r);
}

/* ------------------------------------------------------------------------ */
/* Sequential                                                               */
/* ------------------------------------------------------------------------ */

typedef struct seq_runner {
    dt_runner base;
    dt_gpt *m;
} seq_runner;

static dt_status seq_step(dt_runner *base, const dt_run_batch *b, dt_grad_sync *sync,
                          dt_run_result *out) {
    seq_runner *r = (seq_runner *)base;
    size_t bt = (size_t)b->B * b->T;
    out->has_loss = true;
    for (int k = 0; k < b->micro; k++) {
        float loss;
        double t0 = dt_now();
        DT_CHECK(dt_gpt_forward(r->m, b->inputs + k * bt, b->targets + k * bt, b->B, b->T, &loss));
        out->loss += loss;
        /* The synchronisation says whether this backward overwrites the
         * gradients (the step's first: no zeroing pass, the same bits) or
         * adds to them. */
        dt_grad_mode mode = dt_grad_sync_begin_backward(sync, k == b->micro - 1);
        DT_CHECK(dt_gpt_backward_mode(r->m, b->grad_scale, mode, dt_grad_sync_ready, sync));
        out->busy_ms += (dt_now() - t0) * 1e3;
    }
    out->peak_live = 1;
    return DT_OK;
}

static dt_status seq_eval(dt_runner *base, const int32_t *inputs, const int32_t *targets, int B,
                          int T, double *loss) {
    seq_runner *r = (seq_runner *)base;
    float l;
    DT_CHECK(dt_gpt_forward(r->m, inputs, targets, B, T, &l));
    *loss = l;
    return DT_OK;
}

static const char *seq_name(const dt_runner *r) {
    (void)r;
    return "sequential";
}

static void seq_destroy(dt_runner *r) { dt_free(r); }

static const dt__runner_ops seq_ops = {
    .step = seq_step, .eval = seq_eval, .name = seq_name, .destroy = seq_destroy};

dt_status dt_sequential_runner_create(dt_runner **out, dt_gpt *m) {
    *out = NULL;
    if (dt_gpt_get_part(m)->chunks != 1)
        return dt_error_set(DT_ERR_INVALID,
                            "sequential runner: the model part has %d chunks (a pipeline "
                            "runner drives several)",
                            dt_gpt_get_part(m)->chunks);
    seq_runner *r = dt_calloc(1, sizeof *r);
    if (!r)
        return DT_ERR_NOMEM;
    r->base.ops = &seq_ops;
    r->m = m;
    *out = &r->base;
    return DT_OK;
}
