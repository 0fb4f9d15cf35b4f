/*
 * test_pipeline.c — pipeline schedules as data: every generator's tables
 * pass the checker for P = 1..5 stages and M = 1..12 micro-batches (V = 2,
 * 3 chunks interleaved); simulated with F = B = W and no transfer time,
 * GPipe and 1F1B have exactly the theoretical bubble (P-1)/(M+P-1) and
 * interleaved 1F1B close to (P-1)/(VM+P-1); zero-bubble's is below 1F1B's;
 * peak live activations are M for GPipe and min(P - r, M) for 1F1B on rank
 * r; and deliberately broken tables are refused naming the first offending
 * action: a missing receive, a send to the wrong peer, mismatched
 * transfers, a cross-rank cycle (deadlock), a repeated or misplaced action.
 */
#include "dtrain/parallel.h"
#include "test.h"

static void check_all_kinds(void) {
    for (int P = 1; P <= 5; P++)
        for (int M = 1; M <= 12; M++)
            for (int kind = 0; kind < DT_PP_KIND_COUNT; kind++)
                for (int V = 1; V <= (kind == DT_PP_INTERLEAVED ? 3 : 1); V++) {
                    int chunks = kind == DT_PP_INTERLEAVED ? V + 1 : 1;
                    dt_pp_schedule *s;
                    dt_status st = dt_pp_schedule_create(&s, (dt_pp_kind)kind, P, chunks, M);
                    if (kind == DT_PP_INTERLEAVED && (P < 2 || M % P != 0)) {
                        ASSERT_EQ(st, DT_ERR_INVALID);
                        continue;
                    }
                    ASSERT_OK(st);
                    dt_pp_report r;
                    if (dt_pp_check(s, NULL, &r) != DT_OK)
                        TEST_FAILF("%s P %d V %d M %d: %s", dt_pp_kind_names[kind], P, chunks, M,
                                   dt_last_error());
                    double theory = dt_pp_theoretical_bubble((dt_pp_kind)kind, P, chunks, M);
                    if (kind == DT_PP_GPIPE || kind == DT_PP_1F1B) {
                        if (fabs(r.bubble - theory) > 1e-9)
                            TEST_FAILF("%s P %d M %d: bubble %.6f, theory %.6f",
                                       dt_pp_kind_names[kind], P, M, r.bubble, theory);
                        for (int q = 0; q < P; q++) {
                            int want = kind == DT_PP_GPIPE ? M : (P - q < M ? P - q : M);
                            ASSERT_EQ(r.peak_live[q], want);
                        }
                    }
                    if (kind == DT_PP_INTERLEAVED && fabs(r.bubble - theory) > 0.15 * theory)
                        TEST_FAILF("interleaved P %d V %d M %d: bubble %.4f, theory %.4f", P,
                                   chunks, M, r.bubble, theory);
                    if (kind == DT_PP_ZB) {
                        /* At 1F1B's memory, and the bubble below 1F1B's. */
                        dt_pp_schedule *o;
                        dt_pp_report ro;
                        ASSERT_OK(dt_pp_schedule_create(&o, DT_PP_1F1B, P, 1, M));
                        ASSERT_OK(dt_pp_check(o, NULL, &ro));
                        for (int q = 0; q < P; q++)
                            ASSERT_TRUE(r.peak_live[q] <= ro.peak_live[q]);
                        if (P > 1 && !(r.bubble < ro.bubble))
                            TEST_FAILF("zb P %d M %d: bubble %.4f not below 1F1B's %.4f", P, M,
                                       r.bubble, ro.bubble);
                        dt_pp_report_free(&ro);
                        dt_pp_schedule_destroy(o);
                    }
                    dt_pp_report_free(&r);
                    dt_pp_schedule_destroy(s);
                }
}

static void print_examples(void) {
    dt_pp_schedule *s;
    dt_pp_report r;
    static const struct {
        dt_pp_kind k;
        int V;
    } kinds[] = {{DT_PP_GPIPE, 1}, {DT_PP_1F1B, 1}, {DT_PP_INTERLEAVED, 2}, {DT_PP_ZB, 1}};
    for (size_t i = 0; i < 4; i++) {
        ASSERT_OK(dt_pp_schedule_create(&s, kinds[i].k, 4, kinds[i].V, 8));
        ASSERT_OK(dt_pp_check(s, NULL, &r));
        printf("  %s P 4 M 8: bubble %.3f (theory %.3f)\n", dt_pp_kind_names[kinds[i].k], r.bubble,
               dt_pp_theoretical_bubble(kinds[i].k, 4, kinds[i].V, 8));
        dt_pp_timeline_text(s, &r, kinds[i].k == DT_PP_INTERLEAVED ? 0.5 : 1, stdout);
        dt_pp_report_free(&r);
        dt_pp_schedule_destroy(s);
    }
}

