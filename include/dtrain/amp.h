/*
 * dtrain/amp.h — low precision: CPU features, 16-bit conversions, bf16
 * matrix multiply, and the fp16 dynamic loss scaler.
 *
 * Overview
 * --------
 * Mixed-precision training keeps fp32 master weights and computes in a
 * 16-bit type. This layer gives the rest of dtrain the four pieces that
 * need no model:
 *
 *   1. Runtime CPU-feature detection (declared in dtrain/tensor.h, the lower
 *      layer, whose oneDNN sgemm honours it too). dt_isa() is the best instruction-set
 *      level this CPU and OS can run (cpuid, XCR0 via xgetbv, and for AMX the
 *      Linux permission request for the tile data state), optionally lowered
 *      by DT_ISA=scalar|avx2|avx512|avx512bf16|amx. Every kernel here
 *      dispatches on dt_isa(), so forcing a lower level exercises the
 *      fallback on any machine. Asking for a level the CPU lacks is an error.
 *   2. Conversions fp32 <-> bf16 (round to nearest even, NaN stays NaN) and
 *      fp32 <-> fp16 (IEEE binary16, round to nearest even, subnormals kept).
 *      Every vector path is bit-identical to the scalar reference.
 *   3. C = A x B (+ C) with A, B in bf16, products accumulated in fp32, C in
 *      fp32 or bf16, row-major, in the four transposition variants. Backends:
 *      oneDNN's matmul (primitives cached per shape), OpenBLAS's
 *      cblas_sbgemm when the installed OpenBLAS exports it, our own
 *      AVX512-BF16 (vdpbf16ps) and AMX (tdpbf16ps) kernels, fp32 sgemm on
 *      widened copies (the fast path of CPUs without bf16 units), and a
 *      scalar reference. dt_gemm_f16 is the fp16 form (widened, sgemm).
 *   4. The fp16 dynamic loss scaler (PyTorch GradScaler semantics), a fast
 *      inf/nan check over a flat fp32 buffer, and unscaling.
 *
 * Example
 * -------
 *     if (dt_isa_init() != DT_OK)              // validates DT_ISA
 *         return fail(dt_last_error());
 *     dt_f32_to_bf16(wb, w, n);                // fp32 master -> bf16 copy
 *     // out(BT,OC) = inp(BT,C) x W(OC,C)^T, the forward of a linear layer
 *     DT_CHECK(dt_gemm_bf16(DT_GEMM_NT, BT, OC, C, inp, wb, out, DT_GEMM_OUT_F32, false));
 *
 *     dt_scaler s;
 *     dt_scaler_init(&s, NULL);                // 2^16, x2 / 2000 steps, x0.5
 *     ... backward with the loss multiplied by dt_scaler_scale(&s) ...
 *     bool found_inf = dt_unscale(grads, n, 1.0f / dt_scaler_scale(&s));
 *     if (!found_inf) optimizer_step();
 *     dt_scaler_update(&s, found_inf);
 */
#ifndef DTRAIN_AMP_H
#define DTRAIN_AMP_H

#include "dtrain/core.h"
#include "dtrain/tensor.h" /* dt_isa_level, dt_isa(): CPU features live in tensor */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------ */
/* Compute precision of training                                            */
/* ------------------------------------------------------------------------ */

/* The type a model computes in; master parameters, gradients, optimizer
 * state, layernorm statistics, softmax and loss stay fp32 in every mode. */
typedef enum dt_precision {
    DT_PRECISION_FP32,
    DT_PRECISION_BF16,
    DT_PRECISION_FP16,
    DT_PRECISION_COUNT
} dt_precision;

/* "fp32", "bf16", "fp16"; "?" out of range. */
const char *dt_precision_name(dt_precision p);
/* Parse a name of dt_precision_name(); DT_ERR_INVALID naming knob and value. */
dt_status dt_precision_parse(const char *knob, const char *text, dt_precision *out);

/* ------------------------------------------------------------------------ */
/* 16-bit floating point                                                    */
/* ------------------------------------------------------------------------ */

typedef uint16_t dt_bf16; /* bfloat16: fp32's sign, 8-bit exponent, top 7 mantissa bits */
typedef uint16_t dt_f16;  /* IEEE 754 binary16 */

