/*
 * model.c — the analytic prediction of one layout's step (plan.h;
 * docs/planner.md has the equations). Nothing here names a strategy: the
 * communication is what the strategies describe (parallel.h, "Planning
 * costs"), the pipeline's timing is its own checker's simulation, and the
 * memory is the trainer's own plan.
 */
#include "plan_internal.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

static const char *const kind_text[DT_PP_KIND_COUNT] = {"gpipe", "1f1b", "interleaved", "zb"};

char *dt_plan_layout_format(const dt_plan_layout *l, char *buf, size_t len) {
    char sched[32] = "", rec[24];
    if (l->pp > 1) {
        if (l->schedule == DT_PP_INTERLEAVED)
            snprintf(sched, sizeof sched, " (interleaved:%d)", l->chunks);
        else
            snprintf(sched, sizeof sched, " (%s)", kind_text[l->schedule]);
    }
    snprintf(buf, len, "dp %d x tp %d%s x pp %d%s x cp %d%s, mb %d x %d, zero %d, recompute %s, %s",
             l->dp, l->tp, l->sp ? "+sp" : "", l->pp, sched, l->cp,
             l->cp > 1 ? (l->cp_mode == DT_CP_RING ? " (ring)" : " (ulysses)") : "", l->micro_batch,
             l->micro, l->zero, dt_recompute_format(l->recompute_every, rec, sizeof rec),
             dt_precision_name(l->precision));
    return buf;
}

void dt_plan_layout_to_config(const dt_plan_layout *l, dt_train_config *c) {
    static const char *const scheds[] = {"gpipe", "1f1b", NULL, "zb"};
    static const char *const inter[] = {NULL, NULL, "interleaved:2", "interleaved:3",
                                        "interleaved:4"};
    c->dp = l->dp;
    c->tp = l->tp;
    c->pp = l->pp;
    c->cp = l->cp;
    c->sp = l->sp;
    c->cp_mode = l->cp > 1 ? (l->cp_mode == DT_CP_RING ? "ring" : "ulysses") : NULL;
    c->pp_schedule = l->pp <= 1                         ? NULL
                     : l->schedule != DT_PP_INTERLEAVED ? scheds[l->schedule]
                     : l->chunks <= 4                   ? inter[l->chunks]
                                                        : "interleaved:4";
    c->batch = l->micro_batch;
    c->global_batch = 0;
    c->accum = l->micro;
    c->zero = l->zero;
    c->recompute_every = l->recompute_every;
    c->precision = l->precision;
}

char *dt_plan_layout_args(const dt_plan_layout *l, char *buf, size_t len) {
    dt_train_config c;
    dt_train_config_init(&c);
    dt_plan_layout_to_config(l, &c);
    char rec[24];
    int n = snprintf(buf, len,
                     "--dp %d --tp %d --pp %d --cp %d --batch %d --global-batch 0 --accum %d "
                     "--micro-batches %d --zero %d --recompute %s --precision %s",
                     c.dp, c.tp, c.pp, c.cp, c.batch, c.accum, c.accum, c.zero,
                     dt_recompute_format(c.recompute_every, rec, sizeof rec),
                     dt_precision_name(c.precision));
    if (c.pp_schedule && n >= 0 && (size_t)n < len)
        n += snprintf(buf + n, len - (size_t)n, " --pp-schedule %s", c.pp_schedule);
    if (c.cp_mode && n >= 0 && (size_t)n < len)
        n += snprintf(buf + n, len - (size_t)n, " --cp-mode %s", c.cp_mode);
    if (c.sp && n >= 0 && (size_t)n < len)
        snprintf(buf + n, len - (size_t)n, " --sp");
    return buf;
}

/* ------------------------------------------------------------------------ */
/* Links and collectives                                                    */
/* ------------------------------------------------------------------------ */

typedef struct placement {
    int ranks_on_node;           /* ranks sharing one node */
    double peak;                 /* FLOP/s of one rank */
    double mem_bw;               /* bytes/s of one rank */
    double memory;               /* bytes one rank may fill */
    dt_link link[DT_AXIS_COUNT]; /* the link each axis's group crosses, per rank */
    bool across[DT_AXIS_COUNT];  /* ... is the inter-node one */
} placement;

