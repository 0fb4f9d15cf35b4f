/*
 * pipeline_run.c — the pipeline executor: runs one rank's list of a checked
 * schedule (pipeline.c) on its model part (parallel.h, "Runners", for the
 * semantics). One step:
 *
 *     for each action of this rank, in order:
 *       a run of transfers   -> one non-blocking batch per flow (activations
 *                               on the pipeline group, gradients on its twin)
 *       F(mb, c)             -> wait for the batch bringing its input; a free
 *                               slot of chunk c; forward
 *       B(mb, c)             -> wait for the batch bringing d(output);
 *                               backward; its input gradient copied into a
 *                               buffer for the send that follows
 *       W(mb, c)             -> the blocks' weight gradients
 *     wait for every batch; the tied embedding's gradient summed over the
 *     first and last stage, then reported ready; the bubble over the
 *     pipeline's ranks.
 *
 * Batches complete in order per flow (as dtrain's group queue runs them);
 * `posted` and `done` count them, and a transfer remembers the batch that
 * carries it (its 1-based number), so "is it complete" is done >= number.
 */
#include "runner_internal.h"

#include <inttypes.h>
#include <stdio.h>

enum { FLOW_ACT, FLOW_GRAD, FLOWS };

/* A flow: the batches posted on one group this step. */
typedef struct flow {
    dt_group *g;
    dt_work **works; /* (cap) by batch number - 1 */
    int64_t posted, done;
} flow;

/* A transfer buffer of one (Ns,C) residual stream. */
typedef struct tbuf {
    float *p;
    bool held;       /* a received value not yet consumed, or a gradient being sent */
    int64_t sending; /* > 0: free once the gradient flow has completed this batch */
} tbuf;

typedef struct pp_runner {
    dt_runner base;
    dt_gpt *m;
    const dt_pp_schedule *s;
    int P, V, M, S, rank;
    size_t first, count; /* this rank's actions: s->actions[first .. first + count) */
    flow fl[FLOWS];
    dt_group *grad_group;  /* owned: the gradient flow's group */
    dt_group *embed_group; /* owned: first and last stage (NULL elsewhere, or P == 1) */
    size_t wte_floats;     /* the tied embedding at the front of the buffers (0: none here) */
    int slots;             /* per chunk */
    /* Per (mb, chunk) = mb * V + c: */
    int *slot_of;    /* its slot, -1 */
    int *in_buf;     /* transfer buffer of its received activation / gradient, -1 */
    int64_t *in_seq; /* the batch that brings it (0: none) */
    int *out_buf;    /* the buffer holding its input gradient to send, -1 */
    /* Per chunk x slot: the act batch sending its output (0: none), in use. */
    int64_t *slot_send;
    bool *slot_used;
    int *nb, *nw; /* per chunk: backwards / Ws done this step */
    tbuf *bufs;
    int nbufs, capbufs;
    size_t buf_floats;
    dt_p2p *ops; /* one run's transfers, per flow */
    /* The step in progress. */
    const dt_run_batch *b;
    dt_grad_sync *sync;
    bool began; /* begin_backward called */
    size_t ns;  /* floats of one transfer: rows here x C */
    int live;
    dt_run_result *res;
} pp_runner;

/* ------------------------------------------------------------------------ */
/* Flows and buffers                                                        */
/* ------------------------------------------------------------------------ */

/* Complete batches up to number `upto` (blocking). */
static dt_status flow_wait(pp_runner *r, int f, int64_t upto) {
    flow *w = &r->fl[f];
    if (upto <= w->done)
        return DT_OK;
    double t0 = dt_now();
    while (w->done < upto) {
        dt_work *k = w->works[w->done];
        w->works[w->done++] = NULL;
        DT_CHECK(dt_work_wait(k));
    }
    r->res->wait_ms += (dt_now() - t0) * 1e3;
    return DT_OK;
}

/* Complete what has completed, without blocking. */
static dt_status flow_poll(pp_runner *r, int f) {
    flow *w = &r->fl[f];
    while (w->done < w->posted) {
        bool done;
        DT_CHECK(dt_work_test(w->works[w->done], &done));
        if (!done)
            break;
        dt_work *k = w->works[w->done];
        w->works[w->done++] = NULL;
        DT_CHECK(dt_work_wait(k));
    }
    return DT_OK;
}

