/*
 * gemm.c — the bf16 matrix multiply's front door: argument checks, backend
 * names and choice, the scalar reference backend, and OpenBLAS's
 * cblas_sbgemm when the library exports it.
 *
 * The default backend (DT_GEMM_AUTO) is the first available in
 * `auto_order`, an order taken from `dtrain bench gemm-bf16` on a Sapphire
 * Rapids machine (docs/amp.md has the table); DT_GEMM_BACKEND overrides it.
 *
 * OpenBLAS declares cblas_sbgemm in its header in every build, but only
 * builds with BUILD_BFLOAT16=1 define it (Debian's 0.3.21 does not), so the
 * symbol is looked up at run time with dlsym instead of linked: a library
 * without it still loads, and one with it is used.
 */
#include "amp_internal.h"
#include "dtrain/tensor.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const backend_names[DT_GEMM_BACKEND_COUNT] = {
    "auto", "ref", "onednn", "openblas", "avx512", "amx", "sgemm"};
_Static_assert(sizeof backend_names / sizeof backend_names[0] == DT_GEMM_BACKEND_COUNT,
               "one name per backend");

/* Fastest first, as measured by `dtrain bench gemm-bf16 --op layer` on the
 * GPT-2 124M layers (docs/amp.md): oneDNN (its AMX kernels) ~ our AMX kernel
 * (0.4-1.9x oneDNN, median ~0.95: ahead on weight gradients, behind on the
 * LM head's input gradient; not measurably faster, so the well-kept library
 * goes first) > widened fp32 sgemm (median 0.9x fp32) > our AVX512-BF16
 * kernel (median 0.63x fp32). OpenBLAS's sbgemm could not be measured
 * (Debian's build lacks it), so it comes after every measured backend. */
static const dt_gemm_backend auto_order[] = {DT_GEMM_ONEDNN, DT_GEMM_AMX,      DT_GEMM_SGEMM,
                                             DT_GEMM_AVX512, DT_GEMM_OPENBLAS, DT_GEMM_REF};

const char *dt_gemm_backend_name(dt_gemm_backend b) {
    return (unsigned)b < DT_GEMM_BACKEND_COUNT ? backend_names[b] : "?";
}

dt_status dt_gemm_backend_parse(const char *knob, const char *text, dt_gemm_backend *out) {
    int idx;
    DT_CHECK(dt_config_parse_enum(knob, text, backend_names, DT_GEMM_BACKEND_COUNT, &idx));
    *out = (dt_gemm_backend)idx;
    return DT_OK;
}

/* ------------------------------------------------------------------------ */
/* OpenBLAS cblas_sbgemm, looked up at run time                             */
/* ------------------------------------------------------------------------ */

/* The CBLAS enum values are fixed by the CBLAS standard. */
enum { CBLAS_ROW_MAJOR = 101, CBLAS_NO_TRANS = 111, CBLAS_TRANS = 112 };
typedef void (*sbgemm_fn)(int order, int ta, int tb, int M, int N, int K, float alpha,
                          const dt_bf16 *A, int lda, const dt_bf16 *B, int ldb, float beta,
                          float *C, int ldc);

static sbgemm_fn sbgemm;
static pthread_once_t sbgemm_once = PTHREAD_ONCE_INIT;

static void sbgemm_lookup(void) {
    void *sym = dlsym(RTLD_DEFAULT, "cblas_sbgemm");
    memcpy(&sbgemm, &sym, sizeof sym); /* object -> function pointer, POSIX-sanctioned */
}

