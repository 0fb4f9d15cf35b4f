/*
 * act16.c — the 16-bit activation kernels of the GPT's bf16/fp16 path:
 * conversions, linear layers, layernorm, GELU and attention reading and
 * writing bf16 or fp16 activations (include/dtrain/amp.h has the contract).
 *
 * Invariant: every kernel computes in fp32 what the fp32 kernel of
 * dtrain/tensor.h computes on the widened inputs, and rounds each 16-bit
 * output once. The elementwise kernels, layernorm and attention get there by
 * widening a block of inputs into fp32 scratch, running the fp32 kernel on
 * it and rounding the block back: their results are bit-identical to the
 * fp32 kernel on rounded inputs (tests/unit/test_act16.c checks exactly
 * that). The linear layers differ only in the order of the fp32 sums (the
 * bf16 GEMM backends sum in their own order; with oneDNN the bias is added
 * and the bf16 output rounded inside the primitive, whose vcvtneps2bf16
 * flushes subnormal results to zero); fp16 operands are widened and
 * multiplied by the fp32 kernel itself. Conversions dispatch on dt_isa()
 * (dt_f32_to_bf16 & co.), so DT_ISA= lowers every path here too.
 *
 * Scratch: the linear layers keep one grow-only fp32 buffer (a step reuses
 * the same shapes, so it is allocated once), guarded by a mutex since two
 * callers could share it; dt_gemm_release() frees it.
 */
#include "amp_internal.h"
#include "dtrain/tensor.h"

#include <math.h>
#include <omp.h>
#include <pthread.h>
#include <string.h>

/* Elements per block of the blockwise kernels: small enough for the stack of
 * an OpenMP thread (two fp32 blocks = 32 KiB), large enough to amortise the
 * per-block call. */
#define BLOCK   4096
/* Below this many elements a kernel runs on the calling thread. */
#define PAR_MIN 32768

static inline void check_precision(dt_precision p) {
    DT_ASSERT(p == DT_PRECISION_BF16 || p == DT_PRECISION_FP16);
}

/* Serial conversions of one block (inside a parallel region the array
 * conversions run on the calling thread). */
static inline void widen(dt_precision p, float *out, const uint16_t *in, size_t n) {
    if (p == DT_PRECISION_BF16)
        dt_bf16_to_f32(out, in, n);
    else
        dt_f16_to_f32(out, in, n);
}

static inline void narrow(dt_precision p, uint16_t *out, const float *in, size_t n) {
    if (p == DT_PRECISION_BF16)
        dt_f32_to_bf16(out, in, n);
    else
        dt_f32_to_f16(out, in, n);
}

/* Conversions of arrays of any size, split into BLOCK-aligned chunks over
 * the OpenMP threads above PAR_MIN (activations are 10^5..10^7 elements). */
void dt__act16_from_f32(dt_precision p, uint16_t *out, const float *in, size_t n) {
    check_precision(p);
    size_t nb = (n + BLOCK - 1) / BLOCK;
#pragma omp parallel for if (n > PAR_MIN) schedule(static)
    for (size_t b = 0; b < nb; b++) {
        size_t i = b * BLOCK, len = n - i < BLOCK ? n - i : BLOCK;
        narrow(p, out + i, in + i, len);
    }
}

void dt__act16_to_f32(dt_precision p, float *out, const uint16_t *in, size_t n) {
    check_precision(p);
    size_t nb = (n + BLOCK - 1) / BLOCK;
#pragma omp parallel for if (n > PAR_MIN) schedule(static)
    for (size_t b = 0; b < nb; b++) {
        size_t i = b * BLOCK, len = n - i < BLOCK ? n - i : BLOCK;
        widen(p, out + i, in + i, len);
    }
}

/* ------------------------------------------------------------------------ */
/* Scratch of the linear layers                                             */
/* ------------------------------------------------------------------------ */

static pthread_mutex_t scratch_lock = PTHREAD_MUTEX_INITIALIZER;
static float *scratch;
static size_t scratch_cap; /* floats */

