/*
 * piece_file.c — a replica's parameter pieces in a file (piece_file.h).
 *
 * Two I/O threads take requests from a queue in order and move one piece
 * each with pread/pwrite, in chunks of up to CHUNK bytes:
 *
 *     caller                         I/O thread
 *     read(i)  -> queue [i R] ----->  pread(file @ slot i) -> base + piece i
 *     ... compute ...                 (piece i busy: its memory is theirs)
 *     wait(i)  <------------------   done, status
 *
 * Buffered (the default): straight between the file's page cache and the
 * buffer; a write starts its write-back at once (sync_file_range), so the
 * page cache holds clean pages that a memory cap can reclaim. O_DIRECT:
 * through a 4 KiB-aligned bounce buffer per thread (the pieces themselves
 * start anywhere), each slot of the file rounded up to 4 KiB.
 *
 * Why threads and not io_uring: a step moves a few large pieces (megabytes
 * each, tens per step), so submission cost is nothing next to the copy;
 * blocking pread/pwrite on two threads overlap the compute as well, need
 * no new library, and run where io_uring is turned off (container seccomp
 * profiles, kernel.io_uring_disabled). docs/zero.md has the measurements.
 */
#include "piece_file.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define THREADS 2
#define ALIGN   4096u
#define CHUNK   ((size_t)4 << 20) /* bytes per pread/pwrite (and per bounce buffer) */
#define MSG     800               /* an error message: the directory (512) and the cause */

typedef enum { OP_NONE, OP_READ, OP_WRITE } op_kind;

typedef struct piece {
    off_t off;    /* its slot in the file */
    bool busy;    /* queued or running */
    op_kind op;   /* the operation queued, running or last done */
    dt_status st; /* the last one's outcome */
    char msg[MSG];
} piece;

struct dt__piece_file {
    int fd;
    char dir[512];
    bool direct;
    float *base;
    const dt_range *ranges;
    size_t n;
    piece *p;
    size_t bytes; /* the file's size */
    pthread_mutex_t mu;
    pthread_cond_t work, done;
    size_t *queue; /* (n) piece indices, a ring */
    size_t head, count;
    bool quit;
    dt_thread *t[THREADS];
    int nthreads;
};

static size_t piece_bytes(const dt__piece_file *f, size_t i) {
    return (f->ranges[i].end - f->ranges[i].begin) * sizeof(float);
}

/* Move len bytes between mem and the file at off (read: file -> mem). On
 * failure the message names the directory and the cause. */
static dt_status move(dt__piece_file *f, bool rd, char *mem, size_t len, off_t off, void *bounce,
                      char *msg, size_t msglen) {
    for (size_t done = 0; done < len;) {
        size_t want = len - done < CHUNK ? len - done : CHUNK;
        /* O_DIRECT: whole aligned blocks through the bounce buffer (the
         * slot has room up to the next 4 KiB). */
        size_t io = f->direct ? dt_align_up(want, ALIGN) : want;
        char *buf = f->direct ? bounce : mem + done;
        if (!rd && f->direct) {
            memcpy(buf, mem + done, want);
            memset(buf + want, 0, io - want);
        }
        off_t at = off + (off_t)done;
        ssize_t r = rd ? pread(f->fd, buf, io, at) : pwrite(f->fd, buf, io, at);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0 || (f->direct && (size_t)r != io)) {
            snprintf(msg, msglen,
                     "parameter offload: %s %zu bytes at offset %lld of the file in %s: %s",
                     rd ? "reading" : "writing", io, (long long)at, f->dir,
                     r < 0 ? strerror(errno) : "short transfer");
            return r < 0 && errno == ENOSPC ? DT_ERR_NOSPACE : DT_ERR_IO;
        }
        if (rd && f->direct)
            memcpy(mem + done, buf, want);
        done += f->direct ? want : (size_t)r;
    }
    if (!rd && !f->direct)
        (void)sync_file_range(f->fd, off, (off_t)len, SYNC_FILE_RANGE_WRITE); /* starts, no wait */
    return DT_OK;
}

static void *io_main(void *arg) {
    dt__piece_file *f = arg;
    void *bounce = NULL;
    if (f->direct && posix_memalign(&bounce, ALIGN, CHUNK) != 0)
        bounce = NULL; /* every request then fails with the cause below */
    pthread_mutex_lock(&f->mu);
    for (;;) {
        while (!f->quit && f->count == 0)
            pthread_cond_wait(&f->work, &f->mu);
        if (f->count == 0)
            break; /* quit with nothing queued */
        size_t i = f->queue[f->head];
        f->head = (f->head + 1) % f->n;
        f->count--;
        piece *p = &f->p[i];
        bool rd = p->op == OP_READ;
        pthread_mutex_unlock(&f->mu);
        char msg[MSG] = "";
        dt_status st;
        if (f->direct && !bounce) {
            snprintf(msg, sizeof msg, "parameter offload: no memory for an O_DIRECT buffer");
            st = DT_ERR_NOMEM;
        } else {
            st = move(f, rd, (char *)(f->base + f->ranges[i].begin), piece_bytes(f, i), p->off,
                      bounce, msg, sizeof msg);
        }
        pthread_mutex_lock(&f->mu);
        p->st = st;
        memcpy(p->msg, msg, sizeof msg);
        p->busy = false;
        pthread_cond_broadcast(&f->done);
    }
    pthread_mutex_unlock(&f->mu);
    free(bounce);
    return NULL;
}

