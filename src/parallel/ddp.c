/*
 * ddp.c — data-parallel gradient averaging with bucketed, overlapped
 * allreduce (see include/dtrain/parallel.h for the picture).
 *
 * Invariants:
 *   - Buckets partition [0, n) and are numbered from the end of the buffer:
 *     bucket i covers [begin_i, end_i) with end_0 = n and begin_{last} = 0.
 *   - Buckets are launched strictly in order 0, 1, 2, ... on one group, so
 *     every rank issues the same collectives in the same order even though
 *     each decides *when* from its own backward progress.
 *   - Between dt_ddp_begin(sync) and dt_ddp_finish the grads of a launched
 *     bucket are borrowed by comm; nothing here touches them until its wait.
 */
#include "dtrain/parallel.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

typedef struct bucket {
    size_t begin, end;   /* range of the gradient buffer */
    dt_work *work;       /* in-flight allreduce, NULL when not started or done */
    double t_launch;     /* when it was started */
    double t_done;       /* when its completion was observed */
    bool launched, done; /* this step */
} bucket;

struct dt_ddp {
    dt_group *g;     /* NULL: a single process */
    int rank, world; /* in g */
    float *params;   /* (n) borrowed */
    float *grads;    /* (n) borrowed */
    size_t n;        /* floats */
    bucket *b;       /* nb buckets, tail first */
    size_t nb;
    size_t next;  /* next bucket to launch */
    size_t ndone; /* buckets 0 .. ndone-1 observed complete */
    bool sync;    /* this backward communicates */
    bool in_backward;
    int launched_in_backward;
    dt_status err; /* first error raised inside the hook */
    dt_ddp_stats stats;
};

dt_status dt_ddp_create(dt_ddp **out, dt_group *g, float *params, float *grads, size_t n,
                        size_t bucket_bytes) {
    *out = NULL;
    if (bucket_bytes < sizeof(float))
        return dt_error_set(DT_ERR_INVALID, "bucket size %zu bytes: must be at least 4",
                            bucket_bytes);
    dt_ddp *d = dt_calloc(1, sizeof *d);
    if (!d)
        return DT_ERR_NOMEM;
    d->g = g;
    d->rank = g ? dt_group_rank(g) : 0;
    d->world = g ? dt_group_size(g) : 1;
    d->params = params;
    d->grads = grads;
    d->n = n;
    size_t per = bucket_bytes / sizeof(float);
    d->nb = n == 0 ? 0 : (n + per - 1) / per;
    d->b = dt_calloc(d->nb ? d->nb : 1, sizeof *d->b);
    if (!d->b) {
        dt_free(d);
        return DT_ERR_NOMEM;
    }
    for (size_t i = 0; i < d->nb; i++) {
        d->b[i].end = n - i * per;
        d->b[i].begin = d->b[i].end > per ? d->b[i].end - per : 0;
    }
    *out = d;
    return DT_OK;
}

void dt_ddp_destroy(dt_ddp *d) {
    if (!d)
        return;
    /* Outstanding work must not outlive its buffers. */
    for (size_t i = 0; i < d->nb; i++)
        if (d->b[i].work)
            (void)dt_work_wait(d->b[i].work);
    dt_free(d->b);
    dt_free(d);
}

size_t dt_ddp_num_buckets(const dt_ddp *d) { return d->nb; }

void dt_ddp_bucket(const dt_ddp *d, size_t i, size_t *begin, size_t *end) {
    DT_ASSERT(i < d->nb);
    *begin = d->b[i].begin;
    *end = d->b[i].end;
}

static bool communicates(const dt_ddp *d) { return d->g && d->world > 1; }

dt_status dt_ddp_broadcast(dt_ddp *d, void *buf, size_t count, dt_dtype dtype) {
    if (!communicates(d) || count == 0)
        return DT_OK;
    DT_CHECK(dt_group_broadcast(d->g, buf, count, dtype, 0));
    return DT_OK;
}

dt_status dt_ddp_broadcast_params(dt_ddp *d) {
    return dt_ddp_broadcast(d, d->params, d->n, DT_F32);
}

dt_status dt_ddp_check_params(dt_ddp *d, int64_t step) {
    if (!communicates(d))
        return DT_OK;
    int64_t mine = (int64_t)dt_hash64(d->params, d->n * sizeof(float), 0);
    int64_t *all = dt_calloc((size_t)d->world, sizeof *all);
    if (!all)
        return DT_ERR_NOMEM;
    dt_status st = dt_group_allgather(d->g, &mine, all, 1, DT_I64);
    if (st == DT_OK) {
        for (int r = 1; r < d->world; r++) {
            if (all[r] != all[0]) {
                st = dt_error_set(DT_ERR_MISMATCH,
                                  "parameters diverged at step %" PRId64
                                  ": rank %d hash %016" PRIx64 " != rank 0 hash %016" PRIx64,
                                  step, r, (uint64_t)all[r], (uint64_t)all[0]);
                break;
            }
        }
    }
    dt_free(all);
    return st;
}

