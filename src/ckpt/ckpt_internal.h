/*
 * ckpt_internal.h — what the container (container.c) shares with the
 * sharded checkpoint sets (shard.c).
 */
#ifndef DTRAIN_CKPT_INTERNAL_H
#define DTRAIN_CKPT_INTERNAL_H

#include "dtrain/ckpt.h"

/* One checkpoint manifest in a directory. */
typedef struct ckpt_file {
    int64_t step;
    char name[256]; /* "ckpt-NNNNNN.dtck" */
} ckpt_file;

/* The manifests in dir, newest first (caller frees *out, NULL when there
 * are none). DT_ERR_NOT_FOUND when the directory does not exist. */
dt_status dt__ckpt_list(const char *dir, ckpt_file **out, size_t *count);

#endif
