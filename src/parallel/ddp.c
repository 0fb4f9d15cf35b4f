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
 *   - With a codec or a 16-bit grad_dtype ("coded"), launched buckets are
 *     queued to one worker thread that runs their compressed allreduces in
 *     queue order; the caller thread then issues nothing on the group until
 *     finish has seen every queued bucket complete. w_queued/w_done (under
 *     mu) are the only fields both threads touch; a bucket's status and
 *     t_done are written by the worker before it advances w_done.
 *   - dense_below ranges (codecs other than PowerSGD) are zero in what the
 *     codec sees, so its residual there stays zero; their values travel in
 *     a plain f32 allreduce right after the codec's run, on the worker.
 *   - Sharded and coded (ZeRO with a codec): each bucket's dt_callreduce is
 *     a reduce-scatter (dt_callreduce_config.scatter) cutting the bucket
 *     into the same pieces as the plain path, so only this replica's piece
 *     of the result is used; the dense warm-up reduce-scatters plain f32.
 */
#include "dtrain/parallel.h"
#include "dtrain/tensor.h"

#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct bucket {
    size_t begin, end; /* range of the gradient buffer */
    dt_work *work;     /* in-flight allreduce (sharded: reduce-scatter), NULL when not started or
                          done */
    dt_work *tail;     /* sharded: the allreduce of the remainder, if any */
    dt_work *gather;   /* sharded: the parameters' allgather in flight */
    dt_work *gtail;    /* ... and the remainder's broadcast */
    dt_callreduce *cc; /* coded: the bucket's compressed allreduce */
    /* dense_below (not PowerSGD): the small tensors' values in the bucket,
     * nr ranges [lo, hi) in bucket coordinates, nd values, staged in
     * `stage` for their own f32 allreduce after the codec's run. */
    size_t *lo, *hi, nr, nd;
    float *stage;
    dt_status st;        /* coded: status of this step's run */
    char msg[256];       /* coded: its error message */
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
    /* Coded buckets (see the invariants). */
    bool coded;
    uint64_t step; /* communicating steps finished: keys the codecs' random numbers */
    bool dense;    /* this step: plain f32 allreduce, codec state untouched (set between steps) */
    dt_thread *worker;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool sync_init; /* mu and cv exist */
    size_t w_queued, w_done;
    bool w_quit;
    void (*prepare)(void *user, size_t begin, size_t end); /* dt_ddp_options.prepare */
    void *prepare_user;
    bool shard;   /* buckets are reduce-scattered (ZeRO) */
    bool release; /* ... and the gradient memory outside this replica's pieces returned */
};

#define STATE_MAGIC 0x31534444u /* "DDS1" */

dt_ddp_options dt_ddp_options_default(void) {
    return (dt_ddp_options){.bucket_bytes = DT_DDP_DEFAULT_BUCKET_BYTES,
                            .grad_dtype = DT_F32,
                            .codec = {.kind = DT_CODEC_NONE},
                            .ef = DT_EF_DEFAULT};
}

dt_status dt_ddp_create(dt_ddp **out, dt_group *g, float *params, float *grads, size_t n,
                        size_t bucket_bytes) {
    dt_ddp_options o = dt_ddp_options_default();
    o.bucket_bytes = bucket_bytes;
    return dt_ddp_create_with(out, g, params, grads, n, &o);
}

/* The matrices PowerSGD sees in bucket [begin, end): the whole rows of
 * each tensor inside it, in bucket coordinates; without tensors, the
 * bucket as one matrix of ceil(sqrt(m)) columns. Returns the count. */
static size_t bucket_tensors(const dt_ddp_options *o, size_t begin, size_t end,
                             dt_powersgd_tensor *out) {
    size_t m = end - begin, k = 0;
    if (!o->tensors) {
        size_t cols = (size_t)ceil(sqrt((double)m));
        if (cols > 0 && m / cols > 0)
            out[k++] = (dt_powersgd_tensor){.offset = 0, .rows = m / cols, .cols = cols};
        return k;
    }
    for (size_t i = 0; i < o->ntensors; i++) {
        const dt_powersgd_tensor *t = &o->tensors[i];
        if (t->cols == 0 || t->rows == 0)
            continue;
        size_t t_end = t->offset + t->rows * t->cols;
        if (t_end <= begin || t->offset >= end)
            continue;
        size_t r0 = begin > t->offset ? (begin - t->offset + t->cols - 1) / t->cols : 0;
        size_t r1 = end < t_end ? (end - t->offset) / t->cols : t->rows;
        if (r1 > r0)
            out[k++] = (dt_powersgd_tensor){
                .offset = t->offset + r0 * t->cols - begin, .rows = r1 - r0, .cols = t->cols};
    }
    return k;
}

