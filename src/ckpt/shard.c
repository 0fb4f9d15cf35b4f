/*
 * shard.c — checkpoints of many files and the sharded state in them: open a
 * manifest with its shard files, validate every shard map, and copy any
 * box of a global tensor out of whichever files hold it (see ckpt.h).
 *
 * Invariants:
 *   - Every record of a "tensors" section and of every NAME.map section is
 *     validated when the set is opened: a box lies inside its tensor and
 *     inside its data section, and no element of a tensor is stored twice
 *     for one state. Reading can then count covered elements to prove that
 *     a wanted box was filled completely.
 *   - A shard file belongs to its manifest: its size and trailer checksum
 *     are the ones the manifest recorded, so files of two attempts at the
 *     same step cannot be mixed.
 */
#include "ckpt_internal.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct dt_ckpt_set {
    dt_ckpt **files; /* files[0] is the manifest */
    int *ranks;      /* world rank of each file */
    size_t nfiles;
    const dt_ckpt_tensor *tensors; /* the manifest's table (mapped), NULL in format 1 */
    size_t ntensors;
};

uint64_t dt_ckpt_box_volume(const dt_ckpt_box *b) {
    return b->extent[0] * b->extent[1] * b->extent[2];
}

/* Elements [lo, hi) of box w, relative to its first element, as boxes:
 * peel a partial run along the last dimension from each end, then partial
 * planes, leaving whole planes in the middle. */
size_t dt_ckpt_boxes_in_range(const dt_ckpt_box *whole, uint64_t lo, uint64_t hi,
                              dt_ckpt_box out[5]) {
    const uint64_t e1 = whole->extent[1], e2 = whole->extent[2], plane = e1 * e2;
    uint64_t vol = dt_ckpt_box_volume(whole);
    lo = lo > whole->offset ? lo - whole->offset : 0;
    hi = hi > whole->offset ? hi - whole->offset : 0;
    hi = hi < vol ? hi : vol;
    size_t n = 0;
    /* Emit the box of flat elements [a, b) that is one run, one block of
     * whole rows, or one block of whole planes (callers guarantee it). */
#define EMIT(a, b)                                                                                 \
    do {                                                                                           \
        uint64_t a_ = (a), b_ = (b);                                                               \
        if (a_ < b_) {                                                                             \
            dt_ckpt_box *o = &out[n++];                                                            \
            *o = *whole;                                                                           \
            o->offset = whole->offset + a_;                                                        \
            uint64_t i0 = a_ / plane, i1 = a_ % plane / e2, i2 = a_ % e2;                          \
            o->begin[0] += i0, o->begin[1] += i1, o->begin[2] += i2;                               \
            if (b_ - a_ >= plane && i1 == 0 && i2 == 0) {                                          \
                o->extent[0] = (b_ - a_) / plane;                                                  \
            } else if (b_ - a_ >= e2 && i2 == 0) {                                                 \
                o->extent[0] = 1, o->extent[1] = (b_ - a_) / e2;                                   \
            } else {                                                                               \
                o->extent[0] = 1, o->extent[1] = 1, o->extent[2] = b_ - a_;                        \
            }                                                                                      \
        }                                                                                          \
    } while (0)
    if (lo >= hi)
        return 0;
    /* Round lo up and hi down to rows, then to planes. */
    uint64_t r_lo = (lo + e2 - 1) / e2 * e2, r_hi = hi / e2 * e2;
    if (r_lo >= r_hi) { /* within one row, or across one row boundary */
        uint64_t cut = r_lo < hi ? r_lo : hi;
        EMIT(lo, cut);
        EMIT(cut, hi);
        return n;
    }
    uint64_t p_lo = (r_lo + plane - 1) / plane * plane, p_hi = r_hi / plane * plane;
    EMIT(lo, r_lo);
    if (p_lo >= p_hi) {
        uint64_t cut = p_lo < r_hi ? p_lo : r_hi;
        EMIT(r_lo, cut);
        EMIT(cut, r_hi);
    } else {
        EMIT(r_lo, p_lo);
        EMIT(p_lo, p_hi);
        EMIT(p_hi, r_hi);
    }
    EMIT(r_hi, hi);
#undef EMIT
    return n;
}

