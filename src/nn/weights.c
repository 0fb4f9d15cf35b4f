/*
 * weights.c — the plain weights file: configuration, token byte table and
 * parameters, with a trailing XXH3-64 checksum (layout in nn.h).
 *
 * Every field read from the file is validated before it sizes an
 * allocation; a short or corrupt file gives DT_ERR_CORRUPT naming the file
 * and what was wrong. The full training checkpoint is a separate format.
 */
#include "dtrain/nn.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct wfile_header {
    uint32_t magic, version;
    int32_t layers, dim, heads, max_seq, vocab;
    uint32_t vocab_bytes_len;
} wfile_header;

dt_status dt_gpt_save_weights(const dt_gpt *m, const char *path, const uint8_t *vocab_bytes,
                              int vocab_bytes_len) {
    const dt_gpt_config *c = dt_gpt_get_config(m);
    if (vocab_bytes_len < 0 || vocab_bytes_len > c->vocab || vocab_bytes_len > 256)
        return dt_error_set(DT_ERR_INVALID,
                            "weights file %s: vocabulary table has %d entries, must be at most "
                            "the model's vocab %d and 256",
                            path, vocab_bytes_len, c->vocab);
    wfile_header h = {DT_GPT_WEIGHTS_MAGIC,
                      DT_GPT_WEIGHTS_VERSION,
                      c->layers,
                      c->dim,
                      c->heads,
                      c->max_seq,
                      c->vocab,
                      (uint32_t)vocab_bytes_len};
    uint64_t n = dt_gpt_num_params(m);
    const float *params = dt_gpt_params((dt_gpt *)m);
    dt_hasher *hs;
    DT_CHECK(dt_hasher_create(&hs, 0));
    dt_hasher_update(hs, &h, sizeof h);
    dt_hasher_update(hs, vocab_bytes, (size_t)vocab_bytes_len);
    dt_hasher_update(hs, &n, sizeof n);
    dt_hasher_update(hs, params, n * sizeof(float));
    uint64_t sum = dt_hasher_final(hs);
    dt_hasher_destroy(hs);

    const dt_file_part parts[] = {
        {&h, sizeof h},     {vocab_bytes, (size_t)vocab_bytes_len},
        {&n, sizeof n},     {params, n * sizeof(float)},
        {&sum, sizeof sum},
    };
    dt_status st = dt_file_write_atomic(path, parts, (int)(sizeof parts / sizeof parts[0]));
    if (st != DT_OK)
        dt_error_prefix("weights file");
    return st;
}

dt_status dt_gpt_load_weights(dt_gpt **out, const char *path, int max_batch, int max_seq,
                              uint8_t vocab_bytes[256], int *vocab_bytes_len) {
    *out = NULL;
    dt_status st = DT_OK;
    dt_gpt *m = NULL;
    dt_hasher *hs = NULL;
    FILE *f;
    DT_CHECK(dt_file_open_read(path, "weights file", &f));
    wfile_header h;
    if (fread(&h, sizeof h, 1, f) != 1) {
        st = dt_error_set(DT_ERR_CORRUPT, "weights file %s: truncated header", path);
        goto fail;
    }
    if (h.magic != DT_GPT_WEIGHTS_MAGIC) {
        st = dt_error_set(DT_ERR_CORRUPT, "%s is not a dtrain weights file (magic 0x%08x)", path,
                          h.magic);
        goto fail;
    }
    if (h.version != DT_GPT_WEIGHTS_VERSION) {
        st = dt_error_set(DT_ERR_UNSUPPORTED, "weights file %s has version %u, this build reads %u",
                          path, h.version, DT_GPT_WEIGHTS_VERSION);
        goto fail;
    }
    dt_gpt_config cfg = {h.layers, h.dim, h.heads, h.max_seq, h.vocab};
    if (dt_gpt_config_validate(&cfg) != DT_OK) {
        dt_error_prefix("weights file %s: ", path);
        st = DT_ERR_CORRUPT;
        goto fail;
    }
    if (h.vocab_bytes_len > (uint32_t)h.vocab || h.vocab_bytes_len > 256) {
        st = dt_error_set(DT_ERR_CORRUPT,
                          "weights file %s: vocabulary table of %u entries for vocab %d", path,
                          h.vocab_bytes_len, h.vocab);
        goto fail;
    }
    uint8_t vb[256];
    uint64_t n;
    if (fread(vb, 1, h.vocab_bytes_len, f) != h.vocab_bytes_len || fread(&n, sizeof n, 1, f) != 1) {
        st = dt_error_set(DT_ERR_CORRUPT, "weights file %s: truncated vocabulary", path);
        goto fail;
    }
    if (n != dt_gpt_config_num_params(&cfg)) {
        st = dt_error_set(DT_ERR_CORRUPT,
                          "weights file %s: %llu parameters, the configuration needs %zu", path,
                          (unsigned long long)n, dt_gpt_config_num_params(&cfg));
        goto fail;
    }
    if (max_seq > cfg.max_seq)
        max_seq = cfg.max_seq;
    DT_CHECK_GOTO(dt_gpt_create(&m, &cfg, max_batch, max_seq), st, fail);
    uint64_t sum;
    if (fread(dt_gpt_params(m), sizeof(float), n, f) != n || fread(&sum, sizeof sum, 1, f) != 1) {
        st = dt_error_set(DT_ERR_CORRUPT, "weights file %s: truncated parameters", path);
        goto fail;
    }
    DT_CHECK_GOTO(dt_hasher_create(&hs, 0), st, fail);
    dt_hasher_update(hs, &h, sizeof h);
    dt_hasher_update(hs, vb, h.vocab_bytes_len);
    dt_hasher_update(hs, &n, sizeof n);
    dt_hasher_update(hs, dt_gpt_params(m), n * sizeof(float));
    if (dt_hasher_final(hs) != sum) {
        st =
            dt_error_set(DT_ERR_CORRUPT, "weights file %s: checksum mismatch (file damaged)", path);
        goto fail;
    }
    DT_CHECK_GOTO(dt_file_expect_end(f, "weights file", path), st, fail);
    dt_hasher_destroy(hs);
    fclose(f);
    if (vocab_bytes)
        memcpy(vocab_bytes, vb, h.vocab_bytes_len);
    if (vocab_bytes_len)
        *vocab_bytes_len = (int)h.vocab_bytes_len;
    *out = m;
    return DT_OK;
fail:
    dt_hasher_destroy(hs);
    dt_gpt_destroy(m);
    fclose(f);
    return st;
}
