/*
 * offload.c — the optimizer's state in a file on local disk
 * (dt_optim_config.offload_dir; `dtrain train --offload optimizer=disk:DIR`).
 *
 * The state buffers are a shared mapping of one file, so every reader of
 * dt_optimizer_state() (the update, the checkpoint) sees plain floats; the
 * kernel is the I/O engine, steered so that only a window of the state is
 * in memory at a time:
 *
 *     update(piece i):  POPULATE_WRITE piece i      (mapped in one call, read
 *                                                  ahead earlier)
 *       after:          WILLNEED pieces i+1..i+8    (asynchronous read-ahead)
 *                       sync_file_range(piece i)    (asynchronous write-back)
 *                       DONTNEED piece i's mapping  (out of this process)
 *                       FADV_DONTNEED piece i-1     (out of the page cache, written by now)
 *     step end:         WILLNEED the step's first 9 pieces (the next step
 *                       starts there; read during its forward and backward)
 *
 * "Next" follows the walk: pieces come in bucket order, from the end of the
 * buffer to the front, so the prefetch goes the way the last two calls
 * went. A wrong guess costs a synchronous read, never a wrong value.
 *
 * The file is created in DIR and unlinked at once: it lives while the
 * process does, and a killed rank leaves nothing behind (checkpoints are
 * separate files, written by the checkpoint code through the same mapping).
 * Its whole size is reserved at creation (posix_fallocate), so a disk too
 * small fails there, naming the directory, and never in the middle of a
 * step.
 */
#include "optim_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

struct dt__offload {
    int fd;
    unsigned char *map; /* nstates regions of `each` bytes */
    size_t map_bytes, each, count, nstates;
    size_t page;
    size_t last;           /* state offset (floats) of the last piece updated */
    size_t prev0, prev1;   /* the piece before it, written back: evict next */
    size_t first0, first1; /* this step's first piece */
    bool down;             /* the walk goes towards offset 0 */
    bool any;              /* a piece was updated this step */
};

/* [s0, s1) floats of every state: fn(region, bytes, file offset). */
static void each_state(dt__offload *f, size_t s0, size_t s1,
                       void (*fn)(dt__offload *f, unsigned char *p, size_t len, off_t off)) {
    if (s0 >= s1)
        return;
    for (size_t k = 0; k < f->nstates; k++) {
        size_t off = k * f->each + s0 * sizeof(float);
        fn(f, f->map + off, (s1 - s0) * sizeof(float), (off_t)off);
    }
}

/* The pages that overlap [p, p + len), or only those inside it. */
static void pages_over(const dt__offload *f, unsigned char *p, size_t len, uintptr_t *a,
                       uintptr_t *b) {
    *a = (uintptr_t)p / f->page * f->page;
    *b = dt_align_up((uintptr_t)p + len, f->page);
}

static void read_ahead(dt__offload *f, unsigned char *p, size_t len, off_t off) {
    (void)off;
    uintptr_t a, b;
    pages_over(f, p, len, &a, &b);
    (void)madvise((void *)a, b - a, MADV_WILLNEED); /* advice: a miss is a synchronous read */
}

static void write_back(dt__offload *f, unsigned char *p, size_t len, off_t off) {
    (void)sync_file_range(f->fd, off, (off_t)len, SYNC_FILE_RANGE_WRITE); /* starts, no wait */
    /* Only the whole pages inside: the edges may belong to a neighbour. */
    dt_mem_discard(p, len); /* shared mapping: the dirty data stays in the page cache */
}

static void evict(dt__offload *f, unsigned char *p, size_t len, off_t off) {
    (void)p;
    (void)posix_fadvise(f->fd, off, (off_t)len, POSIX_FADV_DONTNEED); /* clean pages only */
}

