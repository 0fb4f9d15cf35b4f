/*
 * dtrain/ckpt.h — the checkpoint container: named, typed sections in one
 * checksummed file, written atomically and rotated.
 *
 * Overview
 * --------
 * A checkpoint is one file holding named, typed sections (the
 * model parameters, the optimizer's m and v, the step, the schedule, the RNG
 * and data-loader positions, the resolved config as JSON text, ...). Its
 * layout, all little-endian:
 *
 *     header   64 bytes   magic "DTRNCKPT", version, section count,
 *                         total file size, offset of the section table
 *     table    64 bytes per section: name (<= 31 chars), element type,
 *                         element count, byte offset, byte size
 *     data     each section starts on a 64-byte boundary
 *     trailer  16 bytes   XXH3-64 of every byte before it, magic "DTCKEND\0"
 *
 * Every size read from a file is checked against the real file size before
 * it is used, so a corrupt or hostile file cannot make the reader allocate or
 * index out of bounds. A file is written atomically: a temporary file in the
 * same directory, write, fsync, rename over the final name, fsync of the
 * directory. Only then does the `latest` pointer move, and only after that
 * are checkpoints beyond the newest K removed. At every instant the directory
 * therefore holds at least one complete checkpoint once one was written, and
 * dt_ckpt_open_latest() picks the newest one that validates, falling back to
 * an older one when the newest is damaged.
 *
 * Example
 * -------
 *     dt_ckpt_section s[] = {
 *         {"params", DT_CKPT_F32, params, n},
 *         {"step", DT_CKPT_I64, &step, 1},
 *     };
 *     DT_CHECK(dt_ckpt_save("ckpts", step, s, 2, 3, NULL, 0));
 *     ...
 *     dt_ckpt *ck;
 *     DT_CHECK(dt_ckpt_open_latest(&ck, "ckpts"));
 *     DT_CHECK(dt_ckpt_read(ck, "params", DT_CKPT_F32, params, n));
 *     dt_ckpt_close(ck);
 */
#ifndef DTRAIN_CKPT_H
#define DTRAIN_CKPT_H

#include "dtrain/core.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------ */
/* Checkpoints                                                              */
/* ------------------------------------------------------------------------ */

#define DT_CKPT_VERSION      1
#define DT_CKPT_NAME_MAX     32 /* section name incl. the terminating NUL */
#define DT_CKPT_MAX_SECTIONS 4096

/* Element type of a section; values are stored in the file, never reorder. */
typedef enum dt_ckpt_type {
    DT_CKPT_BYTES, /* opaque bytes */
    DT_CKPT_TEXT,  /* UTF-8 text (JSON config), no terminating NUL stored */
    DT_CKPT_F32,
    DT_CKPT_F64,
    DT_CKPT_I32,
    DT_CKPT_I64,
    DT_CKPT_U64,
    DT_CKPT_TYPE_COUNT
} dt_ckpt_type;

/* "f32", "text", ...; "?" for an out-of-range value. */
const char *dt_ckpt_type_name(dt_ckpt_type t);
/* Bytes per element (1 for BYTES and TEXT); 0 for an out-of-range value. */
size_t dt_ckpt_type_size(dt_ckpt_type t);

/* One section to write. `data` is borrowed for the duration of the call. */
typedef struct dt_ckpt_section {
    const char *name;  /* unique in the file, 1..31 bytes */
    dt_ckpt_type type; /* element type */
    const void *data;  /* count elements of type */
    size_t count;      /* number of elements */
} dt_ckpt_section;

/* Write `path` atomically (temp file in the same directory, fsync, rename,
 * fsync of the directory). On failure the temporary file is removed and any
 * earlier file named `path` is untouched; a full disk gives
 * DT_ERR_NOSPACE, other write errors DT_ERR_IO. */
dt_status dt_ckpt_write_file(const char *path, const dt_ckpt_section *sections, size_t count);

/* Save a checkpoint of `step` as DIR/ckpt-NNNNNN.dtck (the directory is
 * created if missing), then point DIR/latest at it, then remove all but the
 * newest `keep` (>= 1) checkpoints and stale temporary files of writers that
 * died. The file name written goes to path_out (if not NULL). */
dt_status dt_ckpt_save(const char *dir, int64_t step, const dt_ckpt_section *sections, size_t count,
                       int keep, char *path_out, size_t path_len);

/* The checkpoint file name for `step` inside `dir`. */
void dt_ckpt_path(char *out, size_t len, const char *dir, int64_t step);

/* An open, validated checkpoint (memory-mapped, read only). */
typedef struct dt_ckpt dt_ckpt;

/* What one section of an open checkpoint holds. */
typedef struct dt_ckpt_info {
    const char *name;  /* points into the checkpoint, valid until close */
    dt_ckpt_type type; /* element type */
    size_t count;      /* elements */
    size_t bytes;      /* count * element size */
    uint64_t offset;   /* byte offset in the file */
    const void *data;  /* the bytes, valid until close */
} dt_ckpt_info;

/* Open and fully validate a checkpoint: magic, version, the section table
 * against the file size, and the checksum. Any problem gives
 * DT_ERR_CORRUPT (or DT_ERR_IO / DT_ERR_NOT_FOUND) with a message naming the
 * file and the problem. */
dt_status dt_ckpt_open(dt_ckpt **out, const char *path);

/* Like dt_ckpt_open but without computing the checksum (structure is still
 * validated, so sections are safe to read). For `dtrain ckpt info`, which
 * shows a damaged file's contents; call dt_ckpt_verify() to check it. */
dt_status dt_ckpt_open_unverified(dt_ckpt **out, const char *path);

/* Recompute the checksum: DT_OK or DT_ERR_CORRUPT. *stored / *computed
 * (may be NULL) receive the two values. */
dt_status dt_ckpt_verify(const dt_ckpt *ck, uint64_t *stored, uint64_t *computed);

/* Open the newest checkpoint in `dir` that validates, trying older ones when
 * the newest is damaged (each rejection is logged as a warning). Returns
 * DT_ERR_NOT_FOUND if the directory holds no checkpoint at all and
 * DT_ERR_CORRUPT if it holds only damaged ones. */
dt_status dt_ckpt_open_latest(dt_ckpt **out, const char *dir);

void dt_ckpt_close(dt_ckpt *ck);

const char *dt_ckpt_file(const dt_ckpt *ck);
uint32_t dt_ckpt_version(const dt_ckpt *ck);
uint64_t dt_ckpt_file_size(const dt_ckpt *ck);
size_t dt_ckpt_num_sections(const dt_ckpt *ck);
void dt_ckpt_section_at(const dt_ckpt *ck, size_t i, dt_ckpt_info *out);
/* DT_ERR_NOT_FOUND (message names file and section) if absent. */
dt_status dt_ckpt_find(const dt_ckpt *ck, const char *name, dt_ckpt_info *out);

/* Copy section `name` into dst, which holds `count` elements of `type`.
 * A missing section, another type or another count is DT_ERR_MISMATCH with
 * a message naming the file, the section and both shapes. */
dt_status dt_ckpt_read(const dt_ckpt *ck, const char *name, dt_ckpt_type type, void *dst,
                       size_t count);

#ifdef __cplusplus
}
#endif
#endif /* DTRAIN_CKPT_H */
