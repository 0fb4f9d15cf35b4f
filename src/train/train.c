/*
 * train.c — the training loop: data, model, DDP, optimizer, schedule,
 * evaluation, checkpoints, metrics, progress and a generated sample.
 *
 * One optimizer step:
 *
 *     K times: next batch -> forward -> backward(S/K)      (the first backward
 *              overwrites the gradients, so nothing zeroes them; the last
 *              one feeds the DDP hook, which starts bucket allreduces early;
 *              S is the loss scale with loss scaling on, else 1)
 *     finish DDP: per averaged bucket, unscale by 1/S noting inf/nan (loss
 *              scaling), sum of squares (and, without clipping or
 *              scaling, the optimizer update of that range at once)
 *     average loss, norm, stop flag and inf/nan flag over ranks; a NaN/inf
 *              loss stops the run here; an inf/nan flag on any rank skips
 *              the step on every rank (loss scaling)
 *     clip by the global norm, update (when clipping or scaling; not when
 *              skipped)
 *     metrics, progress, evaluation, checkpoint
 *
 * Invariants:
 *   - Every rank runs the same sequence of collectives: bucket allreduces,
 *     then the loss average, then (at fixed steps) the evaluation average,
 *     the parameter check and the checkpoint status broadcast.
 *   - Only rank 0 reads and writes checkpoints; on resume it broadcasts the
 *     state, so ranks need no shared file system.
 *   - A checkpoint holds everything that determines the future: parameters,
 *     optimizer state, the step (the schedule is a function of it and the
 *     config), the data-loader position, the token count, the skipped steps
 *     (AdamW counts applied updates only) and the loss scaler. The data order
 *     is a function of (seed, epoch), so a resumed run is bit-identical.
 */
#include "dtrain/comm.h"
#include "dtrain/data.h"
#include "dtrain/launch.h"
#include "dtrain/nn.h"
#include "dtrain/optim.h"
#include "dtrain/parallel.h"
#include "dtrain/tensor.h"
#include "train_internal.h"

#include <float.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

const char *const dt_train_optimizer_names[DT_TRAIN_OPTIMIZER_COUNT] = {"adamw", "sgd"};

#define TRAIN_STATE_VERSION 1

/* The largest loss scale applied: 2^126, whose inverse 2^-126 is still a
 * normal float. The engine runs with denormals flushed to zero (tensor
 * layer), so unscaling by a subnormal 1/scale would zero every gradient. */
#define MAX_APPLIED_SCALE 0x1p126f

void dt_train_config_init(dt_train_config *c) {
    memset(c, 0, sizeof *c);
    c->model = "tiny";
    c->val_split = 0.05;
    c->tokenizer = DT_TOKENIZER_CHAR;
    c->accum = 1;
    c->steps = 100;
    c->optimizer = DT_TRAIN_ADAMW;
    c->lr = 1e-3;
    c->min_lr = 0;
    c->weight_decay = 0.1;
    c->momentum = 0.9;
    c->clip = 1.0;
    c->precision = DT_PRECISION_FP32;
    c->loss_scaling = -1;
    c->scaler = dt_scaler_config_default();
    c->grad_dtype = DT_F32;
    c->compress.kind = DT_CODEC_NONE;
    c->compress_ef = DT_EF_DEFAULT;
    c->beta1 = 0.9;
    c->beta2 = 0.95;
    c->eps = 1e-8;
    c->schedule = DT_SCHED_COSINE;
    c->eval_batches = 8;
    c->keep = 3;
    c->seed = 1337;
    c->bucket_bytes = DT_DDP_DEFAULT_BUCKET_BYTES;
    c->sample_tokens = 256;
    c->progress = -1;
}

typedef struct trainer {
    const dt_train_config *c;
    dt_group *g;
    int rank, world;
    dt_token_file *data, *val_data; /* val_data NULL: validation is a split of data */
    const dt_tokenizer *tok;
    dt_loader *train, *val;
    dt_gpt_config mc;
    dt_gpt *m;
    dt_ddp *ddp;
    size_t n;             /* parameters */
    float *opt_a, *opt_b; /* AdamW m, v; SGD momentum in opt_a */
    dt_adamw_config adamw;
    dt_schedule sched;
    int B, T, K;
    int32_t *inputs, *targets;   /* (B,T) */
    size_t *tens_off, *tens_end; /* tensor ranges, sorted by offset */
    bool *tens_decay;
    size_t ntens;
    /* Per step. */
    int64_t step;          /* steps completed */
    int64_t tokens;        /* tokens processed by all ranks so far */
    float lr;              /* of the step being taken */
    double sumsq;          /* of the averaged gradient, accumulated per bucket */
    bool update_in_finish; /* no clipping, no scaling: update each bucket as it arrives */
    /* Dynamic loss scaling (docs/amp.md). The loss is multiplied by the
     * scale through backward's grad_scale; each averaged bucket is unscaled
     * in on_bucket, and a step with an inf/nan gradient on any rank is
     * skipped by every rank. */
    bool scaling;
    dt_scaler scaler;
    float inv_scale;  /* 1 / the scale of the step being taken */
    bool found_inf;   /* this step: an averaged gradient on this rank is inf/nan */
    int64_t skipped;  /* steps of the whole trajectory whose update was skipped */
    dt_json cfg_json; /* the resolved config */
    const char *cfg_text;
    int64_t kill_at, perturb_at; /* test hooks (maybe_fault): step or -1 */
    int64_t overflow_at;         /* test hook (on_bucket): step or -1 */
    int64_t ckpt_precision;      /* dt_precision of the checkpoint resumed from */
    float ckpt_scale;            /* loss scale of the checkpoint's codec residuals (1: none) */
    /* DDP codec state in checkpoints (docs/compress.md): every rank's, held
     * by rank 0 (world x per-rank bytes; other ranks: their own). */
    uint8_t *ddp_states;
    size_t ddp_state_bytes; /* per rank; 0 without a codec */
    char ddp_ident[160];    /* codec, EF, dtype, buckets: what the state belongs to */
    bool ddp_restore;       /* rank 0 on resume: the checkpoint's states fit this run */
} trainer;

/* The loss scale the next step applies. */
static float applied_scale(const trainer *t) {
    return fminf(dt_scaler_scale(&t->scaler), MAX_APPLIED_SCALE);
}

/* ------------------------------------------------------------------------ */
/* Optimizer over a flat range, split at tensor boundaries (decay differs)  */
/* ------------------------------------------------------------------------ */

static void update_range(trainer *t, size_t begin, size_t end) {
    float *p = dt_gpt_params(t->m), *g = dt_gpt_grads(t->m);
    const dt_train_config *c = t->c;
    /* --compress-freeze-v: beta2 = 1 keeps v (optim.h), from the first
     * compressed step on. */
    bool frozen = c->compress_freeze_v && t->step >= c->compress_start;
    dt_adamw_config fz = t->adamw;
    fz.beta2 = 1.0f;
    for (size_t i = 0; i < t->ntens; i++) {
        size_t lo = t->tens_off[i] > begin ? t->tens_off[i] : begin;
        size_t hi = t->tens_end[i] < end ? t->tens_end[i] : end;
        if (lo >= hi)
            continue;
        float wd = t->tens_decay[i] ? (float)c->weight_decay : 0.0f;
        if (c->optimizer == DT_TRAIN_ADAMW)
            dt_adamw_step(p + lo, g + lo, t->opt_a + lo, t->opt_b + lo, hi - lo, t->lr,
                          frozen ? &fz : &t->adamw, t->step - t->skipped + 1, wd);
        else
            dt_sgd_step(p + lo, g + lo, c->momentum > 0 ? t->opt_a + lo : NULL, hi - lo, t->lr,
                        (float)c->momentum, false, wd);
    }
}

/* --compress-ramp: the top-k fraction of the step after `done` steps, 0
 * outside the ramp (the codec's own). Exponential from DT_TRAIN_RAMP_START
 * at the first compressed step towards the codec's fraction, which the
 * step after the ramp reaches (Deep Gradient Compression's 25%, 6.25%,
 * 1.56%, ... per stage, made continuous). A function of the step, so a
 * resume agrees. */
static double ramp_fraction(const dt_train_config *c, int64_t done) {
    int64_t s = done - c->compress_start;
    if (c->compress_ramp <= 0 || s < 0 || s >= c->compress_ramp)
        return 0;
    double u = (double)s / (double)c->compress_ramp;
    return pow(DT_TRAIN_RAMP_START, 1 - u) * pow(c->compress.fraction, u);
}

/* --compress-freeze-v, before the first compressed step: v becomes the
 * bias-corrected second moment of the dense steps, v / (1 - beta2^s), which
 * the frozen updates use as is. A function of the step, so a resume from
 * either side of it is bit-identical. */
static void freeze_second_moment(trainer *t) {
    int64_t s = t->step - t->skipped;
    if (s < 1)
        return;
    float inv = (float)(1.0 / (1.0 - pow((double)t->adamw.beta2, (double)s)));
    dt_scale(t->opt_b, t->n, inv);
}

/* DDP callback: each averaged bucket, in order from the end of the buffer.
 * With loss scaling, the bucket is unscaled here (one pass that also finds
 * inf/nan), so the norm and the update see true gradients. */
