/*
 * powersgd.c — PowerSGD low-rank compression (Vogels et al., NeurIPS 2019).
 *
 * A gradient M viewed as a rows x cols row-major matrix is approximated by
 * P Q^T of rank r with one step of subspace (power) iteration per training
 * step, warm-started from the previous step's Q:
 *
 *   P = M Q              (rows, r)
 *   P = orthonormal(P)   modified Gram-Schmidt, applied twice
 *   Q = M^T P            (cols, r)
 *   M ~ P Q^T            the projection of M on span(P)
 *
 * Repeating the step on a fixed M converges to its best rank-r
 * approximation (the warm start is what makes one iteration per step
 * enough). The one-shot codec sends P and Q (4 r (rows + cols) bytes);
 * the staged API (compress.h) lets data-parallel training allreduce P and Q
 * between the stages, as in PyTorch's powerSGD_hook: the kept warm start is
 * the averaged Q, the residual is this rank's M minus the averaged output.
 *
 * Invariants: Q is identical on every rank (drawn from rank 0's stream for
 * (seed, step, bucket), then only ever replaced by allreduced values), so
 * the ranks' P = M Q add up meaningfully. A Q column that is all zeros (first
 * use, or dropped by the orthogonalisation because P had lower numerical
 * rank) is redrawn from that stream before use. Tensors where rank r would
 * not at least halve the traffic (2 r (rows + cols) > rows cols, which
 * includes r >= min(rows, cols)), or with fewer values than min_compress,
 * are sent as plain fp32 (dt__powersgd_rank_for).
 *
 * The products use OpenBLAS's cblas_sgemm; orthogonalisation accumulates in
 * double. Decoding reads P and Q straight from the buffer; their values are
 * unconstrained, the header check bounds their extent.
 */
#include "internal.h"

#include <cblas.h>
#include <math.h>
#include <stdlib.h>

static bool psgd_bytes(const dt_codec_header *h, size_t *out) {
    size_t n = (size_t)h->count;
    if (h->rank == 0)
        return dt_mul_size(n, 4, out);
    size_t rows = (size_t)h->k, cols = n / rows, r = (size_t)h->rank;
    /* r < min(rows, cols), so r (rows + cols) < 2n: no overflow given the
     * caller's n <= SIZE_MAX / 8. */
    *out = 4 * r * (rows + cols);
    return true;
}

void dt__powersgd_orthonormalize(float *P, size_t rows, size_t r) {
    for (size_t j = 0; j < r; j++) {
        double before = 0.0;
        for (size_t i = 0; i < rows; i++)
            before += (double)P[i * r + j] * P[i * r + j];
        /* Two passes of projection ("twice is enough", Giraud et al.): one
         * pass of modified Gram-Schmidt in fp32 leaves the column only
         * roughly orthogonal when it is nearly dependent. */
        for (int pass = 0; pass < 2; pass++) {
            for (size_t l = 0; l < j; l++) {
                double dot = 0.0;
                for (size_t i = 0; i < rows; i++)
                    dot += (double)P[i * r + j] * P[i * r + l];
                for (size_t i = 0; i < rows; i++)
                    P[i * r + j] -= (float)(dot * P[i * r + l]);
            }
        }
        double after = 0.0;
        for (size_t i = 0; i < rows; i++)
            after += (double)P[i * r + j] * P[i * r + j];
        /* A column that was (numerically) in the span of the earlier ones
         * carries no new direction: drop it rather than normalise noise. */
        float s = (after > 1e-8 * before && after > 0.0) ? (float)(1.0 / sqrt(after)) : 0.0f;
        for (size_t i = 0; i < rows; i++)
            P[i * r + j] *= s;
    }
}

/* Redraw every all-zero column of Q (cols, r) from rank 0's stream of
 * (seed, step, bucket). `pos` separates the tensors of one bucket: column j
 * starts at output (bucket << 40) + pos + 2 j cols (a normal takes two). */
