/*
 * dtrain/parallel.h — data parallelism (DDP) over one flat gradient buffer.
 *
 * Overview
 * --------
 * Every rank holds the whole model and computes gradients on its own part
 * of the global batch; before the optimizer step the gradients are averaged
 * over the ranks. The gradient buffer is cut into buckets — flat ranges of
 * about `bucket_bytes` — numbered in the order backward finishes them: the
 * model's layer-major layout finishes gradients from the END of the buffer
 * towards the front, so bucket 0 is the tail. The model's backward hook
 * (dt_ddp_grad_ready) reports how far the final gradients reach; every
 * bucket that is then complete starts its non-blocking allreduce at once, so
 * the reduction of late layers overlaps the backward of early ones.
 * dt_ddp_finish() waits for the buckets in order and hands each averaged
 * range to a callback, so an optimizer that does not need the global norm
 * can update bucket k while bucket k+1 is still on the wire.
 *
 *     bucket:   |   3   |   2   |   1   |   0   |     grads[0 .. n)
 *     backward: <------------------------------- (finishes from the end)
 *     comm:                  [0]   [1]   [2] [3]   (starts as each completes)
 *
 * With K micro-batches of gradient accumulation only the last backward
 * communicates (dt_ddp_begin(d, true) on the last, false before).
 *
 * Wire format (dt_ddp_options). By default a bucket is allreduced as fp32
 * by comm's progress thread. grad_dtype bf16/fp16 allreduces it in that
 * type (comm adds in fp32 and rounds once per hop); a codec sends it
 * through a compressed allreduce (dt_callreduce, one per bucket, with this
 * rank's error-feedback residual). Both run on a DDP worker thread that
 * takes the buckets in launch order — so every rank issues the same
 * collectives in the same order — while backward continues: encoding,
 * decoding and PowerSGD's products overlap the backward pass like the
 * plain allreduce does. PowerSGD sees the bucket through the model's
 * tensor shapes (options.tensors): the whole rows of each matrix that lie
 * in the bucket form one matrix, the rest (partial rows, vectors, small
 * tensors) travels uncompressed. Without shapes a bucket of m values is
 * viewed as one matrix of ceil(sqrt(m)) columns.
 * The codec state (residuals, PowerSGD's Q, the step that keys the random
 * numbers) is this rank's: dt_ddp_get_state / dt_ddp_set_state save and
 * restore it for checkpoints.
 *
 * Timing. comm_ms is the time during which a bucket's allreduce was in
 * flight (from its start, or the end of the previous bucket, to its observed
 * completion; completion is observed at each backward hook and in finish, so
 * it is exact to one transformer block). exposed_comm_ms is the time the
 * caller spent blocked waiting for communication after backward: the part
 * not hidden behind computation.
 *
 * Example
 * -------
 *     dt_ddp *d;
 *     DT_CHECK(dt_ddp_create(&d, group, params, grads, n, 25u << 20));
 *     DT_CHECK(dt_ddp_broadcast_params(d));
 *     for (step...) {
 *         for (k = 0; k < K; k++) {
 *             forward(...);
 *             dt_ddp_begin(d, k == K - 1);
 *             backward(model, 1.0f / K, dt_ddp_grad_ready, d);
 *         }
 *         DT_CHECK(dt_ddp_finish(d, update_range, &opt));  // averaged grads
 *     }
 *
 *     // Compressed: top-1% with error feedback, one compressor per bucket.
 *     dt_ddp_options o = dt_ddp_options_default();
 *     DT_CHECK(dt_codec_parse("--compress", "topk:0.01", &o.codec));
 *     o.seed = seed;
 *     DT_CHECK(dt_ddp_create_with(&d, group, params, grads, n, &o));
 *     ... the same loop; dt_ddp_last_stats(d)->bytes_sent is the encoded size;
 *     checkpoints save dt_ddp_get_state() of every rank ...
 */
#ifndef DTRAIN_PARALLEL_H
#define DTRAIN_PARALLEL_H

#include "dtrain/comm.h"
#include "dtrain/compress.h"
#include "dtrain/core.h"
#include "dtrain/nn.h"
#include "dtrain/optim.h"

#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------ */
/* Device mesh: the dp x tp x pp x cp layout of the world                   */
/* ------------------------------------------------------------------------ */
/*
 * The world's ranks form a grid with one axis per kind of parallelism:
 * dp (data), tp (tensor), pp (pipeline), cp (context). A rank's coordinate
 * on each axis follows from its world rank by one formula; with the axes
 * listed fastest-varying first in `order` (default tp, cp, dp, pp, as in
 * Megatron-LM), and d(a) the degree of axis a:
 *
 *     rank = c(order[0]) + d(order[0]) * (c(order[1]) + d(order[1]) *
 *            (c(order[2]) + d(order[2]) * c(order[3])))
 *
 * so with the default order tp is fastest: the ranks of one tp group are
 * consecutive and, launched host by host, stay on one host (the mesh warns
 * when they do not). For every axis a rank belongs to one group: the ranks
 * that share all its other coordinates, ordered by their coordinate on the
 * axis (group rank == coordinate). An axis of degree 1 gives a group of one.
 *
 *     dp 2 x tp 2, order tp-cp-dp-pp:   world rank  0   1   2   3
 *                                       tp coord    0   1   0   1
 *                                       dp coord    0   0   1   1
 *     tp groups {0,1} {2,3}; dp groups {0,2} {1,3}.
 *
 * The mesh is the only code that knows the rank order. Ownership: the mesh
 * borrows the world group (which must outlive it) and owns its axis groups.
 */

typedef enum dt_axis { DT_AXIS_DP, DT_AXIS_TP, DT_AXIS_PP, DT_AXIS_CP, DT_AXIS_COUNT } dt_axis;

/* "dp", "tp", "pp", "cp" (indexable by dt_axis). */
extern const char *const dt_axis_names[DT_AXIS_COUNT];

typedef struct dt_mesh_shape {
    int degree[DT_AXIS_COUNT];    /* ranks along each axis, >= 1 */
    dt_axis order[DT_AXIS_COUNT]; /* a permutation of the axes, fastest-varying first */
} dt_mesh_shape;

/* Every degree 1, order tp-cp-dp-pp. */
dt_mesh_shape dt_mesh_shape_default(void);
/* Parse an order "tp-cp-dp-pp" (each axis once); DT_ERR_INVALID names knob and text. */
dt_status dt_mesh_order_parse(const char *knob, const char *text, dt_axis order[DT_AXIS_COUNT]);
/* Degrees >= 1 whose product is `world`, order a permutation; DT_ERR_INVALID
 * names the axes and the numbers otherwise. */
dt_status dt_mesh_shape_validate(const dt_mesh_shape *s, int world);
/* The formula above, and its inverse. */
int dt_mesh_rank_of(const dt_mesh_shape *s, const int coord[DT_AXIS_COUNT]);
void dt_mesh_coords_of(const dt_mesh_shape *s, int rank, int coord[DT_AXIS_COUNT]);
/* "dp 2 x tp 2" (axes of degree > 1 in the order dp, tp, pp, cp; "1 rank"
 * when there are none); returns buf. */
char *dt_mesh_format(const dt_mesh_shape *s, char *buf, size_t len);

typedef struct dt_mesh dt_mesh;

/* Collective over `world` (every rank calls it with the same shape): split
 * the world into one group per axis. world may be NULL for a single
 * process (every degree 1; the axis groups are then NULL too). */
dt_status dt_mesh_create(dt_mesh **out, dt_group *world, const dt_mesh_shape *s);
void dt_mesh_destroy(dt_mesh *m);

const dt_mesh_shape *dt_mesh_get_shape(const dt_mesh *m);
dt_group *dt_mesh_world(const dt_mesh *m);
/* This rank's group along axis a (NULL in a single process). */
dt_group *dt_mesh_group(const dt_mesh *m, dt_axis a);
int dt_mesh_coord(const dt_mesh *m, dt_axis a);
int dt_mesh_degree(const dt_mesh *m, dt_axis a);
int dt_mesh_rank(const dt_mesh *m);
int dt_mesh_size(const dt_mesh *m);
/* The replicas of this rank's parameters: the ranks of its dp x cp plane
 * (same tp and pp coordinates), which average their gradients (a
 * context-parallel rank's gradient is that of its share of the tokens) and
 * shard ZeRO's state. Its rank is dp coordinate x cp degree + cp
 * coordinate; without cp it is the dp group itself (NULL in a single
 * process). */
dt_group *dt_mesh_replica_group(const dt_mesh *m);
int dt_mesh_replica_rank(const dt_mesh_shape *s, const int coord[DT_AXIS_COUNT]);
int dt_mesh_replica_size(const dt_mesh_shape *s);

/* ------------------------------------------------------------------------ */
/* Data parallelism: the bucket engine (see the overview)                   */
/* ------------------------------------------------------------------------ */

