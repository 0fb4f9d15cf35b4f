/*
 * container.c — the checkpoint container: named, typed sections in one file
 * with a whole-file XXH3 checksum, written atomically, rotated, and resumed
 * from the newest file that validates.
 *
 * Invariants:
 *   - A file only ever appears under its final name complete and fsync'ed
 *     (temp file + fsync + rename + fsync of the directory), so a writer
 *     killed at any instant leaves either the old set of checkpoints or the
 *     old set plus the new one — never a half-written file under a real name.
 *   - `latest` moves only after the rename; old checkpoints are removed only
 *     after `latest` moved. Resume does not trust `latest` blindly: it scans
 *     for the newest file that validates.
 *   - Every length in a file is checked against the real file size (with
 *     overflow checks) before it is used; a reader never allocates from a
 *     file-provided size (sections are read through a read-only mmap).
 * The format is little-endian (checked at compile time below).
 */
#include "ckpt_internal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "checkpoint format is little-endian");

static const char ckpt_magic[8] = {'D', 'T', 'R', 'N', 'C', 'K', 'P', 'T'};
static const char ckpt_end_magic[8] = {'D', 'T', 'C', 'K', 'E', 'N', 'D', '\0'};
#define CKPT_HASH_SEED 0x6474636b70740001ull /* "dtckpt" + format 1 */

typedef struct ckpt_header {
    char magic[8];         /* "DTRNCKPT" */
    uint32_t version;      /* DT_CKPT_VERSION */
    uint32_t nsections;    /* entries in the table */
    uint64_t file_size;    /* total bytes including the trailer */
    uint64_t table_offset; /* always 64 in version 1 */
    uint8_t reserved[32];  /* zero */
} ckpt_header;

typedef struct ckpt_entry {
    char name[DT_CKPT_NAME_MAX]; /* NUL-terminated, NUL-padded */
    uint32_t type;               /* dt_ckpt_type */
    uint32_t reserved;           /* zero */
    uint64_t count;              /* elements */
    uint64_t offset;             /* byte offset of the data, 64-aligned */
    uint64_t bytes;              /* count * element size */
} ckpt_entry;

typedef struct ckpt_trailer {
    uint64_t checksum; /* XXH3-64 of bytes [0, file_size - 16) */
    char magic[8];     /* "DTCKEND\0" */
} ckpt_trailer;

_Static_assert(sizeof(ckpt_header) == 64, "header is 64 bytes");
_Static_assert(sizeof(ckpt_entry) == 64, "table entry is 64 bytes");
_Static_assert(sizeof(ckpt_trailer) == 16, "trailer is 16 bytes");

/* clang-format off */
static const struct { const char *name; size_t size; } ckpt_types[] = {
    [DT_CKPT_BYTES] = {"bytes", 1},
    [DT_CKPT_TEXT]  = {"text", 1},
    [DT_CKPT_F32]   = {"f32", 4},
    [DT_CKPT_F64]   = {"f64", 8},
    [DT_CKPT_I32]   = {"i32", 4},
    [DT_CKPT_I64]   = {"i64", 8},
    [DT_CKPT_U64]   = {"u64", 8},
};
/* clang-format on */
_Static_assert(sizeof ckpt_types / sizeof ckpt_types[0] == DT_CKPT_TYPE_COUNT,
               "one row per dt_ckpt_type");

const char *dt_ckpt_type_name(dt_ckpt_type t) {
    return (unsigned)t < DT_CKPT_TYPE_COUNT ? ckpt_types[t].name : "?";
}

size_t dt_ckpt_type_size(dt_ckpt_type t) {
    return (unsigned)t < DT_CKPT_TYPE_COUNT ? ckpt_types[t].size : 0;
}

/* ------------------------------------------------------------------------ */
/* Writing                                                                  */
/* ------------------------------------------------------------------------ */

