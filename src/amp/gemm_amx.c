/*
 * gemm_amx.c — our bf16 multiply on AMX tiles (tdpbf16ps), fp32 sums.
 *
 * An AMX tile is 16 rows of up to 64 bytes. tdpbf16ps C, A, B computes, for
 * a 16x16 fp32 tile C, a 16x32 bf16 tile A and a 16x(16 pairs) tile B laid
 * out in k pairs (the same layout as vdpbf16ps's B operand):
 *
 *     C[m][n] += sum_{p<16} A[m][2p] B[2p][n] + A[m][2p+1] B[2p+1][n]
 *
 * This kernel holds a 32x32 block of C in four tiles (tmm0..3), loads two A
 * tiles (tmm4,5: rows 0-15 and 16-31) and two B tiles (tmm6,7: columns 0-15
 * and 16-31) per 32 values of k, and issues four tdpbf16ps: 64 K
 * multiply-adds per load of 4 KiB.
 *
 *   A is packed once per call as [32-row panel][32-k block][32 rows][32 k];
 *   each thread takes 32-column panels of C and walks K in blocks of 256:
 *   it packs the block of its B panel with dt__gemm_pack_b32 ([k pair][32
 *   columns], so a B tile is 16 rows of 64 bytes at a stride of 128; 16 KiB,
 *   in L1 with the A block) and runs every A panel against it, keeping the
 *   panel's C in an fp32 scratch column between blocks. With a single k
 *   block each C block goes straight from the tiles to C.
 *
 *   When all of B packed fits in 2 MiB (L2) (weight gradients: K = B*T, N = C)
 *   the order flips: B is packed once and shared, threads take A panels and
 *   run each against every B panel with C in tiles over all of K, so the
 *   large A is read once instead of once per column panel.
 *
 * Each thread loads the tile configuration before its first tile
 * instruction and releases it at the end (the OS permission was requested
 * by cpu.c's detection). Invariants as in gemm_avx512.c: buffers reused
 * across calls, one call at a time, padding is zero and never stored.
 */
#include "amp_internal.h"

#include <immintrin.h>
#include <omp.h>
#include <pthread.h>
#include <string.h>

#define TM             32 /* rows of C per block: two A tiles */
#define TN             32 /* columns of C per block: two B tiles */
#define TK             32 /* k values per tile step: 16 pairs, 64 bytes of bf16 per A row */
#define KBC            8  /* tile steps per k block: 256 k, 16 KiB of A and 16 KiB of B, in L1 */
/* Bytes of packed B kept in L2 (2 MiB per core on Sapphire Rapids). */
#define B_RESIDENT_MAX ((size_t)1 << 21)

#define TARGET                                                                                     \
    __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,amx-tile,amx-bf16")))

/* The 64-byte tile configuration (palette 1) read by ldtilecfg. */
typedef struct tile_config {
    uint8_t palette_id;
    uint8_t start_row;
    uint8_t reserved[14];
    uint16_t colsb[16]; /* bytes per row of each tile */
    uint8_t rows[16];   /* rows of each tile */
} tile_config;
_Static_assert(sizeof(tile_config) == 64, "ldtilecfg reads 64 bytes");

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static uint16_t *apack;   /* (mp, kb, TM, TK) bf16, then (B-resident) all of B packed */
static size_t apack_cap;  /* in elements */
static uint32_t **bpack;  /* per thread: (KBC*16 pairs, TN) words */
static size_t bpack_cap;  /* in words */
static float **cblock;    /* per thread: (mp*TM, TN) floats, C of one column panel */
static size_t cblock_cap; /* in floats */
static int nthreads_cap;

/* A is (K,M), so a tile row (32 k of one i) is a column of A. In two
 * vector steps: dt__gemm_pack_b32 reads 32 columns as k pairs,
 * w[q][r] = (A[2q][i0+r], A[2q+1][i0+r]) (rows 2q, 2q+1 read contiguously),
 * then one gather per tile row collects w[0..16)[r], a 32-bit transpose. */
TARGET static void pack_a_panel_trans(const dt__gemm_args *g, int panel, int KB, uint16_t *dst) {
    dt__gemm_args view = *g; /* A read as the (K, N=M) operand of an NN multiply */
    view.op = DT_GEMM_NN;
    view.B = g->A;
    view.N = g->M;
    uint32_t w[16 * 32];
    const __m512i rows =
        _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                           _mm512_set1_epi32(32));
    _Static_assert(TM == 32 && TK == 32, "one 32-column pack per 32-row A panel");
    for (int kb = 0; kb < KB; kb++) {
        dt__gemm_pack_b32(&view, panel, kb * 16, 16, w);
        uint32_t *tile = (uint32_t *)(dst + (size_t)kb * TM * TK); /* (32 rows, 16 words) */
        for (int r = 0; r < TM; r++)
            _mm512_storeu_si512(tile + r * 16, _mm512_i32gather_epi32(rows, w + r, 4));
    }
}

