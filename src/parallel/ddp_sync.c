/*
 * ddp_sync.c — data parallelism as a dt_grad_sync: the DDP bucket engine
 * (ddp.c) plus what the step does with each averaged bucket.
 *
 * Per averaged bucket, in bucket order (from the end of the buffer):
 *   - with loss scaling, unscale it (one pass that also finds inf/nan);
 *   - add the squares of the elements this rank counts: bucket i is counted
 *     by data-parallel replica i % dp (every replica holds the same
 *     averaged gradient, so the world sums each element once), restricted
 *     to the norm ranges (tensors replicated over model-parallel ranks are
 *     counted by one of them);
 *   - with update_early, step the optimizer on that range at once, so the
 *     update of bucket k overlaps the allreduce of bucket k + 1 (the loop
 *     asks for it only when the optimizer is rangewise this step).
 *
 * Before a bucket is sent, the optimizer may premix it (1-bit Adam/LAMB's
 * compression stage sends g + scale * beta1 / (1 - beta1) * m, so that the
 * average is the new momentum; dt_optimizer_premix).
 *
 * The codec state (error-feedback residuals) is in the units of the loss
 * scale its gradients carried; begin_step rescales it when the scale
 * changes (after an overflow or a growth interval, or on resume).
 */
#include "dtrain/amp.h"
#include "sync_internal.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

typedef struct ddp_sync {
    dt_grad_sync base;
    dt_ddp *d;
    dt_group *g;     /* borrowed; NULL: a single replica */
    int replica, dp; /* this rank in g, and its size */
    float *params;   /* (n) borrowed */
    float *grads;    /* (n) borrowed */
    size_t n;
    dt_optimizer *opt;      /* borrowed */
    dt__norm_ranges norm;   /* ranges counted in the norm */
    bool codec;             /* a codec (not only a 16-bit cast) compresses the buckets */
    dt_codec_spec spec;     /* its spec */
    int64_t compress_start; /* dense warm-up steps */
    int64_t ramp;           /* top-k density ramp steps after it */
    double ramp_start;      /* the ramp's first density */
    char ident[192];        /* what the codec state belongs to */
    /* Per step. */
    dt_sync_step step;
    float inv_scale;   /* 1 / step.loss_scale */
    float state_scale; /* loss scale the codec residuals are in */
    size_t bucket;     /* buckets seen by on_bucket this step */
    int backwards;     /* begin_backward calls this step */
    double sumsq;
    bool found_inf;
} ddp_sync;

/* --compress-ramp: the top-k fraction of 0-based step `step`, 0 outside the
 * ramp (the codec's own). Exponential from ramp_start at the first
 * compressed step towards the codec's fraction, reached by the step after
 * the ramp. A function of the step, so a resume agrees. */
static double ramp_fraction(const ddp_sync *s, int64_t step) {
    int64_t k = step - s->compress_start;
    if (s->ramp <= 0 || k < 0 || k >= s->ramp)
        return 0;
    double u = (double)k / (double)s->ramp;
    return pow(s->ramp_start, 1 - u) * pow(s->spec.fraction, u);
}

static dt_status sync_begin_step(dt_grad_sync *base, const dt_sync_step *st) {
    ddp_sync *s = (ddp_sync *)base;
    s->step = *st;
    s->inv_scale = 1.0f / st->loss_scale;
    s->sumsq = 0;
    s->found_inf = false;
    s->bucket = 0;
    s->backwards = 0;
    if (st->loss_scale != s->state_scale) {
        dt_ddp_scale_state(s->d, st->loss_scale / s->state_scale);
        s->state_scale = st->loss_scale;
    }
    /* Dense warm-up: the codec (and its residuals) start at step
     * compress_start; then the top-k ramp. */
    dt_ddp_set_dense(s->d, st->step < s->compress_start);
    if (s->codec)
        DT_CHECK(dt_ddp_set_fraction(s->d, ramp_fraction(s, st->step)));
    return DT_OK;
}

static dt_grad_mode sync_begin_backward(dt_grad_sync *base, bool last) {
    ddp_sync *s = (ddp_sync *)base;
    dt_ddp_begin(s->d, last);
    /* The step's first backward overwrites, the others add to it. */
    return s->backwards++ == 0 ? DT_GRAD_OVERWRITE : DT_GRAD_ACCUMULATE;
}

static void sync_ready(dt_grad_sync *base, size_t ready_from) {
    dt_ddp_grad_ready(((ddp_sync *)base)->d, ready_from);
}