/* Ranks are placed tp fastest, then cp, dp, pp (the mesh's default
 * order), node by node: an axis's group spans nodes when the ranks it
 * strides over do not fit in one. Between nodes every rank of a node
 * shares the node's network ports. */
static void place(const dt_cluster *cl, const dt_plan_layout *l, placement *p) {
    int devices = l->dp * l->tp * l->pp * l->cp;
    p->ranks_on_node = cl->nodes == 1
                           ? devices
                           : (devices < cl->devices_per_node ? devices : cl->devices_per_node);
    double share = cl->shared_compute ? p->ranks_on_node : 1;
    p->peak = cl->peak[l->precision] / share;
    p->mem_bw = cl->mem_bw / share;
    p->memory = cl->memory * cl->memory_usable / share;
    const dt_axis order[DT_AXIS_COUNT] = {DT_AXIS_TP, DT_AXIS_CP, DT_AXIS_DP, DT_AXIS_PP};
    const int deg[DT_AXIS_COUNT] = {
        [DT_AXIS_DP] = l->dp, [DT_AXIS_TP] = l->tp, [DT_AXIS_PP] = l->pp, [DT_AXIS_CP] = l->cp};
    long stride = 1;
    for (int i = 0; i < DT_AXIS_COUNT; i++) {
        dt_axis a = order[i];
        long span = stride * deg[a];
        bool across = cl->nodes != 1 && span > cl->devices_per_node;
        p->link[a] = across ? cl->inter : cl->intra;
        p->across[a] = across;
        if (across)
            p->link[a].bw = cl->inter.bw / p->ranks_on_node;
        stride = span;
    }
    /* The replica group (ZeRO and DDP's) is dp x cp: it crosses nodes when
     * either does. */
    if (p->link[DT_AXIS_CP].bw < p->link[DT_AXIS_DP].bw && l->cp > 1) {
        p->link[DT_AXIS_DP] = p->link[DT_AXIS_CP];
        p->across[DT_AXIS_DP] = p->across[DT_AXIS_CP];
    }
}

/* Alpha-beta cost of one call (ring algorithms; docs/planner.md): the
 * latency terms and the bytes through the link. */
void dt__plan_coll_parts(const dt_comm_cost *c, int n, const dt_link *k, double *latency,
                         double *bytes) {
    *latency = *bytes = 0;
    if (n <= 1)
        return;
    double f = (double)(n - 1) / n;
    switch (c->coll) {
    case DT_COLL_ALLREDUCE:
        *bytes = 2 * f * c->bytes;
        *latency = 2 * (n - 1) * k->alpha;
        break;
    case DT_COLL_REDUCE_SCATTER:
    case DT_COLL_ALLGATHER:
    case DT_COLL_ALLTOALL:
        *bytes = f * c->bytes;
        *latency = (n - 1) * k->alpha;
        break;
    default: /* point to point */ *bytes = c->bytes; *latency = k->alpha;
    }
}

static double coll_time(const dt_comm_cost *c, int n, const dt_link *k) {
    double lat, bytes;
    dt__plan_coll_parts(c, n, k, &lat, &bytes);
    return lat + bytes / k->bw;
}

static int group_size(const dt_plan_layout *l, dt_axis a) {
    switch (a) {
    case DT_AXIS_DP: return l->dp * l->cp; /* the replica group */
    case DT_AXIS_TP: return l->tp;
    case DT_AXIS_PP: return l->pp;
    default: return l->cp;
    }
}

static double item_time(const dt_comm_cost *c, const dt_plan_layout *l, const placement *p) {
    return c->calls * coll_time(c, group_size(l, c->axis), &p->link[c->axis]);
}

/* ------------------------------------------------------------------------ */
/* Memory: the trainer's plan of the first and last pipeline stages         */
/* ------------------------------------------------------------------------ */

/* Micro-batches the pipeline is simulated (and its memory planned) with:
 * from 2 x P on, one more micro-batch adds one steady-state F+B to every
 * rank and changes no rank's peak (docs/planner.md). */
static int sim_micro(const dt_plan_layout *l) {
    int cap = 2 * l->pp;
    return l->pp > 1 && l->micro > cap ? cap : l->micro;
}

