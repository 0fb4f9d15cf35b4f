/*
 * optim_internal.h — what the optim files share with each other and with
 * tests: the per-range kernels behind the public steps, in their vector and
 * scalar forms, and the OpenMP split.
 *
 * Invariant: for every kernel, the vector form (AVX-512 with a masked tail)
 * and the scalar form give bit-identical results; tests/unit/test_optim.c
 * checks it. Both perform the same IEEE operations in the same order, and
 * this layer is compiled with -ffp-contract=off so no a*b+c is fused.
 */
#ifndef DTRAIN_OPTIM_INTERNAL_H
#define DTRAIN_OPTIM_INTERNAL_H

#include "dtrain/optim.h"

/* Ranges at least this long are split across OpenMP threads, in chunks of
 * DT__OPTIM_CHUNK elements (a multiple of 16 so chunks stay vector-aligned
 * relative to the range start). */
#define DT__OPTIM_PAR_MIN (1u << 16)
#define DT__OPTIM_CHUNK   (1u << 14)
/* dt_grad_sumsq adds fixed blocks of this many elements, then the block sums
 * in order, so the result does not depend on the thread count. */
#define DT__SUMSQ_BLOCK   (1u << 14)

/* The scalars of one AdamW step, computed once per call (in double, rounded
 * to float as PyTorch rounds its Python-float scalars). */
typedef struct dt__adamw_k {
    float decay;    /* 1 - lr * weight_decay */
    float b1, omb1; /* beta1, 1 - beta1 */
    float b2, omb2; /* beta2, 1 - beta2 */
    float bc2_sqrt; /* sqrt(1 - beta2^step) */
    float eps;      /* eps */
    float neg_step; /* -lr / (1 - beta1^step) */
} dt__adamw_k;

void dt__adamw_k_init(dt__adamw_k *k, float lr, const dt_adamw_config *c, int64_t step,
                      float weight_decay);
void dt__adamw_range_vec(float *p, const float *g, float *m, float *v, size_t n,
                         const dt__adamw_k *k);
void dt__adamw_range_scalar(float *p, const float *g, float *m, float *v, size_t n,
                            const dt__adamw_k *k);

void dt__sgd_range_vec(float *p, const float *g, float *b, size_t n, float lr, float momentum,
                       bool nesterov, float weight_decay);
void dt__sgd_range_scalar(float *p, const float *g, float *b, size_t n, float lr, float momentum,
                          bool nesterov, float weight_decay);

/* Sum of squares of at most DT__SUMSQ_BLOCK elements in a fixed lane order
 * (element i into lane i % 64; lanes added in order). */
double dt__sumsq_block_vec(const float *g, size_t n);
double dt__sumsq_block_scalar(const float *g, size_t n);

/* Optimizer state in a file on disk (offload.c): nstates buffers of count
 * floats, state[k] pointing into a shared mapping. The optimizer updates
 * the state in pieces of at most DT__OFFLOAD_PIECE floats, announcing each
 * (before: map it) and reporting it (updated: read ahead, write back, drop;
 * state offsets [s0, s1)), so the file streams through a window of memory;
 * step_end() reads ahead where the next step starts; settle() writes back
 * and drops everything (after a checkpoint touched it all). */
#define DT__OFFLOAD_PIECE ((size_t)1 << 20)
#define DT__OFFLOAD_AHEAD 8 /* pieces read ahead of the walk (page cache, not mapped) */
typedef struct dt__offload dt__offload;
dt_status dt__offload_open(dt__offload **out, const char *dir, size_t nstates, size_t count,
                           float **state);
void dt__offload_close(dt__offload *f);
void dt__offload_before(dt__offload *f, size_t s0, size_t s1);
void dt__offload_updated(dt__offload *f, size_t s0, size_t s1);
void dt__offload_step_end(dt__offload *f);
void dt__offload_settle(dt__offload *f);
size_t dt__offload_file_bytes(const dt__offload *f);

#endif /* DTRAIN_OPTIM_INTERNAL_H */
