/*
 * step_sim.c — one layout's step as a discrete-event simulation
 * (dtrain/sim.h): the pipeline's schedule table, each action's compute
 * from the analytic model, and every collective the strategies describe
 * placed on the link its group crosses, where collectives that overlap in
 * time share the link's bandwidth (docs/planner.md, "The step
 * simulation").
 *
 * One rank stands for each pipeline stage (its dp, tp and cp peers do the
 * same work at the same time); it has its own share of the intra-node link
 * and of its node's network ports, as the analytic model gives it. Its
 * lanes: the compute stream (passes, blocking tp/cp collectives, the
 * update), the prefetch stream (collectives the code hides behind a pass:
 * ZeRO-3's gathers, the cp ring's shifts), the gradient stream (bucketed
 * reduction as backward finishes the buckets) and one stream per pipeline
 * flow (activations, gradients), as the executor has one comm group each.
 *
 * The order tasks are added in is the order of the pipeline checker's own
 * simulation (dt_pp_check, without contention): every task's inputs are
 * added before it, as dtrain/sim.h requires.
 */
#include "dtrain/sim.h"
#include "plan_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { LANE_COMPUTE, LANE_PREFETCH, LANE_GRAD, LANE_ACT, LANE_GRADSEND, LANE_COUNT };
static const char *const lane_names[LANE_COUNT] = {"compute", "prefetch", "gradient sync",
                                                   "pp activations", "pp gradients"};
#define MAX_BUCKETS 64

typedef struct builder {
    dt_sim *sim;
    const dt__plan_step *in;
    const dt_plan_layout *l;
    bool private_links; /* every transfer alone on a link of its own: no contention */
    bool split_w;       /* the table has W actions (B is the input gradient only) */
    double sim_bw[2];   /* the bandwidths of the intra and inter links as simulated */
    int P, V, S, M;
    int *lane;         /* (P x LANE_COUNT) */
    int *link;         /* (P x 2) intra, inter */
    int *last_compute; /* (P) the last task of the compute lane, -1 */
    int *pending;      /* (P) a prefetch the next compute task must wait for, -1 */
    int *last_grad;    /* (P) the last bucket task, -1 */
    /* Pipeline transfers, by (flow, micro-batch, receiving stage). */
    int *send_post, *recv_post, *xfer, *sender;
    dt_status st;
} builder;

/* The link task of rank r for axis a (or a private copy). */
static int link_of(builder *b, int r, dt_axis a) {
    int k = b->link[2 * r + (b->in->across[a] ? 1 : 0)];
    if (b->private_links && k >= 0)
        k = dt_sim_link(b->sim, "private", b->sim_bw[b->in->across[a] ? 1 : 0]);
    return k;
}

static int add(builder *b, int r, int lane, dt_sim_task t) {
    if (b->st != DT_OK)
        return -1;
    t.lane = b->lane[r * LANE_COUNT + lane];
    int id = dt_sim_add(b->sim, &t);
    if (id < 0)
        b->st = dt_error_set(DT_ERR_INTERNAL, "plan simulation: %s", dt_last_error());
    return id;
}

/* A collective item, scaled by `share` (1/V for one chunk), on rank r. */
static int add_coll(builder *b, int r, int lane, const dt_comm_cost *c, double share, int *deps,
                    int ndeps, int idx) {
    double lat, bytes;
    dt__plan_coll_parts(c, b->in->group[c->axis], &b->in->link[c->axis], &lat, &bytes);
    if (lat <= 0 && bytes <= 0)
        return -1;
    dt_sim_task t = {.link = link_of(b, r, c->axis),
                     .seconds = c->calls * lat * share,
                     .bytes = c->calls * bytes * share,
                     .ndeps = ndeps,
                     .name = c->what,
                     .cat = "comm",
                     .idx = idx};
    for (int i = 0; i < ndeps; i++)
        t.deps[i] = deps[i];
    return add(b, r, lane, t);
}

/* A compute-lane task of rank r, after the pending prefetch and `dep`. */
static int add_compute(builder *b, int r, double seconds, const char *name, const char *cat,
                       int dep, int idx) {
    dt_sim_task t = {.link = -1, .seconds = seconds, .name = name, .cat = cat, .idx = idx};
    if (dep >= 0)
        t.deps[t.ndeps++] = dep;
    if (b->pending[r] >= 0)
        t.deps[t.ndeps++] = b->pending[r];
    b->pending[r] = -1;
    int id = add(b, r, LANE_COMPUTE, t);
    b->last_compute[r] = id;
    return id;
}

