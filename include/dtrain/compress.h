/*
 * dtrain/compress.h — gradient compression: codecs and error feedback.
 *
 * Overview
 * --------
 * A codec turns n fp32 gradient values into a self-describing byte buffer
 * and back. Every buffer starts with a 32-byte header (magic "DTCZ",
 * version, codec, parameters, count); dt_codec_decode() validates the header
 * and the exact length implied by it, and every index inside the payload,
 * before it touches the output, so a corrupt, truncated or hostile buffer
 * gives DT_ERR_CORRUPT and never an out-of-bounds access.
 *
 *   spec          bytes per value (n large)     bias       error feedback
 *   none          4                             exact      off
 *   fp16 / bf16   2                             rounding   off
 *   int8          1 + 4/256                     rounding   off
 *   qsgd:B        B/8 + 4/256  (B = 1..8)       unbiased   off
 *   sign          1/8 + 4/256                   biased     on
 *   topk:F        8F  (u32 index + f32 value)   biased     on
 *   randk:F       4F  (indices from the seed)   biased     on
 *   powersgd:R    4R(rows+cols)/(rows*cols)     biased     on
 *
 * The header also carries a 32-bit check of itself, so a damaged header
 * (fp16 turned into bf16, say) is refused rather than misread.
 *
 * A dt_compressor holds what one tensor or bucket needs between steps: the
 * error-feedback residual, PowerSGD's warm-started Q, scratch space, and the
 * identity (seed, rank, bucket id) that keys its random numbers. The hot
 * path (dt_compressor_compress / dt_codec_decode) does not allocate.
 *
 * Randomness comes from core's Philox dt_rng, stream
 * dt_rng_stream_id(rank, step, DT_RNG_COMPRESS) advanced to bucket_id << 40,
 * so every draw is reproducible from (seed, rank, step, bucket). Random-k
 * indices and PowerSGD's initial Q use rank 0's stream on every rank: all
 * ranks then choose the same indices / start from the same Q, which is what
 * makes random-k encodings summable and PowerSGD's allreduces meaningful.
 *
 * Pieces
 * ------
 *   dt_codec_parse, dt_ef_parse,         spec strings and the --compress /
 *   dt_compress_env                      --compress-ef knobs
 *   dt_compressor_*                      one tensor or bucket: encode with
 *                                        error feedback; checkpoint state
 *   dt_codec_decode, dt_codec_peek       any encoded buffer, validated
 *   dt_codec_encoded_bytes               exact size, for planning
 *   dt_powersgd_begin/middle/end         PowerSGD of one matrix in stages,
 *                                        with allreduces in between
 *   dt_powersgd_bucket_*                 the same for every tensor of a
 *                                        data-parallel bucket at once
 *   dt_callreduce_*                      compressed allreduce (average) of a
 *                                        flat range over a dt_group
 * docs/compress.md describes each codec, its bounds and the buffer layout.
 *
 * Example
 * -------
 *     dt_codec_spec spec;
 *     DT_CHECK(dt_codec_parse("--compress", "topk:0.01", &spec));
 *     dt_compressor_config cfg = dt_compressor_config_default();
 *     cfg.seed = 1; cfg.rank = rank;
 *     dt_compressor *c;
 *     DT_CHECK(dt_compressor_create(&c, &spec, n, &cfg));
 *     size_t cap = dt_compressor_encoded_bytes(c), used;
 *     uint8_t *buf = dt_alloc(cap);
 *     DT_CHECK(dt_compressor_compress(c, grad, step, buf, cap, &used));
 *     ... send buf[0..used) ...
 *     DT_CHECK(dt_codec_decode(buf, used, n, out, DT_DECODE_ADD));
 */
#ifndef DTRAIN_COMPRESS_H
#define DTRAIN_COMPRESS_H

