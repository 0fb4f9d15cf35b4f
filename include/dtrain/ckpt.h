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

#include <stdbool.h>
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

/* What a written file is: its size and the checksum in its trailer. The
 * record a manifest keeps of every shard file (section "files"). */
typedef struct dt_ckpt_file_rec {
    int64_t rank;      /* the world rank that wrote it */
    uint64_t size;     /* bytes */
    uint64_t checksum; /* XXH3-64 stored in its trailer */
    uint64_t reserved; /* zero */
} dt_ckpt_file_rec;

#define DT_CKPT_FILES_SECTION "files"

/* Write `path` atomically (temp file in the same directory, fsync, rename,
 * fsync of the directory). On failure the temporary file is removed and any
 * earlier file named `path` is untouched; a full disk gives
 * DT_ERR_NOSPACE, other write errors DT_ERR_IO. */
dt_status dt_ckpt_write_file(const char *path, const dt_ckpt_section *sections, size_t count);

/* dt_ckpt_write_file that also reports the size and checksum written
 * (written->rank is left alone). */
dt_status dt_ckpt_write_file_sum(const char *path, const dt_ckpt_section *sections, size_t n,
                                 dt_ckpt_file_rec *written);

/* Save a checkpoint of `step` as DIR/ckpt-NNNNNN.dtck (the directory is
 * created if missing), then point DIR/latest at it, then remove all but the
 * newest `keep` (>= 1) checkpoints and stale temporary files of writers that
 * died. The file name written goes to path_out (if not NULL). */
dt_status dt_ckpt_save(const char *dir, int64_t step, const dt_ckpt_section *sections, size_t count,
                       int keep, char *path_out, size_t path_len);

/* dt_ckpt_save for a checkpoint of several files: the shard files
 * (DIR/ckpt-NNNNNN.rRRRRR.dtck, written before by their ranks) must all be
 * visible with the sizes in `files`; then the manifest DIR/ckpt-NNNNNN.dtck
 * is written with `sections` plus a "files" section listing them, and its
 * appearance commits the checkpoint. Rotation removes the shard files of
 * removed checkpoints and any shard file without a manifest. */
dt_status dt_ckpt_save_set(const char *dir, int64_t step, const dt_ckpt_section *sections,
                           size_t count, const dt_ckpt_file_rec *files, size_t nfiles, int keep,
                           char *path_out, size_t path_len);

/* The checkpoint file name for `step` inside `dir`. */
void dt_ckpt_path(char *out, size_t len, const char *dir, int64_t step);
/* The name of rank `rank`'s shard file of that checkpoint. */
void dt_ckpt_shard_path(char *out, size_t len, const char *dir, int64_t step, int rank);

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
/* The checksum recorded in the trailer (not recomputed). */
uint64_t dt_ckpt_stored_checksum(const dt_ckpt *ck);
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

/* ------------------------------------------------------------------------ */
/* Sharded state: global tensors, shard maps, checkpoints of many files     */
/* ------------------------------------------------------------------------ */
/*
 * Layout independence. Parameters and optimizer state are saved as named
 * GLOBAL tensors (the model's tensors as one process would hold them, with
 * their global shapes), and every writer says which boxes of them its flat
 * buffer holds: the shard map. A reader in any layout (another tensor-
 * parallel degree, another data-parallel sharding) asks for the boxes of
 * its own flat buffer and receives them from whichever files hold them.
 *
 * A sharded state NAME in a file is two sections: NAME, the writer's flat
 * f32 buffer, and NAME.map, dt_ckpt_box records placing boxes of global
 * tensors in it (row-major, contiguous, at `offset`). Parts of the buffer
 * no box names (padding, a replica's copy another rank writes) are not
 * part of the state. The manifest's "tensors" section (dt_ckpt_tensor
 * records) names the global tensors the boxes refer to.
 *
 * A checkpoint of step S is its manifest DIR/ckpt-S.dtck (world rank 0: the
 * training state, the tensors, the layout it was written from, the list of
 * shard files and rank 0's own shards) plus one shard file per other rank
 * that had something to write (DIR/ckpt-S.rRRRRR.dtck). Shard files are
 * written first; the manifest last, so its presence commits the checkpoint.
 *
 *     // writer (each rank): its buffer and the boxes it owns
 *     dt_ckpt_section s[] = {{"params", DT_CKPT_F32, buf, n},
 *                            {"params.map", DT_CKPT_BYTES, boxes, nb * sizeof *boxes}};
 *     // reader (any layout): the boxes of its own buffer
 *     DT_CHECK(dt_ckpt_set_open_latest(&set, dir));
 *     DT_CHECK(dt_ckpt_set_read_boxes(set, "params", tensors, nt, want, nw, buf));
 */

#define DT_CKPT_TENSOR_NAME_MAX 48 /* incl. the NUL */
#define DT_CKPT_MAX_DIMS        3
#define DT_CKPT_MAP_SUFFIX      ".map"
#define DT_CKPT_TENSORS_SECTION "tensors"

