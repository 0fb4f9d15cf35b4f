/*
 * gemm_tn.c — the weight-gradient product C (M,N) += A^T B with A (K,M) and
 * B (K,N), all row-major, on the calling thread, in AVX-512.
 *
 * In a linear layer's backward this is dW (OC,IC) += dY^T X summed over the
 * K = B*T tokens. Written as a sum of outer products it needs no transpose:
 * for each token t, the row dY[t][oc0..oc0+6) (contiguous) times the row
 * X[t][ic0..ic0+64) (contiguous) adds into a 6 x 64 tile of C, held in 24
 * zmm accumulators (6 broadcasts and 4 vector loads feed 24 FMAs per t).
 *
 * Blocking: rows of C in blocks of MC, tokens in chunks of KC. Per (block,
 * chunk), A's rows are packed into micro-panels [KC][6] and B's columns
 * into one panel [KC][64] at a time, which every micro-panel of A then
 * passes over; the 6 x 64 sums are added into C once per chunk. Edges are
 * zero-padded in the packs (so the kernel always runs a full 6 x 64 tile)
 * and masked or skipped when adding into C.
 *
 * Invariants: each element of C receives, per token chunk in increasing
 * order, one sum over that chunk's tokens in increasing order; the order
 * depends only on K and KC, so the result is fixed for a fixed call
 * (deterministic, independent of the thread that runs it and of where the
 * caller splits M or N). Overwriting (dt__sgemm_tn with accumulate false)
 * adds the first chunk's sums to 0 instead of to C, so it writes the bits
 * zeroing C and accumulating would, without reading or clearing C first.
 * Pack buffers are per thread, grown on first use and then kept; when
 * allocation fails or AVX-512 is not active (dt_isa() below DT_ISA_AVX512)
 * dt__sgemm_tn returns false and the caller uses its fallback.
 */
#include "tensor_internal.h"

#include <stdint.h>
#include <stdlib.h>

#if defined(__x86_64__) && defined(__GNUC__)
#define HAVE_TN_AVX512 1
#include <immintrin.h>
#define AVX512_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma")))
#else
#define HAVE_TN_AVX512 0
#endif

/* Tile and block sizes, chosen by measurement on shakespeare-char's four
 * shapes at K = 2048 (Sapphire Rapids core, 1 thread; see docs/engine.md):
 * 6 x 64 with KC 256 and MC 384 was the fastest of 6x64, 8x48, 12x32,
 * 14x32 and 4x96 tiles with KC 192..512 and MC 256..1536. The B panel
 * (KC x 64 floats, 64 KiB) then lives in L2 next to A's block (MC x KC,
 * 384 KiB) and C's block (MC x N); a KC of 128 that keeps the B panel in
 * L1 was slower, as it reads and writes C twice as often. Overridable with
 * -D for such experiments. */
#ifndef MR
#define MR 6 /* rows of C per tile: broadcasts of A */
#endif
#ifndef NR
#define NR 64 /* columns of C per tile: NR / 16 zmm of B */
#endif
#ifndef KC
#define KC 256 /* tokens per chunk */
#endif
#ifndef MC
#define MC 384 /* rows of C per block (a multiple of MR) */
#endif
_Static_assert(MC % MR == 0 && NR % 16 == 0 && MR <= 16, "tile sizes");

size_t dt__gemm_tn_workspace_bytes(void) {
    return HAVE_TN_AVX512 ? sizeof(float) * ((size_t)MC * KC + (size_t)KC * NR) : 0;
}

#if HAVE_TN_AVX512

/* Per-thread pack buffers (MC x KC and KC x NR floats, 448 KiB), allocated
 * on a thread's first call and then kept: one pair per pool thread. */
static _Thread_local float *pack_a, *pack_b;

static bool ensure_packs(void) {
    if (!pack_a)
        pack_a = aligned_alloc(64, sizeof(float) * MC * KC);
    if (!pack_b)
        pack_b = aligned_alloc(64, sizeof(float) * KC * NR);
    return pack_a && pack_b;
}