/* Scalar references (the definition every vector path must match bit for bit).
 *
 * fp32 -> bf16: round to nearest, ties to even, on the 32-bit pattern; a NaN
 * keeps its sign and top payload bits and gets the quiet bit set (so a NaN
 * whose payload sits in the low 16 bits cannot become infinity); subnormals
 * are rounded like any other value (no flush to zero).
 * bf16 -> fp32: exact (a 16-bit shift); NaNs are passed through unchanged.
 * fp32 <-> fp16: IEEE round to nearest even with subnormals and overflow to
 * infinity, NaNs quieted with their top payload bits kept — exactly what the
 * F16C instructions vcvtps2ph (imm 0) and vcvtph2ps do. */
dt_bf16 dt_bf16_from_f32(float x);
float dt_f32_from_bf16(dt_bf16 x);
dt_f16 dt_f16_from_f32(float x);
float dt_f32_from_f16(dt_f16 x);

/* Array conversions, dispatched on dt_isa(). out and in must not overlap. */
void dt_f32_to_bf16(dt_bf16 *out, const float *in, size_t n);
void dt_bf16_to_f32(float *out, const dt_bf16 *in, size_t n);
void dt_f32_to_f16(dt_f16 *out, const float *in, size_t n);
void dt_f16_to_f32(float *out, const dt_f16 *in, size_t n);

/* ------------------------------------------------------------------------ */
/* bf16 matrix multiply                                                     */
/* ------------------------------------------------------------------------ */
/*
 * C(M,N) = op(A) x op(B) (+ C), row-major and densely packed:
 *   DT_GEMM_NN: A is (M,K), B is (K,N)    e.g. dinp = dout x W
 *   DT_GEMM_NT: A is (M,K), B is (N,K)    e.g. out  = inp x W^T   (forward)
 *   DT_GEMM_TN: A is (K,M), B is (K,N)    e.g. dW  += dout^T x inp
 *   DT_GEMM_TT: A is (K,M), B is (N,K)
 * Products are summed in fp32 (the order of the sum differs by backend), then
 * added to C if `accumulate`, then stored as fp32 or rounded to bf16.
 */
typedef enum dt_gemm_op {
    DT_GEMM_NN,
    DT_GEMM_NT,
    DT_GEMM_TN,
    DT_GEMM_TT,
    DT_GEMM_OP_COUNT
} dt_gemm_op;

typedef enum dt_gemm_out { DT_GEMM_OUT_F32, DT_GEMM_OUT_BF16, DT_GEMM_OUT_COUNT } dt_gemm_out;

typedef enum dt_gemm_backend {
    DT_GEMM_AUTO,     /* DT_GEMM_BACKEND, else the fastest available (measured) */
    DT_GEMM_REF,      /* scalar C, fp32 accumulation in k order */
    DT_GEMM_ONEDNN,   /* oneDNN matmul; honours dt_isa() through its max ISA */
    DT_GEMM_OPENBLAS, /* cblas_sbgemm, when the OpenBLAS library exports it */
    DT_GEMM_AVX512,   /* our vdpbf16ps kernel; needs dt_isa() >= avx512bf16 */
    DT_GEMM_AMX,      /* our AMX tile kernel; needs dt_isa() >= amx */
    DT_GEMM_SGEMM,    /* widen A, B to fp32 and call OpenBLAS cblas_sgemm: any CPU */
    DT_GEMM_BACKEND_COUNT
} dt_gemm_backend;

/* "auto", "ref", "onednn", "openblas", "avx512", "amx", "sgemm". */
const char *dt_gemm_backend_name(dt_gemm_backend b);
dt_status dt_gemm_backend_parse(const char *knob, const char *text, dt_gemm_backend *out);

/* Whether a backend can run at the current dt_isa(); if not and `why` is
 * given, a reason ("OpenBLAS 0.3.21 has no cblas_sbgemm") is written. */
bool dt_gemm_backend_available(dt_gemm_backend b, char *why, size_t why_len);

/* What DT_GEMM_AUTO resolves to now (reads DT_GEMM_BACKEND once). */
dt_gemm_backend dt_gemm_backend_default(void);

/* The multiply through the default backend. DT_ERR_INVALID for bad sizes
 * (M, N, K >= 1 and each below 2^31) or NULL pointers. */
dt_status dt_gemm_bf16(dt_gemm_op op, int M, int N, int K, const dt_bf16 *A, const dt_bf16 *B,
                       void *C, dt_gemm_out out, bool accumulate);

/* The same through a chosen backend; DT_ERR_UNSUPPORTED if it cannot run. */
dt_status dt_gemm_bf16_with(dt_gemm_backend b, dt_gemm_op op, int M, int N, int K, const dt_bf16 *A,
                            const dt_bf16 *B, void *C, dt_gemm_out out, bool accumulate);