/* A global tensor (the record of the "tensors" section; 80 bytes). */
typedef struct dt_ckpt_tensor {
    char name[DT_CKPT_TENSOR_NAME_MAX]; /* NUL-terminated, NUL-padded */
    uint32_t ndim;                      /* 1..DT_CKPT_MAX_DIMS */
    uint32_t reserved;                  /* zero */
    uint64_t shape[DT_CKPT_MAX_DIMS];   /* unused trailing dimensions are 1 */
} dt_ckpt_tensor;

/* A box of global tensor `tensor` stored row-major from element `offset` of
 * a flat buffer (the record of a NAME.map section; 64 bytes). */
typedef struct dt_ckpt_box {
    uint32_t tensor;                   /* index in the tensor table */
    uint32_t reserved;                 /* zero */
    uint64_t begin[DT_CKPT_MAX_DIMS];  /* first index along each dimension */
    uint64_t extent[DT_CKPT_MAX_DIMS]; /* length along each dimension (>= 1) */
    uint64_t offset;                   /* element offset in the flat buffer */
} dt_ckpt_box;

/* Elements of a box. */
uint64_t dt_ckpt_box_volume(const dt_ckpt_box *b);
/* The part of box `whole` (stored row-major from whole->offset) that lies in
 * elements [lo, hi) of the flat buffer, as at most 5 boxes (a partial row,
 * a partial plane, whole planes, a partial plane, a partial row) written to
 * out[]; returns their count. What a shard of a flat range (ZeRO) or a
 * whole tensor (tensor parallelism) holds of a global tensor. */
size_t dt_ckpt_boxes_in_range(const dt_ckpt_box *whole, uint64_t lo, uint64_t hi,
                              dt_ckpt_box out[5]);

/* For every box of `want` (in dst), copy what the boxes `have` (in src)
 * hold of the same tensor; tensor indices of both refer to one table.
 * Returns the elements copied: the volume of `want` when `have` covers it
 * and its boxes are disjoint. Reshards in memory what a checkpoint
 * reshards from files. */
uint64_t dt_ckpt_copy_boxes(const dt_ckpt_box *have, size_t nhave, const float *src,
                            const dt_ckpt_box *want, size_t nwant, float *dst);

/* An open checkpoint: the manifest and the shard files it lists. */
typedef struct dt_ckpt_set dt_ckpt_set;

/* Open the checkpoint whose manifest is `path` and every shard file it
 * lists. With `verify`, every file's checksum is recomputed and must be the
 * one the manifest recorded. Every shard map is validated against its
 * section and the tensor table (boxes inside their tensor and their
 * buffer, no element stored twice). DT_ERR_CORRUPT / DT_ERR_NOT_FOUND
 * name the file. */
dt_status dt_ckpt_set_open(dt_ckpt_set **out, const char *path, bool verify);
/* The newest checkpoint in `dir` whose manifest and shard files all
 * validate (older ones are tried, with a warning each, when not). */
dt_status dt_ckpt_set_open_latest(dt_ckpt_set **out, const char *dir);
void dt_ckpt_set_close(dt_ckpt_set *s);

const dt_ckpt *dt_ckpt_set_manifest(const dt_ckpt_set *s);
/* The file world rank `rank` wrote (the manifest for rank 0), or NULL. */
const dt_ckpt *dt_ckpt_set_file_of(const dt_ckpt_set *s, int rank);
size_t dt_ckpt_set_num_files(const dt_ckpt_set *s); /* manifest included */
const dt_ckpt *dt_ckpt_set_file(const dt_ckpt_set *s, size_t i);
int dt_ckpt_set_file_rank(const dt_ckpt_set *s, size_t i); /* the world rank that wrote file i */
/* The global tensors (empty for a format-1 checkpoint, which has none). */
size_t dt_ckpt_set_num_tensors(const dt_ckpt_set *s);
const dt_ckpt_tensor *dt_ckpt_set_tensor(const dt_ckpt_set *s, size_t i);

/* Fill `local` (f32) with the boxes `want` of sharded state `state`. The
 * tensor indices of `want` refer to `tensors` (the reader's global table);
 * each is matched by name to the checkpoint's tensor, whose shape must be
 * the same. Every wanted element must be stored in some file: otherwise
 * DT_ERR_MISMATCH names the state, the tensor and the missing part. A
 * format-1 checkpoint (no maps) is read as one unsharded buffer laid out
 * in the order of `tensors`. Elements of `local` outside the boxes are
 * left alone. */
dt_status dt_ckpt_set_read_boxes(const dt_ckpt_set *s, const char *state,
                                 const dt_ckpt_tensor *tensors, size_t ntensors,
                                 const dt_ckpt_box *want, size_t nwant, float *local);
/* Whether any file holds sharded state `state` (its NAME.map, or for a
 * format-1 checkpoint the plain section). */
bool dt_ckpt_set_has_state(const dt_ckpt_set *s, const char *state);

#ifdef __cplusplus
}
#endif
#endif /* DTRAIN_CKPT_H */