#define DT_DDP_DEFAULT_BUCKET_BYTES (25u << 20)
#define DT_DDP_DEFAULT_PIECE_BYTES  (4u << 20)

/*
 * Priority. With DT_COMM_PRIORITY_CRITICAL the buckets are not sent in the
 * order backward finishes them (the tail of the buffer first) but front
 * first, in pieces of piece_bytes: before each piece the ranks agree (one
 * 8-byte allreduce) on how far every rank's backward has got, and the
 * lowest-offset agreed piece not yet sent goes next, so a region that
 * became final pre-empts the rest of an earlier one and regions final
 * together go as one run (ByteScheduler's idea). Once backward is over the
 * rest goes front to back, so the next forward can start on its first
 * layers while the last are on the wire: dt_ddp_finish_later returns at
 * once, and the next forward takes each layer's buckets (dt_ddp_take) just
 * before it reads them. Each element is reduced by the same collective as
 * in FIFO, only cut differently, so the results are the same bits whenever
 * the reduction of an element does not depend on where the vector is cut:
 * on 2 ranks (a sum of two is commutative), on one host (direct: rank
 * order) and with DT_DETERMINISTIC. (With 3+ ranks over TCP ring and
 * halving-doubling reduce each block in an order set by its place in the
 * vector: equally exact, other bits.)
 */
typedef enum dt_comm_priority {
    DT_COMM_PRIORITY_FIFO,
    DT_COMM_PRIORITY_CRITICAL,
    DT_COMM_PRIORITY_COUNT
} dt_comm_priority;
/* "fifo", "critical" (indexable by dt_comm_priority). */
extern const char *const dt_comm_priority_names[DT_COMM_PRIORITY_COUNT];

/* One piece of a critical schedule: [begin, end) of the buffer, sent from
 * t_start to t_end (dt_now). */
typedef struct dt_ddp_piece {
    size_t begin, end;
    double t_start, t_end;
} dt_ddp_piece;

typedef struct dt_ddp dt_ddp;

/* Communication statistics of the last finished step. */
typedef struct dt_ddp_stats {
    double comm_ms;           /* time a bucket allreduce was in flight */
    double exposed_comm_ms;   /* time spent blocked waiting for it after backward */
    uint64_t bytes_sent;      /* bytes this rank sent: the encoded sizes under the codec's
                                 schedule (dt_callreduce_wire_bytes); plain f32/16-bit:
                                 2 (N-1)/N per reduced byte (ring volume) */
    int buckets;              /* buckets reduced */
    int launched_in_backward; /* of which started before backward ended */
} dt_ddp_stats;

/* Called with each averaged range [begin, end) of the gradient buffer, in
 * bucket order (from the end of the buffer to the front). */
typedef void (*dt_ddp_range_fn)(void *user, size_t begin, size_t end);

/* A DDP context for `n` floats of params/grads (borrowed, must outlive it).
 * `g` may be NULL or a group of size 1: then nothing is communicated and
 * finish only calls the callback. bucket_bytes >= 4. */
dt_status dt_ddp_create(dt_ddp **out, dt_group *g, float *params, float *grads, size_t n,
                        size_t bucket_bytes);

typedef struct dt_ddp_options {
    size_t bucket_bytes; /* >= 4 */
    dt_dtype grad_dtype; /* DT_F32, DT_BF16 or DT_F16: dtype of the bucket allreduce */
    dt_codec_spec codec; /* DT_CODEC_NONE: no compression; otherwise grad_dtype must be f32 */
    dt_ef_mode ef;       /* error feedback of the codec */
    uint64_t seed;       /* keys the codecs' random numbers (same on every rank) */
    /* The tensors of the gradient buffer, (offset, rows, cols) in buffer
     * coordinates (borrowed during create only). PowerSGD compresses their
     * matrices (NULL: each bucket is viewed as one matrix); dense_below
     * needs them. */
    const dt_powersgd_tensor *tensors;
    size_t ntensors;
    /* With a codec or a 16-bit grad_dtype: tensors of fewer than
     * dense_below values (biases, LayerNorm gains, small embeddings) are
     * averaged exactly, as fp32. PowerSGD sends them uncompressed in its P
     * buffer (min_compress); the other codecs see zeros there (their
     * residual stays zero) and each bucket's such values follow in one
     * plain f32 allreduce. No effect on a plain fp32 allreduce. 0: off. */
    size_t dense_below;
    /* Called with each bucket's final gradients, [begin, end) of the
     * buffer, just before its allreduce starts (in the thread running
     * backward): 1-bit Adam turns them into its momentum mix there
     * (dt_optimizer_premix). NULL: nothing. */
    void (*prepare)(void *user, size_t begin, size_t end);
    void *prepare_user;
    /* ZeRO: every bucket is reduce-scattered instead of allreduced: replica
     * r receives the average of its piece only (dt_ddp_shard_ranges), and
     * finish() hands fn that piece. The parameters are then made whole
     * again by dt_ddp_gather. With a codec or a 16-bit grad_dtype, each
     * bucket's compressed reduce-scatter (dt_callreduce_config.scatter).
     * No prepare callback. */
    bool shard;
    /* Sharded: once a bucket's reduce-scatter completed (during backward or
     * in finish), the memory of the whole gradient pages outside this
     * replica's piece is returned to the system (ZeRO stage 2); the next
     * backward must overwrite the buffer. */
    bool release;
    /* The order of communication (see "Priority" below): FIFO (the order
     * backward finishes the buckets) or critical (the front of the buffer,
     * which the next forward reads first, first; pieces of piece_bytes).
     * Critical: plain f32 only (no codec, no 16-bit dtype, not sharded). */
    dt_comm_priority priority;
    size_t piece_bytes; /* critical: the unit of pre-emption, >= 4 (0: 4 MiB) */
    /* Adaptive compression (--compress auto): 2..DT_CODEC_AUTO_MAX candidate
     * codecs (borrowed during create), one chosen per bucket and step by
     * dt_codec_auto_choose from the link, compute window and codec times
     * the ranks measured and agreed (a small allreduce at each
     * dt_ddp_begin(d, true)); a switch carries the old codec's residual
     * into the new one's run. codec must be none, f32, FIFO, not sharded.
     * NULL: off. */
    const dt_codec_auto *auto_codecs;
} dt_ddp_options;

/* Sharded buckets (dt_ddp_options.shard): the buckets of n floats cut by
 * bucket_bytes (rounded down to a multiple of dp values), numbered from the
 * end of the buffer, each cut into dp equal pieces; replica `rank` owns
 * piece `rank` of each, the last replica also a bucket's remainder of
 * fewer than dp values. Writes this rank's pieces to out (sorted by offset,
 * one per bucket: at most dt_ddp_shard_count) and returns their number. */
size_t dt_ddp_shard_count(size_t n, size_t bucket_bytes, int dp);
size_t dt_ddp_shard_ranges(size_t n, size_t bucket_bytes, int dp, int rank, dt_range *out);

/* Planning (dtrain plan memory): the bytes the buckets' codecs of a DDP
 * (or ZeRO, o->shard) over `world` ranks allocate for n floats
 * (dt_callreduce_plan_bytes per bucket, cut as create cuts them); 0 for a
 * plain f32 wire. */
dt_status dt_ddp_plan_bytes(size_t n, const dt_ddp_options *o, int world, size_t *out);

/* bucket_bytes DT_DDP_DEFAULT_BUCKET_BYTES, f32, no codec, EF auto, seed 0. */
dt_ddp_options dt_ddp_options_default(void);

/* dt_ddp_create with a wire format (see the overview). Allocates every
 * codec buffer; rejects a 16-bit grad_dtype combined with a codec. */
dt_status dt_ddp_create_with(dt_ddp **out, dt_group *g, float *params, float *grads, size_t n,
                             const dt_ddp_options *o);

/* This rank's codec state (residuals, PowerSGD's Q, the codec step): 0
 * bytes without a codec. set requires exactly state_bytes, taken from a
 * DDP of the same codec, size, buckets and group size, and no step in
 * flight. dt_ddp_reset_state forgets it (zero residuals). */
size_t dt_ddp_state_bytes(const dt_ddp *d);
dt_status dt_ddp_get_state(const dt_ddp *d, void *buf, size_t len);
dt_status dt_ddp_set_state(dt_ddp *d, const void *buf, size_t len);
void dt_ddp_reset_state(dt_ddp *d);
/* Multiply every error-feedback residual by `factor`. Gradients reach DDP
 * multiplied by the loss scale; when the scale changes from S to S' (after
 * an overflow or a growth interval), call this with S'/S before the next
 * step so that the residuals stay in the gradients' units. A step whose
 * averaged gradient is non-finite (an overflow) already leaves the state
 * untouched. */