static void q_refresh_raw(float *Q, size_t cols, size_t r, uint64_t seed, uint64_t step,
                          uint32_t bucket, uint64_t pos) {
    for (size_t j = 0; j < r; j++) {
        bool zero = true;
        for (size_t i = 0; i < cols && zero; i++)
            zero = Q[i * r + j] == 0.0f;
        if (!zero)
            continue;
        dt_rng rng;
        dt__compress_rng(&rng, seed, 0, step, bucket);
        dt_rng_seek(&rng, ((uint64_t)bucket << 40) + pos + (uint64_t)j * cols * 2);
        for (size_t i = 0; i < cols; i++)
            Q[i * r + j] = dt_rng_normal(&rng);
    }
}

/* P = M Q;  M (rows, cols), Q (cols, r), P (rows, r) */
static void product_p_raw(float *P, const float *M, const float *Q, size_t rows, size_t cols,
                          size_t r) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)rows, (int)r, (int)cols, 1.0f, M,
                (int)cols, Q, (int)r, 0.0f, P, (int)r);
}

/* Q = M^T P */
static void product_q_raw(float *Q, const float *M, const float *P, size_t rows, size_t cols,
                          size_t r) {
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)cols, (int)r, (int)rows, 1.0f, M,
                (int)cols, P, (int)r, 0.0f, Q, (int)r);
}

static void q_refresh(dt_compressor *c, uint64_t step) {
    q_refresh_raw(c->Q, c->cols, (size_t)c->prank, c->cfg.seed, step, c->cfg.bucket, 0);
}

static void product_p(dt_compressor *c, const float *M) {
    product_p_raw(c->P, M, c->Q, c->rows, c->cols, (size_t)c->prank);
}

static void product_q(dt_compressor *c, const float *M) {
    product_q_raw(c->Q, M, c->P, c->rows, c->cols, (size_t)c->prank);
}

/* out = scale P Q^T (+ out when beta = 1) */
static void product_out(float *out, const float *P, const float *Q, size_t rows, size_t cols,
                        size_t r, float scale, float beta) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)rows, (int)cols, (int)r, scale, P,
                (int)r, Q, (int)r, beta, out, (int)cols);
}

/* ------------------------------------------------------------------------ */
/* One-shot codec                                                           */
/* ------------------------------------------------------------------------ */

static dt_status psgd_encode(dt_compressor *c, const float *x, uint64_t step, uint8_t *p) {
    if (c->prank == 0) {
        if (c->n) /* x may be NULL for an empty tensor */
            memcpy(p, x, c->n * sizeof(float));
        return DT_OK;
    }
    if (c->rows > INT32_MAX || c->cols > INT32_MAX)
        return dt_error_set(DT_ERR_UNSUPPORTED, "powersgd: %zu x %zu exceeds BLAS int sizes",
                            c->rows, c->cols);
    size_t r = (size_t)c->prank;
    q_refresh(c, step);
    product_p(c, x);
    dt__powersgd_orthonormalize(c->P, c->rows, r);
    product_q(c, x);
    memcpy(p, c->P, c->rows * r * sizeof(float));
    memcpy(p + c->rows * r * sizeof(float), c->Q, c->cols * r * sizeof(float));
    return DT_OK;
}

static void psgd_decode(const dt_codec_header *h, const uint8_t *p, float *out,
                        dt_decode_mode mode) {
    size_t n = (size_t)h->count;
    if (h->rank == 0) {
        for (size_t i = 0; i < n; i++) {
            float v = dt__load_f32(p + 4 * i);
            out[i] = mode == DT_DECODE_ADD ? out[i] + v : v;
        }
        return;
    }
    size_t rows = (size_t)h->k, cols = n / rows, r = (size_t)h->rank;
    /* x86 BLAS kernels load with unaligned moves, so P and Q are used in
     * place even when the buffer is not 4-byte aligned. */
    const float *P = (const float *)(const void *)p;
    const float *Q = (const float *)(const void *)(p + 4 * rows * r);
    product_out(out, P, Q, rows, cols, r, 1.0f, mode == DT_DECODE_ADD ? 1.0f : 0.0f);
}

static dt_status psgd_validate(const dt_codec_header *h, const uint8_t *p) {
    if (h->rank != 0 && (h->k > INT32_MAX || h->count / h->k > INT32_MAX))
        return dt_error_set(DT_ERR_CORRUPT, "powersgd buffer: matrix exceeds BLAS int sizes");
    return DT_OK;
}