#include "dtrain/comm.h"
#include "dtrain/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Values per scale block for int8, qsgd and sign. */
#define DT_COMPRESS_BLOCK        256
/* Size of the header that starts every encoded buffer. */
#define DT_COMPRESS_HEADER_BYTES 32
/* Largest PowerSGD rank accepted by the spec parser. */
#define DT_COMPRESS_MAX_RANK     1024

typedef enum dt_codec_kind {
    DT_CODEC_NONE,
    DT_CODEC_FP16,
    DT_CODEC_BF16,
    DT_CODEC_INT8,
    DT_CODEC_QSGD,
    DT_CODEC_SIGN,
    DT_CODEC_TOPK,
    DT_CODEC_RANDK,
    DT_CODEC_POWERSGD,
    DT_CODEC_COUNT
} dt_codec_kind;

/* A parsed spec string. Exactly the fields of its kind are meaningful. */
typedef struct dt_codec_spec {
    dt_codec_kind kind;
    int bits;        /* qsgd: bits per value, 1..8 */
    double fraction; /* topk/randk: share of values kept, (0, 1]; 0 when count is used */
    size_t count;    /* topk/randk: number of values kept; 0 when fraction is used */
    int rank;        /* powersgd: rank, 1..DT_COMPRESS_MAX_RANK */
} dt_codec_spec;

/* Static properties of a codec. */
typedef struct dt_codec_info {
    const char *name; /* "topk" */
    bool biased;      /* E[decode(encode(x))] != x: wants error feedback */
    bool ef_default;  /* error feedback is on unless the caller turns it off */
    bool linear;      /* encodings of different ranks can be summed as encoded
                         values (same layout, same scales/indices) */
    bool stochastic;  /* encode draws random numbers */
} dt_codec_info;

const dt_codec_info *dt_codec_get_info(dt_codec_kind kind);

/* Parse none | fp16 | bf16 | int8 | qsgd:BITS | sign | topk:K | randk:K |
 * powersgd:RANK, where K is a fraction in (0, 1] written with a '.' or an
 * exponent ("0.01", "1e-3"), or a count written as an integer ("1000").
 * `knob` names the flag or variable in the error message. */
dt_status dt_codec_parse(const char *knob, const char *text, dt_codec_spec *out);
/* Write the canonical spec string ("qsgd:4"); returns buf. */
char *dt_codec_format(const dt_codec_spec *spec, char *buf, size_t len);

/* Exact size of the encoding of n values (header included), without
 * creating a compressor: for planning and metrics. rows, cols and
 * min_compress matter for powersgd only (as in dt_compressor_config). */
dt_status dt_codec_encoded_bytes(const dt_codec_spec *spec, size_t n, size_t rows, size_t cols,
                                 size_t min_compress, size_t *out);

/* Values kept by topk/randk for a tensor of n values (1 <= k <= n when n > 0). */
size_t dt_codec_k(const dt_codec_spec *spec, size_t n);

/* The header of an encoded buffer, as decoded and validated. */
typedef struct dt_codec_header {
    dt_codec_kind kind;
    int bits;       /* qsgd */
    uint64_t count; /* values represented */
    uint64_t k;     /* topk/randk: values sent; powersgd: rows */
    uint64_t rank;  /* powersgd: rank used (0: sent uncompressed) */
} dt_codec_header;

/* Validate the header and that `len` is exactly the size it implies. */
dt_status dt_codec_peek(const void *buf, size_t len, dt_codec_header *out);

typedef enum dt_decode_mode {
    DT_DECODE_SET, /* out[i] = decoded value */
    DT_DECODE_ADD, /* out[i] += decoded value */
} dt_decode_mode;

/* Decode buf[0..len) into out[0..n). The buffer must describe exactly n
 * values; anything malformed gives DT_ERR_CORRUPT and leaves out untouched
 * (validation completes before the first write). */
dt_status dt_codec_decode(const void *buf, size_t len, size_t n, float *out, dt_decode_mode mode);