static void on_bucket(void *user, size_t begin, size_t end) {
    trainer *t = user;
    float *g = dt_gpt_grads(t->m);
    size_t mid = t->n / 2;
    if (t->step + 1 == t->overflow_at && begin <= mid && mid < end)
        g[mid] = INFINITY; /* DT_FAULT_OVERFLOW: only this rank sees it */
    if (t->scaling)
        t->found_inf |= dt_unscale(g + begin, end - begin, t->inv_scale);
    t->sumsq += dt_grad_sumsq(g + begin, end - begin);
    if (t->update_in_finish)
        update_range(t, begin, end);
}

/* ------------------------------------------------------------------------ */
/* Setup                                                                    */
/* ------------------------------------------------------------------------ */

/* A rejected configuration value. */
#define bad(...) dt_error_set(DT_ERR_INVALID, __VA_ARGS__)

static dt_status check_config(const dt_train_config *c) {
    if (!c->data || !*c->data)
        return bad("--data: a training text (.txt) or token file (.tok) is required");
    if (c->steps < 1)
        return bad("--steps %" PRId64 ": must be at least 1", c->steps);
    if (c->accum < 1)
        return bad("--accum %d: must be at least 1", c->accum);
    if (c->batch < 0 || c->global_batch < 0)
        return bad("--batch %d / --global-batch %d: must be positive", c->batch, c->global_batch);
    if (c->batch == 0 && c->global_batch == 0)
        return bad("--batch: give a per-rank batch (or --global-batch)");
    if (c->seq < 0 || c->layers < 0 || c->dim < 0 || c->heads < 0 || c->vocab < 0)
        return bad("model sizes must be positive (layers %d, dim %d, heads %d, seq %d, vocab %d)",
                   c->layers, c->dim, c->heads, c->seq, c->vocab);
    if (!(c->lr > 0) || !isfinite(c->lr))
        return bad("--lr %g: must be positive", c->lr);
    if (!(c->val_split >= 0 && c->val_split < 1))
        return bad("--val-split %g: must be in [0, 1)", c->val_split);
    if (c->keep < 1)
        return bad("--keep %d: must be at least 1", c->keep);
    if (c->eval_batches < 1)
        return bad("--eval-batches %d: must be at least 1", c->eval_batches);
    if (c->grad_dtype != DT_F32 && c->grad_dtype != DT_BF16 && c->grad_dtype != DT_F16)
        return bad("--grad-dtype: gradients travel as fp32, bf16 or fp16");
    if (c->compress_start < 0)
        return bad("--compress-start %" PRId64 ": must be 0 or more", c->compress_start);
    if (c->compress_freeze_v && (c->optimizer != DT_TRAIN_ADAMW || c->compress_start < 1 ||
                                 c->compress.kind == DT_CODEC_NONE))
        return bad("--compress-freeze-v needs --optimizer adamw, a --compress codec and "
                   "--compress-start >= 1 (the dense steps make the second moment it freezes); "
                   "got %s, %s, %" PRId64,
                   dt_train_optimizer_names[c->optimizer],
                   c->compress.kind == DT_CODEC_NONE ? "no codec" : "a codec", c->compress_start);
    if (c->compress_ramp < 0)
        return bad("--compress-ramp %" PRId64 ": must be 0 or more", c->compress_ramp);
    if (c->compress_ramp > 0 && (c->compress.kind != DT_CODEC_TOPK || c->compress.count != 0 ||
                                 !(c->compress.fraction < DT_TRAIN_RAMP_START))) {
        char cb[64];
        return bad("--compress-ramp %" PRId64 " needs --compress topk:F with a fraction F below "
                   "%g (the ramp starts there); got %s",
                   c->compress_ramp, DT_TRAIN_RAMP_START,
                   dt_codec_format(&c->compress, cb, sizeof cb));
    }
    if (c->compress_dense_below < 0)
        return bad("--compress-dense-below %" PRId64 ": must be 0 or more",
                   c->compress_dense_below);
    if (c->grad_dtype != DT_F32 && c->compress.kind != DT_CODEC_NONE)
        return bad("--grad-dtype %s with --compress: choose one (the codec defines the wire "
                   "format)",
                   dt_dtype_name(c->grad_dtype));
    if (c->scaler.init_scale > (double)MAX_APPLIED_SCALE)
        return bad("--loss-scale-init %g: at most 2^126 (%g), the largest scale whose inverse is a "
                   "normal float",
                   c->scaler.init_scale, (double)MAX_APPLIED_SCALE);
    if (c->loss_scaling < -1 || c->loss_scaling > 1)
        return bad("--loss-scaling %d: must be -1 (auto), 0 (off) or 1 (on)", c->loss_scaling);
    return DT_OK;
}

/* Open --data (and --val-data, with the training data's vocabulary). */
static dt_status open_data(trainer *t) {
    const dt_train_config *c = t->c;
    dt_status st = dt_data_open(&t->data, c->data, (dt_tokenizer_kind)c->tokenizer, NULL);
    if (st != DT_OK) {
        dt_error_prefix("--data");
        return st;
    }
    t->tok = dt_token_file_tokenizer(t->data);
    if (c->val_data) {
        st = dt_data_open(&t->val_data, c->val_data, (dt_tokenizer_kind)c->tokenizer, t->tok);
        if (st != DT_OK) {
            dt_error_prefix("--val-data");
            return st;
        }
    }
    return DT_OK;
}

/* Loaders over the training range and the validation range (a file or the
 * tail split off the training data). Needs B and T. */
static dt_status make_loaders(trainer *t) {
    const dt_train_config *c = t->c;
    size_t count = dt_token_file_count(t->data), train_end = count;
    bool have_val = c->val_data != NULL || c->val_split > 0;
    if (!c->val_data && c->val_split > 0)
        DT_CHECK(dt_data_split(count, c->val_split, &train_end));
    dt_status st =
        dt_loader_create(&t->train, t->data, 0, train_end, t->B, t->T, c->seed, t->rank, t->world);
    if (st != DT_OK) {
        dt_error_prefix("training data %s (%zu tokens for %d rank(s) x batch %d x seq %d)", c->data,
                        train_end, t->world, t->B, t->T);
        return st;
    }
    if (have_val) {
        const dt_token_file *vf = t->val_data ? t->val_data : t->data;
        size_t vb = t->val_data ? 0 : train_end, ve = dt_token_file_count(vf);
        st = dt_loader_create(&t->val, vf, vb, ve, t->B, t->T, c->seed, t->rank, t->world);
        if (st != DT_OK) {
            dt_error_prefix("validation data (%s, %zu tokens; use a larger --val-split, "
                            "--val-data, or --val-split 0)",
                            t->val_data ? c->val_data : "split of --data", ve - vb);
            return st;
        }
    }
    return DT_OK;
}

static dt_status build_model(trainer *t) {
    const dt_train_config *c = t->c;
    dt_gpt_config mc;
    DT_CHECK(dt_gpt_preset(c->model, &mc));
    if (c->layers)
        mc.layers = c->layers;
    if (c->dim)
        mc.dim = c->dim;
    if (c->heads)
        mc.heads = c->heads;
    if (c->seq)
        mc.max_seq = c->seq;
    int V = t->tok->vocab_size;
    if (c->vocab && c->vocab < V)
        return bad("--vocab %d is smaller than the data's vocabulary (%d tokens)", c->vocab, V);
    mc.vocab = c->vocab ? c->vocab : V;
    DT_CHECK(dt_gpt_config_validate(&mc));
    t->mc = mc;
    t->T = mc.max_seq;
    return DT_OK;
}

/* DDP with the wire format of the config; PowerSGD sees the model's
 * matrices. Also sizes the buffer of codec state for checkpoints. */
static dt_status create_ddp(trainer *t) {
    const dt_train_config *c = t->c;
    dt_ddp_options o = dt_ddp_options_default();
    o.bucket_bytes = c->bucket_bytes;
    o.grad_dtype = c->grad_dtype;
    o.codec = c->compress;
    o.ef = c->compress_ef;
    o.seed = c->seed;
    dt_powersgd_tensor *shapes = dt_calloc(t->ntens + 1, sizeof *shapes);
    if (!shapes)
        return DT_ERR_NOMEM;
    for (size_t i = 0; i < t->ntens; i++) {
        dt_param_info pi;
        dt_gpt_tensor_info(t->m, i, &pi);
        shapes[i] = (dt_powersgd_tensor){.offset = pi.offset, .rows = pi.rows, .cols = pi.cols};
    }
    o.tensors = shapes;
    o.ntensors = t->ntens;
    o.dense_below = (size_t)c->compress_dense_below;
    dt_status st =
        dt_ddp_create_with(&t->ddp, t->g, dt_gpt_params(t->m), dt_gpt_grads(t->m), t->n, &o);
    dt_free(shapes);
    DT_CHECK(st);
    static const char *const ef_names[] = {"auto", "on", "off"};
    char cb[64];
    int w = snprintf(t->ddp_ident, sizeof t->ddp_ident, "%s ef=%s grad_dtype=%s buckets=%zu",
                     dt_codec_format(&c->compress, cb, sizeof cb), ef_names[c->compress_ef],
                     dt_dtype_name(c->grad_dtype), dt_ddp_num_buckets(t->ddp));
    /* Exact tensors keep zero residuals: part of what the state means. */
    if (c->compress_dense_below > 0 && w > 0 && (size_t)w < sizeof t->ddp_ident)
        snprintf(t->ddp_ident + w, sizeof t->ddp_ident - (size_t)w, " dense_below=%" PRId64,
                 c->compress_dense_below);
    t->ddp_state_bytes = dt_ddp_state_bytes(t->ddp);
    if (t->ddp_state_bytes) {
        size_t copies = t->rank == 0 ? (size_t)t->world : 1;
        t->ddp_states = dt_alloc(t->ddp_state_bytes * copies);
        if (!t->ddp_states)
            return dt_error_set(DT_ERR_NOMEM, "DDP codec state: %zu bytes x %zu",
                                t->ddp_state_bytes, copies);
    }
    return DT_OK;
}

