/*
 * onednn.c — oneDNN's instruction-set cap, shared by every user of oneDNN.
 *
 * oneDNN picks its own kernels by ISA; to honour DT_ISA it is capped with
 * dnnl_set_max_cpu_isa(), which oneDNN accepts only once per process and
 * before its first kernel. So the cap lives here, in the lowest layer that
 * calls oneDNN (dnnl_sgemm in gemm.c), and amp's matmul asks here too. The
 * cap is the level active at the first call (dt_isa() scalar maps to
 * oneDNN's lowest, SSE4.1); if dt_isa() is later set below it, oneDNN is
 * reported unavailable rather than run instructions it was told not to.
 *
 * Invariant: dnnl_set_max_cpu_isa() is called at most once, under pin_lock,
 * and pinned_level is published (release) only after it returned.
 */
#include "tensor_internal.h"

#include <stdio.h>

#ifndef DT_HAVE_DNNL /* configured without libdnnl-dev: see src/tensor/deps.cmake */

bool dt__onednn_available(char *why, size_t why_len) {
    if (why)
        snprintf(why, why_len, "dtrain was built without oneDNN (libdnnl-dev not found)");
    return false;
}

#else

#include <oneapi/dnnl/dnnl.h>
#include <oneapi/dnnl/dnnl_debug.h>
#include <pthread.h>
#include <stdatomic.h>

static pthread_mutex_t pin_lock = PTHREAD_MUTEX_INITIALIZER;
static atomic_int pinned_level = -1; /* dt_isa() when oneDNN's max ISA was set */

static const dnnl_cpu_isa_t isa_map[DT_ISA_COUNT] = {
    dnnl_cpu_isa_sse41, dnnl_cpu_isa_avx2, dnnl_cpu_isa_avx512_core, dnnl_cpu_isa_avx512_core_bf16,
    dnnl_cpu_isa_avx512_core_amx};

/* Cheap after the first call (one atomic load): the multiplies ask before
 * every oneDNN call, so a DT_ISA lowered later takes effect at once. */
bool dt__onednn_available(char *why, size_t why_len) {
    int pinned = atomic_load_explicit(&pinned_level, memory_order_acquire);
    if (pinned < 0) {
        pthread_mutex_lock(&pin_lock);
        pinned = atomic_load_explicit(&pinned_level, memory_order_relaxed);
        if (pinned < 0) {
            pinned = (int)dt_isa();
            dnnl_status_t s = dnnl_set_max_cpu_isa(isa_map[pinned]);
            if (s != dnnl_success)
                DT_WARN("oneDNN: dnnl_set_max_cpu_isa(%s) failed (%s); oneDNN may use a higher "
                        "ISA",
                        dt_isa_name((dt_isa_level)pinned), dnnl_status2str(s));
            atomic_store_explicit(&pinned_level, pinned, memory_order_release);
        }
        pthread_mutex_unlock(&pin_lock);
    }
    if ((int)dt_isa() < pinned) {
        if (why)
            snprintf(why, why_len, "oneDNN's ISA was fixed at %s on first use, active is %s",
                     dt_isa_name((dt_isa_level)pinned), dt_isa_name(dt_isa()));
        return false;
    }
    return true;
}

#endif /* DT_HAVE_DNNL */
