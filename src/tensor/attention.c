/*
 * attention.c — causal multi-head self-attention, forward and backward.
 *
 * The fast path is the "flash" scheme (Dao et al. 2022, 2023) on a CPU:
 * queries and keys are taken in blocks of DT_ATTN_BLOCK; for each query row
 * the scores against one key block are computed, the running maximum m and
 * normaliser l are updated (online softmax) and the output row is rescaled
 * and accumulated. The (T,T) matrix never exists; forward keeps only the
 * output and lse = m + log(l) per query, i.e. O(T) memory per head.
 *
 * Backward recomputes the probabilities block by block from lse:
 *     p  = exp(q.k * scale - lse)          dp = dout . v
 *     ds = p * (dp - D),  D = dout . out   (= sum_j p_j dp_j, per query)
 *     dq += scale ds k,   dk += scale ds q,   dv += p dout
 * Threads own whole (batch, head) pairs in backward (dk and dv of a head are
 * summed over all query blocks) and (batch, head, query block) triples in
 * forward; no two threads write the same element.
 *
 * Layout: qkv (B,T,3C) = [q | k | v], each C = NH * HS with heads
 * contiguous, exactly what one linear layer of width 3C produces.
 */
#include "dtrain/tensor.h"

#include "simd.h"

#include <math.h>
#include <string.h>

#define BLK    DT_ATTN_BLOCK
#define MAX_HS 256 /* head size bound for the stack tiles (checked by nn) */

/* s[0..BLK) = scale * (q . Kt[:, c]); Kt is (HS, BLK), a transposed key tile,
 * so the inner loop runs along keys and the accumulators stay in registers. */
static inline void scores_row(float *restrict s, const float *restrict q, const float *restrict Kt,
                              int HS, float scale) {
#if defined(__AVX512F__) && DT_ATTN_BLOCK == 64
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (int d = 0; d < HS; d++) {
        __m512 qd = _mm512_set1_ps(q[d]);
        const float *k = Kt + (size_t)d * BLK;
        a0 = _mm512_fmadd_ps(qd, _mm512_loadu_ps(k), a0);
        a1 = _mm512_fmadd_ps(qd, _mm512_loadu_ps(k + 16), a1);
        a2 = _mm512_fmadd_ps(qd, _mm512_loadu_ps(k + 32), a2);
        a3 = _mm512_fmadd_ps(qd, _mm512_loadu_ps(k + 48), a3);
    }
    __m512 vs = _mm512_set1_ps(scale);
    _mm512_storeu_ps(s, _mm512_mul_ps(a0, vs));
    _mm512_storeu_ps(s + 16, _mm512_mul_ps(a1, vs));
    _mm512_storeu_ps(s + 32, _mm512_mul_ps(a2, vs));
    _mm512_storeu_ps(s + 48, _mm512_mul_ps(a3, vs));
#else
    for (int c = 0; c < BLK; c++)
        s[c] = 0.0f;
    for (int d = 0; d < HS; d++) {
        const float *k = Kt + (size_t)d * BLK;
        float qd = q[d];
        for (int c = 0; c < BLK; c++)
            s[c] += qd * k[c];
    }
    for (int c = 0; c < BLK; c++)
        s[c] *= scale;
#endif
}

/* Kt (HS,BLK) = transpose of rows j0..j1 of one head's k (or v) slice. */
static void load_tile_t(float *restrict Kt, const float *base, size_t stride, int j0, int j1,
                        int HS) {
    for (int j = j0; j < j1; j++) {
        const float *k = base + (size_t)j * stride;
        for (int d = 0; d < HS; d++)
            Kt[(size_t)d * BLK + (j - j0)] = k[d];
    }
}