static dt_status plan_memory(const dt_plan_request *rq, const dt_plan_layout *l,
                             dt_plan_candidate *out) {
    dt_train_config c;
    dt_train_config_init(&c);
    dt_plan_layout_to_config(l, &c);
    c.accum = sim_micro(l);
    c.model = "plan";
    c.optimizer = rq->optimizer;
    c.save_default = true; /* as `dtrain train` does: the end assembles the model, */
    c.sample_tokens = 0;   /* for its weights file; a sample is not planned */
    int world = l->dp * l->tp * l->pp * l->cp;
    dt_mesh_shape shape = dt_mesh_shape_default();
    shape.degree[DT_AXIS_DP] = l->dp;
    shape.degree[DT_AXIS_TP] = l->tp;
    shape.degree[DT_AXIS_PP] = l->pp;
    shape.degree[DT_AXIS_CP] = l->cp;
    out->memory = 0;
    for (int s = 0; s < (l->pp > 1 ? 2 : 1); s++) {
        int coord[DT_AXIS_COUNT] = {0};
        coord[DT_AXIS_PP] = s ? l->pp - 1 : 0;
        dt_rank_memory m;
        DT_CHECK(dt_train_plan_memory(&c, &rq->model, world, dt_mesh_rank_of(&shape, coord), &m));
        if (s == 0)
            out->assembly = (double)m.assembly;
        if ((double)m.total > out->memory) {
            out->memory = (double)m.total;
            out->mem = m;
        }
    }
    return DT_OK;
}

/* ------------------------------------------------------------------------ */
/* One step                                                                 */
/* ------------------------------------------------------------------------ */

typedef struct pass_costs {
    double f, b, w;        /* compute of one micro-batch on the busiest rank (whole share) */
    double f_comm, b_comm; /* blocking model communication in them */
    double f_hide, b_hide; /* overlapped model communication (exposed beyond compute) */
    double p2p;            /* one pipeline transfer */
} pass_costs;

static dt_cost_query query_of(const dt_plan_request *rq, const dt_plan_layout *l) {
    const dt_gpt_config *m = &rq->model;
    int layers = (m->layers + l->pp - 1) / l->pp;
    /* This rank's floats: its blocks' 1/tp, and the tied embedding's
     * 1/tp with the first (and last) stage. */
    double C = m->dim, block = 12.0 * C * C + 13.0 * C;
    double params = layers * block / l->tp + (double)m->vocab * C / l->tp + (double)m->max_seq * C;
    return (dt_cost_query){.model = m,
                           .B = l->micro_batch,
                           .T = m->max_seq,
                           .micro = l->micro,
                           .precision = l->precision,
                           .recompute_every = l->recompute_every,
                           .degree = {[DT_AXIS_DP] = l->dp,
                                      [DT_AXIS_TP] = l->tp,
                                      [DT_AXIS_PP] = l->pp,
                                      [DT_AXIS_CP] = l->cp},
                           .sp = l->sp,
                           .cp_mode = l->cp_mode,
                           .chunks = l->chunks,
                           .layers = layers,
                           .zero = l->zero,
                           .params = params,
                           .bucket_bytes = 0};
}

static dt_status predict(const dt_plan_request *rq, const dt_cluster *cl, const dt_plan_layout *l,
                         bool exact, dt_plan_candidate *out, dt__plan_step *keep);

static dt_status check_layout(const dt_plan_request *rq, const dt_cluster *cl,
                              const dt_plan_layout *l) {
    const dt_gpt_config *m = &rq->model;
    int devices = l->dp * l->tp * l->pp * l->cp;
    if (devices != rq->devices)
        return dt_error_set(DT_ERR_INVALID, "dp %d x tp %d x pp %d x cp %d = %d, not %d devices",
                            l->dp, l->tp, l->pp, l->cp, devices, rq->devices);
    if (cl->peak[l->precision] <= 0)
        return dt_error_set(DT_ERR_UNSUPPORTED, "the cluster has no %s peak",
                            dt_precision_name(l->precision));
    if (m->heads % l->tp)
        return dt_error_set(DT_ERR_INVALID, "%d heads do not split over tp %d", m->heads, l->tp);
    if ((long)l->dp * l->micro_batch * l->micro != rq->global_batch)
        return dt_error_set(DT_ERR_INVALID,
                            "dp %d x micro-batch %d x %d micro-batches != global "
                            "batch %d",
                            l->dp, l->micro_batch, l->micro, rq->global_batch);
    return DT_OK;
}

