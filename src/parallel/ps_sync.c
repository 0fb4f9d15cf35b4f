/*
 * ps_sync.c — an asynchronous parameter server with SSP bounded staleness
 * and delay compensation as a dt_grad_sync (parallel.h, "Parameter
 * server"; docs/async.md).
 *
 * Layout (BytePS-style, on the training ranks): the flat parameter buffer
 * is cut into K equal shards; rank k < K hosts the server of shard k in a
 * thread of its own, and every rank is a worker. Every (worker, server)
 * pair of different ranks has two 2-rank groups split from the world: one
 * for pushes (worker -> server) and one for replies (server -> worker), so
 * a server's posted receive never queues in front of its reply (a group
 * runs its operations in issue order). A worker talks to the server on its
 * own rank through memory.
 *
 * Per step t of worker w, in apply() (after the loop's clipping):
 *
 *   worker: push {t, lr} + gradient shard k to every server k; wait for
 *           every reply {tau} + parameter shard k
 *   server: g' = g                          (none)
 *              = g / (1 + tau)              (seed: the seeds' rule)
 *              = g + lambda g*g*(w - w_w)   (dcasgd; w_w: what w last read)
 *           w -= lr / W * g'                (each push is 1/W of a step)
 *           clock[w] = t + 1; reply to w once min(clock) >= t + 1 - S
 *
 * tau is the step's staleness: t minus the slowest worker's clock when w
 * read the parameters it used. The reply rule (SSP) makes tau <= S, which
 * every server asserts for every update it applies and records in a
 * histogram. The last step is a meeting: every server then gives its
 * shard to every rank (a broadcast), so all end with the same parameters.
 *
 * Not reproducible bit for bit (updates apply in arrival order); the
 * server steps plain SGD; no intermediate checkpoint is consistent across
 * servers (each rank holds the shards it last read). A dead peer fails the
 * pair's transfer (DT_ERR_PEER), reported with both world ranks.
 */
#include "sync_internal.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

const char *const dt_delay_comp_names[DT_DELAY_COMP_COUNT] = {"none", "seed", "dcasgd"};

#define PS_TAG 0x5053
#define HDR    4 /* int64 header: step, lr bits, tau, 0 */

void dt_ps_delay_compensate(dt_delay_comp kind, float lambda, int64_t tau, float *g,
                            const float *w_now, const float *w_then, size_t n) {
    switch (kind) {
    case DT_DELAY_COMP_NONE: return;
    case DT_DELAY_COMP_SEED: {
        float s = 1.0f / (1.0f + (float)tau);
        for (size_t i = 0; i < n; i++)
            g[i] *= s;
        return;
    }
    case DT_DELAY_COMP_DCASGD:
        for (size_t i = 0; i < n; i++)
            g[i] += lambda * g[i] * g[i] * (w_now[i] - w_then[i]);
        return;
    case DT_DELAY_COMP_COUNT: break;
    }
    DT_ASSERT(!"delay compensation kind");
}

typedef struct ps_server {
    size_t begin, len;        /* its shard of the flat buffer */
    float *w;                 /* (len) the parameters */
    float *then;              /* (W x len) dcasgd: what each worker last read */
    float *grad;              /* (W x len) receive buffers */
    int64_t *hdr;             /* (W x HDR) receive buffers */
    int64_t *clock;           /* (W) pushes applied: the next step of each worker */
    int64_t *read_at;         /* (W) min(clock) when each worker last read */
    int64_t *tau;             /* (W) the staleness of each worker's last push */
    bool *waiting;            /* (W) a reply is due once SSP allows */
    dt_work **posted;         /* (W) the receive of each remote worker's next header */
    int64_t hist[DT_PS_HIST]; /* staleness counts (the last bin: >= DT_PS_HIST - 1) */
    uint64_t sent;            /* reply bytes sent and not yet reported by this rank's worker */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t thread;
    bool started;
    dt_status err;
    char msg[256];
} ps_server;

