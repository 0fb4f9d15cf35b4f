/*
 * memory.c — what one rank of a training job holds, from its configuration
 * alone, by the code that lays it out: the mesh shape, the rank's model
 * part (pipeline stage, slots, tensor-parallel shard) and its optimizer's
 * owned ranges are computed here for both the trainer (setup.c builds
 * exactly these) and `dtrain plan memory` (which only plans them), so that
 * the plan and the run cannot disagree.
 */
#include "train_internal.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

dt_status dt__train_mesh_shape(const dt_train_config *c, int world, dt_mesh_shape *shape) {
    *shape = dt_mesh_shape_default();
    if (c->mesh_order)
        DT_CHECK(dt_mesh_order_parse("--mesh-order", c->mesh_order, shape->order));
    int split = c->tp * c->pp * c->cp;
    if (!c->dp && world % split != 0)
        return bad("the job's %d rank(s) are not a multiple of --tp %d x --pp %d x --cp %d = %d",
                   world, c->tp, c->pp, c->cp, split);
    shape->degree[DT_AXIS_TP] = c->tp;
    shape->degree[DT_AXIS_PP] = c->pp;
    shape->degree[DT_AXIS_CP] = c->cp;
    shape->degree[DT_AXIS_DP] = c->dp ? c->dp : world / split;
    return dt_mesh_shape_validate(shape, world);
}

dt_status dt__train_batch(const dt_train_config *c, int dp, int world, int *B) {
    /* The batch is shared by the data-parallel ranks (all of them when the
     * model is not split). */
    const char *which = dp == world ? "" : " data-parallel";
    if (c->global_batch) {
        if (c->global_batch % dp != 0)
            return bad("--global-batch %d is not divisible by the %d%s ranks", c->global_batch, dp,
                       which);
        if (c->batch && c->batch * dp != c->global_batch)
            return bad("--batch %d x %d%s ranks != --global-batch %d", c->batch, dp, which,
                       c->global_batch);
        *B = c->global_batch / dp;
    } else {
        *B = c->batch;
    }
    return DT_OK;
}

dt_status dt__train_schedule(const dt_train_config *c, int K, dt_pp_schedule **out,
                             dt_pp_report *rep) {
    dt_pp_kind kind = DT_PP_1F1B;
    int chunks = 1;
    if (c->pp_schedule)
        DT_CHECK(dt_pp_kind_parse("--pp-schedule", c->pp_schedule, &kind, &chunks));
    dt_status st = dt_pp_schedule_create(out, kind, c->pp, chunks, K);
    if (st != DT_OK) {
        dt_error_prefix("--pp %d --pp-schedule %s with %d micro-batch(es) (--micro-batches)", c->pp,
                        c->pp_schedule ? c->pp_schedule : "1f1b", K);
        return st;
    }
    st = dt_pp_check(*out, NULL, rep);
    if (st != DT_OK) {
        dt_pp_schedule_destroy(*out);
        *out = NULL;
    }
    return st;
}

dt_status dt__train_model_options(const dt_train_config *c, const dt_gpt_config *mc,
                                  const dt_mesh_shape *shape, int rank, const dt_pp_schedule *pipe,
                                  const dt_pp_report *rep, const dt_tp_regions *regions,
                                  const dt_cp_regions *cp_regions, dt_gpt_options *o) {
    int coord[DT_AXIS_COUNT];
    dt_mesh_coords_of(shape, rank, coord);
    *o = dt_gpt_options_default();
    o->precision = c->precision;
    o->recompute_every = c->recompute_every;
    if (c->tp > 1)
        o->part = (dt_gpt_part){.tp_rank = coord[DT_AXIS_TP],
                                .tp_size = c->tp,
                                .sequence_parallel = c->sp,
                                .regions = regions};
    if (c->cp > 1) {
        o->part.cp_rank = coord[DT_AXIS_CP];
        o->part.cp_size = c->cp;
        o->part.cp_mode = dt__train_cp_mode(c, mc);
        o->part.cp_regions = cp_regions;
    }
    if (pipe) {
        o->slots = dt_pp_slots(pipe, rep, coord[DT_AXIS_PP]);
        o->split_weight_grads = pipe->split_w;
        DT_CHECK(dt_pp_model_part(pipe, mc->layers, coord[DT_AXIS_PP], &o->part));
    }
    return DT_OK;
}

dt_cp_mode dt__train_cp_mode(const dt_train_config *c, const dt_gpt_config *mc) {
    dt_cp_mode m;
    if (c->cp_mode && dt_cp_mode_parse("--cp-mode", c->cp_mode, &m) == DT_OK)
        return m;
    bool heads = (mc->heads / c->tp) % c->cp == 0, seq = mc->max_seq % c->cp == 0;
    return heads && seq ? DT_CP_ULYSSES : DT_CP_RING;
}