/* ap[p][t][r] = A[k0 + t][MR p + r] for the rows of this call, 0 past M: one
 * masked load and store per (t, p). With colsum, also colsum[i] += the sum
 * of this chunk's column i of A, in token order (the bias gradient comes
 * free with the pack, which reads every element of A exactly once). */
AVX512_TARGET static void pack_a_chunk(float *ap, float *colsum, bool first, const float *A,
                                       int lda, int M, int kc) {
    int panels = (M + MR - 1) / MR;
    for (int p = 0; p < panels; p++) {
        int rows = M - p * MR < MR ? M - p * MR : MR;
        __mmask16 m = (__mmask16)((1u << rows) - 1);
        float *dst = ap + (size_t)p * kc * MR;
        const float *src = A + (size_t)p * MR;
        __m512 sum = _mm512_setzero_ps();
        for (int t = 0; t < kc; t++) {
            __m512 v = _mm512_maskz_loadu_ps(m, src + (size_t)t * lda);
            sum = _mm512_add_ps(sum, v);
            _mm512_mask_storeu_ps(dst + t * MR, (__mmask16)((1u << MR) - 1), v);
        }
        if (colsum) {
            float *c = colsum + p * MR;
            __m512 old = first ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(m, c);
            _mm512_mask_storeu_ps(c, m, _mm512_add_ps(old, sum));
        }
    }
}

static inline __mmask16 AVX512_TARGET col_mask(int valid, int j) {
    int v = valid - 16 * j;
    return v >= 16 ? (__mmask16)0xFFFF : v <= 0 ? (__mmask16)0 : (__mmask16)((1u << v) - 1);
}

/* bp[t][j] = B[k0 + t][n0 + j] for j < nv, 0 for nv <= j < NR. */
AVX512_TARGET static void pack_b_panel(float *bp, const float *B, int ldb, int nv, int kc) {
    if (nv == NR) {
        for (int t = 0; t < kc; t++) {
            const float *s = B + (size_t)t * ldb;
            float *d = bp + (size_t)t * NR;
#pragma GCC unroll 16
            for (int j = 0; j < NR; j += 16)
                _mm512_store_ps(d + j, _mm512_loadu_ps(s + j));
        }
        return;
    }
    for (int t = 0; t < kc; t++) {
        const float *s = B + (size_t)t * ldb;
        float *d = bp + (size_t)t * NR;
#pragma GCC unroll 16
        for (int j = 0; j < NR; j += 16)
            _mm512_store_ps(d + j, _mm512_maskz_loadu_ps(col_mask(nv, j / 16), s + j));
    }
}

/* The MR x NR tile: C[r][0..nv) += sum_t ap[t][r] bp[t][.] for r < rows
 * (with `first`: C[r][.] = 0 + the sums, C not read).
 * Written with constant-size arrays that the compiler fully unrolls into
 * MR * NV accumulator registers (checked in the disassembly: no spills). */
