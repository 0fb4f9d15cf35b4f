/*
 * gemm_onednn.c — the bf16 multiply through oneDNN's matmul primitive.
 *
 * Creating a oneDNN primitive JIT-compiles a kernel (tens to hundreds of
 * microseconds), so primitives are cached per (op, M, N, K, out,
 * accumulate) and a training step's multiplies, whose shapes repeat every
 * step, create each one once. A cache entry also keeps its three memory
 * objects; each call only swaps their data pointers, under exec_lock, so
 * concurrent callers stay correct.
 *
 * Transposition needs no copy: a transposed operand is described to oneDNN
 * by its strides. An fp32 bias (the 16-bit linear layers' forward) is
 * oneDNN's matmul bias, added in fp32 before the result is rounded. (Strided
 * sub-matrices would be described the same way, but oneDNN 2.6 then leaves
 * its AMX brgemm kernels for its slower gemm:jit ones, so column blocks of
 * the LM head were measured slower, not faster.) Accumulation (C += A x B)
 * is the "sum" post-op, applied in fp32 before the result is rounded to C's type.
 *
 * oneDNN's ISA cap (from DT_ISA) is fixed by the tensor layer, which calls
 * oneDNN first (src/tensor/onednn.c); here we only ask whether oneDNN may
 * run, and probe once whether it has a bf16 matmul at that cap.
 *
 * Invariant: every cached object is destroyed by dt__gemm_onednn_release().
 */
#include "../tensor/tensor_internal.h"
#include "amp_internal.h"

#include <stdio.h>

#ifndef DT_HAVE_DNNL /* configured without libdnnl-dev: see src/tensor/deps.cmake */

bool dt__gemm_onednn_available(char *why, size_t why_len) {
    return dt__onednn_available(why, why_len);
}

dt_status dt__gemm_onednn(const dt__gemm_args *g) {
    (void)g;
    return dt_error_set(DT_ERR_UNSUPPORTED, "dtrain was built without oneDNN");
}

void dt__gemm_onednn_release(void) {}

#else

#include <oneapi/dnnl/dnnl.h>
#include <oneapi/dnnl/dnnl_debug.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

typedef struct entry {
    struct entry *next;
    dt_gemm_op op;
    int M, N, K;
    dt_gemm_out out;
    bool accumulate;
    bool bias;
    dnnl_primitive_t prim;
    dnnl_memory_t a, b, c, bias_mem; /* bias_mem NULL without bias */
} entry;

static pthread_mutex_t cache_lock = PTHREAD_MUTEX_INITIALIZER;
/* One multiply at a time: the stream is shared (oneDNN streams are not
 * thread-safe) and so are an entry's memory objects; each multiply already
 * uses every OpenMP thread, so nothing is lost. */
static pthread_mutex_t exec_lock = PTHREAD_MUTEX_INITIALIZER;
static entry *cache;         /* singly linked, newest first */
static dnnl_engine_t engine; /* created with the first entry */
static dnnl_stream_t stream;
static bool probed;
static char probe_note[128]; /* why oneDNN cannot multiply bf16 here, or "" */

static dt_status fail(dnnl_status_t s, const char *what, const dt__gemm_args *g) {
    return dt_error_set(DT_ERR_INTERNAL, "oneDNN %s failed (%s) for %s M=%d N=%d K=%d", what,
                        dnnl_status2str(s), g ? "matmul" : "setup", g ? g->M : 0, g ? g->N : 0,
                        g ? g->K : 0);
}

/* Every handle may be NULL (a half-built entry): oneDNN's destroys accept it. */
static void destroy_entry(entry *e) {
    dnnl_primitive_destroy(e->prim);
    dnnl_memory_destroy(e->a);
    dnnl_memory_destroy(e->b);
    dnnl_memory_destroy(e->c);
    dnnl_memory_destroy(e->bias_mem);
    free(e);
}

static dt_status create_entry(const dt__gemm_args *g, entry **out);

