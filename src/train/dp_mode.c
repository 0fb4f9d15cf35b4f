/*
 * dp_mode.c — --dp-mode local and gossip (docs/async.md): their checks and
 * the dt_grad_sync each builds (parallel/local_sync.c, gossip_sync.c). The
 * loop drives them like DDP; only setup's choice of sync names them.
 */
#include "train_internal.h"

#include <inttypes.h>

const char *const dt_dp_mode_names[DT_DP_MODE_COUNT] = {"ddp", "local", "gossip"};

dt_status dt__train_check_dp_mode(const dt_train_config *c) {
    if ((int)c->dp_mode < 0 || c->dp_mode >= DT_DP_MODE_COUNT)
        return bad("--dp-mode %d: ddp, local or gossip", (int)c->dp_mode);
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
