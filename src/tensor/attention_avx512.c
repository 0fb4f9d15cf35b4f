/*
 * attention_avx512.c — causal attention forward and backward for head sizes
 * 16, 32, 48 and 64 in AVX-512 register tiles (the design and the measured
 * numbers are in attention.c's header comment and docs/engine.md).
 *
 * Every product is one micro-kernel, `outer`: a 6 x (16 NV) tile of
 * accumulators (NV <= 4 zmm per row, 24 registers at NV = 4) gains, for
 * each k, six broadcast scalars times NV vectors of a row of B; A's six
 * rows are six pointers with a common stride, so the same kernel reads a
 * row-major operand (stride 1) or a transposed one (stride = its row
 * length) without any packing. Score tiles are kept transposed, keys down
 * and queries across the 16 lanes (S^T = K Q^T): the per-query softmax
 * statistics (running max, lse, D = dO . O) are then plain vertical vector
 * operations, and the causal mask is one 16-bit mask per key row. The only
 * packing is Q^T (forward: one 64-query block; backward: the whole head)
 * and dO^T (backward), by 16 x 16 in-register transposes.
 *
 * Forward, per (sequence, head, 64-query block), keys 0..i1-1:
 *   1. S^T (keys, 64) = K (scale Q_blk)^T in 6-key groups; query vectors
 *      wholly above the diagonal are skipped; masked entries are -inf; the
 *      max per query is kept as 4 vectors.
 *   2. P^T = exp(S^T - max) in place, the sums l per query alongside.
 *   3. O = P V in 6-query groups over exactly the keys they see; out = O / l,
 *      lse = max + log l.
 * Backward, per (sequence, head): Q^T (scaled), dO^T, lse and
 * D = rowsum(dO * O) packed once; then for each block of KB = 96 keys
 * (16 whole 6-key groups, 16-aligned):
 *   1. for each 64-query chunk from the block on (its Q^T and dO^T columns
 *      stay in L1) and each 6-key group, from the group's first 16-aligned
 *      query: P^T = exp(K Q^T - lse) (masked), dP^T = V dO^T,
 *      dS^T = P^T (dP^T - D) scale, both stored (KB x T scratch each);
 *      then dK = dS^T Q and dV = P^T dO per group, summed over all its
 *      queries in registers and stored once (no zeroing pass).
 *   2. dQ (+)= dS K over the block's keys, 6 queries at a time (stored at
 *      the first block, added after).
 * Work done beyond the causal triangle: about 6 % (scores of a 6-key group
 * start at a 16-aligned query; partial 6-row groups are computed whole).
 * Invariants: the result depends only on (T, HS) and the data, not on the
 * strides (C, NH), the thread or the thread count: threads own whole
 * (sequence, head) pairs (backward) or query blocks (forward), and every
 * sum runs in a fixed order. Scratch is per thread, O(T HS), grown on first
 * use and kept (like gemm_tn.c's pack buffers).
 */
#include "attention_internal.h"
#include "tensor_internal.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__)
#define HAVE_ATT_AVX512 1
#include "simd.h"
#define AVX512_TARGET DT__AVX512_TARGET
#define INLINE        static inline __attribute__((always_inline)) AVX512_TARGET
#else
#define HAVE_ATT_AVX512 0
#endif

#define MR     6  /* rows of a register tile (keys or queries) */
#define QB     64 /* queries per forward block: 4 vectors */
#define KB     96 /* keys per backward block (the dQ product's inner length) */
#define MAX_NV 4  /* head size <= 64 */
/* Rows of B prefetched ahead in the kernel: B is often rows of q, k, v or
 * dout at a stride of 3C floats (a new 4 KiB page per row, which the
 * hardware prefetchers do not follow). 8 rows: backward 7.9 vs 8.6 ms at
 * shakespeare-char shapes; 16 rows gained half as much. */
#ifndef PF
#define PF 8
#endif

bool dt__attention_avx512_ok(int C, int NH) {
#if HAVE_ATT_AVX512
    int HS = NH > 0 ? C / NH : 0;
    return dt_isa() >= DT_ISA_AVX512 && NH > 0 && C % NH == 0 && HS % 16 == 0 && HS >= 16 &&
           HS <= 16 * MAX_NV;
#else
    (void)C, (void)NH;
    return false;
#endif
}