/* Called with cache_lock held, after dt__onednn_available() fixed oneDNN's
 * ISA. Ask for a 1x1x1 bf16 matmul: oneDNN versions differ in which ISAs
 * have bf16 kernels (2.6 has none below avx512_core), and asking is the
 * only reliable test. */
static void probe_bf16(void) {
    if (probed)
        return;
    probed = true;
    dt_bf16 one = 0x3f80;
    float c;
    dt__gemm_args probe = {DT_GEMM_NN, 1, 1, 1, &one, &one, &c, DT_GEMM_OUT_F32, false, NULL};
    entry *e = NULL;
    if (create_entry(&probe, &e) != DT_OK) {
        snprintf(probe_note, sizeof probe_note, "oneDNN %d.%d has no bf16 matmul at ISA %s",
                 dnnl_version()->major, dnnl_version()->minor, dt_isa_name(dt_isa()));
        dt_error_clear(); /* an answer, not a failure of the caller's call */
    } else {
        destroy_entry(e);
    }
}

bool dt__gemm_onednn_available(char *why, size_t why_len) {
    if (!dt__onednn_available(why, why_len))
        return false;
    pthread_mutex_lock(&cache_lock);
    probe_bf16();
    pthread_mutex_unlock(&cache_lock);
    if (probe_note[0]) {
        snprintf(why, why_len, "%s", probe_note);
        return false;
    }
    return true;
}

static dt_status create_entry(const dt__gemm_args *g, entry **out) {
    dnnl_status_t s;
    dt_status st = DT_OK;
    if (!engine) {
        if ((s = dnnl_engine_create(&engine, dnnl_cpu, 0)) != dnnl_success)
            return fail(s, "engine_create", NULL);
        if ((s = dnnl_stream_create(&stream, engine, dnnl_stream_default_flags)) != dnnl_success)
            return fail(s, "stream_create", NULL);
    }
    bool ta = dt__gemm_trans_a(g->op), tb = dt__gemm_trans_b(g->op);
    int64_t M = g->M, N = g->N, K = g->K;
    dnnl_dims_t a_dims = {M, K}, b_dims = {K, N}, c_dims = {M, N}, bias_dims = {1, N};
    dnnl_dims_t a_str = {ta ? 1 : K, ta ? M : 1}; /* (K,M) row-major read as (M,K) */
    dnnl_dims_t b_str = {tb ? 1 : N, tb ? K : 1};
    dnnl_dims_t c_str = {N, 1}, bias_str = {N, 1};
    dnnl_memory_desc_t a_md, b_md, c_md, bias_md;
    dnnl_data_type_t ct = g->out == DT_GEMM_OUT_F32 ? dnnl_f32 : dnnl_bf16;
    if ((s = dnnl_memory_desc_init_by_strides(&a_md, 2, a_dims, dnnl_bf16, a_str)) ||
        (s = dnnl_memory_desc_init_by_strides(&b_md, 2, b_dims, dnnl_bf16, b_str)) ||
        (s = dnnl_memory_desc_init_by_strides(&c_md, 2, c_dims, ct, c_str)) ||
        (s = dnnl_memory_desc_init_by_strides(&bias_md, 2, bias_dims, dnnl_f32, bias_str)))
        return fail(s, "memory_desc_init", g);
    dnnl_matmul_desc_t desc;
    if ((s = dnnl_matmul_desc_init(&desc, &a_md, &b_md, g->bias ? &bias_md : NULL, &c_md)))
        return fail(s, "matmul_desc_init", g);

    dnnl_primitive_attr_t attr = NULL;
    dnnl_post_ops_t ops = NULL;
    dnnl_primitive_desc_t pd = NULL;
    entry *e = calloc(1, sizeof *e);
    if (!e)
        return dt_error_set(DT_ERR_NOMEM, "oneDNN gemm cache entry");
    if ((s = dnnl_primitive_attr_create(&attr)))
        goto dnnl_fail;
    if (g->accumulate) {
        if ((s = dnnl_post_ops_create(&ops)) || (s = dnnl_post_ops_append_sum(ops, 1.0f)) ||
            (s = dnnl_primitive_attr_set_post_ops(attr, ops)))
            goto dnnl_fail;
    }
    if ((s = dnnl_primitive_desc_create(&pd, &desc, attr, engine, NULL)) ||
        (s = dnnl_primitive_create(&e->prim, pd)) ||
        (s = dnnl_memory_create(&e->a, &a_md, engine, DNNL_MEMORY_NONE)) ||
        (s = dnnl_memory_create(&e->b, &b_md, engine, DNNL_MEMORY_NONE)) ||
        (s = dnnl_memory_create(&e->c, &c_md, engine, DNNL_MEMORY_NONE)) ||
        (g->bias && (s = dnnl_memory_create(&e->bias_mem, &bias_md, engine, DNNL_MEMORY_NONE))))
        goto dnnl_fail;
    if (dt_log_enabled(DT_LOG_LEVEL_DEBUG, "amp")) {
        const char *impl = NULL;
        dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl);
        DT_DEBUG("amp", "oneDNN matmul op %d M=%d N=%d K=%d: %s", (int)g->op, g->M, g->N, g->K,
                 impl ? impl : "?");
    }
    e->op = g->op, e->M = g->M, e->N = g->N, e->K = g->K, e->out = g->out;
    e->accumulate = g->accumulate;
    e->bias = g->bias != NULL;
    *out = e;
    goto done;
