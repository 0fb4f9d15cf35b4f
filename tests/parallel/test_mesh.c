/*
 * test_mesh.c — the device mesh: the rank formula against an independent
 * enumeration for every axis order and several shapes (one process), and
 * real groups of 8 ranks (oversubscribed) for every one of the 24 axis
 * orders: each axis group has the members the formula names, in
 * coordinate order, and communicates.
 */
#include "comm/harness.h"
#include "dtrain/parallel.h"

/* The 24 orders, generated (not listed) so none is forgotten. */
static int orders(dt_axis out[24][DT_AXIS_COUNT]) {
    int n = 0;
    for (int a = 0; a < 4; a++)
        for (int b = 0; b < 4; b++)
            for (int c = 0; c < 4; c++)
                for (int d = 0; d < 4; d++)
                    if (a != b && a != c && a != d && b != c && b != d && c != d) {
                        dt_axis o[4] = {a, b, c, d};
                        memcpy(out[n++], o, sizeof o);
                    }
    return n;
}

/* The formula written out independently: nested loops, slowest axis
 * outermost, counting ranks. */
static void check_formula(const dt_mesh_shape *s) {
    const dt_axis *o = s->order;
    int world = 1, r = 0;
    for (int a = 0; a < DT_AXIS_COUNT; a++)
        world *= s->degree[a];
    int c[DT_AXIS_COUNT];
    for (c[o[3]] = 0; c[o[3]] < s->degree[o[3]]; c[o[3]]++)
        for (c[o[2]] = 0; c[o[2]] < s->degree[o[2]]; c[o[2]]++)
            for (c[o[1]] = 0; c[o[1]] < s->degree[o[1]]; c[o[1]]++)
                for (c[o[0]] = 0; c[o[0]] < s->degree[o[0]]; c[o[0]]++, r++) {
                    ASSERT_EQ(dt_mesh_rank_of(s, c), r);
                    int back[DT_AXIS_COUNT];
                    dt_mesh_coords_of(s, r, back);
                    ASSERT_EQ(memcmp(back, c, sizeof c), 0);
                }
    ASSERT_EQ(r, world);
}

static void formula_case(int rank, int size) {
    (void)rank, (void)size;
    dt_axis ord[24][DT_AXIS_COUNT];
    ASSERT_EQ(orders(ord), 24);
    static const int shapes[][DT_AXIS_COUNT] = {{1, 1, 1, 1}, {2, 2, 2, 1}, {3, 2, 1, 2},
                                                {1, 4, 1, 1}, {5, 1, 3, 1}, {2, 3, 2, 2}};
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++)
        for (int i = 0; i < 24; i++) {
            dt_mesh_shape s;
            memcpy(s.degree, shapes[k], sizeof s.degree);
            memcpy(s.order, ord[i], sizeof s.order);
            int w = s.degree[0] * s.degree[1] * s.degree[2] * s.degree[3];
            ASSERT_OK(dt_mesh_shape_validate(&s, w));
            check_formula(&s);
        }
    /* The default order is Megatron's: tp fastest, then cp, dp, pp. */
    dt_mesh_shape s = dt_mesh_shape_default();
    s.degree[DT_AXIS_DP] = 2;
    s.degree[DT_AXIS_TP] = 2;
    s.degree[DT_AXIS_PP] = 2;
    int c[DT_AXIS_COUNT] = {0};
    c[DT_AXIS_TP] = 1;
    ASSERT_EQ(dt_mesh_rank_of(&s, c), 1);
    c[DT_AXIS_TP] = 0, c[DT_AXIS_DP] = 1;
    ASSERT_EQ(dt_mesh_rank_of(&s, c), 2);
    c[DT_AXIS_DP] = 0, c[DT_AXIS_PP] = 1;
    ASSERT_EQ(dt_mesh_rank_of(&s, c), 4);
    char buf[64];
    ASSERT_TRUE(strcmp(dt_mesh_format(&s, buf, sizeof buf), "dp 2 x tp 2 x pp 2") == 0);
    s = dt_mesh_shape_default();
    ASSERT_TRUE(strcmp(dt_mesh_format(&s, buf, sizeof buf), "1 rank") == 0);

    /* Orders parse; bad ones are refused naming the knob and the text. */
    dt_axis o[DT_AXIS_COUNT];
    ASSERT_OK(dt_mesh_order_parse("--mesh-order", "pp-dp-cp-tp", o));
    ASSERT_EQ(o[0], DT_AXIS_PP);
    ASSERT_EQ(o[3], DT_AXIS_TP);
    const char *bad[] = {"tp-cp-dp", "tp-cp-dp-pp-tp", "tp-tp-dp-pp", "tp-cp-dp-xx",
                         "",         "tp--dp-pp"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ASSERT_STATUS(dt_mesh_order_parse("--mesh-order", bad[i], o), DT_ERR_INVALID);
        ASSERT_CONTAINS(dt_last_error(), "--mesh-order");
    }
    /* A shape that does not multiply to the world names every degree. */
    s = dt_mesh_shape_default();
    s.degree[DT_AXIS_TP] = 3;
    ASSERT_STATUS(dt_mesh_shape_validate(&s, 4), DT_ERR_INVALID);
    ASSERT_CONTAINS(dt_last_error(), "--tp 3");
    ASSERT_CONTAINS(dt_last_error(), "the job has 4");
    s.degree[DT_AXIS_TP] = 0;
    ASSERT_STATUS(dt_mesh_shape_validate(&s, 1), DT_ERR_INVALID);
    ASSERT_CONTAINS(dt_last_error(), "--tp 0");
    /* A single process: no groups, coordinate 0 everywhere. */
    dt_mesh *m;
    s = dt_mesh_shape_default();
    ASSERT_OK(dt_mesh_create(&m, NULL, &s));
    for (int a = 0; a < DT_AXIS_COUNT; a++) {
        ASSERT_TRUE(dt_mesh_group(m, (dt_axis)a) == NULL);
        ASSERT_EQ(dt_mesh_coord(m, (dt_axis)a), 0);
    }
    dt_mesh_destroy(m);
}

