/*
 * optim_internal.h — what the optim files share with each other and with
 * tests: the per-range kernels behind the public steps, in their vector and
 * scalar forms, and the OpenMP split.
 *
 * Invariant: for every kernel, the vector form (AVX-512 with a masked tail,
 * or AVX2 with a scalar tail in a build without AVX-512) and the scalar form give bit-identical
 * results; tests/unit/test_optim.c checks it. Both perform the same IEEE operations in the same
 * order, and this layer is compiled with -ffp-contract=off so no a*b+c is fused.
 */
#ifndef DTRAIN_OPTIM_INTERNAL_H
#define DTRAIN_OPTIM_INTERNAL_H

#include "dtrain/optim.h"
#include "dtrain/tensor.h" /* dt_isa(): DT_ISA caps the kernels' instruction set */

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

/* A compute-copy callback and where the range handed to a step starts in
 * the caller's buffer: after each chunk [off, off + len) of the range is
 * updated, fn(user, params + off, at + off, len). fn NULL: nothing. */
typedef struct dt__copy {
    dt_optim_copy_fn fn;
    void *user;
    size_t at;
} dt__copy;

/* dt_adamw_step / dt__radam_step / dt_sgd_step, calling cp after each
 * chunk (cp may be NULL). */
void dt__adamw_step_copy(float *params, const float *grads, float *m, float *v, size_t n, float lr,
                         const dt_adamw_config *c, int64_t step, float weight_decay,
                         const dt__copy *cp);
void dt__sgd_step_copy(float *params, const float *grads, float *momentum_buf, size_t n, float lr,
                       float momentum, bool nesterov, float weight_decay, const dt__copy *cp);

/* Sum of squares of at most DT__SUMSQ_BLOCK elements in a fixed lane order
 * (element i into lane i % 64; lanes added in order). */
double dt__sumsq_block_vec(const float *g, size_t n);
double dt__sumsq_block_scalar(const float *g, size_t n);

/* Whether the vector forms run: in a build with AVX-512, its forms when
 * dt_isa() (DT_ISA) allows AVX-512; in a build without (portable, or an
 * AVX2 host), AdamW's and SGD's AVX2 forms (the others' "vector" forms are
 * their scalar loops) when dt_isa() allows AVX2. The forms agree bit for
 * bit, so this only picks a speed. */
static inline bool dt__optim_vec(void) {
#ifdef __AVX512F__
    return dt_isa() >= DT_ISA_AVX512;
#else
    return dt_isa() >= DT_ISA_AVX2;
#endif
}

/* ---- lane sums: the per-tensor statistics ------------------------------ */
/* Sums accumulate in double over 16 lanes (element i of a call in lane
 * i % 16) and the lanes are added in order at the end, in the vector and the
 * scalar form alike, so a sum depends only on the data and on where the
 * call's range starts (the owned pieces are fixed by the layout). */
#define DT__LANES 16
typedef struct dt__lanes {
    double l[DT__LANES];
} dt__lanes;
double dt__lanes_total(const dt__lanes *a);
/* a += x[i] (sum) or x[i]^2 (sumsq), each over n elements. */
void dt__lanes_sum(dt__lanes *a, const float *x, size_t n, bool squares);
void dt__lanes_sum_scalar(dt__lanes *a, const float *x, size_t n, bool squares);

/* ---- RAdam (PyTorch 1.13's single-tensor path, decoupled decay) -------- */
typedef struct dt__radam_k {
    float decay;    /* 1 - lr * weight_decay */
    float b1, omb1; /* beta1, 1 - beta1 */
    float b2, omb2; /* beta2, 1 - beta2 */
    float bc1;      /* 1 - beta1^step */
    float lr;       /* lr */
    float sbc2;     /* sqrt(1 - beta2^step) */
    float eps;
    float rect;   /* the variance rectification term r_t */
    bool rectify; /* rho_t > 5: the adaptive step; else the momentum step */
} dt__radam_k;
void dt__radam_k_init(dt__radam_k *k, float lr, const dt_adamw_config *c, int64_t step,
                      float weight_decay);
/* RAdam on a range, split over OpenMP threads as dt_adamw_step is; cp as
 * dt__adamw_step_copy's (may be NULL). */
void dt__radam_step(float *params, const float *grads, float *m, float *v, size_t n, float lr,
                    const dt_adamw_config *c, int64_t step, float weight_decay, const dt__copy *cp);
void dt__radam_range_vec(float *p, const float *g, float *m, float *v, size_t n,
                         const dt__radam_k *k);
void dt__radam_range_scalar(float *p, const float *g, float *m, float *v, size_t n,
                            const dt__radam_k *k);

/* ---- LAMB (You et al. 2020) -------------------------------------------- */
/* u = (m / bc1) / (sqrt(v / bc2) + eps) + wd * p, the AdamW direction plus
 * decay; p -= lr * trust * u with trust = |p| / |u| per tensor. */
typedef struct dt__lamb_k {
    float b1, omb1, b2, omb2;
    float bc1, bc2; /* 1 - beta^step (bc2 = 1 once v is frozen) */
    float eps;
    float wd;
} dt__lamb_k;
void dt__lamb_k_init(dt__lamb_k *k, const dt_adamw_config *c, int64_t step, float weight_decay,
                     bool frozen);