void dt_ddp_scale_state(dt_ddp *d, float factor);
/* Dense warm-up (PyTorch powerSGD_hook's start_powerSGD_iter, DGC's
 * warm-up): while `dense` is set, the steps of a DDP with a codec average
 * every bucket as a plain fp32 allreduce and leave the codec state
 * (residuals, Q) untouched, so error feedback starts from zero residuals
 * at the first compressed step. Set between steps (not during one); the
 * trainer sets it for its first --compress-start steps. No effect without
 * a codec. */
void dt_ddp_set_dense(dt_ddp *d, bool dense);
/* Top-k density ramp (Deep Gradient Compression's exponentially increasing
 * sparsity): from the next step on, every bucket keeps this fraction of its
 * values, in (0, 1]; 0 goes back to the codec's own k. Set between steps;
 * encodings and bytes_sent follow. No effect without a codec or in a
 * world of one; DT_ERR_INVALID for a codec other than topk. */
dt_status dt_ddp_set_fraction(dt_ddp *d, double fraction);
void dt_ddp_destroy(dt_ddp *d);

size_t dt_ddp_num_buckets(const dt_ddp *d);
/* Bytes this rank sends in one communicating step with the current
 * settings (codec, density, dense warm-up): what bytes_sent will say. */
uint64_t dt_ddp_step_bytes(const dt_ddp *d);
/* Adaptive compression: the choice of the current (or last) step, one
 * codec per bucket in bucket order with runs merged ("none*12,int8*7"),
 * and the agreed link estimate in bytes/s (0: none yet). NULL when not
 * adaptive. */
const char *dt_ddp_codec_choice(const dt_ddp *d, double *link_bytes_per_s);
/* Bucket i's range [*begin, *end) (i = 0 is the tail of the buffer). */
void dt_ddp_bucket(const dt_ddp *d, size_t i, size_t *begin, size_t *end);

/* Copy rank 0's parameters to every rank. */
dt_status dt_ddp_broadcast_params(dt_ddp *d);
/* Broadcast any other flat buffer from rank 0 (optimizer state on resume). */
dt_status dt_ddp_broadcast(dt_ddp *d, void *buf, size_t count, dt_dtype dtype);

/* Hash the parameters on every rank and compare: DT_ERR_MISMATCH naming the
 * step and the first rank whose parameters differ from rank 0's. */
dt_status dt_ddp_check_params(dt_ddp *d, int64_t step);

/* Start a backward pass; `sync` = this backward's gradients are final for
 * the step (the last micro-batch) and must be communicated. */
void dt_ddp_begin(dt_ddp *d, bool sync);

/* The model's backward hook (dt_grad_ready_fn): grads[ready_from .. n) are
 * final. Starts every bucket that became complete. Errors are kept and
 * returned by dt_ddp_finish. */
void dt_ddp_grad_ready(void *user, size_t ready_from);

/* Start what is not started yet, wait for each bucket in order, and call
 * fn (may be NULL) on each averaged range. Fills the step's stats. */
dt_status dt_ddp_finish(dt_ddp *d, dt_ddp_range_fn fn, void *user);

const dt_ddp_stats *dt_ddp_last_stats(const dt_ddp *d);

/* Critical priority (see "Priority"): finish without waiting. Starts what
 * is not started and returns; the buckets complete in the background,
 * front first. Until every bucket is handed out (take, settle), the
 * gradient buffer stays borrowed; dt_ddp_begin(d, true) needs it settled.
 * Stats: dt_ddp_last_stats is complete after settle. */
dt_status dt_ddp_finish_later(dt_ddp *d);
/* Wait until each bucket intersecting [begin, end) is averaged and call fn
 * on those not handed out yet (in bucket order). Nothing pending: no-op. */
dt_status dt_ddp_take(dt_ddp *d, size_t begin, size_t end, dt_ddp_range_fn fn, void *user);
/* Take every bucket left; then the step's stats are complete. */
dt_status dt_ddp_settle(dt_ddp *d, dt_ddp_range_fn fn, void *user);
/* Buckets of a finish_later not handed out yet. */
bool dt_ddp_pending(const dt_ddp *d);
/* Milliseconds the caller spent blocked in finish, take and settle since
 * the last call (which resets it). */
double dt_ddp_take_blocked_ms(dt_ddp *d);
/* When the last step's last bucket was averaged (dt_now; 0 before one). */
double dt_ddp_comm_done_at(const dt_ddp *d);
/* Critical: the last step's pieces in the order sent, and how many
 * readiness agreements it took; NULL and 0 under FIFO. Valid until the
 * next dt_ddp_begin(d, true). */
const dt_ddp_piece *dt_ddp_pieces(const dt_ddp *d, size_t *count, int *agreements);

/* Sharded buckets, after finish: make bucket i's parameters whole again
 * from every replica's updated piece (an in-place allgather, started at
 * once), and wait for every gather started. */
dt_status dt_ddp_gather(dt_ddp *d, size_t i);
dt_status dt_ddp_gather_wait(dt_ddp *d);
/* ZeRO 3: wait for bucket i's gather alone; return the memory of bucket
 * i's parameter pages outside this replica's piece (they read as zero
 * until gathered again). */
dt_status dt_ddp_gather_wait_bucket(dt_ddp *d, size_t i);
void dt_ddp_release_params(dt_ddp *d, size_t i);

/* Average `count` doubles over the ranks in place (losses, metrics). */
dt_status dt_ddp_average(dt_ddp *d, double *values, size_t count);

/* ------------------------------------------------------------------------ */
/* Tensor parallelism: the model's communication points over the tp group   */
/* ------------------------------------------------------------------------ */
/*
 * dt_tp implements nn's dt_tp_regions (Megatron's copy-to / reduce-from /
 * gather-from / scatter-to region operators, nn.h) over one tensor-parallel
 * group: every allreduce, all-gather and reduce-scatter a shard of the
 * model needs. The sums give the same bits on every rank of the group (a
 * property of dtrain's collectives), so activations that every rank holds
 * whole stay identical. Ownership: borrows the group.
 *
 *     dt_tp *tp;
 *     DT_CHECK(dt_tp_create(&tp, dt_mesh_group(mesh, DT_AXIS_TP)));
 *     opt.part = (dt_gpt_part){.tp_rank = r, .tp_size = n, .sequence_parallel = sp,
 *                              .regions = dt_tp_regions_of(tp)};
 *     DT_CHECK(dt_gpt_create_with(&model, &cfg, B, T, &opt));
 */
typedef struct dt_tp dt_tp;

dt_status dt_tp_create(dt_tp **out, dt_group *group);
void dt_tp_destroy(dt_tp *t);
const dt_tp_regions *dt_tp_regions_of(const dt_tp *t);
/* Bytes this rank sent through the regions since the last call; resets. */
uint64_t dt_tp_take_bytes(dt_tp *t);

/* ------------------------------------------------------------------------ */
/* Context parallelism: the model's communication points over the cp group  */
/* ------------------------------------------------------------------------ */
/*
 * dt_cp implements nn's dt_cp_regions (nn.h, "Context parallelism") over
 * one context-parallel group: Ulysses' all-to-all, the ring's neighbour
 * shifts (two channels, each one transfer in flight, posted as one
 * send/receive batch so a rank's send and receive never wait for each
 * other), and the loss sum. Ownership: borrows the group; a shift in
 * flight borrows its buffers until its wait.
 *
 *     dt_cp *cp;
 *     DT_CHECK(dt_cp_create(&cp, dt_mesh_group(mesh, DT_AXIS_CP)));
 *     opt.part.cp_rank = dt_mesh_coord(mesh, DT_AXIS_CP);
 *     opt.part.cp_size = dt_mesh_degree(mesh, DT_AXIS_CP);
 *     opt.part.cp_mode = DT_CP_RING;
 *     opt.part.cp_regions = dt_cp_regions_of(cp);
 */
typedef struct dt_cp dt_cp;

dt_status dt_cp_create(dt_cp **out, dt_group *group);
/* Waits for (and ignores the result of) any shift still in flight. */
void dt_cp_destroy(dt_cp *c);
const dt_cp_regions *dt_cp_regions_of(const dt_cp *c);
/* Bytes this rank sent through the regions since the last call; resets. */
uint64_t dt_cp_take_bytes(dt_cp *c);