/* Which items go where (the analytic model's rules, model.c). */
static bool is_prefetch(const dt_comm_cost *c, bool sync) {
    if (!c->per_micro)
        return false;
    if (!sync)
        return c->overlapped && c->coll != DT_COLL_SEND;
    return !c->backward || c->coll == DT_COLL_ALLGATHER;
}
static bool is_bucketed(const dt_comm_cost *c) {
    return c->backward && c->overlapped && !(c->per_micro && c->coll == DT_COLL_ALLGATHER);
}

/* Bucketed reduction of the items that apply (per micro-batch ones after
 * every micro-batch's last backward, per-step ones after the last): the
 * backward is split into K parts and bucket i of an item of k starts when
 * the part holding its end finished. */
static void add_backward(builder *b, int r, double seconds, const char *name, int dep, int mb,
                         bool last_of_mb, bool last_of_step) {
    const dt_strategy_cost *sync = &b->in->sync;
    int K = 1;
    for (int i = 0; i < sync->n; i++) {
        const dt_comm_cost *c = &sync->item[i];
        if (is_bucketed(c) && ((c->per_micro && last_of_mb) || last_of_step))
            K = (int)fmax(K, fmin(MAX_BUCKETS, ceil(c->calls)));
    }
    int part[MAX_BUCKETS];
    for (int k = 0; k < K; k++)
        part[k] = add_compute(b, r, seconds / K, name, "compute", k ? -1 : dep, mb);
    for (int i = 0; i < sync->n; i++) {
        const dt_comm_cost *c = &sync->item[i];
        if (!is_bucketed(c) || !((c->per_micro && last_of_mb) || last_of_step))
            continue;
        int k = (int)fmin(MAX_BUCKETS, fmax(1, ceil(c->calls)));
        dt_comm_cost one = *c;
        one.calls = c->calls / k;
        for (int j = 0; j < k; j++) {
            int d = part[(j + 1) * K / k - 1];
            int id = add_coll(b, r, LANE_GRAD, &one, 1, &d, 1, j);
            if (id >= 0)
                b->last_grad[r] = id;
        }
    }
}

/* One compute action of the table (F, B or W of micro-batch mb, one chunk),
 * with the blocking and hidden communication that goes with it. */
static void add_action(builder *b, int r, const dt_pp_action *a, int input, bool last_of_mb,
                       bool last_of_step) {
    const dt__plan_step *in = b->in;
    double share = 1.0 / b->V;
    bool bwd = a->op != DT_PP_F;
    /* What the code hides behind this pass starts with it. */
    int prev = b->last_compute[r], hid = -1;
    for (int s = 0; s < 2 && a->op != DT_PP_W; s++) {
        const dt_strategy_cost *items = s ? &in->sync : &in->model;
        for (int i = 0; i < items->n; i++) {
            const dt_comm_cost *c = &items->item[i];
            if (is_prefetch(c, s) && c->backward == bwd) {
                int deps[2], n = 0;
                if (prev >= 0)
                    deps[n++] = prev;
                if (hid >= 0)
                    deps[n++] = hid;
                int id = add_coll(b, r, LANE_PREFETCH, c, share, deps, n, (int)a->mb);
                if (id >= 0)
                    hid = id;
            }
        }
    }
    static const char *const names[] = {"F", "B", "W"};
    double sec = a->op == DT_PP_F   ? in->f
                 : a->op == DT_PP_W ? in->w
                                    : in->b + (b->split_w ? 0 : in->w);
    if (a->op == DT_PP_B || (a->op == DT_PP_W))
        add_backward(b, r, sec * share, names[a->op], input, (int)a->mb, last_of_mb, last_of_step);
    else
        add_compute(b, r, sec * share, names[a->op], "compute", input, (int)a->mb);
    if (hid >= 0)
        b->pending[r] = hid;
    /* The blocking collectives of the pass (tp, Ulysses). */
    for (int i = 0; i < in->model.n && a->op != DT_PP_W; i++) {
        const dt_comm_cost *c = &in->model.item[i];
        if (c->per_micro && !c->overlapped && c->coll != DT_COLL_SEND && c->backward == bwd) {
            int prevc = b->last_compute[r];
            int id = add_coll(b, r, LANE_COMPUTE, c, share, &prevc, prevc >= 0, (int)a->mb);
            if (id >= 0)
                b->last_compute[r] = id;
        }
    }
}