static void pack_a_panel(const dt__gemm_args *g, int panel, int KB, uint16_t *dst) {
    if (dt__gemm_trans_a(g->op)) {
        pack_a_panel_trans(g, panel, KB, dst);
        return;
    }
    /* Rows of A are rows of the tiles: copy, and zero the padding. */
    int K = g->K, M = g->M, i0 = panel * TM;
    int nr = M - i0 < TM ? M - i0 : TM;
    memset(dst, 0, (size_t)KB * TM * TK * sizeof *dst);
    for (int kb = 0; kb < KB; kb++) {
        int nk = K - kb * TK < TK ? K - kb * TK : TK;
        for (int r = 0; r < nr; r++)
            memcpy(dst + ((size_t)kb * TM + r) * TK, g->A + (size_t)(i0 + r) * K + kb * TK,
                   (size_t)nk * sizeof *dst);
    }
}

/* C[i0.., j0..) (+)= the TM x TN block in cb, clipped to M and N. */
static void store_block(const dt__gemm_args *g, int i0, int j0, const float *cb) {
    int nr = g->M - i0 < TM ? g->M - i0 : TM, nc = g->N - j0 < TN ? g->N - j0 : TN;
    for (int r = 0; r < nr; r++) {
        const float *src = cb + r * TN;
        size_t o = (size_t)(i0 + r) * g->N + j0;
        if (g->out == DT_GEMM_OUT_F32) {
            float *c = (float *)g->C + o;
            if (g->accumulate)
                for (int j = 0; j < nc; j++)
                    c[j] += src[j];
            else
                memcpy(c, src, (size_t)nc * sizeof *c);
        } else {
            dt_bf16 *c = (dt_bf16 *)g->C + o;
            float tmp[TN];
            for (int j = 0; j < nc; j++)
                tmp[j] = g->accumulate ? dt_f32_from_bf16(c[j]) + src[j] : src[j];
            dt_f32_to_bf16(c, tmp, (size_t)nc);
        }
    }
}

TARGET static void tiles_configure(void) {
    tile_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette_id = 1;
    for (int t = 0; t < 8; t++) {
        cfg.rows[t] = 16;
        cfg.colsb[t] = 64;
    }
    /* Not _tile_loadconfig: GCC 12 declares its operand as 8 bytes of memory,
     * so the stores filling the other 56 may be dropped as dead (seen in the
     * -march=x86-64-v2 build: ldtilecfg then faults on a garbage config). */
    __asm__ volatile("ldtilecfg %0" ::"m"(cfg));
}

TARGET static void tiles_release(void) { _tile_release(); }

/* cb (TM, TN) (+)= Ap (nkb blocks of TM x TK) x Bp (nkb*16 pairs, TN); = when first. */
TARGET static void block_kernel(const uint16_t *ap, const uint32_t *bp, int nkb, float *cb,
                                bool first) {
    if (first) {
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
    } else {
        _tile_loadd(0, cb, TN * 4);
        _tile_loadd(1, cb + 16, TN * 4);
        _tile_loadd(2, cb + 16 * TN, TN * 4);
        _tile_loadd(3, cb + 16 * TN + 16, TN * 4);
    }
    for (int kb = 0; kb < nkb; kb++) {
        const uint16_t *a = ap + (size_t)kb * TM * TK;
        const uint32_t *b = bp + (size_t)kb * 16 * TN;
        _tile_loadd(4, a, TK * 2);           /* rows 0-15 */
        _tile_loadd(5, a + 16 * TK, TK * 2); /* rows 16-31 */
        _tile_loadd(6, b, TN * 4);           /* columns 0-15 */
        _tile_loadd(7, b + 16, TN * 4);      /* columns 16-31 */
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
    }
    _tile_stored(0, cb, TN * 4);
    _tile_stored(1, cb + 16, TN * 4);
    _tile_stored(2, cb + 16 * TN, TN * 4);
    _tile_stored(3, cb + 16 * TN + 16, TN * 4);
}

static void free_buffers(void) {
    for (int t = 0; t < nthreads_cap; t++) {
        dt_free(bpack[t]);
        dt_free(cblock[t]);
    }
    dt_free(bpack);
    dt_free(cblock);
    dt_free(apack);
    bpack = NULL, cblock = NULL, apack = NULL;
    nthreads_cap = 0, bpack_cap = 0, apack_cap = 0, cblock_cap = 0;
}