/* A free transfer buffer (growing the pool when every one is in use: the
 * schedule keeps more in flight than seen so far). */
static dt_status buf_get(pp_runner *r, int *out) {
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; i < r->nbufs; i++) {
            tbuf *t = &r->bufs[i];
            if (t->held && t->sending > 0 && r->fl[FLOW_GRAD].done >= t->sending)
                t->held = false, t->sending = 0;
            if (!t->held) {
                t->held = true;
                *out = i;
                return DT_OK;
            }
        }
        if (pass == 0)
            DT_CHECK(flow_poll(r, FLOW_GRAD));
    }
    if (r->nbufs == r->capbufs) {
        int cap = r->capbufs ? 2 * r->capbufs : 8;
        tbuf *b = dt_calloc((size_t)cap, sizeof *b);
        if (!b)
            return DT_ERR_NOMEM;
        if (r->nbufs)
            memcpy(b, r->bufs, (size_t)r->nbufs * sizeof *b);
        dt_free(r->bufs);
        r->bufs = b;
        r->capbufs = cap;
    }
    tbuf *t = &r->bufs[r->nbufs];
    if (!(t->p = dt_alloc(r->buf_floats * sizeof(float))))
        return dt_error_set(DT_ERR_NOMEM, "pipeline transfer buffer of %zu floats", r->buf_floats);
    t->held = true;
    t->sending = 0;
    *out = r->nbufs++;
    return DT_OK;
}

static void buf_put(pp_runner *r, int i) {
    r->bufs[i].held = false;
    r->bufs[i].sending = 0;
}

/* ------------------------------------------------------------------------ */
/* Actions                                                                  */
/* ------------------------------------------------------------------------ */

static int idx(const pp_runner *r, uint32_t mb, int c) { return (int)mb * r->V + c; }

/* The tag both sides of a transfer use: micro-batch and the boundary
 * between stage st and st + 1 (a mismatch fails in comm, naming both). */
static int tag_of(const pp_runner *r, uint32_t mb, int boundary) {
    return (int)mb * r->S + boundary;
}

/* Post actions [i, j) (consecutive transfers) as one batch per flow. */
static dt_status post_run(pp_runner *r, size_t i, size_t j) {
    size_t n[FLOWS] = {0, 0};
    dt_p2p *ops[FLOWS] = {r->ops, r->ops + (j - i)};
    int64_t num[FLOWS] = {r->fl[FLOW_ACT].posted + 1, r->fl[FLOW_GRAD].posted + 1};
    for (size_t k = i; k < j; k++) {
        const dt_pp_action *a = &r->s->actions[r->first + k];
        int c = a->chunk, st = dt_pp_stage_of(r->s, r->rank, c), e = idx(r, a->mb, c);
        int f = a->op == DT_PP_SEND_ACT || a->op == DT_PP_RECV_ACT ? FLOW_ACT : FLOW_GRAD;
        dt_p2p *o = &ops[f][n[f]++];
        *o = (dt_p2p){.count = r->ns, .dtype = DT_F32, .peer = a->peer};
        switch (a->op) {
        case DT_PP_SEND_ACT: {
            int k2 = c * r->slots + r->slot_of[e];
            o->send = true;
            o->buf = (void *)dt_gpt_stage_output(r->m, c, r->slot_of[e]);
            o->tag = tag_of(r, a->mb, st);
            r->slot_send[k2] = num[f];
            break;
        }
        case DT_PP_RECV_ACT:
        case DT_PP_RECV_GRAD:
            DT_CHECK(buf_get(r, &r->in_buf[e]));
            o->buf = r->bufs[r->in_buf[e]].p;
            o->tag = tag_of(r, a->mb, a->op == DT_PP_RECV_ACT ? st - 1 : st);
            r->in_seq[e] = num[f];
            break;
        case DT_PP_SEND_GRAD:
            o->send = true;
            o->buf = r->bufs[r->out_buf[e]].p;
            o->tag = tag_of(r, a->mb, st - 1);
            r->bufs[r->out_buf[e]].sending = num[f];
            r->out_buf[e] = -1;
            break;
        default: DT_ASSERT(0);
        }
        if (o->send)
            r->res->bytes_sent += r->ns * sizeof(float);
    }
    for (int f = 0; f < FLOWS; f++) {
        if (!n[f])
            continue;
        flow *w = &r->fl[f];
        DT_CHECK(dt_group_isendrecv_batch(w->g, ops[f], n[f], &w->works[w->posted]));
        w->posted++;
    }
    return DT_OK;
}