typedef struct ps_sync {
    dt_grad_sync base;
    dt_group *world; /* borrowed: the replica group */
    int rank, W, K;
    float *params, *grads; /* (n) borrowed */
    size_t n;
    dt__norm_ranges norm;
    dt_delay_comp comp;
    float lambda;
    int64_t S, total;
    size_t *shard_begin; /* (K + 1) */
    dt_group **push;     /* (K) this worker's push group to server k (NULL: local) */
    dt_group **reply;    /* (K) and its reply group */
    dt_group **spush;    /* (W) this server's push group from worker w (NULL: local or none) */
    dt_group **sreply;   /* (W) */
    ps_server *srv;      /* this rank's server, NULL if rank >= K */
    /* Per step. */
    dt_sync_step step;
    int backwards;
    int64_t hdr_out[HDR];
    int64_t *hdr_in; /* (K x HDR) replies */
    dt_sync_result done;
    int64_t max_tau; /* this step's, over the servers */
    char ident[96];
} ps_sync;

static int64_t min_clock(const ps_server *v, int W) {
    int64_t m = INT64_MAX;
    for (int w = 0; w < W; w++)
        m = v->clock[w] < m ? v->clock[w] : m;
    return m;
}

/* Apply worker w's push of step t (under mu). */
static void server_apply(ps_sync *s, ps_server *v, int w, int64_t t, float lr, float *g) {
    int64_t tau = t - v->read_at[w];
    DT_ASSERT(tau >= 0 && tau <= s->S); /* SSP: never applied staler than S */
    v->hist[tau < DT_PS_HIST ? tau : DT_PS_HIST - 1]++;
    dt_ps_delay_compensate(s->comp, s->lambda, tau, g, v->w, v->then + (size_t)w * v->len, v->len);
    float step = lr / (float)s->W;
    for (size_t i = 0; i < v->len; i++)
        v->w[i] -= step * g[i];
    v->clock[w] = t + 1;
    v->waiting[w] = true;
    v->tau[w] = tau; /* for the reply */
}

/* Whether worker w's reply may go (SSP, under mu). */
static bool reply_allowed(const ps_sync *s, const ps_server *v, int w) {
    return v->waiting[w] && min_clock(v, s->W) >= v->clock[w] - s->S;
}

/* Mark the read worker w makes now (under mu). */
static void note_read(ps_sync *s, ps_server *v, int w) {
    v->waiting[w] = false;
    v->read_at[w] = min_clock(v, s->W);
    if (s->comp == DT_DELAY_COMP_DCASGD)
        memcpy(v->then + (size_t)w * v->len, v->w, v->len * sizeof(float));
}

static dt_status post_header(ps_sync *s, ps_server *v, int w) {
    return dt_group_irecv(s->spush[w], v->hdr + (size_t)w * HDR, HDR, DT_I64, 0, PS_TAG,
                          &v->posted[w]);
}

