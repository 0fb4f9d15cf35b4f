/*
 * setup.c — everything a run builds before its first step, in order: the
 * job and its mesh, threads, data and loaders, the model, the optimizer,
 * the gradient synchronisation, the schedule and the loss scaler, and the
 * resolved config. dt__train_free undoes it in reverse.
 *
 * This is the one place of the train layer that chooses strategies: it
 * builds them and hands the loop the interfaces (dt_grad_sync, the
 * optimizer object, the mesh's groups).
 */
#include "dtrain/launch.h"
#include "dtrain/tensor.h"
#include "train_internal.h"

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* Test hooks, acting on the first attempt of a job only (DT_RESTART_COUNT
 * unset or 0): DT_FAULT_KILL="RANK:STEP" makes that rank SIGKILL itself
 * after finishing STEP ("RANK:STEP:mid": during step STEP, after reading
 * its batches, while the others compute and exchange);
 * DT_FAULT_PERTURB="RANK:STEP" makes it change one
 * parameter, which --check-every must then catch; DT_FAULT_OVERFLOW
 * "RANK:STEP" gives that rank one inf gradient after averaging at STEP.
 * Read once: the step at which this rank acts, or -1. */
static int64_t fault_step(const trainer *t, const char *var) {
    const char *f = getenv(var);
    const char *rc = getenv("DT_RESTART_COUNT");
    int r;
    long long s;
    if (!f || (rc && *rc && strcmp(rc, "0") != 0) || sscanf(f, "%d:%lld", &r, &s) != 2 ||
        r != t->rank || t->newcomer) /* a newcomer has no rank of the job's start */
        return -1;
    return s;
}

/* DT_FAULT_SLOW="RANK:FACTOR" (straggler emulation, every attempt): that
 * rank computes FACTOR times slower, the loop sleeping (FACTOR - 1) times
 * its previous step's forward and backward time before each step's
 * passes. Read once; 1 on the other ranks. */
static dt_status slow_factor(trainer *t) {
    const char *f = getenv("DT_FAULT_SLOW");
    int r;
    double x;
    char tail;
    t->slow_factor = 1;
    if (!f || !*f)
        return DT_OK;
    if (sscanf(f, "%d:%lf%c", &r, &x, &tail) != 2 || r < 0 || !(x >= 1 && x <= 1000))
        return bad("DT_FAULT_SLOW=%s: expected RANK:FACTOR with a rank >= 0 and a factor in "
                   "[1, 1000]",
                   f);
    if (r == t->rank)
        t->slow_factor = x;
    return DT_OK;
}

/* The mesh over t->world from --tp, --pp, --cp and --dp (the ranks left
 * over) in --mesh-order, and this rank's place in it. */
dt_status dt__train_layout(trainer *t) {
    const dt_train_config *c = t->c;
    dt_mesh_shape shape;
    DT_CHECK(dt__train_mesh_shape(c, t->size, &shape));
    DT_CHECK(dt_mesh_create(&t->mesh, t->world, &shape));
    t->replica = dt_mesh_coord(t->mesh, DT_AXIS_DP);
    t->dp = dt_mesh_degree(t->mesh, DT_AXIS_DP);
    int coord[DT_AXIS_COUNT];
    dt_mesh_coords_of(&shape, t->rank, coord);
    t->sync_rank = dt_mesh_replica_rank(&shape, coord);
    t->sync_size = dt_mesh_replica_size(&shape);
    return DT_OK;
}

/* The job (or a single process) and its layout. */
static dt_status join(trainer *t) {
    const dt_train_config *c = t->c;
    if (c->elastic_max > 0) {
        DT_CHECK(dt__train_elastic_join(t));
    } else if (dt_launch_in_job()) {
        DT_CHECK(dt_group_init_from_env(&t->world));
        t->rank = dt_group_rank(t->world);
        t->size = dt_group_size(t->world);
        dt_log_set_rank(t->rank);
    }
    DT_CHECK(dt__train_layout(t));
    if (c->cp > 1)
        DT_CHECK(dt_cp_create(&t->cp, dt_mesh_group(t->mesh, DT_AXIS_CP)));
    if (c->tp > 1)
        DT_CHECK(dt_tp_create(&t->tp, dt_mesh_group(t->mesh, DT_AXIS_TP)));
    return DT_OK;
}

