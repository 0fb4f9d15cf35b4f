/*
 * loop.c — the training loop. One optimizer step:
 *
 *     K times: next batch -> forward -> backward(S/K)      (the first backward
 *              overwrites the gradients, so nothing zeroes them; the grad
 *              sync's hook sees each one; S is the loss scale with loss
 *              scaling on, else 1)
 *     finish the grad sync: final (averaged, unscaled) gradients, the local
 *              sum of squares, inf/nan found (with update_early the
 *              optimizer already stepped, range by range)
 *     one allreduce over the world: loss, sum of squares, stop flag,
 *              inf/nan flag; a NaN/inf loss stops the run; an inf/nan
 *              gradient on any rank skips the step on every rank
 *     apply: clip by the global norm and update (unless skipped)
 *     (L-BFGS instead repeats forward/backward/average on the same
 *     micro-batches at the points its line search asks for)
 *     metrics, progress, evaluation, checkpoint
 *
 * Deferred steps (--comm-priority critical, no clipping or loss scaling):
 * the grad sync's finish returns before the last gradients are averaged,
 * and the next step's forward updates each layer just before it runs. The
 * sync then opens and closes the optimizer's step itself, and the step's
 * gradient norm is known one step later: the next step's statistics
 * allreduce carries it, and the step's record (metrics line, progress) is
 * written then. Evaluation, the replica check, checkpoints, a stop and the
 * last step settle first (every update done, the norm agreed).
 *
 * The loop knows no strategy: it drives the dt_grad_sync and the optimizer
 * object it was given, and averages over the mesh's groups.
 *
 * Invariants:
 *   - Every rank runs the same sequence of collectives: the grad sync's,
 *     then the step's statistics, then (at fixed steps) the evaluation
 *     average, the replica check and the checkpoint's.
 *   - The hot loop allocates nothing; per-step records for the medians are
 *     a fixed window (the newest DT__MEDIAN_WINDOW steps), whatever --steps.
 */
#include "dtrain/launch.h"
#include "dtrain/trace.h"
#include "train_internal.h"

#include <errno.h>
#include <float.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* Steps whose throughput and communication times enter the summary's
 * medians: the newest ones, so that memory does not grow with --steps. */
#define MEDIAN_WINDOW 4096

float dt__train_applied_scale(const trainer *t) {
    return fminf(dt_scaler_scale(&t->scaler), DT__MAX_APPLIED_SCALE);
}

/* Mean validation loss over --eval-batches batches from the start of the
 * validation data, averaged over the data-parallel replicas. */
static dt_status evaluate(trainer *t, double *out) {
    DT_CHECK(dt_loader_set_state(t->val, (dt_loader_state){0, 0}));
    uint64_t nb = dt_loader_steps_per_epoch(t->val);
    int n = (uint64_t)t->c->eval_batches < nb ? t->c->eval_batches : (int)nb;
    double sum = 0;
    for (int i = 0; i < n; i++) {
        double loss;
        DT_CHECK(dt_loader_next(t->val, t->inputs, t->targets));
        DT_CHECK(dt_runner_eval(t->runner, t->inputs, t->targets, t->B, t->T, &loss));
        sum += loss;
    }
    double v = sum / n;
    dt_group *dp = dt_mesh_group(t->mesh, DT_AXIS_DP);
    if (dp)
        DT_CHECK(dt_group_allreduce(dp, &v, &v, 1, DT_F64, DT_AVG));
    *out = v;
    return DT_OK;
}

