/*
 * dtrain/core.h — the bottom layer every other layer stands on.
 *
 * Overview
 * --------
 * core gives the rest of dtrain five small things and nothing else:
 *
 *   1. Status codes and a thread-local error message. A function that can
 *      fail returns a dt_status (DT_OK == 0); the detail — which rank, peer,
 *      operation, size or file — is written with dt_error_set() and read by
 *      the caller with dt_last_error(). DT_CHECK() propagates a failure and
 *      appends a "file:line" breadcrumb so the final message reads like a
 *      short backtrace.
 *   2. Logging controlled by DT_LOG=error|warn|info|debug|trace and
 *      DT_LOG_SUBSYS=comm,shm,... Lines look like "host:pid [rank] LEVEL msg".
 *      dt_log_set_sink() lets an embedding program redirect them.
 *   3. 64-byte aligned allocation, a monotonic clock, and thin thread helpers.
 *   4. Configuration parsing: sizes (64K, 25M, 1G), booleans, integers,
 *      reals and enums, from command-line values or DT_* environment
 *      variables. A bad value is rejected with the knob's name, the value and
 *      the accepted range.
 *   5. A counter-based random generator (Philox4x32-10). A stream is keyed by
 *      (seed, stream id); any rank can reproduce any other rank's stream for
 *      any step, which makes runs deterministic and resumable.
 *
 * Example
 * -------
 *     dt_status st;
 *     size_t bucket;
 *     st = dt_config_env_size("DT_BUCKET_SIZE", 25u << 20, 1, SIZE_MAX, &bucket);
 *     if (st != DT_OK) {
 *         fprintf(stderr, "error: %s\n", dt_last_error());
 *         return st;
 *     }
 *     dt_rng rng;
 *     dt_rng_init(&rng, seed, dt_rng_stream_id(rank, step, DT_RNG_DATA));
 *     float u = dt_rng_uniform(&rng);
 */
#ifndef DTRAIN_CORE_H
#define DTRAIN_CORE_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

#define DT_VERSION_MAJOR  0
#define DT_VERSION_MINOR  1
#define DT_VERSION_PATCH  0
#define DT_VERSION_STRING "0.1.0"

/* ------------------------------------------------------------------------ */
/* Status codes                                                             */
/* ------------------------------------------------------------------------ */

/* One table generates the enum and the strings, so they cannot drift apart. */
#define DT_STATUS_TABLE(X)                                                                         \
    X(DT_OK, "success")                                                                            \
    X(DT_ERR_INVALID, "invalid argument")                                                          \
    X(DT_ERR_NOMEM, "out of memory")                                                               \
    X(DT_ERR_IO, "input/output error")                                                             \
    X(DT_ERR_NOSPACE, "no space left on device")                                                   \
    X(DT_ERR_SYSTEM, "system call failed")                                                         \
    X(DT_ERR_TIMEOUT, "timed out")                                                                 \
    X(DT_ERR_PEER, "peer failed or disconnected")                                                  \
    X(DT_ERR_MISMATCH, "ranks called mismatched operations")                                       \
    X(DT_ERR_PROTOCOL, "malformed message")                                                        \
    X(DT_ERR_AUTH, "authentication failed")                                                        \
    X(DT_ERR_CORRUPT, "corrupt data")                                                              \
    X(DT_ERR_UNSUPPORTED, "not supported")                                                         \
    X(DT_ERR_ABORTED, "aborted")                                                                   \
    X(DT_ERR_NUMERIC, "numerical error")                                                           \
    X(DT_ERR_NOT_FOUND, "not found")                                                               \
    X(DT_ERR_INTERNAL, "internal error")

typedef enum dt_status {
#define DT__STATUS_ENUM(name, text) name,
    DT_STATUS_TABLE(DT__STATUS_ENUM)
#undef DT__STATUS_ENUM
        DT_STATUS_COUNT
} dt_status;

/* Short fixed description of a status ("timed out"); never NULL. */
const char *dt_strerror(dt_status st);

