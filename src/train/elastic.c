/*
 * elastic.c — `dtrain train --elastic MIN:MAX`: the trainer's side of an
 * elastic job (the membership itself is comm's, dtrain/elastic.h).
 *
 * When a collective fails because a rank died, every survivor tears down
 * its groups (revoking the generation), agrees with the others on the new
 * membership, rebuilds the mesh, the loaders and the gradient
 * synchronisation for the new world size, and takes the state of the most
 * advanced survivor by broadcast; then the step that was cut short runs
 * again. Newcomers are let in the same way at a step boundary, when rank 0
 * sees them waiting.
 *
 * Why this state is consistent: in DDP every rank holds the whole model and
 * optimizer state, and an elastic run updates them only after the step's
 * statistics allreduce succeeded on this rank (no per-bucket early update),
 * so a survivor is always at a step boundary: its last completed step, with
 * the loader position recorded then (t->committed). Survivors may differ by
 * one step (the allreduce completed on some ranks before the death was
 * seen); the highest wins (roll forward), which is the state an
 * uninterrupted run would have had.
 *
 * The data: the global batch G is fixed, so a step's samples are the same
 * permutation entries [s*G, (s+1)*G) whatever the world size (loader.c);
 * only their split among ranks changes. No sample is skipped or used twice
 * by completed steps; a step cut short is computed again in full (its
 * partial work discarded).
 */
#include "train_internal.h"

#include <fcntl.h>
#include <inttypes.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <unistd.h>

/* --join ADDR:PORT, checked before anything connects: a typo is named
 * here rather than reported as a store that does not answer. */
static dt_status check_join_address(const char *join) {
    const char *colon = strrchr(join, ':');
    char *end = NULL;
    long port = colon ? strtol(colon + 1, &end, 10) : 0;
    if (!colon || colon == join || colon[1] == 0 || *end || port < 1 || port > 65535)
        return bad("--join %s: expected ADDR:PORT (the running job's store, port 1..65535)", join);
    char host[256];
    if ((size_t)(colon - join) >= sizeof host)
        return bad("--join %s: the address is longer than %zu characters", join, sizeof host - 1);
    memcpy(host, join, (size_t)(colon - join));
    host[colon - join] = 0;
    struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *ai = NULL;
    int gai = getaddrinfo(host, NULL, &hints, &ai);
    if (gai != 0)
        return bad("--join %s: \"%s\" is not an IPv4 address or a host name that resolves (%s)",
                   join, host, gai_strerror(gai));
    freeaddrinfo(ai);
    return DT_OK;
}

dt_status dt__train_check_elastic(const dt_train_config *c) {
    if (c->join && c->elastic_max <= 0)
        return bad("--join %s needs --elastic MIN:MAX (the running job's)", c->join);
    if (c->join)
        DT_CHECK(check_join_address(c->join));
    if (c->elastic_max <= 0)
        return DT_OK;
    if (c->elastic_min < 1 || c->elastic_min > c->elastic_max)
        return bad("--elastic %d:%d: need 1 <= MIN <= MAX", c->elastic_min, c->elastic_max);
    /* What a survivor can restore from its own memory: every DDP rank holds
     * the whole model and optimizer state. Other layouts spread it. */
    const char *what = c->tp > 1                                   ? "--tp"
                       : c->pp > 1                                 ? "--pp"
                       : c->cp > 1                                 ? "--cp"
                       : c->zero                                   ? "--zero"
                       : c->dp_mode != DT_DP_MODE_DDP              ? "--dp-mode"
                       : c->compress.kind != DT_CODEC_NONE         ? "--compress"
                       : c->compress_auto.n                        ? "--compress auto"
                       : c->offload                                ? "--offload"
                       : c->optimizer == DT_OPTIM_KFAC             ? "--optimizer kfac"
                       : c->comm_priority != DT_COMM_PRIORITY_FIFO ? "--comm-priority critical"
                                                                   : NULL;
    if (what)
        return dt_error_set(
            DT_ERR_UNSUPPORTED,
            "--elastic with %s: a survivor restores the state from its own "
            "replica, which only plain data parallelism keeps whole on every "
            "rank (DDP with fp32, bf16 or fp16 gradients, no codec, no ZeRO, tp, "
            "pp, cp, offload, K-FAC or deferred updates); use --max-restarts to restart such a "
            "job from its checkpoint instead",
            what);
    if (c->global_batch <= 0 || c->batch)
        return bad("--elastic keeps the global batch the same at every world size: give "
                   "--global-batch G (and no --batch), divisible by every size from %d to %d",
                   c->elastic_min, c->elastic_max);
    for (int n = c->elastic_min; n <= c->elastic_max; n++)
        if (c->global_batch % n != 0) {
            long long l = 1;
            for (int k = c->elastic_min; k <= c->elastic_max; k++) {
                long long a = l, b = k;
                while (b) {
                    long long r = a % b;
                    a = b;
                    b = r;
                }
                l = l / a * k;
            }
            return bad("--global-batch %d is not divisible by %d ranks, a size --elastic %d:%d "
                       "allows (the batch stays the same at every size: use a multiple of %lld)",
                       c->global_batch, n, c->elastic_min, c->elastic_max, l);
        }
    return DT_OK;
}

