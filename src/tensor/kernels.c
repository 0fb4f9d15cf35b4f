/*
 * kernels.c — layernorm, GELU, residual, embedding, softmax and fused
 * softmax + cross-entropy, forward and backward side by side.
 *
 * Invariants: no allocation; rows are independent so threads split rows
 * (dynamically, in small chunks: on a shared machine a preempted thread then
 * delays a barrier by one chunk, not by half the kernel);
 * where a reduction runs across rows (a parameter gradient) threads split
 * the columns instead and walk rows in order, so results are bit-identical
 * for any thread count. AVX-512 paths compute the same formulas as the
 * scalar ones (row sums may differ in the last bits by summation order).
 */
#include "dtrain/tensor.h"

#include "simd.h"
#include "tensor_internal.h"

#include <math.h>
#include <omp.h>
#include <string.h>

/* Below this many elements a kernel runs on the calling thread only: waking
 * the pool costs more than it saves. */
#define PAR_MIN 32768

/* ------------------------------------------------------------------------ */
/* LayerNorm                                                                */
/* ------------------------------------------------------------------------ */

/* One row of the forward: y = (x - mean) * rstd * weight + bias. Not
 * inlined on purpose: dt_layernorm_forward and dt_residual_layernorm_forward
 * run this one compiled body, so a row normalised by either has the same
 * bits (recomputation relies on it). */
__attribute__((noinline)) static void layernorm_forward_row(float *y, float *mean, float *rstd,
                                                            const float *x, const float *weight,
                                                            const float *bias, int C) {
    const float eps = 1e-5f;
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int c = 0; c < C; c++)
        s += x[c];
    float m = s / (float)C;
    float v = 0.0f;
#pragma omp simd reduction(+ : v)
    for (int c = 0; c < C; c++)
        v += (x[c] - m) * (x[c] - m);
    float r = 1.0f / sqrtf(v / (float)C + eps);
#ifdef __AVX512F__
    __m512 vm = _mm512_set1_ps(m), vr = _mm512_set1_ps(r);
    int c = 0;
    for (; c + 16 <= C; c += 16) {
        __m512 n = _mm512_mul_ps(_mm512_sub_ps(_mm512_loadu_ps(x + c), vm), vr);
        _mm512_storeu_ps(
            y + c, _mm512_fmadd_ps(n, _mm512_loadu_ps(weight + c), _mm512_loadu_ps(bias + c)));
    }
    for (; c < C; c++)
        y[c] = (x[c] - m) * r * weight[c] + bias[c];
#else
    for (int c = 0; c < C; c++)
        y[c] = (x[c] - m) * r * weight[c] + bias[c];
#endif
    *mean = m;
    *rstd = r;
}

void dt__layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                           const float *weight, const float *bias, int N, int C) {
#pragma omp parallel for if ((size_t)N * C > PAR_MIN) schedule(dynamic, 16)
    for (int i = 0; i < N; i++)
        layernorm_forward_row(out + (size_t)i * C, &mean[i], &rstd[i], inp + (size_t)i * C, weight,
                              bias, C);
}

void dt__residual_layernorm_forward(float *res, float *out, float *mean, float *rstd,
                                    const float *a, const float *b, const float *bias,
                                    const float *weight, const float *lnbias, int N, int C) {
    /* Row by row: the sum is written and normalised while it is in L1, so
     * the LayerNorm does not read res back from L2/memory. The sum has the
     * residual kernels' formulas, the row the LayerNorm's body. */
#pragma omp parallel for if ((size_t)N * C > PAR_MIN) schedule(dynamic, 16)
    for (int i = 0; i < N; i++) {
        const float *ai = a + (size_t)i * C, *bi = b + (size_t)i * C;
        float *ri = res + (size_t)i * C;
        if (bias) {
#pragma omp simd
            for (int c = 0; c < C; c++)
                ri[c] = ai[c] + (bi[c] + bias[c]);
        } else {
#pragma omp simd
            for (int c = 0; c < C; c++)
                ri[c] = ai[c] + bi[c];
        }
        layernorm_forward_row(out + (size_t)i * C, &mean[i], &rstd[i], ri, weight, lnbias, C);
    }
}

/* dx of one row: with n = (x - mean) * rstd and g = weight * dout,
 * dx += rstd * (g - mean(g) - n * mean(g * n)). */
