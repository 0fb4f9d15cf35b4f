/*
 * hash.c — XXH3-64 checksums through Debian's libxxhash.
 */
#include "dtrain/core.h"

#include <xxhash.h>

uint64_t dt_hash64(const void *data, size_t len, uint64_t seed) {
    return XXH3_64bits_withSeed(data, len, seed);
}

struct dt_hasher {
    XXH3_state_t *state;
};

dt_status dt_hasher_create(dt_hasher **out, uint64_t seed) {
    dt_hasher *h = dt_calloc(1, sizeof *h);
    if (!h)
        return DT_ERR_NOMEM;
    h->state = XXH3_createState();
    if (!h->state) {
        dt_free(h);
        return dt_error_set(DT_ERR_NOMEM, "cannot allocate a hash state");
    }
    XXH3_64bits_reset_withSeed(h->state, seed);
    *out = h;
    return DT_OK;
}

void dt_hasher_update(dt_hasher *h, const void *data, size_t len) {
    XXH3_64bits_update(h->state, data, len);
}

uint64_t dt_hasher_final(const dt_hasher *h) { return XXH3_64bits_digest(h->state); }

void dt_hasher_destroy(dt_hasher *h) {
    if (!h)
        return;
    XXH3_freeState(h->state);
    dt_free(h);
}
