/*
 * collective.c — compressed allreduce: the average over a group of one flat
 * fp32 range, sent through a codec (dt_callreduce in compress.h).
 *
 * Every rank applies error feedback once, locally, in its own compressor
 * before the first encode; nothing downstream keeps a second residual, so
 * "what this rank sent + its residual = everything it was given" holds per
 * rank. The schedule depends on what the codec's encodings allow:
 *
 *   codec               schedule                               bytes sent per rank
 *   none                allreduce f32 (comm: ring/rhd/...)     2 (W-1)/W * 4n
 *   fp16, bf16          encode, allreduce the u16 payload as   2 (W-1)/W * 2n
 *                       DT_F16/DT_BF16 SUM, decode
 *   int8, qsgd, sign,   encode, allgather the W encodings,     (W-1) * E
 *   topk                decode and add them in rank order
 *   randk               encode, allreduce the k values (SUM):  2 (W-1)/W * 4k
 *                       every rank keeps the same indices
 *   powersgd            begin, allreduce P, middle,            2 (W-1)/W * 4 (|P| + |Q|)
 *                       allreduce Q, end (dt_powersgd_bucket)
 *
 * (E = the codec's exact encoded size, header included; n values, W ranks.
 * "Bytes sent" counts payload under the bandwidth-optimal schedule — ring
 * allreduce, ring allgather — and excludes comm's 64-byte framing per
 * message; at W = 2, the evaluation's case, every schedule is one exchange
 * and the count is exact.)
 *
 * Why these choices:
 *   - fp16/bf16 are linear, so the comm's 16-bit allreduce *is* the
 *     "re-encode per hop" ring: each hop adds in fp32 and rounds once to the
 *     16-bit type. Bandwidth-optimal at every W; the error grows by one
 *     rounding per hop (W-1), which the tests bound.
 *   - int8/qsgd/sign/topk encodings of different ranks have different scales
 *     or indices, so they cannot be added encoded. Allgather then decode is
 *     exact with respect to "sum over ranks of decode(encode(x_r))" (every
 *     rank adds in the same rank order, so all get identical bits), costs no
 *     second quantisation and no second residual. Its cost, (W-1) E, equals
 *     the ring's 2 (W-1)/W E at W = 2 and is 1.5x it at W = 3; beyond that a
 *     reduce-scatter that re-encodes the reduced chunk would send less, at
 *     the price of a second, uncorrected quantisation (and, for sign, a
 *     biased one). dtrain's data-parallel groups over slow links are small
 *     (the evaluation runs 2 hosts), so the exact scheme is used at every W;
 *     dt_callreduce_wire_bytes() reports the real cost.
 *   - random-k draws the same indices on every rank, so only the k values
 *     travel, through the ordinary f32 allreduce.
 *   - PowerSGD's P and Q are linear in the gradient: two small allreduces.
 *
 * Corrupt input: every received encoding goes through dt_codec_decode,
 * which validates header, length and indices before writing; a bad peer
 * buffer gives DT_ERR_CORRUPT naming the rank, never an out-of-bounds
 * access (the output is then unspecified). Casts and random-k receive only
 * values (every bit pattern is a value), and PowerSGD plain floats.
 *
 * Overlap: a run is blocking (its collectives are bounded by DT_TIMEOUT).
 * The data-parallel layer runs the buckets' runs on a worker thread, in
 * bucket order, so they overlap the backward pass for every codec
 * (src/parallel/ddp.c).
 */
#include "internal.h"

#include "dtrain/comm.h"

#include <inttypes.h>
#include <math.h>
#include <stdlib.h>

typedef enum cc_algo {
    CC_PLAIN,     /* none: f32 allreduce */
    CC_CAST16,    /* fp16/bf16: 16-bit allreduce of the payload */
    CC_ALLGATHER, /* int8/qsgd/sign/topk: allgather encodings, decode all */
    CC_VALUES,    /* randk: allreduce the kept values */
    CC_POWERSGD,  /* P and Q allreduces */
} cc_algo;

