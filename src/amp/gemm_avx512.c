/*
 * gemm_avx512.c — our bf16 multiply on AVX512-BF16: vdpbf16ps, fp32 sums.
 *
 * vdpbf16ps multiplies 16 pairs of bf16 values and adds each pair's two
 * products to one fp32 lane: acc[l] += a[2l] * b[2l] + a[2l+1] * b[2l+1].
 * The operands are therefore packed with neighbouring k values side by side
 * in one 32-bit word (odd K is padded with a zero):
 *
 *   A panel (MR rows):     Ap[p][r]  = (A[i][2p], A[i][2p+1])   i = panel*MR + r
 *   B micro-panel (NR=32): Bp[p][c]  = (B[2p][j], B[2p+1][j])   j = jp*NR + c
 *
 * The micro-kernel keeps an MR x 32 block of C in 24 zmm registers; for each
 * k pair it loads two vectors of Bp and broadcasts one word of Ap per row:
 * 24 vdpbf16ps (768 multiply-adds) per 2 loads + 12 broadcasts.
 *
 * Blocking (Goto-style, simplified): A is packed once per call (shared by
 * all threads); threads take 32-column panels of C; for each panel and each
 * block of KCP k pairs a thread packs its B micro-panel (16 KiB, stays in
 * L1/L2) and sweeps it over every A panel, summing into a per-thread fp32
 * scratch column; at the end the column is added to C (if accumulating) and
 * stored as fp32 or rounded to bf16 with dt_f32_to_bf16 (so rounding matches
 * the reference bit for bit). Rows and columns past M and N are computed on
 * zero padding and never stored.
 *
 * Invariants: buffers are allocated before the parallel region and reused
 * across calls (the hot loop does not malloc); one call runs at a time
 * (a mutex), since the buffers are shared.
 */
#include "amp_internal.h"

#include <immintrin.h>
#include <omp.h>
#include <pthread.h>
#include <string.h>

#define MR  12  /* rows of C per micro-kernel */
#define NR  32  /* columns of C per micro-kernel (two zmm) */
#define KCP 128 /* k pairs per block of B (16 KiB packed: B and A blocks share L1) */

#define TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")))

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static uint32_t *apack;     /* (mp, KP, MR) words */
static size_t apack_cap;    /* in words */
static uint32_t **bpack;    /* per thread: (KCP, NR) words */
static float **cscratch;    /* per thread: (mp*MR, NR) floats */
static size_t cscratch_cap; /* in floats, the same for every thread */
static int nthreads_cap;

static inline dt_bf16 a_at(const dt__gemm_args *g, int i, int k) {
    return dt__gemm_trans_a(g->op) ? g->A[(size_t)k * g->M + i] : g->A[(size_t)i * g->K + k];
}

static void pack_a_panel(const dt__gemm_args *g, int panel, int KP, uint32_t *dst) {
    int K = g->K;
    for (int r = 0; r < MR; r++) {
        int i = panel * MR + r;
        if (i >= g->M) {
            for (int p = 0; p < KP; p++)
                dst[(size_t)p * MR + r] = 0;
        } else if (!dt__gemm_trans_a(g->op)) { /* row i of A holds the pairs in order */
            const dt_bf16 *row = g->A + (size_t)i * K;
            for (int p = 0; p < KP; p++) {
                uint32_t hi = 2 * p + 1 < K ? row[2 * p + 1] : 0;
                dst[(size_t)p * MR + r] = row[2 * p] | hi << 16;
            }
        } else { /* A is (K,M): walk down column i */
            for (int p = 0; p < KP; p++) {
                uint32_t hi = 2 * p + 1 < K ? a_at(g, i, 2 * p + 1) : 0;
                dst[(size_t)p * MR + r] = a_at(g, i, 2 * p) | hi << 16;
            }
        }
    }
}

/* The packing of B is on the critical path (K x N words per call, against
 * M x N x K multiply-adds on units that do 512 or 1024 of them per cycle),
 * so both layouts are vectorised:
 *   B (N,K), op NT: word (B[j][2p], B[j][2p+1]) is 32 bits at a fixed place
 *     in row j; one gather collects it from 16 rows (a 32-bit transpose).
 *   B (K,N), op NN: rows 2p and 2p+1 are interleaved 16 bits at a time with
 *     unpacklo/hi, whose 128-bit-lane order one permute per half repairs.
 * Columns past N and k past K read nothing and are written as zero. */
