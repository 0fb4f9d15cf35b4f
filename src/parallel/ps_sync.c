/*
 * ps_sync.c — an asynchronous parameter server with SSP bounded staleness
 * and delay compensation as a dt_grad_sync (parallel.h, "Parameter
 * server"; docs/async.md).
 *
 * Layout (BytePS-style, on the training ranks): the flat parameter buffer
 * is cut into K equal shards; rank k < K hosts the server of shard k in a
 * thread of its own, and every rank is a worker. Each shard is cut into
 * buckets of about bucket_bytes, numbered from the end of the buffer (the
 * order backward finishes them). All traffic goes through one mailbox on
 * the replica group (comm.h, "Tagged messages"), the worker on a server's
 * own rank included (messages to itself):
 *
 *   worker w, step t                        server k
 *   during backward: bucket b -> k(b)  ---> receives posted for w's next
 *                   (tag b, as soon as      step, one per bucket of k
 *                    backward finished it)
 *   apply(): header {t, lr, clip} -> k  ---> any-source receive of a header:
 *                                           wait w's buckets, then apply
 *                                             g = clip * g
 *                                             g = compensate(g) (none,
 *                                                 seed: g/(1+tau), dcasgd)
 *                                             optimizer step, lr / W
 *                                           clock[w] = t + 1; post w's
 *                                           next buckets; reply once
 *                                           min(clock) >= t + 1 - S
 *            <--- {clock, tau} + shard <---
 *
 * The server's optimizer is the project's optimizer object (adamw, sgd,
 * ...) over its shard: each push is one update of it with 1/W of the
 * step's learning rate, so W pushes of equal gradients move the shard as
 * far as one synchronous step.
 *
 * tau is the push's staleness: t minus the slowest worker's clock when w
 * read the parameters it used. The reply rule (SSP) makes tau <= S, which
 * every server asserts for every update it applies and records in a
 * histogram. With S = 0 no worker pushes step t + 1 before every worker
 * pushed step t, and the server applies a step's pushes in worker order
 * once all are in: the run is deterministic, bit for bit. With S > 0 the
 * pushes apply in arrival order.
 *
 * Checkpoints (dt_grad_sync_save_params): at the end of step c every
 * server waits until it applied every worker's push of steps <= c and sent
 * every reply — nothing of step c + 1 can arrive before the checkpoint's
 * own collectives are over — so the servers' shards are the model after
 * step c on all of them at once; rank 0 gathers them into the checkpoint's
 * parameters. Each rank's sync state holds its own worker's view of the
 * parameters (what it read, possibly stale) and, on a server, its shard,
 * optimizer state, clocks, reads and histogram: a resume continues from
 * exactly that state (bit for bit from there with S = 0).
 *
 * The last step is a meeting: every server gives its shard to every rank,
 * so all end with the same parameters. A dead peer fails the mailbox on
 * every rank (DT_ERR_PEER naming it), the server threads included.
 */
#include "sync_internal.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

const char *const dt_delay_comp_names[DT_DELAY_COMP_COUNT] = {"none", "seed", "dcasgd"};

/* Tags of the mailbox: buckets use their own index (< TAG_HDR). */
#define TAG_HDR  (1 << 24)     /* worker -> server: {step, lr, clip, 0} */
#define TAG_RHDR (TAG_HDR + 1) /* server -> worker: {clock, 0, tau, 0} */
#define TAG_RPAR (TAG_HDR + 2) /* server -> worker: the shard */
#define HDR      4

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

typedef struct ps_bucket {
    size_t begin, end; /* of the flat buffer */
    int server;
} ps_bucket;

typedef struct ps_server {
    size_t begin, len;    /* its shard of the flat buffer */
    float *w;             /* (len) the parameters */
    dt_optimizer *opt;    /* over [0, len) of w */
    float *then;          /* (W x len) dcasgd: what each worker last read */
    float *grad;          /* (W x len) receive buffers of the pushes */
    float *rbuf;          /* (W x len) reply buffers */
    int nb;               /* its buckets */
    int *bucket;          /* (nb) their indices in ps_sync.bucket */
    dt_work **brecv;      /* (W x nb) posted bucket receives */
    dt_work **rsend;      /* (W x 2) reply sends in flight */
    int64_t (*rhdr)[HDR]; /* (W) reply headers */
    int64_t (*push)[HDR]; /* (W) a received push header not yet applied */
    bool *pushed;         /* (W) push[w] is there */
    /* Under mu (the main thread reads them at checkpoints). */
    int64_t *clock;           /* (W) pushes applied: the next step of each worker */
    int64_t *read_at;         /* (W) min(clock) when each worker last read */
    int64_t *tau;             /* (W) the staleness of each worker's last push */
    bool *waiting;            /* (W) a reply is due once SSP allows */
    int64_t hist[DT_PS_HIST]; /* staleness counts (the last bin: >= DT_PS_HIST - 1) */
    uint64_t sent;            /* reply bytes sent and not yet reported by this rank's worker */
    pthread_mutex_t mu;
    pthread_cond_t cv; /* clocks advanced, or the thread ended */
    dt_thread *thread;
    bool running;
    dt_status err;
    char msg[512];
} ps_server;