#define NV (NR / 16)
AVX512_TARGET static void kernel_tile(int kc, const float *restrict ap, const float *restrict bp,
                                      float *C, int ldc, int rows, int nv, bool first) {
    for (int r = 0; !first && r < rows; r++)
        for (int j = 0; j < nv; j += 16)
            _mm_prefetch((const char *)(C + (size_t)r * ldc + j), _MM_HINT_T0);
    __m512 acc[MR][NV];
#pragma GCC unroll 16
    for (int r = 0; r < MR; r++)
#pragma GCC unroll 16
        for (int j = 0; j < NV; j++)
            acc[r][j] = _mm512_setzero_ps();
    for (int t = 0; t < kc; t++) {
        __m512 b[NV];
#pragma GCC unroll 16
        for (int j = 0; j < NV; j++)
            b[j] = _mm512_load_ps(bp + 16 * j);
#pragma GCC unroll 16
        for (int r = 0; r < MR; r++) {
            __m512 a = _mm512_set1_ps(ap[r]);
#pragma GCC unroll 16
            for (int j = 0; j < NV; j++)
                acc[r][j] = _mm512_fmadd_ps(a, b[j], acc[r][j]);
        }
        ap += MR;
        bp += NR;
    }
    const __m512 zero = _mm512_setzero_ps();
    if (nv == NR) {
#pragma GCC unroll 16
        for (int r = 0; r < MR; r++) {
            if (r >= rows)
                break;
            float *c = C + (size_t)r * ldc;
#pragma GCC unroll 16
            for (int j = 0; j < NV; j++)
                _mm512_storeu_ps(
                    c + 16 * j,
                    _mm512_add_ps(first ? zero : _mm512_loadu_ps(c + 16 * j), acc[r][j]));
        }
        return;
    }
    __mmask16 m[NV];
#pragma GCC unroll 16
    for (int j = 0; j < NV; j++)
        m[j] = col_mask(nv, j);
#pragma GCC unroll 16
    for (int r = 0; r < MR; r++) {
        if (r >= rows)
            break;
        float *c = C + (size_t)r * ldc;
#pragma GCC unroll 16
        for (int j = 0; j < NV; j++)
            _mm512_mask_storeu_ps(
                c + 16 * j, m[j],
                _mm512_add_ps(first ? zero : _mm512_maskz_loadu_ps(m[j], c + 16 * j), acc[r][j]));
    }
}

static void sgemm_tn_avx512(int M, int N, int K, const float *A, int lda, const float *B, int ldb,
                            float *C, int ldc, float *colsum, bool accumulate) {
    for (int m0 = 0; m0 < M; m0 += MC) {
        int mc = M - m0 < MC ? M - m0 : MC, panels = (mc + MR - 1) / MR;
        for (int k0 = 0; k0 < K; k0 += KC) {
            int kc = K - k0 < KC ? K - k0 : KC;
            bool first = !accumulate && k0 == 0;
            pack_a_chunk(pack_a, colsum ? colsum + m0 : NULL, first, A + (size_t)k0 * lda + m0, lda,
                         mc, kc);
            for (int n0 = 0; n0 < N; n0 += NR) {
                int nv = N - n0 < NR ? N - n0 : NR;
                pack_b_panel(pack_b, B + (size_t)k0 * ldb + n0, ldb, nv, kc);
                for (int p = 0; p < panels; p++) {
                    int rows = mc - p * MR < MR ? mc - p * MR : MR;
                    kernel_tile(kc, pack_a + (size_t)p * kc * MR, pack_b,
                                C + (size_t)(m0 + p * MR) * ldc + n0, ldc, rows, nv, first);
                }
            }
        }
    }
}

#endif /* HAVE_TN_AVX512 */

bool dt__sgemm_tn(int M, int N, int K, const float *A, int lda, const float *B, int ldb, float *C,
                  int ldc, float *colsum, bool accumulate) {
#if HAVE_TN_AVX512
    if (dt_isa() < DT_ISA_AVX512)
        return false;
    if (M <= 0)
        return true;
    if (K <= 0) { /* an empty sum: overwriting still writes its zeros */
        for (int i = 0; !accumulate && i < M; i++) {
            for (int j = 0; j < N; j++)
                C[(size_t)i * ldc + j] = 0.0f;
            if (colsum)
                colsum[i] = 0.0f;
        }
        return true;
    }
    if (!ensure_packs())
        return false;
    sgemm_tn_avx512(M, N, K, A, lda, B, ldb, C, ldc, colsum, accumulate);
    return true;
#else
    (void)M, (void)N, (void)K, (void)A, (void)lda, (void)B, (void)ldb, (void)C, (void)ldc,
        (void)colsum, (void)accumulate;
    return false;
#endif
}