static dt_status io_error(const char *what, const char *path) {
    int e = errno;
    dt_status st = (e == ENOSPC || e == EDQUOT) ? DT_ERR_NOSPACE : DT_ERR_IO;
    return dt_error_set(st, "%s %s: %s", what, path, strerror(e));
}

/* Split "dir/name" into its directory ("." when there is none). */
static void dir_of(const char *path, char *out, size_t len) {
    const char *slash = strrchr(path, '/');
    if (!slash)
        snprintf(out, len, ".");
    else if (slash == path)
        snprintf(out, len, "/");
    else
        snprintf(out, len, "%.*s", (int)(slash - path), path);
}

static const char *base_of(const char *path) {
    const char *slash = strrchr(path, '/');
    return slash ? slash + 1 : path;
}

typedef struct writer {
    int fd;
    const char *path; /* for messages: the final name */
    dt_hasher *hash;
} writer;

/* Everything before the trailer goes through here, into the checksum. */
static dt_status write_all(writer *w, const void *data, size_t len) {
    dt_hasher_update(w->hash, data, len);
    return dt_file_write_all(w->fd, data, len, w->path);
}

static dt_status write_zeros(writer *w, size_t len) {
    static const char zeros[64];
    DT_ASSERT(len <= sizeof zeros);
    return write_all(w, zeros, len);
}

static dt_status check_sections(const char *path, const dt_ckpt_section *s, size_t n) {
    if (n > DT_CKPT_MAX_SECTIONS)
        return dt_error_set(DT_ERR_INVALID, "checkpoint %s: %zu sections, at most %d", path, n,
                            DT_CKPT_MAX_SECTIONS);
    for (size_t i = 0; i < n; i++) {
        size_t len = s[i].name ? strlen(s[i].name) : 0;
        if (len == 0 || len >= DT_CKPT_NAME_MAX)
            return dt_error_set(DT_ERR_INVALID,
                                "checkpoint %s: section %zu name \"%s\" must be 1..%d bytes", path,
                                i, s[i].name ? s[i].name : "", DT_CKPT_NAME_MAX - 1);
        if ((unsigned)s[i].type >= DT_CKPT_TYPE_COUNT)
            return dt_error_set(DT_ERR_INVALID, "checkpoint %s: section %s has type %d", path,
                                s[i].name, (int)s[i].type);
        size_t bytes;
        if (!dt_mul_size(s[i].count, dt_ckpt_type_size(s[i].type), &bytes))
            return dt_error_set(DT_ERR_INVALID, "checkpoint %s: section %s size overflows", path,
                                s[i].name);
        if (s[i].count && !s[i].data)
            return dt_error_set(DT_ERR_INVALID, "checkpoint %s: section %s has no data", path,
                                s[i].name);
        for (size_t j = 0; j < i; j++)
            if (strcmp(s[i].name, s[j].name) == 0)
                return dt_error_set(DT_ERR_INVALID, "checkpoint %s: two sections named %s", path,
                                    s[i].name);
    }
    return DT_OK;
}

dt_status dt_ckpt_write_file(const char *path, const dt_ckpt_section *sections, size_t n) {
    return dt_ckpt_write_file_sum(path, sections, n, NULL);
}