TARGET void dt__gemm_pack_b32(const dt__gemm_args *g, int jp, int p0, int kcp, uint32_t *dst) {
    int K = g->K, N = g->N, j0 = jp * NR;
    int nc = N - j0 < NR ? N - j0 : NR;
    __mmask16 m0 = (__mmask16)(nc >= 16 ? 0xffff : (1u << nc) - 1u);
    __mmask16 m1 = (__mmask16)(nc <= 16 ? 0 : nc >= 32 ? 0xffff : (1u << (nc - 16)) - 1u);
    if (dt__gemm_trans_b(g->op)) {
        const __m512i lane =
            _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
        /* byte offsets of row j0 + c, relative to row j0 (fits in int32 for K*N < 2^30) */
        __m512i off0 = _mm512_mullo_epi32(lane, _mm512_set1_epi32(2 * K));
        __m512i off1 = _mm512_add_epi32(off0, _mm512_set1_epi32(32 * K));
        const dt_bf16 *base = g->B + (size_t)j0 * K;
        int p = 0, full = (K / 2) - p0 < kcp ? (K / 2) - p0 : kcp; /* pairs inside K */
        if (full < 0)
            full = 0;
        if ((size_t)N * (size_t)K >= ((size_t)1 << 30)) /* offsets would overflow: scalar */
            full = 0;
        for (; p < full; p++) {
            const void *at = base + 2 * (p0 + p);
            __m512i w0 = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), m0, off0, at, 1);
            __m512i w1 = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), m1, off1, at, 1);
            _mm512_storeu_si512(dst + p * NR, w0);
            _mm512_storeu_si512(dst + p * NR + 16, w1);
        }
        for (; p < kcp; p++) { /* the odd last k, padding past K, or huge B */
            int k = 2 * (p0 + p);
            for (int c = 0; c < NR; c++) {
                const dt_bf16 *row = g->B + (size_t)(j0 + c) * K;
                uint32_t lo = c < nc && k < K ? row[k] : 0;
                uint32_t hi = c < nc && k + 1 < K ? row[k + 1] : 0;
                dst[p * NR + c] = lo | hi << 16;
            }
        }
        return;
    }
    const __m512i idx0 = _mm512_setr_epi64(0, 1, 8, 9, 2, 3, 10, 11);
    const __m512i idx1 = _mm512_setr_epi64(4, 5, 12, 13, 6, 7, 14, 15);
    __mmask32 mrow = (__mmask32)(nc >= 32 ? 0xffffffffu : (1u << nc) - 1u);
    for (int p = 0; p < kcp; p++) {
        int k = 2 * (p0 + p);
        __m512i r0 = _mm512_setzero_si512(), r1 = _mm512_setzero_si512();
        if (k < K)
            r0 = _mm512_maskz_loadu_epi16(mrow, g->B + (size_t)k * N + j0);
        if (k + 1 < K)
            r1 = _mm512_maskz_loadu_epi16(mrow, g->B + (size_t)(k + 1) * N + j0);
        __m512i lo = _mm512_unpacklo_epi16(r0, r1), hi = _mm512_unpackhi_epi16(r0, r1);
        _mm512_storeu_si512(dst + p * NR, _mm512_permutex2var_epi64(lo, idx0, hi));
        _mm512_storeu_si512(dst + p * NR + 16, _mm512_permutex2var_epi64(lo, idx1, hi));
    }
}

/* cs (MR, NR) += Ap (kcp, MR) x Bp (kcp, NR), or = when first. */
TARGET static void micro_kernel(const uint32_t *ap, const uint32_t *bp, int kcp, float *cs,
                                bool first) {
    __m512 c0[MR], c1[MR];
    for (int r = 0; r < MR; r++) {
        c0[r] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(cs + r * NR);
        c1[r] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(cs + r * NR + 16);
    }
    for (int p = 0; p < kcp; p++) {
        __m512bh b0 = (__m512bh)_mm512_loadu_si512(bp + p * NR);
        __m512bh b1 = (__m512bh)_mm512_loadu_si512(bp + p * NR + 16);
        for (int r = 0; r < MR; r++) {
            __m512bh a = (__m512bh)_mm512_set1_epi32((int)ap[p * MR + r]);
            c0[r] = _mm512_dpbf16_ps(c0[r], a, b0);
            c1[r] = _mm512_dpbf16_ps(c1[r], a, b1);
        }
    }
    for (int r = 0; r < MR; r++) {
        _mm512_storeu_ps(cs + r * NR, c0[r]);
        _mm512_storeu_ps(cs + r * NR + 16, c1[r]);
    }
}

