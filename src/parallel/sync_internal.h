/*
 * sync_internal.h — the table of functions behind dt_grad_sync (parallel.h).
 * A strategy defines one `static const dt__sync_ops` and embeds
 * `dt_grad_sync` as the first member of its own struct; the public
 * dt_grad_sync_* functions (sync.c) dispatch through the table.
 */
#ifndef DTRAIN_PARALLEL_SYNC_INTERNAL_H
#define DTRAIN_PARALLEL_SYNC_INTERNAL_H

#include "dtrain/parallel.h"

typedef struct dt__sync_ops {
    const char *name; /* "ddp", ... */
    dt_status (*begin_step)(dt_grad_sync *s, const dt_sync_step *step);
    dt_grad_mode (*begin_backward)(dt_grad_sync *s, bool last_microbatch);
    void (*ready)(dt_grad_sync *s, size_t ready_from);
    dt_status (*finish)(dt_grad_sync *s, dt_sync_result *out);
    dt_status (*apply)(dt_grad_sync *s, bool skip, float clip_scale);
    dt_status (*replicate)(dt_grad_sync *s);
    dt_status (*check)(dt_grad_sync *s, int64_t step);
    void (*cost)(const dt_grad_sync *s, dt_sync_cost *out);
    void (*layout)(const dt_grad_sync *s, dt_sync_layout *out);
    size_t (*state_bytes)(const dt_grad_sync *s);
    const char *(*state_ident)(const dt_grad_sync *s);
    dt_status (*get_state)(const dt_grad_sync *s, void *buf, size_t len, float *unit);
    dt_status (*set_state)(dt_grad_sync *s, const void *buf, size_t len, float unit);
    void (*reset_state)(dt_grad_sync *s);
    void (*destroy)(dt_grad_sync *s);
    /* Optional (NULL: every parameter stays in place). */
    const dt_param_hooks *(*param_hooks)(const dt_grad_sync *s);
    dt_status (*gather_params)(dt_grad_sync *s, bool whole);
    dt_status (*hold_params)(dt_grad_sync *s, bool hold, bool written);
    /* Optional (NULL: apply communicates nothing). */
    void (*apply_report)(dt_grad_sync *s, dt_sync_result *out);
    /* Optional (NULL: every step is agreed). */
    bool (*agrees)(const dt_grad_sync *s, int64_t step);
} dt__sync_ops;

struct dt_grad_sync {
    const dt__sync_ops *ops;
};

/* The ranges of the gradient buffer a model-parallel rank counts in the
 * norm (the tensors it owns): a copy of `ranges` (n of them), or all of
 * [0, floats) when ranges is NULL. *out is freed with dt_free. */
typedef struct dt__norm_ranges {
    dt_range *r;
    size_t n;
} dt__norm_ranges;
dt_status dt__norm_ranges_init(dt__norm_ranges *out, const dt_range *ranges, size_t n,
                               size_t floats);
void dt__norm_ranges_free(dt__norm_ranges *nr);
/* The sum of squares of grads[begin, end) inside the ranges. */
double dt__norm_ranges_sumsq(const dt__norm_ranges *nr, const float *grads, size_t begin,
                             size_t end);

#endif
