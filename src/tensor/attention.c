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
 * Threads own whole (batch, head) pairs in backward (dq of a head is summed
 * over all key blocks) and (batch, head, query block) triples in
 * forward; no two threads write the same element.
 *
 * Two implementations (attention_internal.h), chosen per call by head size
 * and dt_isa() only, never by the thread count:
 *   - avx512 (attention_avx512.c), head sizes 16, 32, 48, 64 at
 *     DT_ISA_AVX512 and above: every tile product is one register-blocked
 *     6 x 64 outer-product micro-kernel and the scores are kept transposed
 *     (keys down, queries across the lanes), so softmax statistics are
 *     vertical vector operations; see that file for the steps.
 *   - tiles (this file), every other head size and ISA: tile products
 *     through dt__sgemm_tile (oneDNN / OpenBLAS), with the online softmax,
 *     the causal mask and dS = P (dP - D) in our loops.
 * Why own kernels: at head size 64 the tiles are 64 x 256 x 64 products,
 * which a library sgemm runs at 60-100 GFLOP/s (call, packing and edge
 * overhead on every call) plus separate softmax passes over scratch, while
 * one 6 x 64 register tile (24 zmm accumulators, four vector loads and six
 * broadcasts per 24 FMAs) runs at ~200 GFLOP/s on L1 data and ~170 with its
 * B rows from L2 on this machine (standalone loop, one thread). The same
 * kernel serves all seven products because its A operand is six row
 * pointers with a common stride: stride 1 reads a row-major operand,
 * stride T a transposed one, so no product needs more than the Q^T / dO^T
 * packs. Measured with `dtrain bench attention` (median of 3 runs, one
 * thread, shared 2-core Sapphire Rapids VM, causal FLOPs only):
 *     B=8 T=256 C=384 NH=6:  forward 3.45 ms vs 4.52 (tiles), backward
 *                            7.85 vs 9.75: 1.26x (1.26-1.35x over runs)
 *     B=4 T=64 C=768 NH=12:  forward 0.31 vs 0.53, backward 0.80 vs 1.17:
 *                            1.53x (2 threads: 1.49x; shakespeare 1.22x)
 *
 * The tiles path, as measured before the avx512 kernels existed:
 * Forward tiles are DT_ATTN_BLOCK queries by up to KCH keys: while T <= KCH
 * a query block meets all its keys in one tile, two sgemm calls and one
 * softmax pass, with no rescaling of the output. Measured at B=8 T=256
 * C=384 NH=6 on one thread: 5.0 ms against 5.9 ms with 64-key tiles
 * (a 64 x 64 x 64 sgemm runs well below the rate of a 64 x 256 x 64 one).
 * Backward runs key block outer: for each block of BLK keys, the queries
 * from that block on, in chunks of up to KCH, meet it in one tile of
 * KCH x BLK, five products per tile (P, dP, dV, dK, dQ). dK and dV of the
 * block are then one product each with the query sum as the inner
 * dimension, and dQ's first product (key block 0) and dK/dV's first
 * (the chunk starting at the block) use beta = 0, so no zeroing pass.
 * Measured at B=8 T=256 C=384 NH=6 on one thread (min of 30 calls, three
 * runs, shared machine): 11.0-11.6 ms against 12.8-13.3 ms for the former
 * query-outer 64 x 64 tiles with a zeroing pass; about 0.4 ms of that is
 * the transposed products moving from OpenBLAS to oneDNN (dt__sgemm_tile).
 * The scratch is a fixed 2 x KCH x BLK per thread, so memory stays O(T).
 *
 * Layout: qkv (B,T,3C) = [q | k | v], each C = NH * HS with heads
 * contiguous, exactly what one linear layer of width 3C produces.
 */
#include "attention_internal.h"
#include "tensor_internal.h"

#include "simd.h"

#include <math.h>
#include <string.h>

#define BLK    DT_ATTN_BLOCK
#define MAX_HS 256 /* head size bound for the stack tiles (checked by nn) */
#define KCH    256 /* keys per forward tile, queries per backward tile; a multiple of BLK */

/* Row-major tile products on the calling thread: (M,K) x (K,N), operands
 * given with their leading dimensions. Tiles are at most KCH x BLK x HS. */