static dt_status gemm_openblas(const dt__gemm_args *g) {
    bool ta = dt__gemm_trans_a(g->op), tb = dt__gemm_trans_b(g->op);
    int lda = ta ? g->M : g->K, ldb = tb ? g->K : g->N;
    size_t mn = (size_t)g->M * (size_t)g->N;
    float *c32 = g->out == DT_GEMM_OUT_F32 ? g->C : NULL;
    if (!c32) { /* bf16 output: compute in fp32, then add and round */
        c32 = dt_alloc(mn * sizeof(float));
        if (!c32)
            return DT_ERR_NOMEM;
        if (g->accumulate)
            dt_bf16_to_f32(c32, g->C, mn);
    }
    sbgemm(CBLAS_ROW_MAJOR, ta ? CBLAS_TRANS : CBLAS_NO_TRANS, tb ? CBLAS_TRANS : CBLAS_NO_TRANS,
           g->M, g->N, g->K, 1.0f, g->A, lda, g->B, ldb, g->accumulate ? 1.0f : 0.0f, c32, g->N);
    if (c32 != g->C) {
        dt_f32_to_bf16(g->C, c32, mn);
        dt_free(c32);
    }
    return DT_OK;
}

/* ------------------------------------------------------------------------ */
/* fp32 sgemm on widened copies                                             */
/* ------------------------------------------------------------------------ */

/* Widening bf16 to fp32 is exact and so is each product, so this computes
 * the same sum as the bf16 kernels (in OpenBLAS's order). The copies cost
 * (M + N) K conversions against M N K multiply-adds; they live in buffers
 * kept across calls (one call at a time, under the lock). */
static pthread_mutex_t sgemm_lock = PTHREAD_MUTEX_INITIALIZER;
static float *wide;     /* A32 then B32 then (bf16 output) C32 */
static size_t wide_cap; /* in floats */

/* `f16`: A and B hold fp16 (dt_gemm_f16) rather than bf16. */
static dt_status gemm_sgemm(const dt__gemm_args *g, bool f16) {
    bool ta = dt__gemm_trans_a(g->op), tb = dt__gemm_trans_b(g->op);
    size_t na = (size_t)g->M * g->K, nb = (size_t)g->K * g->N, nc = (size_t)g->M * g->N;
    size_t need = na + nb + (g->out == DT_GEMM_OUT_BF16 ? nc : 0);
    pthread_mutex_lock(&sgemm_lock);
    if (need > wide_cap) {
        dt_free(wide);
        wide_cap = 0;
        if (!(wide = dt_alloc(need * sizeof *wide))) {
            pthread_mutex_unlock(&sgemm_lock);
            return dt_error_set(DT_ERR_NOMEM, "sgemm backend: %zu bytes for fp32 copies",
                                need * sizeof *wide);
        }
        wide_cap = need;
    }
    float *a32 = wide, *b32 = wide + na;
    float *c32 = g->out == DT_GEMM_OUT_F32 ? g->C : wide + na + nb;
    if (f16) {
        dt_f16_to_f32(a32, g->A, na);
        dt_f16_to_f32(b32, g->B, nb);
    } else {
        dt_bf16_to_f32(a32, g->A, na);
        dt_bf16_to_f32(b32, g->B, nb);
    }
    if (g->out == DT_GEMM_OUT_BF16 && g->accumulate)
        dt_bf16_to_f32(c32, g->C, nc);
    /* dt_sgemm, not cblas_sgemm: dtrain keeps OpenBLAS single-threaded and
     * splits large products over its OpenMP threads itself (tensor/gemm.c). */
    dt_sgemm(ta, tb, g->M, g->N, g->K, 1.0f, a32, ta ? g->M : g->K, b32, tb ? g->K : g->N,
             g->accumulate ? 1.0f : 0.0f, c32, g->N);
    if (g->out == DT_GEMM_OUT_BF16)
        dt_f32_to_bf16(g->C, c32, nc);
    pthread_mutex_unlock(&sgemm_lock);
    return DT_OK;
}

/* ------------------------------------------------------------------------ */
/* Scalar reference                                                         */
/* ------------------------------------------------------------------------ */

/* Sums products in k order in fp32; every bf16 x bf16 product is exact in
 * fp32 (8 + 8 significant bits), so only the additions round. */
