/*
 * dp_mode.c — --dp-mode local, gossip and ps (docs/async.md): their checks,
 * the dt_grad_sync each builds (parallel/local_sync.c, gossip_sync.c,
 * ps_sync.c) and the parameter server's summary line. The loop drives them
 * like DDP; only setup's choice of sync names them.
 */
#include "train_internal.h"

#include <inttypes.h>
#include <stdio.h>

const char *const dt_dp_mode_names[DT_DP_MODE_COUNT] = {"ddp", "local", "gossip", "ps"};

dt_status dt__train_check_dp_mode(const dt_train_config *c) {
    if ((int)c->dp_mode < 0 || c->dp_mode >= DT_DP_MODE_COUNT)
        return bad("--dp-mode %d: ddp, local, gossip or ps", (int)c->dp_mode);
    if (c->dp_mode == DT_DP_MODE_DDP)
        return DT_OK;
    const char *mode = dt_dp_mode_names[c->dp_mode];
    if (c->zero)
        return bad("--dp-mode %s with --zero %d: each replica keeps its whole optimizer state "
                   "(use --zero 0)",
                   mode, c->zero);
    if (c->tp > 1 || c->pp > 1 || c->cp > 1)
        return bad("--dp-mode %s with --tp %d --pp %d --cp %d: only plain data parallelism is "
                   "built (use --dp-mode ddp with model parallelism)",
                   mode, c->tp, c->pp, c->cp);
    if (c->compress.kind != DT_CODEC_NONE || c->grad_dtype != DT_F32)
        return bad("--dp-mode %s averages parameters: no --compress and no 16-bit --grad-dtype",
                   mode);
    if (c->optimizer == DT_OPTIM_LBFGS || c->optimizer == DT_OPTIM_KFAC ||
        c->optimizer == DT_OPTIM_ONEBIT_ADAM || c->optimizer == DT_OPTIM_ONEBIT_LAMB)
        return bad("--dp-mode %s with --optimizer %s: that optimizer communicates over the "
                   "replicas itself (use adamw, sgd, lamb, ...)",
                   mode, dt_optim_names[c->optimizer]);
    if (c->loss_scaling == 1 || (c->loss_scaling < 0 && c->precision == DT_PRECISION_FP16))
        return bad("--dp-mode %s with loss scaling (--precision fp16 or --loss-scaling on): "
                   "replicas step on their own and would need one scale (use bf16 or fp32)",
                   mode);
    if (c->sync_every < 1)
        return bad("--sync-every %" PRId64 ": must be >= 1", c->sync_every);
    if (c->gossip_every < 1)
        return bad("--gossip-every %" PRId64 ": must be >= 1", c->gossip_every);
    if (c->post_local_after < 0)
        return bad("--post-local-after %" PRId64 ": must be >= 0", c->post_local_after);
    if (c->outer < 0 || c->outer >= DT_OUTER_COUNT)
        return bad("--outer %d: sgd, slowmo or nesterov", c->outer);
    if (c->gossip_topology < 0 || c->gossip_topology >= DT_GOSSIP_COUNT)
        return bad("--gossip-topology %d: ring, exp, random or hypercube", c->gossip_topology);
    bool elementwise = c->optimizer == DT_OPTIM_ADAMW || c->optimizer == DT_OPTIM_SGD ||
                       c->optimizer == DT_OPTIM_RADAM || c->optimizer == DT_OPTIM_ADAMW8BIT;
    if (c->dp_mode == DT_DP_MODE_PS && (!elementwise || c->grad_centralization))
        return bad("--dp-mode ps with --optimizer %s%s: each server steps its shard of the "
                   "parameters alone, so the update must be elementwise (adamw, sgd, radam, "
                   "adamw8bit; no --grad-centralization)",
                   dt_optim_names[c->optimizer],
                   c->grad_centralization ? " --grad-centralization" : "");
    if (c->delay_comp < 0 || c->delay_comp >= DT_DELAY_COMP_COUNT)
        return bad("--delay-comp %d: none, seed or dcasgd", c->delay_comp);
    if (!(c->outer_lr > 0))
        return bad("--outer-lr %g: must be > 0", c->outer_lr);
    if (!(c->outer_momentum >= 0 && c->outer_momentum < 1))
        return bad("--outer-momentum %g: must be in [0, 1)", c->outer_momentum);
    return DT_OK;
}