dt_status dt__offload_open(dt__offload **out, const char *dir, size_t nstates, size_t count,
                           float **state) {
    *out = NULL;
    dt__offload *f = dt_calloc(1, sizeof *f);
    if (!f)
        return DT_ERR_NOMEM;
    f->fd = -1;
    f->page = (size_t)sysconf(_SC_PAGESIZE);
    f->nstates = nstates;
    f->count = count;
    f->each = dt_align_up((count ? count : 1) * sizeof(float), f->page);
    f->map_bytes = nstates * f->each;
    char path[1100];
    snprintf(path, sizeof path, "%s/dtrain-optimizer-XXXXXX", dir);
    dt_status st = DT_OK;
    f->fd = mkstemp(path);
    if (f->fd < 0) {
        st = dt_error_set(DT_ERR_IO, "optimizer offload: cannot create a file in %s: %s", dir,
                          strerror(errno));
        goto fail;
    }
    (void)unlink(path); /* lives while open: nothing left behind by a crash */
    int e = posix_fallocate(f->fd, 0, (off_t)f->map_bytes);
    if (e != 0) {
        char want[32];
        st = dt_error_set(DT_ERR_IO, "optimizer offload: cannot reserve %s for the state in %s: %s",
                          dt_format_bytes((double)f->map_bytes, want, sizeof want), dir,
                          strerror(e));
        goto fail;
    }
    void *m = mmap(NULL, f->map_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, f->fd, 0);
    if (m == MAP_FAILED) {
        st = dt_error_set(DT_ERR_IO, "optimizer offload: cannot map the state file in %s: %s", dir,
                          strerror(errno));
        goto fail;
    }
    f->map = m;
    for (size_t k = 0; k < nstates; k++)
        state[k] = (float *)(void *)(f->map + k * f->each);
    *out = f;
    return DT_OK;
fail:
    dt__offload_close(f);
    return st;
}

void dt__offload_close(dt__offload *f) {
    if (!f)
        return;
    if (f->map)
        (void)munmap(f->map, f->map_bytes);
    if (f->fd >= 0)
        (void)close(f->fd);
    dt_free(f);
}

static void populate(dt__offload *f, unsigned char *p, size_t len, off_t off) {
    (void)off;
    uintptr_t a, b;
    pages_over(f, p, len, &a, &b);
    (void)madvise((void *)a, b - a, MADV_POPULATE_WRITE); /* else: one fault per page */
}

void dt__offload_before(dt__offload *f, size_t s0, size_t s1) { each_state(f, s0, s1, populate); }

/* Read ahead DT__OFFLOAD_AHEAD pieces of len floats from [s0, s1) on,
 * the way the walk goes. */
static void ahead_of(dt__offload *f, size_t s0, size_t s1) {
    size_t ahead = DT__OFFLOAD_AHEAD * (s1 - s0);
    size_t a = f->down ? (s0 > ahead ? s0 - ahead : 0) : s1,
           b = f->down ? s0 : (s1 + ahead < f->count ? s1 + ahead : f->count);
    each_state(f, a, b, read_ahead);
}

void dt__offload_updated(dt__offload *f, size_t s0, size_t s1) {
    if (f->any)
        f->down = s0 < f->last;
    else
        f->first0 = s0, f->first1 = s1;
    f->any = true;
    f->last = s0;
    ahead_of(f, s0, s1);
    each_state(f, s0, s1, write_back);
    each_state(f, f->prev0, f->prev1, evict);
    f->prev0 = s0;
    f->prev1 = s1;
}

void dt__offload_step_end(dt__offload *f) {
    if (f->any) {
        /* The next step starts where this one did, during its forward. */
        each_state(f, f->first0, f->first1, read_ahead);
        ahead_of(f, f->first0, f->first1);
    }
    f->any = false;
}

void dt__offload_settle(dt__offload *f) {
    each_state(f, 0, f->count, write_back);
    each_state(f, 0, f->count, evict);
    f->prev0 = f->prev1 = 0;
}

size_t dt__offload_file_bytes(const dt__offload *f) { return f->map_bytes; }
