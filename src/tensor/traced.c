/*
 * traced.c — the public kernels of tensor.h: each records one trace region
 * (dtrain/trace.h) around its body (dt__*, in gemm.c, kernels.c,
 * attention.c), with the floating-point operations it performs and the
 * bytes it must move at least, so that the report can place it on the
 * roofline (docs/observability.md, "Roofline").
 *
 * The counts are models, not hardware counters: a matrix product is
 * 2·N·IC·OC operations and reads its operands and writes its result once;
 * an elementwise kernel reads its inputs and writes its outputs once and
 * counts a fixed number of operations per element (GELU's polynomial and
 * exponential as 12 forward and 20 backward, LayerNorm as 8 and 14).
 * Causal attention counts the pairs it computes, T(T+1)/2 per head: 2
 * products forward, 5 backward (the scores again, dV, dP, dQ, dK).
 *
 * Tracing off, a kernel costs one load and two predictable branches. Only the
 * outermost kernel of a thread is recorded, and none inside an OpenMP
 * region (a kernel called per block by another kernel).
 */
#include "tensor_internal.h"

#include "dtrain/trace.h"

#include <omp.h>

#define F32 ((uint64_t)sizeof(float))

static inline uint64_t begin(void) {
    uint64_t t = dt_trace_begin();
    return t ? dt_trace_kernel_enter(t, omp_get_level() > 0) : 0;
}

static inline void end(uint64_t t, const char *name, double flops, double bytes) {
    if (t)
        dt_trace_kernel_end(t, DT_TRACE_COMPUTE, name, (uint64_t)flops, (uint64_t)bytes);
}

/* Query-key pairs of causal attention per sequence and head. */
static inline double causal_pairs(int T) { return 0.5 * (double)T * ((double)T + 1); }

void dt_matmul_forward(float *out, const float *inp, const float *weight, const float *bias, int N,
                       int IC, int OC) {
    uint64_t t = begin();
    dt__matmul_forward(out, inp, weight, bias, N, IC, OC);
    double n = N, ic = IC, oc = OC;
    end(t, "matmul_fwd", 2 * n * ic * oc, F32 * (n * ic + oc * ic + n * oc + (bias ? oc : 0)));
}

void dt_matmul_backward_mode(float *dinp, float *dweight, float *dbias, const float *dout,
                             const float *inp, const float *weight, int N, int IC, int OC,
                             dt_grad_mode mode) {
    uint64_t t = begin();
    dt__matmul_backward_mode(dinp, dweight, dbias, dout, inp, weight, N, IC, OC, mode);
    double n = N, ic = IC, oc = OC, acc = mode == DT_GRAD_ACCUMULATE ? 2 : 1;
    double flops =
        (dinp ? 2 * n * ic * oc : 0) + (dweight ? 2 * n * ic * oc : 0) + (dbias ? n * oc : 0);
    double bytes = n * oc + (dinp ? oc * ic + n * ic : 0) + (dweight ? n * ic + acc * oc * ic : 0) +
                   (dbias ? acc * oc : 0);
    end(t, "matmul_bwd", flops, F32 * bytes);
}

void dt_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                          const float *weight, const float *bias, int N, int C) {
    uint64_t t = begin();
    dt__layernorm_forward(out, mean, rstd, inp, weight, bias, N, C);
    double n = N, c = C;
    end(t, "layernorm_fwd", 8 * n * c, F32 * (2 * n * c + 2 * c + 2 * n));
}

void dt_residual_layernorm_forward(float *res, float *out, float *mean, float *rstd, const float *a,
                                   const float *b, const float *bias, const float *weight,
                                   const float *lnbias, int N, int C) {
    uint64_t t = begin();
    dt__residual_layernorm_forward(res, out, mean, rstd, a, b, bias, weight, lnbias, N, C);
    double n = N, c = C;
    end(t, "residual_layernorm_fwd", 10 * n * c, F32 * (4 * n * c + 3 * c + 2 * n));
}

void dt_layernorm_backward_mode(float *dinp, float *dweight, float *dbias, const float *dout,
                                const float *inp, const float *weight, const float *mean,
                                const float *rstd, int N, int C, dt_grad_mode mode) {
    uint64_t t = begin();
    dt__layernorm_backward_mode(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C, mode);
    double n = N, c = C;
    end(t, "layernorm_bwd", 14 * n * c, F32 * (2 * n * c + (dinp ? 2 * n * c : 0) + 5 * c + 2 * n));
}

void dt_gelu_forward(float *out, const float *inp, size_t n) {
    uint64_t t = begin();
    dt__gelu_forward(out, inp, n);
    end(t, "gelu_fwd", 12 * (double)n, F32 * 2 * (double)n);
}

