/*
 * kfac.c — K-FAC for the linear layers (Martens & Grosse 2015), with the
 * distribution of Osawa et al. / Pauloski et al.'s distributed K-FAC:
 * factors averaged over the data-parallel ranks, each layer's inverses
 * computed on one rank and broadcast.
 *
 * For a linear layer y = x W^T, W (out, in), the Fisher block is
 * approximated by A (x) G with A = E[x x^T] (in, in) over the tokens and
 * G = E[g g^T] (out, out), g each token's gradient of its own loss with
 * respect to y. Per step:
 *
 *   1. statistics: backward reports x and dy of every linear layer
 *      (dt_gpt_set_linear_stats); A_acc += x^T x / N, G_acc += g^T g / N
 *      in double, per micro-batch;
 *   2. factors: the accumulators averaged over the micro-batches and (one
 *      allreduce, the config's reduce) over the ranks; A = ema A + (1 - ema)
 *      A_step (the first step takes A_step);
 *   3. every inv_every updates: with pi = sqrt((tr A / in) / (tr G / out))
 *      (factored Tikhonov damping), Ainv = (A + pi sqrt(damping) I)^-1 and
 *      Ginv = (G + sqrt(damping) / pi I)^-1 by Cholesky in double; linear
 *      layer number j on rank j % nranks, then broadcast from there;
 *   4. U = Ginv dW Ainv for each linear weight, the other tensors U = dW;
 *      the KL clip nu = min(1, sqrt(kl_clip / (lr^2 sum <U, dW>))) over the
 *      linear layers scales their U; then SGD with momentum and L2 weight
 *      decay on U (dt_sgd_step), as the reference implementations do.
 *
 * Factors and inverses are per-tensor state (checkpointed, keyed by tensor):
 * [A (in^2) | G (out^2) | Ainv | Ginv]. The Gram matrices and the
 * preconditioning products are sgemm calls (the tensor layer's, vectorised
 * and threaded); the Cholesky factorisation and inversion are serial loops
 * in double whose inner loops run along rows. Costs: statistics
 * N (in^2 + out^2) per layer and micro-batch; inverses ~ (in^3 + out^3)
 * every inv_every steps, spread over the ranks. Memory is quadratic in the
 * widths (a 3072-wide G is 38 MB of double accumulator): K-FAC is for small
 * and medium models, documented as such in docs/optim.md.
 */
#include "dtrain/tensor.h"
#include "optim_internal.h"

#include <math.h>
#include <string.h>

struct dt__kfac {
    dt_kfac_config c;
    const dt_optim_tensor *tab; /* the optimizer's table (borrowed) */
    size_t ntab;
    size_t *lin; /* (nlin) the linear tensors' indices in tab */
    size_t nlin;
    size_t *aoff; /* (ntab) a linear tensor's [A_acc | G_acc] in acc */
    double *acc;  /* (nacc) the step's accumulators */
    size_t nacc;
    int *nmicro;   /* (ntab) micro-batches accumulated this step */
    double *chol;  /* (maxd^2) Cholesky work */
    float *t1, *u; /* (max out * in) products */
    float *sq;     /* (maxd^2) a Gram matrix */
    double *linv;  /* (maxd^2) the inverse Cholesky factor */
};

static size_t sq(size_t n) { return n * n; }

dt_status dt__kfac_create(dt__kfac **out, const dt_kfac_config *c, const dt_optim_tensor *tab,
                          size_t ntab, size_t *tlen) {
    dt__kfac *k = dt_calloc(1, sizeof *k);
    if (!k)
        return DT_ERR_NOMEM;
    k->c = *c;
    k->tab = tab;
    k->ntab = ntab;
    k->lin = dt_calloc(ntab + 1, sizeof *k->lin);
    k->aoff = dt_calloc(ntab + 1, sizeof *k->aoff);
    k->nmicro = dt_calloc(ntab + 1, sizeof *k->nmicro);
    if (!k->lin || !k->aoff || !k->nmicro)
        goto nomem;
    size_t maxd = 1, maxw = 1;
    for (size_t t = 0; t < ntab; t++) {
        const dt_optim_tensor *tt = &tab[t];
        if (!tt->linear)
            continue;
        k->lin[k->nlin++] = t;
        k->aoff[t] = k->nacc;
        k->nacc += sq(tt->cols) + sq(tt->rows);
        tlen[t] = 2 * (sq(tt->cols) + sq(tt->rows));
        maxd = tt->rows > maxd ? tt->rows : maxd;
        maxd = tt->cols > maxd ? tt->cols : maxd;
        maxw = tt->count > maxw ? tt->count : maxw;
    }
    k->acc = dt_calloc(k->nacc + 1, sizeof *k->acc);
    k->chol = dt_alloc(sq(maxd) * sizeof *k->chol);
    k->t1 = dt_alloc(maxw * sizeof *k->t1);
    k->u = dt_alloc(maxw * sizeof *k->u);
    k->sq = dt_alloc(sq(maxd) * sizeof *k->sq);
    k->linv = dt_alloc(sq(maxd) * sizeof *k->linv);
    if (!k->acc || !k->chol || !k->t1 || !k->u || !k->sq || !k->linv)
        goto nomem;
    *out = k;
    return DT_OK;
nomem:
    dt__kfac_destroy(k);
    return DT_ERR_NOMEM;
}