dt_status dt__train_elastic_join(trainer *t) {
    const dt_train_config *c = t->c;
    dt_elastic_options o = {.min = c->elastic_min, .max = c->elastic_max, .join = c->join};
    dt_status st = dt_elastic_create(&t->elastic, &o, &t->world);
    if (st != DT_OK)
        return st;
    t->newcomer = t->world == NULL;
    t->rank = t->world ? dt_group_rank(t->world) : 0;
    t->size = t->world ? dt_group_size(t->world) : 1;
    dt_log_set_rank(t->rank);
    const char *addr = getenv("DT_MASTER_ADDR"), *port = getenv("DT_MASTER_PORT");
    if (!t->newcomer && t->rank == 0 && addr && port)
        fprintf(stderr,
                "elastic: %d rank(s), --elastic %d:%d; newcomers join with --join %s:%s and this "
                "job's DT_JOB_TOKEN\n",
                t->size, c->elastic_min, c->elastic_max, addr, port);
    return DT_OK;
}

bool dt__train_elastic_recoverable(const trainer *t, dt_status st) {
    return t->elastic && (st == DT_ERR_PEER || st == DT_ERR_ABORTED || st == DT_ERR_TIMEOUT);
}

/* What the member with the state gives the others besides the buffers. */
typedef struct state_header {
    int64_t step, tokens, skipped, opt_count;
    uint64_t epoch, loader_step;
    dt_scaler_state scaler; /* with loss scaling */
    dt_step_metrics last;   /* the metrics of that step (a rank 0 that lacks them logs these) */
    int32_t save;           /* a checkpoint of that step is due and was not committed */
    char run_dir[4096], ckpt_dir[4096];
} state_header;

/* Is a checkpoint of the current step due, and missing (the loss of a rank
 * interrupted it)? */
static bool checkpoint_missing(const trainer *t) {
    const dt_train_config *c = t->c;
    if (!c->ckpt_dir || t->step <= 0 ||
        !((c->ckpt_every > 0 && t->step % c->ckpt_every == 0) || t->step == c->steps))
        return false;
    char path[4200];
    dt_ckpt_path(path, sizeof path, c->ckpt_dir, t->step);
    return access(path, F_OK) != 0;
}

/* The optimizer's state from `root` to the others (DDP: all of it on every
 * rank). */
static dt_status broadcast_optimizer(trainer *t, int root) {
    for (size_t i = 0; i < dt_optimizer_num_states(t->opt); i++) {
        float *buf = dt_optimizer_state(t->opt, i, NULL);
        size_t count = dt_optimizer_state_count(t->opt, i);
        if (buf) {
            DT_CHECK(dt_group_broadcast(t->world, buf, count, DT_F32, root));
            continue;
        }
        float *tmp = dt_alloc((count ? count : 1) * sizeof(float)); /* 8-bit AdamW */
        if (!tmp)
            return DT_ERR_NOMEM;
        dt_optimizer_state_get(t->opt, i, tmp);
        dt_status st = dt_group_broadcast(t->world, tmp, count, DT_F32, root);
        if (st == DT_OK)
            dt_optimizer_state_set(t->opt, i, tmp);
        dt_free(tmp);
        DT_CHECK(st);
    }
    for (size_t k = 0; k < dt_optimizer_num_tensor_states(t->opt); k++) {
        size_t total;
        float *buf = dt_optimizer_tensor_state(t->opt, k, NULL, &total);
        DT_CHECK(dt_group_broadcast(t->world, buf, total, DT_F32, root));
    }
    size_t n = dt_optimizer_num_scalars(t->opt);
    if (n > 0) {
        double v[64];
        DT_ASSERT(n <= 64);
        dt_optimizer_scalars_get(t->opt, v);
        DT_CHECK(dt_group_broadcast(t->world, v, n, DT_F64, root));
        DT_CHECK(dt_optimizer_scalars_set(t->opt, v));
    }
    return DT_OK;
}