static const char *const algo_names[] = {"allreduce", "allreduce16", "allgather", "allreduce-k",
                                         "powersgd"};

struct dt_callreduce {
    dt_group *g;     /* NULL: one process */
    int rank, world; /* in g */
    dt_codec_spec spec;
    size_t n; /* values averaged */
    cc_algo algo;
    dt_compressor *comp;      /* every algorithm but plain and powersgd */
    dt_powersgd_bucket *psgd; /* powersgd */
    uint8_t *enc;             /* allgather: world * ebytes; cast16/values: ebytes */
    size_t ebytes;            /* one rank's encoding, header included */
    uint64_t wire;            /* bytes this rank sends per run */
    bool ef;                  /* error feedback on */
};

void (*dt__callreduce_tamper)(int rank, uint8_t *buf, size_t len) = NULL;

dt_callreduce_config dt_callreduce_config_default(void) {
    return (dt_callreduce_config){.ef = DT_EF_DEFAULT};
}

void dt_callreduce_destroy(dt_callreduce *c) {
    if (!c)
        return;
    dt_compressor_destroy(c->comp);
    dt_powersgd_bucket_destroy(c->psgd);
    dt_free(c->enc);
    dt_free(c);
}

/* Ring volume of an allreduce of `bytes`: reduce-scatter plus allgather. */
static uint64_t ring_bytes(int world, size_t bytes) {
    return world > 1 ? (uint64_t)(2 * (uint64_t)(world - 1) * (uint64_t)bytes / (uint64_t)world)
                     : 0;
}

dt_status dt_callreduce_create(dt_callreduce **out, dt_group *g, const dt_codec_spec *spec,
                               size_t n, const dt_callreduce_config *cfg_in) {
    *out = NULL;
    dt_callreduce_config cfg = cfg_in ? *cfg_in : dt_callreduce_config_default();
    if (!spec || (unsigned)spec->kind >= DT_CODEC_COUNT)
        return dt_error_set(DT_ERR_INVALID, "compressed allreduce: no valid codec given");
    dt_status st = DT_OK;
    dt_callreduce *c = dt_calloc(1, sizeof *c);
    if (!c)
        return dt_error_set(DT_ERR_NOMEM, "compressed allreduce: out of memory");
    c->g = g;
    c->rank = g ? dt_group_rank(g) : 0;
    c->world = g ? dt_group_size(g) : 1;
    c->spec = *spec;
    c->n = n;
    dt_compressor_config cc = dt_compressor_config_default();
    cc.seed = cfg.seed;
    cc.rank = (uint32_t)c->rank;
    cc.bucket = cfg.bucket;
    cc.ef = cfg.ef;
    cc.min_compress = cfg.min_compress;
    switch (spec->kind) {
    case DT_CODEC_NONE: c->algo = CC_PLAIN; break;
    case DT_CODEC_FP16:
    case DT_CODEC_BF16: c->algo = CC_CAST16; break;
    case DT_CODEC_RANDK: c->algo = CC_VALUES; break;
    case DT_CODEC_POWERSGD: c->algo = CC_POWERSGD; break;
    default: c->algo = CC_ALLGATHER; break;
    }
    if (c->algo == CC_PLAIN) {
        c->wire = ring_bytes(c->world, n * sizeof(float));
    } else if (c->algo == CC_POWERSGD) {
        DT_CHECK_GOTO(
            dt_powersgd_bucket_create(&c->psgd, spec->rank, n, cfg.tensors, cfg.ntensors, &cc), st,
            fail);
        size_t np, nq;
        (void)dt_powersgd_bucket_p(c->psgd, &np);
        (void)dt_powersgd_bucket_q(c->psgd, &nq);
        c->wire =
            ring_bytes(c->world, np * sizeof(float)) + ring_bytes(c->world, nq * sizeof(float));
        c->ef = cfg.ef != DT_EF_OFF; /* as dt_powersgd_bucket_create decides */
    } else {
        DT_CHECK_GOTO(dt_compressor_create(&c->comp, spec, n, &cc), st, fail);
        c->ebytes = dt_compressor_encoded_bytes(c->comp);
        c->ef = dt_compressor_error_feedback(c->comp);
        size_t copies = c->algo == CC_ALLGATHER ? (size_t)c->world : 1, total;
        if (!dt_mul_size(c->ebytes, copies, &total)) {
            st = dt_error_set(DT_ERR_NOMEM, "compressed allreduce: %zu x %zu bytes overflows",
                              c->ebytes, copies);
            goto fail;
        }
        c->enc = dt_alloc(total ? total : 1);
        if (!c->enc) {
            st = dt_error_set(DT_ERR_NOMEM, "compressed allreduce: cannot allocate %zu bytes",
                              total);
            goto fail;
        }
        if (c->algo == CC_CAST16)
            c->wire = ring_bytes(c->world, n * 2);
        else if (c->algo == CC_VALUES)
            c->wire = ring_bytes(c->world, dt_codec_k(spec, n) * sizeof(float));
        else
            c->wire = (uint64_t)(c->world - 1) * c->ebytes;
    }
    *out = c;
    return DT_OK;
fail:
    dt_callreduce_destroy(c);
    return st;
}

