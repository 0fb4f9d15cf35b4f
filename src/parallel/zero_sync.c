/*
 * zero_sync.c — ZeRO as a dt_grad_sync (docs/zero.md): the bucket engine
 * (ddp.c) in its sharded mode, each bucket reduce-scattered so that every
 * data-parallel replica gets the average of its piece only, and an
 * optimizer that owns (and keeps state for) exactly those pieces.
 *
 * Per step:
 *   backward      buckets are reduce-scattered as they become final
 *                 (overlapping backward, as DDP's allreduces do);
 *   finish        per piece, in bucket order: unscale (loss scaling, the
 *                 inf/nan check), the sum of squares (every element is
 *                 counted by its owner, restricted to the tensors this
 *                 model-parallel rank owns), and with update_early the
 *                 optimizer's update of the piece and the start of the
 *                 bucket's parameter allgather;
 *   apply         otherwise clip-scale and update every piece, then
 *                 allgather every bucket; wait for the gathers, so that
 *                 every replica holds the whole updated parameters again.
 *
 * Stage 1 shards the optimizer state; the gradient buffer stays whole.
 * Stage 2 shards the gradients: the engine returns the memory of each
 * bucket's gradient outside this replica's piece as soon as its
 * reduce-scatter completed, and with several micro-batches every one is
 * reduce-scattered (so every backward overwrites the buffer), its pieces
 * added into `acc` at the next begin_backward and added back into the
 * buffer's pieces at the last one:
 *
 *     mb 0:   backward -> reduce-scatter -> acc  = pieces
 *     mb 1:   backward -> reduce-scatter -> acc += pieces
 *     mb K-1: backward -> reduce-scatter -> pieces += acc -> the update
 *
 * Stage 3 shards the parameters too (fp32): a replica keeps only its
 * pieces; the model's parameter hooks (nn.h) fetch the buckets a block
 * reads (an allgather each, the next block's prefetched while this one
 * runs) and release them after, when the pages outside this replica's
 * pieces go back to the system (reference counted: a bucket may span two
 * blocks). Updated pieces stay where they are: no gather after the step.
 */
#include "dtrain/amp.h"
#include "sync_internal.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

typedef struct zero_sync {
    dt_grad_sync base;
    dt_ddp *d;
    int stage;
    int replica, dp; /* this rank in the dp group, and its size */
    float *params;   /* (n) borrowed */
    float *grads;    /* (n) borrowed */
    size_t n;
    dt_optimizer *opt;    /* borrowed: owns this replica's pieces */
    dt__norm_ranges norm; /* ranges counted in the norm */
    char ident[96];
    /* Stage 2 with several micro-batches (see the file comment). */
    float *acc;       /* (owned count): the shard sum of earlier micro-batches; NULL: accum 1 */
    size_t *acc_off;  /* (buckets) where bucket i's piece starts in acc */
    int folded;       /* micro-batches added into acc this step */
    bool pending;     /* a micro-batch's reduce-scatters are in flight, not yet in acc */
    int backwards;    /* begin_backward calls this step */
    dt_ddp_stats sum; /* the communication of the rounds already folded */
    /* Stage 3: each bucket's parameter residency. */
    int *refs;       /* (buckets) fetches not yet released */
    bool *resident;  /* (buckets) gathered (whole) */
    bool *gathering; /* (buckets) its gather in flight */
    dt_param_hooks hooks;
    /* Per step. */
    dt_sync_step step;
    float inv_scale;
    size_t bucket; /* pieces seen by on_piece this step */
    double sumsq;
    bool found_inf;
    dt_status err; /* a gather that failed to start in on_piece */
} zero_sync;

static dt_status zero_begin_step(dt_grad_sync *base, const dt_sync_step *st) {
    zero_sync *s = (zero_sync *)base;
    s->step = *st;
    s->inv_scale = 1.0f / st->loss_scale;
    s->sumsq = 0;
    s->found_inf = false;
    s->bucket = 0;
    s->err = DT_OK;
    s->folded = 0;
    s->pending = false;
    s->backwards = 0;
    memset(&s->sum, 0, sizeof s->sum);
    return DT_OK;
}

/* Stage 2: a micro-batch's averaged piece of bucket i into acc. */
static void fold_piece(void *user, size_t begin, size_t end) {
    zero_sync *s = user;
    float *a = s->acc + s->acc_off[s->bucket++], *g = s->grads + begin;
    if (s->folded == 0)
        memcpy(a, g, (end - begin) * sizeof(float));
    else
        for (size_t j = 0; j < end - begin; j++)
            a[j] += g[j];
}

