/*
 * auto.c — the adaptive choice of a codec per bucket (--compress auto):
 * the candidate list and the rule that picks among them.
 *
 * The rule compresses only as much as hiding the communication needs
 * (the ratio r_t of the seeds: high when the link is the bottleneck, low
 * when computation is). Buckets are queued in launch order on one worker,
 * so bucket i finishes at f_i = max(launch_i, f_{i-1}) + cost_i; the step
 * is not delayed while the last f stays within the backward pass (`end`).
 * For each bucket in order the most accurate candidate is taken whose
 * finish still lets every later bucket finish by `end` with its fastest
 * candidate; when even the fastest everywhere cannot, each bucket takes
 * its fastest (the least exposed time). At high bandwidth the plain
 * allreduce is both the most accurate and the fastest (a codec costs
 * CPU), so nothing is compressed; on a slow link the late buckets, which
 * have no backward left to hide behind, are compressed hardest.
 *
 * Everything here is a pure function of its inputs: ranks that feed it
 * the same (agreed) numbers choose the same codecs.
 */
#include "internal.h"

#include <stdio.h>
#include <string.h>

static const char auto_syntax[] = "auto or auto:SPEC,SPEC,... (e.g. auto:none,fp16,int8,topk:0.01)";

/* Bytes per value of a candidate, for ordering (a 1024 x 1024 matrix). */
static double bytes_per_value(const dt_codec_spec *s) {
    const size_t side = 1024, n = side * side;
    size_t bytes = 0;
    if (dt_codec_encoded_bytes(s, n, side, side, 0, &bytes) != DT_OK)
        return 0;
    return (double)bytes / (double)n;
}

dt_status dt_codec_auto_parse(const char *knob, const char *text, dt_codec_auto *out) {
    memset(out, 0, sizeof *out);
    if (!text || strncmp(text, "auto", 4) != 0 || (text[4] != '\0' && text[4] != ':'))
        return dt_error_set(DT_ERR_INVALID, "%s: \"%s\" is not %s", knob, text ? text : "(null)",
                            auto_syntax);
    if (text[4] == '\0') {
        static const dt_codec_kind def[] = {DT_CODEC_NONE, DT_CODEC_FP16, DT_CODEC_INT8};
        for (size_t i = 0; i < sizeof def / sizeof def[0]; i++)
            out->cand[out->n++] = (dt_codec_spec){.kind = def[i]};
        return DT_OK;
    }
    const char *p = text + 5;
    while (*p) {
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        char one[64];
        if (len == 0 || len >= sizeof one)
            return dt_error_set(DT_ERR_INVALID,
                                "%s: \"%s\": an empty or overlong entry (expected %s)", knob, text,
                                auto_syntax);
        if (out->n == DT_CODEC_AUTO_MAX)
            return dt_error_set(DT_ERR_INVALID, "%s: \"%s\": at most %d candidates", knob, text,
                                DT_CODEC_AUTO_MAX);
        memcpy(one, p, len);
        one[len] = '\0';
        dt_codec_spec s;
        DT_CHECK(dt_codec_parse(knob, one, &s));
        char a[64], b[64];
        for (int i = 0; i < out->n; i++)
            if (strcmp(dt_codec_format(&out->cand[i], a, sizeof a),
                       dt_codec_format(&s, b, sizeof b)) == 0)
                return dt_error_set(DT_ERR_INVALID, "%s: \"%s\": %s is listed twice", knob, text,
                                    a);
        out->cand[out->n++] = s;
        p += len + (comma ? 1 : 0);
        if (comma && !*p)
            return dt_error_set(DT_ERR_INVALID, "%s: \"%s\": ends with a comma", knob, text);
    }
    if (out->n < 2)
        return dt_error_set(DT_ERR_INVALID, "%s: \"%s\": auto needs at least two candidates", knob,
                            text);
    /* Most accurate first: more bytes per value, then the order given. */
    for (int i = 1; i < out->n; i++)
        for (int j = i;
             j > 0 && bytes_per_value(&out->cand[j]) > bytes_per_value(&out->cand[j - 1]); j--) {
            dt_codec_spec t = out->cand[j];
            out->cand[j] = out->cand[j - 1];
            out->cand[j - 1] = t;
        }
    return DT_OK;
}

char *dt_codec_auto_format(const dt_codec_auto *a, char *buf, size_t len) {
    size_t off = (size_t)snprintf(buf, len, "auto:");
    for (int i = 0; i < a->n && off < len; i++) {
        char one[64];
        off += (size_t)snprintf(buf + off, len - off, "%s%s", i ? "," : "",
                                dt_codec_format(&a->cand[i], one, sizeof one));
    }
    return buf;
}

/* When the buckets from `from` on finish if each takes its fastest
 * candidate, the worker being free at `free_at`. */
static double finish_fastest(const dt_auto_bucket *b, size_t nb, int ncand, size_t from,
                             double free_at) {
    for (size_t j = from; j < nb; j++) {
        double best = b[j].cost[0];
        for (int c = 1; c < ncand; c++)
            best = b[j].cost[c] < best ? b[j].cost[c] : best;
        free_at = (b[j].launch > free_at ? b[j].launch : free_at) + best;
    }
    return free_at;
}

void dt_codec_auto_choose(const dt_auto_bucket *b, size_t nb, int ncand, double end, double slack,
                          int *choice) {
    DT_ASSERT(ncand >= 1 && ncand <= DT_CODEC_AUTO_MAX);
    double limit = end * (1 + slack), free_at = 0;
    for (size_t i = 0; i < nb; i++) {
        double start = b[i].launch > free_at ? b[i].launch : free_at;
        int pick = -1, fastest = 0;
        for (int c = 0; c < ncand; c++) {
            if (b[i].cost[c] < b[i].cost[fastest])
                fastest = c;
            if (pick < 0 && finish_fastest(b, nb, ncand, i + 1, start + b[i].cost[c]) <= limit)
                pick = c;
        }
        choice[i] = pick >= 0 ? pick : fastest;
        free_at = start + b[i].cost[choice[i]];
    }
}