/* Lock the scratch and make it hold n floats; unlock with scratch_put(). */
static dt_status scratch_get(size_t n, float **out) {
    pthread_mutex_lock(&scratch_lock);
    if (n > scratch_cap) {
        dt_free(scratch);
        scratch_cap = 0;
        if (!(scratch = dt_alloc(n * sizeof *scratch))) {
            pthread_mutex_unlock(&scratch_lock);
            return dt_error_set(DT_ERR_NOMEM, "16-bit linear layer: %zu bytes of fp32 scratch",
                                n * sizeof *scratch);
        }
        scratch_cap = n;
    }
    *out = scratch;
    return DT_OK;
}

static void scratch_put(void) { pthread_mutex_unlock(&scratch_lock); }

void dt__act16_release(void) {
    pthread_mutex_lock(&scratch_lock);
    dt_free(scratch);
    scratch = NULL;
    scratch_cap = 0;
    pthread_mutex_unlock(&scratch_lock);
}

/* ------------------------------------------------------------------------ */
/* Linear layers                                                            */
/* ------------------------------------------------------------------------ */

static dt_status check_linear(const char *fn, dt_precision p, const void *a, const void *b,
                              const void *c, int N, int C, int OC) {
    if (p != DT_PRECISION_BF16 && p != DT_PRECISION_FP16)
        return dt_error_set(DT_ERR_INVALID, "%s: precision %s is not a 16-bit type", fn,
                            dt_precision_name(p));
    if (N < 1 || C < 1 || OC < 1)
        return dt_error_set(DT_ERR_INVALID, "%s: sizes N=%d C=%d OC=%d must be >= 1", fn, N, C, OC);
    if (!a || !b || !c)
        return dt_error_set(DT_ERR_INVALID, "%s: NULL array (%p, %p, %p)", fn, a, b, c);
    return DT_OK;
}

/* out (N,OC) fp32 = bias broadcast over rows (the seed the multiply adds to). */
static void seed_bias(float *out, const float *bias, int N, int OC) {
#pragma omp parallel for if ((size_t)N * OC > PAR_MIN) schedule(static)
    for (int i = 0; i < N; i++)
        memcpy(out + (size_t)i * OC, bias, sizeof(float) * (size_t)OC);
}

/* bf16 forward through oneDNN: bias added and output rounded by the
 * primitive itself (one pass, no fp32 scratch). */
static dt_status linear_fwd_onednn(void *out, bool out_f32, const uint16_t *inp, const uint16_t *w,
                                   const float *bias, int N, int C, int OC) {
    dt__gemm_args g = {.op = DT_GEMM_NT,
                       .M = N,
                       .N = OC,
                       .K = C,
                       .A = inp,
                       .B = w,
                       .C = out,
                       .out = out_f32 ? DT_GEMM_OUT_F32 : DT_GEMM_OUT_BF16,
                       .bias = bias};
    return dt__gemm_onednn(&g);
}

dt_status dt__linear16_forward(dt_precision p, void *out, bool out_f32, const uint16_t *inp,
                               const uint16_t *w, const float *bias, int N, int C, int OC) {
    DT_CHECK(check_linear("dt_linear16_forward", p, out, inp, w, N, C, OC));
    size_t nout = (size_t)N * OC, ninp = (size_t)N * C, nw = (size_t)OC * C;
    dt_status st = DT_OK;
    float *s = NULL;
    if (p == DT_PRECISION_FP16) {
        /* Widen both operands (exact) and run the fp32 layer itself. */
        DT_CHECK(scratch_get(ninp + nw + (out_f32 ? 0 : nout), &s));
        float *inp32 = s, *w32 = s + ninp, *out32 = out_f32 ? out : s + ninp + nw;
        dt_act16_to_f32(p, inp32, inp, ninp);
        dt_act16_to_f32(p, w32, w, nw);
        dt_matmul_forward(out32, inp32, w32, bias, N, C, OC);
        if (!out_f32)
            dt_act16_from_f32(p, out, out32, nout);
        scratch_put();
        return DT_OK;
    }
    if (dt_gemm_backend_default() == DT_GEMM_ONEDNN)
        return linear_fwd_onednn(out, out_f32, inp, w, bias, N, C, OC);
    /* bf16 on the other backends: the sum runs in fp32 starting from the
     * bias (like the fp32 layer, which seeds out with the bias and
     * multiplies with beta = 1), then is rounded in one pass. */
    float *out32 = out;
    if (!out_f32) {
        DT_CHECK(scratch_get(nout, &s));
        out32 = s;
    }
    if (bias)
        seed_bias(out32, bias, N, OC);
    st = dt_gemm_bf16(DT_GEMM_NT, N, OC, C, inp, w, out32, DT_GEMM_OUT_F32, bias != NULL);
    if (st == DT_OK && !out_f32)
        dt_act16_from_f32(p, out, out32, nout);
    if (s)
        scratch_put();
    return st;
}