void dt__kfac_destroy(dt__kfac *k) {
    if (!k)
        return;
    dt_free(k->lin);
    dt_free(k->aoff);
    dt_free(k->nmicro);
    dt_free(k->acc);
    dt_free(k->chol);
    dt_free(k->t1);
    dt_free(k->u);
    dt_free(k->sq);
    dt_free(k->linv);
    dt_free(k);
}

size_t dt__kfac_bytes(const dt__kfac *k) {
    size_t maxw = 0;
    for (size_t j = 0; j < k->nlin; j++)
        maxw = k->tab[k->lin[j]].count > maxw ? k->tab[k->lin[j]].count : maxw;
    return k->nacc * sizeof(double) + 2 * maxw * sizeof(float);
    /* (the maxd^2 work matrices are not counted: one layer's, reused) */
}

/* acc (d, d) += X^T X * s, X (N, d) row-major: one sgemm into the float
 * scratch, added into the double accumulator. */
static void gram(dt__kfac *k, double *acc, const float *x, int N, size_t d, double s) {
    dt_sgemm(true, false, (int)d, (int)d, N, (float)s, x, (int)d, x, (int)d, 0.0f, k->sq, (int)d);
    for (size_t i = 0; i < d * d; i++)
        acc[i] += (double)k->sq[i];
}

dt_status dt__kfac_accumulate(dt__kfac *k, size_t weight_offset, const float *x, const float *dy,
                              int N, int in, int out, float scale) {
    size_t lo = 0, hi = k->nlin;
    while (lo < hi) { /* the linear tensor at weight_offset */
        size_t mid = lo + (hi - lo) / 2;
        if (k->tab[k->lin[mid]].offset < weight_offset)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo == k->nlin || k->tab[k->lin[lo]].offset != weight_offset)
        return dt_error_set(DT_ERR_INVALID, "kfac: no linear tensor at offset %zu", weight_offset);
    size_t t = k->lin[lo];
    const dt_optim_tensor *tt = &k->tab[t];
    if (tt->rows != (size_t)out || tt->cols != (size_t)in || N <= 0 || !(scale > 0))
        return dt_error_set(DT_ERR_INVALID,
                            "kfac: statistics of a (%d, %d) layer for the (%zu, %zu) tensor at "
                            "offset %zu (N %d, scale %g)",
                            out, in, tt->rows, tt->cols, weight_offset, N, (double)scale);
    double *A = k->acc + k->aoff[t], *G = A + sq((size_t)in);
    gram(k, A, x, N, (size_t)in, 1.0 / N);
    /* g = dy / scale: each token's own gradient. */
    gram(k, G, dy, N, (size_t)out, 1.0 / ((double)scale * (double)scale * N));
    k->nmicro[t]++;
    return DT_OK;
}

/* out = (F + damp I)^-1 for symmetric positive definite F (n, n), in
 * double: F + damp I = L L^T (Cholesky), then L^-1 by forward substitution
 * and the inverse as L^-T L^-1, every inner loop along a row. Returns false
 * when F + damp I is not positive definite (out untouched). */
static bool spd_inverse(dt__kfac *k, float *out, const float *F, size_t n, double damp) {
    double *L = k->chol, *Li = k->linv;
    for (size_t i = 0; i < n; i++) {
        for (size_t j = 0; j <= i; j++) {
            double s = (double)F[i * n + j] + (i == j ? damp : 0.0);
            for (size_t p = 0; p < j; p++)
                s -= L[i * n + p] * L[j * n + p];
            if (i == j) {
                if (!(s > 0))
                    return false;
                L[i * n + i] = sqrt(s);
            } else {
                L[i * n + j] = s / L[j * n + j];
            }
        }
    }
    memset(Li, 0, n * n * sizeof *Li);
    for (size_t i = 0; i < n; i++) { /* row i of L^-1: L[i,:i+1] . Li[:, c] = delta */
        Li[i * n + i] = 1.0 / L[i * n + i];
        for (size_t p = 0; p < i; p++) {
            double a = L[i * n + p];
            for (size_t c = 0; c <= p; c++)
                Li[i * n + c] -= a * Li[p * n + c];
        }
        for (size_t c = 0; c < i; c++)
            Li[i * n + c] /= L[i * n + i];
    }
    double *inv = L; /* L is no longer needed: inv = sum over rows r of Li[r,:]^T Li[r,:] */
    memset(inv, 0, n * n * sizeof *inv);
    for (size_t r = 0; r < n; r++)
        for (size_t i = 0; i <= r; i++) {
            double a = Li[r * n + i];
            for (size_t j = 0; j <= r; j++)
                inv[i * n + j] += a * Li[r * n + j];
        }
    for (size_t i = 0; i < n * n; i++)
        out[i] = (float)inv[i];
    return true;
}

