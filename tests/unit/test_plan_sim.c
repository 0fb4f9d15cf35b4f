/*
 * test_plan_sim.c — the discrete-event simulator (dtrain/sim.h) and the
 * planner's step simulation (dt_plan_simulate):
 *   - two transfers overlapping on one link share it, by hand: 100 MB at
 *     10 GB/s each, the second 5 ms later, end at 15 and 20 ms (10 and
 *     15 ms on links of their own); latency uses no bandwidth;
 *   - bad input is refused naming the field and value;
 *   - without contention the simulated step equals the analytic model's
 *     (dp with DDP and ZeRO 1, where the two follow the same rules) and
 *     is within 3% for a 1F1B pipeline (the simulation pairs each send
 *     with its receive; the checker batches them);
 *   - dp and pp sharing one node's network port (one device per node) is
 *     slower than the same step without contention.
 */
#include "dtrain/plan.h"
#include "dtrain/sim.h"
#include "test.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static void test_two_transfers_share_a_link(void) {
    for (int shared = 0; shared < 2; shared++) {
        dt_sim *s;
        ASSERT_OK(dt_sim_create(&s));
        int a = dt_sim_lane(s, 0, 1, "a"), b = dt_sim_lane(s, 0, 2, "b");
        int k1 = dt_sim_link(s, "nic", 10e9), k2 = shared ? k1 : dt_sim_link(s, "nic2", 10e9);
        int wait = dt_sim_add(
            s, &(dt_sim_task){.lane = b, .link = -1, .seconds = 5e-3, .name = "idle", .idx = -1});
        int x = dt_sim_add(s, &(dt_sim_task){.lane = a,
                                             .link = k1,
                                             .bytes = 100e6,
                                             .name = "allreduce",
                                             .cat = "comm",
                                             .idx = -1});
        int y = dt_sim_add(s, &(dt_sim_task){.lane = b,
                                             .link = k2,
                                             .bytes = 100e6,
                                             .name = "allreduce",
                                             .cat = "comm",
                                             .idx = -1});
        /* a compute task beside them is not slowed */
        int c = dt_sim_add(s, &(dt_sim_task){.lane = a,
                                             .link = -1,
                                             .seconds = 1e-3,
                                             .deps = {wait},
                                             .ndeps = 1,
                                             .name = "F",
                                             .idx = 0});
        ASSERT_TRUE(wait >= 0 && x >= 0 && y >= 0 && c >= 0);
        double span, t0, t1;
        ASSERT_OK(dt_sim_run(s, &span));
        dt_sim_task_time(s, x, &t0, &t1);
        ASSERT_NEAR(t1, shared ? 15e-3 : 10e-3, 1e-9, 1e-12);
        dt_sim_task_time(s, y, &t0, &t1);
        ASSERT_NEAR(t0, 5e-3, 1e-9, 1e-12);
        ASSERT_NEAR(t1, shared ? 20e-3 : 15e-3, 1e-9, 1e-12);
        dt_sim_task_time(s, c, &t0, &t1); /* after x on its lane */
        ASSERT_NEAR(t1 - t0, 1e-3, 1e-9, 1e-12);
        ASSERT_NEAR(span, shared ? 20e-3 : 15e-3, 1e-9, 1e-12);
        dt_sim_destroy(s);
    }
    /* Latency first, without bandwidth: 2 ms + 100 MB, beside a 100 MB
     * transfer that starts at 0: that one moves 20 MB alone in 0-2 ms, then
     * its 80 MB at half the link (ends at 18 ms) while the second moves 80
     * MB too; the second's last 20 MB alone: 20 ms. */
    dt_sim *s;
    ASSERT_OK(dt_sim_create(&s));
    int a = dt_sim_lane(s, 1, 1, "a"), b = dt_sim_lane(s, 1, 2, "b"), k = dt_sim_link(s, "l", 10e9);
    int x = dt_sim_add(s, &(dt_sim_task){.lane = a, .link = k, .bytes = 100e6, .idx = -1});
    int y = dt_sim_add(
        s, &(dt_sim_task){.lane = b, .link = k, .seconds = 2e-3, .bytes = 100e6, .idx = -1});
    double span, t0, t1;
    ASSERT_OK(dt_sim_run(s, &span));
    dt_sim_task_time(s, x, &t0, &t1);
    ASSERT_NEAR(t1, 18e-3, 1e-9, 1e-12);
    dt_sim_task_time(s, y, &t0, &t1);
    ASSERT_NEAR(t0, 0, 0, 0);
    ASSERT_NEAR(t1, 20e-3, 1e-9, 1e-12);
    dt_sim_destroy(s);
}