static void sleep_us(long us) {
    struct timespec ts = {0, us * 1000};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

/* The server thread: serve the remote workers until every worker pushed
 * its last step and got its reply. */
static void *server_main(void *arg) {
    ps_sync *s = arg;
    ps_server *v = s->srv;
    dt_status st = DT_OK;
    int bad = -1;
    for (int w = 0; w < s->W && st == DT_OK; w++)
        if (s->spush[w] && (st = post_header(s, v, w)) != DT_OK)
            bad = w;
    for (;;) {
        bool busy = false, left = false;
        for (int w = 0; w < s->W && st == DT_OK; w++) {
            if (!s->spush[w])
                continue;
            bool got = false;
            if (v->posted[w] && (st = dt_work_test(v->posted[w], &got)) == DT_OK && got) {
                st = dt_work_wait(v->posted[w]);
                v->posted[w] = NULL;
                float *g = v->grad + (size_t)w * v->len;
                if (st == DT_OK)
                    st = dt_group_recv(s->spush[w], g, v->len, DT_F32, 0, PS_TAG);
                if (st == DT_OK) {
                    int64_t t = v->hdr[(size_t)w * HDR];
                    float lr;
                    memcpy(&lr, &v->hdr[(size_t)w * HDR + 1], sizeof lr);
                    pthread_mutex_lock(&v->mu);
                    server_apply(s, v, w, t, lr, g);
                    pthread_cond_broadcast(&v->cv);
                    pthread_mutex_unlock(&v->mu);
                    if (t + 1 < s->total)
                        st = post_header(s, v, w);
                }
                busy = true;
            }
            if (st != DT_OK) {
                bad = w;
                break;
            }
            pthread_mutex_lock(&v->mu);
            bool go = reply_allowed(s, v, w);
            if (go)
                note_read(s, v, w);
            int64_t hdr[HDR] = {v->clock[w], 0, v->tau[w], 0};
            float *copy = go ? v->grad + (size_t)w * v->len : NULL; /* its buffer is free */
            if (go)
                memcpy(copy, v->w, v->len * sizeof(float));
            left |= v->clock[w] < s->total || v->waiting[w];
            pthread_mutex_unlock(&v->mu);
            if (go) {
                st = dt_group_send(s->sreply[w], hdr, HDR, DT_I64, 0, PS_TAG);
                if (st == DT_OK)
                    st = dt_group_send(s->sreply[w], copy, v->len, DT_F32, 0, PS_TAG);
                pthread_mutex_lock(&v->mu);
                v->sent += HDR * sizeof(int64_t) + v->len * sizeof(float);
                pthread_mutex_unlock(&v->mu);
                if (st != DT_OK) {
                    bad = w;
                    break;
                }
                busy = true;
            }
        }
        if (st != DT_OK || !left)
            break;
        if (!busy)
            sleep_us(50);
    }
    if (st != DT_OK) {
        /* Fail the other pairs at once, so that no worker waits for a
         * reply until DT_TIMEOUT. */
        for (int w = 0; w < s->W; w++)
            if (s->spush[w] && w != bad) {
                dt_group_abort(s->spush[w]);
                dt_group_abort(s->sreply[w]);
            }
    }
    pthread_mutex_lock(&v->mu);
    if (st != DT_OK) {
        v->err = st;
        snprintf(v->msg, sizeof v->msg,
                 "parameter server of shard %d (rank %d) serving worker "
                 "rank %d: %s",
                 s->rank, s->rank, bad, dt_last_error());
        /* The local worker may wait for an SSP reply that will not come. */
        pthread_cond_broadcast(&v->cv);
    }
    pthread_mutex_unlock(&v->mu);
    return NULL;
}

static dt_status ps_begin_step(dt_grad_sync *base, const dt_sync_step *st) {
    ps_sync *s = (ps_sync *)base;
    s->step = *st;
    s->backwards = 0;
    ps_server *v = s->srv;
    if (v && !v->started) {
        /* The clocks start at the first step run (a resumed run's too). */
        for (int w = 0; w < s->W; w++)
            v->clock[w] = v->read_at[w] = st->step;
        if (pthread_create(&v->thread, NULL, server_main, s) != 0)
            return dt_error_set(DT_ERR_SYSTEM, "parameter server: cannot start its thread");
        v->started = true;
    }
    return DT_OK;
}

static dt_grad_mode ps_begin_backward(dt_grad_sync *base, bool last) {
    (void)last;
    ps_sync *s = (ps_sync *)base;
    return s->backwards++ == 0 ? DT_GRAD_OVERWRITE : DT_GRAD_ACCUMULATE;
}

static void ps_ready(dt_grad_sync *base, size_t ready_from) {
    (void)base; /* pushed after the loop's clipping, in apply() */
    (void)ready_from;
}

static bool ps_agrees(const dt_grad_sync *base, int64_t step) {
    return step + 1 == ((const ps_sync *)base)->total;
}

static dt_status ps_finish(dt_grad_sync *base, dt_sync_result *out) {
    ps_sync *s = (ps_sync *)base;
    bool agreed = ps_agrees(base, s->step.step);
    out->sumsq = dt__norm_ranges_sumsq(&s->norm, s->grads, 0, s->n) / (agreed ? s->W : 1);
    return DT_OK;
}

/* The local worker's push to the server on its own rank, and its read. */
static dt_status push_local(ps_sync *s, int64_t t, float lr) {
    ps_server *v = s->srv;
    float *g = s->grads + v->begin;
    pthread_mutex_lock(&v->mu);
    server_apply(s, v, s->rank, t, lr, g);
    pthread_cond_broadcast(&v->cv);
    while (!reply_allowed(s, v, s->rank) && v->err == DT_OK)
        pthread_cond_wait(&v->cv, &v->mu);
    dt_status st = v->err;
    if (st == DT_OK) {
        s->max_tau = v->tau[s->rank];
        note_read(s, v, s->rank);
        memcpy(s->params + v->begin, v->w, v->len * sizeof(float));
    }
    pthread_mutex_unlock(&v->mu);
    return st != DT_OK ? dt_error_set(st, "%s", v->msg) : DT_OK;
}

/* The last step: every server's shard to every rank, the threads joined. */
static dt_status finish_run(ps_sync *s) {
    DT_CHECK(dt_group_barrier(s->world));
    if (s->srv) {
        pthread_join(s->srv->thread, NULL);
        s->srv->started = false;
        if (s->srv->err != DT_OK)
            return dt_error_set(s->srv->err, "%s", s->srv->msg);
        memcpy(s->params + s->srv->begin, s->srv->w, s->srv->len * sizeof(float));
    }
    for (int k = 0; k < s->K; k++)
        DT_CHECK(dt_group_broadcast(s->world, s->params + s->shard_begin[k],
                                    s->shard_begin[k + 1] - s->shard_begin[k], DT_F32, k));
    return DT_OK;
}

static dt_status ps_apply(dt_grad_sync *base, bool skip, float clip_scale) {
    ps_sync *s = (ps_sync *)base;
    memset(&s->done, 0, sizeof s->done);
    DT_ASSERT(!skip); /* no loss scaling with --dp-mode ps */
    if (clip_scale != 1.0f)
        dt_scale(s->grads, s->n, clip_scale);
    if (!s->world) {
        float lr = s->step.lr;
        for (size_t i = 0; i < s->n; i++)
            s->params[i] -= lr * s->grads[i];
        return DT_OK;
    }
    double t0 = dt_now();
    int64_t t = s->step.step;
    s->hdr_out[0] = t;
    s->hdr_out[1] = 0;
    memcpy(&s->hdr_out[1], &s->step.lr, sizeof s->step.lr);
    s->max_tau = 0;
    /* Push to the remote servers (non-blocking), serve the local one, then
     * read every remote reply. */
    dt_work *sent[2 * DT_PS_MAX_SERVERS] = {0};
    dt_status st = DT_OK;
    int k;
    for (k = 0; k < s->K && st == DT_OK; k++) {
        if (!s->push[k])
            continue;
        size_t b = s->shard_begin[k], len = s->shard_begin[k + 1] - b;
        st = dt_group_isend(s->push[k], s->hdr_out, HDR, DT_I64, 1, PS_TAG, &sent[2 * k]);
        if (st == DT_OK)
            st = dt_group_isend(s->push[k], s->grads + b, len, DT_F32, 1, PS_TAG, &sent[2 * k + 1]);
        s->done.bytes_sent += (HDR * sizeof(int64_t) + len * sizeof(float));
    }
    int failed = st != DT_OK ? k - 1 : -1;
    if (st == DT_OK && s->srv)
        st = push_local(s, t, s->step.lr);
    for (k = 0; k < s->K && st == DT_OK; k++) {
        if (!s->reply[k])
            continue;
        size_t b = s->shard_begin[k], len = s->shard_begin[k + 1] - b;
        int64_t *h = s->hdr_in + (size_t)k * HDR;
        st = dt_group_recv(s->reply[k], h, HDR, DT_I64, 1, PS_TAG);
        if (st == DT_OK)
            st = dt_group_recv(s->reply[k], s->params + b, len, DT_F32, 1, PS_TAG);
        if (st != DT_OK)
            failed = k;
        else
            s->max_tau = h[2] > s->max_tau ? h[2] : s->max_tau;
    }
    for (k = 0; k < 2 * s->K; k++)
        if (sent[k]) {
            dt_status ws = dt_work_wait(sent[k]);
            st = st != DT_OK ? st : ws;
        }
    if (st != DT_OK) {
        if (failed >= 0)
            dt_error_prefix("parameter server: worker rank %d, step %" PRId64
                            ", with the server of shard %d (rank %d)",
                            s->rank, t + 1, failed, failed);
        else
            dt_error_prefix("parameter server: worker rank %d, step %" PRId64, s->rank, t + 1);
        return st;
    }
    s->done.comm_ms = (dt_now() - t0) * 1e3;
    s->done.collectives = 2 * s->K;
    if (t + 1 == s->total)
        return finish_run(s);
    return DT_OK;
}

/* Bytes: this worker's pushes, and the replies this rank's server sent
 * since the last report. */
static void ps_apply_report(dt_grad_sync *base, dt_sync_result *out) {
    ps_sync *s = (ps_sync *)base;
    if (s->srv) {
        pthread_mutex_lock(&s->srv->mu);
        out->bytes_sent += s->srv->sent;
        s->srv->sent = 0;
        pthread_mutex_unlock(&s->srv->mu);
    }
    out->comm_ms += s->done.comm_ms;
    out->exposed_comm_ms += s->done.comm_ms;
    out->bytes_sent += s->done.bytes_sent;
    out->collectives += s->done.collectives;
    out->staleness = s->world ? s->max_tau : -1;
}

static dt_status ps_replicate(dt_grad_sync *base) {
    ps_sync *s = (ps_sync *)base;
    if (s->world)
        DT_CHECK(dt_group_broadcast(s->world, s->params, s->n, DT_F32, 0));
    if (s->srv)
        memcpy(s->srv->w, s->params + s->srv->begin, s->srv->len * sizeof(float));
    return DT_OK;
}

/* The replicas hold different shard versions between meetings. */
static dt_status ps_check(dt_grad_sync *base, int64_t step) {
    (void)base;
    (void)step;
    return DT_OK;
}

static void ps_cost(const dt_grad_sync *base, dt_sync_cost *out) {
    const ps_sync *s = (const ps_sync *)base;
    out->coll = DT_COLL_SEND;
    out->ranks = s->W;
    out->bytes_per_step = (double)(s->n * sizeof(float));
    out->pieces = 2 * s->K;
}

static void ps_layout(const dt_grad_sync *base, dt_sync_layout *out) {
    (void)base; /* the last step's broadcast makes them so; rank 0's copy is written */
    out->params_replicated = out->optim_replicated = true;
}

static size_t ps_state_bytes(const dt_grad_sync *base) {
    (void)base;
    return 0;
}
static const char *ps_state_ident(const dt_grad_sync *base) {
    return ((const ps_sync *)base)->ident;
}
static dt_status ps_get_state(const dt_grad_sync *base, void *buf, size_t len, float *unit) {
    (void)base;
    (void)buf;
    (void)len;
    *unit = 1.0f;
    return DT_OK;
}
static dt_status ps_set_state(dt_grad_sync *base, const void *buf, size_t len, float unit) {
    (void)base;
    (void)buf;
    (void)len;
    (void)unit;
    return DT_OK;
}
static void ps_reset_state(dt_grad_sync *base) { (void)base; }

static void server_free(ps_server *v, int W) {
    if (!v)
        return;
    for (int w = 0; w < W; w++)
        if (v->posted && v->posted[w])
            (void)dt_work_wait(v->posted[w]); /* its group was aborted */
    dt_free(v->w);
    dt_free(v->then);
    dt_free(v->grad);
    dt_free(v->hdr);
    dt_free(v->clock);
    dt_free(v->read_at);
    dt_free(v->tau);
    dt_free(v->waiting);
    dt_free(v->posted);
    pthread_mutex_destroy(&v->mu);
    pthread_cond_destroy(&v->cv);
    dt_free(v);
}

static void ps_destroy(dt_grad_sync *base) {
    ps_sync *s = (ps_sync *)base;
    if (s->srv && s->srv->started) {
        /* A run that ended early: fail the server's transfers so that its
         * thread returns. */
        for (int w = 0; w < s->W; w++) {
            if (s->spush && s->spush[w])
                dt_group_abort(s->spush[w]);
            if (s->sreply && s->sreply[w])
                dt_group_abort(s->sreply[w]);
        }
        pthread_join(s->srv->thread, NULL);
    }
    server_free(s->srv, s->W);
    for (int k = 0; k < s->K; k++) {
        if (s->push)
            dt_group_destroy(s->push[k]);
        if (s->reply)
            dt_group_destroy(s->reply[k]);
    }
    for (int w = 0; w < s->W; w++) {
        if (s->spush)
            dt_group_destroy(s->spush[w]);
        if (s->sreply)
            dt_group_destroy(s->sreply[w]);
    }
    dt_free(s->push);
    dt_free(s->reply);
    dt_free(s->spush);
    dt_free(s->sreply);
    dt_free(s->shard_begin);
    dt_free(s->hdr_in);
    dt__norm_ranges_free(&s->norm);
    dt_free(s);
}

static const dt__sync_ops ps_ops = {
    .name = "ps",
    .begin_step = ps_begin_step,
    .begin_backward = ps_begin_backward,
    .ready = ps_ready,
    .finish = ps_finish,
    .apply = ps_apply,
    .replicate = ps_replicate,
    .check = ps_check,
    .cost = ps_cost,
    .layout = ps_layout,
    .state_bytes = ps_state_bytes,
    .state_ident = ps_state_ident,
    .get_state = ps_get_state,
    .set_state = ps_set_state,
    .reset_state = ps_reset_state,
    .destroy = ps_destroy,
    .apply_report = ps_apply_report,
    .agrees = ps_agrees,
};

static dt_status server_create(ps_sync *s, ps_server **out) {
    ps_server *v = dt_calloc(1, sizeof *v);
    if (!v)
        return DT_ERR_NOMEM;
    pthread_mutex_init(&v->mu, NULL);
    pthread_cond_init(&v->cv, NULL);
    *out = v;
    v->begin = s->shard_begin[s->rank];
    v->len = s->shard_begin[s->rank + 1] - v->begin;
    size_t W = (size_t)s->W, len = v->len ? v->len : 1;
    v->w = dt_alloc(len * sizeof(float));
    v->grad = dt_alloc(W * len * sizeof(float));
    v->then = s->comp == DT_DELAY_COMP_DCASGD ? dt_calloc(W * len, sizeof(float)) : NULL;
    v->hdr = dt_calloc(W * HDR, sizeof *v->hdr);
    v->clock = dt_calloc(W, sizeof *v->clock);
    v->read_at = dt_calloc(W, sizeof *v->read_at);
    v->tau = dt_calloc(W, sizeof *v->tau);
    v->waiting = dt_calloc(W, sizeof *v->waiting);
    v->posted = dt_calloc(W, sizeof *v->posted);
    if (!v->w || !v->grad || (s->comp == DT_DELAY_COMP_DCASGD && !v->then) || !v->hdr ||
        !v->clock || !v->read_at || !v->tau || !v->waiting || !v->posted)
        return dt_error_set(DT_ERR_NOMEM, "parameter server: buffers of %zu x %zu floats", W, len);
    return DT_OK;
}

/* Collective over the world: the two groups of every (worker, server)
 * pair of different ranks (worker: group rank 0, server: 1). */
static dt_status split_pairs(ps_sync *s) {
    for (int k = 0; k < s->K; k++)
        for (int w = 0; w < s->W; w++) {
            if (w == k)
                continue;
            int color = s->rank == w || s->rank == k ? 0 : DT_UNDEFINED;
            int key = s->rank == k;
            dt_group *p = NULL, *r = NULL;
            DT_CHECK(dt_group_split(s->world, color, key, &p));
            dt_status st = dt_group_split(s->world, color, key, &r);
            if (s->rank == w) {
                s->push[k] = p;
                s->reply[k] = r;
            } else if (s->rank == k) {
                s->spush[w] = p;
                s->sreply[w] = r;
            }
            DT_CHECK(st);
        }
    return DT_OK;
}

dt_status dt_ps_sync_create(dt_grad_sync **out, const dt_ps_sync_config *c) {
    *out = NULL;
    int W = c->group ? dt_group_size(c->group) : 1;
    if (c->servers < 1 || c->servers > W || c->servers > DT_PS_MAX_SERVERS)
        return dt_error_set(DT_ERR_INVALID,
                            "--ps-servers %d: between 1 and the %d ranks (at most %d)", c->servers,
                            W, DT_PS_MAX_SERVERS);
    if (c->staleness < 0 || c->staleness > DT_PS_HIST - 2)
        return dt_error_set(DT_ERR_INVALID, "--staleness %" PRId64 ": between 0 and %d",
                            c->staleness, DT_PS_HIST - 2);
    if ((int)c->delay_comp < 0 || c->delay_comp >= DT_DELAY_COMP_COUNT)
        return dt_error_set(DT_ERR_INVALID, "--delay-comp %d: none, seed or dcasgd",
                            (int)c->delay_comp);
    ps_sync *s = dt_calloc(1, sizeof *s);
    if (!s)
        return DT_ERR_NOMEM;
    s->base.ops = &ps_ops;
    s->world = c->group;
    s->rank = c->group ? dt_group_rank(c->group) : 0;
    s->W = W;
    s->K = c->servers;
    s->params = c->params;
    s->grads = c->grads;
    s->n = c->n;
    s->comp = c->delay_comp;
    s->lambda = (float)c->dc_lambda;
    s->S = c->staleness;
    s->total = c->total_steps;
    dt_status st;
    DT_CHECK_GOTO(dt__norm_ranges_init(&s->norm, c->norm_ranges, c->nnorm, c->n), st, fail);
    s->shard_begin = dt_calloc((size_t)s->K + 1, sizeof *s->shard_begin);
    s->push = dt_calloc((size_t)s->K, sizeof *s->push);
    s->reply = dt_calloc((size_t)s->K, sizeof *s->reply);
    s->spush = dt_calloc((size_t)W, sizeof *s->spush);
    s->sreply = dt_calloc((size_t)W, sizeof *s->sreply);
    s->hdr_in = dt_calloc((size_t)s->K * HDR, sizeof *s->hdr_in);
    if (!s->shard_begin || !s->push || !s->reply || !s->spush || !s->sreply || !s->hdr_in) {
        st = DT_ERR_NOMEM;
        goto fail;
    }
    for (int k = 0; k <= s->K; k++)
        s->shard_begin[k] = c->n * (size_t)k / (size_t)s->K;
    if (s->world)
        DT_CHECK_GOTO(split_pairs(s), st, fail);
    if (s->world && s->rank < s->K)
        DT_CHECK_GOTO(server_create(s, &s->srv), st, fail);
    snprintf(s->ident, sizeof s->ident,
             "ps servers=%d staleness=%" PRId64 " delay-comp=%s lambda=%g workers=%d", s->K, s->S,
             dt_delay_comp_names[s->comp], c->dc_lambda, s->W);
    *out = &s->base;
    return DT_OK;
fail:
    ps_destroy(&s->base);
    return st;
}

dt_status dt_ps_sync_histogram(const dt_grad_sync *base, int64_t hist[DT_PS_HIST]) {
    memset(hist, 0, DT_PS_HIST * sizeof *hist);
    if (base->ops != &ps_ops)
        return dt_error_set(DT_ERR_INVALID, "staleness histogram: the sync is %s, not ps",
                            base->ops->name);
    const ps_sync *s = (const ps_sync *)base;
    if (s->srv) {
        pthread_mutex_lock(&s->srv->mu);
        memcpy(hist, s->srv->hist, sizeof s->srv->hist);
        pthread_mutex_unlock(&s->srv->mu);
    }
    return s->world ? dt_group_allreduce(s->world, hist, hist, DT_PS_HIST, DT_I64, DT_SUM) : DT_OK;
}
