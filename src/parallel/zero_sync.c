/*
 * zero_sync.c — ZeRO as a dt_grad_sync (docs/zero.md): the bucket engine
 * (ddp.c) in its sharded mode, each bucket reduce-scattered so that every
 * data-parallel replica gets the average of its piece only, and an
 * optimizer that owns (and keeps state for) exactly those pieces.
 *
 * Per step:
 *   backward      buckets are reduce-scattered as they become final
 *                 (overlapping backward, as DDP's allreduces do; with a
 *                 codec, each bucket's compressed reduce-scatter on the
 *                 engine's worker thread);
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
 * Stage 3 shards the parameters too: a replica keeps only its pieces; the
 * model's parameter hooks (nn.h) fetch the buckets a unit reads (an
 * allgather each, the next unit's prefetched while this one runs) and
 * release them after, when the pages outside this replica's pieces go
 * back to the system (reference counted: a bucket may span two units).
 * Updated pieces stay where they are: no gather after the step. Each
 * bucket is gathered in one of two forms, tracked apart:
 *
 *   fp32   params[bucket] whole (fp32 compute; the embedding's lookup)
 *   16-bit w16[bucket] whole, the owner rounding its piece (fetch16: the
 *          blocks and the head in bf16/fp16, half the bytes); the one-row
 *          tensors the model reads in fp32 (`exact`) are kept whole on
 *          every replica instead, shared after each update in one small
 *          allgather of what each replica owns of them.
 *
 * With a codec the gathers run on a group of their own (split from the dp
 * group), since the codec's reduce-scatters run on the engine's worker
 * thread while backward fetches blocks.
 *
 * Parameter offload (stage 3, offload_dir): a piece is in memory only
 * while something needs it; otherwise it is in a file (piece_file.c):
 *
 *   gather i      the piece read (ahead: while earlier units computed),
 *                 then gathered; 16-bit: dropped again once rounded
 *   release i     the bucket's pages go, the piece's too (it is unchanged)
 *   update i      read (ahead), updated, written back asynchronously; its
 *                 memory goes when the write is done (at most WRITES_AHEAD
 *                 writes in flight)
 *
 * Reads ahead follow the walk (towards the front of the buffer in the
 * forward, the end in the backward and the update) for READ_AHEAD bytes of
 * buckets; a wrong guess costs a synchronous read, never a wrong value.
 */
#include "dtrain/amp.h"
#include "piece_file.h"
#include "sync_internal.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

/* Offload: bucket bytes of pieces read ahead of the walk, and writes in
 * flight before the update waits for the oldest. */
#define READ_AHEAD   ((size_t)32 << 20)
#define WRITES_AHEAD 4

/* Stage 3: one bucket's residency. */
typedef struct zbucket {
    size_t b, e;              /* the bucket [b, e) */
    size_t pb, pe;            /* this replica's piece */
    size_t q, tail;           /* values per piece; the remainder (the last replica's) */
    int refs32, refs16;       /* fetches not yet released, per form */
    bool have32, have16;      /* gathered whole in params / in w16 */
    bool gath32, gath16;      /* its gather in flight */
    dt_work *w32[2], *w16[2]; /* ... the allgather and the remainder's broadcast */
    bool loaded;              /* offload: the piece is in memory */
    bool ahead;               /* offload: read ahead for a use to come */
} zbucket;

/* The exact (fp32, whole everywhere) tensors' values a replica owns: a
 * segment [b, e) of params owned by `owner`. */
typedef struct xseg {
    size_t b, e;
    int owner;
} xseg;

