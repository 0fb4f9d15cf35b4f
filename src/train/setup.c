/*
 * setup.c — everything a run builds before its first step, in order: the
 * job and its mesh, threads, data and loaders, the model, the optimizer,
 * the gradient synchronisation, the schedule and the loss scaler, and the
 * resolved config. dt__train_free undoes it in reverse.
 *
 * This is the one place of the train layer that chooses strategies: it
 * builds them and hands the loop the interfaces (dt_grad_sync, the
 * optimizer object, the mesh's groups).
 */
#include "dtrain/launch.h"
#include "dtrain/tensor.h"
#include "train_internal.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Test hooks, acting on the first attempt of a job only (DT_RESTART_COUNT
 * unset or 0): DT_FAULT_KILL="RANK:STEP" makes that rank SIGKILL itself
 * after finishing STEP; DT_FAULT_PERTURB="RANK:STEP" makes it change one
 * parameter, which --check-every must then catch; DT_FAULT_OVERFLOW
 * "RANK:STEP" gives that rank one inf gradient after averaging at STEP.
 * Read once: the step at which this rank acts, or -1. */
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

/* The job (or a single process) and its layout: the mesh from --tp, --pp,
 * --cp and --dp (the ranks left over) in --mesh-order. */
static dt_status join(trainer *t) {
    const dt_train_config *c = t->c;
    if (dt_launch_in_job()) {
        DT_CHECK(dt_group_init_from_env(&t->world));
        t->rank = dt_group_rank(t->world);
        t->size = dt_group_size(t->world);
        dt_log_set_rank(t->rank);
    }
    dt_mesh_shape shape;
    DT_CHECK(dt__train_mesh_shape(c, t->size, &shape));
    DT_CHECK(dt_mesh_create(&t->mesh, t->world, &shape));
    t->replica = dt_mesh_coord(t->mesh, DT_AXIS_DP);
    t->dp = dt_mesh_degree(t->mesh, DT_AXIS_DP);
    if (c->tp > 1)
        DT_CHECK(dt_tp_create(&t->tp, dt_mesh_group(t->mesh, DT_AXIS_TP)));
    return DT_OK;
}

/* Threads per rank (0: this host's CPUs shared by its ranks) and the
 * per-replica batch. */
