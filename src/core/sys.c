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
#include <unistd.h>

/* From this size on a buffer starts on a 2 MiB boundary and asks for
 * transparent huge pages (where THP is in "madvise" mode, as on Debian's
 * default kernels, nothing else gets them). The model's parameters,
 * gradients, optimizer state and activation arena are read in long strided
 * passes (weight-gradient packs at 1.5-6 KiB row strides, elementwise
 * kernels over (B,T,4C) tensors); with 4 KiB pages nearly every row of such
 * a pass is a different page, and the TLB misses show up as stalls. */
#define HUGE_FROM ((size_t)8 << 20)
#define HUGE_PAGE ((size_t)2 << 20)

/* A request this large is compared with the memory available first. */
#define CHECK_FROM ((size_t)256 << 20)

/* The first number after `key` in a "key value" text file, or -1. */
static int64_t file_value(const char *path, const char *key) {
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    char line[256];
    int64_t v = -1;
    size_t kl = strlen(key);
    while (v < 0 && fgets(line, sizeof line, f)) {
        if (kl && (strncmp(line, key, kl) != 0 || !strchr(" \t:", line[kl])))
            continue;
        char *end, *at = line + kl + (kl ? 1 : 0);
        long long x = strtoll(at, &end, 10);
        if (end != at && x >= 0)
            v = x;
    }
    fclose(f);
    return v;
}

/* What the memory cgroup at `dir` still allows: its limit minus what it
 * uses that cannot be reclaimed (usage without inactive file pages, as
 * the kubelet counts its "working set"); -1 when there is no limit. */
static int64_t cgroup_room(const char *dir, bool v2) {
    char p[3][640];
    if (snprintf(p[0], sizeof p[0], "%s/%s", dir, v2 ? "memory.max" : "memory.limit_in_bytes") >=
            (int)sizeof p[0] ||
        snprintf(p[1], sizeof p[1], "%s/%s", dir,
                 v2 ? "memory.current" : "memory.usage_in_bytes") >= (int)sizeof p[1] ||
        snprintf(p[2], sizeof p[2], "%s/memory.stat", dir) >= (int)sizeof p[2])
        return -1;
    int64_t limit = file_value(p[0], ""); /* "max" (v2, no limit) reads as -1 */
    int64_t used = file_value(p[1], "");
    if (limit <= 0 || used < 0 || limit >= ((int64_t)1 << 60))
        return -1;
    int64_t idle = file_value(p[2], v2 ? "inactive_file" : "total_inactive_file");
    if (idle > 0 && idle <= used)
        used -= idle;
    return used < limit ? limit - used : 0;
}

bool dt_mem_resident(uint64_t *now, uint64_t *peak) {
    int64_t rss = file_value("/proc/self/status", "VmRSS"),
            hwm = file_value("/proc/self/status", "VmHWM");
    if (rss < 0 || hwm < 0)
        return false;
    *now = (uint64_t)rss << 10;
    *peak = (uint64_t)hwm << 10;
    return true;
}

bool dt_mem_shared(uint64_t *now) {
    int64_t kb = file_value("/proc/self/status", "RssShmem");
    if (kb < 0)
        return false;
    *now = (uint64_t)kb << 10;
    return true;
}

bool dt_mem_available(uint64_t *bytes) {
    /* kB of memory that can be had without swapping, plus free swap */
    int64_t avail = file_value("/proc/meminfo", "MemAvailable");
    int64_t swap = file_value("/proc/meminfo", "SwapFree");
    if (avail < 0)
        return false;
    uint64_t best = ((uint64_t)avail + (uint64_t)(swap > 0 ? swap : 0)) << 10;
    /* A memory cgroup (container, Slurm job) may allow less: ours, found
     * through /proc/self/cgroup, or the root of a namespaced mount. */
    char dirs[4][512];
    bool v2[4];
    int nd = 0;
    FILE *f = fopen("/proc/self/cgroup", "r");
    if (f) {
        char line[512];
        while (fgets(line, sizeof line, f) && nd < 2) {
            line[strcspn(line, "\n")] = '\0';
            char *path = strchr(line, ':') ? strchr(strchr(line, ':') + 1, ':') : NULL;
            if (!path)
                continue;
            bool is_v2 = strncmp(line, "0::", 3) == 0;
            if (!is_v2 && !strstr(line, ":memory:"))
                continue;
            v2[nd] = is_v2;
            if (snprintf(dirs[nd], sizeof dirs[0], "/sys/fs/cgroup%s%s", is_v2 ? "" : "/memory",
                         path + 1) < (int)sizeof dirs[0])
                nd++;
        }
        fclose(f);
    }
    snprintf(dirs[nd], sizeof dirs[0], "/sys/fs/cgroup");
    v2[nd++] = true;
    snprintf(dirs[nd], sizeof dirs[0], "/sys/fs/cgroup/memory");
    v2[nd++] = false;
    for (int i = 0; i < nd; i++) {
        int64_t room = cgroup_room(dirs[i], v2[i]);
        if (room >= 0 && (uint64_t)room < best)
            best = (uint64_t)room;
    }
    *bytes = best;
    return true;
}

void *dt_alloc(size_t bytes) {
    void *p = NULL;
    size_t rounded = dt_align_up(bytes ? bytes : 1, DT_ALIGN);
    /* A large request the machine cannot back is refused here, as
     * DT_ERR_NOMEM: overcommit would grant it, and touching it would wake
     * the kernel's OOM killer, which may pick another user's process. */
    uint64_t avail;
    if (bytes >= CHECK_FROM && dt_mem_available(&avail) && bytes > avail) {
        char want[32], have[32];
        dt_error_set(DT_ERR_NOMEM, "cannot allocate %s (%zu bytes): only %s of memory is available",
                     dt_format_bytes((double)bytes, want, sizeof want), bytes,
                     dt_format_bytes((double)avail, have, sizeof have));
        return NULL;
    }
    if (rounded >= HUGE_FROM && rounded >= bytes) {
        /* Huge pages for the whole 2 MiB pages of the buffer only: advising
         * (or allocating) past its end would make the kernel back the tail
         * with a whole huge page, up to 2 MiB resident that nothing uses;
         * the tail takes small pages, touched as far as used. */
        if (posix_memalign(&p, HUGE_PAGE, rounded) == 0) {
#ifdef MADV_HUGEPAGE
            /* advice only: failure is harmless */
            (void)madvise(p, rounded / HUGE_PAGE * HUGE_PAGE, MADV_HUGEPAGE);
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
        dt_mem_zero(p, bytes);
    return p;
}

/* Below this, clearing is cheaper than a system call. */
#define DISCARD_FROM ((size_t)256 << 10)

void dt_mem_discard(void *p, size_t bytes) {
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    uintptr_t a = dt_align_up((uintptr_t)p, page), b = ((uintptr_t)p + bytes) / page * page;
    if (a < b)
        (void)madvise((void *)a, b - a, MADV_DONTNEED); /* advice: nothing to undo on failure */
}

void dt_mem_zero(void *p, size_t bytes) {
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    uintptr_t lo = (uintptr_t)p, hi = lo + bytes;
    uintptr_t a = dt_align_up(lo, page), b = hi / page * page;
    /* dt_alloc's memory is private and anonymous: a discarded page reads
     * as zero. */
    if (bytes < DISCARD_FROM || a >= b || madvise((void *)a, b - a, MADV_DONTNEED) != 0) {
        memset(p, 0, bytes);
        return;
    }
    memset(p, 0, a - lo);
    memset((void *)b, 0, hi - b);
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