size_t dt__attention_workspace_bytes(int T, int HS) {
    if (!HAVE_ATT_AVX512)
        return 0;
    /* The largest get_scratch below: a forward block's, or a backward's. */
    size_t nblk = ((size_t)T + QB - 1) / QB, Tp = ((size_t)T + 15) / 16 * 16;
    size_t fwd = ((size_t)HS + 1 + nblk * QB) * QB, bwd = (2 * (size_t)HS + 2 + 2 * KB) * Tp;
    return (fwd > bwd ? fwd : bwd) * sizeof(float);
}

#if HAVE_ATT_AVX512

/* Per-thread scratch, grown on demand and kept (reachable through the
 * thread's TLS until exit). NULL when the allocation fails. */
static _Thread_local float *scratch;
static _Thread_local size_t scratch_len;

static float *get_scratch(size_t n) {
    if (n > scratch_len) {
        free(scratch);
        scratch = aligned_alloc(64, (n * sizeof(float) + 63) / 64 * 64);
        scratch_len = scratch ? n : 0;
    }
    return scratch;
}

/* acc[i][v] = sum_{k < n} a[i][k * sk] * b[k * ldb + 16 v], i < MR, v < NV.
 * NV is a constant after inlining, so acc lives in MR * NV registers. */
INLINE void outer(__m512 acc[MR][MAX_NV], const int NV, int n, const float *const a[MR], size_t sk,
                  const float *b, size_t ldb) {
#pragma GCC unroll 8
    for (int i = 0; i < MR; i++)
#pragma GCC unroll 4
        for (int v = 0; v < NV; v++)
            acc[i][v] = _mm512_setzero_ps();
    for (int k = 0; k < n; k++) {
        __m512 bv[MAX_NV];
#pragma GCC unroll 4
        for (int v = 0; v < NV; v++) {
            bv[v] = _mm512_loadu_ps(b + 16 * v);
            _mm_prefetch((const char *)(b + PF * ldb + 16 * v), _MM_HINT_T0);
        }
        const size_t o = (size_t)k * sk;
#pragma GCC unroll 8
        for (int i = 0; i < MR; i++) {
            __m512 x = _mm512_set1_ps(a[i][o]);
#pragma GCC unroll 4
            for (int v = 0; v < NV; v++)
                acc[i][v] = _mm512_fmadd_ps(x, bv[v], acc[i][v]);
        }
        b += ldb;
    }
}

/* The kernel with its tile stored to c (MR rows of TL floats), one
 * out-of-line function per NV: kept apart from the epilogues, whose
 * constants would otherwise push accumulators out of the registers (24
 * accumulators, NV loads of b and one broadcast fill 29 of 32). The store
 * and reload of the tile cost 2 MR NV memory operations per MR NV n FMAs. */
#define TL (16 * MAX_NV)
#define DEF_TILE(NV)                                                                               \
    __attribute__((noinline))                                                                      \
    AVX512_TARGET static void tile##NV(float *restrict c, int n, const float *const a[MR],         \
                                       size_t sk, const float *b, size_t ldb) {                    \
        __m512 acc[MR][MAX_NV];                                                                    \
        outer(acc, NV, n, a, sk, b, ldb);                                                          \
        _Pragma("GCC unroll 8") for (int i = 0; i < MR; i++)                                       \
            _Pragma("GCC unroll 4") for (int v = 0; v < NV; v++)                                   \
                _mm512_store_ps(c + i * TL + 16 * v, acc[i][v]);                                   \
    }
DEF_TILE(1)
DEF_TILE(2)
DEF_TILE(3)
DEF_TILE(4)

/* c (MR, TL) = the first 16 nv columns of sum_k a[i][k sk] b[k ldb + .]. */
AVX512_TARGET static void tile(float *c, int nv, int n, const float *const a[MR], size_t sk,
                               const float *b, size_t ldb) {
    switch (nv) {
    case 1: tile1(c, n, a, sk, b, ldb); break;
    case 2: tile2(c, n, a, sk, b, ldb); break;
    case 3: tile3(c, n, a, sk, b, ldb); break;
    default: tile4(c, n, a, sk, b, ldb); break;
    }
}