/* The synchronisation's hook, holding back the tied embedding (its
 * gradient is final only after the sum over the first and last stage). */
static void ready(void *user, size_t from) {
    pp_runner *r = user;
    dt_grad_sync_ready(r->sync, from < r->wte_floats ? r->wte_floats : from);
}

/* Before the first pass that makes gradients final. */
static void begin_final(pp_runner *r) {
    if (!r->began) /* the runner accumulates its micro-batches itself */
        (void)dt_grad_sync_begin_backward(r->sync, true);
    r->began = true;
}

static dt_status do_forward(pp_runner *r, const dt_pp_action *a) {
    const dt_run_batch *b = r->b;
    int c = a->chunk, e = idx(r, a->mb, c);
    bool first = dt_pp_stage_of(r->s, r->rank, c) == 0,
         last = dt_pp_stage_of(r->s, r->rank, c) == r->S - 1;
    if (!first)
        DT_CHECK(flow_wait(r, FLOW_ACT, r->in_seq[e]));
    /* A slot of chunk c: a free one, else the one whose output send
     * completes first. */
    int slot = -1;
    int64_t best = INT64_MAX;
    for (int k = 0; k < r->slots; k++) {
        int k2 = c * r->slots + k;
        if (r->slot_used[k2])
            continue;
        if (r->slot_send[k2] <= r->fl[FLOW_ACT].done) {
            slot = k;
            break;
        }
        if (r->slot_send[k2] < best)
            best = r->slot_send[k2], slot = k;
    }
    if (slot < 0)
        return dt_error_set(DT_ERR_INTERNAL,
                            "pipeline: chunk %d has no free slot of %d (the schedule keeps more "
                            "micro-batches alive than the checker found)",
                            c, r->slots);
    DT_CHECK(flow_wait(r, FLOW_ACT, r->slot_send[c * r->slots + slot]));
    r->slot_send[c * r->slots + slot] = 0;
    r->slot_used[c * r->slots + slot] = true;
    r->slot_of[e] = slot;
    size_t bt = (size_t)b->B * b->T;
    float loss = 0;
    double t0 = dt_now();
    DT_CHECK(dt_gpt_forward_stage(r->m, c, slot, first ? b->inputs + a->mb * bt : NULL,
                                  first ? NULL : r->bufs[r->in_buf[e]].p,
                                  last ? b->targets + a->mb * bt : NULL, b->B, b->T,
                                  last ? &loss : NULL));
    r->res->busy_ms += (dt_now() - t0) * 1e3;
    r->res->loss += loss;
    if (!first) {
        buf_put(r, r->in_buf[e]);
        r->in_buf[e] = -1;
    }
    r->live++;
    r->res->peak_live = r->live > r->res->peak_live ? r->live : r->res->peak_live;
    return DT_OK;
}

/* The micro-batch chunk's slot is done with (its output may still be on
 * the wire: slot_send says until when). */
static void release_slot(pp_runner *r, int c, int e) {
    r->slot_used[c * r->slots + r->slot_of[e]] = false;
    r->slot_of[e] = -1;
    r->live--;
}

static dt_status do_backward(pp_runner *r, const dt_pp_action *a) {
    int c = a->chunk, e = idx(r, a->mb, c), st = dt_pp_stage_of(r->s, r->rank, c);
    bool last = st == r->S - 1, split = r->s->split_w;
    if (!last)
        DT_CHECK(flow_wait(r, FLOW_GRAD, r->in_seq[e]));
    bool final = !split && (int)a->mb == r->M - 1;
    if (final)
        begin_final(r);
    double t0 = dt_now();
    DT_CHECK(dt_gpt_backward_stage(
        r->m, c, r->slot_of[e], last ? NULL : r->bufs[r->in_buf[e]].p, r->b->grad_scale,
        r->nb[c]++ == 0 ? DT_GRAD_OVERWRITE : DT_GRAD_ACCUMULATE, final ? ready : NULL, r));
    if (st > 0) { /* the input gradient leaves the model's scratch for its send */
        DT_CHECK(buf_get(r, &r->out_buf[e]));
        memcpy(r->bufs[r->out_buf[e]].p, dt_gpt_stage_input_grad(r->m), r->ns * sizeof(float));
    }
    r->res->busy_ms += (dt_now() - t0) * 1e3;
    if (!last) {
        buf_put(r, r->in_buf[e]);
        r->in_buf[e] = -1;
    }
    if (!split)
        release_slot(r, c, e);
    return DT_OK;
}

