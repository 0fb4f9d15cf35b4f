/*
 * ddp_prio.c — DDP's critical-path-first schedule (--comm-priority critical).
 *
 * The next forward reads the parameters from the front of the flat buffer
 * to its end (embeddings, block 0, 1, ...), but backward finishes the
 * gradients from the end to the front. FIFO sends them in the order
 * backward finishes them, so the gradients the next forward needs first
 * arrive last. Here the buffer is sent in pieces of at most `piece` floats,
 * always the lowest-offset piece that is final on every rank (ByteScheduler,
 * Peng et al. 2019): a region that becomes final pre-empts the rest of an
 * earlier one at the next piece boundary, regions that become final
 * together go out as one run of pieces (small buckets merged), and once
 * backward is over what is left goes front to back — so the next forward
 * can start on its first layers while the last ones are still on the wire.
 *
 *   backward finishes:   |  .  |  .  |  .  | B2  | B1  | B0  |    (B0 first)
 *   FIFO sends:          B0 B1 B2 ... (the front last)
 *   critical sends:      B0a B1a B2a ... as each becomes final (each pre-empts
 *                        the rest of the one before), then front to back.
 *
 * Agreement. Every rank must issue the same collectives in the same order,
 * but each sees its own backward's progress. So the schedule only follows
 * agreed facts: before each piece the ranks allreduce (MAX) the offset from
 * which their gradients are final; the result, the agreed frontier, is the
 * same everywhere, and so is the choice made from it. When nothing agreed
 * is left to send, a rank first waits until its own backward has moved past
 * the frontier, so the agreement that follows always moves it. Once all of
 * the buffer is agreed, no more agreements are needed. One 8-byte
 * allreduce per piece during backward is the price.
 *
 * Invariants:
 *   - Unsent agreed regions ("gaps") lie in [agreed, n); a new one is
 *     always below every old one, so they form a stack with the lowest
 *     offset on top, and the top's front is the next piece.
 *   - The thread alone touches agreed, the gaps and the buffer between
 *     begin and the last piece; the caller reads a bucket only after
 *     dt__prio_done/wait said it is averaged (under mu).
 */
#include "ddp_prio.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>

typedef struct gap {
    size_t begin, end;
} gap;

struct dt__prio {
    dt_group *g;
    float *grads; /* (n) borrowed */
    size_t n, per, nb, piece;
    dt_thread *thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    /* Under mu. */
    size_t local_from; /* grads[local_from, n) final on this rank */
    bool active;       /* a step is scheduled and not complete */
    bool quit;
    size_t *left;   /* (nb) floats of bucket i not averaged yet this step */
    double *t_done; /* (nb) when bucket i was */
    dt_status err;  /* the step's first failure */
    char msg[256];
    dt_ddp_piece *log; /* (cap) the step's pieces in order */
    size_t nlog, cap;
    int agreements;
    /* The thread's own. */
    size_t agreed;
    gap *gaps; /* (cap) stack, the lowest offset on top */
    size_t ngaps;
};

static size_t bucket_begin(const dt__prio *p, size_t i) {
    size_t end = p->n - i * p->per;
    return end > p->per ? end - p->per : 0;
}

/* Piece [lo, hi) is averaged: count it off its buckets (under mu). */
static void account(dt__prio *p, size_t lo, size_t hi, double t) {
    /* Bucket i holds offset x when n - (i+1) per <= x < n - i per. */
    size_t first = (p->n - hi) / p->per, last = (p->n - 1 - lo) / p->per;
    for (size_t i = first; i <= last && i < p->nb; i++) {
        size_t b = bucket_begin(p, i), e = p->n - i * p->per;
        size_t a = lo > b ? lo : b, z = hi < e ? hi : e;
        if (a >= z)
            continue;
        DT_ASSERT(p->left[i] >= z - a);
        p->left[i] -= z - a;
        if (p->left[i] == 0)
            p->t_done[i] = t;
    }
}

