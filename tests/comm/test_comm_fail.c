/*
 * test_comm_fail.c — what happens when things go wrong, with real processes:
 *   - a rank is SIGKILLed in the middle of a collective: every survivor gets
 *     DT_ERR_PEER within 10 s, with a message naming the operation, its
 *     sequence number and the lost rank (ring and rhd allreduce, the
 *     recursive-doubling allgather, the single-copy shared-memory allgather);
 *   - ranks call different operations (count, op, dtype, root, order):
 *     every rank gets DT_ERR_MISMATCH;
 *   - a rank stopped with SIGSTOP: the others time out naming the call, its
 *     sequence number and the rank they wait for;
 *   - a process with the wrong job token is refused by the store;
 *   - a rank that gives up in a collective does not fail point-to-point
 *     calls of others that no longer need it: they complete, and the next
 *     collective reports the failure.
 */
#include "harness.h"

#include <signal.h>

static dt_group *init_world(void) {
    dt_group *g = NULL;
    ASSERT_OK(dt_group_init_from_env(&g));
    return g;
}

enum { VICTIM = 2 };

/* One collective of 16 MiB: long enough to die inside. */
static dt_status big_op(dt_group *w, float *v, size_t n, bool gather, int size, dt_work **work) {
    if (gather) /* in place: every rank owns n / size elements of v */
        return work ? dt_group_iallgather(w, v, v, n / (size_t)size, DT_F32, work)
                    : dt_group_allgather(w, v, v, n / (size_t)size, DT_F32);
    return work ? dt_group_iallreduce(w, v, v, n, DT_F32, DT_SUM, work)
                : dt_group_allreduce(w, v, v, n, DT_F32, DT_SUM);
}

/* The victim dies inside an allreduce (or allgather); every survivor must
 * name it, not a live neighbour that gave up because of it. */
static void kill_run(int rank, int size, bool gather) {
    dt_group *w = init_world();
    size_t n = 4 << 20; /* 16 MiB of f32 per call */
    float *v = malloc(n * sizeof *v);
    for (size_t i = 0; i < n; i++)
        v[i] = 1;
    for (int it = 0; it < 2; it++)
        ASSERT_OK(big_op(w, v, n, gather, size, NULL));
    ASSERT_OK(dt_group_barrier(w));
    if (rank == VICTIM) {
        /* let every survivor leave the barrier (a rank that dies at once
         * could close its sockets while a peer still finishes the barrier) */
        dt_sleep_ms(300);
        dt_work *work;
        ASSERT_OK(big_op(w, v, n, gather, size, &work));
        dt_sleep_ms(5);
        kill(getpid(), SIGKILL);
    }
    dt_status st = DT_OK;
    double t0 = 0;
    for (int it = 0; it < 1000 && st == DT_OK; it++) {
        t0 = dt_now();
        st = big_op(w, v, n, gather, size, NULL);
    }
    double took = dt_now() - t0;
    if (st != DT_ERR_PEER)
        TEST_FAILF("rank %d: expected DT_ERR_PEER, got %s: %s", rank, dt_status_name(st),
                   dt_last_error());
    printf("rank %d: DT_ERR_PEER after %.2f s: %s\n", rank, took, dt_last_error());
    ASSERT_TRUE(took < 10);
    ASSERT_CONTAINS(dt_last_error(), gather ? "allgather #" : "allreduce #");
    ASSERT_CONTAINS(dt_last_error(), "rank 2 is lost");
    /* later calls fail at once with the same status */
    ASSERT_STATUS(dt_group_barrier(w), DT_ERR_PEER);
    /* the failed call is over: no peer writes into my buffer any more */
    for (size_t i = 0; i < n; i++)
        v[i] = -1;
    dt_sleep_ms(200);
    for (size_t i = 0; i < n; i++)
        if (v[i] != -1)
            TEST_FAILF("rank %d: element %zu written after the failed call returned", rank, i);
    free(v);
    dt_group_destroy(w);
}

static void kill_case(int rank, int size) { kill_run(rank, size, false); }
static void kill_gather_case(int rank, int size) { kill_run(rank, size, true); }