static void attn_forward_block(float *out, float *lse, const float *qkv, int b, int h, int i0,
                               int T, int C, int NH) {
    const int HS = C / NH, i1 = i0 + BLK < T ? i0 + BLK : T;
    const size_t C3 = 3 * (size_t)C;
    const float scale = 1.0f / sqrtf((float)HS);
    const float *base = qkv + (size_t)b * T * C3;
    const float *qb = base + (size_t)h * HS, *kb = qb + C, *vb = qb + 2 * (size_t)C;
    float Kt[MAX_HS * BLK]; /* transposed key tile */
    float o[BLK * MAX_HS];  /* unnormalised output rows */
    float m[BLK], l[BLK], s[BLK];
    memset(Kt, 0, sizeof(float) * (size_t)HS * BLK); /* unused lanes stay finite */
    memset(o, 0, sizeof(float) * (size_t)BLK * HS);
    for (int r = 0; r < BLK; r++) {
        m[r] = -INFINITY;
        l[r] = 0.0f;
    }
    for (int j0 = 0; j0 < i1; j0 += BLK) {
        int j1 = j0 + BLK < i1 ? j0 + BLK : i1;
        load_tile_t(Kt, kb, C3, j0, j1, HS);
        for (int t = i0; t < i1; t++) {
            int nk = (j1 < t + 1 ? j1 : t + 1) - j0; /* causal: keys j <= t */
            if (nk <= 0)
                continue;
            int r = t - i0;
            scores_row(s, qb + (size_t)t * C3, Kt, HS, scale);
            float mb = dt__max(s, (size_t)nk);
            float mnew = mb > m[r] ? mb : m[r];
            float corr = expf(m[r] - mnew); /* 0 on the first block (m = -inf) */
            float ps = dt__exp_shift_sum(s, s, mnew, (size_t)nk);
            l[r] = l[r] * corr + ps;
            m[r] = mnew;
            float *orow = o + (size_t)r * HS;
            if (corr != 1.0f)
                dt__scal(orow, corr, (size_t)HS);
            for (int c = 0; c < nk; c++)
                dt__axpy(orow, s[c], vb + (size_t)(j0 + c) * C3, (size_t)HS);
        }
    }
    for (int t = i0; t < i1; t++) {
        int r = t - i0;
        float inv = 1.0f / l[r];
        float *dst = out + ((size_t)b * T + t) * C + (size_t)h * HS;
        for (int d = 0; d < HS; d++)
            dst[d] = o[(size_t)r * HS + d] * inv;
        lse[((size_t)b * NH + h) * T + t] = m[r] + logf(l[r]);
    }
}

void dt_attention_forward(float *out, float *lse, const float *qkv, int B, int T, int C, int NH) {
    DT_ASSERT(C % NH == 0 && C / NH <= MAX_HS);
    int nblk = (T + BLK - 1) / BLK;
    /* Later query blocks see more keys; dynamic scheduling evens that out. */
#pragma omp parallel for collapse(3) schedule(dynamic, 1)
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int ib = 0; ib < nblk; ib++)
                attn_forward_block(out, lse, qkv, b, h, ib * BLK, T, C, NH);
}

static void attn_backward_head(float *dqkv, const float *dout, const float *qkv, const float *out,
                               const float *lse, int b, int h, int T, int C, int NH) {
    const int HS = C / NH;
    const size_t C3 = 3 * (size_t)C;
    const float scale = 1.0f / sqrtf((float)HS);
    const float *base = qkv + (size_t)b * T * C3;
    const float *qb = base + (size_t)h * HS, *kb = qb + C, *vb = qb + 2 * (size_t)C;
    float *dbase = dqkv + (size_t)b * T * C3;
    float *dqb = dbase + (size_t)h * HS, *dkb = dqb + C, *dvb = dqb + 2 * (size_t)C;
    const float *dob = dout + (size_t)b * T * C + (size_t)h * HS;
    const float *ob = out + (size_t)b * T * C + (size_t)h * HS;
    const float *lrow = lse + ((size_t)b * NH + h) * T;
    float Kt[MAX_HS * BLK], Vt[MAX_HS * BLK];
    float p[BLK], dp[BLK], D[BLK];
    memset(Kt, 0, sizeof(float) * (size_t)HS * BLK);
    memset(Vt, 0, sizeof(float) * (size_t)HS * BLK);
    for (int t = 0; t < T; t++) {
        memset(dqb + (size_t)t * C3, 0, sizeof(float) * HS);
        memset(dkb + (size_t)t * C3, 0, sizeof(float) * HS);
        memset(dvb + (size_t)t * C3, 0, sizeof(float) * HS);
    }
    for (int i0 = 0; i0 < T; i0 += BLK) {
        int i1 = i0 + BLK < T ? i0 + BLK : T;
        for (int t = i0; t < i1; t++)
            D[t - i0] = dt__dot(dob + (size_t)t * C, ob + (size_t)t * C, (size_t)HS);
        for (int j0 = 0; j0 < i1; j0 += BLK) {
            int j1 = j0 + BLK < i1 ? j0 + BLK : i1;
            load_tile_t(Kt, kb, C3, j0, j1, HS);
            load_tile_t(Vt, vb, C3, j0, j1, HS);
            for (int t = i0; t < i1; t++) {
                int nk = (j1 < t + 1 ? j1 : t + 1) - j0;
                if (nk <= 0)
                    continue;
                const float *q = qb + (size_t)t * C3, *dO = dob + (size_t)t * C;
                float *dq = dqb + (size_t)t * C3;
                scores_row(p, q, Kt, HS, scale);
                dt__exp_shift_sum(p, p, lrow[t], (size_t)nk); /* probabilities */
                scores_row(dp, dO, Vt, HS, 1.0f);
                float Dt = D[t - i0];
                for (int c = 0; c < nk; c++) {
                    size_t j = (size_t)(j0 + c) * C3;
                    float ds = p[c] * (dp[c] - Dt) * scale;
                    dt__axpy(dvb + j, p[c], dO, (size_t)HS);
                    dt__axpy(dq, ds, kb + j, (size_t)HS);
                    dt__axpy(dkb + j, ds, q, (size_t)HS);
                }
            }
        }
    }
}