/* Each averaged bucket, in order (see the file comment). */
static void on_bucket(void *user, size_t begin, size_t end) {
    ddp_sync *s = user;
    float *g = s->grads;
    if (s->step.loss_scaling)
        s->found_inf |= dt_unscale(g + begin, end - begin, s->inv_scale);
    if (s->bucket++ % (size_t)s->dp == (size_t)s->replica)
        s->sumsq += dt__norm_ranges_sumsq(&s->norm, s->grads, begin, end);
    if (s->step.update_early)
        dt_optimizer_update(s->opt, s->params, g, begin, end);
}

static dt_status sync_finish(dt_grad_sync *base, dt_sync_result *out) {
    ddp_sync *s = (ddp_sync *)base;
    DT_CHECK(dt_ddp_finish(s->d, on_bucket, s));
    const dt_ddp_stats *ds = dt_ddp_last_stats(s->d);
    out->sumsq = s->sumsq;
    out->found_inf = s->found_inf;
    out->updated = s->step.update_early;
    out->comm_ms = ds->comm_ms;
    out->exposed_comm_ms = ds->exposed_comm_ms;
    out->bytes_sent = ds->bytes_sent;
    out->collectives = ds->buckets;
    out->launched_in_backward = ds->launched_in_backward;
    return DT_OK;
}

static dt_status sync_apply(dt_grad_sync *base, bool skip, float clip_scale) {
    ddp_sync *s = (ddp_sync *)base;
    if (skip || s->step.update_early)
        return DT_OK;
    if (clip_scale != 1.0f)
        dt_scale(s->grads, s->n, clip_scale);
    return dt_optimizer_step(s->opt, s->params, s->grads);
}

/* A bucket's final gradients, before they are sent: 1-bit Adam's
 * compression stage sends the momentum mix instead (optim.h). */
static void sync_prepare(void *user, size_t begin, size_t end) {
    ddp_sync *s = user;
    dt_optimizer_premix(s->opt, s->grads, begin, end, s->step.loss_scale);
}

static dt_status sync_replicate(dt_grad_sync *base) {
    return dt_ddp_broadcast_params(((ddp_sync *)base)->d);
}

static dt_status sync_check(dt_grad_sync *base, int64_t step) {
    return dt_ddp_check_params(((ddp_sync *)base)->d, step);
}

static void sync_cost(const dt_grad_sync *base, dt_sync_cost *out) {
    const ddp_sync *s = (const ddp_sync *)base;
    out->coll = DT_COLL_ALLREDUCE;
    out->ranks = s->dp;
    out->bytes_per_step = (double)dt_ddp_step_bytes(s->d);
    out->pieces = (int)dt_ddp_num_buckets(s->d);
    out->overlapped = true;
    out->state_bytes = dt_ddp_state_bytes(s->d);
}

static void sync_layout(const dt_grad_sync *base, dt_sync_layout *out) {
    (void)base;
    out->params_replicated = out->optim_replicated = true;
}

static size_t sync_state_bytes(const dt_grad_sync *base) {
    return dt_ddp_state_bytes(((const ddp_sync *)base)->d);
}

static const char *sync_state_ident(const dt_grad_sync *base) {
    return ((const ddp_sync *)base)->ident;
}

static dt_status sync_get_state(const dt_grad_sync *base, void *buf, size_t len, float *unit) {
    const ddp_sync *s = (const ddp_sync *)base;
    *unit = s->state_scale;
    return dt_ddp_get_state(s->d, buf, len);
}

static dt_status sync_set_state(dt_grad_sync *base, const void *buf, size_t len, float unit) {
    ddp_sync *s = (ddp_sync *)base;
    if (!(unit > 0) || !isfinite(unit))
        return dt_error_set(DT_ERR_CORRUPT, "DDP state: loss-scale unit %g is not positive",
                            (double)unit);
    DT_CHECK(dt_ddp_set_state(s->d, buf, len));
    s->state_scale = unit; /* the next begin_step converts it to that step's scale */
    return DT_OK;
}

static void sync_reset_state(dt_grad_sync *base) { dt_ddp_reset_state(((ddp_sync *)base)->d); }

static void sync_destroy(dt_grad_sync *base) {
    ddp_sync *s = (ddp_sync *)base;
    dt_ddp_destroy(s->d);
    dt__norm_ranges_free(&s->norm);
    dt_free(s);
}

