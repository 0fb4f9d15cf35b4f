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

/* One directory of --offload: it exists, is one, and is writable. */
static dt_status offload_dir(const char *spec, const char *d, size_t len, char *out, size_t cap) {
    if (len == 0)
        return bad("--offload %s: a directory is missing", spec);
    if (len >= cap)
        return bad("--offload %s: the directory's name is longer than %zu bytes", spec, cap - 1);
    memcpy(out, d, len);
    out[len] = 0;
    struct stat sb;
    if (stat(out, &sb) != 0)
        return bad("--offload %s: directory %s: %s", spec, out, strerror(errno));
    if (!S_ISDIR(sb.st_mode))
        return bad("--offload %s: %s is not a directory", spec, out);
    if (access(out, W_OK | X_OK) != 0)
        return bad("--offload %s: directory %s is not writable: %s", spec, out, strerror(errno));
    return DT_OK;
}

dt_status dt__train_offload(const dt_train_config *c, dt__offload_spec *out) {
    memset(out, 0, sizeof *out);
    const char *spec = c->offload;
    if (!spec)
        return DT_OK;
    static const char *const od = "optimizer=disk:", *const pd = "params=disk:",
                             *const px = "params=direct:";
    for (const char *p = spec; *p;) {
        size_t len = strcspn(p, ",");
        if (len == strlen("optimizer=cpu") && !strncmp(p, "optimizer=cpu", len)) {
            /* no device: the state is in host memory already */
        } else if (!strncmp(p, od, strlen(od))) {
            DT_CHECK(offload_dir(spec, p + strlen(od), len - strlen(od), out->optim_dir,
                                 sizeof out->optim_dir));
        } else if (!strncmp(p, pd, strlen(pd)) || !strncmp(p, px, strlen(px))) {
            const char *d = !strncmp(p, pd, strlen(pd)) ? pd : px;
            out->params_direct = d == px;
            DT_CHECK(offload_dir(spec, p + strlen(d), len - strlen(d), out->params_dir,
                                 sizeof out->params_dir));
        } else {
            return bad("--offload %s: expected a comma-separated list of optimizer=disk:DIR, "
                       "optimizer=cpu, params=disk:DIR and params=direct:DIR",
                       spec);
        }
        p += len + (p[len] == ',');
    }
    return DT_OK;
}