dt_status dt_plan_estimate(const dt_plan_request *rq, const dt_cluster *cl, const dt_plan_layout *l,
                           dt_plan_candidate *out) {
    memset(out, 0, sizeof *out);
    out->layout = *l;
    dt_status st = check_layout(rq, cl, l);
    if (st != DT_OK)
        return st;
    /* A lower bound of the memory, to skip layouts that cannot fit before
     * the exact plan: fp32 parameters and gradients, the optimizer's state
     * (sharded by ZeRO as the stages shard them), and each live
     * micro-batch's residual stream at every block's input (what even full
     * recomputation keeps). */
    dt_cost_query q = query_of(rq, l);
    placement p;
    place(cl, l, &p);
    double rep = (double)l->dp * l->cp, n = q.params;
    dt_optim_config oc = dt_optim_config_default();
    oc.kind = rq->optimizer;
    double states = n * 4 / (l->zero >= 3 ? rep : 1) + n * 4 / (l->zero >= 2 ? rep : 1) +
                    (double)dt_optimizer_plan_bytes(&oc, (size_t)n) / (l->zero >= 1 ? rep : 1);
    double live = l->pp > 1 ? (l->micro < l->pp ? l->micro : l->pp) : 1;
    double acts =
        live * q.layers * (double)l->micro_batch * rq->model.max_seq / l->cp * rq->model.dim * 4;
    if (states + acts > p.memory) {
        char need[32], have[32];
        return dt_error_set(DT_ERR_NOMEM,
                            "needs %s per device, %s usable (at least: the model "
                            "states and block inputs)",
                            dt_format_bytes(states + acts, need, sizeof need),
                            dt_format_bytes(p.memory, have, sizeof have));
    }
    return predict(rq, cl, l, false, out, NULL);
}

static dt_status evaluate(const dt_plan_request *rq, const dt_cluster *cl, const dt_plan_layout *l,
                          dt_plan_candidate *out, dt__plan_step *keep) {
    memset(out, 0, sizeof *out);
    out->layout = *l;
    dt_status st = check_layout(rq, cl, l);
    if (st != DT_OK)
        return st;
    DT_CHECK(plan_memory(rq, l, out));
    placement p;
    place(cl, l, &p);
    if (out->memory > p.memory) {
        char need[32], have[32];
        return dt_error_set(DT_ERR_NOMEM, "needs %s per device, %s usable",
                            dt_format_bytes(out->memory, need, sizeof need),
                            dt_format_bytes(p.memory, have, sizeof have));
    }
    return predict(rq, cl, l, true, out, keep);
}

dt_status dt_plan_evaluate(const dt_plan_request *rq, const dt_cluster *cl, const dt_plan_layout *l,
                           dt_plan_candidate *out) {
    return evaluate(rq, cl, l, out, NULL);
}

dt_status dt__plan_step_inputs(const dt_plan_request *rq, const dt_cluster *cl,
                               const dt_plan_layout *l, dt__plan_step *out) {
    memset(out, 0, sizeof *out);
    return evaluate(rq, cl, l, &out->cand, out);
}

/* The step of l: exact (the trainer's float count, the simulated
 * schedule) or estimated (the formula's float count, the theoretical
 * bubble), for ordering the search. */