static dt_grad_mode zero_begin_backward(dt_grad_sync *base, bool last) {
    zero_sync *s = (zero_sync *)base;
    int k = s->backwards++;
    if (s->stage == 1) {
        dt_ddp_begin(s->d, last);
        return k == 0 ? DT_GRAD_OVERWRITE : DT_GRAD_ACCUMULATE;
    }
    /* Stage 2: the previous micro-batch's pieces into acc before this
     * backward overwrites the buffer; then this one is reduced too. */
    if (s->pending) {
        s->bucket = 0;
        dt_status st = dt_ddp_finish(s->d, fold_piece, s);
        if (st != DT_OK && s->err == DT_OK)
            s->err = st;
        const dt_ddp_stats *ds = dt_ddp_last_stats(s->d);
        s->sum.comm_ms += ds->comm_ms;
        s->sum.exposed_comm_ms += ds->exposed_comm_ms;
        s->sum.bytes_sent += ds->bytes_sent;
        s->sum.buckets += ds->buckets;
        s->sum.launched_in_backward += ds->launched_in_backward;
        s->pending = false;
        s->folded++;
    }
    if (!last && !s->acc && s->err == DT_OK)
        s->err = dt_error_set(DT_ERR_INVALID,
                              "ZeRO stage 2 was created for one micro-batch per step (accum 1)");
    dt_ddp_begin(s->d, true);
    s->pending = !last;
    return DT_GRAD_OVERWRITE;
}

static void zero_ready(dt_grad_sync *base, size_t ready_from) {
    dt_ddp_grad_ready(((zero_sync *)base)->d, ready_from);
}

/* This replica's averaged piece of each bucket, in bucket order. */
static void on_piece(void *user, size_t begin, size_t end) {
    zero_sync *s = user;
    size_t i = s->bucket++;
    if (s->folded > 0) { /* stage 2: the earlier micro-batches' sum */
        const float *a = s->acc + s->acc_off[i];
        float *g = s->grads + begin;
        for (size_t j = 0; j < end - begin; j++)
            g[j] += a[j];
    }
    if (s->step.loss_scaling)
        s->found_inf |= dt_unscale(s->grads + begin, end - begin, s->inv_scale);
    s->sumsq += dt__norm_ranges_sumsq(&s->norm, s->grads, begin, end);
    if (!s->step.update_early)
        return;
    dt_optimizer_update(s->opt, s->params, s->grads, begin, end);
    if (s->stage >= 3)
        return; /* the parameters stay sharded until a block fetches them */
    dt_status st = dt_ddp_gather(s->d, i);
    if (st != DT_OK && s->err == DT_OK)
        s->err = st;
}

static dt_status zero_finish(dt_grad_sync *base, dt_sync_result *out) {
    zero_sync *s = (zero_sync *)base;
    DT_CHECK(s->err);
    s->bucket = 0;
    DT_CHECK(dt_ddp_finish(s->d, on_piece, s));
    DT_CHECK(s->err);
    const dt_ddp_stats *ds = dt_ddp_last_stats(s->d);
    out->sumsq = s->sumsq;
    out->found_inf = s->found_inf;
    out->updated = s->step.update_early;
    out->comm_ms = ds->comm_ms + s->sum.comm_ms;
    out->exposed_comm_ms = ds->exposed_comm_ms + s->sum.exposed_comm_ms;
    /* The reduce-scatters' bytes, and the gather's (as many as one). */
    out->bytes_sent = 2 * ds->bytes_sent + s->sum.bytes_sent;
    out->collectives = 2 * ds->buckets + s->sum.buckets;
    out->launched_in_backward = ds->launched_in_backward + s->sum.launched_in_backward;
    return DT_OK;
}

static dt_status drop_all(zero_sync *s);

static dt_status zero_apply(dt_grad_sync *base, bool skip, float clip_scale) {
    zero_sync *s = (zero_sync *)base;
    if (!skip && !s->step.update_early) {
        /* Every piece (one step over the owned ranges: an optimizer with
         * per-tensor statistics sums their pieces over the replicas there),
         * then every bucket's gather (in bucket order, the same on every
         * replica). */
        size_t nb = dt_optimizer_num_owned(s->opt);
        for (size_t k = 0; clip_scale != 1.0f && k < nb; k++) {
            dt_range r = dt_optimizer_owned(s->opt, k);
            dt_scale(s->grads + r.begin, r.end - r.begin, clip_scale);
        }
        DT_CHECK(dt_optimizer_step(s->opt, s->params, s->grads));
        for (size_t i = 0; s->stage < 3 && i < dt_ddp_num_buckets(s->d); i++)
            DT_CHECK(dt_ddp_gather(s->d, i));
    }
    /* A skipped step changed nothing: every replica still holds the same
     * parameters. Stage 3: back to the shards (what was prefetched). */
    if (s->stage >= 3)
        return drop_all(s);
    return dt_ddp_gather_wait(s->d);
}

