/*
 * optimizer.c — the optimizer object: AdamW or SGD with the state of one
 * owned range of the flat parameter buffer (see optim.h).
 *
 * Invariants:
 *   - state[k] holds the owned ranges one after another: element
 *     start[i] + j belongs to parameter owned[i].begin + j. Nothing else is
 *     kept per parameter.
 *   - update() walks the tensors that intersect [begin, end) and calls the
 *     range kernels (adamw.c) on each intersection with that tensor's decay,
 *     so any split of an owned range into calls gives the same bits.
 *   - count is the number of applied updates; AdamW's bias corrections use
 *     count + 1, the numbering PyTorch's `step` has.
 */
#include "optim_internal.h"

#include <inttypes.h>
#include <math.h>
#include <string.h>

const char *const dt_optim_names[DT_OPTIM_COUNT] = {"adamw", "sgd"};

struct dt_optimizer {
    dt_optim_config c;
    dt_optim_tensor *tensors; /* sorted by offset, clipped to the owned ranges */
    size_t ntensors;
    dt_range *owned; /* (nowned) sorted, disjoint */
    size_t *start;   /* (nowned + 1) where each range's state begins; start[nowned] = all */
    size_t nowned;
    size_t nstates;    /* AdamW 2, SGD 1 with momentum, else 0 */
    float *state[2];   /* (owned size) each */
    dt__offload *disk; /* the state in a file (offload_dir), or NULL */
    char dir[1024];    /* offload_dir's copy */
    int64_t count;     /* applied updates */
    int64_t step;      /* the step begun last */
    float lr;          /* its learning rate */
    bool frozen;       /* AdamW: beta2 = 1 for this step */
};

static const char *const state_names[DT_OPTIM_COUNT][2] = {
    [DT_OPTIM_ADAMW] = {"adamw.m", "adamw.v"},
    [DT_OPTIM_SGD] = {"sgd.momentum", NULL},
};

dt_optim_config dt_optim_config_default(void) {
    dt_adamw_config a = dt_adamw_config_default();
    return (dt_optim_config){.kind = DT_OPTIM_ADAMW,
                             .weight_decay = a.weight_decay,
                             .adamw = a,
                             .momentum = 0.0f,
                             .nesterov = false,
                             .freeze_v_from = -1};
}

#define bad(...) dt_error_set(DT_ERR_INVALID, __VA_ARGS__)

/* State buffers of one parameter each: AdamW's m and v, SGD's momentum. */
static size_t state_count(const dt_optim_config *c) {
    return c->kind == DT_OPTIM_ADAMW ? 2 : c->momentum > 0 ? 1 : 0;
}

size_t dt_optimizer_plan_bytes(const dt_optim_config *c, size_t owned_count) {
    return state_count(c) * owned_count * sizeof(float);
}

size_t dt_optimizer_plan_resident(const dt_optim_config *c, size_t owned_count) {
    size_t piece = owned_count < DT__OFFLOAD_PIECE ? owned_count : DT__OFFLOAD_PIECE;
    return dt_optimizer_plan_bytes(c, c->offload_dir ? piece : owned_count);
}