static dt_status predict(const dt_plan_request *rq, const dt_cluster *cl, const dt_plan_layout *l,
                         bool exact, dt_plan_candidate *out, dt__plan_step *keep) {
    const dt_gpt_config *m = &rq->model;
    const int devices = rq->devices;
    placement p;
    place(cl, l, &p);
    /* Compute of one micro-batch on the busiest pipeline rank: its blocks
     * and the LM head (the last stage). */
    dt_cost_query q = query_of(rq, l);
    /* The fullest rank's float count, as the trainer lays it out, and its
     * bucket size (the trainer's rule: a quarter of the gradient bytes,
     * kept within 1 and 25 MiB). */
    if (exact)
        q.params = (double)out->mem.model.params / sizeof(float);
    double quarter = q.params * sizeof(float) / 4;
    q.bucket_bytes = (size_t)fmin(fmax(quarter, 1 << 20), 25 << 20);
    const double C = m->dim, T = m->max_seq, tokens = (double)l->micro_batch * T / l->cp;
    const double layer_fpt = 24.0 * C * C + 2.0 * C * (T + 1), head_fpt = 2.0 * C * m->vocab;
    const double speed = p.peak * dt_cluster_efficiency(cl, C);
    const double fwd_blocks = q.layers * layer_fpt * tokens / l->tp / speed;
    const double fwd = fwd_blocks + head_fpt * tokens / l->tp / speed;
    pass_costs pc = {.f = fwd, .b = 2 * fwd + (l->recompute_every ? fwd_blocks : 0)};
    if (l->pp > 1 && l->schedule == DT_PP_ZB) {
        pc.w = fwd; /* the weight gradient: one forward's FLOPs */
        pc.b -= fwd;
    }

    /* The model's communication (tp, cp) and the pipeline's transfers. */
    dt_strategy_cost model = {0}, sync = {0};
    dt_tp_plan_cost(&q, &model);
    dt_cp_plan_cost(&q, &model);
    dt_pp_plan_cost(&q, &model);
    double step_blocking = 0;
    for (int i = 0; i < model.n; i++) {
        const dt_comm_cost *c = &model.item[i];
        double t = item_time(c, l, &p);
        if (c->axis == DT_AXIS_PP && c->coll == DT_COLL_SEND)
            pc.p2p = t / c->calls; /* one transfer: on the schedule's path */
        else if (!c->per_micro)
            step_blocking += t;
        else if (c->overlapped)
            *(c->backward ? &pc.b_hide : &pc.f_hide) += t;
        else
            *(c->backward ? &pc.b_comm : &pc.f_comm) += t;
    }
    double f_all = pc.f + pc.f_comm + fmax(0, pc.f_hide - pc.f);
    double b_all = pc.b + pc.b_comm + fmax(0, pc.b_hide - pc.b);

    /* The gradient synchronisation's items (ZeRO 3's gathers are per
     * micro-batch, hidden behind the pass they prefetch for). */
    dt_grad_sync_plan_cost(&q, &sync);
    double last_bwd_sync = 0, sync_exposed = 0, per_micro_bwd = 0;
    for (int i = 0; i < sync.n; i++) {
        const dt_comm_cost *c = &sync.item[i];
        double t = item_time(c, l, &p);
        if (c->per_micro && !c->backward) {
            f_all += fmax(0, t - pc.f);
        } else if (c->per_micro && c->backward && c->coll == DT_COLL_ALLGATHER) {
            b_all += fmax(0, t - pc.b);
        } else if (c->backward && c->overlapped) {
            /* Buckets start as backward finishes them: all but the last
             * hide behind the last backward (per micro-batch ones behind
             * every backward). */
            last_bwd_sync += fmax(t - pc.b * (c->calls - 1) / c->calls, t / c->calls);
            if (c->per_micro)
                per_micro_bwd += fmax(0, t - (pc.f + pc.b));
        } else {
            sync_exposed += t;
        }
    }

    /* The passes: the schedule simulated with these durations, or the
     * micro-batches one after another. */
    double passes;
    if (l->pp > 1 && !exact) {
        double per = f_all + b_all + pc.w + 2 * pc.p2p / l->chunks;
        passes = l->micro * per /
                 (1 - dt_pp_theoretical_bubble(l->schedule, l->pp, l->chunks, l->micro));
        out->bubble = 1 - l->micro * (f_all + b_all + pc.w) / passes;
    } else if (l->pp > 1) {
        int Ms = sim_micro(l);
        dt_pp_schedule *s;
        DT_CHECK(dt_pp_schedule_create(&s, l->schedule, l->pp, l->chunks, Ms));
        dt_pp_costs costs = {.f = f_all, .b = b_all, .w = pc.w > 0 ? pc.w : 1e-12, .comm = pc.p2p};
        if (l->schedule != DT_PP_ZB)
            costs.w = 0;
        dt_pp_report r;
        dt_status st = dt_pp_check(s, &costs, &r);
        dt_pp_schedule_destroy(s);
        DT_CHECK(st);
        passes = r.makespan + (double)(l->micro - Ms) * (f_all + b_all + costs.w);
        out->bubble = 1 - l->micro * (f_all + b_all + costs.w) / passes;
        if (out->bubble < 0)
            out->bubble = 0;
        dt_pp_report_free(&r);
    } else {
        passes = l->micro * (f_all + b_all);
    }
    passes += (l->micro - 1) * per_micro_bwd;

    /* The update: AdamW streams p, g, m, v in and p, m, v out (fp32), and
     * the 16-bit weights out, over what this rank owns. */
    double owned = q.params / (l->zero >= 1 ? (double)l->dp * l->cp : 1);
    double upd_bytes = owned * (7 * 4 + (l->precision != DT_PRECISION_FP32 ? 2 : 0));
    out->optimizer_s = upd_bytes / p.mem_bw;

    out->passes_s = passes;
    out->compute_s = l->micro * (pc.f + pc.b + pc.w);
    out->model_comm_s = l->micro * (f_all + b_all - pc.f - pc.b) + step_blocking;
    out->sync_s = last_bwd_sync + sync_exposed;
    out->step_s = passes + step_blocking + out->sync_s + out->optimizer_s;
    double fpt = dt_gpt_flops_per_token(m, m->max_seq);
    double tok = (double)rq->global_batch * m->max_seq;
    out->tokens_per_s = tok / out->step_s;
    out->tflops_device = 3 * fpt * tok / out->step_s / devices / 1e12;
    out->hw_tflops_device = (l->recompute_every ? 4 : 3) * fpt * tok / out->step_s / devices / 1e12;
    out->mfu = out->tflops_device * 1e12 / (cl->shared_compute ? p.peak : cl->peak[l->precision]);
    if (keep) {
        keep->f = pc.f;
        keep->b = pc.b;
        keep->w = pc.w;
        keep->model = model;
        keep->sync = sync;
        for (int a = 0; a < DT_AXIS_COUNT; a++) {
            keep->group[a] = group_size(l, (dt_axis)a);
            keep->link[a] = p.link[a];
            keep->across[a] = p.across[a];
            if (p.across[a])
                keep->inter_bw = p.link[a].bw;
            else
                keep->intra_bw = p.link[a].bw;
        }
        if (keep->inter_bw <= 0)
            keep->inter_bw = cl->inter.bw / p.ranks_on_node;
        if (keep->intra_bw <= 0)
            keep->intra_bw = cl->intra.bw;
    }
    return DT_OK;
}