static dt_status do_weights(pp_runner *r, const dt_pp_action *a) {
    int c = a->chunk, e = idx(r, a->mb, c);
    bool final = (int)a->mb == r->M - 1;
    if (final)
        begin_final(r);
    double t0 = dt_now();
    DT_CHECK(dt_gpt_weight_stage(r->m, c, r->slot_of[e],
                                 r->nw[c]++ == 0 ? DT_GRAD_OVERWRITE : DT_GRAD_ACCUMULATE,
                                 final ? ready : NULL, r));
    r->res->busy_ms += (dt_now() - t0) * 1e3;
    release_slot(r, c, e);
    return DT_OK;
}

/* ------------------------------------------------------------------------ */
/* The step                                                                 */
/* ------------------------------------------------------------------------ */

/* Rows of one transfer for a batch (B, T): the residual stream this rank
 * holds (1/tp of the tokens under sequence parallelism). */
static size_t rows_for(const pp_runner *r, int B, int T) {
    const dt_gpt_part *p = dt_gpt_get_part(r->m);
    size_t n = (size_t)B * T;
    return p->sequence_parallel ? n / (size_t)p->tp_size : n;
}

/* After a failure: make the neighbours fail too, and collect every batch
 * still in flight (their buffers are ours). */
static void abort_step(pp_runner *r) {
    for (int f = 0; f < FLOWS; f++)
        dt_group_abort(r->fl[f].g);
    if (r->embed_group)
        dt_group_abort(r->embed_group);
    for (int f = 0; f < FLOWS; f++) {
        flow *w = &r->fl[f];
        while (w->done < w->posted) {
            dt_work *k = w->works[w->done];
            w->works[w->done++] = NULL;
            (void)dt_work_wait(k);
        }
    }
}

static dt_status run_actions(pp_runner *r, size_t *at) {
    for (size_t i = 0; i < r->count;) {
        *at = i;
        const dt_pp_action *a = &r->s->actions[r->first + i];
        if (a->op >= DT_PP_SEND_ACT) {
            size_t j = i;
            while (j < r->count && r->s->actions[r->first + j].op >= DT_PP_SEND_ACT)
                j++;
            DT_CHECK(post_run(r, i, j));
            i = j;
            continue;
        }
        if (a->op == DT_PP_F)
            DT_CHECK(do_forward(r, a));
        else if (a->op == DT_PP_B)
            DT_CHECK(do_backward(r, a));
        else
            DT_CHECK(do_weights(r, a));
        i++;
    }
    *at = r->count;
    DT_CHECK(flow_wait(r, FLOW_ACT, r->fl[FLOW_ACT].posted));
    DT_CHECK(flow_wait(r, FLOW_GRAD, r->fl[FLOW_GRAD].posted));
    return DT_OK;
}

