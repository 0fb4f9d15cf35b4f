/*
 * config_json.c — a run's config.json: every option of `dtrain train`
 * under its flag's name, with the value the run used (the preset's sizes
 * resolved, the bucket size chosen), so that `dtrain train --config
 * RUN/config.json` reads it back and runs the same training. What the run
 * observed rather than chose goes into an "info" object, which --config
 * skips. Written with jansson; a string that is not UTF-8 (a file name) is
 * stored with U+FFFD for each invalid byte, keeping the file valid JSON.
 */
#include "dtrain/tensor.h"
#include "train_internal.h"

#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* A JSON string of `s` (NULL -> null), invalid UTF-8 bytes replaced. */
static json_t *str(const char *s) {
    if (!s)
        return json_null();
    json_t *v = json_string(s);
    if (v)
        return v;
    size_t n = strlen(s), o = 0;
    char *fixed = malloc(3 * n + 1);
    if (!fixed)
        return NULL;
    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char)s[i];
        size_t len = c < 0x80             ? 1
                     : (c & 0xe0) == 0xc0 ? 2
                     : (c & 0xf0) == 0xe0 ? 3
                     : (c & 0xf8) == 0xf0 ? 4
                                          : 0;
        json_t *probe = len && i + len <= n ? json_stringn(s + i, len) : NULL;
        if (probe) {
            memcpy(fixed + o, s + i, len);
            o += len;
            i += len;
            json_decref(probe);
        } else {
            memcpy(fixed + o, "\xef\xbf\xbd", 3); /* U+FFFD */
            o += 3;
            i++;
        }
    }
    v = json_stringn(fixed, o);
    free(fixed);
    return v;
}

static json_t *real(double v) { return isfinite(v) ? json_real(v) : json_null(); }

/* A float setting as the shortest decimal that reads back as the same
 * float (1e-30, not the double 1.00000000317108e-30 it widens to). */
static json_t *real_f(float v) {
    if (!isfinite(v))
        return json_null();
    char buf[32];
    for (int digits = 1; digits <= 9; digits++) {
        snprintf(buf, sizeof buf, "%.*g", digits, (double)v);
        if (strtof(buf, NULL) == v)
            break;
    }
    return json_real(strtod(buf, NULL));
}

static const char *on_off(bool b) { return b ? "on" : "off"; }

/* Set key to v (a new reference); a NULL v marks the object failed. */
static void put(json_t *o, const char *key, json_t *v, bool *ok) {
    if (!v || json_object_set_new(o, key, v) != 0)
        *ok = false;
}

