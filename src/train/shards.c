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

dt_status dt__shards_boxes(const shards *s, dt_range r, bool only_owned, dt_ckpt_box **out,
                           size_t *n) {
    *out = dt_calloc(5 * s->nt + 1, sizeof **out);
    if (!*out)
        return DT_ERR_NOMEM;
    *n = 0;
    for (size_t i = 0; i < s->nt; i++) {
        if (only_owned && !s->owned[i])
            continue;
        size_t k = dt_ckpt_boxes_in_range(&s->whole[i], r.begin, r.end, *out + *n);
        for (size_t j = 0; j < k; j++)
            (*out)[*n + j].offset -= r.begin;
        *n += k;
    }
    return DT_OK;
}
