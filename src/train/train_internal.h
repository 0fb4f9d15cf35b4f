/*
 * train_internal.h — helpers shared by the files of the train layer only.
 */
#ifndef DTRAIN_TRAIN_INTERNAL_H
#define DTRAIN_TRAIN_INTERNAL_H

#include "dtrain/train.h"

/* mkdir -p: create `dir` and its parents; an existing directory is fine. */
dt_status dt__mkdir_p(const char *dir);

/* Write `len` bytes to `path` atomically (temp file in the same directory,
 * fsync, rename, fsync of the directory). */
dt_status dt__write_file_atomic(const char *path, const void *data, size_t len);

#endif