/* save_default, rank 0: the newest runs/<model>-* directory holding a
 * checkpoint (resume), else a new one named after the model and the time. */
static dt_status name_run_dir(const trainer *t, char *out, size_t len) {
    const dt_train_config *c = t->c;
    const char *model = c->model ? c->model : "model";
    char prefix[256];
    snprintf(prefix, sizeof prefix, "%s-", model);
    out[0] = '\0';
    if (c->resume && !c->ckpt_dir) {
        DIR *d = opendir("runs");
        struct dirent *e;
        while (d && (e = readdir(d)) != NULL) {
            char ck[4096];
            struct stat sb;
            if (strncmp(e->d_name, prefix, strlen(prefix)) != 0 ||
                (out[0] && strcmp(e->d_name, out + 5) <= 0))
                continue;
            snprintf(ck, sizeof ck, "runs/%s/ckpt", e->d_name);
            if (stat(ck, &sb) == 0 && S_ISDIR(sb.st_mode))
                snprintf(out, len, "runs/%s", e->d_name);
        }
        if (d)
            closedir(d);
        if (out[0])
            return DT_OK;
    }
    char stamp[32];
    time_t now = time(NULL);
    struct tm tm;
    strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", localtime_r(&now, &tm));
    DT_CHECK(dt_mkdir_p("runs"));
    /* mkdir, not mkdir -p: two runs started in the same second get two
     * directories. */
    for (int k = 1; k < 1000; k++) {
        if (k == 1)
            snprintf(out, len, "runs/%s%s", prefix, stamp);
        else
            snprintf(out, len, "runs/%s%s-%d", prefix, stamp, k);
        if (mkdir(out, 0777) == 0)
            return DT_OK;
        if (errno != EEXIST)
            return dt_error_set_errno(DT_ERR_IO, "cannot create the run directory %s", out);
    }
    return dt_error_set(DT_ERR_IO, "runs/%s%s-*: too many runs started in one second", prefix,
                        stamp);
}

/* The directories of save_default, the same on every rank (rank 0 names
 * the run directory and tells the others). */
static dt_status resolve_dirs(trainer *t) {
    dt_train_config *c = &t->cfg;
    if (!c->save_default || t->newcomer) /* a newcomer gets the job's with the state */
        return DT_OK;
    if (!c->run_dir) {
        struct {
            int64_t status;
            char text[4096];
        } msg = {DT_OK, ""};
        if (t->rank == 0) {
            msg.status = name_run_dir(t, t->run_dir, sizeof t->run_dir);
            snprintf(msg.text, sizeof msg.text, "%s",
                     msg.status == DT_OK ? t->run_dir : dt_last_error());
        }
        if (t->world)
            DT_CHECK(dt_group_broadcast(t->world, &msg, sizeof msg, DT_U8, 0));
        if (msg.status != DT_OK)
            return dt_error_set((dt_status)msg.status, "%s", msg.text);
        snprintf(t->run_dir, sizeof t->run_dir, "%s", msg.text);
        c->run_dir = t->run_dir;
    }
    if (!c->ckpt_dir) {
        int n = snprintf(t->ckpt_dir, sizeof t->ckpt_dir, "%s/ckpt", c->run_dir);
        if (n < 0 || (size_t)n >= sizeof t->ckpt_dir)
            return bad("--run-dir %s: the name is too long", c->run_dir);
        c->ckpt_dir = t->ckpt_dir;
    }
    return DT_OK;
}

/* Threads per rank (0: this host's CPUs shared by its ranks) and the
 * per-replica batch. */