/* The ranges of bucket b that hold tensors of fewer than o->dense_below
 * values (adjacent ones merged), and their staging buffer. */
static dt_status dense_ranges(bucket *b, const dt_ddp_options *o) {
    size_t cap = o->ntensors ? o->ntensors : 1;
    b->lo = dt_calloc(cap, sizeof *b->lo);
    b->hi = dt_calloc(cap, sizeof *b->hi);
    if (!b->lo || !b->hi)
        return DT_ERR_NOMEM;
    for (size_t i = 0; i < o->ntensors; i++) {
        const dt_powersgd_tensor *t = &o->tensors[i];
        size_t m = t->rows * t->cols, t_end = t->offset + m;
        if (m == 0 || m >= o->dense_below || t_end <= b->begin || t->offset >= b->end)
            continue;
        size_t lo = (t->offset > b->begin ? t->offset : b->begin) - b->begin;
        size_t hi = (t_end < b->end ? t_end : b->end) - b->begin;
        if (b->nr > 0 && b->hi[b->nr - 1] == lo) {
            b->hi[b->nr - 1] = hi;
        } else {
            b->lo[b->nr] = lo;
            b->hi[b->nr++] = hi;
        }
        b->nd += hi - lo;
    }
    if (b->nd && !(b->stage = dt_alloc(b->nd * sizeof(float))))
        return DT_ERR_NOMEM;
    return DT_OK;
}

static dt_status make_codecs(dt_ddp *d, const dt_ddp_options *o) {
    dt_codec_spec spec = o->codec;
    dt_ef_mode ef = o->ef;
    if (o->grad_dtype != DT_F32) {
        /* A 16-bit allreduce is the cast codec without error feedback. */
        spec = (dt_codec_spec){.kind = o->grad_dtype == DT_BF16 ? DT_CODEC_BF16 : DT_CODEC_FP16};
        ef = DT_EF_OFF;
    }
    dt_powersgd_tensor *t = NULL;
    if (spec.kind == DT_CODEC_POWERSGD) {
        t = dt_calloc(o->tensors ? o->ntensors + 1 : 1, sizeof *t);
        if (!t)
            return DT_ERR_NOMEM;
    }
    dt_status st = DT_OK;
    for (size_t i = 0; i < d->nb && st == DT_OK; i++) {
        dt_callreduce_config cfg = dt_callreduce_config_default();
        cfg.seed = o->seed;
        cfg.bucket = (uint32_t)i;
        cfg.ef = ef;
        cfg.scatter = d->shard;
        if (t) {
            cfg.tensors = t;
            cfg.ntensors = bucket_tensors(o, d->b[i].begin, d->b[i].end, t);
            cfg.min_compress = o->dense_below;
        } else if (o->dense_below > 0 && spec.kind != DT_CODEC_NONE) {
            st = dense_ranges(&d->b[i], o);
            if (st != DT_OK)
                break;
        }
        st = dt_callreduce_create(&d->b[i].cc, d->g, &spec, d->b[i].end - d->b[i].begin, &cfg);
        if (st != DT_OK)
            dt_error_prefix("bucket %zu", i);
    }
    dt_free(t);
    return st;
}

static void *worker_main(void *arg);
static void release_unowned(const dt_ddp *d, const struct bucket *b);

/* Values per bucket: bucket_bytes of floats, sharded rounded down to a
 * multiple of dp (at least dp). */
static size_t bucket_floats(size_t bucket_bytes, int dp, bool shard) {
    size_t per = bucket_bytes / sizeof(float);
    if (shard) {
        per = per / (size_t)dp * (size_t)dp;
        per = per < (size_t)dp ? (size_t)dp : per;
    }
    return per;
}

