/*
 * sparse.c — top-k and random-k sparsification.
 *
 * top-k payload: u32 idx[k] (strictly increasing, < count), then f32
 * val[k]: 8 bytes per value sent. Decoding checks every index, and that
 * they increase, before writing anything; SET mode zero-fills the output
 * first.
 *
 * top-k keeps the k values of largest magnitude. Selection is a radix
 * select on the magnitude bits (|x| as a u32 orders like the float):
 * one histogram pass over the 11 high bits finds the bin holding the k-th
 * largest, the values in that bin are compacted into scratch, and two more
 * histograms over 10 bits each pin the exact threshold key. A final pass
 * emits every value above the threshold and, of those equal to it, the
 * lowest indices first. Three passes over the data, no sort, O(n) in the
 * worst case (quickselect is O(n) only on average). With AVX-512F the
 * compaction and the final pass use compress-stores; the scalar code is
 * the fallback and gives the same indices.
 *
 * random-k keeps one uniformly drawn index in each of k equal strata of
 * [0, n), so every index is kept with probability ~k/n and k draws suffice.
 * The indices come from rank 0's stream for (seed, step, bucket) on every
 * rank: all ranks keep the same indices, their encodings add up value by
 * value (linear), and the indices are not sent at all: the buffer carries
 * (seed, step, bucket) and the receiver regenerates them. 4 bytes per value.
 *
 * Both keep values unscaled and are biased; error feedback is on by default.
 */
#include "internal.h"

#include <immintrin.h>

static bool topk_bytes(const dt_codec_header *h, size_t *out) {
    return dt_mul_size((size_t)h->k, 8, out);
}

static dt_status topk_validate(const dt_codec_header *h, const uint8_t *p) {
    size_t k = (size_t)h->k;
    uint64_t prev = 0;
    for (size_t j = 0; j < k; j++) {
        uint32_t i = dt__load_u32(p + 4 * j);
        if (i >= h->count || (j > 0 && i <= prev))
            return dt_error_set(DT_ERR_CORRUPT,
                                "%s buffer: index %zu is %u (previous %llu, count %llu)",
                                dt_codec_get_info(h->kind)->name, j, i, (unsigned long long)prev,
                                (unsigned long long)h->count);
        prev = i;
    }
    return DT_OK;
}

static void topk_decode(const dt_codec_header *h, const uint8_t *p, float *out,
                        dt_decode_mode mode) {
    size_t k = (size_t)h->k;
    if (mode == DT_DECODE_SET)
        memset(out, 0, (size_t)h->count * sizeof(float));
    const uint8_t *vals = p + 4 * k;
    for (size_t j = 0; j < k; j++)
        out[dt__load_u32(p + 4 * j)] += dt__load_f32(vals + 4 * j);
}

static void topk_ef_sent(const dt_codec_header *h, const uint8_t *p, float *residual) {
    for (size_t j = 0; j < (size_t)h->k; j++)
        residual[dt__load_u32(p + 4 * j)] = 0.0f;
}

/* ------------------------------------------------------------------------ */
/* top-k                                                                    */
/* ------------------------------------------------------------------------ */

static inline uint32_t mag_key(float v) {
    uint32_t u;
    memcpy(&u, &v, 4);
    return u & 0x7fffffffu;
}

/* In hist[0..nbins), find the bin where the `want`-th largest falls, scanning
 * from the top; *above receives how many lie in higher bins. */
static uint32_t find_bin(const uint32_t *hist, uint32_t nbins, size_t want, size_t *above) {
    size_t cum = 0;
    for (uint32_t b = nbins; b-- > 0;) {
        if (cum + hist[b] >= want) {
            *above = cum;
            return b;
        }
        cum += hist[b];
    }
    DT_ASSERT(!"topk: histogram holds fewer values than wanted");
    return 0;
}

/* Histogram of (key >> shift) & mask over keys computed by `load`. Four
 * interleaved sub-histograms: gradients crowd into a few bins, and a single
 * counter incremented back to back stalls on store-to-load forwarding. */
static void histogram_x(const float *x, size_t n, uint32_t hist[2048]) {
    uint32_t h[4][2048];
    memset(h, 0, sizeof h);
    size_t i = 0;
    for (; i + 4 <= n; i += 4) {
        h[0][mag_key(x[i]) >> 20]++;
        h[1][mag_key(x[i + 1]) >> 20]++;
        h[2][mag_key(x[i + 2]) >> 20]++;
        h[3][mag_key(x[i + 3]) >> 20]++;
    }
    for (; i < n; i++)
        h[0][mag_key(x[i]) >> 20]++;
    for (size_t b = 0; b < 2048; b++)
        hist[b] = h[0][b] + h[1][b] + h[2][b] + h[3][b];
}

/* keys[0..m) = magnitude keys of x whose top 11 bits equal b1; returns m. */
static size_t compact_scalar(const float *x, size_t n, uint32_t b1, uint32_t *keys) {
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t key = mag_key(x[i]);
        keys[m] = key;
        m += (key >> 20) == b1; /* branch-free compaction */
    }
    return m;
}