/* dbias (OC) += column sums of dout (N,OC) a16: threads own column blocks
 * and walk the rows in order (the same sums for any thread count). */
static void bias_grad16(dt_precision p, float *dbias, const uint16_t *dout, int N, int OC,
                        bool accumulate) {
    enum { CB = 256 };
    int nb = (OC + CB - 1) / CB;
#pragma omp parallel for if ((size_t)N * OC > PAR_MIN) schedule(dynamic, 1)
    for (int cb = 0; cb < nb; cb++) {
        int c0 = cb * CB, len = c0 + CB < OC ? CB : OC - c0;
        float acc[CB] = {0}, row[CB];
        for (int i = 0; i < N; i++) {
            widen(p, row, dout + (size_t)i * OC + c0, (size_t)len);
#pragma omp simd
            for (int c = 0; c < len; c++)
                acc[c] += row[c];
        }
        for (int c = 0; c < len; c++)
            dbias[c0 + c] = (accumulate ? dbias[c0 + c] : 0.0f) + acc[c];
    }
}

dt_status dt_linear16_backward(dt_precision p, float *dinp, float *dw, float *dbias,
                               const uint16_t *dout, const uint16_t *inp, const uint16_t *w, int N,
                               int C, int OC) {
    return dt_linear16_backward_mode(p, dinp, dw, dbias, dout, inp, w, N, C, OC,
                                     DT_GRAD_ACCUMULATE);
}

dt_status dt__linear16_backward_mode(dt_precision p, float *dinp, float *dw, float *dbias,
                                     const uint16_t *dout, const uint16_t *inp, const uint16_t *w,
                                     int N, int C, int OC, dt_grad_mode mode) {
    const bool acc = mode == DT_GRAD_ACCUMULATE;
    if (!dw && !dinp)
        return dt_error_set(DT_ERR_INVALID, "dt_linear16_backward: neither dinp nor dw");
    DT_CHECK(check_linear("dt_linear16_backward", p, dw ? (const void *)dw : (const void *)dinp,
                          dout, dw ? inp : dout, N, C, OC));
    if (dinp && !w)
        return dt_error_set(DT_ERR_INVALID, "dt_linear16_backward: dinp given but w is NULL");
    size_t nout = (size_t)N * OC, ninp = dw ? (size_t)N * C : 0, nw = (size_t)OC * C;
    if (p == DT_PRECISION_FP16) {
        float *s = NULL;
        DT_CHECK(scratch_get(nout + ninp + (dinp ? nw : 0), &s));
        float *dout32 = s, *inp32 = dw ? s + nout : NULL, *w32 = dinp ? s + nout + ninp : NULL;
        dt_act16_to_f32(p, dout32, dout, nout);
        if (dw)
            dt_act16_to_f32(p, inp32, inp, ninp);
        if (dinp)
            dt_act16_to_f32(p, w32, w, nw);
        dt_matmul_backward_mode(dinp, dw, dbias, dout32, inp32, w32, N, C, OC, mode);
        scratch_put();
        return DT_OK;
    }
    // dinp (N,C) = dout (N,OC) W (OC,C)
    if (dinp)
        DT_CHECK(dt_gemm_bf16(DT_GEMM_NN, N, C, OC, dout, w, dinp, DT_GEMM_OUT_F32, false));
    if (!dw)
        return DT_OK;
    // dW (OC,C) += dout^T (OC,N) inp (N,C). Overwriting clears dW first
    // and accumulates: the bits of zero-then-accumulate on every backend
    // (a product with beta = 0 may leave -0 where that leaves +0).
    if (!acc)
        memset(dw, 0, nw * sizeof(float));
    DT_CHECK(dt_gemm_bf16_with(dt__gemm_backend_for_op(DT_GEMM_TN), DT_GEMM_TN, OC, C, N, dout, inp,
                               dw, DT_GEMM_OUT_F32, true));
    if (dbias)
        bias_grad16(p, dbias, dout, N, OC, acc);
    return DT_OK;
}