dt_status dt_ckpt_write_file_sum(const char *path, const dt_ckpt_section *sections, size_t n,
                                 dt_ckpt_file_rec *written) {
    DT_CHECK(check_sections(path, sections, n));
    DT_CHECK(dt_file_check_replaceable(path));

    /* Layout: header, table, 64-aligned sections, trailer. */
    size_t table_bytes = sizeof(ckpt_header) + n * sizeof(ckpt_entry);
    ckpt_header *head = dt_calloc(1, table_bytes);
    if (!head)
        return DT_ERR_NOMEM;
    ckpt_entry *table = (ckpt_entry *)(head + 1);
    uint64_t off = table_bytes; /* already 64-aligned */
    for (size_t i = 0; i < n; i++) {
        ckpt_entry *e = &table[i];
        strncpy(e->name, sections[i].name, DT_CKPT_NAME_MAX - 1);
        e->type = (uint32_t)sections[i].type;
        e->count = sections[i].count;
        e->bytes = (uint64_t)sections[i].count * dt_ckpt_type_size(sections[i].type);
        e->offset = off;
        off = dt_align_up(off + e->bytes, 64);
    }
    memcpy(head->magic, ckpt_magic, 8);
    head->version = DT_CKPT_VERSION;
    head->nsections = (uint32_t)n;
    head->file_size = off + sizeof(ckpt_trailer);
    head->table_offset = sizeof(ckpt_header);

    char dir[4096], tmp[4096 + 64];
    dir_of(path, dir, sizeof dir);
    snprintf(tmp, sizeof tmp, "%s/.%s.tmp.%ld", dir, base_of(path), (long)getpid());

    dt_status st = DT_OK;
    writer w = {.fd = -1, .path = path};
    DT_CHECK_GOTO(dt_hasher_create(&w.hash, CKPT_HASH_SEED), st, fail);
    w.fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (w.fd < 0) {
        st = io_error("cannot create checkpoint", tmp);
        goto fail;
    }
    /* Reserve the space first: a full disk fails here, in microseconds,
     * instead of after gigabytes of writing. */
    int rc = posix_fallocate(w.fd, 0, (off_t)head->file_size);
    if (rc != 0 && rc != EOPNOTSUPP && rc != EINVAL) {
        char what[96], sz[32];
        snprintf(what, sizeof what, "cannot reserve %s for checkpoint",
                 dt_format_bytes((double)head->file_size, sz, sizeof sz));
        errno = rc;
        st = io_error(what, path);
        goto fail;
    }
    DT_CHECK_GOTO(write_all(&w, head, table_bytes), st, fail);
    for (size_t i = 0; i < n; i++) {
        DT_CHECK_GOTO(write_all(&w, sections[i].data, table[i].bytes), st, fail);
        size_t end = i + 1 < n ? table[i + 1].offset : off;
        DT_CHECK_GOTO(write_zeros(&w, end - (table[i].offset + table[i].bytes)), st, fail);
    }
    ckpt_trailer tr = {.checksum = dt_hasher_final(w.hash)};
    memcpy(tr.magic, ckpt_end_magic, 8);
    if (written) {
        written->size = head->file_size;
        written->checksum = tr.checksum;
    }
    DT_CHECK_GOTO(dt_file_write_all(w.fd, &tr, sizeof tr, path), st, fail);
    if (fsync(w.fd) != 0) {
        st = io_error("cannot fsync checkpoint", path);
        goto fail;
    }
    if (close(w.fd) != 0) {
        w.fd = -1;
        st = io_error("cannot close checkpoint", path);
        goto fail;
    }
    w.fd = -1;
    if (rename(tmp, path) != 0) {
        st = io_error("cannot rename checkpoint to", path);
        goto fail;
    }
    st = dt_fsync_dir(dir);
    dt_hasher_destroy(w.hash);
    dt_free(head);
    return st;

fail:
    if (w.fd >= 0)
        close(w.fd);
    unlink(tmp);
    dt_hasher_destroy(w.hash);
    dt_free(head);
    return st;
}

/* ------------------------------------------------------------------------ */
/* Directory of checkpoints                                                 */
/* ------------------------------------------------------------------------ */

void dt_ckpt_path(char *out, size_t len, const char *dir, int64_t step) {
    snprintf(out, len, "%s/ckpt-%06" PRId64 ".dtck", dir, step);
}

void dt_ckpt_shard_path(char *out, size_t len, const char *dir, int64_t step, int rank) {
    snprintf(out, len, "%s/ckpt-%06" PRId64 ".r%05d.dtck", dir, step, rank);
}

/* Read decimal digits at *p into *v (advancing *p); false without any or
 * on overflow. */