const dt__codec_ops dt__codec_powersgd = {
    .info = {.name = "powersgd", .biased = true, .ef_default = true, .linear = false},
    .payload_bytes = psgd_bytes,
    .encode = psgd_encode,
    .validate = psgd_validate,
    .decode = psgd_decode,
};

/* ------------------------------------------------------------------------ */
/* Staged API                                                               */
/* ------------------------------------------------------------------------ */

static dt_status need_powersgd(const dt_compressor *c, int stage, const char *fn) {
    if (c->spec.kind != DT_CODEC_POWERSGD)
        return dt_error_set(DT_ERR_INVALID, "%s: compressor is %s, not powersgd", fn,
                            c->ops->info.name);
    if (c->stage != stage)
        return dt_error_set(DT_ERR_INVALID, "%s: called at stage %d, expected %d", fn, c->stage,
                            stage);
    return DT_OK;
}

int dt_powersgd_rank(const dt_compressor *c) { return c->prank; }

float *dt_powersgd_p(dt_compressor *c, size_t *count) {
    *count = c->prank ? c->rows * (size_t)c->prank : c->n;
    return c->P;
}

float *dt_powersgd_q(dt_compressor *c, size_t *count) {
    *count = c->cols * (size_t)c->prank;
    return c->Q;
}

dt_status dt_powersgd_begin(dt_compressor *c, const float *grad, uint64_t step) {
    DT_CHECK(need_powersgd(c, 0, "dt_powersgd_begin"));
    if (c->n > 0 && !grad)
        return dt_error_set(DT_ERR_INVALID, "dt_powersgd_begin: gradient is NULL");
    if (step >= (1ull << 36))
        return dt_error_set(DT_ERR_INVALID, "dt_powersgd_begin: step %llu is not below 2^36",
                            (unsigned long long)step);
    if (c->prank && (c->rows > INT32_MAX || c->cols > INT32_MAX))
        return dt_error_set(DT_ERR_UNSUPPORTED, "powersgd: %zu x %zu exceeds BLAS int sizes",
                            c->rows, c->cols);
    for (size_t i = 0; i < c->n; i++)
        c->work[i] = c->ef ? grad[i] + c->residual[i] : grad[i];
    if (c->prank == 0) {
        memcpy(c->P, c->work, c->n * sizeof(float));
    } else {
        q_refresh(c, step);
        product_p(c, c->work);
    }
    c->stage = 1;
    return DT_OK;
}

dt_status dt_powersgd_middle(dt_compressor *c) {
    DT_CHECK(need_powersgd(c, 1, "dt_powersgd_middle"));
    if (c->prank) {
        dt__powersgd_orthonormalize(c->P, c->rows, (size_t)c->prank);
        product_q(c, c->work);
    }
    c->stage = 2;
    return DT_OK;
}

dt_status dt_powersgd_end(dt_compressor *c, float scale, float *out) {
    DT_CHECK(need_powersgd(c, 2, "dt_powersgd_end"));
    if (c->n > 0 && !out)
        return dt_error_set(DT_ERR_INVALID, "dt_powersgd_end: out is NULL");
    size_t r = (size_t)c->prank;
    if (r == 0) {
        for (size_t i = 0; i < c->n; i++)
            out[i] = scale * c->P[i];
    } else {
        /* Keep the averaged Q as the warm start, then out = P Q^T. */
        for (size_t i = 0; i < c->cols * r; i++)
            c->Q[i] *= scale;
        product_out(out, c->P, c->Q, c->rows, c->cols, r, 1.0f, 0.0f);
    }
    if (c->ef)
        for (size_t i = 0; i < c->n; i++)
            c->residual[i] = c->work[i] - out[i];
    c->stage = 0;
    return DT_OK;
}

/* ------------------------------------------------------------------------ */
/* Bucket of tensors                                                        */
/* ------------------------------------------------------------------------ */

typedef struct psgd_part {
    size_t offset, rows, cols, r; /* a compressed matrix of the bucket */
    size_t p_at, q_at;            /* where its P and Q start in the shared buffers */
} psgd_part;

typedef struct raw_seg {
    size_t offset, len; /* values of the bucket sent as they are */
    size_t at;          /* where they sit in the P buffer */
} raw_seg;