/* C (r, c) = A (r, kk) B (kk, c), row-major. */
static void matmul(float *C, const float *A, const float *B, size_t r, size_t kk, size_t c) {
    dt_sgemm(false, false, (int)r, (int)c, (int)kk, 1.0f, A, (int)kk, B, (int)c, 0.0f, C, (int)c);
}

dt_status dt__kfac_step(dt__kfac *k, const dt_optim_config *c, float *p, const float *g,
                        float *tstate, const size_t *toff, float *mom, float lr, int64_t count,
                        float wd_of_tensor(const void *, size_t), const void *wd_user) {
    const dt_kfac_config *kc = &k->c;
    /* 2. The factors: micro-batch means, then the ranks' mean. */
    bool have = false;
    for (size_t j = 0; j < k->nlin; j++) {
        size_t t = k->lin[j];
        size_t len = sq(k->tab[t].cols) + sq(k->tab[t].rows);
        double s = k->nmicro[t] > 0 ? 1.0 / (k->nmicro[t] * (double)c->nranks) : 0.0;
        have |= k->nmicro[t] > 0;
        for (size_t i = 0; i < len; i++)
            k->acc[k->aoff[t] + i] *= s;
        k->nmicro[t] = 0;
    }
    if (c->reduce && k->nacc)
        DT_CHECK(c->reduce(c->reduce_user, k->acc, k->nacc));
    for (size_t j = 0; have && j < k->nlin; j++) {
        size_t t = k->lin[j];
        size_t len = sq(k->tab[t].cols) + sq(k->tab[t].rows);
        float *F = tstate + toff[t];
        const double *a = k->acc + k->aoff[t];
        double e = count == 0 ? 0.0 : kc->ema;
        for (size_t i = 0; i < len; i++)
            F[i] = (float)(e * (double)F[i] + (1.0 - e) * a[i]);
    }
    memset(k->acc, 0, k->nacc * sizeof *k->acc);
    /* 3. The inverses, each on its rank, then broadcast. */
    if (count % kc->inv_every == 0) {
        for (size_t j = 0; j < k->nlin; j++) {
            size_t t = k->lin[j], in = k->tab[t].cols, out = k->tab[t].rows;
            float *A = tstate + toff[t], *G = A + sq(in), *Ai = G + sq(out), *Gi = Ai + sq(in);
            int root = (int)(j % (size_t)c->nranks);
            if (root == c->rank) {
                double ta = 0, tg = 0;
                for (size_t i = 0; i < in; i++)
                    ta += A[i * in + i];
                for (size_t i = 0; i < out; i++)
                    tg += G[i * out + i];
                double pi = ta > 0 && tg > 0 ? sqrt((ta / (double)in) / (tg / (double)out)) : 1.0;
                double sd = sqrt(kc->damping);
                if (!spd_inverse(k, Ai, A, in, pi * sd) || !spd_inverse(k, Gi, G, out, sd / pi))
                    return dt_error_set(DT_ERR_NUMERIC,
                                        "kfac: the damped factors of tensor %zu are not positive "
                                        "definite (damping %g)",
                                        t, kc->damping);
            }
            if (c->bcast && c->nranks > 1)
                DT_CHECK(c->bcast(c->reduce_user, Ai, sq(in) + sq(out), root));
        }
    }
    /* 4. U = Ginv dW Ainv; the KL clip; momentum SGD. The linear
     * tensors' U is made twice (once for the clip's sum), trading a
     * product for a buffer per layer. */
    double vg = 0;
    for (size_t j = 0; j < k->nlin; j++) {
        size_t t = k->lin[j], in = k->tab[t].cols, out = k->tab[t].rows, off = k->tab[t].offset;
        const float *Ai = tstate + toff[t] + sq(in) + sq(out), *Gi = Ai + sq(in);
        matmul(k->t1, Gi, g + off, out, out, in);
        matmul(k->u, k->t1, Ai, out, in, in);
        for (size_t i = 0; i < out * in; i++)
            vg += (double)k->u[i] * (double)g[off + i];
    }
    vg *= (double)lr * (double)lr;
    float nu = vg > 0 ? (float)fmin(1.0, sqrt(kc->kl_clip / vg)) : 1.0f;
    size_t j = 0;
    for (size_t t = 0; t < k->ntab; t++) {
        const dt_optim_tensor *tt = &k->tab[t];
        float wd = wd_of_tensor(wd_user, t);
        float *b = mom ? mom + tt->offset : NULL;
        if (j < k->nlin && k->lin[j] == t) {
            size_t in = tt->cols, out = tt->rows;
            const float *Ai = tstate + toff[t] + sq(in) + sq(out), *Gi = Ai + sq(in);
            matmul(k->t1, Gi, g + tt->offset, out, out, in);
            matmul(k->u, k->t1, Ai, out, in, in);
            dt_scale(k->u, tt->count, nu);
            dt_sgd_step(p + tt->offset, k->u, b, tt->count, lr, c->momentum, c->nesterov, wd);
            j++;
        } else {
            dt_sgd_step(p + tt->offset, g + tt->offset, b, tt->count, lr, c->momentum, c->nesterov,
                        wd);
        }
    }
    return DT_OK;
}