static bool digits(const char **p, int64_t *v) {
    int n = 0;
    *v = 0;
    while (**p >= '0' && **p <= '9') {
        if (*v > (INT64_MAX - 9) / 10)
            return false;
        *v = *v * 10 + (*(*p)++ - '0');
        n++;
    }
    return n > 0;
}

/* If `name` is "ckpt-<digits>.dtck", store the step and return true. */
static bool parse_ckpt_name(const char *name, int64_t *step) {
    const char *p = name + 5;
    return strncmp(name, "ckpt-", 5) == 0 && digits(&p, step) && strcmp(p, ".dtck") == 0;
}

/* If `name` is a shard file "ckpt-<digits>.r<digits>.dtck", store the step. */
static bool parse_shard_name(const char *name, int64_t *step) {
    const char *p = name + 5;
    int64_t rank;
    if (strncmp(name, "ckpt-", 5) != 0 || !digits(&p, step) || strncmp(p, ".r", 2) != 0)
        return false;
    p += 2;
    return digits(&p, &rank) && strcmp(p, ".dtck") == 0;
}

static int by_step_desc(const void *a, const void *b) {
    int64_t x = ((const ckpt_file *)a)->step, y = ((const ckpt_file *)b)->step;
    return x < y ? 1 : x > y ? -1 : 0;
}

dt_status dt__ckpt_list(const char *dir, ckpt_file **out, size_t *count) {
    *out = NULL;
    *count = 0;
    DIR *d = opendir(dir);
    if (!d) {
        if (errno == ENOENT)
            return dt_error_set(DT_ERR_NOT_FOUND, "checkpoint directory %s does not exist", dir);
        return io_error("cannot open checkpoint directory", dir);
    }
    ckpt_file *files = NULL;
    size_t n = 0, cap = 0;
    struct dirent *ent;
    while ((ent = readdir(d)) != NULL) {
        int64_t step;
        if (!parse_ckpt_name(ent->d_name, &step) || strlen(ent->d_name) >= 256)
            continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 16;
            ckpt_file *nf = realloc(files, cap * sizeof *nf);
            if (!nf) {
                free(files);
                closedir(d);
                return dt_error_set(DT_ERR_NOMEM, "listing %s", dir);
            }
            files = nf;
        }
        files[n].step = step;
        snprintf(files[n].name, sizeof files[n].name, "%s", ent->d_name);
        n++;
    }
    closedir(d);
    if (n > 1)
        qsort(files, n, sizeof *files, by_step_desc);
    *out = files;
    *count = n;
    return DT_OK;
}

/* Remove ".<name>.tmp.<pid>" files whose writer no longer exists. */
static void remove_stale_temps(const char *dir) {
    DIR *d = opendir(dir);
    if (!d)
        return;
    struct dirent *ent;
    while ((ent = readdir(d)) != NULL) {
        const char *t = ent->d_name[0] == '.' ? strstr(ent->d_name, ".tmp.") : NULL;
        if (!t)
            continue;
        char *end;
        long pid = strtol(t + 5, &end, 10);
        if (*end != '\0' || pid <= 0)
            continue;
        if (pid != (long)getpid() && kill((pid_t)pid, 0) != 0 && errno == ESRCH) {
            char p[4096 + 512];
            snprintf(p, sizeof p, "%s/%s", dir, ent->d_name);
            if (unlink(p) == 0)
                DT_DEBUG("ckpt", "removed %s left by a writer that died", p);
        }
    }
    closedir(d);
}

/* Point dir/latest at `name`: a symlink made under a temp name and renamed
 * over the old one, which is atomic. */
static dt_status set_latest(const char *dir, const char *name) {
    char tmp[4096 + 64], dst[4096 + 16];
    snprintf(tmp, sizeof tmp, "%s/.latest.tmp.%ld", dir, (long)getpid());
    snprintf(dst, sizeof dst, "%s/latest", dir);
    unlink(tmp);
    if (symlink(name, tmp) != 0)
        return io_error("cannot create", tmp);
    if (rename(tmp, dst) != 0) {
        dt_status st = io_error("cannot update", dst);
        unlink(tmp);
        return st;
    }
    return dt_fsync_dir(dir);
}

