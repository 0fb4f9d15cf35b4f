/*
 * local_sync.c — local SGD, post-local SGD and an outer optimizer on the
 * averaged delta (SlowMo, DiLoCo) as a dt_grad_sync (parallel.h, "Beyond
 * synchronous data parallelism"; docs/async.md).
 *
 * A step is either synchronous or local:
 *
 *   synchronous   steps < post_local_after, and every step when H = 1 with
 *                 plain averaging (outer sgd, lr 1): DDP's sync (ddp_sync.c)
 *                 averages the gradients, bit for bit as --dp-mode ddp;
 *   local         the replica steps its optimizer on its own gradients;
 *                 after the local step s with (s + 1 - post_local_after) a
 *                 multiple of H, and after the run's last step, the
 *                 parameters are averaged over the replica group (and the
 *                 optimizer state with sync_optim_state), then the outer
 *                 optimizer moves the anchor (the parameters of the last
 *                 synchronisation) along delta = anchor - average and every
 *                 replica continues from the new anchor.
 *
 * Invariants: after a synchronous step or an average every replica holds
 * the same parameters and anchor, so the outer optimizer (computed alike
 * on every replica from identical inputs) keeps them identical; check()
 * compares the replicas only then. The anchor and the outer momentum are
 * part of this rank's checkpoint state, with its own parameters and
 * optimizer state (they differ between averages).
 */
#include "local_core.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

const char *const dt_outer_names[DT_OUTER_COUNT] = {"sgd", "slowmo", "nesterov"};

typedef struct local_sync {
    dt_grad_sync base;
    dt__local_core core;
    dt_grad_sync *ddp;      /* runs the synchronous steps; replicate and check */
    int64_t H, post, total; /* sync_every, post_local_after, total_steps */
    dt_outer_kind outer;
    float outer_lr, beta;
    bool plain;          /* outer sgd with lr 1: the average is the new anchor */
    bool sync_optim;     /* average the optimizer state too */
    float *anchor;       /* (n) parameters at the last synchronisation */
    float *u;            /* (n) outer momentum; NULL for sgd */
    size_t optim_floats; /* optimizer state values (averaged with sync_optim) */
    /* Per step. */
    bool synchronous;    /* this step averages gradients through ddp */
    bool in_sync;        /* the replicas hold the same parameters now */
    dt_sync_result done; /* what apply() sent this step (apply_report) */
    char ident[160];
} local_sync;

static bool averages_after(const local_sync *s, int64_t step) {
    return step + 1 == s->total || (step + 1 - s->post) % s->H == 0;
}

static dt_status local_begin_step(dt_grad_sync *base, const dt_sync_step *st) {
    local_sync *s = (local_sync *)base;
    s->synchronous = st->step < s->post || (s->H == 1 && s->plain);
    dt__local_begin_step(&s->core, st);
    return s->synchronous ? dt_grad_sync_begin_step(s->ddp, st) : DT_OK;
}

static dt_grad_mode local_begin_backward(dt_grad_sync *base, bool last) {
    local_sync *s = (local_sync *)base;
    return s->synchronous ? dt_grad_sync_begin_backward(s->ddp, last)
                          : dt__local_begin_backward(&s->core);
}

static void local_ready(dt_grad_sync *base, size_t ready_from) {
    local_sync *s = (local_sync *)base;
    if (s->synchronous)
        dt_grad_sync_ready(s->ddp, ready_from);
}

static dt_status local_finish(dt_grad_sync *base, dt_sync_result *out) {
    local_sync *s = (local_sync *)base;
    if (s->synchronous)
        DT_CHECK(dt_grad_sync_finish(s->ddp, out));
    else
        dt__local_finish(&s->core, averages_after(s, s->core.step.step), out);
    return DT_OK;
}

/* Synchronous steps and averages meet anyway: the loop agrees there only. */
static bool local_agrees(const dt_grad_sync *base, int64_t step) {
    const local_sync *s = (const local_sync *)base;
    return step < s->post || (s->H == 1 && s->plain) || averages_after(s, step);
}