/* ------------------------------------------------------------------------ */
/* Stage 3: parameters fetched per block                                    */
/* ------------------------------------------------------------------------ */

/* Call fn(s, i) on each bucket that intersects [begin, end), from the end
 * of the buffer (bucket order). */
static dt_status for_buckets(zero_sync *s, size_t begin, size_t end,
                             dt_status (*fn)(zero_sync *s, size_t i)) {
    for (size_t i = 0; i < dt_ddp_num_buckets(s->d); i++) {
        size_t b, e;
        dt_ddp_bucket(s->d, i, &b, &e);
        if (b < end && e > begin)
            DT_CHECK(fn(s, i));
    }
    return DT_OK;
}

static dt_status start_gather(zero_sync *s, size_t i) {
    if (s->resident[i] || s->gathering[i])
        return DT_OK;
    s->gathering[i] = true;
    return dt_ddp_gather(s->d, i);
}

static dt_status finish_gather(zero_sync *s, size_t i) {
    if (!s->gathering[i])
        return DT_OK;
    s->gathering[i] = false;
    s->resident[i] = true;
    return dt_ddp_gather_wait_bucket(s->d, i);
}

static dt_status take(zero_sync *s, size_t i) {
    s->refs[i]++;
    return start_gather(s, i);
}

/* Bucket i back to this replica's piece if nothing uses it. */
static void drop_if_unused(zero_sync *s, size_t i) {
    if (s->refs[i] == 0 && s->resident[i]) {
        dt_ddp_release_params(s->d, i);
        s->resident[i] = false;
    }
}

static dt_status give_back(zero_sync *s, size_t i) {
    DT_ASSERT(s->refs[i] > 0);
    s->refs[i]--;
    drop_if_unused(s, i);
    return DT_OK;
}

/* Every bucket's gather issued in one order on every replica: the model's
 * calls are the same everywhere. */
static dt_status hook_fetch(void *user, size_t begin, size_t end) {
    zero_sync *s = user;
    DT_CHECK(for_buckets(s, begin, end, take));
    return for_buckets(s, begin, end, finish_gather);
}

static void hook_prefetch(void *user, size_t begin, size_t end) {
    zero_sync *s = user;
    dt_status st = for_buckets(s, begin, end, start_gather);
    if (st != DT_OK && s->err == DT_OK)
        s->err = st; /* a failed gather fails the fetch that waits for it */
}

static void hook_release(void *user, size_t begin, size_t end) {
    (void)for_buckets(user, begin, end, give_back);
}

/* Back to the shards: buckets prefetched but not fetched, or fetched
 * whole for a moment. */
static dt_status drop_all(zero_sync *s) {
    for (size_t i = 0; i < dt_ddp_num_buckets(s->d); i++) {
        DT_CHECK(finish_gather(s, i));
        drop_if_unused(s, i);
    }
    return DT_OK;
}

static dt_status zero_gather_params(dt_grad_sync *base, bool whole) {
    zero_sync *s = (zero_sync *)base;
    if (s->stage < 3)
        return DT_OK;
    if (whole)
        return hook_fetch(s, 0, s->n);
    hook_release(s, 0, s->n);
    return drop_all(s);
}

static const dt_param_hooks *zero_param_hooks(const dt_grad_sync *base) {
    const zero_sync *s = (const zero_sync *)base;
    return s->stage >= 3 ? &s->hooks : NULL;
}

static dt_status zero_replicate(dt_grad_sync *base) {
    zero_sync *s = (zero_sync *)base;
    if (s->stage < 3)
        return dt_ddp_broadcast_params(s->d);
    /* Stage 3: replica 0's values, whole everywhere; then each keeps its
     * pieces. */
    DT_CHECK(dt_ddp_broadcast_params(s->d));
    for (size_t i = 0; i < dt_ddp_num_buckets(s->d); i++)
        s->resident[i] = true;
    return drop_all(s);
}

static dt_status zero_check(dt_grad_sync *base, int64_t step) {
    zero_sync *s = (zero_sync *)base;
    DT_CHECK(zero_gather_params(base, true));
    dt_status st = dt_ddp_check_params(s->d, step);
    dt_status st2 = zero_gather_params(base, false);
    return st != DT_OK ? st : st2;
}

