/*
 * schedule.c — learning-rate schedules: constant, linear, cosine and inverse
 * square root, each after an optional linear warmup.
 *
 * A schedule is a pure function of the 0-based step, so a resumed run only
 * needs the step number to continue the curve exactly. Everything is
 * computed in double and rounded to float once.
 */
#include "dtrain/optim.h"

#include <math.h>

const char *const dt_schedule_names[DT_SCHED_COUNT] = {
    [DT_SCHED_CONSTANT] = "constant",
    [DT_SCHED_LINEAR] = "linear",
    [DT_SCHED_COSINE] = "cosine",
    [DT_SCHED_INVSQRT] = "invsqrt",
};
_Static_assert(sizeof dt_schedule_names / sizeof dt_schedule_names[0] == DT_SCHED_COUNT,
               "one name per schedule kind");

dt_status dt_schedule_validate(const dt_schedule *s) {
    if ((unsigned)s->kind >= DT_SCHED_COUNT)
        return dt_error_set(DT_ERR_INVALID, "schedule: unknown kind %d", (int)s->kind);
    if (!(isfinite(s->base_lr) && s->base_lr >= 0.0f))
        return dt_error_set(DT_ERR_INVALID, "schedule: base_lr %g must be finite and >= 0",
                            (double)s->base_lr);
    if (!(isfinite(s->min_lr) && s->min_lr >= 0.0f && s->min_lr <= s->base_lr))
        return dt_error_set(DT_ERR_INVALID, "schedule: min_lr %g must be in [0, base_lr = %g]",
                            (double)s->min_lr, (double)s->base_lr);
    if (s->warmup < 0)
        return dt_error_set(DT_ERR_INVALID, "schedule: warmup %lld must be >= 0",
                            (long long)s->warmup);
    if ((s->kind == DT_SCHED_LINEAR || s->kind == DT_SCHED_COSINE) && s->total <= s->warmup)
        return dt_error_set(DT_ERR_INVALID,
                            "schedule: %s decay needs total steps (%lld) > warmup (%lld)",
                            dt_schedule_names[s->kind], (long long)s->total, (long long)s->warmup);
    return DT_OK;
}

float dt_schedule_lr(const dt_schedule *s, int64_t step) {
    double base = s->base_lr, min = s->min_lr;
    if (step < 0)
        step = 0;
    if (step < s->warmup)
        return (float)(base * (double)(step + 1) / (double)s->warmup);
    double r = 0.0;
    if (s->total > s->warmup) {
        r = (double)(step - s->warmup) / (double)(s->total - s->warmup);
        r = r > 1.0 ? 1.0 : r;
    }
    switch (s->kind) {
    case DT_SCHED_CONSTANT: return (float)base;
    case DT_SCHED_LINEAR: return (float)(min + (base - min) * (1.0 - r));
    case DT_SCHED_COSINE: return (float)(min + (base - min) * 0.5 * (1.0 + cos(M_PI * r)));
    case DT_SCHED_INVSQRT: {
        double w = s->warmup > 1 ? (double)s->warmup : 1.0;
        double lr = base * sqrt(w / (double)(step + 1));
        return (float)(lr > min ? lr : min);
    }
    case DT_SCHED_COUNT: break;
    }
    DT_ASSERT(!"unknown schedule kind");
    return 0.0f;
}