/* dst[c][r] = s src[r][c] for a 16 x 16 block; source rows >= rows read as 0. */
AVX512_TARGET static void transpose16(float *dst, size_t ldd, const float *src, size_t lds,
                                      int rows, float s) {
    __m512 r[16], t[16];
    const __m512 vs = _mm512_set1_ps(s);
    for (int i = 0; i < 16; i++)
        r[i] = i < rows ? _mm512_mul_ps(_mm512_loadu_ps(src + (size_t)i * lds), vs)
                        : _mm512_setzero_ps();
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) {
        __m512d a = _mm512_castps_pd(t[i]), b = _mm512_castps_pd(t[i + 1]);
        __m512d c = _mm512_castps_pd(t[i + 2]), d = _mm512_castps_pd(t[i + 3]);
        r[i] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
        r[i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
        r[i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, d));
        r[i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, d));
    }
    /* r[4g + c] holds columns {c, c+4, c+8, c+12} of rows 4g..4g+3, one
     * 128-bit lane per column group; two lane shuffles gather them. */
    for (int c = 0; c < 4; c++) {
        t[c] = _mm512_shuffle_f32x4(r[c], r[4 + c], 0x88);
        t[4 + c] = _mm512_shuffle_f32x4(r[c], r[4 + c], 0xdd);
        t[8 + c] = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], 0x88);
        t[12 + c] = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], 0xdd);
    }
    for (int c = 0; c < 4; c++) {
        _mm512_storeu_ps(dst + (size_t)c * ldd, _mm512_shuffle_f32x4(t[c], t[8 + c], 0x88));
        _mm512_storeu_ps(dst + (size_t)(4 + c) * ldd,
                         _mm512_shuffle_f32x4(t[4 + c], t[12 + c], 0x88));
        _mm512_storeu_ps(dst + (size_t)(8 + c) * ldd, _mm512_shuffle_f32x4(t[c], t[8 + c], 0xdd));
        _mm512_storeu_ps(dst + (size_t)(12 + c) * ldd,
                         _mm512_shuffle_f32x4(t[4 + c], t[12 + c], 0xdd));
    }
}

/* dst (HS, ldd) = s times the transpose of rows 0..n-1 of src (stride lds),
 * columns n..ncols-1 of dst (ncols a multiple of 16) zero. */
AVX512_TARGET static void pack_t(float *dst, size_t ldd, const float *src, size_t lds, int n,
                                 int ncols, int HS, float s) {
    for (int c = 0; c < ncols; c += 16) {
        int rows = n - c < 16 ? (n - c > 0 ? n - c : 0) : 16;
        for (int d = 0; d < HS; d += 16)
            transpose16(dst + (size_t)d * ldd + c, ldd, src + (size_t)c * lds + d, lds, rows, s);
    }
}

/* Lanes >= lo of a 16-lane mask. */
static inline __mmask16 lanes_from(int lo) {
    return lo <= 0 ? (__mmask16)0xFFFF : lo >= 16 ? (__mmask16)0 : (__mmask16)(0xFFFFu << lo);
}

/* Lanes of queries q0..q0+15 that key j is visible to: q >= j and q < qend. */
static inline __mmask16 causal_mask(int q0, int j, int qend) {
    return (__mmask16)(lanes_from(j - q0) & ~lanes_from(qend - q0));
}

/* ln x for normal x > 0: x = 2^e m with m in [0.75, 1.5) (vgetmant, vgetexp),
 * ln m = 2 atanh(t) with t = (m - 1) / (m + 1), |t| <= 0.2, by its odd series
 * to t^9 (the next term is below 4e-9). Used for lse = max + ln l, l >= 1. */
INLINE __m512 log16(__m512 x) {
    const __m512 one = _mm512_set1_ps(1.0f);
    __m512 m = _mm512_getmant_ps(x, _MM_MANT_NORM_p75_1p5, _MM_MANT_SIGN_src);
    __m512 e = _mm512_getexp_ps(x);
    e = _mm512_mask_add_ps(e, _mm512_cmp_ps_mask(m, one, _CMP_LT_OQ), e, one);
    __m512 t = _mm512_div_ps(_mm512_sub_ps(m, one), _mm512_add_ps(m, one)),
           t2 = _mm512_mul_ps(t, t);
    __m512 p = _mm512_set1_ps(2.0f / 9.0f);
    p = _mm512_fmadd_ps(p, t2, _mm512_set1_ps(2.0f / 7.0f));
    p = _mm512_fmadd_ps(p, t2, _mm512_set1_ps(2.0f / 5.0f));
    p = _mm512_fmadd_ps(p, t2, _mm512_set1_ps(2.0f / 3.0f));
    p = _mm512_fmadd_ps(p, t2, _mm512_set1_ps(2.0f));
    return _mm512_fmadd_ps(e, _mm512_set1_ps(0.693147180559945f), _mm512_mul_ps(p, t));
}