static dt_status sizes(trainer *t) {
    const dt_train_config *c = t->c;
    int threads = c->threads;
    /* OMP_NUM_THREADS (torchrun sets it to 1 per rank by default) is the
     * next best answer after --threads / DT_THREADS. */
    const char *omp = getenv("OMP_NUM_THREADS");
    if (threads <= 0 && omp && *omp) {
        int64_t v;
        DT_CHECK(dt_config_parse_int("OMP_NUM_THREADS", omp, 1, 1024, &v));
        threads = (int)v;
    }
    if (threads <= 0) {
        int local = t->world ? dt_group_local_size(t->world) : 1;
        threads = dt_cpu_count() / (local > 0 ? local : 1);
        threads = threads < 1 ? 1 : threads;
    }
    t->threads = threads;
    dt_tensor_set_threads(threads);
    DT_CHECK(dt__train_batch(c, t->dp, t->size, &t->B));
    t->K = c->accum;
    /* An elastic job keeps the global batch at every size: the model and
     * the batch buffers hold the smallest world's per-rank share (a
     * newcomer, alone until it is let in, uses that too). */
    if (c->elastic_max > 0) {
        t->B_max = c->global_batch / c->elastic_min;
        if (t->newcomer)
            t->B = t->B_max;
    }
    return DT_OK;
}

/* Open --data (and --val-data, with the training data's vocabulary). */
static dt_status open_data(trainer *t) {
    const dt_train_config *c = t->c;
    const dt_tokenizer *given = NULL;
    if (c->tokenizer == DT_TOKENIZER_BPE) {
        dt_status st = dt_bpe_open(&t->bpe, c->tokenizer_files ? c->tokenizer_files : "gpt2");
        if (st != DT_OK) {
            dt_error_prefix("--tokenizer");
            return st;
        }
        dt_tokenizer_init_bpe(&t->bpe_tok, t->bpe);
        given = &t->bpe_tok;
    }
    dt_status st = dt_data_open(&t->data, c->data, (dt_tokenizer_kind)c->tokenizer, given);
    if (st != DT_OK) {
        dt_error_prefix("--data");
        return st;
    }
    t->tok = dt_token_file_tokenizer(t->data);
    /* A bpe .tok read without --tokenizer: GPT-2's, when it is that one
     * (only the final sample needs it). */
    if (!given && t->tok->kind == DT_TOKENIZER_BPE && dt_bpe_open(&t->bpe, "gpt2") == DT_OK &&
        dt_bpe_hash(t->bpe) == t->tok->bpe_hash) {
        dt_tokenizer_init_bpe(&t->bpe_tok, t->bpe);
        t->tok = &t->bpe_tok;
    }
    if (c->val_data) {
        st = dt_data_open(&t->val_data, c->val_data, (dt_tokenizer_kind)c->tokenizer, t->tok);
        if (st != DT_OK) {
            dt_error_prefix("--val-data");
            return st;
        }
    }
    return DT_OK;
}

/* The model configuration: the preset, the flags that override it, and
 * the data's vocabulary. */
static dt_status model_config(trainer *t) {
    const dt_train_config *c = t->c;
    dt_gpt_config mc;
    if (c->init_from) {
        DT_CHECK(dt__train_init_config(t, &mc));
        DT_CHECK(dt_gpt_config_validate(&mc));
        t->mc = mc;
        t->T = mc.max_seq;
        return DT_OK;
    }
    DT_CHECK(dt_gpt_preset(c->model, &mc));
    if (c->layers)
        mc.layers = c->layers;
    if (c->dim)
        mc.dim = c->dim;
    if (c->heads)
        mc.heads = c->heads;
    if (c->seq)
        mc.max_seq = c->seq;
    /* A preset is one model everywhere: the GPT-2 presets keep GPT-2's
     * vocabulary (50257) whatever the data, as in `dtrain bench train`; the
     * character-level presets take the data's. */
    int V = t->tok->vocab_size;
    bool gpt2 = strncmp(c->model, "gpt2", 4) == 0;
    if (c->vocab && c->vocab < V)
        return bad("--vocab %d is smaller than the data's vocabulary (%d tokens)", c->vocab, V);
    if (!c->vocab && gpt2 && V > mc.vocab)
        return bad("--model %s has GPT-2's vocabulary of %d tokens, the data has %d: give "
                   "--vocab %d",
                   c->model, mc.vocab, V, V);
    mc.vocab = c->vocab ? c->vocab : gpt2 ? mc.vocab : V;
    DT_CHECK(dt_gpt_config_validate(&mc));
    t->mc = mc;
    t->T = mc.max_seq;
    return DT_OK;
}