/* A 1F1B table of P 2, M 2 written out, then broken in one place. */
#define A(op, mb, peer)                                                                            \
    { DT_PP_##op, 0, 0, mb, peer }
static const dt_pp_action good[] = {
    /* rank 0 */ A(F, 0, -1),
    A(SEND_ACT, 0, 1),
    A(F, 1, -1),
    A(SEND_ACT, 1, 1),
    A(RECV_GRAD, 0, 1),
    A(B, 0, -1),
    A(RECV_GRAD, 1, 1),
    A(B, 1, -1),
    /* rank 1 */ A(RECV_ACT, 0, 0),
    A(F, 0, -1),
    A(B, 0, -1),
    A(SEND_GRAD, 0, 0),
    A(RECV_ACT, 1, 0),
    A(F, 1, -1),
    A(B, 1, -1),
    A(SEND_GRAD, 1, 0)};
static const size_t counts[] = {8, 8};

static void expect_refused(const dt_pp_action *acts, const size_t *cnt, const char *what) {
    dt_pp_schedule *s;
    dt_pp_report r;
    ASSERT_OK(dt_pp_schedule_from(&s, DT_PP_1F1B, 2, 1, 2, false, cnt, acts));
    ASSERT_STATUS(dt_pp_check(s, NULL, &r), DT_ERR_INVALID);
    ASSERT_CONTAINS(dt_last_error(), what);
    printf("  refused: %s\n", dt_last_error());
    dt_pp_schedule_destroy(s);
}

static void broken_tables(void) {
    dt_pp_schedule *s;
    dt_pp_report r;
    ASSERT_OK(dt_pp_schedule_from(&s, DT_PP_1F1B, 2, 1, 2, false, counts, good));
    ASSERT_OK(dt_pp_check(s, NULL, &r));
    dt_pp_report_free(&r);
    dt_pp_schedule_destroy(s);
    dt_pp_action t[16];

    /* A missing receive: rank 1 loses its recv-act of micro-batch 1. */
    memcpy(t, good, sizeof good);
    memmove(&t[12], &t[13], 3 * sizeof t[0]);
    size_t c1[] = {8, 7};
    expect_refused(t, c1, "rank 1 action #4 (F mb 1 chunk 0): comes before what it needs");

    /* A send to the wrong peer. */
    memcpy(t, good, sizeof good);
    t[1].peer = 0;
    expect_refused(t, counts,
                   "rank 0 action #1 (send-act mb 0 chunk 0 to rank 0): stage 0's "
                   "neighbour is on rank 1");

    /* Transfers out of order between two ranks: rank 1 receives micro-batch
     * 1's activation before 0's. */
    memcpy(t, good, sizeof good);
    t[8].mb = 1, t[9].mb = 1, t[10].mb = 1, t[11].mb = 1;
    t[12].mb = 0, t[13].mb = 0, t[14].mb = 0, t[15].mb = 0;
    expect_refused(t, counts, "meets rank 1 action #0 (recv-act mb 1 chunk 0 from rank 0)");

    /* A cross-rank cycle: rank 0 waits for micro-batch 0's gradient before
     * sending micro-batch 1's activation, rank 1 waits for that activation
     * before sending the gradient. */
    static const dt_pp_action cycle[] = {
        A(F, 0, -1),       A(SEND_ACT, 0, 1),  A(RECV_GRAD, 0, 1), A(B, 0, -1),
        A(F, 1, -1),       A(SEND_ACT, 1, 1),  A(RECV_GRAD, 1, 1), A(B, 1, -1),
        A(RECV_ACT, 0, 0), A(F, 0, -1),        A(RECV_ACT, 1, 0),  A(F, 1, -1),
        A(B, 0, -1),       A(SEND_GRAD, 0, 0), A(B, 1, -1),        A(SEND_GRAD, 1, 0)};
    expect_refused(cycle, counts, "deadlock");

    /* A repeated forward and a W in a schedule without split backward. */
    memcpy(t, good, sizeof good);
    t[2].mb = 0;
    expect_refused(t, counts, "repeats action #0");
    memcpy(t, good, sizeof good);
    t[7] = (dt_pp_action)A(W, 1, -1);
    expect_refused(t, counts, "a W action in a schedule whose B computes the weight gradient");

    /* Generators refuse what they cannot build, naming the numbers. */
    ASSERT_STATUS(dt_pp_schedule_create(&s, DT_PP_INTERLEAVED, 4, 2, 6), DT_ERR_INVALID);
    ASSERT_CONTAINS(dt_last_error(), "--micro-batches 6 must be a multiple of the 4 stages");
    ASSERT_STATUS(dt_pp_schedule_create(&s, DT_PP_1F1B, 0, 1, 4), DT_ERR_INVALID);
    dt_pp_kind k;
    int v;
    ASSERT_OK(dt_pp_kind_parse("--pp-schedule", "interleaved:3", &k, &v));
    ASSERT_TRUE(k == DT_PP_INTERLEAVED && v == 3);
    ASSERT_STATUS(dt_pp_kind_parse("--pp-schedule", "interleaved:1", &k, &v), DT_ERR_INVALID);
    ASSERT_STATUS(dt_pp_kind_parse("--pp-schedule", "pipedream", &k, &v), DT_ERR_INVALID);
    ASSERT_CONTAINS(dt_last_error(), "--pp-schedule \"pipedream\"");
}

int main(void) {
    RUN(check_all_kinds);
    RUN(print_examples);
    RUN(broken_tables);
    return TEST_SUMMARY();
}