typedef struct ps_sync {
    dt_grad_sync base;
    dt_group *world; /* borrowed: the replica group */
    dt_mailbox *mb;
    int rank, W, K;
    float *params, *grads; /* (n) borrowed */
    size_t n;
    dt_optimizer *opt; /* one rank (no group): the run's optimizer steps */
    dt__norm_ranges norm;
    dt_delay_comp comp;
    float lambda;
    int64_t S, total;
    size_t *shard_begin; /* (K + 1) */
    ps_bucket *bucket;   /* (nbuckets), descending: bucket 0 ends at n */
    int nbuckets;
    ps_server *srv;  /* this rank's server, NULL if rank >= K */
    float *gathered; /* (n) rank 0: the servers' shards for a checkpoint */
    bool restored;   /* set_state gave the server its clocks */
    /* Per step. */
    dt_sync_step step;
    int backwards;
    bool last_backward;
    int next_bucket; /* the next bucket to push */
    dt_work **bsend; /* (nbuckets) this step's bucket sends */
    dt_work **hsend; /* (K) header sends */
    dt_work **rrecv; /* (2 K) reply receives */
    int64_t hdr_out[HDR];
    int64_t *hdr_in; /* (K x HDR) replies */
    dt_sync_result done;
    double t_push; /* when the step's first bucket went out */
    int64_t max_tau;
    char ident[160];
} ps_sync;

/* ------------------------------------------------------------------------ */
/* The server                                                               */
/* ------------------------------------------------------------------------ */

static int64_t min_clock(const ps_server *v, int W) {
    int64_t m = INT64_MAX;
    for (int w = 0; w < W; w++)
        m = v->clock[w] < m ? v->clock[w] : m;
    return m;
}

/* Post worker w's bucket receives for its next push. */
static dt_status post_buckets(ps_sync *s, ps_server *v, int w) {
    for (int j = 0; j < v->nb; j++) {
        const ps_bucket *b = &s->bucket[v->bucket[j]];
        float *dst = v->grad + (size_t)w * v->len + (b->begin - v->begin);
        DT_CHECK(dt_mailbox_irecv(s->mb, dst, b->end - b->begin, DT_F32, w, v->bucket[j], NULL,
                                  &v->brecv[(size_t)w * (size_t)v->nb + (size_t)j]));
    }
    return DT_OK;
}

static dt_status wait_buckets(ps_server *v, int w) {
    dt_status st = DT_OK;
    for (int j = 0; j < v->nb; j++) {
        dt_work **h = &v->brecv[(size_t)w * (size_t)v->nb + (size_t)j];
        if (*h) {
            dt_status ws = dt_work_wait(*h);
            st = st != DT_OK ? st : ws;
            *h = NULL;
        }
    }
    return st;
}

/* Apply worker w's push (its header in push[w], its gradient in grad[w]). */
static dt_status server_apply(ps_sync *s, ps_server *v, int w) {
    int64_t t = v->push[w][0];
    float lr, clip;
    memcpy(&lr, &v->push[w][1], sizeof lr);
    memcpy(&clip, &v->push[w][2], sizeof clip);
    float *g = v->grad + (size_t)w * v->len;
    pthread_mutex_lock(&v->mu);
    int64_t tau = t - v->read_at[w];
    pthread_mutex_unlock(&v->mu);
    DT_ASSERT(tau >= 0 && tau <= s->S); /* SSP: never applied staler than S */
    if (clip != 1.0f)
        dt_scale(g, v->len, clip);
    dt_ps_delay_compensate(s->comp, s->lambda, tau, g, v->w, v->then + (size_t)w * v->len, v->len);
    int64_t count = dt_optimizer_count(v->opt);
    dt_optimizer_begin(v->opt, count, lr / (float)s->W);
    dt_status st = dt_optimizer_step(v->opt, v->w, g);
    dt_optimizer_end(v->opt, st == DT_OK);
    DT_CHECK(st);
    v->pushed[w] = false;
    pthread_mutex_lock(&v->mu);
    v->hist[tau < DT_PS_HIST ? tau : DT_PS_HIST - 1]++;
    v->clock[w] = t + 1;
    v->waiting[w] = true;
    v->tau[w] = tau;
    pthread_mutex_unlock(&v->mu);
    if (t + 1 < s->total)
        DT_CHECK(post_buckets(s, v, w));
    return DT_OK;
}

/* Send every reply SSP allows now. */
static dt_status send_replies(ps_sync *s, ps_server *v) {
    for (int w = 0; w < s->W; w++) {
        pthread_mutex_lock(&v->mu);
        bool go = v->waiting[w] && min_clock(v, s->W) >= v->clock[w] - s->S;
        if (go) {
            v->waiting[w] = false;
            v->read_at[w] = min_clock(v, s->W);
            v->rhdr[w][0] = v->clock[w];
            v->rhdr[w][1] = 0;
            v->rhdr[w][2] = v->tau[w];
            v->rhdr[w][3] = 0;
        }
        pthread_mutex_unlock(&v->mu);
        if (!go)
            continue;
        dt_work **rs = &v->rsend[2 * w];
        for (int i = 0; i < 2; i++)
            if (rs[i]) { /* the previous reply: long delivered */
                DT_CHECK(dt_work_wait(rs[i]));
                rs[i] = NULL;
            }
        float *r = v->rbuf + (size_t)w * v->len;
        memcpy(r, v->w, v->len * sizeof(float));
        if (s->comp == DT_DELAY_COMP_DCASGD)
            memcpy(v->then + (size_t)w * v->len, v->w, v->len * sizeof(float));
        DT_CHECK(dt_mailbox_isend(s->mb, v->rhdr[w], HDR, DT_I64, w, TAG_RHDR, &rs[0]));
        DT_CHECK(dt_mailbox_isend(s->mb, r, v->len, DT_F32, w, TAG_RPAR, &rs[1]));
        pthread_mutex_lock(&v->mu);
        if (w != s->rank)
            v->sent += HDR * sizeof(int64_t) + v->len * sizeof(float);
        pthread_cond_broadcast(&v->cv);
        pthread_mutex_unlock(&v->mu);
    }
    return DT_OK;
}

