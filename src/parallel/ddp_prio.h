/*
 * ddp_prio.h — internal: DDP's critical-path-first schedule of gradient
 * communication (--comm-priority critical), used by ddp.c. See ddp_prio.c.
 */
#ifndef DTRAIN_PARALLEL_DDP_PRIO_H
#define DTRAIN_PARALLEL_DDP_PRIO_H

#include "dtrain/parallel.h"

typedef struct dt__prio dt__prio;

/* A scheduler for the flat buffer grads (n floats) cut into nb buckets of
 * `per` floats numbered from the end (bucket i = [n - (i+1) per, n - i per),
 * clipped at 0), sending pieces of at most piece floats over g (size > 1).
 * Starts its thread. */
dt_status dt__prio_create(dt__prio **out, dt_group *g, float *grads, size_t n, size_t per,
                          size_t nb, size_t piece);
/* Stops the thread (a step in progress is abandoned: peers time out). */
void dt__prio_destroy(dt__prio *p);
/* Start a step: nothing is final yet. The previous step must be complete
 * (dt__prio_wait_all). */
void dt__prio_begin(dt__prio *p);
/* grads[from, n) are final on this rank (from only decreases in a step). */
void dt__prio_ready(dt__prio *p, size_t from);
/* Whether bucket i is averaged (with its completion time); never blocks. */
bool dt__prio_done(dt__prio *p, size_t i, double *t_done);
/* Block until bucket i is averaged (bounded: every collective is bounded by
 * DT_TIMEOUT); returns the step's status so far. */
dt_status dt__prio_wait(dt__prio *p, size_t i, double *t_done);
/* The pieces of the last (or current) step in the order they were sent:
 * [begin, end) and when each started and finished (dt_now); and the number
 * of readiness agreements. Valid until the next begin. */
const dt_ddp_piece *dt__prio_log(const dt__prio *p, size_t *count, int *agreements);

#endif