dt_optim_config dt__train_optim_config(const dt_train_config *c, const dt__offload_spec *off) {
    dt_optim_config oc = dt_optim_config_default();
    oc.offload_dir = off && off->optim_dir[0] ? off->optim_dir : NULL;
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

/* ZeRO 3: what a pass holds whole at once, in floats (gpt_pass.c's
 * hooks): the forward's three blocks (the one running, the next, fetched
 * for its ln_1 fused into this one's residual add, and the one after,
 * prefetched); the lookup's position embedding with two buckets of the
 * tied embedding's pieces (the one read, the next prefetched) and, in
 * fp32, the first block (prefetched); or the head's two buckets of pieces
 * with ln_f and a block (the backward's first, prefetched). A bucket is
 * gathered whole, so the blocks' window reaches into the buckets at either
 * end: one more bucket. In 16-bit compute (fetch16) the blocks and the
 * head gather 16-bit copies; the lookup alone reads fp32. */
typedef struct window {
    size_t blocks, lookup, head; /* floats */
} window;

static window window_of(const dt_train_config *c, const dt_gpt_config *mc, const dt_gpt_options *o,
                        size_t n) {
    part_sizes z = sizes_of(mc, o, n);
    size_t bucket = dt__train_bucket_bytes(c, n) / sizeof(float);
    bool w16 = c->precision != DT_PRECISION_FP32;
    return (window){.blocks = 3 * z.block + bucket,
                    .lookup = z.wpe ? z.wpe + 2 * bucket + (w16 ? 0 : z.block) : 0,
                    .head = z.wte ? 2 * bucket + z.lnf + z.block : 0};
}

/* The one-row tensors (biases, LayerNorm parameters) 16-bit compute reads
 * in fp32, which ZeRO 3 then keeps whole on every replica: ln_1, ln_2 and
 * the biases of c_attn, attn.c_proj, c_fc and mlp.c_proj per block, and
 * ln_f. */
static size_t exact_floats(const dt_gpt_config *mc, const dt_gpt_options *o, size_t n) {
    part_sizes z = sizes_of(mc, o, n);
    size_t C = (size_t)mc->dim, tp = o->part.tp_size > 1 ? (size_t)o->part.tp_size : 1;
    size_t blocks = z.block ? (n - z.wte - z.wpe - z.lnf) / z.block : 0;
    return blocks * (6 * C + 7 * C / tp) + z.lnf;
}

static size_t max3(size_t a, size_t b, size_t c) {
    size_t m = a > b ? a : b;
    return m > c ? m : c;
}

/* ZeRO 3: the parameter pages resident at the peak: this replica's pieces
 * (with --offload params, only those in flight: dt_zero_plan_offload) and
 * what a pass holds whole in fp32 (the window; 16-bit: the lookup's, and
 * the exact tensors). */
static size_t params_resident(const dt_train_config *c, const dt_gpt_config *mc,
                              const dt_gpt_options *o, size_t n, size_t owned, int dp,
                              size_t offload) {
    window w = window_of(c, mc, o, n);
    bool w16 = c->precision != DT_PRECISION_FP32;
    size_t whole = w16 ? w.lookup : max3(w.blocks, w.lookup, w.head);
    size_t exact = w16 ? exact_floats(mc, o, n) : 0;
    if (offload) {
        /* The window whole (its pieces read for it), the exact tensors and
         * the pieces in flight. Where the gradients and activations peak,
         * in the backward, the window is two blocks (the one running, the
         * next prefetched) and a bucket: the pieces no longer add a
         * constant, so the plan counts that moment's. */
        part_sizes z = sizes_of(mc, o, n);
        size_t bwd = 2 * z.block + dt__train_bucket_bytes(c, n) / sizeof(float);
        size_t held = (w16 ? whole : (bwd < whole ? bwd : whole)) + exact - exact / (size_t)dp;
        return (held < n ? held : n) * sizeof(float) + offload;
    }
    return resident(n, owned, whole - whole / (size_t)dp + exact - exact / (size_t)dp);
}

/* ZeRO 3 with bf16/fp16: the 16-bit copies resident at the peak, gathered
 * (fetch16) for the blocks' window or the head's pieces with a block. */
static size_t weights16_resident(const dt_train_config *c, const dt_gpt_config *mc,
                                 const dt_gpt_options *o, size_t n) {
    window w = window_of(c, mc, o, n);
    size_t whole = w.blocks > w.head ? w.blocks : w.head;
    return (whole < n ? whole : n) * sizeof(uint16_t);
}

/* The communication buffers of one rank: each group it belongs to maps
 * the shared-memory segments of its transport (all ranks on one host:
 * dt_comm_plan_shm_bytes), the gradient codec's buffers and state
 * (dt_ddp_plan_bytes), and ZeRO 2's shard sum of earlier micro-batches. */
static dt_status comm_bytes(const dt_train_config *c, const dt_mesh_shape *shape, int world,
                            size_t n, size_t owned, size_t *out, size_t *shm) {
    int sizes[DT_AXIS_COUNT + 5], ng = 0;
    bool bulk[DT_AXIS_COUNT + 5];
    int sync = dt_mesh_replica_size(shape);
    bool cp = shape->degree[DT_AXIS_CP] > 1;
    sizes[ng] = world, bulk[ng++] = false; /* the job's: losses, agreement */
    for (int a = 0; a < DT_AXIS_COUNT; a++)
        sizes[ng] = shape->degree[a], bulk[ng++] = !(a == DT_AXIS_DP && cp);
    if (cp)
        sizes[ng] = sync, bulk[ng++] = true; /* the dp x cp gradient group */
    if (c->pp > 1) {                         /* the pipeline's gradient and embedding groups */
        sizes[ng] = c->pp, bulk[ng++] = true;
        sizes[ng] = 2, bulk[ng++] = true;
    }
    bool coded = c->compress.kind != DT_CODEC_NONE || c->grad_dtype != DT_F32;
    int grads = ng - 1 - (c->pp > 1 ? 2 : 0); /* the gradient group's index */
    if (!cp)
        grads = 1 + DT_AXIS_DP;
    if (c->zero >= 3 && coded && sync > 1)
        sizes[ng] = sync, bulk[ng++] = true; /* ZeRO 3's gathers beside the codec's worker */
    /* The gradient group's window carries the parameters' broadcast at the
     * start (stages 0-2; stage 3 shares no parameter) and a codec's
     * encodings, which go through the peers' windows too. */
    bulk[grads] = c->zero < 3 || coded;
    *out = 0;
    for (int i = 0; i < ng; i++) {
        size_t b;
        DT_CHECK(dt_comm_plan_shm_bytes(sizes[i], bulk[i], coded && i == grads, &b));
        *out += b;
    }
    *shm = *out;
    dt_ddp_options wire = dt_ddp_options_default();
    wire.bucket_bytes = dt__train_bucket_bytes(c, n);
    wire.grad_dtype = c->grad_dtype;
    wire.codec = c->compress;
    wire.ef = c->compress_ef;
    wire.dense_below = (size_t)c->compress_dense_below;
    wire.shard = c->zero > 0;
    size_t codec = 0;
    if (c->dp_mode == DT_DP_MODE_DDP)
        DT_CHECK(dt_ddp_plan_bytes(n, &wire, sync, &codec));
    *out += codec;
    if (c->zero >= 2 && c->accum > 1 && sync > 1)
        *out += owned * sizeof(float);
    return DT_OK;
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
    dt__offload_spec off;
    DT_CHECK(dt__train_offload(c, &off));
    dt_optim_config oc = dt__train_optim_config(c, &off);
    out->world = world;
    out->rank = rank;
    size_t offload = 0;
    if (c->zero >= 3 && off.params_dir[0])
        dt_zero_plan_offload(n, dt__train_bucket_bytes(c, n), sync, off.params_direct, &offload,
                             &out->params_file);
    out->params = c->zero >= 3 && (sync > 1 || offload)
                      ? params_resident(c, mc, &o, n, count, sync, offload)
                      : out->model.params;
    out->grads =
        c->zero >= 2 && sync > 1 ? grads_resident(c, mc, &o, n, count, sync) : out->model.grads;
    out->weights16 = c->zero >= 3 && sync > 1 && out->model.weights16
                         ? weights16_resident(c, mc, &o, n)
                         : out->model.weights16;
    out->optimizer = dt_optimizer_plan_resident(&oc, count);
    out->optimizer_file = oc.offload_dir ? dt_optimizer_plan_bytes(&oc, count) : 0;
    out->activations = out->model.activations;
    DT_CHECK(comm_bytes(c, &shape, world, n, count, &out->comm, &out->comm_shm));
    /* The kernels' scratch per thread (threads as setup's sizes() picks them
     * on one host); the BLAS's own buffers are outside it. */
    int threads = c->threads > 0 ? c->threads : dt_cpu_count() / world;
    out->workspace = dt_tensor_plan_workspace(threads < 1 ? 1 : threads, mc->max_seq / c->cp,
                                              mc->dim / mc->heads);
    out->total = out->params + out->grads + out->weights16 + out->optimizer + out->activations +
                 out->comm + out->workspace;
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
    /* ZeRO 3 gathers every parameter of its part for that (and for rank
     * 0's sample) on every rank. */
    if (c->zero >= 3 && out->params < out->model.params &&
        (c->run_dir || c->save_default || c->sample_tokens > 0))
        out->assembly += out->model.params - out->params;
    return DT_OK;
}

void dt_rank_memory_print(const dt_rank_memory *m, FILE *f) {
    char a[32], b[32], c[32], d[32], e[32], t[32], o[32], pf[32], cm[32], ws[32];
    fprintf(f,
            "params %s%s%s%s, grads %s, optimizer %s%s%s%s%s%s, activations %s, "
            "communication %s, workspace %s: %s",
            dt_format_bytes((double)m->params, a, sizeof a), m->params_file ? " (of " : "",
            m->params_file ? dt_format_bytes((double)m->params_file, pf, sizeof pf) : "",
            m->params_file ? " on disk)" : "", dt_format_bytes((double)m->grads, b, sizeof b),
            dt_format_bytes((double)m->optimizer, c, sizeof c), m->optimizer_file ? " (of " : "",
            m->optimizer_file ? dt_format_bytes((double)m->optimizer_file, o, sizeof o) : "",
            m->optimizer_file ? " on disk)" : "", m->weights16 ? ", 16-bit weights " : "",
            m->weights16 ? dt_format_bytes((double)m->weights16, d, sizeof d) : "",
            dt_format_bytes((double)m->activations, e, sizeof e),
            dt_format_bytes((double)m->comm, cm, sizeof cm),
            dt_format_bytes((double)m->workspace, ws, sizeof ws),
            dt_format_bytes((double)m->total, t, sizeof t));
    if (m->assembly)
        fprintf(f, " (+%s at the end: the whole model assembled)",
                dt_format_bytes((double)m->assembly, a, sizeof a));
}