/* Everything a step boundary is, from `root`: the position in the run and
 * the data, the loss scaler, the parameters and the optimizer state. */
static dt_status broadcast_state(trainer *t, int root) {
    dt_train_config *c = &t->cfg;
    state_header h;
    memset(&h, 0, sizeof h);
    if (t->rank == root) {
        h.step = t->step;
        h.tokens = t->tokens;
        h.skipped = t->skipped;
        h.opt_count = dt_optimizer_count(t->opt);
        h.epoch = t->committed.epoch;
        h.loader_step = t->committed.step;
        if (t->scaling)
            dt_scaler_get_state(&t->scaler, &h.scaler);
        h.last = t->last_sm;
        h.save = checkpoint_missing(t);
        snprintf(h.run_dir, sizeof h.run_dir, "%s", c->run_dir ? c->run_dir : "");
        snprintf(h.ckpt_dir, sizeof h.ckpt_dir, "%s", c->ckpt_dir ? c->ckpt_dir : "");
    }
    DT_CHECK(dt_group_broadcast(t->world, &h, sizeof h, DT_U8, root));
    DT_CHECK(dt_group_broadcast(t->world, dt_gpt_params(t->m), t->n, DT_F32, root));
    DT_CHECK(broadcast_optimizer(t, root));
    t->step = h.step;
    t->tokens = h.tokens;
    t->skipped = h.skipped;
    t->last_sm = h.last;
    DT_CHECK(dt_optimizer_set_count(t->opt, h.opt_count));
    if (t->scaling)
        DT_CHECK(dt_scaler_set_state(&t->scaler, &h.scaler));
    t->committed = (dt_loader_state){h.epoch, h.loader_step};
    DT_CHECK(dt_loader_set_state(t->train, t->committed));
    /* A newcomer of a run that named its own directories takes the job's. */
    if (c->save_default && !c->run_dir && h.run_dir[0]) {
        snprintf(t->run_dir, sizeof t->run_dir, "%s", h.run_dir);
        c->run_dir = t->run_dir;
    }
    if (c->save_default && !c->ckpt_dir && h.ckpt_dir[0]) {
        snprintf(t->ckpt_dir, sizeof t->ckpt_dir, "%s", h.ckpt_dir);
        c->ckpt_dir = t->ckpt_dir;
    }
    /* Codec residuals are per rank and are not restored (the checks refuse
     * codecs; 16-bit gradients keep none): start them afresh everywhere. */
    if (dt_grad_sync_state_bytes(t->sync) > 0)
        dt_grad_sync_reset_state(t->sync);
    /* The checkpoint the lost rank interrupted, by the new membership. */
    if (h.save) {
        char path[4200];
        DT_CHECK(dt__train_save(t, path, sizeof path));
    }
    return DT_OK;
}

/* RUN_DIR/elastic.jsonl: one line per membership change, by rank 0. */
static void log_event(const trainer *t, const dt_elastic_view *v, bool failed, double seconds,
                      const char *cause) {
    if (t->rank != 0 || !t->c->run_dir)
        return;
    char path[4200];
    snprintf(path, sizeof path, "%s/elastic.jsonl", t->c->run_dir);
    FILE *f = fopen(path, "a");
    if (!f) {
        DT_WARN("elastic: cannot append to %s", path);
        return;
    }
    struct timeval tv;
    gettimeofday(&tv, NULL);
    char why[256];
    size_t n = 0;
    for (const char *p = cause; *p && *p != '\n' && n + 2 < sizeof why; p++) {
        if (*p == '"' || *p == '\\')
            why[n++] = '\\';
        why[n++] = *p;
    }
    why[n] = 0;
    fprintf(f,
            "{\"generation\":%d,\"step\":%" PRId64
            ",\"world\":%d,\"prev_world\":%d,\"lost\":\"%s\","
            "\"joined\":%d,\"root\":%d,\"cause\":\"%s\",\"recovery_s\":%.4f,\"round_s\":%.4f,"
            "\"time\":%.6f,\"why\":\"%s\"}\n",
            v->generation, t->step, v->size, v->prev_size, v->lost_ranks, v->joined, v->root,
            failed                              ? "failure"
            : v->prev_rank < 0 && !v->prev_size ? "start"
                                                : "grow",
            seconds, v->seconds, (double)tv.tv_sec + tv.tv_usec * 1e-6, why);
    fclose(f);
}

