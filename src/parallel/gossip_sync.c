/*
 * gossip_sync.c — decentralised SGD (gossip) as a dt_grad_sync (parallel.h,
 * "Beyond synchronous data parallelism"; docs/async.md).
 *
 * Every replica steps its optimizer on its own gradients; after every
 * `every`-th step (mixing round r = (step + 1) / every - 1) it exchanges
 * parameters with its peers of round r, point to point, and mixes:
 *
 *     ring       w_i <- (w_{i-1} + w_i + w_{i+1}) / 3    (two replicas: pairwise)
 *     exp        w_i <- (w_i + w_j) / 2, j = i xor 2^(r mod log2 N)
 *     random     w_i <- (w_i + w_j) / 2, (i, j) a pair of round r's random
 *                perfect matching (the same on every replica: keyed by the
 *                seed and r); with N odd one replica sits the round out
 *     hypercube  the exp exchange for every k = 0 .. log2 N - 1 in turn:
 *                after them every replica holds the average
 *
 *     4 replicas, exp:   round 0: 0<->1 2<->3   round 1: 0<->2 1<->3   round 2: as 0
 *
 * The pairwise mix (w_i + w_j) / 2 is computed alike on both sides (float
 * addition commutes), so a pair leaves the round with equal parameters.
 * Each replica sends one vector per peer per round: the bytes per step do
 * not grow with the number of replicas (bar hypercube's log2 N). The last
 * step of the run averages over the whole group instead (one allreduce),
 * so the final model is one model.
 */
#include "local_core.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

const char *const dt_gossip_names[DT_GOSSIP_COUNT] = {"ring", "exp", "random", "hypercube"};

/* Steps between measurements of the consensus distance. */
#define CONSENSUS_EVERY 10
/* The tag of gossip's point-to-point messages. */
#define GOSSIP_TAG      0x6055

typedef struct gossip_sync {
    dt_grad_sync base;
    dt__local_core core;
    dt_gossip_topology topo;
    int64_t every, total;
    uint64_t seed;
    int log2n;           /* log2 of the group size (exp, hypercube) */
    float *recv[2];      /* (n) the peers' parameters of a round; NULL for one replica */
    int *perm;           /* (dp) the random topology's matching */
    dt_sync_result done; /* what apply() sent this step (apply_report) */
    char ident[96];
} gossip_sync;

static bool mixes_after(const gossip_sync *s, int64_t step) { return (step + 1) % s->every == 0; }
static bool averages_after(const gossip_sync *s, int64_t step) { return step + 1 == s->total; }

/* This replica's partner in round r of the random topology, or -1. */
static int random_partner(gossip_sync *s, int64_t round) {
    int n = s->core.dp, *p = s->perm;
    dt_rng rng;
    dt_rng_init(&rng, s->seed, dt_rng_stream_id(0, (uint64_t)round, DT_RNG_GOSSIP));
    for (int i = 0; i < n; i++)
        p[i] = i;
    for (int i = n - 1; i > 0; i--) { /* Fisher-Yates */
        int j = (int)dt_rng_below(&rng, (uint32_t)i + 1), t = p[i];
        p[i] = p[j];
        p[j] = t;
    }
    for (int k = 0; k + 1 < n; k += 2) {
        if (p[k] == s->core.replica)
            return p[k + 1];
        if (p[k + 1] == s->core.replica)
            return p[k];
    }
    return -1;
}

/* The peers of one exchange of round r (hypercube: of its exchange k). */
static int round_peers(gossip_sync *s, int64_t round, int k, int peers[2]) {
    int i = s->core.replica, n = s->core.dp;
    switch (s->topo) {
    case DT_GOSSIP_RING:
        peers[0] = (i + 1) % n;
        peers[1] = (i + n - 1) % n;
        return n == 2 ? 1 : 2;
    case DT_GOSSIP_EXP: peers[0] = i ^ (1 << (int)(round % s->log2n)); return 1;
    case DT_GOSSIP_RANDOM: peers[0] = random_partner(s, round); return peers[0] >= 0;
    case DT_GOSSIP_HYPERCUBE: peers[0] = i ^ (1 << k); return 1;
    case DT_GOSSIP_COUNT: break;
    }
    DT_ASSERT(!"gossip topology");
    return 0;
}