static dt_status pp_step(dt_runner *base, const dt_run_batch *b, dt_grad_sync *sync,
                         dt_run_result *out) {
    pp_runner *r = (pp_runner *)base;
    if (b->micro != r->M)
        return dt_error_set(DT_ERR_INVALID,
                            "pipeline: a step of %d micro-batches, the schedule "
                            "has %d",
                            b->micro, r->M);
    size_t ns = rows_for(r, b->B, b->T) * (size_t)dt_gpt_get_config(r->m)->dim;
    if (ns > r->buf_floats)
        return dt_error_set(DT_ERR_INVALID, "pipeline: batch %d x %d is larger than planned", b->B,
                            b->T);
    double t0 = dt_now();
    r->b = b;
    r->sync = sync;
    r->began = false;
    r->ns = ns;
    r->live = 0;
    r->res = out;
    out->has_loss = dt_pp_stage_of(r->s, r->rank, r->V - 1) == r->S - 1;
    for (int f = 0; f < FLOWS; f++)
        r->fl[f].posted = r->fl[f].done = 0;
    size_t n = (size_t)r->M * r->V;
    for (size_t i = 0; i < n; i++)
        r->slot_of[i] = r->in_buf[i] = r->out_buf[i] = -1, r->in_seq[i] = 0;
    memset(r->slot_send, 0, (size_t)r->V * r->slots * sizeof *r->slot_send);
    memset(r->slot_used, 0, (size_t)r->V * r->slots * sizeof *r->slot_used);
    memset(r->nb, 0, (size_t)r->V * sizeof *r->nb);
    memset(r->nw, 0, (size_t)r->V * sizeof *r->nw);
    for (int i = 0; i < r->nbufs; i++)
        buf_put(r, i);
    size_t at = 0;
    dt_status st = run_actions(r, &at);
    double span = (dt_now() - t0) * 1e3;
    /* The tied embedding: the first and last stage sum their parts, then
     * it is final. */
    if (st == DT_OK && r->embed_group)
        st = dt_group_allreduce(r->embed_group, dt_gpt_grads(r->m), dt_gpt_grads(r->m),
                                r->wte_floats, DT_F32, DT_SUM);
    if (st == DT_OK && r->wte_floats)
        dt_grad_sync_ready(sync, 0);
    if (st != DT_OK) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", dt_last_error());
        abort_step(r);
        char what[96] = "the tied embedding's gradient sum";
        if (at < r->count) {
            const dt_pp_action *a = &r->s->actions[r->first + at];
            snprintf(what, sizeof what, "%s of micro-batch %u chunk %u", dt_pp_op_names[a->op],
                     a->mb, a->chunk);
        }
        return dt_error_set(
            st, "pipeline stage %d (world rank %d), at %s: %s",
            dt_pp_stage_of(r->s, r->rank, at < r->count ? r->s->actions[r->first + at].chunk : 0),
            dt_group_world_rank(r->fl[FLOW_ACT].g, r->rank), what, msg);
    }
    /* The bubble over the pipeline's ranks. */
    double mine[2] = {out->busy_ms, span}, *all = dt_calloc((size_t)r->P * 2, sizeof *all);
    if (!all)
        return DT_ERR_NOMEM;
    st = dt_group_allgather(r->grad_group, mine, all, 2, DT_F64);
    if (st == DT_OK) {
        double busy = 0, makespan = 0;
        for (int i = 0; i < r->P; i++) {
            busy += all[2 * i];
            makespan = all[2 * i + 1] > makespan ? all[2 * i + 1] : makespan;
        }
        out->bubble = makespan > 0 ? 1.0 - busy / (r->P * makespan) : 0;
    }
    dt_free(all);
    return st;
}

/* Forward only: each of this rank's chunks in turn receives, runs, sends. */
static dt_status pp_eval(dt_runner *base, const int32_t *inputs, const int32_t *targets, int B,
                         int T, double *loss) {
    pp_runner *r = (pp_runner *)base;
    dt_group *g = r->fl[FLOW_ACT].g;
    size_t ns = rows_for(r, B, T) * (size_t)dt_gpt_get_config(r->m)->dim;
    if (ns > r->buf_floats)
        return dt_error_set(DT_ERR_INVALID, "pipeline: batch %d x %d is larger than planned", B, T);
    int in;
    DT_CHECK(buf_get(r, &in));
    double l = 0;
    dt_status st = DT_OK;
    for (int c = 0; st == DT_OK && c < r->V; c++) {
        int stg = dt_pp_stage_of(r->s, r->rank, c), pr, pc;
        if (stg > 0) {
            dt_pp_place(r->s, stg - 1, &pr, &pc);
            dt_p2p o = {false, r->bufs[in].p, ns, DT_F32, pr, tag_of(r, 0, stg - 1)};
            st = dt_group_sendrecv_batch(g, &o, 1);
        }
        float lc = 0;
        if (st == DT_OK)
            st = dt_gpt_forward_stage(r->m, c, 0, stg == 0 ? inputs : NULL,
                                      stg == 0 ? NULL : r->bufs[in].p,
                                      stg == r->S - 1 ? targets : NULL, B, T, &lc);
        l += lc;
        if (st == DT_OK && stg < r->S - 1) {
            dt_pp_place(r->s, stg + 1, &pr, &pc);
            dt_p2p o = {
                true, (void *)dt_gpt_stage_output(r->m, c, 0), ns, DT_F32, pr, tag_of(r, 0, stg)};
            st = dt_group_sendrecv_batch(g, &o, 1);
        }
    }
    buf_put(r, in);
    /* The loss, from the stage with the head to every stage. */
    if (st == DT_OK)
        st = dt_group_allreduce(g, &l, &l, 1, DT_F64, DT_SUM);
    *loss = l;
    return st;
}