static inline void layernorm_backward_row(float *dx, const float *dy, const float *x,
                                          const float *weight, float m, float r, int C) {
    float sg = 0.0f, sgn = 0.0f;
#pragma omp simd reduction(+ : sg, sgn)
    for (int c = 0; c < C; c++) {
        float g = weight[c] * dy[c];
        sg += g;
        sgn += g * (x[c] - m) * r;
    }
    sg /= (float)C;
    sgn /= (float)C;
#ifdef __AVX512F__
    __m512 vm = _mm512_set1_ps(m), vr = _mm512_set1_ps(r);
    __m512 vsg = _mm512_set1_ps(sg), vsgn = _mm512_set1_ps(sgn);
    int c = 0;
    for (; c + 16 <= C; c += 16) {
        __m512 n = _mm512_mul_ps(_mm512_sub_ps(_mm512_loadu_ps(x + c), vm), vr);
        __m512 g = _mm512_mul_ps(_mm512_loadu_ps(weight + c), _mm512_loadu_ps(dy + c));
        __m512 t = _mm512_fnmadd_ps(n, vsgn, _mm512_sub_ps(g, vsg));
        _mm512_storeu_ps(dx + c, _mm512_fmadd_ps(t, vr, _mm512_loadu_ps(dx + c)));
    }
    for (; c < C; c++) {
        float n = (x[c] - m) * r;
        dx[c] += (weight[c] * dy[c] - sg - n * sgn) * r;
    }
#else
    for (int c = 0; c < C; c++) {
        float n = (x[c] - m) * r;
        dx[c] += (weight[c] * dy[c] - sg - n * sgn) * r;
    }
#endif
}

/* One thread: every row once, dinp and the dweight/dbias sums together while
 * the row is in L1 (the threaded path below reads x and dout twice). The
 * column sums run over the rows in the same order from zero and are then
 * added, as the column blocks do, so the results are the same bits. */
enum { LN_ONE_PASS_MAX = 2048 };
static void layernorm_backward_one_pass(float *dinp, float *dweight, float *dbias,
                                        const float *dout, const float *inp, const float *weight,
                                        const float *mean, const float *rstd, int N, int C,
                                        bool acc) {
    float dw[LN_ONE_PASS_MAX], db[LN_ONE_PASS_MAX];
    memset(dw, 0, (size_t)C * sizeof(float));
    memset(db, 0, (size_t)C * sizeof(float));
    for (int i = 0; i < N; i++) {
        const float *x = inp + (size_t)i * C;
        const float *dy = dout + (size_t)i * C;
        float m = mean[i], r = rstd[i];
        if (dinp)
            layernorm_backward_row(dinp + (size_t)i * C, dy, x, weight, m, r, C);
        if (!dweight)
            continue;
#pragma omp simd
        for (int c = 0; c < C; c++) {
            dw[c] += (x[c] - m) * r * dy[c];
            db[c] += dy[c];
        }
    }
    for (int c = 0; dweight && c < C; c++) {
        dweight[c] = (acc ? dweight[c] : 0.0f) + dw[c];
        dbias[c] = (acc ? dbias[c] : 0.0f) + db[c];
    }
}

void dt_layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                           const float *inp, const float *weight, const float *mean,
                           const float *rstd, int N, int C) {
    dt_layernorm_backward_mode(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C,
                               DT_GRAD_ACCUMULATE);
}

void dt__layernorm_backward_mode(float *dinp, float *dweight, float *dbias, const float *dout,
                                 const float *inp, const float *weight, const float *mean,
                                 const float *rstd, int N, int C, dt_grad_mode mode) {
    /* dweight and dbias are written once, from sums started at zero: the
     * mode only decides whether the old value is added (0 + sum else). */
    const bool acc = mode == DT_GRAD_ACCUMULATE;
    if (!((size_t)N * C > PAR_MIN && omp_get_max_threads() > 1 && !omp_in_parallel()) &&
        C <= LN_ONE_PASS_MAX) {
        layernorm_backward_one_pass(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C, acc);
        return;
    }
    /* One parallel region, two independent loops (no barrier between
     * them): rows for dinp, column blocks for dweight and dbias. */
    enum { CB = 64 };
    int nb = (C + CB - 1) / CB;
#pragma omp parallel if ((size_t)N * C > PAR_MIN)
    {
        /* dinp: rows are independent. */
#pragma omp for schedule(dynamic, 16) nowait
        for (int i = 0; i < (dinp ? N : 0); i++) {
            layernorm_backward_row(dinp + (size_t)i * C, dout + (size_t)i * C, inp + (size_t)i * C,
                                   weight, mean[i], rstd[i], C);
        }
        /* dweight += sum_rows n * dout, dbias += sum_rows dout: column blocks. */
#pragma omp for schedule(dynamic, 1)
        for (int cb = 0; cb < (dweight ? nb : 0); cb++) {
            int c0 = cb * CB, c1 = c0 + CB < C ? c0 + CB : C;
            float dw[CB] = {0}, db[CB] = {0};
            for (int i = 0; i < N; i++) {
                const float *x = inp + (size_t)i * C;
                const float *dy = dout + (size_t)i * C;
                float m = mean[i], r = rstd[i];
#pragma omp simd
                for (int c = c0; c < c1; c++) {
                    dw[c - c0] += (x[c] - m) * r * dy[c];
                    db[c - c0] += dy[c];
                }
            }
            for (int c = c0; c < c1; c++) {
                dweight[c] = (acc ? dweight[c] : 0.0f) + dw[c - c0];
                dbias[c] = (acc ? dbias[c] : 0.0f) + db[c - c0];
            }
        }
    } /* omp parallel */
}

