/*
 * log.c — leveled, rank-prefixed logging.
 *
 * Lines are formatted into one buffer and written with a single write() so
 * that lines from different ranks sharing a terminal do not interleave
 * mid-line. Configuration is read lazily from DT_LOG / DT_LOG_SUBSYS on the
 * first call, so a program that never logs never parses them.
 */
#include "dtrain/core.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *const level_names[] = {"error", "warn", "info", "debug", "trace"};
static const char *const level_tags[] = {"ERROR", "WARN ", "INFO ", "DEBUG", "TRACE"};
_Static_assert(sizeof(level_names) / sizeof(level_names[0]) == DT_LOG_LEVEL_COUNT,
               "level table out of sync");

static atomic_int log_level = DT_LOG_LEVEL_WARN;
static atomic_int log_rank = -1;
static atomic_bool log_initialised;
static char log_subsys[256]; /* comma-separated list; empty means all */
static char log_host[64];
static dt_log_sink log_sink;
static void *log_sink_user;

dt_status dt_log_init(void) {
    atomic_store(&log_initialised, true);
    if (gethostname(log_host, sizeof log_host) != 0)
        strcpy(log_host, "?");
    log_host[sizeof log_host - 1] = '\0';
    char *dot = strchr(log_host, '.');
    if (dot)
        *dot = '\0';
    const char *sub = getenv("DT_LOG_SUBSYS");
    snprintf(log_subsys, sizeof log_subsys, "%s", sub ? sub : "");
    int level = atomic_load(&log_level);
    dt_status st = dt_config_env_enum("DT_LOG", level, level_names, DT_LOG_LEVEL_COUNT, &level);
    atomic_store(&log_level, level);
    return st;
}

static void ensure_init(void) {
    if (!atomic_load_explicit(&log_initialised, memory_order_acquire))
        (void)dt_log_init();
}

void dt_log_set_level(dt_log_level level) {
    ensure_init();
    atomic_store(&log_level, (int)level);
}

dt_log_level dt_log_get_level(void) {
    ensure_init();
    return (dt_log_level)atomic_load(&log_level);
}

void dt_log_set_rank(int rank) { atomic_store(&log_rank, rank); }

void dt_log_set_sink(dt_log_sink sink, void *user) {
    log_sink = sink;
    log_sink_user = user;
}

/* Errors and warnings always print; subsystem filtering applies below. */
static bool subsys_enabled(const char *subsys) {
    if (!subsys || !log_subsys[0])
        return true;
    size_t n = strlen(subsys);
    for (const char *p = log_subsys; *p;) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        if (len == n && strncmp(p, subsys, n) == 0)
            return true;
        if (!end)
            break;
        p = end + 1;
    }
    return false;
}

bool dt_log_enabled(dt_log_level level, const char *subsys) {
    ensure_init();
    if ((int)level > atomic_load_explicit(&log_level, memory_order_relaxed))
        return false;
    return level <= DT_LOG_LEVEL_WARN || subsys_enabled(subsys);
}

void dt_logv(dt_log_level level, const char *subsys, const char *fmt, va_list ap) {
    if (!dt_log_enabled(level, subsys))
        return;
    char line[1024];
    int rank = atomic_load(&log_rank);
    int n;
    if (rank >= 0)
        n = snprintf(line, sizeof line, "%s:%d [%d] %s ", log_host, (int)getpid(), rank,
                     level_tags[level]);
    else
        n = snprintf(line, sizeof line, "%s:%d %s ", log_host, (int)getpid(), level_tags[level]);
    if (n < 0)
        return;
    if (subsys && (size_t)n < sizeof line)
        n += snprintf(line + n, sizeof line - (size_t)n, "%s: ", subsys);
    if ((size_t)n < sizeof line)
        n += vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
    if ((size_t)n >= sizeof line - 1)
        n = (int)sizeof line - 2;
    if (log_sink) {
        line[n] = '\0';
        log_sink(level, line, log_sink_user);
        return;
    }
    line[n++] = '\n';
    ssize_t w = write(STDERR_FILENO, line, (size_t)n);
    (void)w;
}

void dt_log(dt_log_level level, const char *subsys, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    dt_logv(level, subsys, fmt, ap);
    va_end(ap);
}