size_t dt__train_bucket_bytes(const dt_train_config *c, size_t n) {
    if (c->bucket_bytes)
        return c->bucket_bytes;
    /* A quarter of the gradient bytes, so that three of four buckets start
     * while backward still runs, kept within 1 MiB (smaller buckets cost
     * more in latency than overlap gains) and 25 MiB (PyTorch DDP's
     * default, enough for any model). */
    size_t quarter = n * sizeof(float) / 4;
    return quarter < ((size_t)1 << 20)    ? (size_t)1 << 20
           : quarter > ((size_t)25 << 20) ? (size_t)25 << 20
                                          : quarter;
}

dt_status dt__train_owned(const dt_train_config *c, size_t n, int dp, int replica, dt_range **out,
                          size_t *nr) {
    size_t bucket = dt__train_bucket_bytes(c, n);
    size_t cap = c->zero ? dt_ddp_shard_count(n, bucket, dp) : 1;
    *out = dt_calloc(cap + 1, sizeof **out);
    if (!*out)
        return DT_ERR_NOMEM;
    if (c->zero) {
        *nr = dt_ddp_shard_ranges(n, bucket, dp, replica, *out);
    } else if (c->dp_mode == DT_DP_MODE_PS && dp > 1) {
        *nr = 0; /* the parameter servers step the model with optimizers of their own */
    } else {
        (*out)[0] = (dt_range){0, n};
        *nr = 1;
    }
    return DT_OK;
}

dt_status dt__train_offload_dir(const dt_train_config *c, const char **dir) {
    const char *spec = c->offload, *disk = "optimizer=disk:";
    if (dir)
        *dir = NULL;
    if (!spec || !strcmp(spec, "optimizer=cpu"))
        return DT_OK; /* no device: the state is in host memory already */
    if (!strncmp(spec, "params=", 7))
        return dt_error_set(DT_ERR_UNSUPPORTED,
                            "--offload %s: parameter offload is not built yet (the optimizer "
                            "state's is: optimizer=disk:DIR)",
                            spec);
    if (strncmp(spec, disk, strlen(disk)) || !spec[strlen(disk)])
        return bad("--offload %s: expected optimizer=disk:DIR or optimizer=cpu", spec);
    const char *d = spec + strlen(disk);
    struct stat sb;
    if (stat(d, &sb) != 0)
        return bad("--offload %s: directory %s: %s", spec, d, strerror(errno));
    if (!S_ISDIR(sb.st_mode))
        return bad("--offload %s: %s is not a directory", spec, d);
    if (access(d, W_OK | X_OK) != 0)
        return bad("--offload %s: directory %s is not writable: %s", spec, d, strerror(errno));
    if (dir)
        *dir = d;
    return DT_OK;
}

dt_optim_config dt__train_optim_config(const dt_train_config *c) {
    dt_optim_config oc = dt_optim_config_default();
    /* check_config refused a bad --offload: here it is valid or absent. */
    if (dt__train_offload_dir(c, &oc.offload_dir) != DT_OK)
        oc.offload_dir = NULL;
    oc.kind = c->optimizer;
    /* L-BFGS has no weight decay (it minimises the loss as given). */
    oc.weight_decay = c->optimizer == DT_OPTIM_LBFGS ? 0.0f : (float)c->weight_decay;
    oc.adamw.beta1 = (float)c->beta1;
    oc.adamw.beta2 = (float)c->beta2;
    oc.adamw.eps = (float)c->eps;
    oc.momentum = (float)c->momentum;
    oc.nesterov = c->nesterov;
    oc.trust_coeff = (float)c->trust_coeff;
    oc.trust_eps = (float)c->trust_eps;
    oc.adafactor = c->adafactor;
    oc.block = (size_t)c->quant_block;
    oc.inner = c->lookahead_inner;
    oc.lookahead_k = c->lookahead_k;
    oc.lookahead_alpha = (float)c->lookahead_alpha;
    oc.lbfgs = c->lbfgs;
    if (oc.lbfgs.max_eval == 0)
        oc.lbfgs.max_eval = oc.lbfgs.max_iter * 5 / 4;
    oc.centralize = c->grad_centralization;
    oc.kfac = c->kfac;
    /* --compress-freeze-v: beta2 = 1 from the first compressed step on;
     * 1-bit Adam/LAMB: their compression stage starts there too. */
    bool onebit = c->optimizer == DT_OPTIM_ONEBIT_ADAM || c->optimizer == DT_OPTIM_ONEBIT_LAMB;
    oc.freeze_v_from = c->compress_freeze_v || onebit ? c->compress_start : -1;
    return oc;
}