/* Moments from g (m = b1 m + (1 - b1) g; v likewise unless frozen, b2 = 1),
 * and the sums of p^2 and u^2 into pp and uu. With g NULL the moments are
 * left alone (1-bit LAMB: m arrived premixed). */
void dt__lamb_moments_vec(const float *p, const float *g, float *m, float *v, size_t n,
                          const dt__lamb_k *k, dt__lanes *pp, dt__lanes *uu);
void dt__lamb_moments_scalar(const float *p, const float *g, float *m, float *v, size_t n,
                             const dt__lamb_k *k, dt__lanes *pp, dt__lanes *uu);
/* p += neg_step * u, u recomputed from m, v and p as above. */
void dt__lamb_apply_vec(float *p, const float *m, const float *v, size_t n, const dt__lamb_k *k,
                        float neg_step);
void dt__lamb_apply_scalar(float *p, const float *m, const float *v, size_t n, const dt__lamb_k *k,
                           float neg_step);

/* ---- LARS (You et al. 2017, as timm's Lars) ----------------------------- */
/* d = (g + wd p) * trust; b = momentum b + d; d = nesterov ? d + momentum b
 * : b; p -= lr d. */
void dt__lars_range_vec(float *p, const float *g, float *b, size_t n, float lr, float momentum,
                        bool nesterov, float wd, float trust);
void dt__lars_range_scalar(float *p, const float *g, float *b, size_t n, float lr, float momentum,
                           bool nesterov, float wd, float trust);

/* ---- Adafactor ----------------------------------------------------------- */
/* u = g * rf * cf[j] (factored: rf = 1/sqrt(R_i / mean R), cf = 1/sqrt(C))
 * or u = g / sqrt(V) (vectors), then p -= the scaled update. `sq` adds
 * u^2 into uu; `apply` writes: u *= scale (1 / max(1, RMS(u) / clip) *
 * lr_t), m = b1 m + (1 - b1) u (with momentum), p += -wd lr_t p, p -= u. */
typedef struct dt__adafactor_k {
    float scale;  /* lr_t / max(1, RMS(u) / clip_threshold) */
    float b1;     /* first moment (0: none) */
    float omb1;   /* 1 - b1 */
    float neg_wd; /* -weight_decay * lr_t */
} dt__adafactor_k;
void dt__adafactor_row_vec(float *p, const float *g, float *m, size_t n, float rf, const float *cf,
                           const dt__adafactor_k *k, dt__lanes *uu);
void dt__adafactor_row_scalar(float *p, const float *g, float *m, size_t n, float rf,
                              const float *cf, const dt__adafactor_k *k, dt__lanes *uu);
/* Vectors: V = b2t V + (1 - b2t) (g^2 + eps1) when update_v, then as above
 * with cf = 1 / sqrt(V). */
void dt__adafactor_vec_vec(float *p, const float *g, float *v, float *m, size_t n, float b2t,
                           float omb2t, float eps1, bool update_v, const dt__adafactor_k *k,
                           dt__lanes *uu);
void dt__adafactor_vec_scalar(float *p, const float *g, float *v, float *m, size_t n, float b2t,
                              float omb2t, float eps1, bool update_v, const dt__adafactor_k *k,
                              dt__lanes *uu);
/* colsum[j] += g[j]^2 (in double) for one row segment; returns its sum. */
double dt__adafactor_colsq_vec(double *colsum, const float *g, size_t n);
double dt__adafactor_colsq_scalar(double *colsum, const float *g, size_t n);

/* ---- 8-bit AdamW --------------------------------------------------------- */
/*
 * Block-wise quantisation with an 8-bit floating-point code relative to the
 * block's absolute maximum A (a float), rounded to nearest:
 *   m: sign + E4M3: magnitude code c = 8E + F; E >= 1: (1 + F/8) 2^(E-15),
 *      E = 0: F 2^-17; codes up to 120 (= 1.0), so |m| / A in [0, 1].
 *   v: stored as r = sqrt(v), unsigned E3M5: c = 32E + F; E >= 1:
 *      (1 + F/32) 2^(E-7), E = 0: F 2^-11 (never 0 for r > 0); codes up
 *      to 224 (= 1.0).
 * The element at the maximum codes exactly 1.0, so dequantising gives A
 * back and quantising the dequantised values gives the same codes: a
 * checkpoint stores fp32 and a resume restores the same bytes.
 */
#define DT__Q8_M_ONE 120u
#define DT__Q8_R_ONE 224u
uint8_t dt__q8_encode_m(float y); /* y = m / A in [-1, 1] */
float dt__q8_decode_m(uint8_t c);
uint8_t dt__q8_encode_r(float y); /* y = r / A in [0, 1] */
float dt__q8_decode_r(uint8_t c);
/* Pass 1 over n elements of a block: dequantise m and r (block scales am,
 * ar), AdamW's step (k) on p, the new m and r = sqrt(v) into mb and rb, their
 * absolute maxima into *mmax and *rmax. */