/* Replica r's piece of bucket [begin, end) among dp: q = (end - begin) / dp
 * values each, the last replica also the remainder. */
static dt_range piece_of(size_t begin, size_t end, int dp, int r) {
    size_t q = (end - begin) / (size_t)dp;
    return (dt_range){begin + (size_t)r * q, r == dp - 1 ? end : begin + (size_t)(r + 1) * q};
}

dt_status dt_ddp_plan_bytes(size_t n, const dt_ddp_options *o, int world, size_t *out) {
    *out = 0;
    if (world < 2 || n == 0 || (o->codec.kind == DT_CODEC_NONE && o->grad_dtype == DT_F32))
        return DT_OK;
    /* As make_codecs: a 16-bit dtype is the cast codec without feedback. */
    dt_codec_spec spec = o->codec;
    dt_callreduce_config cfg = dt_callreduce_config_default();
    cfg.ef = o->ef;
    cfg.scatter = o->shard;
    cfg.min_compress = spec.kind == DT_CODEC_POWERSGD ? o->dense_below : 0;
    if (o->grad_dtype != DT_F32) {
        spec = (dt_codec_spec){.kind = o->grad_dtype == DT_BF16 ? DT_CODEC_BF16 : DT_CODEC_FP16};
        cfg.ef = DT_EF_OFF;
    }
    size_t per = bucket_floats(o->bucket_bytes, world, o->shard);
    for (size_t end = n; end > 0;) {
        size_t begin = end > per ? end - per : 0, b;
        DT_CHECK(dt_callreduce_plan_bytes(&spec, end - begin, world, &cfg, &b));
        *out += b;
        end = begin;
    }
    return DT_OK;
}

size_t dt_ddp_shard_count(size_t n, size_t bucket_bytes, int dp) {
    size_t per = bucket_floats(bucket_bytes, dp, true);
    return n == 0 ? 0 : (n + per - 1) / per;
}

size_t dt_ddp_shard_ranges(size_t n, size_t bucket_bytes, int dp, int rank, dt_range *out) {
    size_t per = bucket_floats(bucket_bytes, dp, true),
           nb = dt_ddp_shard_count(n, bucket_bytes, dp);
    for (size_t i = 0; i < nb; i++) { /* bucket nb - 1 - i is the i-th from the front */
        size_t b = nb - 1 - i, end = n - b * per, begin = end > per ? end - per : 0;
        out[i] = piece_of(begin, end, dp, rank);
    }
    return nb;
}

