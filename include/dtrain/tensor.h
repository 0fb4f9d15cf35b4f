/*
 * dtrain/tensor.h — the fp32 compute kernels the nn layer is built from.
 *
 * Overview
 * --------
 * A kernel is a plain function over caller-owned flat arrays: nothing here
 * allocates, nothing keeps a pointer after it returns. Every op comes as a
 * forward/backward pair written side by side (dt_<op>_forward,
 * dt_<op>_backward). Arguments are ordered outputs, then inputs, then sizes;
 * a gradient carries a `d` prefix; the comment on each pointer gives its
 * shape in row-major order, e.g. (B,T,C).
 *
 *   - Matrix multiplies go to OpenBLAS (cblas_sgemm) or oneDNN (dnnl_sgemm).
 *   - Runtime CPU-feature detection (dt_isa(), DT_ISA) lives here: oneDNN's
 *     ISA cap is fixed from it, and amp's kernels dispatch on it.
 *   - Everything else is ours: AVX-512 paths selected at compile time
 *     (-march=native on an AVX-512 machine) with a scalar fallback that
 *     computes the same thing.
 *   - Backward kernels say per argument whether they overwrite (=) or
 *     accumulate (+=). Parameter gradients accumulate, so several
 *     micro-batches can add into one gradient buffer; the *_mode variants
 *     take a dt_grad_mode and can overwrite them instead (the first
 *     micro-batch of a step then needs no zeroed buffer). Overwriting
 *     writes 0 + g, the very bits zero-then-accumulate writes.
 *   - Threads: one OpenMP pool, sized by dt_tensor_set_threads() (--threads /
 *     DT_THREADS). OpenBLAS runs single-threaded; dt_sgemm splits a large
 *     product into one block of C per thread.
 *
 * Attention
 * ---------
 * dt_attention_forward/backward compute causal multi-head self-attention in
 * blocks of DT_ATTN_BLOCK queries against blocks of keys (DT_ATTN_BLOCK in
 * backward, up to 256 in forward) with an online softmax (the "flash" scheme):
 * the (T,T) score matrix is never stored. Forward saves only the output and
 * the log-sum-exp of each query row, so the memory kept for backward is
 * O(T) per head. dt_attention_naive_* materialise the (T,T) probabilities and
 * exist as an independent reference for the tests.
 *
 * Example: one linear layer, forward and backward
 * -----------------------------------------------
 *     dt_matmul_forward(out, inp, w, b, N, IC, OC);          // out = inp w^T + b
 *     ...
 *     dt_matmul_backward(dinp, dw, db, dout, inp, w, N, IC, OC);
 */
#ifndef DTRAIN_TENSOR_H
#define DTRAIN_TENSOR_H

#include "dtrain/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Keys (and queries) processed per block by the flash attention kernels. */
#define DT_ATTN_BLOCK 64

/* How a backward kernel writes a parameter gradient. */
typedef enum dt_grad_mode {
    DT_GRAD_ACCUMULATE = 0, /* grad += g (the plain kernels' behaviour) */
    DT_GRAD_OVERWRITE = 1   /* grad = 0 + g: the old contents are never read,
                               so they may be garbage (even NaN) */
} dt_grad_mode;

/* ------------------------------------------------------------------------ */
/* Threads                                                                  */
/* ------------------------------------------------------------------------ */

/* Use n threads (>= 1) for our kernels and for sgemm (both through OpenMP).
 * Also sets flush-to-zero and denormals-are-zero (MXCSR) on the calling
 * thread and the pool threads: denormal operands slow sgemm ~10x. */
void dt_tensor_set_threads(int n);
/* The count last set (or the default: DT_THREADS, else the CPU count). */
int dt_tensor_threads(void);
/* Planning (dtrain plan memory): the scratch this layer's kernels keep in
 * all over `threads` pool threads (the AVX-512 dW GEMM's packs, the
 * attention kernels' scratch for sequences of T and heads of head_size).
 * The BLAS's own buffers (OpenBLAS) are not in it. */