static dt_status alloc_state(trainer *t) {
    const dt_train_config *c = t->c;
    dt_gpt_options mo = dt_gpt_options_default();
    mo.precision = c->precision;
    mo.recompute_every = c->recompute_every;
    DT_CHECK(dt_gpt_create_with(&t->m, &t->mc, t->B, t->T, &mo));
    t->n = dt_gpt_num_params(t->m);
    size_t bytes = t->n * sizeof(float);
    t->opt_a = dt_alloc(bytes);
    t->opt_b = c->optimizer == DT_TRAIN_ADAMW ? dt_alloc(bytes) : NULL;
    t->inputs = dt_alloc((size_t)t->B * t->T * sizeof(int32_t));
    t->targets = dt_alloc((size_t)t->B * t->T * sizeof(int32_t));
    t->ntens = dt_gpt_num_tensors(t->m);
    t->tens_off = dt_calloc(t->ntens, sizeof(size_t));
    t->tens_end = dt_calloc(t->ntens, sizeof(size_t));
    t->tens_decay = dt_calloc(t->ntens, sizeof(bool));
    if (!t->opt_a || (c->optimizer == DT_TRAIN_ADAMW && !t->opt_b) || !t->inputs || !t->targets ||
        !t->tens_off || !t->tens_end || !t->tens_decay)
        return dt_error_set(DT_ERR_NOMEM, "optimizer state for %zu parameters", t->n);
    memset(t->opt_a, 0, bytes);
    if (t->opt_b)
        memset(t->opt_b, 0, bytes);
    for (size_t i = 0; i < t->ntens; i++) {
        dt_param_info pi;
        dt_gpt_tensor_info(t->m, i, &pi);
        t->tens_off[i] = pi.offset;
        t->tens_end[i] = pi.offset + pi.rows * pi.cols;
        t->tens_decay[i] = pi.decay;
    }
    dt_gpt_init_params(t->m, c->seed);
    DT_CHECK(create_ddp(t));
    t->adamw = dt_adamw_config_default();
    t->adamw.weight_decay = (float)c->weight_decay;
    t->adamw.beta1 = (float)c->beta1;
    t->adamw.beta2 = (float)c->beta2;
    t->adamw.eps = (float)c->eps;
    t->sched = (dt_schedule){.kind = (dt_schedule_kind)c->schedule,
                             .base_lr = (float)c->lr,
                             .min_lr = (float)c->min_lr,
                             .warmup = c->warmup,
                             .total = c->steps};
    if (t->sched.total <= t->sched.warmup &&
        (t->sched.kind == DT_SCHED_LINEAR || t->sched.kind == DT_SCHED_COSINE))
        return bad("--warmup %" PRId64 " must be smaller than --steps %" PRId64 " for the %s "
                   "schedule",
                   c->warmup, c->steps, dt_schedule_names[c->schedule]);
    DT_CHECK(dt_schedule_validate(&t->sched));
    t->scaling = c->loss_scaling == 1 || (c->loss_scaling < 0 && c->precision == DT_PRECISION_FP16);
    if (t->scaling)
        DT_CHECK(dt_scaler_init(&t->scaler, &c->scaler));
    return DT_OK;
}

static void build_config_json(trainer *t) {
    const dt_train_config *c = t->c;
    dt_json *j = &t->cfg_json;
    dt_json_begin(j);
    dt_json_str(j, "model", c->model);
    dt_json_int(j, "layers", t->mc.layers);
    dt_json_int(j, "dim", t->mc.dim);
    dt_json_int(j, "heads", t->mc.heads);
    dt_json_int(j, "seq", t->mc.max_seq);
    dt_json_int(j, "vocab", t->mc.vocab);
    dt_json_int(j, "params", (int64_t)t->n);
    dt_json_str(j, "data", c->data);
    dt_json_str(j, "val_data", c->val_data);
    dt_json_num(j, "val_split", c->val_split);
    dt_json_str(j, "tokenizer", dt_tokenizer_names[t->tok->kind]);
    dt_json_int(j, "nproc", t->world);
    dt_json_int(j, "batch", t->B);
    dt_json_int(j, "global_batch", (int64_t)t->B * t->world);
    dt_json_int(j, "accum", t->K);
    dt_json_int(j, "steps", c->steps);
    dt_json_str(j, "optimizer", dt_train_optimizer_names[c->optimizer]);
    dt_json_num(j, "lr", c->lr);
    dt_json_num(j, "min_lr", c->min_lr);
    dt_json_num(j, "weight_decay", c->weight_decay);
    if (c->optimizer == DT_TRAIN_SGD) {
        dt_json_num(j, "momentum", c->momentum);
    } else {
        dt_json_num(j, "beta1", c->beta1);
        dt_json_num(j, "beta2", c->beta2);
        dt_json_num(j, "eps", c->eps);
    }
    dt_json_str(j, "schedule", dt_schedule_names[c->schedule]);
    dt_json_int(j, "warmup", c->warmup);
    dt_json_num(j, "clip", c->clip);
    char rc[32];
    dt_recompute_format(c->recompute_every, rc, sizeof rc);
    dt_json_str(j, "precision", dt_precision_name(c->precision));
    dt_json_str(j, "recompute", rc);
    dt_json_bool(j, "loss_scaling", t->scaling);
    if (t->scaling) {
        dt_json_num(j, "loss_scale_init", t->scaler.cfg.init_scale);
        dt_json_num(j, "loss_scale_growth", t->scaler.cfg.growth_factor);
        dt_json_num(j, "loss_scale_backoff", t->scaler.cfg.backoff_factor);
        dt_json_int(j, "loss_scale_interval", t->scaler.cfg.growth_interval);
    }
    dt_json_int(j, "eval_every", c->eval_every);
    dt_json_int(j, "eval_batches", c->eval_batches);
    dt_json_str(j, "ckpt_dir", c->ckpt_dir);
    dt_json_int(j, "ckpt_every", c->ckpt_every);
    dt_json_int(j, "keep", c->keep);
    dt_json_int(j, "seed", (int64_t)c->seed);
    dt_json_int(j, "threads", dt_tensor_threads());
    dt_json_int(j, "bucket_bytes", (int64_t)c->bucket_bytes);
    dt_json_int(j, "buckets", (int64_t)dt_ddp_num_buckets(t->ddp));
    char cb[64];
    dt_json_str(j, "grad_dtype", dt_dtype_name(c->grad_dtype));
    dt_json_str(j, "compress", dt_codec_format(&c->compress, cb, sizeof cb));
    dt_json_int(j, "compress_start", c->compress_start);
    dt_json_bool(j, "compress_freeze_v", c->compress_freeze_v);
    dt_json_int(j, "compress_ramp", c->compress_ramp);
    dt_json_int(j, "compress_dense_below", c->compress_dense_below);
    dt_json_str(j, "compress_ef",
                c->compress_ef == DT_EF_ON    ? "on"
                : c->compress_ef == DT_EF_OFF ? "off"
                                              : "auto");
    dt_json_str(j, "transport", t->g ? dt_group_transport(t->g) : "self");
    dt_json_str(j, "version", DT_VERSION_STRING);
    t->cfg_text = dt_json_finish(j);
}

/* ------------------------------------------------------------------------ */
/* Checkpoints                                                              */
/* ------------------------------------------------------------------------ */

/* The values a resumed run must share with the checkpoint (the "ident"
 * section, in this order). */
const char *const dt_train_ident_names[DT_TRAIN_IDENT_COUNT] = {
    "layers", "dim", "heads", "seq", "vocab", "optimizer", "global batch", "accum", "seed"};

static void idents(const trainer *t, int64_t *v) {
    int64_t x[DT_TRAIN_IDENT_COUNT] = {t->mc.layers,
                                       t->mc.dim,
                                       t->mc.heads,
                                       t->mc.max_seq,
                                       t->mc.vocab,
                                       t->c->optimizer,
                                       (int64_t)t->B * t->world,
                                       t->K,
                                       (int64_t)t->c->seed};
    memcpy(v, x, sizeof x);
}

/* "adamw" for the optimizer field, the number otherwise. */
static const char *ident_text(char *buf, size_t len, int i, int64_t v) {
    if (i == 5 && v >= 0 && v < DT_TRAIN_OPTIMIZER_COUNT)
        return dt_train_optimizer_names[v];
    snprintf(buf, len, "%" PRId64, v);
    return buf;
}

