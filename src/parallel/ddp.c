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
 *   - Critical priority: the scheduler (ddp_prio.c) sends the buffer in its
 *     own order on its thread; launch() only tells it how far this rank's
 *     final gradients reach (bucket by bucket, after prepare). A bucket is
 *     handed to the caller (finish's fn, take, settle) once, after the
 *     scheduler said it is averaged.
 */
#include "ddp_prio.h"
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
    bool given;          /* critical: handed to the caller this step */
    /* Adaptive (auto_codecs): one compressed allreduce per candidate; cc is
     * cand[choice]; `held` ran last and may still hold a residual. */
    dt_callreduce *cand[DT_CODEC_AUTO_MAX];
    int choice, held, ran; /* ran: the candidate of this step's run (-1: plain) */
    double t_run;          /* coded: when the worker started this step's run */
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
    /* Adaptive codec choice (see "Adaptive choice" below). */
    int ncand; /* candidates; 0: a fixed codec or none */
    dt_codec_spec cand[DT_CODEC_AUTO_MAX];
    double cpu[DT_CODEC_AUTO_MAX]; /* measured codec seconds per value, no communication */
    double alpha;                  /* seconds per collective (a probe's, else 0) */
    double beta;                   /* agreed link estimate, bytes/s; 0: none yet */
    double t_begin, t_finish;      /* this step's backward */
    bool measured;                 /* the last step's timings are in */
    char report[192];              /* the last choice, "none*12,int8*7" */
    /* Critical priority (ddp_prio.c); NULL under FIFO or without peers. */
    dt__prio *prio;
    bool later;        /* finish_later returned; buckets not all handed out */
    size_t given;      /* buckets handed out this step */
    double blocked_ms; /* waits since dt_ddp_take_blocked_ms last read it */
    double comm_done;  /* the last step's last completion */
};

const char *const dt_comm_priority_names[DT_COMM_PRIORITY_COUNT] = {"fifo", "critical"};

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

/* Bucket i's compressed allreduce over g (NULL: the codec alone) with
 * `spec`; t: scratch for PowerSGD's matrices. */
static dt_status make_one(dt_ddp *d, const dt_ddp_options *o, const dt_codec_spec *spec,
                          dt_ef_mode ef, size_t i, dt_group *g, dt_powersgd_tensor *t,
                          dt_callreduce **out) {
    dt_callreduce_config cfg = dt_callreduce_config_default();
    cfg.seed = o->seed;
    cfg.bucket = (uint32_t)i;
    cfg.ef = ef;
    cfg.scatter = d->shard; /* ZeRO: a reduce-scatter in the plain path's pieces */
    if (spec->kind == DT_CODEC_POWERSGD) {
        cfg.tensors = t;
        cfg.ntensors = bucket_tensors(o, d->b[i].begin, d->b[i].end, t);
        cfg.min_compress = o->dense_below;
    }
    dt_status st = dt_callreduce_create(out, g, spec, d->b[i].end - d->b[i].begin, &cfg);
    if (st != DT_OK)
        dt_error_prefix("bucket %zu", i);
    return st;
}

static void measure_codecs(dt_ddp *d, const dt_ddp_options *o, dt_powersgd_tensor *t);

static dt_status make_codecs(dt_ddp *d, const dt_ddp_options *o) {
    dt_codec_spec spec = o->codec;
    dt_ef_mode ef = o->ef;
    if (o->grad_dtype != DT_F32) {
        /* A 16-bit allreduce is the cast codec without error feedback. */
        spec = (dt_codec_spec){.kind = o->grad_dtype == DT_BF16 ? DT_CODEC_BF16 : DT_CODEC_FP16};
        ef = DT_EF_OFF;
    }
    dt_powersgd_tensor *t = dt_calloc(o->tensors ? o->ntensors + 1 : 1, sizeof *t);
    if (!t)
        return DT_ERR_NOMEM;
    /* Adaptive: every candidate; the dense_below staging whenever one of
     * them is a codec (they all are but none). */
    int nc = d->ncand ? d->ncand : 1;
    bool any_codec = spec.kind != DT_CODEC_NONE;
    for (int c = 0; c < d->ncand; c++)
        any_codec |= d->cand[c].kind != DT_CODEC_NONE;
    dt_status st = DT_OK;
    for (size_t i = 0; i < d->nb && st == DT_OK; i++) {
        bool psgd = spec.kind == DT_CODEC_POWERSGD;
        for (int c = 0; c < d->ncand; c++)
            psgd |= d->cand[c].kind == DT_CODEC_POWERSGD;
        if (o->dense_below > 0 && any_codec && !(psgd && !d->ncand))
            DT_CHECK_GOTO(dense_ranges(&d->b[i], o), st, out);
        for (int c = 0; c < nc; c++) {
            const dt_codec_spec *sc = d->ncand ? &d->cand[c] : &spec;
            st = make_one(d, o, sc, ef, i, d->g, t, d->ncand ? &d->b[i].cand[c] : &d->b[i].cc);
            if (st != DT_OK)
                goto out;
        }
        d->b[i].held = -1;
        if (d->ncand)
            d->b[i].cc = d->b[i].cand[0];
    }
    if (d->ncand)
        measure_codecs(d, o, t);
out:
    dt_free(t);
    return st;
}

