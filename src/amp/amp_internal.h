/*
 * amp_internal.h — what the files of src/amp share: the arguments of one
 * multiply, already validated by gemm.c, and the backend entry points.
 */
#ifndef DTRAIN_AMP_INTERNAL_H
#define DTRAIN_AMP_INTERNAL_H

#include "dtrain/amp.h"

typedef struct dt__gemm_args {
    dt_gemm_op op;
    int M, N, K;      /* C is (M,N); the sum runs over K */
    const dt_bf16 *A; /* (M,K), or (K,M) when op transposes A */
    const dt_bf16 *B; /* (K,N), or (N,K) when op transposes B */
    void *C;          /* (M,N) fp32 or bf16 */
    dt_gemm_out out;  /* C's type */
    bool accumulate;  /* C += A x B instead of C = A x B */
    /* oneDNN backend only (dt__gemm_onednn; the others need NULL): */
    const float *bias; /* (N) fp32 added to every row before rounding, or NULL */
} dt__gemm_args;

static inline bool dt__gemm_trans_a(dt_gemm_op op) { return op == DT_GEMM_TN || op == DT_GEMM_TT; }
static inline bool dt__gemm_trans_b(dt_gemm_op op) { return op == DT_GEMM_NT || op == DT_GEMM_TT; }

/* oneDNN (gemm_onednn.c). */
bool dt__gemm_onednn_available(char *why, size_t why_len);
dt_status dt__gemm_onednn(const dt__gemm_args *g);
void dt__gemm_onednn_release(void);

/* Our AVX512-BF16 kernel (gemm_avx512.c); needs dt_isa() >= avx512bf16. */
dt_status dt__gemm_avx512(const dt__gemm_args *g);
/* Pack columns [jp*32, jp*32+32) of B, k pairs [p0, p0+kcp), as
 * dst[p][c] = (B[2p][j], B[2p+1][j]) in one 32-bit word; zero past N and K.
 * This is the layout of vdpbf16ps's and AMX tdpbf16ps's B operand. */
void dt__gemm_pack_b32(const dt__gemm_args *g, int jp, int p0, int kcp, uint32_t *dst);
void dt__gemm_avx512_release(void);

/* Our AMX kernel (gemm_amx.c); needs dt_isa() >= amx. */
dt_status dt__gemm_amx(const dt__gemm_args *g);
void dt__gemm_amx_release(void);

/* The backend for one op of the 16-bit linear layers: the default, except
 * that without DT_GEMM_BACKEND our AMX kernel takes the weight gradients
 * (TN) from oneDNN, which it beats there in CPU time on every GPT-2 layer
 * (docs/amp.md). */
dt_gemm_backend dt__gemm_backend_for_op(dt_gemm_op op);

/* The 16-bit linear layers' scratch (act16.c). */
void dt__act16_release(void);

/* The 16-bit kernels of amp.h without their trace regions: each public
 * kernel (traced.c) records one region around its dt__ body. */
void dt__act16_from_f32(dt_precision p, uint16_t *out, const float *in, size_t n);
void dt__act16_to_f32(dt_precision p, float *out, const uint16_t *in, size_t n);
dt_status dt__linear16_forward(dt_precision p, void *out, bool out_f32, const uint16_t *inp,
                               const uint16_t *w, const float *bias, int N, int C, int OC);
dt_status dt__linear16_backward_mode(dt_precision p, float *dinp, float *dw, float *dbias,
                                     const uint16_t *dout, const uint16_t *inp, const uint16_t *w,
                                     int N, int C, int OC, dt_grad_mode mode);
void dt__layernorm16_forward(dt_precision p, uint16_t *out, float *mean, float *rstd,
                             const float *inp, const float *weight, const float *bias, int N,
                             int C);
void dt__gelu16_forward(dt_precision p, uint16_t *out, const uint16_t *inp, size_t n);
void dt__gelu16_backward(dt_precision p, uint16_t *dinp, const uint16_t *inp, const float *dout,
                         size_t n);
void dt__attention16_forward(dt_precision p, uint16_t *out, float *lse, const uint16_t *qkv, int B,
                             int T, int C, int NH, float *work);
void dt__attention16_backward(dt_precision p, uint16_t *dqkv, const float *dout,
                              const uint16_t *qkv, const uint16_t *out, const float *lse, int B,
                              int T, int C, int NH, float *work);

#endif /* DTRAIN_AMP_INTERNAL_H */