size_t dt_tensor_plan_workspace(int threads, int T, int head_size);
/* Read DT_THREADS (1..1024; unset = dt_cpu_count()) and apply it. */
dt_status dt_tensor_threads_from_env(int *out);

/* True when the AVX-512 kernels were compiled in. */
bool dt_tensor_have_avx512(void);

/* ------------------------------------------------------------------------ */
/* Matrix multiply (OpenBLAS)                                               */
/* ------------------------------------------------------------------------ */

/* Row-major C (M,N) = alpha * op(A) op(B) + beta * C, op = transpose if set.
 * A is (M,K) or (K,M) when trans_a; B is (K,N) or (N,K) when trans_b. */
void dt_sgemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float *A, int lda,
              const float *B, int ldb, float beta, float *C, int ldc);

/* out = inp @ weight^T + bias (bias may be NULL).
 * out (N,OC) =; inp (N,IC); weight (OC,IC); bias (OC). */
void dt_matmul_forward(float *out, const float *inp, const float *weight, const float *bias, int N,
                       int IC, int OC);
/* dinp (N,IC) = (skipped if NULL); dweight (OC,IC) += (skipped if NULL, and
 * dbias with it); dbias (OC) += (skipped if NULL); dout (N,OC); inp (N,IC);
 * weight (OC,IC). The parts are independent: computing dinp in one call and
 * dweight, dbias in another gives the bits of one call doing both. */
void dt_matmul_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                        const float *inp, const float *weight, int N, int IC, int OC);
/* The same with dweight and dbias written per mode. */
void dt_matmul_backward_mode(float *dinp, float *dweight, float *dbias, const float *dout,
                             const float *inp, const float *weight, int N, int IC, int OC,
                             dt_grad_mode mode);

/* ------------------------------------------------------------------------ */
/* Elementwise and normalisation                                            */
/* ------------------------------------------------------------------------ */

/* LayerNorm over the last dimension, eps = 1e-5.
 * out (N,C) =; mean, rstd (N) = (saved for backward); inp (N,C); weight, bias (C). */
void dt_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                          const float *weight, const float *bias, int N, int C);
/* A residual add and the LayerNorm that reads its sum, in one pass over
 * the rows: res (N,C) = a + (b + bias) (bias (C) may be NULL: a + b), then
 * out, mean, rstd = dt_layernorm_forward(res, weight, lnbias). The same bits
 * as that add (dt_residual_forward without bias) followed by
 * dt_layernorm_forward. res may not alias a, b or out. */
void dt_residual_layernorm_forward(float *res, float *out, float *mean, float *rstd, const float *a,
                                   const float *b, const float *bias, const float *weight,
                                   const float *lnbias, int N, int C);
/* dinp (N,C) += (skipped if NULL); dweight, dbias (C) += (both skipped if
 * dweight is NULL); dout (N,C); inp (N,C); weight (C); mean, rstd (N) from
 * forward. Split into two calls, the parts have the bits of one call. */
void dt_layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                           const float *inp, const float *weight, const float *mean,
                           const float *rstd, int N, int C);
/* The same with dweight and dbias written per mode (dinp still +=). */
void dt_layernorm_backward_mode(float *dinp, float *dweight, float *dbias, const float *dout,
                                const float *inp, const float *weight, const float *mean,
                                const float *rstd, int N, int C, dt_grad_mode mode);

/* GELU, tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))),
 * computed as x / (1 + exp(-2 sqrt(2/pi) (x + 0.044715 x^3))) (the same function).
 * out (n) =; inp (n). */
void dt_gelu_forward(float *out, const float *inp, size_t n);
/* The linear layer's bias added in the GELU pass: out (N,C) = gelu(inp +
 * bias (C)); inp is left as it is (dt_gelu_bias_backward adds the bias
 * again). With a product computed without bias this replaces seeding its
 * output with the bias. */
void dt_gelu_bias_forward(float *out, const float *inp, const float *bias, int N, int C);
/* dinp (N,C) = dout * gelu'(inp + bias); may alias dout. */
void dt_gelu_bias_backward(float *dinp, const float *inp, const float *bias, const float *dout,
                           int N, int C);