/* ------------------------------------------------------------------------ */
/* Configuration knobs                                                      */
/* ------------------------------------------------------------------------ */

typedef enum dt_ef_mode {
    DT_EF_DEFAULT, /* "auto": the codec's default (dt_codec_info.ef_default) */
    DT_EF_ON,      /* "on" */
    DT_EF_OFF,     /* "off" */
} dt_ef_mode;

/* Parse auto | on | off (also the core booleans: 1/0, true/false, yes/no). */
dt_status dt_ef_parse(const char *knob, const char *text, dt_ef_mode *out);

/* Read DT_COMPRESS (default "none") and DT_COMPRESS_EF (default "auto");
 * an unset or empty variable gives the default. Either output may be NULL.
 * The CLI flags --compress / --compress-ef take precedence over these and
 * are parsed with dt_codec_parse / dt_ef_parse. */
dt_status dt_compress_env(dt_codec_spec *spec, dt_ef_mode *ef);

/* ------------------------------------------------------------------------ */
/* Compressor: per-tensor (or per-bucket) state                             */
/* ------------------------------------------------------------------------ */

typedef struct dt_compressor_config {
    uint64_t seed;       /* run seed */
    uint32_t rank;       /* this process's rank (< 2^20) */
    uint32_t bucket;     /* bucket / tensor id (< 2^24): separates random streams */
    dt_ef_mode ef;       /* error feedback */
    size_t rows, cols;   /* powersgd: matrix shape, rows * cols == n; 0,0: n x 1 */
    size_t min_compress; /* powersgd: tensors with fewer values go uncompressed */
} dt_compressor_config;

/* seed 0, rank 0, bucket 0, DT_EF_DEFAULT, rows = cols = 0, min_compress 0. */
dt_compressor_config dt_compressor_config_default(void);

/* A compressor is used by one thread at a time; different compressors are
 * independent and may run concurrently. */
typedef struct dt_compressor dt_compressor;

/* Create the state for a tensor of n values. Allocates everything the hot
 * path needs. Rejects invalid shapes (rows * cols != n) with DT_ERR_INVALID. */
dt_status dt_compressor_create(dt_compressor **out, const dt_codec_spec *spec, size_t n,
                               const dt_compressor_config *cfg);
void dt_compressor_destroy(dt_compressor *c);

/* Planning: the bytes dt_compressor_create allocates for n values (its
 * residual, decode and work buffers, top-k's keys, PowerSGD's P and Q). */
dt_status dt_compressor_plan_bytes(const dt_codec_spec *spec, size_t n,
                                   const dt_compressor_config *cfg, size_t *out);

/* Exact size of every buffer this compressor produces (header included). */
size_t dt_compressor_encoded_bytes(const dt_compressor *c);
/* Number of values this compressor encodes. */
size_t dt_compressor_count(const dt_compressor *c);
bool dt_compressor_error_feedback(const dt_compressor *c);

/* topk: keep k values per encoding from now on (1 <= k <= n; the size of
 * the encodings, dt_compressor_encoded_bytes, follows). For a density that
 * changes over the run (dt_callreduce_set_fraction). DT_ERR_INVALID for
 * another codec or k out of range. */
dt_status dt_compressor_set_k(dt_compressor *c, size_t k);

/* Encode grad[0..n) (plus the residual when error feedback is on) into
 * out[0..cap); *used receives the exact byte count. With error feedback the
 * residual becomes (grad + residual) - decode(out). `step` (< 2^36) keys the
 * random numbers. grad is not modified. On failure (DT_ERR_NUMERIC for a
 * block holding inf/NaN in int8/qsgd/sign) the residual is unchanged and
 * the contents of out are unspecified. */
dt_status dt_compressor_compress(dt_compressor *c, const float *grad, uint64_t step, void *out,
                                 size_t cap, size_t *used);