/* A pipeline transfer's slot: flow (0 activations, 1 gradients),
 * micro-batch, receiving stage. */
static size_t slot(const builder *b, int flow, int mb, int stage) {
    return ((size_t)flow * b->M + (size_t)mb) * b->S + (size_t)stage;
}

static void add_transfer(builder *b, size_t k, int flow) {
    const dt_comm_cost *c = NULL;
    for (int i = 0; i < b->in->model.n; i++)
        if (b->in->model.item[i].coll == DT_COLL_SEND &&
            b->in->model.item[i].backward == (flow == 1))
            c = &b->in->model.item[i];
    int deps[2], n = 0;
    if (b->send_post[k] >= 0)
        deps[n++] = b->send_post[k];
    if (b->recv_post[k] >= 0)
        deps[n++] = b->recv_post[k];
    int r = b->sender[k];
    if (!c) {
        b->xfer[k] = -1;
        return;
    }
    b->xfer[k] = add_coll(b, r, flow ? LANE_GRADSEND : LANE_ACT, c, 1.0 / c->calls, deps, n,
                          (int)(k / b->S % b->M));
}

typedef struct order_key {
    double t;
    int prio, rank;
    size_t i;
} order_key;

static int cmp_key(const void *x, const void *y) {
    const order_key *a = x, *c = y;
    if (a->t != c->t)
        return a->t < c->t ? -1 : 1;
    if (a->prio != c->prio)
        return a->prio - c->prio;
    if (a->rank != c->rank)
        return a->rank - c->rank;
    return a->i < c->i ? -1 : a->i > c->i;
}

static dt_status build(builder *b, const dt_plan_layout *l, dt_pp_schedule *s,
                       const dt_pp_report *rep) {
    const int P = b->P;
    /* Actions in the order of the checker's simulation. */
    size_t n = s->start[P];
    order_key *keys = malloc((n ? n : 1) * sizeof *keys);
    if (!keys)
        return dt_error_set(DT_ERR_NOMEM, "plan simulation: out of memory");
    for (int r = 0; r < P; r++)
        for (size_t i = s->start[r]; i < s->start[r + 1]; i++) {
            bool xfer = s->actions[i].op >= DT_PP_SEND_ACT;
            keys[i] = (order_key){rep ? rep->start[i] : (double)i, xfer ? 0 : 1, r, i};
        }
    qsort(keys, n, sizeof *keys, cmp_key);
    /* The last backward of each micro-batch on each rank, and of the step. */
    for (size_t j = 0; j < n && b->st == DT_OK; j++) {
        int r = keys[j].rank;
        size_t i = keys[j].i;
        const dt_pp_action *a = &s->actions[i];
        int stage = l->pp > 1 ? dt_pp_stage_of(s, r, a->chunk) : 0;
        if (a->op >= DT_PP_SEND_ACT) {
            bool send = a->op == DT_PP_SEND_ACT || a->op == DT_PP_SEND_GRAD;
            int flow = a->op == DT_PP_SEND_ACT || a->op == DT_PP_RECV_ACT ? 0 : 1;
            int to = send ? (flow ? stage - 1 : stage + 1) : stage;
            size_t k = slot(b, flow, (int)a->mb, to);
            if (send) {
                b->send_post[k] = b->last_compute[r];
                b->sender[k] = r;
            } else {
                b->recv_post[k] = b->last_compute[r];
            }
            if (b->sender[k] >= 0 && b->recv_post[k] != -2 && b->send_post[k] != -2)
                add_transfer(b, k, flow);
            continue;
        }
        int input = -1;
        if (a->op == DT_PP_F && stage > 0)
            input = b->xfer[slot(b, 0, (int)a->mb, stage)];
        if (a->op == DT_PP_B && stage < b->S - 1)
            input = b->xfer[slot(b, 1, (int)a->mb, stage)];
        /* The rank's last backward-type action of this micro-batch (chunk
         * 0's B, or W with split backward) and of the step. */
        bool last_of_mb = false, last_of_step = false;
        dt_pp_op fin = s->split_w ? DT_PP_W : DT_PP_B;
        if (a->op == fin && a->chunk == 0) {
            last_of_mb = true;
            last_of_step = true;
            for (size_t q = i + 1; q < s->start[r + 1]; q++)
                if (s->actions[q].op == fin)
                    last_of_step = false;
        }
        add_action(b, r, a, input, last_of_mb, last_of_step);
    }
    free(keys);
    return b->st;
}