static inline void mm(bool ta, bool tb, int M, int N, int K, float alpha, const float *A, int lda,
                      const float *B, int ldb, float beta, float *C, int ldc) {
    dt__sgemm_tile(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

/* One query block [i0, i1) of head h of sequence b against all keys <= i1-1. */
static void attn_forward_block(float *out, float *lse, const float *qkv, int b, int h, int i0,
                               int T, int C, int NH) {
    const int HS = C / NH, i1 = i0 + BLK < T ? i0 + BLK : T, nq = i1 - i0;
    const int C3 = 3 * C;
    const float scale = 1.0f / sqrtf((float)HS);
    const float *base = qkv + (size_t)b * T * C3;
    const float *qb = base + (size_t)h * HS, *kb = qb + C, *vb = qb + 2 * (size_t)C;
    float S[BLK * KCH];    /* scores, then probabilities, of the tile */
    float O[BLK * MAX_HS]; /* unnormalised output rows */
    float m[BLK], l[BLK];
    for (int r = 0; r < nq; r++) {
        m[r] = -INFINITY;
        l[r] = 0.0f;
    }
    for (int j0 = 0; j0 < i1; j0 += KCH) {
        const int j1 = j0 + KCH < i1 ? j0 + KCH : i1, nk = j1 - j0;
        // S (nq,nk) = scale * Q_i (nq,HS) K_j^T (HS,nk)
        mm(false, true, nq, nk, HS, scale, qb + (size_t)i0 * C3, C3, kb + (size_t)j0 * C3, C3, 0.0f,
           S, KCH);
        for (int r = 0; r < nq; r++) {
            const int t = i0 + r, nv = (j1 < t + 1 ? j1 : t + 1) - j0; /* causal: keys <= t */
            float *srow = S + (size_t)r * KCH;
            float *orow = O + (size_t)r * HS;
            if (j0 == 0)
                memset(orow, 0, sizeof(float) * (size_t)HS);
            if (nv <= 0) {
                memset(srow, 0, sizeof(float) * (size_t)nk);
                continue;
            }
            float mb = dt__max(srow, (size_t)nv);
            float mnew = mb > m[r] ? mb : m[r];
            float corr = expf(m[r] - mnew); /* 0 on the first block (m = -inf) */
            l[r] = l[r] * corr + dt__exp_shift_sum(srow, srow, mnew, (size_t)nv);
            m[r] = mnew;
            if (nv < nk)
                memset(srow + nv, 0, sizeof(float) * (size_t)(nk - nv));
            if (j0 != 0 && corr != 1.0f)
                dt__scal(orow, corr, (size_t)HS);
        }
        // O (nq,HS) += P (nq,nk) V_j (nk,HS)
        mm(false, false, nq, HS, nk, 1.0f, S, KCH, vb + (size_t)j0 * C3, C3, 1.0f, O, HS);
    }
    for (int r = 0; r < nq; r++) {
        const int t = i0 + r;
        float inv = 1.0f / l[r];
        float *dst = out + ((size_t)b * T + t) * C + (size_t)h * HS;
        for (int d = 0; d < HS; d++)
            // cppcheck-suppress uninitvar ; the key loop runs at least once (i1 > 0)
            dst[d] = O[(size_t)r * HS + d] * inv;
        lse[((size_t)b * NH + h) * T + t] = m[r] + logf(l[r]);
    }
}

void dt__attention_forward_tiles(float *out, float *lse, const float *qkv, int B, int T, int C,
                                 int NH) {
    DT_ASSERT(C % NH == 0 && C / NH <= MAX_HS);
    int nblk = (T + BLK - 1) / BLK;
    /* Later query blocks see more keys; dynamic scheduling evens that out. */
#pragma omp parallel for collapse(3) schedule(dynamic, 1) if (B * NH * nblk > 1)
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int ib = 0; ib < nblk; ib++)
                attn_forward_block(out, lse, qkv, b, h, ib * BLK, T, C, NH);
}

static void attn_backward_head(float *dqkv, const float *dout, const float *qkv, const float *out,
                               const float *lse, int b, int h, int T, int C, int NH) {
    const int HS = C / NH, C3 = 3 * C;
    const float scale = 1.0f / sqrtf((float)HS);
    const float *base = qkv + (size_t)b * T * C3;
    const float *qb = base + (size_t)h * HS, *kb = qb + C, *vb = qb + 2 * (size_t)C;
    float *dbase = dqkv + (size_t)b * T * C3;
    float *dqb = dbase + (size_t)h * HS, *dkb = dqb + C, *dvb = dqb + 2 * (size_t)C;
    const float *dob = dout + (size_t)b * T * C + (size_t)h * HS;
    const float *ob = out + (size_t)b * T * C + (size_t)h * HS;
    const float *lrow = lse + ((size_t)b * NH + h) * T;
    float P[KCH * BLK], dP[KCH * BLK];
    /* Key block outer, query chunk inner: every product below covers a whole
     * chunk of up to KCH queries. The first write of each dQ/dK/dV row uses
     * beta = 0 (dQ at key block 0, dK/dV at the chunk starting at the key
     * block), so the gradients need no zeroing pass. */
    for (int j0 = 0; j0 < T; j0 += BLK) {
        const int j1 = j0 + BLK < T ? j0 + BLK : T, nk = j1 - j0;
        const float *Kj = kb + (size_t)j0 * C3, *Vj = vb + (size_t)j0 * C3;
        for (int i0 = j0; i0 < T; i0 += KCH) {
            const int i1 = i0 + KCH < T ? i0 + KCH : T, nq = i1 - i0;
            const float *Qi = qb + (size_t)i0 * C3, *dOi = dob + (size_t)i0 * C;
            const float first = i0 == j0 ? 0.0f : 1.0f;
            // P (nq,nk) = exp(scale Q_i K_j^T - lse), zero above the diagonal
            mm(false, true, nq, nk, HS, scale, Qi, C3, Kj, C3, 0.0f, P, BLK);
            // dP (nq,nk) = dO_i V_j^T
            mm(false, true, nq, nk, HS, 1.0f, dOi, C, Vj, C3, 0.0f, dP, BLK);
            for (int r = 0; r < nq; r++) {
                const int t = i0 + r, nv = (j1 < t + 1 ? j1 : t + 1) - j0; /* >= 1: t >= j0 */
                float *prow = P + (size_t)r * BLK, *dsrow = dP + (size_t)r * BLK;
                dt__exp_shift_sum(prow, prow, lrow[t], (size_t)nv);
                for (int c = nv; c < nk; c++)
                    prow[c] = 0.0f;
                // dS = P * (dP - D) * scale, written over dP. D is recomputed
                // for each key block: keeping it needs T floats of scratch per
                // thread, and the dot (2 HS flops) is 1/(5 BLK) of the row's
                // tile products.
                const float Dt = dt__dot(dob + (size_t)t * C, ob + (size_t)t * C, (size_t)HS);
                for (int c = 0; c < nk; c++)
                    dsrow[c] = prow[c] * (dsrow[c] - Dt) * scale;
            }
            // dV_j (nk,HS) (+)= P^T (nk,nq) dO_i (nq,HS)
            mm(true, false, nk, HS, nq, 1.0f, P, BLK, dOi, C, first, dvb + (size_t)j0 * C3, C3);
            // dK_j (nk,HS) (+)= dS^T (nk,nq) Q_i (nq,HS)
            mm(true, false, nk, HS, nq, 1.0f, dP, BLK, Qi, C3, first, dkb + (size_t)j0 * C3, C3);
            // dQ_i (nq,HS) (+)= dS (nq,nk) K_j (nk,HS)
            mm(false, false, nq, HS, nk, 1.0f, dP, BLK, Kj, C3, j0 == 0 ? 0.0f : 1.0f,
               dqb + (size_t)i0 * C3, C3);
        }
    }
}

void dt__attention_backward_tiles(float *dqkv, const float *dout, const float *qkv,
                                  const float *out, const float *lse, int B, int T, int C, int NH) {
    DT_ASSERT(C % NH == 0 && C / NH <= MAX_HS);
#pragma omp parallel for collapse(2) schedule(dynamic, 1) if (B * NH > 1)
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            attn_backward_head(dqkv, dout, qkv, out, lse, b, h, T, C, NH);
}

/* The register-tile kernels where they run (attention_avx512.c), the tiles
 * otherwise; the choice depends only on the head size and dt_isa(), never on
 * the thread count. */
void dt__attention_forward(float *out, float *lse, const float *qkv, int B, int T, int C, int NH) {
    if (!dt__attention_forward_avx512(out, lse, qkv, B, T, C, NH))
        dt__attention_forward_tiles(out, lse, qkv, B, T, C, NH);
}

void dt__attention_backward(float *dqkv, const float *dout, const float *qkv, const float *out,
                            const float *lse, int B, int T, int C, int NH) {
    if (!dt__attention_backward_avx512(dqkv, dout, qkv, out, lse, B, T, C, NH))
        dt__attention_backward_tiles(dqkv, dout, qkv, out, lse, B, T, C, NH);
}

/* ------------------------------------------------------------------------ */
/* Cross blocks: queries against keys that all precede them (ring attention) */
/* ------------------------------------------------------------------------ */
/*
 * The same tile scheme without the mask: forward keeps an online softmax
 * over KCH-key tiles per BLK-query block; backward runs per head, key block
 * outer, accumulating dQ, dK, dV (the caller sums a block's share into the
 * running gradients, so beta is always 1).
 */

typedef struct cross_args {
    const float *q, *kv;
    size_t ldq, ldkv, ld_lse;
    int Tq, Tk, C, NH;
} cross_args;

static void cross_forward_block(const cross_args *x, float *out, float *lse, int h, int i0) {
    const int HS = x->C / x->NH, i1 = i0 + BLK < x->Tq ? i0 + BLK : x->Tq, nq = i1 - i0;
    const float scale = 1.0f / sqrtf((float)HS);
    const float *qb = x->q + (size_t)h * HS + (size_t)i0 * x->ldq;
    const float *kb = x->kv + (size_t)h * HS, *vb = kb + x->C;
    float S[BLK * KCH], O[BLK * MAX_HS], m[BLK], l[BLK];
    for (int r = 0; r < nq; r++) {
        m[r] = -INFINITY;
        l[r] = 0.0f;
    }
    memset(O, 0, sizeof(float) * (size_t)nq * HS);
    for (int j0 = 0; j0 < x->Tk; j0 += KCH) {
        const int nk = j0 + KCH < x->Tk ? KCH : x->Tk - j0;
        mm(false, true, nq, nk, HS, scale, qb, x->ldq, kb + (size_t)j0 * x->ldkv, x->ldkv, 0.0f, S,
           KCH);
        for (int r = 0; r < nq; r++) {
            float *srow = S + (size_t)r * KCH;
            float mb = dt__max(srow, (size_t)nk), mnew = mb > m[r] ? mb : m[r];
            float corr = expf(m[r] - mnew);
            l[r] = l[r] * corr + dt__exp_shift_sum(srow, srow, mnew, (size_t)nk);
            m[r] = mnew;
            if (j0 != 0 && corr != 1.0f)
                dt__scal(O + (size_t)r * HS, corr, (size_t)HS);
        }
        mm(false, false, nq, HS, nk, 1.0f, S, KCH, vb + (size_t)j0 * x->ldkv, x->ldkv, 1.0f, O, HS);
    }
    for (int r = 0; r < nq; r++) {
        float inv = 1.0f / l[r];
        float *dst = out + (size_t)(i0 + r) * x->C + (size_t)h * HS;
        for (int d = 0; d < HS; d++)
            dst[d] = O[(size_t)r * HS + d] * inv;
        lse[(size_t)h * x->ld_lse + i0 + r] = m[r] + logf(l[r]);
    }
}

void dt__attention_cross_forward_tiles(float *out, float *lse, size_t ld_lse, const float *q,
                                       size_t ldq, const float *kv, size_t ldkv, int Tq, int Tk,
                                       int C, int NH) {
    DT_ASSERT(C % NH == 0 && C / NH <= MAX_HS && Tk > 0);
    const cross_args x = {q, kv, ldq, ldkv, ld_lse, Tq, Tk, C, NH};
    const int nblk = (Tq + BLK - 1) / BLK;
#pragma omp parallel for collapse(2) schedule(static) if (NH * nblk > 1)
    for (int h = 0; h < NH; h++)
        for (int ib = 0; ib < nblk; ib++)
            cross_forward_block(&x, out, lse, h, ib * BLK);
}

static void cross_backward_head(const cross_args *x, float *dq, float *dkv, const float *dout,
                                const float *out, const float *lse, int h) {
    const int HS = x->C / x->NH, C = x->C;
    const float scale = 1.0f / sqrtf((float)HS);
    const size_t ho = (size_t)h * HS;
    const float *qb = x->q + ho, *kb = x->kv + ho, *vb = kb + C;
    float *dqb = dq + ho, *dkb = dkv + ho, *dvb = dkb + C;
    const float *lrow = lse + (size_t)h * x->ld_lse;
    float P[KCH * BLK], dP[KCH * BLK];
    for (int j0 = 0; j0 < x->Tk; j0 += BLK) {
        const int nk = j0 + BLK < x->Tk ? BLK : x->Tk - j0;
        const float *Kj = kb + (size_t)j0 * x->ldkv, *Vj = vb + (size_t)j0 * x->ldkv;
        for (int i0 = 0; i0 < x->Tq; i0 += KCH) {
            const int nq = i0 + KCH < x->Tq ? KCH : x->Tq - i0;
            const float *Qi = qb + (size_t)i0 * x->ldq, *dOi = dout + (size_t)i0 * C + ho;
            mm(false, true, nq, nk, HS, scale, Qi, x->ldq, Kj, x->ldkv, 0.0f, P, BLK);
            mm(false, true, nq, nk, HS, 1.0f, dOi, C, Vj, x->ldkv, 0.0f, dP, BLK);
            for (int r = 0; r < nq; r++) {
                const int t = i0 + r;
                float *prow = P + (size_t)r * BLK, *dsrow = dP + (size_t)r * BLK;
                dt__exp_shift_sum(prow, prow, lrow[t], (size_t)nk);
                const float Dt =
                    dt__dot(dout + (size_t)t * C + ho, out + (size_t)t * C + ho, (size_t)HS);
                for (int c = 0; c < nk; c++)
                    dsrow[c] = prow[c] * (dsrow[c] - Dt) * scale;
            }
            mm(true, false, nk, HS, nq, 1.0f, P, BLK, dOi, C, 1.0f, dvb + (size_t)j0 * x->ldkv,
               x->ldkv);
            mm(true, false, nk, HS, nq, 1.0f, dP, BLK, Qi, x->ldq, 1.0f, dkb + (size_t)j0 * x->ldkv,
               x->ldkv);
            mm(false, false, nq, HS, nk, 1.0f, dP, BLK, Kj, x->ldkv, 1.0f,
               dqb + (size_t)i0 * x->ldq, x->ldq);
        }
    }
}

void dt__attention_cross_backward_tiles(float *dq, float *dkv, const float *dout, const float *q,
                                        size_t ldq, const float *kv, size_t ldkv, const float *out,
                                        const float *lse, size_t ld_lse, int Tq, int Tk, int C,
                                        int NH, int h0, int h1) {
    DT_ASSERT(C % NH == 0 && C / NH <= MAX_HS);
    const cross_args x = {q, kv, ldq, ldkv, ld_lse, Tq, Tk, C, NH};
#pragma omp parallel for schedule(static) if (h1 - h0 > 1)
    for (int h = h0; h < h1; h++)
        cross_backward_head(&x, dq, dkv, dout, out, lse, h);
}

/* avx512 where it runs, tiles otherwise (as for causal attention). */
void dt__attention_cross_forward(float *out, float *lse, size_t ld_lse, const float *q, size_t ldq,
                                 const float *kv, size_t ldkv, int Tq, int Tk, int C, int NH) {
    if (!dt__attention_cross_forward_avx512(out, lse, ld_lse, q, ldq, kv, ldkv, Tq, Tk, C, NH))
        dt__attention_cross_forward_tiles(out, lse, ld_lse, q, ldq, kv, ldkv, Tq, Tk, C, NH);
}

void dt__attention_cross_backward(float *dq, float *dkv, const float *dout, const float *q,
                                  size_t ldq, const float *kv, size_t ldkv, const float *out,
                                  const float *lse, size_t ld_lse, int Tq, int Tk, int C, int NH) {
    if (!dt__attention_cross_backward_avx512(dq, dkv, dout, q, ldq, kv, ldkv, out, lse, ld_lse, Tq,
                                             Tk, C, NH))
        dt__attention_cross_backward_tiles(dq, dkv, dout, q, ldq, kv, ldkv, out, lse, ld_lse, Tq,
                                           Tk, C, NH, 0, NH);
}

void dt_attention_merge(float *out, float *lse, size_t ld_lse, const float *pout, const float *plse,
                        size_t ld_plse, int Tq, int C, int NH) {
    const int HS = C / NH;
#pragma omp parallel for schedule(static) if ((size_t)Tq * C > 65536)
    for (int t = 0; t < Tq; t++)
        for (int h = 0; h < NH; h++) {
            float *l = lse + (size_t)h * ld_lse + t;
            const float a = *l, b = plse[(size_t)h * ld_plse + t];
            const float mx = a > b ? a : b;
            if (mx == -INFINITY) /* neither saw a key */
                continue;
            const float wa = expf(a - mx), wb = expf(b - mx), s = wa + wb;
            float *o = out + (size_t)t * C + (size_t)h * HS;
            const float *po = pout + (size_t)t * C + (size_t)h * HS;
            const float ca = wa / s, cb = wb / s;
            for (int d = 0; d < HS; d++)
                o[d] = ca * o[d] + cb * po[d];
            *l = mx + logf(s);
        }
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