/* Residual for checkpoints: n floats, raw bytes (little-endian fp32).
 * get copies into buf (len >= dt_compressor_residual_bytes); set restores
 * it (len must be exactly that). Without error feedback the size is 0. */
size_t dt_compressor_residual_bytes(const dt_compressor *c);
dt_status dt_compressor_get_residual(const dt_compressor *c, void *buf, size_t len);
dt_status dt_compressor_set_residual(dt_compressor *c, const void *buf, size_t len);
/* Read-only view of the residual (NULL without error feedback). */
const float *dt_compressor_residual(const dt_compressor *c);

/* Everything a checkpoint needs to resume bit for bit: the residual (n
 * fp32, with error feedback) followed by PowerSGD's warm-start Q (cols x
 * rank fp32, when the tensor is compressed). Raw little-endian bytes;
 * set_state requires exactly state_bytes and finite values, and refuses to
 * run in the middle of a staged PowerSGD step. */
size_t dt_compressor_state_bytes(const dt_compressor *c);
/* Forget the state: zero residual, PowerSGD's Q redrawn at the next step
 * (e.g. after an elastic restart that changed the data-parallel group). */
void dt_compressor_reset(dt_compressor *c);
dt_status dt_compressor_get_state(const dt_compressor *c, void *buf, size_t len);
dt_status dt_compressor_set_state(dt_compressor *c, const void *buf, size_t len);

/* ------------------------------------------------------------------------ */
/* PowerSGD in stages, for data-parallel use                                */
/* ------------------------------------------------------------------------ */
/*
 * For a matrix gradient M (rows x cols, row-major) and rank r:
 *
 *   dt_powersgd_begin(c, grad)   M = grad + residual;  P = M Q          (rows x r)
 *     ... allreduce P (sum) ...
 *   dt_powersgd_middle(c)        orthonormalise P's columns; Q = M^T P (cols x r)
 *     ... allreduce Q (sum) ...
 *   dt_powersgd_end(c, s, out)   out = s * P Q^T;  residual = M - out
 *
 * P and Q live in the compressor (dt_powersgd_p / _q); the caller reduces
 * them in place. Q is kept as the warm start of the next step. With s =
 * 1/world the output is the average of the ranks' approximations, and the
 * residual is what this rank's gradient lost to it (as in PyTorch's
 * powerSGD_hook). When the tensor is sent uncompressed (dt_powersgd_rank()
 * == 0), begin copies M into P (n values), middle does nothing, and end
 * writes s * P. begin copies the gradient, so `out` may be the gradient
 * buffer itself (the same holds for the bucket API below).
 */
int dt_powersgd_rank(const dt_compressor *c); /* rank used; 0: uncompressed */
float *dt_powersgd_p(dt_compressor *c, size_t *count);
float *dt_powersgd_q(dt_compressor *c, size_t *count);
dt_status dt_powersgd_begin(dt_compressor *c, const float *grad, uint64_t step);
dt_status dt_powersgd_middle(dt_compressor *c);
dt_status dt_powersgd_end(dt_compressor *c, float scale, float *out);

/* ------------------------------------------------------------------------ */
/* PowerSGD over a bucket of tensors                                        */
/* ------------------------------------------------------------------------ */
/*
 * A data-parallel bucket holds several tensors. dt_powersgd_bucket runs the
 * same three stages over all of them at once, so that a step costs two
 * allreduces per bucket whatever the number of tensors (as PyTorch's hook
 * batches them):
 *
 *   dt_powersgd_bucket_begin(b, grad, step)  P buffer = [P of every matrix |
 *                                              every value sent uncompressed]
 *     ... allreduce the P buffer (sum) ...
 *   dt_powersgd_bucket_middle(b)             orthonormalise each P; each Q = M^T P
 *     ... allreduce the Q buffer (sum) ...
 *   dt_powersgd_bucket_end(b, s, out)        Q *= s (kept as warm start);
 *                                            out = P Q^T per matrix, s * values
 *                                            otherwise; residual = M - out
 *
 * Tensors are (offset, rows, cols) views of the bucket; they must lie in
 * [0, n) without overlapping. A tensor goes uncompressed when rank r would
 * not at least halve it (2 r (rows + cols) > rows cols, or r >= min(rows,
 * cols)) or it has fewer than cfg->min_compress values; so do values not
 * covered by any tensor. cfg->rows/cols are ignored; cfg->ef defaults to on.
 */