/* Vectors this replica sends in round r. */
static int round_sends(gossip_sync *s, int64_t round) {
    int peers[2];
    if (s->topo == DT_GOSSIP_HYPERCUBE)
        return s->log2n;
    return round_peers(s, round, 0, peers);
}

/* Send the parameters to the peers, receive theirs, mix. */
static dt_status exchange(gossip_sync *s, const int *peers, int np) {
    float *w = s->core.params;
    size_t n = s->core.n;
    dt_p2p ops[4];
    for (int j = 0; j < np; j++) {
        ops[2 * j] = (dt_p2p){.send = true,
                              .buf = w,
                              .count = n,
                              .dtype = DT_F32,
                              .peer = peers[j],
                              .tag = GOSSIP_TAG};
        ops[2 * j + 1] = (dt_p2p){.send = false,
                                  .buf = s->recv[j],
                                  .count = n,
                                  .dtype = DT_F32,
                                  .peer = peers[j],
                                  .tag = GOSSIP_TAG};
    }
    DT_CHECK(dt_group_sendrecv_batch(s->core.g, ops, 2 * (size_t)np));
    const float *a = s->recv[0], *b = s->recv[1];
    if (np == 1)
        for (size_t i = 0; i < n; i++)
            w[i] = 0.5f * (w[i] + a[i]);
    else
        for (size_t i = 0; i < n; i++)
            w[i] = (a[i] + w[i] + b[i]) * (1.0f / 3.0f);
    return DT_OK;
}

static dt_status mix(gossip_sync *s, int64_t round) {
    int peers[2];
    if (s->topo == DT_GOSSIP_HYPERCUBE) {
        for (int k = 0; k < s->log2n; k++) {
            round_peers(s, round, k, peers);
            DT_CHECK(exchange(s, peers, 1));
        }
        return DT_OK;
    }
    int np = round_peers(s, round, 0, peers);
    return np > 0 ? exchange(s, peers, np) : DT_OK;
}

/* (1/N) sum_i |w_i - mean|^2 over the group (two allreduces). */
static dt_status consensus(gossip_sync *s, double *out) {
    float *mean = s->recv[0], *w = s->core.params;
    size_t n = s->core.n;
    DT_CHECK(dt_group_allreduce(s->core.g, w, mean, n, DT_F32, DT_AVG));
    double d = 0;
    for (size_t i = 0; i < n; i++)
        d += (double)(w[i] - mean[i]) * (double)(w[i] - mean[i]);
    DT_CHECK(dt_group_allreduce(s->core.g, &d, &d, 1, DT_F64, DT_AVG));
    *out = d;
    return DT_OK;
}

static dt_status gossip_begin_step(dt_grad_sync *base, const dt_sync_step *st) {
    dt__local_begin_step(&((gossip_sync *)base)->core, st);
    return DT_OK;
}

static dt_grad_mode gossip_begin_backward(dt_grad_sync *base, bool last) {
    (void)last;
    return dt__local_begin_backward(&((gossip_sync *)base)->core);
}

static void gossip_ready(dt_grad_sync *base, size_t ready_from) {
    (void)base; /* nothing moves during backward */
    (void)ready_from;
}

/* The consensus measurement and the final average are the only global
 * collectives: the loop agrees on those steps only. */
static bool gossip_agrees(const dt_grad_sync *base, int64_t step) {
    return step % CONSENSUS_EVERY == 0 || averages_after((const gossip_sync *)base, step);
}

static dt_status gossip_finish(dt_grad_sync *base, dt_sync_result *out) {
    gossip_sync *s = (gossip_sync *)base;
    int64_t step = s->core.step.step;
    dt__local_finish(&s->core, gossip_agrees(base, step), out);
    if (s->core.dp > 1 && step % CONSENSUS_EVERY == 0)
        DT_CHECK(consensus(s, &out->consensus));
    return DT_OK;
}