typedef struct zero_sync {
    dt_grad_sync base;
    dt_ddp *d;
    int stage;
    int replica, dp; /* this rank in the dp group, and its size */
    dt_group *g;     /* the dp group (borrowed) */
    float *params;   /* (n) borrowed */
    float *grads;    /* (n) borrowed */
    size_t n;
    dt_optimizer *opt;    /* borrowed: owns this replica's pieces */
    dt__norm_ranges norm; /* ranges counted in the norm */
    char ident[192];
    /* The wire. */
    bool coded;             /* a codec or a 16-bit dtype reduces the buckets */
    int64_t compress_start; /* dense warm-up steps */
    float state_scale;      /* loss scale the codec residuals are in */
    /* Stage 2 with several micro-batches (see the file comment). */
    float *acc;       /* (owned count): the shard sum of earlier micro-batches; NULL: accum 1 */
    size_t *acc_off;  /* (buckets) where bucket i's piece starts in acc */
    int folded;       /* micro-batches added into acc this step */
    bool pending;     /* a micro-batch's reduce-scatters are in flight, not yet in acc */
    int backwards;    /* begin_backward calls this step */
    dt_ddp_stats sum; /* the communication of the rounds already folded */
    /* Stage 3 (see the file comment). */
    zbucket *zb;
    size_t nb;
    dt_group *gg; /* the gathers' group: g, or a split of it (with a codec) */
    bool own_gg;  /* gg was split here */
    dt_precision prec;
    uint16_t *w16;   /* the model's 16-bit copy (from the fetch16 calls) */
    dt_range *exact; /* (nexact) sorted, merged */
    size_t nexact;
    xseg *xs;                     /* (nxs) the exact ranges cut by owner, by offset */
    size_t nxs, xmax;             /* ... and the most values any replica owns of them */
    float *xbuf;                  /* (xmax (1 + dp)) the allgather's send and receive */
    bool xstale;                  /* the owners' exact values changed outside a step (a resume) */
    dt__piece_file *pf;           /* offload: NULL in memory */
    dt_range *pieces;             /* (nb) piece of bucket i (the file's order) */
    size_t writing[WRITES_AHEAD]; /* offload: buckets whose write is in flight, oldest first */
    int nwriting;
    size_t last; /* offload: where the last unit fetched began (a parameter offset) */
    int dir;     /* ... and the walk's direction (+1: towards bucket nb - 1, the front) */
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
    /* The codec's residuals stay in the gradients' units (ddp_sync.c); its
     * dense warm-up reduce-scatters plain f32. */
    if (s->coded && st->loss_scale != s->state_scale) {
        dt_ddp_scale_state(s->d, st->loss_scale / s->state_scale);
        s->state_scale = st->loss_scale;
    }
    dt_ddp_set_dense(s->d, st->step < s->compress_start);
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

/* ------------------------------------------------------------------------ */
/* Stage 3: pieces in a file (offload)                                      */
/* ------------------------------------------------------------------------ */

static bool in_exact(const zero_sync *s, size_t begin, size_t end);

/* Give back the pages of params[a, b) except those holding exact values. */
static void discard_params(zero_sync *s, size_t a, size_t b) {
    for (size_t k = 0; k < s->nexact && a < b; k++) {
        const dt_range *x = &s->exact[k];
        if (x->end <= a)
            continue;
        if (x->begin >= b)
            break;
        if (x->begin > a)
            dt_mem_discard(s->params + a, (x->begin - a) * sizeof(float));
        a = x->end;
    }
    if (a < b)
        dt_mem_discard(s->params + a, (b - a) * sizeof(float));
}

/* The piece of bucket i is needed in memory: a gather (fp32) or an
 * update uses it, its read or write runs, or it was read ahead. */
static bool piece_needed(const zero_sync *s, size_t i) {
    const zbucket *z = &s->zb[i];
    return z->refs32 > 0 || z->have32 || z->gath32 || z->ahead;
}

/* Unload the pieces nobody needs whose I/O is done. */
static void sweep(zero_sync *s) {
    for (size_t i = 0; s->pf && i < s->nb; i++) {
        zbucket *z = &s->zb[i];
        if (z->loaded && !piece_needed(s, i) && !dt__piece_file_busy(s->pf, i)) {
            discard_params(s, z->pb, z->pe);
            z->loaded = false;
        }
    }
}

/* The pieces of the buckets after i in the walk's direction, READ_AHEAD
 * bytes of buckets, are the ones kept ahead: their reads queued, and
 * those of an earlier guess no longer kept (the sweep unloads them). */
static void read_ahead(zero_sync *s, size_t i) {
    if (!s->pf)
        return;
    for (size_t j = 0; j < s->nb; j++)
        s->zb[j].ahead = false;
    size_t bytes = 0;
    for (size_t j = i; bytes < READ_AHEAD;) {
        if (s->dir > 0 ? j + 1 >= s->nb : j == 0)
            break;
        j = s->dir > 0 ? j + 1 : j - 1;
        zbucket *z = &s->zb[j];
        bytes += (z->e - z->b) * sizeof(float);
        if (!z->loaded) {
            dt__piece_file_read(s->pf, j);
            z->loaded = true; /* its memory is the reader's until waited for */
        }
        z->ahead = true;
    }
}

/* The walk reaches [begin, end) (a unit the model fetches or prefetches):
 * its direction from the last, and the reads ahead of its far edge. */
static void walk_to(zero_sync *s, size_t begin, size_t end) {
    if (!s->pf || begin >= end)
        return;
    if (begin != s->last)
        s->dir = begin < s->last ? 1 : -1; /* bucket numbers grow towards the front */
    s->last = begin;
    size_t lo = SIZE_MAX, hi = 0; /* the range's buckets */
    for (size_t i = 0; i < s->nb; i++)
        if (s->zb[i].b < end && s->zb[i].e > begin) {
            lo = i < lo ? i : lo;
            hi = i > hi ? i : hi;
        }
    if (lo != SIZE_MAX)
        read_ahead(s, s->dir > 0 ? hi : lo); /* from its bucket farthest along the walk */
}

/* Bucket i's piece in memory (offload: read, or waited for). */
static dt_status need_piece(zero_sync *s, size_t i) {
    if (!s->pf)
        return DT_OK;
    zbucket *z = &s->zb[i];
    if (!z->loaded) {
        dt__piece_file_read(s->pf, i);
        z->loaded = true;
    }
    z->ahead = false;
    dt_status st = dt__piece_file_wait(s->pf, i); /* a read, or a write (memory still valid) */
    if (st != DT_OK)
        z->loaded = false;
    return st;
}

/* Start writing bucket i's updated piece back; at most WRITES_AHEAD in
 * flight (the oldest is waited for, then its memory goes). */
static dt_status write_piece(zero_sync *s, size_t i) {
    if (!s->pf)
        return DT_OK;
    if (s->nwriting == WRITES_AHEAD) {
        size_t old = s->writing[0];
        memmove(s->writing, s->writing + 1, (WRITES_AHEAD - 1) * sizeof *s->writing);
        s->nwriting--;
        DT_CHECK(dt__piece_file_wait(s->pf, old));
    }
    dt__piece_file_write(s->pf, i);
    s->writing[s->nwriting++] = i;
    sweep(s);
    return DT_OK;
}

/* Every write in flight done (their errors reported). */
static dt_status writes_done(zero_sync *s) {
    dt_status st = DT_OK;
    for (int k = 0; k < s->nwriting; k++) {
        dt_status st2 = dt__piece_file_wait(s->pf, s->writing[k]);
        st = st != DT_OK ? st : st2;
    }
    s->nwriting = 0;
    return st;
}

/* ------------------------------------------------------------------------ */
/* The step                                                                 */
/* ------------------------------------------------------------------------ */

/* The optimizer's update of bucket i's piece [begin, end) (offload: read,
 * updated, written back). */
static dt_status update_piece(zero_sync *s, size_t i, size_t begin, size_t end) {
    if (s->stage >= 3 && s->pf) { /* the update walks the buckets in order */
        s->dir = 1;
        read_ahead(s, i);
    }
    if (s->stage >= 3)
        DT_CHECK(need_piece(s, i));
    dt_optimizer_update(s->opt, s->params, s->grads, begin, end);
    if (s->stage >= 3)
        return write_piece(s, i);
    return dt_ddp_gather(s->d, i);
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
    dt_status st = update_piece(s, i, begin, end);
    if (st != DT_OK && s->err == DT_OK)
        s->err = st;
}

/* Bytes one fp32 allgather of every bucket sends (ring: (W-1)/W of each). */
static uint64_t gather_bytes(const zero_sync *s) {
    uint64_t sum = 0;
    for (size_t i = 0; s->dp > 1 && i < dt_ddp_num_buckets(s->d); i++) {
        size_t b, e;
        dt_ddp_bucket(s->d, i, &b, &e);
        sum += (uint64_t)((double)(s->dp - 1) / s->dp * (double)((e - b) * sizeof(float)));
    }
    return sum;
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
    /* The reduce-scatters' bytes (compressed, with a codec), and one fp32
     * gather's (stage 3 gathers per unit instead, not counted here). */
    out->bytes_sent = ds->bytes_sent + s->sum.bytes_sent + gather_bytes(s);
    out->collectives = 2 * ds->buckets + s->sum.buckets;
    out->launched_in_backward = ds->launched_in_backward + s->sum.launched_in_backward;
    return DT_OK;
}

static dt_status drop_all(zero_sync *s);
static dt_status share_exact(zero_sync *s);

/* The pieces of the owned ranges, in bucket order (bucket i's piece is
 * owned range nb - 1 - i). */
static dt_range owned_piece(const zero_sync *s, size_t i) {
    return dt_optimizer_owned(s->opt, dt_optimizer_num_owned(s->opt) - 1 - i);
}

static dt_status zero_apply(dt_grad_sync *base, bool skip, float clip_scale) {
    zero_sync *s = (zero_sync *)base;
    if (!skip && !s->step.update_early) {
        size_t nb = dt_optimizer_num_owned(s->opt);
        for (size_t k = 0; clip_scale != 1.0f && k < nb; k++) {
            dt_range r = dt_optimizer_owned(s->opt, k);
            dt_scale(s->grads + r.begin, r.end - r.begin, clip_scale);
        }
        if (s->pf && dt_optimizer_rangewise(s->opt)) {
            /* Offload: piece by piece, as they stream (any split of an
             * elementwise update gives the same bits). */
            for (size_t i = 0; i < nb; i++) {
                dt_range r = owned_piece(s, i);
                DT_CHECK(update_piece(s, i, r.begin, r.end));
            }
        } else {
            /* Every piece (one step over the owned ranges: an optimizer
             * with per-tensor statistics sums their pieces over the
             * replicas there; offloaded, every piece is read first), then
             * every bucket's gather (in bucket order, the same on every
             * replica). */
            for (size_t i = 0; s->pf && i < nb; i++)
                DT_CHECK(need_piece(s, i));
            DT_CHECK(dt_optimizer_step(s->opt, s->params, s->grads));
            for (size_t i = 0; s->pf && i < nb; i++)
                DT_CHECK(write_piece(s, i));
            for (size_t i = 0; s->stage < 3 && i < dt_ddp_num_buckets(s->d); i++)
                DT_CHECK(dt_ddp_gather(s->d, i));
        }
    }
    /* A skipped step changed nothing: every replica still holds the same
     * parameters. Stage 3: back to the shards (what was prefetched); the
     * exact tensors' new values to every replica. */
    if (s->stage >= 3) {
        if (!skip)
            DT_CHECK(share_exact(s));
        for (size_t i = 0; i < s->nb; i++)
            s->zb[i].ahead = false;
        return drop_all(s);
    }
    return dt_ddp_gather_wait(s->d);
}

/* ------------------------------------------------------------------------ */
/* Stage 3: parameters fetched per unit                                     */
/* ------------------------------------------------------------------------ */

/* [begin, end) lies within the exact ranges (kept whole: nothing to fetch). */
static bool in_exact(const zero_sync *s, size_t begin, size_t end) {
    for (size_t k = 0; k < s->nexact && begin < end; k++) {
        const dt_range *x = &s->exact[k];
        if (x->end <= begin)
            continue;
        if (x->begin > begin)
            return false;
        begin = x->end;
    }
    return begin >= end;
}

/* Call fn(s, i) on each bucket that intersects [begin, end), from the end
 * of the buffer (bucket order). */
static dt_status for_buckets(zero_sync *s, size_t begin, size_t end,
                             dt_status (*fn)(zero_sync *s, size_t i)) {
    for (size_t i = 0; i < s->nb; i++)
        if (s->zb[i].b < end && s->zb[i].e > begin)
            DT_CHECK(fn(s, i));
    return DT_OK;
}

static void clear_works(dt_work *w[2], dt_status *st) {
    for (int k = 0; k < 2; k++)
        if (w[k]) {
            dt_status st2 = dt_work_wait(w[k]);
            w[k] = NULL;
            if (*st == DT_OK)
                *st = st2;
        }
}

/* An in-place allgather of bucket z's pieces in buf (elements of dtype):
 * replica r's piece is at its place already; the remainder comes from
 * the last replica. */
static dt_status gather_into(zero_sync *s, zbucket *z, void *buf, size_t esize, dt_dtype dtype,
                             dt_work *w[2]) {
    char *p = (char *)buf + z->b * esize;
    DT_CHECK(dt_group_iallgather(s->gg, p, p, z->q, dtype, &w[0]));
    if (z->tail)
        DT_CHECK(dt_group_ibroadcast(s->gg, p + z->q * (size_t)s->dp * esize, z->tail, dtype,
                                     s->dp - 1, &w[1]));
    return DT_OK;
}

static dt_status start32(zero_sync *s, size_t i) {
    zbucket *z = &s->zb[i];
    if (z->have32 || z->gath32)
        return DT_OK;
    DT_CHECK(need_piece(s, i));
    z->gath32 = true;
    if (s->dp == 1)
        return DT_OK;
    return gather_into(s, z, s->params, sizeof(float), DT_F32, z->w32);
}

static dt_status finish32(zero_sync *s, size_t i) {
    zbucket *z = &s->zb[i];
    if (!z->gath32)
        return DT_OK;
    dt_status st = DT_OK;
    clear_works(z->w32, &st);
    z->gath32 = false;
    z->have32 = true;
    if (st != DT_OK)
        dt_error_prefix("parameter allgather of bucket %zu", i);
    return st;
}

static dt_status take32(zero_sync *s, size_t i) {
    s->zb[i].refs32++;
    return start32(s, i);
}

/* Bucket i's params back to this replica's piece if nothing uses it. */
static void drop32(zero_sync *s, size_t i) {
    zbucket *z = &s->zb[i];
    if (z->refs32 > 0 || !z->have32)
        return;
    z->have32 = false;
    if (s->dp > 1) {
        discard_params(s, z->b, z->pb);
        discard_params(s, z->pe, z->e);
    }
}

static dt_status give32(zero_sync *s, size_t i) {
    DT_ASSERT(s->zb[i].refs32 > 0);
    s->zb[i].refs32--;
    drop32(s, i);
    return DT_OK;
}

/* 16-bit: the owner rounds its piece into w16, then the pieces are
 * gathered; a bucket whole in params already is rounded locally. */
static dt_status start16(zero_sync *s, size_t i) {
    zbucket *z = &s->zb[i];
    if (z->have16 || z->gath16)
        return DT_OK;
    if (z->have32 || s->dp == 1) {
        if (s->dp == 1)
            DT_CHECK(need_piece(s, i));
        dt_act16_from_f32(s->prec, s->w16 + z->b, s->params + z->b, z->e - z->b);
        z->have16 = true;
        return DT_OK;
    }
    DT_CHECK(need_piece(s, i));
    dt_act16_from_f32(s->prec, s->w16 + z->pb, s->params + z->pb, z->pe - z->pb);
    z->gath16 = true;
    return gather_into(s, z, s->w16, sizeof(uint16_t),
                       s->prec == DT_PRECISION_FP16 ? DT_F16 : DT_BF16, z->w16);
}

static dt_status finish16(zero_sync *s, size_t i) {
    zbucket *z = &s->zb[i];
    if (!z->gath16)
        return DT_OK;
    dt_status st = DT_OK;
    clear_works(z->w16, &st);
    z->gath16 = false;
    z->have16 = true;
    if (st != DT_OK)
        dt_error_prefix("16-bit parameter allgather of bucket %zu", i);
    return st;
}

static dt_status take16(zero_sync *s, size_t i) {
    s->zb[i].refs16++;
    return start16(s, i);
}

static void drop16(zero_sync *s, size_t i) {
    zbucket *z = &s->zb[i];
    if (z->refs16 > 0 || !z->have16)
        return;
    z->have16 = false;
    dt_mem_discard(s->w16 + z->b, (z->e - z->b) * sizeof(uint16_t));
}

static dt_status give16(zero_sync *s, size_t i) {
    DT_ASSERT(s->zb[i].refs16 > 0);
    s->zb[i].refs16--;
    drop16(s, i);
    return DT_OK;
}

/* After a resume wrote the pieces, the exact tensors are shared at the
 * first fetch (collective: every replica makes the same calls). */
static dt_status fresh(zero_sync *s) {
    if (!s->xstale)
        return DT_OK;
    s->xstale = false;
    return share_exact(s);
}

/* Every bucket's gather issued in one order on every replica: the model's
 * calls are the same everywhere. */
static dt_status hook_fetch(void *user, size_t begin, size_t end) {
    zero_sync *s = user;
    DT_CHECK(fresh(s));
    if (in_exact(s, begin, end))
        return DT_OK;
    walk_to(s, begin, end);
    DT_CHECK(for_buckets(s, begin, end, take32));
    DT_CHECK(for_buckets(s, begin, end, finish32));
    sweep(s);
    return DT_OK;
}

static void keep_err(zero_sync *s, dt_status st) {
    if (st != DT_OK && s->err == DT_OK)
        s->err = st; /* a failed gather fails the fetch that waits for it */
}

static void hook_prefetch(void *user, size_t begin, size_t end) {
    zero_sync *s = user;
    keep_err(s, fresh(s));
    if (in_exact(s, begin, end))
        return;
    walk_to(s, begin, end);
    keep_err(s, for_buckets(s, begin, end, start32));
}

static void hook_release(void *user, size_t begin, size_t end) {
    zero_sync *s = user;
    if (in_exact(s, begin, end))
        return;
    (void)for_buckets(s, begin, end, give32);
    sweep(s);
}

static dt_status hook_fetch16(void *user, size_t begin, size_t end, uint16_t *w16) {
    zero_sync *s = user;
    DT_ASSERT(!s->w16 || s->w16 == w16);
    s->w16 = w16;
    DT_CHECK(s->err);
    DT_CHECK(fresh(s));
    walk_to(s, begin, end);
    DT_CHECK(for_buckets(s, begin, end, take16));
    DT_CHECK(for_buckets(s, begin, end, finish16));
    sweep(s);
    return DT_OK;
}

static void hook_prefetch16(void *user, size_t begin, size_t end, uint16_t *w16) {
    zero_sync *s = user;
    s->w16 = w16;
    keep_err(s, fresh(s));
    walk_to(s, begin, end);
    keep_err(s, for_buckets(s, begin, end, start16));
}

static void hook_release16(void *user, size_t begin, size_t end) {
    zero_sync *s = user;
    (void)for_buckets(s, begin, end, give16);
}

/* Back to the shards: buckets prefetched but not fetched, or fetched
 * whole for a moment. */
static dt_status drop_all(zero_sync *s) {
    dt_status st = DT_OK;
    for (size_t i = 0; i < s->nb; i++) {
        dt_status a = finish32(s, i), b = finish16(s, i);
        st = st != DT_OK ? st : a != DT_OK ? a : b;
        drop32(s, i);
        drop16(s, i);
    }
    sweep(s);
    return st;
}

/* The exact tensors' values each replica owns, to every replica: one
 * allgather of xmax values per replica (padded). */
static dt_status share_exact(zero_sync *s) {
    if (s->nxs == 0 || s->dp == 1)
        return DT_OK;
    float *send = s->xbuf, *recv = s->xbuf + s->xmax;
    size_t k = 0;
    for (size_t j = 0; j < s->nxs; j++)
        if (s->xs[j].owner == s->replica) {
            memcpy(send + k, s->params + s->xs[j].b, (s->xs[j].e - s->xs[j].b) * sizeof(float));
            k += s->xs[j].e - s->xs[j].b;
        }
    memset(send + k, 0, (s->xmax - k) * sizeof(float));
    DT_CHECK(dt_group_allgather(s->gg, send, recv, s->xmax, DT_F32));
    size_t *at = dt_calloc((size_t)s->dp, sizeof *at);
    if (!at)
        return DT_ERR_NOMEM;
    for (size_t j = 0; j < s->nxs; j++) {
        const xseg *x = &s->xs[j];
        size_t len = x->e - x->b;
        if (x->owner != s->replica)
            memcpy(s->params + x->b, recv + (size_t)x->owner * s->xmax + at[x->owner],
                   len * sizeof(float));
        at[x->owner] += len;
    }
    dt_free(at);
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

static dt_status zero_hold_params(dt_grad_sync *base, bool hold, bool written) {
    zero_sync *s = (zero_sync *)base;
    if (s->stage < 3)
        return DT_OK;
    if (hold) { /* every piece in memory, kept there (ahead) until given back */
        for (size_t i = 0; i < s->nb; i++) {
            DT_CHECK(need_piece(s, i));
            s->zb[i].ahead = true;
        }
        return DT_OK;
    }
    for (size_t i = 0; i < s->nb; i++) {
        s->zb[i].ahead = false;
        if (written && s->pf)
            DT_CHECK(write_piece(s, i));
    }
    if (s->pf)
        DT_CHECK(writes_done(s));
    sweep(s);
    s->xstale |= written;
    return DT_OK;
}

static const dt_param_hooks *zero_param_hooks(const dt_grad_sync *base) {
    const zero_sync *s = (const zero_sync *)base;
    return s->stage >= 3 ? &s->hooks : NULL;
}

static dt_status zero_replicate(dt_grad_sync *base) {
    zero_sync *s = (zero_sync *)base;
    if (s->stage < 3)
        return dt_ddp_broadcast_params(s->d);
    /* Stage 3: each replica's pieces are its own already (initialised
     * from the same streams, or loaded alike, on every replica: there is no
     * other copy to agree with); the exact tensors from their owners to
     * every replica; then each keeps its pieces (offload: in the file). */
    DT_CHECK(share_exact(s));
    for (size_t i = 0; i < s->nb; i++) {
        s->zb[i].have32 = true;
        s->zb[i].loaded = true;
        if (s->pf)
            DT_CHECK(write_piece(s, i));
    }
    if (s->pf)
        DT_CHECK(writes_done(s));
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
    out->bytes_per_step = (double)dt_ddp_step_bytes(s->d) + (double)gather_bytes(s);
    out->pieces = 2 * (int)dt_ddp_num_buckets(s->d);
    out->overlapped = true;
    out->state_bytes = dt_ddp_state_bytes(s->d);
}

static void zero_layout(const dt_grad_sync *base, dt_sync_layout *out) {
    const zero_sync *s = (const zero_sync *)base;
    out->params_replicated = s->stage < 3;
    out->optim_replicated = false;
    out->params_sharded = s->stage >= 3;
}

/* The codec's residuals (per piece) and step: this rank's own. */
static size_t zero_state_bytes(const dt_grad_sync *base) {
    return dt_ddp_state_bytes(((const zero_sync *)base)->d);
}

static const char *zero_state_ident(const dt_grad_sync *base) {
    return ((const zero_sync *)base)->ident;
}

static dt_status zero_get_state(const dt_grad_sync *base, void *buf, size_t len, float *unit) {
    const zero_sync *s = (const zero_sync *)base;
    *unit = s->state_scale;
    return dt_ddp_get_state(s->d, buf, len);
}

static dt_status zero_set_state(dt_grad_sync *base, const void *buf, size_t len, float unit) {
    zero_sync *s = (zero_sync *)base;
    if (len > 0 && (!(unit > 0) || !isfinite(unit)))
        return dt_error_set(DT_ERR_CORRUPT, "ZeRO state: loss-scale unit %g is not positive",
                            (double)unit);
    if (!s->coded && len != 0)
        return dt_error_set(DT_ERR_INVALID, "ZeRO without a codec keeps no state (%zu bytes given)",
                            len);
    DT_CHECK(dt_ddp_set_state(s->d, buf, len));
    if (len > 0)
        s->state_scale = unit; /* the next begin_step converts it to that step's scale */
    return DT_OK;
}

static void zero_reset_state(dt_grad_sync *base) { dt_ddp_reset_state(((zero_sync *)base)->d); }

static void zero_destroy(dt_grad_sync *base) {
    zero_sync *s = (zero_sync *)base;
    dt_ddp_destroy(s->d);
    for (size_t i = 0; s->zb && i < s->nb; i++) {
        dt_status st = DT_OK; /* outstanding gathers must not outlive their buffers */
        clear_works(s->zb[i].w32, &st);
        clear_works(s->zb[i].w16, &st);
    }
    dt__piece_file_close(s->pf);
    if (s->own_gg)
        dt_group_destroy(s->gg);
    dt_free(s->pieces);
    dt_free(s->acc);
    dt_free(s->acc_off);
    dt_free(s->zb);
    dt_free(s->exact);
    dt_free(s->xs);
    dt_free(s->xbuf);
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
    .hold_params = zero_hold_params,
};

/* Stage 3: the buckets, the exact ranges cut by owner, the gathers' group
 * and the offload file. */
static dt_status make_stage3(zero_sync *s, const dt_zero_sync_config *c) {
    s->nb = dt_ddp_num_buckets(s->d);
    s->zb = dt_calloc(s->nb + 1, sizeof *s->zb);
    s->pieces = dt_calloc(s->nb + 1, sizeof *s->pieces);
    if (!s->zb || !s->pieces)
        return DT_ERR_NOMEM;
    size_t dp = (size_t)s->dp;
    for (size_t i = 0; i < s->nb; i++) {
        zbucket *z = &s->zb[i];
        dt_ddp_bucket(s->d, i, &z->b, &z->e);
        dt_range r = owned_piece(s, i);
        z->pb = r.begin;
        z->pe = r.end;
        z->q = (z->e - z->b) / dp;
        z->tail = z->e - z->b - z->q * dp;
        DT_ASSERT(z->pb == z->b + (size_t)s->replica * z->q);
        z->have32 = true; /* until replicate() makes them shards, every bucket is whole */
        z->loaded = true;
        s->pieces[i] = r;
    }
    s->prec = c->precision;
    if (c->precision != DT_PRECISION_FP32 && c->nexact > 0) {
        s->exact = dt_calloc(c->nexact, sizeof *s->exact);
        if (!s->exact)
            return DT_ERR_NOMEM;
        for (size_t k = 0; k < c->nexact; k++) { /* merged, checked sorted */
            if (c->exact[k].begin >= c->exact[k].end || c->exact[k].end > s->n ||
                (k > 0 && c->exact[k].begin < c->exact[k - 1].end))
                return dt_error_set(DT_ERR_INVALID,
                                    "ZeRO: exact range %zu [%zu, %zu) is empty, out of [0, %zu) "
                                    "or not sorted",
                                    k, c->exact[k].begin, c->exact[k].end, s->n);
            if (s->nexact > 0 && s->exact[s->nexact - 1].end == c->exact[k].begin)
                s->exact[s->nexact - 1].end = c->exact[k].end;
            else
                s->exact[s->nexact++] = c->exact[k];
        }
        /* Cut by owner: bucket by bucket, replica by replica. */
        size_t cap = s->nexact * (dp + 1) + 2 * s->nb * (dp + 1), *count = NULL;
        s->xs = dt_calloc(cap, sizeof *s->xs);
        count = dt_calloc(dp, sizeof *count);
        if (!s->xs || !count) {
            dt_free(count);
            return DT_ERR_NOMEM;
        }
        for (size_t k = 0; k < s->nexact; k++)
            for (size_t i = s->nb; i-- > 0;) { /* bucket nb - 1 is the front */
                const zbucket *z = &s->zb[i];
                for (size_t r = 0; r < dp; r++) {
                    size_t pb = z->b + r * z->q, pe = r == dp - 1 ? z->e : pb + z->q;
                    size_t lo = pb > s->exact[k].begin ? pb : s->exact[k].begin;
                    size_t hi = pe < s->exact[k].end ? pe : s->exact[k].end;
                    if (lo >= hi)
                        continue;
                    DT_ASSERT(s->nxs < cap);
                    s->xs[s->nxs++] = (xseg){lo, hi, (int)r};
                    count[r] += hi - lo;
                }
            }
        for (size_t r = 0; r < dp; r++)
            s->xmax = count[r] > s->xmax ? count[r] : s->xmax;
        dt_free(count);
        s->xbuf = dt_calloc(s->xmax * (dp + 1) + 1, sizeof *s->xbuf);
        if (!s->xbuf)
            return DT_ERR_NOMEM;
    }
    s->gg = c->group;
    if (s->coded && c->group) { /* the worker thread reduces on g (see the file comment) */
        DT_CHECK(dt_group_split(c->group, 0, s->replica, &s->gg));
        s->own_gg = true;
    }
    if (c->offload_dir)
        DT_CHECK(dt__piece_file_open(&s->pf, c->offload_dir, s->params, s->pieces, s->nb,
                                     c->offload_direct));
    s->hooks = (dt_param_hooks){
        .user = s, .fetch = hook_fetch, .prefetch = hook_prefetch, .release = hook_release};
    if (c->precision != DT_PRECISION_FP32) {
        s->hooks.fetch16 = hook_fetch16;
        s->hooks.prefetch16 = hook_prefetch16;
        s->hooks.release16 = hook_release16;
    }
    return DT_OK;
}

dt_status dt_zero_sync_create(dt_grad_sync **out, const dt_zero_sync_config *c) {
    *out = NULL;
    if (!c->opt || !c->params || !c->grads)
        return dt_error_set(DT_ERR_INVALID, "ZeRO: params, grads and optimizer are required");
    if (c->stage < 1 || c->stage > 3)
        return dt_error_set(DT_ERR_INVALID, "ZeRO stage %d: the stages are 1, 2 and 3", c->stage);
    if (c->accum < 1)
        return dt_error_set(DT_ERR_INVALID, "ZeRO: accum %d must be >= 1", c->accum);
    if (c->offload_dir && c->stage < 3)
        return dt_error_set(DT_ERR_INVALID,
                            "ZeRO stage %d: parameter offload needs stage 3 (sharded parameters)",
                            c->stage);
    if (c->compress_start < 0)
        return dt_error_set(DT_ERR_INVALID, "ZeRO: compress_start %" PRId64 " must be >= 0",
                            c->compress_start);
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
    s->g = c->group;
    s->params = c->params;
    s->grads = c->grads;
    s->n = c->n;
    s->opt = c->opt;
    s->state_scale = 1.0f;
    s->compress_start = c->compress_start;
    dt_status st;
    DT_CHECK_GOTO(dt__norm_ranges_init(&s->norm, c->norm_ranges, c->nnorm, c->n), st, fail);
    dt_ddp_options o = c->wire ? *c->wire : dt_ddp_options_default();
    o.bucket_bytes = c->bucket_bytes;
    o.shard = true;
    o.release = c->stage >= 2;
    o.prepare = NULL;
    o.prepare_user = NULL;
    DT_CHECK_GOTO(dt_ddp_create_with(&s->d, c->group, c->params, c->grads, c->n, &o), st, fail);
    s->coded = (o.codec.kind != DT_CODEC_NONE || o.grad_dtype != DT_F32) && dp > 1;
    if (c->stage >= 3)
        DT_CHECK_GOTO(make_stage3(s, c), st, fail);
    char cb[64];
    static const char *const ef_names[] = {"auto", "on", "off"};
    snprintf(s->ident, sizeof s->ident, "zero %d %s ef=%s grad_dtype=%s buckets=%zu ranks=%d",
             s->stage, dt_codec_format(&o.codec, cb, sizeof cb), ef_names[o.ef],
             dt_dtype_name(o.grad_dtype), dt_ddp_num_buckets(s->d), dp);
    *out = &s->base;
    return DT_OK;
fail:
    zero_destroy(&s->base);
    return st;
}

void dt_zero_plan_offload(size_t n, size_t bucket_bytes, int dp, bool direct, size_t *resident,
                          size_t *file) {
    size_t nb = dt_ddp_shard_count(n, bucket_bytes, dp);
    dt_range *r = dt_calloc(nb + 1, sizeof *r);
    *resident = *file = 0;
    if (!r)
        return;
    dt_ddp_shard_ranges(n, bucket_bytes, dp, 0, r);
    size_t piece = 0, bucket = 0;
    for (size_t k = 0; k < nb; k++) {
        piece = r[k].end - r[k].begin > piece ? r[k].end - r[k].begin : piece;
        *file += dt__piece_file_slot_bytes((r[k].end - r[k].begin) * sizeof(float));
    }
    bucket = piece * (size_t)dp;
    dt_free(r);
    /* As read_ahead and write_piece walk: READ_AHEAD bytes of buckets
     * ahead, WRITES_AHEAD writes and the piece being updated. */
    size_t ahead =
        bucket ? (READ_AHEAD + bucket * sizeof(float) - 1) / (bucket * sizeof(float)) : 0;
    size_t pieces = ahead + WRITES_AHEAD + 1;
    *resident = (pieces < nb ? pieces : nb) * piece * sizeof(float) +
                (direct ? dt__piece_file_buffer_bytes() : 0);
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
