/*
 * test_comm_elastic.c — elastic memberships (dtrain/elastic.h) with real
 * processes: a rank killed mid-job, the store's host killed, a newcomer
 * let in, and a job that falls below its minimum.
 *
 *   shrink   4 ranks; rank 2 SIGKILLs itself; the 3 others form generation
 *            1 (ranks 0, 1, 2 in their old order) and their allreduce sums
 *            exactly the survivors' values.
 *   host     the same with rank 0, which serves the store: the store moves
 *            to the next member and the job goes on at 3.
 *   twice    rank 3 dies, then rank 0 of the 3 left (the store's host):
 *            two generations, 2 ranks at the end.
 *   grow     3 ranks run; a 4th process joins through the job's address
 *            (dt_elastic_options.join) at a step boundary they agree on,
 *            receives the step by broadcast and takes part in the sums.
 *   below    --elastic 4:4 and a rank dies: every survivor gets DT_ERR_PEER
 *            saying the job is below its minimum, within seconds.
 * Each case checks the sums against the values of the processes that are
 * members, so a rank left in twice or a dead one counted would fail.
 */
#include "comm/harness.h"
#include "dtrain/elastic.h"

#include <signal.h>
#include <stdlib.h>

/* Every process adds its original rank + 1 (newcomers: 100). */
static double value_of(int rank0) { return rank0 >= 0 ? rank0 + 1 : 100; }

typedef struct proc {
    dt_elastic *e;
    dt_group *world;
    int rank0; /* rank in generation 0, -1 for a newcomer */
    int64_t step;
} proc;

/* One step: an allreduce of each member's value and of 1 (the count);
 * checks the sum against the values of the members (gathered too). */
static dt_status step_once(proc *p) {
    int n = dt_group_size(p->world);
    double mine[2] = {value_of(p->rank0), 1};
    DT_CHECK(dt_group_allreduce(p->world, mine, mine, 2, DT_F64, DT_SUM));
    double *all = calloc((size_t)n, sizeof *all);
    double v = value_of(p->rank0);
    dt_status st = dt_group_allgather(p->world, &v, all, 1, DT_F64);
    if (st == DT_OK) {
        double sum = 0;
        for (int i = 0; i < n; i++)
            sum += all[i];
        ASSERT_EQ((int)mine[1], n);
        ASSERT_TRUE(mine[0] == sum);
    }
    free(all);
    return st;
}

/* After a failed step (or to let newcomers in): revoke, reform, continue
 * from the most advanced member's step. */
static void reform(proc *p, bool failed, dt_elastic_view *v) {
    if (failed)
        dt_group_abort(p->world);
    dt_group_destroy(p->world);
    p->world = NULL;
    ASSERT_OK(dt_elastic_reform(p->e, p->step, &p->world, v));
    ASSERT_EQ(dt_group_size(p->world), v->size);
    ASSERT_EQ(dt_group_rank(p->world), v->rank);
    int64_t s = p->step;
    ASSERT_OK(dt_group_broadcast(p->world, &s, 1, DT_I64, v->root));
    ASSERT_EQ(s, v->root_step);
    p->step = s;
}

static void start(proc *p, int rank, int min, int max) {
    p->rank0 = rank;
    p->step = 0;
    dt_elastic_options o = {.min = min, .max = max, .timeout = 20};
    ASSERT_OK(dt_elastic_create(&p->e, &o, &p->world));
    ASSERT_EQ(dt_group_rank(p->world), rank);
    ASSERT_EQ(dt_elastic_generation(p->e), 0);
}

static void finish(proc *p) {
    dt_group_destroy(p->world);
    dt_elastic_destroy(p->e);
}

/* Run 8 steps; the process with original rank `victim` dies at step 3
 * and, when victim2 >= 0, the new rank 0 at step 5. */
static void run_kills(int rank, int victim, int victim2, int expect_size) {
    proc p;
    start(&p, rank, 2, 4);
    int changes = 0;
    while (p.step < 8) {
        if (p.step == 3 && p.rank0 == victim)
            raise(SIGKILL);
        if (victim2 >= 0 && changes == 1 && p.step == 5 && dt_group_rank(p.world) == 0)
            _exit(0); /* dies without a word too (the harness expects one SIGKILL) */
        double t0 = dt_now();
        dt_status st = step_once(&p);
        if (st == DT_OK) {
            p.step++;
            continue;
        }
        ASSERT_EQ(st, DT_ERR_PEER);
        dt_elastic_view v;
        reform(&p, true, &v);
        changes++;
        ASSERT_EQ(v.generation, changes);
        ASSERT_EQ(v.lost, 1);
        ASSERT_EQ(v.joined, 0);
        /* survivors keep their order */
        ASSERT_TRUE(v.prev_rank >= 0);
        ASSERT_TRUE(v.rank <= v.prev_rank);
        double took = dt_now() - t0;
        if (took > 5)
            TEST_FAILF("recovery took %.2f s", took);
        printf("rank %d: generation %d, rank %d of %d, lost %s, %.3f s\n", rank, v.generation,
               v.rank, v.size, v.lost_ranks, took);
    }
    ASSERT_EQ(dt_group_size(p.world), expect_size);
    ASSERT_EQ(changes, victim2 >= 0 ? 2 : 1);
    finish(&p);
}