/* The outer optimizer on the averaged parameters p (see the file comment):
 * the same arithmetic on every replica. */
static void outer_step(local_sync *s) {
    float *p = s->core.params, *a = s->anchor, *u = s->u, lr = s->outer_lr, b = s->beta;
    size_t n = s->core.n;
    switch (s->outer) {
    case DT_OUTER_SGD:
        for (size_t i = 0; i < n; i++)
            a[i] -= lr * (a[i] - p[i]);
        break;
    case DT_OUTER_SLOWMO:
        for (size_t i = 0; i < n; i++) {
            u[i] = b * u[i] + (a[i] - p[i]);
            a[i] -= lr * u[i];
        }
        break;
    case DT_OUTER_NESTEROV:
        for (size_t i = 0; i < n; i++) {
            float d = a[i] - p[i];
            u[i] = b * u[i] + d;
            a[i] -= lr * (d + b * u[i]);
        }
        break;
    case DT_OUTER_COUNT: DT_ASSERT(!"outer kind");
    }
    memcpy(p, a, n * sizeof(float));
}

static dt_status local_apply(dt_grad_sync *base, bool skip, float clip_scale) {
    local_sync *s = (local_sync *)base;
    size_t bytes = s->core.n * sizeof(float);
    if (s->synchronous) {
        DT_CHECK(dt_grad_sync_apply(s->ddp, skip, clip_scale));
        memcpy(s->anchor, s->core.params, bytes); /* every replica's: the anchor to come */
        s->in_sync = true;
        return DT_OK;
    }
    memset(&s->done, 0, sizeof s->done);
    DT_CHECK(dt__local_apply(&s->core, skip, clip_scale));
    s->in_sync = false;
    if (!averages_after(s, s->core.step.step) || s->core.dp <= 1)
        return DT_OK;
    DT_CHECK(dt__local_average(&s->core, s->core.params, s->core.n, &s->done.comm_ms));
    if (s->sync_optim)
        DT_CHECK(dt__local_average_optim(&s->core, &s->done.comm_ms));
    s->done.bytes_sent =
        dt__local_ring_bytes(&s->core, s->core.n + (s->sync_optim ? s->optim_floats : 0));
    s->done.collectives = s->sync_optim ? 2 : 1;
    if (s->plain)
        memcpy(s->anchor, s->core.params, bytes);
    else
        outer_step(s);
    s->in_sync = true;
    return DT_OK;
}

/* The average of a local step blocks: all of its time is exposed. */
static void local_apply_report(dt_grad_sync *base, dt_sync_result *out) {
    local_sync *s = (local_sync *)base;
    if (s->synchronous)
        return;
    out->comm_ms += s->done.comm_ms;
    out->exposed_comm_ms += s->done.comm_ms;
    out->bytes_sent += s->done.bytes_sent;
    out->collectives += s->done.collectives;
}

static dt_status local_replicate(dt_grad_sync *base) {
    local_sync *s = (local_sync *)base;
    DT_CHECK(dt_grad_sync_replicate(s->ddp));
    memcpy(s->anchor, s->core.params, s->core.n * sizeof(float));
    s->in_sync = true;
    return DT_OK;
}

/* Between averages the replicas differ by design. */
static dt_status local_check(dt_grad_sync *base, int64_t step) {
    local_sync *s = (local_sync *)base;
    return s->in_sync ? dt_grad_sync_check(s->ddp, step) : DT_OK;
}

static void local_cost(const dt_grad_sync *base, dt_sync_cost *out) {
    const local_sync *s = (const local_sync *)base;
    size_t floats = s->core.n + (s->sync_optim ? s->optim_floats : 0);
    out->coll = DT_COLL_ALLREDUCE;
    out->ranks = s->core.dp;
    out->bytes_per_step = (double)dt__local_ring_bytes(&s->core, floats) / (double)s->H;
    out->pieces = 1;
    out->state_bytes = (s->u ? 2 : 1) * s->core.n * sizeof(float);
}