dt_status dt_ddp_create_with(dt_ddp **out, dt_group *g, float *params, float *grads, size_t n,
                             const dt_ddp_options *o_in) {
    *out = NULL;
    dt_ddp_options o = o_in ? *o_in : dt_ddp_options_default();
    size_t bucket_bytes = o.bucket_bytes;
    if (bucket_bytes < sizeof(float))
        return dt_error_set(DT_ERR_INVALID, "bucket size %zu bytes: must be at least 4",
                            bucket_bytes);
    if (o.grad_dtype != DT_F32 && o.grad_dtype != DT_BF16 && o.grad_dtype != DT_F16)
        return dt_error_set(DT_ERR_INVALID, "gradient dtype %s: must be f32, bf16 or f16",
                            dt_dtype_name(o.grad_dtype));
    if ((unsigned)o.codec.kind >= DT_CODEC_COUNT)
        return dt_error_set(DT_ERR_INVALID, "gradient codec %d is not a codec", (int)o.codec.kind);
    if (o.dense_below > 0 && !o.tensors)
        return dt_error_set(DT_ERR_INVALID,
                            "dense_below %zu needs the tensor shapes (options.tensors)",
                            o.dense_below);
    if (o.grad_dtype != DT_F32 && o.codec.kind != DT_CODEC_NONE) {
        char cb[64];
        return dt_error_set(DT_ERR_INVALID,
                            "gradient dtype %s with codec %s: choose one (the codec defines what "
                            "goes on the wire)",
                            dt_dtype_name(o.grad_dtype), dt_codec_format(&o.codec, cb, sizeof cb));
    }
    if (o.shard && o.prepare)
        return dt_error_set(DT_ERR_INVALID,
                            "sharded buckets (ZeRO) take no prepare callback (a premix reads "
                            "the whole averaged bucket)");
    dt_ddp *d = dt_calloc(1, sizeof *d);
    if (!d)
        return DT_ERR_NOMEM;
    d->g = g;
    d->rank = g ? dt_group_rank(g) : 0;
    d->world = g ? dt_group_size(g) : 1;
    d->params = params;
    d->grads = grads;
    d->n = n;
    d->prepare = o.prepare;
    d->prepare_user = o.prepare_user;
    d->shard = o.shard;
    d->release = o.shard && o.release;
    size_t per = bucket_floats(bucket_bytes, d->world, d->shard);
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
    /* Releasing: whatever the buffer held (the model zeroes it at
     * creation) is not needed outside this replica's pieces. */
    for (size_t i = 0; d->release && i < d->nb; i++)
        release_unowned(d, &d->b[i]);
    /* A world of one communicates nothing: no codec either (the gradient
     * stays exact, as without DDP). */
    d->coded =
        (o.codec.kind != DT_CODEC_NONE || o.grad_dtype != DT_F32) && g && d->world > 1 && d->nb > 0;
    if (d->coded) {
        dt_status st;
        if (d->nb >= (1u << 24)) {
            st = dt_error_set(DT_ERR_INVALID, "%zu buckets: a codec allows at most 2^24", d->nb);
            goto fail;
        }
        DT_CHECK_GOTO(make_codecs(d, &o), st, fail);
        if (pthread_mutex_init(&d->mu, NULL) != 0 || pthread_cond_init(&d->cv, NULL) != 0) {
            st = dt_error_set(DT_ERR_SYSTEM, "DDP worker: cannot create its mutex");
            goto fail;
        }
        d->sync_init = true;
        DT_CHECK_GOTO(dt_thread_create(&d->worker, "dt-ddp-codec", worker_main, d), st, fail);
        *out = d;
        return DT_OK;
    fail:
        dt_ddp_destroy(d);
        return st;
    }
    *out = d;
    return DT_OK;
}

void dt_ddp_destroy(dt_ddp *d) {
    if (!d)
        return;
    /* Outstanding work must not outlive its buffers. */
    for (size_t i = 0; i < d->nb; i++) {
        dt_work *w[4] = {d->b[i].work, d->b[i].tail, d->b[i].gather, d->b[i].gtail};
        for (int k = 0; k < 4; k++)
            if (w[k])
                (void)dt_work_wait(w[k]);
    }
    if (d->worker) {
        /* The worker finishes what is queued (each run is bounded by
         * DT_TIMEOUT) and exits. */
        pthread_mutex_lock(&d->mu);
        d->w_quit = true;
        pthread_cond_broadcast(&d->cv);
        pthread_mutex_unlock(&d->mu);
        dt_thread_join(d->worker);
    }
    if (d->sync_init) {
        pthread_mutex_destroy(&d->mu);
        pthread_cond_destroy(&d->cv);
    }
    for (size_t i = 0; i < d->nb; i++) {
        dt_callreduce_destroy(d->b[i].cc);
        dt_free(d->b[i].lo);
        dt_free(d->b[i].hi);
        dt_free(d->b[i].stage);
    }
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

/* Ring volume of an f32 allreduce of `count` values: 2 (W-1)/W of its bytes. */
static uint64_t ring_bytes(const dt_ddp *d, size_t count) {
    return (uint64_t)(2.0 * (d->world - 1) / d->world * (double)(count * sizeof(float)));
}

/* Bytes this rank sends for bucket b in a communicating step: the codec's
 * schedule (plus the exact small tensors' f32 allreduce), or a plain f32
 * ring allreduce during the dense warm-up and without a codec; sharded, a
 * ring reduce-scatter ((W-1)/W of the bucket, the gather counted apart). */
static uint64_t bucket_bytes(const dt_ddp *d, const bucket *b) {
    if (b->cc && !d->dense)
        return dt_callreduce_wire_bytes(b->cc) + ring_bytes(d, b->nd);
    if (d->shard)
        return ring_bytes(d, b->end - b->begin) / 2;
    return ring_bytes(d, b->end - b->begin);
}

uint64_t dt_ddp_step_bytes(const dt_ddp *d) {
    uint64_t sum = 0;
    for (size_t i = 0; communicates(d) && i < d->nb; i++)
        sum += bucket_bytes(d, &d->b[i]);
    return sum;
}

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
        d->b[i].st = DT_OK;
    }
    if (d->coded) {
        pthread_mutex_lock(&d->mu);
        DT_ASSERT(d->w_done == d->w_queued); /* finish saw the last step through */
        d->w_queued = d->w_done = 0;
        pthread_mutex_unlock(&d->mu);
    }
}