/* ------------------------------------------------------------------------ */
/* Pipeline schedules: tables of actions, checked before they run           */
/* ------------------------------------------------------------------------ */
/*
 * A pipeline schedule is data: for every pipeline rank, the ordered list of
 * what it does. The model's layers are split into S = P x V consecutive
 * virtual stages (P ranks, V chunks per rank; V > 1 only for interleaving);
 * virtual stage s = chunk x P + rank (Megatron's interleaved placement), so
 * s and s + 1 are always on different ranks when P > 1. Actions:
 *
 *   F(mb, c)          forward of micro-batch mb through this rank's chunk c
 *   B(mb, c)          its backward: the input gradient (and, unless the
 *                     schedule splits W off, the weight gradient)
 *   W(mb, c)          the weight gradient alone (zero-bubble schedules)
 *   send-act / recv-act (mb, c, peer)    the output of stage s to the rank of
 *                     stage s + 1 / the input of stage s from the rank of s - 1
 *   send-grad / recv-grad (mb, c, peer)  the input gradient of stage s to the
 *                     rank of s - 1 / the output gradient from the rank of s + 1
 *
 * Consecutive transfers in a rank's list are posted together, without
 * waiting: activations through one comm group, gradients through another
 * (dt_group_isendrecv_batch on each), so a run is up to two batches. A group
 * completes a rank's batches in order; a compute action waits for the batch
 * that brings its input; the step ends when every batch is done. These are
 * the semantics the checker simulates and the executor runs. Generators: GPipe
 * (every forward, then every backward), 1F1B (PipeDream-flush: P - r - 1
 * warm-up forwards on rank r, then one forward one backward), interleaved
 * 1F1B (Megatron, V chunks per rank; M must be a multiple of P), zero-bubble
 * ZB-H1 (Qi et al. 2023: B and W split, W placed in the bubbles 1F1B leaves,
 * at most 1F1B's live activations per rank).
 *
 * dt_pp_check verifies a table before anything runs: every action well
 * formed and each F, B (and W) once per micro-batch and chunk, in order;
 * every transfer's peer the rank of the neighbouring stage; every send
 * matched by exactly one receive (per pair of ranks, in order, same kind,
 * micro-batch and stage); and, by simulating those semantics with the
 * given durations, that it cannot deadlock. It reports each rank's peak
 * live activations (micro-batch chunks forwarded and not yet finished
 * backward), the timeline and the bubble fraction. A broken table is
 * refused with DT_ERR_INVALID naming the first offending action.
 */

typedef enum dt_pp_kind {
    DT_PP_GPIPE,
    DT_PP_1F1B,
    DT_PP_INTERLEAVED,
    DT_PP_ZB,
    DT_PP_KIND_COUNT
} dt_pp_kind;

/* "gpipe", "1f1b", "interleaved", "zb" (indexable by dt_pp_kind). */
extern const char *const dt_pp_kind_names[DT_PP_KIND_COUNT];
/* Parse "gpipe", "1f1b", "interleaved:V" (V >= 2) or "zb"; *chunks gets V
 * (1 otherwise). DT_ERR_INVALID names the knob and the text. */
dt_status dt_pp_kind_parse(const char *knob, const char *text, dt_pp_kind *kind, int *chunks);

typedef enum dt_pp_op {
    DT_PP_F,
    DT_PP_B,
    DT_PP_W,
    DT_PP_SEND_ACT,
    DT_PP_RECV_ACT,
    DT_PP_SEND_GRAD,
    DT_PP_RECV_GRAD,
    DT_PP_OP_COUNT
} dt_pp_op;

/* "F", "B", "W", "send-act", "recv-act", "send-grad", "recv-grad". */
extern const char *const dt_pp_op_names[DT_PP_OP_COUNT];

typedef struct dt_pp_action {
    uint8_t op;     /* dt_pp_op */
    uint8_t pad;    /* zero */
    uint16_t chunk; /* this rank's chunk, < V */
    uint32_t mb;    /* micro-batch, < M */
    int32_t peer;   /* transfers: the pipeline rank on the other side; else -1 */
} dt_pp_action;

typedef struct dt_pp_schedule {
    dt_pp_kind kind;
    int stages;    /* P ranks */
    int chunks;    /* V chunks per rank */
    int micro;     /* M micro-batches per optimizer step */
    bool split_w;  /* B computes input gradients only; W actions follow */
    size_t *start; /* (P + 1): rank r's actions are actions[start[r] .. start[r+1]) */
    dt_pp_action *actions;
} dt_pp_schedule;

/* Generate a schedule. DT_ERR_INVALID names a combination the kind refuses
 * (interleaved: V >= 2 and M a multiple of P; every kind: P, M >= 1). */
dt_status dt_pp_schedule_create(dt_pp_schedule **out, dt_pp_kind kind, int stages, int chunks,
                                int micro);
/* A schedule from explicit per-rank lists (counts[r] actions of rank r, one
 * after another in `actions`): hand-written or edited tables, for
 * dt_pp_check. Copied. */
dt_status dt_pp_schedule_from(dt_pp_schedule **out, dt_pp_kind kind, int stages, int chunks,
                              int micro, bool split_w, const size_t *counts,
                              const dt_pp_action *actions);
void dt_pp_schedule_destroy(dt_pp_schedule *s);
/* The virtual stage of chunk c on rank r, and the inverse. */
int dt_pp_stage_of(const dt_pp_schedule *s, int rank, int chunk);
void dt_pp_place(const dt_pp_schedule *s, int stage, int *rank, int *chunk);

/* The model part pipeline rank `rank` holds: the layer ranges of its
 * chunks, virtual stage s taking blocks [L s / S, L (s + 1) / S) of the
 * model's L (S = stages x chunks). Only part->chunks and part->layers are
 * written (the tensor-parallel fields are the caller's). DT_ERR_INVALID
 * when L < S. */
dt_status dt_pp_model_part(const dt_pp_schedule *s, int layers, int rank, dt_gpt_part *part);

/* Durations for the simulation, relative, of one rank's whole share of the
 * layers: a forward, an input-gradient backward, a weight-gradient pass (a
 * B of a schedule without W costs b + w), and one batch of transfers; an
 * action on one of V chunks takes 1/V of it. Defaults: 1, 1, 1, 0. */
typedef struct dt_pp_costs {
    double f, b, w, comm;
} dt_pp_costs;
dt_pp_costs dt_pp_costs_default(void);

/* What the checker found. Arrays are sized by the schedule (P ranks, and
 * one start/end time per action in the schedule's order). */
typedef struct dt_pp_report {
    int *peak_live;      /* (P) most micro-batch chunks alive at once on each rank */
    int *chunk_live;     /* (P x V) the same per chunk: the slots each chunk's model needs */
    double *start, *end; /* (actions) simulated times */
    double makespan;     /* the step's simulated duration */
    double *busy;        /* (P) compute time of each rank */
    double bubble;       /* idle fraction: 1 - sum(busy) / (P x makespan) */
} dt_pp_report;

/* Check (see above); fills *out (free with dt_pp_report_free) on success. */
dt_status dt_pp_check(const dt_pp_schedule *s, const dt_pp_costs *c, dt_pp_report *out);
void dt_pp_report_free(dt_pp_report *r);
/* The activation slots rank `rank`'s model needs (dt_gpt_options.slots,
 * the same for each chunk): the most micro-batches any of its chunks keeps
 * alive (report->chunk_live). The executor runs in exactly these. */
int dt_pp_slots(const dt_pp_schedule *s, const dt_pp_report *r, int rank);
/* The bubble fraction 1F1B and GPipe have in theory, (P - 1) / (M + P - 1),
 * and interleaved 1F1B's, (P - 1) / (V M + P - 1) (equal F and B+W). */
double dt_pp_theoretical_bubble(dt_pp_kind kind, int stages, int chunks, int micro);
/* The simulated timeline: one row per rank, one column per `unit` of time
 * ("F3" forward of micro-batch 3, "B", "W", ". " idle; chunks as letters
 * a, b, ... with interleaving). */
void dt_pp_timeline_text(const dt_pp_schedule *s, const dt_pp_report *r, double unit, FILE *f);
/* The same as an SVG drawing. */
dt_status dt_pp_timeline_svg(const dt_pp_schedule *s, const dt_pp_report *r, const char *path);

/* ------------------------------------------------------------------------ */
/* Gradient synchronisation: the one interface the training loop calls      */
/* ------------------------------------------------------------------------ */
/*
 * Every strategy that turns this rank's gradients into an optimizer update
 * (DDP today; ZeRO, local SGD, a parameter server later) implements this
 * interface, and the loop calls nothing else of it:
 *
 *     dt_optimizer_begin(opt, step, lr);
 *     dt_grad_sync_begin_step(s, &(dt_sync_step){step, lr, scaling, scale, early});
 *     for (k = 0; k < K; k++) {
 *         forward(...);
 *         mode = dt_grad_sync_begin_backward(s, k == K - 1);
 *         backward(..., mode, dt_grad_sync_ready, s);  // the model's hook
 *     }
 *     dt_grad_sync_finish(s, &res);                 // final gradients, local sums
 *     allreduce res.sumsq, res.found_inf over the world; decide skip and clip
 *     dt_grad_sync_apply(s, skip, clip_scale);
 *     dt_optimizer_end(opt, !skip);
 *
 * finish() leaves the gradients this rank's optimizer needs final: averaged
 * (and unscaled, when the loss was scaled) over the replicas. Compression,
 * 16-bit gradients and the unscaling stay inside the implementation. With
 * update_early (no clipping and no loss scaling, so nothing global decides
 * the update) an implementation may step the optimizer on each range as it
 * becomes final, overlapping the update with the remaining communication;
 * apply() then does nothing. res.sumsq covers the final gradient elements
 * this rank counts: every element of the model is counted by exactly one
 * rank of the world, so the SUM over the world is the global squared norm
 * (replicated tensors are counted once).
 *
 * Ownership: an implementation borrows the parameter and gradient buffers,
 * the groups and the optimizer it was created with; they must outlive it.
 */