dt_status dt_train_model_config(const dt_train_config *c, dt_gpt_config *out) {
    trainer *t = calloc(1, sizeof *t);
    if (!t)
        return dt_error_set(DT_ERR_NOMEM, "trainer");
    t->c = c;
    dt_status st = open_data(t);
    if (st == DT_OK)
        st = model_config(t);
    if (st == DT_OK)
        *out = t->mc;
    dt__train_free(t);
    free(t);
    return st;
}

/* Loaders over the training range and the validation range (a file or the
 * tail split off the training data); each data-parallel replica reads its
 * share. The batch buffers are made once (an elastic job rebuilds the
 * loaders at each membership). */
dt_status dt__train_make_loaders(trainer *t) {
    const dt_train_config *c = t->c;
    size_t count = dt_token_file_count(t->data), train_end = count;
    bool have_val = c->val_data != NULL || c->val_split > 0;
    if (!c->val_data && c->val_split > 0)
        DT_CHECK(dt_data_split(count, c->val_split, &train_end));
    dt_status st =
        dt_loader_create(&t->train, t->data, 0, train_end, t->B, t->T, c->seed, t->replica, t->dp);
    if (st != DT_OK) {
        dt_error_prefix("training data %s (%zu tokens for %d replica(s) x batch %d x seq %d)",
                        c->data, train_end, t->dp, t->B, t->T);
        return st;
    }
    if (have_val) {
        const dt_token_file *vf = t->val_data ? t->val_data : t->data;
        size_t vb = t->val_data ? 0 : train_end, ve = dt_token_file_count(vf);
        st = dt_loader_create(&t->val, vf, vb, ve, t->B, t->T, c->seed, t->replica, t->dp);
        if (st != DT_OK) {
            dt_error_prefix("validation data (%s, %zu tokens; use a larger --val-split, "
                            "--val-data, or --val-split 0)",
                            t->val_data ? c->val_data : "split of --data", ve - vb);
            return st;
        }
    }
    if (t->inputs)
        return DT_OK;
    int B = t->B_max > t->B ? t->B_max : t->B;
    size_t tokens = (size_t)t->K * B * t->T;
    t->inputs = dt_alloc(tokens * sizeof(int32_t));
    t->targets = dt_alloc(tokens * sizeof(int32_t));
    if (!t->inputs || !t->targets)
        return dt_error_set(DT_ERR_NOMEM, "batch buffers of %d x %d x %d tokens", t->K, B, t->T);
    return DT_OK;
}

/* After a model did not fit: what would, from the memory plan of the same
 * part with recomputation, 16-bit activations, both, or a smaller batch
 * with more accumulation (the same global batch), added to the message. */
static dt_status explain_oom(const trainer *t, const dt_gpt_options *mo) {
    char msg[1024], a[32], b[32], c3[32], d[32], ram[32];
    snprintf(msg, sizeof msg, "%s", dt_last_error());
    dt_gpt_options o = *mo;
    dt_memory_report r;
    o.recompute_every = 1;
    dt_gpt_memory_plan_with(&t->mc, t->B, t->T, &o, &r);
    size_t rec = r.activations;
    o = *mo;
    o.precision = DT_PRECISION_BF16;
    dt_gpt_memory_plan_with(&t->mc, t->B, t->T, &o, &r);
    size_t half = r.activations;
    o.recompute_every = 1;
    dt_gpt_memory_plan_with(&t->mc, t->B, t->T, &o, &r);
    size_t both = r.activations;
    double phys = (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE);
    /* The largest batch (halving) whose plan takes at most half the RAM. */
    int B = t->B;
    dt_gpt_memory_plan_with(&t->mc, B, t->T, mo, &r);
    while (B > 1 && (double)r.activations > phys / 2) {
        B /= 2;
        dt_gpt_memory_plan_with(&t->mc, B, t->T, mo, &r);
    }
    char smaller[160] = "";
    if (B < t->B)
        snprintf(smaller, sizeof smaller, "; --batch %d --accum %d (the same tokens per step): %s",
                 B, t->K * ((t->B + B - 1) / B),
                 dt_format_bytes((double)r.activations, d, sizeof d));
    return dt_error_set(DT_ERR_NOMEM,
                        "%s; this machine has %s. Activations would take: --recompute blocks %s, "
                        "--precision bf16 %s, both %s%s",
                        msg, dt_format_bytes(phys, ram, sizeof ram),
                        dt_format_bytes((double)rec, a, sizeof a),
                        dt_format_bytes((double)half, b, sizeof b),
                        dt_format_bytes((double)both, c3, sizeof c3), smaller);
}

