/*
 * cp.c — the context-parallel communication points of a model part
 * (nn.h's dt_cp_regions) over the cp group: Ulysses' all-to-all, the
 * ring's shifts to the next rank, the loss sum.
 */
#include "dtrain/parallel.h"

struct dt_cp {
    dt_group *g;         /* borrowed */
    int rank, size;      /* in g */
    dt_cp_regions table; /* ctx = this */
    dt_work *shift[2];   /* the transfer in flight on each channel */
    uint64_t bytes;      /* sent since dt_cp_take_bytes */
};

static dt_status all_to_all(void *ctx, void *buf, size_t bytes) {
    dt_cp *c = ctx;
    c->bytes += (uint64_t)(c->size - 1) * bytes;
    return dt_group_alltoall(c->g, buf, buf, bytes, DT_U8);
}

static dt_status shift_start(void *ctx, int channel, const void *send, void *recv, size_t bytes) {
    dt_cp *c = ctx;
    DT_ASSERT(channel == 0 || channel == 1);
    if (c->shift[channel])
        return dt_error_set(DT_ERR_INVALID, "context parallelism: channel %d has a shift in flight",
                            channel);
    int next = (c->rank + 1) % c->size, prev = (c->rank + c->size - 1) % c->size;
    dt_p2p ops[2] = {
        {.send = true, .buf = (void *)send, .count = bytes, .dtype = DT_U8, .peer = next},
        {.send = false, .buf = recv, .count = bytes, .dtype = DT_U8, .peer = prev},
    };
    c->bytes += bytes;
    return dt_group_isendrecv_batch(c->g, ops, 2, &c->shift[channel]);
}

static dt_status shift_wait(void *ctx, int channel) {
    dt_cp *c = ctx;
    DT_ASSERT(channel == 0 || channel == 1);
    dt_work *w = c->shift[channel];
    c->shift[channel] = NULL;
    if (!w)
        return dt_error_set(DT_ERR_INVALID, "context parallelism: no shift in flight on channel %d",
                            channel);
    return dt_work_wait(w);
}

static dt_status sum(void *ctx, float *x, size_t n) {
    dt_cp *c = ctx;
    return dt_group_allreduce(c->g, x, x, n, DT_F32, DT_SUM);
}

dt_status dt_cp_create(dt_cp **out, dt_group *group) {
    *out = NULL;
    if (!group)
        return dt_error_set(DT_ERR_INVALID, "context parallelism needs a group");
    dt_cp *c = dt_calloc(1, sizeof *c);
    if (!c)
        return DT_ERR_NOMEM;
    c->g = group;
    c->rank = dt_group_rank(group);
    c->size = dt_group_size(group);
    c->table = (dt_cp_regions){.ctx = c,
                               .all_to_all = all_to_all,
                               .shift_start = shift_start,
                               .shift_wait = shift_wait,
                               .sum = sum};
    *out = c;
    return DT_OK;
}

void dt_cp_destroy(dt_cp *c) {
    if (!c)
        return;
    for (int k = 0; k < 2; k++)
        if (c->shift[k])
            (void)dt_work_wait(c->shift[k]);
    dt_free(c);
}

const dt_cp_regions *dt_cp_regions_of(const dt_cp *c) { return &c->table; }

uint64_t dt_cp_take_bytes(dt_cp *c) {
    uint64_t b = c->bytes;
    c->bytes = 0;
    return b;
}

/* The planner's view (parallel.h, "Planning costs"), as gpt_cp.c runs it.
 * Ulysses: per block, the forward sends q|k|v to the heads' owners and
 * brings the output back (all-to-alls of 3 and 1 local streams in the
 * activation type), the backward the reverse; recomputation repeats the
 * forward's; they block. Ring: cp - 1 shifts of the local k|v (fp32) per
 * block forward, and in the backward cp - 1 of k|v and cp - 1 of dk|dv,
 * each overlapped with a block of attention. */
void dt_cp_plan_cost(const dt_cost_query *q, dt_strategy_cost *out) {
    const int cp = q->degree[DT_AXIS_CP];
    if (cp <= 1)
        return;
    const double act = q->precision == DT_PRECISION_FP32 ? 4 : 2;
    double local = (double)q->B * q->T / cp * q->model->dim / q->degree[DT_AXIS_TP];
    double L = q->layers, rec = q->recompute_every ? 1 : 0;
    if (q->cp_mode == DT_CP_ULYSSES) {
        dt_strategy_cost_add(out, (dt_comm_cost){.coll = DT_COLL_ALLTOALL,
                                                 .axis = DT_AXIS_CP,
                                                 .bytes = 4 * local * act,
                                                 .calls = L,
                                                 .per_micro = true,
                                                 .what = "cp Ulysses all-to-all (forward)"});
        dt_strategy_cost_add(out, (dt_comm_cost){.coll = DT_COLL_ALLTOALL,
                                                 .axis = DT_AXIS_CP,
                                                 .bytes = 4 * local * act,
                                                 .calls = L * (1 + rec),
                                                 .per_micro = true,
                                                 .backward = true,
                                                 .what = "cp Ulysses all-to-all (backward)"});
        return;
    }
    double kv = 2 * local * sizeof(float);
    dt_strategy_cost_add(out, (dt_comm_cost){.coll = DT_COLL_SEND,
                                             .axis = DT_AXIS_CP,
                                             .bytes = kv,
                                             .calls = L * (cp - 1),
                                             .per_micro = true,
                                             .overlapped = true,
                                             .what = "cp ring k|v shifts (forward)"});
    dt_strategy_cost_add(out, (dt_comm_cost){.coll = DT_COLL_SEND,
                                             .axis = DT_AXIS_CP,
                                             .bytes = kv,
                                             .calls = L * (cp - 1) * (2 + rec),
                                             .per_micro = true,
                                             .backward = true,
                                             .overlapped = true,
                                             .what = "cp ring k|v and dk|dv shifts (backward)"});
}