dt_status dt__piece_file_open(dt__piece_file **out, const char *dir, float *base,
                              const dt_range *pieces, size_t n, bool direct) {
    *out = NULL;
    dt__piece_file *f = dt_calloc(1, sizeof *f);
    if (!f)
        return DT_ERR_NOMEM;
    f->fd = -1;
    snprintf(f->dir, sizeof f->dir, "%s", dir);
    f->base = base;
    f->ranges = pieces;
    f->n = n;
    f->p = dt_calloc(n + 1, sizeof *f->p);
    f->queue = dt_calloc(n + 1, sizeof *f->queue);
    dt_status st = DT_OK;
    if (!f->p || !f->queue) {
        st = DT_ERR_NOMEM;
        goto fail;
    }
    for (size_t i = 0; i < n; i++) {
        f->p[i].off = (off_t)f->bytes;
        f->bytes += dt__piece_file_slot_bytes(piece_bytes(f, i));
    }
    char path[600];
    snprintf(path, sizeof path, "%s/dtrain-params-XXXXXX", dir);
    f->fd = mkstemp(path);
    if (f->fd < 0) {
        st = dt_error_set(DT_ERR_IO, "parameter offload: cannot create a file in %s: %s", dir,
                          strerror(errno));
        goto fail;
    }
    (void)unlink(path); /* lives while open: nothing left behind by a crash */
    int e = posix_fallocate(f->fd, 0, (off_t)(f->bytes ? f->bytes : 1));
    if (e != 0) {
        char want[32];
        st = dt_error_set(e == ENOSPC ? DT_ERR_NOSPACE : DT_ERR_IO,
                          "parameter offload: cannot reserve %s for this replica's parameters "
                          "in %s: %s",
                          dt_format_bytes((double)f->bytes, want, sizeof want), dir, strerror(e));
        goto fail;
    }
    /* O_DIRECT where the file system takes it (tmpfs before Linux 6.6 does not). */
    int fl = fcntl(f->fd, F_GETFL);
    f->direct = direct && fl >= 0 && fcntl(f->fd, F_SETFL, fl | O_DIRECT) == 0;
    if (pthread_mutex_init(&f->mu, NULL) != 0 || pthread_cond_init(&f->work, NULL) != 0 ||
        pthread_cond_init(&f->done, NULL) != 0) {
        st = dt_error_set(DT_ERR_SYSTEM, "parameter offload: cannot create its locks");
        goto fail;
    }
    for (int k = 0; k < THREADS; k++) {
        DT_CHECK_GOTO(dt_thread_create(&f->t[k], "dt-offload-io", io_main, f), st, fail);
        f->nthreads++;
    }
    *out = f;
    return DT_OK;
fail:
    dt__piece_file_close(f);
    return st;
}

void dt__piece_file_close(dt__piece_file *f) {
    if (!f)
        return;
    if (f->nthreads > 0) {
        pthread_mutex_lock(&f->mu);
        f->quit = true; /* the threads finish what is queued, then exit */
        pthread_cond_broadcast(&f->work);
        pthread_mutex_unlock(&f->mu);
        for (int k = 0; k < f->nthreads; k++)
            dt_thread_join(f->t[k]);
        pthread_mutex_destroy(&f->mu);
        pthread_cond_destroy(&f->work);
        pthread_cond_destroy(&f->done);
    }
    if (f->fd >= 0)
        (void)close(f->fd);
    dt_free(f->p);
    dt_free(f->queue);
    dt_free(f);
}

static void wait_idle(dt__piece_file *f, size_t i) {
    while (f->p[i].busy)
        pthread_cond_wait(&f->done, &f->mu);
}

static void request(dt__piece_file *f, size_t i, op_kind op) {
    DT_ASSERT(i < f->n);
    pthread_mutex_lock(&f->mu);
    wait_idle(f, i); /* one operation per piece at a time (rule 3) */
    f->p[i].busy = true;
    f->p[i].op = op;
    f->p[i].st = DT_OK;
    f->queue[(f->head + f->count++) % f->n] = i;
    pthread_cond_signal(&f->work);
    pthread_mutex_unlock(&f->mu);
}

void dt__piece_file_read(dt__piece_file *f, size_t i) { request(f, i, OP_READ); }
void dt__piece_file_write(dt__piece_file *f, size_t i) { request(f, i, OP_WRITE); }

bool dt__piece_file_busy(dt__piece_file *f, size_t i) {
    pthread_mutex_lock(&f->mu);
    bool busy = f->p[i].busy;
    pthread_mutex_unlock(&f->mu);
    return busy;
}

dt_status dt__piece_file_wait(dt__piece_file *f, size_t i) {
    pthread_mutex_lock(&f->mu);
    wait_idle(f, i);
    dt_status st = f->p[i].st;
    char msg[MSG];
    memcpy(msg, f->p[i].msg, sizeof msg);
    f->p[i].st = DT_OK; /* reported once */
    pthread_mutex_unlock(&f->mu);
    if (st != DT_OK)
        return dt_error_set(st, "%s", msg);
    return DT_OK;
}

size_t dt__piece_file_bytes(const dt__piece_file *f) { return f->bytes; }
size_t dt__piece_file_slot_bytes(size_t piece_bytes) { return dt_align_up(piece_bytes, ALIGN); }
size_t dt__piece_file_buffer_bytes(void) { return THREADS * CHUNK; }
bool dt__piece_file_direct(const dt__piece_file *f) { return f->direct; }