dt_status dt__train_make_dp_mode_sync(trainer *t, const dt_ddp_sync_config *ddp) {
    const dt_train_config *c = t->c;
    if (c->dp_mode == DT_DP_MODE_LOCAL) {
        dt_local_sync_config lc = {.ddp = *ddp,
                                   .sync_every = c->sync_every,
                                   .post_local_after = c->post_local_after,
                                   .total_steps = c->steps,
                                   .outer = (dt_outer_kind)c->outer,
                                   .outer_lr = c->outer_lr,
                                   .outer_momentum = c->outer_momentum,
                                   .sync_optim_state = c->sync_optim_state};
        return dt_local_sync_create(&t->sync, &lc);
    }
    if (c->dp_mode == DT_DP_MODE_PS) {
        /* The servers' optimizers: the run's settings over the model's
         * tensors (the run's own optimizer owns nothing here, see
         * dt__train_owned, unless one rank trains alone). */
        size_t nt;
        dt_optim_tensor *tens = dt__train_optim_tensors(t, &nt);
        if (!tens)
            return DT_ERR_NOMEM;
        dt_optim_config oc = dt__train_optim_config(c, &t->offload);
        dt_ps_sync_config pc = {.group = ddp->group,
                                .params = ddp->params,
                                .grads = ddp->grads,
                                .n = ddp->n,
                                .opt = ddp->opt,
                                .optim = &oc,
                                .tensors = tens,
                                .ntensors = nt,
                                .bucket_bytes = ddp->ddp.bucket_bytes,
                                .norm_ranges = ddp->norm_ranges,
                                .nnorm = ddp->nnorm,
                                .servers = c->ps_servers,
                                .staleness = c->staleness,
                                .delay_comp = (dt_delay_comp)c->delay_comp,
                                .dc_lambda = c->dc_lambda,
                                .total_steps = c->steps};
        dt_status st = dt_ps_sync_create(&t->sync, &pc);
        dt_free(tens);
        return st;
    }
    DT_ASSERT(c->dp_mode == DT_DP_MODE_GOSSIP);
    dt_gossip_sync_config gc = {.group = ddp->group,
                                .params = ddp->params,
                                .grads = ddp->grads,
                                .n = ddp->n,
                                .opt = ddp->opt,
                                .norm_ranges = ddp->norm_ranges,
                                .nnorm = ddp->nnorm,
                                .topology = (dt_gossip_topology)c->gossip_topology,
                                .every = c->gossip_every,
                                .total_steps = c->steps,
                                .seed = c->seed};
    return dt_gossip_sync_create(&t->sync, &gc);
}

dt_status dt__train_dp_mode_report(trainer *t, FILE *f) {
    if (t->c->dp_mode != DT_DP_MODE_PS)
        return DT_OK;
    int64_t hist[DT_PS_HIST];
    DT_CHECK(dt_ps_sync_histogram(t->sync, hist));
    if (t->rank != 0)
        return DT_OK;
    int64_t total = 0, max = -1;
    for (int i = 0; i < DT_PS_HIST; i++) {
        total += hist[i];
        max = hist[i] ? i : max;
    }
    fprintf(f,
            "parameter server: %" PRId64 " updates, staleness max %" PRId64 " (bound %" PRId64
            "), distribution",
            total, max, t->c->staleness);
    for (int i = 0; i <= max; i++)
        fprintf(f, " %d:%" PRId64, i, hist[i]);
    fprintf(f, "\n");
    return DT_OK;
}
