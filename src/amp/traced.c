/*
 * traced.c — the public 16-bit kernels of amp.h: each records one trace
 * region (dtrain/trace.h) around its body (dt__*, act16.c) with its
 * floating-point operations and the bytes it must move at least, as the
 * fp32 kernels do (src/tensor/traced.c has the counting rules). 16-bit
 * activations and weights count 2 bytes, fp32 values 4; conversions are
 * "cast" regions.
 */
#include "amp_internal.h"

#include "dtrain/trace.h"

#include <omp.h>

static inline uint64_t begin(void) {
    uint64_t t = dt_trace_begin();
    return t ? dt_trace_kernel_enter(t, omp_get_level() > 0) : 0;
}

static inline void end(uint64_t t, dt_trace_cat cat, const char *name, double flops, double bytes) {
    if (t)
        dt_trace_kernel_end(t, cat, name, (uint64_t)flops, (uint64_t)bytes);
}

static inline double causal_pairs(int T) { return 0.5 * (double)T * ((double)T + 1); }

void dt_act16_from_f32(dt_precision p, uint16_t *out, const float *in, size_t n) {
    uint64_t t = begin();
    dt__act16_from_f32(p, out, in, n);
    end(t, DT_TRACE_CAST, "cast_to16", (double)n, 6 * (double)n);
}

void dt_act16_to_f32(dt_precision p, float *out, const uint16_t *in, size_t n) {
    uint64_t t = begin();
    dt__act16_to_f32(p, out, in, n);
    end(t, DT_TRACE_CAST, "cast_to32", 0, 6 * (double)n);
}

dt_status dt_linear16_forward(dt_precision p, void *out, bool out_f32, const uint16_t *inp,
                              const uint16_t *w, const float *bias, int N, int C, int OC) {
    uint64_t t = begin();
    dt_status st = dt__linear16_forward(p, out, out_f32, inp, w, bias, N, C, OC);
    double n = N, c = C, oc = OC;
    end(t, DT_TRACE_COMPUTE, "linear16_fwd", 2 * n * c * oc,
        2 * (n * c + oc * c) + (out_f32 ? 4 : 2) * n * oc + (bias ? 4 * oc : 0));
    return st;
}

dt_status dt_linear16_backward_mode(dt_precision p, float *dinp, float *dw, float *dbias,
                                    const uint16_t *dout, const uint16_t *inp, const uint16_t *w,
                                    int N, int C, int OC, dt_grad_mode mode) {
    uint64_t t = begin();
    dt_status st = dt__linear16_backward_mode(p, dinp, dw, dbias, dout, inp, w, N, C, OC, mode);
    double n = N, c = C, oc = OC, acc = mode == DT_GRAD_ACCUMULATE ? 2 : 1;
    double flops = (dinp ? 2 * n * c * oc : 0) + (dw ? 2 * n * c * oc : 0) + (dbias ? n * oc : 0);
    double bytes = 2 * n * oc + (dinp ? 2 * oc * c + 4 * n * c : 0) +
                   (dw ? 2 * n * c + 4 * acc * oc * c : 0) + (dbias ? 4 * acc * oc : 0);
    end(t, DT_TRACE_COMPUTE, "linear16_bwd", flops, bytes);
    return st;
}

void dt_layernorm16_forward(dt_precision p, uint16_t *out, float *mean, float *rstd,
                            const float *inp, const float *weight, const float *bias, int N,
                            int C) {
    uint64_t t = begin();
    dt__layernorm16_forward(p, out, mean, rstd, inp, weight, bias, N, C);
    double n = N, c = C;
    end(t, DT_TRACE_COMPUTE, "layernorm16_fwd", 8 * n * c, 6 * n * c + 8 * c + 8 * n);
}

void dt_gelu16_forward(dt_precision p, uint16_t *out, const uint16_t *inp, size_t n) {
    uint64_t t = begin();
    dt__gelu16_forward(p, out, inp, n);
    end(t, DT_TRACE_COMPUTE, "gelu16_fwd", 12 * (double)n, 4 * (double)n);
}

void dt_gelu16_backward(dt_precision p, uint16_t *dinp, const uint16_t *inp, const float *dout,
                        size_t n) {
    uint64_t t = begin();
    dt__gelu16_backward(p, dinp, inp, dout, n);
    end(t, DT_TRACE_COMPUTE, "gelu16_bwd", 20 * (double)n, 8 * (double)n);
}

void dt_attention16_forward(dt_precision p, uint16_t *out, float *lse, const uint16_t *qkv, int B,
                            int T, int C, int NH, float *work) {
    uint64_t t = begin();
    dt__attention16_forward(p, out, lse, qkv, B, T, C, NH, work);
    double btc = (double)B * T * C;
    end(t, DT_TRACE_COMPUTE, "attention16_fwd", 4 * causal_pairs(T) * B * C,
        2 * 4 * btc + 4.0 * B * NH * T);
}

void dt_attention16_backward(dt_precision p, uint16_t *dqkv, const float *dout, const uint16_t *qkv,
                             const uint16_t *out, const float *lse, int B, int T, int C, int NH,
                             float *work) {
    uint64_t t = begin();
    dt__attention16_backward(p, dqkv, dout, qkv, out, lse, B, T, C, NH, work);
    double btc = (double)B * T * C;
    end(t, DT_TRACE_COMPUTE, "attention16_bwd", 10 * causal_pairs(T) * B * C,
        2 * 7 * btc + 4 * btc + 4.0 * B * NH * T);
}