/* The step after the passes: per-step blocking items, the update (after
 * this rank's gradient buckets), the collectives that follow it. */
static void add_tail(builder *b, int r) {
    const dt__plan_step *in = b->in;
    for (int i = 0; i < in->model.n; i++) {
        const dt_comm_cost *c = &in->model.item[i];
        if (!c->per_micro) {
            int prev = b->last_compute[r];
            int id = add_coll(b, r, LANE_COMPUTE, c, 1, &prev, prev >= 0, -1);
            if (id >= 0)
                b->last_compute[r] = id;
        }
    }
    add_compute(b, r, in->cand.optimizer_s, "optimizer update", "optim", b->last_grad[r], -1);
    for (int i = 0; i < in->sync.n; i++) {
        const dt_comm_cost *c = &in->sync.item[i];
        if (!is_prefetch(c, true) && !is_bucketed(c)) {
            int prev = b->last_compute[r];
            int id = add_coll(b, r, LANE_COMPUTE, c, 1, &prev, prev >= 0, -1);
            if (id >= 0)
                b->last_compute[r] = id;
        }
    }
}

static dt_status simulate(const dt_plan_request *rq, const dt__plan_step *in,
                          const dt_plan_layout *l, bool private_links, double *step, FILE *trace,
                          const char *other) {
    (void)rq;
    builder b = {.in = in,
                 .l = l,
                 .private_links = private_links,
                 .P = l->pp,
                 .V = l->pp > 1 ? l->chunks : 1,
                 .M = l->micro};
    b.S = b.P * b.V;
    dt_pp_schedule *s = NULL;
    dt_pp_report rep = {0};
    bool have_rep = false;
    dt_status st = DT_OK;
    if (l->pp > 1) {
        DT_CHECK(dt_pp_schedule_create(&s, l->schedule, l->pp, b.V, l->micro));
        double p2p = 0;
        for (int i = 0; i < in->model.n; i++)
            if (in->model.item[i].coll == DT_COLL_SEND) {
                double lat, by;
                dt__plan_coll_parts(&in->model.item[i], in->group[DT_AXIS_PP],
                                    &in->link[DT_AXIS_PP], &lat, &by);
                p2p = lat + by / in->link[DT_AXIS_PP].bw;
            }
        dt_pp_costs costs = {.f = in->f, .b = in->b, .w = in->w, .comm = p2p};
        st = dt_pp_check(s, &costs, &rep);
        have_rep = st == DT_OK;
    } else {
        /* Without a pipeline the table is F, B per micro-batch. */
        size_t counts[1] = {2 * (size_t)l->micro};
        dt_pp_action *acts = calloc(counts[0], sizeof *acts);
        if (!acts)
            return dt_error_set(DT_ERR_NOMEM, "plan simulation: out of memory");
        for (int m = 0; m < l->micro; m++) {
            acts[2 * m] = (dt_pp_action){.op = DT_PP_F, .mb = (uint32_t)m, .peer = -1};
            acts[2 * m + 1] = (dt_pp_action){.op = DT_PP_B, .mb = (uint32_t)m, .peer = -1};
        }
        st = dt_pp_schedule_from(&s, DT_PP_GPIPE, 1, 1, l->micro, false, counts, acts);
        free(acts);
    }
    size_t slots = 2 * (size_t)b.M * b.S;
    b.lane = malloc((size_t)b.P * LANE_COUNT * sizeof *b.lane);
    b.link = malloc((size_t)b.P * 2 * sizeof *b.link);
    b.last_compute = malloc((size_t)b.P * sizeof(int));
    b.pending = malloc((size_t)b.P * sizeof(int));
    b.last_grad = malloc((size_t)b.P * sizeof(int));
    b.send_post = malloc(slots * sizeof(int));
    b.recv_post = malloc(slots * sizeof(int));
    b.xfer = malloc(slots * sizeof(int));
    b.sender = malloc(slots * sizeof(int));
    if (st == DT_OK && !(b.lane && b.link && b.last_compute && b.pending && b.last_grad &&
                         b.send_post && b.recv_post && b.xfer && b.sender))
        st = dt_error_set(DT_ERR_NOMEM, "plan simulation: out of memory");
    b.sim_bw[0] = in->intra_bw;
    b.sim_bw[1] = in->inter_bw > 0 ? in->inter_bw : in->intra_bw;
    if (st == DT_OK)
        st = dt_sim_create(&b.sim);
    if (st == DT_OK) {
        for (size_t k = 0; k < slots; k++) {
            b.send_post[k] = b.recv_post[k] = -2; /* -2: not posted yet */
            b.xfer[k] = b.sender[k] = -1;
        }
        dt_mesh_shape shape = dt_mesh_shape_default();
        shape.degree[DT_AXIS_DP] = l->dp;
        shape.degree[DT_AXIS_TP] = l->tp;
        shape.degree[DT_AXIS_PP] = l->pp;
        shape.degree[DT_AXIS_CP] = l->cp;
        for (int r = 0; r < b.P && st == DT_OK; r++) {
            int coord[DT_AXIS_COUNT] = {[DT_AXIS_PP] = r};
            int pid = dt_mesh_rank_of(&shape, coord);
            for (int k = 0; k < LANE_COUNT; k++)
                b.lane[r * LANE_COUNT + k] = dt_sim_lane(b.sim, pid, k + 1, lane_names[k]);
            char nm[2][32];
            snprintf(nm[0], sizeof nm[0], "intra (rank %d)", pid);
            snprintf(nm[1], sizeof nm[1], "inter (rank %d)", pid);
            /* A one-node cluster may have no inter-node link: no axis
             * crosses it then, and its stand-in is never used. */
            b.link[2 * r] = dt_sim_link(b.sim, nm[0], in->intra_bw);
            b.link[2 * r + 1] = dt_sim_link(b.sim, nm[1], b.sim_bw[1]);
            if (b.link[2 * r] < 0 || b.link[2 * r + 1] < 0)
                st = dt_error_set(DT_ERR_INVALID, "plan simulation: %s", dt_last_error());
            b.last_compute[r] = b.pending[r] = b.last_grad[r] = -1;
        }
    }
    if (st == DT_OK) {
        b.split_w = s->split_w;
        st = build(&b, l, s, have_rep ? &rep : NULL);
    }
    for (int r = 0; r < b.P && st == DT_OK; r++)
        add_tail(&b, r);
    if (st == DT_OK)
        st = b.st;
    if (st == DT_OK)
        st = dt_sim_run(b.sim, step);
    if (st == DT_OK && trace)
        st = dt_sim_write_trace(b.sim, trace, other);
    dt_sim_destroy(b.sim);
    if (have_rep)
        dt_pp_report_free(&rep);
    dt_pp_schedule_destroy(s);
    free(b.lane);
    free(b.link);
    free(b.last_compute);
    free(b.pending);
    free(b.last_grad);
    free(b.send_post);
    free(b.recv_post);
    free(b.xfer);
    free(b.sender);
    return st;
}

