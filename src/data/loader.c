/*
 * loader.c — batches of (B, T+1)-token windows, shuffled per epoch and
 * shared out among ranks.
 *
 * The order is a pure function of (seed, epoch, step), computed identically
 * on every rank: the permutation of the W windows for epoch e comes from
 * dt_rng stream (rank 0, step e, DT_RNG_DATA) under `seed`, and global step
 * s takes permutation entries [s*world*B, (s+1)*world*B), rank r the
 * slice [r*B, (r+1)*B) of those. No state but (epoch, step) is needed to
 * resume, and N ranks of batch B together see exactly the batches of one
 * rank of batch N*B (see data.h).
 */
#include "dtrain/data.h"

#include <stdlib.h>

struct dt_loader {
    const dt_token_file *file; /* borrowed */
    const uint16_t *tokens;    /* the file's tokens, from `begin` */
    size_t windows;            /* W: windows of T+1 tokens with stride T */
    uint32_t *perm;            /* (W) this epoch's order of the windows */
    uint64_t steps_per_epoch;  /* floor(W / (world*B)) */
    uint64_t seed;
    int B, T, rank, world;
    dt_loader_state pos; /* the next batch to hand out */
};

/* Draw epoch e's permutation: Fisher-Yates over the identity. */
static void shuffle(dt_loader *l) {
    dt_rng r;
    dt_rng_init(&r, l->seed, dt_rng_stream_id(0, l->pos.epoch, DT_RNG_DATA));
    for (size_t i = 0; i < l->windows; i++)
        l->perm[i] = (uint32_t)i;
    for (size_t i = l->windows - 1; i > 0; i--) {
        uint32_t j = dt_rng_below(&r, (uint32_t)(i + 1));
        uint32_t t = l->perm[i];
        l->perm[i] = l->perm[j];
        l->perm[j] = t;
    }
}

/* dt_rng_stream_id holds the epoch in 36 bits. */
#define MAX_EPOCH ((UINT64_C(1) << 36) - 1)

dt_status dt_loader_create(dt_loader **out, const dt_token_file *f, size_t begin, size_t end, int B,
                           int T, uint64_t seed, int rank, int world) {
    *out = NULL;
    if (B < 1)
        return dt_error_set(DT_ERR_INVALID, "loader: batch size %d must be >= 1", B);
    if (T < 1)
        return dt_error_set(DT_ERR_INVALID, "loader: sequence length %d must be >= 1", T);
    if (world < 1)
        return dt_error_set(DT_ERR_INVALID, "loader: world size %d must be >= 1", world);
    if (rank < 0 || rank >= world)
        return dt_error_set(DT_ERR_INVALID, "loader: rank %d is outside [0, %d)", rank, world);
    size_t count = dt_token_file_count(f);
    if (begin >= end || end > count)
        return dt_error_set(DT_ERR_INVALID,
                            "loader: token range [%zu, %zu) is empty or outside %s (%zu tokens)",
                            begin, end, dt_token_file_path(f), count);
    size_t len = end - begin;
    if (len < (size_t)T + 1)
        return dt_error_set(DT_ERR_INVALID,
                            "loader: %s: %zu tokens are shorter than one window of T+1 = %d "
                            "tokens; use a shorter --seq or more data",
                            dt_token_file_path(f), len, T + 1);
    size_t windows = (len - 1) / (size_t)T;
    size_t global = (size_t)B * (size_t)world;
    if (windows > UINT32_MAX)
        return dt_error_set(DT_ERR_INVALID, "loader: %zu windows exceed 2^32; use a longer --seq",
                            windows);
    if (windows < global)
        return dt_error_set(DT_ERR_INVALID,
                            "loader: %s: %zu tokens make %zu windows of %d+1, fewer than one "
                            "global batch of %d ranks x %d = %zu; use a smaller --batch or "
                            "--seq or more data",
                            dt_token_file_path(f), len, windows, T, world, B, global);
    dt_loader *l = calloc(1, sizeof *l);
    uint32_t *perm = malloc(windows * sizeof *perm);
    if (!l || !perm) {
        free(l);
        free(perm);
        return dt_error_set(DT_ERR_NOMEM, "loader: cannot allocate %zu windows", windows);
    }
    *l = (dt_loader){.file = f,
                     .tokens = dt_token_file_tokens(f) + begin,
                     .windows = windows,
                     .perm = perm,
                     .steps_per_epoch = windows / global,
                     .seed = seed,
                     .B = B,
                     .T = T,
                     .rank = rank,
                     .world = world};
    shuffle(l);
    *out = l;
    return DT_OK;
}

void dt_loader_destroy(dt_loader *l) {
    if (!l)
        return;
    free(l->perm);
    free(l);
}

dt_status dt_loader_next(dt_loader *l, int32_t *inputs, int32_t *targets) {
    const int B = l->B, T = l->T;
    size_t row0 = (size_t)l->pos.step * (size_t)l->world * (size_t)B + (size_t)l->rank * B;
    for (int b = 0; b < B; b++) {
        const uint16_t *w = l->tokens + (size_t)l->perm[row0 + (size_t)b] * (size_t)T; /* (T+1) */
        int32_t *in = inputs + (size_t)b * T, *tg = targets + (size_t)b * T;           /* (T) */
        for (int t = 0; t < T; t++) {
            in[t] = w[t];
            tg[t] = w[t + 1];
        }
    }
    if (++l->pos.step == l->steps_per_epoch) {
        if (l->pos.epoch == MAX_EPOCH)
            return dt_error_set(DT_ERR_INVALID, "loader: epoch counter exhausted (%llu)",
                                (unsigned long long)MAX_EPOCH);
        l->pos.epoch++;
        l->pos.step = 0;
        shuffle(l);
    }
    return DT_OK;
}

dt_loader_state dt_loader_get_state(const dt_loader *l) { return l->pos; }

dt_status dt_loader_set_state(dt_loader *l, dt_loader_state s) {
    if (s.step >= l->steps_per_epoch)
        return dt_error_set(DT_ERR_INVALID,
                            "loader: saved step %llu is outside the %llu steps of an epoch (was "
                            "the batch size, sequence length, world size or data changed?)",
                            (unsigned long long)s.step, (unsigned long long)l->steps_per_epoch);
    if (s.epoch > MAX_EPOCH)
        return dt_error_set(DT_ERR_INVALID, "loader: saved epoch %llu exceeds %llu",
                            (unsigned long long)s.epoch, (unsigned long long)MAX_EPOCH);
    bool reshuffle = s.epoch != l->pos.epoch;
    l->pos = s;
    if (reshuffle)
        shuffle(l);
    return DT_OK;
}

size_t dt_loader_windows(const dt_loader *l) { return l->windows; }

void dt_loader_peek(const dt_loader *l, uint32_t *windows) {
    size_t row0 = (size_t)l->pos.step * (size_t)l->world * (size_t)l->B + (size_t)l->rank * l->B;
    for (int b = 0; b < l->B; b++)
        windows[b] = l->perm[row0 + (size_t)b];
}
uint64_t dt_loader_steps_per_epoch(const dt_loader *l) { return l->steps_per_epoch; }