dt_status dt_optimizer_create(dt_optimizer **out, const dt_optim_config *c,
                              const dt_optim_tensor *tensors, size_t ntensors,
                              const dt_range *owned, size_t nowned) {
    *out = NULL;
    if ((unsigned)c->kind >= DT_OPTIM_COUNT)
        return bad("optimizer kind %d is not an optimizer", (int)c->kind);
    for (size_t i = 0; i < nowned; i++)
        if (owned[i].begin > owned[i].end || (i > 0 && owned[i].begin < owned[i - 1].end))
            return bad("optimizer: owned range %zu [%zu, %zu) is reversed or overlaps the one "
                       "before",
                       i, owned[i].begin, owned[i].end);
    if (!(c->weight_decay >= 0) || !isfinite(c->weight_decay))
        return bad("optimizer: weight decay %g must be finite and >= 0", (double)c->weight_decay);
    if (c->kind == DT_OPTIM_ADAMW &&
        !(c->adamw.beta1 >= 0 && c->adamw.beta1 < 1 && c->adamw.beta2 >= 0 && c->adamw.beta2 < 1 &&
          c->adamw.eps > 0))
        return bad("AdamW: betas (%g, %g) must be in [0, 1) and eps %g > 0", (double)c->adamw.beta1,
                   (double)c->adamw.beta2, (double)c->adamw.eps);
    if (c->kind == DT_OPTIM_SGD && !(c->momentum >= 0 && c->momentum < 1))
        return bad("SGD: momentum %g must be in [0, 1)", (double)c->momentum);
    for (size_t i = 1; i < ntensors; i++)
        if (tensors[i].offset < tensors[i - 1].offset + tensors[i - 1].count)
            return bad("optimizer: tensor %zu at %zu overlaps tensor %zu ending at %zu", i,
                       tensors[i].offset, i - 1, tensors[i - 1].offset + tensors[i - 1].count);
    dt_optimizer *o = dt_calloc(1, sizeof *o);
    if (!o)
        return DT_ERR_NOMEM;
    o->c = *c;
    o->step = -1;
    o->nowned = nowned;
    o->owned = dt_calloc(nowned + 1, sizeof *o->owned);
    o->start = dt_calloc(nowned + 1, sizeof *o->start);
    /* A tensor split by range boundaries becomes one entry per piece. */
    o->tensors = dt_calloc(ntensors + nowned + 1, sizeof *o->tensors);
    if (!o->owned || !o->start || !o->tensors)
        goto nomem;
    for (size_t k = 0; k < nowned; k++) {
        o->owned[k] = owned[k];
        o->start[k + 1] = o->start[k] + owned[k].end - owned[k].begin;
    }
    for (size_t i = 0, k = 0; i < ntensors; i++)
        for (; k < nowned; k++) {
            size_t lo = tensors[i].offset > owned[k].begin ? tensors[i].offset : owned[k].begin;
            size_t hi = tensors[i].offset + tensors[i].count;
            hi = hi < owned[k].end ? hi : owned[k].end;
            if (lo < hi)
                o->tensors[o->ntensors++] = (dt_optim_tensor){lo, hi - lo, tensors[i].decay};
            if (owned[k].end > tensors[i].offset + tensors[i].count)
                break; /* the next tensor may still lie in range k */
        }
    o->nstates = state_count(c);
    size_t n = o->start[nowned];
    if (c->offload_dir && o->nstates) {
        snprintf(o->dir, sizeof o->dir, "%s", c->offload_dir);
        o->c.offload_dir = o->dir;
        dt_status st = dt__offload_open(&o->disk, o->dir, o->nstates, n, o->state);
        if (st != DT_OK) {
            o->state[0] = o->state[1] = NULL; /* the file's, not ours to free */
            dt_optimizer_destroy(o);
            return st;
        }
        *out = o;
        return DT_OK;
    }
    for (size_t k = 0; k < o->nstates; k++) {
        o->state[k] = dt_alloc((n ? n : 1) * sizeof(float));
        if (!o->state[k])
            goto nomem;
        dt_mem_zero(o->state[k], n * sizeof(float)); /* resident from its first update */
    }
    *out = o;
    return DT_OK;
nomem:
    dt_optimizer_destroy(o);
    return dt_error_set(DT_ERR_NOMEM, "%s state for the owned parameters", dt_optim_names[c->kind]);
}

void dt_optimizer_destroy(dt_optimizer *o) {
    if (!o)
        return;
    if (o->disk)
        dt__offload_close(o->disk);
    else
        for (size_t k = 0; k < 2; k++)
            dt_free(o->state[k]);
    dt_free(o->tensors);
    dt_free(o->owned);
    dt_free(o->start);
    dt_free(o);
}

void dt_optimizer_begin(dt_optimizer *o, int64_t step, float lr) {
    o->step = step;
    o->lr = lr;
    o->frozen =
        o->c.kind == DT_OPTIM_ADAMW && o->c.freeze_v_from >= 0 && step >= o->c.freeze_v_from;
    /* The freeze: v becomes the bias-corrected second moment of the updates
     * so far, which the frozen steps (beta2 = 1, no correction) use as is.
     * A function of the step, so a resume on either side agrees. */
    if (o->frozen && step == o->c.freeze_v_from && o->count > 0) {
        double bc2 = 1.0 - pow((double)o->c.adamw.beta2, (double)o->count);
        dt_scale(o->state[1], o->start[o->nowned], (float)(1.0 / bc2));
    }
}