/* dinp (n) = dout * gelu'(inp); may alias dout. */
void dt_gelu_backward(float *dinp, const float *inp, const float *dout, size_t n);

/* No inf or NaN among x[0..n) (exponent bits all ones); integer tests, so
 * it vectorises and no floating-point exception is raised. */
bool dt_all_finite(const float *x, size_t n);

/* out (n) = a + b. Its backward is the identity: both inputs receive dout. */
void dt_residual_forward(float *out, const float *a, const float *b, size_t n);
/* da (n) += dout; db (n) += dout (either may be NULL). */
void dt_residual_backward(float *da, float *db, const float *dout, size_t n);

/* ------------------------------------------------------------------------ */
/* Embeddings                                                               */
/* ------------------------------------------------------------------------ */

/* out[b,t,:] = wte[tokens[b,t],:] + wpe[t,:].
 * out (B,T,C) =; tokens (B,T) each in [0,V); wte (V,C); wpe (>=T,C). */
void dt_embedding_forward(float *out, const int32_t *tokens, const float *wte, const float *wpe,
                          int B, int T, int C);
/* dwte (V,C) +=; dwpe (>=T,C) +=; dout (B,T,C); tokens (B,T). */
void dt_embedding_backward(float *dwte, float *dwpe, const float *dout, const int32_t *tokens,
                           int B, int T, int C);
/* The same with rows [0,T) of dwpe written per wpe_mode (rows >= T are not
 * touched). dwte always accumulates: only the rows of tokens present get a
 * gradient (the tied LM head writes all of them first). */
void dt_embedding_backward_mode(float *dwte, float *dwpe, const float *dout, const int32_t *tokens,
                                int B, int T, int C, dt_grad_mode wpe_mode);

/* ------------------------------------------------------------------------ */
/* Softmax and cross-entropy                                                */
/* ------------------------------------------------------------------------ */

/* Row-wise softmax. probs (N,V) =; logits (N,V) (may alias probs). */
void dt_softmax_forward(float *probs, const float *logits, int N, int V);

/* Fused softmax + cross-entropy: losses[i] = lse_i - logits[i, targets[i]],
 * lse_i = log sum_j exp(logits[i,j]). Probabilities are never stored.
 * losses (N) =; lse (N) = (saved for backward); logits (N,V); targets (N) in [0,V).
 * Returns the mean loss (accumulated in double). */
float dt_crossentropy_forward(float *losses, float *lse, const float *logits,
                              const int32_t *targets, int N, int V);
/* dlogits (N,V) = scale * (softmax(logits) - onehot(targets)); may alias
 * logits (then the logits are overwritten). lse (N) from forward. For the mean
 * loss, scale = 1/N. */
void dt_crossentropy_backward(float *dlogits, const float *logits, const float *lse,
                              const int32_t *targets, float scale, int N, int V);

/* ------------------------------------------------------------------------ */
/* Causal self-attention                                                    */
/* ------------------------------------------------------------------------ */

/* qkv (B,T,3C) holds q | k | v along the last dimension, each (NH, HS=C/NH)
 * with heads contiguous. Scores are scaled by 1/sqrt(HS).
 * out (B,T,C) =; lse (B,NH,T) = log-sum-exp of each query's scaled scores. */
void dt_attention_forward(float *out, float *lse, const float *qkv, int B, int T, int C, int NH);
/* dqkv (B,T,3C) =; dout (B,T,C); qkv, out, lse from forward. */
void dt_attention_backward(float *dqkv, const float *dout, const float *qkv, const float *out,
                           const float *lse, int B, int T, int C, int NH);

/* Blocks of context-parallel attention (ring attention): one sequence's
 * queries against keys that all come before them, so every query sees every
 * key (no mask). Rows hold C = NH * HS channels, heads contiguous:
 *   q (Tq rows, stride ldq), kv (Tk rows, stride ldkv: k at kv, v at kv + C),
 *   out (Tq, C) =, lse (NH rows of stride ld_lse) = the block's log-sum-exp.
 * The partial result joins the running one with dt_attention_merge. */
void dt_attention_cross_forward(float *out, float *lse, size_t ld_lse, const float *q, size_t ldq,
                                const float *kv, size_t ldkv, int Tq, int Tk, int C, int NH);