/* This rank's part of the model: its pipeline stage's layers (with the
 * activation slots its schedule keeps alive, the schedule checked before
 * anything runs) and its tensor-parallel shard (memory.c decides both). */
static dt_status make_model(trainer *t) {
    const dt_train_config *c = t->c;
    dt_pp_report rep = {0};
    if (c->pp > 1)
        DT_CHECK(dt__train_schedule(c, t->K, &t->pipe, &rep));
    dt_gpt_options mo;
    dt_status st = dt__train_model_options(c, &t->mc, dt_mesh_get_shape(t->mesh), t->rank, t->pipe,
                                           &rep, t->tp ? dt_tp_regions_of(t->tp) : NULL,
                                           t->cp ? dt_cp_regions_of(t->cp) : NULL, &mo);
    if (t->pipe)
        dt_pp_report_free(&rep);
    DT_CHECK(st);
    st = dt_gpt_create_with(&t->m, &t->mc, t->B_max > t->B ? t->B_max : t->B, t->T, &mo);
    if (st == DT_ERR_NOMEM)
        return explain_oom(t, &mo);
    DT_CHECK(st);
    t->n = dt_gpt_num_params(t->m);
    if (c->zero >= 3 && t->sync_size > 1 && !c->init_from) {
        /* ZeRO 3: each replica initialises its own pieces (the same values
         * on every replica's: one stream per tensor), never the whole. */
        dt_range *owned;
        size_t nr;
        DT_CHECK(dt__train_owned(c, t->n, t->sync_size, t->sync_rank, &owned, &nr));
        for (size_t k = 0; k < nr; k++)
            dt_gpt_init_params_range(t->m, c->seed, owned[k].begin, owned[k].end);
        dt_free(owned);
    } else {
        dt_gpt_init_params(t->m, c->seed);
    }
    if (c->init_from)
        DT_CHECK(dt__train_init_params(t));
    if (t->pipe)
        return dt_pp_runner_create(
            &t->runner, &(dt_pp_runner_config){.model = t->m,
                                               .sched = t->pipe,
                                               .group = dt_mesh_group(t->mesh, DT_AXIS_PP)});
    return dt_sequential_runner_create(&t->runner, t->m);
}

/* The four linear layers of a block (K-FAC preconditions them): their
 * weights are named h.L.attn.c_attn.weight, h.L.attn.c_proj.weight,
 * h.L.mlp.c_fc.weight and h.L.mlp.c_proj.weight. */
static bool is_block_linear(const char *name) {
    size_t n = strlen(name);
    return strncmp(name, "h.", 2) == 0 && n > 7 && strcmp(name + n - 7, ".weight") == 0 &&
           (strstr(name, ".c_attn.") || strstr(name, ".c_proj.") || strstr(name, ".c_fc."));
}

/* Backward's linear-layer statistics, into K-FAC (an offset or shape it
 * does not know is a bug: the table was built from the same model). */
static void kfac_stats(void *user, size_t offset, const float *x, const float *dy, int N, int in,
                       int out, float scale) {
    trainer *t = user;
    dt_status st = dt_kfac_accumulate(t->opt, offset, x, dy, N, in, out, scale);
    DT_ASSERT(st == DT_OK);
}

dt_optim_tensor *dt__train_optim_tensors(const trainer *t, size_t *n) {
    size_t nt = dt_gpt_num_tensors(t->m);
    dt_optim_tensor *tens = dt_calloc(nt + 1, sizeof *tens);
    if (!tens)
        return NULL;
    for (size_t i = 0; i < nt; i++) {
        dt_param_info pi;
        dt_gpt_tensor_info(t->m, i, &pi);
        /* Matrices carry their shape (Adafactor factors them, gradient
         * centralisation centres their rows); vectors are 1 x cols. */
        bool mat = pi.rows > 1;
        tens[i] = (dt_optim_tensor){.offset = pi.offset,
                                    .count = pi.rows * pi.cols,
                                    .decay = pi.decay,
                                    .rows = mat ? pi.rows : 0,
                                    .cols = mat ? pi.cols : 0,
                                    .linear = mat && is_block_linear(pi.name)};
    }
    *n = nt;
    return tens;
}