/* C(M,N) = op(A) x op(B) (+ C) for fp16 A and B, fp32 C: the operands are
 * widened to fp32 (F16C / AVX-512, exact) and multiplied by OpenBLAS sgemm,
 * since neither oneDNN 2.6 nor this CPU's dot-product units multiply fp16.
 * Same arguments and errors as dt_gemm_bf16; write fp16 output with
 * dt_f32_to_f16. */
dt_status dt_gemm_f16(dt_gemm_op op, int M, int N, int K, const dt_f16 *A, const dt_f16 *B,
                      float *C, bool accumulate);

/* Release cached oneDNN primitives, packing buffers and the 16-bit layers'
 * scratch (at exit, or to
 * bound memory after many shapes). Safe to call at any time no multiply
 * is running. */
void dt_gemm_release(void);

/* ------------------------------------------------------------------------ */
/* 16-bit activation kernels (src/amp/act16.c)                              */
/* ------------------------------------------------------------------------ */
/*
 * The GPT's bf16/fp16 path. An `a16` array is uint16_t holding bf16 (p ==
 * DT_PRECISION_BF16) or fp16 (p == DT_PRECISION_FP16) values; every kernel
 * reads its 16-bit inputs, computes in fp32 exactly as the fp32 kernel of
 * dtrain/tensor.h does, and rounds its 16-bit outputs once (round to nearest
 * even). Statistics (layernorm mean/rstd, attention lse) and gradients of
 * parameters are fp32. Matrix multiplies go through dt_gemm_bf16 (fp32
 * accumulation; oneDNN's AMX kernels by default) or dt_gemm_f16. The
 * conversions and the elementwise paths dispatch on dt_isa(). p must be
 * DT_PRECISION_BF16 or DT_PRECISION_FP16 (DT_ASSERT otherwise).
 * Threads: dt_tensor_threads() (OpenMP), like the fp32 kernels.
 */

/* out (n) = in rounded to p; in (n) fp32. */
void dt_act16_from_f32(dt_precision p, uint16_t *out, const float *in, size_t n);
/* out (n) = in widened (exact); in (n) a16. */
void dt_act16_to_f32(dt_precision p, float *out, const uint16_t *in, size_t n);

/* out (N,OC) = inp (N,C) W (OC,C)^T + bias: out is a16, or fp32 when out_f32
 * (c_proj outputs and LM-head logits); bias (OC) fp32, may be NULL. The sum
 * (products and bias) is fp32, rounded once. DT_ERR_INVALID for bad sizes or
 * NULL pointers; errors of the multiply (allocation) are passed on. */
dt_status dt_linear16_forward(dt_precision p, void *out, bool out_f32, const uint16_t *inp,
                              const uint16_t *w, const float *bias, int N, int C, int OC);
/* dinp (N,C) fp32 = dout W (overwritten; may be NULL); dw (OC,C) fp32 +=
 * dout^T inp (may be NULL when dinp is not: then dbias and inp are not
 * used); dbias (OC) fp32 += column sums of dout (may be NULL). The parts
 * are independent (two calls give the bits of one).
 * dout (N,OC), inp (N,C), w (OC,C) a16. */
dt_status dt_linear16_backward(dt_precision p, float *dinp, float *dw, float *dbias,
                               const uint16_t *dout, const uint16_t *inp, const uint16_t *w, int N,
                               int C, int OC);
/* The same with dw and dbias written per mode (tensor.h): DT_GRAD_OVERWRITE
 * gives the bits of zeroing them and accumulating. */
dt_status dt_linear16_backward_mode(dt_precision p, float *dinp, float *dw, float *dbias,
                                    const uint16_t *dout, const uint16_t *inp, const uint16_t *w,
                                    int N, int C, int OC, dt_grad_mode mode);

/* LayerNorm (eps 1e-5) of the fp32 residual stream into a16: out (N,C) a16 =;
 * mean, rstd (N) fp32 =; inp (N,C), weight, bias (C) fp32. The backward is
 * dt_layernorm_backward (its dout and inp are fp32). */
void dt_layernorm16_forward(dt_precision p, uint16_t *out, float *mean, float *rstd,
                            const float *inp, const float *weight, const float *bias, int N, int C);