static dt_status gemm_ref(const dt__gemm_args *g) {
    bool ta = dt__gemm_trans_a(g->op), tb = dt__gemm_trans_b(g->op);
    int M = g->M, N = g->N, K = g->K;
    for (int i = 0; i < M; i++) {
        for (int j = 0; j < N; j++) {
            float acc = 0.0f;
            for (int k = 0; k < K; k++) {
                dt_bf16 a = ta ? g->A[(size_t)k * M + i] : g->A[(size_t)i * K + k];
                dt_bf16 b = tb ? g->B[(size_t)j * K + k] : g->B[(size_t)k * N + j];
                acc += dt_f32_from_bf16(a) * dt_f32_from_bf16(b);
            }
            size_t o = (size_t)i * N + j;
            if (g->out == DT_GEMM_OUT_F32) {
                float *c = g->C;
                c[o] = g->accumulate ? c[o] + acc : acc;
            } else {
                dt_bf16 *c = g->C;
                c[o] = dt_bf16_from_f32(g->accumulate ? dt_f32_from_bf16(c[o]) + acc : acc);
            }
        }
    }
    return DT_OK;
}

/* ------------------------------------------------------------------------ */
/* Choice and dispatch                                                      */
/* ------------------------------------------------------------------------ */

bool dt_gemm_backend_available(dt_gemm_backend b, char *why, size_t why_len) {
    char dummy[160];
    if (!why) {
        why = dummy;
        why_len = sizeof dummy;
    }
    why[0] = '\0';
    switch (b) {
    case DT_GEMM_AUTO:
    case DT_GEMM_REF:
    case DT_GEMM_SGEMM: return true;
    case DT_GEMM_ONEDNN: return dt__gemm_onednn_available(why, why_len);
    case DT_GEMM_OPENBLAS:
        pthread_once(&sbgemm_once, sbgemm_lookup);
        if (!sbgemm)
            snprintf(why, why_len,
                     "the loaded OpenBLAS has no cblas_sbgemm (built without "
                     "BUILD_BFLOAT16)");
        return sbgemm != NULL;
    case DT_GEMM_AVX512:
        if (dt_isa() < DT_ISA_AVX512BF16)
            snprintf(why, why_len, "needs ISA avx512bf16, active is %s", dt_isa_name(dt_isa()));
        return dt_isa() >= DT_ISA_AVX512BF16;
    case DT_GEMM_AMX:
        if (dt_isa() < DT_ISA_AMX)
            snprintf(why, why_len, "needs ISA amx, active is %s%s%s", dt_isa_name(dt_isa()),
                     dt_cpu_features_get()->amx_note[0] ? ": " : "",
                     dt_cpu_features_get()->amx_note);
        return dt_isa() >= DT_ISA_AMX;
    case DT_GEMM_BACKEND_COUNT: break;
    }
    snprintf(why, why_len, "unknown backend %d", (int)b);
    return false;
}

static pthread_once_t default_once = PTHREAD_ONCE_INIT;
static dt_gemm_backend env_backend = DT_GEMM_AUTO;

static void read_env_backend(void) {
    const char *env = getenv("DT_GEMM_BACKEND");
    if (!env || !*env)
        return;
    if (dt_gemm_backend_parse("DT_GEMM_BACKEND", env, &env_backend) != DT_OK) {
        DT_ERROR("%s; using auto", dt_last_error());
        env_backend = DT_GEMM_AUTO;
    }
}

dt_gemm_backend dt_gemm_backend_default(void) {
    pthread_once(&default_once, read_env_backend);
    if (env_backend != DT_GEMM_AUTO)
        return env_backend;
    for (size_t i = 0; i < sizeof auto_order / sizeof auto_order[0]; i++)
        if (dt_gemm_backend_available(auto_order[i], NULL, 0))
            return auto_order[i];
    return DT_GEMM_REF;
}

