/*
 * trace.c — the per-thread ring buffers of dtrain/trace.h.
 *
 * Each recording thread owns one ring: an array of `cap` events and a
 * count `head` of events ever written. The thread writes slot head % cap
 * and then publishes head + 1 with a release store; a reader (rule 3:
 * only once recording stopped) loads head with acquire and copies the
 * newest min(head, cap) slots. Rings are found through a thread-local
 * pointer (no lock on the hot path) and listed, under a mutex taken only
 * when a thread records its first event, for the readers.
 *
 * Invariants: a ring is never freed while its thread could still write
 * (dt_trace_reset is called with recording off and the threads quiet);
 * a thread whose ring could not be allocated records nothing (marked so
 * that it does not retry on every event).
 */
#include "dtrain/trace.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

const char *const dt_trace_cat_names[DT_TRACE_CAT_COUNT] = {
    "step", "compute", "comm", "wait", "data", "optim", "cast", "compress", "ckpt"};
const char *const dt_trace_link_names[DT_TRACE_LINK_COUNT] = {"self", "shm", "tcp", "shm+tcp",
                                                              "mpi"};

#define DEFAULT_EVENTS ((size_t)16384)
#define MIN_EVENTS     ((size_t)64)
#define MAX_EVENTS     ((size_t)1 << 26)

typedef struct ring {
    dt_trace_event *ev;    /* (cap) */
    size_t cap;            /* events */
    _Atomic uint64_t head; /* events ever written (the next slot is head % cap) */
    int index, tid;
    char name[16];
    struct ring *next; /* in the readers' list */
} ring;

atomic_int dt__trace_on;

/* The process's tracer (see trace.h on why it is global). */
static pthread_mutex_t rings_mu = PTHREAD_MUTEX_INITIALIZER;
static ring *rings; /* every ring, newest first (under rings_mu) */
static int nrings;  /* (under rings_mu) */
static atomic_size_t ring_cap = DEFAULT_EVENTS;
static _Atomic uint64_t epoch; /* bumped by reset: a thread's cached ring is stale */
static _Atomic int64_t fault_offset;
static _Atomic int64_t fault_ppb; /* drift in parts per billion */
static _Atomic uint64_t fault_since;

static _Thread_local ring *mine;
static _Thread_local uint64_t mine_epoch;
static _Thread_local bool mine_failed;
static _Thread_local char mine_name[16];
static _Thread_local int kernel_depth; /* open outermost kernel regions: 0 or 1 */

static uint64_t raw_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

uint64_t dt_trace_now(void) {
    uint64_t t = raw_now();
    int64_t off = atomic_load_explicit(&fault_offset, memory_order_relaxed);
    int64_t ppb = atomic_load_explicit(&fault_ppb, memory_order_relaxed);
    if (off == 0 && ppb == 0)
        return t;
    uint64_t since = atomic_load_explicit(&fault_since, memory_order_relaxed);
    double drift = (double)(t - since) * (double)ppb * 1e-9;
    return (uint64_t)((int64_t)t + off + (int64_t)drift);
}

void dt_trace_set_clock_fault(int64_t offset_ns, double drift_ppm) {
    atomic_store(&fault_since, raw_now());
    atomic_store(&fault_ppb, (int64_t)(drift_ppm * 1e3));
    atomic_store(&fault_offset, offset_ns);
}

dt_status dt_trace_configure(size_t events_per_thread) {
    if (events_per_thread < MIN_EVENTS || events_per_thread > MAX_EVENTS)
        return dt_error_set(DT_ERR_INVALID,
                            "trace buffer: %zu events per thread; expected %zu..%zu",
                            events_per_thread, MIN_EVENTS, MAX_EVENTS);
    atomic_store(&ring_cap, events_per_thread);
    return DT_OK;
}

void dt_trace_enable(bool on) { atomic_store(&dt__trace_on, on ? 1 : 0); }

bool dt_trace_enabled(void) { return atomic_load(&dt__trace_on) != 0; }

void dt_trace_name_thread(const char *name) {
    snprintf(mine_name, sizeof mine_name, "%s", name ? name : "");
    ring *r = mine;
    if (r && mine_epoch == atomic_load(&epoch))
        memcpy(r->name, mine_name, sizeof r->name);
}