static void local_layout(const dt_grad_sync *base, dt_sync_layout *out) {
    (void)base; /* replica 0's in the shared sections; each rank's own in its state */
    out->params_replicated = out->optim_replicated = true;
}

static size_t local_state_floats(const local_sync *s) {
    return dt__local_state_floats(&s->core) + (s->u ? 2 : 1) * s->core.n;
}

static size_t local_state_bytes(const dt_grad_sync *base) {
    return local_state_floats((const local_sync *)base) * sizeof(float);
}

static const char *local_state_ident(const dt_grad_sync *base) {
    return ((const local_sync *)base)->ident;
}

static dt_status local_get_state(const dt_grad_sync *base, void *buf, size_t len, float *unit) {
    const local_sync *s = (const local_sync *)base;
    if (len != local_state_bytes(base))
        return dt_error_set(DT_ERR_INVALID, "local SGD state: %zu bytes given, %zu needed", len,
                            local_state_bytes(base));
    float *f = buf;
    size_t own = dt__local_state_floats(&s->core), n = s->core.n;
    dt__local_state_get(&s->core, f);
    memcpy(f + own, s->anchor, n * sizeof(float));
    if (s->u)
        memcpy(f + own + n, s->u, n * sizeof(float));
    *unit = 1.0f; /* parameters and optimizer state carry no loss scale */
    return DT_OK;
}

static dt_status local_set_state(dt_grad_sync *base, const void *buf, size_t len, float unit) {
    local_sync *s = (local_sync *)base;
    (void)unit;
    if (len != local_state_bytes(base))
        return dt_error_set(DT_ERR_CORRUPT, "local SGD state: %zu bytes, %zu expected", len,
                            local_state_bytes(base));
    const float *f = buf;
    size_t own = dt__local_state_floats(&s->core), n = s->core.n;
    dt__local_state_set(&s->core, f);
    memcpy(s->anchor, f + own, n * sizeof(float));
    if (s->u)
        memcpy(s->u, f + own + n, n * sizeof(float));
    s->in_sync = false; /* a checkpoint may fall between averages */
    return DT_OK;
}

/* A resume that cannot restore the state starts a new period from the
 * replicated parameters. */
static void local_reset_state(dt_grad_sync *base) {
    local_sync *s = (local_sync *)base;
    memcpy(s->anchor, s->core.params, s->core.n * sizeof(float));
    if (s->u)
        memset(s->u, 0, s->core.n * sizeof(float));
    s->in_sync = true;
}

static void local_destroy(dt_grad_sync *base) {
    local_sync *s = (local_sync *)base;
    dt_grad_sync_destroy(s->ddp);
    dt__local_free(&s->core);
    dt_free(s->anchor);
    dt_free(s->u);
    dt_free(s);
}

static const dt__sync_ops local_ops = {
    .name = "local",
    .begin_step = local_begin_step,
    .begin_backward = local_begin_backward,
    .ready = local_ready,
    .finish = local_finish,
    .apply = local_apply,
    .replicate = local_replicate,
    .check = local_check,
    .cost = local_cost,
    .layout = local_layout,
    .state_bytes = local_state_bytes,
    .state_ident = local_state_ident,
    .get_state = local_get_state,
    .set_state = local_set_state,
    .reset_state = local_reset_state,
    .destroy = local_destroy,
    .apply_report = local_apply_report,
    .agrees = local_agrees,
};

