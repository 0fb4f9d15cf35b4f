/*
 * rng.c — Philox4x32-10 counter-based generator.
 *
 * The round function and constants are those of Salmon et al. (SC'11); the
 * unit test checks them against the published known-answer vectors. A
 * dt_rng draws blocks (stream, block) -> 4 x u32 and hands them out one by
 * one, so its whole state is (seed, stream, position) and can be saved as
 * three integers.
 */
#include "dtrain/core.h"

#include <math.h>

#define PHILOX_M0 0xD2511F53u
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u
#define PHILOX_W1 0xBB67AE85u

static inline void mulhilo(uint32_t a, uint32_t b, uint32_t *hi, uint32_t *lo) {
    uint64_t p = (uint64_t)a * b;
    *hi = (uint32_t)(p >> 32);
    *lo = (uint32_t)p;
}

void dt_philox4x32_10(const uint32_t counter[4], const uint32_t key[2], uint32_t out[4]) {
    uint32_t c0 = counter[0], c1 = counter[1], c2 = counter[2], c3 = counter[3];
    uint32_t k0 = key[0], k1 = key[1];
    for (int round = 0; round < 10; round++) {
        uint32_t hi0, lo0, hi1, lo1;
        mulhilo(PHILOX_M0, c0, &hi0, &lo0);
        mulhilo(PHILOX_M1, c2, &hi1, &lo1);
        uint32_t n0 = hi1 ^ c1 ^ k0;
        uint32_t n1 = lo1;
        uint32_t n2 = hi0 ^ c3 ^ k1;
        uint32_t n3 = lo0;
        c0 = n0, c1 = n1, c2 = n2, c3 = n3;
        k0 += PHILOX_W0;
        k1 += PHILOX_W1;
    }
    out[0] = c0, out[1] = c1, out[2] = c2, out[3] = c3;
}

uint64_t dt_rng_stream_id(uint32_t rank, uint64_t step, dt_rng_purpose purpose) {
    DT_ASSERT(rank < (1u << 20) && step < (1ull << 36));
    return ((uint64_t)purpose << 56) | ((uint64_t)rank << 36) | step;
}

void dt_rng_init(dt_rng *r, uint64_t seed, uint64_t stream) {
    r->key[0] = (uint32_t)seed;
    r->key[1] = (uint32_t)(seed >> 32);
    r->stream = stream;
    r->block = 0;
    r->used = 4;
}

static void refill(dt_rng *r) {
    uint32_t ctr[4] = {(uint32_t)r->block, (uint32_t)(r->block >> 32), (uint32_t)r->stream,
                       (uint32_t)(r->stream >> 32)};
    dt_philox4x32_10(ctr, r->key, r->buf);
    r->block++;
    r->used = 0;
}

void dt_rng_seek(dt_rng *r, uint64_t n) {
    r->block = n / 4;
    r->used = 4;
    if (n % 4) {
        refill(r);
        r->used = (unsigned)(n % 4);
    }
}

uint64_t dt_rng_tell(const dt_rng *r) { return r->block * 4 - (4 - r->used); }

uint32_t dt_rng_u32(dt_rng *r) {
    if (r->used == 4)
        refill(r);
    return r->buf[r->used++];
}

uint64_t dt_rng_u64(dt_rng *r) {
    uint64_t lo = dt_rng_u32(r);
    return lo | ((uint64_t)dt_rng_u32(r) << 32);
}

float dt_rng_uniform(dt_rng *r) { return (float)(dt_rng_u32(r) >> 8) * 0x1p-24f; }

uint32_t dt_rng_below(dt_rng *r, uint32_t n) {
    DT_ASSERT(n > 0);
    uint64_t m = (uint64_t)dt_rng_u32(r) * n;
    uint32_t low = (uint32_t)m;
    if (low < n) {
        uint32_t threshold = (uint32_t)(-n) % n;
        while (low < threshold) {
            m = (uint64_t)dt_rng_u32(r) * n;
            low = (uint32_t)m;
        }
    }
    return (uint32_t)(m >> 32);
}

float dt_rng_normal(dt_rng *r) {
    /* Box-Muller on (0, 1]: u1 is never 0, so log() is finite. */
    float u1 = ((float)(dt_rng_u32(r) >> 8) + 1.0f) * 0x1p-24f;
    float u2 = dt_rng_uniform(r);
    return sqrtf(-2.0f * logf(u1)) * cosf(6.28318530717958647692f * u2);
}