/* ------------------------------------------------------------------------ */
/* Forward                                                                  */
/* ------------------------------------------------------------------------ */

typedef struct fwd_ctx {
    const float *qb, *kb, *vb; /* head's columns of q (row stride ldq), k and v (ldkv) */
    size_t ldq, ldkv;
    int nk;      /* keys: causal, those up to the block's last query (i1) */
    bool causal; /* false: a cross block, every query sees all nk keys */
    int HS, i0, i1;
    float scale;
    float *qt; /* (HS, QB): the block's Q^T */
    float *st; /* (i1, QB): S^T, then P^T */
    float *mx; /* (QB): running max per query */
    float *ob; /* head's columns of out (row stride ldo) */
    size_t ldo;
    float *lrow; /* head's lse (its queries) */
} fwd_ctx;

/* Rows i of a tile: row r0 + i, the last valid one repeated past `rows`
 * (computed and dropped: the kernel always runs MR rows). */
static void tile_rows(const float *a[MR], const float *base, size_t stride, int rows) {
    for (int i = 0; i < MR; i++)
        a[i] = base + (size_t)(i < rows ? i : rows - 1) * stride;
}

/* Query vectors a key group starting at jg skips (all of them before it). */
static inline int skipped(const fwd_ctx *f, int jg) {
    return f->causal && jg > f->i0 ? (jg - f->i0) / 16 : 0;
}

AVX512_TARGET static void fwd_block(const fwd_ctx *f) {
    const int i0 = f->i0, i1 = f->i1, nk = f->nk, nvh = f->HS / 16;
    const __m512 ninf = _mm512_set1_ps(-INFINITY);
    float c[MR * TL] __attribute__((aligned(64)));
    const float *a[MR];
    pack_t(f->qt, QB, f->qb + (size_t)i0 * f->ldq, f->ldq, i1 - i0, QB, f->HS, f->scale);
    for (int q = 0; q < QB; q += 16)
        _mm512_store_ps(f->mx + q, ninf);
    /* Step 1: S^T by 6-key groups; query vectors below vs (queries < jg) skipped.
     * A cross block masks only the lanes past the last query (key 0 is
     * visible to every query). */
    for (int jg = 0; jg < nk; jg += MR) {
        int rows = nk - jg < MR ? nk - jg : MR, vs = skipped(f, jg);
        tile_rows(a, f->kb + (size_t)jg * f->ldkv, f->ldkv, rows);
        tile(c, QB / 16 - vs, f->HS, a, 1, f->qt + 16 * vs, QB);
        for (int i = 0; i < rows; i++) {
            float *srow = f->st + (size_t)(jg + i) * QB;
            for (int v = vs; v < QB / 16; v++) {
                __mmask16 m = causal_mask(i0 + 16 * v, f->causal ? jg + i : 0, i1);
                __m512 x = _mm512_load_ps(c + i * TL + 16 * (v - vs));
                if (m != 0xFFFF)
                    x = _mm512_mask_blend_ps(m, ninf, x);
                _mm512_store_ps(srow + 16 * v, x);
                _mm512_store_ps(f->mx + 16 * v, _mm512_max_ps(_mm512_load_ps(f->mx + 16 * v), x));
            }
        }
    }
    /* Step 2: P^T = exp(S^T - max) with the masked and skipped entries 0;
     * the four column sums stay in registers (the v loop is unrolled). */
    __m512 l[QB / 16], mv[QB / 16];
#pragma GCC unroll 4
    for (int v = 0; v < QB / 16; v++) {
        l[v] = _mm512_setzero_ps();
        mv[v] = _mm512_load_ps(f->mx + 16 * v);
    }
    for (int j = 0; j < nk; j++) {
        int vs = skipped(f, j - j % MR);
        float *srow = f->st + (size_t)j * QB;
#pragma GCC unroll 4
        for (int v = 0; v < QB / 16; v++) {
            __m512 p = _mm512_setzero_ps(); /* never written in step 1: queries < jg */
            if (v >= vs) {
                __mmask16 m = causal_mask(i0 + 16 * v, f->causal ? j : 0, i1);
                p = dt__exp16(_mm512_sub_ps(_mm512_load_ps(srow + 16 * v), mv[v]));
                if (m != 0xFFFF)
                    p = _mm512_maskz_mov_ps(m, p);
                l[v] = _mm512_add_ps(l[v], p);
            }
            _mm512_store_ps(srow + 16 * v, p);
        }
    }
    float linv[QB] __attribute__((aligned(64)));
    for (int v = 0; v < QB / 16; v++) {
        _mm512_store_ps(linv + 16 * v, _mm512_div_ps(_mm512_set1_ps(1.0f), l[v]));
        __m512 lse = _mm512_add_ps(_mm512_load_ps(f->mx + 16 * v), log16(l[v]));
        _mm512_mask_storeu_ps(f->lrow + i0 + 16 * v, causal_mask(i0 + 16 * v, 0, i1), lse);
    }
    /* Step 3: O = P V for 6 queries at a time over the keys they see. */
    for (int r0 = i0; r0 < i1; r0 += MR) {
        int rows = i1 - r0 < MR ? i1 - r0 : MR;
        tile_rows(a, f->st + (r0 - i0), 1, rows);
        tile(c, nvh, f->causal ? r0 + rows : nk, a, QB, f->vb, f->ldkv);
        for (int i = 0; i < rows; i++) {
            __m512 inv = _mm512_set1_ps(linv[r0 - i0 + i]);
            for (int v = 0; v < nvh; v++)
                _mm512_storeu_ps(f->ob + (size_t)(r0 + i) * f->ldo + 16 * v,
                                 _mm512_mul_ps(_mm512_load_ps(c + i * TL + 16 * v), inv));
        }
    }
}