static dt_status check_config(const dt_local_sync_config *c) {
    if (c->sync_every < 1)
        return dt_error_set(DT_ERR_INVALID, "--sync-every %" PRId64 ": must be >= 1",
                            c->sync_every);
    if (c->post_local_after < 0)
        return dt_error_set(DT_ERR_INVALID, "--post-local-after %" PRId64 ": must be >= 0",
                            c->post_local_after);
    if ((int)c->outer < 0 || c->outer >= DT_OUTER_COUNT)
        return dt_error_set(DT_ERR_INVALID, "--outer %d: sgd, slowmo or nesterov", (int)c->outer);
    if (!(c->outer_lr > 0) || !isfinite(c->outer_lr))
        return dt_error_set(DT_ERR_INVALID, "--outer-lr %g: must be > 0", c->outer_lr);
    if (!(c->outer_momentum >= 0 && c->outer_momentum < 1))
        return dt_error_set(DT_ERR_INVALID, "--outer-momentum %g: must be in [0, 1)",
                            c->outer_momentum);
    if (c->ddp.ddp.codec.kind != DT_CODEC_NONE || c->ddp.ddp.grad_dtype != DT_F32)
        return dt_error_set(DT_ERR_INVALID,
                            "--dp-mode local averages parameters: no gradient codec and fp32 "
                            "gradients only");
    return DT_OK;
}

dt_status dt_local_sync_create(dt_grad_sync **out, const dt_local_sync_config *c) {
    *out = NULL;
    DT_CHECK(check_config(c));
    local_sync *s = dt_calloc(1, sizeof *s);
    if (!s)
        return DT_ERR_NOMEM;
    s->base.ops = &local_ops;
    s->H = c->sync_every;
    s->post = c->post_local_after;
    s->total = c->total_steps;
    s->outer = c->outer;
    s->outer_lr = (float)c->outer_lr;
    s->beta = (float)c->outer_momentum;
    s->plain = c->outer == DT_OUTER_SGD && c->outer_lr == 1.0;
    s->sync_optim = c->sync_optim_state;
    s->in_sync = true;
    const dt_ddp_sync_config *d = &c->ddp;
    dt_status st;
    DT_CHECK_GOTO(dt__local_init(&s->core, "local SGD", d->group, d->params, d->grads, d->n, d->opt,
                                 d->norm_ranges, d->nnorm),
                  st, fail);
    DT_CHECK_GOTO(dt_ddp_sync_create(&s->ddp, d), st, fail);
    s->optim_floats = dt__local_state_floats(&s->core) - d->n;
    size_t bytes = (d->n ? d->n : 1) * sizeof(float);
    s->anchor = dt_alloc(bytes);
    if (c->outer != DT_OUTER_SGD)
        s->u = dt_calloc(1, bytes);
    if (!s->anchor || (c->outer != DT_OUTER_SGD && !s->u)) {
        st = dt_error_set(DT_ERR_NOMEM, "local SGD: anchor and outer momentum of %zu floats", d->n);
        goto fail;
    }
    memcpy(s->anchor, d->params, d->n * sizeof(float));
    snprintf(s->ident, sizeof s->ident,
             "local H=%" PRId64 " post=%" PRId64 " outer=%s lr=%g m=%g optim=%d ranks=%d", s->H,
             s->post, dt_outer_names[s->outer], c->outer_lr, c->outer_momentum, s->sync_optim,
             s->core.dp);
    *out = &s->base;
    return DT_OK;
fail:
    local_destroy(&s->base);
    return st;
}

/* The planner's view: one parameter allreduce every H steps, blocking
 * (after the update, before the next step's passes). */
void dt_local_sync_plan_cost(const dt_cost_query *q, dt_strategy_cost *out) {
    int64_t every = q->sync_every > 0 ? q->sync_every : 1;
    if (q->degree[DT_AXIS_DP] * q->degree[DT_AXIS_CP] <= 1)
        return;
    dt_strategy_cost_add(out, (dt_comm_cost){.coll = DT_COLL_ALLREDUCE,
                                             .axis = DT_AXIS_DP,
                                             .bytes = q->params * sizeof(float),
                                             .calls = 1.0 / (double)every,
                                             .what = "local SGD parameter average"});
}