/* Every worker pushed its last step and got its reply. */
static bool server_done(ps_sync *s, ps_server *v) {
    bool done = true;
    pthread_mutex_lock(&v->mu);
    for (int w = 0; w < s->W; w++)
        done = done && v->clock[w] >= s->total && !v->waiting[w] && !v->pushed[w];
    pthread_mutex_unlock(&v->mu);
    return done;
}

/* Pushes the server still expects: every worker's steps up to total. */
static int64_t headers_left(ps_sync *s, ps_server *v) {
    int64_t left = 0;
    pthread_mutex_lock(&v->mu);
    for (int w = 0; w < s->W; w++)
        left += s->total - v->clock[w] - (v->pushed[w] ? 1 : 0);
    pthread_mutex_unlock(&v->mu);
    return left;
}

/* The server thread: serve every worker until each pushed its last step
 * and got its reply. */
static void *server_main(void *arg) {
    ps_sync *s = arg;
    ps_server *v = s->srv;
    dt_status st = DT_OK;
#ifdef _OPENMP
    /* The optimizer splits large ranges over OpenMP threads; a server runs
     * beside its rank's compute, so one thread (a team of this thread's
     * own would spin on the cores the workers compute on: measured, 20-45
     * ms per update of a 0.2M-float shard on 2 loaded cores, 0.1 ms alone). */
    omp_set_num_threads(1);
#endif
    int64_t hbuf[HDR];
    dt_msg_info info = {0};
    dt_work *hw = NULL;
    int who = -1;
    for (int w = 0; w < s->W && st == DT_OK; w++)
        if (v->clock[w] < s->total)
            st = post_buckets(s, v, w);
    if (st == DT_OK && headers_left(s, v) > 0)
        st = dt_mailbox_irecv(s->mb, hbuf, HDR, DT_I64, DT_ANY_SOURCE, TAG_HDR, &info, &hw);
    while (st == DT_OK && !server_done(s, v)) {
        st = dt_work_wait(hw); /* the next push, from whoever is first */
        hw = NULL;
        if (st != DT_OK)
            break;
        int w = who = info.source;
        pthread_mutex_lock(&v->mu);
        bool fresh = !v->pushed[w] && hbuf[0] == v->clock[w] && v->clock[w] < s->total;
        pthread_mutex_unlock(&v->mu);
        if (!fresh || info.count != HDR) {
            st = dt_error_set(DT_ERR_PROTOCOL,
                              "a push of step %" PRId64 " (%zu values) from worker rank %d, "
                              "whose next step is %" PRId64,
                              hbuf[0] + 1, info.count, w, v->clock[w] + 1);
            break;
        }
        memcpy(v->push[w], hbuf, sizeof hbuf);
        pthread_mutex_lock(&v->mu);
        v->pushed[w] = true;
        pthread_mutex_unlock(&v->mu);
        if (headers_left(s, v) > 0 &&
            (st = dt_mailbox_irecv(s->mb, hbuf, HDR, DT_I64, DT_ANY_SOURCE, TAG_HDR, &info, &hw)) !=
                DT_OK)
            break;
        if ((st = wait_buckets(v, w)) != DT_OK)
            break;
        if (s->S > 0) {
            st = server_apply(s, v, w);
        } else { /* every worker's push of the step, in worker order */
            bool all = true;
            for (int u = 0; u < s->W; u++)
                all = all && v->pushed[u];
            for (int u = 0; all && u < s->W && st == DT_OK; u++)
                if ((st = wait_buckets(v, u)) == DT_OK)
                    st = server_apply(s, v, u);
        }
        if (st == DT_OK)
            st = send_replies(s, v);
    }
    if (st != DT_OK) {
        /* Fail every rank's operations at once, so that no worker waits
         * for a reply until DT_TIMEOUT. */
        char msg[512];
        snprintf(msg, sizeof msg, "%s", dt_last_error());
        dt_mailbox_abort(s->mb);
        dt_error_set(st, "%s", msg);
    }
    if (hw)
        (void)dt_work_wait(hw);
    for (int w = 0; w < s->W; w++) {
        (void)wait_buckets(v, w);
        for (int i = 0; i < 2; i++)
            if (v->rsend[2 * w + i]) {
                dt_status ws = dt_work_wait(v->rsend[2 * w + i]);
                if (st == DT_OK && ws != DT_OK) {
                    st = ws;
                    who = w;
                }
                v->rsend[2 * w + i] = NULL;
            }
    }
    pthread_mutex_lock(&v->mu);
    if (st != DT_OK) {
        v->err = st;
        if (who >= 0)
            snprintf(v->msg, sizeof v->msg,
                     "parameter server of shard %d (rank %d), serving worker rank %d: %.400s",
                     s->rank, s->rank, who, dt_last_error());
        else
            snprintf(v->msg, sizeof v->msg, "parameter server of shard %d (rank %d): %.400s",
                     s->rank, s->rank, dt_last_error());
    }
    v->running = false;
    pthread_cond_broadcast(&v->cv);
    pthread_mutex_unlock(&v->mu);
    return NULL;
}

static dt_status server_join(ps_sync *s) {
    ps_server *v = s->srv;
    if (!v || !v->thread)
        return DT_OK;
    dt_thread_join(v->thread);
    v->thread = NULL;
    return v->err != DT_OK ? dt_error_set(v->err, "%s", v->msg) : DT_OK;
}

/* Wait until this rank's server applied every push of the steps before
 * `next` and sent every reply (a checkpoint's consistent point). */
