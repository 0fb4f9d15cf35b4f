/*
 * train.c — the training configuration: the defaults of `dtrain train`, the
 * checks made before anything is built, and the names a checkpoint records.
 * The run itself is split by job: setup.c builds, loop.c steps, state.c
 * saves and resumes, report.c prints (train_internal.h).
 */
#include "train_internal.h"

#include <inttypes.h>
#include <math.h>
#include <string.h>

/* The values a resumed run must share with the checkpoint (the "ident"
 * section, in this order). */
const char *const dt_train_ident_names[DT_TRAIN_IDENT_COUNT] = {
    "layers", "dim", "heads", "seq", "vocab", "optimizer", "global batch", "accum", "seed"};

void dt_train_config_init(dt_train_config *c) {
    memset(c, 0, sizeof *c);
    c->model = "tiny";
    c->val_split = 0.05;
    c->tokenizer = DT_TOKENIZER_CHAR;
    c->accum = 1;
    c->steps = 100;
    c->optimizer = DT_OPTIM_ADAMW;
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
    dt_optim_config oc = dt_optim_config_default();
    c->trust_coeff = oc.trust_coeff;
    c->trust_eps = oc.trust_eps;
    c->adafactor = oc.adafactor;
    c->quant_block = (int)oc.block;
    c->lookahead_inner = DT_OPTIM_ADAMW;
    c->lookahead_k = oc.lookahead_k;
    c->lookahead_alpha = oc.lookahead_alpha;
    c->lbfgs = oc.lbfgs;
    c->lbfgs.max_eval = 0;
    c->kfac = oc.kfac;
    c->schedule = DT_SCHED_COSINE;
    c->eval_batches = 8;
    c->keep = 3;
    c->seed = 1337;
    c->bucket_bytes = 0; /* a quarter of the gradient bytes, within 1-25 MiB */
    c->sample_tokens = 256;
    c->progress = -1;
    c->tp = c->pp = c->cp = 1;
    c->dp_mode = DT_DP_MODE_DDP;
    c->sync_every = 8;
    c->outer_lr = 1.0;
    c->outer_momentum = 0.9;
    c->gossip_every = 1;
    c->ps_servers = 1;
    c->staleness = 4;
    c->dc_lambda = 0.04;
    c->trace_buffer = 16384;
}