/* ------------------------------------------------------------------------ */
/* Backward                                                                 */
/* ------------------------------------------------------------------------ */

typedef struct bwd_ctx {
    const float *qb, *kb, *vb; /* head's columns of q (row stride ldq), k, v (ldkv) */
    const float *dob, *ob;     /* head's columns of dout, out (row stride C) */
    float *dqb, *dkb, *dvb;    /* head's columns of dq (ldq), dk, dv (ldkv) */
    size_t ldq, ldkv, C;
    int T, Tp, HS; /* queries, padded to 16 */
    int Tk;        /* keys (causal: T) */
    bool causal;   /* false: a cross block (every query sees every key),
                      whose dq, dk, dv are added to */
    float scale;
    float *qt, *dot; /* (HS, Tp): Q^T, dO^T, zero past T */
    float *lp, *dp;  /* (Tp): lse and D = dO . O per query, zero past T */
    float *pt, *dst; /* (KB, Tp): P^T and dS^T of the key block (row j - j0) */
} bwd_ctx;

/* Step 1a for keys jg..jg+rows-1 and queries q0..q0+16 nv: P^T, dS^T. */
AVX512_TARGET static void bwd_scores(const bwd_ctx *g, int j0, int jg, int rows, int q0, int nv) {
    float c[MR * TL] __attribute__((aligned(64)));
    const float *a[MR];
    const __m512 vscale = _mm512_set1_ps(g->scale);
    tile_rows(a, g->kb + (size_t)jg * g->ldkv, g->ldkv, rows);
    tile(c, nv, g->HS, a, 1, g->qt + q0, (size_t)g->Tp);
    for (int i = 0; i < rows; i++) {
        float *prow = g->pt + (size_t)(jg + i - j0) * g->Tp + q0;
        for (int v = 0; v < nv; v++) {
            __mmask16 m = causal_mask(q0 + 16 * v, g->causal ? jg + i : 0, g->T);
            __m512 x = _mm512_sub_ps(_mm512_load_ps(c + i * TL + 16 * v),
                                     _mm512_load_ps(g->lp + q0 + 16 * v));
            x = dt__exp16(x);
            _mm512_store_ps(prow + 16 * v, m == 0xFFFF ? x : _mm512_maskz_mov_ps(m, x));
        }
    }
    tile_rows(a, g->vb + (size_t)jg * g->ldkv, g->ldkv, rows);
    tile(c, nv, g->HS, a, 1, g->dot + q0, (size_t)g->Tp);
    for (int i = 0; i < rows; i++) {
        size_t row = (size_t)(jg + i - j0) * g->Tp + q0;
        for (int v = 0; v < nv; v++) {
            __m512 dp = _mm512_sub_ps(_mm512_load_ps(c + i * TL + 16 * v),
                                      _mm512_load_ps(g->dp + q0 + 16 * v));
            __m512 ds = _mm512_mul_ps(_mm512_load_ps(g->pt + row + 16 * v), dp);
            _mm512_store_ps(g->dst + row + 16 * v, _mm512_mul_ps(ds, vscale));
        }
    }
}