dt_status dt_plan_simulate(const dt_plan_request *rq, const dt_cluster *cl, const dt_plan_layout *l,
                           dt_plan_sim *out, FILE *trace) {
    memset(out, 0, sizeof *out);
    if ((double)l->pp * l->chunks * l->micro * 2 > 4e6)
        return dt_error_set(DT_ERR_INVALID,
                            "plan simulation: %d stages x %d chunks x %d micro-batches is too "
                            "large to simulate action by action (at most 2e6 actions)",
                            l->pp, l->chunks, l->micro);
    dt__plan_step *in = malloc(sizeof *in);
    if (!in)
        return dt_error_set(DT_ERR_NOMEM, "plan simulation: out of memory");
    dt_status st = dt__plan_step_inputs(rq, cl, l, in);
    if (st == DT_OK)
        st = simulate(rq, in, l, true, &out->alone_s, NULL, NULL);
    if (st == DT_OK) {
        char lb[200], other[600], name[64];
        snprintf(name, sizeof name, "%s", cl->name);
        for (char *c = name; *c; c++)
            if (*c == '"' || *c == '\\' || (unsigned char)*c < 0x20)
                *c = '_';
        snprintf(
            other, sizeof other,
            "{\"predicted\":true,\"layout\":\"%s\",\"cluster\":\"%s\",\"analytic_step_s\":%.9g,"
            "\"uncontended_step_s\":%.9g}",
            dt_plan_layout_format(l, lb, sizeof lb), name, in->cand.step_s, out->alone_s);
        st = simulate(rq, in, l, false, &out->step_s, trace, other);
    }
    out->analytic_s = in->cand.step_s;
    free(in);
    return st;
}