/* The sizes, in floats, of what a rank's model part holds: the tied
 * embedding (its 1/tp of the vocabulary, with the first or the last
 * stage), the position embedding, ln_f, and one block. */
typedef struct part_sizes {
    size_t wte, wpe, lnf, block;
} part_sizes;

static part_sizes sizes_of(const dt_gpt_config *mc, const dt_gpt_options *o, size_t n) {
    int tp = o->part.tp_size > 1 ? o->part.tp_size : 1, nl = 0;
    bool first = false, last = false;
    for (int k = 0; k < o->part.chunks; k++) {
        nl += o->part.layers[k].end - o->part.layers[k].begin;
        first |= o->part.layers[k].begin == 0;
        last |= o->part.layers[k].end == mc->layers;
    }
    if (o->part.chunks == 0) {
        nl = mc->layers;
        first = last = true;
    }
    size_t C = (size_t)mc->dim, Vl = ((size_t)mc->vocab + tp - 1) / tp;
    part_sizes z = {.wte = first || last ? Vl * C : 0,
                    .wpe = first ? (size_t)mc->max_seq * C : 0,
                    .lnf = last ? 2 * C : 0};
    z.block = nl ? (n - z.wte - z.wpe - z.lnf) / (size_t)nl : 0;
    return z;
}

/* Bytes resident: this replica's `owned` floats and `held` of the rest. */
static size_t resident(size_t n, size_t owned, size_t held) {
    size_t rest = n - owned;
    return (owned + (held < rest ? held : rest)) * sizeof(float);
}

/* ZeRO 2: the gradient pages resident at the peak of a backward. Backward
 * writes a block's gradients, then reports them final; a bucket's pages
 * outside this replica's piece go back to the system once its
 * reduce-scatter returns. At the worst moment a rank holds its own pieces,
 * the block being written, the buckets still on the wire (the one being
 * reduced and the next), and the tied embedding's gradient, which the head
 * writes first and the embedding's backward finishes last. */
static size_t grads_resident(const dt_train_config *c, const dt_gpt_config *mc,
                             const dt_gpt_options *o, size_t n, size_t owned, int dp) {
    part_sizes z = sizes_of(mc, o, n);
    size_t held =
        z.wte - z.wte / (size_t)dp + z.block + 2 * (dt__train_bucket_bytes(c, n) / sizeof(float));
    return resident(n, owned, held);
}

/* ZeRO 3: the parameter pages resident at the peak: this replica's pieces
 * and what a pass holds whole at once (gpt_pass.c's hooks): three blocks in
 * the forward (the one running, the next, fetched for its ln_1 fused into
 * this one's residual add, and the one after, prefetched), or the tied
 * embedding with the position embedding or a block. A bucket is gathered
 * whole, so the window reaches into the buckets at either end: one bucket
 * on average. */
static size_t params_resident(const dt_train_config *c, const dt_gpt_config *mc,
                              const dt_gpt_options *o, size_t n, size_t owned, int dp) {
    part_sizes z = sizes_of(mc, o, n);
    size_t blocks = 3 * z.block, embeds = z.wte + (z.wpe > z.block ? z.wpe : z.block);
    size_t whole = blocks > embeds ? blocks : embeds;
    return resident(n, owned,
                    whole - whole / (size_t)dp + dt__train_bucket_bytes(c, n) / sizeof(float));
}

/* ZeRO 3 with bf16/fp16: the 16-bit copies resident at the peak. A unit's
 * copy is cast as it is fetched and its pages given back as it is released
 * (gpt_pass.c), so only fetched units have one. The peak comes as the
 * backward starts (every activation still held): the head's tied
 * embedding and ln_f, then one block at a time. (The forward holds two
 * blocks' copies, but few activations yet.) */
static size_t weights16_resident(const dt_gpt_config *mc, const dt_gpt_options *o, size_t n) {
    part_sizes z = sizes_of(mc, o, n);
    size_t head = z.wte + z.lnf, whole = z.block > head ? z.block : head;
    return (whole < n ? whole : n) * sizeof(uint16_t);
}