static dt_status save_checkpoint(trainer *t, char *path, size_t path_len) {
    const dt_train_config *c = t->c;
    int64_t idv[DT_TRAIN_IDENT_COUNT];
    idents(t, idv);
    int64_t version = TRAIN_STATE_VERSION;
    int64_t step = t->step, tokens = t->tokens;
    dt_loader_state ls = dt_loader_get_state(t->train);
    uint64_t loader[2] = {ls.epoch, ls.step};
    double sched[5] = {(double)t->sched.kind, t->sched.base_lr, t->sched.min_lr,
                       (double)t->sched.warmup, (double)t->sched.total};
    uint64_t rng[2] = {c->seed, (uint64_t)DT_RNG_SAMPLE};
    int64_t tokinfo[2] = {t->tok->kind, t->tok->vocab_size};
    int64_t prec = c->precision, skipped = t->skipped;
    dt_scaler_state ss;
    dt_scaler_get_state(&t->scaler, &ss);
    double scaler[4] = {ss.scale, (double)ss.growth_tracker, (double)ss.skipped, (double)ss.steps};
    dt_ckpt_section s[28];
    size_t n = 0;
    s[n++] = (dt_ckpt_section){"train_state_version", DT_CKPT_I64, &version, 1};
    s[n++] = (dt_ckpt_section){"ident", DT_CKPT_I64, idv, DT_TRAIN_IDENT_COUNT};
    s[n++] = (dt_ckpt_section){"step", DT_CKPT_I64, &step, 1};
    s[n++] = (dt_ckpt_section){"tokens", DT_CKPT_I64, &tokens, 1};
    s[n++] = (dt_ckpt_section){"loader", DT_CKPT_U64, loader, 2};
    s[n++] = (dt_ckpt_section){"schedule", DT_CKPT_F64, sched, 5};
    s[n++] = (dt_ckpt_section){"rng", DT_CKPT_U64, rng, 2};
    s[n++] = (dt_ckpt_section){"tokenizer", DT_CKPT_I64, tokinfo, 2};
    s[n++] =
        (dt_ckpt_section){"vocab", DT_CKPT_BYTES, t->tok->id_to_byte, (size_t)t->tok->vocab_size};
    s[n++] = (dt_ckpt_section){"params", DT_CKPT_F32, dt_gpt_params(t->m), t->n};
    if (c->optimizer == DT_TRAIN_ADAMW) {
        s[n++] = (dt_ckpt_section){"adamw.m", DT_CKPT_F32, t->opt_a, t->n};
        s[n++] = (dt_ckpt_section){"adamw.v", DT_CKPT_F32, t->opt_b, t->n};
    } else {
        s[n++] = (dt_ckpt_section){"sgd.momentum", DT_CKPT_F32, t->opt_a, t->n};
    }
    /* Mixed precision: the compute type (informational: a resume may change
     * it), the skipped steps (AdamW's step count is step - skipped_steps),
     * and the loss scaler when it is on. */
    s[n++] = (dt_ckpt_section){"precision", DT_CKPT_I64, &prec, 1};
    s[n++] = (dt_ckpt_section){"skipped_steps", DT_CKPT_I64, &skipped, 1};
    if (t->scaling)
        s[n++] = (dt_ckpt_section){"scaler", DT_CKPT_F64, scaler, 4};
    s[n++] = (dt_ckpt_section){"config", DT_CKPT_TEXT, t->cfg_text, strlen(t->cfg_text)};
    int64_t ddp_meta[2] = {t->world, (int64_t)t->ddp_state_bytes};
    if (t->ddp_state_bytes) { /* every rank's codec state, gathered by checkpoint_all */
        s[n++] = (dt_ckpt_section){"ddp.ident", DT_CKPT_TEXT, t->ddp_ident, strlen(t->ddp_ident)};
        s[n++] = (dt_ckpt_section){"ddp.meta", DT_CKPT_I64, ddp_meta, 2};
        s[n++] = (dt_ckpt_section){"ddp.state", DT_CKPT_BYTES, t->ddp_states,
                                   t->ddp_state_bytes * (size_t)t->world};
    }
    return dt_ckpt_save(c->ckpt_dir, t->step, s, n, c->keep, path, path_len);
}

/* Read a section that older checkpoints lack: absent leaves dst alone and
 * sets *found = false; present with another shape is the read's error. */
static dt_status read_optional(const dt_ckpt *ck, const char *name, dt_ckpt_type type, void *dst,
                               size_t count, bool *found) {
    dt_ckpt_info info;
    *found = dt_ckpt_find(ck, name, &info) == DT_OK;
    return *found ? dt_ckpt_read(ck, name, type, dst, count) : DT_OK;
}

/* Rank 0: the mixed-precision part of a checkpoint. The compute type may
 * differ from this run's (bf16 -> fp32 is a legitimate way to finish a run);
 * the scaler state is used when this run scales the loss, and a checkpoint
 * without one (written without scaling) starts the scaler afresh. */
static dt_status load_amp_state(trainer *t, const dt_ckpt *ck, int64_t step) {
    const char *f = dt_ckpt_file(ck);
    int64_t skipped = 0, prec = DT_PRECISION_FP32;
    bool found;
    DT_CHECK(read_optional(ck, "skipped_steps", DT_CKPT_I64, &skipped, 1, &found));
    if (skipped < 0 || skipped > step)
        return dt_error_set(DT_ERR_CORRUPT,
                            "checkpoint %s: skipped_steps %" PRId64 " not in [0, step %" PRId64 "]",
                            f, skipped, step);
    DT_CHECK(read_optional(ck, "precision", DT_CKPT_I64, &prec, 1, &found));
    if (prec < 0 || prec >= DT_PRECISION_COUNT)
        return dt_error_set(DT_ERR_CORRUPT, "checkpoint %s: precision %" PRId64 " is unknown", f,
                            prec);
    t->skipped = skipped;
    t->ckpt_precision = prec;
    double v[4];
    DT_CHECK(read_optional(ck, "scaler", DT_CKPT_F64, v, 4, &found));
    /* Codec residuals (docs/compress.md) are in the units of the scale the
     * writing run applied; resume() converts them to this run's. */
    t->ckpt_scale = found && v[0] > 0 ? fminf((float)v[0], MAX_APPLIED_SCALE) : 1.0f;
    if (!t->scaling)
        return DT_OK;
    if (!found) {
        DT_INFO("%s holds no loss-scaler state (written without loss scaling): the scale starts "
                "at %g",
                f, t->scaler.cfg.init_scale);
        return DT_OK;
    }
    /* A shorter --loss-scale-interval than the checkpoint's run had: the
     * scale grows at the next clean step. */
    int64_t interval = t->scaler.cfg.growth_interval;
    dt_scaler_state ss = {(float)v[0], v[1] >= (double)interval ? interval - 1 : (int64_t)v[1],
                          (int64_t)v[2], (int64_t)v[3]};
    dt_status st = dt_scaler_set_state(&t->scaler, &ss);
    if (st != DT_OK)
        dt_error_prefix("checkpoint %s", f);
    return st;
}

/* Rank 0: the checkpoint's DDP codec state, when it belongs to this run's
 * codec, buckets and group size. Otherwise (another codec, another world
 * size, a checkpoint without one) the run resumes with zero residuals and a
 * fresh PowerSGD Q: allowed, and said. */
static dt_status load_ddp_state(trainer *t, const dt_ckpt *ck) {
    t->ddp_restore = false;
    if (!t->ddp_state_bytes)
        return DT_OK;
    dt_ckpt_info ii;
    int64_t meta[2] = {0, 0};
    const char *why = NULL;
    if (dt_ckpt_find(ck, "ddp.ident", &ii) != DT_OK)
        why = "the checkpoint has none";
    else if (ii.bytes != strlen(t->ddp_ident) || memcmp(ii.data, t->ddp_ident, ii.bytes) != 0)
        why = "it was written with another codec or bucket layout";
    else if (dt_ckpt_read(ck, "ddp.meta", DT_CKPT_I64, meta, 2) != DT_OK || meta[0] != t->world ||
             meta[1] != (int64_t)t->ddp_state_bytes)
        why = "it was written by another number of ranks";
    if (why) {
        DT_WARN("--resume: gradient codec state not restored (%s): residuals start from zero", why);
        return DT_OK;
    }
    DT_CHECK(dt_ckpt_read(ck, "ddp.state", DT_CKPT_BYTES, t->ddp_states,
                          t->ddp_state_bytes * (size_t)t->world));
    t->ddp_restore = true;
    return DT_OK;
}