typedef struct dt_powersgd_tensor {
    size_t offset;     /* first value of the tensor in the bucket */
    size_t rows, cols; /* row-major shape; a vector is rows x 1 */
} dt_powersgd_tensor;

typedef struct dt_powersgd_bucket dt_powersgd_bucket;

dt_status dt_powersgd_bucket_create(dt_powersgd_bucket **out, int rank, size_t n,
                                    const dt_powersgd_tensor *tensors, size_t ntensors,
                                    const dt_compressor_config *cfg);
void dt_powersgd_bucket_destroy(dt_powersgd_bucket *b);
/* The two buffers to allreduce, owned by the bucket: *count floats each. */
float *dt_powersgd_bucket_p(dt_powersgd_bucket *b, size_t *count);
float *dt_powersgd_bucket_q(dt_powersgd_bucket *b, size_t *count);
/* Tensors compressed (the others go in the P buffer as plain values). */
size_t dt_powersgd_bucket_compressed(const dt_powersgd_bucket *b);
dt_status dt_powersgd_bucket_begin(dt_powersgd_bucket *b, const float *grad, uint64_t step);
dt_status dt_powersgd_bucket_middle(dt_powersgd_bucket *b);
dt_status dt_powersgd_bucket_end(dt_powersgd_bucket *b, float scale, float *out);
/* Checkpoint state: residual (n fp32, with error feedback), then every Q. */
size_t dt_powersgd_bucket_state_bytes(const dt_powersgd_bucket *b);
dt_status dt_powersgd_bucket_get_state(const dt_powersgd_bucket *b, void *buf, size_t len);
dt_status dt_powersgd_bucket_set_state(dt_powersgd_bucket *b, const void *buf, size_t len);

/* ------------------------------------------------------------------------ */
/* Compressed allreduce over a group                                        */
/* ------------------------------------------------------------------------ */
/*
 * dt_callreduce averages one flat fp32 range over the ranks of a dt_group
 * through a codec: on return every rank holds the same values,
 * (1/W) sum_r decode(encode(x_r + residual_r)), with error feedback applied
 * once, locally, before the encode. The schedule per codec (allreduce of
 * 16-bit values for fp16/bf16, allgather of encodings for int8, qsgd, sign
 * and topk — for int8 and qsgd from 4 ranks alltoall of chunk encodings,
 * one re-encode of each reduced chunk, allgather —, allreduce of the
 * shared-index values for randk, two allreduces for powersgd, plain f32
 * allreduce for none) and its cost are in
 * src/compress/collective.c and docs/compress.md.
 *
 * A run is blocking and issues collectives on g, so every rank must run the
 * same dt_callreduce objects in the same order (as with any collective).
 * A corrupt encoding received from a peer gives DT_ERR_CORRUPT naming the
 * rank, never an out-of-bounds access. An inf or NaN in any rank's input
 * makes every rank's output non-finite (no error: a loss-scaling overflow
 * is then seen, and skipped, by all) and leaves every state as it was. After any failure the output
 * is unspecified; call dt_callreduce_reset before using the object again.
 */
typedef struct dt_callreduce dt_callreduce;