static const dt__sync_ops ddp_ops = {
    .name = "ddp",
    .begin_step = sync_begin_step,
    .begin_backward = sync_begin_backward,
    .ready = sync_ready,
    .finish = sync_finish,
    .apply = sync_apply,
    .replicate = sync_replicate,
    .check = sync_check,
    .cost = sync_cost,
    .layout = sync_layout,
    .state_bytes = sync_state_bytes,
    .state_ident = sync_state_ident,
    .get_state = sync_get_state,
    .set_state = sync_set_state,
    .reset_state = sync_reset_state,
    .destroy = sync_destroy,
};

dt_status dt_ddp_sync_create(dt_grad_sync **out, const dt_ddp_sync_config *c) {
    *out = NULL;
    if (!c->opt || !c->params || !c->grads)
        return dt_error_set(DT_ERR_INVALID, "DDP sync: params, grads and optimizer are required");
    if (dt_optimizer_num_owned(c->opt) != 1 || dt_optimizer_owned(c->opt, 0).begin != 0 ||
        dt_optimizer_owned(c->opt, 0).end != c->n)
        return dt_error_set(DT_ERR_INVALID,
                            "DDP sync: the optimizer must own all of [0, %zu): DDP updates every "
                            "parameter on every replica",
                            c->n);
    if (c->compress_start < 0 || c->compress_ramp < 0)
        return dt_error_set(DT_ERR_INVALID,
                            "DDP sync: compress_start %" PRId64 " and compress_ramp %" PRId64
                            " must be >= 0",
                            c->compress_start, c->compress_ramp);
    ddp_sync *s = dt_calloc(1, sizeof *s);
    if (!s)
        return DT_ERR_NOMEM;
    s->base.ops = &ddp_ops;
    s->g = c->group;
    s->replica = c->group ? dt_group_rank(c->group) : 0;
    s->dp = c->group ? dt_group_size(c->group) : 1;
    s->params = c->params;
    s->grads = c->grads;
    s->n = c->n;
    s->opt = c->opt;
    s->codec = c->ddp.codec.kind != DT_CODEC_NONE;
    s->spec = c->ddp.codec;
    s->compress_start = c->compress_start;
    s->ramp = c->compress_ramp;
    s->ramp_start = c->ramp_start;
    s->state_scale = 1.0f;
    dt_status st;
    DT_CHECK_GOTO(dt__norm_ranges_init(&s->norm, c->norm_ranges, c->nnorm, c->n), st, fail);
    dt_ddp_options o = c->ddp;
    o.prepare = sync_prepare;
    o.prepare_user = s;
    DT_CHECK_GOTO(dt_ddp_create_with(&s->d, c->group, c->params, c->grads, c->n, &o), st, fail);
    static const char *const ef_names[] = {"auto", "on", "off"};
    char cb[64];
    int w = snprintf(s->ident, sizeof s->ident, "%s ef=%s grad_dtype=%s buckets=%zu ranks=%d",
                     dt_codec_format(&c->ddp.codec, cb, sizeof cb), ef_names[c->ddp.ef],
                     dt_dtype_name(c->ddp.grad_dtype), dt_ddp_num_buckets(s->d), s->dp);
    /* Exact tensors keep zero residuals: part of what the state means. */
    if (c->ddp.dense_below > 0 && w > 0 && (size_t)w < sizeof s->ident)
        snprintf(s->ident + w, sizeof s->ident - (size_t)w, " dense_below=%zu", c->ddp.dense_below);
    *out = &s->base;
    return DT_OK;
fail:
    sync_destroy(&s->base);
    return st;
}

/* The planner's view (parallel.h, "Planning costs"): one allreduce per
 * bucket over the replica group after the step's last backward, started as
 * backward finishes each bucket. */
void dt_ddp_sync_plan_cost(const dt_cost_query *q, dt_strategy_cost *out) {
    double bytes = q->params * sizeof(float), buckets = ceil(bytes / (double)q->bucket_bytes);
    if (q->degree[DT_AXIS_DP] * q->degree[DT_AXIS_CP] <= 1 || buckets < 1)
        return;
    dt_strategy_cost_add(out, (dt_comm_cost){.coll = DT_COLL_ALLREDUCE,
                                             .axis = DT_AXIS_DP,
                                             .bytes = bytes / buckets,
                                             .calls = buckets,
                                             .backward = true,
                                             .overlapped = true,
                                             .what = "dp gradient allreduce (buckets)"});
}