/* Rank 0: read a checkpoint into the trainer, refusing a mismatched one. */
static dt_status load_checkpoint(trainer *t, const dt_ckpt *ck) {
    const char *f = dt_ckpt_file(ck);
    int64_t version;
    DT_CHECK(dt_ckpt_read(ck, "train_state_version", DT_CKPT_I64, &version, 1));
    if (version != TRAIN_STATE_VERSION)
        return dt_error_set(DT_ERR_MISMATCH,
                            "checkpoint %s holds training state version %" PRId64
                            ", this build reads %d",
                            f, version, TRAIN_STATE_VERSION);
    int64_t want[DT_TRAIN_IDENT_COUNT], got[DT_TRAIN_IDENT_COUNT];
    idents(t, want);
    DT_CHECK(dt_ckpt_read(ck, "ident", DT_CKPT_I64, got, DT_TRAIN_IDENT_COUNT));
    for (int i = 0; i < DT_TRAIN_IDENT_COUNT; i++) {
        char a[32], b[32];
        if (got[i] != want[i])
            return dt_error_set(DT_ERR_MISMATCH,
                                "checkpoint %s was written with %s %s, this run has %s %s (use "
                                "the same configuration, or another --ckpt-dir)",
                                f, dt_train_ident_names[i], ident_text(a, sizeof a, i, got[i]),
                                dt_train_ident_names[i], ident_text(b, sizeof b, i, want[i]));
    }
    int64_t tokinfo[2];
    DT_CHECK(dt_ckpt_read(ck, "tokenizer", DT_CKPT_I64, tokinfo, 2));
    dt_ckpt_info vi;
    DT_CHECK(dt_ckpt_find(ck, "vocab", &vi));
    if (tokinfo[0] != t->tok->kind || tokinfo[1] != t->tok->vocab_size ||
        vi.bytes != (size_t)t->tok->vocab_size ||
        memcmp(vi.data, t->tok->id_to_byte, vi.bytes) != 0)
        return dt_error_set(DT_ERR_MISMATCH,
                            "checkpoint %s: vocabulary mismatch (%s tokenizer with %" PRId64
                            " tokens in the checkpoint, %s with %d in the data %s)",
                            f, tokinfo[0] == DT_TOKENIZER_BYTE ? "byte" : "char", tokinfo[1],
                            dt_tokenizer_names[t->tok->kind], t->tok->vocab_size, t->c->data);
    int64_t step, tokens;
    uint64_t loader[2];
    DT_CHECK(dt_ckpt_read(ck, "step", DT_CKPT_I64, &step, 1));
    DT_CHECK(dt_ckpt_read(ck, "tokens", DT_CKPT_I64, &tokens, 1));
    DT_CHECK(dt_ckpt_read(ck, "loader", DT_CKPT_U64, loader, 2));
    if (step < 0 || step > t->c->steps)
        return dt_error_set(DT_ERR_MISMATCH,
                            "checkpoint %s is at step %" PRId64 ", beyond --steps %" PRId64, f,
                            step, t->c->steps);
    DT_CHECK(dt_ckpt_read(ck, "params", DT_CKPT_F32, dt_gpt_params(t->m), t->n));
    if (t->c->optimizer == DT_TRAIN_ADAMW) {
        DT_CHECK(dt_ckpt_read(ck, "adamw.m", DT_CKPT_F32, t->opt_a, t->n));
        DT_CHECK(dt_ckpt_read(ck, "adamw.v", DT_CKPT_F32, t->opt_b, t->n));
    } else {
        DT_CHECK(dt_ckpt_read(ck, "sgd.momentum", DT_CKPT_F32, t->opt_a, t->n));
    }
    DT_CHECK(load_amp_state(t, ck, step));
    DT_CHECK(dt_loader_set_state(t->train, (dt_loader_state){loader[0], loader[1]}));
    t->step = step;
    t->tokens = tokens;
    DT_CHECK(load_ddp_state(t, ck));
    return DT_OK;
}

/* All ranks: rank 0 sends each rank its codec state, if the checkpoint had
 * a usable one; every rank restores it, and all agree that they did. */
static dt_status restore_ddp_state(trainer *t) {
    if (!t->ddp_state_bytes)
        return DT_OK;
    int64_t restore = t->ddp_restore;
    DT_CHECK(dt_ddp_broadcast(t->ddp, &restore, 1, DT_I64));
    if (!restore)
        return DT_OK;
    DT_CHECK(dt_group_scatter(t->g, t->ddp_states, t->ddp_states, t->ddp_state_bytes, DT_U8, 0));
    dt_status st = dt_ddp_set_state(t->ddp, t->ddp_states, t->ddp_state_bytes);
    char msg[512] = "";
    if (st != DT_OK)
        snprintf(msg, sizeof msg, "%s", dt_last_error());
    double failed = st != DT_OK;
    DT_CHECK(dt_ddp_average(t->ddp, &failed, 1));
    if (st != DT_OK)
        return dt_error_set(st, "--resume: gradient codec state: %s", msg);
    if (failed > 0)
        return dt_error_set(DT_ERR_ABORTED, "--resume: another rank could not restore its "
                                            "gradient codec state");
    return DT_OK;
}

/* All ranks: rank 0 finds and loads the newest good checkpoint and sends the
 * state to the others. *resumed_from gets the file ("" for a fresh start). */
static dt_status resume(trainer *t, char *resumed_from, size_t len) {
    resumed_from[0] = '\0';
    /* hdr: status, found, step, tokens, epoch, loader step, skipped steps,
     * checkpoint precision */
    int64_t hdr[8] = {DT_OK, 0, 0, 0, 0, 0, 0, 0};
    char msg[1024] = "";
    if (t->rank == 0) {
        dt_ckpt *ck = NULL;
        dt_status st = dt_ckpt_open_latest(&ck, t->c->ckpt_dir);
        if (st == DT_ERR_NOT_FOUND) {
            DT_INFO("--resume: no checkpoint in %s yet, starting from step 0", t->c->ckpt_dir);
        } else if (st == DT_OK) {
            st = load_checkpoint(t, ck);
            if (st == DT_OK) {
                snprintf(resumed_from, len, "%s", dt_ckpt_file(ck));
                dt_loader_state ls = dt_loader_get_state(t->train);
                hdr[1] = 1;
                hdr[2] = t->step;
                hdr[3] = t->tokens;
                hdr[4] = (int64_t)ls.epoch;
                hdr[5] = (int64_t)ls.step;
                hdr[6] = t->skipped;
                hdr[7] = t->ckpt_precision;
            }
        }
        dt_ckpt_close(ck);
        if (st != DT_OK && st != DT_ERR_NOT_FOUND) {
            hdr[0] = st;
            snprintf(msg, sizeof msg, "%s", dt_last_error());
        }
    }
    DT_CHECK(dt_ddp_broadcast(t->ddp, hdr, 8, DT_I64));
    if (hdr[0] != DT_OK) {
        if (t->rank == 0)
            return dt_error_set((dt_status)hdr[0], "--resume: %s", msg);
        return dt_error_set(DT_ERR_ABORTED, "--resume: rank 0 could not load the checkpoint");
    }
    if (!hdr[1])
        return DT_OK;
    DT_CHECK(dt_ddp_broadcast_params(t->ddp));
    DT_CHECK(dt_ddp_broadcast(t->ddp, t->opt_a, t->n, DT_F32));
    if (t->opt_b)
        DT_CHECK(dt_ddp_broadcast(t->ddp, t->opt_b, t->n, DT_F32));
    if (t->scaling) {
        dt_scaler_state ss;
        dt_scaler_get_state(&t->scaler, &ss);
        double v[4] = {ss.scale, (double)ss.growth_tracker, (double)ss.skipped, (double)ss.steps};
        DT_CHECK(dt_ddp_broadcast(t->ddp, v, 4, DT_F64));
        ss = (dt_scaler_state){(float)v[0], (int64_t)v[1], (int64_t)v[2], (int64_t)v[3]};
        DT_CHECK(dt_scaler_set_state(&t->scaler, &ss));
    }
    DT_CHECK(restore_ddp_state(t));
    double unit = t->ckpt_scale;
    DT_CHECK(dt_ddp_broadcast(t->ddp, &unit, 1, DT_F64));
    float now = t->scaling ? applied_scale(t) : 1.0f;
    if ((float)unit != now)
        dt_ddp_scale_state(t->ddp, now / (float)unit);
    if (t->rank != 0) {
        t->step = hdr[2];
        t->tokens = hdr[3];
        t->skipped = hdr[6];
        t->ckpt_precision = hdr[7];
        DT_CHECK(
            dt_loader_set_state(t->train, (dt_loader_state){(uint64_t)hdr[4], (uint64_t)hdr[5]}));
    }
    return DT_OK;
}

/* Rank 0 saves; every rank learns the outcome, so all stop together. */
static dt_status checkpoint_all(trainer *t, char *path, size_t len) {
    int64_t st = DT_OK;
    char msg[1024] = "";
    if (t->ddp_state_bytes) { /* rank 0 saves every rank's codec state */
        DT_CHECK(dt_ddp_get_state(t->ddp, t->ddp_states, t->ddp_state_bytes));
        DT_CHECK(dt_group_gather(t->g, t->ddp_states, t->ddp_states, t->ddp_state_bytes, DT_U8, 0));
    }
    if (t->rank == 0) {
        double t0 = dt_now();
        st = save_checkpoint(t, path, len);
        if (st != DT_OK)
            snprintf(msg, sizeof msg, "%s", dt_last_error());
        else
            DT_INFO("saved %s in %.3f s", path, dt_now() - t0);
    }
    DT_CHECK(dt_ddp_broadcast(t->ddp, &st, 1, DT_I64));
    if (st != DT_OK) {
        if (t->rank == 0)
            return dt_error_set((dt_status)st,
                                "checkpoint at step %" PRId64 " failed: %s (the previous "
                                "checkpoint is intact)",
                                t->step, msg);
        return dt_error_set(DT_ERR_ABORTED, "rank 0 failed to save the checkpoint of step %" PRId64,
                            t->step);
    }
    return DT_OK;
}

