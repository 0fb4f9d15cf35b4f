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
 * An optimizer object owns its state for the ranges of the flat parameter
 * buffer this rank updates, `owned`: all of it under data parallelism, a
 * 1/dp share of every bucket under ZeRO (a share cuts tensors anywhere).
 * The caller drives one optimizer step as
 *
 *     dt_optimizer_begin(o, step, lr);            // every step, before backward
 *     if (dt_optimizer_rangewise(o))              // elementwise this step:
 *         dt_optimizer_update(o, p, g, b, e);     //   any split of each owned range, any order
 *     else
 *         dt_optimizer_step(o, p, g);             //   all owned ranges at once (collective)
 *     dt_optimizer_end(o, applied);               // applied = not skipped
 *
 * dt_optimizer_step works for every optimizer (for an elementwise one it
 * is update() over each owned range). The object counts the updates it
 * applied (bias corrections and Lookahead's k use that count), so a
 * skipped step (loss scaling) leaves it alone.
 *
 * Kinds and what they need (docs/optim.md has the equations and memory):
 *
 *   kind          state per parameter             per-tensor statistics   rangewise
 *   adamw         m, v (fp32)                     -                       yes
 *   sgd           momentum (fp32) or none         -                       yes
 *   radam         m, v                            -                       yes
 *   adamw8bit     m, v as 1 byte each + block     - (blocks: see below)   no
 *                 scales
 *   lamb          m, v                            |p|, |update|           no
 *   lars          momentum                        |p|, |g|                no
 *   adafactor     (m,) v of vectors only          row/col sums of g^2,    no
 *                 + row and column factors          |p|, |update|
 *   onebit-adam   m, v                            -                       yes
 *   onebit-lamb   m, v + frozen trust ratios      |p|, |update| (warm-up) warm-up: no
 *   lookahead     the inner one's + slow weights  the inner one's         the inner one's
 *   lbfgs         2*history + 6 vectors           dot products (all)      no
 *   kfac          momentum (fp32) or none         A, G factors and their  no
 *                 + per linear layer A (in^2), G    inverses (per layer,
 *                 (out^2) and their inverses        averaged over ranks)
 *   --grad-centralization (any kind): the row sums of every matrix's
 *   gradient (the rows' means are subtracted first); never rangewise.
 *
 * Sharding. Per-tensor statistics are sums over a tensor's elements; a
 * rank that owns only part of a tensor adds up its part, and the config's
 * `reduce` function sums these partial sums over the ranks sharing the
 * tensors (an allreduce over the dp x cp group under ZeRO; NULL when one rank
 * owns every parameter). The statistics are a vector of doubles laid out by
 * the tensor table, the same on every rank, so the call is one allreduce
 * of the same length everywhere; a step makes at most three. Every rank
 * of the group must call dt_optimizer_step for every step.
 *
 * Offload. With offload_dir the per-parameter state over the owned ranges
 * (8-bit AdamW: its code bytes) is a file, and every pass over it goes in
 * windows of a piece of the file each, so only a window is in memory; the
 * bits are those of the state in memory. Every kind but lbfgs and kfac
 * (whole-buffer steps: DT_ERR_INVALID) streams; LAMB walks its state twice
 * a step. Per-tensor state, statistics, Adafactor's v of vectors and 8-bit
 * block scales stay in memory.
 *
 * Ownership: params and grads are the caller's full flat buffers, indexed
 * by absolute offset, borrowed for the call; the tensors table is copied.
 */

typedef struct dt_range {
    size_t begin, end; /* [begin, end) of a flat buffer */
} dt_range;

/* Append only: a checkpoint records the kind as its number. */
typedef enum dt_optim_kind {
    DT_OPTIM_ADAMW,
    DT_OPTIM_SGD,
    DT_OPTIM_ADAFACTOR,
    DT_OPTIM_ADAMW8BIT,
    DT_OPTIM_LAMB,
    DT_OPTIM_LARS,
    DT_OPTIM_ONEBIT_ADAM,
    DT_OPTIM_ONEBIT_LAMB,
    DT_OPTIM_RADAM,
    DT_OPTIM_LOOKAHEAD,
    DT_OPTIM_LBFGS,
    DT_OPTIM_KFAC,
    DT_OPTIM_COUNT
} dt_optim_kind;

/* "adamw", "sgd", "adafactor", "adamw8bit", "lamb", "lars", "onebit-adam",
 * "onebit-lamb", "radam", "lookahead", "lbfgs", "kfac" (indexable by
 * dt_optim_kind). */
extern const char *const dt_optim_names[DT_OPTIM_COUNT];

/* Adafactor (Shazeer & Stern 2018, as Hugging Face's transformers
 * implements it). */
typedef struct dt_adafactor_config {
    float beta1;          /* first moment of the scaled update; 0: none (no m state) */
    float decay_rate;     /* beta2 at step t is 1 - t^decay_rate; -0.8 */
    float eps1;           /* added to g^2; 1e-30 */
    float eps2;           /* floor of the parameter scale RMS(p); 1e-3 */
    float clip_threshold; /* the update is scaled down to RMS <= this; 1.0 */
    bool relative_step;   /* step size min(1e-2, 1/sqrt(t)) instead of the schedule's lr */
    bool scale_parameter; /* multiply the step size by max(eps2, RMS(p)) */
    bool warmup_init;     /* relative step min(1e-6 t, 1/sqrt(t)) */
} dt_adafactor_config;

/* L-BFGS (Nocedal & Wright, algorithm 7.4 and 3.5/3.6), as torch.optim.LBFGS. */
typedef struct dt_lbfgs_config {
    int history;            /* m: (s, y) pairs kept; 10 */
    int max_iter;           /* iterations per optimizer step; 20 */
    int max_eval;           /* function evaluations per step; max_iter * 5 / 4 */
    float tolerance_grad;   /* stop when max |g| <= this; 1e-7 */
    float tolerance_change; /* stop when a step or a loss change is below this; 1e-9 */
    bool line_search;       /* strong-Wolfe line search; false: fixed steps of lr */
} dt_lbfgs_config;

/* K-FAC for the linear layers (Martens & Grosse 2015; src/optim/kfac.c). */
typedef struct dt_kfac_config {
    double damping; /* Tikhonov damping lambda, split between the factors; 1e-3 */
    int inv_every;  /* updates between inverse computations; 10 */
    double ema;     /* running-average decay of the factors; 0.95 */
    double kl_clip; /* bound on lr^2 <U, g> over the layers (the update's scale); 1e-3 */
} dt_kfac_config;

/* Sums n doubles over the ranks that share the optimizer's tensors, in
 * place (the same n on every rank). NULL in the config: this rank owns
 * every parameter and nothing is summed. */
typedef dt_status (*dt_optim_reduce_fn)(void *user, double *values, size_t n);
/* Broadcasts n floats from rank `root` (of the same group) to the others. */
typedef dt_status (*dt_optim_bcast_fn)(void *user, float *values, size_t n, int root);

typedef struct dt_optim_config {
    dt_optim_kind kind;
    float weight_decay; /* decay of the tensors marked `decay` (AdamW, RAdam, LAMB, Adafactor:
                           decoupled; SGD, LARS: L2, added to the gradient) */
    /* AdamW, RAdam, 8-bit AdamW, LAMB, 1-bit Adam/LAMB: betas and eps (its
     * weight_decay is ignored). */
    dt_adamw_config adamw;
    float momentum; /* SGD, LARS: 0 for none */
    bool nesterov;  /* SGD, LARS */
    /* AdamW: from this 0-based step on, beta2 = 1 (the second moment is
     * frozen, 1-bit Adam's compression stage). At that step's begin() v
     * becomes its bias-corrected value v / (1 - beta2^count), which the
     * frozen updates use as it is. -1: never. 1-bit Adam and 1-bit LAMB:
     * the first step of the compression stage (>= 1; required). */
    int64_t freeze_v_from;
    float trust_coeff; /* LARS: eta, 1e-3 */
    float trust_eps;   /* LARS: added to the trust ratio's denominator, 1e-8 */
    dt_adafactor_config adafactor;
    size_t block;          /* 8-bit AdamW: values per quantisation block, 16..65536,
                              a multiple of 16; 2048 */
    dt_optim_kind inner;   /* Lookahead: the optimizer it wraps (not lookahead or lbfgs) */
    int lookahead_k;       /* Lookahead: fast steps per slow step; 5 */
    float lookahead_alpha; /* Lookahead: slow step size in (0, 1]; 0.5 */
    dt_lbfgs_config lbfgs;
    bool centralize;           /* gradient centralisation: subtract each matrix row's mean from
                                  its gradient before the update (Yong et al. 2020) */
    dt_optim_reduce_fn reduce; /* see "Sharding" above; NULL: nothing to sum */
    void *reduce_user;         /* also bcast's */
    /* K-FAC: its hyper-parameters; the data-parallel group it averages its
     * factors over (reduce, divided by nranks) and spreads the inverses on
     * (bcast; this rank's index in it). 0 of 1 and NULL: one rank. */
    dt_kfac_config kfac;
    dt_optim_bcast_fn bcast;
    int rank, nranks;
    /* Keep the state in a file in this directory instead of memory (NULL:
     * memory): a shared mapping the update streams through in pieces, read
     * ahead and written back asynchronously, so only a window of it is
     * resident (offload.c). The file is unlinked at once and its size
     * reserved at creation: a disk too small fails there, naming it. */
    const char *offload_dir;
} dt_optim_config;

/* AdamW with PyTorch's defaults (dt_adamw_config_default), no freeze, and
 * every other kind's defaults as listed above. */
dt_optim_config dt_optim_config_default(void);
/* Adafactor's defaults: beta1 0 (none), decay -0.8, eps (1e-30, 1e-3), clip 1,
 * relative step and parameter scaling on, no warm-up init. */
dt_adafactor_config dt_adafactor_config_default(void);

/* Check a config as dt_optimizer_create does (DT_ERR_INVALID naming the
 * bad hyper-parameter and its value), without building anything. */
dt_status dt_optim_config_validate(const dt_optim_config *c);

/* A parameter tensor as the optimizer sees it. */
typedef struct dt_optim_tensor {
    size_t offset, count; /* flat range [offset, offset + count) */
    bool decay;           /* a matrix that weight decay applies to (LAMB and LARS adapt only
                             these; biases and LayerNorm parameters are false) */
    size_t rows, cols;    /* a matrix's shape, row-major (rows * cols == count): Adafactor
                             factors it, gradient centralisation centres its rows. 0, 0:
                             a vector */
    bool linear;          /* a linear layer's weight (out = rows, in = cols) whose input
                             and output-gradient statistics the model reports (K-FAC
                             preconditions it) */
} dt_optim_tensor;

typedef struct dt_optimizer dt_optimizer;

/* An optimizer for the parameters in the ranges owned[0..nowned) (sorted,
 * disjoint, possibly empty), described by `tensors` (sorted by offset,
 * non-overlapping; the whole table on every rank that shares it, since
 * per-tensor statistics are laid out by it; parts outside the owned ranges
 * are ignored). State starts at zero. DT_ERR_INVALID names a bad field. */
dt_status dt_optimizer_create(dt_optimizer **out, const dt_optim_config *c,
                              const dt_optim_tensor *tensors, size_t ntensors,
                              const dt_range *owned, size_t nowned);
void dt_optimizer_destroy(dt_optimizer *o);

/* Start 0-based step `step` with learning rate lr (and, at freeze_v_from,
 * freeze the second moment). */
void dt_optimizer_begin(dt_optimizer *o, int64_t step, float lr);
/* Whether this step's update is elementwise, so update() may be called on
 * any piece of an owned range as soon as its gradient is final. */
bool dt_optimizer_rangewise(const dt_optimizer *o);
/* Update params[begin, end) from grads[begin, end); [begin, end) must lie
 * in one owned range, and the step must be rangewise. */
void dt_optimizer_update(dt_optimizer *o, float *params, const float *grads, size_t begin,
                         size_t end);
/* Update every owned range. Calls the config's reduce function (when set)
 * a fixed number of times, the same on every rank; its failure is returned
 * with the parameters untouched when it fails before the first write.
 * Gradient centralisation rewrites the owned part of grads. */
dt_status dt_optimizer_step(dt_optimizer *o, float *params, float *grads);
/* End the step; `applied` counts it as an update (false: it was skipped). */
void dt_optimizer_end(dt_optimizer *o, bool applied);

/*
 * 1-bit Adam / 1-bit LAMB: in the compression stage (steps >=
 * freeze_v_from) the ranks average their momentum rather than their
 * gradients. The gradient synchronisation calls premix on each final
 * gradient range before it is compressed, turning the local gradient g
 * (carrying the loss scale) into x = g + scale * beta1 / (1 - beta1) * m;
 * the averaged x gives the new momentum m = (1 - beta1) * avg(x) =
 * beta1 * m + (1 - beta1) * avg(g). Since a scaled-sign codec is
 * scale-equivariant, compressing x with error feedback is compressing the
 * local momentum, as Tang et al. (2021) do. Outside the compression stage,
 * or for other kinds, premixing() is false and premix does nothing.
 */
bool dt_optimizer_premixing(const dt_optimizer *o);
void dt_optimizer_premix(const dt_optimizer *o, float *grads, size_t begin, size_t end,
                         float scale);

/*
 * L-BFGS is driven by the loss: it evaluates the loss and gradient at
 * points it chooses (a line search), so its step is a loop around the
 * caller's evaluation:
 *
 *     dt_optimizer_begin(o, step, lr);
 *     evaluate(params) -> loss, grads;              // the full (or fixed) batch
 *     while (dt_lbfgs_next(o, params, grads, loss, &more) == DT_OK && more)
 *         evaluate(params) -> loss, grads;          // params were moved
 *     dt_optimizer_end(o, true);
 *
 * dt_lbfgs_next takes the loss and gradient at the current params and
 * either moves params to the next point to evaluate (*more = true) or
 * leaves them at the step's result (*more = false). Collective when reduce
 * is set (dot products). dt_optimizer_step and update() are not used.
 */
dt_status dt_lbfgs_next(dt_optimizer *o, float *params, const float *grads, double loss,
                        bool *more);
/* Function evaluations of the current step so far. */
int dt_lbfgs_evals(const dt_optimizer *o);

/*
 * K-FAC takes the linear layers' statistics from backward (dt_gpt's
 * dt_linear_stats_fn has this signature after the optimizer): x (N, in)
 * the layer's input, dy (N, out) the gradient of its output, dy / scale
 * each token's own gradient. Called between begin() and step(), any number
 * of times per layer (micro-batches); the step averages them. Any other
 * kind: nothing. DT_ERR_INVALID when no linear tensor sits at the offset
 * with that shape.
 */
dt_status dt_kfac_accumulate(dt_optimizer *o, size_t weight_offset, const float *x, const float *dy,
                             int N, int in, int out, float scale);

/*
 * The compute copy (mixed precision: issue 28's weight handle). With a copy
 * function set, the elementwise update rules (AdamW, 1-bit Adam, RAdam,
 * SGD: dt_optimizer_writes_copy) call fn(user, src, begin, count) right
 * after they wrote parameters [begin, begin + count) (src points at the
 * first), chunk by chunk while the chunk is still in cache, so the caller
 * rounds the new values into its 16-bit copy without a pass of its own
 * (dt_gpt_write_weights16 has this shape). Chunks are disjoint and may be
 * handed to fn from several OpenMP threads at once. The other kinds never
 * call it. fn NULL: no copy (the default). The parameters' bits do not
 * depend on it.
 */
typedef void (*dt_optim_copy_fn)(void *user, const float *src, size_t begin, size_t count);
void dt_optimizer_set_copy(dt_optimizer *o, dt_optim_copy_fn fn, void *user);
/* Whether this optimizer's updates call the copy function for every
 * parameter it writes: an elementwise kind whose step writes parameters
 * through the update rule only (not Lookahead, whose slow-weight sync
 * writes them too). */
bool dt_optimizer_writes_copy(const dt_optimizer *o);

const dt_optim_config *dt_optimizer_config(const dt_optimizer *o);
/* The owned ranges, and the parameters they hold in all. */
size_t dt_optimizer_num_owned(const dt_optimizer *o);
dt_range dt_optimizer_owned(const dt_optimizer *o, size_t i);
size_t dt_optimizer_owned_count(const dt_optimizer *o);
/* Updates applied so far; set on resume. */
int64_t dt_optimizer_count(const dt_optimizer *o);
dt_status dt_optimizer_set_count(dt_optimizer *o, int64_t count);
/* The bytes of per-parameter state an optimizer of config c owning
 * owned_count parameters allocates, for memory plans: what
 * dt_optimizer_state_bytes will say less the per-tensor statistics and
 * factors (a few values per tensor or matrix row and column) and
 * Adafactor's v of vector tensors (biases and norms). */
size_t dt_optimizer_plan_bytes(const dt_optim_config *c, size_t owned_count);
/* ... and of those, the bytes mapped into the process at the peak: all of
 * them in memory; with offload_dir the window being updated (the
 * read-ahead and the write-back are the page cache's, not the process's)
 * and what stays in memory (8-bit AdamW's block scales). */
size_t dt_optimizer_plan_resident(const dt_optim_config *c, size_t owned_count);
/* Bytes of state (what a memory report calls "optimizer"), everything
 * included (quantisation scales, factors, statistics). */
size_t dt_optimizer_state_bytes(const dt_optimizer *o);

/*
 * Per-parameter state, as a checkpoint sees it: named fp32 buffers ("adamw.m",
 * "adamw.v", "sgd.momentum", "lookahead.slow", ...), each laid out as its
 * ranges one after another (usually the owned ranges; Adafactor's "v" covers
 * only the owned parts of vectors). dt_optimizer_state returns the buffer
 * itself, or NULL when the state is stored another way (8-bit AdamW's
 * bytes): then state_get / state_set convert (exactly: a get followed by a
 * set restores the same bytes).
 */
size_t dt_optimizer_num_states(const dt_optimizer *o);
float *dt_optimizer_state(dt_optimizer *o, size_t i, const char **name);
/* State i's ranges (sorted, disjoint, inside the owned ranges) and their
 * element total. The array is the object's. */
const dt_range *dt_optimizer_state_ranges(const dt_optimizer *o, size_t i, size_t *nranges);
size_t dt_optimizer_state_count(const dt_optimizer *o, size_t i);
void dt_optimizer_state_get(const dt_optimizer *o, size_t i, float *dst);
void dt_optimizer_state_set(dt_optimizer *o, size_t i, const float *src);
/* With offload_dir the per-parameter state lives in a file (see
 * dt_optim_config.offload_dir): the checkpoint reads and writes it in place
 * (or through state_get / state_set), then calls dt_optimizer_settle(),
 * which writes it back to its file and drops it from memory (no-op in
 * memory). */
void dt_optimizer_settle(dt_optimizer *o);
/* Bytes of the offload file (0 in memory). */
size_t dt_optimizer_offload_bytes(const dt_optimizer *o);

/*
 * Per-tensor state: what belongs to a whole tensor rather than to its
 * parameters (Adafactor's row and column factors, 1-bit LAMB's frozen trust
 * ratios). Each tensor of the table has `len` floats of it at `offset` of
 * the buffer (len 0: none); every rank that shares the table holds all of
 * it, with the same values, since it is computed from summed statistics.
 * A checkpoint keys it by tensor.
 */
size_t dt_optimizer_num_tensor_states(const dt_optimizer *o);
float *dt_optimizer_tensor_state(dt_optimizer *o, size_t k, const char **name, size_t *total);
void dt_optimizer_tensor_state_at(const dt_optimizer *o, size_t k, size_t tensor, size_t *offset,
                                  size_t *len);

/* Scalars kept besides the per-parameter and per-tensor state, the same on
 * every rank (L-BFGS: iteration and evaluation counts, pairs in the history,
 * the last step size, the Hessian scale, the pairs' 1 / y.s). A checkpoint
 * stores them once. set validates them (DT_ERR_CORRUPT). */
size_t dt_optimizer_num_scalars(const dt_optimizer *o);
void dt_optimizer_scalars_get(const dt_optimizer *o, double *dst);
dt_status dt_optimizer_scalars_set(dt_optimizer *o, const double *src);

#ifdef __cplusplus
}
#endif
#endif /* DTRAIN_OPTIM_H */