/* One bucket through its codec; the dense_below values (if any) around it.
 * Staged values that are not finite stay in place, so that the codec sees
 * them and handles the overflow as usual (every rank's output non-finite,
 * its state untouched); the f32 allreduce then carries them too. */
static dt_status run_coded(dt_ddp *d, bucket *b, float *p, uint64_t step) {
    bool stage = b->nd > 0;
    if (stage) {
        float *s = b->stage;
        for (size_t r = 0; r < b->nr; r++) {
            memcpy(s, p + b->lo[r], (b->hi[r] - b->lo[r]) * sizeof(float));
            s += b->hi[r] - b->lo[r];
        }
        if (dt_all_finite(b->stage, b->nd))
            for (size_t r = 0; r < b->nr; r++)
                memset(p + b->lo[r], 0, (b->hi[r] - b->lo[r]) * sizeof(float));
    }
    dt_status st = dt_callreduce_run(b->cc, p, step);
    if (stage) {
        /* Issued even after a failed run, as the later buckets' runs are:
         * no rank may skip a collective another rank makes. */
        dt_status st2 = dt_group_allreduce(d->g, b->stage, b->stage, b->nd, DT_F32, DT_AVG);
        if (st == DT_OK)
            st = st2;
        if (st != DT_OK)
            return st;
        const float *s = b->stage;
        for (size_t r = 0; r < b->nr; r++) {
            memcpy(p + b->lo[r], s, (b->hi[r] - b->lo[r]) * sizeof(float));
            s += b->hi[r] - b->lo[r];
        }
    }
    return st;
}

/* The dense warm-up's plain f32 average of bucket b at p, blocking: an
 * allreduce, or sharded, the reduce-scatter of the plain path (launch). */
static dt_status plain_reduce(dt_ddp *d, const bucket *b, float *p) {
    size_t m = b->end - b->begin;
    if (!d->shard)
        return dt_group_allreduce(d->g, p, p, m, DT_F32, DT_AVG);
    size_t q = m / (size_t)d->world, tail = m - q * (size_t)d->world;
    dt_status st = dt_group_reduce_scatter(d->g, p, p, q, DT_F32, DT_AVG);
    dt_status st2 = tail ? dt_group_allreduce(d->g, p + q * d->world, p + q * d->world, tail,
                                              DT_F32, DT_AVG)
                         : DT_OK; /* issued after a failure too, as every rank does */
    return st != DT_OK ? st : st2;
}

/* The worker: runs queued buckets' compressed allreduces in order. A
 * failed run does not stop the queue: the later buckets still issue their
 * collectives (failing fast on a failed group), so no rank is left waiting
 * for a collective another rank skipped. */
static void *worker_main(void *arg) {
    dt_ddp *d = arg;
    pthread_mutex_lock(&d->mu);
    for (;;) {
        while (!d->w_quit && d->w_done >= d->w_queued)
            pthread_cond_wait(&d->cv, &d->mu);
        if (d->w_done >= d->w_queued)
            break; /* quit with nothing queued */
        size_t i = d->w_done;
        uint64_t step = d->step;
        bool dense = d->dense;
        pthread_mutex_unlock(&d->mu);
        bucket *b = &d->b[i];
        float *p = d->grads + b->begin;
        dt_status st = dense ? plain_reduce(d, b, p) : run_coded(d, b, p, step);
        if (st != DT_OK && !dense) {
            snprintf(b->msg, sizeof b->msg, "bucket %zu: %s", i, dt_last_error());
            dt_callreduce_reset(b->cc);
        } else if (st != DT_OK) {
            snprintf(b->msg, sizeof b->msg, "bucket %zu (dense): %s", i, dt_last_error());
        }
        double t = dt_now();
        pthread_mutex_lock(&d->mu);
        b->st = st;
        b->t_done = t;
        d->w_done = i + 1;
        pthread_cond_broadcast(&d->cv);
    }
    pthread_mutex_unlock(&d->mu);
    return NULL;
}