void dt_ddp_begin(dt_ddp *d, bool sync) {
    d->sync = sync;
    d->in_backward = true;
    if (!sync)
        return;
    d->next = 0;
    d->ndone = 0;
    d->launched_in_backward = 0;
    for (size_t i = 0; i < d->nb; i++) {
        d->b[i].launched = d->b[i].done = false;
        d->b[i].work = NULL;
    }
}

static void launch(dt_ddp *d) {
    bucket *b = &d->b[d->next++];
    b->launched = true;
    b->t_launch = dt_now();
    if (!communicates(d))
        return;
    float *p = d->grads + b->begin;
    dt_status st = dt_group_iallreduce(d->g, p, p, b->end - b->begin, DT_F32, DT_AVG, &b->work);
    if (st != DT_OK && d->err == DT_OK)
        d->err = st;
}

/* Record completions in order without blocking. */
static void poll(dt_ddp *d) {
    while (d->ndone < d->next) {
        bucket *b = &d->b[d->ndone];
        if (b->work) {
            bool done = false;
            dt_status st = dt_work_test(b->work, &done);
            if (st != DT_OK) {
                if (d->err == DT_OK)
                    d->err = st;
                return;
            }
            if (!done)
                return;
            st = dt_work_wait(b->work); /* completed: collects the status, frees */
            b->work = NULL;
            if (st != DT_OK && d->err == DT_OK)
                d->err = st;
        }
        b->done = true;
        b->t_done = dt_now();
        d->ndone++;
    }
}

void dt_ddp_grad_ready(void *user, size_t ready_from) {
    dt_ddp *d = user;
    if (!d->sync || d->err != DT_OK)
        return;
    while (d->next < d->nb && ready_from <= d->b[d->next].begin) {
        launch(d);
        if (d->in_backward && ready_from > 0)
            d->launched_in_backward++;
    }
    if (communicates(d))
        poll(d);
}

dt_status dt_ddp_finish(dt_ddp *d, dt_ddp_range_fn fn, void *user) {
    d->in_backward = false;
    DT_ASSERT(d->sync); /* finish follows the backward that communicates */
    while (d->next < d->nb && d->err == DT_OK)
        launch(d);
    dt_ddp_stats s = {.buckets = (int)d->nb, .launched_in_backward = d->launched_in_backward};
    double prev_done = 0;
    for (size_t i = 0; i < d->nb; i++) {
        bucket *b = &d->b[i];
        if (b->work) {
            double t0 = dt_now();
            dt_status st = dt_work_wait(b->work);
            b->work = NULL;
            double t1 = dt_now();
            s.exposed_comm_ms += (t1 - t0) * 1e3;
            if (!b->done) {
                b->done = true;
                b->t_done = t1;
                d->ndone = i + 1;
            }
            if (st != DT_OK && d->err == DT_OK)
                d->err = st;
        } else if (!b->done) {
            b->done = true;
            b->t_done = dt_now();
        }
        if (d->err != DT_OK)
            continue; /* keep waiting for the rest so no buffer stays borrowed */
        /* Buckets run one after another on the group: bucket i is in flight
         * from its launch or the previous completion, whichever is later. */
        double start = b->t_launch > prev_done ? b->t_launch : prev_done;
        if (communicates(d)) {
            s.comm_ms += (b->t_done > start ? b->t_done - start : 0) * 1e3;
            s.bytes_sent += (uint64_t)(2.0 * (d->world - 1) / d->world *
                                       (double)((b->end - b->begin) * sizeof(float)));
        }
        prev_done = b->t_done;
        if (fn)
            fn(user, b->begin, b->end);
    }
    d->sync = false;
    if (!communicates(d)) {
        s.comm_ms = s.exposed_comm_ms = 0;
        s.launched_in_backward = 0;
    }
    d->stats = s;
    dt_status st = d->err;
    d->err = DT_OK;
    if (st != DT_OK)
        dt_error_prefix("gradient allreduce");
    return st;
}

const dt_ddp_stats *dt_ddp_last_stats(const dt_ddp *d) { return &d->stats; }

dt_status dt_ddp_average(dt_ddp *d, double *values, size_t count) {
    if (!communicates(d) || count == 0)
        return DT_OK;
    DT_CHECK(dt_group_allreduce(d->g, values, values, count, DT_F64, DT_AVG));
    return DT_OK;
}
