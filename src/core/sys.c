/*
 * sys.c — aligned allocation, the monotonic clock and thread helpers.
 */
#include "dtrain/core.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

/* From this size on a buffer starts on a 2 MiB boundary and asks for
 * transparent huge pages (where THP is in "madvise" mode, as on Debian's
 * default kernels, nothing else gets them). The model's parameters,
 * gradients, optimizer state and activation arena are read in long strided
 * passes (weight-gradient packs at 1.5-6 KiB row strides, elementwise
 * kernels over (B,T,4C) tensors); with 4 KiB pages nearly every row of such
 * a pass is a different page, and the TLB misses show up as stalls. */
#define HUGE_FROM ((size_t)8 << 20)
#define HUGE_PAGE ((size_t)2 << 20)

void *dt_alloc(size_t bytes) {
    void *p = NULL;
    size_t rounded = dt_align_up(bytes ? bytes : 1, DT_ALIGN);
    if (rounded >= HUGE_FROM && rounded >= bytes) {
        rounded = dt_align_up(rounded, HUGE_PAGE);
        if (posix_memalign(&p, HUGE_PAGE, rounded) == 0) {
#ifdef MADV_HUGEPAGE
            (void)madvise(p, rounded, MADV_HUGEPAGE); /* advice only: failure is harmless */
#endif
            return p;
        }
        p = NULL;
    }
    if (rounded < bytes || posix_memalign(&p, DT_ALIGN, rounded) != 0) {
        char buf[32];
        dt_error_set(DT_ERR_NOMEM, "cannot allocate %s (%zu bytes)",
                     dt_format_bytes((double)bytes, buf, sizeof buf), bytes);
        return NULL;
    }
    return p;
}

void *dt_calloc(size_t count, size_t size) {
    size_t bytes;
    if (!dt_mul_size(count, size, &bytes)) {
        dt_error_set(DT_ERR_NOMEM, "allocation of %zu x %zu bytes overflows", count, size);
        return NULL;
    }
    void *p = dt_alloc(bytes);
    if (p)
        memset(p, 0, bytes);
    return p;
}

void dt_free(void *p) { free(p); }

uint64_t dt_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

double dt_now(void) { return (double)dt_now_ns() * 1e-9; }

void dt_sleep_ms(unsigned ms) {
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

struct dt_thread {
    pthread_t handle;
};

dt_status dt_thread_create(dt_thread **out, const char *name, dt_thread_fn fn, void *arg) {
    dt_thread *t = calloc(1, sizeof *t);
    if (!t)
        return dt_error_set(DT_ERR_NOMEM, "cannot allocate thread %s", name ? name : "");
    int rc = pthread_create(&t->handle, NULL, fn, arg);
    if (rc != 0) {
        free(t);
        errno = rc;
        return dt_error_set_errno(DT_ERR_SYSTEM, "pthread_create(%s)", name ? name : "");
    }
    if (name) {
        char short_name[16];
        snprintf(short_name, sizeof short_name, "%s", name);
        pthread_setname_np(t->handle, short_name);
    }
    *out = t;
    return DT_OK;
}

void *dt_thread_join(dt_thread *t) {
    if (!t)
        return NULL;
    void *result = NULL;
    pthread_join(t->handle, &result);
    free(t);
    return result;
}

int dt_cpu_count(void) {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0) {
        int n = CPU_COUNT(&set);
        if (n > 0)
            return n;
    }
    return 1;
}
