/*
 * dtrain/optim.h — optimizers, learning-rate schedules and gradient clipping
 * on flat ranges of float buffers.
 *
 * Overview
 * --------
 * Every function here works on a flat range: `n` consecutive floats of the
 * parameter buffer, the matching range of the gradient buffer and of each
 * optimizer-state buffer (same length, same offsets). Nothing keeps a pointer
 * after it returns. This is what lets a later layer shard the optimizer
 * (ZeRO): a rank calls the same step on its own slice of the buffers, and
 * because every element is updated independently, the result of updating a
 * buffer in one call or in any split into sub-ranges is bit-identical (the
 * vector and scalar code paths perform the same IEEE operations in the same
 * order; this file is compiled without floating-point contraction).
 *
 * The update rules follow PyTorch 1.13 (torch.optim.AdamW and torch.optim.SGD,
 * single-tensor path) operation by operation, so results match it to float
 * rounding; tests/unit/test_optim.c checks a PyTorch fixture to 1e-6.
 *
 * Example: one AdamW step with global-norm clipping on a whole model whose
 * biases and LayerNorm gains are not decayed:
 *
 *     double ss = dt_grad_sumsq(grads, n);          // allreduce(SUM) if sharded
 *     float s = dt_clip_scale(ss, 1.0f);            // 1.0 when within the bound
 *     if (s != 1.0f) dt_scale(grads, n, s);
 *     float lr = dt_schedule_lr(&sched, step - 1);  // schedule steps are 0-based
 *     for each tensor (offset, size, decay):
 *         dt_adamw_step(p + offset, g + offset, m + offset, v + offset, size, lr,
 *                       &cfg, step, decay ? cfg.weight_decay : 0.0f);
 *
 * Large ranges are split across OpenMP threads (the number set by
 * dt_tensor_set_threads / omp_set_num_threads); the split never changes the
 * result.
 */
#ifndef DTRAIN_OPTIM_H
#define DTRAIN_OPTIM_H

#include "dtrain/core.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------ */
/* AdamW                                                                    */
/* ------------------------------------------------------------------------ */

typedef struct dt_adamw_config {
    float beta1;        /* first-moment decay, PyTorch default 0.9 */
    float beta2;        /* second-moment decay, PyTorch default 0.999 */
    float eps;          /* added to sqrt(vhat), PyTorch default 1e-8 */
    float weight_decay; /* the run's decoupled decay, PyTorch default 1e-2; the caller
                           passes it (or 0 for no-decay tensors) as the step's argument */
} dt_adamw_config;

/* PyTorch's defaults: betas (0.9, 0.999), eps 1e-8, weight_decay 1e-2. */
dt_adamw_config dt_adamw_config_default(void);

/*
 * One AdamW step on a range of n elements. `step` is 1-based (the number of
 * this update, used for the bias corrections); m and v start zeroed. With
 * bc1 = 1 - beta1^step and bc2 = 1 - beta2^step (computed in double):
 *
 *     p *= 1 - lr * weight_decay
 *     m  = beta1 * m + (1 - beta1) * g
 *     v  = beta2 * v + (1 - beta2) * g * g
 *     p -= (lr / bc1) * m / (sqrt(v) / sqrt(bc2) + eps)
 *
 * `weight_decay` is the decay applied to this range (it overrides
 * c->weight_decay, so a caller can skip decay for biases and norms).
 * beta2 == 1 freezes the second moment: v stays as it is (1 * v + 0 * g*g,
 * bit for bit for finite g) and is used without bias correction (bc2 = 1),
 * the compression stage of 1-bit Adam (Tang et al. 2021); the caller turns
 * a running v into the frozen one by dividing it by its bc2 once.
 */
void dt_adamw_step(float *params, const float *grads, float *m, float *v, size_t n, float lr,
                   const dt_adamw_config *c, int64_t step, float weight_decay);

/* ------------------------------------------------------------------------ */
/* SGD with momentum                                                        */
/* ------------------------------------------------------------------------ */

/*
 * One SGD step (PyTorch semantics, dampening 0). momentum_buf starts zeroed
 * and may be NULL when momentum == 0:
 *
 *     d  = g + weight_decay * p
 *     b  = momentum * b + d                    (if momentum != 0)
 *     d  = nesterov ? d + momentum * b : b     (if momentum != 0)
 *     p -= lr * d
 *
 * A zeroed buffer gives exactly PyTorch's first step, where b = d.
 */
void dt_sgd_step(float *params, const float *grads, float *momentum_buf, size_t n, float lr,
                 float momentum, bool nesterov, float weight_decay);

/* ------------------------------------------------------------------------ */
/* Learning-rate schedules                                                  */
/* ------------------------------------------------------------------------ */

