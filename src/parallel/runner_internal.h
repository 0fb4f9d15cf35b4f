/*
 * runner_internal.h — the table of functions behind dt_runner (parallel.h,
 * "Runners"). An implementation embeds dt_runner as its first member.
 */
#ifndef DTRAIN_PARALLEL_RUNNER_INTERNAL_H
#define DTRAIN_PARALLEL_RUNNER_INTERNAL_H

#include "dtrain/parallel.h"

#include <string.h>

typedef struct dt__runner_ops {
    dt_status (*step)(dt_runner *r, const dt_run_batch *b, dt_grad_sync *sync, dt_run_result *out);
    dt_status (*eval)(dt_runner *r, const int32_t *inputs, const int32_t *targets, int B, int T,
                      double *loss);
    const char *(*name)(const dt_runner *r);
    void (*destroy)(dt_runner *r);
} dt__runner_ops;

struct dt_runner {
    const dt__runner_ops *ops;
};

#endif
