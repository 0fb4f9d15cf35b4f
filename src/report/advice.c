/*
 * advice.c — the bottleneck rules (report.h, dt_run_advise;
 * docs/observability.md, "Advice"). Each rule reads the run's step
 * breakdown, its roofline and its collectives, fires above a threshold,
 * says what to change and estimates what that gains per step from the
 * run's own figures (and, for the pipeline, the schedule's theory; for
 * compression, the codec's bytes). The estimates are first-order: they
 * assume the rest of the step stays as it is.
 *
 *   rule            fires when                               expected gain
 *   straggler       a rank's compute > 1.25x the median     its excess over the median
 *                   and the others idle > 5% of a step
 *   exposed-comm    exposed communication > 20% of a step   3/4 of it (int8: 1/4 the bytes)
 *   pipeline-bubble measured bubble > 15%                   the bubble at twice the
 *                                                            micro-batches, from the theory
 *   memory-bound    kernels below the ridge > 15% of        near the memory roof: half their
 *                   kernel time                              time (fusion saves a read and a
 *                                                            write of each output); far below
 *                                                            it: their time above twice the
 *                                                            roof's
 *   gemm-efficiency matrix products < 50% of the peak       up to 60% of the peak
 *   slow-collective a collective below half its model's     the time above the model, at
 *                   bandwidth, >= 5% of a step exposed       most the exposed communication
 *   contention      kernels slower than their fastest call  that excess, at most the compute
 *                   by > 10% of a step (the cores are
 *                   shared: communication threads, other
 *                   processes)
 *   data            reading batches > 5% of a step          all of it
 *   optimizer       the update > 15% of a step, dp > 1      (dp-1)/dp of it (ZeRO-1)
 *   idle            idle > 15% of a step, no straggler      none estimated
 *                   and no pipeline bubble
 *   stale-peak      a kernel runs > 10% above the peak      none (MFU and the roofline
 *                                                            are relative to a wrong peak)
 */
#include "report_internal.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { F_COMPUTE, F_EXPOSED, F_OVERLAPPED, F_DATA, F_OPTIM, F_IDLE, F_STEP };

typedef struct advice_list {
    dt_advice *out;
    size_t max, n;
} advice_list;

static void add(advice_list *l, const char *rule, double gain_ms, double step_ms, const char *title,
                const char *fmt, ...) __attribute__((format(printf, 6, 7)));