/* This thread's ring, created on its first event (the only allocation). */
static ring *my_ring(void) {
    uint64_t ep = atomic_load_explicit(&epoch, memory_order_acquire);
    if (__builtin_expect(mine != NULL && mine_epoch == ep, 1))
        return mine;
    if (mine_failed && mine_epoch == ep)
        return NULL;
    mine = NULL;
    mine_epoch = ep;
    size_t cap = atomic_load(&ring_cap);
    ring *r = calloc(1, sizeof *r);
    dt_trace_event *ev = r ? malloc(cap * sizeof *ev) : NULL;
    if (!r || !ev) {
        free(r);
        mine_failed = true;
        return NULL;
    }
    mine_failed = false;
    r->ev = ev;
    r->cap = cap;
    r->tid = (int)syscall(SYS_gettid);
    if (mine_name[0])
        memcpy(r->name, mine_name, sizeof r->name);
    else if (pthread_getname_np(pthread_self(), r->name, sizeof r->name) != 0)
        snprintf(r->name, sizeof r->name, "thread %d", r->tid);
    pthread_mutex_lock(&rings_mu);
    r->index = nrings++;
    r->next = rings;
    rings = r;
    pthread_mutex_unlock(&rings_mu);
    mine = r;
    return r;
}

void dt_trace_put(const dt_trace_event *e) {
    ring *r = my_ring();
    if (!r)
        return;
    uint64_t h = atomic_load_explicit(&r->head, memory_order_relaxed);
    dt_trace_event *slot = &r->ev[h % r->cap];
    *slot = *e;
    if (slot->t1 == 0)
        slot->t1 = dt_trace_now();
    atomic_store_explicit(&r->head, h + 1, memory_order_release);
}

void dt__trace_region(uint64_t t0, dt_trace_cat cat, const char *name, int32_t idx, uint64_t flops,
                      uint64_t bytes) {
    ring *r = my_ring();
    if (!r)
        return;
    uint64_t h = atomic_load_explicit(&r->head, memory_order_relaxed);
    dt_trace_event *slot = &r->ev[h % r->cap];
    slot->t0 = t0;
    slot->t1 = dt_trace_now();
    slot->name = name;
    slot->flops = flops;
    slot->bytes = bytes;
    slot->group = 0;
    slot->seq = 0;
    slot->idx = idx;
    slot->peer = -1;
    slot->ranks = 0;
    slot->cat = (uint8_t)cat;
    slot->algo = 0;
    slot->link = 0;
    slot->dtype = 0;
    slot->spare = 0;
    atomic_store_explicit(&r->head, h + 1, memory_order_release);
}

uint64_t dt_trace_kernel_enter(uint64_t t0, bool in_parallel) {
    if (in_parallel || kernel_depth > 0)
        return 0;
    kernel_depth = 1;
    return t0;
}

void dt_trace_kernel_end(uint64_t t0, dt_trace_cat cat, const char *name, uint64_t flops,
                         uint64_t bytes) {
    if (!t0)
        return;
    kernel_depth = 0;
    dt__trace_region(t0, cat, name, -1, flops, bytes);
}

size_t dt_trace_threads(dt_trace_thread *out, size_t max) {
    pthread_mutex_lock(&rings_mu);
    size_t n = (size_t)nrings;
    for (ring *r = rings; r; r = r->next) {
        if ((size_t)r->index >= max)
            continue;
        uint64_t h = atomic_load_explicit(&r->head, memory_order_acquire);
        dt_trace_thread *t = &out[r->index];
        t->index = r->index;
        t->tid = r->tid;
        memcpy(t->name, r->name, sizeof t->name);
        t->name[sizeof t->name - 1] = 0;
        t->recorded = h;
        t->dropped = h > r->cap ? h - r->cap : 0;
    }
    pthread_mutex_unlock(&rings_mu);
    return n;
}

dt_status dt_trace_copy(int index, dt_trace_event **out, size_t *n) {
    *out = NULL;
    *n = 0;
    pthread_mutex_lock(&rings_mu);
    ring *r = rings;
    while (r && r->index != index)
        r = r->next;
    if (!r) {
        pthread_mutex_unlock(&rings_mu);
        return dt_error_set(DT_ERR_NOT_FOUND, "trace: no thread %d", index);
    }
    uint64_t h = atomic_load_explicit(&r->head, memory_order_acquire);
    size_t k = h < r->cap ? (size_t)h : r->cap;
    dt_status st = DT_OK;
    if (k > 0) {
        dt_trace_event *ev = malloc(k * sizeof *ev);
        if (!ev) {
            st = dt_error_set(DT_ERR_NOMEM, "trace: copying %zu events", k);
        } else {
            for (size_t i = 0; i < k; i++) /* the oldest kept is event h - k */
                ev[i] = r->ev[(h - k + i) % r->cap];
            *out = ev;
            *n = k;
        }
    }
    pthread_mutex_unlock(&rings_mu);
    return st;
}

void dt_trace_reset(void) {
    pthread_mutex_lock(&rings_mu);
    ring *r = rings;
    rings = NULL;
    nrings = 0;
    atomic_fetch_add_explicit(&epoch, 1, memory_order_release);
    pthread_mutex_unlock(&rings_mu);
    while (r) {
        ring *next = r->next;
        free(r->ev);
        free(r);
        r = next;
    }
}
