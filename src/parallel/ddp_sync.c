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
 *
 * Deferred steps (--comm-priority critical with update_early): finish()
 * starts the buckets and returns; the engine sends them front first, and
 * the next forward's parameter hooks take each layer's buckets (wait for
 * them, then on_bucket: the update) just before the layer runs. The sync
 * then owns the optimizer's begin/end around those updates: begin in
 * finish, end once the last bucket was handed out (settle, at the latest
 * in the next begin_backward, before any gradient is overwritten). The
 * sum of squares is kept per bucket and added in bucket order, so it has
 * the same bits whatever order the buckets were handed out in.
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
    char ident[320];        /* what the codec state belongs to */
    bool critical;          /* --comm-priority critical: hooks, deferred steps */
    dt_param_hooks hooks;   /* critical: fetch takes a layer's buckets */
    /* Per step. */
    dt_sync_step step;
    float inv_scale;   /* 1 / step.loss_scale */
    float state_scale; /* loss scale the codec residuals are in */
    int backwards;     /* begin_backward calls this step */
    /* The step whose buckets are being handed out (a deferred one's while
     * the next step runs): its settings and per-bucket sums of squares. */
    dt_sync_step bstep;
    float binv_scale;
    double *bsumsq; /* (buckets) */
    bool found_inf;
    bool late_open; /* a deferred step's updates (and optimizer step) are open */
    bool has_prev;  /* ... completed, its figures not reported yet: */
    double prev_sumsq, prev_comm_ms;
    double t_step; /* begin_step's time */
    double t_fwd;  /* when this step's forward got its first parameters (0: not yet) */
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
    s->backwards = 0;
    s->t_step = dt_now();
    s->t_fwd = 0;
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

static dt_status settle_late(ddp_sync *s);

static dt_grad_mode sync_begin_backward(dt_grad_sync *base, bool last) {
    ddp_sync *s = (ddp_sync *)base;
    /* A deferred step's buckets are normally all taken by the forward;
     * none may stay in flight once backward writes the gradients. An
     * error is the engine's, kept for finish (the hook's errors are). */
    if (s->late_open && settle_late(s) != DT_OK)
        DT_WARN("completing the previous step's gradients: %s", dt_last_error());
    dt_ddp_begin(s->d, last);
    /* The step's first backward overwrites, the others add to it. */
    return s->backwards++ == 0 ? DT_GRAD_OVERWRITE : DT_GRAD_ACCUMULATE;
}

static void sync_ready(dt_grad_sync *base, size_t ready_from) {
    dt_ddp_grad_ready(((ddp_sync *)base)->d, ready_from);
}

/* Bucket i of the buffer (numbered from its end, as the engine does). */
static size_t bucket_index(const ddp_sync *s, size_t end) {
    size_t nb = dt_ddp_num_buckets(s->d), b, e;
    dt_ddp_bucket(s->d, 0, &b, &e);
    size_t i = (s->n - end) / (e - b);
    DT_ASSERT(i < nb);
    return i;
}

/* Each averaged bucket, in bucket order, or under critical priority in the
 * order the forward takes them (see the file comment). */
static void on_bucket(void *user, size_t begin, size_t end) {
    ddp_sync *s = user;
    float *g = s->grads;
    size_t i = bucket_index(s, end);
    if (s->bstep.loss_scaling)
        s->found_inf |= dt_unscale(g + begin, end - begin, s->binv_scale);
    if (i % (size_t)s->dp == (size_t)s->replica)
        s->bsumsq[i] = dt__norm_ranges_sumsq(&s->norm, s->grads, begin, end);
    if (s->bstep.update_early)
        dt_optimizer_update(s->opt, s->params, g, begin, end);
}

/* The counted squares, added in bucket order. */
static double bucket_sumsq(const ddp_sync *s) {
    double sum = 0;
    for (size_t i = 0; i < dt_ddp_num_buckets(s->d); i++)
        sum += s->bsumsq[i];
    return sum;
}

/* Hand out what a deferred step left, close its optimizer step and keep
 * its figures for the next report. */
static dt_status settle_late(ddp_sync *s) {
    if (!s->late_open)
        return DT_OK;
    dt_status st = dt_ddp_settle(s->d, on_bucket, s);
    dt_optimizer_end(s->opt, true);
    s->late_open = false;
    s->has_prev = true;
    s->prev_sumsq = bucket_sumsq(s);
    s->prev_comm_ms = dt_ddp_last_stats(s->d)->comm_ms;
    return st;
}