/* Each scenario on a fresh sub-group (a failed group stays failed). The
 * mismatched call itself fails on every rank, even on one whose part could
 * complete alone (a broadcast root only sends); the group stays failed. */
static void expect_mismatch(dt_group *g, dt_status st, int rank, const char *scenario) {
    if (st != DT_ERR_MISMATCH)
        TEST_FAILF("%s: rank %d: expected DT_ERR_MISMATCH, got %s: %s", scenario, rank,
                   dt_status_name(st), st == DT_OK ? "" : dt_last_error());
    printf("%s: rank %d: %s\n", scenario, rank, dt_last_error());
    ASSERT_STATUS(dt_group_barrier(g), DT_ERR_MISMATCH);
}

/* Rank 1 passes one more element (count); rank 2 broadcasts while the
 * others allreduce (op): n floats, each on a fresh sub-group. */
static void count_op_mismatch(dt_group *w, int rank, size_t n, const char *prefix) {
    float buf[1024] = {0};
    char what[32];
    dt_group *g;
    ASSERT_OK(dt_group_split(w, 0, rank, &g));
    dt_status st = dt_group_allreduce(g, buf, buf, rank == 1 ? n + 1 : n, DT_F32, DT_SUM);
    snprintf(what, sizeof what, "%scount", prefix);
    expect_mismatch(g, st, rank, what);
    dt_group_destroy(g);

    ASSERT_OK(dt_group_split(w, 0, rank, &g));
    if (rank == 2)
        st = dt_group_broadcast(g, buf, n, DT_F32, 0);
    else
        st = dt_group_allreduce(g, buf, buf, n, DT_F32, DT_SUM);
    snprintf(what, sizeof what, "%sop", prefix);
    expect_mismatch(g, st, rank, what);
    dt_group_destroy(g);
}

static void mismatch_case(int rank, int size) {
    (void)size;
    dt_group *w = init_world();
    float buf[2048] = {0};
    dt_group *g;
    dt_status st;

    count_op_mismatch(w, rank, 1000, "");

    ASSERT_OK(dt_group_split(w, 0, rank, &g));
    st = dt_group_allreduce(g, buf, buf, 512, rank == 0 ? DT_I32 : DT_F32, DT_SUM);
    expect_mismatch(g, st, rank, "dtype");
    dt_group_destroy(g);

    ASSERT_OK(dt_group_split(w, 0, rank, &g));
    st = dt_group_broadcast(g, buf, 100, DT_F32, rank == 0 ? 0 : 1);
    expect_mismatch(g, st, rank, "root");
    dt_group_destroy(g);

    ASSERT_OK(dt_group_split(w, 0, rank, &g));
    if (rank == 0) {
        st = dt_group_allreduce(g, buf, buf, 100, DT_F32, DT_SUM);
        if (st == DT_OK)
            st = dt_group_allgather(g, buf, buf + 1024, 100, DT_F32);
    } else {
        st = dt_group_allgather(g, buf, buf + 1024, 100, DT_F32);
        if (st == DT_OK)
            st = dt_group_allreduce(g, buf, buf, 100, DT_F32, DT_SUM);
    }
    expect_mismatch(g, st, rank, "order");
    dt_group_destroy(g);

    /* the same on tiny messages (shm: the one-cache-line path) */
    count_op_mismatch(w, rank, 2, "small ");

    ASSERT_OK(dt_group_split(w, 0, rank, &g));
    if (rank == 0) {
        st = dt_group_reduce_scatter(g, buf, buf + 1024, 1, DT_F32, DT_SUM);
        if (st == DT_OK)
            st = dt_group_allgather(g, buf, buf + 1024, 1, DT_F32);
    } else {
        st = dt_group_allgather(g, buf, buf + 1024, 1, DT_F32);
        if (st == DT_OK)
            st = dt_group_reduce_scatter(g, buf, buf + 1024, 1, DT_F32, DT_SUM);
    }
    expect_mismatch(g, st, rank, "small order");
    dt_group_destroy(g);

    ASSERT_OK(dt_group_barrier(w)); /* the world is unharmed */
    dt_group_destroy(w);
}

