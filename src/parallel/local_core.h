/*
 * local_core.h — what local SGD and gossip share (parallel.h, "Beyond
 * synchronous data parallelism"): a step on this replica's own gradients
 * (no gradient communication), the replica's own parameters and optimizer
 * state as one flat float state for checkpoints, and in-place averaging of
 * float buffers over the replica group.
 *
 * Ownership: the core borrows the group, the buffers and the optimizer.
 */
#ifndef DTRAIN_PARALLEL_LOCAL_CORE_H
#define DTRAIN_PARALLEL_LOCAL_CORE_H

#include "sync_internal.h"

typedef struct dt__local_core {
    dt_group *g;       /* borrowed; NULL: a single replica */
    int replica, dp;   /* this rank in g, and its size */
    float *params;     /* (n) borrowed */
    float *grads;      /* (n) borrowed */
    size_t n;          /* floats */
    dt_optimizer *opt; /* borrowed: owns [0, n) */
    dt__norm_ranges norm;
    /* Per step. */
    dt_sync_step step;
    int backwards; /* begin_backward calls this step */
} dt__local_core;

/* Checks that opt owns all of [0, n) (`who` names the strategy in the error). */
dt_status dt__local_init(dt__local_core *c, const char *who, dt_group *g, float *params,
                         float *grads, size_t n, dt_optimizer *opt, const dt_range *norm_ranges,
                         size_t nnorm);
void dt__local_free(dt__local_core *c);

void dt__local_begin_step(dt__local_core *c, const dt_sync_step *st);
/* The step's first backward overwrites, the others add to it. */
dt_grad_mode dt__local_begin_backward(dt__local_core *c);
/* Unscale this replica's gradients (loss scaling: report inf/nan) and count
 * their sum of squares: divided by the replica count on a step the loop
 * agrees on over the world (`agreed`), else whole (parallel.h). */
void dt__local_finish(dt__local_core *c, bool agreed, dt_sync_result *out);
/* Clip-scale and step the optimizer on this replica's gradients. */
dt_status dt__local_apply(dt__local_core *c, bool skip, float clip_scale);

/* This replica's parameters and optimizer state (per-parameter and
 * per-tensor) as floats: how many, a copy out, and back in. */
size_t dt__local_state_floats(const dt__local_core *c);
void dt__local_state_get(const dt__local_core *c, float *dst);
void dt__local_state_set(dt__local_core *c, const float *src);

/* Average x[0, count) over the group in place (collective; no-op for one
 * replica). Adds the time to *ms. */
dt_status dt__local_average(dt__local_core *c, float *x, size_t count, double *ms);
/* Average the optimizer state (every per-parameter and per-tensor state). */
dt_status dt__local_average_optim(dt__local_core *c, double *ms);

/* The bytes one rank sends to average `count` floats: a ring allreduce
 * sends 2 (N - 1) / N of the vector. */
uint64_t dt__local_ring_bytes(const dt__local_core *c, size_t count);

#endif
