/*
 * mesh.c — the device mesh: world rank <-> (dp, tp, pp, cp) coordinates and
 * one group per axis (the formula and a picture are in parallel.h).
 *
 * Invariants:
 *   - dt_mesh_rank_of and dt_mesh_coords_of are inverse bijections between
 *     [0, world) and the grid; nothing else in the code base computes a rank
 *     from coordinates.
 *   - The group of axis a is made by one dt_group_split of the world with
 *     color = this rank's linear index over the OTHER axes and key = its
 *     coordinate on a, so group rank == coordinate on a.
 */
#include "dtrain/parallel.h"

#include <stdio.h>
#include <string.h>

const char *const dt_axis_names[DT_AXIS_COUNT] = {"dp", "tp", "pp", "cp"};

struct dt_mesh {
    dt_mesh_shape s;
    dt_group *world;                /* borrowed */
    dt_group *group[DT_AXIS_COUNT]; /* owned; NULL in a single process */
    dt_group *replicas;             /* dp x cp; owned when cp > 1, else group[DT_AXIS_DP] */
    int coord[DT_AXIS_COUNT];       /* this rank's coordinates */
    int rank, size;                 /* in the world */
};

dt_mesh_shape dt_mesh_shape_default(void) {
    return (dt_mesh_shape){.degree = {1, 1, 1, 1},
                           .order = {DT_AXIS_TP, DT_AXIS_CP, DT_AXIS_DP, DT_AXIS_PP}};
}

static int axis_by_name(const char *s, size_t len) {
    for (int a = 0; a < DT_AXIS_COUNT; a++)
        if (strlen(dt_axis_names[a]) == len && strncmp(s, dt_axis_names[a], len) == 0)
            return a;
    return -1;
}

dt_status dt_mesh_order_parse(const char *knob, const char *text, dt_axis order[DT_AXIS_COUNT]) {
    dt_axis got[DT_AXIS_COUNT];
    bool seen[DT_AXIS_COUNT] = {false};
    const char *p = text ? text : "";
    int n = 0;
    bool end = false; /* the last axis read ended the text */
    while (n < DT_AXIS_COUNT && !end) {
        const char *dash = strchr(p, '-');
        size_t len = dash ? (size_t)(dash - p) : strlen(p);
        int a = axis_by_name(p, len);
        if (a < 0 || seen[a])
            break;
        seen[a] = true;
        got[n++] = (dt_axis)a;
        end = !dash;
        p = dash ? dash + 1 : p;
    }
    if (n != DT_AXIS_COUNT || !end)
        return dt_error_set(DT_ERR_INVALID,
                            "%s \"%s\": expected the four axes tp, cp, dp, pp each once, joined "
                            "by '-', fastest first (e.g. tp-cp-dp-pp)",
                            knob, text ? text : "(null)");
    memcpy(order, got, sizeof got);
    return DT_OK;
}

dt_status dt_mesh_shape_validate(const dt_mesh_shape *s, int world) {
    bool seen[DT_AXIS_COUNT] = {false};
    for (int k = 0; k < DT_AXIS_COUNT; k++) {
        if ((unsigned)s->order[k] >= DT_AXIS_COUNT || seen[s->order[k]])
            return dt_error_set(DT_ERR_INVALID,
                                "mesh order: entry %d (%d) repeats an axis or is not one", k,
                                (int)s->order[k]);
        seen[s->order[k]] = true;
    }
    long long prod = 1;
    for (int a = 0; a < DT_AXIS_COUNT; a++) {
        if (s->degree[a] < 1)
            return dt_error_set(DT_ERR_INVALID, "--%s %d: must be at least 1", dt_axis_names[a],
                                s->degree[a]);
        prod *= s->degree[a];
        if (prod > (1 << 24))
            break;
    }
    if (prod != world)
        return dt_error_set(DT_ERR_INVALID,
                            "--dp %d x --tp %d x --pp %d x --cp %d = %lld ranks, but the job has "
                            "%d",
                            s->degree[DT_AXIS_DP], s->degree[DT_AXIS_TP], s->degree[DT_AXIS_PP],
                            s->degree[DT_AXIS_CP], prod, world);
    return DT_OK;
}

int dt_mesh_rank_of(const dt_mesh_shape *s, const int coord[DT_AXIS_COUNT]) {
    int r = 0;
    for (int k = DT_AXIS_COUNT - 1; k >= 0; k--) {
        dt_axis a = s->order[k];
        DT_ASSERT(coord[a] >= 0 && coord[a] < s->degree[a]);
        r = r * s->degree[a] + coord[a];
    }
    return r;
}

void dt_mesh_coords_of(const dt_mesh_shape *s, int rank, int coord[DT_AXIS_COUNT]) {
    for (int k = 0; k < DT_AXIS_COUNT; k++) {
        dt_axis a = s->order[k];
        coord[a] = rank % s->degree[a];
        rank /= s->degree[a];
    }
    DT_ASSERT(rank == 0);
}