static void add(advice_list *l, const char *rule, double gain_ms, double step_ms, const char *title,
                const char *fmt, ...) {
    if (l->n < l->max) {
        dt_advice *a = &l->out[l->n];
        memset(a, 0, sizeof *a);
        snprintf(a->rule, sizeof a->rule, "%s", rule);
        snprintf(a->title, sizeof a->title, "%s", title);
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(a->text, sizeof a->text, fmt, ap);
        va_end(ap);
        a->gain_ms = isfinite(gain_ms) && gain_ms > 0 ? gain_ms : 0;
        a->gain = step_ms > 0 ? a->gain_ms / step_ms : 0;
    }
    l->n++;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The mean over ranks of field k. */
static double mean_field(const dt_run *r, int k) {
    double s = 0;
    for (int i = 0; i < r->bd_ranks; i++)
        s += dt__run_bd(r, i, k);
    return r->bd_ranks ? s / r->bd_ranks : NAN;
}

static bool is_gemm(const char *name) { return strstr(name, "matmul") || strstr(name, "linear16"); }

/* Straggler: the slowest rank's compute against the median rank's. */
static bool rule_straggler(const dt_run *r, double step, advice_list *l) {
    if (r->bd_ranks < 2)
        return false;
    double *c = malloc((size_t)r->bd_ranks * sizeof *c);
    if (!c)
        return false;
    int worst = 0;
    for (int i = 0; i < r->bd_ranks; i++) {
        c[i] = dt__run_bd(r, i, F_COMPUTE) + dt__run_bd(r, i, F_DATA);
        if (c[i] > c[worst])
            worst = i;
    }
    double cw = c[worst];
    qsort(c, (size_t)r->bd_ranks, sizeof *c, cmp_double);
    double med = c[(r->bd_ranks - 1) / 2];
    free(c);
    if (!(med > 0) || !(cw > 1.25 * med))
        return false;
    double idle = 0;
    int others = 0;
    for (int i = 0; i < r->bd_ranks; i++)
        if (i != worst) {
            idle += dt__run_bd(r, i, F_IDLE);
            others++;
        }
    idle /= others;
    if (!(idle > 0.05 * step))
        return false;
    double gain = cw - med;
    char title[160];
    snprintf(title, sizeof title, "Rank %d is a straggler: %.2fx the median rank's compute", worst,
             cw / med);
    add(l, "straggler", gain, step, title,
        "Rank %d computes for %.1f ms per step against %.1f ms on the median rank (%.2fx); the "
        "other ranks wait %.1f ms per step for it (%.0f%% of their step). At the median speed "
        "the step would take about %.1f ms instead of %.1f ms. Look at rank %d's host (other "
        "processes on its cores, its clock frequency, its memory), give it fewer --threads "
        "competitors, or let the replicas run apart: --dp-mode local --sync-every 8 or "
        "--dp-mode ps (docs/async.md).",
        worst, cw, med, cw / med, idle, step > 0 ? 100 * idle / step : 0, step - gain, step, worst);
    return true;
}

static void rule_exposed(const dt_run *r, double step, advice_list *l) {
    double ex = mean_field(r, F_EXPOSED);
    if (!(step > 0) || !(ex > 0.2 * step))
        return;
    const char *codec = dt__rj_cfg_str(r, "compress", "none");
    double gain = 0.75 * ex;
    char title[160];
    snprintf(title, sizeof title, "Exposed communication is %.0f%% of the step", 100 * ex / step);
    if (codec && strcmp(codec, "none") != 0) {
        add(l, "exposed-comm", 0.5 * ex, step, title,
            "The ranks wait %.1f ms per step for communication (%.0f%% of %.1f ms) although "
            "the gradients are already compressed (--compress %s). A stronger codec "
            "(--compress powersgd:4 or topk:0.01 with --compress-start, docs/compress.md) or "
            "smaller --bucket-size so that more of it overlaps backward: about %.1f ms per step "
            "if half of it goes.",
            ex, 100 * ex / step, step, codec, 0.5 * ex);
        return;
    }
    add(l, "exposed-comm", gain, step, title,
        "The ranks wait %.1f ms per step for communication (%.0f%% of %.1f ms). --compress int8 "
        "sends a quarter of the bytes (validation loss within 0.2%% in docs/compress.md): "
        "predicted step %.1f ms (%.2fx); --compress powersgd:4 --compress-dense-below 30000 "
        "sends ~2%%. A smaller --bucket-size starts the first buckets earlier in backward.",
        ex, 100 * ex / step, step, step - gain, step / (step - gain));
}

static bool rule_bubble(const dt_run *r, double step, advice_list *l) {
    double b[4096];
    size_t n = 0;
    for (size_t i = 1; i < r->nsteps && n < 4096; i++)
        if (isfinite(r->steps[i].pp_bubble))
            b[n++] = r->steps[i].pp_bubble;
    if (n == 0)
        return false;
    qsort(b, n, sizeof *b, cmp_double);
    double bubble = b[n / 2];
    if (!(bubble > 0.15))
        return false;
    double P = (double)dt__rj_cfg_int(r, "pp", 1), M = (double)dt__rj_cfg_int(r, "accum", 1);
    if (P < 2)
        return false;
    double theory = (P - 1) / (M + P - 1), twice = (P - 1) / (2 * M + P - 1);
    /* The measured bubble scaled as the theory falls (the busy time stays). */
    double busy = step * (1 - bubble);
    double next = bubble * (theory > 0 ? twice / theory : 1);
    double step2 = busy / (1 - next);
    char title[160];
    snprintf(title, sizeof title, "The pipeline is idle %.0f%% of the step", 100 * bubble);
    add(l, "pipeline-bubble", step - step2, step, title,
        "The pipeline's bubble is %.1f%% (theory %.1f%% for %g stages and %g micro-batches). "
        "--micro-batches %g gives %.1f%% in theory: predicted step %.1f ms instead of %.1f ms; "
        "--pp-schedule interleaved:2 roughly halves the bubble for the same micro-batches "
        "(docs/pipeline.md).",
        100 * bubble, 100 * theory, P, M, 2 * M, 100 * twice, step2, step);
    return true;
}

/* Kernels per traced rank-step: time in ms. */
static double per_step_ms(const dt_run *r, double us) {
    double steps =
        (double)(r->traced_steps > 0 ? r->traced_steps : 1) * (r->world > 0 ? r->world : 1);
    return us * 1e-3 / steps;
}

static void rule_roofline(const dt_run *r, double step, advice_list *l) {
    if (!r->traced || r->nkernels == 0)
        return;
    double total = 0, membound = 0, gemm_us = 0, gemm_flops = 0;
    const run_kernel *top = NULL;
    double ridge = r->peak_flops > 0 && r->mem_bw > 0 ? r->peak_flops / r->mem_bw : NAN;
    for (size_t i = 0; i < r->nkernels; i++) {
        const run_kernel *k = &r->kernels[i];
        total += k->us;
        double ai = k->bytes > 0 ? k->flops / k->bytes : INFINITY;
        if (is_gemm(k->name)) {
            gemm_us += k->us;
            gemm_flops += k->flops;
        } else if (isfinite(ridge) ? ai < ridge : ai < 4) {
            membound += k->us;
            if (!top || k->us > top->us)
                top = k;
        }
    }
    if (total > 0 && top && membound > 0.15 * total) {
        double ms = per_step_ms(r, membound), top_ms = per_step_ms(r, top->us);
        double gbs = top->us > 0 ? top->bytes / (top->us * 1e-6) * 1e-9 : 0;
        /* The time the low-intensity kernels would take at the memory roof. */
        double roof_us = 0;
        for (size_t i = 0; r->mem_bw > 0 && i < r->nkernels; i++) {
            const run_kernel *k = &r->kernels[i];
            double ai = k->bytes > 0 ? k->flops / k->bytes : INFINITY;
            if (!is_gemm(k->name) && (isfinite(ridge) ? ai < ridge : ai < 4))
                roof_us += k->bytes / r->mem_bw * 1e6;
        }
        double roof_ms = per_step_ms(r, roof_us), at = roof_ms / ms;
        char title[160];
        if (r->mem_bw > 0 && at < 0.5) {
            snprintf(title, sizeof title,
                     "Low-intensity kernels take %.0f%% of the kernel time at %.0f%% of the "
                     "memory roof",
                     100 * membound / total, 100 * at);
            add(l, "memory-bound", ms - 2 * roof_ms, step, title,
                "Kernels below the roofline's ridge (GELU, LayerNorm, residual adds, casts) take "
                "%.1f ms per step, %.0f%% of the kernels' time, but moving their bytes at this "
                "machine's %.1f GB/s would take %.1f ms: memory does not hold them back, their "
                "arithmetic does (%s, the largest, %.1f ms per step, moves %.1f GB/s). Vectorised "
                "(AVX-512 where the CPU has it: --isa) or with a cheaper GELU they approach the "
                "roof; at half of it they would take %.1f ms. Fusing them into the neighbouring "
                "products saves their traffic after that.",
                ms, 100 * membound / total, r->mem_bw * 1e-9, roof_ms, top->name, top_ms, gbs,
                2 * roof_ms);
        } else {
            snprintf(title, sizeof title, "Memory-bound kernels take %.0f%% of the kernel time",
                     100 * membound / total);
            add(l, "memory-bound", 0.5 * ms, step, title,
                "Kernels below the roofline's ridge (GELU, LayerNorm, residual adds, casts) take "
                "%.1f ms per step, %.0f%% of the kernels' time; the largest is %s, %.1f ms per "
                "step at %.1f GB/s%s. They read and write whole activations: fusing them into "
                "the neighbouring matrix products (the bias and GELU into c_fc's epilogue, the "
                "residual add into the next LayerNorm) removes a read and a write of each, about "
                "%.1f ms per step. In %s the activations are %s bytes per value.",
                ms, 100 * membound / total, top->name, top_ms, gbs,
                r->mem_bw > 0 ? "" : " (no memory bandwidth measured: dtrain bench memcpy)",
                0.5 * ms, r->precision, !strcmp(r->precision, "fp32") ? "4" : "2");
        }
    }
    if (gemm_us > 0 && r->peak_flops > 0) {
        double achieved = gemm_flops / (gemm_us * 1e-6), frac = achieved / r->peak_flops;
        if (frac < 0.5) {
            double ms = per_step_ms(r, gemm_us), at60 = ms * frac / 0.6;
            char title[160];
            snprintf(title, sizeof title, "Matrix products reach %.0f%% of the peak", 100 * frac);
            add(l, "gemm-efficiency", ms - at60, step, title,
                "The matrix products run at %.1f GFLOP/s, %.0f%% of this machine's measured "
                "%s peak (%.1f GFLOP/s per rank), for %.1f ms per step. Small products do not "
                "fill the cores: a larger --batch or --seq per rank (or fewer ranks with more "
                "--threads each) raises it; at 60%% of the peak they would take %.1f ms.",
                achieved * 1e-9, 100 * frac, r->precision, r->peak_flops * 1e-9, ms, at60);
        }
    }
}

static void rule_collectives(const dt_run *r, double step, advice_list *l) {
    const run_coll *worst = NULL;
    double worst_excess = 0;
    for (size_t i = 0; i < r->ncolls; i++) {
        const run_coll *c = &r->colls[i];
        if (!(c->model > 0) || c->count == 0)
            continue;
        double mean = c->us / (double)c->count;
        if (mean < 2 * c->model)
            continue;
        double excess = per_step_ms(r, c->us - c->model * (double)c->count);
        if (excess > worst_excess) {
            worst_excess = excess;
            worst = c;
        }
    }
    /* What overlapped backward costs nothing: only the exposed part can be won. */
    double exposed = mean_field(r, F_EXPOSED);
    if (isfinite(exposed))
        worst_excess = fmin(worst_excess, exposed);
    if (!worst || !(worst_excess > 0.05 * step))
        return;
    double mean = worst->us / (double)worst->count;
    char title[160];
    snprintf(title, sizeof title, "%s of %.0f KiB on %s runs at %.0f%% of its model's speed",
             worst->op, worst->size / 1024, worst->link, 100 * worst->model / mean);
    add(l, "slow-collective", worst_excess, step, title,
        "The %s of %.0f bytes over %d ranks (%s, %s) takes %.1f us on average, %.1f us by "
        "the alpha-beta model fitted to dtrain bench comm on this machine: %.1f ms per step "
        "above the model. When compute threads and communication share the cores the copies "
        "wait for a core (fewer --threads per rank leaves one free); DT_ALGO forces another "
        "algorithm to compare (docs/comm.md).",
        worst->op, worst->size, worst->ranks, worst->link, worst->algo, mean, worst->model,
        worst_excess);
}

/* Kernels that usually run fast but often wait: their calls above the
 * fastest one, summed, when that is a large part of the step. */
static void rule_contention(const dt_run *r, double step, advice_list *l) {
    if (!r->traced)
        return;
    double excess = 0, total = 0;
    const run_kernel *top = NULL;
    double top_x = 0;
    for (size_t i = 0; i < r->nkernels; i++) {
        const run_kernel *k = &r->kernels[i];
        double work = k->flops > 0 ? k->flops : k->bytes;
        if (!(k->best_rate > 0) || !(work > 0))
            continue;
        /* Calls of one name differ in shape (a block's products, the
         * head's): each is held to its work at the best rate any call of
         * the name reached; what is above twice that counts. */
        double x = fmax(0, k->us - 2 * work / k->best_rate);
        excess += x;
        total += k->us;
        if (x > top_x) {
            top_x = x;
            top = k;
        }
    }
    double ms = per_step_ms(r, excess);
    if (!top || !(step > 0) || !(ms > 0.1 * step))
        return;
    char title[160];
    snprintf(title, sizeof title, "Kernels wait for a core: %.0f%% of the step", 100 * ms / step);
    add(l, "contention", ms, step, title,
        "The kernels take %.1f ms per step more than twice what their work takes at the best "
        "rate their own calls reached (%s: %.1f ms per step above it, %.2fx its best rate on "
        "average): their threads were not running, another thread had the core. With ranks x "
        "--threads at or above the cores, the communication progress threads (which spin, "
        "DT_SPIN, then yield, DT_YIELD) and other processes take turns with the compute; fewer "
        "--threads per rank, fewer ranks per host or a quieter machine give that time back.",
        ms, top->name, per_step_ms(r, top_x),
        top->us * top->best_rate / (top->flops > 0 ? top->flops : top->bytes));
}

static void rule_data(const dt_run *r, double step, advice_list *l) {
    double d = mean_field(r, F_DATA);
    if (!(step > 0) || !(d > 0.05 * step))
        return;
    char title[160];
    snprintf(title, sizeof title, "Reading batches takes %.0f%% of the step", 100 * d / step);
    add(l, "data", d, step, title,
        "Each step waits %.1f ms for its micro-batches (%.0f%% of %.1f ms). A token file "
        "(dtrain data prepare ... -o data.tok) is memory-mapped and read in place; keep it on a "
        "local disk.",
        d, 100 * d / step, step);
}

static void rule_optimizer(const dt_run *r, double step, advice_list *l) {
    double o = mean_field(r, F_OPTIM);
    double info_dp = r->config ? dt__rj_num(json_object_get(r->config, "info"), "dp") : NAN;
    int dp = isfinite(info_dp) ? (int)info_dp : (int)dt__rj_cfg_int(r, "dp", 1);
    int zero = (int)dt__rj_cfg_int(r, "zero", 0);
    if (!(step > 0) || !(o > 0.15 * step) || dp < 2 || zero > 0)
        return;
    double gain = o * (dp - 1) / dp;
    char title[160];
    snprintf(title, sizeof title, "The optimizer takes %.0f%% of the step", 100 * o / step);
    add(l, "optimizer", gain, step, title,
        "The update takes %.1f ms per step on every one of the %d replicas, each doing the same "
        "work. --zero 1 shards it: each replica updates 1/%d of the parameters (and keeps 1/%d "
        "of the optimizer state), about %.1f ms instead (docs/zero.md).",
        o, dp, dp, dp, o / dp);
}

static void rule_idle(const dt_run *r, double step, bool explained, advice_list *l) {
    double idle = mean_field(r, F_IDLE);
    if (explained || !(step > 0) || !(idle > 0.15 * step))
        return;
    char title[160];
    snprintf(title, sizeof title, "The ranks are idle %.0f%% of the step", 100 * idle / step);
    add(l, "idle", 0, step, title,
        "%.1f ms per step is neither compute, communication, data nor the optimizer: waiting "
        "for another rank at the step's end or, in a pipeline, for the stage before. The "
        "timeline shows where; the machine may be oversubscribed (ranks x --threads above its "
        "cores).",
        idle);
}

static void rule_stale_peak(const dt_run *r, double step, advice_list *l) {
    if (!r->traced || !(r->peak_flops > 0))
        return;
    const run_kernel *top = NULL;
    double best = 0;
    for (size_t i = 0; i < r->nkernels; i++) {
        const run_kernel *k = &r->kernels[i];
        double perf = k->us > 0 ? k->flops / (k->us * 1e-6) : 0;
        if (perf > best) {
            best = perf;
            top = k;
        }
    }
    if (!top || !(best > 1.1 * r->peak_flops))
        return;
    char title[160];
    snprintf(title, sizeof title, "The peak MFU is measured against is too low");
    add(l, "stale-peak", 0, step, title,
        "%s reaches %.1f GFLOP/s per rank, %.0f%% of the %s peak the run used (%.1f GFLOP/s, "
        "measured once and cached, perhaps while the machine was busy): MFU and the roofline "
        "read too high. `dtrain bench peak` measures it again; --peak-flops gives it.",
        top->name, best * 1e-9, 100 * best / r->peak_flops, r->precision, r->peak_flops * 1e-9);
}

static int cmp_advice(const void *a, const void *b) {
    double x = ((const dt_advice *)a)->gain_ms, y = ((const dt_advice *)b)->gain_ms;
    return x > y ? -1 : x < y;
}

size_t dt_run_advise(const dt_run *r, dt_advice *out, size_t max) {
    advice_list l = {out, max, 0};
    double step = dt__run_step_ms(r);
    bool straggler = rule_straggler(r, step, &l);
    rule_exposed(r, step, &l);
    bool bubble = rule_bubble(r, step, &l);
    rule_roofline(r, step, &l);
    rule_collectives(r, step, &l);
    rule_contention(r, step, &l);
    rule_data(r, step, &l);
    rule_optimizer(r, step, &l);
    rule_idle(r, step, straggler || bubble, &l);
    rule_stale_peak(r, step, &l);
    size_t n = l.n < max ? l.n : max;
    qsort(out, n, sizeof *out, cmp_advice);
    return l.n;
}
