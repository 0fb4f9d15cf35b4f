/*
 * progress.c — what rank 0 shows while training.
 *
 * On a terminal: one line redrawn in place ("\r" + erase-line) with
 * step/total, the loss and a sparkline of recent losses, the learning rate,
 * tokens/s, MFU, the step time split into compute and exposed (not hidden)
 * communication, the loss scale and skipped steps (when loss scaling is on)
 * and the ETA. Elsewhere (a log file, CI): a plain line every
 * `every` steps and on the last step, so logs stay readable and short.
 */
#include "dtrain/train.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

#define SPARK_N 16 /* losses shown in the sparkline */

struct dt_progress {
    FILE *f;                /* where lines go */
    bool tty;               /* redraw one line in place */
    int64_t total;          /* steps of the run */
    int64_t every;          /* plain-mode period */
    double t0;              /* time of the first update */
    int64_t step0;          /* step of the first update (a resumed run) */
    double val_loss;        /* last validation loss seen, NaN if none */
    double losses[SPARK_N]; /* ring of recent losses */
    size_t nloss;           /* losses seen (ring holds min(nloss, SPARK_N)) */
    bool drawn;             /* a live line is on the screen */
};

dt_status dt_progress_create(dt_progress **out, FILE *f, bool tty, int64_t total_steps,
                             int64_t every) {
    dt_progress *p = dt_calloc(1, sizeof *p);
    if (!p)
        return DT_ERR_NOMEM;
    p->f = f;
    p->tty = tty;
    p->total = total_steps;
    p->every = every > 0 ? every : (total_steps >= 20 ? total_steps / 20 : 1);
    p->val_loss = NAN;
    p->step0 = -1;
    *out = p;
    return DT_OK;
}

void dt_progress_destroy(dt_progress *p) { dt_free(p); }

char *dt_sparkline(char *buf, size_t len, const double *v, size_t n) {
    static const char *const bars[8] = {"▁", "▂", "▃", "▄", "▅", "▆", "▇", "█"};
    double lo = INFINITY, hi = -INFINITY;
    for (size_t i = 0; i < n; i++) {
        // cppcheck-suppress uninitvar ; callers pass n initialised values
        if (isfinite(v[i])) {
            lo = v[i] < lo ? v[i] : lo;
            hi = v[i] > hi ? v[i] : hi;
        }
    }
    size_t pos = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < n && pos + 4 <= len; i++) {
        int level = 0;
        if (!isfinite(v[i]))
            level = 7;
        else if (hi > lo)
            level = (int)((v[i] - lo) / (hi - lo) * 7.0 + 0.5);
        memcpy(buf + pos, bars[level], 3);
        pos += 3;
        buf[pos] = '\0';
    }
    return buf;
}

static void fmt_duration(char *b, size_t len, double s) {
    if (!isfinite(s) || s < 0)
        snprintf(b, len, "?");
    else if (s < 60)
        snprintf(b, len, "%.0fs", s);
    else if (s < 3600)
        snprintf(b, len, "%dm%02ds", (int)s / 60, (int)s % 60);
    else
        snprintf(b, len, "%dh%02dm", (int)s / 3600, (int)s % 3600 / 60);
}

static void fmt_rate(char *b, size_t len, double r) {
    if (r >= 1e6)
        snprintf(b, len, "%.2fM", r / 1e6);
    else if (r >= 1e3)
        snprintf(b, len, "%.1fk", r / 1e3);
    else
        snprintf(b, len, "%.0f", r);
}

/* A loss scale: "2^16" when it is a power of two (the usual case: the
 * defaults start at 2^16 and move by factors of 2), "1e+30" otherwise. */
static void fmt_scale(char *b, size_t len, double s) {
    int e;
    if (isfinite(s) && s > 0 && frexp(s, &e) == 0.5)
        snprintf(b, len, "2^%d", e - 1);
    else
        snprintf(b, len, "%.3g", s);
}