dt_status dt_gemm_bf16_with(dt_gemm_backend b, dt_gemm_op op, int M, int N, int K, const dt_bf16 *A,
                            const dt_bf16 *B, void *C, dt_gemm_out out, bool accumulate) {
    if ((unsigned)op >= DT_GEMM_OP_COUNT || (unsigned)out >= DT_GEMM_OUT_COUNT)
        return dt_error_set(DT_ERR_INVALID, "dt_gemm_bf16: op %d / out %d out of range", (int)op,
                            (int)out);
    if (M < 1 || N < 1 || K < 1)
        return dt_error_set(DT_ERR_INVALID, "dt_gemm_bf16: sizes M=%d N=%d K=%d must be >= 1", M, N,
                            K);
    if (!A || !B || !C)
        return dt_error_set(DT_ERR_INVALID, "dt_gemm_bf16: NULL matrix (A %p, B %p, C %p)",
                            (const void *)A, (const void *)B, C);
    if (b == DT_GEMM_AUTO)
        b = dt_gemm_backend_default();
    char why[160];
    if (!dt_gemm_backend_available(b, why, sizeof why))
        return dt_error_set(DT_ERR_UNSUPPORTED, "gemm backend %s: %s", dt_gemm_backend_name(b),
                            why);
    dt__gemm_args g = {op, M, N, K, A, B, C, out, accumulate, NULL};
    switch (b) {
    case DT_GEMM_REF: return gemm_ref(&g);
    case DT_GEMM_ONEDNN: return dt__gemm_onednn(&g);
    case DT_GEMM_OPENBLAS: return gemm_openblas(&g);
    case DT_GEMM_AVX512: return dt__gemm_avx512(&g);
    case DT_GEMM_AMX: return dt__gemm_amx(&g);
    case DT_GEMM_SGEMM: return gemm_sgemm(&g, false);
    default: break;
    }
    return dt_error_set(DT_ERR_INTERNAL, "gemm backend %d has no entry", (int)b);
}

dt_status dt_gemm_bf16(dt_gemm_op op, int M, int N, int K, const dt_bf16 *A, const dt_bf16 *B,
                       void *C, dt_gemm_out out, bool accumulate) {
    return dt_gemm_bf16_with(DT_GEMM_AUTO, op, M, N, K, A, B, C, out, accumulate);
}

/* fp16 has no multiply in oneDNN 2.6 on CPUs (its matmul reports f16
 * unimplemented) and no AMX/AVX512 dot product before AMX-FP16, so fp16
 * operands are widened with F16C / AVX-512 and multiplied by sgemm: each
 * fp16 x fp16 product (11 + 11 significant bits) is exact in fp32, so the
 * sum is the same fp32 accumulation as the bf16 paths. */
dt_status dt_gemm_f16(dt_gemm_op op, int M, int N, int K, const dt_f16 *A, const dt_f16 *B,
                      float *C, bool accumulate) {
    if ((unsigned)op >= DT_GEMM_OP_COUNT)
        return dt_error_set(DT_ERR_INVALID, "dt_gemm_f16: op %d out of range", (int)op);
    if (M < 1 || N < 1 || K < 1)
        return dt_error_set(DT_ERR_INVALID, "dt_gemm_f16: sizes M=%d N=%d K=%d must be >= 1", M, N,
                            K);
    if (!A || !B || !C)
        return dt_error_set(DT_ERR_INVALID, "dt_gemm_f16: NULL matrix (A %p, B %p, C %p)",
                            (const void *)A, (const void *)B, (void *)C);
    dt__gemm_args g = {op, M, N, K, A, B, C, DT_GEMM_OUT_F32, accumulate, NULL};
    return gemm_sgemm(&g, true);
}

void dt_gemm_release(void) {
    dt__gemm_onednn_release();
    dt__gemm_avx512_release();
    dt__gemm_amx_release();
    dt__act16_release();
    pthread_mutex_lock(&sgemm_lock);
    dt_free(wide);
    wide = NULL;
    wide_cap = 0;
    pthread_mutex_unlock(&sgemm_lock);
}