/* The optimizer over this rank's parameters, tensor by tensor (decay
 * differs between matrices and biases/norms). */
static dt_status make_optimizer(trainer *t) {
    const dt_train_config *c = t->c;
    size_t nt;
    dt_optim_tensor *tens = dt__train_optim_tensors(t, &nt);
    if (!tens)
        return DT_ERR_NOMEM;
    dt_optim_config oc = dt__train_optim_config(c, &t->offload);
    /* Per-tensor statistics (LAMB and LARS trust ratios, Adafactor's
     * factors, centralisation's row means) need the sum over the replicas
     * that share a tensor's parameters: under ZeRO each of the dp x cp
     * gradient group owns a piece. */
    if (c->zero && t->sync_size > 1) {
        oc.reduce = dt__train_optim_reduce;
        oc.reduce_user = t;
    }
    /* K-FAC averages its factors over the dp x cp gradient group (each of
     * its ranks saw other tokens) and spreads the inverses over its ranks. */
    if (c->optimizer == DT_OPTIM_KFAC) {
        oc.rank = t->sync_rank;
        oc.nranks = t->sync_size;
        if (t->sync_size > 1) {
            oc.reduce = dt__train_optim_reduce;
            oc.bcast = dt__train_optim_bcast;
            oc.reduce_user = t;
        }
    }
    /* ZeRO: this replica's piece of every bucket; else all of it. */
    dt_range *owned;
    size_t nr;
    dt_status st = dt__train_owned(c, t->n, t->sync_size, t->sync_rank, &owned, &nr);
    if (st != DT_OK) {
        dt_free(tens);
        return st;
    }
    st = dt_optimizer_create(&t->opt, &oc, tens, nt, owned, nr);
    dt_free(owned);
    dt_free(tens);
    if (st == DT_OK && c->optimizer == DT_OPTIM_KFAC)
        st = dt_gpt_set_linear_stats(t->m, kfac_stats, t);
    return st;
}

dt_status dt__train_optim_bcast(void *user, float *values, size_t n, int root) {
    trainer *t = user;
    dt_group *dp = dt_mesh_replica_group(t->mesh);
    return dp ? dt_group_broadcast(dp, values, n, DT_F32, root) : DT_OK;
}

dt_status dt__train_optim_reduce(void *user, double *values, size_t n) {
    trainer *t = user;
    dt_group *dp = dt_mesh_replica_group(t->mesh);
    return dp ? dt_group_allreduce(dp, values, values, n, DT_F64, DT_SUM) : DT_OK;
}

/* Data parallelism over the mesh's dp group, with the wire format of the
 * config; PowerSGD sees the model's matrices. */