/* A rank stopped (SIGSTOP) before a collective: after DT_TIMEOUT the
 * others get DT_ERR_TIMEOUT naming the call, its sequence number and the
 * rank they were waiting for (it used to say only "a peer is stuck").
 * Rank 0 then kills the stopped rank. */
static void stop_case(int rank, int size) {
    (void)size;
    dt_group *w = init_world();
    char path[256];
    snprintf(path, sizeof path, "/tmp/dt-%s.stopped", getenv("DT_JOB_ID"));
    float v[4] = {1, 2, 3, 4};
    ASSERT_OK(dt_group_allreduce(w, v, v, 4, DT_F32, DT_SUM)); /* #1 */
    if (rank == VICTIM) {
        FILE *f = fopen(path, "w");
        ASSERT_TRUE(f != NULL);
        fprintf(f, "%d\n", (int)getpid());
        fclose(f);
        raise(SIGSTOP);
        _exit(3); /* never reached: rank 0 kills it */
    }
    double t0 = dt_now();
    dt_status st = dt_group_allreduce(w, v, v, 4, DT_F32, DT_SUM); /* #2 */
    printf("rank %d: %s after %.1f s: %s\n", rank, dt_status_name(st), dt_now() - t0,
           dt_last_error());
    ASSERT_CONTAINS(dt_last_error(), "allreduce #2");
    /* Each survivor times out naming whom it waits for (rank 0: the
     * stopped rank, its ring neighbour or shared flag; rank 1: rank 2's
     * flag, or rank 0 in the ring), unless the other's timeout reaches it
     * first. */
    if (st == DT_ERR_TIMEOUT) {
        ASSERT_CONTAINS(dt_last_error(), rank == 0 ? "waiting for rank 2 " : "waiting for rank");
    } else {
        ASSERT_EQ(st, DT_ERR_PEER);
        ASSERT_CONTAINS(dt_last_error(), "gave up");
    }
    if (rank == 0) {
        int pid = 0;
        FILE *f = fopen(path, "r");
        ASSERT_TRUE(f != NULL && fscanf(f, "%d", &pid) == 1 && pid > 0);
        fclose(f);
        unlink(path);
        kill(pid, SIGKILL);
    }
    dt_group_destroy(w);
}

/* Ranks 1 and 2 are still inside point-to-point calls (rank 1 waits for
 * rank 2's late message) when ranks 0 and 3 disagree about collective #2
 * and give up. Rank 1 has everything it wanted from rank 0 already: its
 * batch must complete, and so must rank 2's send; collective #2 then
 * reports the mismatch on every rank. */
static void p2p_outlives_case(int rank, int size) {
    (void)size;
    dt_group *w = init_world();
    float v[4] = {1, 2, 3, 4}, a = (float)rank, b = -1, c = -1;
    ASSERT_OK(dt_group_allreduce(w, v, v, 4, DT_F32, DT_SUM)); /* #1 */
    if (rank == 0) {
        dt_p2p ops[2] = {{true, &a, 1, DT_F32, 1, 7}, {false, &b, 1, DT_F32, 1, 7}};
        ASSERT_OK(dt_group_sendrecv_batch(w, ops, 2));
        ASSERT_TRUE(b == 1.0f);
    } else if (rank == 1) {
        dt_p2p ops[3] = {{true, &a, 1, DT_F32, 0, 7},
                         {false, &b, 1, DT_F32, 0, 7},
                         {false, &c, 1, DT_F32, 2, 8}};
        ASSERT_OK(dt_group_sendrecv_batch(w, ops, 3));
        ASSERT_TRUE(b == 0.0f && c == 2.0f);
    } else if (rank == 2) {
        usleep(1000 * 1000); /* ranks 0 and 3 have given up by now */
        ASSERT_OK(dt_group_send(w, &a, 1, DT_F32, 1, 8));
    }
    size_t n = rank == 3 ? 5 : 4; /* rank 3 calls a different count */
    float x[5] = {0};
    ASSERT_STATUS(dt_group_allreduce(w, x, x, n, DT_F32, DT_SUM), DT_ERR_MISMATCH); /* #2 */
    dt_group_destroy(w);
}