void dt_gelu_bias_forward(float *out, const float *inp, const float *bias, int N, int C) {
    uint64_t t = begin();
    dt__gelu_bias_forward(out, inp, bias, N, C);
    double n = (double)N * C;
    end(t, "gelu_bias_fwd", 13 * n, F32 * (2 * n + C));
}

void dt_gelu_bias_backward(float *dinp, const float *inp, const float *bias, const float *dout,
                           int N, int C) {
    uint64_t t = begin();
    dt__gelu_bias_backward(dinp, inp, bias, dout, N, C);
    double n = (double)N * C;
    end(t, "gelu_bias_bwd", 21 * n, F32 * (3 * n + C));
}

void dt_gelu_backward(float *dinp, const float *inp, const float *dout, size_t n) {
    uint64_t t = begin();
    dt__gelu_backward(dinp, inp, dout, n);
    end(t, "gelu_bwd", 20 * (double)n, F32 * 3 * (double)n);
}

void dt_residual_forward(float *out, const float *a, const float *b, size_t n) {
    uint64_t t = begin();
    dt__residual_forward(out, a, b, n);
    end(t, "residual_fwd", (double)n, F32 * 3 * (double)n);
}

void dt_embedding_forward(float *out, const int32_t *tokens, const float *wte, const float *wpe,
                          int B, int T, int C) {
    uint64_t t = begin();
    dt__embedding_forward(out, tokens, wte, wpe, B, T, C);
    double n = (double)B * T;
    end(t, "embedding_fwd", n * C, F32 * (3 * n * C + n));
}

void dt_embedding_backward_mode(float *dwte, float *dwpe, const float *dout, const int32_t *tokens,
                                int B, int T, int C, dt_grad_mode wpe_mode) {
    uint64_t t = begin();
    dt__embedding_backward_mode(dwte, dwpe, dout, tokens, B, T, C, wpe_mode);
    double n = (double)B * T;
    end(t, "embedding_bwd", 2 * n * C, F32 * (3 * n * C + 2 * (double)T * C + n));
}

float dt_crossentropy_forward(float *losses, float *lse, const float *logits,
                              const int32_t *targets, int N, int V) {
    uint64_t t = begin();
    float loss = dt__crossentropy_forward(losses, lse, logits, targets, N, V);
    double n = N;
    end(t, "crossentropy_fwd", 4 * n * V, F32 * (n * V + 3 * n));
    return loss;
}

void dt_crossentropy_backward(float *dlogits, const float *logits, const float *lse,
                              const int32_t *targets, float scale, int N, int V) {
    uint64_t t = begin();
    dt__crossentropy_backward(dlogits, logits, lse, targets, scale, N, V);
    double n = N;
    end(t, "crossentropy_bwd", 4 * n * V, F32 * (2 * n * V + 2 * n));
}

void dt_attention_forward(float *out, float *lse, const float *qkv, int B, int T, int C, int NH) {
    uint64_t t = begin();
    dt__attention_forward(out, lse, qkv, B, T, C, NH);
    double btc = (double)B * T * C;
    end(t, "attention_fwd", 4 * causal_pairs(T) * B * C, F32 * (4 * btc + (double)B * NH * T));
}

void dt_attention_backward(float *dqkv, const float *dout, const float *qkv, const float *out,
                           const float *lse, int B, int T, int C, int NH) {
    uint64_t t = begin();
    dt__attention_backward(dqkv, dout, qkv, out, lse, B, T, C, NH);
    double btc = (double)B * T * C;
    end(t, "attention_bwd", 10 * causal_pairs(T) * B * C, F32 * (8 * btc + (double)B * NH * T));
}

void dt_attention_cross_forward(float *out, float *lse, size_t ld_lse, const float *q, size_t ldq,
                                const float *kv, size_t ldkv, int Tq, int Tk, int C, int NH) {
    uint64_t t = begin();
    dt__attention_cross_forward(out, lse, ld_lse, q, ldq, kv, ldkv, Tq, Tk, C, NH);
    double tq = Tq, tk = Tk;
    end(t, "attention_cross_fwd", 4 * tq * tk * C, F32 * (2 * tq * C + 2 * tk * C + NH * tq));
}

void dt_attention_cross_backward(float *dq, float *dkv, const float *dout, const float *q,
                                 size_t ldq, const float *kv, size_t ldkv, const float *out,
                                 const float *lse, size_t ld_lse, int Tq, int Tk, int C, int NH) {
    uint64_t t = begin();
    dt__attention_cross_backward(dq, dkv, dout, q, ldq, kv, ldkv, out, lse, ld_lse, Tq, Tk, C, NH);
    double tq = Tq, tk = Tk;
    end(t, "attention_cross_bwd", 10 * tq * tk * C, F32 * (5 * tq * C + 4 * tk * C + NH * tq));
}