struct dt_powersgd_bucket {
    size_t n; /* values in the bucket */
    dt_compressor_config cfg;
    bool ef;          /* error feedback on */
    int stage;        /* 0 idle, 1 after begin, 2 after middle */
    psgd_part *parts; /* compressed matrices, by offset */
    size_t nparts;
    raw_seg *segs; /* uncompressed ranges, by offset */
    size_t nsegs;
    size_t np, nq;   /* P buffer (all P, then raw values) and Q buffer sizes */
    float *P, *Q;    /* (np), (nq) */
    float *work;     /* (n) grad + residual */
    float *residual; /* (n) or NULL */
};

void dt_powersgd_bucket_destroy(dt_powersgd_bucket *b) {
    if (!b)
        return;
    free(b->parts);
    free(b->segs);
    dt_free(b->P);
    dt_free(b->Q);
    dt_free(b->work);
    dt_free(b->residual);
    free(b);
}

static int cmp_tensor_offset(const void *a, const void *b) {
    const dt_powersgd_tensor *x = a, *y = b;
    return x->offset < y->offset ? -1 : x->offset > y->offset;
}

static void add_seg(dt_powersgd_bucket *b, size_t offset, size_t len, size_t *raw) {
    if (len == 0)
        return;
    raw_seg *last = b->nsegs ? &b->segs[b->nsegs - 1] : NULL;
    if (last && last->offset + last->len == offset) {
        last->len += len; /* merge neighbours: one copy instead of two */
    } else {
        b->segs[b->nsegs++] = (raw_seg){.offset = offset, .len = len, .at = *raw};
    }
    *raw += len;
}

dt_status dt_powersgd_bucket_create(dt_powersgd_bucket **out, int rank, size_t n,
                                    const dt_powersgd_tensor *tensors, size_t ntensors,
                                    const dt_compressor_config *cfg_in) {
    dt_compressor_config cfg = cfg_in ? *cfg_in : dt_compressor_config_default();
    if (rank < 1 || rank > DT_COMPRESS_MAX_RANK)
        return dt_error_set(DT_ERR_INVALID, "powersgd bucket: rank %d is not in 1..%d", rank,
                            DT_COMPRESS_MAX_RANK);
    if (ntensors > 0 && !tensors)
        return dt_error_set(DT_ERR_INVALID, "powersgd bucket: tensors is NULL");
    if (cfg.bucket >= (1u << 24))
        return dt_error_set(DT_ERR_INVALID, "powersgd bucket: bucket id %u is not below 2^24",
                            cfg.bucket);
    dt_status st = DT_OK;
    dt_powersgd_tensor *t = NULL;
    dt_powersgd_bucket *b = calloc(1, sizeof *b);
    if (!b)
        return dt_error_set(DT_ERR_NOMEM, "powersgd bucket: out of memory");
    b->n = n;
    b->cfg = cfg;
    b->ef = cfg.ef != DT_EF_OFF;
    t = malloc((ntensors ? ntensors : 1) * sizeof *t);
    b->parts = calloc(ntensors ? ntensors : 1, sizeof *b->parts);
    b->segs = calloc(2 * ntensors + 1, sizeof *b->segs);
    if (!t || !b->parts || !b->segs) {
        st = dt_error_set(DT_ERR_NOMEM, "powersgd bucket: out of memory for %zu tensors", ntensors);
        goto fail;
    }
    if (ntensors)
        memcpy(t, tensors, ntensors * sizeof *t);
    qsort(t, ntensors, sizeof *t, cmp_tensor_offset);
    size_t pos = 0, pmat = 0, raw = 0;
    for (size_t i = 0; i < ntensors; i++) {
        size_t size;
        if (!dt_mul_size(t[i].rows, t[i].cols, &size) || t[i].offset < pos || t[i].offset > n ||
            size > n - t[i].offset) {
            st = dt_error_set(DT_ERR_INVALID,
                              "powersgd bucket: tensor at %zu (%zu x %zu) overlaps another or "
                              "leaves the bucket of %zu values",
                              t[i].offset, t[i].rows, t[i].cols, n);
            goto fail;
        }
        size_t r = dt__powersgd_rank_for(t[i].rows, t[i].cols, (size_t)rank, cfg.min_compress);
        if (r && (t[i].rows > INT32_MAX || t[i].cols > INT32_MAX)) {
            st = dt_error_set(DT_ERR_UNSUPPORTED, "powersgd: %zu x %zu exceeds BLAS int sizes",
                              t[i].rows, t[i].cols);
            goto fail;
        }
        add_seg(b, pos, t[i].offset - pos, &raw); /* the gap before it */
        if (r) {
            b->parts[b->nparts++] = (psgd_part){.offset = t[i].offset,
                                                .rows = t[i].rows,
                                                .cols = t[i].cols,
                                                .r = r,
                                                .p_at = pmat,
                                                .q_at = b->nq};
            pmat += t[i].rows * r;
            b->nq += t[i].cols * r;
        } else {
            add_seg(b, t[i].offset, size, &raw);
        }
        pos = t[i].offset + size;
    }
    add_seg(b, pos, n - pos, &raw);
    for (size_t i = 0; i < b->nsegs; i++)
        b->segs[i].at += pmat; /* raw values follow the matrices' P */
    b->np = pmat + raw;
    b->P = dt_calloc(b->np + 1, sizeof(float));
    b->Q = dt_calloc(b->nq + 1, sizeof(float));
    b->work = dt_calloc(n + 1, sizeof(float));
    b->residual = b->ef ? dt_calloc(n + 1, sizeof(float)) : NULL;
    if (!b->P || !b->Q || !b->work || (b->ef && !b->residual)) {
        st = dt_error_set(DT_ERR_NOMEM, "powersgd bucket: cannot allocate buffers for %zu values",
                          n);
        goto fail;
    }
    free(t);
    *out = b;
    return DT_OK;
fail:
    free(t);
    dt_powersgd_bucket_destroy(b);
    return st;
}