static void zero_cost(const dt_grad_sync *base, dt_sync_cost *out) {
    const zero_sync *s = (const zero_sync *)base;
    out->coll = DT_COLL_REDUCE_SCATTER;
    out->ranks = s->dp;
    out->bytes_per_step = 2.0 * (double)dt_ddp_step_bytes(s->d);
    out->pieces = 2 * (int)dt_ddp_num_buckets(s->d);
    out->overlapped = true;
    out->state_bytes = 0;
}

static void zero_layout(const dt_grad_sync *base, dt_sync_layout *out) {
    const zero_sync *s = (const zero_sync *)base;
    out->params_replicated = s->stage < 3;
    out->optim_replicated = false;
    out->params_sharded = s->stage >= 3;
}

static size_t zero_state_bytes(const dt_grad_sync *base) {
    (void)base;
    return 0;
}

static const char *zero_state_ident(const dt_grad_sync *base) {
    return ((const zero_sync *)base)->ident;
}

static dt_status zero_get_state(const dt_grad_sync *base, void *buf, size_t len, float *unit) {
    (void)base, (void)buf, (void)len;
    *unit = 1.0f;
    return DT_OK;
}

static dt_status zero_set_state(dt_grad_sync *base, const void *buf, size_t len, float unit) {
    (void)base, (void)buf, (void)unit;
    if (len != 0)
        return dt_error_set(DT_ERR_INVALID, "ZeRO keeps no state of its own (%zu bytes given)",
                            len);
    return DT_OK;
}

static void zero_reset_state(dt_grad_sync *base) { (void)base; }

static void zero_destroy(dt_grad_sync *base) {
    zero_sync *s = (zero_sync *)base;
    dt_ddp_destroy(s->d);
    dt_free(s->acc);
    dt_free(s->acc_off);
    dt_free(s->refs);
    dt_free(s->resident);
    dt_free(s->gathering);
    dt__norm_ranges_free(&s->norm);
    dt_free(s);
}

static const dt__sync_ops zero_ops = {
    .name = "zero",
    .begin_step = zero_begin_step,
    .begin_backward = zero_begin_backward,
    .ready = zero_ready,
    .finish = zero_finish,
    .apply = zero_apply,
    .replicate = zero_replicate,
    .check = zero_check,
    .cost = zero_cost,
    .layout = zero_layout,
    .state_bytes = zero_state_bytes,
    .state_ident = zero_state_ident,
    .get_state = zero_get_state,
    .set_state = zero_set_state,
    .reset_state = zero_reset_state,
    .destroy = zero_destroy,
    .param_hooks = zero_param_hooks,
    .gather_params = zero_gather_params,
};