static void launch(dt_ddp *d) {
    bucket *b = &d->b[d->next++];
    b->launched = true;
    if (d->prepare)
        d->prepare(d->prepare_user, b->begin, b->end);
    b->t_launch = dt_now();
    if (!communicates(d))
        return;
    if (d->coded) {
        pthread_mutex_lock(&d->mu);
        d->w_queued = d->next;
        pthread_cond_broadcast(&d->cv);
        pthread_mutex_unlock(&d->mu);
        return;
    }
    float *p = d->grads + b->begin;
    dt_status st;
    if (d->shard) {
        /* In place: replica r's averaged piece lands at its own place; the
         * remainder (fewer than W values) is averaged whole. */
        size_t q = (b->end - b->begin) / (size_t)d->world, tail = b->end - b->begin - q * d->world;
        st = dt_group_ireduce_scatter(d->g, p, p, q, DT_F32, DT_AVG, &b->work);
        if (st == DT_OK && tail)
            st = dt_group_iallreduce(d->g, p + q * d->world, p + q * d->world, tail, DT_F32, DT_AVG,
                                     &b->tail);
    } else {
        st = dt_group_iallreduce(d->g, p, p, b->end - b->begin, DT_F32, DT_AVG, &b->work);
    }
    if (st != DT_OK && d->err == DT_OK)
        d->err = st;
}

/* The pages of buf's bucket b outside this replica's piece. */
static void drop_unowned(const dt_ddp *d, float *buf, const bucket *b) {
    dt_range mine = piece_of(b->begin, b->end, d->world, d->rank);
    dt_mem_discard(buf + b->begin, (mine.begin - b->begin) * sizeof(float));
    dt_mem_discard(buf + mine.end, (b->end - mine.end) * sizeof(float));
}

/* ZeRO 2: once bucket b is reduce-scattered, the gradient outside this
 * replica's piece is not needed any more. */
static void release_unowned(const dt_ddp *d, const bucket *b) {
    if (d->release && communicates(d))
        drop_unowned(d, d->grads, b);
}

/* Wait for *w if set (clearing it), keeping the first error. */
static void wait_clear(dt_ddp *d, dt_work **w) {
    if (!*w)
        return;
    dt_status st = dt_work_wait(*w);
    *w = NULL;
    if (st != DT_OK && d->err == DT_OK)
        d->err = st;
}

/* A coded bucket's outcome, once the worker has passed it. */
static void coded_done(dt_ddp *d, bucket *b) {
    b->done = true;
    if (b->st != DT_OK && d->err == DT_OK) {
        d->err = dt_error_set(b->st, "%s", b->msg);
    }
    release_unowned(d, b);
}

/* Record completions in order without blocking. */
static void poll(dt_ddp *d) {
    if (d->coded) {
        pthread_mutex_lock(&d->mu);
        size_t done = d->w_done;
        pthread_mutex_unlock(&d->mu);
        while (d->ndone < done)
            coded_done(d, &d->b[d->ndone++]);
        return;
    }
    while (d->ndone < d->next) {
        bucket *b = &d->b[d->ndone];
        dt_work **ws[2] = {&b->work, &b->tail};
        for (int k = 0; k < 2; k++) {
            if (!*ws[k])
                continue;
            bool done = false;
            dt_status st = dt_work_test(*ws[k], &done);
            if (st != DT_OK) {
                if (d->err == DT_OK)
                    d->err = st;
                return;
            }
            if (!done)
                return;
            wait_clear(d, ws[k]); /* completed: collects the status, frees */
        }
        b->done = true;
        b->t_done = dt_now();
        release_unowned(d, b);
        d->ndone++;
    }
}