/* ------------------------------------------------------------------------ */
/* GELU (tanh approximation)                                                */
/* ------------------------------------------------------------------------ */

#define GELU_K 0.7978845608028654f /* sqrt(2/pi) */
#define GELU_A 0.044715f

/* GELU in its logistic form: 0.5 x (1 + tanh(u)) = x s with
 * s = sigmoid(2u) = 1 / (1 + exp(-2u)), u = k (x + a x^3). One exp and one
 * division, as the tanh form needs, but fewer operations around them (the
 * kernels are partly compute-bound: ~25 instructions per 16 elements for 8
 * bytes of traffic per element). Limits: x -> +inf gives s = 1, x; x -> -inf
 * gives exp(-2u) = inf (dt__exp16 saturates), s = 0, -0.
 * gelu'(x) = s + 2 k x s (1 - s) (1 + 3 a x^2). */
static inline float gelu_scalar(float x) {
    return x / (1.0f + expf(-2.0f * GELU_K * (x + GELU_A * x * x * x)));
}

static inline float gelu_grad(float x) {
    float s = 1.0f / (1.0f + expf(-2.0f * GELU_K * (x + GELU_A * x * x * x)));
    return s + 2.0f * GELU_K * x * s * (1.0f - s) * (1.0f + 3.0f * GELU_A * x * x);
}

#ifdef __AVX512F__
/* exp(-2u) for the 16 lanes of x. */
static inline __m512 gelu_exp16(__m512 x, __m512 x2) {
    const __m512 a = _mm512_set1_ps(GELU_A), m2k = _mm512_set1_ps(-2.0f * GELU_K);
    return dt__exp16(_mm512_mul_ps(m2k, _mm512_fmadd_ps(_mm512_mul_ps(a, x2), x, x)));
}

static inline __m512 gelu16(__m512 x) {
    __m512 e = gelu_exp16(x, _mm512_mul_ps(x, x));
    return _mm512_div_ps(x, _mm512_add_ps(e, _mm512_set1_ps(1.0f)));
}

static inline __m512 gelu_grad16(__m512 x) {
    const __m512 one = _mm512_set1_ps(1.0f), a3 = _mm512_set1_ps(3.0f * GELU_A);
    const __m512 k2 = _mm512_set1_ps(2.0f * GELU_K);
    __m512 x2 = _mm512_mul_ps(x, x);
    __m512 s = _mm512_div_ps(one, _mm512_add_ps(gelu_exp16(x, x2), one));
    __m512 xss = _mm512_mul_ps(_mm512_mul_ps(x, s), _mm512_sub_ps(one, s));
    __m512 du = _mm512_mul_ps(k2, _mm512_fmadd_ps(a3, x2, one));
    return _mm512_fmadd_ps(xss, du, s);
}
#endif

void dt__gelu_forward(float *out, const float *inp, size_t n) {
    // out (n) = 0.5 x (1 + tanh(k (x + a x^3)))
    const size_t chunk = 4096;
    size_t nchunks = (n + chunk - 1) / chunk;
#pragma omp parallel for if (n > PAR_MIN) schedule(dynamic, 16)
    for (size_t ch = 0; ch < nchunks; ch++) {
        size_t i = ch * chunk, end = i + chunk < n ? i + chunk : n;
#ifdef __AVX512F__
        for (; i + 16 <= end; i += 16)
            _mm512_storeu_ps(out + i, gelu16(_mm512_loadu_ps(inp + i)));
#endif
        for (; i < end; i++)
            out[i] = gelu_scalar(inp[i]);
    }
}