__attribute__((target("avx512f"))) static size_t compact_avx512(const float *x, size_t n,
                                                                uint32_t b1, uint32_t *keys) {
    const __m512i abs_mask = _mm512_set1_epi32(0x7fffffff), bin = _mm512_set1_epi32((int)b1);
    size_t m = 0, i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512i key = _mm512_and_si512(_mm512_loadu_si512(x + i), abs_mask);
        __mmask16 hit = _mm512_cmpeq_epi32_mask(_mm512_srli_epi32(key, 20), bin);
        _mm512_mask_compressstoreu_epi32(keys + m, hit, key);
        m += (size_t)__builtin_popcount(hit);
    }
    return m + compact_scalar(x + i, n - i, b1, keys + m);
}

/* Store the indices of keys > thresh, and of the first `want` keys ==
 * thresh, in increasing order; returns how many. */
static size_t emit_scalar(const float *x, size_t begin, size_t n, uint32_t thresh, size_t *ties,
                          size_t want, uint8_t *idx_out) {
    size_t out = 0;
    for (size_t i = begin; i < n; i++) {
        uint32_t key = mag_key(x[i]);
        if (key > thresh || (key == thresh && (*ties)++ < want))
            dt__store_u32(idx_out + 4 * out++, (uint32_t)i);
    }
    return out;
}

__attribute__((target("avx512f"))) static size_t
emit_avx512(const float *x, size_t n, uint32_t thresh, size_t want, uint8_t *idx_out) {
    const __m512i abs_mask = _mm512_set1_epi32(0x7fffffff), t = _mm512_set1_epi32((int)thresh);
    const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    size_t out = 0, ties = 0, i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512i key = _mm512_and_si512(_mm512_loadu_si512(x + i), abs_mask);
        __mmask16 gt = _mm512_cmpgt_epu32_mask(key, t);
        if (ties < want && _mm512_cmpeq_epi32_mask(key, t)) {
            /* Ties still to take in this chunk: keep index order exact. */
            out += emit_scalar(x, i, i + 16, thresh, &ties, want, idx_out + 4 * out);
            continue;
        }
        if (gt) {
            __m512i idx = _mm512_add_epi32(lane, _mm512_set1_epi32((int)(uint32_t)i));
            _mm512_mask_compressstoreu_epi32(idx_out + 4 * out, gt, idx);
            out += (size_t)__builtin_popcount(gt);
        }
    }
    return out + emit_scalar(x, i, n, thresh, &ties, want, idx_out + 4 * out);
}

void dt__topk_select(const float *x, size_t n, size_t k, uint32_t *keys, uint8_t *idx_out,
                     bool simd) {
    if (k == 0)
        return;
    if (k >= n) {
        for (size_t i = 0; i < n; i++)
            dt__store_u32(idx_out + 4 * i, (uint32_t)i);
        return;
    }
    simd = simd && dt__have_avx512f();
    uint32_t hist[2048];
    size_t above;

    /* Level 1: bits 30..20 (bit 31 is the cleared sign). */
    histogram_x(x, n, hist);
    uint32_t b1 = find_bin(hist, 2048, k, &above);
    size_t want = k - above;
    size_t m = simd ? compact_avx512(x, n, b1, keys) : compact_scalar(x, n, b1, keys);

    /* Level 2: bits 19..10, over the candidates only. */
    memset(hist, 0, 1024 * sizeof hist[0]);
    for (size_t i = 0; i < m; i++)
        hist[(keys[i] >> 10) & 0x3ffu]++;
    uint32_t b2 = find_bin(hist, 1024, want, &above);
    want -= above;
    size_t m2 = 0;
    for (size_t i = 0; i < m; i++) {
        uint32_t key = keys[i];
        keys[m2] = key;
        m2 += ((key >> 10) & 0x3ffu) == b2;
    }

    /* Level 3: bits 9..0. */
    memset(hist, 0, 1024 * sizeof hist[0]);
    for (size_t i = 0; i < m2; i++)
        hist[keys[i] & 0x3ffu]++;
    uint32_t b3 = find_bin(hist, 1024, want, &above);
    want -= above; /* how many values equal to the threshold are kept */
    uint32_t thresh = (b1 << 20) | (b2 << 10) | b3;

    size_t ties = 0;
    size_t out = simd ? emit_avx512(x, n, thresh, want, idx_out)
                      : emit_scalar(x, 0, n, thresh, &ties, want, idx_out);
    DT_ASSERT(out == k);
}

static dt_status topk_encode(dt_compressor *c, const float *x, uint64_t step, uint8_t *p) {
    size_t k = (size_t)c->hdr.k;
    dt__topk_select(x, c->n, k, c->keys, p, true);
    uint8_t *vals = p + 4 * k;
    for (size_t j = 0; j < k; j++)
        dt__store_f32(vals + 4 * j, x[dt__load_u32(p + 4 * j)]);
    return DT_OK;
}