dt_status dt_zero_sync_create(dt_grad_sync **out, const dt_zero_sync_config *c) {
    *out = NULL;
    if (!c->opt || !c->params || !c->grads)
        return dt_error_set(DT_ERR_INVALID, "ZeRO: params, grads and optimizer are required");
    if (c->stage < 1 || c->stage > 3)
        return dt_error_set(DT_ERR_INVALID, "ZeRO stage %d: the stages are 1, 2 and 3", c->stage);
    if (c->accum < 1)
        return dt_error_set(DT_ERR_INVALID, "ZeRO: accum %d must be >= 1", c->accum);
    int dp = c->group ? dt_group_size(c->group) : 1,
        replica = c->group ? dt_group_rank(c->group) : 0;
    /* The optimizer must own exactly this replica's pieces. */
    size_t nb = dt_ddp_shard_count(c->n, c->bucket_bytes, dp);
    dt_range *mine = dt_calloc(nb + 1, sizeof *mine);
    if (!mine)
        return DT_ERR_NOMEM;
    dt_ddp_shard_ranges(c->n, c->bucket_bytes, dp, replica, mine);
    bool same = dt_optimizer_num_owned(c->opt) == nb;
    for (size_t k = 0; same && k < nb; k++) {
        dt_range r = dt_optimizer_owned(c->opt, k);
        same = r.begin == mine[k].begin && r.end == mine[k].end;
    }
    if (!same) {
        dt_free(mine);
        return dt_error_set(DT_ERR_INVALID,
                            "ZeRO: the optimizer must own replica %d's piece of every bucket "
                            "(dt_ddp_shard_ranges)",
                            replica);
    }
    zero_sync *s = dt_calloc(1, sizeof *s);
    if (!s) {
        dt_free(mine);
        return DT_ERR_NOMEM;
    }
    /* Stage 2 with several micro-batches: bucket i's piece is mine[nb - 1 - i]. */
    if (c->stage >= 2 && c->accum > 1) {
        s->acc = dt_alloc((dt_optimizer_owned_count(c->opt) + 1) * sizeof(float));
        s->acc_off = dt_calloc(nb + 1, sizeof *s->acc_off);
        size_t off = 0;
        for (size_t k = 0; s->acc_off && k < nb; k++) {
            s->acc_off[nb - 1 - k] = off;
            off += mine[k].end - mine[k].begin;
        }
    }
    dt_free(mine);
    if (c->stage >= 2 && c->accum > 1 && (!s->acc || !s->acc_off)) {
        zero_destroy(&s->base);
        return DT_ERR_NOMEM;
    }
    s->base.ops = &zero_ops;
    s->stage = c->stage;
    s->replica = replica;
    s->dp = dp;
    s->params = c->params;
    s->grads = c->grads;
    s->n = c->n;
    s->opt = c->opt;
    dt_status st;
    DT_CHECK_GOTO(dt__norm_ranges_init(&s->norm, c->norm_ranges, c->nnorm, c->n), st, fail);
    dt_ddp_options o = dt_ddp_options_default();
    o.bucket_bytes = c->bucket_bytes;
    o.shard = true;
    o.release = c->stage >= 2;
    DT_CHECK_GOTO(dt_ddp_create_with(&s->d, c->group, c->params, c->grads, c->n, &o), st, fail);
    if (c->stage >= 3) {
        size_t nbk = dt_ddp_num_buckets(s->d) + 1;
        s->refs = dt_calloc(nbk, sizeof *s->refs);
        s->resident = dt_calloc(nbk, sizeof *s->resident);
        s->gathering = dt_calloc(nbk, sizeof *s->gathering);
        if (!s->refs || !s->resident || !s->gathering) {
            st = DT_ERR_NOMEM;
            goto fail;
        }
        /* Until replicate() makes them shards, every bucket is whole. */
        for (size_t i = 0; i + 1 < nbk; i++)
            s->resident[i] = true;
        s->hooks = (dt_param_hooks){s, hook_fetch, hook_prefetch, hook_release};
    }
    snprintf(s->ident, sizeof s->ident, "zero %d buckets=%zu ranks=%d", s->stage,
             dt_ddp_num_buckets(s->d), dp);
    *out = &s->base;
    return DT_OK;
fail:
    zero_destroy(&s->base);
    return st;
}

/* The planner's view (parallel.h, "Planning costs"), following the file
 * comment: buckets reduce-scattered during backward (stage 1: the last
 * micro-batch's; stages 2 and 3: every micro-batch's); stages 1 and 2
 * allgather the updated parameters after the update (not overlapped);
 * stage 3 allgathers each block's buckets before its forward and again
 * before its backward, the next block's prefetched while one runs. */
void dt_zero_sync_plan_cost(const dt_cost_query *q, dt_strategy_cost *out) {
    double bytes = q->params * sizeof(float), buckets = ceil(bytes / (double)q->bucket_bytes);
    if (q->degree[DT_AXIS_DP] * q->degree[DT_AXIS_CP] <= 1 || buckets < 1)
        return;
    const bool every_micro = q->zero >= 2, sharded_params = q->zero >= 3;
    dt_strategy_cost_add(out, (dt_comm_cost){.coll = DT_COLL_REDUCE_SCATTER,
                                             .axis = DT_AXIS_DP,
                                             .bytes = bytes / buckets,
                                             .calls = buckets,
                                             .per_micro = every_micro,
                                             .backward = true,
                                             .overlapped = true,
                                             .what = "zero gradient reduce-scatter"});
    if (!sharded_params) {
        dt_strategy_cost_add(out,
                             (dt_comm_cost){.coll = DT_COLL_ALLGATHER,
                                            .axis = DT_AXIS_DP,
                                            .bytes = bytes / buckets,
                                            .calls = buckets,
                                            .what = "zero parameter allgather after the update"});
        return;
    }
    for (int pass = 0; pass < 2; pass++)
        dt_strategy_cost_add(out,
                             (dt_comm_cost){.coll = DT_COLL_ALLGATHER,
                                            .axis = DT_AXIS_DP,
                                            .bytes = bytes / buckets,
                                            .calls = buckets,
                                            .per_micro = true,
                                            .backward = pass == 1,
                                            .overlapped = true,
                                            .what = pass ? "zero-3 parameter gather (backward)"
                                                         : "zero-3 parameter gather (forward)"});
}