/* ------------------------------------------------------------------------ */
/* Evaluation and sampling                                                  */
/* ------------------------------------------------------------------------ */

static dt_status evaluate(trainer *t, double *out) {
    DT_CHECK(dt_loader_set_state(t->val, (dt_loader_state){0, 0}));
    uint64_t nb = dt_loader_steps_per_epoch(t->val);
    int n = (uint64_t)t->c->eval_batches < nb ? t->c->eval_batches : (int)nb;
    double sum = 0;
    for (int i = 0; i < n; i++) {
        float loss;
        DT_CHECK(dt_loader_next(t->val, t->inputs, t->targets));
        DT_CHECK(dt_gpt_forward(t->m, t->inputs, t->targets, t->B, t->T, &loss));
        sum += loss;
    }
    double v = sum / n;
    DT_CHECK(dt_ddp_average(t->ddp, &v, 1));
    *out = v;
    return DT_OK;
}

/* Rank 0: sample `ntok` tokens after a newline (or token 0) at temperature
 * 0.8 from the stream (seed, DT_RNG_SAMPLE) and print them. */
static dt_status generate(trainer *t, FILE *out) {
    int ntok = t->c->sample_tokens, V = t->mc.vocab, Vd = t->tok->vocab_size, T = t->T;
    int32_t *ids = dt_alloc((size_t)(ntok + 1) * sizeof *ids);
    char *text = dt_alloc((size_t)ntok + 1);
    float *probs = dt_alloc((size_t)V * sizeof *probs);
    dt_status st = DT_OK;
    if (!ids || !text || !probs) {
        st = DT_ERR_NOMEM;
        goto done;
    }
    ids[0] = t->tok->byte_to_id['\n'] >= 0 ? t->tok->byte_to_id['\n'] : 0;
    dt_rng rng;
    dt_rng_init(&rng, t->c->seed, dt_rng_stream_id(0, 0, DT_RNG_SAMPLE));
    for (int i = 0; i < ntok; i++) {
        int len = i + 1, Tc = len < T ? len : T;
        DT_CHECK_GOTO(dt_gpt_forward(t->m, ids + len - Tc, NULL, 1, Tc, NULL), st, done);
        const float *logits = dt_gpt_last_logits(t->m, 0);
        float mx = -INFINITY;
        for (int v = 0; v < Vd; v++)
            mx = logits[v] > mx ? logits[v] : mx;
        double z = 0;
        for (int v = 0; v < Vd; v++) {
            probs[v] = expf((logits[v] - mx) / 0.8f);
            z += probs[v];
        }
        double u = dt_rng_uniform(&rng) * z, acc = 0;
        int pick = Vd - 1;
        for (int v = 0; v < Vd; v++) {
            acc += probs[v];
            if (u < acc) {
                pick = v;
                break;
            }
        }
        ids[len] = pick;
    }
    DT_CHECK_GOTO(dt_tokenizer_decode(t->tok, ids + 1, (size_t)ntok, text), st, done);
    for (int i = 0; i < ntok; i++)
        if (text[i] == '\0' ||
            ((unsigned char)text[i] < 0x20 && text[i] != '\n' && text[i] != '\t'))
            text[i] = '?';
    text[ntok] = '\0';
    fprintf(out, "---- sample (%d tokens, temperature 0.8) ----\n%s\n----\n", ntok, text);
done:
    dt_free(ids);
    dt_free(text);
    dt_free(probs);
    return st;
}

/* ------------------------------------------------------------------------ */
/* Misc                                                                     */
/* ------------------------------------------------------------------------ */

/* Achievable fp32 GFLOP/s of one rank: the best of 5 bursts of 1024^3
 * sgemm (about 0.05-0.1 s), i.e. what the BLAS reaches with this rank's
 * threads, not the data-sheet peak. The best burst is the least disturbed
 * by other load. 1024 because 512^3 reached only a quarter of the plateau
 * here, and small models then showed an MFU above 100%. */
static double measure_peak_gflops(void) {
    enum { N = 1024 };
    float *a = dt_alloc(3 * N * N * sizeof(float));
    if (!a)
        return NAN;
    for (int i = 0; i < 3 * N * N; i++)
        a[i] = (float)(i % 7) * 0.1f;
    double best = 0;
    for (int burst = 0; burst < 6; burst++) {
        double t0 = dt_now();
        dt_sgemm(false, false, N, N, N, 1.0f, a, N, a + N * N, N, 0.0f, a + 2 * N * N, N);
        double gf = 2.0 * N * N * N / (dt_now() - t0) * 1e-9;
        if (burst > 0) /* the first one warms caches and the BLAS's threads */
            best = gf > best ? gf : best;
    }
    dt_free(a);
    return best;
}

/* The header's precision and memory lines: compute type, loss scaling,
 * recomputation, and the bytes each rank holds. */