static dt_status corrupt(const dt_ckpt *f, const char *what) {
    return dt_error_set(DT_ERR_CORRUPT, "checkpoint %s is unusable: %s", dt_ckpt_file(f), what);
}

/* The manifest's tensor table, validated. */
static dt_status load_tensors(dt_ckpt_set *s) {
    const dt_ckpt *m = s->files[0];
    dt_ckpt_info info;
    if (dt_ckpt_find(m, DT_CKPT_TENSORS_SECTION, &info) != DT_OK)
        return DT_OK; /* format 1: no sharded state */
    char msg[256];
    if (info.type != DT_CKPT_BYTES || info.bytes % sizeof(dt_ckpt_tensor) != 0) {
        snprintf(msg, sizeof msg, "section tensors: %zu bytes are not whole records of %zu",
                 info.bytes, sizeof(dt_ckpt_tensor));
        return corrupt(m, msg);
    }
    s->tensors = info.data;
    s->ntensors = info.bytes / sizeof(dt_ckpt_tensor);
    for (size_t i = 0; i < s->ntensors; i++) {
        const dt_ckpt_tensor *t = &s->tensors[i];
        uint64_t vol = 1;
        bool ok = memchr(t->name, '\0', sizeof t->name) && t->name[0] && t->ndim >= 1 &&
                  t->ndim <= DT_CKPT_MAX_DIMS;
        for (int d = 0; ok && d < DT_CKPT_MAX_DIMS; d++)
            ok = t->shape[d] >= 1 && (d < (int)t->ndim || t->shape[d] == 1) &&
                 !__builtin_mul_overflow(vol, t->shape[d], &vol) && vol < ((uint64_t)1 << 48);
        for (size_t j = 0; ok && j < i; j++)
            ok = strcmp(t->name, s->tensors[j].name) != 0;
        if (!ok) {
            snprintf(msg, sizeof msg, "tensor record %zu is malformed or repeats a name", i);
            return corrupt(m, msg);
        }
    }
    return DT_OK;
}

/* The map section `map` of file f and its data section, validated against
 * the tensor table. */
static dt_status check_map(const dt_ckpt_set *s, const dt_ckpt *f, const dt_ckpt_info *map) {
    char data_name[DT_CKPT_NAME_MAX], msg[256];
    size_t len = strlen(map->name) - strlen(DT_CKPT_MAP_SUFFIX);
    snprintf(data_name, sizeof data_name, "%.*s", (int)len, map->name);
    dt_ckpt_info data;
    if (map->type != DT_CKPT_BYTES || map->bytes % sizeof(dt_ckpt_box) != 0 ||
        dt_ckpt_find(f, data_name, &data) != DT_OK || data.type != DT_CKPT_F32) {
        snprintf(msg, sizeof msg, "shard map %s lacks its f32 section %s or is not whole records",
                 map->name, data_name);
        return corrupt(f, msg);
    }
    const dt_ckpt_box *b = map->data;
    for (size_t i = 0; i < map->bytes / sizeof *b; i++) {
        bool ok = b[i].tensor < s->ntensors;
        uint64_t vol = 1, end;
        for (int d = 0; ok && d < DT_CKPT_MAX_DIMS; d++)
            ok = b[i].extent[d] >= 1 &&
                 !__builtin_add_overflow(b[i].begin[d], b[i].extent[d], &end) &&
                 end <= s->tensors[b[i].tensor].shape[d] &&
                 !__builtin_mul_overflow(vol, b[i].extent[d], &vol);
        ok = ok && !__builtin_add_overflow(b[i].offset, vol, &end) && end <= data.count;
        if (!ok) {
            snprintf(msg, sizeof msg, "shard map %s: box %zu lies outside its tensor or buffer",
                     map->name, i);
            return corrupt(f, msg);
        }
    }
    return DT_OK;
}

