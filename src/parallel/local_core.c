/*
 * local_core.c — the local step shared by local SGD and gossip (see
 * local_core.h). Nothing here knows which strategy mixes the parameters.
 */
#include "local_core.h"

#include "dtrain/amp.h"

#include <string.h>

dt_status dt__local_init(dt__local_core *c, const char *who, dt_group *g, float *params,
                         float *grads, size_t n, dt_optimizer *opt, const dt_range *norm_ranges,
                         size_t nnorm) {
    memset(c, 0, sizeof *c);
    if (!opt || !params || !grads)
        return dt_error_set(DT_ERR_INVALID, "%s: params, grads and optimizer are required", who);
    if (dt_optimizer_num_owned(opt) != 1 || dt_optimizer_owned(opt, 0).begin != 0 ||
        dt_optimizer_owned(opt, 0).end != n)
        return dt_error_set(DT_ERR_INVALID,
                            "%s: the optimizer must own all of [0, %zu): every replica steps "
                            "every parameter",
                            who, n);
    c->g = g;
    c->replica = g ? dt_group_rank(g) : 0;
    c->dp = g ? dt_group_size(g) : 1;
    c->params = params;
    c->grads = grads;
    c->n = n;
    c->opt = opt;
    return dt__norm_ranges_init(&c->norm, norm_ranges, nnorm, n);
}

void dt__local_free(dt__local_core *c) { dt__norm_ranges_free(&c->norm); }

void dt__local_begin_step(dt__local_core *c, const dt_sync_step *st) {
    c->step = *st;
    c->backwards = 0;
}

dt_grad_mode dt__local_begin_backward(dt__local_core *c) {
    return c->backwards++ == 0 ? DT_GRAD_OVERWRITE : DT_GRAD_ACCUMULATE;
}

void dt__local_finish(dt__local_core *c, bool agreed, dt_sync_result *out) {
    if (c->step.loss_scaling)
        out->found_inf = dt_unscale(c->grads, c->n, 1.0f / c->step.loss_scale);
    out->sumsq = dt__norm_ranges_sumsq(&c->norm, c->grads, 0, c->n) / (agreed ? c->dp : 1);
}

dt_status dt__local_apply(dt__local_core *c, bool skip, float clip_scale) {
    if (skip)
        return DT_OK;
    if (clip_scale != 1.0f)
        dt_scale(c->grads, c->n, clip_scale);
    return dt_optimizer_step(c->opt, c->params, c->grads);
}

size_t dt__local_state_floats(const dt__local_core *c) {
    size_t total = c->n;
    for (size_t i = 0; i < dt_optimizer_num_states(c->opt); i++)
        total += dt_optimizer_state_count(c->opt, i);
    for (size_t k = 0; k < dt_optimizer_num_tensor_states(c->opt); k++) {
        size_t count;
        (void)dt_optimizer_tensor_state(c->opt, k, NULL, &count);
        total += count;
    }
    return total;
}

void dt__local_state_get(const dt__local_core *c, float *dst) {
    memcpy(dst, c->params, c->n * sizeof(float));
    dst += c->n;
    for (size_t i = 0; i < dt_optimizer_num_states(c->opt); i++) {
        dt_optimizer_state_get(c->opt, i, dst);
        dst += dt_optimizer_state_count(c->opt, i);
    }
    for (size_t k = 0; k < dt_optimizer_num_tensor_states(c->opt); k++) {
        size_t count;
        const float *t = dt_optimizer_tensor_state(c->opt, k, NULL, &count);
        memcpy(dst, t, count * sizeof(float));
        dst += count;
    }
}

void dt__local_state_set(dt__local_core *c, const float *src) {
    memcpy(c->params, src, c->n * sizeof(float));
    src += c->n;
    for (size_t i = 0; i < dt_optimizer_num_states(c->opt); i++) {
        dt_optimizer_state_set(c->opt, i, src);
        src += dt_optimizer_state_count(c->opt, i);
    }
    for (size_t k = 0; k < dt_optimizer_num_tensor_states(c->opt); k++) {
        size_t count;
        float *t = dt_optimizer_tensor_state(c->opt, k, NULL, &count);
        memcpy(t, src, count * sizeof(float));
        src += count;
    }
}

dt_status dt__local_average(dt__local_core *c, float *x, size_t count, double *ms) {
    if (c->dp <= 1 || count == 0)
        return DT_OK;
    double t0 = dt_now();
    DT_CHECK(dt_group_allreduce(c->g, x, x, count, DT_F32, DT_AVG));
    *ms += (dt_now() - t0) * 1e3;
    return DT_OK;
}

uint64_t dt__local_ring_bytes(const dt__local_core *c, size_t count) {
    return (uint64_t)(2.0 * (c->dp - 1) / c->dp * (double)count * sizeof(float));
}

dt_status dt__local_average_optim(dt__local_core *c, double *ms) {
    for (size_t i = 0; i < dt_optimizer_num_states(c->opt); i++) {
        float *buf = dt_optimizer_state(c->opt, i, NULL);
        size_t count = dt_optimizer_state_count(c->opt, i);
        if (buf) {
            DT_CHECK(dt__local_average(c, buf, count, ms));
            continue;
        }
        /* Kept another way (8-bit codes, a file): average its fp32 values. */
        float *tmp = dt_alloc((count ? count : 1) * sizeof(float));
        if (!tmp)
            return dt_error_set(DT_ERR_NOMEM, "optimizer state average: %zu values", count);
        dt_optimizer_state_get(c->opt, i, tmp);
        dt_status st = dt__local_average(c, tmp, count, ms);
        if (st == DT_OK)
            dt_optimizer_state_set(c->opt, i, tmp);
        dt_free(tmp);
        DT_CHECK(st);
    }
    for (size_t k = 0; k < dt_optimizer_num_tensor_states(c->opt); k++) {
        size_t count;
        float *t = dt_optimizer_tensor_state(c->opt, k, NULL, &count);
        DT_CHECK(dt__local_average(c, t, count, ms));
    }
    return DT_OK;
}