static dt_status server_settle(ps_sync *s, int64_t next) {
    ps_server *v = s->srv;
    if (!v)
        return DT_OK;
    pthread_mutex_lock(&v->mu);
    for (;;) {
        bool settled = true;
        for (int w = 0; w < s->W; w++)
            settled = settled && v->clock[w] >= next && !v->waiting[w];
        if (settled || !v->running || v->err != DT_OK)
            break;
        pthread_cond_wait(&v->cv, &v->mu); /* the server's waits are bounded */
    }
    dt_status st = v->err;
    pthread_mutex_unlock(&v->mu);
    return st != DT_OK ? dt_error_set(st, "%s", v->msg) : DT_OK;
}

/* ------------------------------------------------------------------------ */
/* The worker                                                               */
/* ------------------------------------------------------------------------ */

static dt_status ps_begin_step(dt_grad_sync *base, const dt_sync_step *st) {
    ps_sync *s = (ps_sync *)base;
    s->step = *st;
    s->backwards = 0;
    s->next_bucket = 0;
    memset(&s->done, 0, sizeof s->done);
    ps_server *v = s->srv;
    if (v && !v->thread && st->step < s->total) {
        /* The clocks start at the first step run (a resumed run's too,
         * unless its state brought them). */
        if (!s->restored)
            for (int w = 0; w < s->W; w++)
                v->clock[w] = v->read_at[w] = st->step;
        v->running = true;
        v->err = DT_OK;
        DT_CHECK(dt_thread_create(&v->thread, "dt-ps-server", server_main, s));
    }
    return DT_OK;
}

static dt_grad_mode ps_begin_backward(dt_grad_sync *base, bool last) {
    ps_sync *s = (ps_sync *)base;
    s->last_backward = last;
    return s->backwards++ == 0 ? DT_GRAD_OVERWRITE : DT_GRAD_ACCUMULATE;
}

/* Push every bucket backward finished (the last micro-batch's only). */
static dt_status push_ready(ps_sync *s, size_t ready_from) {
    while (s->next_bucket < s->nbuckets && s->bucket[s->next_bucket].begin >= ready_from) {
        const ps_bucket *b = &s->bucket[s->next_bucket];
        if (!s->t_push)
            s->t_push = dt_now();
        DT_CHECK(dt_mailbox_isend(s->mb, s->grads + b->begin, b->end - b->begin, DT_F32, b->server,
                                  s->next_bucket, &s->bsend[s->next_bucket]));
        if (b->server != s->rank) /* to this rank's own server: a copy, not traffic */
            s->done.bytes_sent += (b->end - b->begin) * sizeof(float);
        s->done.collectives++;
        if (s->step.step >= 0 && ready_from > 0)
            s->done.launched_in_backward++;
        s->next_bucket++;
    }
    return DT_OK;
}