static bool overlap(const dt_ckpt_box *a, const dt_ckpt_box *b) {
    for (int d = 0; d < DT_CKPT_MAX_DIMS; d++)
        if (a->begin[d] + a->extent[d] <= b->begin[d] || b->begin[d] + b->extent[d] <= a->begin[d])
            return false;
    return true;
}

/* Does `name` end in ".map"? */
static bool is_map(const char *name) {
    size_t n = strlen(name), k = strlen(DT_CKPT_MAP_SUFFIX);
    return n > k && strcmp(name + n - k, DT_CKPT_MAP_SUFFIX) == 0;
}

/* Every map of every file is well formed, and for each state no element of
 * a tensor is stored twice (boxes of one tensor are pairwise disjoint). */
static dt_status check_maps(const dt_ckpt_set *s) {
    for (size_t fi = 0; fi < s->nfiles; fi++) {
        const dt_ckpt *f = s->files[fi];
        for (size_t k = 0; k < dt_ckpt_num_sections(f); k++) {
            dt_ckpt_info map;
            dt_ckpt_section_at(f, k, &map);
            if (!is_map(map.name))
                continue;
            DT_CHECK(check_map(s, f, &map));
            /* Against every map of the same state, in this and later files. */
            const dt_ckpt_box *a = map.data;
            size_t na = map.bytes / sizeof *a;
            for (size_t fj = fi; fj < s->nfiles; fj++) {
                dt_ckpt_info other;
                if (dt_ckpt_find(s->files[fj], map.name, &other) != DT_OK)
                    continue;
                const dt_ckpt_box *b = other.data;
                size_t nb = other.bytes / sizeof *b;
                for (size_t i = 0; i < na; i++)
                    for (size_t j = fj == fi ? i + 1 : 0; j < nb; j++)
                        if (a[i].tensor == b[j].tensor && overlap(&a[i], &b[j])) {
                            char msg[256];
                            snprintf(msg, sizeof msg,
                                     "state %.*s stores part of tensor %s twice (in %s too)",
                                     (int)(strlen(map.name) - strlen(DT_CKPT_MAP_SUFFIX)), map.name,
                                     s->tensors[a[i].tensor].name, dt_ckpt_file(s->files[fj]));
                            return corrupt(f, msg);
                        }
            }
        }
    }
    return DT_OK;
}

