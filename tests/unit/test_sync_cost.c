/*
 * test_sync_cost.c — the planner's cost hooks of the replica strategies
 * (parallel.h, "Planning costs"): what dt_grad_sync_plan_cost describes for
 * DDP, local SGD, gossip and the parameter server, counted by hand for a
 * model of 1M floats on 8 replicas; ZeRO keeps its own whatever the mode.
 */
#include "dtrain/parallel.h"
#include "test.h"

static dt_cost_query query(dt_sync_mode mode) {
    return (dt_cost_query){.B = 4,
                           .T = 64,
                           .micro = 1,
                           .degree = {[DT_AXIS_DP] = 8, [DT_AXIS_TP] = 1, [DT_AXIS_PP] = 1,
                                      [DT_AXIS_CP] = 1},
                           .params = 1e6,
                           .bucket_bytes = 1 << 20,
                           .sync_mode = mode};
}

static void test_ddp(void) {
    dt_cost_query q = query(DT_SYNC_MODE_DDP);
    dt_strategy_cost c = {0};
    dt_grad_sync_plan_cost(&q, &c);
    ASSERT_EQ(c.n, 1);
    ASSERT_EQ(c.item[0].coll, DT_COLL_ALLREDUCE);
    ASSERT_EQ(c.item[0].calls, 4.0); /* 4 MB in 1 MiB buckets */
    ASSERT_TRUE(c.item[0].overlapped && c.item[0].backward);
}

static void test_local(void) {
    dt_cost_query q = query(DT_SYNC_MODE_LOCAL);
    q.sync_every = 8;
    dt_strategy_cost c = {0};
    dt_grad_sync_plan_cost(&q, &c);
    ASSERT_EQ(c.n, 1);
    ASSERT_EQ(c.item[0].coll, DT_COLL_ALLREDUCE);
    ASSERT_EQ(c.item[0].bytes, 4e6);
    ASSERT_EQ(c.item[0].calls, 0.125); /* one average every 8 steps */
    ASSERT_TRUE(!c.item[0].overlapped && !c.item[0].per_micro);
    /* H 0 prices as 1 (every step) */
    q.sync_every = 0;
    c.n = 0;
    dt_grad_sync_plan_cost(&q, &c);
    ASSERT_EQ(c.item[0].calls, 1.0);
}

static void test_gossip(void) {
    dt_cost_query q = query(DT_SYNC_MODE_GOSSIP);
    q.sync_every = 2;
    q.gossip_vectors = 2; /* a ring: both neighbours */
    dt_strategy_cost c = {0};
    dt_grad_sync_plan_cost(&q, &c);
    ASSERT_EQ(c.n, 1);
    ASSERT_EQ(c.item[0].coll, DT_COLL_SEND);
    ASSERT_EQ(c.item[0].bytes, 4e6);
    ASSERT_EQ(c.item[0].calls, 1.0); /* 2 vectors every 2 steps */
    /* the bytes do not grow with the replicas */
    q.degree[DT_AXIS_DP] = 64;
    dt_strategy_cost d = {0};
    dt_grad_sync_plan_cost(&q, &d);
    ASSERT_EQ(d.item[0].bytes * d.item[0].calls, c.item[0].bytes * c.item[0].calls);
}

static void test_ps(void) {
    dt_cost_query q = query(DT_SYNC_MODE_PS);
    q.ps_servers = 4;
    dt_strategy_cost c = {0};
    dt_grad_sync_plan_cost(&q, &c);
    ASSERT_EQ(c.n, 2);
    /* pushes: a shard (1/4) to each of the 3 other servers, during backward */
    ASSERT_EQ(c.item[0].coll, DT_COLL_SEND);
    ASSERT_EQ(c.item[0].bytes, 1e6);
    ASSERT_EQ(c.item[0].calls, 3.0);
    ASSERT_TRUE(c.item[0].overlapped && c.item[0].backward);
    /* replies: its shard to the 7 other workers */
    ASSERT_EQ(c.item[1].bytes, 1e6);
    ASSERT_EQ(c.item[1].calls, 7.0);
    ASSERT_TRUE(!c.item[1].overlapped);
    /* one server: its rank pushes nothing away, it replies the whole model */
    q.ps_servers = 1;
    c.n = 0;
    dt_grad_sync_plan_cost(&q, &c);
    ASSERT_EQ(c.n, 1);
    ASSERT_EQ(c.item[0].bytes, 4e6);
    ASSERT_EQ(c.item[0].calls, 7.0);
}

static void test_zero_wins(void) {
    dt_cost_query q = query(DT_SYNC_MODE_LOCAL);
    q.zero = 1;
    dt_strategy_cost c = {0}, z = {0};
    dt_grad_sync_plan_cost(&q, &c);
    dt_zero_sync_plan_cost(&q, &z);
    ASSERT_EQ(c.n, z.n);
    for (int i = 0; i < c.n; i++)
        ASSERT_EQ(c.item[i].coll, z.item[i].coll);
}

static void test_one_replica(void) {
    for (int m = 0; m < DT_SYNC_MODE_COUNT; m++) {
        dt_cost_query q = query((dt_sync_mode)m);
        q.degree[DT_AXIS_DP] = 1;
        dt_strategy_cost c = {0};
        dt_grad_sync_plan_cost(&q, &c);
        ASSERT_EQ(c.n, 0);
    }
}

int main(void) {
    RUN(test_ddp);
    RUN(test_local);
    RUN(test_gossip);
    RUN(test_ps);
    RUN(test_zero_wins);
    RUN(test_one_replica);
    return TEST_SUMMARY();
}