/* c's first rows rows (nv vectors) stored to d (row stride ld), or added. */
AVX512_TARGET static void put_rows(float *d, size_t ld, const float *c, int rows, int nv,
                                   bool add) {
    for (int i = 0; i < rows; i++)
        for (int v = 0; v < nv; v++) {
            __m512 x = _mm512_load_ps(c + i * TL + 16 * v);
            float *p = d + (size_t)i * ld + 16 * v;
            _mm512_storeu_ps(p, add ? _mm512_add_ps(_mm512_loadu_ps(p), x) : x);
        }
}

AVX512_TARGET static void bwd_head(const bwd_ctx *g) {
    const int T = g->T, Tp = g->Tp, Tk = g->Tk, HS = g->HS, nvh = HS / 16;
    const bool causal = g->causal;
    float c[MR * TL] __attribute__((aligned(64)));
    const float *a[MR];
    pack_t(g->qt, (size_t)Tp, g->qb, g->ldq, T, Tp, HS, g->scale);
    pack_t(g->dot, (size_t)Tp, g->dob, g->C, T, Tp, HS, 1.0f);
    for (int t = 0; t < Tp; t++) {
        float d = 0.0f;
        if (t < T) {
            const float *x = g->dob + (size_t)t * g->C, *y = g->ob + (size_t)t * g->C;
            __m512 s = _mm512_setzero_ps();
            for (int v = 0; v < nvh; v++)
                s = _mm512_fmadd_ps(_mm512_loadu_ps(x + 16 * v), _mm512_loadu_ps(y + 16 * v), s);
            d = _mm512_reduce_add_ps(s);
        }
        g->dp[t] = d;
    }
    /* A cross block's queries all see every key: they start at 0 for
     * every key block, and its gradients are added to. */
    for (int j0 = 0; j0 < Tk; j0 += KB) {
        const int j1 = j0 + KB < Tk ? j0 + KB : Tk;
        /* Query chunk outer, key group inner: the chunk's Q^T and dO^T
         * columns (2 x 16 KiB at HS = 64) stay in L1 across the block's
         * key groups. A group starts at its first 16-aligned query. */
        for (int q0 = causal ? j0 : 0; q0 < Tp; q0 += 64)
            for (int jg = j0; jg < j1; jg += MR) {
                int first = causal ? jg / 16 * 16 : 0;
                int lo = first > q0 ? first : q0, hi = q0 + 64 < Tp ? q0 + 64 : Tp;
                if (lo < hi)
                    bwd_scores(g, j0, jg, j1 - jg < MR ? j1 - jg : MR, lo, (hi - lo) / 16);
            }
        for (int jg = j0; jg < j1; jg += MR) {
            int rows = j1 - jg < MR ? j1 - jg : MR, q0 = causal ? jg : 0;
            /* dK = dS^T Q and dV = P^T dO over queries q0..T-1 (causal: the
             * queries in [jg, key) have P = dS = 0), each row written once. */
            size_t off = (size_t)(jg - j0) * Tp + q0;
            tile_rows(a, g->dst + off, (size_t)Tp, rows);
            tile(c, nvh, T - q0, a, 1, g->qb + (size_t)q0 * g->ldq, g->ldq);
            put_rows(g->dkb + (size_t)jg * g->ldkv, g->ldkv, c, rows, nvh, !causal);
            tile_rows(a, g->pt + off, (size_t)Tp, rows);
            tile(c, nvh, T - q0, a, 1, g->dob + (size_t)q0 * g->C, g->C);
            put_rows(g->dvb + (size_t)jg * g->ldkv, g->ldkv, c, rows, nvh, !causal);
        }
        /* Step 2: dQ rows r0.. (+)= dS K over the block's keys <= their own.
         * Query and key groups both start at j0 in steps of MR, so every
         * key group read here started at or before r0: its dS^T row was
         * written from column jg/16*16 <= r0 on. (Cross: every row of the
         * block, over all its keys.) */
        for (int r0 = causal ? j0 : 0; r0 < T; r0 += MR) {
            int rows = T - r0 < MR ? T - r0 : MR;
            int kend = causal && r0 + rows < j1 ? r0 + rows : j1;
            tile_rows(a, g->dst + r0, 1, rows);
            tile(c, nvh, kend - j0, a, (size_t)Tp, g->kb + (size_t)j0 * g->ldkv, g->ldkv);
            put_rows(g->dqb + (size_t)r0 * g->ldq, g->ldq, c, rows, nvh, !causal || j0 > 0);
        }
    }
}