/* C[:, jp*NR .. +nc) (+)= cs, in C's type. */
TARGET static void store_panel(const dt__gemm_args *g, int jp, const float *cs) {
    int j0 = jp * NR, nc = g->N - j0 < NR ? g->N - j0 : NR;
    __mmask16 m0 = (__mmask16)(nc >= 16 ? 0xffff : (1u << nc) - 1u);
    __mmask16 m1 = (__mmask16)(nc <= 16 ? 0 : nc >= 32 ? 0xffff : (1u << (nc - 16)) - 1u);
    for (int i = 0; i < g->M; i++) {
        __m512 v0 = _mm512_loadu_ps(cs + (size_t)i * NR);
        __m512 v1 = _mm512_loadu_ps(cs + (size_t)i * NR + 16);
        if (g->out == DT_GEMM_OUT_F32) {
            float *c = (float *)g->C + (size_t)i * g->N + j0;
            if (g->accumulate) {
                v0 = _mm512_add_ps(v0, _mm512_maskz_loadu_ps(m0, c));
                v1 = _mm512_add_ps(v1, _mm512_maskz_loadu_ps(m1, c + 16));
            }
            _mm512_mask_storeu_ps(c, m0, v0);
            _mm512_mask_storeu_ps(c + 16, m1, v1);
        } else {
            dt_bf16 *c = (dt_bf16 *)g->C + (size_t)i * g->N + j0;
            if (g->accumulate) {
                __m512i o0 = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m0, c));
                __m512i o1 = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m1, c + 16));
                v0 = _mm512_add_ps(v0, _mm512_castsi512_ps(_mm512_slli_epi32(o0, 16)));
                v1 = _mm512_add_ps(v1, _mm512_castsi512_ps(_mm512_slli_epi32(o1, 16)));
            }
            float tmp[NR];
            _mm512_storeu_ps(tmp, v0);
            _mm512_storeu_ps(tmp + 16, v1);
            dt_f32_to_bf16(c, tmp, (size_t)nc);
        }
    }
}

static void free_buffers(void) {
    for (int t = 0; t < nthreads_cap; t++) {
        dt_free(bpack[t]);
        dt_free(cscratch[t]);
    }
    dt_free(bpack);
    dt_free(cscratch);
    dt_free(apack);
    bpack = NULL, cscratch = NULL, apack = NULL;
    nthreads_cap = 0, cscratch_cap = 0, apack_cap = 0;
}

/* Grow the buffers to fit; called with `lock` held. */
static dt_status reserve(int nthreads, size_t a_words, size_t c_floats) {
    if (a_words <= apack_cap && nthreads <= nthreads_cap && c_floats <= cscratch_cap)
        return DT_OK;
    if (a_words < apack_cap)
        a_words = apack_cap;
    if (c_floats < cscratch_cap)
        c_floats = cscratch_cap;
    if (nthreads < nthreads_cap)
        nthreads = nthreads_cap;
    free_buffers();
    apack = dt_alloc(a_words * sizeof *apack);
    bpack = dt_calloc((size_t)nthreads, sizeof *bpack);
    cscratch = dt_calloc((size_t)nthreads, sizeof *cscratch);
    if (!apack || !bpack || !cscratch)
        goto nomem;
    nthreads_cap = nthreads;
    for (int t = 0; t < nthreads; t++) {
        bpack[t] = dt_alloc((size_t)KCP * NR * sizeof(uint32_t));
        cscratch[t] = dt_alloc(c_floats * sizeof(float));
        if (!bpack[t] || !cscratch[t])
            goto nomem;
    }
    apack_cap = a_words, cscratch_cap = c_floats;
    return DT_OK;
nomem:
    free_buffers();
    return dt_error_set(DT_ERR_NOMEM, "avx512 gemm: packing buffers (%zu + %d x %zu bytes)",
                        a_words * 4, nthreads, c_floats * 4);
}

dt_status dt__gemm_avx512(const dt__gemm_args *g) {
    int KP = (g->K + 1) / 2, mp = (g->M + MR - 1) / MR, np = (g->N + NR - 1) / NR;
    int nthreads = omp_get_max_threads();
    if (nthreads > np)
        nthreads = np;
    pthread_mutex_lock(&lock);
    dt_status st = reserve(nthreads, (size_t)mp * KP * MR, (size_t)mp * MR * NR);
    if (st != DT_OK) {
        pthread_mutex_unlock(&lock);
        return st;
    }
#pragma omp parallel num_threads(nthreads)
    {
        uint32_t *bp = bpack[omp_get_thread_num()];
        float *cs = cscratch[omp_get_thread_num()];
#pragma omp for schedule(static)
        for (int panel = 0; panel < mp; panel++)
            pack_a_panel(g, panel, KP, apack + (size_t)panel * KP * MR);
#pragma omp for schedule(static)
        for (int jp = 0; jp < np; jp++) {
            for (int p0 = 0; p0 < KP; p0 += KCP) {
                int kcp = KP - p0 < KCP ? KP - p0 : KCP;
                dt__gemm_pack_b32(g, jp, p0, kcp, bp);
                for (int panel = 0; panel < mp; panel++)
                    micro_kernel(apack + ((size_t)panel * KP + p0) * MR, bp, kcp,
                                 cs + (size_t)panel * MR * NR, p0 == 0);
            }
            store_panel(g, jp, cs);
        }
    }
    pthread_mutex_unlock(&lock);
    return DT_OK;
}

void dt__gemm_avx512_release(void) {
    pthread_mutex_lock(&lock);
    free_buffers();
    pthread_mutex_unlock(&lock);
}