char *dt_mesh_format(const dt_mesh_shape *s, char *buf, size_t len) {
    size_t off = 0;
    buf[0] = '\0';
    for (int a = 0; a < DT_AXIS_COUNT; a++) {
        if (s->degree[a] == 1)
            continue;
        int w = snprintf(buf + off, len - off, "%s%s %d", off ? " x " : "", dt_axis_names[a],
                         s->degree[a]);
        if (w < 0 || (size_t)w >= len - off)
            return buf;
        off += (size_t)w;
    }
    if (off == 0)
        snprintf(buf, len, "1 rank");
    return buf;
}

/* This rank's index over every axis but `skip` (the split color). */
static int color_without(const dt_mesh_shape *s, const int coord[DT_AXIS_COUNT], dt_axis skip) {
    int c = 0;
    for (int k = DT_AXIS_COUNT - 1; k >= 0; k--) {
        dt_axis a = s->order[k];
        if (a != skip)
            c = c * s->degree[a] + coord[a];
    }
    return c;
}

dt_status dt_mesh_create(dt_mesh **out, dt_group *world, const dt_mesh_shape *s) {
    *out = NULL;
    int size = world ? dt_group_size(world) : 1, rank = world ? dt_group_rank(world) : 0;
    DT_CHECK(dt_mesh_shape_validate(s, size));
    dt_mesh *m = dt_calloc(1, sizeof *m);
    if (!m)
        return DT_ERR_NOMEM;
    m->s = *s;
    m->world = world;
    m->rank = rank;
    m->size = size;
    dt_mesh_coords_of(s, rank, m->coord);
    dt_status st = DT_OK;
    for (int a = 0; a < DT_AXIS_COUNT && world; a++) {
        st = dt_group_split(world, color_without(s, m->coord, (dt_axis)a), m->coord[a],
                            &m->group[a]);
        if (st != DT_OK) {
            dt_error_prefix("mesh: the %s group", dt_axis_names[a]);
            dt_mesh_destroy(m);
            return st;
        }
    }
    if (st == DT_OK && world && s->degree[DT_AXIS_CP] > 1) {
        int c = m->coord[DT_AXIS_TP] + s->degree[DT_AXIS_TP] * m->coord[DT_AXIS_PP];
        st = dt_group_split(world, c, dt_mesh_replica_rank(s, m->coord), &m->replicas);
        if (st != DT_OK) {
            dt_error_prefix("mesh: the dp x cp group");
            dt_mesh_destroy(m);
            return st;
        }
    } else {
        m->replicas = m->group[DT_AXIS_DP];
    }
    /* Tensor parallelism communicates in every layer: its ranks belong on
     * one host, where shared memory carries it. */
    dt_group *tp = m->group[DT_AXIS_TP];
    if (tp && dt_group_local_size(tp) != dt_group_size(tp) && m->coord[DT_AXIS_TP] == 0)
        DT_WARN("the tensor-parallel group of world rank %d spans hosts (%d of its %d ranks on "
                "this host): its per-layer traffic goes over the network; launch the ranks of "
                "a tp group on one host or choose another --mesh-order",
                rank, dt_group_local_size(tp), dt_group_size(tp));
    *out = m;
    return DT_OK;
}

void dt_mesh_destroy(dt_mesh *m) {
    if (!m)
        return;
    if (m->replicas != m->group[DT_AXIS_DP])
        dt_group_destroy(m->replicas);
    for (int a = 0; a < DT_AXIS_COUNT; a++)
        dt_group_destroy(m->group[a]);
    dt_free(m);
}

const dt_mesh_shape *dt_mesh_get_shape(const dt_mesh *m) { return &m->s; }
dt_group *dt_mesh_world(const dt_mesh *m) { return m->world; }
dt_group *dt_mesh_group(const dt_mesh *m, dt_axis a) { return m->group[a]; }
int dt_mesh_coord(const dt_mesh *m, dt_axis a) { return m->coord[a]; }
int dt_mesh_degree(const dt_mesh *m, dt_axis a) { return m->s.degree[a]; }
int dt_mesh_rank(const dt_mesh *m) { return m->rank; }
int dt_mesh_size(const dt_mesh *m) { return m->size; }
dt_group *dt_mesh_replica_group(const dt_mesh *m) { return m->replicas; }
int dt_mesh_replica_rank(const dt_mesh_shape *s, const int coord[DT_AXIS_COUNT]) {
    return coord[DT_AXIS_DP] * s->degree[DT_AXIS_CP] + coord[DT_AXIS_CP];
}
int dt_mesh_replica_size(const dt_mesh_shape *s) {
    return s->degree[DT_AXIS_DP] * s->degree[DT_AXIS_CP];
}