static dt_status sizes(trainer *t) {
    const dt_train_config *c = t->c;
    int threads = c->threads;
    if (threads <= 0) {
        int local = t->world ? dt_group_local_size(t->world) : 1;
        threads = dt_cpu_count() / (local > 0 ? local : 1);
        threads = threads < 1 ? 1 : threads;
    }
    t->threads = threads;
    dt_tensor_set_threads(threads);
    DT_CHECK(dt__train_batch(c, t->dp, t->size, &t->B));
    t->K = c->accum;
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

/* The model configuration: the preset, the flags that override it, and
 * the data's vocabulary. */
static dt_status model_config(trainer *t) {
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

/* Loaders over the training range and the validation range (a file or the
 * tail split off the training data); each data-parallel replica reads its
 * share. */
static dt_status make_loaders(trainer *t) {
    const dt_train_config *c = t->c;
    size_t count = dt_token_file_count(t->data), train_end = count;
    bool have_val = c->val_data != NULL || c->val_split > 0;
    if (!c->val_data && c->val_split > 0)
        DT_CHECK(dt_data_split(count, c->val_split, &train_end));
    dt_status st =
        dt_loader_create(&t->train, t->data, 0, train_end, t->B, t->T, c->seed, t->replica, t->dp);
    if (st != DT_OK) {
        dt_error_prefix("training data %s (%zu tokens for %d replica(s) x batch %d x seq %d)",
                        c->data, train_end, t->dp, t->B, t->T);
        return st;
    }
    if (have_val) {
        const dt_token_file *vf = t->val_data ? t->val_data : t->data;
        size_t vb = t->val_data ? 0 : train_end, ve = dt_token_file_count(vf);
        st = dt_loader_create(&t->val, vf, vb, ve, t->B, t->T, c->seed, t->replica, t->dp);
        if (st != DT_OK) {
            dt_error_prefix("validation data (%s, %zu tokens; use a larger --val-split, "
                            "--val-data, or --val-split 0)",
                            t->val_data ? c->val_data : "split of --data", ve - vb);
            return st;
        }
    }
    size_t tokens = (size_t)t->K * t->B * t->T;
    t->inputs = dt_alloc(tokens * sizeof(int32_t));
    t->targets = dt_alloc(tokens * sizeof(int32_t));
    if (!t->inputs || !t->targets)
        return dt_error_set(DT_ERR_NOMEM, "batch buffers of %d x %d x %d tokens", t->K, t->B, t->T);
    return DT_OK;
}

/* This rank's part of the model: its pipeline stage's layers (with the
 * activation slots its schedule keeps alive, the schedule checked before
 * anything runs) and its tensor-parallel shard (memory.c decides both). */
static dt_status make_model(trainer *t) {
    const dt_train_config *c = t->c;
    dt_pp_report rep = {0};
    if (c->pp > 1)
        DT_CHECK(dt__train_schedule(c, t->K, &t->pipe, &rep));
    dt_gpt_options mo;
    dt_status st = dt__train_model_options(c, &t->mc, dt_mesh_get_shape(t->mesh), t->rank, t->pipe,
                                           &rep, t->tp ? dt_tp_regions_of(t->tp) : NULL, &mo);
    if (t->pipe)
        dt_pp_report_free(&rep);
    DT_CHECK(st);
    DT_CHECK(dt_gpt_create_with(&t->m, &t->mc, t->B, t->T, &mo));
    t->n = dt_gpt_num_params(t->m);
    dt_gpt_init_params(t->m, c->seed);
    if (t->pipe)
        return dt_pp_runner_create(
            &t->runner, &(dt_pp_runner_config){.model = t->m,
                                               .sched = t->pipe,
                                               .group = dt_mesh_group(t->mesh, DT_AXIS_PP)});
    return dt_sequential_runner_create(&t->runner, t->m);
}

/* The four linear layers of a block (K-FAC preconditions them): their
 * weights are named h.L.attn.c_attn.weight, h.L.attn.c_proj.weight,
 * h.L.mlp.c_fc.weight and h.L.mlp.c_proj.weight. */
static bool is_block_linear(const char *name) {
    size_t n = strlen(name);
    return strncmp(name, "h.", 2) == 0 && n > 7 && strcmp(name + n - 7, ".weight") == 0 &&
           (strstr(name, ".c_attn.") || strstr(name, ".c_proj.") || strstr(name, ".c_fc."));
}

/* Backward's linear-layer statistics, into K-FAC (an offset or shape it
 * does not know is a bug: the table was built from the same model). */
static void kfac_stats(void *user, size_t offset, const float *x, const float *dy, int N, int in,
                       int out, float scale) {
    trainer *t = user;
    dt_status st = dt_kfac_accumulate(t->opt, offset, x, dy, N, in, out, scale);
    DT_ASSERT(st == DT_OK);
}

/* The optimizer over this rank's parameters, tensor by tensor (decay
 * differs between matrices and biases/norms). */
static dt_status make_optimizer(trainer *t) {
    const dt_train_config *c = t->c;
    size_t nt = dt_gpt_num_tensors(t->m);
    dt_optim_tensor *tens = dt_calloc(nt ? nt : 1, sizeof *tens);
    if (!tens)
        return DT_ERR_NOMEM;
    for (size_t i = 0; i < nt; i++) {
        dt_param_info pi;
        dt_gpt_tensor_info(t->m, i, &pi);
        /* Matrices carry their shape (Adafactor factors them, gradient
         * centralisation centres their rows); vectors are 1 x cols. */
        bool mat = pi.rows > 1;
        tens[i] = (dt_optim_tensor){.offset = pi.offset,
                                    .count = pi.rows * pi.cols,
                                    .decay = pi.decay,
                                    .rows = mat ? pi.rows : 0,
                                    .cols = mat ? pi.cols : 0,
                                    .linear = mat && is_block_linear(pi.name)};
    }
    dt_optim_config oc = dt__train_optim_config(c);
    /* Per-tensor statistics (LAMB and LARS trust ratios, Adafactor's
     * factors, centralisation's row means) need the sum over the replicas
     * that share a tensor's parameters: under ZeRO each owns a piece. */
    if (c->zero && t->dp > 1) {
        oc.reduce = dt__train_optim_reduce;
        oc.reduce_user = t;
    }
    /* K-FAC averages its factors over the dp group and spreads the
     * inverses over its ranks. */
    if (c->optimizer == DT_OPTIM_KFAC) {
        oc.rank = t->replica;
        oc.nranks = t->dp;
        if (t->dp > 1) {
            oc.reduce = dt__train_optim_reduce;
            oc.bcast = dt__train_optim_bcast;
            oc.reduce_user = t;
        }
    }
    /* ZeRO: this replica's piece of every bucket; else all of it. */
    dt_range *owned;
    size_t nr;
    dt_status st = dt__train_owned(c, t->n, t->dp, t->replica, &owned, &nr);
    if (st != DT_OK) {
        dt_free(tens);
        return st;
    }
    st = dt_optimizer_create(&t->opt, &oc, tens, nt, owned, nr);
    dt_free(owned);
    dt_free(tens);
    if (st == DT_OK && c->optimizer == DT_OPTIM_KFAC)
        st = dt_gpt_set_linear_stats(t->m, kfac_stats, t);
    return st;
}

dt_status dt__train_optim_bcast(void *user, float *values, size_t n, int root) {
    trainer *t = user;
    dt_group *dp = dt_mesh_group(t->mesh, DT_AXIS_DP);
    return dp ? dt_group_broadcast(dp, values, n, DT_F32, root) : DT_OK;
}

dt_status dt__train_optim_reduce(void *user, double *values, size_t n) {
    trainer *t = user;
    dt_group *dp = dt_mesh_group(t->mesh, DT_AXIS_DP);
    return dp ? dt_group_allreduce(dp, values, values, n, DT_F64, DT_SUM) : DT_OK;
}

/* Data parallelism over the mesh's dp group, with the wire format of the
 * config; PowerSGD sees the model's matrices. */
static dt_status make_sync(trainer *t) {
    const dt_train_config *c = t->c;
    size_t nt = dt_gpt_num_tensors(t->m);
    dt_powersgd_tensor *shapes = dt_calloc(nt + 1, sizeof *shapes);
    dt_range *norm = dt_calloc(nt + 1, sizeof *norm);
    if (!shapes || !norm) {
        dt_free(shapes);
        dt_free(norm);
        return DT_ERR_NOMEM;
    }
    /* The norm counts what this rank owns: tensors every tensor-parallel
     * rank holds whole are counted by one of them. */
    size_t nn = 0;
    for (size_t i = 0; i < nt; i++) {
        dt_param_info pi;
        dt_gpt_tensor_info(t->m, i, &pi);
        shapes[i] = (dt_powersgd_tensor){.offset = pi.offset, .rows = pi.rows, .cols = pi.cols};
        if (!pi.owner)
            continue;
        if (nn > 0 && norm[nn - 1].end == pi.offset)
            norm[nn - 1].end += pi.rows * pi.cols;
        else
            norm[nn++] = (dt_range){pi.offset, pi.offset + pi.rows * pi.cols};
    }
    dt_status st;
    if (c->zero) {
        dt_zero_sync_config zc = {.stage = c->zero,
                                  .accum = t->K,
                                  .group = dt_mesh_group(t->mesh, DT_AXIS_DP),
                                  .params = dt_gpt_params(t->m),
                                  .grads = dt_gpt_grads(t->m),
                                  .n = t->n,
                                  .opt = t->opt,
                                  .bucket_bytes = c->bucket_bytes,
                                  .norm_ranges = norm,
                                  .nnorm = nn};
        st = dt_zero_sync_create(&t->sync, &zc);
        dt_free(shapes);
        dt_free(norm);
        return st;
    }
    dt_ddp_sync_config sc = {
        .group = dt_mesh_group(t->mesh, DT_AXIS_DP),
        .params = dt_gpt_params(t->m),
        .grads = dt_gpt_grads(t->m),
        .n = t->n,
        .opt = t->opt,
        .ddp = dt_ddp_options_default(),
        .compress_start = c->compress_start,
        .compress_ramp = c->compress_ramp,
        .ramp_start = DT_TRAIN_RAMP_START,
        .norm_ranges = norm,
        .nnorm = nn,
    };
    sc.ddp.bucket_bytes = c->bucket_bytes;
    sc.ddp.grad_dtype = c->grad_dtype;
    sc.ddp.codec = c->compress;
    sc.ddp.ef = c->compress_ef;
    sc.ddp.seed = c->seed;
    sc.ddp.tensors = shapes;
    sc.ddp.ntensors = nt;
    sc.ddp.dense_below = (size_t)c->compress_dense_below;
    st = dt_ddp_sync_create(&t->sync, &sc);
    dt_free(shapes);
    dt_free(norm);
    return st;
}

static dt_status make_schedule(trainer *t) {
    const dt_train_config *c = t->c;
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
    dt_sync_cost cost;
    dt_grad_sync_cost(t->sync, &cost);
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
    dt_json_int(j, "nproc", t->size);
    const dt_mesh_shape *ms = dt_mesh_get_shape(t->mesh);
    for (int a = 0; a < DT_AXIS_COUNT; a++)
        dt_json_int(j, dt_axis_names[a], ms->degree[a]);
    dt_json_bool(j, "sp", c->sp);
    dt_json_str(j, "pp_schedule", t->pipe ? dt_runner_name(t->runner) : NULL);
    if (t->pipe)
        dt_json_int(j, "pp_chunks", t->pipe->chunks);
    dt_json_int(j, "batch", t->B);
    dt_json_int(j, "global_batch", (int64_t)t->B * t->dp);
    dt_json_int(j, "accum", t->K);
    dt_json_int(j, "steps", c->steps);
    dt_json_str(j, "optimizer", dt_optim_names[c->optimizer]);
    dt_json_num(j, "lr", c->lr);
    dt_json_num(j, "min_lr", c->min_lr);
    const dt_optim_config *oc = dt_optimizer_config(t->opt);
    dt_json_num(j, "weight_decay", oc->weight_decay);
    dt_optim_kind k = c->optimizer == DT_OPTIM_LOOKAHEAD ? c->lookahead_inner : c->optimizer;
    if (c->optimizer == DT_OPTIM_LOOKAHEAD) {
        dt_json_str(j, "lookahead_inner", dt_optim_names[k]);
        dt_json_int(j, "lookahead_k", c->lookahead_k);
        dt_json_num(j, "lookahead_alpha", c->lookahead_alpha);
    }
    if (k == DT_OPTIM_SGD || k == DT_OPTIM_LARS || k == DT_OPTIM_KFAC) {
        dt_json_num(j, "momentum", c->momentum);
        dt_json_bool(j, "nesterov", c->nesterov);
    }
    if (k == DT_OPTIM_LARS) {
        dt_json_num(j, "trust_coeff", c->trust_coeff);
        dt_json_num(j, "trust_eps", c->trust_eps);
    }
    if (k == DT_OPTIM_ADAMW || k == DT_OPTIM_RADAM || k == DT_OPTIM_ADAMW8BIT ||
        k == DT_OPTIM_LAMB || k == DT_OPTIM_ONEBIT_ADAM || k == DT_OPTIM_ONEBIT_LAMB) {
        dt_json_num(j, "beta1", c->beta1);
        dt_json_num(j, "beta2", c->beta2);
        dt_json_num(j, "eps", c->eps);
    }
    if (k == DT_OPTIM_ADAMW8BIT)
        dt_json_int(j, "adamw8bit_block", c->quant_block);
    if (k == DT_OPTIM_ADAFACTOR) {
        dt_json_num(j, "adafactor_beta1", c->adafactor.beta1);
        dt_json_num(j, "adafactor_decay", c->adafactor.decay_rate);
        dt_json_num(j, "adafactor_eps1", c->adafactor.eps1);
        dt_json_num(j, "adafactor_eps2", c->adafactor.eps2);
        dt_json_num(j, "adafactor_clip", c->adafactor.clip_threshold);
        dt_json_bool(j, "adafactor_relative_step", c->adafactor.relative_step);
        dt_json_bool(j, "adafactor_scale_parameter", c->adafactor.scale_parameter);
        dt_json_bool(j, "adafactor_warmup_init", c->adafactor.warmup_init);
    }
    if (k == DT_OPTIM_KFAC) {
        dt_json_num(j, "kfac_damping", c->kfac.damping);
        dt_json_int(j, "kfac_inv_every", c->kfac.inv_every);
        dt_json_num(j, "kfac_ema", c->kfac.ema);
        dt_json_num(j, "kfac_kl_clip", c->kfac.kl_clip);
    }
    if (k == DT_OPTIM_LBFGS) {
        dt_json_int(j, "lbfgs_history", oc->lbfgs.history);
        dt_json_int(j, "lbfgs_max_iter", oc->lbfgs.max_iter);
        dt_json_int(j, "lbfgs_max_eval", oc->lbfgs.max_eval);
        dt_json_num(j, "lbfgs_tolerance_grad", oc->lbfgs.tolerance_grad);
        dt_json_num(j, "lbfgs_tolerance_change", oc->lbfgs.tolerance_change);
        dt_json_bool(j, "lbfgs_line_search", oc->lbfgs.line_search);
    }
    dt_json_bool(j, "grad_centralization", c->grad_centralization);
    dt_json_num(j, "optimizer_state_bytes_per_param",
                t->n ? (double)dt_optimizer_state_bytes(t->opt) / (double)t->n : 0.0);
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
    dt_json_str(j, "grad_sync", dt_grad_sync_name(t->sync));
    dt_json_int(j, "zero", c->zero);
    if (c->offload)
        dt_json_str(j, "offload", c->offload);
    dt_json_int(j, "bucket_bytes", (int64_t)c->bucket_bytes);
    dt_json_int(j, "buckets", cost.pieces);
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
    dt_json_str(j, "transport", t->world ? dt_group_transport(t->world) : "self");
    dt_json_str(j, "version", DT_VERSION_STRING);
    t->cfg_text = dt_json_finish(j);
}

dt_status dt__train_setup(trainer *t) {
    uint64_t peak;
    if (!dt_mem_resident(&t->rss_base, &peak))
        t->rss_base = 0;
    DT_CHECK(join(t));
    t->kill_at = fault_step(t, "DT_FAULT_KILL");
    t->perturb_at = fault_step(t, "DT_FAULT_PERTURB");
    t->overflow_at = fault_step(t, "DT_FAULT_OVERFLOW");
    t->ckpt_precision = t->c->precision;
    DT_CHECK(sizes(t));
    DT_CHECK(open_data(t));
    DT_CHECK(model_config(t));
    DT_CHECK(make_loaders(t));
    DT_CHECK(dt_train_plan_memory(t->c, &t->mc, t->size, t->rank, &t->plan));
    DT_CHECK(make_model(t));
    DT_CHECK(make_optimizer(t));
    DT_CHECK(make_sync(t));
    /* A strategy that keeps parameters elsewhere (ZeRO 3) fetches them
     * around every read of the model. */
    const dt_param_hooks *hooks = dt_grad_sync_param_hooks(t->sync);
    if (hooks)
        DT_CHECK(dt_gpt_set_param_hooks(t->m, hooks));
    DT_CHECK(make_schedule(t));
    build_config_json(t);
    if (!t->cfg_text)
        return dt_error_set(DT_ERR_NOMEM, "config text");
    return DT_OK;
}

void dt__train_free(trainer *t) {
    dt_runner_destroy(t->runner);
    dt_pp_schedule_destroy(t->pipe);
    dt_grad_sync_destroy(t->sync);
    dt_optimizer_destroy(t->opt);
    dt_gpt_destroy(t->m);
    dt_loader_destroy(t->train);
    dt_loader_destroy(t->val);
    dt_token_file_close(t->val_data);
    dt_token_file_close(t->data);
    dt_free(t->inputs);
    dt_free(t->targets);
    dt_json_free(&t->cfg_json);
    dt_tp_destroy(t->tp);
    dt_mesh_destroy(t->mesh);
    dt_group_destroy(t->world);
}