static void *worker_main(void *arg);
static void release_unowned(const dt_ddp *d, const struct bucket *b);
static void choose(dt_ddp *d);

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
    if ((unsigned)o.priority >= DT_COMM_PRIORITY_COUNT)
        return dt_error_set(DT_ERR_INVALID, "communication priority %d is not one",
                            (int)o.priority);
    if (o.priority == DT_COMM_PRIORITY_CRITICAL &&
        (o.shard || o.codec.kind != DT_CODEC_NONE || o.grad_dtype != DT_F32))
        return dt_error_set(DT_ERR_INVALID,
                            "critical communication priority schedules plain f32 allreduces: no "
                            "codec, no 16-bit gradient dtype, no ZeRO (use fifo with those)");
    int ncand = o.auto_codecs ? o.auto_codecs->n : 0;
    if (ncand < 0 || ncand > DT_CODEC_AUTO_MAX || ncand == 1)
        return dt_error_set(DT_ERR_INVALID, "adaptive codec choice: %d candidates (2..%d)", ncand,
                            DT_CODEC_AUTO_MAX);
    if (ncand && (o.codec.kind != DT_CODEC_NONE || o.grad_dtype != DT_F32 || o.shard ||
                  o.priority != DT_COMM_PRIORITY_FIFO))
        return dt_error_set(DT_ERR_INVALID,
                            "adaptive codec choice replaces the codec: no fixed codec, no 16-bit "
                            "gradient dtype, no ZeRO, FIFO order");
    size_t piece_bytes = o.piece_bytes ? o.piece_bytes : DT_DDP_DEFAULT_PIECE_BYTES;
    if (piece_bytes < sizeof(float))
        return dt_error_set(DT_ERR_INVALID, "piece size %zu bytes: must be at least 4",
                            piece_bytes);
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
    d->coded = (o.codec.kind != DT_CODEC_NONE || o.grad_dtype != DT_F32 || ncand > 0) && g &&
               d->world > 1 && d->nb > 0;
    if (d->coded && ncand) {
        d->ncand = ncand;
        memcpy(d->cand, o.auto_codecs->cand, sizeof d->cand);
    }
    if (o.priority == DT_COMM_PRIORITY_CRITICAL && g && d->world > 1 && d->nb > 0) {
        dt_status st =
            dt__prio_create(&d->prio, g, grads, n, per, d->nb, piece_bytes / sizeof(float));
        if (st != DT_OK) {
            dt_ddp_destroy(d);
            return st;
        }
    }
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
    dt__prio_destroy(d->prio);
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
        if (d->ncand)
            for (int c = 0; c < d->ncand; c++)
                dt_callreduce_destroy(d->b[i].cand[c]);
        else
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
    DT_ASSERT(!d->later); /* the last finish_later was settled */
    for (size_t i = 0; i < d->nb; i++) {
        d->b[i].launched = d->b[i].done = d->b[i].given = false;
        d->b[i].work = NULL;
        d->b[i].st = DT_OK;
    }
    d->given = 0;
    if (d->prio)
        dt__prio_begin(d->prio);
    if (d->ncand)
        choose(d); /* a small collective; the worker is idle */
    d->t_begin = dt_now();
    if (d->coded) {
        pthread_mutex_lock(&d->mu);
        DT_ASSERT(d->w_done == d->w_queued); /* finish saw the last step through */
        d->w_queued = d->w_done = 0;
        pthread_mutex_unlock(&d->mu);
    }
}

