/*
 * tp.c — the tensor-parallel communication points of a model shard
 * (nn.h's dt_tp_regions) over the tp group: Megatron's region operators,
 * each forward beside its backward.
 *
 *   f  copy_to          forward identity (no entry)    backward allreduce
 *   g  reduce_from      forward allreduce              backward identity (no entry)
 *   SP gather_from      forward all-gather             backward reduce-scatter
 *   SP scatter_to       forward reduce-scatter         backward all-gather
 *
 * Reduce-scatters run in place (the sum of block `rank` lands there);
 * all-gathers accept a `local` that already sits at block `rank` of the
 * output (then they run in place too).
 */
#include "dtrain/parallel.h"

struct dt_tp {
    dt_group *g;         /* borrowed */
    int rank, size;      /* in g */
    dt_tp_regions table; /* ctx = this */
    uint64_t bytes;      /* sent since dt_tp_take_bytes (ring volume) */
};

/* Ring volume of a collective moving `bytes` of output: (n-1)/n of it per
 * all-gather or reduce-scatter, twice that per allreduce. */
static void count(dt_tp *t, size_t bytes, int phases) {
    t->bytes += (uint64_t)((double)phases * (t->size - 1) / t->size * (double)bytes);
}

static dt_status allreduce(dt_tp *t, float *x, size_t n) {
    count(t, n * sizeof(float), 2);
    return dt_group_allreduce(t->g, x, x, n, DT_F32, DT_SUM);
}

static dt_status allgather(dt_tp *t, const void *local, void *full, size_t n, size_t esize) {
    /* A 16-bit gather moves bits: any 2-byte dtype does. */
    dt_dtype dt = esize == 2 ? DT_BF16 : DT_F32;
    DT_ASSERT(esize == 2 || esize == 4);
    const char *mine = (const char *)full + (size_t)t->rank * n * esize;
    count(t, (size_t)t->size * n * esize, 1);
    return dt_group_allgather(t->g, local == mine ? full : local, full, n, dt);
}

static dt_status reduce_scatter(dt_tp *t, float *full, size_t n) {
    count(t, (size_t)t->size * n * sizeof(float), 1);
    return dt_group_reduce_scatter(t->g, full, full, n, DT_F32, DT_SUM);
}

/* f */
static dt_status copy_to_backward(void *ctx, float *dx, size_t n) { return allreduce(ctx, dx, n); }

/* g */
static dt_status reduce_from_forward(void *ctx, float *y, size_t n) { return allreduce(ctx, y, n); }

/* SP: gather from the sequence-parallel region */
static dt_status gather_from_sp_forward(void *ctx, const void *local, void *full, size_t n,
                                        size_t esize) {
    return allgather(ctx, local, full, n, esize);
}
static dt_status gather_from_sp_backward(void *ctx, float *dfull, size_t n) {
    return reduce_scatter(ctx, dfull, n);
}

/* SP: scatter (reduce-scatter) to the sequence-parallel region */
static dt_status scatter_to_sp_forward(void *ctx, float *full, size_t n) {
    return reduce_scatter(ctx, full, n);
}
static dt_status scatter_to_sp_backward(void *ctx, const void *dlocal, void *dfull, size_t n,
                                        size_t esize) {
    return allgather(ctx, dlocal, dfull, n, esize);
}

/* Vocabulary-parallel cross-entropy statistics and sampled logits. */
static dt_status gather_stats(void *ctx, const float *mine, float *all, size_t n) {
    return allgather(ctx, mine, all, n, sizeof(float));
}

/* SP: replicated parameters' partial gradients. */
static dt_status sum_partial_grads(void *ctx, float *g, size_t n) { return allreduce(ctx, g, n); }

dt_status dt_tp_create(dt_tp **out, dt_group *group) {
    *out = NULL;
    if (!group)
        return dt_error_set(DT_ERR_INVALID, "tensor parallelism needs a group");
    dt_tp *t = dt_calloc(1, sizeof *t);
    if (!t)
        return DT_ERR_NOMEM;
    t->g = group;
    t->rank = dt_group_rank(group);
    t->size = dt_group_size(group);
    t->table = (dt_tp_regions){.ctx = t,
                               .copy_to_backward = copy_to_backward,
                               .reduce_from_forward = reduce_from_forward,
                               .gather_from_sp_forward = gather_from_sp_forward,
                               .gather_from_sp_backward = gather_from_sp_backward,
                               .scatter_to_sp_forward = scatter_to_sp_forward,
                               .scatter_to_sp_backward = scatter_to_sp_backward,
                               .gather_stats = gather_stats,
                               .sum_partial_grads = sum_partial_grads};
    *out = t;
    return DT_OK;
}

void dt_tp_destroy(dt_tp *t) { dt_free(t); }

const dt_tp_regions *dt_tp_regions_of(const dt_tp *t) { return &t->table; }

uint64_t dt_tp_take_bytes(dt_tp *t) {
    uint64_t b = t->bytes;
    t->bytes = 0;
    return b;
}

/* The planner's view (parallel.h, "Planning costs"): per block, f and g
 * (file comment) each allreduce the (B,T,C) fp32 residual stream once in
 * the forward and once in the backward: two each way (the attention's and
 * the MLP's); recomputation repeats the forward's. With sequence
 * parallelism each allreduce becomes an all-gather and a reduce-scatter of
 * the same stream: the same ring volume. The vocabulary-parallel loss
 * gathers (B,T) statistics: negligible, left out. All block the rank. */
void dt_tp_plan_cost(const dt_cost_query *q, dt_strategy_cost *out) {
    const int tp = q->degree[DT_AXIS_TP];
    if (tp <= 1)
        return;
    double stream = (double)q->B * q->T / q->degree[DT_AXIS_CP] * q->model->dim * sizeof(float);
    double fwd = 2.0 * q->layers, bwd = 2.0 * q->layers + (q->recompute_every ? fwd : 0);
    for (int pass = 0; pass < 2; pass++) {
        double calls = pass ? bwd : fwd;
        if (q->sp) {
            dt_strategy_cost_add(out, (dt_comm_cost){.coll = DT_COLL_ALLGATHER,
                                                     .axis = DT_AXIS_TP,
                                                     .bytes = stream,
                                                     .calls = calls,
                                                     .per_micro = true,
                                                     .backward = pass == 1,
                                                     .what = "tp sequence all-gather"});
            dt_strategy_cost_add(out, (dt_comm_cost){.coll = DT_COLL_REDUCE_SCATTER,
                                                     .axis = DT_AXIS_TP,
                                                     .bytes = stream,
                                                     .calls = calls,
                                                     .per_micro = true,
                                                     .backward = pass == 1,
                                                     .what = "tp sequence reduce-scatter"});
        } else {
            dt_strategy_cost_add(out, (dt_comm_cost){.coll = DT_COLL_ALLREDUCE,
                                                     .axis = DT_AXIS_TP,
                                                     .bytes = stream,
                                                     .calls = calls,
                                                     .per_micro = true,
                                                     .backward = pass == 1,
                                                     .what = pass ? "tp allreduce (backward)"
                                                                  : "tp allreduce (forward)"});
        }
    }
}