void dt__gelu_bias_forward(float *out, const float *inp, const float *bias, int N, int C) {
    // out (N,C) = gelu(inp + bias): the linear layer's bias added in the GELU
    // pass instead of seeding the product's output with it. inp is not
    // written back (backward adds the bias again): one stream of (N,C) fewer
#pragma omp parallel for if ((size_t)N * C > PAR_MIN) schedule(dynamic, 4)
    for (int i = 0; i < N; i++) {
        const float *x = inp + (size_t)i * C;
        float *y = out + (size_t)i * C;
        int c = 0;
#ifdef __AVX512F__
        for (; c + 16 <= C; c += 16)
            _mm512_storeu_ps(
                y + c, gelu16(_mm512_add_ps(_mm512_loadu_ps(x + c), _mm512_loadu_ps(bias + c))));
#endif
        for (; c < C; c++)
            y[c] = gelu_scalar(x[c] + bias[c]);
    }
}

void dt__gelu_bias_backward(float *dinp, const float *inp, const float *bias, const float *dout,
                            int N, int C) {
    // dinp (N,C) = dout * gelu'(inp + bias), the same sum as the forward's
#pragma omp parallel for if ((size_t)N * C > PAR_MIN) schedule(dynamic, 4)
    for (int i = 0; i < N; i++) {
        const float *x = inp + (size_t)i * C, *dy = dout + (size_t)i * C;
        float *dx = dinp + (size_t)i * C;
        int c = 0;
#ifdef __AVX512F__
        for (; c + 16 <= C; c += 16) {
            __m512 v = _mm512_add_ps(_mm512_loadu_ps(x + c), _mm512_loadu_ps(bias + c));
            _mm512_storeu_ps(dx + c, _mm512_mul_ps(gelu_grad16(v), _mm512_loadu_ps(dy + c)));
        }
#endif
        for (; c < C; c++)
            dx[c] = gelu_grad(x[c] + bias[c]) * dy[c];
    }
}

void dt__gelu_backward(float *dinp, const float *inp, const float *dout, size_t n) {
    const size_t chunk = 4096;
    size_t nchunks = (n + chunk - 1) / chunk;
#pragma omp parallel for if (n > PAR_MIN) schedule(dynamic, 16)
    for (size_t ch = 0; ch < nchunks; ch++) {
        size_t i = ch * chunk, end = i + chunk < n ? i + chunk : n;
#ifdef __AVX512F__
        for (; i + 16 <= end; i += 16)
            _mm512_storeu_ps(dinp + i, _mm512_mul_ps(gelu_grad16(_mm512_loadu_ps(inp + i)),
                                                     _mm512_loadu_ps(dout + i)));
#endif
        for (; i < end; i++)
            dinp[i] = gelu_grad(inp[i]) * dout[i];
    }
}

bool dt_all_finite(const float *x, size_t n) {
    uint32_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &x[i], 4);
        bad |= (u & 0x7f800000u) == 0x7f800000u;
    }
    return !bad;
}

/* ------------------------------------------------------------------------ */
/* Residual                                                                 */
/* ------------------------------------------------------------------------ */

/* Elementwise loops run over blocks of RES_BLOCK elements: the pool takes
 * whole blocks (schedule(dynamic, 16) on single elements cost one atomic
 * grab per 16 floats, ~1 ms per (B,T,C) add at B=8 T=256 C=384 even on one
 * thread, 3-4x the add itself). */
#define RES_BLOCK 4096

void dt__residual_forward(float *out, const float *a, const float *b, size_t n) {
    size_t nb = (n + RES_BLOCK - 1) / RES_BLOCK;
#pragma omp parallel for if (n > PAR_MIN) schedule(dynamic, 4)
    for (size_t blk = 0; blk < nb; blk++) {
        size_t i0 = blk * RES_BLOCK, i1 = i0 + RES_BLOCK < n ? i0 + RES_BLOCK : n;
#pragma omp simd
        for (size_t i = i0; i < i1; i++)
            out[i] = a[i] + b[i];
    }
}

/* dst += src over n elements, in blocks (see RES_BLOCK). */
static void add_into(float *dst, const float *src, size_t n) {
    size_t nb = (n + RES_BLOCK - 1) / RES_BLOCK;
#pragma omp parallel for if (n > PAR_MIN) schedule(dynamic, 4)
    for (size_t blk = 0; blk < nb; blk++) {
        size_t i0 = blk * RES_BLOCK, i1 = i0 + RES_BLOCK < n ? i0 + RES_BLOCK : n;
#pragma omp simd
        for (size_t i = i0; i < i1; i++)
            dst[i] += src[i];
    }
}