/* Its backward, ACCUMULATING into dq (stride ldq) and dkv (stride ldkv, dk
 * at dkv, dv at dkv + C). out and lse are the FINAL ones (after every
 * merge): with them one block's share of the gradient is exact. */
void dt_attention_cross_backward(float *dq, float *dkv, const float *dout, const float *q,
                                 size_t ldq, const float *kv, size_t ldkv, const float *out,
                                 const float *lse, size_t ld_lse, int Tq, int Tk, int C, int NH);
/* out, lse (Tq rows; lse as above) become the softmax over the union of
 * their keys and those of a partial result (pout, plse of the same shape):
 *   lse' = log(e^lse + e^plse),  out' = e^(lse-lse') out + e^(plse-lse') pout. */
void dt_attention_merge(float *out, float *lse, size_t ld_lse, const float *pout, const float *plse,
                        size_t ld_plse, int Tq, int C, int NH);

/* Reference: stores the probabilities. att (B,NH,T,T) = (saved for
 * backward); out (B,T,C) =. */
void dt_attention_naive_forward(float *out, float *att, const float *qkv, int B, int T, int C,
                                int NH);
/* dqkv (B,T,3C) =; dout (B,T,C); qkv, att from forward. */
void dt_attention_naive_backward(float *dqkv, const float *dout, const float *qkv, const float *att,
                                 int B, int T, int C, int NH);

/* ------------------------------------------------------------------------ */
/* Instruction-set levels                                                   */
/* ------------------------------------------------------------------------ */

/* Ordered: each level implies the ones below it. */
typedef enum dt_isa_level {
    DT_ISA_SCALAR,     /* plain C */
    DT_ISA_AVX2,       /* AVX2 + FMA + F16C, YMM state enabled by the OS */
    DT_ISA_AVX512,     /* + AVX512 F/BW/VL/DQ, ZMM state enabled */
    DT_ISA_AVX512BF16, /* + AVX512_BF16 (vdpbf16ps, vcvtneps2bf16) */
    DT_ISA_AMX,        /* + AMX-TILE/AMX-BF16, tile state enabled and permitted */
    DT_ISA_COUNT
} dt_isa_level;

/* Individual features found (for reports; dispatch uses the level). */
typedef struct dt_cpu_features {
    bool avx2, fma, f16c;                       /* with YMM state enabled */
    bool avx512f, avx512bw, avx512vl, avx512dq; /* with ZMM state enabled */
    bool avx512_bf16, avx512_fp16;
    bool amx_tile, amx_bf16; /* cpuid bits */
    bool amx_os;             /* XCR0 tile bits set and arch_prctl granted */
    dt_isa_level max_level;  /* best level this CPU + OS can run */
    char amx_note[96];       /* why AMX is unavailable, or "" */
} dt_cpu_features;

/* Detected once (thread-safe); never fails. */
const dt_cpu_features *dt_cpu_features_get(void);

/* Read DT_ISA (once; later calls return the first result). DT_ERR_INVALID for
 * an unknown name, DT_ERR_UNSUPPORTED for a level above the CPU's, each with
 * a message naming the value and what the CPU supports. Optional: dt_isa()
 * calls it lazily and, on error, logs the message and uses the CPU's level. */
dt_status dt_isa_init(void);

/* The active level: min(DT_ISA or dt_isa_set, CPU level). */
dt_isa_level dt_isa(void);

/* Force the active level (tests, benchmarks). DT_ERR_UNSUPPORTED above the
 * CPU's level, leaving the active level unchanged. Not meant to race with
 * running kernels. */
dt_status dt_isa_set(dt_isa_level level);

/* "scalar", "avx2", "avx512", "avx512bf16", "amx"; "?" out of range. */
const char *dt_isa_name(dt_isa_level level);

/* Parse a name of dt_isa_name(); DT_ERR_INVALID with a message otherwise. */
dt_status dt_isa_parse(const char *knob, const char *text, dt_isa_level *out);

#ifdef __cplusplus
}
#endif
#endif /* DTRAIN_TENSOR_H */