static const char *pp_name(const dt_runner *base) {
    const pp_runner *r = (const pp_runner *)base;
    return dt_pp_kind_names[r->s->kind];
}

static void pp_destroy(dt_runner *base) {
    pp_runner *r = (pp_runner *)base;
    for (int i = 0; i < r->nbufs; i++)
        dt_free(r->bufs[i].p);
    dt_free(r->bufs);
    for (int f = 0; f < FLOWS; f++)
        dt_free(r->fl[f].works);
    dt_group_destroy(r->embed_group);
    dt_group_destroy(r->grad_group);
    dt_free(r->slot_of);
    dt_free(r->in_buf);
    dt_free(r->in_seq);
    dt_free(r->out_buf);
    dt_free(r->slot_send);
    dt_free(r->slot_used);
    dt_free(r->nb);
    dt_free(r->nw);
    dt_free(r->ops);
    dt_free(r);
}

static const dt__runner_ops pp_ops = {
    .step = pp_step, .eval = pp_eval, .name = pp_name, .destroy = pp_destroy};

/* A hash of everything that decides what the ranks exchange. */
static uint64_t schedule_hash(const dt_pp_schedule *s) {
    int64_t head[5] = {s->kind, s->stages, s->chunks, s->micro, s->split_w};
    uint64_t h = dt_hash64(head, sizeof head, 0);
    h = dt_hash64(s->start, (size_t)(s->stages + 1) * sizeof *s->start, h);
    return dt_hash64(s->actions, s->start[s->stages] * sizeof *s->actions, h);
}

/* Every rank of the pipeline was given the same schedule. */
static dt_status agree_on_schedule(pp_runner *r, dt_group *g) {
    uint64_t mine = schedule_hash(r->s), *all = dt_calloc((size_t)r->P, sizeof *all);
    if (!all)
        return DT_ERR_NOMEM;
    dt_status st = dt_group_allgather(g, &mine, all, sizeof mine, DT_U8);
    for (int i = 0; st == DT_OK && i < r->P; i++)
        if (all[i] != all[0])
            st = dt_error_set(DT_ERR_MISMATCH,
                              "pipeline: rank %d (world rank %d) was given another schedule "
                              "than rank 0 (%s, %d stages, %d chunks, %d micro-batches here)",
                              i, dt_group_world_rank(g, i), dt_pp_kind_names[r->s->kind],
                              r->s->stages, r->s->chunks, r->s->micro);
    dt_free(all);
    return st;
}

/* The model part is the one this rank's stage needs. */
static dt_status check_model(const pp_runner *r) {
    dt_gpt_part want = {0};
    const dt_gpt_part *have = dt_gpt_get_part(r->m);
    DT_CHECK(dt_pp_model_part(r->s, dt_gpt_get_config(r->m)->layers, r->rank, &want));
    bool same = have->chunks == want.chunks;
    for (int c = 0; same && c < want.chunks; c++)
        same = have->layers[c].begin == want.layers[c].begin &&
               have->layers[c].end == want.layers[c].end;
    if (!same)
        return dt_error_set(DT_ERR_INVALID,
                            "pipeline: rank %d's model part is not its stage's (dt_pp_model_part)",
                            r->rank);
    return DT_OK;
}