static void test_bad_input(void) {
    dt_sim *s;
    ASSERT_OK(dt_sim_create(&s));
    ASSERT_EQ(dt_sim_link(s, "nic", 0), -1);
    ASSERT_CONTAINS(dt_last_error(), "bandwidth 0");
    int a = dt_sim_lane(s, 0, 1, "a");
    ASSERT_EQ(dt_sim_add(s, &(dt_sim_task){.lane = a, .link = -1, .seconds = -1, .name = "F"}), -1);
    ASSERT_CONTAINS(dt_last_error(), "seconds -1");
    ASSERT_EQ(dt_sim_add(s, &(dt_sim_task){.lane = 7, .link = -1, .name = "F"}), -1);
    ASSERT_CONTAINS(dt_last_error(), "lane 7");
    ASSERT_EQ(
        dt_sim_add(s, &(dt_sim_task){.lane = a, .link = -1, .deps = {0}, .ndeps = 1, .name = "F"}),
        -1);
    ASSERT_CONTAINS(dt_last_error(), "dependency 0 is not an earlier task");
    ASSERT_EQ(dt_sim_add(s, &(dt_sim_task){.lane = a, .link = -1, .bytes = 5, .name = "F"}), -1);
    ASSERT_CONTAINS(dt_last_error(), "bytes need a link");
    double span;
    ASSERT_OK(dt_sim_run(s, &span)); /* empty */
    ASSERT_EQ(span, 0);
    ASSERT_EQ(dt_sim_add(s, &(dt_sim_task){.lane = a, .link = -1, .name = "F"}), -1);
    ASSERT_STATUS(dt_sim_run(s, &span), DT_ERR_INVALID);
    dt_sim_destroy(s);
}

static dt_plan_layout layout(int dp, int pp, int mb, int micro, int zero) {
    return (dt_plan_layout){.dp = dp,
                            .tp = 1,
                            .pp = pp,
                            .cp = 1,
                            .chunks = 1,
                            .schedule = DT_PP_1F1B,
                            .micro_batch = mb,
                            .micro = micro,
                            .zero = zero,
                            .precision = DT_PRECISION_BF16};
}

static void simulate(dt_cluster *cl, dt_plan_layout l, dt_plan_sim *sim) {
    dt_plan_request rq = dt_plan_request_default();
    ASSERT_OK(dt_gpt_preset("gpt2-350m", &rq.model));
    rq.devices = l.dp * l.pp;
    rq.global_batch = l.dp * l.micro_batch * l.micro;
    ASSERT_OK(dt_plan_simulate(&rq, cl, &l, sim, NULL));
    printf("  dp %d pp %d mb %d x %d zero %d: simulated %.6g s, alone %.6g s, analytic %.6g s\n",
           l.dp, l.pp, l.micro_batch, l.micro, l.zero, sim->step_s, sim->alone_s, sim->analytic_s);
}

static void test_agrees_without_contention(void) {
    dt_cluster cl;
    ASSERT_OK(dt_cluster_load(DT_TEST_DATA_DIR "/../examples/clusters/dgx-a100.json", &cl));
    dt_plan_sim sim;
    const int zeros[] = {0, 1};
    for (int i = 0; i < 2; i++) {
        simulate(&cl, layout(8, 1, 4, 2, zeros[i]), &sim);
        ASSERT_NEAR(sim.alone_s, sim.analytic_s, 1e-6, 0);
        ASSERT_NEAR(sim.step_s, sim.alone_s, 1e-9, 0); /* one collective at a time */
    }
    simulate(&cl, layout(1, 4, 2, 8, 0), &sim);
    ASSERT_NEAR(sim.alone_s, sim.analytic_s, 0.03, 0);
}

static void test_contention_slows_the_step(void) {
    dt_cluster cl;
    ASSERT_OK(dt_cluster_load(DT_TEST_DATA_DIR "/../examples/clusters/dgx-a100.json", &cl));
    cl.devices_per_node = 1; /* dp buckets and pp sends on one network port */
    cl.inter.bw = 2e9;       /* slow enough that the two meet at the end of 1F1B */
    dt_plan_sim sim;
    simulate(&cl, layout(2, 2, 8, 4, 0), &sim);
    ASSERT_TRUE(sim.step_s > sim.alone_s * 1.01);
    ASSERT_TRUE(sim.alone_s > 0);
}

int main(void) {
    RUN(test_two_transfers_share_a_link);
    RUN(test_bad_input);
    RUN(test_agrees_without_contention);
    RUN(test_contention_slows_the_step);
    return TEST_SUMMARY();
}