static int term_width(FILE *f) {
    struct winsize ws;
    if (ioctl(fileno(f), TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0)
        return ws.ws_col;
    return 160; /* not a terminal (a test): assume a wide one */
}

void dt_progress_update(dt_progress *p, const dt_step_metrics *s) {
    double now = dt_now();
    if (p->step0 < 0) {
        /* The first step's own time is in step_ms; count from its start. */
        p->t0 = now - s->step_ms * 1e-3;
        p->step0 = s->step - 1;
    }
    p->losses[p->nloss++ % SPARK_N] = s->loss;
    if (isfinite(s->val_loss))
        p->val_loss = s->val_loss;
    double per_step = (now - p->t0) / (double)(s->step - p->step0);
    char eta[32], rate[32], val[32] = "", mfu[32] = "", scale[80] = "";
    fmt_duration(eta, sizeof eta, per_step * (double)(p->total - s->step));
    fmt_rate(rate, sizeof rate, s->tokens_per_s);
    if (isfinite(p->val_loss))
        snprintf(val, sizeof val, " val %.4f", p->val_loss);
    if (isfinite(s->mfu))
        snprintf(mfu, sizeof mfu, " MFU %.1f%%", 100.0 * s->mfu);
    if (isfinite(s->loss_scale)) {
        char sc[32];
        fmt_scale(sc, sizeof sc, s->loss_scale);
        snprintf(scale, sizeof scale, "%sscale %s skipped %lld", p->tty ? " | " : "  ", sc,
                 (long long)s->skipped_steps);
    }
    bool last = s->step >= p->total;

    if (p->tty) {
        /* Ring in chronological order for the sparkline. */
        double seq[SPARK_N];
        size_t n = p->nloss < SPARK_N ? p->nloss : SPARK_N;
        for (size_t i = 0; i < n; i++)
            seq[i] = p->losses[(p->nloss - n + i) % SPARK_N];
        char spark[SPARK_N * 3 + 1];
        dt_sparkline(spark, sizeof spark, seq, n);
        char head[64], tail[400], tpc[64] = "";
        int o = 0;
        if (isfinite(s->tp_comm_ms))
            o = snprintf(tpc, sizeof tpc, " + model %.0f", s->tp_comm_ms);
        if (isfinite(s->pp_bubble))
            snprintf(tpc + o, sizeof tpc - (size_t)o, " | bubble %.0f%%", 100 * s->pp_bubble);
        int hl = snprintf(head, sizeof head, "step %lld/%lld | loss %.4f", (long long)s->step,
                          (long long)p->total, s->loss);
        int tl = snprintf(tail, sizeof tail,
                          "%s | lr %.2e%s | %s tok/s%s | %.0f ms: compute %.0f + exposed comm "
                          "%.0f%s | ETA %s",
                          val, s->lr, scale, rate, mfu, s->step_ms, s->compute_ms,
                          s->exposed_comm_ms, tpc, eta);
        /* The sparkline follows the loss when the terminal is wide enough;
         * a wrapped line could not be redrawn in place. */
        int cols = term_width(p->f);
        if (hl + 1 + (int)n + tl < cols)
            fprintf(p->f, "\r\033[K%s %s%s", head, spark, tail);
        else
            fprintf(p->f, "\r\033[K%s%.*s", head, cols - 1 - hl > 0 ? cols - 1 - hl : 0, tail);
        p->drawn = true;
        if (last) {
            fputc('\n', p->f);
            p->drawn = false;
        }
        fflush(p->f);
        return;
    }
    if (s->step % p->every != 0 && !last && s->step != p->step0 + 1)
        return;
    if (isfinite(p->val_loss))
        snprintf(val, sizeof val, "  val %.4f", p->val_loss);
    /* The norm is inf/nan only on a step loss scaling skipped. */
    char gn[32];
    if (isfinite(s->grad_norm))
        snprintf(gn, sizeof gn, "%.3f", s->grad_norm);
    else
        snprintf(gn, sizeof gn, "%s", s->skipped ? "skip" : "nan");
    char tpc[64] = "";
    int o = 0;
    if (isfinite(s->tp_comm_ms))
        o = snprintf(tpc, sizeof tpc, ", model %.1f", s->tp_comm_ms);
    if (isfinite(s->pp_bubble))
        snprintf(tpc + o, sizeof tpc - (size_t)o, ", bubble %.1f%%", 100 * s->pp_bubble);
    fprintf(p->f,
            "step %6lld/%lld  loss %.4f%s  lr %.3e  gnorm %s%s  %s tok/s%s  %.1f ms (compute "
            "%.1f, comm %.1f, exposed %.1f%s)  ETA %s\n",
            (long long)s->step, (long long)p->total, s->loss, val, s->lr, gn, scale, rate, mfu,
            s->step_ms, s->compute_ms, s->comm_ms, s->exposed_comm_ms, tpc, eta);
    fflush(p->f);
}

void dt_progress_finish(dt_progress *p) {
    if (p && p->tty && p->drawn) {
        fputc('\n', p->f);
        fflush(p->f);
        p->drawn = false;
    }
}