/* ------------------------------------------------------------------------ */
/* Adaptive choice (dt_ddp_options.auto_codecs)                             */
/* ------------------------------------------------------------------------ */
/*
 * Per step, at dt_ddp_begin(d, true), every rank contributes what it
 * measured in its last communicating step and the ranks take the maximum
 * of each (one small allreduce), so all decide from the same numbers:
 *   - the link: bytes sent / (run time - codec time) over the buckets,
 *     the best rank's (the others' runs include waiting for slower peers);
 *     averaged with the previous estimate;
 *   - the compute window: when backward launched each bucket and when it
 *     ended, relative to its start (the slowest rank's);
 *   - each candidate's codec time per value, measured once at creation by
 *     running it without communication (the slowest rank's).
 * A bucket's predicted run with candidate c is codec time + wire bytes /
 * link + one latency per collective; dt_codec_auto_choose picks. Until a
 * step was measured (the first), every bucket goes uncompressed with the
 * first candidate, unless a probe of the group (DT_TOPO_PROBE,
 * dt_group_probe) gave the link already, in which case the rule runs
 * with no compute window.
 */

/* Codec seconds per value, without communication, on bucket 0's size. */
static void measure_codecs(dt_ddp *d, const dt_ddp_options *o, dt_powersgd_tensor *t) {
    size_t m = d->b[0].end - d->b[0].begin;
    float *x = dt_alloc((m ? m : 1) * sizeof *x);
    for (int c = 0; c < d->ncand; c++) {
        dt_callreduce *cc = NULL;
        d->cpu[c] = 0;
        if (!x || make_one(d, o, &d->cand[c], o->ef, 0, NULL, t, &cc) != DT_OK) {
            dt_callreduce_destroy(cc);
            continue; /* unmeasured: counted as free */
        }
        double best = INFINITY;
        for (int rep = 0; rep < 2; rep++) {
            for (size_t k = 0; k < m; k++)
                x[k] = (float)sin(0.001 * (double)k + rep) * 1e-3f;
            double t0 = dt_now();
            dt_status st = dt_callreduce_run(cc, x, (uint64_t)rep);
            double dt = dt_now() - t0;
            best = st == DT_OK && dt < best ? dt : best;
        }
        d->cpu[c] = isfinite(best) && m ? best / (double)m : 0;
        dt_callreduce_destroy(cc);
    }
    dt_free(x);
    dt_link_params links[DT_LINK_CLASS_COUNT];
    if (dt_group_links(d->g, links)) {
        /* The slowest class measured bounds an allreduce over the group. */
        for (int k = 0; k < DT_LINK_CLASS_COUNT; k++)
            if (links[k].beta > 0 && (d->beta == 0 || links[k].beta < d->beta)) {
                d->beta = links[k].beta;
                d->alpha = links[k].alpha;
            }
    }
}

/* Collectives one run of candidate c issues (latency terms). */
static int collectives_of(const dt_ddp *d, const bucket *b, int c) {
    return (d->cand[c].kind == DT_CODEC_POWERSGD ? 2 : 1) + (b->nd > 0 && c >= 0 ? 1 : 0);
}

/* "none*12,int8*7": the choice per bucket, runs merged. */
static void format_choice(dt_ddp *d) {
    size_t off = 0;
    d->report[0] = '\0';
    for (size_t i = 0; i < d->nb && off < sizeof d->report;) {
        size_t j = i;
        while (j < d->nb && d->b[j].choice == d->b[i].choice)
            j++;
        char name[64];
        dt_codec_format(&d->cand[d->b[i].choice], name, sizeof name);
        int w = snprintf(d->report + off, sizeof d->report - off, "%s%s*%zu", off ? "," : "", name,
                         j - i);
        if (w < 0)
            break;
        off += (size_t)w;
        i = j;
    }
}