dt_status dt_ckpt_set_open(dt_ckpt_set **out, const char *path, bool verify) {
    *out = NULL;
    dt_ckpt *m;
    DT_CHECK(verify ? dt_ckpt_open(&m, path) : dt_ckpt_open_unverified(&m, path));
    dt_ckpt_info fl;
    size_t nrec = 0;
    const dt_ckpt_file_rec *recs = NULL;
    if (dt_ckpt_find(m, DT_CKPT_FILES_SECTION, &fl) == DT_OK) {
        if (fl.type != DT_CKPT_BYTES || fl.bytes % sizeof *recs != 0) {
            dt_status st = corrupt(m, "section files is not whole records");
            dt_ckpt_close(m);
            return st;
        }
        recs = fl.data;
        nrec = fl.bytes / sizeof *recs;
    }
    dt_ckpt_set *s = dt_calloc(1, sizeof *s);
    dt_status st = DT_OK;
    if (!s || !(s->files = dt_calloc(nrec + 1, sizeof *s->files)) ||
        !(s->ranks = dt_calloc(nrec + 1, sizeof *s->ranks))) {
        if (s)
            dt_free(s->files);
        dt_free(s);
        dt_ckpt_close(m);
        return DT_ERR_NOMEM;
    }
    s->files[0] = m;
    s->nfiles = 1;
    /* Shard files sit beside the manifest: "<manifest minus .dtck>.rRRRRR.dtck". */
    size_t plen = strlen(path);
    size_t stem = plen > 5 && strcmp(path + plen - 5, ".dtck") == 0 ? plen - 5 : plen;
    for (size_t i = 0; i < nrec; i++) {
        const dt_ckpt_file_rec *r = &recs[i];
        char p[4096 + 64], msg[4608];
        bool dup = false;
        for (size_t j = 1; j < s->nfiles; j++)
            dup |= s->ranks[j] == r->rank;
        if (r->rank < 1 || r->rank >= (1 << 24) || dup) {
            snprintf(msg, sizeof msg, "file record %zu names rank %" PRId64, i, r->rank);
            st = corrupt(m, msg);
            goto fail;
        }
        snprintf(p, sizeof p, "%.*s.r%05d.dtck", (int)stem, path, (int)r->rank);
        dt_ckpt *f;
        DT_CHECK_GOTO(verify ? dt_ckpt_open(&f, p) : dt_ckpt_open_unverified(&f, p), st, fail);
        s->files[s->nfiles] = f;
        s->ranks[s->nfiles++] = (int)r->rank;
        if (dt_ckpt_file_size(f) != r->size || dt_ckpt_stored_checksum(f) != r->checksum) {
            snprintf(msg, sizeof msg,
                     "shard file %s does not belong to it (size %" PRIu64 ", checksum %016" PRIx64
                     "; the manifest recorded %" PRIu64 ", %016" PRIx64 ")",
                     p, dt_ckpt_file_size(f), dt_ckpt_stored_checksum(f), r->size, r->checksum);
            st = corrupt(m, msg);
            goto fail;
        }
    }
    DT_CHECK_GOTO(load_tensors(s), st, fail);
    if (s->tensors)
        DT_CHECK_GOTO(check_maps(s), st, fail);
    *out = s;
    return DT_OK;
fail:
    dt_ckpt_set_close(s);
    return st;
}

dt_status dt_ckpt_set_open_latest(dt_ckpt_set **out, const char *dir) {
    *out = NULL;
    ckpt_file *list;
    size_t n;
    DT_CHECK(dt__ckpt_list(dir, &list, &n));
    if (n == 0)
        return dt_error_set(DT_ERR_NOT_FOUND, "no checkpoint (ckpt-*.dtck) in %s", dir);
    char first_err[1024] = "";
    for (size_t i = 0; i < n; i++) {
        char p[4096 + 512];
        snprintf(p, sizeof p, "%s/%s", dir, list[i].name);
        if (dt_ckpt_set_open(out, p, true) == DT_OK) {
            if (i > 0)
                DT_WARN("resuming from %s, the newest checkpoint that validates", p);
            free(list);
            return DT_OK;
        }
        DT_WARN("skipping %s", dt_last_error());
        if (i == 0)
            snprintf(first_err, sizeof first_err, "%s", dt_last_error());
    }
    free(list);
    return dt_error_set(DT_ERR_CORRUPT, "none of the %zu checkpoints in %s validates; newest: %s",
                        n, dir, first_err);
}

void dt_ckpt_set_close(dt_ckpt_set *s) {
    if (!s)
        return;
    for (size_t i = 0; i < s->nfiles; i++)
        dt_ckpt_close(s->files[i]);
    dt_free(s->files);
    dt_free(s->ranks);
    dt_free(s);
}

const dt_ckpt *dt_ckpt_set_manifest(const dt_ckpt_set *s) { return s->files[0]; }
size_t dt_ckpt_set_num_files(const dt_ckpt_set *s) { return s->nfiles; }

const dt_ckpt *dt_ckpt_set_file(const dt_ckpt_set *s, size_t i) {
    DT_ASSERT(i < s->nfiles);
    return s->files[i];
}