static dt_status gossip_apply(dt_grad_sync *base, bool skip, float clip_scale) {
    gossip_sync *s = (gossip_sync *)base;
    int64_t step = s->core.step.step;
    memset(&s->done, 0, sizeof s->done);
    DT_CHECK(dt__local_apply(&s->core, skip, clip_scale));
    if (s->core.dp <= 1)
        return DT_OK;
    if (averages_after(s, step)) {
        s->done.bytes_sent = dt__local_ring_bytes(&s->core, s->core.n);
        s->done.collectives = 1;
        return dt__local_average(&s->core, s->core.params, s->core.n, &s->done.comm_ms);
    }
    if (!mixes_after(s, step))
        return DT_OK;
    int64_t round = (step + 1) / s->every - 1;
    int sends = round_sends(s, round);
    double t0 = dt_now();
    dt_status st = mix(s, round);
    s->done.comm_ms = (dt_now() - t0) * 1e3;
    s->done.bytes_sent = (uint64_t)sends * s->core.n * sizeof(float);
    s->done.collectives = sends;
    if (st != DT_OK)
        dt_error_prefix("gossip (%s) after step %" PRId64, dt_gossip_names[s->topo], step + 1);
    return st;
}

/* The exchange blocks: all of its time is exposed. */
static void gossip_apply_report(dt_grad_sync *base, dt_sync_result *out) {
    gossip_sync *s = (gossip_sync *)base;
    out->comm_ms += s->done.comm_ms;
    out->exposed_comm_ms += s->done.comm_ms;
    out->bytes_sent += s->done.bytes_sent;
    out->collectives += s->done.collectives;
}

static dt_status gossip_replicate(dt_grad_sync *base) {
    gossip_sync *s = (gossip_sync *)base;
    if (s->core.dp <= 1)
        return DT_OK;
    return dt_group_broadcast(s->core.g, s->core.params, s->core.n, DT_F32, 0);
}

/* The replicas differ by design; the consensus distance measures how much. */
static dt_status gossip_check(dt_grad_sync *base, int64_t step) {
    (void)base;
    (void)step;
    return DT_OK;
}

static void gossip_cost(const dt_grad_sync *base, dt_sync_cost *out) {
    const gossip_sync *s = (const gossip_sync *)base;
    int sends = s->topo == DT_GOSSIP_HYPERCUBE                ? s->log2n
                : s->topo == DT_GOSSIP_RING && s->core.dp > 2 ? 2
                                                              : 1;
    out->coll = DT_COLL_BATCH;
    out->ranks = s->core.dp;
    out->bytes_per_step =
        s->core.dp > 1 ? (double)sends * (double)(s->core.n * sizeof(float)) / (double)s->every : 0;
    out->pieces = 1;
    out->state_bytes = (s->recv[1] ? 2 : s->recv[0] ? 1 : 0) * s->core.n * sizeof(float);
}

static void gossip_layout(const dt_grad_sync *base, dt_sync_layout *out) {
    (void)base; /* replica 0's in the shared sections; each rank's own in its state */
    out->params_replicated = out->optim_replicated = true;
}

static size_t gossip_state_bytes(const dt_grad_sync *base) {
    return dt__local_state_floats(&((const gossip_sync *)base)->core) * sizeof(float);
}

static const char *gossip_state_ident(const dt_grad_sync *base) {
    return ((const gossip_sync *)base)->ident;
}

static dt_status gossip_get_state(const dt_grad_sync *base, void *buf, size_t len, float *unit) {
    if (len != gossip_state_bytes(base))
        return dt_error_set(DT_ERR_INVALID, "gossip state: %zu bytes given, %zu needed", len,
                            gossip_state_bytes(base));
    dt__local_state_get(&((const gossip_sync *)base)->core, buf);
    *unit = 1.0f;
    return DT_OK;
}

static dt_status gossip_set_state(dt_grad_sync *base, const void *buf, size_t len, float unit) {
    (void)unit;
    if (len != gossip_state_bytes(base))
        return dt_error_set(DT_ERR_CORRUPT, "gossip state: %zu bytes, %zu expected", len,
                            gossip_state_bytes(base));
    dt__local_state_set(&((gossip_sync *)base)->core, buf);
    return DT_OK;
}

/* Without its state every replica starts from the replicated parameters. */
static void gossip_reset_state(dt_grad_sync *base) { (void)base; }