static void c_shrink(int rank, int size) {
    (void)size;
    run_kills(rank, 2, -1, 3);
}

static void c_host(int rank, int size) {
    (void)size;
    run_kills(rank, 0, -1, 3);
}

static void c_twice(int rank, int size) {
    (void)size;
    run_kills(rank, 3, 0, 2);
}

/* Ranks 0-2 are the job; rank 3 is a newcomer given the job's address. */
static void c_grow(int rank, int size) {
    (void)size;
    proc p = {0};
    if (rank == 3) {
        char join[64];
        snprintf(join, sizeof join, "127.0.0.1:%s", getenv("DT_MASTER_PORT"));
        unsetenv("DT_RANK");
        dt_elastic_options o = {.min = 2, .max = 4, .join = join, .timeout = 20};
        p.rank0 = -1;
        p.step = -1;
        ASSERT_OK(dt_elastic_create(&p.e, &o, &p.world));
        ASSERT_TRUE(p.world == NULL);
        ASSERT_EQ(dt_elastic_generation(p.e), -1);
        dt_elastic_view v;
        ASSERT_OK(dt_elastic_reform(p.e, -1, &p.world, &v));
        ASSERT_EQ(v.prev_rank, -1);
        ASSERT_EQ(v.rank, 3);
        ASSERT_EQ(v.size, 4);
        int64_t s = -1;
        ASSERT_OK(dt_group_broadcast(p.world, &s, 1, DT_I64, v.root));
        ASSERT_TRUE(s >= 3);
        p.step = s;
    } else {
        setenv("DT_WORLD_SIZE", "3", 1);
        start(&p, rank, 2, 4);
    }
    bool grown = rank == 3;
    while (p.step < 10) {
        ASSERT_OK(step_once(&p));
        p.step++;
        if (grown || p.step < 3)
            continue;
        /* Rank 0 looks for newcomers once a step and tells the others. */
        int32_t n = 0;
        if (dt_group_rank(p.world) == 0)
            ASSERT_OK(dt_elastic_joiners(p.e, &n));
        ASSERT_OK(dt_group_broadcast(p.world, &n, 1, DT_I32, 0));
        if (n == 0) {
            usleep(20000);
            continue;
        }
        ASSERT_EQ(n, 1);
        dt_elastic_view v;
        reform(&p, false, &v);
        ASSERT_EQ(v.size, 4);
        ASSERT_EQ(v.joined, 1);
        ASSERT_EQ(v.lost, 0);
        ASSERT_EQ(v.rank, rank);
        grown = true;
    }
    ASSERT_EQ(dt_group_size(p.world), 4);
    finish(&p);
}

static void c_below(int rank, int size) {
    (void)size;
    proc p;
    start(&p, rank, 4, 4);
    ASSERT_OK(step_once(&p)); /* everyone is through creation */
    if (rank == 1)
        raise(SIGKILL);
    double t0 = dt_now();
    dt_status st = step_once(&p);
    ASSERT_EQ(st, DT_ERR_PEER);
    dt_group_abort(p.world);
    dt_group_destroy(p.world);
    p.world = NULL;
    dt_elastic_view v;
    st = dt_elastic_reform(p.e, 0, &p.world, &v);
    ASSERT_EQ(st, DT_ERR_PEER);
    if (!strstr(dt_last_error(), "below --elastic 4:4") || !strstr(dt_last_error(), "ranks 1"))
        TEST_FAILF("unexpected message: %s", dt_last_error());
    ASSERT_TRUE(dt_now() - t0 < 5);
    ASSERT_TRUE(p.world == NULL);
    dt_elastic_destroy(p.e);
}

static const hcase cases[] = {
    {"shrink", 4, c_shrink, {NULL}, 2, 60}, {"host", 4, c_host, {NULL}, 0, 60},
    {"twice", 4, c_twice, {NULL}, 3, 60},   {"grow", 4, c_grow, {NULL}, -1, 60},
    {"below", 4, c_below, {NULL}, 1, 60},
};

int main(int argc, char **argv) {
    return harness_main(argc, argv, cases, sizeof cases / sizeof cases[0]);
}