int dt_ckpt_set_file_rank(const dt_ckpt_set *s, size_t i) {
    DT_ASSERT(i < s->nfiles);
    return s->ranks[i];
}

const dt_ckpt *dt_ckpt_set_file_of(const dt_ckpt_set *s, int rank) {
    for (size_t i = 0; i < s->nfiles; i++)
        if (s->ranks[i] == rank)
            return s->files[i];
    return NULL;
}

size_t dt_ckpt_set_num_tensors(const dt_ckpt_set *s) { return s->ntensors; }

const dt_ckpt_tensor *dt_ckpt_set_tensor(const dt_ckpt_set *s, size_t i) {
    DT_ASSERT(i < s->ntensors);
    return &s->tensors[i];
}

bool dt_ckpt_set_has_state(const dt_ckpt_set *s, const char *state) {
    char map[DT_CKPT_NAME_MAX + 8];
    dt_ckpt_info info;
    snprintf(map, sizeof map, "%s%s", state, DT_CKPT_MAP_SUFFIX);
    if (!s->tensors)
        return dt_ckpt_find(s->files[0], state, &info) == DT_OK;
    for (size_t i = 0; i < s->nfiles; i++)
        if (dt_ckpt_find(s->files[i], map, &info) == DT_OK)
            return true;
    return false;
}

/* Copy the intersection of stored box `b` (in `src`) and wanted box `w` (in
 * `dst`); returns the elements copied. */
static uint64_t copy_overlap(const dt_ckpt_box *b, const float *src, const dt_ckpt_box *w,
                             float *dst) {
    uint64_t lo[DT_CKPT_MAX_DIMS], hi[DT_CKPT_MAX_DIMS];
    for (int d = 0; d < DT_CKPT_MAX_DIMS; d++) {
        lo[d] = b->begin[d] > w->begin[d] ? b->begin[d] : w->begin[d];
        uint64_t be = b->begin[d] + b->extent[d], we = w->begin[d] + w->extent[d];
        hi[d] = be < we ? be : we;
        if (lo[d] >= hi[d])
            return 0;
    }
    uint64_t run = hi[2] - lo[2];
    for (uint64_t i0 = lo[0]; i0 < hi[0]; i0++)
        for (uint64_t i1 = lo[1]; i1 < hi[1]; i1++) {
            uint64_t s = b->offset +
                         ((i0 - b->begin[0]) * b->extent[1] + (i1 - b->begin[1])) * b->extent[2] +
                         (lo[2] - b->begin[2]);
            uint64_t t = w->offset +
                         ((i0 - w->begin[0]) * w->extent[1] + (i1 - w->begin[1])) * w->extent[2] +
                         (lo[2] - w->begin[2]);
            memcpy(dst + t, src + s, run * sizeof(float));
        }
    return (hi[0] - lo[0]) * (hi[1] - lo[1]) * run;
}

uint64_t dt_ckpt_copy_boxes(const dt_ckpt_box *have, size_t nhave, const float *src,
                            const dt_ckpt_box *want, size_t nwant, float *dst) {
    uint64_t n = 0;
    for (size_t i = 0; i < nwant; i++)
        for (size_t k = 0; k < nhave; k++)
            if (have[k].tensor == want[i].tensor)
                n += copy_overlap(&have[k], src, &want[i], dst);
    return n;
}

