/*
 * compress/internal.h — what the codec files of src/compress share.
 *
 * Each codec is a dt__codec_ops table (codec.c lists them, indexed by
 * dt_codec_kind). The split of work is fixed:
 *   - codec.c reads and writes the header and checks that the buffer length
 *     is exactly header + payload_bytes(header) before calling anything here;
 *   - validate() checks payload contents that could steer a write (indices)
 *     or that encode never produces (non-finite scales), without writing;
 *   - decode() then runs on a buffer known to be well formed and cannot fail.
 * Payload sections are 4-byte aligned relative to the header, but the
 * buffer itself may come from anywhere, so payload reads use memcpy-style
 * unaligned loads.
 */
#ifndef DTRAIN_COMPRESS_INTERNAL_H
#define DTRAIN_COMPRESS_INTERNAL_H

#include "dtrain/compress.h"

#include <string.h>

typedef struct dt__codec_ops {
    dt_codec_info info;
    /* Exact payload size for a validated header; false on size overflow. */
    bool (*payload_bytes)(const dt_codec_header *h, size_t *out);
    /* Encode x[0..h->count) into payload; c supplies scratch, state and the
     * random-number identity. The payload has exactly payload_bytes(h). */
    dt_status (*encode)(dt_compressor *c, const float *x, uint64_t step, uint8_t *payload);
    /* Check payload contents; DT_ERR_CORRUPT with a message on failure. */
    dt_status (*validate)(const dt_codec_header *h, const uint8_t *payload);
    void (*decode)(const dt_codec_header *h, const uint8_t *payload, float *out,
                   dt_decode_mode mode);
    /* Optional, for codecs that send some values exactly and nothing of the
     * rest (topk, randk): with error feedback, encode straight from the
     * residual (residual += grad) and then zero what was sent. Same result
     * as the generic work - decode(work), two passes fewer. */
    void (*ef_sent)(const dt_codec_header *h, const uint8_t *payload, float *residual);
    /* Optional (block codecs, casts): encode grad + res_in and write the new
     * residual (grad + res_in) - decode to res_out in the same pass, with
     * the decode's own arithmetic, so the result equals the generic path
     * bit for bit. res_out is scratch until the call succeeds. */
    dt_status (*encode_ef)(dt_compressor *c, const float *grad, const float *res_in, float *res_out,
                           uint64_t step, uint8_t *payload);
} dt__codec_ops;

/* The per-tensor state. Fields used by one codec only are marked. */
struct dt_compressor {
    dt_codec_spec spec;
    const dt__codec_ops *ops;
    dt_codec_header hdr;  /* the header every encoding of this tensor carries */
    size_t n;             /* values per tensor */
    size_t encoded_bytes; /* header + payload, exact */
    dt_compressor_config cfg;
    bool ef;         /* error feedback on */
    float *residual; /* (n) what was not sent yet; NULL without EF */
    float *work;     /* (n) grad + residual, or PowerSGD's M */
    float *decoded;  /* (n) decode of the last encoding, for the residual */
    uint32_t *keys;  /* topk: (n) magnitude keys for the selection */
    /* powersgd */
    size_t rows, cols; /* matrix shape */
    int prank;         /* rank used, 0: sent uncompressed */
    float *P;          /* (rows, prank) or (n) when uncompressed */
    float *Q;          /* (cols, prank), warm start kept between steps */
    int stage;         /* staged API: 0 idle, 1 after begin, 2 after middle */
};

extern const dt__codec_ops dt__codec_none, dt__codec_fp16, dt__codec_bf16, dt__codec_int8,
    dt__codec_qsgd, dt__codec_sign, dt__codec_topk, dt__codec_randk, dt__codec_powersgd;

/* The random stream of (seed, rank, step) for bucket `bucket`. */
void dt__compress_rng(dt_rng *r, uint64_t seed, uint32_t rank, uint64_t step, uint32_t bucket);

/* out[0..count) = outputs pos .. pos+count of the dt_rng stream (seed,
 * stream): exactly what dt_rng_init + dt_rng_seek(pos) + count calls of
 * dt_rng_u32 return, evaluated 16 Philox blocks at a time so that the
 * compiler vectorises it. pos must be a multiple of 4. */
void dt__philox_fill(uint64_t seed, uint64_t stream, uint64_t pos, uint32_t *out, size_t count);