/* Symbolic name of a status ("DT_ERR_TIMEOUT"); never NULL. */
const char *dt_status_name(dt_status st);

/* The detailed message of the last failure on this thread, or "" if none. */
const char *dt_last_error(void);

/* Record a detailed message for the current thread and return st, so that
 * callers can write `return dt_error_set(DT_ERR_INVALID, "...", ...)`.
 * The message replaces any earlier one. */
dt_status dt_error_set(dt_status st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Like dt_error_set, with the current errno's text appended. */
dt_status dt_error_set_errno(dt_status st, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Prepend context to the current message ("while loading ckpt: <old>"). */
void dt_error_prefix(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Append a "  at file:line" breadcrumb; used by DT_CHECK. */
void dt__error_breadcrumb(const char *file, int line);

void dt_error_clear(void);

/* Propagate a failing status, leaving a file:line breadcrumb. */
#define DT_CHECK(call)                                                                             \
    do {                                                                                           \
        dt_status dt__st = (call);                                                                 \
        if (dt__st != DT_OK) {                                                                     \
            dt__error_breadcrumb(__FILE__, __LINE__);                                              \
            return dt__st;                                                                         \
        }                                                                                          \
    } while (0)

/* Same, but jump to a cleanup label with the status stored in `st`. */
#define DT_CHECK_GOTO(call, st, label)                                                             \
    do {                                                                                           \
        (st) = (call);                                                                             \
        if ((st) != DT_OK) {                                                                       \
            dt__error_breadcrumb(__FILE__, __LINE__);                                              \
            goto label;                                                                            \
        }                                                                                          \
    } while (0)

/* Always-on assertion for programming errors (never for bad input). */
__attribute__((noreturn)) void dt__assert_fail(const char *expr, const char *file, int line,
                                               const char *func);
#define DT_ASSERT(expr) ((expr) ? (void)0 : dt__assert_fail(#expr, __FILE__, __LINE__, __func__))

/* ------------------------------------------------------------------------ */
/* Logging                                                                  */
/* ------------------------------------------------------------------------ */

typedef enum dt_log_level {
    DT_LOG_LEVEL_ERROR,
    DT_LOG_LEVEL_WARN,
    DT_LOG_LEVEL_INFO,
    DT_LOG_LEVEL_DEBUG,
    DT_LOG_LEVEL_TRACE,
    DT_LOG_LEVEL_COUNT
} dt_log_level;

/* A sink receives one complete line without the trailing newline. */
typedef void (*dt_log_sink)(dt_log_level level, const char *line, void *user);

/* Read DT_LOG and DT_LOG_SUBSYS (called lazily by the first log call; call
 * it again after changing the environment). Returns DT_ERR_INVALID for an
 * unknown level, leaving the previous one in place. */
dt_status dt_log_init(void);
void dt_log_set_level(dt_log_level level);
dt_log_level dt_log_get_level(void);
/* The rank shown in every line; -1 (the default) shows no rank. */
void dt_log_set_rank(int rank);
/* NULL restores the default sink (stderr). */
void dt_log_set_sink(dt_log_sink sink, void *user);
/* True if a message of this level and subsystem (may be NULL) would print. */
bool dt_log_enabled(dt_log_level level, const char *subsys);
void dt_log(dt_log_level level, const char *subsys, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void dt_logv(dt_log_level level, const char *subsys, const char *fmt, va_list ap);

#define DT_LOG_AT(level, subsys, ...)                                                              \
    do {                                                                                           \
        if (dt_log_enabled((level), (subsys)))                                                     \
            dt_log((level), (subsys), __VA_ARGS__);                                                \
    } while (0)
#define DT_ERROR(...)         DT_LOG_AT(DT_LOG_LEVEL_ERROR, NULL, __VA_ARGS__)
#define DT_WARN(...)          DT_LOG_AT(DT_LOG_LEVEL_WARN, NULL, __VA_ARGS__)
#define DT_INFO(...)          DT_LOG_AT(DT_LOG_LEVEL_INFO, NULL, __VA_ARGS__)
#define DT_DEBUG(subsys, ...) DT_LOG_AT(DT_LOG_LEVEL_DEBUG, (subsys), __VA_ARGS__)
#define DT_TRACE(subsys, ...) DT_LOG_AT(DT_LOG_LEVEL_TRACE, (subsys), __VA_ARGS__)

/* ------------------------------------------------------------------------ */
/* Memory                                                                   */
/* ------------------------------------------------------------------------ */

#define DT_ALIGN 64

/* 64-byte aligned allocation; NULL on failure (and a message is recorded).
 * A request of 0 bytes returns a valid pointer that must be freed. A
 * request of 256 MiB or more that exceeds dt_mem_available() fails at once
 * instead of being overcommitted and later paid for by the OOM killer. */
void *dt_alloc(size_t bytes);

/* Bytes this process could still allocate and use without swapping:
 * MemAvailable plus free swap, or less if its memory cgroup (a container,
 * a Slurm job) allows less. false when /proc/meminfo cannot be read. */
bool dt_mem_available(uint64_t *bytes);
/* This process's resident memory now and its high-water mark (VmRSS and
 * VmHWM of /proc/self/status), in bytes; false when unreadable. */
bool dt_mem_resident(uint64_t *now, uint64_t *peak);
/* Bytes of shared memory this process has resident now (RssShmem: the
 * communication segments it maps and touched); false where unknown. */
bool dt_mem_shared(uint64_t *now);
/* Zeroed allocation; a large one is zero without being resident (see
 * dt_mem_zero). */
void *dt_calloc(size_t count, size_t size);
void dt_free(void *p);
/* Zero [p, p + bytes) of memory from dt_alloc without making it resident:
 * the whole pages inside go back to the system (they read as zero and
 * cost nothing until written), the partial pages at either end are
 * cleared. For large buffers written late or only in part (gradients and
 * parameters a ZeRO replica shards, optimizer state before its first
 * step), so the peak resident memory is what is used, not what is
 * reserved. */
void dt_mem_zero(void *p, size_t bytes);
/* Give the whole pages inside [p, p + bytes) back to the system (memory
 * from dt_alloc); they read as zero afterwards. */
void dt_mem_discard(void *p, size_t bytes);

/* Round up to a multiple of `align` (a power of two). */
static inline size_t dt_align_up(size_t n, size_t align) { return (n + align - 1) & ~(align - 1); }

/* Overflow-checked a*b; returns false on overflow. */
static inline bool dt_mul_size(size_t a, size_t b, size_t *out) {
    return !__builtin_mul_overflow(a, b, out);
}

/* ------------------------------------------------------------------------ */
/* Time                                                                     */
/* ------------------------------------------------------------------------ */

/* Monotonic clock in nanoseconds (CLOCK_MONOTONIC). */
uint64_t dt_now_ns(void);
/* Monotonic clock in seconds. */
double dt_now(void);
/* Sleep, restarting after signals, for at least `ms` milliseconds. */
void dt_sleep_ms(unsigned ms);

/* ------------------------------------------------------------------------ */
/* Files                                                                    */
/* ------------------------------------------------------------------------ */

/* Write all of data to fd, restarting after EINTR and short writes. A full
 * disk gives DT_ERR_NOSPACE, other failures DT_ERR_IO; the message names
 * `path` and the cause ("No space left on device"). */
dt_status dt_file_write_all(int fd, const void *data, size_t len, const char *path);

/* fsync a directory so that a rename or unlink inside it is durable. File
 * systems that cannot fsync directories (EINVAL, ENOTSUP) are not an error. */
dt_status dt_fsync_dir(const char *dir);

/* Open `path` for reading a dtrain file format (`what`: "weights file",
 * ...). A path that is not a regular file (a directory, a FIFO, a device)
 * is DT_ERR_INVALID naming what it is, without blocking; a missing one
 * DT_ERR_NOT_FOUND. The caller fcloses *out. */
dt_status dt_file_open_read(const char *path, const char *what, FILE **out);

/* After a format's last field: DT_OK when f holds nothing more, else
 * DT_ERR_CORRUPT naming the file and how many bytes follow its end. */
dt_status dt_file_expect_end(FILE *f, const char *what, const char *path);

/* One piece of a file written by dt_file_write_atomic. */
typedef struct dt_file_part {
    const void *data; /* bytes of this piece */
    size_t len;       /* their count */
} dt_file_part;

/* DT_OK when `path` may be replaced by a rename: it does not exist or is a
 * regular file (a symbolic link is judged by its target). A directory, a
 * device, a FIFO or a socket is DT_ERR_INVALID naming the path and what it
 * is: an output option pointed at /dev/null must not replace /dev/null.
 * Every writer that renames a temporary file over its output calls this
 * first (dt_file_write_atomic does). */
dt_status dt_file_check_replaceable(const char *path);

/* Replace `path` with the concatenation of parts[0..nparts) so that the name
 * only ever holds the old or the complete new content: write a temporary file
 * in the same directory, fsync it, rename it over `path`, fsync the
 * directory. On failure the temporary file is removed and `path` is
 * untouched. An existing `path` that is not a regular file is refused
 * (dt_file_check_replaceable). */
dt_status dt_file_write_atomic(const char *path, const dt_file_part *parts, int nparts);

/* mkdir -p: create `dir` and its parents; an existing directory is fine, an
 * existing file of that name is DT_ERR_IO. */
dt_status dt_mkdir_p(const char *dir);

/* ------------------------------------------------------------------------ */
/* Threads                                                                  */
/* ------------------------------------------------------------------------ */

typedef struct dt_thread dt_thread;
typedef void *(*dt_thread_fn)(void *arg);

/* Start a joinable thread; `name` (<= 15 chars shown) appears in top/gdb. */
dt_status dt_thread_create(dt_thread **out, const char *name, dt_thread_fn fn, void *arg);
/* Join and free; returns the thread function's result. NULL-safe. */
void *dt_thread_join(dt_thread *t);
/* Number of CPUs this process may run on (sched_getaffinity), >= 1. */
int dt_cpu_count(void);

/* ------------------------------------------------------------------------ */
/* Configuration                                                            */
/* ------------------------------------------------------------------------ */
/*
 * Every parser takes the knob's name (a flag such as "--bucket-size" or a
 * variable such as "DT_BUCKET_SIZE") only to name it in the error message.
 * On failure *out is untouched and DT_ERR_INVALID is returned with a message
 * such as:  --bucket-size: "12Q" is not a size (examples: 4096, 64K, 25M, 1G)
 */

/* Sizes: a non-negative integer with an optional binary suffix K, M, G, T
 * (also KiB/KB/k: all are powers of 1024), in [min, max]. */
dt_status dt_config_parse_size(const char *knob, const char *text, size_t min, size_t max,
                               size_t *out);
/* Booleans: 1/0, true/false, yes/no, on/off (any case). */
dt_status dt_config_parse_bool(const char *knob, const char *text, bool *out);
/* Integers in [min, max] (decimal, or 0x hexadecimal). */
dt_status dt_config_parse_int(const char *knob, const char *text, int64_t min, int64_t max,
                              int64_t *out);
/* Finite reals in [min, max]. */
dt_status dt_config_parse_double(const char *knob, const char *text, double min, double max,
                                 double *out);
/* One of `names[0..count)`, exact and case-sensitive; *out is the index. */
dt_status dt_config_parse_enum(const char *knob, const char *text, const char *const *names,
                               int count, int *out);

/* The same, reading environment variable `var`; an unset or empty variable
 * gives `def` and DT_OK. */
dt_status dt_config_env_size(const char *var, size_t def, size_t min, size_t max, size_t *out);
dt_status dt_config_env_bool(const char *var, bool def, bool *out);
dt_status dt_config_env_int(const char *var, int64_t def, int64_t min, int64_t max, int64_t *out);
dt_status dt_config_env_double(const char *var, double def, double min, double max, double *out);
dt_status dt_config_env_enum(const char *var, int def, const char *const *names, int count,
                             int *out);

/* Format a byte count for humans: "1.5 MiB". Returns buf. */
char *dt_format_bytes(double bytes, char *buf, size_t len);

/* ------------------------------------------------------------------------ */
/* Random numbers: Philox4x32-10                                            */
/* ------------------------------------------------------------------------ */
/*
 * Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2,
 * 3", SC'11) maps a 128-bit counter and a 64-bit key to 128 random bits.
 * dt_rng keys it with the seed and uses the counter as (position, stream):
 * the low 64 bits count blocks within a stream, the high 64 bits name the
 * stream. Streams never overlap, and jumping to any position is O(1).
 */

/* One Philox4x32-10 block: out = philox(counter, key). */
void dt_philox4x32_10(const uint32_t counter[4], const uint32_t key[2], uint32_t out[4]);

/* Purposes that partition the stream space (the top byte of a stream id). */
typedef enum dt_rng_purpose {
    DT_RNG_INIT,     /* parameter initialisation */
    DT_RNG_DATA,     /* data shuffling and sampling */
    DT_RNG_DROPOUT,  /* dropout masks */
    DT_RNG_COMPRESS, /* stochastic quantisation, random-k */
    DT_RNG_SAMPLE,   /* text generation */
    DT_RNG_TEST,     /* tests and benchmarks */
    DT_RNG_GOSSIP,   /* gossip's random matchings */
    DT_RNG_PURPOSE_COUNT
} dt_rng_purpose;

typedef struct dt_rng {
    uint32_t key[2]; /* the seed */
    uint64_t stream; /* high half of the counter */
    uint64_t block;  /* low half of the counter: next block to generate */
    uint32_t buf[4]; /* the current block's outputs */
    unsigned used;   /* how many of buf[] were consumed (4 = empty) */
} dt_rng;

/* Stream id for (rank, step, purpose): rank < 2^20, step < 2^36. Distinct
 * arguments give distinct ids. */
uint64_t dt_rng_stream_id(uint32_t rank, uint64_t step, dt_rng_purpose purpose);

void dt_rng_init(dt_rng *r, uint64_t seed, uint64_t stream);
/* Jump to the n-th 32-bit output of the stream. */
void dt_rng_seek(dt_rng *r, uint64_t n);
/* How many 32-bit outputs have been drawn (for saving state). */
uint64_t dt_rng_tell(const dt_rng *r);
uint32_t dt_rng_u32(dt_rng *r);
uint64_t dt_rng_u64(dt_rng *r);
/* Uniform in [0, 1) with 24 random bits. */
float dt_rng_uniform(dt_rng *r);
/* Uniform integer in [0, n), unbiased (Lemire's method); n > 0. */
uint32_t dt_rng_below(dt_rng *r, uint32_t n);
/* Standard normal (Box-Muller). */
float dt_rng_normal(dt_rng *r);

/* ------------------------------------------------------------------------ */
/* Hashing                                                                  */
/* ------------------------------------------------------------------------ */

/* XXH3-64 of a byte range (Debian's libxxhash). Used for checksums of
 * checkpoints and for parameter-equality checks across ranks. */
uint64_t dt_hash64(const void *data, size_t len, uint64_t seed);

/* Incremental form of dt_hash64, for data that arrives in pieces;
 * dt_hasher_final gives the same value as dt_hash64 over the concatenation. */
typedef struct dt_hasher dt_hasher;
dt_status dt_hasher_create(dt_hasher **out, uint64_t seed);
void dt_hasher_update(dt_hasher *h, const void *data, size_t len);
uint64_t dt_hasher_final(const dt_hasher *h);
void dt_hasher_destroy(dt_hasher *h);

#ifdef __cplusplus
}
#endif
#endif /* DTRAIN_CORE_H */