uint64_t dt_callreduce_wire_bytes(const dt_callreduce *c) { return c->wire; }

const char *dt_callreduce_algo(const dt_callreduce *c) { return algo_names[c->algo]; }

bool dt_callreduce_error_feedback(const dt_callreduce *c) { return c->ef; }

static bool communicates(const dt_callreduce *c) { return c->g && c->world > 1; }

static void scale(float *x, size_t n, int world) {
    if (world == 1)
        return;
    const float s = 1.0f / (float)world;
    for (size_t i = 0; i < n; i++)
        x[i] *= s;
}

static dt_status run_allgather(dt_callreduce *c, float *data, uint64_t step) {
    const size_t E = c->ebytes;
    uint8_t *mine = c->enc + (size_t)c->rank * E;
    size_t used;
    DT_CHECK(dt_compressor_compress(c->comp, data, step, mine, E, &used));
    DT_ASSERT(used == E);
    if (dt__callreduce_tamper)
        dt__callreduce_tamper(c->rank, mine, E);
    if (communicates(c))
        DT_CHECK(dt_group_allgather(c->g, c->enc, c->enc, E, DT_U8));
    /* Every rank adds the same encodings in the same order: identical bits. */
    for (int r = 0; r < c->world; r++) {
        dt_status st = dt_codec_decode(c->enc + (size_t)r * E, E, c->n, data,
                                       r == 0 ? DT_DECODE_SET : DT_DECODE_ADD);
        if (st != DT_OK) {
            dt_error_prefix("encoding from rank %d", r);
            return st;
        }
    }
    scale(data, c->n, c->world);
    return DT_OK;
}

static dt_status run_cast16(dt_callreduce *c, float *data, uint64_t step) {
    size_t used;
    DT_CHECK(dt_compressor_compress(c->comp, data, step, c->enc, c->ebytes, &used));
    uint8_t *payload = c->enc + DT_COMPRESS_HEADER_BYTES;
    if (communicates(c))
        DT_CHECK(dt_group_allreduce(c->g, payload, payload, c->n,
                                    c->spec.kind == DT_CODEC_FP16 ? DT_F16 : DT_BF16, DT_SUM));
    /* The header is ours and the payload any 16-bit pattern: the summed
     * buffer is a valid encoding of the sum. */
    DT_CHECK(dt_codec_decode(c->enc, used, c->n, data, DT_DECODE_SET));
    scale(data, c->n, c->world);
    return DT_OK;
}

