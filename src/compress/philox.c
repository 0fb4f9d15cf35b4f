/*
 * philox.c — batched evaluation of core's Philox4x32-10 stream.
 *
 * QSGD draws one 32-bit number per value; through dt_rng_u32 (one block of
 * 4 outputs per call, with a branch per output) that costs more than the
 * quantisation itself. This file computes the same outputs, 16 blocks (64
 * numbers) per round of the loop in structure-of-arrays form, which the
 * AVX-512F path does with 32x32->64-bit vector multiplies (vpmuludq) on
 * the even and odd lanes; the portable loop is the fallback. The
 * counter layout is dt_rng's: (block low, block high, stream low, stream
 * high) keyed by the seed; the unit test checks the two agree output for
 * output, so "randomness from dt_rng" stays literally true.
 */
#include "internal.h"

#include <immintrin.h>

#define PHILOX_M0 0xD2511F53u
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u
#define PHILOX_W1 0xBB67AE85u
#define LANES     16

static void philox_lanes(uint64_t first_block, uint64_t stream, uint32_t k0, uint32_t k1,
                         uint32_t out[4 * LANES]) {
    uint32_t c0[LANES], c1[LANES], c2[LANES], c3[LANES];
    for (int l = 0; l < LANES; l++) {
        uint64_t b = first_block + (uint64_t)l;
        c0[l] = (uint32_t)b;
        c1[l] = (uint32_t)(b >> 32);
        c2[l] = (uint32_t)stream;
        c3[l] = (uint32_t)(stream >> 32);
    }
    for (int round = 0; round < 10; round++) {
        for (int l = 0; l < LANES; l++) {
            uint64_t p0 = (uint64_t)PHILOX_M0 * c0[l];
            uint64_t p1 = (uint64_t)PHILOX_M1 * c2[l];
            uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1[l] ^ k0;
            uint32_t n2 = (uint32_t)(p0 >> 32) ^ c3[l] ^ k1;
            c1[l] = (uint32_t)p1;
            c3[l] = (uint32_t)p0;
            c0[l] = n0;
            c2[l] = n2;
        }
        k0 += PHILOX_W0;
        k1 += PHILOX_W1;
    }
    for (int l = 0; l < LANES; l++) {
        out[4 * l + 0] = c0[l];
        out[4 * l + 1] = c1[l];
        out[4 * l + 2] = c2[l];
        out[4 * l + 3] = c3[l];
    }
}

/* (hi, lo) of a * m for 16 u32 lanes. */
__attribute__((target("avx512f"))) static inline void mulhilo16(__m512i a, __m512i m, __m512i *hi,
                                                                __m512i *lo) {
    __m512i even = _mm512_mul_epu32(a, m);                       /* lanes 0, 2, ... */
    __m512i odd = _mm512_mul_epu32(_mm512_srli_epi64(a, 32), m); /* lanes 1, 3, ... */
    *lo = _mm512_mask_blend_epi32(0xAAAA, even, _mm512_slli_epi64(odd, 32));
    *hi = _mm512_mask_blend_epi32(0xAAAA, _mm512_srli_epi64(even, 32), odd);
}

__attribute__((target("avx512f"))) static void philox_lanes_avx512(uint64_t first_block,
                                                                   uint64_t stream, uint32_t k0,
                                                                   uint32_t k1,
                                                                   uint32_t out[4 * LANES]) {
    uint32_t lo[LANES], hi[LANES];
    for (int l = 0; l < LANES; l++) {
        uint64_t b = first_block + (uint64_t)l;
        lo[l] = (uint32_t)b;
        hi[l] = (uint32_t)(b >> 32);
    }
    __m512i c0 = _mm512_loadu_si512(lo), c1 = _mm512_loadu_si512(hi);
    __m512i c2 = _mm512_set1_epi32((int)(uint32_t)stream);
    __m512i c3 = _mm512_set1_epi32((int)(uint32_t)(stream >> 32));
    const __m512i m0 = _mm512_set1_epi32((int)PHILOX_M0), m1 = _mm512_set1_epi32((int)PHILOX_M1);
    for (int round = 0; round < 10; round++) {
        __m512i hi0, lo0, hi1, lo1;
        mulhilo16(c0, m0, &hi0, &lo0);
        mulhilo16(c2, m1, &hi1, &lo1);
        c0 = _mm512_xor_si512(_mm512_xor_si512(hi1, c1), _mm512_set1_epi32((int)k0));
        c1 = lo1;
        c2 = _mm512_xor_si512(_mm512_xor_si512(hi0, c3), _mm512_set1_epi32((int)k1));
        c3 = lo0;
        k0 += PHILOX_W0;
        k1 += PHILOX_W1;
    }
    uint32_t v[4][LANES];
    _mm512_storeu_si512(v[0], c0);
    _mm512_storeu_si512(v[1], c1);
    _mm512_storeu_si512(v[2], c2);
    _mm512_storeu_si512(v[3], c3);
    for (int l = 0; l < LANES; l++)
        for (int j = 0; j < 4; j++)
            out[4 * l + j] = v[j][l];
}

void dt__philox_fill(uint64_t seed, uint64_t stream, uint64_t pos, uint32_t *out, size_t count) {
    DT_ASSERT(pos % 4 == 0);
    uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
    uint64_t block = pos / 4;
    void (*lanes)(uint64_t, uint64_t, uint32_t, uint32_t, uint32_t *) =
        dt__have_avx512f() ? philox_lanes_avx512 : philox_lanes;
    size_t i = 0;
    for (; i + 4 * LANES <= count; i += 4 * LANES, block += LANES)
        lanes(block, stream, k0, k1, out + i);
    if (i < count) {
        uint32_t tail[4 * LANES];
        lanes(block, stream, k0, k1, tail);
        memcpy(out + i, tail, (count - i) * sizeof(uint32_t));
    }
}