dt_status dt_train_plan_memory(const dt_train_config *c, const dt_gpt_config *mc, int world,
                               int rank, dt_rank_memory *out) {
    memset(out, 0, sizeof *out);
    DT_CHECK(dt_gpt_config_validate(mc));
    if (rank < 0 || rank >= world)
        return bad("rank %d of a job of %d", rank, world);
    dt_mesh_shape shape;
    DT_CHECK(dt__train_mesh_shape(c, world, &shape));
    int coord[DT_AXIS_COUNT];
    dt_mesh_coords_of(&shape, rank, coord);
    int dp = shape.degree[DT_AXIS_DP], B = 0;
    DT_CHECK(dt__train_batch(c, dp, world, &B));
    dt_pp_schedule *pipe = NULL;
    dt_pp_report rep = {0};
    if (c->pp > 1)
        DT_CHECK(dt__train_schedule(c, c->accum, &pipe, &rep));
    dt_gpt_options o;
    dt_status st = dt__train_model_options(c, mc, &shape, rank, pipe, &rep, NULL, NULL, &o);
    if (st == DT_OK) {
        /* A plan has no tensor- or context-parallel group: check the part
         * as the trainer's, which has them. */
        static const dt_tp_regions planned = {0};
        static const dt_cp_regions cp_planned = {0};
        dt_gpt_part q = o.part;
        q.regions = q.tp_size > 1 ? &planned : NULL;
        q.cp_regions = q.cp_size > 1 ? &cp_planned : NULL;
        st = dt_gpt_part_validate(mc, &q, mc->max_seq);
    }
    if (pipe) {
        dt_pp_report_free(&rep);
        dt_pp_schedule_destroy(pipe);
    }
    DT_CHECK(st);
    dt_gpt_memory_plan_with(mc, B, mc->max_seq, &o, &out->model);
    size_t n = out->model.params / sizeof(float), nr;
    dt_range *owned;
    /* ZeRO shards over the gradient group, dp x cp. */
    const int sync = dt_mesh_replica_size(&shape);
    DT_CHECK(dt__train_owned(c, n, sync, dt_mesh_replica_rank(&shape, coord), &owned, &nr));
    size_t count = 0;
    for (size_t k = 0; k < nr; k++)
        count += owned[k].end - owned[k].begin;
    dt_free(owned);
    dt_optim_config oc = dt__train_optim_config(c);
    out->world = world;
    out->rank = rank;
    out->params =
        c->zero >= 3 && sync > 1 ? params_resident(c, mc, &o, n, count, sync) : out->model.params;
    out->grads =
        c->zero >= 2 && sync > 1 ? grads_resident(c, mc, &o, n, count, sync) : out->model.grads;
    out->weights16 = c->zero >= 3 && sync > 1 && out->model.weights16
                         ? weights16_resident(mc, &o, n)
                         : out->model.weights16;
    out->optimizer = dt_optimizer_plan_resident(&oc, count);
    out->optimizer_file = oc.offload_dir ? dt_optimizer_plan_bytes(&oc, count) : 0;
    out->activations = out->model.activations;
    out->total = out->params + out->grads + out->weights16 + out->optimizer + out->activations;
    /* dt__train_whole_model: the unsharded model's parameters (its
     * gradients stay untouched, so not resident), rank 0's own part's worth
     * of received parameters, and with a sample the activations of its
     * one-sequence forward. */
    bool split = c->tp > 1 || c->cp > 1 || c->pp > 1;
    if (rank == 0 && split && (c->run_dir || c->save_default || c->sample_tokens > 0)) {
        dt_memory_report whole;
        dt_gpt_options wo = dt_gpt_options_default();
        dt_gpt_memory_plan_with(mc, 1, mc->max_seq, &wo, &whole);
        out->assembly =
            whole.params + out->model.params + (c->sample_tokens > 0 ? whole.activations : 0);
    }
    return DT_OK;
}

void dt_rank_memory_print(const dt_rank_memory *m, FILE *f) {
    char a[32], b[32], c[32], d[32], e[32], t[32], o[32];
    fprintf(f, "params %s, grads %s, optimizer %s%s%s%s%s%s, activations %s: %s",
            dt_format_bytes((double)m->params, a, sizeof a),
            dt_format_bytes((double)m->grads, b, sizeof b),
            dt_format_bytes((double)m->optimizer, c, sizeof c), m->optimizer_file ? " (of " : "",
            m->optimizer_file ? dt_format_bytes((double)m->optimizer_file, o, sizeof o) : "",
            m->optimizer_file ? " on disk)" : "", m->weights16 ? ", 16-bit weights " : "",
            m->weights16 ? dt_format_bytes((double)m->weights16, d, sizeof d) : "",
            dt_format_bytes((double)m->activations, e, sizeof e),
            dt_format_bytes((double)m->total, t, sizeof t));
    if (m->assembly)
        fprintf(f, " (+%s at the end: the whole model assembled)",
                dt_format_bytes((double)m->assembly, a, sizeof a));
}