typedef struct dt_grad_sync dt_grad_sync;

/* What the loop tells a strategy at the start of an optimizer step. */
typedef struct dt_sync_step {
    int64_t step;      /* 0-based index of this optimizer step */
    float lr;          /* its learning rate (already given to the optimizer) */
    bool loss_scaling; /* the loss was scaled: unscale, and report inf/nan gradients */
    float loss_scale;  /* backward multiplied the loss by this (1 without scaling) */
    bool update_early; /* no clipping, no loss scaling: ranges may be updated as they arrive */
    bool defer;        /* dt_grad_sync_defers said yes: the strategy brackets this step's
                          updates with dt_optimizer_begin/end itself, and finish() may
                          return before the last gradients are averaged */
} dt_sync_step;

/* What finish() reports. */
typedef struct dt_sync_result {
    double sumsq;             /* squared norm of the gradient elements this rank counts */
    bool found_inf;           /* a final gradient of this rank is inf or nan */
    bool updated;             /* the optimizer already stepped (update_early) */
    double comm_ms;           /* time gradient communication was in flight */
    double exposed_comm_ms;   /* time the caller blocked on it after backward */
    uint64_t bytes_sent;      /* gradient bytes this rank sent */
    int collectives;          /* gradient collectives of the step (DDP: buckets) */
    int launched_in_backward; /* of which started before backward ended */
    double consensus;         /* gossip: mean squared distance of the replicas' parameters
                                 to their average, NaN when not measured this step */
    int64_t staleness;        /* parameter server: the largest staleness of this rank's
                                 pushes in the step (by apply_report), -1 for others */
    bool late;                /* deferred step: sumsq and comm_ms are not known yet (the
                                 next finish() or dt_grad_sync_settle reports them) */
    bool has_prev;            /* the previous, deferred step completed during this one: */
    double prev_sumsq;        /*   its sumsq */
    double prev_comm_ms;      /*   and its comm_ms */
    double fwd_lead_ms;       /* how long before the previous step's gradients were all
                                 averaged this step's forward could start (negative: it
                                 started that long after); NaN when not measured */
    const char *codecs;       /* adaptive compression: this step's codec per bucket
                                 (dt_ddp_codec_choice), valid until the next step; NULL */
    double link_bytes_per_s;  /* ... and the link estimate it used (0: none yet) */
} dt_sync_result;

/* What dt_grad_sync_settle completed: a deferred step's late figures. */
typedef struct dt_sync_late {
    bool pending; /* a deferred step was completed (else nothing below is set) */
    double sumsq; /* its sumsq (as dt_sync_result.sumsq) */
    double comm_ms;
} dt_sync_late;

/* What one step of a strategy costs on the wire, for the planner: the
 * collective it runs, over how many ranks, how many bytes each rank
 * sends per step, in how many pieces, and whether it overlaps backward. */
typedef struct dt_sync_cost {
    dt_coll coll;          /* the dominant collective (DDP: allreduce) */
    int ranks;             /* size of the group it runs on */
    double bytes_per_step; /* bytes one rank sends per optimizer step */
    int pieces;            /* collectives per step */
    bool overlapped;       /* started during backward */
    size_t state_bytes;    /* memory the strategy keeps per rank (codec state) */
} dt_sync_cost;

/* Dispatch to the implementation (see the overview). */
dt_status dt_grad_sync_begin_step(dt_grad_sync *s, const dt_sync_step *step);
/* Deferred steps (DDP with --comm-priority critical): whether a step that
 * may update early (update_early) can leave its last updates to the next
 * step's forward, which then waits per layer for the averaged gradient
 * and updates it just before reading it (the strategy's parameter hooks).
 * The loop then sets step.defer, does not call dt_optimizer_begin/end for
 * that step (the strategy does, around its updates), takes the step's
 * sumsq from the next finish (has_prev) or from dt_grad_sync_settle, and
 * settles wherever every parameter must be final (evaluation, checkpoint,
 * replica check, the end, before a step that does not defer). False for
 * every other strategy. */
bool dt_grad_sync_defers(const dt_grad_sync *s, bool update_early);
/* Complete every update a deferred step left pending and close its
 * optimizer step; out->pending says whether there was one (its late
 * figures follow). Local: no collective. */
dt_status dt_grad_sync_settle(dt_grad_sync *s, dt_sync_late *out);
/* Before each micro-batch's backward; returns how that backward writes the
 * gradient buffer: DDP and ZeRO 1 accumulate the micro-batches in it (the
 * step's first backward overwrites, the others accumulate); ZeRO 2
 * reduces every micro-batch and keeps the sum of its own shard, so every
 * backward overwrites. (A pipeline runner, which interleaves its chunks'
 * micro-batches, calls it once, before the step's final backwards, and
 * accumulates itself.) */
dt_grad_mode dt_grad_sync_begin_backward(dt_grad_sync *s, bool last_microbatch);
/* The model's backward hook (dt_grad_ready_fn): grads[ready_from, n) are final. */
void dt_grad_sync_ready(void *s, size_t ready_from);
dt_status dt_grad_sync_finish(dt_grad_sync *s, dt_sync_result *out);
/* Scale the gradients by clip_scale and step the optimizer over what this
 * rank owns (unless finish already did). A skipped step (an inf/nan
 * gradient on some rank) leaves parameters and optimizer state alone. */
dt_status dt_grad_sync_apply(dt_grad_sync *s, bool skip, float clip_scale);
/* Add the communication apply() did (local SGD's and gossip's parameter
 * exchanges: time, bytes, messages) to the step's result; nothing for
 * strategies that communicate only before finish() returns. */
void dt_grad_sync_apply_report(dt_grad_sync *s, dt_sync_result *out);
/* Whether the loop agrees on step `step`'s statistics over the world (the
 * loss, the norm, "stop", "skip": one small allreduce). DDP and ZeRO: every
 * step. Local SGD and gossip only at the steps where their replicas meet
 * anyway (an average, a consensus measurement, the last step): between
 * them each replica runs on its own, with its own loss, norm (finish()
 * then reports its whole sum of squares) and clipping, and a stop request
 * waits for the next agreed step — so that no step is a global barrier. */
bool dt_grad_sync_agrees(const dt_grad_sync *s, int64_t step);
/* Make the replicas' parameters identical (from the first replica): at the
 * start and after a resume. */
dt_status dt_grad_sync_replicate(dt_grad_sync *s);
/* Compare the replicas' parameters: DT_ERR_MISMATCH naming the step and
 * the first replica that differs. */
dt_status dt_grad_sync_check(dt_grad_sync *s, int64_t step);
const char *dt_grad_sync_name(const dt_grad_sync *s);

/* What the replicas of the data-parallel group hold alike: DDP keeps the
 * same parameters and optimizer state on every replica (a checkpoint
 * writes them from the first); ZeRO shards the optimizer state. */
typedef struct dt_sync_layout {
    bool params_replicated; /* every replica holds the same parameters */
    bool optim_replicated;  /* ... and the same optimizer state */
    bool params_sharded;    /* a replica holds only the parameters its optimizer owns
                               (ZeRO 3: a checkpoint writes and reads those) */
} dt_sync_layout;
void dt_grad_sync_layout(const dt_grad_sync *s, dt_sync_layout *out);
/* The hooks the model must call around its parameter reads (ZeRO 3
 * gathers each block's parameters before it runs and returns them after);
 * NULL when the strategy keeps every parameter in place. */
const dt_param_hooks *dt_grad_sync_param_hooks(const dt_grad_sync *s);
/* Make every parameter of this rank valid (whole), or give them back to
 * the strategy's own layout (!whole): around reading the whole parameter
 * buffer outside a pass (the weights file, the sample). No-op for
 * strategies that keep every parameter. whole: collective over the dp
 * group; while whole, a pass on one rank alone communicates nothing (every
 * fetch finds its block resident). !whole: local. */
dt_status dt_grad_sync_gather_params(dt_grad_sync *s, bool whole);
/* Collective over the replica group, at a checkpoint after a step, before
 * anything is written: settle the strategy and say which parameters the
 * checkpoint's shared section holds. *params = NULL: the model's own
 * (every strategy but the parameter server). The parameter server waits
 * until every server applied every push of the step and sent every reply,
 * and gathers the servers' shards — the model after this step — on the
 * first replica (*params, valid until the next call; NULL elsewhere). */