char *dt__train_config_json(const trainer *t) {
    const dt_train_config *c = t->c;
    json_t *o = json_object(), *info = json_object();
    bool ok = o && info;
    if (!ok) {
        json_decref(o);
        json_decref(info);
        return NULL;
    }
    dt_sync_cost cost;
    dt_grad_sync_cost(t->sync, &cost);
    const dt_mesh_shape *ms = dt_mesh_get_shape(t->mesh);
    char rc[32], cb[64], order[64];
    dt_recompute_format(c->recompute_every, rc, sizeof rc);
    snprintf(order, sizeof order, "%s-%s-%s-%s", dt_axis_names[ms->order[0]],
             dt_axis_names[ms->order[1]], dt_axis_names[ms->order[2]], dt_axis_names[ms->order[3]]);
    /* The options, by flag name. */
    put(o, "model", str(c->model), &ok);
    put(o, "layers", json_integer(t->mc.layers), &ok);
    put(o, "dim", json_integer(t->mc.dim), &ok);
    put(o, "heads", json_integer(t->mc.heads), &ok);
    put(o, "seq", json_integer(t->mc.max_seq), &ok);
    put(o, "vocab", json_integer(t->mc.vocab), &ok);
    put(o, "data", str(c->data), &ok);
    put(o, "val-data", str(c->val_data), &ok);
    put(o, "val-split", real(c->val_split), &ok);
    put(o, "tokenizer",
        str(t->tok->kind != DT_TOKENIZER_BPE ? dt_tokenizer_names[t->tok->kind]
            : c->tokenizer_files             ? c->tokenizer_files
                                             : "gpt2"),
        &ok);
    put(o, "init-from", str(c->init_from), &ok);
    put(o, "nproc", json_integer(t->size), &ok);
    if (c->elastic_max > 0) {
        char el[32];
        snprintf(el, sizeof el, "%d:%d", c->elastic_min, c->elastic_max);
        put(o, "elastic", str(el), &ok);
        put(o, "global-batch", json_integer(c->global_batch), &ok);
    }
    /* The degrees as given: dp 0 stays "the ranks left over", so that the
     * file also serves another layout (--nproc 4 --tp 2). */
    for (int a = 0; a < DT_AXIS_COUNT; a++)
        put(o, dt_axis_names[a], json_integer(a == DT_AXIS_DP ? c->dp : ms->degree[a]), &ok);
    put(o, "sp", json_boolean(c->sp), &ok);
    put(o, "mesh-order", str(order), &ok);
    if (c->cp > 1)
        put(o, "cp-mode", str(dt_cp_mode_name(dt__train_cp_mode(c, &t->mc))), &ok);
    if (c->pp > 1)
        put(o, "pp-schedule", str(c->pp_schedule ? c->pp_schedule : "1f1b"), &ok);
    if (c->elastic_max <= 0) /* elastic: the global batch above, the per-rank share varies */
        put(o, "batch", json_integer(t->B), &ok);
    put(o, "accum", json_integer(t->K), &ok);
    put(o, "steps", json_integer(c->steps), &ok);
    put(o, "optimizer", str(dt_optim_names[c->optimizer]), &ok);
    put(o, "lr", real(c->lr), &ok);
    put(o, "min-lr", real(c->min_lr), &ok);
    put(o, "weight-decay", real(c->weight_decay), &ok);
    put(o, "momentum", real(c->momentum), &ok);
    put(o, "beta1", real(c->beta1), &ok);
    put(o, "beta2", real(c->beta2), &ok);
    put(o, "eps", real(c->eps), &ok);
    /* The other optimizers' settings, all of them whichever optimizer ran
     * (as momentum and the betas are), so that --config with another
     * --optimizer gets the same hyper-parameters. */
    put(o, "nesterov", json_boolean(c->nesterov), &ok);
    put(o, "trust-coeff", real(c->trust_coeff), &ok);
    put(o, "trust-eps", real(c->trust_eps), &ok);
    put(o, "adafactor-beta1", real_f(c->adafactor.beta1), &ok);
    put(o, "adafactor-decay", real_f(c->adafactor.decay_rate), &ok);
    put(o, "adafactor-eps1", real_f(c->adafactor.eps1), &ok);
    put(o, "adafactor-eps2", real_f(c->adafactor.eps2), &ok);
    put(o, "adafactor-clip", real_f(c->adafactor.clip_threshold), &ok);
    put(o, "adafactor-relative-step", str(on_off(c->adafactor.relative_step)), &ok);
    put(o, "adafactor-scale-parameter", str(on_off(c->adafactor.scale_parameter)), &ok);
    put(o, "adafactor-warmup-init", json_boolean(c->adafactor.warmup_init), &ok);
    put(o, "adamw8bit-block", json_integer(c->quant_block), &ok);
    put(o, "lookahead-inner", str(dt_optim_names[c->lookahead_inner]), &ok);
    put(o, "lookahead-k", json_integer(c->lookahead_k), &ok);
    put(o, "lookahead-alpha", real(c->lookahead_alpha), &ok);
    put(o, "lbfgs-history", json_integer(c->lbfgs.history), &ok);
    put(o, "lbfgs-max-iter", json_integer(c->lbfgs.max_iter), &ok);
    /* As given: 0 stays "max-iter * 5/4", as dp 0 stays "the ranks left". */
    put(o, "lbfgs-max-eval", json_integer(c->lbfgs.max_eval), &ok);
    put(o, "lbfgs-tolerance-grad", real_f(c->lbfgs.tolerance_grad), &ok);
    put(o, "lbfgs-tolerance-change", real_f(c->lbfgs.tolerance_change), &ok);
    put(o, "lbfgs-line-search", str(on_off(c->lbfgs.line_search)), &ok);
    put(o, "kfac-damping", real(c->kfac.damping), &ok);
    put(o, "kfac-inv-every", json_integer(c->kfac.inv_every), &ok);
    put(o, "kfac-ema", real(c->kfac.ema), &ok);
    put(o, "kfac-kl-clip", real(c->kfac.kl_clip), &ok);
    put(o, "grad-centralization", json_boolean(c->grad_centralization), &ok);
    put(o, "schedule", str(dt_schedule_names[c->schedule]), &ok);
    put(o, "warmup", json_integer(c->warmup), &ok);
    put(o, "clip", real(c->clip), &ok);
    put(o, "eval-every", json_integer(c->eval_every), &ok);
    put(o, "eval-batches", json_integer(c->eval_batches), &ok);
    put(o, "ckpt-every", json_integer(c->ckpt_every), &ok);
    put(o, "keep", json_integer(c->keep), &ok);
    put(o, "seed", json_integer((json_int_t)c->seed), &ok);
    put(o, "threads", json_integer(dt_tensor_threads()), &ok);
    put(o, "bucket-size", json_integer((json_int_t)c->bucket_bytes), &ok);
    put(o, "comm-priority", str(dt_comm_priority_names[c->comm_priority]), &ok);
    put(o, "comm-piece",
        json_integer((json_int_t)(c->comm_piece ? c->comm_piece : DT_DDP_DEFAULT_PIECE_BYTES)),
        &ok);
    put(o, "zero", json_integer(c->zero), &ok);
    if (c->offload)
        put(o, "offload", str(c->offload), &ok);
    put(o, "dp-mode", str(dt_dp_mode_names[c->dp_mode]), &ok);
    if (c->dp_mode == DT_DP_MODE_LOCAL) {
        put(o, "sync-every", json_integer(c->sync_every), &ok);
        put(o, "post-local-after", json_integer(c->post_local_after), &ok);
        put(o, "outer", str(dt_outer_names[c->outer]), &ok);
        put(o, "outer-lr", real(c->outer_lr), &ok);
        put(o, "outer-momentum", real(c->outer_momentum), &ok);
        put(o, "sync-optim-state", json_boolean(c->sync_optim_state), &ok);
    }
    if (c->dp_mode == DT_DP_MODE_PS) {
        put(o, "ps-servers", json_integer(c->ps_servers), &ok);
        put(o, "staleness", json_integer(c->staleness), &ok);
        put(o, "delay-comp", str(dt_delay_comp_names[c->delay_comp]), &ok);
        put(o, "dc-lambda", real(c->dc_lambda), &ok);
    }
    if (c->dp_mode == DT_DP_MODE_GOSSIP) {
        put(o, "gossip-topology", str(dt_gossip_names[c->gossip_topology]), &ok);
        put(o, "gossip-every", json_integer(c->gossip_every), &ok);
    }
    put(o, "check-every", json_integer(c->check_every), &ok);
    if (c->peak_gflops > 0)
        put(o, "peak-flops", real(c->peak_gflops * 1e9), &ok);
    put(o, "sample-tokens", json_integer(c->sample_tokens), &ok);
    put(o, "precision", str(dt_precision_name(c->precision)), &ok);
    put(o, "recompute", str(rc), &ok);
    put(o, "loss-scaling", str(c->loss_scaling < 0 ? "auto" : c->loss_scaling ? "on" : "off"), &ok);
    put(o, "loss-scale-init", real(c->scaler.init_scale), &ok);
    put(o, "loss-scale-growth", real(c->scaler.growth_factor), &ok);
    put(o, "loss-scale-backoff", real(c->scaler.backoff_factor), &ok);
    put(o, "loss-scale-interval", json_integer(c->scaler.growth_interval), &ok);
    put(o, "grad-dtype",
        str(dt_precision_name(c->grad_dtype == DT_BF16  ? DT_PRECISION_BF16
                              : c->grad_dtype == DT_F16 ? DT_PRECISION_FP16
                                                        : DT_PRECISION_FP32)),
        &ok);
    char ab[160];
    put(o, "compress",
        str(c->compress_auto.n ? dt_codec_auto_format(&c->compress_auto, ab, sizeof ab)
                               : dt_codec_format(&c->compress, cb, sizeof cb)),
        &ok);
    put(o, "compress-ef",
        str(c->compress_ef == DT_EF_ON    ? "on"
            : c->compress_ef == DT_EF_OFF ? "off"
                                          : "auto"),
        &ok);
    put(o, "compress-freeze-v", json_boolean(c->compress_freeze_v), &ok);
    put(o, "compress-start", json_integer(c->compress_start), &ok);
    put(o, "compress-ramp", json_integer(c->compress_ramp), &ok);
    put(o, "compress-dense-below", json_integer(c->compress_dense_below), &ok);
    /* What the run observed. */
    put(info, "params", json_integer((json_int_t)t->n), &ok);
    put(info, "optimizer-state-bytes-per-param",
        real(t->n ? (double)dt_optimizer_state_bytes(t->opt) / (double)t->n : 0.0), &ok);
    put(info, "global-batch", json_integer((json_int_t)t->B * t->dp), &ok);
    put(info, "world-size", json_integer(t->size), &ok);
    put(info, "dp", json_integer(ms->degree[DT_AXIS_DP]), &ok);
    if (t->pipe)
        put(info, "pp-chunks", json_integer(t->pipe->chunks), &ok);
    put(info, "grad-sync", str(dt_grad_sync_name(t->sync)), &ok);
    put(info, "buckets", json_integer(cost.pieces), &ok);
    put(info, "transport", str(t->world ? dt_group_transport(t->world) : "self"), &ok);
    put(info, "run-dir", str(c->run_dir), &ok);
    put(info, "ckpt-dir", str(c->ckpt_dir), &ok);
    put(info, "version", str(DT_VERSION_STRING), &ok);
    put(o, "info", info, &ok);
    /* 15 significant digits: the decimal a user typed (0.05, 3e-4) comes
     * back as typed, not as 0.050000000000000003. */
    char *text = ok ? json_dumps(o, JSON_INDENT(2) | JSON_REAL_PRECISION(15)) : NULL;
    json_decref(o);
    if (!text)
        return NULL;
    size_t n = strlen(text);
    char *nl = realloc(text, n + 2);
    if (!nl) {
        free(text);
        return NULL;
    }
    nl[n] = '\n';
    nl[n + 1] = '\0';
    return nl;
}