void dt_residual_backward(float *da, float *db, const float *dout, size_t n) {
    if (da)
        add_into(da, dout, n);
    if (db)
        add_into(db, dout, n);
}

/* ------------------------------------------------------------------------ */
/* Embedding: token + position                                              */
/* ------------------------------------------------------------------------ */

void dt__embedding_forward(float *out, const int32_t *tokens, const float *wte, const float *wpe,
                           int B, int T, int C) {
    int N = B * T;
#pragma omp parallel for if ((size_t)N * C > PAR_MIN) schedule(dynamic, 16)
    for (int i = 0; i < N; i++) {
        const float *te = wte + (size_t)tokens[i] * C; // (C)
        const float *pe = wpe + (size_t)(i % T) * C;   // (C)
        float *o = out + (size_t)i * C;
#pragma omp simd
        for (int c = 0; c < C; c++)
            o[c] = te[c] + pe[c];
    }
}

void dt_embedding_backward(float *dwte, float *dwpe, const float *dout, const int32_t *tokens,
                           int B, int T, int C) {
    dt_embedding_backward_mode(dwte, dwpe, dout, tokens, B, T, C, DT_GRAD_ACCUMULATE);
}

void dt__embedding_backward_mode(float *dwte, float *dwpe, const float *dout, const int32_t *tokens,
                                 int B, int T, int C, dt_grad_mode wpe_mode) {
    /* Two tokens may share a row of dwte, so threads split the columns and
     * every thread walks all positions in order: race-free and the same sum
     * order for any thread count. Overwriting dwpe: the first sequence
     * (i < T) adds its gradient to 0 instead of to the old row. */
    const bool acc = wpe_mode == DT_GRAD_ACCUMULATE;
    enum { CB = 64 };
    int nb = (C + CB - 1) / CB, N = B * T;
#pragma omp parallel for if ((size_t)N * C > PAR_MIN) schedule(dynamic, 16)
    for (int cb = 0; cb < nb; cb++) {
        int c0 = cb * CB, c1 = c0 + CB < C ? c0 + CB : C;
        for (int i = 0; i < N; i++) {
            const float *g = dout + (size_t)i * C;
            float *te = dwte + (size_t)tokens[i] * C;
            float *pe = dwpe + (size_t)(i % T) * C;
            if (!acc && i < T) {
#pragma omp simd
                for (int c = c0; c < c1; c++) {
                    te[c] += g[c];
                    pe[c] = 0.0f + g[c];
                }
                continue;
            }
#pragma omp simd
            for (int c = c0; c < c1; c++) {
                te[c] += g[c];
                pe[c] += g[c];
            }
        }
    }
}

/* ------------------------------------------------------------------------ */
/* Softmax and fused cross-entropy                                          */
/* ------------------------------------------------------------------------ */

void dt_softmax_forward(float *probs, const float *logits, int N, int V) {
#pragma omp parallel for if ((size_t)N * V > PAR_MIN) schedule(dynamic, 16)
    for (int i = 0; i < N; i++) {
        const float *x = logits + (size_t)i * V;
        float *p = probs + (size_t)i * V;
        float m = dt__max(x, (size_t)V);
        float s = dt__exp_shift_sum(p, x, m, (size_t)V);
        dt__scal(p, 1.0f / s, (size_t)V);
    }
}

float dt__crossentropy_forward(float *losses, float *lse, const float *logits,
                               const int32_t *targets, int N, int V) {
    double total = 0.0;
#pragma omp parallel for if ((size_t)N * V > PAR_MIN) schedule(dynamic, 16) reduction(+ : total)
    for (int i = 0; i < N; i++) {
        const float *x = logits + (size_t)i * V; // (V)
        float l = dt__lse(x, (size_t)V);
        lse[i] = l;
        losses[i] = l - x[targets[i]];
        total += losses[i];
    }
    return N > 0 ? (float)(total / N) : 0.0f;
}

void dt__crossentropy_backward(float *dlogits, const float *logits, const float *lse,
                               const int32_t *targets, float scale, int N, int V) {
    // dlogits (N,V) = scale * (exp(logits - lse) - onehot)
#pragma omp parallel for if ((size_t)N * V > PAR_MIN) schedule(dynamic, 16)
    for (int i = 0; i < N; i++) {
        const float *x = logits + (size_t)i * V;
        float *d = dlogits + (size_t)i * V;
        dt__exp_shift_scale(d, x, lse[i], scale, (size_t)V);
        d[targets[i]] -= scale;
    }
}
