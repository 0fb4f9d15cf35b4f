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
 * rank) is redrawn from that stream before use. Tensors where a rank-r
 * encoding would not be smaller (r >= min(rows, cols), or r (rows + cols) >=
 * rows cols, or fewer values than min_compress) are sent as plain fp32.
 *
 * The products use OpenBLAS's cblas_sgemm; orthogonalisation accumulates in
 * double. Decoding reads P and Q straight from the buffer; their values are
 * unconstrained, the header check bounds their extent.
 */
#include "internal.h"

#include <cblas.h>
#include <math.h>

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

/* Redraw every all-zero column of Q (cols, r) from the shared stream. */
static void q_refresh(dt_compressor *c, uint64_t step) {
    size_t r = (size_t)c->prank, cols = c->cols;
    for (size_t j = 0; j < r; j++) {
        bool zero = true;
        for (size_t i = 0; i < cols && zero; i++)
            zero = c->Q[i * r + j] == 0.0f;
        if (!zero)
            continue;
        dt_rng rng;
        dt__compress_rng(&rng, c->cfg.seed, 0, step, c->cfg.bucket);
        /* Column j starts at its own offset in the bucket's range; each
         * normal draws two 32-bit outputs. */
        dt_rng_seek(&rng, ((uint64_t)c->cfg.bucket << 40) + (uint64_t)j * cols * 2);
        for (size_t i = 0; i < cols; i++)
            c->Q[i * r + j] = dt_rng_normal(&rng);
    }
}

/* P = M Q */
static void product_p(dt_compressor *c, const float *M) {
    int rows = (int)c->rows, cols = (int)c->cols, r = c->prank;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, r, cols, 1.0f, M, cols, c->Q, r,
                0.0f, c->P, r);
}

/* Q = M^T P */
static void product_q(dt_compressor *c, const float *M) {
    int rows = (int)c->rows, cols = (int)c->cols, r = c->prank;
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, cols, r, rows, 1.0f, M, cols, c->P, r,
                0.0f, c->Q, r);
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