/* The first tensor whose range ends after `at` (tensors are sorted). */
static size_t first_tensor(const dt_optimizer *o, size_t at) {
    size_t lo = 0, hi = o->ntensors;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (o->tensors[mid].offset + o->tensors[mid].count <= at)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* The owned range that holds [begin, end). */
static size_t range_of(const dt_optimizer *o, size_t begin, size_t end) {
    size_t lo = 0, hi = o->nowned;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (o->owned[mid].end <= begin)
            lo = mid + 1;
        else
            hi = mid;
    }
    DT_ASSERT(lo < o->nowned && begin >= o->owned[lo].begin && end <= o->owned[lo].end);
    return lo;
}

static void update_in_memory(dt_optimizer *o, float *params, const float *grads, size_t begin,
                             size_t end, size_t k) {
    const size_t base = o->start[k] - o->owned[k].begin; /* state index of parameter p: p + base */
    dt_adamw_config frozen = o->c.adamw;
    frozen.beta2 = 1.0f;
    const dt_adamw_config *ac = o->frozen ? &frozen : &o->c.adamw;
    for (size_t i = first_tensor(o, begin); i < o->ntensors; i++) {
        const dt_optim_tensor *t = &o->tensors[i];
        if (t->offset >= end)
            break;
        size_t lo = t->offset > begin ? t->offset : begin;
        size_t hi = t->offset + t->count < end ? t->offset + t->count : end;
        if (lo >= hi)
            continue;
        float wd = t->decay ? o->c.weight_decay : 0.0f;
        size_t s = lo + base;
        if (o->c.kind == DT_OPTIM_ADAMW)
            dt_adamw_step(params + lo, grads + lo, o->state[0] + s, o->state[1] + s, hi - lo, o->lr,
                          ac, o->count + 1, wd);
        else
            dt_sgd_step(params + lo, grads + lo, o->nstates ? o->state[0] + s : NULL, hi - lo,
                        o->lr, o->c.momentum, o->c.nesterov, wd);
    }
}

void dt_optimizer_update(dt_optimizer *o, float *params, const float *grads, size_t begin,
                         size_t end) {
    DT_ASSERT(o->step >= 0);
    if (begin >= end)
        return;
    size_t k = range_of(o, begin, end);
    if (!o->disk) {
        update_in_memory(o, params, grads, begin, end, k);
        return;
    }
    /* Offloaded: in pieces, each reported, so the file streams through a
     * window (any split gives the same bits). */
    const size_t base = o->start[k] - o->owned[k].begin;
    for (size_t lo = begin; lo < end; lo += DT__OFFLOAD_PIECE) {
        size_t hi = end - lo > DT__OFFLOAD_PIECE ? lo + DT__OFFLOAD_PIECE : end;
        dt__offload_before(o->disk, lo + base, hi + base);
        update_in_memory(o, params, grads, lo, hi, k);
        dt__offload_updated(o->disk, lo + base, hi + base);
    }
}

void dt_optimizer_end(dt_optimizer *o, bool applied) {
    if (applied)
        o->count++;
    if (o->disk)
        dt__offload_step_end(o->disk);
}

void dt_optimizer_settle(dt_optimizer *o) {
    if (o->disk)
        dt__offload_settle(o->disk);
}

size_t dt_optimizer_offload_bytes(const dt_optimizer *o) {
    return o->disk ? dt__offload_file_bytes(o->disk) : 0;
}

const dt_optim_config *dt_optimizer_config(const dt_optimizer *o) { return &o->c; }
size_t dt_optimizer_num_owned(const dt_optimizer *o) { return o->nowned; }
size_t dt_optimizer_owned_count(const dt_optimizer *o) { return o->start[o->nowned]; }

dt_range dt_optimizer_owned(const dt_optimizer *o, size_t i) {
    DT_ASSERT(i < o->nowned);
    return o->owned[i];
}
int64_t dt_optimizer_count(const dt_optimizer *o) { return o->count; }

dt_status dt_optimizer_set_count(dt_optimizer *o, int64_t count) {
    if (count < 0)
        return bad("optimizer: update count %" PRId64 " must be >= 0", count);
    o->count = count;
    return DT_OK;
}

size_t dt_optimizer_state_bytes(const dt_optimizer *o) {
    return o->nstates * o->start[o->nowned] * sizeof(float);
}

size_t dt_optimizer_num_states(const dt_optimizer *o) { return o->nstates; }

float *dt_optimizer_state(dt_optimizer *o, size_t i, const char **name) {
    DT_ASSERT(i < o->nstates);
    if (name)
        *name = state_names[o->c.kind][i];
    return o->state[i];
}
