/*
 * dtrain/trace.h — the event recorder every layer writes its timeline into
 * (part of core: it needs nothing but core, so comm, tensor, nn, optim,
 * compress and train can all record without a layer violation).
 *
 * Overview
 * --------
 * A trace is a set of timed regions ("complete events": a start, an end, a
 * static name, a category and a few numbers) recorded per thread into a
 * ring buffer of fixed-size events. Recording is cheap enough to leave on:
 * no allocation, no lock, no string formatting in the hot path — two clock
 * reads and one 64-byte store per region — and a disabled tracer costs one
 * load and one predictable branch (dt_trace_begin returns 0). Each thread's
 * ring is allocated on the first event that thread records while tracing
 * is on; when it fills, the oldest events are overwritten (the newest are
 * kept, the dropped ones counted). The writers of the Chrome-trace /
 * Perfetto JSON live above (train: one file per rank and a merged file with
 * the ranks' clocks aligned; docs/observability.md).
 *
 * The tracer is process-wide, like the logger: a region in a kernel
 * cannot be handed a tracer object through every call, and the on/off
 * switch must be one load. It is the one piece of mutable global state of
 * core besides the log configuration.
 *
 * Ownership rules
 * ---------------
 *   1. Names and nothing else are pointers: `name` must be a string that
 *      lives as long as the process (a literal, dt_coll_name()). The
 *      recorder never copies or frees it.
 *   2. A thread's ring belongs to the tracer, not the thread: it outlives
 *      the thread (a destroyed group's progress thread keeps its events)
 *      and is freed by dt_trace_reset().
 *   3. Reading (dt_trace_threads, dt_trace_copy) and dt_trace_reset need
 *      every recording thread quiet: call them after dt_trace_enable(false)
 *      and after the work that records has finished (the training loop's
 *      end). dt_trace_configure only takes effect for rings created after
 *      it.
 *   4. The trace clock (dt_trace_now) is CLOCK_MONOTONIC in nanoseconds,
 *      plus the skew a test injected (dt_trace_set_clock_fault); every
 *      event of a process is on that clock.
 *
 * Example
 * -------
 *     dt_trace_configure(1 << 16);     // events per thread
 *     dt_trace_enable(true);
 *     uint64_t t = dt_trace_begin();   // 0 when tracing is off
 *     dt_matmul_forward(out, inp, w, b, N, C, OC);
 *     dt_trace_end(t, DT_TRACE_COMPUTE, "matmul_fwd", -1,
 *                  2ull * N * C * OC, 4ull * (N * C + C * OC + N * OC));
 *     dt_trace_enable(false);
 *     dt_trace_thread th[16];
 *     size_t n = dt_trace_threads(th, 16);
 *     for (size_t i = 0; i < n; i++) {
 *         dt_trace_event *ev; size_t m;
 *         if (dt_trace_copy(th[i].index, &ev, &m) == DT_OK) { ...; free(ev); }
 *     }
 *     dt_trace_reset();
 */
#ifndef DTRAIN_TRACE_H
#define DTRAIN_TRACE_H

#include "dtrain/core.h"

#include <stdatomic.h>