/* Remove the shard files whose checkpoint has no manifest: those of
 * checkpoints rotated out, and those a save that failed before its manifest
 * left behind. Called by the one writer of the directory after it wrote a
 * manifest, so no save is in flight. */
static bool remove_orphan_shards(const char *dir) {
    DIR *d = opendir(dir);
    if (!d)
        return false;
    bool removed = false;
    struct dirent *ent;
    while ((ent = readdir(d)) != NULL) {
        int64_t step;
        if (!parse_shard_name(ent->d_name, &step))
            continue;
        char manifest[4096 + 32], p[4096 + 512];
        dt_ckpt_path(manifest, sizeof manifest, dir, step);
        if (access(manifest, F_OK) == 0)
            continue;
        snprintf(p, sizeof p, "%s/%s", dir, ent->d_name);
        if (unlink(p) != 0)
            DT_WARN("cannot remove shard file %s: %s", p, strerror(errno));
        else
            removed = true;
    }
    closedir(d);
    return removed;
}

/* Every shard file the manifest will list is there with the size its
 * writer reported: a directory that is not shared by the writers fails
 * here, before anything is committed. */
static dt_status check_shards(const char *dir, int64_t step, const dt_ckpt_file_rec *files,
                              size_t nfiles) {
    for (size_t i = 0; i < nfiles; i++) {
        char p[4096 + 64];
        struct stat sb;
        dt_ckpt_shard_path(p, sizeof p, dir, step, (int)files[i].rank);
        if (stat(p, &sb) != 0)
            return dt_error_set(errno == ENOENT ? DT_ERR_NOT_FOUND : DT_ERR_IO,
                                "rank %" PRId64 "'s shard file %s is not visible to rank 0 (%s): "
                                "--ckpt-dir must be one directory shared by every rank",
                                files[i].rank, p, strerror(errno));
        if ((uint64_t)sb.st_size != files[i].size)
            return dt_error_set(DT_ERR_IO,
                                "rank %" PRId64 "'s shard file %s has %lld bytes, its writer "
                                "wrote %" PRIu64,
                                files[i].rank, p, (long long)sb.st_size, files[i].size);
    }
    return DT_OK;
}

dt_status dt_ckpt_save(const char *dir, int64_t step, const dt_ckpt_section *sections, size_t count,
                       int keep, char *path_out, size_t path_len) {
    return dt_ckpt_save_set(dir, step, sections, count, NULL, 0, keep, path_out, path_len);
}

