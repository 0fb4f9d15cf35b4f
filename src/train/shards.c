/*
 * shards.c — the model's tensors as checkpoints and the weights file see
 * them: the global tensor table, and the box of each tensor this rank's
 * flat buffer holds (dtrain/ckpt.h's shard maps).
 */
#include "train_internal.h"

#include <stdio.h>
#include <string.h>

void dt__shards_free(shards *s) {
    dt_free(s->tensors);
    dt_free(s->whole);
    dt_free(s->owned);
}

dt_status dt__shards_make(const trainer *t, shards *s) {
    memset(s, 0, sizeof *s);
    s->nt = dt_gpt_num_tensors(t->m);
    s->tensors = dt_calloc(s->nt, sizeof *s->tensors);
    s->whole = dt_calloc(s->nt, sizeof *s->whole);
    s->owned = dt_calloc(s->nt, sizeof *s->owned);
    if (!s->tensors || !s->whole || !s->owned) {
        dt__shards_free(s);
        return DT_ERR_NOMEM;
    }
    for (size_t i = 0; i < s->nt; i++) {
        dt_param_info pi;
        dt_gpt_tensor_info(t->m, i, &pi);
        dt_ckpt_tensor *g = &s->tensors[i];
        snprintf(g->name, sizeof g->name, "%s", pi.name);
        g->ndim = (uint32_t)pi.ndim;
        dt_ckpt_box *b = &s->whole[i];
        b->tensor = (uint32_t)i;
        b->offset = pi.offset;
        for (int d = 0; d < DT_CKPT_MAX_DIMS; d++) {
            g->shape[d] = pi.shape[d];
            b->begin[d] = pi.begin[d];
            b->extent[d] = pi.extent[d];
        }
        s->owned[i] = pi.owner;
    }
    return DT_OK;
}

dt_status dt__shards_boxes(const shards *s, const dt_range *r, size_t nr, bool only_owned,
                           dt_ckpt_box **out, size_t *n) {
    /* A tensor cut by k range boundaries is at most k + 1 pieces of at
     * most 5 boxes each. */
    *out = dt_calloc(5 * (s->nt + nr) + 1, sizeof **out);
    if (!*out)
        return DT_ERR_NOMEM;
    *n = 0;
    size_t start = 0; /* where range k begins in the concatenated buffer */
    for (size_t k = 0; k < nr; k++) {
        for (size_t i = 0; i < s->nt; i++) {
            if (only_owned && !s->owned[i])
                continue;
            size_t m = dt_ckpt_boxes_in_range(&s->whole[i], r[k].begin, r[k].end, *out + *n);
            for (size_t j = 0; j < m; j++)
                (*out)[*n + j].offset = (*out)[*n + j].offset - r[k].begin + start;
            *n += m;
        }
        start += r[k].end - r[k].begin;
    }
    return DT_OK;
}

dt_range *dt__owned_ranges(const dt_optimizer *o) {
    size_t n = dt_optimizer_num_owned(o);
    dt_range *r = dt_calloc(n + 1, sizeof *r);
    for (size_t i = 0; r && i < n; i++)
        r[i] = dt_optimizer_owned(o, i);
    return r;
}