float *dt_powersgd_bucket_p(dt_powersgd_bucket *b, size_t *count) {
    *count = b->np;
    return b->P;
}

float *dt_powersgd_bucket_q(dt_powersgd_bucket *b, size_t *count) {
    *count = b->nq;
    return b->Q;
}

size_t dt_powersgd_bucket_compressed(const dt_powersgd_bucket *b) { return b->nparts; }

static dt_status bucket_stage(const dt_powersgd_bucket *b, int stage, const char *fn) {
    if (b->stage != stage)
        return dt_error_set(DT_ERR_INVALID, "%s: called at stage %d, expected %d", fn, b->stage,
                            stage);
    return DT_OK;
}

dt_status dt_powersgd_bucket_begin(dt_powersgd_bucket *b, const float *grad, uint64_t step) {
    DT_CHECK(bucket_stage(b, 0, "dt_powersgd_bucket_begin"));
    if (b->n > 0 && !grad)
        return dt_error_set(DT_ERR_INVALID, "dt_powersgd_bucket_begin: gradient is NULL");
    if (step >= (1ull << 36))
        return dt_error_set(DT_ERR_INVALID, "dt_powersgd_bucket_begin: step %llu >= 2^36",
                            (unsigned long long)step);
    float *restrict work = b->work;
    const float *restrict res = b->residual;
    size_t n = b->n;
    if (res)
        for (size_t i = 0; i < n; i++)
            work[i] = grad[i] + res[i];
    else
        memcpy(work, grad, n * sizeof(float));
    for (size_t i = 0; i < b->nparts; i++) {
        const psgd_part *t = &b->parts[i];
        float *Q = b->Q + t->q_at;
        q_refresh_raw(Q, t->cols, t->r, b->cfg.seed, step, b->cfg.bucket, 2 * t->q_at);
        product_p_raw(b->P + t->p_at, work + t->offset, Q, t->rows, t->cols, t->r);
    }
    for (size_t i = 0; i < b->nsegs; i++)
        memcpy(b->P + b->segs[i].at, work + b->segs[i].offset, b->segs[i].len * sizeof(float));
    b->stage = 1;
    return DT_OK;
}

dt_status dt_powersgd_bucket_middle(dt_powersgd_bucket *b) {
    DT_CHECK(bucket_stage(b, 1, "dt_powersgd_bucket_middle"));
    for (size_t i = 0; i < b->nparts; i++) {
        const psgd_part *t = &b->parts[i];
        dt__powersgd_orthonormalize(b->P + t->p_at, t->rows, t->r);
        product_q_raw(b->Q + t->q_at, b->work + t->offset, b->P + t->p_at, t->rows, t->cols, t->r);
    }
    b->stage = 2;
    return DT_OK;
}