dt_status dt__train_make_sync(trainer *t) {
    const dt_train_config *c = t->c;
    size_t nt = dt_gpt_num_tensors(t->m);
    dt_powersgd_tensor *shapes = dt_calloc(nt + 1, sizeof *shapes);
    dt_range *norm = dt_calloc(nt + 1, sizeof *norm), *exact = dt_calloc(nt + 1, sizeof *exact);
    if (!shapes || !norm || !exact) {
        dt_free(shapes);
        dt_free(norm);
        dt_free(exact);
        return DT_ERR_NOMEM;
    }
    /* The norm counts what this rank owns: tensors every tensor-parallel
     * rank holds whole are counted by one of them. */
    size_t nn = 0, nx = 0;
    for (size_t i = 0; i < nt; i++) {
        dt_param_info pi;
        dt_gpt_tensor_info(t->m, i, &pi);
        shapes[i] = (dt_powersgd_tensor){.offset = pi.offset, .rows = pi.rows, .cols = pi.cols};
        /* 16-bit compute reads the one-row tensors (biases, LayerNorm) in
         * fp32: ZeRO 3 keeps them whole (nn.h, dt_param_hooks.fetch16). */
        if (pi.rows == 1 && pi.rows * pi.cols > 0)
            exact[nx++] = (dt_range){pi.offset, pi.offset + pi.cols};
        if (!pi.owner)
            continue;
        if (nn > 0 && norm[nn - 1].end == pi.offset)
            norm[nn - 1].end += pi.rows * pi.cols;
        else
            norm[nn++] = (dt_range){pi.offset, pi.offset + pi.rows * pi.cols};
    }
    /* The default bucket comes from the model (dt__train_bucket_bytes, as
     * the optimizer's owned ranges did); the header and config.json show
     * the value used. */
    t->cfg.bucket_bytes = dt__train_bucket_bytes(c, t->n);
    dt_status st;
    /* The wire: the codec (or 16-bit dtype) on DDP's allreduce or ZeRO's
     * reduce-scatter. */
    dt_ddp_options wire = dt_ddp_options_default();
    wire.bucket_bytes = c->bucket_bytes;
    wire.grad_dtype = c->grad_dtype;
    wire.codec = c->compress;
    wire.ef = c->compress_ef;
    wire.seed = c->seed;
    wire.tensors = shapes;
    wire.ntensors = nt;
    wire.dense_below = (size_t)c->compress_dense_below;
    if (t->sync_size == 1 && t->rank == 0 &&
        (c->compress.kind != DT_CODEC_NONE || c->compress_auto.n || c->grad_dtype != DT_F32))
        DT_WARN("--compress / --grad-dtype have no effect here: with one data-parallel rank no "
                "gradient is exchanged");
    if (c->zero) {
        dt_zero_sync_config zc = {.stage = c->zero,
                                  .accum = t->K,
                                  .group = dt_mesh_replica_group(t->mesh),
                                  .params = dt_gpt_params(t->m),
                                  .grads = dt_gpt_grads(t->m),
                                  .n = t->n,
                                  .opt = t->opt,
                                  .bucket_bytes = c->bucket_bytes,
                                  .norm_ranges = norm,
                                  .nnorm = nn,
                                  .wire = &wire,
                                  .compress_start = c->compress_start,
                                  .precision = c->precision,
                                  .exact = exact,
                                  .nexact = nx,
                                  .offload_dir =
                                      t->offload.params_dir[0] ? t->offload.params_dir : NULL,
                                  .offload_direct = t->offload.params_direct};
        st = dt_zero_sync_create(&t->sync, &zc);
        dt_free(shapes);
        dt_free(norm);
        dt_free(exact);
        return st;
    }
    dt_free(exact);
    dt_ddp_sync_config sc = {
        .group = dt_mesh_replica_group(t->mesh),
        .params = dt_gpt_params(t->m),
        .grads = dt_gpt_grads(t->m),
        .n = t->n,
        .opt = t->opt,
        .ddp = wire,
        .compress_start = c->compress_start,
        .compress_ramp = c->compress_ramp,
        .ramp_start = DT_TRAIN_RAMP_START,
        .norm_ranges = norm,
        .nnorm = nn,
    };
    sc.ddp.priority = c->comm_priority;
    sc.ddp.piece_bytes = c->comm_piece;
    sc.ddp.auto_codecs = c->compress_auto.n ? &c->compress_auto : NULL;
    st = c->dp_mode == DT_DP_MODE_DDP ? dt_ddp_sync_create(&t->sync, &sc)
                                      : dt__train_make_dp_mode_sync(t, &sc);
    dt_free(shapes);
    dt_free(norm);
    /* The 16-bit weight copy (docs/engine.md, "The weight handle"): the
     * loop tells the model when parameters changed, so the copy is rounded
     * once per step, not once per micro-batch forward. Where the optimizer
     * alone writes every parameter of this rank (DDP without ZeRO, an
     * elementwise rule), it writes the copy as it updates the master: no
     * rounding pass at all. ZeRO (a shard updated, the rest gathered) and
     * the replica-averaging modes write parameters outside the optimizer. */
    t->w16_owned = st == DT_OK && c->precision != DT_PRECISION_FP32;
    t->w16_fused = t->w16_owned && c->dp_mode == DT_DP_MODE_DDP && c->zero == 0 &&
                   dt_optimizer_writes_copy(t->opt) && dt_optimizer_owned_count(t->opt) == t->n;
    if (t->w16_fused)
        dt_optimizer_set_copy(t->opt, dt_gpt_write_weights16, t->m);
    return st;
}