dt_status dt__train_elastic_recover(trainer *t, bool failed) {
    double t0 = dt_now();
    char cause[512];
    snprintf(cause, sizeof cause, "%s", failed ? dt_last_error() : "newcomers let in");
    cause[strcspn(cause, "\n")] = 0; /* the message, not its breadcrumbs */
    if (failed)
        DT_INFO("elastic: %s; forming a new membership", cause);
    /* Revoke: peers blocked in a collective of this generation hear of it
     * now (rule 2 of dtrain/elastic.h), then every group goes. */
    if (failed && t->world)
        dt_group_abort(t->world);
    dt_grad_sync_destroy(t->sync);
    t->sync = NULL;
    dt_mesh_destroy(t->mesh);
    t->mesh = NULL;
    dt_group_destroy(t->world);
    t->world = NULL;
    dt_error_clear();

    dt_elastic_view v;
    DT_CHECK(dt_elastic_reform(t->elastic, t->newcomer ? -1 : t->step, &t->world, &v));
    t->rank = v.rank;
    t->size = v.size;
    dt_log_set_rank(t->rank);
    DT_CHECK(dt__train_layout(t));
    DT_CHECK(dt__train_batch(t->c, t->dp, t->size, &t->B));
    DT_ASSERT(t->B <= t->B_max);
    dt_loader_destroy(t->train);
    dt_loader_destroy(t->val);
    t->train = t->val = NULL;
    DT_CHECK(dt__train_make_loaders(t));
    DT_CHECK(dt__train_make_sync(t));
    bool was_newcomer = t->newcomer;
    DT_CHECK(broadcast_state(t, v.root));
    t->newcomer = false;
    double took = dt_now() - t0;
    if (was_newcomer)
        fprintf(stderr,
                "elastic: let into generation %d as rank %d of %d, continuing from step %" PRId64
                " (%.2f s)\n",
                v.generation, v.rank, v.size, t->step, took);
    if (t->rank == 0) {
        if (failed || v.prev_size)
            fprintf(stderr,
                    "elastic: generation %d: %d rank(s)%s%s%s, continuing from step %" PRId64
                    " (%.2f s)\n",
                    v.generation, v.size, v.lost ? ", lost ranks " : "", v.lost_ranks,
                    v.joined ? ", newcomers let in" : "", t->step, took);
        log_event(t, &v, failed, took, cause);
    }
    return DT_OK;
}

dt_status dt__train_elastic_poll(trainer *t, bool *grow) {
    int32_t n = 0;
    if (t->rank == 0)
        DT_CHECK(dt_elastic_joiners(t->elastic, &n));
    if (t->world)
        DT_CHECK(dt_group_broadcast(t->world, &n, 1, DT_I32, 0));
    *grow = n > 0;
    return DT_OK;
}

void dt__train_trace_batch(trainer *t, int k) {
    if (t->trace_fd == 0) { /* first call: DT_DATA_TRACE=DIR, one file per process */
        const char *dir = getenv("DT_DATA_TRACE");
        t->trace_fd = -1;
        if (dir && *dir) {
            char path[4200];
            snprintf(path, sizeof path, "%s/trace-%d.txt", dir, (int)getpid());
            t->trace_fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
            if (t->trace_fd < 0) {
                DT_WARN("DT_DATA_TRACE: cannot open %s", path);
                t->trace_fd = -1;
            }
        }
    }
    if (t->trace_fd < 0)
        return;
    /* "TIME GENERATION STEP K RANK WORLD WINDOW..." (STEP 1-based), one
     * write, so that a line survives the process being killed after it. */
    char line[8192];
    uint32_t w[1024];
    int B = t->B < 1024 ? t->B : 1024;
    struct timeval tv;
    gettimeofday(&tv, NULL);
    int n = snprintf(line, sizeof line, "%.6f %d %" PRId64 " %d %d %d",
                     (double)tv.tv_sec + tv.tv_usec * 1e-6, dt_elastic_generation(t->elastic),
                     t->step + 1, k, t->rank, t->size);
    if (t->B <= 1024) {
        dt_loader_peek(t->train, w);
        for (int b = 0; b < B && n < (int)sizeof line - 16; b++)
            n += snprintf(line + n, sizeof line - (size_t)n, " %u", w[b]);
    }
    n += snprintf(line + n, sizeof line - (size_t)n, "\n");
    if (write(t->trace_fd, line, (size_t)n) < 0)
        DT_WARN("DT_DATA_TRACE: write failed");
}