static void sleep_ms(double ms) {
    struct timespec ts = {.tv_sec = (time_t)(ms / 1e3), .tv_nsec = (long)(fmod(ms, 1e3) * 1e6)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

/* The parameters changed (the loop owns the model's 16-bit copy, see
 * setup.c): the next forward rounds them, unless the optimizer just wrote
 * the copy itself. Everything in train/ that writes parameters outside
 * dt_gpt calls this after it. */
static void weights_changed(trainer *t, bool copy_written) {
    if (t->w16_owned)
        dt_gpt_set_weights16(t->m, copy_written ? DT_GPT_W16_CURRENT : DT_GPT_W16_STALE);
}

static void maybe_fault(trainer *t) {
    if (t->step == t->perturb_at) {
        fprintf(stderr, "[rank %d] DT_FAULT_PERTURB: changing a parameter after step %lld\n",
                t->rank, (long long)t->step);
        dt_gpt_params(t->m)[t->n / 2] += 1.0f;
        weights_changed(t, false);
    }
    if (t->step == t->kill_at && !t->kill_mid) {
        fprintf(stderr, "[rank %d] DT_FAULT_KILL: killing myself after step %lld\n", t->rank,
                (long long)t->step);
        fflush(stderr);
        raise(SIGKILL);
    }
}

/* What one step agreed on over the world. */
typedef struct step_stats {
    double loss;         /* mean training loss over the replicas */
    double sumsq;        /* global squared gradient norm */
    double norm;         /* its square root (NaN: a deferred step, known later) */
    bool has_prev;       /* the previous, deferred step's norm was agreed with this one's: */
    double prev_norm;    /*   its global gradient norm */
    double prev_comm_ms; /* and its communication time */
    bool stop;           /* some rank was asked to stop */
    bool skip;           /* some rank found an inf/nan gradient (loss scaling) */
    dt_sync_result r;    /* this rank's grad-sync report */
    dt_run_result run;   /* this rank's passes (pipeline: the bubble) */
    float scale;         /* the loss scale applied */
    /* Where the time went (the step breakdown), ms: */
    double data_ms;           /* reading the micro-batches */
    double slow_ms;           /* DT_FAULT_SLOW's sleep (counted as compute) */
    double finish_ms;         /* in the grad sync's finish (waits and early updates) */
    double exposed_at_finish; /* r.exposed_comm_ms when finish returned */
    double apply_ms;          /* in the grad sync's apply (the update) */
    bool met;                 /* the ranks met on this step's statistics */
} step_stats;

/* Forward, backward and the gradient synchronisation of the step's
 * micro-batches (read first when `read`), then one small allreduce over
 * the world that makes every rank agree on: the loss (counted once per
 * replica: by its first tensor- and context-parallel rank of the stage with
 * the head; a cp part's loss is already its whole sequences'), the counted
 * sums of squares (each element once over the world), "a stop
 * was requested on some rank" and "some rank found an inf/nan gradient". */
static dt_status pass(trainer *t, step_stats *s, float lr, bool update_early, bool defer, bool read,
                      const dt_sync_late *before) {
    const dt_train_config *c = t->c;
    DT_CHECK(dt_grad_sync_begin_step(t->sync, &(dt_sync_step){.step = t->step,
                                                              .lr = lr,
                                                              .loss_scaling = t->scaling,
                                                              .loss_scale = s->scale,
                                                              .update_early = update_early,
                                                              .defer = defer}));
    /* Every rank reads the step's micro-batches (a pipeline's first stage
     * needs the inputs, its last the targets; all keep the same position). */
    size_t bt = (size_t)t->B * t->T;
    uint64_t tr = dt_trace_begin();
    double t0 = dt_now();
    for (int k = 0; read && k < t->K; k++) {
        dt__train_trace_batch(t, k);
        DT_CHECK(dt_loader_next(t->train, t->inputs + k * bt, t->targets + k * bt));
    }
    s->data_ms = read ? (dt_now() - t0) * 1e3 : 0;
    if (read)
        dt_trace_end(tr, DT_TRACE_DATA, "data", -1, 0, (uint64_t)t->K * bt);
    if (t->kill_mid && t->step + 1 == t->kill_at) { /* DT_FAULT_KILL=RANK:STEP:mid */
        fprintf(stderr, "[rank %d] DT_FAULT_KILL: killing myself during step %lld\n", t->rank,
                (long long)t->kill_at);
        fflush(stderr);
        raise(SIGKILL);
    }
    s->slow_ms = 0;
    if (t->slow_factor > 1) { /* DT_FAULT_SLOW: a straggler starts its passes late */
        double ts = dt_now();
        sleep_ms((t->slow_factor - 1) * t->last_busy_ms);
        s->slow_ms = (dt_now() - ts) * 1e3;
    }
    DT_CHECK(dt_runner_step(t->runner,
                            &(dt_run_batch){.inputs = t->inputs,
                                            .targets = t->targets,
                                            .micro = t->K,
                                            .B = t->B,
                                            .T = t->T,
                                            .grad_scale = s->scale / (float)t->K},
                            t->sync, &s->run));
    t->last_busy_ms = s->run.busy_ms;
    double loss = s->run.loss;
    double tf = dt_now();
    DT_CHECK(dt_grad_sync_finish(t->sync, &s->r));
    s->finish_ms = (dt_now() - tf) * 1e3;
    s->exposed_at_finish = s->r.exposed_comm_ms;
    if (t->step + 1 == t->overflow_at) {
        /* DT_FAULT_OVERFLOW: after averaging, only this rank sees it. */
        dt_gpt_grads(t->m)[t->n / 2] = INFINITY;
        s->r.found_inf = true;
        s->r.sumsq = INFINITY;
    }
    bool counts_loss = dt_mesh_coord(t->mesh, DT_AXIS_TP) == 0 &&
                       dt_mesh_coord(t->mesh, DT_AXIS_CP) == 0 && s->run.has_loss;
    /* A deferred previous step's sum of squares rides along (every rank
     * defers the same steps): completed in this step's forward (has_prev)
     * or by the settle before it (`before`). */
    s->has_prev = s->r.has_prev || (before && before->pending);
    double prev = s->r.has_prev ? s->r.prev_sumsq : s->has_prev ? before->sumsq : 0.0;
    s->prev_comm_ms = s->r.has_prev ? s->r.prev_comm_ms : s->has_prev ? before->comm_ms : NAN;
    double v[5] = {counts_loss ? loss / t->K : 0.0, s->r.sumsq,
                   c->stop && atomic_load_explicit(c->stop, memory_order_relaxed) ? 1.0 : 0.0,
                   s->r.found_inf ? 1.0 : 0.0, prev};
    /* Strategies whose replicas run on their own between meetings (local
     * SGD, gossip) agree only at those: else this replica's own values,
     * and a stop request waits for the next agreed step. */
    bool agree = dt_grad_sync_agrees(t->sync, t->step);
    if (t->world && agree)
        DT_CHECK(dt_group_allreduce(t->world, v, v, 5, DT_F64, DT_SUM));
    s->loss = agree ? v[0] / t->dp : v[0];
    s->sumsq = v[1];
    s->norm = s->r.late ? NAN : sqrt(v[1]);
    s->prev_norm = sqrt(v[4]);
    s->stop = agree && v[2] > 0;
    s->skip = t->scaling && v[3] > 0;
    s->met = agree;
    return DT_OK;
}

static dt_status numeric_error(const trainer *t, const step_stats *s, float lr) {
    bool l = !isfinite(s->loss);
    double bad_v = l ? s->loss : s->norm;
    return dt_error_set(DT_ERR_NUMERIC, "%s is %s at step %" PRId64 " (lr %.3g); stopping%s",
                        l ? "loss" : "gradient norm", isnan(bad_v) ? "NaN" : "infinite",
                        t->step + 1, (double)lr,
                        t->c->ckpt_dir ? "; the last good checkpoint is kept" : "");
}

/* A deferred step's gradient norm, known a step later, is not finite. */
static dt_status late_numeric_error(const trainer *t, int64_t step1, double norm) {
    return dt_error_set(DT_ERR_NUMERIC, "gradient norm is %s at step %" PRId64 "; stopping%s",
                        isnan(norm) ? "NaN" : "infinite", step1,
                        t->c->ckpt_dir ? "; the last good checkpoint is kept" : "");
}

/* One L-BFGS step: the step's micro-batches stay fixed while its line
 * search evaluates the loss and the averaged gradient at the points it
 * chooses (each evaluation a pass with no update; every rank gets the same
 * loss and gradient, so all move the same way). The step's reported loss
 * and norm are those of its first evaluation, at the starting point. */
static dt_status step_lbfgs(trainer *t, step_stats *s, float lr) {
    dt_optimizer_begin(t->opt, t->step, lr);
    float *params = dt_gpt_params(t->m), *grads = dt_gpt_grads(t->m);
    step_stats first = {0};
    bool more = true;
    for (int e = 0; more; e++) {
        DT_CHECK(pass(t, s, lr, false, false, e == 0, NULL));
        if (!isfinite(s->loss) || !isfinite(s->norm))
            return numeric_error(t, s, lr);
        DT_CHECK(dt_grad_sync_apply(t->sync, true, 1.0f)); /* no update: L-BFGS moves params */
        if (e == 0)
            first = *s;
        DT_CHECK(dt_lbfgs_next(t->opt, params, grads, s->loss, &more));
        weights_changed(t, false);
    }
    dt_optimizer_end(t->opt, true);
    step_stats last = *s;
    *s = first;
    s->stop = last.stop;
    s->r.bytes_sent = last.r.bytes_sent;
    DT_DEBUG("optim", "step %" PRId64 ": L-BFGS evaluated %d points", t->step + 1,
             dt_lbfgs_evals(t->opt));
    return DT_OK;
}

/* One optimizer step (see the file comment). */
static dt_status step(trainer *t, step_stats *s) {
    const dt_train_config *c = t->c;
    float lr = dt_schedule_lr(&t->sched, t->step);
    float scale = t->scaling ? dt__train_applied_scale(t) : 1.0f;
    s->scale = scale;
    s->apply_ms = 0; /* L-BFGS's evaluations apply nothing */
    if (c->optimizer == DT_OPTIM_LBFGS)
        return step_lbfgs(t, s, lr);
    /* A step the grad sync may defer (critical priority): it opens and
     * closes the optimizer's step itself, around updates that may run in
     * the next forward. Decided before the step opens; the strategy
     * accepts only optimizers that are elementwise at every step. */
    bool defer = c->clip <= 0 && !t->scaling && dt_grad_sync_defers(t->sync, true);
    dt_sync_late before = {0};
    if (!defer) {
        /* The previous step may have been deferred: its updates first. */
        DT_CHECK(dt_grad_sync_settle(t->sync, &before));
        dt_optimizer_begin(t->opt, t->step, lr);
    }
    /* Clipping and loss scaling decide the update from the whole gradient,
     * and so do optimizers with per-tensor statistics: then the update
     * waits for the last bucket. 1-bit Adam/LAMB's compression stage is
     * not clipped: what the ranks average there is the momentum mix, not
     * the gradient (its norm is what the metrics show). */
    bool clip = c->clip > 0 && !dt_optimizer_premixing(t->opt);
    /* An elastic job updates only once the step is agreed: a rank lost
     * mid-step must leave every survivor at a step boundary (and defers
     * nothing: critical priority is refused with --elastic). */
    bool early = defer || (!clip && !t->scaling && !t->elastic && dt_optimizer_rangewise(t->opt));
    DT_CHECK(pass(t, s, lr, early, defer, true, &before));
    if (s->skip && scale <= FLT_MIN)
        return dt_error_set(DT_ERR_NUMERIC,
                            "gradients are inf/nan at step %" PRId64 " even at the smallest loss "
                            "scale (%g); stopping%s",
                            t->step + 1, (double)scale,
                            c->ckpt_dir ? "; the last good checkpoint is kept" : "");
    if (!isfinite(s->loss) || (!s->skip && !s->r.late && !isfinite(s->norm)))
        return numeric_error(t, s, lr);
    if (s->has_prev && !isfinite(s->prev_norm))
        return late_numeric_error(t, t->step, s->prev_norm);
    /* A skipped step (PyTorch GradScaler.step) leaves parameters and
     * optimizer state alone; the schedule still advances (lr is a function
     * of the step), the optimizer's update count does not. */
    if (t->scaling)
        dt_scaler_update(&t->scaler, s->skip);
    if (s->skip) {
        t->skipped++;
        DT_DEBUG("amp", "step %" PRId64 ": %s; skipped, loss scale %g -> %g", t->step + 1,
                 s->r.found_inf ? "inf/nan in this rank's gradients"
                                : "another rank found inf/nan gradients",
                 (double)scale, (double)dt__train_applied_scale(t));
    }
    double ta = dt_now();
    DT_CHECK(dt_grad_sync_apply(t->sync, s->skip,
                                clip ? dt_clip_scale(s->sumsq, (float)c->clip) : 1.0f));
    s->apply_ms = (dt_now() - ta) * 1e3;
    /* A skipped step wrote nothing (update_early is off under loss
     * scaling), so the copy stays as it was. */
    if (!s->skip || !t->w16_fused)
        weights_changed(t, t->w16_fused);
    dt_grad_sync_apply_report(t->sync, &s->r);
    if (!defer)
        dt_optimizer_end(t->opt, !s->skip);
    return DT_OK;
}

/* This rank's step breakdown (train.h, dt_step_breakdown) from what the
 * step measured; model_ms is the model's own (tensor- and context-parallel)
 * communication, inside its forward and backward. */
static dt_step_breakdown breakdown_of(const step_stats *s, double step_ms, double model_ms) {
    double exposed_apply = s->r.exposed_comm_ms - s->exposed_at_finish;
    dt_step_breakdown b = {
        .compute = fmax(0, s->run.busy_ms - model_ms) + s->slow_ms,
        .exposed_comm = s->r.exposed_comm_ms + model_ms,
        .overlapped_comm = fmax(0, s->r.comm_ms - s->r.exposed_comm_ms),
        .data = s->data_ms,
        .optimizer = fmax(0, s->finish_ms - s->exposed_at_finish) +
                     fmax(0, s->apply_ms - fmax(0, exposed_apply)),
        .step = step_ms,
    };
    b.idle = fmax(0, step_ms - b.compute - b.exposed_comm - b.data - b.optimizer);
    return b;
}

/* Rank 0's view of the loop: metrics file, progress line, the medians. */
typedef struct display {
    dt_metrics *metrics;
    dt_progress *prog;
    FILE *tty; /* /dev/tty when the live line cannot go to stderr */
    double tps[MEDIAN_WINDOW], comm[MEDIAN_WINDOW], exposed[MEDIAN_WINDOW], tp[MEDIAN_WINDOW],
        cpa[MEDIAN_WINDOW], bubble[MEDIAN_WINDOW], mfu[MEDIAN_WINDOW];
    int peak_live;  /* the most micro-batches this rank kept alive in a step */
    size_t nrec;    /* records so far (the window holds the newest) */
    int64_t logged; /* the last step in metrics.jsonl (an elastic job's new rank 0 checks) */
} display;

/* keep: the steps of metrics.jsonl kept (those of the trajectory so far). */
static dt_status display_open(trainer *t, display *d, int64_t keep) {
    const dt_train_config *c = t->c;
    if (c->run_dir) {
        DT_CHECK(dt_metrics_write_config(c->run_dir, t->cfg_text));
        DT_CHECK(dt_metrics_create(&d->metrics, c->run_dir, keep));
    }
    bool tty = c->progress < 0 ? isatty(STDERR_FILENO) : c->progress == 1;
    /* Under a launcher our stderr is a pipe relayed line by line, which
     * cannot carry a line redrawn in place: `dtrain train --nproc N` on a
     * terminal asks for the live line (DT_PROGRESS=live) and rank 0 draws
     * it on the session's terminal directly. */
    FILE *pf = stderr;
    if (tty && !isatty(STDERR_FILENO) && (d->tty = fopen("/dev/tty", "w")) != NULL)
        pf = d->tty;
    return dt_progress_create(&d->prog, pf, tty, c->steps, c->log_every);
}

static void display_close(display *d) {
    if (d->prog)
        dt_progress_finish(d->prog);
    dt_progress_destroy(d->prog);
    if (d->tty)
        fclose(d->tty);
    dt_metrics_destroy(d->metrics);
}

/* A step's record; a deferred step's waits for its norm (the loop). */
typedef struct held_record {
    bool have;    /* not written yet */
    bool medians; /* enters the summary's medians */
    dt_step_metrics sm;
} held_record;

static void record(display *d, const dt_step_metrics *sm);

/* Write a complete record: medians, metrics line, progress (rank 0). */
static dt_status emit(const trainer *t, display *d, held_record *h) {
    if (!h->have)
        return DT_OK;
    h->have = false;
    if (h->medians)
        record(d, &h->sm);
    if (t->rank != 0)
        return DT_OK;
    if (d->metrics)
        DT_CHECK(dt_metrics_log(d->metrics, &h->sm));
    d->logged = h->sm.step;
    dt_progress_update(d->prog, &h->sm);
    return DT_OK;
}

/* Complete a deferred step now: its last updates, and its norm agreed over
 * the world (every rank settles at the same steps). */
static dt_status settle_step(trainer *t, dt_step_metrics *sm) {
    dt_sync_late late;
    DT_CHECK(dt_grad_sync_settle(t->sync, &late));
    if (!late.pending)
        return DT_OK;
    double v = late.sumsq;
    if (t->world)
        DT_CHECK(dt_group_allreduce(t->world, &v, &v, 1, DT_F64, DT_SUM));
    sm->grad_norm = sqrt(v);
    sm->comm_ms = late.comm_ms;
    if (!isfinite(sm->grad_norm))
        return late_numeric_error(t, sm->step, sm->grad_norm);
    return DT_OK;
}

static void record(display *d, const dt_step_metrics *sm) {
    size_t i = d->nrec++ % MEDIAN_WINDOW;
    d->tps[i] = sm->tokens_per_s;
    d->mfu[i] = sm->mfu;
    d->comm[i] = sm->comm_ms;
    d->exposed[i] = sm->exposed_comm_ms;
    d->tp[i] = sm->tp_comm_ms;
    d->cpa[i] = sm->cp_attention_ms;
    d->bubble[i] = sm->pp_bubble;
    d->peak_live = sm->pp_peak_live > d->peak_live ? sm->pp_peak_live : d->peak_live;
}

/* The summary line and where the results went (rank 0, with the whole
 * model: the weights file and the sample). */
static dt_status finish_report(trainer *t, display *d, dt_train_result *res, int64_t run_steps,
                               const step_stats *last, dt_gpt *whole) {
    const dt_train_config *c = t->c;
    size_t n = d->nrec < MEDIAN_WINDOW ? d->nrec : MEDIAN_WINDOW;
    res->tokens_per_s = dt__median(d->tps, n);
    res->comm_ms = dt__median(d->comm, n);
    res->exposed_comm_ms = dt__median(d->exposed, n);
    res->tp_comm_ms = dt__median(d->tp, n);
    res->cp_attention_ms = dt__median(d->cpa, n);
    res->pp_bubble = dt__median(d->bubble, n);
    double mfu = dt__median(d->mfu, n);
    if (t->rank != 0)
        return DT_OK;
    dt_progress_finish(d->prog);
    if (run_steps == 0 && t->resumed[0])
        fprintf(stderr,
                "nothing to train: %s is at step %" PRId64 " of --steps %" PRId64
                "; give a larger --steps to train further\n",
                t->resumed, t->step, c->steps);
    if (run_steps > 0) {
        fprintf(stderr, "done: steps %" PRId64 "..%" PRId64 " in %.1f s, loss %.4f -> %.4f",
                res->first_step, res->last_step, res->seconds, res->first_loss, res->last_loss);
        if (isfinite(res->val_loss))
            fprintf(stderr, ", val loss %.4f", res->val_loss);
        fprintf(stderr, ", %.0f tokens/s (median), %s", res->tokens_per_s,
                dt_precision_name(c->precision));
        if (t->scaling)
            fprintf(stderr, ", loss scale %g, %" PRId64 " step(s) skipped",
                    (double)dt__train_applied_scale(t), t->skipped);
        if (isfinite(res->tp_comm_ms)) {
            const dt_gpt_part *part = dt_gpt_get_part(t->m);
            fprintf(stderr, ", %s comm %.1f ms/step (exposed)",
                    part->cp_size == 1   ? "tensor-parallel"
                    : part->tp_size == 1 ? "context-parallel"
                                         : "tensor- and context-parallel",
                    res->tp_comm_ms);
            if (isfinite(res->cp_attention_ms) && part->tp_size == 1) /* all of it in attention */
                fprintf(stderr, " in %.1f ms/step of context-parallel attention (%.0f%%)",
                        res->cp_attention_ms,
                        res->cp_attention_ms > 0 ? 100 * res->tp_comm_ms / res->cp_attention_ms
                                                 : 0.0);
        }
        if (isfinite(res->pp_bubble))
            fprintf(stderr,
                    ", pipeline bubble %.1f%% (theory %.1f%%), %d micro-batch(es) alive "
                    "at most",
                    100 * res->pp_bubble,
                    100 * dt_pp_theoretical_bubble(t->pipe->kind, t->pipe->stages, t->pipe->chunks,
                                                   t->pipe->micro),
                    d->peak_live);
        if (t->sync_size > 1 && isfinite(res->comm_ms)) {
            char wb[32];
            fprintf(stderr,
                    ", comm %.1f ms/step of which %.1f ms exposed (%.0f%%); %d of %d "
                    "buckets started during backward; %s sent per step and rank",
                    res->comm_ms, res->exposed_comm_ms,
                    res->comm_ms > 0 ? 100.0 * res->exposed_comm_ms / res->comm_ms : 0.0,
                    last->r.launched_in_backward, last->r.collectives,
                    dt_format_bytes((double)last->r.bytes_sent, wb, sizeof wb));
        }
        fprintf(stderr, "\n");
        dt__breakdown_print(t, stderr);
        /* Above 100% the peak is wrong, not the run: a cached peak taken
         * while the machine was busy, or a --peak-flops below this CPU's. */
        if (mfu > 1.0)
            fprintf(stderr,
                    "warning: MFU %.0f%% (median) is above 100%%: the peak it is relative to is "
                    "lower than this machine reaches; `dtrain bench peak` measures it again (or "
                    "give --peak-flops)\n",
                    100 * mfu);
    }
    uint64_t rss, peak;
    if (dt_mem_resident(&rss, &peak)) {
        char a[32], b[32], p[32], w[64] = "";
        if (whole && t->plan.assembly)
            snprintf(w, sizeof w, " + %s at the end (the whole model)",
                     dt_format_bytes((double)t->plan.assembly, a, sizeof a));
        /* The communication buffers' shared memory is measured apart
         * (RssShmem): the plan's transport segments. */
        uint64_t shm = 0;
        char sm[32], sp[32], shmtxt[96] = "";
        if (dt_mem_shared(&shm))
            snprintf(shmtxt, sizeof shmtxt, "; shared memory %s resident (planned %s)",
                     dt_format_bytes((double)shm, sm, sizeof sm),
                     dt_format_bytes((double)t->plan.comm_shm, sp, sizeof sp));
        fprintf(stderr,
                "memory:     planned %s per rank (rank 0)%s, measured peak resident %s of "
                "which %s before the model%s\n",
                dt_format_bytes((double)t->plan.total, p, sizeof p), w,
                dt_format_bytes((double)peak, a, sizeof a),
                dt_format_bytes((double)t->rss_base, b, sizeof b), shmtxt);
    }
    if (c->run_dir) {
        DT_CHECK(dt__train_write_summary(t, res, mfu));
        fprintf(stderr, "run:        %s (config.json, metrics.jsonl, summary.json, model.dtgw)\n",
                c->run_dir);
    }
    if (t->trace.on)
        fprintf(stderr,
                "trace:      %s/trace.json (ui.perfetto.dev, chrome://tracing); dtrain report "
                "%s\n",
                t->trace.dir, c->run_dir);
    if (res->checkpoint[0])
        fprintf(stderr, "checkpoint: %s (the same command with --resume continues)\n",
                res->checkpoint);
    if (!c->run_dir && !c->ckpt_dir)
        fprintf(stderr, "saved:      nothing (%s)\n",
                c->save_default ? "no --run-dir or --ckpt-dir" : "--no-save");
    if (whole && c->run_dir) {
        /* The final weights in the engine's plain format, for `dtrain
         * sample` (the checkpoint holds the optimizer state too). */
        char wpath[4096];
        snprintf(wpath, sizeof wpath, "%s/model.dtgw", c->run_dir);
        bool table = t->tok->kind != DT_TOKENIZER_BPE; /* a bpe model is sampled with --tokenizer */
        DT_CHECK(dt_gpt_save_weights(whole, wpath, table ? t->tok->id_to_byte : NULL,
                                     table ? t->tok->vocab_size : 0));
        fprintf(stderr, "weights:    %s (dtrain sample --ckpt %s)\n", wpath, wpath);
    }
    if (whole && c->sample_tokens > 0 && t->step == c->steps)
        DT_CHECK(dt__train_generate(t, whole, stdout));
    fflush(stdout);
    return DT_OK;
}

/* After a membership change, rank 0's metrics end at the restored step:
 * a process that became rank 0 takes over the metrics file and the
 * progress line, and the line of the restored step is written from the
 * state's own record when this rank 0 had not written it (it was lost
 * with the old rank 0, or this rank was a step behind). */
static dt_status elastic_display(trainer *t, display *d) {
    if (t->rank != 0)
        return DT_OK;
    if (!d->prog) {
        DT_CHECK(display_open(t, d, t->step > 0 ? t->step - 1 : 0));
        d->logged = t->step > 0 ? t->step - 1 : 0;
    }
    if (d->logged < t->step && t->last_sm.step == t->step) {
        if (d->metrics)
            DT_CHECK(dt_metrics_log(d->metrics, &t->last_sm));
        dt_progress_update(d->prog, &t->last_sm);
        d->logged = t->step;
    }
    return DT_OK;
}

/* A new membership (a rank lost: failed; newcomers let in: !failed): the
 * state broadcast wrote the parameters, so the 16-bit copy is stale; a new
 * rank 0 takes over the display. */
static dt_status elastic_recover(trainer *t, display *d, bool failed) {
    DT_CHECK(dt__train_elastic_recover(t, failed));
    weights_changed(t, false);
    dt__breakdown_restart(t);
    return elastic_display(t, d);
}

/* After a call that may have lost a rank: DT_OK when it did not fail; an
 * elastic job that lost a rank recovers (*recovered) and goes on; any other
 * failure is returned. */
static dt_status elastic_after(trainer *t, display *d, dt_status st, bool *recovered) {
    *recovered = false;
    if (st == DT_OK || !dt__train_elastic_recoverable(t, st))
        return st;
    DT_CHECK(elastic_recover(t, d, true));
    *recovered = true;
    return DT_OK;
}

dt_status dt_train_run(const dt_train_config *c, dt_train_result *res) {
    memset(res, 0, sizeof *res);
    res->val_loss = NAN;
    DT_CHECK(dt__train_check_config(c));
    trainer tr = {.c = c, .rank = 0, .size = 1, .replica = 0, .dp = 1};
    trainer *t = &tr;
    dt_status st = DT_OK;
    display *d = dt_calloc(1, sizeof *d);
    if (!d)
        return DT_ERR_NOMEM;
    DT_CHECK_GOTO(dt__train_setup(t), st, fail);
    c = t->c; /* with the directories and sizes setup resolved */
    if (t->newcomer) {
        /* Joining a running elastic job: let in, then its state (the
         * 16-bit copy is marked stale below, with every start's). */
        DT_CHECK_GOTO(dt__train_elastic_recover(t, false), st, fail);
    } else {
        DT_CHECK_GOTO(dt_grad_sync_replicate(t->sync), st, fail);
        if (c->resume) {
            if (!c->ckpt_dir) {
                st = bad("--resume needs --ckpt-dir");
                goto fail;
            }
            DT_CHECK_GOTO(dt__train_resume(t), st, fail);
        }
    }
    t->committed = dt_loader_get_state(t->train);
    int64_t check_every = c->check_every;
    if (check_every == 0 && dt_log_enabled(DT_LOG_LEVEL_DEBUG, "ddp"))
        check_every = 50;
    if (check_every > 0)
        DT_CHECK_GOTO(dt_grad_sync_check(t->sync, t->step), st, fail);

    /* MFU's denominator: --peak-flops, else the cached peak of this
     * machine in this compute type (dt_peak_flops). */
    double peak = c->peak_gflops;
    char peak_from[4400] = "--peak-flops";
    if (!(peak > 0)) {
        double f = NAN;
        if (dt_peak_flops(c->precision, false, &f, peak_from, sizeof peak_from) != DT_OK)
            snprintf(peak_from, sizeof peak_from, "unknown: %s", dt_last_error());
        peak = f * 1e-9;
    }
    t->peak_flops = peak * 1e9;
    snprintf(t->peak_from, sizeof t->peak_from, "%s", peak_from);
    DT_CHECK_GOTO(dt__breakdown_init(t), st, fail);
    double flops_per_token = 3.0 * dt_gpt_flops_per_token(&t->mc, t->T);
    int64_t tokens_per_step = (int64_t)t->dp * t->B * t->T * t->K;
    if (t->rank == 0) {
        DT_CHECK_GOTO(display_open(t, d, t->resumed[0] ? t->step : 0), st, fail);
        d->logged = t->step;
        dt__train_print_header(t, peak, peak_from, stderr);
    }
    DT_CHECK_GOTO(dt__trace_start(t), st, fail); /* collective */

    weights_changed(t, false); /* initialised, replicated or resumed */
    int64_t nsteps = c->steps - t->step, run_steps = 0;
    res->first_step = t->step + 1;
    double loop_t0 = dt_now();
    step_stats s = {0};
    held_record held = {0};
    const dt_gpt_part *part = dt_gpt_get_part(t->m);
    bool split = part->tp_size > 1 || part->cp_size > 1; /* the model communicates itself */
    (void)dt_gpt_take_comm_ms(t->m);                     /* count from the first step */
    (void)dt_gpt_take_attention_ms(t->m);
    while (t->step < c->steps) {
        uint64_t t_step = dt__trace_step_begin(t);
        double t0 = dt_now();
        float lr = dt_schedule_lr(&t->sched, t->step);
        /* An elastic job that loses a rank (elastic_after) goes back here
         * on every member, at the step the new membership restored: the
         * step that was cut short runs again; a lost rank after the step
         * costs that step's evaluation, not the step. */
        bool recovered;
        st = step(t, &s);
        DT_CHECK_GOTO(elastic_after(t, d, st, &recovered), st, fail);
        if (recovered) {
            dt__trace_step_end(t, t_step);
            continue;
        }
        t->step++;
        t->committed = dt_loader_get_state(t->train);
        run_steps++;
        t->tokens += tokens_per_step;
        double t1 = dt_now();
        dt__trace_step_end(t, t_step);
        dt_step_metrics sm = {
            .step = t->step,
            .total_steps = c->steps,
            .loss = s.loss,
            .val_loss = NAN,
            .lr = lr,
            .grad_norm = s.norm,
            .step_ms = (t1 - t0) * 1e3,
            .comm_ms = s.r.comm_ms,
            .exposed_comm_ms = s.r.exposed_comm_ms,
            .tp_comm_ms = split ? dt_gpt_take_comm_ms(t->m) : NAN,
            .cp_attention_ms = part->cp_size > 1 ? dt_gpt_take_attention_ms(t->m) : NAN,
            .pp_bubble = t->pipe ? s.run.bubble : NAN,
            .pp_peak_live = t->pipe ? s.run.peak_live : 0,
            .bytes_sent = s.r.bytes_sent,
            .tokens = t->tokens,
            .loss_scale = t->scaling ? (double)s.scale : NAN,
            .skipped_steps = t->skipped,
            .skipped = s.skip,
            .has_staleness = s.r.staleness >= 0,
            .staleness = s.r.staleness,
            .has_consensus = isfinite(s.r.consensus),
            .consensus = s.r.consensus,
            .codecs = s.r.codecs,
            .link_mbs = s.r.link_bytes_per_s / 1e6,
            .has_fwd_lead = isfinite(s.r.fwd_lead_ms),
            .fwd_lead_ms = s.r.fwd_lead_ms,
        };
        if (s.r.late)
            sm.comm_ms = NAN; /* with the norm, a step later */
        sm.compute_ms = sm.step_ms - sm.exposed_comm_ms - (split ? sm.tp_comm_ms : 0);
        sm.tokens_per_s = (double)tokens_per_step / (t1 - t0);
        sm.mfu = isfinite(peak) && peak > 0
                     ? flops_per_token * sm.tokens_per_s / (peak * 1e9 * t->size)
                     : NAN;
        if (run_steps == 1)
            res->first_loss = s.loss;
        res->last_loss = s.loss;
        /* The previous step was deferred: its record is complete now (and
         * written before this step's breakdown replaces the one it shows). */
        if (held.have && s.has_prev) {
            held.sm.grad_norm = s.prev_norm;
            held.sm.comm_ms = s.prev_comm_ms;
            DT_CHECK_GOTO(emit(t, d, &held), st, fail);
        }
        /* What a new membership's rank 0 logs if nobody did: set before
         * the first collective after the step, which may be where a rank
         * is found lost. */
        t->last_sm = sm;
        bool counted = run_steps > 1 || nsteps == 1;
        dt_step_breakdown mine = breakdown_of(&s, sm.step_ms, split ? sm.tp_comm_ms : 0);
        st = dt__breakdown_exchange(t, &mine, s.met, counted, &sm.nranks);
        DT_CHECK_GOTO(elastic_after(t, d, st, &recovered), st, fail);
        if (recovered)
            continue;
        sm.ranks = t->bd;
        held = (held_record){.have = true, .medians = counted, .sm = sm};
        bool last = t->step == c->steps;
        bool interrupted = s.stop && !last;
        bool stop = (c->stop_after > 0 && run_steps >= c->stop_after && !last) || interrupted;
        bool evaluates = t->val && ((c->eval_every > 0 && t->step % c->eval_every == 0) || last);
        bool checks = check_every > 0 && t->step % check_every == 0;
        bool saves =
            c->ckpt_dir && ((c->ckpt_every > 0 && t->step % c->ckpt_every == 0) || last || stop);
        /* A deferred step completes before anything reads every parameter
         * (the same steps on every rank: a collective agrees its norm). */
        if (s.r.late && (evaluates || checks || saves || last || stop))
            DT_CHECK_GOTO(settle_step(t, &held.sm), st, fail);
        if (evaluates) {
            uint64_t te = dt_trace_begin();
            st = evaluate(t, &held.sm.val_loss);
            dt_trace_end(te, DT_TRACE_STEP, "eval", (int32_t)t->step, 0, 0);
            DT_CHECK_GOTO(elastic_after(t, d, st, &recovered), st, fail);
            if (recovered)
                continue;
            res->val_loss = held.sm.val_loss;
            t->last_sm.val_loss = held.sm.val_loss;
            (void)dt_gpt_take_comm_ms(t->m); /* not the next step's */
            (void)dt_gpt_take_attention_ms(t->m);
        }
        if (checks) {
            st = dt_grad_sync_check(t->sync, t->step);
            DT_CHECK_GOTO(elastic_after(t, d, st, &recovered), st, fail);
            if (recovered)
                continue;
        }
        held.sm.elapsed_s = dt_now() - loop_t0;
        if (!s.r.late || isfinite(held.sm.grad_norm))
            DT_CHECK_GOTO(emit(t, d, &held), st, fail);
        if (saves) {
            uint64_t tc = dt_trace_begin();
            st = dt__train_save(t, res->checkpoint, sizeof res->checkpoint);
            dt_trace_end(tc, DT_TRACE_CKPT, "checkpoint", (int32_t)t->step, 0, 0);
            DT_CHECK_GOTO(elastic_after(t, d, st, &recovered), st, fail);
            if (recovered)
                continue;
        }
        maybe_fault(t);
        if (t->elastic && !last && !stop) { /* newcomers waiting: let them in now */
            bool grow = false;
            st = dt__train_elastic_poll(t, &grow);
            DT_CHECK_GOTO(elastic_after(t, d, st, &recovered), st, fail);
            if (grow && !recovered)
                DT_CHECK_GOTO(elastic_recover(t, d, false), st, fail);
            if (recovered || grow)
                continue;
        }
        if (stop) {
            if (t->rank == 0) {
                dt_progress_finish(d->prog);
                fprintf(stderr, "stopped after %" PRId64 " steps (%s)%s%s\n", run_steps,
                        interrupted ? "interrupted" : "--stop-after",
                        res->checkpoint[0] ? "; continue with --resume from " : "",
                        res->checkpoint);
            }
            if (interrupted)
                st = dt_error_set(DT_ERR_ABORTED, "interrupted after step %" PRId64 "%s%s", t->step,
                                  res->checkpoint[0] ? "; checkpoint " : "", res->checkpoint);
            break;
        }
    }
    /* An interruption still gets the summary below; its status is returned
     * at the end. */
    dt_status stop_st = st;
    char stop_msg[512] = "";
    if (stop_st != DT_OK)
        snprintf(stop_msg, sizeof stop_msg, "%s", dt_last_error());
    res->last_step = t->step;
    res->seconds = dt_now() - loop_t0;
    /* The weights file and the sample need the whole model on rank 0. */
    dt_gpt *whole = NULL;
    bool assemble = c->run_dir || (c->sample_tokens > 0 && t->step == c->steps);
    if (assemble) {
        /* Every parameter in place for the assembly and rank 0's sample
         * (ZeRO 3 gathers them all: the model's hooks then find each
         * block resident and communicate nothing). */
        DT_CHECK_GOTO(dt_grad_sync_gather_params(t->sync, true), st, fail);
        weights_changed(t, false); /* e.g. the parameter server's model after an early stop */
        DT_CHECK_GOTO(dt__train_whole_model(t, &whole), st, fail);
    }
    st = dt__train_dp_mode_report(t, stderr); /* collective: the strategy's summary */
    if (st == DT_OK)
        st = dt__trace_finish(t); /* collective: RUN_DIR/trace/ */
    if (st == DT_OK)
        st = dt__breakdown_collect(t); /* collective: every rank's memory */
    if (st == DT_OK)
        st = finish_report(t, d, res, run_steps, &s, whole);
    if (whole != t->m)
        dt_gpt_destroy(whole);
    if (assemble) {
        dt_status back = dt_grad_sync_gather_params(t->sync, false); /* local */
        st = st != DT_OK ? st : back;
    }
    if (st != DT_OK)
        goto fail;
    if (stop_st != DT_OK)
        st = dt_error_set(stop_st, "%s", stop_msg);

fail:;
    /* Cleanup (closing the group) may log or set errors of its own: keep
     * the message of the failure that brought us here. */
    char msg[1024] = "";
    if (st != DT_OK)
        snprintf(msg, sizeof msg, "%s", dt_last_error());
    display_close(d);
    dt_free(d);
    dt__train_free(t);
    if (st != DT_OK && msg[0])
        dt_error_set(st, "%s", msg);
    return st;
}