static void token_case(int rank, int size) {
    (void)size;
    if (rank == 1) { /* an impostor: right address, wrong secret */
        setenv("DT_JOB_TOKEN", "0123456789abcdef0123456789abcdef", 1);
        dt_group *g = NULL;
        ASSERT_STATUS(dt_group_init_from_env(&g), DT_ERR_AUTH);
        ASSERT_CONTAINS(dt_last_error(), "token");
        ASSERT_TRUE(g == NULL);
        return;
    }
    /* rank 0 never sees rank 1 join and gives up after DT_TIMEOUT */
    dt_group *g = NULL;
    ASSERT_STATUS(dt_group_init_from_env(&g), DT_ERR_TIMEOUT);
    ASSERT_CONTAINS(dt_last_error(), "w/info/1");
}

static void bad_env_case(int rank, int size) {
    (void)size;
    (void)rank;
    dt_group *g = NULL;
    setenv("DT_JOB_TOKEN", "short", 1);
    ASSERT_STATUS(dt_group_init_from_env(&g), DT_ERR_INVALID);
    ASSERT_CONTAINS(dt_last_error(), "DT_JOB_TOKEN");
    unsetenv("DT_JOB_TOKEN");
    ASSERT_STATUS(dt_group_init_from_env(&g), DT_ERR_INVALID);
    setenv("DT_RANK", "5", 1);
    ASSERT_STATUS(dt_group_init_from_env(&g), DT_ERR_INVALID);
    ASSERT_CONTAINS(dt_last_error(), "DT_RANK");
}

#define C(name, n, fn, victim, ...)                                                                \
    { name, n, fn, {__VA_ARGS__}, victim, 60 }
static const hcase cases[] = {
    C("kill_shm_4", 4, kill_case, VICTIM, "DT_TIMEOUT=30", NULL),
    C("kill_tcp_4", 4, kill_case, VICTIM, "DT_TIMEOUT=30", "DT_TRANSPORT=tcp", NULL),
    /* the single-copy allgather: survivors write into the victim's memory */
    C("kill_shm_allgather_4", 4, kill_gather_case, VICTIM, "DT_TIMEOUT=30", "DT_SHM_CMA=on", NULL),
    /* the recursive-doubling paths over TCP: a survivor's neighbour gives up
     * mid-frame on every socket, so its ABORT frame cannot be read in band */
    C("kill_tcp_rhd_4", 4, kill_case, VICTIM, "DT_TIMEOUT=30", "DT_TRANSPORT=tcp", "DT_ALGO=rhd",
      NULL),
    C("kill_tcp_allgather_4", 4, kill_gather_case, VICTIM, "DT_TIMEOUT=30", "DT_TRANSPORT=tcp",
      NULL),
    C("mismatch_shm_3", 3, mismatch_case, -1, "DT_TIMEOUT=20", NULL),
    C("mismatch_tcp_3", 3, mismatch_case, -1, "DT_TIMEOUT=20", "DT_TRANSPORT=tcp", NULL),
    C("stop_shm_3", 3, stop_case, VICTIM, "DT_TIMEOUT=3", NULL),
    C("stop_tcp_3", 3, stop_case, VICTIM, "DT_TIMEOUT=3", "DT_TRANSPORT=tcp", "DT_ALGO=ring", NULL),
    C("p2p_outlives_shm_4", 4, p2p_outlives_case, -1, "DT_TIMEOUT=20", "DT_ALGO=ring", NULL),
    C("p2p_outlives_tcp_4", 4, p2p_outlives_case, -1, "DT_TIMEOUT=20", "DT_ALGO=ring",
      "DT_TRANSPORT=tcp", NULL),
    C("wrong_token_2", 2, token_case, -1, "DT_TIMEOUT=2", NULL),
    C("bad_env_1", 2, bad_env_case, -1, NULL),
};

int main(int argc, char **argv) {
    return harness_main(argc, argv, cases, (int)(sizeof cases / sizeof cases[0]));
}