void dt__q8_step_vec(float *p, const float *g, const uint8_t *qm, const uint8_t *qr, float am,
                     float ar, size_t n, const dt__adamw_k *k, float *mb, float *rb, float *mmax,
                     float *rmax);
void dt__q8_step_scalar(float *p, const float *g, const uint8_t *qm, const uint8_t *qr, float am,
                        float ar, size_t n, const dt__adamw_k *k, float *mb, float *rb, float *mmax,
                        float *rmax);
/* Pass 2: quantise n values of x relative to amax into codes (m: signed). */
void dt__q8_quantise_vec(uint8_t *q, const float *x, size_t n, float amax, bool is_m);
void dt__q8_quantise_scalar(uint8_t *q, const float *x, size_t n, float amax, bool is_m);
void dt__q8_dequantise(float *x, const uint8_t *q, size_t n, float amax, bool is_m);

/* ---- L-BFGS (lbfgs.c) ---------------------------------------------------- */
typedef struct dt__lbfgs dt__lbfgs;
dt_status dt__lbfgs_create(dt__lbfgs **out, const dt_lbfgs_config *c, size_t n);
void dt__lbfgs_destroy(dt__lbfgs *L);
size_t dt__lbfgs_num_vectors(const dt__lbfgs *L); /* allocated: 2 history + 6 */
float **dt__lbfgs_slot(dt__lbfgs *L, size_t i);
/* The checkpointed vectors (the history, oldest first, then P and D). */
size_t dt__lbfgs_num_states(const dt__lbfgs *L);
void dt__lbfgs_state_name(const dt__lbfgs *L, size_t i, char *buf, size_t len);
void dt__lbfgs_state_get(dt__lbfgs *L, size_t i, float *dst);
void dt__lbfgs_state_set(dt__lbfgs *L, size_t i, const float *src);
size_t dt__lbfgs_num_scalars(const dt__lbfgs *L);
void dt__lbfgs_scalars_get(const dt__lbfgs *L, double *v);
dt_status dt__lbfgs_scalars_set(dt__lbfgs *L, const double *v);
size_t dt__lbfgs_scalar_bytes(const dt__lbfgs *L); /* besides the checkpointed vectors */
void dt__lbfgs_begin(dt__lbfgs *L, float lr);
dt_status dt__lbfgs_next(dt__lbfgs *L, float *params, const float *grads, double loss, bool *more);
int dt__lbfgs_evals(const dt__lbfgs *L);

/* ---- K-FAC (kfac.c) ----------------------------------------------------- */
typedef struct dt__kfac dt__kfac;
/* For the table's linear tensors: sets tlen[t] (factors and inverses,
 * 2 (in^2 + out^2) floats) and allocates the accumulators. */
dt_status dt__kfac_create(dt__kfac **out, const dt_kfac_config *c, const dt_optim_tensor *tab,
                          size_t ntab, size_t *tlen);
void dt__kfac_destroy(dt__kfac *k);
size_t dt__kfac_bytes(const dt__kfac *k); /* accumulators and scratch */
dt_status dt__kfac_accumulate(dt__kfac *k, size_t weight_offset, const float *x, const float *dy,
                              int N, int in, int out, float scale);
/* One step over the whole buffer (the optimizer owns [0, n)): tstate and
 * toff are the per-tensor state, mom the momentum (NULL: none), count the
 * updates applied before this one; wd_of_tensor(wd_user, t) the decay of
 * tensor t. */
dt_status dt__kfac_step(dt__kfac *k, const dt_optim_config *c, float *p, const float *g,
                        float *tstate, const size_t *toff, float *mom, float lr, int64_t count,
                        float wd_of_tensor(const void *, size_t), const void *wd_user);

/* Optimizer state in a file on disk (offload.c): nstates buffers of count
 * elements of elem bytes (floats; 8-bit AdamW's codes: bytes), state[k]
 * pointing into a shared mapping. The optimizer updates the state in
 * pieces of at most DT__OFFLOAD_PIECE elements, announcing each
 * (before: map it) and reporting it (updated: read ahead, write back, drop;
 * state offsets [s0, s1)), so the file streams through a window of memory;
 * step_end() reads ahead where the next step starts; settle() writes back
 * and drops everything (after a checkpoint touched it all). */
#define DT__OFFLOAD_PIECE ((size_t)1 << 20)
#define DT__OFFLOAD_AHEAD 8 /* pieces read ahead of the walk (page cache, not mapped) */
typedef struct dt__offload dt__offload;
dt_status dt__offload_open(dt__offload **out, const char *dir, size_t nstates, size_t count,
                           size_t elem, void **state);
void dt__offload_close(dt__offload *f);
void dt__offload_before(dt__offload *f, size_t s0, size_t s1);
void dt__offload_updated(dt__offload *f, size_t s0, size_t s1);
void dt__offload_step_end(dt__offload *f);
void dt__offload_settle(dt__offload *f);
size_t dt__offload_file_bytes(const dt__offload *f);

#endif /* DTRAIN_OPTIM_INTERNAL_H */