/* The step failed: every bucket counts as done (callers see err). */
static void fail_step(dt__prio *p, dt_status st, const char *what) {
    pthread_mutex_lock(&p->mu);
    if (p->err == DT_OK) {
        p->err = st;
        snprintf(p->msg, sizeof p->msg, "%s: %s", what, dt_last_error());
    }
    double t = dt_now();
    for (size_t i = 0; i < p->nb; i++)
        if (p->left[i]) {
            p->left[i] = 0;
            p->t_done[i] = t;
        }
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
}

/* Agree on the frontier; push what it adds. false: stop (quit or error). */
static bool agree(dt__prio *p) {
    pthread_mutex_lock(&p->mu);
    /* Nothing agreed left to send: wait until this rank can move the
     * frontier (every rank does, so the MAX below moves it). */
    while (p->ngaps == 0 && !p->quit && p->local_from >= p->agreed)
        pthread_cond_wait(&p->cv, &p->mu);
    bool quit = p->quit;
    int64_t from = (int64_t)p->local_from;
    pthread_mutex_unlock(&p->mu);
    if (quit)
        return false;
    dt_status st = dt_group_allreduce(p->g, &from, &from, 1, DT_I64, DT_MAX);
    if (st != DT_OK) {
        fail_step(p, st, "gradient readiness agreement");
        return false;
    }
    pthread_mutex_lock(&p->mu);
    p->agreements++;
    pthread_mutex_unlock(&p->mu);
    if (from < 0 || (size_t)from > p->agreed) {
        dt_error_set(DT_ERR_PROTOCOL, "agreed frontier %lld outside [0, %zu]", (long long)from,
                     p->agreed);
        fail_step(p, DT_ERR_PROTOCOL, "gradient readiness agreement");
        return false;
    }
    if ((size_t)from < p->agreed) {
        gap *top = p->ngaps ? &p->gaps[p->ngaps - 1] : NULL;
        if (top && top->begin == p->agreed) /* untouched yet: one run */
            top->begin = (size_t)from;
        else {
            DT_ASSERT(p->ngaps < p->cap);
            p->gaps[p->ngaps++] = (gap){(size_t)from, p->agreed};
        }
        p->agreed = (size_t)from;
    }
    return true;
}

/* One step: pieces until the whole buffer is averaged. */
static void run_step(dt__prio *p) {
    p->agreed = p->n;
    p->ngaps = 0;
    size_t sent = 0;
    while (sent < p->n) {
        if (p->agreed > 0 && !agree(p))
            return;
        if (p->ngaps == 0)
            continue; /* cannot happen after a moving agreement; keeps the loop safe */
        gap *top = &p->gaps[p->ngaps - 1];
        size_t lo = top->begin, hi = top->end - lo > p->piece ? lo + p->piece : top->end;
        double t0 = dt_now();
        dt_status st =
            dt_group_allreduce(p->g, p->grads + lo, p->grads + lo, hi - lo, DT_F32, DT_AVG);
        double t1 = dt_now();
        if (st != DT_OK) {
            char what[96];
            snprintf(what, sizeof what, "gradient piece [%zu, %zu)", lo, hi);
            fail_step(p, st, what);
            return;
        }
        top->begin = hi;
        if (top->begin == top->end)
            p->ngaps--;
        sent += hi - lo;
        pthread_mutex_lock(&p->mu);
        if (p->nlog < p->cap)
            p->log[p->nlog++] = (dt_ddp_piece){lo, hi, t0, t1};
        account(p, lo, hi, t1);
        pthread_cond_broadcast(&p->cv);
        pthread_mutex_unlock(&p->mu);
    }
}

static void *prio_main(void *arg) {
    dt__prio *p = arg;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->quit && !p->active)
            pthread_cond_wait(&p->cv, &p->mu);
        if (p->quit)
            break;
        pthread_mutex_unlock(&p->mu);
        run_step(p);
        pthread_mutex_lock(&p->mu);
        p->active = false;
        pthread_cond_broadcast(&p->cv);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