dnnl_fail:
    st = fail(s, "primitive creation", g);
    destroy_entry(e);
done:
    dnnl_primitive_desc_destroy(pd);
    dnnl_post_ops_destroy(ops);
    dnnl_primitive_attr_destroy(attr);
    return st;
}

static dt_status lookup(const dt__gemm_args *g, entry **out) {
    dt_status st = DT_OK;
    pthread_mutex_lock(&cache_lock);
    entry *e = cache;
    while (e &&
           !(e->op == g->op && e->M == g->M && e->N == g->N && e->K == g->K && e->out == g->out &&
             e->accumulate == g->accumulate && e->bias == (g->bias != NULL)))
        e = e->next;
    if (!e) {
        st = create_entry(g, &e);
        if (st == DT_OK) {
            e->next = cache;
            cache = e;
        }
    }
    pthread_mutex_unlock(&cache_lock);
    *out = e;
    return st;
}

dt_status dt__gemm_onednn(const dt__gemm_args *g) {
    entry *e;
    DT_CHECK(lookup(g, &e));
    dnnl_status_t s;
    pthread_mutex_lock(&exec_lock);
    dnnl_memory_set_data_handle(e->a, (void *)g->A);
    dnnl_memory_set_data_handle(e->b, (void *)g->B);
    dnnl_memory_set_data_handle(e->c, g->C);
    dnnl_exec_arg_t args[4] = {{DNNL_ARG_SRC, e->a},
                               {DNNL_ARG_WEIGHTS, e->b},
                               {DNNL_ARG_DST, e->c},
                               {DNNL_ARG_BIAS, e->bias_mem}};
    if (g->bias)
        dnnl_memory_set_data_handle(e->bias_mem, (void *)g->bias);
    s = dnnl_primitive_execute(e->prim, stream, g->bias ? 4 : 3, args);
    if (s == dnnl_success)
        s = dnnl_stream_wait(stream);
    pthread_mutex_unlock(&exec_lock);
    if (s != dnnl_success)
        return fail(s, "execute", g);
    return DT_OK;
}

void dt__gemm_onednn_release(void) {
    pthread_mutex_lock(&cache_lock);
    while (cache) {
        entry *e = cache;
        cache = e->next;
        destroy_entry(e);
    }
    if (stream)
        dnnl_stream_destroy(stream);
    if (engine)
        dnnl_engine_destroy(engine);
    stream = NULL;
    engine = NULL;
    pthread_mutex_unlock(&cache_lock);
}

#endif /* DT_HAVE_DNNL */