dt_status dt_grad_sync_save_params(dt_grad_sync *s, const float **params);
void dt_grad_sync_cost(const dt_grad_sync *s, dt_sync_cost *out);
/* This rank's own state (DDP: codec residuals), in the units of the loss
 * scale `unit` it was saved at, and a text naming what it belongs to
 * (codec, buckets, ranks): set_state requires the same ident and bytes. */
size_t dt_grad_sync_state_bytes(const dt_grad_sync *s);
const char *dt_grad_sync_state_ident(const dt_grad_sync *s);
dt_status dt_grad_sync_get_state(const dt_grad_sync *s, void *buf, size_t len, float *unit);
dt_status dt_grad_sync_set_state(dt_grad_sync *s, const void *buf, size_t len, float unit);
/* Forget the state (zero residuals, fresh PowerSGD factors). */
void dt_grad_sync_reset_state(dt_grad_sync *s);
/* The parameters this rank owns in a sharded layout (params_sharded),
 * readable and writable in place in the parameter buffer (hold), or given
 * back to the strategy (!hold; `written`: they were changed meanwhile, so
 * the strategy stores them again and re-shares what every replica keeps
 * whole). ZeRO 3 with --offload params keeps them in a file between uses;
 * around a checkpoint's save (hold; read; give back unwritten) and a
 * resume's load (hold; write; give back written). Local (what replicas
 * keep whole is re-shared at the next pass's first fetch). No-op for
 * strategies that keep every parameter in place. */
dt_status dt_grad_sync_hold_params(dt_grad_sync *s, bool hold, bool written);
void dt_grad_sync_destroy(dt_grad_sync *s);

/* ------------------------------------------------------------------------ */
/* Runners: a step's forward and backward passes over its micro-batches     */
/* ------------------------------------------------------------------------ */
/*
 * A runner executes one optimizer step's forwards and backwards of M
 * micro-batches on this rank's model part and gives the gradient
 * synchronisation its backward hooks; the loop calls it and nothing else
 * for the passes:
 *
 *     dt_optimizer_begin(...); dt_grad_sync_begin_step(...);
 *     DT_CHECK(dt_runner_step(runner, &batch, sync, &res));  // gradients accumulated
 *     dt_grad_sync_finish(sync, ...); ...
 *
 * The sequential runner (one pipeline stage: the whole model or a
 * tensor-parallel shard) runs forward, backward per micro-batch. The
 * pipeline runner executes a checked schedule (above) on this rank's stage:
 *
 *   - activations go to the next stage and gradients to the previous one
 *     point to point, non-blocking (dt_group_isendrecv_batch), a run of
 *     consecutive transfers posted as one batch per flow: activations over
 *     the pipeline group, gradients over a second group split from it, so
 *     the two flows never queue behind each other; a compute action waits
 *     only for the batch that brings its input;
 *   - received activations and gradients land in buffers of one (Ns,C)
 *     residual stream each (a pool that grows to what the schedule keeps
 *     in flight, then stays); an input gradient is copied out of the
 *     model's scratch into such a buffer before it is sent; an activation
 *     is sent from the slot that holds it, which is reused only once that
 *     send has completed (the next stage received it before it could send
 *     the gradient that let the backward run, so this wait is short);
 *   - the model has exactly dt_pp_slots() slots per chunk; the runner
 *     counts the micro-batch chunks alive (forwarded, backward or W not
 *     done) and reports the peak, which equals the checker's peak_live;
 *   - each chunk's first backward (and W) overwrites its gradients, the
 *     others accumulate, in micro-batch order, so every gradient but the
 *     tied embedding's is summed in the order of one process;
 *   - the last backward (or W) of each chunk carries the synchronisation's
 *     hook (chunks finish in descending order, as the model's layout
 *     requires); the tied embedding's gradient waits: after the schedule
 *     ran, the first and last stages sum it over their own group
 *     (Megatron's embedding allreduce) and only then report it ready;
 *   - an error of any transfer (a stage died, a mismatched message) stops
 *     the step on this rank with the stage, the world rank and the action,
 *     aborts the pipeline's groups so that its neighbours fail at once,
 *     and returns after every posted transfer has completed or failed.
 * Ownership: a runner borrows the model, the schedule and the groups.
 */

typedef struct dt_runner dt_runner;

/* One step's micro-batches: inputs and targets (micro, B, T) one after
 * another; each micro-batch's backward scales its mean loss by grad_scale
 * (the loss scale / micro). */
typedef struct dt_run_batch {
    const int32_t *inputs, *targets;
    int micro, B, T;
    float grad_scale;
} dt_run_batch;

/* What a step measured on this rank. */
typedef struct dt_run_result {
    double loss;         /* sum of the micro-batches' mean losses this rank computed */
    bool has_loss;       /* this rank computes losses (it holds the LM head) */
    double busy_ms;      /* time in forward, backward and W */
    double wait_ms;      /* time blocked on pipeline transfers */
    double bubble;       /* pipeline: 1 - sum(busy) / (P x span), over the pipeline's
                            ranks (span: the step's start to the last compute); 0 else */
    int peak_live;       /* most micro-batch chunks alive at once */
    uint64_t bytes_sent; /* pipeline transfers this rank sent */
} dt_run_result;

/* Run one step (every rank of the pipeline calls it; `sync` gets the
 * hooks and begin_backward). */
dt_status dt_runner_step(dt_runner *r, const dt_run_batch *b, dt_grad_sync *sync,
                         dt_run_result *out);
/* Forward only (no targets needed but on the stage with the head): the
 * mean loss of one batch (B,T), on every rank of the pipeline. */
dt_status dt_runner_eval(dt_runner *r, const int32_t *inputs, const int32_t *targets, int B, int T,
                         double *loss);
/* "sequential", "1f1b", ... */
const char *dt_runner_name(const dt_runner *r);
void dt_runner_destroy(dt_runner *r);

/* The sequential runner over the whole model part m (borrowed). */
dt_status dt_sequential_runner_create(dt_runner **out, dt_gpt *m);

typedef struct dt_pp_runner_config {
    dt_gpt *model;               /* this rank's part: dt_pp_model_part, dt_pp_slots slots per
                                    chunk, split_weight_grads when the schedule splits W */
    const dt_pp_schedule *sched; /* checked (dt_pp_check) */
    dt_group *group;             /* the pipeline group: rank = pipeline rank */
} dt_pp_runner_config;

/* Collective over the pipeline group: splits its gradient and embedding
 * groups, and compares the schedule every rank was given (a different
 * table, kind, or counts on some rank is DT_ERR_MISMATCH naming it). */
dt_status dt_pp_runner_create(dt_runner **out, const dt_pp_runner_config *c);

/* --- DDP as a gradient synchronisation ---------------------------------- */

typedef struct dt_ddp_sync_config {
    dt_group *group;    /* the data-parallel group (NULL or size 1: nothing to reduce) */
    float *params;      /* (n) */
    float *grads;       /* (n) */
    size_t n;           /* floats */
    dt_optimizer *opt;  /* steps over [0, n) */
    dt_ddp_options ddp; /* buckets, wire dtype, codec (see dt_ddp_options) */
    /* Dense warm-up: steps < compress_start average plain fp32 (codec
     * state untouched); compress_ramp steps after it ramp top-k's density
     * down from ramp_start to the codec's own fraction (Deep Gradient
     * Compression). Both 0: off. */
    int64_t compress_start, compress_ramp;
    double ramp_start;
    /* The ranges of the flat buffer this rank counts in the norm (those
     * holding tensors replicated over other model-parallel ranks are
     * counted by one of them); NULL: all of [0, n). Copied. Among the
     * data-parallel replicas, bucket i is counted by replica i % dp. */
    const dt_range *norm_ranges;
    size_t nnorm;
} dt_ddp_sync_config;
/* With ddp.priority critical the sync installs parameter hooks
 * (dt_grad_sync_param_hooks) that take each layer's buckets just before
 * the forward reads them, and defers steps that update early
 * (dt_grad_sync_defers). */

/* DDP's dt_grad_sync: bucketed, overlapped allreduce over the dp group;
 * per averaged bucket the unscaling (inf/nan check), the counted sum of
 * squares and, with update_early, the optimizer's update of that range. */
dt_status dt_ddp_sync_create(dt_grad_sync **out, const dt_ddp_sync_config *c);

/* --- ZeRO as a gradient synchronisation --------------------------------- */
/*
 * ZeRO (Rajbhandari et al. 2020) on the data-parallel group, docs/zero.md:
 * stage 1 shards the optimizer state: each replica owns one piece of every
 * bucket (dt_ddp_shard_ranges), its optimizer keeps state for those pieces
 * only; buckets are reduce-scattered during backward, each replica updates
 * its pieces and the parameters are allgathered. The optimizer object must
 * be created over exactly those owned ranges. Stage 2 also shards the
 * gradients: every micro-batch's buckets are reduce-scattered as backward
 * finishes them, the replica keeps the sum of its pieces, and the rest of
 * each bucket's gradient memory is returned to the system at once.
 */