dt_status dt_pp_runner_create(dt_runner **out, const dt_pp_runner_config *c) {
    *out = NULL;
    const dt_pp_schedule *s = c->sched;
    if (!c->model || !s || !c->group)
        return dt_error_set(DT_ERR_INVALID, "pipeline runner: model, schedule and group needed");
    int P = dt_group_size(c->group);
    if (P != s->stages || P < 2)
        return dt_error_set(DT_ERR_INVALID,
                            "pipeline runner: the group has %d rank(s), the schedule %d stages "
                            "(at least 2)",
                            P, s->stages);
    pp_runner *r = dt_calloc(1, sizeof *r);
    if (!r)
        return DT_ERR_NOMEM;
    r->base.ops = &pp_ops;
    r->m = c->model;
    r->s = s;
    r->P = P;
    r->V = s->chunks;
    r->M = s->micro;
    r->S = P * s->chunks;
    r->rank = dt_group_rank(c->group);
    r->first = s->start[r->rank];
    r->count = s->start[r->rank + 1] - r->first;
    dt_pp_report rep;
    dt_status st = dt_pp_check(s, NULL, &rep);
    if (st != DT_OK) {
        dt_free(r);
        return st;
    }
    r->slots = dt_pp_slots(s, &rep, r->rank);
    dt_pp_report_free(&rep);
    size_t n = (size_t)r->M * r->V, ks = (size_t)r->V * r->slots;
    r->slot_of = dt_calloc(n, sizeof *r->slot_of);
    r->in_buf = dt_calloc(n, sizeof *r->in_buf);
    r->in_seq = dt_calloc(n, sizeof *r->in_seq);
    r->out_buf = dt_calloc(n, sizeof *r->out_buf);
    r->slot_send = dt_calloc(ks, sizeof *r->slot_send);
    r->slot_used = dt_calloc(ks, sizeof *r->slot_used);
    r->nb = dt_calloc((size_t)r->V, sizeof *r->nb);
    r->nw = dt_calloc((size_t)r->V, sizeof *r->nw);
    r->ops = dt_calloc(2 * r->count + 1, sizeof *r->ops);
    for (int f = 0; f < FLOWS; f++)
        r->fl[f].works = dt_calloc(r->count + 1, sizeof *r->fl[f].works);
    r->fl[FLOW_ACT].g = c->group;
    if (!r->slot_of || !r->in_buf || !r->in_seq || !r->out_buf || !r->slot_send || !r->slot_used ||
        !r->nb || !r->nw || !r->ops || !r->fl[0].works || !r->fl[1].works) {
        pp_destroy(&r->base);
        return DT_ERR_NOMEM;
    }
    const dt_gpt_config *cfg = dt_gpt_get_config(r->m);
    dt_memory_report mr;
    dt_gpt_memory(r->m, &mr);
    r->buf_floats = rows_for(r, mr.batch, mr.seq) * (size_t)cfg->dim;
    st = check_model(r);
    const dt_gpt_options *mo = dt_gpt_get_options(r->m);
    if (st == DT_OK && (mo->slots > 1 ? mo->slots : 1) < r->slots)
        st = dt_error_set(DT_ERR_INVALID,
                          "pipeline: rank %d's model has %d slot(s) per chunk, the schedule keeps "
                          "%d micro-batches alive (dt_pp_slots)",
                          r->rank, mo->slots, r->slots);
    if (st == DT_OK && mo->split_weight_grads != s->split_w)
        st = dt_error_set(DT_ERR_INVALID,
                          "pipeline: the %s schedule %s W from B, the model was created %s "
                          "split_weight_grads",
                          dt_pp_kind_names[s->kind], s->split_w ? "splits" : "does not split",
                          mo->split_weight_grads ? "with" : "without");
    /* Collective from here on: every rank reaches the splits. */
    bool holds_wte = r->rank == 0 || dt_pp_stage_of(s, r->rank, r->V - 1) == r->S - 1;
    dt_status st2 = dt_group_split(c->group, 0, r->rank, &r->grad_group);
    if (st2 == DT_OK)
        st2 = dt_group_split(c->group, holds_wte ? 0 : DT_UNDEFINED, r->rank, &r->embed_group);
    if (st == DT_OK)
        st = st2;
    r->fl[FLOW_GRAD].g = r->grad_group;
    if (st2 == DT_OK) {
        dt_status st3 = agree_on_schedule(r, r->grad_group);
        if (st == DT_OK)
            st = st3;
    }
    if (st == DT_OK && holds_wte) {
        dt_param_info wte;
        dt_gpt_tensor_info(r->m, 0, &wte);
        DT_ASSERT(strcmp(wte.name, "wte") == 0 && wte.offset == 0);
        r->wte_floats = wte.rows * wte.cols;
    }
    if (st != DT_OK) {
        pp_destroy(&r->base);
        return st;
    }
    *out = &r->base;
    return DT_OK;
}
