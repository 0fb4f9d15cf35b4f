/*
 * test_comm_init.c — groups created from explicit options (dt_group_init)
 * instead of the environment, and dt_job_info_read.
 *
 * The harness starts the ranks with DT_* set; each case first builds the
 * usual world group from them, uses it as the side channel a foreign
 * runtime would be (rank 0's on_listen broadcasts the port it got), then
 * removes every DT_* membership variable so that dt_group_init cannot lean
 * on them.
 */
#include "harness.h"

typedef struct meet {
    int32_t port;
    char token[33];
} meet;

/* on_listen of rank 0: tell the others where to meet over the world group. */
static dt_status announce(void *arg, int port) {
    dt_group *w = arg;
    meet m = {.port = port};
    snprintf(m.token, sizeof m.token, "%s", "0123456789abcdef0123456789ABCDEF");
    return dt_group_broadcast(w, &m, sizeof m, DT_U8, 0);
}

static void forget_env(void) {
    static const char *const vars[] = {"DT_RANK",        "DT_WORLD_SIZE", "DT_MASTER_ADDR",
                                       "DT_MASTER_PORT", "DT_JOB_TOKEN",  "DT_JOB_ID"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++)
        unsetenv(vars[i]);
}

static void explicit_case(int rank, int size) {
    dt_group *w = NULL;
    ASSERT_OK(dt_group_init_from_env(&w));
    forget_env();
    dt_group_options o = {.rank = rank,
                          .size = size,
                          .master_addr = "127.0.0.1",
                          .job_id = "explicit",
                          .timeout = 1.0,
                          .on_listen = announce,
                          .on_listen_arg = w};
    meet m = {0};
    if (rank != 0) {
        ASSERT_OK(dt_group_broadcast(w, &m, sizeof m, DT_U8, 0));
        ASSERT_TRUE(m.port > 0);
        o.master_port = m.port;
        o.token = m.token;
    } else {
        o.token = "0123456789abcdef0123456789ABCDEF"; /* port 0: any free one */
    }
    dt_group *g = NULL;
    ASSERT_OK(dt_group_init(&g, &o));
    ASSERT_EQ(dt_group_rank(g), rank);
    ASSERT_EQ(dt_group_size(g), size);
    int32_t v = rank + 1, sum = 0;
    ASSERT_OK(dt_group_allreduce(g, &v, &sum, 1, DT_I32, DT_SUM));
    ASSERT_EQ(sum, size * (size + 1) / 2);

    /* The options' timeout (1 s) bounds waits, not DT_TIMEOUT (60 s in the
     * harness): a receive nobody answers fails within a few seconds. */
    ASSERT_OK(dt_group_barrier(w));
    if (rank == 1) {
        double t0 = dt_now();
        float x;
        ASSERT_STATUS(dt_group_recv(g, &x, 1, DT_F32, 0, 9), DT_ERR_TIMEOUT);
        double took = dt_now() - t0;
        if (took < 0.9 || took > 10)
            TEST_FAILF("recv timed out after %.2f s, want about 1 s", took);
    }
    ASSERT_OK(dt_group_barrier(w));
    dt_group_destroy(g);

    /* Bad options are refused, naming what is wrong. */
    dt_group_options bad = {.rank = size, .size = size};
    ASSERT_STATUS(dt_group_init(&g, &bad), DT_ERR_INVALID);
    ASSERT_CONTAINS(dt_last_error(), "rank");
    bad = (dt_group_options){.rank = 1, .size = 2, .master_port = 0, .token = o.token};
    ASSERT_STATUS(dt_group_init(&g, &bad), DT_ERR_INVALID);
    ASSERT_CONTAINS(dt_last_error(), "port 0");
    bad = (dt_group_options){.rank = 0, .size = 2, .master_port = 1, .token = "xyz"};
    ASSERT_STATUS(dt_group_init(&g, &bad), DT_ERR_INVALID);
    ASSERT_CONTAINS(dt_last_error(), "xyz");
    ASSERT_TRUE(g == NULL);

    /* A world of one needs neither a token nor a port. */
    dt_group_options one = {.rank = 0, .size = 1};
    ASSERT_OK(dt_group_init(&g, &one));
    ASSERT_OK(dt_group_allreduce(g, &v, &sum, 1, DT_I32, DT_SUM));
    ASSERT_EQ(sum, rank + 1);
    dt_group_destroy(g);
    dt_group_destroy(w);
}

static void job_info_case(int rank, int size) {
    char token[33], port[16];
    snprintf(token, sizeof token, "%s", getenv("DT_JOB_TOKEN"));
    snprintf(port, sizeof port, "%s", getenv("DT_MASTER_PORT"));
    dt_job_info ji;
    ASSERT_OK(dt_job_info_read(&ji));
    ASSERT_EQ(ji.rank, rank);
    ASSERT_EQ(ji.size, size);
    ASSERT_STREQ(ji.master_addr, "127.0.0.1");
    ASSERT_EQ(ji.master_port, atoi(port));
    ASSERT_STREQ(ji.token, token);
    ASSERT_EQ(ji.local_rank, -1); /* the harness does not say */
    forget_env();
    ASSERT_OK(dt_job_info_read(&ji));
    ASSERT_EQ(ji.rank, 0);
    ASSERT_EQ(ji.size, 1);
    ASSERT_STREQ(ji.master_addr, "");
}

#define C(name, n, fn, ...)                                                                        \
    { name, n, fn, {__VA_ARGS__}, -1, 120 }
static const hcase cases[] = {
    C("explicit_shm_3", 3, explicit_case, NULL),
    C("explicit_tcp_2", 2, explicit_case, "DT_TRANSPORT=tcp", NULL),
    C("job_info_2", 2, job_info_case, NULL),
};

int main(int argc, char **argv) {
    return harness_main(argc, argv, cases, (int)(sizeof cases / sizeof cases[0]));
}
