/*
 * tensor_internal.h — what src/tensor shares with the layers above it but
 * does not publish: oneDNN's process-wide state (onednn.c) and the
 * single-thread tile multiply (gemm.c).
 */
#ifndef DTRAIN_TENSOR_INTERNAL_H
#define DTRAIN_TENSOR_INTERNAL_H

#include "dtrain/tensor.h"

/* Whether oneDNN may run here: built with libdnnl-dev, and dt_isa() is not
 * below the ISA cap oneDNN was given. The first call fixes that cap from
 * dt_isa() (oneDNN accepts it once per process, before its first kernel),
 * so every user of oneDNN (tensor's dnnl_sgemm, amp's matmul primitives)
 * must call this before its first oneDNN call. If not, `why` (may be NULL)
 * says why. Thread-safe. */
bool dt__onednn_available(char *why, size_t why_len);

/* C = alpha op(A) op(B) + beta C on the calling thread, for the small tile
 * products of attention (gemm.c): oneDNN for every transpose where it may
 * run, OpenBLAS otherwise. Deterministic for a fixed call. */
void dt__sgemm_tile(bool ta, bool tb, int M, int N, int K, float alpha, const float *A, int lda,
                    const float *B, int ldb, float beta, float *C, int ldc);

/* C (M,N) += A^T B with A (K,M) lda, B (K,N) ldb, row-major, on the calling
 * thread: the hand-written AVX-512 weight-gradient kernel (gemm_tn.c).
 * colsum (M) may be NULL; if not, colsum[i] += sum_k A[k][i] (a linear
 * layer's bias gradient, read from the packs). With accumulate false, C and
 * colsum are overwritten instead (= 0 + sum, the bits of zeroing then
 * accumulating) and their old contents are not read.
 * Returns false, touching nothing, when it cannot run (dt_isa() below
 * DT_ISA_AVX512, not built for x86-64, pack buffers not allocatable); the
 * caller then uses sgemm. Deterministic for a fixed call. */
bool dt__sgemm_tn(int M, int N, int K, const float *A, int lda, const float *B, int ldb, float *C,
                  int ldc, float *colsum, bool accumulate);

/* The kernels of tensor.h without their trace regions: each public kernel
 * (traced.c) records one region around its dt__ body (dtrain/trace.h). */
void dt__matmul_forward(float *out, const float *inp, const float *weight, const float *bias, int N,
                        int IC, int OC);
void dt__matmul_backward_mode(float *dinp, float *dweight, float *dbias, const float *dout,
                              const float *inp, const float *weight, int N, int IC, int OC,
                              dt_grad_mode mode);
void dt__layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                           const float *weight, const float *bias, int N, int C);
void dt__residual_layernorm_forward(float *res, float *out, float *mean, float *rstd,
                                    const float *a, const float *b, const float *bias,
                                    const float *weight, const float *lnbias, int N, int C);
void dt__layernorm_backward_mode(float *dinp, float *dweight, float *dbias, const float *dout,
                                 const float *inp, const float *weight, const float *mean,
                                 const float *rstd, int N, int C, dt_grad_mode mode);
void dt__gelu_forward(float *out, const float *inp, size_t n);
void dt__gelu_bias_forward(float *out, const float *inp, const float *bias, int N, int C);
void dt__gelu_bias_backward(float *dinp, const float *inp, const float *bias, const float *dout,
                            int N, int C);
void dt__gelu_backward(float *dinp, const float *inp, const float *dout, size_t n);
void dt__residual_forward(float *out, const float *a, const float *b, size_t n);
void dt__embedding_forward(float *out, const int32_t *tokens, const float *wte, const float *wpe,
                           int B, int T, int C);
void dt__embedding_backward_mode(float *dwte, float *dwpe, const float *dout, const int32_t *tokens,
                                 int B, int T, int C, dt_grad_mode wpe_mode);
float dt__crossentropy_forward(float *losses, float *lse, const float *logits,
                               const int32_t *targets, int N, int V);
void dt__crossentropy_backward(float *dlogits, const float *logits, const float *lse,
                               const int32_t *targets, float scale, int N, int V);
void dt__attention_forward(float *out, float *lse, const float *qkv, int B, int T, int C, int NH);
void dt__attention_backward(float *dqkv, const float *dout, const float *qkv, const float *out,
                            const float *lse, int B, int T, int C, int NH);
void dt__attention_cross_forward(float *out, float *lse, size_t ld_lse, const float *q, size_t ldq,
                                 const float *kv, size_t ldkv, int Tq, int Tk, int C, int NH);
void dt__attention_cross_backward(float *dq, float *dkv, const float *dout, const float *q,
                                  size_t ldq, const float *kv, size_t ldkv, const float *out,
                                  const float *lse, size_t ld_lse, int Tq, int Tk, int C, int NH);

/* Planning (dt_tensor_plan_workspace): per thread, the pack buffers of
 * the AVX-512 dW GEMM and the attention kernels' scratch for sequences of
 * T and heads of HS (0 where those kernels are not built). */
size_t dt__gemm_tn_workspace_bytes(void);
size_t dt__attention_workspace_bytes(int T, int HS);

#endif /* DTRAIN_TENSOR_INTERNAL_H */