typedef enum dt_schedule_kind {
    DT_SCHED_CONSTANT, /* warmup, then base_lr */
    DT_SCHED_LINEAR,   /* warmup, then a straight line from base_lr to min_lr at `total` */
    DT_SCHED_COSINE,   /* warmup, then half a cosine from base_lr to min_lr at `total` */
    DT_SCHED_INVSQRT,  /* warmup, then base_lr * sqrt(max(warmup,1) / (step + 1)), >= min_lr */
    DT_SCHED_COUNT
} dt_schedule_kind;

/* "constant", "linear", "cosine", "invsqrt" (indexable by dt_schedule_kind). */
extern const char *const dt_schedule_names[DT_SCHED_COUNT];

typedef struct dt_schedule {
    dt_schedule_kind kind;
    float base_lr;  /* peak learning rate, reached at the end of warmup */
    float min_lr;   /* floor of linear/cosine decay (and of invsqrt) */
    int64_t warmup; /* steps of linear warmup: lr = base_lr * (step + 1) / warmup */
    int64_t total;  /* step at which linear/cosine decay reaches min_lr (> warmup) */
} dt_schedule;

/* Check a schedule's fields; DT_ERR_INVALID names the bad field and value. */
dt_status dt_schedule_validate(const dt_schedule *s);

/*
 * Learning rate for 0-based `step` (the step-th update, i.e. AdamW step
 * number step + 1). Computed in double, rounded once to float:
 *
 *     step < warmup:   base_lr * (step + 1) / warmup
 *     otherwise, with r = (step - warmup) / (total - warmup) clamped to [0, 1]:
 *       constant  base_lr
 *       linear    min_lr + (base_lr - min_lr) * (1 - r)
 *       cosine    min_lr + (base_lr - min_lr) * 0.5 * (1 + cos(pi * r))
 *       invsqrt   max(min_lr, base_lr * sqrt(max(warmup, 1) / (step + 1)))
 */
float dt_schedule_lr(const dt_schedule *s, int64_t step);

/* ------------------------------------------------------------------------ */
/* Gradient clipping by global norm                                         */
/* ------------------------------------------------------------------------ */

/*
 * Sum of squares of a range, accumulated in double. The range is summed in
 * fixed blocks whose partial sums are added in order, so the result does not
 * depend on the number of threads. Each square is exact in double; the sum is
 * exact while it stays below 2^53 in units of the smallest square (e.g. for
 * integer-valued gradients). For a sharded buffer, allreduce the per-shard
 * sums and take the square root of the total.
 */
double dt_grad_sumsq(const float *g, size_t n);

/* g *= s over a range. */
void dt_scale(float *g, size_t n, float s);

/*
 * The factor that clips a gradient of squared norm `sumsq` to `max_norm`,
 * as torch.nn.utils.clip_grad_norm_ computes it:
 * min(1, max_norm / (sqrt(sumsq) + 1e-6)). max_norm <= 0 disables clipping
 * (returns 1). A NaN or infinite sumsq also returns 1: a caller that wants to
 * stop on non-finite gradients checks isfinite(sumsq) itself.
 */
float dt_clip_scale(double sumsq, float max_norm);

/* ------------------------------------------------------------------------ */
/* Optimizer objects                                                        */
/* ------------------------------------------------------------------------ */
/*
 * An optimizer object owns its state (AdamW's m and v, SGD's momentum) for
 * the ranges of the flat parameter buffer this rank updates, `owned`: all
 * of it under data parallelism, a 1/dp share of every bucket under ZeRO.
 * Its state buffers hold the owned ranges one after another (element j of
 * range k's part belongs to parameter owned[k].begin + j), so a checkpoint
 * writes them with the parameters' shard map of those ranges.
 * The caller drives one optimizer step as
 *
 *     dt_optimizer_begin(o, step, lr);            // every step, before backward
 *     dt_optimizer_update(o, p, g, begin, end);    // any split of each owned range, any order
 *     dt_optimizer_end(o, applied);                // applied = not skipped
 *
 * update() may be called per gradient bucket as buckets become final; since
 * every element is updated independently, any split gives the same bits.
 * The object counts the updates it applied (AdamW's bias-correction step
 * is that count + 1), so a skipped step (loss scaling) leaves it alone.
 *
 * Ownership: params and grads are the caller's full flat buffers, indexed
 * by absolute offset, borrowed for the call; the tensors table is copied.
 */

typedef struct dt_range {
    size_t begin, end; /* [begin, end) of a flat buffer */
} dt_range;

typedef enum dt_optim_kind { DT_OPTIM_ADAMW, DT_OPTIM_SGD, DT_OPTIM_COUNT } dt_optim_kind;