dt_status dt_powersgd_bucket_end(dt_powersgd_bucket *b, float scale, float *out) {
    DT_CHECK(bucket_stage(b, 2, "dt_powersgd_bucket_end"));
    if (b->n > 0 && !out)
        return dt_error_set(DT_ERR_INVALID, "dt_powersgd_bucket_end: out is NULL");
    for (size_t i = 0; i < b->nq; i++)
        b->Q[i] *= scale;
    for (size_t i = 0; i < b->nparts; i++) {
        const psgd_part *t = &b->parts[i];
        product_out(out + t->offset, b->P + t->p_at, b->Q + t->q_at, t->rows, t->cols, t->r, 1.0f,
                    0.0f);
    }
    for (size_t i = 0; i < b->nsegs; i++) {
        const float *restrict src = b->P + b->segs[i].at;
        float *restrict dst = out + b->segs[i].offset;
        for (size_t j = 0; j < b->segs[i].len; j++)
            dst[j] = scale * src[j];
    }
    if (b->residual) {
        float *restrict res = b->residual;
        const float *restrict work = b->work;
        for (size_t i = 0; i < b->n; i++)
            res[i] = work[i] - out[i];
    }
    b->stage = 0;
    return DT_OK;
}

size_t dt_powersgd_bucket_state_bytes(const dt_powersgd_bucket *b) {
    return ((b->residual ? b->n : 0) + b->nq) * sizeof(float);
}

dt_status dt_powersgd_bucket_get_state(const dt_powersgd_bucket *b, void *buf, size_t len) {
    size_t need = dt_powersgd_bucket_state_bytes(b), rb = b->residual ? b->n * sizeof(float) : 0;
    if (len < need)
        return dt_error_set(DT_ERR_INVALID, "powersgd bucket state: buffer of %zu bytes, need %zu",
                            len, need);
    if (rb)
        memcpy(buf, b->residual, rb);
    memcpy((uint8_t *)buf + rb, b->Q, b->nq * sizeof(float));
    return DT_OK;
}

dt_status dt_powersgd_bucket_set_state(dt_powersgd_bucket *b, const void *buf, size_t len) {
    size_t need = dt_powersgd_bucket_state_bytes(b), rb = b->residual ? b->n * sizeof(float) : 0;
    if (len != need)
        return dt_error_set(DT_ERR_INVALID,
                            "powersgd bucket state: %zu bytes given, this bucket has %zu", len,
                            need);
    if (b->stage != 0)
        return dt_error_set(DT_ERR_INVALID,
                            "powersgd bucket state: cannot restore during a staged step");
    for (size_t i = 0; i < need / 4; i++) {
        float v = dt__load_f32((const uint8_t *)buf + 4 * i);
        if (!isfinite(v))
            return dt_error_set(DT_ERR_CORRUPT, "powersgd bucket state: value %zu is %g", i,
                                (double)v);
    }
    if (rb)
        memcpy(b->residual, buf, rb);
    memcpy(b->Q, (const uint8_t *)buf + rb, b->nq * sizeof(float));
    return DT_OK;
}

void dt__powersgd_bucket_abandon(dt_powersgd_bucket *b) { b->stage = 0; }

void dt__powersgd_bucket_reset(dt_powersgd_bucket *b) {
    if (b->residual)
        memset(b->residual, 0, b->n * sizeof(float));
    memset(b->Q, 0, b->nq * sizeof(float)); /* zero columns are redrawn at the next begin */
    b->stage = 0;
}

void dt__powersgd_bucket_flush_residual(dt_powersgd_bucket *b, float *data) {
    if (!b->residual)
        return;
    for (size_t i = 0; i < b->n; i++)
        data[i] += b->residual[i];
    memset(b->residual, 0, b->n * sizeof(float));
}

void dt__powersgd_bucket_scale_residual(dt_powersgd_bucket *b, float factor) {
    if (b->residual)
        for (size_t i = 0; i < b->n; i++)
            b->residual[i] *= factor;
}