#ifdef __cplusplus
extern "C" {
#endif

/* What a region is; the step breakdown and the report colour by it. */
typedef enum dt_trace_cat {
    DT_TRACE_STEP,     /* the loop: an optimizer step, an evaluation */
    DT_TRACE_COMPUTE,  /* a kernel, or a block's forward or backward */
    DT_TRACE_COMM,     /* a collective or point-to-point operation, start to end */
    DT_TRACE_WAIT,     /* a caller blocked on communication it issued earlier */
    DT_TRACE_DATA,     /* reading a batch */
    DT_TRACE_OPTIM,    /* an optimizer update */
    DT_TRACE_CAST,     /* a precision conversion (16-bit weights, activations) */
    DT_TRACE_COMPRESS, /* a codec's encode or decode */
    DT_TRACE_CKPT,     /* writing or reading a checkpoint */
    DT_TRACE_CAT_COUNT
} dt_trace_cat;

/* "step", "compute", "comm", "wait", "data", "optim", "cast", "compress",
 * "ckpt" (indexable by dt_trace_cat). */
extern const char *const dt_trace_cat_names[DT_TRACE_CAT_COUNT];

/* One region. 64 bytes: one cache line per event. */
typedef struct dt_trace_event {
    uint64_t t0, t1;  /* start and end on the trace clock, ns (t1 >= t0) */
    const char *name; /* static (rule 1): "matmul_fwd", "allreduce", "step" */
    union {
        uint64_t flops;   /* compute: floating-point operations of the region, 0: unknown */
        uint64_t t_issue; /* comm: when the caller issued it (<= t0), 0: unknown */
    };
    uint64_t bytes; /* compute: the bytes a kernel must read and write at least;
                       comm: the payload one rank contributes; data: tokens read */
    uint32_t group; /* comm, wait: the group (the same number on every member) */
    uint32_t seq;   /* comm, wait: the operation's sequence number in its group */
    int32_t idx;    /* layer, bucket, micro-batch or step; -1: none */
    int16_t peer;   /* comm: the peer (send, recv) or root; -1: none */
    uint16_t ranks; /* comm: the group's size */
    uint8_t cat;    /* dt_trace_cat */
    uint8_t algo;   /* comm: the dt_algo that ran */
    uint8_t link;   /* comm: dt_trace_link */
    uint8_t dtype;  /* comm: the dt_dtype of the payload */
    uint32_t spare; /* zero */
} dt_trace_event;
_Static_assert(sizeof(dt_trace_event) == 64, "a trace event is one cache line");

/* The transport a comm event crossed (for its alpha-beta model). */
typedef enum dt_trace_link {
    DT_TRACE_LINK_SELF,
    DT_TRACE_LINK_SHM,
    DT_TRACE_LINK_TCP,
    DT_TRACE_LINK_MIXED, /* shm inside hosts and tcp between them */
    DT_TRACE_LINK_MPI,
    DT_TRACE_LINK_COUNT
} dt_trace_link;
/* "self", "shm", "tcp", "shm+tcp", "mpi". */
extern const char *const dt_trace_link_names[DT_TRACE_LINK_COUNT];

/* The switch (internal: read through dt_trace_begin). */
extern atomic_int dt__trace_on;

/* The trace clock in ns (rule 4). */
uint64_t dt_trace_now(void);

/* The start of a region: the trace clock when tracing is on, else 0 (one
 * load and one branch). */
static inline uint64_t dt_trace_begin(void) {
    if (__builtin_expect(atomic_load_explicit(&dt__trace_on, memory_order_relaxed) != 0, 0))
        return dt_trace_now();
    return 0;
}

/* Record a whole event (its t0 set; t1 0 means "now"). */
void dt_trace_put(const dt_trace_event *e);
/* The end of a region begun at t0 (nothing when t0 is 0). */
void dt__trace_region(uint64_t t0, dt_trace_cat cat, const char *name, int32_t idx, uint64_t flops,
                      uint64_t bytes);
static inline void dt_trace_end(uint64_t t0, dt_trace_cat cat, const char *name, int32_t idx,
                                uint64_t flops, uint64_t bytes) {
    if (__builtin_expect(t0 != 0, 0))
        dt__trace_region(t0, cat, name, idx, flops, bytes);
}

/* Kernels (tensor, amp): only the outermost kernel call of a thread is
 * recorded, and none inside a parallel region — a 16-bit kernel that runs
 * an fp32 kernel per block of rows, on worker threads or not, is one
 * event. dt_trace_kernel_enter takes dt_trace_begin()'s t0 (non-zero) and
 * whether the caller is inside a parallel region; it returns t0 when this
 * call is to be recorded, else 0. A non-zero return must reach
 * dt_trace_kernel_end (which records the region in category `cat`). */
uint64_t dt_trace_kernel_enter(uint64_t t0, bool in_parallel);
void dt_trace_kernel_end(uint64_t t0, dt_trace_cat cat, const char *name, uint64_t flops,
                         uint64_t bytes);

/* Events per thread of the rings created from now on (default 16384:
 * 1 MiB; at least 64). DT_ERR_INVALID outside [64, 2^26]. */
dt_status dt_trace_configure(size_t events_per_thread);
/* Turn recording on or off for every thread (rule 3 for reading). */
void dt_trace_enable(bool on);
bool dt_trace_enabled(void);
/* Name this thread in the trace ("main", "rank 0"); 15 bytes are kept.
 * Without a name a thread is shown under its system name. */
void dt_trace_name_thread(const char *name);

/* A test hook (DT_FAULT_CLOCK): this process's trace clock runs ahead by
 * offset_ns plus drift_ppm millionths of the time since the call, as a
 * machine whose clock is off and drifting would; the alignment of the
 * merged trace must undo it. 0, 0 removes it. */
void dt_trace_set_clock_fault(int64_t offset_ns, double drift_ppm);

/* One thread's ring, as dt_trace_threads describes it. */
typedef struct dt_trace_thread {
    int index;         /* for dt_trace_copy: 0, 1, 2 ... in the order threads first recorded */
    int tid;           /* the kernel's thread id */
    char name[16];     /* dt_trace_name_thread's, else the system name */
    uint64_t recorded; /* events recorded since the last reset */
    uint64_t dropped;  /* of which overwritten when the ring was full */
} dt_trace_thread;

/* Describe up to `max` rings into out[]; returns how many exist. */
size_t dt_trace_threads(dt_trace_thread *out, size_t max);
/* Copy ring `index`'s events, oldest first, into a malloc'ed array the
 * caller frees (*out NULL and *n 0 for an empty ring). */
dt_status dt_trace_copy(int index, dt_trace_event **out, size_t *n);
/* Free every ring (recording off; rule 3). */
void dt_trace_reset(void);

#ifdef __cplusplus
}
#endif
#endif /* DTRAIN_TRACE_H */