/* Grow the buffers to fit; called with `lock` held. */
static dt_status reserve(int nthreads, size_t a_elems, size_t b_words, size_t c_floats) {
    if (a_elems <= apack_cap && nthreads <= nthreads_cap && b_words <= bpack_cap &&
        c_floats <= cblock_cap)
        return DT_OK;
    if (a_elems < apack_cap)
        a_elems = apack_cap;
    if (b_words < bpack_cap)
        b_words = bpack_cap;
    if (c_floats < cblock_cap)
        c_floats = cblock_cap;
    if (nthreads < nthreads_cap)
        nthreads = nthreads_cap;
    free_buffers();
    apack = dt_alloc(a_elems * sizeof *apack);
    bpack = dt_calloc((size_t)nthreads, sizeof *bpack);
    cblock = dt_calloc((size_t)nthreads, sizeof *cblock);
    if (!apack || !bpack || !cblock)
        goto nomem;
    nthreads_cap = nthreads;
    for (int t = 0; t < nthreads; t++) {
        bpack[t] = dt_alloc(b_words * sizeof(uint32_t));
        cblock[t] = dt_alloc(c_floats * sizeof(float));
        if (!bpack[t] || !cblock[t])
            goto nomem;
    }
    apack_cap = a_elems, bpack_cap = b_words, cblock_cap = c_floats;
    return DT_OK;
nomem:
    free_buffers();
    return dt_error_set(DT_ERR_NOMEM, "amx gemm: packing buffers (%zu + %d x %zu bytes)",
                        a_elems * 2, nthreads, b_words * 4);
}

dt_status dt__gemm_amx(const dt__gemm_args *g) {
    int KB = (g->K + TK - 1) / TK, mp = (g->M + TM - 1) / TM, np = (g->N + TN - 1) / TN;
    /* B-resident order when all of packed B fits in L2 next to the A panel
     * being worked on (weight gradients: K = B*T rows, N = C): then A, which
     * is the big operand, is streamed once instead of once per column panel. */
    size_t b_all = (size_t)np * KB * 16 * TN; /* words of all of B, packed */
    bool b_resident = b_all * 4 <= B_RESIDENT_MAX && mp >= 2;
    int nthreads = omp_get_max_threads();
    if (nthreads > (b_resident ? mp : np))
        nthreads = b_resident ? mp : np;
    size_t a_elems = (size_t)mp * KB * TM * TK; /* a multiple of 1024: B after it stays aligned */
    int kbc = KB < KBC ? KB : KBC;
    pthread_mutex_lock(&lock);
    dt_status st = reserve(nthreads, a_elems + (b_resident ? 2 * b_all : 0), (size_t)kbc * 16 * TN,
                           (size_t)(b_resident || KB <= KBC ? 1 : mp) * TM * TN);
    if (st != DT_OK) {
        pthread_mutex_unlock(&lock);
        return st;
    }
    uint32_t *b_shared = (uint32_t *)(apack + a_elems);
#pragma omp parallel num_threads(nthreads)
    {
        uint32_t *bp = bpack[omp_get_thread_num()];
        float *cb = cblock[omp_get_thread_num()];
#pragma omp for schedule(static)
        for (int panel = 0; panel < mp; panel++)
            pack_a_panel(g, panel, KB, apack + (size_t)panel * KB * TM * TK);
        if (b_resident) {
#pragma omp for schedule(static)
            for (int jp = 0; jp < np; jp++)
                dt__gemm_pack_b32(g, jp, 0, KB * 16, b_shared + (size_t)jp * KB * 16 * TN);
        }
        tiles_configure();
        if (b_resident) { /* threads take A panels; C stays in tiles over all of K */
#pragma omp for schedule(static)
            for (int panel = 0; panel < mp; panel++) {
                for (int jp = 0; jp < np; jp++) {
                    block_kernel(apack + (size_t)panel * KB * TM * TK,
                                 b_shared + (size_t)jp * KB * 16 * TN, KB, cb, true);
                    store_block(g, panel * TM, jp * TN, cb);
                }
            }
        } else { /* threads take B column panels */
#pragma omp for schedule(static)
            for (int jp = 0; jp < np; jp++) {
                if (KB <= KBC) { /* one k block: each C block goes straight to C */
                    dt__gemm_pack_b32(g, jp, 0, KB * 16, bp);
                    for (int panel = 0; panel < mp; panel++) {
                        block_kernel(apack + (size_t)panel * KB * TM * TK, bp, KB, cb, true);
                        store_block(g, panel * TM, jp * TN, cb);
                    }
                    continue;
                }
                for (int kb0 = 0; kb0 < KB; kb0 += KBC) {
                    int nkb = KB - kb0 < KBC ? KB - kb0 : KBC;
                    dt__gemm_pack_b32(g, jp, kb0 * 16, nkb * 16, bp);
                    for (int panel = 0; panel < mp; panel++)
                        block_kernel(apack + ((size_t)panel * KB + kb0) * TM * TK, bp, nkb,
                                     cb + (size_t)panel * TM * TN, kb0 == 0);
                }
                for (int panel = 0; panel < mp; panel++)
                    store_block(g, panel * TM, jp * TN, cb + (size_t)panel * TM * TN);
            }
        }
        tiles_release();
    }
    pthread_mutex_unlock(&lock);
    return DT_OK;
}

void dt__gemm_amx_release(void) {
    pthread_mutex_lock(&lock);
    free_buffers();
    pthread_mutex_unlock(&lock);
}