#endif /* HAVE_ATT_AVX512 */

bool dt__attention_forward_avx512(float *out, float *lse, const float *qkv, int B, int T, int C,
                                  int NH) {
    if (!dt__attention_avx512_ok(C, NH))
        return false;
#if HAVE_ATT_AVX512
    const int HS = C / NH, nblk = (T + QB - 1) / QB;
    const size_t C3 = 3 * (size_t)C;
    int fail = 0;
    /* Later query blocks see more keys; dynamic scheduling evens that out. */
#pragma omp parallel for collapse(3) schedule(dynamic, 1) if (B * NH * nblk > 1) reduction(| : fail)
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int ib = 0; ib < nblk; ib++) {
                float *ws = get_scratch((size_t)(HS + 1 + nblk * QB) * QB);
                if (!ws) {
                    fail = 1;
                    continue;
                }
                const float *qb = qkv + (size_t)b * T * C3 + (size_t)h * HS;
                const int i1 = (ib + 1) * QB < T ? (ib + 1) * QB : T;
                fwd_ctx f = {
                    .qb = qb,
                    .kb = qb + C,
                    .vb = qb + 2 * (size_t)C,
                    .ldq = C3,
                    .ldkv = C3,
                    .nk = i1,
                    .causal = true,
                    .HS = HS,
                    .i0 = ib * QB,
                    .i1 = i1,
                    .scale = 1.0f / sqrtf((float)HS),
                    .qt = ws,
                    .mx = ws + (size_t)HS * QB,
                    .st = ws + (size_t)(HS + 1) * QB,
                    .ob = out + (size_t)b * T * C + (size_t)h * HS,
                    .ldo = (size_t)C,
                    .lrow = lse + ((size_t)b * NH + h) * T,
                };
                fwd_block(&f);
            }
    return !fail;
#else
    (void)out, (void)lse, (void)qkv, (void)B, (void)T;
    return false;
#endif
}

bool dt__attention_backward_avx512(float *dqkv, const float *dout, const float *qkv,
                                   const float *out, const float *lse, int B, int T, int C,
                                   int NH) {
    if (!dt__attention_avx512_ok(C, NH))
        return false;
#if HAVE_ATT_AVX512
    const int HS = C / NH, Tp = (T + 15) / 16 * 16;
    const size_t C3 = 3 * (size_t)C;
    int fail = 0;
#pragma omp parallel for collapse(2) schedule(dynamic, 1) if (B * NH > 1) reduction(| : fail)
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            float *ws = get_scratch((size_t)(2 * HS + 2 + 2 * KB) * Tp);
            if (!ws) {
                fail = 1;
                continue;
            }
            const float *qb = qkv + (size_t)b * T * C3 + (size_t)h * HS;
            float *dqb = dqkv + (size_t)b * T * C3 + (size_t)h * HS;
            size_t bo = (size_t)b * T * C + (size_t)h * HS;
            bwd_ctx g = {
                .qb = qb,
                .kb = qb + C,
                .vb = qb + 2 * (size_t)C,
                .dob = dout + bo,
                .ob = out + bo,
                .dqb = dqb,
                .dkb = dqb + C,
                .dvb = dqb + 2 * (size_t)C,
                .ldq = C3,
                .ldkv = C3,
                .C = (size_t)C,
                .T = T,
                .Tp = Tp,
                .Tk = T,
                .causal = true,
                .HS = HS,
                .scale = 1.0f / sqrtf((float)HS),
                .qt = ws,
                .dot = ws + (size_t)HS * Tp,
                .lp = ws + (size_t)2 * HS * Tp,
                .dp = ws + (size_t)(2 * HS + 1) * Tp,
                .pt = ws + (size_t)(2 * HS + 2) * Tp,
                .dst = ws + (size_t)(2 * HS + 2 + KB) * Tp,
            };
            const float *lrow = lse + ((size_t)b * NH + h) * T;
            for (int t = 0; t < Tp; t++)
                g.lp[t] = t < T ? lrow[t] : 0.0f;
            bwd_head(&g);
        }
    return !fail;