static dt_status sync_finish(dt_grad_sync *base, dt_sync_result *out) {
    ddp_sync *s = (ddp_sync *)base;
    DT_CHECK(settle_late(s)); /* begin_backward did, unless there was no backward */
    s->bstep = s->step;
    s->binv_scale = s->inv_scale;
    s->found_inf = false;
    memset(s->bsumsq, 0, dt_ddp_num_buckets(s->d) * sizeof *s->bsumsq);
    /* The forward's start against the previous step's last gradient: with
     * hooks, when its first layer had its parameters; else begin_step. */
    double t_fwd = s->t_fwd > 0 ? s->t_fwd : s->t_step;
    double done_before = dt_ddp_comm_done_at(s->d); /* the previous step's, settled above */
    out->fwd_lead_ms = done_before > 0 ? (done_before - t_fwd) * 1e3 : NAN;
    if (s->has_prev) {
        out->has_prev = true;
        out->prev_sumsq = s->prev_sumsq;
        out->prev_comm_ms = s->prev_comm_ms;
        s->has_prev = false;
    }
    if (s->step.defer) {
        DT_CHECK(dt_ddp_finish_later(s->d));
        dt_optimizer_begin(s->opt, s->step.step, s->step.lr);
        s->late_open = true;
        out->late = true;
        out->updated = true;
    } else {
        DT_CHECK(dt_ddp_finish(s->d, on_bucket, s));
        out->sumsq = bucket_sumsq(s);
        out->comm_ms = dt_ddp_last_stats(s->d)->comm_ms;
        out->updated = s->step.update_early;
    }
    const dt_ddp_stats *ds = dt_ddp_last_stats(s->d);
    out->codecs = dt_ddp_codec_choice(s->d, &out->link_bytes_per_s);
    out->found_inf = s->found_inf;
    /* Blocked this iteration: in finish, and (critical) in the forward's
     * takes of the previous step's buckets. */
    out->exposed_comm_ms = dt_ddp_take_blocked_ms(s->d);
    out->bytes_sent = ds->bytes_sent;
    out->collectives = ds->buckets;
    out->launched_in_backward = ds->launched_in_backward;
    return DT_OK;
}

static bool sync_defers(const dt_grad_sync *base, bool update_early) {
    const ddp_sync *s = (const ddp_sync *)base;
    /* The forward must be able to take its layers' buckets (the hooks), and
     * the optimizer step must be elementwise at every step, whatever its
     * number (asked before the step opens), with nothing else in it: not
     * 1-bit Adam/LAMB (premix during backward, a stage that changes), no
     * gradient centralisation, no state streamed from disk. */
    const dt_optim_config *oc = dt_optimizer_config(s->opt);
    dt_optim_kind k = oc->kind == DT_OPTIM_LOOKAHEAD ? oc->inner : oc->kind;
    bool elementwise = k == DT_OPTIM_ADAMW || k == DT_OPTIM_SGD || k == DT_OPTIM_RADAM;
    return s->critical && update_early && elementwise && !oc->centralize &&
           dt_optimizer_offload_bytes(s->opt) == 0;
}

static dt_status sync_settle(dt_grad_sync *base, dt_sync_late *out) {
    ddp_sync *s = (ddp_sync *)base;
    DT_CHECK(settle_late(s));
    if (s->has_prev) {
        *out = (dt_sync_late){.pending = true, .sumsq = s->prev_sumsq, .comm_ms = s->prev_comm_ms};
        s->has_prev = false;
    }
    return DT_OK;
}

/* Critical priority: the model asks for a layer's parameters; a deferred
 * step's buckets there are waited for and updated now. */
static dt_status hook_fetch(void *user, size_t begin, size_t end) {
    ddp_sync *s = user;
    double t0 = dt_now();
    dt_status st = dt_ddp_take(s->d, begin, end, on_bucket, s);
    double t1 = dt_now();
    if (s->t_fwd == 0)
        s->t_fwd = t1;
    if (t1 - t0 > 1e-3)
        DT_TRACE("ddp", "step %" PRId64 ": the forward waited %.1f ms for parameters [%zu, %zu)",
                 s->step.step + 1, (t1 - t0) * 1e3, begin, end);
    return st;
}
static void hook_prefetch(void *user, size_t begin, size_t end) {
    (void)user, (void)begin, (void)end; /* the engine sends front first anyway */
}
static void hook_release(void *user, size_t begin, size_t end) {
    (void)user, (void)begin, (void)end; /* the parameters stay */
}

static const dt_param_hooks *sync_param_hooks(const dt_grad_sync *base) {
    const ddp_sync *s = (const ddp_sync *)base;
    return s->critical ? &s->hooks : NULL;
}

static dt_status sync_gather_params(dt_grad_sync *base, bool whole) {
    dt_sync_late late;
    return whole ? sync_settle(base, &late) : DT_OK;
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
    DT_CHECK(settle_late((ddp_sync *)base));
    return dt_ddp_broadcast_params(((ddp_sync *)base)->d);
}

static dt_status sync_check(dt_grad_sync *base, int64_t step) {
    DT_CHECK(settle_late((ddp_sync *)base));
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
    dt_free(s->bsumsq);
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
    .param_hooks = sync_param_hooks,
    .gather_params = sync_gather_params,
    .defers = sync_defers,
    .settle = sync_settle,
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
    s->bsumsq = dt_calloc(dt_ddp_num_buckets(s->d) + 1, sizeof *s->bsumsq);
    if (!s->bsumsq) {
        st = DT_ERR_NOMEM;
        goto fail;
    }
    s->critical = c->ddp.priority == DT_COMM_PRIORITY_CRITICAL;
    s->hooks = (dt_param_hooks){
        .user = s, .fetch = hook_fetch, .prefetch = hook_prefetch, .release = hook_release};
    static const char *const ef_names[] = {"auto", "on", "off"};
    char cb[64];
    char ab[160];
    int w = snprintf(s->ident, sizeof s->ident, "%s ef=%s grad_dtype=%s buckets=%zu ranks=%d",
                     c->ddp.auto_codecs ? dt_codec_auto_format(c->ddp.auto_codecs, ab, sizeof ab)
                                        : dt_codec_format(&c->ddp.codec, cb, sizeof cb),
                     ef_names[c->ddp.ef], dt_dtype_name(c->ddp.grad_dtype),
                     dt_ddp_num_buckets(s->d), s->dp);
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