dt_status dt_ckpt_save_set(const char *dir, int64_t step, const dt_ckpt_section *sections,
                           size_t count, const dt_ckpt_file_rec *files, size_t nfiles, int keep,
                           char *path_out, size_t path_len) {
    if (keep < 1)
        return dt_error_set(DT_ERR_INVALID, "checkpoint keep count %d must be >= 1", keep);
    if (step < 0)
        return dt_error_set(DT_ERR_INVALID, "checkpoint step %" PRId64 " must be >= 0", step);
    DT_CHECK(dt_mkdir_p(dir));
    remove_stale_temps(dir);
    DT_CHECK(check_shards(dir, step, files, nfiles));
    char path[4096 + 32];
    dt_ckpt_path(path, sizeof path, dir, step);
    if (nfiles == 0) {
        DT_CHECK(dt_ckpt_write_file(path, sections, count));
    } else {
        /* The manifest: the given sections and the list of shard files. */
        dt_ckpt_section *all = dt_calloc(count + 1, sizeof *all);
        if (!all)
            return DT_ERR_NOMEM;
        memcpy(all, sections, count * sizeof *all);
        all[count] =
            (dt_ckpt_section){DT_CKPT_FILES_SECTION, DT_CKPT_BYTES, files, nfiles * sizeof *files};
        dt_status st = dt_ckpt_write_file(path, all, count + 1);
        dt_free(all);
        DT_CHECK(st);
    }
    if (path_out)
        snprintf(path_out, path_len, "%s", path);
    DT_CHECK(set_latest(dir, base_of(path)));

    /* Rotation: keep the newest `keep` checkpoints at or below this step.
     * Files of later steps belong to a run that was abandoned (resume picked
     * an older file because they did not validate); they are left for
     * inspection but never counted. */
    ckpt_file *list;
    size_t n;
    DT_CHECK(dt__ckpt_list(dir, &list, &n));
    int kept = 0;
    bool removed = false;
    for (size_t i = 0; i < n; i++) {
        if (list[i].step > step) {
            DT_WARN("checkpoint directory %s holds %s, newer than step %" PRId64
                    " just saved; leaving it alone",
                    dir, list[i].name, step);
            continue;
        }
        if (kept < keep) {
            kept++;
            continue;
        }
        char p[4096 + 512];
        snprintf(p, sizeof p, "%s/%s", dir, list[i].name);
        if (unlink(p) != 0)
            DT_WARN("cannot remove old checkpoint %s: %s", p, strerror(errno));
        else
            removed = true;
    }
    free(list);
    removed |= remove_orphan_shards(dir);
    return removed ? dt_fsync_dir(dir) : DT_OK;
}

/* ------------------------------------------------------------------------ */
/* Reading                                                                  */
/* ------------------------------------------------------------------------ */

struct dt_ckpt {
    char *path;               /* as opened */
    const unsigned char *map; /* the whole file, read only */
    size_t size;              /* bytes mapped == file size */
    const ckpt_header *head;  /* == map */
    const ckpt_entry *table;  /* head->nsections entries */
};