dt_status dt_plan_timeline(const dt_plan_request *rq, const dt_cluster *cl, const dt_plan_layout *l,
                           FILE *f) {
    dt_plan_candidate c;
    DT_CHECK(dt_plan_evaluate(rq, cl, l, &c));
    fprintf(f,
            "predicted step %.4g s: passes %.4g s (compute %.4g s, model communication %.4g s, "
            "bubble %.1f%%), synchronisation %.4g s, optimizer %.4g s\n",
            c.step_s, c.passes_s, c.compute_s, c.model_comm_s, 100 * c.bubble, c.sync_s,
            c.optimizer_s);
    if (l->pp <= 1)
        return DT_OK;
    dt_pp_schedule *s;
    int Ms = sim_micro(l);
    DT_CHECK(dt_pp_schedule_create(&s, l->schedule, l->pp, l->chunks, Ms));
    double f_all = c.compute_s / l->micro / 3; /* relative units suffice for the drawing */
    dt_pp_costs costs = {.f = f_all, .b = 2 * f_all, .w = l->schedule == DT_PP_ZB ? f_all : 0};
    if (l->schedule == DT_PP_ZB)
        costs.b = f_all;
    dt_pp_report r;
    dt_status st = dt_pp_check(s, &costs, &r);
    if (st == DT_OK) {
        fprintf(f, "pipeline timeline (first %d micro-batches; one column per %s):\n", Ms,
                l->chunks > 1 ? "half forward" : "forward");
        dt_pp_timeline_text(s, &r, f_all / (l->chunks > 1 ? 2 : 1), f);
        dt_pp_report_free(&r);
    }
    dt_pp_schedule_destroy(s);
    return st;
}