dt_status dt__train_check_config(const dt_train_config *c) {
    if (!c->data || !*c->data)
        return bad("--data: a training text (.txt) or token file (.tok) is required");
    if (c->trace && !c->run_dir && !c->save_default)
        return bad("--trace writes RUN_DIR/trace/: give --run-dir (--no-save writes no run "
                   "directory)");
    if (c->trace_first < 0 || c->trace_last < 0 ||
        (c->trace_last > 0 && c->trace_last < c->trace_first))
        return bad("--trace-steps %" PRId64 ":%" PRId64 ": expected A:B with 1 <= A <= B",
                   c->trace_first, c->trace_last);
    if (c->trace && (c->trace_buffer < 64 || c->trace_buffer > ((size_t)1 << 26)))
        return bad("--trace-buffer %zu: expected 64..%zu events per thread", c->trace_buffer,
                   (size_t)1 << 26);
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
    if (c->compress_freeze_v && (c->optimizer != DT_OPTIM_ADAMW || c->compress_start < 1 ||
                                 c->compress.kind == DT_CODEC_NONE))
        return bad("--compress-freeze-v needs --optimizer adamw, a --compress codec and "
                   "--compress-start >= 1 (the dense steps make the second moment it freezes); "
                   "got %s, %s, %" PRId64,
                   dt_optim_names[c->optimizer],
                   c->compress.kind == DT_CODEC_NONE ? "no codec" : "a codec", c->compress_start);
    bool onebit = c->optimizer == DT_OPTIM_ONEBIT_ADAM || c->optimizer == DT_OPTIM_ONEBIT_LAMB;
    if (onebit && (c->compress_start < 1 || c->compress.kind == DT_CODEC_NONE))
        return bad("--optimizer %s compresses the momentum after a dense warm-up: it needs "
                   "--compress-start >= 1 and a --compress codec (sign for 1 bit); got %" PRId64
                   " and %s",
                   dt_optim_names[c->optimizer], c->compress_start,
                   c->compress.kind == DT_CODEC_NONE ? "none" : "a codec");
    if (onebit && c->compress_freeze_v)
        return bad("--compress-freeze-v is part of --optimizer %s already (drop the flag)",
                   dt_optim_names[c->optimizer]);
    /* The per-tensor statistics of LAMB, LARS, Adafactor and centralisation
     * are summed over ranks sharing a tensor's parameters; tensor-parallel
     * shards of a tensor would need their sum over the tp group too. */
    dt_optim_kind eff = c->optimizer == DT_OPTIM_LOOKAHEAD ? c->lookahead_inner : c->optimizer;
    bool tensorwise = eff == DT_OPTIM_LAMB || eff == DT_OPTIM_LARS || eff == DT_OPTIM_ADAFACTOR ||
                      eff == DT_OPTIM_ONEBIT_LAMB || c->grad_centralization;
    if (tensorwise && c->tp > 1)
        return dt_error_set(DT_ERR_UNSUPPORTED,
                            "--optimizer %s%s with --tp %d: per-tensor statistics of "
                            "tensor-parallel shards are not summed over the tp group yet; use "
                            "--tp 1",
                            dt_optim_names[c->optimizer],
                            c->grad_centralization ? " --grad-centralization" : "", c->tp);
    if (c->optimizer == DT_OPTIM_KFAC) {
        if (c->tp > 1 || c->pp > 1)
            return dt_error_set(DT_ERR_UNSUPPORTED,
                                "--optimizer kfac with --tp %d --pp %d: K-FAC preconditions whole "
                                "weight matrices with statistics from one backward pass; it runs "
                                "with data and context parallelism only",
                                c->tp, c->pp);
        if (c->zero)
            return bad("--optimizer kfac with --zero %d: K-FAC preconditions whole weight "
                       "matrices and does not shard (use --zero 0)",
                       c->zero);
        if (c->precision != DT_PRECISION_FP32)
            return bad("--optimizer kfac needs --precision fp32 (its statistics are read from "
                       "the fp32 backward)");
    }
    if (c->optimizer == DT_OPTIM_LBFGS) {
        if (c->tp > 1 || c->pp > 1)
            return dt_error_set(DT_ERR_UNSUPPORTED,
                                "--optimizer lbfgs with --tp %d --pp %d: L-BFGS takes dot "
                                "products over all parameters and runs with data and context "
                                "parallelism only",
                                c->tp, c->pp);
        if (c->loss_scaling == 1 || (c->loss_scaling < 0 && c->precision == DT_PRECISION_FP16))
            return bad("--optimizer lbfgs with loss scaling: its line search needs the loss "
                       "and gradient of every evaluation (use --precision fp32 or bf16)");
        if (c->compress.kind != DT_CODEC_NONE)
            return bad("--optimizer lbfgs with --compress: its curvature pairs need exact "
                       "gradients");
        if (c->grad_centralization)
            return bad("--grad-centralization is for first-order optimizers, not lbfgs");
        if (c->zero)
            return bad("--optimizer lbfgs with --zero %d: L-BFGS keeps its history for the whole "
                       "parameter buffer and does not shard (use --zero 0)",
                       c->zero);
    }
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
    if (c->scaler.init_scale > (double)DT__MAX_APPLIED_SCALE)
        return bad("--loss-scale-init %g: at most 2^126 (%g), the largest scale whose inverse is a "
                   "normal float",
                   c->scaler.init_scale, (double)DT__MAX_APPLIED_SCALE);
    if (c->tp < 1 || c->pp < 1 || c->cp < 1 || c->dp < 0)
        return bad("--tp %d, --pp %d, --cp %d must be at least 1 and --dp %d at least 0", c->tp,
                   c->pp, c->cp, c->dp);
    if (c->pp_schedule) {
        dt_pp_kind kind;
        int chunks;
        DT_CHECK(dt_pp_kind_parse("--pp-schedule", c->pp_schedule, &kind, &chunks));
        if (c->pp < 2)
            return bad("--pp-schedule %s needs --pp 2 or more (got --pp %d)", c->pp_schedule,
                       c->pp);
    }
    if (c->offload) {
        dt__offload_spec off;
        DT_CHECK(dt__train_offload(c, &off));
        const char *dir = off.optim_dir[0] ? off.optim_dir : NULL;
        if (off.params_dir[0] && c->zero != 3)
            return bad("--offload %s: the parameters live in a file only where they are "
                       "sharded, under --zero 3 (got --zero %d)",
                       c->offload, c->zero);
        if (off.params_dir[0] && c->optimizer == DT_OPTIM_LOOKAHEAD)
            return bad("--offload %s with --optimizer lookahead: its slow-weight sync writes "
                       "every parameter at once, outside the pieces' stream",
                       c->offload);
        /* The others stream their owned-range state in pieces (optim.h). */
        if (dir && (c->optimizer == DT_OPTIM_KFAC || c->optimizer == DT_OPTIM_LBFGS))
            return bad("--optimizer %s with --offload %s: %s, so its state cannot stream "
                       "through memory in pieces (drop --offload, or use a first-order "
                       "optimizer)",
                       dt_optim_names[c->optimizer], c->offload,
                       c->optimizer == DT_OPTIM_KFAC
                           ? "K-FAC preconditions whole weight matrices in one step over the "
                             "whole parameter buffer"
                           : "L-BFGS's two-loop recursion and line search read its whole "
                             "history at every evaluation");
    }
    if (c->zero < 0 || c->zero > 3)
        return bad("--zero %d: the ZeRO stage is 0, 1, 2 or 3", c->zero);
    if (c->zero && onebit)
        return bad("--optimizer %s with --zero %d: its compression stage sends a momentum mix "
                   "of whole buckets, which a reduce-scatter does not carry (use --zero 0)",
                   dt_optim_names[c->optimizer], c->zero);
    if (c->zero && c->compress_ramp > 0)
        return bad("--compress-ramp %" PRId64 " with --zero %d: the density of ZeRO's per-piece "
                   "top-k is fixed (drop --compress-ramp)",
                   c->compress_ramp, c->zero);
    DT_CHECK(dt__train_check_dp_mode(c));
    dt_cp_mode cpm;
    if (c->cp_mode && strcmp(c->cp_mode, "auto") != 0)
        DT_CHECK(dt_cp_mode_parse("--cp-mode", c->cp_mode, &cpm));
    if (c->sp && c->tp < 2)
        return bad("--sp (sequence parallelism) needs --tp 2 or more (got --tp %d)", c->tp);
    if (c->loss_scaling < -1 || c->loss_scaling > 1)
        return bad("--loss-scaling %d: must be -1 (auto), 0 (off) or 1 (on)", c->loss_scaling);
    return DT_OK;
}