typedef struct dt_zero_sync_config {
    int stage;         /* 1, 2 or 3 */
    int accum;         /* micro-batches per step (stage 2 keeps the sum of their shards) */
    dt_group *group;   /* the data-parallel group (NULL or size 1: nothing to reduce) */
    float *params;     /* (n) */
    float *grads;      /* (n) */
    size_t n;          /* floats */
    dt_optimizer *opt; /* owns dt_ddp_shard_ranges(n, bucket_bytes, dp, replica) */
    size_t bucket_bytes;
    /* As dt_ddp_sync_config: the ranges this model-parallel rank counts in
     * the norm (NULL: all); within them each element is counted by the
     * replica that owns it. Copied. */
    const dt_range *norm_ranges;
    size_t nnorm;
    /* The wire (docs/zero.md, "Compression"): NULL or a plain codec-less
     * f32: plain reduce-scatters. Otherwise its codec, ef, grad_dtype,
     * seed, tensors and dense_below shape each bucket's compressed
     * reduce-scatter (its bucket_bytes, shard, release and prepare are
     * ignored: ZeRO's own); the error-feedback residuals are per piece and
     * are this rank's state (dt_grad_sync_get_state). Copied. */
    const dt_ddp_options *wire;
    int64_t compress_start; /* dense warm-up steps: plain f32, codec state untouched */
    /* Stage 3 with 16-bit compute (bf16/fp16): the model's 16-bit copy is
     * gathered in 16 bits (half the volume; the master pieces stay fp32)
     * through the hooks' fetch16; the tensors the model reads in fp32 then
     * (`exact`, sorted: biases and LayerNorm parameters) are kept whole on
     * every replica, shared once per step after the update. Copied. */
    dt_precision precision;
    const dt_range *exact;
    size_t nexact;
    /* Stage 3: this replica's parameter pieces live in a file in this
     * directory (NULL: in memory), read ahead before the gathers and the
     * update that need them and written back after the update, by I/O
     * threads; offload_direct opens it with O_DIRECT. */
    const char *offload_dir;
    bool offload_direct;
} dt_zero_sync_config;

dt_status dt_zero_sync_create(dt_grad_sync **out, const dt_zero_sync_config *c);

/* Planning (dtrain plan memory), stage 3 with --offload params over
 * buckets of bucket_bytes of n floats among dp replicas: the bytes of
 * pieces kept in memory beside the units a pass holds (the reads ahead of
 * the walk, the writes in flight and the piece being updated; O_DIRECT's
 * bounce buffers), and the file's size. */
void dt_zero_plan_offload(size_t n, size_t bucket_bytes, int dp, bool direct, size_t *resident,
                          size_t *file);

/* --- Beyond synchronous data parallelism: local SGD and gossip ---------- */
/*
 * docs/async.md. Both let every replica step its own optimizer on its own
 * gradients and communicate parameters, not gradients, between steps:
 *
 *   - local SGD (Stich 2019; Lin et al. 2020 "post-local SGD"; SlowMo,
 *     Wang et al. 2020; DiLoCo, Douillard et al. 2023): H local steps, then
 *     the parameters (optionally the optimizer state) are averaged over the
 *     replica group, and an outer optimizer steps the parameters of the
 *     last synchronisation (the anchor) along the averaged delta
 *     (anchor - average):
 *
 *         sgd       anchor -= lr_o * delta          (lr_o 1: plain averaging)
 *         slowmo    u = beta u + delta; anchor -= lr_o * u
 *         nesterov  u = beta u + delta; anchor -= lr_o * (delta + beta u)
 *
 *     Steps before post_local_after, and every step when H is 1 with plain
 *     averaging, are synchronous: their gradients are averaged by DDP's
 *     bucket engine, so such a run equals DDP bit for bit.
 *   - gossip (decentralised SGD, Lian et al. 2017): after every `every`-th
 *     local step each replica mixes its parameters with a few peers' by
 *     point-to-point messages, never a global collective: "ring" averages
 *     with both ring neighbours (weights 1/3; 1/2 with two replicas),
 *     "exp" with one peer 2^(r mod log2 N) away (pairwise, N a power of
 *     two), "random" with its partner of a random perfect matching drawn
 *     per round from the seed (an odd replica out keeps its own), and
 *     "hypercube" runs all log2 N pairwise rounds (an exact average: a test
 *     and reference topology whose bytes grow with log N). Every 10 steps
 *     finish() measures the consensus distance (1/N) sum_i |w_i - mean|^2
 *     of the parameters the step used (a monitoring allreduce, not counted
 *     in bytes_sent).
 *
 * Both average the parameters over the whole group at the run's last step
 * (total_steps), so the final model is one model. Each rank's own
 * parameters and optimizer state (and local SGD's anchor and outer
 * momentum) are its dt_grad_sync state, so a checkpoint resumes every
 * replica exactly; the checkpoint's shared parameters are replica 0's.
 * The loop agrees on statistics only where the replicas meet anyway
 * (dt_grad_sync_agrees); there res.sumsq is this replica's own counted sum
 * of squares divided by the replica count, so the world's sum is the mean
 * over replicas (clipping then uses that norm on every replica); between
 * them each replica clips by its own norm. No loss scaling (fp16).
 * The parameter exchange happens in apply(), after the update; its time,
 * bytes and messages reach the step's result through
 * dt_grad_sync_apply_report. Data-parallel only (no ZeRO, codec or
 * 16-bit gradients).
 */
typedef enum dt_outer_kind {
    DT_OUTER_SGD,
    DT_OUTER_SLOWMO,
    DT_OUTER_NESTEROV,
    DT_OUTER_COUNT
} dt_outer_kind;
/* "sgd", "slowmo", "nesterov" (indexable by dt_outer_kind). */
extern const char *const dt_outer_names[DT_OUTER_COUNT];

typedef struct dt_local_sync_config {
    dt_ddp_sync_config ddp;   /* group, buffers, optimizer, norm ranges, buckets: its engine
                                 runs the synchronous steps (no codec, f32) */
    int64_t sync_every;       /* H >= 1 local steps between averages */
    int64_t post_local_after; /* steps 0..N-1 are synchronous (DDP); >= 0 */
    int64_t total_steps;      /* the step total_steps - 1 always averages */
    dt_outer_kind outer;
    double outer_lr;       /* > 0 */
    double outer_momentum; /* [0, 1): slowmo and nesterov */
    bool sync_optim_state; /* average the optimizer state with the parameters */
} dt_local_sync_config;

dt_status dt_local_sync_create(dt_grad_sync **out, const dt_local_sync_config *c);

typedef enum dt_gossip_topology {
    DT_GOSSIP_RING,
    DT_GOSSIP_EXP,
    DT_GOSSIP_RANDOM,
    DT_GOSSIP_HYPERCUBE,
    DT_GOSSIP_COUNT
} dt_gossip_topology;
/* "ring", "exp", "random", "hypercube" (indexable by dt_gossip_topology). */
extern const char *const dt_gossip_names[DT_GOSSIP_COUNT];

typedef struct dt_gossip_sync_config {
    dt_group *group; /* the replica group (NULL or size 1: nothing to mix) */
    float *params;   /* (n) */
    float *grads;    /* (n) */
    size_t n;
    dt_optimizer *opt;           /* steps over [0, n) */
    const dt_range *norm_ranges; /* as dt_ddp_sync_config; copied */
    size_t nnorm;
    dt_gossip_topology topology; /* exp and hypercube need a power-of-two group */
    int64_t every;               /* mix after every `every`-th step, >= 1 */
    int64_t total_steps;         /* the step total_steps - 1 averages over the group */
    uint64_t seed;               /* keys the random topology's matchings */
} dt_gossip_sync_config;

dt_status dt_gossip_sync_create(dt_grad_sync **out, const dt_gossip_sync_config *c);