/* ------------------------------------------------------------------------ */
/* LayerNorm and GELU                                                       */
/* ------------------------------------------------------------------------ */

/* A row longer than BLOCK (C > 4096; no GPT preset has one): the fp32
 * kernel's formulas, output rounded in BLOCK pieces. */
static void layernorm16_long_row(dt_precision p, uint16_t *out, float *mean, float *rstd,
                                 const float *x, const float *weight, const float *bias, int C) {
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int c = 0; c < C; c++)
        s += x[c];
    float m = s / (float)C, v = 0.0f;
#pragma omp simd reduction(+ : v)
    for (int c = 0; c < C; c++)
        v += (x[c] - m) * (x[c] - m);
    float r = 1.0f / sqrtf(v / (float)C + 1e-5f);
    float y[BLOCK];
    for (int c0 = 0; c0 < C; c0 += BLOCK) {
        int len = C - c0 < BLOCK ? C - c0 : BLOCK;
        for (int c = 0; c < len; c++)
            y[c] = (x[c0 + c] - m) * r * weight[c0 + c] + bias[c0 + c];
        narrow(p, out + c0, y, (size_t)len);
    }
    *mean = m;
    *rstd = r;
}

void dt__layernorm16_forward(dt_precision p, uint16_t *out, float *mean, float *rstd,
                             const float *inp, const float *weight, const float *bias, int N,
                             int C) {
    check_precision(p);
    if (C > BLOCK) {
#pragma omp parallel for if ((size_t)N * C > PAR_MIN) schedule(dynamic, 1)
        for (int i = 0; i < N; i++)
            layernorm16_long_row(p, out + (size_t)i * C, mean + i, rstd + i, inp + (size_t)i * C,
                                 weight, bias, C);
        return;
    }
    /* Blocks of whole rows, at most BLOCK floats, through the fp32 kernel. */
    int rows = BLOCK / C, nb = (N + rows - 1) / rows;
#pragma omp parallel for if ((size_t)N * C > PAR_MIN) schedule(dynamic, 1)
    for (int b = 0; b < nb; b++) {
        int i0 = b * rows, n = i0 + rows < N ? rows : N - i0;
        float y[BLOCK];
        dt_layernorm_forward(y, mean + i0, rstd + i0, inp + (size_t)i0 * C, weight, bias, n, C);
        narrow(p, out + (size_t)i0 * C, y, (size_t)n * C);
    }
}

void dt__gelu16_forward(dt_precision p, uint16_t *out, const uint16_t *inp, size_t n) {
    check_precision(p);
    size_t nb = (n + BLOCK - 1) / BLOCK;
#pragma omp parallel for if (n > PAR_MIN) schedule(dynamic, 4)
    for (size_t b = 0; b < nb; b++) {
        size_t i = b * BLOCK, len = n - i < BLOCK ? n - i : BLOCK;
        float x[BLOCK];
        widen(p, x, inp + i, len);
        dt_gelu_forward(x, x, len);
        narrow(p, out + i, x, len);
    }
}

void dt__gelu16_backward(dt_precision p, uint16_t *dinp, const uint16_t *inp, const float *dout,
                         size_t n) {
    check_precision(p);
    size_t nb = (n + BLOCK - 1) / BLOCK;
#pragma omp parallel for if (n > PAR_MIN) schedule(dynamic, 4)
    for (size_t b = 0; b < nb; b++) {
        size_t i = b * BLOCK, len = n - i < BLOCK ? n - i : BLOCK;
        float x[BLOCK], d[BLOCK];
        widen(p, x, inp + i, len);
        dt_gelu_backward(d, x, dout + i, len);
        narrow(p, dinp + i, d, len);
    }
}

/* ------------------------------------------------------------------------ */
/* Attention                                                                */
/* ------------------------------------------------------------------------ */

/* The kernels work one (sequence, head) pair at a time: its q, k, v columns
 * are widened into a compact (T, 3 HS) fp32 copy in a slot of `work`, the
 * fp32 kernel runs on it as a one-head problem (B = 1, C = HS, NH = 1: the
 * same tiles, scale and order as on the full tensor, so the same bits), and
 * the result is rounded back into its columns. A thread owns one slot;
 * ATT_SLOTS bounds the threads and so the workspace, which is then
 * independent of B (8 T HS floats per slot: q|k|v, out, dout, dq|dk|dv). */