typedef struct dt_callreduce_config {
    uint64_t seed;   /* run seed, the same on every rank */
    uint32_t bucket; /* id (< 2^24), the same on every rank: separates random streams */
    dt_ef_mode ef;   /* error feedback */
    /* powersgd: the matrices in the range (see dt_powersgd_bucket_create);
     * values outside them are sent uncompressed. */
    const dt_powersgd_tensor *tensors;
    size_t ntensors;
    size_t min_compress; /* powersgd: smaller tensors go uncompressed */
    /* Reduce-scatter instead of allreduce (ZeRO): the range is cut into W
     * pieces, q = n / W values each and the last rank's also the remainder
     * (dt_ddp_shard_ranges' cut of a bucket); on return rank r's piece of
     * data holds the average and the rest of data is unspecified. fp16/bf16
     * reduce-scatter their 16-bit payload; int8, qsgd, sign, topk and randk
     * encode each piece with its own compressor (error feedback per piece),
     * alltoall the encodings, and each rank adds its piece's W decodings in
     * rank order; powersgd (whose factors span whole matrices) and none
     * keep their allreduce, a superset of the piece. */
    bool scatter;
} dt_callreduce_config;

/* seed 0, bucket 0, DT_EF_DEFAULT, no tensors. */
dt_callreduce_config dt_callreduce_config_default(void);

/* Planning (dtrain plan memory): the bytes a dt_callreduce of n floats
 * over `world` ranks allocates (its compressors' buffers, encodings,
 * alltoall buffers and the state's backup), from the choices create makes
 * (PowerSGD's factors, a few values per matrix, left out). */
dt_status dt_callreduce_plan_bytes(const dt_codec_spec *spec, size_t n, int world,
                                   const dt_callreduce_config *cfg, size_t *out);

/* Plan a compressed allreduce of n floats over g (NULL or a group of one:
 * the codec round trip without communication). Allocates every buffer. */
dt_status dt_callreduce_create(dt_callreduce **out, dt_group *g, const dt_codec_spec *spec,
                               size_t n, const dt_callreduce_config *cfg);
void dt_callreduce_destroy(dt_callreduce *c);

/* data[0..n) = the average over the group of every rank's decoded encoding
 * of its data (plus residual). `step` (< 2^36) keys the random numbers. */
dt_status dt_callreduce_run(dt_callreduce *c, float *data, uint64_t step);

/* topk: keep `fraction` of the values, in (0, 1], from the next run on (k
 * as dt_codec_k); 0 goes back to the spec's k. Grows the encoding buffers
 * when needed (call it between runs, not in a hot loop); wire bytes
 * follow. DT_ERR_INVALID for another codec (unless fraction is 0) or a
 * fraction outside [0, 1]. */
dt_status dt_callreduce_set_fraction(dt_callreduce *c, double fraction);

/* Bytes this rank sends per run (encoded payload; see collective.c). */
uint64_t dt_callreduce_wire_bytes(const dt_callreduce *c);
/* "allreduce", "allreduce16", "allgather", "allreduce-k", "powersgd",
 * "alltoall+allgather", "reduce-scatter16" or "alltoall" (scatter). */
const char *dt_callreduce_algo(const dt_callreduce *c);
bool dt_callreduce_error_feedback(const dt_callreduce *c);

/* This rank's state for checkpoints: the residual (n f32, with error
 * feedback) then PowerSGD's Q, raw little-endian; 0 bytes for none and
 * codecs without error feedback. set requires exactly state_bytes. */
size_t dt_callreduce_state_bytes(const dt_callreduce *c);
dt_status dt_callreduce_get_state(const dt_callreduce *c, void *buf, size_t len);
dt_status dt_callreduce_set_state(dt_callreduce *c, const void *buf, size_t len);
/* Zero the residual, redraw PowerSGD's Q at the next run. */
void dt_callreduce_reset(dt_callreduce *c);
/* residual *= factor: when the gradients' units change between runs (a
 * loss scale going from S to S' gives factor S'/S), so that the residual
 * keeps meaning the same amount of gradient. */
void dt_callreduce_scale_residual(dt_callreduce *c, float factor);

#ifdef __cplusplus
}
#endif
#endif /* DTRAIN_COMPRESS_H */
