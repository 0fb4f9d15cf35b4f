/*
 * attention_internal.h — the two implementations behind dt_attention_forward
 * and dt_attention_backward (internal; the CLI's `bench attention` and the
 * tests call them directly to compare them).
 *
 *   - tiles:  the portable path (attention.c): tile products through
 *             dt__sgemm_tile plus separate softmax passes; any head size,
 *             any ISA.
 *   - avx512: register-blocked outer-product kernels (attention_avx512.c);
 *             head sizes 16, 32, 48, 64 at dt_isa() >= DT_ISA_AVX512.
 *
 * The public functions use avx512 when it can run and tiles otherwise. The
 * two agree to rounding (not bit for bit); each alone is deterministic and
 * independent of the thread count.
 */
#ifndef DTRAIN_TENSOR_ATTENTION_INTERNAL_H
#define DTRAIN_TENSOR_ATTENTION_INTERNAL_H

#include "dtrain/tensor.h"

#include <stdbool.h>

void dt__attention_forward_tiles(float *out, float *lse, const float *qkv, int B, int T, int C,
                                 int NH);
void dt__attention_backward_tiles(float *dqkv, const float *dout, const float *qkv,
                                  const float *out, const float *lse, int B, int T, int C, int NH);

/* Whether the avx512 kernels take this head size at the current dt_isa(). */
bool dt__attention_avx512_ok(int C, int NH);

/* Return false when dt__attention_avx512_ok() is false (nothing written) or
 * when a thread's scratch cannot be allocated (outputs then partly written;
 * the caller recomputes all of them with tiles). */
bool dt__attention_forward_avx512(float *out, float *lse, const float *qkv, int B, int T, int C,
                                  int NH);
bool dt__attention_backward_avx512(float *dqkv, const float *dout, const float *qkv,
                                   const float *out, const float *lse, int B, int T, int C, int NH);

/* The cross blocks of ring attention (tensor.h), tiles and avx512, under
 * the same rules; the public functions choose as for causal attention. */
void dt__attention_cross_forward_tiles(float *out, float *lse, size_t ld_lse, const float *q,
                                       size_t ldq, const float *kv, size_t ldkv, int Tq, int Tk,
                                       int C, int NH);
/* Heads [h0, h1) of the backward (added to, like every cross backward). */
void dt__attention_cross_backward_tiles(float *dq, float *dkv, const float *dout, const float *q,
                                        size_t ldq, const float *kv, size_t ldkv, const float *out,
                                        const float *lse, size_t ld_lse, int Tq, int Tk, int C,
                                        int NH, int h0, int h1);
bool dt__attention_cross_forward_avx512(float *out, float *lse, size_t ld_lse, const float *q,
                                        size_t ldq, const float *kv, size_t ldkv, int Tq, int Tk,
                                        int C, int NH);
/* false only where the kernels cannot run (nothing added); a head whose
 * scratch cannot be allocated runs in tiles instead. */
bool dt__attention_cross_backward_avx512(float *dq, float *dkv, const float *dout, const float *q,
                                         size_t ldq, const float *kv, size_t ldkv, const float *out,
                                         const float *lse, size_t ld_lse, int Tq, int Tk, int C,
                                         int NH);

#endif /* DTRAIN_TENSOR_ATTENTION_INTERNAL_H */