static dt_status corrupt(const char *path, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static dt_status corrupt(const char *path, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return dt_error_set(DT_ERR_CORRUPT, "checkpoint %s is unusable: %s", path, msg);
}

/* Validate everything except the checksum. */
static dt_status validate_structure(const dt_ckpt *ck) {
    const char *path = ck->path;
    const ckpt_header *h = ck->head;
    size_t size = ck->size;
    if (memcmp(h->magic, ckpt_magic, 8) != 0)
        return corrupt(path,
                       "not a dtrain checkpoint (magic %02x%02x%02x%02x..., expected "
                       "\"DTRNCKPT\")",
                       (unsigned char)h->magic[0], (unsigned char)h->magic[1],
                       (unsigned char)h->magic[2], (unsigned char)h->magic[3]);
    if (h->version != DT_CKPT_VERSION)
        return corrupt(path, "format version %" PRIu32 ", this build reads version %d", h->version,
                       DT_CKPT_VERSION);
    if (h->file_size != size)
        return corrupt(path, "header says %" PRIu64 " bytes but the file has %zu (%s)",
                       h->file_size, size, size < h->file_size ? "truncated" : "trailing data");
    if (h->nsections > DT_CKPT_MAX_SECTIONS)
        return corrupt(path, "%" PRIu32 " sections, at most %d", h->nsections,
                       DT_CKPT_MAX_SECTIONS);
    uint64_t data_end = size - sizeof(ckpt_trailer);
    uint64_t table_end = sizeof(ckpt_header) + (uint64_t)h->nsections * sizeof(ckpt_entry);
    if (h->table_offset != sizeof(ckpt_header) || table_end > data_end)
        return corrupt(path,
                       "section table (%" PRIu32 " entries at offset %" PRIu64
                       ") does not fit in %zu bytes",
                       h->nsections, h->table_offset, size);
    const ckpt_trailer *tr = (const ckpt_trailer *)(ck->map + data_end);
    if (memcmp(tr->magic, ckpt_end_magic, 8) != 0)
        return corrupt(path, "end marker missing (truncated or overwritten)");
    for (uint32_t i = 0; i < h->nsections; i++) {
        const ckpt_entry *e = &ck->table[i];
        if (memchr(e->name, '\0', DT_CKPT_NAME_MAX) == NULL || e->name[0] == '\0')
            return corrupt(path, "section %" PRIu32 " has no valid name", i);
        if (e->type >= DT_CKPT_TYPE_COUNT)
            return corrupt(path, "section %s has unknown type %" PRIu32, e->name, e->type);
        uint64_t bytes;
        if (__builtin_mul_overflow(e->count, (uint64_t)dt_ckpt_type_size(e->type), &bytes) ||
            bytes != e->bytes)
            return corrupt(path, "section %s: %" PRIu64 " bytes do not match %" PRIu64 " %s",
                           e->name, e->bytes, e->count, dt_ckpt_type_name(e->type));
        if (e->offset < table_end || e->offset > data_end || e->bytes > data_end - e->offset)
            return corrupt(path,
                           "section %s (%" PRIu64 " bytes at offset %" PRIu64
                           ") lies outside the file's %" PRIu64 " data bytes",
                           e->name, e->bytes, e->offset, data_end);
        for (uint32_t j = 0; j < i; j++)
            if (strcmp(e->name, ck->table[j].name) == 0)
                return corrupt(path, "two sections named %s", e->name);
    }
    return DT_OK;
}

dt_status dt_ckpt_open_unverified(dt_ckpt **out, const char *path) {
    *out = NULL;
    dt_status st = DT_OK;
    dt_ckpt *ck = dt_calloc(1, sizeof *ck);
    if (!ck)
        return DT_ERR_NOMEM;
    ck->path = strdup(path);
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK); /* a FIFO is refused, not waited on */
    if (!ck->path || fd < 0) {
        st = errno == ENOENT ? dt_error_set(DT_ERR_NOT_FOUND, "checkpoint %s does not exist", path)
                             : io_error("cannot open checkpoint", path);
        goto fail;
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        st = io_error("cannot stat checkpoint", path);
        goto fail;
    }
    if (!S_ISREG(sb.st_mode)) {
        st = dt_error_set(DT_ERR_INVALID, "checkpoint %s is not a regular file", path);
        goto fail;
    }
    if ((uint64_t)sb.st_size < sizeof(ckpt_header) + sizeof(ckpt_trailer)) {
        st = corrupt(path, "%lld bytes, shorter than a header and a trailer (truncated)",
                     (long long)sb.st_size);
        goto fail;
    }
    ck->size = (size_t)sb.st_size;
    void *m = mmap(NULL, ck->size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (m == MAP_FAILED) {
        st = io_error("cannot map checkpoint", path);
        goto fail;
    }
    close(fd);
    fd = -1;
    ck->map = m;
    ck->head = m;
    ck->table = (const ckpt_entry *)(ck->head + 1);
    DT_CHECK_GOTO(validate_structure(ck), st, fail);
    *out = ck;
    return DT_OK;

fail:
    if (fd >= 0)
        close(fd);
    dt_ckpt_close(ck);
    return st;
}

dt_status dt_ckpt_verify(const dt_ckpt *ck, uint64_t *stored, uint64_t *computed) {
    size_t data_end = ck->size - sizeof(ckpt_trailer);
    const ckpt_trailer *tr = (const ckpt_trailer *)(ck->map + data_end);
    uint64_t want = tr->checksum;
    uint64_t got = dt_hash64(ck->map, data_end, CKPT_HASH_SEED);
    if (stored)
        *stored = want;
    if (computed)
        *computed = got;
    if (want != got)
        return corrupt(ck->path,
                       "checksum mismatch (stored %016" PRIx64 ", computed %016" PRIx64
                       "): the file was damaged after it was written",
                       want, got);
    return DT_OK;
}

dt_status dt_ckpt_open(dt_ckpt **out, const char *path) {
    dt_ckpt *ck;
    DT_CHECK(dt_ckpt_open_unverified(&ck, path));
    dt_status st = dt_ckpt_verify(ck, NULL, NULL);
    if (st != DT_OK) {
        dt_ckpt_close(ck);
        return st;
    }
    *out = ck;
    return DT_OK;
}

dt_status dt_ckpt_open_latest(dt_ckpt **out, const char *dir) {
    *out = NULL;
    ckpt_file *files;
    size_t n;
    DT_CHECK(dt__ckpt_list(dir, &files, &n));
    if (n == 0)
        return dt_error_set(DT_ERR_NOT_FOUND, "no checkpoint (ckpt-*.dtck) in %s", dir);
    char first_err[1024] = "";
    for (size_t i = 0; i < n; i++) {
        char p[4096 + 512];
        snprintf(p, sizeof p, "%s/%s", dir, files[i].name);
        dt_ckpt *ck;
        if (dt_ckpt_open(&ck, p) == DT_OK) {
            if (i > 0)
                DT_WARN("resuming from %s, the newest checkpoint that validates", p);
            free(files);
            *out = ck;
            return DT_OK;
        }
        DT_WARN("skipping %s", dt_last_error());
        if (i == 0)
            snprintf(first_err, sizeof first_err, "%s", dt_last_error());
    }
    free(files);
    return dt_error_set(DT_ERR_CORRUPT, "none of the %zu checkpoints in %s validates; newest: %s",
                        n, dir, first_err);
}

void dt_ckpt_close(dt_ckpt *ck) {
    if (!ck)
        return;
    if (ck->map)
        munmap((void *)ck->map, ck->size);
    free(ck->path);
    dt_free(ck);
}

const char *dt_ckpt_file(const dt_ckpt *ck) { return ck->path; }

uint64_t dt_ckpt_stored_checksum(const dt_ckpt *ck) {
    const ckpt_trailer *tr = (const ckpt_trailer *)(ck->map + ck->size - sizeof(ckpt_trailer));
    return tr->checksum;
}
uint32_t dt_ckpt_version(const dt_ckpt *ck) { return ck->head->version; }
uint64_t dt_ckpt_file_size(const dt_ckpt *ck) { return ck->size; }
size_t dt_ckpt_num_sections(const dt_ckpt *ck) { return ck->head->nsections; }

void dt_ckpt_section_at(const dt_ckpt *ck, size_t i, dt_ckpt_info *out) {
    DT_ASSERT(i < ck->head->nsections);
    const ckpt_entry *e = &ck->table[i];
    out->name = e->name;
    out->type = (dt_ckpt_type)e->type;
    out->count = (size_t)e->count;
    out->bytes = (size_t)e->bytes;
    out->offset = e->offset;
    out->data = ck->map + e->offset;
}

dt_status dt_ckpt_find(const dt_ckpt *ck, const char *name, dt_ckpt_info *out) {
    for (size_t i = 0; i < ck->head->nsections; i++) {
        if (strcmp(ck->table[i].name, name) == 0) {
            dt_ckpt_section_at(ck, i, out);
            return DT_OK;
        }
    }
    return dt_error_set(DT_ERR_NOT_FOUND, "checkpoint %s has no section '%s'", ck->path, name);
}

dt_status dt_ckpt_read(const dt_ckpt *ck, const char *name, dt_ckpt_type type, void *dst,
                       size_t count) {
    dt_ckpt_info info;
    if (dt_ckpt_find(ck, name, &info) != DT_OK)
        return dt_error_set(DT_ERR_MISMATCH, "checkpoint %s has no section '%s'", ck->path, name);
    if (info.type != type || info.count != count)
        return dt_error_set(DT_ERR_MISMATCH,
                            "checkpoint %s: section '%s' holds %zu %s values, expected %zu %s "
                            "(was it written for another model or configuration?)",
                            ck->path, name, info.count, dt_ckpt_type_name(info.type), count,
                            dt_ckpt_type_name(type));
    if (info.bytes)
        memcpy(dst, info.data, info.bytes);
    return DT_OK;
}