void dt_attention_backward(float *dqkv, const float *dout, const float *qkv, const float *out,
                           const float *lse, int B, int T, int C, int NH) {
    DT_ASSERT(C % NH == 0 && C / NH <= MAX_HS);
#pragma omp parallel for collapse(2) schedule(dynamic, 1)
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            attn_backward_head(dqkv, dout, qkv, out, lse, b, h, T, C, NH);
}

/* ------------------------------------------------------------------------ */
/* Naive reference: scalar loops, the (T,T) probabilities stored            */
/* ------------------------------------------------------------------------ */

void dt_attention_naive_forward(float *out, float *att, const float *qkv, int B, int T, int C,
                                int NH) {
    const int HS = C / NH;
    const size_t C3 = 3 * (size_t)C;
    const float scale = 1.0f / sqrtf((float)HS);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < T; t++) {
                const float *q = qkv + ((size_t)b * T + t) * C3 + (size_t)h * HS;
                float *a = att + (((size_t)b * NH + h) * T + t) * T; // (T)
                float mx = -INFINITY;
                for (int j = 0; j <= t; j++) {
                    const float *k = qkv + ((size_t)b * T + j) * C3 + C + (size_t)h * HS;
                    float s = 0.0f;
                    for (int d = 0; d < HS; d++)
                        s += q[d] * k[d];
                    a[j] = s * scale;
                    mx = a[j] > mx ? a[j] : mx;
                }
                float sum = 0.0f;
                for (int j = 0; j <= t; j++) {
                    a[j] = expf(a[j] - mx);
                    sum += a[j];
                }
                for (int j = 0; j < T; j++)
                    a[j] = j <= t ? a[j] / sum : 0.0f;
                float *o = out + ((size_t)b * T + t) * C + (size_t)h * HS;
                for (int d = 0; d < HS; d++)
                    o[d] = 0.0f;
                for (int j = 0; j <= t; j++) {
                    const float *v =
                        qkv + ((size_t)b * T + j) * C3 + 2 * (size_t)C + (size_t)h * HS;
                    for (int d = 0; d < HS; d++)
                        o[d] += a[j] * v[d];
                }
            }
}

void dt_attention_naive_backward(float *dqkv, const float *dout, const float *qkv, const float *att,
                                 int B, int T, int C, int NH) {
    const int HS = C / NH;
    const size_t C3 = 3 * (size_t)C;
    const float scale = 1.0f / sqrtf((float)HS);
    memset(dqkv, 0, sizeof(float) * (size_t)B * T * C3);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < T; t++) {
                size_t off = (size_t)h * HS;
                const float *a = att + (((size_t)b * NH + h) * T + t) * T;
                const float *q = qkv + ((size_t)b * T + t) * C3 + off;
                const float *dO = dout + ((size_t)b * T + t) * C + off;
                float *dq = dqkv + ((size_t)b * T + t) * C3 + off;
                /* datt[j] = dout . v_j, recomputed in both passes (no scratch). */
                float sum = 0.0f;
                for (int j = 0; j <= t; j++) {
                    const float *v = qkv + ((size_t)b * T + j) * C3 + 2 * (size_t)C + off;
                    float da = 0.0f;
                    for (int d = 0; d < HS; d++)
                        da += dO[d] * v[d];
                    sum += a[j] * da;
                }
                for (int j = 0; j <= t; j++) {
                    size_t row = ((size_t)b * T + j) * C3;
                    const float *k = qkv + row + C + off, *v = qkv + row + 2 * (size_t)C + off;
                    float *dk = dqkv + row + C + off, *dv = dqkv + row + 2 * (size_t)C + off;
                    float da = 0.0f;
                    for (int d = 0; d < HS; d++)
                        da += dO[d] * v[d];
                    float ds = a[j] * (da - sum) * scale;
                    for (int d = 0; d < HS; d++) {
                        dq[d] += ds * k[d];
                        dk[d] += ds * q[d];
                        dv[d] += a[j] * dO[d];
                    }
                }
            }
}