/* --- Parameter server ---------------------------------------------------- */
/*
 * An asynchronous parameter server on the training ranks (BytePS-style):
 * the parameters are cut into `servers` equal shards, rank k < servers
 * serves shard k from a thread of its own, every rank is a worker that
 * pushes its gradient in buckets as backward finishes them (tagged
 * messages of one mailbox, comm.h) and reads the parameters back, never
 * waiting for the others but under SSP: a worker more than `staleness`
 * steps ahead of the slowest waits for its reply. Each server steps its
 * shard with an optimizer object of its own (the run's settings; an
 * elementwise kind: adamw, sgd, radam, adamw8bit), one update per push
 * with 1/W of the pushed learning rate, after clipping by the worker's
 * own norm and compensating the delay (docs/async.md):
 *
 *     none     g
 *     seed     g / (1 + tau)
 *     dcasgd   g + lambda g*g*(w_now - w_then)    (DC-ASGD, Zheng et al. 2017)
 *
 * tau: the push's staleness in steps (its step minus the slowest worker's
 * clock when the parameters it used were read); every server asserts
 * tau <= staleness for every update and counts it (dt_ps_sync_histogram).
 * The last step of the run is a meeting: every rank ends with the servers'
 * parameters. With staleness 0 a server applies each step's pushes in
 * worker order: the run is deterministic bit for bit (and resumes so);
 * with staleness > 0 pushes apply in arrival order. A checkpoint
 * (dt_grad_sync_save_params) is the servers' model after one step on every
 * server at once; each rank's sync state holds its worker's own (stale)
 * view and, on a server, its shard, optimizer state and clocks, so a
 * resume continues from exactly the state that was saved.
 */
typedef enum dt_delay_comp {
    DT_DELAY_COMP_NONE,
    DT_DELAY_COMP_SEED,
    DT_DELAY_COMP_DCASGD,
    DT_DELAY_COMP_COUNT
} dt_delay_comp;
/* "none", "seed", "dcasgd" (indexable by dt_delay_comp). */
extern const char *const dt_delay_comp_names[DT_DELAY_COMP_COUNT];

#define DT_PS_HIST        64 /* staleness histogram bins (the last: >= 63) */
#define DT_PS_MAX_SERVERS 64 /* shards */

typedef struct dt_ps_sync_config {
    dt_group *group; /* the replica group (NULL or size 1: `opt` steps, as DDP's) */
    float *params;   /* (n) */
    float *grads;    /* (n) */
    size_t n;
    dt_optimizer *opt; /* one rank: the run's optimizer, over [0, n) */
    /* The servers' optimizers: these settings over the model's tensors
     * (decay flags; shapes are dropped where a shard cuts a tensor). */
    const dt_optim_config *optim;
    const dt_optim_tensor *tensors;
    size_t ntensors;
    size_t bucket_bytes;         /* pushes of about this size, inside each shard */
    const dt_range *norm_ranges; /* as dt_ddp_sync_config; copied */
    size_t nnorm;
    int servers;       /* K in [1, group size] */
    int64_t staleness; /* S in [0, DT_PS_HIST - 2] */
    dt_delay_comp delay_comp;
    double dc_lambda;    /* dcasgd's lambda */
    int64_t total_steps; /* the step total_steps - 1 is the meeting */
} dt_ps_sync_config;

/* Collective over the group (creates a mailbox on it). */
dt_status dt_ps_sync_create(dt_grad_sync **out, const dt_ps_sync_config *c);
/* g <- the compensated gradient (see above), g, w_now, w_then (n). */
void dt_ps_delay_compensate(dt_delay_comp kind, float lambda, int64_t tau, float *g,
                            const float *w_now, const float *w_then, size_t n);
/* Collective over the group: the staleness counts of every server's
 * updates so far, summed. DT_ERR_INVALID for another strategy. */
dt_status dt_ps_sync_histogram(const dt_grad_sync *s, int64_t hist[DT_PS_HIST]);

/* ------------------------------------------------------------------------ */
/* Planning costs: what each strategy sends, described by the strategy      */
/* ------------------------------------------------------------------------ */
/*
 * The planner (plan.h) predicts a layout's step without building it, so
 * each strategy describes, next to its own code, the collectives it issues
 * for a layout: which collective, on which mesh axis, how many bytes per
 * call, how many calls per micro-batch or per step, and whether the code
 * overlaps it with computation. The planner prices each item on the link
 * its group crosses; it never names a strategy. Rules:
 *
 *   1. bytes is the size of one call's buffer as the collective sees it (an
 *      allreduce's whole vector, an all-gather's gathered output, an
 *      all-to-all's whole send buffer, a point-to-point message).
 *   2. per_micro items repeat for every micro-batch; the others run once
 *      per optimizer step.
 *   3. overlapped items run while this rank computes (buckets during
 *      backward, prefetched gathers, the ring's shifts); the others block
 *      the rank that issues them.
 *   4. A hook only appends to `out` (up to DT_COST_MAX items) and reads q.
 *
 * Example (DDP, 124M parameters over 8 replicas, 25 MiB buckets):
 *     dt_cost_query q = {.model = &cfg, .B = 8, .T = 1024, .micro = 4,
 *                        .degree = {8, 1, 1, 1}, .params = 124e6, ...};
 *     dt_strategy_cost c = {0};
 *     dt_grad_sync_plan_cost(&q, &c);
 *     // c.item[0]: allreduce on dp, 496 MB, 1 call per step, overlapped
 */
#define DT_COST_MAX 12

/* The replica group's strategy a query prices (with zero 0; docs/async.md). */
typedef enum dt_sync_mode {
    DT_SYNC_MODE_DDP, /* bucketed allreduce every step (the default) */
    DT_SYNC_MODE_LOCAL,
    DT_SYNC_MODE_GOSSIP,
    DT_SYNC_MODE_PS,
    DT_SYNC_MODE_COUNT
} dt_sync_mode;

typedef struct dt_cost_query {
    const dt_gpt_config *model;
    int B, T;                  /* sequences and tokens (whole sequence) per micro-batch */
    int micro;                 /* micro-batches per step on this rank */
    dt_precision precision;    /* compute type */
    int recompute_every;       /* 0: keep every activation */
    int degree[DT_AXIS_COUNT]; /* dp, tp, pp, cp */
    bool sp;                   /* Megatron sequence parallelism with tp */
    dt_cp_mode cp_mode;        /* with cp > 1 */
    int chunks;                /* pipeline chunks per rank (interleaving) */
    int layers;                /* blocks this rank holds (all its chunks) */
    int zero;                  /* ZeRO stage on the replica group */
    double params;             /* floats of this rank's model part */
    size_t bucket_bytes;       /* gradient buckets */
    /* Beyond synchronous data parallelism (zero-initialised: DDP). */
    dt_sync_mode sync_mode;
    int64_t sync_every; /* local SGD's H, gossip's K: steps per exchange (0 counts as 1) */
    int gossip_vectors; /* parameter vectors a rank sends per gossip round (ring 2, exp 1) */
    int ps_servers;     /* the parameter server's shards (0 counts as 1) */
} dt_cost_query;

typedef struct dt_comm_cost {
    dt_coll coll;     /* DT_COLL_ALLREDUCE, _REDUCE_SCATTER, _ALLGATHER, _ALLTOALL or _SEND */
    dt_axis axis;     /* the group it runs on (DT_AXIS_DP: the replica group, dp x cp) */
    double bytes;     /* one call's buffer (rule 1) */
    double calls;     /* per micro-batch or per step (rule 2) */
    bool per_micro;   /* repeats every micro-batch */
    bool backward;    /* issued during backward (else forward, or after the passes) */
    bool overlapped;  /* hidden behind computation when there is enough of it (rule 3) */
    const char *what; /* "dp gradient allreduce" */
} dt_comm_cost;

typedef struct dt_strategy_cost {
    dt_comm_cost item[DT_COST_MAX];
    int n;
} dt_strategy_cost;

/* Append an item (the hooks' helper); drops it when out is full. */
void dt_strategy_cost_add(dt_strategy_cost *out, dt_comm_cost c);

/* The hooks, each in its strategy's file. The gradient synchronisation's
 * is chosen by q->zero and q->sync_mode through tables in sync.c (the same
 * choice the trainer's setup makes): ZeRO's for stages 1-3; else DDP,
 * local SGD (the parameter average every H steps, blocking), gossip (the
 * exchange with its peers every K steps) or the parameter server (the
 * bucket pushes during backward; the replies of a server's rank, the
 * busiest, to the other workers). */
void dt_ddp_sync_plan_cost(const dt_cost_query *q, dt_strategy_cost *out);
void dt_zero_sync_plan_cost(const dt_cost_query *q, dt_strategy_cost *out);
void dt_local_sync_plan_cost(const dt_cost_query *q, dt_strategy_cost *out);
void dt_gossip_sync_plan_cost(const dt_cost_query *q, dt_strategy_cost *out);
void dt_ps_sync_plan_cost(const dt_cost_query *q, dt_strategy_cost *out);
void dt_grad_sync_plan_cost(const dt_cost_query *q, dt_strategy_cost *out);
void dt_tp_plan_cost(const dt_cost_query *q, dt_strategy_cost *out);
void dt_cp_plan_cost(const dt_cost_query *q, dt_strategy_cost *out);
void dt_pp_plan_cost(const dt_cost_query *q, dt_strategy_cost *out);

#ifdef __cplusplus
}
#endif
#endif /* DTRAIN_PARALLEL_H */
