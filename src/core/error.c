/*
 * error.c — status strings and the thread-local last-error message.
 *
 * The message buffer is per thread so that a progress thread's failure never
 * overwrites the message a user thread is about to print. Breadcrumbs are
 * appended until the buffer is full; later ones are dropped, never the
 * original message.
 */
#include "dtrain/core.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const status_text[] = {
#define X(name, text) text,
    DT_STATUS_TABLE(X)
#undef X
};
static const char *const status_name[] = {
#define X(name, text) #name,
    DT_STATUS_TABLE(X)
#undef X
};
_Static_assert(sizeof(status_text) / sizeof(status_text[0]) == DT_STATUS_COUNT,
               "status table out of sync");

#define ERROR_MSG_MAX 2048
static _Thread_local char error_msg[ERROR_MSG_MAX];

const char *dt_strerror(dt_status st) {
    if ((unsigned)st >= DT_STATUS_COUNT)
        return "unknown status";
    return status_text[st];
}

const char *dt_status_name(dt_status st) {
    if ((unsigned)st >= DT_STATUS_COUNT)
        return "DT_ERR_UNKNOWN";
    return status_name[st];
}

const char *dt_last_error(void) { return error_msg; }

void dt_error_clear(void) { error_msg[0] = '\0'; }

/* Format into a temporary and copy: an argument may be dt_last_error()
 * itself (wrapping the current message in a new one), and vsnprintf into
 * the buffer it is reading from is undefined (glibc garbled such messages:
 * "group w was aborted (group w was aborted (lost)"). */
static int format_message(const char *fmt, va_list ap) {
    char tmp[ERROR_MSG_MAX];
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    memcpy(error_msg, tmp, sizeof error_msg);
    return n;
}

dt_status dt_error_set(dt_status st, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    format_message(fmt, ap);
    va_end(ap);
    return st;
}

dt_status dt_error_set_errno(dt_status st, const char *fmt, ...) {
    int saved = errno;
    va_list ap;
    va_start(ap, fmt);
    int n = format_message(fmt, ap);
    va_end(ap);
    if (n >= 0 && (size_t)n < sizeof error_msg)
        snprintf(error_msg + n, sizeof error_msg - (size_t)n, ": %s", strerror(saved));
    errno = saved;
    return st;
}

void dt_error_prefix(const char *fmt, ...) {
    char old[ERROR_MSG_MAX];
    memcpy(old, error_msg, sizeof old);
    va_list ap;
    va_start(ap, fmt);
    int n = format_message(fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= sizeof error_msg || !old[0])
        return;
    /* Append ": old", cut at the buffer's end (a long message loses its tail). */
    size_t at = (size_t)n;
    for (const char *c = ": "; *c && at + 1 < sizeof error_msg; c++)
        error_msg[at++] = *c;
    for (const char *c = old; *c && at + 1 < sizeof error_msg; c++)
        error_msg[at++] = *c;
    error_msg[at] = '\0';
}

void dt__error_breadcrumb(const char *file, int line) {
    size_t n = strlen(error_msg);
    /* Keep only the path below src/ so messages stay short. */
    const char *s = strstr(file, "src/");
    if (s)
        file = s + 4;
    if (n + 1 < sizeof error_msg)
        snprintf(error_msg + n, sizeof error_msg - n, "\n    at %s:%d", file, line);
}

void dt__assert_fail(const char *expr, const char *file, int line, const char *func) {
    fprintf(stderr, "dtrain: assertion failed: %s\n    at %s:%d in %s()\n", expr, file, line, func);
    fflush(stderr);
    abort();
}