void dt_ddp_grad_ready(void *user, size_t ready_from) {
    dt_ddp *d = user;
    /* After an error the plain path stops launching (its group has failed);
     * coded buckets keep going, since a corrupt peer encoding leaves the
     * group working and every rank must issue the same collectives. */
    if (!d->sync || (d->err != DT_OK && !d->coded))
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
    while (d->next < d->nb && (d->err == DT_OK || d->coded))
        launch(d);
    dt_ddp_stats s = {.buckets = (int)d->nb, .launched_in_backward = d->launched_in_backward};
    double prev_done = 0;
    for (size_t i = 0; i < d->nb; i++) {
        bucket *b = &d->b[i];
        if (d->coded && !b->done) {
            double t0 = dt_now();
            pthread_mutex_lock(&d->mu);
            while (d->w_done <= i)
                pthread_cond_wait(&d->cv, &d->mu); /* each run is bounded by DT_TIMEOUT */
            pthread_mutex_unlock(&d->mu);
            s.exposed_comm_ms += (dt_now() - t0) * 1e3;
            coded_done(d, b);
            d->ndone = i + 1;
        } else if (b->work || b->tail) {
            double t0 = dt_now();
            wait_clear(d, &b->work);
            wait_clear(d, &b->tail);
            double t1 = dt_now();
            s.exposed_comm_ms += (t1 - t0) * 1e3;
            if (!b->done) {
                b->done = true;
                b->t_done = t1;
                d->ndone = i + 1;
                release_unowned(d, b);
            }
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
            s.bytes_sent += bucket_bytes(d, b);
        }
        prev_done = b->t_done;
        if (fn && d->shard) {
            dt_range r = piece_of(b->begin, b->end, d->world, d->rank);
            fn(user, r.begin, r.end);
        } else if (fn) {
            fn(user, b->begin, b->end);
        }
    }
    d->sync = false;
    d->step++;
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

dt_status dt_ddp_gather(dt_ddp *d, size_t i) {
    DT_ASSERT(d->shard && i < d->nb);
    if (!communicates(d))
        return DT_OK;
    bucket *b = &d->b[i];
    float *p = d->params + b->begin;
    size_t q = (b->end - b->begin) / (size_t)d->world, tail = b->end - b->begin - q * d->world;
    /* In place: replica r's piece is already at its place in the bucket. */
    DT_CHECK(dt_group_iallgather(d->g, p, p, q, DT_F32, &b->gather));
    if (tail)
        DT_CHECK(
            dt_group_ibroadcast(d->g, p + q * d->world, tail, DT_F32, d->world - 1, &b->gtail));
    return DT_OK;
}

dt_status dt_ddp_gather_wait_bucket(dt_ddp *d, size_t i) {
    DT_ASSERT(d->shard && i < d->nb);
    wait_clear(d, &d->b[i].gather);
    wait_clear(d, &d->b[i].gtail);
    dt_status st = d->err;
    d->err = DT_OK;
    if (st != DT_OK)
        dt_error_prefix("parameter allgather of bucket %zu", i);
    return st;
}

void dt_ddp_release_params(dt_ddp *d, size_t i) {
    DT_ASSERT(d->shard && i < d->nb && !d->b[i].gather && !d->b[i].gtail);
    if (communicates(d))
        drop_unowned(d, d->params, &d->b[i]);
}

dt_status dt_ddp_gather_wait(dt_ddp *d) {
    for (size_t i = 0; i < d->nb; i++) {
        wait_clear(d, &d->b[i].gather);
        wait_clear(d, &d->b[i].gtail);
    }
    dt_status st = d->err;
    d->err = DT_OK;
    if (st != DT_OK)
        dt_error_prefix("parameter allgather");
    return st;
}

dt_status dt_ddp_average(dt_ddp *d, double *values, size_t count) {
    if (!communicates(d) || count == 0)
        return DT_OK;
    DT_CHECK(dt_group_allreduce(d->g, values, values, count, DT_F64, DT_AVG));
    return DT_OK;
}

/* ------------------------------------------------------------------------ */
/* Codec state for checkpoints                                              */
/* ------------------------------------------------------------------------ */
/* Layout: u32 magic "DDS1", u32 buckets, u64 step, then every bucket's
 * dt_callreduce state in bucket order (raw little-endian). */

size_t dt_ddp_state_bytes(const dt_ddp *d) {
    if (!d->coded)
        return 0;
    size_t bytes = 16;
    for (size_t i = 0; i < d->nb; i++)
        bytes += dt_callreduce_state_bytes(d->b[i].cc);
    return bytes;
}

dt_status dt_ddp_get_state(const dt_ddp *d, void *buf, size_t len) {
    size_t need = dt_ddp_state_bytes(d);
    if (len < need)
        return dt_error_set(DT_ERR_INVALID, "DDP state: buffer of %zu bytes, need %zu", len, need);
    if (need == 0)
        return DT_OK;
    uint8_t *p = buf;
    uint32_t hdr[2] = {STATE_MAGIC, (uint32_t)d->nb};
    memcpy(p, hdr, 8);
    memcpy(p + 8, &d->step, 8);
    p += 16;
    for (size_t i = 0; i < d->nb; i++) {
        size_t sb = dt_callreduce_state_bytes(d->b[i].cc);
        DT_CHECK(dt_callreduce_get_state(d->b[i].cc, p, sb));
        p += sb;
    }
    return DT_OK;
}

dt_status dt_ddp_set_state(dt_ddp *d, const void *buf, size_t len) {
    size_t need = dt_ddp_state_bytes(d);
    if (len != need)
        return dt_error_set(DT_ERR_INVALID,
                            "DDP state: %zu bytes given, this DDP (%zu buckets%s) has %zu", len,
                            d->nb, d->coded ? "" : ", no codec", need);
    if (need == 0)
        return DT_OK;
    if (d->sync)
        return dt_error_set(DT_ERR_INVALID, "DDP state: cannot restore during a step");
    const uint8_t *p = buf;
    uint32_t hdr[2];
    uint64_t step;
    memcpy(hdr, p, 8);
    memcpy(&step, p + 8, 8);
    if (hdr[0] != STATE_MAGIC || hdr[1] != (uint32_t)d->nb)
        return dt_error_set(DT_ERR_CORRUPT,
                            "DDP state: magic 0x%08x, %u buckets (expected 0x%08x, %zu)", hdr[0],
                            hdr[1], STATE_MAGIC, d->nb);
    if (step >= (1ull << 36))
        return dt_error_set(DT_ERR_CORRUPT, "DDP state: step %" PRIu64 " is not below 2^36", step);
    p += 16;
    for (size_t i = 0; i < d->nb; i++) {
        size_t sb = dt_callreduce_state_bytes(d->b[i].cc);
        dt_status st = dt_callreduce_set_state(d->b[i].cc, p, sb);
        if (st != DT_OK) {
            dt_ddp_reset_state(d); /* no half-restored mix */
            dt_error_prefix("DDP state of bucket %zu", i);
            return st;
        }
        p += sb;
    }
    d->step = step;
    return DT_OK;
}

void dt_ddp_set_dense(dt_ddp *d, bool dense) {
    DT_ASSERT(!d->sync); /* between steps: the worker reads it during one */
    if (d->sync_init) {
        pthread_mutex_lock(&d->mu);
        d->dense = dense;
        pthread_mutex_unlock(&d->mu);
    } else {
        d->dense = dense;
    }
}

dt_status dt_ddp_set_fraction(dt_ddp *d, double fraction) {
    DT_ASSERT(!d->sync); /* between steps, as set_dense */
    if (!d->coded)
        return DT_OK; /* nothing is encoded */
    for (size_t i = 0; i < d->nb; i++)
        DT_CHECK(dt_callreduce_set_fraction(d->b[i].cc, fraction));
    return DT_OK;
}

void dt_ddp_reset_state(dt_ddp *d) {
    for (size_t i = 0; i < d->nb; i++)
        if (d->b[i].cc)
            dt_callreduce_reset(d->b[i].cc);
}

void dt_ddp_scale_state(dt_ddp *d, float factor) {
    for (size_t i = 0; i < d->nb; i++)
        if (d->b[i].cc)
            dt_callreduce_scale_residual(d->b[i].cc, factor);
}