/* True if the CPU (and OS) support AVX-512F; decided once, thread-safe. */
bool dt__have_avx512f(void);
/* Tests set this to run every codec through its portable scalar code. */
extern bool dt__compress_scalar_only;
/* Tests set this to use the generic error-feedback path for every codec. */
extern bool dt__compress_generic_ef;

/* Blocks of DT_COMPRESS_BLOCK values covering n. */
static inline size_t dt__nblocks(size_t n) {
    return n / DT_COMPRESS_BLOCK + (n % DT_COMPRESS_BLOCK != 0);
}

static inline float dt__load_f32(const uint8_t *p) {
    float v;
    memcpy(&v, p, 4);
    return v;
}
static inline uint32_t dt__load_u32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}
static inline void dt__store_f32(uint8_t *p, float v) { memcpy(p, &v, 4); }
static inline void dt__store_u32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }

/* Largest |x[i]| of a block, as its bit pattern (which orders like the
 * value); a result >= 0x7f800000 means the block holds inf or NaN. Integer
 * max vectorises, unlike a float reduction. */
static inline uint32_t dt__absmax_bits(const float *x, size_t len) {
    uint32_t m = 0;
    for (size_t i = 0; i < len; i++) {
        uint32_t u;
        memcpy(&u, &x[i], 4);
        u &= 0x7fffffffu;
        m = u > m ? u : m;
    }
    return m;
}

/* Scale sections (one f32 per block) that must be finite and >= 0. */
dt_status dt__validate_scales(const uint8_t *scales, size_t nblocks, const char *codec);

/* Conversions (encoded side: unaligned little-endian u16), exposed so tests
 * can compare the SIMD paths with the scalar reference bit for bit.
 * `simd` false forces the scalar code. */
void dt__f32_to_f16(uint8_t *out, const float *in, size_t n, bool simd);
void dt__f16_to_f32(float *out, const uint8_t *in, size_t n, bool simd, dt_decode_mode mode);
void dt__f32_to_bf16(uint8_t *out, const float *in, size_t n);
void dt__bf16_to_f32(float *out, const uint8_t *in, size_t n, dt_decode_mode mode);

/* topk selection: store (unaligned u32) the indices of the k largest |x|
 * in increasing index order; ties at the threshold go to the lowest
 * indices. keys is scratch of n u32. O(n): a radix select on the magnitude
 * bits, never a sort. `simd` false forces the scalar code (for tests). */
void dt__topk_select(const float *x, size_t n, size_t k, uint32_t *keys, uint8_t *idx_out,
                     bool simd);

/* The rank PowerSGD uses for a rows x cols tensor asked for rank `rank`:
 * 0 (send it as fp32) unless rank < min(rows, cols), the tensor has at
 * least min_compress values, and P and Q take at most half its size (the
 * min_compression_rate of 2 that PyTorch's hook defaults to: below that the
 * approximation costs accuracy for little traffic). */
static inline size_t dt__powersgd_rank_for(size_t rows, size_t cols, size_t rank,
                                           size_t min_compress) {
    size_t mn = rows < cols ? rows : cols, n = rows * cols;
    if (rank >= mn || n < min_compress || 2 * rank * (rows + cols) > n)
        return 0;
    return rank;
}

/* PowerSGD pieces, shared by the one-shot codec and the staged API. */
void dt__powersgd_orthonormalize(float *P, size_t rows, size_t r);

/* A staged bucket step that failed in the middle: back to idle, keeping
 * the previous step's residual (Q may hold this step's partial values). */
void dt__powersgd_bucket_abandon(dt_powersgd_bucket *b);
/* Zero residual and Q (redrawn at the next step). */
void dt__powersgd_bucket_reset(dt_powersgd_bucket *b);
/* residual *= factor (Q, a warm-start direction, is left alone). */
void dt__powersgd_bucket_scale_residual(dt_powersgd_bucket *b, float factor);
void dt__powersgd_bucket_flush_residual(dt_powersgd_bucket *b, float *data);

/* Test hook of the compressed allreduce: when set, called on this rank's
 * encoding after it is made and before it is sent (allgather codecs), so a
 * multi-process test can corrupt what a peer receives. */
extern void (*dt__callreduce_tamper)(int rank, uint8_t *buf, size_t len);
/* The seed of chunk j's compressor in the two-phase scheme (chunks 0..W-1
 * on every rank; W + j for the owner's re-encode of chunk j). */
uint64_t dt__callreduce_chunk_seed(uint64_t seed, size_t j);

#endif /* DTRAIN_COMPRESS_INTERNAL_H */