static void choose(dt_ddp *d) {
    /* [valid, link, backward span, launch of each bucket, codec time of
     * each candidate], maximum over the ranks. */
    size_t nv = 3 + d->nb + (size_t)d->ncand;
    double *v = dt_calloc(nv, sizeof *v);
    dt_auto_bucket *ab = dt_calloc(d->nb, sizeof *ab);
    int *pick = dt_calloc(d->nb, sizeof *pick);
    if (!v || !ab || !pick) {
        /* No memory for a decision: keep the last one. Every rank still
         * takes part in the collective below on a buffer of its own. */
        double one = 0;
        (void)dt_group_allreduce(d->g, &one, &one, 1, DT_F64, DT_MAX);
        goto out;
    }
    if (d->measured) {
        double w = 0, t = 0;
        for (size_t i = 0; i < d->nb; i++) {
            const bucket *b = &d->b[i];
            if (b->st != DT_OK || b->t_done <= b->t_run)
                continue;
            double codec = b->ran >= 0 ? d->cpu[b->ran] * (double)(b->end - b->begin) : 0;
            w += (double)(b->ran >= 0
                              ? dt_callreduce_wire_bytes(b->cand[b->ran]) + ring_bytes(d, b->nd)
                              : ring_bytes(d, b->end - b->begin));
            t += fmax(b->t_done - b->t_run - codec, 1e-6);
        }
        v[0] = t > 0 && w > 0;
        v[1] = t > 0 ? w / t : 0;
        v[2] = d->t_finish - d->t_begin;
        for (size_t i = 0; i < d->nb; i++)
            v[3 + i] = d->b[i].t_launch - d->t_begin;
    }
    for (int c = 0; c < d->ncand; c++)
        v[3 + d->nb + (size_t)c] = d->cpu[c];
    /* One more collective on the group: every rank calls begin(d, true)
     * once per communicating step, in the same order as its buckets. */
    if (dt_group_allreduce(d->g, v, v, nv, DT_F64, DT_MAX) != DT_OK)
        goto out; /* the group failed: the buckets will say so */
    for (int c = 0; c < d->ncand; c++)
        d->cpu[c] = v[3 + d->nb + (size_t)c];
    if (v[0] > 0)
        d->beta = d->beta > 0 ? 0.5 * d->beta + 0.5 * v[1] : v[1];
    if (d->beta <= 0)
        goto out; /* nothing known of the link yet: the first candidate */
    for (size_t i = 0; i < d->nb; i++) {
        bucket *b = &d->b[i];
        ab[i].launch = v[0] > 0 ? v[3 + i] : 0;
        for (int c = 0; c < d->ncand; c++) {
            uint64_t wire = dt_callreduce_wire_bytes(b->cand[c]) + ring_bytes(d, b->nd);
            ab[i].cost[c] = d->cpu[c] * (double)(b->end - b->begin) + (double)wire / d->beta +
                            d->alpha * collectives_of(d, b, c);
        }
    }
    /* The bucket's cc follows when the worker runs it (it flushes the old
     * candidate's residual first). */
    dt_codec_auto_choose(ab, d->nb, d->ncand, v[0] > 0 ? v[2] : 0, 0.05, pick);
    for (size_t i = 0; i < d->nb; i++)
        d->b[i].choice = pick[i];
out:
    format_choice(d);
    dt_free(v);
    dt_free(ab);
    dt_free(pick);
}