static void gossip_destroy(dt_grad_sync *base) {
    gossip_sync *s = (gossip_sync *)base;
    dt__local_free(&s->core);
    dt_free(s->recv[0]);
    dt_free(s->recv[1]);
    dt_free(s->perm);
    dt_free(s);
}

static const dt__sync_ops gossip_ops = {
    .name = "gossip",
    .begin_step = gossip_begin_step,
    .begin_backward = gossip_begin_backward,
    .ready = gossip_ready,
    .finish = gossip_finish,
    .apply = gossip_apply,
    .replicate = gossip_replicate,
    .check = gossip_check,
    .cost = gossip_cost,
    .layout = gossip_layout,
    .state_bytes = gossip_state_bytes,
    .state_ident = gossip_state_ident,
    .get_state = gossip_get_state,
    .set_state = gossip_set_state,
    .reset_state = gossip_reset_state,
    .destroy = gossip_destroy,
    .apply_report = gossip_apply_report,
    .agrees = gossip_agrees,
};

dt_status dt_gossip_sync_create(dt_grad_sync **out, const dt_gossip_sync_config *c) {
    *out = NULL;
    if (c->every < 1)
        return dt_error_set(DT_ERR_INVALID, "--gossip-every %" PRId64 ": must be >= 1", c->every);
    if ((int)c->topology < 0 || c->topology >= DT_GOSSIP_COUNT)
        return dt_error_set(DT_ERR_INVALID, "--gossip-topology %d: ring, exp, random or hypercube",
                            (int)c->topology);
    int dp = c->group ? dt_group_size(c->group) : 1;
    bool pow2 = (dp & (dp - 1)) == 0;
    if ((c->topology == DT_GOSSIP_EXP || c->topology == DT_GOSSIP_HYPERCUBE) && !pow2)
        return dt_error_set(DT_ERR_INVALID,
                            "--gossip-topology %s with %d replicas: needs a power of two (use "
                            "ring or random)",
                            dt_gossip_names[c->topology], dp);
    gossip_sync *s = dt_calloc(1, sizeof *s);
    if (!s)
        return DT_ERR_NOMEM;
    s->base.ops = &gossip_ops;
    s->topo = c->topology;
    s->every = c->every;
    s->total = c->total_steps;
    s->seed = c->seed;
    while ((1 << s->log2n) < dp)
        s->log2n++;
    dt_status st;
    DT_CHECK_GOTO(dt__local_init(&s->core, "gossip", c->group, c->params, c->grads, c->n, c->opt,
                                 c->norm_ranges, c->nnorm),
                  st, fail);
    if (dp > 1) {
        size_t bytes = (c->n ? c->n : 1) * sizeof(float);
        bool two = c->topology == DT_GOSSIP_RING && dp > 2;
        s->recv[0] = dt_alloc(bytes);
        s->recv[1] = two ? dt_alloc(bytes) : NULL;
        s->perm = dt_calloc((size_t)dp, sizeof *s->perm);
        if (!s->recv[0] || (two && !s->recv[1]) || !s->perm) {
            st = dt_error_set(DT_ERR_NOMEM, "gossip: receive buffers of %zu floats", c->n);
            goto fail;
        }
    }
    snprintf(s->ident, sizeof s->ident, "gossip topology=%s every=%" PRId64 " ranks=%d",
             dt_gossip_names[s->topo], s->every, dp);
    *out = &s->base;
    return DT_OK;
fail:
    gossip_destroy(&s->base);
    return st;
}

/* The planner's view: every K steps, a parameter vector to each peer of
 * the round (point to point, blocking; the pairs run at once). */
void dt_gossip_sync_plan_cost(const dt_cost_query *q, dt_strategy_cost *out) {
    int64_t every = q->sync_every > 0 ? q->sync_every : 1;
    int vectors = q->gossip_vectors > 0 ? q->gossip_vectors : 1;
    if (q->degree[DT_AXIS_DP] * q->degree[DT_AXIS_CP] <= 1)
        return;
    dt_strategy_cost_add(out, (dt_comm_cost){.coll = DT_COLL_SEND,
                                             .axis = DT_AXIS_DP,
                                             .bytes = q->params * sizeof(float),
                                             .calls = (double)vectors / (double)every,
                                             .what = "gossip parameter exchange"});
}