/* Every axis group of this rank holds exactly the ranks the formula names,
 * ordered by coordinate, and an allreduce over it sums their world ranks. */
static void check_mesh(dt_group *w, const dt_mesh_shape *s) {
    dt_mesh *m;
    ASSERT_OK(dt_mesh_create(&m, w, s));
    int rank = dt_group_rank(w), c[DT_AXIS_COUNT];
    dt_mesh_coords_of(s, rank, c);
    for (int a = 0; a < DT_AXIS_COUNT; a++) {
        dt_group *g = dt_mesh_group(m, (dt_axis)a);
        ASSERT_EQ(dt_mesh_coord(m, (dt_axis)a), c[a]);
        ASSERT_EQ(dt_group_size(g), s->degree[a]);
        ASSERT_EQ(dt_group_rank(g), c[a]);
        int64_t want = 0;
        for (int i = 0; i < s->degree[a]; i++) {
            int ci[DT_AXIS_COUNT];
            memcpy(ci, c, sizeof ci);
            ci[a] = i;
            int r = dt_mesh_rank_of(s, ci);
            if (dt_group_world_rank(g, i) != r)
                TEST_FAILF("axis %s member %d: world rank %d, formula %d", dt_axis_names[a], i,
                           dt_group_world_rank(g, i), r);
            want += r;
        }
        int64_t mine = rank, sum = -1;
        ASSERT_OK(dt_group_allreduce(g, &mine, &sum, 1, DT_I64, DT_SUM));
        ASSERT_EQ(sum, want);
    }
    dt_mesh_destroy(m);
}

static void orders_case(int rank, int size) {
    (void)rank;
    dt_group *w = NULL;
    ASSERT_OK(dt_group_init_from_env(&w));
    dt_axis ord[24][DT_AXIS_COUNT];
    orders(ord);
    /* 8 = 2 x 2 x 2 x 1, with the degree-1 axis rotating so that every
     * axis is once the trivial one. */
    for (int i = 0; i < 24; i++) {
        dt_mesh_shape s;
        for (int a = 0; a < DT_AXIS_COUNT; a++)
            s.degree[a] = a == i % DT_AXIS_COUNT ? 1 : 2;
        memcpy(s.order, ord[i], sizeof s.order);
        ASSERT_EQ(s.degree[0] * s.degree[1] * s.degree[2] * s.degree[3], size);
        check_mesh(w, &s);
    }
    /* Uneven degrees: dp 2 x tp 4, and all 8 on one axis. */
    dt_mesh_shape s = dt_mesh_shape_default();
    s.degree[DT_AXIS_DP] = 2;
    s.degree[DT_AXIS_TP] = 4;
    check_mesh(w, &s);
    s = dt_mesh_shape_default();
    s.degree[DT_AXIS_PP] = 8;
    check_mesh(w, &s);
    /* A mismatched shape is refused on every rank before any split. */
    s = dt_mesh_shape_default();
    s.degree[DT_AXIS_TP] = 3;
    dt_mesh *m = NULL;
    ASSERT_STATUS(dt_mesh_create(&m, w, &s), DT_ERR_INVALID);
    ASSERT_TRUE(m == NULL);
    dt_group_destroy(w);
}

int main(int argc, char **argv) {
    static const hcase cases[] = {
        {"formula", 1, formula_case, {NULL}, -1, 60},
        {"orders_8", 8, orders_case, {NULL}, -1, 240},
    };
    return harness_main(argc, argv, cases, (int)(sizeof cases / sizeof cases[0]));
}