static dt_status make_schedule(trainer *t) {
    const dt_train_config *c = t->c;
    t->sched = (dt_schedule){.kind = (dt_schedule_kind)c->schedule,
                             .base_lr = (float)c->lr,
                             .min_lr = (float)c->min_lr,
                             .warmup = c->warmup,
                             .total = c->steps};
    if (t->sched.total <= t->sched.warmup &&
        (t->sched.kind == DT_SCHED_LINEAR || t->sched.kind == DT_SCHED_COSINE))
        return bad("--warmup %" PRId64 " must be smaller than --steps %" PRId64 " for the %s "
                   "schedule",
                   c->warmup, c->steps, dt_schedule_names[c->schedule]);
    DT_CHECK(dt_schedule_validate(&t->sched));
    t->scaling = c->loss_scaling == 1 || (c->loss_scaling < 0 && c->precision == DT_PRECISION_FP16);
    if (t->scaling)
        DT_CHECK(dt_scaler_init(&t->scaler, &c->scaler));
    return DT_OK;
}

dt_status dt__train_setup(trainer *t) {
    t->cfg = *t->c;
    t->c = &t->cfg;
    uint64_t peak;
    if (!dt_mem_resident(&t->rss_base, &peak))
        t->rss_base = 0;
    DT_CHECK(join(t));
    DT_CHECK(resolve_dirs(t));
    t->kill_at = fault_step(t, "DT_FAULT_KILL");
    const char *kill = getenv("DT_FAULT_KILL");
    t->kill_mid = kill && strstr(kill, ":mid"); /* "RANK:STEP:mid": during step STEP */
    t->perturb_at = fault_step(t, "DT_FAULT_PERTURB");
    t->overflow_at = fault_step(t, "DT_FAULT_OVERFLOW");
    DT_CHECK(slow_factor(t));
    t->ckpt_precision = t->c->precision;
    DT_CHECK(sizes(t));
    DT_CHECK(dt__train_offload(t->c, &t->offload));
    DT_CHECK(open_data(t));
    DT_CHECK(model_config(t));
    DT_CHECK(dt__train_make_loaders(t));
    DT_CHECK(dt_train_plan_memory(t->c, &t->mc, t->size, t->rank, &t->plan));
    DT_CHECK(make_model(t));
    DT_CHECK(make_optimizer(t));
    DT_CHECK(dt__train_make_sync(t));
    /* A strategy that keeps parameters elsewhere (ZeRO 3) fetches them
     * around every read of the model. */
    const dt_param_hooks *hooks = dt_grad_sync_param_hooks(t->sync);
    if (hooks)
        DT_CHECK(dt_gpt_set_param_hooks(t->m, hooks));
    DT_CHECK(make_schedule(t));
    t->cfg_text = dt__train_config_json(t);
    if (!t->cfg_text)
        return dt_error_set(DT_ERR_NOMEM, "config text");
    return DT_OK;
}

void dt__train_free(trainer *t) {
    dt_free(t->bd);
    dt_free(t->bd_sum);
    dt_free(t->rss);
    dt_free(t->bd_gather);
    dt_model_close(&t->init);
    dt_bpe_destroy(t->bpe);
    dt_runner_destroy(t->runner);
    dt_pp_schedule_destroy(t->pipe);
    dt_grad_sync_destroy(t->sync);
    dt_optimizer_destroy(t->opt);
    dt_gpt_destroy(t->m);
    dt_loader_destroy(t->train);
    dt_loader_destroy(t->val);
    dt_token_file_close(t->val_data);
    dt_token_file_close(t->data);
    dt_free(t->inputs);
    dt_free(t->targets);
    free(t->cfg_text);
    dt_tp_destroy(t->tp);
    dt_cp_destroy(t->cp);
    dt_mesh_destroy(t->mesh);
    dt_group_destroy(t->world);
    dt_elastic_destroy(t->elastic);
    if (t->trace_fd > 0)
        close(t->trace_fd);
}