const dt__codec_ops dt__codec_topk = {
    .info = {.name = "topk", .biased = true, .ef_default = true},
    .payload_bytes = topk_bytes,
    .encode = topk_encode,
    .validate = topk_validate,
    .decode = topk_decode,
    .ef_sent = topk_ef_sent,
};

/* ------------------------------------------------------------------------ */
/* random-k                                                                 */
/* ------------------------------------------------------------------------ */

/*
 * random-k payload: u64 seed, u64 step, u32 bucket, u32 0, f32 value[k].
 * The indices are not sent: stratum j = [j n / k, (j + 1) n / k) contributes
 * index lo_j + below(size_j), drawn in order from rank 0's stream of (seed,
 * step, bucket). Any seed the buffer carries yields indices inside their
 * strata, so a forged buffer can only choose other in-range indices.
 */
#define RANDK_PREFIX 24

static bool randk_bytes(const dt_codec_header *h, size_t *out) {
    return dt_mul_size((size_t)h->k, 4, out) && (*out += RANDK_PREFIX) >= RANDK_PREFIX;
}

typedef struct randk_iter {
    dt_rng rng;
    uint64_t n, k, j; /* values, strata, next stratum */
} randk_iter;

static void randk_begin(randk_iter *it, uint64_t seed, uint64_t step, uint32_t bucket, uint64_t n,
                        uint64_t k) {
    dt__compress_rng(&it->rng, seed, 0, step, bucket);
    it->n = n;
    it->k = k;
    it->j = 0;
}

/* Index chosen in the next stratum (n, k < 2^32, so j n fits in 64 bits). */
static inline size_t randk_next(randk_iter *it) {
    uint64_t lo = it->j * it->n / it->k, hi = (it->j + 1) * it->n / it->k;
    it->j++;
    return (size_t)(lo + dt_rng_below(&it->rng, (uint32_t)(hi - lo)));
}

static void randk_read_prefix(const uint8_t *p, uint64_t *seed, uint64_t *step, uint32_t *bucket) {
    memcpy(seed, p, 8);
    memcpy(step, p + 8, 8);
    memcpy(bucket, p + 16, 4);
}

static dt_status randk_encode(dt_compressor *c, const float *x, uint64_t step, uint8_t *p) {
    size_t k = (size_t)c->hdr.k;
    uint32_t zero = 0;
    memcpy(p, &c->cfg.seed, 8);
    memcpy(p + 8, &step, 8);
    memcpy(p + 16, &c->cfg.bucket, 4);
    memcpy(p + 20, &zero, 4);
    randk_iter it;
    randk_begin(&it, c->cfg.seed, step, c->cfg.bucket, c->n, k);
    uint8_t *vals = p + RANDK_PREFIX;
    for (size_t j = 0; j < k; j++)
        dt__store_f32(vals + 4 * j, x[randk_next(&it)]);
    return DT_OK;
}

static dt_status randk_validate(const dt_codec_header *h, const uint8_t *p) {
    uint64_t seed, step;
    uint32_t bucket, pad;
    randk_read_prefix(p, &seed, &step, &bucket);
    memcpy(&pad, p + 20, 4);
    if (step >= (1ull << 36) || bucket >= (1u << 24) || pad != 0)
        return dt_error_set(DT_ERR_CORRUPT,
                            "randk buffer: step %llu / bucket %u / padding %u is invalid",
                            (unsigned long long)step, bucket, pad);
    return DT_OK;
}

static void randk_decode(const dt_codec_header *h, const uint8_t *p, float *out,
                         dt_decode_mode mode) {
    uint64_t seed, step;
    uint32_t bucket;
    randk_read_prefix(p, &seed, &step, &bucket);
    if (mode == DT_DECODE_SET)
        memset(out, 0, (size_t)h->count * sizeof(float));
    randk_iter it;
    randk_begin(&it, seed, step, bucket, h->count, h->k);
    const uint8_t *vals = p + RANDK_PREFIX;
    for (size_t j = 0; j < (size_t)h->k; j++)
        out[randk_next(&it)] += dt__load_f32(vals + 4 * j);
}

static void randk_ef_sent(const dt_codec_header *h, const uint8_t *p, float *residual) {
    uint64_t seed, step;
    uint32_t bucket;
    randk_read_prefix(p, &seed, &step, &bucket);
    randk_iter it;
    randk_begin(&it, seed, step, bucket, h->count, h->k);
    for (size_t j = 0; j < (size_t)h->k; j++)
        residual[randk_next(&it)] = 0.0f;
}

const dt__codec_ops dt__codec_randk = {
    .info =
        {.name = "randk", .biased = true, .ef_default = true, .linear = true, .stochastic = true},
    .payload_bytes = randk_bytes,
    .encode = randk_encode,
    .validate = randk_validate,
    .decode = randk_decode,
    .ef_sent = randk_ef_sent,
};