/* GELU (tanh form): out (n) a16 = gelu(inp (n) a16). */
void dt_gelu16_forward(dt_precision p, uint16_t *out, const uint16_t *inp, size_t n);
/* dinp (n) a16 = dout (n) fp32 * gelu'(inp (n) a16). */
void dt_gelu16_backward(dt_precision p, uint16_t *dinp, const uint16_t *inp, const float *dout,
                        size_t n);

/* Causal self-attention on 16-bit qkv; layout as dt_attention_forward.
 * `work` is caller-owned scratch of dt_attention16_workspace() floats (the
 * same size serves forward and backward); nothing in it survives a call. */
size_t dt_attention16_workspace(int B, int T, int C, int NH);
/* out (B,T,C) a16 =; lse (B,NH,T) fp32 =; qkv (B,T,3C) a16. */
void dt_attention16_forward(dt_precision p, uint16_t *out, float *lse, const uint16_t *qkv, int B,
                            int T, int C, int NH, float *work);
/* dqkv (B,T,3C) a16 =; dout (B,T,C) fp32; qkv, out a16 and lse fp32 from
 * forward. */
void dt_attention16_backward(dt_precision p, uint16_t *dqkv, const float *dout, const uint16_t *qkv,
                             const uint16_t *out, const float *lse, int B, int T, int C, int NH,
                             float *work);

/* ------------------------------------------------------------------------ */
/* Dynamic loss scaling                                                     */
/* ------------------------------------------------------------------------ */
/*
 * fp16 gradients underflow unless the loss is multiplied by a large scale
 * before backward. dt_scaler follows PyTorch's GradScaler: after a step
 * whose gradients hold an inf or nan the step is skipped and the scale is
 * multiplied by backoff (0.5); after `growth_interval` consecutive clean
 * steps it is multiplied by growth (2) and the count restarts.
 */
typedef struct dt_scaler_config {
    double init_scale;       /* 65536 */
    double growth_factor;    /* 2.0, > 1 */
    double backoff_factor;   /* 0.5, in (0, 1) */
    int64_t growth_interval; /* 2000 clean steps, >= 1 */
} dt_scaler_config;

typedef struct dt_scaler {
    dt_scaler_config cfg;   /* fixed after init */
    float scale;            /* the current multiplier of the loss */
    int64_t growth_tracker; /* consecutive clean steps since the last change */
    int64_t skipped;        /* steps skipped for inf/nan since init */
    int64_t steps;          /* updates since init */
} dt_scaler;

/* The defaults above. */
dt_scaler_config dt_scaler_config_default(void);

/* The defaults, overridden by DT_LOSS_SCALE_INIT, DT_LOSS_SCALE_GROWTH,
 * DT_LOSS_SCALE_BACKOFF and DT_LOSS_SCALE_INTERVAL where set. DT_ERR_INVALID
 * names the variable, the value and the accepted range; *out is untouched. */
dt_status dt_scaler_config_from_env(dt_scaler_config *out);

/* Validate cfg (NULL means the defaults) and start. DT_ERR_INVALID names
 * the bad field and value. */
dt_status dt_scaler_init(dt_scaler *s, const dt_scaler_config *cfg);

static inline float dt_scaler_scale(const dt_scaler *s) { return s->scale; }

/* After a step: found_inf -> scale *= backoff, tracker = 0, skipped++;
 * else tracker++, and at growth_interval scale *= growth, tracker = 0.
 * Returns true if the step must be skipped (found_inf). The scale stays a
 * finite positive float: growth saturates below FLT_MAX, and backoff stops
 * at the smallest normal float. */
bool dt_scaler_update(dt_scaler *s, bool found_inf);

/* Checkpoint state: scale, growth tracker, skipped, steps. set validates
 * (scale finite > 0, counters >= 0, tracker < interval). */
typedef struct dt_scaler_state {
    float scale;
    int64_t growth_tracker, skipped, steps;
} dt_scaler_state;
void dt_scaler_get_state(const dt_scaler *s, dt_scaler_state *out);
dt_status dt_scaler_set_state(dt_scaler *s, const dt_scaler_state *st);

/* True if any of x[0..n) is inf or nan. Vectorised, reads the whole buffer. */
bool dt_has_inf_nan(const float *x, size_t n);

/* x *= inv_scale over x[0..n), and returns true if any element is inf or
 * nan before scaling (one pass; the buffer is scaled either way). */
bool dt_unscale(float *x, size_t n, float inv_scale);

#ifdef __cplusplus
}
#endif
#endif /* DTRAIN_AMP_H */