static void print_precision(const trainer *t, FILE *f) {
    const dt_train_config *c = t->c;
    char rc[32], a[32], b[32], o[32], act[32];
    dt_recompute_format(c->recompute_every, rc, sizeof rc);
    fprintf(f, "  precision %s (master weights, gradients and optimizer fp32), loss scaling ",
            dt_precision_name(c->precision));
    if (t->scaling)
        fprintf(f, "on (from %g, x%g after %" PRId64 " clean steps, x%g on overflow)",
                t->scaler.cfg.init_scale, t->scaler.cfg.growth_factor,
                t->scaler.cfg.growth_interval, t->scaler.cfg.backoff_factor);
    else
        fprintf(f, "off");
    fprintf(f, ", recompute %s, kernels %s\n", rc, dt_isa_name(dt_isa()));
    dt_memory_report mr;
    dt_gpt_memory(t->m, &mr);
    size_t opt = (t->opt_b ? 2 : 1) * t->n * sizeof(float);
    char w16[48] = "", w[32], sv[32], re[32];
    if (mr.weights16)
        snprintf(w16, sizeof w16, ", %s weights %s", dt_precision_name(c->precision),
                 dt_format_bytes((double)mr.weights16, w, sizeof w));
    fprintf(f,
            "  memory/rank: params %s, grads %s, optimizer %s%s, activations %s peak (%s; saved "
            "%s, recompute scratch %s)\n",
            dt_format_bytes((double)mr.params, a, sizeof a),
            dt_format_bytes((double)mr.grads, b, sizeof b),
            dt_format_bytes((double)opt, o, sizeof o), w16,
            dt_format_bytes((double)mr.activations, act, sizeof act),
            dt_precision_name(c->precision), dt_format_bytes((double)mr.saved, sv, sizeof sv),
            dt_format_bytes((double)mr.recompute, re, sizeof re));
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, size_t n) {
    if (n == 0)
        return NAN;
    qsort(v, n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* Test hooks, acting on the first attempt of a job only (DT_RESTART_COUNT
 * unset or 0): DT_FAULT_KILL="RANK:STEP" makes that rank SIGKILL itself
 * after finishing STEP; DT_FAULT_PERTURB="RANK:STEP" makes it change one
 * parameter, which --check-every must then catch. Read once at setup: the
 * step at which this rank acts, or -1. */
static int64_t fault_step(const trainer *t, const char *var) {
    const char *f = getenv(var);
    const char *rc = getenv("DT_RESTART_COUNT");
    int r;
    long long s;
    if (!f || (rc && *rc && strcmp(rc, "0") != 0) || sscanf(f, "%d:%lld", &r, &s) != 2 ||
        r != t->rank)
        return -1;
    return s;
}

static void maybe_fault(trainer *t) {
    if (t->step == t->perturb_at) {
        fprintf(stderr, "[rank %d] DT_FAULT_PERTURB: changing a parameter after step %lld\n",
                t->rank, (long long)t->step);
        dt_gpt_params(t->m)[t->n / 2] += 1.0f;
    }
    if (t->step == t->kill_at) {
        fprintf(stderr, "[rank %d] DT_FAULT_KILL: killing myself after step %lld\n", t->rank,
                (long long)t->step);
        fflush(stderr);
        raise(SIGKILL);
    }
}

static void trainer_free(trainer *t) {
    dt_ddp_destroy(t->ddp);
    dt_gpt_destroy(t->m);
    dt_loader_destroy(t->train);
    dt_loader_destroy(t->val);
    dt_token_file_close(t->val_data);
    dt_token_file_close(t->data);
    dt_free(t->opt_a);
    dt_free(t->opt_b);
    dt_free(t->inputs);
    dt_free(t->targets);
    dt_free(t->tens_off);
    dt_free(t->tens_end);
    dt_free(t->tens_decay);
    dt_json_free(&t->cfg_json);
    dt_free(t->ddp_states);
    dt_group_destroy(t->g);
}

/* ------------------------------------------------------------------------ */
/* The loop                                                                 */
/* ------------------------------------------------------------------------ */

dt_status dt_train_run(const dt_train_config *c, dt_train_result *res) {
    memset(res, 0, sizeof *res);
    res->val_loss = NAN;
    DT_CHECK(check_config(c));
    trainer tr = {.c = c, .K = c->accum, .rank = 0, .world = 1};
    trainer *t = &tr;
    dt_status st = DT_OK;
    dt_metrics *metrics = NULL;
    dt_progress *prog = NULL;
    FILE *prog_tty = NULL; /* /dev/tty when the live line cannot go to stderr */
    double *tps = NULL, *comm = NULL, *exposed = NULL;

    if (dt_launch_in_job()) {
        DT_CHECK_GOTO(dt_group_init_from_env(&t->g), st, fail);
        t->rank = dt_group_rank(t->g);
        t->world = dt_group_size(t->g);
        dt_log_set_rank(t->rank);
    }
    t->kill_at = fault_step(t, "DT_FAULT_KILL");
    t->perturb_at = fault_step(t, "DT_FAULT_PERTURB");
    t->overflow_at = fault_step(t, "DT_FAULT_OVERFLOW");
    t->ckpt_precision = c->precision;
    t->ckpt_scale = 1.0f;
    int threads = c->threads;
    if (threads <= 0) {
        int local = t->g ? dt_group_local_size(t->g) : 1;
        threads = dt_cpu_count() / (local > 0 ? local : 1);
        threads = threads < 1 ? 1 : threads;
    }
    dt_tensor_set_threads(threads);

    if (c->global_batch) {
        if (c->global_batch % t->world != 0) {
            st = bad("--global-batch %d is not divisible by the %d ranks", c->global_batch,
                     t->world);
            goto fail;
        }
        if (c->batch && c->batch * t->world != c->global_batch) {
            st = bad("--batch %d x %d ranks != --global-batch %d", c->batch, t->world,
                     c->global_batch);
            goto fail;
        }
        t->B = c->global_batch / t->world;
    } else {
        t->B = c->batch;
    }
    DT_CHECK_GOTO(open_data(t), st, fail);
    DT_CHECK_GOTO(build_model(t), st, fail);
    DT_CHECK_GOTO(make_loaders(t), st, fail);
    DT_CHECK_GOTO(alloc_state(t), st, fail);
    DT_CHECK_GOTO(dt_ddp_broadcast_params(t->ddp), st, fail);
    build_config_json(t);
    if (!t->cfg_text) {
        st = dt_error_set(DT_ERR_NOMEM, "config text");
        goto fail;
    }
    char resumed[4096] = "";
    if (c->resume) {
        if (!c->ckpt_dir) {
            st = bad("--resume needs --ckpt-dir");
            goto fail;
        }
        DT_CHECK_GOTO(resume(t, resumed, sizeof resumed), st, fail);
    }
    int64_t check_every = c->check_every;
    if (check_every == 0 && dt_log_enabled(DT_LOG_LEVEL_DEBUG, "ddp"))
        check_every = 50;
    if (check_every > 0)
        DT_CHECK_GOTO(dt_ddp_check_params(t->ddp, t->step), st, fail);

    double peak = c->peak_gflops > 0 ? c->peak_gflops : measure_peak_gflops();
    double flops_per_token = 3.0 * dt_gpt_flops_per_token(&t->mc, t->T);
    int64_t tokens_per_step = (int64_t)t->world * t->B * t->T * t->K;

    if (t->rank == 0) {
        if (c->run_dir) {
            DT_CHECK_GOTO(dt_metrics_write_config(c->run_dir, t->cfg_text), st, fail);
            DT_CHECK_GOTO(dt_metrics_create(&metrics, c->run_dir, resumed[0] ? t->step : 0), st,
                          fail);
        }
        bool tty = c->progress < 0 ? isatty(STDERR_FILENO) : c->progress == 1;
        /* Under a launcher our stderr is a pipe relayed line by line, which
         * cannot carry a line redrawn in place: `dtrain train --nproc N` on a
         * terminal asks for the live line (DT_PROGRESS=live) and rank 0
         * draws it on the session's terminal directly. */
        FILE *pf = stderr;
        if (tty && !isatty(STDERR_FILENO) && (prog_tty = fopen("/dev/tty", "w")) != NULL)
            pf = prog_tty;
        DT_CHECK_GOTO(dt_progress_create(&prog, pf, tty, c->steps, c->log_every), st, fail);
        char pb[32], bb[32];
        fprintf(stderr,
                "dtrain train: %s model, %zu parameters (%s), %d layers, dim %d, %d heads, "
                "seq %d, vocab %d\n"
                "  %d rank(s) x batch %d x accum %d = %" PRId64 " tokens/step, %zu bucket(s) of "
                "<= %s, %d thread(s)/rank, transport %s\n"
                "  MFU relative to %.1f GFLOP/s per rank (%s)\n",
                c->model, t->n, dt_format_bytes((double)t->n * 4, pb, sizeof pb), t->mc.layers,
                t->mc.dim, t->mc.heads, t->T, t->mc.vocab, t->world, t->B, t->K, tokens_per_step,
                dt_ddp_num_buckets(t->ddp), dt_format_bytes((double)c->bucket_bytes, bb, sizeof bb),
                threads, t->g ? dt_group_transport(t->g) : "self", peak,
                c->peak_gflops > 0 ? "--peak-gflops" : "measured sgemm 1024^3");
        print_precision(t, stderr);
        if (t->world > 1 && (c->compress.kind != DT_CODEC_NONE || c->grad_dtype != DT_F32)) {
            fprintf(stderr, "  gradients: %s", t->ddp_ident);
            if (c->compress.kind != DT_CODEC_NONE && c->compress_start > 0)
                fprintf(stderr, ", dense (fp32) for steps 1-%" PRId64, c->compress_start);
            if (c->compress_ramp > 0)
                fprintf(stderr, ", density %g%% -> %g%% over steps %" PRId64 "-%" PRId64,
                        100 * DT_TRAIN_RAMP_START, 100 * c->compress.fraction,
                        c->compress_start + 1, c->compress_start + c->compress_ramp);
            if (c->compress_dense_below > 0)
                fprintf(stderr, ", tensors < %" PRId64 " values exact", c->compress_dense_below);
            fprintf(stderr, "\n");
        }
        if (resumed[0]) {
            fprintf(stderr, "  resumed from %s at step %" PRId64, resumed, t->step);
            if (t->ckpt_precision != (int64_t)c->precision)
                fprintf(stderr, " (written in %s, continuing in %s)",
                        dt_precision_name((dt_precision)t->ckpt_precision),
                        dt_precision_name(c->precision));
            if (t->scaling)
                fprintf(stderr, ", loss scale %g", (double)applied_scale(t));
            fprintf(stderr, "\n");
        }
    }

    size_t nsteps = (size_t)(c->steps - t->step);
    tps = dt_calloc(nsteps + 1, sizeof *tps);
    comm = dt_calloc(nsteps + 1, sizeof *comm);
    exposed = dt_calloc(nsteps + 1, sizeof *exposed);
    if (!tps || !comm || !exposed) {
        st = DT_ERR_NOMEM;
        goto fail;
    }
    size_t nrec = 0;
    res->first_step = t->step + 1;
    double loop_t0 = dt_now();
    int64_t run_steps = 0;
    /* With loss scaling the update waits for the overflow decision, which
     * needs every bucket on every rank. */
    t->update_in_finish = !(c->clip > 0) && !t->scaling;
    while (t->step < c->steps) {
        double t0 = dt_now();
        t->lr = dt_schedule_lr(&t->sched, t->step);
        float scale = t->scaling ? applied_scale(t) : 1.0f;
        t->inv_scale = 1.0f / scale;
        t->found_inf = false;
        /* Dense warm-up: the codec (and its residuals) start at step
         * compress_start + 1; a function of the step, so resume agrees. */
        dt_ddp_set_dense(t->ddp, t->step < c->compress_start);
        DT_CHECK_GOTO(dt_ddp_set_fraction(t->ddp, ramp_fraction(c, t->step)), st, fail);
        if (c->compress_freeze_v && t->step == c->compress_start)
            freeze_second_moment(t);
        double loss = 0;
        for (int k = 0; k < t->K; k++) {
            float l;
            DT_CHECK_GOTO(dt_loader_next(t->train, t->inputs, t->targets), st, fail);
            DT_CHECK_GOTO(dt_gpt_forward(t->m, t->inputs, t->targets, t->B, t->T, &l), st, fail);
            loss += l;
            bool last = k == t->K - 1;
            dt_ddp_begin(t->ddp, last);
            /* The first micro-batch overwrites the gradients (no zeroing
             * pass; the same bits), the others add to them. */
            DT_CHECK_GOTO(dt_gpt_backward_mode(t->m, scale / (float)t->K,
                                               k == 0 ? DT_GRAD_OVERWRITE : DT_GRAD_ACCUMULATE,
                                               dt_ddp_grad_ready, t->ddp),
                          st, fail);
        }
        t->sumsq = 0;
        DT_CHECK_GOTO(dt_ddp_finish(t->ddp, on_bucket, t), st, fail);
        /* The norm is of the averaged gradient, the same on every rank; the
         * loss is each rank's own and is averaged here. */
        /* The third value is "a stop was requested on some rank", the
         * fourth "some rank found an inf/nan gradient": riding on this one
         * small allreduce (an average > 0 is a MAX of the flags) makes every
         * rank stop after, or skip, the same step. */
        double avg[4] = {loss / t->K, sqrt(t->sumsq),
                         c->stop && atomic_load_explicit(c->stop, memory_order_relaxed) ? 1.0 : 0.0,
                         t->found_inf ? 1.0 : 0.0};
        DT_CHECK_GOTO(dt_ddp_average(t->ddp, avg, 4), st, fail);
        bool skip = t->scaling && avg[3] > 0;
        if (skip && scale <= FLT_MIN) {
            st = dt_error_set(DT_ERR_NUMERIC,
                              "gradients are inf/nan at step %" PRId64 " even at the smallest "
                              "loss scale (%g); stopping%s",
                              t->step + 1, (double)scale,
                              c->ckpt_dir ? "; the last good checkpoint is kept" : "");
            goto fail;
        }
        if (!isfinite(avg[0]) || (!skip && !isfinite(avg[1]))) {
            bool l = !isfinite(avg[0]);
            double v = l ? avg[0] : avg[1];
            st = dt_error_set(DT_ERR_NUMERIC, "%s is %s at step %" PRId64 " (lr %.3g); stopping%s",
                              l ? "loss" : "gradient norm", isnan(v) ? "NaN" : "infinite",
                              t->step + 1, (double)t->lr,
                              c->ckpt_dir ? "; the last good checkpoint is kept" : "");
            goto fail;
        }
        /* A skipped step (PyTorch GradScaler.step) leaves parameters and
         * optimizer state alone; the schedule still advances (lr is a
         * function of the step), AdamW's count does not (t->skipped). */
        if (t->scaling) {
            dt_scaler_update(&t->scaler, skip);
            /* Codec residuals are in scaled units: keep them in the next
             * step's (an overflowing step already left them untouched). */
            float next = applied_scale(t);
            if (next != scale)
                dt_ddp_scale_state(t->ddp, next / scale);
        }
        if (skip) {
            t->skipped++;
            DT_DEBUG("amp", "step %" PRId64 ": %s; skipped, loss scale %g -> %g", t->step + 1,
                     t->found_inf ? "inf/nan in this rank's gradients"
                                  : "another rank found inf/nan gradients",
                     (double)scale, (double)applied_scale(t));
        } else if (!t->update_in_finish) {
            float s = dt_clip_scale(t->sumsq, (float)c->clip);
            if (s != 1.0f)
                dt_scale(dt_gpt_grads(t->m), t->n, s);
            update_range(t, 0, t->n);
        }
        t->step++;
        run_steps++;
        t->tokens += tokens_per_step;
        double t1 = dt_now();
        const dt_ddp_stats *ds = dt_ddp_last_stats(t->ddp);
        dt_step_metrics sm = {
            .step = t->step,
            .total_steps = c->steps,
            .loss = avg[0],
            .val_loss = NAN,
            .lr = t->lr,
            .grad_norm = avg[1],
            .step_ms = (t1 - t0) * 1e3,
            .comm_ms = ds->comm_ms,
            .exposed_comm_ms = ds->exposed_comm_ms,
            .bytes_sent = ds->bytes_sent,
            .tokens = t->tokens,
            .loss_scale = t->scaling ? (double)scale : NAN,
            .skipped_steps = t->skipped,
            .skipped = skip,
        };
        sm.compute_ms = sm.step_ms - sm.exposed_comm_ms;
        sm.tokens_per_s = (double)tokens_per_step / (t1 - t0);
        sm.mfu = isfinite(peak) && peak > 0
                     ? flops_per_token * sm.tokens_per_s / (peak * 1e9 * t->world)
                     : NAN;
        if (run_steps == 1)
            res->first_loss = avg[0];
        res->last_loss = avg[0];
        if (run_steps > 1 || nsteps == 1) {
            tps[nrec] = sm.tokens_per_s;
            comm[nrec] = sm.comm_ms;
            exposed[nrec] = sm.exposed_comm_ms;
            nrec++;
        }
        bool last = t->step == c->steps;
        bool interrupted = avg[2] > 0 && !last;
        bool stop = (c->stop_after > 0 && run_steps >= c->stop_after && !last) || interrupted;
        if (t->val && ((c->eval_every > 0 && t->step % c->eval_every == 0) || last)) {
            DT_CHECK_GOTO(evaluate(t, &sm.val_loss), st, fail);
            res->val_loss = sm.val_loss;
        }
        if (check_every > 0 && t->step % check_every == 0)
            DT_CHECK_GOTO(dt_ddp_check_params(t->ddp, t->step), st, fail);
        if (t->rank == 0) {
            if (metrics)
                DT_CHECK_GOTO(dt_metrics_log(metrics, &sm), st, fail);
            dt_progress_update(prog, &sm);
        }
        if (c->ckpt_dir && ((c->ckpt_every > 0 && t->step % c->ckpt_every == 0) || last || stop))
            DT_CHECK_GOTO(checkpoint_all(t, res->checkpoint, sizeof res->checkpoint), st, fail);
        maybe_fault(t);
        if (stop) {
            if (t->rank == 0) {
                dt_progress_finish(prog);
                fprintf(stderr, "stopped after %" PRId64 " steps (%s)%s%s\n", run_steps,
                        interrupted ? "interrupted" : "--stop-after",
                        res->checkpoint[0] ? "; continue with --resume from " : "",
                        res->checkpoint);
            }
            if (interrupted)
                st = dt_error_set(DT_ERR_ABORTED, "interrupted after step %" PRId64 "%s%s", t->step,
                                  res->checkpoint[0] ? "; checkpoint " : "", res->checkpoint);
            break;
        }
    }
    /* An interruption still gets the summary below; its status is returned
     * at the end. */
    dt_status stop_st = st;
    char stop_msg[512] = "";
    if (stop_st != DT_OK)
        snprintf(stop_msg, sizeof stop_msg, "%s", dt_last_error());
    st = DT_OK;
    res->last_step = t->step;
    res->seconds = dt_now() - loop_t0;
    res->tokens_per_s = median(tps, nrec);
    res->comm_ms = median(comm, nrec);
    res->exposed_comm_ms = median(exposed, nrec);
    if (t->rank == 0) {
        dt_progress_finish(prog);
        if (run_steps > 0) {
            fprintf(stderr, "done: steps %" PRId64 "..%" PRId64 " in %.1f s, loss %.4f -> %.4f",
                    res->first_step, res->last_step, res->seconds, res->first_loss, res->last_loss);
            if (isfinite(res->val_loss))
                fprintf(stderr, ", val loss %.4f", res->val_loss);
            fprintf(stderr, ", %.0f tokens/s (median), %s", res->tokens_per_s,
                    dt_precision_name(c->precision));
            if (t->scaling)
                fprintf(stderr, ", loss scale %g, %" PRId64 " step(s) skipped",
                        (double)applied_scale(t), t->skipped);
            if (t->world > 1 && isfinite(res->comm_ms)) {
                const dt_ddp_stats *ds = dt_ddp_last_stats(t->ddp);
                char wb[32];
                fprintf(stderr,
                        ", comm %.1f ms/step of which %.1f ms exposed (%.0f%%); %d of %d "
                        "buckets started during backward; %s sent per step and rank",
                        res->comm_ms, res->exposed_comm_ms,
                        res->comm_ms > 0 ? 100.0 * res->exposed_comm_ms / res->comm_ms : 0.0,
                        ds->launched_in_backward, ds->buckets,
                        dt_format_bytes((double)ds->bytes_sent, wb, sizeof wb));
            }
            fprintf(stderr, "\n");
        }
        if (res->checkpoint[0])
            fprintf(stderr, "checkpoint: %s\n", res->checkpoint);
        if (c->run_dir) {
            /* The final weights in the engine's plain format, for `dtrain
             * sample` (the checkpoint holds the optimizer state too). */
            char wpath[4096];
            snprintf(wpath, sizeof wpath, "%s/model.dtgw", c->run_dir);
            DT_CHECK_GOTO(dt_gpt_save_weights(t->m, wpath, t->tok->id_to_byte, t->tok->vocab_size),
                          st, fail);
            fprintf(stderr, "metrics:    %s/metrics.jsonl\n", c->run_dir);
            fprintf(stderr, "weights:    %s (dtrain sample --ckpt %s)\n", wpath, wpath);
        }
        if (c->sample_tokens > 0 && t->step == c->steps)
            DT_CHECK_GOTO(generate(t, stdout), st, fail);
        fflush(stdout);
    }
    if (stop_st != DT_OK)
        st = dt_error_set(stop_st, "%s", stop_msg);

fail:;
    /* Cleanup (closing the group) may log or set errors of its own: keep
     * the message of the failure that brought us here. */
    char msg[1024] = "";
    if (st != DT_OK)
        snprintf(msg, sizeof msg, "%s", dt_last_error());
    if (prog)
        dt_progress_finish(prog);
    dt_progress_destroy(prog);
    if (prog_tty)
        fclose(prog_tty);
    dt_metrics_destroy(metrics);
    dt_free(tps);
    dt_free(comm);
    dt_free(exposed);
    trainer_free(t);
    if (st != DT_OK && msg[0])
        dt_error_set(st, "%s", msg);
    return st;
}