static dt_status run_values(dt_callreduce *c, float *data, uint64_t step) {
    size_t used;
    DT_CHECK(dt_compressor_compress(c->comp, data, step, c->enc, c->ebytes, &used));
    size_t k = dt_codec_k(&c->spec, c->n);
    /* randk payload: 24 bytes that regenerate the indices, then f32 values;
     * the buffer comes from dt_alloc, so the values are 4-byte aligned. */
    float *values = (float *)(void *)(c->enc + DT_COMPRESS_HEADER_BYTES + 24);
    DT_ASSERT(used == DT_COMPRESS_HEADER_BYTES + 24 + k * sizeof(float));
    if (communicates(c))
        DT_CHECK(dt_group_allreduce(c->g, values, values, k, DT_F32, DT_SUM));
    DT_CHECK(dt_codec_decode(c->enc, used, c->n, data, DT_DECODE_SET));
    scale(data, c->n, c->world);
    return DT_OK;
}

static dt_status run_powersgd(dt_callreduce *c, float *data, uint64_t step) {
    size_t np, nq;
    DT_CHECK(dt_powersgd_bucket_begin(c->psgd, data, step));
    float *P = dt_powersgd_bucket_p(c->psgd, &np);
    dt_status st = DT_OK;
    if (communicates(c))
        DT_CHECK_GOTO(dt_group_allreduce(c->g, P, P, np, DT_F32, DT_SUM), st, abandon);
    DT_CHECK_GOTO(dt_powersgd_bucket_middle(c->psgd), st, abandon);
    float *Q = dt_powersgd_bucket_q(c->psgd, &nq);
    if (communicates(c))
        DT_CHECK_GOTO(dt_group_allreduce(c->g, Q, Q, nq, DT_F32, DT_SUM), st, abandon);
    return dt_powersgd_bucket_end(c->psgd, 1.0f / (float)c->world, data);
abandon:
    /* Leave the bucket usable (idle) after a failed collective; its Q and
     * residual are then those of the previous step. */
    dt__powersgd_bucket_abandon(c->psgd);
    return st;
}

dt_status dt_callreduce_run(dt_callreduce *c, float *data, uint64_t step) {
    if (c->n > 0 && !data)
        return dt_error_set(DT_ERR_INVALID, "compressed allreduce: data is NULL");
    switch (c->algo) {
    case CC_PLAIN:
        if (communicates(c) && c->n > 0)
            DT_CHECK(dt_group_allreduce(c->g, data, data, c->n, DT_F32, DT_SUM));
        scale(data, c->n, c->world); /* as every other codec: sum, then * (1/W) */
        return DT_OK;
    case CC_CAST16: return run_cast16(c, data, step);
    case CC_ALLGATHER: return run_allgather(c, data, step);
    case CC_VALUES: return run_values(c, data, step);
    case CC_POWERSGD: return run_powersgd(c, data, step);
    }
    return DT_ERR_INTERNAL;
}

size_t dt_callreduce_state_bytes(const dt_callreduce *c) {
    if (c->psgd)
        return dt_powersgd_bucket_state_bytes(c->psgd);
    return c->comp ? dt_compressor_state_bytes(c->comp) : 0;
}

dt_status dt_callreduce_get_state(const dt_callreduce *c, void *buf, size_t len) {
    if (c->psgd)
        return dt_powersgd_bucket_get_state(c->psgd, buf, len);
    if (c->comp)
        return dt_compressor_get_state(c->comp, buf, len);
    return DT_OK;
}

dt_status dt_callreduce_set_state(dt_callreduce *c, const void *buf, size_t len) {
    if (c->psgd)
        return dt_powersgd_bucket_set_state(c->psgd, buf, len);
    if (c->comp)
        return dt_compressor_set_state(c->comp, buf, len);
    if (len != 0)
        return dt_error_set(DT_ERR_INVALID,
                            "compressed allreduce state: %zu bytes given, codec %s has none", len,
                            dt_codec_get_info(c->spec.kind)->name);
    return DT_OK;
}

void dt_callreduce_reset(dt_callreduce *c) {
    if (c->comp)
        dt_compressor_reset(c->comp);
    if (c->psgd)
        dt__powersgd_bucket_reset(c->psgd);
}