/* "adamw", "sgd" (indexable by dt_optim_kind). */
extern const char *const dt_optim_names[DT_OPTIM_COUNT];

typedef struct dt_optim_config {
    dt_optim_kind kind;
    float weight_decay;    /* decoupled decay of the tensors marked `decay` */
    dt_adamw_config adamw; /* AdamW: betas and eps (its weight_decay is ignored) */
    float momentum;        /* SGD: 0 for none */
    bool nesterov;         /* SGD */
    /* AdamW: from this 0-based step on, beta2 = 1 (the second moment is
     * frozen, 1-bit Adam's compression stage). At that step's begin() v
     * becomes its bias-corrected value v / (1 - beta2^count), which the
     * frozen updates use as it is. -1: never. */
    int64_t freeze_v_from;
    /* Keep the state in a file in this directory instead of memory (NULL:
     * memory): a shared mapping the update streams through in pieces, read
     * ahead and written back asynchronously, so only a window of it is
     * resident (offload.c). The file is unlinked at once and its size
     * reserved at creation: a disk too small fails there, naming it. */
    const char *offload_dir;
} dt_optim_config;

/* AdamW with PyTorch's defaults (dt_adamw_config_default), no freeze. */
dt_optim_config dt_optim_config_default(void);

/* A parameter tensor as the optimizer sees it. */
typedef struct dt_optim_tensor {
    size_t offset, count; /* flat range [offset, offset + count) */
    bool decay;           /* weight decay applies (matrices, not biases/norms) */
} dt_optim_tensor;

typedef struct dt_optimizer dt_optimizer;

/* An optimizer for the parameters in the ranges owned[0..nowned) (sorted,
 * disjoint, possibly empty), described by `tensors` (sorted by offset,
 * non-overlapping; parts outside the owned ranges are ignored). State
 * starts at zero. DT_ERR_INVALID names a bad field. */
dt_status dt_optimizer_create(dt_optimizer **out, const dt_optim_config *c,
                              const dt_optim_tensor *tensors, size_t ntensors,
                              const dt_range *owned, size_t nowned);
void dt_optimizer_destroy(dt_optimizer *o);

/* Start 0-based step `step` with learning rate lr (and, at freeze_v_from,
 * freeze the second moment). */
void dt_optimizer_begin(dt_optimizer *o, int64_t step, float lr);
/* Update params[begin, end) from grads[begin, end); [begin, end) must lie
 * in one owned range. */
void dt_optimizer_update(dt_optimizer *o, float *params, const float *grads, size_t begin,
                         size_t end);
/* End the step; `applied` counts it as an update (false: it was skipped). */
void dt_optimizer_end(dt_optimizer *o, bool applied);

const dt_optim_config *dt_optimizer_config(const dt_optimizer *o);
/* The owned ranges, and the parameters they hold in all. */
size_t dt_optimizer_num_owned(const dt_optimizer *o);
dt_range dt_optimizer_owned(const dt_optimizer *o, size_t i);
size_t dt_optimizer_owned_count(const dt_optimizer *o);
/* Updates applied so far; set on resume. */
int64_t dt_optimizer_count(const dt_optimizer *o);
dt_status dt_optimizer_set_count(dt_optimizer *o, int64_t count);
/* The bytes of state an optimizer of config c owning owned_count
 * parameters allocates (what dt_optimizer_state_bytes will say): for
 * memory plans. */
size_t dt_optimizer_plan_bytes(const dt_optim_config *c, size_t owned_count);
/* ... and of those, the bytes mapped into the process at the peak: all of
 * them in memory; with offload_dir the piece being updated (the read-ahead
 * and the write-back are the page cache's, not the process's). */
size_t dt_optimizer_plan_resident(const dt_optim_config *c, size_t owned_count);
/* Bytes of state (what a memory report calls "optimizer"). */
size_t dt_optimizer_state_bytes(const dt_optimizer *o);

/* The state buffers (AdamW: "adamw.m", "adamw.v"; SGD: "sgd.momentum"),
 * each dt_optimizer_owned_count() floats: the owned ranges one after
 * another. The checkpoint writes and reads them in place; with
 * offload_dir it then calls dt_optimizer_settle(), which writes the state
 * back to its file and drops it from memory (no-op in memory). */
size_t dt_optimizer_num_states(const dt_optimizer *o);
float *dt_optimizer_state(dt_optimizer *o, size_t i, const char **name);
void dt_optimizer_settle(dt_optimizer *o);
/* Bytes of the offload file (0 in memory). */
size_t dt_optimizer_offload_bytes(const dt_optimizer *o);

#ifdef __cplusplus
}
#endif
#endif /* DTRAIN_OPTIM_H */