#define ATT_SLOTS 16

static int att_slots(int B, int NH) {
    long bh = (long)B * NH;
    return bh < ATT_SLOTS ? (int)bh : ATT_SLOTS;
}

/* Threads of an attention call: one per workspace slot at most. */
static int att_threads(int B, int NH) {
    int t = omp_get_max_threads(), slots = att_slots(B, NH);
    return t < slots ? t : slots;
}

size_t dt_attention16_workspace(int B, int T, int C, int NH) {
    return (size_t)att_slots(B, NH) * 8 * (size_t)T * (size_t)(C / NH);
}

/* Rows t of head h of sequence b: the (T, HS) columns at `col` of a
 * (B, T, ld) 16-bit tensor, widened into dst (T, dld) at column dcol. */
static void gather_head(dt_precision p, float *dst, int dld, const uint16_t *src, int b, int T,
                        int ld, int col, int HS) {
    for (int t = 0; t < T; t++)
        widen(p, dst + (size_t)t * dld, src + ((size_t)b * T + t) * ld + col, (size_t)HS);
}

static void scatter_head(dt_precision p, uint16_t *dst, int b, int T, int ld, int col,
                         const float *src, int sld, int HS) {
    for (int t = 0; t < T; t++)
        narrow(p, dst + ((size_t)b * T + t) * ld + col, src + (size_t)t * sld, (size_t)HS);
}

void dt__attention16_forward(dt_precision p, uint16_t *out, float *lse, const uint16_t *qkv, int B,
                             int T, int C, int NH, float *work) {
    check_precision(p);
    const int HS = C / NH, C3 = 3 * C, H3 = 3 * HS, nbh = B * NH;
    const size_t slot = 8 * (size_t)T * HS;
    int nt = att_threads(B, NH);
#pragma omp parallel num_threads(nt) if (nt > 1)
    {
        float *q = work + (size_t)omp_get_thread_num() * slot; /* (T, 3HS) */
        float *o = q + 3 * (size_t)T * HS;                     /* (T, HS) */
#pragma omp for schedule(dynamic, 1)
        for (int bh = 0; bh < nbh; bh++) {
            int b = bh / NH, h = bh % NH;
            for (int part = 0; part < 3; part++) /* q, k, v */
                gather_head(p, q + part * HS, H3, qkv, b, T, C3, part * C + h * HS, HS);
            dt_attention_forward(o, lse + (size_t)bh * T, q, 1, T, HS, 1);
            scatter_head(p, out, b, T, C, h * HS, o, HS, HS);
        }
    }
}

void dt__attention16_backward(dt_precision p, uint16_t *dqkv, const float *dout,
                              const uint16_t *qkv, const uint16_t *out, const float *lse, int B,
                              int T, int C, int NH, float *work) {
    check_precision(p);
    const int HS = C / NH, C3 = 3 * C, H3 = 3 * HS, nbh = B * NH;
    const size_t slot = 8 * (size_t)T * HS;
    int nt = att_threads(B, NH);
#pragma omp parallel num_threads(nt) if (nt > 1)
    {
        float *q = work + (size_t)omp_get_thread_num() * slot; /* (T, 3HS) */
        float *o = q + 3 * (size_t)T * HS;                     /* (T, HS) */
        float *dO = o + (size_t)T * HS;                        /* (T, HS) */
        float *dq = dO + (size_t)T * HS;                       /* (T, 3HS) */
#pragma omp for schedule(dynamic, 1)
        for (int bh = 0; bh < nbh; bh++) {
            int b = bh / NH, h = bh % NH;
            for (int part = 0; part < 3; part++)
                gather_head(p, q + part * HS, H3, qkv, b, T, C3, part * C + h * HS, HS);
            gather_head(p, o, HS, out, b, T, C, h * HS, HS);
            for (int t = 0; t < T; t++)
                memcpy(dO + (size_t)t * HS, dout + ((size_t)b * T + t) * C + (size_t)h * HS,
                       sizeof(float) * (size_t)HS);
            dt_attention_backward(dq, dO, q, o, lse + (size_t)bh * T, 1, T, HS, 1);
            for (int part = 0; part < 3; part++)
                scatter_head(p, dqkv, b, T, C3, part * C + h * HS, dq + part * HS, H3, HS);
        }
    }
}