/* Format 1: the state is one unsharded buffer in the order of `tensors`. */
static dt_status read_unsharded(const dt_ckpt_set *s, const char *state,
                                const dt_ckpt_tensor *tensors, size_t ntensors,
                                const dt_ckpt_box *want, size_t nwant, float *local) {
    const dt_ckpt *m = s->files[0];
    uint64_t *start = dt_calloc(ntensors + 1, sizeof *start);
    if (!start)
        return DT_ERR_NOMEM;
    for (size_t i = 0; i < ntensors; i++)
        start[i + 1] = start[i] + tensors[i].shape[0] * tensors[i].shape[1] * tensors[i].shape[2];
    dt_ckpt_info info;
    dt_status st = dt_ckpt_find(m, state, &info);
    if (st == DT_OK && (info.type != DT_CKPT_F32 || info.count != start[ntensors]))
        st = dt_error_set(DT_ERR_MISMATCH,
                          "checkpoint %s: section '%s' holds %zu %s values, this model has %" PRIu64
                          " (was it written for another model or configuration?)",
                          dt_ckpt_file(m), state, info.count, dt_ckpt_type_name(info.type),
                          start[ntensors]);
    for (size_t i = 0; st == DT_OK && i < nwant; i++) {
        const dt_ckpt_tensor *t = &tensors[want[i].tensor];
        dt_ckpt_box whole = {.tensor = want[i].tensor,
                             .extent = {t->shape[0], t->shape[1], t->shape[2]},
                             .offset = start[want[i].tensor]};
        copy_overlap(&whole, info.data, &want[i], local);
    }
    dt_free(start);
    return st;
}

dt_status dt_ckpt_set_read_boxes(const dt_ckpt_set *s, const char *state,
                                 const dt_ckpt_tensor *tensors, size_t ntensors,
                                 const dt_ckpt_box *want, size_t nwant, float *local) {
    for (size_t i = 0; i < nwant; i++)
        DT_ASSERT(want[i].tensor < ntensors);
    if (!s->tensors)
        return read_unsharded(s, state, tensors, ntensors, want, nwant, local);
    char map[DT_CKPT_NAME_MAX + 8];
    snprintf(map, sizeof map, "%s%s", state, DT_CKPT_MAP_SUFFIX);
    const char *where = dt_ckpt_file(s->files[0]);
    for (size_t i = 0; i < nwant; i++) {
        const dt_ckpt_box *w = &want[i];
        const dt_ckpt_tensor *t = &tensors[w->tensor];
        size_t ci = 0;
        while (ci < s->ntensors && strcmp(s->tensors[ci].name, t->name) != 0)
            ci++;
        if (ci == s->ntensors)
            return dt_error_set(DT_ERR_MISMATCH,
                                "checkpoint %s has no tensor %s (was it written for another "
                                "model?)",
                                where, t->name);
        const dt_ckpt_tensor *c = &s->tensors[ci];
        if (memcmp(c->shape, t->shape, sizeof c->shape) != 0)
            return dt_error_set(DT_ERR_MISMATCH,
                                "checkpoint %s: tensor %s has shape %" PRIu64 "x%" PRIu64
                                "x%" PRIu64 ", this model's is %" PRIu64 "x%" PRIu64 "x%" PRIu64,
                                where, t->name, c->shape[0], c->shape[1], c->shape[2], t->shape[0],
                                t->shape[1], t->shape[2]);
        uint64_t covered = 0;
        for (size_t f = 0; f < s->nfiles; f++) {
            dt_ckpt_info mi, di;
            if (dt_ckpt_find(s->files[f], map, &mi) != DT_OK)
                continue;
            DT_CHECK(dt_ckpt_find(s->files[f], state, &di)); /* validated at open */
            const dt_ckpt_box *b = mi.data;
            for (size_t k = 0; k < mi.bytes / sizeof *b; k++)
                if (b[k].tensor == ci)
                    covered += copy_overlap(&b[k], di.data, w, local);
        }
        if (covered != dt_ckpt_box_volume(w))
            return dt_error_set(DT_ERR_MISMATCH,
                                "checkpoint %s: state %s of tensor %s holds %" PRIu64
                                " of the %" PRIu64 " values wanted from [%" PRIu64 ", %" PRIu64
                                ", %" PRIu64 "]",
                                where, state, t->name, covered, dt_ckpt_box_volume(w), w->begin[0],
                                w->begin[1], w->begin[2]);
    }
    return DT_OK;
}
