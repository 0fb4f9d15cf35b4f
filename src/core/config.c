/*
 * config.c — parsing of configuration values from flags and DT_* variables.
 *
 * Every parser names the knob, quotes the offending value and states the
 * accepted range, because the person reading the message is usually looking
 * at a job script, not at this code.
 */
#include "dtrain/core.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static bool is_blank(const char *s) { return !s || !*s; }

dt_status dt_config_parse_size(const char *knob, const char *text, size_t min, size_t max,
                               size_t *out) {
    char lo[32], hi[32];
    if (is_blank(text))
        return dt_error_set(DT_ERR_INVALID, "%s: empty value; expected a size such as 64K", knob);
    const char *p = text;
    if (!isdigit((unsigned char)*p))
        goto not_a_size;
    errno = 0;
    char *end;
    unsigned long long v = strtoull(p, &end, 10);
    if (errno == ERANGE)
        goto too_large;
    unsigned shift = 0;
    switch (toupper((unsigned char)*end)) {
    case '\0': break;
    case 'K': shift = 10; break;
    case 'M': shift = 20; break;
    case 'G': shift = 30; break;
    case 'T': shift = 40; break;
    case 'B':
        if (end[1] == '\0') {
            end++;
            break;
        }
        goto not_a_size;
    default: goto not_a_size;
    }
    if (shift) {
        end++;
        /* Accept K, KB, KiB (and lower case); all mean 1024. */
        if ((end[0] == 'i' || end[0] == 'I') && (end[1] == 'b' || end[1] == 'B'))
            end += 2;
        else if (end[0] == 'b' || end[0] == 'B')
            end++;
    }
    if (*end != '\0')
        goto not_a_size;
    if (shift && v > (SIZE_MAX >> shift))
        goto too_large;
    v <<= shift;
    if (v > SIZE_MAX)
        goto too_large;
    if ((size_t)v < min || (size_t)v > max)
        goto out_of_range;
    *out = (size_t)v;
    return DT_OK;
not_a_size:
    return dt_error_set(DT_ERR_INVALID, "%s: \"%s\" is not a size (examples: 4096, 64K, 25M, 1G)",
                        knob, text);
too_large:
out_of_range:
    return dt_error_set(DT_ERR_INVALID, "%s: %s is out of range [%s, %s]", knob, text,
                        dt_format_bytes((double)min, lo, sizeof lo),
                        dt_format_bytes((double)max, hi, sizeof hi));
}

dt_status dt_config_parse_bool(const char *knob, const char *text, bool *out) {
    static const char *const yes[] = {"1", "true", "yes", "on"};
    static const char *const no[] = {"0", "false", "no", "off"};
    if (!is_blank(text)) {
        for (size_t i = 0; i < 4; i++) {
            if (strcasecmp(text, yes[i]) == 0) {
                *out = true;
                return DT_OK;
            }
            if (strcasecmp(text, no[i]) == 0) {
                *out = false;
                return DT_OK;
            }
        }
    }
    return dt_error_set(DT_ERR_INVALID,
                        "%s: \"%s\" is not a boolean (accepted: 1/0, true/false, yes/no, on/off)",
                        knob, text ? text : "");
}

dt_status dt_config_parse_int(const char *knob, const char *text, int64_t min, int64_t max,
                              int64_t *out) {
    if (is_blank(text))
        return dt_error_set(DT_ERR_INVALID,
                            "%s: empty value; expected an integer in [%" PRId64 ", %" PRId64 "]",
                            knob, min, max);
    errno = 0;
    char *end;
    long long v = strtoll(text, &end, 0);
    if (*end != '\0' || end == text || isspace((unsigned char)text[0]))
        return dt_error_set(DT_ERR_INVALID,
                            "%s: \"%s\" is not an integer (accepted: [%" PRId64 ", %" PRId64 "])",
                            knob, text, min, max);
    if (errno == ERANGE || v < min || v > max)
        return dt_error_set(DT_ERR_INVALID, "%s: %s is out of range [%" PRId64 ", %" PRId64 "]",
                            knob, text, min, max);
    *out = v;
    return DT_OK;
}

dt_status dt_config_parse_double(const char *knob, const char *text, double min, double max,
                                 double *out) {
    if (is_blank(text))
        return dt_error_set(DT_ERR_INVALID, "%s: empty value; expected a number in [%g, %g]", knob,
                            min, max);
    errno = 0;
    char *end;
    double v = strtod(text, &end);
    if (*end != '\0' || end == text || isspace((unsigned char)text[0]) || !isfinite(v))
        return dt_error_set(DT_ERR_INVALID,
                            "%s: \"%s\" is not a finite number (accepted: [%g, %g])", knob, text,
                            min, max);
    if (v < min || v > max)
        return dt_error_set(DT_ERR_INVALID, "%s: %s is out of range [%g, %g]", knob, text, min,
                            max);
    *out = v;
    return DT_OK;
}

dt_status dt_config_parse_enum(const char *knob, const char *text, const char *const *names,
                               int count, int *out) {
    for (int i = 0; text && i < count; i++) {
        if (strcmp(text, names[i]) == 0) {
            *out = i;
            return DT_OK;
        }
    }
    char list[512];
    size_t n = 0;
    list[0] = '\0';
    for (int i = 0; i < count && n < sizeof list; i++)
        n += (size_t)snprintf(list + n, sizeof list - n, "%s%s", i ? "|" : "", names[i]);
    return dt_error_set(DT_ERR_INVALID, "%s: \"%s\" is not one of %s", knob, text ? text : "",
                        list);
}

dt_status dt_config_env_size(const char *var, size_t def, size_t min, size_t max, size_t *out) {
    const char *v = getenv(var);
    if (is_blank(v)) {
        *out = def;
        return DT_OK;
    }
    return dt_config_parse_size(var, v, min, max, out);
}

dt_status dt_config_env_bool(const char *var, bool def, bool *out) {
    const char *v = getenv(var);
    if (is_blank(v)) {
        *out = def;
        return DT_OK;
    }
    return dt_config_parse_bool(var, v, out);
}

dt_status dt_config_env_int(const char *var, int64_t def, int64_t min, int64_t max, int64_t *out) {
    const char *v = getenv(var);
    if (is_blank(v)) {
        *out = def;
        return DT_OK;
    }
    return dt_config_parse_int(var, v, min, max, out);
}

dt_status dt_config_env_double(const char *var, double def, double min, double max, double *out) {
    const char *v = getenv(var);
    if (is_blank(v)) {
        *out = def;
        return DT_OK;
    }
    return dt_config_parse_double(var, v, min, max, out);
}

dt_status dt_config_env_enum(const char *var, int def, const char *const *names, int count,
                             int *out) {
    const char *v = getenv(var);
    if (is_blank(v)) {
        *out = def;
        return DT_OK;
    }
    return dt_config_parse_enum(var, v, names, count, out);
}

char *dt_format_bytes(double bytes, char *buf, size_t len) {
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    int u = 0;
    while (bytes >= 1024.0 && u < 6) {
        bytes /= 1024.0;
        u++;
    }
    if (u == 0)
        snprintf(buf, len, "%.0f B", bytes);
    else
        snprintf(buf, len, "%.*f %s", bytes < 10 ? 2 : bytes < 100 ? 1 : 0, bytes, units[u]);
    return buf;
}