const char *dt_ddp_codec_choice(const dt_ddp *d, double *link_bytes_per_s) {
    if (link_bytes_per_s)
        *link_bytes_per_s = d->beta;
    return d->ncand ? d->report : NULL;
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
    dt_status st2 =
        tail ? dt_group_allreduce(d->g, p + q * d->world, p + q * d->world, tail, DT_F32, DT_AVG)
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
        b->t_run = dt_now();
        if (!dense && d->ncand && b->choice != b->held) {
            /* Another codec takes the range over: what the last one still
             * owed (its residual) goes out with this run. */
            if (b->held >= 0)
                dt_callreduce_flush_residual(b->cand[b->held], p);
            b->held = b->choice;
            b->cc = b->cand[b->choice];
        }
        b->ran = dense ? -1 : d->ncand ? b->choice : 0;
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
    if (d->prio) {
        dt__prio_ready(d->prio, b->begin);
        return;
    }
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
    if (d->prio) {
        while (d->ndone < d->next && dt__prio_done(d->prio, d->ndone, &d->b[d->ndone].t_done))
            d->b[d->ndone++].done = true;
        return;
    }
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

/* ------------------------------------------------------------------------ */
/* Handing buckets out under critical priority                              */
/* ------------------------------------------------------------------------ */

/* Bucket i to the caller once: wait until the scheduler averaged it (the
 * wait is blocked time), then fn. Without peers it is final at launch. */
static void give(dt_ddp *d, size_t i, dt_ddp_range_fn fn, void *user) {
    bucket *b = &d->b[i];
    if (b->given)
        return;
    if (d->prio) {
        double t0 = dt_now();
        dt_status st = dt__prio_wait(d->prio, i, &b->t_done);
        double ms = (dt_now() - t0) * 1e3;
        d->blocked_ms += ms;
        d->stats.exposed_comm_ms += ms;
        if (st != DT_OK && d->err == DT_OK)
            d->err = st;
    } else {
        b->t_done = dt_now();
    }
    b->done = b->given = true;
    d->given++;
    if (d->err == DT_OK && fn)
        fn(user, b->begin, b->end);
}

/* Every bucket handed out: the step's communication time (from its first
 * piece's start to its last one's end) and when it ended. */
static void given_all(dt_ddp *d) {
    d->later = false;
    if (!d->prio)
        return;
    size_t np;
    int na;
    const dt_ddp_piece *pc = dt__prio_log(d->prio, &np, &na);
    if (np == 0)
        return;
    d->stats.comm_ms = (pc[np - 1].t_end - pc[0].t_start) * 1e3;
    d->comm_done = pc[np - 1].t_end;
}

static dt_status critical_finish(dt_ddp *d, dt_ddp_range_fn fn, void *user, bool later) {
    d->in_backward = false;
    DT_ASSERT(d->sync); /* finish follows the backward that communicates */
    while (d->next < d->nb)
        launch(d);
    d->stats = (dt_ddp_stats){.buckets = (int)d->nb,
                              .launched_in_backward = communicates(d) ? d->launched_in_backward : 0,
                              .bytes_sent = dt_ddp_step_bytes(d)};
    d->sync = false;
    d->step++;
    d->later = d->nb > 0;
    if (later)
        return DT_OK;
    return dt_ddp_settle(d, fn, user);
}

dt_status dt_ddp_finish_later(dt_ddp *d) {
    DT_ASSERT(d->prio || !communicates(d)); /* critical priority, or nothing to wait for */
    return critical_finish(d, NULL, NULL, true);
}

dt_status dt_ddp_take(dt_ddp *d, size_t begin, size_t end, dt_ddp_range_fn fn, void *user) {
    if (!d->later)
        return DT_OK;
    for (size_t i = 0; i < d->nb; i++)
        if (d->b[i].begin < end && d->b[i].end > begin)
            give(d, i, fn, user);
    if (d->given == d->nb)
        given_all(d);
    if (d->err != DT_OK) /* kept for settle, which clears it */
        return dt_error_set(d->err, "gradient allreduce: %s", dt_last_error());
    return DT_OK;
}

dt_status dt_ddp_settle(dt_ddp *d, dt_ddp_range_fn fn, void *user) {
    if (!d->later)
        return DT_OK;
    for (size_t i = 0; i < d->nb; i++)
        give(d, i, fn, user);
    given_all(d);
    dt_status st = d->err;
    d->err = DT_OK;
    if (st != DT_OK)
        dt_error_prefix("gradient allreduce");
    return st;
}

bool dt_ddp_pending(const dt_ddp *d) { return d->later; }

double dt_ddp_take_blocked_ms(dt_ddp *d) {
    double ms = d->blocked_ms;
    d->blocked_ms = 0;
    return ms;
}

double dt_ddp_comm_done_at(const dt_ddp *d) { return d->comm_done; }

const dt_ddp_piece *dt_ddp_pieces(const dt_ddp *d, size_t *count, int *agreements) {
    *count = 0;
    *agreements = 0;
    return d->prio ? dt__prio_log(d->prio, count, agreements) : NULL;
}

dt_status dt_ddp_finish(dt_ddp *d, dt_ddp_range_fn fn, void *user) {
    if (d->prio)
        return critical_finish(d, fn, user, false);
    d->in_backward = false;
    DT_ASSERT(d->sync); /* finish follows the backward that communicates */
    d->t_finish = dt_now();
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
    d->blocked_ms += s.exposed_comm_ms;
    d->comm_done = prev_done;
    d->measured = d->ncand > 0 && d->err == DT_OK;
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
 * dt_callreduce state in bucket order (raw little-endian). Adaptive:
 * magic "DDA1", and per bucket an i32, the candidate that ran last (-1:
 * none yet), then every candidate's state. */

#define AUTO_MAGIC 0x31414444u /* "DDA1" */

/* The compressed allreduces of bucket i: its candidates, or its codec. */
static int cands_of(const dt_ddp *d, size_t i, dt_callreduce **out) {
    if (!d->ncand) {
        out[0] = d->b[i].cc;
        return 1;
    }
    for (int c = 0; c < d->ncand; c++)
        out[c] = d->b[i].cand[c];
    return d->ncand;
}

size_t dt_ddp_state_bytes(const dt_ddp *d) {
    if (!d->coded)
        return 0;
    size_t bytes = 16;
    dt_callreduce *cs[DT_CODEC_AUTO_MAX];
    for (size_t i = 0; i < d->nb; i++) {
        bytes += d->ncand ? 4 : 0;
        for (int c = 0, k = cands_of(d, i, cs); c < k; c++)
            bytes += dt_callreduce_state_bytes(cs[c]);
    }
    return bytes;
}

dt_status dt_ddp_get_state(const dt_ddp *d, void *buf, size_t len) {
    size_t need = dt_ddp_state_bytes(d);
    if (len < need)
        return dt_error_set(DT_ERR_INVALID, "DDP state: buffer of %zu bytes, need %zu", len, need);
    if (need == 0)
        return DT_OK;
    uint8_t *p = buf;
    uint32_t hdr[2] = {d->ncand ? AUTO_MAGIC : STATE_MAGIC, (uint32_t)d->nb};
    memcpy(p, hdr, 8);
    memcpy(p + 8, &d->step, 8);
    p += 16;
    dt_callreduce *cs[DT_CODEC_AUTO_MAX];
    for (size_t i = 0; i < d->nb; i++) {
        if (d->ncand) {
            int32_t held = d->b[i].held;
            memcpy(p, &held, 4);
            p += 4;
        }
        for (int c = 0, k = cands_of(d, i, cs); c < k; c++) {
            size_t sb = dt_callreduce_state_bytes(cs[c]);
            DT_CHECK(dt_callreduce_get_state(cs[c], p, sb));
            p += sb;
        }
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
    uint32_t magic = d->ncand ? AUTO_MAGIC : STATE_MAGIC;
    if (hdr[0] != magic || hdr[1] != (uint32_t)d->nb)
        return dt_error_set(DT_ERR_CORRUPT,
                            "DDP state: magic 0x%08x, %u buckets (expected 0x%08x, %zu)", hdr[0],
                            hdr[1], magic, d->nb);
    if (step >= (1ull << 36))
        return dt_error_set(DT_ERR_CORRUPT, "DDP state: step %" PRIu64 " is not below 2^36", step);
    p += 16;
    dt_callreduce *cs[DT_CODEC_AUTO_MAX];
    for (size_t i = 0; i < d->nb; i++) {
        int32_t held = -1;
        if (d->ncand) {
            memcpy(&held, p, 4);
            p += 4;
            if (held < -1 || held >= d->ncand) {
                dt_ddp_reset_state(d);
                return dt_error_set(DT_ERR_CORRUPT, "DDP state of bucket %zu: candidate %d of %d",
                                    i, (int)held, d->ncand);
            }
        }
        for (int c = 0, k = cands_of(d, i, cs); c < k; c++) {
            size_t sb = dt_callreduce_state_bytes(cs[c]);
            dt_status st = dt_callreduce_set_state(cs[c], p, sb);
            if (st != DT_OK) {
                dt_ddp_reset_state(d); /* no half-restored mix */
                dt_error_prefix("DDP state of bucket %zu", i);
                return st;
            }
            p += sb;
        }
        if (d->ncand) {
            d->b[i].held = d->b[i].choice = held;
            if (held < 0)
                d->b[i].choice = 0;
            d->b[i].cc = d->b[i].cand[d->b[i].choice];
        }
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
    dt_callreduce *cs[DT_CODEC_AUTO_MAX];
    for (size_t i = 0; i < d->nb; i++)
        for (int c = 0, k = cands_of(d, i, cs); c < k; c++)
            if (cs[c])
                dt_callreduce_reset(cs[c]);
}

void dt_ddp_scale_state(dt_ddp *d, float factor) {
    dt_callreduce *cs[DT_CODEC_AUTO_MAX];
    for (size_t i = 0; i < d->nb; i++)
        for (int c = 0, k = cands_of(d, i, cs); c < k; c++)
            if (cs[c])
                dt_callreduce_scale_residual(cs[c], factor);
}