static void ps_ready(dt_grad_sync *base, size_t ready_from) {
    ps_sync *s = (ps_sync *)base;
    if (!s->mb || !s->last_backward)
        return;
    /* A failure surfaces in apply(), which waits for every send. */
    if (push_ready(s, ready_from) != DT_OK)
        DT_DEBUG("parallel", "parameter server: a push failed to start: %s", dt_last_error());
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

/* The last step: every server's shard to every rank, the threads joined. */
static dt_status finish_run(ps_sync *s) {
    DT_CHECK(dt_group_barrier(s->world));
    DT_CHECK(server_join(s));
    if (s->srv)
        memcpy(s->params + s->srv->begin, s->srv->w, s->srv->len * sizeof(float));
    for (int k = 0; k < s->K; k++)
        DT_CHECK(dt_group_broadcast(s->world, s->params + s->shard_begin[k],
                                    s->shard_begin[k + 1] - s->shard_begin[k], DT_F32, k));
    return DT_OK;
}

/* Wait for every handle of the step (each borrows our buffers). */
static dt_status wait_all(dt_work **h, int n, dt_status st) {
    for (int i = 0; i < n; i++)
        if (h[i]) {
            dt_status ws = dt_work_wait(h[i]);
            h[i] = NULL;
            st = st != DT_OK ? st : ws;
        }
    return st;
}

static dt_status ps_apply(dt_grad_sync *base, bool skip, float clip_scale) {
    ps_sync *s = (ps_sync *)base;
    DT_ASSERT(!skip); /* no loss scaling with --dp-mode ps */
    if (!s->mb) {     /* one rank: the run's optimizer, as DDP's */
        if (clip_scale != 1.0f)
            dt_scale(s->grads, s->n, clip_scale);
        return dt_optimizer_step(s->opt, s->params, s->grads);
    }
    double t0 = dt_now();
    int64_t t = s->step.step;
    /* The replies land in params: post them first, then finish the
     * pushes (buckets backward did not reach) and send the headers. */
    dt_status st = DT_OK;
    for (int k = 0; k < s->K && st == DT_OK; k++) {
        size_t b = s->shard_begin[k], len = s->shard_begin[k + 1] - b;
        st = dt_mailbox_irecv(s->mb, s->hdr_in + (size_t)k * HDR, HDR, DT_I64, k, TAG_RHDR, NULL,
                              &s->rrecv[2 * k]);
        if (st == DT_OK)
            st = dt_mailbox_irecv(s->mb, s->params + b, len, DT_F32, k, TAG_RPAR, NULL,
                                  &s->rrecv[2 * k + 1]);
    }
    if (st == DT_OK)
        st = push_ready(s, 0);
    s->hdr_out[0] = t;
    s->hdr_out[1] = s->hdr_out[2] = s->hdr_out[3] = 0;
    memcpy(&s->hdr_out[1], &s->step.lr, sizeof s->step.lr);
    memcpy(&s->hdr_out[2], &clip_scale, sizeof clip_scale);
    for (int k = 0; k < s->K && st == DT_OK; k++) {
        st = dt_mailbox_isend(s->mb, s->hdr_out, HDR, DT_I64, k, TAG_HDR, &s->hsend[k]);
        if (k != s->rank)
            s->done.bytes_sent += HDR * sizeof(int64_t);
    }
    st = wait_all(s->bsend, s->nbuckets, st);
    st = wait_all(s->hsend, s->K, st);
    st = wait_all(s->rrecv, 2 * s->K, st);
    if (st != DT_OK) {
        /* The server on this rank says best what went wrong; it stops. */
        char msg[512];
        snprintf(msg, sizeof msg, "%s", dt_last_error());
        dt_mailbox_abort(s->mb);
        dt_error_set(st, "%s", msg);
        if (s->srv) {
            pthread_mutex_lock(&s->srv->mu);
            while (s->srv->running)
                pthread_cond_wait(&s->srv->cv, &s->srv->mu);
            dt_status se = s->srv->err;
            pthread_mutex_unlock(&s->srv->mu);
            if (se != DT_OK && se != DT_ERR_ABORTED)
                st = dt_error_set(se, "%s", s->srv->msg);
        }
        dt_error_prefix("parameter server: worker rank %d, step %" PRId64, s->rank, t + 1);
        return st;
    }
    s->max_tau = 0;
    for (int k = 0; k < s->K; k++)
        s->max_tau = s->hdr_in[(size_t)k * HDR + 2] > s->max_tau ? s->hdr_in[(size_t)k * HDR + 2]
                                                                 : s->max_tau;
    double t1 = dt_now();
    s->done.comm_ms = (t1 - (s->t_push ? s->t_push : t0)) * 1e3;
    s->done.exposed_comm_ms = (t1 - t0) * 1e3;
    s->t_push = 0;
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
    out->exposed_comm_ms += s->done.exposed_comm_ms;
    out->bytes_sent += s->done.bytes_sent;
    out->collectives += s->done.collectives + (s->mb ? s->K : 0);
    out->launched_in_backward += s->done.launched_in_backward;
    out->staleness = s->mb ? s->max_tau : -1;
}

/* Every rank the first's parameters; each server takes its shard. */
static dt_status ps_replicate(dt_grad_sync *base) {
    ps_sync *s = (ps_sync *)base;
    if (s->world)
        DT_CHECK(dt_group_broadcast(s->world, s->params, s->n, DT_F32, 0));
    if (s->srv)
        memcpy(s->srv->w, s->params + s->srv->begin, s->srv->len * sizeof(float));
    s->restored = false;
    return DT_OK;
}

/* The replicas hold different shard versions between meetings. */
static dt_status ps_check(dt_grad_sync *base, int64_t step) {
    (void)base;
    (void)step;
    return DT_OK;
}

/* A checkpoint's parameters: the servers' shards after this step. */
static dt_status ps_save_params(dt_grad_sync *base, const float **out) {
    ps_sync *s = (ps_sync *)base;
    *out = NULL;
    if (!s->mb)
        return DT_OK;
    int64_t next = s->step.step + 1;
    dt_status settled = server_settle(s, next < s->total ? next : s->total);
    char msg[512] = "";
    if (settled != DT_OK)
        snprintf(msg, sizeof msg, "%s", dt_last_error());
    if (s->rank == 0 && !s->gathered && !(s->gathered = dt_alloc(s->n * sizeof(float))))
        return dt_error_set(DT_ERR_NOMEM, "parameter server: %zu floats for a checkpoint", s->n);
    /* The gather runs even after a failure here, so that rank 0 is not
     * left waiting; the checkpoint's outcome then carries the error. */
    for (int k = 0; k < s->K; k++) {
        size_t b = s->shard_begin[k], len = s->shard_begin[k + 1] - b;
        if (k == 0 && s->rank == 0)
            memcpy(s->gathered + b, s->srv->w, len * sizeof(float));
        else if (s->rank == 0)
            DT_CHECK(dt_group_recv(s->world, s->gathered + b, len, DT_F32, k, TAG_RPAR));
        else if (s->rank == k)
            DT_CHECK(dt_group_send(s->world, s->srv->w, len, DT_F32, 0, TAG_RPAR));
    }
    if (settled != DT_OK)
        return dt_error_set(settled, "%s", msg);
    *out = s->gathered;
    return DT_OK;
}

/* Around the weights file at the end: after an early stop, every rank
 * takes the servers' model (the last step already did). */
static dt_status ps_gather_params(dt_grad_sync *base, bool whole) {
    ps_sync *s = (ps_sync *)base;
    if (!whole || !s->mb)
        return DT_OK;
    bool running = false;
    if (s->srv) {
        pthread_mutex_lock(&s->srv->mu);
        running = s->srv->thread != NULL;
        pthread_mutex_unlock(&s->srv->mu);
    }
    int64_t any = running;
    DT_CHECK(dt_group_allreduce(s->world, &any, &any, 1, DT_I64, DT_MAX));
    if (!any)
        return DT_OK;
    DT_CHECK(server_settle(s, s->step.step + 1));
    if (s->srv)
        memcpy(s->params + s->srv->begin, s->srv->w, s->srv->len * sizeof(float));
    for (int k = 0; k < s->K; k++)
        DT_CHECK(dt_group_broadcast(s->world, s->params + s->shard_begin[k],
                                    s->shard_begin[k + 1] - s->shard_begin[k], DT_F32, k));
    return DT_OK;
}

static void ps_cost(const dt_grad_sync *base, dt_sync_cost *out) {
    const ps_sync *s = (const ps_sync *)base;
    out->coll = DT_COLL_SEND;
    out->ranks = s->W;
    out->bytes_per_step = (double)(s->n * sizeof(float));
    out->pieces = s->nbuckets + s->K;
    out->overlapped = true;
}

static void ps_layout(const dt_grad_sync *base, dt_sync_layout *out) {
    (void)base; /* the checkpoint's parameters come from save_params; the run's optimizer
                   owns nothing (the servers' are in the sync state) */
    out->params_replicated = out->optim_replicated = true;
}

/* ------------------------------------------------------------------------ */
/* Sync state: the worker's view; on a server its whole state               */
/* ------------------------------------------------------------------------ */

/* The layout of a rank's state, in order. */
static size_t state_floats(const ps_sync *s) {
    size_t f = s->n; /* the worker's parameters */
    const ps_server *v = s->srv;
    if (!v)
        return f;
    f += v->len; /* w */
    for (size_t i = 0; i < dt_optimizer_num_states(v->opt); i++)
        f += dt_optimizer_state_count(v->opt, i);
    if (s->comp == DT_DELAY_COMP_DCASGD)
        f += (size_t)s->W * v->len;
    return f;
}

static size_t ps_state_bytes(const dt_grad_sync *base) {
    const ps_sync *s = (const ps_sync *)base;
    if (!s->mb)
        return 0;
    size_t ints = s->srv ? 1 + 2 * (size_t)s->W + DT_PS_HIST : 0; /* count, clocks, reads, hist */
    return ints * sizeof(int64_t) + state_floats(s) * sizeof(float);
}

static const char *ps_state_ident(const dt_grad_sync *base) {
    return ((const ps_sync *)base)->ident;
}

static dt_status ps_get_state(const dt_grad_sync *base, void *buf, size_t len, float *unit) {
    const ps_sync *s = (const ps_sync *)base;
    *unit = 1.0f;
    DT_ASSERT(len == ps_state_bytes(base));
    if (!s->mb)
        return DT_OK;
    char *p = buf;
    ps_server *v = s->srv;
    if (v) { /* settled by save_params: the server thread waits for the next push */
        int64_t *iv = (int64_t *)(void *)p;
        pthread_mutex_lock(&v->mu);
        iv[0] = dt_optimizer_count(v->opt);
        memcpy(iv + 1, v->clock, (size_t)s->W * sizeof(int64_t));
        memcpy(iv + 1 + s->W, v->read_at, (size_t)s->W * sizeof(int64_t));
        memcpy(iv + 1 + 2 * s->W, v->hist, sizeof v->hist);
        pthread_mutex_unlock(&v->mu);
        p += (1 + 2 * (size_t)s->W + DT_PS_HIST) * sizeof(int64_t);
    }
    float *f = (float *)(void *)p;
    memcpy(f, s->params, s->n * sizeof(float));
    f += s->n;
    if (v) {
        memcpy(f, v->w, v->len * sizeof(float));
        f += v->len;
        for (size_t i = 0; i < dt_optimizer_num_states(v->opt); i++) {
            dt_optimizer_state_get(v->opt, i, f);
            f += dt_optimizer_state_count(v->opt, i);
        }
        if (s->comp == DT_DELAY_COMP_DCASGD)
            memcpy(f, v->then, (size_t)s->W * v->len * sizeof(float));
    }
    return DT_OK;
}

static dt_status ps_set_state(dt_grad_sync *base, const void *buf, size_t len, float unit) {
    ps_sync *s = (ps_sync *)base;
    (void)unit;
    if (len != ps_state_bytes(base))
        return dt_error_set(DT_ERR_CORRUPT, "parameter server state: %zu bytes, expected %zu", len,
                            ps_state_bytes(base));
    if (!s->mb)
        return DT_OK;
    const char *p = buf;
    ps_server *v = s->srv;
    if (v) {
        DT_ASSERT(!v->thread);
        const int64_t *iv = (const int64_t *)(const void *)p;
        for (int i = 0; i < 1 + 2 * s->W + DT_PS_HIST; i++)
            if (iv[i] < 0 || iv[i] > ((int64_t)1 << 50))
                return dt_error_set(DT_ERR_CORRUPT, "parameter server state: value %d is %" PRId64,
                                    i, iv[i]);
        DT_CHECK(dt_optimizer_set_count(v->opt, iv[0]));
        memcpy(v->clock, iv + 1, (size_t)s->W * sizeof(int64_t));
        memcpy(v->read_at, iv + 1 + s->W, (size_t)s->W * sizeof(int64_t));
        memcpy(v->hist, iv + 1 + 2 * s->W, sizeof v->hist);
        for (int w = 0; w < s->W; w++)
            if (v->read_at[w] > v->clock[w])
                return dt_error_set(DT_ERR_CORRUPT,
                                    "parameter server state: worker %d read at %" PRId64
                                    " after its clock %" PRId64,
                                    w, v->read_at[w], v->clock[w]);
        p += (1 + 2 * (size_t)s->W + DT_PS_HIST) * sizeof(int64_t);
    }
    const float *f = (const float *)(const void *)p;
    memcpy(s->params, f, s->n * sizeof(float));
    f += s->n;
    if (v) {
        memcpy(v->w, f, v->len * sizeof(float));
        f += v->len;
        for (size_t i = 0; i < dt_optimizer_num_states(v->opt); i++) {
            dt_optimizer_state_set(v->opt, i, f);
            f += dt_optimizer_state_count(v->opt, i);
        }
        if (s->comp == DT_DELAY_COMP_DCASGD)
            memcpy(v->then, f, (size_t)s->W * v->len * sizeof(float));
        s->restored = true;
    }
    return DT_OK;
}

static void ps_reset_state(dt_grad_sync *base) { ((ps_sync *)base)->restored = false; }

/* ------------------------------------------------------------------------ */
/* Creation                                                                 */
/* ------------------------------------------------------------------------ */

static void server_free(ps_server *v) {
    if (!v)
        return;
    dt_optimizer_destroy(v->opt);
    dt_free(v->w);
    dt_free(v->then);
    dt_free(v->grad);
    dt_free(v->rbuf);
    dt_free(v->bucket);
    dt_free(v->brecv);
    dt_free(v->rsend);
    dt_free(v->rhdr);
    dt_free(v->push);
    dt_free(v->pushed);
    dt_free(v->clock);
    dt_free(v->read_at);
    dt_free(v->tau);
    dt_free(v->waiting);
    pthread_mutex_destroy(&v->mu);
    pthread_cond_destroy(&v->cv);
    dt_free(v);
}

static void ps_destroy(dt_grad_sync *base) {
    ps_sync *s = (ps_sync *)base;
    if (s->srv && s->srv->thread) {
        /* A run that ended early: fail the server's waits so that its
         * thread returns. */
        dt_mailbox_abort(s->mb);
        (void)server_join(s);
    }
    if (s->bsend) { /* a step that failed half way */
        (void)wait_all(s->bsend, s->nbuckets, DT_OK);
        (void)wait_all(s->hsend, s->K, DT_OK);
        (void)wait_all(s->rrecv, 2 * s->K, DT_OK);
    }
    dt_mailbox_destroy(s->mb);
    server_free(s->srv);
    dt_free(s->shard_begin);
    dt_free(s->bucket);
    dt_free(s->bsend);
    dt_free(s->hsend);
    dt_free(s->rrecv);
    dt_free(s->hdr_in);
    dt_free(s->gathered);
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
    .gather_params = ps_gather_params,
    .apply_report = ps_apply_report,
    .agrees = ps_agrees,
    .save_params = ps_save_params,
};

/* Buckets of about `floats` inside each shard, from the end of the buffer. */
static dt_status make_buckets(ps_sync *s, size_t floats) {
    int cap = 0;
    for (int k = 0; k < s->K; k++) {
        size_t len = s->shard_begin[k + 1] - s->shard_begin[k];
        cap += (int)((len + floats - 1) / floats) + 1;
    }
    s->bucket = dt_calloc((size_t)cap, sizeof *s->bucket);
    if (!s->bucket)
        return DT_ERR_NOMEM;
    for (int k = s->K - 1; k >= 0; k--) {
        size_t lo = s->shard_begin[k], end = s->shard_begin[k + 1];
        do { /* an empty shard still gets one (empty) bucket: every server hears every step */
            size_t begin = end - lo > floats ? end - floats : lo;
            s->bucket[s->nbuckets++] = (ps_bucket){begin, end, k};
            end = begin;
        } while (end > lo);
    }
    DT_ASSERT(s->nbuckets <= cap && s->nbuckets < TAG_HDR);
    return DT_OK;
}

/* The server's optimizer: the model's tensors cut to the shard, moved to
 * offset 0 (a tensor the shard cuts is a vector of its part). */
static dt_status server_optimizer(ps_sync *s, ps_server *v, const dt_ps_sync_config *c) {
    dt_optim_tensor *t = dt_calloc(c->ntensors + 1, sizeof *t);
    if (!t)
        return DT_ERR_NOMEM;
    size_t nt = 0, b = v->begin, e = v->begin + v->len;
    for (size_t i = 0; i < c->ntensors; i++) {
        const dt_optim_tensor *x = &c->tensors[i];
        size_t lo = x->offset > b ? x->offset : b;
        size_t hi = x->offset + x->count < e ? x->offset + x->count : e;
        if (lo >= hi)
            continue;
        bool whole = lo == x->offset && hi == x->offset + x->count;
        t[nt++] = (dt_optim_tensor){.offset = lo - b,
                                    .count = hi - lo,
                                    .decay = x->decay,
                                    .rows = whole ? x->rows : 0,
                                    .cols = whole ? x->cols : 0};
    }
    dt_optim_config oc = *c->optim;
    oc.reduce = NULL;
    oc.bcast = NULL;
    oc.offload_dir = NULL;
    dt_range own = {0, v->len};
    dt_status st = dt_optimizer_create(&v->opt, &oc, t, nt, &own, v->len ? 1 : 0);
    dt_free(t);
    (void)s;
    return st;
}

static dt_status server_create(ps_sync *s, const dt_ps_sync_config *c, ps_server **out) {
    ps_server *v = dt_calloc(1, sizeof *v);
    if (!v)
        return DT_ERR_NOMEM;
    pthread_mutex_init(&v->mu, NULL);
    pthread_cond_init(&v->cv, NULL);
    *out = v;
    v->begin = s->shard_begin[s->rank];
    v->len = s->shard_begin[s->rank + 1] - v->begin;
    for (int i = 0; i < s->nbuckets; i++)
        v->nb += s->bucket[i].server == s->rank;
    size_t W = (size_t)s->W, len = v->len ? v->len : 1;
    v->w = dt_alloc(len * sizeof(float));
    v->grad = dt_alloc(W * len * sizeof(float));
    v->rbuf = dt_alloc(W * len * sizeof(float));
    v->then = s->comp == DT_DELAY_COMP_DCASGD ? dt_calloc(W * len, sizeof(float)) : NULL;
    v->bucket = dt_calloc((size_t)v->nb, sizeof *v->bucket);
    v->brecv = dt_calloc(W * (size_t)v->nb, sizeof *v->brecv);
    v->rsend = dt_calloc(2 * W, sizeof *v->rsend);
    v->rhdr = dt_calloc(W, sizeof *v->rhdr);
    v->push = dt_calloc(W, sizeof *v->push);
    v->pushed = dt_calloc(W, sizeof *v->pushed);
    v->clock = dt_calloc(W, sizeof *v->clock);
    v->read_at = dt_calloc(W, sizeof *v->read_at);
    v->tau = dt_calloc(W, sizeof *v->tau);
    v->waiting = dt_calloc(W, sizeof *v->waiting);
    if (!v->w || !v->grad || !v->rbuf || (s->comp == DT_DELAY_COMP_DCASGD && !v->then) ||
        !v->bucket || !v->brecv || !v->rsend || !v->rhdr || !v->push || !v->pushed || !v->clock ||
        !v->read_at || !v->tau || !v->waiting)
        return dt_error_set(DT_ERR_NOMEM, "parameter server: buffers of %zu x %zu floats", W, len);
    for (int i = 0, j = 0; i < s->nbuckets; i++)
        if (s->bucket[i].server == s->rank)
            v->bucket[j++] = i;
    return server_optimizer(s, v, c);
}

/* The kinds whose update is elementwise, so a shard steps alone. */
static bool elementwise(dt_optim_kind k) {
    return k == DT_OPTIM_ADAMW || k == DT_OPTIM_SGD || k == DT_OPTIM_RADAM ||
           k == DT_OPTIM_ADAMW8BIT;
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
    if (W > 1 && (!c->optim || !elementwise(c->optim->kind) || c->optim->centralize))
        return dt_error_set(DT_ERR_INVALID,
                            "--dp-mode ps with --optimizer %s%s: the servers step each shard on "
                            "its own, so the update must be elementwise (adamw, sgd, radam, "
                            "adamw8bit; no gradient centralisation)",
                            c->optim ? dt_optim_names[c->optim->kind] : "(none)",
                            c->optim && c->optim->centralize ? " with centralisation" : "");
    if (W == 1 && !c->opt)
        return dt_error_set(DT_ERR_INVALID, "parameter server on one rank: no optimizer");
    ps_sync *s = dt_calloc(1, sizeof *s);
    if (!s)
        return DT_ERR_NOMEM;
    s->base.ops = &ps_ops;
    s->world = W > 1 ? c->group : NULL;
    s->rank = s->world ? dt_group_rank(c->group) : 0;
    s->W = W;
    s->K = c->servers;
    s->params = c->params;
    s->grads = c->grads;
    s->n = c->n;
    s->opt = c->opt;
    s->comp = c->delay_comp;
    s->lambda = (float)c->dc_lambda;
    s->S = c->staleness;
    s->total = c->total_steps;
    dt_status st;
    DT_CHECK_GOTO(dt__norm_ranges_init(&s->norm, c->norm_ranges, c->nnorm, c->n), st, fail);
    s->shard_begin = dt_calloc((size_t)s->K + 1, sizeof *s->shard_begin);
    s->hdr_in = dt_calloc((size_t)s->K * HDR, sizeof *s->hdr_in);
    if (!s->shard_begin || !s->hdr_in) {
        st = DT_ERR_NOMEM;
        goto fail;
    }
    for (int k = 0; k <= s->K; k++)
        s->shard_begin[k] = c->n * (size_t)k / (size_t)s->K;
    size_t bucket = c->bucket_bytes / sizeof(float);
    DT_CHECK_GOTO(make_buckets(s, bucket ? bucket : 1), st, fail);
    s->bsend = dt_calloc((size_t)s->nbuckets, sizeof *s->bsend);
    s->hsend = dt_calloc((size_t)s->K, sizeof *s->hsend);
    s->rrecv = dt_calloc(2 * (size_t)s->K, sizeof *s->rrecv);
    if (!s->bsend || !s->hsend || !s->rrecv) {
        st = DT_ERR_NOMEM;
        goto fail;
    }
    if (s->world) {
        /* Every receive is posted before its message can come (a server
         * posts a worker's next buckets before it replies, a worker its
         * replies before its header), so every message can go at once:
         * no rendezvous round trip. */
        size_t largest = HDR * sizeof(int64_t);
        for (int k = 0; k < s->K; k++) { /* a shard is at least as large as its buckets */
            size_t bytes = (s->shard_begin[k + 1] - s->shard_begin[k]) * sizeof(float);
            largest = bytes > largest ? bytes : largest;
        }
        DT_CHECK_GOTO(dt_mailbox_create_with(&s->mb, s->world, largest), st, fail);
        if (s->rank < s->K)
            DT_CHECK_GOTO(server_create(s, c, &s->srv), st, fail);
    }
    snprintf(s->ident, sizeof s->ident,
             "ps servers=%d staleness=%" PRId64 " delay-comp=%s lambda=%g workers=%d "
             "optimizer=%s buckets=%d",
             s->K, s->S, dt_delay_comp_names[s->comp], c->dc_lambda, s->W,
             c->optim ? dt_optim_names[c->optim->kind] : "-", s->nbuckets);
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

/* The planner's view from a server's rank (the busiest): its worker's
 * pushes to the other servers, a shard each, sent as backward finishes
 * them; its server's replies, a shard to each other worker, while they
 * wait. */
void dt_ps_sync_plan_cost(const dt_cost_query *q, dt_strategy_cost *out) {
    int W = q->degree[DT_AXIS_DP] * q->degree[DT_AXIS_CP];
    int K = q->ps_servers > 0 ? q->ps_servers : 1;
    if (W <= 1)
        return;
    double shard = q->params * sizeof(float) / K;
    if (K > 1)
        dt_strategy_cost_add(out, (dt_comm_cost){.coll = DT_COLL_SEND,
                                                 .axis = DT_AXIS_DP,
                                                 .bytes = shard,
                                                 .calls = K - 1,
                                                 .backward = true,
                                                 .overlapped = true,
                                                 .what = "ps gradient pushes"});
    dt_strategy_cost_add(out, (dt_comm_cost){.coll = DT_COLL_SEND,
                                             .axis = DT_AXIS_DP,
                                             .bytes = shard,
                                             .calls = W - 1,
                                             .what = "ps replies (a server's)"});
}