dt_status dt__prio_create(dt__prio **out, dt_group *g, float *grads, size_t n, size_t per,
                          size_t nb, size_t piece) {
    *out = NULL;
    DT_ASSERT(g && n > 0 && per > 0 && nb > 0 && piece > 0);
    dt__prio *p = dt_calloc(1, sizeof *p);
    if (!p)
        return DT_ERR_NOMEM;
    p->g = g;
    p->grads = grads;
    p->n = n;
    p->per = per;
    p->nb = nb;
    p->piece = piece;
    /* Pieces: at most one per piece-sized run of every gap, and a gap
     * starts at most once per agreement, i.e. per piece; so n / piece plus
     * one per bucket boundary bounds both. */
    p->cap = n / piece + 2 * nb + 2;
    p->left = dt_calloc(nb, sizeof *p->left);
    p->t_done = dt_calloc(nb, sizeof *p->t_done);
    p->log = dt_calloc(p->cap, sizeof *p->log);
    p->gaps = dt_calloc(p->cap, sizeof *p->gaps);
    if (!p->left || !p->t_done || !p->log || !p->gaps) {
        dt__prio_destroy(p);
        return DT_ERR_NOMEM;
    }
    if (pthread_mutex_init(&p->mu, NULL) != 0 || pthread_cond_init(&p->cv, NULL) != 0) {
        dt_free(p->left);
        dt_free(p->t_done);
        dt_free(p->log);
        dt_free(p->gaps);
        dt_free(p);
        return dt_error_set(DT_ERR_SYSTEM, "DDP scheduler: cannot create its mutex");
    }
    dt_status st = dt_thread_create(&p->thread, "dt-ddp-prio", prio_main, p);
    if (st != DT_OK) {
        dt__prio_destroy(p);
        return st;
    }
    *out = p;
    return DT_OK;
}

void dt__prio_destroy(dt__prio *p) {
    if (!p)
        return;
    if (p->thread) {
        pthread_mutex_lock(&p->mu);
        p->quit = true;
        pthread_cond_broadcast(&p->cv);
        pthread_mutex_unlock(&p->mu);
        dt_thread_join(p->thread);
    }
    if (p->left && p->t_done && p->log && p->gaps) {
        pthread_mutex_destroy(&p->mu);
        pthread_cond_destroy(&p->cv);
    }
    dt_free(p->left);
    dt_free(p->t_done);
    dt_free(p->log);
    dt_free(p->gaps);
    dt_free(p);
}

void dt__prio_begin(dt__prio *p) {
    pthread_mutex_lock(&p->mu);
    /* The caller saw every bucket of the previous step done; the thread
     * may still be on its way out of it. */
    while (p->active)
        pthread_cond_wait(&p->cv, &p->mu);
    for (size_t i = 0; i < p->nb; i++)
        p->left[i] = p->n - i * p->per - bucket_begin(p, i);
    p->local_from = p->n;
    p->err = DT_OK;
    p->msg[0] = '\0';
    p->nlog = 0;
    p->agreements = 0;
    p->active = true;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
}

void dt__prio_ready(dt__prio *p, size_t from) {
    pthread_mutex_lock(&p->mu);
    if (from < p->local_from) {
        p->local_from = from;
        pthread_cond_broadcast(&p->cv);
    }
    pthread_mutex_unlock(&p->mu);
}

bool dt__prio_done(dt__prio *p, size_t i, double *t_done) {
    pthread_mutex_lock(&p->mu);
    bool done = p->left[i] == 0;
    if (done)
        *t_done = p->t_done[i];
    pthread_mutex_unlock(&p->mu);
    return done;
}

dt_status dt__prio_wait(dt__prio *p, size_t i, double *t_done) {
    pthread_mutex_lock(&p->mu);
    while (p->left[i] != 0)
        pthread_cond_wait(&p->cv, &p->mu);
    *t_done = p->t_done[i];
    dt_status st = p->err;
    if (st != DT_OK)
        dt_error_set(st, "%s", p->msg);
    pthread_mutex_unlock(&p->mu);
    return st;
}

const dt_ddp_piece *dt__prio_log(const dt__prio *p, size_t *count, int *agreements) {
    dt__prio *q = (dt__prio *)p; /* the lock is not part of the value */
    pthread_mutex_lock(&q->mu);
    *count = q->nlog;
    *agreements = q->agreements;
    pthread_mutex_unlock(&q->mu);
    return p->log;
}