#else
    (void)dqkv, (void)dout, (void)qkv, (void)out, (void)lse, (void)B, (void)T;
    return false;
#endif
}

bool dt__attention_cross_forward_avx512(float *out, float *lse, size_t ld_lse, const float *q,
                                        size_t ldq, const float *kv, size_t ldkv, int Tq, int Tk,
                                        int C, int NH) {
    if (!dt__attention_avx512_ok(C, NH))
        return false;
#if HAVE_ATT_AVX512
    const int HS = C / NH, nblk = (Tq + QB - 1) / QB;
    int fail = 0;
#pragma omp parallel for collapse(2) schedule(static) if (NH * nblk > 1) reduction(| : fail)
    for (int h = 0; h < NH; h++)
        for (int ib = 0; ib < nblk; ib++) {
            float *ws = get_scratch((size_t)(HS + 1 + Tk) * QB);
            if (!ws) {
                fail = 1;
                continue;
            }
            const float *kb = kv + (size_t)h * HS;
            fwd_ctx f = {
                .qb = q + (size_t)h * HS,
                .kb = kb,
                .vb = kb + C,
                .ldq = ldq,
                .ldkv = ldkv,
                .nk = Tk,
                .causal = false,
                .HS = HS,
                .i0 = ib * QB,
                .i1 = (ib + 1) * QB < Tq ? (ib + 1) * QB : Tq,
                .scale = 1.0f / sqrtf((float)HS),
                .qt = ws,
                .mx = ws + (size_t)HS * QB,
                .st = ws + (size_t)(HS + 1) * QB,
                .ob = out + (size_t)h * HS,
                .ldo = (size_t)C,
                .lrow = lse + (size_t)h * ld_lse,
            };
            fwd_block(&f);
        }
    return !fail;
#else
    (void)out, (void)lse, (void)ld_lse, (void)q, (void)ldq, (void)kv, (void)ldkv, (void)Tq;
    (void)Tk;
    return false;
#endif
}

bool dt__attention_cross_backward_avx512(float *dq, float *dkv, const float *dout, const float *q,
                                         size_t ldq, const float *kv, size_t ldkv, const float *out,
                                         const float *lse, size_t ld_lse, int Tq, int Tk, int C,
                                         int NH) {
    if (!dt__attention_avx512_ok(C, NH))
        return false;
#if HAVE_ATT_AVX512
    const int HS = C / NH, Tp = (Tq + 15) / 16 * 16;
#pragma omp parallel for schedule(dynamic, 1) if (NH > 1)
    for (int h = 0; h < NH; h++) {
        float *ws = get_scratch((size_t)(2 * HS + 2 + 2 * KB) * Tp);
        if (!ws) { /* this head in tiles: it adds, so no other head may redo */
            dt__attention_cross_backward_tiles(dq, dkv, dout, q, ldq, kv, ldkv, out, lse, ld_lse,
                                               Tq, Tk, C, NH, h, h + 1);
            continue;
        }
        const size_t ho = (size_t)h * HS;
        bwd_ctx g = {
            .qb = q + ho,
            .kb = kv + ho,
            .vb = kv + ho + C,
            .dob = dout + ho,
            .ob = out + ho,
            .dqb = dq + ho,
            .dkb = dkv + ho,
            .dvb = dkv + ho + C,
            .ldq = ldq,
            .ldkv = ldkv,
            .C = (size_t)C,
            .T = Tq,
            .Tp = Tp,
            .Tk = Tk,
            .causal = false,
            .HS = HS,
            .scale = 1.0f / sqrtf((float)HS),
            .qt = ws,
            .dot = ws + (size_t)HS * Tp,
            .lp = ws + (size_t)2 * HS * Tp,
            .dp = ws + (size_t)(2 * HS + 1) * Tp,
            .pt = ws + (size_t)(2 * HS + 2) * Tp,
            .dst = ws + (size_t)(2 * HS + 2 + KB) * Tp,
        };
        const float *lrow = lse + (size_t)h * ld_lse;
        for (int t = 0; t < Tp; t++)
            g.lp[t] = t < Tq ? lrow[t] : 0.0f;
        bwd_head(&g);
    }
    return true;
#else
    (void)dq, (void)dkv, (void)dout, (void)q, (void)ldq, (void)kv, (void)ldkv, (void)out;
    (void)lse, (void)ld_lse, (void)Tq, (void)Tk;
    return false;
#endif
}
